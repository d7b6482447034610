/* Chat templates: recognition, rendering and tokenisation (see chat.h).
 *
 * Each renderer reproduces one upstream template as transformers renders it (Jinja with
 * trim_blocks and lstrip_blocks); "trim"/"strip()" remove ASCII whitespace at both ends (Python
 * also strips Unicode spaces; a message that begins or ends in one is rendered with it kept).
 * Where we go beyond the upstream template it is said at the family. */
#include "host/chat/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/gguf.h"

/* DeepSeek's markers: full-width vertical bars (U+FF5C) and a lower one-eighth block (U+2581) */
#define DS_BAR "\xef\xbd\x9c"
#define DS_USER "<" DS_BAR "User" DS_BAR ">"
#define DS_ASSISTANT "<" DS_BAR "Assistant" DS_BAR ">"
#define DS_EOS "<" DS_BAR "end\xe2\x96\x81of\xe2\x96\x81sentence" DS_BAR ">"

static const char *const family_names[CHAT_FAMILY_COUNT] = {
    [CHAT_PLAIN] = "plain",   [CHAT_CHATML] = "chatml", [CHAT_LLAMA3] = "llama3", [CHAT_LLAMA2] = "llama2",
    [CHAT_MISTRAL] = "mistral", [CHAT_ZEPHYR] = "zephyr", [CHAT_GEMMA] = "gemma",  [CHAT_PHI3] = "phi3",
    [CHAT_DEEPSEEK] = "deepseek", [CHAT_HARMONY] = "harmony", [CHAT_TULU] = "tulu",     [CHAT_GRANITE] = "granite",
    [CHAT_SMOLLM3] = "smollm3", [CHAT_EXAONE] = "exaone", [CHAT_GLM4] = "glm4", [CHAT_COMMAND_R] = "command-r",
};
_Static_assert(sizeof family_names / sizeof family_names[0] == CHAT_FAMILY_COUNT, "a name per family");

static const char *const role_names[] = {[CHAT_SYSTEM] = "system", [CHAT_USER] = "user",
                                         [CHAT_ASSISTANT] = "assistant"};

static const char *const effort_names[] = {[CHAT_EFFORT_MEDIUM] = "medium", [CHAT_EFFORT_LOW] = "low",
                                           [CHAT_EFFORT_HIGH] = "high"};

const char *chat_effort_name(chat_effort e) { return (unsigned)e <= CHAT_EFFORT_HIGH ? effort_names[e] : "?"; }

bool chat_effort_parse(const char *name, chat_effort *out)
{
    for (int e = 0; name && e <= CHAT_EFFORT_HIGH; e++)
        if (!strcmp(name, effort_names[e])) {
            *out = (chat_effort)e;
            return true;
        }
    return false;
}

const char *chat_family_name(chat_family f)
{
    return (unsigned)f < CHAT_FAMILY_COUNT ? family_names[f] : "?";
}

bool chat_family_parse(const char *name, chat_family *out)
{
    for (int f = 0; name && f < CHAT_FAMILY_COUNT; f++)
        if (!strcmp(name, family_names[f])) {
            *out = (chat_family)f;
            return true;
        }
    return false;
}

/* ---- recognition -------------------------------------------------------------------------- */

/* Zephyr's and Tülu's templates share their tags; Zephyr's user turn ends in eos_token, Tülu's in
 * a newline (eos only after answers). Tülu: the expression that writes '<|user|>' closes ("}}")
 * without naming eos_token. */
static bool user_turn_without_eos(const char *t)
{
    const char *u = strstr(t, "<|user|>"), *end = u ? strstr(u, "}}") : NULL;
    if (!end)
        return false;
    for (const char *p = u; p + 9 <= end; p++)
        if (!memcmp(p, "eos_token", 9))
            return false;
    return true;
}

chat_family chat_detect(const char *t, bool *known)
{
    chat_family f = CHAT_PLAIN;
    if (!t || !*t)
        f = CHAT_PLAIN;
    else if (strstr(t, DS_USER))
        f = CHAT_DEEPSEEK;
    else if (strstr(t, "<|start|>") && strstr(t, "<|channel|>") && strstr(t, "<|message|>"))
        f = CHAT_HARMONY;
    else if (strstr(t, "<|im_start|>"))
        f = strstr(t, "## Metadata") && strstr(t, "Reasoning Mode: ") ? CHAT_SMOLLM3 : CHAT_CHATML;
    else if (strstr(t, "<|start_of_role|>"))
        f = CHAT_GRANITE;
    else if (strstr(t, "[|system|]") && strstr(t, "[|assistant|]") && strstr(t, "[|endofturn|]"))
        f = CHAT_EXAONE;
    else if (strstr(t, "[gMASK]<sop>") && !strstr(t, "visible_text(")) /* llama.cpp's rule, less GLM-4.5+'s */
        f = CHAT_GLM4;
    else if (strstr(t, "<|START_OF_TURN_TOKEN|>") && strstr(t, "<|USER_TOKEN|>")) /* llama.cpp's rule */
        f = CHAT_COMMAND_R;
    else if (strstr(t, "<|start_header_id|>"))
        f = CHAT_LLAMA3;
    else if (strstr(t, "<start_of_turn>"))
        f = CHAT_GEMMA;
    else if (strstr(t, "<|end|>") && (strstr(t, "<|assistant|>") || strstr(t, "<|user|>")))
        f = CHAT_PHI3;
    else if (strstr(t, "<|user|>") && strstr(t, "<|assistant|>") && strstr(t, "eos_token"))
        f = user_turn_without_eos(t) ? CHAT_TULU : CHAT_ZEPHYR;
    else if (strstr(t, "[INST]"))
        f = strstr(t, "<<SYS>>") ? CHAT_LLAMA2 : CHAT_MISTRAL;
    if (known)
        *known = f != CHAT_PLAIN;
    return f;
}

/* The text of a Jinja string literal's body [q, end) with its escapes decoded (\n, \t, and a
 * backslash before any other character: that character) into *out, NUL-terminated. */
static vki_status decode_literal(const char *q, const char *end, char **out)
{
    char *s = malloc((size_t)(end - q) + 1);
    if (!s)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    size_t n = 0;
    for (const char *c = q; c < end; c++) {
        if (*c == '\\' && c + 1 < end) {
            c++;
            s[n++] = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c;
        } else {
            s[n++] = *c;
        }
    }
    s[n] = 0;
    *out = s;
    return VKI_OK;
}

/* ChatML templates that write a system prompt when the conversation has none (Qwen) carry it as a
 * string literal: '<|im_start|>system\n...<|im_end|>'. Finds the first such literal (a candidate
 * that contains a quote or an expression is the template's code, not a literal) and decodes its
 * escapes into *out (NULL when there is none). */
static vki_status chatml_default_system(const char *t, char **out)
{
    *out = NULL;
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr(t, head); p; p = strstr(p + 1, head)) {
        const char *q = p + sizeof head - 1;
        if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else if (q[0] == '\n')
            q += 1;
        else
            continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q || strcspn(q, "'\"{}+") < (size_t)(end - q))
            continue;
        return decode_literal(q, end, out);
    }
    return VKI_OK;
}

/* Mistral v7's `set default_system_message = "..."`: the literal, its escapes decoded, into *out
 * (NULL when absent, or when the value goes on past the literal: Small 3.1 appends today's date
 * with strftime_now, which a fixed string cannot reproduce). */
static vki_status mistral_default_system(const char *t, char **out)
{
    *out = NULL;
    const char *p = strstr(t, "default_system_message");
    if (!p || !(p = strchr(p, '=')))
        return VKI_OK;
    p += strspn(p + 1, " ") + 1;
    char q = *p;
    if (q != '"' && q != '\'')
        return VKI_OK;
    const char *end = p + 1;
    while (*end && *end != q)
        end += end[0] == '\\' && end[1] ? 2 : 1;
    if (!*end || end[1 + strspn(end + 1, " ")] == '+')
        return VKI_OK;
    return decode_literal(p + 1, end, out);
}

