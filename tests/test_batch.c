/* Batch manager: the worker thread with the push interface and the TensorRT-LLM-style
 * callbacks, over the fake engine. Every output is compared with what the request produces
 * alone; every request gets exactly one final response; streaming delivers each token once;
 * cancellation in every state; duplicate ids; queue bound; validation messages; step failures;
 * stats JSON; destroy with and without abort. Tests that need the worker held at a known point
 * use a gate in the fake engine's on_step hook (the worker blocks inside the step). */
#include <pthread.h>
#include <sched.h>

#include <cjson/cJSON.h>

#include "support/fake_engine.h"
#include "support/vt.h"

#include "host/batch/batch.h"

#define NREC 1024
#define MAXTOK 200
#define VOCAB 48
#define EOS 0

typedef struct rec {
    bool streaming, want_lp;
    bool dup;                     /* a duplicate submission was refused: two finals expected */
    uint32_t n_top;
    int32_t tokens[MAXTOK];
    float lp[MAXTOK];
    int32_t top[MAXTOK][4];
    uint32_t n_tokens, n_responses, n_final;
    double cum;
    vki_finish_reason finish;
    char error[200];
    vki_status status;
    uint64_t seed;
    uint32_t seq_len;
} rec;

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rec r[NREC];
    uint32_t finals;
    char bad[256];                /* first protocol violation seen by a callback */
    /* stats */
    uint32_t n_stats;
    char stats_bad[256];
    uint32_t max_paused_seen;
    uint32_t idle_streak;         /* consecutive stats objects with nothing in flight */
    char last_stats[2048];
    uint64_t cancel_when_paused;  /* cancel this id from the stats callback once a pause shows */
    bool cancelled_paused;
    /* callback interface */
    vki_request *pending;         /* handed out by get_requests */
    uint32_t n_pending, next_pending;
    int32_t max_seen_min, max_seen_max;
    uint32_t n_get_calls;
    uint64_t stops[16];
    uint32_t n_stops;
    vki_batch_manager *bm;        /* for callbacks that call back into the manager */
    vki_status submit_in_shutdown;
    vki_status destroy_in_cb;
} coll;

