/* Mixture-of-experts kernels (engine/ops_moe.c, op_matmul_id in engine/ops_matmul.c) against
 * scalar references, and the GGUF MoE layouts' checks (engine/model_meta.c).
 *
 *  - moe_topk: ids exactly those of ref_moe_route (ties included: the lower expert first),
 *    weights by NMSE <= TOL_W (exp and the sum in F32 vs double), E from 1 to 512, k up
 *    to 32, 1 / 7 / 65 tokens, with and without renormalisation;
 *  - moe_group: the route bit for bit (stable grouping), experts never chosen, every pair on one
 *    expert, ids out of range left out;
 *  - matmul_id on the matrix-vector kernel and the tiled FP32 GEMM for every weight type, on the
 *    emulated cooperative-matrix GEMM for F16, Q4_0 and Q4_K: 1, 7 and 65 (tile + 1) tokens, gate/up
 *    (X = token rows) and down (X = pair rows), unused experts, all tokens on one expert,
 *    weights in parts of whole experts; NMSE <= TOL_FLOAT / TOL_QUANT (coopmat: TOL_CME against
 *    a reference that rounds both operands to F16, as the kernel stages them);
 *  - moe_combine: squared error <= TOL_C of the terms' magnitudes.
 * Outputs start as NaN, so unwritten elements fail. */
#include "support/ref_model.h"
#include "support/vt.h"

#include <unistd.h>

#include "engine/model_meta.h"
#include "engine/ops_matmul.h"
#include "engine/ops_moe.h"
#include "engine/quant.h"
#include "engine/synth.h"
#include "engine/tensor.h"
#include "support/gguf_edit.h"

#define TOL_W 1e-11     /* router weights: measured <= 1.6e-12 over 30 runs (F32 sum of up to 512 exps) */
#define TOL_C 1e-13     /* the combine, of the terms' magnitudes: measured <= 4.2e-15 (10 seeds) */
static double worst_w, worst_c, worst_id[4]; /* worst NMSE seen; matmul_id: float, quantised, coopmat,
                                              integer dot */
#define TOL_FLOAT 1e-12 /* matmul_id, F32/F16/BF16 weights: measured <= 5.2e-14 over 8 runs */
#define TOL_QUANT 1e-11 /* matmul_id, quantised weights (quantiser-made blocks): measured <= 2.8e-13 */
#define TOL_CME 1e-11   /* emulated coopmat against the F16-rounded reference: measured <= 2.8e-13 */

static vkd_view whole(vkd_buffer *b) { return vkd_whole(b); }

/* ---- top-k ----------------------------------------------------------------------------------- */

static void topk_case(vt_gpu *g, vt_rng *r, uint32_t T, uint32_t E, uint32_t k, bool norm, bool ties)
{
    float *logits = malloc((size_t)T * E * sizeof *logits), *w = malloc((size_t)T * k * 4), *wref = malloc((size_t)T * k * 4);
    int32_t *ids = malloc((size_t)T * k * 4), *iref = malloc((size_t)T * k * 4);
    vt_fill_uniform(r, logits, (size_t)T * E, -4.0f, 4.0f);
    for (size_t i = 0; ties && i < (size_t)T * E; i++) /* a few values only: many exact ties */
        logits[i] = (float)(int)(logits[i]);
    vkd_buffer *bl = vt_buf_from(g, logits, (size_t)T * E * 4, "logits");
    vkd_buffer *bi = vt_buf_nan(g, (size_t)T * k * 4, "ids"), *bw = vt_buf_nan(g, (size_t)T * k * 4, "weights");
    vt_begin(g);
    assert_int_equal(op_moe_topk(&g->cmd, whole(bl), T, E, k, norm, whole(bi), whole(bw)), VKI_OK);
    vt_submit_wait(g);
    vt_download(g, bi, ids, (size_t)T * k * 4);
    vt_download(g, bw, w, (size_t)T * k * 4);
    for (uint32_t t = 0; t < T; t++)
        ref_moe_route(logits + (size_t)t * E, E, k, norm, iref + (size_t)t * k, wref + (size_t)t * k);
    char label[96];
    snprintf(label, sizeof label, "topk T=%u E=%u k=%u norm=%d ties=%d", T, E, k, norm, ties);
    for (size_t i = 0; i < (size_t)T * k; i++)
        if (ids[i] != iref[i])
            fail_msg("%s: pair %zu: expert %d, reference %d", label, i, ids[i], iref[i]);
    double e = vt_nmse(w, wref, (size_t)T * k);
    worst_w = e > worst_w ? e : worst_w;
    vt_assert_nmse(w, wref, (size_t)T * k, TOL_W, label);
    vkd_buffer_destroy(g->dev, bl), vkd_buffer_destroy(g->dev, bi), vkd_buffer_destroy(g->dev, bw);
    free(logits), free(w), free(wref), free(ids), free(iref);
}

