/* The sampling stage (shaders/sample.comp via engine/ops_sample.c) against the CPU reference
 * (engine/sample_ref.c), which computes the same distribution by sorting the vocabulary.
 *
 * Distribution tests: 20,480 draws per parameter set (4,096 in the quick mode of the sanitizer
 * pass; one row per draw, positions 0..N-1, one seed), compared with the exact reference
 * distribution by Pearson's chi-square. Bins are the tokens by expected count; tokens expected
 * fewer than 5 times are merged (in that order) into bins of >= 5. The threshold is the
 * chi-square critical value at p = 1e-6 for bins - 1 degrees of freedom (Wilson-Hilferty, slightly
 * conservative for df < 3), so a correct sampler fails one set in a million runs. Every draw is
 * also checked against the reference draw for the same (seed, position): they must agree
 * whenever the target lies more than 1e-6 of the mass from an interval edge (closer than that a
 * few-ulp exp() difference may move it). */
#include "support/vt.h"

#include <float.h>

#include "engine/ops_sample.h"

#define N_DRAWS 20480u
#define CHUNK 4096u /* rows per dispatch in the distribution tests */

/* ---- helpers ---------------------------------------------------------------------------------- */

/* Samples n_rows rows (row i at logits[i * stride]) on the GPU; checks that the logits come back
 * unchanged (the edits are undone). */

/* The library's defaults are greedy; these suites are about the sampled path: temperature 1 and
 * everything else as the defaults. */
static vki_sampling_params sampled_params(void)
{
    vki_sampling_params p = vki_sampling_default_params();
    p.temperature = 1.0f;
    return p;
}

static void gpu_sample(vt_gpu *g, const float *logits, uint32_t n_rows, uint32_t n_vocab, uint32_t stride,
                       const sample_req *reqs, vki_sample_out *out)
{
    op_sampler *s;
    assert_int_equal(op_sampler_create(g->dev, n_rows, n_vocab, &s), VKI_OK);
    char err[256] = "";
    vki_status st = op_sampler_pack(s, reqs, n_rows, err, sizeof err);
    if (st != VKI_OK)
        fail_msg("pack: %s", err);
    size_t bytes = ((size_t)(n_rows - 1) * stride + n_vocab) * 4, mb = op_sampler_mask_bytes(s);
    vkd_buffer *lb = vt_buf_from(g, logits, bytes, "logits"), *masks = NULL;
    if (mb) { /* the masked rows' bitsets, as the engine uploads them with the step inputs */
        void *m = malloc(mb);
        op_sampler_copy_masks(s, m);
        masks = vt_buf_from(g, m, mb, "masks");
        free(m);
    }
    vt_begin(g);
    assert_int_equal(op_sampler_record(s, &g->cmd, vkd_whole(lb), stride, masks ? vkd_whole(masks) : (vkd_view){0}),
                     VKI_OK);
    vt_submit_wait(g);
    memcpy(out, op_sampler_out(s), n_rows * sizeof *out);
    float *back = malloc(bytes);
    vt_download(g, lb, back, bytes);
    assert_memory_equal(back, logits, bytes);
    free(back);
    vkd_buffer_destroy(g->dev, lb);
    vkd_buffer_destroy(g->dev, masks);
    op_sampler_destroy(s);
}

/* The reference of one request: packs it alone and runs sample_ref_row. */
static void ref_sample(const float *logits, uint32_t n_vocab, const sample_req *r, vki_sample_out *out)
{
    char err[256] = "";
    vki_status st = sample_ref_sample(logits, n_vocab, r, out, err, sizeof err);
    if (st != VKI_OK)
        fail_msg("reference: %s", err);
}

static sample_dist ref_dist(const float *logits, uint32_t n_vocab, const sample_req *r)
{
    uint32_t cap = sample_edits_bound(r) + 1, n;
    vki_sample_edit *e = malloc(cap * sizeof *e);
    vki_sample_row row;
    char err[256];
    assert_int_equal(sample_pack_row(r, n_vocab, 0, 0, &row, e, cap, &n, err, sizeof err), VKI_OK);
    sample_dist d;
    assert_int_equal(sample_dist_build(logits, n_vocab, &row, e, r->mask, &d), VKI_OK);
    free(e);
    return d;
}

/* Chi-square critical value at upper tail p = 1e-6 (Wilson-Hilferty). */
static double chi2_crit(double df)
{
    double z = 4.753424, a = 2.0 / (9.0 * df), t = 1.0 - a + z * sqrt(a);
    return df * t * t * t;
}

static int cmp_desc_expect(const void *a, const void *b)
{
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return (x < y) - (x > y);
}

/* Pearson chi-square of per-token observations obs[] (counts, or expected counts) against
 * distribution d, in bins of d's tokens by descending probability, each closed once it expects
 * >= 5 (a tail expecting less joins the last bin); *bins their number. *var: the sum over bins of
 * n p (1 - p) / (n q), p = obs / n and q = d's share of the bin: with obs[] the expected counts of
 * another distribution, x2 + *var is the chi-square's expected value under that one. */
static double chi2_binned(const sample_dist *d, const double *obs, uint32_t n_draws, uint32_t *bins, double *var)
{
    double(*e)[2] = malloc(d->n_vocab * sizeof *e); /* {expected, observed} per token */
    double(*bin)[2] = malloc(d->n_vocab * sizeof *bin);
    uint32_t n = 0;
    *bins = 0;
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        double p = sample_dist_prob(d, i);
        if (p > 0) {
            e[n][0] = p * n_draws;
            e[n++][1] = obs[i];
        }
    }
    qsort(e, n, sizeof *e, cmp_desc_expect);
    double be = 0, bo = 0;
    for (uint32_t i = 0; i < n; i++) {
        be += e[i][0];
        bo += e[i][1];
        if (be >= 5) {
            bin[*bins][0] = be;
            bin[(*bins)++][1] = bo;
            be = bo = 0;
        }
    }
    if (be > 0 && *bins) {
        bin[*bins - 1][0] += be;
        bin[*bins - 1][1] += bo;
    } else if (be > 0) {
        bin[*bins][0] = be;
        bin[(*bins)++][1] = bo;
    }
    double x2 = 0;
    *var = 0;
    for (uint32_t i = 0; i < *bins; i++) {
        x2 += (bin[i][1] - bin[i][0]) * (bin[i][1] - bin[i][0]) / bin[i][0];
        *var += bin[i][1] * (1 - bin[i][1] / n_draws) / bin[i][0];
    }
    free(e);
    free(bin);
    return x2;
}

/* Pearson chi-square of counts against the reference distribution (a draw of a token with
 * probability 0 fails at once). Returns chi2 / critical value (> 1 fails). */
static double chi_square(const sample_dist *d, const uint32_t *counts, uint32_t n_draws, const char *label, bool check)
{
    double *obs = malloc(d->n_vocab * sizeof *obs), var;
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        if (sample_dist_prob(d, i) == 0 && counts[i] && check)
            fail_msg("%s: token %u drawn %u times, its probability is 0", label, i, counts[i]);
        obs[i] = counts[i];
    }
    uint32_t bins;
    double x2 = chi2_binned(d, obs, n_draws, &bins, &var);
    free(obs);
    if (bins < 2) {
        print_message("%-26s one bin: support check only\n", label);
        return 0;
    }
    double crit = chi2_crit(bins - 1);
    if (check)
        print_message("%-26s bins %4u  chi2 %8.2f  critical(p=1e-6) %8.2f\n", label, bins, x2, crit);
    if (x2 > crit && check)
        fail_msg("%s: chi-square %.2f > %.2f (%u bins)", label, x2, crit, bins);
    return x2 / crit;
}

/* The chi-square's expected value, over its critical value, for n_draws draws from `truth`
 * tested against `alt` (the power of a control: > 1 means the test rejects alt on average). */
static double chi2_expected_ratio(const sample_dist *alt, const sample_dist *truth, uint32_t n_draws)
{
    double *obs = malloc(truth->n_vocab * sizeof *obs), var;
    for (uint32_t i = 0; i < truth->n_vocab; i++)
        obs[i] = sample_dist_prob(truth, i) * n_draws;
    uint32_t bins;
    double x2 = chi2_binned(alt, obs, n_draws, &bins, &var);
    free(obs);
    return bins < 2 ? 0 : (x2 + var) / chi2_crit(bins - 1);
}

