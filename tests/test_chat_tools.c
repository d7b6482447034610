/* Tool calling (host/chat/chat_tools.c): the three formats rendered exactly as their upstream
 * templates render the same conversation (expected strings worked out by hand from the Qwen2.5,
 * Llama 3.1 and Mistral v0.3 Jinja), the fallback for other families, the errors; forced-call
 * grammars (accept / reject tables, a named function, parallel calls); and the incremental parser
 * fed every output at every split, plus random members of each forced-call grammar's language,
 * which must parse back into calls with JSON arguments. No GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/chat/chat_tools.h"
#include "host/grammar/grammar.h"
#include "host/util/json.h"
#include "support/vt.h"

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"zone\": {\"enum\": [\"utc\", \"local\"]}}, \"required\": [\"zone\"]}}}]";

#define M(r, s) {(r), (s), sizeof(s) - 1}

static const chat_msg CONV[] = {M(CHAT_SYSTEM, "You are helpful."), M(CHAT_USER, "What's the weather in Paris?"),
                                M(CHAT_ASSISTANT, ""), M(CHAT_TOOL, "{\"temp\": 21}")};
static const chat_tool_call CALL = {"abc123def", 9, "get_weather", 11, "{\"city\":\"Paris\"}", 16};
static const chat_tool_msg CONV_T[] = {{0}, {0}, {&CALL, 1, NULL, 0}, {NULL, 0, "abc123def", 9}};

static chat_tool_set *tools_or_fail(const char *json)
{
    chat_tool_set *ts;
    char err[256];
    if (chat_tools_parse(json, strlen(json), &ts, err, sizeof err) != VKI_OK)
        fail_msg("tools: %s", err);
    return ts;
}

static void expect_render(chat_family fam, const char *tmpl, const char *bos, const char *eos, chat_tool_format want_f,
                          const chat_msg *m, const chat_tool_msg *tm, size_t n, const char *tools, const char *want)
{
    chat_template t;
    assert_int_equal(chat_template_init(&t, fam, tmpl, bos, eos), VKI_OK);
    chat_tool_format f = chat_tools_format(&t, tmpl);
    assert_int_equal(f, want_f);
    chat_tool_set *ts = tools ? tools_or_fail(tools) : NULL;
    chat_prompt p;
    char err[256] = "";
    if (chat_render_tools(&t, f, m, tm, n, ts, true, &p, err, sizeof err) != VKI_OK)
        fail_msg("render: %s", err);
    if (strcmp(p.text, want))
        fail_msg("%s rendering:\n--- got ---\n%s\n--- want ---\n%s", chat_tools_format_name(f), p.text, want);
    chat_prompt_free(&p);
    chat_tools_free(ts);
    chat_template_free(&t);
}

static const char TOOL0[] = "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the "
                            "weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
                            "\"string\"}}, \"required\": [\"city\"]}}}";
static const char TOOL1[] = "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": "
                            "\"object\", \"properties\": {\"zone\": {\"enum\": [\"utc\", \"local\"]}}, \"required\": "
                            "[\"zone\"]}}}";

static void test_render_qwen25(void **state)
{
    (void)state;
    static const char tmpl[] =
        "{%- if tools %}{{- '<|im_start|>system\\n' }}...<tool_call>...{%- else %}{{- '<|im_start|>system\\nYou are Qwen, "
        "created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}";
    char want[4096];
    snprintf(want, sizeof want,
             "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to assist with the "
             "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n%s\n%s\n"
             "</tools>\n\nFor each function call, return a json object with function name and arguments within "
             "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
             "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n"
             "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
             "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n"
             "<|im_start|>assistant\n", TOOL0, TOOL1);
    expect_render(CHAT_CHATML, tmpl, NULL, "<|im_end|>", CHAT_TOOLS_HERMES, CONV, CONV_T, 4, TOOLS, want);
    /* no system message: Qwen2.5 writes its default one before the tools; two results, one turn */
    static const chat_msg two[] = {M(CHAT_USER, "Both?"), M(CHAT_ASSISTANT, "Sure."), M(CHAT_TOOL, "A"),
                                   M(CHAT_TOOL, "B")};
    static const chat_tool_call calls[2] = {{NULL, 0, "get_time", 8, "{\"zone\": \"utc\"}", 15},
                                            {NULL, 0, "get_time", 8, "not json", 8}};
    static const chat_tool_msg two_t[] = {{0}, {calls, 2, NULL, 0}, {0}, {0}};
    snprintf(want, sizeof want,
             "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou "
             "may call one or more functions to assist with the user query.\n\nYou are provided with function signatures "
             "within <tools></tools> XML tags:\n<tools>\n%s\n%s\n</tools>\n\nFor each function call, return a json object "
             "with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
             "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nBoth?"
             "<|im_end|>\n<|im_start|>assistant\nSure.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": "
             "\"utc\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": not json}\n</tool_call>"
             "<|im_end|>\n<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n</tool_response>"
             "<|im_end|>\n<|im_start|>assistant\n", TOOL0, TOOL1);
    expect_render(CHAT_CHATML, tmpl, NULL, "<|im_end|>", CHAT_TOOLS_HERMES, two, two_t, 4, TOOLS, want);
}

