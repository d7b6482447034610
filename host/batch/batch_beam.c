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
 * O(width * (tokens + blocks)); the sampled rows cost the GPU sampler's top-k (k <= 20).
 *
 * Logprobs and generation logits follow lineage, as TensorRT-LLM's gatherTree does for tokens:
 * every step records, per beam, the parent its child continued and the child's token
 * log-probability (and the row's top_logprobs alternatives, and with generation logits the row
 * itself, [step][beam][vocab]); a returned beam walks back through its parents once, when the
 * request ends (O(length) per beam). The rows are then gathered in place so that each returned
 * beam's are contiguous (bm_gather_rows: no second copy of the rows). */
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
    uint32_t last_row;       /* lineage: the beam whose row of step n - 1 gave the last token */
    float last_lp;           /* ... and that token's log-probability */
} bm_hyp;

typedef struct bm_cand {
    double score;            /* cum of its beam + the token's log-probability */
    uint32_t beam;
    int32_t token;
    float lp;                /* the token's log-probability */
} bm_cand;

/* The logits sink context of one beam (its sampled rows go to its slot of the step). */
typedef struct bm_beam_sink {
    bm_req *q;
    uint32_t beam;
} bm_beam_sink;

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
    /* lineage (logprobs, top_logprobs, generation logits); step s < hist_cap */
    bool lineage, rows_wanted, traced;
    uint32_t n_top, V;
    float *next_lp;          /* [w] the next step's beams: their tokens' log-probabilities */
    uint32_t hist_cap;       /* steps the arrays below hold (grown by doubling up to max_new) */
    uint32_t *h_parent;      /* [hist_cap][w] step s: the beam whose row child b continued */
    float *h_lp;             /* [hist_cap][w] ... and child b's token log-probability */
    int32_t *h_top_tok;      /* [hist_cap][w][n_top] row b's best alternatives */
    float *h_top_lp;         /* [hist_cap][w][n_top] */
    float *h_rows;           /* [hist_cap][w][V] row b of step s (rows_wanted); then, gathered,
                                the returned beams' rows one after another */
    float *o_lp;             /* [w][hist_cap] returned beam b's logprobs (streaming: beam 0's) */
    int32_t *o_top_tok;      /* [w][hist_cap][n_top] */
    float *o_top_lp;         /* [w][hist_cap][n_top] */
    uint32_t *g_src;         /* [hist_cap * w] gather: the history slot of each output row */
    uint32_t *g_scratch;     /* [3 * hist_cap * w] */
    uint8_t *g_done;         /* [hist_cap * w] */
    float *spare;            /* [V] */
    const float **p_lp;      /* [w] the response's per-beam pointers */
    const int32_t **p_top_tok;
    const float **p_top_lp;
    const float **p_rows;
    bm_beam_sink *sinks;     /* [w] */
    void **sink_ctx;         /* [w] &sinks[b] */
};

