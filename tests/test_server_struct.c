/* Structured output and tool calling over HTTP (host/server/server_struct.c), in process over
 * stories260K (or the synthetic model) with test_server.c's fixture and client helpers: the tiny
 * model writes gibberish, so the check is that constrained outputs are in their grammar's
 * language (vt_in_grammar, byte by byte, independent of the server's matcher) and parse as JSON.
 * response_format json_object / json_schema, grammar, guided_choice, guided_json, llama-server's
 * json_schema, streamed and not, completions and chat; tools with tool_choice required (one call,
 * and parallel calls), a named function streamed as OpenAI streams delta.tool_calls (reassembled
 * here), auto (free text, and a call the parser finds), none (the tools are not rendered); a tool
 * result turn rendered as chat_render_tools renders it; errors: 400s naming the field with the
 * rule / keyword and position, and a request that its grammar kills mid-way (500, or an error
 * event then [DONE] when streaming). Sampling seeds come from VKI_TEST_SEED (printed). */
#define TEST_SERVER_NO_MAIN
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-const-variable"
#include "test_server.c"

#include "host/chat/chat_tools.h"

static uint64_t g_seed; /* the requests' sampling seed (each adds its own offset) */

/* The GBNF of a JSON Schema (the server's converter; vt_in_grammar then checks independently). */
static char *schema_gbnf(const char *schema)
{
    size_t need = 0;
    char err[256];
    vki_status st = vki_json_schema_to_grammar(schema, strlen(schema), NULL, 0, &need, err, sizeof err);
    assert_true(st == VKI_ERR_INVALID_ARG && need > 0);
    char *g = malloc(need);
    assert_int_equal(vki_json_schema_to_grammar(schema, strlen(schema), g, need, &need, err, sizeof err), VKI_OK);
    return g;
}

static void expect_in(const char *gbnf, const char *text, const char *what)
{
    if (!vt_in_grammar(gbnf, strlen(gbnf), text, strlen(text)))
        fail_msg("%s: \"%s\" is not in the language of\n%s", what, text, gbnf);
}

/* A JSON value's text that parses (the model's output), parsed. */
static cJSON *parse_out(const char *text, const char *what)
{
    cJSON *v = cJSON_Parse(text);
    if (!v)
        fail_msg("%s: not JSON: %s", what, text);
    return v;
}

/* The text of a stream: completions' text or chat's delta.content, and the last finish reason. */
static char *stream_text(const cJSON *events, bool chat, const char **finish)
{
    strbuf b = {0};
    strbuf_put(&b, "", 0);
    *finish = NULL;
    for (const cJSON *ev = events->child; ev; ev = ev->next) {
        const cJSON *t = vt_json_get(ev, chat ? "choices.0.delta.content" : "choices.0.text"),
                    *f = vt_json_get(ev, "choices.0.finish_reason");
        if (cJSON_IsString(t))
            strbuf_put(&b, t->valuestring, strlen(t->valuestring));
        if (cJSON_IsString(f))
            *finish = f->valuestring;
    }
    return b.p;
}

static cJSON *post(T *t, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cJSON *post(T *t, const char *path, const char *fmt, ...)
{
    char body[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    return http_json(t, "POST", path, body, 200);
}

#define CHAT "/v1/chat/completions"
#define CMPL "/v1/completions"
#define USER "\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about a cat.\"}]"

/* max_tokens below cover the worst case of each grammar in bytes (each token is at least one):
 * 21 whitespace bytes at each ws of vki_json_schema_to_grammar's output, 6 bytes per string
 * character (\uXXXX), 17 per integer, plus the literals and the Hermes call wrapper. PERSON: 16
 * ws, 464 bytes; the time call 154; the weather call 313. So a constrained output always
 * completes whatever the seed (typical outputs take a fifth of it). */
#define PERSON_MAX "480"
#define TIME_MAX "200"
#define ANY_CALL_MAX "330"
static const char PERSON[] = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                             "\"age\":{\"type\":\"integer\"},\"pets\":{\"type\":\"array\",\"items\":{\"enum\":[\"cat\","
                             "\"dog\"]},\"maxItems\":2}},\"required\":[\"name\",\"age\",\"pets\"]}";

/* ---- response_format, grammar, guided_* ---------------------------------------------------- */

static void test_response_format(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    char *g_person = schema_gbnf(PERSON), *g_object = schema_gbnf("{\"type\":\"object\"}");
    /* chat, json_schema, not streamed */
    cJSON *r = post(t, CHAT, "{" USER ",\"max_tokens\":" PERSON_MAX ",\"seed\":%llu,\"response_format\":{\"type\":\"json_schema\","
                    "\"json_schema\":{\"name\":\"person\",\"strict\":true,\"schema\":%s}}}",
                    (unsigned long long)g_seed, PERSON);
    const char *text = vt_json_str(r, "choices.0.message.content");
    print_message("json_schema (chat): %s\n", text);
    assert_string_equal(vt_json_str(r, "choices.0.finish_reason"), "stop");
    expect_in(g_person, text, "json_schema");
    cJSON *v = parse_out(text, "json_schema");
    assert_true(cJSON_IsNumber(vt_json_get(v, "age")) && cJSON_IsString(vt_json_get(v, "name")) &&
                cJSON_IsArray(vt_json_get(v, "pets")));
    cJSON_Delete(v);
    cJSON_Delete(r);
    /* completions, json_object, streamed: the joined deltas are one JSON object (greedy: any
     * object has no length bound, and a sampled one may run past max_tokens) */
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":80,\"stream\":true,\"temperature\":0,"
             "\"response_format\":{\"type\":\"json_object\"}}");
    bool done;
    cJSON *ev = stream(t, CMPL, body, 0, &done);
    const char *finish;
    char *joined = stream_text(ev, false, &finish);
    print_message("json_object (completions, streamed): %s\n", joined);
    assert_true(done);
    assert_string_equal(finish, "stop");
    expect_in(g_object, joined, "json_object");
    cJSON_Delete(parse_out(joined, "json_object"));
    free(joined);
    cJSON_Delete(ev);
    /* chat, json_schema, streamed */
    snprintf(body, sizeof body, "{" USER ",\"max_tokens\":" PERSON_MAX ",\"stream\":true,\"seed\":%llu,\"response_format\":"
             "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":%s}}}",
             (unsigned long long)g_seed + 2, PERSON);
    ev = stream(t, CHAT, body, 0, &done);
    joined = stream_text(ev, true, &finish);
    assert_string_equal(finish, "stop");
    expect_in(g_person, joined, "json_schema (streamed)");
    free(joined);
    cJSON_Delete(ev);
    free(g_person);
    free(g_object);
    stop(t);
}

