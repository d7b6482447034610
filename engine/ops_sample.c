/* Recording of the sampling stage and the sampler object that owns its small buffers. */
#include "engine/ops_sample.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct op_sampler {
    vkd_device *d;
    uint32_t max_rows, n_vocab;
    uint32_t n_rows;         /* rows packed by the last successful pack */
    uint32_t cap_edits;      /* entries of edits / saved / h_edits */
    vkd_buffer *rows;        /* host-visible vki_sample_row [max_rows] */
    vkd_buffer *out;         /* host-visible vki_sample_out [max_rows] */
    vkd_buffer *edits;       /* host-visible vki_sample_edit [cap_edits] */
    vkd_buffer *saved;       /* device f32 [cap_edits] */
    vki_sample_edit *h_edits;/* [cap_edits] packing area in cached host memory (it is sorted) */
    sample_req *reqs;        /* [max_rows] pack_plan's requests */
    const uint32_t **masks;  /* [max_rows] the masked rows' masks (not owned), in pack order */
    uint32_t n_masked;
};

/* Shared memory of sample.comp: histograms (3 KiB), the candidate list (8 KiB), 16 bytes per
 * invocation and ~0.6 KiB of scalars. */
static uint32_t shared_bytes(uint32_t wg) { return 3072 + 8192 + 16 * wg + 640; }

/* About 32 ids per invocation: the chunked passes' serial tails (one owner scans its chunk) stay
 * short, and a 32k vocabulary gets 1024 invocations (32 warps to hide memory latency on NVIDIA).
 * Small vocabularies use fewer invocations so the barriers cost less. CPU devices (lavapipe) run
 * a workgroup's invocations on one thread, where every barrier and every "all threads read the
 * subgroup partials" loop costs in proportion to the invocations: 64 there (measured: a greedy
 * 64 x 32k call takes 10 ms at 64 invocations, 98 ms at 1024). */
uint32_t op_sample_wg(const vkd_device *d, uint32_t n_vocab)
{
    uint32_t wg = 64;
    while (d->info.type != VKI_DEVICE_CPU && wg < 1024 && (uint64_t)wg * 32 < n_vocab && 2 * wg <= d->info.max_workgroup_invocations &&
           shared_bytes(2 * wg) <= d->info.max_compute_shared_memory)
        wg *= 2;
    return wg;
}

/* sample.comp's specialisation {WG, SU}. SU: logits each invocation loads before using them. A
 * row is one workgroup's, so at batch 1 one SM reads the whole vocabulary and the loads in flight
 * set the pace (1024 invocations x 1 x 4 bytes per round trip: ~7 GB/s on an H200, a 128k row
 * ~70 us per pass); 8 on GPUs. CPU devices run the invocations one after another anyway: 1 (8
 * measured 1.2-1.5x slower on lavapipe). */
static void sample_spec(const vkd_device *d, uint32_t n_vocab, uint32_t spec[2])
{
    spec[0] = op_sample_wg(d, n_vocab);
    spec[1] = d->sample_loads ? d->sample_loads : d->info.type == VKI_DEVICE_CPU ? 1 : 8;
}

