/* `vkinfer generate`: one prompt through the batch manager, streamed to stdout.
 * stdout gets the prompt followed by the generated text and nothing else (--no-display-prompt:
 * only the generated text; --json: one JSON object instead); stderr gets the loading line and
 * timings. The prompt comes from -p TEXT (escapes interpreted), -p - (stdin) or -f FILE; --chat
 * wraps it as one user message in the model's chat template. --grammar / --json-schema (and
 * their -file forms) constrain the output (cli_constraint). --prompt-cache FILE (llama.cpp's
 * name) keeps the KV of the prompt and answer in a session file (docs/session-file.md) between
 * runs: a later prompt that starts with the same tokens computes only what follows. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "host/chat/chat_reply.h"
#include "host/cli/cli.h"
#include "host/cli/cli_common.h"
#include "host/util/strbuf.h"

#define MAX_STOPS 16

typedef struct gen_opts {
    const char *prompt_arg, *prompt_file, *system, *chat_template;
    const char *prompt_cache;          /* --prompt-cache FILE, or NULL */
    bool chat, json, no_display, no_escape, ignore_eos, prompt_cache_ro;
    uint64_t n_predict;
    char *stops[MAX_STOPS];
    uint32_t n_stops;
    vki_sampling_params sp;
    cli_constraint con;
} gen_opts;

typedef struct gen_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, json, err_tty;
    chat_reply reply;         /* the text (with --chat on gpt-oss: the reasoning apart) */
    bool in_reasoning;        /* a reasoning line is open on stderr */
    vki_batch_manager *bm;
    uint64_t id;
    double t_submit, t_first, t_end;
    uint32_t n_gen, n_cached;
    bool stopped_by_string;
    vki_finish_reason finish;
    char error[256];
    uint64_t seed;
    strbuf text;              /* --json: the text shown */
    strbuf reasoning;         /* --json: gpt-oss's reasoning */
    int32_t *ids;             /* [n_gen] --json: the generated ids */
    float *lp;                /* [n_gen] their logprobs */
    uint32_t cap;
} gen_state;

static void write_out(const char *p, size_t n)
{
    if (n) {
        fwrite(p, 1, n, stdout);
        fflush(stdout);
    }
}

/* The reply's last piece: the answer to stdout (or --json's text); gpt-oss's reasoning to stderr,
 * dimmed on a terminal (or --json's reasoning). */
static void emit(gen_state *g)
{
    const strbuf *r = &g->reply.reasoning, *a = &g->reply.answer;
    if (g->json) {
        strbuf_put(&g->reasoning, r->p, r->len);
        strbuf_put(&g->text, a->p, a->len);
        return;
    }
    if (r->len) {
        fprintf(stderr, "%s%.*s%s", g->err_tty ? "\033[2m" : "", (int)r->len, r->p, g->err_tty ? "\033[0m" : "");
        fflush(stderr);
        g->in_reasoning = true;
    }
    if (a->len && g->in_reasoning) { /* the answer on a line of its own */
        fputs("\n", stderr);
        g->in_reasoning = false;
    }
    write_out(a->p, a->len);
}

/* --json: keeps ids and logprobs (worker thread; grown by doubling). */
static void keep_token(gen_state *g, int32_t id, float lp)
{
    if (g->n_gen >= g->cap) {
        uint32_t cap = g->cap ? 2 * g->cap : 64;
        int32_t *i = realloc(g->ids, cap * sizeof *i);
        if (i)
            g->ids = i;
        float *l = realloc(g->lp, cap * sizeof *l);
        if (l)
            g->lp = l;
        if (!i || !l)
            return;
        g->cap = cap;
    }
    g->ids[g->n_gen] = id;
    g->lp[g->n_gen] = lp;
}

