#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Rotary position embedding over x[n_tokens][n_heads][head_dim], normal or NeoX pairing, in
// place (y bound to x's buffer) or out of place. One invocation per dimension pair, grid-stride.
// Memory-bound (8 bytes in, 8 out per pair) plus one sin/cos per pair.
//
// Angle: theta = pos * f_i would need double precision for large positions (pos * f_i ~ 1e5
// rad, and a float ulp there is ~0.008 rad). Instead freqs[i] holds g = f_i / 2pi (turns per
// position) split into g1 + g2 (12 significant bits each) + g3, and pos = ph * 4096 + pl with
// 12-bit halves: every product ph*g1, ph*g2, pl*g1, pl*g2 is exact in float, so is its
// fractional part, and pos * g3 is tiny. Summing the fractions modulo 1 loses < 2^-23 turns;
// the angle then is in [-pi, pi] where sin/cos are accurate.
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_rope p; };
layout(std430, binding = 0) readonly buffer X { float x[]; };  // f32 rows: x[x_off + t * x_stride + h * head_dim + d]
layout(std430, binding = 1) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + t * y_stride + h * head_dim + d]
layout(std430, binding = 2) readonly buffer P { uint pos[]; }; // u32 [n_tokens]
layout(std430, binding = 3) readonly buffer F { vec4 fr[]; };  // vec4 [n_rot / 2]: (g1, g2, g3, 0)

const float TWO_PI = 6.28318530717958647692;

// x - nearest integer, exact for any float x.
float centered_fract(float v)
{
    return v - floor(v + 0.5);
}

// Angle of pair i at position ps, in [-pi, pi].
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

void main()
{
    uint half_hd = p.head_dim / 2, half_rot = p.n_rot / 2;
    uint n = p.n_tokens * p.n_heads * half_hd;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint idx = gl_GlobalInvocationID.x; idx < n; idx += stride) {
        uint i = idx % half_hd, th = idx / half_hd;
        uint h = th % p.n_heads, t = th / p.n_heads;
        uint xb = p.x_off + t * p.x_stride + h * p.head_dim;
        uint yb = p.y_off + t * p.y_stride + h * p.head_dim;
        if (i < half_rot) {
            uint a = p.neox != 0 ? i : 2 * i, b = p.neox != 0 ? i + half_rot : 2 * i + 1;
            float ang = rope_angle(pos[t], fr[i]);
            float c = cos(ang), s = sin(ang);
            float x0 = x[xb + a], x1 = x[xb + b];
            y[yb + a] = x0 * c - x1 * s;
            y[yb + b] = x0 * s + x1 * c;
        } else { // dims 2i, 2i+1 >= n_rot pass through (both pairings)
            float x0 = x[xb + 2 * i], x1 = x[xb + 2 * i + 1];
            y[yb + 2 * i] = x0;
            y[yb + 2 * i + 1] = x1;
        }
    }
}
