#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#include "attn_common.glsl"
#include "rope_common.glsl"
// Decode attention, flash-decoding style. A workgroup takes one split {seq, k0, k1} of a
// one-token sequence's keys and GW query heads sharing one kv head (GQA: K/V are read once for
// the group). Bound by K/V bandwidth: every K/V byte of the split is read exactly once,
// coalesced; no barrier inside the key loop.
//
// The workgroup is cut into key groups of L lanes; a key group takes keys k0 + kg, k0 + kg + P,
// ... (P groups read P consecutive keys together) and each lane holds NC chunks of 8 dims of
// the row. Per key: q.k by partial dot products + an L-lane shuffle-xor sum, then an online
// softmax update of the group's own (max, sum, acc) in registers. At the end key groups merge
// by shuffles within the subgroup, subgroups one after another through shared memory, and the
// split writes its output (the whole context) or an unnormalised partial. With p.merge the last
// split of a sequence to finish (an atomic count per sequence and workgroup row) merges the
// partials itself (attn_merge.glsl), so decode needs no reduce pass and no barrier before one;
// else attn_reduce.comp merges them after a barrier.
// With p.fresh (a step whose sequences have one new token each) the query is rotated by RoPE as
// it is loaded and the newest key and value (position n_ctx - 1) come from the new K / V rows,
// rounded as kv_write stores them (kv_store.glsl), not from the pool: the step's kv_write may run
// beside this dispatch (no barrier between), and no rope pass over q comes before it.
// Scores are in the log2 domain: q is pre-scaled by scale * log2(e) and p = exp2(s - max)
// (soft-capped models: q by scale, the cap's tanh then times log2(e)). A split only ever holds
// keys its query sees: the host plans splits over the window and the sink (op_attn_plan_build).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HD = 128; // head dim, multiple of 8
layout(constant_id = 2) const uint L = 16;   // lanes per key: power of 2, divides HD/8, <= subgroup size
layout(constant_id = 3) const uint GMAX = 8; // query heads per workgroup (register arrays)
// KU keys of each key group per step of the key loop: their K and V rows are loaded before the
// first is scored, so KU loads per lane are in flight (a short context's few workgroups are
// bound by load latency, not bandwidth); they are used in the order the one-key loop used them:
// the same bits for any KU.
layout(constant_id = 4) const uint KU = 1;
const uint D8 = HD / 8;                      // chunks per row
const uint NC = D8 / L;                      // chunks per lane

layout(push_constant) uniform PushBlock { vki_pc_attn p; };
layout(std430, binding = 0) readonly buffer Q { float q[]; };             // f32 rows: [q_off + t * q_stride + h * HD + d]
layout(std430, binding = 1) readonly buffer KP { KV_T kpool[]; };         // K[page][kv_head][slot][HD] (Q8_0: two planes)
layout(std430, binding = 2) readonly buffer VP { KV_T vpool[]; };         // V, same layout
layout(std430, binding = 3) readonly buffer SI { vki_seq_info seqs[]; };  // [n_seqs]
layout(std430, binding = 4) readonly buffer PT { uint page_table[]; };    // u32 page ids
layout(std430, binding = 5) readonly buffer IT { uvec4 items[]; };        // vki_attn_item: {seq, k0, k1, slot}
layout(std430, binding = 6) writeonly buffer O { float o[]; };            // f32 rows: [o_off + t * o_stride + h * HD + d]
// Partials and counters are coherent: a split reads the others' partials after their atomic.
layout(std430, binding = 7) coherent buffer PA { float part[]; };         // f32 [slot][n_heads][HD + 2]
layout(std430, binding = 8) coherent buffer CN { uint cnt[]; };           // u32 [n_seqs][groups in y], 0 between dispatches
layout(std430, binding = 9) readonly buffer KA { float k_act[]; };        // p.fresh: new K rows [k_off + t * k_stride + h * HD + d]
layout(std430, binding = 10) readonly buffer VA { float v_act[]; };       // p.fresh: new V rows [v_off + t * v_stride + h * HD + d]
layout(std430, binding = 11) readonly buffer F { vec4 fr[]; };            // p.fresh: vec4 [rope_n_rot / 2] (rope.comp's)
layout(std430, binding = 12) writeonly buffer XQ { uint xq[]; };        // p.xq_rows: the output quantised (vki_pc_quant_x8)
layout(std430, binding = 12) writeonly buffer XD { float xd[]; };       // the same buffer: its scales
layout(std430, binding = 13) readonly buffer SL { float sink_logit[]; }; // p.sink_logits: f32 [n_heads]
#include "attn_merge.glsl"
#include "kv_store.glsl"
#include "quant_x8.glsl"