/* Runs on the batch manager's worker thread. */
static void on_response(void *user, const vki_response *r)
{
    gen_state *g = user;
    for (uint32_t i = 0; i < r->n_tokens && !vki_text_stream_stopped(g->reply.ts); i++) {
        if (!g->n_gen)
            g->t_first = cli_now_s();
        if (g->json)
            keep_token(g, r->tokens[i], r->logprobs ? r->logprobs[i] : 0.0f);
        g->n_gen++;
        bool stopped = false;
        if (chat_reply_push(&g->reply, r->tokens[i], &stopped) == VKI_OK)
            emit(g);
        if (stopped) { /* a stop string: end the request; its final response comes next tick */
            g->stopped_by_string = true;
            vki_batch_cancel(g->bm, g->id);
        }
    }
    if (!r->final)
        return;
    if (!g->stopped_by_string && chat_reply_finish(&g->reply) == VKI_OK)
        emit(g);
    pthread_mutex_lock(&g->mu);
    g->t_end = cli_now_s();
    g->finish = g->stopped_by_string ? VKI_FINISH_STOP : r->finish;
    g->seed = r->seed;
    g->n_cached = r->n_cached;
    if (r->error)
        snprintf(g->error, sizeof g->error, "%s", r->error);
    g->done = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkinfer generate -m MODEL.gguf (-p PROMPT | -p - | -f FILE) [-n N] [options]\n"
            "  -p, --prompt TEXT       the prompt (BOS is added as the model's metadata says); '-' reads stdin\n"
            "  -f, --file FILE         read the prompt from FILE\n"
            "  -n, --n-predict N       tokens to generate (128; clamped to the context, with a note)\n"
            "  --stop STR              stop string (repeatable; not printed)\n"
            "  --ignore-eos            do not stop at the model's end-of-generation tokens\n"
            "  --chat                  the prompt is one user message in the model's chat template\n"
            "  --system TEXT           with --chat: a system message first\n"
            "  --chat-template NAME    with --chat: chatml|llama3|llama2|mistral|zephyr|gemma|phi3|deepseek|\n"
            "                          harmony|tulu|granite|smollm3|exaone|glm4|command-r|plain (gpt-oss's reasoning\n"
            "                          on stderr, its answer on stdout)\n"
            "  --no-display-prompt     print only the generated text\n"
            "  --json                  print one JSON object: prompt and generated ids, text, logprobs,\n"
            "                          finish reason, seed, timings\n"
            "  --no-escape             take -p and --stop literally (default, or -e: \\n, \\t, \\\\, \\xHH, ...\n"
            "                          are interpreted, so --stop \"\\n\\n\" is two newlines)\n"
            "  --prompt-cache FILE     restore the KV saved in FILE (when it exists) and save the prompt's and\n"
            "                          answer's KV to it afterwards: a prompt starting with the same tokens\n"
            "                          computes only the rest. A file of another model is an error\n"
            "  --prompt-cache-ro       with --prompt-cache: restore only, never write FILE\n");
    cli_constraint_help(f);
    cli_sampling_help(f);
    cli_engine_opts_help(f);
}

/* The prompt's text: -p (escapes), -p - (stdin) or -f FILE. malloc'd, or NULL (message printed). */
static char *read_prompt(const gen_opts *o)
{
    if (o->prompt_arg && strcmp(o->prompt_arg, "-")) {
        char *p = strdup(o->prompt_arg);
        if (p && !o->no_escape && !cli_unescape("generate", "-p", p)) {
            free(p);
            return NULL;
        }
        return p;
    }
    FILE *f = o->prompt_file ? fopen(o->prompt_file, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "vkinfer generate: -f %s: cannot open it\n", o->prompt_file);
        return NULL;
    }
    strbuf b = {0};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        if (!strbuf_put(&b, buf, n))
            break;
    bool bad = ferror(f) != 0;
    if (f != stdin)
        fclose(f);
    if (bad || !strbuf_put(&b, "", 0) || strlen(b.p) != b.len) {
        fprintf(stderr, "vkinfer generate: cannot read the prompt from %s%s\n", o->prompt_file ? o->prompt_file : "stdin",
                !bad && b.p && strlen(b.p) != b.len ? " (it contains a NUL byte)" : "");
        strbuf_free(&b);
        return NULL;
    }
    return b.p;
}

/* Prompt text -> ids (plain, or one user message in the chat template: *family its family). */
static bool prompt_ids(const gen_opts *o, const cli_engine_opts *eo, const vki_tokenizer *tok, const char *text,
                       int32_t **ids, size_t *n, chat_family *family)
{
    *family = CHAT_PLAIN;
    if (!o->chat) {
        size_t cap = strlen(text) + 8;
        *ids = malloc(cap * sizeof **ids);
        return *ids && vki_tokenize(tok, text, strlen(text), true, false, *ids, cap, n) == VKI_OK;
    }
    cli_chat c;
    if (!cli_chat_open(eo->model, o->chat_template, tok, &c))
        return false;
    chat_msg m[2];
    size_t k = 0;
    if (o->system)
        m[k++] = (chat_msg){CHAT_SYSTEM, o->system, strlen(o->system)};
    m[k++] = (chat_msg){CHAT_USER, text, strlen(text)};
    bool ok = cli_chat_tokens(&c, tok, m, k, NULL, ids, n);
    *family = c.t.family;
    cli_chat_close(&c);
    return ok;
}

