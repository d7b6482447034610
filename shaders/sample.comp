#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
#include "sample_util.glsl"
// The sampling stage: one workgroup per logits row, no sort of the vocabulary. Per row:
//   edits      penalties + bias applied in place at the row's few edited ids (raw saved); a
//              pending token (the one in flight, read from the edits buffer) counts too
//   argmax     1 strided pass: z_max and the greedy token (lowest id on ties)
//   candidates with a cut active, the survivors are among the tokens closest to z_max. 1
//              strided pass bins t = (z_max - z) / T (9 bins per unit, shared histogram of
//              counts, and of masses for top-p without top-k) and finds the bin where the
//              top-k count or the top-p mass is reached (min-p: the bin of its threshold); a
//              second pass splits that bin 255 ways when more than CAP tokens lie up to it.
//              If at most CAP tokens lie at or above the cut's (sub-)bin, 2 chunked passes
//              copy them, in id order, into shared memory and every step below runs on that
//              list. Else, for top-k or top-p alone, the list takes only the crossing
//              (sub-)bin: the cut is selected there and only the draw reads the row. Else
//              (top-k and top-p with k > CAP, or a crowded crossing bin) the row is read.
//   top-k      radix select on the order key, counts only: 4 passes (8-bit digits, MSB first,
//              shared-memory histogram per pass)
//   top-p      the same radix select over the top-k survivors with 64-bit fixed-point masses
//              w = exp((z - z_max) / T) * 2^40 (exact integer sums: the cut does not depend on
//              the order of atomics, so the same row gives the same token on every run)
//   ties       when a cut splits a run of equal logits, 1 chunked pass finds the id at which
//              the lowest-id members end (order (z desc, id asc): exactly k survive top-k)
//   min-p      a threshold z >= z_max + T log(min_p): no pass
//   draw       1 chunked pass (thread t owns elements [t*C, t*C + C)): per-thread survivor
//              masses, a two-level scan locates the chunk holding floor(u * total), and its
//              owner scans C elements in id order; u is 64 bits of Philox4x32-10(seed, position)
//   restore    the edited ids get their raw logits back
//   logprobs   1 strided pass for the raw log-sum-exp; top-n: radix select on raw keys (4
//              passes) + 1 gather pass, then a sort of <= 20 entries
//   mask       (grammar-constrained rows) every row read of the steps above sees the tokens the
//              row's allowed-token bitset excludes as -inf; the logprob passes see the raw row
// Row reads: greedy 1; temperature only 2; top-k/top-p/min-p 4 to 5 (argmax, 1-2 histograms, 2
// gathers); top-k or top-p alone over more than CAP survivors 6 (argmax, 2 histograms, 2
// gathers, the draw); the whole-row route 11 to 13; logprobs +1, top-n +5.
// Bound by: memory latency. One workgroup reads a row (at batch 1 one SM reads the whole
// vocabulary, 0.5 MB for 128k tokens), so what limits a pass is the loads in flight, not
// bandwidth: one 4-byte load per invocation at a time is 4 KiB per SM per round trip (~7 GB/s,
// ~70 us a pass, measured on an H200). Every pass therefore loads SU elements per invocation
// before using them (runs: run_row, run_elems) and uses them in the order the one-at-a-time loop
// did, so any SU gives the same bits.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256; // power of two, 64 .. 1024
layout(constant_id = 1) const uint SU = 1;   // elements each invocation loads at once, 1 .. 16
layout(push_constant) uniform PushBlock { vki_pc_sample p; };
// f32 [rows][row_stride]: row r of this dispatch at logits[r * row_stride]; read-write (edited
// ids are overwritten and restored inside this kernel, by this workgroup only)
layout(std430, binding = 0) coherent buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer Rows { vki_sample_row rows[]; };   // [n_rows]
layout(std430, binding = 2) readonly buffer Edits { vki_sample_edit edits[]; }; // [n_edits]
layout(std430, binding = 3) buffer Saved { float saved[]; };                    // f32 [n_edits]
layout(std430, binding = 4) writeonly buffer Out { vki_sample_out outs[]; };   // [n_rows]
// u32 allowed-token bitsets of the rows with VKI_SAMPLE_MASK, ceil(n_vocab / 32) words each
layout(std430, binding = 5) readonly buffer Masks { uint masks[]; };

#define NEG_INF uintBitsToFloat(0xff800000u)
#define FLT_MAX_ 3.402823466e38
#define NO_ID 0xffffffffu
#define GS 32u // entries per group in the two-level scans
#define SRC_PART 0u
#define SRC_HCNT 1u
#define SRC_HMASS 2u
#define CAP 1024u // candidate list capacity (8 KiB of shared memory)

