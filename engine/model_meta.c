#include "engine/model_meta.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"
#include "shaders/vki_shared.h"

static vki_status fail(vki_status st, char *err, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static vki_status fail(vki_status st, char *err, size_t n, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* "<arch>.<suffix>" */
static const char *akey(const model_hparams *hp, const char *suffix, char *buf, size_t n)
{
    snprintf(buf, n, "%s.%s", hp->arch_name, suffix);
    return buf;
}

static vki_status get_u32(const gguf_file *f, const model_hparams *hp, const char *suffix, bool required,
                          uint32_t *out, char *err, size_t n)
{
    char key[128];
    vki_status st = gguf_get_u32(f, akey(hp, suffix, key, sizeof key), out);
    if (st == VKI_ERR_NOT_FOUND && !required)
        return VKI_OK;
    if (st == VKI_ERR_NOT_FOUND)
        return fail(VKI_ERR_FORMAT, err, n, "missing metadata key %s", key);
    if (st != VKI_OK)
        return fail(VKI_ERR_FORMAT, err, n, "metadata key %s: not an unsigned 32-bit integer", key);
    return VKI_OK;
}

static vki_status get_f32(const gguf_file *f, const model_hparams *hp, const char *suffix, float *out,
                          char *err, size_t n)
{
    char key[128];
    vki_status st = gguf_get_f32(f, akey(hp, suffix, key, sizeof key), out);
    if (st == VKI_ERR_NOT_FOUND)
        return VKI_OK;
    if (st != VKI_OK || !isfinite(*out))
        return fail(VKI_ERR_FORMAT, err, n, "metadata key %s: not a finite number", key);
    return VKI_OK;
}

/* YaRN (rope.scaling.type yarn: Qwen2.5 / Qwen3 long-context files, gpt-oss): the ramp's
 * bounds and extent (llama.cpp's keys and defaults), and the magnitude llama.cpp ends up with,
 * *attn_factor times 1 + 0.1 ln(factor) where the blend runs (ggml's rope_yarn; llama.cpp's
 * context cancels its own copy of that term, PR 17945). DeepSeek's yarn_log_multiplier
 * (mscale_all_dim) changes the magnitude; no architecture here has it, so a file with it is
 * refused rather than scaled wrong. */
static vki_status read_yarn(const gguf_file *f, model_hparams *hp, float factor, float *attn_factor, char *err,
                            size_t n)
{
    vki_status st;
    float log_mul = 0.0f;
    hp->yarn_ext_factor = 1.0f, hp->yarn_beta_fast = 32.0f, hp->yarn_beta_slow = 1.0f;
    if ((st = get_f32(f, hp, "rope.scaling.yarn_ext_factor", &hp->yarn_ext_factor, err, n)) ||
        (st = get_f32(f, hp, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast, err, n)) ||
        (st = get_f32(f, hp, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow, err, n)) ||
        (st = get_f32(f, hp, "rope.scaling.yarn_log_multiplier", &log_mul, err, n)))
        return st;
    if (!(hp->yarn_ext_factor >= 0.0f) || hp->yarn_ext_factor > 1.0f)
        return fail(VKI_ERR_FORMAT, err, n, "%s.rope.scaling.yarn_ext_factor = %g must be in [0, 1]", hp->arch_name,
                    hp->yarn_ext_factor);
    if (!(hp->yarn_beta_fast > 0.0f) || !(hp->yarn_beta_slow > 0.0f))
        return fail(VKI_ERR_FORMAT, err, n, "%s.rope.scaling.yarn_beta_fast / _slow = %g / %g must be > 0",
                    hp->arch_name, hp->yarn_beta_fast, hp->yarn_beta_slow);
    if (log_mul != 0.0f && hp->arch != MODEL_ARCH_MISTRAL3) /* mistral3: see read_mistral3 */
        return fail(VKI_ERR_UNSUPPORTED, err, n, "%s.rope.scaling.yarn_log_multiplier (DeepSeek's mscale_all_dim) is "
                    "not supported", hp->arch_name);
    if (hp->arch == MODEL_ARCH_GEMMA2 || hp->arch == MODEL_ARCH_GEMMA3)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "YaRN RoPE scaling with %s's local layers is not supported",
                    hp->arch_name);
    if (hp->yarn_ext_factor != 0.0f)
        *attn_factor *= 1.0f + 0.1f * logf(factor);
    return VKI_OK;
}

static vki_status read_rope(const gguf_file *f, model_hparams *hp, char *err, size_t n)
{
    char key[128];
    vki_status st;
    if ((st = get_f32(f, hp, "rope.freq_base", &hp->rope_base, err, n)) != VKI_OK)
        return st;
    if (hp->rope_base <= 1.0f)
        return fail(VKI_ERR_FORMAT, err, n, "%s.rope.freq_base = %g must be > 1", hp->arch_name, hp->rope_base);
    gguf_str kind = {0};
    st = gguf_get_str(f, akey(hp, "rope.scaling.type", key, sizeof key), &kind);
    /* LongRoPE ("longrope", formerly "su"): the factors are tensors, checked with them */
    hp->longrope = st == VKI_OK && (gguf_str_eq(kind, "longrope") || gguf_str_eq(kind, "su"));
    hp->yarn = st == VKI_OK && gguf_str_eq(kind, "yarn");
    if (st == VKI_OK && !gguf_str_eq(kind, "none") && !gguf_str_eq(kind, "linear") && !hp->longrope && !hp->yarn)
        return fail(VKI_ERR_UNSUPPORTED, err, n,
                    "rope scaling type '%.*s' is not supported (none, linear, longrope, yarn)",
                    (int)(kind.len > 32 ? 32 : kind.len), kind.ptr);
    float factor = 1.0f, attn_factor = 1.0f;
    if (st == VKI_OK && (gguf_str_eq(kind, "linear") || hp->yarn)) {
        if ((st = get_f32(f, hp, "rope.scaling.factor", &factor, err, n)) != VKI_OK)
            return st;
        if (factor < 1.0f)
            return fail(VKI_ERR_FORMAT, err, n, "rope.scaling.factor %g must be >= 1", factor);
    }
    hp->rope_freq_scale = 1.0f / factor;
    /* LongRoPE (phi3 128k) scales cos and sin of q and k by this: the scores by its square */
    if ((st = get_f32(f, hp, "rope.scaling.attn_factor", &attn_factor, err, n)) != VKI_OK)
        return st;
    if (!(attn_factor > 0) || attn_factor > 16)
        return fail(VKI_ERR_FORMAT, err, n, "%s.rope.scaling.attn_factor = %g must be in (0, 16]", hp->arch_name,
                    attn_factor);
    if (hp->yarn && (st = read_yarn(f, hp, factor, &attn_factor, err, n)) != VKI_OK)
        return st;
    hp->rope_attn_factor = attn_factor;
    hp->n_ctx_orig = hp->n_ctx_train;
    if ((st = get_u32(f, hp, "rope.scaling.original_context_length", false, &hp->n_ctx_orig, err, n)))
        return st;
    if (!hp->n_ctx_orig)
        return fail(VKI_ERR_FORMAT, err, n, "%s.rope.scaling.original_context_length is 0", hp->arch_name);
    hp->n_rot = hp->head_dim;
    if ((st = get_u32(f, hp, "rope.dimension_count", false, &hp->n_rot, err, n)) != VKI_OK)
        return st;
    if (hp->n_rot == 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return fail(VKI_ERR_FORMAT, err, n, "rope.dimension_count %u must be even and in (0, head_dim %u]",
                    hp->n_rot, hp->head_dim);
    return VKI_OK;
}

/* What each architecture's forward pass does beyond llama's (llama.cpp's llm_build_* graphs). */
typedef struct arch_def {
    const char *name;
    model_arch arch;
    bool neox, qk_norm, gemma; /* gemma: GeGLU, post-norms, sqrt(d) embedding scale */
    float rms_eps;             /* default when the file has none */
    uint32_t swa_pattern;      /* with a sliding window: 1 every layer, n: il % n < n - 1 */
} arch_def;

static const arch_def ARCHS[] = {
    {"llama", MODEL_ARCH_LLAMA, false, false, false, 1e-5f, 1},
    /* llama's graph under other names (llama.cpp's internlm2 and ernie4_5 builders are llama's) */
    {"internlm2", MODEL_ARCH_LLAMA, false, false, false, 1e-5f, 1},
    {"ernie4_5", MODEL_ARCH_LLAMA, false, false, false, 1e-5f, 1},
    {"qwen2", MODEL_ARCH_QWEN2, true, false, false, 1e-6f, 0},
    {"qwen3", MODEL_ARCH_QWEN3, true, true, false, 1e-6f, 0},
    {"gemma2", MODEL_ARCH_GEMMA2, true, false, true, 1e-6f, 2},
    {"gemma3", MODEL_ARCH_GEMMA3, true, true, true, 1e-6f, 6},
    {"phi3", MODEL_ARCH_PHI3, true, false, false, 1e-5f, 1},
    {"qwen3moe", MODEL_ARCH_QWEN3MOE, true, true, false, 1e-6f, 0},
    {"gpt-oss", MODEL_ARCH_GPT_OSS, true, false, false, 1e-5f, 2},
    {"granite", MODEL_ARCH_GRANITE, false, false, false, 1e-5f, 0},
    {"smollm3", MODEL_ARCH_SMOLLM3, false, false, false, 1e-6f, 0},
    {"olmo2", MODEL_ARCH_OLMO2, true, true, false, 1e-6f, 0},
    {"granitemoe", MODEL_ARCH_GRANITE_MOE, false, false, false, 1e-5f, 0},
    {"exaone", MODEL_ARCH_EXAONE, true, false, false, 1e-5f, 0},
    {"exaone4", MODEL_ARCH_EXAONE4, true, true, false, 1e-5f, 4},
    {"glm4", MODEL_ARCH_GLM4, false, false, false, 1e-5f, 0},
    {"gemma", MODEL_ARCH_GEMMA, true, false, true, 1e-6f, 0},
    {"command-r", MODEL_ARCH_COMMAND_R, false, false, false, 1e-5f, 0},
    {"cohere2", MODEL_ARCH_COHERE2, false, false, false, 1e-5f, 4},
    {"mistral3", MODEL_ARCH_MISTRAL3, false, false, false, 1e-5f, 1},
    {"starcoder2", MODEL_ARCH_STARCODER2, true, false, false, 1e-5f, 0},
    {"phi2", MODEL_ARCH_PHI2, true, false, false, 1e-5f, 0},
    {"stablelm", MODEL_ARCH_STABLELM, true, false, false, 1e-5f, 0},
    {"nemotron", MODEL_ARCH_NEMOTRON, true, false, false, 1e-5f, 0},
    {"arcee", MODEL_ARCH_ARCEE, false, false, false, 1e-5f, 0},
};

/* A soft-cap key: absent keeps *out, else a finite number >= 0 (0 = none). */
static vki_status read_softcap(const gguf_file *f, model_hparams *hp, const char *suffix, float *out, char *err,
                               size_t n)
{
    vki_status st = get_f32(f, hp, suffix, out, err, n);
    if (st == VKI_OK && *out < 0)
        return fail(VKI_ERR_FORMAT, err, n, "%s.%s = %g must be >= 0", hp->arch_name, suffix, *out);
    return st;
}

/* A Granite multiplier: absent (unless required) or 0 (as llama.cpp reads it: none) keeps *out;
 * else finite and > 0. */
static vki_status read_multiplier(const gguf_file *f, model_hparams *hp, const char *suffix, bool required,
                                  float *out, char *err, size_t n)
{
    float v = 0;
    char key[128];
    vki_status st = gguf_get_f32(f, akey(hp, suffix, key, sizeof key), &v);
    if (st == VKI_ERR_NOT_FOUND && !required)
        return VKI_OK;
    if (st == VKI_ERR_NOT_FOUND)
        return fail(VKI_ERR_FORMAT, err, n, "missing metadata key %s", key);
    if (st != VKI_OK || !isfinite(v) || v < 0 || (required && v == 0))
        return fail(VKI_ERR_FORMAT, err, n, "metadata key %s: must be a finite number > 0", key);
    if (v > 0)
        *out = v;
    return VKI_OK;
}

/* Granite's multipliers (llama.cpp: logit_scale required, the others optional) and its RoPE
 * switch (rope.scaling.finetuned false: no RoPE, refused). */
static vki_status read_granite(const gguf_file *f, model_hparams *hp, char *err, size_t n)
{
    char key[128];
    bool rope = true;
    vki_status st = gguf_get_bool(f, akey(hp, "rope.scaling.finetuned", key, sizeof key), &rope);
    if (st != VKI_OK && st != VKI_ERR_NOT_FOUND)
        return fail(VKI_ERR_FORMAT, err, n, "metadata key %s: not a bool", key);
    if (!rope)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "%s = false (no RoPE) is not supported", key);
    float embd = 1.0f, logit_scale = 1.0f;
    if ((st = read_multiplier(f, hp, "logit_scale", true, &logit_scale, err, n)) ||
        (st = read_multiplier(f, hp, "residual_scale", false, &hp->resid_scale, err, n)) ||
        (st = read_multiplier(f, hp, "embedding_scale", false, &embd, err, n)) ||
        (st = read_multiplier(f, hp, "attention.scale", false, &hp->attn_scale, err, n)))
        return st;
    hp->embd_mul = embd / hp->resid_scale; /* the stream carries x / resid_scale */
    hp->logit_mul = 1.0f / logit_scale;
    return VKI_OK;
}

/* Ministral 3 (llama.cpp's mistral3 graph): the rotation's magnitude is the graph's own
 * 1 / (1 + 0.1 ln(1 / freq_scale)) times ggml's YaRN term where the blend runs, 1 then (so the
 * file's attn_factor and yarn_log_multiplier change nothing); the optional attention temperature
 * steps every rope.scaling.original_context_length positions. */
static vki_status read_mistral3(const gguf_file *f, model_hparams *hp, char *err, size_t n)
{
    vki_status st = get_f32(f, hp, "attention.temperature_scale", &hp->attn_temp_scale, err, n);
    if (st != VKI_OK)
        return st;
    if (hp->attn_temp_scale < 0 || hp->attn_temp_scale > 16)
        return fail(VKI_ERR_FORMAT, err, n, "%s.attention.temperature_scale = %g must be in [0, 16]", hp->arch_name,
                    hp->attn_temp_scale);
    hp->attn_temp_len = hp->attn_temp_scale != 0.0f ? hp->n_ctx_orig : 0;
    hp->rope_attn_factor = hp->yarn && hp->yarn_ext_factor != 0.0f ? 1.0f
                                                                   : 1.0f / (1.0f + 0.1f * logf(1.0f / hp->rope_freq_scale));
    return VKI_OK;
}

/* The LayerNorm architectures, their norms' epsilon key required (llama.cpp's get_key without a
 * default): Cohere's command-r and cohere2 (no bias, the FFN beside the attention, a logit
 * multiplier, required too), starcoder2 and phi2 (biases, a GELU FFN without gate; phi2's beside
 * the attention), stablelm (biases, SwiGLU). */
static vki_status read_layernorm(const gguf_file *f, model_hparams *hp, char *err, size_t n)
{
    char key[128];
    hp->layer_norm = true;
    vki_status st = gguf_get_f32(f, akey(hp, "attention.layer_norm_epsilon", key, sizeof key), &hp->rms_eps);
    if (st == VKI_ERR_NOT_FOUND)
        return fail(VKI_ERR_FORMAT, err, n, "missing metadata key %s", key);
    if (st != VKI_OK || !(hp->rms_eps > 0) || hp->rms_eps > 1)
        return fail(VKI_ERR_FORMAT, err, n, "metadata key %s: must be a number in (0, 1]", key);
    if (hp->arch == MODEL_ARCH_STARCODER2 || hp->arch == MODEL_ARCH_PHI2) { /* LayerNorms with biases, a GELU
                                                                                FFN without gate */
        hp->norm_bias = hp->ffn_plain = hp->ffn_gelu = true;
        hp->parallel_ffn = hp->arch == MODEL_ARCH_PHI2; /* phi2: beside the attention */
        return VKI_OK;
    }
    if (hp->arch == MODEL_ARCH_NEMOTRON) { /* LayerNorms with biases, a squared-ReLU FFN without gate */
        hp->norm_bias = hp->ffn_plain = hp->ffn_relu2 = true;
        return VKI_OK;
    }
    if (hp->arch == MODEL_ARCH_STABLELM) { /* LayerNorms with biases, SwiGLU; without ffn_norm (StableLM
                                              2 12B) the FFN runs beside the attention, as llama.cpp
                                              decides it */
        hp->norm_bias = true;
        hp->parallel_ffn = !gguf_find_tensor(f, "blk.0.ffn_norm.weight");
        return VKI_OK;
    }
    if ((st = read_multiplier(f, hp, "logit_scale", true, &hp->logit_mul, err, n)))
        return st;
    hp->parallel_ffn = true;
    return VKI_OK;
}

/* Sliding window, soft-caps, query scale and per-kind RoPE: what sets the newer architectures
 * apart (after the common keys and read_rope). */
static vki_status read_arch_extras(const gguf_file *f, const arch_def *a, model_hparams *hp, char *err, size_t n)
{
    /* gemma 2 always slides (4096, HF's default); 0 elsewhere means none, as the converter writes
     * for phi-4; gemma 3 without the key has no local layers (llama.cpp) */
    /* exaone4: llama.cpp gives a window (4096 unless the key says) to the 64-layer 32B only, and
     * none to the others whatever the key says */
    /* cohere2: the key is required (llama.cpp) */
    const bool exaone4 = a->arch == MODEL_ARCH_EXAONE4, cohere2 = a->arch == MODEL_ARCH_COHERE2;
    uint32_t window = a->arch == MODEL_ARCH_GEMMA2 || (exaone4 && hp->n_layer == 64) ? 4096 : 0;
    vki_status st = get_u32(f, hp, "attention.sliding_window", cohere2, &window, err, n);
    if (st != VKI_OK)
        return st;
    if (exaone4 && hp->n_layer != 64)
        window = 0;
    if (((a->arch == MODEL_ARCH_GEMMA2 || cohere2) && window == 0) || window > (1u << 24))
        return fail(VKI_ERR_FORMAT, err, n, "%s.attention.sliding_window = %u must be in [%u, 2^24]", hp->arch_name,
                    window, a->arch == MODEL_ARCH_GEMMA2 || cohere2 ? 1 : 0);
    if (a->arch == MODEL_ARCH_QWEN2 || a->arch == MODEL_ARCH_QWEN3 || a->arch == MODEL_ARCH_QWEN3MOE ||
        a->arch == MODEL_ARCH_STARCODER2 || a->arch == MODEL_ARCH_MISTRAL3 || a->arch == MODEL_ARCH_COMMAND_R)
        window = 0; /* their files may carry HF's unused sliding_window; llama.cpp's graphs ignore it too */
    hp->swa_pattern = window ? a->swa_pattern : 0;
    /* gpt-oss: every other layer slides unless sliding_window_pattern says otherwise (llama.cpp) */
    if (a->arch == MODEL_ARCH_GPT_OSS && window &&
        (st = get_u32(f, hp, "attention.sliding_window_pattern", false, &hp->swa_pattern, err, n)))
        return st;
    if (hp->swa_pattern > 1024)
        return fail(VKI_ERR_FORMAT, err, n, "%s.attention.sliding_window_pattern = %u out of range", hp->arch_name,
                    hp->swa_pattern);
    hp->kind[0] = (model_attn_kind){0, hp->rope_base, hp->rope_freq_scale};
    hp->kind[1] = (model_attn_kind){window, hp->rope_base, hp->rope_freq_scale};
    if (a->arch == MODEL_ARCH_GPT_OSS && (st = get_f32(f, hp, "rope.freq_base_swa", &hp->kind[1].rope_base, err, n)))
        return st;
    if (a->arch == MODEL_ARCH_GEMMA3) /* local layers: base 10000, unscaled (llama.cpp, HF) */
        hp->kind[1].rope_base = 10000.0f, hp->kind[1].rope_freq_scale = 1.0f;
    if (a->arch == MODEL_ARCH_GEMMA2)
        hp->attn_softcap = 50.0f, hp->final_softcap = 30.0f; /* llama.cpp's defaults for gemma 2 */
    if (a->arch == MODEL_ARCH_GEMMA2 && (st = read_softcap(f, hp, "attn_logit_softcapping", &hp->attn_softcap, err, n)))
        return st;
    if (a->gemma && a->arch != MODEL_ARCH_GEMMA &&
        (st = read_softcap(f, hp, "final_logit_softcapping", &hp->final_softcap, err, n)))
        return st;
    /* query_pre_attn_scalar: head_dim, except the 27B models' d_model / n_head (llama.cpp knows
     * them by their layer counts: gemma 2 46, gemma 3 62) */
    bool big = (a->arch == MODEL_ARCH_GEMMA2 && hp->n_layer == 46) || (a->arch == MODEL_ARCH_GEMMA3 && hp->n_layer == 62);
    if (big)
        hp->attn_scale *= sqrtf((float)hp->head_dim / (float)(hp->d_model / hp->n_head));
    hp->ffn_gelu = a->gemma;
    hp->post_norms = (a->gemma && a->arch != MODEL_ARCH_GEMMA) || a->arch == MODEL_ARCH_OLMO2 || exaone4 ||
                     a->arch == MODEL_ARCH_GLM4;
    hp->no_pre_norms = a->arch == MODEL_ARCH_OLMO2 || exaone4;
    hp->qk_norm_full = a->arch == MODEL_ARCH_OLMO2;
    hp->embd_mul = a->gemma ? sqrtf((float)hp->d_model) : 1.0f;
    hp->qk_norm = a->qk_norm;
    hp->resid_scale = hp->logit_mul = 1.0f;
    /* hard-coded in llama.cpp too; exaone4 and cohere2 rotate only their sliding-window layers
     * (il % 4 < 3) */
    hp->nope_step = a->arch == MODEL_ARCH_SMOLLM3 || ((exaone4 || cohere2) && window) ? 4 : 0;
    bool granite = a->arch == MODEL_ARCH_GRANITE || a->arch == MODEL_ARCH_GRANITE_MOE;
    if (granite && (st = read_granite(f, hp, err, n)) != VKI_OK)
        return st;
    if ((a->arch == MODEL_ARCH_COMMAND_R || cohere2 || a->arch == MODEL_ARCH_STARCODER2 || a->arch == MODEL_ARCH_PHI2 ||
         a->arch == MODEL_ARCH_STABLELM || a->arch == MODEL_ARCH_NEMOTRON) &&
        (st = read_layernorm(f, hp, err, n)) != VKI_OK)
        return st;
    if (a->arch == MODEL_ARCH_MISTRAL3 && (st = read_mistral3(f, hp, err, n)) != VKI_OK)
        return st;
    if (a->arch == MODEL_ARCH_ARCEE) /* llama's block, a squared-ReLU FFN without gate */
        hp->ffn_plain = hp->ffn_relu2 = true;
    hp->resid_eps = hp->rms_eps / (hp->resid_scale * hp->resid_scale);
    return VKI_OK;
}

/* Mixture of experts: expert_count / expert_used_count (qwen3moe needs them; llama has them for
 * Mixtral; other architectures must not), the expert FFN length and the weight normalisation. */
static vki_status read_experts(const gguf_file *f, model_hparams *hp, char *err, size_t n)
{
    vki_status st;
    bool gpt_oss = hp->arch == MODEL_ARCH_GPT_OSS, granite = hp->arch == MODEL_ARCH_GRANITE_MOE;
    bool moe_arch = hp->arch == MODEL_ARCH_QWEN3MOE || gpt_oss || granite;
    if ((st = get_u32(f, hp, "expert_count", moe_arch, &hp->n_expert, err, n)) ||
        (st = get_u32(f, hp, "expert_used_count", hp->n_expert > 0, &hp->n_expert_used, err, n)))
        return st;
    if (!hp->n_expert && moe_arch)
        return fail(VKI_ERR_FORMAT, err, n, "%s.expert_count is 0", hp->arch_name);
    if (!hp->n_expert)
        return VKI_OK;
    if (hp->arch != MODEL_ARCH_LLAMA && !moe_arch)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "%s with experts (expert_count %u) is not supported (qwen3moe, "
                    "gpt-oss, granitemoe, llama / Mixtral)", hp->arch_name, hp->n_expert);
    if (hp->n_expert > VKI_MOE_MAX_EXPERTS)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "%s.expert_count = %u: at most %u experts are supported", hp->arch_name,
                    hp->n_expert, VKI_MOE_MAX_EXPERTS);
    if (!hp->n_expert_used || hp->n_expert_used > hp->n_expert)
        return fail(VKI_ERR_FORMAT, err, n, "%s.expert_used_count = %u must be in [1, expert_count %u]", hp->arch_name,
                    hp->n_expert_used, hp->n_expert);
    if (hp->n_expert_used > VKI_MOE_MAX_USED)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "%s.expert_used_count = %u: at most %u experts per token are "
                    "supported", hp->arch_name, hp->n_expert_used, VKI_MOE_MAX_USED);
    /* granitemoe: feed_forward_length is the experts' (llama.cpp's n_ff), and the shared
     * expert's length its own key */
    bool by_used = moe_arch && !granite;
    hp->d_ff_exp = by_used ? hp->d_ff / hp->n_expert_used : hp->d_ff;
    if (by_used && (st = get_u32(f, hp, "expert_feed_forward_length", false, &hp->d_ff_exp, err, n)))
        return st;
    uint32_t shexp = 0;
    if (granite && (st = get_u32(f, hp, "expert_shared_feed_forward_length", false, &shexp, err, n)))
        return st;
    if (shexp > 1 << 20)
        return fail(VKI_ERR_FORMAT, err, n, "%s.expert_shared_feed_forward_length = %u out of range", hp->arch_name,
                    shexp);
    hp->shared_expert = shexp > 0;
    if (shexp)
        hp->d_ff = shexp;
    if (!hp->d_ff_exp || hp->d_ff_exp > 1 << 20)
        return fail(VKI_ERR_FORMAT, err, n, "%s: expert feed-forward length %u out of range", hp->arch_name,
                    hp->d_ff_exp);
    char key[128];
    hp->expert_norm = true;
    hp->expert_act = gpt_oss ? VKI_GLU_SWIGLU_OAI : VKI_GLU_SILU;
    hp->expert_bias = gpt_oss;
    if (gpt_oss) /* a softmax over the chosen logits: over all of them, then renormalised */
        return VKI_OK;
    st = gguf_get_bool(f, akey(hp, "expert_weights_norm", key, sizeof key), &hp->expert_norm);
    if (st != VKI_OK && st != VKI_ERR_NOT_FOUND)
        return fail(VKI_ERR_FORMAT, err, n, "metadata key %s: not a bool", key);
    return VKI_OK;
}

