/* The routes that are not text generation: /v1/models, /props and /version (io thread), and
 * /tokenize, /detokenize (llama-server's shapes) and /v1/embeddings (handler threads). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "host/server/server.h"

/* ---- model facts ---------------------------------------------------------------------------- */

cJSON *srv_model_object(const srv *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->t_start);
    cJSON_AddStringToObject(m, "owned_by", "vkinfer");
    cJSON_AddNumberToObject(m, "max_model_len", s->info.n_ctx); /* vLLM's name for the context */
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");            /* llama-server's */
    cJSON_AddNumberToObject(meta, "n_ctx", s->info.n_ctx);
    cJSON_AddNumberToObject(meta, "n_ctx_train", s->info.n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_vocab", s->info.n_vocab);
    cJSON_AddNumberToObject(meta, "n_embd", s->info.d_model);
    return m;
}

void srv_route_models(srv_conn *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), srv_model_object(c->s));
    srv_reply_json(c, 200, o);
}

void srv_route_model(srv_conn *c)
{
    srv *s = c->s;
    const char *id = c->req.path + strlen("/v1/models/");
    if (!strcmp(id, s->model_id))
        return srv_reply_json(c, 200, srv_model_object(s));
    srv_error e;
    srv_err(&e, 404, "model", "the model '%.200s' does not exist; this server has '%s'", id, s->model_id);
    e.code = "model_not_found";
    srv_reply_error(c, &e);
}

void srv_route_version(srv_conn *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", "vkinfer");
    cJSON_AddStringToObject(o, "version", SRV_VERSION);
    srv_reply_json(c, 200, o);
}

static const char *policy_name(vki_capacity_policy p)
{
    return p == VKI_POLICY_MAX_UTILIZATION ? "max-util" : p == VKI_POLICY_STATIC ? "static" : "guaranteed";
}

/* What a client may want to know before sending requests (llama-server's /props, extended). */
void srv_route_props(srv_conn *c)
{
    srv *s = srv_conn_model(c);
    const vki_model_info *i = &s->info;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", s->model_id);
    cJSON_AddStringToObject(o, "model_path", s->p.model_path ? s->p.model_path : "");
    cJSON_AddStringToObject(o, "architecture", i->arch);
    cJSON_AddStringToObject(o, "weight_type", i->weight_type);
    cJSON_AddStringToObject(o, "device", i->device);
    cJSON_AddNumberToObject(o, "n_ctx", i->n_ctx);
    cJSON_AddNumberToObject(o, "n_ctx_train", i->n_ctx_train);
    cJSON_AddNumberToObject(o, "n_vocab", i->n_vocab);
    cJSON_AddNumberToObject(o, "n_embd", i->d_model);
    cJSON_AddNumberToObject(o, "total_slots", i->max_seqs);
    cJSON_AddNumberToObject(o, "kv_cache_tokens", (double)i->kv_pages * i->page_size);
    cJSON_AddStringToObject(o, "chat_template", chat_family_name(s->chat.family));
    cJSON_AddBoolToObject(o, "chat_template_recognised", s->chat_known);
    cJSON_AddStringToObject(o, "policy", policy_name(s->p.batch.policy));
    cJSON_AddStringToObject(o, "embeddings_pooling", s->p.pooling == VKI_POOL_LAST ? "last" : "mean");
    cJSON_AddBoolToObject(o, "api_key_required", s->p.n_api_keys > 0);
    vki_sampling_params d = vki_sampling_default_params();
    cJSON *g = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(g, "temperature", d.temperature);
    cJSON_AddNumberToObject(g, "top_p", d.top_p);
    cJSON_AddNumberToObject(g, "top_k", d.top_k);
    cJSON_AddNumberToObject(g, "min_p", d.min_p);
    cJSON_AddNumberToObject(g, "repetition_penalty", d.repetition_penalty);
    cJSON_AddNumberToObject(g, "penalty_window", d.penalty_window);
    cJSON_AddNumberToObject(g, "max_tokens_completions", 16);
    cJSON_AddStringToObject(g, "max_tokens_chat", "the rest of the context");
    cJSON_AddItemToObject(o, "structured_output", srv_struct_props(s));
    cJSON_AddItemToObject(o, "structured_output", srv_struct_props(s));
    cJSON_AddStringToObject(o, "version", SRV_VERSION);
    srv_reply_json(c, 200, o);
}

