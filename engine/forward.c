/* The forward pass of one step, recorded into the step's command buffer. Reads like the model
 * (the bracketed steps are per architecture, see model_hparams):
 *
 *   x = embed(tokens) [* sqrt(d): gemma]                    x: [T][d]
 *       [granite: * embedding_scale / residual_scale: the stream holds x / residual_scale, so
 *        each block adds its output unscaled; the norms over it take rms_eps / residual_scale^2]
 *   for each layer:
 *     h = rmsnorm(x) * attn_norm                            [olmo2: h = x; command-r: LayerNorm;
 *                                                            starcoder2: + attn_norm.bias]
 *     q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv)          [T][n_head*hd], [T][n_kv*hd] x2
 *               (one h Wqkv, sliced, where the matrices share a type: phi3's, or
 *                concatenated at load; V apart when its type differs)
 *     [qwen3, gemma3: q, k = rmsnorm per head * q_norm, k_norm; olmo2: over their whole rows]
 *     q, k = rope(q, pos), rope(k, pos)                     (the layer kind's base and scale;
 *                                                            smollm3: not on every 4th layer)
 *     K/V pages <- k, v                                     (each token at its position; k's
 *                                                            rope done by this write, in the
 *                                                            stage of q's)
 *     att = attention(q, K/V pages of its sequence)         [T][n_head*hd]
 *           (the layer kind's window and sink; gemma2's soft-cap; a decode sequence's splits
 *            merged by the last one to finish; in a decode step the attention rotates q
 *            itself and reads each new key from k, v, in the stage of the K/V write)
 *           [gpt-oss: each head's sink logit in its softmax's denominator]
 *     x = x + att Wo (+ bo: gpt-oss)                        (added by the matmul; for one
 *                                                            token its last workgroup also
 *                                                            writes the next rmsnorm, below)
 *         [gemma, olmo2: x = x + rmsnorm(att Wo) * post_attention_norm]
 *     h = rmsnorm(x) * ffn_norm                             [olmo2: h = x; command-r: the
 *                                                            attention's h (x before its add)]
 *     o = (act(h Wgate) * (h Wup)) Wdown                    act: silu, gemma: tanh-GELU
 *         [starcoder2: o = gelu(h Wup + b_up) Wdown + b_down]
 *         (gate | up from one h Wup where they share a type: phi3's, or concatenated at load;
 *          then in decode the matrix-vector pass applies act and the product itself)
 *         [gemma, olmo2: o = rmsnorm(o) * post_ffw_norm]
 *         [qwen3moe, Mixtral: o = sum over the token's top-k experts e of
 *          w_e (silu(h Wgate_e) * (h Wup_e)) Wdown_e  (engine/forward_moe.c)]
 *     x = x + o                                             (added by the down projection's
 *                                                            matmul; MoE: by the combine)
 *   logits = (rmsnorm(x[rows that want a token]) * output_norm) Wout     [R][vocab] [phi2: + b]
 *            [granite: logits / logit_scale; command-r: * logit_scale]
 *            [gemma2: logits = 30 tanh(logits / 30)]
 *
 * A barrier separates each stage from the next; independent dispatches of one stage (Q, K, V
 * projections; gate and up) share one. vkd_role names what the next dispatches compute, for the
 * debug labels and the profile ("layer 3 / attn_q / matvec_q4_k"); its prefix (embed, attn, ffn,
 * lm) is the step phase the profile groups it under. */
#include <math.h>

#include "engine/engine.h"
#include "engine/ops_basic.h"
#include "engine/ops_matmul.h"

#define TRY VK_TRY

static vkd_view in_view(const vk_engine *e, VkDeviceSize off, VkDeviceSize bytes)
{
    return (vkd_view){e->in.dev, off, bytes ? bytes : 4};
}

/* Every matmul of the forward pass: batch-invariant engines use the matrix-vector kernel for
 * any number of rows (its per-row arithmetic does not depend on the other rows). */
static vki_status mm_to(vk_engine *e, const vk_tensor *w, const vkd_view *bias, vkd_view x, uint32_t x_stride,
                        vkd_view y, uint32_t y_stride, uint32_t M, bool accumulate)
{
    return op_matmul_ex(e->cmd, w, bias, x, x_stride, y, y_stride, M,
                        e->p.batch_invariant ? OP_MM_GEMV : OP_MM_AUTO, accumulate);
}

/* int_dot: whether a product of M rows by w takes the integer-dot path (the matrix-vector
 * kernel's rows, a weight type it runs). */
static bool use_i8(const vk_engine *e, const vk_tensor *w, uint32_t M)
{
    return e->p.int_dot && w->n_parts && op_matmul_i8_supported(e->dev, w->type) &&
           (e->p.batch_invariant || M <= op_matmul_gemv_max_m(e->dev));
}

/* The input of the next integer-dot products, [M][K] at x (stride x_stride), quantised into
 * s->xq, and the barrier after it (the role: what it feeds, "_xq"). */
