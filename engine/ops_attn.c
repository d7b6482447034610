/* Paged KV writes and attention: size choices per device, the per-step work list, dispatch. */
#include "engine/ops_attn.h"

#include <math.h>
#include <string.h>

#define KVW_WG 256u
#define RED_WG 64u
#define DEC_WG 128u
#define DEC_GMAX 8u /* query heads per decode workgroup: register arrays of GMAX * head_dim / L */

/* Smallest subgroup a shader may run with: shuffle partners must lie in one subgroup. */
static uint32_t min_subgroup(const vkd_device *d)
{
    uint32_t sg = d->info.subgroup_size;
    if (d->info.subgroup_min_size && d->info.subgroup_min_size < sg)
        sg = d->info.subgroup_min_size;
    return sg ? sg : 1;
}

static bool is_pow2(uint32_t v) { return v && !(v & (v - 1)); }

/* The kernel of the pool's element type: ids are consecutive F16, F32, Q8_0 in kernels.h. */
_Static_assert(VKK_KV_WRITE_Q8_0 == VKK_KV_WRITE_F16 + 2 && VKK_ATTN_DECODE_Q8_0 == VKK_ATTN_DECODE_F16 + 2 &&
                   VKK_ATTN_PREFILL_Q8_0 == VKK_ATTN_PREFILL_F16 + 2 &&
                   VKK_ATTN_PREFILL_CM_Q8_0 == VKK_ATTN_PREFILL_CM_F16 + 2 &&
                   VKK_ATTN_PREFILL_CME_Q8_0 == VKK_ATTN_PREFILL_CME_F16 + 2,
               "kernel ids per KV type are consecutive");
static vkk_id kid(const op_attn *a, vkk_id f16)
{
    return (vkk_id)(f16 + (a->s.kv_type == VKI_GGML_F16 ? 0 : a->s.kv_type == VKI_GGML_F32 ? 1 : 2));
}

uint64_t op_kv_page_bytes(const op_attn_shape *s)
{
    uint64_t rows = (uint64_t)s->n_kv_heads * s->page_size;
    if (s->kv_type == VKI_GGML_Q8_0)
        return 4 * VKI_KV_Q8_PAGE_WORDS(rows, (uint64_t)s->head_dim);
    return (s->kv_type == VKI_GGML_F16 ? 2 : 4) * rows * s->head_dim;
}

uint32_t op_kv_max_pages(const vkd_device *d, const op_attn_shape *s)
{
    uint64_t lim = d->info.max_storage_buffer_range;
    if (d->info.max_memory_allocation_size && d->info.max_memory_allocation_size < lim)
        lim = d->info.max_memory_allocation_size;
    uint64_t pages = op_kv_page_bytes(s) ? lim / op_kv_page_bytes(s) : 0;
    return pages > UINT32_MAX ? UINT32_MAX : (uint32_t)pages;
}

static vki_status check_shape(vkd_device *d, const op_attn_shape *s)
{
    bool ok = s->n_heads && s->n_kv_heads && s->n_heads % s->n_kv_heads == 0 && s->head_dim >= 8 &&
              s->head_dim <= 256 && s->head_dim % 8 == 0 && s->page_size &&
              (s->kv_type == VKI_GGML_F16 || s->kv_type == VKI_GGML_F32 || s->kv_type == VKI_GGML_Q8_0) &&
              s->scale >= 0 && isfinite(s->scale) && s->softcap >= 0 && isfinite(s->softcap) &&
              (s->window || !s->sink) && isfinite(s->temp_scale);
    if (!ok) {
        vkd_log(d, VKI_LOG_ERROR, "attention: unsupported shape (heads %u/%u, head_dim %u, page %u, kv type %u, "
                "softcap %g, window %u, sink %u)", s->n_heads, s->n_kv_heads, s->head_dim, s->page_size, s->kv_type,
                s->softcap, s->window, s->sink);
        return VKI_ERR_INVALID_ARG;
    }
    if (s->kv_type == VKI_GGML_Q8_0 && s->head_dim % 32) {
        vkd_log(d, VKI_LOG_ERROR, "a q8_0 KV cache needs a head dim that is a multiple of 32 (blocks of 32), this "
                "model's is %u: use --kv-type f16", s->head_dim);
        return VKI_ERR_UNSUPPORTED;
    }
    uint32_t need = VKI_SUBGROUP_BASIC | VKI_SUBGROUP_SHUFFLE;
    if ((d->info.subgroup_ops & need) != need) {
        vkd_log(d, VKI_LOG_ERROR, "attention needs subgroup shuffles, which this device lacks");
        return VKI_ERR_UNSUPPORTED;
    }
    return VKI_OK;
}

