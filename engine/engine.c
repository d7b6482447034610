/* vk_engine: setup (weights, KV pools, scratch, inputs, pipelines) and the step driver. */
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/ops_basic.h"
#include "engine/ops_matmul.h"
#include "engine/quant.h"

vk_engine_params vk_engine_default_params(void)
{
    return (vk_engine_params){.page_size = 16, .kv_type = VKI_GGML_F16, .kv_fraction = 0.8f,
                              .max_seqs = 256, .max_tokens = 2048, .capture_first = -1, .capture_last = -1};
}

static VkDeviceSize align_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

/* Floats between logits rows: a multiple of the binding alignment so every row can start a view. */
uint32_t vk_engine_logits_stride(const vk_engine *e)
{
    uint32_t a = (uint32_t)(e->dev->info.min_storage_buffer_offset_alignment / 4);
    a = a ? a : 1;
    return (uint32_t)align_up(e->model.hp.n_vocab, a);
}

/* A scratch buffer: the kernels bind each one whole, so it must fit one storage binding
 * (fit_bindings sizes the usual ones; this names any other). */
static vki_status make_buf(vk_engine *e, VkDeviceSize bytes, const char *name, vkd_buffer **out)
{
    if (bytes > e->dev->info.max_storage_buffer_range) {
        vkd_log(e->dev, VKI_LOG_ERROR, "scratch buffer \"%s\": %llu bytes, more than one storage binding on %s "
                "(maxStorageBufferRange %llu); lower max_tokens or max_seqs", name, (unsigned long long)bytes,
                e->dev->info.name, (unsigned long long)e->dev->info.max_storage_buffer_range);
        return VKI_ERR_UNSUPPORTED;
    }
    return vkd_buffer_create(e->dev, bytes ? bytes : 4, VKD_MEM_DEVICE, name, out);
}

/* Caps max_tokens (and max_seqs) so that the activation buffers of create_scratch, T rows of the
 * widest per-token width, and the R = min(max_seqs, T) logits rows each fit one storage binding,
 * which the kernels bind whole. 128 MiB (lavapipe, many mobile GPUs) holds 1,170 rows of
 * Llama-3-8B's gate|up (2 x 14336 floats: capped at 1,168, a multiple of 16) and 131 logits
 * rows of a 256,000-token vocabulary. A single row too wide for a binding is refused. */
static vki_status fit_bindings(vk_engine *e, const model_hparams *hp)
{
    uint64_t lim = e->dev->info.max_storage_buffer_range, a = e->dev->info.min_storage_buffer_offset_alignment;
    uint64_t qd = (uint64_t)hp->n_head * hp->head_dim, kvd = (uint64_t)hp->n_head_kv * hp->head_dim;
    uint64_t w = hp->d_model, ls = (uint64_t)align_up(4ull * hp->n_vocab, a ? a : 4);
    w = qd + 2 * kvd > w ? qd + 2 * kvd : w;
    w = 2ull * hp->d_ff > w ? 2ull * hp->d_ff : w; /* gate|up, one matrix */
    w *= 4;
    if (w > lim || ls > lim) {
        vkd_log(e->dev, VKI_LOG_ERROR, "one activation row (%llu bytes) or logits row (%llu bytes) is more than one "
                "storage binding on %s (maxStorageBufferRange %llu)", (unsigned long long)w, (unsigned long long)ls,
                e->dev->info.name, (unsigned long long)lim);
        return VKI_ERR_UNSUPPORTED;
    }
    uint64_t t = lim / w, r = lim / ls;
    t = t >= 64 ? t / 16 * 16 : t;
    if (e->p.max_tokens > t) {
        vkd_log(e->dev, VKI_LOG_INFO, "max_tokens capped at %llu: %llu-byte activation rows, one storage binding "
                "of %llu bytes", (unsigned long long)t, (unsigned long long)w, (unsigned long long)lim);
        e->p.max_tokens = (uint32_t)t;
    }
    if (e->p.max_seqs > r && e->p.max_tokens > r) {
        vkd_log(e->dev, VKI_LOG_INFO, "max_seqs capped at %llu: %llu-byte logits rows, one storage binding of "
                "%llu bytes", (unsigned long long)r, (unsigned long long)ls, (unsigned long long)lim);
        e->p.max_seqs = (uint32_t)r;
    }
    return VKI_OK;
}

/* The RoPE tables of the two layer kinds (the second only when its base or scale differs:
 * gemma3's local layers). */
static vki_status upload_rope_tables(vk_engine *e)
{
    const model_hparams *hp = &e->model.hp;
    vk_scratch *s = &e->s;
    float *table = malloc((size_t)hp->n_rot * 2 * sizeof *table), *factors = NULL;
    vki_status st = table ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK && e->model.rope_freqs.n_parts) {
        factors = malloc(hp->n_rot / 2 * sizeof *factors);
        st = factors ? vkd_download(e->dev, e->model.rope_freqs.parts[0].buf, 0, factors, hp->n_rot / 2 * 4)
                     : VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    bool two = hp->kind[1].rope_base != hp->kind[0].rope_base || hp->kind[1].rope_freq_scale != hp->kind[0].rope_freq_scale;
    for (uint32_t k = 0; st == VKI_OK && k < (two ? 2u : 1u); k++) {
        st = make_buf(e, (VkDeviceSize)hp->n_rot * 2 * 4, k ? "rope table (sliding-window layers)" : "rope table",
                      &s->rope_freqs[k]);
        if (st == VKI_OK) {
            const op_rope_yarn y = {hp->yarn_ext_factor, hp->yarn_beta_fast, hp->yarn_beta_slow, hp->n_ctx_orig};
            op_rope_freqs(hp->kind[k].rope_base, hp->kind[k].rope_freq_scale, factors, hp->yarn ? &y : NULL,
                          hp->rope_attn_factor, hp->n_rot, table);
            st = vkd_upload(e->dev, s->rope_freqs[k], 0, table, (size_t)hp->n_rot * 2 * 4);
        }
    }
    if (st == VKI_OK && !two)
        s->rope_freqs[1] = s->rope_freqs[0];
    free(table);
    free(factors);
    return st;
}

