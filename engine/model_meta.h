/* Model description from GGUF metadata: hyperparameters and the weight tensors, found and
 * shape-checked once, shared by the device loader (engine/model.c) and the CPU reference
 * forward pass (tests). No Vulkan. */
#ifndef VKI_ENGINE_MODEL_META_H
#define VKI_ENGINE_MODEL_META_H

#include "engine/gguf.h"

typedef enum model_arch {
    MODEL_ARCH_LLAMA = 0, /* Llama 1/2/3, TinyLlama, SmolLM, Mistral (no sliding window) */
    MODEL_ARCH_QWEN2 = 1, /* + Q/K/V biases, NeoX RoPE */
} model_arch;

typedef struct model_hparams {
    model_arch arch;
    char arch_name[16];
    uint32_t n_layer;
    uint32_t d_model;       /* embedding length */
    uint32_t n_head;
    uint32_t n_head_kv;     /* GQA: n_head % n_head_kv == 0; MQA: 1 */
    uint32_t head_dim;      /* key/value length per head */
    uint32_t d_ff;
    uint32_t n_vocab;
    uint32_t n_ctx_train;   /* context length from metadata */
    uint32_t n_rot;         /* rotary dims per head (<= head_dim) */
    bool rope_neox;         /* rotate (i, i + n_rot/2) instead of (2i, 2i+1) */
    float rope_base;
    float rope_freq_scale;  /* 1 / linear scaling factor */
    float rms_eps;
    bool qkv_bias;
    bool tied_embeddings;   /* no output.weight: the LM head reuses token_embd */
} model_hparams;

typedef struct model_layer_tensors {
    const gguf_tensor *attn_norm;          /* f32 [d_model] */
    const gguf_tensor *wq, *wk, *wv;       /* [d_model -> n_head*hd | n_head_kv*hd] */
    const gguf_tensor *bq, *bk, *bv;       /* f32 biases (qwen2) or NULL */
    const gguf_tensor *wo;                 /* [n_head*hd -> d_model] */
    const gguf_tensor *ffn_norm;           /* f32 [d_model] */
    const gguf_tensor *w_gate, *w_up;      /* [d_model -> d_ff] */
    const gguf_tensor *w_down;             /* [d_ff -> d_model] */
} model_layer_tensors;

typedef struct model_tensors {
    const gguf_tensor *tok_embd;           /* [d_model, n_vocab]: row v is token v's embedding */
    const gguf_tensor *output_norm;        /* f32 [d_model] */
    const gguf_tensor *output;             /* [d_model -> n_vocab]; == tok_embd when tied */
    const gguf_tensor *rope_freqs;         /* f32 [n_rot/2] llama3 frequency factors or NULL */
    model_layer_tensors *layers;           /* [n_layer], owned */
} model_tensors;

/* Reads and validates hyperparameters. Unsupported architectures, rope scaling kinds or
 * inconsistent shapes give VKI_ERR_UNSUPPORTED / VKI_ERR_FORMAT with a message. */
vki_status model_read_hparams(const gguf_file *f, model_hparams *hp, char *err, size_t err_len);
/* Finds every weight, checking shape and type (norms/biases f32; matrices any supported type),
 * and completes hp with what the tensors say (n_vocab, qkv_bias, tied_embeddings).
 * On success t->layers is allocated; free with model_tensors_free. */
vki_status model_find_tensors(const gguf_file *f, model_hparams *hp, model_tensors *t,
                              char *err, size_t err_len);
void model_tensors_free(model_tensors *t);

#endif