static void test_topk(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("moe topk");
    static const uint32_t shapes[][3] = {{1, 8, 2}, {7, 128, 8}, {65, 7, 7}, {3, 1, 1}, {1, 512, 32}, {9, 129, 1},
                                         {64, 60, 4}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int norm = 0; norm < 2; norm++)
            topk_case(g, &r, shapes[i][0], shapes[i][1], shapes[i][2], norm, i == 1 || i == 6);
    for (int i = 0; i < 4; i++) {
        uint32_t E = vt_range(&r, 1, 300), k = vt_range(&r, 1, E < 32 ? E : 32);
        topk_case(g, &r, vt_range(&r, 1, 100), E, k, vt_range(&r, 0, 1), vt_range(&r, 0, 1));
    }
    fprintf(stderr, "  topk weights: worst NMSE %.2e (tolerance %.0e)\n", worst_w, TOL_W);
    vt_assert_clean(g);
}

/* ---- grouping -------------------------------------------------------------------------------- */

/* route as moe_group defines it: offsets of each expert's pairs, then the pairs by expert in
 * pair order; ids outside [0, E) left out. */
static void group_ref(const int32_t *ids, uint32_t n, uint32_t E, uint32_t *route)
{
    uint32_t o = 0;
    for (uint32_t e = 0; e < E; e++) {
        route[e] = o;
        for (uint32_t i = 0; i < n; i++)
            if (ids[i] == (int32_t)e)
                route[E + 1 + o++] = i;
    }
    route[E] = o;
}

static void group_case(vt_gpu *g, const int32_t *ids, uint32_t n, uint32_t E, const char *label)
{
    uint32_t *route = malloc((E + 1 + (size_t)n) * 4), *want = malloc((E + 1 + (size_t)n) * 4);
    group_ref(ids, n, E, want);
    vkd_buffer *bi = vt_buf_from(g, ids, (size_t)n * 4, "ids"), *br = vt_buf_nan(g, (E + 1 + (size_t)n) * 4, "route");
    vt_begin(g);
    assert_int_equal(op_moe_group(&g->cmd, whole(bi), n, E, whole(br)), VKI_OK);
    vt_submit_wait(g);
    size_t used = E + 1 + (size_t)want[E]; /* entries past the listed pairs stay unwritten */
    vt_download(g, br, route, used * 4);
    for (size_t i = 0; i < used; i++)
        if (route[i] != want[i])
            fail_msg("%s: route[%zu] = %u, reference %u", label, i, route[i], want[i]);
    vkd_buffer_destroy(g->dev, bi), vkd_buffer_destroy(g->dev, br);
    free(route), free(want);
}

static void test_group(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("moe group");
    int32_t *ids = malloc(4096 * 4);
    for (int c = 0; c < 8; c++) {
        uint32_t E = c == 0 ? 1 : c == 1 ? 512 : vt_range(&r, 2, 200), n = c == 2 ? 1 : vt_range(&r, 2, 4096);
        uint32_t used = c == 3 ? 1 : vt_range(&r, 1, E); /* experts actually chosen: the rest never are */
        for (uint32_t i = 0; i < n; i++)
            ids[i] = (int32_t)vt_range(&r, 0, used - 1);
        if (c == 4) /* ids outside [0, E) are left out */
            ids[0] = -1, ids[n - 1] = (int32_t)E;
        char label[64];
        snprintf(label, sizeof label, "group n=%u E=%u chosen=%u", n, E, used);
        group_case(g, ids, n, E, label);
    }
    free(ids);
    vt_assert_clean(g);
}

