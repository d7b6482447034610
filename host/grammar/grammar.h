/* Grammar-constrained generation, pure C (no Vulkan): GBNF grammars as llama.cpp writes them,
 * JSON Schema to GBNF, and the token masks that constrain sampling.
 *
 *   gbnf.c         GBNF text -> gram_grammar (rules of alternatives of terminals and references;
 *                  repetitions lowered to rules; undefined rules and left recursion refused)
 *   json_schema.c  JSON Schema -> GBNF text (gram_schema_to_gbnf)
 *   json_pattern.c a string's "pattern" (regular expression) and "format" -> GBNF
 *   gram_vocab.c   a vocabulary as byte strings in a trie (gram_vocab), built once per tokenizer
 *   gram_match.c   the matcher (gram_automaton): grammar x vocabulary -> allowed-token masks
 *
 * How the matcher is fast enough (see gram_match.c for the details). The parse state is a set of
 * pushdown stacks; stacks are hash-consed frames, sets are hash-consed stack lists, and a parse
 * state plus a pending partial UTF-8 character is one "DFA state" with a lazily filled byte
 * transition table, so advancing by a token is a few table reads. The mask of allowed tokens of a
 * state is the union over its stacks; for one stack it splits (as XGrammar does) into the tokens
 * decided by the stack's top position alone, computed once per grammar position by a walk of the
 * vocabulary trie and shared by every stack, request and nesting depth at that position, and the
 * few tokens that run past the end of the top rule, which are walked from the real parent
 * context. Masks are cached per DFA state. The host cost per constrained token is then a lookup,
 * a copy of n_vocab / 8 bytes and a walk of the sampled token's bytes.
 *
 * Tokens are byte strings: a token may span several grammar elements or end inside a UTF-8
 * character (the state then carries the partial character). Tokens with no bytes (control tokens
 * without text) are never allowed; end-of-generation tokens are the caller's to add where
 * gram_can_end() holds. Everything here is single-threaded per automaton (the batch manager's
 * worker thread owns them); grammars and vocabularies are immutable once built. */
#ifndef VKI_HOST_GRAMMAR_H
#define VKI_HOST_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/util/strbuf.h"
#include "vkinfer.h"

/* ---- grammars --------------------------------------------------------------------------------- */

typedef struct gram_grammar gram_grammar;

/* Parses GBNF (llama.cpp's syntax: `name ::= alternatives`, "literals", [classes] with ranges and
 * ^, `.`, (groups), | * + ? {m} {m,} {m,n}, # comments; escapes \n \r \t \\ \" \[ \] \- \xHH
 * \uHHHH \UHHHHHHHH; a newline ends a rule except inside a group or after | or ::=). The start
 * rule is `root`. VKI_ERR_INVALID_ARG with err = "grammar: line L, column C: ..." naming the
 * problem (syntax, undefined or redefined rule, missing root, left recursion, a repetition bound
 * above GRAM_MAX_REPEAT, a grammar above GRAM_MAX_ELEMS elements). O(text + lowered size). */
#define GRAM_MAX_REPEAT 10000
#define GRAM_MAX_ELEMS (1u << 22)
vki_status gram_parse(const char *text, size_t len, gram_grammar **out, char *err, size_t n_err);
void gram_grammar_free(gram_grammar *g); /* NULL is fine */
uint32_t gram_grammar_rules(const gram_grammar *g);

/* ---- JSON Schema -> GBNF ------------------------------------------------------------------------ */

/* Appends a GBNF grammar whose language is JSON text that validates against the schema (see
 * json_schema.c for the keywords; what is not supported is an error naming the keyword and its
 * place, never a silent widening). VKI_ERR_INVALID_ARG with err = "json_schema: <path>: ...". */
vki_status gram_schema_to_gbnf(const char *schema, size_t len, strbuf *out, char *err, size_t n_err);

/* A string's "pattern" (an ECMA-262 regular expression) as a GBNF expression over the JSON text
 * between its quotes; it refers to the rule json-char (any JSON-escaped character), which the
 * caller defines. VKI_ERR_INVALID_ARG with err = "at offset N: <what is not supported>". And a
 * "format" (date, time, date-time, uuid) likewise, VKI_ERR_UNSUPPORTED for others. See
 * json_pattern.c. */
vki_status gram_pattern_gbnf(const char *re, size_t len, strbuf *out, char *err, size_t n_err);
vki_status gram_format_gbnf(const char *format, strbuf *out);

/* Several schemas in one grammar (tool calls: one per function): appends the rules that define
 * `rule` as the JSON texts valid under schema (its $refs resolve inside it); rule names stay
 * distinct and the shared rules (ws, json-string, ...) are written once across calls with the
 * same ctx (zero-initialise it). path prefixes the error paths ("tools[2].parameters"). */
typedef struct gram_schema_ctx {
    uint32_t prims, n_rules;
} gram_schema_ctx;
struct json_value;
vki_status gram_schema_rule(gram_schema_ctx *ctx, const struct json_value *schema, const char *rule, const char *path,
                            strbuf *out, char *err, size_t n_err);

/* ---- vocabularies ------------------------------------------------------------------------------- */

typedef struct gram_vocab gram_vocab;

