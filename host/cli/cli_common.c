#include "host/cli/cli_common.h"

#include <ctype.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/synth.h"
#include "host/util/strbuf.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void cli_device_choice(const char *spec, vki_device_params *p)
{
    char *end;
    long idx = strtol(spec, &end, 10);
    bool is_index = *spec && !*end && idx >= 0 && idx <= INT32_MAX;
    p->device_index = is_index ? (int)idx : -1;
    p->device_name = is_index ? NULL : spec;
}

void cli_engine_opts_init(cli_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->p = vki_engine_default_params();
    o->progress = true;
    const char *env = getenv("VKI_DEVICE");
    if (env && *env)
        cli_device_choice(env, &o->p.device);
}

bool cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 0) : 0;
    if (!s || !*s || *end || errno || s[0] == '-' || v < lo || v > hi) {
        fprintf(stderr, "vkinfer %s: %s needs an integer in [%llu, %llu], got '%s'\n", cmd, opt,
                (unsigned long long)lo, (unsigned long long)hi, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_f32(const char *cmd, const char *opt, const char *s, float lo, float hi, float *out)
{
    char *end = NULL;
    errno = 0;
    float v = s ? strtof(s, &end) : NAN;
    if (!s || !*s || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "vkinfer %s: %s needs a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

int cli_value_opt(const char *cmd, int argc, char **argv, int *i, const char *const *names, size_t n_names,
                  size_t *which, const char **value)
{
    size_t k = 0;
    while (k < n_names && strcmp(argv[*i], names[k]))
        k++;
    if (k == n_names)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "vkinfer %s: %s needs a value\n", cmd, argv[*i]);
        return -1;
    }
    if (which)
        *which = k;
    *value = argv[++*i];
    return 1;
}

/* --capture-steps A or A-B: steps counted from 0. */
static bool parse_steps(const char *cmd, const char *v, cli_engine_opts *o)
{
    char *end = NULL;
    errno = 0;
    long long a = strtoll(v, &end, 10), b = a;
    if (!errno && end != v && *end == '-' && end[1])
        b = strtoll(end + 1, &end, 10);
    if (errno || end == v || *end || a < 0 || b < a || v[0] == '-') {
        fprintf(stderr, "vkinfer %s: --capture-steps needs A or A-B with 0 <= A <= B, got '%s'\n", cmd, v);
        return false;
    }
    o->p.capture_first = a;
    o->p.capture_last = b;
    return true;
}

int cli_engine_opt(int argc, char **argv, int *i, cli_engine_opts *o)
{
    const char *a = argv[*i], *cmd = argv[0], *v;
    uint64_t u;
    float f;
    if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
        o->verbose++;
        o->p.device.log_level = o->verbose > 1 ? VKI_LOG_DEBUG : VKI_LOG_INFO;
        return 1;
    }
    if (!strcmp(a, "--validation")) {
        o->p.device.validation = true;
        return 1;
    }
    if (!strcmp(a, "--batch-invariant")) {
        o->p.batch_invariant = true;
        return 1;
    }
    if (!strcmp(a, "--no-fusion")) {
        o->p.no_fusion = true;
        return 1;
    }
    if (!strcmp(a, "--no-cmd-reuse")) {
        o->p.no_cmd_reuse = true;
        return 1;
    }
    if (!strcmp(a, "--no-overlap")) {
        o->p.no_overlap = true;
        return 1;
    }
    if (!strcmp(a, "--int-dot")) {
        o->p.int_dot = VKI_INT_DOT_ON;
        return 1;
    }
    if (!strcmp(a, "--no-int-dot")) {
        o->p.int_dot = VKI_INT_DOT_OFF;
        return 1;
    }
    if (!strcmp(a, "--no-progress")) {
        o->progress = false;
        return 1;
    }
    if (!strcmp(a, "--no-warmup")) {
        o->no_warmup = true;
        return 1;
    }
    static const char *const with_value[] = {"-m", "--model", "--device", "--kv-type", "--kv-tokens",
                                             "--kv-fraction", "--page-size", "--max-seqs", "--max-tokens", "--ctx",
                                             "--profile", "--capture-steps", "--device-memory",
                                             "--max-attention-window", "-c", "--ctx-size", "-ngl", "--kernel-config",
                                             "--n-gpu-layers", "--gpu-layers", "-t", "--threads", "--load-threads"};
    int r = cli_value_opt(cmd, argc, argv, i, with_value, sizeof with_value / sizeof with_value[0], NULL, &v);
    if (r <= 0)
        return r;
    bool gpu_layers = !strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "--gpu-layers");
    if (gpu_layers || !strcmp(a, "-t") || !strcmp(a, "--threads")) { /* llama.cpp's: nothing to set here */
        if (!cli_parse_u64(cmd, a, v, 0, 1u << 20, &u))
            return -1;
        fprintf(stderr, "vkinfer %s: note: %s ignored: %s\n", cmd, a,
                gpu_layers ? "every layer runs on the GPU" : "the model runs on the GPU; one host thread drives it");
    } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
        o->model = v;
    } else if (!strcmp(a, "--profile")) {
        o->p.profile_path = v;
    } else if (!strcmp(a, "--capture-steps")) {
        return parse_steps(cmd, v, o) ? 1 : -1;
    } else if (!strcmp(a, "--device-memory")) {
        if (!cli_parse_u64(cmd, a, v, 1, UINT64_MAX >> 20, &u))
            return -1;
        o->p.device_memory_limit = u << 20;
    } else if (!strcmp(a, "--device")) {
        cli_device_choice(v, &o->p.device);
    } else if (!strcmp(a, "--kernel-config")) {
        o->p.device.kernel_config = v; /* checked when the device opens */
    } else if (!strcmp(a, "--load-threads")) {
        if (!cli_parse_u64(cmd, a, v, 1, 8, &u))
            return -1;
        o->p.device.load_threads = (uint32_t)u;
    } else if (!strcmp(a, "--kv-type")) {
        if (strcmp(v, "f16") && strcmp(v, "f32") && strcmp(v, "q8_0")) {
            fprintf(stderr, "vkinfer %s: --kv-type is f16, f32 or q8_0, got '%s'\n", cmd, v);
            return -1;
        }
        o->p.kv_type = !strcmp(v, "f32") ? VKI_KV_F32 : !strcmp(v, "q8_0") ? VKI_KV_Q8_0 : VKI_KV_F16;
    } else if (!strcmp(a, "--max-attention-window")) {
        if (!cli_parse_u64(cmd, a, v, 1, 1u << 24, &u))
            return -1;
        o->p.max_attention_window = (uint32_t)u;
    } else if (!strcmp(a, "--kv-tokens")) {
        if (!cli_parse_u64(cmd, a, v, 1, 1ull << 32, &u))
            return -1;
        o->p.kv_tokens = u;
    } else if (!strcmp(a, "--kv-fraction")) {
        if (!cli_parse_f32(cmd, a, v, 0.01f, 1.0f, &f))
            return -1;
        o->p.kv_fraction = f;
    } else {
        uint32_t *dst = !strcmp(a, "--page-size") ? &o->p.page_size
                      : !strcmp(a, "--max-seqs")  ? &o->p.max_seqs
                      : !strcmp(a, "--max-tokens") ? &o->p.max_tokens
                                                   : &o->p.max_ctx;
        if (!cli_parse_u64(cmd, a, v, 1, 1u << 24, &u))
            return -1;
        *dst = (uint32_t)u;
        o->max_seqs_set |= dst == &o->p.max_seqs;
    }
    return 1;
}

