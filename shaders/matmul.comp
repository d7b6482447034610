#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
// Tiled matrix multiply for many activation rows (prefill): Y[m, n] = sum_k X[m, k] W[n, k]
// (+ bias[n]). A workgroup computes a BM x BN tile of Y; per BK step it stages BM x BK of X
// and BN x BK of W (dequantised once on load, dq_load4) in shared memory, transposed so the
// inner loop reads columns, and each invocation accumulates a TM x TN register block (F32).
//
// Bound by: FMA throughput with F32 accumulation. Per k, an invocation does TM + TN shared
// loads for TM * TN FMAs (8 + 8 -> 64 with the 8x8 blocks ops_matmul.c picks), so shared-memory
// bandwidth stays below the FMA rate; a W tile is dequantised
// once for BM rows of X, and weight bytes are read ceil(M / BM) times. Tensor cores are left
// to a cooperative-matrix path; this is the portable one.
//
// Register blocks are interleaved (invocation (tm, tn) owns rows tm + i*BM/TM and columns
// tn + j*BN/TN): shared reads are broadcasts or consecutive words (no bank conflicts) and Y
// stores are coalesced. The +1 padding of the shared rows spreads the transposing stores over
// the banks.
// Compiled with MM_ID it is the experts' grouped GEMM (matmul_id): workgroup z is an expert,
// its tile rows that expert's token-expert pairs (shaders/moe_id.glsl).
layout(local_size_x_id = 0) in;              // (BM / TM) * (BN / TN) invocations
layout(constant_id = 1) const uint BM = 64;  // X rows per tile
layout(constant_id = 2) const uint BN = 64;  // W rows per tile
layout(constant_id = 3) const uint BK = 32;  // k per step: a multiple of 4 dividing 32
layout(constant_id = 4) const uint TM = 4;   // rows per invocation
layout(constant_id = 5) const uint TN = 4;   // columns per invocation

#define DQ_BINDING 0
#include "dequant.glsl" // binding 0: W, one part, N rows of w_stride bytes (the ggml type's blocks)

#include "matmul_io.glsl" // push constants, X, bias, Y; load_x4, store_y

shared float As[BK * (BM + 1u)]; // X tile, [k][m]
shared float Bs[BK * (BN + 1u)]; // W tile, dequantised, [k][n]

// Stage X[m_tile.., k0..] and W[n_tile.., k0..] into shared memory (zeros outside the matrix).
void load_tiles(uint m_tile, uint n_tile, uint k0)
{
    const uint K4 = BK / 4u;
    for (uint i = gl_LocalInvocationID.x; i < BM * K4; i += gl_WorkGroupSize.x) {
        const uint row = i / K4, k = 4u * (i % K4);
        const vec4 v = m_tile + row < MM_ROWS ? load_x4(m_tile + row, k0 + k) : vec4(0.0);
        [[unroll]] for (uint c = 0u; c < 4u; c++)
            As[(k + c) * (BM + 1u) + row] = v[c];
    }
    for (uint i = gl_LocalInvocationID.x; i < BN * K4; i += gl_WorkGroupSize.x) {
        const uint row = i / K4, k = 4u * (i % K4), n = n_tile + row;
        const vec4 v = n < p.N ? dq_load4(dq_row_base(W_ROW(n), p.w_stride), k0 + k, p.K) : vec4(0.0);
        [[unroll]] for (uint c = 0u; c < 4u; c++)
            Bs[(k + c) * (BN + 1u) + row] = v[c];
    }
}

void main()
{
    const uint SM = BM / TM, SN = BN / TN; // invocation grid inside the tile
    const uint tn = gl_LocalInvocationID.x % SN, tm = gl_LocalInvocationID.x / SN;
    const uint n_tile = p.n0 + gl_WorkGroupID.x * BN, m_tile = gl_WorkGroupID.y * BM;
#ifdef MM_ID
    if (!mm_id_begin(m_tile))
        return; // uniform: the whole workgroup, before any barrier
#endif
    float acc[TM * TN];
    [[unroll]] for (uint i = 0u; i < TM * TN; i++)
        acc[i] = 0.0;

    for (uint k0 = 0u; k0 < p.K; k0 += BK) {
        load_tiles(m_tile, n_tile, k0);
        barrier();
        [[unroll]] for (uint k = 0u; k < BK; k++) {
            float a[TM], b[TN];
            [[unroll]] for (uint i = 0u; i < TM; i++)
                a[i] = As[k * (BM + 1u) + tm + i * SM];
            [[unroll]] for (uint j = 0u; j < TN; j++)
                b[j] = Bs[k * (BN + 1u) + tn + j * SN];
            [[unroll]] for (uint i = 0u; i < TM; i++)
                [[unroll]] for (uint j = 0u; j < TN; j++)
                    acc[i * TN + j] = fma(a[i], b[j], acc[i * TN + j]);
        }
        barrier();
    }

    [[unroll]] for (uint j = 0u; j < TN; j++)
        [[unroll]] for (uint i = 0u; i < TM; i++)
            store_y(m_tile + tm + i * SM, n_tile + tn + j * SN, acc[i * TN + j]);
}
