/* Batch manager requests: deep copies, validation against the model, the request list that
 * get_requests fills, and the in-flight id map. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rng.h"
#include "engine/sample_ref.h"
#include "host/batch/batch.h"

vki_batch_params vki_batch_default_params(void)
{
    return (vki_batch_params){
        .policy = VKI_POLICY_GUARANTEED_NO_EVICT,
        .max_batch_size = 0,
        .max_num_tokens = 8192,
        .chunk_size = 512,
        .max_queue = 1024,
        .block_reuse = true,
        .stats = true,
        .idle_poll_us = 1000,
        .seed = 0,
        .max_beam_width = 8,
        .max_logits_bytes = 256u << 20,
        .session_idle_s = 300,
        .session_max_blocks = 0,
    };
}

uint64_t bm_next_seed(uint64_t *state)
{
    return vki_splitmix64(state);
}

/* ---- validation --------------------------------------------------------------------------- */

static bool ids_ok(const int32_t *ids, uint32_t n, uint32_t vocab, const char *field, char *msg, size_t cap)
{
    if (n && !ids) {
        snprintf(msg, cap, "%s: NULL with %u ids", field, n);
        return false;
    }
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab) {
            snprintf(msg, cap, "%s[%u]: token %d outside the vocabulary [0, %u)", field, i, ids[i], vocab);
            return false;
        }
    return true;
}

/* The sampler's own check (one definition of valid parameters), its message prefixed with the
 * request field: "sampling.top_p must be in (0, 1], got 1.5". */
static bool sampling_ok(const vki_sampling_params *s, uint32_t vocab, char *msg, size_t cap)
{
    char why[160];
    if (sample_params_check(s, vocab, why, sizeof why) == VKI_OK)
        return true;
    snprintf(msg, cap, "sampling.%s", why);
    return false;
}

/* Everything about a request that can be checked without the scheduler's state. Reads only the
 * manager's immutable configuration: safe on any thread. O(prompt + ids + bias). */
vki_status bm_validate(const vki_batch_manager *bm, const vki_request *r, char *msg, size_t cap)
{
    uint32_t vocab = bm->be.vocab_size;
    if (!r) {
        snprintf(msg, cap, "request: NULL");
        return VKI_ERR_INVALID_ARG;
    }
    if (r->n_prompt && !r->prompt) {
        snprintf(msg, cap, "prompt: NULL with n_prompt %u", r->n_prompt);
        return VKI_ERR_INVALID_ARG;
    }
    if ((unsigned)r->pooling > VKI_POOL_LAST) {
        snprintf(msg, cap, "pooling: %d is not a vki_pooling", (int)r->pooling);
        return VKI_ERR_INVALID_ARG;
    }
    bool embed = r->pooling != VKI_POOL_NONE; /* runs the prompt and one (discarded) sample */
    if (sched_validate(bm->s, r->n_prompt, embed ? 1 : r->max_new_tokens, msg, cap) != VKI_OK)
        return VKI_ERR_INVALID_ARG;
    if (!embed && r->min_tokens > r->max_new_tokens) {
        snprintf(msg, cap, "min_tokens: %u exceeds max_new_tokens %u", r->min_tokens, r->max_new_tokens);
        return VKI_ERR_INVALID_ARG;
    }
    if (!ids_ok(r->prompt, r->n_prompt, vocab, "prompt", msg, cap) ||
        !ids_ok(r->end_ids, r->n_end_ids, vocab, "end_ids", msg, cap) ||
        !ids_ok(r->stop_ids, r->n_stop_ids, vocab, "stop_ids", msg, cap) ||
        (!embed && !sampling_ok(&r->sampling, vocab, msg, cap)))
        return VKI_ERR_INVALID_ARG;
    vki_status st = bm_beam_validate(bm, r, msg, cap); /* the width first: the logits cap counts beams */
    return st == VKI_OK ? bm_logits_validate(bm, r, msg, cap) : st;
}

/* ---- copies ------------------------------------------------------------------------------- */

/* Copies n elements; *out = NULL when n == 0. False on overflow or out of memory. */
static bool dup_array(const void *src, uint32_t n, size_t elem, void **out)
{
    *out = NULL;
    if (!n || !src)
        return true;
    if ((size_t)n > SIZE_MAX / elem)
        return false;
    *out = malloc((size_t)n * elem);
    if (!*out)
        return false;
    memcpy(*out, src, (size_t)n * elem);
    return true;
}

