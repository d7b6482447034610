/* The engine end to end on the Vulkan device: the known greedy answer of stories260K, logits
 * against the CPU reference forward pass (tests/support/ref_model.c) for stories260K and
 * synthetic models of other shapes and weight types, ragged batches, chunked prefill, long
 * contexts.
 *
 * Tolerances (NMSE of logits against the reference, which accumulates in double):
 *   F32 weights, F32 KV: TOL_F32 5e-11, ~100x what lavapipe achieves (<= 5.2e-13; the issue
 *     asked for 1e-6, which is 2e6x looser and would let a real bug through)
 *   quantised weights, F32 KV: the same: the reference dequantises the same blocks, so only
 *     summation order differs
 *   F16 KV: TOL_F16KV 1e-7 against a reference that rounds K/V through f16 too (the device
 *     keeps the f32 query and accumulates in f32; the difference left is f32 rounding in
 *     softmax/exp and an f16 rounding tie now and then: <= 1.2e-9); the cases far below it
 *     have their own (TOL_F16KV_STORIES, TOL_F16KV_GEMMA2)
 *   Q8_0 KV: TOL_F32 too (measured <= 2.1e-13 over 80 seeds), against a reference that reads
 *     the device's K/V; the rows themselves are checked apart (check_q8_kv)
 * The newer architectures (qwen3, gemma2, gemma3, phi3, windowed llama) are held to the same
 * bounds (measured ~1e-13 with F32 KV). */
#include "support/ref_model.h"
#include "support/vt.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "engine/ops_matmul.h"
#include "engine/gguf_write.h"
#include "engine/synth.h"
#include "host/tokenizer/tokenizer.h"
#include "engine/quant.h"
#include "support/gguf_edit.h"

#define PAGES_PER_SEQ 160
#define TOL_F32 5e-11   /* measured on lavapipe: <= 5.2e-13 (was 1e-6, 2e6x looser) */
#define TOL_F16KV 1e-7  /* measured on lavapipe: <= 1.2e-9 (mixtral q4_0 gemm f16kv; was 1e-4) */
/* F16 KV cases that land far below that: stories260K 1.1e-11 (lavapipe) / 1.5e-13 (H200), gemma2
 * 8.8e-11 / 1.4e-10 */
#define TOL_F16KV_STORIES 1e-9
#define TOL_F16KV_GEMMA2 1e-8

typedef struct fixture {
    vt_gpu *g;
    gguf_file *f;
    model_hparams hp;
    model_tensors t;
    vk_engine *e;
    ref_model *ref;
    uint32_t n_vocab;
} fixture;

/* The engine parameters every case starts from. */
static vk_engine_params test_params(uint32_t kv_type, uint32_t max_tokens)
{
    vk_engine_params p = vk_engine_default_params();
    p.kv_type = kv_type;
    p.kv_tokens = 8 * PAGES_PER_SEQ * 16; /* every slot its own PAGES_PER_SEQ pages */
    p.max_seqs = 8;
    p.max_tokens = max_tokens;
    return p;
}

/* Engine only (on the harness's validated device), no reference. */
static void fixture_open_engine(vt_gpu *g, const char *path, const vk_engine_params *p, fixture *fx)
{
    memset(fx, 0, sizeof *fx);
    fx->g = g;
    char err[256] = "";
    assert_int_equal(gguf_open(path, &fx->f, err, sizeof err), VKI_OK);
    assert_int_equal(model_read_hparams(fx->f, &fx->hp, err, sizeof err), VKI_OK);
    assert_int_equal(model_find_tensors(fx->f, &fx->hp, &fx->t, err, sizeof err), VKI_OK);
    vki_status st = vk_engine_create(g->dev, fx->f, &fx->hp, &fx->t, p, &fx->e);
    if (st != VKI_OK)
        fail_msg("vk_engine_create(%s): %s", path, vki_status_str(st));
    fx->n_vocab = fx->hp.n_vocab;
}

/* Engine (on the harness's validated device) and CPU reference for the model at path. */
static void fixture_open_p(vt_gpu *g, const char *path, const vk_engine_params *p, fixture *fx)
{
    fixture_open_engine(g, path, p, fx);
    char err[256] = "";
    ref_model_opts ro = {.kv_type = p->kv_type, .n_ctx = p->max_ctx, .max_window = p->max_window,
                         .page_size = p->page_size};
    if (ref_model_load(path, &ro, &fx->ref, err, sizeof err) != VKI_OK)
        fail_msg("ref_model_load: %s", err);
}

static void fixture_open(vt_gpu *g, const char *path, uint32_t kv_type, uint32_t max_tokens, fixture *fx)
{
    vk_engine_params p = test_params(kv_type, max_tokens);
    fixture_open_p(g, path, &p, fx);
}

static void fixture_close(fixture *fx)
{
    vk_engine_destroy(fx->e);
    ref_model_free(fx->ref);
    model_tensors_free(&fx->t);
    gguf_close(fx->f);
}

/* A sequence driven by hand: slot i owns pages [i * PAGES_PER_SEQ, ...). */
typedef struct tseq {
    int32_t *tok;          /* [cap] prompt then generated */
    uint32_t n, cap;       /* tokens known */
    uint32_t done;         /* tokens whose KV is written */
    uint32_t slot;
    uint32_t pages[PAGES_PER_SEQ];
} tseq;

static void tseq_init(tseq *s, uint32_t slot, const int32_t *prompt, uint32_t n, uint32_t cap)
{
    memset(s, 0, sizeof *s);
    s->tok = malloc(cap * sizeof *s->tok);
    memcpy(s->tok, prompt, n * sizeof *prompt);
    s->n = n;
    s->cap = cap;
    s->slot = slot;
    for (uint32_t i = 0; i < PAGES_PER_SEQ; i++)
        s->pages[i] = slot * PAGES_PER_SEQ + i;
}

/* One step: sequence i feeds n_new[i] tokens (0 = not in this step). Sequences whose fed tokens
 * reach their known tokens want a token; it is appended (greedy) and its logits stored in
 * logits[i] (when not NULL). */
static void step(fixture *fx, tseq **seqs, const uint32_t *n_new, uint32_t n_seqs, float **logits)
{
    vki_step_seq ss[16];
    uint32_t idx[16], n = 0, T = 0, n_want = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        if (!n_new[i])
            continue;
        tseq *s = seqs[i];
        assert_true(s->done + n_new[i] <= s->n);
        bool want = s->done + n_new[i] == s->n;
        ss[n] = (vki_step_seq){.slot = s->slot, .pos0 = s->done, .n_new = n_new[i], .tokens = s->tok + s->done,
                               .n_pages = PAGES_PER_SEQ, .pages = s->pages, .want_token = want};
        idx[n++] = i;
        T += n_new[i];
        n_want += want;
    }
    vki_step_plan plan = {.n_seqs = n, .seqs = ss, .n_tokens = T};
    vki_step_out outs[16];
    float *all = malloc((size_t)(n_want ? n_want : 1) * fx->n_vocab * sizeof *all);
    assert_int_equal(vk_engine_step(fx->e, &plan, outs, all), VKI_OK);
    uint32_t w = 0;
    for (uint32_t j = 0; j < n; j++) {
        tseq *s = seqs[idx[j]];
        s->done += ss[j].n_new;
        if (!ss[j].want_token)
            continue;
        if (logits && logits[idx[j]])
            memcpy(logits[idx[j]], all + (size_t)w * fx->n_vocab, fx->n_vocab * sizeof(float));
        assert_int_equal(outs[w].slot, s->slot);
        assert_true(s->n < s->cap);
        s->tok[s->n++] = outs[w].token;
        w++;
    }
    free(all);
}

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* ---- stories260K: the known answer ------------------------------------------------------------ */

static const char *const KNOWN =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
    "saw a big, red ball. She wanted to play with it,";

static void known_answer(void **state, uint32_t kv_type)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512];
    if (!vt_shared_model("stories260K.gguf", path, sizeof path))
        skip(); /* vt_shared_model printed nothing: say why */
    fixture fx;
    fixture_open(g, path, kv_type, 64, &fx);
    vki_tokenizer *tok = NULL;
    char err[256];
    assert_int_equal(tok_from_gguf(fx.f, &tok, err, sizeof err), VKI_OK);
    int32_t prompt[64];
    size_t np = 0;
    const char *text = "Once upon a time";
    assert_int_equal(vki_tokenize(tok, text, strlen(text), true, false, prompt, 64, &np), VKI_OK);
    tseq s;
    tseq_init(&s, 0, prompt, (uint32_t)np, 256);
    tseq *ps = &s;
    uint32_t n_new = s.n;
    step(&fx, &ps, &n_new, 1, NULL);
    for (int i = 1; i < 48; i++) {
        n_new = 1;
        step(&fx, &ps, &n_new, 1, NULL);
    }
    char out[2048];
    size_t len = 0;
    assert_int_equal(vki_detokenize(tok, s.tok + 1, s.n - 1, VKI_DETOK_STRIP_LEADING_SPACE, out, sizeof out - 1, &len),
                     VKI_OK);
    out[len] = 0;
    if (strcmp(out, KNOWN))
        fail_msg("greedy output differs:\n got: %s\nwant: %s", out, KNOWN);
    free(s.tok);
    vki_tokenizer_free(tok);
    fixture_close(&fx);
    vt_assert_clean(g);
}

static void test_known_answer_f16_kv(void **state) { known_answer(state, VKI_GGML_F16); }
static void test_known_answer_f32_kv(void **state) { known_answer(state, VKI_GGML_F32); }

/* The reference's best logit (*best) and its lead over the second best, in units of rms(logits). */
static double top2_gap(const float *want, uint32_t n, uint32_t *best)
{
    uint32_t b1 = argmax(want, n), b2 = b1 ? 0 : 1;
    double ss = 0;
    for (uint32_t i = 0; i < n; i++) {
        ss += (double)want[i] * want[i];
        if (i != b1 && want[i] > want[b2])
            b2 = i;
    }
    *best = b1;
    return ss > 0 ? (want[b1] - want[b2]) / sqrt(ss / n) : 0;
}

/* The greedy token must be the reference's argmax unless the reference's two best logits are
 * closer than tie * rms(logits) (paths that round operands to F16 may flip such a near tie). */
static void check_argmax(const float *want, uint32_t n, int32_t got, double tie, const char *label)
{
    uint32_t b1;
    double gap = top2_gap(want, n, &b1);
    if (gap >= tie && got != (int32_t)b1)
        fail_msg("%s: greedy token %d, reference argmax %u (its lead %.2e rms)", label, got, b1, gap);
}

/* Prefill then decode, comparing every produced logits row with the reference: the engine's
 * rows first, then one reference pass over the whole sequence (its logits at every position:
 * a pass per row would redo the quadratic attention n_decode + 1 times). */
/* A Q8_0 pool's rounding-boundary flips kept apart from the logits: a K the device computes a
 * few f32 ulps off the reference's can round to the other side of a quantisation step, or its
 * block's f16 scale to the next f16, and one such value costs up to ~1e-6 of logits NMSE
 * against a reference quantising its own K/V (80 seeds: up to 6.0e-7, half of them ~1e-13; a
 * tolerance of 1e-6 failed one CI run, seed 87103732589827: 1.22e-6). So the reference runs on the device's K/V (read back and
 * dequantised), its logits into want [s->done][V], and the rows are held to what a Q8_0 pool
 * must hold against the reference's unrounded K/V x:
 *   - each value within half a step of x, the step being its block's stored f16 scale d16;
 *     ggml quantises with 1 / d32 and stores d16 = f16(d32), which adds up to 127 * 2^-11 =
 *     0.062 of a step (measured <= 0.055 over 80 seeds): Q8_SLACK 0.065 beyond half;
 *   - all but Q8_MAX_FLIPS of the values bit for bit the reference's Q8_0 of x (measured
 *     <= 2.4e-3 over 80 seeds: whole blocks whose scale rounded to the next f16, about one in
 *     1,300; a quantiser truncating instead of rounding: ~0.5). */
#define Q8_SLACK 0.065
#define Q8_MAX_FLIPS 1e-2
static void check_q8_kv(fixture *fx, const tseq *s, float *want, const char *label)
{
    const model_hparams *hp = &fx->hp;
    uint32_t n = s->done, ps = fx->e->p.page_size, n_pages = (n + ps - 1) / ps, hd = hp->head_dim;
    size_t row = vk_engine_kv_row_bytes(fx->e), rows = (size_t)n * hp->n_layer * 2 * hp->n_head_kv;
    assert_int_equal(row, hd + hd / 32 * 2);
    uint8_t *raw = malloc((size_t)n_pages * ps * hp->n_layer * 2 * hp->n_head_kv * row);
    float *dev = malloc(rows * hd * sizeof(float)), *x = malloc(rows * hd * sizeof(float));
    assert_int_equal(vk_engine_kv_read(fx->e, s->pages, n_pages, raw), VKI_OK);
    for (size_t r = 0; r < rows; r++) /* [token][layer][K, V][kv head]: hd int8, hd / 32 f16 scales */
        for (uint32_t i = 0; i < hd; i++) {
            uint16_t d;
            memcpy(&d, raw + r * row + hd + 2 * (i / 32), 2);
            dev[r * hd + i] = (float)(int8_t)raw[r * row + i] * quant_f16_to_f32(d);
        }
    assert_int_equal(ref_model_forward_kv(fx->ref, s->tok, n, true, want, dev, x), VKI_OK);
    size_t flips = 0;
    double worst = 0; /* |device - unrounded| in steps, beyond half a step */
    for (size_t b = 0; b < rows * hd / 32; b++) {
        int8_t q[32];
        uint16_t dh;
        memcpy(&dh, raw + (b * 32 / hd) * row + hd + 2 * (b % (hd / 32)), 2);
        float dr = quant_f16_to_f32(vt_q8_0_block(x + 32 * b, q)), dd = quant_f16_to_f32(dh);
        for (int i = 0; i < 32; i++) {
            float v = dev[32 * b + i];
            flips += v != q[i] * dr;
            double over = dd > 0 ? fabs((double)v - x[32 * b + i]) / dd - 0.5 : fabs((double)v - x[32 * b + i]);
            worst = over > worst ? over : worst;
        }
    }
    double frac = (double)flips / ((double)rows * hd);
    fprintf(stderr, "  %-34s K/V: %zu of %zu values off the reference's Q8_0 (%.1e), worst %.1e of a step "
            "beyond half\n", label, flips, rows * hd, frac, worst);
    if (worst > Q8_SLACK || frac > Q8_MAX_FLIPS)
        fail_msg("%s: Q8_0 K/V: %.3g of a step beyond half (> %g), %.3g of the values flipped (> %g)", label, worst,
                 Q8_SLACK, frac, Q8_MAX_FLIPS);
    free(raw);
    free(dev);
    free(x);
}

static void check_against_reference_in(fixture *fx, uint32_t slot, const int32_t *prompt, uint32_t np,
                                       uint32_t n_decode, uint32_t chunk, double tol, double tie, const char *label)
{
    tseq s;
    tseq_init(&s, slot, prompt, np, np + n_decode + 2);
    tseq *ps = &s;
    size_t V = fx->n_vocab;
    float *got = malloc((n_decode + 1) * V * sizeof *got), *want = malloc((size_t)(np + n_decode) * V * sizeof *want);
    double worst = 0;
    /* logits within tol of NMSE are up to sqrt(tol) rms off (more in single entries): a lead
     * below 4 sqrt(tol) is a near tie for every path (F16 KV, 1e-7: 1.3e-3; seed 90144569807756
     * flipped a lead of 1.1e-4 in mixtral q4_0 gemm f16kv at NMSE ~1e-9), however exact */
    tie = tie > 4 * sqrt(tol) ? tie : 4 * sqrt(tol);
    while (s.done < np) {
        uint32_t n_new = np - s.done < chunk ? np - s.done : chunk;
        float *lg[1] = {got};
        step(fx, &ps, &n_new, 1, s.done + n_new == s.n ? lg : NULL);
    }
    for (uint32_t i = 1; i <= n_decode; i++) {
        uint32_t one = 1;
        float *lg[1] = {got + i * V};
        step(fx, &ps, &one, 1, lg);
    }
    if (fx->e->p.kv_type == VKI_GGML_Q8_0)
        check_q8_kv(fx, &s, want, label);
    else
        assert_int_equal(ref_model_forward(fx->ref, s.tok, s.done, true, want), VKI_OK);
    for (uint32_t i = 0; i <= n_decode; i++) {
        uint32_t pos = np - 1 + i;
        char l[128];
        snprintf(l, sizeof l, "%s: position %u", label, pos);
        double e = vt_nmse(got + i * V, want + pos * V, V);
        worst = e > worst ? e : worst;
        vt_assert_nmse(got + i * V, want + pos * V, V, tol, l);
        check_argmax(want + pos * V, V, s.tok[pos + 1], tie, l);
    }
    fprintf(stderr, "  %-34s worst logits NMSE %.2e (tolerance %.0e)\n", label, worst, tol);
    free(s.tok);
    free(got);
    free(want);
}

static void check_against_reference_tie(fixture *fx, const int32_t *prompt, uint32_t np, uint32_t n_decode,
                                        uint32_t chunk, double tol, double tie, const char *label)
{
    check_against_reference_in(fx, 1, prompt, np, n_decode, chunk, tol, tie, label);
}

static void check_against_reference(fixture *fx, const int32_t *prompt, uint32_t np, uint32_t n_decode,
                                    uint32_t chunk, double tol, const char *label)
{
    check_against_reference_tie(fx, prompt, np, n_decode, chunk, tol, 0, label);
}

static void test_stories_logits_vs_reference(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512];
    if (!vt_shared_model("stories260K.gguf", path, sizeof path))
        skip();
    const int32_t prompt[] = {1, 403, 407, 261, 378, 300, 266, 290};
    for (int kv = 0; kv < 2; kv++) {
        fixture fx;
        fixture_open(g, path, kv ? VKI_GGML_F16 : VKI_GGML_F32, 64, &fx);
        check_against_reference(&fx, prompt, 8, 6, 64, kv ? TOL_F16KV_STORIES : TOL_F32,
                                kv ? "stories260K f16 kv" : "stories260K");
        fixture_close(&fx);
    }
    vt_assert_clean(g);
}

/* ---- synthetic models -------------------------------------------------------------------- */

typedef struct shape_case {
    const char *label;
    const char *arch;
    uint32_t d, n_head, n_kv, head_dim, d_ff;
    synth_wtype wtype;
    bool tied;
    uint32_t kv_type;
    double tol;
} shape_case;