static coll *coll_new(void)
{
    coll *c = calloc(1, sizeof *c);
    assert_non_null(c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->max_seen_min = INT32_MAX;
    c->max_seen_max = INT32_MIN;
    c->submit_in_shutdown = VKI_OK;
    c->destroy_in_cb = VKI_OK;
    return c;
}

static void coll_free(coll *c)
{
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

static void bad(coll *c, const char *what, uint64_t id)
{
    if (!c->bad[0])
        snprintf(c->bad, sizeof c->bad, "id %llu: %s", (unsigned long long)id, what);
}

static void on_response(void *user, const vki_response *resp)
{
    coll *c = user;
    pthread_mutex_lock(&c->mu);
    if (resp->id >= NREC) {
        bad(c, "unknown id", resp->id);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    rec *x = &c->r[resp->id];
    x->n_responses++;
    if (x->n_final && !x->dup)
        bad(c, "response after the final one", resp->id);
    if (!resp->final && !x->streaming)
        bad(c, "non-final response to a non-streaming request", resp->id);
    if (x->streaming && resp->n_tokens > 1)
        bad(c, "streaming response with more than one token", resp->id);
    if (!resp->final && resp->finish != VKI_FINISH_NONE)
        bad(c, "finish reason on a non-final response", resp->id);
    if ((resp->logprobs != NULL) != (x->want_lp && resp->n_tokens > 0))
        bad(c, "logprobs present/absent wrongly", resp->id);
    for (uint32_t k = 0; k < resp->n_tokens && x->n_tokens < MAXTOK; k++, x->n_tokens++) {
        x->tokens[x->n_tokens] = resp->tokens[k];
        if (resp->logprobs)
            x->lp[x->n_tokens] = resp->logprobs[k];
        for (uint32_t j = 0; j < resp->n_top && j < 4; j++)
            x->top[x->n_tokens][j] = resp->top_tokens[k * resp->n_top + j];
    }
    x->cum = resp->cum_logprob;
    x->seed = resp->seed;
    x->seq_len = resp->seq_len;
    if (resp->final) {
        x->finish = resp->finish;
        snprintf(x->error, sizeof x->error, "%s", resp->error ? resp->error : "");
        if (resp->finish == VKI_FINISH_NONE)
            bad(c, "final response without a finish reason", resp->id);
        if ((resp->finish == VKI_FINISH_ERROR) != (resp->error != NULL))
            bad(c, "error text present/absent wrongly", resp->id);
        if ((resp->finish == VKI_FINISH_ERROR) != (resp->status < 0))
            bad(c, "status must be an error exactly for error finishes", resp->id);
        x->status = resp->status;
        x->n_final++;
        c->finals++;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Waits (up to a generous hang guard, not a performance bound) for n final responses. */
static void wait_finals(coll *c, uint32_t n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    pthread_mutex_lock(&c->mu);
    while (c->finals < n)
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0)
            break;
    uint32_t got = c->finals;
    pthread_mutex_unlock(&c->mu);
    if (got < n)
        fail_msg("only %u of %u final responses arrived", got, n);
}

/* ---- requests and their references -------------------------------------------------------- */

static int32_t g_prompts[NREC][64];

static vki_request mkreq(coll *c, uint64_t id, uint32_t n_prompt, uint32_t max_new, bool streaming, uint32_t salt)
{
    for (uint32_t i = 0; i < n_prompt; i++)
        g_prompts[id][i] = (int32_t)(1 + (i * 5 + salt * 11 + (i * salt) % 7) % (VOCAB - 1));
    vki_request r = {.id = id, .prompt = g_prompts[id], .n_prompt = n_prompt, .max_new_tokens = max_new,
                     .sampling = vki_sampling_default_params(), .streaming = streaming};
    r.sampling.temperature = 0;
    r.sampling.penalty_window = 0;
    c->r[id].streaming = streaming;
    return r;
}

static void set_lp(coll *c, vki_request *r, bool logprobs, uint32_t top)
{
    r->sampling.logprobs = logprobs;
    r->sampling.top_logprobs = top;
    c->r[r->id].want_lp = logprobs || top;
    c->r[r->id].n_top = top;
}

/* The request's output against fake_reference: exact for eos/length/stop, a prefix otherwise;
 * response count, logprobs, top alternatives, seq_len. */
static void check_rec(coll *c, const fake_engine *f, const vki_request *q)
{
    rec *x = &c->r[q->id];
    assert_int_equal(x->n_final, 1);
    int32_t ref[MAXTOK];
    float lp[MAXTOK];
    assert_true(q->max_new_tokens <= MAXTOK);
    fake_reference(f, q->prompt, q->n_prompt, q->max_new_tokens, q->sampling.temperature > 0, x->seed, ref, lp);
    if (q->sampling.has_seed)
        assert_true(x->seed == q->sampling.seed);
    uint32_t n = 0;
    vki_finish_reason why = VKI_FINISH_LENGTH;
    for (; n < q->max_new_tokens; n++) {
        bool end = false, stop = false;
        for (uint32_t i = 0; i < q->n_end_ids; i++)
            end |= q->end_ids[i] == ref[n];
        if (!q->n_end_ids)
            end = fake_is_eog((void *)f, ref[n]);
        for (uint32_t i = 0; i < q->n_stop_ids; i++)
            stop |= q->stop_ids[i] == ref[n];
        if (end || stop) {
            why = end ? VKI_FINISH_EOS : VKI_FINISH_STOP;
            n++;
            break;
        }
    }
    for (uint32_t k = 0; k < x->n_tokens; k++) {
        if (k >= n || x->tokens[k] != ref[k])
            fail_msg("id %llu: token %u is %d, alone it is %d", (unsigned long long)q->id, k, x->tokens[k],
                     k < n ? ref[k] : -1);
        if (x->want_lp)
            assert_true(x->lp[k] == lp[k]);
        for (uint32_t j = 0; j < x->n_top && j < 4; j++)
            assert_int_equal(x->top[k][j], (ref[k] + 1 + (int32_t)j) % VOCAB);
    }
    if (x->finish == VKI_FINISH_CANCELLED || x->finish == VKI_FINISH_ERROR) {
        assert_true(x->n_tokens <= n);
    } else {
        if (x->finish != why)
            fail_msg("id %llu: finish %d, expected %d", (unsigned long long)q->id, x->finish, why);
        assert_int_equal(x->n_tokens, n);
    }
    if (x->want_lp) {
        double sum = 0;
        for (uint32_t k = 0; k < x->n_tokens; k++)
            sum += x->lp[k];
        assert_true(fabs(sum - x->cum) <= 1e-4 * (1 + fabs(sum)));
    }
    assert_int_equal(x->seq_len, q->n_prompt + x->n_tokens);
    if (!x->streaming)
        assert_int_equal(x->n_responses, 1);
    else
        assert_int_equal(x->n_responses, x->n_tokens + (x->finish == VKI_FINISH_CANCELLED ||
                                                        x->finish == VKI_FINISH_ERROR));
}

static void assert_clean(coll *c, fake_engine *f)
{
    char msg[256];
    if (c->bad[0])
        fail_msg("%s", c->bad);
    if (c->stats_bad[0])
        fail_msg("stats: %s", c->stats_bad);
    if (fake_violations(f, msg, sizeof msg))
        fail_msg("fake engine: %s", msg);
}

static fake_engine *mkfake_failing(uint32_t max_seqs, uint32_t n_pages, uint32_t fail_every, vki_status fail_status)
{
    /* the executor's step holds 40 tokens, fewer than the managers' budget of 48 (mkparams):
     * the fake flags any plan above 40 */
    fake_config fc = {.max_seqs = max_seqs, .n_pages = n_pages, .page_size = 4, .max_ctx = 512, .vocab = VOCAB,
                      .max_tokens = 40, .eos = EOS, .fail_every = fail_every, .fail_status = fail_status};
    fake_engine *f;
    assert_int_equal(fake_create(&fc, &f), VKI_OK);
    return f;
}

static fake_engine *mkfake(uint32_t max_seqs, uint32_t n_pages, uint32_t fail_every)
{
    return mkfake_failing(max_seqs, n_pages, fail_every, VKI_ERR_DEVICE_LOST);
}

static vki_batch_params mkparams(vki_capacity_policy pol)
{
    vki_batch_params p = vki_batch_default_params();
    p.policy = pol;
    p.chunk_size = 16;
    p.max_num_tokens = 48;
    p.seed = 1234;
    return p;
}

/* ---- push interface: mixed workload under each policy ---------------------------------------- */

/* fail_every: every Nth step fails with an error the engine survives (out of device memory): exactly
 * that step's requests end, the rest go on */
static void mixed_workload(vki_capacity_policy pol, uint32_t n_pages, uint32_t fail_every)
{
    vt_rng rng = vt_rng_seeded("batch mixed");
    coll *c = coll_new();
    fake_engine *f = mkfake_failing(8, n_pages, fail_every, VKI_ERR_OUT_OF_DEVICE_MEMORY);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(pol);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
    enum { N = 120 };
    static vki_request reqs[N];
    static int32_t stop_ids[N][2];
    for (uint32_t i = 0; i < N; i++) {
        vki_request r = mkreq(c, i, vt_range(&rng, 1, 60), vt_range(&rng, 1, 80), vt_range(&rng, 0, 1), i % 9);
        if (i % 3 == 0) {
            r.sampling.temperature = 0.7f;
            r.sampling.has_seed = i % 2;
            r.sampling.seed = 1000 + i;
        }
        if (i % 4 == 1)
            set_lp(c, &r, true, i % 8 == 1 ? 3 : 0);
        if (i % 10 == 7) { /* stop on two ordinary tokens */
            stop_ids[i][0] = 5;
            stop_ids[i][1] = 17;
            r.stop_ids = stop_ids[i];
            r.n_stop_ids = 2;
        }
        r.sampling.penalty_window = i % 5 ? 0 : 16;
        r.priority = (int32_t)(i % 3);
        reqs[i] = r;
        char err[200];
        vki_status st = vki_batch_submit(bm, &r, on_response, c, err, sizeof err);
        if (st != VKI_OK)
            fail_msg("submit %u: %s (%s)", i, vki_status_str(st), err);
    }
    wait_finals(c, N);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    uint32_t errors = 0;
    for (uint32_t i = 0; i < N; i++) {
        check_rec(c, f, &reqs[i]);
        errors += c->r[i].finish == VKI_FINISH_ERROR;
        if (c->r[i].finish == VKI_FINISH_ERROR) {
            assert_non_null(strstr(c->r[i].error, "engine step failed"));
            assert_int_equal(c->r[i].status, VKI_ERR_OUT_OF_DEVICE_MEMORY); /* the fake's failure */
        }
    }
    assert_true(fail_every ? errors > 0 : errors == 0);
    if (be.submit && pol != VKI_POLICY_STATIC) { /* VKI_FAKE_OVERLAP: lookahead steps ran */
        printf("lookahead rows (VKI_TOKEN_PREV): %llu\n", (unsigned long long)fake_prev_rows(f));
        assert_true(fake_prev_rows(f) > 0);
    }
    /* the executor's cap (40) is never passed; whether a step reaches it depends on arrival timing */
    assert_true(fake_max_tokens_seen(f) > 0 && fake_max_tokens_seen(f) <= 40);
    /* requests 0 and 6 sample without a seed: theirs were drawn, and differ */
    assert_false(reqs[0].sampling.has_seed || reqs[6].sampling.has_seed);
    assert_true(c->r[0].seed != c->r[6].seed);
    fake_destroy(f);
    coll_free(c);
}

static void test_push_no_evict(void **state) { (void)state; mixed_workload(VKI_POLICY_GUARANTEED_NO_EVICT, 256, 0); }
static void test_push_max_util_small_pool(void **state) { (void)state; mixed_workload(VKI_POLICY_MAX_UTILIZATION, 40, 0); }
static void test_push_static(void **state) { (void)state; mixed_workload(VKI_POLICY_STATIC, 256, 0); }
static void test_push_step_failures(void **state) { (void)state; mixed_workload(VKI_POLICY_GUARANTEED_NO_EVICT, 256, 11); }

/* A lost device ends every request in flight once, with the loss as its status, and refuses what
 * comes after it: a submission racing the failing step is either refused at the door or ended. */
static void test_push_device_lost(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(8, 256, 3);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
    enum { N = 24 };
    static vki_request reqs[N];
    bool accepted[N];
    uint32_t n_accepted = 0;
    for (uint32_t i = 0; i < N; i++) {
        reqs[i] = mkreq(c, i, 4 + i % 7, 30, i % 2, i % 9);
        char err[200];
        vki_status st = vki_batch_submit(bm, &reqs[i], on_response, c, err, sizeof err);
        if (st != VKI_OK && st != VKI_ERR_DEVICE_LOST)
            fail_msg("submit %u: %s (%s)", i, vki_status_str(st), err);
        accepted[i] = st == VKI_OK;
        n_accepted += accepted[i];
    }
    assert_true(n_accepted > 0); /* the first is in before any step ran */
    wait_finals(c, n_accepted);
    char err[200];
    vki_request late = mkreq(c, N, 5, 10, false, 1);
    assert_int_equal(vki_batch_submit(bm, &late, on_response, c, err, sizeof err), VKI_ERR_DEVICE_LOST);
    assert_non_null(strstr(err, "lost"));
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    uint32_t errors = 0;
    for (uint32_t i = 0; i < N; i++) {
        rec *x = &c->r[i];
        if (!accepted[i]) {
            assert_int_equal(x->n_final, 0);
            continue;
        }
        assert_int_equal(x->n_final, 1);
        check_rec(c, f, &reqs[i]);
        if (x->finish == VKI_FINISH_ERROR) {
            errors++;
            assert_int_equal(x->status, VKI_ERR_DEVICE_LOST);
            assert_non_null(strstr(x->error, "lost"));
        }
    }
    assert_int_equal(c->r[N].n_final, 0);
    /* 30 new tokens each cannot finish within the 2 steps before the third fails */
    assert_true(errors > 0);
    printf("device lost: %u of %u accepted, %u ended by the loss\n", n_accepted, N, errors);
    fake_destroy(f);
    coll_free(c);
}

/* ---- lookahead steps ------------------------------------------------------------------------ */

typedef struct la_ctx {
    coll *c;
    vki_batch_manager *bm;
    vki_request *late;            /* [n_late] submitted from a callback while lookaheads run */
    uint32_t n_late;
    bool late_sent, cancel_sent;
} la_ctx;

/* Streams into the collector; request 3's 12th token cancels it, request 0's 20th submits the
 * late requests (both from the worker thread, between a lookahead's submission and its wait). */
static void la_response(void *user, const vki_response *resp)
{
    la_ctx *x = user;
    on_response(x->c, resp);
    pthread_mutex_lock(&x->c->mu);
    uint32_t n3 = x->c->r[3].n_tokens, n0 = x->c->r[0].n_tokens;
    pthread_mutex_unlock(&x->c->mu);
    if (!x->cancel_sent && n3 >= 12) {
        x->cancel_sent = true;
        vki_batch_cancel(x->bm, 3);
    }
    if (!x->late_sent && n0 >= 20) {
        x->late_sent = true;
        for (uint32_t i = 0; i < x->n_late; i++) {
            char err[200];
            if (vki_batch_submit(x->bm, &x->late[i], la_response, x, err, sizeof err) != VKI_OK)
                bad(x->c, err, x->late[i].id);
        }
    }
}

/* An executor that keeps two steps in flight: long plain requests decode mostly in lookahead
 * steps (their tokens read by the executor, VKI_TOKEN_PREV), and every output is still exactly
 * what the request produces alone: ends by EOS, stop ids and length between a lookahead's
 * submission and its wait, streaming, logprobs, seeded sampling, a cancellation and requests
 * arriving while lookaheads run, requests with penalties (windows of 1, 8 and 64 tokens). */
static void test_lookahead(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_config fc = {.max_seqs = 8, .n_pages = 256, .page_size = 4, .max_ctx = 512, .vocab = VOCAB,
                      .max_tokens = 40, .eos = EOS, .overlap = true};
    fake_engine *f;
    assert_int_equal(fake_create(&fc, &f), VKI_OK);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
    enum { N = 8, L = 4 };
    static vki_request reqs[N + L];
    static int32_t stops[2] = {9, 31};
    la_ctx x = {.c = c, .bm = bm, .late = reqs + N, .n_late = L};
    for (uint32_t i = 0; i < N + L; i++) {
        uint32_t salt = 40 + i, max_new = i == 5 ? 12 : 60 + 17 * (i % 8);
        vki_request r = mkreq(c, i, 3 + i % 9, max_new, true, salt);
        while (i == 0 || i == 3) { /* the triggers' requests run past 30 tokens (greedy, no EOS) */
            int32_t ref[MAXTOK];
            fake_reference(f, r.prompt, r.n_prompt, 30, false, 0, ref, NULL);
            uint32_t k = 0;
            while (k < 30 && ref[k] != EOS)
                k++;
            if (k == 30)
                break;
            r = mkreq(c, i, 3 + i % 9, max_new, true, salt += 100);
        }
        if (i % 3 == 1) {
            r.sampling.temperature = 0.8f;
            r.sampling.has_seed = true;
            r.sampling.seed = 77 + i;
        }
        if (i % 4 == 2)
            set_lp(c, &r, true, 2);
        if (i == 6) {
            r.stop_ids = stops;
            r.n_stop_ids = 2;
        }
        if (i == 5 || i % 4 == 3) { /* penalties: lookahead rows whose history ends before the token in
                                       flight (the fake checks it: window - 1 tokens before pos0) */
            r.sampling.penalty_window = i == 3 ? 1 : i == 7 ? 8 : 64;
            r.sampling.repetition_penalty = 1.3f;
            r.sampling.frequency_penalty = i == 11 ? 0.5f : 0.0f;
        }
        reqs[i] = r;
    }
    for (uint32_t i = 0; i < N; i++) {
        char err[200];
        if (vki_batch_submit(bm, &reqs[i], la_response, &x, err, sizeof err) != VKI_OK)
            fail_msg("submit %u: %s", i, err);
    }
    wait_finals(c, N + L);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    assert_true(x.cancel_sent && x.late_sent);
    uint32_t generated = 0;
    for (uint32_t i = 0; i < N + L; i++) {
        check_rec(c, f, &reqs[i]);
        generated += c->r[i].n_tokens;
    }
    assert_int_equal(c->r[3].finish, VKI_FINISH_CANCELLED);
    uint64_t prev = fake_prev_rows(f);
    printf("lookahead: %llu of %u generated tokens came from lookahead rows, %llu steps in all\n",
           (unsigned long long)prev, generated, (unsigned long long)fake_steps(f));
    if (prev * 2 < generated)
        fail_msg("only %llu of %u tokens from lookahead rows", (unsigned long long)prev, generated);
    fake_destroy(f);
    coll_free(c);
}

/* Runs reqs on a fresh fake of n_pages KV pages (overlap: two steps in flight) under p into c;
 * with check, each output against the fake's reference (alone). Returns its lookahead rows;
 * *generated: the tokens generated in all. */
static uint64_t run_on_fake(coll *c, vki_request *reqs, uint32_t n, bool overlap, const vki_batch_params *p, bool check,
                            uint32_t n_pages, uint32_t *generated)
{
    fake_config fc = {.max_seqs = 4, .n_pages = n_pages, .page_size = 4, .max_ctx = 256, .vocab = VOCAB,
                      .max_tokens = 40, .eos = EOS, .overlap = overlap};
    fake_engine *f;
    assert_int_equal(fake_create(&fc, &f), VKI_OK);
    bm_backend be = fake_backend(f);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, p, NULL, &bm), VKI_OK);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(vki_batch_submit(bm, &reqs[i], on_response, c, NULL, 0), VKI_OK);
    wait_finals(c, n);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    *generated = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (check)
            check_rec(c, f, &reqs[i]);
        *generated += c->r[reqs[i].id].n_tokens;
    }
    uint64_t prev = fake_prev_rows(f);
    fake_destroy(f);
    return prev;
}

/* Most generated tokens (at least 70%) came from lookahead rows; prints the share. */
static void expect_ahead_share(const char *what, uint64_t prev, uint32_t generated)
{
    printf("%s: %llu of %u generated tokens from lookahead rows\n", what, (unsigned long long)prev, generated);
    if (prev * 10 < generated * 7)
        fail_msg("only %llu of %u tokens from lookahead rows", (unsigned long long)prev, generated);
}

/* Requests with repetition, presence and frequency penalties decode in lookahead steps too (their
 * history ends before the token in flight, which the engine counts): three of them, together,
 * almost every token from lookahead rows; outputs as alone. */
static void test_lookahead_penalties(void **state)
{
    (void)state;
    coll *c = coll_new();
    enum { N = 3 };
    vki_request reqs[N];
    for (uint32_t i = 0; i < N; i++) {
        reqs[i] = mkreq(c, i, 5 + 7 * i, 80, true, 900 + i);
        reqs[i].sampling.penalty_window = i == 0 ? 1 : i == 1 ? 16 : 200; /* 200: longer than prompt + output */
        reqs[i].sampling.repetition_penalty = 1.2f;
        reqs[i].sampling.presence_penalty = i == 1 ? 0.5f : 0.0f;
        reqs[i].sampling.frequency_penalty = i == 2 ? -0.5f : 0.0f;
    }
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    uint32_t generated;
    uint64_t prev = run_on_fake(c, reqs, N, true, &p, true, 128, &generated);
    expect_ahead_share("lookahead with penalties", prev, generated);
    coll_free(c);
}

/* A full batch (max_batch_size running) with requests queued behind it: none of them could be
 * admitted before a running one ends, so lookahead steps go on; when one ends, the next planned
 * tick admits. Outputs as alone; most tokens from lookahead rows although the queue is never
 * empty until the last two run. */
static void test_lookahead_full_batch(void **state)
{
    (void)state;
    coll *c = coll_new();
    enum { N = 6 };
    vki_request reqs[N];
    for (uint32_t i = 0; i < N; i++)
        reqs[i] = mkreq(c, i, 3 + 2 * i, 40 + 5 * i, i % 2 == 0, 300 + i);
    vki_batch_params p = mkparams(VKI_POLICY_MAX_UTILIZATION);
    p.max_batch_size = 2;
    uint32_t generated;
    uint64_t prev = run_on_fake(c, reqs, N, true, &p, true, 128, &generated);
    expect_ahead_share("lookahead behind a full batch", prev, generated);
    coll_free(c);
}

/* Requests queued for KV blocks (a pool of 26 pages, where NO_EVICT's reservations fit two of
 * these requests at once) behind a batch that is not full: none of them could be admitted before
 * a running one ends, so lookahead steps go on (before, any waiting request stopped them);
 * outputs as alone, most tokens from lookahead rows. */
static void test_lookahead_waiting_for_blocks(void **state)
{
    (void)state;
    coll *c = coll_new();
    enum { N = 6 };
    vki_request reqs[N];
    for (uint32_t i = 0; i < N; i++)
        reqs[i] = mkreq(c, i, 3 + i, 40, i % 2 == 0, 500 + i); /* 11-12 pages each to completion */
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    uint32_t generated;
    uint64_t prev = run_on_fake(c, reqs, N, true, &p, true, 26, &generated);
    expect_ahead_share("lookahead while requests wait for blocks", prev, generated);
    coll_free(c);
}

/* min_tokens bans the end of text until reached: lookahead steps carry the bans but for the step
 * where they lift (its row has the request's own biases, so it waits for the step before). Each
 * request's min_tokens is put where the unbanned model says EOS (after the tokens of a run that
 * bans it throughout), so a lookahead that kept the ban one token too
 * long changes the output. The same outputs as an executor of one step at a time, ending there
 * by EOS; most tokens from lookahead rows. */
static void test_lookahead_min_tokens(void **state)
{
    (void)state;
    enum { CAND = 8, N = 3, MAX = 60 };
    vki_request cand[CAND], reqs[N];
    coll *c[3] = {coll_new(), coll_new(), coll_new()};
    for (uint32_t i = 0; i < CAND; i++) {
        cand[i] = mkreq(c[0], i, 4 + 3 * i, MAX, i % 2 == 0, 700 + i);
        cand[i].min_tokens = MAX;
    }
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    uint32_t generated;
    run_on_fake(c[0], cand, CAND, false, &p, false, 128, &generated);
    fake_engine *f = mkfake(4, 128, 0);
    uint32_t n = 0;
    for (uint32_t i = 0; i < CAND && n < N; i++) {
        const rec *a = &c[0]->r[i];
        int32_t seq[MAXTOK + 64], next;
        memcpy(seq, cand[i].prompt, cand[i].n_prompt * sizeof *seq);
        memcpy(seq + cand[i].n_prompt, a->tokens, a->n_tokens * sizeof *seq);
        uint32_t j = 6; /* the first position from 6 on where the unbanned model says EOS */
        for (; j < a->n_tokens; j++) {
            fake_reference(f, seq, cand[i].n_prompt + j, 1, false, 0, &next, NULL);
            if (next == EOS)
                break;
        }
        if (j == a->n_tokens)
            continue;
        reqs[n] = mkreq(c[1], n, 4 + 3 * i, MAX, i % 2 == 0, 700 + i);
        reqs[n].min_tokens = j;
        c[2]->r[n++].streaming = i % 2 == 0;
    }
    fake_destroy(f);
    if (n < N)
        fail_msg("%u of %u candidates have an EOS after position 6 to place min_tokens at", n, CAND);
    run_on_fake(c[1], reqs, N, false, &p, false, 128, &generated);
    uint64_t prev = run_on_fake(c[2], reqs, N, true, &p, false, 128, &generated);
    for (uint32_t i = 0; i < N; i++) {
        const rec *a = &c[1]->r[i], *b = &c[2]->r[i];
        assert_int_equal(a->finish, VKI_FINISH_EOS);
        assert_int_equal(a->n_tokens, reqs[i].min_tokens + 1);
        assert_int_equal(b->finish, a->finish);
        assert_int_equal(b->n_tokens, a->n_tokens);
        assert_memory_equal(a->tokens, b->tokens, a->n_tokens * sizeof *a->tokens);
    }
    printf("lookahead with min_tokens: %llu of %u generated tokens from lookahead rows\n", (unsigned long long)prev,
           generated);
    if (prev * 2 < generated)
        fail_msg("only %llu of %u tokens from lookahead rows", (unsigned long long)prev, generated);
    for (int k = 0; k < 3; k++)
        coll_free(c[k]);
}

/* End ids replace the model's end of text; stop ids finish with STOP; both tokens included. */
static void test_end_and_stop_ids(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(4, 128, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
    vki_request r0 = mkreq(c, 0, 10, 60, false, 3);
    int32_t ref[60];
    fake_reference(f, r0.prompt, 10, 60, false, 0, ref, NULL);
    int32_t end_ids[1] = {ref[4] == EOS ? ref[5] : ref[4]};
    r0.end_ids = end_ids;
    r0.n_end_ids = 1;
    vki_request r1 = mkreq(c, 1, 10, 60, true, 3);
    r1.stop_ids = end_ids;
    r1.n_stop_ids = 1;
    assert_int_equal(vki_batch_submit(bm, &r0, on_response, c, NULL, 0), VKI_OK);
    assert_int_equal(vki_batch_submit(bm, &r1, on_response, c, NULL, 0), VKI_OK);
    wait_finals(c, 2);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    check_rec(c, f, &r0);
    check_rec(c, f, &r1);
    assert_int_equal(c->r[0].finish, VKI_FINISH_EOS); /* at position 5 at the latest */
    assert_int_equal(c->r[0].tokens[c->r[0].n_tokens - 1], end_ids[0]);
    assert_true(c->r[1].finish == VKI_FINISH_STOP || c->r[1].finish == VKI_FINISH_EOS); /* model EOS still ends it */
    assert_true(c->r[1].n_tokens <= c->r[0].n_tokens);
    fake_destroy(f);
    coll_free(c);
}

/* ---- allocation follows what a request generates; cached-token counts --------------------- */

typedef struct grow_probe {
    coll *c;
    vki_batch_manager *bm;
    uint32_t cap_at_3;           /* the request's logprob capacity when its 3rd token came */
    uint32_t n_cached;           /* of the last final response */
} grow_probe;

/* Worker thread: looks the request up (the manager's own map) for its capacity, then records
 * (the test thread reads the probe once the collector has the final response). */
static void grow_response(void *user, const vki_response *r)
{
    grow_probe *g = user;
    if (r->final) {
        g->n_cached = r->n_cached;
    } else {
        pthread_mutex_lock(&g->bm->mu);
        bm_req *q = bm_map_find(&g->bm->inflight, r->id);
        uint32_t cap = q ? q->lp_cap : 0;
        pthread_mutex_unlock(&g->bm->mu);
        if (r->seq_len == 10 + 3) {
            g->cap_at_3 = cap;
            vki_batch_cancel(g->bm, r->id); /* allowed from a callback */
        }
    }
    on_response(g->c, r);
}

static void test_lazy_logprobs_and_cached(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(4, 256, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    grow_probe g = {.c = c};
    assert_int_equal(bm_create(&be, &p, NULL, &g.bm), VKI_OK);
    vki_request r = mkreq(c, 1, 10, 500, true, 7);
    set_lp(c, &r, true, 20);
    assert_int_equal(vki_batch_submit(g.bm, &r, grow_response, &g, NULL, 0), VKI_OK);
    wait_finals(c, 1);
    assert_int_equal(c->r[1].finish, VKI_FINISH_CANCELLED);
    assert_true(g.cap_at_3 >= 3 && g.cap_at_3 <= 16); /* was 500 (x 20 alternatives) up front */
    /* the same prompt again: its full blocks come from the prefix cache, and the response says so */
    vki_request r2 = mkreq(c, 2, 10, 4, false, 7);
    assert_int_equal(vki_batch_submit(g.bm, &r2, grow_response, &g, NULL, 0), VKI_OK);
    wait_finals(c, 2);
    assert_int_equal(g.n_cached, 8); /* 10 prompt tokens: two whole blocks of 4 */
    assert_int_equal(vki_batch_manager_destroy(g.bm, false), VKI_OK);
    assert_clean(c, f);
    fake_destroy(f);
    coll_free(c);
}

/* ---- validation, duplicates, queue bound -------------------------------------------------- */

static void expect_invalid(vki_batch_manager *bm, coll *c, vki_request r, const char *field)
{
    char err[200] = "";
    assert_int_equal(vki_batch_submit(bm, &r, on_response, c, err, sizeof err), VKI_ERR_INVALID_ARG);
    if (!strstr(err, field))
        fail_msg("message '%s' does not name '%s'", err, field);
}

/* ---- structured output -------------------------------------------------------------------- */

/* The text of a response's tokens in the fake vocabulary, without a final end token. */
static size_t rec_text(const fake_engine *f, const rec *x, char *out, size_t cap)
{
    size_t n = 0;
    uint32_t last = x->n_tokens;
    if (x->finish == VKI_FINISH_EOS && last)
        last--;
    for (uint32_t k = 0; k < last; k++) {
        size_t len;
        assert_int_equal(fake_token_piece((void *)f, x->tokens[k], out + n, cap - n, &len), VKI_OK);
        n += len;
    }
    out[n] = 0;
    return n;
}


/* Constrained requests (a GBNF grammar, a JSON schema, custom end ids, ignore_eos) in one batch
 * with unconstrained ones: the constrained outputs are in their grammar's language and end where
 * it ends; the unconstrained ones are what they are alone. A grammar that admits no token of the
 * vocabulary, and a request whose every token is banned by logit_bias, end only themselves with
 * an error (issue 18: a -1 from the sampler used to fail the whole step). Bad grammars and
 * schemas are refused at submission naming the rule or keyword. */
static void test_constrained(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(8, 256, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
    static const char g_letters[] = "root ::= \"{\" ( \"a\" | \"b\" | \"c\" )+ \"}\"";
    static const char g_none[] = "root ::= \"Q\" [a-z]*"; /* no token of the fake starts with Q */
    static const char g_ab[] = "root ::= \"a\" \"b\"";
    static const char g_as[] = "root ::= \"a\"+";
    static const char schema[] = "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"boolean\"}, "
                                 "\"b\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"maxItems\": 3}}, "
                                 "\"required\": [\"a\", \"b\"]}";
    enum { N = 16 };
    vki_request reqs[N];
    static vki_logit_bias ban[VOCAB];
    static int32_t yz[1] = {21};
    for (uint32_t i = 0; i < VOCAB; i++)
        ban[i] = (vki_logit_bias){(int32_t)i, -INFINITY};
    for (uint32_t i = 0; i < N; i++) {
        reqs[i] = mkreq(c, i, 3 + i % 5, 150, i % 2, i);
        switch (i) {
        case 8: reqs[i].constraint = (vki_constraint){VKI_CONSTRAINT_GBNF, g_letters, strlen(g_letters)}; break;
        case 9: reqs[i].constraint = (vki_constraint){VKI_CONSTRAINT_JSON_SCHEMA, schema, strlen(schema)}; break;
        case 10: reqs[i].constraint = (vki_constraint){VKI_CONSTRAINT_GBNF, g_none, strlen(g_none)}; break;
        case 11: /* complete, and no end token may follow */
            reqs[i].constraint = (vki_constraint){VKI_CONSTRAINT_GBNF, g_ab, strlen(g_ab)};
            reqs[i].ignore_eos = true;
            break;
        case 12: reqs[i].sampling.logit_bias = ban, reqs[i].sampling.n_logit_bias = VOCAB; break;
        case 13: /* its own end id, allowed only after at least one "a" */
            reqs[i].constraint = (vki_constraint){VKI_CONSTRAINT_GBNF, g_as, strlen(g_as)};
            reqs[i].end_ids = yz, reqs[i].n_end_ids = 1;
            break;
        case 14: /* the same schema again: shares the compiled grammar */
            reqs[i].constraint = (vki_constraint){VKI_CONSTRAINT_JSON_SCHEMA, schema, strlen(schema)};
            reqs[i].sampling.temperature = 0.8f;
            break;
        }
        char err[200] = "";
        if (vki_batch_submit(bm, &reqs[i], on_response, c, err, sizeof err) != VKI_OK)
            fail_msg("submit %u: %s", i, err);
    }
    vki_request bad1 = mkreq(c, 100, 3, 10, false, 1), bad2 = mkreq(c, 101, 3, 10, false, 1);
    bad1.constraint = (vki_constraint){VKI_CONSTRAINT_GBNF, "root ::= valu", 13};
    expect_invalid(bm, c, bad1, "grammar: line 1, column 10: undefined rule 'valu'");
    bad2.constraint = (vki_constraint){VKI_CONSTRAINT_JSON_SCHEMA, "{\"type\": \"string\", \"format\": \"uri\"}", 35};
    expect_invalid(bm, c, bad2, "keyword 'format': \"uri\" is not supported");
    wait_finals(c, N);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    char text[4096];
    for (uint32_t i = 0; i < 8; i++) /* unconstrained: as alone */
        check_rec(c, f, &reqs[i]);
    check_rec(c, f, &reqs[15]);
    strbuf sg = {0};
    char err[200];
    assert_int_equal(gram_schema_to_gbnf(schema, strlen(schema), &sg, err, sizeof err), VKI_OK);
    const char *lang[N] = {[8] = g_letters, [9] = sg.p, [11] = g_ab, [13] = g_as, [14] = sg.p};
    for (uint32_t i = 8; i < 15; i++) {
        rec *x = &c->r[i];
        size_t n = rec_text(f, x, text, sizeof text);
        print_message("request %u: finish %d, %u tokens: %s%s%s\n", i, x->finish, x->n_tokens, text,
                      x->error[0] ? " / " : "", x->error);
        if (lang[i]) {
            if (!vt_in_grammar(lang[i], strlen(lang[i]), text, n))
                fail_msg("request %u: \"%s\" is not in its grammar's language", i, text);
            assert_int_equal(x->finish, i == 11 ? VKI_FINISH_STOP : VKI_FINISH_EOS);
            if (i == 11)
                assert_int_equal(text[n - 1], 'b');
            else
                assert_int_equal(x->tokens[x->n_tokens - 1], i == 13 ? 21 : EOS);
            assert_int_equal(x->seq_len, reqs[i].n_prompt + x->n_tokens);
        }
    }
    assert_int_equal(c->r[10].finish, VKI_FINISH_ERROR);
    assert_int_equal(c->r[10].n_tokens, 0);
    assert_non_null(strstr(c->r[10].error, "grammar: no token of the vocabulary can continue"));
    assert_int_equal(c->r[10].status, VKI_ERR_INVALID_ARG);
    assert_int_equal(c->r[12].finish, VKI_FINISH_ERROR);
    assert_int_equal(c->r[12].n_tokens, 0);
    assert_non_null(strstr(c->r[12].error, "no token could be sampled"));
    assert_int_equal(c->r[11].n_tokens, 2);
    strbuf_free(&sg);
    fake_destroy(f);
    coll_free(c);
}


/* The requests of test_constrained_lookahead on f (lookahead steps when ahead): their records. */
static coll *run_grammar_set(fake_engine *f, bool ahead)
{
    static const char g_letters[] = "root ::= \"{\" ( \"a\" | \"b\" | \"c\" )+ \"}\"";
    static const char g_ab[] = "root ::= \"a\" \"b\"";
    static const char g_as[] = "root ::= \"a\"+";
    static const char schema[] = "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"boolean\"}, "
                                 "\"b\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"maxItems\": 3}}, "
                                 "\"required\": [\"a\", \"b\"]}";
    static int32_t yz[1] = {21};
    coll *c = coll_new();
    bm_backend be = fake_backend(f);
    if (!ahead)
        be.submit = NULL, be.wait = NULL, be.masks = NULL;
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
    for (uint32_t i = 0; i < 7; i++) {
        vki_request r = mkreq(c, i, 3 + i, 120, i % 2, 7 * i + 1);
        r.sampling.temperature = i % 3 ? 0.8f : 0; /* seeded (mkreq) where it samples */
        if (i == 0 || i == 1)
            r.constraint = (vki_constraint){VKI_CONSTRAINT_GBNF, g_letters, strlen(g_letters)};
        if (i == 2 || i == 3)
            r.constraint = (vki_constraint){VKI_CONSTRAINT_JSON_SCHEMA, schema, strlen(schema)};
        if (i == 4) /* complete after 2 tokens, no end may follow: ends with its next row in flight */
            r.constraint = (vki_constraint){VKI_CONSTRAINT_GBNF, g_ab, strlen(g_ab)}, r.ignore_eos = true;
        if (i == 5)
            r.constraint = (vki_constraint){VKI_CONSTRAINT_GBNF, g_as, strlen(g_as)}, r.end_ids = yz, r.n_end_ids = 1;
        char err[200] = "";
        if (vki_batch_submit(bm, &r, on_response, c, err, sizeof err) != VKI_OK)
            fail_msg("submit %u: %s", i, err);
    }
    wait_finals(c, 7);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    return c;
}

/* Grammar-constrained requests in lookahead steps: each lookahead row's mask is computed once the
 * step in flight has delivered the token before it, and given to the executor (be.masks) while
 * the fake has already "run" the row (it draws the row's token only then, under that mask). The
 * tokens are those of the same requests without lookahead steps, in their grammars' languages;
 * requests that end (grammar complete, their end id, EOS) with a lookahead row in flight leave it
 * harmlessly. */
static void test_constrained_lookahead(void **state)
{
    (void)state;
    fake_engine *fa = mkfake(8, 256, 0), *fb = mkfake(8, 256, 0);
    if (!fake_backend(fa).submit) { /* only VKI_FAKE_OVERLAP=1 turns the fake's submit on */
        fake_destroy(fa);
        fake_config fc = {.max_seqs = 8, .n_pages = 256, .page_size = 4, .max_ctx = 512, .vocab = VOCAB,
                          .max_tokens = 40, .eos = EOS, .overlap = true};
        assert_int_equal(fake_create(&fc, &fa), VKI_OK);
    }
    coll *a = run_grammar_set(fa, true), *b = run_grammar_set(fb, false);
    print_message("lookahead rows %llu, lookaheads whose masks came late %llu\n",
                  (unsigned long long)fake_prev_rows(fa), (unsigned long long)fake_late_masks(fa));
    assert_true(fake_late_masks(fa) >= 20);
    assert_int_equal(fake_prev_rows(fb), 0);
    for (uint32_t i = 0; i < 7; i++) {
        const rec *x = &a->r[i], *y = &b->r[i];
        char text[4096];
        rec_text(fa, &a->r[i], text, sizeof text);
        print_message("request %u: finish %d, %u tokens: %s\n", i, x->finish, x->n_tokens, text);
        assert_int_equal(x->finish, y->finish);
        assert_int_equal(x->n_tokens, y->n_tokens);
        assert_memory_equal(x->tokens, y->tokens, x->n_tokens * sizeof *x->tokens);
        assert_true(x->finish != VKI_FINISH_ERROR);
    }
    assert_int_equal(a->r[4].finish, VKI_FINISH_STOP);
    assert_int_equal(a->r[4].n_tokens, 2);
    fake_destroy(fa);
    fake_destroy(fb);
    coll_free(a);
    coll_free(b);
}


static void test_validation(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(4, 64, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
    vki_request ok = mkreq(c, 1, 8, 8, false, 1), r;
    vki_logit_bias bias[2] = {{3, 1.5f}, {VOCAB, 1.0f}};
    int32_t big[1] = {VOCAB + 5};
    r = ok; r.n_prompt = 0; expect_invalid(bm, c, r, "prompt");
    r = ok; r.prompt = NULL; expect_invalid(bm, c, r, "prompt");
    r = ok; r.max_new_tokens = 0; expect_invalid(bm, c, r, "max_new_tokens");
    r = ok; r.max_new_tokens = 510; expect_invalid(bm, c, r, "max_new_tokens"); /* beyond max_ctx 512 */
    r = ok; r.max_new_tokens = 300; expect_invalid(bm, c, r, "KV blocks");      /* 64 pages of 4 */
    r = ok; r.sampling.temperature = -1; expect_invalid(bm, c, r, "temperature");
    r = ok; r.sampling.temperature = NAN; expect_invalid(bm, c, r, "temperature");
    r = ok; r.sampling.temperature = INFINITY; expect_invalid(bm, c, r, "temperature");
    r = ok; r.sampling.top_p = 0; expect_invalid(bm, c, r, "top_p");
    r = ok; r.sampling.top_p = 1.5f; expect_invalid(bm, c, r, "top_p");
    r = ok; r.sampling.top_p = NAN; expect_invalid(bm, c, r, "top_p");
    r = ok; r.sampling.top_k = -1; expect_invalid(bm, c, r, "top_k");
    r = ok; r.sampling.min_p = 1.5f; expect_invalid(bm, c, r, "min_p");
    r = ok; r.sampling.min_p = NAN; expect_invalid(bm, c, r, "min_p");
    r = ok; r.sampling.repetition_penalty = 0; expect_invalid(bm, c, r, "repetition_penalty");
    r = ok; r.sampling.presence_penalty = 3; expect_invalid(bm, c, r, "presence_penalty");
    r = ok; r.sampling.frequency_penalty = NAN; expect_invalid(bm, c, r, "frequency_penalty");
    r = ok; r.sampling.top_logprobs = 21; expect_invalid(bm, c, r, "top_logprobs");
    r = ok; r.sampling.logit_bias = bias; r.sampling.n_logit_bias = 2; expect_invalid(bm, c, r, "logit_bias[1]");
    bias[1] = (vki_logit_bias){4, NAN};
    expect_invalid(bm, c, r, "logit_bias[1].bias");
    r = ok; r.sampling.logit_bias = NULL; r.sampling.n_logit_bias = 1; expect_invalid(bm, c, r, "logit_bias");
    r = ok; g_prompts[1][5] = VOCAB; expect_invalid(bm, c, r, "prompt[5]");
    g_prompts[1][5] = -3; expect_invalid(bm, c, r, "prompt[5]");
    g_prompts[1][5] = 1;
    r = ok; r.end_ids = big; r.n_end_ids = 1; expect_invalid(bm, c, r, "end_ids[0]");
    r = ok; r.stop_ids = big; r.n_stop_ids = 1; expect_invalid(bm, c, r, "stop_ids[0]");
    assert_int_equal(vki_batch_submit(bm, &ok, NULL, NULL, NULL, 0), VKI_ERR_INVALID_ARG);
    /* -INFINITY bans a token: valid */
    bias[1] = (vki_logit_bias){4, -INFINITY};
    r = ok; r.sampling.logit_bias = bias; r.sampling.n_logit_bias = 2;
    assert_int_equal(vki_batch_submit(bm, &r, on_response, c, NULL, 0), VKI_OK);
    wait_finals(c, 1);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    assert_int_equal(c->finals, 1); /* refusals made no callback */
    fake_destroy(f);
    coll_free(c);
}

/* ---- a gate that holds the worker inside a step ------------------------------------------- */

typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool (*want)(struct gate *g, const vki_step_plan *plan); /* hold at this plan? */
    bool held, release;
    uint32_t holds, holds_seen;   /* holds so far; holds gate_wait_held has returned for */
    uint64_t steps;
    uint32_t arg;
    vki_step_plan seen;           /* shape of the held plan */
    vki_step_seq seen_seq[8];
} gate;

static void gate_hook(void *user, const vki_step_plan *plan)
{
    gate *g = user;
    pthread_mutex_lock(&g->mu);
    g->steps++;
    if (g->want && g->want(g, plan)) {
        g->seen = *plan;
        memcpy(g->seen_seq, plan->seqs, (plan->n_seqs < 8 ? plan->n_seqs : 8) * sizeof *plan->seqs);
        g->held = true;
        g->holds++;
        pthread_cond_broadcast(&g->cv);
        while (!g->release)
            pthread_cond_wait(&g->cv, &g->mu);
        g->release = false;
        g->held = false;
    }
    pthread_mutex_unlock(&g->mu);
}

/* Waits until the worker is held at a new hold (a hang guard of 60 s, not a performance
 * bound). A hold that was just released does not count. */
static void gate_wait_held(gate *g)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    pthread_mutex_lock(&g->mu);
    while (!(g->held && g->holds > g->holds_seen))
        if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) != 0)
            break;
    bool held = g->held && g->holds > g->holds_seen;
    g->holds_seen = g->holds;
    pthread_mutex_unlock(&g->mu);
    if (!held)
        fail_msg("the worker never reached the step to hold at");
}

/* Sets where to hold next and lets a held worker go on. */
static void gate_release(gate *g, bool (*next)(gate *, const vki_step_plan *), uint32_t arg)
{
    pthread_mutex_lock(&g->mu);
    g->want = next;
    g->arg = arg;
    if (g->held)
        g->release = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static bool hold_first(gate *g, const vki_step_plan *plan) { (void)g; (void)plan; return true; }

/* hold at a plan where the sequence in slot g->arg is mid-prefill (more chunks to come) */
static bool hold_mid_prefill(gate *g, const vki_step_plan *plan)
{
    for (uint32_t i = 0; i < plan->n_seqs; i++)
        if (plan->seqs[i].slot == g->arg && !plan->seqs[i].want_token && plan->seqs[i].pos0 > 0)
            return true;
    return false;
}

/* hold at a decode step of slot g->arg after a few tokens */
static bool hold_decoding(gate *g, const vki_step_plan *plan)
{
    for (uint32_t i = 0; i < plan->n_seqs; i++)
        if (plan->seqs[i].slot == g->arg && plan->seqs[i].n_new == 1 && plan->seqs[i].want_token &&
            plan->seqs[i].pos0 >= 40)
            return true;
    return false;
}

typedef struct gated {
    coll *c;
    fake_engine *f;
    gate g;
    vki_batch_manager *bm;
} gated;

static void gated_open(gated *t, vki_batch_params p, uint32_t max_seqs, uint32_t n_pages,
                       bool (*want)(gate *, const vki_step_plan *), const vki_batch_callbacks *cb)
{
    memset(t, 0, sizeof *t);
    t->c = coll_new();
    pthread_mutex_init(&t->g.mu, NULL);
    pthread_cond_init(&t->g.cv, NULL);
    t->g.want = want;
    fake_config fc = {.max_seqs = max_seqs, .n_pages = n_pages, .page_size = 4, .max_ctx = 512, .vocab = VOCAB,
                      .eos = -1, .on_step = gate_hook, .on_step_user = &t->g};
    assert_int_equal(fake_create(&fc, &t->f), VKI_OK);
    bm_backend be = fake_backend(t->f);
    assert_int_equal(bm_create(&be, &p, cb, &t->bm), VKI_OK);
    t->c->bm = t->bm;
}

static void gated_close(gated *t)
{
    gate_release(&t->g, NULL, 0);
    assert_int_equal(vki_batch_manager_destroy(t->bm, false), VKI_OK);
    assert_clean(t->c, t->f);
    fake_destroy(t->f);
    pthread_mutex_destroy(&t->g.mu);
    pthread_cond_destroy(&t->g.cv);
    coll_free(t->c);
}

static void test_duplicate_ids_and_queue_full(void **state)
{
    (void)state;
    gated t;
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    p.max_queue = 3;
    gated_open(&t, p, 1, 128, hold_first, NULL);
    vki_request a = mkreq(t.c, 7, 6, 5, true, 1);
    assert_int_equal(vki_batch_submit(t.bm, &a, on_response, t.c, NULL, 0), VKI_OK);
    gate_wait_held(&t.g); /* the worker is inside a1's first step: nothing else moves */
    assert_int_equal(vki_batch_submit(t.bm, &a, on_response, t.c, NULL, 0), VKI_ERR_DUPLICATE_ID);
    vki_request q[4];
    for (uint32_t i = 0; i < 4; i++) {
        q[i] = mkreq(t.c, 10 + i, 5, 3, false, i);
        assert_int_equal(vki_batch_submit(t.bm, &q[i], on_response, t.c, NULL, 0),
                         i < 3 ? VKI_OK : VKI_RETRY_QUEUE_FULL);
    }
    gate_release(&t.g, NULL, 0);
    wait_finals(t.c, 4);
    /* the id is free again after its final response */
    assert_int_equal(t.c->r[7].n_final, 1);
    check_rec(t.c, t.f, &a);
    pthread_mutex_lock(&t.c->mu);
    memset(&t.c->r[7], 0, sizeof t.c->r[7]);
    t.c->r[7].streaming = true;
    pthread_mutex_unlock(&t.c->mu);
    assert_int_equal(vki_batch_submit(t.bm, &a, on_response, t.c, NULL, 0), VKI_OK);
    assert_int_equal(vki_batch_submit(t.bm, &q[3], on_response, t.c, NULL, 0), VKI_OK);
    wait_finals(t.c, 6);
    check_rec(t.c, t.f, &a);
    for (uint32_t i = 0; i < 4; i++)
        check_rec(t.c, t.f, &q[i]);
    gated_close(&t);
}

/* ---- cancellation in every state --------------------------------------------------------- */

static void test_cancel_states(void **state)
{
    (void)state;
    gated t;
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    p.max_batch_size = 2;
    p.max_num_tokens = 16;
    gated_open(&t, p, 2, 256, NULL, NULL);
    /* slot 0: a long generation; slot 1: a long prompt in chunks */
    vki_request gen = mkreq(t.c, 1, 8, 150, true, 1);
    vki_request ctx = mkreq(t.c, 2, 60, 5, false, 2);
    vki_request queued = mkreq(t.c, 3, 8, 5, false, 3);
    vki_request fin = mkreq(t.c, 4, 4, 1, false, 4);
    assert_int_equal(vki_batch_submit(t.bm, &fin, on_response, t.c, NULL, 0), VKI_OK);
    wait_finals(t.c, 1);
    assert_int_equal(vki_batch_cancel(t.bm, 4), VKI_ERR_NOT_FOUND); /* already finished */
    assert_int_equal(vki_batch_cancel(t.bm, 999), VKI_ERR_NOT_FOUND); /* never submitted */
    /* hold gen's first step until ctx is queued too (the fake runs a step in microseconds: gen
     * could otherwise finish before the submitting thread gets the lock again) */
    gate_release(&t.g, hold_first, 0);
    assert_int_equal(vki_batch_submit(t.bm, &gen, on_response, t.c, NULL, 0), VKI_OK);
    gate_wait_held(&t.g);
    assert_int_equal(vki_batch_submit(t.bm, &ctx, on_response, t.c, NULL, 0), VKI_OK);
    gate_release(&t.g, hold_mid_prefill, 1); /* slots: gen has 0, ctx gets 1 */
    gate_wait_held(&t.g);
    assert_int_equal(vki_batch_submit(t.bm, &queued, on_response, t.c, NULL, 0), VKI_OK); /* no free slot */
    assert_int_equal(vki_batch_cancel(t.bm, 2), VKI_OK); /* in its prompt */
    assert_int_equal(vki_batch_cancel(t.bm, 3), VKI_OK); /* queued */
    gate_release(&t.g, hold_decoding, 0);
    gate_wait_held(&t.g);
    assert_int_equal(vki_batch_cancel(t.bm, 1), VKI_OK); /* generating */
    gate_release(&t.g, NULL, 0);
    wait_finals(t.c, 4);
    assert_int_equal(t.c->r[2].finish, VKI_FINISH_CANCELLED);
    assert_int_equal(t.c->r[2].n_tokens, 0);
    assert_int_equal(t.c->r[3].finish, VKI_FINISH_CANCELLED);
    assert_int_equal(t.c->r[3].n_tokens, 0);
    assert_int_equal(t.c->r[1].finish, VKI_FINISH_CANCELLED);
    assert_true(t.c->r[1].n_tokens >= 33 && t.c->r[1].n_tokens < 150);
    check_rec(t.c, t.f, &gen);
    check_rec(t.c, t.f, &ctx);
    check_rec(t.c, t.f, &queued);
    check_rec(t.c, t.f, &fin);
    gated_close(&t);
}

/* Paused under MAX_UTILIZATION: cancelled from the stats callback once a pause shows. */
static void stats_cancel_paused(void *user, const char *json)
{
    coll *c = user;
    cJSON *o = cJSON_Parse(json);
    cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "Waiting Paused Requests");
    bool cancel = false;
    pthread_mutex_lock(&c->mu);
    if (cJSON_IsNumber(w) && w->valuedouble > 0 && !c->cancelled_paused) {
        c->cancelled_paused = cancel = true;
        c->max_paused_seen = (uint32_t)w->valuedouble;
    }
    pthread_mutex_unlock(&c->mu);
    if (cancel && vki_batch_cancel(c->bm, c->cancel_when_paused) != VKI_OK)
        snprintf(c->stats_bad, sizeof c->stats_bad, "cancel of the paused request failed");
    cJSON_Delete(o);
}

static void test_cancel_paused(void **state)
{
    (void)state;
    gated t;
    vki_batch_params p = mkparams(VKI_POLICY_MAX_UTILIZATION);
    vki_batch_callbacks cb = {.stats = stats_cancel_paused};
    /* 12 pages of 4 tokens: two sequences of 8 + 40 tokens cannot both stay */
    memset(&t, 0, sizeof t);
    t.c = coll_new();
    cb.user = t.c;
    t.c->cancel_when_paused = 2;
    pthread_mutex_init(&t.g.mu, NULL);
    pthread_cond_init(&t.g.cv, NULL);
    t.g.want = hold_first; /* until b is queued too */
    fake_config fc = {.max_seqs = 2, .n_pages = 12, .page_size = 4, .max_ctx = 512, .vocab = VOCAB, .eos = -1,
                      .on_step = gate_hook, .on_step_user = &t.g};
    assert_int_equal(fake_create(&fc, &t.f), VKI_OK);
    bm_backend be = fake_backend(t.f);
    assert_int_equal(bm_create(&be, &p, &cb, &t.bm), VKI_OK);
    t.c->bm = t.bm;
    vki_request a = mkreq(t.c, 1, 8, 40, true, 1), b = mkreq(t.c, 2, 8, 40, true, 2);
    assert_int_equal(vki_batch_submit(t.bm, &a, on_response, t.c, NULL, 0), VKI_OK);
    gate_wait_held(&t.g);
    assert_int_equal(vki_batch_submit(t.bm, &b, on_response, t.c, NULL, 0), VKI_OK);
    gate_release(&t.g, NULL, 0);
    wait_finals(t.c, 2);
    assert_true(t.c->cancelled_paused);
    assert_int_equal(t.c->r[1].finish, VKI_FINISH_LENGTH);
    assert_int_equal(t.c->r[2].finish, VKI_FINISH_CANCELLED);
    check_rec(t.c, t.f, &a);
    check_rec(t.c, t.f, &b);
    gated_close(&t);
}

/* ---- callback interface ------------------------------------------------------------------ */

static void cb_get(void *user, int32_t max, vki_request_list *sink)
{
    coll *c = user;
    pthread_mutex_lock(&c->mu);
    c->n_get_calls++;
    if (max < c->max_seen_min)
        c->max_seen_min = max;
    if (max > c->max_seen_max)
        c->max_seen_max = max;
    uint32_t give = c->n_pending - c->next_pending;
    if (give > 5)
        give = 5; /* a few per tick: arrivals spread over ticks */
    vki_request *reqs = c->pending + c->next_pending;
    pthread_mutex_unlock(&c->mu);
    uint32_t added = 0;
    for (uint32_t i = 0; i < give; i++) {
        vki_status st = vki_request_list_add(sink, &reqs[i]);
        if (st == VKI_RETRY_QUEUE_FULL)
            break;
        if (st != VKI_OK)
            snprintf(c->bad, sizeof c->bad, "vki_request_list_add: %s", vki_status_str(st));
        added++;
    }
    if (max >= 0 && added > (uint32_t)max)
        snprintf(c->bad, sizeof c->bad, "the sink took more than max");
    pthread_mutex_lock(&c->mu);
    c->next_pending += added;
    pthread_mutex_unlock(&c->mu);
}

static uint32_t cb_stops(void *user, uint64_t *ids, uint32_t cap)
{
    coll *c = user;
    pthread_mutex_lock(&c->mu);
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->n_stops && n < cap; i++)
        if (c->r[c->stops[i]].n_tokens >= 3) { /* stop once it has produced a few tokens */
            ids[n++] = c->stops[i];
            c->stops[i] = c->stops[--c->n_stops];
            i--;
        }
    pthread_mutex_unlock(&c->mu);
    return n;
}

