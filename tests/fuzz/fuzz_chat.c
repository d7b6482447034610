/* Chat templates on arbitrary conversations: recognition of an arbitrary template text, rendering
 * of arbitrary messages in every family, and tokenisation of the result with a real vocabulary
 * (../shared/models/vocab/ggml-vocab-llama-spm.gguf when present).
 * Input: byte 0 picks the family (and add_generation_prompt), then messages separated by 0xFF,
 * each a role byte followed by its content; the whole input also serves as a template text.
 * Properties: the template spans are ordered, disjoint and inside the text; every message's
 * content (ASCII-trimmed, as the trimming families write it; what the template keeps of it:
 * Qwen3 drops earlier reasoning, DeepSeek-R1 and EXAONE 4 every answer's reasoning, GLM-Z1 every
 * user turn's and answer's text up to its last "</think>", DeepSeek-R1
 * all but the last system message, Mistral's v3-tekken the system message unless the last
 * message is a user turn, the first Phi-3 template system turns, harmony every system message
 * but the first, SmolLM3 every system message: the first's flags are cut from it, the others are
 * not written)
 * appears in the rendered text; the tokenised prompt holds only ids inside the vocabulary.
 * The input after byte 0 is also a gpt-oss reply for the harmony splitter: fed whole and byte by
 * byte it splits the same (byte 0's low bit: reasoning_format "none"), and its content goes
 * through the harmony call parser. */
#include "fuzz.h"

#include <string.h>

#include "host/chat/chat.h"
#include "host/chat/chat_harmony.h"
#include "host/chat/chat_tools.h"

#define MAX_MSGS 16

static bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* The message's content with ASCII whitespace trimmed at both ends is in text[0, len); from
 * `from` on only when given (what a template keeps of a message). */
static bool content_present_from(const chat_msg *m, const char *from, const char *text, size_t len)
{
    const char *a = from ? from : m->content, *b = m->content + m->len;
    while (a < b && ws(*a))
        a++;
    while (b > a && ws(b[-1]))
        b--;
    return a == b || memmem(text, len, a, (size_t)(b - a)) != NULL;
}

static bool content_present(const chat_msg *m, const char *text, size_t len)
{
    return content_present_from(m, NULL, text, len);
}

/* What of message i a family's template keeps: all of it, or none of a system message for the
 * first Phi-3 template, for harmony but the first one, for DeepSeek-R1 but the last one, for
 * Mistral's v3-tekken unless the conversation ends with a user turn, for SmolLM3 (the first is
 * rewritten: "/think", "/no_think", "/system_override" cut out); an assistant turn after its
 * last "</think>" (Qwen3: the earlier ones; DeepSeek-R1, EXAONE 4: every one; GLM-Z1: every
 * message but the system ones, user turns too). */
static bool kept_present(const chat_template *t, const chat_msg *m, size_t n, size_t i, const char *text, size_t len)
{
    if (t->phi3_v1 && m[i].role == CHAT_SYSTEM)
        return true;
    if (t->family == CHAT_HARMONY && m[i].role == CHAT_SYSTEM && i) /* only the first is the developer's */
        return true;
    if (t->family == CHAT_SMOLLM3 && m[i].role == CHAT_SYSTEM)
        return true;
    size_t last_user = 0, last_sys = 0;
    for (size_t k = 0; k < n; k++) {
        last_user = m[k].role == CHAT_USER ? k : last_user;
        last_sys = m[k].role == CHAT_SYSTEM ? k : last_sys;
    }
    bool deepseek = t->family == CHAT_DEEPSEEK;
    if (deepseek && m[i].role == CHAT_SYSTEM && i != last_sys)
        return true;
    if (t->mistral_tekken && i == 0 && m[0].role == CHAT_SYSTEM && m[n - 1].role != CHAT_USER)
        return true;
    bool think = deepseek || (t->family == CHAT_EXAONE && t->exaone4) || (t->strip_think && i < last_user);
    bool glm_cut = t->glm4_visible && m[i].role != CHAT_SYSTEM;
    if (!glm_cut && (!think || m[i].role != CHAT_ASSISTANT))
        return content_present(&m[i], text, len);
    const char *from = m[i].content;
    for (const char *q = m[i].content; q + 8 <= m[i].content + m[i].len; q++)
        if (!memcmp(q, "</think>", 8))
            from = q + 8;
    return content_present_from(&m[i], from, text, len);
}

