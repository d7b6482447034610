/* POST /completion (and /completions): llama-server's own completion API, for the clients
 * written against it (editors, front ends, scripts). The request is translated into an OpenAI
 * completion body that server_req.c validates like any other, and the answer is written in
 * llama-server's shapes: {content, tokens, stop, stop_type, stopping_word, timings, ...}, and
 * when streaming one `data: {"content": ..., "stop": false}` event per piece of text and a last
 * event with "stop": true and the totals (no [DONE]).
 *
 * Defaults are llama-server's, not OpenAI's: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * n_predict -1 (until the end of text or of the context; a larger n_predict is cut to the
 * context: "truncated"). Sampling runs vkinfer's chain (penalties, bias, temperature, top-k,
 * top-p, min-p: temperature first, as vLLM), so `samplers` is not read. Fields that would change
 * the output and that vkinfer does not have (typical_p, mirostat, DRY, XTC, dynamic temperature,
 * n_indent, post_sampling_probs, LoRA, images) are refused with a 400 naming them unless they
 * hold their "off" value; the ones that change nothing here (cache_prompt, id_slot, n_keep,
 * timings_per_token, ...) and unknown ones are ignored, as llama-server ignores them.
 *
 * POST /infill: code completion between a prefix and a suffix with the model's fill-in-the-middle
 * tokens, built into a token prompt as llama-server builds it, then the same completion. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/server/server.h"
#include "shaders/vki_shared.h"

typedef struct llama_ctx {
    int64_t n_predict;       /* -1: until the end of text or of the context */
    uint32_t n_probs;        /* completion_probabilities with this many alternatives */
    bool return_tokens;
    uint32_t room;           /* new tokens the prompt left room for */
    const char *prompt;      /* the prompt when it was text (the request's, while it runs) */
    uint32_t sent;           /* streaming: tokens of choice 0 already in an event */
} llama_ctx;

/* ---- the request ------------------------------------------------------------------------------- */

/* A number field, or def when absent; false with *e when not a number. */
static bool num_or(const cJSON *o, const char *k, double def, double *x, srv_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v)) {
        *x = def;
        return true;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return srv_err(e, 400, k, "%s must be a number", k), false;
    *x = v->valuedouble;
    return true;
}

/* llama-server's fields that change the output and that vkinfer does not have: passed on, so
 * that server_req.c refuses them by name unless they hold their "off" value, as on /v1. */
static const char *const PASSED[] = {"typical_p", "mirostat", "dry_multiplier", "xtc_probability", "dynatemp_range",
                                     "n_indent", "t_max_predict_ms", "n_cmpl", "post_sampling_probs", "lora",
                                     "image_data", "multimodal_data", "response_fields"};

/* llama's logit_bias: [[id, bias | false], ...] or {"id": bias}; false bans the token (-100,
 * OpenAI's strongest bias). Token strings are refused (ids only). */
static bool logit_bias(const cJSON *v, cJSON *out, srv_error *e)
{
    if (!v || cJSON_IsNull(v))
        return true;
    cJSON *b = cJSON_CreateObject();
    if (!b)
        return srv_err(e, 500, NULL, "out of memory"), false;
    cJSON_AddItemToObject(out, "logit_bias", b);
    if (cJSON_IsObject(v)) {
        for (const cJSON *x = v->child; x; x = x->next) {
            if (!cJSON_IsNumber(x) && !cJSON_IsFalse(x))
                return srv_err(e, 400, "logit_bias", "logit_bias[\"%.32s\"] must be a number or false", x->string),
                       false;
            cJSON_AddNumberToObject(b, x->string, cJSON_IsFalse(x) ? -100 : x->valuedouble);
        }
        return true;
    }
    if (!cJSON_IsArray(v))
        return srv_err(e, 400, "logit_bias", "logit_bias must be [[token id, bias or false], ...] or an object"),
               false;
    for (const cJSON *p = v->child; p; p = p->next) {
        const cJSON *id = cJSON_GetArrayItem(p, 0), *bias = cJSON_GetArrayItem(p, 1);
        if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) != 2 || !cJSON_IsNumber(id) ||
            !(cJSON_IsNumber(bias) || cJSON_IsFalse(bias)))
            return srv_err(e, 400, "logit_bias", "logit_bias: each entry is [token id, bias or false] (token "
                           "strings are not supported)"), false;
        char key[24];
        snprintf(key, sizeof key, "%.0f", id->valuedouble);
        if (id->valuedouble < 0 || id->valuedouble != floor(id->valuedouble))
            return srv_err(e, 400, "logit_bias", "logit_bias: %s is not a token id", key), false;
        cJSON_DeleteItemFromObjectCaseSensitive(b, key); /* the last entry for a token wins */
        cJSON_AddNumberToObject(b, key, cJSON_IsFalse(bias) ? -100 : bias->valuedouble);
    }
    return true;
}