/* Prefill tiles {WG, BR, BC}, largest first: the first whose shared memory fits and whose
 * softmax lanes per row (WG / BR) fit one subgroup. WG = 8 * thread rows, BR a multiple of them. */
static bool pick_prefill(const vkd_device *d, uint32_t hd, uint32_t *spec)
{
    static const uint32_t cand[][3] = {{128, 32, 32}, {128, 16, 32}, {128, 16, 16}, {64, 8, 16}, {64, 8, 8}};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        uint32_t wg = cand[i][0], br = cand[i][1], bc = cand[i][2], tpr = wg / br;
        uint64_t smem = 4ull * (br * (hd + 4) + bc * (hd + 4) + br * (bc + 1) + 2 * br);
        if (smem <= d->info.max_compute_shared_memory && tpr <= min_subgroup(d) && is_pow2(tpr) &&
            wg <= d->info.max_workgroup_invocations) {
            spec[0] = wg, spec[1] = hd, spec[2] = br, spec[3] = bc;
            return true;
        }
    }
    return false;
}

/* Cooperative-matrix prefill tiles {BR rows, BC keys, TPR softmax lanes per row}, largest first:
 * the first with whole subgroups (WG = BR * TPR), TPR lanes in one subgroup, fragment-sized sides
 * and shared memory for Q, K/V, P (F16, rows padded by 8 halves) and S / P V (F32) at the head
 * dim padded to the fragment sides. GPUs: 32 x 64 over 4 warps at head dim 128 (47 KiB);
 * the emulation on a CPU device starts at 32 x 32, one lane per row. */
static bool pick_prefill_cm(const vkd_device *d, uint32_t hd, uint32_t *spec)
{
    static const uint32_t cand[][3] = {{64, 64, 4}, {32, 64, 4}, {32, 32, 4}, {16, 32, 8}, {32, 32, 1}, {16, 16, 2},
                                       {16, 16, 1}};
    const vkd_cm *cm = &d->cm;
    if (cm->kind == VKD_CM_NONE)
        return false;
    uint32_t side = cm->k > cm->n ? cm->k : cm->n, hdp = (hd + side - 1) / side * side;
    for (size_t i = d->info.type == VKI_DEVICE_CPU ? 4 : 0; i < sizeof cand / sizeof cand[0]; i++) {
        uint32_t br = cand[i][0], bc = cand[i][1], tpr = cand[i][2], wg = br * tpr;
        uint32_t sst = (bc > hdp ? bc : hdp) + 4;
        uint64_t smem = 2ull * (br + bc) * (hdp + 8) + 2ull * br * (bc + 8) + 4ull * br * sst;
        if (br % cm->m || bc % cm->n || bc % cm->k || hdp % tpr || wg % cm->sg || tpr > min_subgroup(d) ||
            wg > d->info.max_workgroup_invocations || smem > d->info.max_compute_shared_memory)
            continue;
        const uint32_t v[8] = {wg, hdp, br, bc, cm->m, cm->n, cm->k, cm->sg};
        memcpy(spec, v, sizeof v);
        return true;
    }
    return false;
}

