/* Request JSON -> a job: every field checked for type and range with a message naming it (400),
 * unsupported features refused by name rather than ignored, the prompt tokenised here on the
 * HTTP thread (text, token ids, or chat messages through the chat template).
 *
 * Accepted: model (any value; responses carry the server's model id), prompt / messages,
 * max_tokens (max_completion_tokens), temperature, top_p, top_k, min_p, frequency_penalty,
 * presence_penalty, repetition_penalty, logit_bias, stop, seed, stream, stream_options,
 * logprobs / top_logprobs, user, ignore_eos; n / best_of / echo / suffix / response_format /
 * tools ... only at values that ask for nothing we lack. Cost: O(body) parse + O(prompt) tokenise. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample_ref.h"
#include "host/server/server.h"

enum { F_CMPL = 1, F_CHAT = 2, F_BOTH = 3 };

static const struct {
    const char *name;
    unsigned where;
} FIELDS[] = {
    {"model", F_BOTH},          {"prompt", F_CMPL},           {"messages", F_CHAT},
    {"max_tokens", F_BOTH},     {"max_completion_tokens", F_CHAT}, {"temperature", F_BOTH},
    {"top_p", F_BOTH},          {"top_k", F_BOTH},            {"min_p", F_BOTH},
    {"frequency_penalty", F_BOTH}, {"presence_penalty", F_BOTH}, {"repetition_penalty", F_BOTH},
    {"logit_bias", F_BOTH},     {"stop", F_BOTH},             {"seed", F_BOTH},
    {"stream", F_BOTH},         {"stream_options", F_BOTH},   {"logprobs", F_BOTH},
    {"top_logprobs", F_CHAT},   {"user", F_BOTH},             {"n", F_BOTH},
    {"best_of", F_CMPL},        {"echo", F_CMPL},             {"suffix", F_CMPL},
    {"response_format", F_CHAT}, {"tools", F_CHAT},           {"tool_choice", F_CHAT},
    {"functions", F_CHAT},      {"function_call", F_CHAT},    {"parallel_tool_calls", F_CHAT},
    {"ignore_eos", F_BOTH},     {"metadata", F_BOTH},         {"store", F_BOTH},
    {"service_tier", F_BOTH},
};

static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL; /* null = absent, as the OpenAI API treats it */
}

static bool known_fields(const cJSON *root, bool chat, srv_error *e)
{
    for (const cJSON *c = root->child; c; c = c->next) {
        size_t k = 0;
        while (k < sizeof FIELDS / sizeof FIELDS[0] && strcmp(FIELDS[k].name, c->string))
            k++;
        if (k == sizeof FIELDS / sizeof FIELDS[0] || !(FIELDS[k].where & (chat ? F_CHAT : F_CMPL))) {
            srv_err(e, 400, c->string, "unrecognized request argument supplied: %s", c->string);
            return false;
        }
    }
    return true;
}