/* Copies in[k] to out[k2] when present. */
static void copy_as(const cJSON *in, const char *k, cJSON *out, const char *k2)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, k);
    if (v && !cJSON_IsNull(v))
        cJSON_AddItemToObject(out, k2, cJSON_Duplicate(v, true));
}

/* The OpenAI completion body for a llama /completion request; NULL with *e. */
static cJSON *translate(const cJSON *in, llama_ctx *x, srv_error *e)
{
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(in, "prompt");
    if (!prompt)
        return srv_err(e, 400, "prompt", "prompt is required"), NULL;
    bool text = cJSON_IsString(prompt), ids = cJSON_IsArray(prompt);
    for (const cJSON *t = ids ? prompt->child : NULL; t; t = t->next)
        ids &= cJSON_IsNumber(t) != 0;
    if (!text && !ids)
        return srv_err(e, 400, "prompt", "prompt must be a string or an array of token ids (one prompt)"), NULL;
    double n_predict, temp, top_k, top_p, min_p, rep, last_n, seed, n_probs;
    if (!num_or(in, "n_predict", -1, &n_predict, e) || !num_or(in, "temperature", 0.8, &temp, e) ||
        !num_or(in, "top_k", 40, &top_k, e) || !num_or(in, "top_p", 0.95, &top_p, e) ||
        !num_or(in, "min_p", 0.05, &min_p, e) || !num_or(in, "repeat_penalty", 1.0, &rep, e) ||
        !num_or(in, "repeat_last_n", 64, &last_n, e) || !num_or(in, "seed", -1, &seed, e) ||
        !num_or(in, "n_probs", 0, &n_probs, e))
        return NULL;
    if (n_predict != floor(n_predict) || n_predict < -1 || n_predict > (1 << 30))
        return srv_err(e, 400, "n_predict", "n_predict must be -1 (no limit) or a positive integer"), NULL;
    if (n_predict == 0)
        return srv_err(e, 400, "n_predict", "n_predict: 0 (evaluating the prompt only) is not supported"), NULL;
    if (n_probs < 0 || n_probs > VKI_SAMPLE_MAX_TOP || n_probs != floor(n_probs))
        return srv_err(e, 400, "n_probs", "n_probs must be an integer in [0, %d]", VKI_SAMPLE_MAX_TOP), NULL;
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(in, "stream");
    if (stream && !cJSON_IsBool(stream) && !cJSON_IsNull(stream))
        return srv_err(e, 400, "stream", "stream must be a boolean"), NULL;
    x->n_predict = (int64_t)n_predict;
    x->n_probs = (uint32_t)n_probs;
    x->return_tokens = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(in, "return_tokens"));
    x->prompt = text ? prompt->valuestring : NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return srv_err(e, 500, NULL, "out of memory"), NULL;
    cJSON_AddItemToObject(o, "prompt", cJSON_Duplicate(prompt, true));
    cJSON_AddNumberToObject(o, "temperature", temp < 0 ? 0 : temp); /* llama: below 0 is greedy */
    cJSON_AddNumberToObject(o, "top_k", top_k <= 0 ? -1 : top_k);  /* llama: <= 0 is off */
    cJSON_AddNumberToObject(o, "top_p", top_p);
    cJSON_AddNumberToObject(o, "min_p", min_p);
    cJSON_AddNumberToObject(o, "repetition_penalty", rep);
    cJSON_AddNumberToObject(o, "repeat_last_n", last_n);
    if (seed >= 0 || seed < -1) /* -1: a random seed */
        cJSON_AddNumberToObject(o, "seed", seed);
    if (n_probs > 0)
        cJSON_AddNumberToObject(o, "logprobs", n_probs);
    cJSON_AddBoolToObject(o, "stream", cJSON_IsTrue(stream));
    copy_as(in, "presence_penalty", o, "presence_penalty");
    copy_as(in, "frequency_penalty", o, "frequency_penalty");
    copy_as(in, "stop", o, "stop");
    copy_as(in, "ignore_eos", o, "ignore_eos");
    copy_as(in, "grammar", o, "grammar");
    copy_as(in, "json_schema", o, "json_schema");
    copy_as(in, "model", o, "model");
    for (size_t i = 0; i < sizeof PASSED / sizeof *PASSED; i++)
        copy_as(in, PASSED[i], o, PASSED[i]);
    if (!logit_bias(cJSON_GetObjectItemCaseSensitive(in, "logit_bias"), o, e)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o; /* no max_tokens: n_predict is applied to the job (prepare), against its prompt */
}

