/* OpenAI's Responses API (POST /v1/responses), as vLLM serves it, for the clients written against
 * it (the openai SDKs' client.responses, agent frameworks): the request is translated into the
 * chat completion body that server_req.c validates like any other (so every check, limit and
 * metric holds), its answer and chunks reshaped into a Response object and the typed events of
 * its stream (srv_job_fmt.reshape: the reasoning split and the tool-call parser ran already).
 *
 * Request: "input" (a string, or items: messages with string or input_text / output_text parts,
 * function_call and function_call_output items; reasoning items are dropped, as the model's
 * template drops earlier reasoning), "instructions" (a system message first), "max_output_tokens",
 * "temperature", "top_p", "tools" (function tools), "tool_choice", "parallel_tool_calls",
 * "text.format" (text, json_object or json_schema: response_format), "reasoning.effort"
 * (gpt-oss's), "stream". Nothing is stored: "previous_response_id", "conversation" and
 * "background" are refused, as are images, files and the hosted tools (web search, file search,
 * ...); "store", "metadata", "user", "include", "truncation" and the like change nothing here.
 *
 * Answer: {"id": "resp_...", "object": "response", "status": "completed" | "incomplete"
 * (max_output_tokens), "output": [reasoning?, message?, function_call...], "usage"}. Stream
 * (text/event-stream, "event: <type>" before each data line): response.created,
 * response.in_progress, then per output item output_item.added, its content_part.added and
 * deltas (reasoning_text / output_text / function_call_arguments), their .done events,
 * output_item.done, and response.completed (or response.incomplete) with the whole response; a
 * failure on the way is an "error" event. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/server/server.h"

#define RESP_MAX_ITEMS 32 /* output items of one answer: a reasoning, a message and the calls */

typedef enum { IT_REASONING, IT_MESSAGE, IT_CALL } item_kind;

typedef struct resp_item {
    item_kind kind;
    char id[48], call_id[64];
    char *name;      /* function_call */
    strbuf text;     /* reasoning / message text, or the call's arguments */
    int call_index;  /* the chat chunk's tool_calls[].index */
} resp_item;

typedef struct resp_ctx {
    char model[256];
    long long created_at;
    cJSON *echo;     /* the request's parameters the Response repeats (owned) */
    resp_item items[RESP_MAX_ITEMS];
    uint32_t n_items;
    int open;        /* the item whose deltas are streaming, -1: none */
    uint64_t seq;    /* sequence_number of the next event */
    bool started;
} resp_ctx;

