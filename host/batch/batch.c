/* The batch manager: one worker thread runs the tick loop
 *
 *   intake (push inbox + get_requests) -> stop signals and cancellations -> sched_plan ->
 *   executor step -> sched_commit -> stop checks and responses -> finished requests leave ->
 *   stats JSON
 *
 * With an executor that can keep two steps in flight (be.submit / be.wait), a step whose rows
 * all decode (no post-processor, logits outputs, beams, nor the step where min_tokens' bans
 * lift), with nobody waiting who could be admitted now (sched_head_admissible), gets a
 * lookahead: the same sequences' next decode step, submitted before the step is waited for,
 * each token read by the executor from the step's sampler (VKI_TOKEN_PREV; penalties count it
 * there too). The host's work of a tick (reading tokens, stop checks, responses, the next
 * submission) then runs while the device computes. A grammar row's mask depends on the token in
 * flight: such a lookahead is submitted with its masks later (be.masks), given once the step's
 * tokens moved the grammars, while the device runs the lookahead's forward pass. The next tick
 * waits for the lookahead instead of planning (and may submit the lookahead's own lookahead
 * first); a sequence that finished in between has its row computed and dropped. Tokens are the same as without it; a request
 * arriving meanwhile, or one whose blocks a sequence ending meanwhile frees, is admitted one step
 * later.
 *
 * and sleeps on a condition variable when there is nothing to do (submit, cancel, notify and
 * destroy wake it; with a get_requests callback it also wakes every idle_poll_us to poll).
 * Host cost of a tick: the scheduler's (see sched.h) plus O(sampled tokens) for responses and
 * O(cancellations) for stop handling; the stats JSON, when enabled, is O(1) fields. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/batch/batch.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- responses ---------------------------------------------------------------------------- */

/* Delivers generated tokens [from, gen) of q. final: q leaves the in-flight map first (so its
 * id may be reused from inside the callback), and the caller frees q afterwards. */
static void respond(vki_batch_manager *bm, bm_req *q, uint32_t from, bool final, vki_finish_reason why,
                    const char *error)
{
    const sched_seq *s = q->seq;
    uint32_t gen = s ? sched_seq_generated(s) - q->drop_last : 0; /* a "no token" placeholder never shows */
    vki_response r = {
        .id = q->id,
        .tokens = s && gen > from ? s->tokens + s->n_prompt + from : NULL,
        .n_tokens = gen > from ? gen - from : 0,
        .n_top = q->n_top,
        .cum_logprob = q->cum_lp,
        .seq_len = s ? s->n_tokens - q->drop_last : q->n_prompt,
        .final = final,
        .finish = final ? why : VKI_FINISH_NONE,
        .error = why == VKI_FINISH_ERROR ? error : NULL,
        .status = why == VKI_FINISH_ERROR ? (q->status != VKI_OK ? q->status : VKI_ERR_INTERNAL) : VKI_OK,
        .seed = q->seed,
        .n_cached = s ? s->n_cached : 0,
    };
    if (final && q->pooling != VKI_POOL_NONE) { /* the one sampled token is not an output */
        r.tokens = NULL;
        r.n_tokens = 0;
        r.embedding = why == VKI_FINISH_LENGTH ? q->emb : NULL;
        r.n_embd = r.embedding ? bm->be.n_embd : 0;
    }
    if (q->want_lp && r.n_tokens) {
        r.logprobs = q->lp + from;
        if (q->n_top) {
            r.top_tokens = q->top_tok + (size_t)from * q->n_top;
            r.top_logprobs = q->top_lp + (size_t)from * q->n_top;
        }
    }
    bm_logits_fill(bm, q, &r, from);
    if (q->beam)
        bm_beam_fill(bm, q, &r);
    q->n_sent = gen;
    if (final) {
        pthread_mutex_lock(&bm->mu);
        bm_map_remove(&bm->inflight, q);
        pthread_mutex_unlock(&bm->mu);
    }
    q->respond(q->respond_user, &r);
}

/* An embedding request finishes: mean (or last row), then unit length. O(n_embd). */
static void pool_result(vki_batch_manager *bm, bm_req *q)
{
    uint32_t d = bm->be.n_embd;
    if (q->pooling == VKI_POOL_MEAN)
        for (uint32_t i = 0; i < d; i++)
            q->emb[i] = (float)(q->emb_sum[i] / (q->n_pooled ? q->n_pooled : 1));
    double norm = 0;
    for (uint32_t i = 0; i < d; i++)
        norm += (double)q->emb[i] * q->emb[i];
    norm = sqrt(norm);
    for (uint32_t i = 0; norm > 0 && i < d; i++)
        q->emb[i] = (float)(q->emb[i] / norm);
}

/* Final response, then q leaves the scheduler and is freed. Streaming requests get the tokens
 * not yet delivered (none, normally); others get everything they generated. */
static void finish(vki_batch_manager *bm, bm_req *q, vki_finish_reason why, const char *error)
{
    bm->n_finished++;
    if (q->pooling != VKI_POOL_NONE && why == VKI_FINISH_LENGTH)
        pool_result(bm, q);
    respond(bm, q, q->streaming ? q->n_sent : 0, true, why, error);
    if (q->seq && q->session_id)
        bm_session_finish(bm, q); /* pins its blocks before they leave with the sequence */
    if (q->seq) {
        for (uint32_t a = 0; a < 2; a++) /* its row of a lookahead in flight is computed and dropped */
            for (uint32_t i = 0; bm->ahead[a].pending && i < bm->ahead[a].n; i++)
                if (bm->ahead[a].seqs[i] == q->seq) {
                    bm->ahead[a].seqs[i] = NULL;
                    if (bm->ahead[a].rows[i].token_mask) /* q's mask leaves with q */
                        bm->ahead[a].rows[i].token_mask = bm->spare_mask;
                }
        sched_remove(bm->s, q->seq);
        bm->n_active--;
    }
    bm_constraint_detach(bm, q);
    bm_req_free(q);
}

