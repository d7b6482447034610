#include "engine/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"

/* The caller's progress callback, called when the percentage changes (about 100 calls a load). */
typedef struct progress {
    vki_progress_fn fn;
    void *user;
    uint64_t done, total;
    int last_pct;
} progress;

/* VKI_ERR_CANCELLED when the callback asks to stop. */
static vki_status progress_step(progress *p, uint64_t bytes)
{
    p->done += bytes;
    int pct = p->total ? (int)(100 * p->done / p->total) : 100;
    if (!p->fn || pct == p->last_pct)
        return VKI_OK;
    p->last_pct = pct;
    return p->fn(p->user, p->done, p->total) ? VKI_OK : VKI_ERR_CANCELLED;
}

#define LAYER_TENSORS 29
/* The per-layer tensors in one order, for both sides of the upload. */
static void gguf_layer_list(const model_layer_tensors *L, const gguf_tensor *out[LAYER_TENSORS])
{
    const gguf_tensor *all[LAYER_TENSORS] = {L->attn_norm, L->wq, L->wk, L->wv, L->wqkv, L->bq, L->bk, L->bv,
                                             L->q_norm, L->k_norm, L->wo, L->post_attn_norm, L->ffn_norm,
                                             L->w_gate, L->w_up, L->w_down, L->post_ffn_norm, L->ffn_gate_inp,
                                             L->ffn_gate_exps, L->ffn_up_exps, L->ffn_down_exps, L->bo,
                                             L->attn_sinks, L->ffn_gate_inp_b, L->ffn_gate_exps_b,
                                             L->ffn_up_exps_b, L->ffn_down_exps_b, L->ffn_up_b, L->ffn_down_b};
    memcpy(out, all, sizeof all);
}

static void vk_layer_list(vk_layer *V, vk_tensor *out[LAYER_TENSORS])
{
    vk_tensor *all[LAYER_TENSORS] = {&V->attn_norm, &V->wq, &V->wk, &V->wv, &V->wqkv, &V->bq, &V->bk, &V->bv,
                                     &V->q_norm, &V->k_norm, &V->wo, &V->post_attn_norm, &V->ffn_norm,
                                     &V->w_gate, &V->w_up, &V->w_down, &V->post_ffn_norm, &V->router,
                                     &V->w_gate_exps, &V->w_up_exps, &V->w_down_exps, &V->bo,
                                     &V->attn_sinks, &V->router_b, &V->b_gate_exps, &V->b_up_exps,
                                     &V->b_down_exps, &V->b_up, &V->b_down};
    memcpy(out, all, sizeof all);
}

static vki_status upload(vkd_device *d, const gguf_tensor *g, vk_tensor *t, progress *p)
{
    if (!g)
        return VKI_OK;
    uint64_t rows = 1;
    for (uint32_t i = 1; i < g->n_dims; i++)
        rows *= g->ne[i];
    char name[96];
    snprintf(name, sizeof name, "%.*s", (int)(g->name.len < 90 ? g->name.len : 90), g->name.ptr);
    /* 3-D (stacked experts): every part holds whole experts of ne[1] rows */
    uint64_t group = g->n_dims == 3 ? g->ne[1] : 1;
    vki_status st = vk_tensor_create_grouped(d, g->type, g->ne[0], rows, group, 0, name, t);
    if (st == VKI_OK)
        st = vk_tensor_upload(d, t, g->data);
    if (st != VKI_OK) {
        vkd_log(d, VKI_LOG_ERROR, "loading tensor %s (%llu bytes) failed: %s", name,
                (unsigned long long)g->nbytes, vki_status_str(st));
        return st;
    }
    if ((st = progress_step(p, g->nbytes)) != VKI_OK)
        vkd_log(d, VKI_LOG_ERROR, "loading cancelled by the progress callback after %s", name);
    return st;
}

/* Concatenation at load: matrices one matmul can read as one (the same type and row length)
 * are uploaded as one tensor, rows of src[0] first. Q|K(|V) and gate|up are each one dispatch
 * over a wider N, so the small K and V projections no longer run as grids of their own. Their
 * biases (f32 vectors) are concatenated alike. */
static bool same_layout(const gguf_tensor *a, const gguf_tensor *b)
{
    return a && b && a->type == b->type && a->n_dims == b->n_dims && a->ne[0] == b->ne[0] &&
           (a->n_dims == 1 || (a->n_dims == 2 && a->ne[2] == 1 && b->ne[2] == 1));
}

