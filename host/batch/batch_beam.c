/* Beam search in the batch manager, as TensorRT-LLM's batch manager runs it (its beam search
 * kernels follow Hugging Face's BeamSearchScorer):
 *
 *  - every beam's row is sampled greedily on the GPU with its k = 2 * width best alternatives
 *    and their log-probabilities (the sampler's top_logprobs: raw model log-softmax);
 *  - candidates are (beam, token) with score = the beam's cumulative log-probability + the
 *    token's; the 2 * width best over all beams are walked in order (after the prompt only the
 *    lead's row, as every beam is the same sequence then):
 *      an end token among the first width: a finished hypothesis, scored
 *        cum / length^length_penalty (length = generated tokens, the end token included), kept
 *        if among the width best finished (with VKI_EARLY_STOP_ON a worse one stops the walk);
 *      any other token: the next live beam, until width of them;
 *  - the search stops when width hypotheses finished and (early stopping ON) at once, or
 *    (HEURISTIC / NEVER) when the best candidate, scored at the current length (NEVER with a
 *    positive penalty: at max_new_tokens), cannot beat the worst finished one; at max_new_tokens
 *    the live beams join the finished ones; the width best by score are returned.
 *
 * The scheduler then moves every beam onto its parent's KV (sched_beam_reorder). Host cost of a
 * step: O(width * k log(width * k)) for the candidates plus the reorder's
 * O(width * (tokens + blocks)); the sampled rows cost the GPU sampler's top-k (k <= 20). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/batch/batch.h"

/* The sampler returns at most this many alternatives per row; the search needs 2 * width. */
#define BM_BEAM_MAX (VKI_MAX_TOP_LOGPROBS / 2)

typedef struct bm_hyp {
    const int32_t *tokens;   /* [n] generated tokens (into bm_beam.store or a live sequence) */
    uint32_t n;
    double cum, score;
    bool ended;              /* finished with an end token */
} bm_hyp;

typedef struct bm_cand {
    double score;            /* cum of its beam + the token's log-probability */
    uint32_t beam;
    int32_t token;
} bm_cand;

struct bm_beam {
    uint32_t w, k;           /* width; candidates per row (2 * width) */
    vki_sampling_params sampling; /* greedy with k alternatives: what every beam's row samples */
    double *cum;             /* [w] live beams' cumulative log-probabilities */
    vki_step_out *rows;      /* [w] this step's rows, by beam */
    uint32_t n_rows;
    bm_cand *cand;           /* [w * k] */
    uint32_t *parent;        /* [w] the next step's beams: parent and token */
    int32_t *token;
    double *next_cum;        /* [w] */
    bm_hyp *fin;             /* [w] finished hypotheses (TensorRT-LLM's CBA) */
    uint32_t n_fin;
    bm_hyp *live;            /* [w] the live beams when max_new_tokens ends the search */
    uint32_t n_live;
    int32_t *store;          /* [2 * w][max_new] token storage of fin, then of live */
    bool stopped;            /* the early-stopping rule ended it: live beams do not count */
    bool ended_at_length;    /* live[] holds the final live beams */
    /* the final ranking, as the response shows it */
    bm_hyp *rank;            /* [2 * w] */
    const int32_t **out_tok; /* [w] */
    uint32_t *out_len;
    double *out_cum, *out_score;
    uint32_t n_out;
    bool ranked;
};

