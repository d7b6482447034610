/* Quantisation reference: f16 conversion against independent references (the IEEE formula for
 * every half, a nearest-value search and the compiler's _Float16 for floats), dequantisation of
 * hand-built blocks against the values each format defines field by field, and the round-trip
 * error of every quantiser on random data under stated bounds. */
#include "support/vt.h"

#include "engine/quant.h"

/* ---- f16 ------------------------------------------------------------------------------------- */

static double half_formula(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* Nearest half to f by searching the ordered finite halves; ties to the even pattern. Only for
 * finite f (|f| < 65520 rounds to a finite half; beyond, inf). */
static uint16_t half_nearest(float f)
{
    double a = fabs((double)f);
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (a >= 65520.0)
        return sign | 0x7c00;
    uint32_t lo = 0, hi = 0x7bff; /* positive finite halves are ordered by their bit patterns */
    while (lo < hi) {             /* smallest h with value >= a */
        uint32_t mid = (lo + hi) / 2;
        if (half_formula((uint16_t)mid) < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t best = lo;
    if (lo > 0) {
        double up = half_formula((uint16_t)lo) - a, down = a - half_formula((uint16_t)(lo - 1));
        if (down < up || (down == up && ((lo - 1) & 1) == 0))
            best = lo - 1;
    }
    return (uint16_t)(sign | best);
}

static void test_f16_decode_all(void **state)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        int e = (h >> 10) & 31;
        if (e == 31) {
            if (h & 1023)
                assert_true(isnan(f));
            else
                assert_true(isinf(f) && (signbit(f) != 0) == ((h >> 15) != 0));
            /* and back: inf stays inf, nan stays nan with the sign */
            uint16_t b = quant_f32_to_f16(f);
            assert_int_equal(b & 0xfc00, h & 0xfc00);
            assert_int_equal((b & 1023) != 0, (h & 1023) != 0);
            continue;
        }
        if ((double)f != half_formula((uint16_t)h) || !signbit(f) != !signbit(half_formula((uint16_t)h)))
            fail_msg("half %04x decodes to %g, want %g", h, f, half_formula((uint16_t)h));
        assert_int_equal(quant_f32_to_f16(f), h); /* exact values round-trip, -0 included */
    }
}

static void test_f16_edges(void **state)
{
    static const struct { float f; uint16_t h; } c[] = {
        {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff},
        {65519.99f, 0x7bff}, {65520.0f, 0x7c00}, {1e10f, 0x7c00}, {-1e10f, 0xfc00},
        {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000},          /* tie between 0 and the smallest: even */
        {0x1.8p-25f, 0x0001}, {0x1.8p-24f, 0x0002},      /* 1.5 ulp ties to even (2) */
        {0x1.4p-24f, 0x0001}, {0x1p-26f, 0x0000}, {0x1p-14f, 0x0400}, {0x1.ffcp-15f, 0x0400}, /* 1023.5 ulp: ties to 1024 */
        {0x1.ff8p-15f, 0x03ff}, {0x1.ff0p-15f, 0x03fe}, {1023 * 0x1p-24f, 0x03ff},
        {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x1.8p-10f, 0x3c02}, {1.0f + 0x1p-10f, 0x3c01},
        {1.0f + 0x1.2p-11f, 0x3c01}, {INFINITY, 0x7c00}, {-INFINITY, 0xfc00}, {1e-40f, 0x0000},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (quant_f32_to_f16(c[i].f) != c[i].h)
            fail_msg("f16(%a) = %04x, want %04x", (double)c[i].f, quant_f32_to_f16(c[i].f), c[i].h);
    uint16_t n = quant_f32_to_f16(NAN);
    assert_int_equal(n & 0x7c00, 0x7c00);
    assert_true(n & 0x3ff);
    uint32_t snan_bits = 0x7f800001u; /* a payload only in the low bits must stay a nan */
    float snan;
    memcpy(&snan, &snan_bits, 4);
    assert_true(quant_f32_to_f16(snan) & 0x3ff);
}

static void test_f16_encode_random(void **state)
{
    vt_rng r = vt_rng_seeded("f16_encode");
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)vt_u64(&r);
        if (i % 2) /* half the time stay near the half range, where the rounding is interesting */
            bits = (bits & 0x807fffffu) | ((uint32_t)vt_range(&r, 100, 143) << 23);
        float f;
        memcpy(&f, &bits, 4);
        if (isnan(f))
            continue;
        uint16_t got = quant_f32_to_f16(f), want = half_nearest(f);
        if (got != want)
            fail_msg("f16(%a) = %04x, want %04x", (double)f, got, want);
#ifdef __FLT16_MAX__
        _Float16 cf = (_Float16)f;
        uint16_t ch;
        memcpy(&ch, &cf, 2);
        if (got != ch)
            fail_msg("f16(%a) = %04x, compiler says %04x", (double)f, got, ch);
#endif
    }
}