static vki_status quant_x(vk_engine *e, const char *role, vkd_view x, uint32_t x_stride, uint32_t M, uint32_t K)
{
    e->xq_of_h = false;
    vkd_role(e->cmd, role);
    TRY(op_quant_x8(e->cmd, x, x_stride, M, K, vkd_whole(e->s.xq)));
    vkd_barrier(e->cmd);
    return VKI_OK;
}

/* Whether a product of M rows by w takes the tensor-core GEMM with its input rounded to F16 once
 * (op_matmul_takes_xh) into s->xh: by the kernel that writes the input (block_norm's and the LM
 * head's norms, the gated unit before down: e->xh_ready) or by half_x. */
static bool use_xh(const vk_engine *e, const vk_tensor *w, uint32_t M)
{
    return e->s.xh && w->n_parts && !e->p.batch_invariant && !use_i8(e, w, M) && op_matmul_takes_xh(e->dev, M);
}

/* The input of the next tensor-core GEMMs, [M][K] at x (stride x_stride), rounded to F16 into
 * s->xh, and the barrier after it (the role: what it feeds, "_xh"). */
static vki_status half_x(vk_engine *e, const char *role, vkd_view x, uint32_t x_stride, uint32_t M, uint32_t K)
{
    vkd_role(e->cmd, role);
    TRY(op_half_x(e->cmd, x, x_stride, M, K, vkd_whole(e->s.xh)));
    vkd_barrier(e->cmd);
    return VKI_OK;
}

/* mm_to, on the integer-dot path where use_i8 says so (its input quantised in xq: by quant_x
 * into s->xq, or by the kernel that wrote it), on the tensor-core GEMM with F16 X where use_xh
 * says so (its input in s->xh: by half_x or by the kernel that wrote it). */
static vki_status mm_q(vk_engine *e, const vk_tensor *w, const vkd_view *bias, vkd_view x, uint32_t x_stride,
                       vkd_buffer *xq, vkd_view y, uint32_t y_stride, uint32_t M, bool accumulate)
{
    if (use_i8(e, w, M)) {
        op_mm_i8 o = {.bias = bias, .accumulate = accumulate};
        return op_matmul_i8(e->cmd, w, vkd_whole(xq), y, y_stride, M, &o);
    }
    if (use_xh(e, w, M))
        return op_matmul_xh(e->cmd, w, bias, vkd_whole(e->s.xh), y, y_stride, M, accumulate);
    return mm_to(e, w, bias, x, x_stride, y, y_stride, M, accumulate);
}

/* RMSNorm of rows in place (y = x) with a weight tensor. */
static vki_status norm_rows(vk_engine *e, op_mat x, const vk_tensor *w, uint32_t rows, uint32_t cols)
{
    return op_rmsnorm(e->cmd, x, vkd_whole(w->parts[0].buf), x, rows, cols, e->model.hp.rms_eps);
}

/* A bias or other f32 vector of the layer as a view, NULL when the model has none (b NULL or
 * not loaded). */
static const vkd_view *bias_view(const vk_tensor *b, vkd_view *tmp)
{
    if (!b || !b->n_parts)
        return NULL;
    *tmp = vkd_whole(b->parts[0].buf);
    return tmp;
}

/* x = x + o: the block's output projection (o = in W^T (+ bias: gpt-oss's attn_output.bias, or
 * NULL), in: [T][in_stride]) added to the residual stream by the matmul itself, or, where a norm
 * comes between (gemma's post-norms) or with no_fusion, through tmp (s->h; command-r's
 * attention: s->o), [the norm] and an add. With
 * next_norm (the next block's input norm) and one token, the projection's last workgroup also
 * writes h = rmsnorm(x) * next_norm (not command-r's LayerNorm)
 * (op_matmul_norm) and *normed tells the next block to skip its norm; when that block's products
 * take the integer-dot path (next_i8) the same workgroup quantises h into s->xq too
 * (e->xq_of_h). On the integer-dot path (int_dot) `in` is quantised first into s->xq (x_roles[0])
 * unless in_q (the buffer where the kernel that wrote `in` quantised it too); on the tensor-core
 * GEMM rounded to F16 into s->xh (x_roles[1]). Ends with a barrier. */
