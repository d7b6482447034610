/* The batch manager (internal side): the tick-loop thread over the scheduler and an executor.
 * The public API is the "batch manager" section of vkinfer.h; vki_batch_manager_create (the
 * engine adapter) wraps bm_create with a bm_backend over a vki_engine.
 *
 *   batch.c          the worker thread, create/destroy, submit/cancel/notify, the tick
 *   batch_request.c  request copies, validation, the request list, the in-flight id map
 *   batch_grammar.c  structured output: grammars compiled at submission, shared automata, the
 *                    per-step token masks and the state advance after each token
 *   batch_stats.c    the per-tick stats JSON
 *
 * Locking: one mutex guards what other threads touch (inbox, cancel list, in-flight map,
 * waiting count, shutdown flags, seed generator). The scheduler, the executor and every
 * request's generation state belong to the worker thread alone; no callback runs with the
 * mutex held. */
#ifndef VKI_HOST_BATCH_H
#define VKI_HOST_BATCH_H

#include <pthread.h>

#include "host/batch/backend.h"
#include "host/grammar/grammar.h"
#include "scheduler/sched.h"
#include "vkinfer.h"

#define BM_MSG_CAP 192

/* One accepted (or refused) request: a deep copy of the vki_request plus its generation state. */
typedef struct bm_req {
    uint64_t id;
    uint64_t serial;           /* unique per manager: tells apart two requests with one id */
    int32_t *prompt;           /* [n_prompt] until handed to the scheduler */
    uint32_t n_prompt, max_new;
    int32_t *end_ids;          /* [n_end_ids] */
    uint32_t n_end_ids;
    int32_t *stop_ids;         /* [n_stop_ids] */
    uint32_t n_stop_ids;
    vki_sampling_params sampling; /* .logit_bias points to bias */
    vki_logit_bias *bias;      /* [sampling.n_logit_bias] */
    bool streaming;
    bool ignore_eos;           /* the model's end-of-generation ids do not end it */
    int32_t priority;
    uint64_t session_id;       /* 0: none (batch_session.c) */
    bool want_lp;              /* logprobs or top_logprobs asked for */
    uint32_t n_top;
    uint64_t seed;             /* resolved */
    uint32_t min_tokens;       /* end ids banned until this many tokens were generated */
    vki_logit_bias *ban;       /* [n_ban] bias + the -inf bans of min_tokens (while active) */
    uint32_t n_ban;
    uint32_t n_bias;           /* the request's own biases (first n_bias entries of ban) */
    vki_pooling pooling;       /* embedding request when != NONE */
    double *emb_sum;           /* [n_embd] sum of the pooled rows (MEAN) */
    float *emb;                /* [n_embd] the last row (LAST), then the result */
    uint32_t n_pooled;         /* rows summed */
    vki_logits_fn processor;   /* logits post-processor or NULL */
    void *processor_user;
    /* structured output */
    gram_grammar *grammar;     /* compiled at submission; the worker hands it to an automaton */
    char *gbnf;                /* [gbnf_len] its GBNF text (a schema's conversion): the key under
                                  which requests share one automaton */
    size_t gbnf_len;
    struct bm_gram_entry *gram;/* worker: the shared automaton's cache entry, or NULL */
    gram_req gr;               /* worker: the request's parse state and mask buffer */
    bool no_token;             /* worker: this step's mask allows no token */
    char gram_error[BM_MSG_CAP]; /* worker: why the grammar could not give a mask */
    bool drop_last;            /* worker: the last appended token is a placeholder for "none" */
    vki_response_fn respond;   /* push: the submitter's callback; else cb->send_response */
    void *respond_user;
    char error[BM_MSG_CAP];    /* non-empty: refused at intake with this message */
    vki_status status;         /* the cause reported with a final error response */
    /* worker-thread state */
    sched_seq *seq;            /* in the scheduler (NULL before intake) */
    float *lp;                 /* [lp_cap] logprob of each generated token, when want_lp; grown
                                  by doubling as tokens come (max_new may be the whole context) */
    int32_t *top_tok;          /* [lp_cap][n_top] */
    float *top_lp;             /* [lp_cap][n_top] */
    uint32_t lp_cap;
    double cum_lp;
    uint32_t n_sent;           /* generated tokens already delivered (streaming) */
    /* logits outputs (batch_logits.c) */
    bool want_ctx_logits, want_gen_logits;
    float *ctx_logits;         /* [n_prompt][n_vocab] raw logits by prompt position, or NULL */
    float *gen_logits;         /* [gen_cap][n_vocab] row k: the logits generated token k came from */
    uint32_t gen_cap;
    bool ctx_sent;             /* context logits went out with a response */
    bool logits_oom;           /* a generation row could not be stored: the request fails */
    /* beam search (batch_beam.c) */
    uint32_t beam_width;       /* 1: none */
    float length_penalty;
    vki_early_stopping early_stopping;
    struct bm_beam *beam;      /* worker: the search state, or NULL */
    struct bm_req *next;       /* inbox / request list link */
    struct bm_req *hnext;      /* in-flight map chain */
} bm_req;

