/* Synthetic model writer: written files load through the reader with the expected metadata,
 * tensor names, shapes and types for several shapes, both architectures and every weight type
 * (the Q4_K_M mix and the F16 fallback included); vocabularies copied byte for byte; the
 * byte-level vocabulary's layout; weight statistics and a one-token forward pass that shows
 * activations stay O(1) through many layers and logits are not flat; bad parameters refused. */
#include "support/vt.h"

#include "engine/gguf.h"
#include "engine/quant.h"
#include "engine/synth.h"
#include "support/gguf_edit.h"

#include <unistd.h>

/* The group state: a private temporary directory for the written models. */
static int make_dir(void **state)
{
    char *dir = malloc(64);
    snprintf(dir, 64, "/tmp/vki_synth_XXXXXX");
    *state = dir;
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    int rc = rmdir(*state); /* every test removes its own files: this fails if one was left behind */
    free(*state);
    return rc;
}

static const char *tmp_path(void **state, char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", (const char *)*state, name);
    return buf;
}

static gguf_file *write_and_open(void **state, const synth_params *p, const char *name, char *path, size_t n)
{
    char err[512] = "", e2[512] = "";
    tmp_path(state, path, n, name);
    vki_status st = synth_write(p, path, err, sizeof err);
    if (st != VKI_OK)
        fail_msg("synth_write %s: %s", name, err);
    gguf_file *f = NULL;
    if (gguf_open(path, &f, e2, sizeof e2) != VKI_OK)
        fail_msg("written model %s does not load: %s", name, e2);
    return f;
}

static uint32_t get_u32(const gguf_file *f, const char *arch, const char *suffix)
{
    char k[128];
    uint32_t v = 0;
    snprintf(k, sizeof k, "%s.%s", arch, suffix);
    if (gguf_get_u32(f, k, &v) != VKI_OK)
        fail_msg("key %s missing or not an integer", k);
    return v;
}

static const gguf_tensor *tensor(const gguf_file *f, const char *fmt, int layer)
{
    char nm[96];
    snprintf(nm, sizeof nm, fmt, layer);
    return gguf_find_tensor(f, nm);
}

static void expect_tensor(const gguf_file *f, const char *name, int layer, uint64_t ne0, uint64_t ne1, uint32_t type)
{
    const gguf_tensor *t = tensor(f, name, layer);
    if (!t)
        fail_msg("missing tensor %s (layer %d)", name, layer);
    uint32_t dims = strstr(name, "norm") || strstr(name, "bias") ? 1 : 2;
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->type != type || t->n_dims != dims)
        fail_msg("%s (layer %d): [%llu, %llu] type %u dims %u, want [%llu, %llu] type %u", name, layer,
                 (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], t->type, t->n_dims,
                 (unsigned long long)ne0, (unsigned long long)ne1, type);
}

/* Checks the whole file against p: metadata and the exact tensor set. */
static void check_model(const gguf_file *f, const synth_params *p, uint32_t n_vocab)
{
    gguf_str s;
    assert_int_equal(gguf_get_str(f, "general.architecture", &s), VKI_OK);
    assert_true(gguf_str_eq(s, p->arch));
    const char *a = p->arch;
    uint32_t hd = p->head_dim ? p->head_dim : p->d_model / p->n_head;
    assert_int_equal(get_u32(f, a, "context_length"), p->n_ctx);
    assert_int_equal(get_u32(f, a, "embedding_length"), p->d_model);
    assert_int_equal(get_u32(f, a, "block_count"), p->n_layer);
    assert_int_equal(get_u32(f, a, "feed_forward_length"), p->d_ff);
    assert_int_equal(get_u32(f, a, "attention.head_count"), p->n_head);
    assert_int_equal(get_u32(f, a, "attention.head_count_kv"), p->n_head_kv);
    assert_int_equal(get_u32(f, a, "rope.dimension_count"), hd);
    char k[128];
    float v;
    snprintf(k, sizeof k, "%s.rope.freq_base", a);
    assert_int_equal(gguf_get_f32(f, k, &v), VKI_OK), assert_true(v == p->rope_base);
    snprintf(k, sizeof k, "%s.attention.layer_norm_rms_epsilon", a);
    assert_int_equal(gguf_get_f32(f, k, &v), VKI_OK), assert_true(v == p->rms_eps);
    snprintf(k, sizeof k, "%s.attention.key_length", a);
    bool has_kl = gguf_find_kv(f, k) != NULL;
    assert_int_equal(has_kl, hd * p->n_head != p->d_model);
    if (has_kl)
        assert_int_equal(get_u32(f, a, "attention.key_length"), hd), assert_int_equal(get_u32(f, a, "attention.value_length"), hd);
    gguf_type et;
    uint64_t nt;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &nt), VKI_OK);
    assert_int_equal(nt, n_vocab);

    bool bias = !strcmp(a, "qwen2");
    uint64_t d = p->d_model, q = (uint64_t)p->n_head * hd, kv = (uint64_t)p->n_head_kv * hd;
    uint64_t n_expected = 2 + !p->tied + p->n_layer * (9 + 3 * bias);
    assert_int_equal(gguf_n_tensors(f), n_expected);