/* Fields we accept only at the value that asks for nothing we lack. */
static bool unsupported(const cJSON *root, srv_error *e)
{
    const cJSON *v;
    if ((v = field(root, "n")) && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return srv_err(e, 400, "n", "n: only one choice per request is supported (n = 1)"), false;
    if ((v = field(root, "best_of")) && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return srv_err(e, 400, "best_of", "best_of: only 1 is supported"), false;
    if ((v = field(root, "echo")) && !cJSON_IsFalse(v))
        return srv_err(e, 400, "echo", "echo: echoing the prompt is not supported"), false;
    if ((v = field(root, "suffix")) && !(cJSON_IsString(v) && !v->valuestring[0]))
        return srv_err(e, 400, "suffix", "suffix: insertion (a suffix) is not supported"), false;
    static const char *const tools[] = {"tools", "functions"};
    for (int k = 0; k < 2; k++)
        if ((v = field(root, tools[k])) && !(cJSON_IsArray(v) && !v->child))
            return srv_err(e, 400, tools[k], "%s: tool / function calling is not supported", tools[k]), false;
    static const char *const choice[] = {"tool_choice", "function_call"};
    for (int k = 0; k < 2; k++)
        if ((v = field(root, choice[k])) && !(cJSON_IsString(v) && !strcmp(v->valuestring, "none")))
            return srv_err(e, 400, choice[k], "%s: tool / function calling is not supported", choice[k]), false;
    if ((v = field(root, "response_format"))) {
        const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text"))
            return srv_err(e, 400, "response_format", "response_format: only {\"type\": \"text\"} is supported"), false;
    }
    if ((v = field(root, "model")) && !cJSON_IsString(v))
        return srv_err(e, 400, "model", "model must be a string"), false;
    if ((v = field(root, "user")) && !cJSON_IsString(v))
        return srv_err(e, 400, "user", "user must be a string"), false;
    return true;
}

/* 0 absent, 1 read into *out, -1 bad (e filled). */
static int get_num(const cJSON *root, const char *name, double lo, double hi, bool integer, double *out, srv_error *e)
{
    const cJSON *v = field(root, name);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return srv_err(e, 400, name, "%s must be a number", name), -1;
    double x = v->valuedouble;
    if (integer && x != floor(x))
        return srv_err(e, 400, name, "%s must be an integer, got %g", name, x), -1;
    if (x < lo || x > hi)
        return srv_err(e, 400, name, "%s must be in [%g, %g], got %g", name, lo, hi, x), -1;
    *out = x;
    return 1;
}

/* 0 absent, 1 read, -1 bad. */
static int get_bool(const cJSON *root, const char *name, bool *out, srv_error *e)
{
    const cJSON *v = field(root, name);
    if (!v)
        return 0;
    if (!cJSON_IsBool(v))
        return srv_err(e, 400, name, "%s must be a boolean", name), -1;
    *out = cJSON_IsTrue(v);
    return 1;
}

static bool parse_bias(srv_job *j, const cJSON *v, uint32_t n_vocab, srv_error *e)
{
    if (!cJSON_IsObject(v))
        return srv_err(e, 400, "logit_bias", "logit_bias must be an object mapping token ids to biases"), false;
    uint32_t n = (uint32_t)cJSON_GetArraySize(v);
    if (n > n_vocab)
        return srv_err(e, 400, "logit_bias", "logit_bias has %u entries, the vocabulary %u tokens", n, n_vocab), false;
    j->bias = n ? calloc(n, sizeof *j->bias) : NULL;
    if (n && !j->bias)
        return srv_err(e, 500, NULL, "out of memory"), false;
    uint32_t k = 0;
    for (const cJSON *c = v->child; c; c = c->next, k++) {
        char *end = NULL;
        long long id = strtoll(c->string, &end, 10);
        if (!c->string[0] || *end || id < 0 || id >= n_vocab)
            return srv_err(e, 400, "logit_bias", "logit_bias[\"%.32s\"]: not a token id in [0, %u)", c->string,
                           n_vocab), false;
        if (!cJSON_IsNumber(c) || !(c->valuedouble >= -100 && c->valuedouble <= 100))
            return srv_err(e, 400, "logit_bias", "logit_bias[\"%.32s\"] must be a number in [-100, 100]", c->string),
                   false;
        j->bias[k] = (vki_logit_bias){.token = (int32_t)id, .bias = (float)c->valuedouble};
    }
    j->sampling.logit_bias = j->bias;
    j->sampling.n_logit_bias = n;
    return true;
}

static bool parse_sampling(srv_job *j, const cJSON *root, uint32_t n_vocab, srv_error *e)
{
    vki_sampling_params *sp = &j->sampling;
    double x;
    int r;
    if ((r = get_num(root, "temperature", 0, 2, false, &x, e)) > 0)
        sp->temperature = (float)x;
    if (r >= 0 && (r = get_num(root, "top_p", 0, 1, false, &x, e)) > 0)
        sp->top_p = (float)x;
    if (r >= 0 && (r = get_num(root, "top_k", -1, 1 << 24, true, &x, e)) > 0)
        sp->top_k = x < 0 ? 0 : (int32_t)x; /* -1 = off, as in vLLM */
    if (r >= 0 && (r = get_num(root, "min_p", 0, 1, false, &x, e)) > 0)
        sp->min_p = (float)x;
    if (r >= 0 && (r = get_num(root, "frequency_penalty", -2, 2, false, &x, e)) > 0)
        sp->frequency_penalty = (float)x;
    if (r >= 0 && (r = get_num(root, "presence_penalty", -2, 2, false, &x, e)) > 0)
        sp->presence_penalty = (float)x;
    if (r >= 0 && (r = get_num(root, "repetition_penalty", 1e-6, 100, false, &x, e)) > 0)
        sp->repetition_penalty = (float)x;
    if (r >= 0 && (r = get_num(root, "seed", -9007199254740992.0, 9007199254740992.0, true, &x, e)) > 0) {
        sp->has_seed = true;
        sp->seed = (uint64_t)(int64_t)x;
    }
    if (r < 0)
        return false;
    const cJSON *b = field(root, "logit_bias");
    if (b && !parse_bias(j, b, n_vocab, e))
        return false;
    char msg[256];
    if (sample_params_check(sp, n_vocab, msg, sizeof msg) != VKI_OK) {
        char param[64];
        snprintf(param, sizeof param, "%.*s", (int)strcspn(msg, " :"), msg);
        srv_err(e, 400, param, "%s", msg);
        return false;
    }
    return true;
}

static bool parse_stops(srv_job *j, const cJSON *root, srv_error *e)
{
    const cJSON *v = field(root, "stop");
    if (!v)
        return true;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    if (!one && !cJSON_IsArray(v))
        return srv_err(e, 400, "stop", "stop must be a string or an array of strings"), false;
    if (!one && cJSON_GetArraySize(v) > SRV_MAX_STOPS)
        return srv_err(e, 400, "stop", "stop: at most %d stop strings", SRV_MAX_STOPS), false;
    uint32_t k = 0;
    for (const cJSON *c = one ? one : v->child; c; c = one ? NULL : c->next, k++) {
        if (!cJSON_IsString(c))
            return srv_err(e, 400, "stop", "stop[%u] must be a string", k), false;
        size_t len = strlen(c->valuestring);
        if (!len || len > SRV_MAX_STOP_BYTES)
            return srv_err(e, 400, "stop", "stop[%u] must be 1 to %d bytes long", k, SRV_MAX_STOP_BYTES), false;
        if (!(j->stops[j->n_stops++] = strdup(c->valuestring)))
            return srv_err(e, 500, NULL, "out of memory"), false;
    }
    return true;
}

static bool parse_output_opts(srv_job *j, const cJSON *root, srv_error *e)
{
    double x;
    if (get_bool(root, "stream", &j->stream, e) < 0 || get_bool(root, "ignore_eos", &j->ignore_eos, e) < 0)
        return false;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!j->stream)
            return srv_err(e, 400, "stream_options", "stream_options is only allowed when stream is true"), false;
        if (!cJSON_IsObject(so) || get_bool(so, "include_usage", &j->include_usage, e) < 0)
            return srv_err(e, 400, "stream_options", "stream_options must be {\"include_usage\": boolean}"), false;
    }
    if (!j->chat) { /* logprobs: N alternatives (0..20) */
        int r = get_num(root, "logprobs", 0, VKI_SAMPLE_MAX_TOP, true, &x, e);
        if (r < 0)
            return false;
        j->want_lp = r > 0;
        j->n_top = r > 0 ? (uint32_t)x : 0;
    } else {
        bool lp = false;
        int r1 = get_bool(root, "logprobs", &lp, e);
        int r2 = r1 < 0 ? -1 : get_num(root, "top_logprobs", 0, VKI_SAMPLE_MAX_TOP, true, &x, e);
        if (r1 < 0 || r2 < 0)
            return false;
        if (r2 > 0 && !lp)
            return srv_err(e, 400, "top_logprobs", "top_logprobs requires logprobs: true"), false;
        j->want_lp = lp;
        j->n_top = r2 > 0 ? (uint32_t)x : 0;
    }
    j->sampling.logprobs = j->want_lp;
    j->sampling.top_logprobs = j->n_top;
    return true;
}

