#include "support/ref_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"
#include "shaders/vki_shared.h"
#include "support/vt.h"

typedef struct ref_layer {
    float *attn_norm;           /* [d] */
    float *wq, *wk, *wv, *wo;   /* [q_dim][d], [kv_dim][d], [kv_dim][d], [d][q_dim] (row = output;
                                   phi3's fused attn_qkv is cut into these) */
    float *bq, *bk, *bv;        /* [q_dim], [kv_dim], [kv_dim] or NULL */
    float *q_norm, *k_norm;     /* [hd] or NULL */
    float *post_attn_norm;      /* [d] or NULL */
    float *ffn_norm;            /* [d] */
    float *w_gate, *w_up;       /* [d_ff][d] (phi3's fused ffn_up is cut into these) */
    float *w_down;              /* [d][d_ff] */
    float *post_ffn_norm;       /* [d] or NULL */
    float *router;              /* [n_expert][d] or NULL (dense) */
    float *gate_exps, *up_exps; /* [n_expert * d_ff_exp][d]: expert e's rows from e * d_ff_exp */
    float *down_exps;           /* [n_expert * d][d_ff_exp] */
    float *bo, *sinks;          /* [d] output bias, [n_head] sink logits (gpt-oss) or NULL */
    float *router_b;            /* [n_expert] router bias (gpt-oss) or NULL */
    float *gate_exps_b, *up_exps_b, *down_exps_b; /* [n_expert][d_ff_exp], [..][d_ff_exp], [..][d] or NULL */
    float *attn_norm_b, *ffn_norm_b; /* [d] LayerNorm biases (starcoder2) or NULL */
    float *b_up, *b_down;       /* [d_ff], [d] FFN biases (starcoder2) or NULL */
} ref_layer;

#define REF_LAYER_ARRAYS 30

struct ref_model {
    model_hparams hp;
    ref_model_opts o;
    uint32_t window[2], sink[2]; /* per layer kind, after the engine's cap */
    float *tok_embd;            /* [n_vocab][d] */
    float *output_norm;         /* [d] */
    float *output_norm_b;       /* [d] or NULL */
    float *output_b;            /* [n_vocab] (phi2) or NULL */
    float *output;              /* [n_vocab][d] (aliases tok_embd when tied) */
    float *rope_factors;        /* [n_rot/2] or NULL */
    ref_layer *layers;          /* [n_layer] */
    double route_margin;        /* smallest k-th chosen minus best unchosen router logit of the
                                   last ref_model_forward (INFINITY: dense, or every expert used) */
};

static void layer_arrays(ref_layer *R, float **all[REF_LAYER_ARRAYS])
{
    float **a[REF_LAYER_ARRAYS] = {&R->attn_norm, &R->wq, &R->wk, &R->wv, &R->wo, &R->bq, &R->bk, &R->bv,
                                   &R->q_norm, &R->k_norm, &R->post_attn_norm, &R->ffn_norm, &R->w_gate,
                                   &R->w_up, &R->w_down, &R->post_ffn_norm, &R->router, &R->gate_exps,
                                   &R->up_exps, &R->down_exps, &R->bo, &R->sinks, &R->router_b,
                                   &R->gate_exps_b, &R->up_exps_b, &R->down_exps_b, &R->attn_norm_b,
                                   &R->ffn_norm_b, &R->b_up, &R->b_down};
    memcpy(all, a, sizeof a);
}

/* Rows [r0, r0 + n) of a tensor, dequantised to f32 (NULL when t is NULL). */
static float *dequant_rows(const gguf_tensor *t, uint64_t r0, uint64_t n)
{
    if (!t)
        return NULL;
    float *y = malloc((n ? n : 1) * t->ne[0] * sizeof *y);
    if (!y)
        return NULL;
    size_t rb = quant_row_bytes(t->type, t->ne[0]);
    for (uint64_t r = 0; r < n; r++)
        dequant_row(t->type, t->data + (r0 + r) * rb, y + r * t->ne[0], t->ne[0]);
    return y;
}

static float *dequant_tensor(const gguf_tensor *t)
{
    uint64_t rows = 1;
    for (uint32_t i = 1; t && i < t->n_dims; i++)
        rows *= t->ne[i];
    return dequant_rows(t, 0, rows);
}