vki_status model_read_hparams(const gguf_file *f, model_hparams *hp, char *err, size_t n)
{
    memset(hp, 0, sizeof *hp);
    uint32_t split_no, split_count; /* gguf_open joined a split model opened by its first part */
    if (gguf_split_part(f, &split_no, &split_count) == VKI_OK && split_no && split_count > 1)
        return fail(VKI_ERR_INVALID_ARG, err, n, "this file is part %u of a model split in %u files: open the first "
                    "(the name ending in -00001-of-%05u.gguf)", split_no + 1, split_count, split_count);
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch) != VKI_OK)
        return fail(VKI_ERR_FORMAT, err, n, "missing metadata key general.architecture");
    const arch_def *a = NULL;
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0] && !a; i++)
        if (gguf_str_eq(arch, ARCHS[i].name))
            a = &ARCHS[i];
    if (!a)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "architecture '%.*s' is not supported (llama, qwen2, qwen3, qwen3moe, "
                    "gemma, gemma2, gemma3, phi3, gpt-oss, granite, granitemoe, smollm3, olmo2, exaone, exaone4, glm4, "
                    "command-r, cohere2, mistral3, starcoder2, phi2, stablelm, nemotron, arcee, internlm2, ernie4_5)", (int)(arch.len > 32 ? 32 : arch.len), arch.ptr);
    hp->arch = a->arch;
    hp->rope_neox = a->neox;
    hp->rms_eps = a->rms_eps;
    snprintf(hp->arch_name, sizeof hp->arch_name, "%.*s", (int)arch.len, arch.ptr);
    hp->rope_base = 10000.0f;
    vki_status st;
    if ((st = get_u32(f, hp, "block_count", true, &hp->n_layer, err, n)) ||
        (st = get_u32(f, hp, "embedding_length", true, &hp->d_model, err, n)) ||
        (st = get_u32(f, hp, "feed_forward_length", true, &hp->d_ff, err, n)) ||
        (st = get_u32(f, hp, "attention.head_count", true, &hp->n_head, err, n)))
        return st;
    hp->n_head_kv = hp->n_head;
    hp->n_ctx_train = 2048;
    if ((st = get_u32(f, hp, "attention.head_count_kv", false, &hp->n_head_kv, err, n)) ||
        (st = get_u32(f, hp, "context_length", false, &hp->n_ctx_train, err, n)) ||
        (st = get_f32(f, hp, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err, n)) ||
        (st = get_u32(f, hp, "pooling_type", false, &hp->pooling_type, err, n)))
        return st;
    if (hp->pooling_type > 4)
        return fail(VKI_ERR_FORMAT, err, n, "%s.pooling_type = %u is none of llama.cpp's (0..4)", hp->arch_name,
                    hp->pooling_type);
    if (!hp->n_layer || hp->n_layer > 1024 || !hp->d_model || hp->d_model > 65536 || !hp->d_ff ||
        hp->d_ff > 1 << 20 || !hp->n_head || hp->n_head > 1024 || !hp->n_head_kv || hp->n_head % hp->n_head_kv)
        return fail(VKI_ERR_FORMAT, err, n, "inconsistent shape: %u layers, d_model %u, d_ff %u, %u heads, %u kv heads",
                    hp->n_layer, hp->d_model, hp->d_ff, hp->n_head, hp->n_head_kv);
    hp->head_dim = hp->d_model / hp->n_head;
    if ((st = get_u32(f, hp, "attention.key_length", false, &hp->head_dim, err, n)))
        return st;
    uint32_t vlen = hp->head_dim;
    if ((st = get_u32(f, hp, "attention.value_length", false, &vlen, err, n)))
        return st;
    if (!hp->head_dim || hp->head_dim > 512 || vlen != hp->head_dim)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "head dim %u / value length %u not supported (equal, <= 512)",
                    hp->head_dim, vlen);
    if (!(hp->rms_eps > 0) || hp->n_ctx_train == 0)
        return fail(VKI_ERR_FORMAT, err, n, "rms epsilon %g / context length %u invalid", hp->rms_eps, hp->n_ctx_train);
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if ((st = read_rope(f, hp, err, n)) != VKI_OK || (st = read_experts(f, hp, err, n)) != VKI_OK)
        return st;
    return read_arch_extras(f, a, hp, err, n);
}

