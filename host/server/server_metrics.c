/* Server metrics: counters and latency histograms updated by the HTTP threads and the batch
 * manager's worker (one mutex, held for O(buckets) per observation), the gauges of the last
 * per-tick stats JSON, and their Prometheus text exposition (format 0.0.4). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/server/server.h"

/* Bucket bounds in seconds. TTFT and end-to-end span queueing under load; inter-token latency
 * and step time are one tick (ms on a GPU, tens of ms on lavapipe). */
static const double LE_TTFT[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
                                 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80};
static const double LE_TICK[] = {0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03,
                                 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5};
static const double LE_E2E[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640};
#define N_OF(a) (uint32_t)(sizeof a / sizeof a[0])
_Static_assert(N_OF(LE_TTFT) <= SRV_HIST_MAX && N_OF(LE_TICK) <= SRV_HIST_MAX && N_OF(LE_E2E) <= SRV_HIST_MAX,
               "histogram bounds fit");

static const unsigned HTTP_CODES[] = {200, 204, 400, 401, 404, 405, 408, 413, 429, 431, 500, 501, 503, 505};
_Static_assert(sizeof HTTP_CODES / sizeof HTTP_CODES[0] == sizeof ((srv_metrics *)0)->http / sizeof(uint64_t),
               "a counter per listed status code");

static const char *const OUTCOME_NAMES[SRV_OUT_COUNT] = {
    [SRV_OUT_STOP] = "stop",         [SRV_OUT_LENGTH] = "length",     [SRV_OUT_CANCELLED] = "cancelled",
    [SRV_OUT_ABORTED] = "aborted",   [SRV_OUT_ERROR] = "error",       [SRV_OUT_INVALID] = "invalid",
    [SRV_OUT_QUEUE_FULL] = "queue_full", [SRV_OUT_UNAVAILABLE] = "unavailable",
};
_Static_assert(sizeof OUTCOME_NAMES / sizeof OUTCOME_NAMES[0] == SRV_OUT_COUNT, "a name per outcome");

void srv_metrics_init(srv_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft = (srv_hist){.le = LE_TTFT, .n = N_OF(LE_TTFT)};
    m->itl = (srv_hist){.le = LE_TICK, .n = N_OF(LE_TICK)};
    m->step = (srv_hist){.le = LE_TICK, .n = N_OF(LE_TICK)};
    m->e2e = (srv_hist){.le = LE_E2E, .n = N_OF(LE_E2E)};
}

