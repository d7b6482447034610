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
    assert_int_equal(quant_row_bytes(VKI_GGML_BF16, 7), 14);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q8_0, 64), 68);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q4_0, 96), 54);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q4_1, 96), 60);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q5_0, 96), 66);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q5_1, 96), 72);
    assert_int_equal(quant_row_bytes(VKI_GGML_IQ4_NL, 96), 54);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q2_K, 512), 168);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q3_K, 512), 220);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q4_K, 512), 288);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q5_K, 512), 352);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q6_K, 768), 630);
    assert_int_equal(quant_row_bytes(VKI_GGML_IQ4_XS, 768), 408);
    assert_int_equal(quant_row_bytes(VKI_GGML_MXFP4, 96), 51);
    assert_non_null(quant_get(VKI_GGML_MXFP4));
    assert_int_equal(quant_row_bytes(VKI_GGML_Q4_K, 100), 0);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q8_0, 33), 0);
    assert_int_equal(quant_row_bytes(VKI_GGML_Q5_0, 48), 0);
    assert_int_equal(quant_row_bytes(VKI_GGML_F32, 0), 0);
    /* known but not run: sizes for the reader and gguf-inspect, no quant_get */
    assert_int_equal(quant_row_bytes(16, 512), 132); /* iq2_xxs: 66 bytes per 256 */
    assert_null(quant_get(16));
    assert_string_equal(quant_info(16)->name, "iq2_xxs");
    assert_false(quant_info(9)->runs);
    assert_string_equal(quant_type_name(39), "mxfp4");
    /* unknown ids: removed from ggml or never assigned */
    assert_null(quant_info(4));
    assert_null(quant_info(31));
    assert_null(quant_info(1000));
    assert_int_equal(quant_row_bytes(4, 32), 0);
    assert_string_equal(quant_type_name(1000), "unknown");
    assert_string_equal(quant_get(VKI_GGML_Q6_K)->name, "q6_k");
    assert_int_equal(quant_get(VKI_GGML_Q4_K)->block_bytes, 144);
    /* the message list names exactly the types that run */
    int runs = 0;
    for (uint32_t t = 0; t < 64; t++) {
        const quant_traits *q = quant_get(t);
        if (!q)
            continue;
        runs++;
        char needle[24];
        snprintf(needle, sizeof needle, "%s,", q->name);
        assert_true(strstr(quant_supported_list(), needle) || strstr(quant_supported_list(), q->name));
    }
    int commas = 0;
    for (const char *c = quant_supported_list(); *c; c++)
        commas += *c == ',';
    assert_int_equal(runs, 16);
    assert_int_equal(commas + 1, runs);
}

