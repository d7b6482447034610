/* The KServe v2 (Open Inference Protocol) HTTP routes with Triton's generate and model
 * repository extensions, over the same models and jobs as the OpenAI routes.
 *
 * Protocol documents followed (shapes and status codes):
 *   KServe / Open Inference Protocol v2, HTTP/REST:
 *     https://kserve.github.io/website/docs/concepts/architecture/data-plane/v2-protocol
 *   Triton generate extension:
 *     https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/protocol/extension_generate.html
 *   Triton model repository extension and control modes:
 *     https://docs.nvidia.com/deeplearning/sdk/triton-inference-server-guide/docs/protocol/extension_model_repository.html
 *     https://docs.nvidia.com/deeplearning/sdk/triton-inference-server-guide/docs/model_management.html
 *
 * A text model speaks as Triton's TensorRT-LLM ensemble does: a BYTES "text_input" tensor in, a
 * BYTES "text_output" out, and the request's max_tokens, temperature, top_k, top_p, stop_words
 * (or stop), random_seed (or seed), repetition / presence / frequency penalties, min_length,
 * exclude_input_in_output and stream as input tensors, generate fields or parameters. A v2
 * request is translated into the OpenAI completion body the job code already validates, so one
 * parser owns limits and 400s. Errors are {"error": "..."} (server_http.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/server/server.h"

typedef enum v2_kind {
    V2_BAD,
    V2_SERVER,       /* GET /v2 */
    V2_LIVE,         /* GET /v2/health/live */
    V2_READY,        /* GET /v2/health/ready */
    V2_META,         /* GET /v2/models/{m} */
    V2_MODEL_READY,  /* GET /v2/models/{m}/ready */
    V2_CONFIG,       /* GET /v2/models/{m}/config */
    V2_STATS,        /* GET /v2/models/{m}/stats, /v2/models/stats (all) */
    V2_INFER,        /* POST from here on (handler threads) */
    V2_GENERATE,
    V2_GENERATE_STREAM,
    V2_INDEX,
    V2_LOAD,
    V2_UNLOAD,
} v2_kind;

typedef struct v2_path {
    v2_kind kind;
    char model[128];
} v2_path;

static const struct {
    const char *suffix;
    v2_kind kind;
} MODEL_ROUTES[] = {{"", V2_META},           {"/ready", V2_MODEL_READY},       {"/config", V2_CONFIG},
                    {"/stats", V2_STATS},    {"/infer", V2_INFER},             {"/generate", V2_GENERATE},
                    {"/generate_stream", V2_GENERATE_STREAM}};

/* /v2/models/NAME[/versions/V]SUFFIX and the repository paths. Version "1" is the only one. */
static v2_path parse_path(const char *p)
{
    v2_path o = {.kind = V2_BAD};
    if (!strcmp(p, "/v2") || !strcmp(p, "/v2/"))
        return o.kind = V2_SERVER, o;
    if (!strcmp(p, "/v2/health/live"))
        return o.kind = V2_LIVE, o;
    if (!strcmp(p, "/v2/health/ready"))
        return o.kind = V2_READY, o;
    if (!strcmp(p, "/v2/repository/index"))
        return o.kind = V2_INDEX, o;
    if (!strcmp(p, "/v2/models/stats"))
        return o.kind = V2_STATS, o;
    const char *rest = NULL;
    bool repo = !strncmp(p, "/v2/repository/models/", 22);
    if (repo)
        rest = p + 22;
    else if (!strncmp(p, "/v2/models/", 11))
        rest = p + 11;
    if (!rest)
        return o;
    size_t n = strcspn(rest, "/");
    if (!n || n >= sizeof o.model)
        return o;
    memcpy(o.model, rest, n);
    o.model[n] = 0;
    rest += n;
    if (repo) {
        o.kind = !strcmp(rest, "/load") ? V2_LOAD : !strcmp(rest, "/unload") ? V2_UNLOAD : V2_BAD;
        return o;
    }
    if (!strncmp(rest, "/versions/1", 11) && (rest[11] == '/' || !rest[11]))
        rest += 11;
    for (size_t i = 0; i < sizeof MODEL_ROUTES / sizeof MODEL_ROUTES[0]; i++)
        if (!strcmp(rest, MODEL_ROUTES[i].suffix))
            o.kind = MODEL_ROUTES[i].kind;
    return o;
}

