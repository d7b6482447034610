/* Completion / chat request JSON -> a job.
 *
 * One table (FIELDS) names every field the two routes know, which route takes it and the function
 * that reads it: adding a field is adding a row. Every value is checked for type and range with a 400 naming it.
 * Fields nobody knows are accepted and logged as a warning (what OpenAI does), except the ones in
 * REFUSED: asking for something we do not do there would change the answer, so they keep a 400
 * naming them unless their value asks for nothing. Structured output and tools are read by
 * server_struct.c (srv_struct_field). Cross-field rules (max_tokens against the
 * context, top_logprobs needing logprobs, ...) run after the table. The prompt is tokenised here
 * on the handler thread (text, token ids, or chat messages through the chat template).
 * Cost: O(body) parse + O(prompt) tokenise. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample_ref.h"
#include "host/server/server.h"

enum { F_CMPL = 1, F_CHAT = 2, F_BOTH = 3 };

/* What the table's readers fill besides the job. */
typedef struct req_ctx {
    srv *s;
    srv_job *j;
    const cJSON *prompt, *messages, *max_tokens, *stream_options, *top_logprobs, *logprobs, *best_of;
    const cJSON *use_beam_search, *length_penalty, *early_stopping, *add_gen_prompt;
    const char *max_name;
} req_ctx;

typedef bool (*field_fn)(req_ctx *c, const cJSON *v, srv_error *e);

/* ---- value readers -------------------------------------------------------------------------- */

static bool num(const cJSON *v, const char *name, double lo, double hi, bool integer, double *out, srv_error *e)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return srv_err(e, 400, name, "%s must be a number", name), false;
    double x = v->valuedouble;
    if (integer && x != floor(x))
        return srv_err(e, 400, name, "%s must be an integer, got %g", name, x), false;
    if (x < lo || x > hi)
        return srv_err(e, 400, name, "%s must be in [%g, %g], got %g", name, lo, hi, x), false;
    *out = x;
    return true;
}

static bool boolean(const cJSON *v, const char *name, bool *out, srv_error *e)
{
    if (!cJSON_IsBool(v))
        return srv_err(e, 400, name, "%s must be a boolean", name), false;
    *out = cJSON_IsTrue(v);
    return true;
}

#define FLOAT_FIELD(fn, name, lo, hi, dst)                                                         \
    static bool fn(req_ctx *c, const cJSON *v, srv_error *e)                                       \
    {                                                                                              \
        double x;                                                                                  \
        if (!num(v, name, lo, hi, false, &x, e))                                                   \
            return false;                                                                          \
        c->j->sampling.dst = (float)x;                                                             \
        return true;                                                                               \
    }
FLOAT_FIELD(f_temperature, "temperature", 0, 2, temperature)
FLOAT_FIELD(f_top_p, "top_p", 0, 1, top_p)
FLOAT_FIELD(f_min_p, "min_p", 0, 1, min_p)
FLOAT_FIELD(f_frequency, "frequency_penalty", -2, 2, frequency_penalty)
FLOAT_FIELD(f_presence, "presence_penalty", -2, 2, presence_penalty)
FLOAT_FIELD(f_repetition, "repetition_penalty", 1e-6, 100, repetition_penalty)
FLOAT_FIELD(f_repeat_penalty, "repeat_penalty", 1e-6, 100, repetition_penalty) /* llama.cpp's name */

#define BOOL_FIELD(fn, name, dst)                                                                  \
    static bool fn(req_ctx *c, const cJSON *v, srv_error *e) { return boolean(v, name, &c->j->dst, e); }
BOOL_FIELD(f_stream, "stream", stream)
BOOL_FIELD(f_ignore_eos, "ignore_eos", ignore_eos)
BOOL_FIELD(f_skip_special, "skip_special_tokens", skip_special)
BOOL_FIELD(f_return_ids, "return_token_ids", return_ids)
BOOL_FIELD(f_echo, "echo", echo)

static bool f_cache_prompt(req_ctx *c, const cJSON *v, srv_error *e)
{
    bool b; /* accepted for llama.cpp clients: prefix caching is always on */
    (void)c;
    return boolean(v, "cache_prompt", &b, e);
}

static bool f_string(const cJSON *v, const char *name, srv_error *e)
{
    return cJSON_IsString(v) || (srv_err(e, 400, name, "%s must be a string", name), false);
}
static bool f_model(req_ctx *c, const cJSON *v, srv_error *e) { return (void)c, f_string(v, "model", e); }
static bool f_user(req_ctx *c, const cJSON *v, srv_error *e) { return (void)c, f_string(v, "user", e); }
static bool f_ignored(req_ctx *c, const cJSON *v, srv_error *e) { return (void)c, (void)v, (void)e, true; }
static bool f_session(req_ctx *c, const cJSON *v, srv_error *e) { return srv_session_field(c->j, v, e); }

