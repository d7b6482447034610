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

#include "host/chat/chat_harmony.h"
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

/* gpt-oss's tools: the harmony cookbook's example functions, and one more for the types they lack.
 * The expected namespace is the cookbook's text but for the comma the template writes after a
 * default's comment (", // default: celsius,\n"; the harmony library, which printed the
 * cookbook's, writes none). */
static const char H_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_location\", \"description\": \"Gets the location of "
    "the user.\"}}, {\"type\": \"function\", \"function\": {\"name\": \"get_current_weather\", \"description\": "
    "\"Gets the current weather in the provided location.\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"location\": {\"type\": \"string\", \"description\": \"The city and state, e.g. San Francisco, CA\"}, "
    "\"format\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"default\": \"celsius\"}}, "
    "\"required\": [\"location\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_multiple_weathers\", "
    "\"description\": \"Gets the current weather in the provided list of locations.\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"locations\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, "
    "\"description\": \"List of city and state, e.g. [\\\"San Francisco, CA\\\", \\\"New York, NY\\\"]\"}, "
    "\"format\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"default\": \"celsius\"}}, "
    "\"required\": [\"locations\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"set_alarm\", "
    "\"description\": \"Sets an alarm.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"hour\": "
    "{\"type\": \"integer\"}, \"loud\": {\"type\": \"boolean\", \"default\": false}, \"repeat\": {\"type\": "
    "\"object\", \"properties\": {\"days\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, \"until\": "
    "{\"type\": \"string\"}}, \"required\": [\"days\"]}, \"note\": {\"type\": \"string\", \"nullable\": true}, "
    "\"tags\": {\"type\": [\"string\", \"number\"]}}, \"required\": [\"hour\"]}}}]";

#define H_NAMESPACE                                                                                               \
    "# Tools\n\n## functions\n\nnamespace functions {\n\n// Gets the location of the user.\ntype get_location = () " \
    "=> any;\n\n// Gets the current weather in the provided location.\ntype get_current_weather = (_: {\n// The "   \
    "city and state, e.g. San Francisco, CA\nlocation: string,\nformat?: \"celsius\" | \"fahrenheit\", // default: "  \
    "celsius,\n}) => any;\n\n// Gets the current weather in the provided list of locations.\ntype "                  \
    "get_multiple_weathers = (_: {\n// List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]\n"      \
    "locations: string[],\nformat?: \"celsius\" | \"fahrenheit\", // default: celsius,\n}) => any;\n\n"              \
    "// Sets an alarm.\ntype set_alarm = (_: {\nhour: number,\nloud?: boolean, // default: false,\nrepeat?: {\n"      \
    "days: \n                number[], until?: \n                string},\nnote?: string | null,\ntags?: string | "   \
    "number,\n}) => any;\n\n} // namespace functions"

#define H_SYS_TOOLS                                                                                          \
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: " \
    "2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. "  \
    "Channel must be included for every message.\nCalls to these tools must go to the commentary channel: "    \
    "'functions'.<|end|>"

/* Long texts: printed whole (cmocka's message buffer would cut them). */
static void expect_text(const char *got, const char *want, const char *what)
{
    if (!strcmp(got, want))
        return;
    size_t i = 0;
    while (got[i] && got[i] == want[i])
        i++;
    printf("%s: differs at byte %zu\n--- got ---\n%s\n--- want ---\n%s\n", what, i, got, want);
    fail_msg("%s: differs at byte %zu", what, i);
}

