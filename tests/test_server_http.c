/* The server's HTTP layer, against `vkinfer serve` in a child process over the tiny synthetic
 * model (the connection handling, not the model, is under test): strict request parsing (a body
 * length given two ways, folded or malformed headers, bad chunk sizes are 400s; chunked bodies,
 * 100-continue, pipelining and HTTP/1.0 work), API keys and CORS, a client that half-closes its
 * socket (answered, not cancelled), 1,000 clients at once against --max-connections 64 (every one
 * gets an answer or a 503 with Retry-After, never a reset, and the server's threads stay bounded),
 * clients that trickle their headers (they get 408 after --request-timeout, and /health is
 * answered meanwhile), the access log and the periodic stats line.
 *
 * `test_server_http load` runs the load test instead (its own ctest entry, test_server_load):
 * 2,000 streaming requests from 64 clients (tools/loadgen.c, included), with an API key, of which
 * 10% hang up at random points; no failures, every other request complete, no KV block left in
 * use, resident memory growth within RSS_BOUND_MIB, and without the key a 401. */
#define LOADGEN_NO_MAIN
#include "tools/loadgen.c"

#include "support/srv_child.h"
#include "support/vt.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/synth.h"

#define MAX_CONN 64        /* --max-connections of the child */
#define REQ_TIMEOUT_S 2    /* --request-timeout of the child */
#define THREAD_SLACK 24    /* threads besides one handler per connection: io, batch worker, the
                              Vulkan driver's (lavapipe: one per core + its queue), sanitizer */

typedef struct H {
    char model[256], log[256];
    pid_t pid;
    uint16_t port;
} H;

static double now_s(void) { return lg_now(); }

/* ---- raw sockets ---------------------------------------------------------------------------- */

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a))
        fail_msg("connect: %s", strerror(errno));
    return fd;
}

static void raw_send(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            fail_msg("send: %s", strerror(errno));
        s += w;
        n -= (size_t)w;
    }
}

/* Reads until the server closes (or the receive timeout); *reset: it ended with a reset. */
static char *raw_read_all(int fd, size_t *n, bool *reset)
{
    size_t cap = 65536, len = 0;
    char *b = malloc(cap);
    *reset = false;
    for (;;) {
        if (len + 4096 > cap)
            b = realloc(b, cap *= 2);
        ssize_t r = recv(fd, b + len, cap - len - 1, 0);
        if (r > 0) {
            len += (size_t)r;
            continue;
        }
        *reset = r < 0 && errno == ECONNRESET;
        break;
    }
    b[len] = 0;
    *n = len;
    return b;
}

/* One request on a fresh connection, read to the server's close; the final status (interim 1xx
 * answers skipped) and the whole answer in *out. */
static int raw_exchange(const H *h, const char *req, char **out)
{
    int fd = raw_connect(h->port);
    raw_send(fd, req, strlen(req));
    size_t n;
    bool reset;
    char *b = raw_read_all(fd, &n, &reset);
    close(fd);
    int status = -1;
    const char *p = b;
    while (p && sscanf(p, "HTTP/1.%*d %d", &status) == 1 && status < 200) {
        p = strstr(p, "\r\n\r\n");
        p = p ? p + 4 : NULL;
    }
    if (out)
        *out = b;
    else
        free(b);
    return status;
}

static const char *body_of(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");
    return b ? b + 4 : "";
}

#define AUTH "Authorization: Bearer key-one\r\n"

/* ---- fixture -------------------------------------------------------------------------------- */

/* The model file (and the descriptor limit raised); the child starts in setup or in the test. */
static int setup_model(void **state)
{
    vt_pin_vulkan_libraries();
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl; /* 1,000 client sockets */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    H *h = calloc(1, sizeof *h);
    snprintf(h->model, sizeof h->model, "/tmp/vki_test_server_http_%d.gguf", (int)getpid());
    snprintf(h->log, sizeof h->log, "/tmp/vki_test_server_http_%d.log", (int)getpid());
    synth_params sp = synth_default_params();
    char err[256] = "";
    if (synth_preset("tiny", &sp) != VKI_OK || synth_write(&sp, h->model, err, sizeof err) != VKI_OK) {
        printf("cannot write %s: %s\n", h->model, err);
        free(h);
        return -1;
    }
    *state = h;
    return 0;
}

