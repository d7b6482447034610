#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// Matrix-vector product for few activation rows (decode): Y[m, n] (+)= sum_k X[m, k] W[n, k]
// (+ bias[n]) for MC rows of X at once, so each weight row is streamed from memory once for
// all of them. Weights stay in their GGUF blocks and are expanded in registers (dequant.glsl).
//
// A workgroup owns NR weight rows and MC activation rows. Its invocations stride over the
// rows' units (adjacent invocations read adjacent bytes: coalesced), decode each unit once, and
// dot it with the MC activation rows; partial sums are reduced with subgroupAdd and
// then across subgroups through shared memory (a workgroup of one subgroup, NSG = 1, skips that:
// its lanes store the sums, with no barrier).
//
// A unit of the integer types is dequant.glsl's integer unit (dq_unit_i8): 32 weights as bytes,
// a whole 32-element block or two runs of 16 under one scale each, from 16-byte loads. The float
// path dots each run's bytes, converted, with X and applies the scale and offset once per run
// and activation row: sum_k w_k x_k = sum_span a * sum(q x) + b * sum(x), the X sums computed
// once per unit for the NR rows (per weight: an unpack, a conversion and an FMA). F32, F16 and
// BF16 units are 16 elements, converted and dotted.
// Bound by: weight bandwidth for M = 1 (the X rows are tiny and stay in L1/L2). On an H100 a
// 4096x4096 Q4_0 matrix is 9.4 MB, ~3 us at 3.35 TB/s; the per-weight ALU work must stay under
// that (on the first H200 run it did not: the 16-element float units of the time, with a scale
// product per 4 to 8 weights, ran Q4_K's GEMV at 2.2x the integer-dot one). As MC grows the FMAs
// grow with it and the kernel turns ALU-bound. More than MC rows of X are taken MC at a time by
// the same workgroup (MCH chunks: its few weight rows were just read, so the later chunks find
// them in L1/L2 and each weight comes from memory once for up to MCH * MC rows), and beyond that
// by workgroups along y; above gemv_max_m rows the tiled GEMM (matmul.comp) takes over.
// Compiled with MM_ID it is the experts' matvec_id (mixture of experts): one token-expert pair
// per workgroup row, the expert's rows of a stacked [n_expert * N][K] tensor (moe_id: see below).
// Compiled with MV_I8 (the types of dequant.glsl's DQ_I8: all but F32, F16, BF16) it is
// matvec_i8, the integer-dot variant: X comes quantised to int8 per block of 32 (quant_x8.comp)
// and each group of 4 weights is one packed 4x8-bit dot product (SPV_KHR_integer_dot_product)
// with its X bytes, summed in int32 over the groups that share a scale and converted once:
//   sum_k w_k x_k ~= sum_span a * dx * sum_g dot(q_g, qx_g) + b * dx * sum_g dot(qx_g, 1)
// (w = a q + b; x = dx qx): one instruction per 4 weights instead of 4 conversions and 4 FMAs,
// at the price of X's 8-bit rounding (~2e-5 relative error in the product): the engine's
// int_dot decode path, for GPUs where the float path's conversions bound batch-1 decode. With
// both (matvec_id_i8) it is the experts' integer-dot matvec: X's quantised rows are the tokens'
// (gate, up: pair / x_div) or the pairs' (down).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NR = 4;   // weight rows per workgroup
layout(constant_id = 2) const uint MC = 1;   // activation rows per workgroup
layout(constant_id = 3) const uint NSG = 32; // >= subgroups per workgroup (WG / min subgroup size)
// GLU = 1 (the FFN's gate and up in one pass, decode): the part holds gate rows [0, N) then up
// rows [N, 2N); a workgroup reads NR / 2 rows of each and writes Y[m, n] = act(gate_n . x_m) *
// (up_n . x_m), act by p.flags (VKI_MM_GELU: tanh-GELU, else SiLU), as glu.comp would from the
// two products: the same bits, without their round trip through memory and a barrier. With
// VKI_MM_GLU_XQ it also writes Y's int8 copy for the integer-dot down projection (glu_xq_tail).
layout(constant_id = 4) const uint GLU = 0;
const uint NO = GLU != 0u ? NR / 2u : NR; // output rows per workgroup
layout(constant_id = 5) const uint MCH = 1; // chunks of MC activation rows per workgroup (main)
// MU units of each row per pass of the K loop, one workgroup width apart, in straight-line code:
// the compiler can issue all MU units' loads before the first is decoded (more memory requests
// in flight per invocation, for GPUs where a pass's load latency, not bandwidth, bounds the
// kernel). Every invocation still adds its units in ascending order: the same bits for any MU.
layout(constant_id = 6) const uint MU = 1;
// XV4 = 1: X's rows are read as vec4 (x_stride % 4 == 0 and the view 16-byte aligned: every
// activation the engine hands over), 0: four scalar loads per quad (views with odd strides or
// offsets). A constant, not the push constant's x_vec4, so a pipeline holds one of the two loads:
// lavapipe's LLVM took 1.8x as long to compile a float-path variant holding both (8 quads per
// unit and activation row, each a branch), and CI compiles every variant on an empty cache. The
// integer-dot variant (MV_I8) reads quant_x8's words and ignores it.
layout(constant_id = 7) const uint XV4 = 1;