static bool load_layer(const model_hparams *hp, const model_layer_tensors *L, ref_layer *R)
{
    uint64_t q = (uint64_t)hp->n_head * hp->head_dim, kv = (uint64_t)hp->n_head_kv * hp->head_dim;
    if (L->wqkv) { /* q | k | v rows */
        R->wq = dequant_rows(L->wqkv, 0, q);
        R->wk = dequant_rows(L->wqkv, q, kv);
        R->wv = dequant_rows(L->wqkv, q + kv, kv);
        float *b = dequant_tensor(L->bq); /* phi2: [q | k | v] */
        if (b) {
            R->bq = malloc(q * sizeof(float)), R->bk = malloc(kv * sizeof(float)), R->bv = malloc(kv * sizeof(float));
            if (R->bq && R->bk && R->bv) {
                memcpy(R->bq, b, q * sizeof(float));
                memcpy(R->bk, b + q, kv * sizeof(float));
                memcpy(R->bv, b + q + kv, kv * sizeof(float));
            }
            free(b);
        }
    } else {
        R->wq = dequant_tensor(L->wq), R->wk = dequant_tensor(L->wk), R->wv = dequant_tensor(L->wv);
    }
    if (!L->w_gate && !hp->ffn_plain) { /* gate | up rows */
        R->w_gate = dequant_rows(L->w_up, 0, hp->d_ff);
        R->w_up = dequant_rows(L->w_up, hp->d_ff, hp->d_ff);
    } else {
        R->w_gate = dequant_tensor(L->w_gate), R->w_up = dequant_tensor(L->w_up);
    }
    R->attn_norm = dequant_tensor(L->attn_norm);
    R->wo = dequant_tensor(L->wo);
    if (!L->wqkv)
        R->bq = dequant_tensor(L->bq), R->bk = dequant_tensor(L->bk), R->bv = dequant_tensor(L->bv);
    R->q_norm = dequant_tensor(L->q_norm), R->k_norm = dequant_tensor(L->k_norm);
    R->post_attn_norm = dequant_tensor(L->post_attn_norm);
    R->ffn_norm = dequant_tensor(L->ffn_norm);
    R->w_down = dequant_tensor(L->w_down);
    R->post_ffn_norm = dequant_tensor(L->post_ffn_norm);
    R->router = dequant_tensor(L->ffn_gate_inp);
    R->gate_exps = dequant_tensor(L->ffn_gate_exps), R->up_exps = dequant_tensor(L->ffn_up_exps);
    R->down_exps = dequant_tensor(L->ffn_down_exps);
    R->bo = dequant_tensor(L->bo), R->sinks = dequant_tensor(L->attn_sinks);
    R->router_b = dequant_tensor(L->ffn_gate_inp_b);
    R->gate_exps_b = dequant_tensor(L->ffn_gate_exps_b), R->up_exps_b = dequant_tensor(L->ffn_up_exps_b);
    R->down_exps_b = dequant_tensor(L->ffn_down_exps_b);
    R->attn_norm_b = dequant_tensor(L->attn_norm_b), R->ffn_norm_b = dequant_tensor(L->ffn_norm_b);
    R->b_up = dequant_tensor(L->ffn_up_b), R->b_down = dequant_tensor(L->ffn_down_b);
    if ((L->attn_norm_b && !R->attn_norm_b) || (L->ffn_norm_b && !R->ffn_norm_b) || (L->ffn_up_b && !R->b_up) ||
        (L->ffn_down_b && !R->b_down))
        return false;
    if ((L->bo && !R->bo) || (L->attn_sinks && !R->sinks) || (L->ffn_gate_inp_b && !R->router_b) ||
        (L->ffn_gate_exps_b && !R->gate_exps_b) || (L->ffn_up_exps_b && !R->up_exps_b) ||
        (L->ffn_down_exps_b && !R->down_exps_b))
        return false;
    bool dense = (R->w_gate || hp->ffn_plain) && R->w_up && R->w_down;
    bool ffn = hp->n_expert ? R->router && R->gate_exps && R->up_exps && R->down_exps && (!L->w_down || dense)
                            : dense;
    bool pre = hp->no_pre_norms || (R->attn_norm && (R->ffn_norm || hp->parallel_ffn));
    return pre && R->wq && R->wk && R->wv && R->wo && ffn && (!L->q_norm || R->q_norm) &&
           (!L->post_attn_norm || R->post_attn_norm);
}