static vki_status project_residual(vk_engine *e, const vk_tensor *w, const vk_tensor *bias, vkd_view in,
                                   uint32_t in_stride, uint32_t T, vkd_buffer *in_q, vkd_buffer *tmp,
                                   const char *mm_role,
                                   const char *const x_roles[2], const vk_tensor *post_norm, const char *post_role,
                                   const char *add_role, const vk_tensor *next_norm, bool next_i8, bool *normed)
{
    const model_hparams *hp = &e->model.hp;
    vk_scratch *s = &e->s;
    vkd_cmd *c = e->cmd;
    uint32_t d = hp->d_model;
    *normed = false;
    const bool i8 = use_i8(e, w, T);
    if (i8 && !in_q)
        TRY(quant_x(e, x_roles[0], in, in_stride, T, (uint32_t)w->ne0));
    if (use_xh(e, w, T) && !e->xh_ready) /* else the kernel that wrote `in` wrote it */
        TRY(half_x(e, x_roles[1], in, in_stride, T, (uint32_t)w->ne0));
    e->xh_ready = false;
    vkd_buffer *xq = in_q ? in_q : s->xq;
    vkd_view bt;
    const vkd_view *b = bias_view(bias, &bt);
    vkd_role(c, mm_role);
    if (!hp->post_norms && !e->p.no_fusion) {
        if (next_norm && T == 1 && !hp->layer_norm && op_matmul_norm_fits(e->dev, w)) {
            op_mm_norm n = {vkd_whole(next_norm->parts[0].buf), vkd_whole(s->h), vkd_whole(s->mm_cnt), hp->resid_eps,
                            .xq = next_i8 && d % 32 == 0 ? vkd_whole(s->xq) : (vkd_view){0}};
            if (i8) {
                op_mm_i8 o = {.bias = b, .accumulate = true, .norm = &n};
                TRY(op_matmul_i8(c, w, vkd_whole(xq), vkd_whole(s->x), d, 1, &o));
            } else {
                TRY(op_matmul_norm(c, w, b, in, vkd_whole(s->x), &n));
            }
            *normed = true;
            e->xq_of_h = n.xq.buf != NULL;
        } else {
            TRY(mm_q(e, w, b, in, in_stride, xq, vkd_whole(s->x), d, T, true));
        }
        vkd_barrier(c);
        return VKI_OK;
    }
    TRY(mm_q(e, w, b, in, in_stride, xq, vkd_whole(tmp), d, T, false));
    vkd_barrier(c);
    if (hp->post_norms) {
        vkd_role(c, post_role);
        TRY(norm_rows(e, op_mat_rows(tmp, d), post_norm, T, d));
        vkd_barrier(c);
    }
    vkd_role(c, add_role);
    TRY(op_add(c, vkd_whole(s->x), vkd_whole(tmp), vkd_whole(s->x), T * d));
    vkd_barrier(c);
    return VKI_OK;
}

/* Whether a block's first products take the integer-dot path (their input h quantised first):
 * the attention's Q, K, V, the FFN's gate and up (a mixture of experts': vk_moe_h_i8); and
 * whether they take the tensor-core GEMM with h in F16 (a mixture of experts': vk_moe_h_xh, one
 * chunk; with more each chunk rounds its rows itself). */
static bool qkv_i8(const vk_engine *e, const vk_layer *L, uint32_t T)
{
    return use_i8(e, &L->wqkv, T) || use_i8(e, &L->wq, T) || use_i8(e, &L->wk, T) || use_i8(e, &L->wv, T);
}

/* The dense FFN's (or the shared expert's) gate and up. */
static bool dense_i8(const vk_engine *e, const vk_layer *L, uint32_t T)
{
    return use_i8(e, &L->w_up, T) || use_i8(e, &L->w_gate, T);
}

static bool dense_xh(const vk_engine *e, const vk_layer *L, uint32_t T)
{
    return use_xh(e, &L->w_up, T) || use_xh(e, &L->w_gate, T);
}

/* The FFN's first products: the experts' where there are (granitemoe's shared expert after them
 * reads the int8 / F16 copies of h they made, or makes its own). */
static bool ffn_i8(const vk_engine *e, const vk_layer *L, uint32_t T)
{
    return e->model.hp.n_expert ? vk_moe_h_i8(e, L, T) : dense_i8(e, L, T);
}

static bool qkv_xh(const vk_engine *e, const vk_layer *L, uint32_t T)
{
    return use_xh(e, &L->wqkv, T) || use_xh(e, &L->wq, T) || use_xh(e, &L->wk, T) || use_xh(e, &L->wv, T);
}

static bool ffn_xh(const vk_engine *e, const vk_layer *L, uint32_t T)
{
    return e->model.hp.n_expert ? vk_moe_h_xh(e, T) : dense_xh(e, L, T);
}

/* A block's input norm, h = rmsnorm(x) * w over T rows (command-r: its LayerNorm), and the
 * barrier after it; where the
 * block's first products take the integer-dot path (i8) it also quantises h into s->xq
 * (e->xq_of_h), where they take the tensor-core GEMM (xh) it also rounds h to F16 into s->xh
 * (e->xh_ready); not op by op: no_fusion keeps quant_x8's and half_x's passes. */
static vki_status block_norm(vk_engine *e, const vk_tensor *w, uint32_t T, bool i8, bool xh)
{
    vk_scratch *s = &e->s;
    uint32_t d = e->model.hp.d_model;
    bool q = i8 && !e->p.no_fusion && d % 32 == 0, h16 = xh && !q && !e->p.no_fusion;
    TRY(op_norm_xh(e->cmd, model_norm_mode(&e->model.hp), op_mat_rows(s->x, d), vkd_whole(w->parts[0].buf),
                   op_mat_rows(s->h, d), T, d, e->model.hp.resid_eps, q ? vkd_whole(s->xq) : (vkd_view){0},
                   h16 ? vkd_whole(s->xh) : (vkd_view){0}));
    e->xq_of_h = q;
    e->xh_ready = h16;
    vkd_barrier(e->cmd);
    return VKI_OK;
}

/* A block's input h: its norm (block_norm), or with no_pre_norms (olmo2) x itself, copied into h
 * (the products read h), and the barrier after it. */
