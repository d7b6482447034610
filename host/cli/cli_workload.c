/* `vkinfer demo` and `vkinfer bench`: a workload through the batch manager (host/cli/workload.c).
 *   demo:  a batch of requests with mixed prompt/output lengths, a per-tick timeline of how many
 *          requests are in their prompt (context) or generating, throughput and latency at the end
 *   bench: the same driver with benchmark options, a table (and --json), one or every policy
 *          on the same engine in one run */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "host/api/engine_api.h"
#include "host/cli/cli.h"
#include "host/cli/cli_common.h"
#include "host/cli/workload.h"

typedef struct wl_cli {
    cli_engine_opts eo;
    wl_params wp;
    vki_batch_params bp;
    int policy;             /* -1: all three */
    bool json, quiet_ticks;
    const char *cmd;
    const char *commit;     /* --commit: recorded in the JSON */
    char command[2048];
    double ticks, ahead;    /* the run's last stats: iterations, lookahead steps */
} wl_cli;

static const char *const policy_names[] = {"no-evict", "max-util", "static"};

static const char *const demo_prompts[] = {
    "Once upon a time", "Lily and Ben went to the park", "The little dog was sad because",
    "One day, a big bird", "Tom wanted to build a tall tower", "There was a small house in the woods",
    "Mom said it was time for bed, but", "The sun was shining and the children",
};

/* Parses "A" or "A-B" into [lo, hi]. */
static bool parse_range(const char *cmd, const char *opt, const char *s, uint32_t *lo, uint32_t *hi)
{
    char a[32], *dash;
    snprintf(a, sizeof a, "%s", s ? s : "");
    dash = strchr(a, '-');
    uint64_t x, y;
    if (dash)
        *dash = 0;
    if (!cli_parse_u64(cmd, opt, a, 1, 1u << 20, &x) || (dash && !cli_parse_u64(cmd, opt, dash + 1, x, 1u << 20, &y)))
        return false;
    *lo = (uint32_t)x;
    *hi = dash ? (uint32_t)y : (uint32_t)x;
    return true;
}

static int parse(int argc, char **argv, wl_cli *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = cli_engine_opt(argc, argv, &i, &c->eo);
        uint64_t u;
        float f;
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        bool ok = true;
        if (!strcmp(a, "--json")) {
            c->json = true;
            continue;
        } else if (!strcmp(a, "--quiet")) {
            c->quiet_ticks = true;
            continue;
        } else if (!v) {
            fprintf(stderr, "vkinfer %s: unknown or incomplete option '%s' (--help)\n", c->cmd, a);
            return 2;
        } else if (!strcmp(a, "--requests")) {
            ok = cli_parse_u64(c->cmd, a, v, 1, 1u << 20, &u), c->wp.n_requests = (uint32_t)u;
        } else if (!strcmp(a, "--input")) {
            ok = parse_range(c->cmd, a, v, &c->wp.in_min, &c->wp.in_max);
        } else if (!strcmp(a, "--output")) {
            ok = parse_range(c->cmd, a, v, &c->wp.out_min, &c->wp.out_max);
        } else if (!strcmp(a, "--rate")) {
            ok = cli_parse_f32(c->cmd, a, v, 0, 1e6f, &f), c->wp.rate = f;
        } else if (!strcmp(a, "--seed")) {
            ok = cli_parse_u64(c->cmd, a, v, 0, UINT64_MAX, &c->wp.seed);
        } else if (!strcmp(a, "--temp")) {
            ok = cli_parse_f32(c->cmd, a, v, 0, 100, &c->wp.sampling.temperature);
        } else if (!strcmp(a, "--repeat-penalty")) {
            ok = cli_parse_f32(c->cmd, a, v, 1e-3f, 100, &c->wp.sampling.repetition_penalty);
        } else if (!strcmp(a, "--presence-penalty")) {
            ok = cli_parse_f32(c->cmd, a, v, -2, 2, &c->wp.sampling.presence_penalty);
        } else if (!strcmp(a, "--frequency-penalty")) {
            ok = cli_parse_f32(c->cmd, a, v, -2, 2, &c->wp.sampling.frequency_penalty);
        } else if (!strcmp(a, "--penalty-window")) {
            ok = cli_parse_u64(c->cmd, a, v, 0, 1u << 24, &u), c->wp.sampling.penalty_window = (uint32_t)u;
        } else if (!strcmp(a, "--max-batch")) {
            ok = cli_parse_u64(c->cmd, a, v, 1, 1u << 16, &u), c->bp.max_batch_size = (uint32_t)u;
        } else if (!strcmp(a, "--max-num-tokens")) {
            ok = cli_parse_u64(c->cmd, a, v, 1, 1u << 20, &u), c->bp.max_num_tokens = (uint32_t)u;
        } else if (!strcmp(a, "--commit")) {
            c->commit = v;
        } else if (!strcmp(a, "--chunk")) {
            ok = cli_parse_u64(c->cmd, a, v, 1, 1u << 20, &u), c->bp.chunk_size = (uint32_t)u;
        } else if (!strcmp(a, "--policy")) {
            c->policy = !strcmp(v, "all") ? -1 : -2;
            for (int k = 0; k < 3; k++)
                if (!strcmp(v, policy_names[k]))
                    c->policy = k;
            ok = c->policy != -2;
            if (!ok)
                fprintf(stderr, "vkinfer %s: --policy is no-evict, max-util, static or all\n", c->cmd);
        } else {
            fprintf(stderr, "vkinfer %s: unknown option '%s' (--help)\n", c->cmd, a);
            return 2;
        }
        if (!ok)
            return 2;
        i++;
    }
    return 0;
}