/* Refusal of a request that never entered the scheduler (invalid or duplicate id): it is not
 * in the in-flight map, so respond directly. */
static void refuse(bm_req *q, vki_status status, const char *error)
{
    vki_response r = {.id = q->id, .seq_len = q->n_prompt, .final = true, .finish = VKI_FINISH_ERROR,
                      .error = error, .status = status, .seed = q->seed};
    q->respond(q->respond_user, &r);
    bm_req_free(q);
}

/* ---- intake ------------------------------------------------------------------------------- */

/* Hands an accepted request to the scheduler (worker thread). */
/* The engine calls this (on the worker thread, inside the step) for a request with a logits
 * post-processor: the user's function sees the request id and the tokens so far. */
static void processor_hook(void *ctx, float *logits, uint32_t n_vocab)
{
    const bm_req *q = ctx;
    q->processor(q->processor_user, q->id, logits, n_vocab, q->seq->tokens, q->seq->n_tokens);
}

/* Embedding requests: the engine hands over the final hidden rows of each computed chunk.
 * A chunk at position 0 starts over (a recompute after a pause). O(n_rows * d). */
static void hidden_hook(void *ctx, const float *rows, uint32_t n_rows, uint32_t d, uint32_t pos0)
{
    bm_req *q = ctx;
    if (pos0 == 0) {
        memset(q->emb_sum, 0, (size_t)d * sizeof *q->emb_sum);
        q->n_pooled = 0;
    }
    for (uint32_t r = 0; r < n_rows; r++)
        for (uint32_t i = 0; i < d; i++)
            q->emb_sum[i] += rows[(size_t)r * d + i];
    if (n_rows)
        memcpy(q->emb, rows + (size_t)(n_rows - 1) * d, (size_t)d * sizeof *q->emb);
    q->n_pooled += n_rows;
}

/* min_tokens: the request samples with the tokens that would end it banned (-inf) until it has
 * that many; q->sampling points at the widened list meanwhile (the scheduler reads it by
 * pointer every step). O(bias + end ids). */
static vki_status ban_end_ids(vki_batch_manager *bm, bm_req *q)
{
    bool eog = !q->n_end_ids && !q->ignore_eos;
    size_t n = (size_t)q->sampling.n_logit_bias + q->n_end_ids + q->n_stop_ids + (eog ? bm->n_eog : 0), k = 0;
    if (!(q->ban = malloc(n * sizeof *q->ban)))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < q->sampling.n_logit_bias; i++)
        q->ban[k++] = q->sampling.logit_bias[i];
    for (uint32_t i = 0; i < q->n_end_ids; i++)
        q->ban[k++] = (vki_logit_bias){q->end_ids[i], -INFINITY};
    for (uint32_t i = 0; i < q->n_stop_ids; i++)
        q->ban[k++] = (vki_logit_bias){q->stop_ids[i], -INFINITY};
    for (uint32_t i = 0; eog && i < bm->n_eog; i++)
        q->ban[k++] = (vki_logit_bias){bm->eog_ids[i], -INFINITY};
    q->n_ban = (uint32_t)k;
    q->n_bias = q->sampling.n_logit_bias;
    q->sampling.logit_bias = q->ban;
    q->sampling.n_logit_bias = q->n_ban;
    return VKI_OK;
}