/* ---- the experts' matmul --------------------------------------------------------------------- */

typedef struct id_case {
    uint32_t T, E, k;     /* tokens, experts, experts per token */
    uint32_t N, K;        /* rows per expert, row length */
    bool down;            /* X = pair rows (x_div 1), else token rows (x_div k) */
    uint32_t one;         /* 1: every token picks expert 0 among its k (all on one expert) */
    bool parts;           /* weights split in parts of whole experts */
    op_mm_path path;
} id_case;

static float round16(float v) { return quant_f16_to_f32(quant_f32_to_f16(v)); }

static void id_reference(const id_case *s, const float *x, const float *w, const int32_t *ids, bool f16, float *y)
{
    uint32_t P = s->T * s->k, xdiv = s->down ? 1 : s->k;
    for (uint32_t p = 0; p < P; p++)
        for (uint32_t n = 0; n < s->N; n++) {
            const float *xr = x + (size_t)(p / xdiv) * s->K, *wr = w + ((size_t)ids[p] * s->N + n) * s->K;
            double acc = 0;
            for (uint32_t kk = 0; kk < s->K; kk++)
                acc += f16 ? (double)round16(xr[kk]) * round16(wr[kk]) : (double)xr[kk] * wr[kk];
            y[(size_t)p * s->N + n] = (float)acc;
        }
}

/* Each token's k distinct experts: random, or expert 0 first (all tokens share it). */
static void random_ids(vt_rng *r, const id_case *s, int32_t *ids)
{
    for (uint32_t t = 0; t < s->T; t++)
        for (uint32_t j = 0; j < s->k; j++) {
            int32_t e;
            bool dup;
            do {
                e = s->one && j == 0 ? 0 : (int32_t)vt_range(r, s->one ? 1 : 0, s->E - 1);
                dup = false;
                for (uint32_t i = 0; i < j; i++)
                    dup |= ids[t * s->k + i] == e;
            } while (dup);
            ids[t * s->k + j] = e;
        }
}

/* The integer-dot path of the experts' matvec (int_dot) on four of its weight types (one per
 * kind of integer block: Q8_0 plain, Q4_K with offsets, Q6_K signed, and MXFP4, the experts'
 * format of gpt-oss files; every type's block decoding is test_matmul's matvec_i8): X quantised by quant_x8, the product against a reference over
 * the device's own int8 X (dequantised from the bytes and scales it wrote), so only the
 * kernel's arithmetic is measured. */
#define TOL_I8 1e-12 /* measured on lavapipe: <= 1.9e-14 */
static bool i8_type(uint32_t type)
{
    return type == VKI_GGML_Q8_0 || type == VKI_GGML_Q4_K || type == VKI_GGML_Q6_K || type == VKI_GGML_MXFP4;
}