/* One line per tick from the batch manager's stats JSON. */
static void print_tick(void *user, const char *json)
{
    wl_cli *c = user;
    cJSON *o = cJSON_Parse(json);
    if (!o)
        return;
#define N(k) (cJSON_GetObjectItem(o, k) ? cJSON_GetObjectItem(o, k)->valuedouble : 0.0)
    c->ticks = N("Iteration Counter") + 1;
    c->ahead = N("Lookahead Steps");
    if (c->quiet_ticks) {
        cJSON_Delete(o);
        return;
    }
    int ctx = (int)N("Context Requests"), gen = (int)N("Generation Requests");
    char bar[72];
    int n = 0;
    for (int i = 0; i < ctx && n < 32; i++)
        bar[n++] = 'C';
    for (int i = 0; i < gen && n < 70; i++)
        bar[n++] = 'g';
    bar[n] = 0;
    fprintf(stderr, "tick %5.0f | context %3d (%5.0f tok) generation %3d | queue %4.0f paused %3.0f | kv %6.0f/%-6.0f | "
            "%7.1f ms | %s\n", N("Iteration Counter"), ctx, N("Total Context Tokens"), gen, N("Queue Length"),
            N("Paused Requests"), N("Used KV cache blocks"), N("Max KV cache blocks"), N("Step Time ms"), bar);
#undef N
    cJSON_Delete(o);
}

static cJSON *summary_json(const char *policy, const wl_summary *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "policy", policy);
    cJSON_AddNumberToObject(o, "requests", s->requests);
    cJSON_AddNumberToObject(o, "errors", s->errors);
    cJSON_AddNumberToObject(o, "input_tokens", (double)s->in_tokens);
    cJSON_AddNumberToObject(o, "output_tokens", (double)s->out_tokens);
    cJSON_AddNumberToObject(o, "wall_s", s->wall_s);
    cJSON_AddNumberToObject(o, "requests_per_s", s->req_per_s);
    cJSON_AddNumberToObject(o, "output_tokens_per_s", s->out_tok_per_s);
    cJSON_AddNumberToObject(o, "total_tokens_per_s", s->total_tok_per_s);
    const char *pk[3] = {"p50", "p90", "p99"};
    char key[32];
    for (int k = 0; k < 3; k++) {
        snprintf(key, sizeof key, "ttft_ms_%s", pk[k]);
        cJSON_AddNumberToObject(o, key, s->ttft_ms[k]);
        snprintf(key, sizeof key, "tpot_ms_%s", pk[k]);
        cJSON_AddNumberToObject(o, key, s->tpot_ms[k]);
        snprintf(key, sizeof key, "e2e_ms_%s", pk[k]);
        cJSON_AddNumberToObject(o, key, s->e2e_ms[k]);
    }
    return o;
}

static void print_table_header(void)
{
    printf("| policy   | requests | out tokens | wall s | out tok/s | req/s | TTFT p50 ms | TTFT p99 ms | "
           "TPOT p50 ms | TPOT p99 ms | E2E p50 ms | errors |\n"
           "|----------|---------:|-----------:|-------:|----------:|------:|------------:|------------:|"
           "------------:|------------:|-----------:|-------:|\n");
}

static void print_table_row(const char *policy, const wl_summary *s)
{
    printf("| %-8s | %8u | %10llu | %6.2f | %9.1f | %5.2f | %11.1f | %11.1f | %11.2f | %11.2f | %10.1f | %6u |\n", policy,
           s->requests, (unsigned long long)s->out_tokens, s->wall_s, s->out_tok_per_s, s->req_per_s, s->ttft_ms[0],
           s->ttft_ms[2], s->tpot_ms[0], s->tpot_ms[2], s->e2e_ms[0], s->errors);
}