static vki_status create_scratch(vk_engine *e)
{
    const model_hparams *hp = &e->model.hp;
    VkDeviceSize T = e->p.max_tokens, R = e->max_out;
    VkDeviceSize qd = (VkDeviceSize)hp->n_head * hp->head_dim, kvd = (VkDeviceSize)hp->n_head_kv * hp->head_dim;
    /* the layers' layouts (vk_layer): q holds [T][q | k | v] where any layer has them in one
     * matrix; k, v and u are needed where any layer has its own wk, wv, w_gate */
    bool qkv_one = false, k_own = false, v_own = false, gu_one = false, u_own = false;
    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const vk_layer *L = &e->model.layers[il];
        qkv_one |= L->wqkv.n_parts > 0;
        k_own |= L->wk.n_parts > 0;
        v_own |= L->wv.n_parts > 0;
        gu_one |= L->w_up.n_parts && !L->w_gate.n_parts;
        u_own |= L->w_gate.n_parts > 0;
    }
    VkDeviceSize q_cols = qkv_one ? qd + 2 * kvd : qd, g_cols = gu_one ? 2ull * hp->d_ff : hp->d_ff;
    vk_scratch *s = &e->s;
    uint32_t slots = e->in.max_items; /* partial slots <= items */
    vki_status st;
    /* the projections' inputs: d (Q|K|V, gate|up, LM head), q (out), d_ff (down); in F16 for the
     * tensor-core GEMMs (before the experts' scratch, which sizes its own by whether this exists) */
    uint32_t K = hp->d_model > qd ? hp->d_model : (uint32_t)qd;
    K = hp->d_ff > K ? hp->d_ff : K;
    if (e->dev->cm.kind != VKD_CM_NONE && !e->p.batch_invariant &&
        (st = make_buf(e, op_half_x_bytes((uint32_t)T, K), "act f16 x", &s->xh)))
        return st;
    if ((st = make_buf(e, T * hp->d_model * 4, "act x", &s->x)) || (st = make_buf(e, T * hp->d_model * 4, "act h", &s->h)) ||
        (st = make_buf(e, T * q_cols * 4, "act q", &s->q)) ||
        (st = make_buf(e, k_own ? T * kvd * 4 : 4, "act k", &s->k)) ||
        (st = make_buf(e, v_own ? T * kvd * 4 : 4, "act v", &s->v)) ||
        (st = make_buf(e, T * qd * 4, "act attn", &s->att)) ||
        (st = make_buf(e, T * g_cols * 4, "act ffn gate", &s->g)) ||
        (st = make_buf(e, u_own ? T * hp->d_ff * 4 : 4, "act ffn up", &s->u)) ||
        (st = make_buf(e, R * hp->d_model * 4, "act lm rows", &s->xs)) ||
        (st = make_buf(e, R * vk_engine_logits_stride(e) * 4, "logits", &s->logits)) ||
        (st = make_buf(e, op_attn_scratch_bytes(&e->attn[0], slots), "attn partials", &s->attn_tmp)) ||
        (st = vk_moe_scratch_create(e)))
        return st;
    /* command-r's FFN reads h after the attention's output projection, which op by op goes
     * through a buffer of its own */
    if (hp->parallel_ffn && (e->p.no_fusion || hp->post_norms) &&
        (st = make_buf(e, T * hp->d_model * 4, "act attn out", &s->o)))
        return st;
    /* the decode splits' merge counters (both layer kinds have the same heads) and those of the
     * matrix-vector epilogues: zero once here, every dispatch leaves them zero */
    uint64_t mb = op_attn_merge_bytes(&e->attn[0], e->in.max_info);
    /* [0], [d_ff / 32] (gate|up's blocks) and Q's and K's head norms ([n_head], then [n_head_kv]
     * at the next storage offset alignment) */
    VkDeviceSize cnt_bytes = 4 * (hp->d_ff >= 64 ? hp->d_ff / 32 : 1);
    VkDeviceSize heads = 4ull * (hp->n_head + hp->n_head_kv) + e->dev->info.min_storage_buffer_offset_alignment;
    cnt_bytes = cnt_bytes > heads ? cnt_bytes : heads;
    if ((st = make_buf(e, mb, "attn merge counters", &s->attn_cnt)) ||
        (st = vkd_fill(e->dev, s->attn_cnt, 0, s->attn_cnt->size, 0)) ||
        (st = make_buf(e, cnt_bytes, "matmul counters", &s->mm_cnt)) ||
        (st = vkd_fill(e->dev, s->mm_cnt, 0, cnt_bytes, 0)))
        return st;
    if (e->p.int_dot) {
        if ((st = make_buf(e, op_quant_x8_bytes((uint32_t)T, K), "act int8 x", &s->xq)) ||
            (st = make_buf(e, hp->d_ff % 32 ? 4 : op_quant_x8_bytes((uint32_t)T, hp->d_ff), "act int8 ffn", &s->gq)))
            return st;
    }
    return upload_rope_tables(e);
}