/* Random normal logits (scale 2) with a few -inf and NaN entries. */
static void fill_logits(vt_rng *r, float *x, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        x[i] = 2.0f * vt_normal(r);
    for (uint32_t i = 0; i < n / 100; i++) {
        x[vt_range(r, 0, n - 1)] = -INFINITY;
        if (i % 4 == 0)
            x[vt_range(r, 0, n - 1)] = NAN;
    }
}

/* A random allowed-token mask keeping about `keep` of the tokens (at least one when keep > 0). */
static uint32_t *random_mask(vt_rng *rng, uint32_t V, float keep)
{
    uint32_t words = (V + 31) / 32, *m = calloc(words, 4);
    for (uint32_t i = 0; i < V; i++)
        if (vt_uniform(rng, 0, 1) < keep)
            m[i >> 5] |= 1u << (i & 31);
    if (keep > 0)
        m[0] |= 1u; /* never empty */
    for (uint32_t i = V; i < words * 32; i++) /* bits past the vocabulary set: never read as tokens */
        m[i >> 5] |= 1u << (i & 31);
    return m;
}

static uint32_t argmax_of(const float *x, uint32_t n)
{
    uint32_t a = 0;
    for (uint32_t i = 1; i < n; i++)
        if (sample_sanitize(x[i]) > sample_sanitize(x[a]))
            a = i;
    return a;
}

/* Compares a GPU row with the reference row (token exact unless the draw was within 1e-6 of an
 * interval edge; logprobs within 2e-4 relative to max(1, |value|)). */
static void assert_row_matches(const float *logits, uint32_t n_vocab, const sample_req *r, const vki_sample_out *got,
                               const char *label)
{
    vki_sample_out want;
    ref_sample(logits, n_vocab, r, &want);
    sample_dist d = ref_dist(logits, n_vocab, r);
    double margin = 1;
    sample_dist_draw(&d, r->seed, r->position, &margin);
    sample_dist_free(&d);
    if (got->token != want.token && margin > 1e-6)
        fail_msg("%s: token %d, reference %d (margin %.3g)", label, got->token, want.token, margin);
    if (got->n_kept != want.n_kept)
        fail_msg("%s: n_kept %u, reference %u", label, got->n_kept, want.n_kept);
    if (got->nonfinite != want.nonfinite)
        fail_msg("%s: nonfinite %u, reference %u", label, got->nonfinite, want.nonfinite);
    if (got->token != want.token)
        return; /* a near-edge draw: the logprob fields differ with the token */
#define CLOSE(a, b) ((a) == (b) || fabs((double)(a) - (b)) <= 2e-4 * fmax(1.0, fabs((double)(b))))
    if (!CLOSE(got->logprob, want.logprob))
        fail_msg("%s: logprob %.7g, reference %.7g", label, got->logprob, want.logprob);
    if (got->n_top != want.n_top)
        fail_msg("%s: n_top %u, reference %u", label, got->n_top, want.n_top);
    for (uint32_t j = 0; j < want.n_top; j++)
        if (got->top_tokens[j] != want.top_tokens[j] || !CLOSE(got->top_logprobs[j], want.top_logprobs[j]))
            fail_msg("%s: alternative %u is %d (%.7g), reference %d (%.7g)", label, j, got->top_tokens[j],
                     got->top_logprobs[j], want.top_tokens[j], want.top_logprobs[j]);
#undef CLOSE
}

/* ---- CPU-only checks ------------------------------------------------------------------------ */

/* Random123's published known-answer vectors for Philox4x32-10. */
static void test_philox_kat(void **state)
{
    (void)state;
    static const uint32_t v[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
         0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        sample_philox(v[i], v[i] + 4, out);
        assert_memory_equal(out, v[i] + 6, 16);
    }
    assert_int_equal(sample_mulhi64(~0ull, ~0ull), ~0ull - 1);
    assert_int_equal(sample_mulhi64(1ull << 40, 1ull << 40), 1ull << 16);
    assert_int_equal(sample_mulhi64(0x123456789abcdefull, 0xfedcba9876543210ull), 0x121fa00ad77d742ull);
}

static void test_order_key(void **state)
{
    (void)state;
    const float v[] = {-INFINITY, -FLT_MAX, -1.0f, -FLT_MIN, 0.0f, FLT_MIN, 1.0f, FLT_MAX, INFINITY};
    for (size_t i = 0; i + 1 < sizeof v / sizeof v[0]; i++)
        assert_true(sample_key(v[i]) < sample_key(v[i + 1]));
    assert_int_equal(sample_key(-0.0f), sample_key(0.0f));
    assert_true(sample_sanitize(NAN) == -INFINITY && sample_sanitize(INFINITY) == FLT_MAX);
}

/* Penalties (llama.cpp / OpenAI semantics), the window and the bias on a hand-computed row. */
static void test_penalty_semantics(void **state)
{
    (void)state;
    const float x[8] = {2, -1, 0.5f, 3, -2, 1, 0, 4};
    const int32_t hist[5] = {0, 3, 3, 1, 7};
    const vki_logit_bias bias[3] = {{6, 1.0f}, {2, -0.5f}, {6, 0.25f}};
    vki_sampling_params p = sampled_params();
    p.temperature = 0;
    p.repetition_penalty = 2;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_window = 4; /* token 0 falls outside */
    p.logit_bias = bias;
    p.n_logit_bias = 3;
    sample_req r = {&p, 1, 0, hist, 5, NULL, false, -1};
    sample_dist d = ref_dist(x, 8, &r);
    /* 3: 3/2 - (2*0.25 + 0.5); 1: -1*2 - 0.75; 7: 4/2 - 0.75; 6: 0 + 1.25; 2: 0.5 - 0.5 */
    const float want[8] = {2, -2.75f, 0, 0.5f, -2, 1, 1.25f, 1.25f};
    assert_memory_equal(d.z, want, sizeof want);
    assert_int_equal(d.argmax, 0);
    sample_dist_free(&d);
    p.penalty_window = 5; /* token 0 penalised too: 2/2 - 0.75 = 0.25; the max is now 1.25 at 6 */
    d = ref_dist(x, 8, &r);
    assert_true(d.z[0] == 0.25f);
    assert_int_equal(d.argmax, 6);
    sample_dist_free(&d);
}

typedef struct bad_case {
    const char *field;
    void (*set)(vki_sampling_params *p);
} bad_case;

#define BAD(name, field, stmt) static void bad_##name(vki_sampling_params *p) { stmt; }
static const vki_logit_bias bad_tok[1] = {{1000, 1}}, neg_tok[1] = {{-1, 1}}, nan_bias[1] = {{3, NAN}},
                            inf_bias[1] = {{3, INFINITY}};
BAD(t_neg, "temperature", p->temperature = -0.5f)
BAD(t_nan, "temperature", p->temperature = NAN)
BAD(t_inf, "temperature", p->temperature = INFINITY)
BAD(k_neg, "top_k", p->top_k = -1)
BAD(p_zero, "top_p", p->top_p = 0)
BAD(p_big, "top_p", p->top_p = 1.5f)
BAD(p_nan, "top_p", p->top_p = NAN)
BAD(minp_neg, "min_p", p->min_p = -0.1f)
BAD(minp_big, "min_p", p->min_p = 1.1f)
BAD(minp_nan, "min_p", p->min_p = NAN)
BAD(rep_zero, "repetition_penalty", p->repetition_penalty = 0)
BAD(rep_inf, "repetition_penalty", p->repetition_penalty = INFINITY)
BAD(pres, "presence_penalty", p->presence_penalty = 3)
BAD(pres_nan, "presence_penalty", p->presence_penalty = NAN)
BAD(freq, "frequency_penalty", p->frequency_penalty = -2.5f)
BAD(bias_tok, "logit_bias", (p->logit_bias = bad_tok, p->n_logit_bias = 1))
BAD(bias_neg, "logit_bias", (p->logit_bias = neg_tok, p->n_logit_bias = 1))
BAD(bias_nan, "logit_bias", (p->logit_bias = nan_bias, p->n_logit_bias = 1))
BAD(bias_inf, "logit_bias", (p->logit_bias = inf_bias, p->n_logit_bias = 1))
BAD(bias_null, "logit_bias", (p->logit_bias = NULL, p->n_logit_bias = 2))
BAD(top_lp, "top_logprobs", p->top_logprobs = 21)