/* ---- /tokenize, /detokenize ------------------------------------------------------------------- */

/* Bytes that are not valid UTF-8 become U+FFFD (JSON strings are text). malloc'd. */
static char *utf8_text(const char *p, size_t n)
{
    char *o = malloc(n * 3 + 1), *w = o;
    for (size_t i = 0; o && i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len && i + len <= n && (len == 1 || c != 0);
        for (size_t k = 1; ok && k < len; k++)
            ok = ((unsigned char)p[i + k] & 0xC0) == 0x80;
        if (ok && len == 1 && !c)
            ok = false;
        if (ok) {
            memcpy(w, p + i, len);
            w += len;
            i += len;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            i++;
        }
    }
    if (o)
        *w = 0;
    return o;
}

static bool get_bool(const cJSON *o, const char *name, bool dflt, bool *out, srv_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v))
        return *out = dflt, true;
    if (!cJSON_IsBool(v))
        return srv_err(e, 400, name, "%s must be a boolean", name), false;
    *out = cJSON_IsTrue(v);
    return true;
}

void srv_route_tokenize(srv_conn *c)
{
    srv *s = srv_conn_model(c);
    srv_error e;
    cJSON *root = srv_parse_body(c->req.body.p, c->req.body.len, &e), *out = NULL;
    const cJSON *content = root ? cJSON_GetObjectItemCaseSensitive(root, "content") : NULL;
    bool add_special = false, pieces = false;
    int32_t *ids = NULL;
    size_t n = 0;
    if (root && !cJSON_IsString(content))
        srv_err(&e, 400, "content", "content must be a string");
    else if (root && get_bool(root, "add_special", false, &add_special, &e) &&
             get_bool(root, "with_pieces", false, &pieces, &e)) {
        size_t len = strlen(content->valuestring);
        ids = malloc((len + 8) * sizeof *ids);
        vki_status st = ids ? vki_tokenize(s->tok, content->valuestring, len, add_special, true, ids, len + 8, &n)
                            : VKI_ERR_OUT_OF_HOST_MEMORY;
        if (st == VKI_OK)
            out = cJSON_CreateObject();
        else
            srv_err(&e, 500, NULL, "cannot tokenize: %s", vki_status_str(st));
    }
    cJSON *a = out ? cJSON_AddArrayToObject(out, "tokens") : NULL;
    for (size_t i = 0; a && i < n; i++) {
        if (!pieces) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
            continue;
        }
        char raw[256];
        size_t nr = 0;
        if (vki_token_to_piece(s->tok, ids[i], true, raw, sizeof raw, &nr) != VKI_OK)
            nr = 0;
        char *t = utf8_text(raw, nr);
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "id", ids[i]);
        cJSON_AddStringToObject(p, "piece", t ? t : "");
        cJSON_AddItemToArray(a, p);
        free(t);
    }
    free(ids);
    cJSON_Delete(root);
    if (out)
        return srv_reply_json(c, 200, out);
    srv_reply_error(c, &e);
}

void srv_route_detokenize(srv_conn *c)
{
    srv *s = srv_conn_model(c);
    srv_error e;
    cJSON *root = srv_parse_body(c->req.body.p, c->req.body.len, &e);
    const cJSON *t = root ? cJSON_GetObjectItemCaseSensitive(root, "tokens") : NULL;
    int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
    int32_t *ids = n >= 0 ? malloc((size_t)(n ? n : 1) * sizeof *ids) : NULL;
    bool ok = root && ids;
    if (root && n < 0)
        srv_err(&e, 400, "tokens", "tokens must be an array of token ids");
    else if (root && !ids)
        srv_err(&e, 500, NULL, "out of memory");
    int k = 0;
    for (const cJSON *v = ok ? t->child : NULL; v; v = v->next, k++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble >= s->info.n_vocab) {
            srv_err(&e, 400, "tokens", "tokens[%d]: not a token id in [0, %u)", k, s->info.n_vocab);
            ok = false;
            break;
        }
        ids[k] = (int32_t)v->valuedouble;
    }
    size_t need = 0, cap = (size_t)(n > 0 ? n : 1) * 32;
    char *buf = ok ? malloc(cap) : NULL;
    vki_status st = buf ? vki_detokenize(s->tok, ids, (size_t)n, 0, buf, cap, &need) : VKI_ERR_OUT_OF_HOST_MEMORY;
    if (ok && st == VKI_ERR_INVALID_ARG && need > cap) { /* a longer text than guessed */
        free(buf);
        cap = need;
        buf = malloc(cap);
        st = buf ? vki_detokenize(s->tok, ids, (size_t)n, 0, buf, cap, &need) : VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    cJSON *out = NULL;
    if (ok && st == VKI_OK) {
        char *text = utf8_text(buf, need);
        out = cJSON_CreateObject();
        cJSON_AddStringToObject(out, "content", text ? text : "");
        free(text);
    } else if (ok) {
        srv_err(&e, 500, NULL, "cannot detokenize: %s", vki_status_str(st));
    }
    free(buf);
    free(ids);
    cJSON_Delete(root);
    if (out)
        return srv_reply_json(c, 200, out);
    srv_reply_error(c, &e);
}