shared vec4 qs[GMAX * HD / 4];  // scaled queries of the workgroup's heads
shared float st_acc[GMAX * HD]; // merged state of the subgroups done so far
shared float st_m[2][GMAX], st_l[2][GMAX]; // double-buffered: one subgroup reads while it writes
shared bool last_split;

// This invocation's online-softmax state for the keys its key group saw.
float m[GMAX], l[GMAX];
vec4 acc[GMAX][2 * NC];
uint lane, c; // lane in the subgroup; this lane's first chunk within a key row

float lane_sum(float s)
{
    [[unroll]] for (uint off = 1; off < L; off <<= 1)
        s += subgroupShuffleXor(s, off);
    return s;
}

// The workgroup's queries of token t into qs, scaled; with p.fresh rotated by RoPE at position
// pos first (rope.comp's arithmetic, so the bits of a rope pass before): one angle per pair.
void load_queries(uint t, uint h0, uint gn, uint pos)
{
    uint n_rot = p.fresh != 0u ? p.rope_n_rot : 0u, half_rot = n_rot / 2u;
    bool neox = p.rope_neox != 0u;
    const float qsc = p.q_scale * ATTN_TEMP(pos);
    for (uint i = gl_LocalInvocationID.x; i < GMAX * half_rot; i += WG) {
        uint g = i / half_rot, pr = i % half_rot, qb = p.q_off + t * p.q_stride + (h0 + g) * HD;
        uvec2 ab = rope_pair(pr, n_rot, neox);
        vec2 r = g < gn ? rope_rotate(q[qb + ab.x], q[qb + ab.y], rope_angle(pos, fr[pr]), fr[pr].w) : vec2(0.0);
        qs[(g * HD + ab.x) / 4][ab.x % 4] = qsc * r.x;
        qs[(g * HD + ab.y) / 4][ab.y % 4] = qsc * r.y;
    }
    for (uint i = gl_LocalInvocationID.x; i < GMAX * (HD - n_rot); i += WG) { // dims past the rotation
        uint g = i / (HD - n_rot), j = n_rot + i % (HD - n_rot);
        qs[(g * HD + j) / 4][j % 4] = g < gn ? qsc * q[p.q_off + t * p.q_stride + (h0 + g) * HD + j] : 0.0;
    }
}

