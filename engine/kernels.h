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
#include "engine/weight_types.h"
#include "shaders/vki_shared.h"

/* Per weight type: matrix-vector, tiled FP32 GEMM, cooperative-matrix GEMM (NV tensor cores)
 * and its plain-GLSL emulation (CME), row gather. */
#define VKK_MM_IDS(T, t) VKK_MATVEC_##T, VKK_MATMUL_##T, VKK_MATMUL_CM_##T, VKK_MATMUL_CME_##T, VKK_GET_ROWS_##T,
/* The same four matmuls with the mixture-of-experts indirection (each row its own expert). */
#define VKK_MM_ID_IDS(T, t) VKK_MATVEC_ID_##T, VKK_MATMUL_ID_##T, VKK_MATMUL_CM_ID_##T, VKK_MATMUL_CME_ID_##T,

typedef enum vkk_id {
    VKK_ADD,
    VKK_COPY, /* the copy-bandwidth probe (engine/ops_basic.c) */
    /* matmul family (engine/ops_matmul.c) */
    VKK_WEIGHT_TYPES(VKK_MM_IDS)
    VKK_WEIGHT_TYPES(VKK_MM_ID_IDS)
    /* the integer-dot matrix-vector path: X's int8 quantiser and the product, for the weight
     * types of shaders/dequant.glsl's DQ_I8 (engine/ops_matmul.c op_matmul_i8) */
    VKK_QUANT_X8, VKK_MATVEC_I8_Q8_0, VKK_MATVEC_I8_Q4_0, VKK_MATVEC_I8_Q4_1, VKK_MATVEC_I8_Q5_0,
    VKK_MATVEC_I8_Q5_1, VKK_MATVEC_I8_Q2_K, VKK_MATVEC_I8_Q3_K, VKK_MATVEC_I8_Q4_K, VKK_MATVEC_I8_Q5_K,
    VKK_MATVEC_I8_Q6_K, VKK_MATVEC_I8_IQ4_NL, VKK_MATVEC_I8_IQ4_XS, VKK_MATVEC_I8_MXFP4,
    /* ... and the experts' (the same types in the same order: op_matmul_id_i8) */
    VKK_MATVEC_ID_I8_Q8_0, VKK_MATVEC_ID_I8_Q4_0, VKK_MATVEC_ID_I8_Q4_1, VKK_MATVEC_ID_I8_Q5_0,
    VKK_MATVEC_ID_I8_Q5_1, VKK_MATVEC_ID_I8_Q2_K, VKK_MATVEC_ID_I8_Q3_K, VKK_MATVEC_ID_I8_Q4_K,
    VKK_MATVEC_ID_I8_Q5_K, VKK_MATVEC_ID_I8_Q6_K, VKK_MATVEC_ID_I8_IQ4_NL, VKK_MATVEC_ID_I8_IQ4_XS,
    VKK_MATVEC_ID_I8_MXFP4,
    /* X rounded to F16 once for the tensor-core GEMM (engine/ops_matmul.c op_half_x) */
    VKK_HALF_X, VKK_RMSNORM_XH, VKK_GLU_XH,
    /* mixture-of-experts routing (engine/ops_moe.c) */
    VKK_MOE_TOPK, VKK_MOE_GROUP, VKK_MOE_COMBINE,
    /* row norms and elementwise ops (engine/ops_basic.c) */
    VKK_RMSNORM, VKK_ROPE, VKK_GLU, VKK_SOFTMAX, VKK_UNARY, VKK_UNARY_XQ,
    /* paged KV writes and attention (engine/ops_attn.c), per KV element type (F16, F32, Q8_0:
     * consecutive, ops_attn.c picks by offset); prefill also on cooperative matrices (CM) and
     * their emulation (CME) */
    VKK_KV_WRITE_F16, VKK_KV_WRITE_F32, VKK_KV_WRITE_Q8_0, VKK_ATTN_DECODE_F16, VKK_ATTN_DECODE_F32,
    VKK_ATTN_DECODE_Q8_0, VKK_ATTN_PREFILL_F16, VKK_ATTN_PREFILL_F32, VKK_ATTN_PREFILL_Q8_0, VKK_ATTN_REDUCE,
    VKK_ATTN_PREFILL_CM_F16, VKK_ATTN_PREFILL_CM_F32, VKK_ATTN_PREFILL_CM_Q8_0,
    VKK_ATTN_PREFILL_CME_F16, VKK_ATTN_PREFILL_CME_F32, VKK_ATTN_PREFILL_CME_Q8_0,
    /* sampling stage (engine/ops_sample.c) */
    VKK_SAMPLE,
    /* cooperative-matrix peak: a pure multiply-add loop (tools/bench_kernels.c) */
    VKK_CM_PEAK, VKK_CM_PEAK_EMU,
    VKK_COUNT
} vkk_id;

#define VKK_MAX_SPEC 13
#define VKK_MAX_BINDINGS 14 /* a table entry with more fails at kernel_init (and cmd.c takes 16) */

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

/* Between these two, vkk_prepare only notes the pipelines it is asked for (their modules and
 * layouts are made at once); vkk_defer_end(d, true) then creates them on up to 8 threads (one
 * per core): compiling them is most of an engine's open on devices that compile at creation (a
 * CPU device, a driver with a cold cache). A failed creation is reported after all have run;
 * the pipelines created are kept either way. vkk_defer_end(d, false) drops the notes. */
void vkk_defer_begin(vkd_device *d);
vki_status vkk_defer_end(vkd_device *d, bool create);

/* Pipelines (specialisations) of kernel k created so far on d. */
uint32_t vkk_variants(const vkd_device *d, vkk_id k);

/* Records one dispatch: binds the pipeline, pushes descriptors and constants, wraps it in a
 * debug label (and timestamps when profiling). Checks push size, binding count, binding
 * ranges and group counts against the table and the device limits; returns
 * VKI_ERR_INVALID_ARG (and records nothing) on a mismatch. No barrier is recorded: the caller
 * puts vkd_barrier() between dependent dispatches. */
vki_status vkk_dispatch(vkd_cmd *c, vkk_id k, const uint32_t *spec, const vkd_view *bindings,
                        uint32_t n_bindings, const void *push, uint32_t push_size, uint32_t gx,
                        uint32_t gy, uint32_t gz);

/* The same with the group counts read by the device from args (a VkDispatchIndirectCommand at
 * args.offset, a multiple of 4): the counts may change between submissions of one recording.
 * Whoever writes them keeps each within the device's maxComputeWorkGroupCount (0 is allowed:
 * nothing runs). */
vki_status vkk_dispatch_indirect(vkd_cmd *c, vkk_id k, const uint32_t *spec, const vkd_view *bindings,
                                 uint32_t n_bindings, const void *push, uint32_t push_size, vkd_view args);

/* Ceil-divide helper for group counts. */
static inline uint32_t vkk_groups(uint64_t n, uint32_t per_group)
{
    return (uint32_t)((n + per_group - 1) / per_group);
}

#endif