#define DQ_BINDING 0
#ifndef MV_I8
#define DQI_F32 1 // integer units taken to f32 (IQ4: nibbles, dqi_f32 their levels)
#endif
#include "dequant.glsl" // binding 0: W, one part, N rows of w_stride bytes (the ggml type's blocks)

#ifdef MM_ID
// matvec_id (mixture of experts): one pair per workgroup row (MC = 1), its expert read here on the
// GPU, so decode needs no host round trip; pairs of experts outside the bound part return.
layout(push_constant) uniform PushBlock { vki_pc_matmul_id p; };
layout(std430, binding = 2) readonly buffer Ids { int ids[]; }; // i32[M]: each pair's expert
uint id_wbase; // first weight row of the pair's expert in the part
#define X_ROW(m) ((m) / p.x_div)
#define X_ROWS ((p.M - 1u) / p.x_div + 1u) // the rows X holds (tokens for gate/up, pairs for down)
#define W_ROW(r) (id_wbase + (r))
#else
layout(push_constant) uniform PushBlock { vki_pc_matmul p; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; }; // f32[y_col0 + N] if VKI_MM_BIAS
#define X_ROW(m) (m)
#define X_ROWS p.M
#define W_ROW(r) (r)
#endif
#ifdef MV_I8
#extension GL_EXT_spirv_intrinsics : require
layout(std430, binding = 1) readonly buffer XQ4 { uvec4 xq4[]; }; // quant_x8's int8 words [M][K/4] ...
layout(std430, binding = 1) readonly buffer XD { float xd[]; };   // ... then f32 scales [M][K/32]
layout(std430, binding = 1) readonly buffer XD2 { vec2 xd2[]; };  // (the same, for 8-byte loads)
// OpSDot on two 32-bit words of four int8 each (PackedVectorFormat4x8Bit = 0): glslang 12 has no
// GL_EXT_integer_dot_product, so the instruction is declared through GL_EXT_spirv_intrinsics
// (capabilities DotProductInput4x8BitPacked 6018, DotProduct 6019; OpSDot 4450).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int vki_sdot4x8(int a, int b, spirv_literal int fmt);
int dot8(uint a, uint b) { return vki_sdot4x8(int(a), int(b), 0); }
#else
layout(std430, binding = 1) readonly buffer X { float x[]; };    // f32[M, x_stride]
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };   // same, when XV4 == 1
#endif
layout(std430, binding = 3) coherent buffer Y { float y[]; };    // f32[M, y_stride] (read: VKI_MM_ACCUM, the norms)
#ifndef MM_ID
// VKI_MM_NORM (M = 1, one part, one dispatch): after the product, the last workgroup to finish
// normalises the whole Y row (the residual stream) into H, as rmsnorm.comp would (the next
// block's input): no norm dispatch and no barrier before it. VKI_MM_HEAD_NORM: each head of Y
// in place (head_norm_tail).
layout(std430, binding = 4) readonly buffer NW { float nw[]; };  // f32 [N] norm weight (HEAD_NORM: [norm_cols])
layout(std430, binding = 5) writeonly buffer NH { float nh[]; }; // f32 [N]: H
// u32 [1] (GLU_XQ: [N / 32], HEAD_NORM: [N / norm_cols]), 0 between dispatches
layout(std430, binding = 6) coherent buffer NC { uint ncnt[]; };
layout(std430, binding = 7) writeonly buffer NQ { uint nq[]; };   // VKI_MM_NORM_XQ: H (GLU_XQ: Y) as
layout(std430, binding = 7) writeonly buffer NQD { float nqd[]; }; // quant_x8's int8 words, then scales
#define NORM_SRC(i) y[i]
#include "norm_common.glsl"
#include "quant_x8.glsl"
#include "count_last.glsl"
#endif