static void test_bf16(void **state)
{
    static const struct { float f; uint16_t h; } c[] = {
        {1.0f, 0x3f80}, {-2.5f, 0xc020}, {0.0f, 0x0000}, {-0.0f, 0x8000}, {INFINITY, 0x7f80},
        {1.0f + 0x1p-8f, 0x3f80},             /* tie: to even (down) */
        {1.0f + 0x1.8p-7f, 0x3f82},           /* tie: to even (up) */
        {1.0f + 0x1.2p-8f, 0x3f81},           /* above the tie */
        {0x1.fffffep127f, 0x7f80},            /* rounds past the largest bf16: inf */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (quant_f32_to_bf16(c[i].f) != c[i].h)
            fail_msg("bf16(%a) = %04x, want %04x", (double)c[i].f, quant_f32_to_bf16(c[i].f), c[i].h);
    for (uint32_t h = 0; h < 65536; h++) { /* every pattern decodes to its f32 and back */
        float f = quant_bf16_to_f32((uint16_t)h);
        uint32_t bits;
        memcpy(&bits, &f, 4);
        assert_int_equal(bits, h << 16);
        if (!isnan(f))
            assert_int_equal(quant_f32_to_bf16(f), h);
        else
            assert_true(isnan(quant_bf16_to_f32(quant_f32_to_bf16(f))));
    }
    uint32_t low_nan = 0x7f800001u; /* a payload only in the low bits must stay a nan */
    float n;
    memcpy(&n, &low_nan, 4);
    assert_true(isnan(quant_bf16_to_f32(quant_f32_to_bf16(n))));
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

/* The 32-weight formats: one block each, element values from the layout's definition. */
static const int iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void expect_block(uint32_t type, const uint8_t *b, const float *want, int n)
{
    float y[256];
    dequant_row(type, b, y, (uint64_t)n);
    for (int i = 0; i < n; i++)
        if (y[i] != want[i])
            fail_msg("%s element %d: %g, want %g", quant_get(type)->name, i, y[i], want[i]);
}

static void test_dequant_legacy32(void **state)
{
    uint8_t b[24];
    float want[32];
    /* Q4_1: d = 0.5, m = -3, byte j: element j low nibble, j + 16 high */
    put_h(b, 0x3800), put_h(b + 2, 0xc200);
    for (int j = 0; j < 16; j++) {
        b[4 + j] = (uint8_t)(j | ((15 - j) << 4));
        want[j] = 0.5f * (float)j - 3.0f;
        want[j + 16] = 0.5f * (float)(15 - j) - 3.0f;
    }
    expect_block(VKI_GGML_Q4_1, b, want, 32);
    /* Q5_0: d = -2; qh = 0xA5C3_0F91 little-endian: bit e is element e's fifth bit */
    const uint32_t qh = 0xA5C30F91u;
    put_h(b, 0xc000);
    for (int k = 0; k < 4; k++)
        b[2 + k] = (uint8_t)(qh >> (8 * k));
    for (int j = 0; j < 16; j++) {
        b[6 + j] = (uint8_t)(((j * 7) & 15) | (((j * 3 + 5) & 15) << 4));
        int q0 = ((j * 7) & 15) | (int)((qh >> j) & 1) << 4, q1 = ((j * 3 + 5) & 15) | (int)((qh >> (j + 16)) & 1) << 4;
        want[j] = -2.0f * (float)(q0 - 16);
        want[j + 16] = -2.0f * (float)(q1 - 16);
    }
    expect_block(VKI_GGML_Q5_0, b, want, 32);
    /* Q5_1: the same q, d = 0.25, m = 1 */
    uint8_t c[24];
    put_h(c, 0x3400), put_h(c + 2, 0x3c00);
    memcpy(c + 4, b + 2, 20);
    for (int e = 0; e < 32; e++)
        want[e] = 0.25f * (want[e] / -2.0f + 16.0f) + 1.0f;
    expect_block(VKI_GGML_Q5_1, c, want, 32);
    /* IQ4_NL: d = 0.5, nibbles index the non-linear levels */
    put_h(b, 0x3800);
    for (int j = 0; j < 16; j++) {
        b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
        want[j] = 0.5f * (float)iq4_levels[j];
        want[j + 16] = 0.5f * (float)iq4_levels[15 - j];
    }
    expect_block(VKI_GGML_IQ4_NL, b, want, 32);
}

/* An E2M1 element (OCP Microscaling Formats v1.0, 5.3.3): sign bit 3, exponent bits 2-1 (bias 1),
 * mantissa bit 0; exponent 0 is subnormal (0 or 0.5). Derived from the bits, not a table. */
static float e2m1(int code)
{
    int s = code >> 3 & 1, ex = code >> 1 & 3, m = code & 1;
    float v = ex == 0 ? 0.5f * (float)m : (1.0f + 0.5f * (float)m) * ldexpf(1.0f, ex - 1);
    return s ? -v : v;
}

/* MXFP4: { uint8 e; uint8 qs[16]; }, w = E2M1(nibble) * 2^(e - 127) (the E8M0 scale; ggml's
 * doubled values and halved scale give the same products), nibbles as IQ4_NL's. */
static void test_dequant_mxfp4(void **state)
{
    uint8_t b[17];
    float want[32];
    static const uint8_t es[] = {127, 130, 118, 1, 0, 200};
    for (size_t k = 0; k < sizeof es / sizeof es[0]; k++) {
        b[0] = es[k];
        float scale = ldexpf(1.0f, (int)es[k] - 127);
        for (int j = 0; j < 16; j++) {
            b[1 + j] = (uint8_t)(j | ((15 - j) << 4));
            want[j] = e2m1(j) * scale;
            want[j + 16] = e2m1(15 - j) * scale;
        }
        expect_block(VKI_GGML_MXFP4, b, want, 32);
    }
    /* the quantiser: a block of E2M1 values times a power of two comes back exactly */
    float x[32], y[32];
    uint8_t q[17];
    for (int i = 0; i < 32; i++)
        x[i] = e2m1((i * 7) % 16) * 0.125f;
    x[5] = -6.0f * 0.125f; /* the largest magnitude present, so the scale is the block's */
    quant_row(VKI_GGML_MXFP4, x, q, 32);
    dequant_row(VKI_GGML_MXFP4, q, y, 32);
    for (int i = 0; i < 32; i++)
        if (y[i] != x[i])
            fail_msg("mxfp4 element %d: %g, want %g", i, y[i], x[i]);
}

/* Q2_K / Q3_K: element e = 128n + 32j + l keeps 2 bits at shift 2j of qs[32n + l]; sub-block
 * e / 16 gives the scale. Q3_K's third bit: bit e / 32 of hmask[l], set = no -4 offset. */
static void test_dequant_q2_k_q3_k(void **state)
{
    uint8_t b[110] = {0};
    float want[256];
    put_h(b + 80, 0x3c00), put_h(b + 82, 0x3800); /* Q2_K d = 1, dmin = 0.5 */
    for (int s = 0; s < 16; s++)
        b[s] = (uint8_t)(s | ((15 - s) << 4));
    for (int e = 0; e < 256; e++) {
        int q = (e * 5 + 1) & 3, s = e / 16;
        b[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e % 128) / 32)));
        want[e] = 1.0f * (float)s * (float)q - 0.5f * (float)(15 - s);
    }
    expect_block(VKI_GGML_Q2_K, b, want, 256);

    memset(b, 0, sizeof b);
    uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    put_h(b + 108, 0x3400); /* d = 0.25 */
    int scale[16];
    for (int s = 0; s < 16; s++) {
        scale[s] = (s * 7 + 5) & 63;
        if (s < 8)
            sc[s] |= (uint8_t)(scale[s] & 15);
        else
            sc[s - 8] |= (uint8_t)((scale[s] & 15) << 4);
        sc[8 + s % 4] |= (uint8_t)((scale[s] >> 4) << (2 * (s / 4)));
    }
    for (int e = 0; e < 256; e++) {
        int q = ((e * 3 + 1) % 8) - 4, u = q + 4; /* -4..3 */
        qs[32 * (e / 128) + e % 32] |= (uint8_t)((u & 3) << (2 * ((e % 128) / 32)));
        hm[e % 32] |= (uint8_t)((u >> 2) << (e / 32));
        want[e] = 0.25f * (float)(scale[e / 16] - 32) * (float)q;
    }
    expect_block(VKI_GGML_Q3_K, b, want, 256);
}

