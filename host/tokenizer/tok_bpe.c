/* Byte-level BPE ("gpt2"): the pre-tokenizer regexes named by tokenizer.ggml.pre, the GPT-2
 * byte <-> code point map, and rank-ordered merges.
 *
 * Pre-tokenisation follows HF tokenizers' Split(behavior = Isolated): each regex of the sequence
 * splits every piece from the previous one into its matches AND the text between them, so
 * nothing is lost. Regexes run on one piece at a time (so $ and look-arounds see that piece only),
 * with PCRE2 in UTF + UCP mode (Unicode properties from PCRE2's tables), JIT-compiled at load.
 *
 * Each piece is then BPE'd on its own: its bytes start as symbols (each the token of the GPT-2
 * code point standing for the byte), and the adjacent pair with the lowest merge rank (ties: the
 * leftmost) merges until none applies. A heap keeps this O(m log m) in the piece length m.
 *
 * Invalid UTF-8 in the input is replaced by U+FFFD before the regexes run, byte by byte, as
 * llama.cpp does (the regexes need valid UTF-8; HF cannot even take such input). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/tokenizer/tok_impl.h"

/* ---- GPT-2 byte <-> code point -------------------------------------------------------------- */

/* Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, DEL, NBSP,
 * soft hyphen, ...) take the code points 256, 257, ... in byte order. */
static bool gpt2_printable(uint32_t b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok_gpt2_byte_to_cp(uint8_t b)
{
    if (gpt2_printable(b))
        return b;
    if (b <= 0x20)
        return 256u + b;          /* 33 controls and space: 256..288 */
    if (b >= 0x7F && b <= 0xA0)
        return 289u + (b - 0x7F); /* DEL, C1 controls, NBSP: 289..322 */
    return 323;                   /* 0xAD, soft hyphen */
}

int tok_gpt2_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return gpt2_printable(cp) ? (int)cp : -1;
    if (cp <= 288)
        return (int)(cp - 256);
    if (cp <= 322)
        return (int)(cp - 289 + 0x7F);
    return cp == 323 ? 0xAD : -1;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------- */

/* Upstream tokenizer.json patterns (HF tokenizers), PCRE2 syntax. GPT-2's ByteLevel regex: */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Llama 3 / Qwen2 differ only in how many digits group together. */
#define RE_LLAMA3_LIKE(DIGITS)                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" DIGITS                    \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Mistral's Tekken (Nemo, Small 3, Devstral) and OpenAI's o200k (gpt-4o, gpt-oss; Llama 4): words
 * split at case changes (an upper-case run, then lower-case letters), a slash kept with the
 * punctuation run before it; o200k also keeps a contraction on its word and groups digits by
 * three. tokenizer.json's own patterns (llama.cpp rewrites the letter classes for its regex
 * engine; PCRE2 has them). */
#define RE_CASED(CONTRACTION)                                                                     \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" CONTRACTION           \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" CONTRACTION
#define RE_TEKKEN RE_CASED("") "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_O200K                                                                                  \
    RE_CASED("(?i:'s|'t|'re|'ve|'m|'ll|'d)?")                                                     \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek: CJK ideographs (and U+0800.. as upstream writes it) and Hangul as whole runs. */
#define RE_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* DeepSeek LLM: cased letters (upstream's explicit list of Unicode Lu/Ll/Lt ranges). */
#define RE_DEEPSEEK_LETTERS                                                                       \
    "\\s?[A-Za-z\\x{00B5}\\x{00C0}-\\x{00D6}\\x{00D8}-\\x{00F6}\\x{00F8}-\\x{01BA}\\x{01BC}-"     \
    "\\x{01BF}\\x{01C4}-\\x{0293}\\x{0295}-\\x{02AF}\\x{0370}-\\x{0373}\\x{0376}\\x{0377}\\x{037B}-" \
    "\\x{037D}\\x{037F}\\x{0386}\\x{0388}-\\x{038A}\\x{038C}\\x{038E}-\\x{03A1}\\x{03A3}-\\x{03F5}" \
    "\\x{03F7}-\\x{0481}\\x{048A}-\\x{052F}\\x{0531}-\\x{0556}\\x{10A0}-\\x{10C5}\\x{13A0}-"       \
    "\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"       \
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-"       \
    "\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-"         \
    "\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-"       \
    "\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"       \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"        \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-"        \
    "\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-"        \
    "\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}"         \
    "\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-"       \
    "\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"     \
    "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"        \
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
#define RE_DEEPSEEK_PUNCT "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+"
/* Upstream writes \s+$ . Anchored only at the end, PCRE2 would retry it from every position of
 * a whitespace run that is not final (quadratic in the run). Starting only where a run starts
 * gives the same leftmost match in linear time. */
