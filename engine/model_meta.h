/* Model description from GGUF metadata: hyperparameters and the weight tensors, found and
 * shape-checked once, shared by the device loader (engine/model.c) and the CPU reference
 * forward pass (tests). No Vulkan. */
#ifndef VKI_ENGINE_MODEL_META_H
#define VKI_ENGINE_MODEL_META_H

#include "engine/gguf.h"
#include "shaders/vki_shared.h"

typedef enum model_arch {
    MODEL_ARCH_LLAMA = 0,  /* Llama 1/2/3, TinyLlama, SmolLM, Mistral (sliding window when set) */
    MODEL_ARCH_QWEN2 = 1,  /* + Q/K/V biases, NeoX RoPE */
    MODEL_ARCH_QWEN3 = 2,  /* NeoX RoPE, per-head RMSNorm of Q and K, no biases */
    MODEL_ARCH_GEMMA2 = 3, /* GeGLU, post-norms, sqrt(d) embedding scale, soft-caps, local/global */
    MODEL_ARCH_GEMMA3 = 4, /* gemma2's block without soft-caps, + Q/K norms, 5 local : 1 global */
    MODEL_ARCH_PHI3 = 5,   /* fused QKV and gate|up, LongRoPE factors */
    MODEL_ARCH_QWEN3MOE = 6, /* qwen3's attention, a mixture-of-experts FFN in every layer */
    MODEL_ARCH_GPT_OSS = 7,  /* OpenAI gpt-oss: Q/K/V/O biases, sink logits, NeoX YaRN RoPE, sliding
                                window on every other layer, experts with biases and a clamped
                                SwiGLU (swiglu_oai), router bias */
    MODEL_ARCH_GRANITE = 8,  /* IBM Granite 3: llama's block with embedding, residual, attention and
                                logit multipliers */
    MODEL_ARCH_SMOLLM3 = 9,  /* Hugging Face SmolLM3: llama's block, every 4th layer without RoPE */
    MODEL_ARCH_OLMO2 = 10,   /* AI2 OLMo 2: norms after each block (none before), Q and K normed over
                                their whole rows, NeoX RoPE */
    MODEL_ARCH_GRANITE_MOE = 11, /* IBM Granite 3 MoE: granite's multipliers, experts in every layer
                                    (softmax top-k, renormalised), with GraniteMoeShared's ungated
                                    shared expert where expert_shared_feed_forward_length says */
    MODEL_ARCH_EXAONE = 12,  /* LG EXAONE 3.0 / 3.5: llama's block with NeoX RoPE */
    MODEL_ARCH_EXAONE4 = 13, /* LG EXAONE 4.0: OLMo 2's norms (after each block only), per-head Q/K
                                norms, NeoX RoPE; the 32B's sliding window on 3 layers of 4, whose
                                4th (global) layers have no RoPE */
    MODEL_ARCH_GLM4 = 14,    /* Zhipu GLM-4-0414 / GLM-Z1: norms before and after each block (gemma's
                                four, SwiGLU), Q/K/V biases, [gate | up] in ffn_up (phi3's), RoPE
                                on the first rope.dimension_count dims, pairs (2i, 2i+1) */
    MODEL_ARCH_GEMMA = 15,   /* Gemma 1 / CodeGemma: gemma2's block without post-norms, soft-caps or
                                window */
    MODEL_ARCH_COMMAND_R = 16, /* Cohere Command-R / Aya: LayerNorm (no bias), attention and FFN in
                                  parallel on one normed input, logits times logit_scale */
    MODEL_ARCH_COHERE2 = 17,   /* Cohere Command R7B / Command A: command-r's block, a sliding window
                                  on 3 layers of 4 whose 4th (global) layers have no RoPE */
    MODEL_ARCH_MISTRAL3 = 18,  /* Mistral AI's Ministral 3 (3B, 8B, 14B): llama's block, the rotation's
                                  magnitude 1 under YaRN, Llama 4's attention temperature */
    MODEL_ARCH_STARCODER2 = 19, /* BigCode StarCoder2, IBM Granite Code 20B / 34B: LayerNorms with bias,
                                   Q/K/V/O biases, NeoX RoPE, a GELU FFN without gate, with biases */
    MODEL_ARCH_PHI2 = 20,       /* Microsoft Phi-2, Phi-1.5: starcoder2's norms, biases and FFN, the FFN
                                   beside the attention (command-r's), partial NeoX RoPE, an LM head
                                   bias */
    MODEL_ARCH_STABLELM = 21,   /* Stability AI StableLM 2 (1.6B, 12B), StableLM 3B 4E1T, StableCode:
                                   LayerNorms with bias, SwiGLU, partial NeoX RoPE, optional Q/K/V
                                   biases; the FFN beside the attention where ffn_norm is absent
                                   (the 12B) */
    MODEL_ARCH_NEMOTRON = 22,   /* NVIDIA Nemotron-4 / Minitron: LayerNorms with bias (the converter's
                                   1 + w), an FFN without gate of squared ReLU, partial NeoX RoPE */
    MODEL_ARCH_ARCEE = 23,      /* Arcee AFM-4.5B: llama's block with an FFN without gate of squared
                                   ReLU */
} model_arch;

