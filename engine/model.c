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

#define LAYER_TENSORS 21
/* The per-layer tensors in one order, for both sides of the upload. */
static void gguf_layer_list(const model_layer_tensors *L, const gguf_tensor *out[LAYER_TENSORS])
{
    const gguf_tensor *all[LAYER_TENSORS] = {L->attn_norm, L->wq, L->wk, L->wv, L->wqkv, L->bq, L->bk, L->bv,
                                             L->q_norm, L->k_norm, L->wo, L->post_attn_norm, L->ffn_norm,
                                             L->w_gate, L->w_up, L->w_down, L->post_ffn_norm, L->ffn_gate_inp,
                                             L->ffn_gate_exps, L->ffn_up_exps, L->ffn_down_exps};
    memcpy(out, all, sizeof all);
}

static void vk_layer_list(vk_layer *V, vk_tensor *out[LAYER_TENSORS])
{
    vk_tensor *all[LAYER_TENSORS] = {&V->attn_norm, &V->wq, &V->wk, &V->wv, &V->wqkv, &V->bq, &V->bk, &V->bv,
                                     &V->q_norm, &V->k_norm, &V->wo, &V->post_attn_norm, &V->ffn_norm,
                                     &V->w_gate, &V->w_up, &V->w_down, &V->post_ffn_norm, &V->router,
                                     &V->w_gate_exps, &V->w_up_exps, &V->w_down_exps};
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

static uint64_t total_bytes(const model_hparams *hp, const model_tensors *t, const gguf_tensor *factors)
{
    uint64_t n = t->tok_embd->nbytes + t->output_norm->nbytes + (hp->tied_embeddings ? 0 : t->output->nbytes) +
                 (factors ? factors->nbytes : 0);
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const gguf_tensor *all[LAYER_TENSORS];
        gguf_layer_list(&t->layers[il], all);
        for (size_t i = 0; i < LAYER_TENSORS; i++)
            n += all[i] ? all[i]->nbytes : 0;
    }
    return n;
}

vki_status vk_model_load(vkd_device *d, const gguf_file *f, const model_hparams *hp, const model_tensors *t,
                         uint32_t n_ctx, vki_progress_fn progress_fn, void *progress_user, vk_model *m)
{
    (void)f;
    memset(m, 0, sizeof *m);
    m->hp = *hp;
    m->layers = calloc(hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    const gguf_tensor *factors = model_rope_factors(hp, t, n_ctx);
    progress p = {.fn = progress_fn, .user = progress_user, .total = total_bytes(hp, t, factors), .last_pct = -1};
    vki_status st = upload(d, t->tok_embd, &m->tok_embd, &p);
    if (st == VKI_OK)
        st = upload(d, t->output_norm, &m->output_norm, &p);
    if (st == VKI_OK && !hp->tied_embeddings)
        st = upload(d, t->output, &m->output, &p);
    if (st == VKI_OK)
        st = upload(d, factors, &m->rope_freqs, &p);
    for (uint32_t il = 0; st == VKI_OK && il < hp->n_layer; il++) {
        const gguf_tensor *src[LAYER_TENSORS];
        vk_tensor *dst[LAYER_TENSORS];
        gguf_layer_list(&t->layers[il], src);
        vk_layer_list(&m->layers[il], dst);
        for (size_t i = 0; st == VKI_OK && i < LAYER_TENSORS; i++)
            st = upload(d, src[i], dst[i], &p);
    }
    if (st != VKI_OK) {
        vk_model_free(d, m);
        return st;
    }
    m->weight_bytes = vk_tensor_bytes(&m->tok_embd) + vk_tensor_bytes(&m->output_norm) +
                      vk_tensor_bytes(&m->output) + vk_tensor_bytes(&m->rope_freqs);
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