char *srv_error_json_v2(const srv_error *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", e->msg);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void reply_err(srv_conn *c, unsigned code, const char *fmt, const char *a)
{
    srv_error e;
    srv_err(&e, code, NULL, fmt, a);
    srv_reply_error(c, &e);
}

/* ---- metadata, readiness, config, statistics (io thread) ------------------------------------- */

static cJSON *tensor_meta(const char *name, const char *dtype, bool triton_config)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "name", name);
    cJSON_AddStringToObject(t, triton_config ? "data_type" : "datatype", dtype);
    cJSON *shape = cJSON_AddArrayToObject(t, triton_config ? "dims" : "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(-1));
    return t;
}

/* The tensors a text model takes, as the TensorRT-LLM ensemble names them. */
static const struct {
    const char *name, *v2, *triton;
} INPUTS[] = {
    {"text_input", "BYTES", "TYPE_STRING"}, {"max_tokens", "INT32", "TYPE_INT32"},
    {"temperature", "FP32", "TYPE_FP32"},   {"top_k", "INT32", "TYPE_INT32"},
    {"top_p", "FP32", "TYPE_FP32"},         {"stop_words", "BYTES", "TYPE_STRING"},
    {"random_seed", "UINT64", "TYPE_UINT64"}, {"repetition_penalty", "FP32", "TYPE_FP32"},
    {"presence_penalty", "FP32", "TYPE_FP32"}, {"frequency_penalty", "FP32", "TYPE_FP32"},
    {"min_length", "INT32", "TYPE_INT32"},  {"exclude_input_in_output", "BOOL", "TYPE_BOOL"},
    {"stream", "BOOL", "TYPE_BOOL"},
};

static void add_io(cJSON *o, bool triton)
{
    cJSON *in = cJSON_AddArrayToObject(o, triton ? "input" : "inputs");
    for (size_t i = 0; i < sizeof INPUTS / sizeof INPUTS[0]; i++) {
        cJSON *t = tensor_meta(INPUTS[i].name, triton ? INPUTS[i].triton : INPUTS[i].v2, triton);
        if (triton)
            cJSON_AddBoolToObject(t, "optional", i > 0);
        cJSON_AddItemToArray(in, t);
    }
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, triton ? "output" : "outputs"),
                         tensor_meta("text_output", triton ? "TYPE_STRING" : "BYTES", triton));
}

static const char *policy_name(vki_capacity_policy p)
{
    return p == VKI_POLICY_MAX_UTILIZATION ? "max-util" : p == VKI_POLICY_STATIC ? "static" : "guaranteed";
}

static cJSON *model_config(const srv *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", m->model_id);
    cJSON_AddStringToObject(o, "platform", "vkinfer");
    cJSON_AddStringToObject(o, "backend", "vkinfer");
    cJSON_AddNumberToObject(o, "max_batch_size", m->p.batch.max_batch_size);
    add_io(o, true);
    cJSON_AddBoolToObject(cJSON_AddObjectToObject(o, "model_transaction_policy"), "decoupled", true);
    cJSON *par = cJSON_AddObjectToObject(o, "parameters"); /* vkinfer's own facts */
    cJSON_AddStringToObject(par, "architecture", m->info.arch);
    cJSON_AddStringToObject(par, "weight_type", m->info.weight_type);
    cJSON_AddNumberToObject(par, "context", m->info.n_ctx);
    cJSON_AddNumberToObject(par, "kv_tokens", (double)m->info.kv_pages * m->info.page_size);
    cJSON_AddNumberToObject(par, "device_memory_bytes", (double)m->info.device_bytes);
    cJSON_AddNumberToObject(par, "max_num_tokens", m->p.batch.max_num_tokens);
    cJSON_AddStringToObject(par, "policy", policy_name(m->p.batch.policy));
    cJSON_AddStringToObject(par, "chat_template", chat_family_name(m->chat.family));
    return o;
}

