/* The step plan: the one contract between scheduler/ and engine/.
 *
 * Each tick the scheduler emits a plan; engine_step() executes it as ONE forward pass over the
 * ragged batch (all new tokens of all sequences packed into one activation matrix
 * [n_tokens, d_model]), samples on the GPU, and fills one vki_step_out per sequence with
 * want_token set. Pure data: no Vulkan, no requests, no queues. */
#ifndef VKI_ENGINE_STEP_H
#define VKI_ENGINE_STEP_H

#include "vkinfer.h"

/* A page-table entry for a released page (sliding windows; see vki_step_seq.pages). */
#define VKI_PAGE_NONE UINT32_MAX
/* A decode token not yet known to the host: the one the previous step sampled for this slot,
 * read on the device (vk_engine_submit). */
#define VKI_TOKEN_PREV (-2)

typedef struct vki_step_seq {
    uint32_t slot;            /* sequence slot < engine max_seqs: indexes per-sequence device state */
    uint32_t pos0;            /* position of the first new token; KV already holds [0, pos0) */
    uint32_t n_new;           /* new tokens this step: 1 for decode, up to a chunk for prefill */
    const int32_t *tokens;    /* [n_new] token ids; a decode entry (n_new == 1) may give
                                 VKI_TOKEN_PREV (vk_engine_submit) */
    uint32_t n_pages;         /* page-table length, >= ceil((pos0 + n_new) / page_size) */
    const uint32_t *pages;    /* [n_pages] physical KV page ids, in position order; VKI_PAGE_NONE
                                 for a page released because no layer's window sees it any more
                                 (the engine refuses a plan where a query could) */
    bool want_token;          /* sample a token after the last new token (last prefill chunk or
                                 decode); false for a non-final prefill chunk */
    /* sampling (only when want_token): see the sampling issue; NULL params = greedy */
    const struct vki_sampling_params *sampling;
    uint64_t seed;            /* resolved seed (the request's, or drawn at submission) */
    const int32_t *history;   /* [n_history] the sequence's tokens before pos0 + n_new that the
                                 penalties look at (the last `window` tokens), may be NULL. A
                                 VKI_TOKEN_PREV entry gives the tokens before pos0: its penalties
                                 look at the last window - 1 of them and at the token in flight,
                                 which the engine copies on the device */
    uint32_t n_history;
    /* Constrained decoding (only when want_token): the tokens that may be sampled, a bitset of
     * ceil(n_vocab / 32) words (bit i of word w = token 32w + i), uploaded with the step's inputs
     * and applied in the GPU sampler after penalties and bias. NULL: every token. A row that
     * allows nothing samples token -1. */
    const uint32_t *token_mask;
    /* Host round trip for a logits post-processor: when set (and want_token), the engine reads
     * this sequence's logits row back after the step, calls logits_hook(logits_hook_ctx, row,
     * n_vocab) on its own thread (the hook may modify the row), and samples the modified row on
     * the host with the GPU sampler's semantics (engine/sample_ref.h). NULL: the row never
     * leaves the GPU. */
    void (*logits_hook)(void *ctx, float *logits, uint32_t n_vocab);
    void *logits_hook_ctx;
    /* Embeddings: when set, the engine reads this sequence's final hidden rows (after the output
     * norm: what the LM head would see) back after the step and calls hidden_hook(ctx, rows,
     * n_new, d_model, pos0) on its own thread; rows is [n_new][d_model], valid during the call.
     * Costs one norm over the step's rows and a device->host copy of n_new * d_model floats. */
    void (*hidden_hook)(void *ctx, const float *rows, uint32_t n_rows, uint32_t d, uint32_t pos0);
    void *hidden_hook_ctx;
    /* Logits outputs (return_context_logits / return_generation_logits): the engine hands raw
     * logits rows (before any logits_hook changes them) to logits_sink(ctx, rows, n_rows, n_vocab,
     * pos0, sampled) on its own thread; rows is [n_rows][n_vocab], row r being the logits at
     * position pos0 + r (they predict the token at pos0 + r + 1), valid during the call.
     *  - sink_sampled (and want_token): the sampled row, sampled = true. Costs one device->host
     *    copy of n_vocab floats.
     *  - sink_rows_end > pos0: every new row at a position < sink_rows_end, sampled = false.
     *    Costs an extra LM-head pass over those rows after the step (one submit per max_out rows)
     *    and their copy back. */
    void (*logits_sink)(void *ctx, const float *rows, uint32_t n_rows, uint32_t n_vocab, uint32_t pos0,
                        bool sampled);
    void *logits_sink_ctx;
    bool sink_sampled;
    uint32_t sink_rows_end;
} vki_step_seq;

/* Copy-on-write of a KV page (beam search): page dst of every layer's K and V pools becomes a
 * copy of page src before the step's forward pass reads or writes any page. */
typedef struct vki_page_copy {
    uint32_t src, dst;
} vki_page_copy;

typedef struct vki_step_plan {
    uint32_t n_seqs;
    const vki_step_seq *seqs; /* [n_seqs]; each slot appears at most once */
    uint32_t n_tokens;        /* sum of n_new */
    uint32_t n_copies;        /* page copies done first: 2 * n_layer transfers of one page each */
    const vki_page_copy *copies; /* [n_copies]; distinct dst, none of them a src */
} vki_step_plan;

#define VKI_MAX_TOP_LOGPROBS 20

typedef struct vki_step_out {
    uint32_t slot;
    int32_t token;            /* the sampled id */
    float logprob;            /* log-softmax of the model's logits at `token` */
    uint32_t n_top;           /* number of alternatives filled */
    int32_t top_tokens[VKI_MAX_TOP_LOGPROBS];
    float top_logprobs[VKI_MAX_TOP_LOGPROBS];
    bool nonfinite;           /* a logit of the row was NaN or +inf (the model's numbers broke, or
                                 a logits post-processor wrote one): `token` means nothing */
} vki_step_out;

#endif
