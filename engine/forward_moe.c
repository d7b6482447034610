/* The mixture-of-experts FFN of the forward pass (qwen3moe, Mixtral, gpt-oss), recorded after
 * the FFN's RMSNorm (h = rmsnorm(x) * ffn_norm) in place of the dense gate/up/down:
 *
 *   logits = h Wrouter (+ b_router)          [C][n_expert]
 *   ids, w = top n_used of softmax(logits)   [C][n_used]   (renormalised: expert_norm)
 *   g, u   = h Wgate_e, h Wup_e per pair     [C n_used][d_ff_exp]  (pair = token's j-th expert)
 *   g      = silu(g) * u                     (gpt-oss: swiglu_oai(g + bg_e, u + bu_e), the
 *                                             biases added by the gated unit)
 *   o      = g Wdown_e per pair              [C n_used][d]
 *   x     += sum_j w[t][j] o[t n_used + j]   (gpt-oss: (o + bd_e), added by the combine)
 *
 * Tokens go through in chunks of C = vk_scratch.moe_rows so the per-pair buffers stay bounded
 * (n_used copies of every row: Qwen3-30B-A3B at 2048 tokens would need 128 MiB for o alone, over
 * lavapipe's binding limit). The expert ids stay on the device: decode (few pairs per expert)
 * runs the matrix-vector kernel over just the chosen experts' rows; prefill chunks group the
 * pairs by expert (moe_group) and run the tiled GEMM (cooperative matrices where present) over
 * each expert's pairs. Batch-invariant engines always take the matrix-vector kernel, whose
 * arithmetic per pair does not depend on the other pairs, and the routing and the weighted sum
 * are per token: a token's experts and its output do not depend on its batch-mates.
 * With int_dot the matrix-vector path's experts take integer dot products as the dense
 * projections do (op_matmul_id_i8): h's rows and then g's pair rows quantised to int8 first. On
 * the tensor-core GEMM the experts read h's rows and g's pair rows rounded to F16 once
 * (op_half_x, op_matmul_id_xh), as the dense products do. */
#include "engine/engine.h"
#include "engine/ops_basic.h"
#include "engine/ops_matmul.h"
#include "engine/ops_moe.h"

#define TRY VK_TRY

/* Bytes of the largest per-pair buffer of one chunk: keeps every binding under 64 MiB. */
#define MOE_CHUNK_BYTES (64u << 20)

/* Rows per chunk: all tokens when they fit, else a multiple of 64 (so chunk offsets into the
 * activations stay aligned for binding), at least 64. */
static uint32_t moe_chunk_rows(const vk_engine *e)
{
    const model_hparams *hp = &e->model.hp;
    uint64_t widest = hp->d_model > hp->d_ff_exp ? hp->d_model : hp->d_ff_exp;
    uint64_t per_token = (uint64_t)hp->n_expert_used * widest * 4;
    uint64_t rows = MOE_CHUNK_BYTES / per_token;
    uint64_t max_pairs_rows = e->dev->info.max_workgroup_count[1] / hp->n_expert_used; /* GEMV grid y */
    if (rows > max_pairs_rows)
        rows = max_pairs_rows;
    if (rows >= e->p.max_tokens)
        return e->p.max_tokens;
    return rows < 64 ? 64 : (uint32_t)(rows / 64 * 64);
}

vki_status vk_moe_scratch_create(vk_engine *e)
{
    const model_hparams *hp = &e->model.hp;
    vk_scratch *s = &e->s;
    if (!hp->n_expert)
        return VKI_OK;
    s->moe_rows = moe_chunk_rows(e);
    VkDeviceSize C = s->moe_rows, P = C * hp->n_expert_used;
    struct { vkd_buffer **b; VkDeviceSize bytes; const char *name; } all[] = {
        {&s->moe_logits, C * hp->n_expert * 4, "moe router logits"},
        {&s->moe_ids, P * 4, "moe expert ids"},
        {&s->moe_w, P * 4, "moe expert weights"},
        {&s->moe_route, (hp->n_expert + 1 + P) * 4, "moe route"},
        {&s->moe_g, P * hp->d_ff_exp * 4, "moe gate"},
        {&s->moe_u, P * hp->d_ff_exp * 4, "moe up"},
        {&s->moe_o, P * hp->d_model * 4, "moe expert out"},
        {&s->moe_gq, e->p.int_dot && hp->d_ff_exp % 32 == 0 ? op_quant_x8_bytes((uint32_t)P, hp->d_ff_exp) : 0,
         "moe gate int8"},
        {&s->moe_gh, s->xh ? op_half_x_bytes((uint32_t)P, hp->d_ff_exp) : 0, "moe gate f16"},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!all[i].bytes)
            continue;
        vki_status st = vkd_buffer_create(e->dev, all[i].bytes, VKD_MEM_DEVICE, all[i].name, all[i].b);
        if (st != VKI_OK)
            return st;
    }
    return VKI_OK;
}

