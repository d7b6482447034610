/* Kernel table, pipeline creation (with specialisation constants) and the dispatch path. */
#include "engine/kernels.h"
#include "engine/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "vki_spirv.h"

#define PUSH_OK(T) (sizeof(T) % 4 == 0 && sizeof(T) <= VKI_MAX_PUSH)
_Static_assert(PUSH_OK(vki_pc_add), "push struct vki_pc_add");
_Static_assert(PUSH_OK(vki_pc_copy), "push struct vki_pc_copy");
_Static_assert(PUSH_OK(vki_pc_matmul), "push struct vki_pc_matmul");
_Static_assert(PUSH_OK(vki_pc_get_rows), "push struct vki_pc_get_rows");
_Static_assert(PUSH_OK(vki_pc_quant_x8), "push struct vki_pc_quant_x8");
_Static_assert(PUSH_OK(vki_pc_matmul_id) && PUSH_OK(vki_pc_moe), "push structs of the experts' kernels");
_Static_assert(offsetof(vki_pc_matmul_id, x_vec4) == offsetof(vki_pc_matmul, x_vec4) &&
                   offsetof(vki_pc_matmul_id, n0) == offsetof(vki_pc_matmul, n0),
               "vki_pc_matmul_id starts with vki_pc_matmul's fields");

_Static_assert(PUSH_OK(vki_pc_rmsnorm), "push struct vki_pc_rmsnorm");
_Static_assert(PUSH_OK(vki_pc_rope), "push struct vki_pc_rope");
_Static_assert(PUSH_OK(vki_pc_glu), "push struct vki_pc_glu");
_Static_assert(PUSH_OK(vki_pc_unary), "push struct vki_pc_unary");
_Static_assert(PUSH_OK(vki_pc_softmax), "push struct vki_pc_softmax");
_Static_assert(PUSH_OK(vki_pc_kv_write), "push struct vki_pc_kv_write");
_Static_assert(PUSH_OK(vki_pc_attn), "push struct vki_pc_attn");
_Static_assert(PUSH_OK(vki_pc_sample), "push struct vki_pc_sample");
_Static_assert(PUSH_OK(vki_pc_cm_peak), "push struct vki_pc_cm_peak");
_Static_assert(sizeof(vki_sample_row) == 68 && sizeof(vki_sample_edit) == 12 &&
                   sizeof(vki_sample_out) == 20 + 8 * VKI_SAMPLE_MAX_TOP, "std430 scalar-only sample structs");
_Static_assert(sizeof(vki_seq_info) == 16 && sizeof(vki_attn_item) == 16, "std430 uvec4-sized structs");

#define SPV(name) .spv = vki_spv_##name, .spv_size = &vki_spv_##name##_size
/* matmul family (engine/ops_matmul.c picks the specialisations from the device):
 * matvec spec {WG, NR rows, MC activation rows, NSG max subgroups, GLU, MCH chunks, MU units per
 * pass, XV4 X read as vec4}; matmul spec
 * {WG, BM, BN, BK, TM, TN} with WG = (BM/TM)*(BN/TN); matmul_cm(e) spec {WG, BM, BN, BK, WM,
 * WN, CM_M, CM_N, CM_K, CM_SG, STAGES, XH, W16} with WG = (BM/WM)*(BN/WN) subgroups; get_rows spec
 * {WG}; half_x {WG}. */
