/* The fake executor (see fake_engine.h). */
#include "support/fake_engine.h"
#include "engine/rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H0 0x243f6a8885a308d3ull /* chain hash before position 0 */

typedef struct fake_entry {
    int32_t token;
    uint32_t pos;
    uint64_t h;     /* chain hash of tokens [0, pos] */
    bool valid;
} fake_entry;

struct fake_engine {
    fake_config c;
    fake_entry *kv;         /* [n_pages][page_size] */
    uint64_t *slot_stamp;   /* [max_seqs] step number that last used the slot */
    uint64_t *write_stamp;  /* [n_pages] step number that writes the page */
    uint32_t *writer;       /* [n_pages] plan index of that writer */
    uint64_t *seq_stamp;    /* [n_pages] stamp of the last entry that listed the page */
    uint64_t stamp;         /* one per checked entry */
    uint64_t steps;
    uint32_t violations;
    char first[256];
    uint32_t max_seqs_seen, max_tokens_seen;
    uint32_t kv_copies;
    float *row;             /* [vocab] the logits row handed to a logits sink */
    /* overlap: what the last submitted step sampled per slot, and the steps in flight */
    int32_t *last_tok;      /* [max_seqs] */
    uint64_t *last_step;    /* [max_seqs] step number that sampled it (0: none) */
    bool last_failed;       /* the last submitted step failed */
    vki_step_out *fl_outs[2]; /* [max_seqs] each: outs of the steps in flight, oldest at fl_head */
    vki_status fl_st[2];
    uint32_t fl_n, fl_head;
    /* a step submitted with its masks later: its rows' own tokens (before any constraint) until
     * fake_masks draws them under the masks (and bans) */
    bool masks_due;
    uint32_t due_fl;          /* its flight */
    uint32_t due_seqs;        /* its plan's entries */
    int32_t *raw_tok;         /* [max_seqs] */
    float *raw_lp;            /* [max_seqs] */
    bool *had_mask;           /* [max_seqs] per plan entry */
    uint64_t late_masks;      /* fake_masks calls that drew tokens */
    vki_step_seq *resolved; /* [max_seqs] a plan's entries with PREV tokens replaced */
    int32_t *prev_tok;      /* [max_seqs] the replacing tokens */
    bool *is_prev;          /* [max_seqs] plan entry i gave VKI_TOKEN_PREV */
    uint64_t prev_rows;
};

static uint64_t chain(uint64_t h, int32_t token, uint32_t pos)
{
    return vki_mix64(h ^ ((uint64_t)(uint32_t)token << 20) ^ ((uint64_t)pos << 52) ^ pos);
}

static int32_t next_token(const fake_engine *f, uint64_t h, bool sampled, uint64_t seed, float *lp)
{
    uint64_t r = vki_mix64(h ^ (sampled ? vki_mix64(seed ^ 0x5851f42d4c957f2dull) : 0));
    if (lp)
        *lp = -0.01f - (float)((r >> 40) % 1000) / 100.0f;
    return (int32_t)(r % f->c.vocab);
}

static bool is_sampled(const vki_step_seq *e) { return e->sampling && e->sampling->temperature > 0; }

/* Whether the row may draw t: its token mask (a grammar's) has the bit and no -inf logit bias
 * bans it, the two things that make the real sampler skip a token. */
static bool allowed(const vki_step_seq *e, int32_t t)
{
    if (e->token_mask && !(e->token_mask[t >> 5] >> (t & 31) & 1))
        return false;
    for (uint32_t i = 0; e->sampling && i < e->sampling->n_logit_bias; i++)
        if (e->sampling->logit_bias[i].token == t && e->sampling->logit_bias[i].bias == -INFINITY)
            return false;
    return true;
}

/* The fake's choice under the row's constraints: its own token if allowed, else the next allowed
 * id (cyclically), else -1 (nothing allowed). Unconstrained rows are unchanged. */
static int32_t constrain(const fake_engine *f, const vki_step_seq *e, int32_t t)
{
    for (uint32_t k = 0; k < f->c.vocab; k++) {
        int32_t c = (int32_t)(((uint32_t)t + k) % f->c.vocab);
        if (allowed(e, c))
            return c;
    }
    return -1;
}

/* The fake vocabulary's bytes: token i is fake_words[i % n] (ids share texts), JSON punctuation,
 * letters and digits, so grammars of JSON-like text can be followed by it. */
