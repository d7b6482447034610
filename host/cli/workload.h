/* A workload through the batch manager, for `vkinfer demo` and `vkinfer bench`: N requests with
 * prompt / output lengths drawn from ranges (random token prompts, or text prompts cycled),
 * arriving all at once or as a Poisson process; per-request arrival, first-token and finish
 * times; throughput and latency percentiles (the vLLM serving-benchmark definitions: TTFT =
 * first token - arrival, TPOT = (finish - first token) / (output tokens - 1)). */
#ifndef VKI_HOST_WORKLOAD_H
#define VKI_HOST_WORKLOAD_H

#include "vkinfer.h"

typedef struct wl_params {
    uint32_t n_requests;
    uint32_t in_min, in_max;        /* prompt tokens (random prompts) */
    uint32_t out_min, out_max;      /* max_new_tokens */
    double rate;                    /* requests per second (Poisson); 0 = all at t = 0 */
    uint64_t seed;
    const char *const *prompts;     /* text prompts, cycled; NULL = random token prompts */
    uint32_t n_prompts;
    vki_sampling_params sampling;
    bool ignore_eos;                /* generate exactly max_new_tokens */
    void (*on_stats)(void *user, const char *json); /* every tick with work (may be NULL) */
    void *user;
} wl_params;

typedef struct wl_req {
    uint32_t n_in, n_out;
    double t_arrive, t_first, t_end; /* seconds since the run started */
    vki_finish_reason finish;
    int32_t *tokens;                /* [n_out] generated */
} wl_req;

typedef struct wl_result {
    uint32_t n;
    wl_req *r;                      /* [n] */
    double wall_s;                  /* first arrival to last finish */
    uint64_t in_tokens, out_tokens;
    uint32_t n_errors;
} wl_result;

typedef struct wl_summary {
    uint32_t requests, errors;
    uint64_t in_tokens, out_tokens;
    double wall_s, req_per_s, out_tok_per_s, total_tok_per_s;
    double ttft_ms[3], tpot_ms[3], e2e_ms[3]; /* p50, p90, p99 */
} wl_summary;

vki_status wl_run(vki_engine *e, const vki_batch_params *bp, const wl_params *p, wl_result *out);
void wl_summarize(const wl_result *r, wl_summary *s);
void wl_result_free(wl_result *r);

/* p in [0, 100] of n values (linear interpolation between order statistics); 0 when n == 0. */
double wl_percentile(const double *v, uint32_t n, double p);

#endif
