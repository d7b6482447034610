/* A generation job's life: its n choices submitted through the push interface (always streaming
 * inside, so stop strings end a choice early whether or not the client streams), the
 * worker-thread callback that appends tokens (arrays grown by doubling: a request costs what it
 * generates, not what max_tokens allows) and wakes the handler through an eventfd, the handler's
 * wait (tokens, or the client socket closing), and the output: one JSON answer, or Server-Sent
 * Events. Text comes from vki_text_stream (UTF-8 safe, stop strings held back); on a stop string
 * the choice is cancelled and reported as finish_reason "stop".
 *
 * n > 1: choice 0 is submitted alone; when its first token arrives its prompt's full KV blocks
 * are sealed in the prefix cache, and the other choices are submitted then, so they take those
 * blocks instead of computing the prompt again (each recomputes at most its last partial block).
 * Choice i samples with seed + i when the request has a seed, else with its own drawn seed. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

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
    j->n = 1;
    j->skip_special = true;
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
    free(j->prompt_text);
    free(j->rendered);
    free(j->bias);
    free(j->stop_ids);
    for (uint32_t i = 0; i < j->n_stops; i++)
        free(j->stops[i]);
    srv_struct_free(j);
    for (uint32_t i = 0; i < SRV_MAX_N; i++) {
        srv_choice *ch = &j->ch[i];
        srv_toks *all[] = {&ch->w, &ch->h};
        for (int k = 0; k < 2; k++) {
            free(all[k]->tok);
            free(all[k]->lp);
            free(all[k]->top_id);
            free(all[k]->top_lp);
        }
        vki_text_stream_free(ch->ts);
        free(ch->rows);
        strbuf_free(&ch->text);
        cJSON_Delete(ch->lp_all);
    }
    free(j);
}

static void job_unref(srv_job *j, int n)
{
    pthread_mutex_lock(&j->mu);
    int left = j->refs -= n;
    pthread_mutex_unlock(&j->mu);
    if (!left)
        job_free(j);
}

void srv_job_release(srv_job *j)
{
    if (j)
        job_unref(j, 1);
}

/* ---- the worker side ------------------------------------------------------------------------ */

/* Room for `need` tokens in t (doubling, at most max_tokens): the worker's arrays and the
 * handler's copy grow the same way. */
static bool toks_reserve(const srv_job *j, srv_toks *t, uint32_t need)
{
    if (need <= t->cap)
        return true;
    uint32_t cap = t->cap ? t->cap : 16;
    while (cap < need)
        cap *= 2;
    if (cap > j->max_tokens && need <= j->max_tokens)
        cap = j->max_tokens;
    size_t nt = (size_t)cap * j->n_top;
    int32_t *id = realloc(t->tok, (size_t)cap * sizeof *id);
    if (id)
        t->tok = id;
    float *lp = j->want_lp ? realloc(t->lp, (size_t)cap * sizeof *lp) : NULL;
    if (lp)
        t->lp = lp;
    int32_t *ti = nt ? realloc(t->top_id, nt * sizeof *ti) : NULL;
    if (ti)
        t->top_id = ti;
    float *tl = nt ? realloc(t->top_lp, nt * sizeof *tl) : NULL;
    if (tl)
        t->top_lp = tl;
    if (!id || (j->want_lp && !lp) || (nt && (!ti || !tl)))
        return false;
    t->cap = cap;
    return true;
}

/* Copies entries [from, to) of src into dst (which has room). */
static void toks_copy(const srv_job *j, srv_toks *dst, const srv_toks *src, uint32_t from, uint32_t to)
{
    size_t n = to - from, nt = j->n_top;
    if (to <= from)
        return;
    memcpy(dst->tok + from, src->tok + from, n * sizeof *dst->tok);
    if (j->want_lp)
        memcpy(dst->lp + from, src->lp + from, n * sizeof *dst->lp);
    if (nt) {
        memcpy(dst->top_id + from * nt, src->top_id + from * nt, n * nt * sizeof *dst->top_id);
        memcpy(dst->top_lp + from * nt, src->top_lp + from * nt, n * nt * sizeof *dst->top_lp);
    }
}

static void submit_rest(srv_job *j, bool ok, vki_finish_reason why, const char *error);

/* Room for n generation-logits rows of n_vocab in ch (doubling, at most max_tokens). */
static bool rows_reserve(const srv_job *j, srv_choice *ch, uint32_t n)
{
    if (n <= ch->rows_cap)
        return true;
    size_t V = j->s->info.n_vocab;
    uint32_t cap = ch->rows_cap ? 2 * ch->rows_cap : 16;
    cap = cap < n ? n : cap > j->max_tokens ? j->max_tokens : cap;
    float *r = realloc(ch->rows, (size_t)cap * V * sizeof *r);
    if (!r)
        return false;
    ch->rows = r;
    ch->rows_cap = cap;
    return true;
}

