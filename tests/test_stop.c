/* Stop strings over streamed text (host/text/stop.c): hand-made cases for each rule, then random
 * texts split at random byte positions (inside UTF-8 characters too) against a whole-string
 * reference. No GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/text/stop.h"
#include "support/vt.h"

/* Whole-string reference: the match that ends first, then starts first. Returns the length of
 * the text to emit; *matched / *which tell whether and which stop string matched. */
static size_t ref_stop(const char *t, size_t n, const char *const *stops, uint32_t ns, bool *matched, uint32_t *which)
{
    for (size_t end = 1; end <= n; end++) {
        size_t best = (size_t)-1;
        for (uint32_t s = 0; s < ns; s++) {
            size_t l = strlen(stops[s]);
            if (l <= end && !memcmp(t + end - l, stops[s], l) && end - l < best) {
                best = end - l;
                *which = s;
            }
        }
        if (best != (size_t)-1) {
            *matched = true;
            return best;
        }
    }
    *matched = false;
    return n;
}

/* Text released so far never ends inside a UTF-8 character (for valid input). */
static bool ends_on_char(const char *t, size_t n)
{
    size_t k = 0;
    while (k < n && k < 4 && ((unsigned char)t[n - 1 - k] & 0xC0) == 0x80)
        k++;
    if (k == n)
        return k == 0;
    unsigned char c = (unsigned char)t[n - 1 - k];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return k + 1 == need;
}

typedef struct run {
    char out[4096];
    size_t n_out;
    bool matched;
    uint32_t which;
    size_t max_held;
} run;

/* Feeds pieces (split at cuts[0..n_cuts), ascending), then flushes; checks the UTF-8 rule on
 * the way when `valid` is set. */
static void feed_split(stop_matcher *m, const char *t, size_t n, const size_t *cuts, size_t n_cuts, bool valid, run *r)
{
    memset(r, 0, sizeof *r);
    size_t at = 0;
    for (size_t c = 0; c <= n_cuts; c++) {
        size_t end = c < n_cuts ? cuts[c] : n;
        stop_result res;
        assert_int_equal(stop_feed(m, t + at, end - at, &res), VKI_OK);
        memcpy(r->out + r->n_out, res.emit, res.n_emit);
        r->n_out += res.n_emit;
        if (stop_held(m) > r->max_held)
            r->max_held = stop_held(m);
        if (valid && !ends_on_char(r->out, r->n_out))
            fail_msg("released text ends inside a character after %zu bytes", end);
        if (res.matched) {
            r->matched = true;
            r->which = res.which;
        }
        at = end;
    }
    stop_result res;
    stop_flush(m, &res);
    memcpy(r->out + r->n_out, res.emit, res.n_emit);
    r->n_out += res.n_emit;
    r->matched |= res.matched;
}

/* Feeds `pieces` (NULL-terminated) and returns what came out; asserts the flags. */
static void expect(const char *const *stops, uint32_t ns, const char *const *pieces, const char *want,
                   int want_which /* -1: no match */)
{
    stop_matcher *m;
    assert_int_equal(stop_create(stops, ns, &m), VKI_OK);
    char out[1024];
    size_t n = 0;
    bool matched = false;
    uint32_t which = 0;
    for (size_t i = 0; pieces[i]; i++) {
        stop_result r;
        assert_int_equal(stop_feed(m, pieces[i], strlen(pieces[i]), &r), VKI_OK);
        memcpy(out + n, r.emit, r.n_emit);
        n += r.n_emit;
        if (r.matched && !matched) {
            matched = true;
            which = r.which;
        }
    }
    stop_result r;
    stop_flush(m, &r);
    memcpy(out + n, r.emit, r.n_emit);
    n += r.n_emit;
    out[n] = 0;
    assert_string_equal(out, want);
    assert_int_equal(matched, want_which >= 0);
    if (want_which >= 0)
        assert_int_equal(which, (uint32_t)want_which);
    stop_destroy(m);
}

#define P(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_hold_and_release(void **state)
{
    (void)state;
    const char *stops[1] = {"</s>"};
    stop_matcher *m;
    assert_int_equal(stop_create(stops, 1, &m), VKI_OK);
    stop_result r;
    assert_int_equal(stop_feed(m, "Hello <", 7, &r), VKI_OK);
    assert_int_equal(r.n_emit, 6); /* "<" might start "</s>" */
    assert_memory_equal(r.emit, "Hello ", 6);
    assert_int_equal(stop_held(m), 1);
    assert_int_equal(stop_feed(m, "/", 1, &r), VKI_OK);
    assert_int_equal(r.n_emit, 0);
    assert_int_equal(stop_feed(m, "x>", 2, &r), VKI_OK); /* "</x" cannot become "</s>" */
    assert_int_equal(r.n_emit, 4);
    assert_memory_equal(r.emit, "</x>", 4);
    assert_false(r.matched);
    assert_int_equal(stop_feed(m, "bye <", 5, &r), VKI_OK);
    assert_int_equal(r.n_emit, 4);
    stop_flush(m, &r); /* generation ended: the held "<" goes out */
    assert_int_equal(r.n_emit, 1);
    assert_memory_equal(r.emit, "<", 1);
    stop_destroy(m);
}

