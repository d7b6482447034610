/* Scheduler: every capacity policy, block reuse, pause/resume, cancellation in every state,
 * budgets, slots, queue bound, step failures, and a seeded randomized stress test per policy.
 * A small driver plays the batch manager's role (plan -> fake engine -> commit -> stop checks)
 * and checks after every tick: sched_check (all invariants), the fake engine's plan checks, one
 * new token per sampled entry; at the end: every output equals what the request produces alone
 * (fake_reference), exactly one finish per request, and no block leak (free + cached == max). */
#include "support/fake_engine.h"
#include "support/vt.h"

#include "scheduler/sched.h"

enum { FIN_NONE, FIN_EOS, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR };

typedef struct dreq {
    int32_t *prompt;              /* [n_prompt] */
    uint32_t n_prompt, max_new;
    int32_t priority;
    vki_sampling_params sp;       /* stable address: the scheduler keeps a pointer */
    bool sampled;
    sched_seq *seq;               /* NULL once finished */
    int32_t *out;                 /* [max_new] tokens emitted so far, in order */
    uint32_t n_out;
    int finish;
    uint32_t n_finish;            /* must end at exactly 1 */
    uint64_t admit_tick;          /* last tick it went from queued to running */
    bool was_queued;
    uint32_t beam_width;          /* > 1: a beam group; the driver reorders it at random */
} dreq;

typedef struct drv {
    fake_engine *f;
    sched *s;
    sched_params p;
    dreq *r;                      /* [cap] */
    uint32_t n, cap;
    vki_step_out *outs;           /* [max_seqs] */
    uint64_t ticks;
    sched_tick last;
    uint32_t max_running_seen;
    bool check_lockstep;          /* STATIC: no context entry together with a decode entry */
    uint32_t beam_width;          /* drv_add_ex: the next request's beam width (0: none) */
    vt_rng *beam_rng;             /* the random parents and tokens of beam reorders */
    uint64_t reorders, copies;    /* beam reorders done, page copies they asked for */
} drv;

static void drv_init(drv *d, sched_params p, uint32_t cap, uint32_t vocab, int32_t eos, uint32_t fail_every)
{
    memset(d, 0, sizeof *d);
    d->p = p;
    fake_config fc = {.max_seqs = p.max_seqs, .n_pages = p.n_blocks, .page_size = p.block_size, .max_ctx = p.max_ctx,
                      .vocab = vocab, .max_batch = p.max_batch_size, .max_tokens = p.max_num_tokens, .eos = eos,
                      .fail_every = fail_every, .window = p.kv_window, .sink = p.kv_sink};
    assert_int_equal(fake_create(&fc, &d->f), VKI_OK);
    assert_int_equal(sched_create(&p, &d->s), VKI_OK);
    d->cap = cap;
    d->r = calloc(cap, sizeof *d->r);
    d->outs = calloc(p.max_seqs, sizeof *d->outs);
    assert_non_null(d->r);
    assert_non_null(d->outs);
}

static void drv_free(drv *d)
{
    sched_destroy(d->s);
    fake_destroy(d->f);
    for (uint32_t i = 0; i < d->n; i++) {
        free(d->r[i].prompt);
        free(d->r[i].out);
    }
    free(d->r);
    free(d->outs);
}

static sched_params params(vki_capacity_policy pol, uint32_t max_seqs, uint32_t n_blocks, uint32_t bs)
{
    return (sched_params){.policy = pol, .max_seqs = max_seqs, .n_blocks = n_blocks, .block_size = bs,
                          .max_ctx = 1024, .max_num_tokens = 4096, .chunk_size = bs * 8, .block_reuse = true};
}

/* Adds a request; returns its index or fails the test unless `expect` is the status. */
static dreq *drv_add_ex(drv *d, const int32_t *prompt, uint32_t n_prompt, uint32_t max_new, int32_t priority,
                        bool sampled, uint64_t seed, vki_status expect)
{
    assert_true(d->n < d->cap);
    dreq *r = &d->r[d->n];
    memset(r, 0, sizeof *r);
    r->prompt = malloc((n_prompt ? n_prompt : 1) * sizeof(int32_t));
    r->out = malloc((max_new ? max_new : 1) * sizeof(int32_t));
    memcpy(r->prompt, prompt, n_prompt * sizeof(int32_t));
    r->n_prompt = n_prompt;
    r->max_new = max_new;
    r->priority = priority;
    r->sampled = sampled;
    r->sp = vki_sampling_default_params();
    r->sp.temperature = sampled ? 0.8f : 0.0f;
    r->sp.penalty_window = 3 + (uint32_t)(seed % 40);
    r->sp.seed = seed;
    r->beam_width = d->beam_width;
    sched_add_args a = {.prompt = prompt, .n_prompt = n_prompt, .max_new = max_new, .priority = priority,
                        .sampling = &r->sp, .seed = seed, .user = r, .beam_width = d->beam_width};
    vki_status st = sched_add(d->s, &a, &r->seq);
    assert_int_equal(st, expect);
    if (st != VKI_OK) {
        free(r->prompt);
        free(r->out);
        return NULL;
    }
    r->was_queued = true;
    d->n++;
    return r;
}

static dreq *drv_add(drv *d, const int32_t *prompt, uint32_t n_prompt, uint32_t max_new)
{
    return drv_add_ex(d, prompt, n_prompt, max_new, 0, false, 0, VKI_OK);
}