/* The engine's windows: the model's, capped by max_window with the first page as the sink. */
static void set_windows(ref_model *m)
{
    for (uint32_t k = 0; k < 2; k++) {
        uint32_t w = m->hp.kind[k].window, cap = m->o.max_window;
        m->window[k] = w, m->sink[k] = 0;
        if (cap && (!w || w > cap))
            m->window[k] = cap, m->sink[k] = m->o.page_size;
    }
}

vki_status ref_model_load(const char *path, const ref_model_opts *o, ref_model **out, char *err, size_t n)
{
    *out = NULL;
    gguf_file *f = NULL;
    vki_status st = gguf_open(path, &f, err, n);
    if (st != VKI_OK)
        return st;
    ref_model *m = calloc(1, sizeof *m);
    model_tensors t = {0};
    if (!m) {
        gguf_close(f);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    m->o = *o;
    st = model_read_hparams(f, &m->hp, err, n);
    if (st == VKI_OK)
        st = model_find_tensors(f, &m->hp, &t, err, n);
    if (st == VKI_OK) {
        set_windows(m);
        m->layers = calloc(m->hp.n_layer, sizeof *m->layers);
        m->tok_embd = dequant_tensor(t.tok_embd);
        m->output_norm = dequant_tensor(t.output_norm);
        m->output_norm_b = dequant_tensor(t.output_norm_b);
        m->output_b = dequant_tensor(t.output_b);
        m->output = m->hp.tied_embeddings ? m->tok_embd : dequant_tensor(t.output);
        m->rope_factors = dequant_tensor(model_rope_factors(&m->hp, &t, o->n_ctx ? o->n_ctx : m->hp.n_ctx_train));
        for (uint32_t il = 0; m->layers && il < m->hp.n_layer; il++)
            if (!load_layer(&m->hp, &t.layers[il], &m->layers[il]))
                st = VKI_ERR_OUT_OF_HOST_MEMORY;
        if (!m->layers || !m->tok_embd || !m->output_norm || !m->output)
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    model_tensors_free(&t);
    gguf_close(f);
    if (st != VKI_OK) {
        ref_model_free(m);
        return st;
    }
    *out = m;
    return VKI_OK;
}

void ref_model_free(ref_model *m)
{
    if (!m)
        return;
    for (uint32_t il = 0; m->layers && il < m->hp.n_layer; il++) {
        float **all[REF_LAYER_ARRAYS];
        layer_arrays(&m->layers[il], all);
        for (size_t i = 0; i < REF_LAYER_ARRAYS; i++)
            free(*all[i]);
    }
    free(m->layers);
    if (m->output != m->tok_embd)
        free(m->output);
    free(m->tok_embd);
    free(m->output_norm);
    free(m->output_norm_b);
    free(m->output_b);
    free(m->rope_factors);
    free(m);
}

const model_hparams *ref_model_hparams(const ref_model *m) { return &m->hp; }

double ref_model_route_margin(const ref_model *m) { return m->route_margin; }

static void rmsnorm(float *y, const float *x, const float *w, uint32_t d, float eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < d; i++)
        ss += (double)x[i] * x[i];
    double s = 1.0 / sqrt(ss / d + eps);
    for (uint32_t i = 0; i < d; i++)
        y[i] = (float)(x[i] * s) * w[i];
}

/* command-r's LayerNorm (ggml_norm, then the weight; starcoder2: + b) */
static void layernorm_b(float *y, const float *x, const float *w, const float *b, uint32_t d, float eps)
{
    double mean = 0, ss = 0;
    for (uint32_t i = 0; i < d; i++)
        mean += x[i];
    mean /= d;
    for (uint32_t i = 0; i < d; i++)
        ss += (x[i] - mean) * (x[i] - mean);
    double s = 1.0 / sqrt(ss / d + eps);
    for (uint32_t i = 0; i < d; i++)
        y[i] = (float)((x[i] - mean) * s) * w[i] + (b ? b[i] : 0.0f);
}

/* The residual stream's norm: RMSNorm, or command-r's LayerNorm (with starcoder2's bias b). */
static void stream_norm(const model_hparams *hp, float *y, const float *x, const float *w, const float *b)
{
    if (hp->layer_norm)
        layernorm_b(y, x, w, b, hp->d_model, hp->rms_eps);
    else
        rmsnorm(y, x, w, hp->d_model, hp->rms_eps);
}

/* y[o] = sum_i W[o][i] x[i] (+ b[o]). Not instrumented by the sanitizer builds: the test's own
 * arithmetic (a wrong index shows as a wrong answer), and with a check per load it was a quarter
 * of test_engine's time there. */
#if defined(__GNUC__)
__attribute__((no_sanitize("address", "undefined", "thread")))
#endif
static void matvec(float *y, const float *W, const float *x, const float *b, uint32_t n_out, uint32_t n_in)
{
    for (uint32_t o = 0; o < n_out; o++) {
        double acc = b ? b[o] : 0.0;
        const float *w = W + (size_t)o * n_in;
        for (uint32_t i = 0; i < n_in; i++)
            acc += (double)w[i] * x[i];
        y[o] = (float)acc;
    }
}

/* YaRN as Hugging Face's _compute_yarn_parameters writes it (a blend of inverse frequencies, the
 * engine's op_rope_freqs follows ggml's blend of angles): the extrapolated inv_freq weighted by
 * 1 - ramp over the pairs, ramp linear from the pair turning beta_fast times over the original
 * context (floored) to the one turning beta_slow times (ceiled), both clamped to [0, n_rot - 1],
 * times the file's ext_factor (HF: always 1). */
static double yarn_inv_freq(const model_hparams *hp, double base, double scale, uint32_t i)
{
    const double two_pi = 2.0 * 3.14159265358979323846, d = hp->n_rot;
    double lo = floor(d * log(hp->n_ctx_orig / (hp->yarn_beta_fast * two_pi)) / (2.0 * log(base)));
    double hi = ceil(d * log(hp->n_ctx_orig / (hp->yarn_beta_slow * two_pi)) / (2.0 * log(base)));
    lo = lo < 0 ? 0 : lo, hi = hi > d - 1 ? d - 1 : hi;
    if (hi == lo)
        hi += 0.001;
    double ramp = (i - lo) / (hi - lo), extrap = 1.0 / pow(base, 2.0 * i / d);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    double w = (1.0 - ramp) * hp->yarn_ext_factor; /* inv_freq_extrapolation_factor */
    return extrap * scale * (1.0 - w) + extrap * w;
}

/* ggml's rope: theta_i = pos * freq_scale * base^(-2i/n_rot) / factor_i (YaRN: yarn_inv_freq), cos
 * and sin times the attention factor (mscale). */
static void rope(const ref_model *m, uint32_t kind, float *v, uint32_t n_heads, uint32_t pos)
{
    const model_hparams *hp = &m->hp;
    uint32_t hd = hp->head_dim, half = hp->n_rot / 2;
    double base = hp->kind[kind].rope_base, scale = hp->kind[kind].rope_freq_scale, ms = hp->rope_attn_factor;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (uint32_t i = 0; i < half; i++) {
            double theta = hp->yarn ? pos * yarn_inv_freq(hp, base, scale, i)
                                    : pos * scale * pow(base, -2.0 * i / hp->n_rot);
            if (m->rope_factors)
                theta /= m->rope_factors[i];
            double c = cos(theta) * ms, s = sin(theta) * ms;
            uint32_t a = hp->rope_neox ? i : 2 * i, b = hp->rope_neox ? i + half : 2 * i + 1;
            double x0 = x[a], x1 = x[b];
            x[a] = (float)(x0 * c - x1 * s);
            x[b] = (float)(x0 * s + x1 * c);
        }
    }
}