/* Writes p into a temporary file named after label. */
static void write_synth(const char *label, const synth_params *p, char *path, size_t n)
{
    snprintf(path, n, "/tmp/vki_test_engine_%d_%s.gguf", (int)getpid(), label);
    for (char *q = path + strlen("/tmp/"); *q; q++)
        if (*q == ' ')
            *q = '_';
    char err[256];
    if (synth_write(p, path, err, sizeof err) != VKI_OK)
        fail_msg("synth_write %s: %s", label, err);
}

/* Writes a 2-layer model of this shape (byte vocabulary of 512) into a temporary file. */
static void write_model(const shape_case *c, char *path, size_t n)
{
    synth_params p = synth_default_params();
    p.arch = c->arch;
    assert_int_equal(synth_arch_defaults(&p), VKI_OK); /* command-r's logit scale */
    p.n_layer = 2;
    p.d_model = c->d;
    p.n_head = c->n_head;
    p.n_head_kv = c->n_kv;
    p.head_dim = c->head_dim;
    p.d_ff = c->d_ff;
    p.n_vocab = 512;
    p.n_ctx = 4096;
    p.wtype = c->wtype;
    p.tied = c->tied;
    p.seed = 1234;
    write_synth(c->label, &p, path, n);
}

static void random_prompt(vt_rng *r, int32_t *t, uint32_t n, uint32_t vocab)
{
    for (uint32_t i = 0; i < n; i++)
        t[i] = (int32_t)vt_range(r, 3, vocab - 1);
}

static const shape_case SHAPES[] = {
    /* label           arch     d    H  KV  hd   d_ff  weights     tied   kv             tol */
    {"gqa1_hd64_f32", "llama", 256, 4, 4, 64, 512, SYNTH_F32, false, VKI_GGML_F32, TOL_F32},
    {"gqa2_hd64_f16", "llama", 256, 4, 2, 64, 512, SYNTH_F16, false, VKI_GGML_F32, TOL_F32},
    {"gqa4_hd128_q8", "llama", 256, 8, 2, 128, 512, SYNTH_Q8_0, true, VKI_GGML_F32, TOL_F32},
    {"mqa8_hd64_q4_0", "llama", 256, 8, 1, 64, 512, SYNTH_Q4_0, false, VKI_GGML_F32, TOL_F32},
    {"qwen2_hd128_q4k", "qwen2", 256, 2, 1, 128, 512, SYNTH_Q4_K, true, VKI_GGML_F32, TOL_F32},
    {"gqa2_hd64_q6k", "llama", 256, 4, 2, 64, 512, SYNTH_Q6_K, false, VKI_GGML_F32, TOL_F32},
    {"q4km_f16kv", "llama", 256, 4, 2, 64, 512, SYNTH_Q4_K_M, false, VKI_GGML_F16, TOL_F16KV},
    {"q3km_mix", "llama", 256, 4, 2, 64, 512, SYNTH_Q3_K_M, false, VKI_GGML_F32, TOL_F32}, /* q3..q6_k */
    {"qwen2_iq4xs", "qwen2", 256, 4, 1, 64, 320, SYNTH_IQ4_XS, true, VKI_GGML_F32, TOL_F32}, /* + iq4_nl */
    {"gqa2_hd64_mxfp4", "llama", 256, 4, 2, 64, 512, SYNTH_MXFP4, false, VKI_GGML_F32, TOL_F32},
};

/* Opens the model at path with p, checks a random prompt of min_prompt..40 tokens against the
 * reference, then closes it and deletes the file. Chunks of 7: the last chunk is shorter, the
 * GEMV path (<= 8 rows) and decode too. */
static void check_model_file(vt_gpu *g, vt_rng *r, const char *path, const vk_engine_params *p, uint32_t min_prompt,
                             double tol, const char *label)
{
    fixture fx;
    fixture_open_p(g, path, p, &fx);
    int32_t prompt[40];
    uint32_t np = vt_range(r, min_prompt, 40);
    random_prompt(r, prompt, np, fx.n_vocab);
    check_against_reference(&fx, prompt, np, 3, 7, tol, label);
    fixture_close(&fx);
    unlink(path);
}

static void test_synthetic_shapes_vs_reference(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("engine shapes");
    for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++) {
        const shape_case *c = &SHAPES[i];
        char path[256];
        write_model(c, path, sizeof path);
        vk_engine_params p = test_params(c->kv_type, 64);
        check_model_file(g, &r, path, &p, 17, c->tol, c->label);
    }
    vt_assert_clean(g);
}

/* A model split in three files by llama.cpp's gguf-split rules, opened by its first file: the
 * engine's logits against the reference's (which reads the same joined tensors). */
static void test_split_model(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("engine split");
    char path[256], prefix[256], part[300];
    write_model(&SHAPES[6], path, sizeof path); /* q4_k_m weights, f16 KV */
    snprintf(prefix, sizeof prefix, "%.*s-split", (int)(strlen(path) - 5), path);
    assert_int_equal(gguf_edit_split(path, prefix, 3, -1), VKI_OK);
    unlink(path);
    vk_engine_params p = test_params(SHAPES[6].kv_type, 64);
    snprintf(part, sizeof part, "%s-00001-of-00003.gguf", prefix);
    check_model_file(g, &r, part, &p, 17, SHAPES[6].tol, "split in 3 files"); /* deletes the first */
    for (uint32_t k = 2; k <= 3; k++) {
        snprintf(part, sizeof part, "%s-%05u-of-00003.gguf", prefix, k);
        assert_int_equal(unlink(part), 0);
    }
    vt_assert_clean(g);
}

/* ---- the newer architectures ---------------------------------------------------------------- */

/* Synthetic models of the real head dims, GQA ratios, norms and layer patterns of Qwen3, Gemma
 * 2/3, Phi-3 and Mistral-style llama, with few layers and a small d_model so lavapipe runs them
 * fast; prompts long enough (33..40 tokens, pages of 16) that every sliding window slides. */
typedef struct arch_case {
    const char *label, *arch;
    uint32_t layers, d, n_head, n_kv, head_dim, d_ff;
    synth_wtype wtype;
    uint32_t window;          /* sliding window written (0: none) */
    float attn_softcap, final_softcap;
    uint32_t ctx_orig;        /* phi3 LongRoPE original context (0: no factors) */
    uint32_t engine_ctx;      /* engine max_ctx (0: the model's 4096) */
    uint32_t max_window;      /* engine max_attention_window (0: off) */
    uint32_t kv_type;
    double tol;
    float yarn;               /* YaRN factor over ctx_orig (0: none) */
    uint32_t n_rot;           /* rotated dims (0: head_dim) */
} arch_case;

static void write_arch_model(const arch_case *c, char *path, size_t n)
{
    synth_params p = synth_default_params();
    p.arch = c->arch;
    assert_int_equal(synth_arch_defaults(&p), VKI_OK);
    p.n_layer = c->layers, p.d_model = c->d, p.n_head = c->n_head, p.n_head_kv = c->n_kv;
    p.head_dim = c->head_dim, p.d_ff = c->d_ff, p.wtype = c->wtype;
    p.sliding_window = c->window, p.attn_softcap = c->attn_softcap, p.final_softcap = c->final_softcap;
    p.n_ctx_orig = c->ctx_orig, p.yarn_factor = c->yarn, p.n_rot = c->n_rot;
    p.n_vocab = 512, p.n_ctx = 4096, p.seed = 99;
    p.tied = !strncmp(c->arch, "gemma", 5) || !strcmp(c->arch, "qwen3") || !strcmp(c->arch, "command-r") ||
             !strcmp(c->arch, "cohere2");
    if (!strcmp(c->arch, "gemma3") || !strcmp(c->arch, "qwen3"))
        p.rope_base = 1000000.0f;
    if (!strcmp(c->arch, "granite")) /* an epsilon that shows: the engine's must be rms_eps / 0.22^2 */
        p.rms_eps = 0.02f;
    write_synth(c->label, &p, path, n);
}

/* Gemma 2's soft-caps here are smaller than its real 50 / 30 so that they bend this random
 * model's scores (std ~1) and logits (std ~3) instead of passing them nearly unchanged. */