/* The tensor's type is one vkinfer runs. */
static vki_status runnable(const gguf_tensor *t, const char *name, char *err, size_t n)
{
    if (!quant_get(t->type))
        return fail(VKI_ERR_UNSUPPORTED, err, n, "tensor %s: weight type %s (id %u) is not supported; vkinfer runs %s",
                    name, quant_type_name(t->type), t->type, quant_supported_list());
    return VKI_OK;
}

/* Finds `name`, checks ggml shape [ne0, ne1] (ne1 = 0: a vector) and type class. */
static vki_status find(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1, bool f32_only,
                       bool optional, const gguf_tensor **out, char *err, size_t n)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    *out = t;
    if (!t)
        return optional ? VKI_OK : fail(VKI_ERR_FORMAT, err, n, "missing tensor %s", name);
    uint64_t want1 = ne1 ? ne1 : 1;
    uint64_t rows = 1;
    for (uint32_t i = 1; i < t->n_dims; i++)
        rows *= t->ne[i];
    if (t->ne[0] != ne0 || rows != want1 || (ne1 && t->n_dims != 2))
        return fail(VKI_ERR_FORMAT, err, n, "tensor %s has shape [%llu, %llu], expected [%llu, %llu]", name,
                    (unsigned long long)t->ne[0], (unsigned long long)rows, (unsigned long long)ne0,
                    (unsigned long long)want1);
    if (f32_only && t->type != VKI_GGML_F32)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "tensor %s: type %s, expected f32", name, quant_type_name(t->type));
    return runnable(t, name, err, n);
}