#define WT(role, layer, ne0) synth_weight_type(p, role, layer, ne0, true)
    expect_tensor(f, "token_embd.weight", 0, d, n_vocab, WT("token_embd", 0, d));
    expect_tensor(f, "output_norm.weight", 0, d, 1, VKI_GGML_F32);
    if (p->tied)
        assert_null(gguf_find_tensor(f, "output.weight"));
    else
        expect_tensor(f, "output.weight", 0, d, n_vocab, WT("output", 0, d));
    for (int l = 0; l < (int)p->n_layer; l++) {
        expect_tensor(f, "blk.%d.attn_norm.weight", l, d, 1, VKI_GGML_F32);
        expect_tensor(f, "blk.%d.ffn_norm.weight", l, d, 1, VKI_GGML_F32);
        expect_tensor(f, "blk.%d.attn_q.weight", l, d, q, WT("attn_q", (uint32_t)l, d));
        expect_tensor(f, "blk.%d.attn_k.weight", l, d, kv, WT("attn_k", (uint32_t)l, d));
        expect_tensor(f, "blk.%d.attn_v.weight", l, d, kv, WT("attn_v", (uint32_t)l, d));
        expect_tensor(f, "blk.%d.attn_output.weight", l, q, d, WT("attn_output", (uint32_t)l, q));
        expect_tensor(f, "blk.%d.ffn_gate.weight", l, d, p->d_ff, WT("ffn_gate", (uint32_t)l, d));
        expect_tensor(f, "blk.%d.ffn_up.weight", l, d, p->d_ff, WT("ffn_up", (uint32_t)l, d));
        expect_tensor(f, "blk.%d.ffn_down.weight", l, p->d_ff, d, WT("ffn_down", (uint32_t)l, p->d_ff));
        if (bias) {
            expect_tensor(f, "blk.%d.attn_q.bias", l, q, 1, VKI_GGML_F32);
            expect_tensor(f, "blk.%d.attn_k.bias", l, kv, 1, VKI_GGML_F32);
            expect_tensor(f, "blk.%d.attn_v.bias", l, kv, 1, VKI_GGML_F32);
        } else {
            assert_null(tensor(f, "blk.%d.attn_q.bias", l));
        }
    }
#undef WT
}

static void test_shapes(void **state)
{
    static const struct { const char *arch; uint32_t layers, d, heads, kv, hd, ff, vocab; bool tied; synth_wtype t; } c[] = {
        {"llama", 1, 64, 8, 4, 0, 172, 259, false, SYNTH_F32},     /* stories260K-like, minimal vocab */
        {"llama", 3, 96, 6, 1, 32, 160, 300, true, SYNTH_F16},     /* MQA, head_dim == d/heads */
        {"llama", 2, 128, 4, 2, 64, 256, 512, false, SYNTH_Q8_0},  /* head_dim 64 != 128/4 */
        {"qwen2", 2, 64, 4, 4, 32, 96, 400, true, SYNTH_Q4_0},     /* qwen2 biases, head_dim 32 != 16 */
        {"qwen2", 2, 256, 2, 1, 128, 512, 600, false, SYNTH_Q6_K}, /* head_dim 128 */
        {"llama", 2, 256, 8, 8, 0, 768, 300, false, SYNTH_Q4_K},   /* K-quant everywhere */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        synth_params p = synth_default_params();
        p.arch = c[i].arch, p.n_layer = c[i].layers, p.d_model = c[i].d, p.n_head = c[i].heads;
        p.n_head_kv = c[i].kv, p.head_dim = c[i].hd, p.d_ff = c[i].ff, p.n_vocab = c[i].vocab;
        p.tied = c[i].tied, p.wtype = c[i].t, p.n_ctx = 1024 + (uint32_t)i, p.rope_base = 5000.0f * (float)(i + 1);
        p.rms_eps = 1e-6f;
        char path[512];
        gguf_file *f = write_and_open(state, &p, "shape.gguf", path, sizeof path);
        check_model(f, &p, p.n_vocab);
        gguf_close(f);
        assert_int_equal(unlink(path), 0);
    }
}

