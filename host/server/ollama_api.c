/* Ollama's API, for the clients written against it (Open WebUI, editors' plugins, scripts that
 * post to localhost:11434): POST /api/generate and /api/chat translated into the OpenAI bodies
 * that server_req.c validates like any other (so every check, limit and metric holds), their
 * OpenAI answers and chunks reshaped into Ollama's objects (srv_job_fmt.reshape: the reasoning
 * split and the tool-call parser ran already); POST /api/embed and /api/embeddings through
 * /v1/embeddings' path; GET /api/tags, /api/ps, /api/version and POST /api/show from the model's
 * facts.
 *
 * Streaming is Ollama's default ("stream" absent = true): one JSON object per line
 * (application/x-ndjson), {"model", "created_at", "response" | "message", "done": false}, then a
 * last one with "done": true, "done_reason" and the counts and durations (nanoseconds). The
 * reasoning of a thinking template (gpt-oss's analysis channel, Qwen3's and DeepSeek-R1's
 * <think>) comes as "thinking"; tool calls as message.tool_calls with their arguments as objects,
 * each call whole (in the object before the last when streaming). Errors are {"error": "..."}
 * with the HTTP status (in the stream: one such line).
 *
 * Options are Ollama's with its defaults (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty
 * 1.1 over the last 64 tokens, num_predict -1: to the end of the context); "format" is "json" or
 * a JSON schema; "think" false turns Qwen3's thinking off, "low" / "medium" / "high" set gpt-oss's
 * reasoning effort. Settings of Ollama's own runner (num_ctx, num_gpu, num_thread, keep_alive,
 * ...) change nothing here and are ignored; fields vkinfer cannot honour (images, a raw
 * "template", the old "context" array, a "suffix", mirostat, typical_p) are refused with a 400
 * naming them. An empty prompt (or no messages) answers at once with done_reason "load", as Ollama
 * does to preload a model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/gguf.h"
#include "host/server/server.h"

#define OLLAMA_MAX_CALLS 16 /* tool calls one streamed answer assembles */
/* The API level /api/version reports: Ollama's clients gate features on it (structured outputs,
 * tool calls, thinking); vkinfer serves those of this release's API. */
#define OLLAMA_API_VERSION "0.12.0"

typedef struct ollama_call {
    char *name;
    strbuf args; /* the arguments' JSON text, as its fragments came */
} ollama_call;

typedef struct ollama_ctx {
    bool chat;                 /* /api/chat's message objects, else /api/generate's "response" */
    bool as_chat;              /* translated into a chat completion (else a completion: raw) */
    bool to_end;               /* no num_predict > 0: to the end of the context (Ollama's -1) */
    char model[256];           /* the name the client used, echoed in every object */
    ollama_call calls[OLLAMA_MAX_CALLS];
    uint32_t n_calls;
} ollama_ctx;

static const cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* RFC 3339 with microseconds, UTC: Ollama's created_at. */
static void now_rfc3339(char *buf, size_t n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char head[32];
    strftime(head, sizeof head, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, n, "%s.%06dZ", head, (int)(ts.tv_nsec / 1000));
}

/* {"model", "created_at"}: how every answer object starts. */
static cJSON *head(const char *model)
{
    char when[64];
    now_rfc3339(when, sizeof when);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "created_at", when);
    return o;
}

/* ---- the request -------------------------------------------------------------------------------- */

/* options.k (or def) as a number into out[k2] of the OpenAI body; false with *e when not one. */
static bool opt_num(const cJSON *opts, const char *k, double def, bool use_def, cJSON *out, const char *k2,
                    srv_error *e)
{
    const cJSON *v = item(opts, k);
    if (!absent(v) && !cJSON_IsNumber(v))
        return srv_err(e, 400, "options", "options.%s must be a number", k), false;
    if (!absent(v))
        cJSON_AddNumberToObject(out, k2, v->valuedouble);
    else if (use_def)
        cJSON_AddNumberToObject(out, k2, def);
    return true;
}