static cJSON *count_ns(uint64_t count, double seconds)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", (double)count);
    cJSON_AddNumberToObject(o, "ns", seconds * 1e9);
    return o;
}

/* Triton's model statistics from the model's counters: success = requests that ended by stop or
 * length (ns: their end-to-end time), fail = the other outcomes; execution_count = ticks. */
static cJSON *model_stats(srv *m)
{
    pthread_mutex_lock(&m->m.mu);
    srv_metrics c = m->m;
    pthread_mutex_unlock(&m->m.mu);
    uint64_t ok = c.outcome[SRV_OUT_STOP] + c.outcome[SRV_OUT_LENGTH], fail = 0;
    for (int o = SRV_OUT_CANCELLED; o < SRV_OUT_COUNT; o++)
        fail += c.outcome[o];
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "name", m->model_id);
    cJSON_AddStringToObject(s, "version", "1");
    cJSON_AddNumberToObject(s, "inference_count", (double)ok);
    cJSON_AddNumberToObject(s, "execution_count", (double)c.tick.iteration);
    cJSON *is = cJSON_AddObjectToObject(s, "inference_stats");
    cJSON_AddItemToObject(is, "success", count_ns(ok, c.e2e.sum));
    cJSON_AddItemToObject(is, "fail", count_ns(fail, 0));
    cJSON_AddItemToObject(is, "compute_infer", count_ns(c.step.total, c.step.sum));
    cJSON *tk = cJSON_AddObjectToObject(s, "tokens"); /* vkinfer's: what the counters above hide */
    cJSON_AddNumberToObject(tk, "prompt", (double)c.prompt_tokens);
    cJSON_AddNumberToObject(tk, "cached", (double)c.cached_tokens);
    cJSON_AddNumberToObject(tk, "generated", (double)c.generated_tokens);
    return s;
}

static void all_stats(srv_conn *c)
{
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "model_stats");
    cJSON *idx = srv_repo_index(c->s, true);
    for (const cJSON *it = idx ? idx->child : NULL; it; it = it->next) {
        srv_error e;
        srv *m = srv_model_acquire(c->s, cJSON_GetObjectItem(it, "name")->valuestring, true, &e);
        if (m)
            cJSON_AddItemToArray(a, model_stats(m));
        srv_model_release(c->s, m);
    }
    cJSON_Delete(idx);
    srv_reply_json(c, 200, o);
}

static void server_meta(srv_conn *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", "vkinfer");
    cJSON_AddStringToObject(o, "version", SRV_VERSION);
    cJSON *x = cJSON_AddArrayToObject(o, "extensions");
    cJSON_AddItemToArray(x, cJSON_CreateString("model_repository"));
    cJSON_AddItemToArray(x, cJSON_CreateString("generate"));
    cJSON_AddItemToArray(x, cJSON_CreateString("statistics"));
    srv_reply_json(c, 200, o);
}

static void health(srv_conn *c, v2_kind k)
{
    srv *s = c->s;
    pthread_mutex_lock(&s->mu);
    bool ready = !s->draining && !s->device_lost;
    pthread_mutex_unlock(&s->mu);
    cJSON *o = cJSON_CreateObject();
    if (k == V2_LIVE) {
        cJSON_AddBoolToObject(o, "live", true);
        return srv_reply_json(c, 200, o);
    }
    cJSON_AddBoolToObject(o, "ready", ready);
    srv_reply_json(c, ready ? 200 : 503, o);
}