static void destroy_scratch(vk_engine *e)
{
    if (e->s.rope_freqs[1] == e->s.rope_freqs[0])
        e->s.rope_freqs[1] = NULL;
    vkd_buffer **all[] = {&e->s.x, &e->s.h, &e->s.o, &e->s.q, &e->s.k, &e->s.v, &e->s.att, &e->s.g, &e->s.u,
                          &e->s.xs, &e->s.logits, &e->s.attn_tmp, &e->s.attn_cnt, &e->s.mm_cnt, &e->s.xq, &e->s.xh,
                          &e->s.gq, &e->s.rope_freqs[0], &e->s.rope_freqs[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        vkd_buffer_destroy(e->dev, *all[i]);
        *all[i] = NULL;
    }
    vk_moe_scratch_destroy(e);
}

/* Lays out the step inputs for `pages` page-table entries and mask_bytes of token masks and
 * (re)allocates the buffers (every flight's in_host and in.dev: steps in flight are waited for
 * first). */
static vki_status size_inputs(vk_engine *e, uint64_t pages, VkDeviceSize mask_bytes)
{
    vk_step_inputs *in = &e->in;
    VkDeviceSize a = e->dev->info.min_storage_buffer_offset_alignment, o = 0, T = e->p.max_tokens;
    in->off_tokens = o, o = align_up(o + T * 4, a);
    in->off_pos = o, o = align_up(o + T * 4, a);
    in->off_seq = o, o = align_up(o + T * 4, a);
    in->off_info = o, o = align_up(o + (VkDeviceSize)in->max_info * sizeof(vki_seq_info), a);
    for (uint32_t k = 0; k < 2; k++)
        in->off_items[k] = o, o = align_up(o + (VkDeviceSize)in->max_items * sizeof(vki_attn_item), a);
    in->off_rows = o, o = align_up(o + (VkDeviceSize)e->max_out * 4, a);
    in->off_masks = o, o = align_up(o + mask_bytes, a);
    in->off_pages = o, o = align_up(o + (pages ? pages : 1) * 4, a);
    if (o <= in->cap)
        return VKI_OK;
    vki_status st = vk_engine_drain(e);
    if (st != VKI_OK)
        return st;
    vkd_buffer_destroy(e->dev, in->dev);
    in->dev = NULL;
    in->cap = 0;
    for (uint32_t i = 0; i < e->n_flights; i++) {
        vkd_buffer_destroy(e->dev, e->fl[i].in_host);
        e->fl[i].in_host = NULL;
        if (st == VKI_OK)
            st = vkd_buffer_create(e->dev, o, VKD_MEM_HOST, i ? "step inputs (host, flight 1)" : "step inputs (host)",
                                   &e->fl[i].in_host);
    }
    if (st == VKI_OK)
        st = vkd_buffer_create(e->dev, o, VKD_MEM_DEVICE, "step inputs", &in->dev);
    if (st == VKI_OK)
        in->cap = o;
    return st;
}

/* Most pages one sequence holds at once when a step brings up to n new tokens: all of its
 * context, or with windows on every layer what the scheduler keeps (the sink's pages, the
 * window and the step's tokens, a page of misalignment at each end; scheduler/sched.c). */
static uint64_t seq_pages(const vk_engine *e, uint64_t n)
{
    uint64_t ps = e->p.page_size, all = (e->max_ctx + ps - 1) / ps;
    if (!e->kv_window)
        return all;
    uint64_t win = (e->kv_sink + ps - 1) / ps + (e->kv_window - 1 + n + ps - 1) / ps + 2;
    return win < all ? win : all;
}

/* KV pages per layer pool: from a token budget, or a fraction of the device memory free now
 * (vkd_memory_available: read after weights and scratch are in, so it counts them, other
 * engines and, with VK_EXT_memory_budget, everyone else on the device), capped so one pool is one
 * binding and no more than every slot at full context needs. */
static vki_status size_kv(vk_engine *e)
{
    const model_hparams *hp = &e->model.hp;
    uint64_t page_bytes = op_kv_page_bytes(&e->attn[0].s), pages;
    uint32_t ps = e->p.page_size;
    if (e->p.kv_tokens) {
        pages = (e->p.kv_tokens + ps - 1) / ps;
    } else {
        uint64_t left = vkd_memory_available(e->dev);
        pages = (uint64_t)(left * (double)e->p.kv_fraction) / (2ull * hp->n_layer * page_bytes);
        uint64_t all_slots = (uint64_t)e->p.max_seqs * seq_pages(e, e->p.max_tokens);
        if (pages > all_slots)
            pages = all_slots;
    }
    uint64_t cap = op_kv_max_pages(e->dev, &e->attn[0].s);
    if (pages > cap) {
        vkd_log(e->dev, VKI_LOG_INFO, "KV pool capped at %llu pages per layer (one storage binding)",
                (unsigned long long)cap);
        pages = cap;
    }
    if (pages == 0) {
        vkd_log(e->dev, VKI_LOG_ERROR, "no device memory left for the KV cache");
        return VKI_ERR_OUT_OF_DEVICE_MEMORY;
    }
    e->n_pages = (uint32_t)pages;
    /* one sequence must fit the pool: all of its context, or (windows on every layer) what it
     * holds at once with steps of a page (the scheduler refuses a request whose chunks need
     * more, naming the blocks); else the context shrinks to the pool */
    if (seq_pages(e, ps) > e->n_pages)
        e->max_ctx = e->n_pages * ps;
    return VKI_OK;
}

static vki_status create_kv(vk_engine *e)
{
    uint32_t L = e->model.hp.n_layer;
    e->k_pool = calloc(L, sizeof *e->k_pool);
    e->v_pool = calloc(L, sizeof *e->v_pool);
    if (!e->k_pool || !e->v_pool)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    VkDeviceSize bytes = (VkDeviceSize)e->n_pages * op_kv_page_bytes(&e->attn[0].s);
    for (uint32_t il = 0; il < L; il++) {
        char name[48];
        vki_status st;
        snprintf(name, sizeof name, "kv K layer %u", il);
        if ((st = vkd_buffer_create(e->dev, bytes, VKD_MEM_DEVICE, name, &e->k_pool[il])) != VKI_OK)
            return st;
        snprintf(name, sizeof name, "kv V layer %u", il);
        if ((st = vkd_buffer_create(e->dev, bytes, VKD_MEM_DEVICE, name, &e->v_pool[il])) != VKI_OK)
            return st;
        e->kv_bytes += 2 * bytes;
    }
    return VKI_OK;
}

/* Adds t to the set types[0..*n) of at most VK_MAX_WEIGHT_TYPES (the types ops_matmul runs,
 * so every distinct type fits). */
#define VK_MAX_WEIGHT_TYPES 16
static void add_type(uint32_t *types, uint32_t *n, uint32_t t)
{
    for (uint32_t j = 0; j < *n; j++)
        if (types[j] == t)
            return;
    if (*n < VK_MAX_WEIGHT_TYPES)
        types[(*n)++] = t;
}

/* Every pipeline the forward pass and the sampler use, created last in vk_engine_create: on
 * devices that compile at creation (lavapipe: ~0.6 s for stories260K) a parameter, memory or KV
 * sizing error is reported before that cost, and an open that fails early pays none of it. */
static vki_status prepare_pipelines(vk_engine *e)
{
    vkk_defer_begin(e->dev); /* noted here, created together at the end */
    vki_status st = op_basic_prepare(e->dev);
    for (uint32_t k = 0; st == VKI_OK && k < e->n_kinds; k++)
        if (e->kind_used[k])
            st = op_attn_prepare(e->dev, &e->attn[k]);
    if (st == VKI_OK)
        st = vk_moe_prepare(e);
    if (st == VKI_OK)
        st = op_sampler_prepare(e->fl[0].sampler);
    const vk_model *m = &e->model;
    uint32_t types[VK_MAX_WEIGHT_TYPES], n = 0;
    add_type(types, &n, VKI_GGML_F32); /* activation gathers */
    add_type(types, &n, m->tok_embd.type);
    add_type(types, &n, vk_model_lm_head(m)->type);
    /* quantised mixes (Q4_K_M) vary the type per layer: collect every type used */
    for (uint32_t il = 0; il < m->hp.n_layer; il++) {
        const vk_layer *L = &m->layers[il];
        const vk_tensor *lw[] = {&L->wq, &L->wk, &L->wv, &L->wqkv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                 &L->router};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++)
            add_type(types, &n, lw[i]->type);
    }
    for (uint32_t i = 0; st == VKI_OK && i < n; i++) {
        if (!op_matmul_supported(e->dev, types[i])) {
            vkd_log(e->dev, VKI_LOG_ERROR, "this device cannot run %s weights (needs 16-bit storage)",
                    quant_type_name(types[i]));
            st = VKI_ERR_UNSUPPORTED;
            break;
        }
        st = op_matmul_prepare(e->dev, types[i]);
        if (st == VKI_OK && e->p.int_dot && op_matmul_i8_supported(e->dev, types[i]))
            st = op_matmul_i8_prepare(e->dev, types[i]);
    }
    vki_status sc = vkk_defer_end(e->dev, st == VKI_OK);
    st = st == VKI_OK ? sc : st;
    for (uint32_t i = 0; st == VKI_OK && i < n; i++)
        st = op_matmul_warm_up(e->dev, types[i]);
    return st;
}

/* The attention of each layer kind: the model's window, or max_window when that is smaller (or
 * the layer is global), then with the first page kept as the attention sink (StreamingLLM). Pages
 * are releasable only when every layer in use has a window: before the largest window and past
 * the largest sink. */
static vki_status setup_attention(vk_engine *e, const model_hparams *hp)
{
    bool *used = e->kind_used, release = true;
    for (uint32_t il = 0; il < hp->n_layer; il++)
        used[model_layer_kind(hp, il)] = true;
    e->n_kinds = hp->swa_pattern ? 2 : 1;
    for (uint32_t k = 0; k < 2; k++) {
        uint32_t w = hp->kind[k].window, sink = 0, cap = e->p.max_window;
        if (cap && (!w || w > cap))
            w = cap, sink = e->p.page_size;
        op_attn_shape shape = {.n_heads = hp->n_head, .n_kv_heads = hp->n_head_kv, .head_dim = hp->head_dim,
                               .page_size = e->p.page_size, .kv_type = e->p.kv_type, .scale = hp->attn_scale,
                               .softcap = hp->attn_softcap, .window = w, .sink = sink,
                               .temp_scale = hp->attn_temp_scale, .temp_len = hp->attn_temp_len};
        if (k == 1 && e->n_kinds == 1) { /* one kind: the second is never used */
            e->attn[1] = e->attn[0];
            continue;
        }
        vki_status st = op_attn_setup(e->dev, &shape, &e->attn[k]);
        if (st != VKI_OK)
            return st;
        if (!used[k])
            continue;
        release &= w > 0;
        e->kv_window = w > e->kv_window ? w : e->kv_window;
        e->kv_sink = sink > e->kv_sink ? sink : e->kv_sink;
    }
    if (!release)
        e->kv_window = e->kv_sink = 0;
    return VKI_OK;
}