vki_status bm_beam_validate(const vki_batch_manager *bm, const vki_request *r, char *msg, size_t cap)
{
    if (r->beam_width <= 1)
        return VKI_OK;
    const char *bad = r->pooling != VKI_POOL_NONE ? "pooling (an embedding request)"
                    : r->constraint.type != VKI_CONSTRAINT_NONE ? "constraint"
                    : r->logits_processor ? "logits_processor"
                    : r->min_tokens ? "min_tokens"
                    : r->return_generation_logits ? "return_generation_logits"
                    : r->sampling.logprobs || r->sampling.top_logprobs ? "sampling.logprobs / top_logprobs (each "
                                                                         "beam's cum logprob is returned)"
                    : NULL;
    if (bad)
        snprintf(msg, cap, "beam_width: beam search does not combine with %s", bad);
    else if (r->beam_width > bm->p.max_beam_width)
        snprintf(msg, cap, "beam_width: %u exceeds the manager's max_beam_width %u", r->beam_width,
                 bm->p.max_beam_width);
    else if (r->beam_width > BM_BEAM_MAX)
        snprintf(msg, cap, "beam_width: %u exceeds %u (the GPU sampler gives 2 x width candidates, at most %u)",
                 r->beam_width, BM_BEAM_MAX, VKI_MAX_TOP_LOGPROBS);
    else if (!isfinite(r->length_penalty))
        snprintf(msg, cap, "length_penalty: must be finite");
    else if ((unsigned)r->early_stopping > VKI_EARLY_STOP_NEVER)
        snprintf(msg, cap, "early_stopping: %d is not a vki_early_stopping", (int)r->early_stopping);
    else
        return sched_validate_beams(bm->s, r->n_prompt, r->max_new_tokens, r->beam_width, msg, cap);
    return VKI_ERR_INVALID_ARG;
}

void bm_beam_free(bm_req *q)
{
    struct bm_beam *b = q->beam;
    if (!b)
        return;
    void *all[] = {b->cum, b->rows, b->cand, b->parent, b->token, b->next_cum, b->fin, b->live, b->store,
                   b->rank, (void *)b->out_tok, b->out_len, b->out_cum, b->out_score};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
    free(b);
    q->beam = NULL;
}

vki_status bm_beam_attach(vki_batch_manager *bm, bm_req *q, sched_add_args *a)
{
    (void)bm;
    if (q->beam_width <= 1)
        return VKI_OK;
    struct bm_beam *b = calloc(1, sizeof *b);
    if (!(q->beam = b))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    uint32_t w = b->w = q->beam_width;
    b->k = 2 * w;
    b->sampling = vki_sampling_default_params();
    b->sampling.temperature = 0;
    b->sampling.top_logprobs = b->k;
    b->cum = calloc(w, sizeof *b->cum);
    b->rows = calloc(w, sizeof *b->rows);
    b->cand = calloc((size_t)w * b->k, sizeof *b->cand);
    b->parent = calloc(w, sizeof *b->parent);
    b->token = calloc(w, sizeof *b->token);
    b->next_cum = calloc(w, sizeof *b->next_cum);
    b->fin = calloc(w, sizeof *b->fin);
    b->live = calloc(w, sizeof *b->live);
    b->store = calloc((size_t)2 * w * q->max_new, sizeof *b->store);
    b->rank = calloc(2 * (size_t)w, sizeof *b->rank);
    b->out_tok = calloc(w, sizeof *b->out_tok);
    b->out_len = calloc(w, sizeof *b->out_len);
    b->out_cum = calloc(w, sizeof *b->out_cum);
    b->out_score = calloc(w, sizeof *b->out_score);
    if (!b->cum || !b->rows || !b->cand || !b->parent || !b->token || !b->next_cum || !b->fin || !b->live ||
        !b->store || !b->rank || !b->out_tok || !b->out_len || !b->out_cum || !b->out_score)
        return VKI_ERR_OUT_OF_HOST_MEMORY; /* bm_req_free releases what was made */
    a->sampling = &b->sampling;
    a->beam_width = w;
    return VKI_OK;
}

void bm_beam_row(bm_req *q, const sched_seq *seq, const vki_step_out *o)
{
    q->beam->rows[seq->beam_idx] = *o;
    q->beam->n_rows++;
}

static double norm_score(double cum, uint32_t len, float length_penalty)
{
    return length_penalty == 0.0f ? cum : cum / pow((double)len, (double)length_penalty);
}

static int cand_order(const void *pa, const void *pb)
{
    const bm_cand *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->beam != b->beam)
        return a->beam < b->beam ? -1 : 1;
    return (a->token > b->token) - (a->token < b->token);
}

static int hyp_order(const void *pa, const void *pb)
{
    const bm_hyp *a = pa, *b = pb;
    return (a->score < b->score) - (a->score > b->score);
}

