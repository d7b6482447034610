/* loadgen: a serving benchmark for OpenAI-compatible servers (vkinfer serve, or any other).
 *
 * N concurrent clients (closed loop) or Poisson arrivals at a request rate (with at most -c in
 * flight), fixed or ranged prompt / output lengths (prompts as text of roughly N tokens, or as
 * token-id arrays of exactly N), streaming or not, and a fraction of clients that hang up at a
 * random point. Reports the metrics of vLLM's benchmark_serving: request and token throughput,
 * TTFT (send -> first streamed text), TPOT ((latency - TTFT) / (output tokens - 1)), ITL (gaps
 * between streamed chunks), end-to-end latency, at mean / p50 / p90 / p99; --json for machines.
 *
 * The HTTP/1.1 client is ours (plain sockets, keep-alive, Content-Length and chunked bodies, SSE
 * events) because no client library is available; tests/test_server.c includes this file with
 * LOADGEN_NO_MAIN to reuse it. Exit status: 0 when no request failed (hang-ups are not failures),
 * 1 otherwise, 2 for usage errors. */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/rng.h"
#include "host/util/netio.h"
#include "host/util/strbuf.h"
#include "host/cli/workload.h" /* wl_percentile */

#ifdef LOADGEN_NO_MAIN /* included by tests, each using a different part of it */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#endif

/* ---- HTTP/1.1 client ------------------------------------------------------------------------- */

typedef struct lg_http {
    int fd;                  /* -1: not connected */
    char host[256];
    char port[8];
    double timeout_s;        /* per read / write */
    char auth[512];          /* "Authorization: Bearer KEY\r\n" sent with every request, or "" */
    char buf[16384];         /* bytes read, not yet consumed: [pos, len) */
    size_t pos, len;
} lg_http;

typedef struct lg_resp {
    int status;
    bool chunked, keep_alive;
    long long content_length; /* -1: until close (or chunked) */
    char headers[4096];       /* raw header lines */
} lg_resp;

static double lg_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void lg_http_init(lg_http *h, const char *host, uint16_t port, double timeout_s)
{
    memset(h, 0, sizeof *h);
    h->fd = -1;
    snprintf(h->host, sizeof h->host, "%s", host);
    snprintf(h->port, sizeof h->port, "%u", port);
    h->timeout_s = timeout_s;
}

static void lg_http_close(lg_http *h)
{
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
    h->pos = h->len = 0;
}

static bool lg_http_connect(lg_http *h)
{
    lg_http_close(h);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(h->host, h->port, &hints, &ai))
        return false;
    for (struct addrinfo *a = ai; a && h->fd < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        struct timeval tv = {.tv_sec = (time_t)h->timeout_s,
                             .tv_usec = (suseconds_t)((h->timeout_s - (double)(time_t)h->timeout_s) * 1e6)};
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            h->fd = fd;
        else
            close(fd);
    }
    freeaddrinfo(ai);
    return h->fd >= 0;
}

