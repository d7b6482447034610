/* Row norms and elementwise ops (engine/ops_basic.h) against scalar double-precision references:
 * add, copy (bit-exact), RMSNorm, RoPE (normal / NeoX, partial rotary, linear scale, llama3 factors, in place),
 * SwiGLU / GeGLU, scale / soft-cap, softmax (scale, -inf entries, all -inf rows, length-1
 * rows). A per-head RMSNorm (qwen3, gemma3 Q/K norms) is RMSNorm over rows of head_dim: the
 * rmsnorm shapes include such rows (64 and 256 columns). Operands are random strided
 * sub-matrices at random offsets of NaN-filled buffers: the result must match the
 * reference and every float outside the matrix must still be NaN.
 *
 * Tolerances (NMSE against the double reference): add exact (0: one correctly rounded add);
 * RMSNorm and softmax RMSNORM_TOL, SOFTMAX_TOL; RoPE, whose angle is exact to < 1e-6 rad for
 * positions < 2^24, is held to 1e-11 at positions up to 2^24-1; GLU to 1e-12, unary to 2e-13
 * (GLU_TOL, UNARY_TOL; measured values next to each; the worst is printed per test). */
#include "support/vt.h"

#include "engine/ops_basic.h"
#include "engine/ops_matmul.h"

#define N_SHAPES 24
#define RMSNORM_TOL 2e-12 /* measured on lavapipe: <= 2.3e-14 over seeds 1-7 (was 1e-10) */
#define SOFTMAX_TOL 3e-11 /* measured: <= 3.6e-13 (was 1e-10) */
#define ROPE_TOL 1e-11
#define GLU_TOL 1e-12   /* SwiGLU; measured: lavapipe 7e-15 to 1.2e-14, H200 6.8e-14 */
#define GEGLU_TOL 1e-13 /* measured: lavapipe ~4e-16, H200 1.2e-15 */
#define UNARY_TOL 2e-13 /* measured: scale exact (0), soft-cap 4.5e-15 (was 1e-12: 220x) */

typedef struct mshape {
    uint32_t rows, cols, off, stride; /* element (r, c) at off + r * stride + c */
} mshape;

static size_t mshape_len(mshape s) { return s.off + (size_t)(s.rows - 1) * s.stride + s.cols; }

/* Awkward column counts first (1, 7, workgroup +- 1, big), then random ones. */
static mshape random_shape(vt_rng *r, int t, uint32_t max_cols)
{
    static const uint32_t fixed[] = {1, 7, 63, 64, 65, 255, 256, 257, 1000, 4097};
    uint32_t cols = t < 10 ? fixed[t] : vt_range(r, 1, max_cols);
    if (cols > max_cols)
        cols = max_cols;
    mshape s = {.rows = vt_range(r, 1, t % 3 == 0 ? 1 : 37), .cols = cols, .off = vt_range(r, 0, 9)};
    s.stride = cols + (t % 2 ? vt_range(r, 0, 6) : 0);
    return s;
}

static float *rand_buf(vt_rng *r, size_t n, float lo, float hi)
{
    float *x = malloc(n * sizeof *x);
    vt_fill_uniform(r, x, n, lo, hi);
    return x;
}

static void gather(const float *buf, mshape s, float *packed)
{
    for (uint32_t i = 0; i < s.rows; i++)
        memcpy(packed + (size_t)i * s.cols, buf + s.off + (size_t)i * s.stride, s.cols * sizeof(float));
}

/* Every float of buf[0..n) outside the matrix s still holds the NaN fill. */
static void assert_untouched(const float *buf, size_t n, mshape s, const char *label)
{
    for (size_t i = 0; i < n; i++) {
        bool inside = i >= s.off && (i - s.off) % s.stride < s.cols && (i - s.off) / s.stride < s.rows;
        uint32_t bits;
        memcpy(&bits, &buf[i], 4);
        if (!inside && bits != 0x7fc00000u)
            fail_msg("%s: float %zu outside the output matrix was written", label, i);
    }
}

/* Downloads y (n floats), checks the matrix s against ref (packed rows) and the gaps; returns
 * the NMSE reached. */
static double check_out(vt_gpu *g, vkd_buffer *by, size_t n, mshape s, const float *ref, double tol, const char *label);

/* The result of an op that ran in place (by is x's buffer of n floats) or into a NaN-filled
 * output: matches ref by NMSE (returned); out of place nothing outside the shape was written; in
 * place with x_gaps given, the floats outside the shape still hold x. */
static double check_result(vt_gpu *g, vkd_buffer *by, bool in_place, size_t n, mshape s, const float *ref, double tol,
                           const float *x_gaps, const char *label)
{
    if (!in_place)
        return check_out(g, by, n, s, ref, tol, label);
    float *y = malloc(n * sizeof *y), *packed = malloc((size_t)s.rows * s.cols * sizeof *packed);
    vt_download(g, by, y, n * 4);
    gather(y, s, packed);
    vt_assert_nmse(packed, ref, (size_t)s.rows * s.cols, tol, label);
    double e = vt_nmse(packed, ref, (size_t)s.rows * s.cols);
    for (size_t i = 0; x_gaps && i < n; i++)
        if (i < s.off || (i - s.off) % s.stride >= s.cols)
            assert_memory_equal(&y[i], &x_gaps[i], 4);
    free(y);
    free(packed);
    return e;
}

static double check_out(vt_gpu *g, vkd_buffer *by, size_t n, mshape s, const float *ref, double tol, const char *label)
{
    float *y = malloc(n * sizeof *y), *packed = malloc((size_t)s.rows * s.cols * sizeof *packed);
    vt_download(g, by, y, n * sizeof *y);
    gather(y, s, packed);
    vt_assert_nmse(packed, ref, (size_t)s.rows * s.cols, tol, label);
    double e = vt_nmse(packed, ref, (size_t)s.rows * s.cols);
    assert_untouched(y, n, s, label);
    free(y);
    free(packed);
    return e;
}

static op_mat mat_of(const vkd_buffer *b, mshape s) { return (op_mat){vkd_whole(b), s.off, s.stride}; }

static void test_add(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_add");
    for (int t = 0; t < N_SHAPES; t++) {
        uint32_t n = t < 4 ? (uint32_t[]){1, 7, 257, 300001}[t] : vt_range(&r, 1, 100000);
        float *a = rand_buf(&r, n, -4, 4), *b = rand_buf(&r, n, -4, 4), *ref = malloc(n * sizeof *ref);
        for (uint32_t i = 0; i < n; i++)
            ref[i] = (float)((double)a[i] + b[i]);
        vkd_buffer *ba = vt_buf_from(g, a, n * 4, "a"), *bb = vt_buf_from(g, b, n * 4, "b"), *by = vt_buf_nan(g, n * 4, "y");
        vt_begin(g);
        assert_int_equal(op_add(&g->cmd, vkd_whole(ba), vkd_whole(bb), vkd_whole(by), n), VKI_OK);
        vt_submit_wait(g);
        char label[64];
        snprintf(label, sizeof label, "add n=%u", n);
        check_out(g, by, n, (mshape){1, n, 0, n}, ref, 0, label); /* one correctly rounded add: exact */
        vkd_buffer_destroy(g->dev, ba);
        vkd_buffer_destroy(g->dev, bb);
        vkd_buffer_destroy(g->dev, by);
        free(a); free(b); free(ref);
    }
    vt_assert_clean(g);
}