void cli_engine_opts_help(FILE *f)
{
    fprintf(f,
            "model and device:\n"
            "  -m, --model FILE.gguf   the model (llama, qwen2, qwen3, qwen3moe, gemma2, gemma3 or phi3)\n"
            "  --device N|NAME         device index or name substring (default: $VKI_DEVICE, else\n"
            "                          discrete NVIDIA first)\n"
            "  --validation            enable the Vulkan validation layer\n"
            "  --kv-type f16|f32|q8_0  KV cache element type (f16; q8_0 holds 1.88x the tokens)\n"
            "  --kv-tokens N           KV cache capacity in tokens (default: --kv-fraction of free memory)\n"
            "  --kv-fraction F         share of device memory left after weights for the KV cache (0.8)\n"
            "  --page-size N           tokens per KV page (16)\n"
            "  --max-seqs N            sequences holding KV at once (256)\n"
            "  --max-tokens N          new tokens per step (2048)\n"
            "  --ctx N                 longest sequence (default: the model's context length; -c and\n"
            "                          --ctx-size as in llama.cpp)\n"
            "  --max-attention-window N  every layer attends to its last N tokens and the first\n"
            "                          page (StreamingLLM): bounded KV for long generations\n"
            "  --batch-invariant       a request's tokens do not depend on the rest of the batch\n"
            "                          (bitwise; slower prefill)\n"
            "  --no-fusion             op by op: no Q|K|V or gate|up concatenated at load, no residual\n"
            "                          add, activation or next RMSNorm in a matmul, RoPE of K and the\n"
            "                          decode split merge as passes of their own (same results; to\n"
            "                          measure them)\n"
            "  --no-cmd-reuse          record every step's command buffer anew instead of submitting\n"
            "                          a repeated one again (same results; to measure the host cost)\n"
            "  --no-overlap            wait for every step before submitting the next (same tokens; to\n"
            "                          measure the lookahead steps)\n"
            "  --int-dot               decode projections of integer weight types (all but F32/F16/\n"
            "                          BF16) as int8 dot products (activations rounded to int8 per\n"
            "                          32; needs Vulkan 1.3 integer dot products). Default: on where\n"
            "                          the driver accelerates them (NVIDIA), else off\n"
            "  --no-int-dot            the float path for every projection (exact FP32 arithmetic)\n"
            "  --device-memory MIB     device memory this engine may use in all (weights, KV, scratch)\n"
            "  --kernel-config CFG     the kernels' shapes, for tuning (what bench-kernels' sweeps\n"
            "                          found fastest): matvec=WGxROWS[xMC[xMU]],\n"
            "                          gemm=BMxBN[xWMxWN], gemm_stages=1|2, gemm_bk=16..64,\n"
            "                          gemm_split=N, gemm_xh=0|1, gemm_w16=0|1, gemv_max_m=M,\n"
            "                          attn_split=KEYS, attn_loads=N, sample_loads=N, comma-separated\n"
            "  --profile FILE          GPU time of every dispatch as a Chrome trace (chrome://tracing),\n"
            "                          and a table of the top ops by GPU time at the end\n"
            "  --capture-steps A[-B]   under RenderDoc (renderdoccmd capture ...), capture steps A..B\n"
            "  --load-threads N        threads copying weights to the device at load (one per\n"
            "                          core, up to 8)\n"
            "  --no-progress           no loading progress bar\n"
            "  --no-warmup             skip the warm-up steps at load (which compile the kernels on\n"
            "                          devices that compile on first use, e.g. lavapipe); implied by\n"
            "                          --profile and --capture-steps, which count the command's steps\n"
            "  -v, --verbose           more log output (twice: debug)\n"
            "  -ngl N, -t N            llama.cpp's GPU layers and threads: accepted, with a note, and\n"
            "                          ignored (every layer runs on the GPU)\n");
}