static void test_render_llama31(void **state)
{
    (void)state;
    static const char tmpl[] = "{{- bos_token }}...<|start_header_id|>...Environment: ipython...<|python_tag|>";
    static const char tool0_indent[] =
        "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": "
        "\"Get the weather\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": "
        "{\n                \"city\": {\n                    \"type\": \"string\"\n                }\n            },\n   "
        "         \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}";
    char want[4096];
    snprintf(want, sizeof want,
             "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge "
             "Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are helpful.<|eot_id|><|start_header_id|>user"
             "<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call with "
             "its proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function "
             "name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n%s\n\n",
             tool0_indent);
    /* the second tool, indented the same way */
    strcat(want, "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_time\",\n        "
                 "\"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                "
                 "\"zone\": {\n                    \"enum\": [\n                        \"utc\",\n                        "
                 "\"local\"\n                    ]\n                }\n            },\n            \"required\": [\n     "
                 "           \"zone\"\n            ]\n        }\n    }\n}\n\n");
    strcat(want, "What's the weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": "
                 "\"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|><|start_header_id|>ipython"
                 "<|end_header_id|>\n\n{\"temp\": 21}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render(CHAT_LLAMA3, tmpl, "<|begin_of_text|>", "<|eot_id|>", CHAT_TOOLS_LLAMA3, CONV, CONV_T, 4, TOOLS, want);
}

static void test_render_mistral_v3(void **state)
{
    (void)state;
    static const char tmpl[] = "{{- bos_token }}{%- for message in loop_messages %}[INST]...[AVAILABLE_TOOLS]...";
    char want[4096];
    /* the system message is dropped: upstream writes it only into a user message that is last */
    snprintf(want, sizeof want,
             "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
             "\"Get the weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
             "\"string\"}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": "
             "\"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {\"zone\": {\"enum\": [\"utc\", "
             "\"local\"]}}, \"required\": [\"zone\"]}}}][/AVAILABLE_TOOLS][INST] What's the weather in Paris?[/INST]"
             "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}]"
             "</s>[TOOL_RESULTS] {\"content\": {\"temp\": 21}, \"call_id\": \"abc123def\"}[/TOOL_RESULTS]");
    expect_render(CHAT_MISTRAL, tmpl, "<s>", "</s>", CHAT_TOOLS_MISTRAL, CONV, CONV_T, 4, TOOLS, want);
    static const chat_msg last[] = {M(CHAT_SYSTEM, "Be brief."), M(CHAT_USER, "Time?")};
    expect_render(CHAT_MISTRAL, tmpl, "<s>", "</s>", CHAT_TOOLS_MISTRAL, last, NULL, 2, NULL,
                  "<s>[INST] Be brief.\n\nTime?[/INST]");
}

/* A family without tool support: the instructions join the system message, the rest as text. */
static void test_render_fallback(void **state)
{
    (void)state;
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_GEMMA, NULL, "<bos>", "<eos>"), VKI_OK);
    chat_tool_set *ts = tools_or_fail(TOOLS);
    chat_prompt p;
    char err[256] = "";
    assert_int_equal(chat_render_tools(&t, chat_tools_format(&t, NULL), CONV, CONV_T, 4, ts, true, &p, err, sizeof err),
                     VKI_OK);
    const char *want_parts[] = {"<start_of_turn>user\nYou are helpful.\n\n# Tools\n", "</tools>", "What's the weather",
                                "<start_of_turn>model\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                "{\"city\": \"Paris\"}}\n</tool_call><end_of_turn>",
                                "<start_of_turn>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><end_of_turn>"};
    for (size_t i = 0; i < sizeof want_parts / sizeof *want_parts; i++)
        if (!strstr(p.text, want_parts[i]))
            fail_msg("fallback rendering lacks \"%s\":\n%s", want_parts[i], p.text);
    chat_prompt_free(&p);
    chat_tools_free(ts);
    chat_template_free(&t);
}