/* Appends n rows ([n][n_vocab]) to ch's generation logits: false when out of memory. */
static bool rows_put(const srv_job *j, srv_choice *ch, const float *rows, uint32_t n)
{
    size_t V = j->s->info.n_vocab;
    if (!j->want_gen_logits || !n)
        return true;
    if (!rows || !rows_reserve(j, ch, ch->n_rows + n))
        return false;
    memcpy(ch->rows + (size_t)ch->n_rows * V, rows, (size_t)n * V * sizeof *rows);
    ch->n_rows += n;
    return true;
}

/* Entry i of t: token tok, its logprob (lp may be NULL: 0) and alternatives ([n_top] of top_tok /
 * top_lp, may be NULL: none) as the job wants them. */
static void toks_put(const srv_job *j, srv_toks *t, uint32_t i, int32_t tok, const float *lp, const int32_t *top_tok,
                     const float *top_lp, uint32_t n_top)
{
    t->tok[i] = tok;
    if (j->want_lp)
        t->lp[i] = lp ? *lp : 0.0f;
    for (uint32_t k = 0; k < j->n_top; k++) {
        bool have = top_tok && k < n_top;
        t->top_id[(size_t)i * j->n_top + k] = have ? top_tok[k] : -1;
        t->top_lp[(size_t)i * j->n_top + k] = have ? top_lp[k] : -INFINITY;
    }
}

/* use_beam_search: the one request's final response spreads its n best beams over the choices
 * (choice i = beam i, with its own logprobs; the batch manager's references of choices 1..n-1 go
 * with it). Worker thread, under j->mu. O(tokens of the n beams * (1 + top_logprobs)). */
static void beams_to_choices(srv_job *j, const vki_response *r)
{
    for (uint32_t i = 1; i < j->n; i++) {
        srv_choice *ch = &j->ch[i];
        uint32_t len = i < r->n_beams ? r->beam_lengths[i] : 0;
        len = len < j->max_tokens ? len : j->max_tokens;
        if (len && !toks_reserve(j, &ch->w, len))
            ch->oom = true;
        const float *lp = r->beam_logprobs ? r->beam_logprobs[i] : NULL;
        const int32_t *tt = r->beam_top_tokens ? r->beam_top_tokens[i] : NULL;
        const float *tl = r->beam_top_logprobs ? r->beam_top_logprobs[i] : NULL;
        for (uint32_t k = 0; k < len && !ch->oom; k++)
            toks_put(j, &ch->w, k, r->beam_tokens[i][k], lp ? lp + k : NULL, tt ? tt + (size_t)k * r->n_top : NULL,
                     tl ? tl + (size_t)k * r->n_top : NULL, r->n_top);
        if (!ch->oom && !rows_put(j, ch, r->beam_generation_logits ? r->beam_generation_logits[i] : NULL, len))
            ch->oom = r->finish != VKI_FINISH_ERROR; /* no rows after an error: the error is the answer */
        ch->n_recv = ch->oom ? 0 : len;
        ch->final = true;
        int32_t last = len ? r->beam_tokens[i][len - 1] : -1;
        ch->finish = i >= r->n_beams ? r->finish : len && vki_token_is_eog(j->s->tok, last) ? VKI_FINISH_EOS
                                                                                       : VKI_FINISH_LENGTH;
        for (uint32_t k = 0; len && k < j->n_stop_ids; k++)
            ch->finish = j->stop_ids[k] == last ? VKI_FINISH_STOP : ch->finish;
        ch->status = r->status;
        snprintf(ch->error, sizeof ch->error, "%s", r->error ? r->error : "");
    }
}

/* Runs on the batch manager's worker thread: O(1 + top) per token (amortised growth). */
static void on_response(void *user, const vki_response *r)
{
    srv_choice *ch = user;
    srv_job *j = ch->j;
    srv *s = j->s;
    double now = srv_now();
    pthread_mutex_lock(&j->mu);
    uint32_t n_new = 0;
    srv_toks *wt = &ch->w;
    if (r->n_tokens && !ch->oom && !toks_reserve(j, wt, ch->n_recv + r->n_tokens))
        ch->oom = true; /* the handler cancels it and answers 500 */
    for (uint32_t k = 0; k < r->n_tokens && !ch->oom && ch->n_recv < j->max_tokens; k++, n_new++)
        toks_put(j, wt, ch->n_recv++, r->tokens[k], r->logprobs ? r->logprobs + k : NULL,
                 r->top_tokens ? r->top_tokens + (size_t)k * r->n_top : NULL,
                 r->top_logprobs ? r->top_logprobs + (size_t)k * r->n_top : NULL, r->n_top);
    if (n_new && !ch->oom && !rows_put(j, ch, r->generation_logits, n_new))
        ch->oom = r->finish != VKI_FINISH_ERROR;
    bool first_cached = ch->index == 0 && n_new && ch->n_recv == n_new;
    ch->n_cached = r->n_cached;
    double t_prev = ch->t_last;
    bool first = n_new && j->t_first == 0;
    if (first)
        j->t_first = now;
    if (n_new)
        ch->t_last = now;
    if (r->final) {
        ch->final = true;
        ch->finish = r->finish;
        ch->status = r->status;
        snprintf(ch->error, sizeof ch->error, "%s", r->error ? r->error : "");
        if (j->beam_width > 1)
            beams_to_choices(j, r);
    }
    bool kick = ch->index == 0 && j->n > 1 && !j->rest_submitted && (n_new || r->final);
    if (kick)
        j->rest_submitted = true;
    bool rest_ok = !j->gone && (!r->final || r->finish == VKI_FINISH_EOS || r->finish == VKI_FINISH_LENGTH ||
                                r->finish == VKI_FINISH_STOP);
    double t_arrive = j->t_arrive;
    pthread_mutex_unlock(&j->mu);
    if (first)
        srv_metrics_observe(&s->m, &s->m.ttft, now - t_arrive);
    else if (n_new && t_prev > 0)
        srv_metrics_observe(&s->m, &s->m.itl, now - t_prev);
    if (n_new)
        srv_metrics_tokens(&s->m, 0, n_new, first_cached ? r->n_cached : 0);
    if (r->final && ch->n_recv)
        srv_metrics_observe(&s->m, &s->m.e2e, now - t_arrive);
    if (kick)
        submit_rest(j, rest_ok, r->finish, r->error);
    uint64_t one = 1;
    ssize_t w = write(j->evfd, &one, sizeof one); /* cannot fail short of a counter overflow */
    (void)w;
    if (!r->final)
        return;
    bool lost = r->finish == VKI_FINISH_ERROR && r->status == VKI_ERR_DEVICE_LOST;
    pthread_mutex_lock(&s->mu);
    s->device_lost |= lost;
    s->n_active--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (j->beam_width > 1 && j->n > 1)
        job_unref(j, (int)j->n - 1); /* the other choices came with this request */
    srv_job_release(j); /* the batch manager's reference for this choice */
}

