#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
// RMSNorm, one workgroup per row (grid-stride over rows). Memory-bound: the row is read twice
// (sum of squares, then scale), the second read normally hits the cache; one barrier pair per
// row for the cross-subgroup sum. F32 accumulation in a fixed order that does not depend on the
// workgroup size (norm_common.glsl, shared with the matvec kernel's norm epilogue).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256; // divides NORM_LANES (256)
layout(push_constant) uniform PushBlock { vki_pc_rmsnorm p; };
layout(std430, binding = 0) readonly buffer X { float x[]; };  // f32 rows: x[x_off + r * x_stride + c]
layout(std430, binding = 1) readonly buffer W { float w[]; };  // f32 [n_cols]
layout(std430, binding = 2) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + r * y_stride + c]
#define NORM_SRC(i) x[i]
#include "norm_common.glsl"

void main()
{
    uint tid = gl_LocalInvocationID.x;
    for (uint r = gl_WorkGroupID.x; r < p.n_rows; r += gl_NumWorkGroups.x) {
        uint xb = p.x_off + r * p.x_stride, yb = p.y_off + r * p.y_stride;
        float inv = norm_inv(xb, p.n_cols, p.eps);
        for (uint c = tid; c < p.n_cols; c += WG)
            y[yb + c] = norm_apply(x[xb + c], inv, w[c]);
    }
}
