/* Scalar reference for the ggml weight formats: type traits, f16 conversion, and row
 * quantise/dequantise for F32, F16, Q8_0, Q4_0, Q4_K, Q6_K (block layouts in
 * shaders/vki_shared.h, bit-exact with ggml/GGUF). Used by the model writer, the CPU reference
 * forward pass and every kernel test ("the reference dequantises the same blocks"). No Vulkan. */
#ifndef VKI_ENGINE_QUANT_H
#define VKI_ENGINE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shaders/vki_shared.h"

typedef struct quant_traits {
    const char *name;      /* "f32", "f16", "q8_0", "q4_0", "q4_k", "q6_k" */
    uint32_t block_elems;  /* 1 for f32/f16, 32, 256 */
    uint32_t block_bytes;
} quant_traits;

/* NULL for types vkinfer does not run (the caller reports the type id). */
const quant_traits *quant_get(uint32_t ggml_type);
/* Bytes of a row of n elements; 0 if the type is unknown or n is not a multiple of the block. */
size_t quant_row_bytes(uint32_t ggml_type, uint64_t n);

uint16_t quant_f32_to_f16(float f); /* round to nearest even, inf/nan preserved */
float quant_f16_to_f32(uint16_t h);

/* n must be a multiple of the type's block_elems. dst holds quant_row_bytes(type, n) bytes. */
void quant_row(uint32_t ggml_type, const float *x, void *dst, uint64_t n);
void dequant_row(uint32_t ggml_type, const void *src, float *y, uint64_t n);
/* Like quant_row but without the per-sub-block scale search of the K-quants: ~5x faster, a
 * somewhat larger error. For the synthetic model writer (random weights, billions of them). */
void quant_row_fast(uint32_t ggml_type, const float *x, void *dst, uint64_t n);

#endif