/* A K or V row as the device's pool holds it: f16-rounded, or Q8_0 blocks (within each head). */
static void kv_round(const ref_model *m, float *dst, const float *x, uint32_t n)
{
    memcpy(dst, x, n * sizeof *x);
    for (uint32_t i = 0; m->o.kv_type == VKI_GGML_F16 && i < n; i++)
        dst[i] = quant_f16_to_f32(quant_f32_to_f16(x[i]));
    for (uint32_t b = 0; m->o.kv_type == VKI_GGML_Q8_0 && b < n / 32; b++) {
        int8_t q[32];
        float d = quant_f16_to_f32(vt_q8_0_block(x + 32 * b, q));
        for (int i = 0; i < 32; i++)
            dst[32 * b + i] = q[i] * d;
    }
}

typedef struct ref_scratch {
    float *x, *xb, *q, *k, *v, *att_out, *o, *g, *u, *scores;
    float *kc, *vc; /* [n_layer][n][kv_dim] */
    double *p;      /* [n]: one head's exp(score - max), computed once for all its head dims */
    const float *kv_in; /* ref_model_forward_kv's given K/V, or NULL */
    float *kv_out;      /* its K/V as computed, or NULL */
} ref_scratch;

/* Attention of one token at `pos` (its K/V already cached) for all heads, over the keys its
 * layer kind sees: j <= pos within the window, or in the sink; with sink logits (gpt-oss) each
 * head's joins its softmax's denominator. */
