#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attn_common.glsl"
#include "rope_common.glsl"
// Writes the step's new K and V rows into their pages: one invocation per (token, kv head,
// 8-dim chunk) (Q8_0: per pair of 32-value blocks, whose two f16 scales share a word),
// grid-stride. Memory-bound and small (2 * n_tokens * n_kv * head_dim values). The rounding
// (f16 to nearest even, ggml's Q8_0) is kv_store.glsl's, shared with attn_decode's reading of a
// new key. With p.rope_n_rot > 0, K is rotated (RoPE) as it is read, with rope.comp's
// arithmetic: the decode step needs no rope pass over K and no barrier between it and this write.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_kv_write p; };
layout(std430, binding = 0) readonly buffer KA { float k_act[]; };         // f32 rows: [k_off + t * k_stride + h * head_dim + d]
layout(std430, binding = 1) readonly buffer VA { float v_act[]; };         // f32 rows: [v_off + t * v_stride + h * head_dim + d]
layout(std430, binding = 2) readonly buffer TP { uint tok_pos[]; };        // u32 [n_tokens]
layout(std430, binding = 3) readonly buffer TS { uint tok_seq[]; };        // u32 [n_tokens]
layout(std430, binding = 4) readonly buffer SI { vki_seq_info seqs[]; };   // [n_seqs]
layout(std430, binding = 5) readonly buffer PT { uint page_table[]; };     // u32 page ids
layout(std430, binding = 6) writeonly buffer KP { KV_T kpool[]; };         // K[page][kv_head][slot][head_dim] (Q8_0: two planes)
layout(std430, binding = 7) writeonly buffer VP { KV_T vpool[]; };         // V, same layout
layout(std430, binding = 8) readonly buffer F { vec4 fr[]; };              // vec4 [rope_n_rot / 2] (rope.comp's)

#include "kv_store.glsl"

#ifdef KV_F16
uvec4 pack8(vec4 a, vec4 b)
{
    return uvec4(half_rne(a.x) | (half_rne(a.y) << 16), half_rne(a.z) | (half_rne(a.w) << 16),
                 half_rne(b.x) | (half_rne(b.y) << 16), half_rne(b.z) | (half_rne(b.w) << 16));
}
#endif

uint tpos; // position of the token being written

// Element j of the head row at hb (kv_store.glsl: K rotated when p.rope_n_rot > 0).
float act_at(uint hb, uint j, bool is_k)
{
    return kv_act(hb, j, is_k, p.rope_n_rot, p.rope_neox != 0u, tpos);
}

vec4 load4(uint hb, uint j, bool is_k)
{
    return vec4(act_at(hb, j, is_k), act_at(hb, j + 1, is_k), act_at(hb, j + 2, is_k), act_at(hb, j + 3, is_k));
}

#ifdef KV_Q8_0
// Quantises the 32 values from element j0 of the head row at hb into its 8 qs words at qw;
// returns its f16 scale.
uint quant_block(uint hb, uint j0, bool is_k, uint qw)
{
    vec2 s = kv_q8_scale(hb, j0, is_k, p.rope_n_rot, p.rope_neox != 0u, tpos);
    float id = s.y;
    for (uint w = 0; w < 8u; w++) {
        uint word = 0u;
        for (uint e = 0; e < 4u; e++)
            word |= (uint(round_away(act_at(hb, j0 + 4u * w + e, is_k) * id)) & 0xffu) << (8u * e);
        if (is_k)
            kpool[qw + w] = word;
        else
            vpool[qw + w] = word;
    }
    return half_rne(s.x);
}

// Blocks 2 bp and 2 bp + 1 of row rip of page `page` (the second may not exist).
void write_q8(uint page, uint rip, uint bp, uint kb, uint vb)
{
    uint hd = p.head_dim, nb = hd / 32u, pb = KV_Q8_PAGE(page, hd);
    uint dw = pb + KV_Q8_DPLANE(hd) + rip * VKI_KV_Q8_DW(hd) + bp;
    for (int kv = 0; kv < 2; kv++) {
        bool is_k = kv == 0;
        uint base = is_k ? kb : vb, word = 0u;
        for (uint j = 0; j < 2u && 2u * bp + j < nb; j++) {
            uint b = 2u * bp + j;
            word |= quant_block(base, 32u * b, is_k, pb + (rip * hd + 32u * b) / 4u) << (16u * j);
        }
        if (is_k)
            kpool[dw] = word;
        else
            vpool[dw] = word;
    }
}
#endif

void main()
{
#ifdef KV_Q8_0
    uint per_row = VKI_KV_Q8_DW(p.head_dim); // pairs of blocks
#else
    uint per_row = p.head_dim / 8;           // chunks
#endif
    uint n = p.n_tokens * p.n_kv_heads * per_row;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint idx = gl_GlobalInvocationID.x; idx < n; idx += stride) {
        uint c = idx % per_row, th = idx / per_row;
        uint h = th % p.n_kv_heads, t = th / p.n_kv_heads;
        uint pos = tok_pos[t];
        tpos = pos;
        uint page = page_table[seqs[tok_seq[t]].pt_off + pos / p.page_size], rip = h * p.page_size + pos % p.page_size;
        uint kb = p.k_off + t * p.k_stride + h * p.head_dim;
        uint vb = p.v_off + t * p.v_stride + h * p.head_dim;
#if defined(KV_Q8_0)
        write_q8(page, rip, c, kb, vb);
#else
        uint ci = (page * KV_ROWS_PP + rip) * (p.head_dim / 8) + c, j = 8 * c;
#if defined(KV_F16)
        kpool[ci] = pack8(load4(kb, j, true), load4(kb, j + 4, true));
        vpool[ci] = pack8(load4(vb, j, false), load4(vb, j + 4, false));
#else
        kpool[2 * ci] = load4(kb, j, true);
        kpool[2 * ci + 1] = load4(kb, j + 4, true);
        vpool[2 * ci] = load4(vb, j, false);
        vpool[2 * ci + 1] = load4(vb, j + 4, false);
#endif
#endif
    }
}