static const arch_case ARCH_CASES[] = {
    /* label                     arch      L  d    H  KV hd   d_ff weights      window caps        orig ctx cap kv            tol  yarn rot */
    {"qwen3 hd128 gqa2",         "qwen3",  2, 256, 4, 2, 128, 512, SYNTH_F16,   0,     0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"gemma2 hd256 w24 caps",    "gemma2", 2, 256, 4, 2, 256, 512, SYNTH_Q8_0,  24,    1.5f, 4.0f, 0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"gemma3 5to1 hd256 mqa",    "gemma3", 6, 256, 4, 1, 256, 512, SYNTH_F32,   24,    0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"phi3 hd96 longrope long",  "phi3",   2, 384, 4, 4, 96,  512, SYNTH_Q8_0,  20,    0, 0,       64,  0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"phi3 longrope short",      "phi3",   2, 384, 4, 4, 96,  512, SYNTH_F16,   20,    0, 0,       64,  64, 0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"mistral w20 hd128 gqa4",   "llama",  2, 256, 4, 1, 128, 512, SYNTH_Q4_K_M, 20,   0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"llama capped 16 + sink",   "llama",  2, 256, 4, 2, 64,  512, SYNTH_F32,   0,     0, 0,       0,   0,  16, VKI_GGML_F32, TOL_F32, 0, 0},
    {"qwen3 q8_0 kv",            "qwen3",  2, 256, 4, 2, 128, 512, SYNTH_F16,   0,     0, 0,       0,   0,  0, VKI_GGML_Q8_0, TOL_F32, 0, 0},
    {"gemma2 f16 kv",            "gemma2", 2, 256, 4, 2, 256, 512, SYNTH_F32,   24,    1.5f, 4.0f, 0,   0,  0, VKI_GGML_F16, TOL_F16KV_GEMMA2, 0, 0},
    /* YaRN over an original context of 512 (Qwen's long-context files: 32768 x 4): with base 1e6
     * pairs 0..4 keep their frequency, 21.. are interpolated; llama's (2i, 2i+1) pairs too, into
     * an F16 cache (k scaled by the magnitude, 1 + 0.1 ln 8, before the cache rounds it, as in
     * llama.cpp and the reference); and the magnitude on partial rotary dims (Phi-4-mini's LongRoPE
     * rotates 96 of 128: the other 32 are not scaled) */
    {"qwen3 yarn x4",            "qwen3",  2, 256, 4, 2, 128, 512, SYNTH_F16,   0,     0, 0,       512, 0,  0, VKI_GGML_F32, TOL_F32, 4.0f, 0},
    {"llama yarn x8 f16 kv",     "llama",  2, 256, 4, 2, 64,  512, SYNTH_Q8_0,  0,     0, 0,       256, 0,  0, VKI_GGML_F16, TOL_F16KV, 8.0f, 0},
    {"phi3 longrope rot 64 of 96", "phi3", 2, 384, 4, 4, 96, 512, SYNTH_Q8_0, 20,     0, 0,       64,  0,  0, VKI_GGML_F32, TOL_F32, 0, 64},
    {"qwen3 yarn rot 96 of 128", "qwen3",  2, 256, 4, 2, 128, 512, SYNTH_F16,   0,     0, 0,       512, 0,  0, VKI_GGML_F32, TOL_F32, 4.0f, 96},
    /* Granite 3's multipliers (embedding 12, residual 0.22, attention 1/64, logits / 8): the
     * engine carries x / 0.22 with its norms' epsilon / 0.22^2, the reference scales each block */
    {"granite multipliers",      "granite", 3, 256, 4, 1, 64, 512, SYNTH_Q8_0,  0,     0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"granite f16 kv",           "granite", 2, 256, 4, 2, 64, 512, SYNTH_Q4_K_M, 0,    0, 0,       0,   0,  0, VKI_GGML_F16, TOL_F16KV, 0, 0},
    /* SmolLM3: layers 3 and 7 of 8 without RoPE (also in the fused decode attention) */
    {"smollm3 nope 3, 7",        "smollm3", 8, 256, 4, 1, 64, 512, SYNTH_Q8_0, 0,      0, 0,       0,   0,  0, VKI_GGML_F16, TOL_F16KV, 0, 0},
    /* OLMo 2: post-norms only, Q and K normed over their whole rows (GQA 2: k's rows apart) */
    {"olmo2 post-norms qk rows", "olmo2",  2, 256, 4, 2, 64, 512, SYNTH_Q4_K_M, 0,     0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    /* EXAONE 3.5: llama's block, NeoX RoPE. EXAONE 4: OLMo 2's post-norms with per-head Q/K
     * norms; its 1.2B (30 layers) has no window whatever the file says (the 4096 synth writes
     * here), its 32B (64 layers) slides on 3 layers of 4 and leaves RoPE out of the 4th */
    {"exaone neox gqa4",         "exaone", 2, 256, 4, 1, 64, 512, SYNTH_Q4_K_M, 0,     0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"exaone4 post-norms",       "exaone4", 2, 256, 4, 2, 64, 512, SYNTH_Q8_0, 4096,   0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"exaone4 64 layers w24",    "exaone4", 64, 64, 4, 2, 16, 128, SYNTH_F16,  24,     0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    /* GLM-4-0414: gemma's four norms with SwiGLU, Q/K/V biases, [gate | up] in ffn_up, RoPE
     * pairs (2i, 2i+1) on half of each head (64 of 128 in the 9B; 32 of 64 here) */
    {"glm4 four norms rot 32",   "glm4",   2, 256, 4, 2, 64, 512, SYNTH_Q4_K_M, 0,     0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 32},
    /* Gemma 1: gemma2's GeGLU block and sqrt(d) embeddings, no post-norms, caps or window (the
     * 2B's MQA and head dim 256) */
    {"gemma mqa hd256",          "gemma",  2, 256, 4, 1, 256, 512, SYNTH_Q8_0,  0,     0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    /* Command-R: LayerNorms, the FFN beside the attention on its normed input, logits x 1/16;
     * cohere2 (Command R7B): its window on layers il % 4 < 3, the 4th global without RoPE */
    {"command-r parallel ln",    "command-r", 2, 256, 4, 2, 64, 512, SYNTH_Q4_K_M, 0,  0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"cohere2 w24 nope 3, 7",    "cohere2", 8, 256, 4, 2, 64, 512, SYNTH_Q8_0, 24,     0, 0,       0,   0,  0, VKI_GGML_F16, TOL_F16KV, 0, 0},
    /* Ministral 3: Llama 4's attention temperature 1 + 0.1 ln(floor(pos / orig) + 1) (from
     * position 8 here: up to 1.18 in these prompts; decode too), and with YaRN x4 over 16 the
     * rotation's magnitude 1 (the graph's own factor cancels ggml's) */
    {"mistral3 temperature 8",  "mistral3", 2, 256, 4, 2, 64, 512, SYNTH_Q4_K_M, 0,   0, 0,       8,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    {"mistral3 yarn x4 temp",    "mistral3", 2, 256, 4, 2, 64, 512, SYNTH_Q8_0, 0,     0, 0,       16,  0,  0, VKI_GGML_F16, TOL_F16KV, 4.0f, 0},
    /* StarCoder2: LayerNorms with biases, Q/K/V/O biases, NeoX RoPE, gelu(up + b) down + b */
    {"starcoder2 ln+b gelu ffn", "starcoder2", 2, 256, 4, 2, 64, 512, SYNTH_Q4_K_M, 0, 0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
    /* Phi-2: starcoder2's norms and FFN beside the attention, a fused attn_qkv with its bias, 32
     * of 80 dims rotated, the LM head's bias */
    {"phi2 parallel rot 32 of 80", "phi2", 2, 320, 4, 4, 80, 512, SYNTH_Q8_0,  0,      0, 0,       0,   0,  0, VKI_GGML_F16, TOL_F16KV, 0, 32},
    /* StableLM 2 1.6B: LayerNorms with bias, Q/K/V biases, SwiGLU, 25% of each head rotated */
    {"stablelm ln+b rot 16 of 64", "stablelm", 2, 256, 4, 4, 64, 512, SYNTH_Q4_K_M, 0,  0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 16},
    /* Nemotron-4 / Minitron: LayerNorms with bias, max(up h, 0)^2 down, half of each head rotated;
     * Arcee AFM: llama's block with that FFN */
    {"nemotron relu2 rot 32 of 64", "nemotron", 2, 256, 4, 2, 64, 512, SYNTH_Q8_0, 0,    0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 32},
    {"arcee relu2 ffn",          "arcee",  2, 256, 4, 2, 64, 512, SYNTH_Q4_K_M, 0,     0, 0,       0,   0,  0, VKI_GGML_F32, TOL_F32, 0, 0},
};

static void test_archs_vs_reference(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("engine archs");
    for (size_t i = 0; i < sizeof ARCH_CASES / sizeof ARCH_CASES[0]; i++) {
        const arch_case *c = &ARCH_CASES[i];
        char path[256];
        write_arch_model(c, path, sizeof path);
        vk_engine_params p = test_params(c->kv_type, 64);
        p.max_ctx = c->engine_ctx;
        p.max_window = c->max_window;
        check_model_file(g, &r, path, &p, 33, c->tol, c->label);
    }
    vt_assert_clean(g);
}

/* ---- fusions ------------------------------------------------------------------------------------ */

/* The fused forward pass (Q|K(|V) and gate|up concatenated at load, the residual added by the
 * matmul, K rotated by the cache write, decode splits merged by the last split, the gated unit in
 * decode's gate|up pass, decode attention rotating q and reading the new K / V from the
 * projection beside the cache write) gives the op-by-op pass's logits bit for bit, with fewer
 * dispatches and barriers (gemma: as many barriers; its post-norms sit between matmul and
 * residual): prefill in chunks of 7 (GEMV and GEMM rows) and decode steps. */
static void fusion_case(vt_gpu *g, const char *path, uint32_t kv_type, const char *label)
{
    fixture fx[2];
    double n_disp[2] = {0}, n_bar[2] = {0};
    for (int f = 0; f < 2; f++) {
        vk_engine_params p = test_params(kv_type, 64);
        p.no_fusion = f == 1;
        fixture_open_engine(g, path, &p, &fx[f]);
    }
    const uint32_t V = fx[0].n_vocab, np = 23, nd = 4;
    int32_t prompt[23];
    vt_rng r = vt_rng_seeded(label);
    random_prompt(&r, prompt, np, V < 300 ? V : 300);
    tseq s[2];
    float *lg[2] = {malloc(V * sizeof(float)), malloc(V * sizeof(float))};
    for (int f = 0; f < 2; f++)
        tseq_init(&s[f], 2, prompt, np, np + nd + 2);
    for (uint32_t it = 0; s[0].done < np + nd; it++) {
        for (int f = 0; f < 2; f++) {
            tseq *ps = &s[f];
            uint32_t n_new = s[f].done < np ? (np - s[f].done < 7 ? np - s[f].done : 7) : 1;
            float *out[1] = {lg[f]};
            step(&fx[f], &ps, &n_new, 1, out);
            n_disp[f] += fx[f].e->last_dispatches;
            n_bar[f] += fx[f].e->last_barriers;
        }
        assert_int_equal(s[0].n, s[1].n);
        if (s[0].done >= np && memcmp(lg[0], lg[1], V * sizeof(float)))
            fail_msg("%s: step %u: fused logits differ from op-by-op (NMSE %.3g)", label, it, vt_nmse(lg[0], lg[1], V));
        assert_memory_equal(s[0].tok, s[1].tok, s[0].n * sizeof(int32_t));
    }
    if (!(n_disp[0] < n_disp[1] && n_bar[0] <= n_bar[1])) /* gemma's post-norms keep their barriers */
        fail_msg("%s: fused %.0f dispatches / %.0f barriers, op by op %.0f / %.0f", label, n_disp[0], n_bar[0],
                 n_disp[1], n_bar[1]);
    fprintf(stderr, "  %-30s bitwise equal; dispatches %.0f -> %.0f, barriers %.0f -> %.0f\n", label, n_disp[1],
            n_disp[0], n_bar[1], n_bar[0]);
    for (int f = 0; f < 2; f++) {
        free(s[f].tok);
        free(lg[f]);
        fixture_close(&fx[f]);
    }
}

static void test_fusion_bitwise(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512];
    if (vt_shared_model("stories260K.gguf", path, sizeof path))
        fusion_case(g, path, VKI_GGML_F16, "stories260K (f32: q|k|v)");
    /* Q4_K_M over 4 layers: attn_v is Q6_K in layers 2 and 3 (llama-quantize's more bits), so
     * those layers concatenate only q|k */
    synth_params p = synth_default_params();
    p.n_layer = 4, p.d_model = 256, p.n_head = 4, p.n_head_kv = 2, p.head_dim = 64, p.d_ff = 512;
    p.n_vocab = 512, p.wtype = SYNTH_Q4_K_M, p.seed = 7;
    write_synth("fusion q4km", &p, path, sizeof path);
    fusion_case(g, path, VKI_GGML_F32, "llama q4_k_m (q|k, v apart)");
    fusion_case(g, path, VKI_GGML_Q8_0, "llama q4_k_m, q8_0 cache"); /* decode reads its new key quantised */
    unlink(path);
    const shape_case *qw = &SHAPES[4]; /* qwen2: q, k, v biases */
    write_model(qw, path, sizeof path);
    fusion_case(g, path, VKI_GGML_F32, "qwen2 q4_k + biases");
    unlink(path);
    /* qwen3 (Q/K norms: in the projections at one token), gemma2 (post-norms), gemma3 (Q/K norms
     * of 256), phi3, granite (the residual norms' epsilon in the fused norm epilogues), smollm3
     * (NoPE layers), olmo2 (no pre-norms), exaone4's 64 layers, glm4, command-r (its FFN on the
     * attention's h: op by op the projection's output apart) and cohere2 */
    static const size_t archs[] = {0, 1, 2, 3, 13, 15, 16, 19, 20, 22, 23, 24, 26, 27, 28, 29, 30};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        write_arch_model(&ARCH_CASES[archs[i]], path, sizeof path);
        fusion_case(g, path, VKI_GGML_F32, ARCH_CASES[archs[i]].label);
        unlink(path);
    }
    /* gpt-oss: the output bias (added by the residual projection before its norm epilogue in
     * decode), sink logits in the fused decode attention, expert biases */
    p = synth_default_params();
    p.arch = "gpt-oss", p.n_layer = 2, p.d_model = 256, p.n_head = 8, p.n_head_kv = 2, p.head_dim = 64;
    p.n_expert = 8, p.n_expert_used = 2, p.d_ff = p.d_ff_exp = 128, p.n_vocab = 512, p.n_ctx = 4096;
    p.sliding_window = 16, p.wtype = SYNTH_Q8_0, p.seed = 11;
    write_synth("fusion gpt-oss", &p, path, sizeof path);
    fusion_case(g, path, VKI_GGML_F32, "gpt-oss q8_0 (biases, sinks)");
    unlink(path);
    /* granitemoe's shared expert after the experts: its down projection fuses the next norm */
    p = synth_default_params();
    p.arch = "granitemoe";
    assert_int_equal(synth_arch_defaults(&p), VKI_OK);
    p.n_layer = 2, p.d_model = 256, p.n_head = 8, p.n_head_kv = 4, p.head_dim = 64;
    p.n_expert = 8, p.n_expert_used = 2, p.d_ff = 128, p.d_ff_shexp = 192, p.n_vocab = 512, p.n_ctx = 4096;
    p.wtype = SYNTH_Q4_K_M, p.seed = 12;
    write_synth("fusion granitemoe", &p, path, sizeof path);
    fusion_case(g, path, VKI_GGML_F32, "granitemoe shared q4_k_m");
    unlink(path);
    vt_assert_clean(g);
}

/* One prefill step of n tokens in a fresh slot wanting a token and the hidden rows (the
 * embeddings' hook): the rows, [n][d] (malloc'd). */
typedef struct hidden_got {
    float *rows;
    uint32_t n_rows, d;
} hidden_got;

static void hidden_copy(void *ctx, const float *rows, uint32_t n_rows, uint32_t d, uint32_t pos0)
{
    hidden_got *h = ctx;
    assert_int_equal(pos0, 0);
    h->rows = malloc((size_t)n_rows * d * sizeof(float));
    memcpy(h->rows, rows, (size_t)n_rows * d * sizeof(float));
    h->n_rows = n_rows, h->d = d;
}

static float *hidden_step(fixture *fx, const int32_t *prompt, uint32_t n, uint32_t slot)
{
    uint32_t pages[PAGES_PER_SEQ];
    for (uint32_t i = 0; i < PAGES_PER_SEQ; i++)
        pages[i] = slot * PAGES_PER_SEQ + i;
    hidden_got h = {0};
    vki_step_seq ss = {.slot = slot, .n_new = n, .tokens = prompt, .n_pages = PAGES_PER_SEQ, .pages = pages,
                       .want_token = true, .hidden_hook = hidden_copy, .hidden_hook_ctx = &h};
    vki_step_plan plan = {.n_seqs = 1, .seqs = &ss, .n_tokens = n};
    vki_step_out out;
    assert_int_equal(vk_engine_step(fx->e, &plan, &out, NULL), VKI_OK);
    assert_true(h.rows && h.n_rows == n && h.d == fx->hp.d_model);
    return h.rows;
}

/* int_dot (the integer-dot decode projections) on every weight type it runs: q8_0 with a tied
 * LM head, q4_0, qwen2's q4_k with Q/K/V biases, q6_k, a q4_k_m mix, a q3_k_m mix (q3_k to
 * q6_k), qwen2's iq4_xs (with iq4_nl where a row is no multiple of 256), q4_1, q5_0 (tied),
 * qwen2's q5_1, q2_k, qwen3's q4_k (its head norms in the Q and K projections' epilogues) and
 * mxfp4.
 * Three engines are fed the same tokens (the float engine's greedy choices), two sequences,
 * prefill then decode, the second stopping halfway (so the last steps have one token: the norm
 * epilogues quantise the next block's input):
 *  - int_dot with the fusions and int_dot op by op (no_fusion: separate Q, K, V and gate, up,
 *    the residual through h and an add, a quant_x8 pass before every product) give the same
 *    logits bit for bit, as the float path's fusions do;
 *  - int_dot against the float engine: not bitwise equal where decode took the integer path, and
 *    the logits' NMSE at most INT_DOT_TOL (the activations' 8-bit rounding);
 *  - every decode step of int_dot records as many dispatches as the float engine's: the
 *    kernels before each product quantise its input, no quant_x8 pass is left;
 *  - a prefill step with the embeddings' hidden rows next to a sampled token gives the same
 *    rows fused and op by op. */
#define INT_DOT_TOL 3e-3 /* measured on lavapipe, 7 seeds: <= 6.3e-4. The rounding of ~17 products'
                          * inputs (2-4e-5 each) adds up through the residual stream */

static void test_int_dot(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    if (!op_matmul_i8_supported(g->dev, VKI_GGML_Q8_0))
        skip();
    static const size_t models[] = {2, 3, 4, 5, 6, 7, 8, 9};
    /* and the types no other shape has alone: the legacy ones with offsets and fifth bits
     * (llama-quantize's Q4_1, Q5_0 and Q5_1 mixes, and the fallbacks of K mixes on rows of no
     * multiple of 256), and Q2_K; and qwen3 */
    static const shape_case legacy[] = {
        {"q4_1", "llama", 256, 4, 2, 64, 512, SYNTH_Q4_1, false, VKI_GGML_F32, TOL_F32},
        {"q5_0_tied", "llama", 256, 4, 2, 64, 512, SYNTH_Q5_0, true, VKI_GGML_F32, TOL_F32},
        {"qwen2_q5_1", "qwen2", 256, 4, 1, 64, 320, SYNTH_Q5_1, false, VKI_GGML_F32, TOL_F32},
        {"q2_k", "llama", 256, 4, 2, 64, 512, SYNTH_Q2_K, false, VKI_GGML_F32, TOL_F32},
        /* qwen3's per-head Q/K norms: in the Q and K projections' epilogues at one token */
        {"qwen3_q4_k", "qwen3", 256, 4, 2, 128, 512, SYNTH_Q4_K, true, VKI_GGML_F32, TOL_F32},
        /* command-r: the FFN's input quantised again after the attention's output projection */
        {"command-r_q8_0", "command-r", 256, 4, 2, 64, 512, SYNTH_Q8_0, true, VKI_GGML_F32, TOL_F32},
        /* starcoder2 and phi2 (parallel, fused Q|K|V with its bias): biases on the integer-dot
         * products, the GELU writing its output's int8 copy */
        {"starcoder2_q8_0", "starcoder2", 256, 4, 2, 64, 512, SYNTH_Q8_0, false, VKI_GGML_F32, TOL_F32},
        {"phi2_q4_k", "phi2", 256, 4, 4, 64, 512, SYNTH_Q4_K, false, VKI_GGML_F32, TOL_F32},
    };
    const size_t n_models = sizeof models / sizeof models[0];
    double worst = 0;
    vt_rng r = vt_rng_seeded("int dot");
    for (size_t mi = 0; mi < n_models + sizeof legacy / sizeof legacy[0]; mi++) {
        const shape_case *sc = mi < n_models ? &SHAPES[models[mi]] : &legacy[mi - n_models];
        char path[256];
        write_model(sc, path, sizeof path);
        fixture fx[3]; /* float, int_dot, int_dot op by op */
        for (int f = 0; f < 3; f++) {
            vk_engine_params p = test_params(sc->kv_type, 64);
            p.int_dot = f > 0;
            p.no_fusion = f == 2;
            fixture_open_engine(g, path, &p, &fx[f]);
        }
        const uint32_t V = fx[0].n_vocab, np[2] = {19, 6}, nd = 20;
        tseq s[3][2];
        for (uint32_t i = 0; i < 2; i++) {
            int32_t prompt[19];
            random_prompt(&r, prompt, np[i], V);
            for (int f = 0; f < 3; f++)
                tseq_init(&s[f][i], 1 + i, prompt, np[i], np[i] + nd + 1);
        }
        float *lg[3][2];
        for (int f = 0; f < 3; f++)
            for (uint32_t i = 0; i < 2; i++)
                lg[f][i] = malloc(V * sizeof(float));
        uint32_t differ = 0, compared = 0;
        double mworst = 0;
        for (uint32_t it = 0; it <= nd; it++) {
            /* the second sequence stops halfway: then one token a step, where the residual
             * projections' norm epilogues also quantise the next block's input */
            uint32_t n_new[2] = {it ? 1 : np[0], it ? (it <= nd / 2) : np[1]};
            for (int f = 0; f < 3; f++) {
                tseq *ps[2] = {&s[f][0], &s[f][1]};
                step(&fx[f], ps, n_new, 2, lg[f]);
            }
            /* decode (2 sequences, then 1): no quant_x8 pass; the norms (or the norm epilogues),
             * the decode attention and the gate|up pass quantise the products' inputs (4 per
             * layer and the LM head's without them) */
            if (it > 0 && fx[1].e->last_dispatches != fx[0].e->last_dispatches)
                fail_msg("%s step %u: int_dot %u dispatches, float %u", sc->label, it, fx[1].e->last_dispatches,
                         fx[0].e->last_dispatches);
            if (it == nd)
                fprintf(stderr, "  %-16s int_dot batch-1 step: %u dispatches, %u op by op, %u float\n", sc->label,
                        fx[1].e->last_dispatches, fx[2].e->last_dispatches, fx[0].e->last_dispatches);
            for (uint32_t i = 0; i < 2; i++) {
                if (!n_new[i])
                    continue;
                compared += it > 0;
                if (memcmp(lg[1][i], lg[2][i], V * sizeof(float)))
                    fail_msg("%s step %u sequence %u: int_dot logits differ with no_fusion (NMSE %.3g)", sc->label,
                             it, i, vt_nmse(lg[2][i], lg[1][i], V));
                double e = vt_nmse(lg[1][i], lg[0][i], V);
                if (!(e <= INT_DOT_TOL))
                    fail_msg("%s step %u sequence %u: int_dot logits NMSE %.3g > %.0e against the float path",
                             sc->label, it, i, e, INT_DOT_TOL);
                worst = e > worst ? e : worst;
                mworst = e > mworst ? e : mworst;
                differ += it > 0 && memcmp(lg[1][i], lg[0][i], V * sizeof(float)) != 0;
                for (int f = 1; f < 3; f++) /* teacher forcing: the float engine's token */
                    s[f][i].tok[s[f][i].n - 1] = s[0][i].tok[s[0][i].n - 1];
            }
        }
        /* embeddings next to logits: the hidden rows (record_hidden writes h after the LM head,
         * which normalises its rows into h on this path) as op by op, bit for bit */
        int32_t hp[9];
        random_prompt(&r, hp, 9, V);
        float *hid[3];
        for (int f = 0; f < 3; f++)
            hid[f] = hidden_step(&fx[f], hp, 9, 3);
        if (memcmp(hid[1], hid[2], (size_t)9 * fx[0].hp.d_model * sizeof(float)))
            fail_msg("%s: int_dot hidden rows differ with no_fusion (NMSE %.3g)", sc->label,
                     vt_nmse(hid[2], hid[1], (size_t)9 * fx[0].hp.d_model));
        for (int f = 0; f < 3; f++)
            free(hid[f]);
        fprintf(stderr, "  %-16s int_dot: logits NMSE against the float path <= %.2e\n", sc->label, mworst);
        if (differ < compared)
            fail_msg("%s: only %u of %u decode logits differ from the float path's: was int_dot used?", sc->label,
                     differ, compared);
        for (int f = 0; f < 3; f++) {
            for (uint32_t i = 0; i < 2; i++) {
                free(s[f][i].tok);
                free(lg[f][i]);
            }
            fixture_close(&fx[f]);
        }
        unlink(path);
    }
    fprintf(stderr, "  int_dot: logits NMSE against the float path <= %.2e; op by op bitwise equal\n", worst);
    vt_assert_clean(g);
}

/* Command-buffer reuse: an engine that submits repeated recordings again gives, bit for bit, the
 * logits and tokens of one that records every step, through ragged prefill chunks and decode at
 * changing batch sizes, with contexts that cross the decode split length (the device reads the
 * split count from the item list, so those steps repeat their recording). And it does reuse:
 * most decode steps are hits, at more than one split count. */
static void test_cmd_reuse_bitwise(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[256];
    write_model(&SHAPES[6], path, sizeof path); /* q4_k_m weights, f16 KV */
    fixture fx[2];
    for (int f = 0; f < 2; f++) {
        vk_engine_params p = test_params(VKI_GGML_F16, 64);
        p.no_cmd_reuse = f == 1;
        fixture_open_engine(g, path, &p, &fx[f]);
    }
    assert_non_null(fx[0].e->cmd->reuse);
    assert_null(fx[1].e->cmd->reuse);
    const uint32_t V = fx[0].n_vocab, np[3] = {40, 9, 70}, nd = 70;
    vt_rng r = vt_rng_seeded("cmd reuse");
    tseq s[2][3];
    for (uint32_t i = 0; i < 3; i++) {
        int32_t prompt[70];
        random_prompt(&r, prompt, np[i], V);
        for (int f = 0; f < 2; f++)
            tseq_init(&s[f][i], 1 + 2 * i, prompt, np[i], np[i] + nd + 2);
    }
    float *lg[2][3];
    for (int f = 0; f < 2; f++)
        for (uint32_t i = 0; i < 3; i++)
            lg[f][i] = malloc(V * sizeof(float));
    uint32_t hits = 0, decode_steps = 0, n_dec_seen[2] = {0, 0};
    for (uint32_t it = 0; s[0][0].n < np[0] + nd; it++) {
        uint32_t n_new[3];
        for (uint32_t i = 0; i < 3; i++) { /* prefill in chunks of 16; sequence 1 pauses a while */
            const tseq *q = &s[0][i];
            n_new[i] = q->done < np[i] ? (np[i] - q->done < 16 ? np[i] - q->done : 16) : 1;
            if (i == 1 && it >= 20 && it < 30)
                n_new[i] = 0;
        }
        bool decode = n_new[0] == 1 && n_new[2] == 1 && n_new[1] <= 1;
        uint64_t h0 = fx[0].e->cmd->reuse_hits;
        for (int f = 0; f < 2; f++) {
            tseq *ps[3] = {&s[f][0], &s[f][1], &s[f][2]};
            float *out[3] = {lg[f][0], lg[f][1], lg[f][2]};
            step(&fx[f], ps, n_new, 3, out);
        }
        for (uint32_t i = 0; i < 3; i++) {
            assert_int_equal(s[0][i].n, s[1][i].n);
            assert_memory_equal(s[0][i].tok, s[1][i].tok, s[0][i].n * sizeof(int32_t));
            if (n_new[i] && s[0][i].done == s[0][i].n - 1 && memcmp(lg[0][i], lg[1][i], V * sizeof(float)))
                fail_msg("step %u, sequence %u: logits with reuse differ (NMSE %.3g)", it, i,
                         vt_nmse(lg[0][i], lg[1][i], V));
        }
        if (decode) {
            decode_steps++;
            if (fx[0].e->cmd->reuse_hits > h0) {
                hits++;
                uint32_t nd0 = fx[0].e->attn_plan[0].n_dec; /* two split counts among the hits */
                if (!n_dec_seen[0] || n_dec_seen[0] == nd0)
                    n_dec_seen[0] = nd0;
                else
                    n_dec_seen[1] = nd0;
            }
        }
    }
    assert_int_equal(fx[1].e->cmd->reuse_hits, 0);
    if (hits * 10 < decode_steps * 8 || !n_dec_seen[1])
        fail_msg("%u of %u decode steps reused a recording (want >= 80%%), split counts %u and %u", hits,
                 decode_steps, n_dec_seen[0], n_dec_seen[1]);
    fprintf(stderr, "  bitwise equal; %u of %u decode steps reused (split counts %u, %u among them), %llu misses "
            "in all\n", hits, decode_steps, n_dec_seen[0], n_dec_seen[1], (unsigned long long)fx[0].e->cmd->reuse_misses);
    for (int f = 0; f < 2; f++) {
        for (uint32_t i = 0; i < 3; i++) {
            free(s[f][i].tok);
            free(lg[f][i]);
        }
        fixture_close(&fx[f]);
    }
    unlink(path);
    vt_assert_clean(g);
}

/* One sequence of test_overlap's schedule: token ids known to the host (generated ones arrive at
 * the wait of the step that sampled them), with their logprobs. */
typedef struct oseq {
    int32_t tok[192];
    float lp[192];
    uint32_t n;            /* tokens sampled or given (some maybe still in flight) */
    uint32_t done;         /* tokens whose KV is written */
    uint32_t slot;
    int64_t sampled_at;    /* step that sampled its last token (-1: none) */
    uint32_t pages[PAGES_PER_SEQ];
} oseq;

static void overlap_hook(void *ctx, float *logits, uint32_t n_vocab)
{
    (void)ctx;
    for (uint32_t i = 0; i < n_vocab; i += 2)
        logits[i] -= 1.0f;
}

/* Runs test_overlap's fixed schedule on fx: one step at a time with host tokens (overlap false),
 * or step k + 1 submitted before step k is waited, its decode tokens VKI_TOKEN_PREV. Midway the
 * session-file read drains the two steps in flight. Returns the reuse hits. */
static uint64_t overlap_run(fixture *fx, bool overlap, oseq *q, const uint32_t *np, uint32_t n_steps,
                            const vki_sampling_params *const *sp, const uint32_t *mask)
{
    static const int32_t prev = VKI_TOKEN_PREV;
    vki_step_seq ss[2][3];
    uint32_t who[2][3], n_who[2] = {0, 0}; /* per flight: the sequences whose token it samples */
    vki_step_out outs[3];
    uint64_t h0 = fx->e->steps_reused;
    for (uint32_t it = 0; it <= n_steps; it++) {
        uint32_t b = it % 2, n = 0, T = 0;
        n_who[b] = 0;
        for (uint32_t i = 0; it < n_steps && i < 3; i++) {
            oseq *s = &q[i];
            uint32_t n_new = s->done < np[i] ? (np[i] - s->done < 16 ? np[i] - s->done : 16) : 1;
            if ((i == 1 && it >= 12 && it < 17) || s->n >= 150) /* a pause: sampled two steps back */
                continue;
            bool want = s->done + n_new == (s->done < np[i] ? np[i] : s->n);
            bool from_prev = s->done >= np[i] && s->sampled_at == (int64_t)it - 1;
            /* the penalties' history: the tokens before pos0 + n_new, or before pos0 for a PREV
             * entry (the engine adds the one in flight; given a window's worth, it uses the last
             * window - 1) */
            uint32_t end = s->done + (overlap && from_prev ? 0 : n_new), w = sp[i]->penalty_window;
            uint32_t nh = want ? (w < end ? w : end) : 0;
            ss[b][n] = (vki_step_seq){.slot = s->slot, .pos0 = s->done, .n_new = n_new,
                                      .tokens = overlap && from_prev ? &prev : s->tok + s->done,
                                      .n_pages = PAGES_PER_SEQ, .pages = s->pages, .want_token = want,
                                      .sampling = sp[i], .seed = 100 + i, .history = s->tok + end - nh,
                                      .n_history = nh, .token_mask = it == 20 && i == 2 ? mask : NULL};
            if (!overlap || !from_prev)
                assert_true(s->done + n_new <= s->n);
            s->done += n_new;
            if (want) {
                s->sampled_at = it;
                who[b][n_who[b]++] = i;
            }
            T += n_new;
            n++;
        }
        if (n) {
            vki_step_plan plan = {.n_seqs = n, .seqs = ss[b], .n_tokens = T};
            assert_int_equal(vk_engine_submit(fx->e, &plan), VKI_OK);
            for (uint32_t k = 0; k < n_who[b]; k++) /* reserve the slot of the coming token */
                q[who[b][k]].n++;
        }
        if (overlap && it == n_steps / 2) { /* a session read waits for both steps, results kept */
            assert_int_equal(fx->e->n_pending, 2);
            uint8_t *kv = malloc((size_t)vk_engine_kv_row_bytes(fx->e) * 2 * fx->hp.n_layer * fx->hp.n_head_kv * 16);
            assert_int_equal(vk_engine_kv_read(fx->e, q[0].pages, 1, kv), VKI_OK);
            free(kv);
        }
        if (overlap ? it > 0 : n > 0) {
            uint32_t w = overlap ? (it + 1) % 2 : b; /* overlapped: the previous step's flight */
            assert_int_equal(vk_engine_wait(fx->e, outs, NULL), VKI_OK);
            for (uint32_t k = 0; k < n_who[w]; k++) {
                oseq *s = &q[who[w][k]];
                /* its slot is n - 1, or n - 2 when the step just submitted samples it again */
                uint32_t at = s->n - 1 - (overlap && it < n_steps && s->sampled_at == (int64_t)it);
                assert_int_equal(outs[k].slot, s->slot);
                assert_true(outs[k].token >= 0);
                s->tok[at] = outs[k].token;
                s->lp[at] = outs[k].logprob;
            }
        }
    }
    assert_int_equal(fx->e->n_pending, 0);
    return fx->e->steps_reused - h0;
}

/* Two steps in flight (vk_engine_submit / vk_engine_wait): decode tokens read on the device from
 * the previous step's sampler (VKI_TOKEN_PREV) give, bit for bit, the tokens and logprobs of
 * steps run one at a time with the host feeding every token. Seeded sampling, ragged prefill
 * chunks submitted beside PREV rows, a paused sequence, a token mask, a session read draining both
 * steps in flight, recordings reused by both flights. Then the refusals. */
static void test_overlap(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[256];
    write_model(&SHAPES[6], path, sizeof path); /* q4_k_m weights, f16 KV */
    fixture fx[2];
    for (int f = 0; f < 2; f++) {
        vk_engine_params p = test_params(VKI_GGML_F16, 64);
        fixture_open_engine(g, path, &p, &fx[f]);
    }
    assert_int_equal(fx[1].e->n_flights, 2);
    const uint32_t V = fx[0].n_vocab, np[3] = {40, 9, 70}, n_steps = 40;
    vt_rng r = vt_rng_seeded("overlap");
    vki_sampling_params sp[3];
    for (int i = 0; i < 3; i++) {
        sp[i] = vki_sampling_default_params();
        sp[i].temperature = 0.9f;
        sp[i].top_p = 0.95f;
        sp[i].logprobs = true;
    }
    /* penalties count the token in flight of a PREV entry (VKI_SAMPLE_PENDING): a 16-token window
     * with a bias, and a window of one (only the token in flight) */
    static const vki_logit_bias bias[2] = {{5, 1.5f}, {9, -2.0f}};
    sp[0].repetition_penalty = 1.5f, sp[0].presence_penalty = 0.5f, sp[0].penalty_window = 16;
    sp[0].logit_bias = bias, sp[0].n_logit_bias = 2;
    sp[2].frequency_penalty = 1.0f, sp[2].penalty_window = 1;
    const vki_sampling_params *spp[3] = {&sp[0], &sp[1], &sp[2]};
    uint32_t *mask = calloc((V + 31) / 32, 4);
    for (uint32_t t = 0; t < V; t += 3)
        mask[t / 32] |= 1u << (t % 32);
    oseq q[2][3];
    for (uint32_t i = 0; i < 3; i++) {
        int32_t prompt[70];
        random_prompt(&r, prompt, np[i], V);
        for (int f = 0; f < 2; f++) {
            oseq *s = &q[f][i];
            memset(s, 0, sizeof *s);
            memcpy(s->tok, prompt, np[i] * sizeof *prompt);
            s->n = np[i];
            s->slot = 1 + 2 * i;
            s->sampled_at = -1;
            for (uint32_t j = 0; j < PAGES_PER_SEQ; j++)
                s->pages[j] = s->slot * PAGES_PER_SEQ + j;
        }
    }
    uint64_t reused[2];
    for (int f = 0; f < 2; f++)
        reused[f] = overlap_run(&fx[f], f == 1, q[f], np, n_steps, spp, mask);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(q[0][i].n, q[1][i].n);
        assert_true(q[0][i].n > np[i] + 10);
        if (memcmp(q[0][i].tok, q[1][i].tok, q[0][i].n * 4) || memcmp(q[0][i].lp + np[i], q[1][i].lp + np[i],
                                                                         (q[0][i].n - np[i]) * 4))
            fail_msg("sequence %u: overlapped steps sampled other tokens or logprobs", i);
    }
    /* both flights reuse their recordings: the decode steps repeat one shape per flight */
    if (reused[1] * 2 < n_steps)
        fail_msg("overlapped: %llu of %u steps reused a recording", (unsigned long long)reused[1], n_steps);
    fprintf(stderr, "  overlapped = one at a time, bit for bit (%u + %u + %u tokens); steps reused %llu / %llu of %u\n",
            q[0][0].n, q[0][1].n, q[0][2].n, (unsigned long long)reused[0], (unsigned long long)reused[1], n_steps);

    /* refusals, each leaving the engine usable */
    vk_engine *e = fx[1].e;
    oseq *s = &q[1][0];
    static const int32_t prev = VKI_TOKEN_PREV;
    vki_step_out outs[2];
    float *lg = malloc(V * sizeof *lg);
    vki_step_seq a = {.slot = s->slot, .pos0 = s->done, .n_new = 1, .tokens = s->tok + s->done, .n_pages = PAGES_PER_SEQ,
                      .pages = s->pages, .want_token = true};
    vki_step_plan plan = {.n_seqs = 1, .seqs = &a, .n_tokens = 1};
    assert_int_equal(vk_engine_wait(e, outs, NULL), VKI_ERR_INVALID_ARG);     /* none in flight */
    vki_step_seq other = {.slot = 7, .pos0 = 0, .n_new = 1, .tokens = &prev, .n_pages = PAGES_PER_SEQ,
                          .pages = q[1][2].pages, .want_token = true};
    vki_step_plan bad = {.n_seqs = 1, .seqs = &other, .n_tokens = 1};
    assert_int_equal(vk_engine_submit(e, &bad), VKI_ERR_INVALID_ARG);         /* slot 7 never sampled */
    assert_int_equal(vk_engine_submit(e, &plan), VKI_OK);
    vki_step_seq b = a;
    b.pos0 = a.pos0 + 1;
    b.tokens = &prev;
    vki_step_plan plan2 = {.n_seqs = 1, .seqs = &b, .n_tokens = 1};
    assert_int_equal(vk_engine_submit(e, &plan2), VKI_OK);
    assert_int_equal(vk_engine_submit(e, &plan2), VKI_ERR_INVALID_ARG);       /* a third in flight */
    assert_int_equal(vk_engine_step(e, &plan2, outs, NULL), VKI_ERR_INVALID_ARG);
    assert_int_equal(vk_engine_wait(e, outs, lg), VKI_ERR_INVALID_ARG);       /* logits of the older */
    assert_int_equal(vk_engine_wait(e, outs, NULL), VKI_OK);
    int32_t t1 = outs[0].token;
    assert_int_equal(vk_engine_wait(e, outs, lg), VKI_OK);                    /* the latest: allowed */
    /* the PREV step ran on the token the device sampled: a host-fed rerun of it agrees */
    int32_t t2 = outs[0].token;
    vki_step_seq c = b;
    c.tokens = &t1;
    vki_step_plan plan3 = {.n_seqs = 1, .seqs = &c, .n_tokens = 1};
    assert_int_equal(vk_engine_step(e, &plan3, outs, NULL), VKI_OK);
    assert_int_equal(outs[0].token, t2);
    /* a PREV entry with penalties and a logits post-processor: the host round trip counts the
     * token the device copied (window 1: only that token, made far likelier), as a host-fed rerun */
    vki_sampling_params pen = vki_sampling_default_params();
    pen.repetition_penalty = 0.05f, pen.presence_penalty = -2.0f, pen.penalty_window = 1;
    vki_step_seq u = c, v = c;
    u.pos0 = c.pos0 + 1, u.tokens = &t2, u.sampling = &pen, u.history = &t2, u.n_history = 1;
    v.pos0 = c.pos0 + 2, v.tokens = &prev, v.sampling = &pen, v.history = &t2, v.n_history = 1;
    v.logits_hook = overlap_hook;
    vki_step_plan pu = {.n_seqs = 1, .seqs = &u, .n_tokens = 1}, pv = {.n_seqs = 1, .seqs = &v, .n_tokens = 1};
    assert_int_equal(vk_engine_submit(e, &pu), VKI_OK);
    assert_int_equal(vk_engine_submit(e, &pv), VKI_OK);
    assert_int_equal(vk_engine_wait(e, outs, NULL), VKI_OK);
    int32_t tu = outs[0].token;
    assert_int_equal(vk_engine_wait(e, outs, NULL), VKI_OK);
    int32_t tv = outs[0].token;
    v.tokens = &tu, v.history = &tu;
    assert_int_equal(vk_engine_step(e, &pv, outs, NULL), VKI_OK);
    assert_int_equal(outs[0].token, tv);
    fprintf(stderr, "  PREV + penalties + post-processor: %d after %d (host-fed rerun: %d)\n", tv, tu, outs[0].token);
    c.pos0 = v.pos0, t2 = tv; /* the hook step below follows */
    /* a logits post-processor's step: resampled on the host, read back from scratch at its wait */
    vki_step_seq h = c;
    h.pos0 = c.pos0 + 1;
    h.tokens = &t2;
    h.logits_hook = overlap_hook;
    vki_step_plan plan4 = {.n_seqs = 1, .seqs = &h, .n_tokens = 1};
    assert_int_equal(vk_engine_submit(e, &plan4), VKI_OK);
    vki_step_seq d = h;
    d.pos0 = h.pos0 + 1;
    d.tokens = s->tok; /* any known token */
    d.logits_hook = NULL;
    vki_step_plan plan5 = {.n_seqs = 1, .seqs = &d, .n_tokens = 1};
    assert_int_equal(vk_engine_submit(e, &plan5), VKI_ERR_INVALID_ARG);       /* after an exclusive step */
    assert_int_equal(vk_engine_wait(e, outs, NULL), VKI_OK);
    d.tokens = &prev;
    assert_int_equal(vk_engine_submit(e, &plan5), VKI_ERR_INVALID_ARG);       /* the host's token, not the device's */
    vki_step_seq two = d;
    two.n_new = 2;
    int32_t pair[2] = {VKI_TOKEN_PREV, 1};
    two.tokens = pair;
    vki_step_plan plan6 = {.n_seqs = 1, .seqs = &two, .n_tokens = 2};
    assert_int_equal(vk_engine_submit(e, &plan6), VKI_ERR_INVALID_ARG);       /* PREV in a chunk */
    assert_int_equal(e->n_pending, 0);
    free(lg);
    free(mask);
    for (int f = 0; f < 2; f++)
        fixture_close(&fx[f]);
    unlink(path);
    vt_assert_clean(g);
}

/* Decode step k of test_masks_later for the two sequences s: row 0 always masked (mask0), row 1
 * on odd steps (mask1); tokens from the host, or VKI_TOKEN_PREV. */
static vki_step_plan masked_plan(vki_step_seq *ss, tseq *const *s, uint32_t k, bool prev,
                                 const vki_sampling_params *sp, const uint32_t *mask0, const uint32_t *mask1)
{
    static const int32_t prev_tok = VKI_TOKEN_PREV;
    for (uint32_t i = 0; i < 2; i++)
        ss[i] = (vki_step_seq){.slot = s[i]->slot, .pos0 = s[i]->done, .n_new = 1,
                               .tokens = prev ? &prev_tok : s[i]->tok + s[i]->done, .n_pages = PAGES_PER_SEQ,
                               .pages = s[i]->pages, .want_token = true, .sampling = sp, .seed = 7 + i,
                               .token_mask = i == 0 ? mask0 : k % 2 ? mask1 : NULL};
    return (vki_step_plan){.n_seqs = 2, .seqs = ss, .n_tokens = 2};
}

/* A step whose token masks come after its submit (vk_engine_submit_masks_later: the batch
 * manager's grammar rows in lookahead steps). Submitted with VKI_TOKEN_PREV tokens while the
 * step before runs, its masks written into the buffer its row points at, or its row pointed at
 * another buffer, after that step's wait: it samples under those masks, the tokens and logprobs
 * of host-fed steps run one at a time with the same masks, bit for bit. Then: no other step
 * while masks are due; masks for other rows are refused and the step samples under the masks its
 * submit saw, as it does when waited for with none given. */
static void test_masks_later(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[256];
    write_model(&SHAPES[6], path, sizeof path); /* q4_k_m weights, f16 KV */
    fixture fx;
    vk_engine_params p = test_params(VKI_GGML_F16, 64);
    fixture_open_engine(g, path, &p, &fx);
    vk_engine *e = fx.e;
    const uint32_t V = fx.n_vocab, W = (V + 31) / 32, N = 12;
    uint32_t *m = calloc(4 * W, 4), *live = calloc(W, 4); /* m + j W: the tokens t with t % 4 == j */
    for (uint32_t t = 0; t < V; t++)
        m[(t % 4) * W + t / 32] |= 1u << (t % 32);
    vki_sampling_params sp = vki_sampling_default_params();
    sp.temperature = 0.9f;
    vt_rng r = vt_rng_seeded("masks later");
    int32_t prompt[2][24];
    tseq sa[2], sb[2], *a[2] = {&sa[0], &sa[1]}, *b[2] = {&sb[0], &sb[1]};
    float lp[2][2][16];
    for (uint32_t i = 0; i < 2; i++) {
        random_prompt(&r, prompt[i], 24, V);
        tseq_init(a[i], 1 + 2 * i, prompt[i], 24, 64);
        tseq_init(b[i], 2 + 2 * i, prompt[i], 24, 64);
    }
    const uint32_t n24[2] = {24, 24};
    step(&fx, a, n24, 2, NULL);
    step(&fx, b, n24, 2, NULL);
    vki_step_seq ss[2], st[2];
    vki_step_out outs[2];
    for (uint32_t k = 0; k < N; k++) { /* reference: host-fed, one step at a time */
        vki_step_plan pl = masked_plan(ss, b, k, false, &sp, m + (k % 4) * W, m + ((k + 1) % 4) * W);
        assert_int_equal(vk_engine_step(e, &pl, outs, NULL), VKI_OK);
        for (uint32_t i = 0; i < 2; i++) {
            b[i]->done++;
            lp[1][i][k] = outs[i].logprob;
            b[i]->tok[b[i]->n++] = outs[i].token;
            assert_true((uint32_t)outs[i].token % 4 == (i == 0 ? k % 4 : (k + 1) % 4) || (i == 1 && k % 2 == 0));
        }
    }
    /* step k + 1 submitted (masks later) before step k is waited for; its masks after that wait */
    vki_step_plan cur = masked_plan(ss, a, 0, false, &sp, m, NULL);
    assert_int_equal(vk_engine_submit(e, &cur), VKI_OK);
    for (uint32_t k = 1; k <= N; k++) {
        for (uint32_t i = 0; i < 2; i++)
            a[i]->done++;
        vki_step_seq *nx = k % 2 ? st : ss;
        vki_step_plan next = masked_plan(nx, a, k, true, &sp, live, live);
        memcpy(live, m + ((k + 2) % 4) * W, W * 4); /* what the submit sees: not the step's masks */
        if (k < N) {
            assert_int_equal(vk_engine_submit_masks_later(e, &next), VKI_OK);
            assert_int_equal(vk_engine_submit(e, &next), VKI_ERR_INVALID_ARG); /* masks due */
        }
        assert_int_equal(vk_engine_wait(e, outs, NULL), VKI_OK);
        for (uint32_t i = 0; i < 2; i++) {
            lp[0][i][k - 1] = outs[i].logprob;
            a[i]->tok[a[i]->n++] = outs[i].token;
        }
        if (k < N) {
            memcpy(live, m + (k % 4) * W, W * 4);   /* row 0: its buffer refilled */
            nx[1].token_mask = nx[1].token_mask ? m + ((k + 1) % 4) * W : NULL; /* row 1: moved */
            assert_int_equal(vk_engine_submit_masks(e, &next), VKI_OK);
        }
    }
    for (uint32_t i = 0; i < 2; i++)
        if (memcmp(a[i]->tok, b[i]->tok, (24 + 1 + N) * 4) || memcmp(lp[0][i], lp[1][i], N * sizeof(float)))
            fail_msg("sequence %u: masks given after the submit sampled other tokens or logprobs", i);
    fprintf(stderr, "  masks given after the submit = host-fed steps, bit for bit (%u steps x 2 rows)\n", N);
    /* refusals */
    assert_int_equal(vk_engine_submit_masks(e, &cur), VKI_OK); /* none due: nothing to do */
    vki_step_plan last = masked_plan(ss, a, 0, false, &sp, live, NULL);
    memcpy(live, m, W * 4);
    assert_int_equal(vk_engine_submit_masks_later(e, &last), VKI_OK);
    assert_int_equal(vk_engine_submit(e, &last), VKI_ERR_INVALID_ARG);   /* before its masks */
    ss[1].token_mask = m + W;                                           /* a row gained a mask */
    assert_int_equal(vk_engine_submit_masks(e, &last), VKI_ERR_INVALID_ARG);
    memcpy(live, m + W, W * 4);
    assert_int_equal(vk_engine_wait(e, outs, NULL), VKI_OK);
    assert_int_equal(outs[0].token % 4, 0);                              /* the submit's mask */
    ss[1].token_mask = NULL;
    memcpy(live, m + 2 * W, W * 4);
    assert_int_equal(vk_engine_submit_masks_later(e, &last), VKI_OK);
    memcpy(live, m + 3 * W, W * 4);
    assert_int_equal(vk_engine_wait(e, outs, NULL), VKI_OK);             /* never given */
    assert_int_equal(outs[0].token % 4, 2);
    assert_int_equal(e->n_pending, 0);
    for (uint32_t i = 0; i < 2; i++) {
        free(a[i]->tok);
        free(b[i]->tok);
    }
    free(m);
    free(live);
    fixture_close(&fx);
    unlink(path);
    vt_assert_clean(g);
}

/* Whole-prompt prefill and chunked prefill give the same logits (and the same next token). */
static void test_chunked_prefill_equals_whole(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("chunked prefill");
    const shape_case *c = &SHAPES[1];
    char path[256];
    write_model(c, path, sizeof path);
    fixture fx;
    fixture_open(g, path, VKI_GGML_F16, 256, &fx);
    int32_t prompt[200];
    random_prompt(&r, prompt, 200, fx.n_vocab);
    const uint32_t chunks[] = {200, 64, 33, 16, 5, 1};
    float *first = malloc(fx.n_vocab * sizeof *first), *got = malloc(fx.n_vocab * sizeof *got);
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        tseq s;
        tseq_init(&s, (uint32_t)k % 8, prompt, 200, 202);
        tseq *ps = &s;
        float *lg[1] = {k ? got : first};
        while (s.done < 200) {
            uint32_t n_new = 200 - s.done < chunks[k] ? 200 - s.done : chunks[k];
            step(&fx, &ps, &n_new, 1, s.done + n_new == 200 ? lg : NULL);
        }
        if (k) {
            char l[64];
            snprintf(l, sizeof l, "chunk %u vs whole", chunks[k]);
            /* F16 KV: a chunk's K/V rows come from the GEMV or the GEMM by its size, and a last-bit
             * difference can round to another F16 value; over 29 seeds the worst was 1.07e-9
             * (seed 19977688675532, which failed the earlier 1e-9 bound), most 1e-10..7e-10 */
            vt_assert_nmse(got, first, fx.n_vocab, 1e-8, l);
            fprintf(stderr, "  chunk %3u vs whole prompt: NMSE %.2e\n", chunks[k], vt_nmse(got, first, fx.n_vocab));
        }
        free(s.tok);
    }
    free(first);
    free(got);
    fixture_close(&fx);
    unlink(path);
    vt_assert_clean(g);
}

/* A ragged batch: A prefills in chunks while B and C decode in the same steps; every logits row
 * matches the reference run of that sequence alone. */
static void test_ragged_batch(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("ragged");
    const shape_case *c = &SHAPES[2];
    char path[256];
    write_model(c, path, sizeof path);
    fixture fx;
    fixture_open(g, path, VKI_GGML_F32, 64, &fx);
    int32_t pa[60], pb[9], pc[23];
    random_prompt(&r, pa, 60, fx.n_vocab);
    random_prompt(&r, pb, 9, fx.n_vocab);
    random_prompt(&r, pc, 23, fx.n_vocab);
    tseq A, B, C;
    tseq_init(&A, 3, pa, 60, 80);
    tseq_init(&B, 5, pb, 9, 40);
    tseq_init(&C, 6, pc, 23, 40);
    tseq *seqs[3] = {&A, &B, &C};
    float *la = malloc(fx.n_vocab * 4), *lb = malloc(fx.n_vocab * 4), *lc = malloc(fx.n_vocab * 4);
    float *want = malloc(fx.n_vocab * 4);
    float *lg[3] = {la, lb, lc};
    uint32_t first[3] = {0, 9, 23};
    step(&fx, seqs + 1, first + 1, 2, lg + 1); /* B and C prefill together */
    double worst = 0;
    for (int t = 0; A.done < 60 || t < 12; t++) {
        uint32_t n_new[3] = {A.done < 60 ? (60 - A.done < 13 ? 60 - A.done : 13) : 1, 1, 1};
        if (A.done == A.n)
            n_new[0] = 0; /* A already has its token pending? never: A.n grows only when sampled */
        step(&fx, seqs, n_new, 3, lg);
        for (int i = 0; i < 3; i++) {
            tseq *s = seqs[i];
            if (s->done != s->n - 1)
                continue; /* A mid-prefill: nothing sampled this step */
            assert_int_equal(ref_model_forward(fx.ref, s->tok, s->done, false, want), VKI_OK);
            double e = vt_nmse(lg[i], want, fx.n_vocab);
            worst = e > worst ? e : worst;
            vt_assert_nmse(lg[i], want, fx.n_vocab, TOL_F32, "ragged batch");
        }
    }
    fprintf(stderr, "  ragged batch (A prefilling while B, C decode): worst NMSE %.2e\n", worst);
    free(A.tok); free(B.tok); free(C.tok);
    free(la); free(lb); free(lc); free(want);
    fixture_close(&fx);
    unlink(path);
    vt_assert_clean(g);
}

/* A context of 2048 tokens, the model's whole context, on stories260K (trained at 512). */
static void test_long_context(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512];
    if (!vt_shared_model("stories260K.gguf", path, sizeof path))
        skip();
    vt_rng r = vt_rng_seeded("long context");
    fixture fx;
    fixture_open(g, path, VKI_GGML_F32, 512, &fx);
    /* + 2 decoded: the full 2048-token context; 512 in the quick mode (the sanitizer pass: the
     * same code, a quarter of the positions) */
    uint32_t N = vt_quick() ? 510 : 2046;
    int32_t *prompt = malloc(N * sizeof *prompt);
    prompt[0] = 1;
    random_prompt(&r, prompt + 1, N - 1, fx.n_vocab);
    char label[64];
    snprintf(label, sizeof label, "stories260K %u-token context", N + 2);
    check_against_reference(&fx, prompt, N, 2, 512, TOL_F32, label);
    free(prompt);
    fixture_close(&fx);
    vt_assert_clean(g);
}

