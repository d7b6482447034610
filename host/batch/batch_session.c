/* Stateful sessions (Triton's sequence batcher, for conversations): when a request that names a
 * session finishes, the KV blocks of its prompt and output stay pinned for the session (a
 * scheduler pin: references held outside any sequence), so the next request of the session,
 * whose prompt starts with those tokens, finds them by the prefix lookup and computes only its
 * new tokens, however much other traffic has passed through the pool meanwhile.
 *
 * Release, oldest idle session first (a session whose request runs is not idle; and a running
 * request holds its own references to the blocks it uses, so no release can take them):
 *   - vki_batch_session_end;
 *   - session_idle_s after its last request finished (the worker wakes for it);
 *   - the pins pass session_max_blocks (half the pool by default);
 *   - pressure: a tick admitted nothing while requests wait and batch slots are free (they wait
 *     for blocks): one idle session per tick until something fits.
 *
 * Worker thread only, except the end calls (queued under bm->mu like cancellations). Sessions
 * are a list in LRU order: lookups are O(sessions), fine for the hundreds of conversations one
 * device holds in KV; the pins cost O(blocks) each, and each session keeps its last request's
 * tokens (4 bytes a token, for session files: far less than the KV they describe).
 *
 * Session files (batch_session_file.c) are copied here, on the worker between ticks: save copies
 * the pinned blocks' KV out, restore pins blocks for the file's tokens (sched_pin_prepare /
 * _commit) after writing the KV of those not already cached. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/batch/batch.h"

typedef struct bm_session {
    uint64_t id;
    sched_pin pin;             /* its blocks, from its last finished request */
    int32_t *tokens;           /* [n_tokens] that request's prompt and output (a session file's
                                  conversation); NULL when out of memory (then it saves nothing) */
    uint32_t n_tokens;
    double t_last;             /* seconds (monotonic) its last request finished */
    uint32_t busy;             /* its requests in the scheduler */
    bool ended;                /* ended while busy: pins nothing more */
    struct bm_session *prev, *next;
} bm_session;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static bm_session *find(const vki_batch_manager *bm, uint64_t id)
{
    for (bm_session *x = bm->sess_head; x; x = x->next)
        if (x->id == id)
            return x;
    return NULL;
}

static void unlink_s(vki_batch_manager *bm, bm_session *x)
{
    if (x->prev)
        x->prev->next = x->next;
    else
        bm->sess_head = x->next;
    if (x->next)
        x->next->prev = x->prev;
    else
        bm->sess_tail = x->prev;
    x->prev = x->next = NULL;
}

static void append(vki_batch_manager *bm, bm_session *x) /* most recently used */
{
    x->prev = bm->sess_tail;
    if (bm->sess_tail)
        bm->sess_tail->next = x;
    else
        bm->sess_head = x;
    bm->sess_tail = x;
}

static void drop(vki_batch_manager *bm, bm_session *x)
{
    sched_pin_release(bm->s, &x->pin);
    unlink_s(bm, x);
    bm->n_sessions--;
    free(x->tokens);
    free(x);
}

/* session_max_blocks, resolved on first use (the pool's size is the scheduler's). */
static uint32_t cap_of(vki_batch_manager *bm)
{
    if (!bm->session_cap) {
        sched_stats st;
        sched_get_stats(bm->s, &st);
        bm->session_cap = bm->p.session_max_blocks ? bm->p.session_max_blocks : st.kv.max_blocks / 2;
    }
    return bm->session_cap;
}

/* x's conversation becomes tokens[0, n) (copied); false (and none) when out of memory. */
static bool set_tokens(bm_session *x, const int32_t *tokens, uint32_t n)
{
    int32_t *t = malloc((size_t)(n ? n : 1) * sizeof *t);
    if (t)
        memcpy(t, tokens, (size_t)n * sizeof *t);
    free(x->tokens);
    x->tokens = t;
    x->n_tokens = t ? n : 0;
    return t != NULL;
}

static uint32_t pinned(const vki_batch_manager *bm)
{
    sched_stats st;
    sched_get_stats(bm->s, &st);
    return st.pinned_refs;
}

/* Releases the oldest idle session other than keep; false when there is none. */
static bool release_oldest(vki_batch_manager *bm, const bm_session *keep)
{
    for (bm_session *x = bm->sess_head; x; x = x->next)
        if (!x->busy && x != keep && x->pin.n) {
            drop(bm, x);
            return true;
        }
    return false;
}

void bm_session_enter(vki_batch_manager *bm, const bm_req *q)
{
    bm_session *x = find(bm, q->session_id);
    if (!x) {
        if (!(x = calloc(1, sizeof *x)))
            return; /* out of memory: the request runs, its session pins nothing */
        x->id = q->session_id;
        bm->n_sessions++;
    } else {
        unlink_s(bm, x);
    }
    x->busy++;
    x->ended = false;
    append(bm, x);
}

