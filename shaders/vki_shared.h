/* Shared by C and GLSL: push-constant structs and constants, so the two sides cannot drift.
 *
 * Rules that keep the layouts identical on both sides:
 *  - push structs contain only 32-bit scalars (vki_u32 / vki_i32 / vki_f32), so the C layout and
 *    the GLSL std430 push-constant layout are the same by construction;
 *  - a shader declares   layout(push_constant) uniform PushBlock { vki_pc_xxx p; };
 *  - C asserts (engine/kernels.c) that every push struct is <= VKI_MAX_PUSH bytes, a multiple of
 *    4, and matches the size recorded in the kernel table.
 * In C this header is included through engine/kernels.h; in GLSL through "common.glsl".
 */
#ifndef VKI_SHARED_H
#define VKI_SHARED_H

#ifdef __STDC__ /* C side: GLSL does not define __STDC__ */
#include <stdint.h>
typedef uint32_t vki_u32;
typedef int32_t vki_i32;
typedef float vki_f32;
#define VKI_STRUCT(name) typedef struct name name; struct name
#else
#define vki_u32 uint
#define vki_i32 int
#define vki_f32 float
#define VKI_STRUCT(name) struct name
#endif

/* Smallest maxPushConstantsSize a Vulkan device may report (lavapipe and NVIDIA: 128+). */
#define VKI_MAX_PUSH 128

/* ggml tensor type ids (GGUF tensor_info.type). Only those vkinfer runs are listed; the other
 * ggml ids with a known block size (engine/quant.c) can be read and inspected, not run. */
#define VKI_GGML_F32 0
#define VKI_GGML_F16 1
#define VKI_GGML_Q4_0 2
#define VKI_GGML_Q4_1 3
#define VKI_GGML_Q5_0 6
#define VKI_GGML_Q5_1 7
#define VKI_GGML_Q8_0 8
#define VKI_GGML_Q2_K 10
#define VKI_GGML_Q3_K 11
#define VKI_GGML_Q4_K 12
#define VKI_GGML_Q5_K 13
#define VKI_GGML_Q6_K 14
#define VKI_GGML_IQ4_NL 20
#define VKI_GGML_IQ4_XS 23
#define VKI_GGML_BF16 30
#define VKI_GGML_MXFP4 39

/* Block layouts (bytes per block of QK elements), as in ggml; multi-byte fields little-endian,
 * f16 = IEEE half. "Nibbles" of a 32-weight block: byte j holds element j (low) and j + 16
 * (high). The decoded value is computed in f32 in exactly the order written (what gguf-py and
 * ggml's CPU reference do), so a dequantiser can be bit-exact.
 *  F32, F16, BF16 (bf16: the top 16 bits of an f32)            4 / 2 / 2 bytes per weight
 *  Q8_0: { f16 d; int8 qs[32]; }                  w = q * d                        34 B / 32
 *  Q4_0: { f16 d; uint8 qs[16]; }                 w = d * (q - 8), q a nibble      18 B / 32
 *  Q4_1: { f16 d, m; uint8 qs[16]; }              w = d * q + m                    20 B / 32
 *  Q5_0: { f16 d; uint8 qh[4]; uint8 qs[16]; }    w = d * (q - 16), q = nibble | bit j of
 *        the little-endian u32 qh << 4 (element j)                                 22 B / 32
 *  Q5_1: { f16 d, m; uint8 qh[4]; uint8 qs[16]; } w = d * q + m, q as Q5_0         24 B / 32
 *  IQ4_NL: { f16 d; uint8 qs[16]; }               w = d * VKI_IQ4NL_VALUES[nibble] 18 B / 32
 *  Q2_K: { uint8 scales[16]; uint8 qs[64]; f16 d, dmin; }                          84 B / 256
 *        element 128n + 32j + l (n < 2, j < 4, l < 32): q = (qs[32n + l] >> 2j) & 3,
 *        sub-block s = 8n + 2j + l/16: w = (d * (scales[s] & 15)) * q - dmin * (scales[s] >> 4)
 *  Q3_K: { uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; f16 d; }               110 B / 256
 *        element e = 128n + 32j + l: q = ((qs[32n + l] >> 2j) & 3) - (bit e/32 of hmask[l] ?
 *        0 : 4); 6-bit scale s = 8n + 2j + l/16: low 4 bits scales[s % 8] >> 4(s / 8), high 2
 *        bits scales[8 + s % 4] >> 2(s / 4); w = (d * (scale - 32)) * q
 *  Q4_K: { f16 d, dmin; uint8 scales[12]; uint8 qs[128]; }                         144 B / 256
 *        8 sub-blocks of 32 with 6-bit (sc, m) pairs (engine/quant.c): w = (d*sc) * q - dmin*m;
 *        qs bytes 32c.. hold elements 64c.. (low nibbles) and 64c+32.. (high)
 *  Q5_K: { f16 d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; }           176 B / 256
 *        as Q4_K with a fifth bit: element 64c + 32h + l takes bit 2c + h of qh[l]
 *  Q6_K: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; }                  210 B / 256
 *  IQ4_XS: { f16 d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]; }           136 B / 256
 *        sub-block b (32 weights, qs bytes 16b.., nibbles as above): 6-bit scale ls = (scales_l[b/2]
 *        >> 4(b%2)) & 15 | ((scales_h >> 2b) & 3) << 4; w = (d * (ls - 32)) * VKI_IQ4NL_VALUES[q]
 *  MXFP4: { uint8 e; uint8 qs[16]; }             w = VKI_MXFP4_VALUES[nibble] * d,  17 B / 32
 *        d = 2^(e - 128) (OCP MX: an E8M0 scale 2^(e - 127) over E2M1 elements, whose values
 *        the table holds doubled, hence half the scale; ggml_e8m0_to_fp32_half) */
