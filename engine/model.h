/* Model weights on the device: every tensor of the GGUF uploaded once, quantised formats kept
 * as they are (the kernels dequantise on load). */
#ifndef VKI_ENGINE_MODEL_H
#define VKI_ENGINE_MODEL_H

#include "engine/model_meta.h"
#include "engine/tensor.h"

typedef struct vk_layer {
    vk_tensor attn_norm;          /* f32 [1][d] (starcoder2: [1][2 d], its bias after the weights) */
    vk_tensor wq, wk, wv;         /* [q_dim][d], [kv_dim][d], [kv_dim][d] rows = outputs; n_parts == 0
                                     when in wqkv */
    vk_tensor wqkv;               /* [q_dim + 2 kv_dim][d] (q | k | v: phi3's, or concatenated at
                                     load), [q_dim + kv_dim][d] (q | k; v in wv) or n_parts == 0 */
    vk_tensor bq, bk, bv;         /* f32 [1][q_dim|kv_dim]; n_parts == 0 when absent; with wqkv
                                     concatenated at load, bq holds the biases of its rows */
    vk_tensor q_norm, k_norm;     /* f32 [1][hd] per-head RMSNorm weights (qwen3, gemma3) or absent */
    vk_tensor wo;                 /* [d][q_dim] */
    vk_tensor bo;                 /* f32 [1][d] output bias (gpt-oss) or absent */
    vk_tensor attn_sinks;         /* f32 [1][n_head] sink logits (gpt-oss) or absent */
    vk_tensor post_attn_norm;     /* f32 [1][d] (gemma) or absent */
    vk_tensor ffn_norm;           /* f32 [1][d] (starcoder2: [1][2 d], as attn_norm) */
    vk_tensor w_gate;             /* [d_ff][d]; absent when in w_up */
    vk_tensor w_up;               /* [d_ff][d], or [2 d_ff][d] gate rows first (phi3's, or
                                     concatenated at load) */
    vk_tensor w_down;             /* [d][d_ff] */
    vk_tensor b_up, b_down;       /* f32 [1][d_ff], [1][d] FFN biases (starcoder2) or absent */
    vk_tensor post_ffn_norm;      /* f32 [1][d] (gemma) or absent */
    /* mixture of experts (hp.n_expert > 0; then w_gate, w_up, w_down are absent): */
    vk_tensor router;             /* [n_expert][d] ffn_gate_inp */
    vk_tensor w_gate_exps;        /* [n_expert * d_ff_exp][d], rows e * d_ff_exp.. = expert e; parts of
                                     whole experts */
    vk_tensor w_up_exps;          /* [n_expert * d_ff_exp][d], same */
    vk_tensor w_down_exps;        /* [n_expert * d][d_ff_exp], rows e * d.. = expert e */
    vk_tensor router_b;           /* f32 [1][n_expert] (gpt-oss) or absent */
    vk_tensor b_gate_exps;        /* f32 [n_expert][d_ff_exp] (gpt-oss) or absent */
    vk_tensor b_up_exps;          /* f32 [n_expert][d_ff_exp] (gpt-oss) or absent */
    vk_tensor b_down_exps;        /* f32 [n_expert][d] (gpt-oss) or absent */
} vk_layer;

typedef struct vk_model {
    model_hparams hp;
    vk_tensor tok_embd;           /* [n_vocab][d] */
    vk_tensor output_norm;        /* f32 [1][d] */
    vk_tensor output;             /* [n_vocab][d]; not allocated when tied (use tok_embd) */
    vk_tensor output_b;           /* f32 [1][n_vocab] LM head bias (phi2) or absent */
    vk_tensor rope_freqs;         /* f32 [1][n_rot/2] frequency factors (llama3's, or phi3's long or
                                     short ones for the engine's context); n_parts == 0 when absent */
    vk_layer *layers;             /* [n_layer] */
    uint64_t weight_bytes;        /* device bytes held by weights */
} vk_model;

/* Uploads the weights named by `t` (found in f) for an engine whose longest sequence is n_ctx
 * (it picks phi3's long or short RoPE factors), reporting to progress (may be NULL; returning
 * false cancels: VKI_ERR_CANCELLED, nothing left allocated). concat: Q|K(|V) and gate|up of
 * one type become one tensor each (wqkv, w_up; see vk_layer). */
vki_status vk_model_load(vkd_device *d, const gguf_file *f, const model_hparams *hp, const model_tensors *t,
                         uint32_t n_ctx, bool concat, vki_progress_fn progress, void *progress_user, vk_model *m);
void vk_model_free(vkd_device *d, vk_model *m);
/* The LM head (output or, when tied, token_embd). */
const vk_tensor *vk_model_lm_head(const vk_model *m);

#endif
