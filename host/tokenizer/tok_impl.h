/* Tokenizer internals shared by the files of host/tokenizer/: tokenizer.c (load, dispatch),
 * tok_spm.c (SentencePiece), tok_bpe.c (byte-level BPE + pre-tokenizer regexes) and tok_detok.c
 * (detokenisation).
 *
 * Invariant: a vki_tokenizer is never written after tok_from_gguf() returns, so any number of
 * threads may use one at once; per-call scratch lives in a tok_ids / tok_heap on the caller. */
#ifndef VKI_HOST_TOK_IMPL_H
#define VKI_HOST_TOK_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "vkinfer.h"

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
enum tok_type {
    TOK_T_UNDEFINED = 0,
    TOK_T_NORMAL = 1,
    TOK_T_UNKNOWN = 2,
    TOK_T_CONTROL = 3,
    TOK_T_USER_DEFINED = 4,
    TOK_T_UNUSED = 5,
    TOK_T_BYTE = 6,
};

typedef enum tok_kind {
    TOK_SPM, /* tokenizer.ggml.model = "llama" */
    TOK_BPE, /* tokenizer.ggml.model = "gpt2" */
} tok_kind;

#define TOK_MAX_REGEX 8

typedef struct tok_entry {
    uint32_t off, len;             /* token text: arena[off, off+len) */
    uint32_t piece_off, piece_len; /* rendered bytes (byte tokens decoded, U+2581 -> ' ', GPT-2 map undone) */
    float score;                   /* SPM merge priority (higher first) */
    uint8_t type;                  /* enum tok_type */
    bool eog;                      /* ends generation */
} tok_entry;

/* Open-addressing hash: token text -> id. slot = id + 1, 0 = empty. Load factor <= 1/2. */
typedef struct tok_strmap {
    uint32_t *slot;
    uint32_t mask;
} tok_strmap;

/* Open-addressing hash: (left id, right id) -> merge rank and merged id. key = 0 marks empty,
 * real keys are ((left+1) << 32 | (right+1)). */
typedef struct tok_merge {
    uint64_t key;
    uint32_t rank;
    int32_t result; /* id of left+right, or -1 when that text is not in the vocabulary */
} tok_merge;

typedef struct tok_mergemap {
    tok_merge *slot;
    uint64_t mask;
} tok_mergemap;

struct vki_tokenizer {
    tok_kind kind;
    uint32_t n_vocab;
    tok_entry *tok;      /* [n_vocab] */
    char *arena;         /* token texts, then pieces */
    size_t arena_len;
    uint32_t max_piece_len;
    uint32_t max_text_len;
    tok_strmap map;      /* text -> id (all token types, as llama.cpp's text_to_token) */
    tok_mergemap merges; /* BPE only */
    uint32_t n_merges;
    int32_t byte_tok[256];  /* SPM: <0xNN> (else the 1-byte token, else unk); BPE: the mapped char's token */
    int32_t *special;       /* control / user-defined / unknown ids, longest text first */
    uint32_t n_special;
    int32_t bos, eos, eot, eom, unk, pad; /* -1 when absent */
    int32_t fim[VKI_FIM_COUNT];           /* fill-in-the-middle tokens (vki_fim_token), -1 when absent */
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    pcre2_code *re[TOK_MAX_REGEX]; /* pre-tokenizer, applied in sequence (BPE only) */
    uint32_t n_re;
    char model[16];
    char pre[32];
    char *chat_template;    /* tokenizer.chat_template, NUL-terminated, or NULL */
};

/* For the tokenizer's growable arrays (v, n, cap): when n == *cap, returns v reallocated to twice
 * the capacity (`first` elements when empty) and updates *cap; NULL on size overflow or out of
 * memory, with v and *cap untouched. Amortised O(1) a push. */
void *tok_grow(void *v, size_t *cap, size_t elem_size, size_t first);

/* Growable id array used while tokenising. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

vki_status tok_ids_push(tok_ids *a, int32_t id);

/* Binary min-heap of merge candidates; key orders them (lower first), left/right are symbol
 * indices, aux is checked on pop to drop stale candidates. */
typedef struct tok_cand {
    uint64_t key;
    int32_t left, right;
    uint32_t aux;
} tok_cand;

typedef struct tok_heap {
    tok_cand *v;
    size_t n, cap;
} tok_heap;

vki_status tok_heap_push(tok_heap *h, tok_cand c);
tok_cand tok_heap_pop(tok_heap *h); /* h->n > 0 */

/* Token id of text[0, len), or -1. */
int32_t tok_lookup(const vki_tokenizer *t, const char *text, size_t len);
/* Merge of (left, right) or NULL. */
const tok_merge *tok_merge_find(const vki_tokenizer *t, int32_t left, int32_t right);

/* Bytes in the UTF-8 sequence that lead byte c starts, as llama.cpp counts them (a stray
 * continuation byte counts as 1). */
static inline size_t tok_utf8_len(uint8_t c)
{
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

/* How many bytes of s[0, n) form a valid prefix of one UTF-8 sequence (0 if s[0] cannot start
 * one); *need receives the sequence's full length (1 for an invalid lead byte). A complete
 * sequence is k == *need; a truncated one k < *need with k == n; an ill-formed one otherwise. */
size_t tok_utf8_prefix(const uint8_t *s, size_t n, size_t *need);

/* Length of the strictly valid UTF-8 sequence at s[0, n) (1..4), or 0 if s does not start with
 * one. Rejects overlongs, surrogates, and code points above U+10FFFF. */
size_t tok_utf8_valid(const uint8_t *s, size_t n);

/* SentencePiece: append the ids of one raw text fragment (spaces not yet escaped). */
vki_status tok_spm_encode(const vki_tokenizer *t, const char *text, size_t len, bool add_prefix,
                          tok_ids *out);

/* Byte-level BPE: pre-tokenise one raw fragment with t->re[] and append the ids of each piece. */
vki_status tok_bpe_encode(const vki_tokenizer *t, const char *text, size_t len, tok_ids *out);

/* The pre-tokenizer's pieces of valid UTF-8 text (tests, tools): *ends (malloc'd, the caller
 * frees it) receives each piece's end offset, in order. */
vki_status tok_bpe_pieces(const vki_tokenizer *t, const char *text, size_t len, size_t **ends, size_t *n);

/* BPE load-time helpers (tok_bpe.c): the GPT-2 byte <-> code point map, the pre-tokenizer. */
uint32_t tok_gpt2_byte_to_cp(uint8_t b);
int tok_gpt2_cp_to_byte(uint32_t cp); /* -1 when cp is not one of the 256 mapped code points */
/* Compiles the regexes for pre-tokenizer `name` into t->re; sets t->ignore_merges and, when the
 * upstream does, t->add_bos. VKI_ERR_UNSUPPORTED (message names it) for an unknown name. */
vki_status tok_bpe_setup_pre(vki_tokenizer *t, const char *name, char *err, size_t err_len);

/* Renders token id into the piece cache form (tok_detok.c). Writes at most cap bytes and returns
 * the full length. */
size_t tok_render_piece(const vki_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif
