/* Scalar CPU reference forward pass (llama / qwen2), straight from the maths: weights
 * dequantised to f32 once at load, activations f32, dot products accumulated in double,
 * RoPE angles in double. Used by the tests as the answer the device must match. */
#ifndef VKI_TESTS_REF_MODEL_H
#define VKI_TESTS_REF_MODEL_H

#include "engine/model_meta.h"

typedef struct ref_model ref_model;

/* kv_f16: round K and V through f16 when caching them, as the device's F16 KV cache does. */
vki_status ref_model_load(const char *path, bool kv_f16, ref_model **out, char *err, size_t err_len);
void ref_model_free(ref_model *m);
const model_hparams *ref_model_hparams(const ref_model *m);

/* Runs tokens[0..n) from position 0 with a fresh KV cache. logits: [n][n_vocab] when all, else
 * [n_vocab] for the last position only. */
vki_status ref_model_forward(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits);
/* The final hidden states (after the output norm: what the LM head reads) of tokens[0..n) from
 * position 0: hidden [n][d_model]. */
vki_status ref_model_hidden(ref_model *m, const int32_t *tokens, uint32_t n, float *hidden);

#endif