/* ---- hand-built blocks ----------------------------------------------------------------------- */

static void put_h(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

static void test_traits(void **state)
{
    assert_int_equal(quant_row_bytes(VKI_GGML_F32, 7), 28);
    assert_int_equal(quant_row_bytes(VKI_GGML_F16, 7), 14);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q8_0, 64), 68);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q4_0, 96), 54);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q4_K, 512), 288);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q6_K, 768), 630);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q4_K, 100), 0);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q8_0, 33), 0);
    assert_int_equal(quant_row_bytes(VKI_GGML_F32, 0), 0);
    assert_int_equal(quant_row_bytes(3, 32), 0); /* q4_1: not run by vkinfer */
    assert_null(quant_get(3));
    assert_null(quant_get(13));
    assert_null(quant_get(1000));
    assert_string_equal(quant_get(VKI_GGML_Q6_K)->name, "q6_k");
    assert_int_equal(quant_get(VKI_GGML_Q4_K)->block_bytes, 144);
}

static void test_dequant_q8_0_q4_0(void **state)
{
    uint8_t b[34];
    float y[32];
    put_h(b, 0x3800); /* d = 0.5 */
    for (int i = 0; i < 32; i++)
        b[2 + i] = (uint8_t)(int8_t)(i * 8 - 128);
    dequant_row(VKI_GGML_Q8_0, b, y, 32);
    for (int i = 0; i < 32; i++)
        assert_true(y[i] == 0.5f * (float)(i * 8 - 128));

    uint8_t q[18];
    put_h(q, 0xc000); /* d = -2 */
    for (int i = 0; i < 16; i++)
        q[2 + i] = (uint8_t)(i | ((15 - i) << 4)); /* low nibble: element i; high: element 16+i */
    dequant_row(VKI_GGML_Q4_0, q, y, 32);
    for (int i = 0; i < 16; i++) {
        assert_true(y[i] == -2.0f * (float)(i - 8));
        assert_true(y[16 + i] == -2.0f * (float)(15 - i - 8));
    }
}

/* Q4_K: 8 sub-blocks, 6-bit scales and mins packed in 12 bytes (the low 6 bits of bytes 0-3 /
 * 4-7 for sub-blocks 0-3; for 4-7 the low nibbles in bytes 8-11 and the top 2 bits in the top
 * bits of bytes 0-3 / 4-7), 4-bit q: 64 weights per 32 bytes, low nibbles first. */
static void test_dequant_q4_k(void **state)
{
    static const int sc[8] = {1, 2, 3, 63, 17, 33, 49, 62}, mn[8] = {0, 5, 63, 10, 20, 40, 63, 1};
    uint8_t b[144] = {0};
    put_h(b, 0x3c00);     /* d = 1 */
    put_h(b + 2, 0x3800); /* dmin = 0.5 */
    uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < 4; j++) {
        s[j] |= (uint8_t)sc[j];
        s[j + 4] |= (uint8_t)mn[j];
    }
    for (int j = 4; j < 8; j++) {
        s[j + 4] = (uint8_t)((sc[j] & 15) | ((mn[j] & 15) << 4));
        s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
        s[j] |= (uint8_t)((mn[j] >> 4) << 6);
    }
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 32; i++) {
            int q = (i * 3 + j) & 15;
            qs[32 * (j / 2) + i] |= (uint8_t)((j & 1) ? q << 4 : q);
        }
    float y[256];
    dequant_row(VKI_GGML_Q4_K, b, y, 256);
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 32; i++) {
            float want = 1.0f * (float)sc[j] * (float)((i * 3 + j) & 15) - 0.5f * (float)mn[j];
            if (y[32 * j + i] != want)
                fail_msg("q4_k element %d: %g, want %g", 32 * j + i, y[32 * j + i], want);
        }
}