static vki_status harmony_render(const chat_msg *m, const chat_tool_msg *tm, size_t n, const char *tools,
                                 chat_prompt *p, char *err, size_t n_err)
{
    chat_template t;
    assert_int_equal(chat_template_init(&t, CHAT_HARMONY, NULL, "<|startoftext|>", "<|return|>"), VKI_OK);
    assert_int_equal(chat_tools_format(&t, NULL), CHAT_TOOLS_HARMONY);
    snprintf(t.date, sizeof t.date, "2025-06-28");
    t.effort = CHAT_EFFORT_HIGH;
    chat_tool_set *ts = tools ? tools_or_fail(tools) : NULL;
    vki_status st = chat_render_tools(&t, CHAT_TOOLS_HARMONY, m, tm, n, ts, true, p, err, n_err);
    chat_tools_free(ts);
    chat_template_free(&t);
    return st;
}

/* openai/gpt-oss-20b's template with tools (strings worked out by hand from its Jinja, whitespace
 * control included: the newline and 16 spaces it leaves before a nested member's type): the
 * system message's commentary line, the TypeScript namespace in the developer message after the
 * instructions, the call's text before it as analysis while no answer follows, the call with its
 * arguments as tojson writes them, the result as a message from the function, tojson'd. */
static void test_render_harmony(void **state)
{
    (void)state;
    static const chat_msg m[] = {M(CHAT_SYSTEM, "Always respond in riddles"), M(CHAT_USER, "Weather in SF?"),
                                 M(CHAT_ASSISTANT, "Need the weather tool."), M(CHAT_TOOL, "{\"sunny\": true}"),
                                 M(CHAT_ASSISTANT, "It is sunny."), M(CHAT_USER, "Thanks")};
    static const char args[] = "{\"location\":\"San Francisco, CA\"}";
    static const chat_tool_call call = {NULL, 0, "get_current_weather", 19, args, sizeof args - 1};
    static const chat_tool_msg tm[] = {{0}, {0}, {&call, 1, NULL, 0}, {0}, {0}, {0}};
    static const char head[] = H_SYS_TOOLS "<|start|>developer<|message|># Instructions\n\nAlways respond in "
                               "riddles\n\n" H_NAMESPACE "<|end|><|start|>user<|message|>Weather in SF?<|end|>";
    static const char call_text[] = "<|start|>assistant to=functions.get_current_weather<|channel|>commentary json"
                                    "<|message|>{\"location\": \"San Francisco, CA\"}<|call|>";
    static const char result[] = "<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>"
                                 "\"{\\\"sunny\\\": true}\"<|end|>";
    char want[8192], err[256] = "";
    chat_prompt p;
    /* the call's turn last: its text rendered as analysis */
    snprintf(want, sizeof want, "%s<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>%s%s"
             "<|start|>assistant", head, call_text, result);
    if (harmony_render(m, tm, 4, H_TOOLS, &p, err, sizeof err) != VKI_OK)
        fail_msg("harmony tools: %s", err);
    expect_text(p.text, want, "harmony tools");
    chat_prompt_free(&p);
    /* an answer came after it: the call's analysis is dropped */
    snprintf(want, sizeof want, "%s%s%s<|start|>assistant<|channel|>final<|message|>It is sunny.<|end|><|start|>user"
             "<|message|>Thanks<|end|><|start|>assistant", head, call_text, result);
    assert_int_equal(harmony_render(m, tm, 6, H_TOOLS, &p, err, sizeof err), VKI_OK);
    expect_text(p.text, want, "harmony tools, answered");
    /* the function's name and arguments are the request's: content, not template text */
    size_t name_at = (size_t)(strstr(p.text, "get_current_weather<|channel|>commentary json") - p.text);
    for (size_t k = 0; k < p.n_tmpl; k++)
        assert_false(p.tmpl[k].off <= name_at && name_at < p.tmpl[k].off + p.tmpl[k].len);
    chat_prompt_free(&p);
    /* a call with no tools given (tool_choice none) and no system message: no developer message */
    snprintf(want, sizeof want, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
             "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n# Valid channels: analysis, "
             "commentary, final. Channel must be included for every message.<|end|><|start|>user<|message|>Weather in "
             "SF?<|end|>%s%s<|start|>assistant", call_text, result);
    static const chat_msg m2[] = {M(CHAT_USER, "Weather in SF?"), M(CHAT_ASSISTANT, ""),
                                  M(CHAT_TOOL, "{\"sunny\": true}")};
    static const chat_tool_msg tm2[] = {{0}, {&call, 1, NULL, 0}, {0}};
    assert_int_equal(harmony_render(m2, tm2, 3, NULL, &p, err, sizeof err), VKI_OK);
    expect_text(p.text, want, "harmony, no tools");
    chat_prompt_free(&p);
    /* a result with no call before it: upstream raises */
    static const chat_msg orphan[] = {M(CHAT_USER, "x"), M(CHAT_TOOL, "y")};
    assert_int_equal(harmony_render(orphan, NULL, 2, H_TOOLS, &p, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "messages[1].role"));
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
                                    bool parallel, strbuf *prefix)
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
    strbuf prefix = {0};
    static const char w1[] = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    static const char t1[] = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}\n</tool_call>";
    char both[512];
    snprintf(both, sizeof both, "%s\n%s", w1, t1);
    gram_automaton *a = tool_grammar(v, CHAT_TOOLS_HERMES, ts, NULL, true, &prefix);
    assert_string_equal(prefix.p, "");
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
    assert_string_equal(prefix.p, "[TOOL_CALLS]");
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
    /* harmony: one function's header is the prompt's and only its arguments are generated; with
     * several, the prefix stops at "to=functions." and the grammar writes the name onwards */
    static const char h1[] = "{\"zone\": \"utc\"}", h2[] = "get_time <|constrain|>json<|message|>{\"zone\": \"local\"}";
    a = tool_grammar(v, CHAT_TOOLS_HARMONY, ts, "get_time", true, &prefix);
    assert_string_equal(prefix.p, "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>");
    assert_true(gram_accepts(a, h1, strlen(h1)));
    assert_false(gram_accepts(a, h2, strlen(h2)));
    gram_automaton_free(a);
    a = tool_grammar(v, CHAT_TOOLS_HARMONY, ts, NULL, true, &prefix);
    assert_string_equal(prefix.p, "<|channel|>commentary to=functions.");
    assert_true(gram_accepts(a, h2, strlen(h2)));
    assert_false(gram_accepts(a, h1, strlen(h1)));
    gram_automaton_free(a);
    chat_tools_free(ts);
    strbuf_free(&prefix);
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
    /* harmony: the spelling chat_harmony writes (opened is ignored: the spelling is always there) */
    {CHAT_TOOLS_HARMONY, true, "Let me look.<|start|>assistant to=functions.get_weather<|channel|>commentary json"
     "<|message|>{\"city\": \"Paris\"}<|call|>", "Let me look.", 1, {"get_weather"}, {"{\"city\": \"Paris\"}"}, false},
    {CHAT_TOOLS_HARMONY, false, "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>"
     "{\"zone\": \"<|c\"}<|call|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
     "{}<|call|>", "",
     2, {"get_time", "get_weather"}, {"{\"zone\": \"<|c\"}", "{}"}, false},
    {CHAT_TOOLS_HARMONY, false, "<|start|>assistant to=functions.get_time<|channel|>comm", "", 1, {"get_time"}, {""},
     true},
    {CHAT_TOOLS_HARMONY, false, "<|start|>assistant to=functions.<|channel|>x", "<|start|>assistant to=functions."
     "<|channel|>x", 0, {0}, {0}, true},
    {CHAT_TOOLS_HARMONY, false, "a <|start|>assistant<|channel|>final", "a <|start|>assistant<|channel|>final", 0, {0},
     {0}, false},
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

