/* Beam search's lineage outputs (host/batch/batch_beam.c) over the fake engine, in milliseconds:
 *  - the in-place gather of generation rows on random mappings (fan-out, cycles, sizes 1, 7, ...);
 *  - logprobs, top_logprobs and generation logits of every returned beam follow its lineage: the
 *    fake's sampled row holds each token's logprob at the token's id (and -100 elsewhere), so
 *    row k of beam b must hold lp[b][k] at tokens[b][k] and each alternative's logprob at its id;
 *    the logprobs sum to the beam's cum_logprob; streamed responses carry the best beam's whole;
 *    cancelled searches too; and no KV block is left behind;
 *  - the memory cap counts every beam's rows and the history, to the byte.
 * The GPU equivalent against the CPU reference is test_beam. Seeded: VKI_TEST_SEED. */
#include <pthread.h>
#include <stdarg.h>

#include "support/fake_engine.h"
#include "support/vt.h"

#include "host/batch/batch.h"

#define VOCAB 48
#define N_REQ 24
#define MAX_NEW 12

/* ---- bm_gather_rows ----------------------------------------------------------------------------- */

static void test_gather_rows(void **state)
{
    (void)state;
    vt_rng rng = vt_rng_seeded("batch_beam gather");
    enum { MAXS = 64, V = 7 };
    float rows[MAXS * V], orig[MAXS * V], spare[V];
    uint32_t src[MAXS], scratch[3 * MAXS];
    uint8_t done[MAXS];
    uint32_t cycles = 0;
    for (uint32_t it = 0; it < 400; it++) {
        uint32_t n_slots = it < 3 ? (uint32_t[]){1, 7, 17}[it] : vt_range(&rng, 1, MAXS);
        uint32_t n_dst = vt_range(&rng, 1, n_slots), kind = it % 3;
        for (uint32_t d = 0; d < n_dst; d++) /* 0: any rows; 1: a permutation (cycles); 2: fan-out of few */
            src[d] = kind == 0 ? vt_range(&rng, 0, n_slots - 1) : kind == 1 ? d : vt_range(&rng, 0, 2) % n_slots;
        for (uint32_t d = n_dst; kind == 1 && d-- > 1;) { /* Fisher-Yates over the first n_dst */
            uint32_t e = vt_range(&rng, 0, d), t = src[d];
            src[d] = src[e];
            src[e] = t;
        }
        for (uint32_t d = 0; kind == 1 && d < n_dst; d++)
            cycles += src[d] != d;
        for (uint32_t i = 0; i < n_slots * V; i++)
            orig[i] = rows[i] = (float)i;
        bm_gather_rows(rows, V, src, n_dst, n_slots, spare, scratch, done);
        for (uint32_t d = 0; d < n_dst; d++)
            if (memcmp(rows + d * V, orig + src[d] * V, V * sizeof *rows))
                fail_msg("iteration %u: slot %u of %u (%u slots) is not a copy of slot %u", it, d, n_dst, n_slots,
                         src[d]);
    }
    assert_true(cycles > 0);
}

/* ---- lineage over the fake engine ------------------------------------------------------------- */

typedef struct seen {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t n_final, n_beams, n_rows_checked, n_streamed, n_cancelled;
    uint32_t kv_used;           /* the last tick's (worker thread; read after destroy) */
    vki_batch_manager *bm;      /* cancels request `cancel_id` at its second streamed response */
    uint64_t cancel_id;
    uint32_t cancelled_beams;   /* the beams its final response carried */
    char bad[256];
} seen;

static void flag(seen *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void flag(seen *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!s->bad[0])
        vsnprintf(s->bad, sizeof s->bad, fmt, ap);
    va_end(ap);
}

/* Beam b of a final response: its rows, logprobs and alternatives agree (lineage), its logprobs
 * sum to its cum_logprob. Under s->mu. */
