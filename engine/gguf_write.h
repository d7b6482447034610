/* GGUF v3 writer (little-endian). Metadata and tensor descriptions are collected first; then
 * gguf_w_begin() writes the header, metadata and tensor table, and the tensor data is streamed in
 * declaration order with gguf_w_data() (any chunking), so a multi-GB model never has to sit in
 * memory. Alignment is 32 unless "general.alignment" (u32, a power of two) is set.
 *
 * Every fallible call returns a vki_status; the writer keeps a message for the last failure
 * (gguf_w_error). A failed call leaves the writer as it was, except that an I/O error during
 * begin/data/finish is final (the file is incomplete; the caller deletes it). No Vulkan. */
#ifndef VKI_ENGINE_GGUF_WRITE_H
#define VKI_ENGINE_GGUF_WRITE_H

#include <stdio.h>

#include "engine/gguf.h"

typedef struct gguf_writer gguf_writer;

vki_status gguf_w_create(gguf_writer **out);
/* Closes a file opened by gguf_w_open if still open (the partial file stays on disk). */
void gguf_w_destroy(gguf_writer *w);
/* Message for the last failure ("" if none). */
const char *gguf_w_error(const gguf_writer *w);

/* Metadata, before gguf_w_begin. Keys are unique (VKI_ERR_INVALID_ARG on a duplicate);
 * entries are written in the order they were set. */
vki_status gguf_w_set_u8(gguf_writer *w, const char *key, uint8_t v);
vki_status gguf_w_set_i8(gguf_writer *w, const char *key, int8_t v);
vki_status gguf_w_set_u16(gguf_writer *w, const char *key, uint16_t v);
vki_status gguf_w_set_i16(gguf_writer *w, const char *key, int16_t v);
vki_status gguf_w_set_u32(gguf_writer *w, const char *key, uint32_t v);
vki_status gguf_w_set_i32(gguf_writer *w, const char *key, int32_t v);
vki_status gguf_w_set_u64(gguf_writer *w, const char *key, uint64_t v);
vki_status gguf_w_set_i64(gguf_writer *w, const char *key, int64_t v);
vki_status gguf_w_set_f32(gguf_writer *w, const char *key, float v);
vki_status gguf_w_set_f64(gguf_writer *w, const char *key, double v);
vki_status gguf_w_set_bool(gguf_writer *w, const char *key, bool v);
vki_status gguf_w_set_str(gguf_writer *w, const char *key, const char *v);
vki_status gguf_w_set_strn(gguf_writer *w, const char *key, const char *v, uint64_t len);
/* Array of a fixed-size type: n elements in C layout (bool as one byte each). */
vki_status gguf_w_set_arr(gguf_writer *w, const char *key, gguf_type elem, const void *data, uint64_t n);
vki_status gguf_w_set_arr_str(gguf_writer *w, const char *key, const gguf_str *v, uint64_t n);
/* Copies an entry read by gguf.h verbatim (its value bytes are already in GGUF encoding). */
vki_status gguf_w_copy_kv(gguf_writer *w, const gguf_kv *kv);

/* Declares a tensor (before gguf_w_begin): ne in ggml order, 1..4 dims, ne[0] a multiple of the
 * type's block. Data offsets are assigned in declaration order, each aligned. */
vki_status gguf_w_add_tensor(gguf_writer *w, const char *name, uint32_t ggml_type, uint32_t n_dims,
                             const uint64_t *ne);
/* Bytes of the i-th declared tensor's data. */
uint64_t gguf_w_tensor_bytes(const gguf_writer *w, uint64_t i);

/* Writes everything before the tensor data to fp (caller-owned, positioned at 0) or to a new
 * file at path (created/truncated; closed by gguf_w_finish or gguf_w_destroy). */
vki_status gguf_w_begin(gguf_writer *w, FILE *fp);
vki_status gguf_w_open(gguf_writer *w, const char *path);
/* Appends tensor data in declaration order; chunks may span tensors. Writing more bytes than
 * declared is VKI_ERR_INVALID_ARG (nothing written). */
vki_status gguf_w_data(gguf_writer *w, const void *bytes, size_t n);
/* Checks every tensor got all its bytes, flushes, and closes a file opened by gguf_w_open. */
vki_status gguf_w_finish(gguf_writer *w);

#endif