// Keys k0 + kg, k0 + kg + n_kg, ... < k1 into this key group's state. The trip count is the
// same for all lanes (missing keys are masked), so every lane takes part in every shuffle.
// With p.fresh, key n_ctx - 1 comes from the new rows of token t.
void attend(vki_seq_info sq, uint kvh, uint k0, uint k1, uint gn, uint t)
{
    // the step's own key, as kv_write stores it beside this dispatch (only the split that ends
    // the context holds it)
    uint newest = p.fresh != 0u && k1 == sq.n_ctx ? sq.n_ctx - 1u : 0xffffffffu;
    vec4 kf[2 * NC], vf[2 * NC];
    if (newest != 0xffffffffu) { // uniform
        uint kb = p.k_off + t * p.k_stride + kvh * HD, vb = p.v_off + t * p.v_stride + kvh * HD;
        [[unroll]] for (uint ch = 0; ch < NC; ch++) {
            kv_stored_chunk(kb, c + ch * L, true, p.rope_n_rot, p.rope_neox != 0u, newest, kf[2 * ch], kf[2 * ch + 1]);
            kv_stored_chunk(vb, c + ch * L, false, 0u, false, newest, vf[2 * ch], vf[2 * ch + 1]);
        }
    }
    uint n_kg = gl_NumSubgroups * (gl_SubgroupSize / L);
    uint kg = gl_SubgroupID * (gl_SubgroupSize / L) + lane / L;
    uint n_iter = (k1 - k0 + n_kg - 1) / n_kg;
    for (uint iter = 0; iter < n_iter; iter += KU) {
        vec4 kv[KU][2 * NC], vv[KU][2 * NC];
        bool valid[KU];
        [[unroll]] for (uint u = 0; u < KU; u++) { // the loads of the step's KU keys
            if (iter + u >= n_iter) // uniform: past the key loop's trip count
                break;
            uint j = k0 + (iter + u) * n_kg + kg;
            valid[u] = j < k1;
            uint jj = valid[u] ? j : k1 - 1;
            uint page = page_table[sq.pt_off + jj / p.page_size], rip = kvh * p.page_size + jj % p.page_size;
            if (jj == newest) {
                [[unroll]] for (uint e = 0; e < 2 * NC; e++) {
                    kv[u][e] = kf[e];
                    vv[u][e] = vf[e];
                }
            } else {
                [[unroll]] for (uint ch = 0; ch < NC; ch++) {
                    KV_LOAD(kpool, page, rip, c + ch * L, HD, kv[u][2 * ch], kv[u][2 * ch + 1]);
                    KV_LOAD(vpool, page, rip, c + ch * L, HD, vv[u][2 * ch], vv[u][2 * ch + 1]);
                }
            }
        }
        [[unroll]] for (uint u = 0; u < KU; u++) {
            if (iter + u >= n_iter) // uniform: past the key loop's trip count
                break;
            [[unroll]] for (uint g = 0; g < GMAX; g++) {
                if (g >= gn) // uniform
                    break;
                float s = 0.0;
                [[unroll]] for (uint ch = 0; ch < NC; ch++) {
                    uint qi = g * (HD / 4) + 2 * (c + ch * L);
                    s += dot(kv[u][2 * ch], qs[qi]) + dot(kv[u][2 * ch + 1], qs[qi + 1]);
                }
                s = ATTN_SCORE(lane_sum(s));
                if (valid[u]) {
                    if (s > m[g]) { // new running max: rescale what was summed so far
                        float a = exp2(m[g] - s);
                        l[g] *= a;
                        [[unroll]] for (uint e = 0; e < 2 * NC; e++)
                            acc[g][e] *= a;
                        m[g] = s;
                    }
                    float pr = exp2(s - m[g]);
                    l[g] += pr;
                    [[unroll]] for (uint e = 0; e < 2 * NC; e++)
                        acc[g][e] += pr * vv[u][e];
                }
            }
        }
    }
}

// Merges the key groups of this subgroup (xor partners differ in key group, not in dims).
void merge_subgroup()
{
    for (uint off = L; off < gl_SubgroupSize; off <<= 1) {
        [[unroll]] for (uint g = 0; g < GMAX; g++) {
            float mo = subgroupShuffleXor(m[g], off), lo = subgroupShuffleXor(l[g], off);
            float mn = max(m[g], mo);
            float a = m[g] == NEG_INF ? 0.0 : exp2(m[g] - mn), b = mo == NEG_INF ? 0.0 : exp2(mo - mn);
            l[g] = l[g] * a + lo * b;
            m[g] = mn;
            [[unroll]] for (uint e = 0; e < 2 * NC; e++)
                acc[g][e] = acc[g][e] * a + subgroupShuffleXor(acc[g][e], off) * b;
        }
    }
}

// Merges the subgroups into st_* through shared memory, one per round (once per workgroup).
void merge_workgroup(uint gn)
{
    for (uint s = 0; s < gl_NumSubgroups; s++) {
        if (gl_SubgroupID == s && lane < L) {
            uint rd = (s + 1) & 1, wr = s & 1;
            [[unroll]] for (uint g = 0; g < GMAX; g++) {
                if (g >= gn)
                    break;
                float a = 1.0, b = 0.0, mn = m[g];
                if (s > 0) {
                    float mo = st_m[rd][g];
                    mn = max(m[g], mo);
                    a = m[g] == NEG_INF ? 0.0 : exp2(m[g] - mn);
                    b = mo == NEG_INF ? 0.0 : exp2(mo - mn);
                }
                [[unroll]] for (uint ch = 0; ch < NC; ch++) {
                    [[unroll]] for (uint e = 0; e < 8; e++) {
                        uint d = 8 * (c + ch * L) + e;
                        float prev = s > 0 ? st_acc[g * HD + d] : 0.0;
                        st_acc[g * HD + d] = acc[g][2 * ch + e / 4][e % 4] * a + prev * b;
                    }
                }
                if (c == 0) {
                    st_l[wr][g] = l[g] * a + (s > 0 ? st_l[rd][g] * b : 0.0);
                    st_m[wr][g] = mn;
                }
            }
        }
        barrier();
    }
}