static bool f_top_k(req_ctx *c, const cJSON *v, srv_error *e)
{
    double x;
    if (!num(v, "top_k", -1, 1 << 24, true, &x, e))
        return false;
    c->j->sampling.top_k = x < 0 ? 0 : (int32_t)x; /* -1 = off, as in vLLM */
    return true;
}

/* llama.cpp's repeat_last_n: the penalties' look-back in tokens; -1 = the whole context, 0 = none. */
static bool f_repeat_last_n(req_ctx *c, const cJSON *v, srv_error *e)
{
    double x;
    if (!num(v, "repeat_last_n", -1, 1 << 24, true, &x, e))
        return false;
    c->j->sampling.penalty_window = x < 0 ? c->s->info.n_ctx : (uint32_t)x;
    return true;
}

static bool f_seed(req_ctx *c, const cJSON *v, srv_error *e)
{
    double x;
    if (!num(v, "seed", -9007199254740992.0, 9007199254740992.0, true, &x, e))
        return false;
    c->j->sampling.has_seed = true;
    c->j->sampling.seed = (uint64_t)(int64_t)x;
    return true;
}

static bool f_n(req_ctx *c, const cJSON *v, srv_error *e)
{
    double x;
    if (!num(v, "n", 1, SRV_MAX_N, true, &x, e))
        return false;
    c->j->n = (uint32_t)x;
    return true;
}

static bool f_min_tokens(req_ctx *c, const cJSON *v, srv_error *e)
{
    double x;
    if (!num(v, "min_tokens", 0, 1 << 30, true, &x, e))
        return false;
    c->j->min_tokens = (uint32_t)x;
    return true;
}

/* logit_bias: {"token id": bias}; a key is digits only ("5", not " 5" or "+5"). */
static bool f_logit_bias(req_ctx *c, const cJSON *v, srv_error *e)
{
    srv_job *j = c->j;
    uint32_t n_vocab = c->s->info.n_vocab;
    if (!cJSON_IsObject(v))
        return srv_err(e, 400, "logit_bias", "logit_bias must be an object mapping token ids to biases"), false;
    uint32_t n = (uint32_t)cJSON_GetArraySize(v);
    if (n > n_vocab)
        return srv_err(e, 400, "logit_bias", "logit_bias has %u entries, the vocabulary %u tokens", n, n_vocab), false;
    j->bias = n ? calloc(n, sizeof *j->bias) : NULL;
    if (n && !j->bias)
        return srv_err(e, 500, NULL, "out of memory"), false;
    uint32_t k = 0;
    for (const cJSON *b = v->child; b; b = b->next, k++) {
        const char *key = b->string;
        size_t len = strspn(key, "0123456789");
        unsigned long long id = len && len <= 9 && !key[len] && (key[0] != '0' || len == 1) ? strtoull(key, NULL, 10)
                                                                                           : ~0ull;
        if (id >= n_vocab)
            return srv_err(e, 400, "logit_bias", "logit_bias[\"%.32s\"]: not a token id in [0, %u) (digits only)", key,
                           n_vocab), false;
        if (!cJSON_IsNumber(b) || !(b->valuedouble >= -100 && b->valuedouble <= 100))
            return srv_err(e, 400, "logit_bias", "logit_bias[\"%.32s\"] must be a number in [-100, 100]", key), false;
        j->bias[k] = (vki_logit_bias){.token = (int32_t)id, .bias = (float)b->valuedouble};
    }
    j->sampling.logit_bias = j->bias;
    j->sampling.n_logit_bias = n;
    return true;
}

static bool f_stop(req_ctx *c, const cJSON *v, srv_error *e)
{
    srv_job *j = c->j;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    if (!one && !cJSON_IsArray(v))
        return srv_err(e, 400, "stop", "stop must be a string or an array of strings"), false;
    if (!one && cJSON_GetArraySize(v) > SRV_MAX_STOPS)
        return srv_err(e, 400, "stop", "stop: at most %d stop strings", SRV_MAX_STOPS), false;
    uint32_t k = 0;
    for (const cJSON *s = one ? one : v->child; s; s = one ? NULL : s->next, k++) {
        if (!cJSON_IsString(s))
            return srv_err(e, 400, "stop", "stop[%u] must be a string", k), false;
        size_t len = strlen(s->valuestring);
        if (!len || len > SRV_MAX_STOP_BYTES)
            return srv_err(e, 400, "stop", "stop[%u] must be 1 to %d bytes long", k, SRV_MAX_STOP_BYTES), false;
        if (!(j->stops[j->n_stops++] = strdup(s->valuestring)))
            return srv_err(e, 500, NULL, "out of memory"), false;
    }
    return true;
}