vki_status bm_beam_validate(const vki_batch_manager *bm, const vki_request *r, char *msg, size_t cap)
{
    if (r->beam_width <= 1)
        return VKI_OK;
    const char *bad = r->pooling != VKI_POOL_NONE ? "pooling (an embedding request)"
                    : r->constraint.type != VKI_CONSTRAINT_NONE ? "constraint"
                    : r->logits_processor ? "logits_processor"
                    : r->min_tokens ? "min_tokens"
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

uint64_t bm_beam_history_bytes(const vki_request *r, uint32_t n_vocab)
{
    uint32_t n_top = r->sampling.top_logprobs < VKI_MAX_TOP_LOGPROBS ? r->sampling.top_logprobs : VKI_MAX_TOP_LOGPROBS;
    bool rows = r->return_generation_logits, lp = r->sampling.logprobs || n_top;
    if (r->beam_width <= 1 || (!rows && !lp))
        return 0;
    /* per step and beam: parent, lp (history) and lp (output): 12 bytes; alternatives in the history
     * and the output: 16 * n_top; with rows, the gather's 17 bytes (rounded up to 20) and one spare row */
    uint64_t per = 16 + 16 * (uint64_t)n_top + (rows ? 20 : 0);
    return (uint64_t)r->beam_width * r->max_new_tokens * per + (rows ? (uint64_t)n_vocab * sizeof(float) : 0);
}

void bm_beam_free(bm_req *q)
{
    struct bm_beam *b = q->beam;
    if (!b)
        return;
    void *all[] = {b->cum, b->rows, b->cand, b->parent, b->token, b->next_cum, b->fin, b->live, b->store,
                   b->rank, (void *)b->out_tok, b->out_len, b->out_cum, b->out_score, b->next_lp, b->h_parent,
                   b->h_lp, b->h_top_tok, b->h_top_lp, b->h_rows, b->o_lp, b->o_top_tok, b->o_top_lp, b->g_src,
                   b->g_scratch, b->g_done, b->spare, (void *)b->p_lp, (void *)b->p_top_tok, (void *)b->p_top_lp,
                   (void *)b->p_rows, b->sinks, b->sink_ctx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
    free(b);
    q->beam = NULL;
}

/* Room for the lineage of steps [0, steps): doubling, at most max_new. Only the history arrays
 * keep their contents; the output and gather arrays are filled at the end. A failed realloc
 * leaves its array as it was (and hist_cap unchanged), so every array stays valid. */
static bool hist_reserve(bm_req *q, uint32_t steps)
{
    struct bm_beam *b = q->beam;
    if (steps <= b->hist_cap)
        return true;
    uint32_t cap = b->hist_cap ? 2 * b->hist_cap : 16;
    cap = cap < steps ? steps : cap > q->max_new ? q->max_new : cap;
    size_t n = (size_t)cap * b->w, nt = n * b->n_top;
    void *p;
#define GROW(field, count)                                                                       \
    if ((count) > 0) {                                                                           \
        if (!(p = realloc(b->field, (count) * sizeof *b->field)))                                 \
            return false;                                                                        \
        b->field = p;                                                                            \
    }
    GROW(h_parent, n)
    GROW(h_lp, n)
    GROW(o_lp, n)
    GROW(h_top_tok, nt)
    GROW(h_top_lp, nt)
    GROW(o_top_tok, nt)
    GROW(o_top_lp, nt)
    if (b->rows_wanted) {
        GROW(h_rows, n * b->V)
        GROW(g_src, n)
        GROW(g_scratch, 3 * n)
        GROW(g_done, n)
    }
#undef GROW
    b->hist_cap = cap;
    return true;
}

/* The engine's logits sink of one beam (worker thread, inside the step): its sampled row goes
 * to its slot of the step; context rows (the lead's prompt) to the request's context logits. */
static void beam_sink(void *ctx, const float *rows, uint32_t n_rows, uint32_t V, uint32_t pos0, bool sampled)
{
    const bm_beam_sink *k = ctx;
    bm_req *q = k->q;
    struct bm_beam *b = q->beam;
    if (!sampled) {
        bm_logits_context(q, rows, n_rows, V, pos0);
        return;
    }
    uint32_t step = pos0 + 1 - q->n_prompt; /* every beam of a group has the same length */
    if (!b->rows_wanted)
        return;
    if (pos0 + 1 < q->n_prompt || V != b->V || !hist_reserve(q, step + 1)) {
        q->logits_oom = true;
        return;
    }
    memcpy(b->h_rows + ((size_t)step * b->w + k->beam) * V, rows, (size_t)V * sizeof *rows);
}

/* The lineage's fixed parts (the history grows with the steps); the logits sink of every beam
 * when the request has one (context and / or generation logits). */
static vki_status lineage_attach(vki_batch_manager *bm, bm_req *q, sched_add_args *a)
{
    struct bm_beam *b = q->beam;
    uint32_t w = b->w;
    b->lineage = q->want_lp || q->want_gen_logits;
    b->rows_wanted = q->want_gen_logits;
    b->n_top = q->n_top;
    b->V = bm->be.vocab_size;
    b->sampling.top_logprobs = b->k > b->n_top ? b->k : b->n_top; /* <= 20: k <= 20 and n_top <= 20 */
    if (b->lineage) {
        b->next_lp = calloc(w, sizeof *b->next_lp);
        b->p_lp = calloc(w, sizeof *b->p_lp);
        b->p_top_tok = calloc(w, sizeof *b->p_top_tok);
        b->p_top_lp = calloc(w, sizeof *b->p_top_lp);
        b->p_rows = calloc(w, sizeof *b->p_rows);
        b->spare = b->rows_wanted ? malloc((size_t)b->V * sizeof *b->spare) : NULL;
        if (!b->next_lp || !b->p_lp || !b->p_top_tok || !b->p_top_lp || !b->p_rows || (b->rows_wanted && !b->spare))
            return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    if (!a->logits_sink)
        return VKI_OK;
    b->sinks = calloc(w, sizeof *b->sinks);
    b->sink_ctx = calloc(w, sizeof *b->sink_ctx);
    if (!b->sinks || !b->sink_ctx)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < w; i++) {
        b->sinks[i] = (bm_beam_sink){q, i};
        b->sink_ctx[i] = &b->sinks[i];
    }
    a->logits_sink = beam_sink;
    a->beam_sink_ctx = b->sink_ctx;
    return VKI_OK;
}

vki_status bm_beam_attach(vki_batch_manager *bm, bm_req *q, sched_add_args *a)
{
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
    vki_status st = lineage_attach(bm, q, a);
    if (st != VKI_OK)
        return st;
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

/* Step gen's rows into the history: room for the step, and each row's top_logprobs best
 * alternatives (the rows themselves came through the sink). False: out of memory. */
static bool record_rows(bm_req *q, uint32_t n_rows, uint32_t gen)
{
    struct bm_beam *b = q->beam;
    if (!hist_reserve(q, gen + 1))
        return false;
    uint32_t N = b->n_top;
    for (uint32_t r = 0; r < n_rows && N; r++) {
        const vki_step_out *o = &b->rows[r];
        size_t at = ((size_t)gen * b->w + r) * N;
        for (uint32_t j = 0; j < N; j++) {
            bool have = j < o->n_top;
            b->h_top_tok[at + j] = have ? o->top_tokens[j] : -1;
            b->h_top_lp[at + j] = have ? o->top_logprobs[j] : -INFINITY;
        }
    }
    return true;
}

/* Candidates of this step's rows, best first. Returns how many. */
static uint32_t gather(struct bm_beam *b, uint32_t n_rows, bool first)
{
    uint32_t n = 0;
    for (uint32_t r = 0; r < n_rows; r++) {
        const vki_step_out *o = &b->rows[r];
        for (uint32_t j = 0; j < o->n_top && j < b->k; j++)
            if (o->top_tokens[j] >= 0 && isfinite(o->top_logprobs[j]))
                b->cand[n++] = (bm_cand){(first ? 0.0 : b->cum[r]) + o->top_logprobs[j], r, o->top_tokens[j],
                                         o->top_logprobs[j]};
    }
    qsort(b->cand, n, sizeof *b->cand, cand_order);
    return n;
}

/* A hypothesis: beam `beam`'s gen generated tokens, then tok (log-probability lp), copied into
 * slot's storage. */
static bm_hyp make_hyp(const bm_req *q, int32_t *store, uint32_t beam, uint32_t gen, int32_t tok, float lp,
                       double cum, double score, bool ended)
{
    const sched_seq *s = q->seq->beams[beam];
    memcpy(store, s->tokens + s->n_prompt, (size_t)gen * sizeof *store);
    store[gen] = tok;
    return (bm_hyp){.tokens = store, .n = gen + 1, .cum = cum, .score = score, .ended = ended, .last_row = beam,
                    .last_lp = lp};
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
    b->fin[slot] =
        make_hyp(q, b->store + (size_t)slot * q->max_new, c->beam, gen, c->token, c->lp, c->score, sc, true);
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
            uint32_t gen = s->n_tokens - s->n_prompt; /* >= 1: a reorder recorded step gen - 1 */
            size_t h = (size_t)(gen - 1) * b->w + i;
            b->rank[n++] = (bm_hyp){s->tokens + s->n_prompt, gen, b->cum[i], norm_score(b->cum[i], gen, q->length_penalty),
                                    false, b->lineage ? b->h_parent[h] : 0, b->lineage ? b->h_lp[h] : 0};
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
    if (q->logits_oom || (b->lineage && !record_rows(q, n_rows, gen))) {
        q->status = VKI_ERR_OUT_OF_HOST_MEMORY;
        return VKI_FINISH_ERROR;
    }
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
        if (b->next_lp)
            b->next_lp[n_live] = c->lp;
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
                                  b->lineage ? b->next_lp[i] : 0, b->next_cum[i], sc, false);
        }
        b->n_live = n_live;
        b->ended_at_length = true;
        return conclude(bm, q);
    }
    if (sched_beam_reorder(bm->s, lead, b->parent, b->token) != VKI_OK)
        return VKI_FINISH_ERROR;
    memcpy(b->cum, b->next_cum, b->w * sizeof *b->cum);
    if (b->lineage) { /* each child's parent and token log-probability: its lineage */
        memcpy(b->h_parent + (size_t)gen * b->w, b->parent, b->w * sizeof *b->parent);
        memcpy(b->h_lp + (size_t)gen * b->w, b->next_lp, b->w * sizeof *b->next_lp);
    }
    return VKI_FINISH_NONE;
}