shared vki_sample_row sp;
shared uint h_cnt[256], h_lo[256], h_hi[256]; // digit histogram: counts, 64-bit masses
shared uvec2 s_part[WG];                       // per-thread chunk partials
shared uvec2 s_grp[32];                        // group sums of s_part or of the histogram
shared float red_f[WG];                        // per-subgroup partials
shared uint red_u[WG];
shared uint s_prefix, s_tied, s_owner, s_rank, s_id, s_ntop;
shared uint s_bin, s_ncand, s_nbefore, s_ncross;
shared uint s_bad; // some raw logit of the row is NaN or +inf (vki_sample_out.nonfinite)
shared uint s_pend_hit; // VKI_SAMPLE_PENDING: the pending token has an entry of the row
shared uvec2 s_rem, s_before, s_target, s_total;
shared uint s_top_id[VKI_SAMPLE_MAX_TOP], s_top_key[VKI_SAMPLE_MAX_TOP];
shared uint s_lid[CAP];  // candidate list: ids ascending
shared float s_lz[CAP];  // and their logits

uint tid, g_base, g_n;
float g_zmax, g_invt;
bool g_list;  // the passes below read the candidate list instead of the row
bool g_mask;  // the row has an allowed-token mask and the selection passes apply it
bool g_bad;   // this invocation saw a NaN or +inf raw logit
uint g_count; // elements they read: g_n, or the list's length

// Sanitised logit: NaN -> -inf, +inf -> FLT_MAX (the CPU reference does the same); a token the
// row's mask excludes reads as -inf during selection (one extra word read per element, from a
// 4 KiB-per-32k-tokens bitset that stays in cache).
float sanitized(uint i, float v)
{
    if (g_mask && (masks[sp.mask0 + (i >> 5u)] & (1u << (i & 31u))) == 0u)
        return NEG_INF;
    return isnan(v) ? NEG_INF : min(v, FLT_MAX_);
}

float load_z(uint i) { return sanitized(i, logits[g_base + i]); }

// A raw logit that says the model's numbers broke (NaN or +inf; -inf is a legitimate ban).
bool broken(float v) { return isnan(v) || (isinf(v) && v > 0.0); }

// Fixed-point weight w * 2^40 of a token relative to the row maximum; exactly 2^40 at the max.
uvec2 wfix(float z)
{
    if (z == g_zmax)
        return uvec2(0u, 256u);
    if (z == NEG_INF) // not (-inf) * 0 = NaN when 1/T is denormal and flushed to 0
        return uvec2(0u);
    precise float t = (z - g_zmax) * g_invt;
    return f_to_u64(exp(t) * 1099511627776.0);
}

// A run of the row's raw logits: elements i0, i0 + step, ... (SU of them; past `end`: -inf), all
// loads issued before any is used.
void run_row(uint i0, uint step, uint end, out float v[SU])
{
    [[unroll]] for (uint u = 0u; u < SU; u++) {
        const uint i = i0 + u * step;
        v[u] = i < end ? logits[g_base + i] : NEG_INF;
    }
}

// The same run of what the passes read: (id, sanitised logit) of the row, or of the candidate
// list (past its end: whatever the list holds there; callers skip those positions).
void run_elems(uint i0, uint step, uint end, out uint id[SU], out float z[SU])
{
    if (g_list) {
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            const uint i = min(i0 + u * step, CAP - 1u);
            id[u] = s_lid[i];
            z[u] = s_lz[i];
        }
        return;
    }
    run_row(i0, step, end, z);
    [[unroll]] for (uint u = 0u; u < SU; u++) {
        id[u] = i0 + u * step;
        z[u] = id[u] < end ? sanitized(id[u], z[u]) : NEG_INF;
    }
}

bool in_cut(uint k, uint i, uvec2 cut) { return k > cut.x || (k == cut.x && i <= cut.y); }

uvec2 tighter(uvec2 a, uvec2 b) { return (a.x > b.x || (a.x == b.x && a.y <= b.y)) ? a : b; }

uint chunk_lo() { return min(tid * ((g_count + WG - 1u) / WG), g_count); }
uint chunk_hi() { return min(chunk_lo() + (g_count + WG - 1u) / WG, g_count); }

// ---- workgroup reductions (results in every thread) -------------------------------------------