#define CM_SPEC(WG, a, b, c, d, e) {WG, a, b, c, d, e, 16, 16, 16, 32, 1, 0, 1}
#define MATMUL_ROWS(T, t)                                                                        \
    [VKK_MATVEC_##T] = {"matvec_" #t, SPV(matvec_##t), .n_bindings = 8,                          \
                        .push_size = sizeof(vki_pc_matmul), .n_spec = 8,                         \
                        .spec_default = {128, 4, 1, 16, 0, 1, 1, 1}},                            \
    [VKK_MATMUL_##T] = {"matmul_" #t, SPV(matmul_##t), .n_bindings = 4,                          \
                        .push_size = sizeof(vki_pc_matmul), .n_spec = 6,                         \
                        .spec_default = {256, 64, 64, 32, 4, 4}},                                \
    [VKK_MATMUL_CM_##T] = {"matmul_cm_" #t, SPV(matmul_cm_##t), .n_bindings = 6,                 \
                           .push_size = sizeof(vki_pc_matmul), .n_spec = 13,                     \
                           .spec_default = CM_SPEC(256, 128, 128, 32, 64, 32)},                  \
    [VKK_MATMUL_CME_##T] = {"matmul_cme_" #t, SPV(matmul_cme_##t), .n_bindings = 6,              \
                            .push_size = sizeof(vki_pc_matmul), .n_spec = 13,                    \
                            .spec_default = CM_SPEC(256, 128, 128, 32, 64, 32)},                 \
    [VKK_GET_ROWS_##T] = {"get_rows_" #t, SPV(get_rows_##t), .n_bindings = 3,                    \
                          .push_size = sizeof(vki_pc_get_rows), .n_spec = 1, .spec_default = {256}},

/* the experts' matmuls: the specialisations of their plain twins (matvec_id always MC = 1) */
#define MATMUL_ID_ROWS(T, t)                                                                     \
    [VKK_MATVEC_ID_##T] = {"matvec_id_" #t, SPV(matvec_id_##t), .n_bindings = 4,                 \
                           .push_size = sizeof(vki_pc_matmul_id), .n_spec = 8,                   \
                           .spec_default = {128, 4, 1, 16, 0, 1, 1, 1}},                         \
    [VKK_MATMUL_ID_##T] = {"matmul_id_" #t, SPV(matmul_id_##t), .n_bindings = 4,                 \
                           .push_size = sizeof(vki_pc_matmul_id), .n_spec = 6,                   \
                           .spec_default = {256, 64, 64, 32, 4, 4}},                             \
    [VKK_MATMUL_CM_ID_##T] = {"matmul_cm_id_" #t, SPV(matmul_cm_id_##t), .n_bindings = 4,        \
                              .push_size = sizeof(vki_pc_matmul_id), .n_spec = 13,               \
                              .spec_default = CM_SPEC(256, 128, 128, 32, 64, 32)},               \
    [VKK_MATMUL_CME_ID_##T] = {"matmul_cme_id_" #t, SPV(matmul_cme_id_##t), .n_bindings = 4,     \
                               .push_size = sizeof(vki_pc_matmul_id), .n_spec = 13,              \
                               .spec_default = CM_SPEC(256, 128, 128, 32, 64, 32)},

#define MATVEC_I8_ROW(T, t)                                                                      \
    [VKK_MATVEC_I8_##T] = {"matvec_i8_" #t, SPV(matvec_i8_##t), .n_bindings = 8,                 \
                           .push_size = sizeof(vki_pc_matmul), .n_spec = 8,                      \
                           .spec_default = {128, 4, 1, 16, 0, 1, 1, 1}},                         \
    [VKK_MATVEC_ID_I8_##T] = {"matvec_id_i8_" #t, SPV(matvec_id_i8_##t), .n_bindings = 4,        \
                              .push_size = sizeof(vki_pc_matmul_id), .n_spec = 8,                \
                              .spec_default = {128, 4, 1, 16, 0, 1, 1, 1}}

/* engine/ops_attn.c: kv_write {WG}; decode {WG, HD, L, GMAX}; prefill {WG, HD, BR, BC};
 * prefill on cooperative matrices {WG, HD, BR, BC, CM_M, CM_N, CM_K, CM_SG}; reduce {WG} */