/* Shows what a few requests generated (real models only make sense to read). */
static void print_samples(vki_engine *e, const wl_result *r, const wl_params *wp)
{
    const vki_tokenizer *tok = vki_engine_tokenizer(e);
    for (uint32_t i = 0; i < r->n && i < 3; i++) {
        char text[4096];
        size_t n = 0;
        if (vki_detokenize(tok, r->r[i].tokens, r->r[i].n_out, 0, text, sizeof text - 1, &n) != VKI_OK)
            continue;
        text[n] = 0;
        printf("request %u: %s%s\n", i + 1, wp->prompts ? wp->prompts[i % wp->n_prompts] : "[random prompt]", text);
    }
}

/* summary_json plus what a GPU run's record needs: device, driver, model, commit, command, the
 * workload's shape and how many ticks ran lookahead steps. */
static cJSON *run_json(const wl_cli *c, vki_engine *e, const char *policy, const wl_summary *s)
{
    cJSON *o = summary_json(policy, s);
    const vki_device_info *di = &engine_api_core(e)->dev->info;
    vki_model_info mi;
    vki_engine_info(e, &mi);
    char drv[520];
    snprintf(drv, sizeof drv, "%s %s", di->driver_name, di->driver_info);
    cJSON_AddStringToObject(o, "device", di->name);
    cJSON_AddStringToObject(o, "driver", drv);
    cJSON_AddStringToObject(o, "commit", c->commit ? c->commit : "unknown");
    cJSON_AddStringToObject(o, "model", mi.name);
    cJSON_AddStringToObject(o, "weight_type", mi.weight_type);
    cJSON_AddNumberToObject(o, "input_min", c->wp.in_min);
    cJSON_AddNumberToObject(o, "input_max", c->wp.in_max);
    cJSON_AddNumberToObject(o, "output_min", c->wp.out_min);
    cJSON_AddNumberToObject(o, "output_max", c->wp.out_max);
    cJSON_AddNumberToObject(o, "rate", c->wp.rate);
    cJSON_AddNumberToObject(o, "max_batch", c->bp.max_batch_size);
    const vki_sampling_params *sp = &c->wp.sampling;
    cJSON_AddNumberToObject(o, "temperature", sp->temperature);
    cJSON_AddNumberToObject(o, "repeat_penalty", sp->repetition_penalty);
    cJSON_AddNumberToObject(o, "presence_penalty", sp->presence_penalty);
    cJSON_AddNumberToObject(o, "frequency_penalty", sp->frequency_penalty);
    cJSON_AddNumberToObject(o, "penalty_window", sp->penalty_window);
    cJSON_AddBoolToObject(o, "overlap", !c->eo.p.no_overlap);
    cJSON_AddNumberToObject(o, "ticks", c->ticks);
    cJSON_AddNumberToObject(o, "lookahead_steps", c->ahead);
    cJSON_AddStringToObject(o, "command", c->command);
    return o;
}

