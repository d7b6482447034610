/* GGUF reader: the real files in ../shared/models (stories260K, the vocab GGUFs), files built
 * byte by byte here from the specification (independent of our writer), typed accessors, and
 * a corpus of malformed files (truncations, absurd counts and sizes, wrong types, byte flips)
 * that must all give an error status with a message, never a crash, leak or over-read (the CI
 * runs this suite under ASan+UBSan; every buffer handed to the reader is malloc'ed to its exact
 * size so an over-read is caught). */
#include "support/vt.h"

#include "engine/gguf.h"
#include "engine/gguf_write.h"
#include "engine/model_meta.h"
#include "engine/quant.h"
#include "engine/synth.h"
#include "support/gguf_edit.h"

#include <sys/wait.h>
#include <unistd.h>

/* ---- a byte builder for hand-made files ----------------------------------------------------- */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bb_put(bb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u32(bb *b, uint32_t v) { bb_put(b, &v, 4); } /* the test hosts are little-endian */
static void bb_u64(bb *b, uint64_t v) { bb_put(b, &v, 8); }
static void bb_str(bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}
static void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bb_put(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(bb *b, const char *key, uint32_t v)
{
    bb_str(b, key);
    bb_u32(b, GGUF_TYPE_UINT32);
    bb_u32(b, v);
}
static void bb_kv_str(bb *b, const char *key, const char *v)
{
    bb_str(b, key);
    bb_u32(b, GGUF_TYPE_STRING);
    bb_str(b, v);
}
static void bb_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        bb_u64(b, ne[i]);
    bb_u32(b, type);
    bb_u64(b, off);
}
static void bb_pad(bb *b, size_t align)
{
    while (b->n % align)
        bb_u8(b, 0);
}

/* Opens an exact-size heap copy of (p, n), so ASan catches any read past n. Returns the status,
 * closes on success unless *keep is wanted. */
static vki_status open_copy(const uint8_t *p, size_t n, char *err, size_t err_len)
{
    uint8_t *c = malloc(n ? n : 1);
    assert_non_null(c);
    memcpy(c, p, n);
    gguf_file *f = NULL;
    err[0] = 0;
    vki_status st = gguf_open_memory(c, n, &f, err, err_len);
    if (st == VKI_OK) {
        /* touch everything the reader hands out */
        for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
            const gguf_kv *kv = gguf_kv_at(f, i);
            assert_true(kv->value + kv->value_bytes <= c + n);
        }
        for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            assert_true(t->data >= c && t->data + t->nbytes <= c + n);
        }
        gguf_close(f);
    } else {
        assert_null(f);
    }
    free(c);
    return st;
}

static void expect_error(const uint8_t *p, size_t n, vki_status want, const char *needle)
{
    char err[512];
    vki_status st = open_copy(p, n, err, sizeof err);
    if (st != want || !err[0] || (needle && !strstr(err, needle)))
        fail_msg("expected status %d with '%s', got %d: '%s'", want, needle ? needle : "", st, err);
}

/* ---- real files ------------------------------------------------------------------------------ */

static gguf_file *open_shared(const char *name)
{
    char path[1024], err[512];
    if (!vt_shared_model(name, path, sizeof path)) {
        fprintf(stderr, "skipping: %s/models/%s is absent\n", VKI_SHARED_DIR, name);
        return NULL;
    }
    gguf_file *f = NULL;
    vki_status st = gguf_open(path, &f, err, sizeof err);
    if (st != VKI_OK)
        fail_msg("%s: %s", path, err);
    return f;
}

static void assert_str(gguf_str s, const char *want)
{
    if (!gguf_str_eq(s, want))
        fail_msg("got '%.*s', want '%s'", (int)s.len, s.ptr, want);
}

static void assert_shape(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t)
        fail_msg("tensor %s missing", name);
    assert_int_equal(t->type, VKI_GGML_F32);
    assert_int_equal(t->n_dims, ne1 ? 2 : 1);
    assert_int_equal(t->ne[0], ne0);
    assert_int_equal(t->ne[1], ne1 ? ne1 : 1);
    assert_int_equal(t->nbytes, ne0 * (ne1 ? ne1 : 1) * 4);
}

static void test_stories260k(void **state)
{
    gguf_file *f = open_shared("stories260K.gguf");
    if (!f)
        skip();
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), 32);
    assert_int_equal(gguf_n_tensors(f), 48);
    gguf_str s;
    assert_int_equal(gguf_get_str(f, "general.architecture", &s), VKI_OK);
    assert_str(s, "llama");
    uint32_t u;
    float eps;
    assert_int_equal(gguf_get_u32(f, "llama.embedding_length", &u), VKI_OK);
    assert_int_equal(u, 64);
    assert_int_equal(gguf_get_u32(f, "llama.feed_forward_length", &u), VKI_OK);
    assert_int_equal(u, 172);
    assert_int_equal(gguf_get_u32(f, "llama.block_count", &u), VKI_OK);
    assert_int_equal(u, 5);
    assert_int_equal(gguf_get_u32(f, "llama.attention.head_count", &u), VKI_OK);
    assert_int_equal(u, 8);
    assert_int_equal(gguf_get_u32(f, "llama.attention.head_count_kv", &u), VKI_OK);
    assert_int_equal(u, 4);
    assert_int_equal(gguf_get_u32(f, "llama.context_length", &u), VKI_OK);
    assert_int_equal(u, 2048);
    assert_int_equal(gguf_get_u32(f, "llama.rope.dimension_count", &u), VKI_OK);
    assert_int_equal(u, 8);
    assert_int_equal(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps), VKI_OK);
    assert_float_equal(eps, 1e-5f, 1e-12f);
    assert_int_equal(gguf_get_f32(f, "llama.rope.freq_base", &eps), VKI_ERR_NOT_FOUND);

    gguf_type et;
    uint64_t n;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n), VKI_OK);
    assert_int_equal(et, GGUF_TYPE_STRING);
    assert_int_equal(n, 512);
    const char *want[] = {"<unk>", "<s>", "</s>", "<0x00>"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", (uint64_t)i, &s), VKI_OK);
        assert_str(s, want[i]);
    }
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 258, &s), VKI_OK);
    assert_str(s, "<0xFF>");
    assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 512, &s), VKI_ERR_INVALID_ARG);
    int64_t tt;
    assert_int_equal(gguf_arr_i64(f, "tokenizer.ggml.token_type", 3, &tt), VKI_OK);
    assert_int_equal(tt, 6); /* byte token */

    assert_shape(f, "token_embd.weight", 64, 512);
    assert_shape(f, "output.weight", 64, 512);
    assert_shape(f, "output_norm.weight", 64, 0);
    for (int l = 0; l < 5; l++) {
        char nm[64];
        struct { const char *t; uint64_t a, b; } sh[] = {
            {"attn_q", 64, 64}, {"attn_k", 64, 32}, {"attn_v", 64, 32}, {"attn_output", 64, 64},
            {"ffn_gate", 64, 172}, {"ffn_up", 64, 172}, {"ffn_down", 172, 64}, {"attn_norm", 64, 0}, {"ffn_norm", 64, 0},
        };
        for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, sh[i].t);
            assert_shape(f, nm, sh[i].a, sh[i].b);
        }
    }
    assert_null(gguf_find_tensor(f, "blk.5.attn_q.weight"));
    /* the README says output.weight is a copy of token_embd.weight: the data pointers are right */
    const gguf_tensor *e = gguf_find_tensor(f, "token_embd.weight"), *o = gguf_find_tensor(f, "output.weight");
    assert_ptr_not_equal(e->data, o->data);
    assert_memory_equal(e->data, o->data, e->nbytes);
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++)
        assert_int_equal((gguf_tensor_at(f, i)->data - gguf_tensor_at(f, 0)->data) % 32, 0);
    gguf_close(f);
}

/* Every string of a string array read by walking the raw bytes equals the indexed lookup. */
static void check_str_index(const gguf_file *f, const char *key, uint64_t want_n)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    assert_non_null(kv);
    assert_int_equal(kv->type, GGUF_TYPE_ARRAY);
    assert_int_equal(kv->arr_type, GGUF_TYPE_STRING);
    assert_int_equal(kv->arr_n, want_n);
    const uint8_t *p = kv->value;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        uint64_t len;
        memcpy(&len, p, 8);
        gguf_str s;
        assert_int_equal(gguf_arr_str(f, key, i, &s), VKI_OK);
        assert_int_equal(s.len, len);
        assert_ptr_equal(s.ptr, (const char *)p + 8);
        p += 8 + len;
    }
    assert_ptr_equal(p, kv->value + kv->value_bytes);
}

static void test_vocab_files(void **state)
{
    static const struct { const char *file, *model, *tok0, *merge0; uint64_t n_tok, n_merge; } v[] = {
        {"vocab/ggml-vocab-gpt-2.gguf", "gpt2", "!", "\xc4\xa0 t", 50257, 50000},
        {"vocab/ggml-vocab-starcoder.gguf", "gpt2", "<|endoftext|>", "\xc4\xa0 \xc4\xa0", 49152, 48872},
        {"vocab/ggml-vocab-deepseek-coder.gguf", "gpt2", "!", "\xc4\xa0 \xc4\xa0", 32256, 31757},
        {"vocab/ggml-vocab-deepseek-llm.gguf", "gpt2", "!", "\xc4\xa0 \xc4\xa0", 102400, 99757},
        {"vocab/ggml-vocab-llama-spm.gguf", "llama", "<unk>", NULL, 32000, 0},
    };
    int seen = 0;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        gguf_file *f = open_shared(v[i].file);
        if (!f)
            continue;
        seen++;
        assert_int_equal(gguf_n_tensors(f), 0);
        gguf_str s;
        assert_int_equal(gguf_get_str(f, "tokenizer.ggml.model", &s), VKI_OK);
        assert_str(s, v[i].model);
        check_str_index(f, "tokenizer.ggml.tokens", v[i].n_tok);
        assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.tokens", 0, &s), VKI_OK);
        assert_str(s, v[i].tok0);
        if (v[i].merge0) {
            check_str_index(f, "tokenizer.ggml.merges", v[i].n_merge);
            assert_int_equal(gguf_arr_str(f, "tokenizer.ggml.merges", 0, &s), VKI_OK);
            assert_str(s, v[i].merge0);
        } else {
            float sc;
            assert_null(gguf_find_kv(f, "tokenizer.ggml.merges"));
            assert_int_equal(gguf_arr_f32(f, "tokenizer.ggml.scores", v[i].n_tok - 1, &sc), VKI_OK);
            assert_int_equal(gguf_arr_f32(f, "tokenizer.ggml.scores", v[i].n_tok, &sc), VKI_ERR_INVALID_ARG);
        }
        uint32_t bos;
        assert_int_equal(gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos), VKI_OK);
        assert_true(bos < v[i].n_tok);
        gguf_close(f);
    }
    if (!seen)
        skip();
}

static void test_open_errors(void **state)
{
    char err[512];
    gguf_file *f = (gguf_file *)&err;
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &f, err, sizeof err), VKI_ERR_IO);
    assert_null(f);
    assert_non_null(strstr(err, "/nonexistent/x.gguf"));
    assert_int_equal(gguf_open("/", &f, err, sizeof err), VKI_ERR_IO);
    char tmp[] = "/tmp/vki_gguf_emptyXXXXXX";
    int fd = mkstemp(tmp);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(gguf_open(tmp, &f, err, sizeof err), VKI_ERR_FORMAT);
    assert_non_null(strstr(err, "empty"));
    unlink(tmp);
    /* a NULL / zero-length error buffer is allowed */
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &f, NULL, 0), VKI_ERR_IO);
}