static vki_status check_args(vkd_device *d, const op_sample_args *a, VkDeviceSize *row_bytes, uint32_t *per)
{
    VkDeviceSize vocab_bytes = (VkDeviceSize)a->n_vocab * 4, rb = (VkDeviceSize)a->row_stride * 4;
    VkDeviceSize maxr = d->info.max_storage_buffer_range, align = d->info.min_storage_buffer_offset_alignment;
    VkDeviceSize have = !a->logits.buf ? 0
                        : a->logits.range == VK_WHOLE_SIZE ? a->logits.buf->size - a->logits.offset
                                                           : a->logits.range;
    if (a->n_vocab == 0 || a->n_vocab > SAMPLE_MAX_VOCAB || a->row_stride < a->n_vocab || vocab_bytes > maxr ||
        (VkDeviceSize)(a->n_rows - 1) * rb + vocab_bytes > have) {
        vkd_log(d, VKI_LOG_ERROR, "sample: %u rows of %u logits (stride %u) do not fit the logits view or the "
                "vocabulary limit (1..%u)", a->n_rows, a->n_vocab, a->row_stride, SAMPLE_MAX_VOCAB);
        return VKI_ERR_INVALID_ARG;
    }
    /* rows per dispatch: the binding fits maxStorageBufferRange and each dispatch's view starts
     * on the offset alignment */
    VkDeviceSize p = (maxr - vocab_bytes) / rb + 1;
    if (p > d->info.max_workgroup_count[0])
        p = d->info.max_workgroup_count[0];
    while (p > 1 && (p * rb) % (align ? align : 1))
        p--;
    *row_bytes = rb;
    *per = (uint32_t)p;
    return VKI_OK;
}

vki_status op_sample(vkd_cmd *c, const op_sample_args *a)
{
    if (!a->n_rows)
        return VKI_OK;
    VkDeviceSize rb;
    uint32_t per, spec[2];
    sample_spec(c->d, a->n_vocab, spec);
    vki_status st = check_args(c->d, a, &rb, &per);
    for (uint32_t r0 = 0; st == VKI_OK && r0 < a->n_rows; r0 += per) {
        uint32_t n = a->n_rows - r0 < per ? a->n_rows - r0 : per;
        vkd_view lv = {a->logits.buf, a->logits.offset + r0 * rb, (n - 1) * rb + (VkDeviceSize)a->n_vocab * 4};
        vkd_view b[6] = {lv, a->rows, a->edits, a->saved, a->out, a->masks.buf ? a->masks : a->rows};
        vki_pc_sample pc = {.n_vocab = a->n_vocab, .row_stride = a->row_stride, .row0 = r0};
        st = vkk_dispatch(c, VKK_SAMPLE, spec, b, 6, &pc, sizeof pc, n, 1, 1);
    }
    if (st != VKI_OK)
        return st;
    vkd_barrier_compute_to_host(c);
    return VKI_OK;
}

/* ---- the sampler object ----------------------------------------------------------------------- */

/* Replaces the edit buffers by ones of `cap` entries; on failure the old ones stay. */
static vki_status grow_edits(op_sampler *s, uint32_t cap)
{
    vkd_buffer *e = NULL, *sv = NULL;
    vki_sample_edit *h = malloc((size_t)cap * sizeof *h);
    vki_status st = h ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK)
        st = vkd_buffer_create(s->d, (VkDeviceSize)cap * sizeof *h, VKD_MEM_HOST, "sample edits", &e);
    if (st == VKI_OK)
        st = vkd_buffer_create(s->d, (VkDeviceSize)cap * 4, VKD_MEM_DEVICE, "sample saved logits", &sv);
    if (st != VKI_OK) {
        free(h);
        vkd_buffer_destroy(s->d, e);
        return st;
    }
    free(s->h_edits);
    vkd_buffer_destroy(s->d, s->edits);
    vkd_buffer_destroy(s->d, s->saved);
    s->h_edits = h;
    s->edits = e;
    s->saved = sv;
    s->cap_edits = cap;
    return VKI_OK;
}

vki_status op_sampler_create(vkd_device *d, uint32_t max_rows, uint32_t n_vocab, op_sampler **out)
{
    *out = NULL;
    if (!max_rows || !n_vocab || n_vocab > SAMPLE_MAX_VOCAB || max_rows > (1u << 20))
        return VKI_ERR_INVALID_ARG;
    op_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    s->d = d;
    s->max_rows = max_rows;
    s->n_vocab = n_vocab;
    s->reqs = calloc(max_rows, sizeof *s->reqs);
    s->masks = calloc(max_rows, sizeof *s->masks);
    vki_status st = s->reqs && s->masks ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK)
        st = vkd_buffer_create(d, (VkDeviceSize)max_rows * sizeof(vki_sample_row), VKD_MEM_HOST, "sample rows",
                               &s->rows);
    if (st == VKI_OK)
        st = vkd_buffer_create(d, (VkDeviceSize)max_rows * sizeof(vki_sample_out), VKD_MEM_HOST, "sample out",
                               &s->out);
    if (st == VKI_OK)
        st = grow_edits(s, 256 + 64 * max_rows);
    if (st != VKI_OK) {
        op_sampler_destroy(s);
        return st;
    }
    *out = s;
    return VKI_OK;
}

