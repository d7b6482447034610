/* Structured output and tool calling at the HTTP layer.
 *
 * Output constraints: OpenAI's response_format ({"type": "json_object"} = any JSON object,
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}; llama-server's
 * {"type": "json_object", "schema": {...}} too), llama-server's `grammar` (GBNF) and `json_schema`,
 * vLLM's guided_json / guided_grammar / guided_choice. Each becomes the request's
 * vki_request.constraint, checked here with vki_constraint_check so a bad grammar or schema is a
 * 400 naming the field, the rule or keyword and its position. At most one may be given. A schema
 * is always enforced (strict or not): never a silent fallback to free text. guided_regex is
 * refused (there is no regex-to-grammar converter).
 *
 * Tools (chat only): `tools` is checked and rendered through chat_render_tools in the family's
 * format (s->tool_fmt); assistant messages may carry tool_calls and `tool` messages answer them.
 * tool_choice "auto" (the default with tools) generates freely and parses the output; "required"
 * or a named function constrains the generation with chat_tools_grammar (parallel_tool_calls
 * allows several calls); "none" renders without the tools and does not parse. Parsed calls become
 * message.tool_calls with finish_reason "tool_calls"; when streaming, delta.tool_calls chunks as
 * OpenAI sends them (first chunk of a call: index, id, type, function.name, empty arguments; then
 * index + argument fragments). Cost: the parser is O(output bytes); a forced call's grammar is
 * built once per request (the batch manager caches compiled grammars by text).
 *
 * Reasoning (srv_think): "<think>...</think>" split off into reasoning_content for the thinking
 * templates; gpt-oss's harmony replies (its markers are control tokens, shown in the text of a
 * harmony job for this) split by chat_harmony: the analysis channel is reasoning_content, the
 * final channel content, a message to functions.NAME a call (in the spelling the HARMONY tool
 * parser reads). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/server/server.h"

#define ANY_OBJECT "{\"type\": \"object\"}" /* json_object: any JSON object */

static const cJSON *item(const cJSON *o, const char *k)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
}

static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* ---- output constraints ------------------------------------------------------------------------ */

static bool set_constraint(srv_job *j, const char *field, vki_constraint_type type, const char *text, size_t n,
                           srv_error *e)
{
    srv_struct *so = &j->so;
    if (so->type != VKI_CONSTRAINT_NONE)
        return srv_err(e, 400, field, "%s: only one of response_format, grammar, json_schema and guided_* may "
                       "constrain the output (%s already does)", field, so->field), false;
    vki_constraint c = {type, text, n};
    char err[320] = "";
    if (vki_constraint_check(&c, err, sizeof err) != VKI_OK) { /* "grammar: line 1, ..." names itself */
        size_t k = strlen(field);
        bool named = !strncmp(err, field, k) && err[k] == ':';
        return srv_err(e, 400, field, "%s%s%s", named ? "" : field, named ? "" : ": ", err[0] ? err : "invalid"),
               false;
    }
    strbuf_clear(&so->text);
    if (!strbuf_put(&so->text, text, n))
        return srv_err(e, 500, NULL, "out of memory"), false;
    so->type = type;
    so->field = field;
    return true;
}

static bool set_schema(srv_job *j, const char *field, const cJSON *schema, srv_error *e)
{
    char *text = cJSON_PrintUnformatted(schema);
    if (!text)
        return srv_err(e, 500, NULL, "out of memory"), false;
    bool ok = set_constraint(j, field, VKI_CONSTRAINT_JSON_SCHEMA, text, strlen(text), e);
    cJSON_free(text);
    return ok;
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= 64 && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == n;
}

