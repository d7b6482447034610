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

char *srv_metrics_render(srv_metrics *m, const srv_gauges *g)
{
    strbuf b = {0};
    pthread_mutex_lock(&m->mu);
    srv_metrics c = *m; /* a consistent snapshot; rendering happens outside the lock */
    pthread_mutex_unlock(&m->mu);
    const vki_batch_stats *t = &c.tick;
    metric_head(&b, "vkinfer_requests_total", "counter",
                "Generation requests by outcome (stop, length, cancelled by a client that went away, aborted at "
                "shutdown, error, invalid 400, queue_full 429, unavailable 503; bodies over the limit are counted by their 413).");
    for (int o = 0; o < SRV_OUT_COUNT; o++)
        strbuf_printf(&b, "vkinfer_requests_total{outcome=\"%s\"} %llu\n", OUTCOME_NAMES[o],
                      (unsigned long long)c.outcome[o]);
    metric_head(&b, "vkinfer_http_responses_total", "counter", "HTTP responses by status code.");
    for (size_t i = 0; i < sizeof HTTP_CODES / sizeof HTTP_CODES[0]; i++)
        strbuf_printf(&b, "vkinfer_http_responses_total{code=\"%u\"} %llu\n", HTTP_CODES[i],
                      (unsigned long long)c.http[i]);
    counter(&b, "vkinfer_connections_rejected_total", "Connections past --max-connections answered 503.",
            (double)c.overflow_rejected);
    counter(&b, "vkinfer_prompt_tokens_total", "Prompt tokens of accepted requests.", (double)c.prompt_tokens);
    counter(&b, "vkinfer_prompt_tokens_cached_total", "Prompt tokens whose KV came from the prefix cache.",
            (double)c.cached_tokens);
    counter(&b, "vkinfer_generation_tokens_total", "Tokens generated.", (double)c.generated_tokens);
    gauge(&b, "vkinfer_active_requests", "Generation requests submitted and not yet finished.", g->active);
    gauge(&b, "vkinfer_open_connections", "Client connections within the cap (idle keep-alive included).",
          g->connections);
    gauge(&b, "vkinfer_handler_threads", "Threads answering a request.", g->handlers);
    gauge(&b, "vkinfer_ready", "1 when the server takes requests (not draining, device OK).", g->ready);
    gauge(&b, "vkinfer_iterations", "Batch manager ticks run (as of the last tick with work).", (double)t->iteration);
    gauge(&b, "vkinfer_queue_length", "Requests waiting for admission (as of the last tick with work).", t->queued);
    gauge(&b, "vkinfer_running_requests", "Requests holding KV in the batch, queued ones not included (as of the "
          "last tick with work).", t->running);
    gauge(&b, "vkinfer_paused_requests", "Requests paused to be recomputed later (MAX_UTILIZATION).", t->paused);
    metric_head(&b, "vkinfer_kv_blocks", "gauge",
                "KV cache blocks by state: used by running requests, cached (reusable prefixes, evictable), free "
                "(as of the last tick with work).");
    strbuf_printf(&b, "vkinfer_kv_blocks{state=\"used\"} %u\nvkinfer_kv_blocks{state=\"cached\"} %u\n"
                  "vkinfer_kv_blocks{state=\"free\"} %u\n", t->kv_used, t->kv_cached, t->kv_free);
    gauge(&b, "vkinfer_kv_blocks_max", "KV cache blocks in the pool.", t->kv_max);
    gauge(&b, "vkinfer_kv_blocks_reused", "KV blocks reused from cached prefixes, cumulative.",
          (double)t->kv_reused_blocks);
    histogram(&b, "vkinfer_time_to_first_token_seconds", "Request received to first generated token.", &c.ttft);
    histogram(&b, "vkinfer_inter_token_latency_seconds", "Time between consecutive tokens of a request.", &c.itl);
    histogram(&b, "vkinfer_e2e_request_latency_seconds", "Request received to its last token.", &c.e2e);
    histogram(&b, "vkinfer_step_time_seconds", "Engine time of one batch step (tick).", &c.step);
    return b.p;
}
