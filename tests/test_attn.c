/* Paged KV cache writes and attention (engine/ops_attn.h) against a scalar reference that
 * accumulates in double. Every case is a ragged step: sequences in random order, some decoding
 * (one new token after a cached context), some prefilling (a chunk after a cached prefix, or a
 * whole prompt); their pages are a random shuffle of a pool filled with NaN, so a read of a
 * wrong page or slot poisons the output. The cached prefix is written into the pool by the host
 * (from the documented layout), the new tokens by kv_write from a fused QKV buffer; afterwards
 * the pools must equal the host's copy byte for byte (F16: round to nearest even, bit-exact
 * with quant_f32_to_f16). The output is NaN-filled with padding between rows that must stay NaN.
 *
 * Tolerances (NMSE of each case's output against the reference): 1e-10 for F32, F16 and Q8_0
 * pools alike, since the reference reads the same f16-rounded or Q8_0-quantised K/V the kernels
 * read (Q8_0 pools must also equal ggml's quantisation byte for byte). Measured on lavapipe:
 * <= 1.0e-12 over seeds 1-3 (printed at the end). Against unquantised f32 K/V a Q8_0 pool is held to Q8_VS_F32_TOL.
 *
 * Sliding windows and the attention sink: pages no query of a case sees any more point at a
 * NaN page, so a kernel that reads outside the window fails; the soft-cap is gemma 2's. */
#include "support/vt.h"

#include "engine/ops_attn.h"
#include "engine/ops_matmul.h"
#include "engine/quant.h"

#define ATTN_TOL 1e-10
#define Q8_VS_F32_TOL 1e-4 /* measured on lavapipe: 2.6e-5 (uniform K/V, 8-bit blocks) */
/* Prefill on cooperative matrices rounds Q (scaled), K, V and P to F16 (the reference does not,
 * except K/V of F16 pools); scores, softmax and sums stay F32. */
#define ATTN_CM_TOL 1e-6 /* measured on lavapipe (emulated): <= 1e-7 */
/* short windows average fewer F16-rounded V rows: measured 7.2e-7 (7-key window) */
#define ATTN_CM_WINDOW_TOL 3e-6
#define MAX_SEQS 8

/* Set by the cooperative-matrix tests: the tolerance, that op_attn_setup must have picked the
 * coopmat prefill kernel, and the worst NMSE seen. */
static double attn_tol = ATTN_TOL;
static bool expect_cm;
static bool nvidia_lanes; /* decode lanes per key giving NVIDIA's keys per subgroup (test_gpu_configs) */
static double worst_nmse;
static double worst_fp32; /* the FP32 kernels' worst over the run (ATTN_TOL) */
static uint32_t merged_runs; /* runs whose decode splits were merged by the last split */
static float *captured;      /* set: run_case copies its output here (captured_n floats at most) */
static size_t captured_n;

typedef struct acase {
    const char *name;
    uint32_t n_heads, n_kv, hd, page;
    uint32_t n_seqs;
    uint32_t pos0[MAX_SEQS], n_new[MAX_SEQS];
    uint32_t split_keys; /* 0: automatic decode splits */
    float q_amp;         /* query magnitude: larger gives peakier softmax */
    float scale;         /* 0: 1/sqrt(hd) */
    uint32_t window;     /* sliding window (0: none); pages it leaves behind are "released" */
    uint32_t sink;       /* attention sink with the window */
    float softcap;       /* attention logit soft-cap (0: none) */
    float sink_amp;      /* > 0: per-head sink logits (gpt-oss), uniform in [-amp, amp] plus one head's
                            far above every score (a sink that takes nearly all the weight) */
    float temp_scale;    /* temp_len > 0: Mistral 3's attention temperature (op_attn_shape) */
    uint32_t temp_len;
} acase;

/* Host model of one pool: element (page, kvh, slot, d) as the device stores it. */
typedef struct hpool {
    uint8_t *bytes;
    size_t n;
    uint32_t type; /* VKI_GGML_F32 / F16 / Q8_0 */
} hpool;

static void hpool_put(hpool *p, const op_attn_shape *s, uint32_t page, uint32_t kvh, uint32_t slot, const float *row)
{
    uint32_t hd = s->head_dim, rows = s->n_kv_heads * s->page_size, rip = kvh * s->page_size + slot;
    if (p->type == VKI_GGML_Q8_0) { /* the two planes of vki_shared.h */
        uint8_t *pg = p->bytes + (size_t)page * op_kv_page_bytes(s);
        for (uint32_t b = 0; b < 2 * VKI_KV_Q8_DW(hd); b++) { /* an odd count pads its last word with 0 */
            uint16_t d = b < hd / 32 ? vt_q8_0_block(row + 32 * b, (int8_t *)(pg + (size_t)rip * hd + 32 * b)) : 0;
            memcpy(pg + (size_t)rows * hd + 4 * ((size_t)rip * VKI_KV_Q8_DW(hd) + b / 2) + 2 * (b % 2), &d, 2);
        }
        return;
    }
    size_t base = ((size_t)page * rows + rip) * hd;
    for (uint32_t d = 0; d < hd; d++) {
        if (p->type == VKI_GGML_F16) {
            uint16_t h = quant_f32_to_f16(row[d]);
            memcpy(p->bytes + 2 * (base + d), &h, 2);
        } else {
            memcpy(p->bytes + 4 * (base + d), &row[d], 4);
        }
    }
}

/* What the kernels read back for a row of n values (kv heads of head_dim each): the pool's
 * rounding (f16, or Q8_0 blocks). */
static void kv_round_row(const op_attn_shape *s, float *x, uint32_t n)
{
    for (uint32_t i = 0; s->kv_type == VKI_GGML_F16 && i < n; i++)
        x[i] = quant_f16_to_f32(quant_f32_to_f16(x[i]));
    for (uint32_t b = 0; s->kv_type == VKI_GGML_Q8_0 && b < n / 32; b++) {
        int8_t q[32];
        float d = quant_f16_to_f32(vt_q8_0_block(x + 32 * b, q));
        for (int i = 0; i < 32; i++)
            x[32 * b + i] = q[i] * d;
    }
}

/* Whether the query at position pos sees key j (vki_pc_attn). */
static bool key_visible(const acase *ac, uint32_t j, uint32_t pos)
{
    return j <= pos && (!ac->window || pos - j < ac->window || j < ac->sink);
}

/* Everything one case allocates on the host. */
typedef struct hstep {
    uint32_t n_tokens, qkv_stride, o_stride, o_off, n_pages;
    vki_seq_info seq[MAX_SEQS];
    uint32_t *pt, n_pt;      /* page table */
    uint32_t *tok_pos, *tok_seq;
    float *qkv;              /* [n_tokens][qkv_stride]: q | k | v | pad */
    float *kc[MAX_SEQS], *vc[MAX_SEQS]; /* reference K/V per sequence [n_ctx][n_kv][hd], rounded */
    float *kx[MAX_SEQS], *vx[MAX_SEQS]; /* the same unrounded (f32) */
    hpool kpool, vpool;
    uint32_t n_released;     /* page-table entries pointed at a NaN page (outside every window) */
    float *sinks;            /* [n_heads] sink logits, or NULL (acase.sink_amp) */
} hstep;

/* Pages wholly outside the first new token's window (and past the sink) are what the scheduler
 * releases: point them at a NaN page, so any read of one poisons the output. */
static void release_pages(const acase *ac, const op_attn_shape *s, hstep *h)
{
    for (uint32_t k = 0; ac->window && k < ac->n_seqs; k++) {
        const vki_seq_info *q = &h->seq[k];
        uint32_t first = q->n_ctx - q->n_new, n_pg = (q->n_ctx + s->page_size - 1) / s->page_size;
        for (uint32_t j = 0; j < n_pg; j++)
            if ((j + 1) * s->page_size + ac->window <= first + 1 && j * s->page_size >= ac->sink) {
                h->pt[q->pt_off + j] = h->pt[h->n_pt]; /* the first unused page: all NaN */
                h->n_released++;
            }
    }
}