/* copy: every 32-bit pattern (NaNs too) arrives unchanged, nothing outside the destination range
 * is written. Sizes cover the one-word tail, the remainder loop and the unrolled 4 x 16-byte body
 * (2^20 words: every invocation takes one unrolled pass; 2^20 + 5: some do, some do not). */
static void test_copy(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_copy");
    for (int t = 0; t < 10; t++) {
        uint32_t n = t < 7 ? (uint32_t[]){1, 3, 4, 7, 4097, 1u << 20, (1u << 20) + 5}[t] : vt_range(&r, 1, 200000);
        uint32_t src_off = 4 * vt_range(&r, 0, 3), dst_off = 4 * vt_range(&r, 0, 3), pad = 5; /* in words */
        uint32_t *x = malloc(((size_t)n + src_off) * 4), *y = malloc(((size_t)n + dst_off + pad) * 4);
        for (size_t i = 0; i < (size_t)n + src_off; i++)
            x[i] = (uint32_t)vt_u64(&r);
        vkd_buffer *bx = vt_buf_from(g, x, ((size_t)n + src_off) * 4, "x");
        vkd_buffer *by = vt_buf_nan(g, ((size_t)n + dst_off + pad) * 4, "y");
        vt_begin(g);
        assert_int_equal(op_copy(&g->cmd, (vkd_view){bx, 4ull * src_off, 4ull * n},
                                 (vkd_view){by, 4ull * dst_off, VK_WHOLE_SIZE}, 4ull * n), VKI_OK);
        vt_submit_wait(g);
        vt_download(g, by, y, ((size_t)n + dst_off + pad) * 4);
        for (size_t i = 0; i < (size_t)n + dst_off + pad; i++) {
            bool inside = i >= dst_off && i < (size_t)dst_off + n;
            uint32_t want = inside ? x[src_off + i - dst_off] : 0x7fc00000u;
            if (y[i] != want)
                fail_msg("copy n=%u (src +%u, dst +%u words): word %zu is %08x, want %08x", n, src_off, dst_off, i,
                         y[i], want);
        }
        vkd_buffer_destroy(g->dev, bx);
        vkd_buffer_destroy(g->dev, by);
        free(x);
        free(y);
    }
    vt_assert_clean(g);
}

/* RMSNorm, or with layer LayerNorm (the row's mean subtracted first; + b[c] where b) */
static void ref_rmsnorm(const float *x, mshape s, const float *w, const float *b, float eps, bool layer, float *out)
{
    for (uint32_t i = 0; i < s.rows; i++) {
        const float *row = x + s.off + (size_t)i * s.stride;
        double mean = 0, ss = 0;
        for (uint32_t c = 0; layer && c < s.cols; c++)
            mean += row[c];
        mean /= s.cols;
        for (uint32_t c = 0; c < s.cols; c++)
            ss += (row[c] - mean) * (row[c] - mean);
        double inv = 1.0 / sqrt(ss / s.cols + eps);
        for (uint32_t c = 0; c < s.cols; c++)
            out[(size_t)i * s.cols + c] = (float)((row[c] - mean) * inv * w[c] + (b ? b[c] : 0.0));
    }
}

static void test_rmsnorm(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_rmsnorm");
    double worst = 0;
    for (int t = 0; t < N_SHAPES; t++) {
        mshape xs = random_shape(&r, t, 9000), ys = xs;
        bool in_place = t % 4 == 2;
        if (!in_place) {
            ys.off = vt_range(&r, 0, 5);
            ys.stride = xs.cols + vt_range(&r, 0, 3);
        }
        size_t nx = mshape_len(xs), ny = mshape_len(ys);
        float eps = t % 2 ? 1e-5f : 1e-6f, scale = t % 4 == 3 ? 1e-3f : 3.0f; /* small rows: eps matters */
        /* a third LayerNorm (command-r's; every other one with starcoder2's bias, after the
         * weights in w), its rows centred off zero: the mean taken out matters */
        const bool layer = t % 3 == 1, bias = layer && t % 2;
        const uint32_t mode = (layer ? VKI_NORM_MEAN : 0u) | (bias ? VKI_NORM_BIAS : 0u);
        float *x = rand_buf(&r, nx, -scale, scale), *w = rand_buf(&r, 2 * xs.cols, -2, 2);
        for (size_t i = 0; layer && i < nx; i++)
            x[i] += 2.0f * scale;
        float *ref = malloc((size_t)xs.rows * xs.cols * sizeof *ref);
        ref_rmsnorm(x, xs, w, bias ? w + xs.cols : NULL, eps, layer, ref);
        vkd_buffer *bx = vt_buf_from(g, x, nx * 4, "x"), *bw = vt_buf_from(g, w, (bias ? 2 : 1) * xs.cols * 4, "w");
        vkd_buffer *by = in_place ? bx : vt_buf_nan(g, ny * 4, "y");
        vt_begin(g);
        assert_int_equal(op_norm_xh(&g->cmd, mode, mat_of(bx, xs), vkd_whole(bw), mat_of(by, ys), xs.rows, xs.cols,
                                    eps, (vkd_view){0}, (vkd_view){0}), VKI_OK);
        vt_submit_wait(g);
        char label[96];
        snprintf(label, sizeof label, "%s %ux%u stride %u/%u%s", bias ? "layernorm+b" : layer ? "layernorm" : "rmsnorm",
                 xs.rows, xs.cols, xs.stride, ys.stride, in_place ? " in place" : "");
        double e = check_result(g, by, in_place, in_place ? nx : ny, in_place ? xs : ys, ref, RMSNORM_TOL, NULL, label);
        worst = e > worst ? e : worst;
        if (!in_place)
            vkd_buffer_destroy(g->dev, by);
        vkd_buffer_destroy(g->dev, bx);
        vkd_buffer_destroy(g->dev, bw);
        free(x); free(w); free(ref);
    }
    fprintf(stderr, "  worst NMSE: rmsnorm and layernorm %.2e (tolerance %.0e)\n", worst, RMSNORM_TOL);
    vt_assert_clean(g);
}

typedef struct rope_case {
    op_rope_p p;
    double base, freq_scale;
    float mag; /* the table's magnitude (LongRoPE / YaRN attention factor) */
    bool factors, in_place;
} rope_case;

/* Double-precision RoPE of x (rows xs.stride apart) into packed rows [n_tokens][n_heads * hd]. */
static void ref_rope(const rope_case *rc, const float *x, mshape xs, const uint32_t *pos, const float *fac, float *out)
{
    const op_rope_p *p = &rc->p;
    uint32_t row = p->n_heads * p->head_dim, half = p->n_rot / 2;
    for (uint32_t t = 0; t < p->n_tokens; t++)
        for (uint32_t h = 0; h < p->n_heads; h++) {
            const float *v = x + xs.off + (size_t)t * xs.stride + h * p->head_dim;
            float *o = out + (size_t)t * row + h * p->head_dim;
            for (uint32_t d = p->n_rot; d < p->head_dim; d++)
                o[d] = v[d];
            for (uint32_t i = 0; i < half; i++) {
                double theta = pos[t] * rc->freq_scale * pow(rc->base, -2.0 * i / p->n_rot);
                if (fac)
                    theta /= fac[i];
                uint32_t a = p->neox ? i : 2 * i, b = p->neox ? i + half : 2 * i + 1;
                double c = cos(theta) * rc->mag, s = sin(theta) * rc->mag;
                o[a] = (float)(v[a] * c - v[b] * s);
                o[b] = (float)(v[a] * s + v[b] * c);
            }
        }
}