/* ---- hand-made files ------------------------------------------------------------------------- */

/* A file with every scalar type, a string, arrays, two tensors of different types. */
static bb build_all_types(uint32_t version)
{
    bb b = {0};
    bb_header(&b, version, 2, 16);
    bb_str(&b, "t.u8"), bb_u32(&b, GGUF_TYPE_UINT8), bb_u8(&b, 200);
    bb_str(&b, "t.i8"), bb_u32(&b, GGUF_TYPE_INT8), bb_u8(&b, (uint8_t)-5);
    bb_str(&b, "t.u16"), bb_u32(&b, GGUF_TYPE_UINT16), bb_u8(&b, 0x34), bb_u8(&b, 0x12);
    bb_str(&b, "t.i16"), bb_u32(&b, GGUF_TYPE_INT16), bb_u8(&b, 0xfe), bb_u8(&b, 0xff);
    bb_kv_u32(&b, "t.u32", 4000000000u);
    bb_str(&b, "t.i32"), bb_u32(&b, GGUF_TYPE_INT32), bb_u32(&b, (uint32_t)-7);
    float fv = 0.25f;
    double dv = -1.5;
    bb_str(&b, "t.f32"), bb_u32(&b, GGUF_TYPE_FLOAT32), bb_put(&b, &fv, 4);
    bb_str(&b, "t.bool"), bb_u32(&b, GGUF_TYPE_BOOL), bb_u8(&b, 1);
    bb_kv_str(&b, "t.str", "h\xc3\xa9llo");
    bb_str(&b, "t.u64"), bb_u32(&b, GGUF_TYPE_UINT64), bb_u64(&b, UINT64_MAX);
    bb_str(&b, "t.i64"), bb_u32(&b, GGUF_TYPE_INT64), bb_u64(&b, (uint64_t)INT64_MIN);
    bb_str(&b, "t.f64"), bb_u32(&b, GGUF_TYPE_FLOAT64), bb_put(&b, &dv, 8);
    bb_str(&b, "t.arr_i16"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_INT16), bb_u64(&b, 3);
    int16_t ai[3] = {-1, 2, 300};
    bb_put(&b, ai, 6);
    bb_str(&b, "t.arr_str"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_STRING), bb_u64(&b, 3);
    bb_str(&b, "a"), bb_str(&b, ""), bb_str(&b, "ccc");
    bb_str(&b, "t.arr_empty"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_FLOAT32), bb_u64(&b, 0);
    bb_kv_u32(&b, "general.alignment", 64);
    uint64_t ne_a[2] = {4, 3}, ne_b[1] = {32};
    bb_tensor(&b, "a", 2, ne_a, VKI_GGML_F32, 0);
    bb_tensor(&b, "b", 1, ne_b, VKI_GGML_Q8_0, 64);
    bb_pad(&b, 64);
    for (int i = 0; i < 48; i++) /* tensor a (12 floats) then padding */
        bb_u8(&b, (uint8_t)i);
    for (int i = 0; i < 16 + 34; i++)
        bb_u8(&b, (uint8_t)(0xa0 + i));
    return b;
}

static void test_typed_accessors(void **state)
{
    bb b = build_all_types(3);
    gguf_file *f;
    char err[256];
    assert_int_equal(gguf_open_memory(b.p, b.n, &f, err, sizeof err), VKI_OK);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float fl;
    bool bo;
    gguf_str s;
    assert_int_equal(gguf_get_u32(f, "t.u8", &u32), VKI_OK), assert_int_equal(u32, 200);
    assert_int_equal(gguf_get_u32(f, "t.u16", &u32), VKI_OK), assert_int_equal(u32, 0x1234);
    assert_int_equal(gguf_get_u32(f, "t.u32", &u32), VKI_OK), assert_int_equal(u32, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "t.i8", &i64), VKI_OK), assert_int_equal(i64, -5);
    assert_int_equal(gguf_get_i64(f, "t.i16", &i64), VKI_OK), assert_int_equal(i64, -2);
    assert_int_equal(gguf_get_i64(f, "t.i32", &i64), VKI_OK), assert_int_equal(i64, -7);
    assert_int_equal(gguf_get_i64(f, "t.i64", &i64), VKI_OK), assert_true(i64 == INT64_MIN);
    assert_int_equal(gguf_get_u64(f, "t.u64", &u64), VKI_OK), assert_true(u64 == UINT64_MAX);
    /* out of range or wrong kind: FORMAT, out untouched */
    u32 = 77;
    assert_int_equal(gguf_get_u32(f, "t.i32", &u32), VKI_ERR_FORMAT);
    assert_int_equal(gguf_get_u32(f, "t.u64", &u32), VKI_ERR_FORMAT);
    assert_int_equal(gguf_get_u32(f, "t.str", &u32), VKI_ERR_FORMAT);
    assert_int_equal(gguf_get_u32(f, "t.f32", &u32), VKI_ERR_FORMAT);
    assert_int_equal(u32, 77);
    assert_int_equal(gguf_get_i64(f, "t.u64", &i64), VKI_ERR_FORMAT);
    assert_int_equal(gguf_get_u32(f, "t.absent", &u32), VKI_ERR_NOT_FOUND);
    assert_int_equal(gguf_get_f32(f, "t.f32", &fl), VKI_OK), assert_true(fl == 0.25f);
    assert_int_equal(gguf_get_f32(f, "t.f64", &fl), VKI_OK), assert_true(fl == -1.5f);
    assert_int_equal(gguf_get_f32(f, "t.i32", &fl), VKI_OK), assert_true(fl == -7.0f);
    assert_int_equal(gguf_get_f32(f, "t.bool", &fl), VKI_ERR_FORMAT);
    assert_int_equal(gguf_get_bool(f, "t.bool", &bo), VKI_OK), assert_true(bo);
    assert_int_equal(gguf_get_bool(f, "t.u8", &bo), VKI_ERR_FORMAT);
    assert_int_equal(gguf_get_str(f, "t.str", &s), VKI_OK), assert_str(s, "h\xc3\xa9llo");
    assert_int_equal(gguf_get_str(f, "t.arr_str", &s), VKI_ERR_FORMAT);
    gguf_type et;
    uint64_t n;
    assert_int_equal(gguf_get_arr(f, "t.arr_i16", &et, &n), VKI_OK);
    assert_int_equal(et, GGUF_TYPE_INT16), assert_int_equal(n, 3);
    assert_int_equal(gguf_arr_i64(f, "t.arr_i16", 0, &i64), VKI_OK), assert_int_equal(i64, -1);
    assert_int_equal(gguf_arr_i64(f, "t.arr_i16", 2, &i64), VKI_OK), assert_int_equal(i64, 300);
    assert_int_equal(gguf_arr_f32(f, "t.arr_i16", 1, &fl), VKI_OK), assert_true(fl == 2.0f);
    assert_int_equal(gguf_arr_i64(f, "t.arr_i16", 3, &i64), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_arr_i64(f, "t.arr_str", 0, &i64), VKI_ERR_FORMAT);
    assert_int_equal(gguf_arr_str(f, "t.arr_i16", 0, &s), VKI_ERR_FORMAT);
    assert_int_equal(gguf_arr_str(f, "t.u8", 0, &s), VKI_ERR_FORMAT);
    assert_int_equal(gguf_arr_str(f, "t.nope", 0, &s), VKI_ERR_NOT_FOUND);
    const char *strs[] = {"a", "", "ccc"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(gguf_arr_str(f, "t.arr_str", (uint64_t)i, &s), VKI_OK), assert_str(s, strs[i]);
    assert_int_equal(gguf_get_arr(f, "t.arr_empty", &et, &n), VKI_OK), assert_int_equal(n, 0);
    assert_int_equal(gguf_arr_f32(f, "t.arr_empty", 0, &fl), VKI_ERR_INVALID_ARG);
    /* the tensors: alignment 64 honoured */
    assert_int_equal(gguf_alignment(f), 64);
    assert_int_equal(gguf_data_offset(f) % 64, 0);
    const gguf_tensor *ta = gguf_find_tensor(f, "a"), *tb = gguf_find_tensor(f, "b");
    assert_non_null(ta), assert_non_null(tb);
    assert_int_equal(ta->nbytes, 48), assert_int_equal(tb->nbytes, 34);
    assert_ptr_equal(ta->data, b.p + gguf_data_offset(f));
    assert_int_equal(ta->data[5], 5);
    assert_ptr_equal(tb->data, ta->data + 64);
    assert_int_equal(tb->data[0], 0xa0 + 16);
    assert_int_equal(gguf_n_kv(f), 16);
    assert_ptr_equal(gguf_kv_at(f, 15), gguf_find_kv(f, "general.alignment"));
    assert_null(gguf_kv_at(f, 16));
    assert_null(gguf_tensor_at(f, 2));
    gguf_close(f);
    free(b.p);
}

static void test_versions(void **state)
{
    char err[256];
    bb b = build_all_types(2);
    assert_int_equal(open_copy(b.p, b.n, err, sizeof err), VKI_OK);
    b.p[4] = 1;
    expect_error(b.p, b.n, VKI_ERR_UNSUPPORTED, "version 1");
    b.p[4] = 4;
    expect_error(b.p, b.n, VKI_ERR_UNSUPPORTED, "version 4");
    b.p[4] = 0, b.p[7] = 3; /* a big-endian v3 header */
    expect_error(b.p, b.n, VKI_ERR_UNSUPPORTED, "big-endian");
    b.p[7] = 0, b.p[4] = 3, b.p[0] = 'g';
    expect_error(b.p, b.n, VKI_ERR_FORMAT, "magic");
    free(b.p);
}


/* ---- writer round trips ---------------------------------------------------------------------- */

/* Bytes written through an open_memstream, as an exact-size heap buffer. */
typedef struct memfile {
    char *p;
    size_t n;
    FILE *fp;
} memfile;

/* open_memstream keeps pointers to m's fields: m must stay where it is until mem_close. */
static void mem_open(memfile *m)
{
    *m = (memfile){0};
    m->fp = open_memstream(&m->p, &m->n);
    assert_non_null(m->fp);
}

static void mem_close(memfile *m)
{
    assert_int_equal(fclose(m->fp), 0);
    m->fp = NULL;
}

/* Odd sizes on purpose: 22-byte Q5_0 and 110-byte Q3_K blocks and 7-element BF16 rows leave the
 * next tensor unaligned until the writer pads; IQ2_XXS is a type vkinfer reads but cannot run. */
static const uint64_t wt_shapes[][4] = {{5, 3, 1, 1}, {64, 2, 1, 1}, {256, 1, 1, 1}, {7, 1, 2, 3}, {512, 3, 1, 1},
                                        {96, 3, 1, 1}, {256, 1, 1, 1}, {7, 5, 1, 1}, {512, 2, 1, 1}, {256, 2, 1, 1}};
static const uint32_t wt_types[] = {VKI_GGML_F32, VKI_GGML_Q8_0, VKI_GGML_Q4_K, VKI_GGML_F16, VKI_GGML_Q6_K,
                                    VKI_GGML_Q5_0, VKI_GGML_Q3_K, VKI_GGML_BF16, VKI_GGML_IQ4_XS, 16};
static const uint32_t wt_dims[] = {2, 2, 1, 4, 2, 2, 1, 2, 2, 2};
#define WT_N (sizeof wt_types / sizeof wt_types[0])

