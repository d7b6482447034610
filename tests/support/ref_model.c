#include "support/ref_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"

typedef struct ref_layer {
    float *attn_norm;           /* [d] */
    float *wq, *wk, *wv, *wo;   /* [q_dim][d], [kv_dim][d], [kv_dim][d], [d][q_dim] (row = output) */
    float *bq, *bk, *bv;        /* [q_dim], [kv_dim], [kv_dim] or NULL */
    float *ffn_norm;            /* [d] */
    float *w_gate, *w_up;       /* [d_ff][d] */
    float *w_down;              /* [d][d_ff] */
} ref_layer;

struct ref_model {
    model_hparams hp;
    bool kv_f16;
    float *tok_embd;            /* [n_vocab][d] */
    float *output_norm;         /* [d] */
    float *output;              /* [n_vocab][d] (aliases tok_embd when tied) */
    float *rope_freqs;          /* [n_rot/2] or NULL */
    ref_layer *layers;          /* [n_layer] */
};

static float *dequant_tensor(const gguf_tensor *t)
{
    if (!t)
        return NULL;
    uint64_t rows = 1;
    for (uint32_t i = 1; i < t->n_dims; i++)
        rows *= t->ne[i];
    float *y = malloc(rows * t->ne[0] * sizeof *y);
    if (!y)
        return NULL;
    size_t rb = quant_row_bytes(t->type, t->ne[0]);
    for (uint64_t r = 0; r < rows; r++)
        dequant_row(t->type, t->data + r * rb, y + r * t->ne[0], t->ne[0]);
    return y;
}

vki_status ref_model_load(const char *path, bool kv_f16, ref_model **out, char *err, size_t n)
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
    m->kv_f16 = kv_f16;
    st = model_read_hparams(f, &m->hp, err, n);
    if (st == VKI_OK)
        st = model_find_tensors(f, &m->hp, &t, err, n);
    if (st == VKI_OK) {
        m->layers = calloc(m->hp.n_layer, sizeof *m->layers);
        m->tok_embd = dequant_tensor(t.tok_embd);
        m->output_norm = dequant_tensor(t.output_norm);
        m->output = m->hp.tied_embeddings ? m->tok_embd : dequant_tensor(t.output);
        m->rope_freqs = dequant_tensor(t.rope_freqs);
        for (uint32_t il = 0; m->layers && il < m->hp.n_layer; il++) {
            const model_layer_tensors *L = &t.layers[il];
            ref_layer *R = &m->layers[il];
            R->attn_norm = dequant_tensor(L->attn_norm);
            R->wq = dequant_tensor(L->wq);
            R->wk = dequant_tensor(L->wk);
            R->wv = dequant_tensor(L->wv);
            R->wo = dequant_tensor(L->wo);
            R->bq = dequant_tensor(L->bq);
            R->bk = dequant_tensor(L->bk);
            R->bv = dequant_tensor(L->bv);
            R->ffn_norm = dequant_tensor(L->ffn_norm);
            R->w_gate = dequant_tensor(L->w_gate);
            R->w_up = dequant_tensor(L->w_up);
            R->w_down = dequant_tensor(L->w_down);
            if (!R->attn_norm || !R->wq || !R->wk || !R->wv || !R->wo || !R->ffn_norm || !R->w_gate ||
                !R->w_up || !R->w_down)
                st = VKI_ERR_OUT_OF_HOST_MEMORY;
        }
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
        ref_layer *R = &m->layers[il];
        float *all[] = {R->attn_norm, R->wq, R->wk, R->wv, R->wo, R->bq, R->bk, R->bv,
                        R->ffn_norm, R->w_gate, R->w_up, R->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
    }
    free(m->layers);
    if (m->output != m->tok_embd)
        free(m->output);
    free(m->tok_embd);
    free(m->output_norm);
    free(m->rope_freqs);
    free(m);
}

const model_hparams *ref_model_hparams(const ref_model *m) { return &m->hp; }

static void rmsnorm(float *y, const float *x, const float *w, uint32_t d, float eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < d; i++)
        ss += (double)x[i] * x[i];
    double s = 1.0 / sqrt(ss / d + eps);
    for (uint32_t i = 0; i < d; i++)
        y[i] = (float)(x[i] * s) * w[i];
}

/* y[o] = sum_i W[o][i] x[i] (+ b[o]) */
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

static void rope(const model_hparams *hp, const float *factors, float *v, uint32_t n_heads, uint32_t pos)
{
    uint32_t hd = hp->head_dim, half = hp->n_rot / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (uint32_t i = 0; i < half; i++) {
            double theta = pos * (double)hp->rope_freq_scale * pow(hp->rope_base, -2.0 * i / hp->n_rot);
            if (factors)
                theta /= factors[i];
            double c = cos(theta), s = sin(theta);
            uint32_t a = hp->rope_neox ? i : 2 * i, b = hp->rope_neox ? i + half : 2 * i + 1;
            double x0 = x[a], x1 = x[b];
            x[a] = (float)(x0 * c - x1 * s);
            x[b] = (float)(x0 * s + x1 * c);
        }
    }
}

static float kv_round(const ref_model *m, float x)
{
    return m->kv_f16 ? quant_f16_to_f32(quant_f32_to_f16(x)) : x;
}

typedef struct ref_scratch {
    float *x, *xb, *q, *k, *v, *att_out, *o, *g, *u, *scores;
    float *kc, *vc; /* [n_layer][n][kv_dim] */
} ref_scratch;