static rope_case random_rope(vt_rng *r, int t)
{
    static const uint32_t hds[] = {2, 8, 64, 128, 80, 256, 6, 96};
    rope_case rc = {.p = {.head_dim = hds[t % 8], .neox = t % 2}};
    rc.p.n_tokens = t < 3 ? (uint32_t[]){1, 7, 1}[t] : vt_range(r, 1, 70);
    rc.p.n_heads = vt_range(r, 1, 9);
    rc.p.n_rot = t % 5 == 4 ? 2 * vt_range(r, 1, rc.p.head_dim / 2) : rc.p.head_dim; /* partial rotary */
    rc.base = (double[]){10000.0, 500000.0, 1000000.0}[t % 3];
    rc.freq_scale = t % 4 == 1 ? 0.25 : 1.0;
    rc.factors = t % 3 == 2;
    rc.mag = t % 3 == 1 ? 1.1386294f : 1.0f; /* YaRN x4's 1 + 0.1 ln 4; with partial rotary too */
    rc.in_place = t % 4 >= 2;
    return rc;
}

static void run_rope_case(vt_gpu *g, vt_rng *r, const rope_case *rc)
{
    const op_rope_p *p = &rc->p;
    uint32_t row = p->n_heads * p->head_dim;
    mshape xs = {p->n_tokens, row, vt_range(r, 0, 7), row + vt_range(r, 0, 5)}, ys = xs;
    if (!rc->in_place) {
        ys.off = vt_range(r, 0, 3);
        ys.stride = row + vt_range(r, 0, 2);
    }
    size_t nx = mshape_len(xs), ny = mshape_len(ys);
    float *x = rand_buf(r, nx, -2, 2), *fac = rand_buf(r, p->n_rot / 2, 1, 8);
    uint32_t *pos = malloc(p->n_tokens * sizeof *pos);
    for (uint32_t t = 0; t < p->n_tokens; t++) /* short prompts, long contexts and the limit */
        pos[t] = t % 3 == 0 ? vt_range(r, 0, 64) : t % 3 == 1 ? vt_range(r, 0, 1u << 20) : (1u << 24) - 1 - t;
    float *tab = malloc(2 * p->n_rot * sizeof *tab), *ref = malloc((size_t)p->n_tokens * row * sizeof *ref);
    op_rope_freqs(rc->base, rc->freq_scale, rc->factors ? fac : NULL, NULL, rc->mag, p->n_rot, tab);
    ref_rope(rc, x, xs, pos, rc->factors ? fac : NULL, ref);
    vkd_buffer *bx = vt_buf_from(g, x, nx * 4, "x"), *by = rc->in_place ? bx : vt_buf_nan(g, ny * 4, "y");
    vkd_buffer *bp = vt_buf_from(g, pos, p->n_tokens * 4, "pos"), *bf = vt_buf_from(g, tab, 2 * p->n_rot * 4, "freqs");
    vt_begin(g);
    assert_int_equal(op_rope(&g->cmd, p, mat_of(bx, xs), mat_of(by, ys), vkd_whole(bp), vkd_whole(bf)), VKI_OK);
    vt_submit_wait(g);
    char label[128];
    snprintf(label, sizeof label, "rope %s%s tok %u heads %u hd %u rot %u base %g%s%s", p->neox ? "neox" : "normal",
             rc->in_place ? " in place" : "", p->n_tokens, p->n_heads, p->head_dim, p->n_rot, rc->base,
             rc->factors ? " factors" : "", rc->mag != 1.0f ? " magnitude" : "");
    /* in place, the gaps keep x's values */
    check_result(g, by, rc->in_place, rc->in_place ? nx : ny, ys, ref, ROPE_TOL, x, label);
    if (!rc->in_place)
        vkd_buffer_destroy(g->dev, by);
    vkd_buffer_destroy(g->dev, bx);
    vkd_buffer_destroy(g->dev, bp);
    vkd_buffer_destroy(g->dev, bf);
    free(x); free(fac); free(pos); free(tab); free(ref);
}

static void test_rope(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_rope");
    for (int t = 0; t < 2 * N_SHAPES; t++) {
        rope_case rc = random_rope(&r, t);
        run_rope_case(g, &r, &rc);
    }
    vt_assert_clean(g);
}

/* The split table reproduces g = theta / (2 pi pos) to double precision. */
static void test_rope_freqs_table(void **state)
{
    (void)state;
    float tab[4 * 64], fac[64];
    for (int i = 0; i < 64; i++)
        fac[i] = 1.0f + (float)i / 7;
    op_rope_freqs(500000.0, 0.5, fac, NULL, 1.25f, 128, tab);
    for (int i = 0; i < 64; i++) {
        double want = 0.5 * pow(500000.0, -2.0 * i / 128) / fac[i] / (2 * M_PI);
        double got = (double)tab[4 * i] + tab[4 * i + 1] + tab[4 * i + 2];
        assert_true(fabs(got - want) <= 1e-15 * want);
        assert_true(tab[4 * i + 3] == 1.25f); /* the magnitude */
        int e;
        double m = frexp(tab[4 * i], &e); /* 12 significant bits: m * 2^12 is an integer */
        assert_true(ldexp(m, 12) == nearbyint(ldexp(m, 12)));
    }
}

/* YaRN's table against Hugging Face's formulation (_compute_yarn_parameters: a blend of inverse
 * frequencies, where op_rope_freqs follows ggml's blend of angles), on Qwen2.5/Qwen3's long-context
 * setting (base 1e6, 128 dims, factor 4 over 32768: pairs 0..23 keep their frequency, 40.. are
 * interpolated, the ramp between) and gpt-oss's (base 150000, 64 dims, factor 32 over 4096), and
 * a half-way ext_factor. */
static void test_rope_yarn_table(void **state)
{
    (void)state;
    static const struct { double base, factor, ext; uint32_t n_rot, orig, lo, hi; } c[] = {
        {1000000.0, 4.0, 1.0, 128, 32768, 23, 40},
        {150000.0, 32.0, 1.0, 64, 4096, 8, 18},
        {1000000.0, 4.0, 0.5, 128, 32768, 23, 40},
    };
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        float tab[4 * 64];
        const op_rope_yarn y = {c[k].ext, 32.0, 1.0, c[k].orig};
        op_rope_freqs(c[k].base, 1.0 / c[k].factor, NULL, &y, 1.0f, c[k].n_rot, tab);
        /* HF: low/high from find_correction_dim, truncated and clamped; the ramp over dim // 2 */
        const double d = c[k].n_rot;
        double lo = floor(d * log(c[k].orig / (32.0 * 2 * M_PI)) / (2 * log(c[k].base)));
        double hi = ceil(d * log(c[k].orig / (1.0 * 2 * M_PI)) / (2 * log(c[k].base)));
        assert_true(lo == c[k].lo && hi == c[k].hi); /* the bounds worked out by hand above */
        for (uint32_t i = 0; i < c[k].n_rot / 2; i++) {
            double inv_extrap = 1.0 / pow(c[k].base, 2.0 * i / d), inv_interp = inv_extrap / c[k].factor;
            double ramp = fmin(1.0, fmax(0.0, (i - lo) / (hi - lo)));
            double extrap_w = (1.0 - ramp) * c[k].ext;
            double want = (inv_interp * (1.0 - extrap_w) + inv_extrap * extrap_w) / (2 * M_PI);
            double got = (double)tab[4 * i] + tab[4 * i + 1] + tab[4 * i + 2];
            if (!(fabs(got - want) <= 1e-14 * want))
                fail_msg("yarn case %zu pair %u: %.17g turns per position, want %.17g", k, i, got, want);
            if (c[k].ext == 1.0 && i <= lo) /* fast pairs: their own frequency */
                assert_true(fabs(got - inv_extrap / (2 * M_PI)) <= 1e-14 * got);
            if (i >= hi) /* slow pairs: interpolated by the factor */
                assert_true(fabs(got - inv_interp / (2 * M_PI)) <= 1e-14 * got);
        }
    }
}