/* ---- prompts ------------------------------------------------------------------------------ */

static bool tokenize_text(srv *s, srv_job *j, const char *text, size_t len, srv_error *e)
{
    if (len > SIZE_MAX / sizeof(int32_t) - 8)
        return srv_err(e, 413, "prompt", "prompt too long"), false;
    size_t cap = len + 8, n = 0;
    j->prompt = malloc(cap * sizeof *j->prompt);
    if (!j->prompt)
        return srv_err(e, 500, NULL, "out of memory"), false;
    /* Completion prompts are raw model input: control tokens written in them count (as in vLLM
     * and llama.cpp); BOS as the model's metadata says. */
    vki_status st = vki_tokenize(s->tok, text, len, true, true, j->prompt, cap, &n);
    if (st != VKI_OK)
        return srv_err(e, 400, "prompt", "prompt: cannot tokenize: %s", vki_status_str(st)), false;
    j->n_prompt = (uint32_t)n;
    return true;
}

static bool token_array(srv *s, srv_job *j, const cJSON *a, srv_error *e)
{
    int n = cJSON_GetArraySize(a);
    j->prompt = malloc((size_t)(n > 0 ? n : 1) * sizeof *j->prompt);
    if (!j->prompt)
        return srv_err(e, 500, NULL, "out of memory"), false;
    int k = 0;
    for (const cJSON *c = a->child; c; c = c->next, k++) {
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble) || c->valuedouble < 0 ||
            c->valuedouble >= s->info.n_vocab)
            return srv_err(e, 400, "prompt", "prompt[%d]: not a token id in [0, %u)", k, s->info.n_vocab), false;
        j->prompt[k] = (int32_t)c->valuedouble;
    }
    j->n_prompt = (uint32_t)n;
    return true;
}