/* Attention of one token at `pos` (its K/V already cached) for all heads. */
static void attend(const ref_model *m, ref_scratch *s, uint32_t il, uint32_t pos, uint32_t n)
{
    const model_hparams *hp = &m->hp;
    uint32_t hd = hp->head_dim, kv_dim = hp->n_head_kv * hd, group = hp->n_head / hp->n_head_kv;
    const float *kc = s->kc + (size_t)il * n * kv_dim, *vc = s->vc + (size_t)il * n * kv_dim;
    double scale = 1.0 / sqrt((double)hd);
    for (uint32_t h = 0; h < hp->n_head; h++) {
        const float *q = s->q + (size_t)h * hd;
        uint32_t kvh = h / group;
        double mx = -INFINITY, sum = 0;
        for (uint32_t j = 0; j <= pos; j++) {
            double dot = 0;
            for (uint32_t i = 0; i < hd; i++)
                dot += (double)q[i] * kc[(size_t)j * kv_dim + kvh * hd + i];
            s->scores[j] = (float)(dot * scale);
            if (s->scores[j] > mx)
                mx = s->scores[j];
        }
        for (uint32_t j = 0; j <= pos; j++)
            sum += exp(s->scores[j] - mx);
        for (uint32_t i = 0; i < hd; i++) {
            double acc = 0;
            for (uint32_t j = 0; j <= pos; j++)
                acc += exp(s->scores[j] - mx) / sum * vc[(size_t)j * kv_dim + kvh * hd + i];
            s->att_out[(size_t)h * hd + i] = (float)acc;
        }
    }
}

static void layer_forward(const ref_model *m, ref_scratch *s, uint32_t il, uint32_t pos, uint32_t n)
{
    const model_hparams *hp = &m->hp;
    const ref_layer *L = &m->layers[il];
    uint32_t d = hp->d_model, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    rmsnorm(s->xb, s->x, L->attn_norm, d, hp->rms_eps);
    matvec(s->q, L->wq, s->xb, L->bq, q_dim, d);
    matvec(s->k, L->wk, s->xb, L->bk, kv_dim, d);
    matvec(s->v, L->wv, s->xb, L->bv, kv_dim, d);
    rope(hp, m->rope_freqs, s->q, hp->n_head, pos);
    rope(hp, m->rope_freqs, s->k, hp->n_head_kv, pos);
    float *kc = s->kc + ((size_t)il * n + pos) * kv_dim, *vc = s->vc + ((size_t)il * n + pos) * kv_dim;
    for (uint32_t i = 0; i < kv_dim; i++) {
        kc[i] = kv_round(m, s->k[i]);
        vc[i] = kv_round(m, s->v[i]);
    }
    attend(m, s, il, pos, n);
    matvec(s->o, L->wo, s->att_out, NULL, d, q_dim);
    for (uint32_t i = 0; i < d; i++)
        s->x[i] += s->o[i];
    rmsnorm(s->xb, s->x, L->ffn_norm, d, hp->rms_eps);
    matvec(s->g, L->w_gate, s->xb, NULL, hp->d_ff, d);
    matvec(s->u, L->w_up, s->xb, NULL, hp->d_ff, d);
    for (uint32_t i = 0; i < hp->d_ff; i++)
        s->g[i] = (float)(s->g[i] / (1.0 + exp(-(double)s->g[i]))) * s->u[i];
    matvec(s->o, L->w_down, s->g, NULL, d, hp->d_ff);
    for (uint32_t i = 0; i < d; i++)
        s->x[i] += s->o[i];
}

static vki_status run(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits, float *hidden);

vki_status ref_model_forward(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits)
{
    return run(m, tokens, n, all, logits, NULL);
}

vki_status ref_model_hidden(ref_model *m, const int32_t *tokens, uint32_t n, float *hidden)
{
    return run(m, tokens, n, false, NULL, hidden);
}

/* logits (when not NULL) as ref_model_forward; hidden (when not NULL): [n][d] normed states. */
static vki_status run(ref_model *m, const int32_t *tokens, uint32_t n, bool all, float *logits, float *hidden)
{
    const model_hparams *hp = &m->hp;
    uint32_t d = hp->d_model, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    if (!n)
        return VKI_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
            return VKI_ERR_INVALID_ARG;
    ref_scratch s = {0};
    float **bufs[] = {&s.x, &s.xb, &s.o, &s.q, &s.att_out, &s.k, &s.v, &s.g, &s.u, &s.scores, &s.kc, &s.vc};
    size_t sizes[] = {d, d, d, q_dim, q_dim, kv_dim, kv_dim, hp->d_ff, hp->d_ff, n,
                      (size_t)hp->n_layer * n * kv_dim, (size_t)hp->n_layer * n * kv_dim};
    vki_status st = VKI_OK;
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = malloc(sizes[i] * sizeof(float))))
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t pos = 0; st == VKI_OK && pos < n; pos++) {
        memcpy(s.x, m->tok_embd + (size_t)tokens[pos] * d, d * sizeof(float));
        for (uint32_t il = 0; il < hp->n_layer; il++)
            layer_forward(m, &s, il, pos, n);
        if (hidden)
            rmsnorm(hidden + (size_t)pos * d, s.x, m->output_norm, d, hp->rms_eps);
        if (logits && (all || pos == n - 1)) {
            rmsnorm(s.xb, s.x, m->output_norm, d, hp->rms_eps);
            matvec(all ? logits + (size_t)pos * hp->n_vocab : logits, m->output, s.xb, NULL, hp->n_vocab, d);
        }
    }
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(*bufs[i]);
    return st;
}
