// The activation side shared by the tiled GEMMs (matmul.comp, matmul_cm.comp): push constants,
// bindings 1..3 of vki_pc_matmul (binding 0, the weights, is dequant.glsl's) and the X loader.
// Include after dequant.glsl (DQ_FLOAT marks the F32/F16 types, whose K need not be a multiple
// of 4). With MM_ID (the experts' matmul_id) rows go through moe_id.glsl's maps; otherwise the
// maps are the identity and MM_ROWS is M.
#ifdef MM_ID
#include "moe_id.glsl"
#else
layout(push_constant) uniform PushBlock { vki_pc_matmul p; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; }; // f32[y_col0 + N] if VKI_MM_BIAS
#define MM_ROWS p.M
#define Y_ROW(m) (m)
#define X_ROW(m) (m)
#define W_ROW(n) (n)
#endif
layout(std430, binding = 1) readonly buffer X { float x[]; };    // f32[M, x_stride]
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };   // same, when p.x_vec4 == 1
layout(std430, binding = 3) buffer Y { float y[]; };             // f32[M, y_stride] (read: VKI_MM_ACCUM)

// X[m, k..k+3]; k % 4 == 0. Elements at k >= K (only in F32/F16 tails) read as 0.
vec4 load_x4(uint m, uint k)
{
    uint i = X_ROW(m) * p.x_stride + k;
#ifdef DQ_FLOAT
    if (k + 4u > p.K) {
        vec4 v = vec4(0.0);
        [[unroll]] for (uint c = 0u; c < 4u; c++)
            if (k + c < p.K) v[c] = x[i + c];
        return v;
    }
#endif
    if (p.x_vec4 != 0u)
        return x4[i >> 2];
    return vec4(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

// Y[m, n] (+)= acc (+ bias[n]) for m < M, n < N (edge tiles compute padding that is dropped here).
void store_y(uint m, uint n, float acc)
{
#ifdef MM_ID
    if (m < MM_ROWS && n < p.N)
        y[Y_ROW(m) * p.y_stride + p.y_col0 + n] = acc;
#else
    if (m < p.M && n < p.N) {
        const uint i = m * p.y_stride + p.y_col0 + n;
        if ((p.flags & VKI_MM_BIAS) != 0u)
            acc += bias[p.y_col0 + n];
        y[i] = (p.flags & VKI_MM_ACCUM) != 0u ? y[i] + acc : acc;
    }
#endif
}