static void attend(const ref_model *m, ref_scratch *s, uint32_t il, uint32_t pos, uint32_t n)
{
    const float *sinks = m->layers[il].sinks;
    const model_hparams *hp = &m->hp;
    uint32_t hd = hp->head_dim, kv_dim = hp->n_head_kv * hd, group = hp->n_head / hp->n_head_kv;
    uint32_t kind = model_layer_kind(hp, il), w = m->window[kind], sink = m->sink[kind];
    const float *kc = s->kc + (size_t)il * n * kv_dim, *vc = s->vc + (size_t)il * n * kv_dim;
    double scale = hp->attn_scale; /* the rope attention factor is in q and k already */
    double cap = hp->attn_softcap;
    if (hp->attn_temp_len) /* mistral3: llama.cpp's llm_graph_input_attn_temp, q times it */
        scale *= log(floor((double)pos / hp->attn_temp_len) + 1.0) * hp->attn_temp_scale + 1.0;
    for (uint32_t h = 0; h < hp->n_head; h++) {
        const float *q = s->q + (size_t)h * hd;
        uint32_t kvh = h / group;
        double mx = sinks ? sinks[h] : -INFINITY, sum = 0;
        for (uint32_t j = 0; j <= pos; j++) {
            double dot = 0;
            for (uint32_t i = 0; i < hd; i++)
                dot += (double)q[i] * kc[(size_t)j * kv_dim + kvh * hd + i];
            double sc = dot * scale;
            if (cap > 0)
                sc = cap * tanh(sc / cap);
            bool seen = !w || pos - j < w || j < sink;
            s->scores[j] = seen ? (float)sc : -INFINITY;
            if (s->scores[j] > mx)
                mx = s->scores[j];
        }
        if (sinks) /* the sink's share, no value */
            sum += exp(sinks[h] - mx);
        for (uint32_t j = 0; j <= pos; j++) {
            s->p[j] = exp(s->scores[j] - mx);
            sum += s->p[j];
        }
        for (uint32_t i = 0; i < hd; i++) {
            double acc = 0;
            for (uint32_t j = 0; j <= pos; j++)
                acc += s->p[j] / sum * vc[(size_t)j * kv_dim + kvh * hd + i];
            s->att_out[(size_t)h * hd + i] = (float)acc;
        }
    }
}

