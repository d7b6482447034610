/* sched-bench: host cost of the scheduler per tick at N active sequences.
 *
 * Drives scheduler/ directly with an inline fake engine (next token = a hash of the previous
 * token and the position: no KV, no GPU), keeping N sequences in flight: whenever one finishes a
 * new one arrives, so the steady state is N running sequences, mostly decoding, with prefill
 * chunks of the arrivals beside them. Prompts share a common prefix, so block reuse is exercised.
 * Prints one table row; the "sched" columns time only the scheduler's calls (plan, commit, add,
 * remove), "total" includes the fake engine and the driver.
 *
 * For instruction counts run it under callgrind, collecting only inside the scheduler's calls:
 *   valgrind --tool=callgrind --collect-atstart=no --toggle-collect=sched_plan \
 *       --toggle-collect=sched_commit --toggle-collect=sched_remove --toggle-collect=sched_add \
 *       ./sched-bench -w 300 -t 300
 * then Ir / (warmup + ticks) is the scheduler's instructions per tick (warm-up ticks are collected
 * too: the driver's initial sched_add calls add about 0.1%). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/rng.h"
#include "scheduler/sched.h"

typedef struct bench_cfg {
    uint32_t n_active, ticks, warmup, block_size, vocab;
    vki_capacity_policy policy;
    bool reuse;
} bench_cfg;

typedef struct bench {
    bench_cfg c;
    sched *s;
    vki_step_out *outs;
    sched_seq **done;       /* [n_active] finished this tick */
    uint64_t rng;
    int32_t prefix[64];
    vki_sampling_params sp;
    uint64_t tokens, seqs;  /* scheduled, summed over measured ticks */
    int32_t prompt[64 + 288]; /* the next request's prompt */
} bench;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The next request: 64 shared prefix tokens + 32..288 own tokens, 32..256 new tokens. Made by
 * the driver outside the measured calls. */
static void make_request(bench *b, int32_t *prompt, sched_add_args *a)
{
    uint32_t own = 32 + (uint32_t)(vki_splitmix64(&b->rng) % 257), max_new = 32 + (uint32_t)(vki_splitmix64(&b->rng) % 225);
    memcpy(prompt, b->prefix, sizeof b->prefix);
    for (uint32_t i = 0; i < own; i++)
        prompt[64 + i] = (int32_t)(vki_splitmix64(&b->rng) % b->c.vocab);
    *a = (sched_add_args){.prompt = prompt, .n_prompt = 64 + own, .max_new = max_new, .sampling = &b->sp,
                          .seed = vki_splitmix64(&b->rng)};
}

/* The fake engine: one token per sampled entry. */
static void fake_step(bench *b, const sched_tick *t)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->plan.n_seqs; i++) {
        const vki_step_seq *e = &t->plan.seqs[i];
        if (!e->want_token)
            continue;
        uint64_t h = (uint64_t)(uint32_t)e->tokens[e->n_new - 1] * 0x9e3779b97f4a7c15ull ^ (e->pos0 + e->n_new);
        b->outs[k++] = (vki_step_out){.slot = e->slot, .token = (int32_t)(vki_splitmix64(&h) % b->c.vocab)};
    }
}

/* Commit, then the finished sequences leave. Returns how many left. */
static uint32_t bench_sched_apply(bench *b, const sched_tick *t)
{
    sched_commit(b->s, t, b->outs);
    uint32_t n_done = 0;
    for (uint32_t i = 0; i < t->plan.n_seqs; i++)
        if (t->plan.seqs[i].want_token && sched_seq_done(t->seqs[i]))
            b->done[n_done++] = t->seqs[i];
    for (uint32_t i = 0; i < n_done; i++)
        sched_remove(b->s, b->done[i]);
    return n_done;
}

static vki_status bench_sched_add(bench *b, const sched_add_args *a)
{
    sched_seq *q;
    return sched_add(b->s, a, &q);
}

/* One tick; adds the scheduler's time to *sched_s. */
static int tick(bench *b, sched_tick *t, double *sched_s)
{
    double a = now_s();
    if (sched_plan(b->s, t) != VKI_OK)
        return -1;
    double mid = now_s();
    fake_step(b, t);
    double c = now_s();
    uint32_t n_done = bench_sched_apply(b, t);
    *sched_s += (mid - a) + (now_s() - c);
    for (uint32_t i = 0; i < n_done; i++) { /* replacements keep n_active in flight */
        sched_add_args args;
        make_request(b, b->prompt, &args);
        double d = now_s();
        vki_status st = bench_sched_add(b, &args);
        *sched_s += now_s() - d;
        if (st != VKI_OK)
            return -1;
    }
    return 0;
}

