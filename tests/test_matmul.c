/* Matrix multiply (engine/ops_matmul.c: matvec.comp + matmul.comp) against a scalar reference
 * for every weight type (all 15 that engine/quant.h runs), on both kernels, over random shapes with awkward sizes (1, 7, tile
 * +/- 1, K of one block and odd multiples), strided and offset activations, the bias path,
 * multi-part tensors, and the GEMV/GEMM boundary. The reference dequantises the very blocks
 * that were uploaded (engine/quant.c) and accumulates in double.
 *
 * Tolerances (NMSE): MM_TOL for the FP32 kernels, every weight type, on cases of >= CM_TOL_MIN
 * outputs (the printed worst at the end; was 1e-8 for quantised weights); on fewer outputs
 * MM_TOL_FEW on the squared error relative to the terms' magnitudes (one dot product whose
 * terms cancel would set an NMSE). Outputs are NaN-filled first, so unwritten elements fail;
 * columns past N of a strided Y must stay NaN. */
#include "support/vt.h"

#include <math.h>

#include "engine/ops_basic.h"
#include "engine/ops_matmul.h"
#include "engine/quant.h"
#include "engine/tensor.h"

#define NAN_BITS 0x7fc00000u

/* Cooperative-matrix GEMM (F16 operands, F32 accumulation), NMSE per case:
 *  - against a reference that rounds X and W to F16 too (only the order of the F32 additions
 *    differs): emulated <= CM_EMU_TOL; tensor cores <= CM_NV_TOL (not measured: no NVIDIA device
 *    was available; their internal accumulation may be coarser than F32 adds);
 *  - against the exact reference <= CM_TOL on cases of >= CM_TOL_MIN outputs (over fewer, one
 *    dot product whose terms cancel can have a relative error far above the typical one). */
#define CM_EMU_TOL 1e-10 /* measured on lavapipe: <= 4.6e-12 (K-quants: the device may round a
                          * dequantised weight to the other neighbouring F16, rarely) */
#define CM_EMU_TOL_FEW 1e-10 /* cases of < CM_TOL_MIN outputs, relative to the terms' magnitudes
                              * (assert_few): an F16 flip of one weight weighs ~1e-13 there (as an
                              * NMSE, 1.3e-10 was seen where the terms cancelled) */
#define CM_NV_TOL 1e-9
#define CM_TOL 1e-6      /* measured on lavapipe (emulated): <= 1.7e-7 */
#define CM_TOL_MIN 256
static double worst_cm[2]; /* worst NMSE seen: against the exact / the F16-rounded reference */

static uint32_t block_of(uint32_t type) { return quant_get(type)->block_elems; }

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = quant_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* Random bytes in every field, with block scales kept finite and small: exercises every bit
 * pattern of the packed sub-block scales, which a quantiser's output rarely does. */
static void random_blocks(vt_rng *r, uint32_t type, uint8_t *row, uint64_t K)
{
    const quant_traits *qt = quant_get(type);
    for (uint64_t b = 0; b < K / qt->block_elems; b++) {
        uint8_t *blk = row + b * qt->block_bytes;
        for (uint32_t i = 0; i < qt->block_bytes; i += 8) {
            uint64_t v = vt_u64(r);
            memcpy(blk + i, &v, qt->block_bytes - i < 8 ? qt->block_bytes - i : 8);
        }
        switch (type) {
        case VKI_GGML_Q8_0: put_f16(blk, vt_uniform(r, -0.02f, 0.02f)); break;
        case VKI_GGML_Q4_0: case VKI_GGML_Q5_0: put_f16(blk, vt_uniform(r, -0.2f, 0.2f)); break;
        case VKI_GGML_Q4_1: case VKI_GGML_Q5_1:
            put_f16(blk, vt_uniform(r, 0.0f, 0.1f));
            put_f16(blk + 2, vt_uniform(r, -1.0f, 1.0f));
            break;
        case VKI_GGML_IQ4_NL: put_f16(blk, vt_uniform(r, -0.01f, 0.01f)); break;
        case VKI_GGML_Q2_K:
            put_f16(blk + 80, vt_uniform(r, 0.0f, 0.02f));
            put_f16(blk + 82, vt_uniform(r, 0.0f, 0.02f));
            break;
        case VKI_GGML_Q3_K: put_f16(blk + 108, vt_uniform(r, -0.01f, 0.01f)); break;
        case VKI_GGML_Q4_K: case VKI_GGML_Q5_K:
            put_f16(blk, vt_uniform(r, 0.0f, 0.01f));
            put_f16(blk + 2, vt_uniform(r, 0.0f, 0.01f));
            break;
        case VKI_GGML_Q6_K: put_f16(blk + 208, vt_uniform(r, -0.001f, 0.001f)); break;
        case VKI_GGML_IQ4_XS: put_f16(blk, vt_uniform(r, -0.0005f, 0.0005f)); break;
        case VKI_GGML_MXFP4: blk[0] = (uint8_t)vt_range(r, 118, 125); break; /* d = 2^-10 .. 2^-3 */
        }
    }
}

/* N rows of K weights in `type` (raw GGUF bytes) and their dequantised values. Quantised rows
 * come from the quantiser (realistic blocks) or are random blocks, chosen per matrix. */
static uint8_t *make_weights(vt_rng *r, uint32_t type, uint32_t N, uint32_t K, float *wref)
{
    size_t rb = quant_row_bytes(type, K);
    uint8_t *raw = malloc(rb * N);
    float *tmp = malloc((size_t)K * sizeof(float));
    assert_non_null(raw);
    bool quantise = vt_is_float_type(type) || (vt_u64(r) & 1);
    for (uint32_t n = 0; n < N; n++) {
        if (quantise) {
            vt_fill_uniform(r, tmp, K, -1.0f, 1.0f);
            quant_row(type, tmp, raw + n * rb, K);
        } else {
            random_blocks(r, type, raw + n * rb, K);
        }
        dequant_row(type, raw + n * rb, wref + (size_t)n * K, K);
    }
    free(tmp);
    return raw;
}

static vk_tensor upload_weights(vt_gpu *g, uint32_t type, uint32_t N, uint32_t K, const uint8_t *raw,
                                uint32_t parts)
{
    vk_tensor t;
    size_t max_part = parts > 1 ? quant_dev_row_bytes(type, K) * ((N + parts - 1) / parts) : 0;
    assert_int_equal(vk_tensor_create(g->dev, type, K, N, max_part, "w", &t), VKI_OK);
    if (parts > 1)
        assert_true(t.n_parts > 1 || N == 1);
    assert_int_equal(vk_tensor_upload(g->dev, &t, raw), VKI_OK);
    return t;
}

typedef struct mm_case {
    uint32_t M, N, K;
    uint32_t x_pad, y_pad;  /* x_stride = K + x_pad, y_stride = N + y_pad */
    uint32_t x_off;         /* X binding offset in bytes (0 or 256: any device's alignment) */
    bool bias;
    bool accum;             /* Y += X W^T (op_matmul_ex's accumulate): Y starts random */
    uint32_t parts;         /* >1: weights split in about this many parts */
    op_mm_path path;
} mm_case;

#define MM_TOL 1e-10
/* cases of < CM_TOL_MIN outputs: squared error relative to the terms' magnitudes (assert_few;
 * as an NMSE one output whose terms cancel decided: 7e-8 seen). Measured: lavapipe <= 3.1e-15
 * (seeds 1-3 and a full run), H200 3.8e-15; rounding errors of random sign put it near
 * (2^-24)^2 = 3.6e-15 (was 1e-10, 3e4x looser) */
#define MM_TOL_FEW 1e-12
static double worst_plain[3]; /* FP32 GEMV/GEMM: float types, quantised types (>= CM_TOL_MIN
                                 outputs); any type, fewer outputs */

static float round16(float v) { return quant_f16_to_f32(quant_f32_to_f16(v)); }

/* f16: both operands rounded to F16 first, as the cooperative-matrix kernels stage them. */
static void reference(const mm_case *s, const float *x, uint32_t xs, const float *w, const float *bias,
                      const float *y0, uint32_t ys, bool f16, float *ref)
{
    for (uint32_t m = 0; m < s->M; m++)
        for (uint32_t n = 0; n < s->N; n++) {
            double acc = (bias ? bias[n] : 0.0) + (y0 ? y0[(size_t)m * ys + n] : 0.0);
            const float *xr = x + (size_t)m * xs, *wr = w + (size_t)n * s->K;
            for (uint32_t k = 0; k < s->K; k++)
                acc += f16 ? (double)round16(xr[k]) * round16(wr[k]) : (double)xr[k] * wr[k];
            ref[(size_t)m * s->N + n] = (float)acc;
        }
}

/* Per output, the sum of its terms' magnitudes |bias| + |y0| + sum_k |x w| (what a float
 * dot product's rounding error scales with). */
static void term_scale(const mm_case *s, const float *x, uint32_t xs, const float *w, const float *bias,
                       const float *y0, uint32_t ys, bool f16, float *out)
{
    for (uint32_t m = 0; m < s->M; m++)
        for (uint32_t n = 0; n < s->N; n++) {
            double a = (bias ? fabs(bias[n]) : 0.0) + (y0 ? fabs(y0[(size_t)m * ys + n]) : 0.0);
            const float *xr = x + (size_t)m * xs, *wr = w + (size_t)n * s->K;
            for (uint32_t k = 0; k < s->K; k++)
                a += f16 ? fabs((double)round16(xr[k]) * round16(wr[k])) : fabs((double)xr[k] * wr[k]);
            out[(size_t)m * s->N + n] = (float)a;
        }
}

/* Cases of few outputs: one output whose terms cancel would make the NMSE (relative to the
 * tiny result) ill-conditioned (seen 7e-8 for a q4_0 output of -7.5e-4 from 32 terms of ~0.1),
 * so the squared error is taken relative to the terms' magnitudes instead. */
static void assert_few(const float *got, const float *ref, const float *scale, size_t n, double tol,
                       const char *label, double *worst)
{
    double e = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        d += (double)scale[i] * scale[i];
    }
    double r = e / (d > 0 ? d : 1);
    if (worst)
        *worst = r > *worst ? r : *worst;
    if (!(r <= tol))
        fail_msg("%s: squared error %.3g of the terms' magnitude > %.0e", label, r, tol);
}

/* The kernel op_matmul_path runs for this case, as a label. */
static const char *path_name(const vkd_device *d, const mm_case *s)
{
    op_mm_path p = s->path;
    if (p == OP_MM_AUTO)
        p = s->M <= op_matmul_gemv_max_m(d) ? OP_MM_GEMV : d->cm.kind != VKD_CM_NONE ? OP_MM_COOPMAT : OP_MM_GEMM;
    if (p == OP_MM_COOPMAT)
        return d->cm.kind == VKD_CM_NV ? "coopmat" : "coopmat-emulated";
    return p == OP_MM_GEMV ? "gemv" : "gemm";
}

/* X's stride for a matrix-vector product of `type` on device d that asks for K + pad. A stride
 * that is not a multiple of 4 takes the kernel's scalar X loads (matvec.comp, XV4 = 0): pipelines
 * of their own (one per configuration, ~2 s of lavapipe's compile each) that the engine never
 * runs, its activations being vec4-aligned. Those loads are the same code for every type, so
 * they are checked on the float types (whose odd K needs them) and, in the library's own
 * configurations (no test override of the workgroup shape), on Q8_0 (whole blocks) and Q4_K (two
 * spans with offsets); elsewhere the pad is rounded up to a multiple of 4 (the stride stays
 * above K). With every case's pad as asked: 102 more pipelines, and a cold test_matmul took
 * 1,246 s against 953 s before XV4. */
static uint32_t gemv_x_stride(const vkd_device *d, uint32_t type, uint32_t K, uint32_t pad)
{
    const bool library_cfg = !d->matvec_wg && !d->matvec_rows && !d->matvec_mc && !d->matvec_mu;
    if (!vt_is_float_type(type) && !(library_cfg && (type == VKI_GGML_Q8_0 || type == VKI_GGML_Q4_K)))
        pad = (K + pad + 3) / 4 * 4 - K;
    return K + pad;
}

static void run_case(vt_gpu *g, vt_rng *r, uint32_t type, const mm_case *s)
{
    const uint32_t M = s->M, N = s->N, K = s->K, ys = N + s->y_pad;
    const char *path = path_name(g->dev, s);
    const uint32_t xs = !strcmp(path, "gemv") ? gemv_x_stride(g->dev, type, K, s->x_pad) : K + s->x_pad;
    float *wref = malloc((size_t)N * K * sizeof(float));
    uint8_t *raw = make_weights(r, type, N, K, wref);
    vk_tensor t = upload_weights(g, type, N, K, raw, s->parts);

    /* X with NaN in the stride padding: a kernel reading past K fails the comparison */
    size_t x_floats = s->x_off / 4 + (size_t)M * xs;
    float *xh = malloc(x_floats * sizeof(float));
    uint32_t nan = NAN_BITS;
    for (size_t i = 0; i < x_floats; i++)
        memcpy(&xh[i], &nan, 4);
    float *x = xh + s->x_off / 4;
    for (uint32_t m = 0; m < M; m++)
        vt_fill_uniform(r, x + (size_t)m * xs, K, -1.0f, 1.0f);
    float *bias = NULL;
    if (s->bias) {
        bias = malloc(N * sizeof(float));
        vt_fill_uniform(r, bias, N, -2.0f, 2.0f);
    }
    vkd_buffer *bx = vt_buf_from(g, xh, x_floats * 4, "x");
    vkd_buffer *bb = bias ? vt_buf_from(g, bias, N * 4, "bias") : NULL;
    /* Y: NaN in the stride padding (a kernel writing there fails below); with accum the first N
     * columns start random and the product is added to them */
    float *y0 = NULL;
    vkd_buffer *by;
    if (s->accum) {
        y0 = malloc((size_t)M * ys * 4);
        for (size_t i = 0; i < (size_t)M * ys; i++)
            memcpy(&y0[i], &nan, 4);
        for (uint32_t m = 0; m < M; m++)
            vt_fill_uniform(r, y0 + (size_t)m * ys, N, -4.0f, 4.0f);
        by = vt_buf_from(g, y0, (size_t)M * ys * 4, "y");
    } else {
        by = vt_buf_nan(g, (size_t)M * ys * 4, "y");
    }
    vkd_view vx = {bx, s->x_off, VK_WHOLE_SIZE}, vb = bb ? vkd_whole(bb) : (vkd_view){0};

    vt_begin(g);
    assert_int_equal(op_matmul_ex(&g->cmd, &t, bb ? &vb : NULL, vx, xs, vkd_whole(by), ys, M, s->path, s->accum),
                     VKI_OK);
    vt_submit_wait(g);

    float *y = malloc((size_t)M * ys * 4), *got = malloc((size_t)M * N * 4), *ref = malloc((size_t)M * N * 4);
    float *scale = malloc((size_t)M * N * 4);
    vt_download(g, by, y, (size_t)M * ys * 4);
    reference(s, x, xs, wref, bias, y0, ys, false, ref);
    for (uint32_t m = 0; m < M; m++) {
        memcpy(got + (size_t)m * N, y + (size_t)m * ys, N * 4);
        for (uint32_t n = N; n < ys; n++)
            assert_memory_equal(&y[(size_t)m * ys + n], &nan, 4);
    }
    char label[160];
    snprintf(label, sizeof label, "%s %s M=%u N=%u K=%u xs=%u ys=%u off=%u bias=%d accum=%d parts=%u",
             quant_get(type)->name, path, M, N, K, xs, ys, s->x_off, s->bias, s->accum, t.n_parts);
    if (!strncmp(path, "coopmat", 7)) {
        double e = vt_nmse(got, ref, (size_t)M * N);
        if ((size_t)M * N >= CM_TOL_MIN) {
            worst_cm[0] = e > worst_cm[0] ? e : worst_cm[0];
            vt_assert_nmse(got, ref, (size_t)M * N, CM_TOL, label);
        }
        reference(s, x, xs, wref, bias, y0, ys, true, ref);
        e = vt_nmse(got, ref, (size_t)M * N);
        if ((size_t)M * N >= CM_TOL_MIN || g->dev->cm.kind != VKD_CM_EMULATED) {
            worst_cm[1] = e > worst_cm[1] ? e : worst_cm[1];
            vt_assert_nmse(got, ref, (size_t)M * N, g->dev->cm.kind == VKD_CM_EMULATED ? CM_EMU_TOL : CM_NV_TOL,
                           label);
        } else {
            term_scale(s, x, xs, wref, bias, y0, ys, true, scale);
            assert_few(got, ref, scale, (size_t)M * N, CM_EMU_TOL_FEW, label, &worst_cm[1]);
        }
    } else {
        bool many = (size_t)M * N >= CM_TOL_MIN;
        if (many) {
            double e = vt_nmse(got, ref, (size_t)M * N), *w = &worst_plain[vt_is_float_type(type) ? 0 : 1];
            *w = e > *w ? e : *w;
            vt_assert_nmse(got, ref, (size_t)M * N, MM_TOL, label);
        } else {
            term_scale(s, x, xs, wref, bias, y0, ys, false, scale);
            assert_few(got, ref, scale, (size_t)M * N, MM_TOL_FEW, label, &worst_plain[2]);
        }
    }

    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, bx);
    vkd_buffer_destroy(g->dev, bb);
    vkd_buffer_destroy(g->dev, by);
    free(wref); free(raw); free(xh); free(bias); free(y0); free(y); free(got); free(ref); free(scale);
}

