/* Mixture-of-experts routing ops (shaders/moe_*.comp); the experts' matmuls are op_matmul_id
 * (engine/ops_matmul.h). A layer's FFN, for T tokens choosing n_used of n_expert experts
 * ("pairs": pair p = t * n_used + j is token t's j-th expert):
 *
 *   logits = h Wrouter                    op_matmul               f32[T][n_expert]
 *   ids, weights = top-k, softmax         op_moe_topk             i32/f32[T][n_used]
 *   [route = pairs grouped by expert      op_moe_group            GEMM paths only]
 *   gate, up = h W{gate,up}_e per pair    op_matmul_id (x_div = n_used)   f32[T n_used][d_ff]
 *   gate = act(gate) * up                 op_glu
 *   o = gate Wdown_e per pair             op_matmul_id (x_div = 1)        f32[T n_used][d]
 *   x += sum_j weights[t][j] o[t n_used + j]     op_moe_combine
 *
 * Every op records one dispatch and no barrier; on a bad argument nothing is recorded and the
 * error (VKI_ERR_INVALID_ARG) is logged. */
#ifndef VKI_ENGINE_OPS_MOE_H
#define VKI_ENGINE_OPS_MOE_H

#include "engine/ops_basic.h"

/* ids[t][j], weights[t][j] for t < n_tokens, j < n_used: the n_used largest logits of row t
 * (ties: lower expert first) and softmax(logits[t])[ids], divided by their sum when norm.
 *   logits: f32[n_tokens][n_expert]; ids: i32[n_tokens][n_used]; weights: f32[n_tokens][n_used]
 * n_expert <= VKI_MOE_MAX_EXPERTS, 1 <= n_used <= min(n_expert, VKI_MOE_MAX_USED). */
vki_status op_moe_topk(vkd_cmd *c, vkd_view logits, uint32_t n_tokens, uint32_t n_expert, uint32_t n_used, bool norm,
                       vkd_view ids, vkd_view weights);

/* route = the n_pairs pairs grouped by expert (one workgroup; see shaders/moe_group.comp):
 *   ids: i32[n_pairs]; route: u32[n_expert + 1 + n_pairs] (offsets, then pair indices) */
vki_status op_moe_group(vkd_cmd *c, vkd_view ids, uint32_t n_pairs, uint32_t n_expert, vkd_view route);

/* x[t][:d] += sum_j weights[t][j] * o[t * n_used + j][:d], j in order; with bias (gpt-oss;
 * NULL: none) each o row gets its expert's down bias first, o[p][:] + bias->b[0][ids[p]][:].
 *   o: f32[n_tokens * n_used][d]; weights: f32[n_tokens][n_used]; x: f32[n_tokens][d] */
vki_status op_moe_combine(vkd_cmd *c, vkd_view o, vkd_view weights, vkd_view x, uint32_t n_tokens, uint32_t n_used,
                          uint32_t d, const op_expert_bias *bias);

/* Creates the three routing pipelines (call at engine open). */
vki_status op_moe_prepare(vkd_device *d);

#endif
