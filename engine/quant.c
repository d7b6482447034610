/* Scalar reference for the ggml weight formats. The dequantisers follow the block layouts
 * exactly (they define what the kernels must reproduce), in the f32 operation order of ggml's
 * and gguf-py's reference code, so they are bit-exact with them (this file is compiled with
 * -ffp-contract=off: a fused multiply-add rounds differently). The quantisers aim for a small
 * error, in the spirit of ggml's reference quantisers, without being bit-identical to them (a
 * GGUF file only fixes how blocks decode, not how they were chosen).
 *
 * Cost: dequantisation is a few operations per weight. quant_row searches a handful of scales
 * per sub-block for the K- and IQ4 quants (~10 candidate scales x 16-32 weights); quant_row_fast
 * skips the search (plain min/max rounding: ~10x faster for Q4_K/Q6_K, ~9 vs ~95 ns per weight
 * on the dev machine, and ~5% more RMS error on Gaussian rows), for the synthetic model writer
 * where billions of random weights are quantised and their exact values do not matter. */
#include "engine/quant.h"

#include <math.h>
#include <string.h>

/* Every ggml type whose block layout is fixed (ggml-common.h); ids 4, 5 (q4_2, q4_3) and 31-33,
 * 36-38 (the removed repacked Q4_0 / IQ4_NL variants) have none and stay unknown. */
static const quant_traits quant_table[] = {
    [VKI_GGML_F32] = {"f32", 1, 4, true},
    [VKI_GGML_F16] = {"f16", 1, 2, true},
    [VKI_GGML_Q4_0] = {"q4_0", 32, VKI_Q4_0_BYTES, true},
    [VKI_GGML_Q4_1] = {"q4_1", 32, VKI_Q4_1_BYTES, true},
    [VKI_GGML_Q5_0] = {"q5_0", 32, VKI_Q5_0_BYTES, true},
    [VKI_GGML_Q5_1] = {"q5_1", 32, VKI_Q5_1_BYTES, true},
    [VKI_GGML_Q8_0] = {"q8_0", 32, VKI_Q8_0_BYTES, true},
    [9] = {"q8_1", 32, 36, false},
    [VKI_GGML_Q2_K] = {"q2_k", VKI_QK_K, VKI_Q2_K_BYTES, true},
    [VKI_GGML_Q3_K] = {"q3_k", VKI_QK_K, VKI_Q3_K_BYTES, true},
    [VKI_GGML_Q4_K] = {"q4_k", VKI_QK_K, VKI_Q4_K_BYTES, true},
    [VKI_GGML_Q5_K] = {"q5_k", VKI_QK_K, VKI_Q5_K_BYTES, true},
    [VKI_GGML_Q6_K] = {"q6_k", VKI_QK_K, VKI_Q6_K_BYTES, true},
    [15] = {"q8_k", 256, 292, false},
    [16] = {"iq2_xxs", 256, 66, false},
    [17] = {"iq2_xs", 256, 74, false},
    [18] = {"iq3_xxs", 256, 98, false},
    [19] = {"iq1_s", 256, 50, false},
    [VKI_GGML_IQ4_NL] = {"iq4_nl", 32, VKI_IQ4_NL_BYTES, true},
    [21] = {"iq3_s", 256, 110, false},
    [22] = {"iq2_s", 256, 82, false},
    [VKI_GGML_IQ4_XS] = {"iq4_xs", VKI_QK_K, VKI_IQ4_XS_BYTES, true},
    [24] = {"i8", 1, 1, false},
    [25] = {"i16", 1, 2, false},
    [26] = {"i32", 1, 4, false},
    [27] = {"i64", 1, 8, false},
    [28] = {"f64", 1, 8, false},
    [29] = {"iq1_m", 256, 56, false},
    [VKI_GGML_BF16] = {"bf16", 1, 2, true},
    [34] = {"tq1_0", 256, 54, false},
    [35] = {"tq2_0", 256, 66, false},
    [VKI_GGML_MXFP4] = {"mxfp4", 32, VKI_MXFP4_BYTES, true},
};
#define QUANT_N_TYPES (sizeof quant_table / sizeof quant_table[0])
_Static_assert(QUANT_N_TYPES == 40, "trait table size");

const quant_traits *quant_info(uint32_t ggml_type)
{
    if (ggml_type >= QUANT_N_TYPES || !quant_table[ggml_type].name)
        return NULL;
    return &quant_table[ggml_type];
}

const quant_traits *quant_get(uint32_t ggml_type)
{
    const quant_traits *t = quant_info(ggml_type);
    return t && t->runs ? t : NULL;
}

