/* Matrix multiply with weights in their GGUF types (every type engine/quant.h runs: F32, F16,
 * BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4; quantised
 * weights stay quantised on the device and are dequantised in the shaders) and F32 activations,
 * F32 accumulation (the cooperative-matrix GEMM rounds both operands to F16 first); and the row
 * gather (embedding lookup).
 *
 * Every op records dispatches into a command buffer that is recording; it records no barrier
 * (put vkd_barrier() between dependent ops). On any error nothing is recorded.
 * Errors: VKI_ERR_INVALID_ARG (a shape, stride or view that does not fit, logged),
 * VKI_ERR_UNSUPPORTED (a weight type vkinfer does not run, or one the device cannot: F16, BF16,
 * Q8_0, Q4_0, Q5_0, IQ4_NL, Q3_K and Q6_K need storageBuffer16BitAccess; the matrix-vector path
 * needs subgroup arithmetic; OP_MM_COOPMAT needs the device's cooperative-matrix path,
 * vkd_device.cm). */
#ifndef VKI_ENGINE_OPS_MATMUL_H
#define VKI_ENGINE_OPS_MATMUL_H

#include "engine/device.h"
#include "engine/tensor.h"

/* The matrix-vector kernel reads each weight row once for up to OP_MATVEC_ROWS activation rows
 * per pass; a workgroup makes OP_MATVEC_CHUNKS such passes over its own few rows in turn (they
 * are still in cache; CPU devices make twice as many passes of half as many rows), so a weight
 * comes from memory once for up to 32 rows (2..32 sequences decoding), and more rows take more
 * workgroups along y. The tiled GEMMs (FP32, or cooperative matrices where the device has them)
 * compute whole 64- or 128-row tiles, mostly padding for few rows. op_matmul switches at the
 * measured crossover op_matmul_gemv_max_m(): no step in time where the kernel changes. */
#define OP_MATVEC_ROWS 8
#define OP_MATVEC_CHUNKS 4

typedef enum op_mm_path {
    OP_MM_AUTO = 0, /* GEMV up to the crossover, then the device's GEMM (coopmat or FP32) */
    OP_MM_GEMV,     /* matrix-vector kernel, any M (weights read once per 32 rows) */
    OP_MM_GEMM,     /* tiled FP32 kernel, any M */
    OP_MM_COOPMAT,  /* tiled cooperative-matrix kernel (the device's vkd_cm path), any M;
                       VKI_ERR_UNSUPPORTED when the device has none */
} op_mm_path;

/* Rows up to which op_matmul takes the matrix-vector kernel: the device param, else the
 * crossover measured for this kind of device and GEMM (the table in ops_matmul.c). */
uint32_t op_matmul_gemv_max_m(const vkd_device *d);

/* Applies a kernel configuration (vki_device_params.kernel_config: comma-separated key=value,
 * keys matvec=WGxROWS[xMC[xMU]], gemm=BMxBN[xWMxWN], gemm_stages=S, gemm_bk=BK, gemm_split=N,
 * gemm_xh=0|1 (op_matmul_takes_xh), gemm_w16=0|1, gemv_max_m=M, attn_split=KEYS (read by
 * op_attn_setup), attn_loads=N, sample_loads=N; bench-kernels' --matvec-cfg, --cm-cfg,
 * --cm-stages, --cm-bk, --cm-split, --cm-w16, --attn-split, --attn-loads, --sample-loads) to the
 * device's kernel choices, before anything is recorded or any attention set up. check_fit: the
 * GEMM settings must give a tile this device runs (bench-kernels passes false and reports misfits
 * per row). NULL or "": nothing. VKI_ERR_INVALID_ARG (logged, naming the item) on anything else;
 * settings before the bad item stay applied. */
vki_status op_kernel_config(vkd_device *d, const char *cfg, bool check_fit);