static double ref_act(uint32_t act, double v)
{
    if (act == VKI_GLU_GELU_TANH)
        return 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    return v / (1.0 + exp(-v));
}

static void ref_glu(uint32_t act, const float *gt, mshape gs, const float *u, mshape us, float *out)
{
    for (uint32_t i = 0; i < gs.rows; i++)
        for (uint32_t c = 0; c < gs.cols; c++) {
            double v = gt[gs.off + (size_t)i * gs.stride + c];
            out[(size_t)i * gs.cols + c] = (float)(ref_act(act, v) * u[us.off + (size_t)i * us.stride + c]);
        }
}

/* SwiGLU and GeGLU; gate and up as the two halves of one fused [rows, 2 * cols] buffer in odd
 * cases (phi3's ffn_up holds gate | up). */
static void test_glu(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_glu");
    double worst[2] = {0, 0};
    for (int t = 0; t < 2 * N_SHAPES; t++) {
        uint32_t act = t % 4 < 2 ? VKI_GLU_SILU : VKI_GLU_GELU_TANH;
        mshape gs = random_shape(&r, t / 2, 12000), us = gs, ys = gs;
        bool fused = t % 2;
        if (fused) { /* gate | up interleaved per row in one buffer */
            gs.stride = us.stride = 2 * gs.cols + 3;
            us.off = gs.off + gs.cols;
        } else {
            us.off = vt_range(&r, 0, 4);
        }
        ys.off = vt_range(&r, 0, 4);
        ys.stride = gs.cols + vt_range(&r, 0, 2);
        size_t ng = mshape_len(gs) > mshape_len(us) ? mshape_len(gs) : mshape_len(us), ny = mshape_len(ys);
        float *gt = rand_buf(&r, ng, -12, 12), *u = fused ? gt : rand_buf(&r, mshape_len(us), -3, 3);
        if (t / 2 == 3) /* saturation: exp(-v) overflows to inf, tanh reaches +-1 */
            for (size_t i = 0; i < ng; i += 2)
                gt[i] = (i % 4 ? -1 : 1) * vt_uniform(&r, 80, 120);
        float *ref = malloc((size_t)gs.rows * gs.cols * sizeof *ref);
        ref_glu(act, gt, gs, u, us, ref);
        vkd_buffer *bg = vt_buf_from(g, gt, ng * 4, "g"), *bu = fused ? bg : vt_buf_from(g, u, mshape_len(us) * 4, "u");
        vkd_buffer *by = vt_buf_nan(g, ny * 4, "y");
        vt_begin(g);
        assert_int_equal(op_glu(&g->cmd, act, mat_of(bg, gs), mat_of(bu, us), mat_of(by, ys), gs.rows, gs.cols), VKI_OK);
        vt_submit_wait(g);
        char label[96];
        snprintf(label, sizeof label, "%s %ux%u%s", act ? "geglu" : "swiglu", gs.rows, gs.cols, fused ? " fused" : "");
        double e = check_out(g, by, ny, ys, ref, act ? GEGLU_TOL : GLU_TOL, label);
        worst[act] = e > worst[act] ? e : worst[act];
        vkd_buffer_destroy(g->dev, bg);
        if (!fused)
            vkd_buffer_destroy(g->dev, bu);
        vkd_buffer_destroy(g->dev, by);
        free(gt);
        if (!fused)
            free(u);
        free(ref);
    }
    fprintf(stderr, "  worst NMSE: swiglu %.2e (tolerance %.0e), geglu %.2e (%.0e)\n", worst[0], GLU_TOL, worst[1],
            GEGLU_TOL);
    vt_assert_clean(g);
}

/* The gated unit writing the down projection's F16 input (op_glu_xh): byte for byte op_half_x of
 * op_glu's output, SwiGLU and GeGLU, gate | up fused and apart, widths with tails of 0..3
 * (zero-filled up to 4 halves, into a buffer of NaN), 1 to 300 rows; refused
 * with a too small or misaligned xh, or xh in g's buffer. */