shared float red[NR * MC * NSG]; // per-subgroup partial sums: [NR * MC][NSG]

float acc[NR * MC];        // acc[r * MC + c]: row mv_row(r0, r) of W times row m0 + c of X
#ifdef DQ_I8
// An integer unit (dequant.glsl's dq_unit_i8; the units of every integer type, on both paths): 32
// weights, DQI_G = 8 groups of 4 in DQI_NS spans of DQI_SPAN groups; group g's weights are a[j] *
// q + b[j] (j = g / DQI_SPAN), q the bytes of q[g]; and X's side of it: MV_I8, its int8 words,
// each span's block scale and (DQI_OFF) scaled byte sum; else its f32 quads and (DQI_OFF) each
// span's sum.
const uint DQI_NS = DQI_G / DQI_SPAN;
struct w_i8 { uint q[DQI_G]; float a[DQI_NS], b[DQI_NS]; };
#ifdef MV_I8
struct x_i8 { uint q[DQI_G]; float d[DQI_NS], s[DQI_NS]; };
#else
struct x_i8 { vec4 v[DQI_G]; float s[DQI_NS]; }; // f32 X of the unit and (DQI_OFF) each span's sum
#endif
w_i8 wu[NR]; // the current unit of each of the NR weight rows
#define MV_UNITS DQI_UNITS
#else // F32, F16, BF16: units of 16 elements
#define MV_UNITS DQ_UNITS
vec4 wv[NR * DQ_UNIT_V4];  // the current unit of each of the NR weight rows, decoded
#endif