/* The end of the Jinja string literal that opens at *q (its closing quote), or NULL. */
static const char *literal_end(const char *q)
{
    const char *e = q + 1;
    while (*e && *e != *q)
        e += e[0] == '\\' && e[1] ? 2 : 1;
    return *e ? e : NULL;
}

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
        p++;
    return p;
}

/* The literal at p (after spaces), decoded into *out; *after: past its closing quote. false (and
 * *out NULL) when p is not at a literal. */
static bool literal_at(const char *p, const char **after, char **out, vki_status *st)
{
    *out = NULL;
    p = skip_ws(p);
    const char *e = *p == '"' || *p == '\'' ? literal_end(p) : NULL;
    if (!e)
        return false;
    *after = e + 1;
    *st = decode_literal(p + 1, e, out);
    return *st == VKI_OK;
}

/* s + t in s's memory, grown (s may be NULL: out of memory before); NULL, s freed, when out of
 * memory. */
static char *concat(char *s, const char *t)
{
    if (!s)
        return NULL;
    size_t a = strlen(s), b = strlen(t);
    char *r = realloc(s, a + b + 1);
    if (r)
        memcpy(r + a, t, b + 1);
    else
        free(s);
    return r;
}

/* ibm-granite/granite-3.3-8b-instruct's default system prompt, for the family by name (its
 * template's no-tools, no-documents branches). */
#define GRANITE_HEAD "Knowledge Cutoff Date: April 2024.\nToday's Date: "
#define GRANITE_TAIL ".\nYou are Granite, developed by IBM. You are a helpful AI assistant."
#define GRANITE_THINK                                                                                           \
    ".\nYou are Granite, developed by IBM. You are a helpful AI assistant.\nRespond to every user query in a "  \
    "comprehensive and detailed way. You can write down your thoughts and reasoning process before responding. " \
    "In the thought process, engage in a comprehensive cycle of analysis, summarization, exploration, "          \
    "reassessment, reflection, backtracing, and iteration to develop well-considered thinking process. In the "  \
    "response section, based on various attempts, explorations, and reflections from the thoughts section, "    \
    "systematically present the final solution that you deem correct. The response should summarize the "       \
    "thought process. Write your thoughts between <think></think> and write your response between "              \
    "<response></response> for each user query."

/* Granite 3.1+ when the conversation has no system message:
 *   set system_message = "HEAD" + strftime_now('FMT') + "MID"
 *   ... elif thinking: set system_message = system_message + "THINK"
 *   ... else: set system_message = system_message + "PLAIN" (the last addition before the first endif)
 * into t: default_system = HEAD, system_tail = {MID + PLAIN, MID + THINK}, date_fmt = FMT. Nothing
 * for a template without the literal (3.0); the 3.3 text where the expressions do not parse. */
static vki_status granite_default_system(const char *tmpl, chat_template *t)
{
    const char *k = tmpl ? strstr(tmpl, "Knowledge Cutoff Date") : NULL, *q = k, *p = NULL;
    if (tmpl && !k)
        return VKI_OK;
    while (q && q > tmpl && *q != '"' && *q != '\'')
        q--;
    char *head = NULL, *fmt = NULL, *mid = NULL, *plain = NULL, *think = NULL;
    vki_status st = VKI_OK;
    bool ok = q && literal_at(q, &p, &head, &st);
    if (ok && *(p = skip_ws(p)) == '+' && !strncmp(p = skip_ws(p + 1), "strftime_now(", 13)) {
        ok = literal_at(p + 13, &p, &fmt, &st) && *(p = skip_ws(p)) == ')' && *(p = skip_ws(p + 1)) == '+' &&
             literal_at(p + 1, &p, &mid, &st) && strlen(fmt) < sizeof t->date_fmt;
    }
    const char *endif = ok ? strstr(p, "endif") : NULL, *add = NULL, *th = ok ? strstr(p, "elif thinking") : NULL;
    static const char plus[] = "system_message + ";
    for (const char *a = endif ? strstr(p, plus) : NULL; a && a < endif; a = strstr(a + 1, plus))
        add = a;
    ok = ok && add && literal_at(add + sizeof plus - 1, &p, &plain, &st);
    if (ok && th && th < endif && (th = strstr(th, plus)) && th < endif)
        ok = literal_at(th + sizeof plus - 1, &p, &think, &st);
    bool want_think = think || !ok;
    if (st == VKI_OK && ok) {
        t->default_system = head;
        t->system_tail[0] = concat(strdup(mid ? mid : ""), plain);
        t->system_tail[1] = think ? concat(strdup(mid ? mid : ""), think) : NULL;
        snprintf(t->date_fmt, sizeof t->date_fmt, "%s", fmt ? fmt : "");
        head = NULL;
    } else if (st == VKI_OK) { /* no template, or one whose expressions we do not follow: 3.3's */
        t->default_system = strdup(GRANITE_HEAD);
        t->system_tail[0] = strdup(GRANITE_TAIL);
        t->system_tail[1] = strdup(GRANITE_THINK);
        snprintf(t->date_fmt, sizeof t->date_fmt, "%%B %%d, %%Y");
    }
    free(head), free(fmt), free(mid), free(plain), free(think);
    if (st == VKI_OK && (!t->default_system || !t->system_tail[0] || (want_think && !t->system_tail[1])))
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    return st;
}

/* GLM's generation prompt: the literal text of "{% if add_generation_prompt %}...{% endif %}"
 * ("<|assistant|>" and what follows it: GLM-4-0414's "\n", Z1's "\n<think>"); GLM-4-0414's
 * "<|assistant|>\n" without a template or where that text is not such a literal. */
static void glm4_generation_prompt(const char *tmpl, char *out, size_t n)
{
    static const char head[] = "{% if add_generation_prompt %}";
    const char *a = tmpl ? strstr(tmpl, head) : NULL, *b = a ? strstr(a + sizeof head - 1, "{%") : NULL;
    if (a)
        a += sizeof head - 1;
    size_t len = b ? (size_t)(b - a) : 0;
    if (!b || len >= n || strncmp(a, "<|assistant|>", 13) || memchr(a, '{', len) || memchr(a, '}', len))
        a = "<|assistant|>\n", len = 14;
    memcpy(out, a, len);
    out[len] = 0;
}

vki_status chat_template_init(chat_template *t, chat_family f, const char *tmpl, const char *bos, const char *eos)
{
    memset(t, 0, sizeof *t);
    if ((unsigned)f >= CHAT_FAMILY_COUNT)
        return VKI_ERR_INVALID_ARG;
    t->family = f;
    snprintf(t->bos, sizeof t->bos, "%s", bos ? bos : "");
    snprintf(t->eos, sizeof t->eos, "%s", eos ? eos : "");
    /* Without the template text, assume the canonical template of the family. */
    bool canon_bos = f == CHAT_LLAMA3 || f == CHAT_LLAMA2 || f == CHAT_MISTRAL || f == CHAT_GEMMA || f == CHAT_TULU ||
                     f == CHAT_COMMAND_R;
    t->emit_bos = f == CHAT_LLAMA2 || (tmpl ? strstr(tmpl, "bos_token") != NULL : canon_bos);
    t->mistral_spaced = f == CHAT_MISTRAL && tmpl && (strstr(tmpl, "' [INST] '") || strstr(tmpl, "\" [INST] \""));
    t->mistral_v7 = f == CHAT_MISTRAL && tmpl && strstr(tmpl, "[SYSTEM_PROMPT]");
    t->mistral_tekken =
        f == CHAT_MISTRAL && tmpl && !t->mistral_v7 && (strstr(tmpl, "[INST]'") || strstr(tmpl, "[INST]\""));
    if (t->mistral_v7)
        return mistral_default_system(tmpl, &t->default_system);
    t->strip_think = f == CHAT_CHATML && tmpl && strstr(tmpl, "</think>");
    t->phi3_v1 = f == CHAT_PHI3 && tmpl && !strstr(tmpl, "add_generation_prompt");
    t->phi4_mini = f == CHAT_PHI3 && tmpl && strstr(tmpl, "'|>' + message['content']");
    t->chatml_sep = f == CHAT_CHATML && tmpl && strstr(tmpl, "<|im_sep|>");
    t->deepseek_think = f == CHAT_DEEPSEEK && tmpl && strstr(tmpl, DS_ASSISTANT "<think>");
    t->dated = (f == CHAT_HARMONY || f == CHAT_SMOLLM3) && (!tmpl || strstr(tmpl, "strftime_now"));
    t->smollm3_closed = f == CHAT_SMOLLM3 && tmpl && !strstr(tmpl, "xml_tools");
    t->smollm3_override = f == CHAT_SMOLLM3 && (!tmpl || strstr(tmpl, "/system_override"));
    t->exaone4 = f == CHAT_EXAONE && (!tmpl || strstr(tmpl, "[|tool|]")); /* llama.cpp's rule */
    t->glm4_system_first = f == CHAT_GLM4 && (!tmpl || strstr(tmpl, "messages if message.role != 'system'"));
    t->glm4_visible = f == CHAT_GLM4 && tmpl && strstr(tmpl, "split('</think>')");
    if (f == CHAT_GLM4)
        glm4_generation_prompt(tmpl, t->glm4_gen, sizeof t->glm4_gen);
    t->command_r7b = f == CHAT_COMMAND_R && tmpl && strstr(tmpl, "<|START_RESPONSE|>");
    vki_status st = VKI_OK;
    if (f == CHAT_CHATML && tmpl)
        st = chatml_default_system(tmpl, &t->default_system);
    else if (f == CHAT_GRANITE)
        st = granite_default_system(tmpl, t);
    if (st != VKI_OK)
        chat_template_free(t);
    return st;
}