/* The Q4_K_M mix, hand-computed from llama.cpp's rule for 8 layers: Q6_K for attn_v / ffn_down
 * of layers 0, 3, 6, 7 (first eighth, last eighth, every third in between), for output.weight,
 * and for token_embd only when tied; where 256 does not divide the row llama.cpp's fallback:
 * Q5_0 for Q4_K, Q8_0 for Q6_K. */
static void test_q4_k_m_mix(void **state)
{
    synth_params p = synth_default_params();
    p.n_layer = 8, p.d_model = 256, p.n_head = 4, p.n_head_kv = 2, p.d_ff = 320, p.n_vocab = 300;
    p.wtype = SYNTH_Q4_K_M;
    for (int tied = 0; tied < 2; tied++) {
        p.tied = tied;
        char path[512];
        gguf_file *f = write_and_open(state, &p, "mix.gguf", path, sizeof path);
        check_model(f, &p, 300);
        assert_int_equal(gguf_find_tensor(f, "token_embd.weight")->type, tied ? VKI_GGML_Q6_K : VKI_GGML_Q4_K);
        if (!tied)
            assert_int_equal(gguf_find_tensor(f, "output.weight")->type, VKI_GGML_Q6_K);
        for (int l = 0; l < 8; l++) {
            bool more = l == 0 || l == 3 || l == 6 || l == 7;
            assert_int_equal(tensor(f, "blk.%d.attn_v.weight", l)->type, more ? VKI_GGML_Q6_K : VKI_GGML_Q4_K);
            assert_int_equal(tensor(f, "blk.%d.attn_q.weight", l)->type, VKI_GGML_Q4_K);
            assert_int_equal(tensor(f, "blk.%d.ffn_down.weight", l)->type, more ? VKI_GGML_Q8_0 : VKI_GGML_Q5_0);
            assert_int_equal(tensor(f, "blk.%d.ffn_up.weight", l)->type, VKI_GGML_Q4_K);
        }
        gguf_close(f);
        assert_int_equal(unlink(path), 0);
    }
    p.d_ff = 512, p.tied = false;
    char path[512];
    gguf_file *f = write_and_open(state, &p, "mix2.gguf", path, sizeof path);
    for (int l = 0; l < 8; l++) {
        bool more = l == 0 || l == 3 || l == 6 || l == 7;
        assert_int_equal(tensor(f, "blk.%d.ffn_down.weight", l)->type, more ? VKI_GGML_Q6_K : VKI_GGML_Q4_K);
    }
    gguf_close(f);
    assert_int_equal(unlink(path), 0);
}

/* Every type and mix is written and loads back with the types synth_weight_type names (test_shapes
 * checks each tensor), on a shape whose rows the 256-blocks do not all divide: d_ff 320 (a
 * multiple of 32 only) and, in a second pass, 100 (not even of 32). */
static void test_every_type_and_fallback(void **state)
{
    for (int w = 0; w < SYNTH_WTYPE_COUNT; w++)
        for (int pass = 0; pass < 2; pass++) {
            synth_params p = synth_default_params();
            p.d_model = 256, p.n_head = 4, p.n_head_kv = 1, p.d_ff = pass ? 100 : 320, p.n_vocab = 300;
            p.wtype = (synth_wtype)w, p.llama_mix = pass;
            char path[512];
            gguf_file *f = write_and_open(state, &p, "types.gguf", path, sizeof path);
            check_model(f, &p, 300);
            gguf_close(f);
            assert_int_equal(unlink(path), 0);
        }
}

/* llama.cpp's fallback (src/llama-quant.cpp tensor_type_fallback) for rows a block does not
 * divide, and F16 when 32 does not divide them either. */