#define RE_TRAILING_SPACE "(?<!\\s)\\s+$"

typedef struct pre_def {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    const char *re[TOK_MAX_REGEX];
    bool ignore_merges; /* a piece that is already a token is not merged (Llama 3) */
    bool add_bos;       /* llama.cpp's default add_bos for this pre-tokenizer */
} pre_def;

static const pre_def pre_defs[] = {
    /* llama.cpp's "default": its own sequence, kept so files that name it tokenise as there */
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false},
    {"gpt-2|phi-2|roberta-bpe|mpt|olmo", {RE_GPT2}, false, false},
    {"llama3|llama-v3|llama-bpe|falcon3", {RE_LLAMA3_LIKE("{1,3}")}, true, true},
    {"dbrx|smaug-bpe", {RE_LLAMA3_LIKE("{1,3}")}, false, false},
    {"qwen2|stablelm2|megrez|deepseek-r1-qwen", {RE_LLAMA3_LIKE("")}, false, false},
    {"tekken", {RE_TEKKEN}, true, true},
    {"gpt-4o|llama4", {RE_O200K}, false, false},
    /* HF: Digits(individual_digits) then the GPT-2 ByteLevel regex */
    {"starcoder|smollm|refact|command-r|codeshell|exaone|minerva-7b", {"\\p{N}", RE_GPT2}, false, false},
    {"deepseek-llm",
     {"[\\r\\n]", RE_DEEPSEEK_LETTERS, RE_DEEPSEEK_PUNCT, RE_TRAILING_SPACE, RE_DEEPSEEK_CJK, "\\p{N}+"},
     false, false},
    {"deepseek-coder", {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"}, false, false},
};

static bool name_in(const char *names, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = names;;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == n && !memcmp(p, name, n))
            return true;
        if (!bar)
            return false;
        p = bar + 1;
    }
}

vki_status tok_bpe_setup_pre(vki_tokenizer *t, const char *name, char *err, size_t err_len)
{
    const pre_def *d = NULL;
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0] && !d; i++)
        if (name_in(pre_defs[i].names, name))
            d = &pre_defs[i];
    if (!d) {
        if (err && err_len)
            snprintf(err, err_len, "pre-tokenizer '%s' (tokenizer.ggml.pre) is not supported "
                     "(supported: default, gpt-2, llama3/llama-bpe, qwen2, tekken, gpt-4o, starcoder/smollm, "
                     "deepseek-llm, deepseek-coder)", name);
        return VKI_ERR_UNSUPPORTED;
    }
    for (uint32_t i = 0; i < TOK_MAX_REGEX && d->re[i]; i++) {
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)d->re[i], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                       &ec, &eo, NULL);
        if (!re) {
            if (err && err_len) {
                char msg[128];
                pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof msg);
                snprintf(err, err_len, "pre-tokenizer '%s': regex %u at offset %zu: %s", name, i,
                         (size_t)eo, msg);
            }
            return VKI_ERR_INTERNAL;
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter runs when JIT is absent */
        t->re[t->n_re++] = re;
    }
    t->ignore_merges = d->ignore_merges;
    t->add_bos = d->add_bos;
    snprintf(t->pre, sizeof t->pre, "%s", name);
    return VKI_OK;
}

/* ---- pre-tokenisation ----------------------------------------------------------------------- */

typedef struct span {
    size_t off, len;
} span;

typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

static vki_status spans_push(spans *a, size_t off, size_t len)
{
    if (!len)
        return VKI_OK;
    if (a->n == a->cap) {
        span *v = tok_grow(a->v, &a->cap, sizeof *v, 64);
        if (!v)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        a->v = v;
    }
    a->v[a->n++] = (span){off, len};
    return VKI_OK;
}

/* One pcre2_match; falls back from JIT to the interpreter if the JIT stack runs out. A match
 * limit hit (pathological input) ends matching in this piece: the rest stays one piece. */
static int match_at(const pcre2_code *re, const char *s, size_t n, size_t start, pcre2_match_data *md)
{
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    return rc;
}