/* ---- /v1/embeddings ------------------------------------------------------------------------------ */

#define EMB_MAX_INPUTS 256

typedef struct emb_item {
    struct emb_req *r;
    uint64_t id;
    int32_t *ids;              /* [n_ids] */
    uint32_t n_ids;
    float *vec;                /* [d] (worker-written, under r->mu) */
    bool submitted, final;
    vki_finish_reason finish;
    char error[160];
} emb_item;

typedef struct emb_req {
    srv *s;
    pthread_mutex_t mu;
    int evfd;
    int refs;                  /* the handler's + one per submitted item until its final response */
    emb_item *items;           /* [n] */
    uint32_t n, d;
} emb_req;

static void emb_unref(emb_req *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left)
        return;
    for (uint32_t i = 0; i < r->n; i++) {
        free(r->items[i].ids);
        free(r->items[i].vec);
    }
    free(r->items);
    close(r->evfd);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Worker thread: keeps the vector, wakes the handler. */
static void emb_on_response(void *user, const vki_response *resp)
{
    emb_item *it = user;
    emb_req *r = it->r;
    if (!resp->final)
        return;
    pthread_mutex_lock(&r->mu);
    if (resp->embedding && it->vec)
        memcpy(it->vec, resp->embedding, (size_t)r->d * sizeof *it->vec);
    it->final = true;
    it->finish = resp->embedding ? VKI_FINISH_LENGTH : resp->finish;
    snprintf(it->error, sizeof it->error, "%s", resp->error ? resp->error : "");
    pthread_mutex_unlock(&r->mu);
    uint64_t one = 1;
    ssize_t w = write(r->evfd, &one, sizeof one);
    (void)w;
    pthread_mutex_lock(&r->s->mu);
    r->s->n_active--;
    pthread_cond_broadcast(&r->s->cv);
    pthread_mutex_unlock(&r->s->mu);
    emb_unref(r);
}

