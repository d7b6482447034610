/* GGUF v2/v3 reader. The whole file is parsed once at open: every length, count and extent is
 * checked against the bytes that remain before anything is allocated for it, so a hostile file
 * can neither over-read nor make us allocate more than O(file size). Cost at open: O(file
 * metadata) time, plus 8 bytes per string-array element (the O(1) gguf_arr_str index) and two
 * small hash tables (O(1) key/tensor lookup, duplicate detection). Tensor data is not touched. */
#include "engine/gguf.h"
#include "engine/hash.h"
#include "engine/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_KEY 65535     /* the specification's limit */
#define GGUF_MAX_TENSOR_NAME 64 /* the specification's limit (ggml: GGML_MAX_NAME) */
/* Smallest encodings, used to bound counts by the bytes that remain before allocating. */
#define GGUF_MIN_KV_BYTES 13     /* key length (8) + 1-byte key + type (4); values >= 0 more */
#define GGUF_MIN_TENSOR_BYTES 33 /* name length (8) + 1 byte + n_dims (4) + ne (8) + type (4) + offset (8) */

struct gguf_file {
    const uint8_t *base;  /* the file's bytes: the mapping or the caller's buffer */
    uint64_t size;        /* bytes at base */
    void *map;            /* the mmap (NULL for gguf_open_memory) */
    size_t map_len;
    uint32_t version;
    uint64_t alignment;   /* general.alignment or 32 */
    uint64_t data_offset; /* absolute offset of the data section (aligned) */
    uint64_t n_kv;
    gguf_kv *kv;          /* [n_kv] */
    uint64_t **str_index; /* [n_kv]: for arrays of strings, [arr_n] absolute offsets of each
                             element's length field; NULL otherwise */
    uint64_t n_tensors;
    gguf_tensor *tensors; /* [n_tensors] */
    uint64_t *kv_hash;    /* [kv_hash_cap] open addressing: kv index + 1, 0 = empty */
    uint64_t kv_hash_cap; /* power of two >= 2 * n_kv */
    uint64_t *t_hash;     /* [t_hash_cap] likewise for tensors */
    uint64_t t_hash_cap;
    gguf_file **shards;   /* split files 2..split.count (gguf_open of the first): their tensors are
                             appended to this file's table and point into their mappings */
    uint32_t n_shards;
};

/* Parsing cursor over the file. */
typedef struct gguf_rd {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
    char *err;
    size_t err_len;
} gguf_rd;

