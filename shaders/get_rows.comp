#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Row gather with dequantisation (embedding lookup; with F32 also a gather of activation rows):
// y[i, :] = dequant(W[ids[i], :]). One dispatch per weight part; an id outside the whole
// tensor gets a zero row (from the dispatch with zero_oob = 1) and never an out-of-bounds read.
//
// Bound by: memory bandwidth (n rows of K weights in, n * K floats out); invocations cover
// 4 consecutive elements each (x over the row, y-groups over the ids).
layout(local_size_x_id = 0) in;

#define DQ_BINDING 0
#include "dequant.glsl" // binding 0: W, one part, part_rows rows of w_stride bytes

layout(push_constant) uniform PushBlock { vki_pc_get_rows p; };
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };   // i32[n]
layout(std430, binding = 2) writeonly buffer Y { float y[]; };    // f32[n, y_stride]

void main()
{
    const uint k = 4u * gl_GlobalInvocationID.x;
    if (k >= p.K)
        return;
    for (uint i = gl_WorkGroupID.y; i < p.n; i += gl_NumWorkGroups.y) {
        const int r = ids[i];
        vec4 v;
        if (r >= int(p.row0) && r < int(p.row0 + p.part_rows))
            v = dq_load4(dq_row_base(uint(r) - p.row0, p.w_stride), k, p.K);
        else if (p.zero_oob != 0u && (r < 0 || r >= int(p.n_rows)))
            v = vec4(0.0);
        else
            continue;
        const uint o = i * p.y_stride + k;
        [[unroll]] for (uint c = 0u; c < 4u; c++)
            if (k + c < p.K)
                y[o + c] = v[c];
    }
}