void wg_argmax(inout float v, inout uint id)
{
    float m = subgroupMax(v);
    uint j = subgroupMin(v == m ? id : NO_ID);
    if (subgroupElect()) {
        red_f[gl_SubgroupID] = m;
        red_u[gl_SubgroupID] = j;
    }
    barrier();
    v = red_f[0];
    id = red_u[0];
    for (uint s = 1u; s < gl_NumSubgroups; s++)
        if (red_f[s] > v || (red_f[s] == v && red_u[s] < id)) {
            v = red_f[s];
            id = red_u[s];
        }
    barrier();
}

uint wg_sum_u(uint v)
{
    v = subgroupAdd(v);
    if (subgroupElect())
        red_u[gl_SubgroupID] = v;
    barrier();
    uint t = 0u;
    for (uint s = 0u; s < gl_NumSubgroups; s++)
        t += red_u[s];
    barrier();
    return t;
}

// log(sum exp) of the per-thread (max m, sum of exp(v - m)) pairs; -inf for an all -inf row.
float wg_lse(float m, float s)
{
    float mx = subgroupMax(m);
    float sum = subgroupAdd(m == NEG_INF ? 0.0 : s * exp(m - mx));
    if (subgroupElect()) {
        red_f[gl_SubgroupID] = mx;
        red_u[gl_SubgroupID] = floatBitsToUint(sum);
    }
    barrier();
    float gm = NEG_INF;
    for (uint i = 0u; i < gl_NumSubgroups; i++)
        gm = max(gm, red_f[i]);
    float gs = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++)
        if (red_f[i] != NEG_INF)
            gs += uintBitsToFloat(red_u[i]) * exp(red_f[i] - gm);
    barrier();
    return gm == NEG_INF ? NEG_INF : gm + log(gs);
}

// ---- two-level scans over s_part[] or the histogram (bins in descending digit order) -----------

uvec2 src_get(uint src, uint j)
{
    if (src == SRC_PART)
        return s_part[j];
    uint b = 255u - j;
    return src == SRC_HCNT ? uvec2(h_cnt[b], 0u) : uvec2(h_lo[b], h_hi[b]);
}

// s_grp[g] = sum of entries [g*GS, g*GS + GS) of a source of n entries. Starts with a barrier
// (the source was just written) and ends with one.
void group_sums(uint src, uint n)
{
    barrier();
    if (tid < (n + GS - 1u) / GS) {
        uvec2 s = uvec2(0u);
        for (uint j = tid * GS; j < min(tid * GS + GS, n); j++)
            s = add64(s, src_get(src, j));
        s_grp[tid] = s;
    }
    barrier();
}

uvec2 group_total(uint n)
{
    uvec2 t = uvec2(0u);
    for (uint g = 0u; g < (n + GS - 1u) / GS; g++)
        t = add64(t, s_grp[g]);
    return t;
}

// One thread, after group_sums: the first entry j whose inclusive prefix sum exceeds target
// (the last entry if none does); before = the sum of the entries ahead of j. <= 2 * GS steps.
uint locate(uint src, uint n, uvec2 target, out uvec2 before)
{
    uint ng = (n + GS - 1u) / GS, g = 0u;
    uvec2 cum = uvec2(0u);
    for (; g + 1u < ng; g++) {
        uvec2 nx = add64(cum, s_grp[g]);
        if (gt64(nx, target))
            break;
        cum = nx;
    }
    uint j = g * GS, end = min(j + GS, n);
    for (; j + 1u < end; j++) {
        uvec2 nx = add64(cum, src_get(src, j));
        if (gt64(nx, target))
            break;
        cum = nx;
    }
    before = cum;
    return j;
}

// ---- passes ------------------------------------------------------------------------------------

// Penalties then bias at one edited id (its raw value to saved[g]), or the restore.
void edit_one(uint g, uint tok, uint cnt, float bias, bool restore)
{
    uint at = g_base + tok;
    if (restore) {
        logits[at] = saved[g];
        return;
    }
    float raw = logits[at];
    saved[g] = raw;
    g_bad = g_bad || broken(raw);
    precise float z = isnan(raw) ? NEG_INF : min(raw, FLT_MAX_);
    if (cnt > 0u) {
        z = z > 0.0 ? z * sp.inv_rep : z * sp.rep;
        precise float pen = float(cnt) * sp.frequency + sp.presence;
        z = z - pen;
    }
    logits[at] = min(z + bias, FLT_MAX_); // what load_z reads anyway; never +inf, so only raw
                                          // logits can look broken
}