static void drv_finish(drv *d, dreq *r, int how)
{
    sched_remove(d->s, r->seq);
    r->seq = NULL;
    r->finish = how;
    r->n_finish++;
}

static void drv_check(drv *d)
{
    char msg[256];
    vki_status st = sched_check(d->s, msg, sizeof msg);
    if (st != VKI_OK)
        fail_msg("tick %llu: %s", (unsigned long long)d->ticks, msg);
    if (fake_violations(d->f, msg, sizeof msg))
        fail_msg("fake engine: %s", msg);
}

/* The driver's stop checks: end id, or max_new tokens. Emits exactly the new token. */
static void drv_apply(drv *d, sched_seq *q)
{
    dreq *r = q->user;
    uint32_t gen = sched_seq_generated(q);
    if (gen != r->n_out + 1)
        fail_msg("tick %llu: sequence has %u generated tokens, %u were emitted before this step",
                 (unsigned long long)d->ticks, gen, r->n_out);
    r->out[r->n_out] = q->tokens[q->n_prompt + r->n_out];
    r->n_out++;
    if (fake_is_eog(d->f, r->out[r->n_out - 1]))
        drv_finish(d, r, FIN_EOS);
    else if (r->n_out == r->max_new)
        drv_finish(d, r, FIN_LENGTH);
}

/* A beam group sampled: it ends at max_new, else every beam continues a random parent (the
 * lead's only one after the prompt) with a random token. The copies asked for are done by the
 * fake engine's next step, whose chain checks then catch a wrong table or copy. */
static void drv_beam_step(drv *d, sched_seq *lead)
{
    dreq *r = lead->user;
    uint32_t w = lead->beam_width, parent[w];
    int32_t token[w];
    r->n_out = sched_seq_generated(lead);
    if (r->n_out >= r->max_new) {
        drv_finish(d, r, FIN_LENGTH);
        return;
    }
    bool first = lead->beams[1]->beam_idle;
    for (uint32_t b = 0; b < w; b++) {
        parent[b] = first ? 0 : vt_range(d->beam_rng, 0, w - 1);
        token[b] = (int32_t)vt_range(d->beam_rng, 1, 39); /* the stress's vocabulary, no end id */
    }
    assert_int_equal(sched_beam_reorder(d->s, lead, parent, token), VKI_OK);
    d->reorders++;
}

/* One tick. Returns the number of plan entries (0 = nothing ran). */
static uint32_t drv_tick(drv *d)
{
    d->ticks++;
    sched_tick *t = &d->last;
    assert_int_equal(sched_plan(d->s, t), VKI_OK);
    for (uint32_t i = 0; i < d->n; i++) {
        dreq *r = &d->r[i];
        if (r->seq && r->was_queued && r->seq->state == SCHED_RUNNING)
            r->admit_tick = d->ticks;
        if (r->seq)
            r->was_queued = r->seq->state == SCHED_QUEUED;
    }
    drv_check(d);
    if (!t->plan.n_seqs)
        return 0;
    d->copies += t->plan.n_copies;
    for (uint32_t i = 0; i < t->plan.n_seqs; i++) { /* decode entries first; ghosts sample nothing */
        if (i < t->n_generation)
            assert_true(t->plan.seqs[i].n_new == 1 && t->plan.seqs[i].want_token != t->seqs[i]->ghost);
        assert_true(!t->seqs[i]->ghost || (!t->plan.seqs[i].want_token && !t->seqs[i]->user));
    }
    if (d->check_lockstep)
        assert_true(t->n_context == 0 || t->n_generation == 0);
    uint32_t n = t->plan.n_seqs;
    vki_status st = fake_step(d->f, &t->plan, d->outs);
    if (st != VKI_OK) {
        char msg[256];
        if (fake_violations(d->f, msg, sizeof msg))
            fail_msg("fake engine: %s", msg);
        dreq *failed[n];
        for (uint32_t i = 0; i < n; i++) /* collected first: finishing may end a STATIC batch; a beam
                                            group ends through its lead */
            failed[i] = t->seqs[i]->beam_idx == 0 ? t->seqs[i]->user : NULL;
        for (uint32_t i = 0; i < n; i++) /* the plan's KV is undefined: fail them */
            if (failed[i])
                drv_finish(d, failed[i], FIN_ERROR);
    } else {
        sched_commit(d->s, t, d->outs);
        sched_seq *sampled[n];
        uint32_t ns = 0;
        for (uint32_t i = 0; i < n; i++)
            if (t->plan.seqs[i].want_token && t->seqs[i]->beam_idx == 0)
                sampled[ns++] = t->seqs[i];
        for (uint32_t i = 0; i < ns; i++)
            if (sampled[i]->beams)
                drv_beam_step(d, sampled[i]);
            else
                drv_apply(d, sampled[i]);
    }
    sched_stats ss;
    sched_get_stats(d->s, &ss);
    if (ss.running > d->max_running_seen)
        d->max_running_seen = ss.running;
    drv_check(d);
    return n;
}

static void drv_run(drv *d, uint64_t max_ticks)
{
    uint64_t idle = 0;
    while (idle < 2) {
        assert_true(d->ticks < max_ticks);
        idle = drv_tick(d) ? 0 : idle + 1;
    }
}