static void test_errors(void **state)
{
    (void)state;
    static const struct {
        const char *json, *want;
    } bad[] = {
        {"{}", "tools must be an array"},
        {"[{\"type\": \"function\"}]", "tools[0].function must be an object"},
        {"[{\"type\": \"code\", \"function\": {\"name\": \"f\"}}]", "tools[0].type must be \"function\""},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]", "tools[0].function.name must be"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", \"function\": {\"name\": "
         "\"f\"}}]", "tools[1].function.name \"f\" is used twice"},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}]", "parameters must be"},
        {"[", "tools: not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        chat_tool_set *ts = NULL;
        char err[256] = "";
        assert_int_equal(chat_tools_parse(bad[i].json, strlen(bad[i].json), &ts, err, sizeof err), VKI_ERR_INVALID_ARG);
        if (!strstr(err, bad[i].want))
            fail_msg("%s: \"%s\" lacks \"%s\"", bad[i].json, err, bad[i].want);
    }
    chat_template t;
    chat_prompt p;
    char err[256];
    static const chat_tool_call two[2] = {{NULL, 0, "a", 1, "{}", 2}, {NULL, 0, "b", 1, "{}", 2}};
    static const chat_msg m[] = {M(CHAT_USER, "x"), M(CHAT_ASSISTANT, "")};
    static const chat_tool_msg tm[] = {{0}, {two, 2, NULL, 0}};
    assert_int_equal(chat_template_init(&t, CHAT_LLAMA3, "ipython", "", ""), VKI_OK);
    assert_int_equal(chat_render_tools(&t, CHAT_TOOLS_LLAMA3, m, tm, 2, NULL, false, &p, err, sizeof err),
                     VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "messages[1].tool_calls: the llama3 template takes one call per turn"));
    assert_int_equal(chat_template_init(&t, CHAT_MISTRAL, "[AVAILABLE_TOOLS]", "<s>", "</s>"), VKI_OK);
    assert_int_equal(chat_render_tools(&t, CHAT_TOOLS_MISTRAL, m, tm, 2, NULL, false, &p, err, sizeof err),
                     VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "messages[1].tool_calls[0].id: the mistral template needs 9 letters or digits"));
}

/* ---- forced calls -------------------------------------------------------------------------------- */


static gram_automaton *tool_grammar(gram_vocab *v, chat_tool_format f, const chat_tool_set *ts, const char *name,
                                    bool parallel, const char **prefix)
{
    strbuf g = {0};
    char err[256] = "";
    chat_tool_choice c = {name, name ? strlen(name) : 0, parallel};
    if (chat_tools_grammar(f, ts, &c, &g, prefix, err, sizeof err) != VKI_OK)
        fail_msg("tool grammar: %s", err);
    gram_grammar *gr;
    if (gram_parse(g.p, g.len, &gr, err, sizeof err) != VKI_OK)
        fail_msg("tool grammar refused: %s\n%s", err, g.p);
    gram_automaton *a;
    assert_int_equal(gram_automaton_create(gr, v, NULL, &a), VKI_OK);
    strbuf_free(&g);
    return a;
}