static const bad_case bad_cases[] = {
    {"temperature", bad_t_neg}, {"temperature", bad_t_nan}, {"temperature", bad_t_inf},
    {"top_k", bad_k_neg}, {"top_p", bad_p_zero}, {"top_p", bad_p_big}, {"top_p", bad_p_nan},
    {"min_p", bad_minp_neg}, {"min_p", bad_minp_big}, {"min_p", bad_minp_nan},
    {"repetition_penalty", bad_rep_zero}, {"repetition_penalty", bad_rep_inf},
    {"presence_penalty", bad_pres}, {"presence_penalty", bad_pres_nan}, {"frequency_penalty", bad_freq},
    {"logit_bias", bad_bias_tok}, {"logit_bias", bad_bias_neg}, {"logit_bias", bad_bias_nan},
    {"logit_bias", bad_bias_inf}, {"logit_bias", bad_bias_null}, {"top_logprobs", bad_top_lp},
};

static void test_params_check(void **state)
{
    (void)state;
    char err[256];
    vki_sampling_params ok = sampled_params();
    ok.top_p = 1;
    ok.min_p = 1;
    ok.top_logprobs = 20;
    assert_int_equal(sample_params_check(&ok, 1000, err, sizeof err), VKI_OK);
    static const vki_logit_bias ban[1] = {{999, -INFINITY}};
    ok.logit_bias = ban;
    ok.n_logit_bias = 1;
    assert_int_equal(sample_params_check(&ok, 1000, err, sizeof err), VKI_OK);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        vki_sampling_params p = sampled_params();
        bad_cases[i].set(&p);
        err[0] = 0;
        assert_int_equal(sample_params_check(&p, 1000, err, sizeof err), VKI_ERR_INVALID_ARG);
        if (!strstr(err, bad_cases[i].field))
            fail_msg("case %zu: message \"%s\" does not name %s", i, err, bad_cases[i].field);
    }
    /* history ids are checked at packing */
    vki_sampling_params p = sampled_params();
    p.repetition_penalty = 1.2f;
    const int32_t hist[2] = {5, 1000};
    sample_req r = {&p, 1, 0, hist, 2, NULL, false, -1};
    vki_sample_row row;
    vki_sample_edit e[4];
    uint32_t n;
    assert_int_equal(sample_pack_row(&r, 1000, 0, 0, &row, e, 4, &n, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "history"));
}

/* ---- GPU: distributions ------------------------------------------------------------------------ */

/* n_draws rows of the same logits and request at positions 0..n_draws-1. With `control`, the
 * counts are also tested against the distribution at 1.1x the temperature, which must fail:
 * the test has the power to see a 10% temperature error. */
static void run_distribution_n(vt_gpu *g, const char *label, const float *row, uint32_t V, const sample_req *proto,
                               uint32_t n_draws, bool control)
{
    uint32_t *counts = calloc(V, sizeof *counts), near_edge = 0;
    sample_dist d = ref_dist(row, V, proto);
    float *logits = malloc((size_t)CHUNK * V * 4);
    sample_req *reqs = malloc(CHUNK * sizeof *reqs);
    vki_sample_out *out = malloc(CHUNK * sizeof *out);
    for (uint32_t r = 0; r < CHUNK; r++)
        memcpy(logits + (size_t)r * V, row, V * 4);
    for (uint32_t base = 0; base < n_draws; base += CHUNK) {
        for (uint32_t r = 0; r < CHUNK; r++) {
            reqs[r] = *proto;
            reqs[r].position = base + r;
        }
        gpu_sample(g, logits, CHUNK, V, V, reqs, out);
        for (uint32_t r = 0; r < CHUNK; r++) {
            int32_t t = out[r].token;
            if (t < 0 || (uint32_t)t >= V)
                fail_msg("%s: row %u token %d", label, r, t);
            counts[t]++;
            if (out[r].n_kept != d.n_kept)
                fail_msg("%s: row %u keeps %u tokens, reference %u", label, r, out[r].n_kept, d.n_kept);
            double margin;
            int32_t want = sample_dist_draw(&d, proto->seed, base + r, &margin);
            if (t != want && margin > 1e-6)
                fail_msg("%s: position %u drew %d, reference %d (margin %.3g)", label, base + r, t, want, margin);
            near_edge += t != want;
        }
    }
    chi_square(&d, counts, n_draws, label, true);
    print_message("%-26s kept %u of %u, %u draws differ from the reference near an edge\n", "", d.n_kept, V,
                  near_edge);
    if (control && n_draws < N_DRAWS)
        print_message("%-26s quick mode: the hotter-temperature control runs with %u draws only\n", "", N_DRAWS);
    if (control && n_draws >= N_DRAWS) {
        /* The control: the same draws tested against a hotter temperature must fail. A 1.1 x
         * temperature barely moves a row whose mass sits on a few tokens (one seed's row gave an
         * expected chi-square near the critical value, and its draws passed: 0.98), so the factor
         * is the least of 1.1, 1.2, 1.3, 1.5 whose expected chi-square under the true distribution
         * is >= 1.5 x the critical value: ~6 standard deviations above it, no chance passes. */
        static const float factor[] = {1.1f, 1.2f, 1.3f, 1.5f};
        vki_sampling_params hot = *proto->params;
        sample_req r = *proto;
        r.params = &hot;
        sample_dist alt = {0};
        double expect = 0;
        float f = 0;
        for (size_t i = 0; i < sizeof factor / sizeof factor[0] && expect < 1.5; i++) {
            if (i)
                sample_dist_free(&alt);
            f = factor[i];
            hot.temperature = proto->params->temperature * f;
            alt = ref_dist(row, V, &r);
            expect = chi2_expected_ratio(&alt, &d, n_draws);
        }
        double ratio = chi_square(&alt, counts, n_draws, label, false);
        print_message("%-26s against %.1f x temperature: chi2 / critical = %.2f (expected %.2f; must be > 1)\n", "",
                      f, ratio, expect);
        assert_true(expect >= 1.5);
        assert_true(ratio > 1);
        sample_dist_free(&alt);
    }
    sample_dist_free(&d);
    free(counts);
    free(logits);
    free(reqs);
    free(out);
}

/* N_DRAWS draws; CHUNK (4,096) in the quick mode (vt_quick: the sanitizer pass), where the
 * chi-square has less power but the same 1e-6 false-failure rate, every draw is still checked
 * against the reference's, and the hotter-temperature control (which needs the power) is left
 * to the full run. */
static uint32_t draws_per_set(void) { return vt_quick() ? CHUNK : N_DRAWS; }

static void run_distribution(vt_gpu *g, const char *label, const float *row, uint32_t V, const sample_req *proto)
{
    run_distribution_n(g, label, row, V, proto, draws_per_set(), false);
}

