#include "host/cli/workload.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/rng.h"
#include "host/cli/cli_common.h"

typedef struct wl_run_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t n_final;
    double t0;
    wl_result *res;
    const wl_params *p;
} wl_run_state;

typedef struct wl_ctx { /* per request: its index and the shared state */
    wl_run_state *s;
    uint32_t i;
} wl_ctx;

static uint32_t draw(uint64_t *s, uint32_t lo, uint32_t hi)
{
    return hi <= lo ? lo : lo + (uint32_t)(vki_splitmix64(s) % ((uint64_t)hi - lo + 1));
}

/* Runs on the worker thread: times and tokens of one request. */
static void on_response(void *user, const vki_response *r)
{
    wl_ctx *c = user;
    wl_req *q = &c->s->res->r[c->i];
    double t = cli_now_s() - c->s->t0;
    if (r->n_tokens && !q->n_out)
        q->t_first = t;
    for (uint32_t k = 0; k < r->n_tokens; k++)
        q->tokens[q->n_out++] = r->tokens[k];
    if (!r->final)
        return;
    pthread_mutex_lock(&c->s->mu);
    q->t_end = t;
    q->finish = r->finish;
    c->s->n_final++;
    pthread_cond_signal(&c->s->cv);
    pthread_mutex_unlock(&c->s->mu);
}

static void stats_cb(void *user, const char *json)
{
    wl_run_state *s = user;
    if (s->p->on_stats)
        s->p->on_stats(s->p->user, json);
}

