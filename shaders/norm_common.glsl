// RMSNorm arithmetic shared by rmsnorm.comp and matvec.comp's norm epilogue (VKI_MM_NORM: the
// projection that writes the residual stream also writes the next block's normed input), so the
// fold gives rmsnorm.comp's bits on a device whose kernels share one subgroup size. The including
// shader defines NORM_SRC(i), the row's element i of its source buffer, and needs
// GL_KHR_shader_subgroup_arithmetic.
//
// The sum of squares runs over NORM_LANES virtual lanes whatever the workgroup size (which must
// divide NORM_LANES and be whole subgroups): virtual lane l sums elements l, l + NORM_LANES, ...
// in order; each subgroup adds its lanes (subgroupAdd), and the workgroup adds the subgroups'
// sums in lane order. A 128-invocation matvec workgroup takes two virtual lanes per invocation
// and reduces exactly as a 256-invocation rmsnorm workgroup.
#ifndef VKI_NORM_COMMON_GLSL
#define VKI_NORM_COMMON_GLSL

const uint NORM_LANES = VKI_NORM_LANES;
shared float norm_part[NORM_LANES]; // one per virtual subgroup

// 1 / sqrt(mean of squares of row elements base .. base + n - 1 + eps). Workgroup-uniform
// control flow (two barriers).
float norm_inv(uint base, uint n, float eps)
{
    const uint wg = gl_WorkGroupSize.x, sg = gl_SubgroupSize;
    for (uint k = 0u; k < NORM_LANES / wg; k++) {
        uint l = k * wg + gl_SubgroupID * sg + gl_SubgroupInvocationID; // lanes in subgroup order
        precise float ss = 0.0; // precise: no FMA contraction that could differ between kernels
        for (uint c = l; c < n; c += NORM_LANES) {
            float v = NORM_SRC(base + c);
            ss += v * v;
        }
        ss = subgroupAdd(ss);
        if (subgroupElect())
            norm_part[(k * wg) / sg + gl_SubgroupID] = ss;
    }
    barrier();
    precise float t = 0.0;
    for (uint i = 0u; i < NORM_LANES / sg; i++)
        t += norm_part[i];
    barrier(); // norm_part is reused by the next row
    precise float inv = 1.0 / sqrt(t / float(n) + eps);
    return inv;
}

// One normed element: v * inv * g, in that order.
float norm_apply(float v, float inv, float g)
{
    precise float r = v * inv * g;
    return r;
}

#endif