static void cb_stats(void *user, const char *json)
{
    coll *c = user;
    static const char *const fields[] = {
        "Timestamp", "Iteration Counter", "Active Request Count", "Max Request Count", "Max KV cache blocks",
        "Free KV cache blocks", "Used KV cache blocks", "Tokens per KV cache block", "Scheduled Requests",
        "Context Requests", "Generation Requests", "Total Context Tokens", "Paused Requests", "Queue Length",
        "Step Time ms", "Reused KV cache blocks", "Cached KV cache blocks", "Reused Step Recordings", "Lookahead Steps", "MicroBatch ID"};
    cJSON *o = cJSON_Parse(json);
    pthread_mutex_lock(&c->mu);
    c->n_stats++;
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++)
        if (!cJSON_GetObjectItemCaseSensitive(o, fields[i]))
            snprintf(c->stats_bad, sizeof c->stats_bad, "missing \"%s\" in %s", fields[i], json);
    double mx = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Max KV cache blocks"));
    double fr = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Free KV cache blocks"));
    double us = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Used KV cache blocks"));
    double ca = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Cached KV cache blocks"));
    double act = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Active Request Count"));
    double sch = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Scheduled Requests"));
    double ctx = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Context Requests"));
    double gen = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Generation Requests"));
    if (mx != 128 || fr + us + ca != mx || ctx + gen != sch)
        snprintf(c->stats_bad, sizeof c->stats_bad, "inconsistent: %s", json);
    /* nothing in flight: allowed once, reporting the drained pool after the last requests left
     * between ticks; a second one in a row would be stats while idle */
    c->idle_streak = sch == 0 && act == 0 ? c->idle_streak + 1 : 0;
    if (c->idle_streak > 1)
        snprintf(c->stats_bad, sizeof c->stats_bad, "stats while idle: %s", json);
    snprintf(c->last_stats, sizeof c->last_stats, "%s", json);
    pthread_mutex_unlock(&c->mu);
    cJSON_Delete(o);
}

