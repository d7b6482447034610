/* Scalar reference for the ggml weight formats. The dequantisers follow the block layouts
 * exactly (they define what the kernels must reproduce); the quantisers aim for a small error,
 * in the spirit of ggml's reference quantisers, without being bit-identical to them (a GGUF
 * file only fixes how blocks decode, not how they were chosen).
 *
 * Cost: dequantisation is a few operations per weight. quant_row searches a handful of scales
 * per sub-block for the K-quants (~10 candidate scales x 32 weights); quant_row_fast skips the
 * search (plain min/max rounding: ~10x faster for Q4_K/Q6_K, ~9 vs ~95 ns per weight on the dev
 * machine, and ~5% more RMS error on Gaussian rows),
 * for the synthetic model writer where billions of random weights are quantised and their exact
 * values do not matter. */
#include "engine/quant.h"

#include <math.h>
#include <string.h>

static const quant_traits quant_table[] = {
    [VKI_GGML_F32] = {"f32", 1, 4},
    [VKI_GGML_F16] = {"f16", 1, 2},
    [VKI_GGML_Q4_0] = {"q4_0", VKI_QK4_0, VKI_Q4_0_BYTES},
    [VKI_GGML_Q8_0] = {"q8_0", VKI_QK8_0, VKI_Q8_0_BYTES},
    [VKI_GGML_Q4_K] = {"q4_k", VKI_QK_K, VKI_Q4_K_BYTES},
    [VKI_GGML_Q6_K] = {"q6_k", VKI_QK_K, VKI_Q6_K_BYTES},
};
_Static_assert(sizeof quant_table / sizeof quant_table[0] == VKI_GGML_Q6_K + 1, "trait table size");

const quant_traits *quant_get(uint32_t ggml_type)
{
    if (ggml_type >= sizeof quant_table / sizeof quant_table[0] || !quant_table[ggml_type].name)
        return NULL;
    return &quant_table[ggml_type];
}

size_t quant_row_bytes(uint32_t ggml_type, uint64_t n)
{
    const quant_traits *t = quant_get(ggml_type);
    if (!t || n == 0 || n % t->block_elems)
        return 0;
    uint64_t blocks = n / t->block_elems;
    if (blocks > SIZE_MAX / t->block_bytes)
        return 0;
    return (size_t)(blocks * t->block_bytes);
}

/* ---- f16 ----------------------------------------------------------------------------------- */