static void build_step(vt_rng *r, const acase *ac, const op_attn_shape *s, hstep *h)
{
    uint32_t order[MAX_SEQS], kvrow = s->n_kv_heads * s->head_dim;
    memset(h, 0, sizeof *h);
    for (uint32_t i = 0; i < ac->n_seqs; i++)
        order[i] = i;
    for (uint32_t i = ac->n_seqs; i > 1; i--) { /* sequences in random order in the batch */
        uint32_t j = vt_range(r, 0, i - 1), t = order[i - 1];
        order[i - 1] = order[j], order[j] = t;
    }
    for (uint32_t k = 0; k < ac->n_seqs; k++) {
        uint32_t i = order[k], n_ctx = ac->pos0[i] + ac->n_new[i];
        h->seq[k] = (vki_seq_info){.row0 = h->n_tokens, .n_new = ac->n_new[i], .n_ctx = n_ctx, .pt_off = h->n_pt};
        h->n_tokens += ac->n_new[i];
        h->n_pt += (n_ctx + s->page_size - 1) / s->page_size;
    }
    h->n_pages = h->n_pt + vt_range(r, 1, 9); /* unused pages stay NaN */
    uint32_t *perm = malloc(h->n_pages * sizeof *perm);
    for (uint32_t i = 0; i < h->n_pages; i++)
        perm[i] = i;
    for (uint32_t i = h->n_pages; i > 1; i--) {
        uint32_t j = vt_range(r, 0, i - 1), t = perm[i - 1];
        perm[i - 1] = perm[j], perm[j] = t;
    }
    h->pt = perm; /* the first n_pt entries are the page table */
    h->qkv_stride = (s->n_heads + 2 * s->n_kv_heads) * s->head_dim + vt_range(r, 0, 3);
    h->o_stride = s->n_heads * s->head_dim + vt_range(r, 0, 5);
    h->o_off = vt_range(r, 0, 7);
    h->qkv = malloc((size_t)h->n_tokens * h->qkv_stride * sizeof(float));
    vt_fill_uniform(r, h->qkv, (size_t)h->n_tokens * h->qkv_stride, -1, 1);
    for (size_t t = 0; t < h->n_tokens; t++)
        for (uint32_t d = 0; d < s->n_heads * s->head_dim; d++)
            h->qkv[t * h->qkv_stride + d] *= ac->q_amp;
    h->tok_pos = malloc(h->n_tokens * 4);
    h->tok_seq = malloc(h->n_tokens * 4);
    size_t pool_bytes = (size_t)h->n_pages * op_kv_page_bytes(s);
    h->kpool = (hpool){malloc(pool_bytes), pool_bytes, s->kv_type};
    h->vpool = (hpool){malloc(pool_bytes), pool_bytes, s->kv_type};
    for (size_t i = 0; i < pool_bytes / 4; i++) { /* the NaN fill of vt_buf_nan */
        memcpy(h->kpool.bytes + 4 * i, &(uint32_t){0x7fc00000u}, 4);
        memcpy(h->vpool.bytes + 4 * i, &(uint32_t){0x7fc00000u}, 4);
    }
    float *row = malloc(kvrow * sizeof *row);
    for (uint32_t k = 0; k < ac->n_seqs; k++) {
        vki_seq_info *q = &h->seq[k];
        uint32_t pos0 = q->n_ctx - q->n_new;
        h->kc[k] = malloc((size_t)q->n_ctx * kvrow * sizeof(float));
        h->vc[k] = malloc((size_t)q->n_ctx * kvrow * sizeof(float));
        h->kx[k] = malloc((size_t)q->n_ctx * kvrow * sizeof(float));
        h->vx[k] = malloc((size_t)q->n_ctx * kvrow * sizeof(float));
        for (uint32_t pos = 0; pos < q->n_ctx; pos++) {
            uint32_t page = h->pt[q->pt_off + pos / s->page_size], slot = pos % s->page_size;
            for (int kv = 0; kv < 2; kv++) {
                if (pos < pos0) { /* cached before this step: random */
                    vt_fill_uniform(r, row, kvrow, -1, 1);
                } else { /* new: from the activations */
                    uint32_t t = q->row0 + pos - pos0;
                    memcpy(row, h->qkv + (size_t)t * h->qkv_stride + (s->n_heads + kv * s->n_kv_heads) * s->head_dim,
                           kvrow * sizeof *row);
                    h->tok_pos[t] = pos, h->tok_seq[t] = k;
                }
                float *dst = (kv ? h->vc[k] : h->kc[k]) + (size_t)pos * kvrow;
                memcpy((kv ? h->vx[k] : h->kx[k]) + (size_t)pos * kvrow, row, kvrow * sizeof *row);
                memcpy(dst, row, kvrow * sizeof *row);
                kv_round_row(s, dst, kvrow);
                for (uint32_t g = 0; g < s->n_kv_heads; g++)
                    hpool_put(kv ? &h->vpool : &h->kpool, s, page, g, slot, row + g * s->head_dim);
            }
        }
    }
    free(row);
    release_pages(ac, s, h);
    if (ac->sink_amp > 0) {
        h->sinks = malloc(s->n_heads * sizeof *h->sinks);
        vt_fill_uniform(r, h->sinks, s->n_heads, -ac->sink_amp, ac->sink_amp);
        h->sinks[s->n_heads - 1] = 60.0f; /* e^60 above any score: the output all but vanishes */
    }
}

static void free_step(hstep *h, uint32_t n_seqs)
{
    for (uint32_t k = 0; k < n_seqs; k++) {
        free(h->kc[k]);
        free(h->vc[k]);
        free(h->kx[k]);
        free(h->vx[k]);
    }
    free(h->pt); free(h->tok_pos); free(h->tok_seq); free(h->qkv); free(h->sinks);
    free(h->kpool.bytes); free(h->vpool.bytes);
}

/* Reference: packed out [n_tokens][n_heads * hd], double accumulation, over the K/V the pool
 * holds (rounded: true) or the f32 values written (false). */
static void ref_attention(const op_attn *a, const acase *ac, const hstep *h, bool rounded, float *out)
{
    uint32_t n_seqs = ac->n_seqs;
    const op_attn_shape *s = &a->s;
    uint32_t hd = s->head_dim, group = s->n_heads / s->n_kv_heads, kvrow = s->n_kv_heads * hd;
    double *sc = NULL, *acc = malloc(hd * sizeof *acc);
    for (uint32_t k = 0; k < n_seqs; k++) {
        const vki_seq_info *q = &h->seq[k];
        sc = realloc(sc, q->n_ctx * sizeof *sc);
        for (uint32_t i = 0; i < q->n_new; i++) {
            uint32_t t = q->row0 + i, pos = q->n_ctx - q->n_new + i;
            for (uint32_t hh = 0; hh < s->n_heads; hh++) {
                const float *qv = h->qkv + (size_t)t * h->qkv_stride + hh * hd;
                uint32_t g = hh / group;
                double mx = h->sinks ? h->sinks[hh] : -INFINITY, sum = 0;
                for (uint32_t j = 0; j <= pos; j++) {
                    const float *kv = (rounded ? h->kc[k] : h->kx[k]) + (size_t)j * kvrow + g * hd;
                    double dot = 0;
                    for (uint32_t d = 0; d < hd; d++)
                        dot += (double)qv[d] * kv[d];
                    sc[j] = dot * s->scale; /* the query's temperature, as the kernels take it */
                    if (s->temp_len)
                        sc[j] *= 1.0 + s->temp_scale * log(floor((double)pos / s->temp_len) + 1.0);
                    if (ac->softcap > 0)
                        sc[j] = ac->softcap * tanh(sc[j] / ac->softcap);
                    if (!key_visible(ac, j, pos))
                        sc[j] = -INFINITY;
                    mx = fmax(mx, sc[j]);
                }
                memset(acc, 0, hd * sizeof *acc);
                for (uint32_t j = 0; j <= pos; j++) {
                    if (!key_visible(ac, j, pos))
                        continue;
                    double pr = exp(sc[j] - mx);
                    sum += pr;
                    const float *vv = (rounded ? h->vc[k] : h->vx[k]) + (size_t)j * kvrow + g * hd;
                    for (uint32_t d = 0; d < hd; d++)
                        acc[d] += pr * vv[d];
                }
                if (h->sinks) /* the sink logit's share of the denominator, no value */
                    sum += exp(h->sinks[hh] - mx);
                for (uint32_t d = 0; d < hd; d++)
                    out[(size_t)t * s->n_heads * hd + hh * hd + d] = (float)(acc[d] / sum);
            }
        }
    }
    free(sc);
    free(acc);
}

/* Checks the output against the reference over the pool's rounded K/V (ATTN_TOL) and returns
 * its NMSE against the reference over the f32 values written (what a Q8_0 pool costs). */
static double check_output(const op_attn *a, const hstep *h, const float *o, const acase *ac, const char *type)
{
    uint32_t row = a->s.n_heads * a->s.head_dim;
    size_t n_out = (size_t)h->n_tokens * row;
    float *ref = malloc(n_out * sizeof *ref), *got = malloc(n_out * sizeof *got);
    ref_attention(a, ac, h, true, ref);
    for (uint32_t t = 0; t < h->n_tokens; t++)
        memcpy(got + (size_t)t * row, o + h->o_off + (size_t)t * h->o_stride, row * sizeof(float));
    char label[200];
    snprintf(label, sizeof label, "%s %s (heads %u/%u hd %u page %u window %u sink %u cap %g%s)", ac->name, type,
             a->s.n_heads, a->s.n_kv_heads, a->s.head_dim, a->s.page_size, ac->window, ac->sink, ac->softcap,
             h->sinks ? " sink logits" : "");
    double e = vt_nmse(got, ref, n_out);
    worst_nmse = e > worst_nmse ? e : worst_nmse;
    if (!expect_cm)
        worst_fp32 = e > worst_fp32 ? e : worst_fp32;
    vt_assert_nmse(got, ref, n_out, attn_tol, label);
    size_t n = h->o_off + (size_t)h->n_tokens * h->o_stride;
    for (size_t i = 0; i < n; i++) { /* padding and the offset are never written */
        bool inside = i >= h->o_off && (i - h->o_off) % h->o_stride < row;
        uint32_t bits;
        memcpy(&bits, &o[i], 4);
        if (!inside && bits != 0x7fc00000u)
            fail_msg("%s: float %zu outside the output rows was written", label, i);
    }
    ref_attention(a, ac, h, false, ref);
    double vs_f32 = vt_nmse(got, ref, n_out);
    free(ref);
    free(got);
    return vs_f32;
}

/* NVIDIA's decode puts L = the largest power of 2 dividing head_dim / 8 (<= 32) lanes on a key,
 * so 32 / L keys share a 32-lane subgroup (2 at head dim 128). The lanes giving the same keys
 * per subgroup at this device's smallest subgroup (at least 1 lane). */
static uint32_t nvidia_lanes_here(vt_gpu *g, uint32_t hd)
{
    uint32_t l = 1, sg = g->dev->info.subgroup_min_size ? g->dev->info.subgroup_min_size : g->dev->info.subgroup_size;
    while (l * 2 <= 32 && (hd / 8) % (l * 2) == 0)
        l *= 2;
    return l * sg / 32 ? l * sg / 32 : 1;
}

/* Device buffers of one case. */
typedef struct dstep {
    vkd_buffer *qkv, *o, *o2, *kp, *vp, *pos, *seq, *info, *pt, *items, *scratch, *cnt, *sinks;
} dstep;