static const cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }
static const char *str_of(const cJSON *o, const char *k)
{
    const cJSON *v = item(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- the request -------------------------------------------------------------------------------- */

/* A message's content: a string, or parts of input_text / output_text / text, joined. */
static bool content_text(const cJSON *c, size_t i, strbuf *out, srv_error *e)
{
    if (cJSON_IsString(c))
        return strbuf_put(out, c->valuestring, strlen(c->valuestring)) ||
               (srv_err(e, 500, NULL, "out of memory"), false);
    if (!cJSON_IsArray(c))
        return srv_err(e, 400, "input", "input[%zu].content must be a string or an array of parts", i), false;
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *type = str_of(p, "type"), *text = str_of(p, "text");
        bool is_text = type && (!strcmp(type, "input_text") || !strcmp(type, "output_text") || !strcmp(type, "text"));
        if (!is_text)
            return srv_err(e, 400, "input", "input[%zu]: content part '%.40s' is not supported (text parts only: "
                           "no images, files or audio)", i, type ? type : "?"), false;
        if (!text)
            return srv_err(e, 400, "input", "input[%zu]: a %s part needs a string text", i, type), false;
        if (!strbuf_put(out, text, strlen(text)))
            return srv_err(e, 500, NULL, "out of memory"), false;
    }
    return true;
}

static cJSON *add_message(cJSON *msgs, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
    return m;
}

/* The input items as chat messages (consecutive function_call items: one assistant message). */
static bool input_items(const cJSON *in, cJSON *msgs, srv_error *e)
{
    cJSON *calls = NULL; /* the open assistant message's tool_calls */
    size_t i = 0;
    for (const cJSON *it = in->child; it; it = it->next, i++) {
        const char *type = str_of(it, "type"), *role = str_of(it, "role");
        if (!cJSON_IsObject(it))
            return srv_err(e, 400, "input", "input[%zu] must be an object", i), false;
        if (type && !strcmp(type, "function_call")) {
            const char *name = str_of(it, "name"), *args = str_of(it, "arguments"), *id = str_of(it, "call_id");
            if (!name || !id)
                return srv_err(e, 400, "input", "input[%zu]: a function_call needs a name and a call_id", i), false;
            if (!calls)
                calls = cJSON_AddArrayToObject(add_message(msgs, "assistant", ""), "tool_calls");
            cJSON *c = cJSON_CreateObject(), *f;
            cJSON_AddStringToObject(c, "id", id);
            cJSON_AddStringToObject(c, "type", "function");
            f = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(f, "name", name);
            cJSON_AddStringToObject(f, "arguments", args ? args : "{}");
            cJSON_AddItemToArray(calls, c);
            continue;
        }
        calls = NULL;
        if (type && !strcmp(type, "function_call_output")) {
            const char *id = str_of(it, "call_id");
            const cJSON *out = item(it, "output");
            if (!id || !cJSON_IsString(out))
                return srv_err(e, 400, "input", "input[%zu]: a function_call_output needs a call_id and a string "
                               "output", i), false;
            cJSON_AddStringToObject(add_message(msgs, "tool", out->valuestring), "tool_call_id", id);
            continue;
        }
        if (type && !strcmp(type, "reasoning")) /* earlier reasoning: the template drops it anyway */
            continue;
        if (type && strcmp(type, "message"))
            return srv_err(e, 400, "input", "input[%zu]: item type '%.40s' is not supported (message, "
                           "function_call, function_call_output, reasoning)", i, type), false;
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
                      strcmp(role, "developer")))
            return srv_err(e, 400, "input", "input[%zu]: role must be user, assistant, system or developer", i), false;
        strbuf text = {0};
        bool ok = content_text(item(it, "content"), i, &text, e);
        if (ok)
            add_message(msgs, role, text.p ? text.p : "");
        strbuf_free(&text);
        if (!ok)
            return false;
    }
    return true;
}

/* Function tools as chat tools; tool_choice's {"type": "function", "name"} as chat's. */
static bool tools(const cJSON *in, cJSON *o, srv_error *e)
{
    const cJSON *t = item(in, "tools"), *choice = item(in, "tool_choice");
    if (!absent(t) && !cJSON_IsArray(t))
        return srv_err(e, 400, "tools", "tools must be an array"), false;
    cJSON *out = t && t->child ? cJSON_AddArrayToObject(o, "tools") : NULL;
    size_t i = 0;
    for (const cJSON *x = out ? t->child : NULL; x; x = x->next, i++) {
        const char *type = str_of(x, "type"), *name = str_of(x, "name");
        if (!type || strcmp(type, "function"))
            return srv_err(e, 400, "tools", "tools[%zu]: '%.40s' tools are not supported (function tools only)", i,
                           type ? type : "?"), false;
        if (!name)
            return srv_err(e, 400, "tools", "tools[%zu]: a function tool needs a name", i), false;
        cJSON *c = cJSON_CreateObject(), *f;
        cJSON_AddStringToObject(c, "type", "function");
        f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", name);
        if (str_of(x, "description"))
            cJSON_AddStringToObject(f, "description", str_of(x, "description"));
        if (cJSON_IsObject(item(x, "parameters")))
            cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(item(x, "parameters"), true));
        if (cJSON_IsBool(item(x, "strict")))
            cJSON_AddBoolToObject(f, "strict", cJSON_IsTrue(item(x, "strict")));
        cJSON_AddItemToArray(out, c);
    }
    if (cJSON_IsString(choice)) {
        cJSON_AddStringToObject(o, "tool_choice", choice->valuestring);
    } else if (cJSON_IsObject(choice)) {
        const char *type = str_of(choice, "type"), *name = str_of(choice, "name");
        if (!type || strcmp(type, "function") || !name)
            return srv_err(e, 400, "tool_choice", "tool_choice must be auto, none, required or {\"type\": "
                           "\"function\", \"name\": ...}"), false;
        cJSON *c = cJSON_AddObjectToObject(o, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name);
    } else if (!absent(choice)) {
        return srv_err(e, 400, "tool_choice", "tool_choice must be a string or an object"), false;
    }
    return true;
}