/* The library prints nothing: the program shows its log messages... */
void cli_log_stderr(void *user, vki_log_level lvl, const char *msg)
{
    (void)user;
    static const char *const tag[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "vkinfer %s: %s\n", tag[lvl <= VKI_LOG_DEBUG ? lvl : VKI_LOG_DEBUG], msg);
}

/* ... and draws the loading bar from the engine's progress callback. */
static bool progress_bar(void *user, uint64_t done, uint64_t total)
{
    cli_engine_opts *o = user;
    int pct = total ? (int)(100 * done / total) : 100;
    double s = cli_now_s() - o->progress_t0;
    fprintf(stderr, "\rloading [%-40.*s] %3d%% %6.0f MiB %5.1fs", pct * 40 / 100,
            "########################################", pct, done / 1048576.0, s);
    if (done >= total)
        fprintf(stderr, "  (%.0f MiB/s)\n", s > 0 ? done / 1048576.0 / s : 0.0);
    fflush(stderr);
    return true;
}

void cli_print_profile(const cli_engine_opts *o, const vki_engine *e)
{
    static char table[8192];
    size_t n = 0;
    if (o->p.profile_path && vki_engine_profile_summary(e, 20, table, sizeof table, &n) == VKI_OK)
        fprintf(stderr, "profile written to %s\n%s", o->p.profile_path, table);
}