/* Outputs equal the reference (cancelled/failed: a prefix of it), one finish each, no leak. */
static void drv_verify(drv *d)
{
    for (uint32_t i = 0; i < d->n; i++) {
        dreq *r = &d->r[i];
        assert_null(r->seq);
        assert_int_equal(r->n_finish, 1);
        int32_t *ref = malloc(r->max_new * sizeof(int32_t));
        fake_reference(d->f, r->prompt, r->n_prompt, r->max_new, r->sampled, r->sp.seed, ref, NULL);
        for (uint32_t k = 0; r->beam_width <= 1 && k < r->n_out; k++) /* beams: random tokens */
            if (r->out[k] != ref[k])
                fail_msg("request %u: token %u is %d, alone it is %d", i, k, r->out[k], ref[k]);
        if (r->finish == FIN_LENGTH)
            assert_int_equal(r->n_out, r->max_new);
        if ((r->finish == FIN_EOS || r->finish == FIN_LENGTH) && r->beam_width <= 1)
            for (uint32_t k = 0; k + 1 < r->n_out; k++)
                assert_false(fake_is_eog(d->f, ref[k])); /* it did not stop early */
        free(ref);
    }
    sched_stats ss;
    sched_get_stats(d->s, &ss);
    assert_int_equal(ss.running, 0);
    assert_int_equal(ss.queued, 0);
    assert_int_equal(ss.kv.used_blocks, 0);
    assert_int_equal(ss.kv.free_blocks + ss.kv.cached_blocks, ss.kv.max_blocks);
}

static bool in_context_of(const sched_seq *q) { return q->n_computed < q->ctx_end; }

static void fill_tokens(int32_t *t, uint32_t n, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (int32_t)(1 + (i * 7 + salt * 13) % 50);
}

/* ---- basic lifecycle ------------------------------------------------------------------------ */

static void test_single_request(void **state)
{
    (void)state;
    drv d;
    drv_init(&d, params(VKI_POLICY_GUARANTEED_NO_EVICT, 4, 64, 4), 4, 64, -1, 0);
    int32_t p[13];
    fill_tokens(p, 13, 1);
    dreq *r = drv_add(&d, p, 13, 20);
    drv_run(&d, 100);
    assert_int_equal(r->finish, FIN_LENGTH);
    assert_int_equal(r->n_out, 20);
    /* one prefill tick, then 19 decode ticks */
    assert_int_equal(fake_steps(d.f), 20);
    drv_verify(&d);
    drv_free(&d);
}

static void test_end_id_stops(void **state)
{
    (void)state;
    drv d;
    /* tiny vocabulary: the end id (0) comes up quickly */
    drv_init(&d, params(VKI_POLICY_GUARANTEED_NO_EVICT, 8, 256, 4), 32, 5, 0, 0);
    int32_t p[6];
    uint32_t eos = 0;
    for (uint32_t i = 0; i < 32; i++) {
        for (uint32_t j = 0; j < 6; j++)
            p[j] = (int32_t)(1 + (i * 5 + j * 3 + i / 4) % 4);
        drv_add(&d, p, 6, 60);
    }
    drv_run(&d, 1000);
    for (uint32_t i = 0; i < 32; i++)
        eos += d.r[i].finish == FIN_EOS;
    assert_true(eos > 20);
    drv_verify(&d);
    drv_free(&d);
}

static void test_validation(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_GUARANTEED_NO_EVICT, 4, 16, 4);
    p.max_ctx = 100;
    drv_init(&d, p, 8, 64, -1, 0);
    char msg[160];
    assert_int_equal(sched_validate(d.s, 0, 5, msg, sizeof msg), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(msg, "prompt"));
    assert_int_equal(sched_validate(d.s, 5, 0, msg, sizeof msg), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(msg, "max_new_tokens"));
    assert_int_equal(sched_validate(d.s, 60, 41, msg, sizeof msg), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(msg, "context"));
    assert_int_equal(sched_validate(d.s, 60, 10, msg, sizeof msg), VKI_ERR_INVALID_ARG); /* 69 tokens: 18 blocks > 16 */
    assert_non_null(strstr(msg, "KV blocks"));
    assert_int_equal(sched_validate(d.s, 60, 5, msg, sizeof msg), VKI_OK); /* 64 tokens of KV: 16 blocks */
    assert_int_equal(sched_validate(d.s, UINT32_MAX, UINT32_MAX, msg, sizeof msg), VKI_ERR_INVALID_ARG);
    int32_t t[4] = {1, 2, 3, 4};
    drv_add_ex(&d, t, 0, 4, 0, false, 0, VKI_ERR_INVALID_ARG);
    sched *bad;
    sched_params q = p;
    q.chunk_size = 6; /* not a multiple of the block size */
    assert_int_equal(sched_create(&q, &bad), VKI_ERR_INVALID_ARG);
    q = p;
    q.max_num_tokens = 0;
    assert_int_equal(sched_create(&q, &bad), VKI_ERR_INVALID_ARG);
    drv_free(&d);
}

static void test_queue_bound(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_GUARANTEED_NO_EVICT, 2, 64, 4);
    p.max_queue = 3;
    drv_init(&d, p, 8, 64, -1, 0);
    int32_t t[5] = {1, 2, 3, 4, 5};
    for (int i = 0; i < 3; i++)
        drv_add(&d, t, 5, 3);
    drv_add_ex(&d, t, 5, 3, 0, false, 0, VKI_RETRY_QUEUE_FULL);
    drv_tick(&d); /* two admitted: room for two more */
    drv_add(&d, t, 5, 3);
    drv_add(&d, t, 5, 3);
    drv_add_ex(&d, t, 5, 3, 0, false, 0, VKI_RETRY_QUEUE_FULL);
    drv_run(&d, 100);
    assert_int_equal(d.n, 5);
    drv_verify(&d);
    drv_free(&d);
}