/* K for a type: `blocks` blocks (quantised) or an awkward length (float types). */
static uint32_t pick_k(vt_rng *r, uint32_t type, uint32_t i)
{
    if (vt_is_float_type(type)) {
        static const uint32_t ks[] = {1, 3, 4, 7, 15, 16, 17, 31, 33, 64, 100, 257};
        return i < sizeof ks / sizeof ks[0] ? ks[i] : vt_range(r, 1, 600);
    }
    static const uint32_t odd[] = {1, 3, 5};
    uint32_t bl = block_of(type);
    uint32_t nb = i < 3 ? odd[i] : vt_range(r, 1, bl == 256 ? 5 : 9);
    return bl * nb;
}

/* A K over twice 16 * 128 elements: every GEMV invocation (and subgroup) gets units. */
static uint32_t big_k(uint32_t type)
{
    return vt_is_float_type(type) ? 4099 : block_of(type) * (block_of(type) == 256 ? 17 : 129);
}

static void random_case(vt_rng *r, mm_case *s, uint32_t type, uint32_t i)
{
    s->K = pick_k(r, type, i);
    s->x_pad = vt_range(r, 0, 1) ? 0 : vt_range(r, 1, 5);
    s->y_pad = vt_range(r, 0, 1) ? 0 : vt_range(r, 1, 3);
    s->x_off = vt_range(r, 0, 3) == 0 ? 256 : 0;
    s->bias = vt_range(r, 0, 1);
    s->accum = vt_range(r, 0, 2) == 0;
    s->parts = vt_range(r, 0, 4) == 0 ? 3 : 1;
}

/* Matrix-vector path: M up to the crossover through op_matmul's own choice (one pass over the
 * weights per 8 rows), and larger M forced. */
static void run_gemv(void **state, uint32_t type)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("gemv");
    /* 9..32 rows: chunks of 8 in one workgroup; 33: a second workgroup along y */
    static const uint32_t Ms[] = {1, 2, 3, 5, 7, 8, 1, 33, 9, 17, 1, 8};
    static const uint32_t Ns[] = {1, 7, 3, 65, 33, 4, 129, 1, 5, 9, 64, 63};
    for (uint32_t i = 0; i < 24; i++) {
        mm_case s = {0};
        random_case(&r, &s, type, i);
        s.M = i < 12 ? Ms[i] : (vt_range(&r, 0, 2) ? vt_range(&r, 1, 8) : vt_range(&r, 9, 40));
        s.N = i < 12 ? Ns[i] : vt_range(&r, 1, 140);
        if (i == 12 || i == 13) {
            s.M = i == 12 ? 1 : 5;
            s.N = 9;
            s.K = big_k(type);
        }
        s.path = s.M <= op_matmul_gemv_max_m(g->dev) ? OP_MM_AUTO : OP_MM_GEMV;
        run_case(g, &r, type, &s);
    }
    vt_assert_clean(g);
}

/* Tiled FP32 path: M above the crossover through op_matmul's choice, and small M forced. Sizes
 * straddle the 64 and 128 tiles. */
static void run_gemm(void **state, uint32_t type)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("gemm");
    static const uint32_t Ms[] = {9, 17, 31, 33, 64, 65, 100, 129, 1, 3, 9, 70};
    static const uint32_t Ns[] = {1, 7, 65, 64, 63, 129, 33, 17, 5, 128, 127, 1};
    for (uint32_t i = 0; i < 22; i++) {
        mm_case s = {0};
        random_case(&r, &s, type, i);
        s.M = i < 12 ? Ms[i] : vt_range(&r, 1, 140);
        s.N = i < 12 ? Ns[i] : vt_range(&r, 1, 140);
        if (i == 12) {
            s.M = 20;
            s.N = 9;
            s.K = big_k(type);
        }
        /* AUTO takes this kernel above the crossover unless the device has a coopmat path */
        bool auto_fp32 = s.M > op_matmul_gemv_max_m(g->dev) && g->dev->cm.kind == VKD_CM_NONE;
        s.path = auto_fp32 ? OP_MM_AUTO : OP_MM_GEMM;
        run_case(g, &r, type, &s);
    }
    vt_assert_clean(g);
}


/* Cooperative-matrix GEMM on the emulated path (every device with shaderFloat16 and subgroup
 * shuffles: lavapipe) and, where the device has one, on the real VK_NV_cooperative_matrix path,
 * against both references (see CM_TOL). Sizes straddle the tiles (64 on CPU devices, 128 on
 * GPUs) and the fragments (16); float K tails 1..33; the largest M goes through OP_MM_AUTO. */
static void run_coopmat_cases(vt_gpu *g, vt_rng *r, uint32_t type)
{
    static const uint32_t Ms[] = {1, 7, 16, 17, 64, 65, 100, 129, 33};
    static const uint32_t Ns[] = {1, 65, 7, 64, 33, 127, 17, 129, 48};
    for (uint32_t i = 0; i < 11; i++) {
        mm_case s = {0};
        random_case(r, &s, type, i);
        s.M = i < 9 ? Ms[i] : vt_range(r, 1, 140);
        s.N = i < 9 ? Ns[i] : vt_range(r, 1, 140);
        s.path = OP_MM_COOPMAT;
        if (i == 10) {
            s.M = op_matmul_gemv_max_m(g->dev) + vt_range(r, 1, 40);
            s.path = OP_MM_AUTO;
        }
        run_case(g, r, type, &s);
    }
}

static void run_coopmat(void **state, uint32_t type)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("coopmat");
    vkd_cm saved = g->dev->cm;
    worst_cm[0] = worst_cm[1] = 0;
    for (int real = 0; real < 2; real++) {
        if (real && !g->dev->nv_coopmat) {
            fprintf(stderr, "  %s: no VK_NV_cooperative_matrix on this device: only the emulated path ran\n",
                    quant_get(type)->name);
            continue;
        }
        if (vkd_coopmat_select(g->dev, real ? VKI_COOPMAT_AUTO : VKI_COOPMAT_EMULATED) != VKI_OK) {
            g->dev->cm = saved;
            skip();
        }
        run_coopmat_cases(g, &r, type);
    }
    g->dev->cm = saved;
    fprintf(stderr, "  %s coopmat: worst NMSE %.2e vs exact (bound %.0e from %d outputs), %.2e vs F16-rounded\n",
            quant_get(type)->name, worst_cm[0], CM_TOL, CM_TOL_MIN, worst_cm[1]);
    vt_assert_clean(g);
}

#define TYPE_TESTS(T, t)                                                                          \
    static void test_gemv_##t(void **state) { run_gemv(state, VKI_GGML_##T); }                    \
    static void test_gemm_##t(void **state) { run_gemm(state, VKI_GGML_##T); }                    \
    static void test_coopmat_##t(void **state) { run_coopmat(state, VKI_GGML_##T); }
VKK_WEIGHT_TYPES(TYPE_TESTS)

/* vki_device_params.kernel_config as the engine applies it (op_kernel_config): each key sets its
 * kernel choice, later items override earlier ones, NULL and "" change nothing; malformed items,
 * values out of range and unknown keys are refused; GEMM settings are checked against the device
 * only when asked (the engine asks, bench-kernels' sweeps do not): refused without a
 * cooperative-matrix path or with a tile whose shared memory does not fit. */
static void test_kernel_config(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vkd_device *d = g->dev;
    const uint32_t sg = d->info.subgroup_size ? d->info.subgroup_size : 1;
    char cfg[192];
    snprintf(cfg, sizeof cfg, "matvec=%ux9x9,matvec=%ux3x5x2,gemm=32x64x32x32,gemm_stages=2,gemm_bk=64,gemm_split=3,"
             "gemv_max_m=17,attn_split=48,attn_loads=3,sample_loads=5,gemm_w16=0", sg, sg);
    assert_int_equal(op_kernel_config(d, cfg, false), VKI_OK);
    assert_int_equal(d->matvec_wg, sg);
    assert_int_equal(d->matvec_rows, 3);
    assert_int_equal(d->matvec_mc, 5);
    assert_int_equal(d->matvec_mu, 2);
    assert_int_equal(d->cm_tile_m, 32);
    assert_int_equal(d->cm_tile_n, 64);
    assert_int_equal(d->cm_warp_m, 32);
    assert_int_equal(d->cm_warp_n, 32);
    assert_int_equal(d->cm_stages, 2);
    assert_int_equal(d->cm_bk, 64);
    assert_int_equal(d->cm_split, 3);
    assert_int_equal(op_matmul_gemv_max_m(d), 17);
    assert_int_equal(d->attn_split, 48);
    assert_int_equal(d->attn_loads, 3);
    assert_int_equal(d->sample_loads, 5);
    assert_true(d->cm_w4);
    assert_int_equal(op_kernel_config(d, "gemm_w16=1", false), VKI_OK);
    assert_false(d->cm_w4);
    assert_int_equal(op_kernel_config(d, NULL, true), VKI_OK);
    assert_int_equal(op_kernel_config(d, "", true), VKI_OK);
    assert_int_equal(op_kernel_config(d, "gemm=64x128", false), VKI_OK); /* the warp tile back to the library's */
    assert_int_equal(d->cm_warp_m, 0);
    assert_int_equal(d->matvec_rows, 3);
    static const char *const bad[] = {"matvec=0x1", "matvec=8", "matvec=8x17", "matvec=8x4x33", "matvec=8x4x4x9",
                                      "matvec=8x4x", "matvec=+8x4", "matvec=8x4 ", "gemm=12", "gemm=64x64x32",
                                      "gemm=64x64x0x32", "gemm_stages=3", "gemm_bk=24", "gemm_bk=80",
                                      "gemm_split=x", "gemm_split=65", "gemv_max_m=0", "gemv_max_m=5000",
                                      "gemv_max_m=99999999999", "foo=1", "matvec", "=8x4", "gemm_stages=1,bk=2",
                                      "attn_split=8", "attn_split=40", "attn_split=65552", "attn_split=32x2",
                                      "attn_loads=0", "attn_loads=9", "sample_loads=0", "sample_loads=17",
                                      "gemm_xh=2", "gemm_xh", "gemm_xh=", "gemm_xh=01", "gemm_xh=1x1",
                                      "gemm_w16=4", "gemm_w16", "gemm_w16=1,gemm_w1=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (op_kernel_config(d, bad[i], false) != VKI_ERR_INVALID_ARG)
            fail_msg("kernel config '%s' accepted", bad[i]);
    /* 16 rows x 32 activation rows x 1024 / subgroup partial sums: past 48 KiB below 64-lane subgroups */
    const uint32_t sg_min = d->info.subgroup_min_size ? d->info.subgroup_min_size : sg;
    if (d->info.max_workgroup_invocations >= 1024 && sg <= 1024 && 1024 % sg == 0 &&
        4ull * 16 * 32 * (1024 / sg_min) + 1024 > d->info.max_compute_shared_memory)
        assert_int_equal(op_kernel_config(d, "matvec=1024x16x32", false), VKI_ERR_INVALID_ARG);
    if (sg > 1) { /* more than one subgroup, not a multiple of it */
        snprintf(cfg, sizeof cfg, "matvec=%ux2", sg + 1);
        assert_int_equal(op_kernel_config(d, cfg, false), VKI_ERR_INVALID_ARG);
        /* less than a subgroup runs the product, but not the norm epilogue (whole subgroups) */
        const vk_tensor w = {.n_parts = 1, .n_rows = 64};
        snprintf(cfg, sizeof cfg, "matvec=%ux2", sg / 2);
        assert_int_equal(op_kernel_config(d, cfg, false), VKI_OK);
        assert_false(op_matmul_norm_fits(d, &w));
        snprintf(cfg, sizeof cfg, "matvec=%ux2", sg);
        assert_int_equal(op_kernel_config(d, cfg, false), VKI_OK);
        assert_true(op_matmul_norm_fits(d, &w) == (256 % sg == 0));
    }
    assert_int_equal(vkd_coopmat_select(d, VKI_COOPMAT_OFF), VKI_OK);
    assert_int_equal(op_kernel_config(d, "gemm=32x32", true), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_kernel_config(d, "gemm_split=2", true), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_kernel_config(d, "gemm=32x32", false), VKI_OK);
    if (vkd_coopmat_select(d, VKI_COOPMAT_EMULATED) == VKI_OK) {
        d->cm_stages = d->cm_bk = 0;
        assert_int_equal(op_kernel_config(d, "gemm=32x32,gemm_stages=2", true), VKI_OK);
        assert_int_equal(op_kernel_config(d, "gemm=512x512", true), VKI_ERR_INVALID_ARG); /* > 48 KiB */
    }
    d->matvec_wg = d->matvec_rows = d->matvec_mc = 0;
    d->attn_split = d->attn_loads = d->sample_loads = 0;
    vt_assert_clean(g);
}

/* The GPU tile configurations (128 x 128 tiles over 8 subgroups of 64 x 32; 64 x 128 up to 64
 * rows) and NVIDIA's other fragment shape (16 x 8 x 16), through the emulation: the tiling code
 * the tensor-core path runs, checked on any device (a float type with a K tail, then a K-quant;
 * the staging of every type is run_coopmat's). */
static void test_coopmat_gpu_configs(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("coopmat gpu configs");
    vki_device_info saved = g->dev->info;
    vkd_cm saved_cm = g->dev->cm;
    if (vkd_coopmat_select(g->dev, VKI_COOPMAT_EMULATED) != VKI_OK)
        skip();
    g->dev->info.type = VKI_DEVICE_DISCRETE;
    g->dev->info.max_compute_shared_memory = 48 * 1024;
    /* one type per fragment shape: each pipeline costs seconds to compile on lavapipe */
    const uint32_t ns[2] = {16, 8}, types[2] = {VKI_GGML_F32, VKI_GGML_Q4_K};
    for (int shape = 0; shape < 2; shape++) {
        g->dev->cm.n = ns[shape] % g->dev->cm.sg ? g->dev->cm.n : ns[shape];
        uint32_t type = types[shape], K = vt_is_float_type(type) ? 77 : 2 * block_of(type);
        mm_case a = {.M = 129, .N = 130, .K = K, .y_pad = 2, .bias = true, .path = OP_MM_COOPMAT}; /* 128-row tiles */
        mm_case b = {.M = 31, .N = 7, .K = K, .x_pad = 1, .parts = 2, .path = OP_MM_COOPMAT};      /* 64-row tiles */
        run_case(g, &r, type, &a);
        run_case(g, &r, type, &b);
    }
    /* the tiles bench-kernels --cm-cfg sweeps for small M (not defaults yet): each on Q4_K, with
     * edge tiles along M and N, 16-wide fragments */
    g->dev->cm.n = 16 % g->dev->cm.sg ? g->dev->cm.n : 16;
    const uint32_t tiles[][2] = {{32, 128}, {32, 64}, {16, 128}, {16, 64}, {64, 32}};
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) {
        g->dev->cm_tile_m = tiles[i][0], g->dev->cm_tile_n = tiles[i][1];
        mm_case c = {.M = tiles[i][0] + 5, .N = tiles[i][1] + 6, .K = 3 * block_of(VKI_GGML_Q4_K), .x_pad = 1,
                     .path = OP_MM_COOPMAT};
        run_case(g, &r, VKI_GGML_Q4_K, &c);
    }
    /* a tile with its subgroups' tile as bench-kernels --cm-cfg BMxBNxWMxWN forces it: 32 x 64 warp
     * tiles (four fragments along N: the 64-wide warp tiles the sweep tries) */
    g->dev->cm_tile_m = 64, g->dev->cm_tile_n = 64, g->dev->cm_warp_m = 32, g->dev->cm_warp_n = 64;
    mm_case wt = {.M = 70, .N = 67, .K = 2 * block_of(VKI_GGML_Q4_K), .bias = true, .path = OP_MM_COOPMAT};
    run_case(g, &r, VKI_GGML_Q4_K, &wt);
    g->dev->cm_warp_m = 48; /* not a multiple of the fragment into the tile: refused */
    vt_begin(g);
    vkd_buffer *b = vt_buf_nan(g, 4096, "b");
    vk_tensor tw;
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_F32, 16, 16, 0, "w", &tw), VKI_OK);
    assert_int_equal(op_matmul_path(&g->cmd, &tw, NULL, vkd_whole(b), 16, vkd_whole(b), 16, 16, OP_MM_COOPMAT),
                     VKI_ERR_UNSUPPORTED);
    vt_submit_wait(g);
    vk_tensor_destroy(g->dev, &tw);
    vkd_buffer_destroy(g->dev, b);
    g->dev->cm_tile_m = g->dev->cm_tile_n = g->dev->cm_warp_m = g->dev->cm_warp_n = 0;
    g->dev->info = saved;
    g->dev->cm = saved_cm;
    vt_assert_clean(g);
}