static bool f_stop_token_ids(req_ctx *c, const cJSON *v, srv_error *e)
{
    srv_job *j = c->j;
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > 1024)
        return srv_err(e, 400, "stop_token_ids", "stop_token_ids must be an array of at most 1024 token ids"), false;
    j->stop_ids = malloc((size_t)(n ? n : 1) * sizeof *j->stop_ids);
    if (!j->stop_ids)
        return srv_err(e, 500, NULL, "out of memory"), false;
    int k = 0;
    for (const cJSON *t = v->child; t; t = t->next, k++) {
        double x;
        if (!num(t, "stop_token_ids", 0, c->s->info.n_vocab - 1.0, true, &x, e))
            return false;
        j->stop_ids[k] = (int32_t)x;
    }
    j->n_stop_ids = (uint32_t)n;
    return true;
}

#define KEEP(fn, slot)                                                                             \
    static bool fn(req_ctx *c, const cJSON *v, srv_error *e) { return (void)e, c->slot = v, true; }
KEEP(f_prompt, prompt)
KEEP(f_messages, messages)
KEEP(f_add_gen_prompt, add_gen_prompt)
BOOL_FIELD(f_continue_final, "continue_final_message", continue_final)
BOOL_FIELD(f_include_stop, "include_stop_str_in_output", include_stop)

/* A reasoning effort for gpt-oss's harmony template (field: the request field that gives it). */
static bool effort(const char *field, const cJSON *v, chat_effort *out, srv_error *e)
{
    if (!cJSON_IsString(v) || !chat_effort_parse(v->valuestring, out))
        return srv_err(e, 400, !strcmp(field, "reasoning_effort") ? field : "chat_template_kwargs",
                       "%s must be \"low\", \"medium\" or \"high\" (the reasoning efforts of gpt-oss's harmony "
                       "template)", field), false;
    return true;
}

/* chat_template_kwargs (vLLM, llama-server): the variables a Jinja template reads. vkinfer's
 * renderers read enable_thinking (false: Qwen3's empty reasoning block opens the answer, SmolLM3
 * and EXAONE 4 do not think; true: EXAONE 4's and SmolLM3's generation prompt opens one), Granite's
 * own `thinking` (its template's name for it), and, for gpt-oss's harmony template,
 * reasoning_effort (unless the request's own reasoning_effort is given, which wins, as in
 * llama-server); the others change nothing in the templates it renders and are accepted. */
static bool f_template_kwargs(req_ctx *c, const cJSON *v, srv_error *e)
{
    if (!cJSON_IsObject(v))
        return srv_err(e, 400, "chat_template_kwargs", "chat_template_kwargs must be an object"), false;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "enable_thinking"),
                *r = cJSON_GetObjectItemCaseSensitive(v, "reasoning_effort"),
                *g = cJSON_GetObjectItemCaseSensitive(v, "thinking");
    if ((t && !cJSON_IsBool(t)) || (g && !cJSON_IsBool(g)))
        return srv_err(e, 400, "chat_template_kwargs", "chat_template_kwargs.enable_thinking and .thinking must be "
                       "booleans"), false;
    if (c->s->chat.family == CHAT_GRANITE && g) /* Granite 3.2 / 3.3's template variable */
        t = g;
    c->j->no_think = cJSON_IsFalse(t);
    c->j->think_on = cJSON_IsTrue(t);
    chat_effort x;
    if (r && !cJSON_IsNull(r) && c->s->chat.family == CHAT_HARMONY) {
        if (!effort("chat_template_kwargs.reasoning_effort", r, &x, e))
            return false;
        if (!c->j->effort_top)
            c->j->effort = x;
    }
    return true;
}

/* reasoning_effort (OpenAI's): gpt-oss's harmony template writes it into its system message; no
 * other template vkinfer renders reads it, so there only "none" (asking for nothing) is taken. */
static bool f_reasoning_effort(req_ctx *c, const cJSON *v, srv_error *e)
{
    if (c->s->chat.family != CHAT_HARMONY) {
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "none"))
            return true;
        return srv_err(e, 400, "reasoning_effort", "reasoning_effort: not supported by this model's chat template "
                       "(%s; only gpt-oss's harmony template has reasoning efforts)",
                       chat_family_name(c->s->chat.family)), false;
    }
    c->j->effort_top = true;
    return effort("reasoning_effort", v, &c->j->effort, e);
}
/* reasoning_format (llama-server's): "auto" (the default: reasoning_content for the thinking
 * templates), "deepseek" (for any template), "none" (the raw text in content). */
static bool f_reasoning_format(req_ctx *c, const cJSON *v, srv_error *e)
{
    const char *f = cJSON_IsString(v) ? v->valuestring : NULL;
    if (f && !strcmp(f, "auto"))
        c->j->reasoning_format = SRV_REASONING_AUTO;
    else if (f && !strcmp(f, "deepseek"))
        c->j->reasoning_format = SRV_REASONING_DEEPSEEK;
    else if (f && !strcmp(f, "none"))
        c->j->reasoning_format = SRV_REASONING_NONE;
    else
        return srv_err(e, 400, "reasoning_format", "reasoning_format must be \"auto\", \"deepseek\" or \"none\""),
               false;
    return true;
}
KEEP(f_stream_options, stream_options)
KEEP(f_top_logprobs, top_logprobs)
KEEP(f_logprobs, logprobs)
KEEP(f_best_of, best_of)
KEEP(f_use_beam_search, use_beam_search)
KEEP(f_length_penalty, length_penalty)
KEEP(f_early_stopping, early_stopping)

