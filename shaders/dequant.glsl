// Dequantise-on-load for every weight type vkinfer runs: the raw GGUF/ggml block bytes stay on
// the device and the kernels expand them in registers. Block layouts: shaders/vki_shared.h.
//
// A kernel defines DQ_BINDING (the weight binding) and exactly one of DQ_F32, DQ_F16, DQ_Q8_0,
// DQ_Q4_0, DQ_Q4_K, DQ_Q6_K (shaders.cmake), then includes this file after common.glsl. It may be
// included read-only by other kernels that read weights.
//
// What it offers (rb = dq_row_base(row, stride_bytes), the row start in this type's load unit):
//   DQ_BLOCK            elements per block (F32/F16: 16, a tiling granule only; any K works)
//   DQ_UNITS            GEMV work items per block; a unit is 16 elements = 4 groups of 4
//                       (F32/F16: only whole units; the caller handles K % 16 with dq_load1)
//   dq_unit(rb, ib, iu, w)      the 4 groups of unit iu of block ib (decoded once per unit:
//                               the block scale and sub-block scales are loaded once for 16
//                               weights, which keeps the GEMV memory-bound rather than ALU-bound)
//   dq_load1(rb, k)             F32/F16 only (DQ_FLOAT): element k (row tails)
//   dq_unit_k(iu, g)            element offset of group g of unit iu inside its block
//   dq_load4(rb, k, K)          elements k..k+3 of the row (k % 4 == 0): the GEMM tile loader and
//                               the row gather; elements >= K read as 0 (F32/F16 tails)
//
// Storage views. Q8_0 (34 B), Q4_0 (18 B) and Q6_K (210 B) blocks and F16 rows of odd length are
// only 2-byte aligned, so they are read through 16-bit storage (GL_EXT_shader_16bit_storage,
// uint16_t only converted to 32-bit on load, so shaderInt16 is not needed); the host refuses
// these types with VKI_ERR_UNSUPPORTED on a device without storageBuffer16BitAccess. 16-bit
// rather than 8-bit loads halve the load count. Q4_K blocks (144 B) are 16-byte aligned and
// use 16/8/4-byte loads. F32 and 8-aligned F16 rows use 16-byte vector loads.

#if defined(DQ_F16) || defined(DQ_Q8_0) || defined(DQ_Q4_0) || defined(DQ_Q6_K)
#extension GL_EXT_shader_16bit_storage : require
#endif

#define DQ_UNIT_V4 4

// Four bytes of a 32-bit word, low byte first, unsigned / sign-extended.
uvec4 dq_bytes(uint w) { return (uvec4(w) >> uvec4(0u, 8u, 16u, 24u)) & 0xFFu; }
vec4 dq_sbytes(uint w) { return vec4(ivec4(uvec4(w) << uvec4(24u, 16u, 8u, 0u)) >> 24); }

#if defined(DQ_F32) // ------------------------------------------------------------------------
// W: f32[rows][stride/4]. rb in floats.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { float dq_w[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW4 { vec4 dq_w4[]; };
#define DQ_BLOCK 16u
#define DQ_UNITS 1u
#define DQ_FLOAT 1
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 2); }
float dq_load1(uint rb, uint k) { return dq_w[rb + k]; }
vec4 dq_load4(uint rb, uint k, uint K) {
    if ((rb & 3u) == 0u && k + 4u <= K)
        return dq_w4[(rb + k) >> 2];
    vec4 v = vec4(0.0);
    [[unroll]] for (uint i = 0u; i < 4u; i++)
        if (k + i < K) v[i] = dq_load1(rb, k + i);
    return v;
}
void dq_unit(uint rb, uint ib, uint iu, out vec4 w[DQ_UNIT_V4]) {
    const uint i = rb + ib * 16u;
    if ((rb & 3u) == 0u) {
        [[unroll]] for (uint g = 0u; g < 4u; g++) w[g] = dq_w4[(i >> 2) + g];
    } else {
        [[unroll]] for (uint g = 0u; g < 4u; g++)
            w[g] = vec4(dq_w[i + 4u * g], dq_w[i + 4u * g + 1u], dq_w[i + 4u * g + 2u], dq_w[i + 4u * g + 3u]);
    }
}
uint dq_unit_k(uint iu, uint g) { return 4u * g; }

