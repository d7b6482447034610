#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
// Tiled matrix multiply on cooperative matrices (tensor cores): Y[m, n] = sum_k X[m, k] W[n, k]
// (+ bias[n]), the same contract as matmul.comp. A workgroup computes a BM x BN tile of Y; per
// BK step every invocation helps stage BM x BK of X (converted to F16) and BN x BK of W
// (dequantised by dq_load16 / dq_load4, then rounded to F16) into shared memory; then each subgroup
// multiplies its WM x WN part with (WM / CM_M) x (WN / CM_N) F32 accumulator fragments. The
// residual stream and Y stay F32; only the operands of the products are F16. With XH = 1, X
// comes rounded to F16 already (half_x.comp, by the same cm_f16x4), and staging copies its 8-byte
// quads instead of loading 16 bytes and converting them once per tile column: the same bits.
// With W16 = 1 each invocation stages 16 consecutive values of a W row at a time: one scale decode
// and 16-byte loads for them (dequant.glsl's dq_load16), F16 rows copied as they are, where per
// quad every 4 values decoded their block's scale again: the same values.
//
// Bound by: tensor-core throughput once tiles are big (per BK step a subgroup issues
// (WM/CM_M)(WN/CM_N)(BK/CM_K) multiply-adds against WM + WN fragment loads from shared
// memory), else by the dequantising stage, which is the portable kernel's. Weight bytes are
// read ceil(M / BM) times. Shared rows are padded by 8 halves: 16-byte aligned starts for the
// fragment loads, and consecutive rows off the 128-byte bank period. The tiles are uvec2 arrays
// of F16 quads: each staged group of 4 values is one 64-bit store (it was four 16-bit ones, two
// of them to the same bank), and the fragment loads see 8-byte elements.
//
// Edge tiles: X rows >= M and W rows >= N stage as zeros, K tails (F32/F16 only) as zeros;
// each accumulator goes through a per-subgroup scratch to Y, where store_y drops the padding
// (fragment layouts are opaque, so there is no per-element bounds check on the fragment).
// Split-K (p.k_split != 0; not MM_ID): workgroup z takes K range [z k_split, (z+1) k_split) of
// its tile, so a GEMM of few tiles (small M: 32 tiles at N = 4096 for 132 SMs) still fills the
// device and each workgroup's chain of BK steps is shorter; splits store their partial tile
// in P [splits][M][N] and the last one to finish a tile (count_last) sums the partials in split
// order (deterministic whatever the finishing order) and runs store_y's epilogue.
// Compiled with MM_ID it is the experts' grouped GEMM (matmul_id): workgroup z is an expert,
// its tile rows that expert's token-expert pairs (shaders/moe_id.glsl).
layout(local_size_x_id = 0) in;             // (BM / WM) * (BN / WN) subgroups
layout(constant_id = 1) const uint BM = 128; // X rows per tile, multiple of WM
layout(constant_id = 2) const uint BN = 128; // W rows per tile, multiple of WN
layout(constant_id = 3) const uint BK = 32;  // k per step: multiple of CM_K and 4; 64 halves the
                                            // barriers per product (quantised K: steps past K skipped)
layout(constant_id = 4) const uint WM = 64;  // rows per subgroup, multiple of CM_M
layout(constant_id = 5) const uint WN = 32;  // columns per subgroup, multiple of CM_N
#define CM_SPEC_ID 6
#include "coopmat.glsl"
// Shared buffers for the operands: 1 = stage, barrier, products, barrier per BK step; 2 = a
// software pipeline: step k + 1's global loads (and dequantisation) issued into registers before
// step k's products, their F16 values stored into the other buffer after them, one barrier per
// step: the loads' latency hides behind the invocation's own products instead of stalling it
// before them (the same products in the same order either way: the results are bit-identical).
layout(constant_id = 10) const uint STAGES = 1;
// X in F16 (binding 1 then holds half_x's quads, rows p.x_stride halves apart, zeros past K).
layout(constant_id = 11) const uint XH = 0;
// W staged 16 values of a row per item (4 quads) instead of 4 (1 quad); BK % 16 != 0 stages quads.
layout(constant_id = 12) const uint W16 = 0;

