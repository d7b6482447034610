/* `vkinfer serve`: life cycle, parameters, routing (auth, CORS, the connection cap), the small
 * routes answered on the io thread (health, readiness, metrics), OpenAI-shaped errors, the access
 * log and the periodic stats line. HTTP itself is server_http.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host/server/server.h"

/* server_routes.c */
void srv_route_models(srv_conn *c);
void srv_route_model(srv_conn *c);
void srv_route_props(srv_conn *c);
void srv_route_version(srv_conn *c);
void srv_route_tokenize(srv_conn *c);
void srv_route_detokenize(srv_conn *c);
void srv_route_embeddings(srv_conn *c);

srv_params srv_default_params(void)
{
    vki_batch_params bp = vki_batch_default_params();
    /* Many chats at once: admit by the next step's need and pause (recompute) the newest when
     * the pool runs short, as vLLM preempts, rather than reserving every request's whole
     * max_tokens up front (a chat without max_tokens may run to the end of the context). */
    bp.policy = VKI_POLICY_MAX_UTILIZATION;
    /* Logits outputs (v2 return_generation_logits) live three times over in the server: the batch
     * manager's rows, the job's copy and ~12 bytes of JSON per float, so a request's rows are
     * capped at 64 MiB rather than the library's 256 (--max-logits-mb). */
    bp.max_logits_bytes = 64u << 20;
    return (srv_params){.host = "127.0.0.1", .port = 8080, .listen_fd = -1, .body_limit = 1u << 20,
                        .max_connections = 512, .idle_timeout_s = 60, .request_timeout_s = 30,
                        .stats_interval_s = 10, .pooling = VKI_POOL_NONE, .batch = bp, .log_level = VKI_LOG_INFO,
                        .recover_backoff_ms = 500};
}

double srv_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void srv_log(const srv *s, vki_log_level lv, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    srv_logv(&s->p, lv, fmt, ap);
    va_end(ap);
}

void srv_logv(const srv_params *p, vki_log_level lv, const char *fmt, va_list ap)
{
    if (lv > p->log_level)
        return;
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (p->log)
        p->log(p->log_user, lv, msg);
    else
        fprintf(stderr, "vkinfer serve: %s%s\n", lv == VKI_LOG_ERROR ? "error: " : lv == VKI_LOG_WARN ? "warning: " : "",
                msg);
}

/* ---- errors -------------------------------------------------------------------------------- */