void bm_session_finish(vki_batch_manager *bm, const bm_req *q)
{
    bm_session *x = find(bm, q->session_id);
    if (!x)
        return;
    if (x->busy)
        x->busy--;
    if (x->ended) {
        if (!x->busy)
            drop(bm, x);
        return;
    }
    /* the newest request's blocks replace the older pin (they share its prefix when the
     * conversation continued; otherwise the session moved on) */
    sched_pin old = x->pin;
    x->pin = (sched_pin){0};
    if (sched_pin_seq(bm->s, q->seq, &x->pin) != VKI_OK)
        x->pin = (sched_pin){0};
    sched_pin_release(bm->s, &old);
    set_tokens(x, q->seq->tokens, q->seq->n_tokens); /* out of memory: the session cannot be saved */
    x->t_last = now_s();
    unlink_s(bm, x);
    append(bm, x);
    uint32_t cap = cap_of(bm);
    while (pinned(bm) > cap && release_oldest(bm, x))
        ;
    if (pinned(bm) > cap) /* this one alone passes the cap */
        sched_pin_release(bm->s, &x->pin);
    if (!x->busy && !x->pin.n)
        drop(bm, x);
}

void bm_session_apply_ends(vki_batch_manager *bm, const uint64_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        bm_session *x = find(bm, ids[i]);
        if (!x)
            continue;
        if (x->busy) {
            sched_pin_release(bm->s, &x->pin);
            x->ended = true;
        } else {
            drop(bm, x);
        }
    }
}

void bm_session_tick(vki_batch_manager *bm, const sched_tick *t)
{
    double now = now_s();
    for (bm_session *x = bm->sess_head, *n; x; x = n) {
        n = x->next;
        if (!x->busy && now - x->t_last >= bm->p.session_idle_s)
            drop(bm, x);
    }
    if (!t || t->n_admitted)
        return;
    sched_stats st;
    sched_get_stats(bm->s, &st);
    if (st.queued && st.running < st.max_running)
        release_oldest(bm, NULL);
}

double bm_session_next_expiry_s(const vki_batch_manager *bm)
{
    double next = -1, now = now_s();
    for (const bm_session *x = bm->sess_head; x; x = x->next)
        if (!x->busy) {
            double left = x->t_last + bm->p.session_idle_s - now;
            if (next < 0 || left < next)
                next = left > 0 ? left : 0;
        }
    return next;
}

void bm_session_free_all(vki_batch_manager *bm)
{
    while (bm->sess_head)
        drop(bm, bm->sess_head);
    free(bm->session_ends);
    bm->session_ends = NULL;
}

vki_status vki_batch_session_end(vki_batch_manager *bm, uint64_t session_id)
{
    if (!bm || !session_id)
        return VKI_ERR_INVALID_ARG;
    vki_status st = VKI_OK;
    pthread_mutex_lock(&bm->mu);
    if (bm->n_session_ends == bm->session_ends_cap) {
        uint32_t cap = bm->session_ends_cap ? bm->session_ends_cap * 2 : 8;
        uint64_t *e = realloc(bm->session_ends, (size_t)cap * sizeof *e);
        if (e) {
            bm->session_ends = e;
            bm->session_ends_cap = cap;
        } else {
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
        }
    }
    if (st == VKI_OK) {
        bm->session_ends[bm->n_session_ends++] = session_id;
        pthread_cond_signal(&bm->cv);
    }
    pthread_mutex_unlock(&bm->mu);
    return st;
}

/* ---- session files: the worker's side (batch_session_file.c has the caller's) ------------------ */

#define JOB_FAIL(j, status, ...) ((void)snprintf((j)->err, sizeof (j)->err, __VA_ARGS__), (j)->st = (status))

uint64_t bm_kv_token_bytes(const bm_backend *be)
{
    return be->kv_read && be->kv_write ? (uint64_t)be->kv_layers * 2 * be->kv_heads * be->kv_row_bytes : 0;
}

/* A copy of the session's tokens and of its pinned blocks' KV (a busy session: as its last
 * finished request left them; pinned blocks are sealed, nothing writes them). O(KV bytes). */
static void save_job(vki_batch_manager *bm, bm_sess_job *j)
{
    const bm_session *x = find(bm, j->session_id);
    uint64_t ps = bm->be.page_size, tb = bm_kv_token_bytes(&bm->be);
    unsigned long long id = (unsigned long long)j->session_id;
    if (!x || !x->pin.n) {
        JOB_FAIL(j, VKI_ERR_NOT_FOUND, "session %llu holds no KV: no request of it has finished, or it ended, "
                 "expired or gave its KV up under pressure", id);
        return;
    }
    uint64_t n_kv = x->pin.n * ps, bytes = n_kv * tb;
    if (!x->tokens || x->n_tokens < n_kv) {
        JOB_FAIL(j, VKI_ERR_OUT_OF_HOST_MEMORY, "session %llu lost its token list (out of host memory)", id);
        return;
    }
    j->tokens = malloc((size_t)x->n_tokens * sizeof *j->tokens);
    j->kv = bytes <= SIZE_MAX ? malloc((size_t)bytes) : NULL;
    if (!j->tokens || !j->kv) {
        JOB_FAIL(j, VKI_ERR_OUT_OF_HOST_MEMORY, "out of host memory for session %llu's %llu bytes of KV", id,
                 (unsigned long long)bytes);
        return;
    }
    memcpy(j->tokens, x->tokens, (size_t)x->n_tokens * sizeof *j->tokens);
    j->n_tokens = x->n_tokens;
    j->n_kv = (uint32_t)n_kv;
    vki_status st = bm->be.kv_read(bm->be.ctx, x->pin.blocks, x->pin.n, j->kv);
    if (st != VKI_OK)
        JOB_FAIL(j, st, "copying session %llu's KV from the device: %s", id, vki_status_str(st));
}

