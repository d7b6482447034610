/* Sampling on the CPU: parameter check, packing for the GPU, and the scalar reference of
 * shaders/sample.comp (definitions in sample_ref.h). The reference is written as the plain
 * definition (sort the vocabulary, cut prefixes), independent of the kernel's radix selects, so
 * the tests compare two different algorithms for the same distribution. */
#include "engine/sample_ref.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W_ONE (1ull << 40) /* fixed-point weight of the row maximum */

static vki_status fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static vki_status fail(char *err, size_t n, const char *fmt, ...)
{
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return VKI_ERR_INVALID_ARG;
}

/* ---- parameter check ------------------------------------------------------------------------ */

static vki_status check_bias(const vki_sampling_params *p, uint32_t n_vocab, char *err, size_t n)
{
    if (p->n_logit_bias && !p->logit_bias)
        return fail(err, n, "logit_bias is NULL but n_logit_bias = %u", p->n_logit_bias);
    for (uint32_t i = 0; i < p->n_logit_bias; i++) {
        const vki_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || (uint32_t)b->token >= n_vocab)
            return fail(err, n, "logit_bias[%u].token %d is not in the vocabulary (0..%u)", i, b->token,
                        n_vocab - 1);
        if (isnan(b->bias) || b->bias == INFINITY)
            return fail(err, n, "logit_bias[%u].bias must be finite or -inf (a ban), got %g", i, b->bias);
    }
    return VKI_OK;
}

