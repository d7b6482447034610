/* The scheduler: request states, capacity policies and micro-batch planning over the KV block
 * manager. Pure C: no Vulkan, no threads, no clocks. One owner thread calls everything.
 *
 * Lifecycle of a sequence:
 *   QUEUED  in the wait queue (priority, then FIFO; paused sequences go to the front);
 *   RUNNING holds a backend slot and KV blocks; in its context phase while n_computed < ctx_end
 *           (prompt, or prompt + generated tokens when resumed after a pause; computed in chunks),
 *           then in generation (one token per step);
 *   paused  (MAX_UTILIZATION only) a running sequence that lost its blocks and slot: QUEUED
 *           again at the front, with its tokens kept; on resume it recomputes them (reusing
 *           whatever of its prefix is still cached) and its next sampled token is the next new
 *           one, so no output is lost or repeated;
 *   finished: the owner calls sched_remove (end id, length, cancel, error) in any state.
 *   ghost   (STATIC only) a batch member removed while others of its batch still run: the
 *           scheduler keeps its slot and blocks and decodes padding tokens for it (outputs
 *           discarded, user NULL) until the batch's last live member is removed, because static
 *           batching computes every member until the longest finishes. Owned by the scheduler.
 *
 * A tick: sched_plan() -> the engine runs tick.plan -> sched_commit(). Between the two nothing
 * else may be called. Cost of a tick: O(running + admitted + blocks allocated/sealed this tick
 * (each O(block_size)) + admitted * log(queue)); nothing scans the queue or the block pool. */
#ifndef VKI_SCHED_SCHED_H
#define VKI_SCHED_SCHED_H

#include "engine/step.h"
#include "scheduler/kv_blocks.h"

typedef struct sched sched;

typedef struct sched_params {
    vki_capacity_policy policy;
    uint32_t max_seqs;        /* backend sequence slots */
    uint32_t n_blocks;        /* backend KV pages */
    uint32_t block_size;      /* tokens per page */
    uint32_t max_ctx;         /* longest sequence */
    uint32_t max_batch_size;  /* running sequences (and sequences per step); 0 = max_seqs */
    uint32_t max_num_tokens;  /* tokens per step, >= 1 */
    uint32_t chunk_size;      /* prefill chunk, a multiple of block_size */
    uint32_t max_queue;       /* queued (never admitted) sequences; 0 = unbounded */
    bool block_reuse;
    /* Sliding windows on every layer (engine kv_window / kv_sink): a query at position p sees
     * only positions > p - kv_window and < kv_sink, so a running sequence releases each block
     * that lies wholly before its next query's window (and past the sink) at commit. Its table
     * keeps SCHED_KV_NONE there (= VKI_PAGE_NONE for the engine), and what it may hold at once
     * (need_total) is bounded by the window instead of its length. kv_window 0 = no release. */
    uint32_t kv_window;
    uint32_t kv_sink;
} sched_params;

typedef enum sched_state { SCHED_QUEUED = 0, SCHED_RUNNING = 1 } sched_state;

typedef struct sched_seq sched_seq;