struct vki_request_list {
    vki_batch_manager *bm;     /* validates against its model */
    bm_req *head, *tail;
    uint32_t n;
    int32_t max;               /* -1: unbounded */
};

typedef struct bm_id_map {
    bm_req **buckets;          /* [mask + 1] */
    uint32_t mask;
    uint32_t n;
} bm_id_map;

typedef struct bm_cancel {
    uint64_t id, serial;
} bm_cancel;

/* A session file's save or restore (batch_session_file.c): the caller's thread does the file I/O
 * and waits while the worker copies the KV at a tick boundary (batch_session.c). */
typedef struct bm_sess_job {
    bool restore;
    uint64_t session_id;
    int32_t *tokens;           /* [n_tokens] the conversation: restore's input (the caller's),
                                  save's output (malloc'd by the worker, freed by the caller) */
    uint32_t n_tokens;
    uint32_t n_kv;             /* tokens of kv: whole pages of this backend */
    uint8_t *kv;               /* [n_kv][kv token bytes] in the backend's kv_read layout, owned as
                                  tokens is */
    vki_status st;             /* the worker's answer, with err */
    char err[256];
    bool done;                 /* under mu: the worker answered */
    struct bm_sess_job *next;
} bm_sess_job;

/* A lookahead step (batch.c): the next decode step of sequences whose step is still in flight,
 * submitted before that step is waited for; each row's token is VKI_TOKEN_PREV. */
typedef struct bm_ahead {
    bool pending;              /* submitted, not yet waited */
    bool masks_due;            /* submitted with its grammar rows' masks later (be.masks) */
    uint32_t n;                /* rows */
    sched_seq **seqs;          /* [max_seqs] each row's sequence; NULL once it left the scheduler */
    vki_step_seq *rows;        /* [max_seqs] */
} bm_ahead;

