#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "quant_x8.glsl"
// The activations of the integer-dot matrix-vector path (matvec.comp with MV_I8): X rows
// quantised to int8 per block of 32 with one f32 scale (ggml's Q8_0 rounding, the scale kept in
// f32), layout vki_shared.h (vki_pc_quant_x8). One invocation per block: eight vec4 loads, the
// block's max |x|, then eight packed words.
//
// Bound by: nothing measurable: K / 32 invocations per row, ~1/1000 of the bytes of the weight
// matrix the product then streams (4096 floats against a 4096 x 4096 matrix).
layout(local_size_x_id = 0) in;

layout(push_constant) uniform PushBlock { vki_pc_quant_x8 p; };
layout(std430, binding = 0) readonly buffer X { float x[]; };   // f32[M, x_stride]
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };  // same, when p.x_vec4 == 1
layout(std430, binding = 1) writeonly buffer XQ { uint xq[]; }; // VKI_XQ_WORDS(M, K) words
layout(std430, binding = 1) writeonly buffer XD { float xd[]; }; // the same buffer: the scales

vec4 load_x4(uint m, uint k)
{
    uint i = m * p.x_stride + k;
    if (p.x_vec4 != 0u)
        return x4[i >> 2];
    return vec4(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

void main()
{
    const uint nb = p.K / 32u, b = gl_GlobalInvocationID.x, m = gl_GlobalInvocationID.y;
    if (b >= nb || m >= p.M)
        return;
    vec4 v[8];
    [[unroll]] for (uint i = 0u; i < 8u; i++)
        v[i] = load_x4(m, 32u * b + 4u * i);
    uint q[8];
    float d;
    xq_block(v, q, d);
    XQ_STORE(xq, xd, p.M, p.K, m, b, q, d);
}
