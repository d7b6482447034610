/* Recording the row-norm and elementwise kernels: residual add, RMSNorm, RoPE (normal and NeoX),
 * SwiGLU / GeGLU, row softmax, scale / soft-cap. Each op_* records one dispatch into a command buffer being recorded and
 * returns VKI_ERR_INVALID_ARG (recording nothing) when a shape does not fit its bindings. No
 * barrier is recorded: the caller puts vkd_barrier() between dependent ops. Empty shapes
 * (0 rows or columns) record nothing and return VKI_OK. */
#ifndef VKI_ENGINE_OPS_BASIC_H
#define VKI_ENGINE_OPS_BASIC_H

#include <stdbool.h>

#include "engine/kernels.h"

/* An f32 matrix operand: element (r, c) is float index off + r * stride + c of the view. */
typedef struct op_mat {
    vkd_view v;
    uint32_t off;    /* floats from the start of the view */
    uint32_t stride; /* floats between rows */
} op_mat;

static inline op_mat op_mat_rows(const vkd_buffer *b, uint32_t stride)
{
    return (op_mat){vkd_whole(b), 0, stride};
}

/* Floats the view exposes (its range, or the rest of its buffer). */
uint64_t op_view_floats(vkd_view v);
/* rows x cols elements of m lie inside its view, rows do not overlap, and every index fits the
 * shaders' 32-bit arithmetic. */
bool op_mat_fits(op_mat m, uint32_t rows, uint32_t cols);

/* Creates the pipelines of every kernel below (lavapipe compiles each for seconds: call at
 * engine open, not on the first tick). */
vki_status op_basic_prepare(vkd_device *d);

/* y[i] = a[i] + b[i], i < n. a, b, y: f32[n] (y may be a or b). */
vki_status op_add(vkd_cmd *c, vkd_view a, vkd_view b, vkd_view y, uint32_t n);

/* dst[0, n_bytes) = src[0, n_bytes): n_bytes a multiple of 4 (< 16 GiB), both views starting
 * 16-byte aligned in their buffers and holding n_bytes; they must not overlap. The kernel that
 * measures the device's copy bandwidth (host/cli/devprobe.c); not prepared by
 * op_basic_prepare (the forward pass does not use it), so its first use compiles it. */
vki_status op_copy(vkd_cmd *c, vkd_view src, vkd_view dst, uint64_t n_bytes);

/* y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w, r < n_rows. w: f32[n_cols]. y may be x. */
vki_status op_rmsnorm(vkd_cmd *c, op_mat x, vkd_view w, op_mat y, uint32_t n_rows, uint32_t n_cols,
                      float eps);
/* The same, and (xq.buf set) y also quantised into xq as op_quant_x8(y, M = n_rows, K = n_cols)
 * would write it, bit for bit: the next integer-dot products' input without that pass and its
 * barrier. n_cols % 32 == 0 and y in another buffer than x. */
vki_status op_rmsnorm_xq(vkd_cmd *c, op_mat x, vkd_view w, op_mat y, uint32_t n_rows, uint32_t n_cols, float eps,
                         vkd_view xq);
/* The same with (xh.buf set) y also rounded to F16 into xh as op_half_x(y, M = n_rows, K =
 * n_cols) would write it, bit for bit: the next tensor-core GEMMs' input (op_matmul_xh) without
 * that pass and its barrier. xh: op_half_x_bytes(n_rows, n_cols) bytes at an 8-aligned offset,
 * another buffer than x and y, y in another buffer than x; needs shaderFloat16. Not both xq
 * and xh. */
vki_status op_rmsnorm_xh(vkd_cmd *c, op_mat x, vkd_view w, op_mat y, uint32_t n_rows, uint32_t n_cols, float eps,
                         vkd_view xq, vkd_view xh);
/* op_rmsnorm_xh (mode 0), or with mode VKI_NORM_MEAN a LayerNorm (command-r's):
 * y[r, :] = (x[r, :] - m) / sqrt(mean((x[r, :] - m)^2) + eps) * w, m = mean(x[r, :]); with
 * VKI_NORM_BIAS too + b, b: f32[n_cols] after w's n_cols in w's view (starcoder2's). */
vki_status op_norm_xh(vkd_cmd *c, uint32_t mode, op_mat x, vkd_view w, op_mat y, uint32_t n_rows, uint32_t n_cols,
                      float eps, vkd_view xq, vkd_view xh);

typedef struct op_rope_p {
    uint32_t n_tokens, n_heads;
    uint32_t head_dim; /* even */
    uint32_t n_rot;    /* even, <= head_dim; dims >= n_rot are copied */
    bool neox;         /* rotate (i, i + n_rot/2) (qwen2) instead of (2i, 2i+1) (llama) */
} op_rope_p;

/* Rotates x[n_tokens][n_heads][head_dim] (token rows x.stride apart, heads contiguous) into y
 * (same layout; y may be x for in place). pos: u32[n_tokens], each < 2^24. freqs: the table
 * op_rope_freqs() filled, uploaded as n_rot/2 vec4. Angle error against a double-precision
 * reference: < 1e-6 rad for positions < 2^24 (tests/test_ops.c states the NMSE reached). */
