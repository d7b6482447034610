#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Gated linear unit of the FFN, y = act(g) * u elementwise over [n_rows, n_cols]: SwiGLU
// (act = silu) or GeGLU (act = tanh-approximate GELU). One invocation per element of a
// row-major index, grid-stride. Memory-bound: 12 bytes moved per element.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_glu p; };
layout(std430, binding = 0) readonly buffer G { float g[]; };  // f32 rows: g[g_off + r * g_stride + c]
layout(std430, binding = 1) readonly buffer U { float u[]; };  // f32 rows: u[u_off + r * u_stride + c]
layout(std430, binding = 2) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + r * y_stride + c]

void main()
{
    uint n = p.n_rows * p.n_cols;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        uint r = i / p.n_cols, c = i - r * p.n_cols;
        precise float v = vki_glu_act(p.act, g[p.g_off + r * p.g_stride + c]) * u[p.u_off + r * p.u_stride + c];
        y[p.y_off + r * p.y_stride + c] = v;
    }
}