/* The attention projections: q, k, v, or a fused attn_qkv (phi3's; glm4's without its bias;
 * phi2's with it; either is accepted for them). */
static vki_status find_qkv(const gguf_file *f, const model_hparams *hp, uint32_t il, model_layer_tensors *L,
                           char *err, size_t n)
{
    const uint64_t d = hp->d_model, q = (uint64_t)hp->n_head * hp->head_dim, kv = (uint64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
    vki_status st;
    const bool phi2 = hp->arch == MODEL_ARCH_PHI2;
    if (hp->arch == MODEL_ARCH_PHI3 || hp->arch == MODEL_ARCH_GLM4 || phi2) {
        snprintf(name, sizeof name, "blk.%u.attn_qkv.weight", il);
        if ((st = find(f, name, d, q + 2 * kv, false, true, &L->wqkv, err, n)) != VKI_OK)
            return st;
        snprintf(name, sizeof name, "blk.%u.attn_qkv.bias", il);
        if (phi2 && L->wqkv && /* phi2's fused projection has its bias, [q | k | v] as the rows */
            (st = find(f, name, q + 2 * kv, 0, true, false, &L->bq, err, n)) != VKI_OK)
            return st;
        if (!(phi2 && L->wqkv) && gguf_find_tensor(f, name)) /* not run: refused, not ignored */
            return fail(VKI_ERR_UNSUPPORTED, err, n, "tensor %s: a fused Q|K|V bias is not supported (convert with "
                        "separate attn_q/k/v and their biases)", name);
    }
    if (il > 0 && !L->wqkv != !hp->fused_qkv)
        return fail(VKI_ERR_FORMAT, err, n, "layer %u: attn_qkv.weight %s, but layer 0 %s", il,
                    L->wqkv ? "present" : "absent", hp->fused_qkv ? "has it" : "has separate q/k/v");
    if (L->wqkv)
        return VKI_OK;
#define T(field, suffix, ne0, ne1, f32, opt)                                                       \
    snprintf(name, sizeof name, "blk.%u.%s", il, suffix);                                      \
    if ((st = find(f, name, ne0, ne1, f32, opt, &L->field, err, n)) != VKI_OK)                 \
        return st;
    T(wq, "attn_q.weight", d, q, false, false)
    T(wk, "attn_k.weight", d, kv, false, false)
    T(wv, "attn_v.weight", d, kv, false, false)
    T(bq, "attn_q.bias", q, 0, true, true)
    T(bk, "attn_k.bias", kv, 0, true, true)
    T(bv, "attn_v.bias", kv, 0, true, true)
#undef T
    if (hp->qkv_bias && !(L->bq && L->bk && L->bv))
        return fail(VKI_ERR_FORMAT, err, n, "layer %u: %s needs attn_q/k/v.bias", il, hp->arch_name);
    return VKI_OK;
}

/* A 3-D tensor of ggml shape [ne0, ne1, ne2] (the stacked experts), any supported type. */
static vki_status find3(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                        const gguf_tensor **out, char *err, size_t n)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    *out = t;
    if (!t)
        return fail(VKI_ERR_FORMAT, err, n, "missing tensor %s", name);
    if (t->n_dims != 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2)
        return fail(VKI_ERR_FORMAT, err, n, "tensor %s has shape [%llu, %llu, %llu] (%u dims), expected [%llu, %llu, "
                    "%llu]", name, (unsigned long long)t->ne[0], (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1),
                    (unsigned long long)(t->n_dims > 2 ? t->ne[2] : 1), t->n_dims, (unsigned long long)ne0,
                    (unsigned long long)ne1, (unsigned long long)ne2);
    return runnable(t, name, err, n);
}

