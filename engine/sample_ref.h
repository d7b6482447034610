/* Sampling semantics on the CPU: the parameter check the batch manager reuses at submission,
 * the packing of a request into the GPU's per-row structs (shaders/vki_shared.h), and the scalar
 * reference of the sampling kernel: the exact categorical distribution, the reference draw from
 * the same (seed, position) uniform, and OpenAI logprobs. Pure C, no Vulkan: the host round trip
 * for requests with a logits post-processor samples with sample_ref_sample().
 *
 * Definitions shared with shaders/sample.comp (the GPU follows them exactly):
 *  - z: the logit with NaN -> -inf and +inf -> FLT_MAX; then, for each distinct token of the
 *    penalty window (count c > 0): z = z > 0 ? z * (1/rep) : z * rep; z -= c * frequency +
 *    presence; then z += bias (summed when a token appears twice in the bias list); then
 *    z = -inf for every token the row's allowed-token mask excludes (VKI_SAMPLE_MASK).
 *  - order: (z descending, id ascending). Every cut keeps a prefix of it: top-k the first k;
 *    top-p the shortest prefix of the top-k survivors whose weight reaches top_p of theirs;
 *    min-p the tokens with z >= z_max + temperature * log(min_p). Survivors: the shortest cut.
 *  - weight: w = exp((z - z_max) / T) as f32, times 2^40, truncated to an integer (exactly 2^40
 *    at z_max); probability w / sum(w) over the survivors. Tokens with w < 2^-40 never come out.
 *  - draw: u = 64 bits of Philox4x32-10(key = seed, counter = {position, 0, 0, 0}) (word 0 the
 *    high half); target = floor(sum(w) * u / 2^64); the token is the first survivor in id order
 *    whose inclusive prefix sum of w exceeds target.
 *  - temperature 0: the argmax of z, lowest id on ties. A row whose z are all -inf gives -1
 *    (every token banned by bias or mask, or NaN logits): the caller ends that request.
 *  - logprobs: log-softmax of the raw (sanitised) logits; alternatives by (raw desc, id asc). */
#ifndef VKI_ENGINE_SAMPLE_REF_H
#define VKI_ENGINE_SAMPLE_REF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shaders/vki_shared.h"
#include "vkinfer.h"

/* One row to sample: a request's parameters at one position. */
typedef struct sample_req {
    const vki_sampling_params *params; /* NULL: greedy, no penalties, no logprobs */
    uint64_t seed;                     /* resolved seed (the request's or drawn at submission) */
    uint32_t position;                 /* position of the token being sampled */
    const int32_t *history;            /* [n_history] tokens the penalties look at; only the last
                                          params->penalty_window are used */
    uint32_t n_history;
    const uint32_t *mask;              /* [ceil(n_vocab / 32)] allowed tokens (a grammar's), bit i of
                                          word w = token 32w + i; NULL: every token */
    bool pending;                      /* the window's newest token is not in history: it is the
                                          token in flight (VKI_TOKEN_PREV); the penalties look at
                                          the last penalty_window - 1 of history and at it */
    int32_t pending_token;             /* its value when the host knows it (the reference, tests);
                                          the engine overwrites it on the device (VKI_SAMPLE_PENDING).
                                          Outside the vocabulary (-1): no token */
} sample_req;

/* Largest vocabulary the kernel's 64-bit fixed-point sums allow (n * 2^40 < 2^63). */
#define SAMPLE_MAX_VOCAB (1u << 22)

/* Checks a request's sampling parameters against the vocabulary. VKI_OK, or VKI_ERR_INVALID_ARG
 * with a message naming the field in err (e.g. "top_p must be in (0, 1], got 1.5"). */
vki_status sample_params_check(const vki_sampling_params *p, uint32_t n_vocab, char *err, size_t n);

/* Upper bound of the edit entries sample_pack_row writes for r. */
uint32_t sample_edits_bound(const sample_req *r);

/* Whether r's row has a pending entry: r->pending with penalties on and a window of >= 1. */
bool sample_req_pends(const sample_req *r);