static void test_llama_fallbacks(void **state)
{
    static const struct { synth_wtype w; uint32_t at320, at100; } c[] = {
        {SYNTH_Q2_K, VKI_GGML_Q4_0, VKI_GGML_F16},   {SYNTH_Q3_K, VKI_GGML_Q4_0, VKI_GGML_F16},
        {SYNTH_Q4_K, VKI_GGML_Q5_0, VKI_GGML_F16},   {SYNTH_Q5_K, VKI_GGML_Q5_1, VKI_GGML_F16},
        {SYNTH_Q6_K, VKI_GGML_Q8_0, VKI_GGML_F16},   {SYNTH_IQ4_XS, VKI_GGML_IQ4_NL, VKI_GGML_F16},
        {SYNTH_Q4_0, VKI_GGML_Q4_0, VKI_GGML_F16},   {SYNTH_Q5_1, VKI_GGML_Q5_1, VKI_GGML_F16},
        {SYNTH_BF16, VKI_GGML_BF16, VKI_GGML_BF16},  {SYNTH_F32, VKI_GGML_F32, VKI_GGML_F32},
        {SYNTH_MXFP4, VKI_GGML_MXFP4, VKI_GGML_F16},
    };
    synth_params p = synth_default_params();
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        p.wtype = c[i].w;
        assert_int_equal(synth_weight_type(&p, "ffn_down", 0, 320, true), c[i].at320);
        assert_int_equal(synth_weight_type(&p, "ffn_down", 0, 100, true), c[i].at100);
        assert_int_equal(synth_weight_type(&p, "ffn_down", 0, 512, true), synth_weight_type(&p, "ffn_down", 0, 512, false));
    }
    /* a mix's output.weight whose rows the base block does not divide is Q8_0 (llama.cpp's rule) */
    p.wtype = SYNTH_Q4_K_M, p.tied = false;
    assert_int_equal(synth_weight_type(&p, "output", 0, 320, true), VKI_GGML_Q8_0);
    assert_int_equal(synth_weight_type(&p, "output", 0, 256, true), VKI_GGML_Q6_K);
    /* MXFP4_MOE (llama.cpp: ne[2] > 1, the stacked experts, MXFP4; every other matrix Q8_0) */
    p.wtype = SYNTH_MXFP4_MOE;
    assert_int_equal(synth_weight_type(&p, "ffn_gate_exps", 3, 256, true), VKI_GGML_MXFP4);
    assert_int_equal(synth_weight_type(&p, "ffn_down_exps", 3, 96, true), VKI_GGML_MXFP4);
    assert_int_equal(synth_weight_type(&p, "attn_q", 3, 256, true), VKI_GGML_Q8_0);
    assert_int_equal(synth_weight_type(&p, "ffn_down", 3, 256, true), VKI_GGML_Q8_0);
    assert_int_equal(synth_weight_type(&p, "output", 0, 256, true), VKI_GGML_Q8_0);
}

/* The per-tensor types of llama.cpp's own quantiser for the quant-zoo files (their shape: 2
 * layers, d 256, 4 heads, 2 KV heads, d_ff 512, untied) are what synth_weight_type picks for
 * the same mix. */
static void test_mixes_match_llama_quantize(void **state)
{
    static const struct { const char *zoo; synth_wtype w; bool mix; } c[] = {
        {"f16", SYNTH_F16, false},     {"bf16", SYNTH_BF16, false},    {"q8_0", SYNTH_Q8_0, true},
        {"q4_0", SYNTH_Q4_0, true},    {"q4_1", SYNTH_Q4_1, true},     {"q5_0", SYNTH_Q5_0, true},
        {"q5_1", SYNTH_Q5_1, true},    {"q2_k", SYNTH_Q2_K, true},     {"q3_k_s", SYNTH_Q3_K_S, false},
        {"q3_k_m", SYNTH_Q3_K_M, false}, {"q4_k_s", SYNTH_Q4_K_S, false}, {"q4_k_m", SYNTH_Q4_K_M, false},
        {"q5_k_s", SYNTH_Q5_K_S, false}, {"q5_k_m", SYNTH_Q5_K_M, false}, {"q6_k", SYNTH_Q6_K, true},
        {"iq4_nl", SYNTH_IQ4_NL, true}, {"iq4_xs", SYNTH_IQ4_XS, true},
    };
    int seen = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char rel[96], path[1024], err[256];
        snprintf(rel, sizeof rel, "quant-zoo/zoo-%s.gguf", c[i].zoo);
        if (!vt_shared_model(rel, path, sizeof path))
            continue;
        seen++;
        gguf_file *f;
        assert_int_equal(gguf_open(path, &f, err, sizeof err), VKI_OK);
        synth_params p = synth_default_params();
        p.n_layer = 2, p.d_model = 256, p.n_head = 4, p.n_head_kv = 2, p.d_ff = 512, p.tied = false;
        p.wtype = c[i].w, p.llama_mix = c[i].mix;
        for (uint64_t k = 0; k < gguf_n_tensors(f); k++) {
            const gguf_tensor *t = gguf_tensor_at(f, k);
            char name[80], role[32] = "";
            unsigned layer = 0;
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            if (t->n_dims < 2)
                continue; /* norms: always f32 */
            if (sscanf(name, "blk.%u.%31[a-z_].weight", &layer, role) != 2)
                sscanf(name, "%31[a-z_].weight", role);
            uint32_t want = synth_weight_type(&p, role, layer, t->ne[0], true);
            if (want != t->type)
                fail_msg("zoo-%s %s: llama-quantize wrote %s, synth picks %s", c[i].zoo, name, quant_type_name(t->type),
                         quant_type_name(want));
        }
        gguf_close(f);
    }
    if (!seen) {
        fprintf(stderr, "skipping: %s/models/quant-zoo is absent\n", VKI_SHARED_DIR);
        skip();
    }
}

