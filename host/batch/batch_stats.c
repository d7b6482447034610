/* Per-tick stats JSON, with the field names of the TensorRT-LLM batch manager's iteration stats
 * plus a few of ours (reuse, pauses). Built with cJSON and handed to cb.stats; O(1) fields. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "host/batch/batch.h"

static void timestamp(char *buf, size_t n)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, n - k, ".%03ldZ", ts.tv_nsec / 1000000);
}

void bm_emit_stats(vki_batch_manager *bm, const sched_tick *t, double step_ms)
{
    sched_stats ss;
    sched_get_stats(bm->s, &ss);
    pthread_mutex_lock(&bm->mu);
    uint32_t inbox = bm->inbox_len;
    pthread_mutex_unlock(&bm->mu);
    if (bm->cb.tick_stats) {
        vki_batch_stats st = {
            .iteration = bm->iteration, .queued = ss.queued + inbox, .running = ss.running, .paused = ss.paused,
            .scheduled = t->plan.n_seqs, .context_requests = t->n_context,
            .generation_requests = t->n_generation, .context_tokens = t->n_context_tokens,
            .kv_max = ss.kv.max_blocks, .kv_free = ss.kv.free_blocks, .kv_used = ss.kv.used_blocks,
            .kv_cached = ss.kv.cached_blocks, .kv_reused_blocks = ss.kv.reused_blocks,
            .reused_tokens = ss.reused_tokens, .step_ms = step_ms};
        bm->cb.tick_stats(bm->cb.user, &st);
    }
    if (!bm->cb.stats)
        return;
    char ts[48];
    timestamp(ts, sizeof ts);
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
    cJSON_AddStringToObject(o, "Timestamp", ts);
    cJSON_AddNumberToObject(o, "Iteration Counter", (double)bm->iteration);
    cJSON_AddNumberToObject(o, "Active Request Count", bm->n_active);
    cJSON_AddNumberToObject(o, "Max Request Count", ss.max_running);
    cJSON_AddNumberToObject(o, "Max KV cache blocks", ss.kv.max_blocks);
    cJSON_AddNumberToObject(o, "Free KV cache blocks", ss.kv.free_blocks);
    cJSON_AddNumberToObject(o, "Used KV cache blocks", ss.kv.used_blocks);
    cJSON_AddNumberToObject(o, "Cached KV cache blocks", ss.kv.cached_blocks);
    cJSON_AddNumberToObject(o, "Tokens per KV cache block", ss.kv.tokens_per_block);
    cJSON_AddNumberToObject(o, "Reused KV cache blocks", (double)ss.kv.reused_blocks);
    cJSON_AddNumberToObject(o, "Reused Tokens", (double)ss.reused_tokens);
    cJSON_AddNumberToObject(o, "Scheduled Requests", t->plan.n_seqs);
    cJSON_AddNumberToObject(o, "Context Requests", t->n_context);
    cJSON_AddNumberToObject(o, "Generation Requests", t->n_generation);
    cJSON_AddNumberToObject(o, "Total Context Tokens", t->n_context_tokens);
    cJSON_AddNumberToObject(o, "Paused Requests", t->n_paused);
    cJSON_AddNumberToObject(o, "Waiting Paused Requests", ss.paused);
    cJSON_AddNumberToObject(o, "Running Requests", ss.running);
    cJSON_AddNumberToObject(o, "Queue Length", ss.queued + inbox);
    cJSON_AddNumberToObject(o, "Step Time ms", step_ms);
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!json)
        return;
    bm->cb.stats(bm->cb.user, json);
    cJSON_free(json);
}
