/* Synthetic model writer (see synth.h). Cost: one pass over the weights, ~7 ns of CPU per weight
 * (random generation + quant_row_fast; the 1.24B-weight "1b" preset in Q4_K_M: 8.6 s CPU),
 * spread over n_threads workers; per worker a 4 MiB float buffer and two 4 MiB output buffers
 * (the main thread writes one batch while the workers fill the next). */
#include "engine/synth.h"
#include "engine/gguf.h"
#include "engine/gguf_write.h"
#include "engine/quant.h"
#include "engine/rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define SYNTH_CHUNK_ELEMS (1u << 20) /* floats generated per chunk: 4 MiB */
#define SYNTH_MAX_DIM (1u << 20)
#define SYNTH_MAX_LAYERS 1024
#define SYNTH_BYTE_VOCAB 259 /* <unk> <s> </s> + 256 byte tokens */
#define SYNTH_MAX_THREADS 64
#define SYNTH_GAMMA 0x9e3779b97f4a7c15ull /* splitmix64's increment: draw i of a stream jumps to it */

/* llama_ftype (llama.h), written as general.file_type and keying llama-quantize's mix rules. */
enum {
    FT_F32 = 0, FT_F16 = 1, FT_Q4_0 = 2, FT_Q4_1 = 3, FT_Q8_0 = 7, FT_Q5_0 = 8, FT_Q5_1 = 9, FT_Q2_K = 10,
    FT_Q3_K_S = 11, FT_Q3_K_M = 12, FT_Q3_K_L = 13, FT_Q4_K_S = 14, FT_Q4_K_M = 15, FT_Q5_K_S = 16,
    FT_Q5_K_M = 17, FT_Q6_K = 18, FT_Q2_K_S = 21, FT_IQ4_NL = 25, FT_IQ4_XS = 30, FT_BF16 = 32,
    FT_MXFP4_MOE = 38,
};

typedef struct synth_scheme {
    const char *name;
    uint32_t type;  /* VKI_GGML_*: every weight matrix, before the mix rules and the fallback */
    uint32_t ftype; /* the llama file type; plain K types take the nearest (q4_k: Q4_K_S) */
    bool mix;       /* always llama-quantize's per-tensor choices (the _s / _m / _l names) */
} synth_scheme;

static const synth_scheme synth_schemes[SYNTH_WTYPE_COUNT] = {
    [SYNTH_F32] = {"f32", VKI_GGML_F32, FT_F32, false},
    [SYNTH_F16] = {"f16", VKI_GGML_F16, FT_F16, false},
    [SYNTH_BF16] = {"bf16", VKI_GGML_BF16, FT_BF16, false},
    [SYNTH_Q8_0] = {"q8_0", VKI_GGML_Q8_0, FT_Q8_0, false},
    [SYNTH_Q4_0] = {"q4_0", VKI_GGML_Q4_0, FT_Q4_0, false},
    [SYNTH_Q4_1] = {"q4_1", VKI_GGML_Q4_1, FT_Q4_1, false},
    [SYNTH_Q5_0] = {"q5_0", VKI_GGML_Q5_0, FT_Q5_0, false},
    [SYNTH_Q5_1] = {"q5_1", VKI_GGML_Q5_1, FT_Q5_1, false},
    [SYNTH_IQ4_NL] = {"iq4_nl", VKI_GGML_IQ4_NL, FT_IQ4_NL, false},
    [SYNTH_Q2_K] = {"q2_k", VKI_GGML_Q2_K, FT_Q2_K, false},
    [SYNTH_Q3_K] = {"q3_k", VKI_GGML_Q3_K, FT_Q3_K_S, false},
    [SYNTH_Q4_K] = {"q4_k", VKI_GGML_Q4_K, FT_Q4_K_S, false},
    [SYNTH_Q5_K] = {"q5_k", VKI_GGML_Q5_K, FT_Q5_K_S, false},
    [SYNTH_Q6_K] = {"q6_k", VKI_GGML_Q6_K, FT_Q6_K, false},
    [SYNTH_IQ4_XS] = {"iq4_xs", VKI_GGML_IQ4_XS, FT_IQ4_XS, false},
    [SYNTH_Q2_K_S] = {"q2_k_s", VKI_GGML_Q2_K, FT_Q2_K_S, true},
    [SYNTH_Q3_K_S] = {"q3_k_s", VKI_GGML_Q3_K, FT_Q3_K_S, true},
    [SYNTH_Q3_K_M] = {"q3_k_m", VKI_GGML_Q3_K, FT_Q3_K_M, true},
    [SYNTH_Q3_K_L] = {"q3_k_l", VKI_GGML_Q3_K, FT_Q3_K_L, true},
    [SYNTH_Q4_K_S] = {"q4_k_s", VKI_GGML_Q4_K, FT_Q4_K_S, true},
    [SYNTH_Q4_K_M] = {"q4_k_m", VKI_GGML_Q4_K, FT_Q4_K_M, true},
    [SYNTH_Q5_K_S] = {"q5_k_s", VKI_GGML_Q5_K, FT_Q5_K_S, true},
    [SYNTH_Q5_K_M] = {"q5_k_m", VKI_GGML_Q5_K, FT_Q5_K_M, true},
    [SYNTH_MXFP4] = {"mxfp4", VKI_GGML_MXFP4, FT_MXFP4_MOE, false},
    [SYNTH_MXFP4_MOE] = {"mxfp4_moe", VKI_GGML_MXFP4, FT_MXFP4_MOE, true},
};

const char *synth_wtype_name(synth_wtype t)
{
    return (unsigned)t < SYNTH_WTYPE_COUNT ? synth_schemes[t].name : "invalid";
}

bool synth_wtype_is_mix(synth_wtype t)
{
    return (unsigned)t < SYNTH_WTYPE_COUNT && synth_schemes[t].mix;
}

bool synth_wtype_parse(const char *s, synth_wtype *out)
{
    for (int i = 0; i < SYNTH_WTYPE_COUNT; i++)
        if (!strcasecmp(s, synth_schemes[i].name)) {
            *out = (synth_wtype)i;
            return true;
        }
    return false;
}

synth_params synth_default_params(void)
{
    return (synth_params){
        .arch = "llama", .name = "vkinfer-synthetic", .n_layer = 2, .d_model = 64, .n_head = 4, .n_head_kv = 2,
        .d_ff = 192, .n_vocab = 320, .n_ctx = 512, .rope_base = 10000.0f, .rms_eps = 1e-5f, .wtype = SYNTH_F32,
        .seed = 1,
    };
}

typedef struct synth_preset_def {
    const char *name, *arch;
    uint32_t n_layer, d_model, n_head, n_head_kv, head_dim, d_ff, n_vocab, n_ctx;
    float rope_base, rms_eps;
    bool tied;
    synth_wtype wtype;
    uint32_t n_expert, n_expert_used, d_ff_exp; /* mixtures of experts */
} synth_preset_def;