// The row's edits, or their restore. A pending token (VKI_SAMPLE_PENDING: sampled by the step
// before, copied into edits[sp.pend] on the device) counts once more in its entry, or is applied
// by invocation 0 as an entry of its own when the row has none for it (s_pend_hit).
void apply_edits(bool restore)
{
    bool pending = (sp.flags & VKI_SAMPLE_PENDING) != 0u; // uniform: the barrier below is too
    uint pend = pending ? uint(edits[sp.pend].token) : NO_ID; // -1 (nothing sampled): NO_ID
    for (uint e = tid; e < sp.n_edits; e += WG) {
        uint g = sp.edit0 + e, tok = uint(edits[g].token);
        if (tok >= g_n) // packed on the host from checked ids; never write outside the row
            continue;
        if (tok == pend && !restore)
            s_pend_hit = 1u;
        edit_one(g, tok, edits[g].count + (tok == pend ? 1u : 0u), edits[g].bias, restore);
    }
    if (pending) {
        memoryBarrierShared();
        barrier();
        if (tid == 0u && pend < g_n && s_pend_hit == 0u)
            edit_one(sp.pend, pend, 1u, 0.0, restore);
    }
    memoryBarrierBuffer();
    barrier();
}

// The r-th (1-based) id, in id order, among the elements with key K inside cut.
uint tie_find(uint K, uint r, uvec2 cut)
{
    uint lo = chunk_lo(), hi = chunk_hi(), c = 0u, id[SU];
    float z[SU];
    for (uint i0 = lo; i0 < hi; i0 += SU) {
        run_elems(i0, 1u, hi, id, z);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            uint k = key_of(z[u]);
            if (i0 + u < hi && k == K && in_cut(k, id[u], cut))
                c++;
        }
    }
    s_part[tid] = uvec2(c, 0u);
    group_sums(SRC_PART, WG);
    if (tid == 0u) {
        uvec2 before;
        s_owner = locate(SRC_PART, WG, uvec2(r - 1u, 0u), before);
        s_rank = r - before.x;
    }
    barrier();
    if (tid == s_owner) {
        uint seen = 0u;
        bool found = false;
        for (uint i0 = lo; i0 < hi && !found; i0 += SU) {
            run_elems(i0, 1u, hi, id, z);
            [[unroll]] for (uint u = 0u; u < SU; u++) {
                uint k = key_of(z[u]);
                if (i0 + u < hi && k == K && in_cut(k, id[u], cut) && ++seen == s_rank) {
                    s_id = id[u];
                    found = true;
                    break;
                }
            }
        }
    }
    barrier();
    uint r_id = s_id;
    barrier();
    return r_id;
}

// One histogram pass of radix_select: digit at `shift` of the keys inside cut whose higher bits
// equal prefix; then thread 0 picks the bin where the remaining target is reached.
void radix_level(bool mass, uint want, uvec2 cut, uvec2 total, uvec2 target, uint lvl)
{
    uint shift = 24u - 8u * lvl, hmask = lvl == 0u ? 0u : (0xffffffffu << (shift + 8u));
    for (uint b = tid; b < 256u; b += WG) {
        h_cnt[b] = 0u;
        h_lo[b] = 0u;
        h_hi[b] = 0u;
    }
    barrier();
    uint prefix = s_prefix;
    for (uint i0 = tid; i0 < g_count; i0 += SU * WG) {
        uint id[SU];
        float z[SU];
        run_elems(i0, WG, g_count, id, z);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            uint k = key_of(z[u]);
            if (i0 + u * WG >= g_count || (k & hmask) != prefix || !in_cut(k, id[u], cut))
                continue;
            uint d = (k >> shift) & 255u;
            atomicAdd(h_cnt[d], 1u);
            if (mass) {
                uvec2 w = wfix(z[u]);
                uint old = atomicAdd(h_lo[d], w.x);
                uint hi = w.y + (old + w.x < old ? 1u : 0u); // 64-bit add from two 32-bit atomics
                if (hi != 0u)
                    atomicAdd(h_hi[d], hi);
            }
        }
    }
    uint src = mass ? SRC_HMASS : SRC_HCNT;
    group_sums(src, 256u);
    if (tid == 0u) {
        uvec2 rem = s_rem, before;
        if (lvl == 0u && mass) { // target mass: given, or top_p of the mass inside cut, >= 1 unit
            rem = target != uvec2(0u) ? target : mulhi64x32(total != uvec2(0u) ? total : group_total(256u), want);
            if (rem == uvec2(0u))
                rem = uvec2(1u, 0u);
        }
        uint d = 255u - locate(src, 256u, sub64(rem, uvec2(1u, 0u)), before);
        s_prefix = prefix | (d << shift);
        s_rem = sub64(rem, before);
        s_tied = h_cnt[d];
    }
    barrier();
}

