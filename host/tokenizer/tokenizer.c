/* Tokenizer: load from GGUF metadata (tokenizer.ggml.*), the lookup tables built once at load,
 * special-token partitioning, BOS/EOS, and the public vki_tokenize entry point.
 *
 * Load cost: one pass over the vocabulary (texts copied into one arena, a hash map text -> id),
 * one over the merges (a hash map (left id, right id) -> rank), one rendering every piece. For a
 * 150k vocabulary that is a few tens of milliseconds. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rng.h"
#include "host/tokenizer/tok_impl.h"
#include "host/tokenizer/tokenizer.h"

/* ---- small helpers -------------------------------------------------------------------------- */

static void tok_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || !err_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

void *tok_grow(void *v, size_t *cap, size_t elem_size, size_t first)
{
    size_t n = *cap ? *cap * 2 : first;
    if (n > SIZE_MAX / elem_size)
        return NULL;
    void *p = realloc(v, n * elem_size);
    if (p)
        *cap = n;
    return p;
}

vki_status tok_ids_push(tok_ids *a, int32_t id)
{
    if (a->n == a->cap) {
        int32_t *v = tok_grow(a->v, &a->cap, sizeof *v, 64);
        if (!v)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        a->v = v;
    }
    a->v[a->n++] = id;
    return VKI_OK;
}

vki_status tok_heap_push(tok_heap *h, tok_cand c)
{
    if (h->n == h->cap) {
        tok_cand *v = tok_grow(h->v, &h->cap, sizeof *v, 64);
        if (!v)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        h->v = v;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->v[p].key <= c.key)
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
    return VKI_OK;
}

tok_cand tok_heap_pop(tok_heap *h)
{
    tok_cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1].key < h->v[c].key)
            c++;
        if (last.key <= h->v[c].key)
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

size_t tok_utf8_prefix(const uint8_t *s, size_t n, size_t *need)
{
    *need = 1;
    if (!n)
        return 0;
    uint8_t c = s[0], lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        *need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        *need = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80; /* overlong */
        hi = c == 0xED ? 0x9F : 0xBF; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        *need = 4;
        lo = c == 0xF0 ? 0x90 : 0x80; /* overlong */
        hi = c == 0xF4 ? 0x8F : 0xBF; /* above U+10FFFF */
    } else
        return 0;
    size_t k = 1;
    while (k < *need && k < n && s[k] >= (k == 1 ? lo : 0x80) && s[k] <= (k == 1 ? hi : 0xBF))
        k++;
    return k;
}

size_t tok_utf8_valid(const uint8_t *s, size_t n)
{
    size_t need, k = tok_utf8_prefix(s, n, &need);
    return k == need ? k : 0;
}

/* FNV-1a: token texts are short; this is not on a hot path shared with untrusted keys that
 * could be chosen to collide (texts come from the model file). */
static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int32_t tok_lookup(const vki_tokenizer *t, const char *text, size_t len)
{
    if (!len)
        return -1;
    uint64_t i = hash_bytes(text, len) & t->map.mask;
    for (;;) {
        uint32_t s = t->map.slot[i];
        if (!s)
            return -1;
        const tok_entry *e = &t->tok[s - 1];
        if (e->len == len && !memcmp(t->arena + e->off, text, len))
            return (int32_t)(s - 1);
        i = (i + 1) & t->map.mask;
    }
}

const tok_merge *tok_merge_find(const vki_tokenizer *t, int32_t left, int32_t right)
{
    if (!t->merges.slot || left < 0 || right < 0)
        return NULL;
    uint64_t key = ((uint64_t)(uint32_t)left + 1) << 32 | ((uint64_t)(uint32_t)right + 1);
    uint64_t i = vki_mix64_fin(key) & t->merges.mask;
    for (;;) {
        const tok_merge *m = &t->merges.slot[i];
        if (!m->key)
            return NULL;
        if (m->key == key)
            return m;
        i = (i + 1) & t->merges.mask;
    }
}