/* Read-only for everyone but the scheduler. */
struct sched_seq {
    void *user;               /* the owner's request */
    sched_state state;
    bool paused;              /* QUEUED after being paused (counts in "Paused Requests") */
    int32_t priority;
    uint64_t order;           /* arrival number: FIFO among equal priorities */
    uint32_t n_prompt, max_new;
    uint32_t cap;             /* n_prompt + max_new (STATIC: padded to the batch's longest
                                 prompt + max_new, capped at max_ctx): capacity of tokens */
    int32_t *tokens;          /* [cap] prompt, then generated tokens */
    uint32_t n_tokens;        /* prompt + generated so far */
    uint32_t n_computed;      /* the KV holds positions [0, n_computed) */
    uint32_t ctx_end;         /* context phase until n_computed reaches it */
    uint32_t *blocks;         /* [max_blocks] block table, position order; SCHED_KV_NONE for the
                                 released entries [sink blocks, drop_next) */
    uint32_t n_held;          /* entries in the table (released ones included) */
    uint32_t n_dropped;       /* entries released by the window: n_held - n_dropped blocks are live */
    uint32_t drop_next;       /* first table entry the window has not released (>= sink blocks) */
    uint32_t n_sealed;        /* leading blocks sealed for reuse */
    uint32_t need_total;      /* most blocks it may hold at once until it finishes: the KV of cap - 1
                                 tokens, or with windows what the window keeps (sched.c seq_need) */
    uint32_t slot;            /* backend slot while RUNNING */
    uint32_t n_pauses;
    bool ghost;               /* STATIC padding member (see above); user is NULL */
    const vki_sampling_params *sampling; /* owner's copy, or NULL (greedy) */
    uint64_t seed;
    void (*logits_hook)(void *ctx, float *logits, uint32_t n_vocab); /* see vki_step_seq */
    void *logits_hook_ctx;
    const uint32_t *token_mask; /* owner's allowed-token bitset or NULL (see vki_step_seq) */
    void (*hidden_hook)(void *ctx, const float *rows, uint32_t n_rows, uint32_t d, uint32_t pos0);
    void *hidden_hook_ctx;
    bool no_reuse;            /* computes every position (takes no cached prefix blocks) */
    void (*logits_sink)(void *ctx, const float *rows, uint32_t n_rows, uint32_t n_vocab, uint32_t pos0,
                        bool sampled); /* logits outputs, see vki_step_seq */
    void *logits_sink_ctx;
    bool sink_sampled;
    uint32_t sink_rows_end;
    /* Beam search: a request of beam_width > 1 is a group of that many sequences, the lead (the
     * one sched_add returns, which computes the prompt) and its followers. The group is admitted
     * and removed as one, with slots and a full reservation for every beam under every policy,
     * so it is never paused; its beams decode in the same step or not at all. After each step
     * the owner picks every beam's parent and token (sched_beam_reorder). */
    uint32_t beam_width;      /* 1: a plain sequence */
    uint32_t beam_idx;        /* position in the group (0 = the lead) */
    sched_seq *lead;          /* the group's lead (itself for the lead); NULL when beam_width 1 */
    sched_seq **beams;        /* lead only: [beam_width] the group, beams[0] = the lead */
    bool beam_idle;           /* a follower before the first reorder: holds a slot, no KV */
    int32_t *beam_scratch;    /* lead only: [beam_width][cap] token snapshot for the reorder */
    uint32_t *beam_blocks;    /* lead only: [beam_width][max blocks] table snapshot */
    bool admitted_once;
    uint32_t n_cached;        /* prompt tokens taken from the prefix cache at the first admission */
    /* private */
    uint32_t heap_idx;        /* position in the queue heap while QUEUED */
    uint32_t n_new;           /* tokens scheduled this tick */
    sched_seq *run_prev, *run_next; /* running list, in admission order */
};

typedef struct sched_add_args {
    const int32_t *prompt;    /* [n_prompt], copied */
    uint32_t n_prompt;
    uint32_t max_new;
    int32_t priority;
    const vki_sampling_params *sampling; /* kept by pointer: must outlive the sequence */
    uint64_t seed;
    void (*logits_hook)(void *ctx, float *logits, uint32_t n_vocab); /* copied into the plan */
    void *logits_hook_ctx;
    const uint32_t *token_mask; /* kept by pointer, copied into the plan: the owner refills the
                                   bitset before each step (must outlive the sequence) */
    void (*hidden_hook)(void *ctx, const float *rows, uint32_t n_rows, uint32_t d, uint32_t pos0);
    void *hidden_hook_ctx;    /* copied into the plan (embeddings) */
    bool no_reuse;            /* never start from cached prefix blocks (embeddings need every
                                 position's hidden state); its own blocks are still sealed */
    void (*logits_sink)(void *ctx, const float *rows, uint32_t n_rows, uint32_t n_vocab, uint32_t pos0,
                        bool sampled); /* copied into the plan with the two below (logits outputs) */
    void *logits_sink_ctx;
    bool sink_sampled;
    uint32_t sink_rows_end;
    uint32_t beam_width;      /* > 1: a beam group (see sched_seq); 0 or 1: a plain sequence */
    void *const *beam_sink_ctx; /* beam groups: [beam_width] each beam's logits_sink_ctx (the lead's
                                   is [0]; followers get the sink and sink_sampled, no context rows),
                                   each must outlive the group; NULL: followers have no sink */
    void *user;
} sched_add_args;