/* text.format as response_format. */
static bool text_format(const cJSON *in, cJSON *o, srv_error *e)
{
    const cJSON *f = item(item(in, "text"), "format");
    const char *type = str_of(f, "type");
    if (absent(f) || (type && !strcmp(type, "text")))
        return true;
    if (type && !strcmp(type, "json_object")) {
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "response_format"), "type", "json_object");
        return true;
    }
    if (!type || strcmp(type, "json_schema") || !cJSON_IsObject(item(f, "schema")))
        return srv_err(e, 400, "text", "text.format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                       "{\"type\": \"json_schema\", \"name\", \"schema\"}"), false;
    cJSON *r = cJSON_AddObjectToObject(o, "response_format"), *js;
    cJSON_AddStringToObject(r, "type", "json_schema");
    js = cJSON_AddObjectToObject(r, "json_schema");
    cJSON_AddStringToObject(js, "name", str_of(f, "name") ? str_of(f, "name") : "response");
    cJSON_AddItemToObject(js, "schema", cJSON_Duplicate(item(f, "schema"), true));
    if (cJSON_IsBool(item(f, "strict")))
        cJSON_AddBoolToObject(js, "strict", cJSON_IsTrue(item(f, "strict")));
    return true;
}

/* Copies in[k] into o (as k2) when it has the type check wants; false with *e when present but not. */
static bool pass(const cJSON *in, const char *k, cJSON_bool (*check)(const cJSON *), const char *what, cJSON *o,
                 const char *k2, srv_error *e)
{
    const cJSON *v = item(in, k);
    if (absent(v))
        return true;
    if (!check(v))
        return srv_err(e, 400, k, "%s must be %s", k, what), false;
    cJSON_AddItemToObject(o, k2, cJSON_Duplicate(v, true));
    return true;
}

static cJSON *translate(const cJSON *in, resp_ctx *x, srv_error *e)
{
    if (!cJSON_IsObject(in))
        return srv_err(e, 400, NULL, "the body must be a JSON object"), NULL;
    static const char *const stored[] = {"previous_response_id", "conversation", "prompt"};
    for (size_t i = 0; i < sizeof stored / sizeof stored[0]; i++)
        if (!absent(item(in, stored[i])))
            return srv_err(e, 400, stored[i], "%s is not supported: this server stores no responses, conversations "
                           "or prompts; send the whole conversation in input", stored[i]), NULL;
    if (cJSON_IsTrue(item(in, "background")))
        return srv_err(e, 400, "background", "background responses are not supported"), NULL;
    const cJSON *model = item(in, "model"), *input = item(in, "input"), *ins = item(in, "instructions");
    if (!absent(model) && !cJSON_IsString(model))
        return srv_err(e, 400, "model", "model must be a string"), NULL;
    if (!cJSON_IsString(input) && !cJSON_IsArray(input))
        return srv_err(e, 400, "input", "input must be a string or an array of items"), NULL;
    if (!absent(ins) && !cJSON_IsString(ins))
        return srv_err(e, 400, "instructions", "instructions must be a string"), NULL;
    snprintf(x->model, sizeof x->model, "%s", cJSON_IsString(model) ? model->valuestring : "");
    cJSON *o = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(o, "messages");
    if (cJSON_IsString(model))
        cJSON_AddStringToObject(o, "model", model->valuestring);
    if (cJSON_IsString(ins) && ins->valuestring[0])
        add_message(msgs, "system", ins->valuestring);
    bool ok = cJSON_IsString(input) ? add_message(msgs, "user", input->valuestring) != NULL : input_items(input, msgs, e);
    const cJSON *effort = item(item(in, "reasoning"), "effort");
    ok = ok && pass(in, "stream", cJSON_IsBool, "a boolean", o, "stream", e) &&
         pass(in, "max_output_tokens", cJSON_IsNumber, "a number", o, "max_tokens", e) &&
         pass(in, "temperature", cJSON_IsNumber, "a number", o, "temperature", e) &&
         pass(in, "top_p", cJSON_IsNumber, "a number", o, "top_p", e) &&
         pass(in, "parallel_tool_calls", cJSON_IsBool, "a boolean", o, "parallel_tool_calls", e) &&
         tools(in, o, e) && text_format(in, o, e);
    if (ok && cJSON_IsString(effort))
        cJSON_AddStringToObject(o, "reasoning_effort", effort->valuestring);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    /* what the Response repeats of the request, OpenAI's defaults where it was silent */
    x->echo = cJSON_CreateObject();
    static const struct { const char *key, *def; } echoed[] = {
        {"instructions", "null"}, {"max_output_tokens", "null"}, {"temperature", "1"}, {"top_p", "1"},
        {"tools", "[]"}, {"tool_choice", "\"auto\""}, {"parallel_tool_calls", "true"},
        {"text", "{\"format\":{\"type\":\"text\"}}"}, {"reasoning", "{\"effort\":null,\"summary\":null}"},
        {"metadata", "{}"}};
    for (size_t i = 0; i < sizeof echoed / sizeof echoed[0]; i++) {
        const cJSON *v = item(in, echoed[i].key);
        cJSON_AddItemToObject(x->echo, echoed[i].key, absent(v) ? cJSON_Parse(echoed[i].def) : cJSON_Duplicate(v, true));
    }
    return o;
}

