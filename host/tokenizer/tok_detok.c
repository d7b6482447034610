/* Detokenisation: token -> bytes (rendered once at load into the piece cache), whole-sequence
 * detokenisation, and the streaming detokeniser that only ever emits complete UTF-8. */
#include <stdlib.h>
#include <string.h>

#include "host/tokenizer/tok_impl.h"

static inline void put(char *buf, size_t cap, size_t *n, char c)
{
    if (*n < cap)
        buf[*n] = c;
    (*n)++;
}

static void put_raw(char *buf, size_t cap, size_t *n, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        put(buf, cap, n, s[i]);
}

/* "<0xNN>" -> NN, or -1. */
static int byte_token_value(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* GPT-2 code points back to bytes; a code point outside the map is copied as its UTF-8. */
static void put_gpt2_decoded(char *buf, size_t cap, size_t *n, const char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        size_t k = tok_utf8_valid((const uint8_t *)s + i, len - i);
        if (!k) {
            put(buf, cap, n, s[i++]);
            continue;
        }
        const uint8_t *u = (const uint8_t *)s + i;
        uint32_t cp = k == 1 ? u[0] : k == 2 ? (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F) : 0x110000;
        int b = tok_gpt2_cp_to_byte(cp);
        if (b >= 0)
            put(buf, cap, n, (char)b);
        else
            put_raw(buf, cap, n, s + i, k);
        i += k;
    }
}

/* Never longer than the token text: U+2581 (3 bytes) -> 1, <0xNN> (6) -> 1, a GPT-2 code point
 * (1-2 bytes) -> 1; the arena relies on this. Undefined and unused tokens render as nothing
 * (as in llama.cpp). */
size_t tok_render_piece(const vki_tokenizer *t, int32_t id, char *buf, size_t cap)
{
    const tok_entry *e = &t->tok[id];
    const char *s = t->arena + e->off;
    size_t n = 0;
    int b;
    switch (e->type) {
    case TOK_T_CONTROL:
    case TOK_T_UNKNOWN:
    case TOK_T_USER_DEFINED:
        put_raw(buf, cap, &n, s, e->len);
        break;
    case TOK_T_BYTE:
        if ((b = byte_token_value(s, e->len)) >= 0)
            put(buf, cap, &n, (char)b);
        else
            put_raw(buf, cap, &n, s, e->len);
        break;
    case TOK_T_NORMAL:
        if (t->kind == TOK_BPE) {
            put_gpt2_decoded(buf, cap, &n, s, e->len);
            break;
        }
        for (size_t i = 0; i < e->len; i++) {
            if (i + 3 <= e->len && !memcmp(s + i, "\xE2\x96\x81", 3)) {
                put(buf, cap, &n, ' ');
                i += 2;
            } else
                put(buf, cap, &n, s[i]);
        }
        break;
    default:
        break;
    }
    return n;
}

/* The cached piece of id; control and unknown tokens are empty unless `special`. */
static void piece(const vki_tokenizer *t, int32_t id, bool special, const char **p, size_t *n)
{
    const tok_entry *e = &t->tok[id];
    *p = t->arena + e->piece_off;
    *n = e->piece_len;
    if (!special && (e->type == TOK_T_CONTROL || e->type == TOK_T_UNKNOWN))
        *n = 0;
}

static bool valid_id(const vki_tokenizer *t, int32_t id)
{
    return id >= 0 && (uint32_t)id < t->n_vocab;
}

vki_status vki_token_to_piece(const vki_tokenizer *t, int32_t id, bool special, char *buf, size_t cap,
                              size_t *n_out)
{
    if (!t || !n_out || (cap && !buf) || !valid_id(t, id))
        return VKI_ERR_INVALID_ARG;
    const char *p;
    size_t n;
    piece(t, id, special, &p, &n);
    *n_out = n;
    if (n > cap)
        return VKI_ERR_INVALID_ARG;
    memcpy(buf, p, n);
    return VKI_OK;
}

