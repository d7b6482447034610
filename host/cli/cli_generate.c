/* `vkinfer generate`: one prompt through the batch manager, streamed to stdout.
 * stdout gets the prompt followed by the generated text and nothing else; stderr gets the
 * loading line and timings. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/cli.h"
#include "host/cli/cli_common.h"

#define MAX_STOPS 16

typedef struct gen_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    vki_text_stream *ts;
    vki_batch_manager *bm;
    uint64_t id;
    double t_submit, t_first, t_end;
    uint32_t n_gen;
    bool stopped_by_string;
    vki_finish_reason finish;
    char error[256];
    uint64_t seed;
} gen_state;

static void write_out(const char *p, size_t n)
{
    if (n) {
        fwrite(p, 1, n, stdout);
        fflush(stdout);
    }
}

/* Runs on the batch manager's worker thread. */
static void on_response(void *user, const vki_response *r)
{
    gen_state *g = user;
    for (uint32_t i = 0; i < r->n_tokens && !vki_text_stream_stopped(g->ts); i++) {
        if (!g->n_gen++)
            g->t_first = cli_now_s();
        const char *t;
        size_t n;
        bool stopped = false;
        if (vki_text_stream_push(g->ts, r->tokens[i], &t, &n, &stopped) == VKI_OK)
            write_out(t, n);
        if (stopped) { /* a stop string: end the request; its final response comes next tick */
            g->stopped_by_string = true;
            vki_batch_cancel(g->bm, g->id);
        }
    }
    if (!r->final)
        return;
    const char *t;
    size_t n;
    if (vki_text_stream_finish(g->ts, &t, &n) == VKI_OK)
        write_out(t, n);
    pthread_mutex_lock(&g->mu);
    g->t_end = cli_now_s();
    g->finish = g->stopped_by_string ? VKI_FINISH_STOP : r->finish;
    g->seed = r->seed;
    if (r->error)
        snprintf(g->error, sizeof g->error, "%s", r->error);
    g->done = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkinfer generate -m MODEL.gguf -p PROMPT [-n N] [sampling options]\n"
            "  -p, --prompt TEXT       the prompt (BOS is added as the model's metadata says)\n"
            "  -n, --n-predict N       tokens to generate (128)\n"
            "  --temp T                temperature; 0 = greedy (0)\n"
            "  --top-k K, --top-p P, --min-p P\n"
            "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F, --penalty-window N\n"
            "  --seed S                seed for sampling (default: drawn and printed)\n"
            "  --stop STR              stop string (repeatable; not printed)\n"
            "  --ignore-eos            do not stop at the model's end-of-generation tokens\n");
    cli_engine_opts_help(f);
}

/* Parses the sampling options into s; 1 consumed, 0 not ours, -1 bad value. */
static int sampling_opt(int argc, char **argv, int *i, vki_sampling_params *s)
{
    const char *a = argv[*i], *v;
    static const char *const names[] = {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
                                        "--presence-penalty", "--frequency-penalty", "--penalty-window", "--seed"};
    size_t k;
    int r = cli_value_opt("generate", argc, argv, i, names, sizeof names / sizeof names[0], &k, &v);
    if (r <= 0)
        return r;
    uint64_t u;
    bool ok;
    switch (k) {
    case 0: ok = cli_parse_f32("generate", a, v, 0, 100, &s->temperature); break;
    case 1: ok = cli_parse_u64("generate", a, v, 0, 1u << 24, &u); s->top_k = (int32_t)u; break;
    case 2: ok = cli_parse_f32("generate", a, v, 1e-6f, 1, &s->top_p); break;
    case 3: ok = cli_parse_f32("generate", a, v, 0, 1, &s->min_p); break;
    case 4: ok = cli_parse_f32("generate", a, v, 1e-3f, 100, &s->repetition_penalty); break;
    case 5: ok = cli_parse_f32("generate", a, v, -2, 2, &s->presence_penalty); break;
    case 6: ok = cli_parse_f32("generate", a, v, -2, 2, &s->frequency_penalty); break;
    case 7: ok = cli_parse_u64("generate", a, v, 0, 1u << 24, &u); s->penalty_window = (uint32_t)u; break;
    default: ok = cli_parse_u64("generate", a, v, 0, UINT64_MAX, &s->seed); s->has_seed = true; break;
    }
    return ok ? 1 : -1;
}