vki_status vk_engine_create(vkd_device *d, const gguf_file *f, const model_hparams *hp, const model_tensors *t,
                            const vk_engine_params *p, vk_engine **out)
{
    *out = NULL;
    vk_engine *e = calloc(1, sizeof *e);
    if (!e)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    e->dev = d;
    e->p = p ? *p : vk_engine_default_params();
    if (!e->p.page_size || !e->p.max_seqs || !e->p.max_tokens ||
        (e->p.kv_type != VKI_GGML_F16 && e->p.kv_type != VKI_GGML_F32 && e->p.kv_type != VKI_GGML_Q8_0) ||
        !(e->p.kv_fraction > 0 && e->p.kv_fraction <= 1) || e->p.max_window > (1u << 24)) {
        vkd_log(d, VKI_LOG_ERROR, "engine params: page_size, max_seqs, max_tokens must be > 0, kv_type f16/f32/q8_0, "
                "kv_fraction in (0, 1], max_attention_window <= 2^24");
        free(e);
        return VKI_ERR_INVALID_ARG;
    }
    if (e->p.int_dot && !op_matmul_i8_supported(d, VKI_GGML_Q8_0)) {
        vkd_log(d, VKI_LOG_ERROR, "int_dot: %s has no integer dot products (shaderIntegerDotProduct, Vulkan 1.3)",
                d->info.name);
        free(e);
        return VKI_ERR_UNSUPPORTED;
    }
    vki_status st = fit_bindings(e, hp);
    if (st != VKI_OK) {
        free(e);
        return st;
    }
    if (e->p.device_memory_limit)
        d->mem_limit = e->p.device_memory_limit;
    e->max_ctx = e->p.max_ctx ? e->p.max_ctx : hp->n_ctx_train;
    e->max_out = e->p.max_seqs < e->p.max_tokens ? e->p.max_seqs : e->p.max_tokens;
    st = setup_attention(e, hp);
    if (st == VKI_OK)
        st = vk_model_load(d, f, hp, t, e->max_ctx, !e->p.no_fusion, e->p.progress, e->p.progress_user, &e->model);
    if (st == VKI_OK && e->p.batch_invariant) {
        /* one attention entry per token, splits of a fixed length: items never overflow, so the
         * planner never lengthens the splits (which would change the reduction order); per token
         * the splits of its window and of its sink, and a reduce entry */
        for (uint32_t k = 0; k < 2; k++)
            e->attn[k].split_keys = 2 * e->attn[k].min_split;
        e->in.max_info = e->p.max_tokens;
        e->in.max_items = e->p.max_tokens * ((e->max_ctx + e->attn[0].split_keys - 1) / e->attn[0].split_keys + 3);
    } else if (st == VKI_OK) {
        e->in.max_info = e->p.max_seqs;
        e->in.max_items = op_attn_max_items(&e->attn[0], e->p.max_seqs, e->p.max_tokens);
    }
    /* profiles and captures are per recorded step: one flight, each step waited before the next */
    e->n_flights = e->p.profile_path || e->p.capture_first >= 0 ? 1 : VK_MAX_FLIGHTS;
    e->prev_fl = UINT32_MAX;
    if (st == VKI_OK) {
        e->in.info = calloc(e->in.max_info, sizeof *e->in.info);
        e->slot_seen = calloc(e->p.max_seqs, 1);
        e->in.items = calloc(e->in.max_items, sizeof *e->in.items);
        e->prev_row = malloc((size_t)e->p.max_seqs * sizeof *e->prev_row);
        st = e->in.info && e->in.items && e->slot_seen && e->prev_row ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    for (uint32_t i = 0; st == VKI_OK && i < e->p.max_seqs; i++)
        e->prev_row[i] = UINT32_MAX;
    if (st == VKI_OK)
        st = create_scratch(e);
    if (st == VKI_OK)
        st = size_inputs(e, (uint64_t)e->p.max_seqs * 16, 0);
    for (uint32_t i = 0; st == VKI_OK && i < e->n_flights; i++) {
        vk_flight *fl = &e->fl[i];
        st = op_sampler_create(d, e->max_out, hp->n_vocab, &fl->sampler);
        if (st == VKI_OK)
            st = vkd_cmd_create(d, i ? "step (flight 1)" : "step", &fl->cmd);
        if (st == VKI_OK)
            st = vkd_cmd_create(d, i ? "sampler (flight 1)" : "sampler", &fl->cmd_s);
        if (st == VKI_OK && !(fl->out_slots = malloc((size_t)e->max_out * sizeof *fl->out_slots)))
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
        /* A step that records what an earlier one recorded is submitted again (vkd_cmd reuse): up
         * to 8 shapes per flight, e.g. decode at the batch sizes a server moves between and a
         * prefill chunk or two. Not with a RenderDoc capture set (whose steps want labels of
         * their own). */
        if (st == VKI_OK && !e->p.no_cmd_reuse && e->p.capture_first < 0)
            st = vkd_cmd_enable_reuse(&fl->cmd, 8);
        if (st == VKI_OK && !e->p.no_cmd_reuse && e->p.capture_first < 0)
            st = vkd_cmd_enable_reuse(&fl->cmd_s, 4);
    }
    e->cmd = &e->fl[0].cmd;
    if (st == VKI_OK && e->p.profile_path)
        st = vk_profile_open(&e->prof, e->cmd, e->p.profile_path);
    if (st == VKI_OK)
        st = size_kv(e);
    if (st == VKI_OK)
        st = create_kv(e);
    if (st == VKI_OK)
        st = prepare_pipelines(e);
    if (st != VKI_OK) {
        vk_engine_destroy(e);
        return st;
    }
    vk_capture_init(&e->capture, d, e->p.capture_first, e->p.capture_last);
    *out = e;
    return VKI_OK;
}

void vk_engine_destroy(vk_engine *e)
{
    if (!e)
        return;
    vk_capture_close(&e->capture, e->dev);
    vk_profile_close(&e->prof);
    for (uint32_t i = 0; i < e->n_flights; i++) {
        vkd_cmd_destroy(&e->fl[i].cmd); /* waits for a step still in flight */
        vkd_cmd_destroy(&e->fl[i].cmd_s);
        op_sampler_destroy(e->fl[i].sampler);
        vkd_buffer_destroy(e->dev, e->fl[i].in_host);
        free(e->fl[i].out_slots);
    }
    for (uint32_t il = 0; il < e->model.hp.n_layer; il++) {
        if (e->k_pool)
            vkd_buffer_destroy(e->dev, e->k_pool[il]);
        if (e->v_pool)
            vkd_buffer_destroy(e->dev, e->v_pool[il]);
    }
    free(e->k_pool);
    free(e->v_pool);
    destroy_scratch(e);
    vkd_buffer_destroy(e->dev, e->in.dev);
    free(e->in.info);
    free(e->prev_row);
    free(e->in.items);
    free(e->slot_seen);
    vk_model_free(e->dev, &e->model);
    free(e);
}

/* ---- the step ------------------------------------------------------------------------------ */

static vki_status bad_plan(vk_engine *e, const char *what, uint32_t i)
{
    vkd_log(e->dev, VKI_LOG_ERROR, "step plan refused: sequence %u: %s", i, what);
    return VKI_ERR_INVALID_ARG;
}

/* Whether page j of a sequence whose first new token is at pos0 is seen by no layer: wholly
 * before every window of that token (later ones see even less) and past the sinks. */
static bool page_unseen(const vk_engine *e, uint32_t j, uint32_t pos0)
{
    uint64_t ps = e->p.page_size;
    return e->kv_window && (j + 1) * ps + e->kv_window <= (uint64_t)pos0 + 1 && j * ps >= e->kv_sink;
}

/* Checks everything the kernels rely on; counts page-table entries and rows that want tokens. */
static vki_status check_plan(vk_engine *e, const vki_step_plan *plan, uint64_t *n_pt, uint32_t *n_out)
{
    uint64_t tokens = 0;
    *n_pt = 0;
    *n_out = 0;
    if (!plan || plan->n_seqs == 0 || plan->n_seqs > e->p.max_seqs || !plan->seqs)
        return bad_plan(e, "n_seqs must be in [1, max_seqs]", 0);
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *s = &plan->seqs[i];
        if (s->n_new == 0 || !s->tokens || s->slot >= e->p.max_seqs)
            return bad_plan(e, "needs n_new >= 1, tokens and slot < max_seqs", i);
        if ((uint64_t)s->pos0 + s->n_new > e->max_ctx)
            return bad_plan(e, "pos0 + n_new exceeds the context length", i);
        uint32_t need = (s->pos0 + s->n_new + e->p.page_size - 1) / e->p.page_size;
        if (s->n_pages < need || !s->pages)
            return bad_plan(e, "page table does not cover pos0 + n_new", i);
        for (uint32_t j = 0; j < need; j++)
            if (s->pages[j] >= e->n_pages && !(s->pages[j] == VKI_PAGE_NONE && page_unseen(e, j, s->pos0)))
                return bad_plan(e, s->pages[j] == VKI_PAGE_NONE ? "a released page is still in a layer's window"
                                                                 : "page id outside the KV pool", i);
        for (uint32_t j = 0; j < s->n_new; j++) {
            if (s->tokens[j] == VKI_TOKEN_PREV && s->n_new == 1) {
                if (e->prev_fl == UINT32_MAX || e->prev_row[s->slot] == UINT32_MAX)
                    return bad_plan(e, "VKI_TOKEN_PREV: the previous step sampled no token for this slot on the "
                                    "device", i);
                continue;
            }
            if (s->tokens[j] < 0 || (uint32_t)s->tokens[j] >= e->model.hp.n_vocab)
                return bad_plan(e, s->tokens[j] == VKI_TOKEN_PREV ? "VKI_TOKEN_PREV in an entry of more than one token"
                                                                  : "token id outside the vocabulary", i);
        }
        tokens += s->n_new;
        *n_pt += need;
        *n_out += s->want_token;
    }
    if (tokens != plan->n_tokens || tokens > e->p.max_tokens)
        return bad_plan(e, "n_tokens must equal the sum of n_new and be <= max_tokens", 0);
    if (plan->n_copies && !plan->copies)
        return bad_plan(e, "page copies: NULL", 0);
    for (uint32_t i = 0; i < plan->n_copies; i++) { /* O(copies^2): a handful per beam request */
        const vki_page_copy *c = &plan->copies[i];
        if (c->src >= e->n_pages || c->dst >= e->n_pages || c->src == c->dst)
            return bad_plan(e, "page copy outside the KV pool or onto itself", i);
        for (uint32_t j = 0; j < i; j++)
            if (plan->copies[j].dst == c->dst || plan->copies[j].dst == c->src || plan->copies[j].src == c->dst)
                return bad_plan(e, "page copies overlap", i);
    }
    /* slots unique: mark, then clear what was marked. O(n_seqs), on every step. */
    uint32_t marked = 0, dup = UINT32_MAX;
    for (; marked < plan->n_seqs && dup == UINT32_MAX; marked++) {
        uint32_t slot = plan->seqs[marked].slot;
        if (e->slot_seen[slot])
            dup = marked;
        e->slot_seen[slot] = 1;
    }
    for (uint32_t j = 0; j < marked; j++)
        e->slot_seen[plan->seqs[j].slot] = 0;
    return dup == UINT32_MAX ? VKI_OK : bad_plan(e, "slot appears twice", dup);
}

