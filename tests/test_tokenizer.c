/* Tokenizer: the llama.cpp / HF vocabulary test sets (the .inp/.out pairs in ../shared/models/vocab/, every
 * string must match exactly), round trips, streaming detokenisation of split UTF-8, special
 * tokens, BOS/EOS, bad input, metadata errors, and several threads on one tokenizer.
 *
 * The .out files were written by llama.cpp's convert_hf_to_gguf_update.py from HF tokenizers'
 * encode(text, add_special_tokens=False), and llama.cpp's test-tokenizer-0 checks them with
 * add_special = false, parse_special = false: so do we. */
#include "support/vt.h"

#include <pthread.h>
#include <time.h>

#include "engine/gguf.h"
#include "host/chat/chat_reply.h"
#include "host/tokenizer/tok_impl.h"
#include "host/tokenizer/tokenizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        *len = (size_t)n;
    }
    return b;
}

/* Loads ../shared/models/<name>, or skips the test when the fixtures are absent. */
static vki_tokenizer *load_or_skip(const char *name)
{
    char path[1024];
    if (!vt_shared_model(name, path, sizeof path)) {
        printf("SKIP: %s/models/%s not found (tokenizer fixtures are in ../shared/models)\n", VKI_SHARED_DIR, name);
        skip();
    }
    char err[256] = "";
    vki_tokenizer *t = NULL;
    double t0 = now_s();
    vki_status st = vki_tokenizer_load(path, &t, err, sizeof err);
    if (st != VKI_OK)
        fail_msg("%s: %s: %s", name, vki_status_str(st), err);
    printf("%s: %u tokens, model %s, pre %s, loaded in %.1f ms\n", name, vki_vocab_size(t), tok_model_name(t),
           tok_pre_name(t), 1e3 * (now_s() - t0));
    return t;
}

static int32_t *tokenize_all(const vki_tokenizer *t, const char *s, size_t len, bool add_special,
                             bool parse_special, size_t *n)
{
    vki_status st = vki_tokenize(t, s, len, add_special, parse_special, NULL, 0, n);
    assert_true(st == VKI_OK || st == VKI_ERR_INVALID_ARG);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    size_t n2;
    assert_int_equal(vki_tokenize(t, s, len, add_special, parse_special, ids, *n, &n2), VKI_OK);
    assert_int_equal(n2, *n);
    return ids;
}

static char *detok_all(const vki_tokenizer *t, const int32_t *ids, size_t n, uint32_t flags, size_t *len)
{
    vki_status st = vki_detokenize(t, ids, n, flags, NULL, 0, len);
    assert_true(st == VKI_OK || st == VKI_ERR_INVALID_ARG);
    char *s = malloc(*len + 1);
    size_t l2;
    assert_int_equal(vki_detokenize(t, ids, n, flags, s, *len, &l2), VKI_OK);
    assert_int_equal(l2, *len);
    s[*len] = 0;
    return s;
}

static bool valid_utf8(const char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = tok_utf8_valid((const uint8_t *)s + i, n - i)))
            return false;
    return true;
}

static void print_ids(const char *label, const int32_t *v, size_t n)
{
    printf("    %s (%zu):", label, n);
    for (size_t i = 0; i < n; i++)
        printf(" %d", v[i]);
    printf("\n");
}

/* ---- the vocabulary test sets ----------------------------------------------------------------- */

#define SEP "\n__ggml_vocab_test__\n"

/* Every string of <vocab>.inp against its line of <vocab>.out, plus the round trip
 * detokenize(tokenize(s)) == s (all test strings are valid UTF-8, which both tokenizer kinds keep
 * losslessly; SPM's prepended space is stripped). */
static void run_vocab_set(const char *vocab)
{
    vki_tokenizer *t = load_or_skip(vocab);
    char path[1024], p2[1100];
    size_t in_len, out_len;
    vt_shared_model(vocab, path, sizeof path);
    snprintf(p2, sizeof p2, "%s.inp", path);
    char *inp = read_file(p2, &in_len);
    snprintf(p2, sizeof p2, "%s.out", path);
    char *outp = read_file(p2, &out_len);
    assert_non_null(inp);
    assert_non_null(outp);

    int total = 0, passed = 0, round_trips = 0;
    char *s = inp, *line = outp;
    for (char *sep; (sep = strstr(s, SEP)) && *line; s = sep + strlen(SEP)) {
        char *eol = strchr(line, '\n');
        if (eol)
            *eol = 0;
        int32_t want[4096];
        size_t n_want = 0;
        for (char *p = line, *end; n_want < 4096; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            want[n_want++] = (int32_t)v;
        }
        size_t n;
        int32_t *got = tokenize_all(t, s, (size_t)(sep - s), false, false, &n);
        total++;
        if (n == n_want && !memcmp(got, want, n * sizeof *got))
            passed++;
        else {
            printf("  MISMATCH %s string %d: \"%.*s\"\n", vocab, total, (int)(sep - s), s);
            print_ids("expected", want, n_want);
            print_ids("got     ", got, n);
        }
        size_t dl;
        char *back = detok_all(t, got, n, VKI_DETOK_STRIP_LEADING_SPACE, &dl);
        if (dl == (size_t)(sep - s) && !memcmp(back, s, dl))
            round_trips++;
        else
            printf("  ROUND TRIP %s string %d: \"%.*s\" -> \"%s\"\n", vocab, total, (int)(sep - s), s, back);
        free(back);
        free(got);
        line = eol ? eol + 1 : line + strlen(line);
    }
    printf("%s: %d/%d strings match, %d/%d round trips\n", vocab, passed, total, round_trips, total);
    assert_true(total >= 40);
    assert_int_equal(passed, total);
    assert_int_equal(round_trips, total);
    free(inp);
    free(outp);
    vki_tokenizer_free(t);
}