/* Batch-invariant engines: a sequence's logits are bitwise the same decoded alone, prefilled in
 * chunks inside a ragged batch next to other sequences, and recomputed in one prefill after a
 * "pause" (what MAX_UTILIZATION does); also on the integer-dot path (each row quantised alone). */
static void invariance_case(vt_gpu *g, const char *path, uint32_t kv_type, bool int_dot, const char *label)
{
    fixture fx;
    vk_engine_params p = test_params(kv_type, 128);
    p.batch_invariant = true;
    p.int_dot = int_dot;
    fixture_open_engine(g, path, &p, &fx);
    vt_rng r = {99};
    enum { NP = 37, ND = 6 };
    int32_t prompt[NP], other[50];
    random_prompt(&r, prompt, NP, fx.n_vocab);
    random_prompt(&r, other, 50, fx.n_vocab);
    size_t V = fx.n_vocab;
    float *alone = malloc((ND + 1) * V * sizeof(float)), *got = malloc(V * sizeof(float));
    /* A: alone, whole prompt then decode */
    tseq a;
    tseq_init(&a, 0, prompt, NP, NP + ND + 2);
    tseq *pa = &a;
    float *lg[2];
    uint32_t n_new = NP;
    lg[0] = alone;
    step(&fx, &pa, &n_new, 1, lg);
    for (int i = 1; i <= ND; i++) {
        n_new = 1;
        lg[0] = alone + i * V;
        step(&fx, &pa, &n_new, 1, lg);
    }
    /* B: chunks of 5 while another sequence prefills then decodes in the same steps */
    tseq b, o;
    tseq_init(&b, 1, prompt, NP, NP + ND + 2);
    tseq_init(&o, 2, other, 50, 80);
    tseq *pb[2] = {&b, &o};
    int k = 0;
    while (k <= ND) {
        uint32_t nn[2] = {b.done < NP ? (NP - b.done < 5 ? NP - b.done : 5) : 1,
                          o.done < 50 ? (50 - o.done < 9 ? 50 - o.done : 9) : 1};
        float *l2[2] = {got, NULL};
        step(&fx, pb, nn, 2, l2);
        if (b.done == b.n - 1) { /* b produced a token this step */
            if (memcmp(got, alone + k * V, V * sizeof(float)))
                fail_msg("%s: logits at decode step %d differ in a ragged batch (NMSE %.3g)", label, k,
                         vt_nmse(got, alone + k * V, V));
            k++;
        }
    }
    assert_memory_equal(a.tok, b.tok, (NP + ND + 1) * sizeof(int32_t));
    /* C: "resumed": prompt + generated tokens recomputed in one prefill */
    tseq c;
    tseq_init(&c, 3, a.tok, NP + ND, NP + ND + 2);
    tseq *pc = &c;
    n_new = NP + ND;
    lg[0] = got;
    step(&fx, &pc, &n_new, 1, lg);
    if (memcmp(got, alone + ND * V, V * sizeof(float)))
        fail_msg("%s: recomputed logits differ (NMSE %.3g)", label, vt_nmse(got, alone + ND * V, V));
    fprintf(stderr, "  %-34s bitwise equal alone / ragged chunks / recomputed\n", label);
    free(a.tok); free(b.tok); free(o.tok); free(c.tok);
    free(alone);
    free(got);
    fixture_close(&fx);
}