static void id_case_i8(vt_gpu *g, const id_case *s, uint32_t type, const vk_tensor *t, vkd_buffer *bx,
                       vkd_buffer *bi, const float *w, const int32_t *ids, const char *label)
{
    const uint32_t P = s->T * s->k, rows_x = s->down ? P : s->T, K = s->K;
    const uint64_t qb = op_quant_x8_bytes(rows_x, K);
    vkd_buffer *bq = vt_buf_nan(g, qb, "xq"), *by = vt_buf_nan(g, (size_t)P * s->N * 4, "y i8");
    vt_begin(g);
    assert_int_equal(op_quant_x8(&g->cmd, whole(bx), K, rows_x, K, whole(bq)), VKI_OK);
    vkd_barrier(&g->cmd);
    assert_int_equal(op_matmul_id_i8(&g->cmd, t, s->E, whole(bi), whole(bq), s->down ? 1 : s->k, whole(by), s->N, P),
                     VKI_OK);
    vt_submit_wait(g);
    uint8_t *q = malloc(qb);
    float *xh = malloc((size_t)rows_x * K * 4), *y = malloc((size_t)P * s->N * 4), *ref = malloc((size_t)P * s->N * 4);
    vt_download(g, bq, q, qb);
    vt_download(g, by, y, (size_t)P * s->N * 4);
    const float *scales = (const float *)(q + (size_t)rows_x * K); /* after the [rows][K] int8 bytes */
    for (uint32_t row = 0; row < rows_x; row++)
        for (uint32_t kk = 0; kk < K; kk++)
            xh[(size_t)row * K + kk] = scales[(size_t)row * (K / 32) + kk / 32] * (float)(int8_t)q[(size_t)row * K + kk];
    id_reference(s, xh, w, ids, false, ref);
    char l8[200];
    snprintf(l8, sizeof l8, "%s, integer dot", label);
    double e = vt_nmse(y, ref, (size_t)P * s->N);
    worst_id[3] = e > worst_id[3] ? e : worst_id[3];
    vt_assert_nmse(y, ref, (size_t)P * s->N, TOL_I8, l8);
    vkd_buffer_destroy(g->dev, bq), vkd_buffer_destroy(g->dev, by);
    free(q), free(xh), free(y), free(ref);
}

static void id_case_run(vt_gpu *g, vt_rng *r, uint32_t type, const id_case *s)
{
    const uint32_t P = s->T * s->k, rows_x = s->down ? P : s->T, W_rows = s->E * s->N;
    size_t rb = quant_row_bytes(type, s->K);
    float *w = malloc((size_t)W_rows * s->K * 4), *x = malloc((size_t)rows_x * s->K * 4), *tmp = malloc(s->K * 4);
    uint8_t *raw = malloc(rb * W_rows);
    for (uint32_t n = 0; n < W_rows; n++) {
        vt_fill_uniform(r, tmp, s->K, -1.0f, 1.0f);
        quant_row(type, tmp, raw + n * rb, s->K);
        dequant_row(type, raw + n * rb, w + (size_t)n * s->K, s->K);
    }
    vt_fill_uniform(r, x, (size_t)rows_x * s->K, -1.0f, 1.0f);
    int32_t *ids = malloc(P * 4);
    uint32_t *route = malloc((s->E + 1 + (size_t)P) * 4);
    random_ids(r, s, ids);
    group_ref(ids, P, s->E, route);
    vk_tensor t;
    /* about 3 parts of whole experts */
    size_t part = s->parts ? quant_dev_row_bytes(type, s->K) * s->N * ((s->E + 2) / 3) : 0;
    assert_int_equal(vk_tensor_create_grouped(g->dev, type, s->K, W_rows, s->N, part, "experts", &t), VKI_OK);
    assert_true(!s->parts || s->E < 3 || t.n_parts > 1);
    assert_int_equal(vk_tensor_upload(g->dev, &t, raw), VKI_OK);
    vkd_buffer *bx = vt_buf_from(g, x, (size_t)rows_x * s->K * 4, "x"), *bi = vt_buf_from(g, ids, P * 4, "ids");
    vkd_buffer *br = vt_buf_from(g, route, (s->E + 1 + (size_t)P) * 4, "route");
    vkd_buffer *by = vt_buf_nan(g, (size_t)P * s->N * 4, "y");
    vt_begin(g);
    assert_int_equal(op_matmul_id(&g->cmd, &t, s->E, whole(bi), whole(br), whole(bx), s->K, s->down ? 1 : s->k,
                                  whole(by), s->N, P, s->T, s->path), VKI_OK);
    vt_submit_wait(g);
    float *y = malloc((size_t)P * s->N * 4), *ref = malloc((size_t)P * s->N * 4);
    vt_download(g, by, y, (size_t)P * s->N * 4);
    bool cm = s->path == OP_MM_COOPMAT;
    id_reference(s, x, w, ids, cm, ref);
    char label[160];
    snprintf(label, sizeof label, "%s %s T=%u E=%u k=%u N=%u K=%u %s%s parts=%u", quant_get(type)->name,
             s->path == OP_MM_GEMV ? "gemv" : cm ? "coopmat-emulated" : "gemm", s->T, s->E, s->k, s->N, s->K,
             s->down ? "down" : "gate/up", s->one ? " one-expert" : "", t.n_parts);
    int cls = cm ? 2 : vt_is_float_type(type) ? 0 : 1;
    double e = vt_nmse(y, ref, (size_t)P * s->N);
    worst_id[cls] = e > worst_id[cls] ? e : worst_id[cls];
    vt_assert_nmse(y, ref, (size_t)P * s->N, cm ? TOL_CME : cls == 0 ? TOL_FLOAT : TOL_QUANT, label);
    if (s->path == OP_MM_GEMV && i8_type(type) && op_matmul_i8_supported(g->dev, type))
        id_case_i8(g, s, type, &t, bx, bi, w, ids, label);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, bx), vkd_buffer_destroy(g->dev, bi), vkd_buffer_destroy(g->dev, br);
    vkd_buffer_destroy(g->dev, by);
    free(w), free(x), free(tmp), free(raw), free(ids), free(route), free(y), free(ref);
}

