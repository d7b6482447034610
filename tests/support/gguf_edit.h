/* Copies a GGUF with edits, to build malformed models from valid synthetic ones: drop or
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

#endif