static void test_grammars(void **state)
{
    (void)state;
    gram_vocab *v;
    assert_int_equal(gram_vocab_create(256, vt_byte_piece, NULL, NULL, &v), VKI_OK);
    chat_tool_set *ts = tools_or_fail(TOOLS);
    const char *prefix;
    static const char w1[] = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    static const char t1[] = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}\n</tool_call>";
    char both[512];
    snprintf(both, sizeof both, "%s\n%s", w1, t1);
    gram_automaton *a = tool_grammar(v, CHAT_TOOLS_HERMES, ts, NULL, true, &prefix);
    assert_string_equal(prefix, "");
    assert_true(gram_accepts(a, w1, strlen(w1)) && gram_accepts(a, t1, strlen(t1)) && gram_accepts(a, both, strlen(both)));
    static const char *const no[] = {"", "hello", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
                                     "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
                                     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"mars\"}}\n</tool_call>"};
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        if (gram_accepts(a, no[i], strlen(no[i])))
            fail_msg("the hermes grammar accepts \"%s\"", no[i]);
    gram_automaton_free(a);
    a = tool_grammar(v, CHAT_TOOLS_HERMES, ts, "get_time", false, &prefix); /* named, one call */
    assert_true(gram_accepts(a, t1, strlen(t1)));
    assert_false(gram_accepts(a, w1, strlen(w1)) || gram_accepts(a, both, strlen(both)));
    gram_automaton_free(a);
    a = tool_grammar(v, CHAT_TOOLS_LLAMA3, ts, NULL, true, &prefix);
    static const char l1[] = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
    assert_true(gram_accepts(a, l1, strlen(l1)));
    assert_false(gram_accepts(a, w1, strlen(w1)));
    gram_automaton_free(a);
    a = tool_grammar(v, CHAT_TOOLS_MISTRAL, ts, NULL, true, &prefix);
    assert_string_equal(prefix, "[TOOL_CALLS]");
    static const char m2[] = " [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"get_time\","
                             " \"arguments\": {\"zone\": \"local\"}}]";
    assert_true(gram_accepts(a, m2, strlen(m2)));
    gram_automaton_free(a);
    strbuf g = {0};
    char err[256];
    chat_tool_choice c = {"missing", 7, false};
    assert_int_equal(chat_tools_grammar(CHAT_TOOLS_HERMES, ts, &c, &g, &prefix, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "tool_choice: no tool named \"missing\""));
    strbuf_free(&g);
    static const char bad_schema[] = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                                     "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"string\", \"pattern\": \"a(?!b)\"}}}}}]";
    chat_tool_set *bs = tools_or_fail(bad_schema);
    c = (chat_tool_choice){NULL, 0, false};
    assert_int_equal(chat_tools_grammar(CHAT_TOOLS_HERMES, bs, &c, &g, &prefix, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "tools[0].function.parameters/properties/x: pattern \"a(?!b)\": at offset 2: (?! groups are not supported"));
    strbuf_free(&g);
    chat_tools_free(bs);
    chat_tools_free(ts);
    gram_vocab_free(v);
}

/* ---- the parser ---------------------------------------------------------------------------------- */

typedef struct events {
    strbuf content, args[4];
    char names[4][32];
    uint32_t begins, ends;
    char bad[128];
} events;

static void on_event(void *user, const chat_tool_event *e)
{
    events *x = user;
    if (e->kind == CHAT_TOOL_CONTENT) {
        strbuf_put(&x->content, e->text, e->len);
    } else if (e->index >= 4) {
        snprintf(x->bad, sizeof x->bad, "call index %u", e->index);
    } else if (e->kind == CHAT_TOOL_CALL_BEGIN) {
        if (e->index != x->begins++ || x->ends != e->index)
            snprintf(x->bad, sizeof x->bad, "begin %u out of order", e->index);
        snprintf(x->names[e->index], 32, "%s", e->name);
        if (strncmp(e->id, "call_", 5) && strlen(e->id) != 9)
            snprintf(x->bad, sizeof x->bad, "id %s", e->id);
    } else if (e->kind == CHAT_TOOL_CALL_ARGS) {
        if (e->index + 1 != x->begins || x->ends != e->index)
            snprintf(x->bad, sizeof x->bad, "arguments of %u outside its call", e->index);
        strbuf_put(&x->args[e->index], e->text, e->len);
    } else if (e->index != x->ends++) {
        snprintf(x->bad, sizeof x->bad, "end %u out of order", e->index);
    }
}

typedef struct parse_case {
    chat_tool_format f;
    bool opened;
    const char *text;
    const char *content;       /* expected content */
    uint32_t n_calls;
    const char *name[2], *args[2];
    bool malformed;
} parse_case;