/* Ollama's options (and its defaults) into the OpenAI body. */
static bool options(const cJSON *in, cJSON *o, ollama_ctx *x, srv_error *e)
{
    const cJSON *opts = item(in, "options");
    if (!absent(opts) && !cJSON_IsObject(opts))
        return srv_err(e, 400, "options", "options must be an object"), false;
    static const struct { const char *k; double off; } off[] = {{"mirostat", 0}, {"typical_p", 1}, {"tfs_z", 1}};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        const cJSON *v = item(opts, off[i].k);
        if (!absent(v) && !(cJSON_IsNumber(v) && v->valuedouble == off[i].off))
            return srv_err(e, 400, "options", "options.%s is not supported (only %g, off)", off[i].k, off[i].off),
                   false;
    }
    const cJSON *np = item(opts, "num_predict"), *stop = item(opts, "stop"), *seed = item(opts, "seed");
    if (!absent(np) && (!cJSON_IsNumber(np) || np->valuedouble != floor(np->valuedouble) || np->valuedouble < -2))
        return srv_err(e, 400, "options", "options.num_predict must be an integer >= -2"), false;
    if (!absent(np) && np->valuedouble == 0)
        return srv_err(e, 400, "options", "options.num_predict: 0 (evaluating the prompt only) is not supported"),
               false;
    x->to_end = absent(np) || np->valuedouble < 0; /* -1, -2: to the end of the context (prepare) */
    if (!x->to_end)
        cJSON_AddNumberToObject(o, "max_tokens", np->valuedouble);
    if (!absent(stop)) {
        if (!cJSON_IsArray(stop) && !cJSON_IsString(stop))
            return srv_err(e, 400, "options", "options.stop must be a string or an array of strings"), false;
        cJSON_AddItemToObject(o, "stop", cJSON_Duplicate(stop, true));
    }
    if (!absent(seed) && (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble)))
        return srv_err(e, 400, "options", "options.seed must be an integer"), false;
    if (!absent(seed) && seed->valuedouble >= 0) /* Ollama: -1 is a random seed */
        cJSON_AddNumberToObject(o, "seed", seed->valuedouble);
    const cJSON *tk = item(opts, "top_k");
    if (!absent(tk) && !cJSON_IsNumber(tk))
        return srv_err(e, 400, "options", "options.top_k must be a number"), false;
    cJSON_AddNumberToObject(o, "top_k", absent(tk) ? 40 : tk->valuedouble <= 0 ? -1 : tk->valuedouble);
    return opt_num(opts, "temperature", 0.8, true, o, "temperature", e) &&
           opt_num(opts, "top_p", 0.9, true, o, "top_p", e) && opt_num(opts, "min_p", 0.0, true, o, "min_p", e) &&
           opt_num(opts, "repeat_penalty", 1.1, true, o, "repetition_penalty", e) &&
           opt_num(opts, "repeat_last_n", 64, true, o, "repeat_last_n", e) &&
           opt_num(opts, "presence_penalty", 0, false, o, "presence_penalty", e) &&
           opt_num(opts, "frequency_penalty", 0, false, o, "frequency_penalty", e);
}

/* "format": "json" or a JSON schema, as response_format. */
static bool format(const cJSON *in, cJSON *o, srv_error *e)
{
    const cJSON *f = item(in, "format");
    if (absent(f) || (cJSON_IsString(f) && !f->valuestring[0]))
        return true;
    cJSON *rf = cJSON_AddObjectToObject(o, "response_format");
    if (cJSON_IsString(f) && !strcmp(f->valuestring, "json")) {
        cJSON_AddStringToObject(rf, "type", "json_object");
        return true;
    }
    if (!cJSON_IsObject(f))
        return srv_err(e, 400, "format", "format must be \"json\" or a JSON schema object"), false;
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", "format");
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(f, true));
    return true;
}

/* "think": false turns thinking off (Qwen3's switch), true on where a template has it off by
 * default (EXAONE 4, Granite 3.2 / 3.3), a level sets the reasoning effort on a harmony template
 * (gpt-oss) and means true on the others, as in Ollama. */