static const char *const fake_words[] = {"<eos>", "{", "}", "[", "]", ":", ",", "\"", " ", "a", "b", "c", "1", "2",
                                         "true", "null", "\"a\"", "{\"", "\":", "\",", "x", "yz", "\n", "-"};

vki_status fake_token_piece(void *ctx, int32_t token, char *buf, size_t cap, size_t *n_out)
{
    const fake_engine *f = ctx;
    if (token < 0 || (uint32_t)token >= f->c.vocab)
        return VKI_ERR_INVALID_ARG;
    const char *w = fake_words[(uint32_t)token % (sizeof fake_words / sizeof *fake_words)];
    *n_out = strlen(w);
    if (*n_out > cap)
        return VKI_ERR_INVALID_ARG;
    memcpy(buf, w, *n_out);
    return VKI_OK;
}

static void violation(fake_engine *f, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (!f->violations)
        snprintf(f->first, sizeof f->first, "%s", buf);
    f->violations++;
    fprintf(stderr, "FAKE ENGINE VIOLATION (step %llu): %s\n", (unsigned long long)f->steps, buf);
}

vki_status fake_create(const fake_config *c, fake_engine **out)
{
    *out = NULL;
    if (!c->max_seqs || !c->n_pages || !c->page_size || !c->max_ctx || !c->vocab || c->window == 1)
        return VKI_ERR_INVALID_ARG;
    fake_engine *f = calloc(1, sizeof *f);
    if (!f)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    f->c = *c;
    if (!f->c.max_batch)
        f->c.max_batch = c->max_seqs;
    f->kv = calloc((size_t)c->n_pages * c->page_size, sizeof *f->kv);
    f->slot_stamp = calloc(c->max_seqs, sizeof *f->slot_stamp);
    f->write_stamp = calloc(c->n_pages, sizeof *f->write_stamp);
    f->writer = calloc(c->n_pages, sizeof *f->writer);
    f->seq_stamp = calloc(c->n_pages, sizeof *f->seq_stamp);
    f->row = calloc(c->vocab, sizeof *f->row);
    f->last_tok = calloc(c->max_seqs, sizeof *f->last_tok);
    f->last_step = calloc(c->max_seqs, sizeof *f->last_step);
    f->resolved = calloc(c->max_seqs, sizeof *f->resolved);
    f->prev_tok = calloc(c->max_seqs, sizeof *f->prev_tok);
    f->is_prev = calloc(c->max_seqs, sizeof *f->is_prev);
    for (int i = 0; i < 2; i++)
        f->fl_outs[i] = calloc(c->max_seqs, sizeof *f->fl_outs[i]);
    f->raw_tok = calloc(c->max_seqs, sizeof *f->raw_tok);
    f->raw_lp = calloc(c->max_seqs, sizeof *f->raw_lp);
    f->had_mask = calloc(c->max_seqs, sizeof *f->had_mask);
    const char *env = getenv("VKI_FAKE_OVERLAP");
    f->c.overlap |= env && env[0] == '1';
    if (!f->kv || !f->slot_stamp || !f->write_stamp || !f->writer || !f->seq_stamp || !f->row || !f->last_tok ||
        !f->last_step || !f->resolved || !f->prev_tok || !f->is_prev || !f->fl_outs[0] || !f->fl_outs[1] ||
        !f->raw_tok || !f->raw_lp || !f->had_mask) {
        fake_destroy(f);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    *out = f;
    return VKI_OK;
}

void fake_destroy(fake_engine *f)
{
    if (!f)
        return;
    free(f->kv);
    free(f->slot_stamp);
    free(f->write_stamp);
    free(f->writer);
    free(f->seq_stamp);
    free(f->row);
    free(f->last_tok);
    free(f->last_step);
    free(f->resolved);
    free(f->prev_tok);
    free(f->is_prev);
    free(f->fl_outs[0]);
    free(f->fl_outs[1]);
    free(f->raw_tok);
    free(f->raw_lp);
    free(f->had_mask);
    free(f);
}

bm_backend fake_backend(fake_engine *f)
{
    return (bm_backend){.ctx = f, .max_seqs = f->c.max_seqs, .n_pages = f->c.n_pages, .page_size = f->c.page_size,
                        .max_ctx = f->c.max_ctx, .max_tokens = f->c.max_tokens, .vocab_size = f->c.vocab,
                        .kv_window = f->c.window, .kv_sink = f->c.sink, .step = fake_step, .is_eog = fake_is_eog,
                        .token_piece = fake_token_piece,
                        .fingerprint = f->c.fingerprint ? f->c.fingerprint : 0xfa4efa4efa4efa4eull,
                        .model_name = "fake", .kv_layers = 1, .kv_heads = 1, .kv_head_dim = 4,
                        .kv_type = 0 /* f32 */, .kv_row_bytes = 16, .kv_flags = f->c.kv_flags, .kv_read = fake_kv_read,
                        .kv_write = fake_kv_write, .submit = f->c.overlap ? fake_submit : NULL,
                        .wait = f->c.overlap ? fake_wait : NULL, .masks = f->c.overlap ? fake_masks : NULL};
}

static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Page i's entries <-> rows [i * page_size, ...) of buf: K = token, position, hash; V = valid,
 * 0, the hash's complement (a write whose K and V disagree is a violation). */
static vki_status kv_copy(fake_engine *f, const uint32_t *pages, uint32_t n, uint8_t *o, bool read)
{
    f->kv_copies++;
    for (uint32_t i = 0; i < n; i++) {
        if (pages[i] >= f->c.n_pages) {
            violation(f, "kv copy: page %u out of range", pages[i]);
            return VKI_ERR_INVALID_ARG;
        }
        for (uint32_t s = 0; s < f->c.page_size; s++, o += 32) {
            fake_entry *x = &f->kv[(size_t)pages[i] * f->c.page_size + s];
            uint32_t tp[2] = {(uint32_t)x->token, x->pos}, v[2] = {x->valid, 0};
            if (read) {
                memcpy(o, tp, 8);
                put_u64(o + 8, x->h);
                memcpy(o + 16, v, 8);
                put_u64(o + 24, ~x->h);
                continue;
            }
            memcpy(tp, o, 8);
            memcpy(v, o + 16, 8);
            if (get_u64(o + 24) != ~get_u64(o + 8)) {
                violation(f, "kv_write: page %u slot %u: K and V rows disagree", pages[i], s);
                return VKI_ERR_INTERNAL;
            }
            *x = (fake_entry){.token = (int32_t)tp[0], .pos = tp[1], .h = get_u64(o + 8), .valid = v[0] != 0};
        }
    }
    return VKI_OK;
}

vki_status fake_kv_read(void *ctx, const uint32_t *pages, uint32_t n, void *dst)
{
    return kv_copy(ctx, pages, n, dst, true);
}

vki_status fake_kv_write(void *ctx, const uint32_t *pages, uint32_t n, const void *src)
{
    return kv_copy(ctx, pages, n, (uint8_t *)(uintptr_t)src, false);
}

uint32_t fake_kv_copies(const fake_engine *f) { return f->kv_copies; }

bool fake_is_eog(void *ctx, int32_t token)
{
    const fake_engine *f = ctx;
    return f->c.eos >= 0 && token == f->c.eos;
}

static fake_entry *entry(fake_engine *f, const vki_step_seq *e, uint32_t pos)
{
    return &f->kv[(size_t)e->pages[pos / f->c.page_size] * f->c.page_size + pos % f->c.page_size];
}

/* Whether the query at position q sees key position pos (the window and the sink). */
static bool sees(const fake_engine *f, uint32_t pos, uint32_t q)
{
    return pos <= q && (!f->c.window || q - pos < f->c.window || pos < f->c.sink);
}

/* Whether table entry j of e may be released: no position of page j is seen by its first new
 * token (later ones see less). */
static bool page_unseen(const fake_engine *f, const vki_step_seq *e, uint32_t j)
{
    uint64_t ps = f->c.page_size;
    return f->c.window && (j + 1) * ps + f->c.window <= (uint64_t)e->pos0 + 1 && j * ps >= f->c.sink;
}

/* Shape checks of one plan entry that need no KV. */
static void check_entry(fake_engine *f, const vki_step_seq *e, uint32_t i)
{
    uint32_t ps = f->c.page_size;
    uint64_t end = (uint64_t)e->pos0 + e->n_new;
    if (e->slot >= f->c.max_seqs) {
        violation(f, "entry %u: slot %u >= max_seqs %u", i, e->slot, f->c.max_seqs);
        return;
    }
    if (f->slot_stamp[e->slot] == f->steps)
        violation(f, "slot %u appears twice in one plan", e->slot);
    f->slot_stamp[e->slot] = f->steps;
    if (e->n_new == 0 || !e->tokens)
        violation(f, "slot %u: n_new %u, tokens %p", e->slot, e->n_new, (const void *)e->tokens);
    if (end > f->c.max_ctx)
        violation(f, "slot %u: pos0 %u + n_new %u beyond max_ctx %u", e->slot, e->pos0, e->n_new, f->c.max_ctx);
    if ((uint64_t)e->n_pages * ps < end || !e->pages)
        violation(f, "slot %u: %u pages do not cover positions [0, %llu)", e->slot, e->n_pages, (unsigned long long)end);
    /* a VKI_TOKEN_PREV entry may read a -1 (its previous step could sample nothing): the engine's
     * embedding gives it a zero row, and the batch manager drops the row (its request ended) */
    bool prev_none = i < f->c.max_seqs && f->is_prev[i] && e->tokens && e->tokens[0] == -1;
    for (uint32_t j = prev_none; j < e->n_new && e->tokens; j++)
        if (e->tokens[j] < 0 || (uint32_t)e->tokens[j] >= f->c.vocab)
            violation(f, "slot %u: token %d at position %u outside the vocabulary", e->slot, e->tokens[j], e->pos0 + j);
    if (!e->pages)
        return;
    f->stamp++; /* fresh stamp for this entry's repeated-page check */
    for (uint32_t j = 0; j < e->n_pages; j++) {
        uint32_t p = e->pages[j];
        if (p == VKI_PAGE_NONE && page_unseen(f, e, j))
            continue;
        if (p >= f->c.n_pages) {
            violation(f, "slot %u: page %u out of range%s", e->slot, p,
                      p == VKI_PAGE_NONE ? " (released while its window still sees it)" : "");
            continue;
        }
        if (f->seq_stamp[p] == f->stamp)
            violation(f, "slot %u: page %u appears twice in its table", e->slot, p);
        f->seq_stamp[p] = f->stamp;
    }
    uint32_t window = e->sampling ? e->sampling->penalty_window : 0;
    uint64_t want_hist = e->want_token && window ? (window < end ? window : end) : 0;
    if (i < f->c.max_seqs && f->is_prev[i]) /* the tokens before pos0: the engine adds the one in flight */
        want_hist = e->want_token && window ? (window - 1 < e->pos0 ? window - 1 : e->pos0) : 0;
    if (e->n_history != want_hist || (want_hist && !e->history))
        violation(f, "slot %u: penalty history of %u tokens, expected %llu%s", e->slot, e->n_history,
                  (unsigned long long)want_hist, i < f->c.max_seqs && f->is_prev[i] ? " (VKI_TOKEN_PREV)" : "");
}

/* No page is written by one entry and read or written by another in the same step: pages
 * shared between live sequences must be full, immutable prefix blocks. */
static void check_sharing(fake_engine *f, const vki_step_plan *plan)
{
    uint64_t step_stamp = f->steps;
    uint32_t ps = f->c.page_size;
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *e = &plan->seqs[i];
        for (uint32_t j = e->pos0 / ps; j <= (e->pos0 + e->n_new - 1) / ps && j < e->n_pages; j++) {
            uint32_t p = e->pages[j];
            if (p >= f->c.n_pages)
                continue;
            if (f->write_stamp[p] == step_stamp)
                violation(f, "page %u written by slots of entries %u and %u in one step", p, f->writer[p], i);
            f->write_stamp[p] = step_stamp;
            f->writer[p] = i;
        }
    }
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *e = &plan->seqs[i];
        uint32_t used = (e->pos0 + e->n_new + ps - 1) / ps;
        for (uint32_t j = 0; j < used && j < e->n_pages; j++) {
            uint32_t p = e->pages[j];
            if (p < f->c.n_pages && f->write_stamp[p] == step_stamp && f->writer[p] != i)
                violation(f, "slot %u reads page %u that slot %u writes in the same step", e->slot, p,
                          plan->seqs[f->writer[p]].slot);
        }
    }
}