/* {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": bool}} */
static bool json_schema_format(srv_job *j, const cJSON *v, srv_error *e)
{
    const char *F = "response_format";
    const cJSON *js = item(v, "json_schema"), *name = item(js, "name"), *schema = item(js, "schema"),
                *strict = item(js, "strict");
    if (!cJSON_IsObject(js))
        return srv_err(e, 400, F, "response_format.json_schema must be an object {\"name\", \"schema\", "
                       "\"strict\"}"), false;
    if (!absent(name) && !(cJSON_IsString(name) && name_ok(name->valuestring)))
        return srv_err(e, 400, F, "response_format.json_schema.name must be 1-64 letters, digits, '_' or '-'"), false;
    if (!absent(strict) && !cJSON_IsBool(strict))
        return srv_err(e, 400, F, "response_format.json_schema.strict must be a boolean"), false;
    if (!cJSON_IsObject(schema))
        return srv_err(e, 400, F, "response_format.json_schema.schema must be a JSON Schema object"), false;
    return set_schema(j, F, schema, e); /* enforced whether strict or not */
}

static bool f_response_format(srv_job *j, const char *F, const cJSON *v, srv_error *e)
{
    const cJSON *type = item(v, "type");
    if (!cJSON_IsString(type))
        return srv_err(e, 400, F, "response_format must be an object with a \"type\": \"text\", \"json_object\" or "
                       "\"json_schema\""), false;
    const char *t = type->valuestring;
    if (!strcmp(t, "text"))
        return true;
    if (!strcmp(t, "json_schema"))
        return json_schema_format(j, v, e);
    if (strcmp(t, "json_object"))
        return srv_err(e, 400, F, "response_format.type must be \"text\", \"json_object\" or \"json_schema\", got "
                       "\"%.32s\"", t), false;
    const cJSON *schema = item(v, "schema"); /* llama-server's json_object with a schema */
    if (!absent(schema) && !cJSON_IsObject(schema))
        return srv_err(e, 400, F, "response_format.schema must be a JSON Schema object"), false;
    return absent(schema) ? set_constraint(j, F, VKI_CONSTRAINT_JSON_SCHEMA, ANY_OBJECT, strlen(ANY_OBJECT), e)
                          : set_schema(j, F, schema, e);
}

/* grammar, guided_grammar: GBNF text ("" asks for nothing, as llama.cpp clients send it). */
static bool f_gbnf(srv_job *j, const char *F, const cJSON *v, srv_error *e)
{
    if (!cJSON_IsString(v))
        return srv_err(e, 400, F, "%s must be a string holding a GBNF grammar", F), false;
    return !v->valuestring[0] || set_constraint(j, F, VKI_CONSTRAINT_GBNF, v->valuestring, strlen(v->valuestring), e);
}

/* json_schema (llama-server), guided_json (vLLM: an object or its JSON text). */
static bool f_schema(srv_job *j, const char *F, const cJSON *v, srv_error *e)
{
    if (cJSON_IsString(v))
        return set_constraint(j, F, VKI_CONSTRAINT_JSON_SCHEMA, v->valuestring, strlen(v->valuestring), e);
    if (!cJSON_IsObject(v))
        return srv_err(e, 400, F, "%s must be a JSON Schema object", F), false;
    return set_schema(j, F, v, e);
}

/* guided_choice: ["a", "b"] -> root ::= "a" | "b" (quotes, backslashes and control bytes escaped). */
static bool f_choice(srv_job *j, const char *F, const cJSON *v, srv_error *e)
{
    if (!cJSON_IsArray(v) || !v->child)
        return srv_err(e, 400, F, "guided_choice must be a non-empty array of strings"), false;
    strbuf g = {0};
    bool ok = strbuf_put(&g, "root ::= ", 9);
    size_t k = 0;
    for (const cJSON *c = v->child; ok && c; c = c->next, k++) {
        if (!cJSON_IsString(c) || !c->valuestring[0]) {
            strbuf_free(&g);
            return srv_err(e, 400, F, "guided_choice[%zu] must be a non-empty string", k), false;
        }
        ok = strbuf_put(&g, k ? " | \"" : "\"", k ? 4 : 1);
        for (const unsigned char *p = (const unsigned char *)c->valuestring; ok && *p; p++)
            ok = *p == '"' || *p == '\\' ? strbuf_printf(&g, "\\%c", *p)
               : *p < 0x20               ? strbuf_printf(&g, "\\x%02x", *p)
                                         : strbuf_put(&g, (const char *)p, 1);
        ok = ok && strbuf_put(&g, "\"", 1);
    }
    ok = ok ? set_constraint(j, F, VKI_CONSTRAINT_GBNF, g.p, g.len, e) : (srv_err(e, 500, NULL, "out of memory"), false);
    strbuf_free(&g);
    return ok;
}

