#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#ifdef RMS_XH
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "common.glsl"
// RMSNorm (LayerNorm without bias where p.mean), one workgroup per row (grid-stride over rows). Memory-bound: the row is read twice
// (sum of squares, then scale), the second read normally hits the cache; one barrier pair per
// row for the cross-subgroup sum. F32 accumulation in a fixed order that does not depend on the
// workgroup size (norm_common.glsl, shared with the matvec kernel's norm epilogue).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256; // divides NORM_LANES (256)
layout(push_constant) uniform PushBlock { vki_pc_rmsnorm p; };
layout(std430, binding = 0) readonly buffer X { float x[]; };  // f32 rows: x[x_off + r * x_stride + c]
layout(std430, binding = 1) readonly buffer W { float w[]; };  // f32 [n_cols]
layout(std430, binding = 2) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + r * y_stride + c]
// p.xq != 0: the rows also quantised as quant_x8 would (layout vki_pc_quant_x8, M = n_rows,
// K = n_cols), the input of the next integer-dot products
layout(std430, binding = 3) writeonly buffer YQ { uint yq[]; };
layout(std430, binding = 3) writeonly buffer YQD { float yqd[]; };
#ifdef RMS_XH
// (rmsnorm_xh) the rows also rounded to F16 as half_x.comp would from y (rows K4 = n_cols rounded
// up to 4 halves apart, zeros after n_cols): the next tensor-core GEMMs' input
layout(std430, binding = 4) writeonly buffer YH { uvec2 yh[]; };
#include "f16x4.glsl"
#endif
#define NORM_SRC(i) x[i]
#include "norm_common.glsl"
// Element c of the row at xb normed (mu, inv: the row's), + its bias (VKI_NORM_BIAS: after the
// weights in w; a uniform branch: RMSNorm's bits stay norm_apply's).
#define NORMED(c) norm_biased(norm_apply_mu(x[xb + (c)], mu, inv, w[c]), c)
float norm_biased(float v, uint c)
{
    if ((p.mode & VKI_NORM_BIAS) == 0u)
        return v;
    precise float r = v + w[p.n_cols + c];
    return r;
}
#include "quant_x8.glsl"

void main()
{
    uint tid = gl_LocalInvocationID.x;
    for (uint r = gl_WorkGroupID.x; r < p.n_rows; r += gl_NumWorkGroups.x) {
        uint xb = p.x_off + r * p.x_stride, yb = p.y_off + r * p.y_stride;
        // LayerNorm (VKI_NORM_MEAN): the mean first, then the squares of the differences from it
        const float mu = (p.mode & VKI_NORM_MEAN) != 0u ? norm_mean(xb, p.n_cols) : 0.0; // uniform
        const float inv = norm_inv_mu(xb, p.n_cols, mu, p.eps);
        for (uint c = tid; c < p.n_cols; c += WG)
            y[yb + c] = NORMED(c);
#ifdef RMS_XH
        // the row's values recomputed from x, bit for bit those stored, by quads
        const uint nq = (p.n_cols + 3u) / 4u;
        for (uint q = tid; q < nq; q += WG) {
            vec4 v = vec4(0.0);
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                const uint c = 4u * q + i;
                if (c < p.n_cols)
                    v[i] = NORMED(c);
            }
            yh[r * nq + q] = cm_f16x4(v);
        }
#endif
        if (p.xq == 0u)
            continue; // uniform
        // the row's values recomputed from x (bit for bit what was just stored; y is not x here,
        // op_rmsnorm_xq), per block of 32 (quant_x8.glsl)
        const uint nb = p.n_cols / 32u;
        for (uint b = tid; b < nb; b += WG) {
            vec4 v[8];
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                const uint c = 32u * b + 4u * i;
                v[i] = vec4(NORMED(c), NORMED(c + 1u), NORMED(c + 2u), NORMED(c + 3u));
            }
            uint q[8];
            float d;
            xq_block(v, q, d);
            XQ_STORE(yq, yqd, p.n_rows, p.n_cols, r, b, q, d);
        }
    }
}
