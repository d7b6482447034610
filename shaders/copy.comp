#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// y[i] = x[i] for 32-bit words i < n: the device's copy bandwidth, the ceiling that
// bench-kernels and `vkinfer bench-model` report every kernel's and every step's bytes against.
//
// Bound by: memory bandwidth only. Each invocation issues U independent 16-byte loads before
// their stores: reaching HBM's rate needs bandwidth x latency bytes outstanding (~3 TB/s x
// ~600 ns = ~2 MB on an H100), more than one load per invocation gives with the invocations
// an SM holds. Consecutive invocations touch consecutive 16-byte words (coalesced). A grid-stride loop covers any n with the
// dispatch's groups; the last n % 4 words are copied one per invocation.
layout(local_size_x_id = 0) in;
#define U 4u

layout(push_constant) uniform PushBlock { vki_pc_copy p; };
layout(std430, binding = 0) readonly buffer X4 { uvec4 x4[]; };  // u32[n], as uvec4 (16-aligned view)
layout(std430, binding = 0) readonly buffer X1 { uint x1[]; };
layout(std430, binding = 1) writeonly buffer Y4 { uvec4 y4[]; }; // u32[n], as uvec4 (16-aligned view)
layout(std430, binding = 1) writeonly buffer Y1 { uint y1[]; };

void main()
{
    const uint nv = p.n >> 2u;
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint i = gl_GlobalInvocationID.x;
    for (; i + (U - 1u) * stride < nv; i += U * stride) {
        uvec4 v[U];
        [[unroll]] for (uint u = 0u; u < U; u++)
            v[u] = x4[i + u * stride];
        [[unroll]] for (uint u = 0u; u < U; u++)
            y4[i + u * stride] = v[u];
    }
    for (; i < nv; i += stride)
        y4[i] = x4[i];
    const uint t = 4u * nv + gl_GlobalInvocationID.x;
    if (t < p.n)
        y1[t] = x1[t];
}