static void test_split_across_tokens(void **state)
{
    (void)state;
    const char *stops[1] = {"STOP"};
    expect(stops, 1, P("go ", "S", "T", "O", "P", " more"), "go ", 0);
    expect(stops, 1, P("go S", "TO", "P!"), "go ", 0);
    expect(stops, 1, P("ST", "OR", "Y"), "STORY", -1);
    expect(stops, 1, P("SSSTO", "P"), "SS", 0);
    const char *stops2[1] = {"abac"}; /* overlapping partial candidates */
    expect(stops2, 1, P("a", "b", "a", "b", "a", "c"), "ab", 0);
    expect(stops2, 1, P("abab", "ab", "ac"), "abab", 0);
}

static void test_several_stops(void **state)
{
    (void)state;
    const char *stops[3] = {"\n\n", "User:", "###"};
    expect(stops, 3, P("Hi there\n", "User", ": x"), "Hi there\n", 1);
    expect(stops, 3, P("a\n", "\nUser:"), "a", 0);
    expect(stops, 3, P("##", "x##", "#"), "##x", 2);
    const char *ends_first[2] = {"abcd", "bc"}; /* "bc" completes before "abcd" */
    expect(ends_first, 2, P("abcd"), "a", 1);
    expect(ends_first, 2, P("a", "b", "c", "d"), "a", 1);
    const char *same_end[2] = {"bc", "abc"}; /* same end: the one starting first */
    expect(same_end, 2, P("xabc"), "x", 1);
    expect(same_end, 2, P("xa", "bc"), "x", 1);
    expect(stops, 0, P("anything ## at all"), "anything ## at all", -1);
}

static void test_utf8(void **state)
{
    (void)state;
    const char *stops[2] = {"\xC3\xA9!", "\xE2\x86\x92"}; /* "é!" and "→" */
    expect(stops, 2, P("caf", "\xC3", "\xA9", "!", "x"), "caf", 0);
    expect(stops, 2, P("a\xE2\x86", "\x92" "b"), "a", 1);
    expect(stops, 2, P("\xC3\xA9t\xC3\xA9"), "\xC3\xA9t\xC3\xA9", -1);
    const char *bang[1] = {"!"};
    stop_matcher *m;
    assert_int_equal(stop_create(bang, 1, &m), VKI_OK);
    stop_result r;
    assert_int_equal(stop_feed(m, "ok \xF0\x9F", 5, &r), VKI_OK); /* half an emoji is held */
    assert_int_equal(r.n_emit, 3);
    assert_int_equal(stop_feed(m, "\x98", 1, &r), VKI_OK);
    assert_int_equal(r.n_emit, 0);
    assert_int_equal(stop_feed(m, "\x80!", 2, &r), VKI_OK);
    assert_true(r.matched);
    assert_int_equal(r.n_emit, 4);
    assert_memory_equal(r.emit, "\xF0\x9F\x98\x80", 4);
    assert_int_equal(stop_feed(m, "more", 4, &r), VKI_OK); /* after a match: nothing, still matched */
    assert_true(r.matched && r.n_emit == 0);
    stop_destroy(m);
    /* invalid bytes pass through instead of being held forever */
    expect(bang, 1, P("\x80\x80" "a", "\xC3", "A"), "\x80\x80" "a\xC3" "A", -1);
    expect(bang, 1, P("x\xC3"), "x\xC3", -1); /* flushed at the end */
}

static void test_create_errors(void **state)
{
    (void)state;
    stop_matcher *m = (stop_matcher *)1;
    const char *bad[2] = {"ok", ""};
    assert_int_equal(stop_create(bad, 2, &m), VKI_ERR_INVALID_ARG);
    assert_null(m);
    stop_destroy(NULL);
}

/* Random texts over a small alphabet with multi-byte characters, random stop strings and random
 * byte-level splits: the streamed result equals the whole-string reference, and held text stays
 * under the longest stop string plus an incomplete character. */