/* Four cases per path: 1 token, 7 tokens with a down projection, 65 tokens (one past lavapipe's
 * 64-row tile) all sharing expert 0, and a random one over parts of whole experts. */
static void run_id_path(vt_gpu *g, vt_rng *r, uint32_t type, op_mm_path path)
{
    uint32_t bl = quant_get(type)->block_elems, kb = bl == 1 ? 33 : bl;
    const id_case cases[] = {
        {1, 8, 2, 7, kb, false, 0, false, path},
        {7, 16, 4, 9, 2 * kb, true, 0, false, path},
        {65, 6, 2, 17, kb, false, 1, false, path},
        {vt_range(r, 2, 20), vt_range(r, 3, 12), 2, vt_range(r, 1, 70), kb * vt_range(r, 1, 3), vt_range(r, 0, 1), 0,
         true, path},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        id_case_run(g, r, type, &cases[i]);
}

static void run_id_type(void **state, uint32_t type)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded(quant_get(type)->name);
    run_id_path(g, &r, type, OP_MM_GEMV);
    run_id_path(g, &r, type, OP_MM_GEMM);
    /* the emulated coopmat GEMM for one type per block size (the dequantising stage it shares
     * with matmul_cme runs every type in test_matmul): each of its pipelines takes lavapipe
     * ~10 s to compile cold */
    bool cm_type = type == VKI_GGML_F16 || type == VKI_GGML_Q4_0 || type == VKI_GGML_Q4_K;
    vkd_cm saved = g->dev->cm;
    if (cm_type && vkd_coopmat_select(g->dev, VKI_COOPMAT_EMULATED) == VKI_OK)
        run_id_path(g, &r, type, OP_MM_COOPMAT);
    else if (cm_type)
        fprintf(stderr, "  no emulated cooperative-matrix path (needs shaderFloat16): skipped\n");
    g->dev->cm = saved;
    fprintf(stderr, "  matmul_id worst NMSE so far: float %.2e, quantised %.2e, coopmat %.2e, integer dot %.2e\n",
            worst_id[0], worst_id[1], worst_id[2], worst_id[3]);
    vt_assert_clean(g);
}

#define TYPE_TEST(T, t)                                                                           \
    static void test_matmul_id_##t(void **state) { run_id_type(state, VKI_GGML_##T); }
VKK_WEIGHT_TYPES(TYPE_TEST)

/* ---- combine --------------------------------------------------------------------------------- */

/* The weighted sum back into x; odd cases with gpt-oss's down biases, each pair's expert's row
 * added to its output first (ids random over E experts). The error is judged against the terms'
 * magnitudes (|x| + sum w (|o| + |b|)), not the result's: a sum that cancels (d = 1, two pairs:
 * seed 110988046121244 gave 0.224250674 for 0.224250823, half an ulp of its terms ~3, and an
 * NMSE of 2.8e-13 against the result) is as exact as float sums get. */