static void test_distributions(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample distributions");
    enum { V = 1000 }; /* not a multiple of the workgroup size (64) */
    float row[V];
    fill_logits(&rng, row, V);
    uint32_t top = argmax_of(row, V);
    int32_t hist[40];
    for (int i = 0; i < 40; i++) /* the penalties hit likely tokens, some several times */
        hist[i] = i % 3 ? (int32_t)top : (int32_t)((top + 1 + i * 7) % V);
    const vki_logit_bias bias[5] = {{(int32_t)top, -INFINITY}, {3, 4}, {500, 4.5f}, {999, 5}, {7, -2}};
    sample_req r = {NULL, vt_u64(&rng), 0, hist, 40, NULL, false, -1};
    struct {
        const char *label;
        float t, top_p, min_p, rep, pres, freq;
        int32_t top_k;
        bool bias;
    } cases[] = {
        {"temperature 1", 1, 1, 0, 1, 0, 0, 0, false}, /* with the hotter-temperature control */
        {"temperature 0.6", 0.6f, 1, 0, 1, 0, 0, 0, false},
        {"top_k 12", 1, 1, 0, 1, 0, 0, 12, false},
        {"top_p 0.7", 1.2f, 0.7f, 0, 1, 0, 0, 0, false},
        {"min_p 0.08", 0.9f, 1, 0.08f, 1, 0, 0, 0, false},
        {"penalties", 1, 1, 0, 1.3f, 0.4f, 0.3f, 0, false},
        {"logit bias", 1, 1, 0, 1, 0, 0, 0, true},
        {"combo k50 p0.9 minp .02", 1.4f, 0.9f, 0.02f, 1.2f, 0.2f, 0.1f, 50, true},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        vki_sampling_params p = sampled_params();
        p.temperature = cases[c].t;
        p.top_p = cases[c].top_p;
        p.min_p = cases[c].min_p;
        p.top_k = cases[c].top_k;
        p.repetition_penalty = cases[c].rep;
        p.presence_penalty = cases[c].pres;
        p.frequency_penalty = cases[c].freq;
        p.logit_bias = cases[c].bias ? bias : NULL;
        p.n_logit_bias = cases[c].bias ? 5 : 0;
        r.params = &p;
        run_distribution_n(g, cases[c].label, row, V, &r, draws_per_set(), c == 0);
    }
    /* a grammar's mask keeping 40% of the tokens, with and without cuts */
    uint32_t *mask = random_mask(&rng, V, 0.4f);
    vki_sampling_params p = sampled_params();
    r.params = &p;
    r.mask = mask;
    run_distribution(g, "mask 40%", row, V, &r);
    p.temperature = 1.4f, p.top_k = 50, p.top_p = 0.9f, p.min_p = 0.02f;
    run_distribution(g, "mask 40% k50 p0.9 minp .02", row, V, &r);
    free(mask);
    vt_assert_clean(g);
}

/* Runs of equal logits at the cut: exactly k survive top-k (the lowest ids), and top-p takes the
 * lowest-id members of the run until the mass is reached. */
static void test_tie_cuts(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    enum { V = 700 };
    float row[V];
    for (uint32_t i = 0; i < V; i++)
        row[i] = -5.0f - (float)(i % 13);
    for (uint32_t i = 0; i < 30; i++)
        row[(i * 37 + 11) % V] = 2.0f; /* 30 tied maxima, scattered */
    row[690] = 3.0f;                   /* one above them */
    vki_sampling_params p = sampled_params();
    sample_req r = {&p, 0x5eed, 0, NULL, 0, NULL, false, -1};
    p.top_k = 10; /* 690 and the 9 lowest-id tied tokens */
    sample_dist d = ref_dist(row, V, &r);
    assert_int_equal(d.n_kept, 10);
    uint32_t tied_in = 0;
    for (uint32_t i = 0; i < V; i++)
        tied_in += row[i] == 2.0f && d.w[i];
    assert_int_equal(tied_in, 9);
    sample_dist_free(&d);
    run_distribution(g, "top_k 10 inside a tie", row, V, &r);
    p.top_k = 0;
    p.top_p = 0.5f;
    run_distribution(g, "top_p 0.5 inside a tie", row, V, &r);
    p.top_p = 1;
    p.top_k = 5;
    p.temperature = 0.5f;
    for (uint32_t i = 0; i < V; i++)
        row[i] = 1.0f; /* all equal: ids 0..4 */
    run_distribution(g, "top_k 5 all equal", row, V, &r);
    vt_assert_clean(g);
}

/* ---- GPU: boundaries ---------------------------------------------------------------------------- */

/* top_k = 1 is the argmax at any temperature; top_p = 1 keeps every finite token; min_p = 1 keeps
 * only the (tied) maxima; greedy ties go to the lowest id, after penalties and bias. */
static void test_boundaries(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample boundaries");
    enum { V = 777, R = 8 };
    float *x = malloc((size_t)R * V * 4);
    vki_sampling_params p[R];
    sample_req r[R];
    vki_sample_out out[R];
    for (uint32_t i = 0; i < R; i++) {
        fill_logits(&rng, x + i * V, V);
        p[i] = sampled_params();
        r[i] = (sample_req){&p[i], vt_u64(&rng), vt_range(&rng, 0, 100000), NULL, 0, NULL, false, -1};
    }
    p[0].top_k = 1;
    p[0].temperature = 4.0f;
    p[1].top_k = 1;
    p[1].temperature = 0.05f;
    p[2].top_p = 1.0f;
    float *m = x + 3 * V; /* min_p = 1 with three tied maxima */
    m[10] = m[400] = m[776] = 50.0f;
    p[3].min_p = 1.0f;
    float *t = x + 4 * V; /* greedy ties: 5, 17 and 200 share the max */
    t[5] = t[17] = t[200] = 40.0f;
    p[4].temperature = 0;
    memcpy(x + 5 * V, t, V * 4); /* bias lifts 300 into the tie, the penalty drops 5 out of it */
    static const vki_logit_bias lift[1] = {{300, 10.0f}};
    static const int32_t hist5[1] = {5};
    x[5 * V + 300] = 30.0f;
    p[5].temperature = 0;
    p[5].logit_bias = lift;
    p[5].n_logit_bias = 1;
    p[5].repetition_penalty = 1.5f;
    r[5].history = hist5;
    r[5].n_history = 1;
    p[6].top_k = (int32_t)V; /* top_k = vocab: off */
    p[6].top_p = 0.999f;
    p[7].temperature = 0;
    p[7].top_logprobs = 20;
    p[7].logprobs = true;
    gpu_sample(g, x, R, V, V, r, out);
    assert_int_equal(out[0].token, argmax_of(x, V));
    assert_int_equal(out[1].token, argmax_of(x + V, V));
    assert_int_equal(out[0].n_kept, 1);
    uint32_t finite = 0;
    for (uint32_t i = 0; i < V; i++)
        finite += sample_sanitize(x[2 * V + i]) != -INFINITY;
    assert_int_equal(out[2].n_kept, finite);
    assert_int_equal(out[3].n_kept, 3);
    assert_true(out[3].token == 10 || out[3].token == 400 || out[3].token == 776);
    assert_int_equal(out[4].token, 5);
    assert_int_equal(out[5].token, 17);
    for (uint32_t i = 0; i < R; i++) {
        char label[64];
        snprintf(label, sizeof label, "boundary row %u", i);
        assert_row_matches(x + i * V, V, &r[i], &out[i], label);
    }
    free(x);
    vt_assert_clean(g);
}

/* Rows with one finite logit (or none, or none left after a ban). */
static void test_all_but_one_inf(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    enum { V = 300, R = 5 };
    float *x = malloc((size_t)R * V * 4);
    for (uint32_t i = 0; i < R * V; i++)
        x[i] = -INFINITY;
    x[0 * V + 123] = x[1 * V + 123] = x[2 * V + 299] = x[4 * V + 7] = -3.5f;
    vki_sampling_params p[R];
    sample_req r[R];
    vki_sample_out out[R];
    static const vki_logit_bias ban[1] = {{7, -INFINITY}};
    for (uint32_t i = 0; i < R; i++) {
        p[i] = sampled_params();
        p[i].logprobs = true;
        p[i].top_logprobs = 3;
        r[i] = (sample_req){&p[i], 99 + i, i, NULL, 0, NULL, false, -1};
    }
    p[0].temperature = 0;
    p[1].top_k = 5;
    p[1].top_p = 0.5f;
    p[2].min_p = 0.5f;
    p[4].logit_bias = ban; /* the only finite token banned: no token */
    p[4].n_logit_bias = 1;
    gpu_sample(g, x, R, V, V, r, out);
    assert_int_equal(out[0].token, 123);
    assert_int_equal(out[1].token, 123);
    assert_int_equal(out[2].token, 299);
    assert_true(out[0].logprob == 0.0f && out[2].logprob == 0.0f);
    assert_int_equal(out[3].token, -1);
    assert_int_equal(out[4].token, -1);
    assert_int_equal(out[3].n_kept, 0);
    assert_int_equal(out[0].top_tokens[0], 123); /* then the lowest -inf ids */
    assert_int_equal(out[0].top_tokens[1], 0);
    assert_int_equal(out[0].top_tokens[2], 1);
    for (uint32_t i = 0; i < R; i++)
        assert_row_matches(x + i * V, V, &r[i], &out[i], "all but one -inf");
    free(x);
    vt_assert_clean(g);
}