static uint64_t pow2_at_least(uint64_t n)
{
    uint64_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

/* ---- load: vocabulary ----------------------------------------------------------------------- */

/* Later duplicates replace earlier ones (as llama.cpp's token_to_id map does). */
static void map_insert(vki_tokenizer *t, uint32_t id)
{
    const tok_entry *e = &t->tok[id];
    uint64_t i = hash_bytes(t->arena + e->off, e->len) & t->map.mask;
    for (;;) {
        uint32_t s = t->map.slot[i];
        if (!s) {
            t->map.slot[i] = id + 1;
            return;
        }
        const tok_entry *o = &t->tok[s - 1];
        if (o->len == e->len && !memcmp(t->arena + o->off, t->arena + e->off, e->len)) {
            t->map.slot[i] = id + 1;
            return;
        }
        i = (i + 1) & t->map.mask;
    }
}

/* tokenizer.ggml.scores or .token_type (both optional): one entry per token. Token types outside
 * the known range count as undefined (rendered as nothing, like llama.cpp). */
static vki_status load_per_token(vki_tokenizer *t, const gguf_file *f, const char *key, char *err,
                                 size_t err_len)
{
    gguf_type et;
    uint64_t m;
    vki_status st = gguf_get_arr(f, key, &et, &m);
    if (st == VKI_ERR_NOT_FOUND)
        return VKI_OK;
    if (st != VKI_OK || m != t->n_vocab) {
        tok_err(err, err_len, "%s: %llu entries for %u tokens", key, (unsigned long long)(st == VKI_OK ? m : 0),
                t->n_vocab);
        return VKI_ERR_FORMAT;
    }
    bool scores = !strcmp(key, "tokenizer.ggml.scores");
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        float sc;
        int64_t ty;
        st = scores ? gguf_arr_f32(f, key, i, &sc) : gguf_arr_i64(f, key, i, &ty);
        if (st != VKI_OK) {
            tok_err(err, err_len, "%s[%u]: wrong element type", key, i);
            return VKI_ERR_FORMAT;
        }
        if (scores)
            t->tok[i].score = sc;
        else
            t->tok[i].type = (ty >= 0 && ty <= TOK_T_BYTE) ? (uint8_t)ty : TOK_T_UNDEFINED;
    }
    return VKI_OK;
}

/* Token texts into the arena (twice their total size: pieces are never longer than texts, see
 * tok_render_piece), scores and types into t->tok. */
static vki_status load_vocab(vki_tokenizer *t, const gguf_file *f, char *err, size_t err_len)
{
    gguf_type et;
    uint64_t n;
    vki_status st = gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n);
    if (st != VKI_OK || et != GGUF_TYPE_STRING || n == 0 || n > INT32_MAX - 1) {
        tok_err(err, err_len, "tokenizer.ggml.tokens: %s", st == VKI_ERR_NOT_FOUND ? "missing"
                : "not a non-empty array of strings");
        return VKI_ERR_FORMAT;
    }
    t->n_vocab = (uint32_t)n;
    t->tok = calloc(n, sizeof *t->tok);
    if (!t->tok)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        if (gguf_arr_str(f, "tokenizer.ggml.tokens", i, &s) != VKI_OK) {
            tok_err(err, err_len, "tokenizer.ggml.tokens[%llu]: unreadable", (unsigned long long)i);
            return VKI_ERR_FORMAT;
        }
        if (s.len > UINT32_MAX / 4 || total + s.len > UINT32_MAX / 4) {
            tok_err(err, err_len, "tokenizer.ggml.tokens: texts exceed 1 GiB");
            return VKI_ERR_FORMAT;
        }
        total += s.len;
        if (s.len > t->max_text_len)
            t->max_text_len = (uint32_t)s.len;
    }
    t->arena_len = 2 * total + 1;
    t->arena = malloc(t->arena_len);
    if (!t->arena)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        gguf_arr_str(f, "tokenizer.ggml.tokens", i, &s);
        memcpy(t->arena + off, s.ptr, s.len);
        t->tok[i].off = (uint32_t)off;
        t->tok[i].len = (uint32_t)s.len;
        t->tok[i].type = TOK_T_NORMAL;
        off += s.len;
    }

    if ((st = load_per_token(t, f, "tokenizer.ggml.scores", err, err_len)) != VKI_OK ||
        (st = load_per_token(t, f, "tokenizer.ggml.token_type", err, err_len)) != VKI_OK)
        return st;

    t->map.mask = (uint32_t)(pow2_at_least(2 * n) - 1);
    t->map.slot = calloc((size_t)t->map.mask + 1, sizeof *t->map.slot);
    if (!t->map.slot)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        if (t->tok[i].len)
            map_insert(t, i);
    return VKI_OK;
}