/* The bytes of token id (0 bytes: never allowed). Same contract as vki_token_to_piece. */
typedef vki_status (*gram_piece_fn)(void *ctx, int32_t id, char *buf, size_t cap, size_t *n_out);

/* Builds the vocabulary trie of n_vocab tokens; is_end marks the end-of-generation tokens (never
 * part of the trie: the caller allows them where the grammar may end). O(total bytes log n). */
vki_status gram_vocab_create(uint32_t n_vocab, gram_piece_fn piece, bool (*is_end)(void *ctx, int32_t id),
                             void *ctx, gram_vocab **out);
/* From a tokenizer: normal and user-defined tokens by their text, control tokens by their
 * special text ("[TOOL_CALLS]", "<tool_call>"), end-of-generation tokens excluded. */
vki_status gram_vocab_from_tokenizer(const vki_tokenizer *tok, gram_vocab **out);
void gram_vocab_free(gram_vocab *v);
uint32_t gram_vocab_size(const gram_vocab *v);
uint32_t gram_vocab_nodes(const gram_vocab *v); /* trie nodes, for reports */
/* The bytes of a token as the trie holds them; *len = 0 for tokens never allowed. */
const uint8_t *gram_vocab_piece(const gram_vocab *v, int32_t id, uint32_t *len);
bool gram_vocab_is_end(const gram_vocab *v, int32_t id);

/* ---- the matcher -------------------------------------------------------------------------------- */

typedef struct gram_automaton gram_automaton;
typedef uint32_t gram_state;  /* a parse state of one automaton */

typedef struct gram_limits {
    uint32_t max_stacks;      /* stacks in one parse state (ambiguity): 4096 */
    uint64_t max_bytes;       /* memory of the caches before the automaton reports "full":
                                 256 MiB */
} gram_limits;
gram_limits gram_default_limits(void);

/* Takes ownership of g (freed with the automaton, also on failure); v must outlive it. */
vki_status gram_automaton_create(gram_grammar *g, const gram_vocab *v, const gram_limits *lim,
                                 gram_automaton **out);
void gram_automaton_free(gram_automaton *a); /* NULL is fine */

/* The state before any output. */
vki_status gram_start(gram_automaton *a, gram_state *out, char *err, size_t n_err);
/* Allowed tokens at s as a bitset of ceil(n_vocab / 32) words (bit i of word w = token 32w + i),
 * end tokens excluded; valid until the next call on a. *n_allowed: set bits. */
vki_status gram_mask(gram_automaton *a, gram_state s, const uint32_t **mask, uint32_t *n_allowed, char *err,
                     size_t n_err);
bool gram_can_end(const gram_automaton *a, gram_state s);  /* the output may stop here */
bool gram_is_final(const gram_automaton *a, gram_state s); /* ... and nothing may follow */
/* The state after token id (not an end token). VKI_ERR_INVALID_ARG when s does not allow it. */
vki_status gram_advance(gram_automaton *a, gram_state s, int32_t id, gram_state *out, char *err, size_t n_err);
/* The state after bytes (any split of the text gives the same state). */
vki_status gram_advance_bytes(gram_automaton *a, gram_state s, const void *bytes, size_t n, gram_state *out,
                              char *err, size_t n_err);
/* Whether a whole text is in the grammar's language (tests, tool-call checks). */
bool gram_accepts(gram_automaton *a, const char *text, size_t n);

/* ---- one constrained request -------------------------------------------------------------------- */

/* A request's constraint: its state in a shared automaton, the tokens that end it, and the mask
 * buffer the sampler reads. What the batch manager does per constrained token is exactly
 * gram_req_mask (before the step) + gram_req_accept (after it); tools/grammar_bench.c times these. */
typedef struct gram_req {
    gram_automaton *a;        /* shared, not owned */
    gram_state q;
    const int32_t *end_ids;   /* [n_end] allowed where the grammar may end (not owned) */
    uint32_t n_end;
    uint32_t *mask;           /* [ceil(n_vocab / 32)] owned: allowed tokens for the next step */
} gram_req;

/* Starts r at the automaton's start state (mask allocated here). */
vki_status gram_req_init(gram_req *r, gram_automaton *a, const int32_t *end_ids, uint32_t n_end, char *err,
                         size_t n_err);
void gram_req_free(gram_req *r);
/* Fills r->mask for the next token: the grammar's tokens, plus the end tokens where the output
 * may stop. *n_allowed: bits set (0: the grammar admits nothing here; the caller ends the request). */
vki_status gram_req_mask(gram_req *r, uint32_t *n_allowed, char *err, size_t n_err);
/* Advances by a sampled token. *ended: it was an end token at a point where the grammar may stop.
 * VKI_ERR_INVALID_ARG when the token was not allowed (a mask was not applied). */
vki_status gram_req_accept(gram_req *r, int32_t token, bool *ended, char *err, size_t n_err);
/* Nothing but an end token can follow (the grammar is complete). */
bool gram_req_complete(const gram_req *r);

typedef struct gram_stats {
    uint32_t frames, sets, states, masks, positions; /* cache entries */
    uint64_t bytes;                                  /* their memory */
    uint64_t walk_nodes;                             /* trie nodes visited so far, by */
    uint64_t walk_local, walk_context, walk_partial; /* local, context and partial-char walks */
} gram_stats;
void gram_automaton_stats(const gram_automaton *a, gram_stats *out);

#endif