/* /v2/models/{m}/ready: 200 when it serves, 503 while it loads, unloads or failed, 404 unknown. */
static void model_ready(srv_conn *c, const char *name)
{
    char reason[512];
    const char *st = srv_repo_state(c->s, name, reason, sizeof reason);
    if (!st)
        return reply_err(c, 404, "unknown model '%.128s'", name);
    bool ready = !strcmp(st, "READY");
    if (ready) {
        srv_error e;
        srv *m = srv_model_acquire(c->s, name, true, &e);
        if (m) {
            pthread_mutex_lock(&m->mu);
            ready = !m->draining && !m->device_lost;
            pthread_mutex_unlock(&m->mu);
        }
        srv_model_release(c->s, m);
        ready &= m != NULL;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddBoolToObject(o, "ready", ready);
    cJSON_AddStringToObject(o, "state", st);
    if (reason[0])
        cJSON_AddStringToObject(o, "reason", reason);
    srv_reply_json(c, ready ? 200 : 503, o);
}

static bool v2_open(v2_kind k) { return k == V2_LIVE || k == V2_READY || k == V2_MODEL_READY; }

void srv_kserve_small(srv_conn *c)
{
    srv_req *r = &c->req;
    v2_path vp = parse_path(r->path);
    bool get = !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD"), post = !strcmp(r->method, "POST");
    if (vp.kind == V2_BAD)
        return reply_err(c, 404, "unknown route: %.200s", r->path);
    bool want_post = vp.kind >= V2_INFER;
    if (want_post ? !post : !get) {
        srv_error e;
        srv_err(&e, 405, NULL, "%.16s is not allowed on %.200s", r->method, r->path);
        return srv_reply(c, 405, "application/json", srv_error_json_v2(&e),
                         want_post ? "Allow: POST, OPTIONS\r\n" : "Allow: GET, HEAD, OPTIONS\r\n");
    }
    if (!v2_open(vp.kind) && !srv_authorized(c->s, r->auth)) {
        srv_error e;
        srv_err(&e, 401, NULL, "%s", r->auth[0] ? "invalid API key (Authorization: Bearer ...)"
                                                : "an API key is required: send Authorization: Bearer <key>");
        return srv_reply_error(c, &e);
    }
    if (want_post) {
        r->route = R_V2_HEAVY; /* a handler thread answers */
        return;
    }
    switch (vp.kind) {
    case V2_SERVER: return server_meta(c);
    case V2_LIVE:
    case V2_READY: return health(c, vp.kind);
    case V2_MODEL_READY: return model_ready(c, vp.model);
    case V2_STATS:
        if (!vp.model[0])
            return all_stats(c);
        break;
    default: break;
    }
    srv_error e;
    srv *m = srv_model_acquire(c->s, vp.model, true, &e);
    if (!m)
        return srv_reply_error(c, &e);
    cJSON *o = NULL;
    if (vp.kind == V2_META) {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", m->model_id);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "versions"), cJSON_CreateString("1"));
        cJSON_AddStringToObject(o, "platform", "vkinfer");
        add_io(o, false);
    } else if (vp.kind == V2_CONFIG) {
        o = model_config(m);
    } else {
        o = cJSON_CreateObject();
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "model_stats"), model_stats(m));
    }
    srv_model_release(c->s, m);
    srv_reply_json(c, 200, o);
}

/* ---- requests -> an OpenAI completion body ------------------------------------------------------- */

/* The scalar of an input tensor's data ([x] or [[x]]), or v itself. */
static const cJSON *scalar(const cJSON *v)
{
    while (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1)
        v = v->child;
    return v;
}

/* Flattens a v2 request into name -> value: generate's top-level fields, infer's input tensors
 * (data), then parameters (which do not override a tensor of the same name). */
static bool gather(const cJSON *req, bool infer, cJSON *args, srv_error *e)
{
    if (!cJSON_IsObject(req))
        return srv_err(e, 400, NULL, "the request body must be a JSON object"), false;
    for (const cJSON *f = req->child; f; f = f->next) {
        const char *k = f->string;
        if (!strcmp(k, "id") || !strcmp(k, "parameters") || (infer && !strcmp(k, "outputs")))
            continue;
        if (infer && strcmp(k, "inputs"))
            return srv_err(e, 400, NULL, "unknown field '%.64s' in an infer request", k), false;
        if (!infer) {
            cJSON_AddItemToObject(args, k, cJSON_Duplicate(f, true));
            continue;
        }
        if (!cJSON_IsArray(f))
            return srv_err(e, 400, NULL, "\"inputs\" must be an array of tensors"), false;
        for (const cJSON *t = f->child; t; t = t->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            const cJSON *data = cJSON_GetObjectItemCaseSensitive(t, "data");
            if (!cJSON_IsString(name) || !cJSON_IsArray(data))
                return srv_err(e, 400, NULL, "an input tensor needs \"name\" and \"data\" (JSON tensor data; binary "
                               "tensor data is not supported)"), false;
            if (cJSON_GetObjectItemCaseSensitive(args, name->valuestring))
                return srv_err(e, 400, NULL, "input '%.64s' given twice", name->valuestring), false;
            cJSON_AddItemToObject(args, name->valuestring, cJSON_Duplicate(data, true));
        }
    }
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(req, "parameters");
    if (par && !cJSON_IsObject(par))
        return srv_err(e, 400, NULL, "\"parameters\" must be an object"), false;
    for (const cJSON *p = par ? par->child : NULL; p; p = p->next)
        if (!cJSON_GetObjectItemCaseSensitive(args, p->string))
            cJSON_AddItemToObject(args, p->string, cJSON_Duplicate(p, true));
    return true;
}

