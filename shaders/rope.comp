#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "rope_common.glsl"
// Rotary position embedding over x[n_tokens][n_heads][head_dim], normal or NeoX pairing, in
// place (y bound to x's buffer) or out of place. One invocation per dimension pair, grid-stride.
// Memory-bound (8 bytes in, 8 out per pair) plus one sin/cos per pair (the angle and rotation:
// rope_common.glsl, shared with kv_write.comp's rotation of K).
layout(local_size_x_id = 0) in;
layout(push_constant) uniform PushBlock { vki_pc_rope p; };
layout(std430, binding = 0) readonly buffer X { float x[]; };  // f32 rows: x[x_off + t * x_stride + h * head_dim + d]
layout(std430, binding = 1) writeonly buffer Y { float y[]; }; // f32 rows: y[y_off + t * y_stride + h * head_dim + d]
layout(std430, binding = 2) readonly buffer P { uint pos[]; }; // u32 [n_tokens]
layout(std430, binding = 3) readonly buffer F { vec4 fr[]; };  // vec4 [n_rot / 2]: (g1, g2, g3, magnitude)

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
            uvec2 ab = rope_pair(i, p.n_rot, p.neox != 0u);
            vec2 r = rope_rotate(x[xb + ab.x], x[xb + ab.y], rope_angle(pos[t], fr[i]), fr[i].w);
            y[yb + ab.x] = r.x;
            y[yb + ab.y] = r.y;
        } else { // dims 2i, 2i+1 >= n_rot pass through (both pairings)
            float x0 = x[xb + 2 * i], x1 = x[xb + 2 * i + 1];
            y[yb + 2 * i] = x0;
            y[yb + 2 * i + 1] = x1;
        }
    }
}
