/* GGUF v3 writer. Metadata entries are serialised as they are set into one growing byte buffer
 * (so the header is a single fwrite); tensor descriptions are kept in an array. Duplicate-key
 * checks are a linear scan: O(n_keys^2) over a few dozen keys. */
#include "engine/gguf_write.h"
#include "engine/quant.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_W_DEFAULT_ALIGNMENT 32
#define GGUF_W_MAX_NAME 64

typedef struct gguf_w_tensor {
    char name[GGUF_W_MAX_NAME + 1];
    uint32_t type;                /* VKI_GGML_* */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset;              /* relative to the data section; assigned by gguf_w_begin */
} gguf_w_tensor;

typedef enum gguf_w_state { GGUF_W_BUILD, GGUF_W_DATA, GGUF_W_DONE, GGUF_W_FAILED } gguf_w_state;

struct gguf_writer {
    uint8_t *kv;          /* serialised metadata entries [kv_len] */
    size_t kv_len, kv_cap;
    char **keys;          /* [n_kv] copies of the keys, for the duplicate check */
    uint64_t n_kv;
    size_t keys_cap;
    gguf_w_tensor *t;     /* [n_t] */
    uint64_t n_t;
    size_t t_cap;
    uint64_t alignment;
    gguf_w_state state;
    FILE *fp;
    bool own_fp;          /* opened by gguf_w_open */
    uint64_t cur;         /* tensor being written */
    uint64_t cur_done;    /* its bytes written so far */
    char err[256];
};

static vki_status w_fail(gguf_writer *w, vki_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static vki_status w_fail(gguf_writer *w, vki_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    return st;
}

vki_status gguf_w_create(gguf_writer **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    (*out)->alignment = GGUF_W_DEFAULT_ALIGNMENT;
    return VKI_OK;
}

void gguf_w_destroy(gguf_writer *w)
{
    if (!w)
        return;
    if (w->own_fp && w->fp)
        fclose(w->fp);
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    free(w->keys);
    free(w->kv);
    free(w->t);
    free(w);
}

const char *gguf_w_error(const gguf_writer *w)
{
    return w->err;
}

/* ---- metadata -------------------------------------------------------------------------------- */

static vki_status kv_reserve(gguf_writer *w, uint64_t extra)
{
    if (extra > SIZE_MAX / 2 - w->kv_len)
        return w_fail(w, VKI_ERR_INVALID_ARG, "metadata too large");
    if (w->kv_len + extra <= w->kv_cap)
        return VKI_OK;
    size_t cap = (w->kv_len + (size_t)extra) * 2 + 256;
    uint8_t *p = realloc(w->kv, cap);
    if (!p)
        return w_fail(w, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory for metadata");
    w->kv = p;
    w->kv_cap = cap;
    return VKI_OK;
}

/* Appends without checks: kv_reserve was called for the entry's full size. */
static void kv_put(gguf_writer *w, const void *p, size_t n)
{
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
}

static void kv_u32(gguf_writer *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    kv_put(w, b, 4);
}

static void kv_u64(gguf_writer *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    kv_put(w, b, 8);
}

static void kv_str(gguf_writer *w, const char *s, uint64_t len)
{
    kv_u64(w, len);
    kv_put(w, s, (size_t)len);
}

/* Checks the state and the key, reserves room for key + type + value_bytes, writes key and type,
 * and records the key. On failure nothing changes. */
static vki_status kv_begin(gguf_writer *w, const char *key, gguf_type type, uint64_t value_bytes)
{
    if (w->state != GGUF_W_BUILD)
        return w_fail(w, VKI_ERR_INVALID_ARG, "key '%s': metadata is closed once writing began", key);
    size_t klen = strlen(key);
    if (klen == 0 || klen > 65535)
        return w_fail(w, VKI_ERR_INVALID_ARG, "key '%.64s': length %zu (allowed 1..65535)", key, klen);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return w_fail(w, VKI_ERR_INVALID_ARG, "key '%s' set twice", key);
    if (w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap * 2 + 16;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k)
            return w_fail(w, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
        w->keys = k;
        w->keys_cap = cap;
    }
    char *copy = strdup(key);
    if (!copy)
        return w_fail(w, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    vki_status st = value_bytes > UINT64_MAX - 8 - klen - 4 ? w_fail(w, VKI_ERR_INVALID_ARG, "key '%s': value too large", key)
                                                            : kv_reserve(w, 8 + klen + 4 + value_bytes);
    if (st != VKI_OK) {
        free(copy);
        return st;
    }
    w->keys[w->n_kv++] = copy;
    kv_str(w, key, klen);
    kv_u32(w, type);
    return VKI_OK;
}

/* Little-endian bytes of n values of size esz from C memory (the hosts are little-endian, but
 * writing byte by byte keeps the file format independent of that). */
static void kv_le(gguf_writer *w, const void *data, uint64_t esz, uint64_t n)
{
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = 0;
        memcpy(&v, p + i * esz, (size_t)esz); /* little-endian host: low bytes first */
        for (uint64_t b = 0; b < esz; b++)
            w->kv[w->kv_len++] = (uint8_t)(v >> (8 * b));
    }
}

static vki_status set_scalar(gguf_writer *w, const char *key, gguf_type t, const void *v)
{
    uint64_t esz = gguf_type_size(t);
    if (!strcmp(key, "general.alignment")) {
        uint32_t a;
        if (t != GGUF_TYPE_UINT32)
            return w_fail(w, VKI_ERR_INVALID_ARG, "general.alignment must be u32");
        memcpy(&a, v, 4);
        if (a == 0 || (a & (a - 1)))
            return w_fail(w, VKI_ERR_INVALID_ARG, "general.alignment %u is not a power of two", a);
        vki_status st = kv_begin(w, key, t, esz);
        if (st == VKI_OK) {
            w->alignment = a;
            kv_le(w, v, esz, 1);
        }
        return st;
    }
    vki_status st = kv_begin(w, key, t, esz);
    if (st == VKI_OK)
        kv_le(w, v, esz, 1);
    return st;
}

vki_status gguf_w_set_u8(gguf_writer *w, const char *key, uint8_t v) { return set_scalar(w, key, GGUF_TYPE_UINT8, &v); }
vki_status gguf_w_set_i8(gguf_writer *w, const char *key, int8_t v) { return set_scalar(w, key, GGUF_TYPE_INT8, &v); }
vki_status gguf_w_set_u16(gguf_writer *w, const char *key, uint16_t v) { return set_scalar(w, key, GGUF_TYPE_UINT16, &v); }
vki_status gguf_w_set_i16(gguf_writer *w, const char *key, int16_t v) { return set_scalar(w, key, GGUF_TYPE_INT16, &v); }
vki_status gguf_w_set_u32(gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, GGUF_TYPE_UINT32, &v); }
vki_status gguf_w_set_i32(gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, GGUF_TYPE_INT32, &v); }
vki_status gguf_w_set_u64(gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, GGUF_TYPE_UINT64, &v); }
vki_status gguf_w_set_i64(gguf_writer *w, const char *key, int64_t v) { return set_scalar(w, key, GGUF_TYPE_INT64, &v); }
vki_status gguf_w_set_f32(gguf_writer *w, const char *key, float v) { return set_scalar(w, key, GGUF_TYPE_FLOAT32, &v); }
vki_status gguf_w_set_f64(gguf_writer *w, const char *key, double v) { return set_scalar(w, key, GGUF_TYPE_FLOAT64, &v); }