static int run(cli_engine_opts *eo, const char *prompt, uint32_t n_predict, const vki_sampling_params *sp,
               const char *const *stops, uint32_t n_stops, bool ignore_eos)
{
    vki_engine *e = cli_open_engine(eo);
    if (!e)
        return 1;
    const vki_tokenizer *tok = vki_engine_tokenizer(e);
    size_t np = 0, cap = strlen(prompt) + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    vki_status st = ids ? vki_tokenize(tok, prompt, strlen(prompt), true, false, ids, cap, &np) : VKI_ERR_OUT_OF_HOST_MEMORY;
    gen_state g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .id = 1};
    vki_batch_params bp = vki_batch_default_params();
    if (st == VKI_OK)
        st = vki_text_stream_create(tok, stops, n_stops, 0, &g.ts);
    if (st == VKI_OK)
        st = vki_batch_manager_create(e, &bp, NULL, &g.bm);
    int32_t never = -1; /* an end id no token has: disables the model's end-of-generation ids */
    vki_request req = {.id = g.id, .prompt = ids, .n_prompt = (uint32_t)np, .max_new_tokens = n_predict,
                       .end_ids = ignore_eos ? &never : NULL, .n_end_ids = ignore_eos ? 1 : 0,
                       .sampling = *sp, .streaming = true};
    char err[256] = "";
    if (st == VKI_OK) {
        write_out(prompt, strlen(prompt));
        g.t_submit = cli_now_s();
        st = vki_batch_submit(g.bm, &req, on_response, &g, err, sizeof err);
    }
    if (st == VKI_OK) {
        pthread_mutex_lock(&g.mu);
        while (!g.done)
            pthread_cond_wait(&g.cv, &g.mu);
        pthread_mutex_unlock(&g.mu);
        write_out("\n", 1);
    }
    if (g.bm)
        vki_batch_manager_destroy(g.bm, true);
    int rc = 0;
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer generate: %s%s%s\n", vki_status_str(st), err[0] ? ": " : "", err);
        rc = 1;
    } else if (g.finish == VKI_FINISH_ERROR) {
        fprintf(stderr, "vkinfer generate: %s\n", g.error);
        rc = 1;
    } else {
        double tp = g.t_first - g.t_submit, tg = g.t_end - g.t_first;
        static const char *const why[] = {"none", "end of text", "length", "stop", "cancelled", "error"};
        fprintf(stderr, "prompt: %zu tokens in %.1f ms (%.1f tokens/s) | generated: %u tokens in %.1f ms "
                "(%.1f tokens/s) | finish: %s | seed %llu\n", np, tp * 1e3, tp > 0 ? np / tp : 0.0, g.n_gen,
                tg * 1e3, g.n_gen > 1 && tg > 0 ? (g.n_gen - 1) / tg : 0.0,
                why[g.finish <= VKI_FINISH_ERROR ? g.finish : 0], (unsigned long long)g.seed);
    }
    vki_text_stream_free(g.ts);
    free(ids);
    vki_engine_destroy(e);
    return rc;
}

int vki_cli_generate(int argc, char **argv)
{
    cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    vki_sampling_params sp = vki_sampling_default_params();
    sp.temperature = 0;
    const char *prompt = NULL, *stops[MAX_STOPS];
    uint32_t n_stops = 0;
    uint64_t n_predict = 128;
    bool ignore_eos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_engine_opt(argc, argv, &i, &eo);
        if (r == 0)
            r = sampling_opt(argc, argv, &i, &sp);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && i + 1 < argc) {
            prompt = argv[++i];
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--n-predict")) && i + 1 < argc) {
            if (!cli_parse_u64("generate", a, argv[++i], 1, 1u << 24, &n_predict))
                return 2;
        } else if (!strcmp(a, "--stop") && i + 1 < argc && n_stops < MAX_STOPS) {
            stops[n_stops++] = argv[++i];
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else {
            fprintf(stderr, "vkinfer generate: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!prompt) {
        fprintf(stderr, "vkinfer generate: no prompt (-p TEXT)\n");
        return 2;
    }
    return run(&eo, prompt, (uint32_t)n_predict, &sp, stops, n_stops, ignore_eos);
}