static vki_status gguf_fail(char *err, size_t err_len, vki_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static vki_status gguf_fail(char *err, size_t err_len, vki_status st, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* A printable, bounded copy of a name from the file for error messages. */
static const char *gguf_printable(gguf_str s, char *buf, size_t n)
{
    size_t k = 0;
    for (uint64_t i = 0; i < s.len && k + 4 < n; i++) {
        char c = s.ptr[i];
        buf[k++] = (c >= 0x20 && c < 0x7f) ? c : '?';
    }
    if (s.len > k && k + 4 >= n)
        buf[k++] = '.', buf[k++] = '.', buf[k++] = '.';
    buf[k] = 0;
    return buf;
}

const char *gguf_type_name(gguf_type t)
{
    static const char *const names[GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
    };
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "invalid";
}

uint64_t gguf_type_size(gguf_type t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static uint64_t gguf_hash(const char *s, uint64_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t gguf_rd_u64le(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t gguf_rd_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Bytes left after the cursor. */
static uint64_t rd_left(const gguf_rd *r)
{
    return r->size - r->pos;
}

static vki_status rd_need(gguf_rd *r, uint64_t n, const char *what, const char *ctx)
{
    if (n > rd_left(r))
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                         "%s%s at offset %llu: needs %llu bytes, only %llu left in the file (%llu bytes)", ctx,
                         what, (unsigned long long)r->pos, (unsigned long long)n,
                         (unsigned long long)rd_left(r), (unsigned long long)r->size);
    return VKI_OK;
}

static vki_status rd_u32(gguf_rd *r, uint32_t *v, const char *what, const char *ctx)
{
    vki_status st = rd_need(r, 4, what, ctx);
    if (st == VKI_OK) {
        *v = gguf_rd_u32le(r->p + r->pos);
        r->pos += 4;
    }
    return st;
}

static vki_status rd_u64(gguf_rd *r, uint64_t *v, const char *what, const char *ctx)
{
    vki_status st = rd_need(r, 8, what, ctx);
    if (st == VKI_OK) {
        *v = gguf_rd_u64le(r->p + r->pos);
        r->pos += 8;
    }
    return st;
}

/* A length-prefixed string; the length is checked against the remaining bytes. */
static vki_status rd_str(gguf_rd *r, gguf_str *s, const char *what, const char *ctx)
{
    uint64_t at = r->pos, len;
    vki_status st = rd_u64(r, &len, what, ctx);
    if (st != VKI_OK)
        return st;
    if (len > rd_left(r))
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                         "%s%s at offset %llu: length %llu exceeds the %llu bytes left in the file", ctx, what,
                         (unsigned long long)at, (unsigned long long)len, (unsigned long long)rd_left(r));
    s->ptr = (const char *)r->p + r->pos;
    s->len = len;
    r->pos += len;
    return VKI_OK;
}

bool gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

/* ---- hash tables ----------------------------------------------------------------------------- */

static uint64_t hash_cap_for(uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    return cap;
}

/* Finds name in the table; names(i) gives the i-th entry's name. Returns index or UINT64_MAX;
 * *slot receives the empty slot where it would go. */
static uint64_t hash_find(const uint64_t *tab, uint64_t cap, const gguf_str *names, size_t stride,
                          const char *s, uint64_t n, uint64_t *slot)
{
    uint64_t h = gguf_hash(s, n) & (cap - 1);
    for (;;) {
        uint64_t e = tab[h];
        if (!e) {
            if (slot)
                *slot = h;
            return UINT64_MAX;
        }
        const gguf_str *nm = (const gguf_str *)((const uint8_t *)names + (e - 1) * stride);
        if (nm->len == n && memcmp(nm->ptr, s, n) == 0)
            return e - 1;
        h = (h + 1) & (cap - 1);
    }
}

/* ---- metadata -------------------------------------------------------------------------------- */

/* Keys whose type other readers rely on: a file that gives them another type is malformed. */
static const struct {
    const char *key;
    gguf_type type, arr_type;
} gguf_known_keys[] = {
    {"general.alignment", GGUF_TYPE_UINT32, GGUF_TYPE_COUNT},
    {"general.architecture", GGUF_TYPE_STRING, GGUF_TYPE_COUNT},
    {"tokenizer.ggml.model", GGUF_TYPE_STRING, GGUF_TYPE_COUNT},
    {"tokenizer.ggml.tokens", GGUF_TYPE_ARRAY, GGUF_TYPE_STRING},
    {"tokenizer.ggml.merges", GGUF_TYPE_ARRAY, GGUF_TYPE_STRING},
    {"tokenizer.ggml.scores", GGUF_TYPE_ARRAY, GGUF_TYPE_FLOAT32},
    {"tokenizer.ggml.token_type", GGUF_TYPE_ARRAY, GGUF_TYPE_INT32},
};

static vki_status check_known_key(gguf_rd *r, const gguf_kv *kv, uint64_t at, const char *ctx)
{
    for (size_t i = 0; i < sizeof gguf_known_keys / sizeof gguf_known_keys[0]; i++) {
        if (!gguf_str_eq(kv->key, gguf_known_keys[i].key))
            continue;
        gguf_type t = gguf_known_keys[i].type, at_ = gguf_known_keys[i].arr_type;
        if (kv->type != t || (t == GGUF_TYPE_ARRAY && kv->arr_type != at_))
            return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                             "%sat offset %llu: has type %s%s%s, expected %s%s%s", ctx, (unsigned long long)at,
                             gguf_type_name(kv->type), kv->type == GGUF_TYPE_ARRAY ? " of " : "",
                             kv->type == GGUF_TYPE_ARRAY ? gguf_type_name(kv->arr_type) : "", gguf_type_name(t),
                             t == GGUF_TYPE_ARRAY ? " of " : "", t == GGUF_TYPE_ARRAY ? gguf_type_name(at_) : "");
    }
    return VKI_OK;
}

/* An array's elements. Strings get their index; n was not trusted until checked here. */
static vki_status parse_array(gguf_rd *r, gguf_kv *kv, uint64_t **index, const char *ctx)
{
    uint32_t et;
    uint64_t n, at = r->pos;
    vki_status st = rd_u32(r, &et, "array element type", ctx);
    if (st == VKI_OK)
        st = rd_u64(r, &n, "array length", ctx);
    if (st != VKI_OK)
        return st;
    if (et >= GGUF_TYPE_COUNT || et == GGUF_TYPE_ARRAY)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "%sat offset %llu: %s array element type %u", ctx,
                         (unsigned long long)at, et == GGUF_TYPE_ARRAY ? "nested arrays are not allowed:" : "invalid",
                         et);
    kv->arr_type = (gguf_type)et;
    kv->arr_n = n;
    kv->value = r->p + r->pos;
    uint64_t esz = gguf_type_size(kv->arr_type), start = r->pos;
    if (esz) {
        if (n > rd_left(r) / esz)
            return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                             "%sat offset %llu: %llu elements of %s exceed the %llu bytes left", ctx,
                             (unsigned long long)at, (unsigned long long)n, gguf_type_name(kv->arr_type),
                             (unsigned long long)rd_left(r));
        r->pos += n * esz;
        kv->value_bytes = n * esz;
        return VKI_OK;
    }
    if (n > rd_left(r) / 8) /* every string takes >= 8 bytes: bounds the index allocation */
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                         "%sat offset %llu: %llu strings cannot fit in the %llu bytes left", ctx,
                         (unsigned long long)at, (unsigned long long)n, (unsigned long long)rd_left(r));
    uint64_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
    if (!idx)
        return gguf_fail(r->err, r->err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "%sout of memory for %llu strings", ctx,
                         (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        idx[i] = r->pos;
        if ((st = rd_str(r, &s, "array string", ctx)) != VKI_OK) {
            free(idx);
            return st;
        }
    }
    *index = idx;
    kv->value_bytes = r->pos - start;
    return VKI_OK;
}