static void check_beam(seen *s, const vki_response *r, uint32_t b)
{
    uint32_t n = r->beam_lengths[b], N = r->n_top;
    const float *lp = r->beam_logprobs[b];
    double sum = 0;
    for (uint32_t k = 0; k < n; k++) {
        sum += lp[k];
        const float *row = r->beam_generation_logits ? r->beam_generation_logits[b] + (size_t)k * VOCAB : NULL;
        if (row && row[r->beam_tokens[b][k]] != lp[k])
            flag(s, "request %llu beam %u token %u: its row is not the one it was chosen from",
                 (unsigned long long)r->id, b, k);
        for (uint32_t j = 0; row && j < N; j++) {
            int32_t t = r->beam_top_tokens[b][(size_t)k * N + j];
            if (t < 0 || row[t] != r->beam_top_logprobs[b][(size_t)k * N + j])
                flag(s, "request %llu beam %u token %u: an alternative is not from its row", (unsigned long long)r->id, b,
                     k);
        }
        s->n_rows_checked += row != NULL;
    }
    if (sum != r->beam_cum_logprobs[b])
        flag(s, "request %llu beam %u: logprobs do not sum to cum_logprob (%u tokens)", (unsigned long long)r->id, b,
             n);
}

static void on_response(void *user, const vki_response *r)
{
    seen *s = user;
    pthread_mutex_lock(&s->mu);
    if (!r->final) { /* streaming: the best beam's logprobs, whole */
        double sum = 0;
        for (uint32_t k = 0; r->logprobs && k < r->n_tokens; k++)
            sum += r->logprobs[k];
        if (!r->logprobs || sum != r->cum_logprob || r->generation_logits)
            flag(s, "request %llu: streamed logprobs of the best beam wrong (%u tokens)", (unsigned long long)r->id,
                 r->n_tokens);
        s->n_streamed++;
        bool cancel = s->bm && r->id == s->cancel_id && r->n_tokens == 2;
        pthread_mutex_unlock(&s->mu);
        if (cancel && vki_batch_cancel(s->bm, r->id) != VKI_OK)
            flag(s, "request %llu: cannot cancel it", (unsigned long long)r->id);
        return;
    }
    if (r->finish == VKI_FINISH_ERROR)
        flag(s, "request %llu failed: %s", (unsigned long long)r->id, r->error ? r->error : "?");
    s->n_cancelled += r->finish == VKI_FINISH_CANCELLED;
    if (r->id == s->cancel_id)
        s->cancelled_beams = r->finish == VKI_FINISH_CANCELLED ? r->n_beams : 0;
    if (r->n_beams && (!r->beam_logprobs || r->logprobs != r->beam_logprobs[0] ||
                       (r->beam_generation_logits && r->generation_logits != r->beam_generation_logits[0])))
        flag(s, "request %llu: the response's logprobs / logits are not the best beam's (%u beams)",
             (unsigned long long)r->id, r->n_beams);
    for (uint32_t b = 0; r->beam_logprobs && b < r->n_beams; b++)
        check_beam(s, r, b);
    s->n_beams += r->n_beams;
    s->n_final++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void on_tick(void *user, const vki_batch_stats *st) { ((seen *)user)->kv_used = st->kv_used; }

static fake_engine *mkfake(void)
{
    fake_config fc = {.max_seqs = 16, .n_pages = 96, .page_size = 4, .max_ctx = 256, .vocab = VOCAB, .eos = 0};
    fake_engine *f;
    assert_int_equal(fake_create(&fc, &f), VKI_OK);
    return f;
}

static void test_lineage(void **state)
{
    (void)state;
    vt_rng rng = vt_rng_seeded("batch_beam lineage");
    fake_engine *f = mkfake();
    bm_backend be = fake_backend(f);
    vki_batch_params p = vki_batch_default_params();
    p.chunk_size = 4;
    p.seed = 7;
    seen s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .cancel_id = 6};
    vki_batch_callbacks cb = {.user = &s, .tick_stats = on_tick};
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, &cb, &bm), VKI_OK);
    s.bm = bm; /* before the first submission: the worker reads it from then on */
    for (uint32_t i = 0; i < N_REQ; i++) {
        int32_t prompt[10];
        uint32_t n_prompt = vt_range(&rng, 1, 10);
        for (uint32_t k = 0; k < n_prompt; k++)
            prompt[k] = (int32_t)vt_range(&rng, 1, VOCAB - 1);
        vki_request r = {.id = i, .prompt = prompt, .n_prompt = n_prompt, .max_new_tokens = vt_range(&rng, 1, MAX_NEW),
                         .sampling = vki_sampling_default_params(), .beam_width = 2 + i % 3,
                         .streaming = i % 5 == 1, .return_generation_logits = i % 2 == 0,
                         .length_penalty = i % 4 ? 1.0f : 0.0f, .early_stopping = (vki_early_stopping)(i % 3)};
        r.sampling.logprobs = true;
        r.sampling.top_logprobs = i % 4; /* 0..3; the search itself asks the sampler for 2 * width */
        if (i == s.cancel_id) { /* streaming, runs to max_new unless cancelled: cancelled midway */
            r.ignore_eos = true;
            r.max_new_tokens = MAX_NEW;
        }
        char err[256];
        if (vki_batch_submit(bm, &r, on_response, &s, err, sizeof err) != VKI_OK)
            fail_msg("submit %u: %s", i, err);
        if (i == 7 || i == 16) { /* a search cancelled queued or midway (its final response has lineage
                                    too) or, on a fast worker, already finished */
            vki_status st = vki_batch_cancel(bm, i);
            assert_true(st == VKI_OK || st == VKI_ERR_NOT_FOUND);
        }
    }
    pthread_mutex_lock(&s.mu);
    while (s.n_final < N_REQ)
        pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    char msg[256];
    if (fake_violations(f, msg, sizeof msg))
        fail_msg("fake engine: %s", msg);
    if (s.bad[0])
        fail_msg("%s", s.bad);
    printf("lineage: %u beams of %u requests (%u cancelled), %u rows checked, %u streamed responses\n", s.n_beams,
           N_REQ, s.n_cancelled, s.n_rows_checked, s.n_streamed);
    assert_true(s.n_beams >= N_REQ && s.n_rows_checked > 0 && s.n_streamed > 0);
    assert_int_equal(s.cancelled_beams, 2); /* request 6 (width 2) cancelled midway: its beams as they stood */
    assert_int_equal(s.kv_used, 0); /* no block left behind */
    fake_destroy(f);
}