// With p.xq_rows: the workgroup's finished output (gn heads of token t, in st_acc) quantised
// into XQ as quant_x8.comp would quantise the output rows (M = xq_rows, K = n_heads * HD; HD a
// multiple of 32, so each block of 32 is one workgroup's): the integer-dot output projection
// reads it without a quant_x8 pass. Uniform control flow (a barrier first).
void write_xq(uint t, uint h0, uint gn)
{
    if (p.xq_rows == 0u)
        return;
    barrier();
    uint nb = HD / 32u;
    for (uint b = gl_LocalInvocationID.x; b < gn * nb; b += WG) {
        vec4 v[8];
        XQ_LOAD(v, st_acc, 32u * b);
        uint qw[8];
        float d;
        xq_block(v, qw, d);
        XQ_STORE(xq, xd, p.xq_rows, p.n_heads * HD, t, h0 * nb + b, qw, d);
    }
}

void main()
{
    uvec4 it = items[p.item_off + gl_WorkGroupID.x];
    vki_seq_info sq = seqs[it.x];
    uint slot = it.w, group = p.n_heads / p.n_kv_heads;
    uint kvh = gl_WorkGroupID.y / p.n_hblocks, hb = gl_WorkGroupID.y % p.n_hblocks;
    uint h0 = kvh * group + hb * p.gw, gn = min(p.gw, group - hb * p.gw);
    uint t = sq.row0 + sq.n_new - 1;
    load_queries(t, h0, gn, sq.n_ctx - 1u);
    barrier();

    // Lane roles from the subgroup ids, so that shuffle partners are in one subgroup.
    lane = gl_SubgroupInvocationID;
    c = lane % L;
    [[unroll]] for (uint g = 0; g < GMAX; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0;
        [[unroll]] for (uint e = 0; e < 2 * NC; e++)
            acc[g][e] = vec4(0.0);
    }
    attend(sq, kvh, it.y, it.z, gn, t);
    merge_subgroup();
    merge_workgroup(gn);

    uint fin = (gl_NumSubgroups - 1) & 1;
    for (uint i = gl_LocalInvocationID.x; i < gn * HD; i += WG) {
        uint g = i / HD, d = i % HD, h = h0 + g;
        if (slot == VKI_ATTN_FINAL) {
            float val = attn_finish(st_acc[i], st_l[fin][g], st_m[fin][g], ATTN_SINK(h));
            o[p.o_off + t * p.o_stride + h * HD + d] = val;
            st_acc[i] = val; // for the int8 copy
        } else {
            uint pb = (slot * p.n_heads + h) * (HD + 2);
            part[pb + d] = st_acc[i];
            if (d == 0) {
                part[pb + HD] = st_m[fin][g];
                part[pb + HD + 1] = st_l[fin][g];
            }
        }
    }
    if (slot == VKI_ATTN_FINAL) {
        write_xq(t, h0, gn);
        return;
    }
    if (p.merge == 0u)
        return;

    // Count this split done (release: its partials first); the sequence's last one merges.
    memoryBarrierBuffer();
    barrier();
    uvec4 re = items[p.red_off + it.x]; // the sequence's reduce entry {seq, slot0, n, 0}
    if (gl_LocalInvocationIndex == 0u) {
        uint ci = it.x * gl_NumWorkGroups.y + gl_WorkGroupID.y;
        memoryBarrierBuffer();
        last_split = atomicAdd(cnt[ci], 1u) + 1u == re.z;
        memoryBarrierBuffer(); // acquire: the other splits' partials
        if (last_split)
            cnt[ci] = 0u; // every split of this dispatch has counted: ready for the next one
    }
    barrier();
    if (!last_split) // uniform
        return;
    memoryBarrierBuffer();
    for (uint i = gl_LocalInvocationID.x; i < gn * HD; i += WG) {
        float val = attn_merge(re.y, re.z, h0 + i / HD, i % HD);
        o[p.o_off + t * p.o_stride + (h0 + i / HD) * HD + i % HD] = val;
        st_acc[i] = val;
    }
    write_xq(t, h0, gn);
}