void chat_template_free(chat_template *t)
{
    free(t->default_system);
    free(t->system_tail[0]);
    free(t->system_tail[1]);
    t->default_system = t->system_tail[0] = t->system_tail[1] = NULL;
}

bool chat_thinks(const chat_template *t)
{
    return t->family == CHAT_DEEPSEEK || t->family == CHAT_SMOLLM3 || (t->family == CHAT_CHATML && t->strip_think) ||
           (t->family == CHAT_EXAONE && t->exaone4) ||
           (t->family == CHAT_GLM4 && (t->glm4_visible || strstr(t->glm4_gen, "<think>")));
}

/* ---- the prompt buffer -------------------------------------------------------------------- */

static vki_status put(chat_prompt *p, const char *s, size_t n, bool tmpl)
{
    if (!n)
        return VKI_OK;
    /* A template piece right after another extends its span; otherwise it opens a new one, whose
     * slot is reserved before the text grows so that a failure leaves p as it was. */
    bool extend = p->n_tmpl && p->tmpl[p->n_tmpl - 1].off + p->tmpl[p->n_tmpl - 1].len == p->len;
    if (tmpl && !extend && p->n_tmpl == p->cap_tmpl) {
        size_t cap = p->cap_tmpl ? p->cap_tmpl * 2 : 16;
        chat_span *s2 = realloc(p->tmpl, cap * sizeof *s2);
        if (!s2)
            return VKI_ERR_OUT_OF_HOST_MEMORY;
        p->tmpl = s2;
        p->cap_tmpl = cap;
    }
    size_t off = p->len;
    if (!strbuf_put(&p->buf, s, n))
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    if (tmpl && extend)
        p->tmpl[p->n_tmpl - 1].len += n;
    else if (tmpl)
        p->tmpl[p->n_tmpl++] = (chat_span){off, n};
    return VKI_OK;
}

/* What the renderers write through: the prompt and the first error. Once st is set every call
 * below does nothing, so a renderer is a straight sequence of lit/txt and chat_render reads st
 * once at the end. */
typedef struct chat_out {
    chat_prompt *p;
    vki_status st;
} chat_out;

static void out_put(chat_out *o, const char *s, size_t n, bool tmpl)
{
    if (o->st == VKI_OK)
        o->st = put(o->p, s, n, tmpl);
}

/* Template text (a C string). */
static void lit(chat_out *o, const char *s) { out_put(o, s, strlen(s), true); }

/* Message content. */
static void txt(chat_out *o, const chat_msg *m) { out_put(o, m->content, m->len, false); }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Appends the whitespace-trimmed text of `piece` (template and content parts keep their kind). */
static vki_status put_trimmed(chat_prompt *p, const chat_prompt *piece)
{
    size_t a = 0, b = piece->len;
    while (a < b && is_ws(piece->text[a]))
        a++;
    while (b > a && is_ws(piece->text[b - 1]))
        b--;
    vki_status st = VKI_OK;
    size_t pos = a, k = 0;
    while (st == VKI_OK && pos < b) {
        while (k < piece->n_tmpl && piece->tmpl[k].off + piece->tmpl[k].len <= pos)
            k++;
        bool in = k < piece->n_tmpl && piece->tmpl[k].off <= pos;
        size_t next = in ? piece->tmpl[k].off + piece->tmpl[k].len : k < piece->n_tmpl ? piece->tmpl[k].off : b;
        if (next > b)
            next = b;
        st = put(p, piece->text + pos, next - pos, in);
        pos = next;
    }
    return st;
}

/* Appends a piece rendered on the side, trimmed; or takes on the error that building it hit. */
static void trimmed(chat_out *o, const chat_out *piece)
{
    if (o->st == VKI_OK)
        o->st = piece->st;
    if (o->st == VKI_OK)
        o->st = put_trimmed(o->p, piece->p);
}

static void content_trimmed(chat_out *o, const chat_msg *m)
{
    if (o->st != VKI_OK)
        return;
    chat_prompt one = {0};
    chat_out piece = {&one, VKI_OK};
    txt(&piece, m);
    trimmed(o, &piece);
    chat_prompt_free(&one);
}

vki_status chat_prompt_append(chat_prompt *p, const char *s, size_t n, bool tmpl) { return put(p, s, n, tmpl); }

void chat_prompt_free(chat_prompt *p)
{
    strbuf_free(&p->buf);
    free(p->tmpl);
    memset(p, 0, sizeof *p);
}

static void set_err(char *err, size_t n, const char *msg, size_t i, const char *family)
{
    if (err && n)
        snprintf(err, n, "messages[%zu].role: %s (%s chat template)", i, msg, family);
}

/* The Llama 2, Mistral and Gemma templates raise unless the messages after an optional system
 * message go user, assistant, user, ... */
static bool alternates(chat_out *o, const chat_msg *m, size_t n, size_t first, const chat_template *t, char *err,
                       size_t n_err)
{
    for (size_t i = first; i < n; i++)
        if ((m[i].role == CHAT_USER) != ((i - first) % 2 == 0)) {
            set_err(err, n_err, "conversation roles must alternate user/assistant/user/assistant/... after an "
                    "optional first system message", i, family_names[t->family]);
            o->st = VKI_ERR_INVALID_ARG;
            return false;
        }
    return true;
}

/* alternates, then bos where the template writes it (the start of most alternating templates). */
static bool alternates_bos(chat_out *o, const chat_msg *m, size_t n, size_t first, const chat_template *t, char *err,
                           size_t n_err)
{
    if (!alternates(o, m, n, first, t, err, n_err))
        return false;
    if (t->emit_bos)
        lit(o, t->bos);
    return true;
}

/* ---- the families --------------------------------------------------------------------------- */

typedef void (*render_fn)(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                          size_t n_err);

/* Ours: "role: content" lines, then "assistant:". The tokenizer adds BOS as its metadata says. */
static void render_plain(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                         size_t n_err)
{
    for (size_t i = 0; i < n; i++) {
        lit(o, role_names[m[i].role]);
        lit(o, ": ");
        txt(o, &m[i]);
        lit(o, "\n");
    }
    if (gen)
        lit(o, "assistant:");
}

/* What follows the last "</think>" of a message: content.split('</think>')[-1]. */
static const char *past_think(const chat_msg *m)
{
    const char *c = m->content, *end = c + m->len;
    for (const char *p = c; p + 8 <= end; p++)
        if (!memcmp(p, "</think>", 8))
            c = p + 8;
    return c;
}