static vki_status block_input(vk_engine *e, const vk_tensor *w, uint32_t T, bool i8, bool xh)
{
    if (!e->model.hp.no_pre_norms)
        return block_norm(e, w, T, i8, xh);
    const VkDeviceSize bytes = (VkDeviceSize)T * e->model.hp.d_model * 4;
    e->xq_of_h = e->xh_ready = false; /* the products' int8 / F16 copies by their own passes */
    TRY(op_copy(e->cmd, (vkd_view){e->s.x, 0, bytes}, (vkd_view){e->s.h, 0, bytes}, bytes));
    vkd_barrier(e->cmd);
    return VKI_OK;
}

/* The byte offset of K's head-norm counters in s->mm_cnt, after Q's (Q's and K's projections
 * run in one stage, so their counters are apart), at the device's storage offset alignment. */
static uint64_t k_norm_counters(const vk_engine *e)
{
    uint64_t a = e->dev->info.min_storage_buffer_offset_alignment ? e->dev->info.min_storage_buffer_offset_alignment
                                                                   : 4;
    return (4ull * e->model.hp.n_head + a - 1) / a * a;
}

/* Whether a step of one token normalises Q's and K's heads in their projections' last
 * workgroups (op_matmul_head_norm) instead of two norm dispatches and a barrier after them. */
static bool head_norms_fused(const vk_engine *e, const vk_layer *L, uint32_t T)
{
    const model_hparams *hp = &e->model.hp;
    return T == 1 && hp->qk_norm && !hp->qk_norm_full && !e->p.no_fusion && !L->wqkv.n_parts && !L->bq.n_parts &&
           !L->bk.n_parts &&
           op_matmul_head_norm_fits(e->dev, &L->wq, hp->head_dim) &&
           op_matmul_head_norm_fits(e->dev, &L->wk, hp->head_dim) &&
           k_norm_counters(e) + 4ull * hp->n_head_kv <= e->s.mm_cnt->size;
}

/* The Q or K projection of one token, its heads normalised by nw in its epilogue (its counters
 * from byte cnt0 of s->mm_cnt on). */
static vki_status mm_head_norm(vk_engine *e, const vk_tensor *w, vkd_view y, const vk_tensor *nw, uint64_t cnt0)
{
    const model_hparams *hp = &e->model.hp;
    vk_scratch *s = &e->s;
    const uint32_t N = (uint32_t)w->n_rows;
    op_mm_head_norm n = {vkd_whole(nw->parts[0].buf), {s->mm_cnt, cnt0, 4ull * (N / hp->head_dim)}, hp->rms_eps,
                         hp->head_dim};
    if (use_i8(e, w, 1)) {
        op_mm_i8 o = {.head_norm = &n};
        return op_matmul_i8(e->cmd, w, vkd_whole(s->xq), y, N, 1, &o);
    }
    return op_matmul_head_norm(e->cmd, w, vkd_whole(s->h), y, &n);
}

/* q, k, v projections into the scratch; *q, *k, *v are where each landed. A layer whose Q|K(|V)
 * are one matrix (phi3's attn_qkv, or concatenated at load) writes one [T][q | k (| v)] matrix,
 * sliced by offsets; v comes from its own matrix where its type differed. head_norms: Q's and K's
 * heads normalised in their projections (head_norms_fused). */
static vki_status project_qkv(vk_engine *e, const vk_layer *L, uint32_t T, bool head_norms, op_mat *q, op_mat *k,
                              op_mat *v)
{
    const model_hparams *hp = &e->model.hp;
    vk_scratch *s = &e->s;
    uint32_t d = hp->d_model, qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    vkd_view b;
    if (qkv_i8(e, L, T) && !e->xq_of_h) /* else the previous projection's norm epilogue wrote it */
        TRY(quant_x(e, "attn_xq", vkd_whole(s->h), d, T, d));
    e->xq_of_h = false;
    if (qkv_xh(e, L, T) && !e->xh_ready) /* else the norm wrote it */
        TRY(half_x(e, "attn_xh", vkd_whole(s->h), d, T, d));
    e->xh_ready = false;
    if (L->wqkv.n_parts) {
        uint32_t w = (uint32_t)L->wqkv.n_rows;
        *q = (op_mat){vkd_whole(s->q), 0, w}, *k = (op_mat){vkd_whole(s->q), qd, w};
        vkd_role(e->cmd, w > qd + kvd ? "attn_qkv" : "attn_qk");
        TRY(mm_q(e, &L->wqkv, bias_view(&L->bq, &b), vkd_whole(s->h), d, s->xq, vkd_whole(s->q), w, T, false));
        if (w > qd + kvd) {
            *v = (op_mat){vkd_whole(s->q), qd + kvd, w};
            return VKI_OK;
        }
    } else if (head_norms) { /* decode of qwen3, gemma3: the norms ride along */
        *q = op_mat_rows(s->q, qd), *k = op_mat_rows(s->k, kvd);
        vkd_role(e->cmd, "attn_q_normed");
        TRY(mm_head_norm(e, &L->wq, vkd_whole(s->q), &L->q_norm, 0));
        vkd_role(e->cmd, "attn_k_normed");
        TRY(mm_head_norm(e, &L->wk, vkd_whole(s->k), &L->k_norm, k_norm_counters(e)));
    } else {
        *q = op_mat_rows(s->q, qd), *k = op_mat_rows(s->k, kvd);
        vkd_role(e->cmd, "attn_q");
        TRY(mm_q(e, &L->wq, bias_view(&L->bq, &b), vkd_whole(s->h), d, s->xq, vkd_whole(s->q), qd, T, false));
        vkd_role(e->cmd, "attn_k");
        TRY(mm_q(e, &L->wk, bias_view(&L->bk, &b), vkd_whole(s->h), d, s->xq, vkd_whole(s->k), kvd, T, false));
    }
    *v = op_mat_rows(s->v, kvd);
    vkd_role(e->cmd, "attn_v");
    return mm_q(e, &L->wv, bias_view(&L->bv, &b), vkd_whole(s->h), d, s->xq, vkd_whole(s->v), kvd, T, false);
}