/* Slots are unique (sched_check), bounded by max_seqs, and reused. */
static void test_slots_and_batch_limit(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_GUARANTEED_NO_EVICT, 6, 512, 4);
    p.max_batch_size = 3;
    drv_init(&d, p, 12, 64, -1, 0);
    int32_t t[9];
    for (uint32_t i = 0; i < 12; i++) {
        fill_tokens(t, 9, i);
        drv_add(&d, t, 9, 5 + i);
    }
    drv_run(&d, 500);
    assert_int_equal(d.max_running_seen, 3);
    assert_int_equal(fake_max_seqs_seen(d.f), 3);
    drv_verify(&d);
    drv_free(&d);
}

/* ---- micro-batching -------------------------------------------------------------------------- */

typedef struct shape_log {
    uint32_t n;
    uint32_t max_tokens;
} shape_log;

static void log_shape(void *user, const vki_step_plan *plan)
{
    shape_log *l = user;
    l->n++;
    if (plan->n_tokens > l->max_tokens)
        l->max_tokens = plan->n_tokens;
}

/* Chunked prefill under a token budget; decode entries come first; every step within budget. */
static void test_chunked_prefill_budget(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_GUARANTEED_NO_EVICT, 8, 512, 8);
    p.max_num_tokens = 40;
    p.chunk_size = 32;
    drv_init(&d, p, 8, 64, -1, 0);
    shape_log log = {0};
    fake_destroy(d.f);
    fake_config fc = {.max_seqs = 8, .n_pages = 512, .page_size = 8, .max_ctx = 1024, .vocab = 64, .max_tokens = 40,
                      .eos = -1, .on_step = log_shape, .on_step_user = &log};
    assert_int_equal(fake_create(&fc, &d.f), VKI_OK);
    int32_t t[300];
    fill_tokens(t, 300, 3);
    drv_add(&d, t, 10, 30);
    drv_tick(&d); /* short prompt done in one chunk */
    assert_int_equal(d.last.n_context_tokens, 10);
    drv_add(&d, t, 300, 5); /* long prompt: chunks of <= 32 beside one decode token */
    uint32_t chunks = 0;
    while (d.r[1].seq->n_computed < 300) {
        drv_tick(&d);
        chunks++;
        assert_true(d.last.n_context_tokens <= 32);
        assert_int_equal(d.last.n_generation, 1); /* the first request decodes beside it */
    }
    assert_int_equal(chunks, 10); /* ceil(300 / 32) */
    drv_run(&d, 500);
    assert_int_equal(log.max_tokens, 33);
    drv_verify(&d);
    drv_free(&d);
}

/* Higher priority first, FIFO among equals. */
static void test_priority_fifo(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_GUARANTEED_NO_EVICT, 1, 64, 4);
    drv_init(&d, p, 8, 64, -1, 0);
    int32_t t[4] = {1, 2, 3, 4};
    int32_t prio[6] = {0, 5, 0, 5, -1, 7};
    for (int i = 0; i < 6; i++)
        drv_add_ex(&d, t, 4, 2, prio[i], false, 0, VKI_OK);
    drv_run(&d, 100);
    /* one slot: admission ticks give the order */
    int order[6] = {5, 1, 3, 0, 2, 4};
    for (int i = 1; i < 6; i++)
        assert_true(d.r[order[i - 1]].admit_tick < d.r[order[i]].admit_tick);
    drv_verify(&d);
    drv_free(&d);
}

/* ---- capacity policies ------------------------------------------------------------------- */

/* GUARANTEED_NO_EVICT: admits only what fits to completion, never pauses. */
static void test_no_evict_reserves(void **state)
{
    (void)state;
    drv d;
    /* each request: 8 prompt + 24 new -> 31 KV tokens -> 8 blocks; 20 blocks hold two */
    sched_params p = params(VKI_POLICY_GUARANTEED_NO_EVICT, 8, 20, 4);
    p.block_reuse = false;
    drv_init(&d, p, 8, 64, -1, 0);
    int32_t t[8];
    for (uint32_t i = 0; i < 5; i++) {
        fill_tokens(t, 8, i);
        drv_add(&d, t, 8, 24);
    }
    drv_run(&d, 1000);
    assert_int_equal(d.max_running_seen, 2);
    sched_stats ss;
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.pauses, 0);
    drv_verify(&d);
    drv_free(&d);
}

/* MAX_UTILIZATION: admits by the next step, pauses the newest when short, resumes from the
 * front of the queue by recomputation, and loses or repeats no token. */
static void test_max_util_pause_resume(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_MAX_UTILIZATION, 4, 7, 4);
    drv_init(&d, p, 8, 64, -1, 0);
    int32_t a[6], b[6], c[6];
    fill_tokens(a, 6, 1);
    fill_tokens(b, 6, 2);
    fill_tokens(c, 6, 3);
    dreq *ra = drv_add(&d, a, 6, 20); /* needs 7 blocks by the end */
    dreq *rb = drv_add(&d, b, 6, 14);
    drv_tick(&d);
    assert_int_equal(d.last.n_admitted, 2); /* both fit for their first step */
    dreq *rc = NULL;
    uint64_t paused_at = 0;
    while (ra->seq || rb->seq) {
        drv_tick(&d);
        if (!paused_at && d.last.n_paused) {
            paused_at = d.ticks;
            assert_true(rb->seq && rb->seq->paused); /* the newest goes */
            assert_non_null(ra->seq);
            rc = drv_add(&d, c, 6, 4); /* queued behind the paused one */
        }
        assert_true(d.ticks < 500);
    }
    assert_true(paused_at > 0);
    drv_run(&d, 500);
    assert_true(rb->admit_tick <= rc->admit_tick); /* resumed before the newer request */
    assert_int_equal(ra->finish, FIN_LENGTH);
    assert_int_equal(rb->finish, FIN_LENGTH);
    drv_verify(&d);
    drv_free(&d);
}