static vki_status parse_kv(gguf_rd *r, gguf_file *f, uint64_t i)
{
    char ctx[160], nb[80];
    gguf_kv *kv = &f->kv[i];
    uint64_t at = r->pos;
    snprintf(ctx, sizeof ctx, "metadata entry %llu: ", (unsigned long long)i);
    vki_status st = rd_str(r, &kv->key, "key", ctx);
    if (st != VKI_OK)
        return st;
    if (kv->key.len == 0 || kv->key.len > GGUF_MAX_KEY)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "%skey at offset %llu has length %llu (allowed 1..%d)",
                         ctx, (unsigned long long)at, (unsigned long long)kv->key.len, GGUF_MAX_KEY);
    snprintf(ctx, sizeof ctx, "key '%s' ", gguf_printable(kv->key, nb, sizeof nb));
    uint64_t slot;
    uint64_t dup = hash_find(f->kv_hash, f->kv_hash_cap, &f->kv[0].key, sizeof(gguf_kv), kv->key.ptr,
                             kv->key.len, &slot);
    if (dup != UINT64_MAX)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "%sat offset %llu: duplicate key (first was entry %llu)",
                         ctx, (unsigned long long)at, (unsigned long long)dup);
    uint32_t t;
    if ((st = rd_u32(r, &t, "value type", ctx)) != VKI_OK)
        return st;
    if (t >= GGUF_TYPE_COUNT)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "%sat offset %llu: invalid value type %u", ctx,
                         (unsigned long long)(r->pos - 4), t);
    kv->type = (gguf_type)t;
    if (kv->type == GGUF_TYPE_ARRAY) {
        st = parse_array(r, kv, &f->str_index[i], ctx);
    } else if (kv->type == GGUF_TYPE_STRING) {
        gguf_str s;
        kv->value = r->p + r->pos;
        uint64_t start = r->pos;
        st = rd_str(r, &s, "string value", ctx);
        kv->value_bytes = r->pos - start;
    } else {
        kv->value = r->p + r->pos;
        kv->value_bytes = gguf_type_size(kv->type);
        if ((st = rd_need(r, kv->value_bytes, "value", ctx)) == VKI_OK)
            r->pos += kv->value_bytes;
    }
    if (st == VKI_OK)
        st = check_known_key(r, kv, at, ctx);
    if (st == VKI_OK)
        f->kv_hash[slot] = i + 1;
    return st;
}

static vki_status parse_alignment(gguf_rd *r, gguf_file *f)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    if (!kv)
        return VKI_OK;
    uint32_t a = gguf_rd_u32le(kv->value); /* type checked by check_known_key */
    if (a == 0 || (a & (a - 1)))
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                         "key 'general.alignment' at offset %llu: %u is not a nonzero power of two",
                         (unsigned long long)(kv->value - r->p), a);
    f->alignment = a;
    return VKI_OK;
}

/* ---- tensors --------------------------------------------------------------------------------- */

static vki_status parse_tensor_info(gguf_rd *r, gguf_file *f, uint64_t i)
{
    char ctx[160], nb[80];
    gguf_tensor *t = &f->tensors[i];
    uint64_t at = r->pos;
    snprintf(ctx, sizeof ctx, "tensor %llu: ", (unsigned long long)i);
    vki_status st = rd_str(r, &t->name, "name", ctx);
    if (st != VKI_OK)
        return st;
    if (t->name.len == 0 || t->name.len > GGUF_MAX_TENSOR_NAME)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "%sname at offset %llu has length %llu (allowed 1..%d)",
                         ctx, (unsigned long long)at, (unsigned long long)t->name.len, GGUF_MAX_TENSOR_NAME);
    snprintf(ctx, sizeof ctx, "tensor '%s' ", gguf_printable(t->name, nb, sizeof nb));
    uint64_t slot, dup = hash_find(f->t_hash, f->t_hash_cap, &f->tensors[0].name, sizeof(gguf_tensor), t->name.ptr,
                                   t->name.len, &slot);
    if (dup != UINT64_MAX)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "%sat offset %llu: duplicate name (first was tensor %llu)",
                         ctx, (unsigned long long)at, (unsigned long long)dup);
    if ((st = rd_u32(r, &t->n_dims, "n_dims", ctx)) != VKI_OK)
        return st;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "%sat offset %llu: n_dims %u (allowed 1..%d)", ctx,
                         (unsigned long long)(r->pos - 4), t->n_dims, GGUF_MAX_DIMS);
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims)
            continue;
        if ((st = rd_u64(r, &t->ne[d], "dimension", ctx)) != VKI_OK)
            return st;
        if (t->ne[d] < 1 || t->ne[d] > (uint64_t)INT64_MAX)
            return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "%sat offset %llu: ne[%u] = %llu is out of range", ctx,
                             (unsigned long long)(r->pos - 8), d, (unsigned long long)t->ne[d]);
    }
    if ((st = rd_u32(r, &t->type, "type", ctx)) != VKI_OK)
        return st;
    /* Any type with a known block size is read (its bytes can be placed and inspected); whether
     * vkinfer can run it is the model loader's question (model_meta.c). */
    if (!quant_info(t->type))
        return gguf_fail(r->err, r->err_len, VKI_ERR_UNSUPPORTED,
                         "%sat offset %llu: tensor type id %u is not a ggml type with a known block size (removed "
                         "from ggml or newer than this reader)", ctx, (unsigned long long)(r->pos - 4), t->type);
    if ((st = rd_u64(r, &t->offset, "data offset", ctx)) != VKI_OK)
        return st;
    f->t_hash[slot] = i + 1;
    return VKI_OK;
}