/* Attention over the history: verifies the chain of every position before pos0 and the penalty
 * history, then extends the chain over the new tokens. Returns the last position's hash. */
static bool run_entry(fake_engine *f, const vki_step_seq *e, bool prev, uint64_t *h_out)
{
    uint64_t h = H0;
    for (uint32_t pos = 0; pos < e->pos0; pos++) {
        if (!sees(f, pos, e->pos0))
            continue; /* outside the window: its page may be gone */
        const fake_entry *x = entry(f, e, pos);
        /* after a gap (the window left the sink behind) the chain cannot be linked: the entry's
         * position is checked, and the tokens it leads to must still equal fake_reference's */
        bool gap = pos && !sees(f, pos - 1, e->pos0);
        if (!x->valid || x->pos != pos || (!gap && x->h != chain(h, x->token, pos))) {
            violation(f, "slot %u: KV at position %u (page %u) is not this sequence's (valid %d, pos %u)", e->slot, pos,
                      e->pages[pos / f->c.page_size], x->valid, x->pos);
            return false;
        }
        h = x->h;
    }
    uint32_t end = prev ? e->pos0 : e->pos0 + e->n_new; /* a PREV entry's history ends before it */
    for (uint32_t j = 0; j < e->n_history; j++) {
        uint32_t pos = end - e->n_history + j;
        if (pos < e->pos0 && e->pages[pos / f->c.page_size] == VKI_PAGE_NONE)
            continue; /* released: the fake can no longer read it (the real engine never does) */
        int32_t t = pos < e->pos0 ? entry(f, e, pos)->token : e->tokens[pos - e->pos0];
        if (e->history[j] != t) {
            violation(f, "slot %u: penalty history[%u] = %d, the token at position %u is %d", e->slot, j,
                      e->history[j], pos, t);
            return false;
        }
    }
    for (uint32_t j = 0; j < e->n_new; j++) {
        h = chain(h, e->tokens[j], e->pos0 + j);
        *entry(f, e, e->pos0 + j) = (fake_entry){.token = e->tokens[j], .pos = e->pos0 + j, .h = h, .valid = true};
    }
    *h_out = h;
    return true;
}