/* STATIC: a batch forms only when nothing runs, reserved padded to the longest member, runs in
 * lockstep, and nobody joins mid-flight. */
static void test_static_batches(void **state)
{
    (void)state;
    drv d;
    /* members: A 4+4 (2 blocks), B 4+16 (5 blocks), C 4+4: padded to 5 blocks, 10 hold two */
    sched_params p = params(VKI_POLICY_STATIC, 8, 10, 4);
    p.block_reuse = false;
    drv_init(&d, p, 8, 64, -1, 0);
    d.check_lockstep = true;
    int32_t t[4];
    fill_tokens(t, 4, 1);
    dreq *ra = drv_add(&d, t, 4, 4);
    fill_tokens(t, 4, 2);
    dreq *rb = drv_add(&d, t, 4, 16);
    fill_tokens(t, 4, 3);
    dreq *rc = drv_add(&d, t, 4, 4);
    drv_tick(&d);
    assert_int_equal(d.last.n_admitted, 2);
    fill_tokens(t, 4, 4);
    dreq *rd = drv_add(&d, t, 4, 2);
    while (rb->seq) {
        drv_tick(&d);
        assert_true(rc->seq->state == SCHED_QUEUED && rd->seq->state == SCHED_QUEUED); /* no joining */
    }
    assert_null(ra->seq);
    drv_tick(&d);
    assert_int_equal(d.last.n_admitted, 2); /* C and D together */
    drv_run(&d, 200);
    drv_verify(&d);
    drv_free(&d);

    /* the same requests under GUARANTEED_NO_EVICT run three at once */
    p.policy = VKI_POLICY_GUARANTEED_NO_EVICT;
    drv_init(&d, p, 8, 64, -1, 0);
    fill_tokens(t, 4, 1);
    drv_add(&d, t, 4, 4);
    fill_tokens(t, 4, 2);
    drv_add(&d, t, 4, 16);
    fill_tokens(t, 4, 3);
    drv_add(&d, t, 4, 4);
    drv_tick(&d);
    assert_int_equal(d.last.n_admitted, 3);
    drv_run(&d, 200);
    drv_verify(&d);
    drv_free(&d);
}

/* STATIC lockstep with chunked prefill: short members wait for the long prompt. */
static void test_static_lockstep(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_STATIC, 4, 256, 4);
    p.chunk_size = 8;
    p.max_num_tokens = 12;
    drv_init(&d, p, 4, 64, -1, 0);
    d.check_lockstep = true;
    int32_t t[70];
    fill_tokens(t, 70, 9);
    drv_add(&d, t, 5, 6);
    drv_add(&d, t + 3, 60, 3);
    drv_add(&d, t + 7, 9, 8);
    drv_run(&d, 300);
    drv_verify(&d);
    drv_free(&d);
}

/* STATIC computes every member until the batch's longest finishes: a member that is done keeps
 * decoding padding (a ghost: no token sampled, nothing delivered) and the next batch waits. */
static void test_static_pads_to_longest(void **state)
{
    (void)state;
    drv d;
    drv_init(&d, params(VKI_POLICY_STATIC, 4, 256, 4), 4, 64, -1, 0);
    int32_t t[40];
    fill_tokens(t, 40, 3);
    dreq *a = drv_add(&d, t, 6, 2), *b = drv_add(&d, t + 5, 6, 9);
    drv_add(&d, t + 9, 6, 2);
    drv_tick(&d); /* a, b, c prefill (c too: the batch takes every slot it can) */
    uint32_t ghosts_seen = 0;
    while (b->seq) {
        drv_tick(&d);
        const sched_tick *tk = &d.last;
        if (!b->seq)
            break;
        /* every member of the batch is still computed, live or ghost */
        assert_int_equal(tk->n_generation, 3);
        for (uint32_t i = 0; i < tk->plan.n_seqs; i++)
            ghosts_seen += tk->seqs[i]->ghost;
        if (!a->seq) /* a finished: it got exactly its 2 tokens */
            assert_int_equal(a->n_out, 2);
    }
    assert_true(ghosts_seen >= 2 * 6); /* a and c padded for b's remaining 7 steps */
    drv_run(&d, 200);
    drv_verify(&d);
    sched_stats ss;
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.running, 0); /* the ghosts left with the batch */
    drv_free(&d);
}

/* ---- block reuse --------------------------------------------------------------------------- */