/* *normed: on entry, h already holds the block's normed input (the previous projection wrote
 * it); on return, whether the output projection wrote the FFN's. one_each: every sequence of the
 * step has one new token (a decode step). */
static vki_status record_attention_block(vk_engine *e, uint32_t il, uint32_t T, const op_attn_step *ast,
                                         bool one_each, bool *normed)
{
    const model_hparams *hp = &e->model.hp;
    const vk_layer *L = &e->model.layers[il];
    vk_scratch *s = &e->s;
    vkd_cmd *c = e->cmd;
    uint32_t qd = hp->n_head * hp->head_dim, kind = model_layer_kind(hp, il);
    const bool rope = model_layer_rope(hp, il); /* smollm3's NoPE layers: q and k as projected */
    op_mat q, k, v;
    /* command-r: the FFN reads this block's h (and its int8 copy, kept in s->xq while the output
     * projection's input is quantised into s->gq where that fits) */
    const bool par = hp->parallel_ffn;
    vkd_buffer *oq = par && e->s.gq && e->s.gq->size >= op_quant_x8_bytes(e->p.max_tokens, qd) ? e->s.gq : e->s.xq;
    if (!*normed) {
        vkd_role(c, hp->no_pre_norms ? "attn_in" : "attn_norm");
        TRY(block_input(e, &L->attn_norm, T, qkv_i8(e, L, T) || (oq != s->xq && ffn_i8(e, L, T)),
                        qkv_xh(e, L, T)));
    }
    const bool h_q = e->xq_of_h && oq != s->xq;
    const bool head_norms = head_norms_fused(e, L, T);
    TRY(project_qkv(e, L, T, head_norms, &q, &k, &v));
    vkd_barrier(c);
    if (hp->qk_norm_full) { /* olmo2: q's and k's whole rows */
        vkd_role(c, "attn_qk_norm");
        TRY(norm_rows(e, q, &L->q_norm, T, qd));
        TRY(norm_rows(e, k, &L->k_norm, T, hp->n_head_kv * hp->head_dim));
        vkd_barrier(c);
    } else if (hp->qk_norm && !head_norms) { /* rows of head_dim: q and k are unfused here */
        vkd_role(c, "attn_qk_norm");
        TRY(norm_rows(e, (op_mat){q.v, 0, hp->head_dim}, &L->q_norm, T * hp->n_head, hp->head_dim));
        TRY(norm_rows(e, (op_mat){k.v, 0, hp->head_dim}, &L->k_norm, T * hp->n_head_kv, hp->head_dim));
        vkd_barrier(c);
    }
    op_rope_p rq = {.n_tokens = T, .n_heads = hp->n_head, .head_dim = hp->head_dim, .n_rot = hp->n_rot,
                    .neox = hp->rope_neox};
    op_rope_p rk = rq;
    rk.n_heads = hp->n_head_kv;
    vkd_view freqs = vkd_whole(s->rope_freqs[kind]);
    op_kv_rope kr = {.n_rot = hp->n_rot, .neox = hp->rope_neox, .freqs = freqs};
    /* decode (fused): the attention rotates q and reads each sequence's new K / V from the
     * projection as the cache write stores them, so the write runs beside it (op_attn_fresh) */
    bool fresh = !e->p.no_fusion && one_each;
    /* integer-dot output projection: the attention writes its output's int8 copy too */
    bool att_q = fresh && use_i8(e, &L->wo, T) && hp->head_dim % 32 == 0;
    op_attn_fresh fr = {k, v, rope ? &kr : NULL, att_q ? vkd_whole(oq) : (vkd_view){0}};
    if (rope && e->p.no_fusion) {
        vkd_role(c, "attn_rope_q");
        TRY(op_rope(c, &rq, q, q, ast[kind].tok_pos, freqs));
        vkd_role(c, "attn_rope_k");
        TRY(op_rope(c, &rk, k, k, ast[kind].tok_pos, freqs));
        vkd_barrier(c);
    } else if (rope && !fresh) { /* K is rotated by the cache write: one stage, no barrier between */
        vkd_role(c, "attn_rope_q");
        TRY(op_rope(c, &rq, q, q, ast[kind].tok_pos, freqs));
    }
    vkd_role(c, "attn_kv_write");
    TRY(op_kv_write(c, &e->attn[kind], &ast[kind], k, v, vkd_whole(e->k_pool[il]), vkd_whole(e->v_pool[il]),
                    e->p.no_fusion || !rope ? NULL : &kr));
    if (!fresh)
        vkd_barrier(c);
    vkd_role(c, "attn");
    vkd_view merge = vkd_whole(s->attn_cnt), sinks; /* the last decode split merges (no reduce pass) */
    TRY(op_attention(c, &e->attn[kind], &ast[kind], q, op_mat_rows(s->att, qd), vkd_whole(e->k_pool[il]),
                     vkd_whole(e->v_pool[il]), vkd_whole(s->attn_tmp), e->p.no_fusion ? NULL : &merge,
                     fresh ? &fr : NULL, bias_view(&L->attn_sinks, &sinks)));
    vkd_barrier(c);
    static const char *const o_roles[2] = {"attn_o_xq", "attn_o_xh"};
    bool in_q = att_q;
    if (!att_q && oq != s->xq && use_i8(e, &L->wo, T)) { /* quant_x's pass, into oq */
        vkd_role(c, o_roles[0]);
        TRY(op_quant_x8(c, vkd_whole(s->att), qd, T, qd, vkd_whole(oq)));
        vkd_barrier(c);
        in_q = true;
    }
    /* command-r: nothing writes the FFN's norm into h, and the projection's op-by-op output goes
     * to s->o */
    TRY(project_residual(e, &L->wo, &L->bo, vkd_whole(s->att), qd, T, in_q ? oq : NULL, par ? s->o : s->h, "attn_o",
                         o_roles, &L->post_attn_norm, "attn_post_norm", "attn_residual", par ? NULL : &L->ffn_norm,
                         ffn_i8(e, L, T), normed));
    if (par)
        e->xq_of_h = h_q; /* s->xq still holds h's int8 copy for the FFN */
    return VKI_OK;
}