/* The other ways to ask: llama.cpp's grammar and json_schema, vLLM's guided_choice and guided_json
 * (as JSON text), llama-server's json_object with a schema; and what /props says. */
static void test_grammar_fields(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    static const char gbnf[] = "root ::= (\"yes\" | \"no\") \", \" [a-z]{2,6} \".\"";
    cJSON *r = post(t, CMPL, "{\"prompt\":\"Once\",\"max_tokens\":20,\"seed\":%llu,\"grammar\":\"root ::= (\\\"yes\\\" | "
                    "\\\"no\\\") \\\", \\\" [a-z]{2,6} \\\".\\\"\"}", (unsigned long long)g_seed + 3);
    expect_in(gbnf, vt_json_str(r, "choices.0.text"), "grammar");
    cJSON_Delete(r);
    r = post(t, CHAT, "{" USER ",\"max_tokens\":20,\"seed\":%llu,\"guided_choice\":[\"red \\\"x\\\"\",\"blue\\\\\"]}",
             (unsigned long long)g_seed + 4);
    const char *c = vt_json_str(r, "choices.0.message.content");
    assert_true(!strcmp(c, "red \"x\"") || !strcmp(c, "blue\\"));
    cJSON_Delete(r);
    static const char small[] = "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}";
    char *g = schema_gbnf(small);
    const char *forms[] = {"\"guided_json\":\"%s\"", "\"json_schema\":%s",
                           "\"response_format\":{\"type\":\"json_object\",\"schema\":%s}"};
    for (int i = 0; i < 3; i++) {
        char field[512], quoted[256];
        size_t k = 0;
        for (const char *p = small; *p; p++) /* as a JSON string for guided_json */
            k += (size_t)snprintf(quoted + k, sizeof quoted - k, *p == '"' ? "\\%c" : "%c", *p);
        snprintf(field, sizeof field, forms[i], i ? small : quoted);
        r = post(t, CMPL, "{\"prompt\":\"Once\",\"max_tokens\":160,\"seed\":%llu,%s}", (unsigned long long)g_seed + 5 + i,
                 field);
        if (i < 2) /* json_object's schema is llama-server's: an object is not required there */
            expect_in(g, vt_json_str(r, "choices.0.text"), forms[i]);
        cJSON_Delete(r);
    }
    free(g);
    r = http_json(t, "GET", "/props", NULL, 200);
    assert_true(cJSON_IsTrue(vt_json_get(r, "structured_output.tools")));
    assert_string_equal(vt_json_str(r, "structured_output.tool_call_format"), "hermes");
    assert_string_equal(vt_json_str(r, "structured_output.response_format.2"), "json_schema");
    cJSON_Delete(r);
    stop(t);
}

/* ---- errors -------------------------------------------------------------------------------- */