/* The K splits the tensor-core GEMM (OP_MM_COOPMAT) takes for an M x N x K product of a one-part
 * tensor (1: none): automatic where the device tells its compute units, so that a GEMM of few
 * tiles still fills the device; vkd_device.cm_split forces a count. At most VKD_SPLIT_SLOTS GEMMs
 * recorded between two compute barriers split (each takes a scratch slot); later ones run
 * unsplit. */
uint32_t op_matmul_cm_splits(const vkd_device *d, uint32_t M, uint32_t N, uint32_t K);

/* Y[m, n] = sum_k X[m, k] * W[n, k] (+ bias[n])   for m < M, n < N = w->n_rows, K = w->ne0
 *   x:    f32[M, x_stride] row-major, x_stride >= K
 *   y:    f32[M, y_stride] row-major, y_stride >= N; only the first N columns are written
 *   bias: f32[N] or NULL
 * y must not overlap x or bias (no in-place product).
 * M from 1 up; any N; K a multiple of the type's block (F32/F16/BF16: any K). Loops over the
 * tensor's parts (each writes its own output columns) and splits N further where the
 * device's workgroup-count limit requires. */
vki_status op_matmul(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x, uint32_t x_stride,
                     vkd_view y, uint32_t y_stride, uint32_t M);
/* Same with the kernel chosen by the caller (tests and the benchmark). */
vki_status op_matmul_path(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x,
                          uint32_t x_stride, vkd_view y, uint32_t y_stride, uint32_t M, op_mm_path path);
/* Same, and with accumulate the product is added to Y instead of replacing it:
 *   Y[m, n] = Y[m, n] + (sum_k X[m, k] * W[n, k] (+ bias[n]))
 * rounded exactly as a separate op_add after the product (the residual stream: x = x + o W^T
 * in one dispatch, without o's round trip through memory and a barrier). */
vki_status op_matmul_ex(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x, uint32_t x_stride,
                        vkd_view y, uint32_t y_stride, uint32_t M, op_mm_path path, bool accumulate);

/* X rounded to F16 once for the tensor-core GEMM: where op_matmul would take that GEMM for M rows
 * (op_matmul_takes_xh: the device has a cooperative-matrix path, M is above the crossover and
 * kernel_config gemm_xh=0 did not turn this off) the forward pass converts each product's input
 * once with op_half_x and hands it to op_matmul_xh (the experts': op_matmul_id_xh), instead of
 * letting every one of the GEMM's N / 128 tile columns load F32 X and convert it again (4 bytes
 * of X staged per element against 2). The GEMM's own staging rounds the same way
 * (shaders/f16x4.glsl): the same bits.
 *   op_half_x:    xh = f16(x), x: f32[M, x_stride]; xh: f16[M][op_half_x_stride(K)] (K rounded
 *                 up to 4, zeros after K), op_half_x_bytes(M, K) bytes at an 8-aligned offset;
 *                 needs shaderFloat16
 *   op_matmul_xh: op_matmul_ex on the tensor-core GEMM (any M; VKI_ERR_UNSUPPORTED without a
 *                 cooperative-matrix path) with X from op_half_x (M rows, K = w->ne0). */
bool op_matmul_takes_xh(const vkd_device *d, uint32_t M);
uint32_t op_half_x_stride(uint32_t K);
uint64_t op_half_x_bytes(uint32_t M, uint32_t K);
vki_status op_half_x(vkd_cmd *c, vkd_view x, uint32_t x_stride, uint32_t M, uint32_t K, vkd_view xh);
vki_status op_matmul_xh(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view xh, vkd_view y,
                        uint32_t y_stride, uint32_t M, bool accumulate);

/* The FFN's gate and up projections and their gated unit in one matrix-vector pass (decode):
 *   Y[m, n] = act(sum_k X[m, k] * W[n, k]) * (sum_k X[m, k] * W[N + n, k]),  n < N = w->n_rows / 2
 *   w: [gate | up] rows in one part (concatenated at load); act: VKI_GLU_SILU or _GELU_TANH
 * The same bits as op_matmul into [gate | up] followed by op_glu, without the intermediate
 * round trip and barrier. The matrix-vector kernel for any M (as OP_MM_GEMV): use it
 * where op_matmul would take that kernel. */