/* Submits choice ch (under s->mu). */
static vki_status submit_choice(srv_job *j, srv_choice *ch, char *err, size_t n_err)
{
    srv *s = j->s;
    vki_request req = {.prompt = j->prompt, .n_prompt = j->n_prompt, .max_new_tokens = j->max_tokens,
                       .min_tokens = j->min_tokens, .stop_ids = j->stop_ids, .n_stop_ids = j->n_stop_ids,
                       .ignore_eos = j->ignore_eos, .sampling = j->sampling, .streaming = true,
                       .constraint = {j->so.type, j->so.text.p, j->so.text.len},
                       .beam_width = j->beam_width, .length_penalty = j->length_penalty,
                       .early_stopping = j->early_stopping, .return_generation_logits = j->want_gen_logits};
    req.streaming = j->beam_width <= 1; /* beams: one final response with every beam */
    if (ch->index && j->sampling.has_seed)
        req.sampling.seed = j->sampling.seed + ch->index;
    req.session_id = ch->index ? 0 : j->session_id; /* choice 0 is the conversation's turn */
    vki_status st = VKI_ERR_SHUTDOWN;
    if (s->bm && !s->draining && !s->device_lost) {
        req.id = ch->id = s->next_id++;
        st = vki_batch_submit(s->bm, &req, on_response, ch, err, n_err);
    }
    if (st == VKI_OK) {
        s->n_active++;
        ch->submitted = true;
    }
    return st;
}

/* Choices 1..n-1, once choice 0 has its first token (or ended). ok = false (choice 0 failed or
 * the client is gone): they end with choice 0's reason instead. Worker thread. */
static void submit_rest(srv_job *j, bool ok, vki_finish_reason why, const char *error)
{
    srv *s = j->s;
    int unused = 0;
    for (uint32_t i = 1; i < j->n; i++) {
        srv_choice *ch = &j->ch[i];
        char err[192] = "";
        vki_status st = VKI_ERR_SHUTDOWN;
        if (ok) {
            pthread_mutex_lock(&s->mu);
            st = submit_choice(j, ch, err, sizeof err);
            pthread_mutex_unlock(&s->mu);
        }
        if (st == VKI_OK)
            continue;
        pthread_mutex_lock(&j->mu);
        ch->final = true;
        ch->finish = ok ? VKI_FINISH_ERROR : why == VKI_FINISH_ERROR ? VKI_FINISH_ERROR : VKI_FINISH_CANCELLED;
        ch->status = ok ? st : VKI_OK;
        snprintf(ch->error, sizeof ch->error, "%s", ok ? (err[0] ? err : vki_status_str(st)) : error ? error : "");
        pthread_mutex_unlock(&j->mu);
        unused++;
    }
    if (unused)
        job_unref(j, unused); /* the references taken for them at submission */
}