/* ---- harmony's replies ------------------------------------------------------------------------ */

typedef struct split_case {
    const char *prompt;       /* the prompt's last message (template text) the splitter is primed with */
    bool raw;                 /* raw_analysis (reasoning_format "none") */
    const char *text, *reasoning, *content;
} split_case;

#define GEN "<|start|>assistant"
#define CALL_W "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
static const split_case split_cases[] = {
    {GEN, false, "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>"
     "Hello!", "User says hi.", "Hello!"},
    {GEN, false, "<|channel|>final<|message|>Just this.", "", "Just this."},          /* no analysis part */
    {GEN, false, "<|channel|>final<|message|>A<|return|>", "", "A"},                  /* the end shown */
    {GEN, false, "Plain text, no format.", "", "Plain text, no format."},              /* ignores the format */
    {GEN, false, "<|channel|>analysis<|message|>cut off", "cut off", ""},             /* max_tokens in the analysis */
    {GEN, false, "<|channel|>analysis<|message|>T<|end|><|start|>assistant<|chan", "T", ""}, /* in a header */
    {GEN, false, "<|channel|>final<|message|>a<b <|x|> <|end c", "", "a<b <|x|> <|end c"},  /* not markers */
    {GEN, false, "<|channel|>analysis<|message|>x<|end|>\n<|start|>assistant<|channel|>commentary<|message|>Looking."
     "<|end|><|start|>assistant<|channel|>final<|message|>Done.", "x", "Looking.Done."},    /* a preamble: content */
    {GEN, true, "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>ok",
     "", "<|channel|>analysis<|message|>hm<|end|>ok"},                                      /* reasoning_format none */
    /* calls, the recipient after the channel or after the role, any content type */
    {GEN, false, "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}", "Need it.",
     CALL_W "{\"city\": \"Paris\"}<|call|>"},
    {GEN, false, " to=functions.get_weather<|channel|>commentary json<|message|>{}<|call|>", "", CALL_W "{}<|call|>"},
    {GEN, false, "<|channel|>commentary to=functions.get_weather<|message|>", "", CALL_W "<|call|>"},
    {GEN, false, "<|channel|>commentary to=python<|message|>print(1)", "", "print(1)"},   /* not a function: content */
    /* primed elsewhere: a continued final answer, a forced call's header (named, and any) */
    {"<|start|>assistant<|channel|>final<|message|>It is", false, " sunny.", "", " sunny."},
    {"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>", false,
     "{\"city\": \"Oslo\"}", "", CALL_W "{\"city\": \"Oslo\"}<|call|>"},
    {"<|start|>assistant<|channel|>commentary to=functions.", false, "get_weather <|constrain|>json<|message|>{}", "",
     CALL_W "{}<|call|>"},
    {"<|start|>user<|message|>hi<|end|>", false, "<|start|>assistant<|channel|>final<|message|>yo", "", "yo"},
};