static void test_batch_invariant_mode(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512];
    if (vt_shared_model("stories260K.gguf", path, sizeof path))
        invariance_case(g, path, VKI_GGML_F16, false, "stories260K f16 kv");
    const shape_case *c = &SHAPES[6]; /* Q4_K_M */
    char syn[256];
    write_model(c, syn, sizeof syn);
    invariance_case(g, syn, VKI_GGML_F16, false, "synthetic q4_k_m f16 kv");
    if (op_matmul_i8_supported(g->dev, VKI_GGML_Q4_K))
        invariance_case(g, syn, VKI_GGML_F16, true, "synthetic q4_k_m f16 kv, int_dot");
    unlink(syn);
    vt_assert_clean(g);
}

/* The profile: a Chrome trace with one event per dispatch, named "layer L / role / kernel",
 * categorised by step, one track (tid) per step phase; and the summary table. */
static void check_trace(const char *buf)
{
    cJSON *arr = cJSON_Parse(buf);
    if (!arr)
        fail_msg("trace is not JSON: %.200s", buf);
    int n = cJSON_GetArraySize(arr), tracks = 0, layer0 = 0, attn = 0, dispatches = 0;
    bool tids[16] = {0}, roles[5] = {0}; /* stories260K's q|k|v and gate|up are one matrix each */
    static const char *const layer0_roles[5] = {"layer 0 / attn_qkv / ", "layer 0 / attn_kv_write / ",
                                                "layer 0 / attn_o / ", "layer 0 / ffn_gate_up / ",
                                                "layer 0 / ffn_down / "};
    for (int i = 0; i < n; i++) {
        cJSON *ev = cJSON_GetArrayItem(arr, i);
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "name"));
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "ph"));
        assert_non_null(name);
        assert_non_null(ph);
        if (!strcmp(ph, "M")) { /* track names */
            tracks += !strcmp(name, "thread_name");
            continue;
        }
        const char *cat = cJSON_GetStringValue(cJSON_GetObjectItem(ev, "cat"));
        assert_non_null(cat);
        assert_int_equal(strncmp(cat, "step ", 5), 0);
        assert_null(strstr(name, "step "));
        assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(ev, "dur")) >= 0);
        int tid = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ev, "tid"));
        assert_true(tid >= 1 && tid < 16);
        tids[tid] = true;
        dispatches++;
        layer0 += !strncmp(name, "layer 0 / ", 10);
        attn += strstr(name, " / attn / attn_") != NULL;
        for (int r = 0; r < 5; r++)
            roles[r] |= !strncmp(name, layer0_roles[r], strlen(layer0_roles[r]));
    }
    assert_int_equal(tracks, 6); /* other, embed, attention, ffn, lm head, sample */
    assert_true(dispatches > 2 * 5 * 8); /* two steps of 5 layers, over 8 dispatches each (fused) */
    assert_true(layer0 > 5 && attn >= 2 * 5);
    for (int r = 0; r < 5; r++)
        if (!roles[r])
            fail_msg("no event named %s...", layer0_roles[r]);
    int used = 0;
    for (int t = 0; t < 16; t++)
        used += tids[t];
    assert_int_equal(used, 5); /* embed, attention, ffn, lm head, sample: nothing left unnamed */
    fprintf(stderr, "  profile: %d dispatch events in 2 steps on %d tracks\n", dispatches, used);
    cJSON_Delete(arr);
}

static void test_profile_trace(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512], trace[128];
    if (!vt_shared_model("stories260K.gguf", path, sizeof path))
        skip();
    snprintf(trace, sizeof trace, "/tmp/vki_test_trace_%d.json", (int)getpid());
    fixture fx;
    vk_engine_params p = test_params(VKI_GGML_F16, 64);
    p.profile_path = trace;
    fixture_open_p(g, path, &p, &fx);
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    tseq s;
    tseq_init(&s, 0, prompt, 5, 16);
    tseq *ps = &s;
    uint32_t n_new = 5;
    step(&fx, &ps, &n_new, 1, NULL);
    n_new = 1;
    step(&fx, &ps, &n_new, 1, NULL);
    /* the summary: top rows by GPU time; the size contract of a small buffer */
    char table[4096], small[16];
    size_t len = 0, need = 0;
    assert_int_equal(vk_profile_summary(&fx.e->prof, 3, table, sizeof table, &len), VKI_OK);
    assert_int_equal(vk_profile_summary(&fx.e->prof, 3, small, sizeof small, &need), VKI_ERR_INVALID_ARG);
    assert_int_equal(need, len);
    assert_non_null(strstr(table, "2 steps"));
    /* a table per kind of step, decode first: the prompt's step and the decode step apart */
    const char *dec = strstr(table, "\ndecode steps (one token per sequence): 1, ");
    const char *pro = strstr(table, "\nsteps with prompt tokens: 1, ");
    assert_true(dec && pro && dec < pro);
    int rows = 0;
    for (const char *l = strchr(table, '\n'); l && l[1]; l = strchr(l + 1, '\n'))
        rows++;
    assert_int_equal(rows, 2 * (2 + 3)); /* per kind: its steps, the column header and three rows */
    /* every dispatch in one row or another: the prompt step's rows count its 5-token products */
    vk_profile_row *r = fx.e->prof.rows;
    uint64_t calls[VK_PROFILE_KINDS] = {0};
    for (uint32_t i = 0; i < fx.e->prof.n_rows; i++)
        calls[r[i].kind] += r[i].calls;
    assert_true(calls[VK_PROFILE_DECODE] > 8 && calls[VK_PROFILE_PROMPT] >= calls[VK_PROFILE_DECODE]);
    fprintf(stderr, "%s", table);
    fixture_close(&fx); /* closes the trace */
    FILE *f = fopen(trace, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    unlink(trace);
    check_trace(buf);
    free(s.tok);
    vt_assert_clean(g);
}