// The cut (key, last id) of the order (z desc, id asc) restricted to the elements inside cut:
// mass == false: its first `want` elements (want <= their number);
// mass == true:  its shortest prefix whose mass reaches `target` if nonzero, else
//                max(1, M * want / 2^32), M = total if nonzero (the candidate list holds only
//                part of the elements inside cut), else the mass inside cut.
uvec2 radix_select(bool mass, uint want, uvec2 cut, uvec2 total, uvec2 target)
{
    if (tid == 0u) {
        s_prefix = 0u;
        s_rem = uvec2(want, 0u);
    }
    for (uint lvl = 0u; lvl < 4u; lvl++)
        radix_level(mass, want, cut, total, target, lvl);
    uint K = s_prefix, tied = s_tied;
    uvec2 rem = s_rem;
    barrier();
    uint r = rem.x; // count mode: how many of the tied keys are needed
    if (mass) {     // smallest r with r * w(K) >= rem (r <= tied since the tied mass reaches rem)
        uvec2 wk = wfix(z_of_key(K));
        uint lo = 1u, hi = tied;
        while (lo < hi) {
            uint mid = (lo + hi) / 2u;
            if (ge64(mul64x32(wk, mid), rem))
                hi = mid;
            else
                lo = mid + 1u;
        }
        r = lo;
    }
    uint id = NO_ID; // the whole run of ties at K is inside unless the cut splits it
    if (r < tied)
        id = tie_find(K, r, cut);
    return uvec2(K, id);
}

// Draws among the elements inside cut with nonzero weight, in id order.
void draw(uvec2 cut, out int token, out uint kept)
{
    uint lo = chunk_lo(), hi = chunk_hi(), c = 0u, id[SU];
    float z[SU];
    uvec2 m = uvec2(0u);
    for (uint i0 = lo; i0 < hi; i0 += SU) {
        run_elems(i0, 1u, hi, id, z);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            uvec2 w = i0 + u < hi && in_cut(key_of(z[u]), id[u], cut) ? wfix(z[u]) : uvec2(0u);
            if (w != uvec2(0u)) {
                m = add64(m, w);
                c++;
            }
        }
    }
    s_part[tid] = m;
    kept = wg_sum_u(c);
    group_sums(SRC_PART, WG);
    if (tid == 0u) {
        uvec4 r = philox4x32_10(uvec4(sp.position, 0u, 0u, 0u), uvec2(sp.seed_lo, sp.seed_hi));
        uvec2 target = mulhi64(group_total(WG), uvec2(r.y, r.x)), before;
        s_owner = locate(SRC_PART, WG, target, before);
        s_before = before;
        s_target = target;
    }
    barrier();
    if (tid == s_owner) {
        uvec2 cum = s_before;
        bool found = false;
        for (uint i0 = lo; i0 < hi && !found; i0 += SU) {
            run_elems(i0, 1u, hi, id, z);
            [[unroll]] for (uint u = 0u; u < SU; u++) {
                if (i0 + u >= hi || !in_cut(key_of(z[u]), id[u], cut))
                    continue;
                cum = add64(cum, wfix(z[u]));
                if (gt64(cum, s_target)) {
                    s_id = id[u];
                    found = true;
                    break;
                }
            }
        }
    }
    barrier();
    token = int(s_id);
    barrier();
}

// ---- the candidate list ------------------------------------------------------------------------
// Tokens are binned by t = (z_max - z) / T: coarse bins of 1/9 (t < 28; beyond, w truncates to
// 0), and 255 sub-bins inside one coarse bin. Both are monotone in z, so "bin <= b" always
// selects a prefix of the order (z desc, id asc): the survivors of a cut lie in the bins up to
// the one where the cut's count or mass is reached.

uint g_b0, g_s1; // candidates: coarse bin < g_b0, or == g_b0 with sub-bin <= g_s1
bool g_split;    // coarse bin g_b0 was split: the cut crosses sub-bin g_s1 (else all of g_b0)
bool g_cmin;     // and z >= g_zthr (min-p, when top-p does not need the whole top-k set)
float g_zthr;
uint g_ncross;   // tokens in the bin (or sub-bin) where the cut is reached
uvec2 g_xrem;    // what the cut still needs there: a count (top-k) or a mass (top-p)