vki_status gguf_w_set_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

vki_status gguf_w_set_strn(gguf_writer *w, const char *key, const char *v, uint64_t len)
{
    if (len > UINT64_MAX - 8)
        return w_fail(w, VKI_ERR_INVALID_ARG, "key '%s': string too long", key);
    vki_status st = kv_begin(w, key, GGUF_TYPE_STRING, 8 + len);
    if (st == VKI_OK)
        kv_str(w, v, len);
    return st;
}

vki_status gguf_w_set_str(gguf_writer *w, const char *key, const char *v)
{
    return gguf_w_set_strn(w, key, v, strlen(v));
}

vki_status gguf_w_set_arr(gguf_writer *w, const char *key, gguf_type elem, const void *data, uint64_t n)
{
    uint64_t esz = gguf_type_size(elem);
    if (!esz)
        return w_fail(w, VKI_ERR_INVALID_ARG, "key '%s': array element type %d is not fixed-size", key, (int)elem);
    if (n > (UINT64_MAX - 12) / esz)
        return w_fail(w, VKI_ERR_INVALID_ARG, "key '%s': array too long", key);
    vki_status st = kv_begin(w, key, GGUF_TYPE_ARRAY, 12 + n * esz);
    if (st == VKI_OK) {
        kv_u32(w, elem);
        kv_u64(w, n);
        kv_le(w, data, esz, n);
    }
    return st;
}

vki_status gguf_w_set_arr_str(gguf_writer *w, const char *key, const gguf_str *v, uint64_t n)
{
    uint64_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (v[i].len > UINT64_MAX / 2 - 8 - total)
            return w_fail(w, VKI_ERR_INVALID_ARG, "key '%s': strings too long", key);
        total += 8 + v[i].len;
    }
    vki_status st = kv_begin(w, key, GGUF_TYPE_ARRAY, total);
    if (st == VKI_OK) {
        kv_u32(w, GGUF_TYPE_STRING);
        kv_u64(w, n);
        for (uint64_t i = 0; i < n; i++)
            kv_str(w, v[i].ptr, v[i].len);
    }
    return st;
}

