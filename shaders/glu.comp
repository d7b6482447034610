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

// tanh without the inf/inf of exp-based implementations: |z| >= 9 is +-1 to float precision.
float tanh_sat(float z) { return tanh(clamp(z, -9.0, 9.0)); }

float act(float v)
{
    if (p.act == VKI_GLU_GELU_TANH) {
        // ggml's GELU (the one Gemma is trained with): 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
        return 0.5 * v * (1.0 + tanh_sat(0.7978845608028654 * v * (1.0 + 0.044715 * v * v)));
    }
    // v / (1 + e^-v): e^-v = inf for v < -88 gives -0, the right limit; no NaN path.
    return v / (1.0 + exp(-v));
}

void main()
{
    uint n = p.n_rows * p.n_cols;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        uint r = i / p.n_cols, c = i - r * p.n_cols;
        y[p.y_off + r * p.y_stride + c] = act(g[p.g_off + r * p.g_stride + c]) * u[p.u_off + r * p.u_stride + c];
    }
}