/* The non-finite flag: NaN or +inf anywhere in the raw row, also under a bias, a penalty or a
 * grammar mask, on the greedy and the sampled routes; -inf (a ban) and a bias that overflows the
 * float range are not broken numbers. V = 1 and 7 and 64 + 1 (the CPU device's workgroup + 1):
 * a lone bad id in the last partial stride. */
static void test_nonfinite_flag(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample nonfinite");
    static const uint32_t sizes[] = {1, 7, 65, 1000};
    enum { R = 9 };
    for (uint32_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        uint32_t V = sizes[si], last = V - 1, words = (V + 31) / 32;
        float *x = malloc((size_t)R * V * 4);
        uint32_t *mask = calloc(words, 4);
        for (uint32_t i = 0; i < R * V; i++)
            x[i] = 2.0f * vt_normal(&rng);
        mask[0] = 1u; /* only token 0 may be drawn */
        vki_sampling_params p[R];
        sample_req r[R];
        vki_sample_out out[R];
        static const int32_t hist[2] = {0, 0};
        vki_logit_bias bias[1] = {{(int32_t)last, 5.0f}}, huge[1] = {{0, 3e38f}};
        for (uint32_t i = 0; i < R; i++) {
            p[i] = i % 2 ? sampled_params() : vki_sampling_default_params(); /* odd rows sample */
            r[i] = (sample_req){&p[i], vt_u64(&rng), i, NULL, 0, NULL, false, -1};
        }
        bool want[R] = {false, true, true, false, true, true, true, true, false};
        x[1 * V + last] = NAN;       /* row 0 clean; 1 and 2: a NaN, a +inf, in the last stride */
        x[2 * V + last] = INFINITY;
        x[3 * V + last] = -INFINITY; /* a ban is not broken */
        x[4 * V + last] = NAN;       /* under a bias */
        p[4].logit_bias = bias, p[4].n_logit_bias = 1;
        x[5 * V + 0] = INFINITY;     /* under a penalty (token 0 is in the history) */
        p[5].repetition_penalty = 1.3f, r[5].history = hist, r[5].n_history = 2;
        x[6 * V + last] = NAN;       /* outside a grammar mask (V = 1: inside it) */
        r[6].mask = mask;
        for (uint32_t i = 0; i < V; i++) /* every logit NaN: no token, and flagged */
            x[7 * V + i] = NAN;
        x[8 * V + 0] = 3e38f;        /* 3e38 + a bias of 3e38 overflows: still the max, not broken */
        p[8].logit_bias = huge, p[8].n_logit_bias = 1;
        gpu_sample(g, x, R, V, V, r, out);
        for (uint32_t i = 0; i < R; i++) {
            char label[64];
            snprintf(label, sizeof label, "nonfinite V=%u row %u", V, i);
            if (out[i].nonfinite != want[i])
                fail_msg("%s: nonfinite %u, want %u", label, out[i].nonfinite, want[i]);
            assert_row_matches(x + i * V, V, &r[i], &out[i], label);
        }
        assert_int_equal(out[7].token, -1);
        assert_int_equal(out[8].token, 0);
        free(x);
        free(mask);
    }
    vt_assert_clean(g);
}

/* R rows of a V-token vocabulary (rows padded to V + pad floats) with typical parameter sets,
 * each against the reference. */
static void vocab_rows(vt_gpu *g, vt_rng *rng, uint32_t V, uint32_t pad)
{
    enum { R = 6 };
    uint32_t stride = V + pad;
    float *x = malloc(((size_t)(R - 1) * stride + V) * 4);
    int32_t hist[32];
    for (int i = 0; i < 32; i++)
        hist[i] = (int32_t)vt_range(rng, 0, V - 1);
    vki_logit_bias bias[3] = {{0, 1.5f}, {(int32_t)(V / 2), -INFINITY}, {(int32_t)(V - 1), 2.0f}};
    vki_sampling_params p[R];
    sample_req r[R];
    vki_sample_out out[R];
    for (uint32_t i = 0; i < R; i++) {
        fill_logits(rng, x + (size_t)i * stride, V);
        p[i] = sampled_params();
        p[i].logprobs = true;
        p[i].top_logprobs = i * 4;
        r[i] = (sample_req){&p[i], vt_u64(rng), vt_range(rng, 0, 1u << 30), hist, 32, NULL, false, -1};
    }
    p[0].temperature = 0;
    p[1].temperature = 0.8f, p[1].top_k = 40, p[1].top_p = 0.95f;
    p[2].min_p = 0.05f, p[2].repetition_penalty = 1.1f, p[2].frequency_penalty = 0.5f;
    p[3].top_p = 0.6f, p[3].logit_bias = bias, p[3].n_logit_bias = V > 2 ? 3 : 0;
    p[4].temperature = 0, p[4].presence_penalty = 1.0f, p[4].logit_bias = bias, p[4].n_logit_bias = V > 2 ? 3 : 0;
    p[5].temperature = 1.7f, p[5].top_k = 3;
    gpu_sample(g, x, R, V, stride, r, out);
    for (uint32_t i = 0; i < R; i++) {
        char label[64];
        snprintf(label, sizeof label, "vocab %u row %u", V, i);
        assert_row_matches(x + (size_t)i * stride, V, &r[i], &out[i], label);
    }
    free(x);
}

/* The token in flight (VKI_SAMPLE_PENDING: a VKI_TOKEN_PREV row's penalties count the token the
 * step before sampled, which the engine copies into the row's pending entry): rows whose pending
 * token is in the window, in the bias list only, just outside the window, new (window 1: alone),
 * or -1 (nothing sampled), greedy and sampled, beside rows without one, against the reference
 * given the resolved history (the window's last tokens, then the pending one). The CPU reference
 * of a packed pending row gives the resolved one's logits exactly. */
static void pending_rows(vt_gpu *g, vt_rng *rng, uint32_t V)
{
    enum { R = 12, H = 24 };
    float *x = malloc((size_t)R * V * 4);
    int32_t hist[R][H + 1];
    vki_logit_bias bias[2] = {{(int32_t)(V / 3), 0.75f}, {(int32_t)(V - 1), -1.5f}};
    vki_sampling_params p[R], pr[R];
    sample_req r[R], rr[R];
    vki_sample_out out[R];
    for (uint32_t i = 0; i < R; i++) {
        fill_logits(rng, x + (size_t)i * V, V);
        p[i] = sampled_params();
        p[i].temperature = i % 3 == 0 ? 0.0f : 0.9f;
        p[i].top_k = i % 4 == 1 ? 20 : 0;
        p[i].repetition_penalty = 1.3f, p[i].presence_penalty = i % 2 ? 0.4f : -0.6f, p[i].frequency_penalty = 0.3f;
        p[i].penalty_window = i == 8 ? 1 : 6 + i;
        p[i].logit_bias = bias, p[i].n_logit_bias = 2;
        p[i].logprobs = true, p[i].top_logprobs = 3;
        for (uint32_t j = 0; j < H; j++) /* few distinct ids: repeats */
            hist[i][j] = (int32_t)vt_range(rng, 0, V - 1 < 11 ? V - 1 : 11);
        uint32_t w = p[i].penalty_window;
        int32_t pend = i % 5 == 0   ? hist[i][H - 1]                    /* in the window */
                       : i % 5 == 1 ? bias[0].token                     /* biased (maybe in it too) */
                       : i % 5 == 2 ? hist[i][H - w]                    /* the one that left it */
                       : i % 5 == 3 ? (int32_t)vt_range(rng, V > 12 ? 12 : 0, V - 1) /* mostly new */
                                    : -1;                               /* nothing sampled */
        r[i] = (sample_req){&p[i], vt_u64(rng), vt_range(rng, 0, 1u << 20), hist[i], H, NULL, .pending = i != 11,
                            .pending_token = pend};
        pr[i] = p[i];
        rr[i] = r[i];
        rr[i].params = &pr[i];
        rr[i].pending = false;
        if (i == 11) /* no token in flight: a plain row in the same dispatch */
            continue;
        if (pend >= 0) {
            hist[i][H] = pend;
            rr[i].n_history = H + 1;
        } else {
            pr[i].penalty_window = w - 1;
        }
    }
    gpu_sample(g, x, R, V, V, r, out);
    for (uint32_t i = 0; i < R; i++) {
        char label[64];
        snprintf(label, sizeof label, "vocab %u pending row %u", V, i);
        assert_row_matches(x + (size_t)i * V, V, &rr[i], &out[i], label);
        sample_dist a = ref_dist(x + (size_t)i * V, V, &r[i]), b = ref_dist(x + (size_t)i * V, V, &rr[i]);
        assert_memory_equal(a.z, b.z, V * sizeof *a.z);
        sample_dist_free(&a);
        sample_dist_free(&b);
    }
    free(x);
}