/* ---- the answer --------------------------------------------------------------------------------- */

static void new_id(resp_ctx *x, const srv_job *j, const char *prefix, char *out, size_t n)
{
    const char *tail = strchr(j->cmpl_id, '-');
    snprintf(out, n, "%s_%s_%u", prefix, tail ? tail + 1 : j->cmpl_id, x->n_items);
}

static resp_item *add_item(resp_ctx *x, const srv_job *j, item_kind kind)
{
    if (x->n_items == RESP_MAX_ITEMS)
        return NULL;
    resp_item *it = &x->items[x->n_items];
    *it = (resp_item){.kind = kind, .call_index = -1};
    new_id(x, j, kind == IT_REASONING ? "rs" : kind == IT_MESSAGE ? "msg" : "fc", it->id, sizeof it->id);
    x->n_items++;
    return it;
}

/* A function_call item's name and call id (NULL: the item's own id); false: out of memory. */
static bool set_call(resp_item *it, const char *name, const char *call_id)
{
    const char *src = call_id ? call_id : it->id; /* memmove: gcc cannot tell the two apart */
    size_t len = strnlen(src, sizeof it->call_id - 1);
    memmove(it->call_id, src, len);
    it->call_id[len] = 0;
    return (it->name = strdup(name ? name : "")) != NULL;
}

static cJSON *text_part(const char *type, const char *text)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", type);
    cJSON_AddStringToObject(p, "text", text);
    if (!strcmp(type, "output_text"))
        cJSON_AddArrayToObject(p, "annotations");
    return p;
}

/* Item it as the Response's output holds it (done: complete, else as it was opened; cut: the
 * answer ran out of max_output_tokens in it). */
static cJSON *item_json(const resp_item *it, bool done, bool cut)
{
    cJSON *o = cJSON_CreateObject();
    const char *text = done && it->text.p ? it->text.p : "";
    cJSON_AddStringToObject(o, "id", it->id);
    if (it->kind == IT_CALL) {
        cJSON_AddStringToObject(o, "type", "function_call");
        cJSON_AddStringToObject(o, "call_id", it->call_id);
        cJSON_AddStringToObject(o, "name", it->name ? it->name : "");
        cJSON_AddStringToObject(o, "arguments", text);
    } else if (it->kind == IT_MESSAGE) {
        cJSON_AddStringToObject(o, "type", "message");
        cJSON_AddStringToObject(o, "role", "assistant");
        cJSON *c = cJSON_AddArrayToObject(o, "content");
        if (done)
            cJSON_AddItemToArray(c, text_part("output_text", text));
    } else {
        cJSON_AddStringToObject(o, "type", "reasoning");
        cJSON_AddArrayToObject(o, "summary");
        cJSON *c = cJSON_AddArrayToObject(o, "content");
        if (done)
            cJSON_AddItemToArray(c, text_part("reasoning_text", text));
    }
    cJSON_AddStringToObject(o, "status", !done ? "in_progress" : cut ? "incomplete" : "completed");
    return o;
}

