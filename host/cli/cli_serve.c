/* `vkinfer serve`: the OpenAI-compatible HTTP server (host/server/server.h) as a program.
 *
 * The port is bound before the model loads, so an occupied port is reported at once.
 *
 * Signals: SIGINT and SIGTERM are blocked in every thread (the mask is set before any thread
 * starts) and taken with sigwait() by the main thread, so no handler and no global flag are
 * needed. The first one stops accepting connections and drains: running requests get up to
 * --drain-timeout seconds to finish; then (or at a second signal) whatever is left is cancelled,
 * every request still gets its final response, and the program exits 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/cli/cli.h"
#include "host/cli/cli_common.h"
#include "host/server/server.h"
#include "host/util/strbuf.h"

#define MAX_LIST 64

typedef struct serve_opts {
    srv_params p;
    double drain_s;
    const char *keys[MAX_LIST], *origins[MAX_LIST];
    uint32_t n_keys, n_origins;
    strbuf key_file;           /* --api-key-file contents (keys point into it) */
    srv_repo_params repo;      /* --model-repository DIR: dir set */
    const char *load[MAX_LIST];
} serve_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkinfer serve -m MODEL.gguf [options]\n"
            "       vkinfer serve --model-repository DIR [options]\n"
            "OpenAI-compatible API: POST /v1/completions, /v1/chat/completions (stream: true -> SSE),\n"
            "/v1/embeddings, /tokenize, /detokenize; GET /v1/models, /props, /version, /health,\n"
            "/health/ready, /metrics (Prometheus). KServe v2 / Triton: /v2, /v2/health/live|ready,\n"
            "/v2/models/NAME[/ready|/config|/stats|/infer|/generate|/generate_stream], /v2/repository/...\n"
            "  --model-repository DIR  serve every model of DIR (DIR/NAME/model.gguf + optional config.json,\n"
            "                          or DIR/NAME.gguf), each with its own engine and batch manager; requests\n"
            "                          pick one by \"model\"; --device-memory MIB is the budget they share\n"
            "  --model-control M       none (load all at start), explicit (--load-model at start, then\n"
            "                          /v2/repository/models/NAME/load|unload), poll (load all, rescan DIR)\n"
            "  --load-model NAME       explicit: load NAME at start (repeatable; * = all)\n"
            "  --repository-poll-secs S  poll: seconds between scans (15)\n"
            "  --unload-timeout S      running requests of a model being unloaded get this long (30)\n"
            "  --session-idle S        a session's pinned KV is released after S idle seconds (300)\n"
            "  --session-max-blocks N  KV blocks all sessions may pin (0 = half the pool)\n"
            "  --session-dir DIR       enable POST /v1/sessions/ID/save and /restore {\"filename\": NAME}: a\n"
            "                          session's KV to and from DIR/NAME (plain names only)\n"
            "  --host ADDR             address to listen on (127.0.0.1; 0.0.0.0 or :: for all)\n"
            "  --port N                port (8080; 0 = any free port, printed at start)\n"
            "  --api-key KEY           require Authorization: Bearer KEY on /v1/*, /props, /tokenize,\n"
            "                          /detokenize (repeatable; /health, /metrics and /version stay open)\n"
            "  --api-key-file FILE     more keys, one per line\n"
            "  --cors-origin ORIGIN    allow browser requests from ORIGIN (repeatable; * = any)\n"
            "  --model-id NAME         the model name in responses (default: the file name without .gguf;\n"
            "                          -a / --alias as in llama-server);\n"
            "                          the \"model\" field of requests is accepted whatever it says\n"
            "  --chat-template NAME    chatml|llama3|llama2|mistral|zephyr|gemma|phi3|deepseek|harmony|tulu|\n"
            "                          granite|smollm3|exaone|glm4|command-r|plain\n"
            "                          (default: recognise the GGUF's tokenizer.chat_template; plain when\n"
            "                          absent or unknown)\n"
            "  --pooling mean|last     /v1/embeddings: pool the final hidden state over the prompt (default:\n"
            "                          the model's pooling_type, e.g. Qwen3-Embedding's last; else mean)\n"
            "  --body-limit BYTES      largest request body; larger -> 413 (1048576)\n"
            "  --max-connections N     connections served at once; past it 503 + Retry-After, while /health\n"
            "                          and /metrics are still answered (512)\n"
            "  --request-timeout S     to receive a request's headers and body, in all; 408 past it (30)\n"
            "  --idle-timeout S        close keep-alive connections idle this long (60)\n"
            "  --stats-interval S      a one-line summary this often while busy; 0 = never (10)\n"
            "  --drain-timeout S       on SIGINT/SIGTERM, let running requests finish this long (30)\n"
            "batching:\n"
            "  --policy P              max-util (default: admit by the next step, pause and recompute the\n"
            "                          newest when KV runs short), guaranteed (reserve each request's whole\n"
            "                          max_tokens: no pauses, fewer requests at once), static\n"
            "  --max-batch-size N      requests in the batch (default: the engine's sequence slots)\n"
            "  --max-num-tokens N      tokens per step (8192)\n"
            "  --chunk-size N          prefill chunk, a multiple of the page size (512)\n"
            "  --max-queue N           waiting requests before 429 (1024; 0 = unbounded)\n"
            "  --max-logits-mb N       a request's logits outputs (v2 return_generation_logits: beams x\n"
            "                          max_tokens x vocabulary x 4 bytes) at most N MiB; more -> 400 before\n"
            "                          it runs (64)\n"
            "  --no-block-reuse        do not reuse KV blocks of shared prompt prefixes\n");
    cli_engine_opts_help(f);
}

