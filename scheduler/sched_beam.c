/* Beam groups in the scheduler (see sched.h, "Beam search").
 *
 * A request of width W is W sequences: the lead computes the prompt; the W - 1 followers are
 * allocated with it at sched_add (a tick allocates nothing), take slots and reservations when the
 * lead is admitted, and stay idle (no KV) until the owner's first reorder forks them from the
 * lead. All beams then have the same length, so every reorder keeps each beam's table size:
 * the full blocks of its parent are shared (reference counts), and of each parent's partial last
 * block one child keeps it and every other child gets a copy (a page copy in the next step).
 * Copies equal the partial blocks of parents without children, which are released first, so a
 * reorder never needs more blocks than the group had: the reservation made at admission
 * (every beam's whole table) stays enough under every policy, and the group is never paused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/sched_internal.h"

vki_status sched_validate_beams(const sched *s, uint32_t n_prompt, uint32_t max_new, uint32_t width, char *msg,
                                size_t msg_cap)
{
    if (sched_validate(s, n_prompt, max_new, msg, msg_cap) != VKI_OK)
        return VKI_ERR_INVALID_ARG;
    if (width <= 1)
        return VKI_OK;
    uint64_t need = (uint64_t)width * sched_blocks_for(s, (uint64_t)n_prompt + max_new - 1);
    if (width > s->max_running)
        snprintf(msg, msg_cap, "beam_width: %u beams exceed the %u sequences that may run at once", width,
                 s->max_running);
    else if (s->p.policy == VKI_POLICY_STATIC)
        snprintf(msg, msg_cap, "beam_width: beam search does not run under the STATIC policy");
    else if (s->p.kv_window)
        snprintf(msg, msg_cap, "beam_width: beam search does not run with a sliding window on every layer");
    else if (need > s->p.n_blocks)
        snprintf(msg, msg_cap, "beam_width: %u beams of n_prompt %u + max_new_tokens %u need %llu KV blocks, the pool "
                 "has %u", width, n_prompt, max_new, (unsigned long long)need, s->p.n_blocks);
    else
        return VKI_OK;
    return VKI_ERR_INVALID_ARG;
}

static void free_extras(sched_seq *lead)
{
    free(lead->beams);
    free(lead->beam_scratch);
    free(lead->beam_blocks);
    lead->beams = NULL;
    lead->beam_scratch = NULL;
    lead->beam_blocks = NULL;
}

vki_status sched_beam_create(sched *s, sched_seq *lead, uint32_t width, void *const *sink_ctx)
{
    uint32_t cap = lead->cap, nb = sched_blocks_for(s, cap);
    lead->beams = calloc(width, sizeof *lead->beams);
    lead->beam_scratch = malloc((size_t)width * cap * sizeof *lead->beam_scratch);
    lead->beam_blocks = malloc((size_t)width * nb * sizeof *lead->beam_blocks);
    if (!lead->beams || !lead->beam_scratch || !lead->beam_blocks) {
        free_extras(lead);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    lead->lead = lead;
    lead->beams[0] = lead;
    for (uint32_t b = 1; b < width; b++) {
        sched_seq *f = calloc(1, sizeof *f + (size_t)cap * sizeof(int32_t) + (size_t)nb * sizeof(uint32_t));
        if (!f) {
            for (uint32_t j = 1; j < b; j++)
                free(lead->beams[j]);
            free_extras(lead);
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        }
        *f = *lead; /* parameters, sampling, seed, user; then what is its own */
        f->tokens = (int32_t *)(f + 1);
        f->blocks = (uint32_t *)(f->tokens + cap);
        memcpy(f->tokens, lead->tokens, (size_t)lead->n_tokens * sizeof *f->tokens);
        f->beams = NULL;
        f->beam_scratch = NULL;
        f->beam_blocks = NULL;
        f->beam_idx = b;
        f->beam_idle = true;
        f->state = SCHED_QUEUED; /* parked: never in the queue, running with its lead */
        f->logits_hook = NULL;
        f->hidden_hook = NULL;
        f->logits_sink = sink_ctx ? lead->logits_sink : NULL; /* its own sampled rows (generation logits) */
        f->logits_sink_ctx = sink_ctx ? sink_ctx[b] : NULL;
        f->sink_rows_end = 0;
        lead->beams[b] = f;
    }
    return VKI_OK;
}