static void test_vocab_copied(void **state)
{
    static const char *const files[] = {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf"};
    int seen = 0;
    for (size_t i = 0; i < 2; i++) {
        char src_path[1024], path[512], err[256];
        if (!vt_shared_model(files[i], src_path, sizeof src_path)) {
            fprintf(stderr, "skipping %s: absent\n", files[i]);
            continue;
        }
        seen++;
        gguf_file *src;
        assert_int_equal(gguf_open(src_path, &src, err, sizeof err), VKI_OK);
        synth_params p = synth_default_params();
        p.vocab_from = src_path;
        p.arch = i ? "qwen2" : "llama";
        p.tied = i;
        p.n_vocab = 7; /* ignored: the vocabulary decides */
        gguf_file *f = write_and_open(state, &p, "vocab.gguf", path, sizeof path);
        uint64_t n;
        assert_int_equal(gguf_get_arr(src, "tokenizer.ggml.tokens", NULL, &n), VKI_OK);
        check_model(f, &p, (uint32_t)n);
        int copied = 0;
        for (uint64_t k = 0; k < gguf_n_kv(src); k++) {
            const gguf_kv *a = gguf_kv_at(src, k);
            if (a->key.len < 10 || memcmp(a->key.ptr, "tokenizer.", 10))
                continue;
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)a->key.len, a->key.ptr);
            const gguf_kv *b = gguf_find_kv(f, key);
            if (!b)
                fail_msg("%s not copied", key);
            assert_int_equal(a->type, b->type);
            assert_int_equal(a->arr_type, b->arr_type);
            assert_int_equal(a->arr_n, b->arr_n);
            assert_int_equal(a->value_bytes, b->value_bytes);
            assert_memory_equal(a->value, b->value, a->value_bytes);
            copied++;
        }
        assert_true(copied >= 4);
        gguf_close(f);
        gguf_close(src);
        assert_int_equal(unlink(path), 0);
    }
    if (!seen)
        skip();
}