/* Packs tokens, positions, sequence table, page table, attention items (one list per attention
 * kind), LM-head rows and the sampler's token masks (already packed by op_sampler_pack_plan). */
static vki_status pack_inputs(vk_engine *e, vk_flight *f, const vki_step_plan *plan, uint64_t n_pt, op_attn_plan ap[2])
{
    size_t mask_bytes = op_sampler_mask_bytes(f->sampler);
    vki_status st = size_inputs(e, n_pt, mask_bytes);
    if (st != VKI_OK)
        return st;
    vk_step_inputs *in = &e->in;
    char *base = f->in_host->mapped;
    int32_t *tok = (int32_t *)(base + in->off_tokens), *rows = (int32_t *)(base + in->off_rows);
    uint32_t *pos = (uint32_t *)(base + in->off_pos), *seq = (uint32_t *)(base + in->off_seq);
    uint32_t *pt = (uint32_t *)(base + in->off_pages);
    uint32_t row = 0, pto = 0, n_out = 0;
    bool inv = e->p.batch_invariant;
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *s = &plan->seqs[i];
        uint32_t need = (s->pos0 + s->n_new + e->p.page_size - 1) / e->p.page_size;
        if (!inv)
            in->info[i] = (vki_seq_info){.row0 = row, .n_new = s->n_new, .n_ctx = s->pos0 + s->n_new, .pt_off = pto};
        for (uint32_t j = 0; j < s->n_new; j++) {
            tok[row + j] = s->tokens[j] == VKI_TOKEN_PREV ? 0 : s->tokens[j]; /* PREV: copied on the device */
            pos[row + j] = s->pos0 + j;
            seq[row + j] = inv ? row + j : i;
            if (inv) /* every query token its own one-token "sequence" over its causal prefix */
                in->info[row + j] = (vki_seq_info){.row0 = row + j, .n_new = 1, .n_ctx = s->pos0 + j + 1, .pt_off = pto};
        }
        memcpy(pt + pto, s->pages, need * sizeof *pt);
        if (s->want_token)
            rows[n_out++] = (int32_t)(row + s->n_new - 1);
        row += s->n_new;
        pto += need;
    }
    if (mask_bytes) /* n_vocab / 8 bytes per constrained row: 16 KiB at a 128k vocabulary */
        op_sampler_copy_masks(f->sampler, base + in->off_masks);
    in->n_info = inv ? row : plan->n_seqs;
    memcpy(base + in->off_info, in->info, in->n_info * sizeof *in->info);
    /* one work list per attention kind: their windows give different decode splits */
    for (uint32_t k = 0; k < e->n_kinds && st == VKI_OK; k++) {
        if (!e->kind_used[k])
            continue;
        st = op_attn_plan_build(&e->attn[k], in->info, in->n_info, in->items, in->max_items, &ap[k]);
        if (st == VKI_OK)
            memcpy(base + in->off_items[k], in->items, (size_t)ap[k].n_items * sizeof *in->items);
    }
    in->used = in->off_pages + (VkDeviceSize)pto * 4;
    return st;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* Requests with a logits post-processor or a sampled-row logits sink: read their rows back, let the hook modify them, sample
 * on the host with the GPU sampler's semantics (the GPU's token for that row is replaced). The
 * only place logits rows leave the device; O(n_vocab log n_vocab) per such row when a cut is
 * active. */