static void build_writer_file(gguf_writer *w, vt_rng *r, uint8_t **data, uint64_t *total)
{
    assert_int_equal(gguf_w_set_u8(w, "w.u8", 250), VKI_OK);
    assert_int_equal(gguf_w_set_i8(w, "w.i8", -100), VKI_OK);
    assert_int_equal(gguf_w_set_u16(w, "w.u16", 60000), VKI_OK);
    assert_int_equal(gguf_w_set_i16(w, "w.i16", -30000), VKI_OK);
    assert_int_equal(gguf_w_set_u32(w, "w.u32", 4000000000u), VKI_OK);
    assert_int_equal(gguf_w_set_i32(w, "w.i32", -2000000000), VKI_OK);
    assert_int_equal(gguf_w_set_u64(w, "w.u64", 1ull << 60), VKI_OK);
    assert_int_equal(gguf_w_set_i64(w, "w.i64", -(1ll << 60)), VKI_OK);
    assert_int_equal(gguf_w_set_f32(w, "w.f32", 3.5f), VKI_OK);
    assert_int_equal(gguf_w_set_f64(w, "w.f64", 1e-300), VKI_OK);
    assert_int_equal(gguf_w_set_bool(w, "w.bool", true), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "w.str", "\xe2\x96\x81hello"), VKI_OK);
    assert_int_equal(gguf_w_set_strn(w, "w.strn", "a\0b", 3), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "w.empty", ""), VKI_OK);
    int32_t ai[4] = {1, -2, 3, -4};
    float af[3] = {0.5f, -1.0f, 1e30f};
    uint8_t ab[2] = {1, 0};
    assert_int_equal(gguf_w_set_arr(w, "w.arr_i32", GGUF_TYPE_INT32, ai, 4), VKI_OK);
    assert_int_equal(gguf_w_set_arr(w, "w.arr_f32", GGUF_TYPE_FLOAT32, af, 3), VKI_OK);
    assert_int_equal(gguf_w_set_arr(w, "w.arr_bool", GGUF_TYPE_BOOL, ab, 2), VKI_OK);
    assert_int_equal(gguf_w_set_arr(w, "w.arr_none", GGUF_TYPE_UINT64, NULL, 0), VKI_OK);
    gguf_str ss[3] = {{"x", 1}, {"", 0}, {"n\0ul", 4}};
    assert_int_equal(gguf_w_set_arr_str(w, "w.arr_str", ss, 3), VKI_OK);
    *total = 0;
    for (int i = 0; i < (int)WT_N; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "t%d.weight", i);
        assert_int_equal(gguf_w_add_tensor(w, nm, wt_types[i], wt_dims[i], wt_shapes[i]), VKI_OK);
        *total += gguf_w_tensor_bytes(w, (uint64_t)i);
    }
    *data = malloc(*total);
    for (uint64_t i = 0; i < *total; i++)
        (*data)[i] = (uint8_t)vt_u64(r);
}

static void check_writer_file(const uint8_t *p, size_t n, const uint8_t *data, uint64_t align)
{
    gguf_file *f;
    char err[256];
    if (gguf_open_memory(p, n, &f, err, sizeof err) != VKI_OK)
        fail_msg("written file does not load: %s", err);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), align);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float fl;
    bool bo;
    gguf_str s;
    assert_int_equal(gguf_get_u32(f, "w.u8", &u32), VKI_OK), assert_int_equal(u32, 250);
    assert_int_equal(gguf_get_i64(f, "w.i8", &i64), VKI_OK), assert_int_equal(i64, -100);
    assert_int_equal(gguf_get_u32(f, "w.u16", &u32), VKI_OK), assert_int_equal(u32, 60000);
    assert_int_equal(gguf_get_i64(f, "w.i16", &i64), VKI_OK), assert_int_equal(i64, -30000);
    assert_int_equal(gguf_get_u32(f, "w.u32", &u32), VKI_OK), assert_int_equal(u32, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "w.i32", &i64), VKI_OK), assert_int_equal(i64, -2000000000);
    assert_int_equal(gguf_get_u64(f, "w.u64", &u64), VKI_OK), assert_true(u64 == 1ull << 60);
    assert_int_equal(gguf_get_i64(f, "w.i64", &i64), VKI_OK), assert_true(i64 == -(1ll << 60));
    assert_int_equal(gguf_get_f32(f, "w.f32", &fl), VKI_OK), assert_true(fl == 3.5f);
    assert_int_equal(gguf_find_kv(f, "w.f64")->type, GGUF_TYPE_FLOAT64);
    double d;
    memcpy(&d, gguf_find_kv(f, "w.f64")->value, 8);
    assert_true(d == 1e-300);
    assert_int_equal(gguf_get_bool(f, "w.bool", &bo), VKI_OK), assert_true(bo);
    assert_int_equal(gguf_get_str(f, "w.str", &s), VKI_OK), assert_str(s, "\xe2\x96\x81hello");
    assert_int_equal(gguf_get_str(f, "w.strn", &s), VKI_OK);
    assert_int_equal(s.len, 3), assert_memory_equal(s.ptr, "a\0b", 3);
    assert_int_equal(gguf_get_str(f, "w.empty", &s), VKI_OK), assert_int_equal(s.len, 0);
    assert_int_equal(gguf_arr_i64(f, "w.arr_i32", 3, &i64), VKI_OK), assert_int_equal(i64, -4);
    assert_int_equal(gguf_arr_f32(f, "w.arr_f32", 2, &fl), VKI_OK), assert_true(fl == 1e30f);
    assert_int_equal(gguf_find_kv(f, "w.arr_bool")->arr_type, GGUF_TYPE_BOOL);
    assert_int_equal(gguf_find_kv(f, "w.arr_bool")->value[0], 1);
    gguf_type et;
    uint64_t an;
    assert_int_equal(gguf_get_arr(f, "w.arr_none", &et, &an), VKI_OK);
    assert_int_equal(et, GGUF_TYPE_UINT64), assert_int_equal(an, 0);
    assert_int_equal(gguf_arr_str(f, "w.arr_str", 2, &s), VKI_OK);
    assert_int_equal(s.len, 4), assert_memory_equal(s.ptr, "n\0ul", 4);
    assert_int_equal(gguf_arr_str(f, "w.arr_str", 1, &s), VKI_OK), assert_int_equal(s.len, 0);
    assert_int_equal(gguf_n_kv(f), 19 + (align != 32));
    assert_int_equal(gguf_n_tensors(f), WT_N);
    uint64_t off = 0;
    for (int i = 0; i < (int)WT_N; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, (uint64_t)i);
        char nm[32];
        snprintf(nm, sizeof nm, "t%d.weight", i);
        assert_str(t->name, nm);
        assert_int_equal(t->type, wt_types[i]);
        assert_int_equal(t->n_dims, wt_dims[i]);
        for (int k = 0; k < 4; k++)
            assert_int_equal(t->ne[k], wt_shapes[i][k]);
        assert_int_equal(t->offset % align, 0);
        assert_int_equal((uint64_t)(t->data - p) % align, 0);
        assert_memory_equal(t->data, data + off, t->nbytes);
        off += t->nbytes;
    }
    gguf_close(f);
}

static void test_writer_roundtrip(void **state)
{
    vt_rng r = vt_rng_seeded("writer");
    for (int pass = 0; pass < 2; pass++) {
        gguf_writer *w;
        assert_int_equal(gguf_w_create(&w), VKI_OK);
        if (pass)
            assert_int_equal(gguf_w_set_u32(w, "general.alignment", 256), VKI_OK);
        uint8_t *data;
        uint64_t total;
        build_writer_file(w, &r, &data, &total);
        memfile m;
        mem_open(&m);
        assert_int_equal(gguf_w_begin(w, m.fp), VKI_OK);
        for (uint64_t done = 0; done < total;) { /* random chunks that straddle tensors */
            uint64_t k = vt_range(&r, 0, 700);
            k = k > total - done ? total - done : k;
            assert_int_equal(gguf_w_data(w, data + done, (size_t)k), VKI_OK);
            done += k;
        }
        assert_int_equal(gguf_w_data(w, data, 1), VKI_ERR_INVALID_ARG);
        assert_int_equal(gguf_w_finish(w), VKI_OK);
        gguf_w_destroy(w);
        mem_close(&m);
        uint8_t *exact = malloc(m.n);
        memcpy(exact, m.p, m.n);
        check_writer_file(exact, m.n, data, pass ? 256 : 32);
        free(exact), free(m.p), free(data);
    }
}

static void test_writer_errors(void **state)
{
    gguf_writer *w;
    assert_int_equal(gguf_w_create(&w), VKI_OK);
    uint64_t ne[4] = {256, 2, 1, 1}, bad[2] = {100, 2}, zero[2] = {32, 0};
    assert_int_equal(gguf_w_set_u32(w, "a", 1), VKI_OK);
    assert_int_equal(gguf_w_set_str(w, "a", "x"), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(gguf_w_error(w), "'a'"));
    assert_int_equal(gguf_w_set_u32(w, "", 1), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_set_u32(w, "general.alignment", 48), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_set_u8(w, "general.alignment", 64), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_set_arr(w, "s", GGUF_TYPE_STRING, NULL, 0), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_add_tensor(w, "q", VKI_GGML_Q4_K, 2, ne), VKI_OK);
    assert_int_equal(gguf_w_add_tensor(w, "q", VKI_GGML_F32, 2, ne), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_add_tensor(w, "b", VKI_GGML_Q4_K, 2, bad), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_add_tensor(w, "z", VKI_GGML_F32, 2, zero), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_add_tensor(w, "d", VKI_GGML_F32, 0, ne), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_add_tensor(w, "d", VKI_GGML_F32, 5, ne), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_add_tensor(w, "u", 4, 2, ne), VKI_ERR_UNSUPPORTED); /* no such ggml type */
    char longname[80];
    memset(longname, 'n', 65), longname[65] = 0;
    assert_int_equal(gguf_w_add_tensor(w, longname, VKI_GGML_F32, 1, ne), VKI_ERR_INVALID_ARG);
    longname[64] = 0;
    assert_int_equal(gguf_w_add_tensor(w, longname, VKI_GGML_F32, 1, ne), VKI_OK);
    assert_int_equal(gguf_w_data(w, "x", 1), VKI_ERR_INVALID_ARG); /* before begin */
    memfile m;
    mem_open(&m);
    assert_int_equal(gguf_w_begin(w, m.fp), VKI_OK);
    assert_int_equal(gguf_w_begin(w, m.fp), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_set_u32(w, "late", 1), VKI_ERR_INVALID_ARG);
    assert_int_equal(gguf_w_add_tensor(w, "late", VKI_GGML_F32, 1, ne), VKI_ERR_INVALID_ARG);
    uint8_t buf[300] = {0};
    assert_int_equal(gguf_w_data(w, buf, 300), VKI_OK);
    assert_int_equal(gguf_w_finish(w), VKI_ERR_INVALID_ARG); /* q has 288 bytes, t 1024: incomplete */
    assert_non_null(strstr(gguf_w_error(w), "bytes"));
    gguf_w_destroy(w);
    mem_close(&m);
    free(m.p);
    assert_int_equal(gguf_w_create(&w), VKI_OK);
    assert_int_equal(gguf_w_open(w, "/nonexistent/dir/x.gguf"), VKI_ERR_IO);
    gguf_w_destroy(w);
}