bool sched_beam_fits(const sched *s, const sched_seq *q, uint32_t taken_shared)
{
    uint32_t w = q->beam_width;
    if (s->n_running + w > s->max_running || s->n_free_slots < w)
        return false;
    uint64_t avail = sched_kv_avail(s->kv), res = 0;
    if (s->p.policy == VKI_POLICY_GUARANTEED_NO_EVICT) {
        res = sched_reserved_total(s);
    } else { /* MAX_UTILIZATION reserves for beam groups only: the others can be paused */
        for (const sched_seq *r = s->run_head; r; r = r->run_next)
            if (r->lead)
                res += r->need_total - sched_live_blocks(r);
    }
    uint64_t need = (uint64_t)w * q->need_total - taken_shared;
    return avail >= res && need <= avail - res;
}

void sched_beam_admit(sched *s, sched_seq *lead)
{
    for (uint32_t b = 1; b < lead->beam_width; b++) {
        sched_seq *f = lead->beams[b];
        f->slot = s->free_slots[--s->n_free_slots];
        f->state = SCHED_RUNNING;
        f->beam_idle = true;
        f->n_held = f->n_sealed = f->n_computed = f->ctx_end = f->n_new = 0;
        f->admitted_once = true;
        sched_run_append(s, f);
        s->reserved += f->need_total;
    }
}

/* Drops pending copies into q's last block (q leaves before the step that would run them). */
static void purge_copies(sched *s, const sched_seq *q)
{
    if (!q->n_held)
        return;
    uint32_t last = q->blocks[q->n_held - 1], k = 0;
    for (uint32_t i = 0; i < s->n_copies; i++)
        if (s->copies[i].dst != last)
            s->copies[k++] = s->copies[i];
    s->n_copies = k;
}

void sched_beam_remove(sched *s, sched_seq *lead)
{
    for (uint32_t b = lead->beam_width; b-- > 1;) {
        sched_seq *f = lead->beams[b];
        if (f->state == SCHED_RUNNING) {
            purge_copies(s, f);
            sched_drop_running(s, f);
        }
        free(f);
    }
    if (lead->state == SCHED_RUNNING)
        purge_copies(s, lead);
    free_extras(lead);
}

void sched_beam_free_parked(sched_seq *lead)
{
    if (!lead->beams)
        return;
    for (uint32_t b = 1; b < lead->beam_width; b++)
        if (lead->beams[b]->state != SCHED_RUNNING)
            free(lead->beams[b]);
    free_extras(lead);
}

/* The child of each parent that keeps its partial block: the parent itself when it is its own
 * parent, else its first child. keeper[p] = UINT32_MAX: p has no child. */
static void pick_keepers(uint32_t w, const uint32_t *parent, uint32_t *keeper)
{
    for (uint32_t p = 0; p < w; p++)
        keeper[p] = UINT32_MAX;
    for (uint32_t b = 0; b < w; b++)
        if (parent[b] == b)
            keeper[b] = b;
    for (uint32_t b = 0; b < w; b++)
        if (keeper[parent[b]] == UINT32_MAX)
            keeper[parent[b]] = b;
}

static uint32_t count_keepers(uint32_t w, const uint32_t *keeper)
{
    uint32_t n = 0;
    for (uint32_t p = 0; p < w; p++)
        n += keeper[p] != UINT32_MAX;
    return n;
}

/* Blocks for n copies. The group's reservation covers them, but MAX_UTILIZATION lets other
 * requests use reserved blocks meanwhile: it pauses them (newest first, never a beam group) as it
 * does when a step is short. O(paused). */
static bool room_for_copies(sched *s, const sched_seq *lead, uint32_t n)
{
    while (sched_kv_avail(s->kv) < n) {
        sched_seq *victim = s->run_tail;
        while (victim && victim->lead)
            victim = victim->run_prev;
        if (s->p.policy != VKI_POLICY_MAX_UTILIZATION || !victim)
            return false;
        sched_pause_seq(s, victim);
    }
    (void)lead;
    return true;
}

static vki_status check_reorder(const sched_seq *lead, const uint32_t *parent)
{
    if (!lead->beams || lead->state != SCHED_RUNNING || lead->n_computed + 1 != lead->n_tokens ||
        lead->n_computed < lead->ctx_end)
        return VKI_ERR_INVALID_ARG;
    for (uint32_t b = 0; b < lead->beam_width; b++) {
        const sched_seq *q = lead->beams[b];
        if (parent[b] >= lead->beam_width || lead->beams[parent[b]]->beam_idle)
            return VKI_ERR_INVALID_ARG;
        if (!q->beam_idle && (q->n_tokens != lead->n_tokens || q->n_held != lead->n_held))
            return VKI_ERR_INVALID_ARG;
    }
    return VKI_OK;
}