const char *quant_type_name(uint32_t ggml_type)
{
    const quant_traits *t = quant_info(ggml_type);
    return t ? t->name : "unknown";
}

const char *quant_supported_list(void)
{
    return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, mxfp4";
}

size_t quant_row_bytes(uint32_t ggml_type, uint64_t n)
{
    const quant_traits *t = quant_info(ggml_type);
    if (!t || n == 0 || n % t->block_elems)
        return 0;
    uint64_t blocks = n / t->block_elems;
    if (blocks > SIZE_MAX / t->block_bytes)
        return 0;
    return (size_t)(blocks * t->block_bytes);
}

/* ---- device row layout (vki_shared.h) ------------------------------------------------------ */

/* A scale-grouped type: fields f0 (d) and f1 (s1 = 0: none) of the GGUF block gathered at the
 * head of each group of nb blocks (VKI_DG_BLOCKS; MXFP4 VKI_DG_BLOCKS_MXFP4), one array of nb per
 * field in that order; the body is the rest of the block, one run of its bytes [b_off, b_off +
 * body). */
typedef struct dev_layout {
    uint32_t bb;             /* GGUF block bytes */
    uint32_t o0, s0, o1, s1; /* the gathered fields: offset and size in the block */
    uint32_t b_off, body;
    uint32_t nb;             /* blocks per group */
} dev_layout;

static const dev_layout dl_q8_0 = {34, 0, 2, 0, 0, 2, VKI_DG_BODY_Q8_0, VKI_DG_BLOCKS};
static const dev_layout dl_q4_0 = {18, 0, 2, 0, 0, 2, VKI_DG_BODY_Q4_0, VKI_DG_BLOCKS}; /* and IQ4_NL */
static const dev_layout dl_q5_0 = {22, 0, 2, 2, 4, 6, VKI_DG_BODY_Q5_0, VKI_DG_BLOCKS}; /* d, qh */
static const dev_layout dl_q3_k = {110, 108, 2, 96, 12, 0, VKI_DG_BODY_Q3_K, VKI_DG_BLOCKS}; /* d, scales */
static const dev_layout dl_q6_k = {210, 208, 2, 0, 0, 0, VKI_DG_BODY_Q6_K, VKI_DG_BLOCKS};
static const dev_layout dl_mxfp4 = {17, 0, 1, 0, 0, 1, VKI_DG_BODY_MXFP4, VKI_DG_BLOCKS_MXFP4}; /* e */
_Static_assert(VKI_DG_BLOCKS_MXFP4 * 1 == VKI_DG_HEAD_MXFP4, "MXFP4's head: one e byte per block");

static const dev_layout *dev_layout_get(uint32_t type)
{
    switch (type) {
    case VKI_GGML_Q8_0: return &dl_q8_0;
    case VKI_GGML_Q4_0:
    case VKI_GGML_IQ4_NL: return &dl_q4_0;
    case VKI_GGML_Q5_0: return &dl_q5_0;
    case VKI_GGML_Q3_K: return &dl_q3_k;
    case VKI_GGML_Q6_K: return &dl_q6_k;
    case VKI_GGML_MXFP4: return &dl_mxfp4;
    default: return NULL;
    }
}

bool quant_dev_grouped(uint32_t ggml_type) { return dev_layout_get(ggml_type) != NULL; }

size_t quant_dev_row_bytes(uint32_t ggml_type, uint64_t n)
{
    size_t gguf = quant_row_bytes(ggml_type, n);
    const dev_layout *L = dev_layout_get(ggml_type);
    if (!gguf || !L)
        return gguf;
    uint64_t blocks = gguf / L->bb, groups = (blocks + L->nb - 1) / L->nb;
    if (blocks > SIZE_MAX / 2 / L->bb)
        return 0; /* the device row is at most twice the GGUF row (one short group) */
    return (size_t)(groups * L->nb * (L->s0 + L->s1) + blocks * L->body);
}

/* One row of blocks into groups. Inlined per type with L's sizes constant, so every copy is a
 * few moves (a loop of variable-size memcpy calls ran ~30% slower). */