vki_status op_attn_setup(vkd_device *d, const op_attn_shape *s, op_attn *out)
{
    vki_status st = check_shape(d, s);
    if (st != VKI_OK)
        return st;
    op_attn a = {.s = *s};
    if (!a.s.scale)
        a.s.scale = 1.0f / sqrtf((float)s->head_dim);
    uint32_t group = s->n_heads / s->n_kv_heads, sg = min_subgroup(d), d8 = s->head_dim / 8;
    uint32_t lanes = 1; /* lanes per key: the largest power of 2 dividing head_dim/8, <= subgroup */
    while (lanes * 2 <= sg && d8 % (lanes * 2) == 0)
        lanes *= 2;
    /* CPU devices (lavapipe) run a workgroup as a loop over its subgroups and pay for every
     * invocation and every merge round whether or not it has keys: one subgroup there (13x less
     * decode attention time on a stories260K serving load, bench/RESULTS.md). */
    uint32_t wg = d->info.type == VKI_DEVICE_CPU ? sg : DEC_WG < sg ? sg : DEC_WG;
    a.dec_gw = group < DEC_GMAX ? group : DEC_GMAX;
    a.dec_nhb = (group + a.dec_gw - 1) / a.dec_gw;
    /* KU: each key group's next KU keys loaded together (a short context's few workgroups wait
     * on load latency); 2 on GPUs, 1 on CPU devices (no latency to hide) */
    const uint32_t ku = d->attn_loads ? d->attn_loads : d->info.type == VKI_DEVICE_CPU ? 1 : 2;
    memcpy(a.dec_spec, (uint32_t[5]){wg, s->head_dim, lanes, a.dec_gw, ku}, sizeof a.dec_spec);
    bool cm = pick_prefill_cm(d, s->head_dim, a.pre_spec), nv = d->cm.kind == VKD_CM_NV;
    a.pre_kid = kid(&a, !cm ? VKK_ATTN_PREFILL_F16 : nv ? VKK_ATTN_PREFILL_CM_F16 : VKK_ATTN_PREFILL_CME_F16);
    if (wg > d->info.max_workgroup_invocations || (!cm && !pick_prefill(d, s->head_dim, a.pre_spec))) {
        vkd_log(d, VKI_LOG_ERROR, "attention: no tile size fits this device (head_dim %u)", s->head_dim);
        return VKI_ERR_UNSUPPORTED;
    }
    uint32_t br = a.pre_spec[2];
    a.pre_gw = group < br ? group : br;
    a.pre_nhb = (group + a.pre_gw - 1) / a.pre_gw;
    a.pre_nq = br / a.pre_gw;
    a.red_spec[0] = RED_WG;
    a.kvw_spec[0] = KVW_WG;
    /* A CPU device runs a few workgroups at once. A GPU needs many loads in flight per SM: aim
     * at ~2048 decode workgroups (an H100 has 132 SMs) while a split keeps >= 128 keys, so the
     * merge and the partial write stay small next to the split's K/V reads (kernel_config's
     * attn_split sets that least length: at 512 keys, 8 KV heads make 32 workgroups of 4
     * splits at 128, 128 of 16 at 32). */
    bool cpu = d->info.type == VKI_DEVICE_CPU;
    a.target_groups = cpu ? 32 : 2048;
    a.min_split = d->attn_split ? d->attn_split : cpu ? 64 : 128;
    *out = a;
    return VKI_OK;
}

vki_status op_attn_prepare(vkd_device *d, const op_attn *a)
{
    const struct { vkk_id k; const uint32_t *spec; } all[] = {
        {kid(a, VKK_KV_WRITE_F16), a->kvw_spec},
        {kid(a, VKK_ATTN_DECODE_F16), a->dec_spec},
        {a->pre_kid, a->pre_spec},
        {VKK_ATTN_REDUCE, a->red_spec},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        vki_status st = vkk_prepare(d, all[i].k, all[i].spec);
        if (st != VKI_OK)
            return st;
    }
    return VKI_OK;
}