static int run(bench *b)
{
    sched_tick t;
    double ignored = 0, sched_s = 0;
    for (uint32_t i = 0; i < b->c.warmup; i++)
        if (tick(b, &t, &ignored))
            return -1;
    double t0 = now_s();
    for (uint32_t i = 0; i < b->c.ticks; i++) {
        if (tick(b, &t, &sched_s))
            return -1;
        b->tokens += t.plan.n_tokens;
        b->seqs += t.plan.n_seqs;
    }
    double total = now_s() - t0;
    sched_stats ss;
    sched_get_stats(b->s, &ss);
    static const char *const pol[] = {"no-evict", "max-util", "static"};
    printf("%-9s %5s %7u %6u %9.1f %11.1f %10.0f %11.2f %11.2f %11llu\n", pol[b->c.policy], b->c.reuse ? "on" : "off",
           b->c.n_active, b->c.ticks, (double)b->seqs / b->c.ticks, (double)b->tokens / b->c.ticks,
           b->c.ticks / total, sched_s / b->c.ticks * 1e6, total / b->c.ticks * 1e6,
           (unsigned long long)ss.reused_tokens);
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: sched-bench [-n active=256] [-t ticks=2000] [-w warmup=1000] [-b block=16]\n"
                    "                   [--policy no-evict|max-util|static] [--no-reuse]\n");
    return 2;
}

static int parse(int argc, char **argv, bench_cfg *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-reuse")) {
            c->reuse = false;
            continue;
        }
        if (!v)
            return -1;
        i++;
        if (!strcmp(a, "-n"))
            c->n_active = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "-t"))
            c->ticks = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "-w"))
            c->warmup = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "-b"))
            c->block_size = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--policy"))
            c->policy = !strcmp(v, "max-util") ? VKI_POLICY_MAX_UTILIZATION
                        : !strcmp(v, "static") ? VKI_POLICY_STATIC
                                               : VKI_POLICY_GUARANTEED_NO_EVICT;
        else
            return -1;
    }
    return c->n_active && c->ticks && c->block_size && c->block_size <= 512 ? 0 : -1;
}

int main(int argc, char **argv)
{
    bench b = {.c = {.n_active = 256, .ticks = 2000, .warmup = 1000, .block_size = 16, .vocab = 32000,
                     .policy = VKI_POLICY_GUARANTEED_NO_EVICT, .reuse = true},
               .rng = 42};
    if (parse(argc, argv, &b.c))
        return usage();
    /* KV for every active sequence at its longest (352 + 256 tokens), so the pool never limits */
    uint32_t per_seq = (352 + 256 + b.c.block_size - 1) / b.c.block_size;
    sched_params p = {.policy = b.c.policy, .max_seqs = b.c.n_active, .n_blocks = per_seq * b.c.n_active + 64,
                      .block_size = b.c.block_size, .max_ctx = 4096, .max_batch_size = b.c.n_active,
                      .max_num_tokens = 8192, .chunk_size = b.c.block_size * (512 / b.c.block_size),
                      .block_reuse = b.c.reuse};
    b.sp = vki_sampling_default_params();
    b.outs = calloc(b.c.n_active, sizeof *b.outs);
    b.done = calloc(b.c.n_active, sizeof *b.done);
    if (!b.outs || !b.done || sched_create(&p, &b.s) != VKI_OK) {
        fprintf(stderr, "sched-bench: cannot create the scheduler\n");
        return 1;
    }
    for (uint32_t i = 0; i < 64; i++)
        b.prefix[i] = (int32_t)(vki_splitmix64(&b.rng) % b.c.vocab);
    for (uint32_t i = 0; i < b.c.n_active; i++) {
        sched_add_args a;
        make_request(&b, b.prompt, &a);
        if (bench_sched_add(&b, &a) != VKI_OK)
            return 1;
    }
    printf("sched-bench: block %u tokens, %u blocks, chunk %u, token budget %u\n", p.block_size, p.n_blocks,
           p.chunk_size, p.max_num_tokens);
    printf("%-9s %5s %7s %6s %9s %11s %10s %11s %11s %11s\n", "policy", "reuse", "active", "ticks", "seqs/tick",
           "tokens/tick", "ticks/s", "us/tick sch", "us/tick all", "reused tok");
    int rc = run(&b);
    sched_destroy(b.s);
    free(b.outs);
    free(b.done);
    if (rc)
        fprintf(stderr, "sched-bench: the scheduler failed\n");
    return rc ? 1 : 0;
}
