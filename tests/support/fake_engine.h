/* A fake executor for scheduler and batch-manager tests: no GPU, deterministic, adversarial.
 *
 * Its "KV cache" is real memory: n_pages pages of page_size entries, each entry holding
 * (token, position, h) where h is a hash chained over every token of the sequence up to that
 * position. A step reads a sequence's whole history through the plan's page table (as attention
 * does), verifies the chain entry by entry, extends it over the new tokens (writing them into the
 * pages), and when asked samples next = f(h of the last position, seed). So a wrong page table,
 * a page overwritten by another sequence, a lost or repeated token or a wrongly reused prefix
 * block either trips the chain check or changes the output, and every output can be compared with
 * fake_reference(): what the request produces alone.
 *
 * It also checks each plan's invariants (slots unique and in range, budgets, page tables cover
 * pos0 + n_new, pages in range and not repeated, released pages (VKI_PAGE_NONE) only where the
 * window no longer sees, no page written by one sequence and read or
 * written by another in the same step, penalty history = the sequence's last tokens) and fails
 * loudly: it prints the violation, counts it, and refuses the step with VKI_ERR_INTERNAL. It is
 * called from one thread at a time; read its counters after that thread is joined. */
#ifndef VKI_TESTS_FAKE_ENGINE_H
#define VKI_TESTS_FAKE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/batch/backend.h"

typedef struct fake_config {
    uint32_t max_seqs, n_pages, page_size, max_ctx, vocab;
    uint32_t max_batch;       /* sequences per step the plan may hold; 0 = max_seqs */
    uint32_t max_tokens;      /* tokens per step; 0 = unchecked */
    int32_t eos;              /* is_eog() is true for this token; -1 = never */
    uint32_t fail_every;      /* every Nth step fails with fail_status after scribbling over the
                                 pages it would have written; 0 = never */
    vki_status fail_status;   /* that failure; 0 = VKI_ERR_DEVICE_LOST */
    uint32_t window, sink;    /* attention window and sink (the engine's kv_window / kv_sink): a
                                 step reads only the positions its first new token sees, and a page
                                 may be VKI_PAGE_NONE only where none of them lies; 0 = all. A
                                 window of 1 is refused: the chain continues from the previous
                                 token's entry, which the window must cover */
    uint64_t fingerprint;     /* the model identity session files carry; 0 = a fixed default */
    uint32_t kv_flags;        /* bm_backend.kv_flags (session files) */
    /* fake_backend offers submit / wait (two steps in flight, VKI_TOKEN_PREV); also when the
     * environment has VKI_FAKE_OVERLAP=1 (ctest runs the batch suites both ways) */
    bool overlap;
    /* called with every plan before it runs (after the checks), e.g. to record its shape */
    void (*on_step)(void *user, const vki_step_plan *plan);
    void *on_step_user;
} fake_config;

typedef struct fake_engine fake_engine;

vki_status fake_create(const fake_config *c, fake_engine **out);
void fake_destroy(fake_engine *f);
bm_backend fake_backend(fake_engine *f);

/* bm_backend entry points (ctx = the fake_engine) */
vki_status fake_step(void *ctx, const vki_step_plan *plan, vki_step_out *outs);
/* The step runs at submit (in submission order, as a device queue does); wait hands over its
 * outs and status, oldest first. A third step in flight, a wait with none, a VKI_TOKEN_PREV whose
 * slot the previous submitted step did not sample, or a PREV row whose penalty history is not
 * the window's tokens before its position (the engine adds the one in flight) are violations. A step reading PREV tokens of a failed step fails too (its inputs mean nothing). */
vki_status fake_submit(void *ctx, const vki_step_plan *plan, bool masks_later);
vki_status fake_wait(void *ctx, vki_step_out *outs);
/* masks_later: the masked rows' tokens are drawn here, under the masks the plan's rows point at
 * now (a mask that appeared or went since the submit, masks given twice or never before the
 * next submit or the wait are violations). */
vki_status fake_masks(void *ctx, const vki_step_plan *plan);
uint64_t fake_late_masks(const fake_engine *f); /* fake_masks calls that drew tokens */
uint64_t fake_prev_rows(const fake_engine *f); /* VKI_TOKEN_PREV rows run so far */
bool fake_is_eog(void *ctx, int32_t token);
/* Token i's bytes: one of 24 JSON-ish words ("{", "\":", "true", "a", ...), i modulo 24; token 0 is
 * "<eos>". A row with a token mask or -inf logit biases draws its own token if allowed, else the
 * next allowed id, else -1 (as the GPU sampler returns for a row that allows nothing). */
vki_status fake_token_piece(void *ctx, int32_t token, char *buf, size_t cap, size_t *n_out);

/* Session files: the fake's KV in the backend's layout (1 layer, 1 head, rows of 16 bytes: K =
 * token, position, chain hash; V = valid, the hash's complement), so a restored page that is
 * wrong trips the chain check of the next step that reads it. */
vki_status fake_kv_read(void *ctx, const uint32_t *pages, uint32_t n, void *dst);
vki_status fake_kv_write(void *ctx, const uint32_t *pages, uint32_t n, const void *src);
uint32_t fake_kv_copies(const fake_engine *f); /* kv_read / kv_write calls so far */

/* Number of invariant violations so far; the first one's text goes to msg. */
uint32_t fake_violations(const fake_engine *f, char *msg, size_t cap);
uint64_t fake_steps(const fake_engine *f);        /* steps run (failed ones included) */
uint32_t fake_max_seqs_seen(const fake_engine *f);   /* largest plan.n_seqs */
uint32_t fake_max_tokens_seen(const fake_engine *f); /* largest plan.n_tokens */

/* The token stream (and its logprobs, when lp is not NULL) that a request produces alone:
 * out[0..max_new) with no stop condition applied. sampled: the request samples with
 * temperature > 0 (then the seed matters, as in the real sampler); greedy ignores the seed. */
void fake_reference(const fake_engine *f, const int32_t *prompt, uint32_t n_prompt, uint32_t max_new,
                    bool sampled, uint64_t seed, int32_t *out, float *lp);

/* Top alternative j of a sampled token t with logprob lp is (t + 1 + j) % vocab with logprob
 * lp - 1 - j (n_top = the request's top_logprobs). A row with a logits sink that wants sampled
 * rows gets [vocab] floats: those logprobs at those ids, -100 elsewhere (context rows: none). */
#endif