/* A failed step leaves the KV of its sequences undefined: make it wrong on purpose. */
static void scribble(fake_engine *f, const vki_step_plan *plan)
{
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *e = &plan->seqs[i];
        for (uint32_t j = 0; j < e->n_new; j++)
            *entry(f, e, e->pos0 + j) = (fake_entry){.token = 0, .pos = e->pos0 + j, .h = vki_mix64(f->steps + j), .valid = true};
    }
}

/* The sampled row a logits sink receives: the token's and its alternatives' logprobs at their
 * ids, -100 elsewhere (so row[token] == logprob: a row can be told apart from another's). */
static void sink_row(fake_engine *f, const vki_step_seq *e, const vki_step_out *o)
{
    for (uint32_t v = 0; v < f->c.vocab; v++)
        f->row[v] = -100.0f;
    for (uint32_t j = o->n_top; j-- > 0;)
        f->row[o->top_tokens[j]] = o->top_logprobs[j];
    if (o->token >= 0)
        f->row[o->token] = o->logprob;
    e->logits_sink(e->logits_sink_ctx, f->row, 1, f->c.vocab, e->pos0 + e->n_new - 1, true);
}

/* VKI_TOKEN_PREV entries replaced by the token the previous step sampled for their slot (into
 * f->resolved). False when the plan has such an entry and that step failed (a violation when it
 * did not sample the slot). */