/* Packs r into *row and edits[0 .. *n_used) (the row's entries, which the GPU reads at
 * edits_buffer[edit0 ..]; row->edit0 = edit0). cap >= sample_edits_bound(r). With r->mask the
 * row gets VKI_SAMPLE_MASK and reads its mask at masks_buffer[mask0 ..] (the caller copies it
 * there). When r's penalties have a pending token (sample_req_pends) the row gets
 * VKI_SAMPLE_PENDING and its last entry, edits[*n_used - 1] = {pending_token, 1, 0}, is the
 * pending one (row->pend = edit0 + *n_used - 1; n_edits counts the others): a caller may move it
 * elsewhere and set row->pend. Checks the parameters (sample_params_check) and the history ids;
 * VKI_ERR_INVALID_ARG with err filled. */
vki_status sample_pack_row(const sample_req *r, uint32_t n_vocab, uint32_t edit0, uint32_t mask0, vki_sample_row *row,
                           vki_sample_edit *edits, uint32_t cap, uint32_t *n_used, char *err, size_t n_err);

/* ---- building blocks (exposed for the tests) ----------------------------------------------- */

uint32_t sample_key(float z);   /* order key: unsigned order = float order, -0 == +0 */
float sample_sanitize(float x); /* NaN -> -inf, +inf -> FLT_MAX */
void sample_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
uint64_t sample_uniform64(uint64_t seed, uint32_t position);
uint64_t sample_mulhi64(uint64_t a, uint64_t b); /* floor(a * b / 2^64) */

/* ---- the reference ---------------------------------------------------------------------------- */

/* The distribution the kernel samples one row from. */
typedef struct sample_dist {
    uint32_t n_vocab;
    int32_t argmax;   /* first token of the order; -1 when every z is -inf */
    bool greedy;
    float *z;         /* [n_vocab] logits after penalties and bias, sanitised */
    uint64_t *w;      /* [n_vocab] fixed-point weight of each survivor, 0 for the others */
    uint64_t total;   /* sum of w */
    uint32_t n_kept;  /* survivors with w > 0 (1 when greedy, 0 when argmax is -1) */
} sample_dist;

/* Builds the distribution of one packed row: logits[n_vocab] raw, edits = the whole edit list
 * (row->edit0 indexes it), masks = the whole mask buffer (row->mask0 indexes it; may be NULL when
 * the row has no VKI_SAMPLE_MASK). O(n log n) with a cut active (a sort of the vocabulary), else
 * O(n). */
vki_status sample_dist_build(const float *logits, uint32_t n_vocab, const vki_sample_row *row,
                             const vki_sample_edit *edits, const uint32_t *masks, sample_dist *d);
void sample_dist_free(sample_dist *d);
double sample_dist_prob(const sample_dist *d, uint32_t token); /* w / total; 1 at argmax if greedy */

/* The reference draw for (seed, position): the token, and in *margin (may be NULL) the distance
 * from the draw's target to the nearest edge of the token's interval, over total: a GPU whose
 * exp() differs by a few ulp can pick a neighbour only when margin < ~1e-6. */
int32_t sample_dist_draw(const sample_dist *d, uint64_t seed, uint32_t position, double *margin);

/* Logprob fields of *out for a chosen token (raw logits, double precision): logprob (when
 * want_logprob, else 0) and the n_top (<= VKI_SAMPLE_MAX_TOP) alternatives. */
void sample_ref_logprobs(const float *logits, uint32_t n_vocab, int32_t token, bool want_logprob,
                         uint32_t n_top, vki_sample_out *out);

/* Everything the kernel writes for one packed row. */
vki_status sample_ref_row(const float *logits, uint32_t n_vocab, const vki_sample_row *row,
                          const vki_sample_edit *edits, const uint32_t *masks, vki_sample_out *out);

/* One request on the host (post-processor round trip): check, pack, sample. */
vki_status sample_ref_sample(const float *logits, uint32_t n_vocab, const sample_req *req, vki_sample_out *out,
                             char *err, size_t n_err);

#endif
