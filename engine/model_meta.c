#include "engine/model_meta.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"

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
    if (st == VKI_OK && !gguf_str_eq(kind, "none") && !gguf_str_eq(kind, "linear"))
        return fail(VKI_ERR_UNSUPPORTED, err, n, "rope scaling type '%.*s' is not supported (none, linear)",
                    (int)(kind.len > 32 ? 32 : kind.len), kind.ptr);
    float factor = 1.0f;
    if (st == VKI_OK && gguf_str_eq(kind, "linear")) {
        if ((st = get_f32(f, hp, "rope.scaling.factor", &factor, err, n)) != VKI_OK)
            return st;
        if (factor < 1.0f)
            return fail(VKI_ERR_FORMAT, err, n, "rope.scaling.factor %g must be >= 1", factor);
    }
    hp->rope_freq_scale = 1.0f / factor;
    hp->n_rot = hp->head_dim;
    if ((st = get_u32(f, hp, "rope.dimension_count", false, &hp->n_rot, err, n)) != VKI_OK)
        return st;
    if (hp->n_rot == 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return fail(VKI_ERR_FORMAT, err, n, "rope.dimension_count %u must be even and in (0, head_dim %u]",
                    hp->n_rot, hp->head_dim);
    return VKI_OK;
}

vki_status model_read_hparams(const gguf_file *f, model_hparams *hp, char *err, size_t n)
{
    memset(hp, 0, sizeof *hp);
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch) != VKI_OK)
        return fail(VKI_ERR_FORMAT, err, n, "missing metadata key general.architecture");
    if (gguf_str_eq(arch, "llama")) {
        hp->arch = MODEL_ARCH_LLAMA;
        hp->rms_eps = 1e-5f;
    } else if (gguf_str_eq(arch, "qwen2")) {
        hp->arch = MODEL_ARCH_QWEN2;
        hp->rope_neox = true;
        hp->rms_eps = 1e-6f;
    } else {
        return fail(VKI_ERR_UNSUPPORTED, err, n, "architecture '%.*s' is not supported (llama, qwen2)",
                    (int)(arch.len > 32 ? 32 : arch.len), arch.ptr);
    }
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
        (st = get_f32(f, hp, "attention.layer_norm_rms_epsilon", &hp->rms_eps, err, n)))
        return st;
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
    return read_rope(f, hp, err, n);
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
    if (!quant_get(t->type))
        return fail(VKI_ERR_UNSUPPORTED, err, n, "tensor %s: weight type %s (id %u) is not supported; vkinfer runs %s",
                    name, quant_type_name(t->type), t->type, quant_supported_list());
    return VKI_OK;
}

static vki_status find_layer(const gguf_file *f, const model_hparams *hp, uint32_t il, model_layer_tensors *L,
                             char *err, size_t n)
{
    const uint64_t d = hp->d_model, q = (uint64_t)hp->n_head * hp->head_dim, kv = (uint64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
    vki_status st;
#define T(field, suffix, ne0, ne1, f32, opt)                                                       \
    snprintf(name, sizeof name, "blk.%u.%s", il, suffix);                                      \
    if ((st = find(f, name, ne0, ne1, f32, opt, &L->field, err, n)) != VKI_OK)                 \
        return st;
    T(attn_norm, "attn_norm.weight", d, 0, true, false)
    T(wq, "attn_q.weight", d, q, false, false)
    T(wk, "attn_k.weight", d, kv, false, false)
    T(wv, "attn_v.weight", d, kv, false, false)
    T(wo, "attn_output.weight", q, d, false, false)
    T(bq, "attn_q.bias", q, 0, true, true)
    T(bk, "attn_k.bias", kv, 0, true, true)
    T(bv, "attn_v.bias", kv, 0, true, true)
    T(ffn_norm, "ffn_norm.weight", d, 0, true, false)
    T(w_gate, "ffn_gate.weight", d, hp->d_ff, false, false)
    T(w_up, "ffn_up.weight", d, hp->d_ff, false, false)
    T(w_down, "ffn_down.weight", hp->d_ff, d, false, false)
#undef T
    if (hp->qkv_bias && !(L->bq && L->bk && L->bv))
        return fail(VKI_ERR_FORMAT, err, n, "layer %u: qwen2 needs attn_q/k/v.bias", il);
    return VKI_OK;
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
    hp->qkv_bias = hp->arch == MODEL_ARCH_QWEN2;
    vki_status st;
    if ((st = find(f, "token_embd.weight", hp->d_model, hp->n_vocab, false, false, &t->tok_embd, err, n)) ||
        (st = find(f, "output_norm.weight", hp->d_model, 0, true, false, &t->output_norm, err, n)) ||
        (st = find(f, "output.weight", hp->d_model, hp->n_vocab, false, true, &t->output, err, n)) ||
        (st = find(f, "rope_freqs.weight", hp->n_rot / 2, 0, true, true, &t->rope_freqs, err, n)))
        return st;
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
