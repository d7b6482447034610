#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Elementwise y = a * x (gemma's embedding scale), y = a * tanh(x / a) (gemma 2's final logit
// soft-cap) or y = gelu(x) (starcoder2's FFN, common.glsl's tanh GELU) over [n_rows, n_cols] strided rows; y may alias x. One invocation per element,
// grid-stride. Memory-bound: 8 bytes moved per element.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_unary p; };
layout(std430, binding = 0) readonly buffer X { float x[]; };  // f32 rows: x[x_off + r * x_stride + c]
layout(std430, binding = 1) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + r * y_stride + c]

void main()
{
    uint n = p.n_rows * p.n_cols;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    float inv_a = 1.0 / p.a;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        uint r = i / p.n_cols, c = i - r * p.n_cols;
        float v = x[p.x_off + r * p.x_stride + c];
        // |v / a| >= 9 is +-1 to float precision; the clamp keeps tanh away from inf / inf
        y[p.y_off + r * p.y_stride + c] = p.op == VKI_UNARY_SOFTCAP ? p.a * tanh(clamp(v * inv_a, -9.0, 9.0))
                                        : p.op == VKI_UNARY_GELU    ? vki_glu_act(VKI_GLU_GELU_TANH, v)
                                                                    : p.a * v;
    }
}