/* The reply split whole and byte by byte: the same reasoning and content. */
static void check_harmony_split(const char *s, size_t n, bool raw)
{
    chat_harmony a, b;
    chat_harmony_init(&a, raw);
    chat_harmony_init(&b, raw);
    strbuf r1 = {0}, c1 = {0}, r2 = {0}, c2 = {0};
    bool ok = chat_harmony_feed(&a, s, n, true, &r1, &c1);
    for (size_t i = 0; ok && i < n; i++)
        ok = chat_harmony_feed(&b, s + i, 1, false, &r2, &c2);
    ok = ok && chat_harmony_feed(&b, "", 0, true, &r2, &c2);
    if (ok) {
        FUZZ_CHECK(r1.len == r2.len && (!r1.len || !memcmp(r1.p, r2.p, r1.len)));
        FUZZ_CHECK(c1.len == c2.len && (!c1.len || !memcmp(c1.p, c2.p, c1.len)));
        chat_tool_parser *p;
        if (chat_tool_parser_create(CHAT_TOOLS_HARMONY, false, NULL, 1, &p) == VKI_OK) {
            if (chat_tool_parser_push(p, c1.p ? c1.p : "", c1.len, NULL, NULL) == VKI_OK &&
                chat_tool_parser_finish(p, NULL, NULL) == VKI_OK) {
                size_t len;
                chat_tool_parser_content(p, &len);
                FUZZ_CHECK(len <= c1.len);
            }
            chat_tool_parser_free(p);
        }
    }
    strbuf_free(&r1), strbuf_free(&c1), strbuf_free(&r2), strbuf_free(&c2);
}

static vki_tokenizer *tok;
static chat_specials *specials;

static void cleanup(void)
{
    chat_specials_free(specials);
    vki_tokenizer_free(tok);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/models/vocab/ggml-vocab-llama-spm.gguf", fuzz_shared_dir());
    if (vki_tokenizer_load(path, &tok, err, sizeof err) == VKI_OK &&
        chat_specials_create(tok, &specials) != VKI_OK) {
        vki_tokenizer_free(tok);
        tok = NULL;
    }
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 8192)
        return 0;
    /* recognition of the input as a template text */
    char *tmpl = malloc(size + 1);
    if (!tmpl)
        return 0;
    memcpy(tmpl, data, size);
    tmpl[size] = 0;
    bool known;
    chat_detect(tmpl, &known);
    check_harmony_split((const char *)data + 1, size - 1, data[0] & 1);

    chat_family fam = (chat_family)(data[0] % CHAT_FAMILY_COUNT);
    bool gen = data[0] & 0x80;
    chat_msg m[MAX_MSGS];
    size_t n = 0;
    for (size_t i = 1; i < size && n < MAX_MSGS;) {
        size_t j = i + 1;
        while (j < size && data[j] != 0xFF)
            j++;
        m[n++] = (chat_msg){.role = (chat_role)(data[i] % 3), .content = (const char *)data + i + 1,
                            .len = j - i - 1};
        i = j + 1;
    }
    chat_template t;
    if (chat_template_init(&t, fam, tmpl, "<s>", "</s>") != VKI_OK) {
        free(tmpl);
        return 0;
    }
    chat_prompt p = {0};
    char err[256];
    if (chat_render(&t, m, n, gen, &p, err, sizeof err) == VKI_OK) {
        size_t end = 0;
        for (size_t i = 0; i < p.n_tmpl; i++) {
            FUZZ_CHECK(p.tmpl[i].off >= end && p.tmpl[i].off + p.tmpl[i].len <= p.len);
            end = p.tmpl[i].off + p.tmpl[i].len;
        }
        FUZZ_CHECK(strlen(p.text) <= p.len);
        /* (a lone system message is dropped by the families that fold it into the first user
         * turn, as their upstream templates do) */
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK((n == 1 && m[0].role == CHAT_SYSTEM) || kept_present(&t, m, n, i, p.text, p.len));
        if (tok) {
            int32_t *ids;
            size_t n_ids;
            if (chat_tokenize(specials, tok, &p, true, &ids, &n_ids) == VKI_OK) {
                for (size_t i = 0; i < n_ids; i++)
                    FUZZ_CHECK(ids[i] >= 0 && (uint32_t)ids[i] < vki_vocab_size(tok));
                free(ids);
            }
        }
    }
    chat_prompt_free(&p);
    chat_template_free(&t);
    free(tmpl);
    return 0;
}