/* Follows hypothesis h back through its parents: its tokens' log-probabilities into lp[n], their
 * rows' alternatives into top_tok / top_lp [n][n_top] and (src != NULL) each row's history slot
 * into src[n]. O(h->n * (1 + n_top)). */
static void trace(const struct bm_beam *b, const bm_hyp *h, float *lp, int32_t *top_tok, float *top_lp, uint32_t *src)
{
    uint32_t row = h->last_row, N = b->n_top;
    float l = h->last_lp;
    for (uint32_t k = h->n; k-- > 0;) {
        size_t slot = (size_t)k * b->w + row; /* beam `row` of step k chose token k */
        lp[k] = l;
        if (N) {
            memcpy(top_tok + (size_t)k * N, b->h_top_tok + slot * N, N * sizeof *top_tok);
            memcpy(top_lp + (size_t)k * N, b->h_top_lp + slot * N, N * sizeof *top_lp);
        }
        if (src)
            src[k] = (uint32_t)slot;
        if (k) { /* beam `row` of step k is child `row` of step k - 1 */
            l = b->h_lp[slot - b->w];
            row = b->h_parent[slot - b->w];
        }
    }
}

/* The returned beams' lineage, once, at the final response: logprobs and alternatives into the
 * output arrays, the rows gathered in place (the history's rows are not needed after). */