/* starcoder2's FFN, down(gelu(h Wup + b_up)) + b_down (nemotron, arcee: max(., 0)^2 for gelu,
 * biases where the file has them), as record_ffn_block's dense one. */
static vki_status record_ffn_plain(vk_engine *e, const vk_layer *L, uint32_t T, const vk_tensor *next_norm,
                                   bool next_i8, bool *normed)
{
    vk_scratch *s = &e->s;
    vkd_cmd *c = e->cmd;
    const uint32_t d = e->model.hp.d_model, ff = e->model.hp.d_ff;
    vkd_view b;
    if (dense_i8(e, L, T) && !e->xq_of_h) /* else the norm wrote it */
        TRY(quant_x(e, "ffn_xq", vkd_whole(s->h), d, T, d));
    e->xq_of_h = false;
    if (dense_xh(e, L, T) && !e->xh_ready)
        TRY(half_x(e, "ffn_xh", vkd_whole(s->h), d, T, d));
    e->xh_ready = false;
    vkd_role(c, "ffn_up");
    TRY(mm_q(e, &L->w_up, bias_view(&L->b_up, &b), vkd_whole(s->h), d, s->xq, vkd_whole(s->g), ff, T, false));
    vkd_barrier(c);
    vkd_role(c, "ffn_act");
    /* where down takes the integer-dot path the GELU also writes its output's int8 copy (s->gq) */
    const bool gq = use_i8(e, &L->w_down, T) && !e->p.no_fusion && ff % 32 == 0 && s->gq &&
                    s->gq->size >= op_quant_x8_bytes(T, ff);
    TRY(op_unary_xq(c, e->model.hp.ffn_relu2 ? VKI_UNARY_RELU2 : VKI_UNARY_GELU, 0.0f, op_mat_rows(s->g, ff),
                    op_mat_rows(s->g, ff), T, ff,
                    gq ? vkd_whole(s->gq) : (vkd_view){0}));
    vkd_barrier(c);
    static const char *const down_roles[2] = {"ffn_down_xq", "ffn_down_xh"};
    return project_residual(e, &L->w_down, &L->b_down, vkd_whole(s->g), ff, T, gq ? s->gq : NULL, s->h, "ffn_down",
                            down_roles, &L->post_ffn_norm, "ffn_post_norm", "ffn_residual", next_norm, next_i8, normed);
}