static bool f_regex(srv_job *j, const char *F, const cJSON *v, srv_error *e)
{
    (void)j, (void)v;
    return srv_err(e, 400, F, "guided_regex: regular expressions are not supported (no regex-to-grammar "
                   "converter); use guided_grammar (GBNF), guided_json or guided_choice"), false;
}

/* ---- tools ----------------------------------------------------------------------------------- */

static bool f_tools(srv_job *j, const char *F, const cJSON *v, srv_error *e)
{
    if (!cJSON_IsArray(v))
        return srv_err(e, 400, F, "tools must be an array of {\"type\": \"function\", \"function\": {...}}"), false;
    if (!v->child)
        return true; /* [] : no tools */
    char *text = cJSON_PrintUnformatted(v), err[256] = "";
    if (!text)
        return srv_err(e, 500, NULL, "out of memory"), false;
    vki_status st = chat_tools_parse(text, strlen(text), &j->so.tools, err, sizeof err);
    cJSON_free(text);
    if (st != VKI_OK)
        return srv_err(e, st == VKI_ERR_INVALID_ARG ? 400 : 500, F, "%s", err[0] ? err : vki_status_str(st)), false;
    return true;
}

static bool f_tool_choice(srv_job *j, const char *F, const cJSON *v, srv_error *e)
{
    srv_struct *so = &j->so;
    so->choice_given = true;
    static const char *const names[] = {[SRV_TOOLS_AUTO] = "auto", [SRV_TOOLS_NONE] = "none",
                                        [SRV_TOOLS_REQUIRED] = "required"};
    for (int k = 0; cJSON_IsString(v) && k < 3; k++)
        if (!strcmp(v->valuestring, names[k])) {
            so->choice = (srv_tool_choice)k;
            return true;
        }
    const cJSON *fn = item(v, "function"), *name = item(fn, "name"), *type = item(v, "type");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "function") && cJSON_IsString(name) &&
        name_ok(name->valuestring)) {
        so->choice = SRV_TOOLS_NAMED;
        snprintf(so->name, sizeof so->name, "%s", name->valuestring);
        return true;
    }
    return srv_err(e, 400, F, "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                   "\"function\": {\"name\": ...}}"), false;
}

static bool f_parallel(srv_job *j, const char *F, const cJSON *v, srv_error *e)
{
    if (!cJSON_IsBool(v))
        return srv_err(e, 400, F, "parallel_tool_calls must be a boolean"), false;
    j->so.serial = cJSON_IsFalse(v);
    return true;
}

static const struct {
    const char *name;
    bool (*read)(srv_job *j, const char *name, const cJSON *v, srv_error *e);
} SF[] = {
    {"response_format", f_response_format}, {"grammar", f_gbnf},          {"guided_grammar", f_gbnf},
    {"json_schema", f_schema},               {"guided_json", f_schema},   {"guided_choice", f_choice},
    {"guided_regex", f_regex},               {"tools", f_tools},          {"tool_choice", f_tool_choice},
    {"parallel_tool_calls", f_parallel},
};

bool srv_struct_field(srv_job *j, const cJSON *v, srv_error *e)
{
    for (size_t k = 0; k < sizeof SF / sizeof SF[0]; k++)
        if (!strcmp(SF[k].name, v->string))
            return SF[k].read(j, SF[k].name, v, e);
    return srv_err(e, 500, NULL, "internal: %s has no reader", v->string), false;
}