static void test_prefix_reuse(void **state)
{
    (void)state;
    drv d;
    drv_init(&d, params(VKI_POLICY_GUARANTEED_NO_EVICT, 4, 64, 4), 8, 64, -1, 0);
    int32_t p[20];
    fill_tokens(p, 20, 5);
    dreq *ra = drv_add(&d, p, 14, 3); /* KV of 16 tokens: 4 full blocks stay cached */
    drv_run(&d, 50);
    sched_stats ss;
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.kv.cached_blocks, 4);
    assert_int_equal(ss.reused_tokens, 0);

    int32_t q[16];
    memcpy(q, p, 14 * sizeof *q);
    q[14] = 33;
    q[15] = 34;
    drv_add(&d, q, 16, 4); /* shares 3 full blocks; block 4 differs */
    drv_tick(&d);
    assert_int_equal(d.last.plan.seqs[0].pos0, 12);
    assert_int_equal(d.last.plan.seqs[0].n_new, 4);
    drv_run(&d, 50);
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.reused_tokens, 12);

    /* A's whole KV (prompt + generated) as a prompt: the last token is still computed */
    int32_t w[16];
    memcpy(w, ra->prompt, 14 * sizeof *w);
    w[14] = ra->out[0];
    w[15] = ra->out[1];
    drv_add(&d, w, 16, 2);
    drv_tick(&d);
    assert_int_equal(d.last.plan.seqs[0].pos0, 12);
    assert_true(d.last.plan.seqs[0].want_token);
    drv_run(&d, 50);
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.reused_tokens, 24);
    drv_verify(&d);
    drv_free(&d);
}

/* Sequences computing the same prefix at the same time converge on one copy of each block. */
static void test_concurrent_same_prefix(void **state)
{
    (void)state;
    drv d;
    drv_init(&d, params(VKI_POLICY_GUARANTEED_NO_EVICT, 4, 64, 4), 8, 64, -1, 0);
    int32_t p[21];
    fill_tokens(p, 21, 8);
    for (int i = 0; i < 3; i++)
        drv_add(&d, p, 21, 6);
    drv_tick(&d); /* all three prefill together: no reuse possible yet */
    sched_stats ss;
    sched_get_stats(d.s, &ss);
    /* 5 full blocks shared by all three, plus each one's private 6th block */
    assert_int_equal(ss.kv.used_blocks, 5 + 3);
    drv_run(&d, 50);
    drv_verify(&d);
    drv_free(&d);
}

static void test_reuse_disabled(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_GUARANTEED_NO_EVICT, 4, 64, 4);
    p.block_reuse = false;
    drv_init(&d, p, 8, 64, -1, 0);
    int32_t t[21];
    fill_tokens(t, 21, 8);
    drv_add(&d, t, 21, 6);
    drv_run(&d, 50);
    drv_add(&d, t, 21, 6);
    drv_add(&d, t, 21, 6);
    drv_tick(&d);
    sched_stats ss;
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.kv.used_blocks, 12);
    drv_run(&d, 50);
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.reused_tokens, 0);
    assert_int_equal(ss.kv.cached_blocks, 0);
    assert_int_equal(ss.kv.free_blocks, 64);
    drv_verify(&d);
    drv_free(&d);
}

/* Cached blocks are evicted least recently released first, only when the free list is empty. */
static void test_lru_eviction(void **state)
{
    (void)state;
    drv d;
    drv_init(&d, params(VKI_POLICY_GUARANTEED_NO_EVICT, 4, 8, 4), 8, 64, -1, 0);
    int32_t a[9], b[9], c[21];
    fill_tokens(a, 9, 1);
    fill_tokens(b, 9, 2);
    fill_tokens(c, 21, 3);
    drv_add(&d, a, 9, 1); /* KV of 9 tokens: 2 full blocks cached */
    drv_run(&d, 20);
    drv_add(&d, b, 9, 1);
    drv_run(&d, 20);
    sched_stats ss;
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.kv.cached_blocks, 4);
    assert_int_equal(ss.kv.free_blocks, 4);
    drv_add(&d, c, 21, 1); /* 6 blocks: the 4 free + 2 evicted (A's, released first) */
    drv_tick(&d);
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.kv.evicted_blocks, 2);
    drv_run(&d, 20);
    uint64_t before = ss.reused_tokens;
    drv_add(&d, b, 9, 1);
    drv_tick(&d);
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.reused_tokens - before, 8); /* B's blocks survived */
    drv_run(&d, 20);
    before = ss.reused_tokens;
    drv_add(&d, a, 9, 1);
    drv_tick(&d);
    sched_get_stats(d.s, &ss);
    assert_int_equal(ss.reused_tokens - before, 0); /* A's were evicted */
    drv_run(&d, 20);
    drv_verify(&d);
    drv_free(&d);
}

/* ---- cancellation and failures ------------------------------------------------------------ */

static void test_cancel_every_state(void **state)
{
    (void)state;
    drv d;
    sched_params p = params(VKI_POLICY_MAX_UTILIZATION, 3, 12, 4);
    p.chunk_size = 8;
    p.max_num_tokens = 10;
    drv_init(&d, p, 8, 64, -1, 0);
    int32_t t[40];
    fill_tokens(t, 40, 4);
    dreq *gen = drv_add(&d, t, 4, 30);
    dreq *ctx = drv_add(&d, t + 1, 30, 2);
    dreq *queued;
    drv_tick(&d);
    drv_tick(&d);
    assert_true(gen->seq->state == SCHED_RUNNING && !in_context_of(gen->seq));
    assert_true(ctx->seq->state == SCHED_RUNNING && in_context_of(ctx->seq));
    drv_finish(&d, ctx, FIN_CANCELLED); /* mid prefill */
    drv_check(&d);
    queued = drv_add(&d, t + 2, 5, 3);
    drv_finish(&d, queued, FIN_CANCELLED); /* still queued */
    drv_check(&d);
    drv_tick(&d);
    drv_finish(&d, gen, FIN_CANCELLED); /* generating */
    drv_check(&d);
    /* paused: two long requests in a small pool */
    dreq *x = drv_add(&d, t, 6, 30), *y = drv_add(&d, t + 5, 6, 30);
    while (!(y->seq && y->seq->paused) && !(x->seq && x->seq->paused))
        drv_tick(&d);
    dreq *victim = y->seq && y->seq->paused ? y : x;
    drv_finish(&d, victim, FIN_CANCELLED);
    drv_check(&d);
    drv_run(&d, 300);
    drv_verify(&d);
    drv_free(&d);
}