static void attention_block(const ref_model *m, ref_scratch *s, uint32_t il, uint32_t pos, uint32_t n)
{
    const model_hparams *hp = &m->hp;
    const ref_layer *L = &m->layers[il];
    uint32_t d = hp->d_model, hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    uint32_t kind = model_layer_kind(hp, il);
    if (L->attn_norm)
        stream_norm(hp, s->xb, s->x, L->attn_norm, L->attn_norm_b);
    else /* olmo2: no norm before the block */
        memcpy(s->xb, s->x, d * sizeof(float));
    matvec(s->q, L->wq, s->xb, L->bq, q_dim, d);
    matvec(s->k, L->wk, s->xb, L->bk, kv_dim, d);
    matvec(s->v, L->wv, s->xb, L->bv, kv_dim, d);
    if (hp->qk_norm_full) { /* olmo2: over the whole rows */
        rmsnorm(s->q, s->q, L->q_norm, q_dim, hp->rms_eps);
        rmsnorm(s->k, s->k, L->k_norm, kv_dim, hp->rms_eps);
    }
    for (uint32_t h = 0; !hp->qk_norm_full && L->q_norm && h < hp->n_head; h++)
        rmsnorm(s->q + h * hd, s->q + h * hd, L->q_norm, hd, hp->rms_eps);
    for (uint32_t h = 0; !hp->qk_norm_full && L->k_norm && h < hp->n_head_kv; h++)
        rmsnorm(s->k + h * hd, s->k + h * hd, L->k_norm, hd, hp->rms_eps);
    if (model_layer_rope(hp, il)) { /* smollm3's NoPE layers: none */
        rope(m, kind, s->q, hp->n_head, pos);
        rope(m, kind, s->k, hp->n_head_kv, pos);
    }
    size_t at = ((size_t)pos * hp->n_layer + il) * 2 * kv_dim; /* in kv_in / kv_out */
    if (s->kv_out) {
        memcpy(s->kv_out + at, s->k, kv_dim * sizeof(float));
        memcpy(s->kv_out + at + kv_dim, s->v, kv_dim * sizeof(float));
    }
    float *kc = s->kc + ((size_t)il * n + pos) * kv_dim, *vc = s->vc + ((size_t)il * n + pos) * kv_dim;
    if (s->kv_in) {
        memcpy(kc, s->kv_in + at, kv_dim * sizeof(float));
        memcpy(vc, s->kv_in + at + kv_dim, kv_dim * sizeof(float));
    } else {
        kv_round(m, kc, s->k, kv_dim);
        kv_round(m, vc, s->v, kv_dim);
    }
    attend(m, s, il, pos, n);
    matvec(s->o, L->wo, s->att_out, L->bo, d, q_dim);
    if (L->post_attn_norm)
        rmsnorm(s->o, s->o, L->post_attn_norm, d, hp->rms_eps);
    for (uint32_t i = 0; i < d; i++)
        s->x[i] += hp->resid_scale * s->o[i]; /* granite's residual_scale (1 elsewhere) */
}

static double act(const model_hparams *hp, double v)
{
    if (hp->ffn_relu2) /* nemotron, arcee: ggml_relu then ggml_sqr */
        return v > 0 ? v * v : 0.0;
    if (hp->ffn_gelu) /* tanh-approximate GELU, as ggml_gelu */
        return 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    return v / (1.0 + exp(-v));
}

/* The experts' gated unit: SwiGLU, or gpt-oss's swiglu_oai (ggml's: the gate capped at 7, up
 * clamped to [-7, 7] and shifted by one). */
static float expert_glu(const model_hparams *hp, double g, double u)
{
    if (hp->expert_act != VKI_GLU_SWIGLU_OAI)
        return (float)act(hp, g) * (float)u;
    double x = fmin(g, VKI_GLU_OAI_LIMIT), y = fmax(-VKI_GLU_OAI_LIMIT, fmin(u, VKI_GLU_OAI_LIMIT));
    return (float)(x / (1.0 + exp(-VKI_GLU_OAI_ALPHA * x)) * (y + 1.0));
}

/* The n_used largest of logits[0..n) (ties: lower index first) into ids, and their softmax
 * weights over all n, renormalised over the chosen ones when norm (llama.cpp's build_moe_ffn). */