static void test_pending(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample pending");
    const uint32_t sizes[] = {7, 65, 1000, 4097};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        pending_rows(g, &rng, sizes[s]);
    /* a GPU's 1024 invocations (fewer entries than invocations) */
    vki_device_info saved = g->dev->info;
    if (saved.max_workgroup_invocations >= 1024 && saved.max_compute_shared_memory >= 28 * 1024) {
        g->dev->info.type = VKI_DEVICE_DISCRETE;
        pending_rows(g, &rng, 32768 + 5);
        g->dev->info = saved;
    }
    vt_assert_clean(g);
}

/* Vocabulary sizes around the workgroup sizes (64 .. 1024 invocations). */
static void test_vocab_sizes(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample vocab sizes");
    const uint32_t sizes[] = {1, 2, 7, 63, 64, 65, 127, 1000, 2049, 4097, 32000, 33001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        vocab_rows(g, &rng, sizes[s], (uint32_t)(s % 3) * 5); /* some rows padded */
    vt_assert_clean(g);
}

/* The workgroup a GPU gets (ops_sample.c: 1024 invocations for vocabularies above 16k, 32 ids
 * each; a CPU device gets 64), on this device: it is presented as a discrete NVIDIA GPU, and
 * 1024 invocations with their 28 KiB of shared memory fit lavapipe's real limits. Vocabularies
 * at the 1024 boundary (16 ids per invocation) and Llama 2's (32 000: 32 per invocation). */
static void test_gpu_configs(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample gpu configs");
    vki_device_info saved = g->dev->info;
    if (saved.max_workgroup_invocations < 1024 || saved.max_compute_shared_memory < 28 * 1024)
        skip();
    g->dev->info.type = VKI_DEVICE_DISCRETE;
    g->dev->info.vendor_id = 0x10DE;
    assert_int_equal(op_sample_wg(g->dev, 16385), 1024);
    assert_int_equal(op_sample_wg(g->dev, 128256), 1024);
    const uint32_t sizes[] = {16385, 32000}; /* 128256 as well would add ~15 s on lavapipe */
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        vocab_rows(g, &rng, sizes[s], (uint32_t)s * 3);
    g->dev->info = saved;
    vt_assert_clean(g);
}

/* Grammar masks (VKI_SAMPLE_MASK): rows of awkward vocabulary sizes with masks keeping from one
 * token to most, greedy and sampled with cuts, beside unmasked rows of the same dispatch, against
 * the reference; a mask that keeps nothing gives -1; the logprobs stay those of the raw row. */
static void test_masks(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample masks");
    const uint32_t sizes[] = {1, 7, 33, 64, 65, 1000, 1025, 4097};
    enum { R = 8 };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint32_t V = sizes[s];
        float *x = malloc((size_t)R * V * 4);
        vki_sampling_params p[R];
        sample_req r[R];
        vki_sample_out out[R];
        uint32_t *m[R] = {0};
        const float keep[R] = {0.5f, 0.02f, 0.9f, 0, 0.3f, -1, 0.5f, 0.0f};
        for (uint32_t i = 0; i < R; i++) {
            fill_logits(&rng, x + (size_t)i * V, V);
            p[i] = sampled_params();
            p[i].logprobs = true;
            p[i].top_logprobs = 3;
            m[i] = keep[i] < 0 ? NULL : random_mask(&rng, V, keep[i]); /* row 5: no mask */
            r[i] = (sample_req){&p[i], vt_u64(&rng), vt_range(&rng, 0, 1u << 20), NULL, 0, m[i], false, -1};
        }
        p[0].temperature = 0;
        p[1].top_k = 40, p[1].top_p = 0.9f;
        p[2].min_p = 0.05f;
        p[3].temperature = 0;        /* keeps nothing: -1 */
        p[4].top_p = 0.5f, p[4].temperature = 0.7f;
        p[6].temperature = 0, p[6].top_logprobs = 0;
        memset(m[6], 0, (V + 31) / 32 * 4); /* one allowed token: the pick whatever its logit */
        m[6][(V - 1) >> 5] = 1u << ((V - 1) & 31);
        m[7][0] |= 1u;                /* keeps only token 0 */
        p[7].top_k = 5;
        /* the sole allowed tokens of rows 6 and 7 get a low finite logit: fill_logits may have made
         * them -inf or NaN, which leaves nothing to pick (seen in CI: row 7 gave -1) */
        x[(size_t)6 * V + V - 1] = -30.0f;
        x[(size_t)7 * V] = -30.0f;
        gpu_sample(g, x, R, V, V, r, out);
        assert_int_equal(out[3].token, -1);
        assert_int_equal(out[6].token, (int32_t)V - 1);
        assert_int_equal(out[7].token, 0);
        for (uint32_t i = 0; i < R; i++) {
            char label[64];
            snprintf(label, sizeof label, "mask vocab %u row %u", V, i);
            assert_row_matches(x + (size_t)i * V, V, &r[i], &out[i], label);
            if (out[i].token >= 0 && m[i])
                assert_true(m[i][out[i].token >> 5] >> (out[i].token & 31) & 1);
            free(m[i]);
        }
        free(x);
    }
    vt_assert_clean(g);
}

/* Temperatures near 0 (down to a denormal) are greedy in effect; very large ones keep everything. */
static void test_temperature_extremes(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample temperature");
    enum { V = 500, R = 6 };
    const float temps[R] = {1e-6f, 1e-20f, 1e-40f, 1e4f, 1e30f, 3e38f};
    float *x = malloc((size_t)R * V * 4);
    vki_sampling_params p[R];
    sample_req r[R];
    vki_sample_out out[R];
    for (uint32_t i = 0; i < R; i++) {
        fill_logits(&rng, x + i * V, V);
        p[i] = sampled_params();
        p[i].temperature = temps[i];
        p[i].top_p = i % 2 ? 0.9f : 1.0f;
        r[i] = (sample_req){&p[i], vt_u64(&rng), i, NULL, 0, NULL, false, -1};
    }
    gpu_sample(g, x, R, V, V, r, out);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(out[i].token, argmax_of(x + i * V, V));
        assert_int_equal(out[i].n_kept, 1);
    }
    for (uint32_t i = 0; i < R; i++)
        assert_row_matches(x + i * V, V, &r[i], &out[i], "temperature extreme");
    vt_assert_clean(g);
    free(x);
}

/* One row of a 256k vocabulary (the largest in use), with top-20 logprobs. */
static void test_vocab_256k(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample 256k");
    enum { V = 262144, R = 2 };
    float *x = malloc((size_t)R * V * 4);
    fill_logits(&rng, x, V);
    fill_logits(&rng, x + V, V);
    vki_sampling_params p[R] = {sampled_params(), sampled_params()};
    p[0].temperature = 0.7f, p[0].top_k = 50, p[0].top_p = 0.9f, p[0].min_p = 0.01f;
    p[1].top_p = 0.95f; /* a top-p cut among ~all tokens */
    for (int i = 0; i < R; i++)
        p[i].logprobs = true, p[i].top_logprobs = 20;
    sample_req r[R] = {{&p[0], 12345, 678, NULL, 0, NULL, false, -1}, {&p[1], 999, 4242, NULL, 0, NULL, false, -1}};
    vki_sample_out out[R];
    gpu_sample(g, x, R, V, V, r, out);
    for (int i = 0; i < R; i++)
        assert_row_matches(x + (size_t)i * V, V, &r[i], &out[i], "vocab 256k");
    free(x);
    vt_assert_clean(g);
}