#elif defined(DQ_F16) // ----------------------------------------------------------------------
// W: f16[rows][stride/2]. rb in halves. 16-byte loads (8 halves) when the row is 8-aligned.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint16_t dq_w[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW2 { uvec2 dq_w4[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW8 { uvec4 dq_w8[]; };
#define DQ_BLOCK 16u
#define DQ_UNITS 1u
#define DQ_FLOAT 1
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 1); }
float dq_load1(uint rb, uint k) { return unpackHalf2x16(uint(dq_w[rb + k])).x; }
vec4 dq_load4(uint rb, uint k, uint K) {
    if ((rb & 3u) == 0u && k + 4u <= K) {
        uvec2 u = dq_w4[(rb + k) >> 2];
        return vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
    }
    vec4 v = vec4(0.0);
    [[unroll]] for (uint i = 0u; i < 4u; i++)
        if (k + i < K) v[i] = dq_load1(rb, k + i);
    return v;
}
void dq_unit(uint rb, uint ib, uint iu, out vec4 w[DQ_UNIT_V4]) {
    const uint i = rb + ib * 16u;
    if ((rb & 7u) == 0u) {
        uvec4 a = dq_w8[i >> 3], b = dq_w8[(i >> 3) + 1u];
        w[0] = vec4(unpackHalf2x16(a.x), unpackHalf2x16(a.y));
        w[1] = vec4(unpackHalf2x16(a.z), unpackHalf2x16(a.w));
        w[2] = vec4(unpackHalf2x16(b.x), unpackHalf2x16(b.y));
        w[3] = vec4(unpackHalf2x16(b.z), unpackHalf2x16(b.w));
    } else {
        [[unroll]] for (uint g = 0u; g < 4u; g++)
            w[g] = vec4(unpackHalf2x16(uint(dq_w[i + 4u * g]) | (uint(dq_w[i + 4u * g + 1u]) << 16)),
                        unpackHalf2x16(uint(dq_w[i + 4u * g + 2u]) | (uint(dq_w[i + 4u * g + 3u]) << 16)));
    }
}
uint dq_unit_k(uint iu, uint g) { return 4u * g; }

#elif defined(DQ_Q8_0) // ---------------------------------------------------------------------
// W: 17 uint16 per block { f16 d; int8 qs[32] }. rb in uint16. w = q * d.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint16_t dq_w[]; };
#define DQ_BLOCK 32u
#define DQ_UNITS 2u
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 1); }
uint dq_u32(uint i) { return uint(dq_w[i]) | (uint(dq_w[i + 1u]) << 16); }
float dq_half(uint i) { return unpackHalf2x16(uint(dq_w[i])).x; }
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 5) * 17u;
    return dq_half(b) * dq_sbytes(dq_u32(b + 1u + ((k & 31u) >> 1)));
}
void dq_unit(uint rb, uint ib, uint iu, out vec4 w[DQ_UNIT_V4]) {
    uint b = rb + ib * 17u;
    float d = dq_half(b);
    uint q = b + 1u + 8u * iu;
    [[unroll]] for (uint g = 0u; g < 4u; g++) w[g] = d * dq_sbytes(dq_u32(q + 2u * g));
}
uint dq_unit_k(uint iu, uint g) { return 16u * iu + 4u * g; }