#define DQ_BINDING 0
#include "dequant.glsl" // binding 0: W, one part, N rows of w_stride bytes (the ggml type's blocks)
#include "matmul_io.glsl" // push constants, X, bias, Y; load_x4, store_y
layout(std430, binding = 1) readonly buffer XHB { uvec2 xh[]; }; // XH = 1: X as F16 quads
#ifndef MM_ID
layout(std430, binding = 4) coherent buffer P { float part[]; };  // f32 [splits][M][N] (split-K)
layout(std430, binding = 5) coherent buffer NC { uint ncnt[]; };  // u32 per tile, 0 between dispatches
#include "count_last.glsl"
#endif

const uint ST = BK + 8u;          // shared row stride in halves
const uint WGN = BN / WN;         // subgroups along N
const uint FM = WM / CM_M, FN = WN / CM_N;
// F16 values packed by 4 (cm_f16x4: a stage's 4 values are one 64-bit store); indices below are
// in F16 values, the arrays' in quads.
shared uvec2 As[STAGES * BM * ST / 4u]; // X tile, [stage][m][k]
shared uvec2 Bs[STAGES * BN * ST / 4u]; // W tile, dequantised, [stage][n][k]
shared float Cs[(BM / WM) * WGN * CM_M * CM_N]; // one accumulator fragment per subgroup

// k0 + k < K where a step can pass K: float types read zeros there themselves (load_x4,
// dq_load4); quantised K is a multiple of 32, so only BK > 32 needs the test.
#ifdef DQ_FLOAT
#define IN_K(k) true
#else
#define IN_K(k) (BK <= 32u || (k) < p.K)
#endif

const uint K4 = BK / 4u;

// X[m_tile + row, k..k+3] as an F16 quad, zeros outside the matrix (k % 4 == 0).
uvec2 x_quad(uint m_tile, uint row, uint k)
{
    if (m_tile + row >= MM_ROWS || !IN_K(k))
        return uvec2(0u);
    if (XH != 0u) // half_x's row holds K rounded up to 4 halves, the tail's zeros included
        return k < p.K ? xh[(X_ROW(m_tile + row) * p.x_stride + k) >> 2] : uvec2(0u);
    return cm_f16x4(load_x4(m_tile + row, k));
}

// W staging items: WQ quads (4 WQ consecutive values) of one row; WK items per row and step.
const uint WQ = 1u + 3u * uint(W16 != 0u) * uint(BK % 16u == 0u), WK = BK / (4u * WQ); // (no &&: glslang 12)

// W[n_tile + row, k..k+4WQ-1] dequantised, as WQ F16 quads (q[0..WQ-1]), zeros outside the
// matrix (quantised K is a multiple of 32: an item lies wholly before K or wholly past it).
void w_item(uint n_tile, uint row, uint k, out uvec2 q[4])
{
    const uint n = n_tile + row;
    [[unroll]] for (uint j = 0u; j < 4u; j++)
        q[j] = uvec2(0u);
    if (n >= p.N || !IN_K(k))
        return;
    const uint rb = dq_row_base(W_ROW(n), p.w_stride);
#if defined(DQ_F16)
    if (WQ == 4u && (rb & 7u) == 0u && k + 16u <= p.K) { // F16 already: two 16-byte copies
        const uvec4 a = dq_w8[(rb + k) >> 3], b = dq_w8[((rb + k) >> 3) + 1u];
        q[0] = a.xy, q[1] = a.zw, q[2] = b.xy, q[3] = b.zw;
        return;
    }
#elif defined(DQ_LOAD16)
    if (WQ == 4u) {
        vec4 v[4];
        dq_load16(rb, k, v);
        [[unroll]] for (uint j = 0u; j < 4u; j++)
            q[j] = cm_f16x4(v[j]);
        return;
    }
#endif
    [[unroll]] for (uint j = 0u; j < WQ; j++)
        q[j] = cm_f16x4(dq_load4(rb, k + 4u * j, p.K));
}

// Bs's quad of W tile row `row`, item i's quad j (buffer offset b0 in F16 values).
uint bs_quad(uint b0, uint i, uint j) { return (b0 + (i / WK) * ST + 4u * (WQ * (i % WK) + j)) / 4u; }