/* The router and the stacked experts of a mixture-of-experts layer (llama.cpp's names). */
static vki_status find_experts(const gguf_file *f, const model_hparams *hp, uint32_t il, model_layer_tensors *L,
                               char *err, size_t n)
{
    const uint64_t d = hp->d_model, ff = hp->d_ff_exp, E = hp->n_expert;
    char name[96];
    vki_status st;
    snprintf(name, sizeof name, "blk.%u.ffn_gate_inp.weight", il);
    if ((st = find(f, name, d, E, false, false, &L->ffn_gate_inp, err, n)) != VKI_OK)
        return st;
    snprintf(name, sizeof name, "blk.%u.ffn_gate.0.weight", il);
    if (gguf_find_tensor(f, name))
        return fail(VKI_ERR_UNSUPPORTED, err, n, "%s: one tensor per expert is the old Mixtral layout; convert the "
                    "model again with a current llama.cpp (stacked ffn_*_exps)", name);
    snprintf(name, sizeof name, "blk.%u.ffn_gate_exps.weight", il);
    if ((st = find3(f, name, d, ff, E, &L->ffn_gate_exps, err, n)) != VKI_OK)
        return st;
    snprintf(name, sizeof name, "blk.%u.ffn_up_exps.weight", il);
    if ((st = find3(f, name, d, ff, E, &L->ffn_up_exps, err, n)) != VKI_OK)
        return st;
    snprintf(name, sizeof name, "blk.%u.ffn_down_exps.weight", il);
    if ((st = find3(f, name, ff, d, E, &L->ffn_down_exps, err, n)) != VKI_OK || !hp->expert_bias)
        return st;
#define B(field, suffix, ne0, ne1)                                                                 \
    snprintf(name, sizeof name, "blk.%u.%s", il, suffix);                                          \
    if ((st = find(f, name, ne0, ne1, true, false, &L->field, err, n)) != VKI_OK)                  \
        return st;
    B(ffn_gate_inp_b, "ffn_gate_inp.bias", E, 0)
    B(ffn_gate_exps_b, "ffn_gate_exps.bias", ff, E)
    B(ffn_up_exps_b, "ffn_up_exps.bias", ff, E)
    B(ffn_down_exps_b, "ffn_down_exps.bias", d, E)
#undef B
    return VKI_OK;
}