vki_status vki_detokenize(const vki_tokenizer *t, const int32_t *ids, size_t n_ids, uint32_t flags,
                          char *buf, size_t cap, size_t *n_out)
{
    if (!t || !n_out || (n_ids && !ids) || (cap && !buf))
        return VKI_ERR_INVALID_ARG;
    *n_out = 0;
    for (size_t i = 0; i < n_ids; i++)
        if (!valid_id(t, ids[i]))
            return VKI_ERR_INVALID_ARG;
    bool strip = (flags & VKI_DETOK_STRIP_LEADING_SPACE) && t->add_space_prefix;
    size_t n = 0;
    for (size_t i = 0; i < n_ids; i++) {
        const char *p;
        size_t len;
        piece(t, ids[i], flags & VKI_DETOK_SPECIAL, &p, &len);
        if (strip && len) {
            if (p[0] == ' ')
                p++, len--;
            strip = false;
        }
        put_raw(buf, cap, &n, p, len);
    }
    *n_out = n;
    return n > cap ? VKI_ERR_INVALID_ARG : VKI_OK;
}

/* ---- streaming ------------------------------------------------------------------------------ */

struct vki_detok {
    const vki_tokenizer *t;
    uint32_t flags;
    bool strip_pending;
    uint8_t held[4]; /* a UTF-8 sequence still incomplete at the end of the last piece */
    uint32_t n_held;
    char *in;  /* held + piece: [max_piece_len + 4] */
    char *out; /* worst case every input byte becomes U+FFFD: [3 * (max_piece_len + 4)] */
};

vki_status vki_detok_create(const vki_tokenizer *t, uint32_t flags, vki_detok **out)
{
    if (!t || !out)
        return VKI_ERR_INVALID_ARG;
    *out = NULL;
    vki_detok *d = calloc(1, sizeof *d);
    size_t m = (size_t)t->max_piece_len + 4;
    if (d) {
        d->in = malloc(m);
        d->out = malloc(3 * m);
    }
    if (!d || !d->in || !d->out) {
        vki_detok_free(d);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    d->t = t;
    d->flags = flags;
    d->strip_pending = (flags & VKI_DETOK_STRIP_LEADING_SPACE) && t->add_space_prefix;
    *out = d;
    return VKI_OK;
}

void vki_detok_free(vki_detok *d)
{
    if (!d)
        return;
    free(d->in);
    free(d->out);
    free(d);
}

/* Copies the complete, valid sequences of in[0, m) to d->out. Each maximal ill-formed
 * subsequence becomes one U+FFFD (Unicode's recommended practice). A valid but incomplete tail
 * is kept in d->held unless `final`, when it too becomes U+FFFD. */
static size_t drain(vki_detok *d, const uint8_t *in, size_t m, bool final)
{
    size_t n = 0, i = 0;
    d->n_held = 0;
    while (i < m) {
        size_t need, k = tok_utf8_prefix(in + i, m - i, &need);
        if (k == need) {
            memcpy(d->out + n, in + i, k);
            n += k;
            i += k;
        } else if (i + k == m && !final) {
            memcpy(d->held, in + i, k);
            d->n_held = (uint32_t)k;
            break;
        } else {
            memcpy(d->out + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i += k ? k : 1;
        }
    }
    return n;
}

vki_status vki_detok_push(vki_detok *d, int32_t id, const char **text, size_t *len)
{
    if (!d || !text || !len || !valid_id(d->t, id))
        return VKI_ERR_INVALID_ARG;
    const char *p;
    size_t n;
    piece(d->t, id, d->flags & VKI_DETOK_SPECIAL, &p, &n);
    if (d->strip_pending && n) {
        if (p[0] == ' ')
            p++, n--;
        d->strip_pending = false;
    }
    memcpy(d->in, d->held, d->n_held);
    memcpy(d->in + d->n_held, p, n);
    *len = drain(d, (const uint8_t *)d->in, d->n_held + n, false);
    *text = d->out;
    return VKI_OK;
}

vki_status vki_detok_flush(vki_detok *d, const char **text, size_t *len)
{
    if (!d || !text || !len)
        return VKI_ERR_INVALID_ARG;
    memcpy(d->in, d->held, d->n_held);
    *len = drain(d, (const uint8_t *)d->in, d->n_held, true);
    *text = d->out;
    d->strip_pending = (d->flags & VKI_DETOK_STRIP_LEADING_SPACE) && d->t->add_space_prefix;
    return VKI_OK;
}
