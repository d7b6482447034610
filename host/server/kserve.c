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
 * exclude_input_in_output, stream, beam_width (with length_penalty and early_stopping, TensorRT-LLM's
 * defaults 0 and on), return_log_probs and return_generation_logits as input tensors, generate
 * fields or parameters. Those last two add TensorRT-LLM's cum_log_probs [beam],
 * output_log_probs [beam, L] and generation_logits [beam, L, vocab] (L the longest beam, the
 * others padded with 0; with Triton's batch dimension of 1 in infer's tensors, flat arrays in
 * generate's answer, a one-element tensor as its value). A v2 request is translated into the
 * OpenAI completion body the job code already validates (beam_width into use_beam_search with
 * best_of = n = beam_width), so one parser owns limits and 400s. Errors are {"error": "..."}
 * (server_http.c). */
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
    {"stream", "BOOL", "TYPE_BOOL"},        {"beam_width", "INT32", "TYPE_INT32"},
    {"length_penalty", "FP32", "TYPE_FP32"}, {"early_stopping", "INT32", "TYPE_INT32"},
    {"return_log_probs", "BOOL", "TYPE_BOOL"}, {"return_generation_logits", "BOOL", "TYPE_BOOL"},
};

/* ... and what it answers (the last three when return_log_probs / return_generation_logits). */
static const struct {
    const char *name, *v2, *triton;
} OUTPUTS[] = {
    {"text_output", "BYTES", "TYPE_STRING"}, {"cum_log_probs", "FP32", "TYPE_FP32"},
    {"output_log_probs", "FP32", "TYPE_FP32"}, {"generation_logits", "FP32", "TYPE_FP32"},
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
    cJSON *out = cJSON_AddArrayToObject(o, triton ? "output" : "outputs");
    for (size_t i = 0; i < sizeof OUTPUTS / sizeof OUTPUTS[0]; i++)
        cJSON_AddItemToArray(out, tensor_meta(OUTPUTS[i].name, triton ? OUTPUTS[i].triton : OUTPUTS[i].v2, triton));
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

/* A v2 request's own state (the job's fmt_ctx): its sequence, and the TensorRT-LLM outputs and
 * beam search it asked for. */
typedef struct v2_ctx {
    v2_seq sq;
    bool want_lp, want_rows;   /* return_log_probs, return_generation_logits */
    uint32_t beam_width;       /* 0: not given */
    double length_penalty;     /* TensorRT-LLM's default 0 (no normalisation) */
    int early_stopping;        /* 0 false, 1 true (TensorRT-LLM's default), 2 "never" */
} v2_ctx;

/* A boolean flag as TensorRT-LLM's inputs carry them: true / false or 1 / 0. */
static bool flag_arg(const char *k, const cJSON *v, bool *out, srv_error *e)
{
    if (!cJSON_IsBool(v) && !(cJSON_IsNumber(v) && (v->valuedouble == 0 || v->valuedouble == 1)))
        return srv_err(e, 400, k, "%s: a boolean", k), false;
    *out = cJSON_IsTrue(v) || (cJSON_IsNumber(v) && v->valuedouble == 1);
    return true;
}

/* beam_width, length_penalty / len_penalty, early_stopping, return_log_probs and
 * return_generation_logits into x. */
static bool beam_arg(const char *k, const cJSON *v, v2_ctx *x, srv_error *e)
{
    if (!strcmp(k, "return_log_probs"))
        return flag_arg(k, v, &x->want_lp, e);
    if (!strcmp(k, "return_generation_logits"))
        return flag_arg(k, v, &x->want_rows, e);
    if (!strcmp(k, "beam_width")) {
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble || v->valuedouble < 1 ||
            v->valuedouble > SRV_MAX_N)
            return srv_err(e, 400, k, "beam_width: an integer in 1..%d", SRV_MAX_N), false;
        x->beam_width = (uint32_t)v->valuedouble;
        return true;
    }
    if (!strcmp(k, "early_stopping")) {
        bool never = cJSON_IsString(v) && !strcmp(v->valuestring, "never"), on = false;
        if (!never && !flag_arg(k, v, &on, e))
            return srv_err(e, 400, k, "early_stopping: true / 1, false / 0 or \"never\""), false;
        x->early_stopping = never ? 2 : on;
        return true;
    }
    if (!cJSON_IsNumber(v))
        return srv_err(e, 400, k, "%s: a number", k), false;
    x->length_penalty = v->valuedouble;
    return true;
}