static const parse_case parse_cases[] = {
    {CHAT_TOOLS_HERMES, false,
     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
     "<tool_call>\n{\"arguments\": {\"zone\": \"utc\"}, \"name\": \"get_time\"}\n</tool_call>",
     "Let me check.\n\n", 2, {"get_weather", "get_time"}, {"{\"city\": \"Paris\"}", "{\"zone\": \"utc\"}"}, false},
    {CHAT_TOOLS_HERMES, false, "No tools needed: <tool_c is not a tag.", "No tools needed: <tool_c is not a tag.", 0,
     {0}, {0}, false},
    {CHAT_TOOLS_HERMES, false, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"utc\\\"}\"}\n</tool_call>",
     "", 1, {"get_time"}, {"{\"zone\": \"utc\"}"}, false},
    {CHAT_TOOLS_HERMES, false, "<tool_call>\n{\"name\": \"get_time\", \"argum", "", 1, {"get_time"}, {""}, true},
    {CHAT_TOOLS_HERMES, false, "<tool_call>\nnot json</tool_call>", "<tool_call>\nnot json</tool_call>", 0, {0}, {0},
     true},
    {CHAT_TOOLS_LLAMA3, false, "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\", \"n\": [1, 2]}}", "",
     1, {"get_weather"}, {"{\"city\": \"Rome\", \"n\": [1, 2]}"}, false},
    {CHAT_TOOLS_LLAMA3, false, "{\"name\": \"not_a_tool\", \"x\": 1}", "{\"name\": \"not_a_tool\", \"x\": 1}", 0, {0},
     {0}, false},
    {CHAT_TOOLS_LLAMA3, false, "Paris is sunny {today}.", "Paris is sunny {today}.", 0, {0}, {0}, false},
    {CHAT_TOOLS_MISTRAL, true, " [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": "
     "\"get_time\", \"arguments\": {\"zone\": \"local\"}}]", "", 2, {"get_weather", "get_time"},
     {"{\"city\": \"Oslo\"}", "{\"zone\": \"local\"}"}, false},
    {CHAT_TOOLS_MISTRAL, false, "Sure.[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}]",
     "Sure.", 1, {"get_time"}, {"{\"zone\": \"utc\"}"}, false},
};

/* Parses text pushed in pieces of `step` bytes (0: random sizes) and checks the results and the
 * events against the case. */
static void parse_one(const parse_case *pc, const chat_tool_set *ts, size_t step, vt_rng *rng, size_t ci)
{
    chat_tool_parser *p;
    assert_int_equal(chat_tool_parser_create(pc->f, pc->opened, ts, 7, &p), VKI_OK);
    events ev = {0};
    size_t n = strlen(pc->text);
    for (size_t i = 0; i < n;) {
        size_t k = step ? step : vt_range(rng, 1, 7);
        k = k < n - i ? k : n - i;
        assert_int_equal(chat_tool_parser_push(p, pc->text + i, k, on_event, &ev), VKI_OK);
        i += k;
    }
    assert_int_equal(chat_tool_parser_finish(p, on_event, &ev), VKI_OK);
    size_t clen;
    const char *content = chat_tool_parser_content(p, &clen);
    if (ev.bad[0] || strcmp(content, pc->content) || chat_tool_parser_calls(p) != pc->n_calls ||
        chat_tool_parser_malformed(p) != pc->malformed || ev.content.len != clen ||
        (clen && memcmp(ev.content.p, content, clen)))
        fail_msg("case %zu (step %zu): content \"%s\" (want \"%s\"), %u calls (want %u), malformed %d, events: %s",
                 ci, step, content, pc->content, chat_tool_parser_calls(p), pc->n_calls, chat_tool_parser_malformed(p),
                 ev.bad);
    for (uint32_t i = 0; i < pc->n_calls; i++) {
        const char *name, *args;
        chat_tool_parser_call(p, i, &name, &args);
        if (strcmp(name, pc->name[i]) || strcmp(args, pc->args[i]) || strcmp(ev.names[i], name) ||
            (pc->args[i][0] && (!ev.args[i].p || strcmp(ev.args[i].p, args))))
            fail_msg("case %zu call %u: %s(%s), streamed %s(%s); want %s(%s)", ci, i, name, args, ev.names[i],
                     ev.args[i].p ? ev.args[i].p : "", pc->name[i], pc->args[i]);
    }
    assert_int_equal(ev.begins, pc->n_calls);
    assert_int_equal(ev.ends, pc->n_calls);
    strbuf_free(&ev.content);
    for (int i = 0; i < 4; i++)
        strbuf_free(&ev.args[i]);
    chat_tool_parser_free(p);
}

static void test_parser(void **state)
{
    (void)state;
    vt_rng rng = vt_rng_seeded("tool parser");
    chat_tool_set *ts = tools_or_fail(TOOLS);
    for (size_t c = 0; c < sizeof parse_cases / sizeof *parse_cases; c++) {
        for (size_t step = 1; step <= 3; step++)
            parse_one(&parse_cases[c], ts, step, &rng, c);
        parse_one(&parse_cases[c], ts, 100000, &rng, c);
        for (int r = 0; r < 5; r++)
            parse_one(&parse_cases[c], ts, 0, &rng, c);
    }
    chat_tools_free(ts);
}