static const synth_preset_def synth_presets[] = {
    {"tiny", "llama", 2, 64, 4, 2, 0, 192, 320, 512, 10000.0f, 1e-5f, false, SYNTH_F32, 0, 0, 0},
    {"small", "llama", 4, 256, 8, 2, 0, 768, 1024, 2048, 10000.0f, 1e-5f, false, SYNTH_F32, 0, 0, 0},
    {"qwen2-small", "qwen2", 4, 256, 4, 1, 64, 512, 1024, 4096, 1000000.0f, 1e-6f, true, SYNTH_F32, 0, 0, 0},
    {"tinyllama", "llama", 22, 2048, 32, 4, 0, 5632, 32000, 2048, 10000.0f, 1e-5f, false, SYNTH_Q4_K_M, 0, 0, 0},
    {"1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 8192, 500000.0f, 1e-5f, true, SYNTH_Q4_K_M, 0, 0, 0},
    {"qwen2-1.5b", "qwen2", 28, 1536, 12, 2, 128, 8960, 151936, 32768, 1000000.0f, 1e-6f, true, SYNTH_Q4_K_M, 0, 0, 0},
    /* the shapes of Qwen3-0.6B, gemma-2-2b, gemma-3-1b-pt and Phi-3-mini-4k (their config.json) */
    {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, true, SYNTH_Q4_K_M, 0, 0, 0},
    {"gemma2-2b", "gemma2", 26, 2304, 8, 4, 256, 9216, 256000, 8192, 10000.0f, 1e-6f, true, SYNTH_Q4_K_M, 0, 0, 0},
    {"gemma3-1b", "gemma3", 26, 1152, 4, 1, 256, 6912, 262144, 32768, 1000000.0f, 1e-6f, true, SYNTH_Q4_K_M, 0, 0, 0},
    {"phi3-mini", "phi3", 32, 3072, 32, 32, 96, 8192, 32064, 4096, 10000.0f, 1e-5f, false, SYNTH_Q4_K_M, 0, 0, 0},
    {"8b", "llama", 32, 4096, 32, 8, 0, 14336, 128256, 8192, 500000.0f, 1e-5f, false, SYNTH_Q4_K_M, 0, 0, 0},
    /* Qwen3-30B-A3B and Mixtral-8x7B (config.json): 128 experts of 768 using 8, 8 of 14336 using 2 */
    {"qwen3-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 1000000.0f, 1e-6f, false, SYNTH_Q4_K_M,
     128, 8, 768},
    {"mixtral-8x7b", "llama", 32, 4096, 32, 8, 0, 14336, 32000, 32768, 1000000.0f, 1e-5f, false, SYNTH_Q4_K_M,
     8, 2, 0},
    /* gpt-oss-20b (config.json): 32 experts of 2880 using 4, head dim 64, YaRN 32 over 4096 */
    {"gpt-oss-20b", "gpt-oss", 24, 2880, 64, 8, 64, 2880, 201088, 131072, 150000.0f, 1e-5f, false, SYNTH_MXFP4_MOE,
     32, 4, 2880},
};

const char *const *synth_preset_names(void)
{
    static const char *const names[] = {"tiny", "small", "qwen2-small", "tinyllama", "1b", "qwen2-1.5b",
                                        "qwen3-0.6b", "gemma2-2b", "gemma3-1b", "phi3-mini", "8b", "qwen3-30b-a3b",
                                        "mixtral-8x7b", "gpt-oss-20b", NULL};
    _Static_assert(sizeof names / sizeof names[0] == sizeof synth_presets / sizeof synth_presets[0] + 1, "presets");
    return names;
}

vki_status synth_preset(const char *name, synth_params *p)
{
    for (size_t i = 0; i < sizeof synth_presets / sizeof synth_presets[0]; i++) {
        const synth_preset_def *d = &synth_presets[i];
        if (strcmp(d->name, name))
            continue;
        p->arch = d->arch, p->n_layer = d->n_layer, p->d_model = d->d_model, p->n_head = d->n_head;
        p->n_head_kv = d->n_head_kv, p->head_dim = d->head_dim, p->d_ff = d->d_ff, p->n_vocab = d->n_vocab;
        p->n_ctx = d->n_ctx, p->rope_base = d->rope_base, p->rms_eps = d->rms_eps, p->tied = d->tied;
        p->wtype = d->wtype;
        p->n_expert = d->n_expert, p->n_expert_used = d->n_expert_used, p->d_ff_exp = d->d_ff_exp;
        synth_arch_defaults(p);
        if (!strcmp(name, "gemma3-1b"))
            p->sliding_window = 512; /* gemma-3-1b's window; the larger gemma 3 models have 1024 */
        if (!strcmp(name, "gpt-oss-20b"))
            p->yarn_factor = 32.0f, p->n_ctx_orig = 4096;
        return VKI_OK;
    }
    return VKI_ERR_NOT_FOUND;
}

/* ---- architectures --------------------------------------------------------------------------- */

/* What the writer adds per architecture (llama.cpp's tensor names, HF's default values). */
typedef struct synth_arch {
    const char *name;
    bool qkv_bias, qk_norm, post_norms, fused; /* fused: phi3's attn_qkv */
    uint32_t window;                           /* sliding window of the released models */
    float attn_softcap, final_softcap;
    bool oss; /* gpt-oss: attn_output.bias, attn_sinks, the FFN norm named post_attention_norm,
                 router and expert biases */
    bool no_pre;  /* olmo2, exaone4: no attn_norm / ffn_norm */
    bool qk_rows; /* olmo2: Q and K norms over whole rows */
    bool fused_ffn; /* phi3, glm4: [gate | up] in ffn_up, no ffn_gate */
    bool cohere;    /* command-r, cohere2: no ffn_norm (the FFN runs beside the attention),
                       layer_norm_epsilon, logit_scale */
    bool coder;     /* starcoder2, phi2: LayerNorms with biases (layer_norm_epsilon), attn_output.bias,
                       a GELU FFN without gate with ffn_up / ffn_down biases (phi2 also: no ffn_norm,
                       attn_qkv.bias, output.bias) */
} synth_arch;

static const synth_arch synth_archs[] = {
    {"llama", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"qwen2", true, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"qwen3", false, true, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"gemma2", false, false, true, false, 4096, 50.0f, 30.0f, false, false, false, false, false, false},
    {"gemma3", false, true, true, false, 1024, 0, 0, false, false, false, false, false, false},
    {"phi3", false, false, false, true, 2047, 0, 0, false, false, false, true, false, false},
    {"qwen3moe", false, true, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"gpt-oss", true, false, false, false, 128, 0, 0, true, false, false, false, false, false},
    {"granite", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"granitemoe", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"smollm3", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"olmo2", false, true, true, false, 0, 0, 0, false, true, true, false, false, false},
    {"exaone", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"exaone4", false, true, true, false, 4096, 0, 0, false, true, false, false, false, false},
    {"glm4", true, false, true, false, 0, 0, 0, false, false, false, true, false, false},
    {"internlm2", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"ernie4_5", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"gemma", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"command-r", false, false, false, false, 0, 0, 0, false, false, false, false, true, false},
    {"cohere2", false, false, false, false, 4096, 0, 0, false, false, false, false, true, false},
    {"mistral3", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"starcoder2", true, false, false, false, 0, 0, 0, false, false, false, false, false, true},
    {"phi2", true, false, false, true, 0, 0, 0, false, false, false, false, false, true},
    {"stablelm", true, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"nemotron", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
    {"arcee", false, false, false, false, 0, 0, 0, false, false, false, false, false, false},
};

static const synth_arch *find_arch(const char *name)
{
    for (size_t i = 0; name && i < sizeof synth_archs / sizeof synth_archs[0]; i++)
        if (!strcmp(synth_archs[i].name, name))
            return &synth_archs[i];
    return NULL;
}

vki_status synth_arch_defaults(synth_params *p)
{
    const synth_arch *a = find_arch(p->arch);
    if (!a)
        return VKI_ERR_NOT_FOUND;
    p->sliding_window = a->window;
    p->attn_softcap = a->attn_softcap;
    p->final_softcap = a->final_softcap;
    if (!strncmp(a->name, "granite", 7)) /* granite-3.1-2b's config.json: embedding, residual,
                                            attention multipliers and logits_scaling */
        p->embedding_scale = 12.0f, p->residual_scale = 0.22f, p->attention_scale = 0.015625f, p->logit_scale = 8.0f;
    if (a->cohere) /* c4ai-command-r-v01's and command-r7b's logit_scale */
        p->logit_scale = 0.0625f;
    if (!strcmp(a->name, "mistral3")) /* Ministral-3's llama_4_scaling_beta */
        p->attn_temp_scale = 0.1f;
    return VKI_OK;
}

/* ---- tensor types ---------------------------------------------------------------------------- */

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third one in
 * between get more bits for attn_v / ffn_down in Q4_K_M and Q5_K_M. */
static bool synth_more_bits(uint32_t layer, uint32_t n_layer)
{
    return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

/* llama-quantize's per-tensor choice (llama.cpp src/llama-quant.cpp, llama_tensor_get_type) for
 * the dense llama / qwen2 tensors this writer makes: t is the file type's base type; the MoE,
 * 70B and importance-matrix rules do not apply. */
static uint32_t llama_mix_type(const synth_params *p, uint32_t ftype, uint32_t t, const char *role, uint32_t il,
                               uint64_t ne0)
{
    const uint32_t n = p->n_layer, gqa = p->n_head / p->n_head_kv;
    const bool more = synth_more_bits(il, n);
    if (ftype == FT_MXFP4_MOE) { /* llama.cpp: the stacked experts (ne[2] > 1) MXFP4, the rest Q8_0 */
        size_t len = strlen(role);
        return len > 5 && !strcmp(role + len - 5, "_exps") ? t : VKI_GGML_Q8_0;
    }
    if (!strcmp(role, "output") || (p->tied && !strcmp(role, "token_embd")))
        return ne0 % quant_get(t)->block_elems ? VKI_GGML_Q8_0 : t == VKI_GGML_Q8_0 ? t : VKI_GGML_Q6_K;
    if (!strcmp(role, "attn_v")) {
        switch (ftype) {
        case FT_Q2_K: return gqa >= 4 ? VKI_GGML_Q4_K : VKI_GGML_Q3_K;
        case FT_Q2_K_S: return gqa >= 4 ? VKI_GGML_Q4_K : t;
        case FT_Q3_K_M: return il < 2 ? VKI_GGML_Q5_K : VKI_GGML_Q4_K;
        case FT_Q3_K_L: return VKI_GGML_Q5_K;
        case FT_IQ4_NL: case FT_IQ4_XS: return gqa >= 4 ? VKI_GGML_Q5_K : t;
        case FT_Q4_K_M: case FT_Q5_K_M: return more ? VKI_GGML_Q6_K : t;
        case FT_Q4_K_S: return il < 4 ? VKI_GGML_Q5_K : t;
        }
    } else if (!strncmp(role, "ffn_down", 8)) { /* llama.cpp matches ffn_down, _exps and _shexp */
        switch (ftype) {
        case FT_Q2_K: return VKI_GGML_Q3_K;
        case FT_Q2_K_S: return il < n / 8 ? VKI_GGML_Q4_K : t;
        case FT_Q3_K_M: return il < n / 16 ? VKI_GGML_Q5_K : VKI_GGML_Q4_K;
        case FT_Q3_K_L: return VKI_GGML_Q5_K;
        case FT_Q4_K_M: case FT_Q5_K_M: return more ? VKI_GGML_Q6_K : t;
        case FT_IQ4_NL: case FT_IQ4_XS: case FT_Q4_K_S: return il < n / 8 ? VKI_GGML_Q5_K : t;
        }
    } else if (!strcmp(role, "attn_output")) {
        switch (ftype) {
        case FT_Q2_K: return VKI_GGML_Q3_K;
        case FT_Q3_K_M: return VKI_GGML_Q4_K;
        case FT_Q3_K_L: return VKI_GGML_Q5_K;
        }
    }
    return t;
}

/* llama.cpp's tensor_type_fallback for rows the block does not divide: a 32-element type of
 * about the same size. It has none for the 32-element types (it stops); F16 is what it takes
 * when 32 does not divide either, and what this writer takes in both cases. */
static uint32_t llama_fallback(uint32_t t, uint64_t ne0)
{
    if (quant_row_bytes(t, ne0))
        return t;
    uint32_t f;
    switch (t) {
    case VKI_GGML_IQ4_XS: f = VKI_GGML_IQ4_NL; break;
    case VKI_GGML_Q2_K: case VKI_GGML_Q3_K: f = VKI_GGML_Q4_0; break;
    case VKI_GGML_Q4_K: f = VKI_GGML_Q5_0; break;
    case VKI_GGML_Q5_K: f = VKI_GGML_Q5_1; break;
    case VKI_GGML_Q6_K: f = VKI_GGML_Q8_0; break;
    default: f = VKI_GGML_F16; break;
    }
    return quant_row_bytes(f, ne0) ? f : VKI_GGML_F16;
}

uint32_t synth_weight_type(const synth_params *p, const char *role, uint32_t layer, uint64_t ne0, bool fallback)
{
    const synth_scheme *s = &synth_schemes[p->wtype];
    if (!strcmp(role, "ffn_gate_inp")) /* llama-quantize leaves the router in F32 */
        return VKI_GGML_F32;
    uint32_t t = s->type;
    bool quantised = t != VKI_GGML_F32 && t != VKI_GGML_F16 && t != VKI_GGML_BF16; /* llama-quantize mixes only those */
    if (quantised && (s->mix || p->llama_mix))
        t = llama_mix_type(p, s->ftype, t, role, layer, ne0);
    return fallback ? llama_fallback(t, ne0) : t;
}

/* ---- the tensor list ------------------------------------------------------------------------- */

/* FACTOR: 1 + |N(0, std)|, positive like LongRoPE's frequency factors */
typedef enum synth_init { SYNTH_INIT_WEIGHT, SYNTH_INIT_NORM, SYNTH_INIT_BIAS, SYNTH_INIT_FACTOR } synth_init;

typedef struct synth_tensor {
    char name[64];
    char role[24];
    uint32_t layer;
    uint32_t n_dims;
    uint64_t ne[3];      /* ggml order: ne[0] = row length (fan-in), ne[1] = rows, ne[2] = experts
                            (1 unless n_dims == 3) */
    uint32_t type;       /* VKI_GGML_* */
    synth_init init;
    float std;           /* weights: standard deviation; norms/biases: spread */
} synth_tensor;

typedef struct synth_ctx {
    const synth_params *p;
    uint32_t head_dim;
    uint32_t n_vocab;
    synth_tensor *t;     /* [n_t] */
    uint32_t n_t;
    char *err;
    size_t err_len;
} synth_ctx;

static vki_status synth_fail(synth_ctx *c, vki_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static vki_status synth_fail(synth_ctx *c, vki_status st, const char *fmt, ...)
{
    if (c->err && c->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

static void synth_log(const synth_params *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void synth_log(const synth_params *p, const char *fmt, ...)
{
    if (!p->log)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    p->log(p->log_user, buf);
}

static void add_tensor(synth_ctx *c, const char *role, int layer, const char *suffix, uint32_t n_dims, uint64_t ne0,
                       uint64_t ne1, synth_init init, float std)
{
    synth_tensor *t = &c->t[c->n_t++];
    memset(t, 0, sizeof *t);
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "blk.%d.%s.%s", layer, role, suffix);
    else
        snprintf(t->name, sizeof t->name, "%s.%s", role, suffix);
    snprintf(t->role, sizeof t->role, "%s", role);
    t->layer = layer >= 0 ? (uint32_t)layer : 0;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = 1;
    t->init = init;
    t->std = std;
    t->type = init == SYNTH_INIT_WEIGHT ? synth_weight_type(c->p, role, t->layer, ne0, true) : VKI_GGML_F32;
}

/* The router and the stacked experts of a mixture-of-experts layer (llama.cpp's names and shapes:
 * ne [d, ff, n_expert] for gate and up, [ff, d, n_expert] for down); with bias (gpt-oss) their
 * biases, ne [n_expert], [ff, n_expert] and [d, n_expert]. */
static void add_experts(synth_ctx *c, int l, bool bias)
{
    const synth_params *p = c->p;
    uint64_t d = p->d_model, ff = p->d_ff_exp ? p->d_ff_exp : p->d_ff;
    float in_std = 1.0f / sqrtf((float)d), resid = 1.0f / sqrtf(2.0f * (float)p->n_layer);
    /* router logits ~ N(0, 4): gaps between the k-th and (k+1)-th largest well above the device's
     * rounding, so the CPU reference and the device choose the same experts */
    add_tensor(c, "ffn_gate_inp", l, "weight", 2, d, p->n_expert, SYNTH_INIT_WEIGHT, 2.0f * in_std);
    const char *roles[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int i = 0; i < 3; i++) {
        add_tensor(c, roles[i], l, "weight", 3, i < 2 ? d : ff, i < 2 ? ff : d, SYNTH_INIT_WEIGHT,
                   i < 2 ? in_std : resid / sqrtf((float)ff));
        c->t[c->n_t - 1].ne[2] = p->n_expert;
    }
    if (!bias)
        return;
    /* the router's bias small next to its logits' spread (the choice stays clear of ties) */
    add_tensor(c, "ffn_gate_inp", l, "bias", 1, p->n_expert, 1, SYNTH_INIT_BIAS, 0.5f);
    for (int i = 0; i < 3; i++)
        add_tensor(c, roles[i], l, "bias", 2, i < 2 ? ff : d, p->n_expert, SYNTH_INIT_BIAS, i < 2 ? 0.5f : 0.05f);
}

/* One layer's tensors, in llama.cpp's order and names for the architecture. */
static void add_layer(synth_ctx *c, const synth_arch *a, int l)
{
    const synth_params *p = c->p;
    uint64_t d = p->d_model, q = (uint64_t)p->n_head * c->head_dim, kv = (uint64_t)p->n_head_kv * c->head_dim;
    float in_std = 1.0f / sqrtf((float)d), resid = 1.0f / sqrtf(2.0f * (float)p->n_layer);
    const bool phi2 = !strcmp(a->name, "phi2"), par = a->cohere || phi2; /* par: no ffn_norm */
    const bool nemotron = !strcmp(a->name, "nemotron"), plain = a->coder || nemotron || !strcmp(a->name, "arcee");
    const bool norm_b = a->coder || nemotron || !strcmp(a->name, "stablelm"); /* LayerNorms with biases */
    if (!a->no_pre)
        add_tensor(c, "attn_norm", l, "weight", 1, d, 1, SYNTH_INIT_NORM, 0.1f);
    if (norm_b)
        add_tensor(c, "attn_norm", l, "bias", 1, d, 1, SYNTH_INIT_BIAS, 0.1f);
    if (a->fused) {
        add_tensor(c, "attn_qkv", l, "weight", 2, d, q + 2 * kv, SYNTH_INIT_WEIGHT, in_std);
        if (a->qkv_bias) /* phi2's */
            add_tensor(c, "attn_qkv", l, "bias", 1, q + 2 * kv, 1, SYNTH_INIT_BIAS, 0.1f);
    } else {
        const char *roles[3] = {"attn_q", "attn_k", "attn_v"};
        for (int i = 0; i < 3; i++) {
            add_tensor(c, roles[i], l, "weight", 2, d, i ? kv : q, SYNTH_INIT_WEIGHT, in_std);
            if (a->qkv_bias)
                add_tensor(c, roles[i], l, "bias", 1, i ? kv : q, 1, SYNTH_INIT_BIAS, 0.1f);
        }
    }
    if (a->qk_norm) {
        add_tensor(c, "attn_q_norm", l, "weight", 1, a->qk_rows ? q : c->head_dim, 1, SYNTH_INIT_NORM, 0.1f);
        add_tensor(c, "attn_k_norm", l, "weight", 1, a->qk_rows ? kv : c->head_dim, 1, SYNTH_INIT_NORM, 0.1f);
    }
    add_tensor(c, "attn_output", l, "weight", 2, q, d, SYNTH_INIT_WEIGHT, resid / sqrtf((float)q));
    if (a->coder)
        add_tensor(c, "attn_output", l, "bias", 1, d, 1, SYNTH_INIT_BIAS, 0.05f);
    if (a->oss) { /* the sink logits near the scores' scale, so they take a real share */
        add_tensor(c, "attn_output", l, "bias", 1, d, 1, SYNTH_INIT_BIAS, 0.05f);
        add_tensor(c, "attn_sinks", l, "weight", 1, p->n_head, 1, SYNTH_INIT_BIAS, 2.0f);
    }
    if (a->post_norms)
        add_tensor(c, "post_attention_norm", l, "weight", 1, d, 1, SYNTH_INIT_NORM, 0.1f);
    if (!a->no_pre && !par)
        add_tensor(c, a->oss ? "post_attention_norm" : "ffn_norm", l, "weight", 1, d, 1, SYNTH_INIT_NORM, 0.1f);
    if (norm_b && !par)
        add_tensor(c, "ffn_norm", l, "bias", 1, d, 1, SYNTH_INIT_BIAS, 0.1f);
    if (p->n_expert) {
        add_experts(c, l, a->oss);
        if (p->d_ff_shexp) { /* granitemoe's shared expert */
            const uint64_t sh = p->d_ff_shexp;
            add_tensor(c, "ffn_gate_shexp", l, "weight", 2, d, sh, SYNTH_INIT_WEIGHT, in_std);
            add_tensor(c, "ffn_up_shexp", l, "weight", 2, d, sh, SYNTH_INIT_WEIGHT, in_std);
            add_tensor(c, "ffn_down_shexp", l, "weight", 2, sh, d, SYNTH_INIT_WEIGHT, resid / sqrtf((float)sh));
        }
        return;
    }
    if (!a->fused_ffn && !plain) /* plain: no gate (starcoder2, phi2, nemotron, arcee) */
        add_tensor(c, "ffn_gate", l, "weight", 2, d, p->d_ff, SYNTH_INIT_WEIGHT, in_std);
    add_tensor(c, "ffn_up", l, "weight", 2, d, a->fused_ffn ? 2ull * p->d_ff : p->d_ff, SYNTH_INIT_WEIGHT, in_std);
    if (a->coder)
        add_tensor(c, "ffn_up", l, "bias", 1, p->d_ff, 1, SYNTH_INIT_BIAS, 0.1f);
    add_tensor(c, "ffn_down", l, "weight", 2, p->d_ff, d, SYNTH_INIT_WEIGHT, resid / sqrtf((float)p->d_ff));
    if (a->coder)
        add_tensor(c, "ffn_down", l, "bias", 1, d, 1, SYNTH_INIT_BIAS, 0.05f);
    if (a->post_norms)
        add_tensor(c, "post_ffw_norm", l, "weight", 1, d, 1, SYNTH_INIT_NORM, 0.1f);
}

static vki_status build_tensors(synth_ctx *c)
{
    const synth_params *p = c->p;
    const synth_arch *a = find_arch(p->arch);
    uint64_t d = p->d_model;
    c->t = calloc(5 + (size_t)p->n_layer * 24, sizeof *c->t);
    if (!c->t)
        return synth_fail(c, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    float head_std = 3.0f / sqrtf((float)d); /* logits ~ N(0, 9): a clear argmax */
    add_tensor(c, "token_embd", -1, "weight", 2, d, c->n_vocab, SYNTH_INIT_WEIGHT, head_std);
    add_tensor(c, "output_norm", -1, "weight", 1, d, 1, SYNTH_INIT_NORM, 0.1f);
    if (a->coder || !strcmp(a->name, "stablelm") || !strcmp(a->name, "nemotron"))
        add_tensor(c, "output_norm", -1, "bias", 1, d, 1, SYNTH_INIT_BIAS, 0.1f);
    if (!p->tied)
        add_tensor(c, "output", -1, "weight", 2, d, c->n_vocab, SYNTH_INIT_WEIGHT, head_std);
    if (!p->tied && !strcmp(p->arch, "phi2")) /* its LM head's bias */
        add_tensor(c, "output", -1, "bias", 1, c->n_vocab, 1, SYNTH_INIT_BIAS, 0.5f);
    if (p->n_ctx_orig && !strcmp(p->arch, "phi3")) { /* LongRoPE: long factors well above 1, short ones near it */
        uint32_t half_rot = (p->n_rot ? p->n_rot : c->head_dim) / 2; /* one factor per rotated pair */
        add_tensor(c, "rope_factors_long", -1, "weight", 1, half_rot, 1, SYNTH_INIT_FACTOR, 4.0f);
        add_tensor(c, "rope_factors_short", -1, "weight", 1, half_rot, 1, SYNTH_INIT_FACTOR, 0.2f);
    }
    for (int l = 0; l < (int)p->n_layer; l++)
        add_layer(c, a, l);
    return VKI_OK;
}

/* One note per role whose rows the requested type's block does not divide. */
static void log_fallbacks(synth_ctx *c)
{
    for (uint32_t i = 0; i < c->n_t; i++) {
        const synth_tensor *t = &c->t[i];
        if (t->init != SYNTH_INIT_WEIGHT)
            continue;
        uint32_t want = synth_weight_type(c->p, t->role, t->layer, t->ne[0], false);
        if (want == t->type)
            continue;
        bool seen = false;
        for (uint32_t j = 0; j < i && !seen; j++)
            seen = !strcmp(c->t[j].role, t->role) && c->t[j].type != synth_weight_type(c->p, t->role, c->t[j].layer, c->t[j].ne[0], false);
        if (!seen)
            synth_log(c->p, "note: %s: row length %llu is not a multiple of the %s block (%u): written as %s, "
                      "llama.cpp's fallback", t->role, (unsigned long long)t->ne[0], quant_get(want)->name,
                      quant_get(want)->block_elems, quant_get(t->type)->name);
    }
}

/* ---- parameters ------------------------------------------------------------------------------ */

static bool dim_ok(uint32_t v)
{
    return v >= 1 && v <= SYNTH_MAX_DIM;
}

static vki_status validate(synth_ctx *c)
{
    const synth_params *p = c->p;
    if (!find_arch(p->arch))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "arch '%s': llama, qwen2, qwen3, qwen3moe, gemma, gemma2, gemma3, "
                          "phi3, gpt-oss, granite, granitemoe, smollm3, olmo2, exaone, exaone4, glm4, command-r, "
                          "cohere2, mistral3, starcoder2, phi2, stablelm, nemotron, arcee, internlm2 and ernie4_5 are "
                          "written",
                          p->arch ? p->arch : "(null)");
    if (p->n_layer < 1 || p->n_layer > SYNTH_MAX_LAYERS)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "n_layer %u (allowed 1..%d)", p->n_layer, SYNTH_MAX_LAYERS);
    if (!dim_ok(p->d_model) || !dim_ok(p->n_head) || !dim_ok(p->n_head_kv) || !dim_ok(p->d_ff) || !dim_ok(p->n_ctx) ||
        p->head_dim > SYNTH_MAX_DIM)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "a dimension is 0 or above %u", SYNTH_MAX_DIM);
    if (p->n_head % p->n_head_kv)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "n_head_kv %u does not divide n_head %u", p->n_head_kv, p->n_head);
    if (!p->head_dim && p->d_model % p->n_head)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "n_head %u does not divide d_model %u (give head_dim)", p->n_head,
                          p->d_model);
    c->head_dim = p->head_dim ? p->head_dim : p->d_model / p->n_head;
    if (c->head_dim % 2)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "head_dim %u is odd (RoPE rotates pairs)", c->head_dim);
    if (p->n_rot % 2 || p->n_rot > c->head_dim)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "n_rot %u must be even and at most head_dim %u", p->n_rot,
                          c->head_dim);
    if ((uint64_t)p->n_head * c->head_dim > SYNTH_MAX_DIM)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "n_head * head_dim above %u", SYNTH_MAX_DIM);
    if ((unsigned)p->wtype >= SYNTH_WTYPE_COUNT)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "weight type %d", (int)p->wtype);
    if (!(p->rope_base > 0) || !(p->rms_eps > 0))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "rope_base and rms_eps must be > 0");
    bool yarn = p->yarn_factor != 0;
    if (!(p->attn_softcap >= 0) || !(p->final_softcap >= 0) || p->sliding_window > (1u << 24) ||
        p->n_ctx_orig >= p->n_ctx || (p->n_ctx_orig && strcmp(p->arch, "phi3") && strcmp(p->arch, "mistral3") && !yarn))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "soft-caps must be >= 0, the window <= 2^24, and the LongRoPE "
                          "original context (phi3 only) below the context");
    if (yarn &&
        (!(p->yarn_factor >= 1) || !p->n_ctx_orig || !strcmp(p->arch, "phi3") || !strncmp(p->arch, "gemma", 5)))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "YaRN: a factor >= 1 over an original context below the context, "
                          "and not phi3 (LongRoPE) or gemma");
    bool moe_arch = !strcmp(p->arch, "qwen3moe") || !strcmp(p->arch, "gpt-oss") || !strcmp(p->arch, "granitemoe");
    if ((moe_arch && !p->n_expert) || (p->n_expert && strcmp(p->arch, "llama") && !moe_arch))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "experts: qwen3moe, gpt-oss and granitemoe need them (n_expert > "
                          "0); besides them only llama (Mixtral's layout) has them");
    if (p->d_ff_shexp && (strcmp(p->arch, "granitemoe") || !dim_ok(p->d_ff_shexp)))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "a shared expert (d_ff_shexp %u, 1..%u) is written for granitemoe "
                          "only", p->d_ff_shexp, SYNTH_MAX_DIM);
    if (p->n_expert && (p->n_expert > 4096 || !p->n_expert_used || p->n_expert_used > p->n_expert ||
                        p->d_ff_exp > SYNTH_MAX_DIM))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "experts: n_expert %u (<= 4096), n_expert_used %u must be in [1, "
                          "n_expert]", p->n_expert, p->n_expert_used);
    if (!strncmp(p->arch, "granite", 7) && (!(p->logit_scale > 0) || !(p->embedding_scale >= 0) ||
                                        !(p->residual_scale >= 0) || !(p->attention_scale >= 0)))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "granite: logit_scale must be > 0, the other multipliers >= 0");
    if (find_arch(p->arch)->cohere && !(p->logit_scale > 0))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "%s: logit_scale must be > 0", p->arch);
    if (!strcmp(p->arch, "cohere2") && !p->sliding_window)
        return synth_fail(c, VKI_ERR_INVALID_ARG, "cohere2: a sliding window is required");
    if (!p->vocab_from && (p->n_vocab < SYNTH_BYTE_VOCAB || p->n_vocab > 4 * SYNTH_MAX_DIM))
        return synth_fail(c, VKI_ERR_INVALID_ARG, "n_vocab %u (a byte-level vocabulary needs %d..%u)", p->n_vocab,
                          SYNTH_BYTE_VOCAB, 4 * SYNTH_MAX_DIM);
    return VKI_OK;
}