/* --device N or NAME against the devices that exist: a clear list rather than an engine error. */
static bool check_device(const cli_engine_opts *o)
{
    int idx = o->p.device.device_index;
    const char *name = o->p.device.device_name;
    if (idx < 0 && !(name && *name))
        return true;
    vki_device_info *d = calloc(16, sizeof *d);
    uint32_t n = 0;
    vki_status st = d ? vki_list_devices(d, 16, &n) : VKI_ERR_OUT_OF_HOST_MEMORY;
    bool found = false;
    for (uint32_t i = 0; st == VKI_OK && i < n && i < 16; i++) {
        char lower[256], want[256];
        size_t k = 0;
        for (; d[i].name[k] && k < sizeof lower - 1; k++)
            lower[k] = (char)tolower((unsigned char)d[i].name[k]);
        lower[k] = 0;
        for (k = 0; name && name[k] && k < sizeof want - 1; k++)
            want[k] = (char)tolower((unsigned char)name[k]);
        want[k] = 0;
        found |= idx >= 0 ? (uint32_t)idx == d[i].index : strstr(lower, want) != NULL;
    }
    if (!found) {
        char what[300];
        if (idx >= 0)
            snprintf(what, sizeof what, "%d", idx);
        else
            snprintf(what, sizeof what, "'%s'", name);
        if (st != VKI_OK)
            fprintf(stderr, "vkinfer: --device %s: no Vulkan device is available (%s)\n", what, vki_status_str(st));
        else
            fprintf(stderr, "vkinfer: --device %s: no such device; this machine has:\n", what);
        static const char *const types[] = {"other", "integrated GPU", "discrete GPU", "virtual GPU", "CPU"};
        for (uint32_t i = 0; st == VKI_OK && i < n && i < 16; i++)
            fprintf(stderr, "  %u: %s (%s)\n", d[i].index, d[i].name,
                    (unsigned)d[i].type <= VKI_DEVICE_CPU ? types[d[i].type] : "other");
    }
    free(d);
    return found;
}

/* ---- warm-up --------------------------------------------------------------------------------- */

typedef struct warm {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t finals;
} warm;