/* Greedy tokens, logprobs and the 20 alternatives against the reference. */
static void test_greedy_logprobs(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample greedy");
    enum { V = 5000, R = 64 };
    float *x = malloc((size_t)R * V * 4);
    vki_sampling_params p = sampled_params();
    p.temperature = 0;
    p.logprobs = true;
    p.top_logprobs = 20;
    sample_req r[R];
    vki_sample_out out[R];
    for (uint32_t i = 0; i < R; i++) {
        fill_logits(&rng, x + i * V, V);
        r[i] = (sample_req){&p, i, i, NULL, 0, NULL, false, -1};
    }
    gpu_sample(g, x, R, V, V, r, out);
    for (uint32_t i = 0; i < R; i++) {
        assert_int_equal(out[i].token, argmax_of(x + i * V, V));
        assert_int_equal(out[i].n_top, 20);
        assert_int_equal(out[i].top_tokens[0], out[i].token);
        assert_row_matches(x + i * V, V, &r[i], &out[i], "greedy logprobs");
    }
    free(x);
    vt_assert_clean(g);
}

/* ---- GPU: reproducibility, entry-point checks, the step-plan helpers -------------------------- */

/* The same (seed, position) gives the same token and logprobs alone, at any row of a batch of
 * 17 with other requests around it, and in a later dispatch (a pause and resume). */
static void test_reproducible(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample reproducible");
    enum { V = 2000, R = 17 };
    float *x = malloc((size_t)R * V * 4), mine[V];
    fill_logits(&rng, mine, V);
    int32_t hist[20];
    for (int i = 0; i < 20; i++)
        hist[i] = (int32_t)vt_range(&rng, 0, V - 1);
    vki_sampling_params p = sampled_params(), other = sampled_params();
    p.temperature = 1.1f, p.top_p = 0.97f, p.repetition_penalty = 1.2f, p.logprobs = true, p.top_logprobs = 5;
    other.top_k = 7, other.temperature = 0.3f;
    for (uint32_t pos = 0; pos < 64; pos += 9) {
        sample_req me = {&p, 0xdeadbeef12345678ull, pos, hist, 20, NULL, false, -1};
        vki_sample_out alone, batch[R];
        gpu_sample(g, mine, 1, V, V, &me, &alone);
        assert_row_matches(mine, V, &me, &alone, "alone");
        for (uint32_t at = 0; at < R; at += 8) { /* rows 0, 8 and 16 */
            sample_req r[R];
            for (uint32_t i = 0; i < R; i++) {
                if (i == at) {
                    memcpy(x + (size_t)i * V, mine, V * 4);
                    r[i] = me;
                } else {
                    fill_logits(&rng, x + (size_t)i * V, V);
                    r[i] = (sample_req){&other, vt_u64(&rng), pos, hist, 20, NULL, false, -1};
                }
            }
            gpu_sample(g, x, R, V, V, r, batch);
            assert_int_equal(batch[at].token, alone.token);
            assert_true(batch[at].logprob == alone.logprob);
            assert_memory_equal(batch[at].top_tokens, alone.top_tokens, sizeof alone.top_tokens[0] * 5);
        }
    }
    /* other seeds and positions do change the draw */
    sample_req a[64];
    vki_sample_out o[64];
    float *many = malloc((size_t)64 * V * 4);
    for (uint32_t i = 0; i < 64; i++) {
        memcpy(many + (size_t)i * V, mine, V * 4);
        a[i] = (sample_req){&p, 0xdeadbeef12345678ull + (i & 1), i / 2, hist, 20, NULL, false, -1};
    }
    gpu_sample(g, many, 64, V, V, a, o);
    uint32_t distinct = 0;
    for (uint32_t i = 1; i < 64; i++)
        distinct += o[i].token != o[0].token;
    assert_true(distinct > 0);
    free(many);
    free(x);
    vt_assert_clean(g);
}

/* The entry point refuses invalid parameters with the field named, packs nothing, and records
 * nothing for bad shapes. */
static void test_entry_point_checks(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    enum { V = 100 };
    op_sampler *s;
    assert_int_equal(op_sampler_create(g->dev, 4, V, &s), VKI_OK);
    vki_sampling_params ok = sampled_params();
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        vki_sampling_params bad = sampled_params();
        bad_cases[i].set(&bad);
        if (bad.logit_bias == bad_tok) /* token 1000 is outside this vocabulary too */
            assert_true(bad_tok[0].token >= V);
        sample_req r[2] = {{&ok, 1, 0, NULL, 0, NULL, false, -1}, {&bad, 1, 0, NULL, 0, NULL, false, -1}};
        char err[256] = "";
        assert_int_equal(op_sampler_pack(s, r, 2, err, sizeof err), VKI_ERR_INVALID_ARG);
        if (!strstr(err, bad_cases[i].field) || !strstr(err, "row 1"))
            fail_msg("case %zu: \"%s\" does not name row 1 and %s", i, err, bad_cases[i].field);
    }
    sample_req five[5] = {{&ok, 1, 0, NULL, 0, NULL, false, -1}};
    char err[256];
    assert_int_equal(op_sampler_pack(s, five, 5, err, sizeof err), VKI_ERR_INVALID_ARG); /* > max_rows */
    assert_int_equal(op_sampler_pack(s, five, 1, err, sizeof err), VKI_OK);
    vkd_buffer *lb = vt_buf_nan(g, V * 4, "logits");
    vt_begin(g);
    assert_int_equal(op_sampler_record(s, &g->cmd, vkd_whole(lb), V - 1, (vkd_view){0}), VKI_ERR_INVALID_ARG); /* stride */
    vkd_view short_view = {lb, 0, V * 4 - 4};
    assert_int_equal(op_sampler_record(s, &g->cmd, short_view, V, (vkd_view){0}), VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, lb);
    op_sampler_destroy(s);
    vt_assert_clean(g);
}

/* pack_plan / read_plan: rows are the plan's sequences with want_token, in plan order, sampled at
 * position pos0 + n_new with the sequence's seed and history; NULL params are greedy. */
static void test_step_plan(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample plan");
    enum { V = 3000 };
    float *x = malloc((size_t)3 * V * 4);
    for (int i = 0; i < 3; i++)
        fill_logits(&rng, x + i * V, V);
    vki_sampling_params p = sampled_params();
    p.top_k = 20, p.logprobs = true, p.top_logprobs = 2, p.presence_penalty = 1.5f;
    const int32_t tokens[4] = {1, 2, 3, 4}, hist[3] = {10, 11, 12};
    vki_step_seq seqs[5] = {
        {.slot = 3, .pos0 = 10, .n_new = 1, .tokens = tokens, .want_token = true, .sampling = &p, .seed = 77,
         .history = hist, .n_history = 3},
        {.slot = 0, .pos0 = 0, .n_new = 4, .tokens = tokens, .want_token = false},
        {.slot = 7, .pos0 = 5, .n_new = 2, .tokens = tokens, .want_token = true, .sampling = NULL, .seed = 1},
        {.slot = 1, .pos0 = 0, .n_new = 4, .tokens = tokens, .want_token = false},
        {.slot = 2, .pos0 = 99, .n_new = 1, .tokens = tokens, .want_token = true, .sampling = &p, .seed = 78},
    };
    vki_step_plan plan = {.n_seqs = 5, .seqs = seqs, .n_tokens = 12};
    op_sampler *s;
    assert_int_equal(op_sampler_create(g->dev, 3, V, &s), VKI_OK);
    char err[256] = "";
    assert_int_equal(op_sampler_pack_plan(s, &plan, err, sizeof err), VKI_OK);
    vkd_buffer *lb = vt_buf_from(g, x, (size_t)3 * V * 4, "logits");
    vt_begin(g);
    assert_int_equal(op_sampler_record(s, &g->cmd, vkd_whole(lb), V, (vkd_view){0}), VKI_OK);
    vt_submit_wait(g);
    vki_step_out outs[3];
    const uint32_t want_slot[3] = {3, 7, 2}, seq_of[3] = {0, 2, 4};
    op_sampler_read(s, want_slot, outs);
    for (int i = 0; i < 3; i++) {
        const vki_step_seq *q = &seqs[seq_of[i]];
        sample_req r = {q->sampling, q->seed, q->pos0 + q->n_new, q->history, q->n_history, NULL, false, -1};
        vki_sample_out want;
        ref_sample(x + i * V, V, &r, &want);
        assert_int_equal(outs[i].slot, want_slot[i]);
        assert_int_equal(outs[i].token, want.token);
        assert_int_equal(outs[i].n_top, want.n_top);
    }
    assert_int_equal(outs[1].token, argmax_of(x + V, V));
    vkd_buffer_destroy(g->dev, lb);
    op_sampler_destroy(s);
    free(x);
    vt_assert_clean(g);
}