/* Sends one request on the kept-alive connection (connecting first when there is none). */
static bool lg_http_send(lg_http *h, const char *method, const char *path, const char *body, size_t n,
                         const char *extra_headers)
{
    if (h->fd < 0 && !lg_http_connect(h))
        return false;
    char head[1536];
    int k = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: vkinfer-loadgen\r\nAccept: */*\r\n%s%s%s"
                     "Content-Length: %zu\r\n\r\n",
                     method, path, h->host, h->port, body ? "Content-Type: application/json\r\n" : "", h->auth,
                     extra_headers ? extra_headers : "", body ? n : 0);
    if (k < 0 || (size_t)k >= sizeof head)
        return false;
    return net_send_all(h->fd, head, (size_t)k) && (!body || net_send_all(h->fd, body, n));
}

/* Makes sure at least one unread byte is buffered. false on EOF, error or timeout. */
static bool lg_fill(lg_http *h)
{
    if (h->pos < h->len)
        return true;
    h->pos = h->len = 0;
    for (;;) {
        ssize_t r = recv(h->fd, h->buf, sizeof h->buf, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        h->len = (size_t)r;
        return true;
    }
}

/* One line (CRLF or LF ended, terminator removed) into out[cap]. */
static bool lg_line(lg_http *h, char *out, size_t cap)
{
    size_t n = 0;
    for (;;) {
        if (!lg_fill(h))
            return false;
        char c = h->buf[h->pos++];
        if (c == '\n')
            break;
        if (n + 1 < cap)
            out[n++] = c;
    }
    if (n && out[n - 1] == '\r')
        n--;
    out[n] = 0;
    return true;
}

static const char *lg_header(const lg_resp *r, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = r->headers; *p;) {
        if (!strncasecmp(p, name, n) && p[n] == ':') {
            p += n + 1;
            while (*p == ' ')
                p++;
            return p; /* up to the next '\n' */
        }
        const char *nl = strchr(p, '\n');
        if (!nl)
            break;
        p = nl + 1;
    }
    return NULL;
}

static bool lg_http_head(lg_http *h, lg_resp *r)
{
    memset(r, 0, sizeof *r);
    r->content_length = -1;
    char line[2048];
    do { /* skip interim responses (100 Continue, 102 Processing) */
        if (!lg_line(h, line, sizeof line) || sscanf(line, "HTTP/1.%*d %d", &r->status) != 1)
            return false;
        size_t used = 0;
        while (lg_line(h, line, sizeof line) && line[0]) {
            size_t l = strlen(line);
            if (used + l + 2 < sizeof r->headers) {
                memcpy(r->headers + used, line, l);
                used += l;
                r->headers[used++] = '\n';
                r->headers[used] = 0;
            }
        }
        if (line[0])
            return false;
    } while (r->status >= 100 && r->status < 200);
    const char *v;
    r->keep_alive = !((v = lg_header(r, "Connection")) && !strncasecmp(v, "close", 5));
    r->chunked = (v = lg_header(r, "Transfer-Encoding")) && !strncasecmp(v, "chunked", 7);
    if (!r->chunked && (v = lg_header(r, "Content-Length")))
        r->content_length = strtoll(v, NULL, 10);
    return true;
}

/* Reads the body, handing each piece to fn (chunked encoding removed). fn returns false to stop
 * reading (the caller then closes the connection). Returns 1 at the body's end, 0 when fn
 * stopped, -1 on a read error. */
typedef bool (*lg_data_fn)(void *user, const char *p, size_t n);

static int lg_http_body(lg_http *h, const lg_resp *r, lg_data_fn fn, void *user)
{
    long long left = r->content_length;
    for (;;) {
        if (r->chunked) {
            char line[64];
            if (!lg_line(h, line, sizeof line))
                return -1;
            left = strtoll(line, NULL, 16);
            if (left == 0) {
                while (lg_line(h, line, sizeof line) && line[0]) /* trailers */
                    ;
                return 1;
            }
        } else if (left == 0) {
            return 1;
        }
        while (left != 0) {
            if (!lg_fill(h))
                return r->chunked || left > 0 ? -1 : 1; /* until close: EOF ends it */
            size_t n = h->len - h->pos;
            if (left > 0 && (long long)n > left)
                n = (size_t)left;
            const char *p = h->buf + h->pos;
            h->pos += n;
            if (left > 0)
                left -= (long long)n;
            if (fn && !fn(user, p, n))
                return 0;
        }
        if (!r->chunked)
            return 1;
        char crlf[8];
        if (!lg_line(h, crlf, sizeof crlf))
            return -1;
    }
}

/* Kept under loadgen's names: tests/test_server.c includes this file and uses them. */
typedef strbuf lg_buf;
static bool lg_buf_put(lg_buf *b, const char *s, size_t n) { return strbuf_put(b, s, n); }

static bool lg_collect(void *user, const char *p, size_t n) { return lg_buf_put(user, p, n); }

/* One whole request: status (or -1 on a transport error), headers in *r, body in *body. */
static int lg_http_request(lg_http *h, const char *method, const char *path, const char *body, lg_resp *r,
                           lg_buf *out)
{
    for (int attempt = 0; attempt < 2; attempt++) { /* a kept-alive connection may have been closed */
        bool fresh = h->fd < 0;
        if (lg_http_send(h, method, path, body, body ? strlen(body) : 0, NULL) && lg_http_head(h, r)) {
            int rc = lg_http_body(h, r, lg_collect, out);
            if (rc < 0 || !r->keep_alive)
                lg_http_close(h);
            return rc < 0 ? -1 : r->status;
        }
        lg_http_close(h);
        if (fresh)
            break;
    }
    return -1;
}

/* GET /metrics and the value of one sample line ("name value" or "name{labels} value"); false
 * when the server does not answer or has no such line. (For the tests that include this file.) */
__attribute__((unused)) static bool lg_metric(const char *host, uint16_t port, const char *name, double *out)
{
    lg_http h;
    lg_http_init(&h, host, port, 60);
    lg_resp r;
    lg_buf b = {0};
    int st = lg_http_request(&h, "GET", "/metrics", NULL, &r, &b);
    lg_http_close(&h);
    size_t n = strlen(name);
    bool found = false;
    for (const char *l = st == 200 ? b.p : NULL; l && *l && !found; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, name, n) && l[n] == ' ') {
            *out = strtod(l + n + 1, NULL);
            found = true;
        }
    free(b.p);
    return found;
}