/* n_predict against the room the prompt leaves (the job's max_tokens is the OpenAI default
 * until here). */
static void prepare(srv_job *j)
{
    llama_ctx *x = j->fmt_ctx;
    x->room = srv_job_room(j->s, j);
    j->max_tokens = x->n_predict < 0 || x->n_predict > x->room ? x->room : (uint32_t)x->n_predict;
}

/* ---- the answer --------------------------------------------------------------------------------- */

static const char *stop_type(const srv_choice *ch)
{
    if (ch->stop_hit)
        return "word";
    switch (ch->finish) {
    case VKI_FINISH_EOS: return "eos";
    case VKI_FINISH_STOP: return "word";
    case VKI_FINISH_LENGTH: return "limit";
    default: return "none";
    }
}

/* Token i of ch as llama's probability entry: id, token, logprob, bytes and its alternatives. */
static cJSON *prob_entry(const srv_job *j, const srv_choice *ch, uint32_t i)
{
    char text[1040], raw[256];
    size_t n_raw;
    cJSON *o = cJSON_CreateObject();
    srv_token_text(j->s->tok, ch->h.tok[i], text, sizeof text, raw, &n_raw);
    cJSON_AddNumberToObject(o, "id", ch->h.tok[i]);
    cJSON_AddStringToObject(o, "token", text);
    cJSON_AddNumberToObject(o, "logprob", isfinite(ch->h.lp[i]) ? ch->h.lp[i] : -9999.0);
    cJSON_AddItemToObject(o, "bytes", srv_bytes_json(raw, n_raw));
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (uint32_t t = 0; t < j->n_top; t++) {
        int32_t id = ch->h.top_id[(size_t)i * j->n_top + t];
        float lp = ch->h.top_lp[(size_t)i * j->n_top + t];
        if (id < 0)
            continue;
        cJSON *a = cJSON_CreateObject();
        srv_token_text(j->s->tok, id, text, sizeof text, raw, &n_raw);
        cJSON_AddNumberToObject(a, "id", id);
        cJSON_AddStringToObject(a, "token", text);
        cJSON_AddNumberToObject(a, "logprob", isfinite(lp) ? lp : -9999.0);
        cJSON_AddItemToObject(a, "bytes", srv_bytes_json(raw, n_raw));
        cJSON_AddItemToArray(top, a);
    }
    return o;
}

/* Tokens [from, to) of ch: their ids into ids (when not NULL), their probabilities into probs. */
static void add_tokens(const srv_job *j, const srv_choice *ch, uint32_t from, uint32_t to, cJSON *ids, cJSON *probs)
{
    for (uint32_t i = from; i < to; i++) {
        if (ids)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(ch->h.tok[i]));
        if (probs)
            cJSON_AddItemToArray(probs, prob_entry(j, ch, i));
    }
}

/* The prompt as text (a token-id prompt is detokenised). */
static void add_prompt(const srv_job *j, cJSON *o)
{
    const llama_ctx *x = j->fmt_ctx;
    if (x->prompt) {
        cJSON_AddStringToObject(o, "prompt", x->prompt);
        return;
    }
    size_t cap = (size_t)j->n_prompt * 16 + 16, n = 0;
    char *p = malloc(cap);
    if (p && vki_detokenize(j->s->tok, j->prompt, j->n_prompt, 0, p, cap - 1, &n) == VKI_OK) {
        p[n] = 0;
        cJSON_AddStringToObject(o, "prompt", p);
    }
    free(p);
}