/* --api-key-file: one key per line (blank lines and surrounding spaces ignored). */
static bool read_key_file(serve_opts *o, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "vkinfer serve: --api-key-file %s: cannot open it\n", path);
        return false;
    }
    char buf[4096];
    size_t n;
    strbuf_clear(&o->key_file);
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        strbuf_put(&o->key_file, buf, n);
    fclose(f);
    if (!strbuf_put(&o->key_file, "", 0))
        return false;
    for (char *line = strtok(o->key_file.p, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        while (*line == ' ' || *line == '\t')
            line++;
        char *end = line + strlen(line);
        while (end > line && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = 0;
        if (!*line)
            continue;
        if (o->n_keys == MAX_LIST) {
            fprintf(stderr, "vkinfer serve: at most %d API keys\n", MAX_LIST);
            return false;
        }
        o->keys[o->n_keys++] = line;
    }
    if (!o->n_keys)
        fprintf(stderr, "vkinfer serve: --api-key-file %s holds no key\n", path);
    return o->n_keys > 0;
}

static bool add_item(const char **list, uint32_t *n, const char *v, const char *opt)
{
    if (*n == MAX_LIST || !*v) {
        fprintf(stderr, "vkinfer serve: %s: %s\n", opt, *v ? "too many" : "empty value");
        return false;
    }
    list[(*n)++] = v;
    return true;
}

/* Server and batching options; 1 consumed, 0 not ours, -1 bad value. */
static int serve_opt(int argc, char **argv, int *i, serve_opts *o)
{
    srv_params *p = &o->p;
    const char *a = argv[*i], *v;
    uint64_t u;
    if (!strcmp(a, "--no-block-reuse")) {
        p->batch.block_reuse = false;
        return 1;
    }
    static const char *const names[] = {"--host", "--port", "--model-id", "--chat-template", "--body-limit",
                                        "--max-connections", "--idle-timeout", "--drain-timeout", "--policy",
                                        "--max-batch-size", "--max-num-tokens", "--chunk-size", "--max-queue",
                                        "--api-key", "--api-key-file", "--cors-origin", "--request-timeout",
                                        "--stats-interval", "--pooling", "--model-repository", "--model-control",
                                        "--load-model", "--repository-poll-secs", "--unload-timeout",
                                        "--session-idle", "--session-max-blocks", "--session-dir",
                                        "--max-logits-mb", "-a", "--alias"}; /* the last two: llama-server's */
    size_t k;
    int r = cli_value_opt("serve", argc, argv, i, names, sizeof names / sizeof names[0], &k, &v);
    if (r <= 0)
        return r;
    bool ok = true;
    switch (k) {
    case 0: p->host = v; break;
    case 1: ok = cli_parse_u64("serve", a, v, 0, 65535, &u); p->port = (uint16_t)u; break;
    case 2: p->model_id = v; break;
    case 3: p->chat_template = v; break;
    case 4: ok = cli_parse_u64("serve", a, v, 1024, 1ull << 30, &u); p->body_limit = (size_t)u; break;
    case 5: ok = cli_parse_u64("serve", a, v, 1, 65536, &u); p->max_connections = (uint32_t)u; break;
    case 6: ok = cli_parse_u64("serve", a, v, 1, 86400, &u); p->idle_timeout_s = (uint32_t)u; break;
    case 7: ok = cli_parse_u64("serve", a, v, 0, 86400, &u); o->drain_s = (double)u; break;
    case 8:
        ok = !strcmp(v, "guaranteed") || !strcmp(v, "max-util") || !strcmp(v, "static");
        p->batch.policy = !strcmp(v, "guaranteed") ? VKI_POLICY_GUARANTEED_NO_EVICT
                        : !strcmp(v, "static")     ? VKI_POLICY_STATIC
                                                   : VKI_POLICY_MAX_UTILIZATION;
        if (!ok)
            fprintf(stderr, "vkinfer serve: --policy is max-util, guaranteed or static, got '%s'\n", v);
        break;
    case 9: ok = cli_parse_u64("serve", a, v, 1, 1u << 20, &u); p->batch.max_batch_size = (uint32_t)u; break;
    case 10: ok = cli_parse_u64("serve", a, v, 1, 1u << 24, &u); p->batch.max_num_tokens = (uint32_t)u; break;
    case 11: ok = cli_parse_u64("serve", a, v, 1, 1u << 24, &u); p->batch.chunk_size = (uint32_t)u; break;
    case 12: ok = cli_parse_u64("serve", a, v, 0, INT32_MAX, &u); p->batch.max_queue = (uint32_t)u; break;
    case 13: ok = add_item(o->keys, &o->n_keys, v, a); break;
    case 14: ok = read_key_file(o, v); break;
    case 15: ok = add_item(o->origins, &o->n_origins, v, a); break;
    case 16: ok = cli_parse_u64("serve", a, v, 1, 86400, &u); p->request_timeout_s = (uint32_t)u; break;
    case 17: ok = cli_parse_u64("serve", a, v, 0, 86400, &u); p->stats_interval_s = (uint32_t)u; break;
    case 19: o->repo.dir = v; break;
    case 20:
        ok = !strcmp(v, "none") || !strcmp(v, "explicit") || !strcmp(v, "poll");
        o->repo.control = !strcmp(v, "explicit") ? SRV_CONTROL_EXPLICIT : !strcmp(v, "poll") ? SRV_CONTROL_POLL
                                                                                               : SRV_CONTROL_NONE;
        if (!ok)
            fprintf(stderr, "vkinfer serve: --model-control is none, explicit or poll, got '%s'\n", v);
        break;
    case 21: ok = add_item(o->load, &o->repo.n_load_models, v, a); break;
    case 22: ok = cli_parse_u64("serve", a, v, 1, 86400, &u); o->repo.poll_s = (uint32_t)u; break;
    case 23: ok = cli_parse_u64("serve", a, v, 0, 86400, &u); o->repo.unload_timeout_s = (double)u; break;
    case 24: ok = cli_parse_u64("serve", a, v, 1, 30 * 86400, &u); p->batch.session_idle_s = (double)u; break;
    case 25: ok = cli_parse_u64("serve", a, v, 0, UINT32_MAX, &u); p->batch.session_max_blocks = (uint32_t)u; break;
    case 26: p->session_dir = v; break;
    case 27: ok = cli_parse_u64("serve", a, v, 1, 1u << 16, &u); p->batch.max_logits_bytes = u << 20; break;
    case 28: case 29: p->model_id = v; break;
    case 18:
        ok = !strcmp(v, "mean") || !strcmp(v, "last");
        p->pooling = !strcmp(v, "last") ? VKI_POOL_LAST : VKI_POOL_MEAN;
        if (!ok)
            fprintf(stderr, "vkinfer serve: --pooling is mean or last, got '%s'\n", v);
        break;
    }
    return ok ? 1 : -1;
}

/* Waits for SIGINT/SIGTERM, drains for up to drain_s (a second signal ends the wait). */
static void wait_and_drain(srv *s, const sigset_t *set, double drain_s)
{
    int sig = 0;
    sigwait(set, &sig);
    fprintf(stderr, "vkinfer serve: %s: no new connections; draining running requests (up to %.0f s)\n",
            strsignal(sig), drain_s);
    srv_drain_begin(s);
    double end = cli_now_s() + drain_s;
    struct timespec zero = {0, 0};
    while (!srv_wait_idle(s, 0.1)) {
        if (sigtimedwait(set, NULL, &zero) > 0) {
            fprintf(stderr, "vkinfer serve: second signal: cancelling what is left\n");
            return;
        }
        if (cli_now_s() >= end) {
            fprintf(stderr, "vkinfer serve: drain timeout: cancelling what is left\n");
            return;
        }
    }
}

static int serve_repo_or_model(serve_opts *so, cli_engine_opts *eo, const sigset_t *set);

int vki_cli_serve(int argc, char **argv)
{
    cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    serve_opts o = {.p = srv_default_params(), .drain_s = 30, .repo = srv_repo_default_params()};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_engine_opt(argc, argv, &i, &eo);
        if (r == 0)
            r = serve_opt(argc, argv, &i, &o);
        if (r < 0) {
            strbuf_free(&o.key_file);
            return 2;
        }
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "vkinfer serve: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        strbuf_free(&o.key_file);
        return 2;
    }
    srv_params *p = &o.p;
    if (eo.verbose > 1)
        p->log_level = VKI_LOG_DEBUG;
    p->model_path = eo.model;
    p->api_keys = o.keys;
    p->n_api_keys = o.n_keys;
    p->cors_origins = o.origins;
    p->n_cors_origins = o.n_origins;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread exists: all of them inherit it */
    signal(SIGPIPE, SIG_IGN);
    char err[512] = "";
    /* the port first: an occupied one is reported before seconds of model loading */
    if (srv_listen(p->host, p->port, &p->listen_fd, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "vkinfer serve: %s\n", err);
        strbuf_free(&o.key_file);
        return 1;
    }
    if (o.repo.dir || eo.model)
        return serve_repo_or_model(&o, &eo, &set);
    fprintf(stderr, "vkinfer: no model given (-m FILE.gguf, or --model-repository DIR)\n");
    close(p->listen_fd);
    strbuf_free(&o.key_file);
    return 1;
}