static void enter_scheduler(vki_batch_manager *bm, bm_req *q)
{
    vki_status st = VKI_OK;
    pthread_mutex_lock(&bm->mu);
    bool lost = bm->lost;
    pthread_mutex_unlock(&bm->mu);
    if (lost) { /* submitted while the failing step ran */
        q->status = VKI_ERR_DEVICE_LOST;
        finish(bm, q, VKI_FINISH_ERROR, "the GPU device was lost; the engine must be recovered");
        return;
    }
    bool embed = q->pooling != VKI_POOL_NONE;
    if (embed) {
        q->emb_sum = calloc(bm->be.n_embd ? bm->be.n_embd : 1, sizeof *q->emb_sum);
        q->emb = calloc(bm->be.n_embd ? bm->be.n_embd : 1, sizeof *q->emb);
        if (!q->emb_sum || !q->emb)
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    char msg[BM_MSG_CAP] = "";
    if (st == VKI_OK)
        st = bm_constraint_attach(bm, q, msg, sizeof msg);
    if (st == VKI_OK && q->min_tokens)
        st = ban_end_ids(bm, q);
    sched_add_args a = {.prompt = q->prompt, .n_prompt = q->n_prompt, .max_new = q->max_new, .priority = q->priority,
                        .sampling = &q->sampling, .seed = q->seed, .user = q,
                        .logits_hook = q->processor ? processor_hook : NULL, .logits_hook_ctx = q,
                        .token_mask = q->gram ? q->gr.mask : NULL,
                        .hidden_hook = embed ? hidden_hook : NULL, .hidden_hook_ctx = q, .no_reuse = embed};
    if (st == VKI_OK)
        st = bm_logits_attach(bm, q, &a);
    if (st == VKI_OK)
        st = bm_beam_attach(bm, q, &a);
    if (st == VKI_OK)
        st = sched_add(bm->s, &a, &q->seq);
    if (st != VKI_OK) {
        if (!msg[0])
            snprintf(msg, sizeof msg, "request not queued: %s", vki_status_str(st));
        q->status = st;
        finish(bm, q, VKI_FINISH_ERROR, msg);
        return;
    }
    bm->n_active++;
    if (q->session_id)
        bm_session_enter(bm, q);
    free(q->prompt); /* the scheduler has its own copy */
    q->prompt = NULL;
}

/* Accepts the requests get_requests added: refusals get their final error response, the rest
 * enter the in-flight map (duplicate ids are refused) and the scheduler. */
static void intake_callback(vki_batch_manager *bm, int32_t max)
{
    vki_request_list l = {.bm = bm, .max = max};
    bm->cb.get_requests(bm->cb.user, max, &l);
    for (bm_req *q = l.head, *next; q; q = next) {
        next = q->next;
        q->next = NULL;
        q->respond = bm->cb.send_response;
        q->respond_user = bm->cb.user;
        pthread_mutex_lock(&bm->mu);
        q->seed = q->sampling.has_seed ? q->sampling.seed : bm_next_seed(&bm->rng);
        bool dup = !q->error[0] && bm_map_find(&bm->inflight, q->id);
        bool ok = !q->error[0] && !dup && bm_map_insert(&bm->inflight, q) == VKI_OK;
        if (ok) {
            q->serial = bm->next_serial++;
            bm->sched_waiting++;
        }
        pthread_mutex_unlock(&bm->mu);
        if (ok)
            enter_scheduler(bm, q);
        else if (dup)
            refuse(q, VKI_ERR_DUPLICATE_ID, "id: a request with this id is in flight");
        else if (q->error[0])
            refuse(q, VKI_ERR_INVALID_ARG, q->error);
        else
            refuse(q, VKI_ERR_OUT_OF_HOST_MEMORY, "request not queued: out of host memory");
    }
}

/* Cancels the request with this id if it is still the one that was asked about (serial;
 * UINT64_MAX = whichever has the id: stop signals). Unknown ids are ignored. */
static void cancel_one(vki_batch_manager *bm, uint64_t id, uint64_t serial)
{
    pthread_mutex_lock(&bm->mu);
    bm_req *q = bm_map_find(&bm->inflight, id);
    pthread_mutex_unlock(&bm->mu);
    if (q && q->seq && (serial == UINT64_MAX || q->serial == serial))
        finish(bm, q, VKI_FINISH_CANCELLED, NULL);
}

static void poll_stops(vki_batch_manager *bm)
{
    uint64_t ids[64];
    for (;;) {
        uint32_t n = bm->cb.poll_stop_signals(bm->cb.user, ids, 64);
        for (uint32_t i = 0; i < n && i < 64; i++)
            cancel_one(bm, ids[i], UINT64_MAX);
        if (n < 64)
            break;
    }
}

/* Every request still in flight gets `why` (abort: CANCELLED; an internal error: ERROR).
 * O(in flight). */
static void finish_all(vki_batch_manager *bm, vki_finish_reason why, vki_status status, const char *error)
{
    uint32_t i = 0, mask = 0;
    for (;;) {
        bm_req *q = NULL;
        pthread_mutex_lock(&bm->mu);
        if (mask != bm->inflight.mask) /* grown by a submission from a callback: rescan */
            i = 0;
        mask = bm->inflight.mask;
        for (; i <= mask && !q; i += !q)
            for (bm_req *c = bm->inflight.buckets[i]; c && !q; c = c->hnext)
                if (c->seq) /* in the scheduler; newer submissions wait in the inbox */
                    q = c;
        pthread_mutex_unlock(&bm->mu);
        if (!q)
            return;
        q->status = status;
        finish(bm, q, why, error);
    }
}

/* ---- the tick ----------------------------------------------------------------------------- */

/* Room for logprobs of k + 1 tokens: doubling, so a request costs what it generates rather
 * than what max_new_tokens allows. */
static bool lp_reserve(bm_req *q, uint32_t k)
{
    if (k < q->lp_cap)
        return true;
    uint32_t cap = q->lp_cap ? 2 * q->lp_cap : 16;
    if (cap > q->max_new)
        cap = q->max_new > k ? q->max_new : k + 1;
    size_t nt = (size_t)cap * q->n_top;
    float *lp = realloc(q->lp, (size_t)cap * sizeof *lp);
    if (lp)
        q->lp = lp;
    int32_t *tt = nt ? realloc(q->top_tok, nt * sizeof *tt) : NULL;
    if (tt)
        q->top_tok = tt;
    float *tl = nt ? realloc(q->top_lp, nt * sizeof *tl) : NULL;
    if (tl)
        q->top_lp = tl;
    if (!lp || (nt && (!tt || !tl)))
        return false;
    q->lp_cap = cap;
    return true;
}

/* Records the sampled token of q and decides whether q is done. Returns the finish reason. */
static vki_finish_reason apply_token(vki_batch_manager *bm, bm_req *q, const vki_step_out *o)
{
    const sched_seq *s = q->seq;
    uint32_t k = sched_seq_generated(s) - 1;
    int32_t tok = s->tokens[s->n_tokens - 1];
    if (q->ban && k + 1 >= q->min_tokens) { /* min_tokens reached: the request's own biases again */
        q->sampling.logit_bias = q->bias;
        q->sampling.n_logit_bias = q->n_bias;
    }
    if (q->logits_oom || (q->want_lp && !lp_reserve(q, k))) { /* the token without its logprobs is not delivered */
        q->status = VKI_ERR_OUT_OF_HOST_MEMORY;
        q->drop_last = true;
        return VKI_FINISH_ERROR;
    }
    if (q->want_lp) {
        q->lp[k] = o->logprob;
        q->cum_lp += o->logprob;
        for (uint32_t j = 0; j < q->n_top; j++) {
            bool have = j < o->n_top;
            q->top_tok[(size_t)k * q->n_top + j] = have ? o->top_tokens[j] : -1;
            q->top_lp[(size_t)k * q->n_top + j] = have ? o->top_logprobs[j] : -INFINITY;
        }
    }
    vki_finish_reason why = bm_end_reason(bm, q, tok);
    if (why != VKI_FINISH_NONE)
        return why;
    return sched_seq_generated(s) >= q->max_new ? VKI_FINISH_LENGTH : VKI_FINISH_NONE;
}

vki_finish_reason bm_end_reason(const vki_batch_manager *bm, const bm_req *q, int32_t tok)
{
    bool end = false;
    for (uint32_t i = 0; i < q->n_end_ids; i++)
        end |= q->end_ids[i] == tok;
    if (!q->n_end_ids && !q->ignore_eos && bm->be.is_eog)
        end = bm->be.is_eog(bm->be.ctx, tok);
    if (end)
        return VKI_FINISH_EOS;
    for (uint32_t i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == tok)
            return VKI_FINISH_STOP;
    return VKI_FINISH_NONE;
}

/* The request's row sampled no token: its logits were not all finite numbers (checked first:
 * a broken model is what the user must hear about), its grammar admits none here, its grammar's
 * caches failed, or every logit was banned (logit_bias). */
static void no_token(vki_batch_manager *bm, bm_req *q, bool nonfinite)
{
    char msg[BM_MSG_CAP];
    uint32_t pos = q->seq->n_tokens - 1; /* the placeholder stands where the token would have */
    if (nonfinite) {
        snprintf(msg, sizeof msg, "the model produced non-finite logits (NaN/Inf) at position %u (generated "
                 "token %u)%s", pos, sched_seq_generated(q->seq) - 1,
                 q->processor ? " after the logits post-processor" : "");
        q->status = VKI_ERR_NONFINITE;
    } else if (q->gram_error[0]) {
        snprintf(msg, sizeof msg, "%s", q->gram_error);
    } else if (q->gram && q->no_token) {
        snprintf(msg, sizeof msg, "grammar: no token of the vocabulary can continue the output here (the grammar "
                 "admits nothing this model can write after %u generated tokens)", sched_seq_generated(q->seq) - 1);
        q->status = VKI_ERR_INVALID_ARG;
    } else {
        snprintf(msg, sizeof msg, "no token could be sampled: every token is banned by logit_bias%s or has a NaN or "
                 "-inf logit", q->gram ? " or the grammar" : "");
        q->status = VKI_ERR_INVALID_ARG;
    }
    finish(bm, q, VKI_FINISH_ERROR, msg);
}

/* ---- lookahead steps (see the top) ------------------------------------------------------- */

/* Whether row e of sequence q (its step in flight, not yet committed) may be followed by a
 * lookahead row: its request decodes (under its grammar, if any) and has room for two more
 * tokens, and its blocks cover the next position (grown from its reservation when needed). */
static bool ahead_row_ok(vki_batch_manager *bm, sched_seq *q, const vki_step_seq *e)
{
    const bm_req *r = q->user;
    if (!e->want_token || !r || q->ghost || q->lead || r->beam || r->processor || q->logits_sink || q->hidden_hook ||
        (q->token_mask && !r->gram) || (r->gram && (!bm->be.masks || r->no_token)))
        return false; /* no_token: its mask for the step in flight allows nothing, the step ends it */
    /* min_tokens: the step in flight samples token G (0-based), the lookahead G + 1 with the same
     * bans, unless G + 1 is the first the request's own biases apply to (apply_token) */
    if (r->ban && r->sampling.logit_bias == r->ban && sched_seq_generated(q) + 1 >= r->min_tokens)
        return false;
    uint32_t end = e->pos0 + e->n_new; /* the token in flight goes there; the lookahead samples end + 1 */
    return q->n_tokens == end && end + 2 <= q->cap && sched_grow_ahead(bm->s, q, end + 1);
}

/* Submits the lookahead of a step in flight (rows and seqs: its entries; a NULL sequence left)
 * when every row qualifies and no waiting request could be admitted now (with max_batch_size
 * sequences running, or too few blocks free for the head of the queue, it waits for a running
 * one to end anyway: then it is admitted a step later than without the lookahead). */
static void ahead_submit(vki_batch_manager *bm, const vki_step_seq *rows, sched_seq *const *seqs, uint32_t n)
{
    static const int32_t prev = VKI_TOKEN_PREV;
    bool full = sched_batch_full(bm->s);
    if (!bm->be.submit || !n || bm->p.policy == VKI_POLICY_STATIC || sched_head_admissible(bm->s))
        return;
    pthread_mutex_lock(&bm->mu);
    bool arriving = bm->inbox_head != NULL;
    pthread_mutex_unlock(&bm->mu);
    if (arriving && !full)
        return;
    for (uint32_t i = 0; i < n; i++)
        if (!seqs[i] || !ahead_row_ok(bm, seqs[i], &rows[i]))
            return;
    bm_ahead *a = &bm->ahead[bm->ahead[bm->ahead_cur].pending ? bm->ahead_cur ^ 1 : bm->ahead_cur];
    bool later = false;
    for (uint32_t i = 0; i < n; i++) {
        sched_seq *q = seqs[i];
        const bm_req *r = q->user;
        later |= r->gram != NULL;
        /* penalties: the window's tokens before the one in flight (the engine counts that one) */
        uint32_t pos0 = rows[i].pos0 + rows[i].n_new, w = q->sampling ? q->sampling->penalty_window : 0;
        uint32_t nh = w ? (w - 1 < pos0 ? w - 1 : pos0) : 0;
        a->seqs[i] = q;
        a->rows[i] = (vki_step_seq){.slot = q->slot, .pos0 = pos0, .n_new = 1, .tokens = &prev, .n_pages = q->n_held,
                                    .pages = q->blocks, .want_token = true, .sampling = q->sampling, .seed = q->seed,
                                    .history = q->tokens + pos0 - nh, .n_history = nh,
                                    .token_mask = r->gram ? r->gr.mask : NULL}; /* its content: ahead_masks */
    }
    vki_step_plan plan = {.n_seqs = n, .seqs = a->rows, .n_tokens = n};
    if (bm->be.submit(bm->be.ctx, &plan, later) != VKI_OK)
        return; /* refused: the step goes on alone (a device failure shows at its wait) */
    a->n = n;
    a->pending = true;
    a->masks_due = later;
    bm->n_ahead++;
}

/* After a step's tokens moved its grammars: the masks of the lookahead submitted behind it,
 * which then samples (the executor runs its forward pass meanwhile). */
static void ahead_masks(vki_batch_manager *bm)
{
    for (uint32_t k = 0; k < 2; k++) {
        bm_ahead *a = &bm->ahead[k];
        if (!a->pending || !a->masks_due)
            continue;
        sched_tick t = {.plan = {.n_seqs = a->n, .seqs = a->rows, .n_tokens = a->n}, .seqs = a->seqs};
        bm_constraint_masks(bm, &t);
        a->masks_due = false;
        bm->be.masks(bm->be.ctx, &t.plan); /* refused: it samples with the masks it had (its wait
                                              reports a device failure) */
    }
}

/* Waits for the older pending lookahead (its outs into bm->outs); the newer becomes the older. */
static vki_status ahead_wait(vki_batch_manager *bm)
{
    vki_status st = bm->be.wait(bm->be.ctx, bm->outs);
    bm->ahead[bm->ahead_cur].pending = false;
    if (bm->ahead[bm->ahead_cur ^ 1].pending)
        bm->ahead_cur ^= 1;
    return st;
}

/* Lookaheads in flight whose rows all left (finished, cancelled, failed): waited for and
 * dropped, so that nothing stays in flight while the worker sleeps. A newer lookahead's rows are
 * some of the older's (its sequences): when the older has none left, neither has the newer. */
static void ahead_settle(vki_batch_manager *bm)
{
    while (bm->ahead[bm->ahead_cur].pending) {
        const bm_ahead *a = &bm->ahead[bm->ahead_cur];
        for (uint32_t i = 0; i < a->n; i++)
            if (a->seqs[i])
                return;
        ahead_wait(bm); /* its status concerns no request */
    }
}

/* ---- running a step ------------------------------------------------------------------------ */

/* Delivers the results of a step that ran t->plan (st: how it went; outs: its sampled rows). */
static void deliver(vki_batch_manager *bm, const sched_tick *t, vki_status st)
{
    uint32_t n = t->plan.n_seqs;
    bm_req *reqs[n ? n : 1];
    for (uint32_t i = 0; i < n; i++)
        reqs[i] = t->seqs[i]->user;
    if (st != VKI_OK) { /* their KV is undefined: fail exactly the plan's requests */
        char msg[BM_MSG_CAP];
        snprintf(msg, sizeof msg, "engine step failed: %s%s", vki_status_str(st),
                 st == VKI_ERR_DEVICE_LOST ? " (the engine must be recovered: vki_engine_recover)" : "");
        for (uint32_t i = 0; i < n; i++)
            if (reqs[i] && t->seqs[i]->beam_idx == 0) { /* NULL: a STATIC padding member, owned by the
                                                          scheduler; beam groups end at their lead */
                reqs[i]->status = st;
                finish(bm, reqs[i], VKI_FINISH_ERROR, msg);
            }
        if (st == VKI_ERR_DEVICE_LOST) { /* no step can run again: the rest end now, once each */
            pthread_mutex_lock(&bm->mu);
            bm->lost = true;
            pthread_mutex_unlock(&bm->mu);
            finish_all(bm, VKI_FINISH_ERROR, st, msg);
        }
        return;
    }
    /* a row that could sample nothing (-1) or saw non-finite logits ends only its own request;
     * the scheduler gets a placeholder token that is never shown nor computed */
    for (uint32_t i = 0, k = 0; i < n; i++) {
        vki_step_out *o = t->plan.seqs[i].want_token ? &bm->outs[k++] : NULL;
        if (o && (o->token < 0 || o->nonfinite)) {
            reqs[i]->drop_last = !reqs[i]->beam; /* a beam's token is the search's, not this one */
            o->token = 0;
        }
    }
    sched_commit(bm->s, t, bm->outs);
    uint32_t k = 0, n_beam = 0;
    bm_req *beams[n ? n : 1]; /* beam requests of this step, once each (at their lead's row) */
    for (uint32_t i = 0; i < n; i++) {
        if (!t->plan.seqs[i].want_token)
            continue;
        bm_req *q = reqs[i];
        const vki_step_out *o = &bm->outs[k++];
        if (q->beam) {
            bm_beam_row(q, t->seqs[i], o);
            if (t->seqs[i]->beam_idx == 0)
                beams[n_beam++] = q;
            continue;
        }
        if (q->drop_last) {
            no_token(bm, q, o->nonfinite);
            continue;
        }
        char msg[BM_MSG_CAP] = "";
        vki_finish_reason why = apply_token(bm, q, o), g = VKI_FINISH_NONE;
        if (why != VKI_FINISH_EOS)
            g = bm_constraint_advance(bm, q, o->token, msg, sizeof msg);
        if (g == VKI_FINISH_ERROR || (g == VKI_FINISH_STOP && why == VKI_FINISH_NONE))
            why = g;
        if (why != VKI_FINISH_NONE)
            finish(bm, q, why,
                   why != VKI_FINISH_ERROR ? NULL : msg[0] ? msg : "out of host memory for the logprobs or logits");
        else if (q->streaming)
            respond(bm, q, q->n_sent, false, VKI_FINISH_NONE, NULL);
    }
    for (uint32_t i = 0; i < n_beam; i++) {
        bm_req *q = beams[i];
        vki_finish_reason why = bm_beam_step(bm, q);
        if (why != VKI_FINISH_NONE)
            finish(bm, q, why, why == VKI_FINISH_ERROR ? "beam search: internal error or out of host memory" : NULL);
        else if (q->streaming)
            respond(bm, q, 0, false, VKI_FINISH_NONE, NULL);
    }
}

/* Runs one planned step (with a lookahead when it qualifies) and delivers its results. */
static void run_step(vki_batch_manager *bm, const sched_tick *t, double *step_ms)
{
    double t0 = now_ms();
    vki_status st;
    if (bm->be.submit) {
        st = bm->be.submit(bm->be.ctx, &t->plan, false);
        if (st == VKI_OK) {
            ahead_submit(bm, t->plan.seqs, t->seqs, t->plan.n_seqs);
            st = bm->be.wait(bm->be.ctx, bm->outs);
        }
    } else {
        st = bm->be.step(bm->be.ctx, &t->plan, bm->outs);
    }
    *step_ms = now_ms() - t0;
    deliver(bm, t, st);
    ahead_masks(bm);
}

/* A tick whose step is the lookahead submitted in the last one: its own lookahead first (while
 * the device runs it), then its results, for the rows whose sequences are still there. */
static void ahead_tick(vki_batch_manager *bm, sched_tick *t, double *step_ms)
{
    if (bm->sess_head)
        bm_session_tick(bm, NULL); /* expiry (nobody waits for blocks: a lookahead runs) */
    double t0 = now_ms();
    bm_ahead *a = &bm->ahead[bm->ahead_cur];
    ahead_submit(bm, a->rows, a->seqs, a->n);
    vki_status st = ahead_wait(bm);
    *step_ms = now_ms() - t0;
    uint32_t m = 0;
    for (uint32_t i = 0; i < a->n; i++) /* the rows that stayed, compacted in place */
        if (a->seqs[i]) {
            a->seqs[m] = a->seqs[i];
            a->rows[m] = a->rows[i];
            bm->outs[m++] = bm->outs[i];
        }
    *t = (sched_tick){.plan = {.n_seqs = m, .seqs = a->rows, .n_tokens = m}, .seqs = a->seqs, .n_generation = m,
                      .n_sampled = m};
    if (m)
        deliver(bm, t, st);
    ahead_masks(bm);
}

/* A tick the scheduler plans. False when its invariants broke (every request then ended). */
static bool planned_tick(vki_batch_manager *bm, sched_tick *t, double *step_ms)
{
    if (sched_plan(bm->s, t) != VKI_OK) {
        finish_all(bm, VKI_FINISH_ERROR, VKI_ERR_INTERNAL, "internal error: scheduler invariant broken");
        return false;
    }
    pthread_mutex_lock(&bm->mu); /* admissions made room in the queue */
    bm->sched_waiting = sched_queue_len(bm->s);
    pthread_mutex_unlock(&bm->mu);
    if (bm->sess_head)
        bm_session_tick(bm, t); /* expiry; pins give way when requests wait for blocks */
    if (t->plan.n_seqs && bm->grams)
        bm_constraint_masks(bm, t);
    if (t->plan.n_seqs)
        run_step(bm, t, step_ms);
    return true;
}

static void tick(vki_batch_manager *bm)
{
    sched_tick t;
    double step_ms = 0;
    if (bm->ahead[bm->ahead_cur].pending)
        ahead_tick(bm, &t, &step_ms);
    else if (!planned_tick(bm, &t, &step_ms))
        return;
    ahead_settle(bm);
    bm->iteration++;
    if (bm->p.stats && (bm->cb.stats || bm->cb.tick_stats))
        bm_emit_stats(bm, &t, step_ms);
}

/* Waits for work; takes the inbox and the cancellations. Returns false when the worker must
 * exit. */
static bool wait_work(vki_batch_manager *bm, bm_req **inbox, bm_cancel **cancels, uint32_t *n_cancels,
                      bool *abort, int32_t *max_new_reqs, uint64_t **ends, uint32_t *n_ends, bm_sess_job **jobs)
{
    double expiry = bm_session_next_expiry_s(bm); /* idle sessions expire while nothing else runs */
    pthread_mutex_lock(&bm->mu);
    for (;;) {
        bool poll = bm->cb.get_requests && !bm->shutdown && bm->p.idle_poll_us;
        if (bm->inbox_head || bm->n_cancels || bm->n_active || bm->shutdown || bm->notified || bm->n_session_ends ||
            bm->sess_jobs)
            break;
        if (expiry >= 0 && !poll) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + expiry + 0.001;
            ts.tv_sec = (time_t)end;
            ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
            if (pthread_cond_timedwait(&bm->cv, &bm->mu, &ts) == ETIMEDOUT)
                break;
            continue;
        }
        if (!poll) {
            pthread_cond_wait(&bm->cv, &bm->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)bm->p.idle_poll_us * 1000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        if (pthread_cond_timedwait(&bm->cv, &bm->mu, &ts) == ETIMEDOUT)
            break;
    }
    bm->notified = false;
    *inbox = bm->inbox_head;
    bm->inbox_head = bm->inbox_tail = NULL;
    bm->sched_waiting += bm->inbox_len;
    bm->inbox_len = 0;
    *cancels = bm->cancels;
    *n_cancels = bm->n_cancels;
    bm->cancels = NULL;
    bm->n_cancels = bm->cancels_cap = 0;
    *ends = bm->session_ends;
    *n_ends = bm->n_session_ends;
    bm->session_ends = NULL;
    bm->n_session_ends = bm->session_ends_cap = 0;
    *jobs = bm->sess_jobs;
    bm->sess_jobs = NULL;
    *abort = bm->abort;
    *max_new_reqs = -1;
    if (bm->shutdown)
        *max_new_reqs = 0;
    else if (bm->p.max_queue)
        *max_new_reqs = bm->sched_waiting >= bm->p.max_queue ? 0 : (int32_t)(bm->p.max_queue - bm->sched_waiting);
    bool exit_now = bm->shutdown && !*inbox && !*n_cancels && bm->inflight.n == 0;
    pthread_mutex_unlock(&bm->mu);
    return !exit_now;
}

static void *worker(void *arg)
{
    vki_batch_manager *bm = arg;
    for (;;) {
        bm_req *inbox;
        bm_cancel *cancels;
        uint32_t n_cancels;
        bool abort;
        int32_t max_new_reqs;
        uint64_t *ends;
        uint32_t n_ends;
        bm_sess_job *jobs;
        ahead_settle(bm); /* cancellations may have emptied a lookahead: none in flight while asleep */
        bool go_on = wait_work(bm, &inbox, &cancels, &n_cancels, &abort, &max_new_reqs, &ends, &n_ends, &jobs);
        bm_session_apply_ends(bm, ends, n_ends);
        free(ends);
        bm_session_run_jobs(bm, jobs); /* at the tick boundary: no step runs while the KV is copied */
        if (!go_on)
            break;
        if (!bm->n_active && bm->sess_head)
            bm_session_tick(bm, NULL); /* expiry while idle */
        uint64_t finished0 = bm->n_finished;
        for (bm_req *q = inbox, *next; q; q = next) {
            next = q->next;
            q->next = NULL;
            enter_scheduler(bm, q);
        }
        if (bm->cb.get_requests && max_new_reqs != 0)
            intake_callback(bm, max_new_reqs);
        for (uint32_t i = 0; i < n_cancels; i++)
            cancel_one(bm, cancels[i].id, cancels[i].serial);
        free(cancels);
        if (bm->cb.poll_stop_signals && bm->n_active)
            poll_stops(bm);
        if (abort)
            finish_all(bm, VKI_FINISH_CANCELLED, VKI_OK, NULL);
        if (bm->n_active) {
            tick(bm);
        } else if (bm->n_finished != finished0 && bm->p.stats && (bm->cb.stats || bm->cb.tick_stats)) {
            /* the last requests left between ticks (cancelled, stopped, aborted): one more stats
             * object, so observers see the drained KV pool rather than the last busy tick */
            sched_tick idle = {0};
            bm_emit_stats(bm, &idle, 0);
        }
        pthread_mutex_lock(&bm->mu);
        bm->sched_waiting = sched_queue_len(bm->s);
        pthread_mutex_unlock(&bm->mu);
    }
    return NULL;
}

/* ---- API ---------------------------------------------------------------------------------- */

static vki_status check_params(const bm_backend *be, const vki_batch_params *p, const vki_batch_callbacks *cb)
{
    if (!be || !p || !be->step || !be->submit != !be->wait || !be->max_seqs || !be->n_pages || !be->page_size || !be->max_ctx || !be->vocab_size)
        return VKI_ERR_INVALID_ARG;
    if ((unsigned)p->policy > VKI_POLICY_STATIC || !p->max_num_tokens || !p->chunk_size ||
        p->chunk_size % be->page_size || p->max_queue > INT32_MAX)
        return VKI_ERR_INVALID_ARG;
    if (cb && cb->get_requests && !cb->send_response)
        return VKI_ERR_INVALID_ARG;
    return VKI_OK;
}

/* The backend's end-of-generation ids, for min_tokens bans. O(vocab) once per manager. */
static vki_status list_eog(vki_batch_manager *bm)
{
    if (!bm->be.is_eog)
        return VKI_OK;
    uint32_t cap = 0;
    for (uint32_t t = 0; t < bm->be.vocab_size; t++) {
        if (!bm->be.is_eog(bm->be.ctx, (int32_t)t))
            continue;
        if (bm->n_eog == cap) {
            cap = cap ? 2 * cap : 8;
            int32_t *ids = realloc(bm->eog_ids, cap * sizeof *ids);
            if (!ids)
                return VKI_ERR_OUT_OF_HOST_MEMORY;
            bm->eog_ids = ids;
        }
        bm->eog_ids[bm->n_eog++] = (int32_t)t;
    }
    return VKI_OK;
}

static void bm_free(vki_batch_manager *bm)
{
    if (bm->s)
        bm_session_free_all(bm); /* pins go back before the scheduler */
    bm_grammar_free_all(bm);
    free(bm->eog_ids);
    sched_destroy(bm->s);
    bm_map_free(&bm->inflight);
    free(bm->outs);
    free(bm->spare_mask);
    for (uint32_t i = 0; i < 2; i++) {
        free(bm->ahead[i].seqs);
        free(bm->ahead[i].rows);
    }
    free(bm->cancels);
    free(bm);
}

vki_status bm_create(const bm_backend *be, const vki_batch_params *p, const vki_batch_callbacks *cb,
                     vki_batch_manager **out)
{
    *out = NULL;
    vki_batch_params defaults = vki_batch_default_params();
    if (!p)
        p = &defaults;
    vki_status st = check_params(be, p, cb);
    if (st != VKI_OK)
        return st;
    vki_batch_manager *bm = calloc(1, sizeof *bm);
    if (!bm)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    bm->be = *be;
    bm->steps_reused0 = be->steps_reused ? be->steps_reused(be->ctx) : 0;
    bm->p = *p;
    if (cb)
        bm->cb = *cb;
    /* the step's token budget: ours, capped by what the executor's scratch holds */
    uint32_t budget = be->max_tokens && be->max_tokens < p->max_num_tokens ? be->max_tokens : p->max_num_tokens;
    sched_params sp = {.policy = p->policy, .max_seqs = be->max_seqs, .n_blocks = be->n_pages,
                       .block_size = be->page_size, .max_ctx = be->max_ctx, .max_batch_size = p->max_batch_size,
                       .max_num_tokens = budget, .chunk_size = p->chunk_size,
                       .max_queue = 0 /* bounded here, paused requests included */, .block_reuse = p->block_reuse,
                       .kv_window = be->kv_window, .kv_sink = be->kv_sink};
    st = sched_create(&sp, &bm->s);
    if (st == VKI_OK)
        st = bm_map_init(&bm->inflight);
    bm->outs = calloc(be->max_seqs, sizeof *bm->outs);
    if (st == VKI_OK && !bm->outs)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; st == VKI_OK && be->submit && i < 2; i++) {
        bm->ahead[i].seqs = calloc(be->max_seqs, sizeof *bm->ahead[i].seqs);
        bm->ahead[i].rows = calloc(be->max_seqs, sizeof *bm->ahead[i].rows);
        if (!bm->ahead[i].seqs || !bm->ahead[i].rows)
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    if (st == VKI_OK && be->masks && !(bm->spare_mask = calloc((be->vocab_size + 31) / 32, sizeof *bm->spare_mask)))
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK)
        st = list_eog(bm);
    if (st != VKI_OK) {
        bm_free(bm);
        return st;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    bm->rng = p->seed ? p->seed : (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ (uintptr_t)bm;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    bool cv_ok = pthread_cond_init(&bm->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    bool mu_ok = pthread_mutex_init(&bm->mu, NULL) == 0;
    bool scv_ok = pthread_cond_init(&bm->sess_cv, NULL) == 0;
    if (!cv_ok || !mu_ok || !scv_ok || pthread_create(&bm->thread, NULL, worker, bm) != 0) {
        if (cv_ok)
            pthread_cond_destroy(&bm->cv);
        if (scv_ok)
            pthread_cond_destroy(&bm->sess_cv);
        if (mu_ok)
            pthread_mutex_destroy(&bm->mu);
        bm_free(bm);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    *out = bm;
    return VKI_OK;
}

uint64_t bm_auto_id(vki_batch_manager *bm)
{
    pthread_mutex_lock(&bm->mu);
    uint64_t id = bm->next_auto_id++ | (1ull << 63);
    pthread_mutex_unlock(&bm->mu);
    return id;
}

bool bm_on_worker(const vki_batch_manager *bm) { return pthread_equal(pthread_self(), bm->thread); }

vki_status vki_batch_manager_destroy(vki_batch_manager *bm, bool abort)
{
    if (!bm)
        return VKI_OK;
    if (bm_on_worker(bm))
        return VKI_ERR_INVALID_ARG;
    pthread_mutex_lock(&bm->mu);
    bm->shutdown = true;
    bm->abort |= abort;
    pthread_cond_signal(&bm->cv);
    pthread_mutex_unlock(&bm->mu);
    pthread_join(bm->thread, NULL);
    pthread_mutex_lock(&bm->mu); /* a session file call still returning from its wait */
    while (bm->sess_callers)
        pthread_cond_wait(&bm->sess_cv, &bm->mu);
    pthread_mutex_unlock(&bm->mu);
    pthread_cond_destroy(&bm->cv);
    pthread_cond_destroy(&bm->sess_cv);
    pthread_mutex_destroy(&bm->mu);
    if (bm->be.detach)
        bm->be.detach(bm->be.ctx);
    bm_free(bm);
    return VKI_OK;
}

vki_status vki_batch_submit(vki_batch_manager *bm, const vki_request *req, vki_response_fn on_response, void *user,
                            char *err, size_t err_cap)
{
    char msg[BM_MSG_CAP];
    if (!bm || !on_response) {
        snprintf(err ? err : msg, err ? err_cap : sizeof msg, "%s: NULL", bm ? "on_response" : "batch manager");
        return VKI_ERR_INVALID_ARG;
    }
    vki_status st = bm_validate(bm, req, err ? err : msg, err ? err_cap : sizeof msg);
    bm_req *q = NULL;
    if (st == VKI_OK)
        st = bm_req_copy(req, &q);
    if (st == VKI_OK) /* compiled here, on the caller's thread: the worker only attaches it */
        st = bm_constraint_compile(bm, req, q, err ? err : msg, err ? err_cap : sizeof msg);
    if (st != VKI_OK) {
        if (st == VKI_ERR_OUT_OF_HOST_MEMORY && err && err_cap)
            snprintf(err, err_cap, "out of host memory copying the request");
        bm_req_free(q);
        return st;
    }
    q->respond = on_response;
    q->respond_user = user;
    pthread_mutex_lock(&bm->mu);
    if (bm->shutdown)
        st = VKI_ERR_SHUTDOWN;
    else if (bm->lost)
        st = VKI_ERR_DEVICE_LOST;
    else if (bm_map_find(&bm->inflight, q->id))
        st = VKI_ERR_DUPLICATE_ID;
    else if (bm->p.max_queue && bm->inbox_len + bm->sched_waiting >= bm->p.max_queue)
        st = VKI_RETRY_QUEUE_FULL;
    else
        st = bm_map_insert(&bm->inflight, q);
    if (st == VKI_OK) {
        q->seed = q->sampling.has_seed ? q->sampling.seed : bm_next_seed(&bm->rng);
        q->serial = bm->next_serial++;
        if (bm->inbox_tail)
            bm->inbox_tail->next = q;
        else
            bm->inbox_head = q;
        bm->inbox_tail = q;
        bm->inbox_len++;
        pthread_cond_signal(&bm->cv);
    }
    pthread_mutex_unlock(&bm->mu);
    if (st != VKI_OK) {
        if (err && err_cap)
            snprintf(err, err_cap, "%s",
                     st == VKI_ERR_SHUTDOWN        ? "the batch manager is shutting down"
                     : st == VKI_ERR_DEVICE_LOST   ? "the GPU device was lost; the engine must be recovered"
                     : st == VKI_ERR_DUPLICATE_ID  ? "a request with this id is in flight"
                     : st == VKI_RETRY_QUEUE_FULL ? "the queue is full (max_queue)"
                                                   : vki_status_str(st));
        bm_req_free(q);
    }
    return st;
}

vki_status vki_batch_cancel(vki_batch_manager *bm, uint64_t id)
{
    if (!bm)
        return VKI_ERR_INVALID_ARG;
    vki_status st = VKI_OK;
    pthread_mutex_lock(&bm->mu);
    bm_req *q = bm_map_find(&bm->inflight, id);
    if (!q) {
        st = VKI_ERR_NOT_FOUND;
    } else if (bm->n_cancels == bm->cancels_cap) {
        uint32_t cap = bm->cancels_cap ? bm->cancels_cap * 2 : 16;
        bm_cancel *c = cap > bm->cancels_cap ? realloc(bm->cancels, (size_t)cap * sizeof *c) : NULL;
        if (c) {
            bm->cancels = c;
            bm->cancels_cap = cap;
        } else {
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
        }
    }
    if (st == VKI_OK) {
        bm->cancels[bm->n_cancels++] = (bm_cancel){.id = id, .serial = q->serial};
        pthread_cond_signal(&bm->cv);
    }
    pthread_mutex_unlock(&bm->mu);
    return st;
}

void vki_batch_notify(vki_batch_manager *bm)
{
    if (!bm)
        return;
    pthread_mutex_lock(&bm->mu);
    bm->notified = true;
    pthread_cond_signal(&bm->cv);
    pthread_mutex_unlock(&bm->mu);
}