static void test_combine(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("moe combine");
    static const uint32_t shapes[][3] = {{1, 1, 7}, {7, 8, 64}, {65, 2, 33}, {3, 32, 256}, {9, 4, 45}, {2, 2, 1}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        uint32_t T = shapes[c][0], k = shapes[c][1], d = shapes[c][2], E = 5;
        const bool with_bias = c % 2;
        float *o = malloc((size_t)T * k * d * 4), *w = malloc((size_t)T * k * 4), *x = malloc((size_t)T * d * 4);
        float *ref = malloc((size_t)T * d * 4), *got = malloc((size_t)T * d * 4), *bias = malloc((size_t)E * d * 4);
        double *mag = malloc((size_t)T * d * sizeof *mag);
        int32_t *ids = malloc((size_t)T * k * 4);
        vt_fill_uniform(&r, o, (size_t)T * k * d, -2.0f, 2.0f);
        vt_fill_uniform(&r, w, (size_t)T * k, 0.0f, 1.0f);
        vt_fill_uniform(&r, x, (size_t)T * d, -1.0f, 1.0f);
        vt_fill_uniform(&r, bias, (size_t)E * d, -1.0f, 1.0f);
        for (size_t p = 0; p < (size_t)T * k; p++)
            ids[p] = (int32_t)vt_range(&r, 0, E - 1);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t i = 0; i < d; i++) {
                double s = 0, m = fabs((double)x[(size_t)t * d + i]);
                for (uint32_t j = 0; j < k; j++) {
                    size_t p = (size_t)t * k + j;
                    double b = with_bias ? bias[(size_t)ids[p] * d + i] : 0;
                    s += (double)w[p] * ((double)o[p * d + i] + b);
                    m += (double)w[p] * (fabs((double)o[p * d + i]) + fabs(b));
                }
                ref[(size_t)t * d + i] = (float)(x[(size_t)t * d + i] + s);
                mag[(size_t)t * d + i] = m;
            }
        vkd_buffer *bo = vt_buf_from(g, o, (size_t)T * k * d * 4, "o"), *bw = vt_buf_from(g, w, (size_t)T * k * 4, "w");
        vkd_buffer *bx = vt_buf_from(g, x, (size_t)T * d * 4, "x");
        vkd_buffer *bb = vt_buf_from(g, bias, (size_t)E * d * 4, "down bias");
        vkd_buffer *bi = vt_buf_from(g, ids, (size_t)T * k * 4, "ids");
        op_expert_bias eb = {whole(bi), {whole(bb)}, E};
        vt_begin(g);
        assert_int_equal(op_moe_combine(&g->cmd, whole(bo), whole(bw), whole(bx), T, k, d, with_bias ? &eb : NULL),
                         VKI_OK);
        vt_submit_wait(g);
        vt_download(g, bx, got, (size_t)T * d * 4);
        char label[64];
        snprintf(label, sizeof label, "combine T=%u k=%u d=%u%s", T, k, d, with_bias ? " bias" : "");
        double se = 0, sm = 0;
        for (size_t i = 0; i < (size_t)T * d; i++)
            se += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]), sm += mag[i] * mag[i];
        double e = se / (sm > 0 ? sm : 1);
        worst_c = e > worst_c ? e : worst_c;
        if (!(e <= TOL_C))
            fail_msg("%s: squared error %.3g of the terms' > %.0e", label, e, TOL_C);
        vkd_buffer_destroy(g->dev, bo), vkd_buffer_destroy(g->dev, bw), vkd_buffer_destroy(g->dev, bx);
        vkd_buffer_destroy(g->dev, bb), vkd_buffer_destroy(g->dev, bi);
        free(o), free(w), free(x), free(ref), free(got), free(bias), free(ids), free(mag);
    }
    fprintf(stderr, "  combine: worst squared error %.2e of the terms' (tolerance %.0e)\n", worst_c, TOL_C);
    vt_assert_clean(g);
}