/* Candidates of this step's rows, best first. Returns how many. */
static uint32_t gather(struct bm_beam *b, uint32_t n_rows, bool first)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_rows; r++) {
        const vki_step_out *o = &b->rows[r];
        for (uint32_t j = 0; j < o->n_top && j < b->k; j++)
            if (o->top_tokens[j] >= 0 && isfinite(o->top_logprobs[j]))
                b->cand[n++] = (bm_cand){(first ? 0.0 : b->cum[r]) + o->top_logprobs[j], r, o->top_tokens[j]};
    }
    qsort(b->cand, n, sizeof *b->cand, cand_order);
    return n;
}

/* A hypothesis: beam `beam`'s gen generated tokens, then tok, copied into slot's storage. */
static bm_hyp make_hyp(const bm_req *q, int32_t *store, uint32_t beam, uint32_t gen, int32_t tok, double cum,
                       double score, bool ended)
{
    const sched_seq *s = q->seq->beams[beam];
    memcpy(store, s->tokens + s->n_prompt, (size_t)gen * sizeof *store);
    store[gen] = tok;
    return (bm_hyp){.tokens = store, .n = gen + 1, .cum = cum, .score = score, .ended = ended};
}

/* Candidate c ends its beam: into the finished set if it is among the w best. False: it is worse
 * than every finished one and the set is full. */
static bool add_finished(struct bm_beam *b, const bm_req *q, const bm_cand *c, uint32_t gen)
{
    double sc = norm_score(c->score, gen + 1, q->length_penalty);
    uint32_t slot = b->n_fin;
    if (b->n_fin == b->w) {
        slot = 0;
        for (uint32_t i = 1; i < b->n_fin; i++)
            slot = b->fin[i].score < b->fin[slot].score ? i : slot;
        if (sc < b->fin[slot].score)
            return false;
    } else {
        b->n_fin++;
    }
    b->fin[slot] = make_hyp(q, b->store + (size_t)slot * q->max_new, c->beam, gen, c->token, c->score, sc, true);
    return true;
}

/* Whether the finished set can no longer be beaten (TensorRT-LLM's batchDones). */
static bool search_done(const struct bm_beam *b, const bm_req *q, uint32_t gen, uint32_t n_cand)
{
    if (b->n_fin < b->w)
        return false;
    if (q->early_stopping == VKI_EARLY_STOP_ON)
        return true;
    uint32_t len = gen + 1;
    if (q->early_stopping == VKI_EARLY_STOP_NEVER && q->length_penalty > 0)
        len = q->max_new;
    double worst = b->fin[0].score;
    for (uint32_t i = 1; i < b->n_fin; i++)
        worst = b->fin[i].score < worst ? b->fin[i].score : worst;
    return n_cand == 0 || worst >= norm_score(b->cand[0].score, len, q->length_penalty);
}

/* The final ranking: finished hypotheses, plus the live beams unless early stopping ended the
 * search; the w best by score. Live beams are the ones kept at max_new_tokens, or (a request
 * cancelled mid-search) the sequences as they stand. */
static void rank_beams(const vki_batch_manager *bm, bm_req *q)
{
    struct bm_beam *b = q->beam;
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->n_fin; i++)
        b->rank[n++] = b->fin[i];
    if (b->ended_at_length) {
        for (uint32_t i = 0; i < b->n_live; i++)
            b->rank[n++] = b->live[i];
    } else if (!b->stopped && q->seq && !q->seq->beams[1]->beam_idle) {
        for (uint32_t i = 0; i < b->w; i++) {
            const sched_seq *s = q->seq->beams[i];
            uint32_t gen = s->n_tokens - s->n_prompt;
            b->rank[n++] = (bm_hyp){s->tokens + s->n_prompt, gen, b->cum[i], norm_score(b->cum[i], gen, q->length_penalty),
                                    false};
        }
    }
    qsort(b->rank, n, sizeof *b->rank, hyp_order);
    b->n_out = n < b->w ? n : b->w;
    for (uint32_t i = 0; i < b->n_out; i++) {
        b->out_tok[i] = b->rank[i].tokens;
        b->out_len[i] = b->rank[i].n;
        b->out_cum[i] = b->rank[i].cum;
        b->out_score[i] = b->rank[i].score;
    }
    b->ranked = true;
    (void)bm;
}

