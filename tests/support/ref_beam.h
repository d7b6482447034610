/* A CPU reference beam search over the reference model (ref_model.h), written from the
 * definition TensorRT-LLM's beam search follows (Hugging Face's BeamSearchScorer): every step,
 * every live beam's full log-softmax (double, over the whole vocabulary) scores all
 * (beam, token) pairs by cumulative log-probability; the 2 * width best are walked in order: an
 * end token among the first width is a finished hypothesis (score cum / length^length_penalty,
 * kept among the width best; with early stopping ON a worse one ends the walk), any other token
 * is a next beam until width of them. The search stops when width finished and (ON) at once, or
 * (HEURISTIC / NEVER) when the best candidate scored at the current length (NEVER with a positive
 * penalty: at max_new) cannot beat the worst finished; at max_new the live beams join the
 * finished ones. The width best by score are returned. Each step recomputes every beam from
 * position 0: O(width * max_new * (n_prompt + max_new)^2) work, fine for the tiny test models. */
#ifndef VKI_TESTS_REF_BEAM_H
#define VKI_TESTS_REF_BEAM_H

#include "support/ref_model.h"
#include "vkinfer.h"

#define REF_BEAM_MAX 8
#define REF_BEAM_MAX_NEW 64

typedef struct ref_beam_params {
    uint32_t width, max_new;
    float length_penalty;
    vki_early_stopping early_stopping;
    const int32_t *end_ids;  /* [n_end_ids] tokens that finish a beam */
    uint32_t n_end_ids;
} ref_beam_params;

typedef struct ref_beam_result {
    uint32_t n;                                      /* beams returned, best first */
    int32_t tokens[REF_BEAM_MAX][REF_BEAM_MAX_NEW];  /* generated tokens, an end token included */
    uint32_t len[REF_BEAM_MAX];
    double cum[REF_BEAM_MAX], score[REF_BEAM_MAX];
    double lp[REF_BEAM_MAX][REF_BEAM_MAX_NEW];       /* each token's log-probability (the double
                                                        log-softmax the search scored it with);
                                                        cum is their sum, in order */
    double margin;                                   /* the smallest gap, over the steps, between
                                                        the last candidate kept as a live beam and
                                                        the best one dropped: below the device's
                                                        rounding, its search may keep the other
                                                        and end with other beams */
} ref_beam_result;

/* log(sum exp(row[v])) over [n] in double (max-subtracted): row[v] - it is the log-softmax. */
double ref_logsumexp(const float *row, uint32_t n);

vki_status ref_beam_search(ref_model *m, const int32_t *prompt, uint32_t n_prompt, const ref_beam_params *p,
                           ref_beam_result *out);

/* The logits rows a beam's tokens were chosen from: rows[k] ([n][n_vocab]) = the model's last-position
 * logits over prompt + tokens[0, k), the row the search scored tokens[k] with (a forward pass is a
 * function of the tokens, so recomputing a beam's prefixes gives exactly its lineage's rows).
 * O(n * (n_prompt + n)^2). */
vki_status ref_beam_rows(ref_model *m, const int32_t *prompt, uint32_t n_prompt, const int32_t *tokens, uint32_t n,
                         float *rows);

#endif
