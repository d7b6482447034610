/* Copies a GGUF with edits, to build malformed models from valid synthetic ones: drop, rename or
 * reshape a tensor (its data becomes zeros of the new size), fill an F32 tensor, set a u32 / f32 / string key
 * (replacing it or adding it), drop a key. No Vulkan. */
#ifndef VKI_TESTS_GGUF_EDIT_H
#define VKI_TESTS_GGUF_EDIT_H

#include "engine/gguf.h"

typedef enum gguf_edit_kind {
    GGUF_EDIT_DROP_TENSOR,  /* name */
    GGUF_EDIT_SHAPE,        /* name, ne0, ne1 (ne1 0: a vector) */
    GGUF_EDIT_U32,          /* name = key, u */
    GGUF_EDIT_F32,          /* name = key, f */
    GGUF_EDIT_STR,          /* name = key, s */
    GGUF_EDIT_DROP_KEY,     /* name = key */
    GGUF_EDIT_FILL,         /* name: an F32 tensor, every element set to f (NaN: a broken model) */
    GGUF_EDIT_RENAME,       /* name: a tensor, written as s (same shape and data) */
} gguf_edit_kind;

typedef struct gguf_edit {
    gguf_edit_kind kind;
    const char *name;
    uint64_t ne0, ne1;
    uint32_t u;
    float f;
    const char *s;
} gguf_edit;

/* Writes src with edits[0..n) applied to dst. VKI_OK or the reader's / writer's error. */
vki_status gguf_edit_copy(const char *src, const char *dst, const gguf_edit *edits, uint32_t n);

/* Writes src as llama.cpp's gguf-split does: n_files files <prefix>-00001-of-0000N.gguf, ...,
 * the tensors in order, about as many per file; the first with all the metadata, every one with
 * split.no (u16), split.count (u16) and split.tensors.count (i32: the count, or declared_total
 * when >= 0, to make a broken split). */
vki_status gguf_edit_split(const char *src, const char *prefix, uint32_t n_files, int32_t declared_total);

#endif