/* The request ends: rank, and the finish reason of the best beam. */
static vki_finish_reason conclude(const vki_batch_manager *bm, bm_req *q)
{
    rank_beams(bm, q);
    const bm_hyp *best = q->beam->n_out ? &q->beam->rank[0] : NULL;
    if (!best || !best->ended)
        return VKI_FINISH_LENGTH;
    return bm_end_reason(bm, q, best->tokens[best->n - 1]);
}

vki_finish_reason bm_beam_step(vki_batch_manager *bm, bm_req *q)
{
    struct bm_beam *b = q->beam;
    sched_seq *lead = q->seq;
    bool first = lead->beams[1]->beam_idle;
    uint32_t n_rows = first ? 1 : b->w, gen = sched_seq_generated(lead) - 1;
    if (b->n_rows != n_rows)
        return VKI_FINISH_ERROR; /* the group did not decode together: a bug */
    b->n_rows = 0;
    uint32_t n = gather(b, n_rows, first), n_live = 0;
    for (uint32_t i = 0; i < n && i < 2 * b->w && n_live < b->w; i++) {
        const bm_cand *c = &b->cand[i];
        if (bm_end_reason(bm, q, c->token) != VKI_FINISH_NONE) {
            if (i < b->w && !add_finished(b, q, c, gen) && q->early_stopping == VKI_EARLY_STOP_ON)
                break;
            continue;
        }
        b->parent[n_live] = c->beam;
        b->token[n_live] = c->token;
        b->next_cum[n_live++] = c->score;
    }
    if (search_done(b, q, gen, n)) {
        b->stopped = true;
        return conclude(bm, q);
    }
    if (gen + 1 >= q->max_new || n_live < b->w) { /* at max length (or out of candidates) */
        for (uint32_t i = 0; i < n_live; i++) {
            double sc = norm_score(b->next_cum[i], gen + 1, q->length_penalty);
            b->live[i] = make_hyp(q, b->store + (size_t)(b->w + i) * q->max_new, b->parent[i], gen, b->token[i],
                                  b->next_cum[i], sc, false);
        }
        b->n_live = n_live;
        b->ended_at_length = true;
        return conclude(bm, q);
    }
    if (sched_beam_reorder(bm->s, lead, b->parent, b->token) != VKI_OK)
        return VKI_FINISH_ERROR;
    memcpy(b->cum, b->next_cum, b->w * sizeof *b->cum);
    return VKI_FINISH_NONE;
}

void bm_beam_fill(vki_batch_manager *bm, bm_req *q, vki_response *r)
{
    struct bm_beam *b = q->beam;
    const sched_seq *best = q->seq ? q->seq->beams[0] : NULL;
    r->logprobs = NULL;
    r->n_top = 0;
    r->top_tokens = NULL;
    r->top_logprobs = NULL;
    if (!r->final) { /* streaming: the best live beam, whole (beam 0 after a reorder) */
        bool started = best && !q->seq->beams[1]->beam_idle;
        r->tokens = started ? best->tokens + best->n_prompt : NULL;
        r->n_tokens = started ? best->n_tokens - best->n_prompt : 0;
        r->cum_logprob = started ? b->cum[0] : 0;
        r->seq_len = q->n_prompt + r->n_tokens;
        return;
    }
    if (!b->ranked)
        rank_beams(bm, q);
    r->n_beams = b->n_out;
    r->tokens = b->n_out ? b->out_tok[0] : NULL;
    r->n_tokens = b->n_out ? b->out_len[0] : 0;
    r->cum_logprob = b->n_out ? b->out_cum[0] : 0;
    r->seq_len = q->n_prompt + r->n_tokens;
    if (b->n_out) {
        r->beam_tokens = b->out_tok;
        r->beam_lengths = b->out_len;
        r->beam_cum_logprobs = b->out_cum;
        r->beam_scores = b->out_score;
    }
}
