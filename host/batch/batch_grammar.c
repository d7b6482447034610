/* Structured output in the batch manager.
 *
 *   submission (any thread)  bm_constraint_compile: a JSON Schema becomes GBNF, GBNF becomes a
 *                            gram_grammar; errors are the request's refusal message
 *   intake (worker)          bm_constraint_attach: the vocabulary trie is built on first use; the
 *                            request joins the automaton of its grammar text (one per distinct
 *                            grammar, shared, so the second request with a schema finds its masks
 *                            cached), and starts its state
 *   before a step (worker)   bm_constraint_masks: the allowed-token bitset of each constrained row
 *                            that samples, into the request's buffer, which the plan points at
 *   after a step (worker)    bm_constraint_advance: the state moves over the sampled token
 *
 * Cost per constrained token on the worker: a mask lookup (or, for a new parse state, a union of
 * cached per-position walks), a copy of n_vocab / 8 bytes, and a walk of the token's bytes;
 * tools/grammar_bench.c measures it. Idle automata are kept (up to BM_GRAM_KEEP) for the next
 * request with the same grammar; one whose caches filled up is retired (its requests finish on
 * it, new ones get a fresh one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/batch/batch.h"

#define BM_GRAM_KEEP 8 /* idle compiled grammars kept for reuse */

typedef struct bm_gram_entry {
    struct bm_gram_entry *next;
    char *gbnf;                /* [len] the key */
    size_t len;
    gram_automaton *a;
    uint32_t users;            /* requests attached */
    bool retired;              /* caches full: no new users */
} bm_gram_entry;

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* ---- submission ----------------------------------------------------------------------------------- */

vki_status bm_constraint_compile(const vki_batch_manager *bm, const vki_request *r, bm_req *q, char *msg, size_t cap)
{
    const vki_constraint *c = &r->constraint;
    if (c->type == VKI_CONSTRAINT_NONE)
        return VKI_OK;
    if ((unsigned)c->type > VKI_CONSTRAINT_JSON_SCHEMA || (c->len && !c->text)) {
        snprintf(msg, cap, "constraint: unknown type %d or NULL text", (int)c->type);
        return VKI_ERR_INVALID_ARG;
    }
    if (!bm->be.token_piece) {
        snprintf(msg, cap, "constraint: this executor has no vocabulary to constrain");
        return VKI_ERR_INVALID_ARG;
    }
    strbuf text = {0};
    vki_status st = VKI_OK;
    if (c->type == VKI_CONSTRAINT_JSON_SCHEMA)
        st = gram_schema_to_gbnf(c->text, c->len, &text, msg, cap);
    else if (!strbuf_put(&text, c->text ? c->text : "", c->len))
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK)
        st = gram_parse(text.p, text.len, &q->grammar, msg, cap);
    if (st != VKI_OK) {
        strbuf_free(&text);
        if (st == VKI_ERR_OUT_OF_HOST_MEMORY)
            snprintf(msg, cap, "constraint: out of host memory");
        return st;
    }
    q->gbnf = text.p; /* ownership moves to q */
    q->gbnf_len = text.len;
    return VKI_OK;
}

/* ---- the worker's cache ----------------------------------------------------------------------------- */

static void entry_free(bm_gram_entry *e)
{
    gram_automaton_free(e->a);
    free(e->gbnf);
    free(e);
}

/* Drops idle entries beyond BM_GRAM_KEEP (the oldest first) and idle retired ones. */
static void trim_cache(vki_batch_manager *bm)
{
    uint32_t idle = 0;
    for (bm_gram_entry **p = &bm->grams; *p;) {
        bm_gram_entry *e = *p;
        bool drop = !e->users && (e->retired || ++idle > BM_GRAM_KEEP);
        if (drop) {
            *p = e->next;
            entry_free(e);
            bm->n_grams--;
        } else {
            p = &e->next;
        }
    }
}