/* Server-Sent Events: bytes in, "data:" payloads out (one callback per event). */
typedef struct lg_sse {
    lg_buf line;
    bool (*on_data)(void *user, const char *data, size_t n); /* false: stop */
    void *user;
} lg_sse;

static bool lg_sse_feed(void *user, const char *p, size_t n)
{
    lg_sse *s = user;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (!lg_buf_put(&s->line, p + i, 1))
                return false;
            continue;
        }
        size_t l = s->line.len;
        const char *t = s->line.p ? s->line.p : "";
        if (l && t[l - 1] == '\r')
            l--;
        bool go = true;
        if (l >= 5 && !strncmp(t, "data:", 5)) {
            size_t off = t[5] == ' ' ? 6 : 5;
            go = s->on_data(s->user, t + off, l - off);
        }
        strbuf_clear(&s->line);
        if (!go)
            return false;
    }
    return true;
}

/* ---- the benchmark ------------------------------------------------------------------------ */

typedef struct lg_opts {
    char host[256];
    uint16_t port;
    bool chat, stream, token_prompts, ignore_eos, json, quiet;
    uint32_t n_requests, concurrency;
    double rate;                     /* 0: closed loop */
    uint32_t in_min, in_max, out_min, out_max;
    uint32_t vocab;                  /* token prompts: ids in [3, vocab) */
    double disconnect;               /* fraction of requests that hang up */
    float temperature;
    uint64_t seed;
    double timeout_s;
    const char *model;
    const char *api_key;             /* sent as Authorization: Bearer, or NULL */
} lg_opts;

static void lg_http_auth(lg_http *h, const char *key)
{
    h->auth[0] = 0;
    if (key)
        snprintf(h->auth, sizeof h->auth, "Authorization: Bearer %.480s\r\n", key);
}

typedef enum lg_status { LG_PENDING, LG_OK, LG_CANCELLED, LG_ERROR } lg_status;

typedef struct lg_req {
    uint32_t in_len, out_len;        /* asked for */
    int32_t hang_after;              /* chunks before hanging up; -1: never */
    double t_send, t_first, t_last, t_end;
    uint32_t in_tokens, out_tokens;  /* from usage (else chunks) */
    uint32_t chunks;
    double *itl;                     /* [chunks - 1] seconds */
    lg_status status;
    int http;                        /* status code, -1 transport error */
    char error[160];
    char finish[16];
} lg_req;

typedef struct lg_run {
    const lg_opts *o;
    lg_req *r;
    double *arrival;                 /* [n] seconds after t0 (Poisson), NULL in a closed loop */
    double t0;
    pthread_mutex_t mu;
    uint32_t next;
} lg_run;

static uint32_t lg_pick(uint64_t *s, uint32_t lo, uint32_t hi) { return hi <= lo ? lo : lo + (uint32_t)(vki_splitmix64(s) % (hi - lo + 1)); }

static double lg_unit(uint64_t *s) { return (double)(vki_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0); }

/* A text of roughly n tokens: common English words (about one token each in the usual
 * vocabularies; more in a tiny one). */
static bool lg_text_prompt(lg_buf *b, uint32_t n, uint64_t *rng)
{
    static const char *const words[] = {"the", "little", "girl", "saw", "a", "big", "dog", "in", "park", "and",
                                        "she", "was", "happy", "they", "played", "with", "ball", "one", "day",
                                        "sun", "tree", "bird", "sang", "mom", "said", "went", "home", "time"};
    bool ok = true;
    for (uint32_t i = 0; i < n && ok; i++) {
        const char *w = words[vki_splitmix64(rng) % (sizeof words / sizeof words[0])];
        ok = (!i || lg_buf_put(b, " ", 1)) && lg_buf_put(b, w, strlen(w));
    }
    return ok;
}

static char *lg_body(const lg_opts *o, const lg_req *q, uint64_t *rng)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "model", o->model);
    if (o->token_prompts) {
        cJSON *a = cJSON_AddArrayToObject(root, "prompt");
        for (uint32_t i = 0; i < q->in_len; i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber(3 + (double)(vki_splitmix64(rng) % (o->vocab > 3 ? o->vocab - 3 : 1))));
    } else {
        lg_buf t = {0};
        lg_text_prompt(&t, q->in_len, rng);
        if (o->chat) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "user");
            cJSON_AddStringToObject(m, "content", t.p ? t.p : "");
            cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "messages"), m);
        } else {
            cJSON_AddStringToObject(root, "prompt", t.p ? t.p : "");
        }
        free(t.p);
    }
    cJSON_AddNumberToObject(root, "max_tokens", q->out_len);
    cJSON_AddNumberToObject(root, "temperature", o->temperature);
    if (o->ignore_eos)
        cJSON_AddTrueToObject(root, "ignore_eos");
    if (o->stream) {
        cJSON_AddTrueToObject(root, "stream");
        cJSON_AddTrueToObject(cJSON_AddObjectToObject(root, "stream_options"), "include_usage");
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* Usage and finish reason out of a response or chunk object. */
static void lg_take_usage(lg_req *q, const cJSON *o)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(u)) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        if (cJSON_IsNumber(p))
            q->in_tokens = (uint32_t)p->valuedouble;
        if (cJSON_IsNumber(c))
            q->out_tokens = (uint32_t)c->valuedouble;
    }
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(o, "choices");
    const cJSON *f = cJSON_IsArray(ch) && ch->child ? cJSON_GetObjectItemCaseSensitive(ch->child, "finish_reason") : NULL;
    if (cJSON_IsString(f))
        snprintf(q->finish, sizeof q->finish, "%s", f->valuestring);
}