/* Splits each span of *in by re (matches and the gaps between them), into *out. */
static vki_status split_spans(const pcre2_code *re, const char *text, const spans *in, spans *out,
                              pcre2_match_data *md)
{
    out->n = 0;
    vki_status st = VKI_OK;
    for (size_t i = 0; i < in->n && st == VKI_OK; i++) {
        const char *s = text + in->v[i].off;
        size_t n = in->v[i].len, pos = 0, gap = 0;
        while (pos < n && st == VKI_OK) {
            if (match_at(re, s, n, pos, md) < 0)
                break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            if (ov[1] <= ov[0]) { /* empty match: none of ours can, but never loop */
                pos = ov[0] + tok_utf8_len((uint8_t)s[ov[0] < n ? ov[0] : n - 1]);
                continue;
            }
            st = spans_push(out, in->v[i].off + gap, ov[0] - gap);
            if (st == VKI_OK)
                st = spans_push(out, in->v[i].off + ov[0], ov[1] - ov[0]);
            pos = gap = ov[1];
        }
        if (st == VKI_OK)
            st = spans_push(out, in->v[i].off + gap, n - gap);
    }
    return st;
}

/* Runs t->re[] in sequence over text; *res holds the final pieces. */
static vki_status pretokenize(const vki_tokenizer *t, const char *text, size_t len, spans *res)
{
    spans tmp = {0};
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    vki_status st = md ? spans_push(res, 0, len) : VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < t->n_re && st == VKI_OK; i++) {
        st = split_spans(t->re[i], text, res, &tmp, md);
        spans sw = *res;
        *res = tmp;
        tmp = sw;
    }
    pcre2_match_data_free(md);
    free(tmp.v);
    return st;
}

vki_status tok_bpe_pieces(const vki_tokenizer *t, const char *text, size_t len, size_t **ends, size_t *n)
{
    *ends = NULL;
    *n = 0;
    if (t->kind != TOK_BPE || (len && !text))
        return VKI_ERR_INVALID_ARG;
    spans sp = {0};
    vki_status st = len ? pretokenize(t, text, len, &sp) : VKI_OK;
    if (st == VKI_OK && sp.n) {
        *ends = malloc(sp.n * sizeof **ends);
        if (!*ends)
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
        for (size_t i = 0; i < sp.n && st == VKI_OK; i++)
            (*ends)[i] = sp.v[i].off + sp.v[i].len;
        if (st == VKI_OK)
            *n = sp.n;
    }
    free(sp.v);
    return st;
}

/* Returns text itself when it is valid UTF-8, else a copy (*owned) with every byte that does not
 * start a valid sequence replaced by U+FFFD. */