/* ---- vocabulary ------------------------------------------------------------------------------ */

/* The i-th piece after the byte tokens, into buf (>= 16 bytes); returns its length. Order: "▁",
 * the 94 printable ASCII characters, "▁" + each of them, then lowercase words of length 2, 3, ...
 * each followed by "▁" + the word. All distinct, so SentencePiece scoring has no duplicates. */
static size_t extra_piece(uint64_t i, char *buf)
{
    static const char sp[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's space */
    size_t n = 0;
    if (i == 0) {
        memcpy(buf, sp, 3);
        return 3;
    }
    i -= 1;
    if (i < 188) {
        if (i >= 94) {
            memcpy(buf, sp, 3);
            n = 3;
            i -= 94;
        }
        buf[n++] = (char)(0x21 + i);
        return n;
    }
    i -= 188;
    uint64_t len = 2, count = 26 * 26;
    while (i >= 2 * count) {
        i -= 2 * count;
        len++;
        count *= 26;
    }
    if (i % 2) {
        memcpy(buf, sp, 3);
        n = 3;
    }
    uint64_t word = i / 2;
    for (uint64_t k = 0; k < len; k++, word /= 26)
        buf[n + len - 1 - k] = (char)('a' + word % 26);
    return n + (size_t)len;
}

static vki_status write_byte_vocab(synth_ctx *c, gguf_writer *w)
{
    uint32_t n = c->n_vocab;
    gguf_str *tok = malloc(n * sizeof *tok);
    char *pool = malloc((size_t)n * 16);
    float *score = malloc(n * sizeof *score);
    int32_t *type = malloc(n * sizeof *type);
    vki_status st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (!tok || !pool || !score || !type)
        goto out;
    size_t used = 0;
    for (uint32_t i = 0; i < n; i++) {
        char *s = pool + used;
        size_t len;
        if (i < 3) {
            static const char *const special[] = {"<unk>", "<s>", "</s>"};
            len = strlen(special[i]);
            memcpy(s, special[i], len);
            type[i] = i == 0 ? 2 : 3; /* unknown, control */
        } else if (i < SYNTH_BYTE_VOCAB) {
            len = (size_t)snprintf(s, 16, "<0x%02X>", i - 3);
            type[i] = 6; /* byte */
        } else {
            len = extra_piece(i - SYNTH_BYTE_VOCAB, s);
            type[i] = 1; /* normal */
        }
        score[i] = i < SYNTH_BYTE_VOCAB ? 0.0f : -(float)(i - SYNTH_BYTE_VOCAB); /* earlier pieces merge first */
        tok[i] = (gguf_str){s, len};
        used += len;
    }
    if ((st = gguf_w_set_str(w, "tokenizer.ggml.model", "llama")) == VKI_OK &&
        (st = gguf_w_set_str(w, "tokenizer.ggml.pre", "default")) == VKI_OK &&
        (st = gguf_w_set_arr_str(w, "tokenizer.ggml.tokens", tok, n)) == VKI_OK &&
        (st = gguf_w_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, score, n)) == VKI_OK &&
        (st = gguf_w_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, type, n)) == VKI_OK &&
        (st = gguf_w_set_u32(w, "tokenizer.ggml.unknown_token_id", 0)) == VKI_OK &&
        (st = gguf_w_set_u32(w, "tokenizer.ggml.bos_token_id", 1)) == VKI_OK &&
        (st = gguf_w_set_u32(w, "tokenizer.ggml.eos_token_id", 2)) == VKI_OK &&
        (st = gguf_w_set_bool(w, "tokenizer.ggml.add_bos_token", true)) == VKI_OK)
        st = gguf_w_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    if (st != VKI_OK)
        synth_fail(c, st, "vocabulary: %s", gguf_w_error(w));