/* ---- load: BPE merges ----------------------------------------------------------------------- */

/* "left right" (split at the first space after the first byte, as llama.cpp does). A merge whose
 * sides are not both tokens can never apply (symbols are always tokens) and is skipped; the
 * first of duplicate pairs wins (the lower rank). */
static vki_status load_merges(vki_tokenizer *t, const gguf_file *f, char *err, size_t err_len)
{
    const char *key = "tokenizer.ggml.merges";
    gguf_type et;
    uint64_t n;
    vki_status st = gguf_get_arr(f, key, &et, &n);
    if (st != VKI_OK || et != GGUF_TYPE_STRING) {
        tok_err(err, err_len, "%s: %s (required by tokenizer model gpt2)", key,
                st == VKI_ERR_NOT_FOUND ? "missing" : "not an array of strings");
        return VKI_ERR_FORMAT;
    }
    if (n > UINT32_MAX / 4) {
        tok_err(err, err_len, "%s: %llu merges", key, (unsigned long long)n);
        return VKI_ERR_FORMAT;
    }
    t->merges.mask = pow2_at_least(2 * n) - 1;
    t->merges.slot = calloc(t->merges.mask + 1, sizeof *t->merges.slot);
    char *cat = malloc(2 * (size_t)t->max_text_len + 1); /* left+right: both are tokens */
    if (!t->merges.slot || !cat) {
        free(cat);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    for (uint64_t r = 0; r < n; r++) {
        gguf_str s;
        if (gguf_arr_str(f, key, r, &s) != VKI_OK) {
            free(cat);
            tok_err(err, err_len, "%s[%llu]: unreadable", key, (unsigned long long)r);
            return VKI_ERR_FORMAT;
        }
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp)
            continue;
        size_t ll = (size_t)(sp - s.ptr), rl = s.len - ll - 1;
        int32_t a = tok_lookup(t, s.ptr, ll), b = tok_lookup(t, sp + 1, rl);
        if (a < 0 || b < 0)
            continue;
        uint64_t k = ((uint64_t)(uint32_t)a + 1) << 32 | ((uint64_t)(uint32_t)b + 1);
        uint64_t i = vki_mix64_fin(k) & t->merges.mask;
        while (t->merges.slot[i].key && t->merges.slot[i].key != k)
            i = (i + 1) & t->merges.mask;
        if (t->merges.slot[i].key)
            continue;
        memcpy(cat, s.ptr, ll);
        memcpy(cat + ll, sp + 1, rl);
        t->merges.slot[i] = (tok_merge){.key = k, .rank = (uint32_t)r, .result = tok_lookup(t, cat, ll + rl)};
        t->n_merges++;
    }
    free(cat);
    return VKI_OK;
}

/* ---- load: special ids, end-of-generation, the special-token list --------------------------- */

/* An id from metadata; absent or out of range keeps *id (llama.cpp warns and keeps its default). */
static vki_status meta_id(const vki_tokenizer *t, const gguf_file *f, const char *key, int32_t *id,
                          char *err, size_t err_len)
{
    int64_t v;
    vki_status st = gguf_get_i64(f, key, &v);
    if (st == VKI_ERR_NOT_FOUND)
        return VKI_OK;
    if (st != VKI_OK) {
        tok_err(err, err_len, "%s: not an integer", key);
        return VKI_ERR_FORMAT;
    }
    if (v >= 0 && v < t->n_vocab)
        *id = (int32_t)v;
    return VKI_OK;
}