static void test_glu_xh(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    if (!g->dev->info.float16)
        skip();
    vt_rng r = vt_rng_seeded("op_glu_xh");
    static const uint32_t cols[] = {5, 38, 320, 1027, 64, 3};
    for (int t = 0; t < 12; t++) {
        const uint32_t act = t % 4 < 2 ? VKI_GLU_SILU : VKI_GLU_GELU_TANH, K = cols[t % 6];
        const uint32_t M = t == 7 ? 300 : (uint32_t)vt_range(&r, 1, 9);
        const bool fused = t % 2;
        const uint32_t gs = fused ? 2 * K + 1 : K + (uint32_t)vt_range(&r, 0, 3);
        const size_t ng = (size_t)M * gs + K, qb = op_half_x_bytes(M, K);
        float *gt = rand_buf(&r, ng, -12, 12), *u = rand_buf(&r, ng, -3, 3);
        vkd_buffer *bg = vt_buf_from(g, gt, ng * 4, "g"), *bu = vt_buf_from(g, u, ng * 4, "u");
        vkd_buffer *by = vt_buf_nan(g, (size_t)M * K * 4, "y");
        vkd_buffer *bq[2] = {vt_buf_nan(g, qb, "xh fused"), vt_buf_nan(g, qb, "xh apart")};
        op_mat mg = {vkd_whole(bg), 0, gs}, mu = fused ? (op_mat){vkd_whole(bg), K, gs} : (op_mat){vkd_whole(bu), 0, gs};
        vt_begin(g);
        assert_int_equal(op_glu_xh(&g->cmd, act, mg, mu, vkd_whole(bq[0]), M, K), VKI_OK);
        assert_int_equal(op_glu(&g->cmd, act, mg, mu, op_mat_rows(by, K), M, K), VKI_OK);
        vkd_barrier(&g->cmd);
        assert_int_equal(op_half_x(&g->cmd, vkd_whole(by), K, M, K, vkd_whole(bq[1])), VKI_OK);
        vt_submit_wait(g);
        uint8_t *a = malloc(qb), *b = malloc(qb);
        vt_download(g, bq[0], a, qb);
        vt_download(g, bq[1], b, qb);
        if (memcmp(a, b, qb))
            fail_msg("glu_xh %s %ux%u%s: the F16 rows differ from op_half_x's of op_glu's", act ? "geglu" : "swiglu",
                     M, K, fused ? " fused" : "");
        free(a), free(b), free(gt), free(u);
        vkd_buffer *all[] = {bg, bu, by, bq[0], bq[1]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            vkd_buffer_destroy(g->dev, all[i]);
    }
    vkd_buffer *b = vt_buf_nan(g, 4096 * 4, "b"), *h = vt_buf_nan(g, 4096, "h");
    op_mat m = {vkd_whole(b), 0, 64};
    vt_begin(g);
    assert_int_equal(op_glu_xh(&g->cmd, VKI_GLU_SILU, m, m, (vkd_view){h, 0, 255}, 2, 64),
                     VKI_ERR_INVALID_ARG); /* xh too small: 256 bytes */
    assert_int_equal(op_glu_xh(&g->cmd, VKI_GLU_SILU, m, m, (vkd_view){h, 4, 512}, 2, 64),
                     VKI_ERR_INVALID_ARG); /* xh not 8-aligned */
    assert_int_equal(op_glu_xh(&g->cmd, VKI_GLU_SILU, m, m, vkd_whole(b), 2, 64), VKI_ERR_INVALID_ARG); /* in g */
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vkd_buffer_destroy(g->dev, h);
    vt_assert_clean(g);
}

/* gpt-oss's experts' gated unit: the gate and up rows get their expert's biases (picked per
 * row by its id), then swiglu_oai (gate capped at 7, up clamped to [-7, 7] plus one), against
 * a double reference; values spread past the clamps on both sides. SiLU with the biases too. The
 * F16 variant (op_glu_xh_ex) is byte for byte op_half_x of op_glu_ex's rows. Biases shorter than
 * n_expert rows are refused. */
static void test_glu_expert_bias(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_glu expert bias");
    double worst = 0;
    static const uint32_t shapes[][3] = {{1, 5, 1}, {24, 64, 32}, {65, 33, 8}, {7, 1027, 4}}; /* rows, cols, E */
    for (size_t t = 0; t < 2 * sizeof shapes / sizeof shapes[0]; t++) {
        const uint32_t M = shapes[t / 2][0], K = shapes[t / 2][1], E = shapes[t / 2][2];
        const uint32_t act = t % 2 ? VKI_GLU_SILU : VKI_GLU_SWIGLU_OAI;
        float *gt = rand_buf(&r, (size_t)M * K, -12, 12), *u = rand_buf(&r, (size_t)M * K, -10, 10);
        float *gb = rand_buf(&r, (size_t)E * K, -2, 2), *ub = rand_buf(&r, (size_t)E * K, -2, 2);
        float *ref = malloc((size_t)M * K * sizeof *ref);
        int32_t *ids = malloc(M * sizeof *ids);
        for (uint32_t i = 0; i < M; i++)
            ids[i] = (int32_t)vt_range(&r, 0, E - 1);
        for (uint32_t i = 0; i < M; i++)
            for (uint32_t c = 0; c < K; c++) {
                double gv = (double)gt[(size_t)i * K + c] + gb[(size_t)ids[i] * K + c];
                double uv = (double)u[(size_t)i * K + c] + ub[(size_t)ids[i] * K + c];
                if (act == VKI_GLU_SWIGLU_OAI) {
                    double x = gv < 7 ? gv : 7, y = uv < -7 ? -7 : uv > 7 ? 7 : uv;
                    ref[(size_t)i * K + c] = (float)(x / (1 + exp(-1.702 * x)) * (y + 1));
                } else {
                    ref[(size_t)i * K + c] = (float)(gv / (1 + exp(-gv)) * uv);
                }
            }
        vkd_buffer *bg = vt_buf_from(g, gt, (size_t)M * K * 4, "g"), *bu = vt_buf_from(g, u, (size_t)M * K * 4, "u");
        vkd_buffer *bgb = vt_buf_from(g, gb, (size_t)E * K * 4, "gate bias");
        vkd_buffer *bub = vt_buf_from(g, ub, (size_t)E * K * 4, "up bias");
        vkd_buffer *bid = vt_buf_from(g, ids, M * 4, "ids"), *by = vt_buf_nan(g, (size_t)M * K * 4, "y");
        const size_t qb = op_half_x_bytes(M, K);
        const bool h16 = g->dev->info.float16;
        vkd_buffer *bq[2] = {vt_buf_nan(g, qb, "xh glu"), vt_buf_nan(g, qb, "xh half_x")};
        op_expert_bias eb = {vkd_whole(bid), {vkd_whole(bgb), vkd_whole(bub)}, E};
        vt_begin(g);
        assert_int_equal(op_glu_ex(&g->cmd, act, op_mat_rows(bg, K), op_mat_rows(bu, K), op_mat_rows(by, K), M, K, &eb),
                         VKI_OK);
        if (h16) {
            assert_int_equal(op_glu_xh_ex(&g->cmd, act, op_mat_rows(bg, K), op_mat_rows(bu, K), vkd_whole(bq[0]), M,
                                          K, &eb), VKI_OK);
            vkd_barrier(&g->cmd);
            assert_int_equal(op_half_x(&g->cmd, vkd_whole(by), K, M, K, vkd_whole(bq[1])), VKI_OK);
        }
        vt_submit_wait(g);
        char label[96];
        snprintf(label, sizeof label, "%s + expert biases %ux%u E=%u", act == VKI_GLU_SILU ? "swiglu" : "swiglu_oai", M,
                 K, E);
        double e = check_out(g, by, (size_t)M * K, (mshape){M, K, 0, K}, ref, GLU_TOL, label);
        worst = e > worst ? e : worst;
        if (h16) {
            uint8_t *a = malloc(qb), *b = malloc(qb);
            vt_download(g, bq[0], a, qb);
            vt_download(g, bq[1], b, qb);
            if (memcmp(a, b, qb))
                fail_msg("%s: the F16 rows differ from op_half_x's of op_glu_ex's", label);
            free(a), free(b);
        }
        vkd_buffer *all[] = {bg, bu, bgb, bub, bid, by, bq[0], bq[1]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            vkd_buffer_destroy(g->dev, all[i]);
        free(gt), free(u), free(gb), free(ub), free(ref), free(ids);
    }
    fprintf(stderr, "  expert-biased glu: worst NMSE %.2e (tolerance %.0e)\n", worst, GLU_TOL);
    vkd_buffer *b = vt_buf_nan(g, 4096 * 4, "b");
    op_mat m = {vkd_whole(b), 0, 64};
    op_expert_bias short_b = {vkd_whole(b), {vkd_whole(b), (vkd_view){b, 0, 64 * 4 * 3}}, 4}; /* up: 3 of 4 rows */
    vt_begin(g);
    assert_int_equal(op_glu_ex(&g->cmd, VKI_GLU_SWIGLU_OAI, m, m, m, 2, 64, &short_b), VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vt_assert_clean(g);
}

/* Scale (gemma's sqrt(d_model) on the embeddings), soft-cap (gemma 2's 30 tanh(x / 30) on the
 * logits) and GELU (starcoder2's FFN, on [-6, 6]), out of place and in place, with values far past
 * the cap. */
static void test_unary(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_unary");
    double worst[4] = {0, 0, 0, 0};
    for (int t = 0; t < N_SHAPES; t++) {
        uint32_t op = t % 3 == 2 ? (t % 2 ? VKI_UNARY_RELU2 : VKI_UNARY_GELU) : t % 2 ? VKI_UNARY_SOFTCAP : VKI_UNARY_SCALE;
        float a = op == VKI_UNARY_SOFTCAP ? (float[]){30.0f, 50.0f, 0.5f}[t % 3] : vt_uniform(&r, -60, 60);
        mshape xs = random_shape(&r, t, 9000), ys = xs;
        bool in_place = t % 4 >= 2;
        if (!in_place) {
            ys.off = vt_range(&r, 0, 5);
            ys.stride = xs.cols + vt_range(&r, 0, 3);
        }
        size_t nx = mshape_len(xs), ny = mshape_len(ys);
        const float amp = op >= VKI_UNARY_GELU ? 6 : 200; /* GELU: both tails and the bend */
        float *x = rand_buf(&r, nx, -amp, amp), *ref = malloc((size_t)xs.rows * xs.cols * sizeof *ref);
        for (uint32_t i = 0; i < xs.rows; i++)
            for (uint32_t c = 0; c < xs.cols; c++) {
                double v = x[xs.off + (size_t)i * xs.stride + c];
                ref[(size_t)i * xs.cols + c] =
                    (float)(op == VKI_UNARY_SOFTCAP ? a * tanh(v / a)
                            : op == VKI_UNARY_GELU  ? 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)))
                            : op == VKI_UNARY_RELU2 ? (v > 0 ? v * v : 0.0)
                                                    : (double)a * v);
            }
        vkd_buffer *bx = vt_buf_from(g, x, nx * 4, "x"), *by = in_place ? bx : vt_buf_nan(g, ny * 4, "y");
        vt_begin(g);
        assert_int_equal(op_unary(&g->cmd, op, a, mat_of(bx, xs), mat_of(by, ys), xs.rows, xs.cols), VKI_OK);
        vt_submit_wait(g);
        char label[96];
        snprintf(label, sizeof label, "%s %g %ux%u%s", (const char *[]){"scale", "softcap", "gelu", "relu2"}[op], a, xs.rows, xs.cols,
                 in_place ? " in place" : "");
        double e = check_result(g, by, in_place, in_place ? nx : ny, in_place ? xs : ys, ref, UNARY_TOL, x, label);
        worst[op] = e > worst[op] ? e : worst[op];
        if (!in_place)
            vkd_buffer_destroy(g->dev, by);
        vkd_buffer_destroy(g->dev, bx);
        free(x);
        free(ref);
    }
    fprintf(stderr, "  worst NMSE: scale %.2e, softcap %.2e, gelu %.2e, relu2 %.2e (tolerance %.0e)\n", worst[0],
            worst[1], worst[2], worst[3], UNARY_TOL);
    vt_assert_clean(g);
}