static bool resolve_prev(fake_engine *f, vki_step_plan *plan)
{
    bool any = false, ok = true;
    for (uint32_t i = 0; i < plan->n_seqs && i < f->c.max_seqs; i++) {
        const vki_step_seq *e = &plan->seqs[i];
        f->resolved[i] = *e;
        f->is_prev[i] = e->tokens && e->tokens[0] == VKI_TOKEN_PREV;
        if (!f->is_prev[i])
            continue;
        any = true;
        f->prev_rows++;
        if (f->last_failed && e->n_new == 1) { /* the token it would read is a failed step's */
            ok = false;
            continue;
        }
        if (e->n_new != 1 || e->slot >= f->c.max_seqs || f->last_step[e->slot] != f->steps - 1) {
            violation(f, "slot %u: VKI_TOKEN_PREV, but the previous step did not sample it%s", e->slot,
                      e->n_new != 1 ? " (or the entry has more than one token)" : "");
            continue;
        }
        f->prev_tok[i] = f->last_tok[e->slot];
        f->resolved[i].tokens = &f->prev_tok[i];
    }
    if (any && plan->n_seqs <= f->c.max_seqs)
        plan->seqs = f->resolved;
    return ok;
}

/* Row e's token under its constraints from its own token t (logprob lp), into o, remembered for
 * VKI_TOKEN_PREV of the next step. */
