#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Groups a step's (token, expert) pairs by expert for matmul_id: a histogram of the experts, its
// exclusive scan, and the pairs of each expert in pair order (stable: the grouped GEMM's output
// does not depend on the order, but the list is then a pure function of the ids, which the
// tests compare exactly). One workgroup: counts with shared atomics, the scan by one invocation
// (n_expert adds), then each invocation lists the pairs of its experts in one pass over the ids
// each: O(n_pairs * n_expert / WG) reads (Qwen3-MoE, 1024-token chunk: 8192 pairs, 128 experts,
// 256 invocations: 4096 reads per invocation, all L1 hits; tens of microseconds on a GPU next to
// the milliseconds of the chunk's expert GEMMs). Ids outside [0, n_expert) are left out.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_moe p; };          // n_tokens = pairs here
layout(std430, binding = 0) readonly buffer I { int ids[]; };       // i32[n_pairs]
layout(std430, binding = 1) writeonly buffer R { uint route[]; };   // u32[n_expert + 1 + n_pairs]

shared uint cnt[VKI_MOE_MAX_EXPERTS];
shared uint off[VKI_MOE_MAX_EXPERTS + 1u];

void main()
{
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x, n = p.n_tokens, E = p.n_expert;
    for (uint e = tid; e < E; e += WG)
        cnt[e] = 0u;
    barrier();
    for (uint i = tid; i < n; i += WG) {
        const int e = ids[i];
        if (e >= 0 && uint(e) < E)
            atomicAdd(cnt[e], 1u);
    }
    barrier();
    if (tid == 0u) {
        uint s = 0u;
        for (uint e = 0u; e < E; e++) {
            off[e] = s;
            s += cnt[e];
        }
        off[E] = s;
    }
    barrier();
    for (uint e = tid; e <= E; e += WG)
        route[e] = off[e];
    for (uint e = tid; e < E; e += WG) {
        uint o = E + 1u + off[e];
        for (uint i = 0u; i < n && o < E + 1u + off[e + 1u]; i++)
            if (ids[i] == int(e))
                route[o++] = i;
    }
}