static bool f_max_tokens(req_ctx *c, const cJSON *v, srv_error *e)
{
    (void)e;
    if (!c->max_tokens || !strcmp(c->max_name, "max_tokens")) { /* max_completion_tokens wins */
        c->max_tokens = v;
        c->max_name = "max_tokens";
    }
    return true;
}

static bool f_max_completion_tokens(req_ctx *c, const cJSON *v, srv_error *e)
{
    (void)e;
    c->max_tokens = v;
    c->max_name = "max_completion_tokens";
    return true;
}

/* Suffix (insertion) is refused unless empty; echo on chat unless false. */
static bool f_suffix(req_ctx *c, const cJSON *v, srv_error *e)
{
    (void)c;
    return (cJSON_IsString(v) && !v->valuestring[0]) ||
           (srv_err(e, 400, "suffix", "suffix: insertion (a suffix) is not supported"), false);
}

static bool f_struct(req_ctx *c, const cJSON *v, srv_error *e) { return srv_struct_field(c->j, v, e); }

static bool f_chat_echo(req_ctx *c, const cJSON *v, srv_error *e)
{
    (void)c;
    return cJSON_IsFalse(v) || (srv_err(e, 400, "echo", "echo: not supported on chat completions"), false);
}

static const struct {
    const char *name;
    unsigned where;
    field_fn read;
} FIELDS[] = {
    {"model", F_BOTH, f_model},
    {"session_id", F_BOTH, f_session},
    {"prompt", F_CMPL, f_prompt},
    {"messages", F_CHAT, f_messages},
    {"max_tokens", F_BOTH, f_max_tokens},
    {"max_completion_tokens", F_CHAT, f_max_completion_tokens},
    {"min_tokens", F_BOTH, f_min_tokens},
    {"temperature", F_BOTH, f_temperature},
    {"top_p", F_BOTH, f_top_p},
    {"top_k", F_BOTH, f_top_k},
    {"min_p", F_BOTH, f_min_p},
    {"frequency_penalty", F_BOTH, f_frequency},
    {"presence_penalty", F_BOTH, f_presence},
    {"repetition_penalty", F_BOTH, f_repetition},
    {"repeat_last_n", F_BOTH, f_repeat_last_n},
    {"repeat_penalty", F_BOTH, f_repeat_penalty},
    {"logit_bias", F_BOTH, f_logit_bias},
    {"seed", F_BOTH, f_seed},
    {"stop", F_BOTH, f_stop},
    {"stop_token_ids", F_BOTH, f_stop_token_ids},
    {"ignore_eos", F_BOTH, f_ignore_eos},
    {"skip_special_tokens", F_BOTH, f_skip_special},
    {"return_token_ids", F_BOTH, f_return_ids},
    {"cache_prompt", F_BOTH, f_cache_prompt},
    {"stream", F_BOTH, f_stream},
    {"stream_options", F_BOTH, f_stream_options},
    {"logprobs", F_BOTH, f_logprobs},
    {"top_logprobs", F_CHAT, f_top_logprobs},
    {"n", F_BOTH, f_n},
    {"best_of", F_BOTH, f_best_of},
    {"use_beam_search", F_BOTH, f_use_beam_search},
    {"length_penalty", F_BOTH, f_length_penalty},
    {"early_stopping", F_BOTH, f_early_stopping},
    {"echo", F_CMPL, f_echo},
    {"echo", F_CHAT, f_chat_echo},
    {"suffix", F_CMPL, f_suffix},
    {"user", F_BOTH, f_user},
    {"metadata", F_BOTH, f_ignored},
    {"store", F_BOTH, f_ignored},
    {"service_tier", F_BOTH, f_ignored},
    {"response_format", F_BOTH, f_struct},
    {"grammar", F_BOTH, f_struct},
    {"json_schema", F_BOTH, f_struct},
    {"guided_json", F_BOTH, f_struct},
    {"guided_grammar", F_BOTH, f_struct},
    {"guided_choice", F_BOTH, f_struct},
    {"guided_regex", F_BOTH, f_struct},
    {"tools", F_CHAT, f_struct},
    {"tool_choice", F_CHAT, f_struct},
    {"add_generation_prompt", F_CHAT, f_add_gen_prompt},
    {"chat_template_kwargs", F_CHAT, f_template_kwargs},
    {"reasoning_format", F_CHAT, f_reasoning_format},
    {"reasoning_effort", F_CHAT, f_reasoning_effort},
    {"include_stop_str_in_output", F_BOTH, f_include_stop},
    {"continue_final_message", F_CHAT, f_continue_final},
    {"parallel_tool_calls", F_CHAT, f_struct},
};