static void run_split_cases(vt_gpu *g, vt_rng *r)
{
    static const struct {
        uint32_t type, force, splits, M, N, K;
        bool bias, accum, gpu;
    } cases[] = {
        {VKI_GGML_F32, 2, 2, 65, 70, 77, true, false, false},     /* 3 steps of 32: 64 + 13 */
        {VKI_GGML_F16, 3, 3, 9, 129, 200, false, true, false},    /* 7 steps: 96 + 96 + 8 */
        {VKI_GGML_Q4_K, 5, 5, 33, 64, 1280, true, true, false},   /* 40 steps: 8 each */
        {VKI_GGML_Q8_0, 16, 7, 17, 31, 224, false, false, false}, /* 7 steps: one each */
        {VKI_GGML_F32, 4, 4, 130, 20, 1000, true, false, true},   /* 128-row tiles, two along M (the
                                                                    * pipeline test_coopmat_gpu_configs
                                                                    * compiled): 32 steps, 8 a split */
        {VKI_GGML_F32, 2, 1, 5, 5, 32, false, false, false},      /* one step: nothing to split */
    };
    const vki_device_info saved = g->dev->info;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].gpu) {
            g->dev->info.type = VKI_DEVICE_DISCRETE;
            g->dev->info.max_compute_shared_memory = 48 * 1024;
        }
        g->dev->cm_split = cases[i].force;
        mm_case c = {.M = cases[i].M, .N = cases[i].N, .K = cases[i].K, .y_pad = 3, .x_pad = 1,
                     .bias = cases[i].bias, .accum = cases[i].accum, .path = OP_MM_COOPMAT};
        assert_int_equal(op_matmul_cm_splits(g->dev, c.M, c.N, c.K), cases[i].splits);
        run_case(g, r, cases[i].type, &c);
        g->dev->info = saved;
    }
}

/* Split-K of the tensor-core GEMM (matmul_cm.comp's workgroup z) through the emulation and,
 * where the device has them, on tensor cores: forced split counts with edge tiles, K not a
 * multiple of the splits (and float K tails), bias and accumulation; 64-row tiles (CPU devices)
 * and, presented as a GPU, 128-row ones. */
static void test_coopmat_split(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("coopmat split");
    const vki_device_info saved = g->dev->info;
    if (g->dev->nv_coopmat && vkd_coopmat_select(g->dev, VKI_COOPMAT_AUTO) == VKI_OK && g->dev->cm.kind == VKD_CM_NV)
        run_split_cases(g, &r);
    if (vkd_coopmat_select(g->dev, VKI_COOPMAT_EMULATED) != VKI_OK)
        skip();
    run_split_cases(g, &r);
    /* no split where the device does not tell its compute units, unless forced */
    g->dev->cm_split = 0;
    g->dev->info.compute_units = 0;
    assert_int_equal(op_matmul_cm_splits(g->dev, 33, 64, 4096), 1);
    /* automatic: two workgroups per compute unit, splits of >= 256 (64 x 64 tiles here) */
    g->dev->info.compute_units = 16;
    assert_int_equal(op_matmul_cm_splits(g->dev, 33, 64, 4096), 16);  /* 1 tile: 32 wanted, 16 max */
    assert_int_equal(op_matmul_cm_splits(g->dev, 33, 256, 4096), 8);  /* 4 tiles */
    assert_int_equal(op_matmul_cm_splits(g->dev, 33, 256, 512), 2);   /* 512 / 256 */
    assert_int_equal(op_matmul_cm_splits(g->dev, 128, 1024, 4096), 1); /* 32 tiles fill 16 units */
    g->dev->info = saved;
    vt_assert_clean(g);
}

/* The tensor-core GEMM's staging variants against the default (one shared-memory stage, K steps
 * of 32, W staged 16 values per item), bit for bit (the same products in the same order): W staged
 * 4 values per item (W16 = 0: every case, with one stage; F32, Q8_0 and Q4_1 also with two at
 * BK = 64; F16 rows not 8-aligned and float K tails, which the 16-value items leave to the
 * per-quad loads, and dq_load16's Q8_0 and K-quant blocks against dq_load4), K steps of 16 (one
 * item per row: F32, Q8_0); two stages (matmul_cm.comp's STAGES
 * = 2: step k + 1 staged into the other buffer while step k's products run) and K steps of 64
 * (BK = 64: a quantised step half past K, read as zeros: X rows carry NaN in their stride
 * padding; Q4_1 rows are not padded to a scale group, so the last one's step past K would read
 * past the tensor; float K tails read as zeros), X rounded to F16 once by op_half_x (XH = 1, with
 * one stage and with two at BK = 64: its rows' zero tails and the steps past K), emulated and,
 * where present, on tensor cores;
 * odd and even step counts, edge tiles, split-K at split boundaries both step sizes share (each
 * split's own first step), accumulation and bias; each variant also against the F16-rounded
 * reference. */
static void test_coopmat_staging(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("coopmat staging");
    /* {stages, BK, X in F16, W by 4}; the first: the default of F32 X */
    static const uint32_t variants[][4] = {{1, 32, 0, 0}, {1, 32, 0, 1}, {2, 32, 0, 0}, {1, 64, 0, 0},
                                           {1, 32, 1, 0}, {2, 64, 1, 0}, {2, 64, 1, 1}, {1, 16, 0, 0}};
    enum { ALL = sizeof variants / sizeof variants[0] };
    static const struct {
        uint32_t type, M, N, K, split;
        bool bias, accum;
        uint32_t n_variants; /* the first n (the W items' cases: 2, the pipelines' cold compiles in CI) */
    } cases[] = {
        {VKI_GGML_F32, 70, 67, 77, 0, true, false, ALL},        /* 3 steps of 32 or 2 of 64, K tail */
        {VKI_GGML_F32, 65, 20, 1000, 4, false, false, ALL - 1}, /* 4 splits of 256 */
        {VKI_GGML_Q8_0, 33, 130, 32 * 7, 0, false, true, ALL},  /* 7 steps of 32 or 4 of 64 */
        {VKI_GGML_Q4_1, 17, 31, 32 * 39, 4, true, false, ALL - 1}, /* 4 splits of 320, the last 288 */
        {VKI_GGML_F16, 40, 33, 77, 0, false, false, 2},         /* odd rows not 8-aligned, K tail */
        {VKI_GGML_F16, 20, 70, 264, 0, true, false, 2},         /* 8-aligned rows, a tail of 8 */
        {VKI_GGML_Q4_K, 33, 40, 512, 0, false, true, 2},
        {VKI_GGML_Q5_K, 9, 24, 768, 0, true, false, 2},
        {VKI_GGML_Q6_K, 36, 17, 512, 0, false, false, 2},
    };
    for (int real = 0; real < 2; real++) {
        if (real ? !g->dev->nv_coopmat || vkd_coopmat_select(g->dev, VKI_COOPMAT_AUTO) != VKI_OK ||
                       g->dev->cm.kind != VKD_CM_NV
                 : vkd_coopmat_select(g->dev, VKI_COOPMAT_EMULATED) != VKI_OK)
            continue;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const uint32_t type = cases[i].type, M = cases[i].M, N = cases[i].N, K = cases[i].K, xs = K + 1;
            float *wref = malloc((size_t)N * K * 4), *x = malloc((size_t)M * xs * 4), *bias = malloc(N * 4);
            float *y0 = malloc((size_t)M * N * 4), *y = malloc((size_t)M * N * 4), *y1 = malloc((size_t)M * N * 4);
            float *ref = malloc((size_t)M * N * 4);
            uint8_t *raw = make_weights(&r, type, N, K, wref);
            vk_tensor t = upload_weights(g, type, N, K, raw, 1);
            for (uint32_t m = 0; m < M; m++) {
                vt_fill_uniform(&r, x + (size_t)m * xs, K, -1.0f, 1.0f);
                x[(size_t)m * xs + K] = NAN;
            }
            vt_fill_uniform(&r, bias, N, -2.0f, 2.0f);
            vt_fill_uniform(&r, y0, (size_t)M * N, -4.0f, 4.0f);
            vkd_buffer *bx = vt_buf_from(g, x, (size_t)M * xs * 4, "x"), *bb = vt_buf_from(g, bias, N * 4, "bias");
            vkd_view vb = vkd_whole(bb);
            mm_case c = {.M = M, .N = N, .K = K, .bias = cases[i].bias, .accum = cases[i].accum};
            reference(&c, x, xs, wref, cases[i].bias ? bias : NULL, cases[i].accum ? y0 : NULL, N, true, ref);
            g->dev->cm_split = cases[i].split;
            for (size_t v = 0; v < cases[i].n_variants; v++) {
                g->dev->cm_stages = variants[v][0], g->dev->cm_bk = variants[v][1], g->dev->cm_w4 = variants[v][3];
                assert_int_equal(op_matmul_cm_splits(g->dev, M, N, K), cases[i].split ? cases[i].split : 1);
                vkd_buffer *by = vt_buf_from(g, y0, (size_t)M * N * 4, "y");
                /* F16 X with NaN after its last row: a GEMM reading past a row's K fails */
                vkd_buffer *bh = variants[v][2] ? vt_buf_nan(g, op_half_x_bytes(M, K) + 256, "xh") : NULL;
                vt_begin(g);
                if (bh) {
                    assert_int_equal(op_half_x(&g->cmd, vkd_whole(bx), xs, M, K, vkd_whole(bh)), VKI_OK);
                    vkd_barrier(&g->cmd);
                    assert_int_equal(op_matmul_xh(&g->cmd, &t, cases[i].bias ? &vb : NULL, vkd_whole(bh),
                                                  vkd_whole(by), N, M, cases[i].accum),
                                     VKI_OK);
                } else {
                    assert_int_equal(op_matmul_ex(&g->cmd, &t, cases[i].bias ? &vb : NULL, vkd_whole(bx), xs,
                                                  vkd_whole(by), N, M, OP_MM_COOPMAT, cases[i].accum),
                                     VKI_OK);
                }
                vt_submit_wait(g);
                vt_download(g, by, v ? y : y1, (size_t)M * N * 4);
                vkd_buffer_destroy(g->dev, by);
                vkd_buffer_destroy(g->dev, bh);
                if (v && memcmp(y, y1, (size_t)M * N * 4))
                    fail_msg("%s %s M=%u N=%u K=%u split=%u: %u stages, BK %u, %s X, W by %u differ from the "
                             "default", quant_get(type)->name, real ? "tensor cores" : "emulated", M, N, K,
                             cases[i].split, variants[v][0], variants[v][1], variants[v][2] ? "F16" : "F32",
                             variants[v][3] ? 4 : 16);
                vt_assert_nmse(v ? y : y1, ref, (size_t)M * N, real ? CM_NV_TOL : CM_EMU_TOL, "coopmat staging");
            }
            g->dev->cm_split = g->dev->cm_stages = g->dev->cm_bk = 0;
            g->dev->cm_w4 = false;
            vk_tensor_destroy(g->dev, &t);
            vkd_buffer_destroy(g->dev, bx);
            vkd_buffer_destroy(g->dev, bb);
            free(wref); free(x); free(bias); free(y0); free(y); free(y1); free(raw); free(ref);
        }
    }
    g->dev->cm = g->cm0;
    vt_assert_clean(g);
}

