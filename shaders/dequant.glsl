// Dequantise-on-load for every weight type vkinfer runs: the GGUF/ggml block bytes stay on the
// device (the six 2-byte-aligned types scale-grouped at upload, see below) and the kernels
// expand them in registers. Block layouts: shaders/vki_shared.h.
//
// A kernel defines DQ_BINDING (the weight binding) and exactly one of DQ_F32, DQ_F16, DQ_BF16,
// DQ_Q8_0, DQ_Q4_0, DQ_Q4_1, DQ_Q5_0, DQ_Q5_1, DQ_IQ4_NL, DQ_Q2_K, DQ_Q3_K, DQ_Q4_K, DQ_Q5_K,
// DQ_Q6_K, DQ_IQ4_XS, DQ_MXFP4 (shaders.cmake), then includes this file after common.glsl. It
// may be included read-only by other kernels that read weights.
//
// What it offers (rb = dq_row_base(row, stride_bytes), the row start in this type's load unit):
//   DQ_BLOCK            elements per block (F32/F16/BF16: 16, a tiling granule only; any K works)
//   DQ_UNITS            (DQ_FLOAT: F32/F16/BF16) the float GEMV's units per block: 1 of 16
//                       elements, 4 groups of 4 (the caller handles K % 16 with dq_load1)
//   dq_unit(rb, ib, iu, w)      (DQ_FLOAT) the 4 groups of unit iu of block ib
//   dq_load1(rb, k)             (DQ_FLOAT) element k (row tails)
//   dq_unit_k(iu, g)            (DQ_FLOAT) element offset of group g of unit iu inside its block
//   dq_load4(rb, k, K)          elements k..k+3 of the row (k % 4 == 0): the GEMM tile loader and
//                               the row gather; elements >= K read as 0 (F32/F16/BF16 tails)
//   dq_load16(rb, k, v)         (DQ_LOAD16: Q8_0, Q4_K, Q5_K, Q6_K) elements k..k+15 (k % 16 == 0,
//                               k < K), the values dq_load4 gives, from one scale decode and
//                               16-byte loads: the tensor-core GEMM's W staging
//   dq_unit_i8(rb, ib, iu, q, a, b)  (DQ_I8: every integer type: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
//                               Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4; both GEMVs of
//                               matvec.comp: the integer-dot MV_I8 and the float one) integer
//                               unit iu of block ib as integers (the scales and offsets loaded
//                               once per 16 or 32 weights, the bytes with 8- or 16-byte loads,
//                               which keeps the GEMV memory-bound rather than ALU-bound): 32
//                               elements in DQI_G = 8 groups of 4, two quads
//                               q[0], q[1] of words, the 4 bytes of a word a group's q (low byte
//                               first; int8: the IQ4 levels, MXFP4's values and Q8_0's
//                               signed, the others' non-negative below 128). Groups form spans of DQI_SPAN (8: the
//                               whole unit, the 32-element block types and IQ4_XS's
//                               sub-blocks; 4: one quad, the K-quants' 16-element runs) sharing
//                               a scale and offset, the weights a[span] * q + b[span] (DQI_OFF =
//                               0: b is 0), and one 32-element block of X. DQI_UNITS per block.
//   dqi_unit_k(iu, g)           (DQ_I8) element offset of group g of integer unit iu in its
//                               block: a quad's 4 groups are 16 consecutive elements (16-byte
//                               aligned, one X load); DQI_XDRUN consecutive spans have
//                               consecutive X blocks (their X scales are one load, aligned).
//   dqi_f32(w)                  (DQ_I8) group word w of dq_unit_i8 as its 4 q in f32: the
//                               float GEMV's path. A kernel that defines DQI_F32 gets the IQ4
//                               and MXFP4 words as nibbles, their levels looked up here as floats
//                               (not packed to int8 bytes and unpacked again).
// Values are computed in the f32 operation order of vki_shared.h (that of ggml's reference), so
// they match engine/quant.c up to the compiler's freedom to fuse a multiply-add.
//
// Storage views: every type is read with the widest loads its block alignment allows. Q8_0,
// Q4_0, IQ4_NL, Q5_0, Q3_K and Q6_K, whose GGUF blocks are only 2-byte aligned, and MXFP4 (17 B:
// byte-aligned) are repacked at upload into the scale-grouped layout (vki_shared.h: per 8 blocks,
// MXFP4 16, their scales and other small fields gathered at the head, then the bodies, each
// 16-byte aligned): a Q8_0, Q4_0, IQ4_NL, MXFP4 or Q5_0 unit is 16-byte loads, a Q6_K unit two
// 16-byte loads and one 8-byte load of its scales; scales and heads are 32-bit loads. 4-byte aligned blocks
// (Q4_1 20 B, Q2_K 84 B) use 32-bit loads, 8-byte aligned ones (Q5_1 24 B, IQ4_XS 136 B) 8-byte
// loads, 16-byte aligned ones (Q4_K 144 B, Q5_K 176 B) 16-byte loads for the header. F32 and
// 8-aligned F16/BF16 rows use 16-byte vector loads; F16/BF16 rows of odd length are read through
// 16-bit storage (GL_EXT_shader_16bit_storage, uint16_t only converted to 32-bit on load, so
// shaderInt16 is not needed), and the host refuses F16/BF16 with VKI_ERR_UNSUPPORTED on a device
// without storageBuffer16BitAccess.

#if defined(DQ_F16) || defined(DQ_BF16)
#extension GL_EXT_shader_16bit_storage : require
#endif

#define DQ_UNIT_V4 4