/* Failed steps: the plan's requests fail, everyone else is unaffected and the scribbled KV is
 * never reused. */
static void test_step_failures(void **state)
{
    (void)state;
    drv d;
    drv_init(&d, params(VKI_POLICY_GUARANTEED_NO_EVICT, 6, 128, 4), 40, 64, -1, 7);
    int32_t t[30];
    for (uint32_t i = 0; i < 40; i++) {
        fill_tokens(t, 30, i % 3); /* shared prefixes */
        drv_add(&d, t, 12 + i % 17, 3 + i % 11);
    }
    drv_run(&d, 2000);
    uint32_t errors = 0, ok = 0;
    for (uint32_t i = 0; i < d.n; i++) {
        errors += d.r[i].finish == FIN_ERROR;
        ok += d.r[i].finish == FIN_LENGTH;
    }
    assert_true(errors > 0 && ok > 0);
    drv_verify(&d);
    drv_free(&d);
}

/* ---- sliding windows ----------------------------------------------------------------------- */

/* Runs d until idle; returns the most KV blocks in use after any tick. */
static uint32_t drv_run_peak(drv *d, uint64_t max_ticks)
{
    uint32_t peak = 0, idle = 0;
    while (idle < 2) {
        assert_true(d->ticks < max_ticks);
        idle = drv_tick(d) ? 0 : idle + 1;
        sched_stats ss;
        sched_get_stats(d->s, &ss);
        peak = ss.kv.used_blocks > peak ? ss.kv.used_blocks : peak;
    }
    return peak;
}

/* A 5,000-token generation with a 64-token window and a one-block sink holds at most the sink,
 * the window's blocks and 2 at its edges (7; it would hold 313 without the window) under every
 * policy, from a pool of 24 whose reservation bound is sink + ceil((chunk + window - 1) / block)
 * + 2 = 15; its tokens are what it produces alone. Then prefix
 * reuse with windows: a prompt whose blocks the first request left cached is reused (only the
 * blocks its window and sink need are taken), next to a request sharing it at the same time. */
static void test_window_bounds_blocks(void **state)
{
    (void)state;
    const vki_capacity_policy pols[] = {VKI_POLICY_GUARANTEED_NO_EVICT, VKI_POLICY_MAX_UTILIZATION, VKI_POLICY_STATIC};
    for (int k = 0; k < 3; k++) {
        drv d;
        sched_params p = params(pols[k], 4, 24, 16);
        p.max_ctx = 8192;
        p.kv_window = 64;
        p.kv_sink = 16;
        drv_init(&d, p, 8, 64, -1, 0);
        int32_t prompt[200];
        fill_tokens(prompt, 200, 3);
        drv_add(&d, prompt, 40, 5000);
        uint32_t peak = drv_run_peak(&d, 20000), bound = 1 + (128 + 64 - 1 + 15) / 16 + 2;
        assert_true(peak <= bound);
        assert_true(peak <= 1 + 64 / 16 + 2); /* decoding: the sink, the window's 4 blocks, 2 at its edges */
        /* the same prompt again, longer: its cached blocks come back; with a second request on
         * the same prefix running beside it */
        drv_add(&d, prompt, 200, 300);
        drv_add(&d, prompt, 150, 200);
        uint32_t peak2 = drv_run_peak(&d, 20000);
        sched_stats ss;
        sched_get_stats(d.s, &ss);
        fprintf(stderr, "  policy %d: 5000 tokens held at most %u blocks (bound %u); reuse: %u blocks with two, "
                "%llu tokens reused\n", (int)pols[k], peak, bound, peak2, (unsigned long long)ss.reused_tokens);
        assert_int_equal(ss.reused_tokens, 32); /* blocks 0 and 1: block 2 holds generated tokens */
        drv_verify(&d);
        drv_free(&d);
    }
}

/* ---- randomized stress ------------------------------------------------------------------- */