/* Fields whose absence of support changes the answer: refused (400 naming them) unless their
 * value asks for nothing (null, false, an empty list, "none", {"type": "text"}). */
static const char *const REFUSED[] = {
    "tools", "functions", "tool_choice", "function_call", "structured_outputs", "prompt_logprobs",
    "logits_processors", "reasoning_effort", "audio", "modalities", "prediction", "bad_words", "allowed_token_ids",
    "chat_template", "guided_whitespace_pattern", "post_sampling_probs", "lora", "image_data", "multimodal_data",
    "response_fields",
};

/* Samplers and options of vLLM / llama.cpp clients that vkinfer does not have: refused unless
 * they hold the value that turns them off (clients such as SillyTavern send them every time). */
static const struct {
    const char *name;
    double off;
} REFUSED_UNLESS[] = {
    {"typical_p", 1}, {"tfs_z", 1}, {"top_a", 0}, {"mirostat", 0}, {"mirostat_mode", 0}, {"dry_multiplier", 0},
    {"xtc_probability", 0}, {"dynatemp_range", 0}, {"smoothing_factor", 0}, {"truncate_prompt_tokens", -1},
    {"n_indent", 0}, {"t_max_predict_ms", 0}, {"n_cmpl", 1},
};

static bool asks_nothing(const cJSON *v)
{
    if (cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsArray(v) && !v->child))
        return true;
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "none"))
        return true;
    const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
    return cJSON_IsString(t) && !strcmp(t->valuestring, "text") && !t->next && t == v->child;
}

/* Runs every field of root through the table. Unknown fields are collected into *ignored. */
static bool read_fields(req_ctx *c, const cJSON *root, strbuf *ignored, srv_error *e)
{
    unsigned where = c->j->chat ? F_CHAT : F_CMPL;
    for (const cJSON *f = root->child; f; f = f->next) {
        size_t k = 0, nf = sizeof FIELDS / sizeof FIELDS[0];
        while (k < nf && (strcmp(FIELDS[k].name, f->string) || !(FIELDS[k].where & where)))
            k++;
        if (k < nf) {
            if (!cJSON_IsNull(f) && !FIELDS[k].read(c, f, e)) /* null = absent, as the OpenAI API treats it */
                return false;
            continue;
        }
        size_t u = 0, nu = sizeof REFUSED_UNLESS / sizeof REFUSED_UNLESS[0];
        while (u < nu && strcmp(REFUSED_UNLESS[u].name, f->string))
            u++;
        if (u < nu) {
            if (!cJSON_IsNull(f) && !(cJSON_IsNumber(f) && f->valuedouble == REFUSED_UNLESS[u].off))
                return srv_err(e, 400, f->string, "%s: not supported by this server (only %g, which turns it off)",
                               f->string, REFUSED_UNLESS[u].off), false;
            continue;
        }
        size_t r = 0, nr = sizeof REFUSED / sizeof REFUSED[0];
        while (r < nr && strcmp(REFUSED[r], f->string))
            r++;
        if (r < nr && !asks_nothing(f))
            return srv_err(e, 400, f->string, "%s: not supported by this server", f->string), false;
        if (r == nr)
            strbuf_printf(ignored, "%s%.40s", ignored->len ? ", " : "", f->string);
    }
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
    if (j->echo && !(j->prompt_text = strdup(text)))
        return srv_err(e, 500, NULL, "out of memory"), false;
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
    if (j->echo && n) { /* the prompt as the model would show it */
        size_t cap = (size_t)n * 16 + 64, got = 0;
        j->prompt_text = malloc(cap);
        vki_status st = j->prompt_text ? vki_detokenize(s->tok, j->prompt, (size_t)n, 0, j->prompt_text, cap - 1, &got)
                                       : VKI_ERR_OUT_OF_HOST_MEMORY;
        if (st != VKI_OK)
            return srv_err(e, 500, NULL, "echo: cannot detokenize the prompt: %s", vki_status_str(st)), false;
        j->prompt_text[got] = 0;
    }
    return true;
}

/* prompt: a string, an array holding one string, an array of token ids, or an array holding one
 * array of token ids. */
static bool parse_prompt(srv *s, srv_job *j, const cJSON *p, srv_error *e)
{
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
    else if (!strcmp(v, "tool"))
        *role = CHAT_TOOL;
    else if (!strcmp(v, "function"))
        return srv_err(e, 400, "messages", "messages[%zu].role: 'function' messages (the deprecated functions API) "
                       "are not supported; use tools and 'tool' messages", i), false;
    else
        return srv_err(e, 400, "messages", "messages[%zu].role: unknown role '%.32s'", i, v), false;
    return true;
}