/* The Response object: status in_progress (no output yet), or final with finish. */
static cJSON *response_json(srv_job *j, resp_ctx *x, const char *finish, bool final)
{
    cJSON *o = cJSON_CreateObject();
    char id[64];
    const char *tail = strchr(j->cmpl_id, '-');
    snprintf(id, sizeof id, "resp_%s", tail ? tail + 1 : j->cmpl_id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)x->created_at);
    bool incomplete = final && finish && !strcmp(finish, "length");
    cJSON_AddStringToObject(o, "status", !final ? "in_progress" : incomplete ? "incomplete" : "completed");
    cJSON_AddNullToObject(o, "error");
    if (incomplete)
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    cJSON_AddStringToObject(o, "model", x->model[0] ? x->model : j->s->model_id);
    cJSON *out = cJSON_AddArrayToObject(o, "output");
    for (uint32_t i = 0; final && i < x->n_items; i++)
        cJSON_AddItemToArray(out, item_json(&x->items[i], true, incomplete && i + 1 == x->n_items));
    for (const cJSON *v = x->echo ? x->echo->child : NULL; v; v = v->next)
        cJSON_AddItemToObject(o, v->string, cJSON_Duplicate(v, true));
    cJSON_AddBoolToObject(o, "store", false);
    if (final) {
        uint32_t n = j->n ? srv_choice_tokens(&j->ch[0]) : 0;
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", j->n_prompt);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens",
                                j->n ? j->ch[0].n_cached : 0);
        cJSON_AddNumberToObject(u, "output_tokens", n);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
        cJSON_AddNumberToObject(u, "total_tokens", (double)j->n_prompt + n);
    } else {
        cJSON_AddNullToObject(o, "usage");
    }
    return o;
}

/* One event: "event: <type>" and its data, with the next sequence number. */
static bool event(resp_ctx *x, strbuf *out, const char *type, cJSON *o)
{
    if (!o)
        return false;
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", (double)x->seq++);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    bool ok = s && strbuf_printf(out, "event: %s\ndata: %s\n\n", type, s);
    cJSON_free(s);
    return ok;
}

static cJSON *at(const resp_ctx *x, const resp_item *it)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "output_index", (double)(it - x->items));
    cJSON_AddStringToObject(o, "item_id", it->id);
    return o;
}

/* The open item's closing events (cut: by max_output_tokens). */
static bool close_open(resp_ctx *x, strbuf *out, bool cut)
{
    if (x->open < 0)
        return true;
    resp_item *it = &x->items[x->open];
    x->open = -1;
    const char *text = it->text.p ? it->text.p : "";
    bool ok = true;
    if (it->kind == IT_CALL) {
        cJSON *d = at(x, it);
        cJSON_AddStringToObject(d, "arguments", text);
        ok = event(x, out, "response.function_call_arguments.done", d);
    } else {
        const char *part = it->kind == IT_MESSAGE ? "output_text" : "reasoning_text";
        cJSON *d = at(x, it);
        cJSON_AddNumberToObject(d, "content_index", 0);
        cJSON_AddStringToObject(d, "text", text);
        ok = event(x, out, it->kind == IT_MESSAGE ? "response.output_text.done" : "response.reasoning_text.done", d);
        d = at(x, it);
        cJSON_AddNumberToObject(d, "content_index", 0);
        cJSON_AddItemToObject(d, "part", text_part(part, text));
        ok = ok && event(x, out, "response.content_part.done", d);
    }
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "output_index", (double)(it - x->items));
    cJSON_AddItemToObject(d, "item", item_json(it, true, cut));
    return ok && event(x, out, "response.output_item.done", d);
}

/* A new item opened (the one before closed): output_item.added and its empty content part; a
 * function call's name and call id (call_id NULL: the item's id) are in the added item already. */