static void lineage_final(bm_req *q)
{
    struct bm_beam *b = q->beam;
    size_t cap = b->hist_cap, N = b->n_top;
    uint32_t n_dst = 0;
    if (b->traced)
        return;
    b->traced = true;
    for (uint32_t i = 0; i < b->n_out; i++) {
        float *lp = b->o_lp + i * cap, *tl = b->o_top_lp + i * cap * N;
        int32_t *tt = b->o_top_tok + i * cap * N;
        trace(b, &b->rank[i], lp, tt, tl, b->rows_wanted ? b->g_src + n_dst : NULL);
        b->p_lp[i] = lp;
        b->p_top_tok[i] = tt;
        b->p_top_lp[i] = tl;
        b->p_rows[i] = b->rows_wanted ? b->h_rows + (size_t)n_dst * b->V : NULL;
        n_dst += b->rank[i].n; /* <= n_out * steps: within the history's rows */
    }
    if (b->rows_wanted)
        bm_gather_rows(b->h_rows, b->V, b->g_src, n_dst, (uint32_t)(cap * b->w), b->spare, b->g_scratch, b->g_done);
}

/* Streaming: the best live beam's logprobs and alternatives, whole, into output slot 0.
 * O(length * (1 + n_top)) per response. */
static void lineage_stream(bm_req *q, vki_response *r)
{
    struct bm_beam *b = q->beam;
    uint32_t n = r->n_tokens;
    size_t h = (size_t)(n - 1) * b->w; /* beam 0's lineage: child 0 of step n - 1 */
    bm_hyp best = {.n = n, .last_row = b->h_parent[h], .last_lp = b->h_lp[h]};
    trace(b, &best, b->o_lp, b->o_top_tok, b->o_top_lp, NULL);
    r->logprobs = b->o_lp;
    r->n_top = b->n_top;
    r->top_tokens = b->n_top ? b->o_top_tok : NULL;
    r->top_logprobs = b->n_top ? b->o_top_lp : NULL;
}