void srv_err(srv_error *e, unsigned http, const char *param, const char *fmt, ...)
{
    e->http = http;
    e->type = http >= 500 ? "server_error" : "invalid_request_error"; /* OpenAI's 401 is one too */
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

/* ---- routing ------------------------------------------------------------------------------- */

static const struct {
    const char *path;
    bool prefix;
    bool post;
    bool open;  /* answered without an API key (probes and scrapes) */
    srv_route r;
} ROUTES[] = {
    {"/health", false, false, true, R_HEALTH},
    {"/health/ready", false, false, true, R_READY},
    {"/metrics", false, false, true, R_METRICS},
    {"/version", false, false, true, R_VERSION},
    {"/v1/models", false, false, false, R_MODELS},
    {"/models", false, false, false, R_MODELS}, /* llama-server's alias */
    {"/v1/models/", true, false, false, R_MODEL},
    {"/props", false, false, false, R_PROPS},
    {"/v1/completions", false, true, false, R_CMPL},
    {"/v1/chat/completions", false, true, false, R_CHAT},
    {"/v1/responses", false, true, false, R_RESPONSES},
    {"/completion", false, true, false, R_LLAMA_CMPL},  /* llama-server's own API and its alias */
    {"/completions", false, true, false, R_LLAMA_CMPL},
    {"/apply-template", false, true, false, R_APPLY_TEMPLATE},
    {"/infill", false, true, false, R_INFILL},
    {"/v1/embeddings", false, true, false, R_EMBED},
    {"/tokenize", false, true, false, R_TOKENIZE},
    {"/detokenize", false, true, false, R_DETOKENIZE},
    {"/v1/sessions/", true, true, false, R_SESSION},
    {"/api/version", false, false, false, R_OLLAMA_VERSION}, /* Ollama's API (ollama_api.c) */
    {"/api/tags", false, false, false, R_OLLAMA_TAGS},
    {"/api/ps", false, false, false, R_OLLAMA_PS},
    {"/api/show", false, true, false, R_OLLAMA_SHOW},
    {"/api/generate", false, true, false, R_OLLAMA_GENERATE},
    {"/api/chat", false, true, false, R_OLLAMA_CHAT},
    {"/api/embed", false, true, false, R_OLLAMA_EMBED},
    {"/api/embeddings", false, true, false, R_OLLAMA_EMBEDDINGS},
    {"/v2", false, false, false, R_V2},  /* KServe v2: kserve.c checks methods and auth itself */
    {"/v2/", true, false, false, R_V2},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

bool srv_route_is_heavy(srv_route r) { return r >= R_CMPL; }

static size_t route_index(const char *path)
{
    for (size_t i = 0; i < N_ROUTES; i++) {
        size_t n = strlen(ROUTES[i].path);
        if (ROUTES[i].prefix ? !strncmp(path, ROUTES[i].path, n) && path[n] : !strcmp(path, ROUTES[i].path))
            return i;
    }
    return N_ROUTES;
}

/* Compares every byte whatever the first difference (no timing signal about the key). */
static bool same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < na; i++)
        d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

bool srv_authorized(const srv *s, const char *auth)
{
    if (!s->p.n_api_keys)
        return true;
    if (strncasecmp(auth, "Bearer ", 7))
        return false;
    const char *key = auth + 7;
    while (*key == ' ')
        key++;
    bool ok = false;
    for (uint32_t i = 0; i < s->p.n_api_keys; i++)
        ok |= same_secret(key, s->api_keys[i]);
    return ok;
}

const char *srv_cors_origin(const srv *s, const char *origin)
{
    if (!origin || !origin[0])
        return NULL;
    for (uint32_t i = 0; i < s->p.n_cors_origins; i++)
        if (!strcmp(s->cors[i], "*") || !strcmp(s->cors[i], origin))
            return origin;
    return NULL;
}

/* OPTIONS: the CORS preflight (no key needed: browsers send none with it). */
static void preflight(srv_conn *c)
{
    const char *origin = srv_cors_origin(c->s, c->req.origin);
    char extra[768];
    if (origin)
        snprintf(extra, sizeof extra, "Allow: GET, HEAD, POST, OPTIONS\r\nAccess-Control-Allow-Methods: GET, HEAD, "
                 "POST, OPTIONS\r\nAccess-Control-Allow-Headers: %s\r\nAccess-Control-Max-Age: 600\r\n",
                 c->req.acr_headers[0] ? c->req.acr_headers : "Authorization, Content-Type");
    else
        snprintf(extra, sizeof extra, "Allow: GET, HEAD, POST, OPTIONS\r\n");
    srv_reply(c, 204, NULL, strdup(""), extra);
}

static void health(srv_conn *c)
{
    srv *s = c->s;
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining, lost = s->device_lost;
    uint32_t active = s->n_active, conns = s->n_conns, handlers = s->n_handlers;
    pthread_mutex_unlock(&s->mu);
    cJSON *o = cJSON_CreateObject();
    switch (c->req.route) {
    case R_HEALTH:
        cJSON_AddStringToObject(o, "status", "ok");
        return srv_reply_json(c, 200, o);
    case R_READY:
        cJSON_AddStringToObject(o, "status", lost ? "device lost" : draining ? "draining" : "ready");
        return srv_reply_json(c, lost || draining ? 503 : 200, o);
    default: { /* R_METRICS */
        cJSON_Delete(o);
        srv_gauges g = {.active = active, .connections = conns, .handlers = handlers, .ready = !draining && !lost};
        return srv_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8",
                         s->repo ? srv_repo_metrics(s, &g) : srv_metrics_render(&s->m, &g), NULL);
    }
    }
}

static void refuse_route(srv_conn *c, unsigned code, const char *param, const char *code_str, const char *fmt,
                         const char *a, const char *b)
{
    srv_error e;
    srv_err(&e, code, param, fmt, a, b);
    e.code = code_str;
    srv_reply_error(c, &e);
}