/* The text of a chunk (choices[0].text or .delta.content), "" when none. */
static const char *lg_chunk_text(const cJSON *o)
{
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(o, "choices");
    const cJSON *c = cJSON_IsArray(ch) ? ch->child : NULL;
    if (!c)
        return "";
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text");
    if (!t) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta");
        t = d ? cJSON_GetObjectItemCaseSensitive(d, "content") : NULL;
    }
    return cJSON_IsString(t) ? t->valuestring : "";
}

typedef struct lg_stream_state {
    lg_req *q;
    size_t itl_cap;
    bool done, failed;
} lg_stream_state;

static bool lg_on_event(void *user, const char *data, size_t n)
{
    lg_stream_state *st = user;
    lg_req *q = st->q;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        st->done = true;
        return true;
    }
    double t = lg_now();
    cJSON *o = cJSON_ParseWithLength(data, n);
    if (!o || cJSON_GetObjectItemCaseSensitive(o, "error")) {
        const cJSON *e = o ? cJSON_GetObjectItemCaseSensitive(o, "error") : NULL;
        const cJSON *m = e ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
        snprintf(q->error, sizeof q->error, "%s", cJSON_IsString(m) ? m->valuestring : "unparsable SSE event");
        st->failed = true;
        cJSON_Delete(o);
        return true;
    }
    lg_take_usage(q, o);
    if (*lg_chunk_text(o)) {
        if (!q->chunks)
            q->t_first = t;
        else if (q->chunks - 1 < st->itl_cap)
            q->itl[q->chunks - 1] = t - q->t_last;
        q->t_last = t;
        q->chunks++;
    }
    cJSON_Delete(o);
    return q->hang_after < 0 || q->chunks < (uint32_t)q->hang_after;
}

/* Runs request q on h; fills its times, counts and status. */
static void lg_one(const lg_opts *o, lg_http *h, lg_req *q, uint64_t *rng)
{
    char *body = lg_body(o, q, rng);
    const char *path = o->chat ? "/v1/chat/completions" : "/v1/completions";
    q->itl = o->stream ? calloc(q->out_len + 1, sizeof *q->itl) : NULL;
    lg_resp r;
    q->t_send = lg_now();
    bool reused = h->fd >= 0, sent = body && lg_http_send(h, "POST", path, body, strlen(body), NULL);
    if (sent && q->hang_after == 0) { /* hang up before any answer */
        free(body);
        lg_http_close(h);
        q->status = LG_CANCELLED;
        q->t_end = lg_now();
        return;
    }
    bool head = sent && lg_http_head(h, &r);
    if (!head && reused && body) { /* the kept-alive connection had been closed: once more, fresh */
        lg_http_close(h);
        q->t_send = lg_now();
        sent = lg_http_send(h, "POST", path, body, strlen(body), NULL);
        head = sent && lg_http_head(h, &r);
    }
    free(body);
    if (!head) {
        q->status = LG_ERROR;
        q->http = -1;
        snprintf(q->error, sizeof q->error, "%s", sent ? "no response" : "cannot send");
        lg_http_close(h);
        q->t_end = lg_now();
        return;
    }
    q->http = r.status;
    lg_buf whole = {0};
    lg_stream_state st = {.q = q, .itl_cap = q->out_len + 1};
    lg_sse sse = {.on_data = lg_on_event, .user = &st};
    int rc = r.status == 200 && o->stream ? lg_http_body(h, &r, lg_sse_feed, &sse) : lg_http_body(h, &r, lg_collect, &whole);
    q->t_end = lg_now();
    if (rc <= 0 || !r.keep_alive)
        lg_http_close(h);
    if (rc == 0 && o->stream && q->hang_after > 0 && !st.done) {
        q->status = LG_CANCELLED;
    } else if (r.status != 200 || rc < 0 || st.failed || (o->stream && !st.done)) {
        q->status = LG_ERROR;
        if (!q->error[0])
            snprintf(q->error, sizeof q->error, "HTTP %d: %.120s", r.status, whole.p ? whole.p : "(incomplete stream)");
    } else {
        q->status = LG_OK;
        cJSON *j = o->stream ? NULL : cJSON_ParseWithLength(whole.p ? whole.p : "", whole.len);
        if (j) {
            lg_take_usage(q, j);
            q->t_first = q->t_end; /* no stream: the whole answer is the first text */
            q->chunks = 1;
        }
        cJSON_Delete(j);
        if (!q->out_tokens)
            q->out_tokens = q->chunks;
    }
    free(whole.p);
    free(sse.line.p);
}