/* *normed as for record_attention_block (the next layer's attention norm on return). */
static vki_status record_ffn_block(vk_engine *e, uint32_t il, uint32_t T, bool *normed)
{
    const model_hparams *hp = &e->model.hp;
    const vk_layer *L = &e->model.layers[il];
    vk_scratch *s = &e->s;
    vkd_cmd *c = e->cmd;
    bool one = !L->w_gate.n_parts; /* gate | up in w_up (phi3's, or concatenated at load) */
    uint32_t d = hp->d_model, ff = hp->d_ff, gs = one ? 2 * ff : ff;
    op_mat g = {vkd_whole(s->g), 0, gs}, u = one ? (op_mat){vkd_whole(s->g), ff, gs} : op_mat_rows(s->u, ff);
    const vk_tensor *next_norm = il + 1 < hp->n_layer ? &e->model.layers[il + 1].attn_norm : NULL;
    bool next_i8 = next_norm && qkv_i8(e, &e->model.layers[il + 1], T);
    static const char *const down_roles[2] = {"ffn_down_xq", "ffn_down_xh"};
    if (!*normed && !hp->parallel_ffn) { /* command-r: h holds the attention's input */
        vkd_role(c, hp->no_pre_norms ? "ffn_in" : "ffn_norm");
        TRY(block_input(e, &L->ffn_norm, T, ffn_i8(e, L, T), ffn_xh(e, L, T)));
    }
    *normed = false;
    if (hp->n_expert) /* qwen3moe, Mixtral: engine/forward_moe.c */
        TRY(vk_forward_moe(e, il, T));
    if (hp->n_expert && !hp->shared_expert)
        return VKI_OK;
    if (hp->ffn_plain)
        return record_ffn_plain(e, L, T, next_norm, next_i8, normed);
    /* the dense FFN, or granitemoe's shared expert (the experts added theirs to x already) */
    uint32_t act = hp->ffn_gelu ? VKI_GLU_GELU_TANH : VKI_GLU_SILU;
    if (dense_i8(e, L, T) && !e->xq_of_h) /* else the attention's output projection wrote it */
        TRY(quant_x(e, "ffn_xq", vkd_whole(s->h), d, T, d));
    e->xq_of_h = false;
    if (one && !e->p.no_fusion && L->w_up.n_parts == 1 &&
        (e->p.batch_invariant || T <= op_matmul_gemv_max_m(e->dev))) {
        /* decode: the matrix-vector pass writes act(gate) * up itself, [T][ff], and where down
         * takes the integer-dot path its int8 copy too (s->gq); no F16 copy of h is read here,
         * and one the experts left must not pass for down's input */
        e->xh_ready = false;
        vkd_role(c, "ffn_gate_up");
        const bool gq = use_i8(e, &L->w_down, T) && op_matmul_glu_xq_fits(e->dev, &L->w_up);
        const op_mm_glu_xq gx = {vkd_whole(s->mm_cnt), gq ? vkd_whole(s->gq) : (vkd_view){0}};
        if (use_i8(e, &L->w_up, T)) {
            op_mm_i8 o = {.glu = true, .act = act, .glu_xq = gq ? &gx : NULL};
            TRY(op_matmul_i8(c, &L->w_up, vkd_whole(s->xq), vkd_whole(s->g), ff, T, &o));
        } else {
            TRY(op_matmul_glu(c, &L->w_up, act, vkd_whole(s->h), d, vkd_whole(s->g), ff, T, gq ? &gx : NULL));
        }
        vkd_barrier(c);
        return project_residual(e, &L->w_down, NULL, vkd_whole(s->g), ff, T, gq ? s->gq : NULL, s->h, "ffn_down",
                                down_roles, &L->post_ffn_norm, "ffn_post_norm", "ffn_residual", next_norm, next_i8,
                                normed);
    }
    if (dense_xh(e, L, T) && !e->xh_ready) /* else the norm wrote it */
        TRY(half_x(e, "ffn_xh", vkd_whole(s->h), d, T, d));
    e->xh_ready = false;
    if (!one) {
        vkd_role(c, "ffn_gate");
        TRY(mm_q(e, &L->w_gate, NULL, vkd_whole(s->h), d, s->xq, vkd_whole(s->g), ff, T, false));
    }
    vkd_role(c, one ? "ffn_gate_up" : "ffn_up");
    TRY(mm_q(e, &L->w_up, NULL, vkd_whole(s->h), d, s->xq, one ? vkd_whole(s->g) : vkd_whole(s->u), one ? gs : ff,
             T, false));
    vkd_barrier(c);
    vkd_role(c, "ffn_act");
    if (!e->p.no_fusion && use_xh(e, &L->w_down, T)) { /* down's input in F16 only: no half_x pass */
        TRY(op_glu_xh(c, act, g, u, vkd_whole(s->xh), T, ff));
        e->xh_ready = true;
    } else {
        TRY(op_glu(c, act, g, u, g, T, ff));
    }
    vkd_barrier(c);
    return project_residual(e, &L->w_down, NULL, vkd_whole(s->g), gs, T, NULL, s->h, "ffn_down", down_roles,
                            &L->post_ffn_norm, "ffn_post_norm", "ffn_residual", next_norm, next_i8, normed);
}