static int setup(void **state)
{
    if (setup_model(state))
        return -1;
    H *h = *state;
    static const char *const args[] = {"--max-connections", "64", "--request-timeout", "2", "--api-key", "key-one",
                                       "--api-key", "key-two", "--cors-origin", "https://app.example",
                                       "--stats-interval", "1", "--kv-tokens", "16384", "--max-seqs", "64", NULL};
    h->pid = srvc_spawn(h->model, h->log, args, &h->port);
    return 0;
}

static int teardown(void **state)
{
    H *h = *state;
    if (!h)
        return 0;
    int rc = h->pid > 0 ? srvc_stop(h->pid) : 0;
    unlink(h->model);
    if (rc)
        printf("vkinfer serve exited %d; its log: %s\n", rc, h->log);
    else
        unlink(h->log);
    free(h);
    return rc ? -1 : 0;
}

/* ---- strict parsing ---------------------------------------------------------------------------- */

typedef struct raw_case {
    const char *req;
    int status;
    const char *in_body; /* NULL: not checked */
} raw_case;

static const raw_case RAW[] = {
    /* a body length given two ways: the request-smuggling case, refused */
    {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
     "0\r\n\r\n", 400, "Content-Length and Transfer-Encoding"},
    {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: 3\r\nContent-Length: 4\r\n\r\n{}}", 400,
     "Content-Length"},
    {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: +3\r\n\r\n{} ", 400, "Content-Length"},
    {"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  folded\r\n\r\n", 400, "folding"},
    {"GET /health HTTP/1.1\r\nHost : x\r\n\r\n", 400, "header name"},
    {"GET /health HTTP/1.1\r\nHost: x\rX: y\r\n\r\n", 400, "bare CR"},
    {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunk size"},
    {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Transfer-Encoding: gzip\r\n\r\n", 501, "gzip"},
    {"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 505, NULL},
    {"GET health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "path"},
    {"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, "unknown route"},
    {"DELETE /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405, "not allowed"},
    {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Expect: magic\r\n\r\n", 417, NULL},
    /* what must work: chunked bodies (with an extension and a trailer), 100-continue, HTTP/1.0 */
    {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
     "6;ext=1\r\n{\"cont\r\n9\r\nent\":\"a\"}\r\n0\r\nX-Trailer: t\r\n\r\n", 200, "\"tokens\""},
    {"GET /health HTTP/1.0\r\n\r\n", 200, "\"ok\""},
    /* strict JSON behind a valid HTTP request */
    {"POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Connection: close\r\nContent-Length: 26\r\n\r\n"
     "{\"content\":\"a\"}{\"content\":1}", 400, "after the JSON value"},
};

static void test_strict_http(void **state)
{
    H *h = *state;
    for (size_t i = 0; i < sizeof RAW / sizeof RAW[0]; i++) {
        char *out;
        int st = raw_exchange(h, RAW[i].req, &out);
        if (st != RAW[i].status || (RAW[i].in_body && !strstr(body_of(out), RAW[i].in_body)))
            fail_msg("case %zu: got %d, want %d with '%s':\n%s", i, st, RAW[i].status,
                     RAW[i].in_body ? RAW[i].in_body : "", out);
        free(out);
    }
    /* Expect: 100-continue: the interim answer, then the body, then the answer */
    static const char head[] = "POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Expect: 100-continue\r\n"
                               "Connection: close\r\nContent-Length: 15\r\n\r\n";
    int fd = raw_connect(h->port);
    raw_send(fd, head, sizeof head - 1);
    char cont[64] = "";
    ssize_t got = recv(fd, cont, sizeof cont - 1, 0);
    assert_true(got > 0);
    assert_string_equal(cont, "HTTP/1.1 100 Continue\r\n\r\n");
    raw_send(fd, "{\"content\":\"a\"}", 15);
    size_t n;
    bool reset;
    char *out = raw_read_all(fd, &n, &reset);
    close(fd);
    assert_int_equal(strncmp(out, "HTTP/1.1 200", 12), 0);
    free(out);
    /* two requests in one write (pipelining) on a kept-alive connection: two answers in order */
    assert_int_equal(raw_exchange(h, "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\nHost: x\r\n"
                                     "Connection: close\r\n\r\n", &out), 200);
    const char *second = strstr(out + 1, "HTTP/1.1 200");
    assert_non_null(second);
    assert_non_null(strstr(second, "\"version\""));
    free(out);
    /* HEAD: the headers without the body */
    assert_int_equal(raw_exchange(h, "HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &out), 200);
    assert_string_equal(body_of(out), "");
    assert_non_null(strstr(out, "Content-Length: 15"));
    free(out);
    /* a head larger than the limit */
    size_t big = 20000;
    char *req = malloc(big + 64);
    int k = snprintf(req, 64, "GET /health HTTP/1.1\r\nX-Big: ");
    memset(req + k, 'a', big);
    strcpy(req + k + big, "\r\n\r\n");
    assert_int_equal(raw_exchange(h, req, NULL), 431);
    free(req);
}

/* ---- keys and CORS ------------------------------------------------------------------------------ */

static void test_auth_cors(void **state)
{
    H *h = *state;
    char *out;
    assert_int_equal(raw_exchange(h, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &out), 401);
    cJSON *j = cJSON_Parse(body_of(out));
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "code")->valuestring, "invalid_api_key");
    assert_non_null(strstr(out, "WWW-Authenticate: Bearer"));
    cJSON_Delete(j);
    free(out);
    assert_int_equal(raw_exchange(h, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-on\r\n"
                                     "Connection: close\r\n\r\n", NULL), 401);
    assert_int_equal(raw_exchange(h, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-two\r\n"
                                     "Connection: close\r\n\r\n", NULL), 200);
    assert_int_equal(raw_exchange(h, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                     "Content-Length: 2\r\n\r\n{}", NULL), 401);
    static const char *const open_routes[] = {"/health", "/health/ready", "/metrics", "/version"};
    for (size_t i = 0; i < 4; i++) {
        char req[256];
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", open_routes[i]);
        assert_int_equal(raw_exchange(h, req, NULL), 200);
    }
    /* the preflight needs no key; allowed origins are echoed, others get no CORS header */
    assert_int_equal(raw_exchange(h, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example"
                                     "\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: "
                                     "authorization, content-type\r\nConnection: close\r\n\r\n", &out), 204);
    assert_non_null(strstr(out, "Access-Control-Allow-Origin: https://app.example\r\n"));
    assert_non_null(strstr(out, "Access-Control-Allow-Headers: authorization, content-type\r\n"));
    free(out);
    assert_int_equal(raw_exchange(h, "GET /v1/models HTTP/1.1\r\nHost: x\r\n" AUTH "Origin: https://app.example\r\n"
                                     "Connection: close\r\n\r\n", &out), 200);
    assert_non_null(strstr(out, "Access-Control-Allow-Origin: https://app.example\r\n"));
    free(out);
    assert_int_equal(raw_exchange(h, "GET /v1/models HTTP/1.1\r\nHost: x\r\n" AUTH "Origin: https://evil.example\r\n"
                                     "Connection: close\r\n\r\n", &out), 200);
    assert_null(strstr(out, "Access-Control-Allow-Origin"));
    free(out);
}

/* ---- half-close ----------------------------------------------------------------------------------- */

/* A client that shuts its sending side after the request still gets the whole answer. */
static void half_close(H *h, bool stream)
{
    char body[160], req[512];
    int n = snprintf(body, sizeof body, "{\"prompt\":[5,6,7],\"max_tokens\":12,\"ignore_eos\":true%s}",
                     stream ? ",\"stream\":true" : "");
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: %d\r\n\r\n%s", n,
             body);
    int fd = raw_connect(h->port);
    raw_send(fd, req, strlen(req));
    shutdown(fd, SHUT_WR);
    size_t len;
    bool reset;
    char *out = raw_read_all(fd, &len, &reset);
    close(fd);
    if (reset || !strstr(out, "HTTP/1.1 200") || !strstr(out, stream ? "[DONE]" : "\"completion_tokens\":12"))
        fail_msg("half-closed %s request: %s", stream ? "streaming" : "JSON", out);
    free(out);
}

static void test_half_close(void **state)
{
    H *h = *state;
    half_close(h, false);
    half_close(h, true);
}

/* ---- 1,000 clients at once ------------------------------------------------------------------------- */

typedef struct flood_conn {
    int fd;
    bool sent;
    size_t len;
    char buf[2048];
    int status; /* 0: no answer yet, -1: reset or closed without one */
} flood_conn;

static void test_flood(void **state)
{
    H *h = *state;
    enum { N = 1000 };
    static const char body[] = "{\"prompt\":[5,6,7],\"max_tokens\":2,\"ignore_eos\":true}";
    char req[512];
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" AUTH "Connection: close\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", sizeof body - 1, body);
    flood_conn *c = calloc(N, sizeof *c);
    struct pollfd *pf = calloc(N, sizeof *pf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(h->port), .sin_addr.s_addr = htonl(0x7f000001)};
    for (int i = 0; i < N; i++) {
        c[i].fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        assert_true(c[i].fd >= 0);
        if (connect(c[i].fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS)
            fail_msg("connect %d: %s", i, strerror(errno));
    }
    int left = N, max_threads = 0;
    for (double end = now_s() + 120; left && now_s() < end;) {
        for (int i = 0; i < N; i++)
            pf[i] = (struct pollfd){.fd = c[i].status ? -1 : c[i].fd, .events = c[i].sent ? POLLIN : POLLOUT};
        poll(pf, N, 100);
        int th = srvc_threads(h->pid);
        max_threads = th > max_threads ? th : max_threads;
        for (int i = 0; i < N; i++) {
            if (c[i].status || !pf[i].revents)
                continue;
            if (!c[i].sent) {
                ssize_t w = send(c[i].fd, req, strlen(req), MSG_NOSIGNAL);
                c[i].sent = w == (ssize_t)strlen(req);
                if (!c[i].sent)
                    c[i].status = -1, left--;
                continue;
            }
            ssize_t r = recv(c[i].fd, c[i].buf + c[i].len, sizeof c[i].buf - 1 - c[i].len, 0);
            if (r > 0) {
                c[i].len += (size_t)r;
                continue;
            }
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            c[i].buf[c[i].len] = 0;
            int st = 0;
            c[i].status = r == 0 && sscanf(c[i].buf, "HTTP/1.1 %d", &st) == 1 ? st : -1;
            left--;
        }
    }
    int ok = 0, busy = 0, none = 0, other = 0, retry_after = 0;
    for (int i = 0; i < N; i++) {
        ok += c[i].status == 200;
        busy += c[i].status == 503;
        retry_after += c[i].status == 503 && strstr(c[i].buf, "Retry-After: ") != NULL;
        none += c[i].status <= 0;
        other += c[i].status > 0 && c[i].status != 200 && c[i].status != 503;
        close(c[i].fd);
    }
    printf("1000 clients, --max-connections %d: %d answered, %d got 503, %d without an answer; server threads at "
           "most %d\n", MAX_CONN, ok, busy, none, max_threads);
    assert_int_equal(none, 0);
    assert_int_equal(other, 0);
    assert_true(ok >= 1 && ok + busy == N);
    assert_int_equal(retry_after, busy);
    assert_true(max_threads <= MAX_CONN + THREAD_SLACK);
    free(c);
    free(pf);
}

/* ---- clients that trickle their headers -------------------------------------------------------------- */

static void test_trickle(void **state)
{
    H *h = *state;
    enum { N = 100 };
    int fd[N];
    for (int i = 0; i < N; i++) {
        fd[i] = raw_connect(h->port);
        raw_send(fd[i], "GET /health HTTP/1.1\r\nX-Slow: ", 30);
    }
    usleep(300000);
    /* every slot is held by a trickler: probes are still answered, other requests get 503 */
    char *out;
    assert_int_equal(raw_exchange(h, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &out), 200);
    free(out);
    assert_int_equal(raw_exchange(h, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", &out), 200);
    assert_non_null(strstr(out, "vkinfer_open_connections 64\n"));
    free(out);
    assert_int_equal(raw_exchange(h, "GET /v1/models HTTP/1.1\r\nHost: x\r\n" AUTH "Connection: close\r\n\r\n", &out),
                     503);
    assert_non_null(strstr(out, "Retry-After: 1"));
    free(out);
    /* they keep trickling; past --request-timeout each gets 408 and is closed */
    double t0 = now_s();
    int n_408 = 0;
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 4 * REQ_TIMEOUT_S && send(fd[i], "a", 1, MSG_NOSIGNAL) == 1 && now_s() - t0 < 1.0; k++)
            usleep(10000);
        size_t n;
        bool reset;
        char *b = raw_read_all(fd[i], &n, &reset);
        n_408 += !strncmp(b, "HTTP/1.1 408", 12);
        free(b);
        close(fd[i]);
    }
    printf("trickling clients: %d of %d got 408 after %.1f s\n", n_408, N, now_s() - t0);
    assert_int_equal(n_408, N);
    assert_int_equal(raw_exchange(h, "GET /v1/models HTTP/1.1\r\nHost: x\r\n" AUTH "Connection: close\r\n\r\n", NULL),
                     200);
}

/* ---- logs ---------------------------------------------------------------------------------------------- */

static void test_logs(void **state)
{
    H *h = *state;
    static const char body[] = "{\"prompt\":[5,6,7],\"max_tokens\":3,\"ignore_eos\":true}";
    char req[512];
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" AUTH "Connection: close\r\n"
             "Content-Length: %zu\r\n\r\n%s", sizeof body - 1, body);
    assert_int_equal(raw_exchange(h, req, NULL), 200);
    usleep(1200000); /* the stats line comes at most every --stats-interval (1 s) while busy */
    assert_int_equal(raw_exchange(h, req, NULL), 200);
    static const char *const access[] = {"127.0.0.1:", "POST /v1/completions 200", "prompt=3 output=3 cached=",
                                         "ttft=", "total=", "finish=length", NULL};
    static const char *const stats[] = {"stats: ", "running", "KV", "gen tok/s", NULL};
    static const char *const fds[] = {"file descriptors: limit", "503 + Retry-After", NULL};
    static const char *const noise[] = {"warning", NULL}; /* no warning per dropped or refused connection */
    assert_true(srvc_log_has(h->log, access));
    assert_true(srvc_log_has(h->log, stats));
    assert_true(srvc_log_has(h->log, fds));
    assert_false(srvc_log_has(h->log, noise));
}

/* ---- the load test ---------------------------------------------------------------------------- */

#define RSS_BOUND_MIB 64 /* growth of the server's resident memory over the run, after warm-up */
#define LOAD_KEY "load-test-key" /* the load runs with authentication on */

static lg_summary load_run(uint16_t port, const char *n, const char *disconnect, double *wall, lg_req **reqs)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", port);
    char *argv[] = {"loadgen", "--url", url, "-n", (char *)n, "-c", "64", "--input-len", "8", "--output-len", "6",
                    "--token-prompts", "--vocab", "256", "--disconnect", (char *)disconnect, "--timeout", "120",
                    "--api-key", LOAD_KEY};
    lg_opts o;
    lg_opts_default(&o);
    assert_int_equal(lg_parse_args((int)(sizeof argv / sizeof argv[0]), argv, &o), 1);
    char id[128];
    assert_true(lg_probe(&o, id, sizeof id));
    lg_req *r = calloc(o.n_requests, sizeof *r);
    assert_true(lg_run_all(&o, r, wall));
    lg_summary s;
    lg_summarize(&o, r, *wall, &s);
    lg_print_table(&o, &s);
    char *j = lg_summary_json(&o, &s);
    printf("%s\n", j);
    free(j);
    *reqs = r;
    return s;
}

/* One request with the key (or none); the status, the body in *out when not NULL. */
static int load_http(uint16_t port, const char *key, const char *method, const char *path, const char *body, char **out)
{
    lg_http h;
    lg_http_init(&h, "127.0.0.1", port, 120);
    lg_http_auth(&h, key);
    lg_resp r;
    lg_buf b = {0};
    int st = lg_http_request(&h, method, path, body, &r, &b);
    lg_http_close(&h);
    if (out)
        *out = b.p ? b.p : strdup("");
    else
        free(b.p);
    return st;
}

static double load_metric(uint16_t port, const char *name)
{
    double v = NAN;
    if (!lg_metric("127.0.0.1", port, name, &v))
        fail_msg("no metric %s", name);
    return v;
}

static void wait_load_metric(uint16_t port, const char *name, double want)
{
    double end = lg_now() + 60, v = NAN;
    while ((v = load_metric(port, name)) != want && lg_now() < end)
        usleep(2000);
    if (v != want)
        fail_msg("%s stayed %g, want %g", name, v, want);
}

static void test_load(void **state)
{
    H *h = *state;
    uint16_t port;
    static const char *const args[] = {"--kv-tokens", "65536", "--max-seqs", "128", "--api-key", LOAD_KEY, NULL};
    pid_t pid = h->pid = srvc_spawn(h->model, h->log, args, &port);
    h->port = port;
    double wall;
    lg_req *r;
    lg_summary warm = load_run(port, "200", "0", &wall, &r); /* warm-up: pools, caches, thread stacks */
    lg_free_reqs(r, 200);
    assert_int_equal(warm.errors, 0);
    long rss0 = srvc_rss_kib(pid);
    lg_summary s = load_run(port, "2000", "0.1", &wall, &r);
    long rss1 = srvc_rss_kib(pid);
    printf("server RSS: %.1f MiB after warm-up, %.1f MiB after 2000 requests (bound: +%d MiB)\n", rss0 / 1024.0,
           rss1 / 1024.0, RSS_BOUND_MIB);
    if (s.errors)
        fail_msg("%u requests failed; first: %s", s.errors, s.first_error);
    assert_int_equal(s.ok + s.cancelled, 2000);
    assert_true(s.cancelled > 100 && s.cancelled < 300); /* 10% of 2000, drawn */
    for (uint32_t i = 0; i < 2000; i++)
        if (r[i].status == LG_OK)
            assert_int_equal(r[i].out_tokens, r[i].out_len); /* every other request complete */
    lg_free_reqs(r, 2000);
    wait_load_metric(port, "vkinfer_active_requests", 0);
    /* A client that hangs up after the last token was sent cancels nothing: the server may count
     * fewer cancellations than the clients made, never more, and every request one outcome. */
    double cancelled = load_metric(port, "vkinfer_requests_total{outcome=\"cancelled\"}");
    double length = load_metric(port, "vkinfer_requests_total{outcome=\"length\"}");
    printf("server: %.0f cancelled, %.0f finished (clients: %u hung up)\n", cancelled, length, s.cancelled);
    assert_true(cancelled > 0 && cancelled <= s.cancelled);
    assert_true(length >= 200 + s.ok);
    assert_int_equal(cancelled + length, 2200);
    /* a last request makes a tick after the last cancellation (see test_server's test_disconnect) */
    assert_int_equal(load_http(port, LOAD_KEY, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}",
                               NULL), 200);
    wait_load_metric(port, "vkinfer_kv_blocks{state=\"used\"}", 0); /* its tick's stats follow its answer */
    assert_true(rss1 - rss0 < RSS_BOUND_MIB * 1024L);
    /* and without the key: refused */
    assert_int_equal(load_http(port, NULL, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}", NULL),
                     401);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strict_http), cmocka_unit_test(test_auth_cors), cmocka_unit_test(test_half_close),
        cmocka_unit_test(test_flood),       cmocka_unit_test(test_trickle),   cmocka_unit_test(test_logs),
    };
    const struct CMUnitTest load[] = {cmocka_unit_test(test_load)};
    if (argc > 1 && !strcmp(argv[1], "load"))
        return cmocka_run_group_tests_name("server_load", load, setup_model, teardown);
    return cmocka_run_group_tests(tests, setup, teardown);
}