/* The text fed in pieces of `step` bytes (0: random sizes). */
static void split_one(const split_case *sc, size_t step, vt_rng *rng, size_t ci)
{
    chat_prompt p = {0};
    assert_int_equal(chat_prompt_append(&p, "<|start|>system<|message|>S<|end|>", 34, true), VKI_OK);
    assert_int_equal(chat_prompt_append(&p, sc->prompt, strlen(sc->prompt), true), VKI_OK);
    chat_harmony h;
    chat_harmony_init(&h, sc->raw);
    chat_harmony_prime(&h, &p);
    chat_prompt_free(&p);
    strbuf r = {0}, c = {0};
    strbuf_put(&r, "", 0), strbuf_put(&c, "", 0);
    size_t n = strlen(sc->text);
    for (size_t i = 0; i < n;) {
        size_t k = step ? step : vt_range(rng, 1, 9);
        k = k < n - i ? k : n - i;
        assert_true(chat_harmony_feed(&h, sc->text + i, k, false, &r, &c));
        i += k;
    }
    assert_true(chat_harmony_feed(&h, "", 0, true, &r, &c));
    if (strcmp(r.p, sc->reasoning) || strcmp(c.p, sc->content))
        fail_msg("split case %zu (step %zu): reasoning [%s] content [%s], want [%s] [%s]", ci, step, r.p, c.p,
                 sc->reasoning, sc->content);
    strbuf_free(&r), strbuf_free(&c);
}

