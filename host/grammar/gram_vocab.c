/* The vocabulary trie (see gram_impl.h): token pieces sorted by bytes, laid out in depth-first
 * preorder so that a mask walk is one forward pass over arrays. */
#include <stdlib.h>
#include <string.h>

#include "host/grammar/gram_impl.h"

typedef struct piece_ref {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
} piece_ref;

static int piece_cmp(const void *a, const void *b)
{
    const piece_ref *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

void gram_vocab_free(gram_vocab *v)
{
    if (!v)
        return;
    free(v->byte);
    free(v->depth);
    free(v->next);
    free(v->tok0);
    free(v->n_tok);
    free(v->tok_ids);
    free(v->bytes);
    free(v->piece_off);
    free(v->is_end);
    free(v);
}

/* Collects every token's bytes into v->bytes / v->piece_off and the end flags. */
static vki_status read_pieces(gram_vocab *v, gram_piece_fn piece, bool (*is_end)(void *, int32_t), void *ctx)
{
    size_t cap = (size_t)v->n_vocab * 8 + 64, used = 0;
    char buf[GRAM_MAX_TOKEN_BYTES];
    v->bytes = malloc(cap);
    v->piece_off = malloc(((size_t)v->n_vocab + 1) * sizeof *v->piece_off);
    v->is_end = calloc(v->n_vocab, 1);
    if (!v->bytes || !v->piece_off || !v->is_end)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t id = 0; id < v->n_vocab; id++) {
        size_t n = 0;
        v->piece_off[id] = (uint32_t)used;
        v->is_end[id] = is_end && is_end(ctx, (int32_t)id);
        vki_status st = v->is_end[id] ? VKI_OK : piece(ctx, (int32_t)id, buf, sizeof buf, &n);
        if (st == VKI_ERR_INVALID_ARG && n > sizeof buf)
            n = 0; /* longer than any grammar needs: never allowed */
        else if (st != VKI_OK)
            return st;
        if (used + n > cap) {
            cap = (used + n) * 2;
            if (cap > UINT32_MAX)
                return VKI_ERR_OUT_OF_HOST_MEMORY;
            uint8_t *nb = realloc(v->bytes, cap);
            if (!nb)
                return VKI_ERR_OUT_OF_HOST_MEMORY;
            v->bytes = nb;
        }
        memcpy(v->bytes + used, buf, n);
        used += n;
    }
    v->piece_off[v->n_vocab] = (uint32_t)used;
    return VKI_OK;
}

/* Builds the preorder trie from the pieces sorted by bytes: consecutive pieces share their
 * common prefix's nodes; a node's subtree ends where a later piece diverges above it. */
static vki_status build_trie(gram_vocab *v, piece_ref *refs, uint32_t n)
{
    uint64_t total = 0;
    for (uint32_t k = 0; k < n; k++)
        total += refs[k].len;
    size_t cap = total ? (size_t)total : 1;
    v->byte = malloc(cap);
    v->depth = malloc(cap * sizeof *v->depth);
    v->next = malloc(cap * sizeof *v->next);
    v->tok0 = malloc(cap * sizeof *v->tok0);
    v->n_tok = calloc(cap, sizeof *v->n_tok);
    v->tok_ids = malloc((n ? n : 1) * sizeof *v->tok_ids);
    uint32_t *path = malloc((GRAM_MAX_TOKEN_BYTES + 1) * sizeof *path);
    if (!v->byte || !v->depth || !v->next || !v->tok0 || !v->n_tok || !v->tok_ids || !path) {
        free(path);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    uint32_t nodes = 0, open = 0; /* open: depth of the deepest node still open */
    for (uint32_t k = 0; k < n; k++) {
        const piece_ref *r = &refs[k];
        uint32_t lcp = 0;
        if (k) {
            uint32_t m = r->len < refs[k - 1].len ? r->len : refs[k - 1].len;
            while (lcp < m && r->p[lcp] == refs[k - 1].p[lcp])
                lcp++;
        }
        for (; open > lcp; open--)
            v->next[path[open]] = nodes;
        for (uint32_t d = lcp + 1; d <= r->len; d++) {
            v->byte[nodes] = r->p[d - 1];
            v->depth[nodes] = (uint16_t)d;
            v->tok0[nodes] = k;
            path[d] = nodes++;
        }
        open = r->len;
        uint32_t at = path[r->len];
        if (!v->n_tok[at]++)
            v->tok0[at] = k;
        v->tok_ids[k] = r->id;
        if (r->len > v->max_depth)
            v->max_depth = r->len;
    }
    for (; open > 0; open--)
        v->next[path[open]] = nodes;
    v->n_nodes = nodes;
    free(path);
    return VKI_OK;
}

vki_status gram_vocab_create(uint32_t n_vocab, gram_piece_fn piece, bool (*is_end)(void *ctx, int32_t id),
                             void *ctx, gram_vocab **out)
{
    *out = NULL;
    if (!n_vocab || !piece)
        return VKI_ERR_INVALID_ARG;
    gram_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    v->n_vocab = n_vocab;
    vki_status st = read_pieces(v, piece, is_end, ctx);
    piece_ref *refs = st == VKI_OK ? malloc((size_t)n_vocab * sizeof *refs) : NULL;
    if (st == VKI_OK && !refs)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    uint32_t n = 0;
    for (uint32_t id = 0; st == VKI_OK && id < n_vocab; id++) {
        uint32_t len = v->piece_off[id + 1] - v->piece_off[id];
        if (len && !v->is_end[id])
            refs[n++] = (piece_ref){v->bytes + v->piece_off[id], len, (int32_t)id};
    }
    if (st == VKI_OK) {
        qsort(refs, n, sizeof *refs, piece_cmp);
        st = build_trie(v, refs, n);
    }
    free(refs);
    if (st != VKI_OK) {
        gram_vocab_free(v);
        return st;
    }
    *out = v;
    return VKI_OK;
}

/* Token text as the user sees it: control tokens (no plain text) are left out, so a grammar
 * never makes the model emit a token whose text would not show in the output. */
static vki_status tok_piece(void *ctx, int32_t id, char *buf, size_t cap, size_t *n)
{
    return vki_token_to_piece(ctx, id, false, buf, cap, n);
}

static bool tok_is_end(void *ctx, int32_t id) { return vki_token_is_eog(ctx, id); }

vki_status gram_vocab_from_tokenizer(const vki_tokenizer *tok, gram_vocab **out)
{
    return gram_vocab_create(vki_vocab_size(tok), tok_piece, tok_is_end, (void *)tok, out);
}

uint32_t gram_vocab_size(const gram_vocab *v) { return v->n_vocab; }
uint32_t gram_vocab_nodes(const gram_vocab *v) { return v->n_nodes; }

const uint8_t *gram_vocab_piece(const gram_vocab *v, int32_t id, uint32_t *len)
{
    if (id < 0 || (uint32_t)id >= v->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = v->is_end[id] ? 0 : v->piece_off[id + 1] - v->piece_off[id];
    return v->bytes + v->piece_off[id];
}

bool gram_vocab_is_end(const gram_vocab *v, int32_t id)
{
    return id >= 0 && (uint32_t)id < v->n_vocab && v->is_end[id];
}