static cJSON *ids_json(const int32_t *ids, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static const char *finish_name(vki_finish_reason f)
{
    static const char *const why[] = {"none", "stop", "length", "stop", "cancelled", "error"};
    return why[f <= VKI_FINISH_ERROR ? f : 0];
}

static void print_json(const gen_state *g, const char *prompt, const int32_t *ids, size_t np, double load_s)
{
    double tp = g->t_first - g->t_submit, tg = g->t_end - g->t_first;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", prompt);
    cJSON_AddItemToObject(o, "prompt_ids", ids_json(ids, np));
    uint32_t n = g->n_gen < g->cap ? g->n_gen : g->cap;
    cJSON_AddItemToObject(o, "ids", ids_json(g->ids, n));
    cJSON_AddStringToObject(o, "text", g->text.p ? g->text.p : "");
    if (g->reply.harmony || g->reply.cohere)
        cJSON_AddStringToObject(o, "reasoning", g->reasoning.p ? g->reasoning.p : "");
    cJSON *lp = cJSON_AddArrayToObject(o, "logprobs");
    for (uint32_t i = 0; i < n; i++)
        cJSON_AddItemToArray(lp, cJSON_CreateNumber(g->lp[i] > -1e30f ? g->lp[i] : -9999.0));
    cJSON_AddStringToObject(o, "finish_reason", finish_name(g->finish));
    char seed[24]; /* a 64-bit integer: a double would round it */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)g->seed);
    cJSON_AddRawToObject(o, "seed", seed);
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    cJSON_AddNumberToObject(t, "load_ms", load_s * 1e3);
    cJSON_AddNumberToObject(t, "prompt_ms", g->n_gen ? tp * 1e3 : 0);
    cJSON_AddNumberToObject(t, "prompt_cached_tokens", g->n_cached);
    cJSON_AddNumberToObject(t, "generation_ms", g->n_gen ? tg * 1e3 : 0);
    cJSON_AddNumberToObject(t, "prompt_tokens_per_s", g->n_gen && tp > 0 ? np / tp : 0);
    cJSON_AddNumberToObject(t, "generation_tokens_per_s", g->n_gen > 1 && tg > 0 ? (g->n_gen - 1) / tg : 0);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (s)
        printf("%s\n", s);
    free(s);
}

/* Clamps n_predict to the context (a note on stderr); false when the prompt itself does not fit. */
static bool fit_context(const vki_engine *e, size_t np, uint32_t *n_predict)
{
    vki_model_info mi;
    vki_engine_info(e, &mi);
    if (np >= mi.n_ctx) {
        fprintf(stderr, "vkinfer generate: the prompt is %zu tokens; the context is %u tokens (--ctx, --kv-tokens)\n",
                np, mi.n_ctx);
        return false;
    }
    if (np + *n_predict > mi.n_ctx) {
        fprintf(stderr, "vkinfer generate: note: -n %u clamped to %u: the prompt (%zu tokens) and the answer must fit "
                "the context of %u tokens\n", *n_predict, (uint32_t)(mi.n_ctx - np), np, mi.n_ctx);
        *n_predict = (uint32_t)(mi.n_ctx - np);
    }
    return true;
}

#define CACHE_SESSION 1

/* --prompt-cache: a missing file is a first run (nothing to restore); anything else that fails
 * (another model, a damaged file) stops the run with the library's reason. */
static vki_status cache_restore(vki_batch_manager *bm, const char *path, char *err, size_t cap)
{
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT)
        return VKI_OK;
    vki_session_file_info info = {0};
    char why[256] = "";
    vki_status st = vki_batch_session_restore(bm, CACHE_SESSION, path, &info, why, sizeof why);
    if (st != VKI_OK)
        snprintf(err, cap, "--prompt-cache: %.200s", why);
    else
        fprintf(stderr, "prompt cache: %s: %u tokens (%u with KV) in %.1f ms\n", path, info.n_tokens,
                info.n_kv_tokens, info.ms);
    return st;
}