#ifndef MV_I8
// X[m, k..k+3]; k % 4 == 0.
vec4 load_x4(uint m, uint k)
{
    uint i = X_ROW(m) * p.x_stride + k;
    if (XV4 != 0u)
        return x4[i >> 2];
    return vec4(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}
#endif

// The part's row behind the workgroup's row r (r0: its first output row): r0 + r, or with GLU
// the gate rows r0.. then the up rows N + r0... The row is real when r0 + r % NO < N.
uint mv_row(uint r0, uint r) { return GLU != 0u && r >= NO ? p.N + r0 + r - NO : r0 + r; }

// The order of a unit's work: with MC <= NR (batch-1 decode's MC = 1) X's MC rows of the unit are
// loaded first and each weight row is decoded and used at once ("X-stationary": MC + 1 units
// live, not NR + 1: the first H200 run's GEMVs slowed with the rows per workgroup, 14 us at 2
// rows, 22 at 4, 35 at 8 for Q4_K 4096 x 4096, the mark of registers running out); with more
// activation rows the NR decoded units stay and every X load serves them all. Each accumulator
// receives the same additions in the same order either way: the same bits.
const bool X_STATIONARY = MC <= NR;

#ifdef MV_I8
// X's side of unit (ib, iu) for activation row m (its X row X_ROW(m)).
x_i8 x_unit_i8(uint m, uint ib, uint iu)
{
    const uint kw = p.K / 4u, d0 = X_ROWS * kw;
    m = X_ROW(m);
    x_i8 x;
    // each quad's words as one 16-byte load (K is a multiple of 32: every quad is aligned)
    [[unroll]] for (uint g = 0u; g < DQI_G; g += 4u) {
        const uvec4 t = xq4[(m * kw + (ib * DQ_BLOCK + dqi_unit_k(iu, g)) / 4u) >> 2];
        x.q[g] = t.x;
        x.q[g + 1u] = t.y;
        x.q[g + 2u] = t.z;
        x.q[g + 3u] = t.w;
    }
    // the spans' block scales, runs of DQI_XDRUN consecutive ones as one load (aligned: the
    // K-quants' K % 256 == 0)
    [[unroll]] for (uint j = 0u; j < DQI_NS; j += DQI_XDRUN) {
        const uint s0 = d0 + m * (p.K / 32u) + (ib * DQ_BLOCK + dqi_unit_k(iu, j * DQI_SPAN)) / 32u;
        if (DQI_XDRUN == 2u) {
            const vec2 t = xd2[s0 >> 1];
            x.d[j] = t.x;
            x.d[min(j + 1u, DQI_NS - 1u)] = t.y; // (past DQI_NS: never with a run of 2)
        } else {
            x.d[j] = xd[s0];
        }
    }
    [[unroll]] for (uint j = 0u; j < DQI_NS; j++) {
        x.s[j] = 0.0;
#if DQI_OFF
        int s = 0; // dx * the sum of the span's X bytes
        [[unroll]] for (uint i = 0u; i < DQI_SPAN; i++)
            s += dot8(x.q[j * DQI_SPAN + i], 0x01010101u);
        x.s[j] = x.d[j] * float(s);
#endif
    }
    return x;
}

// One row's unit dotted with one activation row's.
float dot_unit_i8(w_i8 w, x_i8 x)
{
    float sum = 0.0;
    [[unroll]] for (uint j = 0u; j < DQI_NS; j++) {
        int s = 0;
        [[unroll]] for (uint i = 0u; i < DQI_SPAN; i++)
            s += dot8(w.q[j * DQI_SPAN + i], x.q[j * DQI_SPAN + i]);
        sum += w.a[j] * x.d[j] * float(s);
#if DQI_OFF
        sum += w.b[j] * x.s[j];
#endif
    }
    return sum;
}
#elif defined(DQ_I8)
// X's side of unit (ib, iu) for activation row m: its 8 quads of f32 and each span's sum.
x_i8 x_unit_i8(uint m, uint ib, uint iu)
{
    x_i8 x;
    [[unroll]] for (uint g = 0u; g < DQI_G; g++)
        x.v[g] = load_x4(m, ib * DQ_BLOCK + dqi_unit_k(iu, g));
    [[unroll]] for (uint j = 0u; j < DQI_NS; j++) {
        x.s[j] = 0.0;
#if DQI_OFF
        vec4 t = x.v[j * DQI_SPAN];
        [[unroll]] for (uint i = 1u; i < DQI_SPAN; i++)
            t += x.v[j * DQI_SPAN + i];
        x.s[j] = (t.x + t.y) + (t.z + t.w);
#endif
    }
    return x;
}

// One row's unit dotted with one activation row's: per span a * sum(q x) + b * sum(x).
float dot_unit_i8(w_i8 w, x_i8 x)
{
    float sum = 0.0;
    [[unroll]] for (uint j = 0u; j < DQI_NS; j++) {
        float s = 0.0;
        [[unroll]] for (uint i = 0u; i < DQI_SPAN; i++)
            s += dot(dqi_f32(w.q[j * DQI_SPAN + i]), x.v[j * DQI_SPAN + i]);
        sum += w.a[j] * s;
#if DQI_OFF
        sum += w.b[j] * x.s[j];
#endif
    }
    return sum;
}
#endif

#ifdef DQ_I8
// Row r's unit (ib, iu) as integers (zeros for a row past N).
w_i8 w_unit_i8(uint r0, uint r, uint ib, uint iu)
{
    w_i8 w;
    [[unroll]] for (uint g = 0u; g < DQI_G; g++)
        w.q[g] = 0u;
    [[unroll]] for (uint j = 0u; j < DQI_NS; j++)
        w.a[j] = w.b[j] = 0.0;
    if (r0 + r % NO < p.N) { // uniform across the workgroup
        uvec4 q[2];
        vec2 a, b;
        dq_unit_i8(dq_row_base(W_ROW(mv_row(r0, r)), p.w_stride), ib, iu, q, a, b);
        [[unroll]] for (uint g = 0u; g < DQI_G; g++)
            w.q[g] = q[g / 4u][g % 4u];
        [[unroll]] for (uint j = 0u; j < DQI_NS; j++) {
            w.a[j] = a[j];
            w.b[j] = b[j];
        }
    }
    return w;
}

x_i8 xs[X_STATIONARY ? MC : 1u]; // X-stationary: the unit's X side for each activation row

// Unit u of the NR rows as integers, dotted with the MC quantised activation rows.
void unit_step(uint u, uint r0, uint m0)
{
    const uint ib = u / DQI_UNITS, iu = u % DQI_UNITS;
    if (X_STATIONARY) {
        // rows past M dot zeros into accumulators that are never stored: no branch per product
        [[unroll]] for (uint c = 0u; c < MC; c++) {
            [[unroll]] for (uint g = 0u; g < DQI_G; g++)
#ifdef MV_I8
                xs[c].q[g] = 0u;
            [[unroll]] for (uint j = 0u; j < DQI_NS; j++)
                xs[c].d[j] = 0.0;
#else
                xs[c].v[g] = vec4(0.0);
#endif
            [[unroll]] for (uint j = 0u; j < DQI_NS; j++)
                xs[c].s[j] = 0.0;
            if (m0 + c < p.M) // uniform
                xs[c] = x_unit_i8(m0 + c, ib, iu);
        }
        [[unroll]] for (uint r = 0u; r < NR; r++) {
            const w_i8 w = w_unit_i8(r0, r, ib, iu);
            [[unroll]] for (uint c = 0u; c < MC; c++)
                acc[r * MC + c] += dot_unit_i8(w, xs[c]);
        }
        return;
    }
    // the NR rows' units first, X's words, scales and byte sums loaded once per unit for them
    [[unroll]] for (uint r = 0u; r < NR; r++)
        wu[r] = w_unit_i8(r0, r, ib, iu);
    [[unroll]] for (uint c = 0u; c < MC; c++) {
        if (m0 + c >= p.M)
            break; // uniform
        const x_i8 x = x_unit_i8(m0 + c, ib, iu);
        [[unroll]] for (uint r = 0u; r < NR; r++)
            acc[r * MC + c] += dot_unit_i8(wu[r], x);
    }
}
#else
// Row r's unit (ib, iu), decoded (zeros for a row past N).
void w_unit(uint r0, uint r, uint ib, uint iu, out vec4 w[DQ_UNIT_V4])
{
    [[unroll]] for (uint g = 0u; g < DQ_UNIT_V4; g++)
        w[g] = vec4(0.0);
    if (r0 + r % NO < p.N) // uniform across the workgroup
        dq_unit(dq_row_base(W_ROW(mv_row(r0, r)), p.w_stride), ib, iu, w);
}

vec4 xs[X_STATIONARY ? MC * DQ_UNIT_V4 : 1u]; // X-stationary: the unit's X, [c][g]

// Unit u of the NR rows, decoded once, dotted with the MC activation rows.
void unit_step(uint u, uint r0, uint m0)
{
    const uint ib = u / DQ_UNITS, iu = u % DQ_UNITS;
    if (X_STATIONARY) {
        // rows past M dot zeros into accumulators that are never stored: no branch per product
        [[unroll]] for (uint c = 0u; c < MC; c++) {
            [[unroll]] for (uint g = 0u; g < DQ_UNIT_V4; g++)
                xs[c * DQ_UNIT_V4 + g] = vec4(0.0);
            if (m0 + c < p.M) // uniform
                [[unroll]] for (uint g = 0u; g < DQ_UNIT_V4; g++)
                    xs[c * DQ_UNIT_V4 + g] = load_x4(m0 + c, ib * DQ_BLOCK + dq_unit_k(iu, g));
        }
        [[unroll]] for (uint r = 0u; r < NR; r++) {
            vec4 w[DQ_UNIT_V4];
            w_unit(r0, r, ib, iu, w);
            [[unroll]] for (uint g = 0u; g < DQ_UNIT_V4; g++)
                [[unroll]] for (uint c = 0u; c < MC; c++)
                    acc[r * MC + c] += dot(w[g], xs[c * DQ_UNIT_V4 + g]);
        }
        return;
    }
    // the NR rows' units decoded first, every X load serving them all
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        vec4 w[DQ_UNIT_V4];
        w_unit(r0, r, ib, iu, w);
        [[unroll]] for (uint g = 0u; g < DQ_UNIT_V4; g++)
            wv[r * DQ_UNIT_V4 + g] = w[g];
    }
    [[unroll]] for (uint g = 0u; g < DQ_UNIT_V4; g++) {
        const uint k = ib * DQ_BLOCK + dq_unit_k(iu, g);
        [[unroll]] for (uint c = 0u; c < MC; c++) {
            if (m0 + c >= p.M)
                break; // uniform
            const vec4 xv = load_x4(m0 + c, k);
            [[unroll]] for (uint r = 0u; r < NR; r++)
                acc[r * MC + c] += dot(wv[r * DQ_UNIT_V4 + g], xv);
        }
    }
}
#endif