static resp_item *open_item(srv_job *j, resp_ctx *x, strbuf *out, item_kind kind, const char *name,
                            const char *call_id, bool *ok)
{
    *ok = close_open(x, out, false);
    resp_item *it = *ok ? add_item(x, j, kind) : NULL;
    if (!it)
        return NULL;
    if (kind == IT_CALL && !set_call(it, name, call_id))
        return *ok = false, NULL;
    x->open = (int)(it - x->items);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "output_index", (double)x->open);
    cJSON_AddItemToObject(d, "item", item_json(it, false, false));
    *ok = event(x, out, "response.output_item.added", d);
    if (*ok && kind != IT_CALL) {
        d = at(x, it);
        cJSON_AddNumberToObject(d, "content_index", 0);
        cJSON_AddItemToObject(d, "part", text_part(kind == IT_MESSAGE ? "output_text" : "reasoning_text", ""));
        *ok = event(x, out, "response.content_part.added", d);
    }
    return it;
}

/* Text of an item kind: appended to the open one of that kind (else a new one), as a delta. */
static bool text_delta(srv_job *j, resp_ctx *x, strbuf *out, item_kind kind, const char *text)
{
    bool ok = true;
    resp_item *it = x->open >= 0 && x->items[x->open].kind == kind ? &x->items[x->open]
                                                                     : open_item(j, x, out, kind, NULL, NULL, &ok);
    if (!it)
        return ok; /* past RESP_MAX_ITEMS: the rest is dropped */
    ok = ok && strbuf_put(&it->text, text, strlen(text));
    cJSON *d = at(x, it);
    cJSON_AddNumberToObject(d, "content_index", 0);
    cJSON_AddStringToObject(d, "delta", text);
    return ok && event(x, out, kind == IT_MESSAGE ? "response.output_text.delta" : "response.reasoning_text.delta", d);
}

/* A chat tool_calls fragment: a new call (its name and id) opens an item; arguments are deltas. */
static bool call_delta(srv_job *j, resp_ctx *x, strbuf *out, const cJSON *t)
{
    const cJSON *idx = item(t, "index"), *fn = item(t, "function");
    int k = cJSON_IsNumber(idx) ? (int)idx->valuedouble : 0;
    const char *name = str_of(fn, "name"), *args = str_of(fn, "arguments"), *id = str_of(t, "id");
    resp_item *it = x->open >= 0 && x->items[x->open].kind == IT_CALL && x->items[x->open].call_index == k
                        ? &x->items[x->open] : NULL;
    bool ok = true;
    if (!it) {
        it = open_item(j, x, out, IT_CALL, name, id, &ok);
        if (!it)
            return ok;
        it->call_index = k;
    }
    if (ok && args && args[0]) {
        ok = strbuf_put(&it->text, args, strlen(args));
        cJSON *d = at(x, it);
        cJSON_AddStringToObject(d, "delta", args);
        ok = ok && event(x, out, "response.function_call_arguments.delta", d);
    }
    return ok;
}

static bool start(srv_job *j, resp_ctx *x, strbuf *out)
{
    if (x->started)
        return true;
    x->started = true;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddItemToObject(d, "response", response_json(j, x, NULL, false));
    bool ok = event(x, out, "response.created", d);
    d = cJSON_CreateObject();
    cJSON_AddItemToObject(d, "response", response_json(j, x, NULL, false));
    return ok && event(x, out, "response.in_progress", d);
}

/* A streamed chat chunk (o) as the Responses events it brings. */
static bool stream_piece(srv_job *j, resp_ctx *x, const cJSON *o, strbuf *out)
{
    const cJSON *c = cJSON_GetArrayItem(item(o, "choices"), 0), *d = item(c, "delta");
    const char *reasoning = str_of(d, "reasoning_content"), *text = str_of(d, "content");
    const char *finish = str_of(c, "finish_reason");
    bool ok = start(j, x, out);
    if (ok && reasoning && reasoning[0])
        ok = text_delta(j, x, out, IT_REASONING, reasoning);
    if (ok && text && text[0])
        ok = text_delta(j, x, out, IT_MESSAGE, text);
    for (const cJSON *t = item(d, "tool_calls") ? item(d, "tool_calls")->child : NULL; ok && t; t = t->next)
        ok = call_delta(j, x, out, t);
    if (ok && finish && !x->n_items) /* an empty answer is an empty message */
        open_item(j, x, out, IT_MESSAGE, NULL, NULL, &ok);
    if (ok && finish) {
        ok = close_open(x, out, !strcmp(finish, "length"));
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "response", response_json(j, x, finish, true));
        ok = ok && event(x, out, strcmp(finish, "length") ? "response.completed" : "response.incomplete", e);
    }
    return ok;
}