uint32_t op_attn_max_items(const op_attn *a, uint32_t max_seqs, uint32_t max_tokens)
{
    /* decode: one split per key range of a sequence (window, sink) plus at most target_groups
     * more (see pick_split); one reduce entry per sequence; prefill: one block per pre_nq tokens
     * plus one per sequence; the decode dispatch's indirect arguments. */
    uint64_t n = 1 + 4ull * max_seqs + max_tokens / a->pre_nq + a->target_groups;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

uint64_t op_attn_scratch_bytes(const op_attn *a, uint32_t n_slots)
{
    return 4ull * n_slots * a->s.n_heads * (a->s.head_dim + 2);
}

uint64_t op_attn_merge_bytes(const op_attn *a, uint32_t max_seqs)
{
    return 4ull * max_seqs * a->s.n_kv_heads * a->dec_nhb;
}

/* Split length for the decode sequences: long enough that the splits of all sequences make about
 * target_groups workgroups (so one long context fills the GPU), never shorter than min_split. */
static uint32_t pick_split(const op_attn *a, uint64_t dec_keys)
{
    if (a->split_keys)
        return a->split_keys;
    uint64_t per_block = (uint64_t)a->s.n_kv_heads * a->dec_nhb;
    uint64_t c = (dec_keys * per_block + a->target_groups - 1) / a->target_groups;
    if (c < a->min_split)
        c = a->min_split;
    c = (c + 15) / 16 * 16;
    return c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

static uint32_t ceil_div(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a + b - 1) / b); }

/* The keys a one-token sequence's query sees: [*s0, *s1) (the sink; empty when the window
 * reaches it) and [*w0, n_ctx) (the window). */
static void visible_keys(const op_attn *a, uint32_t n_ctx, uint32_t *s0, uint32_t *s1, uint32_t *w0)
{
    uint32_t lo = a->s.window && n_ctx > a->s.window ? n_ctx - a->s.window : 0;
    if (a->s.sink >= lo) /* the sink reaches the window: one range, all keys */
        lo = 0;
    *s0 = 0, *s1 = lo ? a->s.sink : 0, *w0 = lo;
}

/* Decode splits of one sequence for split length c. */
static uint32_t n_splits(const op_attn *a, uint32_t n_ctx, uint32_t c)
{
    uint32_t s0, s1, w0;
    visible_keys(a, n_ctx, &s0, &s1, &w0);
    return ceil_div(s1 - s0, c) + ceil_div(n_ctx - w0, c);
}

/* Counts items for split length c; false when they exceed cap. */
static bool count_items(const op_attn *a, const vki_seq_info *seqs, uint32_t n_seqs, uint32_t c, uint32_t cap,
                        op_attn_plan *p)
{
    uint64_t dec = 0, split = 0, pre = 0, slots = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        if (seqs[i].n_new == 1) {
            uint32_t n = n_splits(a, seqs[i].n_ctx, c);
            dec += n;
            split += n > 1;
            slots += n > 1 ? n : 0;
        } else {
            pre += ceil_div(seqs[i].n_new, a->pre_nq);
        }
    }
    if (1 + dec + n_seqs + pre > cap)
        return false;
    p->n_dec = (uint32_t)dec, p->n_red = split ? n_seqs : 0, p->n_pre = (uint32_t)pre;
    p->red_off = 1 + p->n_pre, p->dec_off = p->red_off + n_seqs;
    p->n_slots = (uint32_t)slots, p->n_items = p->dec_off + p->n_dec, p->split = c;
    return true;
}

/* Splits of keys [k0, k1) of sequence i, each written to a partial slot unless `final`. */
static void split_range(vki_attn_item *items, uint32_t *di, uint32_t i, uint32_t k0, uint32_t k1, uint32_t c,
                        bool final, uint32_t *slot)
{
    for (; k0 < k1; k0 = k1 - k0 > c ? k0 + c : k1)
        items[(*di)++] = (vki_attn_item){i, k0, k1 - k0 > c ? k0 + c : k1, final ? VKI_ATTN_FINAL : (*slot)++};
}