static void stress(vki_capacity_policy pol, const char *name)
{
    vt_rng rng = vt_rng_seeded(name);
    uint32_t n_req = 3000;
    drv d;
    sched_params p = params(pol, 16, 64, 4); /* tiny pool: 256 tokens of KV */
    p.max_num_tokens = 64;
    p.chunk_size = 16;
    p.max_batch_size = 12;
    p.max_queue = 200;
    p.block_reuse = vt_range(&rng, 0, 3) != 0;
    if (vt_range(&rng, 0, 1)) { /* sliding windows: blocks released while sequences run */
        p.kv_window = vt_range(&rng, 2, 40); /* the fake engine needs to see the previous token */
        p.kv_sink = vt_range(&rng, 0, 1) ? p.block_size : 0;
    }
    drv_init(&d, p, n_req, 40, 0, vt_range(&rng, 0, 1) ? 0 : 97);
    d.beam_rng = &rng;
    uint32_t beams = 0;
    int32_t prefixes[4][64];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 64; j++)
            prefixes[i][j] = (int32_t)vt_range(&rng, 1, 39);
    uint32_t refused = 0;
    while (d.n < n_req) {
        /* random arrivals, and now and then a burst that overflows the queue bound */
        uint32_t arrivals = vt_range(&rng, 0, 31) == 0 ? vt_range(&rng, 1, 12) : 0;
        if (vt_range(&rng, 0, 999) == 0)
            arrivals = vt_range(&rng, 100, 300);
        for (uint32_t a = 0; a < arrivals && d.n < n_req; a++) {
            int32_t t[64];
            uint32_t n = vt_range(&rng, 1, 64), shared = vt_range(&rng, 0, 1) ? vt_range(&rng, 0, 64) : 0;
            const int32_t *pre = prefixes[vt_range(&rng, 0, 3)];
            for (uint32_t i = 0; i < n; i++)
                t[i] = i < shared ? pre[i] : (int32_t)vt_range(&rng, 1, 39);
            uint32_t max_new = vt_range(&rng, 1, 64);
            vki_status expect = sched_queue_len(d.s) >= 200 ? VKI_RETRY_QUEUE_FULL : VKI_OK;
            /* one request in 8 a beam group, where its whole KV fits the pool; STATIC and windows
             * refuse beams */
            d.beam_width = vt_range(&rng, 0, 7) == 0 ? vt_range(&rng, 2, 4) : 0;
            if (d.beam_width && d.beam_width * ((n + max_new - 1 + 3) / 4) > p.n_blocks)
                d.beam_width = 0;
            if (d.beam_width && (pol == VKI_POLICY_STATIC || p.kv_window))
                expect = VKI_ERR_INVALID_ARG;
            refused += expect != VKI_OK;
            beams += d.beam_width && expect == VKI_OK;
            drv_add_ex(&d, t, n, max_new, (int32_t)vt_range(&rng, 0, 2), vt_range(&rng, 0, 1), vt_u64(&rng), expect);
            d.beam_width = 0;
        }
        if (vt_range(&rng, 0, 9) == 0 && d.n) { /* cancel a random live request */
            dreq *r = &d.r[vt_range(&rng, 0, d.n - 1)];
            if (r->seq)
                drv_finish(&d, r, FIN_CANCELLED);
        }
        drv_tick(&d);
        assert_true(d.ticks < 200000);
    }
    drv_run(&d, d.ticks + 10000);
    drv_verify(&d);
    uint32_t why[5] = {0};
    for (uint32_t i = 0; i < d.n; i++)
        why[d.r[i].finish]++;
    fprintf(stderr, "%s: finished eos %u, length %u, cancelled %u, error %u\n", name, why[FIN_EOS], why[FIN_LENGTH],
            why[FIN_CANCELLED], why[FIN_ERROR]);
    sched_stats ss;
    sched_get_stats(d.s, &ss);
    fprintf(stderr, "%s: %u requests (%u refused: queue full), %llu ticks, reuse %d, window %u sink %u, %llu pauses, "
            "%llu reused tokens, max running %u\n", name, d.n, refused, (unsigned long long)d.ticks, p.block_reuse,
            p.kv_window, p.kv_sink, (unsigned long long)ss.pauses, (unsigned long long)ss.reused_tokens,
            d.max_running_seen);
    fprintf(stderr, "%s: %u beam groups, %llu reorders, %llu page copies\n", name, beams,
            (unsigned long long)d.reorders, (unsigned long long)d.copies);
    if (pol != VKI_POLICY_STATIC && !p.kv_window)
        assert_true(beams > 0 && d.reorders > 0 && d.copies > 0);
    if (pol == VKI_POLICY_MAX_UTILIZATION && !p.kv_window) /* windows keep little KV: pool pressure may never come */
        assert_true(ss.pauses > 0);
    else if (pol != VKI_POLICY_MAX_UTILIZATION)
        assert_int_equal(ss.pauses, 0);
    drv_free(&d);
}

static void test_stress_no_evict(void **state) { (void)state; stress(VKI_POLICY_GUARANTEED_NO_EVICT, "stress_no_evict"); }
static void test_stress_max_util(void **state) { (void)state; stress(VKI_POLICY_MAX_UTILIZATION, "stress_max_util"); }
static void test_stress_static(void **state) { (void)state; stress(VKI_POLICY_STATIC, "stress_static"); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_request),
        cmocka_unit_test(test_end_id_stops),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_queue_bound),
        cmocka_unit_test(test_slots_and_batch_limit),
        cmocka_unit_test(test_chunked_prefill_budget),
        cmocka_unit_test(test_priority_fifo),
        cmocka_unit_test(test_no_evict_reserves),
        cmocka_unit_test(test_max_util_pause_resume),
        cmocka_unit_test(test_static_batches),
        cmocka_unit_test(test_static_lockstep),
        cmocka_unit_test(test_static_pads_to_longest),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_concurrent_same_prefix),
        cmocka_unit_test(test_reuse_disabled),
        cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_cancel_every_state),
        cmocka_unit_test(test_step_failures),
        cmocka_unit_test(test_window_bounds_blocks),
        cmocka_unit_test(test_stress_no_evict),
        cmocka_unit_test(test_stress_max_util),
        cmocka_unit_test(test_stress_static),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
