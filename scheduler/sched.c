/* The scheduler (see sched.h). Data structures and what they cost:
 *  - the wait queue is a binary heap ordered (paused first, priority desc, arrival asc):
 *    push/pop/remove O(log queue);
 *  - running sequences are a doubly linked list in admission order: the policy pauses from its
 *    tail (most recently started) in O(1);
 *  - free backend slots are a stack: O(1);
 *  - `reserved` = sum over running sequences of the blocks they may still allocate
 *    (need_total - n_held), kept incrementally, so GUARANTEED_NO_EVICT admission is O(1)
 *    instead of a walk over the running set. */
#include "scheduler/sched.h"
#include "scheduler/sched_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


uint32_t sched_blocks_for(const sched *s, uint64_t n_tokens)
{
    return (uint32_t)((n_tokens + s->p.block_size - 1) / s->p.block_size);
}

static uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

_Static_assert(SCHED_KV_NONE == VKI_PAGE_NONE, "a released table entry is the engine's released page");

/* Blocks a sequence of `cap` tokens may hold at once. Without windows: the KV of cap - 1 tokens.
 * With windows, during a step of n <= min(chunk, budget) new tokens from position c it holds the
 * sink's blocks and those from the first block its window sees (or the last sealed one, the next
 * seal's parent) up to c + n: at most ceil((n + window - 1) / B) + 2 of them (misalignment at
 * both ends). O(1). */
static uint32_t seq_need(const sched *s, uint64_t cap)
{
    uint32_t all = sched_blocks_for(s, cap - 1);
    if (!s->p.kv_window)
        return all;
    uint64_t n = min_u32(s->p.chunk_size, s->p.max_num_tokens);
    uint64_t win = s->sink_blocks + sched_blocks_for(s, n + s->p.kv_window - 1) + 2ull;
    return win < all ? (uint32_t)win : all;
}

uint32_t sched_live_blocks(const sched_seq *q) { return q->n_held - q->n_dropped; }

/* What GUARANTEED_NO_EVICT and STATIC keep allocatable: every running sequence's way to its
 * peak, plus with windows one block per reference beyond the first of a shared block (released
 * mid-run, it stays in use by the others while its releaser may grow again). O(1). */
uint64_t sched_reserved_total(const sched *s)
{
    return s->reserved + (s->p.kv_window ? sched_kv_shared(s->kv) : 0);
}

/* Releases the blocks of q's table no query of it will see again: wholly before the window of
 * its next position (n_computed) and past the sink; with reuse the last sealed block stays (it
 * is the parent the next seal links to). O(blocks released). */
static void drop_out_of_window(sched *s, sched_seq *q)
{
    if (!s->p.kv_window)
        return;
    uint64_t lo = (uint64_t)q->n_computed + 1 > s->p.kv_window ? (uint64_t)q->n_computed + 1 - s->p.kv_window : 0;
    uint64_t limit = lo / s->p.block_size;
    if (s->p.block_reuse && limit + 1 > q->n_sealed)
        limit = q->n_sealed ? q->n_sealed - 1 : 0;
    for (; q->drop_next < limit && q->drop_next < q->n_held; q->drop_next++) {
        sched_kv_release(s->kv, &q->blocks[q->drop_next], 1);
        q->blocks[q->drop_next] = SCHED_KV_NONE;
        q->n_dropped++;
        s->reserved++; /* need_total - live grew by one */
    }
}

static bool in_context(const sched_seq *q) { return q->n_computed < q->ctx_end; }

/* ---- wait queue (binary heap) ------------------------------------------------------------- */

static bool runs_before(const sched_seq *a, const sched_seq *b)
{
    if (a->paused != b->paused)
        return a->paused; /* a paused sequence goes back to the front */
    if (a->priority != b->priority)
        return a->priority > b->priority;
    return a->order < b->order;
}

static void heap_set(sched *s, uint32_t i, sched_seq *q)
{
    s->heap[i] = q;
    q->heap_idx = i;
}

static void heap_up(sched *s, uint32_t i)
{
    sched_seq *q = s->heap[i];
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!runs_before(q, s->heap[parent]))
            break;
        heap_set(s, i, s->heap[parent]);
        i = parent;
    }
    heap_set(s, i, q);
}

static void heap_down(sched *s, uint32_t i)
{
    sched_seq *q = s->heap[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= s->n_heap)
            break;
        if (c + 1 < s->n_heap && runs_before(s->heap[c + 1], s->heap[c]))
            c++;
        if (!runs_before(s->heap[c], q))
            break;
        heap_set(s, i, s->heap[c]);
        i = c;
    }
    heap_set(s, i, q);
}

static vki_status heap_reserve(sched *s, uint32_t n)
{
    if (n <= s->heap_cap)
        return VKI_OK;
    uint32_t cap = s->heap_cap ? s->heap_cap : 16;
    while (cap < n) {
        if (cap > UINT32_MAX / 2)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        cap *= 2;
    }
    sched_seq **h = realloc(s->heap, (size_t)cap * sizeof *h);
    if (!h)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    s->heap = h;
    s->heap_cap = cap;
    return VKI_OK;
}

/* The heap has room: sched_add reserves one entry per sequence it creates, so re-queueing a
 * paused sequence never allocates. */
static void heap_push(sched *s, sched_seq *q)
{
    q->state = SCHED_QUEUED;
    heap_set(s, s->n_heap++, q);
    heap_up(s, q->heap_idx);
}

