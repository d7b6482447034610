/* The grammar engine and the tool-call parser on arbitrary text.
 * Input: byte 0 picks what the rest is: 0 a GBNF grammar, 1 a JSON Schema, 2 generated text for
 * the tool-call parser (byte 1 picks the format). Properties: a grammar that parses compiles into
 * an automaton whose masks equal brute force (every token's bytes walked) along a walk of up to
 * 16 tokens over a small multi-byte vocabulary; every schema the converter accepts becomes GBNF
 * that parses; the parser's content plus calls never exceed the input, and it never fails except
 * for memory. */
#include "fuzz.h"

#include <string.h>

#include "host/chat/chat_tools.h"
#include "host/grammar/grammar.h"

static const char *const words[] = {"a", "b", "ab", "\"", "{", "}", "[", "]", ":", ",", " ", "\n", "0", "19", "true",
                                    "null", "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82", "\xac", "x\"", "\":", "-", "\\", "u"};
#define N_WORDS (sizeof words / sizeof *words)

static vki_status piece(void *ctx, int32_t id, char *buf, size_t cap, size_t *n)
{
    (void)ctx;
    *n = strlen(words[id]);
    if (*n > cap)
        return VKI_ERR_INVALID_ARG;
    memcpy(buf, words[id], *n);
    return VKI_OK;
}

static gram_vocab *vocab;

static void cleanup(void) { gram_vocab_free(vocab); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    FUZZ_CHECK(gram_vocab_create(N_WORDS, piece, NULL, NULL, &vocab) == VKI_OK);
    atexit(cleanup);
    return 0;
}

static void check_masks(const char *gbnf, size_t len, uint32_t walk_seed)
{
    gram_grammar *g;
    char err[256];
    if (gram_parse(gbnf, len, &g, err, sizeof err) != VKI_OK) {
        FUZZ_CHECK(!strncmp(err, "grammar: ", 9) || !err[0]); /* messages name what they are about */
        return;
    }
    gram_limits lim = gram_default_limits();
    lim.max_bytes = 64u << 20;
    gram_automaton *a;
    if (gram_automaton_create(g, vocab, &lim, &a) != VKI_OK)
        return;
    gram_state q;
    if (gram_start(a, &q, NULL, 0) == VKI_OK) {
        for (int step = 0; step < 16; step++) {
            const uint32_t *m;
            uint32_t n, seen = 0, pick = walk_seed % (step + 3);
            int32_t next = -1;
            if (gram_mask(a, q, &m, &n, NULL, 0) != VKI_OK)
                break;
            for (uint32_t id = 0; id < N_WORDS; id++) {
                gram_state r;
                bool brute = gram_advance_bytes(a, q, words[id], strlen(words[id]), &r, NULL, 0) == VKI_OK;
                FUZZ_CHECK(brute == (bool)(m[0] >> id & 1));
                if (brute && seen++ <= pick)
                    next = (int32_t)id;
            }
            FUZZ_CHECK(seen == n);
            if (next < 0 || gram_advance(a, q, next, &q, NULL, 0) != VKI_OK)
                break;
            walk_seed = walk_seed * 1103515245u + 12345u;
        }
    }
    gram_automaton_free(a);
}

static void count(void *user, const chat_tool_event *e)
{
    size_t *total = user;
    *total += e->len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    uint32_t seed = data[1];
    if (data[0] % 3 == 0) {
        check_masks(text, len, seed);
    } else if (data[0] % 3 == 1) {
        strbuf b = {0};
        char err[256];
        if (gram_schema_to_gbnf(text, len, &b, err, sizeof err) == VKI_OK) {
            gram_grammar *g = NULL;
            vki_status st = gram_parse(b.p, b.len, &g, err, sizeof err);
            FUZZ_CHECK(st == VKI_OK || st == VKI_ERR_OUT_OF_HOST_MEMORY); /* the converter writes valid GBNF */
            gram_grammar_free(g);
        } else {
            FUZZ_CHECK(!strncmp(err, "json_schema: ", 13) || !err[0]);
        }
        strbuf_free(&b);
    } else {
        chat_tool_parser *p;
        size_t total = 0;
        FUZZ_CHECK(chat_tool_parser_create((chat_tool_format)(seed % 4), seed & 4, NULL, seed, &p) == VKI_OK);
        for (size_t i = 0; i < len; i += 1 + seed % 5)
            FUZZ_CHECK(chat_tool_parser_push(p, text + i, len - i < 1 + seed % 5 ? len - i : 1 + seed % 5, count,
                                             &total) == VKI_OK);
        FUZZ_CHECK(chat_tool_parser_finish(p, count, &total) == VKI_OK);
        FUZZ_CHECK(total <= len); /* content and argument fragments come from the input */
        chat_tool_parser_free(p);
    }
    return 0;
}