vki_status op_rope(vkd_cmd *c, const op_rope_p *p, op_mat x, op_mat y, vkd_view pos, vkd_view freqs);

/* YaRN (ggml's rope_yarn): dimension pair i keeps a blend of the interpolated frequency
 * (freq_scale x) and the original one, mix_i = ramp_i * ext_factor with ramp_i = 1 - clamp((i -
 * lo) / max(0.001, hi - lo), 0, 1), lo = max(0, floor(d(beta_fast))), hi = min(n_rot - 1,
 * ceil(d(beta_slow))), d(b) = n_rot ln(n_ctx_orig / (2 pi b)) / (2 ln base): the pairs that turn
 * more than beta_fast times over the original context keep their frequency, those under beta_slow
 * are interpolated. Its magnitude (cos and sin times 1 + 0.1 ln(1 / freq_scale)) comes in as
 * op_rope_freqs' mag (model_hparams.rope_attn_factor). */
typedef struct op_rope_yarn {
    double ext_factor, beta_fast, beta_slow;
    uint32_t n_ctx_orig;
} op_rope_yarn;

/* The rotation table for op_rope: theta_i(pos) = pos * freq_scale * base^(-2i/n_rot) / factor[i]
 * for i < n_rot/2 (factors: llama3 rope_freqs, f32[n_rot/2], or NULL for 1; yarn: NULL, or the
 * blend above of that and freq_scale = 1), computed in double and stored as turns per position
 * g = theta/(2 pi pos) split exactly into three floats: out[4i + 0] (12 significant bits),
 * out[4i + 1] (the next 12), out[4i + 2] (the rest), and out[4i + 3] = mag, which scales cos and
 * sin of every rotated pair (LongRoPE's and YaRN's attention factor, llama.cpp's mscale; 1 for
 * none; dims past n_rot are not scaled). out: float[2 * n_rot]. Computed once per model; upload
 * it with vkd_upload. */
void op_rope_freqs(double base, double freq_scale, const float *factors, const op_rope_yarn *yarn, float mag,
                   uint32_t n_rot, float *out);

/* Per-expert biases of a mixture-of-experts layer (gpt-oss), picked per row by the row's expert:
 * row r of a product gets b[..][ids[r]][:]. ids: i32 [rows] (op_moe_topk's, < n_expert);
 * b: f32 [n_expert][cols] each (op_glu_ex: b[0] the gate's, b[1] up's; op_moe_combine: b[0] down's). */
typedef struct op_expert_bias {
    vkd_view ids;
    vkd_view b[2];
    uint32_t n_expert;
} op_expert_bias;

/* y[r, c] = act(g[r, c]) * u[r, c] (y may be g or u); act = VKI_GLU_SILU (SwiGLU),
 * VKI_GLU_GELU_TANH (GeGLU with the tanh-approximate GELU) or VKI_GLU_SWIGLU_OAI (gpt-oss's
 * clamped SwiGLU), see vki_shared.h. */
vki_status op_glu(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, op_mat y, uint32_t n_rows, uint32_t n_cols);
/* op_glu with the experts' gate and up biases added to g and u first (bias NULL: op_glu). */
vki_status op_glu_ex(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, op_mat y, uint32_t n_rows, uint32_t n_cols,
                     const op_expert_bias *bias);
/* The same values rounded to F16 into xh as op_half_x(y, M = n_rows, K = n_cols) would write them
 * from op_glu's output, bit for bit, and no F32 rows: the down projection's tensor-core GEMM
 * input (op_matmul_xh) without a pass reading them back and its barrier. xh:
 * op_half_x_bytes(n_rows, n_cols) bytes at an 8-aligned offset, another buffer than g and u;
 * needs shaderFloat16. */
vki_status op_glu_xh(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, vkd_view xh, uint32_t n_rows, uint32_t n_cols);
vki_status op_glu_xh_ex(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, vkd_view xh, uint32_t n_rows, uint32_t n_cols,
                        const op_expert_bias *bias);

/* y[r, c] = a * x[r, c] (VKI_UNARY_SCALE), a * tanh(x[r, c] / a) (VKI_UNARY_SOFTCAP, a > 0) or
 * gelu(x[r, c]) (VKI_UNARY_GELU) or max(x[r, c], 0)^2 (VKI_UNARY_RELU2); y may be x. a must be
 * finite. */
vki_status op_unary(vkd_cmd *c, uint32_t op, float a, op_mat x, op_mat y, uint32_t n_rows, uint32_t n_cols);
/* The same, and y also quantised into xq as op_quant_x8(y, M = n_rows, K = n_cols) would write
 * it, bit for bit (n_cols % 32 == 0): the next integer-dot products' input without that pass. */
vki_status op_unary_xq(vkd_cmd *c, uint32_t op, float a, op_mat x, op_mat y, uint32_t n_rows, uint32_t n_cols,
                       vkd_view xq);

/* y[r, :] = softmax(scale * x[r, :]), scale > 0 (y may be x). -inf entries give 0 and an all
 * -inf row gives zeros. */
vki_status op_softmax(vkd_cmd *c, op_mat x, op_mat y, uint32_t n_rows, uint32_t n_cols, float scale);

#endif