/* content.split('</think>')[-1].strip() (EXAONE 4's answers, GLM-Z1's turns). */
static void past_think_trimmed(chat_out *o, const chat_msg *m)
{
    const char *c = past_think(m);
    const chat_msg visible = {m->role, c, (size_t)(m->content + m->len - c)};
    content_trimmed(o, &visible);
}

/* Qwen3: an earlier assistant turn is written without its reasoning, content.split('</think>')
 * [-1].lstrip('\n'). */
static void after_think(chat_out *o, const chat_msg *m)
{
    const char *c = past_think(m), *end = m->content + m->len;
    while (c < end && *c == '\n')
        c++;
    out_put(o, c, (size_t)(end - c), false);
}

/* teknium/OpenHermes-2.5: '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n', then
 * '<|im_start|>assistant\n'. Qwen2 adds its literal system prompt when messages[0] is not one;
 * Qwen3 drops the reasoning of assistant turns before the last user message; microsoft/phi-4
 * writes '<|im_sep|>' for the newline after the role and none after '<|im_end|>'. */
static void render_chatml(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                          size_t n_err)
{
    if (t->emit_bos)
        lit(o, t->bos);
    if (n && t->default_system && m[0].role != CHAT_SYSTEM) {
        lit(o, "<|im_start|>system\n");
        lit(o, t->default_system);
        lit(o, "<|im_end|>\n");
    }
    size_t last_user = 0;
    for (size_t i = 0; i < n; i++)
        last_user = m[i].role == CHAT_USER ? i : last_user;
    const char *sep = t->chatml_sep ? "<|im_sep|>" : "\n", *end = t->chatml_sep ? "<|im_end|>" : "<|im_end|>\n";
    for (size_t i = 0; i < n; i++) {
        lit(o, "<|im_start|>");
        lit(o, role_names[m[i].role]);
        lit(o, sep);
        if (t->strip_think && m[i].role == CHAT_ASSISTANT && i < last_user)
            after_think(o, &m[i]);
        else
            txt(o, &m[i]);
        lit(o, end);
    }
    if (gen) {
        lit(o, "<|im_start|>assistant");
        lit(o, sep);
    }
}

/* Meta-Llama-3-Instruct: bos_token before the first message; each message
 * '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content|trim + '<|eot_id|>'. (3.1's
 * "Cutting Knowledge Date" system header is not reproduced.) */
static void render_llama3(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                          size_t n_err)
{
    for (size_t i = 0; i < n; i++) {
        if (i == 0 && t->emit_bos)
            lit(o, t->bos);
        lit(o, "<|start_header_id|>");
        lit(o, role_names[m[i].role]);
        lit(o, "<|end_header_id|>\n\n");
        content_trimmed(o, &m[i]);
        lit(o, "<|eot_id|>");
    }
    if (gen)
        lit(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* meta-llama/Llama-2-chat: an optional first system message goes into the first turn as
 * '<<SYS>>\n' + system + '\n<</SYS>>\n\n'; user turns are bos + '[INST] ' + content.strip() +
 * ' [/INST]', answers ' ' + content.strip() + ' ' + eos. No generation prompt. */
static void render_llama2(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                          size_t n_err)
{
    size_t first = n && m[0].role == CHAT_SYSTEM;
    if (!alternates(o, m, n, first, t, err, n_err))
        return;
    for (size_t i = first; i < n && o->st == VKI_OK; i++) {
        chat_prompt c = {0}; /* the turn's content, stripped as a whole */
        chat_out turn = {&c, VKI_OK};
        if (i == first && first) {
            lit(&turn, "<<SYS>>\n");
            txt(&turn, &m[0]);
            lit(&turn, "\n<</SYS>>\n\n");
        }
        txt(&turn, &m[i]);
        bool user = m[i].role == CHAT_USER;
        lit(o, user ? t->bos : " ");
        if (user)
            lit(o, "[INST] ");
        trimmed(o, &turn);
        lit(o, user ? " [/INST]" : " ");
        if (!user)
            lit(o, t->eos);
        chat_prompt_free(&c);
    }
}

/* mistralai/Mistral-7B-Instruct-v0.2 (the original template): bos, then '[INST] ' + content +
 * ' [/INST]' and answers content + eos. The "v1" template (' [INST] ' in the template) puts a space
 * before each [INST] and each answer and accepts a first system message, written before the first
 * user message followed by "\n\n"; we accept it that way for the original template too, whose
 * upstream text refuses system messages. Tekken's: "v3-tekken" (Nemo) drops the spaces and writes
 * the system message into the conversation's last message when that is a user turn (and nowhere
 * otherwise, as upstream); "v7" (Small 3, Devstral) writes system messages, the template's default
 * when the conversation has none, as [SYSTEM_PROMPT] blocks wherever they stand, and requires no
 * alternation. */
static void render_mistral(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                           size_t n_err)
{
    size_t first = n && m[0].role == CHAT_SYSTEM;
    if (t->mistral_v7) { /* mistralai/Mistral-Small-24B-Instruct-2501: any role order */
        if (t->emit_bos)
            lit(o, t->bos);
        if (!first && t->default_system) {
            lit(o, "[SYSTEM_PROMPT]");
            lit(o, t->default_system);
            lit(o, "[/SYSTEM_PROMPT]");
        }
        for (size_t i = 0; i < n; i++) {
            lit(o, m[i].role == CHAT_SYSTEM ? "[SYSTEM_PROMPT]" : m[i].role == CHAT_USER ? "[INST]" : "");
            txt(o, &m[i]);
            lit(o, m[i].role == CHAT_SYSTEM ? "[/SYSTEM_PROMPT]" : m[i].role == CHAT_USER ? "[/INST]" : t->eos);
        }
        return;
    }
    if (!alternates_bos(o, m, n, first, t, err, n_err))
        return;
    /* v0.2 / v1: the system message in the first user turn, "[INST] " + content + " [/INST]" (v1:
     * a space before [INST] and before each answer); v3-tekken (Nemo): no spaces, the system
     * message in the conversation's last message when that is a user turn */
    const bool tk = t->mistral_tekken;
    for (size_t i = first; i < n; i++) {
        if (m[i].role == CHAT_USER) {
            lit(o, tk ? "[INST]" : t->mistral_spaced ? " [INST] " : "[INST] ");
            if (first && (tk ? i == n - 1 : i == first)) {
                txt(o, &m[0]);
                lit(o, "\n\n");
            }
            txt(o, &m[i]);
            lit(o, tk ? "[/INST]" : " [/INST]");
        } else {
            if (t->mistral_spaced)
                lit(o, " ");
            txt(o, &m[i]);
            lit(o, t->eos);
        }
    }
}

/* HuggingFaceH4/zephyr-7b-beta: '<|' + role + '|>\n' + content + eos, a newline after each
 * message, then '<|assistant|>\n'. */
static void render_zephyr(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                          size_t n_err)
{
    if (t->emit_bos)
        lit(o, t->bos);
    for (size_t i = 0; i < n; i++) {
        lit(o, "<|");
        lit(o, role_names[m[i].role]);
        lit(o, "|>\n");
        txt(o, &m[i]);
        lit(o, t->eos);
        lit(o, "\n");
        if (i + 1 == n && gen)
            lit(o, "<|assistant|>\n");
    }
}

/* google/gemma-7b-it: bos, then '<start_of_turn>' + ('model' for the assistant, else the role) +
 * '\n' + content|trim + '<end_of_turn>\n', then '<start_of_turn>model\n'. A first system message
 * is written before the first turn's content followed by "\n\n", as Gemma 3's template does
 * (Gemma 1/2 refuse it). */
static void render_gemma(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                         size_t n_err)
{
    size_t first = n && m[0].role == CHAT_SYSTEM;
    if (!alternates_bos(o, m, n, first, t, err, n_err))
        return;
    for (size_t i = first; i < n; i++) {
        lit(o, m[i].role == CHAT_ASSISTANT ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (i == first && first) {
            txt(o, &m[0]);
            lit(o, "\n\n");
        }
        content_trimmed(o, &m[i]);
        lit(o, "<end_of_turn>\n");
    }
    if (gen)
        lit(o, "<start_of_turn>model\n");
}

/* microsoft/Phi-3.5-mini-instruct: '<|' + role + '|>\n' + content + '<|end|>\n' (a system message
 * only when non-empty), then '<|assistant|>\n', or eos without a generation prompt. The first
 * Phi-3-mini-4k template instead writes each user turn followed by '<|assistant|>\n' and drops
 * system messages (phi3_v1); Phi-4-mini's writes every message without the newlines (phi4_mini). */
static void render_phi3(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                        size_t n_err)
{
    if (t->emit_bos)
        lit(o, t->bos);
    for (size_t i = 0; t->phi3_v1 && i < n; i++) { /* see chat_template.phi3_v1 */
        if (m[i].role == CHAT_USER)
            lit(o, "<|user|>\n");
        if (m[i].role != CHAT_SYSTEM) {
            txt(o, &m[i]);
            lit(o, m[i].role == CHAT_USER ? "<|end|>\n<|assistant|>\n" : "<|end|>\n");
        }
    }
    if (t->phi3_v1)
        return;
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == CHAT_SYSTEM && !m[i].len && !t->phi4_mini)
            continue;
        lit(o, "<|");
        lit(o, role_names[m[i].role]);
        lit(o, t->phi4_mini ? "|>" : "|>\n");
        txt(o, &m[i]);
        lit(o, t->phi4_mini ? "<|end|>" : "<|end|>\n");
    }
    lit(o, gen ? (t->phi4_mini ? "<|assistant|>" : "<|assistant|>\n") : t->eos);
}

/* deepseek-ai/DeepSeek-R1-Distill-Qwen-7B (and R1's other distills): bos, the last system
 * message's content as it is, then '<｜User｜>' + content per user turn and '<｜Assistant｜>' +
 * content.split('</think>')[-1] + '<｜end▁of▁sentence｜>' per answer (system messages are not
 * written where they stand); the generation prompt '<｜Assistant｜>', with '<think>\n' after it in
 * the later revisions. Any role order. */
static void render_deepseek(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                            size_t n_err)
{
    if (t->emit_bos)
        lit(o, t->bos);
    const chat_msg *sys = NULL;
    for (size_t i = 0; i < n; i++)
        sys = m[i].role == CHAT_SYSTEM ? &m[i] : sys;
    if (sys)
        txt(o, sys);
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == CHAT_USER) {
            lit(o, DS_USER);
            txt(o, &m[i]);
        } else if (m[i].role == CHAT_ASSISTANT) {
            const char *c = past_think(&m[i]);
            lit(o, DS_ASSISTANT);
            out_put(o, c, (size_t)(m[i].content + m[i].len - c), false);
            lit(o, DS_EOS);
        }
    }
    if (gen)
        lit(o, t->deepseek_think ? DS_ASSISTANT "<think>\n" : DS_ASSISTANT);
}