static void test_vocab_llama_spm(void **state) { run_vocab_set("vocab/ggml-vocab-llama-spm.gguf"); }
static void test_vocab_gpt2(void **state) { run_vocab_set("vocab/ggml-vocab-gpt-2.gguf"); }
static void test_vocab_starcoder(void **state) { run_vocab_set("vocab/ggml-vocab-starcoder.gguf"); }
static void test_vocab_deepseek_coder(void **state) { run_vocab_set("vocab/ggml-vocab-deepseek-coder.gguf"); }
static void test_vocab_deepseek_llm(void **state) { run_vocab_set("vocab/ggml-vocab-deepseek-llm.gguf"); }

/* ---- stories260K ------------------------------------------------------------------------------ */

/* 512-token SentencePiece vocabulary. "▁Once▁upon▁a▁time" merges by score: ▁t (score 0) first,
 * then ▁a (-2), im, on, ▁u, ▁O, ▁On, ce, ▁up, ime, ▁time (-119), ▁Once (-144, from ▁On + ce),
 * ▁upon (-148, from ▁up + on): ids 403 407 261 378, after BOS 1. */
/* Fill-in-the-middle tokens found by their text where the GGUF has no fim_* keys: StarCoder's
 * <fim_prefix> / <fim_suffix> / <fim_middle> / <repo_name> / <file_sep>; GPT-2 has none. */
static void test_fim_tokens(void **state)
{
    (void)state;
    vki_tokenizer *t = load_or_skip("vocab/ggml-vocab-starcoder.gguf");
    static const char *const want[VKI_FIM_COUNT] = {"<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>",
                                                    "<file_sep>"};
    for (int k = 0; k < VKI_FIM_COUNT; k++) {
        int32_t id = vki_token_fim(t, (vki_fim_token)k);
        char piece[64];
        size_t n = 0;
        assert_true(id >= 0);
        assert_int_equal(vki_token_to_piece(t, id, true, piece, sizeof piece, &n), VKI_OK);
        assert_int_equal(n, strlen(want[k]));
        assert_memory_equal(piece, want[k], n);
    }
    assert_int_equal(vki_token_fim(t, VKI_FIM_COUNT), -1);
    vki_tokenizer_free(t);
    t = load_or_skip("vocab/ggml-vocab-gpt-2.gguf");
    for (int k = 0; k < VKI_FIM_COUNT; k++)
        assert_int_equal(vki_token_fim(t, (vki_fim_token)k), -1);
    vki_tokenizer_free(t);
}

static void test_stories_once_upon(void **state)
{
    vki_tokenizer *t = load_or_skip("stories260K.gguf");
    const char *s = "Once upon a time";
    static const int32_t want[] = {1, 403, 407, 261, 378};
    size_t n;
    int32_t *ids = tokenize_all(t, s, strlen(s), true, false, &n);
    print_ids("Once upon a time", ids, n);
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    assert_true(vki_tokenizer_adds_bos(t));
    assert_int_equal(vki_token_bos(t), 1);
    assert_int_equal(vki_token_eos(t), 2);
    assert_true(vki_token_is_eog(t, 2));
    assert_false(vki_token_is_eog(t, 403));

    size_t len;
    char *back = detok_all(t, ids, n, VKI_DETOK_STRIP_LEADING_SPACE, &len);
    assert_string_equal(back, s);
    free(back);
    back = detok_all(t, ids, n, 0, &len);
    assert_string_equal(back, " Once upon a time");
    free(back);
    back = detok_all(t, ids, n, VKI_DETOK_SPECIAL, &len);
    assert_string_equal(back, "<s> Once upon a time");
    free(back);
    free(ids);

    /* a too-small buffer reports the needed count */
    int32_t small[2];
    assert_int_equal(vki_tokenize(t, s, strlen(s), true, false, small, 2, &n), VKI_ERR_INVALID_ARG);
    assert_int_equal(n, 5);
    char piece[4];
    assert_int_equal(vki_token_to_piece(t, 403, false, piece, 2, &len), VKI_ERR_INVALID_ARG);
    assert_int_equal(len, 5);
    assert_int_equal(vki_token_to_piece(t, 403, false, piece, 4, &len), VKI_ERR_INVALID_ARG);
    assert_int_equal(vki_token_to_piece(t, 512, false, piece, 4, &len), VKI_ERR_INVALID_ARG);
    assert_int_equal(vki_token_to_piece(t, -1, false, piece, 4, &len), VKI_ERR_INVALID_ARG);
    assert_int_equal(vki_token_to_piece(t, 1, false, piece, 4, &len), VKI_OK);
    assert_int_equal(len, 0); /* <s> is control: rendered only with special */
    assert_int_equal(vki_token_to_piece(t, 3 + 0x41, false, piece, 4, &len), VKI_OK);
    assert_int_equal(len, 1); /* <0x41> */
    assert_int_equal(piece[0], 'A');
    vki_tokenizer_free(t);
}

/* ---- streaming -------------------------------------------------------------------------------- */

/* Characters outside the 512-token vocabulary fall back to byte tokens, so their UTF-8 sequences
 * are split across tokens: the stream must hold the bytes until each sequence completes. */
