/* The HTTP side of `vkinfer serve`: libmicrohttpd daemon (one thread per connection, see
 * server.h), routing, request bodies (limit -> 413), the small routes (health, readiness, models,
 * metrics), OpenAI-shaped errors, and drain / shutdown. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "host/server/server.h"

typedef enum route {
    R_NONE,
    R_HEALTH,
    R_READY,
    R_MODELS,
    R_MODEL,   /* /v1/models/{id} */
    R_METRICS,
    R_CMPL,
    R_CHAT,
} route;

/* One HTTP request (MHD's per-request context). */
typedef struct srv_conn {
    srv *s;
    route r;
    bool post;         /* a POST route, method right: the body is kept */
    srv_error pending; /* http != 0: the answer (404 / 405), sent once the request is read */
    const char *allow; /* 405: the Allow header */
    strbuf body;
    bool too_big;
    srv_job *job;
    unsigned status;
    double t0;
} srv_conn;

srv_params srv_default_params(void)
{
    vki_batch_params bp = vki_batch_default_params();
    return (srv_params){.host = "127.0.0.1", .port = 8080, .body_limit = 1u << 20, .max_connections = 512,
                        .idle_timeout_s = 60, .batch = bp, .log_level = VKI_LOG_INFO};
}

double srv_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void srv_log(const srv *s, vki_log_level lv, const char *fmt, ...)
{
    if (lv > s->p.log_level)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s->p.log)
        s->p.log(s->p.log_user, lv, msg);
    else
        fprintf(stderr, "vkinfer serve: %s\n", msg);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    /* A client that hangs up makes MHD log the connection it closed: expected, not a warning. */
    bool hangup = strstr(msg, "Closing connection") || strstr(msg, "closing connection");
    srv_log(cls, hangup ? VKI_LOG_DEBUG : VKI_LOG_WARN, "http: %s", msg);
}

cJSON *srv_json_parse(srv *s, const char *body, size_t n, size_t *err_at)
{
    const char *end = NULL;
    pthread_mutex_lock(&s->json_mu);
    cJSON *o = body ? cJSON_ParseWithLengthOpts(body, n, &end, false) : NULL;
    pthread_mutex_unlock(&s->json_mu);
    if (err_at)
        *err_at = end && body ? (size_t)(end - body) : 0;
    return o;
}

/* ---- errors -------------------------------------------------------------------------------- */

