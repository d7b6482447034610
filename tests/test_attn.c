/* Paged KV cache writes and attention (engine/ops_attn.h) against a scalar reference that
 * accumulates in double. Every case is a ragged step: sequences in random order, some decoding
 * (one new token after a cached context), some prefilling (a chunk after a cached prefix, or a
 * whole prompt); their pages are a random shuffle of a pool filled with NaN, so a read of a
 * wrong page or slot poisons the output. The cached prefix is written into the pool by the host
 * (from the documented layout), the new tokens by kv_write from a fused QKV buffer; afterwards
 * the pools must equal the host's copy byte for byte (F16: round to nearest even, bit-exact
 * with quant_f32_to_f16). The output is NaN-filled with padding between rows that must stay NaN.
 *
 * Tolerances (NMSE of each case's output against the reference): 1e-10 for F32 and F16 pools
 * alike, since the reference reads the same f16-rounded K/V the kernels read. Measured on
 * lavapipe: ~1e-14..1e-13. */
#include "support/vt.h"

#include "engine/ops_attn.h"
#include "engine/quant.h"

#define ATTN_TOL 1e-10
/* Prefill on cooperative matrices rounds Q (scaled), K, V and P to F16 (the reference does not,
 * except K/V of F16 pools); scores, softmax and sums stay F32. */
#define ATTN_CM_TOL 1e-6 /* measured on lavapipe (emulated): <= 1e-7 */
#define MAX_SEQS 8

/* Set by the cooperative-matrix tests: the tolerance, that op_attn_setup must have picked the
 * coopmat prefill kernel, and the worst NMSE seen. */
static double attn_tol = ATTN_TOL;
static bool expect_cm;
static double worst_nmse;

typedef struct acase {
    const char *name;
    uint32_t n_heads, n_kv, hd, page;
    uint32_t n_seqs;
    uint32_t pos0[MAX_SEQS], n_new[MAX_SEQS];
    uint32_t split_keys; /* 0: automatic decode splits */
    float q_amp;         /* query magnitude: larger gives peakier softmax */
    float scale;         /* 0: 1/sqrt(hd) */
} acase;

/* Host model of one pool: element (page, kvh, slot, d) as the device stores it. */
typedef struct hpool {
    uint8_t *bytes;
    size_t n;
    uint32_t esz; /* 2 (F16) or 4 */
} hpool;

static void hpool_put(hpool *p, const op_attn_shape *s, uint32_t page, uint32_t kvh, uint32_t slot, const float *row)
{
    size_t base = (((size_t)page * s->n_kv_heads + kvh) * s->page_size + slot) * s->head_dim;
    for (uint32_t d = 0; d < s->head_dim; d++) {
        if (p->esz == 2) {
            uint16_t h = quant_f32_to_f16(row[d]);
            memcpy(p->bytes + 2 * (base + d), &h, 2);
        } else {
            memcpy(p->bytes + 4 * (base + d), &row[d], 4);
        }
    }
}

static float kv_round(const op_attn_shape *s, float x)
{
    return s->kv_type == VKI_GGML_F16 ? quant_f16_to_f32(quant_f32_to_f16(x)) : x;
}

/* Everything one case allocates on the host. */
typedef struct hstep {
    uint32_t n_tokens, qkv_stride, o_stride, o_off, n_pages;
    vki_seq_info seq[MAX_SEQS];
    uint32_t *pt, n_pt;      /* page table */
    uint32_t *tok_pos, *tok_seq;
    float *qkv;              /* [n_tokens][qkv_stride]: q | k | v | pad */
    float *kc[MAX_SEQS], *vc[MAX_SEQS]; /* reference K/V per sequence [n_ctx][n_kv][hd], rounded */
    hpool kpool, vpool;
} hstep;

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
    uint32_t esz = s->kv_type == VKI_GGML_F16 ? 2 : 4;
    size_t pool_elems = (size_t)h->n_pages * s->n_kv_heads * s->page_size * s->head_dim;
    h->kpool = (hpool){malloc(pool_elems * esz), pool_elems * esz, esz};
    h->vpool = (hpool){malloc(pool_elems * esz), pool_elems * esz, esz};
    for (size_t i = 0; i < pool_elems * esz / 4; i++) { /* the NaN fill of vt_buf_nan */
        memcpy(h->kpool.bytes + 4 * i, &(uint32_t){0x7fc00000u}, 4);
        memcpy(h->vpool.bytes + 4 * i, &(uint32_t){0x7fc00000u}, 4);
    }
    float *row = malloc(kvrow * sizeof *row);
    for (uint32_t k = 0; k < ac->n_seqs; k++) {
        vki_seq_info *q = &h->seq[k];
        uint32_t pos0 = q->n_ctx - q->n_new;
        h->kc[k] = malloc((size_t)q->n_ctx * kvrow * sizeof(float));
        h->vc[k] = malloc((size_t)q->n_ctx * kvrow * sizeof(float));
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
                for (uint32_t i = 0; i < kvrow; i++)
                    dst[i] = kv_round(s, row[i]);
                for (uint32_t g = 0; g < s->n_kv_heads; g++)
                    hpool_put(kv ? &h->vpool : &h->kpool, s, page, g, slot, row + g * s->head_dim);
            }
        }
    }
    free(row);
}