static int cmp_str(const void *a, const void *b)
{
    const gguf_str *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->ptr, y->ptr, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static void test_byte_vocab(void **state)
{
    synth_params p = synth_default_params();
    p.n_vocab = 40000; /* reaches the three-letter pieces */
    char path[512];
    gguf_file *f = write_and_open(state, &p, "bytes.gguf", path, sizeof path);
    gguf_str s;
    assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &s), VKI_OK), assert_true(gguf_str_eq(s, "llama"));
    uint32_t u;
    bool b;
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &u), VKI_OK), assert_int_equal(u, 1);
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &u), VKI_OK), assert_int_equal(u, 2);
    assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.unknown_token_id", &u), VKI_OK), assert_int_equal(u, 0);
    assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b), VKI_OK), assert_true(b);
    gguf_str *all = malloc(40000 * sizeof *all);
    for (uint64_t i = 0; i < 40000; i++) {
        int64_t type;
        float score;
        assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", i, &all[i]), VKI_OK);
        assert_int_equal(gguf_arr_i64(f, "tokenizer.ggml.token_type", i, &type), VKI_OK);
        assert_int_equal(gguf_arr_f32(f, "tokenizer.ggml.scores", i, &score), VKI_OK);
        char want[16];
        if (i < 3) {
            assert_true(gguf_str_eq(all[i], i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>"));
            assert_int_equal(type, i == 0 ? 2 : 3);
        } else if (i < 259) {
            snprintf(want, sizeof want, "<0x%02X>", (unsigned)(i - 3));
            assert_true(gguf_str_eq(all[i], want));
            assert_int_equal(type, 6);
        } else {
            assert_int_equal(type, 1);
            assert_true(all[i].len >= 1);
            assert_true(score < 0 || i == 259);
        }
    }
    assert_true(gguf_str_eq(all[259], "\xe2\x96\x81"));
    assert_true(gguf_str_eq(all[260], "!"));
    qsort(all, 40000, sizeof *all, cmp_str);
    for (int i = 1; i < 40000; i++)
        if (!cmp_str(&all[i - 1], &all[i]))
            fail_msg("duplicate piece '%.*s'", (int)all[i].len, all[i].ptr);
    free(all);
    gguf_close(f);
    assert_int_equal(unlink(path), 0);
}

static float *load_f32(const gguf_tensor *t)
{
    uint64_t n = t->ne[0] * t->ne[1];
    float *x = malloc(n * sizeof *x);
    size_t rb = quant_row_bytes(t->type, t->ne[0]);
    for (uint64_t r = 0; r < t->ne[1]; r++)
        dequant_row(t->type, t->data + r * rb, x + r * t->ne[0], t->ne[0]);
    return x;
}

static void matvec(const float *w, const float *x, float *y, uint64_t in, uint64_t out)
{
    for (uint64_t o = 0; o < out; o++) {
        double s = 0;
        for (uint64_t i = 0; i < in; i++)
            s += (double)w[o * in + i] * x[i];
        y[o] = (float)s;
    }
}

static float rms(const float *x, uint64_t n)
{
    double s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return (float)sqrt(s / (double)n);
}

static void rmsnorm(float *o, const float *x, const float *g, uint64_t n, float eps)
{
    float r = rms(x, n);
    for (uint64_t i = 0; i < n; i++)
        o[i] = x[i] / sqrtf(r * r + eps) * g[i];
}

/* One token at position 0 through a 24-layer model: attention over a single position is its V
 * projection (softmax of one score is 1), so this is the whole forward pass for that token.
 * The residual stream must stay O(1) and the logits must be spread (a clear argmax). */
static void test_activations_and_logits(void **state)
{
    synth_params p = synth_default_params();
    p.n_layer = 24, p.d_model = 128, p.n_head = 8, p.n_head_kv = 2, p.d_ff = 384, p.n_vocab = 2000;
    p.wtype = SYNTH_Q8_0, p.seed = 7;
    char path[512];
    gguf_file *f = write_and_open(state, &p, "deep.gguf", path, sizeof path);
    enum { D = 128, KV = 32, FF = 384, V = 2000, HD = 16 };
    float x[D], h[D], v[KV], att[D], o[D], g[FF], u[FF], logits[V];
    float *emb = load_f32(gguf_find_tensor(f, "token_embd.weight"));
    memcpy(x, emb + 100 * D, sizeof x); /* token 100 */
    for (int l = 0; l < 24; l++) {
        float *an = load_f32(tensor(f, "blk.%d.attn_norm.weight", l)), *wv = load_f32(tensor(f, "blk.%d.attn_v.weight", l));
        float *wo = load_f32(tensor(f, "blk.%d.attn_output.weight", l)), *fn = load_f32(tensor(f, "blk.%d.ffn_norm.weight", l));
        float *wg = load_f32(tensor(f, "blk.%d.ffn_gate.weight", l)), *wu = load_f32(tensor(f, "blk.%d.ffn_up.weight", l));
        float *wd = load_f32(tensor(f, "blk.%d.ffn_down.weight", l));
        rmsnorm(h, x, an, D, 1e-5f);
        matvec(wv, h, v, D, KV);
        for (int i = 0; i < D; i++) /* head hh reads kv head hh / (8 / 2) */
            att[i] = v[(i / HD) / 4 * HD + i % HD];
        matvec(wo, att, o, D, D);
        for (int i = 0; i < D; i++)
            x[i] += o[i];
        rmsnorm(h, x, fn, D, 1e-5f);
        matvec(wg, h, g, D, FF);
        matvec(wu, h, u, D, FF);
        for (int i = 0; i < FF; i++)
            g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        matvec(wd, g, o, FF, D);
        for (int i = 0; i < D; i++)
            x[i] += o[i];
        float r = rms(x, D);
        if (!(r > 0.02f && r < 10.0f))
            fail_msg("layer %d: residual rms %g is not O(1)", l, r);
        free(an), free(wv), free(wo), free(fn), free(wg), free(wu), free(wd);
    }
    float *on = load_f32(gguf_find_tensor(f, "output_norm.weight")), *out = load_f32(gguf_find_tensor(f, "output.weight"));
    rmsnorm(h, x, on, D, 1e-5f);
    matvec(out, h, logits, D, V);
    float sd = rms(logits, V), top = -INFINITY, second = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (logits[i] > top)
            second = top, top = logits[i];
        else if (logits[i] > second)
            second = logits[i];
    }
    fprintf(stderr, "  logits: rms %.3f, top %.3f, gap to second %.3f\n", sd, top, top - second);
    assert_true(sd > 1.5f && sd < 6.0f);
    assert_true(top - second > 1e-3f);
    free(on), free(out), free(emb);
    gguf_close(f);
    assert_int_equal(unlink(path), 0);
}

