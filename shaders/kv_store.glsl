// A new K or V row as the pool stores it, shared by kv_write.comp (which writes it) and
// attn_decode.comp (which, with p.fresh, reads a decode step's newest key from the projection
// instead of the pool): the same rotation and rounding in both, so the two agree bit for bit.
// The including shader declares k_act, v_act (float[]) and fr (vec4[], RoPE's table) and one of
// KV_F16 / KV_Q8_0 (else F32), and includes attn_common.glsl and rope_common.glsl first.
// F16 values and Q8_0 scales round to nearest even in integer arithmetic, bit-exact with
// quant_f32_to_f16 on every device (GLSL's packHalf2x16 leaves the rounding mode to the
// implementation); Q8_0 quantises as ggml's quantize_row_q8_0_ref (and engine/quant.c) does.
#ifndef VKI_KV_STORE_GLSL
#define VKI_KV_STORE_GLSL

#if defined(KV_F16) || defined(KV_Q8_0)
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
#endif

// Element j of the new head row at hb: V as projected, K after RoPE at position pos when n_rot >
// 0 (the pair partner is read and rotated here; dims >= n_rot pass through, as in rope.comp).
float kv_act(uint hb, uint j, bool is_k, uint n_rot, bool neox, uint pos)
{
    if (!is_k)
        return v_act[hb + j];
    if (j >= n_rot)
        return k_act[hb + j];
    uint i = rope_pair_of(j, n_rot, neox);
    uvec2 ab = rope_pair(i, n_rot, neox);
    vec2 r = rope_rotate(k_act[hb + ab.x], k_act[hb + ab.y], rope_angle(pos, fr[i]), fr[i].w);
    return j == ab.x ? r.x : r.y;
}

#ifdef KV_Q8_0
// roundf: to nearest, halves away from zero (v - trunc(v) is exact for |v| <= 127.5)
int round_away(float v)
{
    float t = trunc(v);
    return int(abs(v - t) >= 0.5 ? t + sign(v) : t);
}

// The Q8_0 block of the 32 values from element j0: (d, 1 / d), d = max |x| / 127 before its f16
// rounding; value i is stored as round_away(x_i / d) times d in f16.
vec2 kv_q8_scale(uint hb, uint j0, bool is_k, uint n_rot, bool neox, uint pos)
{
    float amax = 0.0;
    for (uint i = 0; i < 32u; i++)
        amax = max(amax, abs(kv_act(hb, j0 + i, is_k, n_rot, neox, pos)));
    float d = amax / 127.0;
    return vec2(d, d != 0.0 ? 1.0 / d : 0.0);
}
#endif

// Chunk c (dims 8c .. 8c + 7) of the new head row at hb as KV_LOAD reads it back from the pool
// once kv_write has stored it.
void kv_stored_chunk(uint hb, uint c, bool is_k, uint n_rot, bool neox, uint pos, out vec4 lo, out vec4 hi)
{
    float x[8];
    [[unroll]] for (uint e = 0; e < 8u; e++)
        x[e] = kv_act(hb, 8u * c + e, is_k, n_rot, neox, pos);
#if defined(KV_F16)
    [[unroll]] for (uint e = 0; e < 8u; e++)
        x[e] = unpackHalf2x16(half_rne(x[e])).x;
#endif
#if defined(KV_Q8_0)
    vec2 s = kv_q8_scale(hb, 8u * c & ~31u, is_k, n_rot, neox, pos);
    float d = unpackHalf2x16(half_rne(s.x)).x;
    lo = d * vec4(round_away(x[0] * s.y), round_away(x[1] * s.y), round_away(x[2] * s.y), round_away(x[3] * s.y));
    hi = d * vec4(round_away(x[4] * s.y), round_away(x[5] * s.y), round_away(x[6] * s.y), round_away(x[7] * s.y));
#else
    lo = vec4(x[0], x[1], x[2], x[3]);
    hi = vec4(x[4], x[5], x[6], x[7]);
#endif
}

#endif