static void warm_response(void *user, const vki_response *r)
{
    warm *w = user;
    if (!r->final)
        return;
    pthread_mutex_lock(&w->mu);
    w->finals++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* A prefill long enough for the matrix-matrix kernels and prefill attention, then decode steps
 * alone and in a batch: on a device that compiles each pipeline at its first dispatch (lavapipe
 * takes tens of seconds the first time; Mesa caches the result on disk) this happens here, with
 * a progress line, instead of inside the first request. Costs a few steps when already cached. */
static void warmup(vki_engine *e, bool progress)
{
    vki_model_info mi;
    vki_engine_info(e, &mi);
    static const struct { uint32_t n_req, n_prompt; } phases[] = {{1, 40}, {8, 2}};
    const uint32_t n_phases = sizeof phases / sizeof phases[0];
    warm w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    vki_batch_params bp = vki_batch_default_params();
    vki_batch_manager *bm = NULL;
    if (mi.n_ctx < 8 || vki_batch_manager_create(e, &bp, NULL, &bm) != VKI_OK)
        return;
    double t0 = cli_now_s();
    bool shown = false;
    uint64_t id = 1;
    for (uint32_t ph = 0; ph < n_phases; ph++) {
        uint32_t np = phases[ph].n_prompt < mi.n_ctx - 4 ? phases[ph].n_prompt : mi.n_ctx - 4;
        uint32_t nr = phases[ph].n_req < mi.max_seqs ? phases[ph].n_req : mi.max_seqs;
        int32_t ids[64];
        for (uint32_t i = 0; i < np; i++)
            ids[i] = (int32_t)((i * 7919u + 11u) % mi.n_vocab);
        pthread_mutex_lock(&w.mu);
        w.finals = 0;
        pthread_mutex_unlock(&w.mu);
        uint32_t sent = 0;
        for (uint32_t r = 0; r < nr; r++) {
            vki_request q = {.id = id++, .prompt = ids, .n_prompt = np, .max_new_tokens = 2, .ignore_eos = true,
                             .sampling = vki_sampling_default_params(), .streaming = false};
            sent += vki_batch_submit(bm, &q, warm_response, &w, NULL, 0) == VKI_OK;
        }
        pthread_mutex_lock(&w.mu);
        while (w.finals < sent) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&w.cv, &w.mu, &ts);
            if (progress && cli_now_s() - t0 > 1.0) {
                fprintf(stderr, "\rvkinfer: compiling kernels (first run only) %u/%u ", ph + 1, n_phases);
                shown = true;
            }
        }
        pthread_mutex_unlock(&w.mu);
    }
    vki_batch_manager_destroy(bm, false);
    if (shown)
        fprintf(stderr, "\rvkinfer: compiling kernels (first run only) %u/%u, %.1f s (cached for the next runs)\n",
                n_phases, n_phases, cli_now_s() - t0);
}

vki_engine *cli_open_engine(cli_engine_opts *o)
{
    if (!o->model) {
        fprintf(stderr, "vkinfer: no model given (-m FILE.gguf)\n");
        return NULL;
    }
    if (!check_device(o))
        return NULL;
    vki_engine *e = NULL;
    char err[512] = "";
    double t0 = cli_now_s();
    if (!o->p.device.log)
        o->p.device.log = cli_log_stderr;
    if (o->progress && isatty(STDERR_FILENO)) {
        o->p.progress = progress_bar;
        o->p.progress_user = o;
        o->progress_t0 = t0;
    }
    vki_status st = vki_engine_create(o->model, &o->p, &e, err, sizeof err);
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer: cannot load %s: %s\n", o->model, err[0] ? err : vki_status_str(st));
        return NULL;
    }
    vki_model_info mi;
    vki_engine_info(e, &mi);
    char window[64] = "";
    if (mi.kv_window)
        snprintf(window, sizeof window, ", window %u", mi.kv_window);
    else if (mi.sliding_window)
        snprintf(window, sizeof window, ", local layers' window %u", mi.sliding_window);
    fprintf(stderr,
            "vkinfer: %s (%s, %u layers, d %u, %u/%u heads, vocab %u, %s) on %s: weights %.1f MiB, "
            "KV cache %.1f MiB %s = %llu tokens (%u pages of %u, context %u%s), loaded in %.2f s\n",
            mi.name, mi.arch, mi.n_layer, mi.d_model, mi.n_head, mi.n_head_kv, mi.n_vocab, mi.weight_type, mi.device,
            mi.weight_bytes / 1048576.0, mi.kv_bytes / 1048576.0, mi.kv_type,
            (unsigned long long)mi.kv_pages * mi.page_size, mi.kv_pages, mi.page_size, mi.n_ctx, window,
            cli_now_s() - t0);
    if (o->p.max_ctx > mi.n_ctx_train && mi.n_ctx_train)
        fprintf(stderr, "vkinfer: warning: --ctx %u is above the context the model was trained for (%u); output "
                "quality usually degrades past it\n", o->p.max_ctx, mi.n_ctx_train);
    /* a profile or a capture is of the command's own steps: the engine counts steps from 0, and
     * the warm-up's would be the first ones traced and the ones --capture-steps 0-3 names */
    if (!o->no_warmup && !o->p.profile_path && o->p.capture_first < 0)
        warmup(e, o->progress && isatty(2));
    return e;
}

/* ---- sampling options, escapes ------------------------------------------------------------------ */