/* ---- harmony (gpt-oss) --------------------------------------------------------------------- */

/* strftime_now(fmt) as the template would call it: the date t->date ("YYYY-MM-DD"), else today's
 * in local time, into out[n]. %Y %y %m %d %B %b %% (month names in English, as Python's in the C
 * locale); any other directive is copied as written. */
static void strftime_now(const chat_template *t, const char *fmt, char *out, size_t n)
{
    static const char *const months[12] = {"January", "February", "March",     "April",   "May",      "June",
                                           "July",    "August",   "September", "October", "November", "December"};
    int y = 1970, mo = 1, d = 1;
    time_t now = time(NULL);
    struct tm tm;
    if (!t->date[0] || sscanf(t->date, "%d-%d-%d", &y, &mo, &d) != 3 || mo < 1 || mo > 12) {
        y = 1970, mo = 1, d = 1;
        if (localtime_r(&now, &tm))
            y = tm.tm_year + 1900, mo = tm.tm_mon + 1, d = tm.tm_mday;
    }
    size_t len = 0;
    for (const char *f = fmt; *f && len + 1 < n; f++) {
        char piece[32];
        int k = 1;
        piece[0] = *f;
        if (f[0] == '%' && f[1]) {
            char c = *++f;
            k = c == 'Y'   ? snprintf(piece, sizeof piece, "%d", y)
                : c == 'y' ? snprintf(piece, sizeof piece, "%02d", ((y % 100) + 100) % 100)
                : c == 'm' ? snprintf(piece, sizeof piece, "%02d", mo)
                : c == 'd' ? snprintf(piece, sizeof piece, "%02d", d)
                : c == 'B' ? snprintf(piece, sizeof piece, "%s", months[mo - 1])
                : c == 'b' ? snprintf(piece, sizeof piece, "%.3s", months[mo - 1])
                : c == '%' ? snprintf(piece, sizeof piece, "%%")
                           : snprintf(piece, sizeof piece, "%%%c", c);
        }
        if (k < 0 || len + (size_t)k >= n)
            break;
        memcpy(out + len, piece, (size_t)k);
        len += (size_t)k;
    }
    out[len] = 0;
}