bool srv_struct_check(srv_job *j, srv_error *e)
{
    srv_struct *so = &j->so;
    bool forced = so->choice == SRV_TOOLS_REQUIRED || so->choice == SRV_TOOLS_NAMED;
    if (!so->tools && so->choice_given && so->choice != SRV_TOOLS_NONE)
        return srv_err(e, 400, "tool_choice", "tool_choice: no tools were given (tools is required)"), false;
    if (forced && so->type != VKI_CONSTRAINT_NONE)
        return srv_err(e, 400, "tool_choice", "tool_choice: a forced tool call cannot be combined with %s (the "
                       "call has its own grammar)", so->field), false;
    bool found = so->choice != SRV_TOOLS_NAMED;
    for (uint32_t i = 0; !found && i < chat_tools_count(so->tools); i++) {
        size_t len;
        const char *name = chat_tools_name(so->tools, i, &len);
        found = len == strlen(so->name) && !memcmp(name, so->name, len);
    }
    if (!found)
        return srv_err(e, 400, "tool_choice", "tool_choice: no tool named \"%s\" in tools", so->name), false;
    so->parse = so->tools && so->choice != SRV_TOOLS_NONE;
    return true;
}

/* ---- conversations ------------------------------------------------------------------------------ */

static bool one_call(const cJSON *c, size_t i, size_t k, chat_tool_call *out, srv_error *e)
{
    const cJSON *id = item(c, "id"), *fn = item(c, "function"), *name = item(fn, "name"),
                *args = item(fn, "arguments"), *type = item(c, "type");
    const char *why = !cJSON_IsObject(c)                                     ? " must be an object"
                    : !absent(type) && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function"))
                        ? ".type must be \"function\""
                    : !absent(id) && !cJSON_IsString(id)                     ? ".id must be a string"
                    : !cJSON_IsString(name) || !name->valuestring[0]          ? ".function.name must be a string"
                    : !cJSON_IsString(args) ? ".function.arguments must be a string (the arguments' JSON text)"
                                            : NULL;
    if (why)
        return srv_err(e, 400, "messages", "messages[%zu].tool_calls[%zu]%s", i, k, why), false;
    *out = (chat_tool_call){.id = cJSON_IsString(id) ? id->valuestring : NULL,
                            .id_len = cJSON_IsString(id) ? strlen(id->valuestring) : 0,
                            .name = name->valuestring, .name_len = strlen(name->valuestring),
                            .arguments = args->valuestring, .args_len = strlen(args->valuestring)};
    return true;
}

bool srv_struct_message(const cJSON *m, size_t i, chat_role role, chat_tool_msg *tm, srv_error *e)
{
    memset(tm, 0, sizeof *tm);
    const cJSON *calls = item(m, "tool_calls"), *call_id = item(m, "tool_call_id");
    if (role == CHAT_TOOL) {
        if (!absent(call_id) && !cJSON_IsString(call_id))
            return srv_err(e, 400, "messages", "messages[%zu].tool_call_id must be a string", i), false;
        tm->call_id = cJSON_IsString(call_id) ? call_id->valuestring : NULL;
        tm->call_id_len = tm->call_id ? strlen(tm->call_id) : 0;
        return true;
    }
    if (absent(calls))
        return true;
    if (role != CHAT_ASSISTANT || !cJSON_IsArray(calls))
        return srv_err(e, 400, "messages", "messages[%zu].tool_calls: %s", i,
                       role != CHAT_ASSISTANT ? "only assistant messages carry tool calls" : "must be an array"), false;
    size_t n = (size_t)cJSON_GetArraySize(calls), k = 0;
    chat_tool_call *c = n ? calloc(n, sizeof *c) : NULL;
    if (n && !c)
        return srv_err(e, 500, NULL, "out of memory"), false;
    tm->calls = c;
    tm->n_calls = n;
    for (const cJSON *x = calls->child; x; x = x->next, k++)
        if (!one_call(x, i, k, &c[k], e))
            return false;
    return true;
}

/* What Qwen3's template writes after the generation prompt when enable_thinking is false. */
#define NO_THINK "<think>\n\n</think>\n\n"