static bool think(const cJSON *in, bool harmony, cJSON *o, srv_error *e)
{
    const cJSON *t = item(in, "think");
    if (absent(t))
        return true;
    if (cJSON_IsBool(t)) {
        cJSON *kw = cJSON_AddObjectToObject(o, "chat_template_kwargs");
        cJSON_AddBoolToObject(kw, "enable_thinking", cJSON_IsTrue(t));
        cJSON_AddBoolToObject(kw, "thinking", cJSON_IsTrue(t)); /* Granite's name for it */
        return true;
    }
    if (cJSON_IsString(t) && (!strcmp(t->valuestring, "low") || !strcmp(t->valuestring, "medium") ||
                              !strcmp(t->valuestring, "high"))) {
        if (harmony)
            cJSON_AddStringToObject(o, "reasoning_effort", t->valuestring);
        return true;
    }
    return srv_err(e, 400, "think", "think must be true, false, \"low\", \"medium\" or \"high\""), false;
}

/* Fields that would change the answer and that vkinfer does not have: refused unless empty. */
static bool refuse(const cJSON *in, const char *const *keys, size_t n, srv_error *e)
{
    for (size_t i = 0; i < n; i++) {
        const cJSON *v = item(in, keys[i]);
        bool empty = absent(v) || (cJSON_IsString(v) && !v->valuestring[0]) || (cJSON_IsArray(v) && !v->child);
        if (!empty)
            return srv_err(e, 400, keys[i], "%s is not supported by this server", keys[i]), false;
    }
    return true;
}

/* An Ollama message as an OpenAI one: tool calls' arguments (objects) as JSON text. */
static cJSON *message(const cJSON *m, size_t i, srv_error *e)
{
    const cJSON *role = item(m, "role"), *content = item(m, "content"), *calls = item(m, "tool_calls");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role))
        return srv_err(e, 400, "messages", "messages[%zu] must be an object with a string role", i), NULL;
    if (!absent(content) && !cJSON_IsString(content))
        return srv_err(e, 400, "messages", "messages[%zu].content must be a string", i), NULL;
    static const char *const no[] = {"images"};
    if (!refuse(m, no, 1, e))
        return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "role", role->valuestring);
    cJSON_AddStringToObject(o, "content", cJSON_IsString(content) ? content->valuestring : "");
    if (!absent(calls) && !cJSON_IsArray(calls)) {
        cJSON_Delete(o);
        return srv_err(e, 400, "messages", "messages[%zu].tool_calls must be an array", i), NULL;
    }
    cJSON *tc = calls && calls->child ? cJSON_AddArrayToObject(o, "tool_calls") : NULL;
    size_t k = 0;
    for (const cJSON *c = tc ? calls->child : NULL; c; c = c->next, k++) {
        const cJSON *fn = item(c, "function"), *name = item(fn, "name"), *args = item(fn, "arguments");
        if (!cJSON_IsString(name) || (!absent(args) && !cJSON_IsObject(args))) {
            cJSON_Delete(o);
            return srv_err(e, 400, "messages", "messages[%zu].tool_calls[%zu]: function.name must be a string and "
                           "function.arguments an object", i, k), NULL;
        }
        char *text = absent(args) ? NULL : cJSON_PrintUnformatted(args);
        cJSON *x = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(x, "function");
        char id[32];
        snprintf(id, sizeof id, "call_%zu_%zu", i, k);
        cJSON_AddStringToObject(x, "id", id);
        cJSON_AddStringToObject(x, "type", "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddStringToObject(f, "arguments", text ? text : "{}");
        cJSON_free(text);
        cJSON_AddItemToArray(tc, x);
    }
    return o;
}

/* The OpenAI body of an /api/generate (chat false) or /api/chat request; NULL with *e. *load:
 * the request only loads the model (no prompt, no messages). */
