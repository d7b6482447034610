/* Synthetic model writer: a valid GGUF with random weights for any llama / qwen2 shape, with the
 * standard llama.cpp metadata keys and tensor names (so other GGUF readers load it), and either a
 * real vocabulary copied from a vocab GGUF or a byte-level SentencePiece-style one. Used by the
 * `make-model` tool, by tests that need shapes no real model here has, and by `vkinfer demo`.
 * No Vulkan.
 *
 * Weights: seeded, approximately N(0, 1/fan_in) (output projections further scaled by
 * 1/sqrt(2 n_layer) so the residual stream stays O(1) through many layers), norms ~1 +- 0.1, LM
 * head scaled for logits of standard deviation ~3 so greedy decoding has few near-ties. Tensors
 * are generated and quantised batch by batch on n_threads workers and streamed to the file:
 * memory stays ~12 MiB per worker whatever the model size. */
#ifndef VKI_ENGINE_SYNTH_H
#define VKI_ENGINE_SYNTH_H

#include "vkinfer.h"

/* Weight schemes. A plain type puts every weight matrix in that type, as llama-quantize --pure
 * does; a mix (the _s / _m / _l names, or any type with synth_params.llama_mix) makes
 * llama-quantize's per-tensor choices for the llama file type of that name (llama.cpp's
 * llama_tensor_get_type: output.weight in Q6_K, more bits for attn_v / ffn_down / attn_output of
 * some layers). Either way a matrix whose rows the type's block does not divide takes the type
 * llama.cpp falls back to (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0,
 * IQ4_XS -> IQ4_NL; F16 when even 32 does not divide, and for MXFP4). New values are appended so that the
 * old ones keep their numbers. */
typedef enum synth_wtype {
    SYNTH_F32,
    SYNTH_F16,
    SYNTH_Q8_0,
    SYNTH_Q4_0,
    SYNTH_Q4_K,
    SYNTH_Q6_K,
    SYNTH_Q4_K_M, /* Q4_K, with Q6_K for output.weight (token_embd when tied) and for attn_v /
                     ffn_down of the layers llama.cpp's Q4_K_M gives more bits */
    SYNTH_BF16,
    SYNTH_Q4_1,
    SYNTH_Q5_0,
    SYNTH_Q5_1,
    SYNTH_IQ4_NL,
    SYNTH_Q2_K,
    SYNTH_Q3_K,
    SYNTH_Q5_K,
    SYNTH_IQ4_XS,
    SYNTH_Q2_K_S, /* llama-quantize's mixes, named as it names them */
    SYNTH_Q3_K_S,
    SYNTH_Q3_K_M,
    SYNTH_Q3_K_L,
    SYNTH_Q4_K_S,
    SYNTH_Q5_K_S,
    SYNTH_Q5_K_M,
    SYNTH_MXFP4,     /* every matrix MXFP4 (llama-quantize --pure MXFP4_MOE) */
    SYNTH_MXFP4_MOE, /* llama-quantize's MXFP4_MOE: the experts MXFP4, every other matrix Q8_0 */
    SYNTH_WTYPE_COUNT
} synth_wtype;