static void free_step(hstep *h, uint32_t n_seqs)
{
    for (uint32_t k = 0; k < n_seqs; k++) {
        free(h->kc[k]);
        free(h->vc[k]);
    }
    free(h->pt); free(h->tok_pos); free(h->tok_seq); free(h->qkv);
    free(h->kpool.bytes); free(h->vpool.bytes);
}

/* Reference: packed out [n_tokens][n_heads * hd], double accumulation. */
static void ref_attention(const op_attn *a, const hstep *h, uint32_t n_seqs, float *out)
{
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
                double mx = -INFINITY, sum = 0;
                for (uint32_t j = 0; j <= pos; j++) {
                    const float *kv = h->kc[k] + (size_t)j * kvrow + g * hd;
                    double dot = 0;
                    for (uint32_t d = 0; d < hd; d++)
                        dot += (double)qv[d] * kv[d];
                    sc[j] = dot * s->scale;
                    mx = fmax(mx, sc[j]);
                }
                memset(acc, 0, hd * sizeof *acc);
                for (uint32_t j = 0; j <= pos; j++) {
                    double pr = exp(sc[j] - mx);
                    sum += pr;
                    const float *vv = h->vc[k] + (size_t)j * kvrow + g * hd;
                    for (uint32_t d = 0; d < hd; d++)
                        acc[d] += pr * vv[d];
                }
                for (uint32_t d = 0; d < hd; d++)
                    out[(size_t)t * s->n_heads * hd + hh * hd + d] = (float)(acc[d] / sum);
            }
        }
    }
    free(sc);
    free(acc);
}

static void check_output(const op_attn *a, const hstep *h, const float *o, const acase *ac, const char *type)
{
    uint32_t row = a->s.n_heads * a->s.head_dim;
    float *ref = malloc((size_t)h->n_tokens * row * sizeof *ref), *got = malloc((size_t)h->n_tokens * row * sizeof *got);
    ref_attention(a, h, ac->n_seqs, ref);
    for (uint32_t t = 0; t < h->n_tokens; t++)
        memcpy(got + (size_t)t * row, o + h->o_off + (size_t)t * h->o_stride, row * sizeof(float));
    char label[160];
    snprintf(label, sizeof label, "%s %s (heads %u/%u hd %u page %u)", ac->name, type, a->s.n_heads, a->s.n_kv_heads,
             a->s.head_dim, a->s.page_size);
    double e = vt_nmse(got, ref, (size_t)h->n_tokens * row);
    worst_nmse = e > worst_nmse ? e : worst_nmse;
    vt_assert_nmse(got, ref, (size_t)h->n_tokens * row, attn_tol, label);
    size_t n = h->o_off + (size_t)h->n_tokens * h->o_stride;
    for (size_t i = 0; i < n; i++) { /* padding and the offset are never written */
        bool inside = i >= h->o_off && (i - h->o_off) % h->o_stride < row;
        uint32_t bits;
        memcpy(&bits, &o[i], 4);
        if (!inside && bits != 0x7fc00000u)
            fail_msg("%s: float %zu outside the output rows was written", label, i);
    }
    free(ref);
    free(got);
}

/* Device buffers of one case. */
typedef struct dstep {
    vkd_buffer *qkv, *o, *kp, *vp, *pos, *seq, *info, *pt, *items, *scratch;
} dstep;