/* Size and placement of one tensor's data, now that the data section's start is known. */
static vki_status place_tensor(gguf_rd *r, gguf_file *f, gguf_tensor *t)
{
    char nb[80];
    const quant_traits *q = quant_info(t->type);
    const char *nm = gguf_printable(t->name, nb, sizeof nb);
    if (t->ne[0] % q->block_elems)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                         "tensor '%s': row length ne[0] = %llu is not a multiple of the %s block size %u", nm,
                         (unsigned long long)t->ne[0], q->name, q->block_elems);
    /* ne[0] < 2^63 elements, but its bytes need not fit: an F32 row of 2^62 elements is 2^64 bytes,
     * which would wrap to 0 (and 2^62 + 16 elements to 64 bytes). */
    uint64_t blocks = t->ne[0] / q->block_elems;
    if (blocks > UINT64_MAX / q->block_bytes)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "tensor '%s': row size overflows 64 bits", nm);
    uint64_t rows = 1, row_bytes = blocks * q->block_bytes; /* > 0: ne[0] >= 1 is a multiple of the block */
    for (int d = 1; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] > UINT64_MAX / rows)
            return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "tensor '%s': element count overflows 64 bits", nm);
        rows *= t->ne[d];
    }
    if (rows > (uint64_t)INT64_MAX / t->ne[0] || rows > UINT64_MAX / row_bytes)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "tensor '%s': element count overflows 64 bits", nm);
    t->nbytes = rows * row_bytes;
    if (t->offset % f->alignment)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                         "tensor '%s': data offset %llu is not a multiple of the alignment %llu", nm,
                         (unsigned long long)t->offset, (unsigned long long)f->alignment);
    uint64_t room = f->data_offset <= f->size ? f->size - f->data_offset : 0;
    if (t->offset > room || t->nbytes > room - t->offset)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                         "tensor '%s': data [%llu, +%llu) at file offset %llu is past the end of the file (%llu bytes)",
                         nm, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                         (unsigned long long)(f->data_offset + t->offset), (unsigned long long)f->size);
    t->data = f->base + f->data_offset + t->offset;
    return VKI_OK;
}

typedef struct gguf_span {
    uint64_t start, end, idx;
} gguf_span;