uint lw_bin(float z)
{
    if (z == g_zmax)
        return 0u;
    precise float t9 = (g_zmax - z) * g_invt * 9.0;
    return t9 < 252.0 ? uint(t9) : 255u;
}

uint lw_sub(float z) // for z in coarse bin g_b0
{
    if (z == g_zmax)
        return 0u;
    precise float t9 = (g_zmax - z) * g_invt * 9.0;
    return min(uint((t9 - float(g_b0)) * 255.0), 254u);
}

bool is_cand(float z)
{
    uint b = lw_bin(z);
    if (b > g_b0 || (b == g_b0 && g_split && lw_sub(z) > g_s1))
        return false;
    return !g_cmin || z >= g_zthr;
}

bool is_cross(float z) { return lw_bin(z) == g_b0 && (!g_split || lw_sub(z) == g_s1); }

// Histogram (index 255 - digit, so src_get reads digit 0 first) of the coarse bins (lvl 0) or
// of the sub-bins of coarse bin g_b0 (lvl 1): counts, and masses when `mass`.
void lw_hist(uint lvl, bool mass)
{
    for (uint b = tid; b < 256u; b += WG) {
        h_cnt[b] = 0u;
        h_lo[b] = 0u;
        h_hi[b] = 0u;
    }
    barrier();
    for (uint i0 = tid; i0 < g_n; i0 += SU * WG) {
        float v[SU];
        run_row(i0, WG, g_n, v);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            const uint i = i0 + u * WG;
            if (i >= g_n)
                break;
            float z = sanitized(i, v[u]);
            uint b = lw_bin(z);
            if (b == 255u || (lvl == 1u && b != g_b0))
                continue;
            uint d = 255u - (lvl == 0u ? b : lw_sub(z));
            atomicAdd(h_cnt[d], 1u);
            if (mass) {
                uvec2 w = wfix(z);
                uint old = atomicAdd(h_lo[d], w.x);
                uint hi = w.y + (old + w.x < old ? 1u : 0u);
                if (hi != 0u)
                    atomicAdd(h_hi[d], hi);
            }
        }
    }
}

// One thread, after group_sums(SRC_HCNT): tokens with digit 0 .. j.
uint count_through(uint j)
{
    uint c = 0u, g = j / GS;
    for (uint i = 0u; i < g; i++)
        c += s_grp[i].x;
    for (uint i = g * GS; i <= j; i++)
        c += h_cnt[255u - i];
    return c;
}

// One histogram level: the digit where the top-k count (k) or the top-p mass (mass: of the
// whole row, P = its top_p fraction) is reached; s_ncand = tokens up to that digit, counting
// s_nbefore ahead of the level's range.
void cand_level(uint lvl, bool mass)
{
    lw_hist(lvl, mass);
    uvec2 before;
    if (mass) {
        group_sums(SRC_HMASS, 256u);
        if (tid == 0u) {
            if (lvl == 0u) {
                s_total = group_total(256u);
                s_rem = mulhi64x32(s_total, sp.top_p32);
                if (s_rem == uvec2(0u))
                    s_rem = uvec2(1u, 0u);
            }
            s_bin = locate(SRC_HMASS, 256u, sub64(s_rem, uvec2(1u, 0u)), before);
            s_rem = sub64(s_rem, before);
        }
    }
    group_sums(SRC_HCNT, 256u);
    if (tid == 0u) {
        if (!mass) {
            if (lvl == 0u)
                s_rem = uvec2(sp.top_k, 0u);
            s_bin = locate(SRC_HCNT, 256u, sub64(s_rem, uvec2(1u, 0u)), before);
            s_rem = sub64(s_rem, before);
        }
        uint through = count_through(s_bin);
        s_ncross = h_cnt[255u - s_bin];
        if (lvl == 0u)
            s_nbefore = through - s_ncross;
        s_ncand = (lvl == 0u ? 0u : s_nbefore) + through;
    }
    barrier();
}