#define ATTN_ROWS(T, t)                                                                          \
    [VKK_KV_WRITE_##T] = {"kv_write_" #t, SPV(kv_write_##t), .n_bindings = 9,                    \
                          .push_size = sizeof(vki_pc_kv_write), .n_spec = 1, .spec_default = {256}}, \
    [VKK_ATTN_DECODE_##T] = {"attn_decode_" #t, SPV(attn_decode_##t), .n_bindings = 14,          \
                             .push_size = sizeof(vki_pc_attn), .n_spec = 5,                      \
                             .spec_default = {128, 128, 16, 8, 1}},                              \
    [VKK_ATTN_PREFILL_##T] = {"attn_prefill_" #t, SPV(attn_prefill_##t), .n_bindings = 8,        \
                              .push_size = sizeof(vki_pc_attn), .n_spec = 4,                     \
                              .spec_default = {128, 128, 32, 32}},                               \
    [VKK_ATTN_PREFILL_CM_##T] = {"attn_prefill_cm_" #t, SPV(attn_prefill_cm_##t), .n_bindings = 8,  \
                                 .push_size = sizeof(vki_pc_attn), .n_spec = 8,                  \
                                 .spec_default = {128, 128, 32, 32, 16, 16, 16, 32}},            \
    [VKK_ATTN_PREFILL_CME_##T] = {"attn_prefill_cme_" #t, SPV(attn_prefill_cme_##t),              \
                                  .n_bindings = 8, .push_size = sizeof(vki_pc_attn), .n_spec = 8, \
                                  .spec_default = {128, 128, 32, 32, 16, 16, 16, 32}}

