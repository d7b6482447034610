/* Per-tick stats JSON, with the field names of the TensorRT-LLM batch manager's iteration stats
 * plus a few of ours (reuse, pauses). Written with snprintf into a fixed buffer: every value is a
 * number or an ASCII timestamp, so nothing needs escaping, and libvkinfer needs no JSON library.
 * O(1) fields, one stack buffer, no allocation per tick. */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

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
    char ts[48], json[1024];
    timestamp(ts, sizeof ts);
    int n = snprintf(json, sizeof json,
                     "{\"Timestamp\":\"%s\",\"Iteration Counter\":%" PRIu64 ",\"Active Request Count\":%u,"
                     "\"Max Request Count\":%u,\"Max KV cache blocks\":%u,\"Free KV cache blocks\":%u,"
                     "\"Used KV cache blocks\":%u,\"Cached KV cache blocks\":%u,"
                     "\"Tokens per KV cache block\":%u,\"Reused KV cache blocks\":%" PRIu64 ","
                     "\"Reused Tokens\":%" PRIu64 ",\"Scheduled Requests\":%u,\"Context Requests\":%u,"
                     "\"Generation Requests\":%u,\"Total Context Tokens\":%u,\"Paused Requests\":%u,"
                     "\"Waiting Paused Requests\":%u,\"Running Requests\":%u,\"Queue Length\":%u,"
                     "\"Step Time ms\":%.17g}",
                     ts, bm->iteration, bm->n_active, ss.max_running, ss.kv.max_blocks, ss.kv.free_blocks,
                     ss.kv.used_blocks, ss.kv.cached_blocks, ss.kv.tokens_per_block, (uint64_t)ss.kv.reused_blocks,
                     (uint64_t)ss.reused_tokens, t->plan.n_seqs, t->n_context, t->n_generation, t->n_context_tokens,
                     t->n_paused, ss.paused, ss.running, ss.queued + inbox, step_ms);
    if (n > 0 && (size_t)n < sizeof json)
        bm->cb.stats(bm->cb.user, json);
}