/* Q5_K: Q4_K's scales and nibbles plus bit j (the sub-block) of qh[l]. IQ4_XS: 8 sub-blocks
 * with 6-bit scales (low nibble in scales_l, top 2 bits in scales_h). */
static void test_dequant_q5_k_iq4_xs(void **state)
{
    uint8_t b[176] = {0};
    float want[256];
    put_h(b, 0x3800), put_h(b + 2, 0x3c00); /* d = 0.5, dmin = 1 */
    uint8_t *s = b + 4, *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 4; j++) /* sc = 2j + 1, m = j; sub-blocks 4..7 use the low nibbles only */
        s[j] = (uint8_t)(2 * j + 1), s[j + 4] = (uint8_t)j, s[j + 8] = (uint8_t)((j + 1) | ((j + 2) << 4));
    for (int e = 0; e < 256; e++) {
        int j = e / 32, l = e % 32, q = (e * 11 + 7) & 31;
        qs[32 * (j / 2) + l] |= (uint8_t)((q & 15) << (4 * (j & 1)));
        qh[l] |= (uint8_t)((q >> 4) << j);
        int sc = j < 4 ? 2 * j + 1 : j - 3, m = j < 4 ? j : j - 2;
        want[e] = 0.5f * (float)sc * (float)q - 1.0f * (float)m;
    }
    expect_block(VKI_GGML_Q5_K, b, want, 256);

    memset(b, 0, sizeof b);
    put_h(b, 0x3800); /* d = 0.5 */
    uint16_t sh = 0;
    int ls[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (j * 9 + 3) & 63;
        b[4 + j / 2] |= (uint8_t)((ls[j] & 15) << (4 * (j % 2)));
        sh |= (uint16_t)((ls[j] >> 4) << (2 * j));
    }
    put_h(b + 2, sh);
    for (int e = 0; e < 256; e++) {
        int j = e / 32, i = e % 32, q = (i * 5 + j) & 15;
        b[8 + 16 * j + i % 16] |= (uint8_t)(q << (4 * (i / 16)));
        want[e] = 0.5f * (float)(ls[j] - 32) * (float)iq4_levels[q];
    }
    expect_block(VKI_GGML_IQ4_XS, b, want, 256);
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
 * measures (reference / fast where they differ): bf16 0.0017, f16 2.1e-4, q8_0 0.0054, q6_k
 * 0.018, q5_k 0.036 / 0.038, q5_1 0.038, q5_0 0.042, q4_k 0.072 / 0.075, iq4_nl 0.076 / 0.078,
 * iq4_xs 0.076 / 0.078, q4_1 0.078, q4_0 0.086, mxfp4 0.112 / 0.117 (one mantissa bit: coarse
 * steps near each block's largest weights), q3_k 0.150 / 0.152, q2_k 0.27 / 0.29. */
static void test_roundtrip(void **state)
{
    static const struct { uint32_t type; double bound, bound_fast; } c[] = {
        {VKI_GGML_F32, 0, 0}, {VKI_GGML_F16, 3e-4, 3e-4}, {VKI_GGML_BF16, 2.5e-3, 2.5e-3},
        {VKI_GGML_Q8_0, 0.008, 0.008}, {VKI_GGML_Q4_0, 0.12, 0.12}, {VKI_GGML_Q4_1, 0.10, 0.10},
        {VKI_GGML_Q5_0, 0.055, 0.055}, {VKI_GGML_Q5_1, 0.05, 0.05}, {VKI_GGML_IQ4_NL, 0.10, 0.10},
        {VKI_GGML_Q2_K, 0.35, 0.37}, {VKI_GGML_Q3_K, 0.19, 0.19}, {VKI_GGML_Q4_K, 0.085, 0.10},
        {VKI_GGML_Q5_K, 0.045, 0.048}, {VKI_GGML_Q6_K, 0.025, 0.03}, {VKI_GGML_IQ4_XS, 0.10, 0.10},
        {VKI_GGML_MXFP4, 0.14, 0.145},
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
    static const uint32_t types[] = {VKI_GGML_Q8_0, VKI_GGML_Q4_0, VKI_GGML_Q4_1, VKI_GGML_Q5_0, VKI_GGML_Q5_1,
                                     VKI_GGML_IQ4_NL, VKI_GGML_Q2_K, VKI_GGML_Q3_K, VKI_GGML_Q4_K,
                                     VKI_GGML_Q5_K, VKI_GGML_Q6_K, VKI_GGML_IQ4_XS, VKI_GGML_BF16, VKI_GGML_MXFP4};
    float x[256], y[256];
    uint8_t q[256 * 4];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        for (int kind = 0; kind < 4; kind++) {
            for (int i = 0; i < 256; i++)
                x[i] = kind == 0 ? 0.0f : kind == 1 ? 0.75f : kind == 2 ? (i == 77 ? 5.0f : 0.0f) : -1.0f - (float)(i % 5);
            quant_row(types[k], x, q, 256);
            dequant_row(types[k], q, y, 256);
            /* zeros and a single spike are representable exactly, except by the IQ4 levels, which
             * have no 0: a zero becomes the level nearest 0, 1/127 of the block's largest */
            bool iq4 = types[k] == VKI_GGML_IQ4_NL || types[k] == VKI_GGML_IQ4_XS;
            float tol = iq4 && kind == 2 ? 5.0f / 120.0f : 1e-3f * 5;
            /* E2M1 has one mantissa bit: the spike's 5 lies halfway between 4 and 6 (rel. RMS 0.2) */
            if (types[k] == VKI_GGML_MXFP4 && kind == 2)
                tol = 1.0f;
            for (int i = 0; i < 256; i++) {
                assert_true(isfinite(y[i]));
                if (kind == 0 || kind == 2)
                    if (fabsf(y[i] - x[i]) > tol)
                        fail_msg("%s kind %d element %d: %g, want %g", quant_get(types[k])->name, kind, i, y[i], x[i]);
            }
            assert_true(rel_rms(y, x, 256) < (types[k] == VKI_GGML_MXFP4 && kind == 2 ? 0.21 : 0.15) || kind == 0);
        }
    }
}

/* The device row layout (vki_shared.h): scale-grouped rows of 1..35 blocks (full and short last
 * groups) against the layout written out field by field from the GGUF blocks, with the head and
 * body sizes the shaders use; every other type is copied unchanged. */
static void test_dev_layout(void **state)
{
    static const struct {
        uint32_t type, head, body, gb, n_f;
        struct { uint32_t off, size; } f[2]; /* gathered fields, in head order */
    } g[] = {
        {VKI_GGML_Q8_0, VKI_DG_HEAD_Q8_0, VKI_DG_BODY_Q8_0, 8, 1, {{0, 2}}},
        {VKI_GGML_Q4_0, VKI_DG_HEAD_Q4_0, VKI_DG_BODY_Q4_0, 8, 1, {{0, 2}}},
        {VKI_GGML_IQ4_NL, VKI_DG_HEAD_Q4_0, VKI_DG_BODY_Q4_0, 8, 1, {{0, 2}}},
        {VKI_GGML_Q5_0, VKI_DG_HEAD_Q5_0, VKI_DG_BODY_Q5_0, 8, 2, {{0, 2}, {2, 4}}},
        {VKI_GGML_Q3_K, VKI_DG_HEAD_Q3_K, VKI_DG_BODY_Q3_K, 8, 2, {{108, 2}, {96, 12}}},
        {VKI_GGML_Q6_K, VKI_DG_HEAD_Q6_K, VKI_DG_BODY_Q6_K, 8, 1, {{208, 2}}},
        {VKI_GGML_MXFP4, VKI_DG_HEAD_MXFP4, VKI_DG_BODY_MXFP4, 16, 1, {{0, 1}}},
    };
    vt_rng r = vt_rng_seeded("quant_dev_layout");
    uint8_t src[35 * 210], dst[35 * 210 + 256], want[35 * 210 + 256];
    for (size_t k = 0; k < sizeof g / sizeof g[0]; k++) {
        const quant_traits *qt = quant_get(g[k].type);
        assert_true(quant_dev_grouped(g[k].type));
        uint32_t gathered = 0;
        for (uint32_t f = 0; f < g[k].n_f; f++)
            gathered += g[k].f[f].size;
        const uint32_t gb = g[k].gb;
        assert_int_equal(g[k].head, gb * gathered);
        assert_int_equal(qt->block_bytes, g[k].body + gathered);
        assert_int_equal(g[k].head % 16, 0);
        assert_int_equal(g[k].body % 16, 0);
        for (uint32_t nb = 1; nb <= 35; nb++) {
            uint64_t n = (uint64_t)nb * qt->block_elems;
            uint32_t groups = (nb + gb - 1) / gb;
            size_t bytes = quant_dev_row_bytes(g[k].type, n);
            assert_int_equal(bytes, (size_t)groups * g[k].head + (size_t)nb * g[k].body);
            /* full groups cost nothing: only a short last group of r blocks takes (gb - r) x more */
            assert_int_equal(bytes - quant_row_bytes(g[k].type, n), nb % gb ? (gb - nb % gb) * gathered : 0);
            for (size_t i = 0; i < sizeof src; i++)
                src[i] = (uint8_t)vt_range(&r, 0, 255);
            memset(want, 0, sizeof want);
            for (uint32_t b = 0; b < nb; b++) {
                const uint8_t *blk = src + (size_t)b * qt->block_bytes;
                uint8_t *grp = want + (size_t)(b / gb) * (g[k].head + gb * g[k].body);
                uint8_t *body = grp + g[k].head + (size_t)(b % gb) * g[k].body;
                for (uint32_t f = 0, arr = 0; f < g[k].n_f; arr += gb * g[k].f[f].size, f++)
                    memcpy(grp + arr + (b % gb) * g[k].f[f].size, blk + g[k].f[f].off, g[k].f[f].size);
                for (uint32_t i = 0; i < qt->block_bytes; i++) {
                    bool in_f = false;
                    for (uint32_t f = 0; f < g[k].n_f; f++)
                        in_f |= i >= g[k].f[f].off && i < g[k].f[f].off + g[k].f[f].size;
                    if (!in_f)
                        *body++ = blk[i];
                }
            }
            memset(dst, 0xA5, sizeof dst);
            quant_row_to_dev(g[k].type, src, dst, n);
            assert_memory_equal(dst, want, bytes);
            assert_int_equal(dst[bytes], 0xA5); /* nothing written past the row */
        }
    }
    static const uint32_t same[] = {VKI_GGML_F32, VKI_GGML_F16,  VKI_GGML_BF16, VKI_GGML_Q4_1,
                                    VKI_GGML_Q5_1, VKI_GGML_Q2_K, VKI_GGML_Q4_K, VKI_GGML_Q5_K, VKI_GGML_IQ4_XS};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        uint64_t n = quant_get(same[k])->block_elems * 3;
        size_t bytes = quant_row_bytes(same[k], n);
        assert_false(quant_dev_grouped(same[k]));
        assert_int_equal(quant_dev_row_bytes(same[k], n), bytes);
        for (size_t i = 0; i < bytes; i++)
            src[i] = (uint8_t)vt_range(&r, 0, 255);
        quant_row_to_dev(same[k], src, dst, n);
        assert_memory_equal(dst, src, bytes);
    }
    assert_int_equal(quant_dev_row_bytes(VKI_GGML_Q8_0, 33), 0);
    assert_int_equal(quant_dev_row_bytes(VKI_GGML_Q6_K, 0), 0);
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
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_dequant_legacy32),
        cmocka_unit_test(test_dequant_mxfp4),
        cmocka_unit_test(test_dequant_q2_k_q3_k),
        cmocka_unit_test(test_dequant_q5_k_iq4_xs),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_degenerate_rows),
        cmocka_unit_test(test_dev_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