uint16_t quant_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf stays inf; nan keeps its top payload bits and stays nan */
        uint32_t m = (ax & 0x7fffffu) >> 13;
        if (ax == 0x7f800000u)
            return sign | 0x7c00u;
        return (uint16_t)(sign | 0x7c00u | (m ? m : 0x200u));
    }
    if (ax >= 0x477ff000u) /* >= 65520: rounds (ties to even) past the largest half, 65504 */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) { /* below 2^-14: a half subnormal, value = q * 2^-24 */
        uint32_t e = ax >> 23;
        if (e < 102) /* < 2^-25 (and float zero/subnormals): rounds to zero */
            return sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++; /* may carry into the smallest normal, which encodes correctly */
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax - 0x38000000u; /* rebias the exponent from 127 to 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float quant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* exact: m < 2^10 */
        return sign ? -v : v;
    }
    if (e == 31)
        bits = sign | 0x7f800000u | (m << 13);
    else
        bits = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = quant_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static float get_f16(const uint8_t *p)
{
    return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* Round to nearest even without a libm call (lrintf is not inlined at -O2 without
 * -fno-math-errno and dominated the quantisers' time): adding 1.5 * 2^23 leaves the rounded
 * integer in the low mantissa bits for |x| < 2^22. Larger values (the quotients of a tiny scale)
 * saturate; NaN gives 0. Callers clamp to their q range anyway. */
static int near_int(float x)
{
    if (fabsf(x) < 4194304.0f) {
        float t = x + 12582912.0f;
        int32_t bits;
        memcpy(&bits, &t, 4);
        return bits - 0x4b400000;
    }
    return x > 0 ? 4194304 : x < 0 ? -4194304 : 0;
}

/* fminf/fmaxf are libm calls at -O2 (NaN and signed-zero rules); these inline to minss/maxss. */
static float minf(float a, float b)
{
    return b < a ? b : a;
}

static float maxf(float a, float b)
{
    return b > a ? b : a;
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* ---- Q8_0: { f16 d; int8 qs[32]; }  w = q * d ---------------------------------------------- */

static void quant_q8_0(const float *x, uint8_t *b)
{
    float amax = 0;
    for (int i = 0; i < 32; i++)
        amax = maxf(amax, fabsf(x[i]));
    put_f16(b, amax / 127.0f);
    float d = get_f16(b), id = d > 0 ? 1.0f / d : 0;
    for (int i = 0; i < 32; i++)
        b[2 + i] = (uint8_t)(int8_t)clampi(near_int(x[i] * id), -127, 127);
}

static void dequant_q8_0(const uint8_t *b, float *y)
{
    float d = get_f16(b);
    for (int i = 0; i < 32; i++)
        y[i] = (float)(int8_t)b[2 + i] * d;
}

/* ---- Q4_0: { f16 d; uint8 qs[16]; }  w = (q - 8) * d; low nibbles 0..15, high 16..31 ----------- */

static void quant_q4_0(const float *x, uint8_t *b)
{
    float m = 0; /* the signed value of largest magnitude maps to q = 0 (-8), using the whole range */
    for (int i = 0; i < 32; i++)
        if (fabsf(x[i]) > fabsf(m))
            m = x[i];
    put_f16(b, m / -8.0f);
    float d = get_f16(b), id = d != 0 ? 1.0f / d : 0;
    for (int i = 0; i < 16; i++) {
        int q0 = clampi(near_int(x[i] * id) + 8, 0, 15), q1 = clampi(near_int(x[i + 16] * id) + 8, 0, 15);
        b[2 + i] = (uint8_t)(q0 | (q1 << 4));
    }
}

static void dequant_q4_0(const uint8_t *b, float *y)
{
    float d = get_f16(b);
    for (int i = 0; i < 16; i++) {
        y[i] = (float)((b[2 + i] & 0xf) - 8) * d;
        y[i + 16] = (float)((b[2 + i] >> 4) - 8) * d;
    }
}

/* ---- Q4_K ----------------------------------------------------------------------------------
 * { f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]; }: 8 sub-blocks of 32 weights, each with
 * a 6-bit scale sc and a 6-bit min m: w = d*sc * q - dmin*m, q a 4-bit value. scales[12] packs
 * the 8 (sc, m) pairs: j < 4: sc = scales[j] & 63, m = scales[j+4] & 63; j >= 4: the low 4 bits
 * are in scales[j+4] (sc low nibble, m high nibble), the high 2 bits in the top bits of
 * scales[j-4] (sc) and scales[j] (m). qs: each 64 weights share 32 bytes, sub-block 2k in the
 * low nibbles and 2k+1 in the high nibbles. */

static void q4k_scale_min(int j, const uint8_t *s, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Fits x ~ a*L + b (L in 0..nmax, b <= 0) for one sub-block by weighted least squares, trying
 * 2*nstep+1 grid spacings around the min/max one. Returns a, sets *neg_min = -b >= 0. */
static float fit_affine(const float *x, const float *w, int n, int nmax, int nstep, float *neg_min)
{
    float mn = 0, mx = x[0];
    for (int i = 0; i < n; i++) {
        mn = minf(mn, x[i]);
        mx = maxf(mx, x[i]);
    }
    if (mx <= mn) { /* all equal and <= 0: the min alone represents them */
        *neg_min = -mn;
        return 0;
    }
    float best_a = (mx - mn) / nmax, best_b = mn, best_err = INFINITY;
    for (int k = -nstep; k <= nstep; k++) {
        float is = ((float)nmax + 0.1f * (float)k) / (mx - mn);
        float sw = 0, sl = 0, sl2 = 0, sx = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            float l = (float)clampi(near_int(is * (x[i] - mn)), 0, nmax);
            sw += w[i], sl += w[i] * l, sl2 += w[i] * l * l, sx += w[i] * x[i], sxl += w[i] * x[i] * l;
        }
        float det = sw * sl2 - sl * sl, a, b;
        if (det <= 0)
            continue;
        a = (sw * sxl - sx * sl) / det;
        b = (sl2 * sx - sl * sxl) / det;
        if (b > 0) { /* the format subtracts a non-negative min */
            b = 0;
            a = sxl / sl2;
        }
        if (nstep == 0 && a > 0) { /* a single candidate: no need to measure its error */
            best_a = a, best_b = b;
            break;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float l = (float)clampi(near_int(is * (x[i] - mn)), 0, nmax), e = a * l + b - x[i];
            err += w[i] * e * e;
        }
        if (err < best_err && a > 0)
            best_err = err, best_a = a, best_b = b;
    }
    *neg_min = -best_b;
    return best_a;
}

static void quant_q4_k(const float *x, uint8_t *b, int nstep)
{
    float sc[8], mn[8], w[32], max_sc = 0, max_mn = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float s2 = 0;
        for (int i = 0; i < 32; i++)
            s2 += xs[i] * xs[i];
        float av = sqrtf(s2 / 32); /* weight big values more: they dominate the dot products */
        for (int i = 0; i < 32; i++)
            w[i] = av + fabsf(xs[i]);
        sc[j] = fit_affine(xs, w, 32, 15, nstep, &mn[j]);
        max_sc = maxf(max_sc, sc[j]);
        max_mn = maxf(max_mn, mn[j]);
    }
    uint8_t *s = b + 4, *qs = b + 16;
    memset(s, 0, 12);
    float isc = max_sc > 0 ? 63 / max_sc : 0, imn = max_mn > 0 ? 63 / max_mn : 0;
    for (int j = 0; j < 8; j++) {
        int ls = clampi(near_int(isc * sc[j]), 0, 63), lm = clampi(near_int(imn * mn[j]), 0, 63);
        if (j < 4) {
            s[j] = (uint8_t)ls;
            s[j + 4] = (uint8_t)lm;
        } else {
            s[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
            s[j - 4] |= (uint8_t)((ls >> 4) << 6);
            s[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    put_f16(b, max_sc / 63);
    put_f16(b + 2, max_mn / 63);
    float d = get_f16(b), dmin = get_f16(b + 2);
    uint8_t L[256];
    for (int j = 0; j < 8; j++) { /* requantise against the scales the decoder will see */
        int is, im;
        q4k_scale_min(j, s, &is, &im);
        float ds = d * (float)is, dm = dmin * (float)im, ids = ds > 0 ? 1.0f / ds : 0;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)clampi(near_int((x[32 * j + i] + dm) * ids), 0, 15);
    }
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 32; i++)
            qs[32 * j + i] = (uint8_t)(L[64 * j + i] | (L[64 * j + 32 + i] << 4));
}

static void dequant_q4_k(const uint8_t *b, float *y)
{
    float d = get_f16(b), dmin = get_f16(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        q4k_scale_min(j, s, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        for (int i = 0; i < 32; i++)
            y[32 * j + i] = ds * (float)((j & 1) ? q[i] >> 4 : q[i] & 0xf) - dm;
    }
}

/* ---- Q6_K ----------------------------------------------------------------------------------
 * { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; }: 16 sub-blocks of 16 weights,
 * w = d * scales[sub] * (q - 32), q a 6-bit value. Each half of 128 weights uses 64 ql bytes and
 * 32 qh bytes: for l < 32, element l takes ql[l] low nibble, l+32 ql[l+32] low, l+64 ql[l] high,
 * l+96 ql[l+32] high; their top 2 bits are qh[l] bits 0-1, 2-3, 4-5, 6-7. */

/* Symmetric fit x ~ a*(L) with L in [-32, 31]; the largest-magnitude value maps to -32. */
static float fit_symmetric(const float *x, const float *w, int n, int nstep)
{
    float m = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(m))
            m = x[i];
    if (m == 0)
        return 0;
    float best_a = m / -32, best_err = INFINITY;
    for (int k = -nstep; k <= nstep; k++) {
        float is = -(32 + 0.1f * (float)k) / m, sxl = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            float l = (float)clampi(near_int(is * x[i]), -32, 31);
            sxl += w[i] * x[i] * l, sl2 += w[i] * l * l;
        }
        if (sl2 <= 0)
            continue;
        float a = sxl / sl2, err = 0;
        if (nstep == 0)
            return a;
        for (int i = 0; i < n; i++) {
            float e = a * (float)clampi(near_int(is * x[i]), -32, 31) - x[i];
            err += w[i] * e * e;
        }
        if (err < best_err)
            best_err = err, best_a = a;
    }
    return best_a;
}

static void quant_q6_k(const float *x, uint8_t *b, int nstep)
{
    uint8_t *ql = b, *qh = b + 128, L[256];
    int8_t *sc = (int8_t *)(b + 192);
    float a[16], w[16], max_a = 0;
    for (int j = 0; j < 16; j++) {
        for (int i = 0; i < 16; i++)
            w[i] = x[16 * j + i] * x[16 * j + i];
        a[j] = fit_symmetric(x + 16 * j, w, 16, nstep);
        if (fabsf(a[j]) > fabsf(max_a))
            max_a = a[j];
    }
    float is = max_a != 0 ? -128 / max_a : 0;
    for (int j = 0; j < 16; j++)
        sc[j] = (int8_t)clampi(near_int(is * a[j]), -128, 127);
    put_f16(b + 208, is != 0 ? 1 / is : 0);
    float d = get_f16(b + 208);
    for (int j = 0; j < 16; j++) {
        float ds = d * (float)sc[j], ids = ds != 0 ? 1.0f / ds : 0;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (uint8_t)(clampi(near_int(x[16 * j + i] * ids), -32, 31) + 32);
    }
    for (int h = 0; h < 2; h++) {
        const uint8_t *l = L + 128 * h;
        for (int i = 0; i < 32; i++) {
            ql[64 * h + i] = (uint8_t)((l[i] & 0xf) | ((l[i + 64] & 0xf) << 4));
            ql[64 * h + i + 32] = (uint8_t)((l[i + 32] & 0xf) | ((l[i + 96] & 0xf) << 4));
            qh[32 * h + i] = (uint8_t)((l[i] >> 4) | ((l[i + 32] >> 4) << 2) | ((l[i + 64] >> 4) << 4) |
                                       ((l[i + 96] >> 4) << 6));
        }
    }
}

static void dequant_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = get_f16(b + 208);
    for (int h = 0; h < 2; h++) {
        const uint8_t *l = ql + 64 * h, *hb = qh + 32 * h;
        const int8_t *s = sc + 8 * h;
        float *o = y + 128 * h;
        for (int i = 0; i < 32; i++) {
            int q1 = ((l[i] & 0xf) | (((hb[i] >> 0) & 3) << 4)) - 32;
            int q2 = ((l[i + 32] & 0xf) | (((hb[i] >> 2) & 3) << 4)) - 32;
            int q3 = ((l[i] >> 4) | (((hb[i] >> 4) & 3) << 4)) - 32;
            int q4 = ((l[i + 32] >> 4) | (((hb[i] >> 6) & 3) << 4)) - 32;
            int is = i / 16;
            o[i] = d * (float)s[is] * (float)q1;
            o[i + 32] = d * (float)s[is + 2] * (float)q2;
            o[i + 64] = d * (float)s[is + 4] * (float)q3;
            o[i + 96] = d * (float)s[is + 6] * (float)q4;
        }
    }
}

/* ---- rows ----------------------------------------------------------------------------------- */

static void quant_row_n(uint32_t type, const float *x, void *dst, uint64_t n, int nstep)
{
    const quant_traits *t = quant_get(type);
    if (!t || n % t->block_elems)
        return;
    if (type == VKI_GGML_F32) {
        memcpy(dst, x, n * sizeof(float));
        return;
    }
    uint8_t *o = dst;
    uint64_t nb = n / t->block_elems;
    for (uint64_t i = 0; i < nb; i++) {
        const float *xb = x + i * t->block_elems;
        uint8_t *ob = o + i * t->block_bytes;
        switch (type) {
        case VKI_GGML_F32: memcpy(ob, xb, 4); break;
        case VKI_GGML_F16: put_f16(ob, *xb); break;
        case VKI_GGML_Q8_0: quant_q8_0(xb, ob); break;
        case VKI_GGML_Q4_0: quant_q4_0(xb, ob); break;
        case VKI_GGML_Q4_K: quant_q4_k(xb, ob, nstep); break;
        case VKI_GGML_Q6_K: quant_q6_k(xb, ob, nstep); break;
        }
    }
}

void quant_row(uint32_t ggml_type, const float *x, void *dst, uint64_t n)
{
    quant_row_n(ggml_type, x, dst, n, 5);
}

void quant_row_fast(uint32_t ggml_type, const float *x, void *dst, uint64_t n)
{
    quant_row_n(ggml_type, x, dst, n, 0);
}

void dequant_row(uint32_t ggml_type, const void *src, float *y, uint64_t n)
{
    const quant_traits *t = quant_get(ggml_type);
    if (!t || n % t->block_elems)
        return;
    if (ggml_type == VKI_GGML_F32) {
        memcpy(y, src, n * sizeof(float));
        return;
    }
    const uint8_t *s = src;
    uint64_t nb = n / t->block_elems;
    for (uint64_t i = 0; i < nb; i++) {
        const uint8_t *sb = s + i * t->block_bytes;
        float *yb = y + i * t->block_elems;
        switch (ggml_type) {
        case VKI_GGML_F32: memcpy(yb, sb, 4); break;
        case VKI_GGML_F16: *yb = get_f16(sb); break;
        case VKI_GGML_Q8_0: dequant_q8_0(sb, yb); break;
        case VKI_GGML_Q4_0: dequant_q4_0(sb, yb); break;
        case VKI_GGML_Q4_K: dequant_q4_k(sb, yb); break;
        case VKI_GGML_Q6_K: dequant_q6_k(sb, yb); break;
        }
    }
}