static void draw(fake_engine *f, const vki_step_seq *e, int32_t t, float lp, vki_step_out *o)
{
    *o = (vki_step_out){.slot = e->slot, .logprob = lp};
    o->token = constrain(f, e, t);
    uint32_t n_top = o->token < 0 ? 0 : e->sampling ? e->sampling->top_logprobs : 0;
    o->n_top = n_top < VKI_MAX_TOP_LOGPROBS ? n_top : VKI_MAX_TOP_LOGPROBS;
    for (uint32_t j = 0; j < o->n_top; j++) {
        o->top_tokens[j] = (int32_t)(((uint32_t)o->token + 1 + j) % f->c.vocab);
        o->top_logprobs[j] = o->logprob - 1.0f - (float)j;
    }
    if (e->logits_sink && e->sink_sampled)
        sink_row(f, e, o);
    f->last_tok[e->slot] = o->token;
}

/* One step, run now; the sampled tokens are remembered for VKI_TOKEN_PREV of the next step.
 * masks_later: rows with a token mask keep their own token (raw_tok) for fake_masks. */
static vki_status run_plan(fake_engine *f, const vki_step_plan *plan0, vki_step_out *outs, bool masks_later)
{
    vki_step_plan resolved = *plan0, *plan = &resolved;
    f->steps++;
    if (!resolve_prev(f, plan)) { /* its input tokens are a failed step's: it fails as well */
        f->last_failed = true;
        scribble(f, plan);
        return VKI_ERR_INTERNAL;
    }
    f->last_failed = true; /* until it completes */
    uint32_t before = f->violations;
    if (plan->n_seqs > f->c.max_batch)
        violation(f, "plan has %u sequences, max %u", plan->n_seqs, f->c.max_batch);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < plan->n_seqs; i++)
        sum += plan->seqs[i].n_new;
    if (sum != plan->n_tokens || (f->c.max_tokens && sum > f->c.max_tokens) || plan->n_seqs == 0)
        violation(f, "plan has %u sequences, %llu tokens, n_tokens %u, budget %u", plan->n_seqs,
                  (unsigned long long)sum, plan->n_tokens, f->c.max_tokens);
    for (uint32_t i = 0; i < plan->n_seqs; i++)
        check_entry(f, &plan->seqs[i], i);
    if (f->violations == before)
        check_sharing(f, plan);
    if (f->violations != before)
        return VKI_ERR_INTERNAL;
    if (plan->n_seqs > f->max_seqs_seen)
        f->max_seqs_seen = plan->n_seqs;
    if (plan->n_tokens > f->max_tokens_seen)
        f->max_tokens_seen = plan->n_tokens;
    if (f->c.on_step)
        f->c.on_step(f->c.on_step_user, plan);
    for (uint32_t i = 0; i < plan->n_copies; i++) { /* beam search's copy-on-write pages, first */
        const vki_page_copy *c = &plan->copies[i];
        if (c->src >= f->c.n_pages || c->dst >= f->c.n_pages || c->src == c->dst) {
            violation(f, "page copy %u: %u -> %u outside the pool or onto itself", i, c->src, c->dst);
            return VKI_ERR_INTERNAL;
        }
        memcpy(f->kv + (size_t)c->dst * f->c.page_size, f->kv + (size_t)c->src * f->c.page_size,
               f->c.page_size * sizeof *f->kv);
    }
    if (f->c.fail_every && f->steps % f->c.fail_every == 0) {
        scribble(f, plan);
        return f->c.fail_status ? f->c.fail_status : VKI_ERR_DEVICE_LOST;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *e = &plan->seqs[i];
        uint64_t h;
        if (!run_entry(f, e, i < f->c.max_seqs && f->is_prev[i], &h))
            return VKI_ERR_INTERNAL;
        if (!e->want_token)
            continue;
        float lp;
        int32_t t = next_token(f, h, is_sampled(e), e->seed, &lp);
        if (masks_later && e->token_mask) {
            f->raw_tok[k] = t, f->raw_lp[k] = lp;
            outs[k++] = (vki_step_out){.slot = e->slot, .token = -2}; /* fake_masks draws it */
        } else {
            draw(f, e, t, lp, &outs[k++]);
        }
        f->last_step[e->slot] = f->steps;
    }
    f->last_failed = false;
    return VKI_OK;
}

