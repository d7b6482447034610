#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#include "attn_common.glsl"
// Prefill / chunk attention, flash-attention style. A workgroup takes a block of BR rows =
// (nq new tokens of one sequence) x (gw query heads of one kv head) and walks the keys
// 0 .. last row's position in tiles of BC, through the page table:
//   K tile -> shared; S = Q K^T (register micro-tiles SR x SC, causal mask) -> shared;
//   online softmax per row (TPR lanes per row, shuffle-xor reductions); V tile -> shared;
//   O = O * alpha + P V (register micro-tiles SR rows x HD/8 dims).
// Compute-bound for long blocks: 4 * BR * BC * HD flops per tile against (BR + BC) * HD shared
// loads per thread-tile; four barriers per tile. Shared rows are padded by one vec4 so the
// lanes of a warp that read different rows hit different banks. Scores in the log2 domain.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128; // = 8 * (BR / SR)
layout(constant_id = 1) const uint HD = 128; // head dim, multiple of 8
layout(constant_id = 2) const uint BR = 32;  // rows per block
layout(constant_id = 3) const uint BC = 32;  // keys per tile, multiple of 8
const uint TR = WG / 8;                      // thread rows; 8 thread columns
const uint SR = BR / TR;                     // rows per thread
const uint SC = BC / 8;                      // keys per thread in S
const uint DT = HD / 8;                      // dims per thread in O (d = tc + 8 e)
const uint TPR = WG / BR;                    // softmax lanes per row (<= subgroup size)
const uint RS = HD / 4 + 1;                  // padded row stride of qs / kvs in vec4
const uint SS = BC + 1;                      // padded row stride of ss in floats

layout(push_constant) uniform PushBlock { vki_pc_attn p; };
layout(std430, binding = 0) readonly buffer Q { float q[]; };             // f32 rows: [q_off + t * q_stride + h * HD + d]
layout(std430, binding = 1) readonly buffer KP { KV_T kpool[]; };         // K[page][kv_head][slot][HD] (Q8_0: two planes)
layout(std430, binding = 2) readonly buffer VP { KV_T vpool[]; };         // V, same layout
layout(std430, binding = 3) readonly buffer SI { vki_seq_info seqs[]; };  // [n_seqs]
layout(std430, binding = 4) readonly buffer PT { uint page_table[]; };    // u32 page ids
layout(std430, binding = 5) readonly buffer IT { uvec4 items[]; };        // vki_attn_item: {seq, q0, nq, 0}
layout(std430, binding = 6) writeonly buffer O { float o[]; };            // f32 rows: [o_off + t * o_stride + h * HD + d]
layout(std430, binding = 7) readonly buffer SL { float sink_logit[]; };   // p.sink_logits: f32 [n_heads]

shared vec4 qs[BR * RS];   // scaled queries, row r = (token r / gw, head r % gw)
shared vec4 kvs[BC * RS];  // the K tile, then the V tile (f32)
shared float ss[BR * SS];  // scores, then probabilities
shared float alpha_s[BR];  // per-row rescale of O for this tile
shared float lsum_s[BR];   // final row sums
shared float lmax_s[BR];   // final row maxima

// K or V tile of keys [k0, k0 + BC) into kvs; keys no row sees (>= kend, or before the first
// row's window and past the sink: their page may have been released) read as zero.
void load_tile(bool is_k, uint k0, uint kend, uint lo0, uint pt_off, uint kvh)
{
    for (uint i = gl_LocalInvocationID.x; i < BC * (HD / 8); i += WG) {
        uint kk = i / (HD / 8), ch = i % (HD / 8), j = k0 + kk;
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (j < kend && (j >= lo0 || j < p.sink)) {
            uint page = page_table[pt_off + j / p.page_size], rip = kvh * p.page_size + j % p.page_size;
            if (is_k)
                KV_LOAD(kpool, page, rip, ch, HD, lo, hi)
            else
                KV_LOAD(vpool, page, rip, ch, HD, lo, hi)
        }
        kvs[kk * RS + 2 * ch] = lo;
        kvs[kk * RS + 2 * ch + 1] = hi;
    }
}

// Per-block constants and this invocation's state.
vki_seq_info sq;
uint q0, nq, kvh, h0, gn, pos0;
uint tr, tc;             // micro-tile coordinates: rows tr + TR * a, keys / dims tc + 8 * b
uint sr, sp;             // softmax role: row sr, lane sp of its TPR lanes
float row_m, row_l;      // row sr's running max and sum (replicated over its lanes)
float acc[SR][DT];       // O rows tr + TR * a, dims tc + 8 * e

bool row_valid(uint r) { return r / p.gw < nq && r % p.gw < gn; }

void load_queries()
{
    for (uint i = gl_LocalInvocationID.x; i < BR * (HD / 4); i += WG) {
        uint r = i / (HD / 4), d4 = i % (HD / 4);
        vec4 v = vec4(0.0);
        if (row_valid(r)) {
            uint qb = p.q_off + (sq.row0 + q0 + r / p.gw) * p.q_stride + (h0 + r % p.gw) * HD + 4 * d4;
            v = p.q_scale * ATTN_TEMP(pos0 + r / p.gw) * vec4(q[qb], q[qb + 1], q[qb + 2], q[qb + 3]);
        }
        qs[r * RS + d4] = v;
    }
}

// Whether the query at position pr sees key j: causal, inside the window or the sink.
bool visible(uint j, uint pr) { return j <= pr && (p.window == 0u || pr - j < p.window || j < p.sink); }