/* Q6_K: 16 sub-blocks of 16 with int8 scales; q = 4 low bits from ql, 2 high bits from qh. */
static void test_dequant_q6_k(void **state)
{
    uint8_t b[210] = {0};
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)(b + 192);
    put_h(b + 208, 0x3400); /* d = 0.25 */
    for (int j = 0; j < 16; j++)
        sc[j] = (int8_t)(j * 17 - 128);
    for (int e = 0; e < 256; e++) {
        int q = (e * 7 + 3) & 63, h = e / 128, l = e % 128, g = l / 32, i = l % 32;
        uint8_t *lo = &ql[64 * h + (g & 1) * 32 + i];
        *lo |= (uint8_t)((g < 2) ? (q & 15) : (q & 15) << 4);
        qh[32 * h + i] |= (uint8_t)((q >> 4) << (2 * g));
    }
    float y[256];
    dequant_row(VKI_GGML_Q6_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        float want = 0.25f * (float)sc[e / 16] * (float)(((e * 7 + 3) & 63) - 32);
        if (y[e] != want)
            fail_msg("q6_k element %d: %g, want %g", e, y[e], want);
    }
}

/* ---- round trips ----------------------------------------------------------------------------- */

static double rel_rms(const float *a, const float *ref, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        e += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        s += (double)ref[i] * ref[i];
    }
    return sqrt(e / s);
}

/* Bounds on the relative RMS error for Gaussian rows, about 1.2-1.5x what this reference
 * measures (f16 2.1e-4, q8_0 0.0053, q6_k 0.018, q4_k 0.072 (fast 0.076), q4_0 0.085). */
static void test_roundtrip(void **state)
{
    static const struct { uint32_t type; double bound, bound_fast; } c[] = {
        {VKI_GGML_F32, 0, 0}, {VKI_GGML_F16, 3e-4, 3e-4}, {VKI_GGML_Q8_0, 0.008, 0.008},
        {VKI_GGML_Q4_0, 0.12, 0.12}, {VKI_GGML_Q4_K, 0.085, 0.10}, {VKI_GGML_Q6_K, 0.025, 0.03},
    };
    vt_rng r = vt_rng_seeded("quant_roundtrip");
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *q = malloc(quant_row_bytes(VKI_GGML_F32, N));
    for (size_t i = 0; i < N; i++) /* rows with different scales: quantisers must be scale-free */
        x[i] = vt_normal(&r) * (i < N / 2 ? 0.02f : 3.0f) + (i % 4096 < 256 ? 0.5f : 0);
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        for (int fast = 0; fast < 2; fast++) {
            (fast ? quant_row_fast : quant_row)(c[k].type, x, q, N);
            dequant_row(c[k].type, q, y, N);
            double e = rel_rms(y, x, N), b = fast ? c[k].bound_fast : c[k].bound;
            fprintf(stderr, "  %-5s %s relative RMS error %.5f (bound %.4f)\n", quant_get(c[k].type)->name,
                    fast ? "fast" : "ref ", e, b);
            if (!(e <= b))
                fail_msg("%s: error %g over %g", quant_get(c[k].type)->name, e, b);
        }
    }
    free(x), free(y), free(q);
}

/* Degenerate rows: zeros, constants, one spike, all-negative: finite output, exact where the
 * format can be exact. */
static void test_degenerate_rows(void **state)
{
    static const uint32_t types[] = {VKI_GGML_Q8_0, VKI_GGML_Q4_0, VKI_GGML_Q4_K, VKI_GGML_Q6_K};
    float x[256], y[256];
    uint8_t q[256 * 4];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        for (int kind = 0; kind < 4; kind++) {
            for (int i = 0; i < 256; i++)
                x[i] = kind == 0 ? 0.0f : kind == 1 ? 0.75f : kind == 2 ? (i == 77 ? 5.0f : 0.0f) : -1.0f - (float)(i % 5);
            quant_row(types[k], x, q, 256);
            dequant_row(types[k], q, y, 256);
            for (int i = 0; i < 256; i++) {
                assert_true(isfinite(y[i]));
                if (kind == 0 || kind == 2) /* zeros and a single spike are representable exactly */
                    if (fabsf(y[i] - x[i]) > 1e-3f * 5)
                        fail_msg("%s kind %d element %d: %g, want %g", quant_get(types[k])->name, kind, i, y[i], x[i]);
            }
            assert_true(rel_rms(y, x, 256) < 0.15 || kind == 0);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_decode_all),
        cmocka_unit_test(test_f16_edges),
        cmocka_unit_test(test_f16_encode_random),
        cmocka_unit_test(test_traits),
        cmocka_unit_test(test_dequant_q8_0_q4_0),
        cmocka_unit_test(test_dequant_q4_k),
        cmocka_unit_test(test_dequant_q6_k),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_degenerate_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