/* Beam requests among plain ones under MAX_UTILIZATION with a small pool (the plain ones get
 * paused, the beam groups never), two of them cancelled: every request one final response, the
 * beams best first with the width asked for, and the pool drained at the end. */
typedef struct beam_seen {
    coll *c;
    uint32_t width[NREC], n_beams[NREC], bad_order[NREC], n_ticks, last_used, paused;
    double best_cum[NREC];
} beam_seen;

static void on_beam_response(void *user, const vki_response *r)
{
    beam_seen *b = user;
    if (r->final && r->id < NREC) {
        pthread_mutex_lock(&b->c->mu);
        b->n_beams[r->id] = r->n_beams;
        for (uint32_t i = 1; i < r->n_beams; i++)
            b->bad_order[r->id] += r->beam_scores[i] > r->beam_scores[i - 1] || r->beam_lengths[i] == 0;
        if (r->n_beams && (r->tokens != r->beam_tokens[0] || r->n_tokens != r->beam_lengths[0]))
            b->bad_order[r->id]++;
        pthread_mutex_unlock(&b->c->mu);
    }
    on_response(b->c, r);
}

static void beam_tick_stats(void *user, const vki_batch_stats *st)
{
    beam_seen *b = user; /* worker thread only; read after destroy */
    b->n_ticks++;
    b->last_used = st->kv_used;
    b->paused += st->paused;
}