static vki_status meta_bool(const gguf_file *f, const char *key, bool *b, char *err, size_t err_len)
{
    vki_status st = gguf_get_bool(f, key, b);
    if (st == VKI_ERR_NOT_FOUND || st == VKI_OK)
        return VKI_OK;
    tok_err(err, err_len, "%s: not a bool", key);
    return VKI_ERR_FORMAT;
}

static vki_status load_special_ids(vki_tokenizer *t, const gguf_file *f, char *err, size_t err_len)
{
    static const struct {
        const char *key;
        size_t field;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(vki_tokenizer, bos)},
        {"tokenizer.ggml.eos_token_id", offsetof(vki_tokenizer, eos)},
        {"tokenizer.ggml.eot_token_id", offsetof(vki_tokenizer, eot)},
        {"tokenizer.ggml.eom_token_id", offsetof(vki_tokenizer, eom)},
        {"tokenizer.ggml.unknown_token_id", offsetof(vki_tokenizer, unk)},
        {"tokenizer.ggml.padding_token_id", offsetof(vki_tokenizer, pad)},
        {"tokenizer.ggml.fim_pre_token_id", offsetof(vki_tokenizer, fim[VKI_FIM_PRE])},
        {"tokenizer.ggml.fim_suf_token_id", offsetof(vki_tokenizer, fim[VKI_FIM_SUF])},
        {"tokenizer.ggml.fim_mid_token_id", offsetof(vki_tokenizer, fim[VKI_FIM_MID])},
        {"tokenizer.ggml.fim_rep_token_id", offsetof(vki_tokenizer, fim[VKI_FIM_REP])},
        {"tokenizer.ggml.fim_sep_token_id", offsetof(vki_tokenizer, fim[VKI_FIM_SEP])},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        vki_status st = meta_id(t, f, ids[i].key, (int32_t *)((char *)t + ids[i].field), err, err_len);
        if (st != VKI_OK)
            return st;
    }
    vki_status st = meta_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err, err_len);
    if (st == VKI_OK)
        st = meta_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err, err_len);
    if (st == VKI_OK)
        st = meta_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, err_len);
    if (t->bos < 0)
        t->add_bos = false;
    if (t->eos < 0)
        t->add_eos = false;
    return st;
}

/* End of generation: eos, eot, eom, and the end-of-turn tokens that llama.cpp recognises by
 * text (chat models whose eos differs from the turn end). Those are forced to control type so
 * they render only with `special` and are matched in text only with parse_special. gpt-oss's
 * o200k_harmony vocabulary ends a reply at "<|return|>" (the answer is done) or "<|call|>" (a tool
 * call is), while its "<|end|>" only closes one message of several (the reasoning, then the
 * answer): a vocabulary with both of the first two keeps "<|end|>" a control token that does not
 * end generation, as llama.cpp does. GLM-4's vocabulary also ends it at "<|user|>" and
 * "<|observation|>"; Cohere's at "<|END_OF_TURN_TOKEN|>" and "<|END_RESPONSE|>". */