int cli_sampling_opt(const char *cmd, int argc, char **argv, int *i, vki_sampling_params *s)
{
    const char *a = argv[*i], *v;
    static const char *const names[] = {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
                                        "--presence-penalty", "--frequency-penalty", "--penalty-window", "--seed",
                                        "-s", "--repeat-last-n"}; /* the last two: llama.cpp's names */
    size_t k;
    int r = cli_value_opt(cmd, argc, argv, i, names, sizeof names / sizeof names[0], &k, &v);
    if (r <= 0)
        return r;
    k = k == 9 ? 8 : k == 10 ? 7 : k;
    uint64_t u;
    bool ok;
    switch (k) {
    case 0: ok = cli_parse_f32(cmd, a, v, 0, 100, &s->temperature); break;
    case 1: ok = cli_parse_u64(cmd, a, v, 0, 1u << 24, &u); s->top_k = (int32_t)u; break;
    case 2: ok = cli_parse_f32(cmd, a, v, 1e-6f, 1, &s->top_p); break;
    case 3: ok = cli_parse_f32(cmd, a, v, 0, 1, &s->min_p); break;
    case 4: ok = cli_parse_f32(cmd, a, v, 1e-3f, 100, &s->repetition_penalty); break;
    case 5: ok = cli_parse_f32(cmd, a, v, -2, 2, &s->presence_penalty); break;
    case 6: ok = cli_parse_f32(cmd, a, v, -2, 2, &s->frequency_penalty); break;
    case 7: ok = cli_parse_u64(cmd, a, v, 0, 1u << 24, &u); s->penalty_window = (uint32_t)u; break;
    default: ok = cli_parse_u64(cmd, a, v, 0, UINT64_MAX, &s->seed); s->has_seed = true; break;
    }
    return ok ? 1 : -1;
}

void cli_sampling_help(FILE *f)
{
    fprintf(f, "sampling:\n"
               "  --temp T                temperature; 0 = greedy (0)\n"
               "  --top-k K, --top-p P, --min-p P\n"
               "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F, --penalty-window N\n"
               "                          (--repeat-last-n N as in llama.cpp)\n"
               "  --seed S, -s S          seed for sampling (default: drawn and printed)\n");
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

bool cli_unescape(const char *cmd, const char *opt, char *s)
{
    char *w = s;
    for (const char *r = s; *r;) {
        if (*r != '\\' || !r[1]) {
            *w++ = *r++;
            continue;
        }
        const char *simple = strchr("ntr\\\"'abfve", r[1]);
        if (simple) {
            *w++ = "\n\t\r\\\"'\a\b\f\v\x1b"[simple - "ntr\\\"'abfve"];
            r += 2;
            continue;
        }
        int digits = r[1] == 'x' ? 2 : r[1] == 'u' ? 4 : 0;
        if (!digits) { /* unknown escape: kept as written */
            *w++ = *r++;
            continue;
        }
        uint32_t cp = 0;
        for (int k = 0; k < digits; k++) {
            int h = hexval(r[2 + k]);
            if (h < 0) {
                fprintf(stderr, "vkinfer %s: %s: \\%c needs %d hex digits\n", cmd, opt, r[1], digits);
                return false;
            }
            cp = cp * 16 + (uint32_t)h;
        }
        if (!cp || (cp >= 0xD800 && cp <= 0xDFFF)) {
            fprintf(stderr, "vkinfer %s: %s: \\%c%.*s is not allowed in text\n", cmd, opt, r[1], digits, r + 2);
            return false;
        }
        r += 2 + digits;
        if (digits == 2 || cp < 0x80) { /* \xHH is a byte, as in C */
            *w++ = (char)cp;
        } else if (cp < 0x800) {
            *w++ = (char)(0xC0 | cp >> 6);
            *w++ = (char)(0x80 | (cp & 0x3F));
        } else {
            *w++ = (char)(0xE0 | cp >> 12);
            *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
            *w++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *w = 0;
    return true;
}

void cli_record_command(char *buf, size_t cap, int argc, char **argv)
{
    size_t n = (size_t)snprintf(buf, cap, "vkinfer");
    for (int i = 0; i < argc && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, strchr(argv[i], ' ') ? " '%s'" : " %s", argv[i]);
}

double cli_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

bool cli_default_model(const char *preset, char *path, size_t n)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[512];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/vkinfer", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/vkinfer", home);
    else
        snprintf(dir, sizeof dir, "/tmp");
    if (home && *home && !(xdg && *xdg)) {
        char parent[520];
        snprintf(parent, sizeof parent, "%s/.cache", home);
        mkdir(parent, 0755);
    }
    mkdir(dir, 0755);
    int w = snprintf(path, n, "%s/synthetic-%s.gguf", dir, preset);
    if (w < 0 || (size_t)w >= n)
        return false;
    if (access(path, R_OK) == 0)
        return true;
    synth_params sp = synth_default_params(); /* synth_preset sets only the preset's fields */
    if (synth_preset(preset, &sp) != VKI_OK) {
        fprintf(stderr, "vkinfer: unknown synthetic preset '%s'\n", preset);
        return false;
    }
    char err[256];
    fprintf(stderr, "vkinfer: no model given: writing a synthetic %s model (random weights) to %s\n", preset, path);
    if (synth_write(&sp, path, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "vkinfer: cannot write %s: %s\n", path, err);
        return false;
    }
    return true;
}

/* ---- output constraints -------------------------------------------------------------------------- */

/* A whole file as a NUL-terminated string (malloc'd), or NULL after printing why. */
static char *read_text_file(const char *cmd, const char *opt, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "vkinfer %s: %s %s: cannot open it\n", cmd, opt, path);
        return NULL;
    }
    strbuf b = {0};
    char buf[4096];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0)
        ok = strbuf_put(&b, buf, n);
    ok = ok && !ferror(f) && strbuf_put(&b, "", 0);
    fclose(f);
    if (!ok || strlen(b.p) != b.len) {
        fprintf(stderr, "vkinfer %s: %s %s: cannot read it%s\n", cmd, opt, path, ok ? " (it holds a NUL byte)" : "");
        strbuf_free(&b);
        return NULL;
    }
    return b.p;
}