static vki_status host_round_trips(vk_engine *e, const op_sampler *sampler, const vki_step_plan *plan,
                                   vki_step_out *outs)
{
    uint32_t V = e->model.hp.n_vocab, w = 0;
    float *row = NULL;
    vki_status st = VKI_OK;
    for (uint32_t i = 0; i < plan->n_seqs && st == VKI_OK; i++) {
        const vki_step_seq *s = &plan->seqs[i];
        if (!s->want_token)
            continue;
        uint32_t k = w++;
        bool sink = s->logits_sink && s->sink_sampled;
        if (!s->logits_hook && !sink)
            continue;
        if (!row && !(row = malloc((size_t)V * sizeof *row)))
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        st = vkd_download(e->dev, e->s.logits, (VkDeviceSize)k * vk_engine_logits_stride(e) * 4, row, (size_t)V * 4);
        if (st != VKI_OK)
            break;
        if (sink) /* the raw row, before a post-processor changes it */
            s->logits_sink(s->logits_sink_ctx, row, 1, V, s->pos0 + s->n_new - 1, true);
        if (!s->logits_hook)
            continue;
        s->logits_hook(s->logits_hook_ctx, row, V);
        bool prev = s->n_new == 1 && s->tokens[0] == VKI_TOKEN_PREV; /* its token: what the device copied */
        sample_req req = {.params = s->sampling, .seed = s->seed, .position = s->pos0 + s->n_new,
                          .history = s->history, .n_history = s->n_history, .mask = s->token_mask,
                          .pending = prev, .pending_token = op_sampler_pending_token(sampler, k)};
        vki_sample_out o;
        char err[160];
        st = sample_ref_sample(row, V, &req, &o, err, sizeof err);
        if (st != VKI_OK) {
            vkd_log(e->dev, VKI_LOG_ERROR, "host sampling after a logits post-processor: %s", err);
            break;
        }
        outs[k].token = o.token;
        outs[k].logprob = o.logprob;
        outs[k].nonfinite = o.nonfinite != 0; /* of the row the hook left */
        outs[k].n_top = o.n_top;
        memcpy(outs[k].top_tokens, o.top_tokens, o.n_top * sizeof *o.top_tokens);
        memcpy(outs[k].top_logprobs, o.top_logprobs, o.n_top * sizeof *o.top_logprobs);
    }
    free(row);
    return st;
}

/* Embeddings: the final hidden state of every row (rmsnorm * output_norm, what the LM head
 * reads; command-r's LayerNorm)
 * reads) into s->h, which no later dispatch of the step touches (the LM head, recorded before
 * it, normalises its rows into h on the integer-dot path: the barrier orders the two; the
 * context logits' LM head passes rewrite h after host_hidden has read it). One norm over the
 * step's rows, recorded only when a sequence of the plan has a hidden_hook. */
static bool wants_hidden(const vki_step_plan *plan)
{
    for (uint32_t i = 0; i < plan->n_seqs; i++)
        if (plan->seqs[i].hidden_hook)
            return true;
    return false;
}

static vki_status record_hidden(vk_engine *e, const vki_step_plan *plan)
{
    uint32_t d = e->model.hp.d_model;
    vkd_barrier(e->cmd);
    vkd_label_begin(e->cmd, "hidden states");
    vki_status st = op_norm_xh(e->cmd, model_norm_mode(&e->model.hp), op_mat_rows(e->s.x, d),
                               vkd_whole(e->model.output_norm.parts[0].buf), op_mat_rows(e->s.h, d), plan->n_tokens, d,
                               e->model.hp.resid_eps, (vkd_view){0}, (vkd_view){0});
    vkd_label_end(e->cmd);
    return st;
}

/* Reads each hooked sequence's rows of s->h back and hands them to its hook. */
static vki_status host_hidden(vk_engine *e, const vki_step_plan *plan)
{
    uint32_t d = e->model.hp.d_model, row = 0;
    float *rows = NULL;
    size_t cap = 0;
    vki_status st = VKI_OK;
    for (uint32_t i = 0; i < plan->n_seqs && st == VKI_OK; row += plan->seqs[i++].n_new) {
        const vki_step_seq *s = &plan->seqs[i];
        if (!s->hidden_hook)
            continue;
        size_t n = (size_t)s->n_new * d;
        if (n > cap) {
            float *r = realloc(rows, n * sizeof *rows);
            if (!r) {
                st = VKI_ERR_OUT_OF_HOST_MEMORY;
                break;
            }
            rows = r;
            cap = n;
        }
        st = vkd_download(e->dev, e->s.h, (VkDeviceSize)row * d * 4, rows, n * 4);
        if (st == VKI_OK)
            s->hidden_hook(s->hidden_hook_ctx, rows, s->n_new, d, s->pos0);
    }
    free(rows);
    return st;
}

/* Beam search's copy-on-write pages: one transfer per page, layer and pool, in the step's command
 * buffer before the barrier that precedes the forward pass (which may write the source page). */
static void record_page_copies(vk_engine *e, const vki_step_plan *plan)
{
    VkDeviceSize pb = op_kv_page_bytes(&e->attn[0].s);
    if (plan->n_copies) /* the previous step's KV writes (an earlier submission) before the reads */
        vkd_barrier_compute_to_transfer(e->cmd);
    for (uint32_t i = 0; i < plan->n_copies; i++)
        for (uint32_t l = 0; l < e->model.hp.n_layer; l++) {
            VkDeviceSize src = plan->copies[i].src * pb, dst = plan->copies[i].dst * pb;
            vkd_copy(e->cmd, e->k_pool[l], src, e->k_pool[l], dst, pb);
            vkd_copy(e->cmd, e->v_pool[l], src, e->v_pool[l], dst, pb);
        }
}

/* Context logits: rows [first, first + n) of sequence i's new rows, that is its positions below
 * sink_rows_end. */
static uint32_t ctx_rows(const vki_step_seq *s)
{
    if (!s->logits_sink || s->sink_rows_end <= s->pos0)
        return 0;
    uint32_t n = s->sink_rows_end - s->pos0;
    return n < s->n_new ? n : s->n_new;
}

/* One LM-head pass over n rows of s.x (indices in rows[]) and their copy back to out [n][V]. */
static vki_status lm_head_rows(vk_engine *e, vkd_buffer *in_host, uint32_t T, const int32_t *rows, uint32_t n,
                               float *out)
{
    uint32_t V = e->model.hp.n_vocab, ls = vk_engine_logits_stride(e);
    memcpy((char *)in_host->mapped + e->in.off_rows, rows, (size_t)n * 4);
    vki_status st = vkd_cmd_begin(e->cmd);
    if (st != VKI_OK)
        return st;
    vkd_label_begin(e->cmd, "context logits");
    vkd_copy(e->cmd, in_host, e->in.off_rows, e->in.dev, e->in.off_rows, (VkDeviceSize)n * 4);
    vkd_barrier_transfer_to_compute(e->cmd);
    st = vk_forward_record_lm_head(e, T, n);
    vkd_label_end(e->cmd);
    if (st != VKI_OK) {
        vkd_cmd_abort(e->cmd);
        return st;
    }
    if ((st = vkd_cmd_submit(e->cmd)) != VKI_OK || (st = vkd_cmd_wait(e->cmd)) != VKI_OK)
        return st;
    for (uint32_t r = 0; r < n && st == VKI_OK; r++)
        st = vkd_download(e->dev, e->s.logits, (VkDeviceSize)r * ls * 4, out + (size_t)r * V, (size_t)V * 4);
    return st;
}

/* After the step, s.x still holds every row's final residual: the sequences that asked for
 * context logits get the LM head over their rows, max_out rows per pass (s.logits holds no
 * more). Runs after the sampled rows were read, because it overwrites s.logits. */