static void test_stream_split_utf8(void **state)
{
    vki_tokenizer *t = load_or_skip("stories260K.gguf");
    const char *s = "Once 🦙 é€ upon 日本";
    size_t n, len;
    int32_t *ids = tokenize_all(t, s, strlen(s), true, false, &n);
    int bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += ids[i] >= 3 && ids[i] < 259;
    assert_true(bytes >= 10); /* the emoji and 日本 are byte tokens here (é and € are pieces) */

    vki_detok *d;
    assert_int_equal(vki_detok_create(t, VKI_DETOK_STRIP_LEADING_SPACE, &d), VKI_OK);
    char acc[256];
    size_t acc_n = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        assert_int_equal(vki_detok_push(d, ids[i], &p, &len), VKI_OK);
        assert_true(valid_utf8(p, len)); /* never a partial sequence */
        memcpy(acc + acc_n, p, len);
        acc_n += len;
    }
    const char *p;
    assert_int_equal(vki_detok_flush(d, &p, &len), VKI_OK);
    assert_int_equal(len, 0);
    acc[acc_n] = 0;
    assert_string_equal(acc, s);

    /* the four bytes of U+1F999 one at a time: nothing, nothing, nothing, the whole character */
    int32_t llama[4] = {3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(vki_detok_push(d, llama[i], &p, &len), VKI_OK);
        assert_int_equal(len, i < 3 ? 0 : 4);
    }
    assert_memory_equal(p, "\xF0\x9F\xA6\x99", 4);
    /* a sequence cut short: the held bytes come out as one U+FFFD at the flush */
    assert_int_equal(vki_detok_push(d, 3 + 0xE2, &p, &len), VKI_OK);
    assert_int_equal(len, 0);
    assert_int_equal(vki_detok_flush(d, &p, &len), VKI_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(p, "\xEF\xBF\xBD", 3);
    /* a lead byte followed by a non-continuation: U+FFFD, then the next character */
    assert_int_equal(vki_detok_push(d, 3 + 0xE2, &p, &len), VKI_OK);
    assert_int_equal(vki_detok_push(d, 3 + 'A', &p, &len), VKI_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(p, "\xEF\xBF\xBD" "A", 4);
    /* a byte that never starts UTF-8 */
    assert_int_equal(vki_detok_push(d, 3 + 0xFF, &p, &len), VKI_OK);
    assert_int_equal(len, 3);
    assert_int_equal(vki_detok_push(d, 100000, &p, &len), VKI_ERR_INVALID_ARG);
    vki_detok_free(d);
    free(ids);
    vki_tokenizer_free(t);
}

/* Appends the byte tokens (<0xNN> = 3 + NN in stories260K) of code point cp's UTF-8. */
static size_t push_cp_bytes(int32_t *ids, size_t n, uint32_t cp)
{
    uint8_t u[4];
    size_t k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const uint8_t lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (size_t i = k; i-- > 1; cp >>= 6)
        u[i] = (uint8_t)(0x80 | (cp & 0x3F));
    u[0] = (uint8_t)(lead[k] | cp);
    for (size_t i = 0; i < k; i++)
        ids[n++] = 3 + u[i];
    return n;
}

/* Random sequences: code points of every UTF-8 length as byte tokens, some cut short, mixed with
 * random ids. Every pushed chunk must be valid UTF-8, and when the whole detokenisation is valid
 * the stream must reproduce it exactly. */
static void test_stream_random(void **state)
{
    vki_tokenizer *t = load_or_skip("stories260K.gguf");
    vt_rng r = vt_rng_seeded("tokenizer stream");
    vki_detok *d;
    assert_int_equal(vki_detok_create(t, 0, &d), VKI_OK);
    int exact = 0;
    for (int it = 0; it < 2000; it++) {
        int32_t ids[16 * 4];
        size_t n = 0, m = vt_range(&r, 1, 16);
        for (size_t j = 0; j < m; j++) {
            uint32_t kind = vt_range(&r, 0, 5), cp;
            if (kind == 0) {
                ids[n++] = (int32_t)vt_range(&r, 0, 511);
                continue;
            }
            do
                cp = kind == 1 ? vt_range(&r, 0x80, 0x7FF) : kind == 2 ? vt_range(&r, 0x800, 0xFFFF)
                                                                       : vt_range(&r, 0x10000, 0x10FFFF);
            while (cp >= 0xD800 && cp <= 0xDFFF);
            size_t before = n;
            n = push_cp_bytes(ids, n, cp);
            if (kind == 5 && n - before > 1)
                n--; /* cut short */
        }
        char acc[16 * 64];
        size_t acc_n = 0, len;
        const char *p;
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(vki_detok_push(d, ids[i], &p, &len), VKI_OK);
            assert_true(valid_utf8(p, len));
            memcpy(acc + acc_n, p, len);
            acc_n += len;
        }
        assert_int_equal(vki_detok_flush(d, &p, &len), VKI_OK);
        assert_true(valid_utf8(p, len));
        memcpy(acc + acc_n, p, len);
        acc_n += len;
        size_t dl;
        char *whole = detok_all(t, ids, n, 0, &dl);
        if (valid_utf8(whole, dl)) {
            assert_int_equal(acc_n, dl);
            assert_memory_equal(acc, whole, dl);
            exact++;
        }
        free(whole);
    }
    printf("random streams: %d of 2000 were valid UTF-8 and matched exactly\n", exact);
    assert_true(exact > 200);
    vki_detok_free(d);
    vki_tokenizer_free(t);
}

/* ---- special tokens, BOS/EOS, bad input ------------------------------------------------------- */