vki_status chat_harmony_system(const chat_template *t, bool tools, chat_prompt *p)
{
    char date[16];
    chat_out o = {p, VKI_OK};
    lit(&o, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            "Knowledge cutoff: 2024-06\n");
    if (t->dated) {
        strftime_now(t, "%Y-%m-%d", date, sizeof date);
        lit(&o, "Current date: ");
        lit(&o, date);
        lit(&o, "\n");
    }
    lit(&o, "\nReasoning: ");
    lit(&o, chat_effort_name(t->effort));
    lit(&o, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
    if (tools)
        lit(&o, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    lit(&o, "<|end|>");
    return o.st;
}

bool chat_harmony_check(const chat_msg *m, size_t i, char *err, size_t n_err)
{
    static const char A[] = "<|channel|>analysis<|message|>", F[] = "<|channel|>final<|message|>";
    if (m->role != CHAT_ASSISTANT || (!memmem(m->content, m->len, A, sizeof A - 1) &&
                                      !memmem(m->content, m->len, F, sizeof F - 1)))
        return true;
    if (err && n_err)
        snprintf(err, n_err, "messages[%zu].content: holds '<|channel|>' tags; an assistant message's content is its "
                 "final answer's text only (harmony chat template)", i);
    return false;
}

/* openai/gpt-oss-20b: its system message (identity, knowledge cutoff, today's date where the
 * template calls strftime_now, the reasoning effort, the valid channels); a first system message
 * as the developer message '# Instructions\n\n' + content + '\n\n' (none when empty); user turns
 * '<|start|>user<|message|>' + content + '<|end|>'; answers on the final channel,
 * '<|start|>assistant<|channel|>final<|message|>' + content + '<|end|>' (their reasoning is never
 * rendered), the last one ending '<|return|>' instead when there is no generation prompt (the
 * template's training form); then '<|start|>assistant'. Later system messages are not written
 * (the template has no branch for them); an answer holding channel tags is refused, as upstream
 * raises. Tools: chat_render_tools. */
static void render_harmony(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                           size_t n_err)
{
    if (o->st == VKI_OK)
        o->st = chat_harmony_system(t, false, o->p);
    size_t first = n && m[0].role == CHAT_SYSTEM;
    if (first && m[0].len) {
        lit(o, "<|start|>developer<|message|># Instructions\n\n");
        txt(o, &m[0]);
        lit(o, "\n\n<|end|>");
    }
    for (size_t i = first; i < n && o->st == VKI_OK; i++) {
        if (!chat_harmony_check(&m[i], i, err, n_err)) {
            o->st = VKI_ERR_INVALID_ARG;
        } else if (m[i].role == CHAT_USER) {
            lit(o, "<|start|>user<|message|>");
            txt(o, &m[i]);
            lit(o, "<|end|>");
        } else if (m[i].role == CHAT_ASSISTANT) {
            lit(o, "<|start|>assistant<|channel|>final<|message|>");
            txt(o, &m[i]);
            lit(o, i + 1 == n && !gen ? "<|return|>" : "<|end|>");
        }
    }
    if (gen)
        lit(o, "<|start|>assistant");
}

/* ---- OLMo 2 / Tülu 3, Granite, SmolLM3, EXAONE ---------------------------------------------- */

/* allenai/OLMo-2-1124-13B-Instruct (and Tülu 3's): bos, then '<|system|>\n' / '<|user|>\n' +
 * content + '\n', answers '<|assistant|>\n' + content + eos_token, and '\n' unless it is the last
 * message; then '<|assistant|>\n'. */
static void render_tulu(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                        size_t n_err)
{
    if (t->emit_bos)
        lit(o, t->bos);
    for (size_t i = 0; i < n; i++) {
        lit(o, "<|");
        lit(o, role_names[m[i].role]);
        lit(o, "|>\n");
        txt(o, &m[i]);
        if (m[i].role == CHAT_ASSISTANT)
            lit(o, t->eos);
        if (m[i].role != CHAT_ASSISTANT || i + 1 < n)
            lit(o, "\n");
        if (i + 1 == n && gen)
            lit(o, "<|assistant|>\n");
    }
}

/* ibm-granite/granite-3.x-8b-instruct, no tools and no documents: 3.1+ write a first system message,
 * or their default ("Knowledge Cutoff Date: April 2024.\nToday's Date: " + strftime_now('%B %d, %Y')
 * + ...; 3.2/3.3's `thinking` picks a longer one), as '<|start_of_role|>system<|end_of_role|>' +
 * content + '<|end_of_text|>\n'; then every other message the same way with its role (3.0: every
 * message), and after the last one '<|start_of_role|>assistant<|end_of_role|>' (no generation
 * prompt without a message after the system one: the template writes it inside its loop). */
static void render_granite(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                           size_t n_err)
{
    size_t first = 0;
    if (t->default_system) {
        first = n && m[0].role == CHAT_SYSTEM;
        lit(o, "<|start_of_role|>system<|end_of_role|>");
        if (first) {
            txt(o, &m[0]);
        } else {
            char date[64] = "";
            strftime_now(t, t->date_fmt, date, sizeof date);
            const char *tail = t->think == CHAT_THINK_ON && t->system_tail[1] ? t->system_tail[1] : t->system_tail[0];
            lit(o, t->default_system);
            lit(o, date);
            lit(o, tail ? tail : "");
        }
        lit(o, "<|end_of_text|>\n");
    }
    for (size_t i = first; i < n; i++) {
        lit(o, "<|start_of_role|>");
        lit(o, role_names[m[i].role]);
        lit(o, "<|end_of_role|>");
        txt(o, &m[i]);
        lit(o, "<|end_of_text|>\n");
        if (i + 1 == n && gen)
            lit(o, "<|start_of_role|>assistant<|end_of_role|>");
    }
}

/* SmolLM3's "## Custom Instructions" when the system message gives none, by reasoning mode. */
#define SMOL_PERSONA "You are a helpful AI assistant named SmolLM, trained by Hugging Face."
#define SMOL_PERSONA_THINK                                                                                        \
    SMOL_PERSONA " Your role as an assistant involves thoroughly exploring questions through a systematic "       \
    "thinking process before providing the final precise and accurate solutions. This requires engaging in a "    \
    "comprehensive cycle of analysis, summarizing, exploration, reassessment, reflection, backtracking, and "      \
    "iteration to develop well-considered thinking process. Please structure your response into two main "         \
    "sections: Thought and Solution using the specified format: <think> Thought section </think> Solution "       \
    "section. In the Thought section, detail your reasoning process in steps. Each step should include detailed " \
    "considerations such as analysing questions, summarizing relevant findings, brainstorming new ideas, "         \
    "verifying the accuracy of the current steps, refining any errors, and revisiting previous steps. In the "     \
    "Solution section, based on various attempts, explorations, and reflections from the Thought section, "       \
    "systematically present the final solution that you deem correct. The Solution section should be logical, "   \
    "accurate, and concise and detail necessary steps needed to reach the conclusion."

/* s[0, n) with every `pat` removed (Python's str.replace(pat, "")) into b. */
static bool remove_all(strbuf *b, const char *s, size_t n, const char *pat)
{
    size_t k = strlen(pat), from = 0;
    bool ok = strbuf_put(b, "", 0);
    if (!n)
        return ok;
    for (size_t i = 0; ok && i + k <= n;)
        if (!memcmp(s + i, pat, k)) {
            ok = strbuf_put(b, s + from, i - from);
            from = i += k;
        } else {
            i++;
        }
    return ok && strbuf_put(b, s + from, n - from);
}

/* The system message's custom instructions: content.replace("/no_think", "").replace("/think", "")
 * .rstrip(), and .replace("/system_override", "").rstrip() on that where it overrides the block. */
static void smollm3_custom(chat_out *o, const chat_msg *sys, bool override, chat_msg *out, strbuf *b)
{
    strbuf a = {0}, c = {0};
    bool ok = remove_all(&a, sys->content, sys->len, "/no_think") && remove_all(&c, a.p, a.len, "/think");
    while (ok && c.len && is_ws(c.p[c.len - 1]))
        c.len--;
    ok = ok && (override ? remove_all(b, c.p, c.len, "/system_override") : strbuf_put(b, c.p, c.len));
    while (ok && override && b->len && is_ws(b->p[b->len - 1]))
        b->len--;
    if (!ok && o->st == VKI_OK)
        o->st = VKI_ERR_OUT_OF_HOST_MEMORY;
    *out = (chat_msg){CHAT_SYSTEM, b->p, ok ? b->len : 0};
    strbuf_free(&a);
    strbuf_free(&c);
}

/* HuggingFaceTB/SmolLM3-3B, no tools: '<|im_start|>system\n', then (unless a first system message
 * holds "/system_override": its custom instructions + '<|im_end|>\n') "## Metadata\n\nKnowledge Cutoff
 * Date: June 2025\nToday Date: " + strftime_now("%d %B %Y") + "\nReasoning Mode: /think\n\n##
 * Custom Instructions\n\n" + the instructions + "\n\n", or the default persona; without tools the
 * template leaves that block unclosed (Unsloth's edit closes it and has no date line). The mode is
 * enable_thinking's (default on) unless the system message holds "/no_think" or "/think" (removed
 * from the instructions). User turns as ChatML; answers '<|im_start|>assistant\n' + (no_think:
 * '<think>\n\n</think>\n') + content.lstrip('\n') + '<|im_end|>\n', their reasoning kept; system
 * messages are not written where they stand. The generation prompt: the same opening. */
static void render_smollm3(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                           size_t n_err)
{
    const chat_msg *sys = n && m[0].role == CHAT_SYSTEM ? &m[0] : NULL;
    bool think = t->think != CHAT_THINK_OFF;
    if (sys && memmem(sys->content, sys->len, "/no_think", 9))
        think = false;
    else if (sys && memmem(sys->content, sys->len, "/think", 6))
        think = true;
    bool override = t->smollm3_override && sys && memmem(sys->content, sys->len, "/system_override", 16);
    strbuf b = {0};
    chat_msg custom = {CHAT_SYSTEM, NULL, 0};
    if (sys)
        smollm3_custom(o, sys, override, &custom, &b);
    lit(o, "<|im_start|>system\n");
    if (override) {
        txt(o, &custom);
        lit(o, "<|im_end|>\n");
    } else {
        char date[64];
        lit(o, "## Metadata\n\nKnowledge Cutoff Date: June 2025\n");
        if (t->dated) {
            strftime_now(t, "%d %B %Y", date, sizeof date);
            lit(o, "Today Date: ");
            lit(o, date);
            lit(o, "\n");
        }
        lit(o, think ? "Reasoning Mode: /think\n\n## Custom Instructions\n\n"
                     : "Reasoning Mode: /no_think\n\n## Custom Instructions\n\n");
        if (custom.len)
            txt(o, &custom);
        else
            lit(o, think ? SMOL_PERSONA_THINK : SMOL_PERSONA);
        lit(o, "\n\n");
        if (t->smollm3_closed)
            lit(o, "<|im_end|>\n");
    }
    strbuf_free(&b);
    const char *open = think ? "<|im_start|>assistant\n" : "<|im_start|>assistant\n<think>\n\n</think>\n";
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == CHAT_USER) {
            lit(o, "<|im_start|>user\n");
            txt(o, &m[i]);
            lit(o, "<|im_end|>\n");
        } else if (m[i].role == CHAT_ASSISTANT) {
            const char *c = m[i].content, *end = c + m[i].len;
            while (c < end && *c == '\n')
                c++;
            lit(o, open);
            out_put(o, c, (size_t)(end - c), false);
            lit(o, "<|im_end|>\n");
        }
    }
    if (gen)
        lit(o, open);
}