void ref_moe_route(const float *logits, uint32_t n, uint32_t n_used, bool norm, int32_t *ids, float *w)
{
    for (uint32_t j = 0; j < n_used; j++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < n; e++) {
            bool taken = false;
            for (uint32_t i = 0; i < j && !taken; i++)
                taken = ids[i] == (int32_t)e;
            if (!taken && (best < 0 || logits[e] > logits[best]))
                best = (int32_t)e;
        }
        ids[j] = best;
    }
    double mx = logits[ids[0]], all = 0, sel = 0;
    for (uint32_t e = 0; e < n; e++)
        all += exp((double)logits[e] - mx);
    for (uint32_t j = 0; j < n_used; j++)
        sel += exp((double)logits[ids[j]] - mx);
    for (uint32_t j = 0; j < n_used; j++)
        w[j] = (float)(exp((double)logits[ids[j]] - mx) / (norm ? sel : all));
}

/* The mixture-of-experts FFN of xb into o: the chosen experts' SwiGLU outputs, weighted. */
static void moe_ffn(ref_model *m, ref_scratch *s, const ref_layer *L)
{
    const model_hparams *hp = &m->hp;
    uint32_t d = hp->d_model, ff = hp->d_ff_exp, k = hp->n_expert_used;
    int32_t ids[VKI_MOE_MAX_USED];
    float w[VKI_MOE_MAX_USED];
    matvec(s->scores, L->router, s->xb, L->router_b, hp->n_expert, d); /* scores holds >= n_expert floats */
    ref_moe_route(s->scores, hp->n_expert, k, hp->expert_norm, ids, w);
    for (uint32_t e = 0; e < hp->n_expert; e++) {
        bool chosen = false;
        for (uint32_t j = 0; j < k; j++)
            chosen |= ids[j] == (int32_t)e;
        double gap = (double)s->scores[ids[k - 1]] - s->scores[e];
        if (!chosen && gap < m->route_margin)
            m->route_margin = gap;
    }
    double *acc = calloc(d, sizeof *acc);
    for (uint32_t j = 0; acc && j < k; j++) {
        size_t e = (size_t)ids[j];
        matvec(s->g, L->gate_exps + e * ff * d, s->xb, L->gate_exps_b ? L->gate_exps_b + e * ff : NULL, ff, d);
        matvec(s->u, L->up_exps + e * ff * d, s->xb, L->up_exps_b ? L->up_exps_b + e * ff : NULL, ff, d);
        for (uint32_t i = 0; i < ff; i++)
            s->g[i] = expert_glu(hp, s->g[i], s->u[i]);
        matvec(s->o, L->down_exps + e * d * ff, s->g, L->down_exps_b ? L->down_exps_b + e * d : NULL, d, ff);
        for (uint32_t i = 0; i < d; i++)
            acc[i] += (double)w[j] * s->o[i];
    }
    for (uint32_t i = 0; i < d; i++)
        s->o[i] = acc ? (float)acc[i] : NAN;
    free(acc);
}

static void ffn_block(ref_model *m, ref_scratch *s, uint32_t il)
{
    const model_hparams *hp = &m->hp;
    const ref_layer *L = &m->layers[il];
    uint32_t d = hp->d_model;
    if (L->ffn_norm)
        stream_norm(hp, s->xb, s->x, L->ffn_norm, L->ffn_norm_b);
    else if (!hp->parallel_ffn) /* olmo2; command-r's FFN reads the attention's xb */
        memcpy(s->xb, s->x, d * sizeof(float));
    if (L->router) {
        moe_ffn(m, s, L);
        for (uint32_t i = 0; i < d; i++)
            s->x[i] += hp->resid_scale * s->o[i]; /* granite's residual_scale (1 elsewhere) */
        if (!L->w_down) /* else granitemoe's shared expert, from the same input */
            return;
    }
    if (hp->ffn_plain) { /* starcoder2: gelu(up h + b_up) */
        matvec(s->g, L->w_up, s->xb, L->b_up, hp->d_ff, d);
        for (uint32_t i = 0; i < hp->d_ff; i++)
            s->g[i] = (float)act(hp, s->g[i]);
    } else {
        matvec(s->g, L->w_gate, s->xb, NULL, hp->d_ff, d);
        matvec(s->u, L->w_up, s->xb, NULL, hp->d_ff, d);
        for (uint32_t i = 0; i < hp->d_ff; i++)
            s->g[i] = (float)act(hp, s->g[i]) * s->u[i];
    }
    matvec(s->o, L->w_down, s->g, L->b_down, d, hp->d_ff);
    if (L->post_ffn_norm)
        rmsnorm(s->o, s->o, L->post_ffn_norm, d, hp->rms_eps);
    for (uint32_t i = 0; i < d; i++)
        s->x[i] += hp->resid_scale * s->o[i]; /* granite's residual_scale (1 elsewhere) */
}