void bm_beam_fill(vki_batch_manager *bm, bm_req *q, vki_response *r)
{
    struct bm_beam *b = q->beam;
    const sched_seq *best = q->seq ? q->seq->beams[0] : NULL;
    r->logprobs = NULL;
    r->n_top = 0;
    r->top_tokens = NULL;
    r->top_logprobs = NULL;
    r->generation_logits = NULL;
    if (!r->final) { /* streaming: the best live beam, whole (beam 0 after a reorder) */
        bool started = best && !q->seq->beams[1]->beam_idle;
        r->tokens = started ? best->tokens + best->n_prompt : NULL;
        r->n_tokens = started ? best->n_tokens - best->n_prompt : 0;
        r->cum_logprob = started ? b->cum[0] : 0;
        r->seq_len = q->n_prompt + r->n_tokens;
        if (started && q->want_lp)
            lineage_stream(q, r);
        return;
    }
    if (!b->ranked)
        rank_beams(bm, q);
    r->n_beams = b->n_out;
    r->tokens = b->n_out ? b->out_tok[0] : NULL;
    r->n_tokens = b->n_out ? b->out_len[0] : 0;
    r->cum_logprob = b->n_out ? b->out_cum[0] : 0;
    r->seq_len = q->n_prompt + r->n_tokens;
    if (!b->n_out)
        return;
    r->beam_tokens = b->out_tok;
    r->beam_lengths = b->out_len;
    r->beam_cum_logprobs = b->out_cum;
    r->beam_scores = b->out_score;
    if (!b->lineage || r->finish == VKI_FINISH_ERROR) /* an error may have left the history short */
        return;
    lineage_final(q);
    if (q->want_lp) {
        r->logprobs = b->p_lp[0];
        r->n_top = b->n_top;
        r->top_tokens = b->n_top ? b->p_top_tok[0] : NULL;
        r->top_logprobs = b->n_top ? b->p_top_lp[0] : NULL;
        r->beam_logprobs = b->p_lp;
        r->beam_top_tokens = b->n_top ? b->p_top_tok : NULL;
        r->beam_top_logprobs = b->n_top ? b->p_top_lp : NULL;
    }
    if (b->rows_wanted) {
        r->generation_logits = b->p_rows[0];
        r->beam_generation_logits = b->p_rows;
        r->n_vocab = b->V;
    }
}

/* A parallel copy (the out-of-SSA "parallel move" with fan-out): a destination is written once
 * nothing still needs the row in it; a value's first copy frees its own slot; when only cycles
 * remain, one row goes to the spare and its cycle unwinds. Every destination is written once:
 * O(n_dst * V) bytes moved, O(n_slots) bookkeeping. */
void bm_gather_rows(float *rows, size_t V, const uint32_t *src, uint32_t n_dst, uint32_t n_slots, float *spare,
                    uint32_t *scratch, uint8_t *done)
{
    const uint32_t SPARE = UINT32_MAX;
    uint32_t *need = scratch, *where = scratch + n_slots, *stack = where + n_slots, top = 0;
    size_t bytes = V * sizeof *rows;
    for (uint32_t a = 0; a < n_slots; a++) {
        need[a] = 0;
        where[a] = a; /* where row a's original contents are now */
        done[a] = 1;
    }
    for (uint32_t d = 0; d < n_dst; d++) {
        done[d] = src[d] == d;
        need[src[d]] += !done[d];
    }
    for (uint32_t d = 0; d < n_dst; d++)
        if (!done[d] && !need[d])
            stack[top++] = d;
    for (uint32_t next = 0;;) {
        while (top) {
            uint32_t d = stack[--top], a = src[d], from = where[a];
            memcpy(rows + (size_t)d * V, from == SPARE ? spare : rows + (size_t)from * V, bytes);
            done[d] = 1;
            where[a] = d;
            if (from == a && a < n_dst && !done[a]) /* a's first copy: slot a may be overwritten */
                stack[top++] = a;
        }
        while (next < n_dst && done[next])
            next++;
        if (next == n_dst)
            return;
        memcpy(spare, rows + (size_t)next * V, bytes); /* only cycles are left: break one */
        where[next] = SPARE;
        stack[top++] = next;
    }
}