static void test_gpt2_special(void **state)
{
    vki_tokenizer *t = load_or_skip("vocab/ggml-vocab-gpt-2.gguf");
    const char *s = "Hello<|endoftext|> world";
    size_t n, len;
    int32_t eot = vki_token_eos(t);
    assert_true(eot >= 0);
    assert_true(vki_token_is_eog(t, eot));
    int32_t *a = tokenize_all(t, s, strlen(s), false, true, &n);
    print_ids("parse_special", a, n);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found |= a[i] == eot;
    assert_true(found);
    char *back = detok_all(t, a, n, VKI_DETOK_SPECIAL, &len);
    assert_string_equal(back, s);
    free(back);
    back = detok_all(t, a, n, 0, &len);
    assert_string_equal(back, "Hello world");
    free(back);
    free(a);

    a = tokenize_all(t, s, strlen(s), false, false, &n); /* the marker is plain text now */
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(a[i], eot);
    back = detok_all(t, a, n, 0, &len);
    assert_string_equal(back, s);
    free(back);
    free(a);

    /* gpt2 adds no BOS unless the metadata says so; add_special is then a no-op */
    assert_false(vki_tokenizer_adds_bos(t));
    a = tokenize_all(t, "Hello", 5, true, false, &n);
    size_t n2;
    int32_t *b = tokenize_all(t, "Hello", 5, false, false, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(a, b, n * sizeof *a);
    free(a);
    free(b);
    vki_tokenizer_free(t);
}

/* BPE's documented handling of raw bytes: each byte that starts no valid UTF-8 sequence becomes
 * U+FFFD, and a byte whose GPT-2 code point is not in the vocabulary is dropped. Is `got` what
 * detokenising should give for input s? */
static bool bpe_expected(const vki_tokenizer *t, const char *s, size_t n, const char *got, size_t got_n)
{
    char *want = malloc(3 * n + 1);
    size_t w = 0;
    for (size_t i = 0, k; i < n; i += k) {
        k = tok_utf8_valid((const uint8_t *)s + i, n - i);
        const char *src = k ? s + i : "\xEF\xBF\xBD";
        size_t m = k ? k : 3;
        k = k ? k : 1;
        for (size_t j = 0; j < m; j++)
            if (t->byte_tok[(uint8_t)src[j]] >= 0)
                want[w++] = src[j];
    }
    bool ok = w == got_n && !memcmp(want, got, w);
    free(want);
    return ok;
}

/* Empty text, invalid UTF-8, and long inputs on every vocabulary: no crash, sane output. */
static void test_bad_and_long_input(void **state)
{
    static const char *const vocabs[] = {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                                         "vocab/ggml-vocab-deepseek-llm.gguf", "vocab/ggml-vocab-starcoder.gguf",
                                         "vocab/ggml-vocab-deepseek-coder.gguf"};
    vt_rng r = vt_rng_seeded("tokenizer bad input");
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        vki_tokenizer *t = load_or_skip(vocabs[v]);
        bool spm = !strcmp(tok_model_name(t), "llama");
        size_t n, len;
        int32_t one;
        assert_int_equal(vki_tokenize(t, "", 0, false, false, &one, 1, &n), VKI_OK);
        assert_int_equal(n, 0);
        assert_int_equal(vki_tokenize(t, NULL, 0, true, true, &one, 1, &n), VKI_OK);
        assert_int_equal(n, vki_tokenizer_adds_bos(t) ? 1 : 0);

        /* stray bytes: SPM keeps them as byte tokens, BPE turns each into U+FFFD */
        const char *bad = "abc\xFF" "def\xE2\x82" " \xC0\xAF" "g\xED\xA0\x80";
        int32_t *ids = tokenize_all(t, bad, strlen(bad), false, false, &n);
        char *back = detok_all(t, ids, n, VKI_DETOK_STRIP_LEADING_SPACE, &len);
        if (spm)
            assert_string_equal(back, bad);
        else
            assert_string_equal(back, "abc\xEF\xBF\xBD" "def\xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD"
                                      "g\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
        free(back);
        free(ids);

        for (int it = 0; it < 50; it++) { /* random bytes */
            char buf[300];
            size_t bl = vt_range(&r, 1, sizeof buf);
            for (size_t i = 0; i < bl; i++)
                buf[i] = (char)vt_u64(&r);
            ids = tokenize_all(t, buf, bl, true, true, &n);
            back = detok_all(t, ids, n, VKI_DETOK_STRIP_LEADING_SPACE, &len);
            if (spm) /* byte fallback is lossless */
                assert_true(len == bl && !memcmp(back, buf, bl));
            else if (!bpe_expected(t, buf, bl, back, len)) {
                printf("  %s: unexpected detokenisation of random bytes:", vocabs[v]);
                for (size_t i = 0; i < bl; i++)
                    printf(" %02x", (uint8_t)buf[i]);
                printf("\n");
                print_ids("ids", ids, n);
                fail();
            }
            free(back);
            free(ids);
        }

        /* long runs: one 200 KB word, 200 KB of spaces, 200 KB of digits and newlines */
        size_t big = 200000;
        char *s = malloc(big);
        static const char fill[3] = {'a', ' ', '7'};
        for (int k = 0; k < 3; k++) {
            memset(s, fill[k], big);
            if (k == 2)
                for (size_t i = 0; i < big; i += 97)
                    s[i] = '\n';
            double t0 = now_s();
            ids = tokenize_all(t, s, big, false, false, &n);
            double dt = now_s() - t0;
            back = detok_all(t, ids, n, VKI_DETOK_STRIP_LEADING_SPACE, &len);
            assert_true(len == big && !memcmp(back, s, big));
            printf("  %s: 200 KB of '%c': %zu tokens in %.1f ms\n", vocabs[v], fill[k], n, 1e3 * dt);
            free(back);
            free(ids);
        }
        free(s);
        vki_tokenizer_free(t);
    }
}

/* ---- throughput, threads ---------------------------------------------------------------------- */

/* ~100 KB of mixed text: the vocabulary test strings repeated. */
static char *corpus(size_t *len)
{
    char path[1024], p2[1100];
    if (!vt_shared_model("vocab/ggml-vocab-gpt-2.gguf", path, sizeof path))
        return NULL;
    snprintf(p2, sizeof p2, "%s.inp", path);
    size_t n;
    char *inp = read_file(p2, &n);
    assert_non_null(inp);
    size_t reps = 100000 / n + 1;
    char *c = malloc(reps * n + 1);
    for (size_t i = 0; i < reps; i++)
        memcpy(c + i * n, inp, n);
    *len = reps * n;
    free(inp);
    return c;
}

static void test_throughput(void **state)
{
    static const char *const vocabs[] = {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                                         "vocab/ggml-vocab-starcoder.gguf", "vocab/ggml-vocab-deepseek-coder.gguf",
                                         "vocab/ggml-vocab-deepseek-llm.gguf"};
    size_t len;
    char *c = corpus(&len);
    if (!c)
        skip();
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        vki_tokenizer *t = load_or_skip(vocabs[v]);
        size_t n;
        double t0 = now_s();
        int32_t *ids = tokenize_all(t, c, len, false, false, &n); /* tokenises twice: count, then fill */
        double dt = (now_s() - t0) / 2;
        printf("  %s: %zu bytes -> %zu tokens in %.1f ms (%.1f MB/s)\n", vocabs[v], len, n, 1e3 * dt,
               (double)len / dt / 1e6);
        size_t dl;
        char *back = detok_all(t, ids, n, VKI_DETOK_STRIP_LEADING_SPACE, &dl);
        assert_true(dl == len && !memcmp(back, c, len));
        free(back);
        free(ids);
        vki_tokenizer_free(t);
    }
    free(c);
}