static void lm_head(const ref_model *m, ref_scratch *s, float *logits)
{
    const model_hparams *hp = &m->hp;
    stream_norm(hp, s->xb, s->x, m->output_norm, m->output_norm_b);
    matvec(logits, m->output, s->xb, m->output_b, hp->n_vocab, hp->d_model);
    for (uint32_t i = 0; hp->logit_mul != 1.0f && i < hp->n_vocab; i++) /* granite, command-r */
        logits[i] = (float)(logits[i] * (double)hp->logit_mul);
    for (uint32_t i = 0; hp->final_softcap > 0 && i < hp->n_vocab; i++)
        logits[i] = (float)(hp->final_softcap * tanh(logits[i] / (double)hp->final_softcap));
}

static vki_status run(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits, float *hidden,
                      const float *kv_in, float *kv_out);

vki_status ref_model_forward(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits)
{
    return run(m, tokens, n, all, logits, NULL, NULL, NULL);
}

vki_status ref_model_forward_kv(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits,
                                const float *kv_in, float *kv_out)
{
    return run(m, tokens, n, all, logits, NULL, kv_in, kv_out);
}

vki_status ref_model_hidden(ref_model *m, const int32_t *tokens, uint32_t n, float *hidden)
{
    return run(m, tokens, n, false, NULL, hidden, NULL, NULL);
}

/* logits (when not NULL) as ref_model_forward; hidden (when not NULL): [n][d] normed states;
 * kv_in / kv_out (when not NULL) as ref_model_forward_kv. */
static vki_status run(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits, float *hidden,
                      const float *kv_in, float *kv_out)
{
    const model_hparams *hp = &m->hp;
    uint32_t d = hp->d_model, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    if (!n)
        return VKI_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
            return VKI_ERR_INVALID_ARG;
    ref_scratch s = {.kv_in = kv_in, .kv_out = kv_out};
    m->route_margin = INFINITY;
    float **bufs[] = {&s.x, &s.xb, &s.o, &s.q, &s.att_out, &s.k, &s.v, &s.g, &s.u, &s.scores, &s.kc, &s.vc};
    size_t ff = hp->d_ff > hp->d_ff_exp ? hp->d_ff : hp->d_ff_exp;
    size_t sizes[] = {d, d, d, q_dim, q_dim, kv_dim, kv_dim, ff, ff, n > hp->n_expert ? n : hp->n_expert,
                      (size_t)hp->n_layer * n * kv_dim, (size_t)hp->n_layer * n * kv_dim};
    vki_status st = VKI_OK;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = malloc(sizes[i] * sizeof(float))))
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (!(s.p = malloc(n * sizeof *s.p)))
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t pos = 0; st == VKI_OK && pos < n; pos++) {
        memcpy(s.x, m->tok_embd + (size_t)tokens[pos] * d, d * sizeof(float));
        /* gemma: ggml_scale by sqrtf(n_embd); granite: by embedding_scale (the engine's embd_mul
         * also divides by residual_scale, which this reference applies to each block instead) */
        bool granite = hp->arch == MODEL_ARCH_GRANITE || hp->arch == MODEL_ARCH_GRANITE_MOE;
        float embd = granite ? hp->embd_mul * hp->resid_scale : hp->embd_mul;
        for (uint32_t i = 0; embd != 1.0f && i < d; i++)
            s.x[i] *= embd;
        for (uint32_t il = 0; il < hp->n_layer; il++) {
            attention_block(m, &s, il, pos, n);
            ffn_block(m, &s, il);
        }
        if (hidden)
            stream_norm(hp, hidden + (size_t)pos * d, s.x, m->output_norm, m->output_norm_b);
        if (logits && (all || pos == n - 1))
            lm_head(m, &s, all ? logits + (size_t)pos * hp->n_vocab : logits);
    }
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(*bufs[i]);
    free(s.p);
    return st;
}