#define VKI_QK8_0 32
#define VKI_QK4_0 32
#define VKI_QK_K 256
#define VKI_Q8_0_BYTES 34
#define VKI_Q4_0_BYTES 18
#define VKI_Q4_1_BYTES 20
#define VKI_Q5_0_BYTES 22
#define VKI_Q5_1_BYTES 24
#define VKI_IQ4_NL_BYTES 18
#define VKI_Q2_K_BYTES 84
#define VKI_Q3_K_BYTES 110
#define VKI_Q4_K_BYTES 144
#define VKI_Q5_K_BYTES 176
#define VKI_Q6_K_BYTES 210
#define VKI_IQ4_XS_BYTES 136
#define VKI_MXFP4_BYTES 17
/* Device row layout, "scale-grouped" (engine/quant.c quant_row_to_dev, shaders/dequant.glsl):
 * the blocks of Q8_0, Q4_0, IQ4_NL, Q5_0, Q3_K and Q6_K are only 2-byte aligned in GGUF (34, 18,
 * 18, 22, 110, 210 B), which would leave the kernels 16-bit loads. At upload each run of
 * VKI_DG_BLOCKS blocks of a row becomes a group: a head of the blocks' small fields gathered
 * into arrays of 8 (always the scale d first; slots past a short last group are 0), then the 8
 * bodies (the rest of each block, its bytes in order), every body 16-byte aligned:
 *   Q8_0:         { f16 d[8];                    int8 qs[32] x 8 }            head 16, body 32
 *   Q4_0, IQ4_NL: { f16 d[8];                    uint8 qs[16] x 8 }           head 16, body 16
 *   Q5_0:         { f16 d[8]; uint8 qh[8][4];    uint8 qs[16] x 8 }           head 48, body 16
 *   Q3_K:         { f16 d[8]; uint8 scales[8][12]; {hmask[32], qs[64]} x 8 }  head 112, body 96
 *   Q6_K:         { f16 d[8];                    {ql[128], qh[64], scales[16]} x 8 } 16, 208
 * MXFP4's blocks (17 B) are only byte-aligned; its groups are of VKI_DG_BLOCKS_MXFP4 = 16 blocks,
 * so that the 16 one-byte scales fill a 16-byte head:
 *   MXFP4:        { uint8 e[16];                 uint8 qs[16] x 16 }          head 16, body 16
 * A full group is exactly the size of its GGUF blocks; a short last group of r blocks takes the
 * missing blocks' gathered fields' bytes more (at most 98 B a row, Q3_K). Every other type keeps
 * its GGUF blocks on the device. */
#define VKI_DG_BLOCKS 8
#define VKI_DG_BLOCKS_MXFP4 16
#define VKI_DG_HEAD_MXFP4 16
#define VKI_DG_BODY_MXFP4 16
#define VKI_DG_HEAD_Q8_0 16
#define VKI_DG_BODY_Q8_0 32
#define VKI_DG_HEAD_Q4_0 16 /* and IQ4_NL */
#define VKI_DG_BODY_Q4_0 16
#define VKI_DG_HEAD_Q5_0 48
#define VKI_DG_BODY_Q5_0 16
#define VKI_DG_HEAD_Q3_K 112
#define VKI_DG_BODY_Q3_K 96
#define VKI_DG_HEAD_Q6_K 16
#define VKI_DG_BODY_Q6_K 208
/* The 16 non-linear levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl), for C and GLSL tables. */
#define VKI_IQ4NL_VALUES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
/* MXFP4's 16 element values: the E2M1 codes (sign bit 3, exponent bits 2-1, mantissa bit 0) as
 * twice their value (0, 0.5, 1, 1.5, 2, 3, 4, 6 -> 0 .. 12), so they are integers (ggml's
 * kvalues_mxfp4); code 8 is -0. */
#define VKI_MXFP4_VALUES 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12

/* ---- push-constant structs (one per kernel family) ----------------------------------------- */

/* add: y[i] = a[i] + b[i], i < n.  bindings: 0 a (f32[n]), 1 b (f32[n]), 2 y (f32[n]) */
VKI_STRUCT(vki_pc_add) {
    vki_u32 n;
};

/* copy: y[i] = x[i] for 32-bit words i < n (the copy-bandwidth probe).
 * bindings: 0 x (u32[n]), 1 y (u32[n]); both views start 16-byte aligned */
VKI_STRUCT(vki_pc_copy) {
    vki_u32 n;
};

/* matvec / matmul (one weight part per dispatch):
 *   Y[m, y_col0 + n] (+)= sum_k X[m, k] * W[n, k] (+ bias[y_col0 + n]),  m < M, n0 <= n < N
 * bindings: 0 W (weight part: N rows of K elements in the kernel's ggml type, w_stride bytes
 *             apart, GGUF blocks or their scale-grouped device layout), 1 X (f32[M, x_stride]),
 *           2 bias (f32[>= y_col0 + N]; any valid binding without VKI_MM_BIAS),
 *           3 Y (f32[M, y_stride])
 * flags: VKI_MM_BIAS adds the bias; VKI_MM_ACCUM adds the product to Y instead of replacing
 * it (the residual stream: Y = Y + (X W^T + bias), the same roundings as a separate add). */
