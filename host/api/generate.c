/* The simple API: vki_generate / vki_generate_chat. One blocking call = one request of a batch
 * manager, streamed through a chat_reply (a vki_text_stream: UTF-8-safe text, stop strings; on a
 * harmony template the reasoning split from the answer) to the caller's text callbacks. The calling thread sleeps on a condition variable until the final response;
 * everything else runs on the manager's worker thread, so many callers share the batch. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/batch/batch.h"
#include "host/chat/chat_reply.h"
#include "vkinfer.h"

/* One generation in flight: written by the worker thread, read by the caller after `done`. */
typedef struct gen_call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    vki_batch_manager *bm;
    const vki_generate_params *p;
    uint64_t id;
    const chat_template *tmpl; /* vki_generate_chat's (the harmony split), or NULL */
    chat_reply reply;
    bool stopped;           /* a stop string matched, or on_text asked to stop: cancel sent */
    bool by_caller;         /* ... and it was on_text */
    double t0;
    vki_generate_result res;
    vki_status status;      /* the final response's error status, else VKI_OK */
    char error[192];
} gen_call;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

vki_generate_params vki_generate_default_params(void)
{
    return (vki_generate_params){.max_tokens = 128, .sampling = vki_sampling_default_params()};
}

static void set_err(char *err, size_t n, const char *msg)
{
    if (err && n)
        snprintf(err, n, "%s", msg);
}

/* Hands text to one of the caller's callbacks; false from it stops the generation (cancelled
 * next tick). */
static void emit_to(gen_call *g, vki_text_fn fn, const strbuf *b)
{
    if (!b->len || !fn || (g->stopped && g->by_caller))
        return;
    if (!fn(g->p->user, b->p, b->len) && !g->stopped) {
        g->stopped = g->by_caller = true;
        vki_batch_cancel(g->bm, g->id);
    }
}

/* The reply's last piece: the reasoning (harmony), then the answer. */
static void emit(gen_call *g)
{
    emit_to(g, g->p->on_reasoning, &g->reply.reasoning);
    emit_to(g, g->p->on_text, &g->reply.answer);
}

