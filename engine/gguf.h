/* GGUF (v2, v3) reader: memory-mapped, every offset/size/count/length bounds-checked against the
 * file. No Vulkan. Strings point into the mapping and are NOT NUL-terminated; they stay valid
 * until gguf_close().
 *
 * Errors: gguf_open*() return VKI_ERR_IO (cannot open/map) or VKI_ERR_FORMAT (malformed) /
 * VKI_ERR_UNSUPPORTED (unknown version, or a tensor type id with no known block size) and write a
 * message into err naming the problem, e.g. "tensor 'blk.0.attn_q.weight': data [1024, 5120)
 * past end of file (4000 bytes)". Every ggml type with a known block size is read, also those
 * vkinfer cannot run (engine/quant.h: quant_info vs quant_get); the model loader refuses those. */
#ifndef VKI_ENGINE_GGUF_H
#define VKI_ENGINE_GGUF_H

#include "vkinfer.h"

/* Metadata value types, as numbered in the GGUF specification. */
typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

typedef struct gguf_str {
    const char *ptr; /* into the mapping, not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    gguf_type type;
    gguf_type arr_type;    /* element type when type == GGUF_TYPE_ARRAY */
    uint64_t arr_n;        /* element count when type == GGUF_TYPE_ARRAY */
    const uint8_t *value;  /* first byte of the value (of the first element for arrays) */
    uint64_t value_bytes;  /* total bytes of the value, all elements included */
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ggml order: ne[0] is the contiguous (row) dimension; unused = 1 */
    uint32_t type;              /* ggml type id with a known layout (quant_info(type) != NULL;
                                   VKI_GGML_* in shaders/vki_shared.h are those vkinfer runs) */
    uint64_t offset;            /* relative to the data section */
    uint64_t nbytes;            /* checked: rows * row_bytes, no overflow, inside the file */
    const uint8_t *data;        /* into the mapping */
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* A model split by llama.cpp's gguf-split (<prefix>-00001-of-0000N.gguf, ...): opening the first
 * file opens the others too, found by that naming, and gguf_n_tensors / gguf_tensor_at /
 * gguf_find_tensor see all their tensors (the metadata is the first file's). Errors then also
 * name a missing or inconsistent part (VKI_ERR_IO / VKI_ERR_FORMAT), or a first file whose name
 * does not follow the naming (VKI_ERR_INVALID_ARG). Any other part opens alone. */
vki_status gguf_open(const char *path, gguf_file **out, char *err, size_t err_len);
/* Parses a caller-owned buffer (not copied; must outlive the gguf_file). For tests/fuzzing. */
vki_status gguf_open_memory(const void *data, size_t size, gguf_file **out, char *err, size_t err_len);
void gguf_close(gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint64_t gguf_alignment(const gguf_file *f);

/* Metadata */
uint64_t gguf_n_kv(const gguf_file *f);
const gguf_kv *gguf_kv_at(const gguf_file *f, uint64_t i);
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key); /* NULL if absent */

/* Typed accessors. Return VKI_ERR_NOT_FOUND if the key is absent (out untouched),
 * VKI_ERR_FORMAT if it has an incompatible type. Integer getters accept any integer type whose
 * value fits; gguf_get_f32 accepts FLOAT32/FLOAT64 and integers. */
vki_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
vki_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
vki_status gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
vki_status gguf_get_f32(const gguf_file *f, const char *key, float *out);
vki_status gguf_get_bool(const gguf_file *f, const char *key, bool *out);
vki_status gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* Array element access. Strings in arrays are variable-length; the reader indexes them once at
 * open so gguf_arr_str is O(1). */
vki_status gguf_get_arr(const gguf_file *f, const char *key, gguf_type *elem_type, uint64_t *n);
vki_status gguf_arr_str(const gguf_file *f, const char *key, uint64_t i, gguf_str *out);
vki_status gguf_arr_f32(const gguf_file *f, const char *key, uint64_t i, float *out);
vki_status gguf_arr_i64(const gguf_file *f, const char *key, uint64_t i, int64_t *out);

/* Tensors */
uint64_t gguf_n_tensors(const gguf_file *f);
const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i);
/* Elements of every tensor (the model's parameter count, as llama.cpp counts it). */
uint64_t gguf_n_params(const gguf_file *f);
/* llama.cpp's name of a general.file_type ("q4_k_m", "mxfp4_moe", ...), NULL for one it has no
 * name for here. */
const char *gguf_file_type_name(uint32_t ftype);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); /* NULL if absent */

/* The model's identity for its KV cache (session files refuse another model's KV): a 64-bit hash
 * of the metadata (but the descriptions under general.* other than general.architecture, and the
 * chat template), every tensor's name, type and shape, and 3 x 64 bytes of each tensor's data
 * (start, middle, end), so that two fine-tunes of one architecture differ. Reads the metadata
 * and ~200 bytes per tensor: a few ms, not a pass over the weights. */
uint64_t gguf_fingerprint(const gguf_file *f);

/* Which part of a split model (llama.cpp's gguf-split) f is: split.no (0-based) and split.count,
 * 0 and 1 for a whole model. VKI_ERR_FORMAT when a key is there but not an unsigned integer. */
vki_status gguf_split_part(const gguf_file *f, uint32_t *no, uint32_t *count);

/* Compare a gguf_str with a C string. */
bool gguf_str_eq(gguf_str s, const char *c);

/* Absolute file offset of the (aligned) data section; tensor offsets are relative to it. */
uint64_t gguf_data_offset(const gguf_file *f);
/* Bytes in the file (or the memory buffer). */
uint64_t gguf_file_size(const gguf_file *f);
/* "u8", "i32", "str", "arr", ... ("invalid" for an out-of-range value). */
const char *gguf_type_name(gguf_type t);
/* Bytes of one value of a fixed-size type; 0 for string/array/invalid. Shared by the reader and
 * the writer so that both agree on the layout. */
uint64_t gguf_type_size(gguf_type t);

#endif