bool srv_job_submit(srv_job *j, srv_error *e)
{
    srv *s = j->s;
    char err[256] = "";
    pthread_mutex_lock(&j->mu);
    j->refs += (int)j->n; /* one per choice: the batch manager's, until its final response */
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->mu);
    bool lost = s->device_lost;
    snprintf(j->cmpl_id, sizeof j->cmpl_id, "%s-%llx%08llx", j->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)s->t_start, (unsigned long long)s->next_id);
    j->rest_submitted |= j->beam_width > 1; /* one request holds every choice */
    vki_status st = submit_choice(j, &j->ch[0], err, sizeof err);
    uint32_t max_queue = s->p.batch.max_queue;
    pthread_mutex_unlock(&s->mu);
    if (st == VKI_OK) {
        srv_metrics_tokens(&s->m, j->n_prompt, 0, 0);
        return true;
    }
    job_unref(j, (int)j->n);
    if (st == VKI_RETRY_QUEUE_FULL) {
        srv_err(e, 429, NULL, "the request queue is full (%u waiting); retry later", max_queue);
        e->type = "rate_limit_error";
        e->code = "rate_limit_exceeded";
    } else if (st == VKI_ERR_INVALID_ARG) {
        bool mt = !strncmp(err, "max_new_tokens", 14), bw = !strncmp(err, "beam_width", 10);
        bool gl = !strncmp(err, "return_generation_logits", 24), lp = !strncmp(err, "sampling.logprobs", 17);
        srv_err(e, 400, mt ? "max_tokens" : bw ? "best_of" : gl ? "return_generation_logits" : lp ? "logprobs"
                        : j->chat ? "messages" : "prompt", "%s", err);
    } else if (st == VKI_ERR_SHUTDOWN || st == VKI_ERR_DEVICE_LOST || lost) {
        srv_err(e, 503, NULL, "%s", !lost ? "the server is shutting down"
                                  : s->p.recover_backoff_ms ? "the GPU device was lost; the engine is being recreated, "
                                                              "retry shortly"
                                                            : "the GPU device was lost; the server must be restarted");
        e->code = "service_unavailable";
    } else {
        srv_err(e, 500, NULL, "cannot queue the request: %s", vki_status_str(st));
    }
    return false;
}

static void choice_cancel(srv_choice *ch)
{
    srv_job *j = ch->j;
    pthread_mutex_lock(&j->mu);
    bool live = !ch->final;
    pthread_mutex_unlock(&j->mu);
    if (!live)
        return;
    srv *s = j->s;
    pthread_mutex_lock(&s->mu); /* submitted and id are written under it */
    if (s->bm && ch->submitted) /* ids are never reused: one that finished meanwhile gives NOT_FOUND */
        vki_batch_cancel(s->bm, ch->id);
    pthread_mutex_unlock(&s->mu);
}

static void job_cancel(srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->gone = true; /* choices not yet submitted will not be */
    pthread_mutex_unlock(&j->mu);
    for (uint32_t i = 0; i < j->n; i++)
        choice_cancel(&j->ch[i]);
}

static void job_count(srv_job *j)
{
    if (!j->counted)
        srv_metrics_outcome(&j->s->m, j->outcome);
    j->counted = true;
}

/* The client went away before the answer was complete: cancel, and count the outcome once. */
static void job_gone(srv_job *j)
{
    j->outcome = SRV_OUT_CANCELLED;
    job_count(j);
    job_cancel(j);
}

/* ---- the handler side: waiting ---------------------------------------------------------------- */

int srv_wait_events(int evfd, srv_conn *c, bool ready)
{
    for (;;) {
        struct pollfd pf[2] = {{.fd = evfd, .events = POLLIN}, {.fd = c->fd, .events = c->half_closed ? 0 : POLLRDHUP}};
        int rc = poll(pf, 2, ready ? 0 : c->half_closed ? 1000 : -1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc < 0 || (pf[1].revents & (POLLHUP | POLLERR | POLLNVAL)))
            return SRV_EV_GONE;
        if ((pf[1].revents & POLLRDHUP) || (rc == 0 && !ready)) { /* half-closed: is anyone there? */
            c->half_closed = true;
            if (!srv_probe(c))
                return SRV_EV_GONE;
            continue;
        }
        if (pf[0].revents & POLLIN) {
            uint64_t v;
            ssize_t r = read(evfd, &v, sizeof v);
            (void)r;
        }
        if (ready || (pf[0].revents & POLLIN))
            return SRV_EV_DATA;
    }
}

/* Whether a choice has something new for the handler (under j->mu). */
static bool job_ready(srv_job *j)
{
    bool ready = false;
    pthread_mutex_lock(&j->mu);
    for (uint32_t i = 0; i < j->n && !ready; i++)
        ready = j->ch[i].n_recv > j->ch[i].n_used || (j->ch[i].final && !j->ch[i].final_seen) || j->ch[i].oom;
    pthread_mutex_unlock(&j->mu);
    return ready;
}

static bool job_done(const srv_job *j)
{
    for (uint32_t i = 0; i < j->n; i++)
        if (!j->ch[i].final_seen)
            return false;
    return true;
}

/* ---- text and logprobs ------------------------------------------------------------------------ */

/* A token's text for JSON: the piece (control tokens shown), with bytes that are not valid UTF-8
 * written as "\xNN". raw[256] receives the piece's bytes, *n_raw their count; out[cap] the text. */
void srv_token_text(const vki_tokenizer *tok, int32_t id, char *out, size_t cap, char *raw, size_t *n_raw)
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

cJSON *srv_bytes_json(const char *raw, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)raw[i]));
    return a;
}