static void heap_remove(sched *s, sched_seq *q)
{
    uint32_t i = q->heap_idx;
    sched_seq *last = s->heap[--s->n_heap];
    if (last != q) {
        heap_set(s, i, last);
        heap_up(s, i);
        heap_down(s, last->heap_idx);
    }
}

/* ---- running list ------------------------------------------------------------------------- */

void sched_run_append(sched *s, sched_seq *q)
{
    q->run_prev = s->run_tail;
    q->run_next = NULL;
    if (s->run_tail)
        s->run_tail->run_next = q;
    else
        s->run_head = q;
    s->run_tail = q;
    s->n_running++;
}

static void run_unlink(sched *s, sched_seq *q)
{
    if (q->run_prev)
        q->run_prev->run_next = q->run_next;
    else
        s->run_head = q->run_next;
    if (q->run_next)
        q->run_next->run_prev = q->run_prev;
    else
        s->run_tail = q->run_prev;
    q->run_prev = q->run_next = NULL;
    s->n_running--;
}

/* Returns a running sequence's blocks (sealed ones stay cached) and slot. O(blocks held). */
void sched_drop_running(sched *s, sched_seq *q)
{
    /* the live entries: [0, n_held), or with released ones in the middle the window's part and
     * then the sink's (each call releases its deepest block first) */
    uint32_t from = q->n_dropped ? q->drop_next : 0;
    sched_kv_release(s->kv, q->blocks + from, q->n_held - from);
    if (q->n_dropped)
        sched_kv_release(s->kv, q->blocks, min_u32(s->sink_blocks, q->n_held));
    s->reserved -= q->need_total - sched_live_blocks(q);
    q->n_held = q->n_sealed = q->n_computed = q->n_dropped = 0;
    q->n_new = 0;
    s->free_slots[s->n_free_slots++] = q->slot;
    q->slot = UINT32_MAX;
    run_unlink(s, q);
}

/* MAX_UTILIZATION: the sequence loses its KV and slot and waits at the front of the queue. Its
 * tokens stay, so resuming recomputes them (cached full blocks are picked up again). */
void sched_pause_seq(sched *s, sched_seq *q)
{
    if (q->n_new && !in_context(q))
        s->tick_decode--;
    sched_drop_running(s, q);
    q->paused = true;
    q->n_pauses++;
    heap_push(s, q);
    s->n_paused_waiting++;
    s->tick_paused++;
    s->pauses++;
}

/* Grows q's block table to cover `n_tokens` positions. False when the pool is short. */
static bool grow_blocks(sched *s, sched_seq *q, uint32_t n_tokens)
{
    uint32_t want = sched_blocks_for(s, n_tokens);
    while (q->n_held < want) {
        uint32_t b = sched_kv_alloc(s->kv);
        if (b == SCHED_KV_NONE)
            return false;
        q->blocks[q->n_held++] = b;
        s->reserved--;
    }
    return true;
}

bool sched_grow_ahead(sched *s, sched_seq *q, uint32_t n_tokens)
{
    uint32_t want = sched_blocks_for(s, n_tokens);
    if (q->state != SCHED_RUNNING || want <= q->n_held)
        return q->state == SCHED_RUNNING;
    if (sched_live_blocks(q) + (want - q->n_held) > q->need_total || sched_kv_avail(s->kv) < want - q->n_held)
        return false;
    return grow_blocks(s, q, n_tokens);
}

/* ---- create / add / remove ---------------------------------------------------------------- */