static vki_status find_layer(const gguf_file *f, const model_hparams *hp, uint32_t il, model_layer_tensors *L,
                             char *err, size_t n)
{
    const uint64_t d = hp->d_model, q = (uint64_t)hp->n_head * hp->head_dim;
    bool fused_ffn = hp->fused_gate_up, oss = hp->arch == MODEL_ARCH_GPT_OSS;
    char name[96];
    vki_status st = find_qkv(f, hp, il, L, err, n);
    if (st != VKI_OK)
        return st;
#define T(field, suffix, ne0, ne1, f32, opt)                                                       \
    snprintf(name, sizeof name, "blk.%u.%s", il, suffix);                                      \
    if ((st = find(f, name, ne0, ne1, f32, opt, &L->field, err, n)) != VKI_OK)                 \
        return st;
    const uint64_t kv = (uint64_t)hp->n_head_kv * hp->head_dim;
    if (!hp->no_pre_norms) {
        T(attn_norm, "attn_norm.weight", d, 0, true, false)
    }
    if (hp->norm_bias) {
        T(attn_norm_b, "attn_norm.bias", d, 0, true, false)
    }
    if (hp->layer_norm) { /* tensors nothing would run: refused, not ignored */
        static const char *const unrun[] = {"attn_norm.bias", "attn_q_norm.weight", "attn_k_norm.weight"};
        for (size_t i = hp->norm_bias; i < sizeof unrun / sizeof unrun[0]; i++) {
            snprintf(name, sizeof name, "blk.%u.%s", il, unrun[i]);
            if (gguf_find_tensor(f, name))
                return fail(VKI_ERR_UNSUPPORTED, err, n, "tensor %s: %s is not supported", name,
                            i ? "a per-head Q/K LayerNorm (Command R+'s use_qk_norm, StableLM 2 12B's)"
                              : "a LayerNorm bias");
        }
    }
    T(q_norm, "attn_q_norm.weight", hp->qk_norm_full ? q : hp->head_dim, 0, true, !hp->qk_norm)
    T(k_norm, "attn_k_norm.weight", hp->qk_norm_full ? kv : hp->head_dim, 0, true, !hp->qk_norm)
    T(wo, "attn_output.weight", q, d, false, false)
    /* required: gpt-oss, starcoder2, phi2 (their FFN biases too: with a gate none are run) */
    const bool biased = hp->arch == MODEL_ARCH_STARCODER2 || hp->arch == MODEL_ARCH_PHI2;
    T(bo, "attn_output.bias", d, 0, true, !oss && !biased)
    T(attn_sinks, "attn_sinks.weight", hp->n_head, 0, true, !oss)
    /* gpt-oss names its FFN input norm post_attention_norm (it has no post-norms) */
    if (!oss) {
        T(post_attn_norm, "post_attention_norm.weight", d, 0, true, !hp->post_norms)
    }
    if (!hp->no_pre_norms && !hp->parallel_ffn) {
        T(ffn_norm, oss ? "post_attention_norm.weight" : "ffn_norm.weight", d, 0, true, false)
    }
    if (hp->norm_bias && !hp->parallel_ffn) {
        T(ffn_norm_b, "ffn_norm.bias", d, 0, true, false)
    }
    if (hp->n_expert && (st = find_experts(f, hp, il, L, err, n)) != VKI_OK)
        return st;
    /* a shared expert's tensors nothing would run: refused, not ignored (a sigmoid-gated one,
     * qwen2moe's ffn_gate_inp_shexp, is not supported either) */
    static const char *const shexp[] = {"ffn_gate_shexp.weight", "ffn_gate_inp_shexp.weight"};
    for (size_t i = hp->shared_expert; i < sizeof shexp / sizeof shexp[0]; i++) {
        snprintf(name, sizeof name, "blk.%u.%s", il, shexp[i]);
        if (gguf_find_tensor(f, name))
            return fail(VKI_ERR_UNSUPPORTED, err, n, "tensor %s: %s", name, i ? "a gated shared expert is not "
                        "supported" : "a shared expert without <arch>.expert_shared_feed_forward_length (granitemoe)");
    }
    if (hp->shared_expert) {
        T(w_gate, "ffn_gate_shexp.weight", d, hp->d_ff, false, false)
        T(w_up, "ffn_up_shexp.weight", d, hp->d_ff, false, false)
        T(w_down, "ffn_down_shexp.weight", hp->d_ff, d, false, false)
    }
    if (hp->n_expert)
        return VKI_OK;
    T(w_gate, "ffn_gate.weight", d, hp->d_ff, false, fused_ffn || hp->ffn_plain)
    T(w_up, "ffn_up.weight", d, fused_ffn ? 2ull * hp->d_ff : hp->d_ff, false, false)
    T(w_down, "ffn_down.weight", hp->d_ff, d, false, false)
    T(post_ffn_norm, "post_ffw_norm.weight", d, 0, true, !hp->post_norms)
    if (hp->ffn_plain) {
        T(ffn_up_b, "ffn_up.bias", hp->d_ff, 0, true, !biased)
        T(ffn_down_b, "ffn_down.bias", d, 0, true, !biased)
    }
#undef T
    if (fused_ffn && L->w_gate)
        return fail(VKI_ERR_FORMAT, err, n, "layer %u: ffn_gate.weight next to a fused [gate | up] ffn_up.weight", il);
    if (hp->ffn_plain && L->w_gate)
        return fail(VKI_ERR_UNSUPPORTED, err, n, "layer %u: ffn_gate.weight: %s's FFN has no gate", il, hp->arch_name);
    static const char *const ffn_biases[] = {"ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"};
    for (size_t i = 0; !hp->ffn_plain && i < sizeof ffn_biases / sizeof ffn_biases[0]; i++) { /* not run: refused */
        snprintf(name, sizeof name, "blk.%u.%s", il, ffn_biases[i]);
        if (gguf_find_tensor(f, name))
            return fail(VKI_ERR_UNSUPPORTED, err, n, "tensor %s: FFN biases are not supported", name);
    }
    return VKI_OK;
}