static bool render_messages(srv *s, srv_job *j, chat_msg *msgs, const chat_tool_msg *tm, size_t n, srv_error *e)
{
    chat_prompt p;
    if (!srv_struct_render(j, msgs, tm, n, &p, e))
        return false;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    bool add_bos = s->chat.family == CHAT_PLAIN && vki_tokenizer_adds_bos(s->tok);
    if (j->want_rendered && !(j->rendered = strdup(p.text))) {
        chat_prompt_free(&p);
        return srv_err(e, 500, NULL, "out of memory"), false;
    }
    vki_status st = chat_tokenize(s->specials, s->tok, &p, add_bos, &ids, &n_ids);
    chat_prompt_free(&p);
    if (st != VKI_OK)
        return srv_err(e, 500, NULL, "cannot tokenize the conversation: %s", vki_status_str(st)), false;
    j->prompt = ids;
    j->n_prompt = n_ids > UINT32_MAX ? UINT32_MAX : (uint32_t)n_ids;
    if (!j->n_prompt)
        return srv_err(e, 400, "messages", "messages: the conversation renders to no tokens"), false;
    return true;
}

/* One message: role, text, tool parts. An assistant message with tool calls may have no content. */
static bool parse_message(const cJSON *m, size_t i, chat_msg *msg, chat_tool_msg *tm, char **owned, srv_error *e)
{
    if (!message_role(m, i, &msg->role, e) || !srv_struct_message(m, i, msg->role, tm, e))
        return false;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    const char *text = "";
    if ((!c || cJSON_IsNull(c)) && !tm->n_calls)
        return srv_err(e, 400, "messages", "messages[%zu].content is required", i), false;
    if (c && !cJSON_IsNull(c) && !message_text(c, i, &text, owned, e))
        return false;
    msg->content = text;
    msg->len = strlen(text);
    return true;
}

/* add_generation_prompt (default true) and continue_final_message (vLLM's): continuing the last
 * message means no generation prompt, so add_generation_prompt true beside it is a contradiction
 * (absent, it follows). */
static bool render_opts(req_ctx *c, srv_error *e)
{
    srv_job *j = c->j;
    bool add = !j->continue_final;
    if (c->add_gen_prompt && !boolean(c->add_gen_prompt, "add_generation_prompt", &add, e))
        return false;
    if (add && j->continue_final)
        return srv_err(e, 400, "continue_final_message", "continue_final_message: not with add_generation_prompt "
                       "true (the final message is continued, no new one begins)"), false;
    j->no_gen_prompt = !add;
    return true;
}

static bool parse_messages(srv *s, srv_job *j, const cJSON *a, srv_error *e)
{
    if (!cJSON_IsArray(a) || !a->child)
        return srv_err(e, 400, "messages", "messages must be a non-empty array"), false;
    size_t n = (size_t)cJSON_GetArraySize(a), i = 0;
    chat_msg *msgs = calloc(n, sizeof *msgs);
    chat_tool_msg *tm = calloc(n, sizeof *tm);
    char **owned = calloc(n, sizeof *owned);
    bool ok = msgs && owned && tm, tools = false;
    if (!ok)
        srv_err(e, 500, NULL, "out of memory");
    for (const cJSON *m = a->child; ok && m; m = m->next, i++) {
        ok = parse_message(m, i, &msgs[i], &tm[i], &owned[i], e);
        tools |= tm[i].n_calls || msgs[i].role == CHAT_TOOL;
    }
    if (ok && j->continue_final && (msgs[n - 1].role != CHAT_ASSISTANT || !msgs[n - 1].len || tm[n - 1].n_calls)) {
        srv_err(e, 400, "continue_final_message", "continue_final_message: the last message must be the "
                "assistant's, with text to continue");
        ok = false;
    }
    if (ok)
        ok = render_messages(s, j, msgs, tools ? tm : NULL, n, e);
    for (size_t k = 0; owned && tm && k < n; k++) {
        free(owned[k]);
        free((void *)tm[k].calls);
    }
    free(owned);
    free(tm);
    free(msgs);
    return ok;
}

/* ---- cross-field rules --------------------------------------------------------------------- */

static bool beam_opts(req_ctx *c, uint32_t best_of, srv_error *e);