#define VKI_MM_BIAS 1u
#define VKI_MM_ACCUM 2u
/* matvec specialised GLU = 1 (see matvec.comp): the part is [gate | up] rows, N = d_ff and
 * Y[m, n] = act(gate_n . x_m) * (up_n . x_m); act = tanh-GELU with this flag, else SiLU */
#define VKI_MM_GELU 4u
/* matvec, M = 1, the whole Y row in one dispatch (y_col0 = n0 = 0): after the product the last
 * workgroup writes H[n] = rmsnorm(Y[0, :]) * nw[n] with norm_eps, as rmsnorm.comp (the
 * residual projection also writing the next block's normed input).
 * matvec bindings beyond the four: 4 nw (f32[N]), 5 H (f32), 6 counter (u32[1], zero between
 * dispatches), 7 HQ; any valid buffers without this flag (matvec_id has only the four) */
#define VKI_MM_NORM 8u
/* with VKI_MM_NORM: the last workgroup also writes H quantised as quant_x8 would (HQ, binding 7:
 * VKI_XQ_WORDS(1, N) words, the same bits), the input of the next integer-dot products; N % 32
 * == 0 */
#define VKI_MM_NORM_XQ 16u
/* matvec GLU = 1, N % 32 == 0, the whole Y in one dispatch (y_col0 = n0 = 0), NR / 2 dividing 32:
 * the last workgroup to finish a block of 32 columns (over all workgroups along y) also writes
 * it for all M rows quantised as quant_x8 would from Y (binding 7: VKI_XQ_WORDS(M, N) words, the
 * same bits), the down projection's integer-dot input; binding 6: u32[N / 32] counters, zero
 * between dispatches */
#define VKI_MM_GLU_XQ 32u
/* matvec, M = 1, one part in one dispatch (y_col0 = n0 = 0), N a multiple of norm_cols and NR
 * dividing norm_cols: after the product the last workgroup to finish each norm_cols-wide slice
 * of Y (a head of qwen3's or gemma3's Q or K) normalises it in place,
 *   Y[n] = Y[n] / sqrt(mean(slice^2) + norm_eps) * nw[n % norm_cols],
 * as rmsnorm.comp does over rows of norm_cols (the same bits): no norm dispatch and no barrier
 * before it. Bindings 4 nw (f32[norm_cols]), 6 counters (u32[N / norm_cols], zero between
 * dispatches); 5 and 7 unused */
#define VKI_MM_HEAD_NORM 64u
VKI_STRUCT(vki_pc_matmul) {
    vki_u32 M, N, K;
    vki_u32 n0;       /* first weight row of this dispatch (splits huge N over dispatches) */
    vki_u32 w_stride; /* bytes between weight rows (the tensor's row_bytes) */
    vki_u32 x_stride; /* elements between X rows */
    vki_u32 y_stride; /* elements between Y rows */
    vki_u32 y_col0;   /* Y column (and bias index) of weight row 0 of this part */
    vki_u32 flags;    /* VKI_MM_BIAS | VKI_MM_ACCUM | VKI_MM_GELU | VKI_MM_NORM | VKI_MM_NORM_XQ | VKI_MM_GLU_XQ |
                       * VKI_MM_HEAD_NORM */
    vki_u32 x_vec4;   /* 1: X rows may be read as vec4 (x_stride % 4 == 0, binding 16-aligned); the
                       * matrix-vector kernel takes it as its spec constant XV4 instead */
    vki_f32 norm_eps; /* VKI_MM_NORM, VKI_MM_HEAD_NORM: the norm's epsilon */
    vki_u32 k_split;  /* matmul_cm split-K: K per split (workgroup z), a multiple of its BK; each
                       * split writes its partial tile, the last of a tile's splits sums them in
                       * split order and runs the epilogue (bias, accumulate); 0: no split */
    vki_u32 norm_cols; /* VKI_MM_HEAD_NORM: the width of the normalised slices (head_dim) */
};

/* matvec_id / matmul_id (mixture of experts; one weight part per dispatch): the weights are
 * n_expert stacked matrices of N rows (ggml's ffn_*_exps: row e * N + n is row n of expert e),
 * and every Y row ("pair": token t's j-th chosen expert, pair = t * n_used + j) is multiplied by
 * its own expert:
 *   Y[pair, n] = sum_k X[pair / x_div, k] * W_e[n, k],  e = the pair's expert, n0 <= n < N
 * (x_div = n_used: X is the token rows, the gate/up projections; 1: X is the pair rows, down).
 * The part holds experts [e0, e0 + n_exp) (parts are whole experts); pairs of other experts are
 * left for another part's dispatch.
 * matvec_id: workgroup (row block, pair); binding 2 = ids (i32[M]: the expert of each pair).
 * matmul_id: workgroup (N tile, M tile, e - e0); binding 2 = route (u32[n_expert + 1 + M]:
 *   route[e] .. route[e + 1] - 1 index the pairs of expert e, listed from route[n_expert + 1];
 *   moe_group writes it), max_rows = M tiles' bound (most pairs one expert can have).
 * The first ten fields are vki_pc_matmul's, so matvec.comp / matmul*.comp share their code. */
