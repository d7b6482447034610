/* The public engine object (device + model on the GPU + tokenizer) and its adapter to the batch
 * manager's executor interface (host/batch/backend.h). */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/api/engine_api.h"
#include "engine/ops_matmul.h"
#include "engine/quant.h"
#include "host/batch/backend.h"
#include "host/batch/batch.h"
#include "host/tokenizer/tokenizer.h"
#include "vkinfer.h"

struct vki_engine {
    vkd_device *dev;
    vk_engine *eng;
    vki_tokenizer *tok;
    vki_chat_template *chat; /* the model's own chat template */
    vki_model_info info;
    /* what vki_engine_recover reopens: copies of the path, the parameters and their strings */
    char *path, *device_name, *cache_dir, *profile_path, *kernel_config;
    vki_engine_params params;
    atomic_bool lost;        /* a step reported VKI_ERR_DEVICE_LOST (read by any thread) */
    atomic_bool has_manager; /* the engine runs one batch manager at a time: claimed with a
                                compare-and-swap, so concurrent creators cannot both win */
    uint32_t kv_flags;       /* how this engine computes KV beyond the model (bm_backend.kv_flags) */
};

vki_engine_params vki_engine_default_params(void)
{
    vk_engine_params d = vk_engine_default_params();
    return (vki_engine_params){.device = vki_device_default_params(), .page_size = d.page_size,
                               .kv_type = VKI_KV_F16, .kv_fraction = d.kv_fraction, .max_seqs = d.max_seqs,
                               .max_tokens = d.max_tokens, .capture_first = d.capture_first,
                               .capture_last = d.capture_last};
}

static void set_err(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t n, const char *fmt, ...)
{
    if (!err || !n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* The type of the blocks' matrices holding most weight bytes (the experts' included), for display. */
static const char *main_weight_type(const vk_model *m)
{
    uint64_t bytes[64] = {0};
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const vk_layer *L = &m->layers[il];
        const vk_tensor *w[] = {&L->wq,     &L->wk,     &L->wv,          &L->wqkv,      &L->wo,
                                &L->w_gate, &L->w_up,   &L->w_down,      &L->w_gate_exps, &L->w_up_exps,
                                &L->w_down_exps};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
            if (w[i]->type < 64)
                bytes[w[i]->type] += vk_tensor_bytes(w[i]);
    }
    uint32_t best = 0;
    for (uint32_t t = 1; t < 64; t++)
        if (bytes[t] > bytes[best])
            best = t;
    return quant_get(best) ? quant_get(best)->name : "?";
}