static void fill_items(const op_attn *a, const vki_seq_info *seqs, uint32_t n_seqs, const op_attn_plan *p,
                       vki_attn_item *items)
{
    uint32_t di = p->dec_off, ri = p->red_off, pi = 1, slot = 0;
    items[0] = (vki_attn_item){p->n_dec, a->s.n_kv_heads * a->dec_nhb, 1, 0};
    for (uint32_t i = 0; i < n_seqs; i++) {
        const vki_seq_info *s = &seqs[i];
        if (s->n_new == 1) {
            uint32_t n = n_splits(a, s->n_ctx, p->split), s0, s1, w0;
            visible_keys(a, s->n_ctx, &s0, &s1, &w0);
            items[ri++] = (vki_attn_item){i, slot, n, 0};
            split_range(items, &di, i, s0, s1, p->split, n == 1, &slot);
            split_range(items, &di, i, w0, s->n_ctx, p->split, n == 1, &slot);
        } else {
            items[ri++] = (vki_attn_item){i, 0, 0, 0}; /* nothing to merge */
            for (uint32_t q0 = 0; q0 < s->n_new; q0 += a->pre_nq) {
                uint32_t nq = s->n_new - q0 < a->pre_nq ? s->n_new - q0 : a->pre_nq;
                items[pi++] = (vki_attn_item){i, q0, nq, 0};
            }
        }
    }
}

vki_status op_attn_plan_build(const op_attn *a, const vki_seq_info *seqs, uint32_t n_seqs,
                              vki_attn_item *items, uint32_t cap, op_attn_plan *plan)
{
    uint64_t tokens = 0, dec_keys = 0;
    uint32_t max_ctx = 1;
    for (uint32_t i = 0; i < n_seqs; i++)
        tokens += seqs[i].n_new;
    for (uint32_t i = 0; i < n_seqs; i++) {
        const vki_seq_info *s = &seqs[i];
        if (!s->n_new || s->n_new > s->n_ctx || (uint64_t)s->row0 + s->n_new > tokens)
            return VKI_ERR_INVALID_ARG;
        if (s->n_new == 1) {
            uint32_t s0, s1, w0;
            visible_keys(a, s->n_ctx, &s0, &s1, &w0);
            dec_keys += (s1 - s0) + (s->n_ctx - w0);
        }
        max_ctx = s->n_ctx > max_ctx ? s->n_ctx : max_ctx;
    }
    if (tokens >= UINT32_MAX)
        return VKI_ERR_INVALID_ARG;
    op_attn_plan p = {.n_tokens = (uint32_t)tokens};
    uint32_t c = pick_split(a, dec_keys);
    while (!count_items(a, seqs, n_seqs, c, cap, &p)) {
        if (c >= max_ctx)
            return VKI_ERR_INVALID_ARG; /* even one split per sequence does not fit cap */
        c = c > UINT32_MAX / 2 ? UINT32_MAX : 2 * c;
    }
    fill_items(a, seqs, n_seqs, &p, items);
    *plan = p;
    return VKI_OK;
}

static vki_status bad(vkd_cmd *c, const char *op)
{
    vkd_log(c->d, VKI_LOG_ERROR, "%s: operand shape does not fit its buffer", op);
    return VKI_ERR_INVALID_ARG;
}

static bool step_ok(const op_attn_step *st)
{
    const op_attn_plan *p = st->plan;
    return p && op_view_floats(st->items) >= 4ull * p->n_items && op_view_floats(st->tok_pos) >= p->n_tokens &&
           op_view_floats(st->tok_seq) >= p->n_tokens && st->seq_info.buf && st->page_table.buf;
}

/* A rotation the head can hold (or none), with its table. */
static bool rope_ok(const op_attn *a, const op_kv_rope *rope)
{
    return !rope || (rope->n_rot && rope->n_rot % 2 == 0 && rope->n_rot <= a->s.head_dim &&
                     op_view_floats(rope->freqs) >= 2ull * rope->n_rot);
}