typedef struct thread_job {
    const vki_tokenizer *t;
    const char *text;
    size_t len;
    const int32_t *want;
    size_t n_want;
    int mismatches;
} thread_job;

static void *thread_main(void *arg)
{
    thread_job *j = arg;
    int32_t *ids = malloc(j->n_want * sizeof *ids);
    for (int it = 0; it < 4; it++) {
        size_t n;
        vki_status st = vki_tokenize(j->t, j->text, j->len, true, true, ids, j->n_want, &n);
        if (st != VKI_OK || n != j->n_want || memcmp(ids, j->want, n * sizeof *ids))
            j->mismatches++;
    }
    free(ids);
    return NULL;
}

/* Four threads tokenise the same 100 KB on one tokenizer and must all get the single-threaded
 * answer (under the sanitizer build this also checks they touch no shared scratch). */
static void test_threads(void **state)
{
    vki_tokenizer *t = load_or_skip("vocab/ggml-vocab-deepseek-llm.gguf");
    size_t len, n;
    char *c = corpus(&len);
    int32_t *want = tokenize_all(t, c, len, true, true, &n);
    enum { NT = 4 };
    pthread_t th[NT];
    thread_job jobs[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (thread_job){t, c, len, want, n, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &jobs[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].mismatches, 0);
    }
    free(want);
    free(c);
    vki_tokenizer_free(t);
}

/* ---- metadata errors (in-memory GGUF files) --------------------------------------------------- */

typedef struct gbuf {
    uint8_t b[4096];
    size_t n;
} gbuf;