VKI_STRUCT(vki_pc_matmul_id) {
    vki_u32 M, N, K, n0, w_stride, x_stride, y_stride, y_col0, flags, x_vec4;
    vki_u32 x_div;    /* X row of a pair: pair / x_div */
    vki_u32 e0;       /* first expert of the bound part */
    vki_u32 n_exp;    /* experts in the bound part */
    vki_u32 n_expert; /* experts in the tensor (offsets in route) */
};

/* Mixture-of-experts routing (engine/ops_moe.h). VKI_MOE_MAX_EXPERTS bounds n_expert (the group
 * kernel keeps one counter per expert in shared memory; Qwen3-MoE 128, DeepSeek 256, Qwen3-Next
 * 512), VKI_MOE_MAX_USED the experts per token.
 * moe_topk:    per token t < n_tokens, the n_used largest logits[t][:n_expert] (ties: lower
 *              expert first) -> ids[t][j], weights[t][j] = softmax over all experts at the
 *              chosen ones, divided by their sum when norm (qwen3moe, Mixtral: the same as a
 *              softmax over the chosen logits). bindings: 0 logits (f32[n_tokens][n_expert]),
 *              1 ids (i32[n_tokens][n_used]), 2 weights (f32[n_tokens][n_used])
 * moe_group:   counts the pairs per expert and lists them by expert, stable (pair order within
 *              an expert) -> route as matmul_id reads it. bindings: 0 ids (i32[n_pairs]),
 *              1 route (u32[n_expert + 1 + n_pairs])
 * moe_combine: x[t][c] += sum_j weights[t][j] * o[t * n_used + j][c] (j in order: the same
 *              arithmetic whatever the batch); with bias (gpt-oss) each o row first gets its
 *              expert's down bias, o[p][c] + b[ids[p]][c]. bindings: 0 o (f32[n_tokens *
 *              n_used][d]), 1 weights (f32[n_tokens][n_used]), 2 x (f32[n_tokens][d],
 *              read-write), 3 ids (i32[n_tokens * n_used]), 4 b (f32 [n_expert][d]); 3-4 any
 *              buffer without bias */
#define VKI_MOE_MAX_EXPERTS 512u
#define VKI_MOE_MAX_USED 32u
VKI_STRUCT(vki_pc_moe) {
    vki_u32 n_tokens, n_expert, n_used;
    vki_u32 norm;     /* moe_topk: renormalise the chosen weights */
    vki_u32 d;        /* moe_combine: columns */
    vki_u32 bias;     /* moe_combine: 1 = the experts' down biases (above) */
};

/* quant_x8 (the integer-dot matrix-vector path, engine/ops_matmul.h): X f32[M, x_stride] ->
 * XQ, per row m and block b of 32 elements (K a multiple of 32):
 *   d = max|x| * (1/127),  q[k] = round(x[k] / d) (half away from zero; int8, |q| <= 127; 0 if d = 0)
 * XQ in 32-bit words: [M][K/4] words of 4 int8 (element k in byte k % 4 of word m * K/4 + k/4),
 * then f32 d[M][K/32] from word M * K/4 (VKI_XQ_WORDS). matvec_i8 reads it as its binding 1 with
 * vki_pc_matmul (x_stride unused). bindings: 0 X, 1 XQ. grid (K/32 / WG, M).
 * half_x (the tensor-core GEMM's X in F16, op_half_x) takes the same push constants: X f32[M,
 * x_stride] -> XH f16[M][K4], K4 = K rounded up to 4, XH[m][k] = f16(X[m][k]) for k < K, 0
 * after; matmul_cm with XH = 1 reads it with vki_pc_matmul.x_stride = K4. bindings: 0 X, 1 XH.
 * grid (K4/4 / WG, M). */
#define VKI_XQ_WORDS(M, K) ((M) * ((K) / 4u) + (M) * ((K) / 32u))
VKI_STRUCT(vki_pc_quant_x8) {
    vki_u32 M, K;
    vki_u32 x_stride; /* elements between X rows */
    vki_u32 x_vec4;   /* 1: X rows may be read as vec4 */
};

/* get_rows (one weight part per dispatch): for i < n, with r = ids[i]:
 *   row0 <= r < row0 + part_rows:  y[i, :K] = dequant(W[r - row0, :])
 *   r < 0 or r >= n_rows:          y[i, :K] = 0 when zero_oob == 1 (one dispatch per call)
 * bindings: 0 W (weight part, w_stride bytes per row), 1 ids (i32[n]), 2 y (f32[n, y_stride]) */
VKI_STRUCT(vki_pc_get_rows) {
    vki_u32 n, K;
    vki_u32 w_stride; /* bytes between weight rows */
    vki_u32 y_stride; /* elements between y rows */
    vki_u32 row0, part_rows, n_rows;
    vki_u32 zero_oob;
};

/* cm_peak (tools/bench_kernels.c): every subgroup multiplies one A and one B fragment into NACC
 * accumulators n_iter times, then stores them. bindings: 0 src (f32[CM_M * CM_K + CM_K * CM_N]:
 * the A and B values), 1 dst (f32[groups][subgroups][NACC][CM_M * CM_N]) */