typedef struct op_mm_glu_xq op_mm_glu_xq;
vki_status op_matmul_glu(vkd_cmd *c, const vk_tensor *w, uint32_t act, vkd_view x, uint32_t x_stride, vkd_view y,
                         uint32_t y_stride, uint32_t M, const op_mm_glu_xq *q);

/* The gate|up pass's output also quantised, for a down projection on the integer-dot path
 * (op_matmul_glu's q, op_matmul_i8's o->glu_xq): the last workgroup to finish a block of 32
 * columns writes it, for all M rows, as op_quant_x8(Y, y_stride, M, N) would, bit for bit, into
 * xq: the down projection's input without that pass and the barrier before it.
 * counter: N / 32 u32, zero when created and left zero by every dispatch; xq:
 * op_quant_x8_bytes(M, N) bytes, not the pass's input. Needs op_matmul_glu_xq_fits(). */
struct op_mm_glu_xq {
    vkd_view counter, xq;
};
bool op_matmul_glu_xq_fits(const vkd_device *d, const vk_tensor *w);

/* The residual projection of one token that also normalises the result for the next block
 * (decode, batch 1): Y = Y + x W^T (+ bias, f32[N], or NULL; as op_matmul_ex with accumulate),
 * then
 *   H[n] = Y[n] / sqrt(mean(Y^2) + eps) * weight[n]
 * written by the last of the matrix-vector workgroups, bit for bit what op_rmsnorm gives on
 * the device (the same reduction, shaders/norm_common.glsl), without the norm's dispatch and
 * the barrier before it. x: f32[K], y, h: f32[N] (h must not overlap y); counter: one u32, zero
 * when created and left zero by every dispatch. With an xq view (N % 32 == 0) it also writes h
 * quantised as op_quant_x8(h, M = 1) would, bit for bit: the next integer-dot products' input
 * without that pass and its barrier. Needs op_matmul_norm_fits(). */
typedef struct op_mm_norm {
    vkd_view weight, h, counter;
    float eps;
    vkd_view xq;            /* op_quant_x8_bytes(1, N) bytes, or .buf NULL: none */
} op_mm_norm;
bool op_matmul_norm_fits(const vkd_device *d, const vk_tensor *w);
vki_status op_matmul_norm(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x, vkd_view y,
                          const op_mm_norm *n);

/* The projection of one token that also normalises each head of its output in place (qwen3's
 * and gemma3's per-head Q and K norms, decode at batch 1): Y = x W^T, then for every slice of
 * head_dim columns
 *   Y[n] = Y[n] / sqrt(mean(slice^2) + eps) * weight[n % head_dim]
 * written by the last matrix-vector workgroup of that slice, bit for bit op_rmsnorm over rows of
 * head_dim (shaders/norm_common.glsl), without the norm's dispatch and the barrier before it.
 * x: f32[K], y: f32[N], weight: f32[head_dim], counter: N / head_dim u32, zero when created and
 * left zero by every dispatch (two such products in one stage need counters apart). Needs
 * op_matmul_head_norm_fits(). */
typedef struct op_mm_head_norm {
    vkd_view weight, counter;
    float eps;
    uint32_t head_dim;
} op_mm_head_norm;
bool op_matmul_head_norm_fits(const vkd_device *d, const vk_tensor *w, uint32_t head_dim);
vki_status op_matmul_head_norm(vkd_cmd *c, const vk_tensor *w, vkd_view x, vkd_view y, const op_mm_head_norm *n);