/* ---- KV sizing from the memory budget ------------------------------------------------------- */

/* A stand-in for vkGetPhysicalDeviceMemoryProperties2 on a driver with VK_EXT_memory_budget
 * (lavapipe has none): the real heaps, a fixed budget, and as usage what this device holds in
 * blocks plus `external` (other engines, processes, the application's renderer). */
static struct {
    vkd_device *dev;
    uint64_t budget, external;
} g_budget;

static VKAPI_ATTR void VKAPI_CALL fake_memory_properties2(VkPhysicalDevice pd, VkPhysicalDeviceMemoryProperties2 *p)
{
    VkPhysicalDeviceMemoryProperties2 real = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
    vkGetPhysicalDeviceMemoryProperties2(pd, &real); /* no budget struct: the driver lacks it */
    p->memoryProperties = real.memoryProperties;
    for (VkBaseOutStructure *s = p->pNext; s; s = s->pNext)
        if (s->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT) {
            VkPhysicalDeviceMemoryBudgetPropertiesEXT *b = (void *)s;
            for (uint32_t h = 0; h < real.memoryProperties.memoryHeapCount; h++) {
                b->heapBudget[h] = g_budget.budget;
                b->heapUsage[h] = g_budget.dev->heap_block_bytes[h] + g_budget.external;
            }
        }
}

/* What our buffers hold in the heap the KV cache is sized against (the first device-local
 * type's): every buffer on a unified-memory device (lavapipe: one heap), the device-local ones
 * on a discrete GPU, whose host-visible buffers sit in the system heap (the first H200 run). */
static uint64_t device_buffers(const vkd_device *d)
{
    for (uint32_t t = 0; t < d->mem_props.memoryTypeCount; t++)
        if (d->mem_props.memoryTypes[t].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)
            return d->heap_buffer_bytes[d->mem_props.memoryTypes[t].heapIndex];
    return d->heap_buffer_bytes[0];
}

/* The KV cache an engine got against what it should get: kv_fraction of (budget - external -
 * every buffer in the heap when it sized its KV), in whole pages (< 1/64 short). */
static void check_kv(const fixture *fx, uint64_t external, const char *what)
{
    uint64_t before_kv = device_buffers(fx->g->dev) - fx->e->kv_bytes;
    double want = 0.8 * (double)(g_budget.budget - external - before_kv);
    fprintf(stderr, "  %-38s KV %6.1f MiB, wanted %6.1f MiB\n", what, fx->e->kv_bytes / 1048576.0, want / 1048576.0);
    assert_true((double)fx->e->kv_bytes <= want && (double)fx->e->kv_bytes >= want * (1 - 1.0 / 64));
}

/* Sizing reads the budget and the usage when the engine is made: a second engine on the device
 * gets kv_fraction of what the first left, and memory used elsewhere counts too. */
static void test_kv_sizing_budget(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512];
    if (!vt_shared_model("stories260K.gguf", path, sizeof path))
        skip();
    vkd_fns saved_fn = g->dev->fn;
    bool saved_budget = g->dev->info.memory_budget;
    g->dev->fn.memory_properties2 = fake_memory_properties2;
    g->dev->info.memory_budget = true;
    g_budget.dev = g->dev;
    g_budget.budget = device_buffers(g->dev) + (128ull << 20);
    g_budget.external = 0;
    vk_engine_params p = test_params(VKI_GGML_F16, 64);
    p.kv_tokens = 0;   /* from memory */
    p.max_seqs = 256;  /* 320 MiB for every slot at full context: the budget decides */
    fixture a, b, c;
    fixture_open_p(g, path, &p, &a);
    check_kv(&a, 0, "first engine");
    fixture_open_p(g, path, &p, &b);
    check_kv(&b, 0, "second engine, the first alive");
    assert_true(b.e->kv_bytes < a.e->kv_bytes / 2);
    uint64_t a_kv = a.e->kv_bytes;
    fixture_close(&b);
    fixture_close(&a);
    g_budget.external = 24ull << 20;
    fixture_open_p(g, path, &p, &c);
    check_kv(&c, g_budget.external, "alone, 24 MiB used elsewhere");
    assert_true(c.e->kv_bytes < a_kv - (16ull << 20)); /* 0.8 * 24 MiB less, give or take a page */
    fixture_close(&c);
    g->dev->fn = saved_fn;
    g->dev->info.memory_budget = saved_budget;
    vt_assert_clean(g);
}

/* The cooperative-matrix path end to end: whole prompts longer than the GEMV
 * crossover put every projection, the FFN and the prefill attention on the F16-operand kernels
 * (then decode runs the GEMV and split-K kernels as usual). Logits against the double
 * reference: NMSE <= TOL_CM; the greedy token is the reference's unless the reference itself
 * has a near tie (within 1% of the logits' rms). */
#define TOL_CM 5e-6 /* measured on lavapipe: <= 1.6e-6 over seeds 1-120 (p99 1.3e-6) */
#define TIE_F16 0.01 /* check_argmax's near tie for the paths with F16 operands */

static void coopmat_vs_reference(vt_gpu *g, vt_rng *r)
{
    const shape_case cases[] = {
        {"cm_gqa2_hd64_q4km", "llama", 256, 4, 2, 64, 512, SYNTH_Q4_K_M, false, VKI_GGML_F16, TOL_CM},
        {"cm_qwen2_hd128_f16", "qwen2", 256, 2, 1, 128, 512, SYNTH_F16, true, VKI_GGML_F32, TOL_CM},
    };
    uint32_t np = op_matmul_gemv_max_m(g->dev) + vt_range(r, 9, 40);
    int32_t prompt[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        write_model(&cases[i], path, sizeof path);
        fixture fx;
        fixture_open(g, path, cases[i].kv_type, 128, &fx);
        vkk_id k = fx.e->attn[0].pre_kid; /* prefill attention really is on cooperative matrices */
        assert_true(k >= VKK_ATTN_PREFILL_CM_F16 && k <= VKK_ATTN_PREFILL_CME_Q8_0);
        random_prompt(r, prompt, np, fx.n_vocab);
        check_against_reference_tie(&fx, prompt, np, 3, np, cases[i].tol, TIE_F16, cases[i].label);
        fixture_close(&fx);
        unlink(path);
    }
}

/* Context logits (a logits_sink over the prompt's rows), [row][V]. */
typedef struct ctx_got {
    float *rows;
    uint32_t cap, n;
} ctx_got;

static void ctx_sink(void *ctx, const float *rows, uint32_t n_rows, uint32_t n_vocab, uint32_t pos0, bool sampled)
{
    ctx_got *g = ctx;
    if (sampled || pos0 + n_rows > g->cap)
        return;
    memcpy(g->rows + (size_t)pos0 * n_vocab, rows, (size_t)n_rows * n_vocab * sizeof(float));
    g->n += n_rows;
}

/* X rounded to F16 once before each prefill GEMM (op_half_x; the default where the device has a
 * cooperative-matrix path) against the GEMM converting it in every tile (kernel_config gemm_xh=0):
 * the same logits bit for bit after a prefill above the crossover (its sampled row and every
 * prompt row's context logits, the LM head over all of them on the GEMM too) and two decode
 * steps, with per_layer conversion dispatches per layer more in the step (1: the output
 * projection's input; Q|K|V's and gate|up's, or a mixture of experts' token rows, come from their
 * norms, down's or the experts' gated rows from the gated unit); and the same bits op by op
 * (no_fusion: every input through its own half_x pass). */
static void xh_bitwise(vt_gpu *g, vt_rng *r, const char *path, uint32_t kv_type, const char *label,
                       uint32_t per_layer)
{
    enum { NF = 3 }; /* F16 X fused (the default), the per-tile conversion, F16 X op by op */
    fixture fx[NF];
    vk_engine_params p = test_params(kv_type, 128);
    p.max_seqs = 64; /* context logits: 64 rows per LM-head pass, past the crossover */
    for (int f = 0; f < NF; f++) {
        p.no_fusion = f == 2;
        fixture_open_engine(g, path, &p, &fx[f]);
    }
    const uint32_t V = fx[0].n_vocab, np = op_matmul_gemv_max_m(g->dev) + vt_range(r, 5, 30), nd = 2;
    int32_t prompt[96];
    random_prompt(r, prompt, np, V);
    tseq s[NF];
    float *lg[NF];
    ctx_got cg[NF];
    uint32_t disp[NF] = {0};
    for (int f = 0; f < NF; f++) {
        tseq_init(&s[f], 1, prompt, np, np + nd + 1);
        lg[f] = malloc(V * sizeof(float));
        cg[f] = (ctx_got){malloc((size_t)np * V * sizeof(float)), np, 0};
    }
    for (uint32_t it = 0; it <= nd; it++) {
        for (int f = 0; f < NF; f++) {
            g->dev->cm_x32 = f == 1; /* read while recording: each engine keeps its own */
            tseq *ps = &s[f];
            if (it) {
                uint32_t n_new = 1;
                float *out[1] = {lg[f]};
                step(&fx[f], &ps, &n_new, 1, out);
                continue;
            }
            vki_step_seq ss = {.slot = ps->slot, .n_new = np, .tokens = ps->tok, .n_pages = PAGES_PER_SEQ,
                               .pages = ps->pages, .want_token = true, .logits_sink = ctx_sink,
                               .logits_sink_ctx = &cg[f], .sink_rows_end = np};
            vki_step_plan plan = {.n_seqs = 1, .seqs = &ss, .n_tokens = np};
            vki_step_out out;
            assert_int_equal(vk_engine_step(fx[f].e, &plan, &out, lg[f]), VKI_OK);
            disp[f] = fx[f].e->last_dispatches;
            ps->done = np;
            ps->tok[ps->n++] = out.token;
        }
        for (int f = 1; f < NF; f++)
            if (memcmp(lg[0], lg[f], V * sizeof(float)))
                fail_msg("%s: step %u: logits with F16 X (fused) differ from %s (NMSE %.3g)", label, it,
                         f == 1 ? "the GEMM's own conversion" : "F16 X op by op", vt_nmse(lg[0], lg[f], V));
    }
    g->dev->cm_x32 = false;
    for (int f = 0; f < NF; f++) {
        assert_int_equal(cg[f].n, np);
        if (f && memcmp(cg[0].rows, cg[f].rows, (size_t)np * V * sizeof(float)))
            fail_msg("%s: context logits with F16 X (fused) differ from %s (NMSE %.3g)", label,
                     f == 1 ? "the GEMM's own conversion" : "F16 X op by op",
                     vt_nmse(cg[0].rows, cg[f].rows, (size_t)np * V));
    }
    const uint32_t n_layer = fx[0].e->model.hp.n_layer;
    if (disp[0] != disp[1] + per_layer * n_layer)
        fail_msg("%s: prefill of %u tokens took %u dispatches with F16 X, %u without (want %u per layer more)", label,
                 np, disp[0], disp[1], per_layer);
    fprintf(stderr, "  %-30s F16 X once: bitwise equal over %u + %u tokens (also op by op), prefill %u -> %u "
            "dispatches\n", label, np, nd, disp[1], disp[0]);
    for (int f = 0; f < NF; f++) {
        free(s[f].tok);
        free(lg[f]);
        free(cg[f].rows);
        fixture_close(&fx[f]);
    }
}

/* The emulated path everywhere (also with split-K, and with X in F16 against F32); the real NV
 * path too where the device has it (split as the device's SM count says). */
static void test_coopmat_vs_reference(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vkd_cm saved = g->dev->cm;
    vt_rng r = vt_rng_seeded("engine coopmat");
    if (vkd_coopmat_select(g->dev, VKI_COOPMAT_EMULATED) != VKI_OK)
        skip();
    coopmat_vs_reference(g, &r);
    /* split-K forced (lavapipe reports no compute units, so nothing splits by itself): every
     * prefill GEMM in two K splits, the Q, K, V and gate, up projections recorded back to back
     * through their own scratch slots, steps recorded again and reused */
    g->dev->cm_split = 2;
    assert_int_equal(op_matmul_cm_splits(g->dev, 64, 256, 256), 2);
    coopmat_vs_reference(g, &r);
    g->dev->cm_split = 0;
    const shape_case xc = {"cm_xh_q4km", "llama", 256, 4, 2, 64, 512, SYNTH_Q4_K_M, false, VKI_GGML_F16, TOL_CM};
    char path[256];
    write_model(&xc, path, sizeof path);
    xh_bitwise(g, &r, path, xc.kv_type, xc.label, 1);
    if (g->dev->nv_coopmat && vkd_coopmat_select(g->dev, VKI_COOPMAT_AUTO) == VKI_OK) {
        coopmat_vs_reference(g, &r);
        xh_bitwise(g, &r, path, xc.kv_type, xc.label, 1);
    } else {
        fprintf(stderr, "  no VK_NV_cooperative_matrix on this device: only the emulated path ran\n");
    }
    unlink(path);
    g->dev->cm = saved;
    vt_assert_clean(g);
}

/* ---- mixtures of experts --------------------------------------------------------------------- */

/* Synthetic qwen3moe, gpt-oss and Mixtral-style (llama with experts) models with their real head dims and
 * GQA ratios (Qwen3-30B-A3B: hd 128, 8:1; Mixtral: hd 128 → 64 here, 4:1), many experts of which
 * few run, 2 layers, d 256. gemv_max_m 1 puts every chunk with more than one pair per expert on
 * average through the grouped GEMM (moe_group + matmul_id); otherwise lavapipe's crossover (64)
 * keeps these small batches on the matrix-vector kernel over the chosen experts. */
typedef struct moe_case {
    const char *label, *arch;
    uint32_t n_head, n_kv, head_dim, ff_exp, n_expert, n_used;
    synth_wtype wtype;
    uint32_t kv_type, gemv_max_m, chunk;
    bool coopmat;             /* the emulated cooperative-matrix path (matmul_cme_id) */
    double tol;
    uint32_t ff_shexp;        /* granitemoe: a shared expert of this length (0: none) */
} moe_case;

static const moe_case MOE_CASES[] = {
    /* label                   arch        H  KV hd   ff   E   k  weights       kv            gemv chunk cm  tol
     * shared ff */
    {"qwen3moe e32k4 f32",    "qwen3moe", 8, 1, 128, 96,  32, 4, SYNTH_F32,    VKI_GGML_F32, 0, 7,  false, TOL_F32, 0},
    {"qwen3moe q4_k_m gemm",  "qwen3moe", 8, 1, 128, 256, 32, 4, SYNTH_Q4_K_M, VKI_GGML_F32, 1, 40, false, TOL_F32, 0},
    {"mixtral e8k2 q8_0",     "llama",    8, 2, 64,  512, 8,  2, SYNTH_Q8_0,   VKI_GGML_F32, 0, 7,  false, TOL_F32, 0},
    {"mixtral q4_0 gemm f16kv", "llama",  8, 2, 64,  512, 8,  2, SYNTH_Q4_0,   VKI_GGML_F16, 1, 40, false, TOL_F16KV, 0},
    {"qwen3moe iq4_xs cme",   "qwen3moe", 8, 1, 128, 256, 16, 4, SYNTH_IQ4_XS, VKI_GGML_F32, 1, 40, true,  TOL_CM, 0},
    /* llama-quantize's MXFP4_MOE: MXFP4 experts (gpt-oss's format), Q8_0 elsewhere */
    {"qwen3moe mxfp4_moe gemm", "qwen3moe", 8, 1, 128, 256, 32, 4, SYNTH_MXFP4_MOE, VKI_GGML_F32, 1, 40, false,
     TOL_F32, 0},
    /* gpt-oss (its head dim 64; GQA 4:1 here, 8:1 in gpt-oss-20b): sink logits, Q/K/V/O biases,
     * router and expert biases, swiglu_oai, YaRN, a window of 16 on layer 0 (write_moe_model) */
    {"gpt-oss e32k4 f32",     "gpt-oss",  8, 2, 64,  128, 32, 4, SYNTH_F32,    VKI_GGML_F32, 0, 7,  false, TOL_F32, 0},
    {"gpt-oss mxfp4_moe gemm f16kv", "gpt-oss", 8, 2, 64, 256, 32, 4, SYNTH_MXFP4_MOE, VKI_GGML_F16, 1, 40, false,
     TOL_F16KV, 0},
    {"gpt-oss q8_0 cme",      "gpt-oss",  8, 2, 64,  256, 16, 4, SYNTH_Q8_0,   VKI_GGML_F32, 1, 40, true,  TOL_CM, 0},
    /* granitemoe (granite-3.1-1b-a400m: 32 experts of 512 using 8, hd 64, GQA 2:1; here 16 of
     * 128 using 4): granite's multipliers; GraniteMoeShared's shared expert (it reads the int8 /
     * F16 copies of h the experts read; its down projection writes the next layer's norm) */
    {"granitemoe e16k4 q8_0", "granitemoe", 8, 4, 64, 128, 16, 4, SYNTH_Q8_0, VKI_GGML_F32, 0, 7, false, TOL_F32, 0},
    {"granitemoe shared q4_k_m gemm", "granitemoe", 8, 4, 64, 128, 16, 4, SYNTH_Q4_K_M, VKI_GGML_F32, 1, 40, false,
     TOL_F32, 192},
    {"granitemoe shared q8_0 cme", "granitemoe", 8, 4, 64, 128, 16, 4, SYNTH_Q8_0, VKI_GGML_F32, 1, 40, true, TOL_CM,
     256},
};
/* Measured worst logits NMSE: 5e-13 (F32 KV), 1.8e-9 (F16 KV), 2.5e-6 (emulated tensor cores). */

/* The tensor-core path rounds operands to F16, so its router sees activations ~1e-3 off the
 * reference's (router logits ~2e-3 off at std ~2): where two experts' logits are that close it
 * may choose the other one, and the logits then differ by far more than rounding (one such flip
 * gave NMSE 2e-5; one at a decode position, when only the prompt was screened, 2.4e-3: seed
 * 127742713123812, gap 1.4e-4). So the sequence the check will run is screened whole: the prompt
 * and the reference's greedy continuation of MOE_DECODE tokens (which the engine must follow:
 * each of them leads the runner-up by at least TIE_F16, so check_argmax admits no other), and
 * its smallest routing gap must be at least ROUTE_MARGIN, 7x the router's error. Prompts are
 * drawn until one passes (1 to 22 draws in 7 runs, each draw at most MOE_DECODE + 1 reference
 * forwards of <= 27 tokens; the case takes ~5 s). Measured with it: NMSE <= 1.2e-6 over those
 * 7 runs (2.5e-6 over 10 runs with the prompt screened alone). */
