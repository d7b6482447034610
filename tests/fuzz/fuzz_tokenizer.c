/* Tokenizers on arbitrary text and arbitrary token ids, over the real vocabularies of
 * ../shared/models (SentencePiece and four byte-level BPE pre-tokenizers; the harness does
 * nothing when they are absent). Input: byte 0 picks the vocabulary, byte 1 the flags, the rest
 * is the text (and, read as little-endian int32s, a list of token ids).
 * Properties: every id produced is inside the vocabulary; byte-level BPE gives back exactly the
 * text it was given when that text is valid UTF-8 and special tokens are not parsed; the
 * streaming detokeniser gives the same bytes as the one-shot one whenever the one-shot output is
 * valid UTF-8; nothing crashes on ids outside the vocabulary. */
#include "fuzz.h"

#include <string.h>

#include "host/tokenizer/tok_impl.h"

static const char *const vocab_files[] = {
    "ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf",          "ggml-vocab-starcoder.gguf",
    "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-deepseek-coder.gguf",
};
#define N_VOCABS (sizeof vocab_files / sizeof vocab_files[0])
static vki_tokenizer *toks[N_VOCABS];
static size_t n_toks;

static void free_toks(void)
{
    for (size_t i = 0; i < n_toks; i++)
        vki_tokenizer_free(toks[i]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char path[1024], err[256];
    for (size_t i = 0; i < N_VOCABS; i++) {
        snprintf(path, sizeof path, "%s/models/vocab/%s", fuzz_shared_dir(), vocab_files[i]);
        vki_tokenizer *t;
        if (vki_tokenizer_load(path, &t, err, sizeof err) == VKI_OK)
            toks[n_toks++] = t;
    }
    if (!n_toks)
        fprintf(stderr, "fuzz_tokenizer: SKIP: no vocabularies under %s/models/vocab\n", fuzz_shared_dir());
    atexit(free_toks);
    return 0;
}

/* Streams ids through a vki_detok and compares with the one-shot detokenisation `want`. */
static void check_stream(const vki_tokenizer *t, const int32_t *ids, size_t n, uint32_t flags, const char *want,
                         size_t n_want)
{
    vki_detok *d;
    if (vki_detok_create(t, flags, &d) != VKI_OK)
        return;
    char *got = malloc(n_want * 3 + 16);
    size_t len = 0;
    const char *s;
    size_t sl;
    bool ok = got != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        ok = vki_detok_push(d, ids[i], &s, &sl) == VKI_OK && len + sl <= n_want * 3 + 16;
        if (ok)
            memcpy(got + len, s, sl), len += sl;
    }
    if (ok && vki_detok_flush(d, &s, &sl) == VKI_OK && len + sl <= n_want * 3 + 16) {
        memcpy(got + len, s, sl);
        len += sl;
        if (tok_utf8_valid((const uint8_t *)want, n_want) == n_want)
            FUZZ_CHECK(len == n_want && memcmp(got, want, len) == 0);
    }
    free(got);
    vki_detok_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || !n_toks || size > 4096)
        return 0;
    const vki_tokenizer *t = toks[data[0] % n_toks];
    bool add_special = data[1] & 1, parse_special = data[1] & 2;
    uint32_t flags = (data[1] >> 2) & 3;
    const char *text = (const char *)data + 2;
    size_t len = size - 2, n = 0;

    int32_t *ids = malloc((len + 4) * sizeof *ids);
    char *back = malloc(len * 4 + 64);
    if (!ids || !back)
        goto out;
    if (vki_tokenize(t, text, len, add_special, parse_special, ids, len + 4, &n) != VKI_OK)
        goto out;
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < vki_vocab_size(t));
    size_t m;
    if (vki_detokenize(t, ids, n, flags, back, len * 4 + 64, &m) == VKI_OK) {
        if (t->kind == TOK_BPE && !parse_special && !add_special && flags == 0 &&
            tok_utf8_valid((const uint8_t *)text, len) == len)
            FUZZ_CHECK(m == len && memcmp(back, text, len) == 0);
        check_stream(t, ids, n, flags, back, m);
    }
    /* The same bytes as raw ids, most of them outside the vocabulary: refused, never read. */
    size_t n_raw = len / 4;
    memcpy(ids, text, n_raw * 4);
    bool any_bad = false;
    for (size_t i = 0; i < n_raw; i++)
        any_bad |= ids[i] < 0 || (uint32_t)ids[i] >= vki_vocab_size(t);
    vki_status st = vki_detokenize(t, ids, n_raw, flags, back, len * 4 + 64, &m);
    FUZZ_CHECK(!any_bad || st == VKI_ERR_INVALID_ARG);
    /* ... and folded into the vocabulary: any id sequence (control tokens, lone UTF-8 bytes). */
    for (size_t i = 0; i < n_raw; i++)
        ids[i] = (int32_t)((uint32_t)ids[i] % vki_vocab_size(t));
    if (vki_detokenize(t, ids, n_raw, flags, back, len * 4 + 64, &m) == VKI_OK)
        check_stream(t, ids, n_raw, flags, back, m);
out:
    free(ids);
    free(back);
    return 0;
}