/* The kernel's routes to the same distribution on a flat row (3000 logits within 0.2 of each
 * other, so a coarse bin of the candidate histogram holds ~1500 tokens): the candidate list
 * after splitting the crossing bin (by count, by mass), the list of the crossing sub-bin only
 * with the draw over the row (more than CAP = 1024 survivors), min-p's list, and the whole-row
 * radix selects (top-k and top-p with k > CAP; all logits equal). 4096 draws each, every one
 * also checked against the reference draw. */
static void test_kernel_routes(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample routes");
    enum { V = 3000 };
    float row[V];
    vt_fill_uniform(&rng, row, V, -0.1f, 0.1f);
    vki_sampling_params p = sampled_params();
    sample_req r = {&p, vt_u64(&rng), 0, NULL, 0, NULL, false, -1};
    p.top_k = 30;
    run_distribution_n(g, "route: top_k 30, list", row, V, &r, CHUNK, false);
    p.top_k = 1500;
    run_distribution_n(g, "route: top_k 1500, cross", row, V, &r, CHUNK, false);
    p.top_k = 2000;
    p.top_p = 0.9f;
    run_distribution_n(g, "route: k 2000 p .9, row", row, V, &r, CHUNK, false);
    p.top_k = 0;
    p.top_p = 0.05f;
    run_distribution_n(g, "route: top_p .05, list", row, V, &r, CHUNK, false);
    p.top_p = 0.5f;
    run_distribution_n(g, "route: top_p .5, cross", row, V, &r, CHUNK, false);
    p.top_p = 1;
    p.temperature = 0.05f;
    p.min_p = 0.9f;
    run_distribution_n(g, "route: min_p .9, list", row, V, &r, CHUNK, false);
    p.min_p = 0.2f;
    p.temperature = 0.2f;
    run_distribution_n(g, "route: min_p .2, row", row, V, &r, CHUNK, false);
    p.min_p = 0;
    p.temperature = 1;
    p.top_k = 1500;
    for (uint32_t i = 0; i < V; i++)
        row[i] = 0.5f; /* one crowded bin: whole row, the tie search reads the row */
    run_distribution_n(g, "route: k 1500 all equal, row", row, V, &r, CHUNK, false);
    vt_assert_clean(g);
}

/* The logits each invocation loads at once (sample.comp's SU: 8 on GPUs, 1 on CPU devices)
 * change no bit of any output: every route of test_kernel_routes, greedy, penalties, logprobs
 * with the top 5, a mask, a NaN logit, with SU = 1 and 8 on the same rows and seeds, each also
 * against the reference; on the device presented as NVIDIA (1024 invocations: the pipeline
 * test_gpu_configs compiles too, lavapipe takes ~30 s for one) with a vocabulary of 16 x 1024 + 1
 * (strided runs past the row's end, chunks of 17 ending inside a run). */
static void test_loads_bit_identical(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng rng = vt_rng_seeded("sample loads");
    enum { V = 16385, R = 12 };
    const vki_device_info saved = g->dev->info;
    if (saved.max_workgroup_invocations < 1024 || saved.max_compute_shared_memory < 28 * 1024)
        skip();
    g->dev->info.type = VKI_DEVICE_DISCRETE;
    g->dev->info.vendor_id = 0x10DE;
    assert_int_equal(op_sample_wg(g->dev, V), 1024);
    float *x = malloc((size_t)R * V * 4);
    vki_sampling_params p[R];
    sample_req r[R];
    uint32_t *mask = random_mask(&rng, V, 0.3f);
    int32_t hist[16];
    for (int i = 0; i < 16; i++)
        hist[i] = (int32_t)vt_range(&rng, 0, V - 1);
    for (uint32_t i = 0; i < R; i++) {
        if (i == 8)
            for (uint32_t j = 0; j < V; j++)
                x[(size_t)i * V + j] = 0.5f; /* one crowded bin: the whole-row route and the tie search */
        else /* ~180 tokens per bin of 1/9 (the crossing-bin routes); row 2 crowded: the whole row */
            vt_fill_uniform(&rng, x + (size_t)i * V, V, i == 2 ? -0.1f : -5.0f, i == 2 ? 0.1f : 5.0f);
        p[i] = sampled_params();
        p[i].logprobs = true;
        p[i].top_logprobs = 5;
        r[i] = (sample_req){&p[i], vt_u64(&rng), vt_range(&rng, 0, 1u << 20), NULL, 0, NULL, false, -1};
    }
    p[0].top_k = 30;                       /* list */
    p[1].top_k = 1500;                     /* crossing bin */
    p[2].top_k = 2000, p[2].top_p = 0.9f;  /* row */
    p[3].top_p = 0.05f;                    /* list */
    p[4].top_p = 0.5f;                     /* crossing bin */
    p[5].temperature = 0.05f, p[5].min_p = 0.9f;
    p[6].temperature = 0.2f, p[6].min_p = 0.2f;
    p[7].temperature = 0;                  /* greedy */
    p[8].top_k = 1500;
    p[9].top_k = 40, p[9].top_p = 0.9f, p[9].repetition_penalty = 1.3f, p[9].frequency_penalty = 0.2f;
    r[9].history = hist, r[9].n_history = 16;
    p[10].top_p = 0.8f;
    r[10].mask = mask;
    x[(size_t)11 * V + 77] = NAN;          /* flagged non-finite, read as -inf */
    vki_sample_out ref[R], out[R];
    /* (each run length is a pipeline lavapipe compiles for seconds: 8 takes ~30 s cold) */
    const uint32_t loads[] = {1, 8};
    for (size_t l = 0; l < sizeof loads / sizeof loads[0]; l++) {
        g->dev->sample_loads = loads[l];
        gpu_sample(g, x, R, V, V, r, l ? out : ref);
        for (uint32_t i = 0; l && i < R; i++)
            if (memcmp(&out[i], &ref[i], sizeof ref[i]))
                fail_msg("%u invocations, %u loads at once: row %u differs from 1 at once (token %d vs %d)",
                         op_sample_wg(g->dev, V), loads[l], i, out[i].token, ref[i].token);
        for (uint32_t i = 0; i < R; i++) {
            char label[64];
            snprintf(label, sizeof label, "%u loads row %u", loads[l], i);
            assert_row_matches(x + (size_t)i * V, V, &r[i], l ? &out[i] : &ref[i], label);
        }
    }
    assert_int_equal(ref[11].nonfinite, 1);
    g->dev->sample_loads = 0;
    g->dev->info = saved;
    free(mask);
    free(x);
    vt_assert_clean(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_kat),
        cmocka_unit_test(test_order_key),
        cmocka_unit_test(test_penalty_semantics),
        cmocka_unit_test(test_params_check),
        cmocka_unit_test(test_entry_point_checks),
        cmocka_unit_test(test_greedy_logprobs),
        cmocka_unit_test(test_boundaries),
        cmocka_unit_test(test_all_but_one_inf),
        cmocka_unit_test(test_nonfinite_flag),
        cmocka_unit_test(test_temperature_extremes),
        cmocka_unit_test(test_vocab_sizes),
        cmocka_unit_test(test_masks),
        cmocka_unit_test(test_pending),
        cmocka_unit_test(test_vocab_256k),
        cmocka_unit_test(test_gpu_configs),
        cmocka_unit_test(test_reproducible),
        cmocka_unit_test(test_step_plan),
        cmocka_unit_test(test_tie_cuts),
        cmocka_unit_test(test_kernel_routes),
        cmocka_unit_test(test_loads_bit_identical),
        cmocka_unit_test(test_distributions),
    };
    if (getenv("VKI_TEST_FILTER")) /* one test while developing: VKI_TEST_FILTER=test_loads_bit_identical */
        cmocka_set_test_filter(getenv("VKI_TEST_FILTER"));
    return cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
}