/* prompt: a string, an array holding one string, an array of token ids, or an array holding one
 * array of token ids. */
static bool parse_prompt(srv *s, srv_job *j, const cJSON *root, srv_error *e)
{
    const cJSON *p = field(root, "prompt");
    if (!p)
        return srv_err(e, 400, "prompt", "prompt is required"), false;
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    else if (cJSON_IsArray(p) && p->child && !cJSON_IsNumber(p->child))
        return srv_err(e, 400, "prompt", "prompt: batched prompts (an array of %d) are not supported; send one "
                       "request per prompt", cJSON_GetArraySize(p)), false;
    bool ok;
    if (cJSON_IsString(p))
        ok = tokenize_text(s, j, p->valuestring, strlen(p->valuestring), e);
    else if (cJSON_IsArray(p))
        ok = token_array(s, j, p, e);
    else
        return srv_err(e, 400, "prompt", "prompt must be a string or an array of token ids"), false;
    if (ok && !j->n_prompt)
        return srv_err(e, 400, "prompt", "prompt: empty (no tokens)"), false;
    return ok;
}

/* A message's text: a string, or an array of {"type": "text", "text": ...} parts joined by "\n"
 * (as vLLM joins them). *owned is set when the text was built (free it). */
static bool message_text(const cJSON *c, size_t i, const char **text, char **owned, srv_error *e)
{
    *owned = NULL;
    if (cJSON_IsString(c)) {
        *text = c->valuestring;
        return true;
    }
    if (!cJSON_IsArray(c))
        return srv_err(e, 400, "messages", "messages[%zu].content must be a string or an array of text parts", i),
               false;
    strbuf b = {0};
    size_t k = 0;
    for (const cJSON *part = c->child; part; part = part->next, k++) {
        const cJSON *type = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
        const cJSON *t = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "text") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t)) {
            strbuf_free(&b);
            return srv_err(e, 400, "messages", "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} "
                           "parts are supported", i, k), false;
        }
        if ((k && !strbuf_put(&b, "\n", 1)) || !strbuf_put(&b, t->valuestring, strlen(t->valuestring))) {
            strbuf_free(&b);
            return srv_err(e, 500, NULL, "out of memory"), false;
        }
    }
    *owned = b.p ? b.p : strdup("");
    *text = *owned;
    return *owned != NULL || (srv_err(e, 500, NULL, "out of memory"), false);
}

