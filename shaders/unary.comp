#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Elementwise y = a * x (gemma's embedding scale), y = a * tanh(x / a) (gemma 2's final logit
// soft-cap), y = gelu(x) (starcoder2's FFN, common.glsl's tanh GELU) or y = max(x, 0)^2
// (nemotron's, arcee's) over [n_rows, n_cols]
// strided rows; y may alias x. One invocation per element, grid-stride. Memory-bound: 8 bytes
// moved per element.
// UNARY_XQ (unary_xq): one invocation per block of 32 elements of a row (n_cols % 32 == 0), which
// it also writes quantised as quant_x8 would from y (layout vki_pc_quant_x8, M = n_rows, K =
// n_cols): the next integer-dot products' input without that pass.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_unary p; };
layout(std430, binding = 0) readonly buffer X { float x[]; };  // f32 rows: x[x_off + r * x_stride + c]
layout(std430, binding = 1) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + r * y_stride + c]
#ifdef UNARY_XQ
layout(std430, binding = 2) writeonly buffer YQ { uint yq[]; };
layout(std430, binding = 2) writeonly buffer YQD { float yqd[]; };
#include "quant_x8.glsl"
#endif

float unary_f(float v, float inv_a)
{
    // |v / a| >= 9 is +-1 to float precision; the clamp keeps tanh away from inf / inf
    if (p.op == VKI_UNARY_SOFTCAP)
        return p.a * tanh(clamp(v * inv_a, -9.0, 9.0));
    if (p.op == VKI_UNARY_GELU)
        return vki_glu_act(VKI_GLU_GELU_TANH, v);
    if (p.op == VKI_UNARY_RELU2) {
        precise float r = max(v, 0.0) * max(v, 0.0);
        return r;
    }
    return p.a * v;
}

void main()
{
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    float inv_a = 1.0 / p.a;
#ifdef UNARY_XQ
    const uint nb = p.n_cols / 32u, n = p.n_rows * nb;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        const uint r = i / nb, b = i - r * nb, xb = p.x_off + r * p.x_stride + 32u * b,
                   yb = p.y_off + r * p.y_stride + 32u * b;
        vec4 v[8];
        [[unroll]] for (uint k = 0u; k < 8u; k++) {
            v[k] = vec4(unary_f(x[xb + 4u * k], inv_a), unary_f(x[xb + 4u * k + 1u], inv_a),
                        unary_f(x[xb + 4u * k + 2u], inv_a), unary_f(x[xb + 4u * k + 3u], inv_a));
            [[unroll]] for (uint j = 0u; j < 4u; j++)
                y[yb + 4u * k + j] = v[k][j];
        }
        uint q[8];
        float d;
        xq_block(v, q, d);
        XQ_STORE(yq, yqd, p.n_rows, p.n_cols, r, b, q, d);
    }
#else
    uint n = p.n_rows * p.n_cols;
    for (uint i = gl_GlobalInvocationID.x; i < n; i += stride) {
        uint r = i / p.n_cols, c = i - r * p.n_cols;
        y[p.y_off + r * p.y_stride + c] = unary_f(x[p.x_off + r * p.x_stride + c], inv_a);
    }
#endif
}