/* Layers of one attention kind share these (gemma: sliding-window layers and global ones). */
typedef struct model_attn_kind {
    uint32_t window;        /* sliding window in tokens (the query's own included); 0 = global */
    float rope_base;        /* RoPE frequency base of these layers */
    float rope_freq_scale;  /* 1 / linear scaling factor */
} model_attn_kind;

typedef struct model_hparams {
    model_arch arch;
    char arch_name[16];
    uint32_t n_layer;
    uint32_t d_model;       /* embedding length */
    uint32_t n_head;
    uint32_t n_head_kv;     /* GQA: n_head % n_head_kv == 0; MQA: 1 */
    uint32_t head_dim;      /* key/value length per head */
    uint32_t d_ff;          /* the dense FFN's length (w_gate / w_up / w_down); with experts, the
                               shared expert's (granitemoe), else the file's feed_forward_length */
    uint32_t n_vocab;
    uint32_t n_ctx_train;   /* context length from metadata */
    uint32_t n_rot;         /* rotary dims per head (<= head_dim) */
    bool rope_neox;         /* rotate (i, i + n_rot/2) instead of (2i, 2i+1) */
    float rope_base;        /* of the global layers (= kind[0].rope_base) */
    float rope_freq_scale;  /* 1 / linear scaling factor (global layers) */
    float rms_eps;          /* the norms' epsilon (command-r's LayerNorm's too) */
    bool qkv_bias;
    bool tied_embeddings;   /* no output.weight: the LM head reuses token_embd */
    /* Per-architecture forward pass (see engine/forward.c): */
    model_attn_kind kind[2];/* [0] global layers, [1] sliding-window layers */
    uint32_t swa_pattern;   /* which layers slide: 0 = none; 1 = all; n > 1: layer il slides iff
                               il % n < n - 1 (llama.cpp's set_swa_pattern: gemma2 2, gemma3 6) */
    float attn_scale;       /* softmax scale of q.k: 1/sqrt(head_dim), gemma's 1/sqrt(query_pre_
                               attn_scalar) */
    float rope_attn_factor; /* LongRoPE (phi3 128k), YaRN: cos and sin of q's and k's rotated pairs
                               are scaled by it (the rotation table's magnitude), as llama.cpp does */
    bool yarn;              /* rope.scaling.type yarn: op_rope_yarn's per-dimension blend of the
                               interpolated (rope_freq_scale) and the original frequencies */
    float yarn_ext_factor;  /* rope.scaling.yarn_ext_factor (1): how far the blend goes */
    float yarn_beta_fast;   /* rope.scaling.yarn_beta_fast (32) / _slow (1): the rotations per */
    float yarn_beta_slow;   /* original context that bound the blend's ramp */
    float attn_softcap;     /* gemma2: scores = c tanh(scores / c); 0 = none */
    float final_softcap;    /* gemma2: logits = c tanh(logits / c); 0 = none */
    float embd_mul;         /* embeddings times this: gemma sqrt(d_model), granite embedding_scale
                               divided by resid_scale (below); 1 = none */
    float resid_scale;      /* granite residual_scale: x = x + r * block(x); 1 = none. The engine
                               carries x / r instead (each block then adds its output unscaled):
                               every norm of the stream is scale-free up to its epsilon, so those
                               norms take resid_eps = rms_eps / r^2 and give the same values */
    float resid_eps;        /* the epsilon of the RMSNorms over the residual stream (attn_norm,
                               ffn_norm, output_norm); rms_eps unless resid_scale != 1 */
    float attn_temp_scale;  /* mistral3 attention.temperature_scale (Llama 4's beta): the query at
                               position pos is scaled by 1 + it * ln(floor(pos / attn_temp_len) + 1)
                               where attn_temp_len > 0 */
    uint32_t attn_temp_len; /* n_ctx_orig where the scale is set (llama.cpp's n_attn_temp_floor_scale);
                               0 = none */
    float logit_mul;        /* logits times it: granite 1 / logit_scale, command-r its logit_scale;
                               1 = none */
    uint32_t nope_step;     /* smollm3 (llama.cpp's n_no_rope_layer_step, 4, no key): layer il has no
                               RoPE on Q and K iff (il + 1) % nope_step == 0; 0 = RoPE everywhere */
    bool qk_norm;           /* qwen3, gemma3: per-head RMSNorm of q and k before RoPE */
    bool post_norms;        /* gemma2/3, olmo2: RMSNorm of the attention and FFN outputs before the
                               residual */
    bool no_pre_norms;      /* olmo2: no attn_norm / ffn_norm: each block reads x itself */
    bool qk_norm_full;      /* olmo2: qk_norm over q's and k's whole rows (q_norm [n_head * hd],
                               k_norm [n_head_kv * hd]), not per head */
    bool ffn_gelu;          /* gemma: GeGLU (tanh GELU) instead of SwiGLU */
    bool layer_norm;        /* command-r: the stream's norms (attn_norm, output_norm) are LayerNorms
                               without bias, (x - mean) / sqrt(var + eps) * w, eps from
                               attention.layer_norm_epsilon (in rms_eps) */
    bool norm_bias;         /* starcoder2: the LayerNorms add a bias (attn_norm.bias, ffn_norm.bias,
                               output_norm.bias) */
    bool ffn_plain;         /* starcoder2: the FFN is down(gelu(up h + b_up)) + b_down, no gate */
    bool ffn_relu2;         /* nemotron, arcee: ffn_plain's activation is max(v, 0)^2, not GELU */
    bool parallel_ffn;      /* command-r: no ffn_norm; the FFN reads the attention's normed input
                               and both outputs add to the residual stream */
    bool fused_qkv;         /* phi3: one attn_qkv matrix [q | k | v] (found from the tensors) */
    bool fused_gate_up;     /* phi3: ffn_up holds [gate | up] and there is no ffn_gate */
    bool longrope;          /* rope.scaling.type longrope / su: rope_factors_long/short must exist */
    uint32_t n_ctx_orig;    /* rope.scaling.original_context_length: phi3 LongRoPE's long factors
                               apply when the engine's context exceeds it (llama.cpp's rule); YaRN's
                               ramp is measured against it */
    /* Mixture of experts (qwen3moe; llama with expert_count: Mixtral). 0 experts = dense FFN. */
    uint32_t n_expert;      /* expert_count: experts per layer, <= VKI_MOE_MAX_EXPERTS */
    uint32_t n_expert_used; /* expert_used_count: experts each token runs (top-k), <= VKI_MOE_MAX_USED */
    uint32_t d_ff_exp;      /* rows of one expert's gate/up: qwen3moe expert_feed_forward_length (else
                               d_ff / n_expert_used, as llama.cpp), Mixtral feed_forward_length */
    bool expert_norm;       /* divide the chosen experts' softmax weights by their sum: llama.cpp
                               always does for qwen3moe and Mixtral; <arch>.expert_weights_norm
                               overrides it when present; gpt-oss: always (its softmax over the
                               chosen logits) */
    bool expert_bias;       /* gpt-oss: router and experts have biases (ffn_*.bias) */
    uint32_t expert_act;    /* the experts' gated unit: VKI_GLU_SILU, or VKI_GLU_SWIGLU_OAI (gpt-oss) */
    uint32_t pooling_type;  /* <arch>.pooling_type, llama.cpp's (0 none / absent, 1 mean, 2 cls,
                               3 last: Qwen3-Embedding, 4 rank): how its embeddings are pooled */
    bool shared_expert;     /* granitemoe with expert_shared_feed_forward_length: every token also
                               runs a dense SwiGLU FFN of d_ff rows (w_gate / w_up / w_down, from
                               ffn_*_shexp), added to the experts' weighted sum */
} model_hparams;