/* The whole chat answer (o) as the Response. */
static bool whole(srv_job *j, resp_ctx *x, const cJSON *o, strbuf *out)
{
    const cJSON *c = cJSON_GetArrayItem(item(o, "choices"), 0), *m = item(c, "message");
    const char *reasoning = str_of(m, "reasoning_content"), *text = str_of(m, "content");
    bool ok = true;
    resp_item *it;
    if (reasoning && reasoning[0] && (it = add_item(x, j, IT_REASONING)))
        ok = strbuf_put(&it->text, reasoning, strlen(reasoning));
    const cJSON *calls = item(m, "tool_calls");
    bool message = (text && text[0]) || (!x->n_items && !(calls && calls->child)); /* at least an empty one */
    if (ok && message && (it = add_item(x, j, IT_MESSAGE)))
        ok = strbuf_put(&it->text, text ? text : "", text ? strlen(text) : 0);
    for (const cJSON *t = calls ? calls->child : NULL; ok && t; t = t->next) {
        const cJSON *fn = item(t, "function");
        const char *args = str_of(fn, "arguments"), *id = str_of(t, "id");
        if (!(it = add_item(x, j, IT_CALL)))
            break;
        const char *a = args ? args : "{}";
        ok = set_call(it, str_of(fn, "name"), id) && strbuf_put(&it->text, a, strlen(a));
    }
    cJSON *r = ok ? response_json(j, x, str_of(c, "finish_reason"), true) : NULL;
    char *s = r ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    ok = s && strbuf_put(out, s, strlen(s));
    cJSON_free(s);
    return ok;
}

static bool reshape(srv_job *j, cJSON *o, bool streamed, strbuf *out)
{
    resp_ctx *x = j->fmt_ctx;
    bool ok = o && (streamed ? stream_piece(j, x, o, out) : whole(j, x, o, out));
    cJSON_Delete(o);
    return ok;
}

/* A stream that failed on the way: one "error" event. */
static bool end(srv_job *j, strbuf *out, const srv_error *failed)
{
    resp_ctx *x = j->fmt_ctx;
    if (!failed)
        return true;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "code", failed->code ? failed->code : failed->http >= 500 ? "server_error" : "invalid_request");
    cJSON_AddStringToObject(d, "message", failed->msg);
    if (failed->param[0])
        cJSON_AddStringToObject(d, "param", failed->param);
    else
        cJSON_AddNullToObject(d, "param");
    return event(x, out, "error", d);
}

static const srv_job_fmt RESPONSES_FMT = {.reshape = reshape, .end = end};

/* The chat completion body (cJSON_free) of a Responses body, x's echo filled, or NULL with *e. */
static char *body_text(const char *body, size_t n, resp_ctx *x, srv_error *e)
{
    cJSON *in = srv_parse_body(body, n, e);
    cJSON *o = in ? translate(in, x, e) : NULL;
    cJSON_Delete(in);
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    if (o && !text)
        srv_err(e, 500, NULL, "out of memory");
    cJSON_Delete(o);
    return text;
}

char *srv_responses_body(const char *body, size_t n, srv_error *e)
{
    resp_ctx x = {.open = -1};
    char *text = body_text(body, n, &x, e);
    cJSON_Delete(x.echo);
    return text;
}

void srv_responses(srv_conn *c)
{
    srv_error e;
    resp_ctx x = {.open = -1, .created_at = (long long)time(NULL)};
    char *text = body_text(c->req.body.p ? c->req.body.p : "", c->req.body.len, &x, &e);
    if (text)
        srv_serve_translated(c, text, R_CHAT, &RESPONSES_FMT, NULL, &x);
    else
        srv_reply_error(c, &e);
    cJSON_free(text);
    cJSON_Delete(x.echo);
    for (uint32_t i = 0; i < x.n_items; i++) {
        free(x.items[i].name);
        strbuf_free(&x.items[i].text);
    }
}
