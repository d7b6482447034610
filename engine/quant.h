/* Scalar reference for the ggml weight formats: type traits, f16/bf16 conversion, and row
 * quantise/dequantise for every type vkinfer runs (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4; block layouts in shaders/vki_shared.h,
 * bit-exact with ggml/GGUF). Used by the model writer, the CPU reference forward pass and every
 * kernel test ("the reference dequantises the same blocks"). The other ggml types are known by
 * name and block size only, so files holding them can be read and inspected. No Vulkan. */
#ifndef VKI_ENGINE_QUANT_H
#define VKI_ENGINE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shaders/vki_shared.h"

typedef struct quant_traits {
    const char *name;      /* ggml's name: "f32", "q4_k", "iq4_xs", "bf16", "iq2_xxs", ... */
    uint32_t block_elems;  /* 1 for f32/f16/bf16 and the integer types, 32, 256 */
    uint32_t block_bytes;
    bool runs;             /* vkinfer dequantises it (CPU reference and every weight kernel) */
} quant_traits;

/* Every ggml type with a known block layout, run or not; NULL for an unknown id (ids ggml
 * removed, or newer than this table). */
const quant_traits *quant_info(uint32_t ggml_type);
/* Only the types vkinfer runs; NULL otherwise (the caller reports quant_type_name()). */
const quant_traits *quant_get(uint32_t ggml_type);
/* ggml's name of the type, or "unknown". */
const char *quant_type_name(uint32_t ggml_type);
/* "f32, f16, bf16, q8_0, ...": the types vkinfer runs, for error messages. */
const char *quant_supported_list(void);
/* Bytes of a row of n elements of any known type; 0 if the type is unknown or n is not a
 * multiple of its block. */
size_t quant_row_bytes(uint32_t ggml_type, uint64_t n);

/* The device row layout (vki_shared.h, "scale-grouped" for Q8_0, Q4_0, IQ4_NL, Q5_0, Q3_K, Q6_K
 * and MXFP4; the GGUF blocks for every other type). quant_dev_row_bytes: bytes of a device row of n elements
 * (0 as quant_row_bytes); quant_row_to_dev writes one, from one GGUF row (src: quant_row_bytes,
 * dst: quant_dev_row_bytes bytes; quant_get() types only). quant_dev_grouped: whether the type's
 * device rows differ from its GGUF rows. */
bool quant_dev_grouped(uint32_t ggml_type);
size_t quant_dev_row_bytes(uint32_t ggml_type, uint64_t n);
void quant_row_to_dev(uint32_t ggml_type, const void *src, void *dst, uint64_t n);

uint16_t quant_f32_to_f16(float f); /* round to nearest even, inf/nan preserved */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f); /* round to nearest even; nan stays nan (quieted), as ggml */
float quant_bf16_to_f32(uint16_t h);

/* Only for types quant_get() knows (others: nothing is written). n must be a multiple of the
 * type's block_elems; dst holds quant_row_bytes(type, n) bytes. */
void quant_row(uint32_t ggml_type, const float *x, void *dst, uint64_t n);
void dequant_row(uint32_t ggml_type, const void *src, float *y, uint64_t n);
/* Like quant_row but without the per-sub-block scale search of the K- and IQ4 quants: ~5-10x
 * faster, a somewhat larger error. For the synthetic model writer (random weights, billions of
 * them). */
void quant_row_fast(uint32_t ggml_type, const float *x, void *dst, uint64_t n);

#endif
