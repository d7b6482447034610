/* Per-tick stats JSON, with the field names of the TensorRT-LLM batch manager's iteration stats
 * plus a few of ours (reuse, pauses, reused step recordings). "MicroBatch ID" is always 0: one process runs one device,
 * so every tick is one micro-batch (TensorRT-LLM numbers micro-batches of pipeline parallelism). Written with snprintf into a fixed buffer: every value is a
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
    uint64_t now = bm->be.steps_reused ? bm->be.steps_reused(bm->be.ctx) : 0;
    uint64_t reused = now >= bm->steps_reused0 ? now - bm->steps_reused0 : now; /* this manager's steps */
    if (bm->cb.tick_stats) {
        vki_batch_stats st = {
            .iteration = bm->iteration, .queued = ss.queued + inbox, .running = ss.running, .paused = ss.paused,
            .scheduled = t->plan.n_seqs, .context_requests = t->n_context,
            .generation_requests = t->n_generation, .context_tokens = t->n_context_tokens,
            .kv_max = ss.kv.max_blocks, .kv_free = ss.kv.free_blocks, .kv_used = ss.kv.used_blocks,
            .kv_cached = ss.kv.cached_blocks, .kv_reused_blocks = ss.kv.reused_blocks,
            .reused_tokens = ss.reused_tokens, .step_ms = step_ms, .sessions = bm->n_sessions,
            .kv_pinned = ss.pinned_refs, .steps_reused = reused,
            .steps_ahead = bm->n_ahead};
        bm->cb.tick_stats(bm->cb.user, &st);
    }
    if (!bm->cb.stats)
        return;
    /* STATIC (TensorRT-LLM's static batching stats): decode tokens of live members, and the slots
     * of members that finished but are still computed as padding (ghosts) */
    char extra[128] = "";
    if (bm->p.policy == VKI_POLICY_STATIC) /* counted at planning: the step may have freed them */
        snprintf(extra, sizeof extra, ",\"Total Generation Tokens\":%u,\"Empty Generation Slots\":%u",
                 t->n_generation - t->n_ghosts, t->n_ghosts);
    char ts[48], json[1152];
    timestamp(ts, sizeof ts);
    int n = snprintf(json, sizeof json,
                     "{\"Timestamp\":\"%s\",\"Iteration Counter\":%" PRIu64 ",\"Active Request Count\":%u,"
                     "\"Max Request Count\":%u,\"Max KV cache blocks\":%u,\"Free KV cache blocks\":%u,"
                     "\"Used KV cache blocks\":%u,\"Cached KV cache blocks\":%u,"
                     "\"Tokens per KV cache block\":%u,\"Reused KV cache blocks\":%" PRIu64 ","
                     "\"Reused Tokens\":%" PRIu64 ",\"Scheduled Requests\":%u,\"Context Requests\":%u,"
                     "\"Generation Requests\":%u,\"Total Context Tokens\":%u,\"Paused Requests\":%u,"
                     "\"Waiting Paused Requests\":%u,\"Running Requests\":%u,\"Queue Length\":%u,"
                     "\"Step Time ms\":%.17g,\"Reused Step Recordings\":%" PRIu64 ",\"Lookahead Steps\":%" PRIu64 ","
                     "\"MicroBatch ID\":0%s}",
                     ts, bm->iteration, bm->n_active, ss.max_running, ss.kv.max_blocks, ss.kv.free_blocks,
                     ss.kv.used_blocks, ss.kv.cached_blocks, ss.kv.tokens_per_block, (uint64_t)ss.kv.reused_blocks,
                     (uint64_t)ss.reused_tokens, t->plan.n_seqs, t->n_context, t->n_generation, t->n_context_tokens,
                     t->n_paused, ss.paused, ss.running, ss.queued + inbox, step_ms, reused, bm->n_ahead, extra);
    if (n > 0 && (size_t)n < sizeof json)
        bm->cb.stats(bm->cb.user, json);
}