static void run_case(vt_gpu *g, vt_rng *r, const acase *ac, uint32_t kv_type)
{
    op_attn_shape s = {.n_heads = ac->n_heads, .n_kv_heads = ac->n_kv, .head_dim = ac->hd, .page_size = ac->page,
                       .kv_type = kv_type, .scale = ac->scale};
    op_attn a;
    assert_int_equal(op_attn_setup(g->dev, &s, &a), VKI_OK);
    a.split_keys = ac->split_keys;
    if (expect_cm) /* the coopmat kernel really runs (no silent fall-back to the FP32 one) */
        assert_true(a.pre_kid == VKK_ATTN_PREFILL_CME_F16 || a.pre_kid == VKK_ATTN_PREFILL_CME_F32 ||
                    a.pre_kid == VKK_ATTN_PREFILL_CM_F16 || a.pre_kid == VKK_ATTN_PREFILL_CM_F32);
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
    d.kp = vt_buf_from(g, h.kpool.bytes, h.kpool.n, "K pool");
    d.vp = vt_buf_from(g, h.vpool.bytes, h.vpool.n, "V pool");
    d.pos = vt_buf_from(g, h.tok_pos, h.n_tokens * 4, "tok_pos");
    d.seq = vt_buf_from(g, h.tok_seq, h.n_tokens * 4, "tok_seq");
    d.info = vt_buf_from(g, h.seq, ac->n_seqs * sizeof(vki_seq_info), "seq_info");
    d.pt = vt_buf_from(g, h.pt, h.n_pt * 4, "page_table");
    d.items = vt_buf_from(g, items, plan.n_items * sizeof *items, "items");
    uint64_t sb = op_attn_scratch_bytes(&a, plan.n_slots);
    d.scratch = vt_buf_nan(g, sb ? sb : 4, "partials");
    /* the host pools already hold the new tokens: put NaN there so only kv_write can fix them */
    for (uint32_t t = 0; t < h.n_tokens; t++) {
        const vki_seq_info *q = &h.seq[h.tok_seq[t]];
        uint32_t page = h.pt[q->pt_off + h.tok_pos[t] / s.page_size], slot = h.tok_pos[t] % s.page_size;
        size_t esz = h.kpool.esz, row = (size_t)s.head_dim * esz;
        for (uint32_t kvh = 0; kvh < s.n_kv_heads; kvh++) {
            size_t off = ((((size_t)page * s.n_kv_heads + kvh) * s.page_size) + slot) * row;
            assert_int_equal(vkd_fill(g->dev, d.kp, off, row, 0x7fc00000u), VKI_OK);
            assert_int_equal(vkd_fill(g->dev, d.vp, off, row, 0x7fc00000u), VKI_OK);
        }
    }
    op_attn_step st = {vkd_whole(d.pos), vkd_whole(d.seq), vkd_whole(d.info), vkd_whole(d.pt), vkd_whole(d.items), &plan};
    uint32_t qrow = s.n_heads * s.head_dim, kvrow = s.n_kv_heads * s.head_dim;
    op_mat q = {vkd_whole(d.qkv), 0, h.qkv_stride}, k = {vkd_whole(d.qkv), qrow, h.qkv_stride};
    op_mat v = {vkd_whole(d.qkv), qrow + kvrow, h.qkv_stride}, o = {vkd_whole(d.o), h.o_off, h.o_stride};
    vt_begin(g);
    assert_int_equal(op_kv_write(&g->cmd, &a, &st, k, v, vkd_whole(d.kp), vkd_whole(d.vp)), VKI_OK);
    vkd_barrier(&g->cmd);
    assert_int_equal(op_attention(&g->cmd, &a, &st, q, o, vkd_whole(d.kp), vkd_whole(d.vp), vkd_whole(d.scratch)), VKI_OK);
    vt_submit_wait(g);

    const char *type = kv_type == VKI_GGML_F16 ? "f16" : "f32";
    uint8_t *pool = malloc(h.kpool.n);
    vt_download(g, d.kp, pool, h.kpool.n);
    if (memcmp(pool, h.kpool.bytes, h.kpool.n))
        fail_msg("%s %s: K pool differs from the host layout after kv_write", ac->name, type);
    vt_download(g, d.vp, pool, h.vpool.n);
    if (memcmp(pool, h.vpool.bytes, h.vpool.n))
        fail_msg("%s %s: V pool differs from the host layout after kv_write", ac->name, type);
    free(pool);
    float *out = malloc(o_n * sizeof *out);
    vt_download(g, d.o, out, o_n * 4);
    check_output(&a, &h, out, ac, type);
    free(out);
    vkd_buffer *all[] = {d.qkv, d.o, d.kp, d.vp, d.pos, d.seq, d.info, d.pt, d.items, d.scratch};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        vkd_buffer_destroy(g->dev, all[i]);
    free(items);
    free_step(&h, ac->n_seqs);
}