static void mark_eog(vki_tokenizer *t)
{
    static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
                                            "<end_of_turn>", "<|endoftext|>", "<EOT>", "<|eom_id|>",
                                            "<|END_OF_TURN_TOKEN|>"};
    for (size_t i = 0; i < sizeof eot_texts / sizeof eot_texts[0]; i++) {
        int32_t id = tok_lookup(t, eot_texts[i], strlen(eot_texts[i]));
        if (id < 0)
            continue;
        t->tok[id].eog = true;
        t->tok[id].type = TOK_T_CONTROL;
        if (t->eot < 0 && strcmp(eot_texts[i], "<|eom_id|>"))
            t->eot = id;
        if (t->eom < 0 && !strcmp(eot_texts[i], "<|eom_id|>"))
            t->eom = id;
    }
    /* FIM tokens of GGUFs written before the fim_*_token_id keys, by their text (Qwen2.5-Coder,
     * StarCoder, CodeLlama spellings) */
    static const char *const fim_texts[][VKI_FIM_COUNT] = {
        {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"},
        {"<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"},
        {"<PRE>", "<SUF>", "<MID>", "<reponame>", NULL},
    };
    for (size_t i = 0; i < sizeof fim_texts / sizeof fim_texts[0]; i++)
        for (int k = 0; k < VKI_FIM_COUNT; k++)
            if (t->fim[k] < 0 && fim_texts[i][k])
                t->fim[k] = tok_lookup(t, fim_texts[i][k], strlen(fim_texts[i][k]));
    int32_t ends[3] = {t->eos, t->eot, t->eom};
    for (int i = 0; i < 3; i++)
        if (ends[i] >= 0)
            t->tok[ends[i]].eog = true;
    /* GLM-4 (a vocabulary with "[gMASK]"): its generation_config.json ends generation at "<|user|>"
     * and "<|observation|>" (a tool's result is due) as well as eos "<|endoftext|>"; llama.cpp's
     * converter writes only "<|user|>", as eot */
    int32_t glm_ends[2] = {tok_lookup(t, "<|user|>", 8), tok_lookup(t, "<|observation|>", 15)};
    bool glm = tok_lookup(t, "[gMASK]", 7) >= 0;
    for (int i = 0; glm && i < 2; i++)
        if (glm_ends[i] >= 0) {
            t->tok[glm_ends[i]].eog = true;
            t->tok[glm_ends[i]].type = TOK_T_CONTROL;
        }
    /* Command R7B / A: nothing but "<|END_OF_TURN_TOKEN|>" may follow "<|END_RESPONSE|>" (the answer is
     * done; Ollama stops there too), whatever eos the file names */
    int32_t end_response = tok_lookup(t, "<|END_RESPONSE|>", 16);
    if (end_response >= 0 && tok_lookup(t, "<|END_OF_TURN_TOKEN|>", 21) >= 0) {
        t->tok[end_response].eog = true;
        t->tok[end_response].type = TOK_T_CONTROL;
    }
    int32_t ret = tok_lookup(t, "<|return|>", 10), call = tok_lookup(t, "<|call|>", 8);
    int32_t end = tok_lookup(t, "<|end|>", 7);
    if (ret >= 0 && call >= 0 && end >= 0) { /* harmony: whatever the metadata says, as llama.cpp */
        t->tok[end].eog = false;
        if (t->eot == end)
            t->eot = ret;
    }
}

static int cmp_special(const void *pa, const void *pb, void *ctx)
{
    const vki_tokenizer *t = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (t->tok[a].len != t->tok[b].len)
        return t->tok[a].len > t->tok[b].len ? -1 : 1;
    return a < b ? -1 : a > b;
}

static vki_status build_special_list(vki_tokenizer *t)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->tok[i].type;
        if ((ty == TOK_T_CONTROL || ty == TOK_T_USER_DEFINED || ty == TOK_T_UNKNOWN) && t->tok[i].len)
            n++;
    }
    if (!n)
        return VKI_OK;
    t->special = malloc((size_t)n * sizeof *t->special);
    if (!t->special)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->tok[i].type;
        if ((ty == TOK_T_CONTROL || ty == TOK_T_USER_DEFINED || ty == TOK_T_UNKNOWN) && t->tok[i].len)
            t->special[t->n_special++] = (int32_t)i;
    }
    qsort_r(t->special, n, sizeof *t->special, cmp_special, t);
    return VKI_OK;
}

/* SPM: <0xNN> byte tokens, else the one-byte token, else unk. BPE: the token of the GPT-2
 * code point that stands for the byte. */
static void build_byte_tokens(vki_tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char buf[8];
        int32_t id;
        if (t->kind == TOK_SPM) {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            id = tok_lookup(t, buf, 6);
            if (id < 0) {
                buf[0] = (char)b;
                id = tok_lookup(t, buf, 1);
            }
            if (id < 0)
                id = t->unk;
        } else {
            uint32_t cp = tok_gpt2_byte_to_cp((uint8_t)b);
            size_t n = cp < 0x80 ? 1 : 2; /* mapped code points are all below U+0800 */
            if (n == 1)
                buf[0] = (char)cp;
            else {
                buf[0] = (char)(0xC0 | (cp >> 6));
                buf[1] = (char)(0x80 | (cp & 0x3F));
            }
            id = tok_lookup(t, buf, n);
        }
        t->byte_tok[b] = id;
    }
}

