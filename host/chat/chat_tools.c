/* Tool calling: rendering, forced-call grammars, and the incremental call parser (chat_tools.h).
 * The renderers reproduce the upstream templates named at each family (transformers' Jinja with
 * `tojson` = Python json.dumps: ", " and ": " separators, non-ASCII kept). */
#include "host/chat/chat_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rng.h"
#include "host/grammar/grammar.h"
#include "host/util/json.h"

chat_tool_format chat_tools_format(const chat_template *t, const char *tmpl)
{
    if (t->family == CHAT_HARMONY)
        return CHAT_TOOLS_HARMONY;
    if (tmpl && strstr(tmpl, "[AVAILABLE_TOOLS]"))
        return CHAT_TOOLS_MISTRAL;
    if (t->family == CHAT_LLAMA3 && tmpl && (strstr(tmpl, "<|python_tag|>") || strstr(tmpl, "ipython")))
        return CHAT_TOOLS_LLAMA3;
    return CHAT_TOOLS_HERMES;
}

const char *chat_tools_format_name(chat_tool_format f)
{
    return f == CHAT_TOOLS_LLAMA3 ? "llama3" : f == CHAT_TOOLS_MISTRAL ? "mistral" : f == CHAT_TOOLS_HARMONY ? "harmony"
                                                                                                     : "hermes";
}

/* ---- the tools array ------------------------------------------------------------------------------ */

typedef struct tool_fn {
    const json_value *tool;   /* the whole {"type": "function", "function": {...}} */
    const json_value *fn;     /* its "function" object */
    const char *name;
    size_t name_len;
    const json_value *params; /* "parameters" or NULL */
} tool_fn;

struct chat_tool_set {
    json_doc *doc;
    tool_fn *fns;             /* [n] */
    uint32_t n;
};

void chat_tools_free(chat_tool_set *ts)
{
    if (!ts)
        return;
    json_free(ts->doc);
    free(ts->fns);
    free(ts);
}

static bool name_ok(const char *s, size_t n)
{
    if (!n || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return false;
    return true;
}

static vki_status check_tool(chat_tool_set *ts, uint32_t i, char *err, size_t n_err)
{
    tool_fn *f = &ts->fns[i];
    const json_value *type = json_get(f->tool, "type");
    f->fn = json_get(f->tool, "function");
    const json_value *name = json_get(f->fn, "name"), *desc = json_get(f->fn, "description");
    f->params = json_get(f->fn, "parameters");
    const char *why = f->tool->type != JSON_OBJECT           ? "must be an object"
                      : !json_is_str(type, "function")       ? ".type must be \"function\""
                      : !f->fn || f->fn->type != JSON_OBJECT ? ".function must be an object"
                      : !name || name->type != JSON_STRING || !name_ok(name->s, name->len)
                          ? ".function.name must be 1-64 letters, digits, '_' or '-'"
                      : desc && desc->type != JSON_STRING ? ".function.description must be a string"
                      : f->params && f->params->type != JSON_OBJECT ? ".function.parameters must be a JSON Schema object"
                                                                    : NULL;
    if (why) {
        snprintf(err, n_err, "tools[%u]%s", i, why);
        return VKI_ERR_INVALID_ARG;
    }
    f->name = name->s;
    f->name_len = name->len;
    for (uint32_t k = 0; k < i; k++)
        if (ts->fns[k].name_len == f->name_len && !memcmp(ts->fns[k].name, f->name, f->name_len)) {
            snprintf(err, n_err, "tools[%u].function.name \"%s\" is used twice", i, f->name);
            return VKI_ERR_INVALID_ARG;
        }
    return VKI_OK;
}

vki_status chat_tools_parse(const char *json, size_t len, chat_tool_set **out, char *err, size_t n_err)
{
    *out = NULL;
    chat_tool_set *ts = calloc(1, sizeof *ts);
    if (!ts)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    char jerr[160];
    vki_status st = json_parse(json, len, &ts->doc, jerr, sizeof jerr);
    if (st == VKI_ERR_INVALID_ARG)
        snprintf(err, n_err, "tools: not valid JSON: %s", jerr);
    const json_value *arr = st == VKI_OK ? json_root(ts->doc) : NULL;
    if (arr && arr->type != JSON_ARRAY) {
        snprintf(err, n_err, "tools must be an array");
        st = VKI_ERR_INVALID_ARG;
    }
    if (st == VKI_OK && !(ts->fns = calloc(arr->n ? arr->n : 1, sizeof *ts->fns)))
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; st == VKI_OK && i < arr->n; i++) {
        ts->fns[i].tool = &arr->items[i];
        st = check_tool(ts, i, err, n_err);
        ts->n = i + 1;
    }
    if (st != VKI_OK) {
        chat_tools_free(ts);
        return st;
    }
    *out = ts;
    return VKI_OK;
}

uint32_t chat_tools_count(const chat_tool_set *ts) { return ts ? ts->n : 0; }

const char *chat_tools_name(const chat_tool_set *ts, uint32_t i, size_t *len)
{
    *len = ts->fns[i].name_len;
    return ts->fns[i].name;
}

/* ---- rendering ---------------------------------------------------------------------------------- */

typedef struct tout {
    chat_prompt *p;
    vki_status st;
} tout;

static void tn(tout *o, const char *s, size_t n, bool tmpl)
{
    if (o->st == VKI_OK && n)
        o->st = chat_prompt_append(o->p, s, n, tmpl);
}
static void T(tout *o, const char *s) { tn(o, s, strlen(s), true); }
static void C(tout *o, const chat_msg *m) { tn(o, m->content, m->len, false); }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static void C_trim(tout *o, const chat_msg *m)
{
    size_t a = 0, b = m->len;
    while (a < b && is_ws(m->content[a]))
        a++;
    while (b > a && is_ws(m->content[b - 1]))
        b--;
    tn(o, m->content + a, b - a, false);
}

/* Template text built with a strbuf (JSON written by the template itself). */
static void T_buf(tout *o, strbuf *b, bool ok)
{
    if (!ok && o->st == VKI_OK)
        o->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    tn(o, b->p ? b->p : "", b->len, true);
    strbuf_clear(b);
}

/* A call's arguments as `tojson` writes them: re-serialised when they parse, else as given. */
static bool args_json(strbuf *b, const chat_tool_call *c)
{
    json_doc *d;
    if (json_parse(c->arguments, c->args_len, &d, NULL, 0) != VKI_OK)
        return strbuf_put(b, c->args_len ? c->arguments : "{}", c->args_len ? c->args_len : 2);
    bool ok = json_write(b, json_root(d));
    json_free(d);
    return ok;
}

static const chat_tool_msg *tmsg(const chat_tool_msg *tm, size_t i)
{
    static const chat_tool_msg none = {0};
    return tm ? &tm[i] : &none;
}

static const char HERMES_TOOLS_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>";
static const char HERMES_TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call>";

/* The tools block of the HERMES format, appended to b. */
static bool hermes_block(strbuf *b, const chat_tool_set *tools)
{
    bool ok = strbuf_put(b, HERMES_TOOLS_HEAD, sizeof HERMES_TOOLS_HEAD - 1);
    for (uint32_t i = 0; ok && i < tools->n; i++)
        ok = strbuf_put(b, "\n", 1) && json_write(b, tools->fns[i].tool);
    return ok && strbuf_put(b, HERMES_TOOLS_TAIL, sizeof HERMES_TOOLS_TAIL - 1);
}