static inline void dev_repack(const dev_layout *L, const uint8_t *s, uint8_t *o, uint64_t blocks)
{
    const uint32_t head = L->nb * (L->s0 + L->s1);
    for (uint64_t g0 = 0; g0 < blocks; g0 += L->nb) {
        uint64_t r = blocks - g0 < L->nb ? blocks - g0 : L->nb;
        if (r < L->nb)
            memset(o, 0, head);
        for (uint64_t j = 0; j < r; j++) {
            const uint8_t *b = s + (g0 + j) * L->bb;
            memcpy(o + j * L->s0, b + L->o0, L->s0);
            if (L->s1)
                memcpy(o + L->nb * L->s0 + j * L->s1, b + L->o1, L->s1);
            memcpy(o + head + j * L->body, b + L->b_off, L->body);
        }
        o += head + r * L->body;
    }
}

void quant_row_to_dev(uint32_t ggml_type, const void *src, void *dst, uint64_t n)
{
    size_t gguf = quant_row_bytes(ggml_type, n);
    if (!gguf || !quant_get(ggml_type))
        return;
    switch (ggml_type) { /* each call with a constant layout */
    case VKI_GGML_Q8_0: dev_repack(&dl_q8_0, src, dst, gguf / dl_q8_0.bb); break;
    case VKI_GGML_Q4_0:
    case VKI_GGML_IQ4_NL: dev_repack(&dl_q4_0, src, dst, gguf / dl_q4_0.bb); break;
    case VKI_GGML_Q5_0: dev_repack(&dl_q5_0, src, dst, gguf / dl_q5_0.bb); break;
    case VKI_GGML_Q3_K: dev_repack(&dl_q3_k, src, dst, gguf / dl_q3_k.bb); break;
    case VKI_GGML_Q6_K: dev_repack(&dl_q6_k, src, dst, gguf / dl_q6_k.bb); break;
    case VKI_GGML_MXFP4: dev_repack(&dl_mxfp4, src, dst, gguf / dl_mxfp4.bb); break;
    default: memcpy(dst, src, gguf); break;
    }
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

/* ggml_compute_fp32_to_bf16: a nan keeps its sign and top payload bits and is made quiet (a
 * payload only in the low bits would otherwise round to inf). */
uint16_t quant_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float quant_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
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

/* The signed value of largest magnitude among n: symmetric formats map it to their most
 * negative level, which uses the whole range. */
static float signed_absmax(const float *x, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(m))
            m = x[i];
    return m;
}

/* ---- Q4_0: { f16 d; uint8 qs[16]; }  w = (q - 8) * d; low nibbles 0..15, high 16..31 ----------- */

static void quant_q4_0(const float *x, uint8_t *b)
{
    put_f16(b, signed_absmax(x, 32) / -8.0f);
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

/* ---- Q4_1 / Q5_1: { f16 d, m; [uint8 qh[4];] uint8 qs[16]; }  w = d * q + m -------------------
 * The block's min and max span q = 0..nmax; q is rounded against the stored (f16) d and m. */
static void quant_affine32(const float *x, int nmax, uint8_t *hdr, int *q)
{
    float mn = x[0], mx = x[0];
    for (int i = 1; i < 32; i++) {
        mn = minf(mn, x[i]);
        mx = maxf(mx, x[i]);
    }
    put_f16(hdr, (mx - mn) / (float)nmax);
    put_f16(hdr + 2, mn);
    float d = get_f16(hdr), m = get_f16(hdr + 2), id = d > 0 ? 1.0f / d : 0;
    for (int i = 0; i < 32; i++)
        q[i] = clampi(near_int((x[i] - m) * id), 0, nmax);
}

static void quant_q4_1(const float *x, uint8_t *b)
{
    int q[32];
    quant_affine32(x, 15, b, q);
    for (int i = 0; i < 16; i++)
        b[4 + i] = (uint8_t)(q[i] | (q[i + 16] << 4));
}

static void dequant_q4_1(const uint8_t *b, float *y)
{
    float d = get_f16(b), m = get_f16(b + 2);
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)(b[4 + i] & 0xf) + m;
        y[i + 16] = d * (float)(b[4 + i] >> 4) + m;
    }
}

/* ---- Q5_0 / Q5_1: the fifth bit of element j is bit j of the little-endian u32 qh ---------- */

static void pack_q5(const int *q, uint8_t *qh, uint8_t *qs)
{
    uint32_t h = 0;
    for (int i = 0; i < 32; i++)
        h |= (uint32_t)(q[i] >> 4) << i;
    for (int k = 0; k < 4; k++)
        qh[k] = (uint8_t)(h >> 8 * k);
    for (int i = 0; i < 16; i++)
        qs[i] = (uint8_t)((q[i] & 15) | ((q[i + 16] & 15) << 4));
}