// Output i = r * MC + c of the workgroup (row r0 + r, activation row m0 + c): its sum s (with
// GLU: the gate's, and su the up row's) into Y, through the epilogue.
void store(uint r0, uint m0, uint i, float s, float su)
{
    const uint r = i / MC, c = i % MC;
    if (r0 + r >= p.N || m0 + c >= p.M)
        return;
    const uint n = p.y_col0 + r0 + r;
    const uint iy = (m0 + c) * p.y_stride + n;
#ifndef MM_ID
    if (GLU != 0u) { // the up row's sum times the gate's activation
        precise float v = vki_glu_act((p.flags & VKI_MM_GELU) != 0u ? VKI_GLU_GELU_TANH : VKI_GLU_SILU, s) * su;
        y[iy] = v;
        return;
    }
    if ((p.flags & VKI_MM_BIAS) != 0u)
        s += bias[n];
    if ((p.flags & VKI_MM_ACCUM) != 0u)
        s = y[iy] + s;
#endif
    y[iy] = s;
}

// Rows r0.. of W times activation rows m0..m0 + MC - 1 of X, written to Y.
void chunk(uint r0, uint m0)
{
    const uint tid = gl_LocalInvocationID.x;
    [[unroll]] for (uint i = 0u; i < NR * MC; i++)
        acc[i] = 0.0;

    const uint n_full = p.K / DQ_BLOCK * MV_UNITS; // quantised types: every unit
    const uint wg = gl_WorkGroupSize.x;
    uint u = tid;
    for (; u + (MU - 1u) * wg < n_full; u += MU * wg) // passes where all MU units exist
        [[unroll]] for (uint j = 0u; j < MU; j++)
            unit_step(u + j * wg, r0, m0);
    if (MU > 1u) // (a constant: MU = 1 compiles no second copy of the unit's code)
        for (; u < n_full; u += wg) // the rest, one at a time
            unit_step(u, r0, m0);
#ifdef DQ_FLOAT
    // The last K % 16 elements of an F32/F16 row, strided over the invocations (a workgroup may
    // be smaller than 16: one subgroup on CPU devices): scalar code, so the unrolled unit body
    // above stays free of bounds checks.
    for (uint kt = n_full * DQ_BLOCK + tid; kt < p.K; kt += gl_WorkGroupSize.x) {
        [[unroll]] for (uint r = 0u; r < NR; r++) {
            const float w = r0 + r % NO < p.N ? dq_load1(dq_row_base(W_ROW(mv_row(r0, r)), p.w_stride), kt) : 0.0;
            [[unroll]] for (uint c = 0u; c < MC; c++)
                if (m0 + c < p.M)
                    acc[r * MC + c] += w * x[X_ROW(m0 + c) * p.x_stride + kt];
        }
    }
#endif

    [[unroll]] for (uint i = 0u; i < NR * MC; i++)
        acc[i] = subgroupAdd(acc[i]);
    if (NSG == 1u) { // one subgroup: every lane holds the sums; no shared memory, no barrier
        [[unroll]] for (uint i = 0u; i < NO * MC; i++)
            if (i % gl_WorkGroupSize.x == tid)
                store(r0, m0, i, acc[i], acc[GLU != 0u ? i + NO * MC : i]); // (an index past acc: undefined)
        return;
    }
    if (subgroupElect())
        [[unroll]] for (uint i = 0u; i < NR * MC; i++)
            red[i * NSG + gl_SubgroupID] = acc[i];
    barrier();
    for (uint i = tid; i < NO * MC; i += gl_WorkGroupSize.x) {
        float s = 0.0, su = 0.0; // the up row's sum (GLU) reduced in the same order
        for (uint sg = 0u; sg < gl_NumSubgroups; sg++) {
            s += red[i * NSG + sg];
            if (GLU != 0u)
                su += red[(i + NO * MC) * NSG + sg];
        }
        store(r0, m0, i, s, su);
    }
}