static void build_pieces(vki_tokenizer *t)
{
    size_t off = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++)
        off += t->tok[i].len;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        size_t n = tok_render_piece(t, (int32_t)i, t->arena + off, t->arena_len - off);
        if (n > t->arena_len - off) /* cannot happen (pieces never outgrow texts); stay in bounds */
            n = 0;
        t->tok[i].piece_off = (uint32_t)off;
        t->tok[i].piece_len = (uint32_t)n;
        off += n;
        if (n > t->max_piece_len)
            t->max_piece_len = (uint32_t)n;
    }
}

/* ---- load: entry points --------------------------------------------------------------------- */

static vki_status load_model_kind(vki_tokenizer *t, const gguf_file *f, char *err, size_t err_len)
{
    gguf_str model;
    vki_status st = gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (st != VKI_OK) {
        tok_err(err, err_len, "tokenizer.ggml.model: %s", st == VKI_ERR_NOT_FOUND ? "missing" : "not a string");
        return VKI_ERR_FORMAT;
    }
    if (gguf_str_eq(model, "llama")) {
        t->kind = TOK_SPM;
        t->add_bos = true;
        t->add_space_prefix = true;
        t->bos = 1, t->eos = 2, t->unk = 0; /* llama.cpp's defaults for SPM */
        snprintf(t->model, sizeof t->model, "llama");
    } else if (gguf_str_eq(model, "gpt2")) {
        t->kind = TOK_BPE;
        snprintf(t->model, sizeof t->model, "gpt2");
    } else {
        int n = model.len > 64 ? 64 : (int)model.len;
        tok_err(err, err_len, "tokenizer model '%.*s' is not supported (supported: llama, gpt2)", n, model.ptr);
        return VKI_ERR_UNSUPPORTED;
    }
    return VKI_OK;
}

static vki_status load_pre(vki_tokenizer *t, const gguf_file *f, char *err, size_t err_len)
{
    gguf_str pre = {0};
    vki_status st = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
    if (st != VKI_OK && st != VKI_ERR_NOT_FOUND) {
        tok_err(err, err_len, "tokenizer.ggml.pre: not a string");
        return VKI_ERR_FORMAT;
    }
    char name[64];
    if (st == VKI_ERR_NOT_FOUND || pre.len == 0)
        snprintf(name, sizeof name, "default");
    else if (pre.len >= sizeof name) {
        tok_err(err, err_len, "pre-tokenizer '%.*s...' is not supported", 40, pre.ptr);
        return VKI_ERR_UNSUPPORTED;
    } else {
        memcpy(name, pre.ptr, pre.len);
        name[pre.len] = 0;
    }
    if (t->kind == TOK_SPM) { /* SentencePiece has no pre-tokenizer; llama.cpp ignores the name */
        snprintf(t->pre, sizeof t->pre, "default");
        return VKI_OK;
    }
    return tok_bpe_setup_pre(t, name, err, err_len);
}

/* tokenizer.chat_template, kept for vki_chat_template_create (absent: NULL, not an error). */
static vki_status load_chat_template(vki_tokenizer *t, const gguf_file *f, char *err, size_t err_len)
{
    gguf_str s;
    vki_status st = gguf_get_str(f, "tokenizer.chat_template", &s);
    if (st == VKI_ERR_NOT_FOUND)
        return VKI_OK;
    if (st != VKI_OK) {
        tok_err(err, err_len, "tokenizer.chat_template: not a string");
        return VKI_ERR_FORMAT;
    }
    if (!(t->chat_template = s.len < SIZE_MAX ? malloc((size_t)s.len + 1) : NULL))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    memcpy(t->chat_template, s.ptr, (size_t)s.len);
    t->chat_template[s.len] = 0;
    return VKI_OK;
}