/* ---- the memory cap ----------------------------------------------------------------------------- */

static void test_cap(void **state)
{
    (void)state;
    fake_engine *f = mkfake();
    bm_backend be = fake_backend(f);
    enum { W = 4, NEW = 20, TOP = 2 };
    /* rows of every beam and step, the history (16 + 16 * top + 20 bytes per beam and step) and
     * one spare row: what vki_request.beam_width documents */
    uint64_t need = (uint64_t)W * NEW * VOCAB * 4 + (uint64_t)W * NEW * (16 + 16 * TOP + 20) + VOCAB * 4;
    int32_t prompt[3] = {5, 6, 7};
    seen s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    vki_request r = {.prompt = prompt, .n_prompt = 3, .max_new_tokens = NEW, .sampling = vki_sampling_default_params(),
                     .beam_width = W, .return_generation_logits = true};
    r.sampling.top_logprobs = TOP;
    vki_batch_params p = vki_batch_default_params();
    p.chunk_size = 4;
    char err[256];
    for (int fits = 0; fits < 2; fits++) {
        p.max_logits_bytes = need - !fits; /* one byte short, then exactly enough */
        vki_batch_manager *bm;
        assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
        vki_status st = vki_batch_submit(bm, &r, on_response, &s, err, sizeof err);
        if (!fits) {
            printf("refused: %s\n", err);
            assert_int_equal(st, VKI_ERR_INVALID_ARG);
            assert_non_null(strstr(err, "return_generation_logits"));
            assert_non_null(strstr(err, "beam history"));
            assert_non_null(strstr(err, "max_logits_bytes"));
        } else {
            assert_int_equal(st, VKI_OK);
        }
        assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    }
    assert_int_equal(s.n_final, 1);
    if (s.bad[0])
        fail_msg("%s", s.bad);
    /* logprobs alone: the history counts too, named by the field that asked for it */
    p.max_logits_bytes = 1000;
    r.return_generation_logits = false;
    vki_batch_manager *bm;
    assert_int_equal(bm_create(&be, &p, NULL, &bm), VKI_OK);
    assert_int_equal(vki_batch_submit(bm, &r, on_response, &s, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "sampling.logprobs"));
    assert_int_equal(vki_batch_manager_destroy(bm, false), VKI_OK);
    fake_destroy(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_lineage),
        cmocka_unit_test(test_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
