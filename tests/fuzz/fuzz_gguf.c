/* GGUF reader, model description and tokenizer construction on arbitrary bytes: a malformed file
 * must give a status, never a crash, a read outside the buffer or a leak. Properties checked on
 * files that open: every key, value and tensor the reader hands out lies inside the buffer. */
#include "fuzz.h"

#include <string.h>

#include "engine/gguf.h"
#include "engine/model_meta.h"
#include "host/tokenizer/tokenizer.h"

static const uint8_t *g_lo, *g_hi;

static void check_span(const void *p, uint64_t n)
{
    const uint8_t *b = p;
    FUZZ_CHECK(n == 0 || (b >= g_lo && b <= g_hi && n <= (uint64_t)(g_hi - b)));
}

static void walk(const gguf_file *f)
{
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        check_span(kv->key.ptr, kv->key.len);
        check_span(kv->value, kv->value_bytes);
        if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING) {
            char key[256];
            size_t kl = kv->key.len < sizeof key - 1 ? kv->key.len : sizeof key - 1;
            memcpy(key, kv->key.ptr, kl);
            key[kl] = 0;
            gguf_str s;
            for (uint64_t j = 0; j < kv->arr_n && j < 64; j++)
                if (gguf_arr_str(f, key, j, &s) == VKI_OK)
                    check_span(s.ptr, s.len);
        }
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        check_span(t->name.ptr, t->name.len);
        check_span(t->data, t->nbytes);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) { return 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *f;
    char err[512];
    if (gguf_open_memory(data, size, &f, err, sizeof err) != VKI_OK) {
        FUZZ_CHECK(memchr(err, 0, sizeof err) && err[0]); /* a failure always says why */
        return 0;
    }
    g_lo = data;
    g_hi = data + size;
    walk(f);
    model_hparams hp;
    model_tensors t;
    if (model_read_hparams(f, &hp, err, sizeof err) == VKI_OK &&
        model_find_tensors(f, &hp, &t, err, sizeof err) == VKI_OK)
        model_tensors_free(&t);
    vki_tokenizer *tok;
    if (tok_from_gguf(f, &tok, err, sizeof err) == VKI_OK) {
        int32_t ids[64];
        size_t n;
        static const char text[] = " Hello, world! <s> \xe2\x96\x81 123";
        if (vki_tokenize(tok, text, sizeof text - 1, true, true, ids, 64, &n) == VKI_OK) {
            char out[512];
            size_t m;
            vki_detokenize(tok, ids, n, VKI_DETOK_SPECIAL, out, sizeof out, &m);
        }
        vki_tokenizer_free(tok);
    }
    gguf_close(f);
    return 0;
}