static void test_beam_requests(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(8, 24, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_MAX_UTILIZATION);
    beam_seen b = {.c = c};
    vki_batch_callbacks cb = {.user = &b, .tick_stats = beam_tick_stats};
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, &cb, &bm), VKI_OK);
    enum { N = 30 };
    for (uint32_t i = 0; i < N; i++) {
        vki_request r = mkreq(c, i, 4 + i % 9, 6 + (i * 7) % 9, false, i); /* <= 7 blocks of 4 */
        r.beam_width = b.width[i] = i % 3 == 0 ? 2 + i % 2 : 0; /* <= 21 of the 24 blocks */
        r.ignore_eos = !r.beam_width; /* the plain ones run long: the pool runs short */
        r.length_penalty = i % 2 ? 1.0f : 0.0f;
        r.early_stopping = (vki_early_stopping)(i % 3);
        char err[200];
        if (vki_batch_submit(bm, &r, on_beam_response, &b, err, sizeof err) != VKI_OK)
            fail_msg("submit %u: %s", i, err);
        if (i == 9 || i == 21) /* a beam request cancelled queued or running */
            assert_int_equal(vki_batch_cancel(bm, i), VKI_OK);
    }
    wait_finals(c, N);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    if (c->bad[0])
        fail_msg("%s", c->bad);
    uint32_t beams = 0;
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(c->r[i].n_final, 1);
        assert_int_equal(b.bad_order[i], 0);
        if (!b.width[i] || c->r[i].finish == VKI_FINISH_CANCELLED)
            continue;
        assert_true(c->r[i].finish == VKI_FINISH_EOS || c->r[i].finish == VKI_FINISH_LENGTH);
        assert_int_equal(b.n_beams[i], b.width[i]);
        beams++;
    }
    printf("beam requests: %u completed beside plain ones, %u paused-request ticks, %u ticks\n", beams, b.paused,
           b.n_ticks);
    assert_true(beams >= 6);
    assert_true(b.paused > 0); /* plain requests were paused around the beam groups */
    assert_int_equal(b.last_used, 0); /* no block leaked */
    fake_destroy(f);
    coll_free(c);
}