/* v2 names -> the completion body's; NULL: handled below or refused. */
static const struct {
    const char *v2, *openai;
} RENAME[] = {{"max_tokens", "max_tokens"},       {"temperature", "temperature"},
              {"top_k", "top_k"},                 {"top_p", "top_p"},
              {"random_seed", "seed"},            {"seed", "seed"},
              {"repetition_penalty", "repetition_penalty"}, {"presence_penalty", "presence_penalty"},
              {"frequency_penalty", "frequency_penalty"},   {"min_length", "min_tokens"},
              {"min_tokens", "min_tokens"}};

/* Words lists: "a,b" strings (TensorRT-LLM's) or arrays of strings. */
static bool words(const cJSON *v, cJSON *out, const char *name, srv_error *e)
{
    v = scalar(v);
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        while (*s) {
            size_t n = strcspn(s, ",");
            if (n) {
                char *w = strndup(s, n);
                cJSON_AddItemToArray(out, cJSON_CreateString(w ? w : ""));
                free(w);
            }
            s += n + (s[n] == ',');
        }
        return true;
    }
    for (const cJSON *w = cJSON_IsArray(v) ? v->child : NULL; w; w = w->next)
        if (cJSON_IsString(w))
            cJSON_AddItemToArray(out, cJSON_CreateString(w->valuestring));
        else
            return srv_err(e, 400, name, "%s: strings only", name), false;
    if (!cJSON_IsArray(v))
        return srv_err(e, 400, name, "%s: a string or an array of strings", name), false;
    return true;
}

static bool is_false(const cJSON *v) { return cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0); }

/* Triton's sequence batcher parameters of one request (sessions.c keeps the sequence). */
typedef struct v2_seq {
    uint64_t id;               /* 0: not part of a sequence */
    bool start, end;
    bool finished;             /* seq_finished ran (else the request never became a job) */
} v2_seq;

static bool seq_arg(const char *k, const cJSON *v, v2_seq *sq, srv_error *e)
{
    if (!strcmp(k, "sequence_id")) {
        if (cJSON_IsNumber(v) && v->valuedouble == 0)
            return true; /* Triton's "no sequence" */
        return (sq->id = srv_session_id(v, k, e)) != 0;
    }
    if (!cJSON_IsBool(v))
        return srv_err(e, 400, k, "%s: a boolean", k), false;
    *(strcmp(k, "sequence_start") ? &sq->end : &sq->start) = cJSON_IsTrue(v);
    return true;
}

