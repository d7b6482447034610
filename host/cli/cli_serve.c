/* `vkinfer serve`: the OpenAI-compatible HTTP server (host/server/server.h) as a program.
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
#include <sys/resource.h>
#include <time.h>

#include "host/cli/cli.h"
#include "host/cli/cli_common.h"
#include "host/server/server.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkinfer serve -m MODEL.gguf [options]\n"
            "OpenAI-compatible API: POST /v1/completions, /v1/chat/completions (stream: true -> SSE);\n"
            "GET /v1/models, /health, /health/ready, /metrics (Prometheus).\n"
            "  --host ADDR             address to listen on (127.0.0.1; 0.0.0.0 or :: for all)\n"
            "  --port N                port (8080; 0 = any free port, printed at start)\n"
            "  --model-id NAME         the model name in responses (default: the file name without .gguf);\n"
            "                          the \"model\" field of requests is accepted whatever it says\n"
            "  --chat-template NAME    chatml|llama3|llama2|mistral|zephyr|gemma|phi3|plain (default: recognise\n"
            "                          the GGUF's tokenizer.chat_template; plain when absent or unknown)\n"
            "  --body-limit BYTES      largest request body; larger -> 413 (1048576)\n"
            "  --max-connections N     open connections (512)\n"
            "  --idle-timeout S        close keep-alive connections idle this long (60)\n"
            "  --drain-timeout S       on SIGINT/SIGTERM, let running requests finish this long (30)\n"
            "batching:\n"
            "  --policy P              guaranteed (no eviction), max-util (pause and resume), static\n"
            "  --max-batch-size N      requests in the batch (default: the engine's sequence slots)\n"
            "  --max-num-tokens N      tokens per step (8192)\n"
            "  --chunk-size N          prefill chunk, a multiple of the page size (512)\n"
            "  --max-queue N           waiting requests before 429 (1024; 0 = unbounded)\n"
            "  --no-block-reuse        do not reuse KV blocks of shared prompt prefixes\n");
    cli_engine_opts_help(f);
}

/* Server and batching options; 1 consumed, 0 not ours, -1 bad value. */
static int serve_opt(int argc, char **argv, int *i, srv_params *p, double *drain_s)
{
    const char *a = argv[*i], *v;
    uint64_t u;
    if (!strcmp(a, "--no-block-reuse")) {
        p->batch.block_reuse = false;
        return 1;
    }
    static const char *const names[] = {"--host", "--port", "--model-id", "--chat-template", "--body-limit",
                                        "--max-connections", "--idle-timeout", "--drain-timeout", "--policy",
                                        "--max-batch-size", "--max-num-tokens", "--chunk-size", "--max-queue"};
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
    case 7: ok = cli_parse_u64("serve", a, v, 0, 86400, &u); *drain_s = (double)u; break;
    case 8:
        ok = !strcmp(v, "guaranteed") || !strcmp(v, "max-util") || !strcmp(v, "static");
        p->batch.policy = !strcmp(v, "max-util") ? VKI_POLICY_MAX_UTILIZATION
                        : !strcmp(v, "static")   ? VKI_POLICY_STATIC
                                                 : VKI_POLICY_GUARANTEED_NO_EVICT;
        if (!ok)
            fprintf(stderr, "vkinfer serve: --policy is guaranteed, max-util or static, got '%s'\n", v);
        break;
    case 9: ok = cli_parse_u64("serve", a, v, 1, 1u << 20, &u); p->batch.max_batch_size = (uint32_t)u; break;
    case 10: ok = cli_parse_u64("serve", a, v, 1, 1u << 24, &u); p->batch.max_num_tokens = (uint32_t)u; break;
    case 11: ok = cli_parse_u64("serve", a, v, 1, 1u << 24, &u); p->batch.chunk_size = (uint32_t)u; break;
    default: ok = cli_parse_u64("serve", a, v, 0, INT32_MAX, &u); p->batch.max_queue = (uint32_t)u; break;
    }
    return ok ? 1 : -1;
}

/* Each connection holds a socket and an eventfd: let the process open as many as it may. */
static void raise_fd_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
    }
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

int vki_cli_serve(int argc, char **argv)
{
    cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    srv_params p = srv_default_params();
    double drain_s = 30;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = cli_engine_opt(argc, argv, &i, &eo);
        if (r == 0)
            r = serve_opt(argc, argv, &i, &p, &drain_s);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "vkinfer serve: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        return 2;
    }
    if (eo.verbose > 1)
        p.log_level = VKI_LOG_DEBUG;
    p.model_path = eo.model;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread exists: all of them inherit it */
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();
    vki_engine *e = cli_open_engine(&eo);
    if (!e)
        return 1;
    srv *s = NULL;
    char err[512] = "";
    vki_status st = srv_create(e, &p, &s, err, sizeof err);
    if (st != VKI_OK) {
        fprintf(stderr, "vkinfer serve: %s\n", err[0] ? err : vki_status_str(st));
        vki_engine_destroy(e);
        return 1;
    }
    wait_and_drain(s, &set, drain_s);
    srv_destroy(s);
    vki_engine_destroy(e);
    fprintf(stderr, "vkinfer serve: stopped\n");
    return 0;
}
