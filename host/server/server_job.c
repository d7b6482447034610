/* A generation job's life: submission through the push interface (always streaming inside, so
 * stop strings end a request early whether or not the client streams), the worker-thread
 * callback that appends tokens into preallocated arrays and wakes the HTTP thread through an
 * eventfd, the HTTP thread's wait (tokens, or the client socket closing), and the output: one
 * JSON answer, or Server-Sent Events. Text comes from host/textstream (UTF-8 safe, stop strings
 * held back); on a stop string the request is cancelled and reported as finish_reason "stop". */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "host/server/server.h"

srv_job *srv_job_new(srv *s, bool chat)
{
    srv_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->evfd = eventfd(0, EFD_CLOEXEC);
    if (j->evfd < 0 || pthread_mutex_init(&j->mu, NULL)) {
        if (j->evfd >= 0)
            close(j->evfd);
        free(j);
        return NULL;
    }
    j->s = s;
    j->chat = chat;
    j->refs = 1;
    j->fd = -1;
    j->sampling = vki_sampling_default_params();
    j->sampling.temperature = 1.0f; /* the OpenAI API's default (the library's is greedy) */
    j->created = (long long)time(NULL);
    j->outcome = SRV_OUT_ERROR;
    return j;
}

static void job_free(srv_job *j)
{
    close(j->evfd);
    pthread_mutex_destroy(&j->mu);
    free(j->prompt);
    free(j->bias);
    for (uint32_t i = 0; i < j->n_stops; i++)
        free(j->stops[i]);
    free(j->tok);
    free(j->lp);
    free(j->top_id);
    free(j->top_lp);
    vki_text_stream_free(j->ts);
    strbuf_free(&j->text);
    strbuf_free(&j->out);
    cJSON_Delete(j->lp_all);
    free(j);
}

void srv_job_release(srv_job *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (!left)
        job_free(j);
}