/* LGAI-EXAONE/EXAONE-3.5-2.4B-Instruct (the other 3.5 sizes' and 3.0's write the same):
 * '[|system|][|endofturn|]\n' when messages[0] is not a system message, then each message
 * '[|' + role + '|]' + content and '\n' after a user turn, '[|endofturn|]\n' after any other; then
 * '[|assistant|]'. Nothing is trimmed (llama.cpp's built-in EXAONE renderer trims every message and
 * leaves the empty system turn out; the Jinja does neither).
 * LGAI-EXAONE/EXAONE-4.0-32B, no tools: every message '[|' + role + '|]\n' + content +
 * '[|endofturn|]\n', no default system turn; an answer with content is written behind an empty
 * reasoning block '<think>\n\n</think>\n\n' (its skip_think, true unless the caller sets it, keeps
 * no reasoning), as content.split('</think>')[-1].strip() when it holds a '</think>'; an empty answer
 * is '[|assistant|]\n[|endofturn|]\n'. The generation prompt: '[|assistant|]\n' and '<think>\n' when
 * enable_thinking is true, else the empty block. (EXAONE Deep's template, which has no '[|tool|]', is
 * taken for 3.x's: its '<thought>' generation prompt and the newlines it writes between messages
 * instead are not reproduced.) */
static void render_exaone(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                          size_t n_err)
{
    if (!t->exaone4 && n && m[0].role != CHAT_SYSTEM)
        lit(o, "[|system|][|endofturn|]\n");
    for (size_t i = 0; i < n; i++) {
        lit(o, "[|");
        lit(o, role_names[m[i].role]);
        lit(o, t->exaone4 ? "|]\n" : "|]");
        if (!t->exaone4) {
            txt(o, &m[i]);
            lit(o, m[i].role == CHAT_USER ? "\n" : "[|endofturn|]\n");
            continue;
        }
        if (m[i].role != CHAT_ASSISTANT) {
            txt(o, &m[i]);
        } else if (m[i].len) {
            lit(o, "<think>\n\n</think>\n\n");
            if (past_think(&m[i]) != m[i].content)
                past_think_trimmed(o, &m[i]);
            else
                txt(o, &m[i]);
        }
        lit(o, "[|endofturn|]\n");
    }
    if (gen && !t->exaone4)
        lit(o, "[|assistant|]");
    else if (gen)
        lit(o, t->think == CHAT_THINK_ON ? "[|assistant|]\n<think>\n" : "[|assistant|]\n<think>\n\n</think>\n\n");
}

/* ---- GLM-4 ------------------------------------------------------------------------------------ */

/* THUDM/GLM-4-9B-0414 (and GLM-4-32B-0414's): '[gMASK]<sop>', every system message '<|system|>\n' +
 * content, then the others in order, '<|' + role + '|>\n' + content, nothing written after a
 * turn; the generation prompt the template's literal (glm4_gen). THUDM/GLM-Z1-9B-0414 (GLM-Z1-32B's,
 * Rumination's) writes each non-system message as content.split('</think>')[-1].strip(), so an
 * answer loses its reasoning and a user turn is stripped too, and opens the reasoning:
 * '<|assistant|>\n<think>'. THUDM/glm-4-9b-chat's (2024) writes the system messages where they are.
 * Roles are user / assistant only: the templates' 'observation' turn (a tool's result) and an
 * answer's 'metadata' (a call) come from the tool path, which uses the fallback's instructions. */
static void render_glm4(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                        size_t n_err)
{
    lit(o, "[gMASK]<sop>");
    for (int pass = t->glm4_system_first ? 0 : 1; pass < 2; pass++)
        for (size_t i = 0; i < n; i++) {
            bool sys = m[i].role == CHAT_SYSTEM;
            if (t->glm4_system_first && sys != (pass == 0))
                continue;
            lit(o, "<|");
            lit(o, role_names[m[i].role]);
            lit(o, "|>\n");
            if (sys || !t->glm4_visible)
                txt(o, &m[i]);
            else
                past_think_trimmed(o, &m[i]);
        }
    if (gen)
        lit(o, t->glm4_gen);
}

/* ---- Cohere ----------------------------------------------------------------------------------- */

/* CohereForAI/c4ai-command-r-v01 (Command R+'s, Aya 23's and Aya Expanse's write the same; their
 * default system prompts sit behind "elif false == true", never written): bos, a first system message
 * as '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + content + '<|END_OF_TURN_TOKEN|>' (not trimmed), then
 * user turns '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' and
 * answers '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>',
 * alternating (the template raises otherwise; llama.cpp's built-in renderer takes any order and trims
 * the system message too); then '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>'.
 * CohereForAI/c4ai-command-r7b-12-2024 (command_r7b; Command A's, not at hand, is taken to write the
 * same), its default template without documents: no
 * bos_token, '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|END_OF_TURN_TOKEN|>' when there is no system
 * message, answers '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_RESPONSE|>' + content.strip() +
 * '<|END_RESPONSE|><|END_OF_TURN_TOKEN|>', and the generation prompt opens the response:
 * '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_RESPONSE|>'. Its long "# System Preamble" is written
 * only by the branch for documents (RAG) and by its tool_use template, neither reproduced: tools use the
 * fallback's instructions (a tool's result as a user turn, where the real tool_use templates write a
 * system turn). */
static void render_command_r(const chat_template *t, const chat_msg *m, size_t n, bool gen, chat_out *o, char *err,
                             size_t n_err)
{
    size_t first = n && m[0].role == CHAT_SYSTEM;
    if (!alternates_bos(o, m, n, first, t, err, n_err))
        return;
    if (first || t->command_r7b) {
        lit(o, "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>");
        if (first)
            txt(o, &m[0]);
        lit(o, "<|END_OF_TURN_TOKEN|>");
    }
    const char *answer = t->command_r7b ? "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_RESPONSE|>"
                                        : "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>";
    for (size_t i = first; i < n; i++) {
        bool user = m[i].role == CHAT_USER;
        lit(o, user ? "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>" : answer);
        content_trimmed(o, &m[i]);
        lit(o, !user && t->command_r7b ? "<|END_RESPONSE|><|END_OF_TURN_TOKEN|>" : "<|END_OF_TURN_TOKEN|>");
    }
    if (gen)
        lit(o, answer);
}

static const render_fn renderers[CHAT_FAMILY_COUNT] = {
    [CHAT_PLAIN] = render_plain,     [CHAT_CHATML] = render_chatml, [CHAT_LLAMA3] = render_llama3,
    [CHAT_LLAMA2] = render_llama2,   [CHAT_MISTRAL] = render_mistral, [CHAT_ZEPHYR] = render_zephyr,
    [CHAT_GEMMA] = render_gemma,     [CHAT_PHI3] = render_phi3,     [CHAT_DEEPSEEK] = render_deepseek,
    [CHAT_HARMONY] = render_harmony, [CHAT_TULU] = render_tulu,     [CHAT_GRANITE] = render_granite,
    [CHAT_SMOLLM3] = render_smollm3, [CHAT_EXAONE] = render_exaone, [CHAT_GLM4] = render_glm4,
    [CHAT_COMMAND_R] = render_command_r,
};

