/* Row gather (engine/ops_matmul.c: get_rows.comp): embedding lookup for every weight type and
 * the F32 activation gather, against the reference dequantisation (engine/quant.c) of the same
 * blocks. Shapes: 1 and 7 rows/ids, K of one block and odd multiples (F32/F16: any K), strided
 * outputs, multi-part tensors, repeated ids, and ids outside the tensor (which must give zero
 * rows, never a fault). Tolerance GATHER_TOL (NMSE): lavapipe gives the CPU dequantisation bit
 * for bit (0, printed at the end); a GPU compiler that contracts d * q + m into one FMA may move
 * values by an ulp (NMSE ~4e-15). Was 1e-10 / 1e-8. Outputs start NaN-filled; stride padding must
 * stay NaN. */
#include "support/vt.h"

#include "engine/ops_matmul.h"
#include "engine/quant.h"
#include "engine/tensor.h"

#define NAN_BITS 0x7fc00000u

#define GATHER_TOL 1e-13
static double worst; /* over every gather of the run */


/* ids: mostly valid, some repeated, a few outside [0, rows) when `oob`. */
static void random_ids(vt_rng *r, int32_t *ids, uint32_t n, uint32_t rows, bool oob)
{
    static const int32_t bad[] = {-1, INT32_MIN, INT32_MAX, -7};
    for (uint32_t i = 0; i < n; i++) {
        uint32_t pick = vt_range(r, 0, 9);
        if (oob && pick == 0)
            ids[i] = vt_range(r, 0, 1) ? bad[vt_range(r, 0, 3)] : (int32_t)(rows + vt_range(r, 0, 3));
        else if (pick == 1 && i > 0)
            ids[i] = ids[i - 1];
        else
            ids[i] = (int32_t)vt_range(r, 0, rows - 1);
    }
}

/* Compares y (n rows, y_stride apart) with the reference rows; padding must be untouched. */
static void check_rows(const float *y, const float *ref, uint32_t n, uint32_t K, uint32_t ys, double tol,
                       const char *label)
{
    float *got = malloc((size_t)n * K * 4);
    uint32_t nan = NAN_BITS;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(got + (size_t)i * K, y + (size_t)i * ys, K * 4);
        for (uint32_t k = K; k < ys; k++)
            assert_memory_equal(&y[(size_t)i * ys + k], &nan, 4);
    }
    double e = vt_nmse(got, ref, (size_t)n * K);
    worst = e > worst ? e : worst;
    vt_assert_nmse(got, ref, (size_t)n * K, tol, label);
    free(got);
}

static void run_type(vt_gpu *g, vt_rng *r, uint32_t type)
{
    const quant_traits *qt = quant_get(type);
    static const uint32_t fixed_n[] = {1, 7, 1, 7, 33};
    static const uint32_t fixed_rows[] = {1, 7, 7, 1, 100};
    for (uint32_t c = 0; c < 22; c++) {
        uint32_t n = c < 5 ? fixed_n[c] : vt_range(r, 1, 40);
        uint32_t rows = c < 5 ? fixed_rows[c] : vt_range(r, 1, 120);
        uint32_t K = vt_is_float_type(type) ? (c < 3 ? (uint32_t[]){1, 7, 3}[c] : vt_range(r, 1, 700))
                                         : qt->block_elems * (c < 3 ? (uint32_t[]){1, 3, 5}[c] : vt_range(r, 1, 7));
        uint32_t ys = K + (vt_range(r, 0, 1) ? 0 : vt_range(r, 1, 5));
        uint32_t parts = c % 4 == 3 ? 3 : 1;
        bool oob = c % 3 != 0;

        size_t rb = quant_row_bytes(type, K);
        uint8_t *raw = malloc(rb * rows);
        float *tmp = malloc((size_t)K * 4), *wref = malloc((size_t)rows * K * 4);
        for (uint32_t i = 0; i < rows; i++) {
            vt_fill_uniform(r, tmp, K, -1.0f, 1.0f);
            quant_row(type, tmp, raw + i * rb, K);
            dequant_row(type, raw + i * rb, wref + (size_t)i * K, K);
        }
        vk_tensor t;
        size_t max_part = parts > 1 ? quant_dev_row_bytes(type, K) * ((rows + parts - 1) / parts) : 0;
        assert_int_equal(vk_tensor_create(g->dev, type, K, rows, max_part, "emb", &t), VKI_OK);
        assert_int_equal(vk_tensor_upload(g->dev, &t, raw), VKI_OK);

        int32_t *ids = malloc(n * 4);
        random_ids(r, ids, n, rows, oob);
        float *ref = malloc((size_t)n * K * 4);
        for (uint32_t i = 0; i < n; i++) {
            bool ok = ids[i] >= 0 && (uint32_t)ids[i] < rows;
            for (uint32_t k = 0; k < K; k++)
                ref[(size_t)i * K + k] = ok ? wref[(size_t)ids[i] * K + k] : 0.0f;
        }
        vkd_buffer *bi = vt_buf_from(g, ids, n * 4, "ids"), *by = vt_buf_nan(g, (size_t)n * ys * 4, "y");
        vt_begin(g);
        assert_int_equal(op_get_rows(&g->cmd, &t, vkd_whole(bi), n, vkd_whole(by), ys), VKI_OK);
        vt_submit_wait(g);
        float *y = malloc((size_t)n * ys * 4);
        vt_download(g, by, y, (size_t)n * ys * 4);
        char label[128];
        snprintf(label, sizeof label, "get_rows %s n=%u rows=%u K=%u ys=%u parts=%u", qt->name, n, rows, K, ys,
                 t.n_parts);
        check_rows(y, ref, n, K, ys, GATHER_TOL, label);
        for (uint32_t i = 0; i < n; i++) /* out-of-range ids: exact zeros */
            if (ids[i] < 0 || (uint32_t)ids[i] >= rows)
                for (uint32_t k = 0; k < K; k++)
                    assert_true(y[(size_t)i * ys + k] == 0.0f);

        vk_tensor_destroy(g->dev, &t);
        vkd_buffer_destroy(g->dev, bi);
        vkd_buffer_destroy(g->dev, by);
        free(raw); free(tmp); free(wref); free(ids); free(ref); free(y);
    }
}