static vki_status upload_concat(vkd_device *d, const gguf_tensor *const *src, uint32_t n, vk_tensor *t, progress *p)
{
    bool vec = src[0]->n_dims == 1; /* biases: ne0 grows, one row */
    uint64_t rows = 0;
    char name[96] = "";
    for (uint32_t i = 0; i < n; i++) {
        rows += vec ? src[i]->ne[0] : src[i]->ne[1];
        size_t len = strlen(name);
        snprintf(name + len, sizeof name - len, "%s%.*s", i ? "|" : "", (int)(src[i]->name.len < 40 ? src[i]->name.len : 40),
                 src[i]->name.ptr);
    }
    vki_status st = vec ? vk_tensor_create(d, src[0]->type, rows, 1, 0, name, t)
                        : vk_tensor_create(d, src[0]->type, src[0]->ne[0], rows, 0, name, t);
    if (st == VKI_OK && vec) { /* one row: gather it on the host */
        char *buf = malloc(t->src_row_bytes);
        uint64_t off = 0;
        if (!buf)
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
        for (uint32_t i = 0; st == VKI_OK && i < n; i++) {
            memcpy(buf + off, src[i]->data, src[i]->nbytes);
            off += src[i]->nbytes;
        }
        if (st == VKI_OK)
            st = vk_tensor_upload(d, t, buf);
        free(buf);
    }
    for (uint64_t i = 0, row0 = 0; st == VKI_OK && !vec && i < n; row0 += src[i]->ne[1], i++)
        st = vk_tensor_upload_rows(d, t, row0, src[i]->ne[1], src[i]->data);
    if (st != VKI_OK) {
        vkd_log(d, VKI_LOG_ERROR, "loading tensor %s failed: %s", name, vki_status_str(st));
        vk_tensor_destroy(d, t);
        return st;
    }
    for (uint32_t i = 0; st == VKI_OK && i < n; i++)
        st = progress_step(p, src[i]->nbytes);
    return st;
}

/* How many of q, k, v go into one matmul: 3, 2 (V has another type: llama-quantize's Q4_K_M
 * gives some layers' attn_v Q6_K) or 0. Biases must be all there (f32) or all absent. Layers
 * with per-head q/k norms keep q and k apart (the norm runs on rows of head_dim). */
static uint32_t qkv_concat(const model_hparams *hp, const model_layer_tensors *L)
{
    if (hp->fused_qkv || hp->qk_norm || !same_layout(L->wq, L->wk))
        return 0;
    uint32_t n = same_layout(L->wq, L->wv) ? 3 : 2;
    const gguf_tensor *b[3] = {L->bq, L->bk, L->bv};
    bool any = false, all = true;
    for (uint32_t i = 0; i < n; i++) {
        any |= b[i] != NULL;
        all &= b[i] != NULL && b[i]->type == VKI_GGML_F32 && b[i]->n_dims == 1;
    }
    return !any || all ? n : 0;
}

/* Uploads a layer's tensors; with concat, Q|K(|V) into wqkv (their biases into bq) and gate|up
 * into w_up (gate rows first: phi3's layout), the pieces left empty. */
static vki_status upload_layer(vkd_device *d, const model_hparams *hp, const model_layer_tensors *L, bool concat,
                               vk_layer *V, progress *p)
{
    const gguf_tensor *src[LAYER_TENSORS];
    vk_tensor *dst[LAYER_TENSORS];
    gguf_layer_list(L, src);
    vk_layer_list(V, dst);
    vki_status st = VKI_OK;
    uint32_t nq = concat ? qkv_concat(hp, L) : 0;
    if (nq) {
        const gguf_tensor *w[3] = {L->wq, L->wk, L->wv}, *b[3] = {L->bq, L->bk, L->bv};
        st = upload_concat(d, w, nq, &V->wqkv, p);
        if (st == VKI_OK && L->bq)
            st = upload_concat(d, b, nq, &V->bq, p);
        for (size_t i = 0; i < LAYER_TENSORS; i++) /* uploaded above */
            for (uint32_t j = 0; j < nq; j++)
                if (src[i] == w[j] || src[i] == b[j])
                    src[i] = NULL;
    }
    /* LayerNorm biases (starcoder2) after their weights, one vector each (op_norm_xh) */
    const gguf_tensor *norms[2][2] = {{L->attn_norm, L->attn_norm_b}, {L->ffn_norm, L->ffn_norm_b}};
    vk_tensor *vnorms[2] = {&V->attn_norm, &V->ffn_norm};
    for (int k = 0; st == VKI_OK && k < 2; k++) {
        if (!norms[k][1])
            continue;
        st = upload_concat(d, norms[k], 2, vnorms[k], p);
        for (size_t i = 0; i < LAYER_TENSORS; i++)
            if (src[i] == norms[k][0])
                src[i] = NULL;
    }
    if (st == VKI_OK && concat && !hp->fused_gate_up && same_layout(L->w_gate, L->w_up)) {
        const gguf_tensor *gu[2] = {L->w_gate, L->w_up};
        st = upload_concat(d, gu, 2, &V->w_up, p);
        for (size_t i = 0; i < LAYER_TENSORS; i++)
            if (src[i] == L->w_gate || src[i] == L->w_up)
                src[i] = NULL;
    }
    for (size_t i = 0; st == VKI_OK && i < LAYER_TENSORS; i++)
        st = upload(d, src[i], dst[i], p);
    return st;
}

