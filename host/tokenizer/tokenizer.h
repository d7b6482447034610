/* Tokenizer, internal API: build a vki_tokenizer from a GGUF that is already open (the engine maps
 * the model once and builds its tokenizer from the same mapping).
 *
 * The tokenizer copies everything it keeps (token texts, scores, merges), so the gguf_file may be
 * closed right after tok_from_gguf() returns. The public API (vki_tokenize, vki_detokenize,
 * vki_detok_*) lives in include/vkinfer.h, section "Tokenizer". */
#ifndef VKI_HOST_TOKENIZER_H
#define VKI_HOST_TOKENIZER_H

#include "engine/gguf.h"
#include "vkinfer.h"

/* Reads tokenizer.ggml.* from f. VKI_ERR_UNSUPPORTED for an unknown tokenizer.ggml.model or
 * tokenizer.ggml.pre (err names it), VKI_ERR_FORMAT for missing or inconsistent metadata (err
 * names the key), VKI_ERR_OUT_OF_HOST_MEMORY. err may be NULL. */
vki_status tok_from_gguf(const gguf_file *f, vki_tokenizer **out, char *err, size_t err_len);

/* "llama" or "gpt2"; and the pre-tokenizer name in effect ("default" when the file names none). */
const char *tok_model_name(const vki_tokenizer *tok);
const char *tok_pre_name(const vki_tokenizer *tok);

#endif