static void ref_softmax(const float *x, mshape s, float scale, float *out)
{
    for (uint32_t i = 0; i < s.rows; i++) {
        const float *row = x + s.off + (size_t)i * s.stride;
        double m = -INFINITY, sum = 0;
        for (uint32_t c = 0; c < s.cols; c++)
            m = fmax(m, (double)scale * row[c]);
        for (uint32_t c = 0; c < s.cols; c++)
            sum += m == -INFINITY ? 0 : exp((double)scale * row[c] - m);
        for (uint32_t c = 0; c < s.cols; c++)
            out[(size_t)i * s.cols + c] = m == -INFINITY ? 0.0f : (float)(exp((double)scale * row[c] - m) / sum);
    }
}

static void test_softmax(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_softmax");
    double worst = 0;
    for (int t = 0; t < N_SHAPES; t++) {
        mshape xs = random_shape(&r, t, t == 23 ? 50000 : 5000), ys = xs;
        if (t == 23)
            xs.cols = ys.cols = xs.stride = ys.stride = 50000; /* a vocabulary row */
        bool in_place = t % 3 == 1;
        if (!in_place) {
            ys.off = vt_range(&r, 0, 4);
            ys.stride = xs.cols + vt_range(&r, 0, 2);
        }
        size_t nx = mshape_len(xs), ny = mshape_len(ys);
        float scale = t % 2 ? vt_uniform(&r, 0.05f, 2.0f) : 1.0f;
        float *x = rand_buf(&r, nx, -15, 15);
        for (size_t i = 0; i < nx; i++) /* masked entries */
            if (vt_range(&r, 0, 9) == 0)
                x[i] = -INFINITY;
        if (xs.rows > 2) /* one fully masked row */
            for (uint32_t c = 0; c < xs.cols; c++)
                x[xs.off + xs.stride + c] = -INFINITY;
        float *ref = malloc((size_t)xs.rows * xs.cols * sizeof *ref);
        ref_softmax(x, xs, scale, ref);
        vkd_buffer *bx = vt_buf_from(g, x, nx * 4, "x"), *by = in_place ? bx : vt_buf_nan(g, ny * 4, "y");
        vt_begin(g);
        assert_int_equal(op_softmax(&g->cmd, mat_of(bx, xs), mat_of(by, ys), xs.rows, xs.cols, scale), VKI_OK);
        vt_submit_wait(g);
        char label[96];
        snprintf(label, sizeof label, "softmax %ux%u scale %g%s", xs.rows, xs.cols, scale, in_place ? " in place" : "");
        double e = check_result(g, by, in_place, in_place ? nx : ny, in_place ? xs : ys, ref, SOFTMAX_TOL, NULL, label);
        worst = e > worst ? e : worst;
        if (!in_place)
            vkd_buffer_destroy(g->dev, by);
        vkd_buffer_destroy(g->dev, bx);
        free(x);
        free(ref);
    }
    fprintf(stderr, "  worst NMSE: softmax %.2e (tolerance %.0e)\n", worst, SOFTMAX_TOL);
    vt_assert_clean(g);
}

/* The copy an RMSNorm writes of its rows for the next products, int8 (op_rmsnorm_xq) or F16
 * (op_rmsnorm_xh): y bit for bit op_rmsnorm's, the copy byte for byte what the separate pass
 * (op_quant_x8, op_half_x) writes from that y, on strided x and y at offsets, 1, 3 and 17 rows
 * of each of the widths cols; every other pair of cases a LayerNorm (op_norm_xh), with a bias
 * every fourth pair. */