/* STATIC adds TensorRT-LLM's static batching fields: live decode tokens and the padding slots of
 * members that finished while their batch runs on. */
typedef struct static_stats {
    coll *c;
    uint32_t n, empty_ticks;
    char bad[512];
} static_stats;

static void cb_static_stats(void *user, const char *json)
{
    static_stats *x = user; /* worker thread only; read after destroy */
    cJSON *o = cJSON_Parse(json);
    const cJSON *gen = cJSON_GetObjectItemCaseSensitive(o, "Generation Requests"),
                *tot = cJSON_GetObjectItemCaseSensitive(o, "Total Generation Tokens"),
                *empty = cJSON_GetObjectItemCaseSensitive(o, "Empty Generation Slots"),
                *mb = cJSON_GetObjectItemCaseSensitive(o, "MicroBatch ID");
    if (!gen || !tot || !empty || !mb || tot->valuedouble + empty->valuedouble != gen->valuedouble)
        snprintf(x->bad, sizeof x->bad, "%s", json);
    x->empty_ticks += empty && empty->valuedouble > 0;
    x->n++;
    cJSON_Delete(o);
}

static void cb_get_static(void *user, int32_t max, vki_request_list *sink) { cb_get(((static_stats *)user)->c, max, sink); }
static void on_response_static(void *user, const vki_response *r) { on_response(((static_stats *)user)->c, r); }