/* Chat: one entry of logprobs.content. */
static cJSON *chat_lp_entry(const srv_choice *ch, uint32_t i)
{
    const srv_job *j = ch->j;
    const vki_tokenizer *tok = j->s->tok;
    char text[1040], raw[256];
    size_t n_raw;
    cJSON *o = cJSON_CreateObject();
    srv_token_text(tok, ch->h.tok[i], text, sizeof text, raw, &n_raw);
    cJSON_AddStringToObject(o, "token", text);
    cJSON_AddNumberToObject(o, "logprob", finite_lp(ch->h.lp[i]));
    cJSON_AddItemToObject(o, "bytes", srv_bytes_json(raw, n_raw));
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (uint32_t t = 0; t < j->n_top; t++) {
        int32_t id = ch->h.top_id[(size_t)i * j->n_top + t];
        if (id < 0)
            continue;
        cJSON *a = cJSON_CreateObject();
        srv_token_text(tok, id, text, sizeof text, raw, &n_raw);
        cJSON_AddStringToObject(a, "token", text);
        cJSON_AddNumberToObject(a, "logprob", finite_lp(ch->h.top_lp[(size_t)i * j->n_top + t]));
        cJSON_AddItemToObject(a, "bytes", srv_bytes_json(raw, n_raw));
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
static void cmpl_lp_add(const srv_choice *ch, cJSON *lp, uint32_t i, size_t offset)
{
    const srv_job *j = ch->j;
    const vki_tokenizer *tok = j->s->tok;
    char text[1040], raw[256];
    size_t n_raw;
    srv_token_text(tok, ch->h.tok[i], text, sizeof text, raw, &n_raw);
    cJSON_AddItemToArray(arr(lp, "tokens"), cJSON_CreateString(text));
    cJSON_AddItemToArray(arr(lp, "token_logprobs"), cJSON_CreateNumber(finite_lp(ch->h.lp[i])));
    cJSON *top = cJSON_CreateObject();
    for (uint32_t t = 0; t < j->n_top; t++) {
        int32_t id = ch->h.top_id[(size_t)i * j->n_top + t];
        if (id < 0)
            continue;
        srv_token_text(tok, id, text, sizeof text, raw, &n_raw);
        if (!cJSON_GetObjectItemCaseSensitive(top, text)) /* alternatives with one text: the best */
            cJSON_AddNumberToObject(top, text, finite_lp(ch->h.top_lp[(size_t)i * j->n_top + t]));
    }
    cJSON_AddItemToArray(arr(lp, "top_logprobs"), top);
    cJSON_AddItemToArray(arr(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

/* Turns the tokens ch received since the last call into text (appended to text), logprob
 * entries (into lp: an array for chat, an object for completions; NULL: none) and ids (into ids,
 * NULL: none). At the final response, flushes what the text stream held back. A stop string
 * cancels the choice; later tokens are not shown and not counted. */
static bool choice_drain(srv_choice *ch, strbuf *text, cJSON *lp, cJSON *ids)
{
    srv_job *j = ch->j;
    /* the new entries into the handler's copy: the worker may move its arrays when they grow */
    pthread_mutex_lock(&j->mu);
    uint32_t n = ch->n_recv;
    pthread_mutex_unlock(&j->mu);
    if (!toks_reserve(j, &ch->h, n))
        return false;
    pthread_mutex_lock(&j->mu);
    n = n < ch->n_recv ? n : ch->n_recv;
    bool fin = ch->final && n == ch->n_recv;
    ch->oom_seen = ch->oom;
    toks_copy(j, &ch->h, &ch->w, ch->n_used, n);
    pthread_mutex_unlock(&j->mu);
    bool ok = true;
    for (uint32_t i = ch->n_used; i < n && !ch->stop_hit; i++) {
        const char *t = "";
        size_t len = 0, piece = 0;
        bool stopped = false;
        /* harmony's text shows control tokens, but not "<|return|>" / "<|call|>" that end it */
        bool silent = j->harmony && vki_token_is_eog(j->s->tok, ch->h.tok[i]);
        if (!silent && vki_text_stream_push(ch->ts, ch->h.tok[i], &t, &len, &stopped) != VKI_OK)
            return false;
        if (lp && j->chat)
            cJSON_AddItemToArray(lp, chat_lp_entry(ch, i));
        else if (lp)
            cmpl_lp_add(ch, lp, i, ch->text_bytes);
        if (ids)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(ch->h.tok[i]));
        char pbuf[256];
        if (lp && !j->chat && vki_token_to_piece(j->s->tok, ch->h.tok[i], false, pbuf, sizeof pbuf, &piece) == VKI_OK)
            ch->text_bytes += piece;
        ok &= strbuf_put(text, t, len);
        ch->n_counted = i + 1;
        if (stopped) {
            ch->stop_hit = true;
            choice_cancel(ch);
            int32_t w = vki_text_stream_stop_index(ch->ts);
            if (j->include_stop && w >= 0 && (uint32_t)w < j->n_stops) /* vLLM's include_stop_str_in_output */
                ok &= strbuf_put(text, j->stops[w], strlen(j->stops[w]));
        }
    }
    ch->n_used = n;
    if (fin && !ch->final_seen) {
        ch->final_seen = true;
        const char *t;
        size_t len;
        if (!ch->stop_hit && vki_text_stream_finish(ch->ts, &t, &len) == VKI_OK)
            ok &= strbuf_put(text, t, len);
    }
    return ok;
}

static bool choice_ended_ok(const srv_choice *ch)
{
    return ch->stop_hit || ch->finish == VKI_FINISH_EOS || ch->finish == VKI_FINISH_STOP ||
           ch->finish == VKI_FINISH_LENGTH;
}

static const char *finish_reason(const srv_choice *ch)
{
    if (ch->stop_hit || ch->finish == VKI_FINISH_EOS || ch->finish == VKI_FINISH_STOP)
        return ch->n_calls ? "tool_calls" : "stop";
    return ch->finish == VKI_FINISH_LENGTH ? "length" : "abort";
}

static srv_outcome job_outcome(const srv_job *j)
{
    for (uint32_t i = 0; i < j->n; i++)
        if (!choice_ended_ok(&j->ch[i]))
            return j->ch[i].finish == VKI_FINISH_CANCELLED ? (j->gone ? SRV_OUT_CANCELLED : SRV_OUT_ABORTED)
                                                           : SRV_OUT_ERROR;
    const srv_choice *ch = &j->ch[0];
    return ch->finish == VKI_FINISH_LENGTH && !ch->stop_hit ? SRV_OUT_LENGTH : SRV_OUT_STOP;
}

/* A final response that is not an answer: engine error, out of memory, or the shutdown. */
static bool job_failed(const srv_job *j, srv_error *e)
{
    for (uint32_t i = 0; i < j->n; i++) {
        const srv_choice *ch = &j->ch[i];
        if (ch->oom_seen) {
            srv_err(e, 500, NULL, "out of memory while receiving the tokens of choice %u", i);
            return true;
        }
        if (choice_ended_ok(ch))
            continue;
        if (ch->finish == VKI_FINISH_CANCELLED)
            srv_err(e, 503, NULL, "the server shut down before the request finished (%u tokens generated)",
                    ch->n_recv);
        else
            srv_err(e, 500, NULL, "generation failed: %s", ch->error[0] ? ch->error : "unknown error");
        return true;
    }
    return false;
}

static uint32_t choice_tokens(const srv_choice *ch) { return ch->stop_hit ? ch->n_counted : ch->n_recv; }

static cJSON *usage_json(const srv_job *j)
{
    uint32_t gen = 0;
    for (uint32_t i = 0; i < j->n; i++)
        gen += choice_tokens(&j->ch[i]);
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)j->n_prompt + gen);
    /* what the prefix cache gave the prompt (choice 0; the others share its blocks) */
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", j->ch[0].n_cached);
    return u;
}

static cJSON *id_array(const int32_t *ids, uint32_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
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

static cJSON *answer_choice(srv_job *j, srv_choice *ch)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", ch->index);
    const char *text = ch->text.p ? ch->text.p : "";
    if (j->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        strbuf r = {0}, content = {0};
        size_t n = ch->text.len;
        if (j->think && srv_think_feed(&ch->th, text, n, true, &r, &content)) { /* reasoning apart */
            if (r.len)
                cJSON_AddStringToObject(m, "reasoning_content", r.p);
            text = content.p ? content.p : "", n = content.len;
        }
        if (!srv_struct_answer(ch, text, n, m))
            cJSON_AddStringToObject(m, "content", text); /* out of memory in the parser: the raw text */
        strbuf_free(&r);
        strbuf_free(&content);
    } else if (j->echo) {
        strbuf b = {0};
        strbuf_printf(&b, "%s%s", j->prompt_text ? j->prompt_text : "", text);
        cJSON_AddStringToObject(c, "text", b.p ? b.p : "");
        strbuf_free(&b);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    if (ch->lp_all && j->chat)
        cJSON_AddItemToObject(cJSON_AddObjectToObject(c, "logprobs"), "content", ch->lp_all);
    else if (ch->lp_all)
        cJSON_AddItemToObject(c, "logprobs", ch->lp_all);
    else
        cJSON_AddNullToObject(c, "logprobs");
    ch->lp_all = NULL;
    cJSON_AddStringToObject(c, "finish_reason", finish_reason(ch));
    if (j->return_ids) {
        if (!j->chat)
            cJSON_AddItemToObject(c, "prompt_token_ids", id_array(j->prompt, j->n_prompt));
        cJSON_AddItemToObject(c, "token_ids", id_array(ch->h.tok, choice_tokens(ch)));
    }
    return c;
}

const char *srv_choice_finish(const srv_choice *ch) { return finish_reason(ch); }
uint32_t srv_choice_tokens(const srv_choice *ch) { return choice_tokens(ch); }

static char *answer_json(srv_job *j)
{
    if (j->fmt && !j->fmt->reshape)
        return j->fmt->answer(j);
    cJSON *o = envelope(j, false);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (uint32_t i = 0; i < j->n; i++)
        cJSON_AddItemToArray(choices, answer_choice(j, &j->ch[i]));
    if (j->return_ids && j->chat)
        cJSON_AddItemToObject(o, "prompt_token_ids", id_array(j->prompt, j->n_prompt));
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    if (j->fmt) { /* another protocol's shape of this answer */
        strbuf b = {0};
        if (!j->fmt->reshape(j, o, false, &b))
            strbuf_free(&b);
        return b.p;
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void serve_blocking(srv_job *j, srv_conn *c)
{
    bool ok = true;
    while (ok && !job_done(j)) {
        if (srv_wait_events(j->evfd, c, job_ready(j)) == SRV_EV_GONE) {
            job_gone(j);
            c->close_after = true; /* nothing to send */
            c->status = 499;       /* the access log's "client closed the request" */
            return;
        }
        for (uint32_t i = 0; i < j->n; i++) {
            srv_choice *ch = &j->ch[i];
            ok &= choice_drain(ch, &ch->text, ch->lp_all, NULL);
            if (ch->oom_seen)
                choice_cancel(ch);
        }
    }
    srv_error e;
    j->outcome = ok ? job_outcome(j) : SRV_OUT_ERROR;
    job_count(j);
    if (ok && job_failed(j, &e))
        return srv_reply_error(c, &e);
    char *body = ok ? answer_json(j) : NULL;
    if (body)
        return srv_reply(c, 200, "application/json", body, NULL);
    job_cancel(j);
    srv_err(&e, 500, NULL, "out of memory while building the answer");
    srv_reply_error(c, &e);
}

/* ---- streaming ------------------------------------------------------------------------------ */

bool srv_sse_json(strbuf *out, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    bool ok = s && strbuf_put(out, "data: ", 6) && strbuf_put(out, s, strlen(s)) && strbuf_put(out, "\n\n", 2);
    cJSON_free(s);
    return ok;
}

/* One chunk of choice ch: text (may be NULL), logprob entries and ids (taken; may be NULL),
 * finish reason (NULL: none). delta (chat, taken): the delta object itself, instead of text. */
static bool sse_chunk(srv_job *j, const srv_choice *ch, strbuf *out, const char *text, bool role, cJSON *lp,
                      cJSON *ids, const char *finish, cJSON *delta)
{
    if (j->fmt && !j->fmt->reshape) {
        cJSON_Delete(lp);
        cJSON_Delete(ids);
        return j->fmt->chunk(j, ch, out, text ? text : "", finish);
    }
    cJSON *o = envelope(j, true);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", ch->index);
    if (delta) {
        cJSON_AddItemToObject(c, "delta", delta);
    } else if (j->chat) {
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
    if (ids)
        cJSON_AddItemToObject(c, "token_ids", ids);
    if (role && j->return_ids) /* the first chunk of a choice */
        cJSON_AddItemToObject(j->chat ? o : c, "prompt_token_ids", id_array(j->prompt, j->n_prompt));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), c);
    if (j->include_usage)
        cJSON_AddNullToObject(o, "usage");
    return j->fmt ? j->fmt->reshape(j, o, true, out) : srv_sse_json(out, o);
}

/* Tools: the new text goes through the call parser, each delta it gives is a chunk (OpenAI's
 * delta.content / delta.tool_calls); logprobs and ids ride on the first, or on an empty delta
 * when the parser holds everything back. At the choice's end the parser's rest comes out. Takes
 * lp and ids. */
static bool sse_tool_chunks(srv_job *j, srv_choice *ch, strbuf *out, const strbuf *text, cJSON *lp, cJSON *ids)
{
    cJSON *deltas = cJSON_CreateArray();
    bool ok = deltas && srv_struct_deltas(ch, text->p ? text->p : "", text->len, ch->final_seen, deltas);
    cJSON *d = ok ? cJSON_DetachItemFromArray(deltas, 0) : NULL;
    if (ok && !d && (lp || ids))
        ok = (d = cJSON_CreateObject()) != NULL;
    while (ok && d) {
        ok = sse_chunk(j, ch, out, NULL, false, lp, ids, NULL, d);
        lp = ids = NULL;
        d = cJSON_DetachItemFromArray(deltas, 0);
    }
    cJSON_Delete(d);
    cJSON_Delete(deltas);
    cJSON_Delete(lp);
    cJSON_Delete(ids);
    return ok;
}

/* The chunks of choice ch's new tokens (the opening chunk first: chat's role, completions'
 * echoed prompt), and its finish chunk once it ended. */
static bool sse_choice(srv_job *j, srv_choice *ch, strbuf *out)
{
    bool ok = true;
    if (!ch->role_sent) {
        ch->role_sent = true;
        if (j->chat || j->echo || j->return_ids)
            ok = sse_chunk(j, ch, out, j->chat ? "" : j->echo && j->prompt_text ? j->prompt_text : "", true, NULL,
                           NULL, NULL, NULL);
    }
    strbuf text = {0};
    cJSON *lp = j->want_lp ? (j->chat ? cJSON_CreateArray() : cJSON_CreateObject()) : NULL;
    cJSON *ids = j->return_ids ? cJSON_CreateArray() : NULL;
    ok = ok && choice_drain(ch, &text, lp, ids) && (!j->want_lp || lp) && (!j->return_ids || ids);
    if (ch->oom_seen)
        choice_cancel(ch);
    bool has_lp = lp && lp->child, has_ids = ids && ids->child; /* sse_chunk takes (frees) them */
    if (ok && j->think && (!j->fmt || j->fmt->reshape)) { /* reasoning_content deltas first, then content */
        strbuf r = {0}, content = {0};
        ok = srv_think_feed(&ch->th, text.p ? text.p : "", text.len, ch->final_seen, &r, &content);
        cJSON *d = ok && r.len ? cJSON_CreateObject() : NULL;
        if (d && !cJSON_AddStringToObject(d, "reasoning_content", r.p))
            cJSON_Delete(d), d = NULL, ok = false;
        if (d) { /* sse_chunk takes d, and the logprobs and ids: they ride on this chunk */
            ok = sse_chunk(j, ch, out, NULL, false, has_lp ? lp : NULL, has_ids ? ids : NULL, NULL, d);
            lp = has_lp ? NULL : lp, ids = has_ids ? NULL : ids;
            has_lp = has_ids = false;
        } else if (r.len) {
            ok = false;
        }
        strbuf_free(&text);
        text = content;
        strbuf_free(&r);
    }
    if (ok && ch->tp) { /* tools: content and tool_calls deltas */
        ok = sse_tool_chunks(j, ch, out, &text, has_lp ? lp : NULL, has_ids ? ids : NULL);
        lp = has_lp ? NULL : lp;
        ids = has_ids ? NULL : ids;
    } else if (ok && (text.len || has_lp || has_ids)) {
        ok = sse_chunk(j, ch, out, text.p ? text.p : "", false, has_lp ? lp : NULL, has_ids ? ids : NULL, NULL, NULL);
        lp = has_lp ? NULL : lp;
        ids = has_ids ? NULL : ids;
    }
    cJSON_Delete(lp);
    cJSON_Delete(ids);
    strbuf_free(&text);
    if (ok && ch->final_seen && !ch->end_sent && choice_ended_ok(ch) && !ch->oom_seen) {
        ch->end_sent = true;
        ok = sse_chunk(j, ch, out, j->chat ? NULL : "", false, NULL, NULL, finish_reason(ch), NULL);
    }
    return ok;
}

/* The end of a stream: an error event if a choice failed, the usage chunk, [DONE]. */
static bool sse_end(srv_job *j, strbuf *out)
{
    srv_error e;
    bool ok = true;
    j->outcome = job_outcome(j);
    job_count(j);
    if (j->fmt) {
        bool failed = job_failed(j, &e);
        return j->fmt->end(j, out, failed ? &e : NULL);
    }
    if (job_failed(j, &e)) {
        e.type = e.http >= 500 ? "server_error" : e.type;
        char *s = srv_error_json(&e);
        ok = s && strbuf_printf(out, "data: %s\n\n", s);
        free(s);
    } else if (j->include_usage) {
        cJSON *o = envelope(j, true);
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_json(j));
        ok = srv_sse_json(out, o);
    }
    return ok && strbuf_put(out, "data: [DONE]\n\n", 14);
}

static void serve_stream(srv_job *j, srv_conn *c)
{
    if (!srv_stream_begin(c, j->fmt && j->fmt->stream_type ? j->fmt->stream_type : "text/event-stream"))
        return job_gone(j);
    strbuf out = {0};
    bool ok = true;
    for (bool first = true; ok;) {
        strbuf_clear(&out);
        if (!first && srv_wait_events(j->evfd, c, job_ready(j)) == SRV_EV_GONE) {
            job_gone(j);
            break;
        }
        first = false;
        for (uint32_t i = 0; ok && i < j->n; i++)
            ok = sse_choice(j, &j->ch[i], &out);
        bool done = ok && job_done(j);
        if (done)
            ok = sse_end(j, &out);
        if (!ok) { /* out of memory: end the stream and the request */
            job_cancel(j);
            break;
        }
        if (!srv_stream_send(c, out.p, out.len)) {
            job_gone(j);
            break;
        }
        if (done) {
            srv_stream_end(c);
            break;
        }
    }
    if (!ok || !job_done(j))
        c->close_after = true;
    strbuf_free(&out);
}

void srv_job_serve(srv_job *j, srv_conn *c)
{
    if (j->stream)
        serve_stream(j, c);
    else
        serve_blocking(j, c);
    /* the access log's fields */
    pthread_mutex_lock(&j->mu);
    double t_first = j->t_first;
    c->acc.cached = j->ch[0].n_cached;
    pthread_mutex_unlock(&j->mu);
    c->acc.ttft_ms = t_first > 0 ? (t_first - j->t_arrive) * 1e3 : -1;
    c->acc.output = 0;
    for (uint32_t i = 0; i < j->n; i++)
        c->acc.output += choice_tokens(&j->ch[i]);
    c->acc.finish = j->outcome == SRV_OUT_CANCELLED ? "cancelled" : j->outcome == SRV_OUT_ERROR ? "error"
                  : j->outcome == SRV_OUT_ABORTED ? "aborted" : finish_reason(&j->ch[0]);
    /* a client that went away mid-answer: nothing more is sent on this connection */
    if (j->gone)
        c->close_after = true;
}