static bool is_beam_arg(const char *k)
{
    static const char *const names[] = {"beam_width", "length_penalty", "len_penalty", "early_stopping",
                                        "return_log_probs", "return_generation_logits"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(k, names[i]))
            return true;
    return false;
}

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

/* One argument into body; stream into *stream, the rest into *x. */
static bool map_arg(const cJSON *a, cJSON *body, int *stream, v2_ctx *x, srv_error *e)
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
    } else if (is_beam_arg(k)) {
        return beam_arg(k, v, x, e);
    } else if (!strcmp(k, "end_id") || !strcmp(k, "pad_id") || !strcmp(k, "return_context_logits")) {
        if (!strcmp(k, "return_context_logits") ? !is_false(v) : true)
            return srv_err(e, 400, k, "%s: not supported on the v2 routes (%s)", k,
                           k[0] == 'r' ? "the C API returns context logits" : "the model's own end token ends the text"),
                   false;
    } else if (!strcmp(k, "sequence_id") || !strcmp(k, "sequence_start") || !strcmp(k, "sequence_end")) {
        return seq_arg(k, v, &x->sq, e);
    } else {
        return srv_err(e, 400, k, "unknown input or parameter '%.64s' (known: text_input, max_tokens, "
                       "temperature, top_k, top_p, stop_words, random_seed, repetition_penalty, presence_penalty, "
                       "frequency_penalty, min_length, exclude_input_in_output, stream, beam_width, length_penalty, "
                       "early_stopping, return_log_probs, return_generation_logits)", k), false;
    }
    return true;
}

/* beam_width > 1: vLLM's use_beam_search with best_of = n = beam_width (every beam answered)
 * and TensorRT-LLM's defaults (length_penalty 0, early_stopping on); return_log_probs: the
 * chosen tokens' logprobs (OpenAI's logprobs 0). */
static void beam_body(cJSON *body, const v2_ctx *x)
{
    if (x->beam_width > 1) {
        cJSON_AddBoolToObject(body, "use_beam_search", true);
        cJSON_AddNumberToObject(body, "best_of", x->beam_width);
        cJSON_AddNumberToObject(body, "n", x->beam_width);
        cJSON_AddNumberToObject(body, "length_penalty", x->length_penalty);
        if (x->early_stopping == 2)
            cJSON_AddStringToObject(body, "early_stopping", "never");
        else
            cJSON_AddBoolToObject(body, "early_stopping", x->early_stopping);
    }
    if (x->want_lp)
        cJSON_AddNumberToObject(body, "logprobs", 0);
}

/* The completion body for a v2 request; *stream: -1 unset, 0, 1. *id: the request's id. */
static cJSON *to_completion(const srv_req *r, bool infer, int *stream, v2_ctx *x, char *id, size_t n_id,
                            srv_error *e)
{
    v2_seq *sq = &x->sq;
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
        ok = map_arg(a, body, stream, x, e);
    if (ok)
        beam_body(body, x);
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

/* Choice i's text (beam i with beam_width > 1), the echoed prompt first (exclude_input_in_output:
 * false) as TensorRT-LLM's ensemble does. */
static char *full_text(const srv_job *j, uint32_t i)
{
    strbuf b = {0};
    strbuf_printf(&b, "%s%s", j->echo && j->prompt_text ? j->prompt_text : "", j->ch[i].text.p ? j->ch[i].text.p : "");
    return b.p ? b.p : strdup("");
}

/* text_output: one string, or one per beam. */
static cJSON *texts(const srv_job *j)
{
    cJSON *a = j->n > 1 ? cJSON_CreateArray() : NULL;
    for (uint32_t i = 0; i < j->n; i++) {
        char *t = full_text(j, i);
        cJSON *str = cJSON_CreateString(t ? t : "");
        free(t);
        if (!a)
            return str;
        cJSON_AddItemToArray(a, str);
    }
    return a;
}

/* The per-token outputs of TensorRT-LLM, [beam][L] with L the longest beam's length, shorter
 * beams padded with 0 (as its output_log_probs and generation_logits are):
 *  cum_log_probs [beam], output_log_probs [beam][L], generation_logits [beam][L][vocab]. The
 * logits rows are written into the answer's text in place of ROWS_MARK: a cJSON node per float
 * would take ~16x the rows' own memory. */
#define ROWS_MARK "@@vki_generation_logits@@"

static uint32_t longest(const srv_job *j)
{
    uint32_t L = 0;
    for (uint32_t i = 0; i < j->n; i++)
        L = srv_choice_tokens(&j->ch[i]) > L ? srv_choice_tokens(&j->ch[i]) : L;
    return L;
}

static cJSON *cum_log_probs(const srv_job *j)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; i < j->n; i++) {
        double sum = 0;
        for (uint32_t k = 0; k < srv_choice_tokens(&j->ch[i]); k++)
            sum += j->ch[i].h.lp[k];
        cJSON_AddItemToArray(a, cJSON_CreateNumber(sum));
    }
    return a;
}