/* -m FILE: one engine; --model-repository DIR: the repository's models (repo.c). */
static int serve_repo_or_model(serve_opts *so, cli_engine_opts *eo, const sigset_t *set)
{
    serve_opts o = *so; /* the key list points into so->key_file, freed below through so */
    srv_params *p = &o.p;
    char err[512] = "";
    if (o.repo.dir) {
        if (eo->model) {
            fprintf(stderr, "vkinfer serve: -m and --model-repository exclude each other\n");
            close(p->listen_fd);
            strbuf_free(&so->key_file);
            return 2;
        }
        if (o.repo.n_load_models && o.repo.control != SRV_CONTROL_EXPLICIT)
            fprintf(stderr, "vkinfer serve: warning: --load-model applies to --model-control explicit only\n");
        o.repo.load_models = o.load;
        o.repo.engine = eo->p;
        if (!o.repo.engine.device.log)
            o.repo.engine.device.log = cli_log_stderr;
        o.repo.memory_budget = eo->p.device_memory_limit; /* shared by all the models */
        o.repo.engine.device_memory_limit = 0;            /* each load gets what is left */
        srv *s = NULL;
        vki_status st = srv_create_repo(p, &o.repo, &s, err, sizeof err);
        strbuf_free(&so->key_file);
        if (st != VKI_OK) {
            fprintf(stderr, "vkinfer serve: %s\n", err[0] ? err : vki_status_str(st));
            return 1;
        }
        wait_and_drain(s, set, o.drain_s);
        srv_destroy(s);
        fprintf(stderr, "vkinfer serve: stopped\n");
        return 0;
    }
    vki_engine *e = cli_open_engine(eo);
    if (!e) {
        close(p->listen_fd);
        strbuf_free(&so->key_file);
        return 1;
    }
    srv *s = NULL;
    vki_status st = srv_create(e, p, &s, err, sizeof err); /* takes the socket, even on failure */
    strbuf_free(&so->key_file);
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer serve: %s\n", err[0] ? err : vki_status_str(st));
        vki_engine_destroy(e);
        return 1;
    }
    wait_and_drain(s, set, o.drain_s);
    srv_destroy(s);
    vki_engine_destroy(e);
    fprintf(stderr, "vkinfer serve: stopped\n");
    return 0;
}