vki_status sched_create(const sched_params *p, sched **out)
{
    *out = NULL;
    if (!p->max_seqs || !p->n_blocks || !p->block_size || !p->max_ctx || !p->max_num_tokens ||
        !p->chunk_size || p->chunk_size % p->block_size || p->max_seqs == UINT32_MAX ||
        (unsigned)p->policy > VKI_POLICY_STATIC)
        return VKI_ERR_INVALID_ARG;
    sched *s = calloc(1, sizeof *s);
    if (!s)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    s->p = *p;
    s->max_running = p->max_batch_size ? min_u32(p->max_seqs, p->max_batch_size) : p->max_seqs;
    s->max_seq_blocks = sched_blocks_for(s, p->max_ctx);
    s->sink_blocks = p->kv_window ? sched_blocks_for(s, p->kv_sink) : 0;
    vki_status st = sched_kv_create(p->n_blocks, p->block_size, p->block_reuse, &s->kv);
    if (st != VKI_OK) {
        free(s);
        return st;
    }
    if (p->kv_window)
        sched_kv_set_windowed(s->kv);
    s->free_slots = malloc((size_t)p->max_seqs * sizeof *s->free_slots);
    s->plan_seqs = calloc(s->max_running, sizeof *s->plan_seqs);
    s->plan_ptrs = calloc(s->max_running, sizeof *s->plan_ptrs);
    s->match = malloc((size_t)s->max_seq_blocks * sizeof *s->match);
    s->copies = malloc((size_t)p->max_seqs * sizeof *s->copies);
    if (!s->free_slots || !s->plan_seqs || !s->plan_ptrs || !s->match || !s->copies) {
        sched_destroy(s);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    for (uint32_t i = 0; i < p->max_seqs; i++) /* slot 0 on top */
        s->free_slots[i] = p->max_seqs - 1 - i;
    s->n_free_slots = p->max_seqs;
    *out = s;
    return VKI_OK;
}

void sched_destroy(sched *s)
{
    if (!s)
        return;
    for (sched_seq *q = s->run_head, *n; q; q = n) {
        n = q->run_next;
        sched_beam_free_parked(q); /* its running followers are in this list too */
        free(q);
    }
    for (uint32_t i = 0; i < s->n_heap; i++) {
        sched_beam_free_parked(s->heap[i]);
        free(s->heap[i]);
    }
    sched_kv_destroy(s->kv);
    free(s->pin_ref);
    free(s->heap);
    free(s->free_slots);
    free(s->plan_seqs);
    free(s->plan_ptrs);
    free(s->match);
    free(s->copies);
    free(s);
}

vki_status sched_validate(const sched *s, uint32_t n_prompt, uint32_t max_new, char *msg, size_t msg_cap)
{
    uint64_t cap = (uint64_t)n_prompt + max_new;
    if (n_prompt == 0) {
        snprintf(msg, msg_cap, "prompt: empty (n_prompt is 0)");
    } else if (max_new == 0) {
        snprintf(msg, msg_cap, "max_new_tokens: must be >= 1");
    } else if (cap > s->p.max_ctx) {
        snprintf(msg, msg_cap, "max_new_tokens: n_prompt %u + max_new_tokens %u exceeds the model context %u",
                 n_prompt, max_new, s->p.max_ctx);
    } else if (seq_need(s, cap) > s->p.n_blocks) {
        snprintf(msg, msg_cap, "max_new_tokens: n_prompt %u + max_new_tokens %u needs %u KV blocks, the pool has %u",
                 n_prompt, max_new, seq_need(s, cap), s->p.n_blocks);
    } else {
        return VKI_OK;
    }
    return VKI_ERR_INVALID_ARG;
}

vki_status sched_add(sched *s, const sched_add_args *a, sched_seq **out)
{
    char msg[160];
    *out = NULL;
    uint32_t width = a->beam_width > 1 ? a->beam_width : 1;
    if (sched_validate_beams(s, a->n_prompt, a->max_new, width, msg, sizeof msg) != VKI_OK)
        return VKI_ERR_INVALID_ARG;
    if (s->p.max_queue && s->n_heap >= s->p.max_queue)
        return VKI_RETRY_QUEUE_FULL;
    uint32_t cap = a->n_prompt + a->max_new; /* <= max_ctx: no overflow */
    uint32_t need = seq_need(s, cap);
    /* STATIC pads members in place to the batch's longest: room for max_ctx up front */
    uint32_t alloc_cap = s->p.policy == VKI_POLICY_STATIC ? s->p.max_ctx : cap;
    uint32_t alloc_need = sched_blocks_for(s, alloc_cap);
    size_t bytes = sizeof(sched_seq) + (size_t)alloc_cap * sizeof(int32_t) + (size_t)alloc_need * sizeof(uint32_t);
    if (heap_reserve(s, s->n_heap + s->n_running + 1) != VKI_OK)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    sched_seq *q = calloc(1, bytes);
    if (!q)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    q->tokens = (int32_t *)(q + 1);
    q->blocks = (uint32_t *)(q->tokens + alloc_cap);
    memcpy(q->tokens, a->prompt, (size_t)a->n_prompt * sizeof(int32_t));
    q->user = a->user;
    q->priority = a->priority;
    q->order = s->next_order++;
    q->n_prompt = q->n_tokens = a->n_prompt;
    q->max_new = a->max_new;
    q->cap = cap;
    q->need_total = need;
    q->slot = UINT32_MAX;
    q->sampling = a->sampling;
    q->seed = a->seed;
    q->logits_hook = a->logits_hook;
    q->logits_hook_ctx = a->logits_hook_ctx;
    q->token_mask = a->token_mask;
    q->hidden_hook = a->hidden_hook;
    q->hidden_hook_ctx = a->hidden_hook_ctx;
    q->no_reuse = a->no_reuse;
    q->logits_sink = a->logits_sink;
    q->logits_sink_ctx = width > 1 && a->beam_sink_ctx ? a->beam_sink_ctx[0] : a->logits_sink_ctx;
    q->sink_sampled = a->sink_sampled;
    q->sink_rows_end = a->sink_rows_end;
    q->beam_width = width;
    if (width > 1 && sched_beam_create(s, q, width, a->beam_sink_ctx) != VKI_OK) {
        free(q);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    heap_push(s, q);
    *out = q;
    return VKI_OK;
}

/* STATIC: whether a running member other than q is still live (not a ghost). O(running). */
static bool static_batch_live(const sched *s, const sched_seq *q)
{
    for (const sched_seq *r = s->run_head; r; r = r->run_next)
        if (r != q && !r->ghost)
            return true;
    return false;
}

void sched_remove(sched *s, sched_seq *q)
{
    bool is_static = s->p.policy == VKI_POLICY_STATIC;
    if (q->beams) /* the followers first; the lead then leaves as any sequence */
        sched_beam_remove(s, q);
    if (q->state == SCHED_QUEUED) {
        heap_remove(s, q);
        if (q->paused)
            s->n_paused_waiting--;
    } else if (is_static && static_batch_live(s, q)) {
        q->ghost = true; /* keeps computing padding until the batch's last member leaves */
        q->user = NULL;  /* the owner's request (and its sampling params) is gone */
        q->sampling = NULL;
        q->logits_hook = NULL;
        q->logits_hook_ctx = NULL;
        q->token_mask = NULL;
        q->logits_sink = NULL;
        q->logits_sink_ctx = NULL;
        return;
    } else {
        sched_drop_running(s, q);
    }
    free(q);
    if (is_static && s->run_head && !static_batch_live(s, NULL)) /* the batch ended: drop its ghosts */
        while (s->run_head) {
            sched_seq *g = s->run_head;
            sched_drop_running(s, g);
            free(g);
        }
}

/* ---- planning ----------------------------------------------------------------------------- */

/* Token budget: decode tokens first (one per generating sequence, oldest first), then prefill
 * chunks of running sequences in their context phase. STATIC runs in lockstep: no decode while
 * a member is still in its context. O(running). */
static void budget_running(sched *s, uint32_t *tok, uint32_t *nseq)
{
    bool any_ctx = false;
    for (sched_seq *q = s->run_head; q; q = q->run_next) {
        q->n_new = 0;
        any_ctx |= in_context(q);
        /* a ghost feeds a padding token (its last one repeated) while it has room */
        if (q->ghost && q->n_computed == q->n_tokens && q->n_tokens < q->cap) {
            q->tokens[q->n_tokens] = q->tokens[q->n_tokens - 1];
            q->n_tokens++;
        }
    }
    if (!(s->p.policy == VKI_POLICY_STATIC && any_ctx))
        for (sched_seq *q = s->run_head; q && *tok && *nseq; q = q->run_next) {
            if (q->lead) { /* a beam group decodes all its beams in one step, or waits */
                if (q->lead != q || q->beams[1]->beam_idle || in_context(q) || sched_seq_done(q) ||
                    *tok < q->beam_width || *nseq < q->beam_width)
                    continue;
                for (uint32_t b = 0; b < q->beam_width; b++)
                    q->beams[b]->n_new = 1;
                *tok -= q->beam_width;
                *nseq -= q->beam_width;
                s->tick_decode += q->beam_width;
                continue;
            }
            if (!in_context(q) && (q->ghost ? q->n_computed < q->n_tokens : !sched_seq_done(q))) {
                q->n_new = 1;
                (*tok)--;
                (*nseq)--;
                s->tick_decode++;
            }
        }
    for (sched_seq *q = s->run_head; q && *tok && *nseq; q = q->run_next)
        if (in_context(q)) {
            q->n_new = min_u32(min_u32(s->p.chunk_size, q->ctx_end - q->n_computed), *tok);
            *tok -= q->n_new;
            (*nseq)--;
        }
}

/* Blocks for the scheduled tokens of running sequences, oldest first. When the pool is short,
 * MAX_UTILIZATION pauses from the newest end (possibly the sequence itself); the other
 * policies reserved these blocks at admission, so a shortage is a bug. O(running + blocks), plus
 * O(running) per sequence that pauses itself while a beam group (never paused) runs after it. */
static vki_status alloc_running(sched *s)
{
    for (sched_seq *q = s->run_head, *next; q; q = next) {
        if (!q->n_new) {
            next = q->run_next;
            continue;
        }
        uint32_t want = sched_blocks_for(s, q->n_computed + q->n_new);
        if (want > q->n_held) { /* only at block boundaries */
            while (sched_kv_avail(s->kv) < want - q->n_held) {
                if (s->p.policy != VKI_POLICY_MAX_UTILIZATION)
                    return VKI_ERR_INTERNAL;
                sched_seq *victim = s->run_tail;
                while (victim && victim->lead) /* beam groups hold a reservation: never paused */
                    victim = victim->run_prev;
                if (!victim)
                    return VKI_ERR_INTERNAL;
                sched_pause_seq(s, victim);
                if (victim == q)
                    break;
            }
            if (q->state != SCHED_RUNNING) { /* q paused itself: those after it are paused too, but
                                                 for beam groups (never paused): go over the list
                                                 again (the grown ones have their blocks) */
                next = s->run_head;
                continue;
            }
            if (!grow_blocks(s, q, q->n_computed + q->n_new))
                return VKI_ERR_INTERNAL;
        }
        next = q->run_next;
    }
    return VKI_OK;
}

typedef struct admit_state {
    uint32_t tok, nseq;
    uint32_t avail0;        /* STATIC: free + cached blocks when the batch opened */
    uint32_t max_prompt;    /* STATIC: longest prompt and max_new of the batch so far */
    uint32_t max_new;
} admit_state;

/* STATIC: blocks a member padded to (longest prompt, longest max_new) may need. */
static uint32_t static_padded_need(const sched *s, uint32_t max_prompt, uint32_t max_new)
{
    uint64_t cap = (uint64_t)max_prompt + max_new;
    return seq_need(s, cap < s->p.max_ctx ? cap : s->p.max_ctx);
}

/* STATIC, once the batch is formed: every member's capacity and reservation padded to the
 * batch's longest prompt + longest max_new (within max_ctx), so ghosts can keep decoding.
 * The admission check already counted these blocks. O(members). */
static void static_pad_batch(sched *s, const admit_state *a)
{
    uint64_t cap = (uint64_t)a->max_prompt + a->max_new;
    uint32_t padded = (uint32_t)(cap < s->p.max_ctx ? cap : s->p.max_ctx);
    for (sched_seq *q = s->run_head; q; q = q->run_next) {
        if (padded <= q->cap)
            continue;
        uint32_t need = seq_need(s, padded);
        s->reserved += need - q->need_total;
        q->need_total = need;
        q->cap = padded;
    }
}

/* The part of a matched prefix of m blocks a sequence takes: all of it, or with windows the
 * sink's blocks [0, sink) and those its first query sees [first, m) (the entries between are
 * released from the start). t blocks in all, t_cached of them with ref 0 (taking them removes
 * them from the allocatable pool). O(m). */
typedef struct prefix_take {
    uint32_t m, sink, first, t, t_cached;
} prefix_take;

static prefix_take plan_take(const sched *s, uint32_t m)
{
    prefix_take pt = {.m = m, .sink = min_u32(s->sink_blocks, m), .first = 0};
    if (s->p.kv_window) {
        uint64_t c = (uint64_t)m * s->p.block_size, w = s->p.kv_window;
        uint64_t first = (c + 1 > w ? c + 1 - w : 0) / s->p.block_size;
        if (s->p.block_reuse && m && first > m - 1)
            first = m - 1; /* the last matched block is the next seal's parent */
        pt.first = (uint32_t)first;
    }
    if (pt.first < pt.sink)
        pt.first = pt.sink;
    pt.t = pt.sink + (m - pt.first);
    for (uint32_t i = 0; i < m; i++)
        if ((i < pt.sink || i >= pt.first) && sched_kv_ref(s->kv, s->match[i]) == 0)
            pt.t_cached++;
    return pt;
}

/* Whether q may start with `n` tokens after matching the blocks of pt. O(1). */
static bool admission_fits(const sched *s, const sched_seq *q, const prefix_take *pt, uint32_t n, admit_state *a)
{
    if (q->beams)
        return n > 0 && sched_beam_fits(s, q, pt->t - pt->t_cached);
    uint64_t avail = sched_kv_avail(s->kv);
    switch (s->p.policy) {
    case VKI_POLICY_GUARANTEED_NO_EVICT: {
        /* every block q may hold to completion, except taken blocks others already hold; with
         * windows those are released while still shared (each such release leaves q a block to
         * allocate again), so they are not discounted and shared references stay reserved */
        uint64_t res = sched_reserved_total(s);
        uint64_t need = q->need_total - (s->p.kv_window ? 0 : pt->t - pt->t_cached);
        return avail >= res && need <= avail - res;
    }
    case VKI_POLICY_MAX_UTILIZATION:
        return n > 0 && (uint64_t)sched_blocks_for(s, (uint64_t)pt->m * s->p.block_size + n) - pt->m + pt->t_cached <= avail;
    case VKI_POLICY_STATIC: {
        /* padded to the longest: every member may run to the longest prompt + max_new */
        uint32_t mp = q->n_prompt > a->max_prompt ? q->n_prompt : a->max_prompt;
        uint32_t mn = q->max_new > a->max_new ? q->max_new : a->max_new;
        if ((uint64_t)static_padded_need(s, mp, mn) * (s->n_running + 1) > a->avail0)
            return false;
        a->max_prompt = mp;
        a->max_new = mn;
        return true;
    }
    }
    return false;
}

/* Starts q: takes its matched prefix (the part pt keeps), a slot, and blocks for its first chunk
 * of n tokens. */
static vki_status admit_seq(sched *s, sched_seq *q, const prefix_take *pt, uint32_t n)
{
    heap_remove(s, q);
    if (q->paused) {
        q->paused = false;
        s->n_paused_waiting--;
    }
    sched_kv_take(s->kv, s->match, pt->sink);
    sched_kv_take(s->kv, s->match + pt->first, pt->m - pt->first);
    memcpy(q->blocks, s->match, (size_t)pt->m * sizeof *q->blocks);
    for (uint32_t i = pt->sink; i < pt->first; i++)
        q->blocks[i] = SCHED_KV_NONE;
    q->n_held = q->n_sealed = pt->m;
    q->n_dropped = pt->first - pt->sink;
    q->drop_next = pt->first > s->sink_blocks ? pt->first : s->sink_blocks;
    q->n_computed = pt->m * s->p.block_size;
    q->ctx_end = q->n_tokens;
    s->reused_tokens += q->n_computed;
    if (!q->admitted_once)
        q->n_cached = q->n_computed;
    q->admitted_once = true;
    q->slot = s->free_slots[--s->n_free_slots];
    q->state = SCHED_RUNNING;
    sched_run_append(s, q);
    s->reserved += q->need_total - pt->t;
    q->n_new = n;
    if (q->beams)
        sched_beam_admit(s, q);
    return grow_blocks(s, q, q->n_computed + n) ? VKI_OK : VKI_ERR_INTERNAL;
}

/* Admission from the head of the queue while a slot, the budgets and the policy allow; stops at
 * the first request that does not fit (head-of-line: priority/FIFO order is kept). Nothing is
 * admitted in a tick that paused (the freed blocks go to the running sequences; re-admitting
 * the paused would thrash). O(admitted * (log queue + matched prefix)). */
static vki_status admit_waiting(sched *s, admit_state *a, uint32_t *n_admitted)
{
    bool is_static = s->p.policy == VKI_POLICY_STATIC;
    if (s->tick_paused || (is_static && s->n_running))
        return VKI_OK;
    a->avail0 = sched_kv_avail(s->kv);
    while (s->n_heap && s->n_running < s->max_running && (is_static || (a->tok && a->nseq))) {
        sched_seq *q = s->heap[0];
        uint32_t m_cached;
        /* at least the last known token is computed, so the step yields logits */
        uint32_t m = q->no_reuse ? (m_cached = 0)
                                 : sched_kv_lookup(s->kv, q->tokens, (q->n_tokens - 1) / s->p.block_size, s->match,
                                                   &m_cached);
        prefix_take pt = plan_take(s, m);
        uint32_t left = q->n_tokens - m * s->p.block_size;
        uint32_t n = a->nseq ? min_u32(min_u32(s->p.chunk_size, left), a->tok) : 0;
        if (!admission_fits(s, q, &pt, n, a))
            break;
        vki_status st = admit_seq(s, q, &pt, n);
        if (st != VKI_OK)
            return st;
        a->tok -= n;
        a->nseq -= n > 0;
        (*n_admitted)++;
    }
    if (is_static && *n_admitted)
        static_pad_batch(s, a);
    return VKI_OK;
}

static void plan_entry(sched *s, sched_seq *q, uint32_t k)
{
    vki_step_seq *e = &s->plan_seqs[k];
    uint32_t end = q->n_computed + q->n_new;
    *e = (vki_step_seq){
        .slot = q->slot,
        .pos0 = q->n_computed,
        .n_new = q->n_new,
        .tokens = q->tokens + q->n_computed,
        .n_pages = q->n_held,
        .pages = q->blocks,
        .want_token = !q->ghost && end == q->n_tokens,
        .sampling = q->sampling,
        .seed = q->seed,
        .logits_hook = q->ghost ? NULL : q->logits_hook,
        .logits_hook_ctx = q->logits_hook_ctx,
        .token_mask = q->ghost ? NULL : q->token_mask,
        .hidden_hook = q->ghost ? NULL : q->hidden_hook,
        .hidden_hook_ctx = q->hidden_hook_ctx,
        .logits_sink = q->ghost ? NULL : q->logits_sink,
        .logits_sink_ctx = q->logits_sink_ctx,
        .sink_sampled = q->sink_sampled,
        .sink_rows_end = q->sink_rows_end,
    };
    uint32_t window = q->sampling ? q->sampling->penalty_window : 0;
    if (e->want_token && window) {
        e->n_history = min_u32(window, end);
        e->history = q->tokens + end - e->n_history;
    }
    s->plan_ptrs[k] = q;
}

vki_status sched_plan(sched *s, sched_tick *t)
{
    *t = (sched_tick){.seqs = s->plan_ptrs};
    t->plan.seqs = s->plan_seqs;
    s->tick_paused = s->tick_decode = 0;
    admit_state a = {.tok = s->p.max_num_tokens, .nseq = s->max_running};
    budget_running(s, &a.tok, &a.nseq);
    vki_status st = alloc_running(s);
    if (st == VKI_OK)
        st = admit_waiting(s, &a, &t->n_admitted);
    if (st != VKI_OK)
        return st;
    t->n_paused = s->tick_paused;
    /* one pass: decode entries fill [0, tick_decode), prefill chunks follow */
    uint32_t dec = 0, ctx = s->tick_decode;
    for (sched_seq *q = s->run_head; q; q = q->run_next) {
        if (!q->n_new)
            continue;
        bool c = in_context(q);
        uint32_t k = c ? ctx++ : dec++;
        plan_entry(s, q, k);
        t->plan.n_tokens += q->n_new;
        t->n_context_tokens += c ? q->n_new : 0;
        t->n_sampled += s->plan_seqs[k].want_token;
        t->n_ghosts += q->ghost && !c;
    }
    if (dec != s->tick_decode)
        return VKI_ERR_INTERNAL;
    t->n_generation = dec;
    t->n_context = ctx - dec;
    t->plan.n_seqs = ctx;
    t->plan.n_copies = ctx ? s->n_copies : 0; /* consumed by the step sched_commit confirms */
    t->plan.copies = s->copies;
    return VKI_OK;
}

/* Seals q's newly completed blocks for reuse. O(new full blocks * block_size). */
static void seal_full(sched *s, sched_seq *q)
{
    while ((uint64_t)(q->n_sealed + 1) * s->p.block_size <= q->n_computed) {
        uint32_t i = q->n_sealed;
        uint32_t parent = i ? q->blocks[i - 1] : SCHED_KV_NONE;
        q->blocks[i] = sched_kv_seal(s->kv, q->blocks[i], parent, q->tokens + (size_t)i * s->p.block_size);
        q->n_sealed++;
    }
}

void sched_commit(sched *s, const sched_tick *t, const vki_step_out *outs)
{
    uint32_t k = 0;
    s->n_copies -= t->plan.n_copies; /* reorders add only after a commit: these were all emitted */
    for (uint32_t i = 0; i < t->plan.n_seqs; i++) {
        sched_seq *q = t->seqs[i];
        const vki_step_seq *e = &t->plan.seqs[i];
        q->n_computed = e->pos0 + e->n_new;
        q->n_new = 0;
        if (s->p.block_reuse)
            seal_full(s, q);
        drop_out_of_window(s, q);
        if (e->want_token && k < t->n_sampled) {
            if (q->n_tokens < q->cap)
                q->tokens[q->n_tokens++] = outs[k].token;
            k++;
        }
    }
}

/* ---- stats and checks ---------------------------------------------------------------------- */

static void pin_count(sched *s, const uint32_t *blocks, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        s->pin_ref[blocks[i]]++;
    s->pinned_refs += n;
}

vki_status sched_pin_seq(sched *s, const sched_seq *q, sched_pin *out)
{
    *out = (sched_pin){0};
    uint32_t n = 0;
    while (n < q->n_sealed && n < q->n_held && q->blocks[n] != SCHED_KV_NONE)
        n++;
    if (!s->p.block_reuse || !n)
        return VKI_OK;
    if (!s->pin_ref && !(s->pin_ref = calloc(s->p.n_blocks, sizeof *s->pin_ref)))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    if (!(out->blocks = malloc((size_t)n * sizeof *out->blocks)))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    memcpy(out->blocks, q->blocks, (size_t)n * sizeof *out->blocks);
    out->n = n;
    sched_kv_retain(s->kv, out->blocks, n);
    pin_count(s, out->blocks, n);
    return VKI_OK;
}

void sched_pin_release(sched *s, sched_pin *p)
{
    if (p->n) {
        sched_kv_release(s->kv, p->blocks, p->n);
        for (uint32_t i = 0; i < p->n; i++)
            s->pin_ref[p->blocks[i]]--;
        s->pinned_refs -= p->n;
    }
    free(p->blocks);
    *p = (sched_pin){0};
}

vki_status sched_pin_prepare(sched *s, const int32_t *tokens, uint32_t n, sched_pin *out, uint32_t *n_fresh,
                             uint32_t *room)
{
    *out = (sched_pin){0};
    *n_fresh = 0;
    uint64_t avail = sched_kv_avail(s->kv), res = sched_reserved_total(s);
    *room = avail > res ? (uint32_t)(avail - res) : 0;
    if (!s->p.block_reuse || n > s->max_seq_blocks || n > s->p.n_blocks)
        return VKI_ERR_INVALID_ARG;
    if (!n)
        return VKI_OK;
    if (!s->pin_ref && !(s->pin_ref = calloc(s->p.n_blocks, sizeof *s->pin_ref)))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    uint32_t cached, m = sched_kv_lookup(s->kv, tokens, n, s->match, &cached);
    *n_fresh = n - m;
    if ((uint64_t)(n - m) + cached > *room) /* taking a cached block costs an allocatable one too */
        return VKI_ERR_OUT_OF_DEVICE_MEMORY;
    if (!(out->blocks = malloc((size_t)n * sizeof *out->blocks)))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    memcpy(out->blocks, s->match, (size_t)m * sizeof *out->blocks);
    sched_kv_retain(s->kv, out->blocks, m);
    for (uint32_t i = m; i < n; i++) /* cannot fail: counted above; the prefix is held, never evicted */
        out->blocks[i] = sched_kv_alloc(s->kv);
    out->n = n;
    pin_count(s, out->blocks, n);
    return VKI_OK;
}

void sched_pin_commit(sched *s, const int32_t *tokens, sched_pin *p, uint32_t n_fresh)
{
    for (uint32_t i = p->n - n_fresh; i < p->n; i++) {
        uint32_t parent = i ? p->blocks[i - 1] : SCHED_KV_NONE;
        uint32_t b = sched_kv_seal(s->kv, p->blocks[i], parent, tokens + (size_t)i * s->p.block_size);
        s->pin_ref[p->blocks[i]]--; /* an identical sealed block took the place of ours: hold that one */
        s->pin_ref[b]++;
        p->blocks[i] = b;
    }
}

void sched_get_stats(const sched *s, sched_stats *st)
{
    *st = (sched_stats){.queued = s->n_heap, .running = s->n_running, .paused = s->n_paused_waiting,
                        .max_running = s->max_running, .reused_tokens = s->reused_tokens, .pauses = s->pauses,
                        .pinned_refs = s->pinned_refs};
    sched_kv_get_stats(s->kv, &st->kv);
}

uint32_t sched_queue_len(const sched *s) { return s->n_heap; }

bool sched_batch_full(const sched *s) { return s->n_running >= s->max_running; }

bool sched_head_admissible(sched *s)
{
    if (!s->n_heap || s->n_running >= s->max_running)
        return false;
    if (s->p.policy == VKI_POLICY_STATIC)
        return !s->n_running;
    if (s->p.max_num_tokens <= s->n_running) /* a token each for the running sequences first */
        return false;
    sched_seq *q = s->heap[0];
    uint32_t m_cached, tok = s->p.max_num_tokens - s->n_running;
    uint32_t m = q->no_reuse ? 0 : sched_kv_lookup(s->kv, q->tokens, (q->n_tokens - 1) / s->p.block_size, s->match,
                                                   &m_cached);
    prefix_take pt = plan_take(s, m);
    uint32_t n = min_u32(min_u32(s->p.chunk_size, q->n_tokens - m * s->p.block_size), tok);
    admit_state a = {.tok = tok, .nseq = s->max_running - s->n_running};
    return admission_fits(s, q, &pt, n, &a);
}

#define CHECK(cond, ...)                                                                         \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            snprintf(msg, msg_cap, __VA_ARGS__);                                                 \
            st = VKI_ERR_INTERNAL;                                                               \
            goto out;                                                                            \
        }                                                                                        \
    } while (0)