/* op_half_x, the tensor-core GEMM's input rounded to F16 once: every element bit for bit what
 * quant_f32_to_f16 (round to nearest even) gives, ties, 65504, the values that round past it to
 * inf and signed zeros included; K tails of 1..3 (zeros up to the next multiple of 4, not the NaN
 * after K in the stride), rows of vec4 loads (K % 4 == 0, 16-byte offset) and of scalar ones, more
 * rows than workgroups along y;
 * argument refusals; when the forward pass takes this path (op_matmul_takes_xh). */
static void test_half_x(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vkd_device *d = g->dev;
    vt_rng r = vt_rng_seeded("half x");
    if (!d->info.float16)
        skip();
    static const float special[] = {0.0f, -0.0f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 65504.0f, 65519.0f, 65520.0f,
                                    -1e6f, 0x1p-14f, 2049.0f, -3.0f + 0x1p-10f, INFINITY};
    static const uint32_t Ks[] = {1, 2, 3, 5, 37, 64, 256};
    /* views at an offset (the device's binding alignment, at least 16 bytes: X's vec4 loads) */
    const uint32_t a = d->info.min_storage_buffer_offset_alignment > 16 ? (uint32_t)d->info.min_storage_buffer_offset_alignment
                                                                         : 16;
    const uint32_t gy = d->info.max_workgroup_count[1];
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
        /* every other case as on a device of 2 workgroups along y: rows grid-strided */
        d->info.max_workgroup_count[1] = ki % 2 ? 2 : gy;
        const uint32_t K = Ks[ki], M = 3 + (uint32_t)ki % 3, xs = K % 4 ? K + 1 : K, K4 = op_half_x_stride(K);
        const size_t n = a / 4 + (size_t)M * xs;
        float *x = malloc(n * 4);
        uint16_t *got = malloc((size_t)M * K4 * 2);
        vt_fill_uniform(&r, x, n, -40.0f, 40.0f);
        for (uint32_t m = 0; m < M; m++) {
            for (uint32_t k = 0; k < K && m == 1; k++)
                x[a / 4 + k + xs] = special[k % (sizeof special / sizeof special[0])];
            if (xs > K)
                x[a / 4 + (size_t)m * xs + K] = NAN;
        }
        vkd_buffer *bx = vt_buf_from(g, x, n * 4, "x"), *bh = vt_buf_nan(g, op_half_x_bytes(M, K) + a, "xh");
        assert_int_equal(op_half_x_bytes(M, K), (uint64_t)M * K4 * 2);
        vt_begin(g);
        assert_int_equal(op_half_x(&g->cmd, (vkd_view){bx, a, VK_WHOLE_SIZE}, xs, M, K, (vkd_view){bh, a, VK_WHOLE_SIZE}),
                         VKI_OK);
        vt_submit_wait(g);
        assert_int_equal(vkd_download(d, bh, a, got, (size_t)M * K4 * 2), VKI_OK);
        for (uint32_t m = 0; m < M; m++)
            for (uint32_t k = 0; k < K4; k++) {
                const uint16_t want = k < K ? quant_f32_to_f16(x[a / 4 + (size_t)m * xs + k]) : 0;
                if (got[(size_t)m * K4 + k] != want)
                    fail_msg("half_x K=%u row %u col %u: %04x, want %04x (x = %a)", K, m, k, got[(size_t)m * K4 + k],
                             want, k < K ? x[a / 4 + (size_t)m * xs + k] : 0.0f);
            }
        vkd_buffer_destroy(d, bx);
        vkd_buffer_destroy(d, bh);
        free(x);
        free(got);
    }
    d->info.max_workgroup_count[1] = gy;
    /* refusals: nothing recorded */
    vkd_buffer *b = vt_buf_nan(g, 4096, "b");
    vk_tensor tw;
    assert_int_equal(vk_tensor_create(d, VKI_GGML_F32, 16, 16, 0, "w", &tw), VKI_OK);
    vt_begin(g);
    assert_int_equal(op_half_x(&g->cmd, vkd_whole(b), 16, 0, 16, vkd_whole(b)), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_half_x(&g->cmd, vkd_whole(b), 8, 2, 16, vkd_whole(b)), VKI_ERR_INVALID_ARG); /* stride < K */
    assert_int_equal(op_half_x(&g->cmd, vkd_whole(b), 16, 2, 16, (vkd_view){b, 4, VK_WHOLE_SIZE}), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_half_x(&g->cmd, vkd_whole(b), 16, 2, 16, (vkd_view){b, 0, 63}), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul_xh(&g->cmd, &tw, NULL, (vkd_view){b, 0, 16 * 16 * 2 - 1}, vkd_whole(b), 16, 16, false),
                     VKI_ERR_INVALID_ARG); /* 16 rows of F16 X need 512 bytes */
    const vkd_cm saved = d->cm;
    const bool saved_x32 = d->cm_x32;
    assert_int_equal(vkd_coopmat_select(d, VKI_COOPMAT_OFF), VKI_OK);
    assert_int_equal(op_matmul_xh(&g->cmd, &tw, NULL, vkd_whole(b), vkd_whole(b), 16, 16, false), VKI_ERR_UNSUPPORTED);
    assert_false(op_matmul_takes_xh(d, 4096));
    vt_submit_wait(g);
    if (vkd_coopmat_select(d, VKI_COOPMAT_EMULATED) == VKI_OK) {
        const uint32_t m = op_matmul_gemv_max_m(d);
        assert_false(op_matmul_takes_xh(d, m));
        assert_true(op_matmul_takes_xh(d, m + 1));
        assert_int_equal(op_kernel_config(d, "gemm_xh=0", true), VKI_OK);
        assert_false(op_matmul_takes_xh(d, m + 1));
        assert_int_equal(op_kernel_config(d, "gemm_xh=1", true), VKI_OK);
        assert_true(op_matmul_takes_xh(d, m + 1));
    }
    d->cm = saved;
    d->cm_x32 = saved_x32;
    vk_tensor_destroy(d, &tw);
    vkd_buffer_destroy(d, b);
    vt_assert_clean(g);
}

/* Split GEMMs recorded back to back without a barrier (the projections of one input) each take
 * their own scratch slot; the fifth runs unsplit; a barrier frees the slots. Two rounds in one
 * command buffer, then the command buffer again: the tile counters are back at zero after every
 * dispatch, or a later split would miss its last workgroup (NaN left in Y) or sum too early. */
static void test_coopmat_split_slots(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("coopmat split slots");
    if (vkd_coopmat_select(g->dev, VKI_COOPMAT_EMULATED) != VKI_OK)
        skip();
    g->dev->cm_split = 3;
    enum { NW = VKD_SPLIT_SLOTS + 1 };
    const uint32_t M = 40, N = 72, K = 320, type = VKI_GGML_Q8_0;
    mm_case s = {.M = M, .N = N, .K = K};
    float *x = malloc((size_t)M * K * 4), *wref = malloc((size_t)NW * N * K * 4), *ref = malloc((size_t)M * N * 4);
    float *got = malloc((size_t)M * N * 4);
    vt_fill_uniform(&r, x, (size_t)M * K, -1.0f, 1.0f);
    vkd_buffer *bx = vt_buf_from(g, x, (size_t)M * K * 4, "x"), *by[NW];
    vk_tensor w[NW];
    uint8_t *raw[NW];
    for (int i = 0; i < NW; i++) {
        raw[i] = make_weights(&r, type, N, K, wref + (size_t)i * N * K);
        w[i] = upload_weights(g, type, N, K, raw[i], 1);
        by[i] = vt_buf_nan(g, (size_t)M * N * 4, "y");
    }
    for (int round = 0; round < 2; round++) {
        vt_begin(g);
        for (int twice = 0; twice < 2; twice++) {
            for (int i = 0; i < NW; i++) {
                assert_int_equal(op_matmul_ex(&g->cmd, &w[i], NULL, vkd_whole(bx), K, vkd_whole(by[i]), N, M,
                                              OP_MM_COOPMAT, false),
                                 VKI_OK);
                assert_int_equal(g->cmd.split_slots, (uint32_t)i < VKD_SPLIT_SLOTS ? (uint32_t)i + 1 : VKD_SPLIT_SLOTS);
            }
            vkd_barrier(&g->cmd);
            assert_int_equal(g->cmd.split_slots, 0);
        }
        vt_submit_wait(g);
        for (int i = 0; i < NW; i++) {
            vt_download(g, by[i], got, (size_t)M * N * 4);
            reference(&s, x, K, wref + (size_t)i * N * K, NULL, NULL, N, true, ref);
            char label[64];
            snprintf(label, sizeof label, "round %d, GEMM %d of %d", round, i + 1, NW);
            vt_assert_nmse(got, ref, (size_t)M * N, CM_EMU_TOL, label);
            assert_int_equal(vkd_fill(g->dev, by[i], 0, (size_t)M * N * 4, NAN_BITS), VKI_OK);
        }
    }
    for (int i = 0; i < NW; i++) {
        vk_tensor_destroy(g->dev, &w[i]);
        vkd_buffer_destroy(g->dev, by[i]);
        free(raw[i]);
    }
    vkd_buffer_destroy(g->dev, bx);
    free(x); free(wref); free(ref); free(got);
    vt_assert_clean(g);
}

/* No memory for the split-K scratch (a device memory limit): the GEMM runs unsplit and right,
 * with a warning, and is not tried again. */
static void test_coopmat_split_no_memory(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("coopmat split no memory");
    if (vkd_coopmat_select(g->dev, VKI_COOPMAT_EMULATED) != VKI_OK)
        skip();
    vkd_device *d = g->dev;
    vkd_buffer_destroy(d, d->split_part); /* as if never made */
    vkd_buffer_destroy(d, d->split_cnt);
    d->split_part = d->split_cnt = NULL;
    const VkDeviceSize saved_limit = d->mem_limit;
    d->mem_limit = d->bytes_allocated[VKD_MEM_DEVICE] + d->bytes_allocated[VKD_MEM_HOST] + (4u << 20);
    d->cm_split = 4;
    for (int i = 0; i < 2; i++) {
        mm_case c = {.M = 20, .N = 40, .K = 512, .bias = true, .path = OP_MM_COOPMAT};
        run_case(g, &r, VKI_GGML_Q8_0, &c);
        assert_true(d->split_failed);
        assert_null(d->split_part);
    }
    d->mem_limit = saved_limit;
    d->split_failed = false;
    vt_assert_clean(g);
}

/* Every pipeline variant exists up front (what the engine does at open). */
static void test_prepare(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    for (size_t i = 0; i < vt_n_weight_types; i++) {
        assert_true(op_matmul_supported(g->dev, vt_weight_types[i]));
        assert_int_equal(op_matmul_prepare(g->dev, vt_weight_types[i]), VKI_OK);
        assert_int_equal(op_matmul_warm_up(g->dev, vt_weight_types[i]), VKI_OK);
    }
    assert_int_equal(op_matmul_prepare(g->dev, 16 /* IQ2_XXS: not run by vkinfer */), VKI_ERR_UNSUPPORTED);
    assert_int_equal(op_matmul_prepare(g->dev, 4 /* no ggml type */), VKI_ERR_UNSUPPORTED);
    vk_tensor t; /* nor can a tensor of it be made */
    assert_int_equal(vk_tensor_create(g->dev, 16, 256, 4, 0, "iq2_xxs", &t), VKI_ERR_UNSUPPORTED);
    vt_assert_clean(g);
}

/* Both sides of the GEMV/GEMM switch with the same shapes, for every type, with bias and
 * several parts, replacing Y and adding to it. */
static void test_boundary_parts_bias(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("boundary");
    for (size_t i = 0; i < vt_n_weight_types; i++)
        for (uint32_t M = op_matmul_gemv_max_m(g->dev); M <= op_matmul_gemv_max_m(g->dev) + 1; M++) {
            uint32_t K = vt_is_float_type(vt_weight_types[i]) ? 37 : block_of(vt_weight_types[i]) * 3;
            for (int accum = 0; accum < 2; accum++) {
                mm_case s = {.M = M, .N = 67, .K = K, .x_pad = 3, .y_pad = 1, .bias = true, .accum = accum,
                             .parts = 4};
                run_case(g, &r, vt_weight_types[i], &s);
            }
        }
    vt_assert_clean(g);
}

/* Presents lavapipe as a GPU with 32-lane subgroups (NVIDIA's matvec and row workgroups) where
 * it can run them; the smallest subgroup size stays the real one (the GEMV's reduction is sized
 * from it). Restore with g->dev->info = saved. */
static void as_nvidia(vt_gpu *g, const vki_device_info *saved)
{
    g->dev->info.type = VKI_DEVICE_DISCRETE;
    g->dev->info.subgroup_size = 32;
    if (!g->dev->info.subgroup_min_size)
        g->dev->info.subgroup_min_size = saved->subgroup_size;
}

/* The configurations ops_matmul.c picks for NVIDIA (GEMV: 128 invocations x 4 rows; GEMM:
 * 128x128 tiles, BK 16, 256 invocations) also fit lavapipe's real limits, so they are checked
 * here by presenting the device as a GPU with 32-lane subgroups and 48 KiB of shared memory.
 * The smallest subgroup size stays the real one: the GEMV's reduction is sized from it. */
static void test_gpu_configs(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("gpu_configs");
    vki_device_info saved = g->dev->info;
    if (saved.max_compute_shared_memory < 17 * 1024 || saved.max_workgroup_invocations < 256)
        skip();
    as_nvidia(g, &saved);
    g->dev->info.max_compute_shared_memory = 48 * 1024;
    static const mm_case cases[] = {
        {.M = 1, .N = 9, .K = 0, .bias = true},  {.M = 5, .N = 67, .K = 0, .x_pad = 1, .accum = true},
        {.M = 1, .N = 5, .K = 1},                /* K = 1: big_k below */
        {.M = 9, .N = 129, .K = 0, .path = OP_MM_GEMM},
        {.M = 129, .N = 127, .K = 0, .y_pad = 2, .accum = true, .parts = 2},
        {.M = 31, .N = 7, .K = 1, .bias = true, .path = OP_MM_GEMM},
        {.M = 31, .N = 9, .K = 0, .accum = true, .path = OP_MM_GEMV}, /* 4 chunks of 8 rows */
        {.M = 40, .N = 5, .K = 0, .bias = true, .path = OP_MM_GEMV},  /* and a second workgroup row */
    };
    for (size_t i = 0; i < vt_n_weight_types; i++) {
        uint32_t type = vt_weight_types[i];
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            mm_case s = cases[c];
            s.K = s.K ? big_k(type) / 2 : (vt_is_float_type(type) ? 77 : 3 * block_of(type));
            if (!vt_is_float_type(type) && s.K % block_of(type))
                s.K += block_of(type) - s.K % block_of(type);
            run_case(g, &r, type, &s);
        }
    }
    g->dev->info = saved;
    vt_assert_clean(g);
}

/* N beyond what one dispatch's workgroup count covers is split over dispatches (n0 > 0):
 * checked by presenting a device that allows only 2 workgroups along x and 3 along y. */