static void lg_sleep_until(double t)
{
    double d = t - lg_now();
    if (d <= 0)
        return;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

static void *lg_client(void *arg)
{
    lg_run *run = arg;
    const lg_opts *o = run->o;
    lg_http h;
    lg_http_init(&h, o->host, o->port, o->timeout_s);
    lg_http_auth(&h, o->api_key);
    for (;;) {
        pthread_mutex_lock(&run->mu);
        uint32_t i = run->next < o->n_requests ? run->next++ : UINT32_MAX;
        pthread_mutex_unlock(&run->mu);
        if (i == UINT32_MAX)
            break;
        if (run->arrival)
            lg_sleep_until(run->t0 + run->arrival[i]);
        uint64_t rng = o->seed ^ (0x9e3779b97f4a7c15ull * (i + 1)); /* the prompt depends on i only */
        lg_one(o, &h, &run->r[i], &rng);
    }
    lg_http_close(&h);
    return NULL;
}

/* Plans the requests (lengths, hang-ups, arrivals) from the seed, then runs the clients. */
static bool lg_run_all(const lg_opts *o, lg_req *r, double *wall_s)
{
    uint64_t rng = o->seed;
    lg_run run = {.o = o, .r = r};
    pthread_mutex_init(&run.mu, NULL);
    for (uint32_t i = 0; i < o->n_requests; i++) {
        r[i].in_len = lg_pick(&rng, o->in_min, o->in_max);
        r[i].out_len = lg_pick(&rng, o->out_min, o->out_max);
        r[i].hang_after = lg_unit(&rng) < o->disconnect ? (int32_t)lg_pick(&rng, 0, r[i].out_len - 1) : -1;
    }
    if (o->rate > 0) {
        run.arrival = malloc(o->n_requests * sizeof *run.arrival);
        double t = 0;
        for (uint32_t i = 0; run.arrival && i < o->n_requests; i++) {
            run.arrival[i] = t;
            t += -log(1.0 - lg_unit(&rng)) / o->rate;
        }
        if (!run.arrival)
            return false;
    }
    uint32_t nt = o->concurrency < o->n_requests ? o->concurrency : o->n_requests;
    pthread_t *th = calloc(nt ? nt : 1, sizeof *th);
    if (!th)
        return false;
    run.t0 = lg_now();
    uint32_t started = 0;
    for (; started < nt; started++)
        if (pthread_create(&th[started], NULL, lg_client, &run))
            break;
    for (uint32_t k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    *wall_s = lg_now() - run.t0;
    free(th);
    free(run.arrival);
    pthread_mutex_destroy(&run.mu);
    return started > 0;
}

/* ---- the report ------------------------------------------------------------------------------ */

typedef struct lg_stat {
    double mean, p50, p90, p99;
} lg_stat;

typedef struct lg_summary {
    uint32_t requests, ok, cancelled, errors;
    uint64_t in_tokens, out_tokens;
    double wall_s, req_per_s, out_tok_per_s, total_tok_per_s;
    lg_stat ttft, tpot, itl, e2e; /* milliseconds */
    const char *first_error;
} lg_summary;

static lg_stat lg_stats(const double *v, uint32_t n)
{
    lg_stat s = {0};
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += v[i];
    s.mean = n ? sum / n : 0;
    s.p50 = wl_percentile(v, n, 50);
    s.p90 = wl_percentile(v, n, 90);
    s.p99 = wl_percentile(v, n, 99);
    return s;
}

static void lg_summarize(const lg_opts *o, const lg_req *r, double wall_s, lg_summary *s)
{
    memset(s, 0, sizeof *s);
    s->requests = o->n_requests;
    s->wall_s = wall_s;
    size_t n_itl = 0;
    for (uint32_t i = 0; i < o->n_requests; i++)
        n_itl += r[i].status == LG_OK && r[i].chunks > 1 ? r[i].chunks - 1 : 0;
    double *ttft = calloc(o->n_requests + 1, sizeof *ttft), *tpot = calloc(o->n_requests + 1, sizeof *tpot);
    double *e2e = calloc(o->n_requests + 1, sizeof *e2e), *itl = calloc(n_itl + 1, sizeof *itl);
    uint32_t n1 = 0, n2 = 0;
    size_t k = 0;
    for (uint32_t i = 0; ttft && tpot && e2e && itl && i < o->n_requests; i++) {
        const lg_req *q = &r[i];
        s->ok += q->status == LG_OK;
        s->cancelled += q->status == LG_CANCELLED;
        if (q->status == LG_ERROR) {
            s->errors++;
            if (!s->first_error)
                s->first_error = q->error;
        }
        if (q->status != LG_OK)
            continue;
        s->in_tokens += q->in_tokens;
        s->out_tokens += q->out_tokens;
        ttft[n1] = (q->t_first - q->t_send) * 1e3;
        e2e[n1++] = (q->t_end - q->t_send) * 1e3;
        if (q->out_tokens > 1)
            tpot[n2++] = (q->t_end - q->t_first) * 1e3 / (q->out_tokens - 1);
        for (uint32_t c = 0; q->itl && c + 1 < q->chunks && c < q->out_len + 1; c++)
            itl[k++] = q->itl[c] * 1e3;
    }
    if (wall_s > 0) {
        s->req_per_s = s->ok / wall_s;
        s->out_tok_per_s = (double)s->out_tokens / wall_s;
        s->total_tok_per_s = (double)(s->in_tokens + s->out_tokens) / wall_s;
    }
    s->ttft = lg_stats(ttft, n1);
    s->e2e = lg_stats(e2e, n1);
    s->tpot = lg_stats(tpot, n2);
    s->itl = lg_stats(itl, (uint32_t)k);
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
}

static void lg_print_stat(const char *name, const lg_stat *s)
{
    printf("Mean %-27s %12.2f\nMedian %-25s %12.2f\nP90 %-28s %12.2f\nP99 %-28s %12.2f\n", name, s->mean, name, s->p50,
           name, s->p90, name, s->p99);
}

static void lg_print_table(const lg_opts *o, const lg_summary *s)
{
    printf("============ Serving Benchmark Result ============\n");
    printf("%-40s %9u\n%-40s %9u\n%-40s %9u\n", "Successful requests:", s->ok,
           "Cancelled (client hung up):", s->cancelled, "Failed requests:", s->errors);
    printf("%-40s %9.2f\n%-40s %9llu\n%-40s %9llu\n", "Benchmark duration (s):", s->wall_s,
           "Total input tokens:", (unsigned long long)s->in_tokens, "Total generated tokens:",
           (unsigned long long)s->out_tokens);
    printf("%-40s %9.2f\n%-40s %9.2f\n%-40s %9.2f\n", "Request throughput (req/s):", s->req_per_s,
           "Output token throughput (tok/s):", s->out_tok_per_s, "Total token throughput (tok/s):",
           s->total_tok_per_s);
    printf("---------------Time to First Token----------------\n");
    lg_print_stat("TTFT (ms):", &s->ttft);
    printf("-----Time per Output Token (excl. 1st token)------\n");
    lg_print_stat("TPOT (ms):", &s->tpot);
    printf("---------------Inter-token Latency----------------\n");
    lg_print_stat("ITL (ms):", &s->itl);
    printf("----------------End-to-end Latency----------------\n");
    lg_print_stat("E2EL (ms):", &s->e2e);
    printf("==================================================\n");
    if (s->first_error)
        printf("first error: %s\n", s->first_error);
}

static cJSON *lg_stat_json(const lg_stat *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "mean", s->mean);
    cJSON_AddNumberToObject(o, "p50", s->p50);
    cJSON_AddNumberToObject(o, "p90", s->p90);
    cJSON_AddNumberToObject(o, "p99", s->p99);
    return o;
}

static char *lg_summary_json(const lg_opts *o, const lg_summary *s)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "endpoint", o->chat ? "chat" : "completions");
    cJSON_AddBoolToObject(j, "stream", o->stream);
    cJSON_AddNumberToObject(j, "concurrency", o->concurrency);
    cJSON_AddNumberToObject(j, "request_rate", o->rate);
    cJSON_AddNumberToObject(j, "requests", s->requests);
    cJSON_AddNumberToObject(j, "completed", s->ok);
    cJSON_AddNumberToObject(j, "cancelled", s->cancelled);
    cJSON_AddNumberToObject(j, "errors", s->errors);
    cJSON_AddNumberToObject(j, "duration_s", s->wall_s);
    cJSON_AddNumberToObject(j, "input_tokens", (double)s->in_tokens);
    cJSON_AddNumberToObject(j, "output_tokens", (double)s->out_tokens);
    cJSON_AddNumberToObject(j, "request_throughput", s->req_per_s);
    cJSON_AddNumberToObject(j, "output_throughput", s->out_tok_per_s);
    cJSON_AddNumberToObject(j, "total_token_throughput", s->total_tok_per_s);
    cJSON_AddItemToObject(j, "ttft_ms", lg_stat_json(&s->ttft));
    cJSON_AddItemToObject(j, "tpot_ms", lg_stat_json(&s->tpot));
    cJSON_AddItemToObject(j, "itl_ms", lg_stat_json(&s->itl));
    cJSON_AddItemToObject(j, "e2el_ms", lg_stat_json(&s->e2e));
    if (s->first_error)
        cJSON_AddStringToObject(j, "first_error", s->first_error);
    else
        cJSON_AddNullToObject(j, "first_error");
    char *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return out;
}