/* A route about "the" model, in repository mode: the only one loaded (else 400 naming them). */
static void with_only_model(srv_conn *c, void (*fn)(srv_conn *))
{
    srv_error e;
    if (!(c->model = srv_model_acquire(c->s, NULL, true, &e)))
        return srv_reply_error(c, &e);
    fn(c);
    srv_model_release(c->s, c->model);
    c->model = NULL;
}

void srv_serve_small(srv_conn *c)
{
    srv *s = c->s;
    srv_req *r = &c->req;
    size_t i = route_index(r->path);
    bool get = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD"), post = !strcmp(r->method, "POST");
    r->route = i < N_ROUTES ? ROUTES[i].r : R_NONE;
    c->ollama = r->route == R_OLLAMA_VERSION || r->route >= R_OLLAMA_GENERATE; /* its errors' shape */
    bool probe = r->route == R_HEALTH || r->route == R_READY || r->route == R_METRICS;
    if (c->overflow && !(probe && get)) { /* past the cap: probes only */
        c->close_after = true;
        srv_metrics_overflow(&s->m);
        return refuse_route(c, 503, NULL, "service_unavailable", "the server is at its connection limit (%s%s); "
                            "retry later", "--max-connections", "");
    }
    if (!strcmp(r->method, "OPTIONS"))
        return preflight(c);
    if (r->route == R_V2)
        return srv_kserve_small(c);
    if (i == N_ROUTES)
        return refuse_route(c, 404, NULL, "not_found", "unknown route: %.16s %.200s", r->method, r->path);
    if (ROUTES[i].post ? !post : !get) {
        srv_error e;
        srv_err(&e, 405, NULL, "%.16s is not allowed on %.200s (use %s)", r->method, r->path,
                ROUTES[i].post ? "POST" : "GET");
        e.code = "method_not_allowed";
        r->route = R_NONE;
        return srv_reply(c, 405, "application/json", srv_error_json(&e),
                         ROUTES[i].post ? "Allow: POST, OPTIONS\r\n" : "Allow: GET, HEAD, OPTIONS\r\n");
    }
    if (!ROUTES[i].open && !srv_authorized(s, r->auth)) {
        srv_error e;
        srv_err(&e, 401, NULL, "%s", r->auth[0] ? "invalid API key (Authorization: Bearer ...)"
                                                : "an API key is required: send Authorization: Bearer <key>");
        e.code = "invalid_api_key";
        return srv_reply_error(c, &e);
    }
    switch (r->route) {
    case R_HEALTH:
    case R_READY:
    case R_METRICS: return health(c);
    case R_VERSION: return srv_route_version(c);
    case R_OLLAMA_VERSION: return srv_ollama_version(c);
    case R_MODELS: return s->repo ? srv_repo_models(c) : srv_route_models(c);
    case R_MODEL: return s->repo ? srv_repo_model(c, r->path + strlen("/v1/models/")) : srv_route_model(c);
    case R_SESSION:
        if (srv_session_is_file_route(r->path)) {
            r->route = R_SESSION_FILE; /* file I/O and a wait for the worker: a handler thread */
            return;
        }
        return srv_route_session_end(c);
    case R_PROPS: return s->repo ? with_only_model(c, srv_route_props) : srv_route_props(c);
    default: return; /* heavy: a handler thread answers */
    }
}

/* The model a heavy OpenAI-style request names in its body's "model" (repository mode). A body
 * that is not JSON goes to the only model, if one, whose parser then names the fault. */
static bool pick_model(srv_conn *c, srv_error *e)
{
    if (!c->s->repo)
        return true;
    srv_json_err je;
    cJSON *o = srv_json_parse(c->req.body.p ? c->req.body.p : "", c->req.body.len, &je);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "model");
    c->model = srv_model_acquire(c->s, cJSON_IsString(m) ? m->valuestring : NULL, true, e);
    cJSON_Delete(o);
    return c->model != NULL;
}