/* Takes blocks for the file's whole pages, idle sessions giving way oldest first as they do for a
 * waiting request; on success *pin holds them and the fresh ones hold the file's KV. */
static void restore_pin(vki_batch_manager *bm, bm_sess_job *j, const bm_session *x, uint32_t n, sched_pin *pin)
{
    uint32_t fresh = 0, room = 0, ps = bm->be.page_size;
    vki_status st;
    while ((st = sched_pin_prepare(bm->s, j->tokens, n, pin, &fresh, &room)) == VKI_ERR_OUT_OF_DEVICE_MEMORY &&
           release_oldest(bm, x))
        ;
    if (st == VKI_ERR_OUT_OF_DEVICE_MEMORY) {
        JOB_FAIL(j, st, "the KV pool cannot hold the session's %u blocks now: %u are free beyond what running "
                 "requests may still need (pool of %u blocks)", n, room, bm->be.n_pages);
        return;
    }
    if (st != VKI_OK) {
        JOB_FAIL(j, st, "taking %u KV blocks: %s", n, vki_status_str(st));
        return;
    }
    uint64_t off = (uint64_t)(n - fresh) * ps * bm_kv_token_bytes(&bm->be);
    if (fresh && (st = bm->be.kv_write(bm->be.ctx, pin->blocks + (n - fresh), fresh, j->kv + off)) != VKI_OK) {
        sched_pin_release(bm->s, pin); /* the fresh blocks were never sealed: nobody finds them */
        JOB_FAIL(j, st, "copying the KV to the device: %s", vki_status_str(st));
        return;
    }
    sched_pin_commit(bm->s, j->tokens, pin, fresh);
}

/* The file's KV becomes session j->session_id's pinned KV, as if its conversation had run here:
 * an idle session of that id is replaced (its old pins released after the new ones are in), a
 * busy one refused. Whole pages only: j->n_kv becomes what was restored. */
static void restore_job(vki_batch_manager *bm, bm_sess_job *j)
{
    bm_session *x = find(bm, j->session_id), *y = x;
    uint32_t n = j->n_kv / bm->be.page_size, cap = cap_of(bm);
    unsigned long long id = (unsigned long long)j->session_id;
    if (x && x->busy)
        JOB_FAIL(j, VKI_ERR_INVALID_ARG, "a request of session %llu is running: restore when it is idle, or into "
                 "another session id", id);
    else if (!bm->p.block_reuse)
        JOB_FAIL(j, VKI_ERR_INVALID_ARG, "sessions need block_reuse (the prefix cache), which is off");
    else if (n > cap)
        JOB_FAIL(j, VKI_ERR_INVALID_ARG, "the file's %u KV blocks pass session_max_blocks (%u)", n, cap);
    int32_t *tokens = j->st == VKI_OK ? malloc((size_t)j->n_tokens * sizeof *tokens) : NULL;
    if (j->st == VKI_OK && (!tokens || (!y && !(y = calloc(1, sizeof *y)))))
        JOB_FAIL(j, VKI_ERR_OUT_OF_HOST_MEMORY, "out of host memory restoring session %llu", id);
    sched_pin pin = {0};
    if (j->st == VKI_OK)
        restore_pin(bm, j, x, n, &pin);
    if (j->st != VKI_OK) {
        if (y != x)
            free(y);
        free(tokens);
        return;
    }
    memcpy(tokens, j->tokens, (size_t)j->n_tokens * sizeof *tokens);
    if (x) {
        unlink_s(bm, x);
    } else {
        y->id = j->session_id;
        bm->n_sessions++;
    }
    sched_pin old = y->pin;
    y->pin = pin;
    sched_pin_release(bm->s, &old);
    free(y->tokens);
    y->tokens = tokens;
    y->n_tokens = j->n_tokens;
    y->ended = false;
    y->t_last = now_s();
    append(bm, y);
    while (pinned(bm) > cap && release_oldest(bm, y))
        ;
    j->n_kv = n * bm->be.page_size;
}

void bm_session_run_jobs(vki_batch_manager *bm, bm_sess_job *jobs)
{
    for (bm_sess_job *j = jobs, *next; j; j = next) {
        next = j->next; /* j belongs to its caller again once done is set */
        j->st = VKI_OK;
        if (j->restore)
            restore_job(bm, j);
        else
            save_job(bm, j);
        pthread_mutex_lock(&bm->mu);
        j->done = true;
        pthread_cond_broadcast(&bm->sess_cv);
        pthread_mutex_unlock(&bm->mu);
    }
}