/* NaN over row (page, kvh, slot) of a device pool, in the pool's layout (both Q8_0 planes). */
static void fill_row_nan(vt_gpu *g, vkd_buffer *pool, const op_attn_shape *s, uint32_t page, uint32_t kvh, uint32_t slot)
{
    size_t hd = s->head_dim, rows = (size_t)s->n_kv_heads * s->page_size, rip = kvh * s->page_size + slot;
    size_t pg = page * op_kv_page_bytes(s);
    if (s->kv_type == VKI_GGML_Q8_0) {
        assert_int_equal(vkd_fill(g->dev, pool, pg + rip * hd, hd, 0x7fc00000u), VKI_OK);
        assert_int_equal(vkd_fill(g->dev, pool, pg + rows * hd + 4 * rip * VKI_KV_Q8_DW(hd), 4 * VKI_KV_Q8_DW(hd),
                                  0x7fc00000u), VKI_OK);
        return;
    }
    size_t esz = s->kv_type == VKI_GGML_F16 ? 2 : 4;
    assert_int_equal(vkd_fill(g->dev, pool, pg + rip * hd * esz, hd * esz, 0x7fc00000u), VKI_OK);
}

/* Device pools holding the host's rows (which hold the new tokens already), with the step's new
 * rows NaN: only kv_write can set them. */
static void pools_new_nan(vt_gpu *g, const hstep *h, const op_attn_shape *s, vkd_buffer **kp, vkd_buffer **vp)
{
    *kp = vt_buf_from(g, h->kpool.bytes, h->kpool.n, "K pool");
    *vp = vt_buf_from(g, h->vpool.bytes, h->vpool.n, "V pool");
    for (uint32_t t = 0; t < h->n_tokens; t++) {
        const vki_seq_info *q = &h->seq[h->tok_seq[t]];
        uint32_t page = h->pt[q->pt_off + h->tok_pos[t] / s->page_size], slot = h->tok_pos[t] % s->page_size;
        for (uint32_t kvh = 0; kvh < s->n_kv_heads; kvh++) {
            fill_row_nan(g, *kp, s, page, kvh, slot);
            fill_row_nan(g, *vp, s, page, kvh, slot);
        }
    }
}

static uint32_t fresh_runs; /* decode steps checked with the newest keys from the projections */
static uint32_t xq_runs;    /* ... of which with the output's int8 copy */

/* A decode-only step (plan->n_pre == 0) with the newest keys read from the projections
 * (op_attn_fresh), without RoPE and with a normal and a NeoX rotation of part of the head, is
 * bit for bit the step done as rope(q) + kv_write(rotating K) + barrier + attention; the fresh
 * attention is recorded before its kv_write, over pools whose new rows are NaN, so a read of
 * one of them fails the case; the pools the two write are the same bytes. */
static void check_fresh(vt_gpu *g, const op_attn *a, const op_attn_step *st, const hstep *h, const acase *ac,
                        vkd_view merge, vkd_view scratch, const vkd_view *sinks, const char *type)
{
    const op_attn_shape *s = &a->s;
    uint32_t hd = s->head_dim, qrow = s->n_heads * hd, kvrow = s->n_kv_heads * hd;
    uint32_t rots[3] = {0, hd, hd / 2}; /* head dims are multiples of 8 */
    size_t qkv_n = (size_t)h->n_tokens * h->qkv_stride, o_n = h->o_off + (size_t)h->n_tokens * h->o_stride;
    float *fr = malloc(hd * 2 * sizeof *fr), *out[2] = {malloc(o_n * 4), malloc(o_n * 4)};
    uint8_t *pool[2] = {malloc(h->kpool.n), malloc(h->kpool.n)};
    for (int ri = 0; ri < 3; ri++) {
        bool neox = ri == 2;
        op_rope_freqs(10000.0, 1.0, NULL, NULL, 1.0f, rots[ri] ? rots[ri] : 2, fr);
        vkd_buffer *bfr = vt_buf_from(g, fr, hd * 2 * sizeof *fr, "freqs");
        vkd_buffer *qkv[2] = {vt_buf_from(g, h->qkv, qkv_n * 4, "qkv, rope pass"), vt_buf_from(g, h->qkv, qkv_n * 4, "qkv")};
        vkd_buffer *o[2] = {vt_buf_nan(g, o_n * 4, "out, rope pass"), vt_buf_nan(g, o_n * 4, "out, fresh")};
        vkd_buffer *kp[2], *vp[2];
        for (int f = 0; f < 2; f++)
            pools_new_nan(g, h, s, &kp[f], &vp[f]);
        op_kv_rope kr = {.n_rot = rots[ri], .neox = neox, .freqs = vkd_whole(bfr)};
        const op_kv_rope *rope = rots[ri] ? &kr : NULL;
        op_mat q[2], k[2], v[2], om[2];
        for (int f = 0; f < 2; f++) {
            q[f] = (op_mat){vkd_whole(qkv[f]), 0, h->qkv_stride}, k[f] = (op_mat){vkd_whole(qkv[f]), qrow, h->qkv_stride};
            v[f] = (op_mat){vkd_whole(qkv[f]), qrow + kvrow, h->qkv_stride}, om[f] = (op_mat){vkd_whole(o[f]), h->o_off, h->o_stride};
        }
        op_rope_p rq = {.n_tokens = h->n_tokens, .n_heads = s->n_heads, .head_dim = hd, .n_rot = rots[ri], .neox = neox};
        /* head dims of 32s: the output's int8 copy too, = op_quant_x8 of the rope pass's output */
        bool with_xq = hd % 32 == 0;
        size_t xq_n = with_xq ? op_quant_x8_bytes(h->n_tokens, qrow) : 4;
        vkd_buffer *xq[2] = {vt_buf_nan(g, xq_n, "xq, quant_x8"), vt_buf_nan(g, xq_n, "xq, attention")};
        op_attn_fresh fresh = {k[1], v[1], rope, with_xq ? vkd_whole(xq[1]) : (vkd_view){0}};
        vt_begin(g);
        if (rope)
            assert_int_equal(op_rope(&g->cmd, &rq, q[0], q[0], st->tok_pos, vkd_whole(bfr)), VKI_OK);
        assert_int_equal(op_kv_write(&g->cmd, a, st, k[0], v[0], vkd_whole(kp[0]), vkd_whole(vp[0]), rope), VKI_OK);
        vkd_barrier(&g->cmd);
        assert_int_equal(op_attention(&g->cmd, a, st, q[0], om[0], vkd_whole(kp[0]), vkd_whole(vp[0]), scratch, &merge,
                                      NULL, sinks), VKI_OK);
        vkd_barrier(&g->cmd); /* the partials and counters */
        assert_int_equal(op_attention(&g->cmd, a, st, q[1], om[1], vkd_whole(kp[1]), vkd_whole(vp[1]), scratch, &merge,
                                      &fresh, sinks), VKI_OK);
        assert_int_equal(op_kv_write(&g->cmd, a, st, k[1], v[1], vkd_whole(kp[1]), vkd_whole(vp[1]), rope), VKI_OK);
        vt_submit_wait(g);
        char label[160];
        snprintf(label, sizeof label, "%s %s, new keys from the projections, rope %u%s", ac->name, type, rots[ri],
                 neox ? " neox" : "");
        for (int f = 0; f < 2; f++)
            vt_download(g, o[f], out[f], o_n * 4);
        if (memcmp(out[0], out[1], o_n * 4))
            fail_msg("%s: differs from rope + kv_write + barrier + attention (NMSE %.3g)", label,
                     vt_nmse(out[0], out[1], o_n));
        for (int kv = 0; kv < 2; kv++) {
            vt_download(g, kv ? vp[0] : kp[0], pool[0], h->kpool.n);
            vt_download(g, kv ? vp[1] : kp[1], pool[1], h->kpool.n);
            if (memcmp(pool[0], pool[1], h->kpool.n))
                fail_msg("%s: %s pool differs", label, kv ? "V" : "K");
        }
        if (with_xq) { /* op_quant_x8 of the rope pass's output rows, packed */
            float *rows = malloc((size_t)h->n_tokens * qrow * sizeof *rows);
            for (uint32_t t = 0; t < h->n_tokens; t++)
                memcpy(rows + (size_t)t * qrow, out[0] + h->o_off + (size_t)t * h->o_stride, qrow * sizeof *rows);
            vkd_buffer *bx = vt_buf_from(g, rows, (size_t)h->n_tokens * qrow * sizeof *rows, "rows to quantise");
            vt_begin(g);
            assert_int_equal(op_quant_x8(&g->cmd, vkd_whole(bx), qrow, h->n_tokens, qrow, vkd_whole(xq[0])), VKI_OK);
            vt_submit_wait(g);
            vkd_buffer_destroy(g->dev, bx);
            free(rows);
            uint8_t *xb[2] = {malloc(xq_n), malloc(xq_n)};
            vt_download(g, xq[0], xb[0], xq_n);
            vt_download(g, xq[1], xb[1], xq_n);
            if (memcmp(xb[0], xb[1], xq_n))
                fail_msg("%s: the int8 output differs from op_quant_x8's", label);
            free(xb[0]), free(xb[1]);
            xq_runs++;
        }
        vkd_buffer *all[] = {bfr, qkv[0], qkv[1], o[0], o[1], kp[0], kp[1], vp[0], vp[1], xq[0], xq[1]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            vkd_buffer_destroy(g->dev, all[i]);
    }
    fresh_runs++;
    free(fr), free(out[0]), free(out[1]), free(pool[0]), free(pool[1]);
}

static const char *kv_name(uint32_t t) { return t == VKI_GGML_F16 ? "f16" : t == VKI_GGML_Q8_0 ? "q8_0" : "f32"; }

/* Runs one case with a pool of kv_type; returns the output's NMSE against the reference over
 * unrounded f32 K/V. */
static double run_case(vt_gpu *g, vt_rng *r, const acase *ac, uint32_t kv_type, uint32_t *released)
{
    op_attn_shape s = {.n_heads = ac->n_heads, .n_kv_heads = ac->n_kv, .head_dim = ac->hd, .page_size = ac->page,
                       .kv_type = kv_type, .scale = ac->scale, .softcap = ac->softcap, .window = ac->window,
                       .sink = ac->sink, .temp_scale = ac->temp_scale, .temp_len = ac->temp_len};
    op_attn a;
    assert_int_equal(op_attn_setup(g->dev, &s, &a), VKI_OK);
    a.split_keys = ac->split_keys;
    if (nvidia_lanes)
        a.dec_spec[2] = nvidia_lanes_here(g, ac->hd);
    if (expect_cm) /* the coopmat kernel really runs (no silent fall-back to the FP32 one) */
        assert_true(a.pre_kid >= VKK_ATTN_PREFILL_CM_F16 && a.pre_kid <= VKK_ATTN_PREFILL_CME_Q8_0);
    hstep h;
    build_step(r, ac, &a.s, &h);
    uint32_t cap = op_attn_max_items(&a, ac->n_seqs, h.n_tokens);
    vki_attn_item *items = malloc(cap * sizeof *items);
    op_attn_plan plan;
    assert_int_equal(op_attn_plan_build(&a, h.seq, ac->n_seqs, items, cap, &plan), VKI_OK);
    assert_int_equal(plan.n_tokens, h.n_tokens);
    dstep d;
    d.qkv = vt_buf_from(g, h.qkv, (size_t)h.n_tokens * h.qkv_stride * 4, "qkv");
    size_t o_n = h.o_off + (size_t)h.n_tokens * h.o_stride;
    d.o = vt_buf_nan(g, o_n * 4, "attn out");
    d.o2 = vt_buf_nan(g, o_n * 4, "attn out, reduce pass");
    pools_new_nan(g, &h, &s, &d.kp, &d.vp); /* only kv_write can set the new rows */
    d.pos = vt_buf_from(g, h.tok_pos, h.n_tokens * 4, "tok_pos");
    d.seq = vt_buf_from(g, h.tok_seq, h.n_tokens * 4, "tok_seq");
    d.info = vt_buf_from(g, h.seq, ac->n_seqs * sizeof(vki_seq_info), "seq_info");
    d.pt = vt_buf_from(g, h.pt, h.n_pt * 4, "page_table");
    d.items = vt_buf_from(g, items, plan.n_items * sizeof *items, "items");
    uint64_t sb = op_attn_scratch_bytes(&a, plan.n_slots);
    d.scratch = vt_buf_nan(g, sb ? sb : 4, "partials");
    size_t cb = op_attn_merge_bytes(&a, ac->n_seqs);
    uint32_t *cnt = calloc(cb / 4, 4);
    d.cnt = vt_buf_from(g, cnt, cb, "merge counters");
    op_attn_step st = {vkd_whole(d.pos), vkd_whole(d.seq), vkd_whole(d.info), vkd_whole(d.pt), vkd_whole(d.items), &plan};
    uint32_t qrow = s.n_heads * s.head_dim, kvrow = s.n_kv_heads * s.head_dim;
    op_mat q = {vkd_whole(d.qkv), 0, h.qkv_stride}, k = {vkd_whole(d.qkv), qrow, h.qkv_stride};
    op_mat v = {vkd_whole(d.qkv), qrow + kvrow, h.qkv_stride}, o = {vkd_whole(d.o), h.o_off, h.o_stride};
    /* the decode splits merged by the last of them, then (same pools) by the reduce pass */
    vkd_view merge = vkd_whole(d.cnt);
    op_mat o2 = {vkd_whole(d.o2), h.o_off, h.o_stride};
    d.sinks = h.sinks ? vt_buf_from(g, h.sinks, s.n_heads * sizeof *h.sinks, "sink logits") : NULL;
    vkd_view sv = d.sinks ? vkd_whole(d.sinks) : (vkd_view){0};
    const vkd_view *sinks = d.sinks ? &sv : NULL;
    vt_begin(g);
    assert_int_equal(op_kv_write(&g->cmd, &a, &st, k, v, vkd_whole(d.kp), vkd_whole(d.vp), NULL), VKI_OK);
    vkd_barrier(&g->cmd);
    assert_int_equal(op_attention(&g->cmd, &a, &st, q, o, vkd_whole(d.kp), vkd_whole(d.vp), vkd_whole(d.scratch),
                                  &merge, NULL, sinks), VKI_OK);
    vkd_barrier(&g->cmd);
    assert_int_equal(op_attention(&g->cmd, &a, &st, q, o2, vkd_whole(d.kp), vkd_whole(d.vp), vkd_whole(d.scratch),
                                  NULL, NULL, sinks), VKI_OK);
    vt_submit_wait(g);

    const char *type = kv_name(kv_type);
    uint8_t *pool = malloc(h.kpool.n);
    vt_download(g, d.kp, pool, h.kpool.n);
    if (memcmp(pool, h.kpool.bytes, h.kpool.n))
        fail_msg("%s %s: K pool differs from the host layout after kv_write", ac->name, type);
    vt_download(g, d.vp, pool, h.vpool.n);
    if (memcmp(pool, h.vpool.bytes, h.vpool.n))
        fail_msg("%s %s: V pool differs from the host layout after kv_write", ac->name, type);
    free(pool);
    float *out = malloc(o_n * sizeof *out), *out2 = malloc(o_n * sizeof *out2);
    vt_download(g, d.o, out, o_n * 4);
    vt_download(g, d.o2, out2, o_n * 4);
    if (memcmp(out, out2, o_n * 4))
        fail_msg("%s %s: splits merged by the last split differ from the reduce pass (NMSE %.3g)", ac->name, type,
                 vt_nmse(out, out2, o_n));
    merged_runs += plan.n_red > 0;
    if (captured)
        memcpy(captured, out, (o_n < captured_n ? o_n : captured_n) * 4);
    vt_download(g, d.cnt, cnt, cb); /* every dispatch leaves its counters zero */
    for (size_t i = 0; i < cb / 4; i++)
        if (cnt[i])
            fail_msg("%s %s: merge counter %zu left at %u", ac->name, type, i, cnt[i]);
    double vs_f32 = check_output(&a, &h, out, ac, type);
    if (!plan.n_pre)
        check_fresh(g, &a, &st, &h, ac, merge, vkd_whole(d.scratch), sinks, type);
    free(out);
    free(out2);
    free(cnt);
    if (released)
        *released += h.n_released;
    vkd_buffer *all[] = {d.qkv, d.o, d.o2, d.kp, d.vp, d.pos, d.seq, d.info, d.pt, d.items, d.scratch, d.cnt, d.sinks};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        vkd_buffer_destroy(g->dev, all[i]);
    free(items);
    free_step(&h, ac->n_seqs);
    return vs_f32;
}

/* Runs every case with F32 and F16 pools, and Q8_0 ones where the head dim allows (with_q8).
 * Returns the page-table entries released by the windows. */
static uint32_t run_cases_q8(void **state, const char *suite, const acase *cases, size_t n, bool with_q8)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded(suite);
    uint32_t released = 0;
    double worst_q8 = 0;
    for (size_t i = 0; i < n; i++) {
        run_case(g, &r, &cases[i], VKI_GGML_F32, &released);
        run_case(g, &r, &cases[i], VKI_GGML_F16, NULL);
        if (with_q8 && cases[i].hd % 32 == 0) {
            double e = run_case(g, &r, &cases[i], VKI_GGML_Q8_0, NULL);
            if (e > Q8_VS_F32_TOL)
                fail_msg("%s q8_0: NMSE %.3g against f32 K/V above %.0e", cases[i].name, e, Q8_VS_F32_TOL);
            worst_q8 = e > worst_q8 ? e : worst_q8;
        }
    }
    if (with_q8)
        fprintf(stderr, "  %s: q8_0 KV against f32 K/V: worst NMSE %.2e (tolerance %.0e)\n", suite, worst_q8,
                Q8_VS_F32_TOL);
    vt_assert_clean(g);
    return released;
}