#ifndef MM_ID
// The gate|up pass's quantising epilogue (VKI_MM_GLU_XQ): the workgroup's NO rows lie in one
// block of 32 columns (NO divides 32); the last of the block's 32 / NO workgroups along x, times
// those along y, reads the block back for all M rows and writes it as quant_x8 would.
void glu_xq_tail(uint r0)
{
    const uint b = r0 / 32u;
    if (!count_last(b, NO, 32u * gl_NumWorkGroups.y))
        return;
    for (uint m = gl_LocalInvocationID.x; m < p.M; m += gl_WorkGroupSize.x) {
        vec4 v[8];
        XQ_LOAD(v, y, m * p.y_stride + 32u * b);
        uint q[8];
        float d;
        xq_block(v, q, d);
        XQ_STORE(nq, nqd, p.M, p.N, m, b, q, d);
    }
}

// The norm epilogue: the last workgroup to finish reads the whole row back and writes
// H = rmsnorm(Y) * nw. It runs alone at the end of the dispatch (the next one waits for it), so
// it makes one pass after the sum of squares: with VKI_MM_NORM_XQ (N % 32 == 0) each invocation
// takes whole blocks of 32, writes their H and quantises the same values (quant_x8.glsl), so the
// next integer-dot products need no quant_x8 pass; without, H element by element.
void norm_tail()
{
    if (!count_last(0u, 1u, gl_NumWorkGroups.x))
        return;
    float inv = norm_inv(0u, p.N, p.norm_eps);
    if ((p.flags & VKI_MM_NORM_XQ) == 0u) {
        for (uint c = gl_LocalInvocationID.x; c < p.N; c += gl_WorkGroupSize.x)
            nh[c] = norm_apply(y[c], inv, nw[c]);
        return;
    }
    for (uint b = gl_LocalInvocationID.x; b < p.N / 32u; b += gl_WorkGroupSize.x) {
        vec4 v[8];
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            const uint c = 32u * b + 4u * i;
            v[i] = vec4(norm_apply(y[c], inv, nw[c]), norm_apply(y[c + 1u], inv, nw[c + 1u]),
                        norm_apply(y[c + 2u], inv, nw[c + 2u]), norm_apply(y[c + 3u], inv, nw[c + 3u]));
            nh[c] = v[i].x;
            nh[c + 1u] = v[i].y;
            nh[c + 2u] = v[i].z;
            nh[c + 3u] = v[i].w;
        }
        uint q[8];
        float d;
        xq_block(v, q, d);
        XQ_STORE(nq, nqd, 1u, p.N, 0u, b, q, d);
    }
}

