/* SentencePiece ("llama") encoding: the BPE-with-scores algorithm that llama.cpp and
 * SentencePiece's BPE model use.
 *
 *   1. A space is prepended (when asked) and every ' ' becomes U+2581.
 *   2. The text is split into UTF-8 characters (a stray invalid byte alone), the initial symbols.
 *   3. Repeatedly merge the adjacent pair whose concatenation is a token with the highest score
 *      (ties: the leftmost pair), using a heap of candidates; stale candidates are dropped on pop.
 *   4. Each final symbol is its token, or, if its text is no token (a character outside the
 *      vocabulary), one <0xNN> byte token per byte.
 *
 * Cost: O(n log n) in the fragment length; one allocation of the symbol array per call. */
#include <stdlib.h>
#include <string.h>

#include "host/tokenizer/tok_impl.h"

typedef struct spm_sym {
    uint32_t start, n; /* bytes of the escaped text; n = 0 once merged into its left neighbour */
    int32_t prev, next;
} spm_sym;

typedef struct spm_ctx {
    const vki_tokenizer *t;
    const char *text;
    spm_sym *sym;
    tok_heap heap;
} spm_ctx;

/* Orders floats as unsigned integers (IEEE-754 total order for non-NaN values). */
static uint32_t float_order(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static vki_status try_pair(spm_ctx *c, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return VKI_OK;
    const spm_sym *a = &c->sym[l], *b = &c->sym[r];
    uint32_t n = a->n + b->n;
    int32_t id = tok_lookup(c->t, c->text + a->start, n);
    if (id < 0)
        return VKI_OK;
    /* min-heap key: highest score first, then the leftmost pair */
    uint64_t key = (uint64_t)(~float_order(c->t->tok[id].score)) << 32 | (uint32_t)l;
    return tok_heap_push(&c->heap, (tok_cand){.key = key, .left = l, .right = r, .aux = n});
}

static vki_status emit(const spm_ctx *c, const spm_sym *s, tok_ids *out)
{
    int32_t id = tok_lookup(c->t, c->text + s->start, s->n);
    if (id >= 0)
        return tok_ids_push(out, id);
    for (uint32_t i = 0; i < s->n; i++) {
        int32_t b = c->t->byte_tok[(uint8_t)c->text[s->start + i]];
        if (b >= 0) {
            vki_status st = tok_ids_push(out, b);
            if (st != VKI_OK)
                return st;
        }
    }
    return VKI_OK;
}

/* Escapes spaces into a new buffer: [U+2581] text with ' ' -> U+2581. */
static char *escape(const char *text, size_t len, bool add_prefix, size_t *out_len)
{
    size_t spaces = add_prefix;
    for (size_t i = 0; i < len; i++)
        spaces += text[i] == ' ';
    if (len > (SIZE_MAX - 4) / 3)
        return NULL;
    char *e = malloc(len + 2 * spaces + 1);
    if (!e)
        return NULL;
    size_t n = 0;
    if (add_prefix) {
        memcpy(e, "\xE2\x96\x81", 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(e + n, "\xE2\x96\x81", 3);
            n += 3;
        } else
            e[n++] = text[i];
    }
    *out_len = n;
    return e;
}

static vki_status merge_all(spm_ctx *c)
{
    vki_status st = VKI_OK;
    while (c->heap.n && st == VKI_OK) {
        tok_cand p = tok_heap_pop(&c->heap);
        spm_sym *a = &c->sym[p.left], *b = &c->sym[p.right];
        if (!a->n || !b->n || a->next != p.right || a->n + b->n != p.aux)
            continue; /* one side already merged elsewhere */
        a->n += b->n;
        b->n = 0;
        a->next = b->next;
        if (b->next >= 0)
            c->sym[b->next].prev = p.left;
        st = try_pair(c, a->prev, p.left);
        if (st == VKI_OK)
            st = try_pair(c, p.left, a->next);
    }
    return st;
}

vki_status tok_spm_encode(const vki_tokenizer *t, const char *text, size_t len, bool add_prefix,
                          tok_ids *out)
{
    size_t n;
    if (!len && !add_prefix)
        return VKI_OK;
    char *e = escape(text, len, add_prefix, &n);
    if (!e)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    if (n > INT32_MAX) {
        free(e);
        return VKI_ERR_INVALID_ARG;
    }
    spm_ctx c = {.t = t, .text = e};
    c.sym = malloc(n * sizeof *c.sym);
    vki_status st = c.sym ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    int32_t n_sym = 0;
    for (size_t off = 0; off < n && st == VKI_OK;) {
        /* llama.cpp sizes a symbol by its lead byte alone; for invalid UTF-8 that swallows the
         * next character (even an escaped space). A stray byte is a symbol of its own here, which
         * is the same on valid text and keeps invalid text lossless through byte fallback. */
        size_t cl = tok_utf8_valid((const uint8_t *)e + off, n - off);
        if (!cl)
            cl = 1;
        c.sym[n_sym] = (spm_sym){.start = (uint32_t)off, .n = (uint32_t)cl, .prev = n_sym - 1,
                                 .next = off + cl == n ? -1 : n_sym + 1};
        n_sym++;
        off += cl;
    }
    for (int32_t i = 1; i < n_sym && st == VKI_OK; i++)
        st = try_pair(&c, i - 1, i);
    if (st == VKI_OK)
        st = merge_all(&c);
    for (int32_t i = 0; i != -1 && n_sym && st == VKI_OK; i = c.sym[i].next)
        st = emit(&c, &c.sym[i], out);
    free(c.heap.v);
    free(c.sym);
    free(e);
    return st;
}