#define ROUTE_MARGIN 0.015
/* int_dot: the activations' int8 rounding reaches the router's input through the dense
 * projections and the first layer's experts (the logits' NMSE against the float engine ~5e-4,
 * ~2% relative, router logits ~0.04 off at std ~2): gaps of 0.024 and of 0.064 (seed
 * 116481309259402, NMSE 0.235 at that step) flipped at 0.05. At 0.15 over prompts of 8..12
 * tokens (fewer routing choices to screen) a prompt took 2 to 339 draws in 15 runs (~17 s) */
#define ROUTE_MARGIN_I8 0.15
#define MOE_DRAWS 256
#define MOE_DRAWS_I8 2048
#define MOE_DECODE 3
#define MOE_PROMPT_MAX 40

/* A prompt of np_lo..np_hi tokens (screened: c->coopmat) whose smallest routing gap over it and
 * the reference's greedy continuation is at least route_margin, in at most `draws` draws. */
static uint32_t moe_prompt(fixture *fx, vt_rng *r, const moe_case *c, double route_margin, uint32_t np_lo,
                           uint32_t np_hi, int draws, int32_t *prompt)
{
    float *tmp = malloc(fx->n_vocab * sizeof *tmp);
    int32_t seq[MOE_PROMPT_MAX + MOE_DECODE];
    uint32_t np = 0;
    for (int tries = 0; tries < draws; tries++) {
        np = vt_range(r, np_lo, np_hi);
        random_prompt(r, prompt, np, fx->n_vocab);
        if (!c->coopmat)
            break;
        memcpy(seq, prompt, np * sizeof *seq);
        double margin = INFINITY; /* each forward's covers every position of the ones before */
        bool ok = true;
        for (uint32_t i = 0; i <= MOE_DECODE && ok; i++) {
            assert_int_equal(ref_model_forward(fx->ref, seq, np + i, false, tmp), VKI_OK);
            margin = ref_model_route_margin(fx->ref);
            uint32_t next;
            ok = margin >= route_margin && (i == MOE_DECODE || top2_gap(tmp, fx->n_vocab, &next) >= TIE_F16);
            if (ok && i < MOE_DECODE)
                seq[np + i] = (int32_t)next;
        }
        if (ok) {
            fprintf(stderr, "  %-34s routing margin %.3f over prompt and continuation (draw %d)\n", c->label, margin,
                    tries + 1);
            break;
        }
        if (tries == draws - 1)
            fail_msg("%s: no prompt without a routing or greedy near tie in %d draws", c->label, draws);
    }
    free(tmp);
    return np;
}

static void write_moe_model(const moe_case *c, char *path, size_t n)
{
    synth_params p = synth_default_params();
    p.arch = c->arch;
    p.n_layer = 2, p.d_model = 256, p.n_head = c->n_head, p.n_head_kv = c->n_kv, p.head_dim = c->head_dim;
    p.n_expert = c->n_expert, p.n_expert_used = c->n_used;
    p.d_ff = c->ff_exp, p.d_ff_exp = strcmp(c->arch, "llama") ? c->ff_exp : 0;
    p.wtype = c->wtype, p.n_vocab = 512, p.n_ctx = 4096, p.seed = 77, p.d_ff_shexp = c->ff_shexp;
    if (!strcmp(c->arch, "granitemoe")) {
        assert_int_equal(synth_arch_defaults(&p), VKI_OK); /* Granite 3's multipliers */
        p.d_ff_exp = 0;
    }
    if (!strcmp(c->arch, "qwen3moe"))
        p.rope_base = 1000000.0f, p.rms_eps = 1e-6f;
    if (!strcmp(c->arch, "gpt-oss")) /* its base and YaRN; a window the prompts pass (layer 0 slides) */
        p.rope_base = 150000.0f, p.yarn_factor = 4.0f, p.n_ctx_orig = 1024, p.sliding_window = 16;
    write_synth(c->label, &p, path, n);
}

static void test_moe_vs_reference(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("engine moe");
    vkd_cm saved = g->dev->cm;
    uint32_t saved_m = g->dev->gemv_max_m;
    for (size_t i = 0; i < sizeof MOE_CASES / sizeof MOE_CASES[0]; i++) {
        const moe_case *c = &MOE_CASES[i];
        if (c->coopmat && vkd_coopmat_select(g->dev, VKI_COOPMAT_EMULATED) != VKI_OK)
            continue;
        g->dev->gemv_max_m = c->gemv_max_m;
        char path[256];
        write_moe_model(c, path, sizeof path);
        fixture fx;
        fixture_open(g, path, c->kv_type, 64, &fx);
        int32_t prompt[MOE_PROMPT_MAX];
        uint32_t np = moe_prompt(&fx, &r, c, ROUTE_MARGIN, c->coopmat ? 17 : 33, c->coopmat ? 24 : MOE_PROMPT_MAX,
                                 MOE_DRAWS, prompt);
        check_against_reference_tie(&fx, prompt, np, MOE_DECODE, c->chunk, c->tol, c->coopmat ? TIE_F16 : 0, c->label);
        fixture_close(&fx);
        if (c->coopmat) /* the experts' GEMMs (and the dense ones) with F16 X: bit for bit */
            xh_bitwise(g, &r, path, c->kv_type, c->label, 1);
        unlink(path);
        g->dev->cm = saved;
        g->dev->gemv_max_m = saved_m;
    }
    vt_assert_clean(g);
}

/* int_dot on the experts (op_matmul_id_i8, h's and g's rows quantised to int8): a qwen3moe Q4_K_M,
 * a Mixtral-style Q8_0 and a qwen3moe MXFP4_MOE model (8 experts, 2 per token), an int_dot engine against the float one fed the same tokens.
 * The prompt is screened for routing near ties as for the F16 path, with a wider margin
 * (ROUTE_MARGIN_I8). Lavapipe's crossover keeps prefill and decode on the
 * matrix-vector path, so both run the experts (and the dense projections) on integer dot
 * products: logits NMSE against the float engine <= INT_DOT_TOL, not bitwise equal, and one
 * dispatch more per decode layer (the quant_x8 of the experts' gated rows; h's int8 copy comes
 * from the norm epilogue that writes h). */
static void test_moe_int_dot(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    if (!op_matmul_i8_supported(g->dev, VKI_GGML_Q8_0))
        skip();
    vt_rng r = vt_rng_seeded("engine moe int dot");
    /* 8 experts, 2 per token: routing gaps below ROUTE_MARGIN_I8 are common there (MOE_DRAWS_I8) */
    static const moe_case cases[] = {
        {"qwen3moe e8k2 q4_k_m", "qwen3moe", 8, 1, 128, 256, 8, 2, SYNTH_Q4_K_M, VKI_GGML_F32, 0, 40, false, TOL_F32, 0},
        {"mixtral e8k2 q8_0", "llama", 8, 2, 64, 512, 8, 2, SYNTH_Q8_0, VKI_GGML_F32, 0, 40, false, TOL_F32, 0},
        {"qwen3moe e8k2 mxfp4_moe", "qwen3moe", 8, 1, 128, 256, 8, 2, SYNTH_MXFP4_MOE, VKI_GGML_F32, 0, 40, false,
         TOL_F32, 0},
        /* the shared expert's gate|up on the int8 rows of h the experts read, its down on the
         * gated unit's own int8 copy: no dispatch more */
        {"granitemoe shared e8k2 q8_0", "granitemoe", 8, 4, 64, 128, 8, 2, SYNTH_Q8_0, VKI_GGML_F32, 0, 40, false,
         TOL_F32, 192},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        moe_case c = cases[ci];
        char path[256];
        write_moe_model(&c, path, sizeof path);
        fixture fx[2]; /* float (with the reference, for the screening), int_dot */
        fixture_open(g, path, c.kv_type, 64, &fx[0]);
        vk_engine_params p = test_params(c.kv_type, 64);
        p.int_dot = true;
        fixture_open_engine(g, path, &p, &fx[1]);
        c.coopmat = true; /* moe_prompt: screen the prompt and its continuation */
        int32_t prompt[MOE_PROMPT_MAX];
        uint32_t np = moe_prompt(&fx[0], &r, &c, ROUTE_MARGIN_I8, 8, 12, MOE_DRAWS_I8, prompt);
        const uint32_t V = fx[0].n_vocab;
        tseq s[2];
        float *lg[2] = {malloc(V * sizeof(float)), malloc(V * sizeof(float))};
        for (int f = 0; f < 2; f++)
            tseq_init(&s[f], 1, prompt, np, np + MOE_DECODE + 1);
        double worst = 0;
        uint32_t differ = 0;
        for (uint32_t it = 0; it <= MOE_DECODE; it++) {
            uint32_t n_new = it ? 1 : np;
            for (int f = 0; f < 2; f++) {
                tseq *ps = &s[f];
                step(&fx[f], &ps, &n_new, 1, &lg[f]);
            }
            double e = vt_nmse(lg[1], lg[0], V);
            if (!(e <= INT_DOT_TOL))
                fail_msg("%s step %u: int_dot logits NMSE %.3g > %.0e against the float engine", c.label, it, e,
                         INT_DOT_TOL);
            /* decode: the quant_x8 of g's pair rows is the only dispatch int_dot adds per layer:
             * h's rows are quantised by the attention output's norm epilogue (as for a dense FFN)
             * and the dense projections' inputs by the kernels before them, as in test_int_dot
             * (prefill has one more pass per layer, the attention output's) */
            if (it && fx[1].e->last_dispatches != fx[0].e->last_dispatches + fx[0].hp.n_layer)
                fail_msg("%s step %u: int_dot %u dispatches, float %u: not one quant_x8 per layer", c.label, it,
                         fx[1].e->last_dispatches, fx[0].e->last_dispatches);
            worst = e > worst ? e : worst;
            differ += memcmp(lg[1], lg[0], V * sizeof(float)) != 0;
            s[1].tok[s[1].n - 1] = s[0].tok[s[0].n - 1]; /* teacher forcing: the float engine's token */
        }
        fprintf(stderr, "  %-34s int_dot experts: logits NMSE against the float engine <= %.2e\n", c.label, worst);
        if (differ < MOE_DECODE + 1)
            fail_msg("%s: only %u of %u steps' logits differ from the float engine's: was int_dot used?", c.label,
                     differ, MOE_DECODE + 1);
        for (int f = 0; f < 2; f++) {
            free(s[f].tok);
            free(lg[f]);
            fixture_close(&fx[f]);
        }
        unlink(path);
    }
    vt_assert_clean(g);
}

/* Greedy tokens of two sequences batched (prefilled together, then decoded together, on the
 * grouped GEMM for the prefill) are those of each run alone; batch-invariant mode gives bitwise
 * equal logits alone, in ragged chunks and recomputed (invariance_case). */
static void test_moe_batched_equals_solo(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("engine moe batch");
    uint32_t saved_m = g->dev->gemv_max_m;
    g->dev->gemv_max_m = 1;
    const moe_case *c = &MOE_CASES[1];
    char path[256];
    write_moe_model(c, path, sizeof path);
    fixture fx;
    fixture_open(g, path, VKI_GGML_F32, 64, &fx);
    enum { NA = 30, NB = 11, ND = 6 };
    int32_t pa[NA], pb[NB];
    random_prompt(&r, pa, NA, fx.n_vocab);
    random_prompt(&r, pb, NB, fx.n_vocab);
    tseq solo[2], both[2];
    tseq_init(&solo[0], 0, pa, NA, NA + ND + 2), tseq_init(&solo[1], 1, pb, NB, NB + ND + 2);
    tseq_init(&both[0], 2, pa, NA, NA + ND + 2), tseq_init(&both[1], 3, pb, NB, NB + ND + 2);
    for (int i = 0; i < 2; i++) {
        tseq *ps = &solo[i];
        uint32_t n_new = i ? NB : NA;
        step(&fx, &ps, &n_new, 1, NULL);
        for (int k = 0; k < ND; k++) {
            n_new = 1;
            step(&fx, &ps, &n_new, 1, NULL);
        }
    }
    tseq *pboth[2] = {&both[0], &both[1]};
    uint32_t first[2] = {NA, NB}, one[2] = {1, 1};
    step(&fx, pboth, first, 2, NULL);
    for (int k = 0; k < ND; k++)
        step(&fx, pboth, one, 2, NULL);
    assert_memory_equal(solo[0].tok, both[0].tok, (NA + ND + 1) * sizeof(int32_t));
    assert_memory_equal(solo[1].tok, both[1].tok, (NB + ND + 1) * sizeof(int32_t));
    for (int i = 0; i < 2; i++)
        free(solo[i].tok), free(both[i].tok);
    fixture_close(&fx);
    g->dev->gemv_max_m = saved_m;
    invariance_case(g, path, VKI_GGML_F16, false, "qwen3moe q4_k_m invariant");
    unlink(path);
    vt_assert_clean(g);
}

/* Invalid step plans are refused before anything is recorded, and the engine steps normally
 * afterwards: a slot twice, a page outside the pool, a token outside the vocabulary. */
static void test_bad_plans_refused(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512];
    if (!vt_shared_model("stories260K.gguf", path, sizeof path))
        skip();
    fixture fx;
    fixture_open(g, path, VKI_GGML_F16, 64, &fx);
    int32_t toks[2] = {1, 403};
    uint32_t pages[2] = {0, 1}, far[1] = {UINT32_MAX - 1};
    vki_step_seq a = {.slot = 0, .n_new = 2, .tokens = toks, .n_pages = 1, .pages = pages, .want_token = true};
    vki_step_seq b = a;
    b.pages = pages + 1;
    vki_step_seq two[2] = {a, b};
    vki_step_plan plan = {.n_seqs = 2, .seqs = two, .n_tokens = 4};
    vki_step_out outs[2];
    assert_int_equal(vk_engine_step(fx.e, &plan, outs, NULL), VKI_ERR_INVALID_ARG); /* slot 0 twice */
    two[1].pages = far;
    two[1].slot = 1;
    assert_int_equal(vk_engine_step(fx.e, &plan, outs, NULL), VKI_ERR_INVALID_ARG); /* page outside */
    int32_t bad[2] = {1, (int32_t)fx.n_vocab};
    two[1] = b;
    two[1].slot = 1;
    two[1].tokens = bad;
    assert_int_equal(vk_engine_step(fx.e, &plan, outs, NULL), VKI_ERR_INVALID_ARG); /* token outside */
    two[1].tokens = toks;
    assert_int_equal(vk_engine_step(fx.e, &plan, outs, NULL), VKI_OK); /* both, now valid */
    assert_int_equal(outs[0].token, outs[1].token); /* same prompt, greedy */
    fixture_close(&fx);
    vt_assert_clean(g);
}

/* Beam search's copy-on-write KV pages (plan.copies, vkCmdCopyBuffer per layer and pool, before
 * the forward pass). Sequence A prefills 21 tokens (pages 0 and 1, page 1 partial); in one step
 * page 1 is copied to B's page 160, then A decodes its token and B a different one at position
 * 21 on the copy: both match the CPU reference (a copy after the writes, or not done, would give
 * B A's KV or garbage). Then a copy in a step that writes neither page: dst equals src byte for
 * byte in every layer's K and V pool (the scalar reference of a copy is memcpy). */
static void test_page_copy(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[512];
    if (!vt_shared_model("stories260K.gguf", path, sizeof path))
        skip();
    vt_rng r = vt_rng_seeded("page copy");
    fixture fx;
    fixture_open(g, path, VKI_GGML_F16, 64, &fx);
    int32_t pa[24], pc[5];
    random_prompt(&r, pa, 21, fx.n_vocab);
    random_prompt(&r, pc, 5, fx.n_vocab);
    tseq A, B, C;
    tseq_init(&A, 0, pa, 21, 32);
    tseq_init(&C, 2, pc, 5, 32);
    tseq *one[1] = {&A};
    uint32_t n21 = 21;
    step(&fx, one, &n21, 1, NULL); /* A: prompt -> its 22nd token */
    tseq_init(&B, 1, A.tok, 22, 32);
    B.tok[21] = (A.tok[21] + 1) % (int32_t)fx.n_vocab; /* B diverges at position 21 */
    B.pages[0] = A.pages[0]; /* shares A's full page; its partial page is a copy of A's */
    B.done = 21;
    vki_page_copy cp = {.src = A.pages[1], .dst = B.pages[1]};
    vki_step_seq ss[2] = {
        {.slot = 0, .pos0 = 21, .n_new = 1, .tokens = A.tok + 21, .n_pages = 2, .pages = A.pages, .want_token = true},
        {.slot = 1, .pos0 = 21, .n_new = 1, .tokens = B.tok + 21, .n_pages = 2, .pages = B.pages, .want_token = true}};
    vki_step_plan plan = {.n_seqs = 2, .seqs = ss, .n_tokens = 2, .n_copies = 1, .copies = &cp};
    vki_step_out outs[2];
    float *got = malloc(2 * fx.n_vocab * sizeof *got), *want = malloc(fx.n_vocab * sizeof *want);
    assert_int_equal(vk_engine_step(fx.e, &plan, outs, got), VKI_OK);
    /* The copy byte for byte: B's first 21 positions (page 0 shared, page 1 the copy) are A's.
     * Each logits row against the reference fed its sequence's K/V as the device holds them (F16,
     * read back): a K or V the device computes an f32 ulp off the reference's can round to the
     * other f16 neighbour (NMSE up to 1.3e-7 on stories260K's 8-dim heads, CI seed
     * 98545525620832), which says nothing about the copy; what is left is f32 rounding (TOL_F32). */
    const int32_t *toks[2] = {A.tok, B.tok};
    const uint32_t *pages[2] = {A.pages, B.pages}, ps = fx.e->p.page_size, hd = fx.hp.head_dim;
    const size_t row = vk_engine_kv_row_bytes(fx.e), per_tok = (size_t)fx.hp.n_layer * 2 * fx.hp.n_head_kv;
    const uint32_t n_pages = (22 + ps - 1) / ps;
    assert_int_equal(row, 2 * hd);
    uint8_t *raw[2] = {malloc((size_t)n_pages * ps * per_tok * row), malloc((size_t)n_pages * ps * per_tok * row)};
    float *dev = malloc(22 * per_tok * hd * sizeof *dev);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(vk_engine_kv_read(fx.e, pages[i], n_pages, raw[i]), VKI_OK);
    if (memcmp(raw[0], raw[1], 21 * per_tok * row))
        fail_msg("page copy: B's K/V at positions 0..20 differ from A's");
    for (uint32_t i = 0; i < 2; i++) {
        for (size_t v = 0; v < 22 * per_tok * hd; v++) {
            uint16_t h;
            memcpy(&h, raw[i] + 2 * v, 2);
            dev[v] = quant_f16_to_f32(h);
        }
        assert_int_equal(ref_model_forward_kv(fx.ref, toks[i], 22, false, want, dev, NULL), VKI_OK);
        double e = vt_nmse(got + (size_t)i * fx.n_vocab, want, fx.n_vocab);
        fprintf(stderr, "  %s after a page copy: NMSE %.2e\n", i ? "B (the copy)" : "A (the source)", e);
        vt_assert_nmse(got + (size_t)i * fx.n_vocab, want, fx.n_vocab, TOL_F32, "page copy");
    }
    free(raw[0]);
    free(raw[1]);
    free(dev);
    /* a copy alone: C decodes elsewhere while page 1 goes to page 161 */
    vki_page_copy cp2 = {.src = A.pages[1], .dst = B.pages[2]};
    uint32_t n5 = 5;
    tseq *c1[1] = {&C};
    step(&fx, c1, &n5, 1, NULL);
    vki_step_seq sc = {.slot = 2, .pos0 = 5, .n_new = 1, .tokens = C.tok + 5, .n_pages = 1, .pages = C.pages,
                       .want_token = true};
    vki_step_plan p2 = {.n_seqs = 1, .seqs = &sc, .n_tokens = 1, .n_copies = 1, .copies = &cp2};
    assert_int_equal(vk_engine_step(fx.e, &p2, outs, NULL), VKI_OK);
    size_t pb = (size_t)op_kv_page_bytes(&fx.e->attn[0].s);
    uint8_t *a = malloc(pb), *b = malloc(pb);
    for (uint32_t l = 0; l < fx.hp.n_layer; l++)
        for (int kv = 0; kv < 2; kv++) {
            const vkd_buffer *pool = kv ? fx.e->v_pool[l] : fx.e->k_pool[l];
            assert_int_equal(vkd_download(g->dev, pool, (VkDeviceSize)cp2.src * pb, a, pb), VKI_OK);
            assert_int_equal(vkd_download(g->dev, pool, (VkDeviceSize)cp2.dst * pb, b, pb), VKI_OK);
            if (memcmp(a, b, pb))
                fail_msg("layer %u %s pool: page %u is not a copy of page %u", l, kv ? "V" : "K", cp2.dst, cp2.src);
        }
    /* refused: a copy onto itself, two copies into one page, a page outside the pool */
    vki_page_copy bad[2] = {{5, 5}, {0, 0}};
    p2.copies = bad;
    assert_int_equal(vk_engine_step(fx.e, &p2, outs, NULL), VKI_ERR_INVALID_ARG);
    bad[0] = (vki_page_copy){5, 7};
    bad[1] = (vki_page_copy){6, 7};
    p2.n_copies = 2;
    assert_int_equal(vk_engine_step(fx.e, &p2, outs, NULL), VKI_ERR_INVALID_ARG);
    bad[1] = (vki_page_copy){6, UINT32_MAX - 1};
    assert_int_equal(vk_engine_step(fx.e, &p2, outs, NULL), VKI_ERR_INVALID_ARG);
    free(a);
    free(b);
    free(got);
    free(want);
    free(A.tok);
    free(B.tok);
    free(C.tok);
    fixture_close(&fx);
    vt_assert_clean(g);
}

