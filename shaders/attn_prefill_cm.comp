#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#include "attn_common.glsl"
// Prefill / chunk attention on cooperative matrices, flash-attention style: the work items,
// row blocks and results of attn_prefill.comp, with both products on tensor cores. A workgroup
// takes BR rows = (nq new tokens of one sequence) x (gw query heads of one kv head) and walks
// the keys 0 .. last row's position in tiles of BC, through the page table:
//   K tile -> shared (F16); S = Q K^T on fragments -> shared (F32);
//   online softmax per row (TPR lanes per row, shuffle-xor reductions, causal mask) -> P (F16);
//   V tile -> shared (F16); P V on fragments -> shared (F32); O = O * alpha + P V in registers.
// Fragment layouts are opaque, so the per-row rescale of O happens on the scalar side: each
// invocation owns HDP / TPR dims of its softmax row of O, whose alpha it already holds.
//
// Numerics: Q (scaled by scale * log2 e), K, V and P are rounded to F16; scores, softmax and O
// are F32. The row sum adds the F16-rounded P that the product uses, so the weights stay
// normalised. Bound by: the F16 products once blocks are long (4 * BR * BC * HDP flops per tile
// for four barriers and (BR + BC) * HDP shared-memory fragment loads per subgroup-tile).
//
// Head dims are padded with zeros to HDP, a multiple of the fragment sides (8-dim models run
// 16-dim products). KV types come through KV_LOAD (attn_common.glsl: F16, F32, Q8_0); the
// sliding window and its sink bound visible(), and main() skips the tiles no row sees, as in
// attn_prefill.comp; gemma 2's soft-cap applies to the F32 scores (ATTN_SCORE).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;  // BR * TPR invocations, whole subgroups
layout(constant_id = 1) const uint HDP = 128; // head dim padded to a multiple of CM_K and CM_N
layout(constant_id = 2) const uint BR = 32;   // rows per block, multiple of CM_M
layout(constant_id = 3) const uint BC = 32;   // keys per tile, multiple of CM_N and CM_K
#define CM_SPEC_ID 4
#include "coopmat.glsl"

const uint TPR = WG / BR;                // softmax lanes per row (power of 2 <= subgroup)
const uint ODT = HDP / TPR;                   // O dims per invocation: d = sp + TPR * e
const uint QST = HDP + 8u;                    // row strides: halves (qs, kvs), halves (ps),
const uint PST = BC + 8u;                     // floats (ss); 16-byte aligned fragment rows
const uint SST = (BC > HDP ? BC : HDP) + 4u;

layout(push_constant) uniform PushBlock { vki_pc_attn p; };
layout(std430, binding = 0) readonly buffer Q { float q[]; };             // f32 rows: [q_off + t * q_stride + h * head_dim + d]
layout(std430, binding = 1) readonly buffer KP { KV_T kpool[]; };         // K[page][kv_head][slot][head_dim]
layout(std430, binding = 2) readonly buffer VP { KV_T vpool[]; };         // V, same layout
layout(std430, binding = 3) readonly buffer SI { vki_seq_info seqs[]; };  // [n_seqs]
layout(std430, binding = 4) readonly buffer PT { uint page_table[]; };    // u32 page ids
layout(std430, binding = 5) readonly buffer IT { uvec4 items[]; };        // vki_attn_item: {seq, q0, nq, 0}
layout(std430, binding = 6) writeonly buffer O { float o[]; };            // f32 rows: [o_off + t * o_stride + h * head_dim + d]
layout(std430, binding = 7) readonly buffer SL { float sink_logit[]; };   // p.sink_logits: f32 [n_heads]

// qs and kvs: F16 quads (cm_f16x4), one 64-bit store per 4 values; indices in F16 values below
shared uvec2 qs[BR * QST / 4u];  // scaled queries, row r = (token r / gw, head r % gw)
shared uvec2 kvs[BC * QST / 4u]; // the K tile, then the V tile, [key][dim]
shared float16_t ps[BR * PST];  // probabilities of the tile
shared float ss[BR * SST];      // scores of the tile, then its P V

