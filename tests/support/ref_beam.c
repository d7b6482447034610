#include "support/ref_beam.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct rb_hyp {
    int32_t t[REF_BEAM_MAX_NEW];
    double lp[REF_BEAM_MAX_NEW];
    uint32_t n;
    double cum, score;
} rb_hyp;

typedef struct rb_cand {
    double s, lp;
    uint32_t beam;
    int32_t tok;
} rb_cand;

static bool is_end(const ref_beam_params *p, int32_t tok)
{
    for (uint32_t i = 0; i < p->n_end_ids; i++)
        if (p->end_ids[i] == tok)
            return true;
    return false;
}

static double penalised(double cum, uint32_t len, float lp) { return lp == 0.0f ? cum : cum / pow(len, lp); }

static int cand_cmp(const void *pa, const void *pb)
{
    const rb_cand *a = pa, *b = pb;
    if (a->s != b->s)
        return a->s > b->s ? -1 : 1;
    if (a->beam != b->beam)
        return a->beam < b->beam ? -1 : 1;
    return (a->tok > b->tok) - (a->tok < b->tok);
}

static int hyp_cmp(const void *pa, const void *pb)
{
    const rb_hyp *a = pa, *b = pb;
    return (a->score < b->score) - (a->score > b->score);
}

static rb_hyp extend(const rb_hyp *h, const rb_cand *c)
{
    rb_hyp e = *h;
    e.lp[e.n] = c->lp;
    e.t[e.n++] = c->tok;
    e.cum = c->s;
    return e;
}

double ref_logsumexp(const float *row, uint32_t n)
{
    double mx = row[0], sum = 0;
    for (uint32_t v = 1; v < n; v++)
        mx = row[v] > mx ? row[v] : mx;
    for (uint32_t v = 0; v < n; v++)
        sum += exp((double)row[v] - mx);
    return mx + log(sum);
}

/* Every (beam, token) of the live beams, scored by cum + log-softmax (double), best first. */
static vki_status score_all(ref_model *m, const int32_t *prompt, uint32_t n_prompt, const rb_hyp *live,
                            uint32_t n_live, int32_t *seq, float *logits, rb_cand *c, uint32_t *n_c)
{
    uint32_t V = ref_model_hparams(m)->n_vocab, n = 0;
    for (uint32_t b = 0; b < n_live; b++) {
        memcpy(seq, prompt, n_prompt * sizeof *seq);
        memcpy(seq + n_prompt, live[b].t, live[b].n * sizeof *seq);
        vki_status st = ref_model_forward(m, seq, n_prompt + live[b].n, false, logits);
        if (st != VKI_OK)
            return st;
        double lse = ref_logsumexp(logits, V);
        for (uint32_t v = 0; v < V; v++)
            c[n++] = (rb_cand){live[b].cum + ((double)logits[v] - lse), (double)logits[v] - lse, b, (int32_t)v};
    }
    qsort(c, n, sizeof *c, cand_cmp);
    *n_c = n;
    return VKI_OK;
}