static vki_status cache_save(vki_batch_manager *bm, const char *path, char *err, size_t cap)
{
    vki_session_file_info info = {0};
    char why[256] = "";
    vki_status st = vki_batch_session_save(bm, CACHE_SESSION, path, &info, why, sizeof why);
    if (st == VKI_ERR_NOT_FOUND) { /* nothing pinned: the prompt and answer fill no whole page */
        fprintf(stderr, "prompt cache: nothing to save: no whole KV page was kept\n");
        return VKI_OK;
    }
    if (st != VKI_OK)
        snprintf(err, cap, "--prompt-cache: %.200s", why);
    else
        fprintf(stderr, "prompt cache: saved %u tokens (%u with KV, %.1f KiB) to %s\n", info.n_tokens,
                info.n_kv_tokens, info.bytes / 1024.0, path);
    return st;
}

static int run(cli_engine_opts *eo, gen_opts *o)
{
    char *prompt = read_prompt(o);
    if (!prompt)
        return 1;
    if (!eo->max_seqs_set)
        eo->p.max_seqs = 1; /* one sequence: size the KV pool for it, not for 256 */
    double t_load = cli_now_s();
    vki_engine *e = cli_open_engine(eo);
    if (!e) {
        free(prompt);
        return 1;
    }
    t_load = cli_now_s() - t_load;
    const vki_tokenizer *tok = vki_engine_tokenizer(e);
    int32_t *ids = NULL;
    size_t np = 0;
    uint32_t n_predict = (uint32_t)o->n_predict;
    gen_state g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .id = 1, .json = o->json,
                   .err_tty = isatty(2)};
    chat_template fam = {0}; /* the family the prompt was rendered in: gpt-oss's reasoning apart */
    vki_status st = prompt_ids(o, eo, tok, prompt, &ids, &np, &fam.family) ? VKI_OK : VKI_ERR_INVALID_ARG;
    char err[256] = "";
    if (st != VKI_OK)
        snprintf(err, sizeof err, "cannot tokenize the prompt");
    if (st == VKI_OK && !fit_context(e, np, &n_predict))
        st = VKI_ERR_INVALID_ARG;
    vki_batch_params bp = vki_batch_default_params();
    uint32_t flags = o->chat ? VKI_DETOK_STRIP_LEADING_SPACE : 0;
    if (st == VKI_OK)
        st = chat_reply_init(&g.reply, tok, &fam, NULL, (const char *const *)o->stops, o->n_stops, flags);
    if (st == VKI_OK)
        st = vki_batch_manager_create(e, &bp, NULL, &g.bm);
    if (st == VKI_OK && o->prompt_cache)
        st = cache_restore(g.bm, o->prompt_cache, err, sizeof err);
    o->sp.logprobs = o->json;
    vki_request req = {.id = g.id, .prompt = ids, .n_prompt = (uint32_t)np, .max_new_tokens = n_predict,
                       .ignore_eos = o->ignore_eos, .sampling = o->sp, .streaming = true, .constraint = o->con.c,
                       .session_id = o->prompt_cache ? CACHE_SESSION : 0};
    if (st == VKI_OK) {
        if (!o->no_display && !o->json && !o->chat)
            write_out(prompt, strlen(prompt));
        g.t_submit = cli_now_s();
        st = vki_batch_submit(g.bm, &req, on_response, &g, err, sizeof err);
    }
    if (st == VKI_OK) {
        pthread_mutex_lock(&g.mu);
        while (!g.done)
            pthread_cond_wait(&g.cv, &g.mu);
        pthread_mutex_unlock(&g.mu);
        if (!o->json)
            write_out("\n", 1);
        if (o->prompt_cache && !o->prompt_cache_ro && g.finish != VKI_FINISH_ERROR)
            st = cache_save(g.bm, o->prompt_cache, err, sizeof err);
    }
    if (g.bm)
        vki_batch_manager_destroy(g.bm, true);
    int rc = 0;
    if (st != VKI_OK) {
        if (err[0] || st != VKI_ERR_INVALID_ARG)
            fprintf(stderr, "vkinfer generate: %s%s%s\n", vki_status_str(st), err[0] ? ": " : "", err);
        rc = 1;
    } else if (g.finish == VKI_FINISH_ERROR) {
        fprintf(stderr, "vkinfer generate: %s\n", g.error);
        rc = 1;
    } else if (o->json) {
        print_json(&g, prompt, ids, np, t_load);
    } else {
        double tp = g.t_first - g.t_submit, tg = g.t_end - g.t_first;
        char cached[48] = "";
        if (o->prompt_cache)
            snprintf(cached, sizeof cached, ", %u from the cache", g.n_cached);
        fprintf(stderr, "prompt: %zu tokens%s in %.1f ms (%.1f tokens/s) | generated: %u tokens in %.1f ms "
                "(%.1f tokens/s) | finish: %s | seed %llu\n", np, cached, tp * 1e3, tp > 0 ? np / tp : 0.0, g.n_gen,
                tg * 1e3, g.n_gen > 1 && tg > 0 ? (g.n_gen - 1) / tg : 0.0,
                g.finish == VKI_FINISH_EOS ? "end of text" : finish_name(g.finish), (unsigned long long)g.seed);
    }
    chat_reply_free(&g.reply);
    strbuf_free(&g.text);
    strbuf_free(&g.reasoning);
    free(g.ids);
    free(g.lp);
    free(ids);
    free(prompt);
    cli_print_profile(eo, e); /* --profile: the top ops by GPU time (the batch manager is gone) */
    vki_engine_destroy(e);
    return rc;
}

