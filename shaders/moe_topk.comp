#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Router of a mixture-of-experts layer, after the logits GEMV/GEMM: per token the n_used
// largest logits (ties: lower expert first) and their weights (vki_pc_moe). One invocation per
// token, n_used passes over its n_expert logits (each pass takes the largest below the previous
// pick in (logit desc, expert asc) order, so no list of picks is kept): n_used * n_expert
// compares, 1k for Qwen3-MoE's 8 of 128, negligible next to the expert matmuls. The weights are
// softmax(logits) at the picks, as llama.cpp's build_moe_ffn computes them (max-subtracted, F32),
// renormalised over the picks when p.norm. NaN logits are never picked; a token with fewer than
// n_used comparable logits gets expert 0 with weight 0 in the remaining slots.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_moe p; };
layout(std430, binding = 0) readonly buffer L { float logits[]; };  // f32[n_tokens][n_expert]
layout(std430, binding = 1) writeonly buffer I { int ids[]; };      // i32[n_tokens][n_used]
layout(std430, binding = 2) writeonly buffer W { float weights[]; }; // f32[n_tokens][n_used]

void main()
{
    const uint t = gl_GlobalInvocationID.x;
    if (t >= p.n_tokens)
        return;
    const uint l0 = t * p.n_expert, o0 = t * p.n_used;
    float pv = 0.0, vmax = 0.0, sel = 0.0;
    float w[VKI_MOE_MAX_USED];
    int pe = -1;
    for (uint j = 0u; j < p.n_used; j++) {
        int be = -1;
        float bv = 0.0;
        for (uint e = 0u; e < p.n_expert; e++) {
            const float v = logits[l0 + e];
            const bool below = pe < 0 || v < pv || (v == pv && int(e) > pe);
            if (below && !isnan(v) && (be < 0 || v > bv)) // strict >: the lower expert wins a tie
                be = int(e), bv = v;
        }
        if (j == 0u)
            vmax = bv;
        ids[o0 + j] = be < 0 ? 0 : be;
        w[j] = be < 0 ? 0.0 : exp(bv - vmax);
        sel += w[j];
        if (be >= 0)
            pe = be, pv = bv;
    }
    float sum = sel;
    if (p.norm == 0u) {
        sum = 0.0;
        for (uint e = 0u; e < p.n_expert; e++) {
            const float v = logits[l0 + e];
            if (!isnan(v))
                sum += exp(v - vmax);
        }
    }
    for (uint j = 0u; j < p.n_used; j++)
        weights[o0 + j] = sum > 0.0 ? w[j] / sum : 0.0;
}
