#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attn_common.glsl"
// Merges the decode splits of each sequence that has several: one workgroup per (reduce entry,
// query head), one invocation per output dim (attn_merge.glsl). Runs after a barrier behind the
// decode dispatch when the engine does not let the last split merge (--no-fusion); entries
// with fewer than two splits return (the split wrote the output itself).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;
layout(push_constant) uniform PushBlock { vki_pc_attn p; };
layout(std430, binding = 0) readonly buffer PA { float part[]; };         // f32 [slot][n_heads][head_dim + 2]
layout(std430, binding = 1) readonly buffer IT { uvec4 items[]; };        // vki_attn_item: {seq, slot0, n, 0}
layout(std430, binding = 2) readonly buffer SI { vki_seq_info seqs[]; };  // [n_seqs]
layout(std430, binding = 3) writeonly buffer O { float o[]; };            // f32 rows: [o_off + t * o_stride + h * head_dim + d]
layout(std430, binding = 4) readonly buffer SL { float sink_logit[]; };   // p.sink_logits: f32 [n_heads]
#include "attn_merge.glsl"

void main()
{
    uvec4 it = items[p.item_off + gl_WorkGroupID.x];
    if (it.z < 2) // one split (it wrote the output itself), or a prefilling sequence
        return;
    uint h = gl_WorkGroupID.y, hd = p.head_dim;
    vki_seq_info sq = seqs[it.x];
    uint t = sq.row0 + sq.n_new - 1;
    for (uint d = gl_LocalInvocationID.x; d < hd; d += WG)
        o[p.o_off + t * p.o_stride + h * hd + d] = attn_merge(it.y, it.z, h, d);
}