vki_status gguf_w_copy_kv(gguf_writer *w, const gguf_kv *kv)
{
    char key[1024];
    if (kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, (size_t)kv->key.len))
        return w_fail(w, VKI_ERR_INVALID_ARG, "cannot copy a key longer than %zu bytes or with a NUL", sizeof key - 1);
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = 0;
    if (!strcmp(key, "general.alignment")) /* keeps the writer's alignment in step */
        return kv->type == GGUF_TYPE_UINT32 ? set_scalar(w, key, GGUF_TYPE_UINT32, kv->value)
                                            : w_fail(w, VKI_ERR_INVALID_ARG, "general.alignment must be u32");
    uint64_t head = kv->type == GGUF_TYPE_ARRAY ? 12 : 0; /* element type + count precede value */
    vki_status st = kv_begin(w, key, kv->type, head + kv->value_bytes);
    if (st == VKI_OK) {
        if (head) {
            kv_u32(w, kv->arr_type);
            kv_u64(w, kv->arr_n);
        }
        kv_put(w, kv->value, (size_t)kv->value_bytes);
    }
    return st;
}

/* ---- tensors --------------------------------------------------------------------------------- */

vki_status gguf_w_add_tensor(gguf_writer *w, const char *name, uint32_t ggml_type, uint32_t n_dims,
                             const uint64_t *ne)
{
    if (w->state != GGUF_W_BUILD)
        return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%s': the tensor table is closed once writing began", name);
    size_t len = strlen(name);
    if (len == 0 || len > GGUF_W_MAX_NAME)
        return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%.64s': name length %zu (allowed 1..%d)", name, len, GGUF_W_MAX_NAME);
    const quant_traits *q = quant_info(ggml_type); /* any known layout: the caller brings the bytes */
    if (!q)
        return w_fail(w, VKI_ERR_UNSUPPORTED, "tensor '%s': type id %u has no known block size", name, ggml_type);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%s': %u dims (allowed 1..%d)", name, n_dims, GGUF_MAX_DIMS);
    gguf_w_tensor t = {.type = ggml_type, .n_dims = n_dims, .ne = {1, 1, 1, 1}};
    memcpy(t.name, name, len + 1);
    uint64_t rows = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1 || ne[d] > (uint64_t)INT64_MAX)
            return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%s': ne[%u] = %llu", name, d, (unsigned long long)ne[d]);
        t.ne[d] = ne[d];
        if (d > 0) {
            if (ne[d] > UINT64_MAX / rows)
                return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%s': size overflows", name);
            rows *= ne[d];
        }
    }
    size_t row = quant_row_bytes(ggml_type, ne[0]);
    if (!row)
        return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%s': ne[0] = %llu is not a multiple of the %s block (%u)", name,
                      (unsigned long long)ne[0], q->name, q->block_elems);
    if (rows > (UINT64_MAX / 2) / row)
        return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%s': size overflows", name);
    t.nbytes = rows * row;
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%s' declared twice", name);
    if (w->n_t == w->t_cap) {
        size_t cap = w->t_cap * 2 + 16;
        gguf_w_tensor *p = realloc(w->t, cap * sizeof *p);
        if (!p)
            return w_fail(w, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
        w->t = p;
        w->t_cap = cap;
    }
    w->t[w->n_t++] = t;
    return VKI_OK;
}

uint64_t gguf_w_tensor_bytes(const gguf_writer *w, uint64_t i)
{
    return i < w->n_t ? w->t[i].nbytes : 0;
}

/* ---- output ---------------------------------------------------------------------------------- */

static vki_status w_write(gguf_writer *w, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, w->fp) != n) {
        w->state = GGUF_W_FAILED;
        return w_fail(w, VKI_ERR_IO, "write failed: %s", strerror(errno));
    }
    return VKI_OK;
}

static vki_status w_pad(gguf_writer *w, uint64_t pos)
{
    static const uint8_t zeros[64];
    uint64_t pad = (w->alignment - pos % w->alignment) % w->alignment;
    vki_status st = VKI_OK;
    while (pad && st == VKI_OK) {
        size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        st = w_write(w, zeros, k);
        pad -= k;
    }
    return st;
}