out:
    if (st == VKI_ERR_OUT_OF_HOST_MEMORY && (!tok || !pool || !score || !type))
        synth_fail(c, st, "out of memory for the vocabulary");
    free(tok), free(pool), free(score), free(type);
    return st;
}

/* Opens the vocab GGUF and takes n_vocab from its token list. */
static vki_status open_vocab(synth_ctx *c, gguf_file **src)
{
    char e[400];
    vki_status st = gguf_open(c->p->vocab_from, src, e, sizeof e);
    if (st != VKI_OK)
        return synth_fail(c, st, "vocabulary file: %s", e);
    gguf_type et;
    uint64_t n;
    if (gguf_get_arr(*src, "tokenizer.ggml.tokens", &et, &n) != VKI_OK || et != GGUF_TYPE_STRING || n < 1 ||
        n > 4 * SYNTH_MAX_DIM) {
        gguf_close(*src);
        *src = NULL;
        return synth_fail(c, VKI_ERR_FORMAT, "%s: no usable tokenizer.ggml.tokens", c->p->vocab_from);
    }
    c->n_vocab = (uint32_t)n;
    return VKI_OK;
}

static vki_status copy_vocab(synth_ctx *c, gguf_writer *w, const gguf_file *src)
{
    for (uint64_t i = 0; i < gguf_n_kv(src); i++) {
        const gguf_kv *kv = gguf_kv_at(src, i);
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10))
            continue;
        vki_status st = gguf_w_copy_kv(w, kv);
        if (st != VKI_OK)
            return synth_fail(c, st, "copying the vocabulary: %s", gguf_w_error(w));
    }
    return VKI_OK;
}