/* Copying every entry of a vocab file reproduces each value byte for byte. */
static void test_writer_copy_kv(void **state)
{
    gguf_file *src = open_shared("vocab/ggml-vocab-llama-spm.gguf");
    if (!src)
        skip();
    gguf_writer *w;
    assert_int_equal(gguf_w_create(&w), VKI_OK);
    for (uint64_t i = 0; i < gguf_n_kv(src); i++)
        assert_int_equal(gguf_w_copy_kv(w, gguf_kv_at(src, i)), VKI_OK);
    memfile m;
    mem_open(&m);
    assert_int_equal(gguf_w_begin(w, m.fp), VKI_OK);
    assert_int_equal(gguf_w_finish(w), VKI_OK);
    gguf_w_destroy(w);
    mem_close(&m);
    gguf_file *f;
    char err[256];
    assert_int_equal(gguf_open_memory(m.p, m.n, &f, err, sizeof err), VKI_OK);
    assert_int_equal(gguf_n_kv(f), gguf_n_kv(src));
    for (uint64_t i = 0; i < gguf_n_kv(src); i++) {
        const gguf_kv *a = gguf_kv_at(src, i), *b = gguf_kv_at(f, i);
        assert_int_equal(a->key.len, b->key.len);
        assert_memory_equal(a->key.ptr, b->key.ptr, a->key.len);
        assert_int_equal(a->type, b->type);
        assert_int_equal(a->arr_n, b->arr_n);
        assert_int_equal(a->value_bytes, b->value_bytes);
        assert_memory_equal(a->value, b->value, a->value_bytes);
    }
    gguf_close(f);
    gguf_close(src);
    free(m.p);
}


/* ---- malformed-file corpus ------------------------------------------------------------------- */

/* Smallest length at which the file still holds everything the reader needs. */
static uint64_t required_len(const uint8_t *p, size_t n)
{
    gguf_file *f;
    char err[256];
    assert_int_equal(gguf_open_memory(p, n, &f, err, sizeof err), VKI_OK);
    uint64_t need = 0;
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        uint64_t end = (uint64_t)(kv->value - p) + kv->value_bytes;
        need = end > need ? end : need;
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        uint64_t end = (uint64_t)(t->data - p) + t->nbytes;
        need = end > need ? end : need;
    }
    if (!gguf_n_tensors(f) && !gguf_n_kv(f))
        need = 24;
    gguf_close(f);
    return need;
}

/* Truncation at every length up to `dense` and at `sparse` random lengths beyond: an error with
 * a message exactly when bytes the reader needs are missing. */
static void truncations(const uint8_t *p, size_t n, size_t dense, int sparse, vt_rng *r)
{
    uint64_t need = required_len(p, n);
    char err[512];
    int refused = 0;
    for (int k = 0; k < (int)dense + sparse; k++) {
        size_t len = k < (int)dense ? (size_t)k : (size_t)(vt_u64(r) % n);
        vki_status st = open_copy(p, len, err, sizeof err);
        if (len < need && (st >= 0 || !err[0]))
            fail_msg("truncated at %zu of %zu (needs %llu): status %d, '%s'", len, n, (unsigned long long)need, st, err);
        if (len >= need && st != VKI_OK)
            fail_msg("cut at %zu (needs only %llu) refused: %s", len, (unsigned long long)need, err);
        refused += st != VKI_OK;
    }
    fprintf(stderr, "  %zu-byte file: %d cuts, %d refused\n", n, (int)dense + sparse, refused);
}

/* A small file with a byte-level vocabulary (string arrays), written by the project's writer. */
static uint8_t *small_model(size_t *n)
{
    char path[] = "/tmp/vki_gguf_smallXXXXXX", err[256];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    synth_params p = synth_default_params();
    p.n_layer = 1, p.d_model = 32, p.n_head = 2, p.n_head_kv = 1, p.d_ff = 64, p.n_vocab = 280;
    p.arch = "qwen2", p.wtype = SYNTH_Q8_0;
    if (synth_write(&p, path, err, sizeof err) != VKI_OK)
        fail_msg("%s", err);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    uint8_t *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    unlink(path);
    return b;
}

static void test_truncations(void **state)
{
    vt_rng r = vt_rng_seeded("truncations");
    size_t n;
    uint8_t *b = small_model(&n);
    gguf_file *f;
    char err[256];
    assert_int_equal(gguf_open_memory(b, n, &f, err, sizeof err), VKI_OK);
    size_t meta = (size_t)gguf_data_offset(f);
    gguf_close(f);
    truncations(b, n, meta + 64, 300, &r); /* every byte of the header and metadata */
    free(b);

    char path[1024];
    if (!vt_shared_model("stories260K.gguf", path, sizeof path)) {
        fprintf(stderr, "stories260K.gguf absent: its truncations are skipped\n");
        return;
    }
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    n = (size_t)ftell(fp);
    rewind(fp);
    b = malloc(n);
    assert_int_equal(fread(b, 1, n, fp), n);
    fclose(fp);
    truncations(b, n, 4096, 600, &r); /* the first 4 KiB densely (into the token list), then a sample */
    free(b);
}

/* Header + the given number of bytes from a builder; a helper for the hand-made cases. */
static void start(bb *b, uint64_t n_tensors, uint64_t n_kv)
{
    *b = (bb){0};
    bb_header(b, 3, n_tensors, n_kv);
}

static void finish_expect(bb *b, size_t data_bytes, vki_status want, const char *needle)
{
    bb_pad(b, 32);
    for (size_t i = 0; i < data_bytes; i++)
        bb_u8(b, 0);
    expect_error(b->p, b->n, want, needle);
    free(b->p);
}

static void test_absurd_counts_and_lengths(void **state)
{
    bb b;
    start(&b, 0, UINT64_MAX), bb_kv_u32(&b, "a", 1), finish_expect(&b, 0, VKI_ERR_FORMAT, "cannot fit");
    start(&b, 1ull << 62, 1), bb_kv_u32(&b, "a", 1), finish_expect(&b, 0, VKI_ERR_FORMAT, "cannot fit");
    start(&b, 0, 2), bb_kv_u32(&b, "a", 1), finish_expect(&b, 32, VKI_ERR_FORMAT, "metadata entry 1");
    /* key lengths */
    start(&b, 0, 1), bb_u64(&b, UINT64_MAX), bb_put(&b, "abc", 3), finish_expect(&b, 0, VKI_ERR_FORMAT, "exceeds");
    start(&b, 0, 1), bb_u64(&b, 0), bb_u32(&b, GGUF_TYPE_UINT8), bb_u8(&b, 0), finish_expect(&b, 0, VKI_ERR_FORMAT, "length 0");
    /* value types */
    start(&b, 0, 1), bb_str(&b, "k"), bb_u32(&b, 13), bb_u32(&b, 0), finish_expect(&b, 0, VKI_ERR_FORMAT, "invalid value type 13");
    start(&b, 0, 1), bb_str(&b, "k"), bb_u32(&b, UINT32_MAX), finish_expect(&b, 0, VKI_ERR_FORMAT, "key 'k'");
    /* string value length */
    start(&b, 0, 1), bb_str(&b, "k"), bb_u32(&b, GGUF_TYPE_STRING), bb_u64(&b, UINT64_MAX - 3);
    finish_expect(&b, 0, VKI_ERR_FORMAT, "exceeds");
    /* arrays */
    start(&b, 0, 1), bb_str(&b, "k"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u64(&b, 1);
    finish_expect(&b, 64, VKI_ERR_FORMAT, "nested");
    start(&b, 0, 1), bb_str(&b, "k"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, 99), bb_u64(&b, 1);
    finish_expect(&b, 64, VKI_ERR_FORMAT, "invalid array element type 99");
    start(&b, 0, 1), bb_str(&b, "k"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_UINT8), bb_u64(&b, UINT64_MAX);
    finish_expect(&b, 64, VKI_ERR_FORMAT, "elements");
    start(&b, 0, 1), bb_str(&b, "k"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_INT32), bb_u64(&b, 1ull << 62);
    finish_expect(&b, 64, VKI_ERR_FORMAT, "elements"); /* n * 4 overflows 64 bits */
    start(&b, 0, 1), bb_str(&b, "tok"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_STRING), bb_u64(&b, 1ull << 61);
    finish_expect(&b, 64, VKI_ERR_FORMAT, "cannot fit");
    start(&b, 0, 1), bb_str(&b, "tok"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_STRING), bb_u64(&b, 3);
    bb_str(&b, "a"), bb_u64(&b, 1ull << 40), bb_str(&b, "c"), finish_expect(&b, 64, VKI_ERR_FORMAT, "key 'tok'");
    /* duplicates */
    start(&b, 0, 3), bb_kv_u32(&b, "a", 1), bb_kv_u32(&b, "b", 1), bb_kv_str(&b, "a", "x");
    finish_expect(&b, 0, VKI_ERR_FORMAT, "duplicate key");
}

static void test_wrong_types_and_alignment(void **state)
{
    bb b;
    start(&b, 0, 1), bb_kv_str(&b, "general.alignment", "32"), finish_expect(&b, 0, VKI_ERR_FORMAT, "expected u32");
    start(&b, 0, 1), bb_str(&b, "general.alignment"), bb_u32(&b, GGUF_TYPE_UINT64), bb_u64(&b, 32);
    finish_expect(&b, 0, VKI_ERR_FORMAT, "general.alignment");
    start(&b, 0, 1), bb_kv_u32(&b, "general.architecture", 7), finish_expect(&b, 0, VKI_ERR_FORMAT, "expected str");
    start(&b, 0, 1), bb_str(&b, "tokenizer.ggml.tokens"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_INT32);
    bb_u64(&b, 1), bb_u32(&b, 5), finish_expect(&b, 0, VKI_ERR_FORMAT, "expected arr of str");
    start(&b, 0, 1), bb_str(&b, "tokenizer.ggml.scores"), bb_u32(&b, GGUF_TYPE_ARRAY), bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 1), bb_str(&b, "x"), finish_expect(&b, 0, VKI_ERR_FORMAT, "tokenizer.ggml.scores");
    char err[256];
    start(&b, 0, 1), bb_kv_str(&b, "tokenizer.ggml.model", "llama"); /* the right type passes */
    assert_int_equal(open_copy(b.p, b.n, err, sizeof err), VKI_OK);
    free(b.p);
}