/* input: a string, an array of strings, an array of token ids, or an array of such arrays. */
static bool emb_inputs(srv *s, emb_req *r, const cJSON *in, srv_error *e)
{
    if (!in || cJSON_IsNull(in))
        return srv_err(e, 400, "input", "input is required"), false;
    bool one = cJSON_IsString(in) || (cJSON_IsArray(in) && (!in->child || cJSON_IsNumber(in->child)));
    int n = one ? 1 : cJSON_IsArray(in) ? cJSON_GetArraySize(in) : -1;
    if (n < 1 || n > EMB_MAX_INPUTS)
        return srv_err(e, 400, "input", "input must be a string, an array of 1 to %d strings, or token ids",
                       EMB_MAX_INPUTS), false;
    if (!(r->items = calloc((size_t)n, sizeof *r->items)))
        return srv_err(e, 500, NULL, "out of memory"), false;
    r->n = (uint32_t)n;
    const cJSON *v = one ? in : in->child;
    for (uint32_t i = 0; i < r->n; i++, v = v->next) {
        emb_item *it = &r->items[i];
        it->r = r;
        if (cJSON_IsString(v)) {
            size_t len = strlen(v->valuestring), got = 0;
            it->ids = malloc((len + 8) * sizeof *it->ids);
            if (!it->ids || vki_tokenize(s->tok, v->valuestring, len, true, false, it->ids, len + 8, &got) != VKI_OK)
                return srv_err(e, 500, NULL, "cannot tokenize input[%u]", i), false;
            it->n_ids = (uint32_t)got;
        } else if (cJSON_IsArray(v)) {
            int m = cJSON_GetArraySize(v), k = 0;
            it->ids = malloc((size_t)(m ? m : 1) * sizeof *it->ids);
            if (!it->ids)
                return srv_err(e, 500, NULL, "out of memory"), false;
            for (const cJSON *t = v->child; t; t = t->next, k++) {
                if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
                    t->valuedouble >= s->info.n_vocab)
                    return srv_err(e, 400, "input", "input[%u][%d]: not a token id in [0, %u)", i, k,
                                   s->info.n_vocab), false;
                it->ids[k] = (int32_t)t->valuedouble;
            }
            it->n_ids = (uint32_t)m;
        } else {
            return srv_err(e, 400, "input", "input[%u] must be a string or an array of token ids", i), false;
        }
        if (!it->n_ids)
            return srv_err(e, 400, "input", "input[%u] is empty (no tokens)", i), false;
        if (it->n_ids >= s->info.n_ctx)
            return srv_err(e, 400, "input", "input[%u] is %u tokens; the model's context is %u", i, it->n_ids,
                           s->info.n_ctx), false;
        if (!(it->vec = calloc(r->d, sizeof *it->vec)))
            return srv_err(e, 500, NULL, "out of memory"), false;
    }
    return true;
}

static bool emb_options(const cJSON *root, bool *base64, srv_error *e)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    const cJSON *dim = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    *base64 = false;
    if (f && !cJSON_IsNull(f)) {
        if (!cJSON_IsString(f) || (strcmp(f->valuestring, "float") && strcmp(f->valuestring, "base64")))
            return srv_err(e, 400, "encoding_format", "encoding_format must be \"float\" or \"base64\""), false;
        *base64 = !strcmp(f->valuestring, "base64");
    }
    if (dim && !cJSON_IsNull(dim))
        return srv_err(e, 400, "dimensions", "dimensions: shortening embeddings is not supported"), false;
    if (m && !cJSON_IsNull(m) && !cJSON_IsString(m))
        return srv_err(e, 400, "model", "model must be a string"), false;
    return true;
}

static char *base64_floats(const float *v, uint32_t n)
{
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4, k = 0;
    const unsigned char *b = (const unsigned char *)v; /* little-endian float32, as OpenAI sends */
    char *o = malloc((nb + 2) / 3 * 4 + 1);
    for (size_t i = 0; o && i < nb; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < nb ? b[i + 2] : 0);
        o[k++] = tbl[x >> 18 & 63];
        o[k++] = tbl[x >> 12 & 63];
        o[k++] = i + 1 < nb ? tbl[x >> 6 & 63] : '=';
        o[k++] = i + 2 < nb ? tbl[x & 63] : '=';
    }
    if (o)
        o[k] = 0;
    return o;
}

static cJSON *emb_answer(srv *s, const emb_req *r, bool base64)
{
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddStringToObject(o, "object", "list");
    uint64_t tokens = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        const emb_item *it = &r->items[i];
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "object", "embedding");
        cJSON_AddNumberToObject(d, "index", i);
        if (base64) {
            char *b = base64_floats(it->vec, r->d);
            cJSON_AddStringToObject(d, "embedding", b ? b : "");
            free(b);
        } else {
            cJSON *v = cJSON_AddArrayToObject(d, "embedding");
            for (uint32_t k = 0; k < r->d; k++)
                cJSON_AddItemToArray(v, cJSON_CreateNumber(it->vec[k]));
        }
        cJSON_AddItemToArray(data, d);
        tokens += it->n_ids;
    }
    cJSON_AddStringToObject(o, "model", s->model_id);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)tokens);
    return o;
}