/* How each choice's answer starts out for srv_think, once the prompt is final: reasoning_content
 * for the thinking templates (auto) or any (deepseek), starting inside the block when the prompt
 * opened it (DeepSeek-R1's generation prompt); harmony's splitter always (reasoning_format none
 * keeps the analysis in the content), primed with the prompt's last message (the generation
 * prompt's "<|start|>assistant", a forced call's header, a continued final answer). */
static void think_start(srv_job *j, const chat_prompt *p)
{
    const srv *s = j->s;
    bool gen = !j->no_gen_prompt;
    j->harmony = s->chat.family == CHAT_HARMONY;
    j->think = j->harmony || j->reasoning_format == SRV_REASONING_DEEPSEEK ||
               (j->reasoning_format == SRV_REASONING_AUTO && chat_thinks(&s->chat));
    j->th0 = (srv_think){.harmony = j->harmony};
    if (j->harmony) {
        chat_harmony_init(&j->th0.h, j->reasoning_format == SRV_REASONING_NONE);
        chat_harmony_prime(&j->th0.h, p);
    } else if (j->think && gen && ((p->len >= 8 && !memcmp(p->text + p->len - 8, "<think>\n", 8)) ||
                                   (p->len >= 7 && !memcmp(p->text + p->len - 7, "<think>", 7)))) {
        j->th0.state = 1;
    }
}

bool srv_struct_render(srv_job *j, const chat_msg *m, const chat_tool_msg *tm, size_t n, chat_prompt *p, srv_error *e)
{
    srv *s = j->s;
    srv_struct *so = &j->so;
    char err[320] = "";
    const chat_tool_set *tools = so->parse ? so->tools : NULL;
    bool gen = !j->no_gen_prompt;
    chat_template t = s->chat; /* harmony: this request's reasoning effort; the date is today's */
    t.effort = j->effort;
    t.think = j->no_think ? CHAT_THINK_OFF : j->think_on ? CHAT_THINK_ON : CHAT_THINK_DEFAULT;
    vki_status st = tools || tm ? chat_render_tools(&t, s->tool_fmt, m, tm, n, tools, gen, p, err, sizeof err)
                                : chat_render(&t, m, n, gen, p, err, sizeof err);
    if (st == VKI_OK && j->continue_final)
        chat_prompt_open_end(p);
    if (st == VKI_OK && gen && j->no_think && s->chat.strip_think && /* Qwen3, enable_thinking false */
        (st = chat_prompt_append(p, NO_THINK, strlen(NO_THINK), true)) != VKI_OK)
        chat_prompt_free(p);
    if (st == VKI_ERR_OUT_OF_HOST_MEMORY) /* the server's fault, not the conversation's */
        return srv_err(e, 500, NULL, "out of memory while rendering the conversation"), false;
    if (st != VKI_OK)
        return srv_err(e, st == VKI_ERR_INVALID_ARG ? 400 : 500, "messages", "%s", err[0] ? err : vki_status_str(st)),
               false;
    if (!tools || (so->choice != SRV_TOOLS_REQUIRED && so->choice != SRV_TOOLS_NAMED)) {
        think_start(j, p);
        return true;
    }
    chat_tool_choice c = {.name = so->choice == SRV_TOOLS_NAMED ? so->name : NULL, .name_len = strlen(so->name),
                          .parallel = !so->serial};
    strbuf prefix = {0};
    strbuf_clear(&so->text);
    st = chat_tools_grammar(s->tool_fmt, tools, &c, &so->text, &prefix, err, sizeof err);
    if (st == VKI_OK && prefix.len) {
        st = chat_prompt_append(p, prefix.p, prefix.len, true);
        so->opened = true;
    }
    strbuf_free(&prefix);
    if (st != VKI_OK) {
        chat_prompt_free(p);
        return srv_err(e, st == VKI_ERR_INVALID_ARG ? 400 : 500, "tools", "%s", err[0] ? err : vki_status_str(st)),
               false;
    }
    so->type = VKI_CONSTRAINT_GBNF;
    so->field = "tool_choice";
    think_start(j, p);
    return true;
}