static vki_status check_running(const sched *s, uint32_t *ref, uint8_t *slot_used, uint64_t *reserved,
                                char *msg, size_t msg_cap)
{
    vki_status st = VKI_OK;
    uint32_t n = 0, bs = s->p.block_size;
    const sched_seq *prev = NULL;
    for (const sched_seq *q = s->run_head; q; prev = q, q = q->run_next, n++) {
        CHECK(n < s->n_running && q->run_prev == prev, "running list corrupt");
        CHECK(q->state == SCHED_RUNNING && !q->paused, "running sequence %llu in state %d", (unsigned long long)q->order, q->state);
        CHECK(q->slot < s->p.max_seqs && !slot_used[q->slot], "slot %u out of range or used twice", q->slot);
        slot_used[q->slot] = 1;
        CHECK(q->n_computed <= q->n_tokens && q->n_tokens <= q->cap && q->ctx_end <= q->n_tokens,
              "sequence %llu: computed %u, tokens %u, cap %u", (unsigned long long)q->order, q->n_computed, q->n_tokens, q->cap);
        CHECK(sched_live_blocks(q) <= q->need_total && q->n_held >= sched_blocks_for(s, q->n_computed),
              "sequence %llu holds %u blocks (%u live) for %u computed tokens (may hold %u)", (unsigned long long)q->order,
              q->n_held, sched_live_blocks(q), q->n_computed, q->need_total);
        CHECK((uint64_t)q->n_sealed * bs <= q->n_computed && q->n_sealed <= q->n_held, "sequence %llu: %u sealed blocks",
              (unsigned long long)q->order, q->n_sealed);
        *reserved += q->need_total - sched_live_blocks(q);
        uint32_t dropped = 0;
        for (uint32_t i = 0; i < q->n_held; i++) {
            uint32_t b = q->blocks[i];
            if (b == SCHED_KV_NONE) { /* released: between the sink and the window, seen by no query */
                CHECK(s->p.kv_window && i >= s->sink_blocks && i < q->drop_next &&
                      (uint64_t)(i + 1) * bs + s->p.kv_window <= (uint64_t)q->n_computed + 1,
                      "sequence %llu released block #%u that its window still sees", (unsigned long long)q->order, i);
                dropped++;
                continue;
            }
            CHECK(b < s->p.n_blocks, "block id %u out of range", b);
            ref[b]++;
            bool full = (uint64_t)(i + 1) * bs <= q->n_computed;
            CHECK(!s->p.block_reuse || (i < q->n_sealed) == sched_kv_is_sealed(s->kv, b),
                  "sequence %llu block %u (#%u): sealed %d but n_sealed %u", (unsigned long long)q->order, b, i,
                  sched_kv_is_sealed(s->kv, b), q->n_sealed);
            /* a block still to be written must be private */
            CHECK(full || (sched_kv_ref(s->kv, b) == 1 && !sched_kv_is_sealed(s->kv, b)),
                  "sequence %llu will write block %u (#%u) which is shared or sealed", (unsigned long long)q->order, b, i);
        }
        CHECK(dropped == q->n_dropped, "sequence %llu: %u released entries, counter %u", (unsigned long long)q->order,
              dropped, q->n_dropped);
        if (q->beams && (st = sched_beam_check(s, q, msg, msg_cap)) != VKI_OK)
            goto out;
    }
    CHECK(n == s->n_running && prev == s->run_tail, "running count %u, list has %u", s->n_running, n);
    CHECK(n <= s->max_running, "%u running, max %u", n, s->max_running);
out:
    return st;
}