/* Submits every input (under s->mu); false with *e when one is refused (the rest are cancelled). */
static bool emb_submit(srv *s, emb_req *r, srv_error *e)
{
    vki_status st = VKI_OK;
    char err[192] = "";
    pthread_mutex_lock(&s->mu);
    for (uint32_t i = 0; i < r->n && st == VKI_OK; i++) {
        emb_item *it = &r->items[i];
        vki_request q = {.prompt = it->ids, .n_prompt = it->n_ids, .max_new_tokens = 1, .pooling = s->p.pooling,
                         .sampling = vki_sampling_default_params()};
        st = VKI_ERR_SHUTDOWN;
        if (s->bm && !s->draining && !s->device_lost) {
            q.id = it->id = s->next_id++;
            pthread_mutex_lock(&r->mu);
            r->refs++;
            pthread_mutex_unlock(&r->mu);
            st = vki_batch_submit(s->bm, &q, emb_on_response, it, err, sizeof err);
            if (st == VKI_OK) {
                it->submitted = true;
                s->n_active++;
            } else { /* no callback will come for this one */
                pthread_mutex_lock(&r->mu);
                r->refs--;
                pthread_mutex_unlock(&r->mu);
            }
        }
    }
    if (st != VKI_OK)
        for (uint32_t i = 0; i < r->n; i++)
            if (r->items[i].submitted && s->bm)
                vki_batch_cancel(s->bm, r->items[i].id);
    pthread_mutex_unlock(&s->mu);
    if (st == VKI_OK)
        return true;
    if (st == VKI_RETRY_QUEUE_FULL) {
        srv_err(e, 429, NULL, "the request queue is full; retry later");
        e->type = "rate_limit_error";
        e->code = "rate_limit_exceeded";
    } else if (st == VKI_ERR_INVALID_ARG) {
        srv_err(e, 400, "input", "%s", err);
    } else {
        srv_err(e, 503, NULL, "the server is not taking requests: %s", vki_status_str(st));
    }
    return false;
}

void srv_route_embeddings(srv_conn *c) { srv_route_embeddings_as(c, c->req.body.p, c->req.body.len, NULL); }

void srv_route_embeddings_as(srv_conn *c, const char *body, size_t n, cJSON *(*shape)(srv_conn *c, cJSON *o))
{
    srv *s = srv_conn_model(c);
    srv_error e;
    bool base64 = false;
    c->acc.gen = true;
    c->acc.ttft_ms = -1;
    cJSON *root = srv_parse_body(body, n, &e);
    emb_req *r = root ? calloc(1, sizeof *r) : NULL;
    bool ok = r && emb_options(root, &base64, &e);
    if (root && !r)
        srv_err(&e, 500, NULL, "out of memory");
    if (r) {
        r->s = s;
        r->refs = 1;
        r->d = s->info.d_model;
        r->evfd = eventfd(0, EFD_CLOEXEC);
        pthread_mutex_init(&r->mu, NULL);
    }
    ok = ok && emb_inputs(s, r, cJSON_GetObjectItemCaseSensitive(root, "input"), &e) && emb_submit(s, r, &e);
    cJSON_Delete(root);
    for (uint32_t i = 0; r && i < r->n; i++)
        c->acc.prompt += r->items[i].n_ids;
    bool done = false, gone = false;
    while (ok && !done) {
        pthread_mutex_lock(&r->mu);
        done = true;
        for (uint32_t i = 0; i < r->n; i++)
            done &= r->items[i].final;
        pthread_mutex_unlock(&r->mu);
        if (!done && srv_wait_events(r->evfd, c, false) == SRV_EV_GONE) {
            gone = true;
            break;
        }
    }
    if (gone) { /* cancel what runs; the callbacks release r */
        pthread_mutex_lock(&s->mu);
        for (uint32_t i = 0; i < r->n; i++)
            if (s->bm)
                vki_batch_cancel(s->bm, r->items[i].id);
        pthread_mutex_unlock(&s->mu);
        c->close_after = true;
        c->status = 499;
        emb_unref(r);
        return;
    }
    for (uint32_t i = 0; ok && i < r->n; i++)
        if (r->items[i].finish != VKI_FINISH_LENGTH) {
            srv_err(&e, r->items[i].finish == VKI_FINISH_CANCELLED ? 503 : 500, NULL, "input[%u]: %s", i,
                    r->items[i].error[0] ? r->items[i].error : "the server shut down before it finished");
            ok = false;
        }
    c->acc.finish = ok ? "embedded" : "error";
    if (ok)
        srv_reply_json(c, 200, shape ? shape(c, emb_answer(s, r, base64)) : emb_answer(s, r, base64));
    else
        srv_reply_error(c, &e);
    if (r)
        emb_unref(r);
}