/* One call as "\n<tool_call>\n{...}\n</tool_call>" (the first newline only when `lead`). */
static bool hermes_call(strbuf *b, const chat_tool_call *c, bool lead)
{
    return strbuf_printf(b, "%s<tool_call>\n{\"name\": \"%.*s\", \"arguments\": ", lead ? "\n" : "", (int)c->name_len,
                         c->name) &&
           args_json(b, c) && strbuf_put(b, "}\n</tool_call>", 14);
}

/* Qwen/Qwen2.5-7B-Instruct (and Qwen3, Hermes ChatML): tools in the system message, calls in
 * <tool_call> tags, consecutive tool results in one user turn as <tool_response> blocks. */
static void render_chatml_tools(const chat_template *t, const chat_msg *m, const chat_tool_msg *tm, size_t n,
                                const chat_tool_set *tools, bool gen, tout *o)
{
    bool sys = n && m[0].role == CHAT_SYSTEM;
    strbuf b = {0};
    if (t->emit_bos)
        T(o, t->bos);
    if (tools) {
        T(o, "<|im_start|>system\n");
        if (sys)
            C(o, &m[0]);
        else if (t->default_system)
            T(o, t->default_system);
        if (sys || t->default_system)
            T(o, "\n\n");
        T_buf(o, &b, hermes_block(&b, tools));
        T(o, "<|im_end|>\n");
    } else if (sys || t->default_system) {
        T(o, "<|im_start|>system\n");
        if (sys)
            C(o, &m[0]);
        else
            T(o, t->default_system);
        T(o, "<|im_end|>\n");
    }
    for (size_t i = sys; i < n; i++) {
        const chat_tool_msg *x = tmsg(tm, i);
        if (m[i].role == CHAT_TOOL) {
            if (i == 0 || m[i - 1].role != CHAT_TOOL)
                T(o, "<|im_start|>user");
            T(o, "\n<tool_response>\n");
            C(o, &m[i]);
            T(o, "\n</tool_response>");
            if (i + 1 == n || m[i + 1].role != CHAT_TOOL)
                T(o, "<|im_end|>\n");
        } else if (m[i].role == CHAT_ASSISTANT && x->n_calls) {
            T(o, "<|im_start|>assistant");
            if (m[i].len) {
                T(o, "\n");
                C(o, &m[i]);
            }
            for (size_t k = 0; k < x->n_calls; k++)
                T_buf(o, &b, hermes_call(&b, &x->calls[k], true));
            T(o, "<|im_end|>\n");
        } else {
            static const char *const roles[] = {"system", "user", "assistant"};
            T(o, "<|im_start|>");
            T(o, roles[m[i].role]);
            T(o, "\n");
            C(o, &m[i]);
            T(o, "<|im_end|>\n");
        }
    }
    if (gen)
        T(o, "<|im_start|>assistant\n");
    strbuf_free(&b);
}

/* meta-llama/Llama-3.1-8B-Instruct (custom tools, tools_in_user_message, date "26 Jul 2024"):
 * the system header, the tools with the first user message, one call per assistant turn as
 * {"name": ..., "parameters": ...}, results in ipython turns. */