typedef struct synth_params {
    const char *arch;       /* "llama", "qwen2" (+ Q/K/V biases), "qwen3" (+ Q/K norms), "qwen3moe"
                               (qwen3 + experts), "gemma2" (+ post-norms, soft-caps), "gemma3" (+
                               post-norms, Q/K norms), "phi3" (fused attn_qkv and gate|up ffn_up)
                               or any other of synth_archs (engine/synth.c: gpt-oss ... stablelm),
                               with llama.cpp's tensor names */
    const char *name;       /* general.name */
    uint32_t n_layer;
    uint32_t d_model;
    uint32_t n_head;
    uint32_t n_head_kv;     /* divides n_head */
    uint32_t head_dim;      /* 0: d_model / n_head; otherwise key_length/value_length are written */
    uint32_t d_ff;
    uint32_t n_vocab;       /* byte-level vocabulary size (>= 259) when vocab_from is NULL */
    const char *vocab_from; /* GGUF whose tokenizer.* keys are copied verbatim; sets n_vocab */
    uint32_t n_ctx;
    float rope_base;
    float rms_eps;
    bool tied;              /* no output.weight: the LM head is token_embd */
    synth_wtype wtype;      /* norms and biases are always F32; a tensor whose row length is not
                               a multiple of the type's block takes llama.cpp's fallback (logged) */
    bool llama_mix;         /* a plain wtype as llama-quantize's mix of that name (Q2_K: Q3_K for
                               attn_v/attn_output/ffn_down, Q6_K output, ...); implied by mixes */
    uint64_t seed;
    /* Newer architectures (synth_arch_defaults() gives each its real values): */
    uint32_t sliding_window;/* <arch>.attention.sliding_window; 0 = not written (no window) */
    float attn_softcap;     /* gemma2.attn_logit_softcapping; 0 = not written */
    float final_softcap;    /* gemma2/3 final_logit_softcapping; 0 = not written */
    uint32_t n_ctx_orig;    /* phi3 LongRoPE: original context < n_ctx; writes rope_factors_long/short
                               and the converter's attention factor; with yarn_factor YaRN's
                               original context; 0 = none */
    uint32_t n_rot;         /* rope.dimension_count: rotated dims per head, even, <= head_dim (Phi-4-
                               mini: 96 of 128); 0 = head_dim */
    float yarn_factor;      /* > 0: rope.scaling.type yarn with this factor (>= 1) over n_ctx_orig
                               (needed; not phi3 or gemma), as Qwen's long-context files; 0 = none */
    /* granite's multipliers (synth_arch_defaults: Granite-3's; written for granite only, 0 = not
       written, logit_scale always): */
    float embedding_scale, residual_scale, attention_scale, logit_scale;
    /* mistral3: attention.temperature_scale (synth_arch_defaults: Ministral 3's 0.1; stepping every
       n_ctx_orig positions, which is written with it), 0 = not written */
    float attn_temp_scale;
    /* Mixture of experts (qwen3moe needs them; llama with experts is Mixtral's layout): */
    uint32_t n_expert;      /* expert_count: ffn_gate_inp + stacked ffn_{gate,up,down}_exps; 0 = dense */
    uint32_t n_expert_used; /* expert_used_count (top-k), 1..n_expert */
    uint32_t d_ff_exp;      /* qwen3moe expert_feed_forward_length (d_ff is then the unused dense
                               length, as the converter writes it); 0 = d_ff. Mixtral, granitemoe: d_ff */
    uint32_t d_ff_shexp;    /* granitemoe: expert_shared_feed_forward_length and ffn_*_shexp, a
                               shared expert (GraniteMoeShared); 0 = none */
    uint32_t n_threads;     /* workers generating and encoding weights; 0: one per online CPU.
                               The file is byte-identical for any count */
    /* Optional: notes (type fallbacks) and progress lines; msg has no newline. */
    void (*log)(void *user, const char *msg);
    void *log_user;
} synth_params;

/* The tiny preset: llama, 2 layers, d_model 64, 4 heads, 2 KV heads, d_ff 192, byte vocab 320,
 * context 512, F32. */
synth_params synth_default_params(void);
/* Shapes of named presets: "tiny", "small" (llama, d 256, GQA 4), "qwen2-small" (tied, biases),
 * "tinyllama" (1.1B), "1b" (Llama-3.2-1B shape), "qwen2-1.5b" (Qwen2.5-1.5B shape),
 * "qwen3-0.6b", "gemma2-2b", "gemma3-1b", "phi3-mini" (Phi-3-mini-4k), "8b" (Llama-3-8B shape:
 * 32 layers, d 4096, 32/8 heads, d_ff 14336, vocab 128256, untied), the mixtures of experts
 * "qwen3-30b-a3b" (Qwen3-30B-A3B: 48 layers, 128 experts, 8 used; with --layers 2 a reduced-layer
 * model of the real per-layer shape) and "mixtral-8x7b" (32 layers, 8 experts, 2 used). Only shape
 * fields change (with the architecture's window and soft-caps, and wtype: Q4_K_M for the large
 * ones).
 * VKI_ERR_NOT_FOUND for an unknown name. */
vki_status synth_preset(const char *name, synth_params *p);
/* Names of the presets, NULL-terminated. */
const char *const *synth_preset_names(void);

/* The architecture's own sliding window and soft-caps (gemma2: 4096, 50, 30; phi3: 2047; others
 * none) into p, for p->arch; VKI_ERR_NOT_FOUND for an unknown architecture. */
vki_status synth_arch_defaults(synth_params *p);

const char *synth_wtype_name(synth_wtype t); /* "f32", ..., "q4_k_m", "iq4_xs", "q3_k_l" */
bool synth_wtype_parse(const char *s, synth_wtype *out);
bool synth_wtype_is_mix(synth_wtype t); /* a llama-quantize mix name (q4_k_m, q3_k_s, ...) */

/* The ggml type (VKI_GGML_*) written for a weight matrix: role is the tensor name without
 * "blk.N." and ".weight" ("token_embd", "output", "attn_q", "ffn_down", ...), layer its block
 * (ignored otherwise), ne0 its row length. Before the block-size fallback when fallback=false. */
uint32_t synth_weight_type(const synth_params *p, const char *role, uint32_t layer, uint64_t ne0, bool fallback);

/* Validates p and writes the model to path (replaced). On failure nothing is left at path and
 * err names the problem: VKI_ERR_INVALID_ARG (a parameter), VKI_ERR_IO, VKI_ERR_FORMAT /
 * VKI_ERR_UNSUPPORTED (the vocab file). */
vki_status synth_write(const synth_params *p, const char *path, char *err, size_t err_len);

#endif
