#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
// Row softmax y = softmax(scale * x), one workgroup per row (grid-stride over rows). Two passes
// over the row: an online (running max, rescaled sum) pass, then the write. Memory-bound.
// -inf entries contribute exp(-inf) = 0; an all -inf row writes zeros instead of NaN.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256;
layout(push_constant) uniform PushBlock { vki_pc_softmax p; };
layout(std430, binding = 0) readonly buffer X { float x[]; };  // f32 rows: x[x_off + r * x_stride + c]
layout(std430, binding = 1) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + r * y_stride + c]

#define NEG_INF uintBitsToFloat(0xff800000u)
shared float partial[WG]; // one slot per subgroup

float wg_max(float v)
{
    v = subgroupMax(v);
    if (subgroupElect())
        partial[gl_SubgroupID] = v;
    barrier();
    float t = NEG_INF;
    for (uint i = 0; i < gl_NumSubgroups; i++)
        t = max(t, partial[i]);
    barrier();
    return t;
}

float wg_sum(float v)
{
    v = subgroupAdd(v);
    if (subgroupElect())
        partial[gl_SubgroupID] = v;
    barrier();
    float t = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++)
        t += partial[i];
    barrier();
    return t;
}

void main()
{
    uint tid = gl_LocalInvocationID.x;
    for (uint r = gl_WorkGroupID.x; r < p.n_rows; r += gl_NumWorkGroups.x) {
        uint xb = p.x_off + r * p.x_stride, yb = p.y_off + r * p.y_stride;
        float m = NEG_INF, s = 0.0; // this thread's running max and sum of exp(v - m)
        for (uint c = tid; c < p.n_cols; c += WG) {
            float v = p.scale * x[xb + c];
            if (v > m) {
                s = s * exp(m - v) + 1.0; // exp(-inf) = 0 on the first finite value
                m = v;
            } else if (v != NEG_INF) {
                s += exp(v - m);
            }
        }
        float mx = wg_max(m);
        float tot = wg_sum(m == NEG_INF ? 0.0 : s * exp(m - mx));
        float inv = mx == NEG_INF ? 0.0 : 1.0 / tot;
        for (uint c = tid; c < p.n_cols; c += WG) {
            float v = p.scale * x[xb + c];
            y[yb + c] = v == NEG_INF ? 0.0 : exp(v - mx) * inv;
        }
    }
}