int cli_constraint_opt(const char *cmd, int argc, char **argv, int *i, cli_constraint *c)
{
    static const char *const names[] = {"--grammar", "--grammar-file", "--json-schema", "--json-schema-file",
                                        "-j"}; /* llama.cpp's short --json-schema */
    size_t k;
    const char *v, *opt = argv[*i];
    int r = cli_value_opt(cmd, argc, argv, i, names, sizeof names / sizeof names[0], &k, &v);
    if (r <= 0)
        return r;
    k = k == 4 ? 2 : k;
    if (c->c.type != VKI_CONSTRAINT_NONE) {
        fprintf(stderr, "vkinfer %s: %s: give one of --grammar, --grammar-file, --json-schema, --json-schema-file\n",
                cmd, opt);
        return -1;
    }
    c->own = k == 1 || k == 3 ? read_text_file(cmd, opt, v) : strdup(v);
    if (!c->own)
        return -1;
    c->c = (vki_constraint){k < 2 ? VKI_CONSTRAINT_GBNF : VKI_CONSTRAINT_JSON_SCHEMA, c->own, strlen(c->own)};
    char err[320] = "";
    if (vki_constraint_check(&c->c, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "vkinfer %s: %s: %s\n", cmd, opt, err[0] ? err : "invalid");
        return -1;
    }
    return 1;
}

void cli_constraint_help(FILE *f)
{
    fprintf(f, "output constraint (structured output; at most one):\n"
               "  --grammar GBNF          the output follows a GBNF grammar (llama.cpp syntax, start rule root)\n"
               "  --grammar-file F        the same, read from F\n"
               "  -j, --json-schema JSON  the output is JSON valid against a JSON Schema ('{\"type\": \"object\"}':\n"
               "                          any object; see the README for the supported keywords)\n"
               "  --json-schema-file F    the same, read from F\n");
}

void cli_constraint_free(cli_constraint *c)
{
    free(c->own);
    *c = (cli_constraint){0};
}