static const bad_case SBAD[] = {
    {CMPL, "{\"prompt\":\"x\",\"grammar\":\"root ::= valu\"}", 400, "grammar", "line 1, column 10: undefined rule 'valu'"},
    {CMPL, "{\"prompt\":\"x\",\"grammar\":\"root ::= [a-\"}", 400, "grammar", "column"},
    {CHAT, "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":"
     "\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true}}}}}}", 400, "response_format",
     "/properties/a: keyword 'uniqueItems' is not supported"},
    {CHAT, "{" USER ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}}", 400,
     "response_format", "json_schema.schema"},
    {CHAT, "{" USER ",\"response_format\":{\"type\":\"xml\"}}", 400, "response_format", "\"xml\""},
    {CMPL, "{\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\",\"guided_json\":{}}", 400, "guided_json", "only one"},
    {CMPL, "{\"prompt\":\"x\",\"guided_regex\":\"a+\"}", 400, "guided_regex", "regular expressions"},
    {CHAT, "{" USER ",\"reasoning_format\":\"r1\"}", 400, "reasoning_format", "reasoning_format must be"},
    {CMPL, "{\"prompt\":\"x\",\"guided_choice\":[]}", 400, "guided_choice", "non-empty"},
    {CMPL, "{\"prompt\":\"x\",\"tools\":[{\"type\":\"function\"}]}", 400, "tools", "not supported"},
    {CHAT, "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", 400, "tools",
     "tools[0].function.name"},
    {CHAT, "{" USER ",\"tool_choice\":\"required\"}", 400, "tool_choice", "no tools"},
    {CHAT, "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":"
     "\"function\",\"function\":{\"name\":\"g\"}}}", 400, "tool_choice", "no tool named \"g\""},
    {CHAT, "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"always\"}",
     400, "tool_choice", "tool_choice must be"},
    {CHAT, "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\","
     "\"grammar\":\"root ::= \\\"a\\\"\"}", 400, "tool_choice", "grammar"},
    {CHAT, "{" USER ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":"
     "\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"uri\"}}}}}],\"tool_choice\":\"required\"}",
     400, "tools", "keyword 'format': \"uri\" is not supported"},
    {CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
     "\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]}", 400, "messages",
     "messages[0].tool_calls[0].function.arguments"},
    {CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", 400, "messages",
     "only assistant"},
    {CHAT, "{\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}", 400, "messages", "messages[0].role"},
};

/* A request its grammar kills after "Once upon": the grammar is then complete and admits only
 * the end token, which min_tokens bans. */
static const char DEAD_END[] = "{\"prompt\":\"Once\",\"max_tokens\":20,\"min_tokens\":10,\"stream\":%s,"
                               "\"grammar\":\"root ::= \\\"Once upon\\\"\"}";

static void test_struct_errors(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    for (size_t i = 0; i < sizeof SBAD / sizeof SBAD[0]; i++) {
        const bad_case *c = &SBAD[i];
        char *out;
        int st = http(t, "POST", c->path, c->body, NULL, &out);
        cJSON *j = cJSON_Parse(out);
        const cJSON *param = vt_json_get(j, "error.param"), *msg = vt_json_get(j, "error.message");
        if (st != c->status || !cJSON_IsString(msg) || !strstr(msg->valuestring, c->in_msg) ||
            !cJSON_IsString(param) || strcmp(param->valuestring, c->param))
            fail_msg("%s %s: got %d %s", c->path, c->body, st, out);
        cJSON_Delete(j);
        free(out);
    }
    /* killed mid-way: not streamed, the engine-error answer; streamed, its text, an error event, [DONE] */
    char body[256], *out;
    snprintf(body, sizeof body, DEAD_END, "false");
    assert_int_equal(http(t, "POST", CMPL, body, NULL, &out), 500);
    cJSON *j = parse_out(out, "error");
    assert_string_equal(vt_json_str(j, "error.type"), "server_error");
    assert_non_null(strstr(vt_json_str(j, "error.message"), "no token could be sampled"));
    cJSON_Delete(j);
    free(out);
    snprintf(body, sizeof body, DEAD_END, "true");
    bool done;
    cJSON *ev = stream(t, CMPL, body, 0, &done);
    const char *finish;
    char *text = stream_text(ev, false, &finish);
    assert_true(done);
    assert_string_equal(text, "Once upon");
    assert_null(finish);
    const cJSON *last = cJSON_GetArrayItem(ev, cJSON_GetArraySize(ev) - 1);
    assert_non_null(strstr(vt_json_str(last, "error.message"), "no token could be sampled"));
    free(text);
    cJSON_Delete(ev);
    /* the server goes on */
    cJSON_Delete(post(t, CMPL, "{\"prompt\":\"Once\",\"max_tokens\":2}"));
    stop(t);
}

/* ---- tools --------------------------------------------------------------------------------- */

#define WEATHER_PARAMS "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\",\"days\"]}"
#define TIME_PARAMS "{\"type\":\"object\",\"properties\":{\"tz\":{\"enum\":[\"UTC\",\"CET\"]}},\"required\":[\"tz\"]}"
static const char TOOLS[] = "[{\"type\":\"function\",\"function\":{\"name\":\"weather\",\"description\":\"Forecast\","
                            "\"parameters\":" WEATHER_PARAMS "}},{\"type\":\"function\",\"function\":{\"name\":"
                            "\"time\",\"parameters\":" TIME_PARAMS "}}]";

/* A call's arguments: JSON in the language of its function's parameters. */
static void check_call(const char *name, const char *args, const char *what)
{
    char *g = schema_gbnf(!strcmp(name, "weather") ? WEATHER_PARAMS : TIME_PARAMS);
    if (strcmp(name, "weather") && strcmp(name, "time"))
        fail_msg("%s: unknown function \"%s\"", what, name);
    expect_in(g, args, what);
    cJSON_Delete(parse_out(args, what));
    free(g);
}