static vki_status host_context_logits(vk_engine *e, vkd_buffer *in_host, const vki_step_plan *plan)
{
    uint32_t V = e->model.hp.n_vocab, R = e->max_out, row0 = 0;
    float *out = NULL;
    int32_t *rows = NULL;
    vki_status st = VKI_OK;
    for (uint32_t i = 0; i < plan->n_seqs && st == VKI_OK; row0 += plan->seqs[i++].n_new) {
        const vki_step_seq *s = &plan->seqs[i];
        uint32_t n = ctx_rows(s);
        if (!n)
            continue;
        if (!out && (!(out = malloc((size_t)R * V * sizeof *out)) || !(rows = malloc((size_t)R * sizeof *rows)))) {
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
            break;
        }
        for (uint32_t r0 = 0; r0 < n && st == VKI_OK; r0 += R) {
            uint32_t m = n - r0 < R ? n - r0 : R;
            for (uint32_t r = 0; r < m; r++)
                rows[r] = (int32_t)(row0 + r0 + r);
            st = lm_head_rows(e, in_host, plan->n_tokens, rows, m, out);
            if (st == VKI_OK)
                s->logits_sink(s->logits_sink_ctx, out, m, V, s->pos0 + r0, false);
        }
    }
    free(out);
    free(rows);
    return st;
}

static bool wants_ctx_logits(const vki_step_plan *plan)
{
    for (uint32_t i = 0; i < plan->n_seqs; i++)
        if (ctx_rows(&plan->seqs[i]))
            return true;
    return false;
}

/* Whether the step's wait reads scratch back (logits rows, hidden rows, context logits): no later
 * step may overwrite it first. */
static bool plan_exclusive(const vki_step_plan *plan)
{
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *s = &plan->seqs[i];
        if ((s->want_token && (s->logits_hook || (s->logits_sink && s->sink_sampled))) || s->hidden_hook || ctx_rows(s))
            return true;
    }
    return false;
}

/* VKI_TOKEN_PREV entries: their token copied from the previous step's sampler output over the
 * zero packed in its place, and into their sampled row's pending entry when their penalties
 * count it (after the inputs' copy, before the barrier to the forward pass). */
static void record_prev_tokens(vk_engine *e, const op_sampler *cur, const vki_step_plan *plan)
{
    const op_sampler *prev = NULL;
    for (uint32_t i = 0, row = 0, k = 0; i < plan->n_seqs; row += plan->seqs[i].n_new, k += plan->seqs[i++].want_token) {
        const vki_step_seq *s = &plan->seqs[i];
        if (s->tokens[0] != VKI_TOKEN_PREV) /* check_plan: only in one-token entries */
            continue;
        if (!prev) {
            prev = e->fl[e->prev_fl].sampler;
            vkd_barrier_ex(e->cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                           VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
        }
        vkd_view t = op_sampler_token_view(prev, e->prev_row[s->slot]);
        vkd_copy(e->cmd, t.buf, t.offset, e->in.dev, e->in.off_tokens + (VkDeviceSize)row * 4, 4);
        vkd_view pv = s->want_token ? op_sampler_pending_view(cur, k) : (vkd_view){0};
        if (pv.buf)
            vkd_copy(e->cmd, t.buf, t.offset, pv.buf, pv.offset, 4);
    }
}

/* The submitted step is the one later VKI_TOKEN_PREV entries read: its device-sampled rows. */
static void note_sampled_rows(vk_engine *e, uint32_t fi, const vki_step_plan *plan)
{
    if (e->prev_fl != UINT32_MAX) {
        const vk_flight *p = &e->fl[e->prev_fl];
        for (uint32_t k = 0; k < p->n_out; k++)
            e->prev_row[p->out_slots[k]] = UINT32_MAX;
    }
    vk_flight *f = &e->fl[fi];
    uint32_t k = 0;
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *s = &plan->seqs[i];
        if (!s->want_token)
            continue;
        f->out_slots[k] = s->slot;
        e->prev_row[s->slot] = s->logits_hook ? UINT32_MAX : k; /* a hook's row is resampled on the host */
        k++;
    }
    f->n_out = k;
    e->prev_fl = fi;
}

/* Everything submitted before (compute and transfers, reads and writes) before what follows. */
static void barrier_after_earlier(vkd_cmd *c)
{
    vkd_barrier_ex(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                       VK_ACCESS_TRANSFER_WRITE_BIT);
}

/* The sampler over the LM head's logits rows, its masks at in.off_masks of the device inputs. */
static vki_status record_sampler(vk_engine *e, const vk_flight *f)
{
    vkd_role(e->cmd, "sample");
    vkd_view masks = {e->in.dev, e->in.off_masks, op_sampler_mask_bytes(f->sampler)};
    return op_sampler_record(f->sampler, e->cmd, vkd_whole(e->s.logits), vk_engine_logits_stride(e), masks);
}

/* The newest step in flight (NULL: none). */
static vk_flight *newest_flight(vk_engine *e)
{
    return e->n_pending ? &e->fl[(e->head + e->n_pending - 1) % e->n_flights] : NULL;
}

/* The sampler of a step submitted with its masks later, in a command buffer of its own: after
 * the forward pass (submission order and a barrier), the masks copied from the flight's input
 * buffer (the forward pass's copy left that region out), then the sampler. plan: the masks
 * taken from there first; NULL: those the submit copied. */
static vki_status submit_sampler(vk_engine *e, vk_flight *f, const vki_step_plan *plan)
{
    vki_status st = VKI_OK;
    VkDeviceSize off = e->in.off_masks, bytes = op_sampler_mask_bytes(f->sampler);
    if (plan) {
        if ((st = op_sampler_repoint_masks(f->sampler, plan)) != VKI_OK) {
            vkd_log(e->dev, VKI_LOG_ERROR, "token masks given for other rows than the step's");
            return st;
        }
        op_sampler_copy_masks(f->sampler, (char *)f->in_host->mapped + off);
    }
    f->masks_due = false;
    e->cmd = &f->cmd_s;
    if ((st = vkd_cmd_begin(e->cmd)) != VKI_OK)
        return st;
    vkd_label_begin(e->cmd, "sampler");
    barrier_after_earlier(e->cmd);
    vkd_copy(e->cmd, f->in_host, off, e->in.dev, off, bytes);
    vkd_barrier_transfer_to_compute(e->cmd);
    st = record_sampler(e, f);
    vkd_label_end(e->cmd);
    if (st != VKI_OK) {
        vkd_cmd_abort(e->cmd);
        return st;
    }
    st = vkd_cmd_submit(e->cmd);
    e->last_dispatches += e->cmd->n_dispatches;
    e->last_barriers += e->cmd->n_barriers;
    return st;
}