static void test_bad_tensor_infos(void **state)
{
    bb b;
    uint64_t ne[4] = {32, 2, 1, 1};
    uint64_t big[4] = {256, 1ull << 40, 1ull << 40, 1ull << 40};
    struct { const char *name; uint32_t dims; const uint64_t *ne; uint32_t type; uint64_t off; size_t data;
             vki_status st; const char *needle; } c[] = {
        {"", 2, ne, 0, 0, 256, VKI_ERR_FORMAT, "length 0"},
        {"x123456789012345678901234567890123456789012345678901234567890abcd", 2, ne, 0, 0, 256, VKI_ERR_FORMAT, "length 65"},
        {"t", 0, ne, 0, 0, 256, VKI_ERR_FORMAT, "n_dims 0"},
        {"t", 5, ne, 0, 0, 256, VKI_ERR_FORMAT, "n_dims 5"},
        {"t", UINT32_MAX, ne, 0, 0, 256, VKI_ERR_FORMAT, "n_dims"},
        {"t", 2, (uint64_t[]){32, 0}, 0, 0, 256, VKI_ERR_FORMAT, "ne[1] = 0"},
        {"t", 2, (uint64_t[]){1ull << 63, 1}, 0, 0, 256, VKI_ERR_FORMAT, "out of range"},
        {"t", 4, big, VKI_GGML_Q4_K, 0, 256, VKI_ERR_FORMAT, "overflows"},
        {"t", 2, (uint64_t[]){UINT32_MAX * 2ull, UINT32_MAX * 2ull}, VKI_GGML_F32, 0, 256, VKI_ERR_FORMAT, "overflows"},
        {"t", 2, (uint64_t[]){1u << 20, 1u << 20}, VKI_GGML_F32, 0, 256, VKI_ERR_FORMAT, "past the end"},
        /* row bytes past 64 bits: 2^62 F32 elements (wrapped to 0 bytes, then divided by), and 2^62 + 16
         * (wrapped to 64 bytes, which would have "fit") */
        {"t", 1, (uint64_t[]){1ull << 62}, VKI_GGML_F32, 0, 256, VKI_ERR_FORMAT, "row size overflows"},
        {"t", 1, (uint64_t[]){(1ull << 62) + 16}, VKI_GGML_F32, 0, 256, VKI_ERR_FORMAT, "row size overflows"},
        {"t", 2, ne, 4, 0, 256, VKI_ERR_UNSUPPORTED, "type id 4 is not a ggml type"}, /* q4_2: removed */
        {"t", 2, ne, 31, 0, 256, VKI_ERR_UNSUPPORTED, "type id 31"},
        {"t", 2, ne, 1000, 0, 256, VKI_ERR_UNSUPPORTED, "id 1000"},
        {"t", 2, (uint64_t[]){100, 1}, VKI_GGML_Q4_K, 0, 256, VKI_ERR_FORMAT, "not a multiple"},
        /* rows the new types' blocks do not divide */
        {"t", 2, (uint64_t[]){48, 1}, VKI_GGML_Q5_0, 0, 256, VKI_ERR_FORMAT, "not a multiple of the q5_0 block size 32"},
        {"t", 2, (uint64_t[]){16, 2}, VKI_GGML_IQ4_NL, 0, 256, VKI_ERR_FORMAT, "iq4_nl block size 32"},
        {"t", 2, (uint64_t[]){96, 1}, VKI_GGML_Q3_K, 0, 256, VKI_ERR_FORMAT, "q3_k block size 256"},
        {"t", 2, (uint64_t[]){288, 1}, VKI_GGML_IQ4_XS, 0, 512, VKI_ERR_FORMAT, "iq4_xs block size 256"},
        {"t", 2, (uint64_t[]){32, 1}, 16, 0, 256, VKI_ERR_FORMAT, "iq2_xxs block size 256"}, /* not run, still sized */
        /* one byte short of the odd-sized blocks: 22-byte Q5_0, 110-byte Q3_K, 136-byte IQ4_XS, bf16 */
        {"t", 2, (uint64_t[]){32, 2}, VKI_GGML_Q5_0, 0, 43, VKI_ERR_FORMAT, "past the end"},
        {"t", 2, (uint64_t[]){256, 1}, VKI_GGML_Q3_K, 0, 109, VKI_ERR_FORMAT, "past the end"},
        {"t", 2, (uint64_t[]){256, 3}, VKI_GGML_IQ4_XS, 0, 407, VKI_ERR_FORMAT, "past the end"},
        {"t", 2, (uint64_t[]){7, 3}, VKI_GGML_BF16, 0, 41, VKI_ERR_FORMAT, "past the end"},
        {"t", 2, ne, 0, 4, 256, VKI_ERR_FORMAT, "alignment"},
        {"t", 2, ne, 0, 1ull << 62, 256, VKI_ERR_FORMAT, "past the end"},
        {"t", 2, ne, 0, UINT64_MAX & ~31ull, 256, VKI_ERR_FORMAT, "past the end"},
        {"t", 2, ne, 0, 0, 255, VKI_ERR_FORMAT, "tensor 't'"}, /* one byte short */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        start(&b, 1, 0);
        bb_str(&b, c[i].name);
        bb_u32(&b, c[i].dims);
        for (uint32_t d = 0; d < (c[i].dims <= 4 ? c[i].dims : 1); d++)
            bb_u64(&b, c[i].ne[d]);
        bb_u32(&b, c[i].type);
        bb_u64(&b, c[i].off);
        finish_expect(&b, c[i].data, c[i].st, c[i].needle);
    }
    /* duplicate names, overlapping data, a huge alignment pushing the data section past the end */
    start(&b, 2, 0), bb_tensor(&b, "t", 2, ne, 0, 0), bb_tensor(&b, "t", 2, ne, 0, 256);
    finish_expect(&b, 512, VKI_ERR_FORMAT, "duplicate name");
    start(&b, 2, 0), bb_tensor(&b, "a", 2, ne, 0, 0), bb_tensor(&b, "b", 2, ne, 0, 128);
    finish_expect(&b, 512, VKI_ERR_FORMAT, "overlaps");
    start(&b, 1, 1), bb_kv_u32(&b, "general.alignment", 1u << 30), bb_tensor(&b, "a", 2, ne, 0, 0);
    finish_expect(&b, 256, VKI_ERR_FORMAT, "past the end");
    start(&b, 1, 1), bb_kv_u32(&b, "general.alignment", 0), bb_tensor(&b, "a", 2, ne, 0, 0);
    finish_expect(&b, 256, VKI_ERR_FORMAT, "power of two");
    start(&b, 1, 1), bb_kv_u32(&b, "general.alignment", 48), bb_tensor(&b, "a", 2, ne, 0, 0);
    finish_expect(&b, 256, VKI_ERR_FORMAT, "power of two");
}

/* Seeded random byte flips: each result is an error with a message or a file that still parses
 * (a flip inside tensor data or a string's bytes); never a crash or an over-read. */
static void test_byte_flips(void **state)
{
    vt_rng r = vt_rng_seeded("byte_flips");
    size_t n;
    uint8_t *orig = small_model(&n);
    gguf_file *f;
    char err[512];
    assert_int_equal(gguf_open_memory(orig, n, &f, err, sizeof err), VKI_OK);
    size_t meta = (size_t)gguf_data_offset(f);
    gguf_close(f);
    uint8_t *b = malloc(n);
    int errors = 0, ok = 0;
    for (int k = 0; k < 3000; k++) {
        memcpy(b, orig, n);
        int flips = (int)vt_range(&r, 1, 3);
        for (int j = 0; j < flips; j++) {
            size_t at = vt_range(&r, 0, 9) < 9 ? vt_u64(&r) % meta : vt_u64(&r) % n;
            uint8_t x = (uint8_t)vt_range(&r, 1, 255);
            if (vt_range(&r, 0, 3) == 0) /* also hit the high bytes of lengths with big values */
                x = 0x80;
            b[at] ^= x;
        }
        vki_status st = open_copy(b, n, err, sizeof err);
        if (st == VKI_OK) {
            ok++;
        } else {
            errors++;
            if (!err[0])
                fail_msg("flip case %d: status %d without a message", k, st);
        }
    }
    fprintf(stderr, "  byte flips: %d refused, %d still valid\n", errors, ok);
    assert_true(errors > 1000);
    free(b);
    free(orig);
}


/* gguf-inspect (when built in this tree): prints the table of a valid file and exits 0; prints
 * the reader's error for a malformed one and exits 1. */
static void test_inspect_tool(void **state)
{
    char tool[1024], cmd[2400], line[512];
    snprintf(tool, sizeof tool, "%s/tools/gguf-inspect", VKI_BINARY_DIR);
    if (access(tool, X_OK) != 0) {
        fprintf(stderr, "skipping: %s is not built (cmake --build . --target gguf-inspect)\n", tool);
        skip();
    }
    size_t n;
    uint8_t *b = small_model(&n);
    char path[] = "/tmp/vki_inspectXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, n), (ssize_t)n);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", tool, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    bool saw_version = false, saw_tensor = false, saw_tokens = false;
    while (fgets(line, sizeof line, p)) {
        saw_version |= strstr(line, "GGUF v3") != NULL;
        saw_tensor |= strstr(line, "blk.0.attn_q.bias") && strstr(line, "f32") && strstr(line, "[32]");
        saw_tokens |= strstr(line, "tokenizer.ggml.tokens") && strstr(line, "[str x 280]") && strstr(line, "...");
    }
    assert_int_equal(pclose(p), 0);
    assert_true(saw_version && saw_tensor && saw_tokens);
    assert_int_equal(truncate(path, 1000), 0);
    p = popen(cmd, "r");
    assert_non_null(p);
    bool saw_error = false;
    while (fgets(line, sizeof line, p))
        saw_error |= strstr(line, "malformed file") && strstr(line, "offset");
    int rc = pclose(p);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
    assert_true(saw_error);
    /* every type is listed, also one vkinfer cannot run (IQ2_XXS), marked with a note */
    vt_rng r = vt_rng_seeded("inspect");
    gguf_writer *w;
    uint8_t *data;
    uint64_t total;
    assert_int_equal(gguf_w_create(&w), VKI_OK);
    build_writer_file(w, &r, &data, &total);
    assert_int_equal(gguf_w_open(w, path), VKI_OK);
    assert_int_equal(gguf_w_data(w, data, (size_t)total), VKI_OK);
    assert_int_equal(gguf_w_finish(w), VKI_OK);
    gguf_w_destroy(w);
    free(data);
    p = popen(cmd, "r");
    assert_non_null(p);
    bool saw_iq2 = false, saw_note = false, saw_bf16 = false, saw_q3k = false;
    while (fgets(line, sizeof line, p)) {
        saw_iq2 |= strstr(line, "t9.weight") && strstr(line, "iq2_xxs*") && strstr(line, "[256, 2]");
        saw_bf16 |= strstr(line, "t7.weight") && strstr(line, " bf16 ");
        saw_q3k |= strstr(line, "t6.weight") && strstr(line, " q3_k ");
        saw_note |= strstr(line, "vkinfer cannot run") != NULL;
    }
    assert_int_equal(pclose(p), 0);
    assert_true(saw_iq2 && saw_note && saw_bf16 && saw_q3k);
    unlink(path);
    free(b);
}

/* ---- model metadata of the newer architectures ---------------------------------------------- */

/* A one-layer synthetic model of arch (its own window and soft-caps; phi3 with LongRoPE
 * factors) at path. */
static void arch_model(const char *arch, const char *path)
{
    synth_params p = synth_default_params();
    p.arch = arch;
    assert_int_equal(synth_arch_defaults(&p), VKI_OK);
    p.n_layer = 1, p.d_model = 64, p.n_head = 2, p.n_head_kv = 1, p.head_dim = 32, p.d_ff = 96;
    p.n_ctx_orig = !strcmp(arch, "phi3") ? 128 : 0;
    if (!strcmp(arch, "granitemoe")) /* GraniteMoeShared */
        p.n_expert = 4, p.n_expert_used = 2, p.d_ff_shexp = 48;
    char err[256];
    if (synth_write(&p, path, err, sizeof err) != VKI_OK)
        fail_msg("synth_write %s: %s", arch, err);
}

/* The model description of `arch` with edits: VKI_OK when want is VKI_OK, else that status
 * with a message containing needle (the key or tensor at fault). */
static void expect_model(const char *arch, const gguf_edit *edits, uint32_t n, vki_status want, const char *needle)
{
    char src[64], dst[64], err[256] = "";
    snprintf(src, sizeof src, "/tmp/vki_meta_%d_%s.gguf", (int)getpid(), arch);
    snprintf(dst, sizeof dst, "/tmp/vki_meta_%d_edit.gguf", (int)getpid());
    arch_model(arch, src);
    assert_int_equal(gguf_edit_copy(src, dst, edits, n), VKI_OK);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(dst, &f, err, sizeof err), VKI_OK);
    model_hparams hp;
    model_tensors t = {0};
    vki_status st = model_read_hparams(f, &hp, err, sizeof err);
    if (st == VKI_OK)
        st = model_find_tensors(f, &hp, &t, err, sizeof err);
    if (st != want || (needle && !strstr(err, needle)))
        fail_msg("%s: got %s \"%s\", want %s naming \"%s\"", arch, vki_status_str(st), err, vki_status_str(want),
                 needle ? needle : "");
    model_tensors_free(&t);
    gguf_close(f);
    unlink(src);
    unlink(dst);
}

#define EXPECT(arch, want, needle, ...)                                                            \
    do {                                                                                           \
        const gguf_edit e_[] = {__VA_ARGS__};                                                      \
        expect_model(arch, e_, sizeof e_ / sizeof e_[0], want, needle);                            \
    } while (0)

