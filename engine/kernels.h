/* The one kernel table and the one dispatch path.
 *
 * Each kernel: a SPIR-V module embedded at build time, its binding count (all storage buffers,
 * bindings 0..n-1, pushed with VK_KHR_push_descriptor), its push-constant struct size (the struct
 * lives in shaders/vki_shared.h) and its specialisation constants (ids 0..n_spec-1; by
 * convention id 0 is local_size_x). A pipeline exists per (kernel, specialisation values) and is
 * created on first use, through the device's on-disk VkPipelineCache; vkk_prepare() creates them
 * up front so the first tick does not pay for compilation. */
#ifndef VKI_ENGINE_KERNELS_H
#define VKI_ENGINE_KERNELS_H

#include "engine/device.h"
#include "shaders/vki_shared.h"

/* Every weight type the matmul family runs, X(TYPE, name): VKI_GGML_<TYPE>, the kernels
 * VKK_{MATVEC,MATMUL,GET_ROWS}_<TYPE> and their SPIR-V modules matvec_<name>, ... (the same
 * list as shaders/shaders.cmake's). */
#define VKK_WEIGHT_TYPES(X)                                                                        \
    X(F32, f32) X(F16, f16) X(BF16, bf16) X(Q8_0, q8_0) X(Q4_0, q4_0) X(Q4_1, q4_1) X(Q5_0, q5_0)   \
    X(Q5_1, q5_1) X(IQ4_NL, iq4_nl) X(Q2_K, q2_k) X(Q3_K, q3_k) X(Q4_K, q4_k) X(Q5_K, q5_k)        \
    X(Q6_K, q6_k) X(IQ4_XS, iq4_xs)

#define VKK_MATMUL_IDS(T, t) VKK_MATVEC_##T, VKK_MATMUL_##T, VKK_GET_ROWS_##T,

typedef enum vkk_id {
    VKK_ADD,
    /* matmul family (engine/ops_matmul.c): matrix-vector, tiled GEMM and row gather per
     * weight type */
    VKK_WEIGHT_TYPES(VKK_MATMUL_IDS)
    /* row norms and elementwise ops (engine/ops_basic.c) */
    VKK_RMSNORM, VKK_ROPE, VKK_SWIGLU, VKK_SOFTMAX,
    /* paged KV writes and attention (engine/ops_attn.c), per KV element type */
    VKK_KV_WRITE_F16, VKK_KV_WRITE_F32, VKK_ATTN_DECODE_F16, VKK_ATTN_DECODE_F32,
    VKK_ATTN_PREFILL_F16, VKK_ATTN_PREFILL_F32, VKK_ATTN_REDUCE,
    /* sampling stage (engine/ops_sample.c) */
    VKK_SAMPLE,
    VKK_COUNT
} vkk_id;

#define VKK_MAX_SPEC 8
#define VKK_MAX_BINDINGS 8

typedef struct vkk_desc {
    const char *name;             /* shows in RenderDoc/Nsight labels and in profiles */
    const uint32_t *spv;
    const size_t *spv_size;       /* bytes */
    uint32_t n_bindings;
    uint32_t push_size;           /* sizeof the vki_pc_* struct */
    uint32_t n_spec;
    uint32_t spec_default[VKK_MAX_SPEC];
} vkk_desc;

const vkk_desc *vkk_get(vkk_id k);

/* Device hooks (called by vkd_open / vkd_close). */
vki_status vkd_kernels_create(vkd_device *d);
void vkd_kernels_destroy(vkd_device *d);

/* spec: NULL for the table's defaults, else desc->n_spec values. */
vki_status vkk_prepare(vkd_device *d, vkk_id k, const uint32_t *spec);

/* Records one dispatch: binds the pipeline, pushes descriptors and constants, wraps it in a
 * debug label (and timestamps when profiling). Checks push size, binding count, binding
 * ranges and group counts against the table and the device limits; returns
 * VKI_ERR_INVALID_ARG (and records nothing) on a mismatch. No barrier is recorded: the caller
 * puts vkd_barrier() between dependent dispatches. */
vki_status vkk_dispatch(vkd_cmd *c, vkk_id k, const uint32_t *spec, const vkd_view *bindings,
                        uint32_t n_bindings, const void *push, uint32_t push_size, uint32_t gx,
                        uint32_t gy, uint32_t gz);

/* Ceil-divide helper for group counts. */
static inline uint32_t vkk_groups(uint64_t n, uint32_t per_group)
{
    return (uint32_t)((n + per_group - 1) / per_group);
}

#endif
