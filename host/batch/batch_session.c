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
 * device holds in KV; the pins cost O(blocks) each. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/batch/batch.h"

typedef struct bm_session {
    uint64_t id;
    sched_pin pin;             /* its blocks, from its last finished request */
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
    free(x);
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
    x->t_last = now_s();
    unlink_s(bm, x);
    append(bm, x);
    if (!bm->session_cap) {
        sched_stats st;
        sched_get_stats(bm->s, &st);
        bm->session_cap = bm->p.session_max_blocks ? bm->p.session_max_blocks : st.kv.max_blocks / 2;
    }
    while (pinned(bm) > bm->session_cap && release_oldest(bm, x))
        ;
    if (pinned(bm) > bm->session_cap) /* this one alone passes the cap */
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