// Four bytes of a 32-bit word, low byte first, unsigned / sign-extended.
uvec4 dq_bytes(uint w) { return (uvec4(w) >> uvec4(0u, 8u, 16u, 24u)) & 0xFFu; }
vec4 dq_sbytes(uint w) { return vec4(ivec4(uvec4(w) << uvec4(24u, 16u, 8u, 0u)) >> 24); }
// Bits j..j+3 of w, one per lane (the fifth bits of Q5_0 / Q5_1 elements j..j+3).
uvec4 dq_bits4(uint w, uint j) { return (uvec4(w >> j) >> uvec4(0u, 1u, 2u, 3u)) & 1u; }

// Nibble-packed 32-weight (sub-)blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4): qs byte j holds
// element j (low nibble) and j + 16 (high nibble). A whole block's 16 qs bytes w as the elements'
// nibbles in order, one word per group: elements 0..15 (the low nibbles) in q[0], 16..31 (the
// high ones) in q[1] (the GEMVs' integer units).
void dq_nib_block(uvec4 w, out uvec4 q[2]) {
    q[0] = w & 0x0F0F0F0Fu;
    q[1] = (w >> 4) & 0x0F0F0F0Fu;
}
// ... and elements j..j+3 (j % 4 == 0) are nibbles of the qs word at byte j % 16.
uvec4 dq_nib_at(uint w, uint j) { return dq_bytes((w >> (j >= 16u ? 4u : 0u)) & 0x0F0F0F0Fu); }

#if defined(DQ_Q8_0) || defined(DQ_Q4_0) || defined(DQ_IQ4_NL) || defined(DQ_Q5_0) || defined(DQ_Q3_K) || \
    defined(DQ_Q6_K) || defined(DQ_MXFP4)
// The scale-grouped device layout (vki_shared.h), in 32-bit words from the row start rb (a row
// stride is a multiple of 16 bytes): group ib / DQ_GB is DQ_GW words, a head of DQ_HW words (the
// DQ_GB scales first: f16, MXFP4's e bytes) and DQ_GB bodies of DQ_BODY_W.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint dq_w[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW2 { uvec2 dq_w2[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW4 { uvec4 dq_w4[]; };
#if defined(DQ_Q8_0)
#define DQ_HW uint(VKI_DG_HEAD_Q8_0 / 4)
#define DQ_BODY_W uint(VKI_DG_BODY_Q8_0 / 4)
#elif defined(DQ_Q5_0)
#define DQ_HW uint(VKI_DG_HEAD_Q5_0 / 4)
#define DQ_BODY_W uint(VKI_DG_BODY_Q5_0 / 4)
#elif defined(DQ_Q3_K)
#define DQ_HW uint(VKI_DG_HEAD_Q3_K / 4)
#define DQ_BODY_W uint(VKI_DG_BODY_Q3_K / 4)
#elif defined(DQ_Q6_K)
#define DQ_HW uint(VKI_DG_HEAD_Q6_K / 4)
#define DQ_BODY_W uint(VKI_DG_BODY_Q6_K / 4)
#elif defined(DQ_MXFP4)
#define DQ_HW uint(VKI_DG_HEAD_MXFP4 / 4)
#define DQ_BODY_W uint(VKI_DG_BODY_MXFP4 / 4)
#define DQ_GB uint(VKI_DG_BLOCKS_MXFP4)
#else
#define DQ_HW uint(VKI_DG_HEAD_Q4_0 / 4)
#define DQ_BODY_W uint(VKI_DG_BODY_Q4_0 / 4)
#endif
#ifndef DQ_GB
#define DQ_GB uint(VKI_DG_BLOCKS)
#endif
#define DQ_GW (DQ_HW + DQ_GB * DQ_BODY_W)
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 2); }
// The first word of block ib's group (its head), of its body (a multiple of 4: 16-byte
// aligned), and the block's scale d.
uint dq_group(uint rb, uint ib) { return rb + (ib / DQ_GB) * DQ_GW; }
uint dq_body(uint rb, uint ib) { return dq_group(rb, ib) + DQ_HW + (ib % DQ_GB) * DQ_BODY_W; }
#ifdef DQ_MXFP4
// MXFP4: block ib's e, byte ib % 16 of the head, as d = 2^(e - 128) (vki_shared.h; e < 2 gives
// the subnormals ggml_e8m0_to_fp32_half does, which a device may flush to zero).
float dq_gscale(uint rb, uint ib) {
    const uint e = (dq_w[dq_group(rb, ib) + (ib % DQ_GB) / 4u] >> (8u * (ib & 3u))) & 0xFFu;
    return uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}
#else
float dq_gscale(uint rb, uint ib) {
    const uint w = dq_w[dq_group(rb, ib) + (ib % DQ_GB) / 2u];
    return unpackHalf2x16((ib & 1u) != 0u ? w >> 16 : w).x;
}
#endif
#endif

#if defined(DQ_Q2_K) || defined(DQ_Q3_K)
// Q2_K's and Q3_K's integer units (2 bits per element, a scale per 16): unit iu holds elements
// 128n + 32j + 16t.. and 128n + 32(j + 1) + 16t.. (n = iu >> 2, t = (iu >> 1) & 1, j = 2(iu & 1)).
uint dq_k23_unit_k(uint iu, uint g)
{
    return 128u * (iu >> 2) + 64u * (iu & 1u) + 16u * ((iu >> 1) & 1u) + 32u * (g >> 2) + 4u * (g & 3u);
}
#endif

#if defined(DQ_IQ4_NL) || defined(DQ_IQ4_XS) || defined(DQ_MXFP4)
// The 16 IQ4 levels (MXFP4: its 16 doubled E2M1 values) as int8 bytes in 4 words (folded at
// compile time), looked up with selects and shifts: no indexed array, which lavapipe turns into a
// per-lane stack copy (measured 100x slower than this in the GEMV) and NVIDIA serialises across a
// warp's distinct indices.
#ifdef DQ_MXFP4
const int dq_iq4_levels[16] = int[16](VKI_MXFP4_VALUES);
#else
const int dq_iq4_levels[16] = int[16](VKI_IQ4NL_VALUES);
#endif
#define DQ_IQ4_WORD(i) ((uint(dq_iq4_levels[4 * i]) & 0xFFu) | ((uint(dq_iq4_levels[4 * i + 1]) & 0xFFu) << 8) | \
                        ((uint(dq_iq4_levels[4 * i + 2]) & 0xFFu) << 16) | (uint(dq_iq4_levels[4 * i + 3]) << 24))