static uint64_t total_bytes(const model_hparams *hp, const model_tensors *t, const gguf_tensor *factors)
{
    uint64_t n = t->tok_embd->nbytes + t->output_norm->nbytes + (hp->tied_embeddings ? 0 : t->output->nbytes) +
                 (factors ? factors->nbytes : 0) + (t->output_norm_b ? t->output_norm_b->nbytes : 0) +
                 (t->output_b ? t->output_b->nbytes : 0);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const gguf_tensor *all[LAYER_TENSORS];
        const model_layer_tensors *L = &t->layers[il];
        gguf_layer_list(L, all);
        for (size_t i = 0; i < LAYER_TENSORS; i++)
            n += all[i] ? all[i]->nbytes : 0;
        n += (L->attn_norm_b ? L->attn_norm_b->nbytes : 0) + (L->ffn_norm_b ? L->ffn_norm_b->nbytes : 0);
    }
    return n;
}

vki_status vk_model_load(vkd_device *d, const gguf_file *f, const model_hparams *hp, const model_tensors *t,
                         uint32_t n_ctx, bool concat, vki_progress_fn progress_fn, void *progress_user, vk_model *m)
{
    (void)f;
    memset(m, 0, sizeof *m);
    m->hp = *hp;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    const gguf_tensor *factors = model_rope_factors(hp, t, n_ctx);
    progress p = {.fn = progress_fn, .user = progress_user, .total = total_bytes(hp, t, factors), .last_pct = -1};
    vkd_staging_stream(d, true); /* each tensor's fill overlaps the copies of the one before */
    vki_status st = upload(d, t->tok_embd, &m->tok_embd, &p);
    const gguf_tensor *out_norm[2] = {t->output_norm, t->output_norm_b}; /* its bias after it (starcoder2) */
    if (st == VKI_OK)
        st = t->output_norm_b ? upload_concat(d, out_norm, 2, &m->output_norm, &p)
                              : upload(d, t->output_norm, &m->output_norm, &p);
    if (st == VKI_OK && !hp->tied_embeddings)
        st = upload(d, t->output, &m->output, &p);
    if (st == VKI_OK)
        st = upload(d, t->output_b, &m->output_b, &p);
    if (st == VKI_OK)
        st = upload(d, factors, &m->rope_freqs, &p);
    for (uint32_t il = 0; st == VKI_OK && il < hp->n_layer; il++)
        st = upload_layer(d, hp, &t->layers[il], concat, &m->layers[il], &p);
    vkd_staging_stream(d, false);
    vki_status sf = vkd_staging_flush(d);
    st = st == VKI_OK ? sf : st;
    if (st != VKI_OK) {
        vk_model_free(d, m);
        return st;
    }
    m->weight_bytes = vk_tensor_bytes(&m->tok_embd) + vk_tensor_bytes(&m->output_norm) +
                      vk_tensor_bytes(&m->output) + vk_tensor_bytes(&m->output_b) + vk_tensor_bytes(&m->rope_freqs);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        vk_tensor *all[LAYER_TENSORS];
        vk_layer_list(&m->layers[il], all);
        for (size_t i = 0; i < LAYER_TENSORS; i++)
            m->weight_bytes += vk_tensor_bytes(all[i]);
    }
    return VKI_OK;
}

void vk_model_free(vkd_device *d, vk_model *m)
{
    vk_tensor_destroy(d, &m->tok_embd);
    vk_tensor_destroy(d, &m->output_norm);
    vk_tensor_destroy(d, &m->output);
    vk_tensor_destroy(d, &m->output_b);
    vk_tensor_destroy(d, &m->rope_freqs);
    for (uint32_t il = 0; m->layers && il < m->hp.n_layer; il++) {
        vk_tensor *all[LAYER_TENSORS];
        vk_layer_list(&m->layers[il], all);
        for (size_t i = 0; i < LAYER_TENSORS; i++)
            vk_tensor_destroy(d, all[i]);
    }
    free(m->layers);
    m->layers = NULL;
}

const vk_tensor *vk_model_lm_head(const vk_model *m)
{
    return m->hp.tied_embeddings ? &m->tok_embd : &m->output;
}