#elif defined(DQ_Q4_0) // ---------------------------------------------------------------------
// W: 9 uint16 per block { f16 d; uint8 qs[16] }; byte j holds element j (low nibble) and
// j + 16 (high nibble). rb in uint16. w = (q - 8) * d.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint16_t dq_w[]; };
#define DQ_BLOCK 32u
#define DQ_UNITS 2u
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 1); }
uint dq_u32(uint i) { return uint(dq_w[i]) | (uint(dq_w[i + 1u]) << 16); }
float dq_half(uint i) { return unpackHalf2x16(uint(dq_w[i])).x; }
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 5) * 9u, j = k & 31u;
    uint q = dq_u32(b + 1u + ((j & 15u) >> 1)) >> (j >= 16u ? 4u : 0u);
    return dq_half(b) * (vec4(dq_bytes(q & 0x0F0F0F0Fu)) - 8.0);
}
// Unit iu: bytes 8iu..8iu+7 -> elements 8iu..8iu+7 (low nibbles) and 16+8iu.. (high nibbles).
void dq_unit(uint rb, uint ib, uint iu, out vec4 w[DQ_UNIT_V4]) {
    uint b = rb + ib * 9u;
    float d = dq_half(b);
    uint q0 = dq_u32(b + 1u + 4u * iu), q1 = dq_u32(b + 3u + 4u * iu);
    w[0] = d * (vec4(dq_bytes(q0 & 0x0F0F0F0Fu)) - 8.0);
    w[1] = d * (vec4(dq_bytes(q1 & 0x0F0F0F0Fu)) - 8.0);
    w[2] = d * (vec4(dq_bytes((q0 >> 4) & 0x0F0F0F0Fu)) - 8.0);
    w[3] = d * (vec4(dq_bytes((q1 >> 4) & 0x0F0F0F0Fu)) - 8.0);
}
uint dq_unit_k(uint iu, uint g) { return 8u * iu + 4u * (g & 1u) + 16u * (g >> 1); }

#elif defined(DQ_Q4_K) // ---------------------------------------------------------------------
// W: 36 uint32 per block { f16 d, dmin; uint8 scales[12]; uint8 qs[128] }. rb in uint32.
// Sub-block j (32 elements) has a 6-bit scale sc and min m: w = d*sc*q - dmin*m. qs bytes
// 32c..32c+31 hold elements 64c.. (low nibbles, sub-block 2c) and 64c+32.. (high, 2c+1).
// Blocks are 144 = 9 * 16 bytes, so the header (d, dmin, scales) is one 16-byte load and a
// unit's 8 qs bytes one 8-byte load.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint dq_w[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW2 { uvec2 dq_w2[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW4 { uvec4 dq_w4[]; };
#define DQ_BLOCK 256u
#define DQ_UNITS 16u
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 2); }
// (d*sc, dmin*m) of sub-block j (0..7) from the block header hd = {d|dmin, scales[0..11]}.
// The 12 scale bytes pack eight 6-bit pairs: j < 4 in the low 6 bits of bytes j / j+4; j >= 4
// split over byte j+4 and the top 2 bits of bytes j-4 / j.
vec2 dq_q4k_scale(uvec4 hd, uint j) {
    vec2 dm = unpackHalf2x16(hd.x);
    uint jj = 8u * (j & 3u), sc, m;
    if (j < 4u) {
        sc = (hd.y >> jj) & 63u;
        m = (hd.z >> jj) & 63u;
    } else {
        uint hi = hd.w >> jj;
        sc = (hi & 15u) | (((hd.y >> jj) >> 6 & 3u) << 4);
        m = (hi >> 4 & 15u) | (((hd.z >> jj) >> 6 & 3u) << 4);
    }
    return vec2(dm.x * float(sc), dm.y * float(m));
}
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 8) * 36u, kb = k & 255u, c = kb >> 6, h = (kb >> 5) & 1u;
    vec2 s = dq_q4k_scale(dq_w4[b >> 2], 2u * c + h);
    uint q = (dq_w[b + 4u + 8u * c + ((kb & 31u) >> 2)] >> (4u * h)) & 0x0F0F0F0Fu;
    return s.x * vec4(dq_bytes(q)) - s.y;
}
// Unit iu: 8 qs bytes 32c+8s.. (c = iu/4, s = iu%4): elements 64c+8s+0..7 (low nibbles) and
// 64c+32+8s+0..7 (high nibbles).
void dq_unit(uint rb, uint ib, uint iu, out vec4 w[DQ_UNIT_V4]) {
    uint b = rb + ib * 36u, c = iu >> 2, s = iu & 3u;
    uvec4 hd = dq_w4[b >> 2];
    vec2 lo = dq_q4k_scale(hd, 2u * c), hi = dq_q4k_scale(hd, 2u * c + 1u);
    uvec2 q = dq_w2[(b + 4u + 8u * c + 2u * s) >> 1];
    w[0] = lo.x * vec4(dq_bytes(q.x & 0x0F0F0F0Fu)) - lo.y;
    w[1] = lo.x * vec4(dq_bytes(q.y & 0x0F0F0F0Fu)) - lo.y;
    w[2] = hi.x * vec4(dq_bytes((q.x >> 4) & 0x0F0F0F0Fu)) - hi.y;
    w[3] = hi.x * vec4(dq_bytes((q.y >> 4) & 0x0F0F0F0Fu)) - hi.y;
}
uint dq_unit_k(uint iu, uint g) { return 64u * (iu >> 2) + 8u * (iu & 3u) + 4u * (g & 1u) + 32u * (g >> 1); }