VKI_STRUCT(vki_pc_cm_peak) {
    vki_u32 n_iter;
};

/* ---- ops_basic: row norms and elementwise ops over f32 matrices ----------------------------
 * A matrix operand is (binding, off, stride): element (r, c) is float index off + r * stride + c
 * of its binding, so one GEMM output (fused QKV, fused gate|up) feeds several ops unsplit. */

/* rmsnorm: y[r, c] = x[r, c] / sqrt(mean_c(x[r, :]^2) + eps) * w[c], r < n_rows, c < n_cols.
 * bindings: 0 x (f32 rows), 1 w (f32[n_cols]), 2 y (f32 rows). The sum of squares runs over
 * VKI_NORM_LANES virtual lanes (shaders/norm_common.glsl): the workgroup size must divide it. */
#define VKI_NORM_LANES 256u
VKI_STRUCT(vki_pc_rmsnorm) {
    vki_u32 n_rows, n_cols;
    vki_u32 x_off, x_stride, y_off, y_stride;
    vki_f32 eps;
    vki_u32 xq;       /* 1: binding 3 gets the rows quantised as quant_x8 would (n_cols % 32 == 0) */
    vki_u32 mode;     /* VKI_NORM_MEAN: LayerNorm, y = (x - mean) / sqrt(var + eps) * w, var the
                         mean of (x - mean)^2 (command-r); | VKI_NORM_BIAS: + b, b at w[n_cols..]
                         (starcoder2); 0: RMSNorm */
};
#define VKI_NORM_MEAN 1u
#define VKI_NORM_BIAS 2u

/* rope over x[n_tokens][n_heads][head_dim] (token rows x_stride apart, heads contiguous):
 * pair i < n_rot/2 of every head rotates by theta_i(pos[t]); dims >= n_rot are copied.
 *   normal (llama): pair (2i, 2i+1);   neox (qwen2): pair (i, i + n_rot/2).
 * theta_i(pos) = pos * freq_scale * base^(-2i/n_rot) / factor[i], given as turns per position
 * (theta / 2pi) split into three floats by op_rope_freqs() (see engine/ops_basic.h), so the
 * angle is reduced modulo 2pi exactly, without double precision on the device. pos < 2^24.
 * bindings: 0 x (f32), 1 y (f32; may be the same buffer as x: in place), 2 pos (u32[n_tokens]),
 *           3 freqs (vec4[n_rot/2] = {g1, g2, g3, 0}) */
VKI_STRUCT(vki_pc_rope) {
    vki_u32 n_tokens, n_heads, head_dim, n_rot;
    vki_u32 x_off, x_stride, y_off, y_stride;
    vki_u32 neox;
};

/* glu (gated linear unit of the FFN): y[r, c] = act(g[r, c]) * u[r, c] with
 *   VKI_GLU_SILU (SwiGLU: llama, qwen, phi3):  act(v) = v / (1 + exp(-v))
 *   VKI_GLU_GELU_TANH (GeGLU: gemma 2/3):      act(v) = v/2 (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
 * or, gpt-oss's experts (glu.comp only, not the matmul epilogues), with x = min(g, 7),
 *   VKI_GLU_SWIGLU_OAI: y = x / (1 + exp(-1.702 x)) * (clamp(u, -7, 7) + 1)
 * bias = 1 (gpt-oss's experts): g and u first get row ids[r]'s biases, g[r, c] + gb[ids[r]][c]
 * and u[r, c] + ub[ids[r]][c] (row r a token's pair, ids its expert).
 * bindings: 0 g (f32 rows), 1 u (f32 rows), 2 y (f32 rows), 3 ids (i32[n_rows]), 4 gb, 5 ub
 * (f32 [n_expert][n_cols]); 3-5 any buffer when bias = 0 */
#define VKI_GLU_SILU 0u
#define VKI_GLU_GELU_TANH 1u
#define VKI_GLU_SWIGLU_OAI 2u
#define VKI_GLU_OAI_ALPHA 1.702f
#define VKI_GLU_OAI_LIMIT 7.0f
VKI_STRUCT(vki_pc_glu) {
    vki_u32 n_rows, n_cols;
    vki_u32 g_off, g_stride, u_off, u_stride, y_off, y_stride;
    vki_u32 act;      /* VKI_GLU_* */
    vki_u32 bias;     /* 1: the experts' biases by row id (above) */
};

/* unary: y[r, c] = f(x[r, c]) over rows (y may alias x) with
 *   VKI_UNARY_SCALE:   f(v) = a * v                 (gemma's embedding scale sqrt(d_model))
 *   VKI_UNARY_SOFTCAP: f(v) = a * tanh(v / a), a > 0 (gemma 2's final logit soft-capping)
 * bindings: 0 x (f32 rows), 1 y (f32 rows) */
#define VKI_UNARY_SCALE 0u
#define VKI_UNARY_SOFTCAP 1u
#define VKI_UNARY_GELU 2u     /* f(v) = ggml's tanh GELU of v (a unused): starcoder2's FFN */
#define VKI_UNARY_RELU2 3u    /* f(v) = max(v, 0)^2 (a unused): nemotron's and arcee's FFN */
VKI_STRUCT(vki_pc_unary) {
    vki_u32 n_rows, n_cols;
    vki_u32 x_off, x_stride, y_off, y_stride;
    vki_u32 op;       /* VKI_UNARY_* */
    vki_f32 a;
};