vki_status op_sampler_prepare(op_sampler *s)
{
    uint32_t spec[2];
    sample_spec(s->d, s->n_vocab, spec);
    return vkk_prepare(s->d, VKK_SAMPLE, spec);
}

void op_sampler_destroy(op_sampler *s)
{
    if (!s)
        return;
    vkd_buffer_destroy(s->d, s->rows);
    vkd_buffer_destroy(s->d, s->out);
    vkd_buffer_destroy(s->d, s->edits);
    vkd_buffer_destroy(s->d, s->saved);
    free(s->h_edits);
    free(s->reqs);
    free(s->masks);
    free(s);
}

vki_status op_sampler_pack(op_sampler *s, const sample_req *reqs, uint32_t n_rows, char *err, size_t n_err)
{
    s->n_rows = 0;
    s->n_masked = 0;
    if (n_rows > s->max_rows) {
        snprintf(err, n_err, "%u rows to sample, the sampler holds %u", n_rows, s->max_rows);
        return VKI_ERR_INVALID_ARG;
    }
    uint64_t need = 0;
    uint32_t base = 0; /* the pending entries' region: entry i for row i */
    for (uint32_t i = 0; i < n_rows; i++) {
        need += sample_edits_bound(&reqs[i]);
        base = sample_req_pends(&reqs[i]) ? n_rows : base;
    }
    need += base;
    if (need > (1u << 26)) {
        snprintf(err, n_err, "%llu penalty-window and bias entries in one step (limit %u)",
                 (unsigned long long)need, 1u << 26);
        return VKI_ERR_INVALID_ARG;
    }
    if (need > s->cap_edits) {
        vki_status st = grow_edits(s, need > 2ull * s->cap_edits ? (uint32_t)need : 2 * s->cap_edits);
        if (st != VKI_OK)
            return st;
    }
    vki_sample_row *rows = s->rows->mapped;
    uint32_t used = base, words = (s->n_vocab + 31) / 32, masked = 0;
    for (uint32_t i = 0; i < base; i++)
        s->h_edits[i] = (vki_sample_edit){-1, 0, 0.0f};
    for (uint32_t i = 0; i < n_rows; i++) {
        char msg[200];
        uint32_t n = 0;
        vki_status st = sample_pack_row(&reqs[i], s->n_vocab, used, masked * words, &rows[i], s->h_edits + used,
                                        s->cap_edits - used, &n, msg, sizeof msg);
        if (st != VKI_OK) {
            snprintf(err, n_err, "row %u: %s", i, msg);
            return st;
        }
        if (reqs[i].mask)
            s->masks[masked++] = reqs[i].mask;
        if (rows[i].flags & VKI_SAMPLE_PENDING) { /* packed last: moved to its place */
            s->h_edits[i] = s->h_edits[used + --n];
            rows[i].pend = i;
        }
        used += n;
    }
    s->n_masked = masked;
    memcpy(s->edits->mapped, s->h_edits, (size_t)used * sizeof *s->h_edits);
    s->n_rows = n_rows;
    return VKI_OK;
}

vki_status op_sampler_pack_plan(op_sampler *s, const vki_step_plan *plan, char *err, size_t n_err)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *q = &plan->seqs[i];
        if (!q->want_token)
            continue;
        if (n == s->max_rows) {
            s->n_rows = 0;
            snprintf(err, n_err, "more than %u sequences want a token", s->max_rows);
            return VKI_ERR_INVALID_ARG;
        }
        bool prev = q->n_new == 1 && q->tokens[0] == VKI_TOKEN_PREV;
        s->reqs[n++] = (sample_req){q->sampling, q->seed, q->pos0 + q->n_new, q->history, q->n_history, q->token_mask,
                                    .pending = prev, .pending_token = -1};
    }
    return op_sampler_pack(s, s->reqs, n, err, n_err);
}