/* What one tick schedules. Pointers stay valid until the next sched_plan/sched_remove. */
typedef struct sched_tick {
    vki_step_plan plan;       /* decode sequences first, then prefill chunks */
    sched_seq *const *seqs;   /* [plan.n_seqs] the sequence of each plan entry */
    uint32_t n_context, n_generation;        /* plan entries by phase */
    uint32_t n_context_tokens;               /* prefill tokens in the plan */
    uint32_t n_sampled;                      /* entries with want_token: outs for sched_commit */
    uint32_t n_admitted;                     /* sequences that left the queue this tick */
    uint32_t n_paused;                       /* sequences paused this tick */
    uint32_t n_ghosts;                       /* STATIC padding members decoding in the plan */
} sched_tick;

typedef struct sched_stats {
    uint32_t queued;          /* in the queue, paused ones included */
    uint32_t running;
    uint32_t paused;          /* paused and not yet resumed */
    uint32_t max_running;
    sched_kv_stats kv;
    uint64_t reused_tokens;   /* tokens whose KV came from the cache instead of a prefill */
    uint64_t pauses;          /* cumulative */
    uint32_t pinned_refs;     /* block references held by pins */
} sched_stats;

/* VKI_ERR_INVALID_ARG when a size is 0 or chunk_size is not a multiple of block_size. */
vki_status sched_create(const sched_params *p, sched **out);
/* Frees the scheduler and every sequence still in it. */
void sched_destroy(sched *s);

/* Checks a request's sizes against the scheduler (prompt and max_new >= 1, prompt + max_new
 * within max_ctx, and the blocks it needs within the pool). On failure writes a message naming
 * the field. O(1). Reads only the parameters fixed at create: safe from any thread. */
vki_status sched_validate(const sched *s, uint32_t n_prompt, uint32_t max_new, char *msg, size_t msg_cap);

/* Queues a new sequence (tokens copied). VKI_RETRY_QUEUE_FULL past max_queue,
 * VKI_ERR_INVALID_ARG (see sched_validate), VKI_ERR_OUT_OF_HOST_MEMORY. O(n_prompt + log queue). */
vki_status sched_add(sched *s, const sched_add_args *a, sched_seq **out);

/* Removes a sequence in any state (a beam group: pass its lead; the whole group goes), returning
 * its blocks (full ones stay cached) and slot, and frees it — except a STATIC batch member while other members still run, which becomes a ghost
 * (the owner must forget it either way). Not between sched_plan and sched_commit.
 * O(blocks held + log queue; STATIC: + running). */
void sched_remove(sched *s, sched_seq *q);

/* Plans the next step. tick->plan.n_seqs == 0 when nothing can run. VKI_ERR_INTERNAL if an
 * invariant broke (a bug). */
vki_status sched_plan(sched *s, sched_tick *tick);

/* The engine ran tick->plan: KV now holds the new tokens (full blocks get sealed for reuse) and
 * outs[0..tick->n_sampled) are the sampled tokens of the want_token entries, in plan order; each
 * is appended to its sequence. The owner then removes the sequences that finished. If the step
 * failed, do not call this: remove the plan's sequences instead (their KV is undefined). */
void sched_commit(sched *s, const sched_tick *tick, const vki_step_out *outs);

/* Overlapped decoding: the owner submits q's next decode step itself, before the step in flight
 * is committed (it commits both with sched_commit, the second as a tick of its own, and calls
 * sched_plan only after that). Grows q's block table to cover positions [0, n_tokens) from q's
 * own reservation (blocks it may still allocate) and the free pool, pausing no one. False, with
 * nothing changed, when q has no reservation left or the pool no block. O(blocks grown). */
bool sched_grow_ahead(sched *s, sched_seq *q, uint32_t n_tokens);

/* Beam search, after sched_commit of a step where every beam of lead's group sampled: beam b
 * continues beam parent[b]'s sequence with token[b] instead of its own sample. Every beam's KV
 * table becomes its parent's: full blocks are shared (reference counted), the partial last block
 * stays with one child per parent and is copied for the others (page copies done first in the
 * next step). The first reorder after the prompt (parents all 0) starts the idle followers.
 * Costs O(width * (tokens + blocks)) host work and at most width - 1 page copies (each
 * 2 * n_layer page transfers). VKI_ERR_INVALID_ARG for a parent out of range or an idle parent;
 * VKI_ERR_INTERNAL if the pool had no block for a copy (the reservation makes that a bug). */
