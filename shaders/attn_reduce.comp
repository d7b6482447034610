#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attn_common.glsl"
// Merges the decode splits of a sequence: one workgroup per (reduce entry, query head), one
// invocation per output dim. out = sum_i 2^(m_i - M) acc_i / sum_i 2^(m_i - M) l_i over the
// entry's n partial slots, M = max_i m_i. Reads n * (head_dim + 2) floats per head: small next
// to the K/V the splits read.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(push_constant) uniform PushBlock { vki_pc_attn p; };
layout(std430, binding = 0) readonly buffer PA { float part[]; };         // f32 [slot][n_heads][head_dim + 2]
layout(std430, binding = 1) readonly buffer IT { uvec4 items[]; };        // vki_attn_item: {seq, slot0, n, 0}
layout(std430, binding = 2) readonly buffer SI { vki_seq_info seqs[]; };  // [n_seqs]
layout(std430, binding = 3) writeonly buffer O { float o[]; };            // f32 rows: [o_off + t * o_stride + h * head_dim + d]

void main()
{
    uvec4 it = items[p.item_off + gl_WorkGroupID.x];
    if (it.z < 2) // one split: it wrote the output itself
        return;
    uint h = gl_WorkGroupID.y, hd = p.head_dim;
    vki_seq_info sq = seqs[it.x];
    uint t = sq.row0 + sq.n_new - 1;
    float mx = NEG_INF;
    for (uint i = 0; i < it.z; i++)
        mx = max(mx, part[((it.y + i) * p.n_heads + h) * (hd + 2) + hd]);
    float den = 0.0;
    for (uint i = 0; i < it.z; i++) {
        uint pb = ((it.y + i) * p.n_heads + h) * (hd + 2);
        den += exp2(part[pb + hd] - mx) * part[pb + hd + 1];
    }
    for (uint d = gl_LocalInvocationID.x; d < hd; d += WG) {
        float num = 0.0;
        for (uint i = 0; i < it.z; i++) {
            uint pb = ((it.y + i) * p.n_heads + h) * (hd + 2);
            num += exp2(part[pb + hd] - mx) * part[pb + d];
        }
        o[p.o_off + t * p.o_stride + h * hd + d] = num / den;
    }
}