static void unpack_q5(const uint8_t *qh, const uint8_t *qs, int *q)
{
    uint32_t h = qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int i = 0; i < 16; i++) {
        q[i] = (qs[i] & 15) | (int)((h >> i) & 1) << 4;
        q[i + 16] = (qs[i] >> 4) | (int)((h >> (i + 16)) & 1) << 4;
    }
}

/* Q5_0: { f16 d; uint8 qh[4]; uint8 qs[16]; }  w = d * (q - 16) */
static void quant_q5_0(const float *x, uint8_t *b)
{
    put_f16(b, signed_absmax(x, 32) / -16.0f);
    float d = get_f16(b), id = d != 0 ? 1.0f / d : 0;
    int q[32];
    for (int i = 0; i < 32; i++)
        q[i] = clampi(near_int(x[i] * id) + 16, 0, 31);
    pack_q5(q, b + 2, b + 6);
}

static void dequant_q5_0(const uint8_t *b, float *y)
{
    float d = get_f16(b);
    int q[32];
    unpack_q5(b + 2, b + 6, q);
    for (int i = 0; i < 32; i++)
        y[i] = d * (float)(q[i] - 16);
}

/* Q5_1: { f16 d, m; uint8 qh[4]; uint8 qs[16]; }  w = d * q + m */
static void quant_q5_1(const float *x, uint8_t *b)
{
    int q[32];
    quant_affine32(x, 31, b, q);
    pack_q5(q, b + 4, b + 8);
}

static void dequant_q5_1(const uint8_t *b, float *y)
{
    float d = get_f16(b), m = get_f16(b + 2);
    int q[32];
    unpack_q5(b + 4, b + 8, q);
    for (int i = 0; i < 32; i++)
        y[i] = d * (float)q[i] + m;
}

/* ---- IQ4_NL: { f16 d; uint8 qs[16]; }  w = d * level[nibble], 16 non-uniform levels --------- */

static const int8_t iq4nl_levels[16] = {VKI_IQ4NL_VALUES};

/* Index of the level nearest to v (levels ascending): a binary search, 4 compares. */
static int iq4nl_index(float v)
{
    int lo = 0, hi = 15;
    if (v <= iq4nl_levels[0])
        return 0;
    if (v >= iq4nl_levels[15])
        return 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v < (float)iq4nl_levels[mid])
            hi = mid;
        else
            lo = mid;
    }
    return v - (float)iq4nl_levels[lo] < (float)iq4nl_levels[hi] - v ? lo : hi;
}

/* The level nearest v: of -nlev..nlev-1 (the integer levels of Q6_K, Q3_K), or of the IQ4_NL
 * levels when nlev == 0. */
static float level_of(float v, int nlev)
{
    return nlev ? (float)clampi(near_int(v), -nlev, nlev - 1) : (float)iq4nl_levels[iq4nl_index(v)];
}

/* Symmetric scale a of n weights, x ~ a * level: the weight of largest magnitude maps to the
 * most negative level (-nlev, or -127), then 2 * nstep other spacings around it are tried (as
 * ggml does), each with the least-squares a for its level choice; the best by weighted error
 * wins. */
static float fit_scale(const float *x, const float *w, int n, int nlev, int nstep)
{
    float m = signed_absmax(x, n), lo = nlev ? (float)-nlev : -127.0f, step = nlev ? 0.1f : 1.0f;
    float best_a = m / lo, best_err = INFINITY;
    if (m == 0)
        return 0;
    for (int k = -nstep; k <= nstep; k++) {
        float is = (lo + step * (float)k) / m, sxl = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            float l = level_of(is * x[i], nlev);
            sxl += w[i] * x[i] * l, sl2 += w[i] * l * l;
        }
        if (sl2 <= 0)
            continue;
        float a = sxl / sl2, err = 0;
        if (nstep == 0)
            return a;
        for (int i = 0; i < n; i++) {
            float e = a * level_of(is * x[i], nlev) - x[i];
            err += w[i] * e * e;
        }
        if (err < best_err)
            best_err = err, best_a = a;
    }
    return best_a;
}

/* 32 weights of scale d as nibbles in qs[16] (element i low, i + 16 high). */
static void pack_iq4(const float *x, float d, uint8_t *qs)
{
    float id = d != 0 ? 1.0f / d : 0;
    for (int i = 0; i < 16; i++)
        qs[i] = (uint8_t)(iq4nl_index(x[i] * id) | (iq4nl_index(x[i + 16] * id) << 4));
}