// ss = Q K^T for keys k0 .. k0 + BC, -inf where masked (causal, window, padding rows).
void scores(uint k0)
{
    float sc[SR][SC];
    [[unroll]] for (uint a = 0; a < SR; a++)
        [[unroll]] for (uint b = 0; b < SC; b++)
            sc[a][b] = 0.0;
    for (uint d4 = 0; d4 < HD / 4; d4++) {
        vec4 qv[SR], kv[SC];
        [[unroll]] for (uint a = 0; a < SR; a++)
            qv[a] = qs[(tr + TR * a) * RS + d4];
        [[unroll]] for (uint b = 0; b < SC; b++)
            kv[b] = kvs[(tc + 8 * b) * RS + d4];
        [[unroll]] for (uint a = 0; a < SR; a++)
            [[unroll]] for (uint b = 0; b < SC; b++)
                sc[a][b] += dot(qv[a], kv[b]);
    }
    [[unroll]] for (uint a = 0; a < SR; a++) {
        uint r = tr + TR * a;
        bool ok = row_valid(r);
        [[unroll]] for (uint b = 0; b < SC; b++) {
            uint j = k0 + tc + 8 * b;
            ss[r * SS + tc + 8 * b] = ok && visible(j, pos0 + r / p.gw) ? ATTN_SCORE(sc[a][b]) : NEG_INF;
        }
    }
}

// Online softmax of row sr over the tile: ss becomes probabilities, alpha_s the rescale.
void softmax_tile()
{
    float mt = NEG_INF;
    for (uint b = sp; b < BC; b += TPR)
        mt = max(mt, ss[sr * SS + b]);
    [[unroll]] for (uint off = 1; off < TPR; off <<= 1)
        mt = max(mt, subgroupShuffleXor(mt, off));
    float mn = max(row_m, mt);
    float alpha = mn == NEG_INF ? 1.0 : exp2(row_m - mn);
    float ps = 0.0;
    for (uint b = sp; b < BC; b += TPR) {
        float pr = mn == NEG_INF ? 0.0 : exp2(ss[sr * SS + b] - mn);
        ss[sr * SS + b] = pr;
        ps += pr;
    }
    [[unroll]] for (uint off = 1; off < TPR; off <<= 1)
        ps += subgroupShuffleXor(ps, off);
    row_l = row_l * alpha + ps;
    row_m = mn;
    if (sp == 0)
        alpha_s[sr] = alpha;
}

// O = O * alpha + P V for the tile (V in kvs).
void accumulate()
{
    [[unroll]] for (uint a = 0; a < SR; a++) {
        float al = alpha_s[tr + TR * a];
        [[unroll]] for (uint e = 0; e < DT; e++)
            acc[a][e] *= al;
    }
    for (uint kk = 0; kk < BC; kk++) {
        float pr[SR];
        [[unroll]] for (uint a = 0; a < SR; a++)
            pr[a] = ss[(tr + TR * a) * SS + kk];
        [[unroll]] for (uint e = 0; e < DT; e++) {
            uint d = tc + 8 * e;
            float v = kvs[kk * RS + d / 4][d % 4];
            [[unroll]] for (uint a = 0; a < SR; a++)
                acc[a][e] += pr[a] * v;
        }
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
    tr = gl_LocalInvocationID.x / 8, tc = gl_LocalInvocationID.x % 8;
    // from the subgroup ids, so that a row's TPR lanes share a subgroup
    uint lid = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    sr = lid / TPR, sp = lid % TPR;
    row_m = NEG_INF, row_l = 0.0;
    [[unroll]] for (uint a = 0; a < SR; a++)
        [[unroll]] for (uint e = 0; e < DT; e++)
            acc[a][e] = 0.0;
    load_queries();

    // Tiles: the sink's, then from the first tile the block's first row sees in its window (later
    // rows see later keys); the tiles between are invisible to every row and skipped, so a
    // windowed block reads O(window + nq) keys, not O(position). Uniform: every invocation agrees.
    uint lo0 = p.window != 0u && pos0 + 1u > p.window ? pos0 + 1u - p.window : 0u;
    uint wstart = lo0 / BC * BC, send = min((p.sink + BC - 1u) / BC * BC, wstart);
    for (uint k0 = send > 0u ? 0u : wstart; k0 < kend; k0 = k0 + BC == send ? wstart : k0 + BC) {
        load_tile(true, k0, kend, lo0, sq.pt_off, kvh);
        barrier();
        scores(k0);
        barrier();
        softmax_tile();
        load_tile(false, k0, kend, lo0, sq.pt_off, kvh); // K is no longer read: S is in ss
        barrier();
        accumulate();
        barrier(); // kvs and ss are rewritten by the next tile
    }

    if (sp == 0)
        lsum_s[sr] = row_l, lmax_s[sr] = row_m;
    barrier();
    [[unroll]] for (uint a = 0; a < SR; a++) {
        uint r = tr + TR * a;
        if (row_valid(r)) {
            float ls = lsum_s[r], lm = lmax_s[r], sink = ATTN_SINK(h0 + r % p.gw);
            uint ob = p.o_off + (sq.row0 + q0 + r / p.gw) * p.o_stride + (h0 + r % p.gw) * HD;
            [[unroll]] for (uint e = 0; e < DT; e++)
                o[ob + tc + 8 * e] = attn_finish(acc[a][e], ls, lm, sink);
        }
    }
}