struct vki_batch_manager {
    bm_backend be;
    uint64_t steps_reused0;  /* be.steps_reused when the manager started (warm-up steps before) */
    vki_batch_params p;
    vki_batch_callbacks cb;
    bool has_cb;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* guarded by mu */
    bm_req *inbox_head, *inbox_tail;
    uint32_t inbox_len;
    uint32_t sched_waiting;    /* the scheduler's queue length as of the last tick + intake since */
    bm_cancel *cancels;        /* [n_cancels] pending cancellations */
    uint32_t n_cancels, cancels_cap;
    bm_id_map inflight;        /* id -> request, from acceptance to the final response */
    bool shutdown, abort;
    bool lost;                 /* under mu: a step reported device loss; submissions are refused */
    bool notified;
    uint64_t rng;              /* seed generator state (splitmix64) */
    uint64_t next_serial;
    uint64_t next_auto_id;     /* ids vki_generate picks: this | 1 << 63 */
    int32_t *eog_ids;          /* [n_eog] the backend's end-of-generation ids (min_tokens bans, the
                                  end of a grammar); set at creation */
    uint32_t n_eog;
    /* worker thread only */
    sched *s;
    vki_step_out *outs;        /* [max_seqs] */
    bm_ahead ahead[2];         /* with be.submit: two, as a lookahead is submitted while the one
                                  before it is still in flight */
    uint32_t ahead_cur;        /* the older of the pending ones */
    uint32_t *spare_mask;      /* [vocab_size / 32, rounded up] zeros: the mask of a lookahead's
                                  grammar row whose request left before its masks were given */
    uint64_t n_ahead;          /* lookahead steps submitted (stats) */
    uint32_t n_active;         /* requests in the scheduler */
    uint64_t iteration;
    uint64_t n_finished;       /* final responses sent (worker thread) */
    /* structured output (worker thread; built on the first constrained request) */
    gram_vocab *vocab;         /* the executor's vocabulary as a byte trie */
    struct bm_gram_entry *grams; /* compiled grammars by GBNF text (list, most recent first) */
    uint32_t n_grams;
    double gram_us;            /* host time in grammar work, summed (stats) */
    uint64_t gram_tokens;      /* constrained tokens it covers */
    /* stateful sessions (batch_session.c) */
    uint64_t *session_ends;    /* under mu: [n_session_ends] vki_batch_session_end calls to apply */
    uint32_t n_session_ends, session_ends_cap;
    struct bm_session *sess_head, *sess_tail; /* worker: least recently used first */
    uint32_t n_sessions;       /* worker: sessions in the list */
    uint32_t session_cap;      /* worker: session_max_blocks resolved */
    bm_sess_job *sess_jobs;    /* under mu: session file copies for the worker, oldest first */
    uint32_t sess_callers;     /* under mu: threads inside a session file call (destroy waits) */
    pthread_cond_t sess_cv;    /* a job is done, or a caller left */
};

/* Creates a manager over `be` (copied; be->ctx must outlive the manager) and starts its worker.
 * cb may be NULL. VKI_ERR_INVALID_ARG for a bad parameter (chunk_size not a multiple of the
 * page size, get_requests without send_response, an empty backend). */
vki_status bm_create(const bm_backend *be, const vki_batch_params *p, const vki_batch_callbacks *cb,
                     vki_batch_manager **out);

/* An id for a request of vki_generate: from a counter in the top half of the id space (where
 * callers rarely number their own), so a clash, answered VKI_ERR_DUPLICATE_ID, is retried. */
uint64_t bm_auto_id(vki_batch_manager *bm);
/* Whether the calling thread is bm's worker (a callback of bm is running). */
bool bm_on_worker(const vki_batch_manager *bm);

/* batch_request.c */
vki_status bm_validate(const vki_batch_manager *bm, const vki_request *r, char *msg, size_t cap);
vki_status bm_req_copy(const vki_request *r, bm_req **out);  /* deep copy, no validation */
void bm_req_free(bm_req *q);
void bm_request_list_free(vki_request_list *l);
vki_status bm_map_init(bm_id_map *m);
void bm_map_free(bm_id_map *m);
bm_req *bm_map_find(const bm_id_map *m, uint64_t id);
vki_status bm_map_insert(bm_id_map *m, bm_req *q); /* id not present */
void bm_map_remove(bm_id_map *m, bm_req *q);
uint64_t bm_next_seed(uint64_t *state);

/* batch_grammar.c (structured output). bm_constraint_compile runs on the submitting thread;
 * the others on the worker. */
vki_status bm_constraint_compile(const vki_batch_manager *bm, const vki_request *r, bm_req *q, char *msg, size_t cap);
vki_status bm_constraint_attach(vki_batch_manager *bm, bm_req *q, char *msg, size_t cap);
void bm_constraint_detach(vki_batch_manager *bm, bm_req *q);
/* Fills the masks of the plan's constrained rows that sample this step. */
void bm_constraint_masks(vki_batch_manager *bm, const sched_tick *t);
/* After q sampled tok (not an end token that finished it): NONE, STOP (complete, no end token
 * may follow) or ERROR (msg filled). */
vki_finish_reason bm_constraint_advance(vki_batch_manager *bm, bm_req *q, int32_t tok, char *msg, size_t cap);
void bm_grammar_free_all(vki_batch_manager *bm);