void srv_serve_heavy(srv_conn *c)
{
    srv_error e;
    if (c->req.route == R_V2_HEAVY)
        return srv_kserve_heavy(c);
    if (c->req.route == R_SESSION_FILE)
        return srv_route_session_file(c);
    if (c->req.route == R_OLLAMA_TAGS || c->req.route == R_OLLAMA_PS)
        return srv_ollama_list(c, c->req.route == R_OLLAMA_PS);
    if (c->req.route == R_OLLAMA_SHOW)
        return srv_ollama_show(c);
    if (!pick_model(c, &e))
        return srv_reply_error(c, &e);
    if (c->req.route == R_OLLAMA_GENERATE || c->req.route == R_OLLAMA_CHAT)
        srv_ollama_generate(c, c->req.route == R_OLLAMA_CHAT);
    else if (c->req.route == R_OLLAMA_EMBED || c->req.route == R_OLLAMA_EMBEDDINGS)
        srv_ollama_embed(c);
    else if (c->req.route == R_LLAMA_CMPL)
        srv_llama_completion(c);
    else if (c->req.route == R_APPLY_TEMPLATE)
        srv_route_apply_template(c);
    else if (c->req.route == R_INFILL)
        srv_llama_infill(c);
    else if (c->req.route == R_RESPONSES)
        srv_responses(c);
    else
        srv_serve_generation(c, NULL, NULL, NULL);
    srv_model_release(c->s, c->model);
    c->model = NULL;
}

void srv_serve_translated(srv_conn *c, const char *text, srv_route as, const srv_job_fmt *fmt, const char *fmt_id,
                          void *fmt_ctx)
{
    strbuf orig = c->req.body; /* the job parser reads the request body: give it the translation */
    srv_route route = c->req.route;
    c->req.body = (strbuf){.p = (char *)text, .len = strlen(text), .cap = strlen(text) + 1};
    c->req.route = as;
    srv_serve_generation(c, fmt, fmt_id, fmt_ctx);
    c->req.route = route;
    c->req.body = orig;
}

void srv_serve_generation(srv_conn *c, const srv_job_fmt *fmt, const char *fmt_id, void *fmt_ctx)
{
    srv *s = srv_conn_model(c);
    srv_route r = c->req.route;
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining, lost = s->device_lost;
    pthread_mutex_unlock(&s->mu);
    if ((draining || lost) && r != R_TOKENIZE && r != R_DETOKENIZE) { /* before any tokenising */
        srv_error e;
        srv_err(&e, 503, NULL, "%s", draining ? "the server is shutting down"
                                   : s->p.recover_backoff_ms ? "the GPU device was lost; the engine is being recreated, "
                                                               "retry shortly"
                                                             : "the GPU device was lost; the server must be restarted");
        e.code = "service_unavailable";
        if (r == R_CMPL || r == R_CHAT)
            srv_metrics_outcome(&s->m, SRV_OUT_UNAVAILABLE);
        return srv_reply_error(c, &e);
    }
    if (r == R_EMBED)
        return srv_route_embeddings(c);
    if (r == R_TOKENIZE)
        return srv_route_tokenize(c);
    if (r == R_DETOKENIZE)
        return srv_route_detokenize(c);
    srv_job *j = NULL;
    srv_error e;
    c->acc.gen = true;
    c->acc.ttft_ms = -1;
    if (!srv_job_from_json(s, r == R_CHAT, c->req.body.p, c->req.body.len, &j, &e)) {
        srv_metrics_outcome(&s->m, e.http >= 500 ? SRV_OUT_ERROR : SRV_OUT_INVALID);
        return srv_reply_error(c, &e);
    }
    j->fmt = fmt;
    j->fmt_ctx = fmt_ctx;
    snprintf(j->fmt_id, sizeof j->fmt_id, "%s", fmt_id ? fmt_id : "");
    if (fmt && fmt->prepare)
        fmt->prepare(j);
    j->conn = c;
    j->t_arrive = c->t_req ? c->t_req : srv_now();
    c->acc.prompt = j->n_prompt;
    if (!srv_job_submit(j, &e)) {
        srv_metrics_outcome(&s->m, e.http == 429 ? SRV_OUT_QUEUE_FULL : e.http == 503 ? SRV_OUT_UNAVAILABLE
                                   : e.http >= 500 ? SRV_OUT_ERROR : SRV_OUT_INVALID);
        srv_job_release(j);
        return srv_reply_error(c, &e);
    }
    srv_job_serve(j, c);
    if (fmt && fmt->finished)
        fmt->finished(j);
    srv_job_release(j);
}