/* ---- metadata -------------------------------------------------------------------------------- */

static vki_status write_metadata(synth_ctx *c, gguf_writer *w)
{
    const synth_params *p = c->p;
    const char *a = p->arch;
    char k[96];
    vki_status st = VKI_OK;
#define SET(fn, key_fmt, v)                                                                                            \
    do {                                                                                                               \
        if (st == VKI_OK) {                                                                                            \
            snprintf(k, sizeof k, key_fmt, a);                                                                         \
            st = fn(w, k, v);                                                                                          \
        }                                                                                                              \
    } while (0)
    SET(gguf_w_set_str, "general.architecture%.0s", a);
    SET(gguf_w_set_str, "general.name%.0s", p->name ? p->name : "vkinfer-synthetic");
    SET(gguf_w_set_u32, "general.file_type%.0s", synth_schemes[p->wtype].ftype);
    if (p->wtype != SYNTH_F32 && p->wtype != SYNTH_F16 && p->wtype != SYNTH_BF16)
        SET(gguf_w_set_u32, "general.quantization_version%.0s", 2);
    SET(gguf_w_set_u32, "%s.context_length", p->n_ctx);
    SET(gguf_w_set_u32, "%s.embedding_length", p->d_model);
    SET(gguf_w_set_u32, "%s.block_count", p->n_layer);
    SET(gguf_w_set_u32, "%s.feed_forward_length", p->d_ff);
    SET(gguf_w_set_u32, "%s.attention.head_count", p->n_head);
    SET(gguf_w_set_u32, "%s.attention.head_count_kv", p->n_head_kv);
    const synth_arch *sa = find_arch(a);
    if (sa->cohere || sa->coder || !strcmp(a, "stablelm") || !strcmp(a, "nemotron")) /* LayerNorm models: the
                                                                                        converter's norm_eps key */
        SET(gguf_w_set_f32, "%s.attention.layer_norm_epsilon", p->rms_eps);
    else
        SET(gguf_w_set_f32, "%s.attention.layer_norm_rms_epsilon", p->rms_eps);
    SET(gguf_w_set_f32, "%s.rope.freq_base", p->rope_base);
    SET(gguf_w_set_u32, "%s.rope.dimension_count", p->n_rot ? p->n_rot : c->head_dim);
    if (p->d_model % p->n_head || c->head_dim != p->d_model / p->n_head) {
        SET(gguf_w_set_u32, "%s.attention.key_length", c->head_dim);
        SET(gguf_w_set_u32, "%s.attention.value_length", c->head_dim);
    }
    SET(gguf_w_set_u32, "%s.vocab_size", c->n_vocab);
    if (p->sliding_window || !strcmp(a, "phi3")) /* the phi3 converter writes 0 for "none" */
        SET(gguf_w_set_u32, "%s.attention.sliding_window", p->sliding_window);
    if (p->n_expert) {
        SET(gguf_w_set_u32, "%s.expert_count", p->n_expert);
        SET(gguf_w_set_u32, "%s.expert_used_count", p->n_expert_used);
        if (!strcmp(a, "qwen3moe") || !strcmp(a, "gpt-oss"))
            SET(gguf_w_set_u32, "%s.expert_feed_forward_length", p->d_ff_exp ? p->d_ff_exp : p->d_ff);
        if (p->d_ff_shexp) /* convert_hf_to_gguf's GraniteMoeModel */
            SET(gguf_w_set_u32, "%s.expert_shared_feed_forward_length", p->d_ff_shexp);
    }
    if (!strncmp(a, "granite", 7)) { /* convert_hf_to_gguf's GraniteModel */
        if (p->embedding_scale > 0)
            SET(gguf_w_set_f32, "%s.embedding_scale", p->embedding_scale);
        if (p->residual_scale > 0)
            SET(gguf_w_set_f32, "%s.residual_scale", p->residual_scale);
        if (p->attention_scale > 0)
            SET(gguf_w_set_f32, "%s.attention.scale", p->attention_scale);
        SET(gguf_w_set_f32, "%s.logit_scale", p->logit_scale);
    }
    if (sa->cohere)
        SET(gguf_w_set_f32, "%s.logit_scale", p->logit_scale);
    if (!strcmp(a, "mistral3") && p->attn_temp_scale > 0 && p->n_ctx_orig) /* convert_hf_to_gguf's Mistral3Model */
        SET(gguf_w_set_f32, "%s.attention.temperature_scale", p->attn_temp_scale);
    if (!strcmp(a, "mistral3") && p->yarn_factor != 0) /* Ministral 3's mscale_all_dim */
        SET(gguf_w_set_f32, "%s.rope.scaling.yarn_log_multiplier", 1.0f);
    if (p->attn_softcap > 0)
        SET(gguf_w_set_f32, "%s.attn_logit_softcapping", p->attn_softcap);
    if (p->final_softcap > 0)
        SET(gguf_w_set_f32, "%s.final_logit_softcapping", p->final_softcap);
    if (p->yarn_factor != 0) { /* convert_hf_to_gguf's rope_scaling {"type": "yarn", ...} */
        SET(gguf_w_set_str, "%s.rope.scaling.type", "yarn");
        SET(gguf_w_set_f32, "%s.rope.scaling.factor", p->yarn_factor);
        SET(gguf_w_set_u32, "%s.rope.scaling.original_context_length", p->n_ctx_orig);
    } else if (p->n_ctx_orig && !strcmp(a, "mistral3")) {
        SET(gguf_w_set_u32, "%s.rope.scaling.original_context_length", p->n_ctx_orig);
    } else if (p->n_ctx_orig) { /* Phi3MiniModel's LongRoPE attention factor */
        double scale = (double)p->n_ctx / p->n_ctx_orig;
        SET(gguf_w_set_u32, "%s.rope.scaling.original_context_length", p->n_ctx_orig);
        SET(gguf_w_set_f32, "%s.rope.scaling.attn_factor", (float)sqrt(1 + log(scale) / log((double)p->n_ctx_orig)));
    }
#undef SET
    if (st != VKI_OK)
        return synth_fail(c, st, "metadata: %s", gguf_w_error(w));
    return VKI_OK;
}