/* int_dot: whether the experts of w (K columns) take the integer-dot matvec (on the GEMV path). */
static bool moe_i8(const vk_engine *e, const vk_tensor *w, uint32_t K)
{
    return e->p.int_dot && K % 32 == 0 && op_matmul_i8_supported(e->dev, w->type);
}

void vk_moe_scratch_destroy(vk_engine *e)
{
    vk_scratch *s = &e->s;
    vkd_buffer **all[] = {&s->moe_logits, &s->moe_ids, &s->moe_w, &s->moe_route,
                          &s->moe_g,      &s->moe_u,   &s->moe_o, &s->moe_gq, &s->moe_gh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        vkd_buffer_destroy(e->dev, *all[i]);
        *all[i] = NULL;
    }
}

vki_status vk_moe_prepare(vk_engine *e)
{
    const vk_model *m = &e->model;
    if (!m->hp.n_expert)
        return VKI_OK;
    vki_status st = op_moe_prepare(e->dev);
    /* every expert tensor: mixes vary the type by layer; a pipeline that exists is a lookup */
    for (uint32_t il = 0; st == VKI_OK && il < m->hp.n_layer; il++) {
        const vk_layer *L = &m->layers[il];
        const vk_tensor *w[3] = {&L->w_gate_exps, &L->w_up_exps, &L->w_down_exps};
        for (int i = 0; i < 3 && st == VKI_OK; i++) {
            st = op_matmul_id_prepare(e->dev, w[i]->type, e->s.moe_rows);
            if (st == VKI_OK && moe_i8(e, w[i], (uint32_t)w[i]->ne0))
                st = op_matmul_id_i8_prepare(e->dev, w[i]->type);
        }
    }
    return st;
}

/* Whether a step of T tokens takes the layer's experts in one chunk on the matrix-vector path
 * with the gate or up experts on integer dot products: then h's int8 copy is what the FFN norm
 * (or the norm epilogue of the attention's output projection) writes with h, as for a dense FFN
 * (engine/forward.c's ffn_i8), and the chunk has no quant_x8 pass of its own. */
bool vk_moe_h_i8(const vk_engine *e, const vk_layer *L, uint32_t T)
{
    const model_hparams *hp = &e->model.hp;
    if (!T || T > e->s.moe_rows)
        return false;
    op_mm_path path =
        e->p.batch_invariant ? OP_MM_GEMV : op_matmul_id_path(e->dev, T * hp->n_expert_used, hp->n_expert);
    return path == OP_MM_GEMV && (moe_i8(e, &L->w_gate_exps, hp->d_model) || moe_i8(e, &L->w_up_exps, hp->d_model));
}

/* The experts' matmul path for a chunk of n tokens. */
static op_mm_path moe_path(const vk_engine *e, uint32_t n)
{
    const model_hparams *hp = &e->model.hp;
    return e->p.batch_invariant ? OP_MM_GEMV : op_matmul_id_path(e->dev, n * hp->n_expert_used, hp->n_expert);
}

/* Whether a chunk on `path` takes the tensor-core GEMM with its rows rounded to F16 once (h's
 * into s->xh, the gated rows into s->moe_gh). */
static bool moe_xh(const vk_engine *e, op_mm_path path)
{
    return path == OP_MM_COOPMAT && e->s.moe_gh && !e->dev->cm_x32;
}

/* Whether a step of T tokens takes the layer's experts in one chunk on the tensor-core GEMM with
 * F16 X: then h's F16 rows are what the FFN norm writes with h (not op by op), as for a dense
 * FFN (engine/forward.c's ffn_xh), and the chunk has no half_x pass of its own. */