/* phi3 and glm4 store gate | up in ffn_up (2 d_ff rows) and have no ffn_gate; separate ones are
 * read too. */
static void detect_fusions(const gguf_file *f, model_hparams *hp)
{
    if (hp->arch != MODEL_ARCH_PHI3 && hp->arch != MODEL_ARCH_GLM4 && hp->arch != MODEL_ARCH_PHI2)
        return;
    hp->fused_qkv = gguf_find_tensor(f, "blk.0.attn_qkv.weight") != NULL;
    hp->fused_gate_up = hp->arch != MODEL_ARCH_PHI2 && gguf_find_tensor(f, "blk.0.ffn_gate.weight") == NULL;
}

const gguf_tensor *model_rope_factors(const model_hparams *hp, const model_tensors *t, uint32_t n_ctx)
{
    if (t->rope_freqs)
        return t->rope_freqs;
    return n_ctx > hp->n_ctx_orig ? t->rope_long : t->rope_short;
}

vki_status model_find_tensors(const gguf_file *f, model_hparams *hp, model_tensors *t, char *err, size_t n)
{
    memset(t, 0, sizeof *t);
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return fail(VKI_ERR_FORMAT, err, n, "missing 2-D tensor token_embd.weight");
    if (emb->ne[1] == 0 || emb->ne[1] > (1u << 24))
        return fail(VKI_ERR_FORMAT, err, n, "token_embd.weight: vocab %llu out of range",
                    (unsigned long long)emb->ne[1]);
    hp->n_vocab = (uint32_t)emb->ne[1];
    hp->qkv_bias = hp->arch == MODEL_ARCH_QWEN2 || hp->arch == MODEL_ARCH_GPT_OSS || hp->arch == MODEL_ARCH_STARCODER2 ||
                   hp->arch == MODEL_ARCH_PHI2;
    detect_fusions(f, hp);
    vki_status st;
    if ((st = find(f, "token_embd.weight", hp->d_model, hp->n_vocab, false, false, &t->tok_embd, err, n)) ||
        (st = find(f, "output_norm.weight", hp->d_model, 0, true, false, &t->output_norm, err, n)) ||
        (st = find(f, "output_norm.bias", hp->d_model, 0, true, !hp->norm_bias, &t->output_norm_b, err, n)) ||
        (t->output_norm_b && !hp->norm_bias &&
         (st = fail(VKI_ERR_UNSUPPORTED, err, n, "tensor output_norm.bias: a norm bias is not supported"))) ||
        (st = find(f, "output.weight", hp->d_model, hp->n_vocab, false, true, &t->output, err, n)) ||
        (st = find(f, "output.bias", hp->n_vocab, 0, true, hp->arch != MODEL_ARCH_PHI2, &t->output_b, err, n)) ||
        (t->output_b && hp->arch != MODEL_ARCH_PHI2 &&
         (st = fail(VKI_ERR_UNSUPPORTED, err, n, "tensor output.bias: an LM head bias is not supported"))) ||
        (st = find(f, "rope_freqs.weight", hp->n_rot / 2, 0, true, true, &t->rope_freqs, err, n)) ||
        (st = find(f, "rope_factors_long.weight", hp->n_rot / 2, 0, true, true, &t->rope_long, err, n)) ||
        (st = find(f, "rope_factors_short.weight", hp->n_rot / 2, 0, true, true, &t->rope_short, err, n)))
        return st;
    if (!t->rope_long != !t->rope_short)
        return fail(VKI_ERR_FORMAT, err, n, "rope_factors_%s.weight without rope_factors_%s.weight",
                    t->rope_long ? "long" : "short", t->rope_long ? "short" : "long");
    if (hp->longrope && !t->rope_long)
        return fail(VKI_ERR_FORMAT, err, n, "%s.rope.scaling.type is longrope but rope_factors_long/short.weight are "
                    "missing", hp->arch_name);
    hp->tied_embeddings = t->output == NULL;
    if (!t->output)
        t->output = t->tok_embd;
    t->layers = calloc(hp->n_layer, sizeof *t->layers);
    if (!t->layers)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        if ((st = find_layer(f, hp, il, &t->layers[il], err, n)) != VKI_OK) {
            model_tensors_free(t);
            return st;
        }
    }
    return VKI_OK;
}

void model_tensors_free(model_tensors *t)
{
    free(t->layers);
    t->layers = NULL;
}