static void put_bytes(gbuf *g, const void *p, size_t n)
{
    assert_true(g->n + n <= sizeof g->b);
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
static void put_u32(gbuf *g, uint32_t v) { put_bytes(g, &v, 4); }
static void put_u64(gbuf *g, uint64_t v) { put_bytes(g, &v, 8); }
static void put_str(gbuf *g, const char *s)
{
    put_u64(g, strlen(s));
    put_bytes(g, s, strlen(s));
}
static void kv_str(gbuf *g, const char *k, const char *v)
{
    put_str(g, k);
    put_u32(g, GGUF_TYPE_STRING);
    put_str(g, v);
}
static void kv_u32(gbuf *g, const char *k, uint32_t v)
{
    put_str(g, k);
    put_u32(g, GGUF_TYPE_UINT32);
    put_u32(g, v);
}
static void kv_strs(gbuf *g, const char *k, const char *const *v, uint64_t n)
{
    put_str(g, k);
    put_u32(g, GGUF_TYPE_ARRAY);
    put_u32(g, GGUF_TYPE_STRING);
    put_u64(g, n);
    for (uint64_t i = 0; i < n; i++)
        put_str(g, v[i]);
}

/* A tiny GGUF v3 with no tensors: model, optional pre, tokens, optional merges, and
 * bos_token_id = 4 when `bos`. */
static vki_status load_tiny_bos(const char *model, const char *pre, bool with_tokens, bool with_merges, bool bos,
                                vki_tokenizer **t, char *err, size_t err_len)
{
    static const char *const toks[] = {"a", "b", "ab", "\xC4\xA0", "<|end|>"};
    static const char *const merges[] = {"a b"};
    gbuf g = {.n = 0};
    put_bytes(&g, "GGUF", 4);
    put_u32(&g, 3);
    put_u64(&g, 0);
    put_u64(&g, 1 + (pre != NULL) + with_tokens + with_merges + bos);
    kv_str(&g, "tokenizer.ggml.model", model);
    if (pre)
        kv_str(&g, "tokenizer.ggml.pre", pre);
    if (with_tokens)
        kv_strs(&g, "tokenizer.ggml.tokens", toks, 5);
    if (with_merges)
        kv_strs(&g, "tokenizer.ggml.merges", merges, 1);
    if (bos)
        kv_u32(&g, "tokenizer.ggml.bos_token_id", 4);
    gguf_file *f = NULL;
    vki_status st = gguf_open_memory(g.b, g.n, &f, err, err_len);
    assert_int_equal(st, VKI_OK);
    st = tok_from_gguf(f, t, err, err_len);
    gguf_close(f); /* the tokenizer keeps copies */
    return st;
}

static vki_status load_tiny(const char *model, const char *pre, bool with_tokens, bool with_merges,
                            vki_tokenizer **t, char *err, size_t err_len)
{
    return load_tiny_bos(model, pre, with_tokens, with_merges, false, t, err, err_len);
}

static void test_metadata_errors(void **state)
{
    char err[256];
    vki_tokenizer *t = NULL;
    assert_int_equal(load_tiny("bert", NULL, true, false, &t, err, sizeof err), VKI_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "'bert'"));
    assert_null(t);
    assert_int_equal(load_tiny("gpt2", "klingon-bpe", true, true, &t, err, sizeof err), VKI_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "'klingon-bpe'"));
    assert_int_equal(load_tiny("gpt2", "gpt-2", false, true, &t, err, sizeof err), VKI_ERR_FORMAT);
    assert_non_null(strstr(err, "tokenizer.ggml.tokens"));
    assert_int_equal(load_tiny("gpt2", "gpt-2", true, false, &t, err, sizeof err), VKI_ERR_FORMAT);
    assert_non_null(strstr(err, "tokenizer.ggml.merges"));
    printf("errors name the problem, e.g. \"%s\"\n", err);

    /* a valid tiny BPE: "ab" merges, " " maps to \xC4\xA0, <|end|> ends generation */
    assert_int_equal(load_tiny("gpt2", "gpt-2", true, true, &t, err, sizeof err), VKI_OK);
    size_t n;
    int32_t *ids = tokenize_all(t, "ab ab", 5, false, false, &n);
    static const int32_t want[] = {2, 3, 2};
    assert_int_equal(n, 3);
    assert_memory_equal(ids, want, sizeof want);
    assert_true(vki_token_is_eog(t, 4));
    free(ids);
    vki_tokenizer_free(t);
}

static void kv_i32s(gbuf *g, const char *k, const int32_t *v, uint64_t n)
{
    put_str(g, k);
    put_u32(g, GGUF_TYPE_ARRAY);
    put_u32(g, GGUF_TYPE_INT32);
    put_u64(g, n);
    put_bytes(g, v, n * sizeof *v);
}

/* A tiny byte-level BPE vocabulary (pre-tokenizer gpt-4o, as gpt-oss's) whose tokens are
 * words[0, n_words) (normal) and then toks[0, n) as control tokens; eot_token_id = eot unless
 * negative. */
static vki_tokenizer *load_words_vocab(const char *const *words, uint32_t n_words, const char *const *toks,
                                       uint32_t n, int32_t eot)
{
    const char *all[32];
    int32_t type[32];
    const uint32_t total = n_words + n;
    assert_true(total <= 32);
    for (uint32_t i = 0; i < total; i++)
        all[i] = i < n_words ? words[i] : toks[i - n_words], type[i] = i < n_words ? 1 : 3;
    gbuf g = {.n = 0};
    put_bytes(&g, "GGUF", 4);
    put_u32(&g, 3);
    put_u64(&g, 0);
    put_u64(&g, 5 + (eot >= 0));
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "gpt-4o");
    kv_strs(&g, "tokenizer.ggml.tokens", all, total);
    kv_i32s(&g, "tokenizer.ggml.token_type", type, total);
    kv_strs(&g, "tokenizer.ggml.merges", all, 0);
    if (eot >= 0)
        kv_u32(&g, "tokenizer.ggml.eot_token_id", (uint32_t)eot);
    gguf_file *f = NULL;
    vki_tokenizer *t = NULL;
    char err[256] = "";
    assert_int_equal(gguf_open_memory(g.b, g.n, &f, err, sizeof err), VKI_OK);
    if (tok_from_gguf(f, &t, err, sizeof err) != VKI_OK)
        fail_msg("control vocabulary: %s", err);
    gguf_close(f);
    return t;
}

/* The same with the words "a" and "b" (ids 0, 1; the control tokens from id 2). */
static vki_tokenizer *load_control_vocab(const char *const *toks, uint32_t n, int32_t eot)
{
    static const char *const ab[] = {"a", "b"};
    return load_words_vocab(ab, 2, toks, n, eot);
}

/* gpt-oss (o200k_harmony): "<|return|>" and "<|call|>" end generation and "<|end|>", which only
 * closes one message of the reply, does not, as llama.cpp decides it: when the vocabulary has both
 * of the first two (even if the metadata names "<|end|>" the end of turn). It stays a control
 * token: shown only as special, and text "<|end|>" is not it without parse_special. Without
 * "<|call|>" (or without "<|return|>") "<|end|>" ends generation as Phi-3's does. */