static const char *sanitize(const char *text, size_t len, size_t *out_len, char **owned)
{
    *owned = NULL;
    *out_len = len;
    size_t i = 0, k;
    while (i < len && (k = tok_utf8_valid((const uint8_t *)text + i, len - i)))
        i += k;
    if (i == len)
        return text;
    if (len > (SIZE_MAX - 1) / 3)
        return NULL;
    char *c = malloc(3 * len + 1);
    if (!c)
        return NULL;
    size_t n = 0;
    for (i = 0; i < len;) {
        k = tok_utf8_valid((const uint8_t *)text + i, len - i);
        if (k) {
            memcpy(c + n, text + i, k);
            n += k;
            i += k;
        } else {
            memcpy(c + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        }
    }
    *owned = c;
    *out_len = n;
    return c;
}

/* ---- BPE over one piece --------------------------------------------------------------------- */

typedef struct bpe_sym {
    uint32_t start, n; /* bytes of the piece; n = 0 once merged into its left neighbour */
    int32_t id;        /* token, or -1 (a byte whose code point is no token, or a merge result
                          that is not in the vocabulary): emitted byte by byte, see bpe_emit */
    int32_t prev, next;
} bpe_sym;

typedef struct bpe_ctx {
    const vki_tokenizer *t;
    bpe_sym *sym;  /* [max piece length] */
    char *scratch; /* [2 * max piece length]: the piece in GPT-2 code points */
    tok_heap heap;
} bpe_ctx;

static vki_status bpe_pair(bpe_ctx *c, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return VKI_OK;
    const tok_merge *m = tok_merge_find(c->t, c->sym[l].id, c->sym[r].id);
    if (!m)
        return VKI_OK;
    return tok_heap_push(&c->heap, (tok_cand){.key = (uint64_t)m->rank << 32 | (uint32_t)l, .left = l,
                                              .right = r, .aux = m->rank});
}

static vki_status bpe_emit(const bpe_ctx *c, const char *s, const bpe_sym *y, tok_ids *out)
{
    if (y->id >= 0)
        return tok_ids_push(out, y->id);
    /* A byte with no token is dropped, as llama.cpp does. HF would emit unk, but unk is often
     * the end-of-text token (StarCoder: id 0), which must not appear inside a prompt. Only
     * vocabularies that lack some byte (StarCoder: 0xF1, never-valid bytes) are affected. */
    for (uint32_t i = 0; i < y->n; i++) {
        int32_t id = c->t->byte_tok[(uint8_t)s[y->start + i]];
        if (id >= 0) {
            vki_status st = tok_ids_push(out, id);
            if (st != VKI_OK)
                return st;
        }
    }
    return VKI_OK;
}

/* Llama 3's ignore_merges: a piece that is a token as a whole is that token. */
static int32_t whole_piece_token(const bpe_ctx *c, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = tok_gpt2_byte_to_cp((uint8_t)s[i]);
        if (cp < 0x80)
            c->scratch[k++] = (char)cp;
        else {
            c->scratch[k++] = (char)(0xC0 | (cp >> 6));
            c->scratch[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return tok_lookup(c->t, c->scratch, k);
}

static vki_status bpe_piece(bpe_ctx *c, const char *s, size_t n, tok_ids *out)
{
    if (c->t->ignore_merges) {
        int32_t id = whole_piece_token(c, s, n);
        if (id >= 0)
            return tok_ids_push(out, id);
    }
    for (size_t i = 0; i < n; i++)
        c->sym[i] = (bpe_sym){.start = (uint32_t)i, .n = 1, .id = c->t->byte_tok[(uint8_t)s[i]],
                              .prev = (int32_t)i - 1, .next = i + 1 == n ? -1 : (int32_t)i + 1};
    c->heap.n = 0;
    vki_status st = VKI_OK;
    for (size_t i = 1; i < n && st == VKI_OK; i++)
        st = bpe_pair(c, (int32_t)i - 1, (int32_t)i);
    while (c->heap.n && st == VKI_OK) {
        tok_cand p = tok_heap_pop(&c->heap);
        bpe_sym *a = &c->sym[p.left], *b = &c->sym[p.right];
        if (!a->n || !b->n || a->next != p.right)
            continue;
        const tok_merge *m = tok_merge_find(c->t, a->id, b->id);
        if (!m || m->rank != p.aux)
            continue; /* a or b changed since this candidate was queued */
        a->n += b->n;
        a->id = m->result;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0)
            c->sym[b->next].prev = p.left;
        st = bpe_pair(c, a->prev, p.left);
        if (st == VKI_OK)
            st = bpe_pair(c, p.left, a->next);
    }
    for (int32_t i = 0; i != -1 && st == VKI_OK; i = c->sym[i].next)
        st = bpe_emit(c, s, &c->sym[i], out);
    return st;
}

vki_status tok_bpe_encode(const vki_tokenizer *t, const char *text, size_t len, tok_ids *out)
{
    if (!len)
        return VKI_OK;
    char *owned;
    size_t n;
    const char *s = sanitize(text, len, &n, &owned);
    if (!s)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    if (n > INT32_MAX) {
        free(owned);
        return VKI_ERR_INVALID_ARG;
    }
    spans pieces = {0};
    vki_status st = pretokenize(t, s, n, &pieces);
    size_t longest = 1;
    for (size_t i = 0; i < pieces.n; i++)
        if (pieces.v[i].len > longest)
            longest = pieces.v[i].len;
    bpe_ctx c = {.t = t};
    if (st == VKI_OK) {
        c.sym = malloc(longest * sizeof *c.sym);
        c.scratch = malloc(2 * longest);
        if (!c.sym || !c.scratch)
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    for (size_t i = 0; i < pieces.n && st == VKI_OK; i++)
        st = bpe_piece(&c, s + pieces.v[i].off, pieces.v[i].len, out);
    free(c.heap.v);
    free(c.scratch);
    free(c.sym);
    free(pieces.v);
    free(owned);
    return st;
}