static int run(wl_cli *c, bool demo)
{
    char path[600];
    if (!c->eo.model) {
        if (!cli_default_model("tiny", path, sizeof path))
            return 1;
        c->eo.model = path;
    } else if (demo) {
        c->wp.prompts = demo_prompts; /* a real model: readable prompts */
        c->wp.n_prompts = sizeof demo_prompts / sizeof demo_prompts[0];
    }
    vki_engine *e = cli_open_engine(&c->eo);
    if (!e)
        return 1;
    c->wp.on_stats = print_tick;
    c->wp.user = c;
    wl_summary sum[3];
    int first = c->policy < 0 ? 0 : c->policy, last = c->policy < 0 ? 2 : c->policy, rc = 0;
    cJSON *all = cJSON_CreateArray();
    for (int k = first; k <= last && !rc; k++) {
        vki_batch_params bp = c->bp;
        bp.policy = (vki_capacity_policy)k;
        bp.seed = c->wp.seed;
        wl_result res;
        if (!c->json)
            fprintf(stderr, "== %s: %u requests, prompts %u-%u tokens, outputs %u-%u tokens, %s\n", policy_names[k],
                    c->wp.n_requests, c->wp.in_min, c->wp.in_max, c->wp.out_min, c->wp.out_max,
                    c->wp.rate > 0 ? "Poisson arrivals" : "all arriving at once");
        c->ticks = c->ahead = 0;
        vki_status st = wl_run(e, &bp, &c->wp, &res);
        if (st != VKI_OK) {
            fprintf(stderr, "vkinfer %s: %s\n", c->cmd, vki_status_str(st));
            rc = 1;
        }
        wl_summarize(&res, &sum[k]);
        if (demo && k == last && !rc && c->wp.prompts)
            print_samples(e, &res, &c->wp);
        cJSON_AddItemToArray(all, run_json(c, e, policy_names[k], &sum[k]));
        wl_result_free(&res);
    }
    if (c->json && !rc) {
        cJSON *out = first == last ? cJSON_DetachItemFromArray(all, 0) : cJSON_CreateObject();
        if (first != last) {
            cJSON_AddItemToObject(out, "results", all);
            all = NULL;
            cJSON_AddNumberToObject(out, "speedup_no_evict_vs_static",
                                    sum[2].out_tok_per_s > 0 ? sum[0].out_tok_per_s / sum[2].out_tok_per_s : 0);
            cJSON_AddNumberToObject(out, "speedup_max_util_vs_static",
                                    sum[2].out_tok_per_s > 0 ? sum[1].out_tok_per_s / sum[2].out_tok_per_s : 0);
        }
        char *s = cJSON_PrintUnformatted(out);
        puts(s ? s : "{}");
        free(s);
        cJSON_Delete(out);
    } else if (!rc) {
        print_table_header();
        for (int k = first; k <= last; k++)
            print_table_row(policy_names[k], &sum[k]);
        if (first != last && sum[2].out_tok_per_s > 0)
            printf("in-flight batching vs static: no-evict %.2fx, max-util %.2fx output tokens/s\n",
                   sum[0].out_tok_per_s / sum[2].out_tok_per_s, sum[1].out_tok_per_s / sum[2].out_tok_per_s);
    }
    cJSON_Delete(all);
    cli_print_profile(&c->eo, e);
    vki_engine_destroy(e);
    return rc;
}

static void usage(FILE *f, const char *cmd, bool demo)
{
    fprintf(f, "usage: vkinfer %s [-m MODEL.gguf] [options]\n", cmd);
    if (demo)
        fprintf(f, "Pushes a batch of requests with mixed prompt and output lengths through the batch manager and\n"
                   "prints one line per tick (C = request in its prompt, g = generating). Without -m a small\n"
                   "synthetic model (random weights) is written and used.\n");
    fprintf(f,
            "  --requests N            number of requests (%s)\n"
            "  --input A[-B]           prompt tokens, fixed or a range (16-256); random ids\n"
            "  --output A[-B]          generated tokens per request, fixed or a range (8-128; EOS ignored)\n"
            "  --rate R                Poisson arrivals at R requests/s (0 = all at once)\n"
            "  --policy P              no-evict, max-util, static, or all (%s)\n"
            "  --max-batch N           requests holding KV at once (%s)\n"
            "  --max-num-tokens N      token budget per step (8192, capped by --max-tokens)\n"
            "  --chunk N               prefill chunk (512)\n"
            "  --temp T                sampling temperature (0: greedy)\n"
            "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F, --penalty-window N\n"
            "                          every request's penalties (1, 0, 0, 64: none)\n"
            "  --seed S                workload and sampling seed (1)\n"
            "  --json                  one JSON object on stdout instead of the table\n"
            "  --commit STR            recorded in the JSON (tools/gpu-check passes the staged commit)\n"
            "  --quiet                 no per-tick lines\n",
            demo ? "32" : "64", demo ? "no-evict" : "all", demo ? "8" : "engine's --max-seqs");
    cli_engine_opts_help(f);
}

static int workload_main(int argc, char **argv, bool demo)
{
    wl_cli c = {.cmd = demo ? "demo" : "bench", .policy = demo ? 0 : -1};
    cli_record_command(c.command, sizeof c.command, argc, argv);
    cli_engine_opts_init(&c.eo);
    c.bp = vki_batch_default_params();
    c.wp = (wl_params){.n_requests = demo ? 32 : 64, .in_min = 16, .in_max = 256, .out_min = 8, .out_max = 128,
                       .seed = 1, .ignore_eos = true, .sampling = vki_sampling_default_params()};
    c.wp.sampling.temperature = 0;
    if (demo)
        c.bp.max_batch_size = 8;
    else
        c.quiet_ticks = true;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout, c.cmd, demo);
            return 0;
        }
    int r = parse(argc, argv, &c);
    if (r)
        return r;
    if (demo && c.eo.model)
        c.wp.ignore_eos = false; /* real text: stop at the end of the story */
    return run(&c, demo);
}

int vki_cli_demo(int argc, char **argv) { return workload_main(argc, argv, true); }
int vki_cli_bench(int argc, char **argv) { return workload_main(argc, argv, false); }
