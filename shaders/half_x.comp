#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#include "common.glsl"
#include "f16x4.glsl"
// X rounded to F16 once, for the tensor-core GEMM (matmul_cm.comp with XH = 1), whose staging
// would otherwise load each F32 quad of X and convert it again for every one of the N / BN tile
// columns that read it: XH[m][k] = f16(X[m][k]) for k < K, 0 for K <= k < K4 = K rounded up to
// 4 (rows K4 halves apart: each quad one aligned 8-byte word). cm_f16x4 is the staging's own
// rounding, so the GEMM's tiles hold the same bits either way. One invocation per quad of a
// row, rows grid-strided along y (a prefill's rows may outnumber the device's workgroups in y).
//
// Bound by: memory bandwidth, 6 bytes per element (a 512 x 4096 X: 12 MB, a few us on an H200,
// against the hundreds of us of the product that reads it).
layout(local_size_x_id = 0) in;

layout(push_constant) uniform PushBlock { vki_pc_quant_x8 p; }; // M, K, x_stride, x_vec4
layout(std430, binding = 0) readonly buffer X { float x[]; };    // f32[M, x_stride]
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };   // same, when p.x_vec4 == 1
layout(std430, binding = 1) writeonly buffer XH { uvec2 xh[]; }; // f16 quads [M][K4 / 4]

void main()
{
    const uint nq = (p.K + 3u) / 4u, q = gl_GlobalInvocationID.x, k = 4u * q;
    if (q >= nq)
        return;
    for (uint m = gl_WorkGroupID.y; m < p.M; m += gl_NumWorkGroups.y) {
        const uint i = m * p.x_stride + k;
        vec4 v = vec4(0.0);
        if (k + 4u > p.K) { // the row's tail: x_stride may end right after K
            [[unroll]] for (uint c = 0u; c < 4u; c++)
                if (k + c < p.K)
                    v[c] = x[i + c];
        } else if (p.x_vec4 != 0u) {
            v = x4[i >> 2];
        } else {
            v = vec4(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
        }
        xh[m * nq + q] = cm_f16x4(v);
    }
}