/* Session files' KV copies (engine/kv_io.c): a prompt's first two pages read from an engine with
 * 16-token pages and written into one with 8-token pages (four scattered page ids, one page per
 * command buffer) read back there byte for byte (the host layout knows no page size), and the
 * next 5 tokens computed over them give the logits the first engine gives over its own pages, bit
 * for bit, for F32, F16 and Q8_0 pools. */
static void test_kv_io(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("kv io");
    synth_params sp = synth_default_params();
    sp.n_layer = 2, sp.d_model = 128, sp.n_head = 4, sp.n_head_kv = 2, sp.head_dim = 32, sp.d_ff = 256;
    sp.n_vocab = 512, sp.n_ctx = 1024, sp.wtype = SYNTH_F16, sp.seed = 77;
    char path[512];
    write_synth("kv_io", &sp, path, sizeof path);
    const uint32_t types[] = {VKI_GGML_F32, VKI_GGML_F16, VKI_GGML_Q8_0};
    int32_t prompt[37];
    random_prompt(&r, prompt, 37, sp.n_vocab);
    for (size_t k = 0; k < 3; k++) {
        vk_engine_params pa = test_params(types[k], 64), pb = pa;
        pb.page_size = 8;
        fixture A, B;
        fixture_open_p(g, path, &pa, &A);
        fixture_open_p(g, path, &pb, &B);
        tseq s, t;
        tseq_init(&s, 0, prompt, 37, 40);
        tseq_init(&t, 1, prompt, 37, 40);
        float *la = malloc(sp.n_vocab * sizeof *la), *lb = malloc(sp.n_vocab * sizeof *lb), *lga[1] = {la}, *lgb[1] = {lb};
        tseq *sa[1] = {&s}, *sb[1] = {&t};
        uint32_t n32 = 32, n5 = 5;
        step(&A, sa, &n32, 1, NULL); /* pages 0 and 1 full */
        size_t bytes = 32 * (size_t)2 * sp.n_layer * sp.n_head_kv * vk_engine_kv_row_bytes(A.e);
        uint8_t *kv = malloc(bytes), *back = malloc(bytes);
        const uint32_t bp[4] = {9, 3, 17, 5};
        B.e->kv_io_chunk = 1;
        assert_int_equal(vk_engine_kv_read(A.e, s.pages, 2, kv), VKI_OK);
        assert_int_equal(vk_engine_kv_write(B.e, bp, 4, kv), VKI_OK);
        assert_int_equal(vk_engine_kv_read(B.e, bp, 4, back), VKI_OK);
        assert_memory_equal(kv, back, bytes);
        memcpy(t.pages, bp, sizeof bp);
        t.pages[4] = 30;
        t.done = 32;
        step(&A, sa, &n5, 1, lga);
        step(&B, sb, &n5, 1, lgb);
        /* bit for bit (lavapipe, seeds 1-6): the same KV bytes, and no kernel splits by page */
        if (memcmp(la, lb, sp.n_vocab * sizeof *la))
            fail_msg("%s KV: logits over copied pages differ from the source's (NMSE %.2e)",
                     quant_type_name(types[k]), vt_nmse(lb, la, sp.n_vocab));
        const uint32_t out_of_pool = B.e->n_pages;
        assert_int_equal(vk_engine_kv_read(B.e, &out_of_pool, 1, back), VKI_ERR_INVALID_ARG);
        free(kv), free(back), free(la), free(lb), free(s.tok), free(t.tok);
        fixture_close(&A);
        fixture_close(&B);
    }
    unlink(path);
    vt_assert_clean(g);
}

/* Devices whose storage bindings are small (maxStorageBufferRange 128 MiB on lavapipe and many
 * mobile GPUs): the kernels bind each activation buffer whole, so the engine caps max_tokens to
 * the rows of the widest one that fit a binding, and max_seqs to the logits rows that do. Here the
 * device's limit is lowered to 24 MiB for a model whose gate|up rows are 64 KiB (at the default
 * 2048 tokens the buffer would be 128 MiB: every step failed on such a device with Llama-3-8B's
 * 14336-wide FFN): max_tokens becomes 384 and the logits still match the reference. Then 128 KiB
 * with 32 KiB logits rows caps max_seqs at 4 (same check), and less than one logits row is
 * refused. */
static void test_small_binding_range(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("small bindings");
    synth_params sp = synth_default_params();
    sp.n_layer = 2, sp.d_model = 256, sp.n_head = 4, sp.n_head_kv = 4, sp.head_dim = 64, sp.d_ff = 8192;
    sp.n_vocab = 512, sp.n_ctx = 4096, sp.wtype = SYNTH_F32, sp.seed = 31;
    char path[512];
    write_synth("small_bindings", &sp, path, sizeof path);
    g->dev->info.max_storage_buffer_range = 24u << 20;
    fixture fx;
    fixture_open(g, path, VKI_GGML_F32, 2048, &fx);
    assert_int_equal(fx.e->p.max_tokens, 384);
    assert_int_equal(fx.e->p.max_seqs, 8);
    int32_t prompt[40];
    uint32_t np = vt_range(&r, 20, 40);
    random_prompt(&r, prompt, np, fx.n_vocab);
    check_against_reference(&fx, prompt, np, 3, 7, TOL_F32, "24 MiB bindings, max_tokens capped");
    fixture_close(&fx);
    unlink(path);

    /* 4 KiB activation rows, 32 KiB logits rows; a pool of 8 pages (16 KiB each), slot 0's */
    sp.d_ff = 512, sp.n_vocab = 8192;
    write_synth("small_bindings_vocab", &sp, path, sizeof path);
    g->dev->info.max_storage_buffer_range = 128u << 10;
    fixture_open(g, path, VKI_GGML_F32, 2048, &fx);
    assert_int_equal(fx.e->p.max_tokens, 32);
    assert_int_equal(fx.e->p.max_seqs, 4);
    assert_int_equal(fx.e->n_pages, 8);
    check_against_reference_in(&fx, 0, prompt, 20, 3, 7, TOL_F32, 0, "128 KiB bindings, max_seqs capped");
    fixture_close(&fx);

    g->dev->info.max_storage_buffer_range = (32u << 10) - 4; /* a logits row does not fit: refused before the load */
    gguf_file *f;
    model_hparams hp;
    model_tensors t;
    char err[256];
    assert_int_equal(gguf_open(path, &f, err, sizeof err), VKI_OK);
    assert_int_equal(model_read_hparams(f, &hp, err, sizeof err), VKI_OK);
    assert_int_equal(model_find_tensors(f, &hp, &t, err, sizeof err), VKI_OK);
    vk_engine_params ep = test_params(VKI_GGML_F32, 2048);
    vk_engine *e = NULL;
    assert_int_equal(vk_engine_create(g->dev, f, &hp, &t, &ep, &e), VKI_ERR_UNSUPPORTED);
    assert_null(e);
    model_tensors_free(&t);
    gguf_close(f);
    unlink(path);
    vt_assert_clean(g);
}

/* The device's own limit back (also after a failed assertion above). */
static int restore_binding_range(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    VkPhysicalDeviceProperties pr;
    vkGetPhysicalDeviceProperties(g->dev->phys, &pr);
    g->dev->info.max_storage_buffer_range = pr.limits.maxStorageBufferRange;
    return 0;
}

/* A model the engine cannot run is refused through the public API with a message that names
 * the problem: an unsupported architecture, a missing tensor, a truncated file. */
static void write_meta_only(const char *path, const char *arch)
{
    gguf_writer *w;
    assert_int_equal(gguf_w_create(&w), VKI_OK);
    char key[64];
    assert_int_equal(gguf_w_set_str(w, "general.architecture", arch), VKI_OK);
    const char *u32_keys[] = {"block_count", "embedding_length", "feed_forward_length", "attention.head_count"};
    const uint32_t vals[] = {2, 64, 128, 4};
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, u32_keys[i]);
        assert_int_equal(gguf_w_set_u32(w, key, vals[i]), VKI_OK);
    }
    assert_int_equal(gguf_w_open(w, path), VKI_OK);
    assert_int_equal(gguf_w_finish(w), VKI_OK);
    gguf_w_destroy(w);
}

/* kv_type / max_window: the engine parameters to open with (else the defaults). */
static void expect_refused_p(const char *path, vki_kv_type kv_type, uint32_t max_window, vki_status want,
                             const char *needle)
{
    vki_engine_params p = vki_engine_default_params();
    p.device = vt_device_params();
    p.kv_tokens = 1024;
    p.kv_type = kv_type;
    p.max_attention_window = max_window;
    vki_engine *e = NULL;
    char err[512] = "";
    vki_status st = vki_engine_create(path, &p, &e, err, sizeof err);
    if (st != want || !strstr(err, needle))
        fail_msg("%s: got %s \"%s\", want %s naming \"%s\"", path, vki_status_str(st), err, vki_status_str(want),
                 needle);
    assert_null(e);
}

static void expect_refused(const char *path, vki_status want, const char *needle)
{
    expect_refused_p(path, VKI_KV_F16, 0, want, needle);
}

static void test_unsupported_models_refused(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    char path[256];
    snprintf(path, sizeof path, "/tmp/vki_test_refuse_%d.gguf", (int)getpid());
    write_meta_only(path, "falcon");
    expect_refused(path, VKI_ERR_UNSUPPORTED, "falcon");
    write_meta_only(path, "llama"); /* metadata fine, no tensors */
    expect_refused(path, VKI_ERR_FORMAT, "token_embd.weight");
    unlink(path); /* each write_* below names its own file in path: delete each before the next */
    const shape_case *c = &SHAPES[0];
    write_model(c, path, sizeof path);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_int_equal(ftruncate(fileno(f), size - 1000), 0); /* cut inside the last tensor's data */
    fclose(f);
    expect_refused(path, VKI_ERR_FORMAT, "past the end of the file");
    unlink(path);
    /* a weight type the reader knows but vkinfer cannot run: attn_q of a Q4_K model relabelled
     * IQ2_XXS (smaller blocks: the data still lies inside the file) */
    c = &SHAPES[4];
    write_model(c, path, sizeof path);
    f = fopen(path, "r+b");
    assert_non_null(f);
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    const char *nm = "blk.0.attn_q.weight";
    uint8_t *at = NULL;
    for (size_t i = 0; !at && i + strlen(nm) <= n; i++)
        if (!memcmp(buf + i, nm, strlen(nm)))
            at = buf + i + strlen(nm);
    assert_non_null(at);
    uint32_t n_dims;
    memcpy(&n_dims, at, 4);
    const uint32_t iq2_xxs = 16;
    assert_int_equal(fseek(f, (long)(at + 4 + 8 * n_dims - buf), SEEK_SET), 0);
    assert_int_equal(fwrite(&iq2_xxs, 4, 1, f), 1);
    fclose(f);
    expect_refused(path, VKI_ERR_UNSUPPORTED, "blk.0.attn_q.weight: weight type iq2_xxs (id 16) is not supported");
    unlink(path);
    /* the newer architectures and options: a missing gemma post-norm, a Q8_0 KV cache on a head
     * dim that is not a multiple of 32, an absurd attention window, granite's multipliers, gpt-oss's
     * sink logits and expert biases */
    char edited[256];
    snprintf(edited, sizeof edited, "/tmp/vki_test_refuse_%d_edit.gguf", (int)getpid());
    write_arch_model(&ARCH_CASES[1], path, sizeof path); /* gemma2 */
    const gguf_edit drop = {GGUF_EDIT_DROP_TENSOR, "blk.1.post_ffw_norm.weight", 0, 0, 0, 0, NULL};
    assert_int_equal(gguf_edit_copy(path, edited, &drop, 1), VKI_OK);
    expect_refused(edited, VKI_ERR_FORMAT, "missing tensor blk.1.post_ffw_norm.weight");
    expect_refused_p(path, VKI_KV_F16, (1u << 24) + 1, VKI_ERR_INVALID_ARG, "max_attention_window");
    unlink(path);
    synth_params tiny = synth_default_params(); /* head dim 16 */
    write_synth("tiny hd16", &tiny, path, sizeof path);
    expect_refused_p(path, VKI_KV_Q8_0, 0, VKI_ERR_UNSUPPORTED, "q8_0 KV cache needs a head dim that is a multiple of 32");
    unlink(path);
    /* granite without its (required) logit scale, with a negative residual multiplier */
    write_arch_model(&ARCH_CASES[13], path, sizeof path);
    const gguf_edit no_logit = {GGUF_EDIT_DROP_KEY, "granite.logit_scale", 0, 0, 0, 0, NULL};
    assert_int_equal(gguf_edit_copy(path, edited, &no_logit, 1), VKI_OK);
    expect_refused(edited, VKI_ERR_FORMAT, "missing metadata key granite.logit_scale");
    const gguf_edit neg = {GGUF_EDIT_F32, "granite.residual_scale", 0, 0, 0, -0.5f, NULL};
    assert_int_equal(gguf_edit_copy(path, edited, &neg, 1), VKI_OK);
    expect_refused(edited, VKI_ERR_FORMAT, "granite.residual_scale: must be a finite number > 0");
    unlink(path);
    /* gpt-oss without a layer's sink logits or an expert bias */
    write_moe_model(&MOE_CASES[6], path, sizeof path);
    const gguf_edit no_sinks = {GGUF_EDIT_DROP_TENSOR, "blk.1.attn_sinks.weight", 0, 0, 0, 0, NULL};
    assert_int_equal(gguf_edit_copy(path, edited, &no_sinks, 1), VKI_OK);
    expect_refused(edited, VKI_ERR_FORMAT, "missing tensor blk.1.attn_sinks.weight");
    const gguf_edit no_bias = {GGUF_EDIT_DROP_TENSOR, "blk.0.ffn_down_exps.bias", 0, 0, 0, 0, NULL};
    assert_int_equal(gguf_edit_copy(path, edited, &no_bias, 1), VKI_OK);
    expect_refused(edited, VKI_ERR_FORMAT, "missing tensor blk.0.ffn_down_exps.bias");
    unlink(path);
    unlink(edited);
    vt_assert_clean(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_answer_f16_kv),
        cmocka_unit_test(test_known_answer_f32_kv),
        cmocka_unit_test(test_stories_logits_vs_reference),
        cmocka_unit_test(test_synthetic_shapes_vs_reference),
        cmocka_unit_test(test_split_model),
        cmocka_unit_test(test_archs_vs_reference),
        cmocka_unit_test(test_fusion_bitwise),
        cmocka_unit_test(test_cmd_reuse_bitwise),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_masks_later),
        cmocka_unit_test(test_int_dot),
        cmocka_unit_test(test_chunked_prefill_equals_whole),
        cmocka_unit_test(test_ragged_batch),
        cmocka_unit_test(test_long_context),
        cmocka_unit_test(test_coopmat_vs_reference),
        cmocka_unit_test(test_batch_invariant_mode),
        cmocka_unit_test(test_profile_trace),
        cmocka_unit_test(test_moe_vs_reference),
        cmocka_unit_test(test_moe_batched_equals_solo),
        cmocka_unit_test(test_moe_int_dot),
        cmocka_unit_test(test_kv_sizing_budget),
        cmocka_unit_test_teardown(test_small_binding_range, restore_binding_range),
        cmocka_unit_test(test_unsupported_models_refused),
        cmocka_unit_test(test_bad_plans_refused),
        cmocka_unit_test(test_page_copy),
        cmocka_unit_test(test_kv_io),
    };
    if (getenv("VKI_TEST_FILTER")) /* one test while developing: VKI_TEST_FILTER=test_moe_vs_reference */
        cmocka_set_test_filter(getenv("VKI_TEST_FILTER"));
    return cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
}