static void test_tools_forced(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    /* required, one call */
    cJSON *r = post(t, CHAT, "{" USER ",\"max_tokens\":" ANY_CALL_MAX ",\"seed\":%llu,\"tools\":%s,\"tool_choice\":\"required\","
                    "\"parallel_tool_calls\":false}", (unsigned long long)g_seed + 10, TOOLS);
    assert_string_equal(vt_json_str(r, "choices.0.finish_reason"), "tool_calls");
    assert_true(cJSON_IsNull(vt_json_get(r, "choices.0.message.content")));
    assert_int_equal(cJSON_GetArraySize(vt_json_get(r, "choices.0.message.tool_calls")), 1);
    assert_string_equal(vt_json_str(r, "choices.0.message.tool_calls.0.type"), "function");
    assert_int_equal(strncmp(vt_json_str(r, "choices.0.message.tool_calls.0.id"), "call_", 5), 0);
    check_call(vt_json_str(r, "choices.0.message.tool_calls.0.function.name"),
               vt_json_str(r, "choices.0.message.tool_calls.0.function.arguments"), "required");
    cJSON_Delete(r);
    /* parallel calls of the short function: the end token is biased away, so calls follow calls
     * up to max_tokens; every call but a cut last one is whole and valid. Greedy: sampled, a
     * call's whitespace (up to 21 characters at each of its ~10 `ws` places) could fill 100
     * tokens with one call (seed 6439951437431 did) */
    r = post(t, CHAT, "{" USER ",\"max_tokens\":100,\"temperature\":0,\"seed\":%llu,\"tools\":%s,\"tool_choice\":{\"type\":"
             "\"function\",\"function\":{\"name\":\"time\"}},\"logit_bias\":{\"%d\":-100}}",
             (unsigned long long)g_seed + 11, TOOLS,
             vki_token_eos(vki_engine_tokenizer(t->e)));
    const cJSON *calls = vt_json_get(r, "choices.0.message.tool_calls");
    int n = cJSON_GetArraySize(calls);
    print_message("parallel: %d calls, finish %s\n", n, vt_json_str(r, "choices.0.finish_reason"));
    assert_true(n >= 2);
    for (int i = 0; i < n - 1; i++) {
        char path[64];
        snprintf(path, sizeof path, "%d.function.name", i);
        const char *name = vt_json_str(calls, path);
        snprintf(path, sizeof path, "%d.function.arguments", i);
        check_call(name, vt_json_str(calls, path), "parallel");
        snprintf(path, sizeof path, "%d.id", i);
        if (i)
            assert_string_not_equal(vt_json_str(calls, path), vt_json_str(calls, "0.id"));
    }
    cJSON_Delete(r);
    stop(t);
}

/* A named function, streamed: the chunks are OpenAI's (a call's first chunk has index, id,
 * type, function.name and empty arguments; then only index and argument fragments), and the
 * calls reassembled from them are whole and valid. */
static void test_tools_stream(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    char body[2048];
    snprintf(body, sizeof body, "{" USER ",\"max_tokens\":" TIME_MAX ",\"stream\":true,\"seed\":%llu,\"tools\":%s,\"tool_choice\":"
             "{\"type\":\"function\",\"function\":{\"name\":\"time\"}},\"parallel_tool_calls\":false}",
             (unsigned long long)g_seed + 12, TOOLS);
    bool done;
    cJSON *ev = stream(t, CHAT, body, 0, &done);
    strbuf args = {0};
    strbuf_put(&args, "", 0);
    int begins = 0;
    const char *finish = NULL;
    for (const cJSON *e = ev->child; e; e = e->next) {
        const cJSON *tc = vt_json_get(e, "choices.0.delta.tool_calls"), *f = vt_json_get(e, "choices.0.finish_reason");
        finish = cJSON_IsString(f) ? f->valuestring : finish;
        const cJSON *dc = vt_json_get(e, "choices.0.delta.content");
        assert_false(cJSON_IsString(dc) && dc->valuestring[0]);
        if (!tc)
            continue;
        assert_int_equal(cJSON_GetArraySize(tc), 1);
        assert_int_equal(vt_json_num(tc, "0.index"), 0);
        if (vt_json_get(tc, "0.id")) { /* the first chunk of the call */
            begins++;
            assert_int_equal(strncmp(vt_json_str(tc, "0.id"), "call_", 5), 0);
            assert_string_equal(vt_json_str(tc, "0.type"), "function");
            assert_string_equal(vt_json_str(tc, "0.function.name"), "time");
            assert_string_equal(vt_json_str(tc, "0.function.arguments"), "");
        } else {
            assert_null(vt_json_get(tc, "0.type"));
            assert_null(vt_json_get(tc, "0.function.name"));
            const char *frag = vt_json_str(tc, "0.function.arguments");
            strbuf_put(&args, frag, strlen(frag));
        }
    }
    print_message("named, streamed: time(%s)\n", args.p);
    assert_true(done);
    assert_int_equal(begins, 1);
    assert_string_equal(finish, "tool_calls");
    check_call("time", args.p, "named (streamed)");
    strbuf_free(&args);
    cJSON_Delete(ev);
    stop(t);
}

/* auto: free text stays content; a call in the output (here forced by a grammar written in the
 * Hermes syntax) is parsed into tool_calls. none: the tools are not rendered and nothing is
 * parsed. */