/* Random members of each forced-call grammar's language parse back into calls of known
 * functions with JSON-object arguments (what the grammar generated is what the parser reads). */
static void test_grammar_round_trip(void **state)
{
    (void)state;
    vt_rng rng = vt_rng_seeded("tool round trip");
    gram_vocab *v;
    assert_int_equal(gram_vocab_create(256, vt_byte_piece, NULL, NULL, &v), VKI_OK);
    chat_tool_set *ts = tools_or_fail(TOOLS);
    const chat_tool_format fs[] = {CHAT_TOOLS_HERMES, CHAT_TOOLS_LLAMA3, CHAT_TOOLS_MISTRAL};
    uint32_t total = 0;
    for (size_t fi = 0; fi < 3; fi++) {
        const char *prefix;
        gram_automaton *a = tool_grammar(v, fs[fi], ts, NULL, true, &prefix);
        for (int it = 0; it < 12; it++) {
            char text[8192];
            size_t n = 0;
            gram_state q;
            assert_int_equal(gram_start(a, &q, NULL, 0), VKI_OK);
            while (!gram_is_final(a, q) && n + 1 < sizeof text) { /* printable bytes, ends favoured */
                const uint32_t *m;
                uint32_t allowed;
                assert_int_equal(gram_mask(a, q, &m, &allowed, NULL, 0), VKI_OK);
                if (gram_can_end(a, q) && (vt_range(&rng, 0, 3) == 0 || n > 1024)) /* several calls, not 50 */
                    break;
                uint32_t ok[256], k = 0;
                for (uint32_t b = 0x20; b < 0x7F; b++)
                    if (m[b >> 5] >> (b & 31) & 1)
                        ok[k++] = b;
                for (uint32_t b = '\t'; b <= '\n'; b++) /* whitespace rarely, unless it is all there is */
                    if (m[0] >> b & 1 && (!k || vt_range(&rng, 0, 20) == 0))
                        ok[k++] = b;
                assert_true(k > 0);
                /* prefer closing characters so the walk ends */
                uint32_t pick = ok[vt_range(&rng, 0, k - 1)];
                for (uint32_t j = 0; j < k; j++)
                    if ((ok[j] == '"' || ok[j] == '}' || ok[j] == ']') && vt_range(&rng, 0, 1))
                        pick = ok[j];
                text[n++] = (char)pick;
                char c = (char)pick;
                assert_int_equal(gram_advance_bytes(a, q, &c, 1, &q, NULL, 0), VKI_OK);
            }
            text[n] = 0;
            chat_tool_parser *p;
            assert_int_equal(chat_tool_parser_create(fs[fi], prefix[0] != 0, ts, it, &p), VKI_OK);
            assert_int_equal(chat_tool_parser_push(p, text, n, NULL, NULL), VKI_OK);
            assert_int_equal(chat_tool_parser_finish(p, NULL, NULL), VKI_OK);
            if (!gram_can_end(a, q) || chat_tool_parser_malformed(p) || !chat_tool_parser_calls(p))
                fail_msg("%s: \"%s\" gave %u calls, malformed %d", chat_tools_format_name(fs[fi]), text,
                         chat_tool_parser_calls(p), chat_tool_parser_malformed(p));
            for (uint32_t i = 0; i < chat_tool_parser_calls(p); i++) {
                const char *name, *args;
                chat_tool_parser_call(p, i, &name, &args);
                json_doc *d;
                assert_true(!strcmp(name, "get_weather") || !strcmp(name, "get_time"));
                if (json_parse(args, strlen(args), &d, NULL, 0) != VKI_OK)
                    fail_msg("arguments \"%s\" are not JSON (from \"%s\")", args, text);
                assert_int_equal(json_root(d)->type, JSON_OBJECT);
                json_free(d);
                total++;
            }
            chat_tool_parser_free(p);
        }
        gram_automaton_free(a);
    }
    print_message("%u generated calls parsed back\n", total);
    chat_tools_free(ts);
    gram_vocab_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_qwen25),     cmocka_unit_test(test_render_llama31),
        cmocka_unit_test(test_render_mistral_v3), cmocka_unit_test(test_render_fallback),
        cmocka_unit_test(test_errors),            cmocka_unit_test(test_grammars),
        cmocka_unit_test(test_parser),            cmocka_unit_test(test_grammar_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