void srv_metrics_destroy(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void srv_metrics_outcome(srv_metrics *m, srv_outcome o)
{
    if ((unsigned)o >= SRV_OUT_COUNT)
        return;
    pthread_mutex_lock(&m->mu);
    m->outcome[o]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_http(srv_metrics *m, unsigned code)
{
    for (size_t i = 0; i < sizeof HTTP_CODES / sizeof HTTP_CODES[0]; i++)
        if (HTTP_CODES[i] == code) {
            pthread_mutex_lock(&m->mu);
            m->http[i]++;
            pthread_mutex_unlock(&m->mu);
        }
}

void srv_metrics_observe(srv_metrics *m, srv_hist *h, double s)
{
    uint32_t b = 0;
    while (b < h->n && s > h->le[b])
        b++;
    pthread_mutex_lock(&m->mu);
    h->count[b]++;
    h->sum += s;
    h->total++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_tokens(srv_metrics *m, uint64_t prompt, uint64_t generated, uint64_t cached)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += prompt;
    m->generated_tokens += generated;
    m->cached_tokens += cached;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_overflow(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->overflow_rejected++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_tick(srv_metrics *m, const vki_batch_stats *st)
{
    pthread_mutex_lock(&m->mu);
    m->have_stats = true;
    m->tick = *st;
    pthread_mutex_unlock(&m->mu);
    if (st->scheduled)
        srv_metrics_observe(m, &m->step, st->step_ms / 1e3);
}

/* ---- exposition ------------------------------------------------------------------------------ */

static void metric_head(strbuf *b, const char *name, const char *type, const char *help)
{
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample: name{lab,extra} v, where lab is a model's label ("" on a one-model server). */
static void sample(strbuf *b, const char *name, const char *lab, const char *extra, double v)
{
    bool any = lab[0] || (extra && extra[0]);
    strbuf_printf(b, "%s%s%s%s%s%s %.17g\n", name, any ? "{" : "", lab, lab[0] && extra && extra[0] ? "," : "",
                  extra ? extra : "", any ? "}" : "", v);
}

static void gauge(strbuf *b, const char *name, const char *help, double v)
{
    metric_head(b, name, "gauge", help);
    sample(b, name, "", NULL, v);
}

static void counter(strbuf *b, const char *name, const char *help, double v)
{
    metric_head(b, name, "counter", help);
    sample(b, name, "", NULL, v);
}

static void hist_samples(strbuf *b, const char *name, const char *lab, const srv_hist *h)
{
    uint64_t cum = 0;
    const char *sep = lab[0] ? "," : "";
    for (uint32_t i = 0; i < h->n; i++) {
        cum += h->count[i];
        strbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, lab, sep, h->le[i], (unsigned long long)cum);
    }
    cum += h->count[h->n];
    strbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, lab, sep, (unsigned long long)cum);
    strbuf_printf(b, "%s_sum%s%s%s %.9g\n%s_count%s%s%s %llu\n", name, lab[0] ? "{" : "", lab, lab[0] ? "}" : "",
                  h->sum, name, lab[0] ? "{" : "", lab, lab[0] ? "}" : "", (unsigned long long)h->total);
}

/* What each model contributes: a snapshot of its counters, its gauges, its label. */
typedef struct per_model {
    srv_metrics c;
    srv_gauges g;
    char lab[160];
} per_model;

typedef enum { PM_ACTIVE, PM_READY, PM_ITER, PM_QUEUE, PM_RUNNING, PM_PAUSED, PM_KV_MAX, PM_KV_REUSED,
               PM_PROMPT, PM_CACHED, PM_GEN, PM_SESSIONS, PM_PINNED, PM_STEPS_REUSED, PM_STEPS_AHEAD, PM_COUNT } pm_value;

static double pm_get(const per_model *m, pm_value v)
{
    const vki_batch_stats *t = &m->c.tick;
    switch (v) {
    case PM_ACTIVE: return m->g.active;
    case PM_READY: return m->g.ready;
    case PM_ITER: return (double)t->iteration;
    case PM_QUEUE: return t->queued;
    case PM_RUNNING: return t->running;
    case PM_PAUSED: return t->paused;
    case PM_KV_MAX: return t->kv_max;
    case PM_KV_REUSED: return (double)t->kv_reused_blocks;
    case PM_PROMPT: return (double)m->c.prompt_tokens;
    case PM_CACHED: return (double)m->c.cached_tokens;
    case PM_SESSIONS: return t->sessions;
    case PM_PINNED: return t->kv_pinned;
    case PM_STEPS_REUSED: return (double)t->steps_reused;
    case PM_STEPS_AHEAD: return (double)t->steps_ahead;
    default: return (double)m->c.generated_tokens;
    }
}

static const struct {
    const char *name, *type, *help;
} PM_META[PM_COUNT] = {
    [PM_ACTIVE] = {"vkinfer_active_requests", "gauge", "Generation requests submitted and not yet finished."},
    [PM_READY] = {"vkinfer_ready", "gauge", "1 when the server (with a model label: that model) takes requests."},
    [PM_ITER] = {"vkinfer_iterations", "gauge", "Batch manager ticks run (as of the last tick with work)."},
    [PM_QUEUE] = {"vkinfer_queue_length", "gauge", "Requests waiting for admission (as of the last tick with work)."},
    [PM_RUNNING] = {"vkinfer_running_requests", "gauge", "Requests holding KV in the batch, queued ones not "
                    "included (as of the last tick with work)."},
    [PM_PAUSED] = {"vkinfer_paused_requests", "gauge", "Requests paused to be recomputed later (MAX_UTILIZATION)."},
    [PM_KV_MAX] = {"vkinfer_kv_blocks_max", "gauge", "KV cache blocks in the pool."},
    [PM_KV_REUSED] = {"vkinfer_kv_blocks_reused", "gauge", "KV blocks reused from cached prefixes, cumulative."},
    [PM_PROMPT] = {"vkinfer_prompt_tokens_total", "counter", "Prompt tokens of accepted requests."},
    [PM_CACHED] = {"vkinfer_prompt_tokens_cached_total", "counter", "Prompt tokens whose KV came from the prefix cache."},
    [PM_GEN] = {"vkinfer_generation_tokens_total", "counter", "Tokens generated."},
    [PM_SESSIONS] = {"vkinfer_sessions", "gauge", "Sessions holding pinned KV (as of the last tick with work)."},
    [PM_PINNED] = {"vkinfer_kv_blocks_pinned", "gauge", "KV block references sessions hold (as of the last tick "
                   "with work)."},
    [PM_STEPS_REUSED] = {"vkinfer_steps_reused_total", "counter", "Engine steps submitted as a command buffer kept "
                         "from an earlier step of the same shape (no driver recording); compare vkinfer_iterations."},
    [PM_STEPS_AHEAD] = {"vkinfer_steps_ahead_total", "counter", "Lookahead steps: decode steps submitted before the "
                        "step they follow was waited for (host work overlapping the GPU's); compare vkinfer_iterations."},
};

static void model_series(strbuf *b, const per_model *pm, uint32_t n)
{
    metric_head(b, "vkinfer_requests_total", "counter",
                "Generation requests by outcome (stop, length, cancelled by a client that went away, aborted at "
                "shutdown, error, invalid 400, queue_full 429, unavailable 503; bodies over the limit are counted by their 413).");
    char x[64];
    for (uint32_t k = 0; k < n; k++)
        for (int o = 0; o < SRV_OUT_COUNT; o++) {
            snprintf(x, sizeof x, "outcome=\"%s\"", OUTCOME_NAMES[o]);
            sample(b, "vkinfer_requests_total", pm[k].lab, x, (double)pm[k].c.outcome[o]);
        }
    for (int v = 0; v < PM_COUNT; v++) {
        metric_head(b, PM_META[v].name, PM_META[v].type, PM_META[v].help);
        for (uint32_t k = 0; k < n; k++)
            sample(b, PM_META[v].name, pm[k].lab, NULL, pm_get(&pm[k], (pm_value)v));
    }
    metric_head(b, "vkinfer_kv_blocks", "gauge",
                "KV cache blocks by state: used by running requests, cached (reusable prefixes, evictable), free "
                "(as of the last tick with work).");
    for (uint32_t k = 0; k < n; k++) {
        sample(b, "vkinfer_kv_blocks", pm[k].lab, "state=\"used\"", pm[k].c.tick.kv_used);
        sample(b, "vkinfer_kv_blocks", pm[k].lab, "state=\"cached\"", pm[k].c.tick.kv_cached);
        sample(b, "vkinfer_kv_blocks", pm[k].lab, "state=\"free\"", pm[k].c.tick.kv_free);
    }
    static const struct {
        const char *name, *help;
        size_t off;
    } H[] = {
        {"vkinfer_time_to_first_token_seconds", "Request received to first generated token.", offsetof(srv_metrics, ttft)},
        {"vkinfer_inter_token_latency_seconds", "Time between consecutive tokens of a request.", offsetof(srv_metrics, itl)},
        {"vkinfer_e2e_request_latency_seconds", "Request received to its last token.", offsetof(srv_metrics, e2e)},
        {"vkinfer_step_time_seconds", "Engine time of one batch step (tick).", offsetof(srv_metrics, step)},
    };
    for (size_t h = 0; h < sizeof H / sizeof H[0]; h++) {
        metric_head(b, H[h].name, "histogram", H[h].help);
        for (uint32_t k = 0; k < n; k++)
            hist_samples(b, H[h].name, pm[k].lab, (const srv_hist *)((const char *)&pm[k].c + H[h].off));
    }
}

char *srv_metrics_render_models(srv_metrics *server, const srv_gauges *g, srv_metrics *const *models,
                                const char *const *names, const srv_gauges *mg, uint32_t n)
{
    strbuf b = {0};
    per_model *pm = calloc(n ? n : 1, sizeof *pm);
    if (!pm)
        return NULL;
    for (uint32_t k = 0; k < n; k++) { /* consistent snapshots; rendering happens outside the locks */
        pthread_mutex_lock(&models[k]->mu);
        pm[k].c = *models[k];
        pthread_mutex_unlock(&models[k]->mu);
        pm[k].g = mg[k];
        if (names)
            snprintf(pm[k].lab, sizeof pm[k].lab, "model=\"%.140s\"", names[k]);
    }
    pthread_mutex_lock(&server->mu);
    srv_metrics c = *server;
    pthread_mutex_unlock(&server->mu);
    metric_head(&b, "vkinfer_http_responses_total", "counter", "HTTP responses by status code.");
    for (size_t i = 0; i < sizeof HTTP_CODES / sizeof HTTP_CODES[0]; i++)
        strbuf_printf(&b, "vkinfer_http_responses_total{code=\"%u\"} %llu\n", HTTP_CODES[i],
                      (unsigned long long)c.http[i]);
    counter(&b, "vkinfer_connections_rejected_total", "Connections past --max-connections answered 503.",
            (double)c.overflow_rejected);
    gauge(&b, "vkinfer_open_connections", "Client connections within the cap (idle keep-alive included).",
          g->connections);
    gauge(&b, "vkinfer_handler_threads", "Threads answering a request.", g->handlers);
    if (names)
        gauge(&b, "vkinfer_server_ready", "1 when the server takes requests (not draining, device OK).", g->ready);
    model_series(&b, pm, n);
    free(pm);
    return b.p;
}

char *srv_metrics_render(srv_metrics *m, const srv_gauges *g)
{
    srv_metrics *one[1] = {m};
    return srv_metrics_render_models(m, g, one, NULL, g, 1);
}