static void sleep_until(double t0, double t)
{
    double dt = t - (cli_now_s() - t0);
    if (dt <= 0)
        return;
    struct timespec ts = {(time_t)dt, (long)((dt - (time_t)dt) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

/* Builds request i's prompt into buf (cap tokens); returns its length. */
static uint32_t make_prompt(const vki_tokenizer *tok, const wl_params *p, uint32_t i, uint64_t *rng, int32_t *buf,
                            uint32_t cap)
{
    if (p->prompts && p->n_prompts) {
        const char *t = p->prompts[i % p->n_prompts];
        size_t n = 0;
        if (vki_tokenize(tok, t, strlen(t), true, false, buf, cap, &n) != VKI_OK)
            return 0;
        return (uint32_t)n;
    }
    uint32_t n = draw(rng, p->in_min, p->in_max), vocab = vki_vocab_size(tok), k = 0;
    if (n > cap)
        n = cap;
    if (vki_tokenizer_adds_bos(tok) && vki_token_bos(tok) >= 0 && n)
        buf[k++] = vki_token_bos(tok);
    while (k < n) {
        int32_t id = (int32_t)draw(rng, vocab > 300 ? 259 : 3, vocab - 1); /* skip specials/bytes */
        if (!vki_token_is_eog(tok, id))
            buf[k++] = id;
    }
    return n;
}

/* Submits the requests at their arrival times; *n_submitted: how many were accepted (each of
 * those will get a final response). */
static vki_status submit_all(vki_batch_manager *bm, const vki_tokenizer *tok, const wl_params *p, wl_run_state *s,
                             wl_ctx *ctx, uint32_t max_ctx, uint32_t *n_submitted)
{
    *n_submitted = 0;
    uint64_t rng = p->seed ? p->seed : 1;
    uint32_t cap = p->in_max > 4096 ? p->in_max + 8 : 4096 + 8;
    int32_t *buf = malloc(cap * sizeof *buf);
    if (!buf)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    double t = 0;
    vki_status st = VKI_OK;
    for (uint32_t i = 0; i < p->n_requests && st == VKI_OK; i++) {
        if (p->rate > 0 && i)
            t += -log(1.0 - (vki_splitmix64(&rng) >> 11) * (1.0 / 9007199254740992.0)) / p->rate;
        uint32_t n_in = make_prompt(tok, p, i, &rng, buf, cap), n_out = draw(&rng, p->out_min, p->out_max);
        if (n_in + n_out > max_ctx) { /* keep every request runnable on this engine */
            if (n_in > max_ctx / 2)
                n_in = max_ctx / 2;
            n_out = max_ctx - n_in;
        }
        wl_req *q = &s->res->r[i];
        q->n_in = n_in;
        q->tokens = malloc((size_t)n_out * sizeof *q->tokens);
        if (!q->tokens || !n_in) {
            st = q->tokens ? VKI_ERR_INVALID_ARG : VKI_ERR_OUT_OF_HOST_MEMORY;
            break;
        }
        ctx[i] = (wl_ctx){s, i};
        vki_request req = {.id = i + 1, .prompt = buf, .n_prompt = n_in, .max_new_tokens = n_out,
                           .sampling = p->sampling, .streaming = true, .ignore_eos = p->ignore_eos};
        sleep_until(s->t0, t);
        q->t_arrive = cli_now_s() - s->t0;
        char err[256];
        while ((st = vki_batch_submit(bm, &req, on_response, &ctx[i], err, sizeof err)) == VKI_RETRY_QUEUE_FULL)
            sleep_until(s->t0, cli_now_s() - s->t0 + 0.001);
        if (st == VKI_OK) {
            s->res->in_tokens += n_in;
            (*n_submitted)++;
        }
    }
    free(buf);
    return st;
}

vki_status wl_run(vki_engine *e, const vki_batch_params *bp, const wl_params *p, wl_result *out)
{
    memset(out, 0, sizeof *out);
    out->r = calloc(p->n_requests ? p->n_requests : 1, sizeof *out->r);
    wl_ctx *ctx = calloc(p->n_requests ? p->n_requests : 1, sizeof *ctx);
    if (!out->r || !ctx) {
        free(ctx);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    out->n = p->n_requests;
    wl_run_state s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .res = out, .p = p};
    vki_batch_callbacks cb = {.user = &s, .stats = stats_cb};
    vki_batch_manager *bm = NULL;
    vki_status st = vki_batch_manager_create(e, bp, &cb, &bm);
    vki_model_info mi;
    vki_engine_info(e, &mi);
    if (st == VKI_OK) {
        s.t0 = cli_now_s();
        uint32_t submitted;
        st = submit_all(bm, vki_engine_tokenizer(e), p, &s, ctx, mi.n_ctx, &submitted);
        pthread_mutex_lock(&s.mu);
        while (s.n_final < submitted)
            pthread_cond_wait(&s.cv, &s.mu);
        pthread_mutex_unlock(&s.mu);
        vki_batch_manager_destroy(bm, st != VKI_OK);
    }
    double first = INFINITY, last = 0;
    for (uint32_t i = 0; i < out->n; i++) {
        wl_req *q = &out->r[i];
        out->out_tokens += q->n_out;
        out->n_errors += q->finish == VKI_FINISH_ERROR || q->finish == VKI_FINISH_NONE;
        first = q->t_arrive < first ? q->t_arrive : first;
        last = q->t_end > last ? q->t_end : last;
    }
    out->wall_s = last > first ? last - first : 0;
    free(ctx);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double wl_percentile(const double *v, uint32_t n, double p)
{
    if (!n)
        return 0;
    double *s = malloc(n * sizeof *s);
    if (!s)
        return NAN;
    memcpy(s, v, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_double);
    double x = p / 100.0 * (n - 1), r;
    uint32_t i = (uint32_t)x;
    r = i + 1 < n ? s[i] + (x - i) * (s[i + 1] - s[i]) : s[n - 1];
    free(s);
    return r;
}

void wl_summarize(const wl_result *r, wl_summary *s)
{
    memset(s, 0, sizeof *s);
    s->requests = r->n;
    s->errors = r->n_errors;
    s->in_tokens = r->in_tokens;
    s->out_tokens = r->out_tokens;
    s->wall_s = r->wall_s;
    if (r->wall_s > 0) {
        s->req_per_s = r->n / r->wall_s;
        s->out_tok_per_s = r->out_tokens / r->wall_s;
        s->total_tok_per_s = (r->out_tokens + r->in_tokens) / r->wall_s;
    }
    double *ttft = malloc((r->n + 1) * sizeof *ttft), *tpot = malloc((r->n + 1) * sizeof *tpot),
           *e2e = malloc((r->n + 1) * sizeof *e2e);
    uint32_t n1 = 0, n2 = 0, n3 = 0;
    for (uint32_t i = 0; ttft && tpot && e2e && i < r->n; i++) {
        const wl_req *q = &r->r[i];
        if (!q->n_out)
            continue;
        ttft[n1++] = (q->t_first - q->t_arrive) * 1e3;
        e2e[n3++] = (q->t_end - q->t_arrive) * 1e3;
        if (q->n_out > 1)
            tpot[n2++] = (q->t_end - q->t_first) * 1e3 / (q->n_out - 1);
    }
    static const double ps[3] = {50, 90, 99};
    for (int k = 0; k < 3; k++) {
        s->ttft_ms[k] = wl_percentile(ttft, n1, ps[k]);
        s->tpot_ms[k] = wl_percentile(tpot, n2, ps[k]);
        s->e2e_ms[k] = wl_percentile(e2e, n3, ps[k]);
    }
    free(ttft);
    free(tpot);
    free(e2e);
}

void wl_result_free(wl_result *r)
{
    for (uint32_t i = 0; r->r && i < r->n; i++)
        free(r->r[i].tokens);
    free(r->r);
    r->r = NULL;
}