void chat_prompt_open_end(chat_prompt *p)
{
    size_t end = p->len, k = p->n_tmpl;
    while (k && p->tmpl[k - 1].off + p->tmpl[k - 1].len == end) /* template text up to the end */
        end = p->tmpl[--k].off;
    p->n_tmpl = k;
    p->len = end;
    if (p->text)
        p->text[end] = 0;
}

vki_status chat_render(const chat_template *t, const chat_msg *m, size_t n, bool add_generation_prompt,
                       chat_prompt *out, char *err, size_t n_err)
{
    memset(out, 0, sizeof *out);
    if ((unsigned)t->family >= CHAT_FAMILY_COUNT || (n && !m))
        return VKI_ERR_INVALID_ARG;
    for (size_t i = 0; i < n; i++)
        if ((unsigned)m[i].role > CHAT_ASSISTANT || (m[i].len && !m[i].content))
            return VKI_ERR_INVALID_ARG;
    chat_out o = {out, VKI_OK};
    renderers[t->family](t, m, n, add_generation_prompt, &o, err, n_err);
    if (o.st == VKI_OK && !strbuf_put(&out->buf, "", 0)) /* nothing rendered: still a valid "" */
        o.st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (o.st != VKI_OK)
        chat_prompt_free(out);
    return o.st;
}

/* ---- tokenisation ------------------------------------------------------------------------- */

typedef struct chat_special {
    char *text;
    size_t len;
    int32_t id;
} chat_special;

struct chat_specials {
    chat_special *v;      /* [n] longest first */
    size_t n;
    uint8_t first[256];   /* a special token starts with this byte */
};

static int cmp_len_desc(const void *a, const void *b)
{
    const chat_special *x = a, *y = b;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : (x->id > y->id) - (x->id < y->id);
}

void chat_specials_free(chat_specials *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i].text);
    free(s->v);
    free(s);
}

vki_status chat_specials_create(const vki_tokenizer *tok, chat_specials **out)
{
    *out = NULL;
    chat_specials *s = calloc(1, sizeof *s);
    uint32_t nv = vki_vocab_size(tok);
    if (!s)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    size_t cap = 0;
    char buf[256];
    for (uint32_t id = 0; id < nv; id++) {
        size_t plain = 0, special = 0;
        if (vki_token_to_piece(tok, (int32_t)id, false, buf, sizeof buf, &plain) != VKI_OK || plain)
            continue;
        if (vki_token_to_piece(tok, (int32_t)id, true, buf, sizeof buf, &special) != VKI_OK || !special)
            continue;
        if (s->n == cap) {
            cap = cap ? cap * 2 : 64;
            chat_special *v = realloc(s->v, cap * sizeof *v);
            if (!v)
                goto oom;
            s->v = v;
        }
        char *text = malloc(special);
        if (!text)
            goto oom;
        memcpy(text, buf, special);
        s->v[s->n++] = (chat_special){text, special, (int32_t)id};
        s->first[(uint8_t)buf[0]] = 1;
    }
    if (s->n)
        qsort(s->v, s->n, sizeof *s->v, cmp_len_desc);
    *out = s;
    return VKI_OK;
oom:
    chat_specials_free(s);
    return VKI_ERR_OUT_OF_HOST_MEMORY;
}

typedef struct id_buf {
    int32_t *v;
    size_t n, cap;
} id_buf;

static vki_status ids_reserve(id_buf *b, size_t more)
{
    if (more > SIZE_MAX / sizeof(int32_t) / 2 - b->n)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    if (b->n + more <= b->cap)
        return VKI_OK;
    size_t cap = (b->n + more) * 2;
    int32_t *v = realloc(b->v, cap * sizeof *v);
    if (!v)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    b->v = v;
    b->cap = cap;
    return VKI_OK;
}

/* Plain text (no control tokens matched) appended to b. */
static vki_status tokenize_plain(const vki_tokenizer *tok, const char *s, size_t n, id_buf *b)
{
    if (!n)
        return VKI_OK;
    size_t want = n + 8, got = 0;
    for (int tries = 0; tries < 2; tries++) {
        vki_status st = ids_reserve(b, want);
        if (st != VKI_OK)
            return st;
        st = vki_tokenize(tok, s, n, false, false, b->v + b->n, b->cap - b->n, &got);
        if (st == VKI_OK) {
            b->n += got;
            return VKI_OK;
        }
        if (st != VKI_ERR_INVALID_ARG || got <= b->cap - b->n)
            return st;
        want = got;
    }
    return VKI_ERR_INTERNAL;
}

/* The longest control token that starts at s[0] and fits in n bytes, or NULL. */
static const chat_special *special_at(const chat_specials *sp, const char *s, size_t n)
{
    if (!sp->first[(uint8_t)s[0]])
        return NULL;
    for (size_t k = 0; k < sp->n; k++)
        if (sp->v[k].len <= n && !memcmp(sp->v[k].text, s, sp->v[k].len))
            return &sp->v[k];
    return NULL;
}

vki_status chat_tokenize(const chat_specials *sp, const vki_tokenizer *tok, const chat_prompt *p, bool add_bos,
                         int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    id_buf b = {0};
    vki_status st = ids_reserve(&b, 1);
    int32_t bos = vki_token_bos(tok);
    size_t raw = 0; /* start of the plain text not yet tokenised */
    for (size_t k = 0; k < p->n_tmpl && st == VKI_OK; k++) {
        size_t end = p->tmpl[k].off + p->tmpl[k].len;
        for (size_t i = p->tmpl[k].off; i < end && st == VKI_OK;) {
            const chat_special *c = special_at(sp, p->text + i, end - i);
            if (!c) {
                i++;
                continue;
            }
            st = tokenize_plain(tok, p->text + raw, i - raw, &b);
            if (st == VKI_OK)
                st = ids_reserve(&b, 1);
            if (st == VKI_OK)
                b.v[b.n++] = c->id;
            i += c->len;
            raw = i;
        }
    }
    if (st == VKI_OK)
        st = tokenize_plain(tok, p->text + raw, p->len - raw, &b);
    if (st == VKI_OK && add_bos && bos >= 0 && (!b.n || b.v[0] != bos) && (st = ids_reserve(&b, 1)) == VKI_OK) {
        memmove(b.v + 1, b.v, b.n * sizeof *b.v);
        b.v[0] = bos;
        b.n++;
    }
    if (st != VKI_OK) {
        free(b.v);
        return st;
    }
    *ids = b.v;
    *n = b.n;
    return VKI_OK;
}

void chat_token_texts(const vki_tokenizer *tok, char *bos, size_t n_bos, char *eos, size_t n_eos)
{
    int32_t ids[2] = {vki_token_bos(tok), vki_token_eos(tok)};
    char *dst[2] = {bos, eos};
    size_t cap[2] = {n_bos, n_eos};
    for (int k = 0; k < 2; k++) {
        size_t len = 0;
        dst[k][0] = 0;
        if (ids[k] >= 0 && vki_token_to_piece(tok, ids[k], true, dst[k], cap[k] - 1, &len) == VKI_OK)
            dst[k][len] = 0;
    }
}

vki_status chat_template_from_gguf(const char *path, char **out, char *err, size_t n_err)
{
    *out = NULL;
    gguf_file *f = NULL;
    vki_status st = gguf_open(path, &f, err, n_err);
    if (st != VKI_OK)
        return st;
    gguf_str s;
    st = gguf_get_str(f, "tokenizer.chat_template", &s);
    if (st == VKI_OK) {
        *out = s.len < SIZE_MAX ? malloc((size_t)s.len + 1) : NULL;
        if (*out) {
            memcpy(*out, s.ptr, (size_t)s.len);
            (*out)[s.len] = 0;
        } else {
            st = VKI_ERR_OUT_OF_HOST_MEMORY;
        }
    } else if (st == VKI_ERR_NOT_FOUND) {
        st = VKI_OK;
    } else if (err && n_err) {
        snprintf(err, n_err, "tokenizer.chat_template: not a string");
    }
    gguf_close(f);
    return st;
}