#elif defined(DQ_Q6_K) // ---------------------------------------------------------------------
// W: 105 uint16 per block { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d }. rb in
// uint16. Each 128-element half h uses ql[64h..], qh[32h..], scales[8h..]; element
// 128h + 32q + l (q = 0..3, l < 32) is ((ql[64h + 32(q&1) + l] >> 4(q>>1)) & 15) |
// ((qh[32h + l] >> 2q) & 3) << 4, minus 32, times d * scales[8h + 2q + l/16].
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint16_t dq_w[]; };
#define DQ_BLOCK 256u
#define DQ_UNITS 16u
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 1); }
uint dq_u32(uint i) { return uint(dq_w[i]) | (uint(dq_w[i + 1u]) << 16); }
// d * scales[i] of the block starting at b.
float dq_q6k_scale(uint b, uint i) {
    return unpackHalf2x16(uint(dq_w[b + 104u])).x *
           float(bitfieldExtract(int(uint(dq_w[b + 96u + (i >> 1)])), int(8u * (i & 1u)), 8));
}
vec4 dq_q6k_group(uint ql, uint qh, uint q) {
    uint v = ((ql >> (4u * (q >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2u * q)) & 0x03030303u) << 4);
    return vec4(dq_bytes(v)) - 32.0;
}
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 8) * 105u, kb = k & 255u, h = kb >> 7, q = (kb >> 5) & 3u, l = kb & 31u;
    uint ql = dq_u32(b + 32u * h + 16u * (q & 1u) + (l >> 1));
    uint qh = dq_u32(b + 64u + 16u * h + (l >> 1));
    return dq_q6k_scale(b, 8u * h + 2u * q + (l >> 4)) * dq_q6k_group(ql, qh, q);
}
// Unit iu: l = 4(iu%8) .. +3 of half h = iu/8, all four quarters q: one qh word serves 16
// weights.
void dq_unit(uint rb, uint ib, uint iu, out vec4 w[DQ_UNIT_V4]) {
    uint b = rb + ib * 105u, h = iu >> 3, l = 4u * (iu & 7u);
    uint ql0 = dq_u32(b + 32u * h + (l >> 1)), ql1 = dq_u32(b + 32u * h + 16u + (l >> 1));
    uint qh = dq_u32(b + 64u + 16u * h + (l >> 1));
    uint si = 8u * h + (l >> 4);
    [[unroll]] for (uint q = 0u; q < 4u; q++)
        w[q] = dq_q6k_scale(b, si + 2u * q) * dq_q6k_group((q & 1u) != 0u ? ql1 : ql0, qh, q);
}
uint dq_unit_k(uint iu, uint g) { return 128u * (iu >> 3) + 4u * (iu & 7u) + 32u * g; }

#endif

#if !defined(DQ_F32) && !defined(DQ_F16) && !defined(DQ_Q8_0) && !defined(DQ_Q4_0) && \
    !defined(DQ_Q4_K) && !defined(DQ_Q6_K)
#error "dequant.glsl: define one of DQ_F32 DQ_F16 DQ_Q8_0 DQ_Q4_0 DQ_Q4_K DQ_Q6_K"
#endif