static void lg_free_reqs(lg_req *r, uint32_t n)
{
    for (uint32_t i = 0; r && i < n; i++)
        free(r[i].itl);
    free(r);
}

/* ---- options ---------------------------------------------------------------------------------- */

static void lg_opts_default(lg_opts *o)
{
    memset(o, 0, sizeof *o);
    snprintf(o->host, sizeof o->host, "127.0.0.1");
    o->port = 8080;
    o->stream = o->ignore_eos = true;
    o->n_requests = 100;
    o->concurrency = 16;
    o->in_min = o->in_max = 32;
    o->out_min = o->out_max = 32;
    o->vocab = 256;
    o->seed = 1;
    o->timeout_s = 300;
    o->model = "default";
}

/* "http://host:port" (the path is ignored); IPv6 hosts in brackets. */
static bool lg_parse_url(const char *url, lg_opts *o)
{
    const char *p = !strncmp(url, "http://", 7) ? url + 7 : url;
    const char *end = p + strcspn(p, "/");
    const char *colon = NULL;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (!rb)
            return false;
        snprintf(o->host, sizeof o->host, "%.*s", (int)(rb - p - 1), p + 1);
        colon = rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = memchr(p, ':', (size_t)(end - p));
        snprintf(o->host, sizeof o->host, "%.*s", (int)((colon ? colon : end) - p), p);
    }
    long port = colon ? strtol(colon + 1, NULL, 10) : 80;
    if (!o->host[0] || port <= 0 || port > 65535)
        return false;
    o->port = (uint16_t)port;
    return true;
}

