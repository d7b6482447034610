/* Scalar CPU reference forward pass (llama incl. Mixtral's experts, qwen2, qwen3, qwen3moe,
 * gemma2, gemma3, phi3), straight from
 * the maths as llama.cpp's graphs compute it: weights dequantised to f32 once at load,
 * activations f32, dot products accumulated in double, RoPE angles in double, attention as a
 * plain masked softmax over every cached position (no pages, no splits). Used by the tests as
 * the answer the device must match. */
#ifndef VKI_TESTS_REF_MODEL_H
#define VKI_TESTS_REF_MODEL_H

#include "engine/model_meta.h"

typedef struct ref_model ref_model;

typedef struct ref_model_opts {
    uint32_t kv_type;    /* VKI_GGML_F32 / F16 / Q8_0: K and V are rounded through it when cached,
                            as the device's KV pool does */
    uint32_t n_ctx;      /* the engine's context (phi3: long or short RoPE factors); 0 = the model's */
    uint32_t max_window; /* the engine's max_attention_window (0 = none) ... */
    uint32_t page_size;  /* ... whose attention sink is the first page */
} ref_model_opts;

vki_status ref_model_load(const char *path, const ref_model_opts *o, ref_model **out, char *err, size_t err_len);
void ref_model_free(ref_model *m);
const model_hparams *ref_model_hparams(const ref_model *m);

/* Runs tokens[0..n) from position 0 with a fresh KV cache. logits: [n][n_vocab] when all, else
 * [n_vocab] for the last position only. */
vki_status ref_model_forward(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits);
/* ref_model_forward with the cached K/V given: attention reads kv_in [n][n_layer][K, V][kv_dim]
 * (e.g. a device's pool read back and dequantised) in place of the rows the reference computes
 * and rounds; kv_out (when not NULL) receives those computed rows unrounded, same layout. For a
 * Q8_0 pool: a K the device computes a few f32 ulps off the reference's can round to the other
 * side of a quantisation step (1/127 of its block's largest magnitude); fed the device's own
 * rows, the rest of the pass is compared without those flips, and the rows are checked apart. */
vki_status ref_model_forward_kv(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits,
                                const float *kv_in, float *kv_out);
/* The final hidden states (after the output norm: what the LM head reads) of tokens[0..n) from
 * position 0: hidden [n][d_model]. */
vki_status ref_model_hidden(ref_model *m, const int32_t *tokens, uint32_t n, float *hidden);

/* Mixture of experts: the smallest gap, over every position and layer of the last
 * ref_model_forward, between the last chosen expert's router logit and the best unchosen one
 * (INFINITY for a dense model). A device path whose activations differ by rounding (F16
 * operands) may choose other experts where it is that small. */
double ref_model_route_margin(const ref_model *m);

/* Mixture-of-experts routing as llama.cpp computes it (in double): the n_used largest of
 * logits[0..n) (ties: lower index first) into ids, their softmax weights over all n into w,
 * renormalised over the chosen ones when norm. */
void ref_moe_route(const float *logits, uint32_t n, uint32_t n_used, bool norm, int32_t *ids, float *w);

#endif