const uvec4 dq_iq4_words = uvec4(DQ_IQ4_WORD(0), DQ_IQ4_WORD(1), DQ_IQ4_WORD(2), DQ_IQ4_WORD(3));
// The words holding the levels of 4 nibbles n (each < 16): word n/4 of dq_iq4_words.
uvec4 dq_iq4_word(uvec4 n) {
    uvec4 lo = mix(uvec4(dq_iq4_words.x), uvec4(dq_iq4_words.y), greaterThanEqual(n, uvec4(4u)));
    uvec4 hi = mix(uvec4(dq_iq4_words.z), uvec4(dq_iq4_words.w), greaterThanEqual(n, uvec4(12u)));
    return mix(lo, hi, greaterThanEqual(n, uvec4(8u)));
}
// Levels of 4 nibbles: byte n%4 of their word, sign-extended.
vec4 dq_iq4(uvec4 n) { return vec4(ivec4(dq_iq4_word(n) << (24u - 8u * (n & 3u))) >> 24); }
// The same levels as the 4 int8 bytes of one word (the integer-dot path), nibble i in byte i.
uint dq_iq4_packed(uvec4 n) {
    uvec4 b = (dq_iq4_word(n) >> (8u * (n & 3u))) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}
#endif

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

#elif defined(DQ_F16) || defined(DQ_BF16) // ----------------------------------------------------
// W: f16 or bf16 [rows][stride/2]. rb in halves. 16-byte loads (8 halves) when the row is
// 8-aligned. dq_h2: the two values of a 32-bit word (lower element in the low half).
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint16_t dq_w[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW2 { uvec2 dq_w4[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW8 { uvec4 dq_w8[]; };
#define DQ_BLOCK 16u
#define DQ_UNITS 1u
#define DQ_FLOAT 1
#ifdef DQ_F16
vec2 dq_h2(uint u) { return unpackHalf2x16(u); }
#else // bf16: the top 16 bits of an f32
vec2 dq_h2(uint u) { return vec2(uintBitsToFloat(u << 16), uintBitsToFloat(u & 0xFFFF0000u)); }
#endif
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 1); }
float dq_load1(uint rb, uint k) { return dq_h2(uint(dq_w[rb + k])).x; }
vec4 dq_load4(uint rb, uint k, uint K) {
    if ((rb & 3u) == 0u && k + 4u <= K) {
        uvec2 u = dq_w4[(rb + k) >> 2];
        return vec4(dq_h2(u.x), dq_h2(u.y));
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
        w[0] = vec4(dq_h2(a.x), dq_h2(a.y));
        w[1] = vec4(dq_h2(a.z), dq_h2(a.w));
        w[2] = vec4(dq_h2(b.x), dq_h2(b.y));
        w[3] = vec4(dq_h2(b.z), dq_h2(b.w));
    } else {
        [[unroll]] for (uint g = 0u; g < 4u; g++)
            w[g] = vec4(dq_h2(uint(dq_w[i + 4u * g]) | (uint(dq_w[i + 4u * g + 1u]) << 16)),
                        dq_h2(uint(dq_w[i + 4u * g + 2u]) | (uint(dq_w[i + 4u * g + 3u]) << 16)));
    }
}
uint dq_unit_k(uint iu, uint g) { return 4u * g; }

#elif defined(DQ_Q8_0) // ---------------------------------------------------------------------
// W: scale-grouped, body int8 qs[32] (8 words). w = q * d.
#define DQ_BLOCK 32u
vec4 dq_load4(uint rb, uint k, uint K) {
    return dq_gscale(rb, k >> 5) * dq_sbytes(dq_w[dq_body(rb, k >> 5) + ((k & 31u) >> 2)]);
}
#define DQ_LOAD16 1
void dq_load16(uint rb, uint k, out vec4 v[4]) {
    const float d = dq_gscale(rb, k >> 5);
    const uvec4 q = dq_w4[(dq_body(rb, k >> 5) >> 2) + ((k & 31u) >> 4)];
    [[unroll]] for (uint j = 0u; j < 4u; j++) v[j] = d * dq_sbytes(q[j]);
}
#define DQ_I8 1
// Integer units are whole blocks (DQI_G = 8 groups, one span): two 16-byte loads, one scale
// product per 32 weights and activation row.
#define DQI_UNITS 1u
#define DQI_SPAN 8u
#define DQI_XDRUN 1u
#define DQI_OFF 0
uint dqi_unit_k(uint iu, uint g) { return 4u * g; }
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const uint w = dq_body(rb, ib) >> 2;
    q[0] = dq_w4[w];
    q[1] = dq_w4[w + 1u];
    a = vec2(dq_gscale(rb, ib));
    b = vec2(0.0);
}

#elif defined(DQ_Q4_0) // ---------------------------------------------------------------------
// W: scale-grouped, body uint8 qs[16] (4 words; nibbles as above). w = (q - 8) * d.
#define DQ_BLOCK 32u
vec4 dq_load4(uint rb, uint k, uint K) {
    uint ib = k >> 5, j = k & 31u;
    return dq_gscale(rb, ib) * (vec4(dq_nib_at(dq_w[dq_body(rb, ib) + ((j & 15u) >> 2)], j)) - 8.0);
}
#define DQ_I8 1
#define DQI_UNITS 1u
#define DQI_SPAN 8u
#define DQI_XDRUN 1u
#define DQI_OFF 1
uint dqi_unit_k(uint iu, uint g) { return 4u * g; }
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const float d = dq_gscale(rb, ib);
    dq_nib_block(dq_w4[dq_body(rb, ib) >> 2], q);
    a = vec2(d);
    b = vec2(-8.0 * d);
}