static void rmsnorm_copy_cases(vt_gpu *g, vt_rng *r, const uint32_t cols[3], bool f16)
{
    static const uint32_t rows[] = {1, 3, 17};
    const char *name = f16 ? "rmsnorm_xh" : "rmsnorm_xq";
    for (int t = 0; t < 9; t++) {
        uint32_t M = rows[t % 3], K = cols[t / 3], xs = K + (uint32_t)vt_range(r, 0, 7), ys = K + 4 * (t % 2);
        uint32_t xo = (uint32_t)vt_range(r, 0, 5), yo = (uint32_t)vt_range(r, 0, 5);
        size_t nx = (size_t)xo + (size_t)M * xs, ny = (size_t)yo + (size_t)M * ys;
        size_t qb = f16 ? op_half_x_bytes(M, K) : op_quant_x8_bytes(M, K);
        float *x = rand_buf(r, nx, -3, 3), *w = rand_buf(r, 2 * K, -2, 2);
        vkd_buffer *bx = vt_buf_from(g, x, nx * 4, "x"), *bw = vt_buf_from(g, w, 2 * K * 4, "w");
        vkd_buffer *by[2] = {vt_buf_nan(g, ny * 4, "y copied"), vt_buf_nan(g, ny * 4, "y")};
        vkd_buffer *bq[2] = {vt_buf_nan(g, qb, "copy fused"), vt_buf_nan(g, qb, "copy apart")};
        vkd_buffer *yc = vt_buf_nan(g, (size_t)M * K * 4, "y packed");
        op_mat mx = {vkd_whole(bx), xo, xs}, my = {vkd_whole(by[0]), yo, ys};
        const uint32_t ln = (t / 2) % 2 ? VKI_NORM_MEAN | (t % 4 == 3 ? VKI_NORM_BIAS : 0u) : 0u;
        const vkd_view none = {0}, q0 = vkd_whole(bq[0]);
        vt_begin(g);
        assert_int_equal(op_norm_xh(&g->cmd, ln, mx, vkd_whole(bw), my, M, K, 1e-5f, f16 ? none : q0, f16 ? q0 : none),
                         VKI_OK);
        assert_int_equal(op_norm_xh(&g->cmd, ln, mx, vkd_whole(bw), (op_mat){vkd_whole(by[1]), yo, ys}, M, K, 1e-5f,
                                    none, none), VKI_OK);
        assert_int_equal(op_norm_xh(&g->cmd, ln, mx, vkd_whole(bw), op_mat_rows(yc, K), M, K, 1e-5f, none, none),
                         VKI_OK);
        vkd_barrier(&g->cmd);
        assert_int_equal(f16 ? op_half_x(&g->cmd, vkd_whole(yc), K, M, K, vkd_whole(bq[1]))
                             : op_quant_x8(&g->cmd, vkd_whole(yc), K, M, K, vkd_whole(bq[1])),
                         VKI_OK);
        vt_submit_wait(g);
        uint8_t *a = malloc(ny * 4 > qb ? ny * 4 : qb), *b = malloc(ny * 4 > qb ? ny * 4 : qb);
        vt_download(g, by[0], a, ny * 4);
        vt_download(g, by[1], b, ny * 4);
        if (memcmp(a, b, ny * 4))
            fail_msg("%s %ux%u: y differs from op_rmsnorm's", name, M, K);
        vt_download(g, bq[0], a, qb);
        vt_download(g, bq[1], b, qb);
        if (memcmp(a, b, qb))
            fail_msg("%s %ux%u: the %s rows differ from %s's", name, M, K, f16 ? "F16" : "quantised",
                     f16 ? "op_half_x" : "op_quant_x8");
        free(a), free(b), free(x), free(w);
        vkd_buffer *all[] = {bx, bw, by[0], by[1], bq[0], bq[1], yc};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            vkd_buffer_destroy(g->dev, all[i]);
    }
}

/* The elementwise ops that also quantise their output for the integer-dot products
 * (op_unary_xq; starcoder2's GELU before its down projection): y bit for bit op_unary's, in place
 * and out of place at offsets, the int8 rows byte for byte op_quant_x8's from that y, 1, 3 and 17
 * rows of 32, 96 and 1024 columns; refused for a width that is no multiple of 32 or a too small
 * xq. */
static void test_unary_xq(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_unary_xq");
    static const uint32_t rows[] = {1, 3, 17}, cols[] = {32, 96, 1024};
    static const uint32_t ops[] = {VKI_UNARY_GELU, VKI_UNARY_RELU2, VKI_UNARY_SOFTCAP};
    for (int t = 0; t < 9; t++) {
        const uint32_t M = rows[t % 3], K = cols[t / 3], op = ops[t % 3];
        const float a = op == VKI_UNARY_SCALE ? 0.7f : 4.0f;
        const bool in_place = t % 2;
        uint32_t xo = (uint32_t)vt_range(&r, 0, 5), xs = K + (uint32_t)vt_range(&r, 0, 7);
        size_t nx = (size_t)xo + (size_t)M * xs, qb = op_quant_x8_bytes(M, K);
        float *x = rand_buf(&r, nx, -6, 6);
        vkd_buffer *bx = vt_buf_from(g, x, nx * 4, "x"), *by = in_place ? bx : vt_buf_nan(g, nx * 4, "y");
        vkd_buffer *bref = vt_buf_nan(g, (size_t)M * K * 4, "y apart");
        vkd_buffer *bq[2] = {vt_buf_nan(g, qb, "copy fused"), vt_buf_nan(g, qb, "copy apart")};
        op_mat mx = {vkd_whole(bx), xo, xs}, my = {vkd_whole(by), xo, xs};
        vt_begin(g);
        assert_int_equal(op_unary(&g->cmd, op, a, mx, op_mat_rows(bref, K), M, K), VKI_OK); /* before x changes */
        vkd_barrier(&g->cmd);
        assert_int_equal(op_unary_xq(&g->cmd, op, a, mx, my, M, K, vkd_whole(bq[0])), VKI_OK);
        assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bref), K, M, K, vkd_whole(bq[1])), VKI_OK);
        vt_submit_wait(g);
        float *y = malloc(nx * 4), *yr = malloc((size_t)M * K * 4);
        uint8_t *q0 = malloc(qb), *q1 = malloc(qb);
        vt_download(g, by, y, nx * 4);
        vt_download(g, bref, yr, (size_t)M * K * 4);
        for (uint32_t i = 0; i < M; i++)
            if (memcmp(y + xo + (size_t)i * xs, yr + (size_t)i * K, K * 4))
                fail_msg("unary_xq op %u %ux%u%s: row %u differs from op_unary's", op, M, K,
                         in_place ? " in place" : "", i);
        vt_download(g, bq[0], q0, qb);
        vt_download(g, bq[1], q1, qb);
        if (memcmp(q0, q1, qb))
            fail_msg("unary_xq op %u %ux%u: the quantised rows differ from op_quant_x8's", op, M, K);
        free(x), free(y), free(yr), free(q0), free(q1);
        vkd_buffer *all[] = {bx, bref, bq[0], bq[1]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            vkd_buffer_destroy(g->dev, all[i]);
        if (!in_place)
            vkd_buffer_destroy(g->dev, by);
    }
    vkd_buffer *b = vt_buf_nan(g, 4096 * 4, "b"), *q = vt_buf_nan(g, 4096, "q");
    vt_begin(g);
    op_mat m48 = {vkd_whole(b), 0, 48}, m64 = {vkd_whole(b), 0, 64};
    assert_int_equal(op_unary_xq(&g->cmd, VKI_UNARY_GELU, 0, m48, m48, 2, 48, vkd_whole(q)),
                     VKI_ERR_INVALID_ARG); /* 48 columns */
    assert_int_equal(op_unary_xq(&g->cmd, VKI_UNARY_GELU, 0, m64, m64, 2, 64, (vkd_view){q, 0, 16}),
                     VKI_ERR_INVALID_ARG); /* xq too small */
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vkd_buffer_destroy(g->dev, q);
    vt_assert_clean(g);
}

/* RMSNorm that also quantises its rows for the integer-dot products (op_rmsnorm_xq):
 * rmsnorm_copy_cases at widths 32, 320, 1024; refused for a width that is no multiple of 32, in
 * place, or a too small xq. */