/* Weights for the scale fits: big values dominate the dot products, so they count more. */
static void fit_weights(const float *x, int n, float *w)
{
    float s2 = 0;
    for (int i = 0; i < n; i++)
        s2 += x[i] * x[i];
    float av = sqrtf(s2 / (float)n);
    for (int i = 0; i < n; i++)
        w[i] = av + fabsf(x[i]);
}

static void quant_iq4_nl(const float *x, uint8_t *b, int nstep)
{
    float w[32];
    fit_weights(x, 32, w);
    put_f16(b, fit_scale(x, w, 32, 0, nstep));
    pack_iq4(x, get_f16(b), b + 2);
}

static void dequant_iq4_nl(const uint8_t *b, float *y)
{
    float d = get_f16(b);
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)iq4nl_levels[b[2 + i] & 0xf];
        y[i + 16] = d * (float)iq4nl_levels[b[2 + i] >> 4];
    }
}

/* ---- MXFP4: { uint8 e; uint8 qs[16]; }  w = value[nibble] * d, d = 2^(e - 128) -------------
 * OCP MX's E2M1 elements under an E8M0 scale; the values are held doubled (integers), the scale
 * halved. d is a power of two, so every decoded weight is exact. */

static const int8_t mxfp4_values[16] = {VKI_MXFP4_VALUES};

/* ggml_e8m0_to_fp32_half: 2^(e - 128) for every e (subnormal for e < 2). */
static float mxfp4_scale(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The code of v (in units of d) nearest among the 16 values; a tie takes the smaller magnitude
 * and zero the +0 code, as the first of equal errors in ggml's search. */
static uint8_t mxfp4_code(float v)
{
    static const float mid[7] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f}; /* between magnitudes */
    float a = fabsf(v);
    uint8_t m = 0;
    while (m < 7 && a > mid[m])
        m++;
    return m && v < 0 ? (uint8_t)(m | 8) : m;
}

static float mxfp4_block(const float *x, uint8_t e, uint8_t *qs)
{
    float d = mxfp4_scale(e), id = 1.0f / d, err = 0;
    for (int i = 0; i < 16; i++) {
        uint8_t c0 = mxfp4_code(x[i] * id), c1 = mxfp4_code(x[i + 16] * id);
        qs[i] = (uint8_t)(c0 | (c1 << 4));
        float e0 = (float)mxfp4_values[c0] * d - x[i], e1 = (float)mxfp4_values[c1] * d - x[i + 16];
        err += e0 * e0 + e1 * e1;
    }
    return err;
}

/* ggml's exponent: the largest magnitude's binary exponent - 2, so 4 * 2^e' (the doubled value
 * 8) lands in [amax / 2, amax) and only values past 1.5 x that clip to 12. With nstep > 0 the
 * next exponent up is tried too (no clipping, coarser steps) and the smaller squared error kept. */
static void quant_mxfp4(const float *x, uint8_t *b, int nstep)
{
    float amax = 0;
    for (int i = 0; i < 32; i++)
        amax = maxf(amax, fabsf(x[i]));
    int ex = 0;
    if (amax > 0)
        (void)frexpf(amax, &ex); /* amax = f * 2^ex, f in [0.5, 1): floor(log2 amax) = ex - 1 */
    int e = amax > 0 ? clampi(ex - 1 - 2 + 127, 1, 253) : 0;
    b[0] = (uint8_t)e;
    float err = mxfp4_block(x, b[0], b + 1);
    if (nstep > 0 && amax > 0) {
        uint8_t alt[16];
        if (mxfp4_block(x, (uint8_t)(e + 1), alt) < err) {
            b[0] = (uint8_t)(e + 1);
            memcpy(b + 1, alt, 16);
        }
    }
}