#elif defined(DQ_Q4_1) // ---------------------------------------------------------------------
// W: 5 uint32 per block { f16 d, m; uint8 qs[16] } (20 B: 4-byte aligned). rb in uint32.
// w = d * q + m.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint dq_w[]; };
#define DQ_BLOCK 32u
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 2); }
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 5) * 5u, j = k & 31u;
    vec2 dm = unpackHalf2x16(dq_w[b]);
    return dm.x * vec4(dq_nib_at(dq_w[b + 1u + ((j & 15u) >> 2)], j)) + dm.y;
}
#define DQ_I8 1
#define DQI_UNITS 1u // integer units: whole blocks (their qs bytes as 4-byte loads)
#define DQI_SPAN 8u
#define DQI_XDRUN 1u
#define DQI_OFF 1
uint dqi_unit_k(uint iu, uint g) { return 4u * g; }
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const uint bb = rb + ib * 5u;
    const vec2 dm = unpackHalf2x16(dq_w[bb]);
    dq_nib_block(uvec4(dq_w[bb + 1u], dq_w[bb + 2u], dq_w[bb + 3u], dq_w[bb + 4u]), q);
    a = vec2(dm.x);
    b = vec2(dm.y);
}

#elif defined(DQ_Q5_0) || defined(DQ_Q5_1) // -----------------------------------------------------
// Q5_0: scale-grouped { f16 d[8]; uint8 qh[8][4]; uint8 qs[16] x 8 } (the head's qh at word
//       4 + block), w = d * (q - 16); a block's 16 qs bytes are one 16-byte load;
// Q5_1: 3 uvec2 per block { f16 d, m; uint8 qh[4]; uint8 qs[16] } (24 B: 8-byte aligned: the
//       header d, m, qh is one 8-byte load and the 16 qs bytes two more), rb in uint32,
//       w = d * q + m.
// q: the nibble, and element j's fifth bit is bit j of the u32 qh.
#define DQ_BLOCK 32u
vec4 dq_q5(uvec4 nib, uint qh, uint j) { return vec4(nib | (dq_bits4(qh, j) << 4)); }
// A whole block's 16 qs bytes w and its qh as dq_nib_block's words with the fifth bits (element
// j's, bit j of qh) moved to bit 4 of their bytes (the integer-dot path).
void dq_q5_block(uvec4 w, uint qh, out uvec4 q[2]) {
    dq_nib_block(w, q);
    [[unroll]] for (uint g = 0u; g < 8u; g++) {
        const uint h = qh >> (4u * g);
        q[g / 4u][g % 4u] |= ((h & 1u) | (h & 2u) << 7 | (h & 4u) << 14 | (h & 8u) << 21) << 4;
    }
}
#ifdef DQ_Q5_0
uint dq_q5_qh(uint rb, uint ib) { return dq_w[dq_group(rb, ib) + 4u + ib % DQ_GB]; }
vec4 dq_load4(uint rb, uint k, uint K) {
    uint ib = k >> 5, j = k & 31u;
    uint q = dq_w[dq_body(rb, ib) + ((j & 15u) >> 2)];
    return dq_gscale(rb, ib) * (dq_q5(dq_nib_at(q, j), dq_q5_qh(rb, ib), j) - 16.0);
}
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const float d = dq_gscale(rb, ib);
    dq_q5_block(dq_w4[dq_body(rb, ib) >> 2], dq_q5_qh(rb, ib), q);
    a = vec2(d);
    b = vec2(-16.0 * d);
}
#else
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint dq_w[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW2 { uvec2 dq_w2[]; };
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 2); }
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 5) * 6u, j = k & 31u;
    uvec2 hd = dq_w2[b >> 1];
    vec2 dm = unpackHalf2x16(hd.x);
    return dm.x * dq_q5(dq_nib_at(dq_w[b + 2u + ((j & 15u) >> 2)], j), hd.y, j) + dm.y;
}
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const uint b2 = (rb + ib * 6u) >> 1;
    const uvec2 hd = dq_w2[b2], w0 = dq_w2[b2 + 1u], w1 = dq_w2[b2 + 2u];
    const vec2 dm = unpackHalf2x16(hd.x);
    dq_q5_block(uvec4(w0, w1), hd.y, q);
    a = vec2(dm.x);
    b = vec2(dm.y);
}
#endif
#define DQ_I8 1
#define DQI_UNITS 1u // integer units: whole blocks
#define DQI_SPAN 8u
#define DQI_XDRUN 1u
#define DQI_OFF 1
uint dqi_unit_k(uint iu, uint g) { return 4u * g; }

#elif defined(DQ_IQ4_NL) || defined(DQ_MXFP4) // -----------------------------------------------
// W: scale-grouped as Q4_0 (MXFP4: groups of 16, its e bytes as the scales). w = d * level[nibble]
// (MXFP4: value[nibble] * d, the same product).
#define DQ_BLOCK 32u
vec4 dq_load4(uint rb, uint k, uint K) {
    uint ib = k >> 5, j = k & 31u;
    return dq_gscale(rb, ib) * dq_iq4(dq_nib_at(dq_w[dq_body(rb, ib) + ((j & 15u) >> 2)], j));
}
#define DQ_I8 1
#define DQI_UNITS 1u
#define DQI_SPAN 8u
#define DQI_XDRUN 1u
#define DQI_OFF 0
uint dqi_unit_k(uint iu, uint g) { return 4u * g; }
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    dq_nib_block(dq_w4[dq_body(rb, ib) >> 2], q);
#ifndef DQI_F32
    [[unroll]] for (uint h = 0u; h < 2u; h++)
        [[unroll]] for (uint g = 0u; g < 4u; g++) q[h][g] = dq_iq4_packed(dq_bytes(q[h][g]));