static cJSON *output_log_probs(const srv_job *j, uint32_t L)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; i < j->n; i++)
        for (uint32_t k = 0; k < L; k++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber(k < srv_choice_tokens(&j->ch[i]) ? j->ch[i].h.lp[k] : 0.0));
    return a;
}

/* The answer's text with the generation logits where ROWS_MARK stands. NULL: out of memory. */
static char *splice_rows(const srv_job *j, char *json, uint32_t L)
{
    const char *at = json ? strstr(json, ":\"" ROWS_MARK "\"") : NULL; /* text is escaped: no bare :" there */
    if (!at)
        return json;
    size_t V = j->s->info.n_vocab;
    strbuf b = {0};
    bool ok = strbuf_put(&b, json, (size_t)(at - json)) && strbuf_put(&b, ":[", 2);
    for (uint32_t i = 0; ok && i < j->n; i++) {
        const srv_choice *ch = &j->ch[i];
        uint32_t n = srv_choice_tokens(ch) < ch->n_rows ? srv_choice_tokens(ch) : ch->n_rows;
        for (size_t k = 0; ok && k < (size_t)L * V; k++)
            ok = strbuf_printf(&b, "%s%.9g", i || k ? "," : "", k < n * V ? ch->rows[k] : 0.0f);
    }
    size_t mark = strlen(":\"" ROWS_MARK "\"");
    ok = ok && strbuf_put(&b, "]", 1) && strbuf_put(&b, at + mark, strlen(at + mark));
    free(json); /* cJSON's default allocator: the answers are released with free() */
    if (!ok)
        strbuf_free(&b);
    return b.p;
}

/* One infer output tensor: FP32 with shape [1, dims...] (Triton's batch of one). */
static void add_tensor(cJSON *outputs, const char *name, cJSON *data, uint32_t n_dims, const uint32_t *dims)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "name", name);
    cJSON_AddStringToObject(t, "datatype", "FP32");
    cJSON *shape = cJSON_AddArrayToObject(t, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(1));
    for (uint32_t d = 0; d < n_dims; d++)
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(dims[d]));
    cJSON_AddItemToObject(t, "data", data);
    cJSON_AddItemToArray(outputs, t);
}

static char *infer_answer(srv_job *j)
{
    const v2_ctx *x = j->fmt_ctx;
    uint32_t L = longest(j), dims[3] = {j->n, L, j->s->info.n_vocab};
    cJSON *o = envelope(j), *t = cJSON_CreateObject(), *outputs = cJSON_AddArrayToObject(o, "outputs");
    cJSON_AddStringToObject(t, "name", "text_output");
    cJSON_AddStringToObject(t, "datatype", "BYTES");
    cJSON *shape = cJSON_AddArrayToObject(t, "shape"); /* [1], or [1, beams] */
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(1));
    if (j->n > 1)
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(j->n));
    cJSON *txt = texts(j);
    if (cJSON_IsArray(txt))
        cJSON_AddItemToObject(t, "data", txt);
    else
        cJSON_AddItemToArray(cJSON_AddArrayToObject(t, "data"), txt);
    cJSON_AddItemToArray(outputs, t);
    if (x->want_lp) {
        add_tensor(outputs, "cum_log_probs", cum_log_probs(j), 1, dims);
        add_tensor(outputs, "output_log_probs", output_log_probs(j, L), 2, dims);
    }
    if (x->want_rows)
        add_tensor(outputs, "generation_logits", cJSON_CreateString(ROWS_MARK), 3, dims);
    cJSON *p = cJSON_AddObjectToObject(o, "parameters");
    cJSON_AddStringToObject(p, "finish_reason", srv_choice_finish(&j->ch[0]));
    cJSON_AddNumberToObject(p, "prompt_tokens", j->n_prompt);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return splice_rows(j, s, L);
}