size_t op_sampler_mask_bytes(const op_sampler *s) { return (size_t)s->n_masked * ((s->n_vocab + 31) / 32) * 4; }

void op_sampler_copy_masks(const op_sampler *s, void *dst)
{
    size_t bytes = (size_t)((s->n_vocab + 31) / 32) * 4;
    for (uint32_t k = 0; k < s->n_masked; k++)
        memcpy((char *)dst + k * bytes, s->masks[k], bytes);
}

vki_status op_sampler_repoint_masks(op_sampler *s, const vki_step_plan *plan)
{
    uint32_t n = 0, k = 0;
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *q = &plan->seqs[i];
        if (q->want_token && (n++ >= s->n_rows || (q->token_mask != NULL) != (s->reqs[n - 1].mask != NULL)))
            return VKI_ERR_INVALID_ARG;
    }
    if (n != s->n_rows)
        return VKI_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < plan->n_seqs; i++)
        if (plan->seqs[i].want_token && plan->seqs[i].token_mask)
            s->masks[k++] = plan->seqs[i].token_mask;
    return VKI_OK;
}

vki_status op_sampler_record(op_sampler *s, vkd_cmd *c, vkd_view logits, uint32_t row_stride, vkd_view masks)
{
    op_sample_args a = {.logits = logits, .row_stride = row_stride, .n_rows = s->n_rows, .n_vocab = s->n_vocab,
                        .rows = vkd_whole(s->rows), .edits = vkd_whole(s->edits), .saved = vkd_whole(s->saved),
                        .out = vkd_whole(s->out), .masks = s->n_masked ? masks : (vkd_view){0}};
    return op_sample(c, &a);
}

const vki_sample_out *op_sampler_out(const op_sampler *s) { return s->out->mapped; }

void op_sampler_read(const op_sampler *s, const uint32_t *slots, vki_step_out *outs)
{
    const vki_sample_out *o = op_sampler_out(s);
    for (uint32_t n = 0; n < s->n_rows; n++) {
        vki_step_out *t = &outs[n];
        t->slot = slots[n];
        t->token = o[n].token;
        t->logprob = o[n].logprob;
        t->nonfinite = o[n].nonfinite != 0;
        t->n_top = o[n].n_top < VKI_MAX_TOP_LOGPROBS ? o[n].n_top : VKI_MAX_TOP_LOGPROBS;
        memcpy(t->top_tokens, o[n].top_tokens, t->n_top * sizeof *t->top_tokens);
        memcpy(t->top_logprobs, o[n].top_logprobs, t->n_top * sizeof *t->top_logprobs);
    }
}

vkd_view op_sampler_token_view(const op_sampler *s, uint32_t row)
{
    return (vkd_view){s->out, (VkDeviceSize)row * sizeof(vki_sample_out) + offsetof(vki_sample_out, token), 4};
}

vkd_view op_sampler_pending_view(const op_sampler *s, uint32_t row)
{
    const vki_sample_row *r = s->rows->mapped;
    if (row >= s->n_rows || !(r[row].flags & VKI_SAMPLE_PENDING))
        return (vkd_view){0};
    return (vkd_view){s->edits, (VkDeviceSize)r[row].pend * sizeof(vki_sample_edit) + offsetof(vki_sample_edit, token), 4};
}

int32_t op_sampler_pending_token(const op_sampler *s, uint32_t row)
{
    vkd_view v = op_sampler_pending_view(s, row);
    return v.buf ? ((const vki_sample_edit *)s->edits->mapped)[v.offset / sizeof(vki_sample_edit)].token : -1;
}