static void test_tools_auto_none(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *r = post(t, CHAT, "{" USER ",\"max_tokens\":16,\"min_tokens\":4,\"seed\":%llu,\"tools\":%s}",
                    (unsigned long long)g_seed + 13, TOOLS); /* min_tokens: never an empty answer */
    assert_null(vt_json_get(r, "choices.0.message.tool_calls"));
    /* the synthetic stand-in (no ../shared) may sample tokens that print nothing (special ones) */
    assert_true(strlen(vt_json_str(r, "choices.0.message.content")) > 0 ||
                (!t->stories && vt_json_num(r, "usage.completion_tokens") >= 4));
    assert_string_not_equal(vt_json_str(r, "choices.0.finish_reason"), "tool_calls");
    double with_tools = vt_json_num(r, "usage.prompt_tokens");
    cJSON_Delete(r);
    r = post(t, CHAT, "{" USER ",\"max_tokens\":100,\"seed\":%llu,\"tools\":%s,\"tool_choice\":\"auto\",\"grammar\":"
             "\"root ::= [A-Za-z]{1,3} \\\"<tool_call>\\\\n{\\\\\\\"name\\\\\\\": \\\\\\\"time\\\\\\\", "
             "\\\\\\\"arguments\\\\\\\": {\\\\\\\"tz\\\\\\\": \\\\\\\"UTC\\\\\\\"}}\\\\n</tool_call>\\\"\"}",
             (unsigned long long)g_seed + 14, TOOLS);
    assert_string_equal(vt_json_str(r, "choices.0.finish_reason"), "tool_calls");
    assert_string_equal(vt_json_str(r, "choices.0.message.tool_calls.0.function.name"), "time");
    assert_string_equal(vt_json_str(r, "choices.0.message.tool_calls.0.function.arguments"), "{\"tz\": \"UTC\"}");
    assert_true(strlen(vt_json_str(r, "choices.0.message.content")) >= 1); /* the text before the call */
    cJSON_Delete(r);
    r = post(t, CHAT, "{" USER ",\"max_tokens\":4,\"tools\":%s,\"tool_choice\":\"none\"}", TOOLS);
    chat_msg m = {CHAT_USER, "Tell me about a cat.", 20};
    assert_int_equal(vt_json_num(r, "usage.prompt_tokens"), plain_chat_tokens(t, &m, 1));
    assert_true(vt_json_num(r, "usage.prompt_tokens") < with_tools);
    assert_null(vt_json_get(r, "choices.0.message.tool_calls"));
    cJSON_Delete(r);
    stop(t);
}

/* A tool result turn: the assistant's call (content null) and the tool's answer are rendered
 * as chat_render_tools renders them (the prompt's token count says so), and the next answer may
 * be another forced call. */
static void test_tool_result_turn(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    static const char args[] = "{\"city\": \"Paris\", \"days\": 2}";
    cJSON *r = post(t, CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\","
                    "\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
                    "\"weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 2}\"}}]},{\"role\":\"tool\","
                    "\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}],\"max_tokens\":" ANY_CALL_MAX ",\"seed\":%llu,\"tools\":%s,"
                    "\"tool_choice\":\"required\",\"parallel_tool_calls\":false}", (unsigned long long)g_seed + 15, TOOLS);
    check_call(vt_json_str(r, "choices.0.message.tool_calls.0.function.name"),
               vt_json_str(r, "choices.0.message.tool_calls.0.function.arguments"), "after a tool result");
    /* the prompt the server must have rendered */
    const vki_tokenizer *tok = vki_engine_tokenizer(t->e);
    chat_template ct;
    chat_prompt p;
    chat_specials *sp;
    chat_tool_set *ts;
    int32_t *ids;
    size_t n_ids;
    chat_msg m[3] = {{CHAT_USER, "Weather?", 8}, {CHAT_ASSISTANT, "", 0}, {CHAT_TOOL, "sunny", 5}};
    chat_tool_call call = {"call_1", 6, "weather", 7, args, sizeof args - 1};
    chat_tool_msg tm[3] = {{0}, {&call, 1, NULL, 0}, {NULL, 0, "call_1", 6}};
    assert_int_equal(chat_template_init(&ct, CHAT_PLAIN, NULL, "", ""), VKI_OK);
    assert_int_equal(chat_tools_parse(TOOLS, strlen(TOOLS), &ts, NULL, 0), VKI_OK);
    assert_int_equal(chat_render_tools(&ct, CHAT_TOOLS_HERMES, m, tm, 3, ts, true, &p, NULL, 0), VKI_OK);
    assert_non_null(strstr(p.text, "<tool_response>\nsunny\n</tool_response>"));
    assert_int_equal(chat_specials_create(tok, &sp), VKI_OK);
    assert_int_equal(chat_tokenize(sp, tok, &p, vki_tokenizer_adds_bos(tok), &ids, &n_ids), VKI_OK);
    assert_int_equal(vt_json_num(r, "usage.prompt_tokens"), n_ids);
    free(ids);
    chat_specials_free(sp);
    chat_prompt_free(&p);
    chat_tools_free(ts);
    chat_template_free(&ct);
    cJSON_Delete(r);
    stop(t);
}

/* ---- reasoning_content ------------------------------------------------------------------------ */