static void test_harmony_eog(void **state)
{
    (void)state;
    static const char *const harmony[] = {"<|endoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>",
                                          "<|call|>"};
    for (int eot = -1; eot <= 5; eot += 6) { /* eot 5: <|end|>'s id */
        vki_tokenizer *t = load_control_vocab(harmony, 6, eot);
        assert_true(vki_token_is_eog(t, 2) && vki_token_is_eog(t, 3) && vki_token_is_eog(t, 7));
        assert_false(vki_token_is_eog(t, 5));
        assert_false(vki_token_is_eog(t, 4) || vki_token_is_eog(t, 6) || vki_token_is_eog(t, 0));
        char buf[32];
        size_t n = 0;
        assert_int_equal(vki_token_to_piece(t, 5, false, buf, sizeof buf, &n), VKI_OK);
        assert_int_equal(n, 0);
        assert_int_equal(vki_token_to_piece(t, 5, true, buf, sizeof buf, &n), VKI_OK);
        assert_true(n == 7 && !memcmp(buf, "<|end|>", 7));
        int32_t *ids = tokenize_all(t, "a<|end|>", 8, false, true, &n);
        assert_true(n == 2 && ids[0] == 0 && ids[1] == 5);
        free(ids);
        ids = tokenize_all(t, "a<|end|>", 8, false, false, &n);
        for (size_t i = 0; i < n; i++)
            assert_int_not_equal(ids[i], 5);
        free(ids);
        vki_tokenizer_free(t);
    }
    static const char *const phi3[] = {"<|end|>", "<|endoftext|>"}, *const no_call[] = {"<|return|>", "<|end|>"};
    vki_tokenizer *t = load_control_vocab(phi3, 2, -1);
    assert_true(vki_token_is_eog(t, 2) && vki_token_is_eog(t, 3));
    vki_tokenizer_free(t);
    t = load_control_vocab(no_call, 2, -1);
    assert_true(vki_token_is_eog(t, 2) && vki_token_is_eog(t, 3));
    vki_tokenizer_free(t);
}

/* A chat answer as the simple API and the CLI show it (chat_reply): on a harmony template the
 * markers, control tokens, are rendered for chat_harmony, the analysis channel comes out as
 * reasoning and the final channel as the answer, "<|return|>" as nothing; a stop string inside the
 * answer ends it there. Any other template: every token's text is answer (the markers, not
 * rendered, are nothing). */
static void test_chat_reply(void **state)
{
    (void)state;
    static const char *const words[] = {"a", "b", "analysis", "final", "assistant", " c"};
    static const char *const ctl[] = {"<|return|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>", "<|channel|>"};
    vki_tokenizer *t = load_words_vocab(words, 6, ctl, 6, -1);
    enum { A, B, ANALYSIS, FINAL, ASSISTANT, C, RET, START, END, MSG, CALL, CHAN };
    const int32_t reply[] = {CHAN, ANALYSIS, MSG, A, B, END, START, ASSISTANT, CHAN, FINAL, MSG, B, C, A, RET};
    chat_template harmony = {.family = CHAT_HARMONY}, plain = {.family = CHAT_CHATML};
    for (int k = 0; k < 3; k++) {
        const char *stop = "ca";
        chat_reply r;
        assert_int_equal(chat_reply_init(&r, t, k == 2 ? &plain : &harmony, NULL, k == 1 ? &stop : NULL, k == 1, 0),
                         VKI_OK);
        strbuf rs = {0}, as = {0};
        bool stopped = false;
        for (size_t i = 0; i < sizeof reply / sizeof reply[0] && !stopped; i++) {
            assert_int_equal(chat_reply_push(&r, reply[i], &stopped), VKI_OK);
            strbuf_put(&rs, r.reasoning.p, r.reasoning.len);
            strbuf_put(&as, r.answer.p, r.answer.len);
        }
        assert_int_equal(chat_reply_finish(&r), VKI_OK);
        strbuf_put(&rs, r.reasoning.p, r.reasoning.len);
        strbuf_put(&as, r.answer.p, r.answer.len);
        const char *want_r = k == 2 ? "" : "ab", *want_a = k == 0 ? "b ca" : k == 1 ? "b " : "analysisabassistantfinalb ca";
        if (strcmp(rs.p, want_r) || strcmp(as.p, want_a))
            fail_msg("case %d: reasoning [%s] answer [%s], want [%s] [%s]", k, rs.p, as.p, want_r, want_a);
        assert_int_equal(stopped, k == 1);
        strbuf_free(&rs), strbuf_free(&as);
        chat_reply_free(&r);
    }
    vki_tokenizer_free(t);
}

/* The pieces pre-tokenizer `pre` cuts text into are exactly pieces[] (NULL-terminated). */
static void expect_pieces(const char *pre, const char *text, const char *const *pieces)
{
    char err[256] = "";
    vki_tokenizer *t = NULL;
    assert_int_equal(load_tiny("gpt2", pre, true, true, &t, err, sizeof err), VKI_OK);
    size_t *ends, n, want_n = 0, start = 0;
    assert_int_equal(tok_bpe_pieces(t, text, strlen(text), &ends, &n), VKI_OK);
    while (pieces[want_n])
        want_n++;
    bool ok = n == want_n;
    for (size_t i = 0; ok && i < n; start = ends[i++])
        ok = ends[i] - start == strlen(pieces[i]) && !memcmp(text + start, pieces[i], ends[i] - start);
    if (!ok) {
        printf("  %s pieces:", pre);
        for (size_t i = 0, b = 0; i < n; b = ends[i++])
            printf(" [%.*s]", (int)(ends[i] - b), text + b);
        printf("\n");
    }
    assert_true(ok);
    free(ends);
    vki_tokenizer_free(t);
}