vki_status op_kv_write(vkd_cmd *c, const op_attn *a, const op_attn_step *st, op_mat k, op_mat v,
                       vkd_view k_pool, vkd_view v_pool, const op_kv_rope *rope)
{
    uint32_t n = st->plan ? st->plan->n_tokens : 0, row = a->s.n_kv_heads * a->s.head_dim;
    if (!n)
        return VKI_OK;
    uint64_t page = op_kv_page_bytes(&a->s);
    if (!step_ok(st) || !op_mat_fits(k, n, row) || !op_mat_fits(v, n, row) || op_view_floats(k_pool) * 4 < page ||
        op_view_floats(v_pool) * 4 < page || !rope_ok(a, rope))
        return bad(c, "kv_write");
    vki_pc_kv_write pc = {.n_tokens = n, .n_kv_heads = a->s.n_kv_heads, .head_dim = a->s.head_dim,
                          .page_size = a->s.page_size, .k_off = k.off, .k_stride = k.stride,
                          .v_off = v.off, .v_stride = v.stride, .rope_n_rot = rope ? rope->n_rot : 0,
                          .rope_neox = rope && rope->neox};
    vkd_view b[9] = {k.v, v.v, st->tok_pos, st->tok_seq, st->seq_info, st->page_table, k_pool, v_pool,
                     rope ? rope->freqs : st->tok_pos};
    /* an invocation per 8-dim chunk (Q8_0: per pair of 32-value blocks) */
    uint64_t per_row = a->s.kv_type == VKI_GGML_Q8_0 ? a->s.n_kv_heads * VKI_KV_Q8_DW(a->s.head_dim) : row / 8;
    uint32_t groups = vkk_groups((uint64_t)n * per_row, KVW_WG);
    return vkk_dispatch(c, kid(a, VKK_KV_WRITE_F16), a->kvw_spec, b, 9, &pc, sizeof pc, groups < 65535 ? groups : 65535,
                        1, 1);
}

