/* Stateful sessions in the batch manager (host/batch/batch_session.c, sched_pin_*) over the fake
 * engine: a session's KV survives traffic that evicts every unpinned block, so its next turn
 * computes only the new tokens (and without a session the same turn computes everything);
 * ending a session, idle expiry, the cap on pinned blocks (oldest idle session first) and pool
 * pressure (a waiting request that needs the pinned blocks gets them) each release pins. The
 * fake engine checks every page the steps read, so a pinned block that was overwritten, or a
 * wrong prefix, fails the test. Milliseconds. */
#include <pthread.h>
#include <unistd.h>

#include "support/fake_engine.h"
#include "support/vt.h"

#include "host/batch/batch.h"

#define VOCAB 48
#define MAXTOK 64

typedef struct got {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t finals;
    uint32_t n_cached[64];     /* by request id */
    int32_t toks[64][MAXTOK];  /* generated, by request id */
    uint32_t n_toks[64];
    vki_finish_reason finish[64];
    vki_batch_stats last;      /* the last tick's stats */
    uint32_t stats_finals;     /* finals seen when it came (a final is sent before its tick's stats) */
} got;

static void on_resp(void *user, const vki_response *r)
{
    got *g = user;
    pthread_mutex_lock(&g->mu);
    for (uint32_t k = 0; k < r->n_tokens && g->n_toks[r->id] < MAXTOK; k++)
        g->toks[r->id][g->n_toks[r->id]++] = r->tokens[k];
    if (r->final) {
        g->n_cached[r->id] = r->n_cached;
        g->finish[r->id] = r->finish;
        g->finals++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

static void on_tick(void *user, const vki_batch_stats *st)
{
    got *g = user;
    pthread_mutex_lock(&g->mu);
    g->last = *st;
    g->stats_finals = g->finals;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void wait_finals(got *g, uint32_t n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30; /* a hang guard */
    pthread_mutex_lock(&g->mu);
    while (g->finals < n && pthread_cond_timedwait(&g->cv, &g->mu, &ts) == 0)
        ;
    uint32_t have = g->finals;
    pthread_mutex_unlock(&g->mu);
    if (have < n)
        fail_msg("%u of %u final responses", have, n);
}

typedef struct rig {
    fake_engine *f;
    vki_batch_manager *bm;
    got g;
    uint32_t sent;
    int32_t prompt[64][MAXTOK]; /* by request id: kept while the request may be read */
} rig;

/* A pool of 24 blocks of 4 tokens, one or two sequences at once. */
static void rig_open(rig *r, vki_capacity_policy pol, double idle_s, uint32_t max_blocks)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->g.mu, NULL);
    pthread_cond_init(&r->g.cv, NULL);
    fake_config fc = {.max_seqs = 2, .n_pages = 24, .page_size = 4, .max_ctx = 128, .vocab = VOCAB,
                      .max_tokens = 64, .eos = -1};
    assert_int_equal(fake_create(&fc, &r->f), VKI_OK);
    bm_backend be = fake_backend(r->f);
    vki_batch_params p = vki_batch_default_params();
    p.policy = pol;
    p.chunk_size = 16;
    p.max_num_tokens = 64;
    p.seed = 5;
    p.session_idle_s = idle_s;
    p.session_max_blocks = max_blocks;
    vki_batch_callbacks cb = {.user = &r->g, .tick_stats = on_tick};
    assert_int_equal(bm_create(&be, &p, &cb, &r->bm), VKI_OK);
}

static void rig_close(rig *r)
{
    assert_int_equal(vki_batch_manager_destroy(r->bm, false), VKI_OK);
    char msg[256];
    if (fake_violations(r->f, msg, sizeof msg))
        fail_msg("fake engine: %s", msg);
    fake_destroy(r->f);
    pthread_cond_destroy(&r->g.cv);
    pthread_mutex_destroy(&r->g.mu);
}

/* Runs one request to its end: prompt[0..n) (copied), max_new tokens, in session sid (0 none).
 * Returns its id. */
static uint32_t run(rig *r, const int32_t *prompt, uint32_t n, uint32_t max_new, uint64_t sid)
{
    uint32_t id = r->sent++;
    assert_true(id < 64 && n <= MAXTOK);
    memcpy(r->prompt[id], prompt, n * sizeof *prompt);
    vki_request q = {.id = id, .prompt = r->prompt[id], .n_prompt = n, .max_new_tokens = max_new,
                     .sampling = vki_sampling_default_params(), .session_id = sid};
    q.sampling.temperature = 0;
    q.sampling.penalty_window = 0;
    char err[160] = "";
    if (vki_batch_submit(r->bm, &q, on_resp, &r->g, err, sizeof err) != VKI_OK)
        fail_msg("submit: %s", err);
    wait_finals(&r->g, r->sent);
    assert_int_equal(r->g.finish[id], VKI_FINISH_LENGTH);
    return id;
}

/* The stats of the tick that sent the last final response. */
static vki_batch_stats stats(rig *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30; /* a hang guard */
    pthread_mutex_lock(&r->g.mu);
    while (r->g.stats_finals != r->g.finals && pthread_cond_timedwait(&r->g.cv, &r->g.mu, &ts) == 0)
        ;
    vki_batch_stats s = r->g.last;
    pthread_mutex_unlock(&r->g.mu);
    return s;
}

static void fill(int32_t *t, uint32_t n, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (int32_t)(1 + (i * 7 + salt * 13 + (i * salt) % 5) % (VOCAB - 1));
}

/* Turn 1 (20 prompt + 4 generated), 3 unrelated requests of 40 + 4 tokens (33 blocks through a
 * pool of 24: every unpinned block is evicted), turn 2 = turn 1's tokens + 8 new. Returns the
 * prompt tokens turn 2 took from the cache. */
static uint32_t conversation(rig *r, uint64_t sid)
{
    int32_t t1[20], other[40], t2[32];
    fill(t1, 20, 1);
    uint32_t a = run(r, t1, 20, 4, sid);
    for (uint32_t k = 0; k < 3; k++) {
        fill(other, 40, 10 + k);
        run(r, other, 40, 4, 0);
    }
    memcpy(t2, t1, sizeof t1);
    memcpy(t2 + 20, r->g.toks[a], 4 * sizeof *t2);
    fill(t2 + 24, 8, 2);
    uint32_t b = run(r, t2, 32, 4, sid);
    return r->g.n_cached[b];
}

static void test_pinned_turn(void **state)
{
    (void)state;
    rig r;
    rig_open(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0);
    /* 23 of turn 1's 24 tokens were computed (the last sampled one is not): 5 whole blocks */
    assert_int_equal(conversation(&r, 7), 20);
    vki_batch_stats s = stats(&r);
    assert_int_equal(s.sessions, 1);
    /* turn 2 pinned its own 35 computed tokens' 8 blocks in place of turn 1's 5 */
    assert_int_equal(s.kv_pinned, 8);
    rig_close(&r);
    /* the same conversation without a session: the traffic evicted turn 1's blocks */
    rig_open(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0);
    assert_int_equal(conversation(&r, 0), 0);
    assert_int_equal(stats(&r).kv_pinned, 0);
    rig_close(&r);
}

static void test_end_and_expiry(void **state)
{
    (void)state;
    rig r;
    int32_t t[20];
    fill(t, 20, 3);
    rig_open(&r, VKI_POLICY_MAX_UTILIZATION, 0.2, 0);
    run(&r, t, 20, 4, 9);
    assert_int_equal(stats(&r).kv_pinned, 5);
    assert_int_equal(vki_batch_session_end(r.bm, 9), VKI_OK);
    fill(t, 20, 4);
    run(&r, t, 8, 2, 0); /* a tick after the end was applied */
    assert_int_equal(stats(&r).kv_pinned, 0);
    assert_int_equal(stats(&r).sessions, 0);
    assert_int_equal(vki_batch_session_end(r.bm, 0), VKI_ERR_INVALID_ARG);
    /* idle expiry: the worker wakes for it with nothing else to do */
    run(&r, t, 20, 4, 10);
    assert_int_equal(stats(&r).sessions, 1);
    usleep(400 * 1000);
    fill(t, 8, 5);
    run(&r, t, 8, 2, 0);
    assert_int_equal(stats(&r).sessions, 0);
    assert_int_equal(stats(&r).kv_pinned, 0);
    rig_close(&r);
}

static void test_cap_and_pressure(void **state)
{
    (void)state;
    rig r;
    int32_t t[MAXTOK];
    /* cap 6 blocks: a second session's 5 push the first (oldest, idle) out */
    rig_open(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 6);
    fill(t, 20, 6);
    run(&r, t, 20, 4, 1);
    fill(t, 20, 7);
    uint32_t b = run(&r, t, 20, 4, 2);
    assert_int_equal(stats(&r).sessions, 1);
    assert_int_equal(stats(&r).kv_pinned, 5);
    /* session 2 kept its blocks: its next turn reuses them */
    int32_t t2[28];
    memcpy(t2, r.prompt[b], 20 * sizeof *t2);
    memcpy(t2 + 20, r.g.toks[b], 4 * sizeof *t2);
    fill(t2 + 24, 4, 8);
    uint32_t c = run(&r, t2, 28, 4, 2);
    assert_int_equal(r.g.n_cached[c], 20);
    rig_close(&r);
    /* pressure: three sessions pin 15 of 24 blocks; a request that needs 15 (59 tokens of KV)
     * gets them from the two oldest sessions, the newest keeps its KV */
    rig_open(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 24);
    uint32_t last = 0;
    for (uint32_t k = 0; k < 3; k++) {
        fill(t, 20, 20 + k);
        last = run(&r, t, 20, 4, 100 + k);
    }
    assert_int_equal(stats(&r).kv_pinned, 15);
    fill(t, 50, 30);
    run(&r, t, 50, 10, 0);
    vki_batch_stats s = stats(&r);
    assert_int_equal(s.sessions, 1);
    assert_int_equal(s.kv_pinned, 5);
    memcpy(t2, r.prompt[last], 20 * sizeof *t2);
    memcpy(t2 + 20, r.g.toks[last], 4 * sizeof *t2);
    fill(t2 + 24, 4, 9);
    c = run(&r, t2, 28, 4, 102);
    assert_int_equal(r.g.n_cached[c], 20);
    rig_close(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned_turn),
        cmocka_unit_test(test_end_and_expiry),
        cmocka_unit_test(test_cap_and_pressure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
