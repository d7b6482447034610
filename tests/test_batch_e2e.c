/* The batch manager on the real engine (stories260K on the Vulkan device, validation layer on):
 * 32 prompts arriving at random ticks through the TensorRT-LLM-style callbacks, greedy; every
 * output must equal what that prompt generates alone, under each capacity policy, and with a KV
 * pool small enough that MAX_UTILIZATION has to pause and resume requests. Sampled requests
 * (temperature > 0, fixed seeds) must give the same tokens alone, inside a batch of 16 others
 * and across forced pauses. */
#include "support/ref_model.h"
#include "support/vt.h"
#include "engine/rng.h"

#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "vkinfer.h"

#define N_REQ 32
#define MAX_OUT 24

typedef struct e2e_req {
    int32_t prompt[96];
    uint32_t n_prompt, max_new;
    vki_sampling_params sampling;
    int32_t out[MAX_OUT];
    uint32_t n_out, n_final;
    vki_finish_reason finish;
} e2e_req;

typedef struct e2e {
    vki_engine *e;       /* the engine of the current run: big or small */
    vki_engine *big;     /* KV for every request at once */
    vki_engine *small;   /* 24 pages of 16 tokens: fewer run at once, MAX_UTILIZATION pauses */
    e2e_req r[N_REQ];
    uint32_t n_req;
    /* a run */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t next;       /* requests not yet handed to get_requests start here */
    uint32_t n_final;
    uint64_t rng;
    uint64_t pauses, ticks, max_generating;
    bool all_at_once;    /* get_requests hands out every request on its first call */
    uint32_t budget;     /* max_num_tokens of the run (chunk = budget / 2) */
    atomic_int validation_msgs;
    char path[512];      /* the model file (the CPU reference reads it too) */
} e2e;

static void count_validation(void *user, vki_log_level lvl, const char *msg)
{
    e2e *x = user;
    if (lvl <= VKI_LOG_WARN && !strncmp(msg, "validation", 10))
        atomic_fetch_add(&x->validation_msgs, 1);
    if (lvl <= VKI_LOG_WARN)
        fprintf(stderr, "[vkinfer] %s\n", msg);
}

static vki_request make_req(const e2e *x, uint32_t i)
{
    return (vki_request){.id = 1000 + i, .prompt = x->r[i].prompt, .n_prompt = x->r[i].n_prompt,
                         .max_new_tokens = x->r[i].max_new, .sampling = x->r[i].sampling, .ignore_eos = true};
}

/* Worker thread, every tick: 0..3 of the remaining requests arrive. */
static void get_requests(void *user, int32_t max, vki_request_list *sink)
{
    e2e *x = user;
    uint32_t k = x->all_at_once ? x->n_req : (uint32_t)(vki_splitmix64(&x->rng) % 4);
    for (uint32_t j = 0; j < k && x->next < x->n_req && (max < 0 || (int32_t)j < max); j++) {
        vki_request req = make_req(x, x->next);
        assert_int_equal(vki_request_list_add(sink, &req), VKI_OK);
        x->next++;
    }
}