static void run_cases(void **state, const char *suite, const acase *cases, size_t n)
{
    run_cases_q8(state, suite, cases, n, false);
}

/* The real test model's shape (stories260K: head dim 8, 8 heads, 4 KV heads) and small ones. */
static void test_attn_small_heads(void **state)
{
    const acase cases[] = {
        {"stories ragged", 8, 4, 8, 16, 6, {0, 50, 0, 16, 99, 332}, {37, 20, 1, 1, 1, 1}, 0, 2.0f, 0, 0, 0, 0, 0, 0, 0},
        {"one token, pos 0", 8, 4, 8, 16, 1, {0}, {1}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"prompt of 1..3 tokens", 8, 4, 8, 5, 3, {0, 0, 4}, {2, 3, 1}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=48 head blocks, splits", 48, 1, 8, 16, 3, {300, 0, 40}, {1, 21, 9}, 48, 3.0f, 0, 0, 0, 0, 0, 0, 0},
    };
    run_cases(state, "attn small heads", cases, sizeof cases / sizeof cases[0]);
}

/* GQA ratios 1, 2, 4, 8 (MQA) at head dims 64 and 128, odd page sizes, peaky softmax. */
static void test_attn_gqa(void **state)
{
    const acase cases[] = {
        {"G=1 hd64", 4, 4, 64, 16, 4, {0, 70, 5, 200}, {33, 1, 1, 17}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=2 hd128", 4, 2, 128, 16, 4, {130, 0, 17, 3}, {1, 19, 1, 1}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=4 hd64 page 7", 8, 2, 64, 7, 4, {0, 45, 100, 8}, {40, 1, 1, 9}, 40, 4.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=8 MQA hd128 page 32", 8, 1, 128, 32, 3, {64, 0, 250}, {1, 24, 1}, 0, 2.0f, 0.05f, 0, 0, 0, 0, 0, 0},
    };
    run_cases(state, "attn gqa", cases, sizeof cases / sizeof cases[0]);
}

/* Contexts past 2048: a long decode (automatic splits), a chunk after a long prefix, and a
 * whole 2048-token prompt; few heads to keep lavapipe quick. */
static void test_attn_long(void **state)
{
    const acase cases[] = {
        {"long ragged", 2, 1, 64, 16, 3, {2499, 2100, 0}, {1, 64, 1}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"2048 prompt + decode", 2, 1, 64, 16, 2, {0, 3000}, {2048, 1}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
    };
    uint32_t merged = merged_runs;
    run_cases(state, "attn long", cases, sizeof cases / sizeof cases[0]);
    assert_true(merged_runs > merged); /* long contexts split: the last split merged them */
}

/* Decode attention's keys per key group loaded together (attn_decode's KU: 2 on GPUs, 1 on CPU
 * devices) change no bit: ragged contexts whose key loops end inside a step of KU (invalid keys
 * and steps past the trip count), GQA head blocks, a window with a sink, splits merged by the last
 * one, the newest key from the projection (run_case's fresh check), F16, F32 and Q8_0 pools; KU =
 * 2 against 1, the same steps (each also against the reference). */
static void test_decode_loads(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    const acase cases[] = {
        {"ragged G=4 hd64", 8, 2, 64, 16, 4, {0, 45, 100, 8}, {1, 1, 1, 1}, 0, 4.0f, 0, 0, 0, 0, 0, 0, 0},
        {"splits of 48, window 33 sink 16", 4, 1, 64, 16, 3, {300, 77, 2}, {1, 1, 1}, 48, 2.0f, 0, 33, 16, 0, 0, 0, 0},
        {"G=48 head blocks", 48, 1, 8, 16, 2, {130, 5}, {1, 1}, 0, 3.0f, 0, 0, 0, 0, 0, 0, 0},
    };
    const uint32_t types[] = {VKI_GGML_F16, VKI_GGML_F32, VKI_GGML_Q8_0};
    enum { MAX_OUT = 1 << 16 };
    float *ref = malloc(MAX_OUT * 4), *got = malloc(MAX_OUT * 4);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            if (types[t] == VKI_GGML_Q8_0 && cases[i].hd % 32)
                continue;
            vt_rng r0 = vt_rng_seeded("attn decode loads");
            const uint32_t ku[] = {1, 2}; /* (each KU is a pipeline per type and head dim) */
            for (size_t k = 0; k < sizeof ku / sizeof ku[0]; k++) {
                vt_rng r = r0; /* the same step for every KU */
                g->dev->attn_loads = ku[k];
                captured = k ? got : ref, captured_n = MAX_OUT;
                for (size_t j = 0; j < MAX_OUT; j++)
                    captured[j] = NAN;
                run_case(g, &r, &cases[i], types[t], NULL);
                captured = NULL;
                if (k && memcmp(got, ref, MAX_OUT * 4))
                    fail_msg("%s %s: %u keys loaded together differ from 1", cases[i].name, kv_name(types[t]), ku[k]);
            }
        }
    }
    g->dev->attn_loads = 0;
    free(ref);
    free(got);
    vt_assert_clean(g);
}

/* Sliding windows across page boundaries: decode and prefill rows see only their last `window`
 * keys (and the sink's); pages wholly outside the first new token's window point at a NaN page
 * (what the scheduler releases), so reading one fails the case. Windows of 1, 7, a page, 33 on
 * odd pages, larger than the context; with and without sink; long contexts; F32, F16 and Q8_0. */
static void test_attn_window(void **state)
{
    const acase cases[] = {
        {"window 7 ragged", 4, 2, 64, 16, 5, {0, 50, 90, 16, 200}, {37, 20, 1, 1, 1}, 0, 2.0f, 0, 7, 0, 0, 0, 0, 0},
        {"window = page, sink", 4, 2, 64, 16, 3, {100, 40, 0}, {1, 30, 20}, 0, 2.0f, 0, 16, 16, 0, 0, 0, 0},
        {"window 33 page 7 sink 7 splits", 4, 1, 64, 7, 2, {150, 60}, {1, 45}, 16, 2.0f, 0, 33, 7, 0, 0, 0, 0},
        {"window 1", 2, 2, 32, 16, 2, {30, 5}, {1, 10}, 0, 1.0f, 0, 1, 0, 0, 0, 0, 0},
        {"window past the context", 2, 1, 64, 16, 1, {100}, {1}, 0, 1.0f, 0, 500, 0, 0, 0, 0, 0},
        {"MQA hd128 page 32 sink", 8, 1, 128, 32, 3, {300, 0, 250}, {1, 70, 33}, 0, 2.0f, 0, 100, 32, 0, 0, 0, 0},
        {"long decode window 256", 2, 1, 64, 16, 2, {3000, 2500}, {1, 40}, 0, 1.0f, 0, 256, 16, 0, 0, 0, 0},
        {"sink reaching the window", 4, 2, 64, 16, 3, {29, 21, 100}, {1, 10, 1}, 8, 2.0f, 0, 20, 16, 0, 0, 0, 0},
    };
    uint32_t released = run_cases_q8(state, "attn window", cases, sizeof cases / sizeof cases[0], true);
    assert_true(released > 100); /* the cases do exercise released pages */
}

/* Gemma 2's attention logit soft-cap (50 tanh(s / 50)) on scores well past the cap, head dim
 * 256, GQA 2, global and windowed (its local layers). */
static void test_attn_softcap(void **state)
{
    const acase cases[] = {
        {"gemma2 cap 50", 8, 4, 256, 16, 3, {0, 40, 70}, {30, 1, 1}, 0, 150.0f, 0.0625f, 0, 0, 50.0f, 0, 0, 0},
        {"gemma2 cap 50 window 20", 8, 4, 256, 16, 3, {0, 60, 90}, {45, 1, 1}, 0, 150.0f, 0.0625f, 20, 0, 50.0f, 0, 0, 0},
    };
    run_cases(state, "attn softcap", cases, sizeof cases / sizeof cases[0]);
}

/* Q8_0 pools on the GQA shapes of test_attn_gqa and gemma's head dim 256: kv_write quantises
 * bit for bit as ggml's reference does, and the kernels match the reference over the same
 * quantised K/V to ATTN_TOL; against unquantised f32 K/V the output is within Q8_VS_F32_TOL. */
static void test_attn_q8(void **state)
{
    const acase cases[] = {
        {"G=1 hd64", 4, 4, 64, 16, 4, {0, 70, 5, 200}, {33, 1, 1, 17}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=2 hd128", 4, 2, 128, 16, 4, {130, 0, 17, 3}, {1, 19, 1, 1}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=4 hd32 page 7", 8, 2, 32, 7, 4, {0, 45, 100, 8}, {40, 1, 1, 9}, 40, 4.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=2 hd256", 4, 2, 256, 16, 2, {90, 0}, {1, 25}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
    };
    run_cases_q8(state, "attn q8_0", cases, sizeof cases / sizeof cases[0], true);
}

/* gpt-oss's sink logits (one per query head, in each softmax's denominator, no value): decode
 * split and merged (by the last split and by the reduce pass), prefill blocks, GQA, its sliding
 * window of 128 on its half of the layers, head dim 64, the newest keys from the projections;
 * F32, F16 and Q8_0 pools. One head's sink sits far above every score, so its output is nearly
 * zero (no overflow: attn_finish rescales to the larger of the two). A view too short for the
 * heads is refused. */
static void test_attn_sink_logits(void **state)
{
    const acase cases[] = {
        {"sinks ragged G=8 hd64", 16, 2, 64, 16, 4, {0, 70, 5, 300}, {33, 1, 1, 17}, 0, 2.0f, 0, 0, 0, 0, 3.0f, 0, 0},
        {"sinks splits", 8, 1, 64, 16, 3, {600, 0, 90}, {1, 1, 40}, 32, 1.0f, 0, 0, 0, 0, 2.0f, 0, 0},
        {"sinks window 128", 8, 2, 64, 16, 3, {400, 150, 0}, {1, 60, 130}, 48, 2.0f, 0, 128, 0, 0, 3.0f, 0, 0},
        {"sinks stories shape", 8, 4, 8, 16, 3, {0, 50, 9}, {20, 1, 1}, 0, 2.0f, 0, 0, 0, 0, 1.0f, 0, 0},
    };
    uint32_t runs = fresh_runs;
    run_cases_q8(state, "attn sink logits", cases, sizeof cases / sizeof cases[0], true);
    assert_int_equal(fresh_runs - runs, 0); /* every case has a prefill block: no fresh check */
    const acase dec[] = {
        {"sinks decode fresh", 8, 2, 64, 16, 3, {0, 70, 300}, {1, 1, 1}, 32, 2.0f, 0, 0, 0, 0, 3.0f, 0, 0},
    };
    run_cases_q8(state, "attn sink logits decode", dec, 1, true);
    assert_int_equal(fresh_runs - runs, 3);

    vt_gpu *g = vt_gpu_get(state);
    op_attn_shape sh = {.n_heads = 4, .n_kv_heads = 1, .head_dim = 32, .page_size = 16};
    op_attn a;
    assert_int_equal(op_attn_setup(g->dev, &sh, &a), VKI_OK);
    vki_seq_info info[1] = {{0, 1, 10, 0}};
    vki_attn_item items[32];
    op_attn_plan plan;
    assert_int_equal(op_attn_plan_build(&a, info, 1, items, 32, &plan), VKI_OK);
    vkd_buffer *b = vt_buf_nan(g, 1 << 16, "any");
    vkd_view w = vkd_whole(b), short_sinks = {b, 0, 3 * 4};
    op_attn_step st = {w, w, w, w, w, &plan};
    op_mat m = {w, 0, 128};
    vt_begin(g);
    assert_int_equal(op_attention(&g->cmd, &a, &st, m, m, w, w, w, NULL, NULL, &short_sinks), VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vt_assert_clean(g);
}

/* Decode steps with the newest keys read from the projections (check_fresh, run by run_case on
 * every step without prefill): the stories shape, GQA 1..8, head dims 8..256, split and merged
 * long contexts, windows with and without a sink, the soft-cap; F32, F16 and Q8_0 pools. A step
 * with a prefill block is refused. */
static void test_attn_fresh(void **state)
{
    const acase cases[] = {
        {"stories decode", 8, 4, 8, 16, 4, {0, 50, 16, 99}, {1, 1, 1, 1}, 0, 2.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=2 hd128 splits", 4, 2, 128, 16, 3, {130, 0, 17}, {1, 1, 1}, 32, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"G=8 MQA hd64 page 7", 8, 1, 64, 7, 2, {45, 300}, {1, 1}, 0, 3.0f, 0, 0, 0, 0, 0, 0, 0},
        {"long, automatic splits", 2, 1, 64, 16, 2, {2600, 700}, {1, 1}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"window 33 sink 7 splits", 4, 1, 64, 7, 2, {150, 20}, {1, 1}, 16, 2.0f, 0, 33, 7, 0, 0, 0, 0},
        {"window 1", 2, 2, 32, 16, 2, {30, 0}, {1, 1}, 0, 1.0f, 0, 1, 0, 0, 0, 0, 0},
        {"gemma2 cap 50 hd256", 8, 4, 256, 16, 2, {40, 90}, {1, 1}, 0, 4.0f, 0.0625f, 0, 0, 50.0f, 0, 0, 0},
    };
    uint32_t runs = fresh_runs, xruns = xq_runs;
    run_cases_q8(state, "attn fresh", cases, sizeof cases / sizeof cases[0], true);
    assert_int_equal(fresh_runs - runs, 20); /* 7 cases x F32, F16 + 6 with Q8_0 head dims */
    assert_int_equal(xq_runs - xruns, 54); /* the 6 of head dims of 32s x 3 pools x 3 rotations */

    /* refused: a step with a prefill block (its keys are not in the pools before kv_write) */
    vt_gpu *g = vt_gpu_get(state);
    op_attn_shape sh = {.n_heads = 2, .n_kv_heads = 1, .head_dim = 32, .page_size = 16};
    op_attn a;
    assert_int_equal(op_attn_setup(g->dev, &sh, &a), VKI_OK);
    vki_seq_info info[2] = {{0, 1, 10, 0}, {1, 3, 3, 1}};
    vki_attn_item items[32];
    op_attn_plan plan;
    assert_int_equal(op_attn_plan_build(&a, info, 2, items, 32, &plan), VKI_OK);
    vkd_buffer *b = vt_buf_nan(g, 1 << 16, "any");
    vkd_view w = vkd_whole(b);
    op_attn_step st = {w, w, w, w, w, &plan};
    op_mat m = {w, 0, 64};
    op_attn_fresh fresh = {m, m, NULL, {0}};
    vt_begin(g);
    assert_int_equal(op_attention(&g->cmd, &a, &st, m, m, w, w, w, NULL, &fresh, NULL), VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vt_assert_clean(g);
}

/* Prefill on cooperative matrices: the emulated path (every device with shaderFloat16 and
 * subgroup shuffles) and, where present, the real NV one, on the same ragged steps: several
 * prefilling sequences of different lengths next to decoding ones, shuffled pages, GQA 1..8,
 * head dims 8 (padded to 16), 64, 128, blocks and key tiles with ragged ends; F32, F16 and (head
 * dims of 32s) Q8_0 pools; sliding windows with sinks and gemma 2's soft-cap. smem != 0 presents
 * the device as a GPU with that much shared memory, which selects the GPU tile shapes (several
 * softmax lanes per row, several subgroups per block). */
static void run_cm_cases(void **state, const char *suite, const acase *cases, size_t n, uint32_t smem, double tol)
{
    vt_gpu *g = vt_gpu_get(state);
    vki_device_info saved = g->dev->info;
    vkd_cm saved_cm = g->dev->cm;
    vt_rng r = vt_rng_seeded(suite);
    attn_tol = tol, expect_cm = true, worst_nmse = 0;
    for (int real = 0; real < 2; real++) {
        if (real && !g->dev->nv_coopmat) {
            fprintf(stderr, "  %s: no VK_NV_cooperative_matrix on this device: only the emulated path ran\n", suite);
            continue;
        }
        if (vkd_coopmat_select(g->dev, real ? VKI_COOPMAT_AUTO : VKI_COOPMAT_EMULATED) != VKI_OK) {
            attn_tol = ATTN_TOL, expect_cm = false; /* no shaderFloat16 or shuffles: said in the log */
            skip();
        }
        if (smem) {
            g->dev->info.type = VKI_DEVICE_DISCRETE;
            g->dev->info.max_compute_shared_memory = smem;
        }
        for (size_t i = 0; i < n; i++) {
            run_case(g, &r, &cases[i], VKI_GGML_F32, NULL);
            run_case(g, &r, &cases[i], VKI_GGML_F16, NULL);
            if (cases[i].hd % 32 == 0)
                run_case(g, &r, &cases[i], VKI_GGML_Q8_0, NULL);
        }
        g->dev->info = saved;
    }
    fprintf(stderr, "  %s: worst NMSE %.2e (bound %.0e)\n", suite, worst_nmse, tol);
    attn_tol = ATTN_TOL, expect_cm = false;
    g->dev->cm = saved_cm;
    vt_assert_clean(g);
}

static void test_attn_coopmat(void **state)
{
    const acase cases[] = {
        {"cm stories ragged", 8, 4, 8, 16, 5, {0, 50, 0, 99, 7}, {37, 20, 1, 1, 70}, 0, 2.0f, 0, 0, 0, 0, 0, 0, 0},
        {"cm G=1 hd64", 4, 4, 64, 16, 3, {0, 70, 5}, {33, 1, 17}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
        {"cm G=4 hd64 page 7", 8, 2, 64, 7, 3, {0, 45, 100}, {40, 1, 9}, 0, 4.0f, 0, 0, 0, 0, 0, 0, 0},
        {"cm G=8 MQA hd128 page 32", 8, 1, 128, 32, 2, {64, 0}, {1, 24}, 0, 2.0f, 0.05f, 0, 0, 0, 0, 0, 0},
        {"cm G=2 hd128 long prefix", 4, 2, 128, 16, 2, {300, 0}, {19, 2}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
    };
    run_cm_cases(state, "attn coopmat", cases, sizeof cases / sizeof cases[0], 0, ATTN_CM_TOL);
}

/* Mistral 3's attention temperature: each query scaled by 1 + beta ln(floor(pos / L) + 1), so
 * with L = 8 the scale steps every 8 positions (1 below 8): prefill rows across many steps,
 * decode at far positions, a window, on the scalar kernels and the cooperative-matrix prefill. */
static void test_attn_temperature(void **state)
{
    const acase cases[] = {
        {.name = "temp 0.1 len 8 ragged", .n_heads = 8, .n_kv = 2, .hd = 64, .page = 16, .n_seqs = 3,
         .pos0 = {0, 40, 300}, .n_new = {45, 1, 1}, .q_amp = 2.0f, .temp_scale = 0.1f, .temp_len = 8},
        {.name = "temp 0.5 len 3 window 20", .n_heads = 4, .n_kv = 4, .hd = 128, .page = 16, .n_seqs = 2,
         .pos0 = {0, 90}, .n_new = {37, 1}, .q_amp = 1.0f, .window = 20, .temp_scale = 0.5f, .temp_len = 3},
    };
    run_cases(state, "attn temperature", cases, sizeof cases / sizeof cases[0]);
    run_cm_cases(state, "attn temperature coopmat", cases, sizeof cases / sizeof cases[0], 0, ATTN_CM_TOL);
}

/* The GPU tile shapes through the emulation: 32 rows x 64 keys with 4 softmax lanes per row
 * (hd 64 at 30 KiB), 16 x 32 with 8 lanes (hd 128 at 23 KiB). */
static void test_attn_coopmat_gpu_tiles(void **state)
{
    const acase hd64[] = {{"cm gpu tiles hd64", 8, 2, 64, 16, 3, {0, 130, 9}, {70, 1, 40}, 0, 2.0f, 0, 0, 0, 0, 0, 0, 0}};
    const acase hd128[] = {{"cm gpu tiles hd128", 4, 1, 128, 16, 2, {0, 77}, {45, 30}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0}};
    run_cm_cases(state, "attn coopmat gpu tiles hd64", hd64, 1, 30 * 1024, ATTN_CM_TOL);
    run_cm_cases(state, "attn coopmat gpu tiles hd128", hd128, 1, 23 * 1024, ATTN_CM_TOL);
}

/* Windows, sinks and the soft-cap on the cooperative-matrix prefill: released pages point at a
 * NaN page as in test_attn_window, so a tile read outside the window fails. */
static void test_attn_coopmat_windows(void **state)
{
    const acase cases[] = {
        {"cm window 7 ragged", 4, 2, 64, 16, 3, {0, 50, 90}, {37, 20, 1}, 0, 2.0f, 0, 7, 0, 0, 0, 0, 0},
        {"cm window 33 sink 16", 4, 1, 64, 16, 2, {150, 60}, {40, 45}, 0, 2.0f, 0, 33, 16, 0, 0, 0, 0},
        {"cm sink logits window 128", 8, 2, 64, 16, 3, {0, 200, 9}, {140, 1, 40}, 0, 2.0f, 0, 128, 0, 0, 3.0f, 0, 0},
        {"cm cap 50 window 20", 8, 4, 128, 16, 2, {0, 60}, {45, 30}, 0, 60.0f, 0.0884f, 20, 0, 50.0f, 0, 0, 0},
    };
    run_cm_cases(state, "attn coopmat windows", cases, sizeof cases / sizeof cases[0], 0, ATTN_CM_WINDOW_TOL);
}

/* The choices ops_attn.c makes for NVIDIA, on this device where it can run them: the device is
 * presented as a discrete NVIDIA GPU with 32-lane subgroups (decode splits then aim at 2048
 * workgroups of >= 128 keys, so long contexts take the split + reduce path with GPU split
 * lengths) keeping its real smallest subgroup (the reach of the shuffles), and the decode kernel
 * gets the lanes per key that give NVIDIA's keys per subgroup (nvidia_lanes_here). Not runnable
 * on a 32 KiB device: prefill's 32-row tile at head dim 128 (38 KiB of shared memory on NVIDIA);
 * the same tile runs here at head dim 64. */
static void test_gpu_configs(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vki_device_info saved = g->dev->info;
    g->dev->info.type = VKI_DEVICE_DISCRETE;
    g->dev->info.vendor_id = 0x10DE;
    g->dev->info.subgroup_size = 32;
    if (!g->dev->info.subgroup_min_size || g->dev->info.subgroup_min_size > saved.subgroup_size)
        g->dev->info.subgroup_min_size = saved.subgroup_size;
    op_attn a;
    op_attn_shape s = {.n_heads = 8, .n_kv_heads = 2, .head_dim = 128, .page_size = 16, .kv_type = VKI_GGML_F16};
    assert_int_equal(op_attn_setup(g->dev, &s, &a), VKI_OK);
    assert_int_equal(a.target_groups, 2048); /* the GPU plan, not the CPU one */
    assert_int_equal(a.min_split, 128);
    /* head dim 128 (the 8B shape) and the F16 pool NVIDIA runs: one new decode pipeline, which
     * lavapipe compiles for seconds on a cold shader cache */
    const acase cases[] = {
        {"gpu hd128 G=4 ragged", 8, 2, 128, 16, 4, {1000, 0, 300, 131}, {1, 40, 1, 1}, 0, 2.0f, 0, 0, 0, 0, 0, 0, 0},
        {"gpu hd128 MQA page 32", 4, 1, 128, 32, 2, {2100, 64}, {1, 17}, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0},
    };
    vt_rng r = vt_rng_seeded("attn gpu configs");
    nvidia_lanes = true;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(g, &r, &cases[i], VKI_GGML_F16, NULL);
    /* kernel_config's attn_split: 32-key splits at least (the 1000-key context in 32 splits,
     * merged by the last one) */
    assert_int_equal(op_kernel_config(g->dev, "attn_split=32", false), VKI_OK);
    assert_int_equal(op_attn_setup(g->dev, &s, &a), VKI_OK);
    assert_int_equal(a.min_split, 32);
    run_case(g, &r, &cases[0], VKI_GGML_F16, NULL);
    g->dev->attn_split = 0;
    nvidia_lanes = false;
    g->dev->info = saved;
    vt_assert_clean(g);
}

/* kv_write's F16 rounding on the awkward values: ties, subnormals, overflow, signed zero. */
static void test_kv_write_f16_rounding(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    op_attn_shape s = {.n_heads = 1, .n_kv_heads = 1, .head_dim = 64, .page_size = 4, .kv_type = VKI_GGML_F16};
    op_attn a;
    assert_int_equal(op_attn_setup(g->dev, &s, &a), VKI_OK);
    float x[2][64];
    vt_rng r = vt_rng_seeded("kv_write f16");
    for (int i = 0; i < 64; i++) {
        float tie = ldexpf(1.0f + ldexpf((float)(2 * i + 1), -11), (i % 30) - 15); /* halfway between halves */
        float sub = ldexpf((float)i + 0.5f, -24);                                 /* subnormal ties */
        x[0][i] = i % 2 ? -tie : tie;
        x[1][i] = i < 32 ? sub : (float[]){65504.0f, 65519.0f, 65520.0f, 1e9f, -0.0f, 5.9e-8f, 2.98e-8f,
                                           vt_uniform(&r, -2, 2)}[i % 8];
    }
    vki_seq_info info = {0, 2, 2, 0};
    uint32_t pos[2] = {0, 1}, seq[2] = {0, 0}, pt[1] = {0};
    vki_attn_item items[8];
    op_attn_plan plan;
    assert_int_equal(op_attn_plan_build(&a, &info, 1, items, 8, &plan), VKI_OK);
    vkd_buffer *bx = vt_buf_from(g, x, sizeof x, "x"), *kp = vt_buf_nan(g, op_kv_page_bytes(&s), "K");
    vkd_buffer *vp = vt_buf_nan(g, op_kv_page_bytes(&s), "V"), *bpos = vt_buf_from(g, pos, 8, "pos");
    vkd_buffer *bseq = vt_buf_from(g, seq, 8, "seq"), *binfo = vt_buf_from(g, &info, sizeof info, "info");
    vkd_buffer *bpt = vt_buf_from(g, pt, 4, "pt"), *bit = vt_buf_from(g, items, plan.n_items * sizeof items[0], "items");
    op_attn_step st = {vkd_whole(bpos), vkd_whole(bseq), vkd_whole(binfo), vkd_whole(bpt), vkd_whole(bit), &plan};
    op_mat m = {vkd_whole(bx), 0, 64};
    vt_begin(g);
    assert_int_equal(op_kv_write(&g->cmd, &a, &st, m, m, vkd_whole(kp), vkd_whole(vp), NULL), VKI_OK);
    vt_submit_wait(g);
    uint16_t got[4][64];
    vt_download(g, kp, got, sizeof got);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 64; i++)
            if (got[t][i] != quant_f32_to_f16(x[t][i]))
                fail_msg("f16 of %.9g (row %d dim %d): got 0x%04x, want 0x%04x", x[t][i], t, i, got[t][i],
                         quant_f32_to_f16(x[t][i]));
    uint32_t fill;
    memcpy(&fill, &got[2][0], 4);
    assert_int_equal(fill, 0x7fc00000u); /* slots 2, 3 untouched */
    vkd_buffer *all[] = {bx, kp, vp, bpos, bseq, binfo, bpt, bit};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        vkd_buffer_destroy(g->dev, all[i]);
    vt_assert_clean(g);
}

/* kv_write rotating K itself (the decode step's fold of RoPE into the cache write) writes the
 * pools op_rope followed by an unrotated kv_write writes, byte for byte: every pool type, both
 * pairings, a partial rotation (dims >= n_rot pass through), positions up to 2^16 on scattered
 * pages. */
static void test_kv_write_rope(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    static const struct { uint32_t hd, n_rot; bool neox; } rc[] = {{64, 64, false}, {64, 64, true}, {96, 32, true},
                                                                   {128, 48, false}, {32, 2, true}};
    static const uint32_t types[] = {VKI_GGML_F32, VKI_GGML_F16, VKI_GGML_Q8_0};
    enum { T = 6, KVH = 2, PAGE = 16, PT = 4096 };
    vt_rng r = vt_rng_seeded("kv_write rope");
    for (size_t ci = 0; ci < sizeof rc / sizeof rc[0]; ci++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            uint32_t hd = rc[ci].hd, row = KVH * hd;
            if (types[ti] == VKI_GGML_Q8_0 && hd % 32)
                continue;
            op_attn_shape s = {.n_heads = 2 * KVH, .n_kv_heads = KVH, .head_dim = hd, .page_size = PAGE,
                               .kv_type = types[ti]};
            op_attn a;
            assert_int_equal(op_attn_setup(g->dev, &s, &a), VKI_OK);
            /* token t at position ~t * 12000: its own page (page t of the pool) */
            uint32_t pos[T], seq[T] = {0}, *pt = calloc(PT, 4);
            for (uint32_t t = 0; t < T; t++) {
                pos[t] = t * 12000 + (uint32_t)vt_uniform(&r, 0, PAGE);
                pt[pos[t] / PAGE] = t;
            }
            vki_seq_info info = {0, T, PT * PAGE, 0};
            vki_attn_item items[16];
            op_attn_plan plan;
            assert_int_equal(op_attn_plan_build(&a, &info, 1, items, 16, &plan), VKI_OK);
            float *k = malloc((size_t)T * row * 4 * 2), *fr = malloc(2 * rc[ci].n_rot * 4);
            for (uint32_t i = 0; i < T * row * 2; i++) /* k rows then v rows */
                k[i] = vt_uniform(&r, -3, 3);
            op_rope_freqs(500000.0, 1.0, NULL, NULL, 1.0f, rc[ci].n_rot, fr);
            size_t pool = T * op_kv_page_bytes(&s);
            vkd_buffer *bk = vt_buf_from(g, k, (size_t)T * row * 8, "k, v"), *bk2 = vt_buf_from(g, k, (size_t)T * row * 8, "k, v copy");
            vkd_buffer *bfr = vt_buf_from(g, fr, 2 * rc[ci].n_rot * 4, "freqs");
            vkd_buffer *kp[2] = {vt_buf_nan(g, pool, "K a"), vt_buf_nan(g, pool, "K b")};
            vkd_buffer *vp[2] = {vt_buf_nan(g, pool, "V a"), vt_buf_nan(g, pool, "V b")};
            vkd_buffer *bpos = vt_buf_from(g, pos, sizeof pos, "pos"), *bseq = vt_buf_from(g, seq, sizeof seq, "seq");
            vkd_buffer *binfo = vt_buf_from(g, &info, sizeof info, "info"), *bpt = vt_buf_from(g, pt, PT * 4, "pt");
            vkd_buffer *bit = vt_buf_from(g, items, plan.n_items * sizeof items[0], "items");
            op_attn_step st = {vkd_whole(bpos), vkd_whole(bseq), vkd_whole(binfo), vkd_whole(bpt), vkd_whole(bit), &plan};
            op_kv_rope kr = {.n_rot = rc[ci].n_rot, .neox = rc[ci].neox, .freqs = vkd_whole(bfr)};
            op_rope_p rp = {.n_tokens = T, .n_heads = KVH, .head_dim = hd, .n_rot = rc[ci].n_rot, .neox = rc[ci].neox};
            op_mat k1 = {vkd_whole(bk), 0, row}, v1 = {vkd_whole(bk), T * row, row};
            op_mat k2 = {vkd_whole(bk2), 0, row}, v2 = {vkd_whole(bk2), T * row, row};
            vt_begin(g);
            assert_int_equal(op_kv_write(&g->cmd, &a, &st, k1, v1, vkd_whole(kp[0]), vkd_whole(vp[0]), &kr), VKI_OK);
            assert_int_equal(op_rope(&g->cmd, &rp, k2, k2, vkd_whole(bpos), vkd_whole(bfr)), VKI_OK);
            vkd_barrier(&g->cmd);
            assert_int_equal(op_kv_write(&g->cmd, &a, &st, k2, v2, vkd_whole(kp[1]), vkd_whole(vp[1]), NULL), VKI_OK);
            vt_submit_wait(g);
            uint8_t *got[2] = {malloc(pool), malloc(pool)};
            const char *what[2] = {"K", "V"};
            for (int kv = 0; kv < 2; kv++) {
                vkd_buffer **b = kv ? vp : kp;
                vt_download(g, b[0], got[0], pool);
                vt_download(g, b[1], got[1], pool);
                if (memcmp(got[0], got[1], pool))
                    fail_msg("hd %u n_rot %u %s, %s pool: %s written with RoPE differs from rope + kv_write", hd,
                             rc[ci].n_rot, rc[ci].neox ? "neox" : "normal", kv_name(types[ti]), what[kv]);
            }
            /* and RoPE did rotate: the K pool differs from an unrotated write */
            vt_begin(g);
            assert_int_equal(op_kv_write(&g->cmd, &a, &st, k1, v1, vkd_whole(kp[1]), vkd_whole(vp[1]), NULL), VKI_OK);
            vt_submit_wait(g);
            vt_download(g, kp[0], got[0], pool);
            vt_download(g, kp[1], got[1], pool);
            assert_true(memcmp(got[0], got[1], pool) != 0);
            /* a rotation the head cannot hold, or an odd one, is refused */
            op_kv_rope wide = kr, odd = kr;
            wide.n_rot = hd + 2, odd.n_rot = 3;
            vt_begin(g);
            assert_int_equal(op_kv_write(&g->cmd, &a, &st, k1, v1, vkd_whole(kp[0]), vkd_whole(vp[0]), &wide),
                             VKI_ERR_INVALID_ARG);
            assert_int_equal(op_kv_write(&g->cmd, &a, &st, k1, v1, vkd_whole(kp[0]), vkd_whole(vp[0]), &odd),
                             VKI_ERR_INVALID_ARG);
            vt_submit_wait(g);
            vkd_buffer *all[] = {bk, bk2, bfr, kp[0], kp[1], vp[0], vp[1], bpos, bseq, binfo, bpt, bit};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                vkd_buffer_destroy(g->dev, all[i]);
            free(got[0]), free(got[1]), free(k), free(fr), free(pt);
        }
    vt_assert_clean(g);
}

/* The work list: decode splits cover [0, n_ctx) once with consecutive slots, prefill blocks
 * cover the new tokens, offsets follow the shape and not the contexts, a small cap grows the
 * splits, bad sequences are refused. Host only. */
static void test_plan(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    op_attn_shape s = {.n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .page_size = 16};
    op_attn a;
    assert_int_equal(op_attn_setup(g->dev, &s, &a), VKI_OK);
    vki_seq_info seqs[4] = {{0, 1, 1000, 0}, {1, 50, 80, 0}, {51, 1, 3, 0}, {52, 1, 5000, 0}};
    uint32_t cap = op_attn_max_items(&a, 4, 53);
    vki_attn_item *it = malloc(cap * sizeof *it);
    op_attn_plan p;
    assert_int_equal(op_attn_plan_build(&a, seqs, 4, it, cap, &p), VKI_OK);
    /* item 0: the decode dispatch's group counts; then prefill, reduce, decode */
    assert_int_equal(p.n_items, 1 + p.n_pre + 4 + p.n_dec);
    assert_int_equal(it[0].seq, p.n_dec);
    assert_int_equal(it[0].a, s.n_kv_heads * a.dec_nhb);
    assert_int_equal(it[0].b, 1);
    assert_int_equal(p.n_pre, (50 + a.pre_nq - 1) / a.pre_nq);
    assert_int_equal(p.red_off, 1 + p.n_pre);
    assert_int_equal(p.dec_off, p.red_off + 4);
    assert_int_equal(p.n_red, 4); /* an entry per sequence, in order, as one of them splits */
    uint32_t covered[4] = {0}, slots = 0, splits[4] = {0};
    for (uint32_t i = p.dec_off; i < p.n_items; i++) {
        assert_int_equal(it[i].a, covered[it[i].seq]);
        covered[it[i].seq] = it[i].b;
        splits[it[i].seq]++;
        if (it[i].c != VKI_ATTN_FINAL)
            assert_int_equal(it[i].c, slots++);
    }
    assert_int_equal(covered[0], 1000);
    assert_int_equal(covered[2], 3);
    assert_int_equal(covered[3], 5000);
    assert_int_equal(slots, p.n_slots);
    for (uint32_t i = 0; i < 4; i++) { /* seq 2 is one split, seq 1 prefills: they merge nothing */
        assert_int_equal(it[p.red_off + i].seq, i);
        assert_int_equal(it[p.red_off + i].b, splits[i]);
    }
    for (uint32_t i = p.dec_off, prev = 0; i < p.n_items; i++) { /* a split finds its entry's slots */
        const vki_attn_item *re = &it[p.red_off + it[i].seq];
        if (it[i].c != VKI_ATTN_FINAL)
            assert_true(it[i].c >= re->a && it[i].c < re->a + re->b && it[i].c >= prev);
        prev = it[i].c != VKI_ATTN_FINAL ? it[i].c : prev;
    }
    assert_true(splits[0] > 1 && splits[2] == 1 && splits[3] > 1);
    uint32_t q = 0;
    for (uint32_t i = 1; i < p.red_off; i++) {
        assert_int_equal(it[i].seq, 1);
        assert_int_equal(it[i].a, q);
        q += it[i].b;
    }
    assert_int_equal(q, 50);
    /* other contexts, the same shape: only the decode split count (item 0) moves */
    vki_seq_info longer[4] = {{0, 1, 1700, 0}, {1, 50, 90, 0}, {51, 1, 33, 0}, {52, 1, 6000, 0}};
    op_attn_plan pl;
    assert_int_equal(op_attn_plan_build(&a, longer, 4, it, cap, &pl), VKI_OK);
    assert_int_equal(pl.n_pre, p.n_pre);
    assert_int_equal(pl.n_red, p.n_red);
    assert_int_equal(pl.red_off, p.red_off);
    assert_int_equal(pl.dec_off, p.dec_off);
    assert_int_equal(it[0].seq, pl.n_dec);
    /* no split at all: no reduce */
    vki_seq_info short1[1] = {{0, 1, 20, 0}};
    assert_int_equal(op_attn_plan_build(&a, short1, 1, it, cap, &pl), VKI_OK);
    assert_int_equal(pl.n_dec, 1);
    assert_int_equal(pl.n_red, 0);
    assert_int_equal(it[pl.dec_off].c, VKI_ATTN_FINAL);
    assert_int_equal(op_attn_plan_build(&a, seqs, 4, it, cap, &p), VKI_OK);
    op_attn_plan p2;
    assert_int_equal(op_attn_plan_build(&a, seqs, 4, it, p.n_items - 5, &p2), VKI_OK); /* fewer, longer splits */
    assert_true(p2.n_items <= p.n_items - 5 && p2.split > p.split);
    assert_int_equal(op_attn_plan_build(&a, seqs, 4, it, 3, &p2), VKI_ERR_INVALID_ARG);
    uint64_t pages = op_kv_max_pages(g->dev, &s); /* one pool stays one binding */
    assert_true(pages > 0 && pages * op_kv_page_bytes(&s) <= g->dev->info.max_storage_buffer_range);
    assert_true((pages + 1) * op_kv_page_bytes(&s) > g->dev->info.max_storage_buffer_range ||
                (pages + 1) * op_kv_page_bytes(&s) > g->dev->info.max_memory_allocation_size);
    assert_int_equal(op_kv_page_bytes(&s), 4 * 64 * 2 * 16); /* kv_type 0 is VKI_GGML_F32 */
    /* a window plans decode splits over the visible keys only: the sink [0, 16), the last 100 */
    op_attn aw;
    op_attn_shape sw = s;
    sw.window = 100, sw.sink = 16;
    assert_int_equal(op_attn_setup(g->dev, &sw, &aw), VKI_OK);
    aw.split_keys = 32;
    vki_seq_info one = {0, 1, 1000, 0};
    assert_int_equal(op_attn_plan_build(&aw, &one, 1, it, cap, &p2), VKI_OK);
    assert_int_equal(p2.n_dec, 1 + 4); /* [0,16) + [900,932) [932,964) [964,996) [996,1000) */
    uint32_t keys = 0;
    for (uint32_t i = p2.dec_off; i < p2.n_items; i++) {
        assert_true(it[i].b <= 16 || it[i].a >= 900);
        keys += it[i].b - it[i].a;
    }
    assert_int_equal(keys, 116);
    vki_seq_info bad[1] = {{0, 5, 4, 0}};
    assert_int_equal(op_attn_plan_build(&a, bad, 1, it, cap, &p2), VKI_ERR_INVALID_ARG);
    free(it);
    vt_assert_clean(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_kv_write_f16_rounding),
        cmocka_unit_test(test_kv_write_rope),
        cmocka_unit_test(test_attn_small_heads),
        cmocka_unit_test(test_attn_gqa),
        cmocka_unit_test(test_attn_long),
        cmocka_unit_test(test_attn_window),
        cmocka_unit_test(test_decode_loads),
        cmocka_unit_test(test_attn_softcap),
        cmocka_unit_test(test_attn_q8),
        cmocka_unit_test(test_attn_fresh),
        cmocka_unit_test(test_attn_sink_logits),
        cmocka_unit_test(test_attn_coopmat),
        cmocka_unit_test(test_attn_coopmat_gpu_tiles),
        cmocka_unit_test(test_attn_coopmat_windows),
        cmocka_unit_test(test_attn_temperature),
        cmocka_unit_test(test_gpu_configs),
    };
    if (getenv("VKI_TEST_FILTER")) /* one test while developing: VKI_TEST_FILTER=test_gpu_configs */
        cmocka_set_test_filter(getenv("VKI_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
    fprintf(stderr, "worst NMSE of the FP32 attention kernels: %.2e (tolerance %.0e)\n", worst_fp32, ATTN_TOL);
    return rc;
}