/* Header, metadata, tensor table in one buffer. */
static vki_status w_header(gguf_writer *w, uint8_t **out, size_t *out_len)
{
    size_t cap = 24 + w->kv_len + (size_t)w->n_t * (8 + GGUF_W_MAX_NAME + 4 + 8 * GGUF_MAX_DIMS + 4 + 8);
    uint8_t *b = malloc(cap), *p = b;
    if (!b)
        return w_fail(w, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
#define PUT_LE(v, n) do { for (int i_ = 0; i_ < (n); i_++) *p++ = (uint8_t)((uint64_t)(v) >> (8 * i_)); } while (0)
    memcpy(p, "GGUF", 4), p += 4;
    PUT_LE(3, 4);
    PUT_LE(w->n_t, 8);
    PUT_LE(w->n_kv, 8);
    memcpy(p, w->kv, w->kv_len), p += w->kv_len;
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        gguf_w_tensor *t = &w->t[i];
        size_t len = strlen(t->name);
        PUT_LE(len, 8);
        memcpy(p, t->name, len), p += len;
        PUT_LE(t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            PUT_LE(t->ne[d], 8);
        PUT_LE(t->type, 4);
        t->offset = off;
        PUT_LE(off, 8);
        uint64_t padded = t->nbytes + (w->alignment - t->nbytes % w->alignment) % w->alignment;
        if (padded < t->nbytes || off > UINT64_MAX / 2 - padded) {
            free(b);
            return w_fail(w, VKI_ERR_INVALID_ARG, "tensor data too large");
        }
        off += padded;
    }
#undef PUT_LE
    *out = b;
    *out_len = (size_t)(p - b);
    return VKI_OK;
}

vki_status gguf_w_begin(gguf_writer *w, FILE *fp)
{
    if (w->state != GGUF_W_BUILD)
        return w_fail(w, VKI_ERR_INVALID_ARG, "gguf_w_begin called twice");
    uint8_t *h = NULL;
    size_t n = 0;
    vki_status st = w_header(w, &h, &n);
    if (st != VKI_OK)
        return st;
    w->fp = fp;
    w->state = GGUF_W_DATA;
    st = w_write(w, h, n);
    if (st == VKI_OK)
        st = w_pad(w, n);
    free(h);
    w->cur = 0;
    w->cur_done = 0;
    return st;
}

vki_status gguf_w_open(gguf_writer *w, const char *path)
{
    if (w->state != GGUF_W_BUILD)
        return w_fail(w, VKI_ERR_INVALID_ARG, "gguf_w_open called after begin");
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return w_fail(w, VKI_ERR_IO, "%s: %s", path, strerror(errno));
    vki_status st = gguf_w_begin(w, fp);
    if (st != VKI_OK && w->state == GGUF_W_BUILD) { /* nothing written: a clean failure */
        fclose(fp);
        return st;
    }
    w->own_fp = true;
    return st;
}

vki_status gguf_w_data(gguf_writer *w, const void *bytes, size_t n)
{
    if (w->state != GGUF_W_DATA)
        return w_fail(w, VKI_ERR_INVALID_ARG, "gguf_w_data outside begin..finish");
    uint64_t left = 0;
    for (uint64_t i = w->cur; i < w->n_t; i++)
        left += w->t[i].nbytes - (i == w->cur ? w->cur_done : 0);
    if (n > left)
        return w_fail(w, VKI_ERR_INVALID_ARG, "%zu bytes of tensor data given, only %llu expected", n,
                      (unsigned long long)left);
    const uint8_t *p = bytes;
    while (n) {
        gguf_w_tensor *t = &w->t[w->cur];
        uint64_t room = t->nbytes - w->cur_done;
        size_t k = n < room ? n : (size_t)room;
        vki_status st = w_write(w, p, k);
        if (st != VKI_OK)
            return st;
        p += k, n -= k, w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            if ((st = w_pad(w, t->nbytes)) != VKI_OK)
                return st;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return VKI_OK;
}

vki_status gguf_w_finish(gguf_writer *w)
{
    if (w->state != GGUF_W_DATA)
        return w_fail(w, VKI_ERR_INVALID_ARG, "gguf_w_finish without a successful begin");
    if (w->cur < w->n_t)
        return w_fail(w, VKI_ERR_INVALID_ARG, "tensor '%s' has %llu of %llu bytes", w->t[w->cur].name,
                      (unsigned long long)w->cur_done, (unsigned long long)w->t[w->cur].nbytes);
    vki_status st = VKI_OK;
    if (fflush(w->fp) != 0)
        st = w_fail(w, VKI_ERR_IO, "flush failed: %s", strerror(errno));
    if (w->own_fp) {
        if (fclose(w->fp) != 0 && st == VKI_OK)
            st = w_fail(w, VKI_ERR_IO, "close failed: %s", strerror(errno));
        w->fp = NULL;
        w->own_fp = false;
    }
    w->state = st == VKI_OK ? GGUF_W_DONE : GGUF_W_FAILED;
    return st;
}