vki_status sched_beam_reorder(sched *s, sched_seq *lead, const uint32_t *parent, const int32_t *token);

/* Validation of a beam request (width >= 1): sched_validate, then width <= max running sequences,
 * the group's blocks within the pool, no sliding windows and not under STATIC. */
vki_status sched_validate_beams(const sched *s, uint32_t n_prompt, uint32_t max_new, uint32_t width, char *msg,
                                size_t msg_cap);
/* Pins (stateful sessions): references to a sequence's sealed leading blocks held outside any
 * sequence, so that its KV outlives it (never evicted) until the pin is released; the next
 * sequence with that prefix finds the blocks by the usual prefix lookup and computes only what
 * follows. A pinned block counts as used (it is not allocatable). */
typedef struct sched_pin {
    uint32_t *blocks;         /* [n] in position order */
    uint32_t n;
} sched_pin;

/* Pins q's sealed blocks up to its first released one (windows) in *out (replacing nothing: out
 * must be empty). Nothing is pinned when reuse is off. O(blocks). VKI_ERR_OUT_OF_HOST_MEMORY. */
vki_status sched_pin_seq(sched *s, const sched_seq *q, sched_pin *out);
/* Drops the pin's references (its blocks become cached, evictable, or stay with their other
 * holders) and empties it. O(blocks). */
void sched_pin_release(sched *s, sched_pin *p);

/* Pins restored from outside (a session file) for tokens[0, n * block_size): sched_pin_prepare
 * takes the longest cached prefix by the usual lookup (those blocks already hold that KV) and
 * allocates the other *n_fresh blocks, the last ones of out->blocks (unsealed, contents
 * undefined); the caller writes their KV, then sched_pin_commit seals them in order (from then on
 * they are a cached prefix like any other, found by the next sequence's lookup), or
 * sched_pin_release gives everything back (unsealed blocks go to the free list: their contents
 * are never found). Nothing else may run in between. Restored KV never takes what running
 * sequences may still allocate: *room is the blocks allocatable beyond their reservations.
 * VKI_ERR_INVALID_ARG without block reuse or for n past the longest sequence or the pool;
 * VKI_ERR_OUT_OF_DEVICE_MEMORY (nothing taken) when n - prefix blocks (+ the prefix's cached
 * ones) exceed *room; VKI_ERR_OUT_OF_HOST_MEMORY. O(n * block_size). */
vki_status sched_pin_prepare(sched *s, const int32_t *tokens, uint32_t n, sched_pin *out, uint32_t *n_fresh,
                             uint32_t *room);
void sched_pin_commit(sched *s, const int32_t *tokens, sched_pin *p, uint32_t n_fresh);

void sched_get_stats(const sched *s, sched_stats *st);
uint32_t sched_queue_len(const sched *s);
/* Whether max_batch_size sequences run: no queued one can be admitted before one leaves. */
bool sched_batch_full(const sched *s);
/* Whether the next sched_plan, with the running sequences decoding, would admit the head of the
 * queue: a slot, the step's budgets and its policy's blocks allow it (a tick that pauses admits
 * nothing, which this does not foresee: it may say true where the plan would not). False with
 * an empty queue. O(the head's prompt blocks) (its prefix lookup). */
bool sched_head_admissible(sched *s);

/* A sequence with all its tokens: the owner must remove it (it is never scheduled again). */
static inline bool sched_seq_done(const sched_seq *q) { return q->n_tokens >= q->cap; }
static inline uint32_t sched_seq_generated(const sched_seq *q) { return q->n_tokens - q->n_prompt; }

/* Test/debug: every invariant of the scheduler and its block manager, O(pool + sequences *
 * blocks): states and lists, slots unique, ref counts equal the block tables, the block tables
 * cover the computed KV, shared blocks sealed, the policy's reservation covered. */
vki_status sched_check(const sched *s, char *msg, size_t msg_cap);

#endif