/* The residual stream's norms as op_norm_xh's mode: 0 RMSNorm, VKI_NORM_MEAN LayerNorm
 * (| VKI_NORM_BIAS with its bias). */
static inline uint32_t model_norm_mode(const model_hparams *hp)
{
    return (hp->layer_norm ? VKI_NORM_MEAN : 0u) | (hp->norm_bias ? VKI_NORM_BIAS : 0u);
}

/* Whether layer il rotates Q and K (SmolLM3's NoPE layers do not). */
static inline bool model_layer_rope(const model_hparams *hp, uint32_t il)
{
    return !hp->nope_step || (il + 1) % hp->nope_step != 0;
}

/* Which attention kind layer il uses: 0 global, 1 sliding window. */
static inline uint32_t model_layer_kind(const model_hparams *hp, uint32_t il)
{
    if (!hp->swa_pattern)
        return 0;
    return hp->swa_pattern == 1 || il % hp->swa_pattern < hp->swa_pattern - 1 ? 1 : 0;
}

typedef struct model_layer_tensors {
    const gguf_tensor *attn_norm;          /* f32 [d_model] (NULL: olmo2) */
    const gguf_tensor *attn_norm_b, *ffn_norm_b; /* f32 [d_model] LayerNorm biases (starcoder2) or NULL */
    const gguf_tensor *ffn_up_b, *ffn_down_b;    /* f32 [d_ff], [d_model] FFN biases (starcoder2) or NULL */
    const gguf_tensor *wq, *wk, *wv;       /* [d_model -> n_head*hd | n_head_kv*hd]; NULL when fused */
    const gguf_tensor *wqkv;               /* phi3: [d_model -> (n_head + 2 n_head_kv) * hd] or NULL */
    const gguf_tensor *bq, *bk, *bv;       /* f32 biases (qwen2, gpt-oss; optional for llama) or NULL;
                                              with wqkv, bq is its bias (phi2's attn_qkv.bias) */
    const gguf_tensor *q_norm, *k_norm;    /* f32 [hd] per-head norms (qwen3, gemma3), [n_head * hd] and
                                              [n_head_kv * hd] whole-row ones (olmo2) or NULL */
    const gguf_tensor *wo;                 /* [n_head*hd -> d_model] */
    const gguf_tensor *bo;                 /* f32 [d_model] output bias (gpt-oss; optional) or NULL */
    const gguf_tensor *attn_sinks;         /* f32 [n_head] sink logits (gpt-oss) or NULL */
    const gguf_tensor *post_attn_norm;     /* f32 [d_model] (gemma) or NULL */
    const gguf_tensor *ffn_norm;           /* f32 [d_model] (gpt-oss: post_attention_norm.weight;
                                              NULL: olmo2, command-r) */
    const gguf_tensor *w_gate;             /* [d_model -> d_ff]; NULL when fused into w_up */
    const gguf_tensor *w_up;               /* [d_model -> d_ff] (phi3: -> 2 d_ff, gate | up) */
    const gguf_tensor *w_down;             /* [d_ff -> d_model] */
    const gguf_tensor *post_ffn_norm;      /* f32 [d_model] (gemma) or NULL */
    /* mixture of experts (hp.n_expert > 0; then w_gate / w_up / w_down are NULL, or the shared
     * expert's ffn_gate_shexp / ffn_up_shexp / ffn_down_shexp with hp.shared_expert): */
    const gguf_tensor *ffn_gate_inp;       /* router [d_model -> n_expert] */
    const gguf_tensor *ffn_gate_exps;      /* ggml ne [d_model, d_ff_exp, n_expert]: expert e's gate
                                              is rows e * d_ff_exp .. of the [rows][d_model] view */
    const gguf_tensor *ffn_up_exps;        /* same shape as ffn_gate_exps */
    const gguf_tensor *ffn_down_exps;      /* ne [d_ff_exp, d_model, n_expert] */
    /* with expert_bias (gpt-oss), f32: */
    const gguf_tensor *ffn_gate_inp_b;     /* [n_expert] router bias */
    const gguf_tensor *ffn_gate_exps_b;    /* ne [d_ff_exp, n_expert]: expert e's gate bias is row e */
    const gguf_tensor *ffn_up_exps_b;      /* ne [d_ff_exp, n_expert] */
    const gguf_tensor *ffn_down_exps_b;    /* ne [d_model, n_expert] */
} model_layer_tensors;