// Item i's WQ quads into Bs at b0. With 4 quads (32 bytes) the items of a half-warp's 64-bit store
// start 32 bytes apart in rows of 80 (BK 32) or 144 bytes (BK 64): all on even 8-byte granules,
// two to a bank pair. Odd items store theirs in swapped pairs (quads 1 0 3 2), so each store
// pass hits even granules for half the lanes and odd ones for the other half: distinct banks. The
// same quads land at the same places.
void bs_item(uint b0, uint i, uvec2 q[4])
{
    const bool odd = WQ == 4u && (i & 1u) != 0u;
    [[unroll]] for (uint j = 0u; j < WQ; j++)
        Bs[bs_quad(b0, i, odd ? j ^ 1u : j)] = odd ? q[j ^ 1u] : q[j];
}

// STAGES = 1: stage X[m_tile.., k0..] and W[n_tile.., k0..] as F16 into buffer 0, each quad
// stored as it is loaded (no registers held: the emulation's LLVM compiles and runs this form
// several times faster than the pipelined one's arrays).
void stage(uint m_tile, uint n_tile, uint k0)
{
    for (uint i = gl_LocalInvocationID.x; i < BM * K4; i += gl_WorkGroupSize.x)
        As[((i / K4) * ST + 4u * (i % K4)) / 4u] = x_quad(m_tile, i / K4, k0 + 4u * (i % K4));
    for (uint i = gl_LocalInvocationID.x; i < BN * WK; i += gl_WorkGroupSize.x) {
        uvec2 q[4];
        w_item(n_tile, i / WK, k0 + 4u * WQ * (i % WK), q);
        bs_item(0u, i, q);
    }
}

// STAGES = 2: a step's operands in registers, already F16 (half the registers of F32 values),
// quad i = tid + j * WG of the X tile (row i / K4, k 4 (i % K4)) in sx[j], W item i = tid + j * WG
// in sw[4j ..]; quads and items past the tile are never stored.
const uint SXN = STAGES > 1u ? (BM * K4 - 1u) / gl_WorkGroupSize.x + 1u : 1u;
const uint SWN = STAGES > 1u ? (BN * WK - 1u) / gl_WorkGroupSize.x + 1u : 1u;
uvec2 sx[SXN], sw[4u * SWN];

// Load X[m_tile.., k0..] and W[n_tile.., k0..] (W dequantised) into sx, sw.
void stage_load(uint m_tile, uint n_tile, uint k0)
{
    CM_UNROLL for (uint j = 0u; j < SXN; j++) {
        const uint i = gl_LocalInvocationID.x + j * gl_WorkGroupSize.x;
        sx[j] = i < BM * K4 ? x_quad(m_tile, i / K4, k0 + 4u * (i % K4)) : uvec2(0u);
    }
    CM_UNROLL for (uint j = 0u; j < SWN; j++) {
        const uint i = gl_LocalInvocationID.x + j * gl_WorkGroupSize.x;
        uvec2 q[4];
        if (i < BN * WK)
            w_item(n_tile, i / WK, k0 + 4u * WQ * (i % WK), q);
        CM_UNROLL for (uint jj = 0u; jj < WQ; jj++)
            sw[4u * j + jj] = i < BN * WK ? q[jj] : uvec2(0u);
    }
}

// sx, sw into buffer s.
void stage_store(uint s)
{
    const uint a0 = s * BM * ST, b0 = s * BN * ST;
    CM_UNROLL for (uint j = 0u; j < SXN; j++) {
        const uint i = gl_LocalInvocationID.x + j * gl_WorkGroupSize.x;
        if (i < BM * K4)
            As[(a0 + (i / K4) * ST + 4u * (i % K4)) / 4u] = sx[j];
    }
    CM_UNROLL for (uint j = 0u; j < SWN; j++) {
        const uint i = gl_LocalInvocationID.x + j * gl_WorkGroupSize.x;
        if (i < BN * WK)
            bs_item(b0, i, uvec2[4](sw[4u * j], sw[4u * j + 1u], sw[4u * j + 2u], sw[4u * j + 3u]));
    }
}