/* One argument into body; stream into *stream, sequence parameters into *sq. */
static bool map_arg(const cJSON *a, cJSON *body, int *stream, v2_seq *sq, srv_error *e)
{
    const char *k = a->string;
    const cJSON *v = scalar(a);
    for (size_t i = 0; i < sizeof RENAME / sizeof RENAME[0]; i++)
        if (!strcmp(k, RENAME[i].v2)) {
            if (cJSON_GetObjectItemCaseSensitive(body, RENAME[i].openai))
                return srv_err(e, 400, k, "%s given twice", k), false;
            cJSON_AddItemToObject(body, RENAME[i].openai, cJSON_Duplicate(v, true));
            return true;
        }
    if (!strcmp(k, "text_input")) {
        if (!cJSON_IsString(v))
            return srv_err(e, 400, k, "text_input: one string (one prompt per request)"), false;
        cJSON_AddItemToObject(body, "prompt", cJSON_Duplicate(v, true));
    } else if (!strcmp(k, "stop_words") || !strcmp(k, "stop")) {
        cJSON *w = cJSON_GetObjectItemCaseSensitive(body, "stop");
        if (!w)
            w = cJSON_AddArrayToObject(body, "stop");
        return words(a, w, k, e);
    } else if (!strcmp(k, "bad_words")) {
        cJSON *w = cJSON_CreateArray();
        bool ok = words(a, w, k, e), none = !w->child;
        cJSON_Delete(w);
        if (ok && !none)
            return srv_err(e, 400, k, "bad_words: not supported (use stop_words, or logit_bias on /v1/completions)"),
                   false;
        return ok;
    } else if (!strcmp(k, "stream")) {
        if (!cJSON_IsBool(v))
            return srv_err(e, 400, k, "stream: a boolean"), false;
        *stream = cJSON_IsTrue(v);
    } else if (!strcmp(k, "exclude_input_in_output")) {
        if (!cJSON_IsBool(v))
            return srv_err(e, 400, k, "exclude_input_in_output: a boolean"), false;
        cJSON_AddBoolToObject(body, "echo", cJSON_IsFalse(v));
    } else if (!strcmp(k, "beam_width") || !strcmp(k, "return_log_probs") || !strcmp(k, "end_id") ||
               !strcmp(k, "pad_id")) {
        bool harmless = (!strcmp(k, "beam_width") && cJSON_IsNumber(v) && v->valuedouble == 1) ||
                        (!strcmp(k, "return_log_probs") && is_false(v));
        if (!harmless)
            return srv_err(e, 400, k, "%s: not supported (the model's own end token ends the text; greedy or "
                           "sampled decoding, one beam)", k), false;
    } else if (!strcmp(k, "sequence_id") || !strcmp(k, "sequence_start") || !strcmp(k, "sequence_end")) {
        return seq_arg(k, v, sq, e);
    } else {
        return srv_err(e, 400, k, "unknown input or parameter '%.64s' (known: text_input, max_tokens, "
                       "temperature, top_k, top_p, stop_words, random_seed, repetition_penalty, presence_penalty, "
                       "frequency_penalty, min_length, exclude_input_in_output, stream)", k), false;
    }
    return true;
}

/* The completion body for a v2 request; *stream: -1 unset, 0, 1. *id: the request's id. */
static cJSON *to_completion(const srv_req *r, bool infer, int *stream, v2_seq *sq, char *id, size_t n_id,
                            srv_error *e)
{
    srv_json_err je;
    cJSON *req = srv_json_parse(r->body.p ? r->body.p : "", r->body.len, &je);
    if (!req) {
        srv_err(e, 400, NULL, "invalid JSON at byte %zu: %s", je.at, je.msg);
        return NULL;
    }
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(req, "id");
    snprintf(id, n_id, "%s", cJSON_IsString(rid) ? rid->valuestring : "");
    cJSON *args = cJSON_CreateObject(), *body = cJSON_CreateObject();
    bool ok = gather(req, infer, args, e);
    for (const cJSON *a = ok ? args->child : NULL; a && ok; a = a->next)
        ok = map_arg(a, body, stream, sq, e);
    if (ok && !cJSON_GetObjectItemCaseSensitive(body, "prompt")) {
        srv_err(e, 400, "text_input", "text_input is required");
        ok = false;
    }
    if (ok && !sq->id && (sq->start || sq->end)) {
        srv_err(e, 400, "sequence_id", "sequence_start / sequence_end need a sequence_id");
        ok = false;
    }
    cJSON_Delete(args);
    cJSON_Delete(req);
    if (!ok)
        cJSON_Delete(body);
    return ok ? body : NULL;
}

/* A sequence's request: the prompt becomes the sequence's tokens so far + this text's tokens
 * (no BOS after the first request). */
