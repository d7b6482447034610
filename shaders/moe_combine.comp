#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// The experts' outputs back into the residual stream, weighted: x[t][c] += sum_j w[t][j] *
// o[t * n_used + j][c], j in order (fixed arithmetic per token, whatever shares the batch); with
// p.bias each o row first gets its expert's down bias (gpt-oss). One
// invocation per element, grid-stride; memory-bound: (n_used + 2) * 4 bytes per element.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_moe p; };
layout(std430, binding = 0) readonly buffer O { float o[]; };       // f32[n_tokens * n_used][d]
layout(std430, binding = 1) readonly buffer W { float weights[]; }; // f32[n_tokens][n_used]
layout(std430, binding = 2) buffer X { float x[]; };                // f32[n_tokens][d]
layout(std430, binding = 3) readonly buffer ID { int ids[]; };      // p.bias: i32[n_tokens * n_used]
layout(std430, binding = 4) readonly buffer B { float b[]; };       // p.bias: f32[n_expert][d]

void main()
{
    const uint n = p.n_tokens * p.d, stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        const uint t = i / p.d, c = i - t * p.d;
        float s = 0.0;
        for (uint j = 0u; j < p.n_used; j++) {
            const uint pr = t * p.n_used + j;
            float v = o[pr * p.d + c];
            if (p.bias != 0u)
                v += b[uint(ids[pr]) * p.d + c];
            s += weights[pr] * v;
        }
        x[i] += s;
    }
}