#endif
    a = vec2(dq_gscale(rb, ib));
    b = vec2(0.0);
}

#elif defined(DQ_Q2_K) // ---------------------------------------------------------------------
// W: 21 uint32 per block { uint8 scales[16]; uint8 qs[64]; f16 d, dmin } (84 B: 4-byte aligned).
// rb in uint32. Element 128n + 32j + l: q = (qs[32n + l] >> 2j) & 3, sub-block s = 8n + 2j +
// l/16 with scales[s] = sc | m << 4: w = (d * sc) * q - dmin * m.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint dq_w[]; };
#define DQ_BLOCK 256u
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 2); }
// Elements of one sub-block from their 2-bit codes (4 per byte lane, already shifted down).
vec4 dq_q2k(vec2 dm, uint sc, uint q) {
    return (dm.x * float(sc & 15u)) * vec4(dq_bytes(q & 0x03030303u)) - dm.y * float(sc >> 4);
}
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 8) * 21u, kb = k & 255u, n = kb >> 7, j = (kb >> 5) & 3u, l = kb & 31u;
    uint s = 8u * n + 2u * j + (l >> 4);
    uint sc = (dq_w[b + (s >> 2)] >> (8u * (s & 3u))) & 0xFFu;
    return dq_q2k(unpackHalf2x16(dq_w[b + 20u]), sc, dq_w[b + 4u + 8u * n + (l >> 2)] >> (2u * j));
}
#define DQ_I8 1
// Integer units: two runs of 16 elements under one scale each, shifts 2j and 2j + 2 (j = 2(iu &
// 1)) of qs bytes 32n + 16t.. (t = (iu >> 1) & 1, n = iu >> 2): elements 128n + 32j + 16t.. and
// 128n + 32(j + 1) + 16t.., scales 8n + 2j + t and that + 2 (bytes t, t + 2 of one word).
#define DQI_UNITS 8u
#define DQI_SPAN 4u
#define DQI_XDRUN 2u
#define DQI_OFF 1
uint dqi_unit_k(uint iu, uint g) { return dq_k23_unit_k(iu, g); }
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const uint bb = rb + ib * 21u, n = iu >> 2, t = (iu >> 1) & 1u, j = 2u * (iu & 1u);
    const vec2 dm = unpackHalf2x16(dq_w[bb + 20u]);
    const uint w0 = bb + 4u + 8u * n + 4u * t;
    const uvec4 w = uvec4(dq_w[w0], dq_w[w0 + 1u], dq_w[w0 + 2u], dq_w[w0 + 3u]) >> (2u * j);
    const uvec2 sc = (uvec2(dq_w[bb + 2u * n + (iu & 1u)]) >> uvec2(8u * t, 8u * t + 16u)) & 0xFFu;
    q[0] = w & 0x03030303u;
    q[1] = (w >> 2) & 0x03030303u;
    a = dm.x * vec2(sc & 15u);
    b = -(dm.y * vec2(sc >> 4));
}

#elif defined(DQ_Q3_K) // ---------------------------------------------------------------------
// W: scale-grouped { f16 d[8]; uint8 scales[8][12]; {uint8 hmask[32]; uint8 qs[64]} x 8 } (a
// block's 12 scale bytes at head word 4 + 3 * block, its body 24 words: hmask words 0-7, qs
// 8-23). Element e = 128n + 32j + l: q = ((qs[32n + l] >> 2j) & 3) - (bit e/32 of hmask[l] ? 0 :
// 4), 6-bit scale s = 8n + 2j + l/16: w = (d * (scale - 32)) * q.
#define DQ_BLOCK 256u
uvec3 dq_q3k_scales(uint rb, uint ib) {
    uint s = dq_group(rb, ib) + 4u + 3u * (ib % DQ_GB);
    return uvec3(dq_w[s], dq_w[s + 1u], dq_w[s + 2u]);
}
// d * (scale s - 32) from the 12 scale bytes sc (x: bytes 0-3, y: 4-7, z: 8-11): low 4 bits in
// nibble s/8 of byte s%8, top 2 bits at 2(s/4) of byte 8 + s%4.
float dq_q3k_scale(float d, uvec3 sc, uint s) {
    uint lo = ((s & 4u) != 0u ? sc.y : sc.x) >> (8u * (s & 3u) + 4u * (s >> 3));
    uint hi = sc.z >> (8u * (s & 3u) + 2u * (s >> 2));
    return d * float(int((lo & 15u) | ((hi & 3u) << 4)) - 32);
}
// q for 4 elements: 2 low bits at shift 2j of qw's bytes, the hmask bit at hs of hw's bytes.
vec4 dq_q3k(uint qw, uint hw, uint j, uint hs) {
    return vec4(dq_bytes(((qw >> (2u * j)) & 0x03030303u) | (((hw >> hs) & 0x01010101u) << 2))) - 4.0;
}
vec4 dq_load4(uint rb, uint k, uint K) {
    uint ib = k >> 8, b = dq_body(rb, ib), kb = k & 255u, n = kb >> 7, j = (kb >> 5) & 3u, l = kb & 31u;
    return dq_q3k_scale(dq_gscale(rb, ib), dq_q3k_scales(rb, ib), 8u * n + 2u * j + (l >> 4)) *
           dq_q3k(dq_w[b + 8u + 8u * n + (l >> 2)], dq_w[b + (l >> 2)], j, 4u * n + j);
}
#define DQ_I8 1
// Integer units as Q2_K's: shifts 2j and 2j + 2 (j = 2(iu & 1)) of qs bytes 32n + 16t.. with
// hmask bytes 16t.. (bits 4n + j, 4n + j + 1), one 16-byte load each; scales 8n + 2j + t, + 2.
#define DQI_UNITS 8u
#define DQI_SPAN 4u
#define DQI_XDRUN 2u
#define DQI_OFF 1
uint dqi_unit_k(uint iu, uint g) { return dq_k23_unit_k(iu, g); }
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const uint bo = dq_body(rb, ib), n = iu >> 2, t = (iu >> 1) & 1u, j = 2u * (iu & 1u);
    const uvec3 sc = dq_q3k_scales(rb, ib);
    const float d = dq_gscale(rb, ib);
    const uvec4 qw = dq_w4[(bo + 8u + 8u * n + 4u * t) >> 2] >> (2u * j);
    const uvec4 hw = dq_w4[(bo + 4u * t) >> 2] >> (4u * n + j);
    // q - 4 as in dq_q3k: the offset goes to b
    q[0] = (qw & 0x03030303u) | ((hw & 0x01010101u) << 2);
    q[1] = ((qw >> 2) & 0x03030303u) | (((hw >> 1) & 0x01010101u) << 2);
    a = vec2(dq_q3k_scale(d, sc, 8u * n + 2u * j + t), dq_q3k_scale(d, sc, 8u * n + 2u * j + 2u + t));
    b = -4.0 * a;
}