static bool seq_prompt(srv *m, cJSON *body, const v2_seq *sq, srv_error *e)
{
    int32_t *hist = NULL;
    uint32_t n_hist = 0;
    if (!srv_seq_begin(m, sq->id, sq->start, &hist, &n_hist, e))
        return false;
    const char *text = cJSON_GetObjectItemCaseSensitive(body, "prompt")->valuestring;
    size_t len = strlen(text), n = 0;
    int32_t *ids = len < (1u << 26) ? malloc((len + 8) * sizeof *ids) : NULL;
    vki_status st = ids ? vki_tokenize(m->tok, text, len, n_hist == 0, true, ids, len + 8, &n)
                        : VKI_ERR_OUT_OF_HOST_MEMORY;
    cJSON *arr = st == VKI_OK ? cJSON_CreateArray() : NULL;
    for (uint32_t i = 0; arr && i < n_hist + n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(i < n_hist ? hist[i] : ids[i - n_hist]));
    free(hist);
    free(ids);
    if (!arr) {
        srv_seq_finish(m, sq->id, NULL, 0, NULL, 0, false, false);
        return srv_err(e, 400, "text_input", "text_input: cannot tokenize: %s", vki_status_str(st)), false;
    }
    cJSON_ReplaceItemInObjectCaseSensitive(body, "prompt", arr);
    return true;
}

/* ---- answers in v2 shapes ----------------------------------------------------------------------- */

static cJSON *envelope(const srv_job *j)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_name", j->s->model_id);
    cJSON_AddStringToObject(o, "model_version", "1");
    if (j->fmt_id[0])
        cJSON_AddStringToObject(o, "id", j->fmt_id);
    return o;
}

static const char *text_of(const srv_job *j)
{
    return j->ch[0].text.p ? j->ch[0].text.p : "";
}

/* An echoed prompt (exclude_input_in_output: false) goes first, as TensorRT-LLM's ensemble. */
static char *full_text(const srv_job *j)
{
    strbuf b = {0};
    strbuf_printf(&b, "%s%s", j->echo && j->prompt_text ? j->prompt_text : "", text_of(j));
    return b.p ? b.p : strdup("");
}