/* Options of generate itself; 1 consumed, 0 not ours, -1 bad value. */
static int gen_opt(int argc, char **argv, int *i, gen_opts *o)
{
    const char *a = argv[*i], *v;
    static const char *const flags[] = {"--ignore-eos", "--chat", "--json", "--no-display-prompt", "--no-escape",
                                        "--prompt-cache-ro"};
    bool *dst[] = {&o->ignore_eos, &o->chat, &o->json, &o->no_display, &o->no_escape, &o->prompt_cache_ro};
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
        if (!strcmp(a, flags[k]))
            return *dst[k] = true, 1;
    if (!strcmp(a, "-e") || !strcmp(a, "--escape")) /* llama.cpp's; escapes are interpreted by default */
        return o->no_escape = false, 1;
    static const char *const names[] = {"-p", "--prompt", "-f", "--file", "-n", "--n-predict", "--stop",
                                        "--system", "--chat-template", "--prompt-cache"};
    size_t k;
    int r = cli_value_opt("generate", argc, argv, i, names, sizeof names / sizeof names[0], &k, &v);
    if (r <= 0)
        return r;
    switch (k) {
    case 0: case 1: o->prompt_arg = v; return 1;
    case 2: case 3: o->prompt_file = v; return 1;
    case 4: case 5: return cli_parse_u64("generate", a, v, 1, 1u << 24, &o->n_predict) ? 1 : -1;
    case 6:
        if (o->n_stops == MAX_STOPS) {
            fprintf(stderr, "vkinfer generate: at most %d --stop strings\n", MAX_STOPS);
            return -1;
        }
        o->stops[o->n_stops++] = argv[*i]; /* unescaped once every option is read (--no-escape) */
        return 1;
    case 7: o->system = v; return 1;
    case 8: o->chat_template = v; return 1;
    default: o->prompt_cache = v; return 1;
    }
}

int vki_cli_generate(int argc, char **argv)
{
    cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    gen_opts o = {.n_predict = 128, .sp = vki_sampling_default_params()};
    o.sp.temperature = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_engine_opt(argc, argv, &i, &eo);
        if (r == 0)
            r = cli_sampling_opt("generate", argc, argv, &i, &o.sp);
        if (r == 0)
            r = gen_opt(argc, argv, &i, &o);
        if (r == 0)
            r = cli_constraint_opt("generate", argc, argv, &i, &o.con);
        if (r < 0) {
            cli_constraint_free(&o.con);
            return 2;
        }
        if (r > 0)
            continue;
        cli_constraint_free(&o.con);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "vkinfer generate: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        return 2;
    }
    bool bad = !o.prompt_arg == !o.prompt_file;
    if (bad)
        fprintf(stderr, "vkinfer generate: %s\n", o.prompt_file ? "-p and -f together: give one prompt"
                                                                : "no prompt (-p TEXT, -p - for stdin, or -f FILE)");
    if (!bad && o.prompt_cache_ro && !o.prompt_cache)
        bad = true, fprintf(stderr, "vkinfer generate: --prompt-cache-ro without --prompt-cache FILE\n");
    for (uint32_t s = 0; s < o.n_stops && !o.no_escape && !bad; s++)
        bad = !cli_unescape("generate", "--stop", o.stops[s]);
    for (uint32_t s = 0; s < o.n_stops && !bad; s++)
        if ((bad = !o.stops[s][0]))
            fprintf(stderr, "vkinfer generate: --stop: an empty stop string\n");
    int rc = bad ? 2 : run(&eo, &o);
    cli_constraint_free(&o.con);
    return rc;
}