/* softmax: y[r, :] = softmax(scale * x[r, :]) (scale > 0). -inf entries give 0; a row that is
 * all -inf gives all 0 (nothing to attend to), not NaN.
 * bindings: 0 x (f32 rows), 1 y (f32 rows; may alias x) */
VKI_STRUCT(vki_pc_softmax) {
    vki_u32 n_rows, n_cols;
    vki_u32 x_off, x_stride, y_off, y_stride;
    vki_f32 scale;
};

/* ---- paged KV cache and attention (engine/ops_attn.h) ---------------------------------------
 * Pools: per layer one K pool and one V pool, each an array of fixed-size pages
 *     K[page][kv_head][slot][head_dim],  slot = position % page_size   (V the same)
 * element F16 (default; IEEE half bits, packed two per 32-bit word, lower dim in the low half),
 * F32, or Q8_0 (a define: one SPIR-V module per type and kernel). A page holds page_size tokens
 * of every KV head, so a sequence needs ceil(n_ctx / page_size) pages per layer (fewer with a
 * sliding window: pages wholly outside every layer's window are released). One pool is bound as
 * one storage buffer: its bytes must not exceed maxStorageBufferRange (128 MiB on lavapipe), so
 * the engine caps the pages of a layer with op_kv_max_pages(). head_dim is a multiple of 8,
 * <= 256 (of 32 for Q8_0).
 *
 * Q8_0 pages keep ggml's Q8_0 numbers (blocks of 32 values of one row: x = d * q, q int8 =
 * round(x / d) half away from zero, d = max|x| / 127 stored as f16) in two planes, so that every
 * access is an aligned 32-bit word:
 *     qs[kv_head][slot][head_dim]            int8, 4 per word, lower dim in the low byte
 *     d [kv_head][slot][VKI_KV_Q8_DW words]  f16 scales, 2 per word (block 2i low, 2i+1 high)
 * then padding to 16 bytes: VKI_KV_Q8_PAGE_WORDS(rows, hd) words per page, rows = n_kv * page
 * (for head_dim 128: 136 bytes per row, as 4 ggml blocks; F16 takes 256). */
#define VKI_KV_Q8_DW(hd) (((hd) / 32u + 1u) / 2u)
#define VKI_KV_Q8_PAGE_WORDS(rows, hd) (((rows) * ((hd) / 4u + VKI_KV_Q8_DW(hd)) + 3u) / 4u * 4u)

/* Per-step buffers the engine uploads each tick:
 *   tok_pos    u32[n_tokens]           position of new token row t
 *   tok_seq    u32[n_tokens]           index into seq_info of the sequence row t belongs to
 *   seq_info   vki_seq_info[n_seqs]
 *   page_table u32[...]                each sequence's page ids in position order, at pt_off
 *   attn_items vki_attn_item[n_items]  the work list op_attn_plan() builds from seq_info */
VKI_STRUCT(vki_seq_info) {
    vki_u32 row0;   /* first new-token row of this sequence in the step's activations */
    vki_u32 n_new;  /* new tokens: rows row0 .. row0 + n_new - 1, positions n_ctx - n_new .. */
    vki_u32 n_ctx;  /* pos0 + n_new: keys the last new token attends to (its own included) */
    vki_u32 pt_off; /* index of this sequence's first page id in page_table */
};

/* One work item (see op_attn_plan):
 *  decode split:  {seq, k0, k1, slot}  keys [k0, k1) of a one-token sequence; slot = partial
 *                 slot, or VKI_ATTN_FINAL when the split is the whole context (writes output)
 *  reduce entry:  {seq, slot0, n, 0}   merges the n partial slots slot0 .. slot0 + n - 1 (n = 1:
 *                 nothing to merge, the split wrote the output; n = 0: a prefilling sequence)
 *  prefill block: {seq, q0, nq, 0}     new tokens q0 .. q0 + nq - 1 of a sequence
 * The list: item 0 holds the decode dispatch's VkDispatchIndirectCommand {n_dec, groups per
 * split, 1}; then n_pre prefill blocks, one reduce entry per sequence (sequence i's at
 * red_off + i, so a split finds its own), the n_dec decode splits. Every offset and every other group count follows from the step's shape (which
 * sequences decode, how many tokens the others bring), not from their contexts, so a recorded
 * step serves every step of its shape. */
VKI_STRUCT(vki_attn_item) {
    vki_u32 seq, a, b, c;
};
#define VKI_ATTN_FINAL 0xffffffffu

/* kv_write: for row t < n_tokens and kv head h, K[t][h*head_dim ..] and V[...] go to page
 * page_table[pt_off(seq) + pos / page_size], slot pos % page_size (Q8_0: quantised there).
 * rope_n_rot > 0: K is rotated on the way (RoPE at the token's position, as vki_pc_rope with
 * n_rot = rope_n_rot, neox = rope_neox and the freqs table at binding 8, bit for bit rope.comp).
 * bindings: 0 k (f32 rows), 1 v (f32 rows), 2 tok_pos, 3 tok_seq, 4 seq_info, 5 page_table,
 *           6 K pool, 7 V pool, 8 freqs (vec4[rope_n_rot/2]; any buffer when rope_n_rot = 0) */