/* ---- logging: access log, periodic stats ---------------------------------------------------- */

void srv_access_log(srv_conn *c)
{
    srv *s = c->s;
    srv_route r = c->req.route;
    if (!c->status)
        return;
    vki_log_level lv = r == R_HEALTH || r == R_READY || r == R_METRICS ? VKI_LOG_DEBUG : VKI_LOG_INFO;
    if (lv > s->p.log_level)
        return;
    char when[32], gen[160] = "";
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    double total_ms = c->t_req ? (srv_now() - c->t_req) * 1e3 : 0;
    if (c->acc.gen) {
        char ttft[24] = "-";
        if (c->acc.ttft_ms >= 0)
            snprintf(ttft, sizeof ttft, "%.1fms", c->acc.ttft_ms);
        snprintf(gen, sizeof gen, " prompt=%u output=%u cached=%u ttft=%s finish=%s", c->acc.prompt, c->acc.output,
                 c->acc.cached, ttft, c->acc.finish ? c->acc.finish : "-");
    }
    srv_log(s, lv, "%s %s %s %s %u%s total=%.1fms%s", when, c->peer, c->req.method[0] ? c->req.method : "-",
            c->req.path[0] ? c->req.path : "-", c->status, gen, total_ms, c->overflow ? " (over the cap)" : "");
}

void srv_maybe_log_stats(srv *s)
{
    double now = srv_now();
    if (!s->p.stats_interval_s || now - s->t_stats < s->p.stats_interval_s)
        return;
    pthread_mutex_lock(&s->m.mu);
    vki_batch_stats t = s->m.tick;
    uint64_t gen = s->m.generated_tokens, prompt = s->m.prompt_tokens, done = 0;
    for (int o = 0; o < SRV_OUT_COUNT; o++)
        done += s->m.outcome[o];
    pthread_mutex_unlock(&s->m.mu);
    pthread_mutex_lock(&s->mu);
    uint32_t active = s->n_active, conns = s->n_conns;
    pthread_mutex_unlock(&s->mu);
    double dt = s->t_stats ? now - s->t_stats : 0;
    bool busy = active || gen != s->stats_gen || done != s->stats_done;
    if (busy && dt > 0)
        srv_log(s, VKI_LOG_INFO, "stats: %u running, %u queued, %u in flight, %u connections | KV %.0f%% used, "
                "%.0f%% cached | %.1f prompt tok/s, %.1f gen tok/s, %llu requests finished in %.0f s", t.running,
                t.queued, active, conns, t.kv_max ? 100.0 * t.kv_used / t.kv_max : 0.0,
                t.kv_max ? 100.0 * t.kv_cached / t.kv_max : 0.0, (double)(prompt - s->stats_prompt) / dt,
                (double)(gen - s->stats_gen) / dt, (unsigned long long)(done - s->stats_done), dt);
    s->t_stats = now;
    s->stats_gen = gen;
    s->stats_prompt = prompt;
    s->stats_done = done;
}

/* ---- life cycle ------------------------------------------------------------------------------ */

static void on_tick(void *user, const vki_batch_stats *st)
{
    srv *s = user;
    srv_metrics_tick(&s->m, st);
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
                     "gemma, phi3, deepseek, harmony, tulu, granite, smollm3, exaone, glm4, command-r, plain)",
                     s->p.chat_template);
            return VKI_ERR_INVALID_ARG;
        }
        known = true;
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
    s->chat_known = known;
    chat_token_texts(s->tok, bos, sizeof bos, eos, sizeof eos);
    vki_status st = chat_template_init(&s->chat, f, tmpl, bos, eos);
    if (st == VKI_OK)
        s->tool_fmt = chat_tools_format(&s->chat, tmpl);
    free(tmpl);
    if (st == VKI_OK)
        st = chat_specials_create(s->tok, &s->specials);
    if (st != VKI_OK)
        snprintf(err, n_err, "chat template: %s", vki_status_str(st));
    return st;
}