static bool message_role(const cJSON *m, size_t i, chat_role *role, srv_error *e)
{
    const cJSON *r = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
    if (!cJSON_IsObject(m))
        return srv_err(e, 400, "messages", "messages[%zu] must be an object", i), false;
    if (!cJSON_IsString(r))
        return srv_err(e, 400, "messages", "messages[%zu].role must be a string", i), false;
    const char *v = r->valuestring;
    if (!strcmp(v, "system") || !strcmp(v, "developer"))
        *role = CHAT_SYSTEM;
    else if (!strcmp(v, "user"))
        *role = CHAT_USER;
    else if (!strcmp(v, "assistant"))
        *role = CHAT_ASSISTANT;
    else if (!strcmp(v, "tool") || !strcmp(v, "function"))
        return srv_err(e, 400, "messages", "messages[%zu].role: '%s' messages are not supported (no tool calling)",
                       i, v), false;
    else
        return srv_err(e, 400, "messages", "messages[%zu].role: unknown role '%.32s'", i, v), false;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (tc && !cJSON_IsNull(tc) && !(cJSON_IsArray(tc) && !tc->child))
        return srv_err(e, 400, "messages", "messages[%zu].tool_calls: tool calling is not supported", i), false;
    return true;
}

static bool render_messages(srv *s, srv_job *j, chat_msg *msgs, size_t n, srv_error *e)
{
    chat_prompt p;
    char err[256] = "";
    vki_status st = chat_render(&s->chat, msgs, n, true, &p, err, sizeof err);
    if (st != VKI_OK)
        return srv_err(e, 400, "messages", "%s", err[0] ? err : vki_status_str(st)), false;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    bool add_bos = s->chat.family == CHAT_PLAIN && vki_tokenizer_adds_bos(s->tok);
    st = chat_tokenize(s->specials, s->tok, &p, add_bos, &ids, &n_ids);
    chat_prompt_free(&p);
    if (st != VKI_OK)
        return srv_err(e, 500, NULL, "cannot tokenize the conversation: %s", vki_status_str(st)), false;
    j->prompt = ids;
    j->n_prompt = n_ids > UINT32_MAX ? UINT32_MAX : (uint32_t)n_ids;
    if (!j->n_prompt)
        return srv_err(e, 400, "messages", "messages: the conversation renders to no tokens"), false;
    return true;
}

static bool parse_messages(srv *s, srv_job *j, const cJSON *root, srv_error *e)
{
    const cJSON *a = field(root, "messages");
    if (!cJSON_IsArray(a) || !a->child)
        return srv_err(e, 400, "messages", "messages must be a non-empty array"), false;
    size_t n = (size_t)cJSON_GetArraySize(a), i = 0;
    chat_msg *msgs = calloc(n, sizeof *msgs);
    char **owned = calloc(n, sizeof *owned);
    bool ok = msgs && owned;
    if (!ok)
        srv_err(e, 500, NULL, "out of memory");
    for (const cJSON *m = a->child; ok && m; m = m->next, i++) {
        ok = message_role(m, i, &msgs[i].role, e);
        const cJSON *c = ok ? cJSON_GetObjectItemCaseSensitive(m, "content") : NULL;
        if (ok && (!c || cJSON_IsNull(c)))
            ok = (srv_err(e, 400, "messages", "messages[%zu].content is required", i), false);
        const char *text = NULL;
        if (ok)
            ok = message_text(c, i, &text, &owned[i], e);
        if (ok) {
            msgs[i].content = text;
            msgs[i].len = strlen(text);
        }
    }
    if (ok)
        ok = render_messages(s, j, msgs, n, e);
    for (size_t k = 0; owned && k < n; k++)
        free(owned[k]);
    free(owned);
    free(msgs);
    return ok;
}