static void test_weights_seeded(void **state)
{
    synth_params p = synth_default_params();
    p.d_model = 256, p.wtype = SYNTH_Q4_K;
    char pa[512], pb[512], pc[512];
    gguf_file *a = write_and_open(state, &p, "a.gguf", pa, sizeof pa), *b = write_and_open(state, &p, "b.gguf", pb, sizeof pb);
    p.seed = 2;
    gguf_file *c = write_and_open(state, &p, "c.gguf", pc, sizeof pc);
    const gguf_tensor *ta = gguf_find_tensor(a, "blk.1.attn_q.weight"), *tb = gguf_find_tensor(b, "blk.1.attn_q.weight");
    const gguf_tensor *tc = gguf_find_tensor(c, "blk.1.attn_q.weight");
    assert_memory_equal(ta->data, tb->data, ta->nbytes);
    assert_memory_not_equal(ta->data, tc->data, ta->nbytes);
    float *w = load_f32(ta), *n = load_f32(gguf_find_tensor(a, "blk.0.ffn_norm.weight"));
    float sd = rms(w, 256 * 256), want = 1.0f / 16.0f;
    assert_true(fabsf(sd - want) < 0.1f * want);
    double mean = 0;
    for (int i = 0; i < 256; i++)
        mean += n[i] / 256.0;
    assert_true(fabs(mean - 1.0) < 0.05);
    free(w), free(n);
    gguf_close(a), gguf_close(b), gguf_close(c);
    unlink(pa), unlink(pb), unlink(pc);
}

/* The writer's workers split each tensor's rows in batches; the file must not depend on how many
 * there are. d_model 1024 x vocab 4096 embeddings take several batches at 1 and at 3 workers
 * (1024 rows each), and 3 does not divide the rows evenly. */
static void test_threads_same_bytes(void **state)
{
    synth_params p = synth_default_params();
    p.d_model = 1024, p.n_head = 8, p.n_vocab = 4096, p.d_ff = 512, p.wtype = SYNTH_Q8_0, p.seed = 5;
    p.tied = true; /* one 4M-weight matrix, not two: the sanitizer build encodes slowly */
    char pa[512], pb[512];
    p.n_threads = 1;
    gguf_file *a = write_and_open(state, &p, "t1.gguf", pa, sizeof pa);
    p.n_threads = 3;
    gguf_file *b = write_and_open(state, &p, "t3.gguf", pb, sizeof pb);
    assert_int_equal(gguf_file_size(a), gguf_file_size(b));
    for (uint64_t i = 0; i < gguf_n_tensors(a); i++) {
        const gguf_tensor *ta = gguf_tensor_at(a, i), *tb = gguf_tensor_at(b, i);
        assert_int_equal(ta->nbytes, tb->nbytes);
        if (memcmp(ta->data, tb->data, ta->nbytes))
            fail_msg("tensor %.*s differs between 1 and 3 writer threads", (int)ta->name.len, ta->name.ptr);
    }
    gguf_close(a), gguf_close(b);
    unlink(pa), unlink(pb);
}