static void fill_info(vki_engine *e, const gguf_file *f, const char *path)
{
    const vk_engine *g = e->eng;
    const model_hparams *hp = &g->model.hp;
    vki_model_info *i = &e->info;
    gguf_str name;
    if (gguf_get_str(f, "general.name", &name) == VKI_OK && name.len)
        snprintf(i->name, sizeof i->name, "%.*s", (int)(name.len < 127 ? name.len : 127), name.ptr);
    else
        snprintf(i->name, sizeof i->name, "%s", strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
    snprintf(i->arch, sizeof i->arch, "%s", hp->arch_name);
    snprintf(i->weight_type, sizeof i->weight_type, "%s", main_weight_type(&g->model));
    i->n_vocab = hp->n_vocab;
    i->n_layer = hp->n_layer;
    i->d_model = hp->d_model;
    i->d_ff = hp->d_ff;
    i->n_head = hp->n_head;
    i->n_head_kv = hp->n_head_kv;
    i->head_dim = hp->head_dim;
    i->n_ctx_train = hp->n_ctx_train;
    i->pooling = hp->pooling_type == 1 ? VKI_POOL_MEAN : hp->pooling_type == 3 ? VKI_POOL_LAST : VKI_POOL_NONE;
    if (hp->pooling_type == 2 || hp->pooling_type == 4) /* a BERT-style [CLS] vector, a reranker's score */
        vkd_log(e->dev, VKI_LOG_WARN, "%s.pooling_type = %u (%s) is not a pooling of a causal model's hidden "
                "states: its embeddings will be pooled by mean or last as asked, not as it was trained",
                hp->arch_name, hp->pooling_type, hp->pooling_type == 2 ? "cls" : "rank");
    i->n_ctx = g->max_ctx;
    i->page_size = g->p.page_size;
    i->kv_pages = g->n_pages;
    i->max_seqs = g->p.max_seqs;
    i->max_tokens = g->p.max_tokens;
    i->weight_bytes = g->model.weight_bytes;
    i->kv_bytes = g->kv_bytes;
    i->device_bytes = e->dev->bytes_allocated[VKD_MEM_DEVICE] + e->dev->bytes_allocated[VKD_MEM_HOST];
    snprintf(i->device, sizeof i->device, "%s", e->dev->info.name);
    snprintf(i->kv_type, sizeof i->kv_type, "%s", quant_get(g->p.kv_type) ? quant_get(g->p.kv_type)->name : "?");
    i->sliding_window = hp->swa_pattern ? hp->kind[1].window : 0;
    i->kv_window = g->kv_window;
    i->fingerprint = gguf_fingerprint(f);
    i->int_dot = g->p.int_dot;
}

/* Captures the device log's first error so vki_engine_create can report it in err. */
typedef struct open_log {
    vki_log_fn user_fn;
    void *user;
    vki_log_level level;
    char first_error[256];
} open_log;

/* The logger when the caller gives none: the library prints nothing by itself. */
static void no_log(void *u, vki_log_level lvl, const char *msg)
{
    (void)u, (void)lvl, (void)msg;
}

static void open_log_fn(void *u, vki_log_level lvl, const char *msg)
{
    open_log *l = u;
    if (lvl == VKI_LOG_ERROR && !l->first_error[0]) /* the first error is the cause; later ones follow */
        snprintf(l->first_error, sizeof l->first_error, "%s", msg);
    if (lvl <= l->level && l->user_fn)
        l->user_fn(l->user, lvl, msg);
}

static vki_status load(vki_engine *e, const char *path, const vki_engine_params *p, open_log *ol, char *err,
                       size_t n)
{
    gguf_file *f = NULL;
    model_hparams hp;
    model_tensors t = {0};
    vki_status st = gguf_open(path, &f, err, n);
    if (st == VKI_OK)
        st = model_read_hparams(f, &hp, err, n);
    if (st == VKI_OK)
        st = model_find_tensors(f, &hp, &t, err, n);
    if (st == VKI_OK && !e->tok) /* a recovery keeps the tokenizer */
        st = tok_from_gguf(f, &e->tok, err, n);
    if (st == VKI_OK && vki_vocab_size(e->tok) != hp.n_vocab) {
        set_err(err, n, "tokenizer has %u tokens but token_embd.weight has %u rows", vki_vocab_size(e->tok),
                hp.n_vocab);
        st = VKI_ERR_FORMAT;
    }
    /* before the engine, whose pipelines come last: a failure here costs no compilation */
    if (st == VKI_OK && !e->chat && (st = vki_chat_template_create(e->tok, NULL, &e->chat)) != VKI_OK)
        set_err(err, n, "chat template: %s", vki_status_str(st));
    if (st == VKI_OK) {
        vk_engine_params ep = vk_engine_default_params();
        ep.page_size = p->page_size;
        ep.kv_type = p->kv_type == VKI_KV_F32 ? VKI_GGML_F32 : p->kv_type == VKI_KV_Q8_0 ? VKI_GGML_Q8_0 : VKI_GGML_F16;
        ep.max_window = p->max_attention_window;
        ep.kv_tokens = p->kv_tokens;
        ep.kv_fraction = p->kv_fraction;
        ep.device_memory_limit = p->device_memory_limit;
        ep.max_seqs = p->max_seqs;
        ep.max_tokens = p->max_tokens;
        ep.max_ctx = p->max_ctx;
        ep.progress = p->progress;
        ep.progress_user = p->progress_user;
        ep.batch_invariant = p->batch_invariant;
        ep.no_fusion = p->no_fusion;
        ep.no_cmd_reuse = p->no_cmd_reuse;
        ep.int_dot = p->int_dot == VKI_INT_DOT_ON ||
                     (p->int_dot == VKI_INT_DOT_AUTO && e->dev->info.integer_dot_accel &&
                      e->dev->info.type != VKI_DEVICE_CPU && op_matmul_i8_supported(e->dev, VKI_GGML_Q8_0));
        ep.profile_path = p->profile_path;
        ep.capture_first = p->capture_first;
        ep.capture_last = p->capture_last;
        st = vk_engine_create(e->dev, f, &hp, &t, &ep, &e->eng);
        if (st != VKI_OK)
            set_err(err, n, "%s%s%s", vki_status_str(st), ol->first_error[0] ? ": " : "", ol->first_error);
    }
    if (st == VKI_OK) {
        fill_info(e, f, path);
        /* LongRoPE: the context chose the long or the short factors, and K carries them */
        const gguf_tensor *rf = model_rope_factors(&hp, &t, e->eng->max_ctx);
        e->kv_flags = rf && rf == t.rope_long && !t.rope_freqs ? BM_KV_ROPE_LONG : 0;
        if (hp.rope_attn_factor != 1.0f)
            e->kv_flags |= BM_KV_ROPE_MAG;
    }
    model_tensors_free(&t);
    gguf_close(f);
    return st;
}

/* Copies of what recovery needs (the caller's strings may not outlive the call). */
static bool keep_params(vki_engine *e, const char *path, const vki_engine_params *p)
{
    e->params = *p;
    e->params.progress = NULL;
    e->params.progress_user = NULL;
    e->path = strdup(path);
    e->device_name = p->device.device_name ? strdup(p->device.device_name) : NULL;
    e->cache_dir = p->device.pipeline_cache_dir ? strdup(p->device.pipeline_cache_dir) : NULL;
    e->profile_path = p->profile_path ? strdup(p->profile_path) : NULL;
    e->kernel_config = p->device.kernel_config ? strdup(p->device.kernel_config) : NULL;
    e->params.device.device_name = e->device_name;
    e->params.device.pipeline_cache_dir = e->cache_dir;
    e->params.device.kernel_config = e->kernel_config;
    e->params.profile_path = e->profile_path;
    return e->path && (!p->device.device_name || e->device_name) && (!p->device.pipeline_cache_dir || e->cache_dir) &&
           (!p->profile_path || e->profile_path) && (!p->device.kernel_config || e->kernel_config);
}

/* Opens the device and loads the model into e (whose tokenizer and chat template, if set, stay). */
static vki_status open_and_load(vki_engine *e, const char *path, const vki_engine_params *params, char *err,
                                size_t err_len)
{
    vki_engine_params p = *params;
    open_log *ol = calloc(1, sizeof *ol);
    if (!ol) {
        set_err(err, err_len, "out of host memory opening the engine");
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    /* Route device messages through open_log while opening so the last error reaches err. */
    *ol = (open_log){.user_fn = p.device.log, .user = p.device.log_user, .level = p.device.log_level};
    vki_device_params dp = p.device;
    dp.log = open_log_fn;
    dp.log_user = ol;
    dp.log_level = VKI_LOG_DEBUG;
    vki_status st = vkd_open(&dp, &e->dev);
    if (st == VKI_OK) /* the kernel choices before any pipeline or recording */
        st = op_kernel_config(e->dev, p.device.kernel_config, true);
    if (st != VKI_OK)
        set_err(err, err_len, "%s%s%s", vki_status_str(st), ol->first_error[0] ? ": " : "", ol->first_error);
    if (st == VKI_OK)
        st = load(e, path, &p, ol, err, err_len);
    if (e->dev) {
        /* from now on the user's logger directly (open_log dies here, also on failure: the
         * caller's cleanup may still log) */
        e->dev->log = p.device.log ? p.device.log : no_log;
        e->dev->log_user = p.device.log_user;
        e->dev->log_level = p.device.log_level;
    }
    if (st != VKI_OK && err && err_len && !err[0]) /* every failure names at least its status */
        set_err(err, err_len, "%s while opening the model", vki_status_str(st));
    free(ol);
    return st;
}

vki_status vki_engine_create(const char *path, const vki_engine_params *params, vki_engine **out, char *err,
                             size_t err_len)
{
    *out = NULL;
    set_err(err, err_len, "%s", "");
    vki_engine_params p = params ? *params : vki_engine_default_params();
    if (!path) {
        set_err(err, err_len, "no model path");
        return VKI_ERR_INVALID_ARG;
    }
    if ((unsigned)p.int_dot > VKI_INT_DOT_OFF) {
        set_err(err, err_len, "int_dot: unknown mode %d (VKI_INT_DOT_AUTO, _ON or _OFF)", (int)p.int_dot);
        return VKI_ERR_INVALID_ARG;
    }
    vki_engine *e = calloc(1, sizeof *e);
    if (!e) {
        set_err(err, err_len, "out of host memory for the engine object");
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    atomic_init(&e->has_manager, false);
    atomic_init(&e->lost, false);
    vki_status st = keep_params(e, path, &p) ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st != VKI_OK)
        set_err(err, err_len, "out of host memory for the engine's parameters");
    if (st == VKI_OK)
        st = open_and_load(e, path, &p, err, err_len);
    if (st != VKI_OK) {
        vki_engine_destroy(e);
        return st;
    }
    *out = e;
    return VKI_OK;
}

vki_status vki_engine_status(const vki_engine *e)
{
    return !e ? VKI_ERR_INVALID_ARG : atomic_load(&e->lost) ? VKI_ERR_DEVICE_LOST : VKI_OK;
}

vki_status vki_engine_recover(vki_engine *e, char *err, size_t err_len)
{
    set_err(err, err_len, "%s", "");
    if (!e) {
        set_err(err, err_len, "engine: NULL");
        return VKI_ERR_INVALID_ARG;
    }
    if (atomic_load(&e->has_manager)) {
        set_err(err, err_len, "a batch manager still runs on the engine: destroy it first");
        return VKI_ERR_INVALID_ARG;
    }
    atomic_store(&e->lost, true); /* until the new device serves */
    vk_engine_destroy(e->eng); /* the old device's objects, then the device */
    e->eng = NULL;
    vkd_close(e->dev);
    e->dev = NULL;
    vki_status st = open_and_load(e, e->path, &e->params, err, err_len);
    if (st != VKI_OK) { /* stays lost; a later call tries again */
        vk_engine_destroy(e->eng);
        e->eng = NULL;
        vkd_close(e->dev);
        e->dev = NULL;
        return st;
    }
    atomic_store(&e->lost, false);
    return VKI_OK;
}

void vki_engine_destroy(vki_engine *e)
{
    if (!e)
        return;
    vk_engine_destroy(e->eng);
    vki_chat_template_free(e->chat);
    vki_tokenizer_free(e->tok);
    vkd_close(e->dev);
    free(e->path);
    free(e->device_name);
    free(e->cache_dir);
    free(e->profile_path);
    free(e->kernel_config);
    free(e);
}

const vki_tokenizer *vki_engine_tokenizer(const vki_engine *e) { return e->tok; }

const vki_chat_template *vki_engine_chat_template(const vki_engine *e) { return e->chat; }

vki_status vki_engine_profile_summary(const vki_engine *e, uint32_t max_rows, char *buf, size_t cap, size_t *n_out)
{
    if (!e || !e->eng || !n_out || (!buf && cap))
        return VKI_ERR_INVALID_ARG;
    return vk_profile_summary(&e->eng->prof, max_rows, buf, cap, n_out);
}
vk_engine *engine_api_core(vki_engine *e) { return e ? e->eng : NULL; }

void vki_engine_info(const vki_engine *e, vki_model_info *out) { *out = e->info; }

/* ---- the batch manager's executor ------------------------------------------------------------ */

static vki_status backend_step(void *ctx, const vki_step_plan *plan, vki_step_out *outs)
{
    vki_engine *e = ctx;
    vki_status st = vk_engine_step(e->eng, plan, outs, NULL);
    if (st == VKI_ERR_DEVICE_LOST)
        atomic_store(&e->lost, true);
    return st;
}

static vki_status backend_submit(void *ctx, const vki_step_plan *plan, bool masks_later)
{
    vki_engine *e = ctx;
    vki_status st = masks_later ? vk_engine_submit_masks_later(e->eng, plan) : vk_engine_submit(e->eng, plan);
    if (st == VKI_ERR_DEVICE_LOST)
        atomic_store(&e->lost, true);
    return st;
}

static vki_status backend_masks(void *ctx, const vki_step_plan *plan)
{
    vki_engine *e = ctx;
    vki_status st = vk_engine_submit_masks(e->eng, plan);
    if (st == VKI_ERR_DEVICE_LOST)
        atomic_store(&e->lost, true);
    return st;
}

static vki_status backend_wait(void *ctx, vki_step_out *outs)
{
    vki_engine *e = ctx;
    vki_status st = vk_engine_wait(e->eng, outs, NULL);
    if (st == VKI_ERR_DEVICE_LOST)
        atomic_store(&e->lost, true);
    return st;
}

/* Of the current vk_engine (a recovery after a device loss starts it again at 0). */
static uint64_t backend_steps_reused(void *ctx)
{
    vki_engine *e = ctx;
    return e->eng ? e->eng->steps_reused : 0;
}

static bool backend_is_eog(void *ctx, int32_t token)
{
    vki_engine *e = ctx;
    return vki_token_is_eog(e->tok, token);
}

static vki_status backend_token_piece(void *ctx, int32_t token, char *buf, size_t cap, size_t *n_out)
{
    vki_engine *e = ctx;
    return vki_token_to_piece(e->tok, token, false, buf, cap, n_out);
}

static vki_status backend_kv_read(void *ctx, const uint32_t *pages, uint32_t n, void *dst)
{
    vki_engine *e = ctx;
    vki_status st = vk_engine_kv_read(e->eng, pages, n, dst);
    if (st == VKI_ERR_DEVICE_LOST)
        atomic_store(&e->lost, true);
    return st;
}

static vki_status backend_kv_write(void *ctx, const uint32_t *pages, uint32_t n, const void *src)
{
    vki_engine *e = ctx;
    vki_status st = vk_engine_kv_write(e->eng, pages, n, src);
    if (st == VKI_ERR_DEVICE_LOST)
        atomic_store(&e->lost, true);
    return st;
}

static void backend_detach(void *ctx)
{
    vki_engine *e = ctx;
    atomic_store(&e->has_manager, false);
}

vki_status vki_batch_manager_create(vki_engine *e, const vki_batch_params *params, const vki_batch_callbacks *cb,
                                    vki_batch_manager **out)
{
    *out = NULL;
    if (!e || !out)
        return VKI_ERR_INVALID_ARG;
    bool free_ = false;
    if (vki_engine_status(e) != VKI_OK)
        return VKI_ERR_DEVICE_LOST; /* vki_engine_recover first */
    if (!atomic_compare_exchange_strong(&e->has_manager, &free_, true))
        return VKI_ERR_INVALID_ARG; /* another manager runs on this engine */
    const vk_engine *g = e->eng;
    bm_backend be = {.ctx = e, .max_seqs = g->p.max_seqs, .n_pages = g->n_pages, .page_size = g->p.page_size,
                     .max_ctx = g->max_ctx, .max_tokens = g->p.max_tokens, .vocab_size = g->model.hp.n_vocab,
                     .kv_window = g->kv_window, .kv_sink = g->kv_sink,
                     .step = backend_step, .steps_reused = backend_steps_reused, .is_eog = backend_is_eog, .token_piece = backend_token_piece,
                     .detach = backend_detach, .tok = e->tok, .chat = e->chat, .n_embd = g->model.hp.d_model,
                     .fingerprint = e->info.fingerprint, .model_name = e->info.name,
                     .kv_layers = g->model.hp.n_layer, .kv_heads = g->model.hp.n_head_kv,
                     .kv_head_dim = g->model.hp.head_dim, .kv_type = g->p.kv_type,
                     .kv_row_bytes = vk_engine_kv_row_bytes(g), .kv_flags = e->kv_flags, .kv_read = backend_kv_read,
                     .kv_write = backend_kv_write};
    if (g->n_flights > 1 && !e->params.no_overlap) { /* two steps in flight (not while profiling or capturing) */
        be.submit = backend_submit;
        be.wait = backend_wait;
        be.masks = backend_masks;
    }
    vki_status st = bm_create(&be, params, cb, out);
    if (st != VKI_OK)
        atomic_store(&e->has_manager, false);
    return st;
}