/* gpt-oss's reply split into reasoning, content and calls the same way at every split of its
 * text (markers cut across pieces), from where the prompt left it. */
static void test_harmony_split(void **state)
{
    (void)state;
    vt_rng rng = vt_rng_seeded("harmony split");
    for (size_t c = 0; c < sizeof split_cases / sizeof *split_cases; c++) {
        for (size_t step = 1; step <= 3; step++)
            split_one(&split_cases[c], step, &rng, c);
        split_one(&split_cases[c], 100000, &rng, c);
        for (int k = 0; k < 5; k++)
            split_one(&split_cases[c], 0, &rng, c);
    }
    /* the splitter's calls are what the parser reads */
    chat_harmony h;
    chat_harmony_init(&h, false);
    strbuf content = {0};
    static const char reply[] = "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary "
                                "to=functions.get_time <|constrain|>json<|message|>{\"zone\": \"utc\"}";
    assert_true(chat_harmony_feed(&h, reply, sizeof reply - 1, true, NULL, &content));
    chat_tool_parser *tp;
    assert_int_equal(chat_tool_parser_create(CHAT_TOOLS_HARMONY, false, NULL, 1, &tp), VKI_OK);
    assert_int_equal(chat_tool_parser_push(tp, content.p, content.len, NULL, NULL), VKI_OK);
    assert_int_equal(chat_tool_parser_finish(tp, NULL, NULL), VKI_OK);
    const char *name, *args;
    assert_int_equal(chat_tool_parser_calls(tp), 1);
    chat_tool_parser_call(tp, 0, &name, &args);
    assert_string_equal(name, "get_time");
    assert_string_equal(args, "{\"zone\": \"utc\"}");
    chat_tool_parser_free(tp);
    strbuf_free(&content);
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
    const chat_tool_format fs[] = {CHAT_TOOLS_HERMES, CHAT_TOOLS_LLAMA3, CHAT_TOOLS_MISTRAL, CHAT_TOOLS_HARMONY};
    uint32_t total = 0;
    strbuf prefix = {0}, harmony = {0};
    for (size_t fi = 0; fi < 4; fi++) {
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
            const char *out = text;
            if (fs[fi] == CHAT_TOOLS_HARMONY) { /* the reply goes through the splitter, primed with the prefix */
                chat_prompt pr = {0};
                chat_harmony h;
                chat_harmony_init(&h, false);
                assert_int_equal(chat_prompt_append(&pr, "<|start|>assistant", 18, true), VKI_OK);
                assert_int_equal(chat_prompt_append(&pr, prefix.p, prefix.len, true), VKI_OK);
                chat_harmony_prime(&h, &pr);
                chat_prompt_free(&pr);
                strbuf_clear(&harmony);
                assert_true(chat_harmony_feed(&h, text, n, true, NULL, &harmony));
                out = harmony.p, n = harmony.len;
            }
            chat_tool_parser *p;
            assert_int_equal(chat_tool_parser_create(fs[fi], prefix.len != 0, ts, it, &p), VKI_OK);
            assert_int_equal(chat_tool_parser_push(p, out, n, NULL, NULL), VKI_OK);
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
    strbuf_free(&prefix);
    strbuf_free(&harmony);
    chat_tools_free(ts);
    gram_vocab_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_qwen25),     cmocka_unit_test(test_render_llama31),
        cmocka_unit_test(test_render_mistral_v3), cmocka_unit_test(test_render_harmony),
        cmocka_unit_test(test_render_fallback),
        cmocka_unit_test(test_errors),            cmocka_unit_test(test_grammars),
        cmocka_unit_test(test_parser),            cmocka_unit_test(test_harmony_split),
        cmocka_unit_test(test_grammar_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