/* Each architecture's own hyperparameters and tensors: what the unedited files describe, then
 * absent or mis-shaped norm and fused tensors, bad windows, soft-caps and LongRoPE keys, each
 * refused with a message naming the key or tensor. */
static void test_model_meta_archs(void **state)
{
    (void)state;
    const gguf_edit none = {GGUF_EDIT_DROP_KEY, "no.such.key", 0, 0, 0, 0, NULL};
    const char *archs[] = {"qwen3", "gemma2", "gemma3", "phi3", "granitemoe", "exaone", "glm4", "internlm2", "ernie4_5",
                           "gemma", "command-r", "cohere2", "mistral3", "starcoder2", "phi2", "stablelm",
                           "nemotron", "arcee"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        expect_model(archs[i], &none, 1, VKI_OK, NULL);
    /* Cohere's: both keys required (llama.cpp), cohere2's window too; tensors nothing would run
     * (a LayerNorm bias, Command R+'s per-head Q/K LayerNorms) refused by name. The writer's
     * untied head gives a tensor to rename. */
    EXPECT("command-r", VKI_ERR_FORMAT, "missing metadata key command-r.logit_scale",
           {GGUF_EDIT_DROP_KEY, "command-r.logit_scale", 0, 0, 0, 0, NULL});
    EXPECT("command-r", VKI_ERR_FORMAT, "missing metadata key command-r.attention.layer_norm_epsilon",
           {GGUF_EDIT_DROP_KEY, "command-r.attention.layer_norm_epsilon", 0, 0, 0, 0, NULL});
    EXPECT("command-r", VKI_ERR_FORMAT, "command-r.attention.layer_norm_epsilon: must be a number in (0, 1]",
           {GGUF_EDIT_F32, "command-r.attention.layer_norm_epsilon", 0, 0, 0, 0.0f, NULL});
    EXPECT("cohere2", VKI_ERR_FORMAT, "missing metadata key cohere2.attention.sliding_window",
           {GGUF_EDIT_DROP_KEY, "cohere2.attention.sliding_window", 0, 0, 0, 0, NULL});
    EXPECT("cohere2", VKI_ERR_FORMAT, "cohere2.attention.sliding_window = 0",
           {GGUF_EDIT_U32, "cohere2.attention.sliding_window", 0, 0, 0, 0, NULL});
    EXPECT("command-r", VKI_ERR_UNSUPPORTED, "blk.0.attn_q_norm.weight: a per-head Q/K LayerNorm",
           {GGUF_EDIT_RENAME, "output.weight", 0, 0, 0, 0, "blk.0.attn_q_norm.weight"});
    EXPECT("cohere2", VKI_ERR_UNSUPPORTED, "blk.0.attn_norm.bias: a LayerNorm bias",
           {GGUF_EDIT_RENAME, "output.weight", 0, 0, 0, 0, "blk.0.attn_norm.bias"});
    EXPECT("command-r", VKI_ERR_UNSUPPORTED, "output_norm.bias: a norm bias is not supported",
           {GGUF_EDIT_RENAME, "blk.0.attn_norm.weight", 0, 0, 0, 0, "output_norm.bias"});
    EXPECT("starcoder2", VKI_ERR_FORMAT, "missing tensor blk.0.attn_norm.bias",
           {GGUF_EDIT_DROP_TENSOR, "blk.0.attn_norm.bias", 0, 0, 0, 0, NULL});
    EXPECT("starcoder2", VKI_ERR_FORMAT, "missing tensor output_norm.bias",
           {GGUF_EDIT_DROP_TENSOR, "output_norm.bias", 0, 0, 0, 0, NULL});
    EXPECT("starcoder2", VKI_ERR_FORMAT, "tensor blk.0.ffn_up.bias has shape [64, 1], expected [96, 1]",
           {GGUF_EDIT_SHAPE, "blk.0.ffn_up.bias", 64, 0, 0, 0, NULL});
    EXPECT("starcoder2", VKI_ERR_FORMAT, "missing tensor blk.0.ffn_down.bias",
           {GGUF_EDIT_DROP_TENSOR, "blk.0.ffn_down.bias", 0, 0, 0, 0, NULL});
    EXPECT("phi2", VKI_ERR_FORMAT, "missing tensor blk.0.attn_qkv.bias",
           {GGUF_EDIT_DROP_TENSOR, "blk.0.attn_qkv.bias", 0, 0, 0, 0, NULL});
    EXPECT("phi2", VKI_ERR_FORMAT, "missing tensor output.bias",
           {GGUF_EDIT_DROP_TENSOR, "output.bias", 0, 0, 0, 0, NULL});
    EXPECT("glm4", VKI_ERR_UNSUPPORTED, "blk.0.attn_qkv.bias: a fused Q|K|V bias is not supported",
           {GGUF_EDIT_RENAME, "blk.0.attn_q.bias", 0, 0, 0, 0, "blk.0.attn_qkv.bias"});
    /* StableLM 2 12B: no ffn_norm, so the FFN runs beside the attention (its Q/K LayerNorms are
     * refused, as Command R+'s) */
    EXPECT("stablelm", VKI_OK, NULL, {GGUF_EDIT_DROP_TENSOR, "blk.0.ffn_norm.weight", 0, 0, 0, 0, NULL},
           {GGUF_EDIT_DROP_TENSOR, "blk.0.ffn_norm.bias", 0, 0, 0, 0, NULL});
    EXPECT("stablelm", VKI_ERR_UNSUPPORTED, "blk.0.attn_k_norm.weight: a per-head Q/K LayerNorm",
           {GGUF_EDIT_RENAME, "blk.0.ffn_norm.bias", 0, 0, 0, 0, "blk.0.attn_k_norm.weight"});
    EXPECT("starcoder2", VKI_ERR_FORMAT, "missing metadata key starcoder2.attention.layer_norm_epsilon",
           {GGUF_EDIT_DROP_KEY, "starcoder2.attention.layer_norm_epsilon", 0, 0, 0, 0, NULL});
    EXPECT("llama", VKI_ERR_UNSUPPORTED, "tensor output_norm.bias: a norm bias is not supported",
           {GGUF_EDIT_RENAME, "blk.0.attn_norm.weight", 0, 0, 0, 0, "output_norm.bias"});
    EXPECT("llama", VKI_ERR_FORMAT, "tensor output_norm.bias has shape [64, 320], expected [64, 1]",
           {GGUF_EDIT_RENAME, "output.weight", 0, 0, 0, 0, "output_norm.bias"});
    EXPECT("command-r", VKI_ERR_UNSUPPORTED, "command-r with experts",
           {GGUF_EDIT_U32, "command-r.expert_count", 0, 0, 4, 0, NULL},
           {GGUF_EDIT_U32, "command-r.expert_used_count", 0, 0, 2, 0, NULL});
    EXPECT("granitemoe", VKI_ERR_FORMAT, "missing tensor blk.0.ffn_down_shexp.weight",
           {GGUF_EDIT_DROP_TENSOR, "blk.0.ffn_down_shexp.weight", 0, 0, 0, 0, NULL});
    EXPECT("granitemoe", VKI_ERR_FORMAT, "tensor blk.0.ffn_up_shexp.weight has shape [64, 96], expected [64, 48]",
           {GGUF_EDIT_SHAPE, "blk.0.ffn_up_shexp.weight", 64, 96, 0, 0, NULL});
    EXPECT("granitemoe", VKI_ERR_UNSUPPORTED, "blk.0.ffn_gate_shexp.weight: a shared expert without",
           {GGUF_EDIT_DROP_KEY, "granitemoe.expert_shared_feed_forward_length", 0, 0, 0, 0, NULL});
    EXPECT("qwen3", VKI_ERR_FORMAT, "qwen3.pooling_type = 7 is none of llama.cpp's",
           {GGUF_EDIT_U32, "qwen3.pooling_type", 0, 0, 7, 0, NULL});
    EXPECT("granitemoe", VKI_ERR_FORMAT, "granitemoe.expert_count is 0",
           {GGUF_EDIT_U32, "granitemoe.expert_count", 0, 0, 0, 0, NULL});
    EXPECT("granitemoe", VKI_ERR_FORMAT, "missing metadata key granitemoe.logit_scale",
           {GGUF_EDIT_DROP_KEY, "granitemoe.logit_scale", 0, 0, 0, 0, NULL});
    EXPECT("gemma2", VKI_ERR_FORMAT, "missing tensor blk.0.post_attention_norm.weight",
           {GGUF_EDIT_DROP_TENSOR, "blk.0.post_attention_norm.weight", 0, 0, 0, 0, NULL});
    EXPECT("gemma3", VKI_ERR_FORMAT, "missing tensor blk.0.post_ffw_norm.weight",
           {GGUF_EDIT_DROP_TENSOR, "blk.0.post_ffw_norm.weight", 0, 0, 0, 0, NULL});
    EXPECT("qwen3", VKI_ERR_FORMAT, "missing tensor blk.0.attn_k_norm.weight",
           {GGUF_EDIT_DROP_TENSOR, "blk.0.attn_k_norm.weight", 0, 0, 0, 0, NULL});
    EXPECT("gemma3", VKI_ERR_FORMAT, "tensor blk.0.attn_q_norm.weight has shape [64, 1], expected [32, 1]",
           {GGUF_EDIT_SHAPE, "blk.0.attn_q_norm.weight", 64, 0, 0, 0, NULL});
    EXPECT("gemma2", VKI_ERR_FORMAT, "gemma2.attention.sliding_window = 0",
           {GGUF_EDIT_U32, "gemma2.attention.sliding_window", 0, 0, 0, 0, NULL});
    EXPECT("gemma3", VKI_ERR_FORMAT, "gemma3.attention.sliding_window = 33554432",
           {GGUF_EDIT_U32, "gemma3.attention.sliding_window", 0, 0, 1u << 25, 0, NULL});
    EXPECT("llama", VKI_ERR_FORMAT, "llama.attention.sliding_window: not an unsigned 32-bit integer",
           {GGUF_EDIT_STR, "llama.attention.sliding_window", 0, 0, 0, 0, "4096"});
    EXPECT("gemma2", VKI_ERR_FORMAT, "gemma2.attn_logit_softcapping = -1",
           {GGUF_EDIT_F32, "gemma2.attn_logit_softcapping", 0, 0, 0, -1.0f, NULL});
    EXPECT("gemma2", VKI_ERR_FORMAT, "gemma2.final_logit_softcapping: not a finite number",
           {GGUF_EDIT_F32, "gemma2.final_logit_softcapping", 0, 0, 0, INFINITY, NULL});
    EXPECT("phi3", VKI_ERR_FORMAT, "tensor blk.0.ffn_up.weight has shape [64, 96], expected [64, 192]",
           {GGUF_EDIT_SHAPE, "blk.0.ffn_up.weight", 64, 96, 0, 0, NULL});
    EXPECT("phi3", VKI_ERR_FORMAT, "tensor blk.0.attn_qkv.weight has shape",
           {GGUF_EDIT_SHAPE, "blk.0.attn_qkv.weight", 64, 64, 0, 0, NULL});
    EXPECT("phi3", VKI_ERR_FORMAT, "rope_factors_long.weight without rope_factors_short.weight",
           {GGUF_EDIT_DROP_TENSOR, "rope_factors_short.weight", 0, 0, 0, 0, NULL});
    EXPECT("phi3", VKI_ERR_FORMAT, "tensor rope_factors_long.weight has shape [8, 1], expected [16, 1]",
           {GGUF_EDIT_SHAPE, "rope_factors_long.weight", 8, 0, 0, 0, NULL});
    EXPECT("phi3", VKI_ERR_FORMAT, "phi3.rope.scaling.attn_factor = 0",
           {GGUF_EDIT_F32, "phi3.rope.scaling.attn_factor", 0, 0, 0, 0.0f, NULL});
    EXPECT("phi3", VKI_ERR_FORMAT, "phi3.rope.scaling.original_context_length is 0",
           {GGUF_EDIT_U32, "phi3.rope.scaling.original_context_length", 0, 0, 0, 0, NULL});
    EXPECT("phi3", VKI_ERR_FORMAT, "phi3.rope.scaling.type is longrope but rope_factors_long/short.weight are missing",
           {GGUF_EDIT_STR, "phi3.rope.scaling.type", 0, 0, 0, 0, "longrope"},
           {GGUF_EDIT_DROP_TENSOR, "rope_factors_long.weight", 0, 0, 0, 0, NULL},
           {GGUF_EDIT_DROP_TENSOR, "rope_factors_short.weight", 0, 0, 0, 0, NULL});
    EXPECT("phi3", VKI_OK, NULL, {GGUF_EDIT_STR, "phi3.rope.scaling.type", 0, 0, 0, 0, "su"});
    EXPECT("qwen3", VKI_ERR_UNSUPPORTED, "rope scaling type 'dynamic' is not supported",
           {GGUF_EDIT_STR, "qwen3.rope.scaling.type", 0, 0, 0, 0, "dynamic"});
    EXPECT("qwen3", VKI_ERR_UNSUPPORTED, "architecture 'mamba' is not supported",
           {GGUF_EDIT_STR, "general.architecture", 0, 0, 0, 0, "mamba"});
}

/* EXAONE 4's layer pattern as llama.cpp sets it: a window (4096, or the file's) only for the
 * 64-layer 32B, on layers il % 4 < 3, whose 4th layers are global without RoPE; no window and
 * RoPE everywhere for other depths (the 1.2B's 30), whatever the file says. */
static void exaone4_hparams(uint32_t n_layer, uint32_t window, model_hparams *hp)
{
    char path[64], err[256] = "";
    snprintf(path, sizeof path, "/tmp/vki_exaone4_%d.gguf", (int)getpid());
    synth_params p = synth_default_params();
    p.arch = "exaone4";
    assert_int_equal(synth_arch_defaults(&p), VKI_OK);
    p.n_layer = n_layer, p.d_model = 64, p.n_head = 2, p.n_head_kv = 1, p.head_dim = 32, p.d_ff = 96;
    p.sliding_window = window;
    if (synth_write(&p, path, err, sizeof err) != VKI_OK)
        fail_msg("synth_write exaone4: %s", err);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f, err, sizeof err), VKI_OK);
    if (model_read_hparams(f, hp, err, sizeof err) != VKI_OK)
        fail_msg("exaone4: %s", err);
    gguf_close(f);
    unlink(path);
}