/* srv_think_feed over text given whole and byte by byte: the same split either way. */
static void think_case(bool open, const char *in, const char *want_r, const char *want_c)
{
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        srv_think th = {.state = open ? 1 : 0};
        strbuf r = {0}, c = {0};
        strbuf_put(&r, "", 0), strbuf_put(&c, "", 0);
        size_t n = strlen(in);
        if (bytewise)
            for (size_t i = 0; i < n; i++)
                assert_true(srv_think_feed(&th, in + i, 1, i + 1 == n, &r, &c));
        else
            assert_true(srv_think_feed(&th, in, n, true, &r, &c));
        if (!n)
            assert_true(srv_think_feed(&th, "", 0, true, &r, &c));
        if (strcmp(r.p, want_r) || strcmp(c.p, want_c))
            fail_msg("think %s [%s]%s: reasoning [%s] content [%s], want [%s] [%s]", open ? "open" : "", in,
                     bytewise ? " byte by byte" : "", r.p, c.p, want_r, want_c);
        strbuf_free(&r), strbuf_free(&c);
    }
}

static void test_think_split(void **state)
{
    (void)state;
    think_case(false, "<think>\nhm, a cat\n</think>\n\nA cat.", "hm, a cat\n", "A cat."); /* Qwen3 */
    think_case(false, "\n<think>x</think>y", "x", "y");
    think_case(false, "A cat.", "", "A cat.");                 /* no reasoning */
    think_case(false, "<thinking>", "", "<thinking>");         /* not the tag */
    think_case(false, "<thi", "", "<thi");                     /* cut short */
    think_case(false, "<think>a<b</think>c", "a<b", "c");      /* a '<' inside */
    think_case(false, "<think>x</think>y</think>z", "x", "y</think>z");
    think_case(false, "<think>no end", "no end", "");          /* max_tokens inside the reasoning */
    think_case(true, "hm\n</think>\n\nok", "hm\n", "ok");      /* DeepSeek-R1: the prompt opened it */
    think_case(true, "a</thi", "a</thi", "");
    think_case(true, "</think>", "", "");
    think_case(true, "", "", "");
}

/* Over HTTP, the model's text forced by a grammar: reasoning_format "deepseek" moves the
 * reasoning to message.reasoning_content / delta.reasoning_content; "none", and "auto" with a
 * template that does not think (this model's), keep it all in content; "auto" with DeepSeek-R1's
 * template splits it (a bad value: SBAD). */
#define THINK_GBNF "\"grammar\":\"root ::= \\\"<think>\\\\nhm, a cat</think>\\\\n\\\\nA cat.\\\"\""
static void test_reasoning_content(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *r = post(t, CHAT, "{" USER ",\"max_tokens\":60,\"reasoning_format\":\"deepseek\"," THINK_GBNF "}");
    assert_string_equal(vt_json_str(r, "choices.0.message.reasoning_content"), "hm, a cat");
    assert_string_equal(vt_json_str(r, "choices.0.message.content"), "A cat.");
    cJSON_Delete(r);
    for (int k = 0; k < 2; k++) {
        r = post(t, CHAT, "{" USER ",\"max_tokens\":60,\"reasoning_format\":\"%s\"," THINK_GBNF "}", k ? "auto" : "none");
        assert_null(vt_json_get(r, "choices.0.message.reasoning_content"));
        assert_string_equal(vt_json_str(r, "choices.0.message.content"), "<think>\nhm, a cat</think>\n\nA cat.");
        cJSON_Delete(r);
    }
    bool done;
    cJSON *ev = stream(t, CHAT, "{" USER ",\"max_tokens\":60,\"stream\":true,\"reasoning_format\":\"deepseek\","
                       THINK_GBNF "}", 0, &done);
    strbuf rs = {0}, cs = {0};
    strbuf_put(&rs, "", 0), strbuf_put(&cs, "", 0);
    for (const cJSON *e = ev->child; e; e = e->next) {
        const cJSON *d = vt_json_get(e, "choices.0.delta.reasoning_content"), *c = vt_json_get(e, "choices.0.delta.content");
        if (cJSON_IsString(d))
            strbuf_put(&rs, d->valuestring, strlen(d->valuestring));
        if (cJSON_IsString(c))
            strbuf_put(&cs, c->valuestring, strlen(c->valuestring));
    }
    assert_true(done);
    assert_string_equal(rs.p, "hm, a cat");
    assert_string_equal(cs.p, "A cat.");
    strbuf_free(&rs), strbuf_free(&cs);
    cJSON_Delete(ev);
    stop(t);
    /* auto with a thinking template (DeepSeek-R1's, by name): split without being asked */
    srv_params sp = test_params(t);
    sp.chat_template = "deepseek";
    start_p(t, t->e, &sp);
    r = post(t, CHAT, "{" USER ",\"max_tokens\":60," THINK_GBNF "}");
    assert_string_equal(vt_json_str(r, "choices.0.message.reasoning_content"), "hm, a cat");
    assert_string_equal(vt_json_str(r, "choices.0.message.content"), "A cat.");
    cJSON_Delete(r);
    stop(t);
}

/* ---- gpt-oss's harmony format ----------------------------------------------------------------- */

/* The deltas of a chat stream reassembled: reasoning_content and content. */
static void stream_parts(const cJSON *ev, strbuf *rs, strbuf *cs)
{
    strbuf_put(rs, "", 0), strbuf_put(cs, "", 0);
    for (const cJSON *e = ev->child; e; e = e->next) {
        const cJSON *d = vt_json_get(e, "choices.0.delta.reasoning_content"),
                    *c = vt_json_get(e, "choices.0.delta.content");
        if (cJSON_IsString(d))
            strbuf_put(rs, d->valuestring, strlen(d->valuestring));
        if (cJSON_IsString(c))
            strbuf_put(cs, c->valuestring, strlen(c->valuestring));
    }
}