vki_status tok_from_gguf(const gguf_file *f, vki_tokenizer **out, char *err, size_t err_len)
{
    if (!f || !out)
        return VKI_ERR_INVALID_ARG;
    *out = NULL;
    vki_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = -1;
    for (int k = 0; k < VKI_FIM_COUNT; k++)
        t->fim[k] = -1;
    vki_status st = load_model_kind(t, f, err, err_len);
    if (st == VKI_OK)
        st = load_pre(t, f, err, err_len);
    if (st == VKI_OK)
        st = load_vocab(t, f, err, err_len);
    if (st != VKI_OK)
        goto fail;
    if (t->kind == TOK_SPM && t->unk >= (int32_t)t->n_vocab)
        t->unk = -1;
    if (t->kind == TOK_SPM && t->bos >= (int32_t)t->n_vocab)
        t->bos = -1;
    if (t->kind == TOK_SPM && t->eos >= (int32_t)t->n_vocab)
        t->eos = -1;
    st = load_special_ids(t, f, err, err_len);
    if (st != VKI_OK)
        goto fail;
    mark_eog(t);
    build_byte_tokens(t);
    build_pieces(t);
    if (t->kind == TOK_BPE && (st = load_merges(t, f, err, err_len)) != VKI_OK)
        goto fail;
    if ((st = build_special_list(t)) != VKI_OK)
        goto fail;
    if ((st = load_chat_template(t, f, err, err_len)) != VKI_OK)
        goto fail;
    *out = t;
    return VKI_OK;
fail:
    if (st == VKI_ERR_OUT_OF_HOST_MEMORY)
        tok_err(err, err_len, "out of host memory loading the tokenizer");
    vki_tokenizer_free(t);
    return st;
}

vki_status vki_tokenizer_load(const char *path, vki_tokenizer **out, char *err, size_t err_len)
{
    if (!path || !out) {
        tok_err(err, err_len, "vki_tokenizer_load: path and out are required");
        return VKI_ERR_INVALID_ARG;
    }
    *out = NULL;
    gguf_file *f = NULL;
    vki_status st = gguf_open(path, &f, err, err_len);
    if (st != VKI_OK)
        return st;
    st = tok_from_gguf(f, out, err, err_len);
    gguf_close(f);
    return st;
}

void vki_tokenizer_free(vki_tokenizer *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
    free(t->special);
    free(t->merges.slot);
    free(t->map.slot);
    free(t->arena);
    free(t->tok);
    free(t->chat_template);
    free(t);
}

const char *vki_tokenizer_chat_template(const vki_tokenizer *t) { return t ? t->chat_template : NULL; }

const char *tok_model_name(const vki_tokenizer *t) { return t->model; }
const char *tok_pre_name(const vki_tokenizer *t) { return t->pre; }