VKI_STRUCT(vki_pc_kv_write) {
    vki_u32 n_tokens, n_kv_heads, head_dim, page_size;
    vki_u32 k_off, k_stride, v_off, v_stride;
    vki_u32 rope_n_rot, rope_neox;
};

/* attention (decode split, prefill block and the split reduce share it). Query head h uses
 * kv head h / (n_heads / n_kv_heads); a workgroup takes `gw` query heads of one kv head
 * (n_hblocks = ceil(group / gw) workgroups per kv head); items item_off .. + n_items.
 * decode  bindings: 0 q, 1 K pool, 2 V pool, 3 seq_info, 4 page_table, 5 items, 6 out, 7 partials,
 *                  8 merge counters (u32 [n_seqs][n_kv_heads * n_hblocks], zero between
 *                  dispatches; any buffer when merge = 0), 9 new K rows, 10 new V rows (f32, at
 *                  k_off / v_off with strides k_stride / v_stride, as kv_write's), 11 RoPE freqs
 *                  (vec4[rope_n_rot / 2]); 9-11: any buffer when fresh = 0; 12 the output
 *                  quantised for the integer-dot path (quant_x8's layout, M = xq_rows, K =
 *                  n_heads * head_dim, head_dim a multiple of 32; any buffer when xq_rows = 0)
 *                  13 sink logits (below)
 * prefill bindings: 0 q, 1 K pool, 2 V pool, 3 seq_info, 4 page_table, 5 items, 6 out, 7 sink logits
 * reduce  bindings: 0 partials, 1 items, 2 seq_info, 3 out, 4 sink logits
 * sink_logits = 1 (gpt-oss): f32 [n_heads] learned logits, one per query head, that join each
 * softmax's denominator and add no value: out = sum_j e^(z_j) v_j / (e^(sink_h) + sum_j e^(z_j)),
 * z_j = scale q.k_j (attn_finish in attn_common.glsl; any buffer when sink_logits = 0).
 * merge = 1 (decode): the last split of a sequence to finish merges its partials (the reduce
 * entry of sequence i is item red_off + i); merge = 0: attn_reduce does, after a barrier.
 * q, out: f32 rows [n_tokens][.. n_heads * head_dim ..] (offsets/strides in floats);
 * partials: f32 [slot][n_heads][head_dim + 2] = unnormalised sum_j p_j v_j, then (max, sum)
 * with p_j = 2^(s_j - max) and the score s_j in the log2 domain:
 *     no cap:  s_j = q_scale * q.k_j                        (q_scale = scale * log2(e))
 *     cap:     s_j = softcap_log2e * tanh(inv_softcap * q_scale * q.k_j)   (q_scale = scale)
 * The query at position p sees keys j <= p with p - j < window (0: all) or j < sink: a
 * sliding window (gemma, mistral, phi3) plus the attention sink of a capped window (StreamingLLM
 * keeps the first page). The prefill kernel masks by them; decode splits are planned on the host
 * over the visible keys only (op_attn_plan_build), so decode never reads a key outside them.
 * fresh = 1 (decode, a step whose sequences each have one new token): q is rotated by RoPE
 * (rope_n_rot, rope_neox; kv_write's arithmetic) as it is loaded, and each sequence's newest key
 * (position n_ctx - 1) is read from the new K / V rows (K rotated), rounded as the pool stores it,
 * not from the pool: the step's kv_write needs no barrier before the attention, nor q a rope
 * pass, and the bits are those of rope + kv_write + barrier + attention. */
VKI_STRUCT(vki_pc_attn) {
    vki_u32 n_heads, n_kv_heads, head_dim, page_size;
    vki_u32 gw, n_hblocks;
    vki_u32 q_off, q_stride, o_off, o_stride;
    vki_u32 item_off, n_items;
    vki_f32 q_scale;       /* multiplies q as it is loaded (see above) */
    vki_f32 inv_softcap;   /* 1 / attention logit soft-cap (gemma 2: 1/50); 0 = no cap */
    vki_f32 softcap_log2e; /* the cap times log2(e) */
    vki_u32 window;        /* keys per query (its own included); 0 = unlimited */
    vki_u32 sink;          /* leading keys every query also sees (0, or a page when capped) */
    vki_u32 red_off;       /* decode: first reduce entry (sequence i's is red_off + i) */
    vki_u32 merge;         /* decode: 1 = the last split merges (see above) */
    vki_u32 fresh;         /* decode: 1 = the newest keys from bindings 9, 10 (see above) */
    vki_u32 k_off, k_stride, v_off, v_stride;
    vki_u32 rope_n_rot, rope_neox;
    vki_u32 xq_rows;       /* decode: M > 0 = also write the output quantised (binding 12, see above) */
    vki_u32 sink_logits;   /* 1 = per-head sink logits in the softmax (see above) */
    vki_f32 temp_scale;    /* temp_len > 0: the query at position pos is also scaled by */
    vki_u32 temp_len;      /* 1 + temp_scale ln(floor(pos / temp_len) + 1) (Llama 4's / Mistral 3's
                              attention temperature); 0 = none */
};