/* LM head on the rows listed at in->off_rows: gather, norm, project [, soft-cap]. */
vki_status vk_forward_record_lm_head(vk_engine *e, uint32_t T, uint32_t n_out)
{
    const model_hparams *hp = &e->model.hp;
    const vk_step_inputs *in = &e->in;
    vk_scratch *s = &e->s;
    vkd_cmd *c = e->cmd;
    uint32_t d = hp->d_model, ls = vk_engine_logits_stride(e);
    vkd_role(c, "lm_rows");
    TRY(op_gather_rows(c, vkd_whole(s->x), d, T, d, in_view(e, in->off_rows, (VkDeviceSize)n_out * 4), n_out,
                       vkd_whole(s->xs), d));
    vkd_barrier(c);
    vkd_role(c, "lm_norm");
    /* on the integer-dot path the norm also quantises its output (into s->xq), on the tensor-core
     * GEMM rounds it to F16 (into s->xh); then not in place: the normed rows go to h, n_out <= T
     * rows; op by op quant_x8 / half_x do it */
    const vk_tensor *head = vk_model_lm_head(&e->model);
    const bool i8 = use_i8(e, head, n_out), q = i8 && !e->p.no_fusion && d % 32 == 0;
    const bool xh = use_xh(e, head, n_out), h16 = xh && !e->p.no_fusion;
    vkd_buffer *xn = q || h16 ? s->h : s->xs;
    TRY(op_norm_xh(c, model_norm_mode(hp), op_mat_rows(s->xs, d), vkd_whole(e->model.output_norm.parts[0].buf),
                   op_mat_rows(xn, d), n_out, d, hp->resid_eps, q ? vkd_whole(s->xq) : (vkd_view){0},
                   h16 ? vkd_whole(s->xh) : (vkd_view){0}));
    vkd_barrier(c);
    if (i8 && !q)
        TRY(quant_x(e, "lm_xq", vkd_whole(xn), d, n_out, d));
    if (xh && !h16)
        TRY(half_x(e, "lm_xh", vkd_whole(xn), d, n_out, d));
    vkd_role(c, "lm_head");
    vkd_view hb;
    TRY(mm_q(e, head, bias_view(&e->model.output_b, &hb), vkd_whole(xn), d, s->xq, vkd_whole(s->logits), ls, n_out,
             false));
    if (hp->logit_mul != 1.0f) { /* granite, command-r */
        vkd_barrier(c);
        vkd_role(c, "lm_scale");
        TRY(op_unary(c, VKI_UNARY_SCALE, hp->logit_mul, op_mat_rows(s->logits, ls),
                     op_mat_rows(s->logits, ls), n_out, hp->n_vocab));
    }
    if (hp->final_softcap > 0) {
        vkd_barrier(c);
        vkd_role(c, "lm_softcap");
        TRY(op_unary(c, VKI_UNARY_SOFTCAP, hp->final_softcap, op_mat_rows(s->logits, ls), op_mat_rows(s->logits, ls),
                     n_out, hp->n_vocab));
    }
    return VKI_OK;
}

vki_status vk_forward_record(vk_engine *e, const vki_step_plan *plan, uint32_t n_out)
{
    const model_hparams *hp = &e->model.hp;
    const vk_step_inputs *in = &e->in;
    vk_scratch *s = &e->s;
    vkd_cmd *c = e->cmd;
    uint32_t T = plan->n_tokens, d = hp->d_model;
    op_attn_step ast[2];
    for (uint32_t k = 0; k < 2; k++) { /* one kind: both entries use the first work list */
        uint32_t kk = k < e->n_kinds ? k : 0;
        ast[k] = (op_attn_step){
            .tok_pos = in_view(e, in->off_pos, (VkDeviceSize)T * 4),
            .tok_seq = in_view(e, in->off_seq, (VkDeviceSize)T * 4),
            .seq_info = in_view(e, in->off_info, (VkDeviceSize)in->n_info * sizeof(vki_seq_info)),
            /* the whole table and item list, not the step's part, so that the recording of one
             * step shape does not change with the context (vkd_cmd reuse) */
            .page_table = in_view(e, in->off_pages, in->cap - in->off_pages),
            .items = in_view(e, in->off_items[kk], (VkDeviceSize)in->max_items * sizeof(vki_attn_item)),
            .plan = &e->attn_plan[kk]};
    }

    vkd_label_begin(c, "embed");
    vkd_role(c, "embed");
    TRY(op_get_rows(c, &e->model.tok_embd, in_view(e, in->off_tokens, (VkDeviceSize)T * 4), T, vkd_whole(s->x), d));
    if (hp->embd_mul != 1.0f) { /* gemma's sqrt(d), granite's multipliers */
        vkd_barrier(c);
        vkd_role(c, "embed_scale");
        TRY(op_unary(c, VKI_UNARY_SCALE, hp->embd_mul, op_mat_rows(s->x, d), op_mat_rows(s->x, d), T, d));
    }
    vkd_label_end(c);
    vkd_barrier(c);
    bool normed = false; /* h holds the next block's normed input already */
    e->xq_of_h = e->xh_ready = false; /* (a recording that failed half-way may have left them set) */
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        vkd_label_begin_n(c, "layer", il);
        vki_status st = record_attention_block(e, il, T, ast, plan->n_tokens == plan->n_seqs, &normed);
        if (st == VKI_OK)
            st = record_ffn_block(e, il, T, &normed);
        vkd_label_end(c);
        if (st != VKI_OK)
            return st;
    }
    if (!n_out)
        return VKI_OK;
    vkd_label_begin(c, "lm head");
    vki_status st = vk_forward_record_lm_head(e, T, n_out);
    vkd_label_end(c);
    return st;
}
