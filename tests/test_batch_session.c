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
static fake_config rig_config(void)
{
    return (fake_config){.max_seqs = 2, .n_pages = 24, .page_size = 4, .max_ctx = 128, .vocab = VOCAB,
                         .max_tokens = 64, .eos = -1};
}

static void rig_open_with(rig *r, vki_capacity_policy pol, double idle_s, uint32_t max_blocks, const fake_config *fc)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->g.mu, NULL);
    pthread_cond_init(&r->g.cv, NULL);
    assert_int_equal(fake_create(fc, &r->f), VKI_OK);
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

static void rig_open(rig *r, vki_capacity_policy pol, double idle_s, uint32_t max_blocks)
{
    fake_config fc = rig_config();
    rig_open_with(r, pol, idle_s, max_blocks, &fc);
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

/* ---- session files -------------------------------------------------------------------------- */

static void tmp_path(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "/tmp/vki_test_sess_%d_%s", (int)getpid(), name);
}

static size_t slurp(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void spit(const char *path, const uint8_t *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

/* restore must fail with status want and a message containing needle */
static void refused(vki_batch_manager *bm, uint64_t sid, const char *path, vki_status want, const char *needle)
{
    char err[384] = "";
    vki_status st = vki_batch_session_restore(bm, sid, path, NULL, err, sizeof err);
    if (st != want || !strstr(err, needle))
        fail_msg("restore %s: status %d (%s), want %d naming '%s'", path, st, err, want, needle);
}

/* Save, end, traffic that evicts every unpinned block, restore: the next turn computes only its
 * new tokens and continues exactly as the conversation without save and restore; restoring into
 * a session that holds pins replaces them. The fake engine checks every restored page it reads. */
static void test_file_round_trip(void **state)
{
    (void)state;
    rig r;
    char path[128], err[256] = "";
    tmp_path(path, sizeof path, "a");
    rig_open(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0);
    int32_t t1[20], other[40], t2[32], back[64];
    fill(t1, 20, 1);
    uint32_t a = run(&r, t1, 20, 4, 7);
    vki_session_file_info fi = {0};
    if (vki_batch_session_save(r.bm, 7, path, &fi, err, sizeof err) != VKI_OK)
        fail_msg("save: %s", err);
    /* 24 tokens, the KV of 5 whole blocks (20 tokens) of 32 bytes each: 128 + 96 + 640 + 8 */
    assert_int_equal(fi.n_tokens, 24);
    assert_int_equal(fi.n_kv_tokens, 20);
    assert_int_equal(fi.bytes, 872);
    assert_int_equal(vki_batch_session_end(r.bm, 7), VKI_OK);
    for (uint32_t k = 0; k < 3; k++) {
        fill(other, 40, 10 + k);
        run(&r, other, 40, 4, 0);
    }
    assert_int_equal(stats(&r).kv_pinned, 0);
    vki_session_file_info ri = {.tokens = back, .tokens_cap = 64};
    if (vki_batch_session_restore(r.bm, 7, path, &ri, err, sizeof err) != VKI_OK)
        fail_msg("restore: %s", err);
    assert_int_equal(ri.n_tokens, 24);
    assert_int_equal(ri.n_kv_tokens, 20);
    assert_int_equal(ri.fingerprint, fi.fingerprint);
    assert_memory_equal(back, t1, sizeof t1);
    assert_memory_equal(back + 20, r.g.toks[a], 4 * sizeof *back);
    uint32_t copies = fake_kv_copies(r.f);
    memcpy(t2, back, 24 * sizeof *t2);
    fill(t2 + 24, 8, 2);
    uint32_t b = run(&r, t2, 32, 4, 7);
    assert_int_equal(r.g.n_cached[b], 20); /* only the 12 new tokens were computed */
    int32_t want[4];
    fake_reference(r.f, t2, 32, 4, false, 0, want, NULL);
    assert_memory_equal(r.g.toks[b], want, sizeof want);
    assert_int_equal(stats(&r).kv_pinned, 8);
    /* into a session holding pins: replaced (5 blocks again), the prefix blocks shared, not copied */
    if (vki_batch_session_restore(r.bm, 7, path, &ri, err, sizeof err) != VKI_OK)
        fail_msg("restore over pins: %s", err);
    assert_int_equal(fake_kv_copies(r.f), copies); /* all 5 blocks were cached: nothing written */
    fill(t1, 8, 6);
    run(&r, t1, 8, 2, 0); /* a tick, for the stats */
    assert_int_equal(stats(&r).kv_pinned, 5);
    assert_int_equal(stats(&r).sessions, 1);
    rig_close(&r);
    /* another manager (a restart): a fresh pool, so every block is written */
    rig_open(&r, VKI_POLICY_MAX_UTILIZATION, 60, 0);
    if (vki_batch_session_restore(r.bm, 99, path, NULL, err, sizeof err) != VKI_OK)
        fail_msg("restore after restart: %s", err);
    assert_int_equal(fake_kv_copies(r.f), 1);
    b = run(&r, t2, 32, 4, 99);
    assert_int_equal(r.g.n_cached[b], 20);
    assert_memory_equal(r.g.toks[b], want, sizeof want);
    rig_close(&r);
    remove(path);
}

/* Files that must be refused, each with a message naming why, and nothing changed: bad calls,
 * another model, another version, truncation at every length, every single-byte flip, a token
 * outside the vocabulary, a context too short, KV computed with other LongRoPE factors or without
 * the RoPE attention factor in K, more blocks than session_max_blocks. */
static void test_file_refusals(void **state)
{
    (void)state;
    rig r;
    char path[128], bad[128], err[384] = "";
    tmp_path(path, sizeof path, "good");
    tmp_path(bad, sizeof bad, "bad");
    rig_open(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0);
    int32_t t[20];
    fill(t, 20, 3);
    run(&r, t, 20, 4, 5);
    assert_int_equal(vki_batch_session_save(r.bm, 5, path, NULL, err, sizeof err), VKI_OK);
    assert_int_equal(vki_batch_session_save(r.bm, 6, path, NULL, err, sizeof err), VKI_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "session 6 holds no KV"));
    assert_int_equal(vki_batch_session_save(r.bm, 0, path, NULL, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_int_equal(vki_batch_session_save(r.bm, 5, "/nonexistent/dir/x", NULL, err, sizeof err), VKI_ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/dir/x"));
    assert_int_equal(vki_batch_session_save(NULL, 5, path, NULL, err, sizeof err), VKI_ERR_INVALID_ARG);
    refused(r.bm, 5, "/nonexistent/dir/x", VKI_ERR_NOT_FOUND, "/nonexistent/dir/x");
    refused(r.bm, 5, "/tmp", VKI_ERR_IO, "not a regular file");

    static uint8_t file[1024], mod[1024];
    size_t n = slurp(path, file, sizeof file);
    assert_int_equal(n, 872);
    for (size_t len = 0; len < n; len++) { /* every truncation */
        spit(bad, file, len);
        vki_status st = vki_batch_session_restore(r.bm, 5, bad, NULL, err, sizeof err);
        if (st != VKI_ERR_FORMAT || (!strstr(err, "truncated") && !strstr(err, "less than a header")))
            fail_msg("truncated to %zu bytes: status %d: %s", len, st, err);
    }
    memcpy(mod, file, n);
    mod[n] = 0;
    spit(bad, mod, n + 1);
    refused(r.bm, 5, bad, VKI_ERR_FORMAT, "longer than its contents");
    for (size_t i = 0; i < n; i++) { /* every single-byte flip */
        memcpy(mod, file, n);
        mod[i] ^= (uint8_t)(1u << (i % 8));
        spit(bad, mod, n);
        vki_status st = vki_batch_session_restore(r.bm, 5, bad, NULL, err, sizeof err);
        if (st == VKI_OK || !err[0])
            fail_msg("byte %zu flipped: restored (%s)", i, err);
    }
    memcpy(mod, file, n);
    mod[8] = 2; /* version */
    spit(bad, mod, n);
    refused(r.bm, 5, bad, VKI_ERR_UNSUPPORTED, "format version 2; this build reads version 1");
    mod[8] = 1;
    mod[0] = 'X';
    spit(bad, mod, n);
    refused(r.bm, 5, bad, VKI_ERR_FORMAT, "not a vkinfer session file");
    memcpy(mod, file, n);
    mod[200] ^= 1; /* in the KV */
    spit(bad, mod, n);
    refused(r.bm, 5, bad, VKI_ERR_FORMAT, "corrupted: checksum");
    memcpy(mod, file, n);
    mod[112] ^= 1; /* n_tokens */
    spit(bad, mod, n);
    refused(r.bm, 5, bad, VKI_ERR_FORMAT, "header is corrupted");
    assert_int_equal(stats(&r).kv_pinned, 5); /* the session was never touched */
    rig_close(&r);

    fake_config fc = rig_config();
    fc.fingerprint = 0x1234; /* another model of the same shape (another fine-tune) */
    rig_open_with(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0, &fc);
    refused(r.bm, 5, path, VKI_ERR_INVALID_ARG, "from another model: 'fake' (fingerprint fa4efa4efa4efa4e); this "
            "engine runs 'fake' (fingerprint 0000000000001234)");
    rig_close(&r);
    fc = rig_config();
    fc.kv_flags = BM_KV_ROPE_LONG; /* the same model, but a context that chose LongRoPE's long factors */
    rig_open_with(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0, &fc);
    refused(r.bm, 5, path, VKI_ERR_INVALID_ARG, "LongRoPE's short factors, this engine uses the long ones");
    rig_close(&r);
    fc = rig_config();
    fc.kv_flags = BM_KV_ROPE_MAG; /* K scaled by the RoPE attention factor, where the file's is not */
    rig_open_with(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0, &fc);
    refused(r.bm, 5, path, VKI_ERR_INVALID_ARG, "its K was stored without the RoPE attention factor, this engine "
            "stores it scaled");
    rig_close(&r);
    fc = rig_config();
    fc.vocab = 8; /* the file's ids reach 47 */
    rig_open_with(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0, &fc);
    refused(r.bm, 5, path, VKI_ERR_FORMAT, "outside the vocabulary (8)");
    rig_close(&r);
    fc = rig_config();
    fc.max_ctx = 16;
    rig_open_with(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0, &fc);
    refused(r.bm, 5, path, VKI_ERR_INVALID_ARG, "holds 24 tokens; this engine's context is 16");
    rig_close(&r);
    rig_open(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 4);
    refused(r.bm, 5, path, VKI_ERR_INVALID_ARG, "5 KV blocks pass session_max_blocks (4)");
    rig_close(&r);
    remove(path);
    remove(bad);
}

/* A gate in the fake's steps: the worker blocks in a step until the test lets one through. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t allow;             /* steps that may still pass; < 0: all */
    uint32_t waiting;          /* a step is blocked at the gate */
} gate;

static void gate_step(void *user, const vki_step_plan *plan)
{
    (void)plan;
    gate *g = user;
    pthread_mutex_lock(&g->mu);
    g->waiting = 1;
    pthread_cond_broadcast(&g->cv);
    while (g->allow == 0)
        pthread_cond_wait(&g->cv, &g->mu);
    if (g->allow > 0)
        g->allow--;
    g->waiting = 0;
    pthread_mutex_unlock(&g->mu);
}

static void gate_let(gate *g, int32_t n)
{
    pthread_mutex_lock(&g->mu);
    g->allow = n;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_wait_blocked(gate *g)
{
    pthread_mutex_lock(&g->mu);
    while (!(g->waiting && g->allow == 0))
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

typedef struct bg_call {
    vki_batch_manager *bm;
    bool save;
    uint64_t sid;
    const char *path;
    vki_status st;
    char err[256];
    vki_session_file_info fi;
} bg_call;

static void *bg_call_run(void *arg)
{
    bg_call *b = arg;
    b->st = b->save ? vki_batch_session_save(b->bm, b->sid, b->path, &b->fi, b->err, sizeof b->err)
                    : vki_batch_session_restore(b->bm, b->sid, b->path, &b->fi, b->err, sizeof b->err);
    return NULL;
}

/* b's call from another thread while the worker holds at the gate: it waits for the next tick
 * boundary, which comes when one step is let through. */
static void call_at_boundary(rig *r, gate *g, bg_call *b)
{
    pthread_t th;
    b->bm = r->bm;
    pthread_create(&th, NULL, bg_call_run, b);
    for (;;) { /* queued behind the held step */
        pthread_mutex_lock(&r->bm->mu);
        bool queued = r->bm->sess_jobs != NULL;
        pthread_mutex_unlock(&r->bm->mu);
        if (queued)
            break;
        usleep(1000);
    }
    gate_let(g, 1);
    pthread_join(th, NULL);
    gate_wait_blocked(g);
}

/* While a request of session 9 runs (held at the gate) with 20 of the 24 blocks reserved: saving
 * session 9 writes what its previous request left; restoring into it is refused (busy); a
 * restore into another session whose 5 blocks are merely cached (evictable) is refused naming
 * the pool, which has 4 blocks beyond the running request's reservation; the running request is
 * undisturbed; once it finished the same restore works. */
static void test_file_busy_and_pool(void **state)
{
    (void)state;
    gate g = {.allow = -1};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    fake_config fc = rig_config();
    fc.on_step = gate_step;
    fc.on_step_user = &g;
    rig r;
    rig_open_with(&r, VKI_POLICY_GUARANTEED_NO_EVICT, 60, 0, &fc);
    char p8[128], p9[128], err[256] = "";
    tmp_path(p8, sizeof p8, "s8");
    tmp_path(p9, sizeof p9, "s9");
    int32_t t[MAXTOK];
    fill(t, 20, 4);
    run(&r, t, 20, 4, 9); /* id 0: 5 blocks pinned for session 9 */
    fill(t, 20, 5);
    run(&r, t, 20, 4, 8); /* id 1 */
    assert_int_equal(vki_batch_session_save(r.bm, 8, p8, NULL, err, sizeof err), VKI_OK);
    assert_int_equal(vki_batch_session_end(r.bm, 8), VKI_OK); /* its blocks stay cached, unpinned */
    /* the next turn of session 9: 24 + 56 tokens reserve 20 blocks under NO_EVICT */
    memcpy(t, r.prompt[0], 20 * sizeof *t);
    memcpy(t + 20, r.g.toks[0], 4 * sizeof *t);
    gate_let(&g, 1); /* its prompt passes, then it holds at the gate */
    uint32_t id = r.sent++;
    memcpy(r.prompt[id], t, 24 * sizeof *t);
    vki_request q = {.id = id, .prompt = r.prompt[id], .n_prompt = 24, .max_new_tokens = 56,
                     .sampling = vki_sampling_default_params(), .session_id = 9};
    q.sampling.temperature = 0;
    q.sampling.penalty_window = 0;
    assert_int_equal(vki_batch_submit(r.bm, &q, on_resp, &r.g, err, sizeof err), VKI_OK);
    gate_wait_blocked(&g);
    bg_call save9 = {.save = true, .sid = 9, .path = p9}, into9 = {.sid = 9, .path = p8},
            into10 = {.sid = 10, .path = p8};
    call_at_boundary(&r, &g, &save9);
    if (save9.st != VKI_OK)
        fail_msg("save while busy: %s", save9.err);
    assert_int_equal(save9.fi.n_tokens, 24); /* what its first request left */
    assert_int_equal(save9.fi.n_kv_tokens, 20);
    call_at_boundary(&r, &g, &into9);
    assert_int_equal(into9.st, VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(into9.err, "a request of session 9 is running"));
    call_at_boundary(&r, &g, &into10);
    assert_int_equal(into10.st, VKI_ERR_OUT_OF_DEVICE_MEMORY);
    if (!strstr(into10.err, "cannot hold the session's 5 blocks now: 4 are free"))
        fail_msg("%s", into10.err);
    gate_let(&g, -1);
    wait_finals(&r.g, r.sent);
    assert_int_equal(r.g.finish[id], VKI_FINISH_LENGTH);
    int32_t want[56];
    fake_reference(r.f, t, 24, 56, false, 0, want, NULL);
    assert_memory_equal(r.g.toks[id], want, sizeof want);
    if (vki_batch_session_restore(r.bm, 10, p8, NULL, err, sizeof err) != VKI_OK)
        fail_msg("restore when idle: %s", err);
    rig_close(&r);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    remove(p8);
    remove(p9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pinned_turn),
        cmocka_unit_test(test_end_and_expiry),
        cmocka_unit_test(test_cap_and_pressure),
        cmocka_unit_test(test_file_round_trip),
        cmocka_unit_test(test_file_refusals),
        cmocka_unit_test(test_file_busy_and_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