static void test_dispatch_split(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("dispatch_split");
    vki_device_info saved = g->dev->info;
    g->dev->info.max_workgroup_count[0] = 2;
    g->dev->info.max_workgroup_count[1] = 3;
    for (size_t i = 0; i < vt_n_weight_types; i++) {
        uint32_t K = vt_is_float_type(vt_weight_types[i]) ? 21 : block_of(vt_weight_types[i]);
        mm_case gemv = {.M = 3, .N = 150, .K = K, .bias = true, .parts = 2};
        mm_case gemm = {.M = 90, .N = 300, .K = K, .y_pad = 1}; /* 3 rows of 32-row CPU tiles (<= 3 in y) */
        run_case(g, &r, vt_weight_types[i], &gemv);
        run_case(g, &r, vt_weight_types[i], &gemm);
    }
    g->dev->info = saved;
    vt_assert_clean(g);
}

/* op_matmul_glu (gate | up and their gated unit in one matrix-vector pass) for every type, both
 * activations, 1..17 rows, odd N: the same bits as op_matmul into [gate | up] and op_glu, and
 * act(gate) * up of the CPU reference's dot products (double; act in f32) to GLU_TOL.
 * Also under the NVIDIA-like configuration (32-lane subgroups, 4-row workgroups: 2 outputs). */
/* The activation in f32, as the device computes it: GELU's 1 + tanh(z) is 0 in f32 below
 * z ~ -9 where double keeps ~1e-10, and one such output alone would be an NMSE of 1. How
 * closely the f32 formulas follow the exact ones is test_ops' glu case. */
static float glu_ref_act(uint32_t act, float v)
{
    if (act == VKI_GLU_GELU_TANH) {
        float z = 0.7978845608028654f * v * (1.0f + 0.044715f * v * v);
        return 0.5f * v * (1.0f + tanhf(z < -9.0f ? -9.0f : z > 9.0f ? 9.0f : z));
    }
    return v / (1.0f + expf(-v));
}

static unsigned glu_xq_runs; /* glu_case runs that checked the quantised output */

/* One case; adds its squared error and squared reference to err[0], err[1] (the NMSE is taken
 * over all cases of a type: a single output in GELU's saturated tail, ~1e-7 where the f32 tanh
 * of one side is -1 and the other's is not, would alone be an NMSE of 1). */
static void glu_case(vt_gpu *g, vt_rng *r, uint32_t type, uint32_t M, uint32_t N, uint32_t K, uint32_t act,
                     double err[2])
{
    const uint32_t xs = gemv_x_stride(g->dev, type, K, (uint32_t)vt_range(r, 0, 2));
    const uint32_t ys = N + (uint32_t)vt_range(r, 0, 2);
    float *wref = malloc((size_t)2 * N * K * sizeof(float)), *x = malloc((size_t)M * xs * 4);
    uint8_t *raw = make_weights(r, type, 2 * N, K, wref);
    vk_tensor t = upload_weights(g, type, 2 * N, K, raw, 1);
    for (uint32_t i = 0; i < M * xs; i++)
        x[i] = vt_uniform(r, -1.0f, 1.0f);
    vkd_buffer *bx = vt_buf_from(g, x, (size_t)M * xs * 4, "x");
    vkd_buffer *by = vt_buf_nan(g, (size_t)M * ys * 4, "y"), *bgu = vt_buf_nan(g, (size_t)M * 2 * N * 4, "gu");
    vkd_buffer *bz = vt_buf_nan(g, (size_t)M * ys * 4, "y op by op");
    /* N % 32 == 0: twice more with the output quantised (op_mm_glu_xq; the second run needs the
     * counters back at zero), against op_quant_x8 of the op by op result */
    const bool gq = N % 32 == 0 && op_matmul_glu_xq_fits(g->dev, &t);
    const size_t qb = gq ? op_quant_x8_bytes(M, N) : 4;
    vkd_buffer *cnt = vt_buf_nan(g, N / 32 * 4 + 4, "counters"), *bq[3], *byq[2];
    for (int i = 0; i < 3; i++)
        bq[i] = vt_buf_nan(g, qb, "yq");
    for (int i = 0; i < 2; i++)
        byq[i] = vt_buf_nan(g, (size_t)M * ys * 4, "y of the quantising pass");
    vt_begin(g);
    assert_int_equal(vkd_fill(g->dev, cnt, 0, cnt->size, 0), VKI_OK);
    assert_int_equal(op_matmul_glu(&g->cmd, &t, act, vkd_whole(bx), xs, vkd_whole(by), ys, M, NULL), VKI_OK);
    assert_int_equal(op_matmul_path(&g->cmd, &t, NULL, vkd_whole(bx), xs, vkd_whole(bgu), 2 * N, M, OP_MM_GEMV),
                     VKI_OK);
    vkd_barrier(&g->cmd);
    assert_int_equal(op_glu(&g->cmd, act, (op_mat){vkd_whole(bgu), 0, 2 * N}, (op_mat){vkd_whole(bgu), N, 2 * N},
                            (op_mat){vkd_whole(bz), 0, ys}, M, N), VKI_OK);
    for (int i = 0; i < 2 && gq; i++) {
        op_mm_glu_xq q = {vkd_whole(cnt), vkd_whole(bq[i])};
        assert_int_equal(op_matmul_glu(&g->cmd, &t, act, vkd_whole(bx), xs, vkd_whole(byq[i]), ys, M, &q), VKI_OK);
        vkd_barrier(&g->cmd);
    }
    if (gq)
        assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bz), ys, M, N, vkd_whole(bq[2])), VKI_OK);
    if (!gq && N % 32 == 0) { /* a matvec shape whose workgroups straddle blocks of 32: refused */
        op_mm_glu_xq q = {vkd_whole(cnt), vkd_whole(bq[0])};
        assert_int_equal(op_matmul_glu(&g->cmd, &t, act, vkd_whole(bx), xs, vkd_whole(byq[0]), ys, M, &q),
                         VKI_ERR_INVALID_ARG);
    }
    vt_submit_wait(g);
    float *y = malloc((size_t)M * ys * 4), *z = malloc((size_t)M * ys * 4), *got = malloc((size_t)M * N * 4);
    float *ref = malloc((size_t)M * N * 4);
    vt_download(g, by, y, (size_t)M * ys * 4);
    vt_download(g, bz, z, (size_t)M * ys * 4);
    char label[128];
    snprintf(label, sizeof label, "glu %s %s M=%u N=%u K=%u", quant_get(type)->name,
             act == VKI_GLU_SILU ? "silu" : "gelu", M, N, K);
    if (memcmp(y, z, (size_t)M * ys * 4)) /* padding too: NaN where neither wrote */
        fail_msg("%s: differs from op_matmul + op_glu (NMSE %.3g)", label, vt_nmse(y, z, (size_t)M * ys));
    for (int i = 0; i < 2 && gq; i++) {
        uint8_t *qa = malloc(qb), *qr = malloc(qb);
        vt_download(g, byq[i], y, (size_t)M * ys * 4);
        if (memcmp(y, z, (size_t)M * ys * 4))
            fail_msg("%s, quantising (run %d): Y differs from op_matmul + op_glu", label, i + 1);
        vt_download(g, bq[i], qa, qb);
        vt_download(g, bq[2], qr, qb);
        if (memcmp(qa, qr, qb))
            fail_msg("%s, quantising (run %d): its int8 Y differs from op_quant_x8's", label, i + 1);
        free(qa), free(qr);
        glu_xq_runs++;
    }
    vt_download(g, by, y, (size_t)M * ys * 4);
    for (uint32_t m = 0; m < M; m++)
        for (uint32_t n = 0; n < N; n++) {
            double a = 0, b = 0;
            for (uint32_t k = 0; k < K; k++) {
                a += (double)x[(size_t)m * xs + k] * wref[(size_t)n * K + k];
                b += (double)x[(size_t)m * xs + k] * wref[(size_t)(N + n) * K + k];
            }
            ref[(size_t)m * N + n] = (float)((double)glu_ref_act(act, (float)a) * b);
            got[(size_t)m * N + n] = y[(size_t)m * ys + n];
        }
    for (size_t i = 0; i < (size_t)M * N; i++) {
        err[0] += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        err[1] += (double)ref[i] * ref[i];
    }
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, bx);
    vkd_buffer_destroy(g->dev, by);
    vkd_buffer_destroy(g->dev, bgu);
    vkd_buffer_destroy(g->dev, bz);
    vkd_buffer_destroy(g->dev, cnt);
    for (int i = 0; i < 3; i++)
        vkd_buffer_destroy(g->dev, bq[i]);
    for (int i = 0; i < 2; i++)
        vkd_buffer_destroy(g->dev, byq[i]);
    free(wref); free(x); free(raw); free(y); free(z); free(got); free(ref);
}

static double worst_glu;
#define GLU_TOL 1e-11 /* measured on lavapipe: <= 1.1e-13 over seeds 1-4 */

static void test_glu_epilogue(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("glu");
    vki_device_info saved = g->dev->info;
    /* N = 64, M = 37: the quantised output too, with two workgroups along y per block */
    static const uint32_t Ms[] = {1, 3, 8, 9, 17, 37}, Ns[] = {1, 7, 33, 65, 5, 64};
    for (int config = 0; config < 2; config++) {
        if (config == 1) /* NVIDIA's matvec shape where lavapipe can run it */
            as_nvidia(g, &saved);
        for (size_t i = 0; i < vt_n_weight_types; i++) {
            uint32_t type = vt_weight_types[i];
            double err[2] = {0, 0};
            for (uint32_t c = 0; c < 6; c++) {
                uint32_t K = c == 4 ? big_k(type) : pick_k(&r, type, c == 5 ? 2 : c + 3);
                glu_case(g, &r, type, Ms[c], Ns[c], K, (c + config) % 2 ? VKI_GLU_GELU_TANH : VKI_GLU_SILU, err);
            }
            double nmse = err[0] / (err[1] > 0 ? err[1] : 1);
            if (!(nmse <= GLU_TOL))
                fail_msg("glu %s (config %d): NMSE %.3g > %.0e over its cases", quant_get(type)->name, config, nmse,
                         GLU_TOL);
            worst_glu = nmse > worst_glu ? nmse : worst_glu;
        }
        g->dev->info = saved;
    }
    fprintf(stderr, "  glu epilogue: worst NMSE %.2e over a type's cases, bitwise equal to matmul + glu; %u "
            "quantised outputs equal to quant_x8's\n", worst_glu, glu_xq_runs);
    assert_true(glu_xq_runs >= 2 * 2 * vt_n_weight_types);
    /* refused: an odd number of rows, an unknown activation, M = 0 */
    vk_tensor t;
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_F32, 16, 7, 0, "w", &t), VKI_OK);
    vkd_buffer *x = vt_buf_nan(g, 4 * 16 * 2, "x"), *y = vt_buf_nan(g, 4 * 8 * 2, "y");
    vt_begin(g);
    assert_int_equal(op_matmul_glu(&g->cmd, &t, VKI_GLU_SILU, vkd_whole(x), 16, vkd_whole(y), 4, 1, NULL),
                     VKI_ERR_INVALID_ARG);
    vk_tensor_destroy(g->dev, &t);
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_F32, 16, 8, 0, "w", &t), VKI_OK);
    assert_int_equal(op_matmul_glu(&g->cmd, &t, 7, vkd_whole(x), 16, vkd_whole(y), 4, 1, NULL), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul_glu(&g->cmd, &t, VKI_GLU_SILU, vkd_whole(x), 16, vkd_whole(y), 4, 0, NULL),
                     VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul_glu(&g->cmd, &t, VKI_GLU_SILU, vkd_whole(x), 16, vkd_whole(y), 4, 2, NULL), VKI_OK);
    vt_submit_wait(g);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, x);
    vkd_buffer_destroy(g->dev, y);
    vt_assert_clean(g);
}

/* The matrix-vector kernel's configurations bench-kernels --matvec-cfg sweeps on a GPU
 * (vkd_device.matvec_wg / matvec_rows: invocations at most one subgroup or a multiple of it, x
 * weight rows): a workgroup smaller than a subgroup over one row, one subgroup over an odd row
 * count (the gate|up pass rounds it up to even), two and three subgroups (shared reduction)
 * over 2 and 5 rows; against the reference like every GEMV, and the gate|up pass too. */
static void test_matvec_overrides(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("matvec overrides");
    uint32_t sg = g->dev->info.subgroup_min_size ? g->dev->info.subgroup_min_size : g->dev->info.subgroup_size;
    /* {invocations, weight rows, activation rows per pass (0: the library's)}: the last two
     * take the MC that bench-kernels --matvec-cfg sweeps: 19 rows in passes of 16 + 3 and of 4 */
    const uint32_t cfg[6][3] = {{sg > 1 ? sg / 2 : 1, 1, 0}, {sg, 3, 0}, {2 * sg, 2, 0}, {3 * sg, 5, 0},
                                {2 * sg, 2, 16}, {sg, 3, 4}};
    const uint32_t types[2] = {VKI_GGML_F32, VKI_GGML_Q4_K};
    for (int c = 0; c < 6; c++) {
        if (cfg[c][0] > g->dev->info.max_workgroup_invocations)
            continue;
        g->dev->matvec_wg = cfg[c][0], g->dev->matvec_rows = cfg[c][1], g->dev->matvec_mc = cfg[c][2];
        for (int t = 0; t < 2; t++) {
            uint32_t K = vt_is_float_type(types[t]) ? 45 : 2 * block_of(types[t]);
            mm_case a = {.M = 1, .N = 11, .K = K, .bias = true, .path = OP_MM_GEMV};
            mm_case b = {.M = 19, .N = 7, .K = K, .x_pad = 1, .y_pad = 3, .accum = true, .parts = 2,
                         .path = OP_MM_GEMV};
            run_case(g, &r, types[t], &a);
            run_case(g, &r, types[t], &b);
            if (cfg[c][1] % 2) { /* the gate|up pass over an odd row count */
                double err[2] = {0, 0};
                glu_case(g, &r, types[t], 1, 9, K, VKI_GLU_SILU, err);
                glu_case(g, &r, types[t], 3, 5, K, VKI_GLU_GELU_TANH, err);
                /* quantised: 2 output rows per workgroup; 3 straddle blocks of 32 (refused) */
                glu_case(g, &r, types[t], 2, 32, K, VKI_GLU_SILU, err);
                if (!(err[0] <= GLU_TOL * err[1]))
                    fail_msg("glu %s, matvec %ux%u: NMSE %.3g > %.0e", quant_get(types[t])->name, cfg[c][0],
                             cfg[c][1], err[0] / err[1], GLU_TOL);
            }
        }
    }
    vt_assert_clean(g);
}

/* The matrix-vector kernel's units per K pass (vkd_device.matvec_mu, bench-kernels --matvec-cfg
 * WGxRxMCxMU) and its two orders of a unit's work (X-stationary where the activation rows per
 * pass MC <= the weight rows NR, else the NR decoded rows stationary): each invocation adds the
 * same terms in the same order whatever MU, NR and the order, so MU = 3 and one weight row per
 * workgroup (MC > NR with 3 and 5 activation rows) give the bits of the default, on the float
 * kernel and the integer-dot one, with K such that the passes leave units for the
 * one-at-a-time loop. */