vki_status sample_params_check(const vki_sampling_params *p, uint32_t n_vocab, char *err, size_t n)
{
    if (!p)
        return fail(err, n, "sampling params are NULL");
    if (n_vocab == 0 || n_vocab > SAMPLE_MAX_VOCAB)
        return fail(err, n, "n_vocab %u outside 1..%u", n_vocab, SAMPLE_MAX_VOCAB);
    if (!isfinite(p->temperature) || p->temperature < 0)
        return fail(err, n, "temperature must be finite and >= 0, got %g", p->temperature);
    if (p->top_k < 0)
        return fail(err, n, "top_k must be >= 0 (0 = off), got %d", p->top_k);
    if (!isfinite(p->top_p) || p->top_p <= 0 || p->top_p > 1)
        return fail(err, n, "top_p must be in (0, 1], got %g", p->top_p);
    if (!isfinite(p->min_p) || p->min_p < 0 || p->min_p > 1)
        return fail(err, n, "min_p must be in [0, 1], got %g", p->min_p);
    if (!isfinite(p->repetition_penalty) || p->repetition_penalty <= 0)
        return fail(err, n, "repetition_penalty must be finite and > 0, got %g", p->repetition_penalty);
    if (!isfinite(p->presence_penalty) || fabsf(p->presence_penalty) > 2)
        return fail(err, n, "presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!isfinite(p->frequency_penalty) || fabsf(p->frequency_penalty) > 2)
        return fail(err, n, "frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    if (p->top_logprobs > VKI_SAMPLE_MAX_TOP)
        return fail(err, n, "top_logprobs must be <= %u, got %u", VKI_SAMPLE_MAX_TOP, p->top_logprobs);
    return check_bias(p, n_vocab, err, n);
}

/* ---- packing -------------------------------------------------------------------------------- */

static bool penalties_on(const vki_sampling_params *p)
{
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

bool sample_req_pends(const sample_req *r)
{
    return r->pending && r->params && penalties_on(r->params) && r->params->penalty_window > 0;
}

/* The history tokens of the window (the pending token takes one place of it). */
static uint32_t window_len(const sample_req *r)
{
    const vki_sampling_params *p = r->params;
    if (!p || !penalties_on(p))
        return 0;
    uint32_t w = p->penalty_window - (sample_req_pends(r) ? 1 : 0);
    return r->n_history < w ? r->n_history : w;
}

uint32_t sample_edits_bound(const sample_req *r)
{
    return window_len(r) + (r->params ? r->params->n_logit_bias : 0) + sample_req_pends(r);
}

static int edit_cmp(const void *a, const void *b)
{
    int32_t x = ((const vki_sample_edit *)a)->token, y = ((const vki_sample_edit *)b)->token;
    return (x > y) - (x < y);
}

/* History counts and biases, one entry per distinct token, sorted by token. O(m log m). */
static vki_status pack_edits(const sample_req *r, uint32_t n_vocab, vki_sample_edit *e, uint32_t cap,
                             uint32_t *n_used, char *err, size_t n_err)
{
    const vki_sampling_params *p = r->params;
    uint32_t nh = window_len(r), n = 0;
    if (sample_edits_bound(r) > cap)
        return fail(err, n_err, "edit buffer too small (%u entries, need %u)", cap, sample_edits_bound(r));
    if (nh && !r->history)
        return fail(err, n_err, "history is NULL but n_history = %u", r->n_history);
    const int32_t *h = nh ? r->history + (r->n_history - nh) : NULL;
    for (uint32_t i = 0; i < nh; i++) {
        if (h[i] < 0 || (uint32_t)h[i] >= n_vocab)
            return fail(err, n_err, "history token %d is not in the vocabulary (0..%u)", h[i], n_vocab - 1);
        e[n++] = (vki_sample_edit){h[i], 1, 0.0f};
    }
    for (uint32_t i = 0; p && i < p->n_logit_bias; i++)
        e[n++] = (vki_sample_edit){p->logit_bias[i].token, 0, p->logit_bias[i].bias};
    qsort(e, n, sizeof *e, edit_cmp);
    uint32_t o = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (o && e[o - 1].token == e[i].token) {
            e[o - 1].count += e[i].count;
            e[o - 1].bias += e[i].bias;
        } else {
            e[o++] = e[i];
        }
    }
    n = 0; /* drop entries that change nothing (a zero bias on a token outside the window) */
    for (uint32_t i = 0; i < o; i++)
        if (e[i].count || e[i].bias != 0.0f)
            e[n++] = e[i];
    *n_used = n;
    return VKI_OK;
}

vki_status sample_pack_row(const sample_req *r, uint32_t n_vocab, uint32_t edit0, uint32_t mask0, vki_sample_row *row,
                           vki_sample_edit *edits, uint32_t cap, uint32_t *n_used, char *err, size_t n_err)
{
    vki_sampling_params greedy = vki_sampling_default_params();
    greedy.temperature = 0.0f;
    const vki_sampling_params *p = r->params ? r->params : &greedy;
    vki_status st = sample_params_check(p, n_vocab, err, n_err);
    if (st != VKI_OK)
        return st;
    sample_req rq = *r;
    rq.params = p;
    uint32_t n = 0;
    st = pack_edits(&rq, n_vocab, edits, cap, &n, err, n_err);
    if (st != VKI_OK)
        return st;
    float t = p->temperature;
    *row = (vki_sample_row){
        .inv_temp = t > 0 ? 1.0f / t : 0.0f,
        .top_k = p->top_k > 0 && (uint32_t)p->top_k < n_vocab ? (uint32_t)p->top_k : 0,
        .top_p32 = 0,
        .min_p_delta = t == 0 || p->min_p == 0 ? -INFINITY : p->min_p == 1 ? 0.0f : t * logf(p->min_p),
        .rep = p->repetition_penalty,
        .inv_rep = 1.0f / p->repetition_penalty,
        .presence = p->presence_penalty,
        .frequency = p->frequency_penalty,
        .edit0 = edit0,
        .n_edits = n,
        .seed_lo = (uint32_t)r->seed,
        .seed_hi = (uint32_t)(r->seed >> 32),
        .position = r->position,
        .n_top = p->top_logprobs,
        .flags = (t == 0 ? VKI_SAMPLE_GREEDY : 0) | (p->logprobs ? VKI_SAMPLE_LOGPROBS : 0) |
                 (r->mask ? VKI_SAMPLE_MASK : 0),
        .mask0 = r->mask ? mask0 : 0,
    };
    if (p->top_p < 1) {
        uint32_t tp = (uint32_t)((double)p->top_p * 4294967296.0);
        row->top_p32 = tp ? tp : 1;
    }
    if (sample_req_pends(&rq)) { /* after the known entries (the bound counted it) */
        edits[n] = (vki_sample_edit){r->pending_token, 1, 0.0f};
        row->flags |= VKI_SAMPLE_PENDING;
        row->pend = edit0 + n++;
    }
    *n_used = n;
    return VKI_OK;
}

/* ---- building blocks ------------------------------------------------------------------------ */

uint32_t sample_key(float z)
{
    uint32_t u;
    memcpy(&u, &z, 4);
    if (u == 0x80000000u)
        u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

float sample_sanitize(float x) { return isnan(x) ? -INFINITY : x > FLT_MAX ? FLT_MAX : x; }

void sample_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int i = 0; i < 10; i++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t sample_uniform64(uint64_t seed, uint32_t position)
{
    uint32_t ctr[4] = {position, 0, 0, 0}, key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, r[4];
    sample_philox(ctr, key, r);
    return ((uint64_t)r[0] << 32) | r[1];
}

uint64_t sample_mulhi64(uint64_t a, uint64_t b)
{
    const uint64_t m = 0xffffffffu;
    uint64_t a0 = a & m, a1 = a >> 32, b0 = b & m, b1 = b >> 32;
    uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    uint64_t mid = (p00 >> 32) + (p01 & m) + (p10 & m);
    return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

/* floor(a * b / 2^32), a < 2^63 */
static uint64_t mulhi64x32(uint64_t a, uint32_t b) { return (a >> 32) * b + (((a & 0xffffffffu) * b) >> 32); }

static uint64_t wfix(float z, float zmax, float inv_t)
{
    if (z == zmax)
        return W_ONE;
    if (z == -INFINITY)
        return 0;
    float t = (z - zmax) * inv_t;
    return (uint64_t)(expf(t) * 0x1p40f);
}

/* ---- the reference distribution ------------------------------------------------------------- */

static void apply_edit(float *z, const vki_sample_row *row, int32_t token, uint32_t count, float bias)
{
    float v = z[token];
    if (count > 0) {
        v = v > 0 ? v * row->inv_rep : v * row->rep;
        float pen = (float)count * row->frequency + row->presence;
        v = v - pen;
    }
    z[token] = fminf(v + bias, FLT_MAX); /* as the kernel: an overflow reads as the max */
}

/* The row's entries; a pending token (VKI_SAMPLE_PENDING) counts once more in its entry, or is
 * an entry of its own. */
static void apply_edits(float *z, uint32_t n_vocab, const vki_sample_row *row, const vki_sample_edit *edits)
{
    int32_t pend = row->flags & VKI_SAMPLE_PENDING ? edits[row->pend].token : -1;
    bool hit = pend < 0 || (uint32_t)pend >= n_vocab;
    for (uint32_t e = 0; e < row->n_edits; e++) {
        const vki_sample_edit *ed = &edits[row->edit0 + e];
        apply_edit(z, row, ed->token, ed->count + (ed->token == pend), ed->bias);
        hit = hit || ed->token == pend;
    }
    if (!hit)
        apply_edit(z, row, pend, 1, 0.0f);
}

/* Whether a raw logit is NaN or +inf (vki_sample_out.nonfinite). O(n_vocab). */
static uint32_t row_broken(const float *logits, uint32_t n_vocab)
{
    for (uint32_t i = 0; i < n_vocab; i++)
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return 1;
    return 0;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Length of the survivor prefix of `order` (ids sorted by (z desc, id asc)). */
static uint32_t cut_len(const sample_dist *d, const vki_sample_row *row, const uint32_t *order)
{
    uint32_t n = d->n_vocab, m = row->top_k && row->top_k < n ? row->top_k : n;
    float zmax = d->z[d->argmax];
    if (row->top_p32) {
        uint64_t mass = 0, cum = 0;
        for (uint32_t j = 0; j < m; j++)
            mass += wfix(d->z[order[j]], zmax, row->inv_temp);
        uint64_t target = mulhi64x32(mass, row->top_p32);
        target = target ? target : 1;
        for (uint32_t j = 0; j < m; j++) {
            cum += wfix(d->z[order[j]], zmax, row->inv_temp);
            if (cum >= target) {
                m = j + 1;
                break;
            }
        }
    }
    if (row->min_p_delta != -INFINITY) {
        uint32_t thr = sample_key(zmax + row->min_p_delta);
        for (uint32_t j = 0; j < m; j++)
            if (sample_key(d->z[order[j]]) < thr) {
                m = j;
                break;
            }
    }
    return m;
}

/* ids sorted by (z desc, id asc) into *order (malloc'd). O(n log n). */
static vki_status sort_order(const float *z, uint32_t n, uint32_t **order)
{
    uint64_t *sk = malloc((size_t)n * sizeof *sk);
    *order = malloc((size_t)n * sizeof **order);
    if (!sk || !*order) {
        free(sk);
        free(*order);
        *order = NULL;
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    for (uint32_t i = 0; i < n; i++) /* ascending (~key, id) = (z desc, id asc) */
        sk[i] = ((uint64_t)~sample_key(z[i]) << 32) | i;
    qsort(sk, n, sizeof *sk, u64_cmp);
    for (uint32_t j = 0; j < n; j++)
        (*order)[j] = (uint32_t)sk[j];
    free(sk);
    return VKI_OK;
}

static void keep(sample_dist *d, uint32_t id, float zmax, float inv_t)
{
    uint64_t w = wfix(d->z[id], zmax, inv_t);
    d->w[id] = w;
    d->total += w;
    d->n_kept += w != 0;
}

vki_status sample_dist_build(const float *logits, uint32_t n_vocab, const vki_sample_row *row,
                             const vki_sample_edit *edits, const uint32_t *masks, sample_dist *d)
{
    memset(d, 0, sizeof *d);
    d->n_vocab = n_vocab;
    d->greedy = row->flags & VKI_SAMPLE_GREEDY;
    d->z = malloc((size_t)n_vocab * sizeof *d->z);
    d->w = calloc(n_vocab, sizeof *d->w);
    if (!d->z || !d->w) {
        sample_dist_free(d);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    for (uint32_t i = 0; i < n_vocab; i++)
        d->z[i] = sample_sanitize(logits[i]);
    apply_edits(d->z, n_vocab, row, edits);
    if (row->flags & VKI_SAMPLE_MASK) {
        const uint32_t *m = masks + row->mask0;
        for (uint32_t i = 0; i < n_vocab; i++)
            if (!(m[i >> 5] >> (i & 31) & 1))
                d->z[i] = -INFINITY;
    }
    d->argmax = -1;
    for (uint32_t i = 0; i < n_vocab; i++)
        if (d->z[i] != -INFINITY && (d->argmax < 0 || d->z[i] > d->z[d->argmax]))
            d->argmax = (int32_t)i;
    if (d->argmax < 0 || d->greedy) {
        if (d->argmax >= 0) {
            d->w[d->argmax] = d->total = W_ONE;
            d->n_kept = 1;
        }
        return VKI_OK;
    }
    float zmax = d->z[d->argmax];
    bool cuts = (row->top_k && row->top_k < n_vocab) || row->top_p32 || row->min_p_delta != -INFINITY;
    if (!cuts) { /* every token survives: no order needed, O(n) */
        for (uint32_t i = 0; i < n_vocab; i++)
            keep(d, i, zmax, row->inv_temp);
        return VKI_OK;
    }
    uint32_t *order;
    if (sort_order(d->z, n_vocab, &order) != VKI_OK) {
        sample_dist_free(d);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    uint32_t m = cut_len(d, row, order);
    for (uint32_t j = 0; j < m; j++)
        keep(d, order[j], zmax, row->inv_temp);
    free(order);
    return VKI_OK;
}

void sample_dist_free(sample_dist *d)
{
    free(d->z);
    free(d->w);
    d->z = NULL;
    d->w = NULL;
}

double sample_dist_prob(const sample_dist *d, uint32_t token)
{
    return token < d->n_vocab && d->total ? (double)d->w[token] / (double)d->total : 0.0;
}

int32_t sample_dist_draw(const sample_dist *d, uint64_t seed, uint32_t position, double *margin)
{
    if (margin)
        *margin = 1.0;
    if (d->argmax < 0 || d->greedy)
        return d->argmax;
    uint64_t target = sample_mulhi64(d->total, sample_uniform64(seed, position)), cum = 0;
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        if (!d->w[i])
            continue;
        if (cum + d->w[i] > target) {
            uint64_t lo = target - cum, hi = cum + d->w[i] - target;
            if (margin)
                *margin = (double)(lo < hi ? lo : hi) / (double)d->total;
            return (int32_t)i;
        }
        cum += d->w[i];
    }
    return -1; /* unreachable: target < total */
}

/* ---- logprobs --------------------------------------------------------------------------------- */

void sample_ref_logprobs(const float *logits, uint32_t n_vocab, int32_t token, bool want_logprob,
                         uint32_t n_top, vki_sample_out *out)
{
    double m = -INFINITY, s = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        m = fmax(m, sample_sanitize(logits[i]));
    for (uint32_t i = 0; i < n_vocab && m != -INFINITY; i++)
        s += exp((double)sample_sanitize(logits[i]) - m);
    double lse = m == -INFINITY ? -INFINITY : m + log(s);
    out->logprob = 0;
    if (want_logprob)
        out->logprob = token < 0 || lse == -INFINITY ? -INFINITY
                                                      : (float)(sample_sanitize(logits[token]) - lse);
    uint32_t n = n_top < n_vocab ? n_top : n_vocab, have = 0;
    uint64_t best[VKI_SAMPLE_MAX_TOP]; /* smallest (~key, id): insertion, O(n_vocab * n) worst */
    for (uint32_t i = 0; i < n_vocab && n; i++) {
        uint64_t k = ((uint64_t)~sample_key(sample_sanitize(logits[i])) << 32) | i;
        if (have == n && k >= best[n - 1])
            continue;
        uint32_t j = have < n ? have++ : n - 1;
        for (; j > 0 && best[j - 1] > k; j--)
            best[j] = best[j - 1];
        best[j] = k;
    }
    out->n_top = have;
    for (uint32_t j = 0; j < have; j++) {
        uint32_t id = (uint32_t)best[j];
        out->top_tokens[j] = (int32_t)id;
        out->top_logprobs[j] = lse == -INFINITY ? -INFINITY : (float)(sample_sanitize(logits[id]) - lse);
    }
}

vki_status sample_ref_row(const float *logits, uint32_t n_vocab, const vki_sample_row *row,
                          const vki_sample_edit *edits, const uint32_t *masks, vki_sample_out *out)
{
    sample_dist d;
    vki_status st = sample_dist_build(logits, n_vocab, row, edits, masks, &d);
    if (st != VKI_OK)
        return st;
    memset(out, 0, sizeof *out);
    out->token = sample_dist_draw(&d, ((uint64_t)row->seed_hi << 32) | row->seed_lo, row->position, NULL);
    out->n_kept = d.n_kept;
    out->nonfinite = row_broken(logits, n_vocab);
    sample_dist_free(&d);
    if (row->flags & VKI_SAMPLE_LOGPROBS || row->n_top)
        sample_ref_logprobs(logits, n_vocab, out->token, row->flags & VKI_SAMPLE_LOGPROBS, row->n_top, out);
    return VKI_OK;
}

vki_status sample_ref_sample(const float *logits, uint32_t n_vocab, const sample_req *req, vki_sample_out *out,
                             char *err, size_t n_err)
{
    uint32_t cap = sample_edits_bound(req), n = 0;
    vki_sample_edit *e = malloc((cap ? cap : 1) * sizeof *e);
    if (!e)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    vki_sample_row row;
    vki_status st = sample_pack_row(req, n_vocab, 0, 0, &row, e, cap, &n, err, n_err);
    if (st == VKI_OK)
        st = sample_ref_row(logits, n_vocab, &row, e, req->mask, out);
    free(e);
    return st;
}