static const vkk_desc kernel_table[] = {
    [VKK_ADD] = {"add", SPV(add), .n_bindings = 3, .push_size = sizeof(vki_pc_add),
                 .n_spec = 1, .spec_default = {256}},
    [VKK_COPY] = {"copy", SPV(copy), .n_bindings = 2, .push_size = sizeof(vki_pc_copy),
                  .n_spec = 1, .spec_default = {256}},
    VKK_WEIGHT_TYPES(MATMUL_ROWS)
    VKK_WEIGHT_TYPES(MATMUL_ID_ROWS)
    /* engine/ops_matmul.c op_matmul_i8: quant_x8 {WG}; matvec_i8 as matvec */
    [VKK_QUANT_X8] = {"quant_x8", SPV(quant_x8), .n_bindings = 2, .push_size = sizeof(vki_pc_quant_x8),
                      .n_spec = 1, .spec_default = {64}},
    MATVEC_I8_ROW(Q8_0, q8_0), MATVEC_I8_ROW(Q4_0, q4_0), MATVEC_I8_ROW(Q4_1, q4_1), MATVEC_I8_ROW(Q5_0, q5_0),
    MATVEC_I8_ROW(Q5_1, q5_1), MATVEC_I8_ROW(Q2_K, q2_k), MATVEC_I8_ROW(Q3_K, q3_k), MATVEC_I8_ROW(Q4_K, q4_k),
    MATVEC_I8_ROW(Q5_K, q5_k), MATVEC_I8_ROW(Q6_K, q6_k), MATVEC_I8_ROW(IQ4_NL, iq4_nl), MATVEC_I8_ROW(IQ4_XS, iq4_xs),
    MATVEC_I8_ROW(MXFP4, mxfp4),
    [VKK_HALF_X] = {"half_x", SPV(half_x), .n_bindings = 2, .push_size = sizeof(vki_pc_quant_x8),
                    .n_spec = 1, .spec_default = {64}},
    [VKK_RMSNORM_XH] = {"rmsnorm_xh", SPV(rmsnorm_xh), .n_bindings = 5, .push_size = sizeof(vki_pc_rmsnorm),
                        .n_spec = 1, .spec_default = {256}},
    [VKK_GLU_XH] = {"glu_xh", SPV(glu_xh), .n_bindings = 6, .push_size = sizeof(vki_pc_glu), .n_spec = 1,
                    .spec_default = {256}},
    /* engine/ops_moe.c: spec {WG} */
    [VKK_MOE_TOPK] = {"moe_topk", SPV(moe_topk), .n_bindings = 3, .push_size = sizeof(vki_pc_moe),
                      .n_spec = 1, .spec_default = {64}},
    [VKK_MOE_GROUP] = {"moe_group", SPV(moe_group), .n_bindings = 2, .push_size = sizeof(vki_pc_moe),
                       .n_spec = 1, .spec_default = {256}},
    [VKK_MOE_COMBINE] = {"moe_combine", SPV(moe_combine), .n_bindings = 5, .push_size = sizeof(vki_pc_moe),
                         .n_spec = 1, .spec_default = {256}},
    /* engine/ops_basic.c: spec {WG} */
    [VKK_RMSNORM] = {"rmsnorm", SPV(rmsnorm), .n_bindings = 4, .push_size = sizeof(vki_pc_rmsnorm),
                     .n_spec = 1, .spec_default = {256}},
    [VKK_ROPE] = {"rope", SPV(rope), .n_bindings = 4, .push_size = sizeof(vki_pc_rope),
                  .n_spec = 1, .spec_default = {256}},
    [VKK_GLU] = {"glu", SPV(glu), .n_bindings = 6, .push_size = sizeof(vki_pc_glu),
                 .n_spec = 1, .spec_default = {256}},
    [VKK_SOFTMAX] = {"softmax", SPV(softmax), .n_bindings = 2, .push_size = sizeof(vki_pc_softmax),
                     .n_spec = 1, .spec_default = {256}},
    [VKK_UNARY] = {"unary", SPV(unary), .n_bindings = 2, .push_size = sizeof(vki_pc_unary),
                   .n_spec = 1, .spec_default = {256}},
    [VKK_UNARY_XQ] = {"unary_xq", SPV(unary_xq), .n_bindings = 3, .push_size = sizeof(vki_pc_unary),
                      .n_spec = 1, .spec_default = {256}},
    ATTN_ROWS(F16, f16), ATTN_ROWS(F32, f32), ATTN_ROWS(Q8_0, q8_0),
    [VKK_ATTN_REDUCE] = {"attn_reduce", SPV(attn_reduce), .n_bindings = 5, .push_size = sizeof(vki_pc_attn),
                         .n_spec = 1, .spec_default = {64}},
    /* engine/ops_sample.c: spec {WG, SU loads per invocation at once} */
    [VKK_SAMPLE] = {"sample", SPV(sample), .n_bindings = 6, .push_size = sizeof(vki_pc_sample),
                    .n_spec = 2, .spec_default = {256, 1}},
    /* tools/bench_kernels.c: {WG, NACC accumulators per subgroup, CM_M, CM_N, CM_K, CM_SG} */
    [VKK_CM_PEAK] = {"cm_peak", SPV(cm_peak), .n_bindings = 2, .push_size = sizeof(vki_pc_cm_peak),
                     .n_spec = 6, .spec_default = {128, 4, 16, 16, 16, 32}},
    [VKK_CM_PEAK_EMU] = {"cm_peak_emu", SPV(cm_peak_emu), .n_bindings = 2,
                         .push_size = sizeof(vki_pc_cm_peak), .n_spec = 6, .spec_default = {128, 4, 16, 16, 16, 32}},
};
_Static_assert(sizeof kernel_table / sizeof kernel_table[0] == VKK_COUNT, "one table row per kernel");

const vkk_desc *vkk_get(vkk_id k) { return (unsigned)k < VKK_COUNT ? &kernel_table[k] : NULL; }

/* A pipeline per specialisation: a short list per kernel, searched linearly (a handful each). */
typedef struct variant {
    uint32_t spec[VKK_MAX_SPEC];
    VkPipeline pipeline;
} variant;

typedef struct kernel_state {
    VkShaderModule module;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout layout;
    variant *variants;
    uint32_t n_variants, cap_variants;
} kernel_state;

/* A pipeline asked for between vkk_defer_begin and vkk_defer_end. */
typedef struct deferred {
    vkk_id id;
    uint32_t spec[VKK_MAX_SPEC];
    VkPipeline pipeline;
    VkResult result;
} deferred;