static void test_matvec_units(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("matvec units");
    static const struct { uint32_t type, M, K; bool i8; } cases[] = {
        {VKI_GGML_F32, 1, 16 * 37 + 5, false}, {VKI_GGML_Q4_K, 5, 256 * 3, false}, {VKI_GGML_Q8_0, 3, 32 * 41, true},
        {VKI_GGML_Q6_K, 3, 256 * 5, true}, /* integer units of 32 elements (DQI_G = 8) */
        {VKI_GGML_Q6_K, 3, 256 * 5, false}, /* the same units on the float path (two spans) */
    };
    const uint32_t N = 13;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint32_t type = cases[i].type, M = cases[i].M, K = cases[i].K;
        if (cases[i].i8 && !op_matmul_i8_supported(g->dev, type))
            continue;
        float *wref = malloc((size_t)N * K * 4), *x = malloc((size_t)M * K * 4);
        float *y[3] = {malloc((size_t)M * N * 4), malloc((size_t)M * N * 4), malloc((size_t)M * N * 4)};
        uint8_t *raw = make_weights(&r, type, N, K, wref);
        vk_tensor t = upload_weights(g, type, N, K, raw, 1);
        vt_fill_uniform(&r, x, (size_t)M * K, -1.0f, 1.0f);
        vkd_buffer *bx = vt_buf_from(g, x, (size_t)M * K * 4, "x"), *by = vt_buf_nan(g, (size_t)M * N * 4, "y");
        vkd_buffer *bq = vt_buf_nan(g, op_quant_x8_bytes(M, K), "xq");
        for (uint32_t v = 0; v < 3; v++) {
            const uint32_t mu = v == 1 ? 3 : 1; /* 3: whole passes, then single units (lavapipe: 8 lanes) */
            g->dev->matvec_mu = mu;
            g->dev->matvec_rows = v == 2 ? 1 : 0; /* NR = 1: MC > NR with several activation rows */
            vt_begin(g);
            if (cases[i].i8) {
                assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bx), K, M, K, vkd_whole(bq)), VKI_OK);
                vkd_barrier(&g->cmd);
                assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(by), N, M, NULL), VKI_OK);
            } else {
                assert_int_equal(op_matmul_ex(&g->cmd, &t, NULL, vkd_whole(bx), K, vkd_whole(by), N, M, OP_MM_GEMV,
                                              false),
                                 VKI_OK);
            }
            vt_submit_wait(g);
            vt_download(g, by, y[v], (size_t)M * N * 4);
            if (v && memcmp(y[v], y[0], (size_t)M * N * 4))
                fail_msg("%s%s M=%u K=%u: %s differs from the default", quant_get(type)->name,
                         cases[i].i8 ? " (integer dot)" : "", M, K, v == 1 ? "MU = 3" : "one weight row per workgroup");
        }
        /* and MU = 1 is right (against the reference; the integer-dot product has its own test) */
        if (!cases[i].i8) {
            mm_case c = {.M = M, .N = N, .K = K};
            float *ref = malloc((size_t)M * N * 4);
            reference(&c, x, K, wref, NULL, NULL, N, false, ref);
            vt_assert_nmse(y[0], ref, (size_t)M * N, MM_TOL, "matvec units");
            free(ref);
        }
        g->dev->matvec_mu = g->dev->matvec_rows = 0;
        vk_tensor_destroy(g->dev, &t);
        vkd_buffer_destroy(g->dev, bx);
        vkd_buffer_destroy(g->dev, by);
        vkd_buffer_destroy(g->dev, bq);
        free(wref); free(x); free(raw); free(y[0]); free(y[1]); free(y[2]);
    }
    vt_assert_clean(g);
}

/* The library's matvec configuration back, also after a failure (the tests after it). */
static int matvec_overrides_reset(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    g->dev->matvec_wg = g->dev->matvec_rows = g->dev->matvec_mc = g->dev->matvec_mu = 0;
    return 0;
}

/* The projection that also norms (op_matmul_norm, decode at batch 1): twice in a row (the
 * counter must come back to zero), Y and H bit for bit what op_matmul_ex (accumulate, and a
 * bias on every other case) followed by op_rmsnorm give, for every type, awkward N and K, on lavapipe's and NVIDIA's matvec and
 * rmsnorm workgroup sizes; H also against a double-precision reference. Where N % 32 == 0 the
 * epilogue also quantises H (xq), byte for byte what op_quant_x8 writes from op_rmsnorm's H. */
static double worst_norm;
#define NORM_TOL 1e-14 /* squared error over the squared term magnitudes; measured on lavapipe: 5.5e-17 */

static void norm_case(vt_gpu *g, vt_rng *r, uint32_t type, uint32_t N, uint32_t K, bool with_bias, double err[2])
{
    float *wref = malloc((size_t)N * K * sizeof(float)), *x = malloc((size_t)K * 4), *y0 = malloc((size_t)N * 4);
    float *nw = malloc((size_t)N * 4), *bias = malloc((size_t)N * 4);
    uint8_t *raw = make_weights(r, type, N, K, wref);
    vk_tensor t = upload_weights(g, type, N, K, raw, 1);
    vt_fill_uniform(r, x, K, -1.0f, 1.0f);
    vt_fill_uniform(r, y0, N, -2.0f, 2.0f);
    vt_fill_uniform(r, nw, N, 0.5f, 1.5f);
    vt_fill_uniform(r, bias, N, -0.5f, 0.5f);
    if (!with_bias)
        memset(bias, 0, (size_t)N * 4);
    const float eps = 1e-5f;
    vkd_buffer *bx = vt_buf_from(g, x, (size_t)K * 4, "x"), *bw = vt_buf_from(g, nw, (size_t)N * 4, "norm w");
    vkd_buffer *bb = vt_buf_from(g, bias, (size_t)N * 4, "bias");
    const vkd_view bv = vkd_whole(bb), *b = with_bias ? &bv : NULL;
    vkd_buffer *by[2] = {vt_buf_from(g, y0, (size_t)N * 4, "y fused"), vt_buf_from(g, y0, (size_t)N * 4, "y apart")};
    vkd_buffer *bh[2] = {vt_buf_nan(g, (size_t)N * 4, "h fused"), vt_buf_nan(g, (size_t)N * 4, "h apart")};
    uint32_t zero = 0;
    vkd_buffer *bc = vt_buf_from(g, &zero, 4, "counter");
    const bool q = N % 32 == 0;
    const size_t qb = q ? op_quant_x8_bytes(1, N) : 4;
    vkd_buffer *bq[2] = {vt_buf_nan(g, qb, "hq fused"), vt_buf_nan(g, qb, "hq apart")};
    assert_true(op_matmul_norm_fits(g->dev, &t));
    op_mm_norm n = {vkd_whole(bw), vkd_whole(bh[0]), vkd_whole(bc), eps, .xq = q ? vkd_whole(bq[0]) : (vkd_view){0}};
    vt_begin(g);
    for (int rep = 0; rep < 2; rep++) {
        assert_int_equal(op_matmul_norm(&g->cmd, &t, b, vkd_whole(bx), vkd_whole(by[0]), &n), VKI_OK);
        assert_int_equal(op_matmul_ex(&g->cmd, &t, b, vkd_whole(bx), K, vkd_whole(by[1]), N, 1, OP_MM_GEMV, true),
                         VKI_OK);
        vkd_barrier(&g->cmd);
        assert_int_equal(op_rmsnorm(&g->cmd, op_mat_rows(by[1], N), vkd_whole(bw), op_mat_rows(bh[1], N), 1, N, eps),
                         VKI_OK);
        vkd_barrier(&g->cmd);
        if (q) {
            assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bh[1]), N, 1, N, vkd_whole(bq[1])), VKI_OK);
            vkd_barrier(&g->cmd);
        }
    }
    vt_submit_wait(g);
    if (q) {
        uint8_t *hq[2] = {malloc(qb), malloc(qb)};
        vt_download(g, bq[0], hq[0], qb);
        vt_download(g, bq[1], hq[1], qb);
        if (memcmp(hq[0], hq[1], qb))
            fail_msg("norm epilogue %s N=%u K=%u: quantised H differs from op_quant_x8's", quant_get(type)->name, N, K);
        free(hq[0]), free(hq[1]);
    }
    float *y[2] = {malloc((size_t)N * 4), malloc((size_t)N * 4)}, *h[2] = {malloc((size_t)N * 4), malloc((size_t)N * 4)};
    for (int i = 0; i < 2; i++) {
        vt_download(g, by[i], y[i], (size_t)N * 4);
        vt_download(g, bh[i], h[i], (size_t)N * 4);
    }
    char label[96];
    snprintf(label, sizeof label, "norm epilogue %s N=%u K=%u%s", quant_get(type)->name, N, K,
             with_bias ? " + bias" : "");
    if (memcmp(y[0], y[1], (size_t)N * 4))
        fail_msg("%s: Y differs from op_matmul_ex (NMSE %.3g)", label, vt_nmse(y[0], y[1], N));
    if (memcmp(h[0], h[1], (size_t)N * 4))
        fail_msg("%s: H differs from op_rmsnorm (NMSE %.3g)", label, vt_nmse(h[0], h[1], N));
    vt_download(g, bc, &zero, 4);
    assert_int_equal(zero, 0);
    /* reference: y0 + 2 (x W^T + bias), then the norm. The error is judged against the magnitude of
     * y's terms carried through the norm (mag * inv * nw), not against H itself: where a few
     * outputs cancel (N = 1, 7), H's relative error is y's, which float sums cannot bound
     * (seed 30010732301839: 8.6e-12 relative to H, a q6_k case of one output) */
    double *yr = malloc((size_t)N * sizeof(double)), *mag = malloc((size_t)N * sizeof(double)), ss = 0;
    for (uint32_t i = 0; i < N; i++) {
        double a = 0, m = 0;
        for (uint32_t k = 0; k < K; k++) {
            a += (double)x[k] * wref[(size_t)i * K + k];
            m += fabs((double)x[k] * wref[(size_t)i * K + k]);
        }
        yr[i] = (double)y0[i] + 2 * (a + bias[i]);
        mag[i] = fabs((double)y0[i]) + 2 * (m + fabs((double)bias[i]));
        ss += yr[i] * yr[i];
    }
    double inv = 1.0 / sqrt(ss / N + eps);
    for (uint32_t i = 0; i < N; i++) {
        double ref = yr[i] * inv * nw[i], scale = mag[i] * inv * nw[i];
        err[0] += (h[0][i] - ref) * (h[0][i] - ref);
        err[1] += scale * scale;
    }
    free(mag);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer *all[] = {bx, bw, bb, by[0], by[1], bh[0], bh[1], bc, bq[0], bq[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        vkd_buffer_destroy(g->dev, all[i]);
    free(wref), free(x), free(y0), free(nw), free(bias), free(raw), free(yr);
    for (int i = 0; i < 2; i++)
        free(y[i]), free(h[i]);
}

static void test_norm_epilogue(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("norm epilogue");
    vki_device_info saved = g->dev->info;
    static const uint32_t Ns[] = {1, 7, 320, 1000}; /* 320: H quantised too */
    for (int config = 0; config < 2; config++) {
        if (config == 1) /* NVIDIA's matvec (128) and rmsnorm (256) workgroups */
            as_nvidia(g, &saved);
        for (size_t i = 0; i < vt_n_weight_types; i++) {
            uint32_t type = vt_weight_types[i];
            double err[2] = {0, 0};
            for (uint32_t c = 0; c < 4; c++)
                norm_case(g, &r, type, Ns[c], c == 3 ? big_k(type) : pick_k(&r, type, c + 3), c % 2, err);
            double nmse = err[0] / (err[1] > 0 ? err[1] : 1);
            if (!(nmse <= NORM_TOL))
                fail_msg("norm epilogue %s (config %d): NMSE %.3g > %.0e", quant_get(type)->name, config, nmse,
                         NORM_TOL);
            worst_norm = nmse > worst_norm ? nmse : worst_norm;
        }
        g->dev->info = saved;
    }
    fprintf(stderr, "  norm epilogue: worst NMSE %.2e against double, bitwise equal to matmul + rmsnorm\n",
            worst_norm);
    /* refused: a tensor in several parts, a counter view too small */
    vk_tensor t;
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_F32, 16, 64, 16 * 4 * 16, "w", &t), VKI_OK);
    assert_true(t.n_parts > 1 && !op_matmul_norm_fits(g->dev, &t));
    vkd_buffer *b = vt_buf_nan(g, 4 * 64, "b");
    op_mm_norm n = {vkd_whole(b), vkd_whole(b), vkd_whole(b), 1e-5f, .xq = {0}};
    vt_begin(g);
    assert_int_equal(op_matmul_norm(&g->cmd, &t, NULL, vkd_whole(b), vkd_whole(b), &n), VKI_ERR_INVALID_ARG);
    vk_tensor_destroy(g->dev, &t);
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_F32, 16, 8, 0, "w", &t), VKI_OK);
    n.eps = -1.0f;
    assert_int_equal(op_matmul_norm(&g->cmd, &t, NULL, vkd_whole(b), vkd_whole(b), &n), VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, b);
    vt_assert_clean(g);
}

/* The projection that normalises its heads (op_matmul_head_norm, and op_matmul_i8 with
 * head_norm: qwen3's and gemma3's Q and K at batch 1): twice in a row (the counters must come
 * back to zero), Y bit for bit what the product followed by op_rmsnorm over rows of head_dim
 * gives, for every type (the integer ones on the integer-dot path too), 1 to 8 heads of 64 to
 * 256 columns, on lavapipe's and NVIDIA's workgroup sizes; the float path also against a
 * double-precision reference. */
static double worst_head_norm;