/* Triton's generate shape: a tensor of one element is that value, any other a flat array. */
static void add_value(cJSON *o, const char *name, cJSON *a)
{
    if (cJSON_IsArray(a) && cJSON_GetArraySize(a) == 1) {
        cJSON *one = cJSON_DetachItemFromArray(a, 0);
        cJSON_Delete(a);
        a = one;
    }
    cJSON_AddItemToObject(o, name, a);
}

static char *generate_answer(srv_job *j)
{
    const v2_ctx *x = j->fmt_ctx;
    uint32_t L = longest(j);
    cJSON *o = envelope(j);
    cJSON_AddItemToObject(o, "text_output", texts(j));
    cJSON_AddStringToObject(o, "finish_reason", srv_choice_finish(&j->ch[0]));
    if (x->want_lp) {
        add_value(o, "cum_log_probs", cum_log_probs(j));
        add_value(o, "output_log_probs", output_log_probs(j, L));
    }
    if (x->want_rows)
        cJSON_AddStringToObject(o, "generation_logits", ROWS_MARK);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return splice_rows(j, s, L);
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
    return srv_sse_json(out, o);
}

static bool generate_end(srv_job *j, strbuf *out, const srv_error *failed)
{
    (void)j;
    if (!failed)
        return true;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", failed->msg);
    return srv_sse_json(out, o);
}

/* A sequence's request pins its KV for the next one (the manager's session of the same id);
 * return_generation_logits goes to the job. */
static void seq_prepare(srv_job *j)
{
    const v2_ctx *x = j->fmt_ctx;
    if (x->sq.id && !x->sq.end)
        j->session_id = x->sq.id;
    j->want_gen_logits = x->want_rows;
}

/* ... and leaves the sequence its prompt + everything it generated, or ends it. */
static void seq_finished(srv_job *j)
{
    v2_seq *sq = &((v2_ctx *)j->fmt_ctx)->sq;
    if (!sq->id)
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
    v2_ctx x = {.early_stopping = 1};
    v2_seq *sq = &x.sq;
    bool infer = vp->kind == V2_INFER, streamed = vp->kind == V2_GENERATE_STREAM;
    cJSON *body = to_completion(&c->req, infer, &stream, &x, id, sizeof id, &e);
    if (body && infer && stream == 1) {
        cJSON_Delete(body);
        body = NULL;
        srv_err(&e, 400, "stream", "stream: an infer request has one response; use /generate_stream");
    }
    if (body && streamed && (x.beam_width > 1 || x.want_lp || x.want_rows)) { /* they come with the final answer */
        const char *k = x.beam_width > 1 ? "beam_width" : x.want_lp ? "return_log_probs" : "return_generation_logits";
        cJSON_Delete(body);
        body = NULL;
        srv_err(&e, 400, k, "%s: not with generate_stream (use generate or infer)", k);
    }
    if (body && !(c->model = srv_model_acquire(c->s, vp->model, true, &e))) {
        cJSON_Delete(body);
        body = NULL;
    }
    if (body && sq->id && !seq_prompt(c->model, body, sq, &e)) {
        cJSON_Delete(body);
        body = NULL;
    }
    /* the route decides streaming */
    char *text = body && cJSON_AddBoolToObject(body, "stream", vp->kind == V2_GENERATE_STREAM)
                     ? cJSON_PrintUnformatted(body) : NULL;
    if (body && !text) {
        srv_err(&e, 500, NULL, "out of memory");
        if (sq->id)
            srv_seq_finish(c->model, sq->id, NULL, 0, NULL, 0, false, false);
    }
    cJSON_Delete(body);
    if (text) {
        srv_serve_translated(c, text, c->req.route, infer ? &INFER_FMT : &GENERATE_FMT, id, &x);
        if (sq->id && !sq->finished) /* refused before it ran (400, 429, 503): the sequence is unchanged */
            srv_seq_finish(c->model, sq->id, NULL, 0, NULL, 0, false, sq->end);
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