static void dequant_mxfp4(const uint8_t *b, float *y)
{
    float d = mxfp4_scale(b[0]);
    for (int i = 0; i < 16; i++) {
        y[i] = (float)mxfp4_values[b[1 + i] & 0xf] * d;
        y[i + 16] = (float)mxfp4_values[b[1 + i] >> 4] * d;
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

/* Q4_K and Q5_K share the first 16 bytes { f16 d, dmin; uint8 scales[12] }: fits the 8
 * sub-blocks with q in 0..nmax, writes them, and sets L[256] to q requantised against the
 * scales the decoder will see. */
static void quant_k_affine(const float *x, uint8_t *b, int nstep, int nmax, uint8_t *L)
{
    float sc[8], mn[8], w[32], max_sc = 0, max_mn = 0;
    for (int j = 0; j < 8; j++) {
        fit_weights(x + 32 * j, 32, w);
        sc[j] = fit_affine(x + 32 * j, w, 32, nmax, nstep, &mn[j]);
        max_sc = maxf(max_sc, sc[j]);
        max_mn = maxf(max_mn, mn[j]);
    }
    uint8_t *s = b + 4;
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
    for (int j = 0; j < 8; j++) {
        int is, im;
        q4k_scale_min(j, s, &is, &im);
        float ds = d * (float)is, dm = dmin * (float)im, ids = ds > 0 ? 1.0f / ds : 0;
        for (int i = 0; i < 32; i++)
            L[32 * j + i] = (uint8_t)clampi(near_int((x[32 * j + i] + dm) * ids), 0, nmax);
    }
}

static void quant_q4_k(const float *x, uint8_t *b, int nstep)
{
    uint8_t L[256], *qs = b + 16;
    quant_k_affine(x, b, nstep, 15, L);
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 32; i++)
            qs[32 * j + i] = (uint8_t)(L[64 * j + i] | (L[64 * j + 32 + i] << 4));
}

/* Q4_K (qh == NULL) and Q5_K: element 32j + l of sub-block j = 2c + h sits in nibble h of
 * qs[32c + l]; Q5_K's fifth bit is bit j of qh[l]. */
static void dequant_k_affine(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y)
{
    float d = get_f16(b), dmin = get_f16(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        q4k_scale_min(j, b + 4, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        for (int i = 0; i < 32; i++) {
            int v = (j & 1) ? q[i] >> 4 : q[i] & 0xf;
            if (qh)
                v |= ((qh[i] >> j) & 1) << 4;
            y[32 * j + i] = ds * (float)v - dm;
        }
    }
}

/* ---- Q5_K: { f16 d, dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; } -------------------
 * Q4_K with a fifth bit per weight: 5-bit q, w = d*sc * q - dmin*m. */
static void quant_q5_k(const float *x, uint8_t *b, int nstep)
{
    uint8_t L[256], *qh = b + 16, *qs = b + 48;
    quant_k_affine(x, b, nstep, 31, L);
    memset(qh, 0, 32);
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 32; i++) {
            uint8_t v = L[32 * j + i];
            qh[i] |= (uint8_t)((v >> 4) << j);
            if (j & 1)
                qs[32 * (j / 2) + i] |= (uint8_t)((v & 15) << 4);
            else
                qs[32 * (j / 2) + i] = (uint8_t)(v & 15);
        }
}

/* ---- Q2_K: { uint8 scales[16]; uint8 qs[64]; f16 d, dmin; } ------------------------------------
 * 16 sub-blocks of 16 weights with a 4-bit scale and a 4-bit min each (scales[s]: low / high
 * nibble): w = d*sc * q - dmin*m, q a 2-bit value. Element 128n + 32j + l has its q in bits
 * 2j..2j+1 of qs[32n + l]. */
static void quant_q2_k(const float *x, uint8_t *b, int nstep)
{
    uint8_t *sc = b, *qs = b + 16;
    float a[16], mn[16], w[16], max_a = 0, max_m = 0;
    for (int s = 0; s < 16; s++) {
        fit_weights(x + 16 * s, 16, w);
        a[s] = fit_affine(x + 16 * s, w, 16, 3, nstep, &mn[s]);
        max_a = maxf(max_a, a[s]);
        max_m = maxf(max_m, mn[s]);
    }
    put_f16(b + 80, max_a / 15);
    put_f16(b + 82, max_m / 15);
    float d = get_f16(b + 80), dmin = get_f16(b + 82), id = d > 0 ? 1.0f / d : 0, im = dmin > 0 ? 1.0f / dmin : 0;
    memset(qs, 0, 64);
    for (int s = 0; s < 16; s++) {
        int ls = clampi(near_int(a[s] * id), 0, 15), lm = clampi(near_int(mn[s] * im), 0, 15);
        sc[s] = (uint8_t)(ls | (lm << 4));
        float ds = d * (float)ls, dm = dmin * (float)lm, ids = ds > 0 ? 1.0f / ds : 0;
        for (int i = 0; i < 16; i++) {
            int e = 16 * s + i, q = clampi(near_int((x[e] + dm) * ids), 0, 3);
            qs[32 * (e / 128) + e % 32] |= (uint8_t)(q << (2 * ((e / 32) % 4)));
        }
    }
}

static void dequant_q2_k(const uint8_t *b, float *y)
{
    const uint8_t *sc = b, *qs = b + 16;
    float d = get_f16(b + 80), dmin = get_f16(b + 82);
    for (int s = 0; s < 16; s++) {
        float dl = d * (float)(sc[s] & 15), ml = dmin * (float)(sc[s] >> 4);
        for (int i = 0; i < 16; i++) {
            int e = 16 * s + i;
            y[e] = dl * (float)((qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3) - ml;
        }
    }
}

/* ---- Q6_K ----------------------------------------------------------------------------------
 * { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; }: 16 sub-blocks of 16 weights,
 * w = d * scales[sub] * (q - 32), q a 6-bit value. Each half of 128 weights uses 64 ql bytes and
 * 32 qh bytes: for l < 32, element l takes ql[l] low nibble, l+32 ql[l+32] low, l+64 ql[l] high,
 * l+96 ql[l+32] high; their top 2 bits are qh[l] bits 0-1, 2-3, 4-5, 6-7. */

/* Q6_K and Q3_K: symmetric scales a[16] of the 16 sub-blocks of 16 weights (weighted by x^2,
 * levels -nlev..nlev-1); returns the one of largest magnitude. */
static float fit_symmetric16(const float *x, int nlev, int nstep, float *a)
{
    float w[16], max_a = 0;
    for (int j = 0; j < 16; j++) {
        for (int i = 0; i < 16; i++)
            w[i] = x[16 * j + i] * x[16 * j + i];
        a[j] = fit_scale(x + 16 * j, w, 16, nlev, nstep);
        if (fabsf(a[j]) > fabsf(max_a))
            max_a = a[j];
    }
    return max_a;
}

static void quant_q6_k(const float *x, uint8_t *b, int nstep)
{
    uint8_t *ql = b, *qh = b + 128, L[256];
    int8_t *sc = (int8_t *)(b + 192);
    float a[16], max_a = fit_symmetric16(x, 32, nstep, a);
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

/* ---- Q3_K: { uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; f16 d; } ------------------------
 * 16 sub-blocks of 16 weights, w = d * (scale - 32) * q with q in -4..3: the low 2 bits of
 * element e = 128n + 32j + l in bits 2j.. of qs[32n + l] (as Q2_K), the third in bit e/32 of
 * hmask[l], set meaning "q = low bits", clear "low bits - 4". 6-bit scales: sub-block s has its
 * low 4 bits in nibble s/8 of scales[s % 8] and its top 2 in bits 2(s/4).. of scales[8 + s%4]. */

static int q3k_scale(const uint8_t *sc, int s)
{
    return ((sc[s % 8] >> (4 * (s / 8))) & 15) | (((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4);
}

static void quant_q3_k(const float *x, uint8_t *b, int nstep)
{
    uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float a[16], max_a = fit_symmetric16(x, 4, nstep, a);
    float is = max_a != 0 ? -32 / max_a : 0;
    memset(b, 0, 108);
    put_f16(b + 108, is != 0 ? 1 / is : 0);
    float d = get_f16(b + 108);
    for (int s = 0; s < 16; s++) {
        int ls = clampi(near_int(is * a[s]), -32, 31), l6 = ls + 32;
        sc[s % 8] |= (uint8_t)((l6 & 15) << (4 * (s / 8)));
        sc[8 + s % 4] |= (uint8_t)((l6 >> 4) << (2 * (s / 4)));
        float ds = d * (float)ls, ids = ds != 0 ? 1.0f / ds : 0;
        for (int i = 0; i < 16; i++) {
            int e = 16 * s + i, q = clampi(near_int(x[e] * ids), -4, 3) + 4, l = e % 32;
            qs[32 * (e / 128) + l] |= (uint8_t)((q & 3) << (2 * ((e / 32) % 4)));
            if (q & 4)
                hm[l] |= (uint8_t)(1 << (e / 32));
        }
    }
}

static void dequant_q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float d = get_f16(b + 108);
    for (int s = 0; s < 16; s++) {
        float dl = d * (float)(q3k_scale(sc, s) - 32);
        for (int i = 0; i < 16; i++) {
            int e = 16 * s + i, l = e % 32;
            int q = ((qs[32 * (e / 128) + l] >> (2 * ((e / 32) % 4))) & 3) - (((hm[l] >> (e / 32)) & 1) ? 0 : 4);
            y[e] = dl * (float)q;
        }
    }
}

/* ---- IQ4_XS: { f16 d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]; } --------------------
 * 8 sub-blocks of 32 IQ4_NL-coded weights (qs bytes 16b.., element i low nibble, i + 16 high)
 * with 6-bit signed sub-scales: w = d * (ls - 32) * level[q]. */
static int iq4xs_scale(const uint8_t *b, int j)
{
    uint16_t h = (uint16_t)(b[2] | (b[3] << 8));
    return ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((h >> (2 * j)) & 3) << 4);
}

static void quant_iq4_xs(const float *x, uint8_t *b, int nstep)
{
    float a[8], w[32], max_a = 0;
    for (int j = 0; j < 8; j++) {
        fit_weights(x + 32 * j, 32, w);
        a[j] = fit_scale(x + 32 * j, w, 32, 0, nstep);
        if (fabsf(a[j]) > fabsf(max_a))
            max_a = a[j];
    }
    memset(b, 0, 8);
    put_f16(b, max_a / -32.0f); /* the largest sub-scale maps to ls - 32 = -32 */
    float d = get_f16(b), id = d != 0 ? 1.0f / d : 0;
    uint16_t h = 0;
    for (int j = 0; j < 8; j++) {
        int ls = clampi(near_int(a[j] * id), -32, 31) + 32;
        b[4 + j / 2] |= (uint8_t)((ls & 15) << (4 * (j % 2)));
        h |= (uint16_t)((ls >> 4) << (2 * j));
        pack_iq4(x + 32 * j, d * (float)(ls - 32), b + 8 + 16 * j);
    }
    b[2] = (uint8_t)h;
    b[3] = (uint8_t)(h >> 8);
}

static void dequant_iq4_xs(const uint8_t *b, float *y)
{
    float d = get_f16(b);
    for (int j = 0; j < 8; j++) {
        float dl = d * (float)(iq4xs_scale(b, j) - 32);
        const uint8_t *qs = b + 8 + 16 * j;
        for (int i = 0; i < 16; i++) {
            y[32 * j + i] = dl * (float)iq4nl_levels[qs[i] & 0xf];
            y[32 * j + i + 16] = dl * (float)iq4nl_levels[qs[i] >> 4];
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
        case VKI_GGML_BF16: {
            uint16_t h = quant_f32_to_bf16(*xb);
            ob[0] = (uint8_t)h, ob[1] = (uint8_t)(h >> 8);
            break;
        }
        case VKI_GGML_Q8_0: quant_q8_0(xb, ob); break;
        case VKI_GGML_Q4_0: quant_q4_0(xb, ob); break;
        case VKI_GGML_Q4_1: quant_q4_1(xb, ob); break;
        case VKI_GGML_Q5_0: quant_q5_0(xb, ob); break;
        case VKI_GGML_Q5_1: quant_q5_1(xb, ob); break;
        case VKI_GGML_IQ4_NL: quant_iq4_nl(xb, ob, nstep); break;
        case VKI_GGML_Q2_K: quant_q2_k(xb, ob, nstep); break;
        case VKI_GGML_Q3_K: quant_q3_k(xb, ob, nstep); break;
        case VKI_GGML_Q4_K: quant_q4_k(xb, ob, nstep); break;
        case VKI_GGML_Q5_K: quant_q5_k(xb, ob, nstep); break;
        case VKI_GGML_Q6_K: quant_q6_k(xb, ob, nstep); break;
        case VKI_GGML_IQ4_XS: quant_iq4_xs(xb, ob, nstep); break;
        case VKI_GGML_MXFP4: quant_mxfp4(xb, ob, nstep); break;
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
        case VKI_GGML_BF16: *yb = quant_bf16_to_f32((uint16_t)(sb[0] | (sb[1] << 8))); break;
        case VKI_GGML_Q8_0: dequant_q8_0(sb, yb); break;
        case VKI_GGML_Q4_0: dequant_q4_0(sb, yb); break;
        case VKI_GGML_Q4_1: dequant_q4_1(sb, yb); break;
        case VKI_GGML_Q5_0: dequant_q5_0(sb, yb); break;
        case VKI_GGML_Q5_1: dequant_q5_1(sb, yb); break;
        case VKI_GGML_IQ4_NL: dequant_iq4_nl(sb, yb); break;
        case VKI_GGML_Q2_K: dequant_q2_k(sb, yb); break;
        case VKI_GGML_Q3_K: dequant_q3_k(sb, yb); break;
        case VKI_GGML_Q4_K: dequant_k_affine(sb, NULL, sb + 16, yb); break;
        case VKI_GGML_Q5_K: dequant_k_affine(sb, sb + 16, sb + 48, yb); break;
        case VKI_GGML_Q6_K: dequant_q6_k(sb, yb); break;
        case VKI_GGML_IQ4_XS: dequant_iq4_xs(sb, yb); break;
        case VKI_GGML_MXFP4: dequant_mxfp4(sb, yb); break;
        }
    }
}