/* ---- weights --------------------------------------------------------------------------------- */

/* ~N(0, 1) from one 64-bit draw: the sum of four 16-bit uniforms (Irwin-Hall, mean 2, variance
 * 1/3), rescaled. Bounded by +-3.5: no outliers, and cheaper than Box-Muller. */
static float synth_gauss(uint64_t *s)
{
    uint64_t z = vki_splitmix64(s);
    float a = (float)(z & 0xffff) + (float)((z >> 16) & 0xffff) + (float)((z >> 32) & 0xffff) + (float)(z >> 48);
    return (a * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* Rows [r0, r1) of one tensor, generated and encoded by one worker into out (row r0 first).
 * Element e of a tensor is draw e + 1 of its stream whatever the split: the same bytes for any
 * number of threads. */
typedef struct synth_job {
    const synth_tensor *t;
    uint64_t rng0;       /* the tensor's stream state before its first draw */
    uint64_t r0, r1;
    float *f;            /* [SYNTH_CHUNK_ELEMS] this worker's scratch */
    uint8_t *out;
} synth_job;

static void *synth_run_job(void *arg)
{
    const synth_job *j = arg;
    const synth_tensor *t = j->t;
    uint64_t ne0 = t->ne[0], rows_per = SYNTH_CHUNK_ELEMS / ne0;
    size_t row_bytes = quant_row_bytes(t->type, ne0);
    for (uint64_t r0 = j->r0; r0 < j->r1; r0 += rows_per) {
        uint64_t nr = j->r1 - r0 < rows_per ? j->r1 - r0 : rows_per, rng = j->rng0 + r0 * ne0 * SYNTH_GAMMA;
        for (uint64_t i = 0; i < nr * ne0; i++) {
            float g = synth_gauss(&rng) * t->std;
            j->f[i] = t->init == SYNTH_INIT_NORM ? 1.0f + g : t->init == SYNTH_INIT_FACTOR ? 1.0f + fabsf(g) : g;
        }
        for (uint64_t r = 0; r < nr; r++)
            quant_row_fast(t->type, j->f + r * ne0, j->out + (r0 - j->r0 + r) * row_bytes, ne0);
    }
    return NULL;
}

typedef struct synth_stream {
    uint32_t n_threads;
    float *f;            /* [n_threads][SYNTH_CHUNK_ELEMS] */
    uint8_t *q[2];       /* [n_threads * SYNTH_CHUNK_ELEMS * 4] each: batch i is encoded into q[i % 2] */
    synth_job jobs[SYNTH_MAX_THREADS];
    pthread_t tid[SYNTH_MAX_THREADS];
    uint32_t n_started;  /* workers of the batch in flight (jobs[1..n_started]) */
    uint64_t done, total; /* bytes, for progress */
    int last_pct;
} synth_stream;

/* Starts rows [r0, r0 + nr) of t on the workers, encoding into out; job 0 runs on the caller
 * at synth_batch_join (so do jobs whose thread could not be created). */
static void synth_batch_start(synth_stream *s, const synth_tensor *t, uint64_t rng0, uint64_t r0, uint64_t nr,
                              uint8_t *out)
{
    uint64_t per = (nr + s->n_threads - 1) / s->n_threads;
    size_t row_bytes = quant_row_bytes(t->type, t->ne[0]);
    s->n_started = 0;
    for (uint32_t k = 0; k < s->n_threads; k++) {
        uint64_t a = r0 + k * per < r0 + nr ? r0 + k * per : r0 + nr, b = a + per < r0 + nr ? a + per : r0 + nr;
        s->jobs[k] = (synth_job){t, rng0, a, b, s->f + (size_t)k * SYNTH_CHUNK_ELEMS, out + (a - r0) * row_bytes};
    }
    for (uint32_t k = 1; k < s->n_threads && s->jobs[k].r0 < s->jobs[k].r1; k++) {
        if (pthread_create(&s->tid[k], NULL, synth_run_job, &s->jobs[k]) != 0)
            break;
        s->n_started = k;
    }
}

static void synth_batch_join(synth_stream *s)
{
    synth_run_job(&s->jobs[0]);
    for (uint32_t k = s->n_started + 1; k < s->n_threads; k++) /* not started: run them here */
        synth_run_job(&s->jobs[k]);
    for (uint32_t k = 1; k <= s->n_started; k++)
        pthread_join(s->tid[k], NULL);
    s->n_started = 0;
}

static vki_status write_tensor(synth_ctx *c, gguf_writer *w, const synth_tensor *t, synth_stream *s)
{
    uint64_t rng = c->p->seed * 0x2545f4914f6cdd1dull;
    for (const char *n = t->name; *n; n++) /* per-tensor stream: independent of chunking and order */
        rng = (rng ^ (uint8_t)*n) * 1099511628211ull;
    uint64_t ne0 = t->ne[0], batch = SYNTH_CHUNK_ELEMS / ne0 * s->n_threads, n_rows = t->ne[1] * t->ne[2];
    size_t row_bytes = quant_row_bytes(t->type, ne0);
    uint64_t n_batches = (n_rows + batch - 1) / batch;
    synth_batch_start(s, t, rng, 0, n_rows < batch ? n_rows : batch, s->q[0]);
    for (uint64_t i = 0; i < n_batches; i++) {
        uint64_t r0 = i * batch, nr = n_rows - r0 < batch ? n_rows - r0 : batch;
        synth_batch_join(s);
        bool more = i + 1 < n_batches;
        if (more) /* the next batch is computed while this one is written */
            synth_batch_start(s, t, rng, r0 + batch, n_rows - r0 - batch < batch ? n_rows - r0 - batch : batch,
                              s->q[(i + 1) % 2]);
        vki_status st = gguf_w_data(w, s->q[i % 2], (size_t)(nr * row_bytes));
        if (st != VKI_OK) {
            if (more)
                synth_batch_join(s);
            return synth_fail(c, st, "tensor '%s': %s", t->name, gguf_w_error(w));
        }
        s->done += nr * row_bytes;
        int pct = (int)(s->done * 10 / s->total) * 10;
        if (pct > s->last_pct && s->total > (64u << 20)) {
            s->last_pct = pct;
            synth_log(c->p, "weights: %d%% (%llu of %llu MiB)", pct, (unsigned long long)(s->done >> 20),
                      (unsigned long long)(s->total >> 20));
        }
    }
    return VKI_OK;
}

static uint32_t synth_threads(const synth_params *p)
{
    long n = p->n_threads ? (long)p->n_threads : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > SYNTH_MAX_THREADS ? SYNTH_MAX_THREADS : (uint32_t)n;
}

static vki_status write_all(synth_ctx *c, gguf_writer *w, const char *tmp)
{
    synth_stream s = {.n_threads = synth_threads(c->p)};
    size_t n = (size_t)s.n_threads * SYNTH_CHUNK_ELEMS;
    s.f = malloc(n * sizeof(float));
    s.q[0] = malloc(n * sizeof(float));
    s.q[1] = malloc(n * sizeof(float));
    vki_status st = VKI_OK;
    if (!s.f || !s.q[0] || !s.q[1])
        st = synth_fail(c, VKI_ERR_OUT_OF_HOST_MEMORY, "out of memory");
    for (uint32_t i = 0; i < c->n_t; i++)
        s.total += gguf_w_tensor_bytes(w, i);
    if (st == VKI_OK && (st = gguf_w_open(w, tmp)) != VKI_OK)
        synth_fail(c, st, "%s", gguf_w_error(w));
    for (uint32_t i = 0; i < c->n_t && st == VKI_OK; i++)
        st = write_tensor(c, w, &c->t[i], &s);
    if (st == VKI_OK && (st = gguf_w_finish(w)) != VKI_OK)
        synth_fail(c, st, "%s", gguf_w_error(w));
    free(s.f);
    free(s.q[0]);
    free(s.q[1]);
    return st;
}

vki_status synth_write(const synth_params *p, const char *path, char *err, size_t err_len)
{
    synth_ctx c = {.p = p, .err = err, .err_len = err_len, .n_vocab = p->n_vocab};
    gguf_file *src = NULL;
    gguf_writer *w = NULL;
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return synth_fail(&c, VKI_ERR_INVALID_ARG, "path too long");
    vki_status st = validate(&c);
    if (st == VKI_OK && p->vocab_from)
        st = open_vocab(&c, &src);
    if (st == VKI_OK)
        st = build_tensors(&c);
    if (st == VKI_OK && (st = gguf_w_create(&w)) != VKI_OK)
        synth_fail(&c, st, "out of memory");
    if (st == VKI_OK)
        st = write_metadata(&c, w);
    if (st == VKI_OK)
        st = src ? copy_vocab(&c, w, src) : write_byte_vocab(&c, w);
    for (uint32_t i = 0; i < c.n_t && st == VKI_OK; i++) {
        const synth_tensor *t = &c.t[i];
        if ((st = gguf_w_add_tensor(w, t->name, t->type, t->n_dims, t->ne)) != VKI_OK)
            synth_fail(&c, st, "%s", gguf_w_error(w));
    }
    gguf_close(src);
    if (st == VKI_OK) {
        log_fallbacks(&c);
        st = write_all(&c, w, tmp);
    }
    gguf_w_destroy(w); /* closes the temporary file if a write failed */
    if (st == VKI_OK && rename(tmp, path) != 0)
        st = synth_fail(&c, VKI_ERR_IO, "%s: cannot rename %s into place", path, tmp);
    if (st != VKI_OK)
        unlink(tmp);
    free(c.t);
    return st;
}