static void test_static_stats(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(4, 128, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_STATIC);
    static_stats x = {.c = c};
    /* pulled together at the first tick (pushed ones could start apart on a slow machine): one
     * batch, where the short ones become padding */
    static vki_request reqs[3];
    for (uint32_t i = 0; i < 3; i++) {
        reqs[i] = mkreq(c, i, 5, 2 + 5 * i, false, i);
        reqs[i].ignore_eos = true;
    }
    c->pending = reqs;
    c->n_pending = 3;
    vki_batch_callbacks cb = {.user = &x, .get_requests = cb_get_static, .send_response = on_response_static,
                              .stats = cb_static_stats};
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, &cb, &bm), VKI_OK);
    wait_finals(c, 3);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    if (x.bad[0])
        fail_msg("static stats: %s", x.bad);
    assert_true(x.n > 0 && x.empty_ticks > 0);
    coll_free(c);
    fake_destroy(f);
}

static void test_callback_interface(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(4, 128, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    p.max_queue = 6;
    p.idle_poll_us = 200;
    vki_batch_callbacks cb = {.user = c, .get_requests = cb_get, .send_response = on_response,
                              .poll_stop_signals = cb_stops, .stats = cb_stats};
    enum { N = 60 };
    static vki_request reqs[N + 2];
    for (uint32_t i = 0; i < N; i++)
        reqs[i] = mkreq(c, i, 3 + i % 20, 2 + (i * 7) % 40, i % 2, i);
    reqs[11].max_new_tokens = 0;            /* invalid: refused with a final error */
    reqs[20].max_new_tokens = 100;
    reqs[N] = reqs[20];                     /* a duplicate of an id in flight (100 tokens to go) */
    reqs[N + 1] = mkreq(c, 21, 5, 30, false, 3);
    reqs[N + 1].sampling.top_p = 7;         /* invalid and a duplicate id: error either way */
    reqs[21] = mkreq(c, 21, 5, 30, false, 21);
    c->r[20].dup = c->r[21].dup = true;
    reqs[30] = mkreq(c, 30, 10, 120, true, 30); /* stopped by poll_stop_signals after 3 tokens */
    reqs[31] = mkreq(c, 31, 10, 120, true, 31);
    c->stops[0] = 30;
    c->stops[1] = 31;
    c->n_stops = 2;
    /* reorder so that the duplicate of 20 comes right after it */
    vki_request order[N + 2];
    uint32_t k = 0;
    for (uint32_t i = 0; i < N; i++) {
        order[k++] = reqs[i];
        if (i == 20)
            order[k++] = reqs[N];
        if (i == 21)
            order[k++] = reqs[N + 1];
    }
    pthread_mutex_lock(&c->mu);
    c->pending = order;
    c->n_pending = N + 2;
    pthread_mutex_unlock(&c->mu);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, &cb, &bm), VKI_OK);
    c->bm = bm;
    /* the push interface shares the id space */
    vki_request push = mkreq(c, 500, 4, 3, false, 5);
    vki_status st;
    while ((st = vki_batch_submit(bm, &push, on_response, c, NULL, 0)) == VKI_RETRY_QUEUE_FULL)
        sched_yield(); /* get_requests may have filled the queue: retryable */
    assert_int_equal(st, VKI_OK);
    wait_finals(c, N + 2 + 1);
    for (int i = 0; i < 5; i++) /* idle wake-ups: no stats (checked in cb_stats) */
        vki_batch_notify(bm);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    assert_true(c->n_stats > 0);
    assert_true(c->max_seen_max <= 6 && c->max_seen_min >= 0);
    assert_int_equal(c->r[11].finish, VKI_FINISH_ERROR);
    assert_non_null(strstr(c->r[11].error, "max_new_tokens"));
    assert_int_equal(c->r[11].status, VKI_ERR_INVALID_ARG);
    assert_int_equal(c->r[20].n_final, 2); /* its own, and the refusal of the duplicate */
    assert_int_equal(c->r[21].n_final, 2);
    assert_int_equal(c->r[30].finish, VKI_FINISH_CANCELLED);
    assert_int_equal(c->r[31].finish, VKI_FINISH_CANCELLED);
    for (uint32_t i = 0; i < N; i++) {
        if (i == 11 || i == 20 || i == 21)
            continue;
        check_rec(c, f, &reqs[i]);
    }
    check_rec(c, f, &push);
    fake_destroy(f);
    coll_free(c);
}