/* ---- output ------------------------------------------------------------------------------------ */

bool srv_struct_choice_init(srv_job *j, srv_choice *ch, srv_error *e)
{
    ch->th = j->th0;
    if (!j->so.parse)
        return true;
    /* call ids need only be unique: the clock, the job and the choice */
    uint64_t seed = (uint64_t)(srv_now() * 1e9) ^ ((uint64_t)(uintptr_t)j << 16) ^ ch->index;
    if (chat_tool_parser_create(j->s->tool_fmt, j->so.opened, j->so.tools, seed, &ch->tp) != VKI_OK)
        return srv_err(e, 500, NULL, "out of memory"), false;
    return true;
}

typedef struct ev_ctx {
    srv_choice *ch;
    cJSON *deltas;
    bool ok;
} ev_ctx;

static cJSON *call_delta(const chat_tool_event *ev, cJSON **fn)
{
    cJSON *d = cJSON_CreateObject(), *calls = cJSON_AddArrayToObject(d, "tool_calls"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(calls, c);
    cJSON_AddNumberToObject(c, "index", ev->index);
    if (ev->kind == CHAT_TOOL_CALL_BEGIN) {
        cJSON_AddStringToObject(c, "id", ev->id);
        cJSON_AddStringToObject(c, "type", "function");
    }
    *fn = cJSON_AddObjectToObject(c, "function");
    return d;
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i]))
            return false;
    return true;
}

static void on_event(void *user, const chat_tool_event *ev)
{
    ev_ctx *x = user;
    if (ev->kind == CHAT_TOOL_CALL_END || (ev->kind == CHAT_TOOL_CONTENT && x->ch->n_calls && blank(ev->text, ev->len)))
        return; /* the newlines between calls are not content */
    char *text = ev->kind == CHAT_TOOL_CALL_BEGIN ? NULL : strndup(ev->text, ev->len);
    cJSON *fn = NULL, *d = ev->kind == CHAT_TOOL_CONTENT ? cJSON_CreateObject() : call_delta(ev, &fn);
    if (ev->kind == CHAT_TOOL_CONTENT) {
        cJSON_AddStringToObject(d, "content", text ? text : "");
    } else if (ev->kind == CHAT_TOOL_CALL_BEGIN) {
        x->ch->n_calls++;
        cJSON_AddStringToObject(fn, "name", ev->name);
        cJSON_AddStringToObject(fn, "arguments", "");
    } else {
        cJSON_AddStringToObject(fn, "arguments", text ? text : "");
    }
    x->ok &= d && (ev->kind == CHAT_TOOL_CALL_BEGIN || text);
    if (d)
        cJSON_AddItemToArray(x->deltas, d);
    free(text);
}

bool srv_struct_deltas(srv_choice *ch, const char *text, size_t n, bool end, cJSON *deltas)
{
    ev_ctx x = {ch, deltas, true};
    if (ch->tp_done)
        return true;
    vki_status st = chat_tool_parser_push(ch->tp, text, n, on_event, &x);
    if (st == VKI_OK && end) {
        ch->tp_done = true;
        st = chat_tool_parser_finish(ch->tp, on_event, &x);
    }
    return st == VKI_OK && x.ok;
}

bool srv_struct_answer(srv_choice *ch, const char *text, size_t n, cJSON *m)
{
    if (!ch->tp) {
        cJSON_AddStringToObject(m, "content", text);
        return true;
    }
    if (chat_tool_parser_push(ch->tp, text, n, NULL, NULL) != VKI_OK ||
        chat_tool_parser_finish(ch->tp, NULL, NULL) != VKI_OK)
        return false;
    ch->tp_done = true;
    ch->n_calls = chat_tool_parser_calls(ch->tp);
    size_t len;
    const char *content = chat_tool_parser_content(ch->tp, &len);
    if (ch->n_calls && blank(content, len))
        cJSON_AddNullToObject(m, "content"); /* OpenAI: null beside tool calls */
    else
        cJSON_AddStringToObject(m, "content", content);
    if (!ch->n_calls)
        return true;
    cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
    for (uint32_t i = 0; i < ch->n_calls; i++) {
        const char *name, *args, *id = chat_tool_parser_call(ch->tp, i, &name, &args);
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(calls, c);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", name);
        cJSON_AddStringToObject(fn, "arguments", args);
    }
    return true;
}