static int span_cmp(const void *a, const void *b)
{
    const gguf_span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Two tensors sharing bytes means a corrupt table. O(n log n). */
static vki_status check_overlaps(gguf_rd *r, gguf_file *f)
{
    if (f->n_tensors < 2)
        return VKI_OK;
    gguf_span *s = malloc((size_t)f->n_tensors * sizeof *s);
    if (!s)
        return gguf_fail(r->err, r->err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    for (uint64_t i = 0; i < f->n_tensors; i++)
        s[i] = (gguf_span){f->tensors[i].offset, f->tensors[i].offset + f->tensors[i].nbytes, i};
    qsort(s, (size_t)f->n_tensors, sizeof *s, span_cmp);
    vki_status st = VKI_OK;
    for (uint64_t i = 1; i < f->n_tensors && st == VKI_OK; i++) {
        if (s[i].start < s[i - 1].end) {
            char a[80], b[80];
            st = gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "tensor '%s': data at %llu overlaps tensor '%s'",
                           gguf_printable(f->tensors[s[i].idx].name, a, sizeof a), (unsigned long long)s[i].start,
                           gguf_printable(f->tensors[s[i - 1].idx].name, b, sizeof b));
        }
    }
    free(s);
    return st;
}

/* ---- open / close ---------------------------------------------------------------------------- */

static vki_status parse_header(gguf_rd *r, gguf_file *f)
{
    if (r->size < 4 || memcmp(r->p, "GGUF", 4) != 0)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT, "not a GGUF file: bad magic at offset 0");
    r->pos = 4;
    vki_status st = rd_u32(r, &f->version, "version", "header: ");
    if (st != VKI_OK)
        return st;
    if (f->version == 1)
        return gguf_fail(r->err, r->err_len, VKI_ERR_UNSUPPORTED, "GGUF version 1 is not supported (use v2 or v3)");
    if (f->version != 2 && f->version != 3) {
        bool be = (f->version & 0xffff) == 0 && (f->version >> 16) != 0;
        return gguf_fail(r->err, r->err_len, VKI_ERR_UNSUPPORTED, "GGUF version %u at offset 4 is not supported%s",
                         f->version, be ? " (a big-endian file?)" : "");
    }
    if ((st = rd_u64(r, &f->n_tensors, "tensor count", "header: ")) != VKI_OK ||
        (st = rd_u64(r, &f->n_kv, "metadata count", "header: ")) != VKI_OK)
        return st;
    uint64_t left = rd_left(r);
    if (f->n_kv > left / GGUF_MIN_KV_BYTES || f->n_tensors > left / GGUF_MIN_TENSOR_BYTES ||
        f->n_kv * GGUF_MIN_KV_BYTES > left - f->n_tensors * GGUF_MIN_TENSOR_BYTES)
        return gguf_fail(r->err, r->err_len, VKI_ERR_FORMAT,
                         "header: %llu metadata entries and %llu tensors cannot fit in the %llu bytes after offset 24",
                         (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors, (unsigned long long)left);
    return VKI_OK;
}

static vki_status alloc_tables(gguf_rd *r, gguf_file *f)
{
    f->kv_hash_cap = hash_cap_for(f->n_kv);
    f->t_hash_cap = hash_cap_for(f->n_tensors);
    f->kv = calloc((size_t)(f->n_kv ? f->n_kv : 1), sizeof *f->kv);
    f->str_index = calloc((size_t)(f->n_kv ? f->n_kv : 1), sizeof *f->str_index);
    f->tensors = calloc((size_t)(f->n_tensors ? f->n_tensors : 1), sizeof *f->tensors);
    f->kv_hash = calloc((size_t)f->kv_hash_cap, sizeof *f->kv_hash);
    f->t_hash = calloc((size_t)f->t_hash_cap, sizeof *f->t_hash);
    if (!f->kv || !f->str_index || !f->tensors || !f->kv_hash || !f->t_hash)
        return gguf_fail(r->err, r->err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory for the GGUF tables");
    return VKI_OK;
}

static vki_status gguf_parse(gguf_file *f, char *err, size_t err_len)
{
    gguf_rd r = {.p = f->base, .size = f->size, .err = err, .err_len = err_len};
    vki_status st = parse_header(&r, f);
    if (st == VKI_OK)
        st = alloc_tables(&r, f);
    for (uint64_t i = 0; i < f->n_kv && st == VKI_OK; i++)
        st = parse_kv(&r, f, i);
    if (st == VKI_OK)
        st = parse_alignment(&r, f);
    for (uint64_t i = 0; i < f->n_tensors && st == VKI_OK; i++)
        st = parse_tensor_info(&r, f, i);
    if (st != VKI_OK)
        return st;
    uint64_t pad = (f->alignment - r.pos % f->alignment) % f->alignment;
    f->data_offset = r.pos + pad; /* r.pos <= size < 2^63: no overflow */
    for (uint64_t i = 0; i < f->n_tensors && st == VKI_OK; i++)
        st = place_tensor(&r, f, &f->tensors[i]);
    if (st == VKI_OK)
        st = check_overlaps(&r, f);
    return st;
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    if (f->str_index)
        for (uint64_t i = 0; i < f->n_kv; i++)
            free(f->str_index[i]);
    free(f->str_index);
    free(f->kv);
    free(f->tensors);
    free(f->kv_hash);
    free(f->t_hash);
    for (uint32_t i = 0; i < f->n_shards; i++)
        gguf_close(f->shards[i]);
    free(f->shards);
    if (f->map)
        munmap(f->map, f->map_len);
    free(f);
}

static vki_status gguf_finish_open(gguf_file *f, gguf_file **out, char *err, size_t err_len)
{
    vki_status st = gguf_parse(f, err, err_len);
    if (st != VKI_OK) {
        gguf_close(f);
        return st;
    }
    *out = f;
    return VKI_OK;
}

vki_status gguf_open_memory(const void *data, size_t size, gguf_file **out, char *err, size_t err_len)
{
    if (!out || (!data && size))
        return gguf_fail(err, err_len, VKI_ERR_INVALID_ARG, "gguf_open_memory: NULL argument");
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f)
        return gguf_fail(err, err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    f->base = data;
    f->size = size;
    return gguf_finish_open(f, out, err, err_len);
}

static vki_status join_shards(gguf_file *f, const char *path, char *err, size_t err_len);

static vki_status open_file(const char *path, gguf_file **out, char *err, size_t err_len);

vki_status gguf_open(const char *path, gguf_file **out, char *err, size_t err_len)
{
    if (!out || !path)
        return gguf_fail(err, err_len, VKI_ERR_INVALID_ARG, "gguf_open: NULL argument");
    *out = NULL;
    gguf_file *f = NULL;
    vki_status st = open_file(path, &f, err, err_len);
    if (st == VKI_OK && (st = join_shards(f, path, err, err_len)) != VKI_OK)
        gguf_close(f);
    else if (st == VKI_OK)
        *out = f;
    return st;
}

/* One file, mapped and parsed. */
static vki_status open_file(const char *path, gguf_file **out, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return gguf_fail(err, err_len, VKI_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return gguf_fail(err, err_len, VKI_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return gguf_fail(err, err_len, VKI_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size == 0) {
        close(fd);
        return gguf_fail(err, err_len, VKI_ERR_FORMAT, "%s: empty file", path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return gguf_fail(err, err_len, VKI_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(map, (size_t)sb.st_size);
        return gguf_fail(err, err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    }
    f->map = map;
    f->map_len = (size_t)sb.st_size;
    f->base = map;
    f->size = (uint64_t)sb.st_size;
    return gguf_finish_open(f, out, err, err_len);
}

/* ---- accessors ------------------------------------------------------------------------------- */

uint32_t gguf_version(const gguf_file *f) { return f->version; }
uint64_t gguf_alignment(const gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const gguf_file *f) { return f->data_offset; }
uint64_t gguf_file_size(const gguf_file *f) { return f->size; }
uint64_t gguf_n_kv(const gguf_file *f) { return f->n_kv; }
uint64_t gguf_n_tensors(const gguf_file *f) { return f->n_tensors; }

const gguf_kv *gguf_kv_at(const gguf_file *f, uint64_t i)
{
    return i < f->n_kv ? &f->kv[i] : NULL;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i)
{
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key)
{
    uint64_t i = hash_find(f->kv_hash, f->kv_hash_cap, &f->kv[0].key, sizeof(gguf_kv), key, strlen(key), NULL);
    return i == UINT64_MAX ? NULL : &f->kv[i];
}

/* ---- split files (llama.cpp's gguf-split) ----------------------------------------------------- */

#define GGUF_MAX_SHARDS 1024

vki_status gguf_split_part(const gguf_file *f, uint32_t *no, uint32_t *count)
{
    *count = 1, *no = 0;
    vki_status a = gguf_get_u32(f, "split.count", count), b = gguf_get_u32(f, "split.no", no);
    return (a != VKI_OK && a != VKI_ERR_NOT_FOUND) || (b != VKI_OK && b != VKI_ERR_NOT_FOUND) ? VKI_ERR_FORMAT : VKI_OK;
}

/* gguf_split_part with a message. */
static vki_status split_keys(const gguf_file *f, uint32_t *count, uint32_t *no, char *err, size_t err_len)
{
    if (gguf_split_part(f, no, count) != VKI_OK)
        return gguf_fail(err, err_len, VKI_ERR_FORMAT, "split.count / split.no: not an unsigned integer");
    return VKI_OK;
}

/* A model in split.count files <prefix>-00001-of-0000N.gguf ... (llama.cpp's naming; the first
 * holds the metadata, every one its own tensors and the split.* keys): opened from the first,
 * the others are found by name, checked (their split.no and split.count, no tensor twice,
 * split.tensors.count) and their tensors joined to f's table. Another part opens alone (the
 * model loader refuses it, naming the first). */
static vki_status join_shards(gguf_file *f, const char *path, char *err, size_t err_len)
{
    uint32_t count, no;
    vki_status st = split_keys(f, &count, &no, err, err_len);
    if (st != VKI_OK || count <= 1 || no != 0)
        return st;
    char want[48];
    snprintf(want, sizeof want, "-%05u-of-%05u.gguf", 1u, count);
    size_t len = strlen(path), wl = strlen(want);
    if (count > GGUF_MAX_SHARDS)
        return gguf_fail(err, err_len, VKI_ERR_FORMAT, "split.count %u: at most %d files", count, GGUF_MAX_SHARDS);
    if (len < wl || strcmp(path + len - wl, want))
        return gguf_fail(err, err_len, VKI_ERR_INVALID_ARG, "%s: split.count is %u, but the name does not end in %s "
                         "(the other files are found by llama.cpp's gguf-split naming)", path, count, want);
    f->shards = calloc(count - 1, sizeof *f->shards);
    if (!f->shards)
        return gguf_fail(err, err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    char *sp = malloc(len + 1);
    if (!sp)
        return gguf_fail(err, err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    uint64_t total = f->n_tensors;
    for (uint32_t i = 1; i < count && st == VKI_OK; i++) {
        memcpy(sp, path, len - wl);
        snprintf(sp + len - wl, wl + 1, "-%05u-of-%05u.gguf", i + 1, count);
        gguf_file *s = NULL;
        if ((st = open_file(sp, &s, err, err_len)) != VKI_OK)
            break;
        f->shards[f->n_shards++] = s;
        uint32_t c2, n2;
        if ((st = split_keys(s, &c2, &n2, err, err_len)) != VKI_OK)
            break;
        if (c2 != count || n2 != i)
            st = gguf_fail(err, err_len, VKI_ERR_FORMAT, "%s: split.no %u of split.count %u, expected %u of %u", sp, n2,
                           c2, i, count);
        total += s->n_tensors;
    }
    free(sp);
    if (st != VKI_OK)
        return st;
    gguf_tensor *t = realloc(f->tensors, (size_t)(total ? total : 1) * sizeof *t);
    if (!t)
        return gguf_fail(err, err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    f->tensors = t;
    uint64_t n = f->n_tensors;
    for (uint32_t i = 0; i < f->n_shards; i++) {
        memcpy(t + n, f->shards[i]->tensors, (size_t)f->shards[i]->n_tensors * sizeof *t);
        n += f->shards[i]->n_tensors;
    }
    uint64_t cap = hash_cap_for(total), *tab = calloc((size_t)cap, sizeof *tab);
    if (!tab)
        return gguf_fail(err, err_len, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    free(f->t_hash);
    f->t_hash = tab, f->t_hash_cap = cap, f->n_tensors = 0;
    for (uint64_t i = 0; i < total; i++) { /* n_tensors grows with the table: hash_find sees only those */
        uint64_t slot;
        if (hash_find(tab, cap, &t[0].name, sizeof *t, t[i].name.ptr, t[i].name.len, &slot) != UINT64_MAX) {
            char nb[80];
            return gguf_fail(err, err_len, VKI_ERR_FORMAT, "tensor '%s' is in more than one of the %u files",
                             gguf_printable(t[i].name, nb, sizeof nb), count);
        }
        tab[slot] = i + 1;
        f->n_tensors = i + 1;
    }
    uint64_t declared;
    if (gguf_get_u64(f, "split.tensors.count", &declared) == VKI_OK && declared != total)
        return gguf_fail(err, err_len, VKI_ERR_FORMAT, "split.tensors.count is %llu, the %u files hold %llu tensors",
                         (unsigned long long)declared, count, (unsigned long long)total);
    return VKI_OK;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    uint64_t i = hash_find(f->t_hash, f->t_hash_cap, &f->tensors[0].name, sizeof(gguf_tensor), name, strlen(name), NULL);
    return i == UINT64_MAX ? NULL : &f->tensors[i];
}

/* An integer value of any width/signedness: *neg set for negative ones (then *s holds it),
 * otherwise *u holds it. false if t is not an integer type. */
static bool read_int(gguf_type t, const uint8_t *p, bool *neg, uint64_t *u, int64_t *s)
{
    int64_t sv = 0;
    *neg = false;
    switch (t) {
    case GGUF_TYPE_UINT8: *u = p[0]; return true;
    case GGUF_TYPE_UINT16: *u = (uint64_t)p[0] | (uint64_t)p[1] << 8; return true;
    case GGUF_TYPE_UINT32: *u = gguf_rd_u32le(p); return true;
    case GGUF_TYPE_UINT64: *u = gguf_rd_u64le(p); return true;
    case GGUF_TYPE_INT8: sv = (int8_t)p[0]; break;
    case GGUF_TYPE_INT16: sv = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
    case GGUF_TYPE_INT32: sv = (int32_t)gguf_rd_u32le(p); break;
    case GGUF_TYPE_INT64: sv = (int64_t)gguf_rd_u64le(p); break;
    default: return false;
    }
    if (sv < 0) {
        *neg = true;
        *s = sv;
    } else {
        *u = (uint64_t)sv;
    }
    return true;
}

/* A number as float: floats and integers. */
static bool read_num(gguf_type t, const uint8_t *p, float *out)
{
    bool neg;
    uint64_t u;
    int64_t s;
    if (t == GGUF_TYPE_FLOAT32) {
        uint32_t b = gguf_rd_u32le(p);
        memcpy(out, &b, 4);
    } else if (t == GGUF_TYPE_FLOAT64) {
        uint64_t b = gguf_rd_u64le(p);
        double d;
        memcpy(&d, &b, 8);
        *out = (float)d;
    } else if (read_int(t, p, &neg, &u, &s)) {
        *out = neg ? (float)s : (float)u;
    } else {
        return false;
    }
    return true;
}

static const gguf_kv *scalar_kv(const gguf_file *f, const char *key, vki_status *st)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    *st = !kv ? VKI_ERR_NOT_FOUND : VKI_OK;
    return kv;
}

vki_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out)
{
    vki_status st;
    const gguf_kv *kv = scalar_kv(f, key, &st);
    bool neg;
    uint64_t u;
    int64_t s;
    if (!kv)
        return st;
    if (!read_int(kv->type, kv->value, &neg, &u, &s) || neg)
        return VKI_ERR_FORMAT;
    *out = u;
    return VKI_OK;
}

vki_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t v;
    vki_status st = gguf_get_u64(f, key, &v);
    if (st == VKI_OK && v > UINT32_MAX)
        st = VKI_ERR_FORMAT;
    if (st == VKI_OK)
        *out = (uint32_t)v;
    return st;
}

vki_status gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    vki_status st;
    const gguf_kv *kv = scalar_kv(f, key, &st);
    bool neg;
    uint64_t u;
    int64_t s;
    if (!kv)
        return st;
    if (!read_int(kv->type, kv->value, &neg, &u, &s) || (!neg && u > (uint64_t)INT64_MAX))
        return VKI_ERR_FORMAT;
    *out = neg ? s : (int64_t)u;
    return VKI_OK;
}

vki_status gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    vki_status st;
    const gguf_kv *kv = scalar_kv(f, key, &st);
    if (!kv)
        return st;
    return read_num(kv->type, kv->value, out) ? VKI_OK : VKI_ERR_FORMAT;
}

vki_status gguf_get_bool(const gguf_file *f, const char *key, bool *out)
{
    vki_status st;
    const gguf_kv *kv = scalar_kv(f, key, &st);
    if (!kv)
        return st;
    if (kv->type != GGUF_TYPE_BOOL)
        return VKI_ERR_FORMAT;
    *out = kv->value[0] != 0;
    return VKI_OK;
}

vki_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out)
{
    vki_status st;
    const gguf_kv *kv = scalar_kv(f, key, &st);
    if (!kv)
        return st;
    if (kv->type != GGUF_TYPE_STRING)
        return VKI_ERR_FORMAT;
    out->len = gguf_rd_u64le(kv->value);
    out->ptr = (const char *)kv->value + 8;
    return VKI_OK;
}

vki_status gguf_get_arr(const gguf_file *f, const char *key, gguf_type *elem_type, uint64_t *n)
{
    vki_status st;
    const gguf_kv *kv = scalar_kv(f, key, &st);
    if (!kv)
        return st;
    if (kv->type != GGUF_TYPE_ARRAY)
        return VKI_ERR_FORMAT;
    if (elem_type)
        *elem_type = kv->arr_type;
    if (n)
        *n = kv->arr_n;
    return VKI_OK;
}

/* The array kv for key, with i checked against its length. */
static const gguf_kv *array_kv(const gguf_file *f, const char *key, uint64_t i, vki_status *st)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    *st = !kv ? VKI_ERR_NOT_FOUND : kv->type != GGUF_TYPE_ARRAY ? VKI_ERR_FORMAT
          : i >= kv->arr_n                                     ? VKI_ERR_INVALID_ARG
                                                               : VKI_OK;
    return *st == VKI_OK ? kv : NULL;
}

vki_status gguf_arr_str(const gguf_file *f, const char *key, uint64_t i, gguf_str *out)
{
    vki_status st;
    const gguf_kv *kv = array_kv(f, key, i, &st);
    if (!kv)
        return st;
    if (kv->arr_type != GGUF_TYPE_STRING)
        return VKI_ERR_FORMAT;
    const uint64_t *idx = f->str_index[kv - f->kv];
    out->len = gguf_rd_u64le(f->base + idx[i]);
    out->ptr = (const char *)f->base + idx[i] + 8;
    return VKI_OK;
}

vki_status gguf_arr_f32(const gguf_file *f, const char *key, uint64_t i, float *out)
{
    vki_status st;
    const gguf_kv *kv = array_kv(f, key, i, &st);
    if (!kv)
        return st;
    uint64_t esz = gguf_type_size(kv->arr_type);
    if (!esz || kv->arr_type == GGUF_TYPE_BOOL)
        return VKI_ERR_FORMAT;
    return read_num(kv->arr_type, kv->value + i * esz, out) ? VKI_OK : VKI_ERR_FORMAT;
}

vki_status gguf_arr_i64(const gguf_file *f, const char *key, uint64_t i, int64_t *out)
{
    vki_status st;
    const gguf_kv *kv = array_kv(f, key, i, &st);
    if (!kv)
        return st;
    bool neg;
    uint64_t u;
    int64_t s;
    uint64_t esz = gguf_type_size(kv->arr_type);
    if (!esz || !read_int(kv->arr_type, kv->value + i * esz, &neg, &u, &s) || (!neg && u > (uint64_t)INT64_MAX))
        return VKI_ERR_FORMAT;
    *out = neg ? s : (int64_t)u;
    return VKI_OK;
}

/* ---- fingerprint ------------------------------------------------------------------------------ */

/* Metadata that cannot change what the model computes for given token ids: descriptions under
 * general.* (name, author, license, ...) and the chat template. A copy of a model renamed or given
 * another template keeps its fingerprint (its session files stay valid). */
static bool fp_skip(gguf_str k)
{
    if (k.len >= 8 && !memcmp(k.ptr, "general.", 8))
        return !gguf_str_eq(k, "general.architecture");
    return k.len >= 23 && !memcmp(k.ptr, "tokenizer.chat_template", 23);
}

#define FP_SAMPLE 64 /* bytes hashed at the start, middle and end of each tensor */

uint64_t gguf_fingerprint(const gguf_file *f)
{
    vki_hash h;
    vki_hash_init(&h, 0x766b696e66657221ull);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (fp_skip(kv->key))
            continue;
        vki_hash_u64(&h, kv->key.len);
        vki_hash_update(&h, kv->key.ptr, kv->key.len);
        vki_hash_u64(&h, (uint64_t)kv->type << 32 | kv->arr_type);
        vki_hash_u64(&h, kv->arr_n);
        vki_hash_u64(&h, kv->value_bytes);
        vki_hash_update(&h, kv->value, kv->value_bytes);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        vki_hash_u64(&h, t->name.len);
        vki_hash_update(&h, t->name.ptr, t->name.len);
        vki_hash_u64(&h, (uint64_t)t->type << 32 | t->n_dims);
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
            vki_hash_u64(&h, t->ne[d]);
        if (t->nbytes <= 3 * FP_SAMPLE) {
            vki_hash_update(&h, t->data, t->nbytes);
            continue;
        }
        vki_hash_update(&h, t->data, FP_SAMPLE);
        vki_hash_update(&h, t->data + (t->nbytes - FP_SAMPLE) / 2, FP_SAMPLE);
        vki_hash_update(&h, t->data + t->nbytes - FP_SAMPLE, FP_SAMPLE);
    }
    return vki_hash_final(&h);
}

uint64_t gguf_n_params(const gguf_file *f)
{
    uint64_t total = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n *= t->ne[d];
        total += n;
    }
    return total;
}

const char *gguf_file_type_name(uint32_t ftype)
{
    static const char *const names[] = {[0] = "f32", [1] = "f16", [2] = "q4_0", [3] = "q4_1", [7] = "q8_0",
                                        [8] = "q5_0", [9] = "q5_1", [10] = "q2_k", [11] = "q3_k_s",
                                        [12] = "q3_k_m", [13] = "q3_k_l", [14] = "q4_k_s", [15] = "q4_k_m",
                                        [16] = "q5_k_s", [17] = "q5_k_m", [18] = "q6_k", [21] = "q2_k_s",
                                        [25] = "iq4_nl", [30] = "iq4_xs", [32] = "bf16", [38] = "mxfp4_moe"};
    return ftype < sizeof names / sizeof names[0] ? names[ftype] : NULL;
}
