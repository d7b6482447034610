#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef GLU_XH
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "common.glsl"
// Gated linear unit of the FFN, y = act(g) * u elementwise over [n_rows, n_cols]: SwiGLU
// (act = silu), GeGLU (act = tanh-approximate GELU) or gpt-oss's clamped SwiGLU (vki_glu), with
// p.bias the experts' gate and up biases of each row's expert added first. One invocation per
// element of a row-major index, grid-stride. Memory-bound: 12 bytes moved per element.
// Compiled with GLU_XH (glu_xh) Y is the down projection's tensor-core GEMM input instead: the
// values rounded to F16 as half_x.comp would round them from the F32 rows, rows y_stride halves
// apart (n_cols rounded up to 4, zeros after n_cols), one invocation per quad of 4 values; the
// F32 rows are not written (10 bytes moved per element, and no half_x pass reading them back).
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_glu p; };
layout(std430, binding = 0) readonly buffer G { float g[]; };  // f32 rows: g[g_off + r * g_stride + c]
layout(std430, binding = 1) readonly buffer U { float u[]; };  // f32 rows: u[u_off + r * u_stride + c]
#ifdef GLU_XH
layout(std430, binding = 2) writeonly buffer YH { uvec2 yh[]; }; // f16 quads: row r at yh[(y_off + r * y_stride) / 4]
#include "f16x4.glsl"
#else
layout(std430, binding = 2) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + r * y_stride + c]
#endif
layout(std430, binding = 3) readonly buffer ID { int ids[]; };  // p.bias: row r's expert
layout(std430, binding = 4) readonly buffer GB { float gb[]; }; // p.bias: f32 [n_expert][n_cols]
layout(std430, binding = 5) readonly buffer UB { float ub[]; }; // p.bias: f32 [n_expert][n_cols]

float glu(uint r, uint c)
{
    float gv = g[p.g_off + r * p.g_stride + c], uv = u[p.u_off + r * p.u_stride + c];
    if (p.bias != 0u) {
        uint b = uint(ids[r]) * p.n_cols + c;
        gv += gb[b];
        uv += ub[b];
    }
    return vki_glu(p.act, gv, uv);
}

void main()
{
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
#ifdef GLU_XH
    const uint nq = p.y_stride / 4u, n = p.n_rows * nq;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        const uint r = i / nq, c0 = 4u * (i - r * nq);
        vec4 v = vec4(0.0);
        [[unroll]] for (uint j = 0u; j < 4u; j++)
            if (c0 + j < p.n_cols)
                v[j] = glu(r, c0 + j);
        yh[(p.y_off + r * p.y_stride + c0) / 4u] = cm_f16x4(v);
    }
#else
    uint n = p.n_rows * p.n_cols;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        uint r = i / p.n_cols, c = i - r * p.n_cols;
        y[p.y_off + r * p.y_stride + c] = glu(r, c);
    }
#endif
}