vki_status sched_beam_reorder(sched *s, sched_seq *lead, const uint32_t *parent, const int32_t *token)
{
    vki_status st = check_reorder(lead, parent);
    if (st != VKI_OK)
        return st;
    uint32_t w = lead->beam_width, L = lead->n_tokens, cap = lead->cap, mb = sched_blocks_for(s, cap);
    uint32_t nb = lead->n_held, nfull = (L - 1) / s->p.block_size;
    bool partial = nb > nfull;
    uint32_t keeper[w], sealed[w];
    sched_seq **B = lead->beams;
    for (uint32_t b = 0; b < w; b++) { /* snapshot: a parent may be rewritten before its children read it */
        if (B[b]->beam_idle)
            continue;
        memcpy(lead->beam_scratch + (size_t)b * cap, B[b]->tokens, (size_t)L * sizeof(int32_t));
        memcpy(lead->beam_blocks + (size_t)b * mb, B[b]->blocks, (size_t)nb * sizeof(uint32_t));
        sealed[b] = B[b]->n_sealed;
    }
    pick_keepers(w, parent, keeper);
    /* the new tables' references first, then the old ones go: shared blocks never reach 0 */
    for (uint32_t b = 0; b < w; b++) {
        const uint32_t *pt = lead->beam_blocks + (size_t)parent[b] * mb;
        sched_kv_retain(s->kv, pt, nfull);
        if (partial && keeper[parent[b]] == b)
            sched_kv_retain(s->kv, pt + nfull, 1);
    }
    for (uint32_t b = 0; b < w; b++) {
        sched_kv_release(s->kv, B[b]->blocks, B[b]->n_held);
        s->reserved += B[b]->n_held; /* live blocks: no windows with beams */
        s->reserved -= nb;
    }
    if (partial && !room_for_copies(s, lead, w - count_keepers(w, keeper)))
        return VKI_ERR_INTERNAL;
    for (uint32_t b = 0; b < w; b++) {
        sched_seq *q = B[b];
        uint32_t p = parent[b];
        const uint32_t *pt = lead->beam_blocks + (size_t)p * mb;
        memcpy(q->blocks, pt, (size_t)nfull * sizeof *q->blocks);
        if (partial && keeper[p] == b) {
            q->blocks[nfull] = pt[nfull];
        } else if (partial) { /* released partial blocks of childless parents cover these */
            uint32_t d = sched_kv_alloc(s->kv);
            if (d == SCHED_KV_NONE || s->n_copies >= s->p.max_seqs)
                return VKI_ERR_INTERNAL;
            q->blocks[nfull] = d;
            s->copies[s->n_copies++] = (vki_page_copy){.src = pt[nfull], .dst = d};
        }
        q->n_held = nb;
        q->n_sealed = sealed[p];
        q->n_computed = L - 1;
        q->ctx_end = lead->ctx_end;
        memcpy(q->tokens, lead->beam_scratch + (size_t)p * cap, (size_t)(L - 1) * sizeof *q->tokens);
        q->tokens[L - 1] = token[b];
        q->n_tokens = L;
        q->beam_idle = false;
    }
    return VKI_OK;
}

#define CHECK(cond, ...)                                                                         \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            snprintf(msg, msg_cap, __VA_ARGS__);                                                 \
            return VKI_ERR_INTERNAL;                                                             \
        }                                                                                        \
    } while (0)

vki_status sched_beam_check(const sched *s, const sched_seq *lead, char *msg, size_t msg_cap)
{
    (void)s;
    CHECK(lead->lead == lead && lead->beams[0] == lead && lead->beam_width > 1, "beam lead %llu corrupt",
          (unsigned long long)lead->order);
    for (uint32_t b = 1; b < lead->beam_width; b++) {
        const sched_seq *f = lead->beams[b];
        CHECK(f->lead == lead && f->beam_idx == b && f->state == SCHED_RUNNING,
              "beam %u of sequence %llu: not running with its lead", b, (unsigned long long)lead->order);
        if (f->beam_idle) {
            CHECK(f->n_held == 0 && f->n_computed == 0 && !f->n_new, "idle beam %u of sequence %llu holds KV", b,
                  (unsigned long long)lead->order);
            continue;
        }
        CHECK(f->n_tokens == lead->n_tokens && f->n_computed == lead->n_computed && f->n_held == lead->n_held &&
              f->n_new == lead->n_new, "beam %u of sequence %llu: %u tokens, %u computed, %u blocks, lead %u/%u/%u", b,
              (unsigned long long)lead->order, f->n_tokens, f->n_computed, f->n_held, lead->n_tokens,
              lead->n_computed, lead->n_held);
    }
    return VKI_OK;
}