vki_status ref_beam_search(ref_model *m, const int32_t *prompt, uint32_t n_prompt, const ref_beam_params *p,
                           ref_beam_result *out)
{
    uint32_t W = p->width, V = ref_model_hparams(m)->n_vocab;
    if (W < 1 || W > REF_BEAM_MAX || p->max_new < 1 || p->max_new > REF_BEAM_MAX_NEW)
        return VKI_ERR_INVALID_ARG;
    rb_hyp live[REF_BEAM_MAX] = {{{0}, {0}, 0, 0, 0}}, next[REF_BEAM_MAX], fin[REF_BEAM_MAX], all[2 * REF_BEAM_MAX];
    uint32_t n_live = 1, n_fin = 0; /* after the prompt every beam is the same: one */
    float *logits = malloc(V * sizeof *logits);
    int32_t *seq = malloc((n_prompt + p->max_new) * sizeof *seq);
    rb_cand *c = malloc((size_t)W * V * sizeof *c);
    vki_status st = logits && seq && c ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    bool stopped = false;
    out->margin = INFINITY;
    for (uint32_t step = 0; st == VKI_OK && step < p->max_new; step++) {
        uint32_t n_c = 0, n_next = 0;
        if ((st = score_all(m, prompt, n_prompt, live, n_live, seq, logits, c, &n_c)) != VKI_OK)
            break;
        for (uint32_t i = 0; i < n_c && i < 2 * W && n_next < W; i++) {
            if (!is_end(p, c[i].tok)) {
                next[n_next++] = extend(&live[c[i].beam], &c[i]);
                for (uint32_t k = i + 1; n_next == W && k < n_c; k++) /* the cut: the next one that lost */
                    if (!is_end(p, c[k].tok)) {
                        out->margin = fmin(out->margin, c[i].s - c[k].s);
                        break;
                    }
                continue;
            }
            if (i >= W)
                continue;
            rb_hyp h = extend(&live[c[i].beam], &c[i]);
            h.score = penalised(h.cum, h.n, p->length_penalty);
            uint32_t slot = n_fin;
            if (n_fin < W) {
                n_fin++;
            } else { /* full: the worst goes, unless h is worse */
                slot = 0;
                for (uint32_t j = 1; j < W; j++)
                    slot = fin[j].score < fin[slot].score ? j : slot;
                if (h.score < fin[slot].score) {
                    if (p->early_stopping == VKI_EARLY_STOP_ON)
                        break;
                    continue;
                }
            }
            fin[slot] = h;
        }
        if (n_fin == W) {
            double worst = fin[0].score;
            for (uint32_t j = 1; j < W; j++)
                worst = fin[j].score < worst ? fin[j].score : worst;
            uint32_t len = p->early_stopping == VKI_EARLY_STOP_NEVER && p->length_penalty > 0 ? p->max_new : step + 1;
            if (p->early_stopping == VKI_EARLY_STOP_ON || worst >= penalised(c[0].s, len, p->length_penalty)) {
                stopped = true;
                break;
            }
        }
        memcpy(live, next, n_next * sizeof *next);
        n_live = n_next;
        if (n_next < W)
            break;
    }
    uint32_t n = 0;
    for (uint32_t j = 0; j < n_fin; j++)
        all[n++] = fin[j];
    for (uint32_t j = 0; !stopped && j < n_live && live[j].n; j++) {
        all[n] = live[j];
        all[n++].score = penalised(live[j].cum, live[j].n, p->length_penalty);
    }
    qsort(all, n, sizeof *all, hyp_cmp);
    out->n = n < W ? n : W;
    for (uint32_t j = 0; j < out->n; j++) {
        memcpy(out->tokens[j], all[j].t, all[j].n * sizeof *all[j].t);
        memcpy(out->lp[j], all[j].lp, all[j].n * sizeof *all[j].lp);
        out->len[j] = all[j].n;
        out->cum[j] = all[j].cum;
        out->score[j] = all[j].score;
    }
    free(logits);
    free(seq);
    free(c);
    return st;
}

vki_status ref_beam_rows(ref_model *m, const int32_t *prompt, uint32_t n_prompt, const int32_t *tokens, uint32_t n,
                         float *rows)
{
    uint32_t V = ref_model_hparams(m)->n_vocab;
    int32_t *seq = malloc((size_t)(n_prompt + n) * sizeof *seq);
    if (!seq)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    memcpy(seq, prompt, n_prompt * sizeof *seq);
    memcpy(seq + n_prompt, tokens, n * sizeof *seq);
    vki_status st = VKI_OK;
    for (uint32_t k = 0; k < n && st == VKI_OK; k++)
        st = ref_model_forward(m, seq, n_prompt + k, false, rows + (size_t)k * V);
    free(seq);
    return st;
}