/* The model's reply forced by a grammar (its markers spelled as text here: this vocabulary has no
 * harmony tokens, and the splitter reads the text): the analysis channel in reasoning_content and
 * the final channel in content, streamed (every split the tokens make) and not; reasoning_format
 * "none" keeps the analysis in the content with its markers, as llama.cpp does. */
#define HARMONY_GBNF "\"grammar\":\"root ::= \\\"<|channel|>analysis<|message|>hm, a cat<|end|><|start|>assistant" \
                     "<|channel|>final<|message|>A cat.\\\"\""
static void test_harmony_reasoning(void **state)
{
    T *t = *state;
    srv_params sp = test_params(t);
    sp.chat_template = "harmony";
    start_p(t, t->e, &sp);
    /* greedy: the grammar's text has several spellings in tokens, and the counts are compared */
    cJSON *r = post(t, CHAT, "{" USER ",\"max_tokens\":120,\"temperature\":0," HARMONY_GBNF "}");
    assert_string_equal(vt_json_str(r, "choices.0.message.reasoning_content"), "hm, a cat");
    assert_string_equal(vt_json_str(r, "choices.0.message.content"), "A cat.");
    assert_string_equal(vt_json_str(r, "choices.0.finish_reason"), "stop");
    double completion = vt_json_num(r, "usage.completion_tokens"); /* every token counts, the markers' too */
    cJSON_Delete(r);
    bool done;
    cJSON *ev = stream(t, CHAT, "{" USER ",\"max_tokens\":120,\"temperature\":0,\"stream\":true,\"stream_options\":"
                       "{\"include_usage\":true}," HARMONY_GBNF "}", 0, &done);
    strbuf rs = {0}, cs = {0};
    stream_parts(ev, &rs, &cs);
    assert_true(done);
    assert_string_equal(rs.p, "hm, a cat");
    assert_string_equal(cs.p, "A cat.");
    const cJSON *last = cJSON_GetArrayItem(ev, cJSON_GetArraySize(ev) - 1);
    assert_int_equal(vt_json_num(last, "usage.completion_tokens"), completion);
    strbuf_free(&rs), strbuf_free(&cs);
    cJSON_Delete(ev);
    r = post(t, CHAT, "{" USER ",\"max_tokens\":120,\"reasoning_format\":\"none\"," HARMONY_GBNF "}");
    assert_null(vt_json_get(r, "choices.0.message.reasoning_content"));
    assert_string_equal(vt_json_str(r, "choices.0.message.content"),
                        "<|channel|>analysis<|message|>hm, a cat<|end|>A cat.");
    cJSON_Delete(r);
    /* a stop string inside the analysis ends the reply there: what came is reasoning */
    r = post(t, CHAT, "{" USER ",\"max_tokens\":120,\"temperature\":0,\"stop\":[\"cat\"]," HARMONY_GBNF "}");
    assert_string_equal(vt_json_str(r, "choices.0.message.reasoning_content"), "hm, a ");
    assert_string_equal(vt_json_str(r, "choices.0.message.content"), "");
    assert_string_equal(vt_json_str(r, "choices.0.finish_reason"), "stop");
    assert_true(vt_json_num(r, "usage.completion_tokens") < completion);
    cJSON_Delete(r);
    stop(t);
}

/* reasoning_effort (OpenAI's) and chat_template_kwargs.reasoning_effort (llama-server's) set the
 * system message's "Reasoning:" line, the top-level field winning; other values are 400s naming
 * the field; other templates take only "none". Calls: a named function's header is the prompt's,
 * its arguments the grammar's, parsed back into tool_calls; a call the model writes itself
 * (forced here by a grammar, after its reasoning) too; several functions, streamed. */