void srv_job_ref(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

/* ---- the worker side ------------------------------------------------------------------------ */

/* Runs on the batch manager's worker thread: O(1 + top) per token, no allocation. */
static void on_response(void *user, const vki_response *r)
{
    srv_job *j = user;
    srv *s = j->s;
    double now = srv_now();
    pthread_mutex_lock(&j->mu);
    uint32_t n_new = 0;
    for (uint32_t k = 0; k < r->n_tokens && j->n_recv < j->max_tokens; k++, n_new++) {
        uint32_t i = j->n_recv++;
        j->tok[i] = r->tokens[k];
        if (j->lp)
            j->lp[i] = r->logprobs ? r->logprobs[k] : 0.0f;
        for (uint32_t t = 0; t < j->n_top; t++) {
            bool have = r->top_tokens && t < r->n_top;
            j->top_id[(size_t)i * j->n_top + t] = have ? r->top_tokens[(size_t)k * r->n_top + t] : -1;
            j->top_lp[(size_t)i * j->n_top + t] = have ? r->top_logprobs[(size_t)k * r->n_top + t] : -INFINITY;
        }
    }
    double t_prev = j->t_last;
    bool first = n_new && j->t_first == 0;
    if (n_new) {
        if (first)
            j->t_first = now;
        j->t_last = now;
    }
    if (r->final) {
        j->final = true;
        j->finish = r->finish;
        snprintf(j->error, sizeof j->error, "%s", r->error ? r->error : "");
    }
    double t_arrive = j->t_arrive;
    bool any = j->n_recv > 0;
    pthread_mutex_unlock(&j->mu);
    if (first)
        srv_metrics_observe(&s->m, &s->m.ttft, now - t_arrive);
    else if (n_new)
        srv_metrics_observe(&s->m, &s->m.itl, now - t_prev);
    if (n_new)
        srv_metrics_tokens(&s->m, 0, n_new);
    if (r->final && any)
        srv_metrics_observe(&s->m, &s->m.e2e, now - t_arrive);
    uint64_t one = 1;
    ssize_t w = write(j->evfd, &one, sizeof one); /* cannot fail short of a counter overflow */
    (void)w;
    if (!r->final)
        return;
    /* There is no status in a response: a lost device shows in the error text of the step. */
    bool lost = r->finish == VKI_FINISH_ERROR && r->status == VKI_ERR_DEVICE_LOST;
    pthread_mutex_lock(&s->mu);
    s->device_lost |= lost;
    s->n_active--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    srv_job_release(j); /* the batch manager's reference */
}

bool srv_job_submit(srv_job *j, srv_error *e)
{
    srv *s = j->s;
    vki_request req = {.prompt = j->prompt, .n_prompt = j->n_prompt, .max_new_tokens = j->max_tokens,
                       .ignore_eos = j->ignore_eos, .sampling = j->sampling, .streaming = true};
    char err[256] = "";
    vki_status st = VKI_ERR_SHUTDOWN;
    srv_job_ref(j); /* for the batch manager: its final response may come before submit returns */
    pthread_mutex_lock(&s->mu);
    bool lost = s->device_lost;
    if (s->bm && !s->draining && !lost) {
        req.id = j->id = s->next_id++;
        snprintf(j->cmpl_id, sizeof j->cmpl_id, "%s-%llx%08llx", j->chat ? "chatcmpl" : "cmpl",
                 (unsigned long long)s->t_start, (unsigned long long)j->id);
        st = vki_batch_submit(s->bm, &req, on_response, j, err, sizeof err);
        if (st == VKI_OK) {
            s->n_active++;
            j->submitted = true;
        }
    }
    uint32_t max_queue = s->p.batch.max_queue;
    pthread_mutex_unlock(&s->mu);
    if (st == VKI_OK) {
        srv_metrics_tokens(&s->m, j->n_prompt, 0);
        return true;
    }
    srv_job_release(j);
    if (st == VKI_RETRY_QUEUE_FULL) {
        srv_err(e, 429, NULL, "the request queue is full (%u waiting); retry later", max_queue);
        e->type = "rate_limit_error";
        e->code = "rate_limit_exceeded";
    } else if (st == VKI_ERR_INVALID_ARG) {
        bool mt = !strncmp(err, "max_new_tokens", 14);
        srv_err(e, 400, mt ? "max_tokens" : j->chat ? "messages" : "prompt", "%s", err);
    } else if (st == VKI_ERR_SHUTDOWN || st == VKI_ERR_DEVICE_LOST || lost) {
        srv_err(e, 503, NULL, "%s", lost ? "the device was lost; the server must be restarted"
                                         : "the server is shutting down");
        e->type = "server_error";
        e->code = "service_unavailable";
    } else {
        srv_err(e, 500, NULL, "cannot queue the request: %s", vki_status_str(st));
        e->type = "server_error";
    }
    return false;
}

void srv_job_cancel(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    bool done = j->final;
    pthread_mutex_unlock(&j->mu);
    if (!j->submitted || done)
        return;
    srv *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (s->bm) /* ids are never reused: a request that finished meanwhile gives NOT_FOUND */
        vki_batch_cancel(s->bm, j->id);
    pthread_mutex_unlock(&s->mu);
}

void srv_job_count(srv_job *j)
{
    if (j->counted)
        return;
    j->counted = true;
    srv_metrics_outcome(&j->s->m, j->outcome);
}

void srv_job_gone(srv_job *j)
{
    j->gone = true;
    j->outcome = SRV_OUT_CANCELLED;
    srv_job_count(j);
    srv_job_cancel(j);
}

/* ---- the HTTP side: waiting ----------------------------------------------------------------- */

enum { EV_DATA = 1, EV_GONE = 2 };

/* Blocks until there are new tokens or the final response, or the client closed its socket. The
 * eventfd is level-triggered (a counter), so a write between the check and poll() still wakes
 * it. The socket is checked (without waiting) even while tokens flow. */
static int job_wait(srv_job *j)
{
    struct pollfd pf[2] = {{.fd = j->evfd, .events = POLLIN}, {.fd = j->fd, .events = POLLRDHUP}};
    for (;;) {
        pthread_mutex_lock(&j->mu);
        bool ready = j->n_recv > j->n_used || (j->final && !j->final_seen);
        pthread_mutex_unlock(&j->mu);
        int rc = poll(pf, 2, ready ? 0 : -1);
        if (rc < 0 && errno != EINTR)
            return EV_GONE; /* cannot wait: treat the client as gone (the request is cancelled) */
        if (rc > 0 && (pf[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
            return EV_GONE;
        if (rc > 0 && (pf[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t r = read(j->evfd, &v, sizeof v);
            (void)r;
        }
        if (ready)
            return EV_DATA;
    }
}

/* ---- the HTTP side: text and logprobs ------------------------------------------------------ */

/* A token's text for JSON: the piece (control tokens shown), with bytes that are not valid UTF-8
 * written as "\xNN". raw[256] receives the piece's bytes, *n_raw their count; out[cap] the text. */
static void token_text(const vki_tokenizer *tok, int32_t id, char *out, size_t cap, char *raw, size_t *n_raw)
{
    size_t n = 0, o = 0;
    if (vki_token_to_piece(tok, id, true, raw, 256, &n) != VKI_OK)
        n = 0;
    *n_raw = n;
    for (size_t i = 0; i < n && o + 5 < cap;) {
        unsigned char c = (unsigned char)raw[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = ((unsigned char)raw[i + k] & 0xC0) == 0x80;
        if (ok && o + len < cap) {
            memcpy(out + o, raw + i, len);
            o += len;
            i += len;
        } else {
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
            i++;
        }
    }
    out[o] = 0;
}

static double finite_lp(float x) { return isfinite(x) ? x : -9999.0; /* JSON has no -inf; vLLM's value */ }

static cJSON *bytes_array(const char *raw, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw[i]));
    return a;
}

/* Chat: one entry of logprobs.content. */
static cJSON *chat_lp_entry(srv_job *j, uint32_t i)
{
    const vki_tokenizer *tok = j->s->tok;
    char text[1040], raw[256];
    size_t n_raw;
    cJSON *o = cJSON_CreateObject();
    token_text(tok, j->tok[i], text, sizeof text, raw, &n_raw);
    cJSON_AddStringToObject(o, "token", text);
    cJSON_AddNumberToObject(o, "logprob", finite_lp(j->lp[i]));
    cJSON_AddItemToObject(o, "bytes", bytes_array(raw, n_raw));
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (uint32_t t = 0; t < j->n_top; t++) {
        int32_t id = j->top_id[(size_t)i * j->n_top + t];
        if (id < 0)
            continue;
        cJSON *a = cJSON_CreateObject();
        token_text(tok, id, text, sizeof text, raw, &n_raw);
        cJSON_AddStringToObject(a, "token", text);
        cJSON_AddNumberToObject(a, "logprob", finite_lp(j->top_lp[(size_t)i * j->n_top + t]));
        cJSON_AddItemToObject(a, "bytes", bytes_array(raw, n_raw));
        cJSON_AddItemToArray(top, a);
    }
    return o;
}

static cJSON *arr(cJSON *o, const char *key)
{
    cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    return a ? a : cJSON_AddArrayToObject(o, key);
}

/* Completions: token i appended to the tokens / token_logprobs / top_logprobs / text_offset
 * arrays of lp. text_offset: the byte offset of the token's text in the completion. */
static void cmpl_lp_add(srv_job *j, cJSON *lp, uint32_t i, size_t offset)
{
    const vki_tokenizer *tok = j->s->tok;
    char text[1040], raw[256];
    size_t n_raw;
    token_text(tok, j->tok[i], text, sizeof text, raw, &n_raw);
    cJSON_AddItemToArray(arr(lp, "tokens"), cJSON_CreateString(text));
    cJSON_AddItemToArray(arr(lp, "token_logprobs"), cJSON_CreateNumber(finite_lp(j->lp[i])));
    cJSON *top = cJSON_CreateObject();
    for (uint32_t t = 0; t < j->n_top; t++) {
        int32_t id = j->top_id[(size_t)i * j->n_top + t];
        if (id < 0)
            continue;
        token_text(tok, id, text, sizeof text, raw, &n_raw);
        if (!cJSON_GetObjectItemCaseSensitive(top, text)) /* alternatives with one text: the best */
            cJSON_AddNumberToObject(top, text, finite_lp(j->top_lp[(size_t)i * j->n_top + t]));
    }
    cJSON_AddItemToArray(arr(lp, "top_logprobs"), top);
    cJSON_AddItemToArray(arr(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

/* Turns the tokens received since the last call into text (appended to text) and logprob
 * entries (into lp: an array for chat, an object for completions; NULL: none). At the final
 * response, flushes what the text stream held back. A stop string cancels the request; later
 * tokens are not shown and not counted. */
static bool job_drain(srv_job *j, strbuf *text, cJSON *lp)
{
    pthread_mutex_lock(&j->mu);
    uint32_t n = j->n_recv;
    bool fin = j->final;
    pthread_mutex_unlock(&j->mu);
    bool ok = true;
    for (uint32_t i = j->n_used; i < n && !j->stop_hit; i++) {
        const char *t;
        size_t len, piece = 0;
        bool stopped = false;
        if (vki_text_stream_push(j->ts, j->tok[i], &t, &len, &stopped) != VKI_OK)
            return false;
        if (lp && j->chat)
            cJSON_AddItemToArray(lp, chat_lp_entry(j, i));
        else if (lp)
            cmpl_lp_add(j, lp, i, j->text_bytes);
        char pbuf[256];
        if (lp && !j->chat && vki_token_to_piece(j->s->tok, j->tok[i], false, pbuf, sizeof pbuf, &piece) == VKI_OK)
            j->text_bytes += piece;
        ok &= strbuf_put(text, t, len);
        j->n_counted = i + 1;
        if (stopped) {
            j->stop_hit = true;
            srv_job_cancel(j);
        }
    }
    j->n_used = n;
    if (fin && !j->final_seen) {
        j->final_seen = true;
        const char *t;
        size_t len;
        if (!j->stop_hit && vki_text_stream_finish(j->ts, &t, &len) == VKI_OK)
            ok &= strbuf_put(text, t, len);
    }
    return ok;
}

static const char *finish_reason(const srv_job *j)
{
    if (j->stop_hit || j->finish == VKI_FINISH_EOS || j->finish == VKI_FINISH_STOP)
        return "stop";
    return j->finish == VKI_FINISH_LENGTH ? "length" : "abort";
}

static srv_outcome job_outcome(const srv_job *j)
{
    if (j->stop_hit || j->finish == VKI_FINISH_EOS || j->finish == VKI_FINISH_STOP)
        return SRV_OUT_STOP;
    if (j->finish == VKI_FINISH_LENGTH)
        return SRV_OUT_LENGTH;
    return j->finish == VKI_FINISH_CANCELLED ? (j->gone ? SRV_OUT_CANCELLED : SRV_OUT_ABORTED) : SRV_OUT_ERROR;
}

/* A final response that is not an answer: engine error, or aborted by the shutdown. */
static bool job_failed(const srv_job *j, srv_error *e)
{
    if (j->stop_hit || j->finish == VKI_FINISH_EOS || j->finish == VKI_FINISH_STOP || j->finish == VKI_FINISH_LENGTH)
        return false;
    if (j->finish == VKI_FINISH_CANCELLED)
        srv_err(e, 503, NULL, "the server shut down before the request finished (%u tokens generated)", j->n_recv);
    else
        srv_err(e, 500, NULL, "generation failed: %s", j->error[0] ? j->error : "unknown error");
    e->type = "server_error";
    return true;
}

static cJSON *usage_json(const srv_job *j)
{
    uint32_t gen = j->stop_hit ? j->n_counted : j->n_recv;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)j->n_prompt + gen);
    return u;
}

static cJSON *envelope(const srv_job *j, bool chunk)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->cmpl_id);
    cJSON_AddStringToObject(o, "object", j->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                 : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->s->model_id);
    cJSON_AddStringToObject(o, "system_fingerprint", "vkinfer");
    return o;
}

/* ---- non-streaming ------------------------------------------------------------------------ */

static char *answer_json(srv_job *j)
{
    cJSON *o = envelope(j, false);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    const char *text = j->text.p ? j->text.p : "";
    if (j->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    if (j->lp_all && j->chat) {
        cJSON *lp = cJSON_AddObjectToObject(c, "logprobs");
        cJSON_AddItemToObject(lp, "content", j->lp_all);
        j->lp_all = NULL;
    } else if (j->lp_all) {
        cJSON_AddItemToObject(c, "logprobs", j->lp_all);
        j->lp_all = NULL;
    } else {
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", finish_reason(j));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

unsigned srv_job_run_blocking(srv_job *j, char **body)
{
    *body = NULL;
    bool ok = true;
    while (ok && !j->final_seen) {
        if (job_wait(j) == EV_GONE) {
            srv_job_gone(j);
            return 0;
        }
        ok = job_drain(j, &j->text, j->lp_all);
    }
    srv_error e;
    if (!ok) {
        srv_job_cancel(j);
        j->outcome = SRV_OUT_ERROR;
    } else {
        j->outcome = job_outcome(j);
        srv_job_count(j);
        if (job_failed(j, &e)) {
            *body = srv_error_json(&e);
            return e.http;
        }
        if ((*body = answer_json(j)))
            return 200;
    }
    srv_job_count(j);
    srv_err(&e, 500, NULL, "out of memory while building the answer");
    e.type = "server_error";
    *body = srv_error_json(&e);
    return e.http;
}

/* ---- streaming ------------------------------------------------------------------------------ */

static bool sse_event(srv_job *j, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    bool ok = s && strbuf_put(&j->out, "data: ", 6) && strbuf_put(&j->out, s, strlen(s)) &&
              strbuf_put(&j->out, "\n\n", 2);
    cJSON_free(s);
    return ok;
}

/* One chunk: text (may be empty), logprob entries (may be NULL), finish reason (NULL: none). */
static bool sse_chunk(srv_job *j, const char *text, bool role, cJSON *lp, const char *finish)
{
    cJSON *o = envelope(j, true);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    if (j->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (text)
            cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text ? text : "");
    }
    if (lp && j->chat)
        cJSON_AddItemToObject(cJSON_AddObjectToObject(c, "logprobs"), "content", lp);
    else if (lp)
        cJSON_AddItemToObject(c, "logprobs", lp);
    else
        cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    if (j->include_usage)
        cJSON_AddNullToObject(o, "usage");
    return sse_event(j, o);
}

/* The end of a stream: the finish chunk (or an error event), the usage chunk, [DONE]. */
static bool sse_end(srv_job *j)
{
    srv_error e;
    bool ok;
    j->outcome = job_outcome(j);
    srv_job_count(j);
    if (job_failed(j, &e)) {
        char *s = srv_error_json(&e);
        ok = s && strbuf_printf(&j->out, "data: %s\n\n", s);
        free(s);
    } else {
        ok = sse_chunk(j, j->chat ? NULL : "", false, NULL, finish_reason(j));
        if (ok && j->include_usage) {
            cJSON *o = envelope(j, true);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(j));
            ok = sse_event(j, o);
        }
    }
    j->phase = 2;
    return ok && strbuf_put(&j->out, "data: [DONE]\n\n", 14);
}

/* Waits for tokens and formats what came into j->out. false: stop the stream with an error
 * (the client went away, or no memory). */
static bool sse_step(srv_job *j)
{
    if (j->phase == 0) { /* chat streams open with the role */
        j->phase = 1;
        return !j->chat || sse_chunk(j, "", true, NULL, NULL);
    }
    if (job_wait(j) == EV_GONE) {
        srv_job_gone(j);
        return false;
    }
    strbuf text = {0};
    cJSON *lp = j->want_lp ? (j->chat ? cJSON_CreateArray() : cJSON_CreateObject()) : NULL;
    bool ok = job_drain(j, &text, lp) && (!j->want_lp || lp);
    if (lp && !lp->child) { /* no tokens came (only the final response) */
        cJSON_Delete(lp);
        lp = NULL;
    }
    if (ok && (text.len || lp))
        ok = sse_chunk(j, text.p ? text.p : "", false, lp, NULL); /* takes lp */
    else
        cJSON_Delete(lp);
    strbuf_free(&text);
    if (ok && j->final_seen)
        ok = sse_end(j);
    if (!ok)
        srv_job_cancel(j);
    return ok;
}

ssize_t srv_job_sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    srv_job *j = cls;
    while (j->out_pos >= j->out.len) {
        strbuf_clear(&j->out);
        j->out_pos = 0;
        if (j->phase == 2)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (!sse_step(j))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = j->out.len - j->out_pos;
    if (n > max)
        n = max;
    memcpy(buf, j->out.p + j->out_pos, n);
    j->out_pos += n;
    return (ssize_t)n;
}

void srv_job_sse_free(void *cls) { srv_job_release(cls); }