/* Impossible arguments are refused (INVALID_ARG, nothing recorded), never dispatched. */
static void test_bad_args(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vkd_buffer *b = vt_buf_nan(g, 64, "small");
    vk_tensor t;
    assert_int_equal(vk_tensor_create_grouped(g->dev, VKI_GGML_F32, 4, 6, 4, 0, "w", &t), VKI_ERR_UNSUPPORTED);
    assert_int_equal(vk_tensor_create_grouped(g->dev, VKI_GGML_F32, 4, 8, 4, 0, "w", &t), VKI_OK);
    vt_begin(g);
    vkd_view v = whole(b);
    assert_int_equal(op_moe_topk(&g->cmd, v, 1, 4, 5, true, v, v), VKI_ERR_INVALID_ARG);           /* k > E */
    assert_int_equal(op_moe_topk(&g->cmd, v, 1, 600, 2, true, v, v), VKI_ERR_INVALID_ARG);         /* E > 512 */
    assert_int_equal(op_moe_topk(&g->cmd, v, 8, 4, 2, true, v, v), VKI_ERR_INVALID_ARG);           /* too small */
    assert_int_equal(op_moe_group(&g->cmd, v, 16, 4, v), VKI_ERR_INVALID_ARG);                     /* route */
    assert_int_equal(op_moe_combine(&g->cmd, v, v, v, 2, 40, 1, NULL), VKI_ERR_INVALID_ARG);       /* k > 32 */
    op_expert_bias eb = {v, {v}, 8}; /* 8 experts x 4 columns: more than the buffer holds */
    assert_int_equal(op_moe_combine(&g->cmd, v, v, v, 1, 1, 4, &eb), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul_id(&g->cmd, &t, 3, v, v, v, 4, 1, v, 4, 1, 1, OP_MM_GEMV), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul_id(&g->cmd, &t, 2, v, v, v, 4, 1, v, 4, 16, 16, OP_MM_GEMV), VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, b);
    vt_assert_clean(g);
}

/* ---- GGUF layouts ---------------------------------------------------------------------------- */

/* The model at path (with edits) fails to load its hparams or tensors with want, naming needle. */
static void expect_layout_error(const char *src, const gguf_edit *edits, uint32_t n, vki_status want,
                                const char *needle)
{
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "/tmp/vki_test_moe_%d_edit.gguf", (int)getpid());
    assert_int_equal(gguf_edit_copy(src, path, edits, n), VKI_OK);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f, err, sizeof err), VKI_OK);
    model_hparams hp;
    model_tensors t = {0};
    vki_status st = model_read_hparams(f, &hp, err, sizeof err);
    if (st == VKI_OK)
        st = model_find_tensors(f, &hp, &t, err, sizeof err);
    model_tensors_free(&t);
    gguf_close(f);
    unlink(path);
    if (st != want || !strstr(err, needle))
        fail_msg("got %s \"%s\", want %s naming \"%s\"", vki_status_str(st), err, vki_status_str(want), needle);
}