// Chooses the candidate predicate; returns an upper bound of the candidates (NO_ID: unknown)
// and, for top-p without top-k, the row's total mass in *total. 1 or 2 strided passes.
uint choose_candidates(bool tk, bool tp, bool mp, out uvec2 total)
{
    g_cmin = mp && !tp; // with top-p the list must hold every top-k token (their mass counts)
    g_zthr = g_zmax + sp.min_p_delta;
    g_b0 = 255u;
    g_s1 = 254u;
    g_split = false;
    total = uvec2(0u);
    if (!tk && !tp)
        return NO_ID; // min-p alone: z >= threshold, counted by the gather
    bool mass = !tk;
    cand_level(0u, mass);
    g_b0 = s_bin;
    uint n = s_ncand;
    if (mass)
        total = s_total;
    barrier();
    if (g_b0 != 255u && n > CAP) { // split the crossing bin 255 ways
        cand_level(1u, mass);
        g_s1 = s_bin;
        g_split = true;
        n = s_ncand;
    }
    g_ncross = s_ncross;
    g_xrem = s_rem;
    barrier();
    return g_b0 == 255u ? g_n : n; // 255: the cut reaches past t = 28, every token is a candidate
}

// Copies the candidates (or, with `cross`, only the tokens of the bin where the cut is reached)
// into s_lid / s_lz in id order (a chunked count, a scan, a chunked copy) if there are at most
// CAP; then the passes read the list. 2 chunked passes. Returns whether it did.
bool gather(bool cross)
{
    uint lo = chunk_lo(), hi = chunk_hi(), c = 0u;
    float v[SU];
    for (uint i0 = lo; i0 < hi; i0 += SU) {
        run_row(i0, 1u, hi, v);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            float z = i0 + u < hi ? sanitized(i0 + u, v[u]) : NEG_INF;
            c += i0 + u < hi && (cross ? is_cross(z) : is_cand(z)) ? 1u : 0u;
        }
    }
    s_part[tid] = uvec2(c, 0u);
    group_sums(SRC_PART, WG);
    uint n = group_total(WG).x, off = 0u;
    for (uint g = 0u; g < tid / GS; g++)
        off += s_grp[g].x;
    for (uint t = tid / GS * GS; t < tid; t++)
        off += s_part[t].x;
    barrier();
    if (n > CAP)
        return false;
    for (uint i0 = lo; i0 < hi && off < n; i0 += SU) {
        run_row(i0, 1u, hi, v);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            const uint i = i0 + u;
            if (i >= hi || off >= n)
                break;
            float z = sanitized(i, v[u]);
            if (cross ? is_cross(z) : is_cand(z)) {
                s_lid[off] = i;
                s_lz[off] = z;
                off++;
            }
        }
    }
    barrier();
    g_list = true;
    g_count = n;
    return true;
}

// Cuts and draw for a row with temperature > 0 (z_max finite). Three routes, one result:
//  - all candidates fit the list: every step on the list;
//  - only the crossing bin fits (top-k or top-p alone, more than CAP survivors): the cut is
//    selected among the crossing bin's tokens (all tokens of earlier bins have larger logits, so
//    it is the row's cut), then the draw reads the row;
//  - otherwise every step reads the row.
void sample_row(out int token, out uint kept)
{
    bool tk = sp.top_k != 0u && sp.top_k < g_n, tp = sp.top_p32 != 0u, mp = sp.min_p_delta != NEG_INF;
    bool cross = false;
    uvec2 total = uvec2(0u), cut = uvec2(0u, NO_ID); // everything
    if (tk || tp || mp) {
        uint bound = choose_candidates(tk, tp, mp, total);
        if (bound <= CAP || bound == NO_ID || g_cmin)
            gather(false);
        if (!g_list && tk != tp && g_b0 != 255u && g_ncross <= CAP)
            cross = gather(true);
    }
    if (cross) {
        cut = radix_select(tp, g_xrem.x, cut, uvec2(0u), tp ? g_xrem : uvec2(0u));
        g_list = false;
        g_count = g_n;
    } else {
        if (tk && sp.top_k < g_count)
            cut = radix_select(false, sp.top_k, cut, uvec2(0u), uvec2(0u));
        if (tp)
            cut = radix_select(true, sp.top_p32, cut, total, uvec2(0u));
    }
    if (mp)
        cut = tighter(cut, uvec2(key_of(g_zthr), NO_ID));
    draw(cut, token, kept);
}

// Raw log-sum-exp (after the restore).
float raw_lse()
{
    float m = NEG_INF, s = 0.0;
    for (uint i0 = tid; i0 < g_n; i0 += SU * WG) {
        float r[SU];
        run_row(i0, WG, g_n, r);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            if (i0 + u * WG >= g_n)
                break;
            float v = sanitized(i0 + u * WG, r[u]);
            if (v > m) {
                s = s * exp(m - v) + 1.0;
                m = v;
            } else if (v != NEG_INF) {
                s += exp(v - m);
            }
        }
    }
    return wg_lse(m, s);
}