/* max_tokens against the context: the prompt must leave room for one token; the default is 16
 * for completions (the OpenAI default) and the rest of the context (and of the KV pool) for chat. */
static bool parse_max_tokens(srv *s, srv_job *j, const cJSON *root, srv_error *e)
{
    uint32_t ctx = s->info.n_ctx;
    const char *which = j->chat ? "messages" : "prompt";
    if (j->n_prompt >= ctx)
        return srv_err(e, 400, which, "%s: the prompt is %u tokens; the model's context is %u tokens", which,
                       j->n_prompt, ctx), false;
    double x;
    const char *name = j->chat && field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    int r = get_num(root, name, 1, 1 << 30, true, &x, e);
    if (r < 0)
        return false;
    if (r == 0) {
        uint32_t room = ctx - j->n_prompt;
        uint64_t pool = (uint64_t)s->info.kv_pages * s->info.page_size; /* a sequence fits the pool too */
        if (!s->info.kv_window && pool > j->n_prompt && pool - j->n_prompt < room) /* windows: any length */
            room = (uint32_t)(pool - j->n_prompt);
        j->max_tokens = j->chat || room < 16 ? room : 16;
        return true;
    }
    if ((uint64_t)j->n_prompt + (uint64_t)x > ctx)
        return srv_err(e, 400, name, "%s: the prompt (%u tokens) plus %s (%.0f) exceeds the model's context (%u "
                       "tokens)", name, j->n_prompt, name, x, ctx), false;
    j->max_tokens = (uint32_t)x;
    return true;
}

/* Output arrays the worker writes into (no allocation on the worker thread). */
static bool alloc_outputs(srv *s, srv_job *j, srv_error *e)
{
    size_t n = j->max_tokens, nt = (size_t)j->max_tokens * j->n_top;
    j->tok = malloc(n * sizeof *j->tok);
    j->lp = j->want_lp ? malloc(n * sizeof *j->lp) : NULL;
    j->top_id = nt ? malloc(nt * sizeof *j->top_id) : NULL;
    j->top_lp = nt ? malloc(nt * sizeof *j->top_lp) : NULL;
    uint32_t flags = j->chat ? VKI_DETOK_STRIP_LEADING_SPACE : 0;
    if (!j->tok || (j->want_lp && !j->lp) || (nt && (!j->top_id || !j->top_lp)) ||
        vki_text_stream_create(s->tok, (const char *const *)j->stops, j->n_stops, flags, &j->ts) != VKI_OK)
        return srv_err(e, 500, NULL, "out of memory"), false;
    if (j->want_lp && !j->stream && !(j->lp_all = j->chat ? cJSON_CreateArray() : cJSON_CreateObject()))
        return srv_err(e, 500, NULL, "out of memory"), false;
    return true;
}

bool srv_job_from_json(srv *s, bool chat, const char *body, size_t n, srv_job **out, srv_error *e)
{
    *out = NULL;
    size_t at = 0;
    cJSON *root = srv_json_parse(s, body, n, &at);
    if (!root)
        return srv_err(e, 400, NULL, "the request body is not valid JSON (error at byte %zu)", at), false;
    bool ok = cJSON_IsObject(root);
    if (!ok)
        srv_err(e, 400, NULL, "the request body must be a JSON object");
    srv_job *j = ok ? srv_job_new(s, chat) : NULL;
    if (ok && !j)
        ok = (srv_err(e, 500, NULL, "out of memory"), false);
    ok = ok && known_fields(root, chat, e) && unsupported(root, e) && parse_sampling(j, root, s->info.n_vocab, e) &&
         parse_stops(j, root, e) && parse_output_opts(j, root, e) &&
         (chat ? parse_messages(s, j, root, e) : parse_prompt(s, j, root, e)) && parse_max_tokens(s, j, root, e) &&
         alloc_outputs(s, j, e);
    cJSON_Delete(root);
    if (!ok) {
        if (j)
            srv_job_release(j);
        return false;
    }
    *out = j;
    return true;
}