static void run_cases(void **state, const char *suite, const acase *cases, size_t n)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded(suite);
    for (size_t i = 0; i < n; i++) {
        run_case(g, &r, &cases[i], VKI_GGML_F32);
        run_case(g, &r, &cases[i], VKI_GGML_F16);
    }
    vt_assert_clean(g);
}

/* The real test model's shape (stories260K: head dim 8, 8 heads, 4 KV heads) and small ones. */
static void test_attn_small_heads(void **state)
{
    const acase cases[] = {
        {"stories ragged", 8, 4, 8, 16, 6, {0, 50, 0, 16, 99, 332}, {37, 20, 1, 1, 1, 1}, 0, 2.0f, 0},
        {"one token, pos 0", 8, 4, 8, 16, 1, {0}, {1}, 0, 1.0f, 0},
        {"prompt of 1..3 tokens", 8, 4, 8, 5, 3, {0, 0, 4}, {2, 3, 1}, 0, 1.0f, 0},
        {"G=48 head blocks, splits", 48, 1, 8, 16, 3, {300, 0, 40}, {1, 21, 9}, 48, 3.0f, 0},
    };
    run_cases(state, "attn small heads", cases, sizeof cases / sizeof cases[0]);
}

/* GQA ratios 1, 2, 4, 8 (MQA) at head dims 64 and 128, odd page sizes, peaky softmax. */
static void test_attn_gqa(void **state)
{
    const acase cases[] = {
        {"G=1 hd64", 4, 4, 64, 16, 4, {0, 70, 5, 200}, {33, 1, 1, 17}, 0, 1.0f, 0},
        {"G=2 hd128", 4, 2, 128, 16, 4, {130, 0, 17, 3}, {1, 19, 1, 1}, 0, 1.0f, 0},
        {"G=4 hd64 page 7", 8, 2, 64, 7, 4, {0, 45, 100, 8}, {40, 1, 1, 9}, 40, 4.0f, 0},
        {"G=8 MQA hd128 page 32", 8, 1, 128, 32, 3, {64, 0, 250}, {1, 24, 1}, 0, 2.0f, 0.05f},
    };
    run_cases(state, "attn gqa", cases, sizeof cases / sizeof cases[0]);
}

/* Contexts past 2048: a long decode (automatic splits), a chunk after a long prefix, and a
 * whole 2048-token prompt; few heads to keep lavapipe quick. */
static void test_attn_long(void **state)
{
    const acase cases[] = {
        {"long ragged", 2, 1, 64, 16, 3, {2499, 2100, 0}, {1, 64, 1}, 0, 1.0f, 0},
        {"2048 prompt + decode", 2, 1, 64, 16, 2, {0, 3000}, {2048, 1}, 0, 1.0f, 0},
    };
    run_cases(state, "attn long", cases, sizeof cases / sizeof cases[0]);
}

/* Prefill on cooperative matrices: the emulated path (every device with shaderFloat16 and
 * subgroup shuffles) and, where present, the real NV one, on the same ragged steps: several
 * prefilling sequences of different lengths next to decoding ones, shuffled pages, GQA 1..8,
 * head dims 8 (padded to 16), 64, 128, blocks and key tiles with ragged ends. smem != 0 presents
 * the device as a GPU with that much shared memory, which selects the GPU tile shapes (several
 * softmax lanes per row, several subgroups per block). */
static void run_cm_cases(void **state, const char *suite, const acase *cases, size_t n, uint32_t smem)
{
    vt_gpu *g = vt_gpu_get(state);
    vki_device_info saved = g->dev->info;
    vkd_cm saved_cm = g->dev->cm;
    vt_rng r = vt_rng_seeded(suite);
    attn_tol = ATTN_CM_TOL, expect_cm = true, worst_nmse = 0;
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
            run_case(g, &r, &cases[i], VKI_GGML_F32);
            run_case(g, &r, &cases[i], VKI_GGML_F16);
        }
        g->dev->info = saved;
    }
    fprintf(stderr, "  %s: worst NMSE %.2e (bound %.0e)\n", suite, worst_nmse, ATTN_CM_TOL);
    attn_tol = ATTN_TOL, expect_cm = false;
    g->dev->cm = saved_cm;
    vt_assert_clean(g);
}