/* ---- reasoning ------------------------------------------------------------------------------ */

static bool think_ws(char b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

/* One byte of the current part into p: its leading whitespace dropped. */
static bool think_put(srv_think *t, strbuf *p, char b)
{
    if (!t->started && think_ws(b))
        return true;
    t->started = true;
    return strbuf_put(p, &b, 1);
}

bool srv_think_feed(srv_think *t, const char *s, size_t n, bool end, strbuf *r, strbuf *c)
{
    static const char OPEN[] = "<think>", CLOSE[] = "</think>";
    if (t->harmony)
        return chat_harmony_feed(&t->h, s, n, end, r, c);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        char b = s[i];
        if (t->state == 2) {
            ok = think_put(t, c, b);
            continue;
        }
        if (t->state == 0) { /* "<think>" after optional whitespace, or content */
            if (!t->n_hold && think_ws(b))
                continue;
            t->hold[t->n_hold++] = b;
            if (!memcmp(t->hold, OPEN, t->n_hold)) {
                if (t->n_hold == sizeof OPEN - 1)
                    t->state = 1, t->started = false, t->n_hold = 0;
                continue;
            }
            t->state = 2, t->started = false;
            for (uint8_t k = 0; k < t->n_hold && ok; k++)
                ok = think_put(t, c, t->hold[k]);
            t->n_hold = 0;
            continue;
        }
        /* reasoning: hold what may begin "</think>", give out what cannot */
        t->hold[t->n_hold++] = b;
        while (t->n_hold && memcmp(t->hold, CLOSE, t->n_hold) && ok) {
            ok = think_put(t, r, t->hold[0]);
            memmove(t->hold, t->hold + 1, --t->n_hold);
        }
        if (t->n_hold == sizeof CLOSE - 1)
            t->state = 2, t->started = false, t->n_hold = 0;
    }
    if (end && ok) { /* a tag begun but never finished is text */
        for (uint8_t k = 0; k < t->n_hold && ok; k++)
            ok = think_put(t, t->state == 1 ? r : c, t->hold[k]);
        t->n_hold = 0;
    }
    return ok;
}

void srv_struct_free(srv_job *j)
{
    strbuf_free(&j->so.text);
    chat_tools_free(j->so.tools);
    for (uint32_t i = 0; i < SRV_MAX_N; i++)
        chat_tool_parser_free(j->ch[i].tp);
}

cJSON *srv_struct_props(const srv *s)
{
    cJSON *o = cJSON_CreateObject(), *rf = cJSON_AddArrayToObject(o, "response_format");
    static const char *const types[] = {"text", "json_object", "json_schema"};
    for (int i = 0; i < 3; i++)
        cJSON_AddItemToArray(rf, cJSON_CreateString(types[i]));
    cJSON *f = cJSON_AddArrayToObject(o, "fields"); /* every constraint field of both routes */
    for (size_t k = 0; k < sizeof SF / sizeof SF[0]; k++)
        if (strcmp(SF[k].name, "guided_regex") && strncmp(SF[k].name, "tool", 4) && strncmp(SF[k].name, "parallel", 8))
            cJSON_AddItemToArray(f, cJSON_CreateString(SF[k].name));
    cJSON_AddStringToObject(o, "grammar_syntax", "gbnf");
    cJSON_AddBoolToObject(o, "guided_regex", false);
    cJSON_AddBoolToObject(o, "tools", true);
    cJSON_AddStringToObject(o, "tool_call_format", chat_tools_format_name(s->tool_fmt));
    return o;
}