static void test_harmony_effort_tools(void **state)
{
    T *t = *state;
    start(t, NULL, 0); /* this model's own template: not harmony */
    cJSON *r = http_json(t, "POST", CHAT, "{" USER ",\"max_tokens\":2,\"reasoning_effort\":\"high\"}", 400);
    assert_non_null(strstr(vt_json_str(r, "error.message"), "reasoning_effort: not supported"));
    cJSON_Delete(r);
    cJSON_Delete(post(t, CHAT, "{" USER ",\"max_tokens\":2,\"reasoning_effort\":\"none\"}"));
    stop(t);
    srv_params sp = test_params(t);
    sp.chat_template = "harmony";
    start_p(t, t->e, &sp);
    static const struct {
        const char *fields, *want;
    } efforts[] = {
        {"", "Reasoning: medium\n"},
        {",\"reasoning_effort\":\"high\"", "Reasoning: high\n"},
        {",\"chat_template_kwargs\":{\"reasoning_effort\":\"low\"}", "Reasoning: low\n"},
        {",\"reasoning_effort\":\"high\",\"chat_template_kwargs\":{\"reasoning_effort\":\"low\"}", "Reasoning: high\n"},
        {",\"chat_template_kwargs\":{\"reasoning_effort\":\"low\"},\"reasoning_effort\":\"high\"", "Reasoning: high\n"},
    };
    for (size_t i = 0; i < sizeof efforts / sizeof *efforts; i++) {
        r = post(t, "/apply-template", "{" USER "%s}", efforts[i].fields);
        const char *prompt = vt_json_str(r, "prompt");
        if (!strstr(prompt, efforts[i].want) || strncmp(prompt, "<|start|>system<|message|>", 26))
            fail_msg("effort %zu: %s", i, prompt);
        cJSON_Delete(r);
    }
    r = http_json(t, "POST", CHAT, "{" USER ",\"reasoning_effort\":\"minimal\"}", 400);
    assert_non_null(
        strstr(vt_json_str(r, "error.message"), "reasoning_effort must be \"low\", \"medium\" or \"high\""));
    assert_string_equal(vt_json_str(r, "error.param"), "reasoning_effort");
    cJSON_Delete(r);
    r = http_json(t, "POST", CHAT, "{" USER ",\"chat_template_kwargs\":{\"reasoning_effort\":3}}", 400);
    assert_non_null(strstr(vt_json_str(r, "error.message"), "chat_template_kwargs.reasoning_effort must be"));
    cJSON_Delete(r);

    /* a named function: only its arguments are generated */
    r = post(t, CHAT, "{" USER ",\"max_tokens\":" TIME_MAX ",\"seed\":%llu,\"tools\":%s,\"tool_choice\":{\"type\":"
             "\"function\",\"function\":{\"name\":\"time\"}}}", (unsigned long long)g_seed + 20, TOOLS);
    assert_string_equal(vt_json_str(r, "choices.0.finish_reason"), "tool_calls");
    assert_true(cJSON_IsNull(vt_json_get(r, "choices.0.message.content")));
    assert_int_equal(cJSON_GetArraySize(vt_json_get(r, "choices.0.message.tool_calls")), 1);
    assert_string_equal(vt_json_str(r, "choices.0.message.tool_calls.0.function.name"), "time");
    check_call("time", vt_json_str(r, "choices.0.message.tool_calls.0.function.arguments"), "harmony, named");
    cJSON_Delete(r);
    /* auto: the model's own call after its reasoning */
    r = post(t, CHAT, "{" USER ",\"max_tokens\":200,\"tools\":%s,\"grammar\":\"root ::= \\\"<|channel|>analysis"
             "<|message|>Time?<|end|><|start|>assistant<|channel|>commentary to=functions.time <|constrain|>json"
             "<|message|>{\\\\\\\"tz\\\\\\\": \\\\\\\"UTC\\\\\\\"}\\\"\"}", TOOLS);
    assert_string_equal(vt_json_str(r, "choices.0.finish_reason"), "tool_calls");
    assert_string_equal(vt_json_str(r, "choices.0.message.reasoning_content"), "Time?");
    assert_true(cJSON_IsNull(vt_json_get(r, "choices.0.message.content")));
    assert_string_equal(vt_json_str(r, "choices.0.message.tool_calls.0.function.name"), "time");
    assert_string_equal(vt_json_str(r, "choices.0.message.tool_calls.0.function.arguments"), "{\"tz\": \"UTC\"}");
    cJSON_Delete(r);
    /* required among several, streamed: the name is the grammar's too */
    bool done;
    char body[2048];
    snprintf(body, sizeof body, "{" USER ",\"max_tokens\":" ANY_CALL_MAX ",\"stream\":true,\"seed\":%llu,\"tools\":%s,"
             "\"tool_choice\":\"required\"}", (unsigned long long)g_seed + 21, TOOLS);
    cJSON *ev = stream(t, CHAT, body, 0, &done);
    strbuf args = {0};
    strbuf_put(&args, "", 0);
    const char *name = NULL, *finish = NULL;
    for (const cJSON *e = ev->child; e; e = e->next) {
        const cJSON *tc = vt_json_get(e, "choices.0.delta.tool_calls"), *f = vt_json_get(e, "choices.0.finish_reason");
        finish = cJSON_IsString(f) ? f->valuestring : finish;
        if (tc && vt_json_get(tc, "0.id"))
            name = vt_json_str(tc, "0.function.name");
        else if (tc)
            strbuf_put(&args, vt_json_str(tc, "0.function.arguments"), strlen(vt_json_str(tc, "0.function.arguments")));
    }
    assert_true(done);
    assert_string_equal(finish, "tool_calls");
    assert_non_null(name);
    print_message("harmony, required: %s(%s)\n", name, args.p);
    check_call(name, args.p, "harmony, required (streamed)");
    strbuf_free(&args);
    cJSON_Delete(ev);
    stop(t);
}

int main(void)
{
    vt_rng rng = vt_rng_seeded("test_server_struct");
    g_seed = vt_u64(&rng) >> 12; /* JSON numbers: exact below 2^53 */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_response_format), cmocka_unit_test(test_grammar_fields),
        cmocka_unit_test(test_struct_errors),   cmocka_unit_test(test_tools_forced),
        cmocka_unit_test(test_tools_stream),    cmocka_unit_test(test_tools_auto_none),
        cmocka_unit_test(test_tool_result_turn),
        cmocka_unit_test(test_think_split),     cmocka_unit_test(test_reasoning_content),
        cmocka_unit_test(test_harmony_reasoning), cmocka_unit_test(test_harmony_effort_tools),
    };
    if (getenv("VKI_TEST_FILTER"))
        cmocka_set_test_filter(getenv("VKI_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