static void head_norm_case(vt_gpu *g, vt_rng *r, uint32_t type, uint32_t heads, uint32_t hd, uint32_t K, bool i8,
                           double err[2])
{
    const uint32_t N = heads * hd;
    float *wref = malloc((size_t)N * K * sizeof(float)), *x = malloc((size_t)K * 4), *nw = malloc((size_t)hd * 4);
    uint8_t *raw = make_weights(r, type, N, K, wref);
    vk_tensor t = upload_weights(g, type, N, K, raw, 1);
    vt_fill_uniform(r, x, K, -1.0f, 1.0f);
    vt_fill_uniform(r, nw, hd, 0.5f, 1.5f);
    const float eps = 1e-6f;
    vkd_buffer *bx = vt_buf_from(g, x, (size_t)K * 4, "x"), *bw = vt_buf_from(g, nw, (size_t)hd * 4, "head norm w");
    vkd_buffer *by[2] = {vt_buf_nan(g, (size_t)N * 4, "y fused"), vt_buf_nan(g, (size_t)N * 4, "y apart")};
    vkd_buffer *bq = vt_buf_nan(g, op_quant_x8_bytes(1, K), "xq");
    /* the counters at an offset, as the engine's K projection gets them */
    const uint32_t c0 = (uint32_t)g->dev->info.min_storage_buffer_offset_alignment / 4, nc = c0 + heads;
    uint32_t *zeros = calloc(nc, 4);
    vkd_buffer *bc = vt_buf_from(g, zeros, 4 * nc, "counters");
    op_mm_head_norm n = {vkd_whole(bw), {bc, 4ull * c0, 4ull * heads}, eps, hd};
    assert_true(op_matmul_head_norm_fits(g->dev, &t, hd));
    vt_begin(g);
    if (i8) {
        assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bx), K, 1, K, vkd_whole(bq)), VKI_OK);
        vkd_barrier(&g->cmd);
    }
    for (int rep = 0; rep < 2; rep++) {
        if (i8) {
            op_mm_i8 o = {.head_norm = &n};
            assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(by[0]), N, 1, &o), VKI_OK);
            assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(by[1]), N, 1, NULL), VKI_OK);
        } else {
            assert_int_equal(op_matmul_head_norm(&g->cmd, &t, vkd_whole(bx), vkd_whole(by[0]), &n), VKI_OK);
            assert_int_equal(op_matmul_ex(&g->cmd, &t, NULL, vkd_whole(bx), K, vkd_whole(by[1]), N, 1, OP_MM_GEMV,
                                          false),
                             VKI_OK);
        }
        vkd_barrier(&g->cmd);
        assert_int_equal(op_rmsnorm(&g->cmd, op_mat_rows(by[1], hd), vkd_whole(bw), op_mat_rows(by[1], hd), heads, hd,
                                    eps),
                         VKI_OK);
        vkd_barrier(&g->cmd);
    }
    vt_submit_wait(g);
    float *y[2] = {malloc((size_t)N * 4), malloc((size_t)N * 4)};
    for (int i = 0; i < 2; i++)
        vt_download(g, by[i], y[i], (size_t)N * 4);
    if (memcmp(y[0], y[1], (size_t)N * 4))
        fail_msg("head norm %s%s %ux%u K=%u: differs from the product and op_rmsnorm (NMSE %.3g)",
                 quant_get(type)->name, i8 ? " (i8)" : "", heads, hd, K, vt_nmse(y[0], y[1], N));
    vt_download(g, bc, zeros, 4 * nc);
    for (uint32_t i = 0; i < nc; i++)
        assert_int_equal(zeros[i], 0);
    /* reference (float path): x W^T, each head normed in double; the error judged against the
     * products' term magnitudes carried through the norm, as norm_case does */
    for (uint32_t h = 0; !i8 && h < heads; h++) {
        double yr[256], mag[256], ss = 0;
        for (uint32_t c = 0; c < hd; c++) {
            const float *wr = wref + (size_t)(h * hd + c) * K;
            double a = 0, m = 0;
            for (uint32_t k = 0; k < K; k++) {
                a += (double)x[k] * wr[k];
                m += fabs((double)x[k] * wr[k]);
            }
            yr[c] = a, mag[c] = m, ss += a * a;
        }
        double inv = 1.0 / sqrt(ss / hd + eps);
        for (uint32_t c = 0; c < hd; c++) {
            double ref = yr[c] * inv * nw[c], scale = mag[c] * inv * nw[c], e = y[0][h * hd + c] - ref;
            err[0] += e * e;
            err[1] += scale * scale;
        }
    }
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer *all[] = {bx, bw, by[0], by[1], bq, bc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        vkd_buffer_destroy(g->dev, all[i]);
    free(wref), free(x), free(nw), free(raw), free(zeros), free(y[0]), free(y[1]);
}

static void test_head_norm_epilogue(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("head norm epilogue");
    vki_device_info saved = g->dev->info;
    static const uint32_t shapes[][2] = {{1, 64}, {3, 128}, {8, 128}, {2, 256}}; /* heads x head_dim */
    for (int config = 0; config < 2; config++) {
        if (config == 1) /* NVIDIA's matvec (128 x 4) and rmsnorm (256) workgroups */
            as_nvidia(g, &saved);
        for (size_t i = 0; i < vt_n_weight_types; i++) {
            uint32_t type = vt_weight_types[i];
            double err[2] = {0, 0};
            for (uint32_t c = 0; c < 4; c++) {
                uint32_t K = c == 3 ? big_k(type) : pick_k(&r, type, c + 3);
                head_norm_case(g, &r, type, shapes[c][0], shapes[c][1], K, false, err);
                if (op_matmul_i8_supported(g->dev, type) && K % 32 == 0)
                    head_norm_case(g, &r, type, shapes[c][0], shapes[c][1], K, true, err);
            }
            double nmse = err[0] / (err[1] > 0 ? err[1] : 1);
            if (!(nmse <= NORM_TOL))
                fail_msg("head norm %s (config %d): NMSE %.3g > %.0e", quant_get(type)->name, config, nmse, NORM_TOL);
            worst_head_norm = nmse > worst_head_norm ? nmse : worst_head_norm;
        }
        g->dev->info = saved;
    }
    fprintf(stderr, "  head norm epilogue: worst NMSE %.2e against double, bitwise equal to matmul + rmsnorm\n",
            worst_head_norm);
    /* refused: a head width the rows per workgroup do not divide, N no multiple of it, too few
     * counters, and on the integer-dot path with accumulate */
    vk_tensor t;
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_Q8_0, 64, 3 * 36, 0, "w", &t), VKI_OK);
    assert_false(op_matmul_head_norm_fits(g->dev, &t, 36) && op_matmul_head_norm_fits(g->dev, &t, 35));
    assert_false(op_matmul_head_norm_fits(g->dev, &t, 0));
    vkd_buffer *b = vt_buf_nan(g, 4 * 4096, "b");
    op_mm_head_norm n = {vkd_whole(b), {b, 0, 4}, 1e-5f, 36};
    vt_begin(g);
    assert_int_equal(op_matmul_head_norm(&g->cmd, &t, vkd_whole(b), vkd_whole(b), &n), VKI_ERR_INVALID_ARG);
    vk_tensor_destroy(g->dev, &t);
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_Q8_0, 64, 2 * 64, 0, "w", &t), VKI_OK);
    n.head_dim = 64;
    assert_int_equal(op_matmul_head_norm(&g->cmd, &t, vkd_whole(b), vkd_whole(b), &n), VKI_ERR_INVALID_ARG);
    n.counter.range = 8; /* two heads' counters: now it fits */
    if (op_matmul_i8_supported(g->dev, VKI_GGML_Q8_0)) {
        op_mm_i8 o = {.head_norm = &n, .accumulate = true};
        assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(b), vkd_whole(b), 128, 1, &o), VKI_ERR_INVALID_ARG);
    }
    vt_submit_wait(g);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, b);
    vt_assert_clean(g);
}

/* Shapes and views that do not fit are refused with a status and record nothing. */
/* The integer-dot matrix-vector path (op_quant_x8, then op_matmul_i8) for each of its weight
 * types, on lavapipe's and NVIDIA's matvec shapes, M = 1 .. 19 (chunks and rows along y), with
 * bias, accumulate, two weight parts and padded strides:
 *  - the quantiser: every block's d is max|x| * (1/127) bit for bit (a product: the C side
 *    computes the same), every q within half a step of x / d plus I8_Q_SLACK (1 / d is a
 *    division, 2.5 ulp in Vulkan), |q| <= 127; a block of zeros gives d = 0 and q = 0;
 *  - the product against a double reference over the device's own XQ (dequantised weights times
 *    d q): only the f32 sums differ, NMSE <= I8_TOL over a type's cases;
 *  - and against the exact product of the unrounded X: X's 8-bit rounding, NMSE <= I8_X_TOL. */
#define I8_Q_SLACK 1e-4 /* of a step (ties and 1 / d's ulps); no q beyond half a step seen */
#define I8_TOL 1e-12    /* measured on lavapipe, 26 seeds: <= 4.0e-14 */
#define I8_X_TOL 2e-4   /* uniform X: (step^2 / 12) / E[x^2] ~ 1.5e-5 expected; 26 seeds: <= 4.3e-5 */
static double worst_i8[2];

static void i8_case(vt_gpu *g, vt_rng *r, uint32_t type, const mm_case *s, double err[4])
{
    const uint32_t M = s->M, N = s->N, K = s->K, xs = K + s->x_pad, ys = N + s->y_pad;
    float *wref = malloc((size_t)N * K * sizeof(float)), *x = malloc((size_t)M * xs * 4);
    float *bias = malloc((size_t)N * 4), *y0 = malloc((size_t)M * ys * 4), *y = malloc((size_t)M * ys * 4);
    uint8_t *raw = make_weights(r, type, N, K, wref);
    vk_tensor t = upload_weights(g, type, N, K, raw, s->parts);
    for (size_t i = 0; i < (size_t)M * xs; i++)
        x[i] = vt_uniform(r, -1.0f, 1.0f);
    if (K >= 64)
        memset(x + 32, 0, 32 * sizeof(float)); /* row 0's second block: d = 0 */
    vt_fill_uniform(r, bias, N, -1.0f, 1.0f);
    vt_fill_uniform(r, y0, (size_t)M * ys, -1.0f, 1.0f);
    const uint64_t xq_bytes = op_quant_x8_bytes(M, K);
    vkd_buffer *bx = vt_buf_from(g, x, (size_t)M * xs * 4, "x"), *bq = vt_buf_nan(g, xq_bytes, "xq");
    vkd_buffer *bb = vt_buf_from(g, bias, (size_t)N * 4, "bias");
    vkd_buffer *by = s->accum ? vt_buf_from(g, y0, (size_t)M * ys * 4, "y") : vt_buf_nan(g, (size_t)M * ys * 4, "y");
    vkd_view vb = vkd_whole(bb);
    vt_begin(g);
    assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bx), xs, M, K, vkd_whole(bq)), VKI_OK);
    vkd_barrier(&g->cmd);
    op_mm_i8 o = {.bias = s->bias ? &vb : NULL, .accumulate = s->accum};
    assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(by), ys, M, &o), VKI_OK);
    vt_submit_wait(g);
    uint32_t *xq = malloc(xq_bytes);
    vt_download(g, bq, xq, xq_bytes);
    vt_download(g, by, y, (size_t)M * ys * 4);
    char label[128];
    snprintf(label, sizeof label, "matvec_i8 %s M=%u N=%u K=%u", quant_get(type)->name, M, N, K);

    /* the quantiser */
    const float *xd = (const float *)(xq + (size_t)M * (K / 4));
    float *xr = malloc((size_t)M * K * 4); /* X as the device rounded it: d q */
    for (uint32_t m = 0; m < M; m++)
        for (uint32_t b = 0; b < K / 32; b++) {
            const float *xb = x + (size_t)m * xs + 32 * b;
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            const float d = amax * (1.0f / 127.0f), dd = xd[(size_t)m * (K / 32) + b];
            if (memcmp(&d, &dd, 4))
                fail_msg("%s: row %u block %u: d %.9g, expected max|x| / 127 = %.9g", label, m, b, dd, d);
            for (int j = 0; j < 32; j++) {
                const size_t k = 32 * b + j;
                const int q = (int8_t)(xq[(size_t)m * (K / 4) + k / 4] >> (8 * (k % 4)));
                const double off = d > 0 ? fabs(q - (double)xb[j] / d) : fabs((double)q);
                if (q < -127 || off > 0.5 + I8_Q_SLACK)
                    fail_msg("%s: row %u element %zu: q %d for x / d = %.6f", label, m, k, q,
                             d > 0 ? (double)xb[j] / d : 0.0);
                xr[(size_t)m * K + k] = d * (float)q;
            }
        }
    /* the product: over the device's X, and over the exact X */
    for (uint32_t m = 0; m < M; m++)
        for (uint32_t n = 0; n < N; n++) {
            double a = (s->bias ? bias[n] : 0.0) + (s->accum ? y0[(size_t)m * ys + n] : 0.0), e = a;
            for (uint32_t k = 0; k < K; k++) {
                a += (double)xr[(size_t)m * K + k] * wref[(size_t)n * K + k];
                e += (double)x[(size_t)m * xs + k] * wref[(size_t)n * K + k];
            }
            const double got = y[(size_t)m * ys + n];
            err[0] += (got - a) * (got - a);
            err[1] += a * a;
            err[2] += (got - e) * (got - e);
            err[3] += e * e;
        }
    for (uint32_t m = 0; m < M; m++) /* the stride padding stays untouched */
        for (uint32_t n = N; n < ys; n++) {
            float v = y[(size_t)m * ys + n], w0 = y0[(size_t)m * ys + n];
            if (s->accum ? memcmp(&v, &w0, 4) != 0 : !isnan(v))
                fail_msg("%s: Y padding written at row %u column %u", label, m, n);
        }
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, bx);
    vkd_buffer_destroy(g->dev, bq);
    vkd_buffer_destroy(g->dev, bb);
    vkd_buffer_destroy(g->dev, by);
    free(wref); free(x); free(bias); free(y0); free(y); free(raw); free(xq); free(xr);
}

/* The integer-dot path's fused epilogues, bit for bit what they replace: the gate|up pass
 * (o.glu) against the product into [gate | up] then op_glu (and where N % 32 == 0, twice more
 * with its output quantised, o.glu_xq, against op_quant_x8's), and the norming projection
 * (o.norm) against the accumulating product then op_rmsnorm (and where 2N % 32 == 0 its
 * quantised H against op_quant_x8's); twice, so the counters must be back at zero. */
static unsigned i8_glu_xq_runs; /* i8_fused_case runs that checked the quantised GLU output */