static char *infer_answer(srv_job *j)
{
    cJSON *o = envelope(j), *t = cJSON_CreateObject();
    char *text = full_text(j);
    cJSON_AddStringToObject(t, "name", "text_output");
    cJSON_AddStringToObject(t, "datatype", "BYTES");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(t, "shape"), cJSON_CreateNumber(1));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(t, "data"), cJSON_CreateString(text));
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "outputs"), t);
    cJSON *p = cJSON_AddObjectToObject(o, "parameters");
    cJSON_AddStringToObject(p, "finish_reason", srv_choice_finish(&j->ch[0]));
    cJSON_AddNumberToObject(p, "prompt_tokens", j->n_prompt);
    free(text);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static char *generate_answer(srv_job *j)
{
    cJSON *o = envelope(j);
    char *text = full_text(j);
    cJSON_AddStringToObject(o, "text_output", text);
    cJSON_AddStringToObject(o, "finish_reason", srv_choice_finish(&j->ch[0]));
    free(text);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static bool sse(strbuf *out, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    bool ok = s && strbuf_printf(out, "data: %s\n\n", s);
    cJSON_free(s);
    return ok;
}

/* One streamed piece: {"model_name", "model_version", "text_output"}; the last also names why
 * it ended. Empty pieces other than the last are not sent. */
static bool generate_chunk(srv_job *j, const srv_choice *ch, strbuf *out, const char *text, const char *finish)
{
    (void)ch;
    if (!text[0] && !finish)
        return true;
    cJSON *o = envelope(j);
    cJSON_AddStringToObject(o, "text_output", text);
    if (finish)
        cJSON_AddStringToObject(o, "finish_reason", finish);
    return sse(out, o);
}

static bool generate_end(srv_job *j, strbuf *out, const srv_error *failed)
{
    (void)j;
    if (!failed)
        return true;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", failed->msg);
    return sse(out, o);
}

/* A sequence's request pins its KV for the next one (the manager's session of the same id). */
static void seq_prepare(srv_job *j)
{
    const v2_seq *sq = j->fmt_ctx;
    if (sq && sq->id && !sq->end)
        j->session_id = sq->id;
}

/* ... and leaves the sequence its prompt + everything it generated, or ends it. */
static void seq_finished(srv_job *j)
{
    v2_seq *sq = j->fmt_ctx;
    if (!sq || !sq->id)
        return;
    sq->finished = true;
    const srv_choice *ch = &j->ch[0];
    bool ok = j->outcome == SRV_OUT_STOP || j->outcome == SRV_OUT_LENGTH;
    srv_seq_finish(j->s, sq->id, j->prompt, j->n_prompt, ch->h.tok, ch->n_used, ok, sq->end);
}

static const srv_job_fmt INFER_FMT = {.answer = infer_answer, .chunk = generate_chunk, .end = generate_end,
                                      .prepare = seq_prepare, .finished = seq_finished};
static const srv_job_fmt GENERATE_FMT = {.answer = generate_answer, .chunk = generate_chunk, .end = generate_end,
                                         .prepare = seq_prepare, .finished = seq_finished};

/* ---- handler-thread routes ------------------------------------------------------------------------ */

static void generation(srv_conn *c, const v2_path *vp)
{
    srv_error e;
    int stream = -1;
    char id[128];
    v2_seq sq = {0};
    bool infer = vp->kind == V2_INFER;
    cJSON *body = to_completion(&c->req, infer, &stream, &sq, id, sizeof id, &e);
    if (body && infer && stream == 1) {
        cJSON_Delete(body);
        body = NULL;
        srv_err(&e, 400, "stream", "stream: an infer request has one response; use /generate_stream");
    }
    if (body && !(c->model = srv_model_acquire(c->s, vp->model, true, &e))) {
        cJSON_Delete(body);
        body = NULL;
    }
    if (body && sq.id && !seq_prompt(c->model, body, &sq, &e)) {
        cJSON_Delete(body);
        body = NULL;
    }
    /* the route decides streaming */
    char *text = body && cJSON_AddBoolToObject(body, "stream", vp->kind == V2_GENERATE_STREAM)
                     ? cJSON_PrintUnformatted(body) : NULL;
    if (body && !text) {
        srv_err(&e, 500, NULL, "out of memory");
        if (sq.id)
            srv_seq_finish(c->model, sq.id, NULL, 0, NULL, 0, false, false);
    }
    cJSON_Delete(body);
    if (text) {
        strbuf orig = c->req.body; /* the job parser reads the request body: give it the translation */
        c->req.body = (strbuf){.p = text, .len = strlen(text), .cap = strlen(text) + 1};
        srv_serve_generation(c, infer ? &INFER_FMT : &GENERATE_FMT, id, sq.id ? &sq : NULL);
        c->req.body = orig;
        if (sq.id && !sq.finished) /* refused before it ran (400, 429, 503): the sequence is unchanged */
            srv_seq_finish(c->model, sq.id, NULL, 0, NULL, 0, false, sq.end);
        cJSON_free(text);
    } else {
        srv_reply_error(c, &e);
    }
    srv_model_release(c->s, c->model);
    c->model = NULL;
}

void srv_kserve_heavy(srv_conn *c)
{
    v2_path vp = parse_path(c->req.path);
    srv_error e;
    switch (vp.kind) {
    case V2_INFER:
    case V2_GENERATE:
    case V2_GENERATE_STREAM: return generation(c, &vp);
    case V2_INDEX: {
        srv_json_err je;
        cJSON *req = c->req.body.len ? srv_json_parse(c->req.body.p, c->req.body.len, &je) : NULL;
        const cJSON *ready = cJSON_GetObjectItemCaseSensitive(req, "ready");
        if (c->req.body.len && !req)
            return reply_err(c, 400, "invalid JSON: %s", je.msg);
        cJSON *idx = srv_repo_index(c->s, cJSON_IsTrue(ready));
        cJSON_Delete(req);
        return srv_reply_json(c, 200, idx);
    }
    case V2_LOAD:
    case V2_UNLOAD:
        if (!(vp.kind == V2_LOAD ? srv_repo_load(c->s, vp.model, &e) : srv_repo_unload(c->s, vp.model, &e)))
            return srv_reply_error(c, &e);
        return srv_reply_json(c, 200, cJSON_CreateObject());
    default: return reply_err(c, 404, "unknown route: %.200s", c->req.path);
    }
}
