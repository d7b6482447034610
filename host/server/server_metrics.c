/* Server metrics: counters and latency histograms updated by the HTTP threads and the batch
 * manager's worker (one mutex, held for O(buckets) per observation), the gauges of the last
 * per-tick stats JSON, and their Prometheus text exposition (format 0.0.4). */
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

static const unsigned HTTP_CODES[] = {200, 400, 404, 405, 413, 429, 500, 503};
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

void srv_metrics_tokens(srv_metrics *m, uint64_t prompt, uint64_t generated)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += prompt;
    m->generated_tokens += generated;
    pthread_mutex_unlock(&m->mu);
}

static double num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

void srv_metrics_stats(srv_metrics *m, const cJSON *o)
{
    double step_ms = num(o, "Step Time ms", -1);
    bool stepped = num(o, "Scheduled Requests", 0) > 0;
    pthread_mutex_lock(&m->mu);
    m->have_stats = true;
    m->iterations = num(o, "Iteration Counter", m->iterations);
    m->queue_len = num(o, "Queue Length", m->queue_len);
    m->running = num(o, "Active Request Count", m->running);
    m->kv_max = num(o, "Max KV cache blocks", m->kv_max);
    m->kv_free = num(o, "Free KV cache blocks", m->kv_free);
    m->kv_used = num(o, "Used KV cache blocks", m->kv_used);
    m->kv_cached = num(o, "Cached KV cache blocks", m->kv_cached);
    m->kv_reused = num(o, "Reused KV cache blocks", m->kv_reused);
    pthread_mutex_unlock(&m->mu);
    if (stepped && step_ms >= 0)
        srv_metrics_observe(m, &m->step, step_ms / 1e3);
}

/* ---- exposition ------------------------------------------------------------------------------ */

static void metric_head(strbuf *b, const char *name, const char *type, const char *help)
{
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(strbuf *b, const char *name, const char *help, double v)
{
    metric_head(b, name, "gauge", help);
    strbuf_printf(b, "%s %.17g\n", name, v);
}

static void counter(strbuf *b, const char *name, const char *help, double v)
{
    metric_head(b, name, "counter", help);
    strbuf_printf(b, "%s %.17g\n", name, v);
}

static void histogram(strbuf *b, const char *name, const char *help, const srv_hist *h)
{
    metric_head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (uint32_t i = 0; i < h->n; i++) {
        cum += h->count[i];
        strbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    cum += h->count[h->n];
    strbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)cum, name,
                  h->sum, name, (unsigned long long)h->total);
}

char *srv_metrics_render(srv_metrics *m, uint32_t active, uint32_t open_requests, bool ready)
{
    strbuf b = {0};
    pthread_mutex_lock(&m->mu);
    srv_metrics c = *m; /* a consistent snapshot; rendering happens outside the lock */
    pthread_mutex_unlock(&m->mu);
    metric_head(&b, "vkinfer_requests_total", "counter",
                "Generation requests by outcome (stop, length, cancelled by a client that went away, aborted at "
                "shutdown, error, invalid 400/413, queue_full 429, unavailable 503).");
    for (int o = 0; o < SRV_OUT_COUNT; o++)
        strbuf_printf(&b, "vkinfer_requests_total{outcome=\"%s\"} %llu\n", OUTCOME_NAMES[o],
                      (unsigned long long)c.outcome[o]);
    metric_head(&b, "vkinfer_http_responses_total", "counter", "HTTP responses by status code.");
    for (size_t i = 0; i < sizeof HTTP_CODES / sizeof HTTP_CODES[0]; i++)
        strbuf_printf(&b, "vkinfer_http_responses_total{code=\"%u\"} %llu\n", HTTP_CODES[i],
                      (unsigned long long)c.http[i]);
    counter(&b, "vkinfer_prompt_tokens_total", "Prompt tokens of accepted requests.", (double)c.prompt_tokens);
    counter(&b, "vkinfer_generation_tokens_total", "Tokens generated.", (double)c.generated_tokens);
    gauge(&b, "vkinfer_active_requests", "Generation requests submitted and not yet finished.", active);
    gauge(&b, "vkinfer_open_http_requests", "HTTP requests being received or answered.", open_requests);
    gauge(&b, "vkinfer_ready", "1 when the server takes requests (not draining, device OK).", ready);
    gauge(&b, "vkinfer_iterations", "Batch manager ticks run (as of the last tick with work).", c.iterations);
    gauge(&b, "vkinfer_queue_length", "Requests waiting for admission (as of the last tick with work).", c.queue_len);
    gauge(&b, "vkinfer_running_requests", "Requests in the batch (as of the last tick with work).", c.running);
    metric_head(&b, "vkinfer_kv_blocks", "gauge",
                "KV cache blocks by state: used by running requests, cached (reusable prefixes, evictable), free "
                "(as of the last tick with work).");
    strbuf_printf(&b, "vkinfer_kv_blocks{state=\"used\"} %.17g\nvkinfer_kv_blocks{state=\"cached\"} %.17g\n"
                  "vkinfer_kv_blocks{state=\"free\"} %.17g\n", c.kv_used, c.kv_cached, c.kv_free);
    gauge(&b, "vkinfer_kv_blocks_max", "KV cache blocks in the pool.", c.kv_max);
    gauge(&b, "vkinfer_kv_blocks_reused", "KV blocks reused from cached prefixes, cumulative.", c.kv_reused);
    histogram(&b, "vkinfer_time_to_first_token_seconds", "Request received to first generated token.", &c.ttft);
    histogram(&b, "vkinfer_inter_token_latency_seconds", "Time between consecutive tokens of a request.", &c.itl);
    histogram(&b, "vkinfer_e2e_request_latency_seconds", "Request received to its last token.", &c.e2e);
    histogram(&b, "vkinfer_step_time_seconds", "Engine time of one batch step (tick).", &c.step);
    return b.p;
}