// Per-block constants and this invocation's state.
vki_seq_info sq;
uint q0, nq, kvh, h0, gn, pos0;
uint sr, sp;             // softmax row and lane; also the O row this invocation owns
float row_m, row_l;      // row sr's running max and sum (replicated over its lanes)
float alpha;             // row sr's rescale for the current tile
float acc[ODT];          // O[sr][sp + TPR * e]

bool row_valid(uint r) { return r / p.gw < nq && r % p.gw < gn; }

// Whether the query at position pr sees key j: causal, inside the window or the sink.
bool visible(uint j, uint pr) { return j <= pr && (p.window == 0u || pr - j < p.window || j < p.sink); }

void load_queries()
{
    for (uint i = gl_LocalInvocationID.x; i < BR * (HDP / 4u); i += WG) {
        uint r = i / (HDP / 4u), d = 4u * (i % (HDP / 4u));
        vec4 v = vec4(0.0);
        if (row_valid(r) && d < p.head_dim) {
            uint qb = p.q_off + (sq.row0 + q0 + r / p.gw) * p.q_stride + (h0 + r % p.gw) * p.head_dim + d;
            v = p.q_scale * ATTN_TEMP(pos0 + r / p.gw) * vec4(q[qb], q[qb + 1u], q[qb + 2u], q[qb + 3u]);
        }
        qs[(r * QST + d) / 4u] = cm_f16x4(v);
    }
}

// K or V tile of keys [k0, k0 + BC) into kvs as F16; keys no row sees (>= kend, or before the
// first row's window lo0 and past the sink: their page may have been released) and dims >=
// head_dim are 0.
void load_tile(bool is_k, uint k0, uint kend, uint lo0)
{
    const uint d8 = p.head_dim / 8u;
    for (uint i = gl_LocalInvocationID.x; i < BC * (HDP / 8u); i += WG) {
        uint kk = i / (HDP / 8u), ch = i % (HDP / 8u), j = k0 + kk;
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (j < kend && (j >= lo0 || j < p.sink) && ch < d8) {
            uint page = page_table[sq.pt_off + j / p.page_size], rip = kvh * p.page_size + j % p.page_size;
            if (is_k)
                KV_LOAD(kpool, page, rip, ch, p.head_dim, lo, hi)
            else
                KV_LOAD(vpool, page, rip, ch, p.head_dim, lo, hi)
        }
        const uint e = (kk * QST + 8u * ch) / 4u;
        kvs[e] = cm_f16x4(lo);
        kvs[e + 1u] = cm_f16x4(hi);
    }
}

// ss[BR][BC] = Q K^T: fragments shared out over the subgroups.
void scores()
{
    const uint FC = BC / CM_N;
    for (uint f = gl_SubgroupID; f < (BR / CM_M) * FC; f += gl_NumSubgroups) {
        const uint r0 = (f / FC) * CM_M, c0 = (f % FC) * CM_N;
        CM_DECL_C(s, 1);
        cm_fill_c(s[0], 0.0);
        CM_UNROLL for (uint d0 = 0u; d0 < HDP; d0 += CM_K) {
            CM_DECL_A(a, 1);
            CM_DECL_B(b);
            cm_load_a4(a[0], qs, r0 * QST + d0, QST);
            cm_load_bt4(b, kvs, c0 * QST + d0, QST); // B[d][key] = K[key][d]
            cm_mul_add(s[0], a[0], b);
        }
        cm_store_c(s[0], ss, r0 * SST + c0, SST);
    }
}