/* Runs on the worker thread: every generated token through the text stream, then the result. */
static void on_response(void *user, const vki_response *r)
{
    gen_call *g = user;
    for (uint32_t i = 0; i < r->n_tokens; i++) {
        if (!g->res.n_generated++)
            g->res.first_token_ms = now_ms() - g->t0;
        bool matched = false;
        if (chat_reply_push(&g->reply, r->tokens[i], &matched) == VKI_OK)
            emit(g);
        if (matched && !g->stopped) { /* a stop string: end the request; its final response comes next tick */
            g->stopped = true;
            vki_batch_cancel(g->bm, g->id);
        }
    }
    if (!r->final)
        return;
    if (chat_reply_finish(&g->reply) == VKI_OK)
        emit(g);
    pthread_mutex_lock(&g->mu);
    g->res.finish = g->stopped ? (g->by_caller ? VKI_FINISH_CANCELLED : VKI_FINISH_STOP) : r->finish;
    g->res.seed = r->seed;
    g->res.total_ms = now_ms() - g->t0;
    if (r->finish == VKI_FINISH_ERROR) {
        g->status = r->status != VKI_OK ? r->status : VKI_ERR_INTERNAL;
        snprintf(g->error, sizeof g->error, "%s", r->error ? r->error : vki_status_str(g->status));
    }
    g->done = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* Submits prompt[0, n) (owned by the caller) and waits for the end. */
static vki_status run(vki_batch_manager *bm, const int32_t *prompt, size_t n, const vki_generate_params *p,
                      gen_call *g, char *err, size_t err_len)
{
    uint32_t max_ctx = bm->be.max_ctx;
    if (n == 0 || n >= max_ctx) {
        char msg[160];
        snprintf(msg, sizeof msg, "prompt: %zu tokens; the context holds %u (at least one must be left to generate)",
                 n, max_ctx);
        set_err(err, err_len, msg);
        return VKI_ERR_INVALID_ARG;
    }
    g->res.n_prompt = (uint32_t)n;
    vki_request req = {.prompt = prompt, .n_prompt = (uint32_t)n, .sampling = p->sampling, .streaming = true,
                       .ignore_eos = p->ignore_eos,
                       .max_new_tokens = p->max_tokens < max_ctx - n ? p->max_tokens : (uint32_t)(max_ctx - n)};
    vki_status st = chat_reply_init(&g->reply, bm->be.tok, g->tmpl, NULL, p->stops, p->n_stops, 0);
    if (st != VKI_OK) {
        set_err(err, err_len, "stop strings: each must be a non-empty string");
        return st;
    }
    for (int tries = 0; tries < 16; tries++) { /* an automatic id may clash with the caller's own */
        g->id = req.id = p->id ? p->id : bm_auto_id(bm);
        st = vki_batch_submit(bm, &req, on_response, g, err, err_len);
        if (st != VKI_ERR_DUPLICATE_ID || p->id)
            break;
    }
    if (st == VKI_OK) {
        pthread_mutex_lock(&g->mu);
        while (!g->done)
            pthread_cond_wait(&g->cv, &g->mu);
        pthread_mutex_unlock(&g->mu);
        if ((st = g->status) != VKI_OK)
            set_err(err, err_len, g->error);
    }
    chat_reply_free(&g->reply);
    return st;
}

/* What vki_generate and vki_generate_chat share: checks, the call state, the result. */
static vki_status start(vki_batch_manager *bm, const vki_generate_params *p, char *err, size_t err_len)
{
    if (!bm) {
        set_err(err, err_len, "no batch manager");
        return VKI_ERR_INVALID_ARG;
    }
    if (!bm->be.tok) {
        set_err(err, err_len, "this batch manager's executor has no tokenizer");
        return VKI_ERR_INVALID_ARG;
    }
    if (bm_on_worker(bm)) {
        set_err(err, err_len, "vki_generate called from a callback of the same batch manager (it would wait on itself)");
        return VKI_ERR_INVALID_ARG;
    }
    if (p->n_stops && !p->stops) {
        set_err(err, err_len, "stops: NULL with n_stops > 0");
        return VKI_ERR_INVALID_ARG;
    }
    return VKI_OK;
}

/* Token ids for the request, in the two-pass contract of vki_tokenize / vki_chat_tokenize: a
 * buffer too small is answered with the count needed. */
typedef vki_status (*tokens_fn)(const void *src, int32_t *out, size_t cap, size_t *n, char *err, size_t err_len);

/* The body of both calls: defaults, checks, the ids, the run, the result. */
static vki_status generate(vki_batch_manager *bm, const vki_generate_params *params, tokens_fn tokens,
                           const void *src, const chat_template *tmpl, size_t cap, vki_generate_result *result,
                           char *err, size_t err_len)
{
    vki_generate_params defaults = vki_generate_default_params();
    const vki_generate_params *p = params ? params : &defaults;
    set_err(err, err_len, "");
    if (result)
        memset(result, 0, sizeof *result);
    vki_status st = start(bm, p, err, err_len);
    if (st != VKI_OK)
        return st;
    size_t n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    st = ids ? tokens(src, ids, cap, &n, err, err_len) : VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_ERR_INVALID_ARG && n > cap) {
        int32_t *more = realloc(ids, (cap = n) * sizeof *ids);
        st = more ? tokens(src, ids = more, cap, &n, err, err_len) : VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    if (st == VKI_OK) {
        gen_call g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .bm = bm, .p = p,
                      .tmpl = tmpl, .t0 = now_ms()};
        st = run(bm, ids, n, p, &g, err, err_len);
        if (result)
            *result = g.res;
        pthread_cond_destroy(&g.cv);
        pthread_mutex_destroy(&g.mu);
    } else if (err && err_len && !err[0]) {
        set_err(err, err_len, vki_status_str(st));
    }
    free(ids);
    return st;
}

typedef struct text_src {
    const vki_tokenizer *tok;
    const char *text;
} text_src;

static vki_status text_tokens(const void *src, int32_t *out, size_t cap, size_t *n, char *err, size_t err_len)
{
    const text_src *t = src;
    (void)err, (void)err_len;
    return vki_tokenize(t->tok, t->text, strlen(t->text), true, false, out, cap, n);
}

typedef struct chat_src {
    const vki_chat_template *tmpl;
    const vki_chat_message *msgs;
    size_t n;
} chat_src;

static vki_status chat_tokens(const void *src, int32_t *out, size_t cap, size_t *n, char *err, size_t err_len)
{
    const chat_src *c = src;
    return vki_chat_tokenize(c->tmpl, c->msgs, c->n, true, out, cap, n, err, err_len);
}

vki_status vki_generate(vki_batch_manager *bm, const char *prompt, const vki_generate_params *p,
                        vki_generate_result *result, char *err, size_t err_len)
{
    if (!prompt) {
        set_err(err, err_len, "prompt: NULL");
        return VKI_ERR_INVALID_ARG;
    }
    text_src src = {bm ? bm->be.tok : NULL, prompt};
    /* bytes + BOS/EOS + a space prefix: usually enough at once */
    return generate(bm, p, text_tokens, &src, NULL, strlen(prompt) + 8, result, err, err_len);
}

vki_status vki_generate_chat(vki_batch_manager *bm, const vki_chat_template *tmpl, const vki_chat_message *msgs,
                             size_t n_msgs, const vki_generate_params *p, vki_generate_result *result, char *err,
                             size_t err_len)
{
    chat_src src = {tmpl ? tmpl : bm ? bm->be.chat : NULL, msgs, n_msgs};
    if (bm && bm->be.tok && !src.tmpl) {
        set_err(err, err_len, "no chat template (the executor has none; pass one)");
        return VKI_ERR_INVALID_ARG;
    }
    return generate(bm, p, chat_tokens, &src, src.tmpl ? chat_api_template(src.tmpl) : NULL, 256, result, err,
                    err_len);
}