// The n_top most likely raw tokens (ties: lowest id) with their logprobs, into outs[row].
void top_logprobs(uint row, float lse)
{
    uint n = min(sp.n_top, g_n);
    uvec2 cut = n < g_n ? radix_select(false, n, uvec2(0u, NO_ID), uvec2(0u), uvec2(0u)) : uvec2(0u, NO_ID);
    if (tid == 0u)
        s_ntop = 0u;
    barrier();
    for (uint i0 = tid; i0 < g_n; i0 += SU * WG) {
        float r[SU];
        run_row(i0, WG, g_n, r);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            const uint i = i0 + u * WG;
            if (i >= g_n)
                break;
            uint k = key_of(sanitized(i, r[u]));
            if (in_cut(k, i, cut)) {
                uint s = atomicAdd(s_ntop, 1u);
                if (s < VKI_SAMPLE_MAX_TOP) {
                    s_top_id[s] = i;
                    s_top_key[s] = k;
                }
            }
        }
    }
    barrier();
    if (tid == 0u) {
        n = min(s_ntop, n);
        for (uint a = 1u; a < n; a++) // insertion sort by (key desc, id asc)
            for (uint b = a; b > 0u && (s_top_key[b] > s_top_key[b - 1u] ||
                                       (s_top_key[b] == s_top_key[b - 1u] && s_top_id[b] < s_top_id[b - 1u])); b--) {
                uint ti = s_top_id[b], tk = s_top_key[b];
                s_top_id[b] = s_top_id[b - 1u];
                s_top_key[b] = s_top_key[b - 1u];
                s_top_id[b - 1u] = ti;
                s_top_key[b - 1u] = tk;
            }
        for (uint a = 0u; a < n; a++) {
            outs[row].top_tokens[a] = int(s_top_id[a]);
            outs[row].top_logprobs[a] = lse == NEG_INF ? NEG_INF : z_of_key(s_top_key[a]) - lse;
        }
        outs[row].n_top = n;
    }
}

void main()
{
    tid = gl_LocalInvocationID.x;
    uint row = p.row0 + gl_WorkGroupID.x;
    g_base = gl_WorkGroupID.x * p.row_stride;
    g_n = p.n_vocab;
    g_count = g_n;
    g_list = false;
    g_bad = false;
    if (tid == 0u) {
        sp = rows[row];
        s_bad = 0u;
        s_pend_hit = 0u;
    }
    barrier();
    g_invt = sp.inv_temp;
    g_mask = (sp.flags & VKI_SAMPLE_MASK) != 0u;
    apply_edits(false);

    float zmax = NEG_INF;
    uint amax = NO_ID;
    for (uint i0 = tid; i0 < g_n; i0 += SU * WG) { // also the non-finite check (the edited ids'
        float r[SU];                                  // raw values were checked in apply_edits)
        run_row(i0, WG, g_n, r);
        [[unroll]] for (uint u = 0u; u < SU; u++) {
            const uint i = i0 + u * WG;
            if (i >= g_n)
                break;
            g_bad = g_bad || broken(r[u]);
            float z = sanitized(i, r[u]);
            if (z > zmax) {
                zmax = z;
                amax = i;
            }
        }
    }
    if (g_bad)
        s_bad = 1u; // every writer stores the same value; wg_argmax's barrier publishes it
    wg_argmax(zmax, amax);
    g_zmax = zmax;
    int token = -1;
    uint kept = 0u;
    if (zmax != NEG_INF) {
        if ((sp.flags & VKI_SAMPLE_GREEDY) != 0u) {
            token = int(amax);
            kept = 1u;
        } else {
            sample_row(token, kept);
        }
    }
    barrier(); // every read of the edited row is done
    g_list = false; // the logprob passes read the (restored, unmasked) row
    g_mask = false;
    g_count = g_n;
    apply_edits(true);

    bool want_lp = (sp.flags & VKI_SAMPLE_LOGPROBS) != 0u;
    float lse = 0.0;
    if (want_lp || sp.n_top > 0u)
        lse = raw_lse();
    if (tid == 0u) {
        outs[row].token = token;
        outs[row].logprob = !want_lp ? 0.0 : token < 0 || lse == NEG_INF ? NEG_INF : load_z(uint(token)) - lse;
        outs[row].n_kept = kept;
        outs[row].nonfinite = s_bad;
        outs[row].n_top = 0u;
    }
    if (sp.n_top > 0u)
        top_logprobs(row, lse);
}