void main()
{
    const uint n_tile = p.n0 + gl_WorkGroupID.x * BN, m_tile = gl_WorkGroupID.y * BM;
    const uint sg = gl_SubgroupID, wm0 = (sg / WGN) * WM, wn0 = (sg % WGN) * WN;
#ifdef MM_ID
    if (!mm_id_begin(m_tile))
        return; // uniform: the whole workgroup, before any barrier
#endif
    // a subgroup whose whole part lies past M or N skips the products (uniform in the subgroup)
    const bool busy = m_tile + wm0 < MM_ROWS && n_tile + wn0 < p.N;
    CM_DECL_C(acc, FM * FN);
    CM_UNROLL for (uint f = 0u; f < FM * FN; f++)
        cm_fill_c(acc[f], 0.0);

#ifdef MM_ID
    const uint k_begin = 0u, k_end = p.K;
#else
    const uint k_begin = gl_WorkGroupID.z * p.k_split;
    const uint k_end = p.k_split != 0u ? min(p.K, k_begin + p.k_split) : p.K;
#endif
    // STAGES = 2: buffer s holds step k0 (staged, then a barrier, before the loop or by the
    // previous step); the next step's loads are issued before the products and stored into buffer
    // s ^ 1 after them, which every subgroup finished reading before the previous step's barrier.
    uint s = 0u;
    if (STAGES > 1u && k_begin < k_end) {
        stage_load(m_tile, n_tile, k_begin);
        stage_store(0u);
        barrier();
    }
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        const bool next = STAGES > 1u && k0 + BK < k_end;
        if (STAGES == 1u) {
            stage(m_tile, n_tile, k0);
            barrier();
        } else if (next) {
            stage_load(m_tile, n_tile, k0 + BK);
        }
        if (busy) {
            const uint a0 = s * BM * ST, b0 = s * BN * ST;
            CM_UNROLL for (uint kk = 0u; kk < BK; kk += CM_K) {
                CM_DECL_A(a, FM);
                CM_UNROLL for (uint i = 0u; i < FM; i++)
                    cm_load_a4(a[i], As, a0 + (wm0 + i * CM_M) * ST + kk, ST);
                CM_UNROLL for (uint j = 0u; j < FN; j++) {
                    CM_DECL_B(b);
                    cm_load_bt4(b, Bs, b0 + (wn0 + j * CM_N) * ST + kk, ST);
                    CM_UNROLL for (uint i = 0u; i < FM; i++)
                        cm_mul_add(acc[i * FN + j], a[i], b);
                }
            }
        }
        if (next)
            stage_store(s ^ 1u);
        barrier();
        s ^= STAGES - 1u;
    }

#ifndef MM_ID
    const bool split = p.k_split != 0u;
#else
    const bool split = false;
#endif
    if (!busy && !split)
        return;
    const uint cs = sg * CM_M * CM_N;
    if (busy) {
        CM_UNROLL for (uint f = 0u; f < FM * FN; f++) {
            cm_store_c(acc[f], Cs, cs, CM_N);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            const uint m0 = m_tile + wm0 + (f / FN) * CM_M, n0 = n_tile + wn0 + (f % FN) * CM_N;
            for (uint e = gl_SubgroupInvocationID; e < CM_M * CM_N; e += gl_SubgroupSize) {
                const uint m = m0 + e / CM_N, n = n0 + e % CM_N;
#ifndef MM_ID
                if (split) {
                    if (m < p.M && n < p.N)
                        part[(gl_WorkGroupID.z * p.M + m) * p.N + n] = Cs[cs + e];
                    continue;
                }
#endif
                store_y(m, n, Cs[cs + e]);
            }
            subgroupBarrier(); // Cs is rewritten by the next fragment
        }
    }
#ifndef MM_ID
    // split-K: the tile's last split sums the partials (its own included) in split order
    if (!split || !count_last(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, 1u, gl_NumWorkGroups.z))
        return;
    const uint splits = gl_NumWorkGroups.z;
    for (uint e = gl_LocalInvocationID.x; e < BM * BN; e += gl_WorkGroupSize.x) {
        const uint m = m_tile + e / BN, n = n_tile + e % BN;
        if (m >= p.M || n >= p.N)
            continue;
        float s = 0.0;
        for (uint z = 0u; z < splits; z++)
            s += part[(z * p.M + m) * p.N + n];
        store_y(m, n, s);
    }
#endif
}