static void test_model_meta_exaone4(void **state)
{
    (void)state;
    model_hparams hp;
    exaone4_hparams(64, 0, &hp); /* no key: llama.cpp's 4096 */
    assert_int_equal(hp.kind[1].window, 4096);
    for (uint32_t il = 0; il < 8; il++) {
        assert_int_equal(model_layer_kind(&hp, il), il % 4 < 3 ? 1 : 0);
        assert_int_equal(model_layer_rope(&hp, il), il % 4 < 3);
    }
    assert_true(hp.no_pre_norms && hp.post_norms && hp.qk_norm && !hp.qk_norm_full && hp.rope_neox);
    exaone4_hparams(64, 128, &hp);
    assert_int_equal(hp.kind[1].window, 128);
    exaone4_hparams(30, 4096, &hp); /* the 1.2B: global everywhere, RoPE everywhere */
    assert_int_equal(hp.swa_pattern, 0);
    for (uint32_t il = 0; il < 8; il++)
        assert_true(model_layer_kind(&hp, il) == 0 && model_layer_rope(&hp, il));
}

/* The hyperparameters of `arch`'s synthetic model (arch_model: 1 layer; n_layer layers here). */
static void arch_hparams(const char *arch, uint32_t n_layer, model_hparams *hp)
{
    char path[64], err[256] = "";
    snprintf(path, sizeof path, "/tmp/vki_hp_%d.gguf", (int)getpid());
    synth_params p = synth_default_params();
    p.arch = arch;
    assert_int_equal(synth_arch_defaults(&p), VKI_OK);
    p.n_layer = n_layer, p.d_model = 64, p.n_head = 2, p.n_head_kv = 1, p.d_ff = 96, p.rms_eps = 3e-5f;
    if (synth_write(&p, path, err, sizeof err) != VKI_OK)
        fail_msg("synth_write %s: %s", arch, err);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f, err, sizeof err), VKI_OK);
    if (model_read_hparams(f, hp, err, sizeof err) != VKI_OK)
        fail_msg("%s: %s", arch, err);
    gguf_close(f);
    unlink(path);
}

/* Gemma 1 is gemma2's block without post-norms, soft-caps or window; Command-R's LayerNorms (its
 * epsilon key), parallel FFN and logit multiplier; cohere2's window on layers il % 4 < 3, the 4th
 * global and without RoPE (llama.cpp's is_swa and its rope only where is_swa). */
static void test_model_meta_gemma_cohere(void **state)
{
    (void)state;
    model_hparams hp;
    arch_hparams("gemma", 2, &hp);
    assert_true(hp.ffn_gelu && !hp.post_norms && hp.rope_neox && hp.final_softcap == 0 && hp.swa_pattern == 0);
    assert_true(hp.embd_mul == sqrtf(64.0f) && !hp.layer_norm && hp.logit_mul == 1.0f);
    arch_hparams("command-r", 2, &hp);
    assert_true(hp.layer_norm && hp.parallel_ffn && !hp.rope_neox && hp.logit_mul == 0.0625f);
    assert_true(hp.rms_eps == 3e-5f && hp.resid_eps == 3e-5f && hp.swa_pattern == 0 && hp.nope_step == 0);
    arch_hparams("starcoder2", 2, &hp);
    assert_true(hp.layer_norm && hp.norm_bias && hp.ffn_plain && hp.ffn_gelu && hp.rope_neox && !hp.parallel_ffn);
    assert_true(hp.rms_eps == 3e-5f && hp.logit_mul == 1.0f && hp.swa_pattern == 0);
    assert_int_equal(model_norm_mode(&hp), VKI_NORM_MEAN | VKI_NORM_BIAS);
    arch_hparams("phi2", 2, &hp);
    assert_true(hp.layer_norm && hp.norm_bias && hp.ffn_plain && hp.parallel_ffn && hp.rope_neox && hp.ffn_gelu);
    arch_hparams("stablelm", 2, &hp);
    assert_true(hp.layer_norm && hp.norm_bias && !hp.ffn_plain && !hp.parallel_ffn && hp.rope_neox && !hp.ffn_gelu);
    { /* StableLM 2 12B's layout: without ffn_norm the FFN runs beside the attention */
        char src[64], dst[64], err[256] = "";
        snprintf(src, sizeof src, "/tmp/vki_slm_%d.gguf", (int)getpid());
        snprintf(dst, sizeof dst, "/tmp/vki_slm_%d_edit.gguf", (int)getpid());
        arch_model("stablelm", src);
        const gguf_edit e[] = {{GGUF_EDIT_DROP_TENSOR, "blk.0.ffn_norm.weight", 0, 0, 0, 0, NULL},
                               {GGUF_EDIT_DROP_TENSOR, "blk.0.ffn_norm.bias", 0, 0, 0, 0, NULL}};
        assert_int_equal(gguf_edit_copy(src, dst, e, 2), VKI_OK);
        gguf_file *f = NULL;
        assert_int_equal(gguf_open(dst, &f, err, sizeof err), VKI_OK);
        assert_int_equal(model_read_hparams(f, &hp, err, sizeof err), VKI_OK);
        assert_true(hp.parallel_ffn && hp.norm_bias);
        gguf_close(f);
        unlink(src);
        unlink(dst);
    }
    arch_hparams("nemotron", 2, &hp);
    assert_true(hp.layer_norm && hp.norm_bias && hp.ffn_plain && hp.ffn_relu2 && hp.rope_neox && !hp.parallel_ffn);
    arch_hparams("arcee", 2, &hp);
    assert_true(!hp.layer_norm && hp.ffn_plain && hp.ffn_relu2 && !hp.rope_neox);
    arch_hparams("cohere2", 8, &hp);
    assert_true(hp.layer_norm && hp.parallel_ffn && hp.kind[1].window == 4096);
    for (uint32_t il = 0; il < 8; il++) {
        assert_int_equal(model_layer_kind(&hp, il), il % 4 < 3 ? 1 : 0);
        assert_int_equal(model_layer_rope(&hp, il), il % 4 < 3);
    }
}

/* Ministral 3 (mistral3): llama's block with pairs (2i, 2i+1); its attention temperature steps
 * every original context (rope.scaling.original_context_length, else the training context), only
 * where attention.temperature_scale is set; the rotation's magnitude is 1 under YaRN whatever its
 * factor, the file's attn_factor or yarn_log_multiplier (llama.cpp's graph divides ggml's
 * 1 + 0.1 ln(factor) out), 1 / (1 + 0.1 ln(factor)) under linear scaling. */
static void test_model_meta_mistral3(void **state)
{
    (void)state;
    char src[64], dst[64], err[256] = "";
    snprintf(src, sizeof src, "/tmp/vki_m3_%d.gguf", (int)getpid());
    snprintf(dst, sizeof dst, "/tmp/vki_m3_%d_edit.gguf", (int)getpid());
    synth_params p = synth_default_params();
    p.arch = "mistral3";
    assert_int_equal(synth_arch_defaults(&p), VKI_OK);
    assert_true(p.attn_temp_scale == 0.1f);
    p.n_layer = 1, p.d_model = 64, p.n_head = 2, p.n_head_kv = 1, p.d_ff = 96, p.n_ctx = 512;
    p.n_ctx_orig = 128, p.yarn_factor = 4.0f;
    if (synth_write(&p, src, err, sizeof err) != VKI_OK)
        fail_msg("synth_write: %s", err);
    const struct {
        gguf_edit e[2];
        uint32_t n;
        float factor;     /* the rotation's magnitude */
        uint32_t len;     /* the temperature's step */
    } cases[] = {
        {{{GGUF_EDIT_DROP_KEY, "no.such.key", 0, 0, 0, 0, NULL}}, 1, 1.0f, 128},
        {{{GGUF_EDIT_F32, "mistral3.rope.scaling.attn_factor", 0, 0, 0, 2.0f, NULL}}, 1, 1.0f, 128},
        {{{GGUF_EDIT_DROP_KEY, "mistral3.attention.temperature_scale", 0, 0, 0, 0, NULL}}, 1, 1.0f, 0},
        {{{GGUF_EDIT_STR, "mistral3.rope.scaling.type", 0, 0, 0, 0, "linear"}}, 1, 1.0f / (1.0f + 0.1f * logf(4.0f)), 128},
        {{{GGUF_EDIT_DROP_KEY, "mistral3.rope.scaling.type", 0, 0, 0, 0, NULL},
          {GGUF_EDIT_DROP_KEY, "mistral3.rope.scaling.original_context_length", 0, 0, 0, 0, NULL}}, 2, 1.0f, 512},
        /* a window key changes nothing: llama.cpp's mistral3 graph has no sliding window */
        {{{GGUF_EDIT_U32, "mistral3.attention.sliding_window", 0, 0, 32, 0, NULL}}, 1, 1.0f, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(gguf_edit_copy(src, dst, cases[i].e, cases[i].n), VKI_OK);
        gguf_file *f = NULL;
        model_hparams hp;
        assert_int_equal(gguf_open(dst, &f, err, sizeof err), VKI_OK);
        if (model_read_hparams(f, &hp, err, sizeof err) != VKI_OK)
            fail_msg("case %zu: %s", i, err);
        gguf_close(f);
        if (hp.rope_attn_factor != cases[i].factor || hp.attn_temp_len != cases[i].len || hp.rope_neox ||
            hp.swa_pattern ||
            (cases[i].len && hp.attn_temp_scale != 0.1f))
            fail_msg("case %zu: magnitude %g (want %g), temperature %g every %u (want every %u)", i,
                     hp.rope_attn_factor, cases[i].factor, hp.attn_temp_scale, hp.attn_temp_len, cases[i].len);
    }
    EXPECT("mistral3", VKI_ERR_FORMAT, "mistral3.attention.temperature_scale = -1",
           {GGUF_EDIT_F32, "mistral3.attention.temperature_scale", 0, 0, 0, -1.0f, NULL});
    unlink(src);
    unlink(dst);
}

/* YaRN's keys (llama.cpp's names and defaults): the magnitude llama.cpp applies, 1 + 0.1 ln(factor)
 * times the file's attn_factor where the blend runs (HF's get_mscale), left out of the score scale
 * (the rotation table carries it); and each bad or unsupported key refused by name. */
static void yarn_hparams(const gguf_edit *e, uint32_t n, model_hparams *hp)
{
    char src[64], dst[64], err[256] = "";
    snprintf(src, sizeof src, "/tmp/vki_yarn_%d.gguf", (int)getpid());
    snprintf(dst, sizeof dst, "/tmp/vki_yarn_%d_edit.gguf", (int)getpid());
    arch_model("qwen3", src);
    assert_int_equal(gguf_edit_copy(src, dst, e, n), VKI_OK);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(dst, &f, err, sizeof err), VKI_OK);
    if (model_read_hparams(f, hp, err, sizeof err) != VKI_OK)
        fail_msg("yarn: %s", err);
    gguf_close(f);
    unlink(src);
    unlink(dst);
}

