/* Logits outputs (TensorRT-LLM's gather_context_logits / gather_generation_logits): the cap
 * checked at submission, the host arrays, and the sink the engine hands raw rows to.
 *
 * Rows are stored by position, so whatever computes a position again (a MAX_UTILIZATION pause
 * and resume recomputes prompt and generated tokens) overwrites the same row with the same
 * values: logits at position p predict token p + 1, so context row p = position p < n_prompt and
 * generation row k = position n_prompt - 1 + k. Memory: n_vocab * 4 bytes per row; the context
 * rows are allocated when the request enters the scheduler, the generation rows grow by doubling
 * as tokens come (a request costs what it generates, not what max_new_tokens allows). Beam
 * search keeps its rows by step and beam instead (batch_beam.c) and counts its history here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/batch/batch.h"

vki_status bm_logits_validate(const vki_batch_manager *bm, const vki_request *r, char *msg, size_t cap)
{
    uint64_t hist = bm_beam_history_bytes(r, bm->be.vocab_size); /* beam search's lineage of logprobs and rows */
    if (!r->return_context_logits && !r->return_generation_logits && !hist)
        return VKI_OK;
    const char *field = r->return_context_logits ? "return_context_logits"
                      : r->return_generation_logits ? "return_generation_logits" : "sampling.logprobs";
    if (r->pooling != VKI_POOL_NONE) {
        snprintf(msg, cap, "%s: not available for an embedding request", field);
        return VKI_ERR_INVALID_ARG;
    }
    /* n_prompt, max_new_tokens and beam_width were checked: no product below overflows */
    uint64_t beams = r->beam_width > 1 ? r->beam_width : 1;
    uint64_t rows = (r->return_context_logits ? (uint64_t)r->n_prompt : 0) +
                    (r->return_generation_logits ? (uint64_t)r->max_new_tokens * beams : 0);
    uint64_t row_bytes = (uint64_t)bm->be.vocab_size * sizeof(float), max = bm->p.max_logits_bytes;
    if (rows > max / row_bytes || hist > max - rows * row_bytes) { /* without overflow */
        char extra[64] = "";
        if (hist)
            snprintf(extra, sizeof extra, " + %llu bytes of beam history", (unsigned long long)hist);
        snprintf(msg, cap,
                 "%s: %llu logits rows x %u vocabulary x 4 bytes%s = %llu bytes exceeds max_logits_bytes %llu (fewer "
                 "tokens%s, or a larger cap in vki_batch_params)",
                 field, (unsigned long long)rows, bm->be.vocab_size, extra,
                 (unsigned long long)(rows * row_bytes + hist), (unsigned long long)max, hist ? " or beams" : "");
        return VKI_ERR_INVALID_ARG;
    }
    return VKI_OK;
}

/* Room for generation row k: doubling, capped at max_new. */
static bool gen_reserve(bm_req *q, uint32_t k, uint32_t V)
{
    if (k < q->gen_cap)
        return true;
    uint32_t cap = q->gen_cap ? 2 * q->gen_cap : 16;
    if (cap > q->max_new)
        cap = q->max_new > k ? q->max_new : k + 1;
    float *g = realloc(q->gen_logits, (size_t)cap * V * sizeof *g);
    if (!g)
        return false;
    q->gen_logits = g;
    q->gen_cap = cap;
    return true;
}

void bm_logits_context(bm_req *q, const float *rows, uint32_t n_rows, uint32_t V, uint32_t pos0)
{
    for (uint32_t r = 0; r < n_rows && pos0 + r < q->n_prompt; r++)
        memcpy(q->ctx_logits + (size_t)(pos0 + r) * V, rows + (size_t)r * V, (size_t)V * sizeof *rows);
}

/* The engine's sink (worker thread, inside the step). Beam groups have their own
 * (batch_beam.c). */
static void logits_sink(void *ctx, const float *rows, uint32_t n_rows, uint32_t V, uint32_t pos0, bool sampled)
{
    bm_req *q = ctx;
    if (!sampled) {
        bm_logits_context(q, rows, n_rows, V, pos0);
        return;
    }
    uint32_t k = pos0 + 1 - q->n_prompt; /* the sampled row is at n_prompt - 1 or later */
    if (pos0 + 1 < q->n_prompt || !gen_reserve(q, k, V)) {
        q->logits_oom = true;
        return;
    }
    memcpy(q->gen_logits + (size_t)k * V, rows, (size_t)V * sizeof *rows);
}

vki_status bm_logits_attach(vki_batch_manager *bm, bm_req *q, sched_add_args *a)
{
    if (!q->want_ctx_logits && !q->want_gen_logits)
        return VKI_OK;
    if (q->want_ctx_logits) {
        q->ctx_logits = calloc((size_t)q->n_prompt * bm->be.vocab_size, sizeof *q->ctx_logits);
        if (!q->ctx_logits)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        a->sink_rows_end = q->n_prompt;
        a->no_reuse = true; /* every prompt position must go through the LM head */
    }
    a->sink_sampled = q->want_gen_logits;
    a->logits_sink = logits_sink;
    a->logits_sink_ctx = q;
    return VKI_OK;
}

void bm_logits_fill(const vki_batch_manager *bm, bm_req *q, vki_response *r, uint32_t from)
{
    uint32_t V = bm->be.vocab_size;
    if (q->ctx_logits && !q->ctx_sent && (r->n_tokens || r->final)) {
        q->ctx_sent = true;
        /* only once the whole prompt was computed: a token was sampled after it */
        bool done = q->seq && sched_seq_generated(q->seq) > 0;
        r->context_logits = done ? q->ctx_logits : NULL;
        r->n_context_logits = done ? q->n_prompt : 0;
    }
    if (q->gen_logits && r->n_tokens)
        r->generation_logits = q->gen_logits + (size_t)from * V;
    if (r->context_logits || r->generation_logits)
        r->n_vocab = V;
}
