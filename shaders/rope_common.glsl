// RoPE arithmetic shared by rope.comp and kv_write.comp (which rotates K as it writes the cache):
// the same angle and the same rounding in both, so the fold is the separate pass bit for bit.
//
// Angle: theta = pos * f_i would need double precision for large positions (pos * f_i ~ 1e5
// rad, and a float ulp there is ~0.008 rad). Instead freqs[i] holds g = f_i / 2pi (turns per
// position) split into g1 + g2 (12 significant bits each) + g3, and pos = ph * 4096 + pl with
// 12-bit halves: every product ph*g1, ph*g2, pl*g1, pl*g2 is exact in float, so is its
// fractional part, and pos * g3 is tiny. Summing the fractions modulo 1 loses < 2^-23 turns;
// the angle then is in [-pi, pi] where sin/cos are accurate.
#ifndef VKI_ROPE_COMMON_GLSL
#define VKI_ROPE_COMMON_GLSL

const float TWO_PI = 6.28318530717958647692;

// x - nearest integer, exact for any float x.
float centered_fract(float v)
{
    return v - floor(v + 0.5);
}

// Angle of a pair with table entry g (vec4 {g1, g2, g3, magnitude}) at position ps, in [-pi, pi].
float rope_angle(uint ps, vec4 g)
{
    float ph = float(ps >> 12), pl = float(ps & 4095u);
    precise float s = centered_fract(ph * g.x * 4096.0);
    s = centered_fract(s + centered_fract(ph * g.y * 4096.0));
    s = centered_fract(s + centered_fract(pl * g.x));
    s = centered_fract(s + centered_fract(pl * g.y));
    s = centered_fract(s + float(ps) * g.z);
    return s * TWO_PI;
}

// Pair (x0, x1) rotated by ang and scaled by mag (the table entry's w: LongRoPE's and YaRN's
// magnitude, else 1, which leaves the bits unchanged): (x0 c - x1 s, x0 s + x1 c) with c = mag
// cos(ang), s = mag sin(ang), each rounded as written (precise: no contraction into FMAs that
// could differ between the kernels).
vec2 rope_rotate(float x0, float x1, float ang, float mag)
{
    precise float c = cos(ang) * mag, s = sin(ang) * mag;
    precise float y0 = x0 * c - x1 * s;
    precise float y1 = x0 * s + x1 * c;
    return vec2(y0, y1);
}

// Dims of pair i of a head row: normal (2i, 2i + 1), NeoX (i, i + n_rot / 2).
uvec2 rope_pair(uint i, uint n_rot, bool neox)
{
    return neox ? uvec2(i, i + n_rot / 2u) : uvec2(2u * i, 2u * i + 1u);
}

// Pair index of dim j < n_rot.
uint rope_pair_of(uint j, uint n_rot, bool neox)
{
    return neox ? (j < n_rot / 2u ? j : j - n_rot / 2u) : j / 2u;
}

#endif