/* "N" or "MIN:MAX". */
static bool lg_parse_range(const char *s, uint32_t *lo, uint32_t *hi)
{
    char *end;
    unsigned long a = strtoul(s, &end, 10), b = a;
    if (*end == ':')
        b = strtoul(end + 1, &end, 10);
    if (*end || !a || b < a || b > (1u << 24))
        return false;
    *lo = (uint32_t)a;
    *hi = (uint32_t)b;
    return true;
}

static void lg_usage(FILE *f)
{
    fprintf(f,
            "usage: loadgen [--url http://HOST:PORT] [options]\n"
            "  --endpoint completions|chat   which API (completions)\n"
            "  -n, --num-requests N          requests in all (100)\n"
            "  -c, --concurrency N           clients; with --rate, the most in flight at once (16)\n"
            "  --rate R                      Poisson arrivals at R requests/s (default: closed loop)\n"
            "  --input-len N|MIN:MAX         prompt tokens (32): text of roughly N tokens, or exactly N ids\n"
            "  --output-len N|MIN:MAX        max_tokens (32); ignore_eos is sent so outputs have this length\n"
            "  --token-prompts               send prompts as token-id arrays (ids in [3, --vocab))\n"
            "  --vocab N                     vocabulary bound for token prompts (256)\n"
            "  --no-stream                   one JSON answer per request (TTFT = latency)\n"
            "  --no-ignore-eos               let the model end early\n"
            "  --disconnect F                fraction of requests whose client hangs up at a random point\n"
            "  --temperature T               sampling temperature (0)\n"
            "  --model NAME                  the \"model\" field (default: the server's first model)\n"
            "  --seed S                      plan seed: lengths, prompts, hang-ups, arrivals (1)\n"
            "  --timeout S                   per-read timeout (300)\n"
            "  --api-key KEY                 send Authorization: Bearer KEY\n"
            "  --json                        one JSON object instead of the table\n");
}

