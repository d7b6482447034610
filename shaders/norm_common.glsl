// RMSNorm (and LayerNorm) arithmetic shared by rmsnorm.comp and matvec.comp's norm epilogue (VKI_MM_NORM: the
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

// The sum over the NORM_LANES virtual lanes of what each lane adds up: sq false, row elements
// base .. base + n - 1 minus mu; sq true, their squares. Workgroup-uniform control flow (two
// barriers).
float norm_sum(uint base, uint n, float mu, bool sq)
{
    const uint wg = gl_WorkGroupSize.x, sg = gl_SubgroupSize;
    for (uint k = 0u; k < NORM_LANES / wg; k++) {
        uint l = k * wg + gl_SubgroupID * sg + gl_SubgroupInvocationID; // lanes in subgroup order
        precise float ss = 0.0; // precise: no FMA contraction that could differ between kernels
        for (uint c = l; c < n; c += NORM_LANES) {
            precise float v = NORM_SRC(base + c) - mu;
            ss += sq ? v * v : v;
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
    return t;
}

// 1 / sqrt(mean of squares of (row elements base .. base + n - 1) - mu + eps): RMSNorm's with
// mu = 0 (x - 0 is x), LayerNorm's with mu = norm_mean. Workgroup-uniform control flow.
float norm_inv_mu(uint base, uint n, float mu, float eps)
{
    precise float inv = 1.0 / sqrt(norm_sum(base, n, mu, true) / float(n) + eps);
    return inv;
}

float norm_inv(uint base, uint n, float eps)
{
    return norm_inv_mu(base, n, 0.0, eps);
}

// The mean of row elements base .. base + n - 1 (LayerNorm's). Workgroup-uniform control flow.
float norm_mean(uint base, uint n)
{
    precise float mu = norm_sum(base, n, 0.0, false) / float(n);
    return mu;
}

// One normed element: v * inv * g, in that order.
float norm_apply(float v, float inv, float g)
{
    precise float r = v * inv * g;
    return r;
}

// LayerNorm's: (v - mu) * inv * g (norm_apply's bits for mu = 0).
float norm_apply_mu(float v, float mu, float inv, float g)
{
    precise float r = (v - mu) * inv * g;
    return r;
}

#endif