/* batch_logits.c (logits outputs): the cap at submission (any thread); on the worker: the
 * context array and the engine sink (fills *a), and the response fields of a response that
 * carries generated tokens [from, from + r->n_tokens). */
vki_status bm_logits_validate(const vki_batch_manager *bm, const vki_request *r, char *msg, size_t cap);
vki_status bm_logits_attach(vki_batch_manager *bm, bm_req *q, sched_add_args *a);
/* context rows [pos0, pos0 + n_rows) into q->ctx_logits (the part before n_prompt) */
void bm_logits_context(bm_req *q, const float *rows, uint32_t n_rows, uint32_t V, uint32_t pos0);
void bm_logits_fill(const vki_batch_manager *bm, bm_req *q, vki_response *r, uint32_t from);

/* batch_beam.c (beam search). bm_beam_validate on any thread; the rest on the worker:
 * attach (fills *a) before sched_add; row stores a beam's sampled row of this step; step runs the
 * search once every beam of q reported (after sched_commit): the next tokens and the scheduler's
 * reorder, or q's end (returns the finish reason, NONE to go on); fill writes a response's
 * beam fields (with logprobs / generation logits, each returned beam's by lineage). A beam
 * group's logits sink is batch_beam.c's own (one context per beam, set up by attach). */
vki_status bm_beam_validate(const vki_batch_manager *bm, const vki_request *r, char *msg, size_t cap);
/* Host bytes a beam request's lineage of logprobs / generation rows may take besides the rows
 * themselves (0 without beams or without those outputs): counted against max_logits_bytes. */
uint64_t bm_beam_history_bytes(const vki_request *r, uint32_t n_vocab);
/* The in-place gather of generation rows (exposed for its test): slot d < n_dst of rows
 * ([n_slots][V]) becomes a copy of the row that was at slot src[d] before the call; slots
 * >= n_dst are left in any state. One spare row breaks cycles; scratch is 2 * n_slots + n_dst
 * words and n_slots bytes. O(n_slots + n_dst * V). */
void bm_gather_rows(float *rows, size_t V, const uint32_t *src, uint32_t n_dst, uint32_t n_slots, float *spare,
                    uint32_t *scratch, uint8_t *done);
vki_status bm_beam_attach(vki_batch_manager *bm, bm_req *q, sched_add_args *a);
void bm_beam_row(bm_req *q, const sched_seq *seq, const vki_step_out *o);
vki_finish_reason bm_beam_step(vki_batch_manager *bm, bm_req *q);
void bm_beam_fill(vki_batch_manager *bm, bm_req *q, vki_response *r);
void bm_beam_free(bm_req *q);
/* batch.c: why token tok would end q (EOS for an end id or the model's end of generation, STOP
 * for a stop id), else NONE. */
vki_finish_reason bm_end_reason(const vki_batch_manager *bm, const bm_req *q, int32_t tok);
/* batch_session.c (worker thread): a request of a session enters the scheduler / finishes (before
 * sched_remove: its blocks are pinned for the session); the end calls taken from the mutex;
 * expiry and pressure after a plan that admitted nothing while requests wait; destroy. */
void bm_session_enter(vki_batch_manager *bm, const bm_req *q);
void bm_session_finish(vki_batch_manager *bm, const bm_req *q);
void bm_session_apply_ends(vki_batch_manager *bm, const uint64_t *ids, uint32_t n);
void bm_session_tick(vki_batch_manager *bm, const sched_tick *t);
void bm_session_free_all(vki_batch_manager *bm);
/* seconds until the oldest idle session expires (the worker's idle wait), or < 0: none */
double bm_session_next_expiry_s(const vki_batch_manager *bm);
/* The session file jobs taken from the mutex: each done (with its status) and signalled. */
void bm_session_run_jobs(vki_batch_manager *bm, bm_sess_job *jobs);
/* Bytes of one token's KV in the backend's kv_read layout (0: the backend cannot copy KV). */
uint64_t bm_kv_token_bytes(const bm_backend *be);

/* batch_stats.c: emits the stats JSON of one tick through cb.stats. */
void bm_emit_stats(vki_batch_manager *bm, const sched_tick *t, double step_ms);

#endif
