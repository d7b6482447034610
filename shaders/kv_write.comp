#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "attn_common.glsl"
// Writes the step's new K and V rows into their pages: one invocation per (token, kv head,
// 8-dim chunk), grid-stride. Memory-bound and small (2 * n_tokens * n_kv * head_dim values).
// F16 pools round to nearest even in integer arithmetic, bit-exact with quant_f32_to_f16 on
// every device (GLSL's packHalf2x16 leaves the rounding mode to the implementation).
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_kv_write p; };
layout(std430, binding = 0) readonly buffer KA { float k_act[]; };         // f32 rows: [k_off + t * k_stride + h * head_dim + d]
layout(std430, binding = 1) readonly buffer VA { float v_act[]; };         // f32 rows: [v_off + t * v_stride + h * head_dim + d]
layout(std430, binding = 2) readonly buffer TP { uint tok_pos[]; };        // u32 [n_tokens]
layout(std430, binding = 3) readonly buffer TS { uint tok_seq[]; };        // u32 [n_tokens]
layout(std430, binding = 4) readonly buffer SI { vki_seq_info seqs[]; };   // [n_seqs]
layout(std430, binding = 5) readonly buffer PT { uint page_table[]; };     // u32 page ids
layout(std430, binding = 6) writeonly buffer KP { KV_T kpool[]; };         // K[page][kv_head][slot][head_dim]
layout(std430, binding = 7) writeonly buffer VP { KV_T vpool[]; };         // V, same layout

#ifdef KV_F16
uint half_rne(float f)
{
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { // inf, or nan keeping its top payload bits
        uint m = (ax & 0x7fffffu) >> 13;
        return ax == 0x7f800000u ? sign | 0x7c00u : sign | 0x7c00u | (m != 0u ? m : 0x200u);
    }
    if (ax >= 0x477ff000u) // rounds past 65504
        return sign | 0x7c00u;
    if (ax < 0x38800000u) { // half subnormal: q * 2^-24
        uint e = ax >> 23;
        if (e < 102u)
            return sign;
        uint m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uint q = m >> shift, rem = m & ((1u << shift) - 1u), hf = 1u << (shift - 1u);
        if (rem > hf || (rem == hf && (q & 1u) != 0u))
            q++;
        return sign | q;
    }
    uint r = ax - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | (r >> 13);
}

uvec4 pack8(vec4 a, vec4 b)
{
    return uvec4(half_rne(a.x) | (half_rne(a.y) << 16), half_rne(a.z) | (half_rne(a.w) << 16),
                 half_rne(b.x) | (half_rne(b.y) << 16), half_rne(b.z) | (half_rne(b.w) << 16));
}
#endif

vec4 load4(uint base, bool is_k)
{
    return is_k ? vec4(k_act[base], k_act[base + 1], k_act[base + 2], k_act[base + 3])
                : vec4(v_act[base], v_act[base + 1], v_act[base + 2], v_act[base + 3]);
}

void main()
{
    uint d8 = p.head_dim / 8;
    uint n = p.n_tokens * p.n_kv_heads * d8;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint idx = gl_GlobalInvocationID.x; idx < n; idx += stride) {
        uint c = idx % d8, th = idx / d8;
        uint h = th % p.n_kv_heads, t = th / p.n_kv_heads;
        uint pos = tok_pos[t];
        uint page = page_table[seqs[tok_seq[t]].pt_off + pos / p.page_size];
        uint ci = KV_ROW_CHUNK(page, h, pos % p.page_size, p.n_kv_heads, p.page_size, d8) + c;
        uint kb = p.k_off + t * p.k_stride + h * p.head_dim + 8 * c;
        uint vb = p.v_off + t * p.v_stride + h * p.head_dim + 8 * c;
#ifdef KV_F16
        kpool[ci] = pack8(load4(kb, true), load4(kb + 4, true));
        vpool[ci] = pack8(load4(vb, false), load4(vb + 4, false));
#else
        kpool[2 * ci] = load4(kb, true);
        kpool[2 * ci + 1] = load4(kb + 4, true);
        vpool[2 * ci] = load4(vb, false);
        vpool[2 * ci + 1] = load4(vb + 4, false);
#endif
    }
}