#elif defined(DQ_Q4_K) || defined(DQ_Q5_K) // ---------------------------------------------------
// W: Q4_K: 36 uint32 per block { f16 d, dmin; uint8 scales[12]; uint8 qs[128] } (144 B);
//    Q5_K: 44 uint32 per block { f16 d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128] }
//    (176 B). rb in uint32.
// Sub-block j (32 elements) has a 6-bit scale sc and min m: w = d*sc*q - dmin*m. qs bytes
// 32c..32c+31 hold elements 64c.. (low nibbles, sub-block 2c) and 64c+32.. (high, 2c+1); Q5_K's
// fifth bit of element 64c + 32h + l is bit 2c + h of qh[l].
// Both blocks are multiples of 16 bytes, so the header (d, dmin, scales) is one 16-byte load and
// a unit's 16 qs bytes (and 16 qh bytes) another.
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint dq_w[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW4 { uvec4 dq_w4[]; };
#define DQ_BLOCK 256u
#ifdef DQ_Q5_K
#define DQ_KW 44u  // uint32 per block
#define DQ_KQS 12u // first qs word
#else
#define DQ_KW 36u
#define DQ_KQS 4u
#endif
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 2); }
// The block header hd = {d|dmin, scales[0..11]}: its 12 scale bytes pack eight 6-bit (sc, m)
// pairs, sub-block j < 4 in the low 6 bits of bytes j / j+4, j >= 4 split over byte j+4 (low /
// high nibble) and the top 2 bits of bytes j-4 / j. dq_q4k_pair: sub-blocks 2c and 2c+1 (c =
// 0..3), sc in .x and m in .y, 2c's in bits 0..7 and 2c+1's in bits 8..15. Both layouts are
// unpacked two sub-blocks at a time and selected, without a branch: adjacent lanes of a GEMV
// warp hold different c, and the branch per sub-block it replaced ran both sides, twice per unit
// (by a count of the source's operations, about half of a Q4_K unit's work in the integer-dot
// GEMV).
uvec2 dq_q4k_pair(uvec4 hd, uint c) {
    const uint sh = 16u * (c & 1u);
    const uvec2 yz = uvec2(hd.y, hd.z) >> sh, w = uvec2(hd.w >> sh, hd.w >> (sh + 4u));
    const uvec2 lo = yz & 0x3F3Fu, hi = (w & 0x0F0Fu) | ((yz >> 2u) & 0x3030u);
    return c < 2u ? lo : hi;
}
// (d*sc, dmin*m) of sub-blocks 2c (.xy) and 2c+1 (.zw).
vec4 dq_q4k_scales(uvec4 hd, uint c) {
    const vec2 dm = unpackHalf2x16(hd.x);
    const uvec2 sm = dq_q4k_pair(hd, c); // (not p: the kernels' push constants)
    return vec4(dm.x * float(sm.x & 0xFFu), dm.y * float(sm.y & 0xFFu), dm.x * float(sm.x >> 8u),
                dm.y * float(sm.y >> 8u));
}
// ... of sub-block 2c + h alone.
vec2 dq_q4k_scale(uvec4 hd, uint c, uint h) {
    const vec2 dm = unpackHalf2x16(hd.x);
    const uvec2 sm = (dq_q4k_pair(hd, c) >> (8u * h)) & 0xFFu;
    return vec2(dm.x * float(sm.x), dm.y * float(sm.y));
}
// q of 4 elements from their nibbles (shifted down) and, for Q5_K, qh bytes shifted to the bit.
vec4 dq_k5(uint nib, uint qh) {
#ifdef DQ_Q5_K
    return vec4(dq_bytes((nib & 0x0F0F0F0Fu) | ((qh & 0x01010101u) << 4)));
#else
    return vec4(dq_bytes(nib & 0x0F0F0F0Fu));
#endif
}
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 8) * DQ_KW, kb = k & 255u, c = kb >> 6, h = (kb >> 5) & 1u, l = kb & 31u;
    vec2 s = dq_q4k_scale(dq_w4[b >> 2], c, h);
    uint qh = 0u;
#ifdef DQ_Q5_K
    qh = dq_w[b + 4u + (l >> 2)] >> (2u * c + h);