static char **copy_strings(const char *const *v, uint32_t n)
{
    char **o = calloc(n ? n : 1, sizeof *o);
    for (uint32_t i = 0; o && i < n; i++)
        if (!(o[i] = strdup(v[i]))) {
            for (uint32_t k = 0; k < i; k++)
                free(o[k]);
            free(o);
            return NULL;
        }
    return o;
}

static void free_strings(char **v, uint32_t n)
{
    for (uint32_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

static void srv_free(srv *s)
{
    srv_repo_free(s->repo);
    srv_sessions_free(s->sessions);
    chat_specials_free(s->specials);
    chat_template_free(&s->chat);
    srv_metrics_destroy(&s->m);
    free_strings(s->api_keys, s->p.n_api_keys);
    free_strings(s->cors, s->p.n_cors_origins);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_rwlock_destroy(&s->bm_use);
    free(s->session_dir);
    free(s);
}

void srv_bm_quiesce(srv *s)
{
    pthread_rwlock_wrlock(&s->bm_use);
    pthread_rwlock_unlock(&s->bm_use);
}

vki_status srv_bm_create(srv *s, vki_batch_manager **out)
{
    vki_batch_callbacks cb = {.user = s, .tick_stats = on_tick};
    return vki_batch_manager_create(s->engine, &s->p.batch, &cb, out);
}

static vki_status check_params(const srv_params *p, char *err, size_t n_err)
{
    const char *bad = !p->max_connections ? "max_connections must be >= 1"
                    : !p->idle_timeout_s || !p->request_timeout_s ? "the timeouts must be >= 1 s"
                    : p->body_limit < 64 ? "body_limit must be >= 64 bytes"
                    : (unsigned)p->pooling > VKI_POOL_LAST ? "pooling must be none (the model's), mean or last"
                    : NULL;
    for (uint32_t i = 0; !bad && i < p->n_api_keys; i++)
        if (!p->api_keys[i] || !p->api_keys[i][0])
            bad = "an API key is empty";
    struct stat sb;
    if (!bad && p->session_dir && (stat(p->session_dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        bad = "session_dir: not a folder (--session-dir)";
    if (bad)
        snprintf(err, n_err, "%s", bad);
    return bad ? VKI_ERR_INVALID_ARG : VKI_OK;
}

/* One server: e NULL = a repository's front (HTTP only); http false = a repository's model. */
static vki_status srv_new(vki_engine *e, const srv_params *p, bool http, struct srv_repo *repo, srv **out,
                          char *err, size_t n_err)
{
    *out = NULL;
    char scratch[8];
    if (!err || !n_err) {
        err = scratch;
        n_err = sizeof scratch;
    }
    err[0] = 0;
    vki_status st = check_params(p, err, n_err);
    srv *s = st == VKI_OK ? calloc(1, sizeof *s) : NULL;
    if (!s) {
        if (p->listen_fd >= 0)
            close(p->listen_fd);
        return st != VKI_OK ? st : VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    s->p = *p;
    s->engine = e;
    s->repo = repo;
    s->is_model = !http;
    if (e) {
        s->tok = vki_engine_tokenizer(e);
        vki_engine_info(e, &s->info);
        if (s->p.pooling == VKI_POOL_NONE) /* the model's (Qwen3-Embedding: last), else mean */
            s->p.pooling = s->info.pooling != VKI_POOL_NONE ? s->info.pooling : VKI_POOL_MEAN;
    }
    s->t_start = (long long)time(NULL);
    s->next_id = 1;
    s->listen_fd = s->ep = s->wake_fd = s->reserve_fd = -1;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->mu, NULL);
    pthread_rwlock_init(&s->bm_use, NULL);
    srv_metrics_init(&s->m);
    if (e)
        set_model_id(s);
    s->api_keys = copy_strings(p->api_keys, p->n_api_keys);
    s->cors = copy_strings(p->cors_origins, p->n_cors_origins);
    s->session_dir = p->session_dir ? strdup(p->session_dir) : NULL;
    s->p.session_dir = s->session_dir;
    if (!s->api_keys || !s->cors || (p->session_dir && !s->session_dir))
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK && e)
        st = setup_chat(s, err, n_err);
    if (st == VKI_OK && e && (st = srv_bm_create(s, &s->bm)) != VKI_OK)
        snprintf(err, n_err, "batch manager: %s", vki_status_str(st));
    if (st == VKI_OK && e && (st = srv_recover_start(s)) != VKI_OK)
        snprintf(err, n_err, "recovery thread: %s", vki_status_str(st));
    if (st == VKI_OK && http)
        st = srv_http_start(s, err, n_err);
    else if (http && p->listen_fd >= 0)
        close(p->listen_fd);
    if (st != VKI_OK) {
        srv_recover_stop(s);
        s->repo = NULL; /* the caller still owns it */
        vki_batch_manager_destroy(s->bm, true);
        srv_http_stop(s);
        srv_free(s);
        return st;
    }
    if (http && e)
        srv_log(s, VKI_LOG_INFO, "model '%s' (context %u) listening on http://%s:%u%s", s->model_id, s->info.n_ctx,
                s->p.host, s->port, s->p.n_api_keys ? " (API key required)" : "");
    else if (http)
        srv_log(s, VKI_LOG_INFO, "models (a repository and/or the program's own) served on http://%s:%u%s", s->p.host, s->port,
                s->p.n_api_keys ? " (API key required)" : "");
    *out = s;
    return VKI_OK;
}

vki_status srv_create(vki_engine *e, const srv_params *p, srv **out, char *err, size_t n_err)
{
    if (!e) {
        if (p->listen_fd >= 0)
            close(p->listen_fd);
        if (err && n_err)
            snprintf(err, n_err, "no engine");
        *out = NULL;
        return VKI_ERR_INVALID_ARG;
    }
    return srv_new(e, p, true, NULL, out, err, n_err);
}

vki_status srv_model_create(vki_engine *e, const srv_params *p, srv **out, char *err, size_t n_err)
{
    srv_params q = *p;
    q.listen_fd = -1;
    return srv_new(e, &q, false, NULL, out, err, n_err);
}

vki_status srv_front_create(const srv_params *p, struct srv_repo *repo, srv **out, char *err, size_t n_err)
{
    return srv_new(NULL, p, true, repo, out, err, n_err);
}

void srv_model_destroy(srv *m)
{
    if (!m)
        return;
    srv_recover_stop(m); /* its thread waits on m->cv and may install a manager: stopped first */
    pthread_mutex_lock(&m->mu);
    m->draining = true;
    vki_batch_manager *bm = m->bm;
    m->bm = NULL;
    pthread_mutex_unlock(&m->mu);
    srv_bm_quiesce(m);
    vki_batch_manager_destroy(bm, true);
    srv_free(m);
}

uint16_t srv_port(const srv *s) { return s->port; }

void srv_drain_begin(srv *s)
{
    pthread_mutex_lock(&s->mu);
    bool was = s->draining;
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
    if (s->repo)
        srv_repo_drain(s->repo);
    if (!was)
        srv_http_stop_accepting(s);
}

bool srv_wait_idle(srv *s, double timeout_s)
{
    if (s->repo)
        return srv_repo_wait_idle(s->repo, timeout_s);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec = (time_t)end;
    ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (s->n_active && rc == 0)
        rc = pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    bool idle = s->n_active == 0;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void srv_destroy(srv *s)
{
    if (!s)
        return;
    srv_drain_begin(s);
    srv_recover_stop(s); /* a recovery under way finishes its attempt first */
    pthread_mutex_lock(&s->mu);
    vki_batch_manager *bm = s->bm;
    s->bm = NULL; /* cancels and submissions from now on see no manager */
    pthread_mutex_unlock(&s->mu);
    srv_bm_quiesce(s);
    vki_batch_manager_destroy(bm, true); /* every request left gets its final (cancelled) response */
    if (s->repo)
        srv_repo_stop(s->repo);          /* the same for every model */
    srv_http_stop(s);                    /* handlers write those answers out, then every socket closes */
    srv_free(s);
}