struct vkd_kernels {
    kernel_state k[VKK_COUNT];
    bool deferring;
    deferred *pend;
    uint32_t n_pend, cap_pend;
};

static vki_status kernel_init(vkd_device *d, vkk_id id, kernel_state *ks)
{
    const vkk_desc *kd = &kernel_table[id];
    if (kd->n_bindings > VKK_MAX_BINDINGS) {
        vkd_log(d, VKI_LOG_ERROR, "kernel %s: %u bindings, more than VKK_MAX_BINDINGS", kd->name, kd->n_bindings);
        return VKI_ERR_INVALID_ARG;
    }
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                   .codeSize = *kd->spv_size, .pCode = kd->spv};
    VKD_TRY(d, vkCreateShaderModule(d->dev, &mi, NULL, &ks->module));
    vkd_name(d, VK_OBJECT_TYPE_SHADER_MODULE, (uint64_t)ks->module, "%s", kd->name);
    VkDescriptorSetLayoutBinding b[VKK_MAX_BINDINGS];
    for (uint32_t i = 0; i < kd->n_bindings; i++)
        b[i] = (VkDescriptorSetLayoutBinding){.binding = i, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                              .descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                          .flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
                                          .bindingCount = kd->n_bindings, .pBindings = b};
    VKD_TRY(d, vkCreateDescriptorSetLayout(d->dev, &li, NULL, &ks->set_layout));
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = kd->push_size};
    VkPipelineLayoutCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                     .setLayoutCount = 1, .pSetLayouts = &ks->set_layout,
                                     .pushConstantRangeCount = kd->push_size ? 1 : 0, .pPushConstantRanges = &pr};
    VKD_TRY(d, vkCreatePipelineLayout(d->dev, &pi, NULL, &ks->layout));
    vkd_name(d, VK_OBJECT_TYPE_PIPELINE_LAYOUT, (uint64_t)ks->layout, "%s layout", kd->name);
    return VKI_OK;
}

/* Shader modules and layouts are created on a kernel's first use, not at device open: a module
 * that needs 16-bit storage must never be created on a device without it (the ops refuse such
 * types before dispatching), and unused kernels cost nothing. */
vki_status vkd_kernels_create(vkd_device *d)
{
    d->kernels = calloc(1, sizeof *d->kernels);
    if (!d->kernels)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (int i = 0; i < VKK_COUNT; i++) {
        if (kernel_table[i].push_size > d->info.max_push_constants_size) {
            vkd_log(d, VKI_LOG_ERROR, "kernel %s needs %u push-constant bytes, device allows %u",
                    kernel_table[i].name, kernel_table[i].push_size, d->info.max_push_constants_size);
            return VKI_ERR_UNSUPPORTED;
        }
    }
    return VKI_OK;
}

void vkd_kernels_destroy(vkd_device *d)
{
    if (!d->kernels)
        return;
    for (int i = 0; i < VKK_COUNT; i++) {
        kernel_state *ks = &d->kernels->k[i];
        for (uint32_t v = 0; v < ks->n_variants; v++)
            vkDestroyPipeline(d->dev, ks->variants[v].pipeline, NULL);
        free(ks->variants);
        if (ks->layout)
            vkDestroyPipelineLayout(d->dev, ks->layout, NULL);
        if (ks->set_layout)
            vkDestroyDescriptorSetLayout(d->dev, ks->set_layout, NULL);
        if (ks->module)
            vkDestroyShaderModule(d->dev, ks->module, NULL);
    }
    free(d->kernels->pend);
    free(d->kernels);
    d->kernels = NULL;
}

/* vkCreateComputePipelines for one specialisation of a kernel whose module and layout exist.
 * Touches no state of the library: several threads call it at once (vkk_defer_end; the
 * pipeline cache is internally synchronised). */