static void render_llama3_tools(const chat_template *t, const chat_msg *m, const chat_tool_msg *tm, size_t n,
                                const chat_tool_set *tools, bool gen, tout *o, char *err, size_t n_err)
{
    size_t i = n && m[0].role == CHAT_SYSTEM;
    strbuf b = {0};
    if (t->emit_bos)
        T(o, t->bos);
    T(o, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (tools)
        T(o, "Environment: ipython\n");
    T(o, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    if (i)
        C_trim(o, &m[0]);
    T(o, "<|eot_id|>");
    if (tools) {
        if (i == n) {
            snprintf(err, n_err, "messages: the llama3 template puts the tools in the first user message, and there "
                     "is none");
            o->st = VKI_ERR_INVALID_ARG;
            return;
        }
        T(o, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON "
             "for a function call with its proper arguments that best answers the given prompt.\n\nRespond in the "
             "format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use "
             "variables.\n\n");
        for (uint32_t k = 0; k < tools->n; k++) {
            bool ok = json_write_indent(&b, tools->fns[k].tool, 4) && strbuf_put(&b, "\n\n", 2);
            T_buf(o, &b, ok);
        }
        C_trim(o, &m[i++]);
        T(o, "<|eot_id|>");
    }
    for (; i < n && o->st == VKI_OK; i++) {
        const chat_tool_msg *x = tmsg(tm, i);
        if (m[i].role == CHAT_TOOL) {
            T(o, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            C(o, &m[i]);
            T(o, "<|eot_id|>");
        } else if (m[i].role == CHAT_ASSISTANT && x->n_calls) {
            if (x->n_calls != 1) {
                snprintf(err, n_err, "messages[%zu].tool_calls: the llama3 template takes one call per turn", i);
                o->st = VKI_ERR_INVALID_ARG;
                break;
            }
            const chat_tool_call *c = &x->calls[0];
            T(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            bool ok = strbuf_printf(&b, "{\"name\": \"%.*s\", \"parameters\": ", (int)c->name_len, c->name) &&
                      args_json(&b, c) && strbuf_put(&b, "}", 1);
            T_buf(o, &b, ok);
            T(o, "<|eot_id|>");
        } else {
            static const char *const roles[] = {"system", "user", "assistant"};
            T(o, "<|start_header_id|>");
            T(o, roles[m[i].role]);
            T(o, "<|end_header_id|>\n\n");
            C_trim(o, &m[i]);
            T(o, "<|eot_id|>");
        }
    }
    if (gen)
        T(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    strbuf_free(&b);
}

static bool mistral_id_ok(const char *s, size_t n)
{
    if (n != 9)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')))
            return false;
    return true;
}

/* The [AVAILABLE_TOOLS] list as the v0.3 template writes it: per function its items except
 * "return", strings spliced in unescaped (as upstream does), other values as tojson. */
static bool mistral_tools(strbuf *b, const chat_tool_set *tools)
{
    bool ok = strbuf_put(b, "[AVAILABLE_TOOLS] [", 19);
    for (uint32_t k = 0; ok && k < tools->n; k++) {
        const json_value *fn = tools->fns[k].fn;
        static const char head[] = "{\"type\": \"function\", \"function\": {";
        ok = strbuf_put(b, head, sizeof head - 1);
        bool first = true;
        for (size_t j = 0; ok && j < fn->n; j++) {
            const json_member *mb = &fn->members[j];
            if (!strcmp(mb->key, "return"))
                continue;
            ok = (first || strbuf_put(b, ", ", 2)) && strbuf_printf(b, "\"%s\": ", mb->key);
            first = false;
            if (ok && mb->value.type == JSON_STRING)
                ok = strbuf_put(b, "\"", 1) && strbuf_put(b, mb->value.s, mb->value.len) && strbuf_put(b, "\"", 1);
            else if (ok)
                ok = json_write(b, &mb->value);
        }
        ok = ok && strbuf_put(b, "}}", 2) && strbuf_put(b, k + 1 < tools->n ? ", " : "]", k + 1 < tools->n ? 2 : 1);
    }
    return ok && strbuf_put(b, "[/AVAILABLE_TOOLS]", 18);
}

/* mistralai/Mistral-7B-Instruct-v0.3: tools before the last user message, the system message
 * before the last user message's content (only when it is the last message, as upstream),
 * "[INST] ...[/INST]" turns, calls as [TOOL_CALLS] [...] with 9-character ids, results as
 * [TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS]. */
static void render_mistral_tools(const chat_template *t, const chat_msg *m, const chat_tool_msg *tm, size_t n,
                                 const chat_tool_set *tools, tout *o, char *err, size_t n_err)
{
    size_t first = n && m[0].role == CHAT_SYSTEM, last_user = n;
    for (size_t i = first; i < n; i++)
        if (m[i].role == CHAT_USER)
            last_user = i;
    strbuf b = {0};
    T(o, t->bos);
    for (size_t i = first; i < n && o->st == VKI_OK; i++) {
        const chat_tool_msg *x = tmsg(tm, i);
        if (m[i].role == CHAT_USER) {
            if (tools && i == last_user)
                T_buf(o, &b, mistral_tools(&b, tools));
            T(o, "[INST] ");
            if (i + 1 == n && first) {
                C(o, &m[0]);
                T(o, "\n\n");
            }
            C(o, &m[i]);
            T(o, "[/INST]");
        } else if (m[i].role == CHAT_ASSISTANT && x->n_calls) {
            T(o, "[TOOL_CALLS] [");
            for (size_t k = 0; k < x->n_calls && o->st == VKI_OK; k++) {
                const chat_tool_call *c = &x->calls[k];
                if (!mistral_id_ok(c->id, c->id_len)) {
                    snprintf(err, n_err, "messages[%zu].tool_calls[%zu].id: the mistral template needs 9 letters or "
                             "digits", i, k);
                    o->st = VKI_ERR_INVALID_ARG;
                    break;
                }
                bool ok = strbuf_printf(&b, "{\"name\": \"%.*s\", \"arguments\": ", (int)c->name_len, c->name) &&
                          args_json(&b, c) && strbuf_printf(&b, ", \"id\": \"%.*s\"}", (int)c->id_len, c->id) &&
                          (k + 1 == x->n_calls || strbuf_put(&b, ", ", 2));
                T_buf(o, &b, ok);
            }
            T(o, "]");
            T(o, t->eos);
        } else if (m[i].role == CHAT_ASSISTANT) {
            T(o, " ");
            C_trim(o, &m[i]);
            T(o, t->eos);
        } else if (m[i].role == CHAT_TOOL) {
            if (!mistral_id_ok(x->call_id, x->call_id_len)) {
                snprintf(err, n_err, "messages[%zu].tool_call_id: the mistral template needs 9 letters or digits", i);
                o->st = VKI_ERR_INVALID_ARG;
                break;
            }
            T(o, "[TOOL_RESULTS] {\"content\": ");
            C(o, &m[i]);
            bool ok = strbuf_printf(&b, ", \"call_id\": \"%.*s\"}[/TOOL_RESULTS]", (int)x->call_id_len, x->call_id);
            T_buf(o, &b, ok);
        } else {
            snprintf(err, n_err, "messages[%zu].role: only the first message may be a system message (mistral chat "
                     "template)", i);
            o->st = VKI_ERR_INVALID_ARG;
        }
    }
    strbuf_free(&b);
}

/* ---- harmony's tools: a TypeScript namespace, as gpt-oss's template writes it ------------------ */

/* Jinja's truthiness of a JSON value: absent, null, false, 0, "" and empty containers are false. */
static bool truthy(const json_value *v)
{
    if (!v || v->type == JSON_NULL || v->type == JSON_FALSE)
        return false;
    if (v->type == JSON_NUMBER)
        return v->num != 0;
    return v->type == JSON_TRUE || v->n || v->len;
}

/* A value joined to text with Jinja's "+": a string as its bytes (anything else would raise
 * upstream; we write its JSON). */
static bool put_value(strbuf *b, const json_value *v)
{
    return v->type == JSON_STRING ? strbuf_put(b, v->s, v->len) : json_write(b, v);
}

/* `items|join(sep)` */
static bool put_join(strbuf *b, const json_value *arr, const char *sep)
{
    bool ok = true;
    for (size_t i = 0; ok && i < arr->n; i++)
        ok = (!i || strbuf_put(b, sep, strlen(sep))) && put_value(b, &arr->items[i]);
    return ok;
}

static bool is_required(const json_value *required, const char *key, size_t len)
{
    for (size_t i = 0; required && required->type == JSON_ARRAY && i < required->n; i++)
        if (required->items[i].type == JSON_STRING && required->items[i].len == len &&
            !memcmp(required->items[i].s, key, len))
            return true;
    return false;
}

/* render_typescript_type(spec): arrays as T[] ("any[]" past 50 characters), a list of types
 * joined by " | ", oneOf variants one after another (the template's test for object variants sets
 * a variable inside its loop, which Jinja does not carry out of it, so it never fires), string
 * enums as "a" | "b", numbers, booleans, objects inline with a newline and 16 spaces before each
 * member's type (the template's whitespace), anything else "any". */
static bool ts_type(strbuf *b, const json_value *spec)
{
    const json_value *type = json_get(spec, "type"), *one_of = json_get(spec, "oneOf");
    bool nullable = truthy(json_get(spec, "nullable")), ok = true;
    if (json_is_str(type, "array")) {
        const json_value *items = json_get(spec, "items"), *it = json_get(items, "type");
        static const char *const simple[][2] = {
            {"string", "string[]"}, {"number", "number[]"}, {"integer", "number[]"}, {"boolean", "boolean[]"}};
        const char *s = items ? NULL : "any[]";
        for (int k = 0; items && !s && k < 4; k++)
            s = json_is_str(it, simple[k][0]) ? simple[k][1] : NULL;
        if (s) {
            ok = strbuf_put(b, s, strlen(s));
        } else {
            strbuf inner = {0};
            ok = ts_type(&inner, items) && strbuf_put(&inner, "", 0);
            bool any = ok && (!strcmp(inner.p, "object | object") || inner.len > 50);
            ok = ok && (any ? strbuf_put(b, "any[]", 5) : strbuf_put(b, inner.p, inner.len) && strbuf_put(b, "[]", 2));
            strbuf_free(&inner);
        }
        return ok && (!nullable || strbuf_put(b, " | null", 7));
    }
    if (type && type->type == JSON_ARRAY && type->n)
        return put_join(b, type, " | ");
    if (truthy(one_of) && one_of->type == JSON_ARRAY) {
        for (size_t i = 0; ok && i < one_of->n; i++) {
            const json_value *v = &one_of->items[i], *d = json_get(v, "description"), *def = json_get(v, "default");
            ok = ts_type(b, v) && (!truthy(d) || (strbuf_put(b, "// ", 3) && put_value(b, d))) &&
                 (!def || (strbuf_printf(b, "%20s// default: ", "") && json_write(b, def))) &&
                 (i + 1 == one_of->n || strbuf_put(b, " | \n", 4));
        }
        return ok;
    }
    if (json_is_str(type, "string")) {
        const json_value *e = json_get(spec, "enum");
        if (truthy(e) && e->type == JSON_ARRAY)
            return strbuf_put(b, "\"", 1) && put_join(b, e, "\" | \"") && strbuf_put(b, "\"", 1);
        return strbuf_put(b, "string", 6) && (!nullable || strbuf_put(b, " | null", 7));
    }
    if (json_is_str(type, "number") || json_is_str(type, "integer"))
        return strbuf_put(b, "number", 6);
    if (json_is_str(type, "boolean"))
        return strbuf_put(b, "boolean", 7);
    if (json_is_str(type, "object")) {
        const json_value *props = json_get(spec, "properties"), *req = json_get(spec, "required");
        if (!truthy(props) || props->type != JSON_OBJECT)
            return strbuf_put(b, "object", 6);
        ok = strbuf_put(b, "{\n", 2);
        for (size_t i = 0; ok && i < props->n; i++) {
            const json_member *mb = &props->members[i];
            ok = strbuf_put(b, mb->key, mb->key_len) &&
                 (is_required(req, mb->key, mb->key_len) || strbuf_put(b, "?", 1)) &&
                 strbuf_printf(b, ": \n%16s", "") && ts_type(b, &mb->value) &&
                 (i + 1 == props->n || strbuf_put(b, ", ", 2));
        }
        return ok && strbuf_put(b, "}", 1);
    }
    return strbuf_put(b, "any", 3);
}

/* render_tool_namespace("functions", tools): per function its description as a comment, then
 * "type NAME = (_: {\n" + one line per parameter (its description as a comment line before it;
 * '?' when not required; its default as a trailing comment) + "}) => any;\n\n", or
 * "() => any;\n\n" without parameters. A function without a description gets an empty comment
 * (upstream's template fails on it). */
static bool harmony_namespace(strbuf *b, const chat_tool_set *tools)
{
    bool ok = strbuf_put(b, "## functions\n\nnamespace functions {\n\n", 37);
    for (uint32_t i = 0; ok && i < tools->n; i++) {
        const tool_fn *f = &tools->fns[i];
        const json_value *desc = json_get(f->fn, "description"), *props = json_get(f->params, "properties"),
                         *req = json_get(f->params, "required");
        ok = strbuf_put(b, "// ", 3) && (!desc || put_value(b, desc)) &&
             strbuf_printf(b, "\ntype %.*s = ", (int)f->name_len, f->name);
        if (!ok || !truthy(f->params) || !truthy(props) || props->type != JSON_OBJECT) {
            ok = ok && strbuf_put(b, "() => any;\n\n", 12);
            continue;
        }
        ok = strbuf_put(b, "(_: {\n", 6);
        for (size_t k = 0; ok && k < props->n; k++) {
            const json_member *mb = &props->members[k];
            const json_value *spec = &mb->value, *d = json_get(spec, "description"), *def = json_get(spec, "default");
            ok = (!truthy(d) || (strbuf_put(b, "// ", 3) && put_value(b, d) && strbuf_put(b, "\n", 1))) &&
                 strbuf_put(b, mb->key, mb->key_len) &&
                 (is_required(req, mb->key, mb->key_len) || strbuf_put(b, "?", 1)) && strbuf_put(b, ": ", 2) &&
                 ts_type(b, spec);
            if (ok && def && truthy(json_get(spec, "enum")))
                ok = strbuf_put(b, ", // default: ", 14) && put_value(b, def);
            else if (ok && def && truthy(json_get(spec, "oneOf")))
                ok = strbuf_put(b, "// default: ", 12) && put_value(b, def);
            else if (ok && def)
                ok = strbuf_put(b, ", // default: ", 14) && json_write(b, def);
            ok = ok && strbuf_put(b, ",\n", 2);
        }
        ok = ok && strbuf_put(b, "}) => any;\n\n", 12);
    }
    return ok && strbuf_put(b, "} // namespace functions", 24);
}

/* openai/gpt-oss-20b with tools: the system message's line sending calls to the commentary
 * channel; the developer message's "# Tools" section after its instructions; an assistant's first
 * tool call (the template renders one per message) as '<|start|>assistant to=functions.' + name +
 * '<|channel|>commentary json<|message|>' + arguments|tojson + '<|call|>', its content written
 * before it on the analysis channel unless a later answer without calls follows (the one place
 * the template renders reasoning); a tool's result as '<|start|>functions.' + the last called
 * name + ' to=assistant<|channel|>commentary<|message|>' + content|tojson + '<|end|>' (an error
 * when no call came before, as upstream raises). The rest as chat.c's render_harmony. Names and
 * arguments come from the request: written as content, so they cannot hold control tokens. */
static void render_harmony_tools(const chat_template *t, const chat_msg *m, const chat_tool_msg *tm, size_t n,
                                 const chat_tool_set *tools, bool gen, tout *o, char *err, size_t n_err)
{
    strbuf b = {0};
    if (o->st == VKI_OK)
        o->st = chat_harmony_system(t, tools != NULL, o->p);
    size_t first = n && m[0].role == CHAT_SYSTEM;
    if ((first && m[0].len) || tools) {
        T(o, "<|start|>developer<|message|>");
        if (first && m[0].len) {
            T(o, "# Instructions\n\n");
            C(o, &m[0]);
            T(o, "\n\n");
        }
        if (tools) {
            T(o, "# Tools\n\n");
            T_buf(o, &b, harmony_namespace(&b, tools));
        }
        T(o, "<|end|>");
    }
    const chat_tool_call *last = NULL; /* the call a tool message answers */
    for (size_t i = first; i < n && o->st == VKI_OK; i++) {
        const chat_tool_msg *x = tmsg(tm, i);
        if (!chat_harmony_check(&m[i], i, err, n_err)) {
            o->st = VKI_ERR_INVALID_ARG;
        } else if (m[i].role == CHAT_ASSISTANT && x->n_calls) {
            bool answered = false; /* a later assistant message without calls */
            for (size_t k = i + 1; k < n; k++)
                answered |= m[k].role == CHAT_ASSISTANT && !tmsg(tm, k)->n_calls;
            if (m[i].len && !answered) {
                T(o, "<|start|>assistant<|channel|>analysis<|message|>");
                C(o, &m[i]);
                T(o, "<|end|>");
            }
            last = &x->calls[0];
            T(o, "<|start|>assistant to=functions.");
            tn(o, last->name, last->name_len, false);
            T(o, "<|channel|>commentary json<|message|>");
            bool ok = args_json(&b, last);
            tn(o, b.p ? b.p : "", b.len, false);
            strbuf_clear(&b);
            if (!ok && o->st == VKI_OK)
                o->st = VKI_ERR_OUT_OF_HOST_MEMORY;
            T(o, "<|call|>");
        } else if (m[i].role == CHAT_ASSISTANT) {
            T(o, "<|start|>assistant<|channel|>final<|message|>");
            C(o, &m[i]);
            T(o, i + 1 == n && !gen ? "<|return|>" : "<|end|>");
            last = NULL;
        } else if (m[i].role == CHAT_TOOL && !last) {
            snprintf(err, n_err, "messages[%zu].role: a tool message with no assistant tool call before it "
                     "(harmony chat template)", i);
            o->st = VKI_ERR_INVALID_ARG;
        } else if (m[i].role == CHAT_TOOL) {
            T(o, "<|start|>functions.");
            tn(o, last->name, last->name_len, false);
            T(o, " to=assistant<|channel|>commentary<|message|>");
            bool ok = json_write_str(&b, m[i].content, m[i].len);
            tn(o, b.p ? b.p : "", b.len, false);
            strbuf_clear(&b);
            if (!ok && o->st == VKI_OK)
                o->st = VKI_ERR_OUT_OF_HOST_MEMORY;
            T(o, "<|end|>");
        } else if (m[i].role == CHAT_USER) {
            T(o, "<|start|>user<|message|>");
            C(o, &m[i]);
            T(o, "<|end|>");
        }
    }
    if (gen)
        T(o, "<|start|>assistant");
    strbuf_free(&b);
}

/* Other families: the HERMES instructions joined to the system message, calls written into the
 * assistant's content, consecutive tool results as one user message of <tool_response> blocks;
 * then the family's own renderer. */
static vki_status render_fallback(const chat_template *t, const chat_msg *m, const chat_tool_msg *tm, size_t n,
                                  const chat_tool_set *tools, bool gen, chat_prompt *out, char *err, size_t n_err)
{
    chat_msg *v = calloc(n + 1, sizeof *v);
    strbuf *bufs = calloc(n + 1, sizeof *bufs);
    size_t k = 0;
    bool ok = v && bufs;
    if (ok && tools) { /* the system message */
        bool sys = n && m[0].role == CHAT_SYSTEM;
        ok = (!sys || (strbuf_put(&bufs[0], m[0].content, m[0].len) && strbuf_put(&bufs[0], "\n\n", 2))) &&
             hermes_block(&bufs[0], tools);
        v[k++] = (chat_msg){CHAT_SYSTEM, bufs[0].p, bufs[0].len};
        m += sys, tm = tm ? tm + sys : NULL, n -= sys;
    }
    for (size_t i = 0; ok && i < n; i++) {
        const chat_tool_msg *x = tmsg(tm, i);
        strbuf *b = &bufs[k];
        if (m[i].role == CHAT_TOOL) {
            bool cont = i && m[i - 1].role == CHAT_TOOL;
            if (cont)
                b = &bufs[--k];
            ok = (!cont || strbuf_put(b, "\n", 1)) && strbuf_put(b, "<tool_response>\n", 16) &&
                 strbuf_put(b, m[i].content, m[i].len) && strbuf_put(b, "\n</tool_response>", 17);
            v[k++] = (chat_msg){CHAT_USER, b->p, b->len};
        } else if (m[i].role == CHAT_ASSISTANT && x->n_calls) {
            ok = strbuf_put(b, m[i].content, m[i].len);
            for (size_t c = 0; ok && c < x->n_calls; c++)
                ok = hermes_call(b, &x->calls[c], m[i].len || c);
            v[k++] = (chat_msg){CHAT_ASSISTANT, b->p, b->len};
        } else {
            v[k++] = m[i];
        }
    }
    vki_status st = ok ? chat_render(t, v, k, gen, out, err, n_err) : VKI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; bufs && i <= n; i++)
        strbuf_free(&bufs[i]);
    free(bufs);
    free(v);
    return st;
}

vki_status chat_render_tools(const chat_template *t, chat_tool_format f, const chat_msg *m, const chat_tool_msg *tm,
                             size_t n, const chat_tool_set *tools, bool gen, chat_prompt *out, char *err, size_t n_err)
{
    memset(out, 0, sizeof *out);
    if (err && n_err)
        err[0] = 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned)m[i].role > CHAT_TOOL || (m[i].len && !m[i].content))
            return VKI_ERR_INVALID_ARG;
    if (tools && !tools->n)
        tools = NULL;
    bool native = (f == CHAT_TOOLS_HERMES && t->family == CHAT_CHATML) || (f == CHAT_TOOLS_LLAMA3 && t->family == CHAT_LLAMA3) ||
                  f == CHAT_TOOLS_MISTRAL || (f == CHAT_TOOLS_HARMONY && t->family == CHAT_HARMONY);
    if (!native)
        return render_fallback(t, m, tm, n, tools, gen, out, err, n_err);
    tout o = {out, VKI_OK};
    if (f == CHAT_TOOLS_HERMES)
        render_chatml_tools(t, m, tm, n, tools, gen, &o);
    else if (f == CHAT_TOOLS_HARMONY)
        render_harmony_tools(t, m, tm, n, tools, gen, &o, err, n_err);
    else if (f == CHAT_TOOLS_LLAMA3)
        render_llama3_tools(t, m, tm, n, tools, gen, &o, err, n_err);
    else
        render_mistral_tools(t, m, tm, n, tools, &o, err, n_err);
    if (o.st == VKI_OK && !strbuf_put(&out->buf, "", 0))
        o.st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (o.st != VKI_OK)
        chat_prompt_free(out);
    return o.st;
}

/* ---- forcing a call --------------------------------------------------------------------------------- */

/* HARMONY: the call's header is the prompt's (one function: up to "<|message|>", the grammar
 * writes only the arguments) or starts there ("to=functions.", then the name and the rest of the
 * header from the grammar, as plain text). */
static bool harmony_prefix(strbuf *prefix, const tool_fn *only)
{
    return strbuf_put(prefix, "<|channel|>commentary to=functions.", 35) &&
           (!only || strbuf_printf(prefix, "%.*s <|constrain|>json<|message|>", (int)only->name_len, only->name));
}

vki_status chat_tools_grammar(chat_tool_format f, const chat_tool_set *tools, const chat_tool_choice *choice,
                              strbuf *g, strbuf *prefix, char *err, size_t n_err)
{
    strbuf_clear(prefix);
    if (!strbuf_put(prefix, "", 0))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    uint32_t n = chat_tools_count(tools), used = 0;
    const tool_fn *only = NULL; /* HARMONY: the one function that may be called */
    for (uint32_t i = 0; i < n; i++)
        if (!choice->name || (choice->name_len == tools->fns[i].name_len &&
                              !memcmp(choice->name, tools->fns[i].name, tools->fns[i].name_len)))
            only = !used++ ? &tools->fns[i] : NULL;
    used = 0;
    gram_schema_ctx ctx = {0};
    strbuf alts = {0};
    vki_status st = VKI_OK;
    const char *key = f == CHAT_TOOLS_LLAMA3 ? "parameters" : "arguments";
    for (uint32_t i = 0; i < n && st == VKI_OK; i++) {
        const tool_fn *t = &tools->fns[i];
        if (choice->name && (choice->name_len != t->name_len || memcmp(choice->name, t->name, t->name_len)))
            continue;
        char rule[32], path[48];
        snprintf(rule, sizeof rule, "args-%u", i);
        snprintf(path, sizeof path, "tools[%u].function.parameters", i);
        /* no parameters: an empty object */
        static const char empty[] = "{\"type\": \"object\", \"properties\": {}}";
        json_doc *d = NULL;
        const json_value *schema = t->params;
        if (!schema && (st = json_parse(empty, sizeof empty - 1, &d, NULL, 0)) == VKI_OK)
            schema = json_root(d);
        if (st == VKI_OK)
            st = gram_schema_rule(&ctx, schema, rule, path, g, err, n_err);
        json_free(d);
        bool put = f == CHAT_TOOLS_HARMONY
                       ? only ? strbuf_printf(&alts, "args-%u", i)
                              : strbuf_printf(&alts, "%s\"%s <|constrain|>json<|message|>\" args-%u", used ? " | " : "",
                                              t->name, i)
                       : strbuf_printf(&alts, "%s\"{\\\"name\\\": \\\"%s\\\", \\\"%s\\\": \" args-%u \"}\"",
                                       used ? " | " : "", t->name, key, i);
        if (st == VKI_OK && !put)
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
        used++;
    }
    if (st == VKI_OK && !used) {
        snprintf(err, n_err, choice->name ? "tool_choice: no tool named \"%.*s\"" : "tool_choice: no tools to call%.*s",
                 (int)(choice->name ? choice->name_len : 0), choice->name ? choice->name : "");
        st = VKI_ERR_INVALID_ARG;
    }
    bool many = choice->parallel && f != CHAT_TOOLS_LLAMA3 && f != CHAT_TOOLS_HARMONY; /* harmony: one per turn */
    bool ok = st == VKI_OK && strbuf_printf(g, "call ::= %s\n", alts.p);
    if (ok && f == CHAT_TOOLS_HERMES)
        ok = strbuf_printf(g, "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"%s\n",
                           many ? " ( \"\\n<tool_call>\\n\" call \"\\n</tool_call>\" )*" : "");
    else if (ok && f == CHAT_TOOLS_MISTRAL)
        ok = strbuf_printf(g, "root ::= \" [\" call %s\"]\"\n", many ? "( \", \" call )* " : "");
    else if (ok)
        ok = strbuf_printf(g, "root ::= call\n");
    if (ok && (f == CHAT_TOOLS_MISTRAL || f == CHAT_TOOLS_HARMONY))
        ok = f == CHAT_TOOLS_MISTRAL ? strbuf_put(prefix, "[TOOL_CALLS]", 12) : harmony_prefix(prefix, only);
    if (st == VKI_OK && !ok)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    strbuf_free(&alts);
    return st;
}

/* ---- the parser ---------------------------------------------------------------------------------- */

enum { P_TEXT, P_CALLS, P_TAIL };                /* where we are in the output */
enum { O_OPEN, O_KEY0, O_KEY, O_COLON, O_VAL, O_NAME, O_RAW, O_AFTER }; /* inside a call object */
enum { A_SKIP, A_NAME, A_ARGS };                 /* what a member's value is */

typedef struct p_call {
    char id[40];
    strbuf name, args;
    bool begun;               /* CALL_BEGIN sent */
} p_call;

struct chat_tool_parser {
    chat_tool_format f;
    const chat_tool_set *tools;
    uint64_t seed;
    int mode;
    bool in_list;             /* MISTRAL: between '[' and ']' */
    bool tag_done;            /* HERMES: this <tool_call>'s object is read, the closer is next */
    bool open;                /* a call object is being read */
    int hp;                   /* HARMONY: 0 the name, 1 the rest of the header, 2 the arguments */
    bool seen_text;           /* LLAMA3: non-blank content seen: no call can start any more */
    strbuf hold;              /* text that may still be (part of) an opener, or an undecided call */
    strbuf content;
    p_call *calls;
    uint32_t n_calls, cap_calls;
    bool malformed;
    /* the call object being read */
    int o;
    int a;                    /* A_* of the current value */
    strbuf key, raw;          /* the current key; the raw text of the call (for a fallback) */
    uint32_t depth;           /* raw value nesting */
    bool in_str, esc, str_args;
    /* pending event run */
    chat_tool_event_fn fn;
    void *user;
    int ev_kind;
    uint32_t ev_index;
    strbuf ev;
    vki_status st;
};

static void flush(chat_tool_parser *p)
{
    if (p->ev.len && p->fn) {
        chat_tool_event e = {.kind = (chat_tool_event_kind)p->ev_kind, .index = p->ev_index, .text = p->ev.p,
                             .len = p->ev.len};
        p->fn(p->user, &e);
    }
    strbuf_clear(&p->ev);
}

static void emit_text(chat_tool_parser *p, int kind, uint32_t index, const char *s, size_t n)
{
    if (!n)
        return;
    if (p->ev.len && (p->ev_kind != kind || p->ev_index != index))
        flush(p);
    p->ev_kind = kind;
    p->ev_index = index;
    if (!strbuf_put(&p->ev, s, n) || (kind == CHAT_TOOL_CONTENT && !strbuf_put(&p->content, s, n)))
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
}

static void emit(chat_tool_parser *p, chat_tool_event_kind kind, uint32_t index)
{
    flush(p);
    const p_call *c = &p->calls[index];
    chat_tool_event e = {.kind = kind, .index = index, .id = c->id, .name = c->name.p};
    if (p->fn)
        p->fn(p->user, &e);
}

static const char *opener(chat_tool_format f)
{
    return f == CHAT_TOOLS_HERMES    ? "<tool_call>"
           : f == CHAT_TOOLS_MISTRAL ? "[TOOL_CALLS]"
           : f == CHAT_TOOLS_HARMONY ? "<|start|>assistant to=functions."
                                     : "{";
}

static bool known_name(const chat_tool_parser *p, const strbuf *name)
{
    if (!p->tools)
        return true;
    for (uint32_t i = 0; i < p->tools->n; i++)
        if (p->tools->fns[i].name_len == name->len && !memcmp(p->tools->fns[i].name, name->p, name->len))
            return true;
    return false;
}

static void make_id(chat_tool_parser *p, p_call *c, uint32_t index)
{
    static const char an[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t s = p->seed ^ (0x9E3779B97F4A7C15ull * (index + 1));
    size_t n = p->f == CHAT_TOOLS_MISTRAL ? 9 : 24, k = 0;
    if (p->f != CHAT_TOOLS_MISTRAL)
        k = (size_t)snprintf(c->id, sizeof c->id, "call_");
    for (size_t i = 0; i < n; i++)
        c->id[k++] = an[vki_splitmix64(&s) % 62];
    c->id[k] = 0;
}

/* A call object starts (its '{' consumed). */
static void call_open(chat_tool_parser *p)
{
    if (p->n_calls == p->cap_calls) {
        uint32_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        p_call *nc = realloc(p->calls, cap * sizeof *nc);
        if (!nc) {
            p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
            return;
        }
        p->calls = nc;
        p->cap_calls = cap;
    }
    p_call *c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof *c);
    make_id(p, c, p->n_calls - 1);
    p->o = O_KEY0;
    p->open = true;
}

/* The name is known: a LLAMA3 object with an unknown name is a JSON answer, not a call. */
static bool call_begin(chat_tool_parser *p)
{
    p_call *c = &p->calls[p->n_calls - 1];
    if (c->begun)
        return true;
    if (p->f == CHAT_TOOLS_LLAMA3 && !known_name(p, &c->name))
        return false;
    if (!strbuf_put(&c->name, "", 0))
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    c->begun = true;
    strbuf_clear(&p->hold);
    emit(p, CHAT_TOOL_CALL_BEGIN, p->n_calls - 1);
    if (c->args.len && !p->str_args) /* arguments written before the name */
        emit_text(p, CHAT_TOOL_CALL_ARGS, p->n_calls - 1, c->args.p, c->args.len);
    return true;
}

/* The call text did not parse (or was a JSON answer): what was held becomes content. */
static void bail(chat_tool_parser *p, bool bad)
{
    p->malformed |= bad;
    p_call *c = p->open ? &p->calls[p->n_calls - 1] : NULL;
    bool begun = c && c->begun;
    if (begun) { /* its text was the call's: it ends here, with the arguments it got */
        if (!strbuf_put(&c->args, "", 0))
            p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
        emit(p, CHAT_TOOL_CALL_END, p->n_calls - 1);
    } else if (c) {
        strbuf_free(&c->name);
        strbuf_free(&c->args);
        p->n_calls--;
    }
    p->open = false;
    if (!begun)
        emit_text(p, CHAT_TOOL_CONTENT, 0, p->raw.p, p->raw.len);
    strbuf_clear(&p->raw);
    strbuf_clear(&p->hold);
    p->mode = P_TAIL; /* the rest is content */
    p->seen_text = true;
}

static void call_close(chat_tool_parser *p)
{
    p_call *c = &p->calls[p->n_calls - 1];
    if (!c->name.len || !call_begin(p)) {
        bail(p, c->name.len == 0);
        return;
    }
    if (p->str_args) { /* "arguments": "<json text>" : the decoded string is the arguments */
        json_doc *d;
        strbuf dec = {0};
        if (json_parse(c->args.p, c->args.len, &d, NULL, 0) == VKI_OK) {
            const json_value *v = json_root(d);
            if (!strbuf_put(&dec, v->s, v->len))
                p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
            json_free(d);
            strbuf_free(&c->args);
            c->args = dec;
        }
        emit_text(p, CHAT_TOOL_CALL_ARGS, p->n_calls - 1, c->args.p, c->args.len);
    }
    if (!strbuf_put(&c->args, "", 0))
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    emit(p, CHAT_TOOL_CALL_END, p->n_calls - 1);
    strbuf_clear(&p->raw);
    p->o = O_OPEN;
    p->open = false;
    p->tag_done = true;
}

/* One character of a member value's raw text; returns whether the value ended before it (then
 * the character belongs to what follows the value). */
static bool raw_char(chat_tool_parser *p, char ch)
{
    if (p->in_str) {
        if (p->esc)
            p->esc = false;
        else if (ch == '\\')
            p->esc = true;
        else if (ch == '"')
            p->in_str = false;
    } else if (ch == '"') {
        p->in_str = true;
    } else if (ch == '{' || ch == '[') {
        p->depth++;
    } else if (ch == '}' || ch == ']') {
        if (!p->depth)
            return true;
        p->depth--;
    } else if (!p->depth && (ch == ',' || is_ws(ch))) {
        return true;
    }
    p_call *c = &p->calls[p->n_calls - 1];
    if (p->a == A_ARGS) {
        if (!strbuf_put(&c->args, &ch, 1))
            p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
        else if (c->begun && !p->str_args)
            emit_text(p, CHAT_TOOL_CALL_ARGS, p->n_calls - 1, &ch, 1);
    }
    /* a closed compound value or string ends here */
    if (!p->depth && !p->in_str && (ch == '}' || ch == ']' || ch == '"'))
        p->o = O_AFTER;
    return false;
}

/* One character inside a call object. */
static void obj_char(chat_tool_parser *p, char ch)
{
    p_call *c = &p->calls[p->n_calls - 1];
    switch (p->o) {
    case O_KEY0:
        if (is_ws(ch))
            return;
        if (ch == '"') {
            strbuf_clear(&p->key);
            p->o = O_KEY;
        } else if (ch == '}') {
            call_close(p);
        } else {
            bail(p, true);
        }
        return;
    case O_KEY:
        if (ch == '"')
            p->o = O_COLON;
        else if (!strbuf_put(&p->key, &ch, 1))
            p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
        return;
    case O_COLON:
        if (ch == ':')
            p->o = O_VAL;
        else if (!is_ws(ch))
            bail(p, true);
        return;
    case O_VAL:
        if (is_ws(ch))
            return;
        p->a = p->key.len == 4 && !memcmp(p->key.p, "name", 4) ? A_NAME
               : (p->key.len == 9 && !memcmp(p->key.p, "arguments", 9)) ||
                         (p->key.len == 10 && !memcmp(p->key.p, "parameters", 10))
                   ? A_ARGS
                   : A_SKIP;
        if (p->a == A_NAME) {
            if (ch != '"')
                bail(p, true);
            else
                p->o = O_NAME;
            return;
        }
        p->depth = 0;
        p->in_str = p->esc = false;
        p->str_args = p->a == A_ARGS && ch == '"';
        if (p->a == A_ARGS)
            strbuf_clear(&c->args);
        p->o = O_RAW;
        raw_char(p, ch);
        return;
    case O_NAME:
        if (ch == '"') {
            p->o = O_AFTER;
            if (!call_begin(p))
                bail(p, false);
        } else if (ch == '\\' || !strbuf_put(&c->name, &ch, 1)) {
            bail(p, true); /* names are [a-zA-Z0-9_-]: no escapes */
        }
        return;
    case O_RAW:
        if (!raw_char(p, ch))
            return;
        p->o = O_AFTER; /* a scalar ended at ch: ch is the separator */
        /* fall through */
    case O_AFTER:
        if (ch == ',')
            p->o = O_KEY0;
        else if (ch == '}')
            call_close(p);
        else if (!is_ws(ch))
            bail(p, true);
        return;
    }
}

/* HARMONY after its opener: the name (up to the header's next '<' or ' '), the rest of the header
 * up to "<|message|>" (at most 128 bytes), then the arguments, as they come, up to "<|call|>". */
static void harmony_char(chat_tool_parser *p, char ch)
{
    static const char msg[] = "<|message|>", end[] = "<|call|>";
    if (p->hp == 0 && name_ok(&ch, 1)) {
        if (!p->open)
            call_open(p);
        p_call *c = &p->calls[p->n_calls - 1];
        if (p->st == VKI_OK && (c->name.len == 64 || !strbuf_put(&c->name, &ch, 1)))
            bail(p, true);
        return;
    }
    if (p->hp == 0) { /* the name ended */
        if (!p->open || !call_begin(p)) {
            bail(p, true);
            return;
        }
        p->hp = 1;
    }
    if (!strbuf_put(&p->hold, &ch, 1)) {
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
        return;
    }
    if (p->hp == 1) {
        if (p->hold.len >= sizeof msg - 1 && !memcmp(p->hold.p + p->hold.len - (sizeof msg - 1), msg, sizeof msg - 1))
            p->hp = 2, strbuf_clear(&p->hold);
        else if (p->hold.len > 128)
            bail(p, true);
        return;
    }
    size_t drop = 0; /* the arguments: what cannot begin "<|call|>" */
    while (drop < p->hold.len &&
           (p->hold.len - drop > sizeof end - 1 || memcmp(p->hold.p + drop, end, p->hold.len - drop)))
        drop++;
    p_call *c = &p->calls[p->n_calls - 1];
    if (drop && !strbuf_put(&c->args, p->hold.p, drop))
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    emit_text(p, CHAT_TOOL_CALL_ARGS, p->n_calls - 1, p->hold.p, drop);
    memmove(p->hold.p, p->hold.p + drop, p->hold.len - drop);
    p->hold.len -= drop;
    if (p->hold.len == sizeof end - 1) { /* the call is complete: back to text, another may follow */
        if (!strbuf_put(&c->args, "", 0))
            p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
        emit(p, CHAT_TOOL_CALL_END, p->n_calls - 1);
        strbuf_clear(&p->hold);
        strbuf_clear(&p->raw);
        p->open = false;
        p->hp = 0;
        p->mode = P_TEXT;
    }
}

/* One character in the call region (after the opener). */
static void calls_char(chat_tool_parser *p, char ch)
{
    if (!strbuf_put(&p->raw, &ch, 1))
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (p->f == CHAT_TOOLS_HARMONY) {
        harmony_char(p, ch);
        return;
    }
    if (p->open) {
        obj_char(p, ch);
        return;
    }
    if (is_ws(ch) && (!p->hold.len || p->f == CHAT_TOOLS_MISTRAL))
        return;
    if (p->f == CHAT_TOOLS_MISTRAL) { /* [ {call}, {call} ] */
        if (!p->in_list && !p->tag_done && ch == '[') {
            p->in_list = true;
        } else if (p->in_list && ch == '{' && (!p->tag_done || p->hold.len)) {
            strbuf_clear(&p->hold);
            call_open(p);
        } else if (p->in_list && p->tag_done && ch == ',' && !p->hold.len) {
            if (!strbuf_put(&p->hold, &ch, 1)) /* a comma: another call must follow */
                p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
        } else if (p->in_list && p->tag_done && ch == ']' && !p->hold.len) {
            p->in_list = false;
            p->mode = P_TAIL;
            strbuf_clear(&p->raw);
        } else {
            bail(p, true);
        }
    } else if (p->f == CHAT_TOOLS_HERMES) { /* { call } </tool_call> */
        static const char closer[] = "</tool_call>";
        if (!p->tag_done && ch == '{') {
            call_open(p);
        } else if (p->tag_done && p->hold.len < sizeof closer - 1 && ch == closer[p->hold.len]) {
            if (!strbuf_put(&p->hold, &ch, 1))
                p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
            if (p->hold.len == sizeof closer - 1) { /* back to text: more calls may follow */
                strbuf_clear(&p->hold);
                strbuf_clear(&p->raw);
                p->tag_done = false;
                p->mode = P_TEXT;
            }
        } else {
            bail(p, true);
        }
    } else {
        bail(p, false); /* LLAMA3: text after the call is content */
    }
}

/* One character of text: content, or the start of an opener (held back until it is certain). */
static void text_char(chat_tool_parser *p, char ch)
{
    const char *op = opener(p->f);
    size_t ol = strlen(op);
    if (p->f == CHAT_TOOLS_LLAMA3) { /* a call is the whole answer: '{' first, blanks allowed */
        if (!p->seen_text && ch == '{') {
            strbuf_clear(&p->raw);
            if (!strbuf_put(&p->raw, p->hold.p ? p->hold.p : "", p->hold.len) || !strbuf_put(&p->raw, &ch, 1))
                p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
            strbuf_clear(&p->hold);
            p->mode = P_CALLS;
            call_open(p);
            return;
        }
        if (!p->seen_text && is_ws(ch)) {
            if (!strbuf_put(&p->hold, &ch, 1))
                p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
            return;
        }
        p->seen_text = true;
        emit_text(p, CHAT_TOOL_CONTENT, 0, p->hold.p, p->hold.len);
        strbuf_clear(&p->hold);
        emit_text(p, CHAT_TOOL_CONTENT, 0, &ch, 1);
        return;
    }
    if (!strbuf_put(&p->hold, &ch, 1)) {
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
        return;
    }
    /* shortest release that leaves hold a prefix of the opener */
    size_t drop = 0;
    while (drop < p->hold.len &&
           (p->hold.len - drop > ol || memcmp(p->hold.p + drop, op, p->hold.len - drop)))
        drop++;
    emit_text(p, CHAT_TOOL_CONTENT, 0, p->hold.p, drop);
    memmove(p->hold.p, p->hold.p + drop, p->hold.len - drop);
    p->hold.len -= drop;
    if (p->hold.len == ol) {
        strbuf_clear(&p->hold);
        strbuf_clear(&p->raw);
        if (!strbuf_put(&p->raw, op, ol))
            p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
        p->mode = P_CALLS;
        p->o = O_OPEN;
    }
}

vki_status chat_tool_parser_create(chat_tool_format f, bool opened, const chat_tool_set *tools, uint64_t seed,
                                   chat_tool_parser **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    chat_tool_parser *p = *out;
    p->f = f;
    p->tools = tools;
    p->seed = seed;
    p->mode = opened && f != CHAT_TOOLS_LLAMA3 && f != CHAT_TOOLS_HARMONY ? P_CALLS : P_TEXT;
    p->o = O_OPEN;
    return VKI_OK;
}

void chat_tool_parser_free(chat_tool_parser *p)
{
    if (!p)
        return;
    for (uint32_t i = 0; i < p->n_calls; i++) {
        strbuf_free(&p->calls[i].name);
        strbuf_free(&p->calls[i].args);
    }
    free(p->calls);
    strbuf_free(&p->hold);
    strbuf_free(&p->content);
    strbuf_free(&p->key);
    strbuf_free(&p->raw);
    strbuf_free(&p->ev);
    free(p);
}

vki_status chat_tool_parser_push(chat_tool_parser *p, const char *text, size_t n, chat_tool_event_fn fn, void *user)
{
    p->fn = fn;
    p->user = user;
    for (size_t i = 0; i < n && p->st == VKI_OK; i++) {
        if (p->mode == P_TEXT)
            text_char(p, text[i]);
        else if (p->mode == P_CALLS)
            calls_char(p, text[i]);
        else
            emit_text(p, CHAT_TOOL_CONTENT, 0, &text[i], 1);
    }
    flush(p);
    return p->st;
}

vki_status chat_tool_parser_finish(chat_tool_parser *p, chat_tool_event_fn fn, void *user)
{
    p->fn = fn;
    p->user = user;
    /* cut off inside a call, or an opener with no call: malformed; a missing closer after a
     * complete call is forgiven */
    if (p->mode == P_CALLS && (p->open || (p->f == CHAT_TOOLS_HERMES && !p->tag_done) ||
                               (p->f == CHAT_TOOLS_MISTRAL && !p->tag_done) || p->f == CHAT_TOOLS_HARMONY))
        bail(p, true);
    if (p->mode == P_CALLS)
        strbuf_clear(&p->hold);
    emit_text(p, CHAT_TOOL_CONTENT, 0, p->hold.p, p->hold.len);
    strbuf_clear(&p->hold);
    flush(p);
    if (!strbuf_put(&p->content, "", 0))
        p->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    return p->st;
}

uint32_t chat_tool_parser_calls(const chat_tool_parser *p) { return p->n_calls; }

const char *chat_tool_parser_call(const chat_tool_parser *p, uint32_t i, const char **name, const char **arguments)
{
    *name = p->calls[i].name.p ? p->calls[i].name.p : "";
    *arguments = p->calls[i].args.p ? p->calls[i].args.p : "{}";
    return p->calls[i].id;
}

const char *chat_tool_parser_content(const chat_tool_parser *p, size_t *len)
{
    *len = p->content.len;
    return p->content.p ? p->content.p : "";
}

bool chat_tool_parser_malformed(const chat_tool_parser *p) { return p->malformed; }