/* Pre-tokenizer pieces, derived by hand from the upstream regexes (leftmost alternative wins;
 * Isolated splits keep the gaps). The text exercises contractions, a space before letters,
 * punctuation followed by newlines, a space run before digits, digit grouping, non-ASCII letters
 * and a tab before a letter: llama3 groups digits by three, qwen2 splits every digit, gpt-2 keeps
 * digit runs, starcoder isolates digits before the GPT-2 regex, deepseek-coder splits newlines,
 * letters, punctuation and digits in sequence, and llama.cpp's "default" splits punctuation
 * first and then groups digits by three. */
static void test_pretokenizers(void **state)
{
    static const char text[] = "Hello's world!!\n\n  12345 \xC3\x84\xC3\x96\tx";
    static const struct {
        const char *pre;
        const char *pieces[20];
    } cases[] = {
        {"llama3", {"Hello", "'s", " world", "!!\n\n", " ", " ", "123", "45", " \xC3\x84\xC3\x96", "\tx"}},
        {"qwen2", {"Hello", "'s", " world", "!!\n\n", " ", " ", "1", "2", "3", "4", "5", " \xC3\x84\xC3\x96", "\tx"}},
        {"gpt-2", {"Hello", "'s", " world", "!!", "\n\n ", " 12345", " \xC3\x84\xC3\x96", "\t", "x"}},
        {"smollm", {"Hello", "'s", " world", "!!", "\n\n  ", "1", "2", "3", "4", "5", " \xC3\x84\xC3\x96", "\t", "x"}},
        {"deepseek-coder", {"Hello", "'", "s", " world", "!!", "\n", "\n", "  ", "1", "2", "3", "4", "5",
                            " \xC3\x84\xC3\x96", "\tx"}},
        {"default", {"Hello", "'", "s", " world", "!!", "\n\n ", " ", "123", "45", " \xC3\x84\xC3\x96", "\t", "x"}},
        /* Tekken: the contraction is its own word ('s: an apostrophe before a lower-case run),
         * digits one by one, an all-upper-case word whole; o200k keeps 's on Hello, digits by 3 */
        {"tekken", {"Hello", "'s", " world", "!!\n\n", " ", " ", "1", "2", "3", "4", "5", " \xC3\x84\xC3\x96", "\tx"}},
        {"gpt-4o", {"Hello's", " world", "!!\n\n", " ", " ", "123", "45", " \xC3\x84\xC3\x96", "\tx"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        expect_pieces(cases[c].pre, text, cases[c].pieces);

    /* the cased pre-tokenizers split words where lower case turns upper (Hello|World; an upper
     * run keeps the lower-case letters after it: ABCdef), keep a slash after punctuation, and
     * (o200k) a contraction on its word; the others keep the letter run whole */
    static const char text2[] = "HelloWorld ABCdef's a+/b";
    static const struct {
        const char *pre;
        const char *pieces[12];
    } cased[] = {
        {"tekken", {"Hello", "World", " ABCdef", "'s", " a", "+/", "b"}},
        {"gpt-4o", {"Hello", "World", " ABCdef's", " a", "+/", "b"}},
        {"llama3", {"HelloWorld", " ABCdef", "'s", " a", "+/", "b"}},
    };
    for (size_t c = 0; c < sizeof cased / sizeof cased[0]; c++)
        expect_pieces(cased[c].pre, text2, cased[c].pieces);

    /* every supported name compiles its regexes */
    static const char *const names[] = {"default", "gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "llama3",
                                        "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "qwen2",
                                        "stablelm2", "megrez", "starcoder", "smollm", "refact", "command-r",
                                        "codeshell", "exaone", "minerva-7b", "deepseek-llm", "deepseek-coder",
                                        "tekken", "gpt-4o", "llama4", "deepseek-r1-qwen"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char err[256] = "";
        vki_tokenizer *t = NULL;
        vki_status st = load_tiny_bos("gpt2", names[i], true, true, true, &t, err, sizeof err);
        if (st != VKI_OK)
            fail_msg("pre-tokenizer %s: %s", names[i], err);
        /* BOS by default only for Llama 3's family and Tekken (add_bos_token absent here) */
        bool llama3 = (!strncmp(names[i], "llama", 5) && strcmp(names[i], "llama4")) || !strcmp(names[i], "falcon3") ||
                      !strcmp(names[i], "tekken");
        assert_int_equal(vki_token_bos(t), 4);
        assert_int_equal(vki_tokenizer_adds_bos(t), llama3);
        size_t n;
        int32_t *ids = tokenize_all(t, "ab", 2, true, false, &n);
        assert_int_equal(n, llama3 ? 2 : 1);
        assert_int_equal(ids[0], llama3 ? 4 : 2);
        free(ids);
        vki_tokenizer_free(t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_llama_spm),
        cmocka_unit_test(test_vocab_gpt2),
        cmocka_unit_test(test_vocab_starcoder),
        cmocka_unit_test(test_vocab_deepseek_coder),
        cmocka_unit_test(test_vocab_deepseek_llm),
        cmocka_unit_test(test_fim_tokens),
        cmocka_unit_test(test_stories_once_upon),
        cmocka_unit_test(test_stream_split_utf8),
        cmocka_unit_test(test_stream_random),
        cmocka_unit_test(test_gpt2_special),
        cmocka_unit_test(test_bad_and_long_input),
        cmocka_unit_test(test_throughput),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_metadata_errors),
        cmocka_unit_test(test_harmony_eog),
        cmocka_unit_test(test_chat_reply),
        cmocka_unit_test(test_pretokenizers),
    };
    return cmocka_run_group_tests_name("tokenizer", tests, NULL, NULL);
}