void srv_err(srv_error *e, unsigned http, const char *param, const char *fmt, ...)
{
    e->http = http;
    e->type = http >= 500 ? "server_error" : "invalid_request_error";
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

char *srv_error_json(const srv_error *e)
{
    cJSON *o = cJSON_CreateObject(), *x = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(x, "message", e->msg);
    cJSON_AddStringToObject(x, "type", e->type);
    if (e->param[0])
        cJSON_AddStringToObject(x, "param", e->param);
    else
        cJSON_AddNullToObject(x, "param");
    if (e->code)
        cJSON_AddStringToObject(x, "code", e->code);
    else
        cJSON_AddNullToObject(x, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* ---- replies ------------------------------------------------------------------------------- */

static bool is_draining(srv *s)
{
    pthread_mutex_lock(&s->mu);
    bool d = s->draining;
    pthread_mutex_unlock(&s->mu);
    return d;
}

/* Queues body (malloc'd; freed by MHD) with status code; hdr/val: one extra header or NULL. */
static enum MHD_Result reply(srv_conn *k, struct MHD_Connection *c, unsigned code, const char *ctype, char *body,
                             const char *hdr, const char *val)
{
    if (!body)
        return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (hdr)
        MHD_add_response_header(r, hdr, val);
    if (is_draining(k->s)) /* send clients to another replica */
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    k->status = code;
    srv_metrics_http(&k->s->m, code);
    return ok;
}

static enum MHD_Result reply_json(srv_conn *k, struct MHD_Connection *c, unsigned code, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return reply(k, c, code, "application/json", s, NULL, NULL);
}

static enum MHD_Result reply_error(srv_conn *k, struct MHD_Connection *c, const srv_error *e)
{
    if (k->r == R_CMPL || k->r == R_CHAT)
        srv_metrics_outcome(&k->s->m, e->http == 429 ? SRV_OUT_QUEUE_FULL : e->http == 503 ? SRV_OUT_UNAVAILABLE
                                      : e->http >= 500 ? SRV_OUT_ERROR : SRV_OUT_INVALID);
    const char *hdr = e->http == 429 ? MHD_HTTP_HEADER_RETRY_AFTER : NULL;
    return reply(k, c, e->http, "application/json", srv_error_json(e), hdr, "1");
}

/* ---- routing -------------------------------------------------------------------------------- */

static const struct {
    const char *path;
    bool prefix;
    bool post;
    route r;
} ROUTES[] = {
    {"/health", false, false, R_HEALTH},         {"/health/ready", false, false, R_READY},
    {"/v1/models", false, false, R_MODELS},      {"/v1/models/", true, false, R_MODEL},
    {"/metrics", false, false, R_METRICS},       {"/v1/completions", false, true, R_CMPL},
    {"/v1/chat/completions", false, true, R_CHAT},
};

/* The route of url, R_NONE if none. *method_ok: the method fits it (GET/HEAD or POST). */
static route route_of(const char *url, const char *method, bool *method_ok, bool *post)
{
    for (size_t i = 0; i < sizeof ROUTES / sizeof ROUTES[0]; i++) {
        size_t n = strlen(ROUTES[i].path);
        if (ROUTES[i].prefix ? strncmp(url, ROUTES[i].path, n) || !url[n] : strcmp(url, ROUTES[i].path))
            continue;
        *post = ROUTES[i].post;
        *method_ok = ROUTES[i].post ? !strcmp(method, "POST") : !strcmp(method, "GET") || !strcmp(method, "HEAD");
        return ROUTES[i].r;
    }
    return R_NONE;
}

static cJSON *model_object(const srv *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->t_start);
    cJSON_AddStringToObject(m, "owned_by", "vkinfer");
    cJSON_AddNumberToObject(m, "max_model_len", s->info.n_ctx);
    return m;
}

static enum MHD_Result handle_get(srv_conn *k, struct MHD_Connection *c, const char *url)
{
    srv *s = k->s;
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining, lost = s->device_lost;
    uint32_t active = s->n_active, open = s->n_open;
    pthread_mutex_unlock(&s->mu);
    cJSON *o = cJSON_CreateObject();
    switch (k->r) {
    case R_HEALTH:
        cJSON_AddStringToObject(o, "status", "ok");
        return reply_json(k, c, 200, o);
    case R_READY:
        cJSON_AddStringToObject(o, "status", lost ? "device lost" : draining ? "draining" : "ready");
        return reply_json(k, c, lost || draining ? 503 : 200, o);
    case R_MODELS:
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_object(s));
        return reply_json(k, c, 200, o);
    case R_MODEL:
        cJSON_Delete(o);
        if (!strcmp(url + strlen("/v1/models/"), s->model_id))
            return reply_json(k, c, 200, model_object(s));
        srv_error e;
        srv_err(&e, 404, "model", "the model '%.200s' does not exist; this server has '%s'",
                url + strlen("/v1/models/"), s->model_id);
        e.code = "model_not_found";
        return reply_error(k, c, &e);
    default: /* R_METRICS */
        cJSON_Delete(o);
        return reply(k, c, 200, "text/plain; version=0.0.4; charset=utf-8",
                     srv_metrics_render(&s->m, active, open, !draining && !lost), NULL, NULL);
    }
}

static enum MHD_Result handle_generate(srv_conn *k, struct MHD_Connection *c)
{
    srv *s = k->s;
    srv_error e;
    srv_job *j = NULL;
    pthread_mutex_lock(&s->mu);
    bool refuse = s->draining || s->device_lost;
    pthread_mutex_unlock(&s->mu);
    if (refuse) { /* before any tokenising */
        srv_err(&e, 503, NULL, "the server is not taking requests (shutting down or device lost)");
        e.code = "service_unavailable";
        return reply_error(k, c, &e);
    }
    if (!srv_job_from_json(s, k->r == R_CHAT, k->body.p, k->body.len, &j, &e))
        return reply_error(k, c, &e);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->t_arrive = k->t0;
    if (!srv_job_submit(j, &e)) {
        srv_job_release(j);
        return reply_error(k, c, &e);
    }
    k->job = j;
    if (!j->stream) {
        char *body = NULL;
        unsigned code = srv_job_run_blocking(j, &body);
        if (!code) /* the client went away: nothing to send */
            return MHD_NO;
        return reply(k, c, code, "application/json", body, NULL, NULL);
    }
    srv_job_ref(j); /* the response's */
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, srv_job_sse_reader, j, srv_job_sse_free);
    if (!r) {
        srv_job_cancel(j);
        srv_job_release(j);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    k->status = 200;
    srv_metrics_http(&s->m, 200);
    return ok;
}

/* First call for a request: route, method, declared body size. Only a 413 is answered here:
 * libmicrohttpd closes a connection whose response was queued in the first call, which is right
 * for a body we will not read and wrong for everything else (keep-alive). */
static enum MHD_Result begin(srv_conn *k, struct MHD_Connection *c, const char *url, const char *method)
{
    srv *s = k->s;
    bool method_ok = false, post = false;
    k->r = route_of(url, method, &method_ok, &post);
    if (k->r == R_NONE) {
        srv_err(&k->pending, 404, NULL, "unknown route: %.16s %.200s", method, url);
        k->pending.code = "not_found";
    } else if (!method_ok) {
        srv_err(&k->pending, 405, NULL, "%.16s is not allowed on %.200s (use %s)", method, url, post ? "POST" : "GET");
        k->pending.code = "method_not_allowed";
        k->allow = post ? "POST" : "GET, HEAD";
        k->r = R_NONE; /* not a generation request for the metrics */
    }
    k->post = post && method_ok;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (k->post && cl && strtoull(cl, NULL, 10) > s->p.body_limit) {
        srv_error e;
        srv_err(&e, 413, NULL, "the request body (%.20s bytes) exceeds the limit of %zu bytes", cl, s->p.body_limit);
        return reply_error(k, c, &e);
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    srv *s = cls;
    srv_conn *k = *con_cls;
    if (!k) {
        if (!(k = calloc(1, sizeof *k)))
            return MHD_NO;
        k->s = s;
        k->t0 = srv_now();
        *con_cls = k;
        pthread_mutex_lock(&s->mu);
        s->n_open++;
        pthread_mutex_unlock(&s->mu);
        return begin(k, c, url, method);
    }
    if (k->status) /* answered early (413); the rest of the upload is discarded */
        return MHD_YES;
    if (*upload_size) {
        if (k->post && !k->too_big && k->body.len + *upload_size > s->p.body_limit)
            k->too_big = true;
        if (k->post && !k->too_big && !strbuf_put(&k->body, upload, *upload_size))
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->pending.http == 405)
        return reply(k, c, 405, "application/json", srv_error_json(&k->pending), MHD_HTTP_HEADER_ALLOW, k->allow);
    if (k->pending.http)
        return reply_error(k, c, &k->pending);
    if (k->too_big) {
        srv_error e;
        srv_err(&e, 413, NULL, "the request body exceeds the limit of %zu bytes", s->p.body_limit);
        return reply_error(k, c, &e);
    }
    return k->post ? handle_generate(k, c) : handle_get(k, c, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    srv *s = cls;
    srv_conn *k = *con_cls;
    if (!k)
        return;
    if (k->job) {
        srv_job *j = k->job;
        if (!j->final_seen) /* the response did not finish (a write failed): the client is gone */
            srv_job_gone(j);
        srv_job_count(j); /* normally counted already, before the last bytes went out */
        srv_job_release(j);
    }
    srv_log(s, VKI_LOG_DEBUG, "%s %u %.1f ms%s", k->r == R_CHAT ? "chat" : k->r == R_CMPL ? "completions" : "-",
            k->status, (srv_now() - k->t0) * 1e3, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (aborted)");
    strbuf_free(&k->body);
    free(k);
    *con_cls = NULL;
    pthread_mutex_lock(&s->mu);
    s->n_open--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- life cycle ------------------------------------------------------------------------------ */

static void on_stats(void *user, const char *json)
{
    srv *s = user;
    cJSON *o = srv_json_parse(s, json, strlen(json), NULL);
    if (o)
        srv_metrics_stats(&s->m, o);
    cJSON_Delete(o);
}

/* The model id: the option, else the file name without directories and ".gguf". */
static void set_model_id(srv *s)
{
    const char *p = s->p.model_id;
    if (p && *p) {
        snprintf(s->model_id, sizeof s->model_id, "%s", p);
        return;
    }
    p = s->p.model_path ? s->p.model_path : s->info.name;
    const char *slash = strrchr(p, '/');
    snprintf(s->model_id, sizeof s->model_id, "%s", slash ? slash + 1 : p);
    size_t n = strlen(s->model_id);
    if (n > 5 && !strcmp(s->model_id + n - 5, ".gguf"))
        s->model_id[n - 5] = 0;
}

static vki_status setup_chat(srv *s, char *err, size_t n_err)
{
    char *tmpl = NULL, bos[64], eos[64];
    chat_family f = CHAT_PLAIN;
    bool known = false;
    if (s->p.chat_template) {
        if (!chat_family_parse(s->p.chat_template, &f)) {
            snprintf(err, n_err, "--chat-template: unknown family '%s' (chatml, llama3, llama2, mistral, zephyr, "
                     "gemma, phi3, plain)", s->p.chat_template);
            return VKI_ERR_INVALID_ARG;
        }
        srv_log(s, VKI_LOG_INFO, "chat template: %s (from the command line)", chat_family_name(f));
    } else {
        vki_status st = s->p.model_path ? chat_template_from_gguf(s->p.model_path, &tmpl, err, n_err) : VKI_OK;
        if (st != VKI_OK)
            return st;
        f = chat_detect(tmpl, &known);
        if (known)
            srv_log(s, VKI_LOG_INFO, "chat template: %s (recognised in the GGUF)", chat_family_name(f));
        else
            srv_log(s, VKI_LOG_INFO, "chat template: %s; using the plain fallback (\"role: content\" lines, then "
                    "\"assistant:\")", tmpl ? "not one of the known families" : "none in the GGUF");
    }
    chat_token_texts(s->tok, bos, sizeof bos, eos, sizeof eos);
    vki_status st = chat_template_init(&s->chat, f, tmpl, bos, eos);
    free(tmpl);
    if (st == VKI_OK)
        st = chat_specials_create(s->tok, &s->specials);
    if (st != VKI_OK)
        snprintf(err, n_err, "chat template: %s", vki_status_str(st));
    return st;
}

static vki_status start_daemon(srv *s, char *err, size_t n_err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[8];
    snprintf(port, sizeof port, "%u", s->p.port);
    int rc = getaddrinfo(s->p.host, port, &hints, &ai);
    if (rc) {
        snprintf(err, n_err, "--host %s: %s", s->p.host, gai_strerror(rc));
        return VKI_ERR_INVALID_ARG;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, s->p.port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)s->p.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)s->p.idle_timeout_s, MHD_OPTION_THREAD_STACK_SIZE, (size_t)SRV_STACK_BYTES,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        snprintf(err, n_err, "cannot listen on %s:%u (address in use or not available)", s->p.host, s->p.port);
        return VKI_ERR_IO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    return VKI_OK;
}

static void srv_free(srv *s)
{
    chat_specials_free(s->specials);
    chat_template_free(&s->chat);
    srv_metrics_destroy(&s->m);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->json_mu);
    free(s);
}

vki_status srv_create(vki_engine *e, const srv_params *p, srv **out, char *err, size_t n_err)
{
    *out = NULL;
    char scratch[8];
    if (!err || !n_err) {
        err = scratch;
        n_err = sizeof scratch;
    }
    err[0] = 0;
    srv *s = calloc(1, sizeof *s);
    if (!s)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    s->p = *p;
    s->engine = e;
    s->tok = vki_engine_tokenizer(e);
    vki_engine_info(e, &s->info);
    s->t_start = (long long)time(NULL);
    s->next_id = 1;
    s->listen_fd = -1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->json_mu, NULL);
    srv_metrics_init(&s->m);
    set_model_id(s);
    vki_status st = setup_chat(s, err, n_err);
    vki_batch_callbacks cb = {.user = s, .stats = on_stats};
    if (st == VKI_OK && (st = vki_batch_manager_create(e, &p->batch, &cb, &s->bm)) != VKI_OK)
        snprintf(err, n_err, "batch manager: %s", vki_status_str(st));
    if (st == VKI_OK)
        st = start_daemon(s, err, n_err);
    if (st != VKI_OK) {
        vki_batch_manager_destroy(s->bm, true);
        srv_free(s);
        return st;
    }
    srv_log(s, VKI_LOG_INFO, "model '%s' (context %u) listening on http://%s:%u", s->model_id, s->info.n_ctx,
            s->p.host, s->port);
    *out = s;
    return VKI_OK;
}

uint16_t srv_port(const srv *s) { return s->port; }

void srv_drain_begin(srv *s)
{
    pthread_mutex_lock(&s->mu);
    bool was = s->draining;
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
    if (was)
        return;
    /* No new connections; open ones keep working. The socket must stay open until the daemon
     * stops (its thread may still poll it), but shutdown() stops a listening socket on Linux at
     * once: connecting clients are refused instead of waiting in a backlog nobody accepts. */
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET)
        shutdown(fd, SHUT_RDWR);
    s->listen_fd = fd == MHD_INVALID_SOCKET ? -1 : fd;
}

/* Waits on s->cv until *count (under s->mu) is 0 or the deadline passes. */
static bool wait_zero(srv *s, const uint32_t *count, double timeout_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (*count && rc == 0)
        rc = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    bool zero = *count == 0;
    pthread_mutex_unlock(&s->mu);
    return zero;
}

bool srv_wait_idle(srv *s, double timeout_s) { return wait_zero(s, &s->n_active, timeout_s); }

void srv_destroy(srv *s)
{
    if (!s)
        return;
    srv_drain_begin(s);
    pthread_mutex_lock(&s->mu);
    vki_batch_manager *bm = s->bm;
    s->bm = NULL; /* cancels and submissions from now on see no manager */
    pthread_mutex_unlock(&s->mu);
    vki_batch_manager_destroy(bm, true); /* every request left gets its final (cancelled) response */
    if (!wait_zero(s, &s->n_open, 1.0))
        srv_log(s, VKI_LOG_WARN, "HTTP requests still open at shutdown; closing them");
    MHD_stop_daemon(s->d);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    srv_free(s);
}
