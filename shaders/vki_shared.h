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

/* ggml tensor type ids (GGUF tensor_info.type). Only those vkinfer runs are listed. */
#define VKI_GGML_F32 0
#define VKI_GGML_F16 1
#define VKI_GGML_Q4_0 2
#define VKI_GGML_Q8_0 8
#define VKI_GGML_Q4_K 12
#define VKI_GGML_Q6_K 14

/* Block layouts (bytes per block of QK elements), as in ggml:
 *  Q8_0: { f16 d; int8 qs[32]; }                         34 bytes / 32 weights
 *  Q4_0: { f16 d; uint8 qs[16]; }  w = (q - 8) * d        18 bytes / 32 weights
 *        low nibbles are elements 0..15, high nibbles 16..31
 *  Q4_K: { f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]; }   144 bytes / 256 weights
 *  Q6_K: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; } 210 bytes / 256 weights */
#define VKI_QK8_0 32
#define VKI_QK4_0 32
#define VKI_QK_K 256
#define VKI_Q8_0_BYTES 34
#define VKI_Q4_0_BYTES 18
#define VKI_Q4_K_BYTES 144
#define VKI_Q6_K_BYTES 210

/* ---- push-constant structs (one per kernel family) ----------------------------------------- */

/* add: y[i] = a[i] + b[i], i < n.  bindings: 0 a (f32[n]), 1 b (f32[n]), 2 y (f32[n]) */
VKI_STRUCT(vki_pc_add) {
    vki_u32 n;
};

/* matvec / matmul (one weight part per dispatch):
 *   Y[m, y_col0 + n] = sum_k X[m, k] * W[n, k] (+ bias[y_col0 + n]),  m < M, n0 <= n < N
 * bindings: 0 W (weight part: N rows of K elements in the kernel's ggml type, w_stride bytes
 *             apart, raw GGUF blocks), 1 X (f32[M, x_stride]),
 *           2 bias (f32[>= y_col0 + N]; any valid binding when has_bias == 0),
 *           3 Y (f32[M, y_stride]) */
VKI_STRUCT(vki_pc_matmul) {
    vki_u32 M, N, K;
    vki_u32 n0;       /* first weight row of this dispatch (splits huge N over dispatches) */
    vki_u32 w_stride; /* bytes between weight rows (the tensor's row_bytes) */
    vki_u32 x_stride; /* elements between X rows */
    vki_u32 y_stride; /* elements between Y rows */
    vki_u32 y_col0;   /* Y column (and bias index) of weight row 0 of this part */
    vki_u32 has_bias;
    vki_u32 x_vec4;   /* 1: X rows may be read as vec4 (x_stride % 4 == 0, binding 16-aligned) */
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

#endif /* VKI_SHARED_H */