/* The integer-dot matrix-vector path, for GPUs where the float path's per-weight conversions
 * bound decode (issue 9; `bench-kernels` matvec_i8, the engine's vki_engine_params.int_dot): X
 * is quantised to int8 per block of 32 with an f32 scale (op_quant_x8), and each group of 4
 * weights is one packed 4x8-bit dot product with its X bytes (shaders/matvec.comp MV_I8). The
 * results differ from op_matmul's by X's rounding (~2e-5 relative; tests/test_matmul.c), as
 * llama.cpp's CPU and CUDA backends round theirs to Q8.
 *   op_quant_x8:  XQ = quantise(X), x: f32[M, x_stride], K a multiple of 32; xq: at least
 *                 op_quant_x8_bytes(M, K) bytes (layout: shaders/vki_shared.h vki_pc_quant_x8)
 *   op_matmul_i8: Y[m, n] (+)= sum_k dequant(W[n, k]) * dx qx[m, k] (+ bias[n]) from that XQ
 *                 (M and K = w->ne0 those of its op_quant_x8: the scales follow all M rows'
 *                 bytes), the matrix-vector kernel's shape for M rows;
 *                 with o->glu the gate|up pass of op_matmul_glu (w: [gate | up], one part,
 *                 N = w->n_rows / 2), with o->norm op_matmul_norm's epilogue (M = 1, accumulate,
 *                 after the bias if any),
 *                 with o->head_norm op_matmul_head_norm's.
 * Weight types: every integer one (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4);
 * the device needs shaderIntegerDotProduct (Vulkan 1.3). VKI_ERR_UNSUPPORTED otherwise (op_matmul_i8_supported). */
typedef struct op_mm_i8 {
    const vkd_view *bias;   /* f32[N] or NULL (not with glu) */
    bool accumulate;        /* Y = Y + product */
    bool glu;               /* act(gate) * up, act: VKI_GLU_SILU or VKI_GLU_GELU_TANH */
    uint32_t act;
    const op_mm_norm *norm; /* or NULL */
    const op_mm_glu_xq *glu_xq; /* with glu: its output also quantised (op_mm_glu_xq), or NULL */
    const op_mm_head_norm *head_norm; /* op_matmul_head_norm's epilogue (M = 1, no bias, glu or
                                         accumulate), or NULL */
} op_mm_i8;
uint64_t op_quant_x8_bytes(uint32_t M, uint32_t K);
vki_status op_quant_x8(vkd_cmd *c, vkd_view x, uint32_t x_stride, uint32_t M, uint32_t K, vkd_view xq);
bool op_matmul_i8_supported(const vkd_device *d, uint32_t type);
vki_status op_matmul_i8(vkd_cmd *c, const vk_tensor *w, vkd_view xq, vkd_view y, uint32_t y_stride, uint32_t M,
                        const op_mm_i8 *o);
/* Creates the pipelines op_quant_x8 and op_matmul_i8 use for a weight type (the engine, at open
 * with int_dot), as op_matmul_prepare does for the float path. */
vki_status op_matmul_i8_prepare(vkd_device *d, uint32_t type);

/* Mixture of experts: every row of Y ("pair") is multiplied by its own expert's matrix:
 *   Y[p, n] = sum_k X[p / x_div, k] * W_e[n, k],  p < M, n < N, e = the pair's expert
 *   w:     n_expert stacked [N][K] matrices (ggml's ffn_*_exps: w->n_rows = n_expert * N), stored
 *          in parts of whole experts (vk_tensor_create_grouped)
 *   ids:   i32[M], the expert of each pair (op_moe_topk's output): read by the GEMV path
 *   route: u32[n_expert + 1 + M], the pairs grouped by expert (op_moe_group): the GEMM paths
 *   x:     f32[(M - 1) / x_div + 1, x_stride]: x_div = n_used when X holds the tokens (gate, up),
 *          1 when it holds the pairs (down)
 *   y:     f32[M, y_stride]
 *   max_rows: the most pairs one expert can have (the tokens): the GEMM's grid along M.
 * The expert ids are read on the device only: no host round trip. The GEMV path reads each
 * chosen expert's rows once per pair (decode: n_used experts per token); the GEMM paths read an
 * expert's rows once per 64/128 of its pairs. path OP_MM_AUTO: op_matmul_id_path. */