/* Everything but content, tokens and probabilities: the final fields of both shapes. */
static void add_totals(srv_job *j, cJSON *o)
{
    const llama_ctx *x = j->fmt_ctx;
    const srv_choice *ch = &j->ch[0];
    uint32_t n_gen = srv_choice_tokens(ch);
    pthread_mutex_lock(&j->mu);
    double t0 = j->t_arrive, t1 = j->t_first > 0 ? j->t_first : t0, t2 = ch->t_last > t1 ? ch->t_last : t1;
    uint32_t cached = ch->n_cached;
    pthread_mutex_unlock(&j->mu);
    cJSON_AddNumberToObject(o, "id_slot", 0);
    cJSON_AddBoolToObject(o, "stop", true);
    cJSON_AddStringToObject(o, "model", j->s->model_id);
    cJSON_AddNumberToObject(o, "tokens_predicted", n_gen);
    cJSON_AddNumberToObject(o, "tokens_evaluated", j->n_prompt);
    cJSON_AddNumberToObject(o, "tokens_cached", cached);
    /* ended by the context rather than by n_predict */
    bool limit = !strcmp(stop_type(ch), "limit");
    cJSON_AddBoolToObject(o, "truncated", limit && (x->n_predict < 0 || x->n_predict > x->room));
    cJSON_AddStringToObject(o, "stop_type", stop_type(ch));
    int32_t w = ch->stop_hit && ch->ts ? vki_text_stream_stop_index(ch->ts) : -1;
    cJSON_AddStringToObject(o, "stopping_word", w >= 0 && (uint32_t)w < j->n_stops ? j->stops[w] : "");
    add_prompt(j, o);
    cJSON *g = cJSON_AddObjectToObject(o, "generation_settings");
    cJSON_AddNumberToObject(g, "n_ctx", j->s->info.n_ctx);
    cJSON_AddNumberToObject(g, "n_predict", (double)x->n_predict);
    cJSON_AddStringToObject(g, "model", j->s->model_id);
    cJSON_AddNumberToObject(g, "temperature", j->sampling.temperature);
    cJSON_AddNumberToObject(g, "top_k", j->sampling.top_k);
    cJSON_AddNumberToObject(g, "top_p", j->sampling.top_p);
    cJSON_AddNumberToObject(g, "min_p", j->sampling.min_p);
    cJSON_AddNumberToObject(g, "repeat_penalty", j->sampling.repetition_penalty);
    cJSON_AddNumberToObject(g, "repeat_last_n", j->sampling.penalty_window);
    cJSON_AddNumberToObject(g, "presence_penalty", j->sampling.presence_penalty);
    cJSON_AddNumberToObject(g, "frequency_penalty", j->sampling.frequency_penalty);
    cJSON_AddBoolToObject(g, "ignore_eos", j->ignore_eos);
    cJSON_AddBoolToObject(g, "stream", j->stream);
    cJSON_AddNumberToObject(g, "n_probs", x->n_probs);
    cJSON *stops = cJSON_AddArrayToObject(g, "stop");
    for (uint32_t i = 0; i < j->n_stops; i++)
        cJSON_AddItemToArray(stops, cJSON_CreateString(j->stops[i]));
    double prompt_ms = (t1 - t0) * 1e3, gen_ms = (t2 - t1) * 1e3;
    uint32_t prompt_n = j->n_prompt - (cached < j->n_prompt ? cached : j->n_prompt);
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    cJSON_AddNumberToObject(t, "cache_n", cached);
    cJSON_AddNumberToObject(t, "prompt_n", prompt_n);
    cJSON_AddNumberToObject(t, "prompt_ms", prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_token_ms", prompt_n ? prompt_ms / prompt_n : 0);
    cJSON_AddNumberToObject(t, "prompt_per_second", prompt_ms > 0 ? prompt_n * 1e3 / prompt_ms : 0);
    /* the first token comes with the prompt: the generation phase makes the other n - 1 */
    cJSON_AddNumberToObject(t, "predicted_n", n_gen);
    cJSON_AddNumberToObject(t, "predicted_ms", gen_ms);
    cJSON_AddNumberToObject(t, "predicted_per_token_ms", n_gen > 1 ? gen_ms / (n_gen - 1) : 0);
    cJSON_AddNumberToObject(t, "predicted_per_second", n_gen > 1 && gen_ms > 0 ? (n_gen - 1) * 1e3 / gen_ms : 0);
}

static char *answer(srv_job *j)
{
    const llama_ctx *x = j->fmt_ctx;
    const srv_choice *ch = &j->ch[0];
    uint32_t n = srv_choice_tokens(ch);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", 0);
    cJSON_AddStringToObject(o, "content", ch->text.p ? ch->text.p : "");
    add_tokens(j, ch, 0, n, x->return_tokens ? cJSON_AddArrayToObject(o, "tokens") : NULL,
               x->n_probs ? cJSON_AddArrayToObject(o, "completion_probabilities") : NULL);
    if (!x->return_tokens)
        cJSON_AddArrayToObject(o, "tokens");
    add_totals(j, o);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* A piece of text with the tokens it came from (always their ids, as llama-server streams them),
 * or, with finish, the last event: no text, "stop": true and the totals. */
static bool chunk(srv_job *j, const srv_choice *ch, strbuf *out, const char *text, const char *finish)
{
    llama_ctx *x = j->fmt_ctx;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", 0);
    cJSON_AddStringToObject(o, "content", finish ? "" : text);
    uint32_t to = ch->stop_hit ? ch->n_counted : ch->n_used;
    add_tokens(j, ch, x->sent, to > x->sent ? to : x->sent, cJSON_AddArrayToObject(o, "tokens"),
               x->n_probs ? cJSON_AddArrayToObject(o, "completion_probabilities") : NULL);
    x->sent = to > x->sent ? to : x->sent;
    if (finish)
        add_totals(j, o);
    else
        cJSON_AddBoolToObject(o, "stop", false);
    return srv_sse_json(out, o);
}

/* A request that failed on the way: one error event (the OpenAI error object). */
static bool end(srv_job *j, strbuf *out, const srv_error *failed)
{
    (void)j;
    if (!failed)
        return true;
    char *s = srv_error_json(failed);
    bool ok = s && strbuf_printf(out, "data: %s\n\n", s);
    free(s);
    return ok;
}

char *srv_llama_body(const char *body, size_t n, srv_error *e)
{
    llama_ctx x = {0};
    cJSON *in = srv_parse_body(body, n, e);
    cJSON *o = in ? translate(in, &x, e) : NULL;
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    if (o && !text)
        srv_err(e, 500, NULL, "out of memory");
    cJSON_Delete(o);
    cJSON_Delete(in);
    return text;
}

static const srv_job_fmt LLAMA_FMT = {.answer = answer, .chunk = chunk, .end = end, .prepare = prepare};

/* Runs the parsed llama-server body `in` (taken) as a completion on c. */
static void serve(srv_conn *c, cJSON *in, srv_error *err)
{
    srv_error e = *err;
    llama_ctx x = {0};
    cJSON *body = in ? translate(in, &x, &e) : NULL;
    char *text = body ? cJSON_PrintUnformatted(body) : NULL;
    if (body && !text)
        srv_err(&e, 500, NULL, "out of memory");
    cJSON_Delete(body);
    if (!text) {
        cJSON_Delete(in);
        return srv_reply_error(c, &e);
    }
    srv_serve_translated(c, text, R_CMPL, &LLAMA_FMT, NULL, &x); /* a completion (metrics, access log) */
    cJSON_free(text);
    cJSON_Delete(in); /* x.prompt pointed into it */
}

void srv_llama_completion(srv_conn *c)
{
    srv_error e;
    serve(c, srv_parse_body(c->req.body.p ? c->req.body.p : "", c->req.body.len, &e), &e);
}

/* ---- POST /infill ---------------------------------------------------------------------------- */

/* Room for need ids (doubling). */
static bool grow(int32_t **ids, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    int32_t *p = realloc(*ids, 2 * need * sizeof *p);
    if (!p)
        return false;
    *ids = p;
    *cap = 2 * need;
    return true;
}

/* text (user data: control-token texts in it stay text) appended to ids as tokens. */
static bool add_text(const vki_tokenizer *tok, const char *text, int32_t **ids, size_t *n, size_t *cap)
{
    size_t len = strlen(text), got = 0;
    if (!grow(ids, cap, *n + len + 8) ||
        vki_tokenize(tok, text, len, false, false, *ids + *n, *cap - *n, &got) != VKI_OK)
        return false;
    *n += got;
    return true;
}

static bool add_id(int32_t id, int32_t **ids, size_t *n, size_t *cap)
{
    if (!grow(ids, cap, *n + 1))
        return false;
    (*ids)[(*n)++] = id;
    return true;
}

static const char *str_or(const cJSON *o, const char *k, srv_error *e, bool *ok)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v || cJSON_IsNull(v))
        return "";
    if (!cJSON_IsString(v)) {
        *ok = false;
        srv_err(e, 400, k, "%s must be a string", k);
        return "";
    }
    return v->valuestring;
}