static void test_layouts(void **state)
{
    (void)state;
    char path[256], err[512];
    snprintf(path, sizeof path, "/tmp/vki_test_moe_%d.gguf", (int)getpid());
    synth_params p = synth_default_params();
    p.arch = "qwen3moe", p.n_expert = 8, p.n_expert_used = 2, p.d_ff_exp = 32, p.head_dim = 32;
    assert_int_equal(synth_write(&p, path, err, sizeof err), VKI_OK);
    gguf_file *f;
    model_hparams hp;
    model_tensors t;
    assert_int_equal(gguf_open(path, &f, err, sizeof err), VKI_OK);
    assert_int_equal(model_read_hparams(f, &hp, err, sizeof err), VKI_OK);
    assert_int_equal(model_find_tensors(f, &hp, &t, err, sizeof err), VKI_OK);
    assert_int_equal(hp.arch, MODEL_ARCH_QWEN3MOE);
    assert_true(hp.n_expert == 8 && hp.n_expert_used == 2 && hp.d_ff_exp == 32 && hp.expert_norm && hp.qk_norm);
    assert_true(t.layers[1].ffn_down_exps && t.layers[1].ffn_down_exps->ne[2] == 8 && !t.layers[1].w_gate);
    model_tensors_free(&t);
    gguf_close(f);
    gguf_edit e[2] = {{GGUF_EDIT_U32, "qwen3moe.expert_used_count", 0, 0, 9, 0, NULL}};
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "expert_used_count = 9 must be in [1, expert_count 8]");
    e[0] = (gguf_edit){GGUF_EDIT_U32, "qwen3moe.expert_count", 0, 0, 0, 0, NULL};
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "expert_count is 0");
    e[0] = (gguf_edit){GGUF_EDIT_DROP_KEY, "qwen3moe.expert_count", 0, 0, 0, 0, NULL};
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "missing metadata key qwen3moe.expert_count");
    e[0] = (gguf_edit){GGUF_EDIT_U32, "qwen3moe.expert_count", 0, 0, 1024, 0, NULL};
    expect_layout_error(path, e, 1, VKI_ERR_UNSUPPORTED, "at most 512 experts");
    e[0] = (gguf_edit){GGUF_EDIT_U32, "qwen3moe.expert_used_count", 0, 0, 0, 0, NULL};
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "expert_used_count = 0");
    e[0] = (gguf_edit){GGUF_EDIT_DROP_TENSOR, "blk.1.ffn_gate_inp.weight", 0, 0, 0, 0, NULL};
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "missing tensor blk.1.ffn_gate_inp.weight");
    e[0] = (gguf_edit){GGUF_EDIT_SHAPE, "blk.0.ffn_up_exps.weight", 64, 256, 0, 0, NULL}; /* 2-D */
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "tensor blk.0.ffn_up_exps.weight has shape [64, 256, 1] (2 dims)");
    e[0] = (gguf_edit){GGUF_EDIT_U32, "qwen3moe.expert_feed_forward_length", 0, 0, 48, 0, NULL};
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "blk.0.ffn_gate_exps.weight has shape [64, 32, 8]");
    e[0] = (gguf_edit){GGUF_EDIT_STR, "general.architecture", 0, 0, 0, 0, "qwen3"}; /* keys under qwen3moe. */
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "missing metadata key qwen3.block_count");
    /* experts on an architecture without them */
    p.arch = "qwen3", p.n_expert = 0;
    assert_int_equal(synth_write(&p, path, err, sizeof err), VKI_OK);
    e[0] = (gguf_edit){GGUF_EDIT_U32, "qwen3.expert_count", 0, 0, 8, 0, NULL};
    e[1] = (gguf_edit){GGUF_EDIT_U32, "qwen3.expert_used_count", 0, 0, 2, 0, NULL};
    expect_layout_error(path, e, 2, VKI_ERR_UNSUPPORTED, "qwen3 with experts (expert_count 8) is not supported");
    /* Mixtral's layout: llama with experts; and the writer's own checks */
    p.arch = "llama", p.n_expert = 4, p.n_expert_used = 2, p.d_ff_exp = 0;
    assert_int_equal(synth_write(&p, path, err, sizeof err), VKI_OK);
    e[0] = (gguf_edit){GGUF_EDIT_DROP_TENSOR, "blk.0.ffn_down_exps.weight", 0, 0, 0, 0, NULL};
    expect_layout_error(path, e, 1, VKI_ERR_FORMAT, "missing tensor blk.0.ffn_down_exps.weight");
    p.n_expert_used = 5;
    assert_int_equal(synth_write(&p, path, err, sizeof err), VKI_ERR_INVALID_ARG);
    p.arch = "gemma2", p.n_expert_used = 2;
    assert_int_equal(synth_write(&p, path, err, sizeof err), VKI_ERR_INVALID_ARG);
    unlink(path);
}

int main(void)
{
#define TYPE_UNIT_TEST(T, t) cmocka_unit_test(test_matmul_id_##t),
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_topk),
        cmocka_unit_test(test_group),
        cmocka_unit_test(test_combine),
        VKK_WEIGHT_TYPES(TYPE_UNIT_TEST)
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
}
