#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// y = a + b elementwise (the residual add). One invocation per element; grid-stride loop so
// any n fits the dispatch limits.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_add p; };
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride)
        y[i] = a[i] + b[i];
}