static VkResult create_pipeline(const vkd_device *d, vkk_id id, const uint32_t *vals, VkPipeline *out)
{
    const vkk_desc *kd = &kernel_table[id];
    const kernel_state *ks = &d->kernels->k[id];
    VkSpecializationMapEntry me[VKK_MAX_SPEC];
    for (uint32_t i = 0; i < kd->n_spec; i++)
        me[i] = (VkSpecializationMapEntry){.constantID = i, .offset = 4 * i, .size = 4};
    VkSpecializationInfo si = {.mapEntryCount = kd->n_spec, .pMapEntries = me,
                               .dataSize = 4 * kd->n_spec, .pData = vals};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT, .module = ks->module, .pName = "main",
                  .pSpecializationInfo = kd->n_spec ? &si : NULL},
        .layout = ks->layout};
    return vkCreateComputePipelines(d->dev, d->pipeline_cache, 1, &ci, NULL, out);
}

/* Adds a created pipeline to its kernel's variants (and names it); on failure destroys it. */
static vki_status add_variant(vkd_device *d, vkk_id id, const uint32_t *vals, VkPipeline p)
{
    const vkk_desc *kd = &kernel_table[id];
    kernel_state *ks = &d->kernels->k[id];
    if (ks->n_variants == ks->cap_variants) {
        uint32_t cap = ks->cap_variants ? 2 * ks->cap_variants : 4;
        variant *nv = realloc(ks->variants, cap * sizeof *nv);
        if (!nv) {
            vkDestroyPipeline(d->dev, p, NULL);
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        }
        ks->variants = nv;
        ks->cap_variants = cap;
    }
    vkd_name(d, VK_OBJECT_TYPE_PIPELINE, (uint64_t)p, "%s [%u,%u,%u,%u]", kd->name, vals[0], vals[1],
             vals[2], vals[3]);
    memcpy(ks->variants[ks->n_variants].spec, vals, sizeof ks->variants[0].spec);
    ks->variants[ks->n_variants++].pipeline = p;
    return VKI_OK;
}

/* The kernel's module and layout (first use), and its specialisation values in vals. */
static vki_status kernel_vals(vkd_device *d, vkk_id id, const uint32_t *spec, uint32_t vals[VKK_MAX_SPEC])
{
    const vkk_desc *kd = &kernel_table[id];
    kernel_state *ks = &d->kernels->k[id];
    if (!ks->layout) {
        vki_status st = kernel_init(d, id, ks);
        if (st != VKI_OK)
            return st;
    }
    memset(vals, 0, VKK_MAX_SPEC * sizeof(uint32_t));
    memcpy(vals, spec ? spec : kd->spec_default, kd->n_spec * sizeof(uint32_t));
    return VKI_OK;
}

static bool find_variant(const kernel_state *ks, const uint32_t *vals, VkPipeline *out)
{
    for (uint32_t v = 0; v < ks->n_variants; v++)
        if (!memcmp(ks->variants[v].spec, vals, sizeof ks->variants[v].spec)) {
            *out = ks->variants[v].pipeline;
            return true;
        }
    return false;
}

static vki_status get_pipeline(vkd_device *d, vkk_id id, const uint32_t *spec, VkPipeline *out)
{
    uint32_t vals[VKK_MAX_SPEC];
    vki_status st = kernel_vals(d, id, spec, vals);
    if (st != VKI_OK || find_variant(&d->kernels->k[id], vals, out))
        return st;
    VkPipeline p;
    VKD_TRY(d, create_pipeline(d, id, vals, &p));
    if ((st = add_variant(d, id, vals, p)) == VKI_OK)
        *out = p;
    return st;
}