static int lg_parse_args(int argc, char **argv, lg_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, val = true;
        if (!strcmp(a, "--json") || !strcmp(a, "--no-stream") || !strcmp(a, "--no-ignore-eos") ||
            !strcmp(a, "--token-prompts")) {
            val = false;
            o->json |= !strcmp(a, "--json");
            o->stream &= !!strcmp(a, "--no-stream");
            o->ignore_eos &= !!strcmp(a, "--no-ignore-eos");
            o->token_prompts |= !strcmp(a, "--token-prompts");
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            lg_usage(stdout);
            return 0;
        } else if (!v) {
            ok = false;
        } else if (!strcmp(a, "--url")) {
            ok = lg_parse_url(v, o);
        } else if (!strcmp(a, "--endpoint")) {
            ok = !strcmp(v, "chat") || !strcmp(v, "completions");
            o->chat = !strcmp(v, "chat");
        } else if (!strcmp(a, "-n") || !strcmp(a, "--num-requests")) {
            o->n_requests = (uint32_t)strtoul(v, NULL, 10);
            ok = o->n_requests > 0;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--concurrency")) {
            o->concurrency = (uint32_t)strtoul(v, NULL, 10);
            ok = o->concurrency > 0 && o->concurrency <= 4096;
        } else if (!strcmp(a, "--rate")) {
            o->rate = strtod(v, NULL);
            ok = o->rate > 0;
        } else if (!strcmp(a, "--input-len")) {
            ok = lg_parse_range(v, &o->in_min, &o->in_max);
        } else if (!strcmp(a, "--output-len")) {
            ok = lg_parse_range(v, &o->out_min, &o->out_max);
        } else if (!strcmp(a, "--vocab")) {
            o->vocab = (uint32_t)strtoul(v, NULL, 10);
            ok = o->vocab > 3;
        } else if (!strcmp(a, "--disconnect")) {
            o->disconnect = strtod(v, NULL);
            ok = o->disconnect >= 0 && o->disconnect <= 1;
        } else if (!strcmp(a, "--temperature")) {
            o->temperature = strtof(v, NULL);
            ok = o->temperature >= 0 && o->temperature <= 2;
        } else if (!strcmp(a, "--model")) {
            o->model = v;
        } else if (!strcmp(a, "--seed")) {
            o->seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--api-key")) {
            o->api_key = v;
        } else if (!strcmp(a, "--timeout")) {
            o->timeout_s = strtod(v, NULL);
            ok = o->timeout_s > 0;
        } else {
            fprintf(stderr, "loadgen: unknown option '%s'\n", a);
            lg_usage(stderr);
            return -1;
        }
        if (!ok) {
            fprintf(stderr, "loadgen: bad or missing value for %s\n", a);
            return -1;
        }
        i += val;
    }
    return 1;
}

/* Checks the server answers GET /v1/models; takes its first model id when --model was not given
 * (the id lives in *id_buf). */
static bool lg_probe(lg_opts *o, char *id_buf, size_t cap)
{
    lg_http h;
    lg_http_init(&h, o->host, o->port, o->timeout_s);
    lg_http_auth(&h, o->api_key);
    lg_resp r;
    lg_buf b = {0};
    int st = lg_http_request(&h, "GET", "/v1/models", NULL, &r, &b);
    lg_http_close(&h);
    cJSON *j = st == 200 && b.p ? cJSON_Parse(b.p) : NULL;
    const cJSON *d = j ? cJSON_GetObjectItemCaseSensitive(j, "data") : NULL;
    const cJSON *id = cJSON_IsArray(d) && d->child ? cJSON_GetObjectItemCaseSensitive(d->child, "id") : NULL;
    if (cJSON_IsString(id) && !strcmp(o->model, "default")) {
        snprintf(id_buf, cap, "%s", id->valuestring);
        o->model = id_buf;
    }
    cJSON_Delete(j);
    free(b.p);
    if (st != 200)
        fprintf(stderr, "loadgen: GET http://%s:%u/v1/models: %s\n", o->host, o->port,
                st < 0 ? "no answer (is the server running?)" : "not 200");
    return st == 200;
}

#ifdef LOADGEN_NO_MAIN
#pragma GCC diagnostic pop
#else
int main(int argc, char **argv)
{
    lg_opts o;
    lg_opts_default(&o);
    int pr = lg_parse_args(argc, argv, &o);
    if (pr <= 0)
        return pr < 0 ? 2 : 0;
    signal(SIGPIPE, SIG_IGN);
    char model_id[256];
    if (!lg_probe(&o, model_id, sizeof model_id))
        return 1;
    lg_req *r = calloc(o.n_requests, sizeof *r);
    double wall = 0;
    if (!r || !lg_run_all(&o, r, &wall)) {
        fprintf(stderr, "loadgen: cannot start the clients\n");
        lg_free_reqs(r, o.n_requests);
        return 1;
    }
    lg_summary s;
    lg_summarize(&o, r, wall, &s);
    if (o.json) {
        char *j = lg_summary_json(&o, &s);
        printf("%s\n", j ? j : "{}");
        free(j);
    } else {
        lg_print_table(&o, &s);
    }
    int rc = s.errors ? 1 : 0;
    lg_free_reqs(r, o.n_requests);
    return rc;
}
#endif