static void on_response_cancel_at_3(void *user, const vki_response *resp)
{
    coll *c = user;
    on_response(user, resp);
    pthread_mutex_lock(&c->mu);
    bool third = !resp->final && c->r[resp->id].n_tokens == 3;
    pthread_mutex_unlock(&c->mu);
    if (third && vki_batch_cancel(c->bm, resp->id) != VKI_OK) {
        pthread_mutex_lock(&c->mu);
        bad(c, "cannot cancel a running request from its callback", resp->id);
        pthread_mutex_unlock(&c->mu);
    }
}

/* A request cancelled mid-generation leaves the manager idle between ticks: the last stats object
 * must show the pool drained (no active request, no used KV block), not the last busy tick. */
static void test_stats_after_cancel_to_idle(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(4, 128, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_callbacks cb = {.user = c, .send_response = on_response, .stats = cb_stats};
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, &cb, &bm), VKI_OK);
    vki_request r = mkreq(c, 7, 10, 400, true, 7);
    r.ignore_eos = true; /* the fake's end token must not finish it before the cancel */
    c->bm = bm;
    /* cancelled from its own third token's callback: a thread polling for that token could be
     * descheduled while the fake generates all 400 (it did, on a loaded machine) */
    assert_int_equal(vki_batch_submit(bm, &r, on_response_cancel_at_3, c, NULL, 0), VKI_OK);
    wait_finals(c, 1);
    assert_int_equal(c->r[7].n_tokens, 3); /* the cancel ends it at the next tick boundary */
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK); /* joins: stats are done */
    assert_int_equal(c->r[7].finish, VKI_FINISH_CANCELLED);
    cJSON *o = cJSON_Parse(c->last_stats);
    assert_non_null(o);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Active Request Count")), 0);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "Used KV cache blocks")), 0);
    cJSON_Delete(o);
    if (c->stats_bad[0])
        fail_msg("stats: %s", c->stats_bad);
    fake_destroy(f);
    coll_free(c);
}

/* idle_poll_us = 0: an idle manager calls get_requests only when notified. */
static void test_notify_without_polling(void **state)
{
    (void)state;
    coll *c = coll_new();
    fake_engine *f = mkfake(4, 128, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    p.idle_poll_us = 0;
    vki_batch_callbacks cb = {.user = c, .get_requests = cb_get, .send_response = on_response};
    vki_request reqs[3];
    for (uint32_t i = 0; i < 3; i++)
        reqs[i] = mkreq(c, i, 6, 4, false, i);
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, &cb, &bm), VKI_OK);
    pthread_mutex_lock(&c->mu); /* work appears after the manager went idle */
    c->pending = reqs;
    c->n_pending = 3;
    pthread_mutex_unlock(&c->mu);
    vki_batch_notify(bm);
    wait_finals(c, 3);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_clean(c, f);
    for (uint32_t i = 0; i < 3; i++)
        check_rec(c, f, &reqs[i]);
    fake_destroy(f);
    coll_free(c);
}

/* ---- destroy -------------------------------------------------------------------------------- */

static void on_response_submit_again(void *user, const vki_response *resp)
{
    coll *c = user;
    on_response(user, resp);
    if (resp->final && resp->id == 0) {
        vki_request r = mkreq(c, 900, 3, 3, false, 1);
        vki_status st = vki_batch_submit(c->bm, &r, on_response, c, NULL, 0);
        pthread_mutex_lock(&c->mu);
        c->submit_in_shutdown = st;
        c->destroy_in_cb = vki_batch_manager_destroy(c->bm, false);
        pthread_mutex_unlock(&c->mu);
    }
}

typedef struct destroyer {
    vki_batch_manager *bm;
    bool abort;
    vki_status st;
} destroyer;

static void *destroy_thread(void *arg)
{
    destroyer *d = arg;
    d->st = vki_batch_manager_destroy(d->bm, d->abort);
    return NULL;
}

/* The worker is held in its first step while destroy starts on another thread, so every
 * response comes after shutdown began: deterministic without timing. */
static void destroy_case(bool abort)
{
    gated t;
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    p.max_queue = 0;
    gated_open(&t, p, 4, 256, hold_first, NULL);
    enum { N = 40 };
    vki_request reqs[N];
    for (uint32_t i = 0; i < N; i++) {
        reqs[i] = mkreq(t.c, i, 5 + i % 7, 30 + i, i % 2, i);
        assert_int_equal(vki_batch_submit(t.bm, &reqs[i], i == 0 ? on_response_submit_again : on_response, t.c,
                                          NULL, 0), VKI_OK);
        if (i == 0)
            gate_wait_held(&t.g);
    }
    destroyer d = {.bm = t.bm, .abort = abort};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, destroy_thread, &d), 0);
    for (bool down = false; !down;) { /* wait until destroy has flagged the shutdown */
        pthread_mutex_lock(&t.bm->mu);
        down = t.bm->shutdown;
        pthread_mutex_unlock(&t.bm->mu);
        sched_yield();
    }
    gate_release(&t.g, NULL, 0);
    pthread_join(th, NULL);
    assert_int_equal(d.st, VKI_OK);
    assert_int_equal(t.c->finals, N); /* destroy returned only after every final response */
    assert_clean(t.c, t.f);
    uint32_t cancelled = 0;
    for (uint32_t i = 0; i < N; i++) {
        check_rec(t.c, t.f, &reqs[i]);
        cancelled += t.c->r[i].finish == VKI_FINISH_CANCELLED;
    }
    /* abort: only request 0 ran one step; nobody can have finished (>= 30 tokens each) */
    assert_int_equal(cancelled, abort ? N : 0);
    assert_int_equal(t.c->destroy_in_cb, VKI_ERR_INVALID_ARG);
    assert_int_equal(t.c->submit_in_shutdown, VKI_ERR_SHUTDOWN);
    fake_destroy(t.f);
    pthread_mutex_destroy(&t.g.mu);
    pthread_cond_destroy(&t.g.cv);
    coll_free(t.c);
}

static void test_destroy_waits(void **state) { (void)state; destroy_case(false); }
static void test_destroy_abort(void **state) { (void)state; destroy_case(true); }

static void test_create_params(void **state)
{
    (void)state;
    fake_engine *f = mkfake(4, 64, 0);
    bm_backend be = fake_backend(f);
    vki_batch_params p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_manager *bm = (vki_batch_manager *)&bm;
    p.chunk_size = 6; /* not a multiple of the page size 4 */
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_ERR_INVALID_ARG);
    assert_null(bm);
    p = mkparams(VKI_POLICY_GUARANTEED_NO_EVICT);
    vki_batch_callbacks cb = {.get_requests = cb_get};
    assert_int_equal(bm_create(&be, &p, &cb, &bm), VKI_ERR_INVALID_ARG);
    p.policy = (vki_capacity_policy)7;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_ERR_INVALID_ARG);
    vki_batch_params d = vki_batch_default_params();
    assert_int_equal(d.chunk_size, 512);
    assert_true(d.block_reuse && d.stats);
    assert_int_equal(d.policy, VKI_POLICY_GUARANTEED_NO_EVICT);
    assert_int_equal(vki_batch_manager_destroy(NULL, false), VKI_OK);
    fake_destroy(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_params),
        cmocka_unit_test(test_push_no_evict),
        cmocka_unit_test(test_push_max_util_small_pool),
        cmocka_unit_test(test_push_static),
        cmocka_unit_test(test_push_step_failures),
        cmocka_unit_test(test_push_device_lost),
        cmocka_unit_test(test_lookahead),
        cmocka_unit_test(test_lookahead_penalties),
        cmocka_unit_test(test_lookahead_min_tokens),
        cmocka_unit_test(test_lookahead_full_batch),
        cmocka_unit_test(test_lookahead_waiting_for_blocks),
        cmocka_unit_test(test_end_and_stop_ids),
        cmocka_unit_test(test_lazy_logprobs_and_cached),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_constrained),
        cmocka_unit_test(test_constrained_lookahead),
        cmocka_unit_test(test_duplicate_ids_and_queue_full),
        cmocka_unit_test(test_cancel_states),
        cmocka_unit_test(test_cancel_paused),
        cmocka_unit_test(test_callback_interface),
        cmocka_unit_test(test_static_stats),
        cmocka_unit_test(test_beam_requests),
        cmocka_unit_test(test_stats_after_cancel_to_idle),
        cmocka_unit_test(test_notify_without_polling),
        cmocka_unit_test(test_destroy_waits),
        cmocka_unit_test(test_destroy_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