#endif
    return s.x * dq_k5(dq_w[b + DQ_KQS + 8u * c + (l >> 2)] >> (4u * h), qh) - s.y;
}
// 16 elements of one sub-block (l = 0 or 16): one scale decode, 4 qs words (and 4 qh words) as one
// 16-byte load each (blocks, DQ_KQS and 8c + l/4 are multiples of 4 words).
#define DQ_LOAD16 1
void dq_load16(uint rb, uint k, out vec4 v[4]) {
    uint b = rb + (k >> 8) * DQ_KW, kb = k & 255u, c = kb >> 6, h = (kb >> 5) & 1u, l = kb & 31u;
    vec2 s = dq_q4k_scale(dq_w4[b >> 2], c, h);
    const uvec4 q = dq_w4[(b + DQ_KQS + 8u * c + (l >> 2)) >> 2] >> (4u * h);
    uvec4 qh = uvec4(0u);
#ifdef DQ_Q5_K
    qh = dq_w4[(b + 4u + (l >> 2)) >> 2] >> (2u * c + h);
#endif
    [[unroll]] for (uint j = 0u; j < 4u; j++) v[j] = s.x * dq_k5(q[j], qh[j]) - s.y;
}
#define DQ_I8 1
#define DQI_SPAN 4u
#define DQI_OFF 1
// Integer units are 32 elements (DQI_G = 8 groups, two spans): both nibbles of qs bytes 32c +
// 16t.. (c = iu >> 1, t = iu & 1), one 16-byte load; groups 0-3 are the low nibbles (sub-block
// 2c, elements 64c + 16t..), 4-7 the high ones (2c + 1, elements 64c + 32 + 16t..), and Q5_K's
// fifth bits come from qh bytes 16t... One scale product per activation row and span of 16
// elements, where units of 8 elements of each sub-block took one per 8.
#define DQI_UNITS 8u
uint dqi_unit_k(uint iu, uint g) { return 64u * (iu >> 1) + 16u * (iu & 1u) + 32u * (g >> 2) + 4u * (g & 3u); }
#define DQI_XDRUN 2u // (sub-blocks 2c and 2c + 1: consecutive X blocks)
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const uint bb = rb + ib * DQ_KW, c = iu >> 1, t = iu & 1u;
    const vec4 sm = dq_q4k_scales(dq_w4[bb >> 2], c);
    const uvec4 w = dq_w4[(bb + DQ_KQS + 8u * c + 4u * t) >> 2];
    q[0] = w & 0x0F0F0F0Fu;
    q[1] = (w >> 4) & 0x0F0F0F0Fu;
#ifdef DQ_Q5_K
    const uvec4 qh = dq_w4[(bb + 4u + 4u * t) >> 2] >> (2u * c);
    q[0] |= (qh & 0x01010101u) << 4;
    q[1] |= ((qh >> 1) & 0x01010101u) << 4;
#endif
    a = sm.xz;
    b = -sm.yw;
}

#elif defined(DQ_Q6_K) // ---------------------------------------------------------------------
// W: scale-grouped, body { uint8 ql[128]; uint8 qh[64]; int8 scales[16] } (52 words; the
// GGUF block without its trailing d). Each 128-element half h uses ql[64h..], qh[32h..],
// scales[8h..]; element 128h + 32q + l (q = 0..3, l < 32) is ((ql[64h + 32(q&1) + l] >> 4(q>>1))
// & 15) | ((qh[32h + l] >> 2q) & 3) << 4, minus 32, times d * scales[8h + 2q + l/16].
#define DQ_BLOCK 256u
// d * the int8 scale byte sb of a word.
float dq_q6k_scale(float d, uint w, uint sb) { return d * float(bitfieldExtract(int(w), int(8u * sb), 8)); }
vec4 dq_q6k_group(uint ql, uint qh, uint q) {
    uint v = ((ql >> (4u * (q >> 1))) & 0x0F0F0F0Fu) | (((qh >> (2u * q)) & 0x03030303u) << 4);
    return vec4(dq_bytes(v)) - 32.0;
}
vec4 dq_load4(uint rb, uint k, uint K) {
    uint ib = k >> 8, b = dq_body(rb, ib), kb = k & 255u, h = kb >> 7, q = (kb >> 5) & 3u, l = kb & 31u;
    uint ql = dq_w[b + 16u * h + 8u * (q & 1u) + (l >> 2)];
    uint qh = dq_w[b + 32u + 8u * h + (l >> 2)];
    uint si = 8u * h + 2u * q + (l >> 4);
    return dq_q6k_scale(dq_gscale(rb, ib), dq_w[b + 48u + (si >> 2)], si & 3u) * dq_q6k_group(ql, qh, q);
}
// 16 elements of one quarter's half (l = 0 or 16): one scale, 4 ql and 4 qh words as one 16-byte
// load each (bodies, 16h, 8(q & 1) and l/4 are multiples of 4 words).
#define DQ_LOAD16 1
void dq_load16(uint rb, uint k, out vec4 v[4]) {
    uint ib = k >> 8, b = dq_body(rb, ib), kb = k & 255u, h = kb >> 7, q = (kb >> 5) & 3u, l = kb & 31u;
    const uvec4 ql = dq_w4[(b + 16u * h + 8u * (q & 1u) + (l >> 2)) >> 2];
    const uvec4 qh = dq_w4[(b + 32u + 8u * h + (l >> 2)) >> 2];
    uint si = 8u * h + 2u * q + (l >> 4);
    const float s = dq_q6k_scale(dq_gscale(rb, ib), dq_w[b + 48u + (si >> 2)], si & 3u);
    [[unroll]] for (uint j = 0u; j < 4u; j++) v[j] = s * dq_q6k_group(ql[j], qh[j], q);
}
#define DQ_I8 1
#define DQI_SPAN 4u
#define DQI_OFF 1
// Integer units are 32 elements (DQI_G = 8 groups, two spans): ql bytes 64h + 32v + 16t.. (v =
// iu & 1, t = (iu >> 1) & 1, h = iu >> 2), one 16-byte load whose low nibbles are quarter v's
// elements 128h + 32v + 16t.. (groups 0-3) and high nibbles quarter v + 2's (4-7), with qh bytes
// 32h + 16t.. (bits 2v and 2v + 4); one scale per span (scales 8h + 2v + t and 8h + 4 + 2v + t,
// bytes of one 8-byte load). Units of 4 elements of each quarter took 4 scales, and a scale
// product per 4 elements and activation row.
#define DQI_UNITS 8u
uint dqi_unit_k(uint iu, uint g)
{
    return 128u * (iu >> 2) + 32u * (iu & 1u) + 16u * ((iu >> 1) & 1u) + 64u * (g >> 2) + 4u * (g & 3u);
}
#define DQI_XDRUN 1u
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const uint bb = dq_body(rb, ib), v = iu & 1u, t = (iu >> 1) & 1u, h = iu >> 2;
    const uvec4 ql = dq_w4[(bb + 16u * h + 8u * v + 4u * t) >> 2];
    const uvec4 qh = dq_w4[(bb + 32u + 8u * h + 4u * t) >> 2] >> (2u * v);
    const uvec2 sc = dq_w2[(bb + 48u + 2u * h) >> 1];
    const float d = dq_gscale(rb, ib);
    q[0] = (ql & 0x0F0F0F0Fu) | ((qh & 0x03030303u) << 4);
    q[1] = ((ql >> 4) & 0x0F0F0F0Fu) | (((qh >> 4) & 0x03030303u) << 4);
    a = vec2(dq_q6k_scale(d, sc.x, 2u * v + t), dq_q6k_scale(d, sc.y, 2u * v + t)); // byte 2v + t of both
    b = -32.0 * a;
}