static void test_bad_params(void **state)
{
    char path[512], err[512];
    tmp_path(state, path, sizeof path, "bad.gguf");
    static const char *const needle[] = {"arch",   "n_head_kv", "odd",  "n_vocab", "n_layer",
                                         "divide", "vocabulary file", "YaRN", "YaRN", "YaRN"};
    for (int i = 0; i < 10; i++) {
        synth_params p = synth_default_params();
        if (i == 0)
            p.arch = "gpt2";
        if (i == 1)
            p.n_head_kv = 3;
        if (i == 2)
            p.head_dim = 15;
        if (i == 3)
            p.n_vocab = 258;
        if (i == 4)
            p.n_layer = 0;
        if (i == 5)
            p.n_head = 5, p.n_head_kv = 5;
        if (i == 6)
            p.vocab_from = "/nonexistent/v.gguf";
        if (i == 7) /* YaRN without its original context, below 1, and on phi3 (LongRoPE's) */
            p.yarn_factor = 4;
        if (i == 8)
            p.yarn_factor = 0.5f, p.n_ctx_orig = 128;
        if (i == 9)
            p.arch = "phi3", p.yarn_factor = 4, p.n_ctx_orig = 128;
        err[0] = 0;
        vki_status st = synth_write(&p, path, err, sizeof err);
        if (st >= 0 || !strstr(err, needle[i]))
            fail_msg("case %d: status %d, message '%s' (want '%s')", i, st, err, needle[i]);
        assert_int_equal(access(path, F_OK), -1);
    }
    assert_int_equal(synth_write(&(synth_params){0}, path, err, sizeof err), VKI_ERR_INVALID_ARG);
    synth_params p = synth_default_params();
    assert_int_equal(synth_write(&p, "/nonexistent/dir/m.gguf", err, sizeof err), VKI_ERR_IO);
    synth_wtype t;
    assert_true(synth_wtype_parse("Q4_K_M", &t)), assert_int_equal(t, SYNTH_Q4_K_M);
    assert_true(synth_wtype_parse("IQ4_XS", &t)), assert_int_equal(t, SYNTH_IQ4_XS);
    assert_true(synth_wtype_parse("q3_k_l", &t)), assert_true(synth_wtype_is_mix(t));
    assert_false(synth_wtype_is_mix(SYNTH_Q3_K));
    assert_false(synth_wtype_parse("q7_k", &t));
    for (int i = 0; i < SYNTH_WTYPE_COUNT; i++) /* names round-trip */
        assert_true(synth_wtype_parse(synth_wtype_name((synth_wtype)i), &t)), assert_int_equal(t, i);
    for (const char *const *n = synth_preset_names(); *n; n++)
        assert_int_equal(synth_preset(*n, &p), VKI_OK);
    assert_int_equal(synth_preset("nope", &p), VKI_ERR_NOT_FOUND);
}

/* gguf_fingerprint (session files refuse another model's KV by it): the same weights give the
 * same fingerprint, another seed of the same shape (another fine-tune) another one; a new
 * general.name or chat template keeps it, a hyperparameter change does not. */
static void test_fingerprint(void **state)
{
    synth_params p = synth_default_params();
    char pa[512], pb[512], pc[512], pd[512], pe[512];
    gguf_file *a = write_and_open(state, &p, "fa.gguf", pa, sizeof pa), *b = write_and_open(state, &p, "fb.gguf", pb, sizeof pb);
    p.seed = 2;
    gguf_file *c = write_and_open(state, &p, "fc.gguf", pc, sizeof pc);
    assert_true(gguf_fingerprint(a) == gguf_fingerprint(b));
    assert_true(gguf_fingerprint(a) != gguf_fingerprint(c));
    tmp_path(state, pd, sizeof pd, "fd.gguf");
    tmp_path(state, pe, sizeof pe, "fe.gguf");
    const gguf_edit rename[] = {{.kind = GGUF_EDIT_STR, .name = "general.name", .s = "renamed"},
                                {.kind = GGUF_EDIT_STR, .name = "tokenizer.chat_template", .s = "{{ x }}"}};
    const gguf_edit rope[] = {{.kind = GGUF_EDIT_F32, .name = "llama.rope.freq_base", .f = 5000.0f}};
    assert_int_equal(gguf_edit_copy(pa, pd, rename, 2), VKI_OK);
    assert_int_equal(gguf_edit_copy(pa, pe, rope, 1), VKI_OK);
    char err[256];
    gguf_file *d = NULL, *e = NULL;
    assert_int_equal(gguf_open(pd, &d, err, sizeof err), VKI_OK);
    assert_int_equal(gguf_open(pe, &e, err, sizeof err), VKI_OK);
    assert_true(gguf_fingerprint(a) == gguf_fingerprint(d));
    assert_true(gguf_fingerprint(a) != gguf_fingerprint(e));
    gguf_close(a), gguf_close(b), gguf_close(c), gguf_close(d), gguf_close(e);
    unlink(pa), unlink(pb), unlink(pc), unlink(pd), unlink(pe);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_q4_k_m_mix),
        cmocka_unit_test(test_every_type_and_fallback),
        cmocka_unit_test(test_llama_fallbacks),
        cmocka_unit_test(test_mixes_match_llama_quantize),
        cmocka_unit_test(test_vocab_copied),
        cmocka_unit_test(test_byte_vocab),
        cmocka_unit_test(test_activations_and_logits),
        cmocka_unit_test(test_weights_seeded),
        cmocka_unit_test(test_threads_same_bytes),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_fingerprint),
    };
    if (getenv("VKI_TEST_FILTER")) /* one test while developing: VKI_TEST_FILTER=test_fingerprint */
        cmocka_set_test_filter(getenv("VKI_TEST_FILTER"));
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