static void i8_fused_case(vt_gpu *g, vt_rng *r, uint32_t type, uint32_t M, uint32_t N, uint32_t K, uint32_t act)
{
    float *wref = malloc((size_t)2 * N * K * 4), *x = malloc((size_t)M * K * 4), *nw = malloc((size_t)2 * N * 4);
    uint8_t *raw = make_weights(r, type, 2 * N, K, wref);
    vk_tensor t = upload_weights(g, type, 2 * N, K, raw, 1);
    vt_fill_uniform(r, x, (size_t)M * K, -1.0f, 1.0f);
    vt_fill_uniform(r, nw, 2 * N, 0.5f, 1.5f);
    vkd_buffer *bx = vt_buf_from(g, x, (size_t)M * K * 4, "x"), *bq = vt_buf_nan(g, op_quant_x8_bytes(M, K), "xq");
    vkd_buffer *by = vt_buf_nan(g, (size_t)M * N * 4, "y"), *bgu = vt_buf_nan(g, (size_t)M * 2 * N * 4, "gu");
    vkd_buffer *bz = vt_buf_nan(g, (size_t)M * N * 4, "z"), *bnw = vt_buf_from(g, nw, (size_t)2 * N * 4, "nw");
    vkd_buffer *y1 = vt_buf_from(g, nw, (size_t)2 * N * 4, "y1"), *y2 = vt_buf_from(g, nw, (size_t)2 * N * 4, "y2");
    vkd_buffer *h1 = vt_buf_nan(g, (size_t)2 * N * 4, "h1"), *h2 = vt_buf_nan(g, (size_t)2 * N * 4, "h2");
    vkd_buffer *cnt = vt_buf_nan(g, 4, "counter"), *bq1 = vt_buf_nan(g, op_quant_x8_bytes(1, K), "xq row 0");
    const bool hq = (2 * N) % 32 == 0;
    const size_t qb = hq ? op_quant_x8_bytes(1, 2 * N) : 4;
    vkd_buffer *hq1 = vt_buf_nan(g, qb, "hq fused"), *hq2 = vt_buf_nan(g, qb, "hq apart");
    const bool gq = N % 32 == 0 && op_matmul_glu_xq_fits(g->dev, &t);
    const size_t gqb = gq ? op_quant_x8_bytes(M, N) : 4;
    vkd_buffer *gcnt = vt_buf_nan(g, N / 32 * 4 + 4, "glu counters"), *yq = vt_buf_nan(g, (size_t)M * N * 4, "yq");
    vkd_buffer *gq1 = vt_buf_nan(g, gqb, "glu int8 fused"), *gq2 = vt_buf_nan(g, gqb, "glu int8 again");
    vkd_buffer *gq3 = vt_buf_nan(g, gqb, "glu int8 apart");
    vt_begin(g);
    assert_int_equal(vkd_fill(g->dev, cnt, 0, 4, 0), VKI_OK);
    assert_int_equal(vkd_fill(g->dev, gcnt, 0, gcnt->size, 0), VKI_OK);
    assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bx), K, M, K, vkd_whole(bq)), VKI_OK);
    assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bx), K, 1, K, vkd_whole(bq1)), VKI_OK);
    vkd_barrier(&g->cmd);
    op_mm_i8 glu = {.glu = true, .act = act};
    assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(by), N, M, &glu), VKI_OK);
    assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(bgu), 2 * N, M, NULL), VKI_OK);
    vkd_barrier(&g->cmd);
    assert_int_equal(op_glu(&g->cmd, act, (op_mat){vkd_whole(bgu), 0, 2 * N}, (op_mat){vkd_whole(bgu), N, 2 * N},
                            (op_mat){vkd_whole(bz), 0, N}, M, N), VKI_OK);
    if (gq) {
        vkd_buffer *to[2] = {gq1, gq2};
        for (int i = 0; i < 2; i++) {
            op_mm_glu_xq gx = {vkd_whole(gcnt), vkd_whole(to[i])};
            op_mm_i8 o = {.glu = true, .act = act, .glu_xq = &gx};
            assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(yq), N, M, &o), VKI_OK);
            vkd_barrier(&g->cmd);
        }
        assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bz), N, M, N, vkd_whole(gq3)), VKI_OK);
        /* refused: the output quantised over the pass's own input, or without glu */
        op_mm_glu_xq bad = {vkd_whole(gcnt), vkd_whole(bq)};
        op_mm_i8 o = {.glu = true, .act = act, .glu_xq = &bad}, nog = {.glu_xq = &bad};
        assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(yq), N, M, &o), VKI_ERR_INVALID_ARG);
        bad.xq = vkd_whole(gq1);
        assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq), vkd_whole(yq), N, M, &nog), VKI_ERR_INVALID_ARG);
    }
    /* the norming projection over all 2N rows of one token (X row 0) */
    op_mm_norm n = {vkd_whole(bnw), vkd_whole(h1), vkd_whole(cnt), 1e-5f, .xq = hq ? vkd_whole(hq1) : (vkd_view){0}};
    const vkd_view nb_v = vkd_whole(bnw), *nbias = N % 2 ? &nb_v : NULL; /* odd N: the norm weights as a bias too */
    op_mm_i8 nrm = {.bias = nbias, .accumulate = true, .norm = &n}, acc = {.bias = nbias, .accumulate = true};
    for (int rep = 0; rep < 2; rep++) {
        assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq1), vkd_whole(y1), 2 * N, 1, &nrm), VKI_OK);
        assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(bq1), vkd_whole(y2), 2 * N, 1, &acc), VKI_OK);
        vkd_barrier(&g->cmd);
        assert_int_equal(op_rmsnorm(&g->cmd, op_mat_rows(y2, 2 * N), vkd_whole(bnw), op_mat_rows(h2, 2 * N), 1, 2 * N,
                                    1e-5f), VKI_OK);
        vkd_barrier(&g->cmd);
        if (hq) {
            assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(h2), 2 * N, 1, 2 * N, vkd_whole(hq2)), VKI_OK);
            vkd_barrier(&g->cmd);
        }
    }
    vt_submit_wait(g);
    size_t nb = (size_t)M * N * 4, nb2 = (size_t)2 * N * 4;
    float *a = malloc(nb2 > nb ? nb2 : nb), *b = malloc(nb2 > nb ? nb2 : nb);
    const char *tn = quant_get(type)->name;
    vt_download(g, by, a, nb);
    vt_download(g, bz, b, nb);
    if (memcmp(a, b, nb))
        fail_msg("matvec_i8 glu %s M=%u N=%u K=%u: differs from the product + op_glu (NMSE %.3g)", tn, M, N, K,
                 vt_nmse(a, b, (size_t)M * N));
    if (gq) {
        vt_download(g, yq, a, nb);
        if (memcmp(a, b, nb))
            fail_msg("matvec_i8 glu %s M=%u N=%u K=%u: the quantising pass's Y differs", tn, M, N, K);
        uint8_t *q1 = malloc(gqb), *q2 = malloc(gqb), *q3 = malloc(gqb);
        vt_download(g, gq1, q1, gqb);
        vt_download(g, gq2, q2, gqb);
        vt_download(g, gq3, q3, gqb);
        if (memcmp(q1, q3, gqb) || memcmp(q2, q3, gqb))
            fail_msg("matvec_i8 glu %s M=%u N=%u K=%u: its int8 output (run %d) differs from op_quant_x8's", tn, M,
                     N, K, memcmp(q1, q3, gqb) ? 1 : 2);
        free(q1), free(q2), free(q3);
        i8_glu_xq_runs++;
    }
    vt_download(g, y1, a, nb2);
    vt_download(g, y2, b, nb2);
    if (memcmp(a, b, nb2))
        fail_msg("matvec_i8 norm %s N=%u K=%u: Y differs from the accumulating product", tn, 2 * N, K);
    vt_download(g, h1, a, nb2);
    vt_download(g, h2, b, nb2);
    if (memcmp(a, b, nb2))
        fail_msg("matvec_i8 norm %s N=%u K=%u: H differs from op_rmsnorm (NMSE %.3g)", tn, 2 * N, K,
                 vt_nmse(a, b, 2 * N));
    if (hq) {
        uint8_t *qa = malloc(qb), *qbuf = malloc(qb);
        vt_download(g, hq1, qa, qb);
        vt_download(g, hq2, qbuf, qb);
        if (memcmp(qa, qbuf, qb))
            fail_msg("matvec_i8 norm %s N=%u K=%u: quantised H differs from op_quant_x8's", tn, 2 * N, K);
        free(qa), free(qbuf);
    }
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer *all[] = {bx, bq, bq1, by, bgu, bz, bnw, y1, y2, h1, h2, cnt, hq1, hq2, gcnt, yq, gq1, gq2, gq3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        vkd_buffer_destroy(g->dev, all[i]);
    free(wref); free(x); free(nw); free(raw); free(a); free(b);
}

static void test_matvec_i8(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("matvec_i8");
    static const uint32_t types[] = {VKI_GGML_Q8_0, VKI_GGML_Q4_0, VKI_GGML_Q4_K, VKI_GGML_Q5_K, VKI_GGML_Q6_K,
                                     VKI_GGML_IQ4_NL, VKI_GGML_IQ4_XS, VKI_GGML_Q4_1, VKI_GGML_Q5_0, VKI_GGML_Q5_1,
                                     VKI_GGML_Q2_K, VKI_GGML_Q3_K, VKI_GGML_MXFP4};
    if (!op_matmul_i8_supported(g->dev, VKI_GGML_Q8_0))
        skip(); /* a device without shaderIntegerDotProduct (lavapipe has it) */
    vki_device_info saved = g->dev->info;
    static const uint32_t Ms[] = {1, 1, 3, 8, 19}, Ns[] = {1, 67, 33, 9, 21};
    for (int config = 0; config < 2; config++) {
        if (config == 1)
            as_nvidia(g, &saved);
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
            /* NVIDIA's shape: the types of each DQI_SPAN (4 with and without offsets, 2, 1); on
             * an empty shader cache (CI) every type and shape is a pipeline to compile */
            if (config == 1 && (types[i] == VKI_GGML_Q4_0 || types[i] == VKI_GGML_Q5_K || types[i] == VKI_GGML_IQ4_NL ||
                                types[i] == VKI_GGML_Q4_1 || types[i] == VKI_GGML_Q5_1 || types[i] == VKI_GGML_Q2_K ||
                                types[i] == VKI_GGML_MXFP4))
                continue;
            double err[4] = {0, 0, 0, 0};
            for (uint32_t c = 0; c < 5; c++) {
                mm_case s = {.M = Ms[c], .N = Ns[c], .K = c == 1 ? big_k(types[i]) : pick_k(&r, types[i], c),
                             .x_pad = c % 2 ? 3 : 0, .y_pad = c >= 3 ? 2 : 0, .bias = c % 2 == 0,
                             .accum = c == 2 || c == 4, .parts = c == 3 ? 2 : 1};
                i8_case(g, &r, types[i], &s, err);
            }
            const double nmse = err[0] / err[1], nmse_x = err[2] / err[3];
            if (!(nmse <= I8_TOL) || !(nmse_x <= I8_X_TOL))
                fail_msg("matvec_i8 %s (config %d): NMSE %.3g (tolerance %.0e) over the device's X, %.3g (%.0e) "
                         "over the exact X", quant_get(types[i])->name, config, nmse, I8_TOL, nmse_x, I8_X_TOL);
            worst_i8[0] = nmse > worst_i8[0] ? nmse : worst_i8[0];
            worst_i8[1] = nmse_x > worst_i8[1] ? nmse_x : worst_i8[1];
            i8_fused_case(g, &r, types[i], config ? 3 : 1, config ? 37 : 9, pick_k(&r, types[i], 2),
                          config ? VKI_GLU_GELU_TANH : VKI_GLU_SILU);
            /* N = 64: the gate|up pass quantises its output (two workgroups along y per block
             * with 34 rows), and the norm epilogue H (2N = 128) */
            i8_fused_case(g, &r, types[i], config ? 34 : 1, 64, pick_k(&r, types[i], 2), VKI_GLU_SILU);
        }
        g->dev->info = saved;
    }
    /* the activation rows per pass bench-kernels --matvec-cfg sweeps (16: 19 rows as 16 + 3) */
    g->dev->matvec_mc = 16;
    double err16[4] = {0, 0, 0, 0};
    mm_case s16 = {.M = 19, .N = 21, .K = pick_k(&r, VKI_GGML_Q4_K, 2), .x_pad = 3, .y_pad = 2, .accum = true};
    i8_case(g, &r, VKI_GGML_Q4_K, &s16, err16);
    g->dev->matvec_mc = 0;
    if (!(err16[0] / err16[1] <= I8_TOL))
        fail_msg("matvec_i8 q4_k with 16 activation rows per pass: NMSE %.3g (tolerance %.0e)", err16[0] / err16[1],
                 I8_TOL);
    fprintf(stderr, "  matvec_i8: worst NMSE %.2e over the device's int8 X, %.2e over the exact X; %u quantised "
            "GLU outputs equal to quant_x8's\n", worst_i8[0], worst_i8[1], i8_glu_xq_runs);
    assert_true(i8_glu_xq_runs >= sizeof types / sizeof types[0]);
    /* refused: a type without integer blocks, K not a multiple of 32, too small an XQ */
    vk_tensor t;
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_F16, 64, 8, 0, "w", &t), VKI_OK);
    vkd_buffer *x = vt_buf_nan(g, 4 * 64 * 2, "x"), *q = vt_buf_nan(g, op_quant_x8_bytes(2, 64), "xq");
    vkd_buffer *y = vt_buf_nan(g, 4 * 8 * 2, "y");
    vt_begin(g);
    assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(q), vkd_whole(y), 8, 1, NULL), VKI_ERR_UNSUPPORTED);
    assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(x), 48, 2, 48, vkd_whole(q)), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(x), 64, 3, 64, vkd_whole(q)), VKI_ERR_INVALID_ARG);
    vk_tensor_destroy(g->dev, &t);
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_Q8_0, 64, 8, 0, "w", &t), VKI_OK);
    assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(q), vkd_whole(y), 8, 3, NULL), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul_i8(&g->cmd, &t, vkd_whole(q), vkd_whole(y), 8, 0, NULL), VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, x);
    vkd_buffer_destroy(g->dev, q);
    vkd_buffer_destroy(g->dev, y);
    vt_assert_clean(g);
}

static void test_bad_args(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vk_tensor t;
    assert_int_equal(vk_tensor_create(g->dev, VKI_GGML_F32, 16, 8, 0, "w", &t), VKI_OK);
    vkd_buffer *x = vt_buf_nan(g, 4 * 16 * 2, "x"), *y = vt_buf_nan(g, 4 * 8 * 2, "y");
    vt_begin(g);
    assert_int_equal(op_matmul(&g->cmd, &t, NULL, vkd_whole(x), 16, vkd_whole(y), 8, 0), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul(&g->cmd, &t, NULL, vkd_whole(x), 16, vkd_whole(y), 8, 3), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul(&g->cmd, &t, NULL, vkd_whole(x), 15, vkd_whole(y), 8, 1), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul(&g->cmd, &t, NULL, vkd_whole(x), 16, vkd_whole(y), 7, 1), VKI_ERR_INVALID_ARG);
    vkd_view small = {x, 0, 16};
    assert_int_equal(op_matmul(&g->cmd, &t, &small, vkd_whole(x), 16, vkd_whole(y), 8, 1), VKI_ERR_INVALID_ARG);
    assert_int_equal(op_matmul(&g->cmd, &t, NULL, vkd_whole(x), 16, vkd_whole(y), 8, 2), VKI_OK);
    vt_submit_wait(g);
    vk_tensor_destroy(g->dev, &t);
    vkd_buffer_destroy(g->dev, x);
    vkd_buffer_destroy(g->dev, y);
    vt_assert_clean(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prepare),
#define TYPE_UNIT_TESTS(T, t)                                                                     \
    cmocka_unit_test(test_gemv_##t), cmocka_unit_test(test_gemm_##t), cmocka_unit_test(test_coopmat_##t),
        VKK_WEIGHT_TYPES(TYPE_UNIT_TESTS)
        cmocka_unit_test(test_coopmat_gpu_configs),
        cmocka_unit_test(test_coopmat_split),
        cmocka_unit_test(test_coopmat_split_slots),
        cmocka_unit_test(test_coopmat_split_no_memory),
        cmocka_unit_test(test_coopmat_staging),
        cmocka_unit_test(test_half_x),
        cmocka_unit_test(test_kernel_config),
        cmocka_unit_test(test_boundary_parts_bias),
        cmocka_unit_test(test_gpu_configs),
        cmocka_unit_test(test_dispatch_split),
        cmocka_unit_test(test_glu_epilogue),
        cmocka_unit_test_teardown(test_matvec_overrides, matvec_overrides_reset),
        cmocka_unit_test_teardown(test_matvec_units, matvec_overrides_reset),
        cmocka_unit_test(test_norm_epilogue),
        cmocka_unit_test(test_head_norm_epilogue),
        cmocka_unit_test(test_matvec_i8),
        cmocka_unit_test(test_bad_args),
    };
    if (getenv("VKI_TEST_FILTER")) /* one test while developing: VKI_TEST_FILTER=test_matvec_i8 */
        cmocka_set_test_filter(getenv("VKI_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
    fprintf(stderr, "worst NMSE of the FP32 kernels: float weights %.2e, quantised %.2e (tolerance %.0e); "
            "cases of < %d outputs %.2e (%.0e)\n", worst_plain[0], worst_plain[1], MM_TOL, CM_TOL_MIN, worst_plain[2],
            MM_TOL_FEW);
    return rc;
}