vki_status vkk_prepare(vkd_device *d, vkk_id k, const uint32_t *spec)
{
    if ((unsigned)k >= VKK_COUNT)
        return VKI_ERR_INVALID_ARG;
    struct vkd_kernels *ks = d->kernels;
    if (!ks->deferring) {
        VkPipeline p;
        return get_pipeline(d, k, spec, &p);
    }
    uint32_t vals[VKK_MAX_SPEC];
    VkPipeline p;
    vki_status st = kernel_vals(d, k, spec, vals);
    if (st != VKI_OK || find_variant(&ks->k[k], vals, &p))
        return st;
    for (uint32_t i = 0; i < ks->n_pend; i++)
        if (ks->pend[i].id == k && !memcmp(ks->pend[i].spec, vals, sizeof vals))
            return VKI_OK;
    if (ks->n_pend == ks->cap_pend) {
        uint32_t cap = ks->cap_pend ? 2 * ks->cap_pend : 32;
        deferred *np = realloc(ks->pend, cap * sizeof *np);
        if (!np)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        ks->pend = np;
        ks->cap_pend = cap;
    }
    deferred *q = &ks->pend[ks->n_pend++];
    *q = (deferred){.id = k, .result = VK_NOT_READY};
    memcpy(q->spec, vals, sizeof vals);
    return VKI_OK;
}

uint32_t vkk_variants(const vkd_device *d, vkk_id k)
{
    return (unsigned)k < VKK_COUNT ? d->kernels->k[k].n_variants : 0;
}

void vkk_defer_begin(vkd_device *d)
{
    d->kernels->deferring = true;
    d->kernels->n_pend = 0;
}

typedef struct creator {
    vkd_device *d;
    atomic_uint next;
} creator;

/* A worker: takes the next deferred pipeline until none is left. */
static void *create_some(void *arg)
{
    creator *c = arg;
    struct vkd_kernels *ks = c->d->kernels;
    for (uint32_t i; (i = atomic_fetch_add(&c->next, 1)) < ks->n_pend;)
        ks->pend[i].result = create_pipeline(c->d, ks->pend[i].id, ks->pend[i].spec, &ks->pend[i].pipeline);
    return NULL;
}

vki_status vkk_defer_end(vkd_device *d, bool create)
{
    struct vkd_kernels *ks = d->kernels;
    ks->deferring = false;
    if (!create)
        ks->n_pend = 0;
    if (!ks->n_pend)
        return VKI_OK;
    /* one worker per core up to 8 and the work, the caller being one of them; a thread that
     * cannot start leaves its share to the others */
    creator c = {.d = d};
    atomic_init(&c.next, 0);
    uint32_t n_thr = vk_cores(8), started = 0;
    n_thr = n_thr > ks->n_pend ? ks->n_pend : n_thr;
    pthread_t thr[7];
    for (uint32_t t = 1; t < n_thr; t++)
        if (pthread_create(&thr[started], NULL, create_some, &c) == 0)
            started++;
    create_some(&c);
    for (uint32_t t = 0; t < started; t++)
        pthread_join(thr[t], NULL);
    /* in request order, so the kernels' variant lists do not depend on the threads' timing */
    vki_status st = VKI_OK;
    for (uint32_t i = 0; i < ks->n_pend; i++) {
        deferred *q = &ks->pend[i];
        vki_status si = vkd_check(d, q->result, "vkCreateComputePipelines");
        if (si == VKI_OK)
            si = add_variant(d, q->id, q->spec, q->pipeline);
        st = st == VKI_OK ? si : st;
    }
    ks->n_pend = 0;
    return st;
}