// The per-head norm epilogue (VKI_MM_HEAD_NORM, M = 1): the last workgroup to finish a slice of
// norm_cols rows (NO divides norm_cols, so a workgroup's rows lie in one slice) normalises it in
// place, with rmsnorm.comp's arithmetic (norm_common.glsl). In place is safe: the rewrite comes
// after norm_inv's last barrier, and each element is read and rewritten by one invocation.
void head_norm_tail(uint r0)
{
    const uint w = p.norm_cols, base = r0 - r0 % w;
    if (!count_last(r0 / w, NO, w * gl_NumWorkGroups.y))
        return;
    float inv = norm_inv(base, w, p.norm_eps);
    for (uint c = gl_LocalInvocationID.x; c < w; c += gl_WorkGroupSize.x)
        y[base + c] = norm_apply(y[base + c], inv, nw[c]);
}
#endif

void main()
{
    const uint r0 = p.n0 + gl_WorkGroupID.x * NO; // first output row (weight row within the part)
    const uint m_first = gl_WorkGroupID.y * MCH * MC; // first activation row
#ifdef MM_ID
    const int e = ids[m_first];
    if (e < int(p.e0) || e >= int(p.e0 + p.n_exp))
        return; // uniform: another part's expert (or an invalid id), before any barrier
    id_wbase = uint(e - int(p.e0)) * p.N;
#endif
    // MCH chunks of MC activation rows in turn: the later chunks find the workgroup's NR weight
    // rows in cache, so up to MCH * MC rows read each weight from memory once
    for (uint ch = 0u; ch < MCH; ch++) {
        const uint m0 = m_first + ch * MC;
        if (m0 >= p.M)
            break; // uniform
        if (ch > 0u && NSG > 1u)
            barrier(); // the previous chunk's sums are read from red before this one's go in
        chunk(r0, m0);
    }
#ifndef MM_ID
    if ((p.flags & VKI_MM_NORM) != 0u)
        norm_tail();
    if ((p.flags & VKI_MM_HEAD_NORM) != 0u)
        head_norm_tail(r0);
    if (GLU != 0u && (p.flags & VKI_MM_GLU_XQ) != 0u)
        glu_xq_tail(r0);
#endif
}