static void on_response(void *user, const vki_response *r)
{
    e2e *x = user;
    e2e_req *q = &x->r[r->id - 1000];
    for (uint32_t i = 0; i < r->n_tokens && q->n_out < MAX_OUT; i++)
        q->out[q->n_out++] = r->tokens[i];
    if (!r->final)
        return;
    if (r->error)
        fprintf(stderr, "request %llu failed: %s\n", (unsigned long long)r->id, r->error);
    pthread_mutex_lock(&x->mu);
    q->finish = r->finish;
    q->n_final++;
    x->n_final++;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

static void on_stats(void *user, const char *json)
{
    e2e *x = user;
    cJSON *o = cJSON_Parse(json);
    cJSON *p = o ? cJSON_GetObjectItem(o, "Paused Requests") : NULL;
    cJSON *g = o ? cJSON_GetObjectItem(o, "Generation Requests") : NULL;
    if (p)
        x->pauses += (uint64_t)p->valuedouble;
    if (g && g->valuedouble > x->max_generating)
        x->max_generating = (uint64_t)g->valuedouble;
    x->ticks++;
    cJSON_Delete(o);
}

static void wait_all(e2e *x, uint32_t n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 600;
    pthread_mutex_lock(&x->mu);
    while (x->n_final < n)
        if (pthread_cond_timedwait(&x->cv, &x->mu, &until))
            break;
    uint32_t got = x->n_final;
    pthread_mutex_unlock(&x->mu);
    if (got < n)
        fail_msg("only %u of %u final responses within 10 minutes", got, n);
}

static void reset_outputs(e2e *x)
{
    for (uint32_t i = 0; i < x->n_req; i++)
        x->r[i].n_out = x->r[i].n_final = 0;
    x->next = x->n_final = 0;
    x->pauses = x->ticks = x->max_generating = 0;
}

/* Each request alone (the reference outputs). */
static void run_solo(e2e *x, int32_t (*ref)[MAX_OUT])
{
    vki_batch_params bp = vki_batch_default_params();
    vki_batch_manager *bm;
    assert_int_equal(vki_batch_manager_create(x->e, &bp, NULL, &bm), VKI_OK);
    reset_outputs(x);
    for (uint32_t i = 0; i < x->n_req; i++) {
        vki_request req = make_req(x, i);
        char err[256];
        assert_int_equal(vki_batch_submit(bm, &req, on_response, x, err, sizeof err), VKI_OK);
        wait_all(x, i + 1);
        assert_int_equal(x->r[i].n_out, x->r[i].max_new);
        memcpy(ref[i], x->r[i].out, sizeof ref[i]);
    }
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
}

/* All requests through get_requests at random ticks; outputs compared with ref. */
static void run_batched(e2e *x, vki_capacity_policy policy, uint32_t max_batch, int32_t (*ref)[MAX_OUT],
                        const char *label)
{
    vki_batch_params bp = vki_batch_default_params();
    bp.policy = policy;
    bp.max_batch_size = max_batch;
    bp.max_num_tokens = x->budget; /* prompts are chunked across ticks */
    bp.chunk_size = x->budget / 2;
    bp.idle_poll_us = 200;
    vki_batch_callbacks cb = {.user = x, .get_requests = get_requests, .send_response = on_response,
                              .stats = on_stats};
    reset_outputs(x);
    x->rng = 0x5eed ^ (uint64_t)policy;
    vki_batch_manager *bm;
    assert_int_equal(vki_batch_manager_create(x->e, &bp, &cb, &bm), VKI_OK);
    wait_all(x, x->n_req);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    for (uint32_t i = 0; i < x->n_req; i++) {
        const e2e_req *q = &x->r[i];
        assert_int_equal(q->n_final, 1);
        assert_int_equal(q->finish, VKI_FINISH_LENGTH);
        assert_int_equal(q->n_out, q->max_new);
        for (uint32_t k = 0; k < q->n_out; k++)
            if (q->out[k] != ref[i][k])
                fail_msg("%s: request %u token %u: %d batched, %d alone", label, i, k, q->out[k], ref[i][k]);
    }
    fprintf(stderr, "  %-34s %u requests identical to solo, %llu ticks, up to %llu generating at once, "
            "%llu pauses\n", label, x->n_req, (unsigned long long)x->ticks, (unsigned long long)x->max_generating,
            (unsigned long long)x->pauses);
}

static vki_status open_engine(e2e *x, const char *path, uint64_t kv_tokens, vki_engine **out)
{
    vki_engine_params p = vki_engine_default_params();
    p.device.validation = true;
    p.device.log = count_validation;
    p.device.log_user = x;
    p.kv_tokens = kv_tokens;
    p.max_seqs = 24;
    p.max_tokens = 1024;
    /* equality with the solo run must not hinge on last-bit rounding: bitwise batch invariance */
    p.batch_invariant = true;
    char err[512];
    vki_status st = vki_engine_create(path, &p, out, err, sizeof err);
    if (st != VKI_OK)
        fprintf(stderr, "FAIL: engine: %s\n", err);
    return st;
}

static int setup(void **state)
{
    char path[512];
    *state = NULL;
    if (!vt_shared_model("stories260K.gguf", path, sizeof path)) {
        fprintf(stderr, "SKIP: ../shared/models/stories260K.gguf is absent\n");
        return 0;
    }
    vt_pin_vulkan_libraries();
    e2e *x = calloc(1, sizeof *x);
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    snprintf(x->path, sizeof x->path, "%s", path);
    if (open_engine(x, path, 4096, &x->big) != VKI_OK || open_engine(x, path, 24 * 16, &x->small) != VKI_OK) {
        vki_engine_destroy(x->big);
        free(x);
        return -1;
    }
    vt_rng r = {0x1234};
    x->n_req = N_REQ;
    x->budget = 64;
    for (uint32_t i = 0; i < N_REQ; i++) {
        e2e_req *q = &x->r[i];
        q->n_prompt = vt_range(&r, 4, 72);
        q->prompt[0] = 1;
        for (uint32_t k = 1; k < q->n_prompt; k++)
            q->prompt[k] = (int32_t)vt_range(&r, 259, 511);
        q->max_new = vt_range(&r, 6, MAX_OUT);
        q->sampling = vki_sampling_default_params();
        q->sampling.temperature = 0;
    }
    *state = x;
    return 0;
}

static int teardown(void **state)
{
    e2e *x = *state;
    if (!x)
        return 0;
    vki_engine_destroy(x->big);
    vki_engine_destroy(x->small);
    int msgs = atomic_load(&x->validation_msgs);
    free(x);
    if (msgs)
        fprintf(stderr, "FAIL: %d validation messages\n", msgs);
    return msgs ? -1 : 0;
}

static e2e *get(void **state)
{
    if (!*state)
        skip();
    return *state;
}

static void test_greedy_batched_equals_solo_every_policy(void **state)
{
    e2e *x = get(state);
    int32_t(*ref)[MAX_OUT] = calloc(N_REQ, sizeof *ref);
    x->e = x->big;
    run_solo(x, ref);
    run_batched(x, VKI_POLICY_GUARANTEED_NO_EVICT, 0, ref, "guaranteed-no-evict");
    run_batched(x, VKI_POLICY_MAX_UTILIZATION, 0, ref, "max-utilization");
    run_batched(x, VKI_POLICY_STATIC, 6, ref, "static (batches of 6)");
    x->e = x->small; /* the same answers from an engine whose pool forces pauses */
    run_batched(x, VKI_POLICY_MAX_UTILIZATION, 0, ref, "max-utilization, 24-page pool");
    assert_true(x->pauses > 0);
    run_batched(x, VKI_POLICY_GUARANTEED_NO_EVICT, 0, ref, "guaranteed-no-evict, 24-page pool");
    free(ref);
}

/* Sampling with seeds: the same tokens alone, inside a batch of 16 others, and across pauses. */
static void test_seeded_sampling_independent_of_batch(void **state)
{
    e2e *x = get(state);
    for (uint32_t i = 0; i < N_REQ; i++) {
        vki_sampling_params *s = &x->r[i].sampling;
        s->temperature = 0.9f;
        s->top_k = 40;
        s->top_p = 0.95f;
        s->has_seed = true;
        s->seed = 77 + i;
    }
    int32_t(*ref)[MAX_OUT] = calloc(N_REQ, sizeof *ref);
    uint32_t n = x->n_req;
    x->n_req = 17;
    x->e = x->big;
    run_solo(x, ref);
    /* all 17 arrive together and prefill in one step, so each decodes among 16 others */
    x->all_at_once = true;
    x->budget = 1024;
    run_batched(x, VKI_POLICY_GUARANTEED_NO_EVICT, 0, ref, "seeded sampling, batch of 17");
    assert_true(x->max_generating >= 17);
    x->all_at_once = false;
    x->budget = 64;
    x->e = x->small;
    run_batched(x, VKI_POLICY_MAX_UTILIZATION, 0, ref, "seeded sampling, pauses");
    assert_true(x->pauses > 0);
    x->n_req = n;
    free(ref);
}

/* A logits post-processor forces token 260 + (tokens so far % 5); a request without one running
 * in the same steps keeps its solo output (its row never leaves the GPU). */
typedef struct proc_state {
    uint32_t calls, bad_len;
    uint32_t n_prompt;
} proc_state;

static void force_token(void *user, uint64_t id, float *logits, uint32_t n_vocab, const int32_t *tokens,
                        uint32_t n_tokens)
{
    proc_state *p = user;
    (void)tokens;
    if (id != 1000 || n_tokens != p->n_prompt + p->calls)
        p->bad_len++;
    p->calls++;
    uint32_t want = 260 + n_tokens % 5;
    for (uint32_t v = 0; v < n_vocab; v++)
        logits[v] = v == want ? 0.0f : -INFINITY;
}

static void test_logits_processor(void **state)
{
    e2e *x = get(state);
    x->e = x->big;
    int32_t(*ref)[MAX_OUT] = calloc(N_REQ, sizeof *ref);
    uint32_t n = x->n_req;
    x->n_req = 2;
    for (uint32_t i = 0; i < 2; i++) {
        x->r[i].sampling = vki_sampling_default_params();
        x->r[i].sampling.temperature = i ? 0.0f : 0.8f; /* the forced one samples: still forced */
        x->r[i].sampling.logprobs = true;
    }
    run_solo(x, ref); /* request 1's solo output */
    vki_batch_params bp = vki_batch_default_params();
    vki_batch_manager *bm;
    assert_int_equal(vki_batch_manager_create(x->e, &bp, NULL, &bm), VKI_OK);
    reset_outputs(x);
    proc_state ps = {.n_prompt = x->r[0].n_prompt};
    char err[256];
    for (uint32_t i = 0; i < 2; i++) {
        vki_request req = make_req(x, i);
        if (i == 0) {
            req.logits_processor = force_token;
            req.logits_processor_user = &ps;
        }
        assert_int_equal(vki_batch_submit(bm, &req, on_response, x, err, sizeof err), VKI_OK);
    }
    wait_all(x, 2);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    assert_int_equal(ps.calls, x->r[0].max_new);
    assert_int_equal(ps.bad_len, 0);
    for (uint32_t k = 0; k < x->r[0].n_out; k++)
        assert_int_equal(x->r[0].out[k], 260 + (x->r[0].n_prompt + k) % 5);
    assert_memory_equal(x->r[1].out, ref[1], x->r[1].max_new * sizeof(int32_t));
    x->n_req = n;
    free(ref);
}

/* Embedding requests: the pooled final hidden state equals the CPU reference's (mean over every
 * prompt position, or the last), computed in chunks next to a generation request, with no token
 * generated. */
typedef struct emb_got {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int finals;
    float vec[2][512];
    uint32_t n_embd[2], n_tokens[2];
    vki_finish_reason finish[2];
} emb_got;

static void emb_response(void *user, const vki_response *r)
{
    emb_got *g = user;
    if (!r->final || r->id > 1)
        return;
    pthread_mutex_lock(&g->mu);
    uint32_t i = (uint32_t)r->id;
    g->n_embd[i] = r->n_embd;
    g->n_tokens[i] = r->n_tokens;
    g->finish[i] = r->finish;
    if (r->embedding && r->n_embd <= 512)
        memcpy(g->vec[i], r->embedding, r->n_embd * sizeof(float));
    g->finals++;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void unit(float *v, const double *sum, uint32_t d, double scale)
{
    double n = 0;
    for (uint32_t i = 0; i < d; i++)
        n += sum[i] * scale * sum[i] * scale;
    for (uint32_t i = 0; i < d; i++)
        v[i] = (float)(sum[i] * scale / sqrt(n));
}

static void test_embeddings(void **state)
{
    e2e *x = get(state);
    const e2e_req *q = &x->r[0];
    for (uint32_t i = 0; i < N_REQ; i++)
        if (x->r[i].n_prompt > q->n_prompt)
            q = &x->r[i];
    ref_model *rm;
    char err[256];
    assert_int_equal(ref_model_load(x->path, true, &rm, err, sizeof err), VKI_OK);
    uint32_t d = ref_model_hparams(rm)->d_model, n = q->n_prompt;
    assert_true(d <= 512 && n > 32);
    float *hidden = calloc((size_t)n * d, sizeof *hidden), want[2][512];
    assert_int_equal(ref_model_hidden(rm, q->prompt, n, hidden), VKI_OK);
    ref_model_free(rm);
    double sum[512] = {0}, last[512];
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < d; i++)
            sum[i] += hidden[(size_t)t * d + i];
    for (uint32_t i = 0; i < d; i++)
        last[i] = hidden[(size_t)(n - 1) * d + i];
    unit(want[0], sum, d, 1.0 / n);
    unit(want[1], last, d, 1.0);
    free(hidden);
    /* chunks of 16: the pooled rows come from several steps */
    vki_batch_params bp = vki_batch_default_params();
    bp.chunk_size = 16;
    bp.max_num_tokens = 24;
    vki_batch_manager *bm;
    assert_int_equal(vki_batch_manager_create(x->big, &bp, NULL, &bm), VKI_OK);
    emb_got g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    vki_request gen = {.id = 7, .prompt = q->prompt, .n_prompt = n, .max_new_tokens = 8,
                       .sampling = vki_sampling_default_params()};
    assert_int_equal(vki_batch_submit(bm, &gen, emb_response, &g, err, sizeof err), VKI_OK);
    for (uint32_t k = 0; k < 2; k++) {
        vki_request r = {.id = k, .prompt = q->prompt, .n_prompt = n, .max_new_tokens = 1,
                         .pooling = k ? VKI_POOL_LAST : VKI_POOL_MEAN, .sampling = vki_sampling_default_params()};
        assert_int_equal(vki_batch_submit(bm, &r, emb_response, &g, err, sizeof err), VKI_OK);
    }
    pthread_mutex_lock(&g.mu);
    while (g.finals < 2)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    for (uint32_t k = 0; k < 2; k++) {
        assert_int_equal(g.finish[k], VKI_FINISH_LENGTH);
        assert_int_equal(g.n_tokens[k], 0);
        assert_int_equal(g.n_embd[k], d);
        double e = vt_nmse(g.vec[k], want[k], d);
        printf("embedding (%s pooling, %u tokens in chunks of 16): NMSE %.2e vs the CPU reference\n",
               k ? "last" : "mean", n, e);
        assert_true(e <= 1e-6); /* achieved 3.8e-9 (mean) and 1.9e-8 (last) with F16 KV */
    }
    assert_int_equal(atomic_load(&x->validation_msgs), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_batched_equals_solo_every_policy),
        cmocka_unit_test(test_seeded_sampling_independent_of_batch),
        cmocka_unit_test(test_logits_processor),
        cmocka_unit_test(test_embeddings),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