// Online softmax of row sr over the tile: ps = probabilities (F16), alpha = the rescale.
void softmax_tile(uint k0)
{
    const bool ok = row_valid(sr);
    const uint pr = pos0 + sr / p.gw;
    float mt = NEG_INF;
    for (uint b = sp; b < BC; b += TPR)
        mt = ok && visible(k0 + b, pr) ? max(mt, ATTN_SCORE(ss[sr * SST + b])) : mt;
    [[unroll]] for (uint off = 1u; off < TPR; off <<= 1)
        mt = max(mt, subgroupShuffleXor(mt, off));
    float mn = max(row_m, mt);
    alpha = mn == NEG_INF ? 1.0 : exp2(row_m - mn);
    float sum = 0.0;
    for (uint b = sp; b < BC; b += TPR) {
        float16_t pb = float16_t(ok && visible(k0 + b, pr) ? exp2(ATTN_SCORE(ss[sr * SST + b]) - mn) : 0.0);
        ps[sr * PST + b] = pb;
        sum += float(pb);
    }
    [[unroll]] for (uint off = 1u; off < TPR; off <<= 1)
        sum += subgroupShuffleXor(sum, off);
    row_l = row_l * alpha + sum;
    row_m = mn;
}

// ss[BR][HDP] = P V (V in kvs).
void pv()
{
    const uint FD = HDP / CM_N;
    for (uint f = gl_SubgroupID; f < (BR / CM_M) * FD; f += gl_NumSubgroups) {
        const uint r0 = (f / FD) * CM_M, d0 = (f % FD) * CM_N;
        CM_DECL_C(c, 1);
        cm_fill_c(c[0], 0.0);
        CM_UNROLL for (uint k = 0u; k < BC; k += CM_K) {
            CM_DECL_A(a, 1);
            CM_DECL_B(b);
            cm_load_a(a[0], ps, r0 * PST + k, PST);
            cm_load_b4(b, kvs, k * QST + d0, QST);
            cm_mul_add(c[0], a[0], b);
        }
        cm_store_c(c[0], ss, r0 * SST + d0, SST);
    }
}

void main()
{
    uvec4 it = items[p.item_off + gl_WorkGroupID.x];
    sq = seqs[it.x];
    q0 = it.y, nq = it.z;
    uint group = p.n_heads / p.n_kv_heads, hb = gl_WorkGroupID.y % p.n_hblocks;
    kvh = gl_WorkGroupID.y / p.n_hblocks;
    h0 = kvh * group + hb * p.gw, gn = min(p.gw, group - hb * p.gw);
    pos0 = sq.n_ctx - sq.n_new + q0; // position of the block's first token
    uint kend = pos0 + nq;           // keys of the block's last token
    uint lid = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID; // a row's lanes share a subgroup
    sr = lid / TPR, sp = lid % TPR;
    row_m = NEG_INF, row_l = 0.0;
    [[unroll]] for (uint e = 0u; e < ODT; e++)
        acc[e] = 0.0;
    load_queries();

    // the sink's tiles, then from the first tile the block's first row sees (attn_prefill.comp)
    uint lo0 = p.window != 0u && pos0 + 1u > p.window ? pos0 + 1u - p.window : 0u;
    uint wstart = lo0 / BC * BC, send = min((p.sink + BC - 1u) / BC * BC, wstart);
    for (uint k0 = send > 0u ? 0u : wstart; k0 < kend; k0 = k0 + BC == send ? wstart : k0 + BC) {
        load_tile(true, k0, kend, lo0);
        barrier();
        scores();
        barrier();
        softmax_tile(k0);
        load_tile(false, k0, kend, lo0); // K is no longer read: S is in ss
        barrier();
        pv();
        barrier();
        [[unroll]] for (uint e = 0u; e < ODT; e++)
            acc[e] = acc[e] * alpha + ss[sr * SST + sp + TPR * e];
        // the next tile's first writes (kvs, then ss after a barrier) come after these reads
    }

    if (row_valid(sr)) {
        uint ob = p.o_off + (sq.row0 + q0 + sr / p.gw) * p.o_stride + (h0 + sr % p.gw) * p.head_dim;
        float sink = ATTN_SINK(h0 + sr % p.gw);
        [[unroll]] for (uint e = 0u; e < ODT; e++) {
            uint d = sp + TPR * e;
            if (d < p.head_dim)
                o[ob + d] = attn_finish(acc[e], row_l, row_m, sink);
        }
    }
}
