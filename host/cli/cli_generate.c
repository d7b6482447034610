/* `vkinfer generate`: one prompt through the batch manager, streamed to stdout.
 * stdout gets the prompt followed by the generated text and nothing else; stderr gets the
 * loading line and timings. */
#include <stdlib.h>
#include <string.h>

#include "host/cli/cli.h"
#include "host/cli/cli_common.h"

#define MAX_STOPS 16

static void write_out(const char *p, size_t n)
{
    if (n) {
        fwrite(p, 1, n, stdout);
        fflush(stdout);
    }
}

/* The text of the generation, as it comes (on the batch manager's worker thread). */
static bool on_text(void *user, const char *text, size_t len)
{
    (void)user;
    write_out(text, len);
    return true;
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

/* One prompt through the simple API (vki_generate): the CLI is its first user. */
static int run(cli_engine_opts *eo, const char *prompt, uint32_t n_predict, const vki_sampling_params *sp,
               const char *const *stops, uint32_t n_stops, bool ignore_eos)
{
    vki_engine *e = cli_open_engine(eo);
    if (!e)
        return 1;
    vki_batch_manager *bm = NULL;
    vki_status st = vki_batch_manager_create(e, NULL, NULL, &bm);
    vki_generate_params gp = vki_generate_default_params();
    gp.max_tokens = n_predict;
    gp.sampling = *sp;
    gp.stops = stops;
    gp.n_stops = n_stops;
    gp.ignore_eos = ignore_eos;
    gp.on_text = on_text;
    vki_generate_result res = {0};
    char err[256] = "";
    if (st == VKI_OK) {
        write_out(prompt, strlen(prompt));
        st = vki_generate(bm, prompt, &gp, &res, err, sizeof err);
        if (st == VKI_OK)
            write_out("\n", 1);
    }
    vki_batch_manager_destroy(bm, true);
    int rc = 0;
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer generate: %s%s%s\n", vki_status_str(st), err[0] ? ": " : "", err);
        rc = 1;
    } else {
        double tp = res.first_token_ms / 1e3, tg = (res.total_ms - res.first_token_ms) / 1e3;
        static const char *const why[] = {"none", "end of text", "length", "stop", "cancelled", "error"};
        fprintf(stderr, "prompt: %u tokens in %.1f ms (%.1f tokens/s) | generated: %u tokens in %.1f ms "
                "(%.1f tokens/s) | finish: %s | seed %llu\n", res.n_prompt, tp * 1e3, tp > 0 ? res.n_prompt / tp : 0.0,
                res.n_generated, tg * 1e3, res.n_generated > 1 && tg > 0 ? (res.n_generated - 1) / tg : 0.0,
                why[res.finish <= VKI_FINISH_ERROR ? res.finish : 0], (unsigned long long)res.seed);
    }
    cli_print_profile(eo, e);
    vki_engine_destroy(e);
    return rc;
}

int vki_cli_generate(int argc, char **argv)
{
    cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    vki_sampling_params sp = vki_sampling_default_params(); /* greedy */
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