static void test_model_meta_yarn(void **state)
{
    (void)state;
    model_hparams hp;
    const gguf_edit qwen_long[] = {{GGUF_EDIT_STR, "qwen3.rope.scaling.type", 0, 0, 0, 0, "yarn"},
                                   {GGUF_EDIT_F32, "qwen3.rope.scaling.factor", 0, 0, 0, 4.0f, NULL},
                                   {GGUF_EDIT_U32, "qwen3.rope.scaling.original_context_length", 0, 0, 128, 0, NULL}};
    yarn_hparams(qwen_long, 3, &hp);
    double ms = 1.0 + 0.1 * log(4.0);
    assert_true(hp.yarn && hp.rope_freq_scale == 0.25f && hp.n_ctx_orig == 128);
    assert_true(hp.yarn_ext_factor == 1.0f && hp.yarn_beta_fast == 32.0f && hp.yarn_beta_slow == 1.0f);
    assert_true(fabs(hp.rope_attn_factor - ms) < 1e-6);
    assert_true(fabs(hp.attn_scale - 1.0 / sqrt(32.0)) < 1e-7); /* head dim 32; the magnitude is the table's */
    /* the file's ext_factor 0: plain interpolation, no magnitude; its attn_factor multiplies */
    const gguf_edit no_blend[] = {qwen_long[0], qwen_long[1], qwen_long[2],
                                  {GGUF_EDIT_F32, "qwen3.rope.scaling.yarn_ext_factor", 0, 0, 0, 0.0f, NULL},
                                  {GGUF_EDIT_F32, "qwen3.rope.scaling.attn_factor", 0, 0, 0, 1.5f, NULL},
                                  {GGUF_EDIT_F32, "qwen3.rope.scaling.yarn_beta_fast", 0, 0, 0, 16.0f, NULL}};
    yarn_hparams(no_blend, 6, &hp);
    assert_true(hp.yarn_ext_factor == 0.0f && hp.rope_attn_factor == 1.5f && hp.yarn_beta_fast == 16.0f);
    EXPECT("qwen3", VKI_ERR_UNSUPPORTED, "qwen3.rope.scaling.yarn_log_multiplier (DeepSeek's mscale_all_dim)",
           qwen_long[0], qwen_long[1], {GGUF_EDIT_F32, "qwen3.rope.scaling.yarn_log_multiplier", 0, 0, 0, 0.1f, NULL});
    EXPECT("qwen3", VKI_ERR_FORMAT, "qwen3.rope.scaling.yarn_ext_factor = 2 must be in [0, 1]", qwen_long[0],
           {GGUF_EDIT_F32, "qwen3.rope.scaling.yarn_ext_factor", 0, 0, 0, 2.0f, NULL});
    EXPECT("qwen3", VKI_ERR_FORMAT, "yarn_beta_fast / _slow = 0 / 1 must be > 0", qwen_long[0],
           {GGUF_EDIT_F32, "qwen3.rope.scaling.yarn_beta_fast", 0, 0, 0, 0.0f, NULL});
    EXPECT("qwen3", VKI_ERR_FORMAT, "rope.scaling.factor 0.5 must be >= 1", qwen_long[0],
           {GGUF_EDIT_F32, "qwen3.rope.scaling.factor", 0, 0, 0, 0.5f, NULL});
    EXPECT("gemma3", VKI_ERR_UNSUPPORTED, "YaRN RoPE scaling with gemma3's local layers",
           {GGUF_EDIT_STR, "gemma3.rope.scaling.type", 0, 0, 0, 0, "yarn"});
    /* partial rotary with a magnitude (Phi-4-mini's LongRoPE: 96 of 128 dims) loads */
    EXPECT("llama", VKI_OK, NULL, {GGUF_EDIT_STR, "llama.rope.scaling.type", 0, 0, 0, 0, "yarn"},
           {GGUF_EDIT_F32, "llama.rope.scaling.factor", 0, 0, 0, 4.0f, NULL},
           {GGUF_EDIT_U32, "llama.rope.dimension_count", 0, 0, 16, 0, NULL});
}

/* A model split by llama.cpp's gguf-split rules opens from its first file as one: every tensor of
 * the original with its bytes (pointing into the file that holds it), the first file's metadata;
 * opening another part, a part missing, a part from another split, a renamed first file, a
 * tensor in two parts or a wrong split.tensors.count are refused naming why. */
static void split_path(char *buf, size_t n, const char *prefix, uint32_t k, uint32_t count)
{
    snprintf(buf, n, "%s-%05u-of-%05u.gguf", prefix, k, count);
}

static void expect_open_fails(const char *path, vki_status want, const char *needle)
{
    char err[512] = "";
    gguf_file *f = NULL;
    vki_status st = gguf_open(path, &f, err, sizeof err);
    if (st != want || !strstr(err, needle))
        fail_msg("%s: got %s \"%s\", want %s naming \"%s\"", path, vki_status_str(st), err, vki_status_str(want),
                 needle);
    assert_null(f);
}

static void test_split_files(void **state)
{
    (void)state;
    char src[64], prefix[64], p1[128], p2[128], p3[128], tmp[128], err[512];
    snprintf(src, sizeof src, "/tmp/vki_split_%d.gguf", (int)getpid());
    snprintf(prefix, sizeof prefix, "/tmp/vki_split_%d", (int)getpid());
    snprintf(tmp, sizeof tmp, "%s-tmp.gguf", prefix);
    arch_model("qwen3", src);
    assert_int_equal(gguf_edit_split(src, prefix, 3, -1), VKI_OK);
    split_path(p1, sizeof p1, prefix, 1, 3), split_path(p2, sizeof p2, prefix, 2, 3), split_path(p3, sizeof p3, prefix, 3, 3);
    gguf_file *a = NULL, *b = NULL;
    assert_int_equal(gguf_open(src, &a, err, sizeof err), VKI_OK);
    assert_int_equal(gguf_open(p1, &b, err, sizeof err), VKI_OK);
    const uint64_t all = gguf_n_tensors(a);
    assert_int_equal(gguf_n_tensors(b), all);
    for (uint64_t i = 0; i < all; i++) {
        const gguf_tensor *x = gguf_tensor_at(a, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)x->name.len, x->name.ptr);
        const gguf_tensor *y = gguf_find_tensor(b, name);
        assert_non_null(y);
        assert_int_equal(y->type, x->type);
        assert_int_equal(y->nbytes, x->nbytes);
        assert_memory_equal(y->ne, x->ne, sizeof x->ne);
        assert_memory_equal(y->data, x->data, x->nbytes);
    }
    model_hparams hp;
    model_tensors t = {0};
    assert_int_equal(model_read_hparams(b, &hp, err, sizeof err), VKI_OK);
    assert_int_equal(model_find_tensors(b, &hp, &t, err, sizeof err), VKI_OK);
    model_tensors_free(&t);
    gguf_close(a), gguf_close(b);
    /* another part opens alone, and the model loader names the first */
    assert_int_equal(gguf_open(p2, &b, err, sizeof err), VKI_OK);
    assert_true(gguf_n_tensors(b) > 0 && gguf_n_tensors(b) < all);
    assert_int_equal(model_read_hparams(b, &hp, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "part 2 of a model split in 3 files: open the first"));
    gguf_close(b);
    /* the first renamed */
    assert_int_equal(rename(p1, tmp), 0);
    expect_open_fails(tmp, VKI_ERR_INVALID_ARG, "the name does not end in -00001-of-00003.gguf");
    assert_int_equal(rename(tmp, p1), 0);
    /* part 3 from another split, then missing */
    const gguf_edit other[] = {{GGUF_EDIT_U32, "split.count", 0, 0, 4, 0, NULL}};
    assert_int_equal(gguf_edit_copy(p3, tmp, other, 1), VKI_OK);
    assert_int_equal(rename(tmp, p3), 0);
    expect_open_fails(p1, VKI_ERR_FORMAT, "split.no 2 of split.count 4, expected 2 of 3");
    assert_int_equal(unlink(p3), 0);
    expect_open_fails(p1, VKI_ERR_IO, "-00003-of-00003.gguf: No such file or directory");
    /* a wrong total; a tensor in two parts (part 3 a copy of part 2 but for split.no) */
    assert_int_equal(gguf_edit_split(src, prefix, 3, 5), VKI_OK);
    expect_open_fails(p1, VKI_ERR_FORMAT, "split.tensors.count is 5, the 3 files hold");
    assert_int_equal(gguf_edit_split(src, prefix, 3, -1), VKI_OK);
    const gguf_edit no2[] = {{GGUF_EDIT_U32, "split.no", 0, 0, 2, 0, NULL}};
    assert_int_equal(gguf_edit_copy(p2, p3, no2, 1), VKI_OK);
    expect_open_fails(p1, VKI_ERR_FORMAT, "is in more than one of the 3 files");
    unlink(p1), unlink(p2), unlink(p3), unlink(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k),
        cmocka_unit_test(test_vocab_files),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_typed_accessors),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_writer_roundtrip),
        cmocka_unit_test(test_writer_errors),
        cmocka_unit_test(test_writer_copy_kv),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_absurd_counts_and_lengths),
        cmocka_unit_test(test_wrong_types_and_alignment),
        cmocka_unit_test(test_bad_tensor_infos),
        cmocka_unit_test(test_byte_flips),
        cmocka_unit_test(test_inspect_tool),
        cmocka_unit_test(test_model_meta_archs),
        cmocka_unit_test(test_model_meta_exaone4),
        cmocka_unit_test(test_model_meta_gemma_cohere),
        cmocka_unit_test(test_model_meta_mistral3),
        cmocka_unit_test(test_model_meta_yarn),
        cmocka_unit_test(test_split_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
