/* The scheduler's private state and the helpers sched.c shares with sched_beam.c. Not for use
 * outside scheduler/. */
#ifndef VKI_SCHED_INTERNAL_H
#define VKI_SCHED_INTERNAL_H

#include "scheduler/sched.h"

struct sched {
    sched_params p;
    uint32_t max_running;     /* min(max_seqs, max_batch_size) */
    uint32_t max_seq_blocks;  /* ceil(max_ctx / block_size): longest block table */
    uint32_t sink_blocks;     /* leading blocks the window never releases (kv_sink) */
    sched_kv *kv;
    sched_seq **heap;         /* [heap_cap] wait queue */
    uint32_t n_heap, heap_cap;
    sched_seq *run_head, *run_tail;
    uint32_t n_running;
    uint32_t *free_slots;     /* [max_seqs] stack of free backend slots */
    uint32_t n_free_slots;
    uint64_t next_order;
    uint64_t reserved;        /* sum over running of need_total - n_held */
    uint32_t n_paused_waiting;
    uint64_t reused_tokens, pauses;
    /* per-tick scratch, sized at create: a tick allocates nothing */
    vki_step_seq *plan_seqs;  /* [max_running] */
    sched_seq **plan_ptrs;    /* [max_running] */
    uint32_t *match;          /* [max_seq_blocks] prefix lookup result */
    uint32_t tick_paused;
    uint32_t tick_decode;     /* decode entries scheduled this tick */
    uint32_t *pin_ref;        /* [n_blocks] references held by pins (sched_check); NULL until the first */
    uint32_t pinned_refs;     /* their sum */
    /* beam search (sched_beam.c): copy-on-write page copies for the next plan */
    vki_page_copy *copies;    /* [max_seqs] pending: each running beam adds at most one per reorder */
    uint32_t n_copies;
};

uint32_t sched_blocks_for(const sched *s, uint64_t n_tokens);
uint32_t sched_live_blocks(const sched_seq *q);
void sched_run_append(sched *s, sched_seq *q);
/* Returns a running sequence's blocks and slot; it leaves the running list. */
void sched_drop_running(sched *s, sched_seq *q);
/* MAX_UTILIZATION: q loses its KV and slot and waits at the front of the queue. */
void sched_pause_seq(sched *s, sched_seq *q);
/* What GUARANTEED_NO_EVICT keeps allocatable for the running sequences. */
uint64_t sched_reserved_total(const sched *s);

/* sched_beam.c */
/* sched_add of a beam request: the width - 1 followers, parked until the lead is admitted. */
vki_status sched_beam_create(sched *s, sched_seq *lead, uint32_t width, void *const *sink_ctx);
/* Whether the group of lead q may start: slots for every beam and, under every policy, every
 * block each beam may hold to its end (beams are never paused). taken_shared: blocks of the
 * matched prefix that other sequences already hold. O(running) under MAX_UTILIZATION. */
bool sched_beam_fits(const sched *s, const sched_seq *q, uint32_t taken_shared);
/* The lead was admitted: its followers take slots and reservations, idle until the first reorder. */
void sched_beam_admit(sched *s, sched_seq *lead);
/* Removes and frees a group's followers and the pending copies into the group's blocks; the
 * caller then removes the lead. */
void sched_beam_remove(sched *s, sched_seq *lead);
/* sched_destroy: frees a group's followers that are not in the running list. */
void sched_beam_free_parked(sched_seq *lead);
/* sched_check: the group's beams agree (states, lengths, tables of equal size). */
vki_status sched_beam_check(const sched *s, const sched_seq *q, char *msg, size_t msg_cap);

#endif