vki_status fake_step(void *ctx, const vki_step_plan *plan, vki_step_out *outs)
{
    fake_engine *f = ctx;
    if (f->fl_n)
        violation(f, "a step run while %u submitted steps are not waited for", f->fl_n);
    return run_plan(f, plan, outs, false);
}

vki_status fake_submit(void *ctx, const vki_step_plan *plan, bool masks_later)
{
    fake_engine *f = ctx;
    if (f->fl_n == 2 || f->masks_due) {
        violation(f, f->masks_due ? "a step submitted before the masks of the one before"
                                  : "a third step submitted while two are in flight");
        return VKI_ERR_INVALID_ARG;
    }
    uint32_t i = (f->fl_head + f->fl_n) % 2;
    vki_status st = run_plan(f, plan, f->fl_outs[i], masks_later);
    if (st == VKI_ERR_INTERNAL && f->violations) /* refused at the door, as the engine's checks do */
        return st;
    f->fl_st[i] = st;
    f->fl_n++;
    f->due_seqs = plan->n_seqs;
    for (uint32_t k = 0; masks_later && k < plan->n_seqs && k < f->c.max_seqs; k++)
        if ((f->had_mask[k] = plan->seqs[k].want_token && plan->seqs[k].token_mask))
            f->masks_due = true;
    f->due_fl = i;
    return VKI_OK;
}

vki_status fake_masks(void *ctx, const vki_step_plan *plan)
{
    fake_engine *f = ctx;
    if (!f->masks_due) {
        violation(f, "masks given for a step that waits for none");
        return VKI_ERR_INVALID_ARG;
    }
    f->masks_due = false;
    if (f->fl_st[f->due_fl] != VKI_OK) /* a failed step samples nothing */
        return VKI_OK;
    if (plan->n_seqs != f->due_seqs) {
        violation(f, "masks given for %u entries, the step has %u", plan->n_seqs, f->due_seqs);
        return VKI_ERR_INVALID_ARG;
    }
    for (uint32_t i = 0, k = 0; i < plan->n_seqs; i++) {
        const vki_step_seq *e = &plan->seqs[i];
        if ((e->want_token && e->token_mask) != f->had_mask[i]) {
            violation(f, "entry %u: a token mask %s since its submit", i, f->had_mask[i] ? "gone" : "appeared");
            return VKI_ERR_INVALID_ARG;
        }
        if (f->had_mask[i])
            draw(f, e, f->raw_tok[k], f->raw_lp[k], &f->fl_outs[f->due_fl][k]);
        k += e->want_token;
    }
    f->late_masks++;
    return VKI_OK;
}

uint64_t fake_late_masks(const fake_engine *f) { return f->late_masks; }

vki_status fake_wait(void *ctx, vki_step_out *outs)
{
    fake_engine *f = ctx;
    if (!f->fl_n) {
        violation(f, "a wait with no step in flight");
        return VKI_ERR_INVALID_ARG;
    }
    uint32_t i = f->fl_head;
    if (f->masks_due && f->due_fl == i)
        violation(f, "a step waited for before its masks were given");
    f->fl_head = (f->fl_head + 1) % 2;
    f->fl_n--;
    memcpy(outs, f->fl_outs[i], f->c.max_seqs * sizeof *outs);
    return f->fl_st[i];
}

uint64_t fake_prev_rows(const fake_engine *f) { return f->prev_rows; }

uint32_t fake_violations(const fake_engine *f, char *msg, size_t cap)
{
    if (msg && cap)
        snprintf(msg, cap, "%s", f->violations ? f->first : "none");
    return f->violations;
}

uint64_t fake_steps(const fake_engine *f) { return f->steps; }
uint32_t fake_max_seqs_seen(const fake_engine *f) { return f->max_seqs_seen; }
uint32_t fake_max_tokens_seen(const fake_engine *f) { return f->max_tokens_seen; }

void fake_reference(const fake_engine *f, const int32_t *prompt, uint32_t n_prompt, uint32_t max_new,
                    bool sampled, uint64_t seed, int32_t *out, float *lp)
{
    uint64_t h = H0;
    for (uint32_t i = 0; i < n_prompt; i++)
        h = chain(h, prompt[i], i);
    for (uint32_t k = 0; k < max_new; k++) {
        out[k] = next_token(f, h, sampled, seed, lp ? &lp[k] : NULL);
        h = chain(h, out[k], n_prompt + k);
    }
}