vki_status sched_check(const sched *s, char *msg, size_t msg_cap)
{
    vki_status st = VKI_OK;
    uint32_t *ref = calloc(s->p.n_blocks, sizeof *ref);
    uint8_t *slot_used = calloc(s->p.max_seqs, 1);
    uint64_t reserved = 0;
    uint32_t paused = 0;
    CHECK(ref && slot_used, "out of memory");
    st = check_running(s, ref, slot_used, &reserved, msg, msg_cap);
    if (st != VKI_OK)
        goto out;
    for (uint32_t i = 0; i < s->n_heap; i++) {
        const sched_seq *q = s->heap[i];
        CHECK(q->heap_idx == i && q->state == SCHED_QUEUED && q->n_held == 0 && q->n_computed == 0,
              "queued sequence %u corrupt", i);
        CHECK(i == 0 || !runs_before(q, s->heap[(i - 1) / 2]), "queue heap order broken at %u", i);
        paused += q->paused;
    }
    CHECK(paused == s->n_paused_waiting, "%u paused in the queue, counter %u", paused, s->n_paused_waiting);
    CHECK(s->n_free_slots + s->n_running == s->p.max_seqs, "%u free slots + %u running != %u", s->n_free_slots,
          s->n_running, s->p.max_seqs);
    for (uint32_t i = 0; i < s->n_free_slots; i++) {
        uint32_t sl = s->free_slots[i];
        CHECK(sl < s->p.max_seqs && !slot_used[sl], "free slot %u is in use or listed twice", sl);
        slot_used[sl] = 1;
    }
    CHECK(reserved == s->reserved, "reserved %llu, recomputed %llu", (unsigned long long)s->reserved,
          (unsigned long long)reserved);
    if (s->p.policy != VKI_POLICY_MAX_UTILIZATION)
        CHECK(sched_kv_avail(s->kv) >= sched_reserved_total(s), "%u allocatable blocks < %llu reserved by running sequences",
              sched_kv_avail(s->kv), (unsigned long long)sched_reserved_total(s));
    for (uint32_t b = 0; s->pin_ref && b < s->p.n_blocks; b++)
        ref[b] += s->pin_ref[b];
    st = sched_kv_check(s->kv, ref, msg, msg_cap);
out:
    free(ref);
    free(slot_used);
    return st;
}