vki_status op_attention(vkd_cmd *c, const op_attn *a, const op_attn_step *st, op_mat q, op_mat out,
                        vkd_view k_pool, vkd_view v_pool, vkd_view scratch, const vkd_view *merge,
                        const op_attn_fresh *fresh, const vkd_view *sink_logits)
{
    const op_attn_plan *p = st->plan;
    uint32_t row = a->s.n_heads * a->s.head_dim, kvrow = a->s.n_kv_heads * a->s.head_dim;
    if (!p || !p->n_tokens)
        return VKI_OK;
    if (!step_ok(st) || !op_mat_fits(q, p->n_tokens, row) || !op_mat_fits(out, p->n_tokens, row) ||
        op_view_floats(scratch) * 4 < op_attn_scratch_bytes(a, p->n_slots) ||
        (merge && op_view_floats(*merge) * 4 < op_attn_merge_bytes(a, p->dec_off - p->red_off)))
        return bad(c, "attention");
    const op_kv_rope *rope = fresh ? fresh->rope : NULL;
    if (fresh && (!op_mat_fits(fresh->k, p->n_tokens, kvrow) || !op_mat_fits(fresh->v, p->n_tokens, kvrow) ||
                  !rope_ok(a, rope)))
        return bad(c, "attention");
    if (sink_logits && op_view_floats(*sink_logits) < a->s.n_heads)
        return bad(c, "attention (sink logits)");
    const vkd_view sl = sink_logits ? *sink_logits : q.v; /* any buffer without them */
    bool xq = fresh && fresh->xq.buf;
    if (xq && (a->s.head_dim % 32 || (p->n_red && !merge) ||
               op_view_floats(fresh->xq) < (uint64_t)VKI_XQ_WORDS((uint64_t)p->n_tokens, row)))
        return bad(c, "attention (int8 output)");
    if (fresh && p->n_pre) {
        vkd_log(c->d, VKI_LOG_ERROR, "attention: the newest keys from the projections in a step with prefill blocks");
        return VKI_ERR_INVALID_ARG;
    }
    const float log2e = 1.4426950408889634f;
    bool cap = a->s.softcap > 0;
    vki_pc_attn pc = {.n_heads = a->s.n_heads, .n_kv_heads = a->s.n_kv_heads, .head_dim = a->s.head_dim,
                      .page_size = a->s.page_size, .q_off = q.off, .q_stride = q.stride, .o_off = out.off,
                      .o_stride = out.stride, .q_scale = cap ? a->s.scale : a->s.scale * log2e,
                      .inv_softcap = cap ? 1.0f / a->s.softcap : 0.0f, .softcap_log2e = a->s.softcap * log2e,
                      .window = a->s.window, .sink = a->s.sink, .fresh = fresh != NULL,
                      .temp_scale = a->s.temp_scale, .temp_len = a->s.temp_len,
                      .k_off = fresh ? fresh->k.off : 0, .k_stride = fresh ? fresh->k.stride : 0,
                      .v_off = fresh ? fresh->v.off : 0, .v_stride = fresh ? fresh->v.stride : 0,
                      .rope_n_rot = rope ? rope->n_rot : 0, .rope_neox = rope && rope->neox,
                      .xq_rows = xq ? p->n_tokens : 0, .sink_logits = sink_logits != NULL};
    vki_status s = VKI_OK;
    /* decode splits: their number changes with the contexts, so the device reads it from item 0 */
    const uint32_t *mx = c->d->info.max_workgroup_count;
    if (p->n_dec > mx[0] || a->s.n_kv_heads * a->dec_nhb > mx[1]) {
        vkd_log(c->d, VKI_LOG_ERROR, "attention: %u decode splits of %u groups pass the device's group counts",
                p->n_dec, a->s.n_kv_heads * a->dec_nhb);
        return VKI_ERR_INVALID_ARG;
    }
    if (p->n_dec) {
        pc.gw = a->dec_gw, pc.n_hblocks = a->dec_nhb, pc.item_off = p->dec_off, pc.n_items = p->n_dec;
        pc.red_off = p->red_off, pc.merge = merge && p->n_red;
        vkd_view b[14] = {q.v, k_pool, v_pool, st->seq_info, st->page_table, st->items, out.v, scratch,
                          merge ? *merge : scratch, fresh ? fresh->k.v : q.v, fresh ? fresh->v.v : q.v,
                          rope ? rope->freqs : q.v, xq ? fresh->xq : out.v, sl};
        vkd_view args = {st->items.buf, st->items.offset, sizeof(VkDispatchIndirectCommand)};
        s = vkk_dispatch_indirect(c, kid(a, VKK_ATTN_DECODE_F16), a->dec_spec, b, 14, &pc, sizeof pc, args);
    }
    if (s == VKI_OK && p->n_pre) {
        pc.gw = a->pre_gw, pc.n_hblocks = a->pre_nhb, pc.item_off = 1, pc.n_items = p->n_pre;
        vkd_view b[8] = {q.v, k_pool, v_pool, st->seq_info, st->page_table, st->items, out.v, sl};
        s = vkk_dispatch(c, a->pre_kid, a->pre_spec, b, 8, &pc, sizeof pc, p->n_pre, a->s.n_kv_heads * a->pre_nhb, 1);
    }
    if (s == VKI_OK && p->n_red && !merge) {
        vkd_barrier(c); /* the decode partials */
        pc.item_off = p->red_off, pc.n_items = p->n_red;
        vkd_view b[5] = {scratch, st->items, st->seq_info, out.v, sl};
        s = vkk_dispatch(c, VKK_ATTN_REDUCE, a->red_spec, b, 5, &pc, sizeof pc, p->n_red, a->s.n_heads, 1);
    }
    return s;
}