static void test_attn_coopmat(void **state)
{
    const acase cases[] = {
        {"cm stories ragged", 8, 4, 8, 16, 5, {0, 50, 0, 99, 7}, {37, 20, 1, 1, 70}, 0, 2.0f, 0},
        {"cm G=1 hd64", 4, 4, 64, 16, 3, {0, 70, 5}, {33, 1, 17}, 0, 1.0f, 0},
        {"cm G=4 hd64 page 7", 8, 2, 64, 7, 3, {0, 45, 100}, {40, 1, 9}, 0, 4.0f, 0},
        {"cm G=8 MQA hd128 page 32", 8, 1, 128, 32, 2, {64, 0}, {1, 24}, 0, 2.0f, 0.05f},
        {"cm G=2 hd128 long prefix", 4, 2, 128, 16, 2, {300, 0}, {19, 2}, 0, 1.0f, 0},
    };
    run_cm_cases(state, "attn coopmat", cases, sizeof cases / sizeof cases[0], 0);
}

/* The GPU tile shapes through the emulation: 32 rows x 64 keys with 4 softmax lanes per row
 * (hd 64 at 30 KiB), 16 x 32 with 8 lanes (hd 128 at 23 KiB). */
static void test_attn_coopmat_gpu_tiles(void **state)
{
    const acase hd64[] = {{"cm gpu tiles hd64", 8, 2, 64, 16, 3, {0, 130, 9}, {70, 1, 40}, 0, 2.0f, 0}};
    const acase hd128[] = {{"cm gpu tiles hd128", 4, 1, 128, 16, 2, {0, 77}, {45, 30}, 0, 1.0f, 0}};
    run_cm_cases(state, "attn coopmat gpu tiles hd64", hd64, 1, 30 * 1024);
    run_cm_cases(state, "attn coopmat gpu tiles hd128", hd128, 1, 23 * 1024);
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
    assert_int_equal(op_kv_write(&g->cmd, &a, &st, m, m, vkd_whole(kp), vkd_whole(vp)), VKI_OK);
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

/* The work list: decode splits cover [0, n_ctx) once with consecutive slots, prefill blocks
 * cover the new tokens, a small cap grows the splits, bad sequences are refused. Host only. */
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
    assert_int_equal(p.n_items, p.n_dec + p.n_red + p.n_pre);
    assert_int_equal(p.n_pre, (50 + a.pre_nq - 1) / a.pre_nq);
    assert_int_equal(p.n_red, 2); /* seqs 0 and 3 are split; seq 2 is not */
    uint32_t covered[4] = {0}, slots = 0;
    for (uint32_t i = 0; i < p.n_dec; i++) {
        assert_int_equal(it[i].a, covered[it[i].seq]);
        covered[it[i].seq] = it[i].b;
        if (it[i].c != VKI_ATTN_FINAL)
            assert_int_equal(it[i].c, slots++);
    }
    assert_int_equal(covered[0], 1000);
    assert_int_equal(covered[2], 3);
    assert_int_equal(covered[3], 5000);
    assert_int_equal(slots, p.n_slots);
    for (uint32_t i = p.n_dec; i < p.n_dec + p.n_red; i++)
        assert_true(it[i].seq == 0 || it[i].seq == 3);
    uint32_t q = 0;
    for (uint32_t i = p.n_dec + p.n_red; i < p.n_items; i++) {
        assert_int_equal(it[i].seq, 1);
        assert_int_equal(it[i].a, q);
        q += it[i].b;
    }
    assert_int_equal(q, 50);
    op_attn_plan p2;
    assert_int_equal(op_attn_plan_build(&a, seqs, 4, it, p.n_items - 5, &p2), VKI_OK); /* fewer, longer splits */
    assert_true(p2.n_items <= p.n_items - 5 && p2.split > p.split);
    assert_int_equal(op_attn_plan_build(&a, seqs, 4, it, 3, &p2), VKI_ERR_INVALID_ARG);
    uint64_t pages = op_kv_max_pages(g->dev, &s); /* one pool stays one binding */
    assert_true(pages > 0 && pages * op_kv_page_bytes(&s) <= g->dev->info.max_storage_buffer_range);
    assert_true((pages + 1) * op_kv_page_bytes(&s) > g->dev->info.max_storage_buffer_range ||
                (pages + 1) * op_kv_page_bytes(&s) > g->dev->info.max_memory_allocation_size);
    assert_int_equal(op_kv_page_bytes(&s), 4 * 64 * 2 * 16); /* kv_type 0 is VKI_GGML_F32 */
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
        cmocka_unit_test(test_attn_small_heads),
        cmocka_unit_test(test_attn_gqa),
        cmocka_unit_test(test_attn_long),
        cmocka_unit_test(test_attn_coopmat),
        cmocka_unit_test(test_attn_coopmat_gpu_tiles),
    };
    return cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
}