vki_status op_matmul_id(vkd_cmd *c, const vk_tensor *w, uint32_t n_expert, vkd_view ids, vkd_view route,
                        vkd_view x, uint32_t x_stride, uint32_t x_div, vkd_view y, uint32_t y_stride,
                        uint32_t M, uint32_t max_rows, op_mm_path path);
/* op_matmul_id on the tensor-core GEMM (VKI_ERR_UNSUPPORTED without a cooperative-matrix path) with
 * X from op_half_x: its (M - 1) / x_div + 1 rows, K = w->ne0 (as op_matmul_xh for the dense
 * products). */
vki_status op_matmul_id_xh(vkd_cmd *c, const vk_tensor *w, uint32_t n_expert, vkd_view route, vkd_view xh,
                           uint32_t x_div, vkd_view y, uint32_t y_stride, uint32_t M, uint32_t max_rows);
/* The kernel op_matmul_id takes for M pairs over n_expert experts: the matrix-vector kernel
 * while an expert has on average no more pairs than the GEMV/GEMM crossover, else the device's
 * GEMM (cooperative matrices where present). */
op_mm_path op_matmul_id_path(const vkd_device *d, uint32_t M, uint32_t n_expert);
/* Creates the experts' matmul pipelines for a weight type (GEMV, the device's GEMM for max_rows). */
vki_status op_matmul_id_prepare(vkd_device *d, uint32_t type, uint32_t max_rows);

/* op_matmul_id's matrix-vector path on integer dot products (int_dot, as op_matmul_i8): X's
 * (M - 1) / x_div + 1 rows quantised by op_quant_x8 into xq (op_quant_x8_bytes of those rows and
 * K), the integer weight types (op_matmul_i8_supported), K % 32 == 0. */
vki_status op_matmul_id_i8(vkd_cmd *c, const vk_tensor *w, uint32_t n_expert, vkd_view ids, vkd_view xq,
                           uint32_t x_div, vkd_view y, uint32_t y_stride, uint32_t M);
/* Its pipeline for a weight type (op_matmul_i8_prepare makes quant_x8's). */
vki_status op_matmul_id_i8_prepare(vkd_device *d, uint32_t type);

/* y[i, :K] = dequant(W[ids[i], :]) for i < n (embedding lookup), K = w->ne0
 *   ids: i32[n]; y: f32[n, y_stride], y_stride >= K.
 * An id outside [0, w->n_rows) yields a row of zeros: the host should validate ids, but a bad
 * one never makes the GPU read out of bounds. */
vki_status op_get_rows(vkd_cmd *c, const vk_tensor *w, vkd_view ids, uint32_t n, vkd_view y, uint32_t y_stride);

/* The same gather over an F32 activation matrix: y[i, :K] = src[ids[i], :K]
 *   src: f32[src_rows, src_stride], src_stride >= K; ids outside [0, src_rows) give zeros. */
vki_status op_gather_rows(vkd_cmd *c, vkd_view src, uint32_t src_stride, uint32_t src_rows, uint32_t K,
                          vkd_view ids, uint32_t n, vkd_view y, uint32_t y_stride);

/* Creates every pipeline the ops above use for weights of ggml type `type` on this device
 * (GEMV for M = 1 and for M > 1, the GEMM of the device's path, gather), so none compiles
 * during a step (between vkk_defer_begin / _end: notes them).
 * The engine calls it at open for each weight type of the model (and F32 for activation
 * gathers). VKI_ERR_UNSUPPORTED if the device cannot run the type. */
vki_status op_matmul_prepare(vkd_device *d, uint32_t type);

/* One tiny dispatch of each of those pipelines, waited for (the devices that compile at the
 * first dispatch: lavapipe); after op_matmul_prepare and any deferral's end. */
vki_status op_matmul_warm_up(vkd_device *d, uint32_t type);

/* True if the device can run matmul / get_rows for this ggml type. */
bool op_matmul_supported(const vkd_device *d, uint32_t type);

#endif