/* The fill-in-the-middle prompt as llama-server builds it: [BOS] (with input_extra, and the
 * repository tokens: <REP>myproject\n, then <SEP>filename\ntext per chunk, <SEP>filename\n)
 * <PRE>input_prefix<SUF>input_suffix<MID>prompt; replaces in's prompt with those ids. */
static bool infill_prompt(const srv *m, cJSON *in, srv_error *e)
{
    const vki_tokenizer *tok = m->tok;
    int32_t pre = vki_token_fim(tok, VKI_FIM_PRE), suf = vki_token_fim(tok, VKI_FIM_SUF),
            mid = vki_token_fim(tok, VKI_FIM_MID), rep = vki_token_fim(tok, VKI_FIM_REP),
            sep = vki_token_fim(tok, VKI_FIM_SEP);
    if (pre < 0 || suf < 0 || mid < 0)
        return srv_err(e, 400, NULL, "infill: the model has no fill-in-the-middle tokens (prefix, suffix, middle)"),
               false;
    bool ok = true;
    const char *prefix = str_or(in, "input_prefix", e, &ok), *suffix = ok ? str_or(in, "input_suffix", e, &ok) : "",
               *prompt = ok ? str_or(in, "prompt", e, &ok) : "";
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(in, "input_extra");
    if (!ok)
        return false;
    if (extra && !cJSON_IsNull(extra) && !cJSON_IsArray(extra))
        return srv_err(e, 400, "input_extra", "input_extra must be an array of {\"filename\", \"text\"}"), false;
    bool chunks = extra && cJSON_IsArray(extra) && extra->child;
    if (chunks && (rep < 0 || sep < 0))
        return srv_err(e, 400, "input_extra", "input_extra: the model has no repository / file separator tokens"),
               false;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    ok = !vki_tokenizer_adds_bos(tok) || add_id(vki_token_bos(tok), &ids, &n, &cap);
    if (ok && chunks) {
        ok = add_id(rep, &ids, &n, &cap) && add_text(tok, "myproject\n", &ids, &n, &cap);
        for (const cJSON *ch = extra->child; ok && ch; ch = ch->next) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(ch, "filename"),
                        *t = cJSON_GetObjectItemCaseSensitive(ch, "text");
            if (!cJSON_IsString(f) || !cJSON_IsString(t)) {
                free(ids);
                return srv_err(e, 400, "input_extra", "input_extra: each chunk is {\"filename\": string, "
                               "\"text\": string}"), false;
            }
            ok = add_id(sep, &ids, &n, &cap) && add_text(tok, f->valuestring, &ids, &n, &cap) &&
                 add_text(tok, "\n", &ids, &n, &cap) && add_text(tok, t->valuestring, &ids, &n, &cap);
        }
        ok = ok && add_id(sep, &ids, &n, &cap) && add_text(tok, "filename\n", &ids, &n, &cap);
    }
    ok = ok && add_id(pre, &ids, &n, &cap) && add_text(tok, prefix, &ids, &n, &cap) && add_id(suf, &ids, &n, &cap) &&
         add_text(tok, suffix, &ids, &n, &cap) && add_id(mid, &ids, &n, &cap) && add_text(tok, prompt, &ids, &n, &cap);
    cJSON *a = ok ? cJSON_CreateArray() : NULL;
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    free(ids);
    if (!a)
        return srv_err(e, 500, NULL, "out of memory"), false;
    cJSON_DeleteItemFromObjectCaseSensitive(in, "prompt");
    cJSON_AddItemToObject(in, "prompt", a);
    return true;
}

void srv_llama_infill(srv_conn *c)
{
    srv_error e;
    cJSON *in = srv_parse_body(c->req.body.p ? c->req.body.p : "", c->req.body.len, &e);
    if (in && !infill_prompt(srv_conn_model(c), in, &e)) {
        cJSON_Delete(in);
        in = NULL;
    }
    serve(c, in, &e);
}
