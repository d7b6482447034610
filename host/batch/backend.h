/* What the batch manager needs from an executor: one forward step over a step plan, plus the
 * facts that size its scheduler. The real engine provides one (host/api/engine_api.c); tests
 * provide a fake that computes a deterministic next token from the sequence so far. */
#ifndef VKI_HOST_BACKEND_H
#define VKI_HOST_BACKEND_H

#include "engine/step.h"

/* bm_backend.kv_flags: choices of the engine (not the model) that change the KV it writes. */
#define BM_KV_ROPE_LONG 1u     /* LongRoPE's long factors (context above the original length) */
#define BM_KV_ROPE_MAG 2u      /* K scaled by LongRoPE's / YaRN's attention factor (before 2026-12,
                                  vkinfer folded it into the scores instead: such K differs) */

typedef struct bm_backend {
    void *ctx;
    uint32_t max_seqs;   /* sequence slots: at most this many sequences hold KV at once */
    uint32_t n_pages;    /* KV pages in the pool */
    uint32_t page_size;  /* tokens per page */
    uint32_t max_ctx;    /* longest sequence (prompt + generated) the model accepts */
    uint32_t max_tokens; /* most new tokens in one step (0: unlimited) */
    uint32_t vocab_size;
    /* Windows on every layer: pages wholly before a sequence's last kv_window positions (and past
     * its first kv_sink) are seen by no layer: the scheduler releases them while it runs (and
     * plans them as VKI_PAGE_NONE). 0 = every page stays. */
    uint32_t kv_window, kv_sink;
    uint32_t n_embd;     /* width of the hidden rows a hidden_hook receives (embeddings) */
    /* Runs the plan; fills outs[i] for the i-th sequence of the plan with want_token set, in
     * plan order. On error nothing of the plan took effect for sampling purposes; the KV of
     * its sequences is undefined (the batch manager fails or recomputes them). */
    vki_status (*step)(void *ctx, const vki_step_plan *plan, vki_step_out *outs);
    /* Optional, both or neither: step split in two so that the next step can be submitted before
     * this one is waited for (two in flight at most, waited in submission order). A decode entry
     * of the second may give VKI_TOKEN_PREV: the token the first sampled for that slot, which the
     * executor reads itself. submit refuses a plan it cannot run (nothing ran then); wait returns
     * the oldest step's outs or its failure (after which the later step's result means nothing).
     * masks_later: the rows' token masks are read by masks(), not by submit (the rows that have
     * one are fixed at submit): a grammar's mask for the step can come from the token the step
     * before samples. Then masks() for that plan must come before any other submit or wait. */
    vki_status (*submit)(void *ctx, const vki_step_plan *plan, bool masks_later);
    vki_status (*wait)(void *ctx, vki_step_out *outs);
    /* With submit: the masks of the last submitted step (its plan, whose rows' token_mask
     * pointers may have been changed to other buffers of the same size), which then samples. */
    vki_status (*masks)(void *ctx, const vki_step_plan *plan);
    /* Steps so far whose recording was reused (vki_batch_stats.steps_reused); NULL: 0. */
    uint64_t (*steps_reused)(void *ctx);
    /* End-of-generation token (EOS/EOT from the model's metadata). */
    bool (*is_eog)(void *ctx, int32_t token);
    /* The bytes of a token as generated text shows them (vki_token_to_piece's contract, control
     * tokens empty), for grammar-constrained requests. NULL: such requests are refused. */
    vki_status (*token_piece)(void *ctx, int32_t token, char *buf, size_t cap, size_t *n_out);
    /* Called once when the batch manager is destroyed (may be NULL): the executor may serve
     * another manager afterwards. */
    void (*detach)(void *ctx);
    /* The model's tokenizer and chat template, for vki_generate / vki_generate_chat; NULL for
     * executors without a vocabulary (test fakes), where those calls are refused. */
    const vki_tokenizer *tok;
    const vki_chat_template *chat;
    /* Session files (batch_session_file.c). The model's identity and KV layout, which a file must
     * match, and copies of the KV of whole pages between the pool and the host in the layout
     *     [n * page_size tokens][kv_layers][K, V][kv_heads][kv_row_bytes]
     * (the engine's vk_engine_kv_read). Called by the worker between steps. kv_read NULL: session
     * files are refused. */
    uint64_t fingerprint;      /* gguf_fingerprint of the model */
    const char *model_name;    /* for messages; lives as long as ctx */
    uint32_t kv_layers, kv_heads, kv_head_dim;
    uint32_t kv_type;          /* VKI_GGML_F32, F16 or Q8_0 */
    uint32_t kv_row_bytes;     /* one token's row of one head in kv_type */
    uint32_t kv_flags;         /* how the engine computes KV beyond the model: BM_KV_* */
    vki_status (*kv_read)(void *ctx, const uint32_t *pages, uint32_t n, void *dst);
    vki_status (*kv_write)(void *ctx, const uint32_t *pages, uint32_t n, const void *src);
} bm_backend;

#endif