static bool output_opts(req_ctx *c, srv_error *e)
{
    srv_job *j = c->j;
    double x;
    if (c->stream_options) {
        if (!j->stream)
            return srv_err(e, 400, "stream_options", "stream_options is only allowed when stream is true"), false;
        const cJSON *u = cJSON_IsObject(c->stream_options)
                             ? cJSON_GetObjectItemCaseSensitive(c->stream_options, "include_usage") : NULL;
        if (!cJSON_IsObject(c->stream_options) || (u && !cJSON_IsNull(u) && !cJSON_IsBool(u)))
            return srv_err(e, 400, "stream_options", "stream_options must be {\"include_usage\": boolean}"), false;
        j->include_usage = cJSON_IsTrue(u);
    }
    if (!j->chat) { /* logprobs: N alternatives (0..20) */
        if (c->logprobs && !num(c->logprobs, "logprobs", 0, VKI_SAMPLE_MAX_TOP, true, &x, e))
            return false;
        j->want_lp = c->logprobs != NULL;
        j->n_top = c->logprobs ? (uint32_t)x : 0;
        if (j->want_lp && j->echo)
            return srv_err(e, 400, "logprobs", "logprobs with echo would need the prompt's logprobs, which this "
                           "server does not compute"), false;
    } else {
        bool lp = false;
        if (c->logprobs && !boolean(c->logprobs, "logprobs", &lp, e))
            return false;
        if (c->top_logprobs && !num(c->top_logprobs, "top_logprobs", 0, VKI_SAMPLE_MAX_TOP, true, &x, e))
            return false;
        if (c->top_logprobs && !lp)
            return srv_err(e, 400, "top_logprobs", "top_logprobs requires logprobs: true"), false;
        j->want_lp = lp;
        j->n_top = c->top_logprobs ? (uint32_t)x : 0;
    }
    j->sampling.logprobs = j->want_lp;
    j->sampling.top_logprobs = j->n_top;
    if (c->best_of && !num(c->best_of, "best_of", 1, SRV_MAX_N, true, &x, e))
        return false;
    if (!beam_opts(c, c->best_of ? (uint32_t)x : j->n, e))
        return false;
    if (c->best_of && (uint32_t)x != j->n && !j->beam_width)
        return srv_err(e, 400, "best_of", "best_of: only best_of = n is supported without use_beam_search (no "
                       "ranking of sampled candidates)"), false;
    char msg[256];
    if (sample_params_check(&j->sampling, c->s->info.n_vocab, msg, sizeof msg) != VKI_OK) {
        char param[64];
        snprintf(param, sizeof param, "%.*s", (int)strcspn(msg, " :"), msg);
        return srv_err(e, 400, param, "%s", msg), false;
    }
    return true;
}

/* vLLM's beam search fields: use_beam_search with best_of beams (default n) of which the n best
 * are the choices; length_penalty; early_stopping true / false / "never". Beam search ranks by
 * the model's log-probabilities: it does not stream or take min_tokens; logprobs are each
 * choice's own tokens' (its beam's lineage). */
static bool beam_opts(req_ctx *c, uint32_t best_of, srv_error *e)
{
    srv_job *j = c->j;
    bool on = false;
    double x;
    if (c->use_beam_search && !boolean(c->use_beam_search, "use_beam_search", &on, e))
        return false;
    if (!on) {
        const cJSON *extra = c->length_penalty ? c->length_penalty : c->early_stopping;
        return !extra || (srv_err(e, 400, extra->string, "%s: only with use_beam_search", extra->string), false);
    }
    if (best_of < j->n)
        return srv_err(e, 400, "best_of", "best_of (%u) must be >= n (%u)", best_of, j->n), false;
    if (j->stream || j->min_tokens)
        return srv_err(e, 400, "use_beam_search", "use_beam_search: not with %s", j->stream ? "stream" : "min_tokens"),
               false;
    if (c->length_penalty && !num(c->length_penalty, "length_penalty", -100, 100, false, &x, e))
        return false;
    const cJSON *es = c->early_stopping;
    bool never = es && cJSON_IsString(es) && !strcmp(es->valuestring, "never");
    if (es && !never && !cJSON_IsBool(es))
        return srv_err(e, 400, "early_stopping", "early_stopping must be true, false or \"never\""), false;
    j->beam_width = best_of;
    if (best_of == 1) /* one beam is greedy decoding */
        j->sampling.temperature = 0;
    j->length_penalty = c->length_penalty ? (float)x : 1.0f; /* vLLM's defaults */
    j->early_stopping = never ? VKI_EARLY_STOP_NEVER : es && cJSON_IsTrue(es) ? VKI_EARLY_STOP_ON
                                                                            : VKI_EARLY_STOP_HEURISTIC;
    return true;
}

uint32_t srv_job_room(const srv *s, const srv_job *j)
{
    uint32_t room = s->info.n_ctx > j->n_prompt ? s->info.n_ctx - j->n_prompt : 0;
    uint64_t pool = (uint64_t)s->info.kv_pages * s->info.page_size; /* a sequence fits the pool too */
    if (!s->info.kv_window && pool > j->n_prompt && pool - j->n_prompt < room) /* windows: any length */
        room = (uint32_t)(pool - j->n_prompt);
    return room;
}

/* max_tokens against the context: the prompt must leave room for one token; the default is 16
 * for completions (the OpenAI default) and the rest of the context (and of the KV pool) for chat
 * (what vLLM does; the default policy admits by the next step's need, so this reserves nothing). */
