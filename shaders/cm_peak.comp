#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
// Cooperative-matrix peak: fragments stay in registers and each subgroup runs NACC independent
// multiply-add chains (enough to cover the tensor pipe's latency), so the time is the
// multiply-add throughput and nothing else. 2 * CM_M * CM_N * CM_K * NACC * n_iter flops per
// subgroup. The accumulators start at different values so no two chains are the same
// computation.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NACC = 4;
#define CM_SPEC_ID 2
#include "coopmat.glsl"

layout(push_constant) uniform PushBlock { vki_pc_cm_peak p; };
layout(std430, binding = 0) readonly buffer Src { float src[]; }; // f32[CM_M * CM_K + CM_K * CM_N]
layout(std430, binding = 1) writeonly buffer Dst { float dst[]; }; // f32[groups][subgroups][NACC][CM_M * CM_N]

shared float16_t ab[CM_M * CM_K + CM_K * CM_N]; // A [CM_M][CM_K], then B [CM_K][CM_N]

void main()
{
    for (uint i = gl_LocalInvocationID.x; i < CM_M * CM_K + CM_K * CM_N; i += gl_WorkGroupSize.x)
        ab[i] = float16_t(src[i]);
    barrier();
    CM_DECL_A(a, 1);
    CM_DECL_B(b);
    cm_load_a(a[0], ab, 0u, CM_K);
    cm_load_b(b, ab, CM_M * CM_K, CM_N);
    CM_DECL_C(acc, NACC);
    CM_UNROLL for (uint i = 0u; i < NACC; i++)
        cm_fill_c(acc[i], float(i) * 0.25);
    for (uint it = 0u; it < p.n_iter; it++)
        CM_UNROLL for (uint i = 0u; i < NACC; i++)
            cm_mul_add(acc[i], a[0], b);
    const uint base = ((gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID) * NACC) * CM_M * CM_N;
    CM_UNROLL for (uint i = 0u; i < NACC; i++)
        cm_store_c(acc[i], dst, base + i * CM_M * CM_N, CM_N);
}