static cJSON *translate(const cJSON *in, bool chat, bool harmony, ollama_ctx *x, bool *load, srv_error *e)
{
    *load = false;
    x->chat = chat;
    const cJSON *model = item(in, "model"), *stream = item(in, "stream");
    if (!absent(model) && !cJSON_IsString(model))
        return srv_err(e, 400, "model", "model must be a string"), NULL;
    if (!absent(stream) && !cJSON_IsBool(stream))
        return srv_err(e, 400, "stream", "stream must be a boolean"), NULL;
    snprintf(x->model, sizeof x->model, "%s", cJSON_IsString(model) ? model->valuestring : "");
    static const char *const no_gen[] = {"images", "template", "context", "suffix"};
    if (!chat && !refuse(in, no_gen, sizeof no_gen / sizeof no_gen[0], e))
        return NULL;
    cJSON *o = cJSON_CreateObject();
    if (cJSON_IsString(model))
        cJSON_AddStringToObject(o, "model", model->valuestring);
    cJSON_AddBoolToObject(o, "stream", absent(stream) || cJSON_IsTrue(stream));
    bool ok = options(in, o, x, e) && format(in, o, e);
    const cJSON *prompt = item(in, "prompt"), *system = item(in, "system"), *msgs = item(in, "messages");
    if (ok && !chat) {
        if (!absent(prompt) && !cJSON_IsString(prompt))
            ok = (srv_err(e, 400, "prompt", "prompt must be a string"), false);
        else if (!absent(system) && !cJSON_IsString(system))
            ok = (srv_err(e, 400, "system", "system must be a string"), false);
        *load = ok && (absent(prompt) || !prompt->valuestring[0]);
        if (ok && !*load && cJSON_IsTrue(item(in, "raw"))) {
            cJSON_AddStringToObject(o, "prompt", prompt->valuestring); /* no template: a completion */
        } else if (ok && !*load) { /* the model's template around the prompt, as Ollama */
            x->as_chat = true;
            cJSON *m = cJSON_AddArrayToObject(o, "messages"), *u;
            if (cJSON_IsString(system) && system->valuestring[0]) {
                cJSON_AddItemToArray(m, u = cJSON_CreateObject());
                cJSON_AddStringToObject(u, "role", "system");
                cJSON_AddStringToObject(u, "content", system->valuestring);
            }
            cJSON_AddItemToArray(m, u = cJSON_CreateObject());
            cJSON_AddStringToObject(u, "role", "user");
            cJSON_AddStringToObject(u, "content", prompt->valuestring);
            ok = think(in, harmony, o, e);
        }
    } else if (ok) {
        x->as_chat = true;
        if (!absent(msgs) && !cJSON_IsArray(msgs))
            ok = (srv_err(e, 400, "messages", "messages must be an array"), false);
        *load = ok && (absent(msgs) || !msgs->child);
        cJSON *m = ok && !*load ? cJSON_AddArrayToObject(o, "messages") : NULL;
        size_t i = 0;
        for (const cJSON *v = m ? msgs->child : NULL; ok && v; v = v->next, i++) {
            cJSON *one = message(v, i, e);
            ok = one != NULL;
            if (one)
                cJSON_AddItemToArray(m, one);
        }
        const cJSON *tools = item(in, "tools");
        if (ok && !absent(tools))
            cJSON_AddItemToObject(o, "tools", cJSON_Duplicate(tools, true));
        ok = ok && think(in, harmony, o, e);
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* ---- the answer --------------------------------------------------------------------------------- */

/* The counts and durations (ns) of the last object; done_reason from OpenAI's finish reason. */
static void totals(srv_job *j, cJSON *o, const char *finish)
{
    double now = srv_now();
    pthread_mutex_lock(&j->mu);
    double t0 = j->t_arrive, t1 = j->t_first > 0 ? j->t_first : now;
    pthread_mutex_unlock(&j->mu);
    uint32_t n = j->n ? srv_choice_tokens(&j->ch[0]) : 0;
    cJSON_AddBoolToObject(o, "done", true);
    cJSON_AddStringToObject(o, "done_reason", finish && !strcmp(finish, "length") ? "length" : "stop");
    cJSON_AddNumberToObject(o, "total_duration", floor((now - t0) * 1e9));
    cJSON_AddNumberToObject(o, "load_duration", 0);
    cJSON_AddNumberToObject(o, "prompt_eval_count", j->n_prompt);
    cJSON_AddNumberToObject(o, "prompt_eval_duration", floor((t1 - t0) * 1e9));
    cJSON_AddNumberToObject(o, "eval_count", n);
    cJSON_AddNumberToObject(o, "eval_duration", floor((now - t1) * 1e9));
}

/* OpenAI tool calls (arguments as JSON text) as Ollama's (arguments as objects). */
static void add_call(cJSON *calls, const char *name, const char *args)
{
    cJSON *c = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON *a = args && args[0] ? cJSON_Parse(args) : NULL;
    cJSON_AddItemToObject(f, "arguments", a && cJSON_IsObject(a) ? a : (cJSON_Delete(a), cJSON_CreateObject()));
    cJSON_AddItemToArray(calls, c);
}

/* {"model", "created_at", "message": {...}} or {..., "response": text}, text and thinking. */
static cJSON *piece(const ollama_ctx *x, const char *text, const char *thinking)
{
    cJSON *o = head(x->model);
    if (x->chat) {
        cJSON *m = cJSON_AddObjectToObject(o, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
        if (thinking && thinking[0])
            cJSON_AddStringToObject(m, "thinking", thinking);
    } else {
        cJSON_AddStringToObject(o, "response", text);
        if (thinking && thinking[0])
            cJSON_AddStringToObject(o, "thinking", thinking);
    }
    return o;
}

static bool line(strbuf *out, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    bool ok = s && strbuf_put(out, s, strlen(s)) && strbuf_put(out, "\n", 1);
    cJSON_free(s);
    return ok;
}

static const char *str_of(const cJSON *o, const char *k)
{
    const cJSON *v = item(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A streamed OpenAI chunk (o, taken) as Ollama's lines: its text and reasoning as one object; its
 * tool-call fragments kept until the choice ends, then the calls whole and the last object. */
static bool stream_piece(srv_job *j, ollama_ctx *x, const cJSON *o, strbuf *out)
{
    const cJSON *c = cJSON_GetArrayItem(item(o, "choices"), 0);
    const cJSON *d = item(c, "delta");
    const char *text = d ? str_of(d, "content") : str_of(c, "text"), *thinking = str_of(d, "reasoning_content");
    const char *finish = str_of(c, "finish_reason");
    bool ok = true;
    for (const cJSON *t = item(d, "tool_calls") ? item(d, "tool_calls")->child : NULL; t; t = t->next) {
        const cJSON *idx = item(t, "index"), *fn = item(t, "function");
        uint32_t k = cJSON_IsNumber(idx) && idx->valuedouble >= 0 ? (uint32_t)idx->valuedouble : 0;
        if (k >= OLLAMA_MAX_CALLS)
            continue;
        if (k >= x->n_calls)
            x->n_calls = k + 1;
        const char *name = str_of(fn, "name"), *args = str_of(fn, "arguments");
        if (name && !x->calls[k].name)
            ok &= (x->calls[k].name = strdup(name)) != NULL;
        if (args)
            ok &= strbuf_put(&x->calls[k].args, args, strlen(args));
    }
    if (ok && ((text && text[0]) || (thinking && thinking[0])))
        ok = line(out, piece(x, text ? text : "", thinking));
    if (ok && finish && x->n_calls && x->chat) {
        cJSON *p = piece(x, "", NULL);
        cJSON *calls = cJSON_AddArrayToObject(cJSON_GetObjectItemCaseSensitive(p, "message"), "tool_calls");
        for (uint32_t k = 0; k < x->n_calls; k++)
            if (x->calls[k].name)
                add_call(calls, x->calls[k].name, x->calls[k].args.p);
        ok = line(out, p);
    }
    if (ok && finish) {
        cJSON *last = piece(x, "", NULL);
        totals(j, last, finish);
        ok = line(out, last);
    }
    return ok;
}

/* The whole OpenAI answer (o, taken) as Ollama's one object. */
static bool whole(srv_job *j, ollama_ctx *x, const cJSON *o, strbuf *out)
{
    const cJSON *c = cJSON_GetArrayItem(item(o, "choices"), 0), *m = item(c, "message");
    const char *text = m ? str_of(m, "content") : str_of(c, "text");
    cJSON *p = piece(x, text ? text : "", m ? str_of(m, "reasoning_content") : NULL);
    const cJSON *tc = item(m, "tool_calls");
    cJSON *pm = cJSON_GetObjectItemCaseSensitive(p, "message"); /* NULL for /api/generate */
    cJSON *calls = pm && tc && tc->child ? cJSON_AddArrayToObject(pm, "tool_calls") : NULL;
    for (const cJSON *t = calls ? tc->child : NULL; t; t = t->next) {
        const cJSON *fn = item(t, "function");
        add_call(calls, str_of(fn, "name") ? str_of(fn, "name") : "", str_of(fn, "arguments"));
    }
    totals(j, p, str_of(c, "finish_reason"));
    char *s = cJSON_PrintUnformatted(p);
    cJSON_Delete(p);
    bool ok = s && strbuf_put(out, s, strlen(s));
    cJSON_free(s);
    return ok;
}

static bool reshape(srv_job *j, cJSON *o, bool streamed, strbuf *out)
{
    ollama_ctx *x = j->fmt_ctx;
    bool ok = o && (streamed ? stream_piece(j, x, o, out) : whole(j, x, o, out));
    cJSON_Delete(o);
    return ok;
}

/* A request that failed on the way (streaming): one {"error"} line. */
static bool end(srv_job *j, strbuf *out, const srv_error *failed)
{
    (void)j;
    if (!failed)
        return true;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", failed->msg);
    return line(out, o);
}

/* No num_predict: the room the prompt leaves (a completion's OpenAI default is 16 tokens). */
static void prepare(srv_job *j)
{
    const ollama_ctx *x = j->fmt_ctx;
    if (x->to_end)
        j->max_tokens = srv_job_room(j->s, j);
}

static const srv_job_fmt OLLAMA_FMT = {.reshape = reshape, .end = end, .prepare = prepare,
                                       .stream_type = "application/x-ndjson"};

/* The answer of a request that only loads the model. */
static void loaded(srv_conn *c, const ollama_ctx *x, bool chat)
{
    cJSON *o = chat ? piece(x, "", NULL) : head(x->model);
    if (!chat)
        cJSON_AddStringToObject(o, "response", "");
    cJSON_AddBoolToObject(o, "done", true);
    cJSON_AddStringToObject(o, "done_reason", "load");
    srv_reply_json(c, 200, o);
}

/* The OpenAI body (cJSON_free) of an Ollama body, or NULL with *e; none either when *load. */
static char *body_text(const char *body, size_t n, bool chat, bool harmony, ollama_ctx *x, bool *load,
                       srv_error *e)
{
    *load = false;
    cJSON *in = srv_parse_body(body, n, e);
    cJSON *o = in ? translate(in, chat, harmony, x, load, e) : NULL;
    cJSON_Delete(in);
    char *text = o && !*load ? cJSON_PrintUnformatted(o) : NULL;
    if (o && !*load && !text)
        srv_err(e, 500, NULL, "out of memory");
    cJSON_Delete(o);
    return text;
}

char *srv_ollama_body(const char *body, size_t n, bool chat, bool harmony, bool *as_chat, bool *load,
                      srv_error *e)
{
    ollama_ctx x = {0};
    char *text = body_text(body, n, chat, harmony, &x, load, e);
    *as_chat = x.as_chat;
    return text;
}

void srv_ollama_generate(srv_conn *c, bool chat)
{
    srv_error e;
    ollama_ctx x = {0};
    bool load;
    const bool harmony = srv_conn_model(c)->chat.family == CHAT_HARMONY;
    char *text = body_text(c->req.body.p ? c->req.body.p : "", c->req.body.len, chat, harmony, &x, &load, &e);
    if (load)
        return loaded(c, &x, chat);
    if (!text)
        return srv_reply_error(c, &e);
    srv_serve_translated(c, text, x.as_chat ? R_CHAT : R_CMPL, &OLLAMA_FMT, NULL, &x);
    cJSON_free(text);
    for (uint32_t k = 0; k < OLLAMA_MAX_CALLS; k++) {
        free(x.calls[k].name);
        strbuf_free(&x.calls[k].args);
    }
}

/* ---- embeddings --------------------------------------------------------------------------------- */

/* /v1/embeddings' answer (o, taken) as /api/embed's {"embeddings": [[...]]} or the old
 * /api/embeddings' {"embedding": [...]}. */
static cJSON *embed_shape(srv_conn *c, cJSON *o)
{
    bool legacy = c->req.route == R_OLLAMA_EMBEDDINGS;
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "model", c->ollama_model);
    cJSON *all = legacy ? NULL : cJSON_AddArrayToObject(r, "embeddings");
    for (cJSON *d = item(o, "data") ? item(o, "data")->child : NULL; d; d = d->next) {
        cJSON *v = cJSON_DetachItemFromObject(d, "embedding");
        if (legacy) {
            cJSON_AddItemToObject(r, "embedding", v);
            break;
        }
        cJSON_AddItemToArray(all, v);
    }
    const cJSON *u = item(o, "usage");
    if (!legacy)
        cJSON_AddNumberToObject(r, "prompt_eval_count", cJSON_IsNumber(item(u, "prompt_tokens"))
                                                            ? item(u, "prompt_tokens")->valuedouble : 0);
    cJSON_Delete(o);
    return r;
}

void srv_ollama_embed(srv_conn *c)
{
    srv_error e;
    cJSON *in = srv_parse_body(c->req.body.p ? c->req.body.p : "", c->req.body.len, &e);
    if (!in)
        return srv_reply_error(c, &e);
    bool legacy = c->req.route == R_OLLAMA_EMBEDDINGS;
    const cJSON *model = item(in, "model"), *input = item(in, legacy ? "prompt" : "input");
    snprintf(c->ollama_model, sizeof c->ollama_model, "%s", cJSON_IsString(model) ? model->valuestring : "");
    cJSON *o = cJSON_CreateObject();
    if (cJSON_IsString(model))
        cJSON_AddStringToObject(o, "model", model->valuestring);
    if (input)
        cJSON_AddItemToObject(o, "input", cJSON_Duplicate(input, true));
    cJSON_Delete(in);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text)
        return srv_err(&e, 500, NULL, "out of memory"), srv_reply_error(c, &e);
    srv_route_embeddings_as(c, text, strlen(text), embed_shape);
    cJSON_free(text);
}

/* ---- the model's facts --------------------------------------------------------------------------- */

/* Ollama's "details" of model m, and its file's size and modification time. */
static cJSON *details(srv *m, uint64_t *size, char *mtime, size_t n_mtime)
{
    cJSON *d = cJSON_CreateObject();
    pthread_mutex_lock(&m->mu);
    bool known = m->file_facts;
    uint64_t n_params = m->n_params;
    const char *ftype = m->file_type;
    pthread_mutex_unlock(&m->mu);
    if (!known) { /* the GGUF's tensor table and file type, read once per model (not under mu) */
        gguf_file *f = NULL;
        uint32_t ft = 0;
        char err[128];
        if (m->p.model_path && gguf_open(m->p.model_path, &f, err, sizeof err) == VKI_OK) {
            n_params = gguf_n_params(f);
            ftype = gguf_get_u32(f, "general.file_type", &ft) == VKI_OK ? gguf_file_type_name(ft) : NULL;
            gguf_close(f);
        }
        pthread_mutex_lock(&m->mu);
        m->file_facts = true, m->n_params = n_params, m->file_type = ftype;
        pthread_mutex_unlock(&m->mu);
    }
    struct stat st;
    bool have = m->p.model_path && stat(m->p.model_path, &st) == 0;
    *size = have ? (uint64_t)st.st_size : 0;
    struct tm tm;
    time_t t = have ? st.st_mtime : time(NULL);
    gmtime_r(&t, &tm);
    strftime(mtime, n_mtime, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char q[24], ps[24];
    snprintf(q, sizeof q, "%s", ftype ? ftype : m->info.weight_type);
    for (char *p = q; *p; p++)
        *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    if (n_params >= 1000000000ull) /* Ollama's spelling: 7.6B, 135M, 260K */
        snprintf(ps, sizeof ps, "%.1fB", n_params / 1e9);
    else if (n_params >= 1000000ull)
        snprintf(ps, sizeof ps, "%.0fM", n_params / 1e6);
    else
        snprintf(ps, sizeof ps, "%.0fK", n_params / 1e3);
    cJSON_AddStringToObject(d, "parent_model", "");
    cJSON_AddStringToObject(d, "format", "gguf");
    cJSON_AddStringToObject(d, "family", m->info.arch);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "families"), cJSON_CreateString(m->info.arch));
    cJSON_AddStringToObject(d, "parameter_size", ps);
    cJSON_AddStringToObject(d, "quantization_level", q);
    return d;
}

/* One model as /api/tags and /api/ps list it. */
static cJSON *model_entry(srv *m, bool running)
{
    uint64_t size;
    char mtime[40], digest[40];
    cJSON *d = details(m, &size, mtime, sizeof mtime);
    cJSON *o = cJSON_CreateObject();
    snprintf(digest, sizeof digest, "%016llx", (unsigned long long)m->info.fingerprint); /* its identity */
    cJSON_AddStringToObject(o, "name", m->model_id);
    cJSON_AddStringToObject(o, "model", m->model_id);
    if (!running)
        cJSON_AddStringToObject(o, "modified_at", mtime);
    cJSON_AddNumberToObject(o, "size", (double)(running ? m->info.device_bytes : size));
    cJSON_AddStringToObject(o, "digest", digest);
    cJSON_AddItemToObject(o, "details", d);
    if (running) { /* loaded for the server's life: no expiry (Ollama's keep_alive -1 writes this year) */
        cJSON_AddStringToObject(o, "expires_at", "2318-01-01T00:00:00Z");
        cJSON_AddNumberToObject(o, "size_vram", (double)m->info.device_bytes);
        cJSON_AddNumberToObject(o, "context_length", m->info.n_ctx);
    }
    return o;
}

void srv_ollama_list(srv_conn *c, bool running)
{
    cJSON *o = cJSON_CreateObject(), *all = cJSON_AddArrayToObject(o, "models");
    srv *ms[64];
    uint32_t n = srv_models_ready(c->s, ms, 64);
    for (uint32_t i = 0; i < n; i++)
        cJSON_AddItemToArray(all, model_entry(ms[i], running));
    srv_models_done(c->s, ms, n);
    srv_reply_json(c, 200, o);
}

void srv_ollama_version(srv_conn *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", OLLAMA_API_VERSION);
    srv_reply_json(c, 200, o);
}

/* POST /api/show {"model"}: the template's family, the details and the file's main facts. */
void srv_ollama_show(srv_conn *c)
{
    srv_error e;
    cJSON *in = srv_parse_body(c->req.body.p ? c->req.body.p : "", c->req.body.len, &e);
    const cJSON *model = item(in, "model");
    if (!model)
        model = item(in, "name"); /* Ollama's older spelling */
    srv *m = in ? srv_model_acquire(c->s, cJSON_IsString(model) ? model->valuestring : NULL, true, &e) : NULL;
    cJSON_Delete(in);
    if (!m)
        return srv_reply_error(c, &e);
    uint64_t size;
    char mtime[40], key[64];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "modelfile", "");
    cJSON_AddStringToObject(o, "parameters", "");
    cJSON_AddStringToObject(o, "template", chat_family_name(m->chat.family));
    cJSON *d = details(m, &size, mtime, sizeof mtime);
    cJSON_AddItemToObject(o, "details", d);
    cJSON *mi = cJSON_AddObjectToObject(o, "model_info");
    cJSON_AddStringToObject(mi, "general.architecture", m->info.arch);
    cJSON_AddStringToObject(mi, "general.name", m->info.name);
    snprintf(key, sizeof key, "%s.context_length", m->info.arch);
    cJSON_AddNumberToObject(mi, key, m->info.n_ctx_train);
    snprintf(key, sizeof key, "%s.embedding_length", m->info.arch);
    cJSON_AddNumberToObject(mi, key, m->info.d_model);
    snprintf(key, sizeof key, "%s.block_count", m->info.arch);
    cJSON_AddNumberToObject(mi, key, m->info.n_layer);
    cJSON *caps = cJSON_AddArrayToObject(o, "capabilities");
    cJSON_AddItemToArray(caps, cJSON_CreateString("completion"));
    if (m->info.pooling != VKI_POOL_NONE) /* a trained embedding model (its pooling_type), as Ollama says */
        cJSON_AddItemToArray(caps, cJSON_CreateString("embedding"));
    if (m->chat_known && m->chat.family != CHAT_PLAIN)
        cJSON_AddItemToArray(caps, cJSON_CreateString("tools"));
    if (m->chat.family == CHAT_HARMONY || chat_thinks(&m->chat))
        cJSON_AddItemToArray(caps, cJSON_CreateString("thinking"));
    cJSON_AddStringToObject(o, "modified_at", mtime);
    srv_model_release(c->s, m);
    srv_reply_json(c, 200, o);
}