static bool max_tokens(req_ctx *c, srv_error *e)
{
    srv *s = c->s;
    srv_job *j = c->j;
    uint32_t ctx = s->info.n_ctx;
    const char *which = j->chat ? "messages" : "prompt", *name = c->max_name ? c->max_name : "max_tokens";
    if (j->n_prompt >= ctx)
        return srv_err(e, 400, which, "%s: the prompt is %u tokens; the model's context is %u tokens", which,
                       j->n_prompt, ctx), false;
    double x;
    if (c->max_tokens && !num(c->max_tokens, name, 1, 1 << 30, true, &x, e))
        return false;
    if (!c->max_tokens) {
        uint32_t room = srv_job_room(s, j);
        j->max_tokens = j->chat || room < 16 ? room : 16;
    } else if ((uint64_t)j->n_prompt + (uint64_t)x > ctx) {
        return srv_err(e, 400, name, "%s: the prompt (%u tokens) plus %s (%.0f) exceeds the model's context (%u "
                       "tokens)", name, j->n_prompt, name, x, ctx), false;
    } else {
        j->max_tokens = (uint32_t)x;
    }
    if (j->min_tokens > j->max_tokens)
        return srv_err(e, 400, "min_tokens", "min_tokens (%u) exceeds %s (%u)", j->min_tokens, name, j->max_tokens),
               false;
    return true;
}

/* Per-choice text streams (no token arrays: they grow as tokens come). */
static bool alloc_outputs(srv *s, srv_job *j, srv_error *e)
{
    /* harmony's markers are control tokens: shown, for srv_think to split the answer by them */
    uint32_t flags = (j->chat ? VKI_DETOK_STRIP_LEADING_SPACE : 0) |
                     (j->skip_special && !j->harmony ? 0 : VKI_DETOK_SPECIAL);
    for (uint32_t i = 0; i < j->n; i++) {
        srv_choice *ch = &j->ch[i];
        ch->j = j;
        ch->index = i;
        if (vki_text_stream_create(s->tok, (const char *const *)j->stops, j->n_stops, flags, &ch->ts) != VKI_OK)
            return srv_err(e, 500, NULL, "out of memory"), false;
        if (!srv_struct_choice_init(j, ch, e))
            return false;
        if (j->want_lp && !j->stream && !(ch->lp_all = j->chat ? cJSON_CreateArray() : cJSON_CreateObject()))
            return srv_err(e, 500, NULL, "out of memory"), false;
    }
    return true;
}

cJSON *srv_parse_body(const char *body, size_t n, srv_error *e)
{
    srv_json_err je;
    cJSON *root = srv_json_parse(body, n, &je);
    if (!root && je.oom) {
        srv_err(e, 500, NULL, "out of memory while parsing the request body");
        return NULL;
    }
    if (!root) {
        srv_err(e, 400, je.key[0] ? je.key : NULL, "the request body is not valid JSON: %s (at byte %zu%s%s)", je.msg,
                je.at, je.key[0] ? ", in " : "", je.key);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        srv_err(e, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

static bool job_from_json(srv *s, bool chat, bool render_only, const char *body, size_t n, srv_job **out,
                          srv_error *e)
{
    *out = NULL;
    cJSON *root = srv_parse_body(body, n, e);
    if (!root)
        return false;
    srv_job *j = srv_job_new(s, chat);
    if (j)
        j->want_rendered = render_only;
    strbuf ignored = {0};
    req_ctx c = {.s = s, .j = j};
    bool ok = j != NULL;
    if (!ok)
        srv_err(e, 500, NULL, "out of memory");
    ok = ok && read_fields(&c, root, &ignored, e) && srv_struct_check(j, e) && output_opts(&c, e) &&
         (chat ? render_opts(&c, e) && parse_messages(s, j, c.messages, e) : parse_prompt(s, j, c.prompt, e)) &&
         max_tokens(&c, e) &&
         alloc_outputs(s, j, e);
    if (ok && ignored.len)
        srv_log(s, VKI_LOG_WARN, "%s request: ignored unknown fields: %s", chat ? "chat" : "completions", ignored.p);
    strbuf_free(&ignored);
    cJSON_Delete(root);
    if (!ok) {
        srv_job_release(j);
        return false;
    }
    *out = j;
    return true;
}

bool srv_job_from_json(srv *s, bool chat, const char *body, size_t n, srv_job **out, srv_error *e)
{
    return job_from_json(s, chat, false, body, n, out, e);
}

void srv_route_apply_template(srv_conn *c)
{
    srv_error e;
    srv_job *j = NULL;
    if (!job_from_json(srv_conn_model(c), true, true, c->req.body.p ? c->req.body.p : "", c->req.body.len, &j, &e))
        return srv_reply_error(c, &e);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", j->rendered ? j->rendered : "");
    srv_job_release(j);
    srv_reply_json(c, 200, o);
}