#elif defined(DQ_IQ4_XS) // -------------------------------------------------------------------
// W: 17 uvec2 per block { f16 d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128] } (136 B:
// 8-byte aligned): the header is one 8-byte load, a unit's 16 qs bytes two more. rb in uint32.
// Sub-block j (32 elements, qs bytes 16j.., nibbles as above) has the 6-bit scale ls = nibble j
// of scales_l | 2 bits j of scales_h << 4: w = (d * (ls - 32)) * level[nibble].
layout(std430, binding = DQ_BINDING) readonly buffer DqW { uint dq_w[]; };
layout(std430, binding = DQ_BINDING) readonly buffer DqW2 { uvec2 dq_w2[]; };
#define DQ_BLOCK 256u
uint dq_row_base(uint row, uint stride_bytes) { return row * (stride_bytes >> 2); }
// d * (ls - 32) of sub-block j from the header {d | scales_h << 16, scales_l}.
float dq_iq4xs_scale(uvec2 hd, uint j) {
    uint ls = ((hd.y >> (4u * j)) & 15u) | (((hd.x >> (16u + 2u * j)) & 3u) << 4);
    return unpackHalf2x16(hd.x).x * float(int(ls) - 32);
}
vec4 dq_load4(uint rb, uint k, uint K) {
    uint b = rb + (k >> 8) * 34u, kb = k & 255u, j = kb >> 5, i = kb & 31u;
    return dq_iq4xs_scale(dq_w2[b >> 1], j) * dq_iq4(dq_nib_at(dq_w[b + 2u + 4u * j + ((i & 15u) >> 2)], i));
}
#define DQ_I8 1
#define DQI_UNITS 8u // integer units: whole sub-blocks (qs bytes 16iu.., two 8-byte loads)
#define DQI_SPAN 8u
#define DQI_XDRUN 1u
#define DQI_OFF 0
uint dqi_unit_k(uint iu, uint g) { return 32u * iu + 4u * g; }
void dq_unit_i8(uint rb, uint ib, uint iu, out uvec4 q[2], out vec2 a, out vec2 b) {
    const uint b2 = (rb + ib * 34u) >> 1;
    dq_nib_block(uvec4(dq_w2[b2 + 1u + 2u * iu], dq_w2[b2 + 2u + 2u * iu]), q);
#ifndef DQI_F32
    [[unroll]] for (uint h = 0u; h < 2u; h++)
        [[unroll]] for (uint g = 0u; g < 4u; g++) q[h][g] = dq_iq4_packed(dq_bytes(q[h][g]));
#endif
    a = vec2(dq_iq4xs_scale(dq_w2[b2], iu));
    b = vec2(0.0);
}

#endif

#ifdef DQ_I8
#define DQI_G 8 // groups of 4 elements per integer unit
#if defined(DQI_F32) && (defined(DQ_IQ4_NL) || defined(DQ_IQ4_XS) || defined(DQ_MXFP4))
vec4 dqi_f32(uint w) { return dq_iq4(dq_bytes(w)); }
#else
vec4 dqi_f32(uint w) { return dq_sbytes(w); }
#endif
#endif

#if !defined(DQ_F32) && !defined(DQ_F16) && !defined(DQ_BF16) && !defined(DQ_Q8_0) && !defined(DQ_Q4_0) && \
    !defined(DQ_Q4_1) && !defined(DQ_Q5_0) && !defined(DQ_Q5_1) && !defined(DQ_IQ4_NL) && !defined(DQ_Q2_K) && \
    !defined(DQ_Q3_K) && !defined(DQ_Q4_K) && !defined(DQ_Q5_K) && !defined(DQ_Q6_K) && !defined(DQ_IQ4_XS) && \
    !defined(DQ_MXFP4)
#error "dequant.glsl: define one of DQ_F32 DQ_F16 DQ_BF16 DQ_Q8_0 DQ_Q4_0 DQ_Q4_1 DQ_Q5_0 DQ_Q5_1 DQ_IQ4_NL DQ_Q2_K DQ_Q3_K DQ_Q4_K DQ_Q5_K DQ_Q6_K DQ_IQ4_XS DQ_MXFP4"
#endif