static vki_status submit(vk_engine *e, const vki_step_plan *plan, bool masks_later)
{
    double t0 = now_ms();
    vk_flight *last = newest_flight(e);
    if (e->n_pending == e->n_flights || (last && (last->exclusive || last->masks_due))) {
        vkd_log(e->dev, VKI_LOG_ERROR, "step submitted with %u in flight%s", e->n_pending,
                e->n_pending == e->n_flights ? ": wait for one first"
                : last->exclusive        ? ": wait for one first, its results are read back from scratch"
                                         : " before the last one's token masks (vk_engine_submit_masks)");
        return VKI_ERR_INVALID_ARG;
    }
    uint32_t fi = e->n_pending ? (e->head + 1) % e->n_flights : 0; /* alone: always flight 0 */
    vk_flight *f = &e->fl[fi];
    e->cmd = &f->cmd;
    uint64_t n_pt;
    uint32_t n_out;
    vki_status st = check_plan(e, plan, &n_pt, &n_out);
    if (st != VKI_OK)
        return st;
    char err[256] = "";
    if (n_out && (st = op_sampler_pack_plan(f->sampler, plan, err, sizeof err)) != VKI_OK) {
        vkd_log(e->dev, VKI_LOG_ERROR, "sampling parameters refused: %s", err);
        return st;
    }
    if (!n_out) /* no row samples: no masks from an earlier step */
        op_sampler_pack(f->sampler, NULL, 0, err, sizeof err);
    op_attn_plan ap[2] = {{0}};
    if ((st = pack_inputs(e, f, plan, n_pt, ap)) != VKI_OK)
        return st;
    vk_capture_before_step(&e->capture, e->dev, e->n_steps);
    if ((st = vkd_cmd_begin(e->cmd)) != VKI_OK)
        return st;
    if (e->cmd->streaming) /* one label for every step a recording serves */
        vkd_label_begin(e->cmd, "step");
    else
        vkd_label_begin(e->cmd, "step %llu", (unsigned long long)e->n_steps);
    /* the previous step may still run (submitted without a wait): its reads of the inputs and its
     * writes of scratch, KV and sampler output come before anything of this one */
    barrier_after_earlier(e->cmd);
    /* in whole 16 KiB: the copy changes size once per 4,096 page-table entries, not per page
     * (vkd_cmd reuse); the extra bytes cost the transfer next to nothing */
    VkDeviceSize copy = (e->in.used + 16383) / 16384 * 16384, mask_bytes = op_sampler_mask_bytes(f->sampler);
    copy = copy < e->in.cap ? copy : e->in.cap;
    /* masks later: the host writes them into in_host while this copy may run, so it skips them */
    bool split = masks_later && n_out && mask_bytes && !e->prof.trace;
    if (split) {
        vkd_copy(e->cmd, f->in_host, 0, e->in.dev, 0, e->in.off_masks);
        vkd_copy(e->cmd, f->in_host, e->in.off_pages, e->in.dev, e->in.off_pages, copy - e->in.off_pages);
    } else {
        vkd_copy(e->cmd, f->in_host, 0, e->in.dev, 0, copy);
    }
    record_prev_tokens(e, f->sampler, plan);
    record_page_copies(e, plan);
    vkd_barrier_transfer_to_compute(e->cmd);
    memcpy(e->attn_plan, ap, sizeof ap);
    st = vk_forward_record(e, plan, n_out);
    if (st == VKI_OK && wants_hidden(plan))
        st = record_hidden(e, plan);
    if (st == VKI_OK && n_out && !split) {
        vkd_barrier(e->cmd);
        st = record_sampler(e, f);
    }
    vkd_label_end(e->cmd);
    if (st != VKI_OK) {
        vkd_cmd_abort(e->cmd);
        return st;
    }
    uint64_t hits = e->cmd->reuse_hits;
    st = vkd_cmd_submit(e->cmd);
    e->steps_reused += e->cmd->reuse_hits != hits;
    vk_capture_after_step(&e->capture, e->dev, e->n_steps);
    if (st != VKI_OK)
        return st;
    note_sampled_rows(e, fi, plan);
    f->pending = true;
    f->masks_due = split;
    f->early_st = VKI_OK;
    f->exclusive = plan_exclusive(plan);
    f->plan = plan;
    f->n_tokens = plan->n_tokens;
    f->n_seqs = plan->n_seqs;
    f->step = e->n_steps++;
    if (!e->n_pending)
        e->head = fi;
    e->n_pending++;
    e->last_dispatches = e->cmd->n_dispatches;
    e->last_barriers = e->cmd->n_barriers;
    f->host_ms = now_ms() - t0;
    return VKI_OK;
}

vki_status vk_engine_submit(vk_engine *e, const vki_step_plan *plan) { return submit(e, plan, false); }

vki_status vk_engine_submit_masks_later(vk_engine *e, const vki_step_plan *plan) { return submit(e, plan, true); }

vki_status vk_engine_submit_masks(vk_engine *e, const vki_step_plan *plan)
{
    vk_flight *f = newest_flight(e);
    if (!f || !f->masks_due)
        return VKI_OK;
    double t0 = now_ms();
    vki_status st = submit_sampler(e, f, plan);
    f->host_ms += now_ms() - t0;
    if (st != VKI_OK && st != VKI_ERR_INVALID_ARG) /* a failed submit: the step's wait reports it */
        f->early_st = st;
    return st;
}

/* The fences of f (its sampler submitted first when its masks never came). */
static vki_status flight_wait(vk_engine *e, vk_flight *f)
{
    vki_status st = f->masks_due ? submit_sampler(e, f, NULL) : VKI_OK, s;
    if (f->cmd.pending && (s = vkd_cmd_wait(&f->cmd)) != VKI_OK && st == VKI_OK)
        st = s;
    if (f->cmd_s.pending && (s = vkd_cmd_wait(&f->cmd_s)) != VKI_OK && st == VKI_OK)
        st = s;
    return st != VKI_OK ? st : f->early_st;
}

static bool flight_busy(const vk_flight *f) { return f->cmd.pending || f->cmd_s.pending || f->masks_due; }

vki_status vk_engine_drain(vk_engine *e)
{
    vki_status first = VKI_OK;
    for (uint32_t k = 0; k < e->n_pending; k++) {
        vk_flight *f = &e->fl[(e->head + k) % e->n_flights];
        if (flight_busy(f))
            f->early_st = flight_wait(e, f);
        first = first != VKI_OK ? first : f->early_st;
    }
    return first;
}

vki_status vk_engine_wait(vk_engine *e, vki_step_out *outs, float *logits)
{
    double t0 = now_ms();
    if (!e->n_pending || (logits && e->n_pending > 1)) {
        vkd_log(e->dev, VKI_LOG_ERROR, e->n_pending ? "a step's logits read back while a later step is in flight"
                                                    : "no step in flight to wait for");
        return VKI_ERR_INVALID_ARG;
    }
    vk_flight *f = &e->fl[e->head];
    e->head = (e->head + 1) % e->n_flights;
    e->n_pending--;
    f->pending = false;
    vki_status st = flight_busy(f) ? flight_wait(e, f) : f->early_st;
    e->last_wait_ms = now_ms() - t0;
    if (st != VKI_OK)
        return st;
    if (f->n_out)
        op_sampler_read(f->sampler, f->out_slots, outs);
    if (f->exclusive) { /* the latest step: scratch still holds its rows */
        const vki_step_plan *plan = f->plan;
        e->cmd = &f->cmd;
        if (f->n_out && (st = host_round_trips(e, f->sampler, plan, outs)) != VKI_OK)
            return st;
        if (wants_hidden(plan) && (st = host_hidden(e, plan)) != VKI_OK)
            return st;
    }
    for (uint32_t i = 0; logits && i < f->n_out; i++) {
        st = vkd_download(e->dev, e->s.logits, (VkDeviceSize)i * vk_engine_logits_stride(e) * 4,
                          logits + (size_t)i * e->model.hp.n_vocab, (size_t)e->model.hp.n_vocab * 4);
        if (st != VKI_OK)
            return st;
    }
    if (e->prof.trace && (st = vk_profile_step(&e->prof, &f->cmd, f->step, f->n_tokens, f->n_seqs)) != VKI_OK)
        return st;
    if (f->exclusive && wants_ctx_logits(f->plan) && (st = host_context_logits(e, f->in_host, f->plan)) != VKI_OK)
        return st;
    e->last_step_ms = f->host_ms + (now_ms() - t0);
    return VKI_OK;
}

vki_status vk_engine_step(vk_engine *e, const vki_step_plan *plan, vki_step_out *outs, float *logits)
{
    if (e->n_pending) {
        vkd_log(e->dev, VKI_LOG_ERROR, "vk_engine_step with %u step(s) in flight: wait for them first", e->n_pending);
        return VKI_ERR_INVALID_ARG;
    }
    vki_status st = vk_engine_submit(e, plan);
    return st == VKI_OK ? vk_engine_wait(e, outs, logits) : st;
}