static vki_status check_dispatch(vkd_device *d, const vkk_desc *kd, const vkd_view *bind, uint32_t n_bind,
                                 uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz)
{
    if (push_size != kd->push_size || n_bind != kd->n_bindings) {
        vkd_log(d, VKI_LOG_ERROR, "dispatch %s: push %u bytes / %u bindings, table says %u / %u",
                kd->name, push_size, n_bind, kd->push_size, kd->n_bindings);
        return VKI_ERR_INVALID_ARG;
    }
    const uint32_t *mx = d->info.max_workgroup_count;
    if (!gx || !gy || !gz || gx > mx[0] || gy > mx[1] || gz > mx[2]) {
        vkd_log(d, VKI_LOG_ERROR, "dispatch %s: groups (%u,%u,%u) outside (1..%u,1..%u,1..%u)", kd->name,
                gx, gy, gz, mx[0], mx[1], mx[2]);
        return VKI_ERR_INVALID_ARG;
    }
    for (uint32_t i = 0; i < n_bind; i++) {
        const vkd_view *v = &bind[i];
        VkDeviceSize range = v->range == VK_WHOLE_SIZE && v->buf ? v->buf->size - v->offset : v->range;
        if (!v->buf || v->offset >= v->buf->size || range > v->buf->size - v->offset ||
            range > d->info.max_storage_buffer_range || v->offset % d->info.min_storage_buffer_offset_alignment) {
            vkd_log(d, VKI_LOG_ERROR, "dispatch %s: binding %u range [%llu,+%llu) invalid for its buffer or "
                    "the device limits", kd->name, i, (unsigned long long)v->offset, (unsigned long long)range);
            return VKI_ERR_INVALID_ARG;
        }
    }
    return VKI_OK;
}

/* The checked, labelled (and, profiling, timed) dispatch both entry points record. */
static vki_status dispatch(vkd_cmd *c, vkk_id k, const uint32_t *spec, const vkd_view *bind, uint32_t n_bind,
                           const void *push, uint32_t push_size, const uint32_t g[3], const vkd_view *indirect)
{
    vkd_device *d = c->d;
    const vkk_desc *kd = vkk_get(k);
    if (!kd || !c->recording)
        return VKI_ERR_INVALID_ARG;
    vki_status st = check_dispatch(d, kd, bind, n_bind, push_size, g[0], g[1], g[2]);
    if (st == VKI_OK && indirect &&
        (!indirect->buf || indirect->offset % 4 || indirect->offset + sizeof(VkDispatchIndirectCommand) > indirect->buf->size)) {
        vkd_log(d, VKI_LOG_ERROR, "dispatch %s: indirect arguments outside their buffer", kd->name);
        st = VKI_ERR_INVALID_ARG;
    }
    VkPipeline p = VK_NULL_HANDLE;
    if (st == VKI_OK)
        st = get_pipeline(d, k, spec, &p);
    if (st != VKI_OK)
        return st;
    kernel_state *ks = &d->kernels->k[k];
    VkDescriptorBufferInfo bi[VKK_MAX_BINDINGS];
    for (uint32_t i = 0; i < n_bind; i++)
        bi[i] = (VkDescriptorBufferInfo){bind[i].buf->buf, bind[i].offset, bind[i].range};
    vkd_label_begin_join(c, c->role, kd->name);
    bool timed = c->queries && c->n_queries + 2 <= c->max_queries;
    if (timed) {
        /* the label opened above ends the path: "step 3 / layer 0 / attn_rope_q / rope" */
        memcpy(c->query_names[c->n_queries / 2], c->label_path, VKD_LABEL_PATH);
        c->query_roles[c->n_queries / 2] = c->role;
        vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, c->queries, c->n_queries++);
    }
    vkd_dispatch_raw(c, p, ks->layout, bi, n_bind, push, push_size, g, indirect ? indirect->buf->buf : VK_NULL_HANDLE,
                     indirect ? indirect->offset : 0);
    c->n_dispatches++;
    if (timed)
        vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, c->queries, c->n_queries++);
    vkd_label_end(c);
    return VKI_OK;
}

vki_status vkk_dispatch(vkd_cmd *c, vkk_id k, const uint32_t *spec, const vkd_view *bind, uint32_t n_bind,
                        const void *push, uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz)
{
    return dispatch(c, k, spec, bind, n_bind, push, push_size, (uint32_t[3]){gx, gy, gz}, NULL);
}

vki_status vkk_dispatch_indirect(vkd_cmd *c, vkk_id k, const uint32_t *spec, const vkd_view *bind, uint32_t n_bind,
                                 const void *push, uint32_t push_size, vkd_view args)
{
    return dispatch(c, k, spec, bind, n_bind, push, push_size, (uint32_t[3]){1, 1, 1}, &args);
}