static void test_get_rows_all_types(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("get_rows");
    for (uint32_t i = 0; i < vt_n_weight_types; i++)
        run_type(g, &r, vt_weight_types[i]);
    vt_assert_clean(g);
}

/* More ids than workgroups along y: the shader strides over the rest (a device allowing 3). */
static void test_get_rows_few_groups(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("get_rows_few_groups");
    vki_device_info saved = g->dev->info;
    g->dev->info.max_workgroup_count[1] = 3;
    run_type(g, &r, VKI_GGML_Q4_0);
    run_type(g, &r, VKI_GGML_F32);
    g->dev->info = saved;
    vt_assert_clean(g);
}

/* F32 activation gather from a strided, offset source view. */
static void test_gather_rows(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("gather_rows");
    for (uint32_t c = 0; c < 20; c++) {
        uint32_t rows = c == 0 ? 1 : vt_range(&r, 1, 64), K = c < 2 ? (c ? 7 : 1) : vt_range(&r, 1, 300);
        uint32_t ss = K + vt_range(&r, 0, 4), n = c == 0 ? 1 : vt_range(&r, 1, 30), ys = K + vt_range(&r, 0, 2);
        uint32_t off = c % 2 ? 256 : 0;
        size_t src_floats = off / 4 + (size_t)rows * ss;
        float *src = malloc(src_floats * 4);
        vt_fill_uniform(&r, src, src_floats, -3.0f, 3.0f);
        const float *s0 = src + off / 4;
        int32_t *ids = malloc(n * 4);
        random_ids(&r, ids, n, rows, c % 3 == 1);
        float *ref = malloc((size_t)n * K * 4);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t k = 0; k < K; k++)
                ref[(size_t)i * K + k] =
                    ids[i] >= 0 && (uint32_t)ids[i] < rows ? s0[(size_t)ids[i] * ss + k] : 0.0f;
        vkd_buffer *bs = vt_buf_from(g, src, src_floats * 4, "src"), *bi = vt_buf_from(g, ids, n * 4, "ids");
        vkd_buffer *by = vt_buf_nan(g, (size_t)n * ys * 4, "y");
        vt_begin(g);
        vkd_view vs = {bs, off, VK_WHOLE_SIZE};
        assert_int_equal(op_gather_rows(&g->cmd, vs, ss, rows, K, vkd_whole(bi), n, vkd_whole(by), ys), VKI_OK);
        vt_submit_wait(g);
        float *y = malloc((size_t)n * ys * 4);
        vt_download(g, by, y, (size_t)n * ys * 4);
        char label[96];
        snprintf(label, sizeof label, "gather_rows rows=%u K=%u ss=%u n=%u ys=%u off=%u", rows, K, ss, n, ys, off);
        check_rows(y, ref, n, K, ys, GATHER_TOL, label);
        vkd_buffer_destroy(g->dev, bs);
        vkd_buffer_destroy(g->dev, bi);
        vkd_buffer_destroy(g->dev, by);
        free(src); free(ids); free(ref); free(y);
    }
    vt_assert_clean(g);
}

/* Views too small for the request are refused; n = 0 records nothing and succeeds. */
static void test_get_rows_bad_args(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vk_tensor t;
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_F32, 8, 4, 0, "emb", &t), VKI_OK);
    vkd_buffer *ids = vt_buf_nan(g, 4 * 4, "ids"), *y = vt_buf_nan(g, 4 * 8 * 4, "y");
    vt_begin(g);
    assert_int_equal(op_get_rows(&g->cmd, &t, vkd_whole(ids), 0, vkd_whole(y), 8), VKI_OK);
    assert_int_equal(op_get_rows(&g->cmd, &t, vkd_whole(ids), 5, vkd_whole(y), 8), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_get_rows(&g->cmd, &t, vkd_whole(ids), 4, vkd_whole(y), 7), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_get_rows(&g->cmd, &t, vkd_whole(ids), 4, vkd_whole(y), 9), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_gather_rows(&g->cmd, vkd_whole(y), 8, 5, 8, vkd_whole(ids), 4, vkd_whole(y), 8),
                     VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, ids);
    vkd_buffer_destroy(g->dev, y);
    vt_assert_clean(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_rows_all_types),
        cmocka_unit_test(test_get_rows_few_groups),
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_get_rows_bad_args),
    };
    int rc = cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
    fprintf(stderr, "worst NMSE of a gather: %.2e (tolerance %.0e)\n", worst, GATHER_TOL);
    return rc;
}