uint32_t vki_vocab_size(const vki_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t vki_token_bos(const vki_tokenizer *t) { return t ? t->bos : -1; }
int32_t vki_token_eos(const vki_tokenizer *t) { return t ? t->eos : -1; }
int32_t vki_token_fim(const vki_tokenizer *t, vki_fim_token which)
{
    return t && (unsigned)which < VKI_FIM_COUNT ? t->fim[which] : -1;
}
bool vki_tokenizer_adds_bos(const vki_tokenizer *t) { return t && t->add_bos; }

bool vki_token_is_eog(const vki_tokenizer *t, int32_t id)
{
    return t && id >= 0 && (uint32_t)id < t->n_vocab && t->tok[id].eog;
}

/* ---- tokenize ------------------------------------------------------------------------------- */

/* A piece of the input: raw text [off, off+len) when id < 0, else the special token id. */
typedef struct tok_frag {
    size_t off, len;
    int32_t id;
} tok_frag;

typedef struct tok_frags {
    tok_frag *v;
    size_t n, cap;
} tok_frags;

static vki_status frags_push(tok_frags *a, tok_frag f)
{
    if (a->n == a->cap) {
        tok_frag *v = tok_grow(a->v, &a->cap, sizeof *v, 16);
        if (!v)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        a->v = v;
    }
    a->v[a->n++] = f;
    return VKI_OK;
}

/* Splits every raw fragment of *fr at each occurrence of special token id (left to right,
 * non-overlapping). Rebuilds the list only when the token occurs. Cost: one memmem scan of the
 * raw text per special token. */
static vki_status split_on(const vki_tokenizer *t, const char *text, int32_t id, tok_frags *fr)
{
    const char *s = t->arena + t->tok[id].off;
    size_t sl = t->tok[id].len;
    size_t i = 0;
    for (; i < fr->n; i++)
        if (fr->v[i].id < 0 && fr->v[i].len >= sl && memmem(text + fr->v[i].off, fr->v[i].len, s, sl))
            break;
    if (i == fr->n)
        return VKI_OK;
    tok_frags nf = {0};
    vki_status st = VKI_OK;
    for (size_t j = 0; j < fr->n && st == VKI_OK; j++) {
        tok_frag f = fr->v[j];
        if (j < i || f.id >= 0) {
            st = frags_push(&nf, f);
            continue;
        }
        size_t pos = f.off, end = f.off + f.len;
        const char *hit;
        while (st == VKI_OK && end - pos >= sl && (hit = memmem(text + pos, end - pos, s, sl))) {
            size_t h = (size_t)(hit - text);
            if (h > pos)
                st = frags_push(&nf, (tok_frag){pos, h - pos, -1});
            if (st == VKI_OK)
                st = frags_push(&nf, (tok_frag){h, sl, id});
            pos = h + sl;
        }
        if (st == VKI_OK && pos < end)
            st = frags_push(&nf, (tok_frag){pos, end - pos, -1});
    }
    if (st != VKI_OK) {
        free(nf.v);
        return st;
    }
    free(fr->v);
    *fr = nf;
    return VKI_OK;
}

/* Special tokens are matched longest first over the whole text (llama.cpp's order). Control and
 * unknown tokens only with parse_special; user-defined tokens always (as HF tokenizers does). */
static vki_status partition(const vki_tokenizer *t, const char *text, size_t len, bool parse_special,
                            tok_frags *fr)
{
    vki_status st = len ? frags_push(fr, (tok_frag){0, len, -1}) : VKI_OK;
    for (uint32_t k = 0; k < t->n_special && st == VKI_OK && fr->n; k++) {
        int32_t id = t->special[k];
        if (!parse_special && t->tok[id].type != TOK_T_USER_DEFINED)
            continue;
        st = split_on(t, text, id, fr);
    }
    return st;
}

static vki_status encode(const vki_tokenizer *t, const char *text, size_t len, bool add_special,
                         bool parse_special, tok_ids *ids)
{
    tok_frags fr = {0};
    vki_status st = VKI_OK;
    if (add_special && t->add_bos)
        st = tok_ids_push(ids, t->bos);
    if (st == VKI_OK)
        st = partition(t, text, len, parse_special, &fr);
    bool prev_special = true; /* SPM: a space is prepended to the first text and after specials */
    for (size_t i = 0; i < fr.n && st == VKI_OK; i++) {
        const tok_frag *f = &fr.v[i];
        if (f->id >= 0) {
            st = tok_ids_push(ids, f->id);
            prev_special = true;
        } else if (t->kind == TOK_SPM) {
            st = tok_spm_encode(t, text + f->off, f->len, t->add_space_prefix && prev_special, ids);
            prev_special = false;
        } else {
            st = tok_bpe_encode(t, text + f->off, f->len, ids);
        }
    }
    if (st == VKI_OK && add_special && t->add_eos)
        st = tok_ids_push(ids, t->eos);
    free(fr.v);
    return st;
}

vki_status vki_tokenize(const vki_tokenizer *t, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *out, size_t cap, size_t *n_out)
{
    if (!t || !n_out || (len && !text) || (cap && !out))
        return VKI_ERR_INVALID_ARG;
    *n_out = 0;
    tok_ids ids = {0};
    vki_status st = encode(t, text, len, add_special, parse_special, &ids);
    if (st == VKI_OK) {
        *n_out = ids.n;
        if (ids.n > cap)
            st = VKI_ERR_INVALID_ARG;
        else if (ids.n)
            memcpy(out, ids.v, ids.n * sizeof *ids.v);
    }
    free(ids.v);
    return st;
}