bool vk_moe_h_xh(const vk_engine *e, uint32_t T)
{
    return T && T <= e->s.moe_rows && moe_xh(e, moe_path(e, T));
}

/* Rows [t0, t0 + n) of the step's tokens through the layer's experts, added into x; h_q: s->xq
 * already holds these rows of h quantised (vk_moe_h_i8, written by the norm); h_h: s->xh holds
 * them in F16 (vk_moe_h_xh, the same). *left_q / *left_h: s->xq / s->xh hold them on return. */
static vki_status moe_chunk(vk_engine *e, const vk_layer *L, uint32_t t0, uint32_t n, bool h_q, bool h_h,
                            bool *left_q, bool *left_h)
{
    const model_hparams *hp = &e->model.hp;
    vk_scratch *s = &e->s;
    vkd_cmd *c = e->cmd;
    const uint32_t d = hp->d_model, E = hp->n_expert, k = hp->n_expert_used, ff = hp->d_ff_exp, P = n * k;
    const VkDeviceSize rows = (VkDeviceSize)t0 * d * 4, bytes = (VkDeviceSize)n * d * 4;
    const vkd_view h = {s->h, rows, bytes}, x = {s->x, rows, bytes};
    const vkd_view ids = vkd_whole(s->moe_ids), w = vkd_whole(s->moe_w), route = vkd_whole(s->moe_route);
    const op_mm_path path = moe_path(e, n);
    /* the router always in F32 (never the F16-operand tensor-core GEMM): its output is a discrete
     * choice, and F16 rounding would pick other experts than the F32 reference near a tie; it is
     * n_expert x d, negligible next to the experts */
    bool router_gemv = e->p.batch_invariant || n <= op_matmul_gemv_max_m(e->dev);
    vkd_role(c, "ffn_router");
    const bool eb = hp->expert_bias;
    const vkd_view rb = eb ? vkd_whole(L->router_b.parts[0].buf) : (vkd_view){0};
    TRY(op_matmul_path(c, &L->router, eb ? &rb : NULL, h, d, vkd_whole(s->moe_logits), E, n,
                       router_gemv ? OP_MM_GEMV : OP_MM_GEMM));
    vkd_barrier(c);
    vkd_role(c, "ffn_topk");
    TRY(op_moe_topk(c, vkd_whole(s->moe_logits), n, E, k, hp->expert_norm, ids, w));
    vkd_barrier(c);
    if (path != OP_MM_GEMV) {
        vkd_role(c, "ffn_moe_group");
        TRY(op_moe_group(c, ids, P, E, route));
        vkd_barrier(c);
    }
    /* int_dot, the matrix-vector path: each projection whose type has integer blocks takes
     * integer dot products, its input quantised first (h's rows into xq, g's pair rows into gq) */
    const bool gv = path == OP_MM_GEMV, gi8 = gv && moe_i8(e, &L->w_gate_exps, d);
    const bool ui8 = gv && moe_i8(e, &L->w_up_exps, d), di8 = gv && s->moe_gq && moe_i8(e, &L->w_down_exps, ff);
    const vkd_view xq = vkd_whole(s->xq), gq = di8 ? vkd_whole(s->moe_gq) : (vkd_view){0};
    *left_q = h_q || gi8 || ui8; /* g's copies go to their own buffers (moe_gq, moe_gh) */
    if ((gi8 || ui8) && !h_q) {
        vkd_role(c, "ffn_moe_xq");
        TRY(op_quant_x8(c, h, d, n, d, xq));
        vkd_barrier(c);
    }
    /* the tensor-core GEMM: h's rows and then g's rounded to F16 once (s->xh; s->moe_gh, by the
     * gated unit itself unless op by op) */
    const bool xh = moe_xh(e, path);
    *left_h = h_h || xh;
    if (xh && !h_h) {
        vkd_role(c, "ffn_moe_xh");
        TRY(op_half_x(c, h, d, n, d, vkd_whole(s->xh)));
        vkd_barrier(c);
    }
    vkd_role(c, "ffn_gate_exps");
    if (gi8)
        TRY(op_matmul_id_i8(c, &L->w_gate_exps, E, ids, xq, k, vkd_whole(s->moe_g), ff, P));
    else if (xh)
        TRY(op_matmul_id_xh(c, &L->w_gate_exps, E, route, vkd_whole(s->xh), k, vkd_whole(s->moe_g), ff, P, n));
    else
        TRY(op_matmul_id(c, &L->w_gate_exps, E, ids, route, h, d, k, vkd_whole(s->moe_g), ff, P, n, path));
    vkd_role(c, "ffn_up_exps");
    if (ui8)
        TRY(op_matmul_id_i8(c, &L->w_up_exps, E, ids, xq, k, vkd_whole(s->moe_u), ff, P));
    else if (xh)
        TRY(op_matmul_id_xh(c, &L->w_up_exps, E, route, vkd_whole(s->xh), k, vkd_whole(s->moe_u), ff, P, n));
    else
        TRY(op_matmul_id(c, &L->w_up_exps, E, ids, route, h, d, k, vkd_whole(s->moe_u), ff, P, n, path));
    vkd_barrier(c);
    vkd_role(c, "ffn_act");
    const bool gh = xh && !e->p.no_fusion; /* the gated unit writes down's F16 input (only) */
    /* gpt-oss: the experts' gate and up biases by the gated unit, down's by the combine */
    op_expert_bias gub = {0}, db = {0};
    if (eb) {
        gub = (op_expert_bias){ids, {vkd_whole(L->b_gate_exps.parts[0].buf), vkd_whole(L->b_up_exps.parts[0].buf)}, E};
        db = (op_expert_bias){ids, {vkd_whole(L->b_down_exps.parts[0].buf)}, E};
    }
    if (gh)
        TRY(op_glu_xh_ex(c, hp->expert_act, op_mat_rows(s->moe_g, ff), op_mat_rows(s->moe_u, ff),
                         vkd_whole(s->moe_gh), P, ff, eb ? &gub : NULL));
    else
        TRY(op_glu_ex(c, hp->expert_act, op_mat_rows(s->moe_g, ff), op_mat_rows(s->moe_u, ff),
                      op_mat_rows(s->moe_g, ff), P, ff, eb ? &gub : NULL));
    vkd_barrier(c);
    if (di8) {
        vkd_role(c, "ffn_moe_gq");
        TRY(op_quant_x8(c, vkd_whole(s->moe_g), ff, P, ff, gq));
        vkd_barrier(c);
    }
    if (xh && !gh) {
        vkd_role(c, "ffn_moe_gh");
        TRY(op_half_x(c, vkd_whole(s->moe_g), ff, P, ff, vkd_whole(s->moe_gh)));
        vkd_barrier(c);
    }
    vkd_role(c, "ffn_down_exps");
    if (di8)
        TRY(op_matmul_id_i8(c, &L->w_down_exps, E, ids, gq, 1, vkd_whole(s->moe_o), d, P));
    else if (xh)
        TRY(op_matmul_id_xh(c, &L->w_down_exps, E, route, vkd_whole(s->moe_gh), 1, vkd_whole(s->moe_o), d, P, n));
    else
        TRY(op_matmul_id(c, &L->w_down_exps, E, ids, route, vkd_whole(s->moe_g), ff, 1, vkd_whole(s->moe_o), d, P,
                         n, path));
    vkd_barrier(c);
    vkd_role(c, "ffn_moe_combine");
    TRY(op_moe_combine(c, vkd_whole(s->moe_o), w, x, n, k, d, eb ? &db : NULL));
    vkd_barrier(c);
    return VKI_OK;
}

vki_status vk_forward_moe(vk_engine *e, uint32_t il, uint32_t T)
{
    const vk_layer *L = &e->model.layers[il];
    const bool h_q = e->xq_of_h && T <= e->s.moe_rows; /* one chunk: rows [0, T) of xq are h's */
    const bool h_h = e->xh_ready && T <= e->s.moe_rows; /* ... of xh */
    e->xq_of_h = e->xh_ready = false;
    bool left_q = false, left_h = false;
    for (uint32_t t0 = 0; t0 < T; t0 += e->s.moe_rows) {
        uint32_t n = T - t0 < e->s.moe_rows ? T - t0 : e->s.moe_rows;
        TRY(moe_chunk(e, L, t0, n, h_q, h_h, &left_q, &left_h));
    }
    /* one chunk: h's int8 / F16 rows [0, T) are still there for granitemoe's shared expert */
    if (e->model.hp.shared_expert && T <= e->s.moe_rows)
        e->xq_of_h = left_q, e->xh_ready = left_h;
    return VKI_OK;
}