void bm_grammar_free_all(vki_batch_manager *bm)
{
    for (bm_gram_entry *e = bm->grams, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    bm->grams = NULL;
    gram_vocab_free(bm->vocab);
    bm->vocab = NULL;
}

static vki_status build_vocab(vki_batch_manager *bm)
{
    return gram_vocab_create(bm->be.vocab_size, bm->be.token_piece, bm->be.is_eog, bm->be.ctx, &bm->vocab);
}

/* The live entry for q's grammar text, or a new one (taking q->grammar). */
static vki_status find_entry(vki_batch_manager *bm, bm_req *q, bm_gram_entry **out)
{
    for (bm_gram_entry **p = &bm->grams; *p; p = &(*p)->next) {
        bm_gram_entry *e = *p;
        if (e->retired || e->len != q->gbnf_len || memcmp(e->gbnf, q->gbnf, q->gbnf_len))
            continue;
        *p = e->next; /* most recently used first */
        e->next = bm->grams;
        bm->grams = e;
        gram_grammar_free(q->grammar); /* the entry's automaton has the same one */
        q->grammar = NULL;
        *out = e;
        return VKI_OK;
    }
    bm_gram_entry *e = calloc(1, sizeof *e);
    if (!e)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    vki_status st = gram_automaton_create(q->grammar, bm->vocab, NULL, &e->a);
    q->grammar = NULL; /* owned by the automaton now, or freed on failure */
    if (st != VKI_OK) {
        free(e);
        return st;
    }
    e->gbnf = q->gbnf; /* the request's text becomes the key */
    e->len = q->gbnf_len;
    q->gbnf = NULL;
    e->next = bm->grams;
    bm->grams = e;
    bm->n_grams++;
    *out = e;
    return VKI_OK;
}

vki_status bm_constraint_attach(vki_batch_manager *bm, bm_req *q, char *msg, size_t cap)
{
    if (!q->grammar)
        return VKI_OK;
    double t0 = now_us();
    vki_status st = bm->vocab ? VKI_OK : build_vocab(bm);
    bm_gram_entry *e = NULL;
    if (st == VKI_OK)
        st = find_entry(bm, q, &e);
    if (st != VKI_OK) {
        snprintf(msg, cap, "constraint: %s while preparing the grammar", vki_status_str(st));
        return st;
    }
    const int32_t *ends = q->n_end_ids ? q->end_ids : q->ignore_eos ? NULL : bm->eog_ids;
    uint32_t n_end = q->n_end_ids ? q->n_end_ids : q->ignore_eos ? 0 : bm->n_eog;
    st = gram_req_init(&q->gr, e->a, ends, n_end, msg, cap);
    if (st != VKI_OK)
        return st;
    e->users++;
    q->gram = e;
    bm->gram_us += now_us() - t0;
    trim_cache(bm);
    return VKI_OK;
}

void bm_constraint_detach(vki_batch_manager *bm, bm_req *q)
{
    if (!q->gram)
        return;
    gram_req_free(&q->gr);
    q->gram->users--;
    q->gram = NULL;
    trim_cache(bm);
}

/* ---- per step --------------------------------------------------------------------------------------- */

void bm_constraint_masks(vki_batch_manager *bm, const sched_tick *t)
{
    double t0 = now_us();
    for (uint32_t i = 0; i < t->plan.n_seqs; i++) {
        bm_req *q = t->seqs[i] ? t->seqs[i]->user : NULL; /* NULL: a lookahead row whose request left */
        if (!t->plan.seqs[i].want_token || !q || !q->gram)
            continue;
        uint32_t n = 0;
        char err[BM_MSG_CAP];
        vki_status st = gram_req_mask(&q->gr, &n, err, sizeof err);
        if (st != VKI_OK) { /* caches full (or out of memory): no token; the step's -1 ends it */
            memset(q->gr.mask, 0, ((size_t)bm->be.vocab_size + 31) / 32 * 4);
            snprintf(q->gram_error, sizeof q->gram_error, "%s", err);
            q->status = st;
            q->gram->retired |= st == VKI_ERR_OUT_OF_HOST_MEMORY;
        }
        q->no_token = n == 0;
        bm->gram_tokens++;
    }
    bm->gram_us += now_us() - t0;
}

vki_finish_reason bm_constraint_advance(vki_batch_manager *bm, bm_req *q, int32_t tok, char *msg, size_t cap)
{
    if (!q->gram)
        return VKI_FINISH_NONE;
    double t0 = now_us();
    bool ended = false;
    vki_status st = gram_req_accept(&q->gr, tok, &ended, msg, cap);
    bm->gram_us += now_us() - t0;
    if (st != VKI_OK) { /* the sampler drew outside the mask: a bug, not the user's */
        q->status = VKI_ERR_INTERNAL;
        return VKI_FINISH_ERROR;
    }
    /* complete, and no end token may follow: nothing more can be sampled */
    if (!ended && gram_req_complete(&q->gr) && !q->gr.n_end)
        return VKI_FINISH_STOP;
    return VKI_FINISH_NONE;
}

/* ---- public helpers ------------------------------------------------------------------------------- */

vki_status vki_constraint_check(const vki_constraint *c, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = 0;
    if (!c || (unsigned)c->type > VKI_CONSTRAINT_JSON_SCHEMA || (c->len && !c->text)) {
        if (err && err_len)
            snprintf(err, err_len, "constraint: unknown type or NULL text");
        return VKI_ERR_INVALID_ARG;
    }
    if (c->type == VKI_CONSTRAINT_NONE)
        return VKI_OK;
    strbuf text = {0};
    vki_status st = c->type == VKI_CONSTRAINT_JSON_SCHEMA ? gram_schema_to_gbnf(c->text, c->len, &text, err, err_len)
                    : strbuf_put(&text, c->text ? c->text : "", c->len) ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    gram_grammar *g = NULL;
    if (st == VKI_OK)
        st = gram_parse(text.p, text.len, &g, err, err_len);
    gram_grammar_free(g);
    strbuf_free(&text);
    return st;
}

vki_status vki_json_schema_to_grammar(const char *schema, size_t len, char *buf, size_t cap, size_t *n_out,
                                      char *err, size_t err_len)
{
    strbuf text = {0};
    if (n_out)
        *n_out = 0;
    vki_status st = gram_schema_to_gbnf(schema, schema ? len : 0, &text, err, err_len);
    if (st == VKI_OK) {
        size_t need = text.len + 1;
        if (n_out)
            *n_out = need;
        if (!buf || cap < need)
            st = VKI_ERR_INVALID_ARG;
        else
            memcpy(buf, text.p, need);
        if (st != VKI_OK && err && err_len)
            snprintf(err, err_len, "buffer too small: %zu bytes needed", need);
    }
    strbuf_free(&text);
    return st;
}