/* ---- sampling (engine/ops_sample.h, shaders/sample.comp, CPU reference engine/sample_ref.h) --
 * One workgroup per logits row. The host packs each row's parameters (sample_pack_row) into
 * host-derived constants (1/temperature, T*log(min_p), top_p in 2^-32 units...) so that the GPU
 * and the CPU reference do the same float arithmetic; only exp() may differ by a few ulp.
 * Order: penalties over the history, logit bias, allowed-token mask, temperature, top-k, top-p,
 * min-p, draw.
 * Order of tokens for every cut: (logit descending, id ascending), so exactly k survive top-k. */
#define VKI_SAMPLE_MAX_TOP 20     /* top logprob alternatives per row */
#define VKI_SAMPLE_GREEDY 1u      /* temperature 0: argmax after penalties and bias, lowest id */
#define VKI_SAMPLE_LOGPROBS 2u    /* fill vki_sample_out.logprob */
#define VKI_SAMPLE_MASK 4u        /* only the tokens whose bit is set in the row's allowed-token mask
                                     (masks binding, ceil(n_vocab / 32) words from mask0; bit i of
                                     word w = token 32w + i) may be drawn: the others count as -inf
                                     after penalties and bias (a grammar's constraint). The
                                     logprobs stay those of the raw logits. */
#define VKI_SAMPLE_PENDING 8u     /* the penalty window's newest token is not among the row's edits:
                                     it is edits[pend].token (count 1, bias 0), written there on the
                                     device when the token was sampled by the step before (a
                                     decode entry of VKI_TOKEN_PREV). It adds one to the count of
                                     the row's entry for that token, or is applied as its own entry
                                     when there is none; ignored when outside the vocabulary (-1:
                                     that step sampled nothing) */

/* One sampled row's parameters (rows binding, vki_sample_row[n_rows]). */
VKI_STRUCT(vki_sample_row) {
    vki_f32 inv_temp;    /* 1 / temperature (unused with VKI_SAMPLE_GREEDY) */
    vki_u32 top_k;       /* 0: off (also when >= n_vocab) */
    vki_u32 top_p32;     /* top_p * 2^32 truncated, >= 1; 0: off (top_p == 1) */
    vki_f32 min_p_delta; /* temperature * log(min_p) <= 0: keep z >= z_max + delta; -inf: off */
    vki_f32 rep;         /* repetition penalty: z = z > 0 ? z * inv_rep : z * rep */
    vki_f32 inv_rep;
    vki_f32 presence;    /* z -= count * frequency + presence, for count > 0 */
    vki_f32 frequency;
    vki_u32 edit0;       /* this row's edits: edits[edit0 .. edit0 + n_edits) */
    vki_u32 n_edits;
    vki_u32 seed_lo, seed_hi; /* Philox4x32-10 key */
    vki_u32 position;    /* Philox counter word 0: position of the token being sampled */
    vki_u32 n_top;       /* top logprob alternatives wanted, 0..VKI_SAMPLE_MAX_TOP */
    vki_u32 flags;       /* VKI_SAMPLE_* */
    vki_u32 mask0;       /* VKI_SAMPLE_MASK: first word of this row's mask in the masks binding */
    vki_u32 pend;        /* VKI_SAMPLE_PENDING: index of the pending entry in the edits binding */
};

/* One distinct token of a row that has a penalty count or a bias (edits binding): applied in
 * place to the logits row, penalties first, then bias; the row is restored before the kernel
 * ends. Entries of one row have distinct tokens (sample_pack_row merges duplicates). */
VKI_STRUCT(vki_sample_edit) {
    vki_i32 token;
    vki_u32 count;       /* occurrences in the penalty window (0: bias only) */
    vki_f32 bias;        /* added after the penalties; -inf bans the token */
};

/* What comes back per row (out binding, vki_sample_out[n_rows]). */
VKI_STRUCT(vki_sample_out) {
    vki_i32 token;       /* chosen id; -1 when every logit is -inf or NaN after bias and mask */
    vki_f32 logprob;     /* log-softmax of the raw logits at token (VKI_SAMPLE_LOGPROBS), else 0 */
    vki_u32 n_top;       /* alternatives filled: min(n_top, n_vocab) */
    vki_u32 n_kept;      /* tokens with nonzero probability after the cuts (1 when greedy) */
    vki_u32 nonfinite;   /* 1: a raw logit of the row (before penalties, bias and mask) is NaN or
                            +inf: the model's numbers broke, the token means nothing. -inf is
                            not counted (a logits post-processor bans tokens with it) */
    vki_i32 top_tokens[VKI_SAMPLE_MAX_TOP];   /* by raw logprob descending, ties lowest id */
    vki_f32 top_logprobs[VKI_SAMPLE_MAX_TOP];
};

/* sample: rows row0 .. row0 + groups - 1 of the rows/out bindings; logits row r of this dispatch
 * is logits[(r - row0) * row_stride ..] of its binding (the view starts at row row0).
 * bindings: 0 logits (f32[rows, row_stride], read-write, restored), 1 rows (vki_sample_row[]),
 *           2 edits (vki_sample_edit[]), 3 saved (f32[n_edits]: raw logits under the edits),
 *           4 out (vki_sample_out[]), 5 masks (u32[]: the masked rows' allowed-token bitsets;
 *           any valid binding when no row has VKI_SAMPLE_MASK) */
VKI_STRUCT(vki_pc_sample) {
    vki_u32 n_vocab;
    vki_u32 row_stride;  /* floats between logits rows, >= n_vocab */
    vki_u32 row0;
};

#endif /* VKI_SHARED_H */