static void test_rmsnorm_xq(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("op_rmsnorm_xq");
    static const uint32_t cols[] = {32, 320, 1024};
    rmsnorm_copy_cases(g, &r, cols, false);
    vkd_buffer *b = vt_buf_nan(g, 4096 * 4, "b"), *q = vt_buf_nan(g, 4096, "q");
    vt_begin(g);
    op_mat m48 = {vkd_whole(b), 0, 48}, m64 = {vkd_whole(b), 0, 64};
    assert_int_equal(op_rmsnorm_xq(&g->cmd, m48, vkd_whole(b), (op_mat){vkd_whole(q), 0, 48}, 2, 48, 1e-5f,
                                   vkd_whole(q)), VKI_ERR_INVALID_ARG); /* 48 columns */
    assert_int_equal(op_rmsnorm_xq(&g->cmd, m64, vkd_whole(b), m64, 2, 64, 1e-5f, vkd_whole(q)),
                     VKI_ERR_INVALID_ARG); /* in place */
    assert_int_equal(op_rmsnorm_xq(&g->cmd, m64, vkd_whole(b), (op_mat){vkd_whole(q), 0, 64}, 2, 64, 1e-5f,
                                   (vkd_view){b, 0, 16}), VKI_ERR_INVALID_ARG); /* xq too small */
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vkd_buffer_destroy(g->dev, q);
    vt_assert_clean(g);
}

/* RMSNorm that also rounds its rows to F16 for the tensor-core GEMMs (op_rmsnorm_xh):
 * rmsnorm_copy_cases at widths 5, 38, 320 (tails of 1..3 zero-filled); refused in place, with
 * quantised rows too, a too small or misaligned xh. */
static void test_rmsnorm_xh(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    if (!g->dev->info.float16)
        skip();
    vt_rng r = vt_rng_seeded("op_rmsnorm_xh");
    static const uint32_t cols[] = {5, 38, 320};
    rmsnorm_copy_cases(g, &r, cols, true);
    vkd_buffer *b = vt_buf_nan(g, 4096 * 4, "b"), *h = vt_buf_nan(g, 4096, "h"), *q = vt_buf_nan(g, 4096, "q");
    vt_begin(g);
    op_mat m64 = {vkd_whole(b), 0, 64}, o64 = {vkd_whole(q), 0, 64};
    assert_int_equal(op_rmsnorm_xh(&g->cmd, m64, vkd_whole(b), m64, 2, 64, 1e-5f, (vkd_view){0}, vkd_whole(h)),
                     VKI_ERR_INVALID_ARG); /* in place */
    assert_int_equal(op_rmsnorm_xh(&g->cmd, m64, vkd_whole(b), o64, 2, 64, 1e-5f, vkd_whole(q), vkd_whole(h)),
                     VKI_ERR_INVALID_ARG); /* with quantised rows */
    assert_int_equal(op_rmsnorm_xh(&g->cmd, m64, vkd_whole(b), o64, 2, 64, 1e-5f, (vkd_view){0}, (vkd_view){h, 0, 255}),
                     VKI_ERR_INVALID_ARG); /* xh too small: 256 bytes */
    assert_int_equal(op_rmsnorm_xh(&g->cmd, m64, vkd_whole(b), o64, 2, 64, 1e-5f, (vkd_view){0}, (vkd_view){h, 4, 512}),
                     VKI_ERR_INVALID_ARG); /* xh not 8-aligned */
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vkd_buffer_destroy(g->dev, h);
    vkd_buffer_destroy(g->dev, q);
    vt_assert_clean(g);
}

/* Shapes that do not fit their buffers are refused and record nothing. */
static void test_bad_shapes(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vkd_buffer *b = vt_buf_nan(g, 64 * 4, "b");
    op_mat m = {vkd_whole(b), 0, 8};
    vt_begin(g);
    assert_int_equal(op_rmsnorm(&g->cmd, m, vkd_whole(b), m, 9, 8, 1e-5f), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_softmax(&g->cmd, m, (op_mat){vkd_whole(b), 1, 8}, 8, 8, 1.0f), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_softmax(&g->cmd, m, m, 2, 8, 0.0f), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_glu(&g->cmd, VKI_GLU_SILU, m, m, (op_mat){vkd_whole(b), 0, 4}, 2, 8), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_glu(&g->cmd, 7, m, m, m, 2, 8), VKI_ERR_INVALID_ARG); /* unknown activation */
    assert_int_equal(op_unary(&g->cmd, VKI_UNARY_SOFTCAP, 0.0f, m, m, 2, 8), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_unary(&g->cmd, VKI_UNARY_SCALE, NAN, m, m, 2, 8), VKI_ERR_INVALID_ARG);
    op_rope_p rp = {.n_tokens = 2, .n_heads = 2, .head_dim = 8, .n_rot = 10};
    assert_int_equal(op_rope(&g->cmd, &rp, m, m, vkd_whole(b), vkd_whole(b)), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_add(&g->cmd, vkd_whole(b), vkd_whole(b), vkd_whole(b), 65), VKI_ERR_INVALID_ARG);
    vkd_buffer *b2 = vt_buf_nan(g, 64 * 4, "b2");
    assert_int_equal(op_copy(&g->cmd, vkd_whole(b), vkd_whole(b2), 6), VKI_ERR_INVALID_ARG);  /* not words */
    assert_int_equal(op_copy(&g->cmd, vkd_whole(b), vkd_whole(b2), 260), VKI_ERR_INVALID_ARG); /* too long */
    assert_int_equal(op_copy(&g->cmd, (vkd_view){b, 4, VK_WHOLE_SIZE}, vkd_whole(b2), 8), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_copy(&g->cmd, (vkd_view){b, 0, 64}, (vkd_view){b, 48, 64}, 64), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_copy(&g->cmd, (vkd_view){b, 0, 64}, (vkd_view){b, 64, 64}, 64), VKI_OK);
    assert_int_equal(op_softmax(&g->cmd, m, m, 0, 8, 1.0f), VKI_OK); /* empty: nothing recorded */
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vkd_buffer_destroy(g->dev, b2);
    vt_assert_clean(g);
}

/* The row kernels' workgroup on a GPU (256 invocations per row; a CPU device gets 64): the
 * RMSNorm and softmax cases again with the device presented as a discrete NVIDIA GPU, which
 * lavapipe runs as it is (the kernels size their reduction by the workgroup, not the subgroup). */
static void test_gpu_configs(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vki_device_info saved = g->dev->info;
    if (saved.max_workgroup_invocations < 256)
        skip();
    g->dev->info.type = VKI_DEVICE_DISCRETE;
    g->dev->info.vendor_id = 0x10DE;
    test_rmsnorm(state);
    test_rmsnorm_xq(state);
    test_softmax(state);
    g->dev->info = saved;
}

static void test_prepare(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    assert_int_equal(op_basic_prepare(g->dev), VKI_OK);
    vt_assert_clean(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rmsnorm_xq),
        cmocka_unit_test(test_rmsnorm_xh),
        cmocka_unit_test(test_glu_xh),
        cmocka_unit_test(test_glu_expert_bias),
        cmocka_unit_test(test_rope_freqs_table),
        cmocka_unit_test(test_rope_yarn_table),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_glu),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_unary_xq),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_gpu_configs),
    };
    return cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
}