static void test_random_splits(void **state)
{
    (void)state;
    vt_rng rng = vt_rng_seeded("stop random");
    static const char *const alpha[] = {"a", "b", "c", "\xC3\xA9", "\xE2\x86\x92", "\n"};
    for (int iter = 0; iter < 3000; iter++) {
        char t[400], sbuf[4][16];
        size_t n = 0, ns = vt_range(&rng, 1, 4), longest = 0;
        const char *stops[4];
        for (size_t s = 0; s < ns; s++) {
            size_t l = 0, k = vt_range(&rng, 1, 4);
            for (size_t j = 0; j < k; j++) {
                const char *c = alpha[vt_range(&rng, 0, 5)];
                memcpy(sbuf[s] + l, c, strlen(c));
                l += strlen(c);
            }
            sbuf[s][l] = 0;
            stops[s] = sbuf[s];
            longest = l > longest ? l : longest;
        }
        size_t chars = vt_range(&rng, 0, 80);
        for (size_t j = 0; j < chars; j++) {
            const char *c = alpha[vt_range(&rng, 0, 5)];
            memcpy(t + n, c, strlen(c));
            n += strlen(c);
        }
        size_t cuts[64], n_cuts = n ? vt_range(&rng, 0, 20) : 0;
        for (size_t c = 0; c < n_cuts; c++)
            cuts[c] = vt_range(&rng, 0, (uint32_t)n);
        for (size_t a = 1; a < n_cuts; a++) /* ascending */
            for (size_t b = a; b > 0 && cuts[b] < cuts[b - 1]; b--) {
                size_t tmp = cuts[b];
                cuts[b] = cuts[b - 1];
                cuts[b - 1] = tmp;
            }
        bool want_m = false;
        uint32_t want_w = 0;
        size_t want_n = ref_stop(t, n, stops, (uint32_t)ns, &want_m, &want_w);
        stop_matcher *m;
        assert_int_equal(stop_create(stops, (uint32_t)ns, &m), VKI_OK);
        run r;
        feed_split(m, t, n, cuts, n_cuts, true, &r);
        stop_destroy(m);
        if (r.n_out != want_n || memcmp(r.out, t, want_n) || r.matched != want_m || (want_m && r.which != want_w))
            fail_msg("iteration %d: released %zu bytes (matched %d, stop %u), reference %zu (matched %d, stop %u)",
                     iter, r.n_out, r.matched, r.which, want_n, want_m, want_w);
        if (r.max_held > longest - 1 + 3)
            fail_msg("iteration %d: held %zu bytes, longest stop %zu", iter, r.max_held, longest);
    }
}

/* Whether b[0, n) is whole, valid UTF-8 (no truncated sequence at the end). */
static bool utf8_valid(const char *b, size_t n)
{
    const unsigned char *s = (const unsigned char *)b;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i], len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n)
            return false;
        for (unsigned j = 1; j < len; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
        i += len;
    }
    return true;
}

/* The public text stream over a real tokenizer (the llama SentencePiece vocabulary, byte
 * fallback): tokens of "... day, she said ¡Hola! The end" streamed one at a time with the stop
 * string "¡Hola" (2-byte UTF-8 in it, split across tokens): everything before it comes out
 * whole, nothing of it or after it, and the text never ends mid-character. */
static void test_text_stream_tokens(void **state)
{
    (void)state;
    char path[512];
    if (!vt_shared_model("vocab/ggml-vocab-llama-spm.gguf", path, sizeof path)) {
        fprintf(stderr, "SKIP: ../shared/models/vocab is absent\n");
        skip();
    }
    vki_tokenizer *tok;
    char err[256];
    assert_int_equal(vki_tokenizer_load(path, &tok, err, sizeof err), VKI_OK);
    const char *text = "One day, she said \xc2\xa1Hola! The end", *stops[] = {"never", "\xc2\xa1Hola"};
    int32_t ids[64];
    size_t n = 0;
    assert_int_equal(vki_tokenize(tok, text, strlen(text), false, false, ids, 64, &n), VKI_OK);
    vki_text_stream *ts;
    assert_int_equal(vki_text_stream_create(tok, stops, 2, VKI_DETOK_STRIP_LEADING_SPACE, &ts), VKI_OK);
    char out[256] = "";
    size_t len = 0;
    bool stopped = false;
    assert_int_equal(vki_text_stream_stop_index(ts), -1);
    for (size_t i = 0; i < n; i++) {
        const char *t;
        size_t k;
        bool s;
        assert_int_equal(vki_text_stream_push(ts, ids[i], &t, &k, &s), VKI_OK);
        memcpy(out + len, t, k);
        len += k;
        out[len] = 0;
        assert_true(utf8_valid(out, len)); /* complete characters only, at every step */
        stopped |= s;
    }
    const char *t;
    size_t k;
    assert_int_equal(vki_text_stream_finish(ts, &t, &k), VKI_OK);
    assert_int_equal(k, 0); /* stopped: nothing held back is released */
    assert_true(stopped && vki_text_stream_stopped(ts));
    assert_int_equal(vki_text_stream_stop_index(ts), 1); /* which one: the second */
    assert_string_equal(out, "One day, she said ");
    vki_text_stream_free(ts);
    vki_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hold_and_release),
        cmocka_unit_test(test_split_across_tokens),
        cmocka_unit_test(test_several_stops),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_random_splits),
        cmocka_unit_test(test_text_stream_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