typedef struct model_tensors {
    const gguf_tensor *tok_embd;           /* [d_model, n_vocab]: row v is token v's embedding */
    const gguf_tensor *output_norm;        /* f32 [d_model] */
    const gguf_tensor *output_norm_b;      /* f32 [d_model] its bias (starcoder2) or NULL */
    const gguf_tensor *output;             /* [d_model -> n_vocab]; == tok_embd when tied */
    const gguf_tensor *output_b;           /* f32 [n_vocab] LM head bias (phi2) or NULL */
    const gguf_tensor *rope_freqs;         /* f32 [n_rot/2] llama3 frequency factors or NULL */
    const gguf_tensor *rope_long, *rope_short; /* f32 [n_rot/2] phi3 LongRoPE factors or NULL */
    model_layer_tensors *layers;           /* [n_layer], owned */
} model_tensors;

/* The RoPE frequency factors for an engine whose longest sequence is n_ctx: llama3's
 * rope_freqs, else phi3's long factors past the original context and the short ones within it
 * (llama.cpp's llama_model::get_rope_factors), else NULL. */
const gguf_tensor *model_rope_factors(const model_hparams *hp, const model_tensors *t, uint32_t n_ctx);

/* Reads and validates hyperparameters. Unsupported architectures, rope scaling kinds or
 * inconsistent shapes (a zero sliding window, a negative soft-cap...) give VKI_ERR_UNSUPPORTED /
 * VKI_ERR_FORMAT with a message naming the key. */
vki_status model_read_hparams(const gguf_file *f, model_hparams *hp, char *err, size_t err_len);
/* Finds every weight the architecture needs, checking shape and type (norms/biases f32;
 * matrices any supported type), and completes hp with what the tensors say (n_vocab, qkv_bias,
 * tied_embeddings, fused_qkv, fused_gate_up). A missing or mis-shaped tensor is VKI_ERR_FORMAT
 * naming it.
 * On success t->layers is allocated; free with model_tensors_free. */
vki_status model_find_tensors(const gguf_file *f, model_hparams *hp, model_tensors *t,
                              char *err, size_t err_len);
void model_tensors_free(model_tensors *t);

#endif