vki_status bm_req_copy(const vki_request *r, bm_req **out)
{
    *out = NULL;
    bm_req *q = calloc(1, sizeof *q);
    if (!q)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    q->id = r->id;
    q->n_prompt = r->prompt ? r->n_prompt : 0;
    q->pooling = r->pooling;
    q->max_new = r->pooling != VKI_POOL_NONE ? 1 : r->max_new_tokens;
    q->min_tokens = r->pooling != VKI_POOL_NONE ? 0 : r->min_tokens;
    q->n_end_ids = r->end_ids ? r->n_end_ids : 0;
    q->n_stop_ids = r->stop_ids ? r->n_stop_ids : 0;
    q->sampling = r->sampling;
    q->streaming = r->streaming;
    q->ignore_eos = r->ignore_eos;
    q->processor = r->logits_processor;
    q->processor_user = r->logits_processor_user;
    q->priority = r->priority;
    q->session_id = r->pooling != VKI_POOL_NONE ? 0 : r->session_id;
    q->n_top = r->sampling.top_logprobs <= VKI_MAX_TOP_LOGPROBS ? r->sampling.top_logprobs : 0;
    q->want_lp = r->sampling.logprobs || q->n_top;
    q->want_ctx_logits = r->return_context_logits;
    q->want_gen_logits = r->return_generation_logits;
    q->beam_width = r->beam_width > 1 && r->pooling == VKI_POOL_NONE ? r->beam_width : 1;
    q->length_penalty = r->length_penalty;
    q->early_stopping = r->early_stopping;
    uint32_t n_bias = r->sampling.logit_bias ? r->sampling.n_logit_bias : 0;
    if (q->pooling != VKI_POOL_NONE) { /* embeddings: the one sample is discarded; greedy, no extras */
        q->sampling = vki_sampling_default_params();
        q->sampling.temperature = 0;
        q->n_top = 0;
        q->want_lp = false;
        n_bias = 0;
    }
    bool ok = dup_array(r->prompt, q->n_prompt, sizeof(int32_t), (void **)&q->prompt) &&
              dup_array(r->end_ids, q->n_end_ids, sizeof(int32_t), (void **)&q->end_ids) &&
              dup_array(r->stop_ids, q->n_stop_ids, sizeof(int32_t), (void **)&q->stop_ids) &&
              dup_array(r->sampling.logit_bias, n_bias, sizeof(vki_logit_bias), (void **)&q->bias);
    q->sampling.logit_bias = q->bias;
    q->sampling.n_logit_bias = n_bias;
    if (!ok) {
        bm_req_free(q);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    *out = q;
    return VKI_OK;
}

void bm_req_free(bm_req *q)
{
    if (!q)
        return;
    free(q->prompt);
    free(q->end_ids);
    free(q->stop_ids);
    free(q->bias);
    free(q->ban);
    free(q->emb_sum);
    free(q->emb);
    free(q->lp);
    free(q->top_tok);
    free(q->top_lp);
    free(q->ctx_logits);
    free(q->gen_logits);
    bm_beam_free(q);
    gram_grammar_free(q->grammar);
    free(q->gbnf);
    gram_req_free(&q->gr);
    free(q);
}

/* ---- the request list that get_requests fills -------------------------------------------- */

vki_status vki_request_list_add(vki_request_list *sink, const vki_request *req)
{
    if (!sink || !req)
        return VKI_ERR_INVALID_ARG;
    if (sink->max >= 0 && sink->n >= (uint32_t)sink->max)
        return VKI_RETRY_QUEUE_FULL;
    bm_req *q;
    vki_status st = bm_req_copy(req, &q);
    if (st != VKI_OK)
        return st;
    /* a refusal is sent by the worker */
    if (bm_validate(sink->bm, req, q->error, sizeof q->error) == VKI_OK &&
        bm_constraint_compile(sink->bm, req, q, q->error, sizeof q->error) == VKI_ERR_OUT_OF_HOST_MEMORY) {
        bm_req_free(q);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    if (sink->tail)
        sink->tail->next = q;
    else
        sink->head = q;
    sink->tail = q;
    sink->n++;
    return VKI_OK;
}

void bm_request_list_free(vki_request_list *l)
{
    for (bm_req *q = l->head, *n; q; q = n) {
        n = q->next;
        bm_req_free(q);
    }
    l->head = l->tail = NULL;
    l->n = 0;
}

/* ---- in-flight id map: chained hash, grown by doubling; O(1) amortised per operation ------- */

static uint32_t id_hash(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return (uint32_t)id;
}

vki_status bm_map_init(bm_id_map *m)
{
    m->mask = 63;
    m->n = 0;
    m->buckets = calloc(m->mask + 1, sizeof *m->buckets);
    return m->buckets ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
}

void bm_map_free(bm_id_map *m)
{
    free(m->buckets);
    m->buckets = NULL;
}

bm_req *bm_map_find(const bm_id_map *m, uint64_t id)
{
    for (bm_req *q = m->buckets[id_hash(id) & m->mask]; q; q = q->hnext)
        if (q->id == id)
            return q;
    return NULL;
}

static vki_status map_grow(bm_id_map *m)
{
    if (m->mask >= UINT32_MAX / 4)
        return VKI_OK; /* keep longer chains rather than fail */
    uint32_t mask = m->mask * 2 + 1;
    bm_req **b = calloc((size_t)mask + 1, sizeof *b);
    if (!b)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i <= m->mask; i++)
        for (bm_req *q = m->buckets[i], *n; q; q = n) {
            n = q->hnext;
            bm_req **head = &b[id_hash(q->id) & mask];
            q->hnext = *head;
            *head = q;
        }
    free(m->buckets);
    m->buckets = b;
    m->mask = mask;
    return VKI_OK;
}

vki_status bm_map_insert(bm_id_map *m, bm_req *q)
{
    if (m->n >= m->mask && map_grow(m) != VKI_OK)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    bm_req **head = &m->buckets[id_hash(q->id) & m->mask];
    q->hnext = *head;
    *head = q;
    m->n++;
    return VKI_OK;
}

void bm_map_remove(bm_id_map *m, bm_req *q)
{
    for (bm_req **p = &m->buckets[id_hash(q->id) & m->mask]; *p; p = &(*p)->hnext)
        if (*p == q) {
            *p = q->hnext;
            q->hnext = NULL;
            m->n--;
            return;
        }
}
