/* The HTTP server (host/server*.c) over real loopback sockets: an in-process server on a free
 * port over stories260K (or a synthetic model when ../shared/models is absent), driven by the
 * load generator's HTTP client (tools/loadgen.c, included). Every endpoint; non-streaming and
 * streaming completions and chat (the known greedy answer, stream = non-stream text, usage);
 * stop strings across tokens; logprobs shapes; every error path (400 naming the field, 404,
 * 405, 413, 429 with Retry-After, 503 while draining); a client that hangs up (its request is
 * cancelled, KV blocks freed); 300 connections at once; drain and shutdown with requests in
 * flight; the Prometheus text.
 * The routes beyond generation (version, props, tokenize, embeddings), n choices and echo, the
 * vLLM / llama.cpp request fields, cached tokens, no up-front allocation, and the default policy
 * serving many chats at once. The HTTP layer itself and the load test: test_server_http.c. */
#define LOADGEN_NO_MAIN
#include "tools/loadgen.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "engine/synth.h"
#include "host/chat/chat.h"
#include <stdatomic.h>

#include "host/server/server.h"
#include "support/gguf_edit.h"
#include "support/vt.h"
#include "support/vt_json.h"

/* Greedy, BOS + "Once upon a time", 48 tokens (../shared/models/README.md). */
static const char KNOWN[] = ", there was a little girl named Lily. She loved to play outside in the park. One day, she "
                            "saw a big, red ball. She wanted to play with it,";

typedef struct T {
    char model[1024];
    bool stories;           /* the real model (known answers) rather than the synthetic one */
    vki_engine *e;
    srv *s;
    uint16_t port;
    char id[128];
    atomic_int validation;  /* validation-layer messages seen by the in-process engine */
    pthread_mutex_t log_mu;
    strbuf logs;            /* the in-process server's log lines */
    const char *key;        /* API key the client helpers send (NULL: none) */
} T;

/* ---- fixture ------------------------------------------------------------------------------- */

/* The in-process engine runs with the validation layer; any warning or error fails the suite. */
static int group_setup(void **state)
{
    vt_pin_vulkan_libraries(); /* LeakSanitizer keeps checking the server's own code */
    T *t = calloc(1, sizeof *t);
    pthread_mutex_init(&t->log_mu, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl; /* 300 connections: client socket, server socket and eventfd each */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (vt_shared_model("stories260K.gguf", t->model, sizeof t->model)) {
        t->stories = true;
    } else {
        printf("NOTE: %s/models/stories260K.gguf not found: a synthetic model is used and the known-answer "
               "checks are skipped\n", VKI_SHARED_DIR);
        snprintf(t->model, sizeof t->model, "/tmp/vki_test_server_%d.gguf", (int)getpid());
        synth_params sp = synth_default_params();
        sp.n_ctx = 2048, sp.n_vocab = 512; /* stories260K's context and token ids */
        char err[256];
        if (synth_write(&sp, t->model, err, sizeof err) != VKI_OK) {
            printf("cannot write %s: %s\n", t->model, err);
            free(t);
            return -1;
        }
    }
    vki_engine_params ep = vt_engine_params(64 * 1024, 320, &t->validation);
    char err[512] = "";
    if (vki_engine_create(t->model, &ep, &t->e, err, sizeof err) != VKI_OK) {
        printf("engine: %s\n", err);
        if (!t->stories)
            unlink(t->model);
        free(t);
        return -1;
    }
    *state = t;
    return 0;
}

static int group_teardown(void **state)
{
    T *t = *state;
    if (!t)
        return 0;
    vki_engine_destroy(t->e);
    if (!t->stories)
        unlink(t->model);
    int msgs = atomic_load(&t->validation);
    strbuf_free(&t->logs);
    pthread_mutex_destroy(&t->log_mu);
    free(t);
    if (msgs)
        fprintf(stderr, "FAIL: %d validation messages\n", msgs);
    return msgs ? -1 : 0;
}

/* The in-process server's log: kept for the tests to read, warnings also shown. */
static void capture_log(void *user, vki_log_level lvl, const char *msg)
{
    T *t = user;
    pthread_mutex_lock(&t->log_mu);
    strbuf_printf(&t->logs, "%s\n", msg);
    pthread_mutex_unlock(&t->log_mu);
    if (lvl <= VKI_LOG_WARN)
        fprintf(stderr, "[server] %s\n", msg);
}

static bool log_has(T *t, const char *needle)
{
    pthread_mutex_lock(&t->log_mu);
    bool has = t->logs.p && strstr(t->logs.p, needle);
    pthread_mutex_unlock(&t->log_mu);
    return has;
}

/* The parameters every in-process server starts from. */
static srv_params test_params(T *t)
{
    srv_params p = srv_default_params();
    p.port = 0;
    p.model_path = t->model;
    p.log_level = VKI_LOG_WARN;
    p.log = capture_log;
    p.log_user = t;
    return p;
}

/* A server over engine e with parameters p. */
static void start_p(T *t, vki_engine *e, srv_params *p)
{
    if (t->s) /* left by a test that failed: one failure should not fail the rest */
        srv_destroy(t->s);
    t->s = NULL;
    pthread_mutex_lock(&t->log_mu);
    strbuf_clear(&t->logs);
    pthread_mutex_unlock(&t->log_mu);
    char err[256] = "";
    if (srv_create(e, p, &t->s, err, sizeof err) != VKI_OK)
        fail_msg("srv_create: %s", err);
    t->port = srv_port(t->s);
    assert_true(t->port > 0);
    snprintf(t->id, sizeof t->id, "%s", t->stories ? "stories260K" : strrchr(t->model, '/') + 1);
    char *dot = strstr(t->id, ".gguf");
    if (dot)
        *dot = 0;
}

/* A server over the group's engine; bp may be NULL (defaults). */
static void start(T *t, const vki_batch_params *bp, size_t body_limit)
{
    srv_params p = test_params(t);
    if (bp)
        p.batch = *bp;
    if (body_limit)
        p.body_limit = body_limit;
    start_p(t, t->e, &p);
}

static void stop(T *t)
{
    srv_destroy(t->s);
    t->s = NULL;
}

/* ---- client helpers -------------------------------------------------------------------------- */

/* One request on a fresh connection: status, headers in *r (may be NULL), body (malloc'd). */
static int http(T *t, const char *method, const char *path, const char *body, lg_resp *r, char **out)
{
    lg_http h;
    lg_http_init(&h, "127.0.0.1", t->port, 120);
    lg_http_auth(&h, t->key);
    lg_resp rr;
    lg_buf b = {0};
    int st = lg_http_request(&h, method, path, body, r ? r : &rr, &b);
    lg_http_close(&h);
    if (out)
        *out = b.p ? b.p : strdup("");
    else
        free(b.p);
    return st;
}

static cJSON *http_json(T *t, const char *method, const char *path, const char *body, int want_status)
{
    char *out;
    int st = http(t, method, path, body, NULL, &out);
    if (st != want_status)
        fail_msg("%s %s %s: status %d, want %d: %s", method, path, body ? body : "", st, want_status, out);
    cJSON *j = cJSON_Parse(out);
    if (!j)
        fail_msg("%s %s: not JSON: %s", method, path, out);
    free(out);
    return j;
}

/* A stream: its data events parsed (an array), whether [DONE] came. Hangs up after `hang`
 * events (0: read to the end). */
typedef struct sse_coll {
    cJSON *events;
    bool done;
    int hang;
} sse_coll;

static bool on_sse(void *user, const char *data, size_t n)
{
    sse_coll *c = user;
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        c->done = true;
        return true;
    }
    cJSON *o = cJSON_ParseWithLength(data, n);
    if (!o)
        fail_msg("SSE event is not JSON: %.*s", (int)n, data);
    cJSON_AddItemToArray(c->events, o);
    return !c->hang || cJSON_GetArraySize(c->events) < c->hang;
}

static cJSON *stream(T *t, const char *path, const char *body, int hang, bool *done)
{
    lg_http h;
    lg_http_init(&h, "127.0.0.1", t->port, 120);
    lg_resp r;
    assert_true(lg_http_send(&h, "POST", path, body, strlen(body), NULL));
    assert_true(lg_http_head(&h, &r));
    if (r.status != 200)
        fail_msg("stream %s: status %d", body, r.status);
    const char *ct = lg_header(&r, "Content-Type");
    assert_non_null(ct);
    assert_int_equal(strncmp(ct, "text/event-stream", 17), 0);
    assert_true(r.chunked);
    sse_coll c = {.events = cJSON_CreateArray(), .hang = hang};
    lg_sse sse = {.on_data = on_sse, .user = &c};
    int rc = lg_http_body(&h, &r, lg_sse_feed, &sse);
    assert_true(hang ? rc == 0 : rc == 1);
    lg_http_close(&h);
    free(sse.line.p);
    if (done)
        *done = c.done;
    return c.events;
}

/* The value of a sample line of /metrics ("vkinfer_active_requests", or with its labels). */
static double metric(T *t, const char *name)
{
    double v = NAN;
    if (!lg_metric("127.0.0.1", t->port, name, &v))
        fail_msg("no metric %s", name);
    return v;
}

/* Polls until the metric reaches `want` (a liveness bound, not a performance assertion). */
static void wait_metric(T *t, const char *name, double want)
{
    double end = lg_now() + 60, v = NAN;
    while ((v = metric(t, name)) != want && lg_now() < end)
        usleep(2000);
    if (v != want)
        fail_msg("%s stayed %g, want %g", name, v, want);
}

static void wait_metric_at_least(T *t, const char *name, double want)
{
    double end = lg_now() + 60, v = NAN;
    while ((v = metric(t, name)) < want && lg_now() < end)
        usleep(2000);
    if (!(v >= want))
        fail_msg("%s stayed %g, want >= %g", name, v, want);
}

/* ---- endpoints ------------------------------------------------------------------------------ */

static void test_health_models(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *j = http_json(t, "GET", "/health", NULL, 200);
    assert_string_equal(vt_json_str(j, "status"), "ok");
    cJSON_Delete(j);
    j = http_json(t, "GET", "/health/ready", NULL, 200);
    assert_string_equal(vt_json_str(j, "status"), "ready");
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v1/models", NULL, 200);
    assert_string_equal(vt_json_str(j, "object"), "list");
    assert_string_equal(vt_json_str(j, "data.0.id"), t->id);
    assert_string_equal(vt_json_str(j, "data.0.object"), "model");
    assert_true(vt_json_num(j, "data.0.max_model_len") > 0);
    cJSON_Delete(j);
    j = http_json(t, "GET", "/models", NULL, 200); /* llama-server's alias */
    assert_string_equal(vt_json_str(j, "data.0.id"), t->id);
    cJSON_Delete(j);
    char path[256];
    snprintf(path, sizeof path, "/v1/models/%s", t->id);
    j = http_json(t, "GET", path, NULL, 200);
    assert_string_equal(vt_json_str(j, "id"), t->id);
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v1/models/gpt-4", NULL, 404);
    assert_string_equal(vt_json_str(j, "error.code"), "model_not_found");
    cJSON_Delete(j);
    stop(t);
}

static const char CMPL48[] = "{\"model\":\"anything\",\"prompt\":\"Once upon a time\",\"max_tokens\":48,\"temperature\":0}";

/* Non-streaming completion: the known greedy answer, the envelope, usage. */
static void test_completion(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *j = http_json(t, "POST", "/v1/completions", CMPL48, 200);
    assert_string_equal(vt_json_str(j, "object"), "text_completion");
    assert_string_equal(vt_json_str(j, "model"), t->id);
    assert_int_equal(strncmp(vt_json_str(j, "id"), "cmpl-", 5), 0);
    assert_true(vt_json_num(j, "created") > 1.6e9);
    assert_string_equal(vt_json_str(j, "choices.0.finish_reason"), "length");
    assert_true(cJSON_IsNull(vt_json_get(j, "choices.0.logprobs")));
    assert_int_equal(vt_json_num(j, "usage.completion_tokens"), 48);
    assert_int_equal(vt_json_num(j, "usage.total_tokens"), vt_json_num(j, "usage.prompt_tokens") + 48);
    if (t->stories) {
        assert_string_equal(vt_json_str(j, "choices.0.text"), KNOWN);
        assert_int_equal(vt_json_num(j, "usage.prompt_tokens"), 5); /* BOS + 4 */
    }
    /* the prompt as token ids gives the same answer */
    size_t n = 0;
    int32_t ids[64];
    assert_int_equal(vki_tokenize(vki_engine_tokenizer(t->e), "Once upon a time", 16, true, false, ids, 64, &n), VKI_OK);
    char body[512];
    int k = snprintf(body, sizeof body, "{\"prompt\":[");
    for (size_t i = 0; i < n; i++)
        k += snprintf(body + k, sizeof body - (size_t)k, "%s%d", i ? "," : "", ids[i]);
    snprintf(body + k, sizeof body - (size_t)k, "],\"max_tokens\":48,\"temperature\":0}");
    cJSON *j2 = http_json(t, "POST", "/v1/completions", body, 200);
    assert_string_equal(vt_json_str(j2, "choices.0.text"), vt_json_str(j, "choices.0.text"));
    cJSON_Delete(j2);
    cJSON_Delete(j);
    stop(t);
}

/* Concatenated stream text = the non-streaming text; usage chunk; [DONE]. */
static void test_completion_stream(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *whole = http_json(t, "POST", "/v1/completions", CMPL48, 200);
    bool done = false;
    cJSON *ev = stream(t, "/v1/completions",
                       "{\"prompt\":\"Once upon a time\",\"max_tokens\":48,\"temperature\":0,\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true}}", 0, &done);
    assert_true(done);
    int n = cJSON_GetArraySize(ev);
    assert_true(n >= 3);
    lg_buf text = {0};
    for (int i = 0; i < n - 1; i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        assert_string_equal(vt_json_str(e, "object"), "text_completion");
        assert_true(cJSON_IsNull(vt_json_get(e, "usage")));
        const char *s = vt_json_str(e, "choices.0.text");
        lg_buf_put(&text, s, strlen(s));
        bool last = i == n - 2;
        assert_true(last ? cJSON_IsString(vt_json_get(e, "choices.0.finish_reason"))
                         : cJSON_IsNull(vt_json_get(e, "choices.0.finish_reason")));
    }
    assert_string_equal(vt_json_str(cJSON_GetArrayItem(ev, n - 2), "choices.0.finish_reason"), "length");
    assert_string_equal(text.p, vt_json_str(whole, "choices.0.text"));
    const cJSON *u = cJSON_GetArrayItem(ev, n - 1);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(u, "choices")), 0);
    assert_int_equal(vt_json_num(u, "usage.completion_tokens"), 48);
    assert_int_equal(vt_json_num(u, "usage.prompt_tokens"), vt_json_num(whole, "usage.prompt_tokens"));
    free(text.p);
    cJSON_Delete(ev);
    /* without include_usage: no usage field at all */
    ev = stream(t, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":4,\"stream\":true}", 0, &done);
    assert_true(done);
    for (const cJSON *e = ev->child; e; e = e->next)
        assert_null(vt_json_get(e, "usage"));
    cJSON_Delete(ev);
    cJSON_Delete(whole);
    stop(t);
}

/* An NDJSON stream (Ollama's): status 200, its Content-Type, its lines parsed (an array). */
static cJSON *ndjson(T *t, const char *path, const char *body)
{
    lg_resp r;
    char *out = NULL;
    int st = http(t, "POST", path, body, &r, &out);
    if (st != 200)
        fail_msg("%s %s: status %d: %s", path, body, st, out);
    const char *ct = lg_header(&r, "Content-Type");
    assert_non_null(ct);
    assert_int_equal(strncmp(ct, "application/x-ndjson", 20), 0);
    cJSON *all = cJSON_CreateArray();
    for (char *p = out, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl)
            fail_msg("%s: the stream ends inside a line: %s", path, p);
        cJSON *o = cJSON_ParseWithLength(p, (size_t)(nl - p));
        if (!o)
            fail_msg("%s: not a JSON line: %.*s", path, (int)(nl - p), p);
        cJSON_AddItemToArray(all, o);
    }
    free(out);
    return all;
}

/* OpenAI's Responses API: the greedy answer to an input is /v1/chat/completions' to the same
 * message (instructions as its system message), as one Response (output message, usage,
 * incomplete at max_output_tokens) and as its typed events (created, in_progress, the item's
 * added / part / deltas / done events, then the final response, sequence numbers in order, the
 * deltas' text the answer's); function tools and function_call / function_call_output items
 * are accepted; what needs stored state, hosted tools and images are 400s naming the field. */
static void test_responses_api(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *ref = http_json(t, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"system\",\"content\":"
                           "\"Be brief.\"},{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":24,"
                           "\"temperature\":0}", 200);
    const char *want = vt_json_str(ref, "choices.0.message.content");
    const bool cut = !strcmp(vt_json_str(ref, "choices.0.finish_reason"), "length");
    static const char R[] = "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"input\":%s,\"max_output_tokens\":24,"
                            "\"temperature\":0%s}";
    char body[512];
    snprintf(body, sizeof body, R, "\"Once upon a time\"", "");
    cJSON *j = http_json(t, "POST", "/v1/responses", body, 200);
    assert_string_equal(vt_json_str(j, "object"), "response");
    assert_int_equal(strncmp(vt_json_str(j, "id"), "resp_", 5), 0);
    assert_string_equal(vt_json_str(j, "status"), cut ? "incomplete" : "completed");
    if (cut)
        assert_string_equal(vt_json_str(j, "incomplete_details.reason"), "max_output_tokens");
    assert_string_equal(vt_json_str(j, "output.0.type"), "message");
    assert_string_equal(vt_json_str(j, "output.0.role"), "assistant");
    assert_string_equal(vt_json_str(j, "output.0.content.0.type"), "output_text");
    assert_string_equal(vt_json_str(j, "output.0.content.0.text"), want);
    assert_int_equal(vt_json_num(j, "usage.input_tokens"), vt_json_num(ref, "usage.prompt_tokens"));
    assert_int_equal(vt_json_num(j, "usage.output_tokens"), vt_json_num(ref, "usage.completion_tokens"));
    assert_string_equal(vt_json_str(j, "instructions"), "Be brief.");
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "tools")), 0);
    cJSON_Delete(j);
    /* the same as input items, streamed */
    snprintf(body, sizeof body, R, "[{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
             "\"input_text\",\"text\":\"Once upon \"},{\"type\":\"input_text\",\"text\":\"a time\"}]}]",
             ",\"stream\":true");
    bool done = true;
    cJSON *ev = stream(t, "/v1/responses", body, 0, &done);
    assert_false(done); /* no [DONE]: the last event is the response */
    int n = cJSON_GetArraySize(ev);
    lg_buf text = {0};
    static const char *const first[] = {"response.created", "response.in_progress", "response.output_item.added",
                                        "response.content_part.added"};
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const char *type = vt_json_str(e, "type");
        assert_int_equal(vt_json_num(e, "sequence_number"), i);
        if (i < 4)
            assert_string_equal(type, first[i]);
        if (!strcmp(type, "response.output_text.delta")) {
            const char *s = vt_json_str(e, "delta");
            lg_buf_put(&text, s, strlen(s));
        }
    }
    assert_true(n >= 8); /* 8 for an empty answer (the synthetic model may end at once) */
    assert_string_equal(text.p ? text.p : "", want);
    const cJSON *last = cJSON_GetArrayItem(ev, n - 1);
    assert_string_equal(vt_json_str(last, "type"), cut ? "response.incomplete" : "response.completed");
    assert_string_equal(vt_json_str(last, "response.output.0.content.0.text"), want);
    assert_string_equal(vt_json_str(cJSON_GetArrayItem(ev, n - 2), "type"), "response.output_item.done");
    assert_string_equal(vt_json_str(cJSON_GetArrayItem(ev, n - 4), "type"), "response.output_text.done");
    assert_string_equal(vt_json_str(cJSON_GetArrayItem(ev, n - 4), "text"), want);
    free(text.p);
    cJSON_Delete(ev);
    cJSON_Delete(ref);
    /* a tool round trip's items, and a forced call: a function_call item with its arguments */
    static const char TOOL[] = "{\"input\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Paris\\\"}\"},{\"type\":\"function_call_output\",\"call_id\":\"call_1\","
        "\"output\":\"12C\"},{\"role\":\"user\",\"content\":\"And Rome?\"}],\"max_output_tokens\":200,"
        "\"temperature\":0,\"tool_choice\":\"required\",\"tools\":[{\"type\":\"function\",\"name\":"
        "\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
        "\"maxLength\":6}},\"required\":[\"city\"]}}]}";
    j = http_json(t, "POST", "/v1/responses", TOOL, 200);
    assert_string_equal(vt_json_str(j, "output.0.type"), "function_call");
    assert_string_equal(vt_json_str(j, "output.0.name"), "get_weather");
    assert_int_equal(strncmp(vt_json_str(j, "output.0.call_id"), "call_", 5), 0);
    cJSON *args = cJSON_Parse(vt_json_str(j, "output.0.arguments"));
    assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(args, "city")));
    cJSON_Delete(args);
    /* streamed: the call's name and id are in its output_item.added already, its arguments the
     * deltas' */
    char tool_stream[2048];
    snprintf(tool_stream, sizeof tool_stream, "%.*s,\"stream\":true}", (int)strlen(TOOL) - 1, TOOL);
    ev = stream(t, "/v1/responses", tool_stream, 0, NULL);
    const cJSON *added = cJSON_GetArrayItem(ev, 2);
    assert_string_equal(vt_json_str(added, "type"), "response.output_item.added");
    assert_string_equal(vt_json_str(added, "item.name"), "get_weather");
    assert_int_equal(strncmp(vt_json_str(added, "item.call_id"), "call_", 5), 0);
    lg_buf a = {0};
    for (const cJSON *e = ev->child; e; e = e->next)
        if (!strcmp(vt_json_str(e, "type"), "response.function_call_arguments.delta") &&
            vt_json_num(e, "output_index") == 0)
            lg_buf_put(&a, vt_json_str(e, "delta"), strlen(vt_json_str(e, "delta")));
    assert_string_equal(a.p ? a.p : "", vt_json_str(j, "output.0.arguments"));
    free(a.p);
    cJSON_Delete(ev);
    cJSON_Delete(j);
    static const struct { const char *body, *param; } bad[] = {
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}", "input"},
        {"{\"input\":7}", "input"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text"},
        {"{\"input\":\"x\",\"max_output_tokens\":\"many\"}", "max_output_tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = http_json(t, "POST", "/v1/responses", bad[i].body, 400);
        if (strcmp(vt_json_str(j, "error.param"), bad[i].param))
            fail_msg("%s: %s", bad[i].body, cJSON_PrintUnformatted(j));
        cJSON_Delete(j);
    }
    stop(t);
}

/* Ollama's API: /api/generate raw and greedy gives /v1/completions' text, streamed (NDJSON, one
 * object per piece, a last one with done, done_reason and the counts) and not; without raw the
 * prompt goes through the template as /v1/chat/completions' user message; /api/chat gives that
 * chat's answer as message.content; an empty prompt / no messages answer "load"; options carry
 * Ollama's names (num_predict, repeat_penalty, ...); what vkinfer lacks is a 400 {"error":
 * "..."} naming it; /api/embed and /api/embeddings give /v1/embeddings' vectors in Ollama's
 * shapes; /api/tags, /api/ps, /api/show and /api/version describe the model. */
static void test_ollama_api(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *ref = http_json(t, "POST", "/v1/completions", CMPL48, 200);
    const char *want = vt_json_str(ref, "choices.0.text");
    static const char GEN[] = "{\"model\":\"anything\",\"prompt\":\"Once upon a time\",\"raw\":true,%s"
                              "\"options\":{\"temperature\":0,\"num_predict\":48,\"repeat_penalty\":1.0}}";
    char body[512];
    snprintf(body, sizeof body, GEN, "\"stream\":false,");
    cJSON *j = http_json(t, "POST", "/api/generate", body, 200);
    assert_string_equal(vt_json_str(j, "response"), want);
    assert_string_equal(vt_json_str(j, "model"), "anything");
    assert_true(cJSON_IsTrue(vt_json_get(j, "done")));
    /* the synthetic model (no ../shared) may end its text early: as /v1/completions did */
    const bool full = !strcmp(vt_json_str(ref, "choices.0.finish_reason"), "length");
    const double n_gen = vt_json_num(ref, "usage.completion_tokens");
    assert_string_equal(vt_json_str(j, "done_reason"), full ? "length" : "stop");
    assert_int_equal(vt_json_num(j, "eval_count"), n_gen);
    assert_int_equal(vt_json_num(j, "prompt_eval_count"), vt_json_num(ref, "usage.prompt_tokens"));
    assert_true(vt_json_num(j, "total_duration") >= vt_json_num(j, "eval_duration") &&
                vt_json_num(j, "eval_duration") > 0);
    const char *when = vt_json_str(j, "created_at");
    assert_true(strlen(when) == 27 && when[10] == 'T' && when[26] == 'Z');
    cJSON_Delete(j);
    snprintf(body, sizeof body, GEN, ""); /* stream: Ollama's default */
    cJSON *ev = ndjson(t, "/api/generate", body);
    int n = cJSON_GetArraySize(ev);
    lg_buf text = {0};
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const char *s = vt_json_str(e, "response");
        lg_buf_put(&text, s, strlen(s));
        assert_true(cJSON_IsTrue(vt_json_get(e, "done")) == (i == n - 1));
    }
    assert_true(n >= 2);
    assert_string_equal(text.p, want);
    assert_int_equal(vt_json_num(cJSON_GetArrayItem(ev, n - 1), "eval_count"), n_gen);
    free(text.p);
    cJSON_Delete(ev);
    /* through the template: /v1/chat/completions' answer to the prompt as a user message */
    cJSON *cref = http_json(t, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"system\",\"content\":"
                            "\"Be brief.\"},{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":24,"
                            "\"temperature\":0}", 200);
    const char *cwant = vt_json_str(cref, "choices.0.message.content");
    j = http_json(t, "POST", "/api/generate", "{\"prompt\":\"Once upon a time\",\"system\":\"Be brief.\",\"stream\":"
                  "false,\"options\":{\"temperature\":0,\"num_predict\":24,\"repeat_penalty\":1}}", 200);
    assert_string_equal(vt_json_str(j, "response"), cwant);
    cJSON_Delete(j);
    j = http_json(t, "POST", "/api/chat", "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief."
                  "\"},{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"stream\":false,\"options\":{"
                  "\"temperature\":0,\"num_predict\":24,\"repeat_penalty\":1}}", 200);
    assert_string_equal(vt_json_str(j, "message.role"), "assistant");
    assert_string_equal(vt_json_str(j, "message.content"), cwant);
    assert_true(cJSON_IsTrue(vt_json_get(j, "done")));
    cJSON_Delete(j);
    ev = ndjson(t, "/api/chat", "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
                "\"content\":\"Once upon a time\"}],\"options\":{\"temperature\":0,\"num_predict\":24,"
                "\"repeat_penalty\":1}}");
    n = cJSON_GetArraySize(ev);
    text = (lg_buf){0};
    for (int i = 0; i < n; i++) {
        const char *s = vt_json_str(cJSON_GetArrayItem(ev, i), "message.content");
        lg_buf_put(&text, s, strlen(s));
    }
    assert_string_equal(text.p, cwant);
    assert_string_equal(vt_json_str(cJSON_GetArrayItem(ev, n - 1), "done_reason"),
                        strcmp(vt_json_str(cref, "choices.0.finish_reason"), "length") ? "stop" : "length");
    free(text.p);
    cJSON_Delete(ev);
    cJSON_Delete(cref);
    /* an earlier tool call (arguments as an object) and its result go through the template */
    j = http_json(t, "POST", "/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
                  "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\","
                  "\"arguments\":{\"city\":\"Paris\"}}}]},{\"role\":\"tool\",\"content\":\"20 C\",\"tool_name\":"
                  "\"get_weather\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                  "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],"
                  "\"stream\":false,\"options\":{\"num_predict\":4}}", 200);
    assert_true(cJSON_IsTrue(vt_json_get(j, "done")));
    cJSON_Delete(j);
    /* loading only */
    j = http_json(t, "POST", "/api/generate", "{\"model\":\"m\"}", 200);
    assert_string_equal(vt_json_str(j, "done_reason"), "load");
    cJSON_Delete(j);
    j = http_json(t, "POST", "/api/chat", "{\"model\":\"m\",\"messages\":[]}", 200);
    assert_string_equal(vt_json_str(j, "done_reason"), "load");
    assert_string_equal(vt_json_str(j, "message.role"), "assistant");
    cJSON_Delete(j);
    /* refusals, Ollama's error shape */
    static const char *const bad[][2] = {
        {"/api/generate", "{\"prompt\":\"x\",\"options\":{\"mirostat\":2}}"},
        {"/api/generate", "{\"prompt\":\"x\",\"images\":[\"aGk=\"]}"},
        {"/api/generate", "{\"prompt\":\"x\",\"context\":[1,2,3]}"},
        {"/api/generate", "{\"prompt\":\"x\",\"options\":{\"num_predict\":0}}"},
        {"/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[\"aGk=\"]}]}"},
        {"/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"think\":\"very\"}"},
        {"/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"format\":42}"},
        {"/api/chat", "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":"
                      "{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = http_json(t, "POST", bad[i][0], bad[i][1], 400);
        if (!cJSON_IsString(vt_json_get(j, "error")) || !vt_json_str(j, "error")[0])
            fail_msg("%s %s: no {\"error\": text}", bad[i][0], bad[i][1]);
        cJSON_Delete(j);
    }
    /* embeddings */
    cJSON *eref = http_json(t, "POST", "/v1/embeddings", "{\"input\":[\"Once upon a time\",\"a cat\"]}", 200);
    j = http_json(t, "POST", "/api/embed", "{\"model\":\"m\",\"input\":[\"Once upon a time\",\"a cat\"]}", 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "embeddings")), 2);
    const cJSON *v0 = cJSON_GetArrayItem(vt_json_get(j, "embeddings"), 1), *r0 = vt_json_get(eref, "data.1.embedding");
    assert_int_equal(cJSON_GetArraySize(v0), cJSON_GetArraySize(r0));
    for (const cJSON *a = v0->child, *b = r0->child; a && b; a = a->next, b = b->next)
        assert_true(a->valuedouble == b->valuedouble);
    assert_string_equal(vt_json_str(j, "model"), "m");
    cJSON_Delete(j);
    j = http_json(t, "POST", "/api/embeddings", "{\"model\":\"m\",\"prompt\":\"a cat\"}", 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "embedding")), cJSON_GetArraySize(r0));
    cJSON_Delete(j);
    cJSON_Delete(eref);
    /* the model's facts */
    j = http_json(t, "GET", "/api/tags", NULL, 200);
    assert_string_equal(vt_json_str(j, "models.0.name"), t->id);
    assert_string_equal(vt_json_str(j, "models.0.details.format"), "gguf");
    assert_string_equal(vt_json_str(j, "models.0.details.family"), "llama");
    assert_true(vt_json_num(j, "models.0.size") > 0);
    cJSON_Delete(j);
    j = http_json(t, "GET", "/api/ps", NULL, 200);
    assert_string_equal(vt_json_str(j, "models.0.name"), t->id);
    assert_true(vt_json_num(j, "models.0.size_vram") > 0);
    cJSON_Delete(j);
    char show[300];
    snprintf(show, sizeof show, "{\"model\":\"%s\"}", t->id);
    j = http_json(t, "POST", "/api/show", show, 200);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(vt_json_get(j, "model_info"), "general.architecture");
    assert_true(cJSON_IsString(arch) && !strcmp(arch->valuestring, "llama"));
    assert_string_equal(vt_json_str(j, "capabilities.0"), "completion");
    cJSON_Delete(j);
    j = http_json(t, "POST", "/api/show", "{\"model\":\"no-such-model\"}", 404);
    assert_true(cJSON_IsString(vt_json_get(j, "error")));
    cJSON_Delete(j);
    j = http_json(t, "GET", "/api/version", NULL, 200);
    assert_true(cJSON_IsString(vt_json_get(j, "version")));
    cJSON_Delete(j);
    cJSON_Delete(ref);
    stop(t);
}

/* llama-server's POST /completion: the greedy text equals /v1/completions', in llama-server's shapes
 * (content, stop, stop_type, tokens_predicted, timings, generation_settings with its defaults);
 * streamed: one event per piece with its token ids, a last event with "stop": true and the
 * totals, no [DONE]; a stop word names itself; n_probs gives each token's alternatives (the
 * greedy token first); logit_bias [[id, false]] bans a token; what vkinfer lacks is a 400 naming
 * the field. */
static void test_llama_completion(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *ref = http_json(t, "POST", "/v1/completions", CMPL48, 200);
    const char *want = vt_json_str(ref, "choices.0.text");
    cJSON *j = http_json(t, "POST", "/completion", "{\"prompt\":\"Once upon a time\",\"n_predict\":48,\"temperature\":0,"
                         "\"return_tokens\":true,\"n_probs\":2,\"cache_prompt\":true,\"samplers\":[\"top_k\"]}", 200);
    assert_string_equal(vt_json_str(j, "content"), want);
    assert_true(cJSON_IsTrue(vt_json_get(j, "stop")));
    assert_string_equal(vt_json_str(j, "stop_type"), "limit");
    assert_string_equal(vt_json_str(j, "stopping_word"), "");
    assert_false(cJSON_IsTrue(vt_json_get(j, "truncated")));
    assert_int_equal(vt_json_num(j, "tokens_predicted"), 48);
    assert_int_equal(vt_json_num(j, "tokens_evaluated"), vt_json_num(ref, "usage.prompt_tokens"));
    assert_int_equal(vt_json_num(j, "timings.predicted_n"), 48);
    assert_true(vt_json_num(j, "timings.predicted_per_second") > 0);
    assert_string_equal(vt_json_str(j, "prompt"), "Once upon a time");
    assert_int_equal(vt_json_num(j, "generation_settings.n_predict"), 48);
    assert_int_equal(vt_json_num(j, "generation_settings.top_k"), 40); /* llama-server's defaults */
    assert_true(fabs(vt_json_num(j, "generation_settings.top_p") - 0.95) < 1e-6);
    assert_true(fabs(vt_json_num(j, "generation_settings.min_p") - 0.05) < 1e-6);
    const cJSON *ids = vt_json_get(j, "tokens"), *probs = vt_json_get(j, "completion_probabilities");
    assert_int_equal(cJSON_GetArraySize(ids), 48);
    assert_int_equal(cJSON_GetArraySize(probs), 48);
    const cJSON *id = ids->child;
    for (const cJSON *p = probs->child; p; p = p->next, id = id->next) {
        assert_int_equal(vt_json_num(p, "id"), id->valuedouble);
        assert_int_equal(vt_json_num(p, "top_logprobs.0.id"), id->valuedouble); /* greedy: the best */
        assert_int_equal(cJSON_GetArraySize(vt_json_get(p, "top_logprobs")), 2);
        assert_true(vt_json_num(p, "logprob") <= 0 &&
                    vt_json_num(p, "top_logprobs.1.logprob") <= vt_json_num(p, "logprob"));
    }
    int first = (int)ids->child->valuedouble;
    /* streamed: the same text and ids, then the totals */
    bool done = true;
    cJSON *ev = stream(t, "/completion", "{\"prompt\":\"Once upon a time\",\"n_predict\":48,\"temperature\":0,"
                       "\"stream\":true}", 0, &done);
    assert_false(done); /* llama-server sends no [DONE] */
    int n = cJSON_GetArraySize(ev), n_ids = 0;
    lg_buf text = {0};
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const char *s = vt_json_str(e, "content");
        lg_buf_put(&text, s, strlen(s));
        n_ids += cJSON_GetArraySize(vt_json_get(e, "tokens"));
        assert_true(cJSON_IsTrue(vt_json_get(e, "stop")) == (i == n - 1));
    }
    assert_string_equal(text.p, want);
    assert_int_equal(n_ids, 48);
    const cJSON *last = cJSON_GetArrayItem(ev, n - 1);
    assert_string_equal(vt_json_str(last, "stop_type"), "limit");
    assert_int_equal(vt_json_num(last, "tokens_predicted"), 48);
    free(text.p);
    cJSON_Delete(ev);
    /* a stop word: cut before it, and named (stories260K's answer has " a" in it) */
    cJSON *w;
    if (t->stories) {
        w = http_json(t, "POST", "/completion", "{\"prompt\":\"Once upon a time\",\"n_predict\":48,\"temperature\":0,"
                      "\"stop\":[\"no such words\",\" a\"]}", 200);
        assert_string_equal(vt_json_str(w, "stop_type"), "word");
        assert_string_equal(vt_json_str(w, "stopping_word"), " a");
        const char *cut = strstr(want, " a");
        assert_non_null(cut);
        assert_int_equal(strlen(vt_json_str(w, "content")), (size_t)(cut - want));
        cJSON_Delete(w);
    }
    /* logit_bias [[id, false]]: the greedy first token is banned */
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"n_predict\":1,\"temperature\":0,\"return_tokens\":"
             "true,\"logit_bias\":[[%d,false]]}", first);
    w = http_json(t, "POST", "/completion", body, 200);
    assert_int_not_equal(vt_json_num(w, "tokens.0"), first);
    cJSON_Delete(w);
    /* refusals name the field */
    static const struct { const char *body, *param; } bad[] = {
        {"{\"prompt\":\"x\",\"mirostat\":2}", "mirostat"},
        {"{\"prompt\":\"x\",\"typical_p\":0.5}", "typical_p"},
        {"{\"prompt\":\"x\",\"n_predict\":0}", "n_predict"},
        {"{\"n_predict\":4}", "prompt"},
        {"{\"prompt\":[\"a\",\"b\"]}", "prompt"},
        {"{\"prompt\":\"x\",\"logit_bias\":[[\"Hello\",1]]}", "logit_bias"},
        {"{\"prompt\":\"x\",\"post_sampling_probs\":true}", "post_sampling_probs"},
        {"{\"prompt\":\"x\",\"n_probs\":21}", "n_probs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *e = http_json(t, "POST", "/completion", bad[i].body, 400);
        if (strcmp(vt_json_str(e, "error.param"), bad[i].param))
            fail_msg("%s: %s", bad[i].body, cJSON_PrintUnformatted(e));
        cJSON_Delete(e);
    }
    cJSON_Delete(j);
    cJSON_Delete(ref);
    stop(t);
}

/* vLLM's add_generation_prompt / continue_final_message: the prompt with the generation prompt
 * extends the closed conversation, which extends the open one (the assistant's last message
 * without its end of turn, its text at the end); continuing answers what /v1/completions answers
 * on those ids; contradictions and a last message that is not the assistant's are 400s. */
static cJSON *ids_of_chat(T *t, const char *extra)
{
    char body[512];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"},{\"role\":"
             "\"assistant\",\"content\":\"Once upon a time\"}],\"max_tokens\":8,\"temperature\":0,"
             "\"return_token_ids\":true%s}", extra);
    return http_json(t, "POST", "/v1/chat/completions", body, 200);
}

static bool ids_prefix(const cJSON *a, const cJSON *b) /* a a proper prefix of b */
{
    if (cJSON_GetArraySize(a) >= cJSON_GetArraySize(b))
        return false;
    for (const cJSON *x = a->child, *y = b->child; x; x = x->next, y = y->next)
        if (x->valuedouble != y->valuedouble)
            return false;
    return true;
}

static void test_chat_continue(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *gen = ids_of_chat(t, ""), *closed = ids_of_chat(t, ",\"add_generation_prompt\":false"),
          *open = ids_of_chat(t, ",\"continue_final_message\":true");
    const cJSON *ig = vt_json_get(gen, "prompt_token_ids"), *ic = vt_json_get(closed, "prompt_token_ids"),
                *io = vt_json_get(open, "prompt_token_ids");
    assert_true(ids_prefix(ic, ig));
    assert_true(ids_prefix(io, ic));
    int32_t ids[256];
    size_t n = 0, len = 0;
    for (const cJSON *x = io->child; x && n < 256; x = x->next)
        ids[n++] = (int32_t)x->valuedouble;
    char text[2048];
    assert_int_equal(vki_detokenize(vki_engine_tokenizer(t->e), ids, n, 0, text, sizeof text - 1, &len), VKI_OK);
    text[len] = 0;
    assert_true(len >= 16 && !strcmp(text + len - 16, "Once upon a time"));
    char *prompt = cJSON_PrintUnformatted(io), body[2048];
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":8,\"temperature\":0}", prompt);
    cJSON *cmpl = http_json(t, "POST", "/v1/completions", body, 200);
    assert_string_equal(vt_json_str(open, "choices.0.message.content"), vt_json_str(cmpl, "choices.0.text"));
    free(prompt);
    static const struct { const char *body, *param; } bad[] = {
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\"}],\"continue_final_message\":true,"
         "\"add_generation_prompt\":true}", "continue_final_message"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"continue_final_message\":true}",
         "continue_final_message"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"add_generation_prompt\":\"yes\"}",
         "add_generation_prompt"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *e = http_json(t, "POST", "/v1/chat/completions", bad[i].body, 400);
        assert_string_equal(vt_json_str(e, "error.param"), bad[i].param);
        cJSON_Delete(e);
    }
    cJSON_Delete(cmpl);
    cJSON_Delete(gen);
    cJSON_Delete(closed);
    cJSON_Delete(open);
    stop(t);
}

/* llama-server's POST /apply-template: the conversation as the template renders it (the plain
 * fallback here: neither model has a template), whose tokens are the chat's prompt tokens. */
static void test_apply_template(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
#define MSGS "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief\"},{\"role\":\"user\",\"content\":\"Hi\"}]"
    cJSON *r = http_json(t, "POST", "/apply-template", "{" MSGS "}", 200);
    assert_string_equal(vt_json_str(r, "prompt"), "system: Be brief\nuser: Hi\nassistant:");
    cJSON *body = cJSON_CreateObject();
    cJSON_AddStringToObject(body, "content", vt_json_str(r, "prompt"));
    cJSON_AddBoolToObject(body, "add_special", true);
    char *b = cJSON_PrintUnformatted(body);
    cJSON *tk = http_json(t, "POST", "/tokenize", b, 200);
    cJSON *chat = http_json(t, "POST", "/v1/chat/completions", "{" MSGS ",\"max_tokens\":1,\"return_token_ids\":true}",
                            200);
    char *x = cJSON_PrintUnformatted(vt_json_get(tk, "tokens")),
         *y = cJSON_PrintUnformatted(vt_json_get(chat, "prompt_token_ids"));
    assert_string_equal(x, y);
    cJSON *e = http_json(t, "POST", "/apply-template", "{\"messages\":[]}", 400);
    assert_string_equal(vt_json_str(e, "error.param"), "messages");
#undef MSGS
    free(x);
    free(y);
    free(b);
    cJSON_Delete(e);
    cJSON_Delete(chat);
    cJSON_Delete(tk);
    cJSON_Delete(body);
    cJSON_Delete(r);
    stop(t);
}

/* The prompt tokens the server must have built for a chat with the fallback template. */
static size_t plain_chat_tokens(T *t, const chat_msg *m, size_t n)
{
    const vki_tokenizer *tok = vki_engine_tokenizer(t->e);
    chat_template ct;
    chat_prompt p;
    chat_specials *sp;
    int32_t *ids;
    size_t n_ids;
    assert_int_equal(chat_template_init(&ct, CHAT_PLAIN, NULL, "", ""), VKI_OK);
    assert_int_equal(chat_render(&ct, m, n, true, &p, NULL, 0), VKI_OK);
    assert_int_equal(chat_specials_create(tok, &sp), VKI_OK);
    assert_int_equal(chat_tokenize(sp, tok, &p, vki_tokenizer_adds_bos(tok), &ids, &n_ids), VKI_OK);
    free(ids);
    chat_specials_free(sp);
    chat_prompt_free(&p);
    chat_template_free(&ct);
    return n_ids;
}

static void test_chat(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    static const char body[] = "{\"model\":\"x\",\"messages\":[{\"role\":\"system\",\"content\":\"You tell stories.\"},"
                               "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Tell me\"},{\"type\":"
                               "\"text\",\"text\":\"a story\"}]}],\"max_tokens\":24,\"temperature\":0%s}";
    char b1[512], b2[512];
    snprintf(b1, sizeof b1, body, "");
    snprintf(b2, sizeof b2, body, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    cJSON *j = http_json(t, "POST", "/v1/chat/completions", b1, 200);
    assert_string_equal(vt_json_str(j, "object"), "chat.completion");
    assert_int_equal(strncmp(vt_json_str(j, "id"), "chatcmpl-", 9), 0);
    assert_string_equal(vt_json_str(j, "choices.0.message.role"), "assistant");
    const char *answer = vt_json_str(j, "choices.0.message.content");
    assert_true(answer[0] != ' '); /* SentencePiece's leading space is not part of the answer */
    const chat_msg m[] = {{CHAT_SYSTEM, "You tell stories.", 17}, {CHAT_USER, "Tell me\na story", 15}};
    assert_int_equal(vt_json_num(j, "usage.prompt_tokens"), plain_chat_tokens(t, m, 2));
    bool done;
    cJSON *ev = stream(t, "/v1/chat/completions", b2, 0, &done);
    assert_true(done);
    int n = cJSON_GetArraySize(ev);
    const cJSON *first = cJSON_GetArrayItem(ev, 0);
    assert_string_equal(vt_json_str(first, "object"), "chat.completion.chunk");
    assert_string_equal(vt_json_str(first, "choices.0.delta.role"), "assistant");
    lg_buf text = {0};
    for (int i = 1; i < n - 2; i++) {
        const char *s = vt_json_str(cJSON_GetArrayItem(ev, i), "choices.0.delta.content");
        lg_buf_put(&text, s, strlen(s));
    }
    const cJSON *fin = cJSON_GetArrayItem(ev, n - 2);
    assert_null(vt_json_get(fin, "choices.0.delta.content"));
    assert_string_equal(vt_json_str(fin, "choices.0.finish_reason"), vt_json_str(j, "choices.0.finish_reason"));
    assert_string_equal(text.p ? text.p : "", answer);
    assert_int_equal(vt_json_num(cJSON_GetArrayItem(ev, n - 1), "usage.completion_tokens"),
                     vt_json_num(j, "usage.completion_tokens"));
    free(text.p);
    cJSON_Delete(ev);
    cJSON_Delete(j);
    stop(t);
}

/* Where generation must stop in `full` given stops: the match that ends first (then starts
 * first); the text before it. Returns its length, or strlen(full) when none matches. */
static size_t expected_cut(const char *full, const char *const *stops, int n)
{
    size_t best_end = SIZE_MAX, best_start = strlen(full);
    for (int k = 0; k < n; k++) {
        const char *hit = strstr(full, stops[k]);
        if (!hit)
            continue;
        size_t st = (size_t)(hit - full), en = st + strlen(stops[k]);
        if (en < best_end || (en == best_end && st < best_start)) {
            best_end = en;
            best_start = st;
        }
    }
    return best_start;
}

/* The first run of printable ASCII in s[from, len) of at least min bytes: its start, and up to
 * want bytes of it in *n. False when there is none: a synthetic model's text of stray bytes
 * (which come out as U+FFFD, no string a client can stop on); stories260K's is ASCII throughout. */
static bool ascii_run(const char *s, size_t len, size_t from, size_t min, size_t want, size_t *at, size_t *n)
{
    for (size_t i = from; i < len;) {
        size_t j = i;
        while (j < len && (unsigned char)s[j] >= 0x20 && (unsigned char)s[j] < 0x7f)
            j++;
        if (j - i >= min) {
            *at = i;
            *n = j - i < want ? j - i : want;
            return true;
        }
        i = j + 1;
    }
    return false;
}

/* Stop strings spanning several tokens: the text before the earliest match, finish "stop", fewer
 * tokens; the same when streamed (nothing of a stop string leaks). */
static void test_stop_strings(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *whole = http_json(t, "POST", "/v1/completions", CMPL48, 200);
    const char *full = vt_json_str(whole, "choices.0.text");
    size_t len = strlen(full), a, na, c, nc;
    if (!ascii_run(full, len, len / 3, 4, 12, &a, &na) || !ascii_run(full, len, len * 2 / 3, 2, 8, &c, &nc)) {
        assert_false(t->stories);
        printf("NOTE: the synthetic model's answer has no ASCII to stop on: stop strings not checked\n");
        cJSON_Delete(whole);
        stop(t);
        return;
    }
    char stop1[64], stop2[64];
    snprintf(stop1, sizeof stop1, "%.*s", (int)na, full + a); /* ~12 bytes: several tokens */
    snprintf(stop2, sizeof stop2, "%.*s", (int)nc, full + c); /* later */
    const char *stops[] = {stop2, stop1, "never appears ~~"};
    size_t cut = expected_cut(full, stops, 3);
    assert_true(cut <= a && cut < len);
    cJSON *sb = cJSON_CreateObject();
    cJSON_AddStringToObject(sb, "prompt", "Once upon a time");
    cJSON_AddNumberToObject(sb, "max_tokens", 48);
    cJSON_AddNumberToObject(sb, "temperature", 0);
    cJSON_AddItemToObject(sb, "stop", cJSON_CreateStringArray(stops, 3));
    char *body = cJSON_PrintUnformatted(sb);
    cJSON *j = http_json(t, "POST", "/v1/completions", body, 200);
    const char *got = vt_json_str(j, "choices.0.text");
    assert_int_equal(strlen(got), cut);
    assert_memory_equal(got, full, cut);
    assert_string_equal(vt_json_str(j, "choices.0.finish_reason"), "stop");
    assert_true(vt_json_num(j, "usage.completion_tokens") < 48);
    cJSON_Delete(j);
    free(body);
    cJSON_AddTrueToObject(sb, "stream");
    body = cJSON_PrintUnformatted(sb);
    bool done;
    cJSON *ev = stream(t, "/v1/completions", body, 0, &done);
    assert_true(done);
    lg_buf text = {0};
    for (const cJSON *e = ev->child; e; e = e->next) {
        const char *s = vt_json_str(e, "choices.0.text");
        lg_buf_put(&text, s, strlen(s));
    }
    assert_int_equal(text.len, cut);
    assert_true(!cut || !memcmp(text.p, full, cut));
    assert_string_equal(vt_json_str(cJSON_GetArrayItem(ev, cJSON_GetArraySize(ev) - 1), "choices.0.finish_reason"),
                        "stop");
    free(text.p);
    cJSON_Delete(ev);
    free(body);
    cJSON_Delete(sb);
    if (t->stories) { /* "little girl named" spans tokens of this 512-piece vocabulary */
        j = http_json(t, "POST", "/v1/completions",
                      "{\"prompt\":\"Once upon a time\",\"max_tokens\":48,\"temperature\":0,\"stop\":\"little girl "
                      "named\"}", 200);
        assert_string_equal(vt_json_str(j, "choices.0.text"), ", there was a ");
        cJSON_Delete(j);
    }
    cJSON_Delete(whole);
    stop(t);
}

static void check_cmpl_logprobs(const cJSON *lp, int n_tokens, int n_top, const char *text, bool pieces_are_text)
{
    const cJSON *toks = vt_json_get(lp, "tokens"), *tlp = vt_json_get(lp, "token_logprobs"),
                *top = vt_json_get(lp, "top_logprobs");
    const cJSON *off = vt_json_get(lp, "text_offset");
    assert_int_equal(cJSON_GetArraySize(toks), n_tokens);
    assert_int_equal(cJSON_GetArraySize(tlp), n_tokens);
    assert_int_equal(cJSON_GetArraySize(top), n_tokens);
    assert_int_equal(cJSON_GetArraySize(off), n_tokens);
    lg_buf joined = {0};
    double prev = -1;
    for (int i = 0; i < n_tokens; i++) {
        const char *s = cJSON_GetArrayItem(toks, i)->valuestring;
        lg_buf_put(&joined, s, strlen(s));
        double l = cJSON_GetArrayItem(tlp, i)->valuedouble;
        assert_true(l <= 0);
        const cJSON *alts = cJSON_GetArrayItem(top, i);
        assert_true(cJSON_IsObject(alts));
        assert_true(cJSON_GetArraySize(alts) >= 1 && cJSON_GetArraySize(alts) <= n_top);
        double best = -1e30;
        for (const cJSON *a = alts->child; a; a = a->next)
            best = a->valuedouble > best ? a->valuedouble : best;
        assert_true(fabs(best - l) < 1e-4); /* greedy: the chosen token is the most likely */
        double o = cJSON_GetArrayItem(off, i)->valuedouble;
        assert_true(o > prev || (i && o == prev));
        prev = o;
    }
    if (pieces_are_text) /* no stop string, no special token, whole characters: pieces = text */
        assert_string_equal(joined.p, text);
    free(joined.p);
}

static void test_logprobs(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *j = http_json(t, "POST", "/v1/completions",
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,\"logprobs\":3}", 200);
    check_cmpl_logprobs(vt_json_get(j, "choices.0.logprobs"), 12, 3, vt_json_str(j, "choices.0.text"), t->stories);
    cJSON_Delete(j);
    /* chat: content[] with token, logprob, bytes, top_logprobs */
    j = http_json(t, "POST", "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":8,\"temperature\":0,"
                  "\"logprobs\":true,\"top_logprobs\":2,\"ignore_eos\":true}", 200);
    const cJSON *c = vt_json_get(j, "choices.0.logprobs.content");
    assert_int_equal(cJSON_GetArraySize(c), 8);
    for (const cJSON *e = c->child; e; e = e->next) {
        const char *tok = vt_json_str(e, "token");
        const cJSON *bytes = vt_json_get(e, "bytes");
        bool ascii = true;
        for (int k = 0; k < cJSON_GetArraySize(bytes); k++)
            ascii &= cJSON_GetArrayItem(bytes, k)->valueint < 0x80;
        if (ascii) { /* then the token text is exactly its bytes */
            assert_int_equal((size_t)cJSON_GetArraySize(bytes), strlen(tok));
            for (int k = 0; k < cJSON_GetArraySize(bytes); k++)
                assert_int_equal(cJSON_GetArrayItem(bytes, k)->valueint, (unsigned char)tok[k]);
        }
        assert_true(vt_json_num(e, "logprob") <= 0);
        const cJSON *top = vt_json_get(e, "top_logprobs");
        assert_int_equal(cJSON_GetArraySize(top), 2);
        assert_string_equal(vt_json_str(top, "0.token"), tok);
        assert_true(vt_json_num(top, "0.logprob") >= vt_json_num(top, "1.logprob"));
    }
    cJSON_Delete(j);
    /* chat without logprobs: null; streaming completions: per-chunk logprobs */
    bool done;
    cJSON *ev = stream(t, "/v1/completions",
                       "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"temperature\":0,\"logprobs\":1,\"stream\":"
                       "true}", 0, &done);
    int with_lp = 0;
    for (const cJSON *e = ev->child; e; e = e->next) {
        const cJSON *lp = vt_json_get(e, "choices.0.logprobs");
        if (cJSON_IsObject(lp))
            with_lp += cJSON_GetArraySize(vt_json_get(lp, "tokens"));
    }
    assert_int_equal(with_lp, 6);
    cJSON_Delete(ev);
    stop(t);
}

/* ---- errors ----------------------------------------------------------------------------------- */

typedef struct bad_case {
    const char *path, *body;
    int status;
    const char *param; /* NULL: param is null */
    const char *in_msg;
} bad_case;

static const bad_case BAD[] = {
    {"/v1/completions", "{\"prompt\":\"x\",", 400, NULL, "not valid JSON"},
    {"/v1/completions", "[1,2]", 400, NULL, "JSON object"},
    {"/v1/completions", "{\"prompt\":\"x\",\"temperature\":3}", 400, "temperature", "temperature"},
    {"/v1/completions", "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature", "number"},
    {"/v1/completions", "{\"prompt\":\"x\",\"top_p\":0}", 400, "top_p", "top_p"},
    {"/v1/completions", "{\"prompt\":\"x\",\"top_k\":1.5}", 400, "top_k", "integer"},
    {"/v1/completions", "{\"prompt\":\"x\",\"min_p\":2}", 400, "min_p", "min_p"},
    {"/v1/completions", "{\"prompt\":\"x\",\"presence_penalty\":-3}", 400, "presence_penalty", "presence_penalty"},
    {"/v1/completions", "{\"prompt\":\"x\",\"frequency_penalty\":3}", 400, "frequency_penalty", "frequency_penalty"},
    {"/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", "max_tokens"},
    {"/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":100000000}", 400, "max_tokens", "context"},
    {"/v1/completions", "{\"prompt\":\"x\",\"best_of\":3}", 400, "best_of", "best_of"},
    {"/v1/completions", "{\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "suffix", "suffix"},
    {"/v1/completions", "{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs", "logprobs"},
    {"/v1/completions", "{\"prompt\":\"x\",\"stop\":\"\"}", 400, "stop", "stop[0]"},
    {"/v1/completions", "{\"prompt\":\"x\",\"stop\":[\"a\",3]}", 400, "stop", "stop[1]"},
    {"/v1/completions", "{\"prompt\":\"x\",\"seed\":1.5}", 400, "seed", "seed"},
    {"/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}", 400, "logit_bias", "logit_bias"},
    {"/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"5\":101}}", 400, "logit_bias", "logit_bias"},
    {"/v1/completions", "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options",
     "stream"},
    {"/v1/completions", "{\"max_tokens\":3}", 400, "prompt", "prompt"},
    {"/v1/completions", "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "batched"},
    {"/v1/completions", "{\"prompt\":[1,99999999]}", 400, "prompt", "prompt[1]"},
    {"/v1/completions", "{\"prompt\":[]}", 400, "prompt", "empty"},
    {"/v1/completions", "{\"prompt\":{}}", 400, "prompt", "prompt"},
    {"/v1/completions", "{\"prompt\":\"x\",\"model\":7}", 400, "model", "model"},
    {"/v1/chat/completions", "{\"prompt\":\"x\"}", 400, "messages", "messages"},
    {"/v1/chat/completions", "{\"messages\":[]}", 400, "messages", "messages"},
    {"/v1/chat/completions", "{\"messages\":\"hi\"}", 400, "messages", "messages"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages", "messages[0].content"},
    {"/v1/chat/completions", "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages", "messages[0].role"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"function\","
     "\"content\":\"b\"}]}", 400, "messages", "messages[1].role"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
     "messages", "messages[0].content[0]"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
     "\"function\"}]}", 400, "tools", "tools"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}", 400,
     "tool_choice", "tool_choice"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[{}]}", 400,
     "functions", "functions"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
     "\"yaml\"}}", 400, "response_format", "response_format"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400,
     "top_logprobs", "logprobs"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", 400,
     "logprobs", "boolean"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}", 400, "echo",
     "echo"},
    {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}",
     400, "max_completion_tokens", "max_completion_tokens"},
    /* strict JSON: nothing may mean two things */
    {"/v1/completions", "{\"prompt\":\"x\"} xyz", 400, NULL, "after the JSON value"},
    {"/v1/completions", "{\"prompt\":\"x\"}{\"prompt\":\"y\"}", 400, NULL, "after the JSON value"},
    {"/v1/completions", "{\"prompt\":\"x\",\"temperature\":0,\"temperature\":1}", 400, NULL, "duplicate key"},
    {"/v1/completions", "{\"prompt\":\"Once upon\\u0000 a time there was\"}", 400, "prompt", "NUL"},
    {"/v1/completions", "{\"prompt\":\"\\ud800\"}", 400, "prompt", "surrogate"},
    {"/v1/completions", "{\"prompt\":\"\xff\"}", 400, "prompt", "UTF-8"},
    {"/v1/completions", "{\"prompt\":\"x\",\"top_k\":01}", 400, "top_k", "number"},
    {"/v1/completions", "{\"prompt\":\"x\",\"temperature\":NaN}", 400, "temperature", "invalid"},
    {"/v1/completions", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
     "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", 400, NULL, "nesting"},
    {"/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\" 5\":1}}", 400, "logit_bias", "logit_bias"},
    {"/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"+5\":1}}", 400, "logit_bias", "logit_bias"},
    {"/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"05\":1}}", 400, "logit_bias", "logit_bias"},
    /* fields added for vLLM / llama.cpp clients, and what stays refused */
    {"/v1/completions", "{\"prompt\":\"x\",\"n\":17}", 400, "n", "n"},
    {"/v1/completions", "{\"prompt\":\"x\",\"n\":2,\"best_of\":3}", 400, "best_of", "best_of"},
    {"/v1/completions", "{\"prompt\":\"x\",\"echo\":true,\"logprobs\":1}", 400, "logprobs", "echo"},
    {"/v1/completions", "{\"prompt\":\"x\",\"min_tokens\":5,\"max_tokens\":4}", 400, "min_tokens", "min_tokens"},
    {"/v1/completions", "{\"prompt\":\"x\",\"stop_token_ids\":[99999999]}", 400, "stop_token_ids", "stop_token_ids"},
    {"/v1/completions", "{\"prompt\":\"x\",\"ignore_eos\":1}", 400, "ignore_eos", "boolean"},
    {"/v1/completions", "{\"prompt\":\"x\",\"skip_special_tokens\":\"no\"}", 400, "skip_special_tokens", "boolean"},
    {"/v1/completions", "{\"prompt\":\"x\",\"grammar\":\"root ::= x\"}", 400, "grammar", "undefined rule 'x'"},
    {"/v1/completions", "{\"prompt\":\"x\",\"guided_regex\":\"a+\"}", 400, "guided_regex", "guided_regex"},
    /* vLLM's beam search fields */
    {"/v1/completions", "{\"prompt\":\"x\",\"use_beam_search\":true,\"stream\":true}", 400, "use_beam_search",
     "stream"},
    {"/v1/completions", "{\"prompt\":\"x\",\"length_penalty\":1}", 400, "length_penalty", "use_beam_search"},
    {"/v1/completions", "{\"prompt\":\"x\",\"use_beam_search\":true,\"n\":3,\"best_of\":2}", 400, "best_of",
     "best_of"},
    {"/v1/completions", "{\"prompt\":\"x\",\"use_beam_search\":true,\"early_stopping\":\"soon\"}", 400,
     "early_stopping", "early_stopping"},
};

static void test_errors(void **state)
{
    T *t = *state;
    start(t, NULL, 4096);
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        const bad_case *c = &BAD[i];
        char *out;
        int st = http(t, "POST", c->path, c->body, NULL, &out);
        cJSON *j = cJSON_Parse(out);
        const cJSON *param = vt_json_get(j, "error.param"), *msg = vt_json_get(j, "error.message");
        if (st != c->status || !cJSON_IsString(msg) || !strstr(msg->valuestring, c->in_msg) ||
            (c->param ? !cJSON_IsString(param) || strcmp(param->valuestring, c->param) : !cJSON_IsNull(param)) ||
            !cJSON_IsString(vt_json_get(j, "error.type")))
            fail_msg("%s %s: got %d %s", c->path, c->body, st, out);
        assert_string_equal(vt_json_str(j, "error.type"), "invalid_request_error");
        cJSON_Delete(j);
        free(out);
    }
    /* accepted at their "nothing asked" values */
    cJSON *ok = http_json(t, "POST", "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":"
                          "\"x\"}],\"n\":1,\"tools\":[],\"tool_choice\":\"none\",\"response_format\":{\"type\":"
                          "\"text\"},\"user\":\"u\",\"seed\":-5,\"max_tokens\":2,\"stop\":null,\"top_k\":-1}", 200);
    cJSON_Delete(ok);
    /* fields nobody knows: accepted, named in a warning */
    cJSON_Delete(http_json(t, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2,\"foo\":1,\"bar\":[1]}",
                           200));
    assert_true(log_has(t, "ignored unknown fields: foo, bar"));
    /* 404, 405 with Allow, 413 (Content-Length over the limit; and a body that grows past it) */
    lg_resp r;
    char *out;
    assert_int_equal(http(t, "GET", "/v2/nothing", NULL, &r, &out), 404);
    assert_non_null(strstr(out, "\"error\""));
    free(out);
    assert_int_equal(http(t, "GET", "/v1/completions", NULL, &r, &out), 405);
    assert_int_equal(strncmp(lg_header(&r, "Allow"), "POST", 4), 0);
    free(out);
    assert_int_equal(http(t, "POST", "/health", "{}", &r, &out), 405);
    assert_int_equal(strncmp(lg_header(&r, "Allow"), "GET", 3), 0);
    free(out);
    char *big = malloc(8192);
    memset(big, ' ', 8191);
    big[8191] = 0;
    memcpy(big, "{\"prompt\":\"", 11);
    assert_int_equal(http(t, "POST", "/v1/completions", big, &r, &out), 413);
    assert_non_null(strstr(out, "4096"));
    free(out);
    free(big);
    assert_int_equal(metric(t, "vkinfer_requests_total{outcome=\"invalid\"}"), sizeof BAD / sizeof BAD[0]);
    assert_int_equal(metric(t, "vkinfer_http_responses_total{code=\"413\"}"), 1); /* refused before the route */
    assert_int_equal(metric(t, "vkinfer_http_responses_total{code=\"405\"}"), 2);
    stop(t);
}

/* ---- queue full, hang-ups, many connections -------------------------------------------------- */

/* Opens a stream and reads until its first text arrives (the request is running). */
static void open_stream_at(T *t, lg_http *h, const char *path, const char *body)
{
    lg_http_init(h, "127.0.0.1", t->port, 120);
    lg_resp r;
    assert_true(lg_http_send(h, "POST", path, body, strlen(body), NULL));
    assert_true(lg_http_head(h, &r));
    assert_int_equal(r.status, 200);
    sse_coll c = {.events = cJSON_CreateArray(), .hang = 1};
    lg_sse sse = {.on_data = on_sse, .user = &c};
    assert_int_equal(lg_http_body(h, &r, lg_sse_feed, &sse), 0);
    cJSON_Delete(c.events);
    free(sse.line.p);
}

static void open_stream(T *t, lg_http *h, const char *body) { open_stream_at(t, h, "/v1/completions", body); }

static const char LONG[] = "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,\"ignore_eos\":true,\"stream\":true}";

/* max_batch_size 1, max_queue 1: one running, one waiting, the next one gets 429. */
static void test_queue_full(void **state)
{
    T *t = *state;
    vki_batch_params bp = vki_batch_default_params();
    bp.max_batch_size = 1;
    bp.max_queue = 1;
    start(t, &bp, 0);
    lg_http a, b;
    open_stream(t, &a, LONG); /* running */
    lg_http_init(&b, "127.0.0.1", t->port, 120);
    assert_true(lg_http_send(&b, "POST", "/v1/completions", LONG, strlen(LONG), NULL)); /* queued */
    wait_metric(t, "vkinfer_active_requests", 2);
    wait_metric(t, "vkinfer_queue_length", 1);
    assert_int_equal(metric(t, "vkinfer_running_requests"), 1); /* the queued one is not running */
    lg_resp r;
    char *out;
    assert_int_equal(http(t, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}", &r, &out), 429);
    assert_non_null(lg_header(&r, "Retry-After"));
    cJSON *j = cJSON_Parse(out);
    assert_string_equal(vt_json_str(j, "error.type"), "rate_limit_error");
    assert_string_equal(vt_json_str(j, "error.code"), "rate_limit_exceeded");
    cJSON_Delete(j);
    free(out);
    assert_int_equal(metric(t, "vkinfer_requests_total{outcome=\"queue_full\"}"), 1);
    /* the waiting one hangs up while queued, then the running one: both are cancelled */
    lg_http_close(&b);
    wait_metric(t, "vkinfer_active_requests", 1);
    lg_http_close(&a);
    wait_metric(t, "vkinfer_active_requests", 0);
    assert_int_equal(metric(t, "vkinfer_requests_total{outcome=\"cancelled\"}"), 2);
    stop(t);
}

/* A client that hangs up mid-stream (and one that hangs up waiting for a JSON answer): the request
 * is cancelled and its KV blocks are freed. */
static void test_disconnect(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    lg_http h;
    open_stream(t, &h, LONG);
    assert_int_equal(metric(t, "vkinfer_active_requests"), 1);
    double t0 = lg_now();
    lg_http_close(&h);
    wait_metric(t, "vkinfer_active_requests", 0);
    printf("stream hang-up -> request finished in %.1f ms\n", (lg_now() - t0) * 1e3);
    assert_int_equal(metric(t, "vkinfer_requests_total{outcome=\"cancelled\"}"), 1);
    static const char json_long[] = "{\"prompt\":\"Once upon a time\",\"max_tokens\":1500,\"ignore_eos\":true}";
    lg_http_init(&h, "127.0.0.1", t->port, 120);
    assert_true(lg_http_send(&h, "POST", "/v1/completions", json_long, strlen(json_long), NULL));
    wait_metric(t, "vkinfer_active_requests", 1);
    lg_http_close(&h);
    wait_metric(t, "vkinfer_active_requests", 0);
    assert_int_equal(metric(t, "vkinfer_requests_total{outcome=\"cancelled\"}"), 2);
    /* The KV gauges come from the stats of the last tick with work, and a manager that went idle
     * through a cancellation runs no further tick: one more request makes a tick whose stats show
     * the pool with the cancelled requests' blocks returned. */
    cJSON_Delete(http_json(t, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2}", 200));
    wait_metric(t, "vkinfer_kv_blocks{state=\"used\"}", 0); /* its tick's stats follow its answer */
    assert_int_equal(metric(t, "vkinfer_kv_blocks{state=\"free\"}") + metric(t, "vkinfer_kv_blocks{state=\"cached\"}"),
                     metric(t, "vkinfer_kv_blocks_max"));
    stop(t);
}

/* 300 connections at once, half of them streams, every request sent before any answer is read. */
static void test_many_connections(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    enum { N = 300 };
    lg_http *h = calloc(N, sizeof *h);
    static const char plain[] = "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"ignore_eos\":true}";
    static const char sse[] = "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"ignore_eos\":true,\"stream\":true,"
                              "\"stream_options\":{\"include_usage\":true}}";
    for (int i = 0; i < N; i++) {
        const char *body = i % 2 ? sse : plain;
        lg_http_init(&h[i], "127.0.0.1", t->port, 120);
        assert_true(lg_http_send(&h[i], "POST", "/v1/completions", body, strlen(body), NULL));
    }
    for (int i = 0; i < N; i++) {
        lg_resp r;
        lg_buf b = {0};
        sse_coll c = {.events = cJSON_CreateArray()};
        lg_sse parse = {.on_data = on_sse, .user = &c};
        assert_true(lg_http_head(&h[i], &r));
        assert_int_equal(r.status, 200);
        assert_int_equal(i % 2 ? lg_http_body(&h[i], &r, lg_sse_feed, &parse) : lg_http_body(&h[i], &r, lg_collect, &b),
                         1);
        cJSON *j = i % 2 ? NULL : cJSON_Parse(b.p);
        const cJSON *last = i % 2 ? cJSON_GetArrayItem(c.events, cJSON_GetArraySize(c.events) - 1) : j;
        assert_true(i % 2 == 0 || c.done);
        assert_int_equal(vt_json_num(last, "usage.completion_tokens"), 3);
        cJSON_Delete(j);
        cJSON_Delete(c.events);
        free(parse.line.p);
        free(b.p);
        lg_http_close(&h[i]);
    }
    free(h);
    assert_int_equal(metric(t, "vkinfer_requests_total{outcome=\"length\"}"), N);
    stop(t);
}

/* ---- drain and shutdown ------------------------------------------------------------------------ */

typedef struct bg_stream {
    T *t;
    const char *body;
    cJSON *events;
    bool done;
} bg_stream;

static void *bg_reader(void *arg)
{
    bg_stream *b = arg;
    lg_http h;
    lg_resp r;
    lg_http_init(&h, "127.0.0.1", b->t->port, 120);
    sse_coll c = {.events = cJSON_CreateArray()};
    lg_sse sse = {.on_data = on_sse, .user = &c};
    if (lg_http_send(&h, "POST", "/v1/completions", b->body, strlen(b->body), NULL) && lg_http_head(&h, &r) &&
        r.status == 200)
        lg_http_body(&h, &r, lg_sse_feed, &sse);
    lg_http_close(&h);
    free(sse.line.p);
    b->events = c.events;
    b->done = c.done;
    return NULL;
}

static void test_drain(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    /* a kept-alive connection opened before the drain, and a stream running through it */
    lg_http k;
    lg_http_init(&k, "127.0.0.1", t->port, 120);
    lg_resp r;
    lg_buf b = {0};
    assert_int_equal(lg_http_request(&k, "GET", "/health/ready", NULL, &r, &b), 200);
    bg_stream run = {.t = t, .body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"ignore_eos\":true,"
                                      "\"stream\":true}"};
    pthread_t th;
    pthread_create(&th, NULL, bg_reader, &run);
    wait_metric_at_least(t, "vkinfer_generation_tokens_total", 1);
    srv_drain_begin(t->s);
    b.len = 0;
    assert_int_equal(lg_http_request(&k, "GET", "/health/ready", NULL, &r, &b), 503);
    assert_non_null(strstr(b.p, "draining"));
    assert_false(r.keep_alive); /* sent elsewhere */
    lg_http k2;
    lg_http_init(&k2, "127.0.0.1", t->port, 2);
    assert_false(lg_http_connect(&k2)); /* no new connections */
    assert_true(srv_wait_idle(t->s, 60));
    pthread_join(th, NULL);
    assert_true(run.done); /* the running stream finished normally */
    assert_string_equal(vt_json_str(cJSON_GetArrayItem(run.events, cJSON_GetArraySize(run.events) - 1),
                                "choices.0.finish_reason"), "length");
    cJSON_Delete(run.events);
    lg_http_close(&k);
    free(b.p);
    stop(t);

    /* shutdown with a request running: it still gets a final event (an error) and [DONE] */
    start(t, NULL, 0);
    bg_stream bs = {.t = t, .body = LONG};
    pthread_create(&th, NULL, bg_reader, &bs);
    wait_metric_at_least(t, "vkinfer_generation_tokens_total", 3);
    stop(t);
    pthread_join(th, NULL);
    assert_true(bs.done);
    const cJSON *last = cJSON_GetArrayItem(bs.events, cJSON_GetArraySize(bs.events) - 1);
    assert_string_equal(vt_json_str(last, "error.type"), "server_error");
    assert_non_null(strstr(vt_json_str(last, "error.message"), "shut down"));
    cJSON_Delete(bs.events);
}

/* The exposition format: HELP/TYPE for every family, cumulative buckets ending in +Inf = count,
 * counters that match what was served. */
static void test_metrics(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    uint64_t prompt = 0, gen = 0;
    for (int i = 0; i < 3; i++) {
        cJSON *j = http_json(t, "POST", "/v1/completions", "{\"prompt\":\"Once upon\",\"max_tokens\":5,\"ignore_eos\":true}",
                             200);
        prompt += (uint64_t)vt_json_num(j, "usage.prompt_tokens");
        gen += (uint64_t)vt_json_num(j, "usage.completion_tokens");
        cJSON_Delete(j);
    }
    lg_resp r;
    char *m;
    assert_int_equal(http(t, "GET", "/metrics", NULL, &r, &m), 200);
    assert_int_equal(strncmp(lg_header(&r, "Content-Type"), "text/plain; version=0.0.4", 25), 0);
    static const char *const fams[] = {
        "vkinfer_requests_total", "vkinfer_prompt_tokens_total", "vkinfer_generation_tokens_total",
        "vkinfer_active_requests", "vkinfer_queue_length", "vkinfer_kv_blocks",
        "vkinfer_time_to_first_token_seconds", "vkinfer_inter_token_latency_seconds", "vkinfer_step_time_seconds",
        "vkinfer_steps_reused_total", "vkinfer_steps_ahead_total"};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        char help[128], type[128];
        snprintf(help, sizeof help, "# HELP %s ", fams[i]);
        snprintf(type, sizeof type, "# TYPE %s ", fams[i]);
        assert_non_null(strstr(m, help));
        assert_non_null(strstr(m, type));
    }
    /* each histogram: cumulative buckets, +Inf equal to _count */
    for (char *l = strstr(m, "# TYPE "); l; l = strstr(l + 1, "# TYPE ")) {
        char name[96], kind[16];
        if (sscanf(l, "# TYPE %95s %15s", name, kind) != 2 || strcmp(kind, "histogram"))
            continue;
        char key[128];
        snprintf(key, sizeof key, "%s_bucket{", name);
        double prev = 0, inf = -1;
        for (char *b = strstr(l, key); b; b = strstr(b + 1, key)) {
            double v = strtod(strchr(b, '}') + 2, NULL);
            assert_true(v >= prev);
            prev = v;
            if (strstr(b, "le=\"+Inf\"") == b + strlen(key))
                inf = v;
        }
        snprintf(key, sizeof key, "\n%s_count ", name); /* from the same scrape: ticks go on */
        const char *cnt = strstr(l, key);
        assert_true(inf >= 0 && cnt);
        assert_true(inf == strtod(cnt + strlen(key), NULL));
    }
    free(m);
    assert_int_equal(metric(t, "vkinfer_prompt_tokens_total"), prompt);
    assert_int_equal(metric(t, "vkinfer_generation_tokens_total"), gen);
    assert_int_equal(metric(t, "vkinfer_time_to_first_token_seconds_count"), 3);
    assert_int_equal(metric(t, "vkinfer_inter_token_latency_seconds_count"), gen - 3);
    assert_int_equal(metric(t, "vkinfer_requests_total{outcome=\"length\"}"), 3);
    assert_true(metric(t, "vkinfer_step_time_seconds_count") >= 5);
    /* three one-sequence decodes of 4 steps each: all but the first of a shape are resubmitted */
    assert_true(metric(t, "vkinfer_steps_reused_total") >= 3);
    /* a step per iteration, plus lookahead steps submitted for a request that ended meanwhile
     * (counted by the engine, no iteration of their own: seen under ASan, whose slower host
     * lets the lookahead go out before the last token is read) */
    assert_true(metric(t, "vkinfer_steps_reused_total") <=
                metric(t, "vkinfer_iterations") + metric(t, "vkinfer_steps_ahead_total"));
    assert_int_equal(metric(t, "vkinfer_ready"), 1);
    stop(t);
}

/* ---- the other routes ------------------------------------------------------------------------ */

static cJSON *ids_of(const vki_tokenizer *tok, const char *text, bool add_special, size_t *n)
{
    int32_t ids[256];
    assert_int_equal(vki_tokenize(tok, text, strlen(text), add_special, true, ids, 256, n), VKI_OK);
    return cJSON_CreateIntArray(ids, (int)*n);
}

static void test_routes(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    const vki_tokenizer *tok = vki_engine_tokenizer(t->e);
    cJSON *j = http_json(t, "GET", "/version", NULL, 200);
    assert_string_equal(vt_json_str(j, "version"), SRV_VERSION);
    cJSON_Delete(j);
    j = http_json(t, "GET", "/props", NULL, 200);
    cJSON *m = http_json(t, "GET", "/v1/models", NULL, 200);
    assert_string_equal(vt_json_str(j, "model"), t->id);
    assert_int_equal(vt_json_num(j, "n_ctx"), vt_json_num(m, "data.0.max_model_len"));
    assert_int_equal(vt_json_num(j, "n_ctx"), vt_json_num(m, "data.0.meta.n_ctx"));
    assert_true(vt_json_num(m, "data.0.meta.n_ctx_train") > 0);
    assert_string_equal(vt_json_str(j, "policy"), "max-util");
    assert_true(cJSON_IsObject(vt_json_get(j, "default_generation_settings")));
    if (t->stories)
        assert_string_equal(vt_json_str(j, "chat_template"), "plain"); /* stories260K has none */
    cJSON_Delete(j);
    cJSON_Delete(m);
    /* /tokenize as llama-server: no BOS unless add_special, control tokens parsed, pieces */
    size_t n;
    cJSON *want = ids_of(tok, "Once upon a time", false, &n);
    j = http_json(t, "POST", "/tokenize", "{\"content\":\"Once upon a time\"}", 200);
    assert_true(cJSON_Compare(vt_json_get(j, "tokens"), want, true));
    cJSON_Delete(j);
    cJSON_Delete(want);
    want = ids_of(tok, "Once upon a time", true, &n);
    j = http_json(t, "POST", "/tokenize", "{\"content\":\"Once upon a time\",\"add_special\":true,\"with_pieces\":true}",
                  200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "tokens")), n);
    for (size_t i = 0; i < n; i++) {
        char path[48];
        snprintf(path, sizeof path, "tokens.%zu.id", i);
        assert_int_equal(vt_json_num(j, path), cJSON_GetArrayItem(want, (int)i)->valueint);
        snprintf(path, sizeof path, "tokens.%zu.piece", i);
        vt_json_str(j, path);
    }
    cJSON_Delete(j);
    /* /detokenize: the ids back to the text */
    char *ids = cJSON_PrintUnformatted(want), body[512], text[256];
    snprintf(body, sizeof body, "{\"tokens\":%s}", ids);
    int32_t v[64];
    for (size_t i = 0; i < n; i++)
        v[i] = cJSON_GetArrayItem(want, (int)i)->valueint;
    size_t len = 0;
    assert_int_equal(vki_detokenize(tok, v, n, 0, text, sizeof text - 1, &len), VKI_OK);
    text[len] = 0;
    j = http_json(t, "POST", "/detokenize", body, 200);
    assert_string_equal(vt_json_str(j, "content"), text);
    cJSON_Delete(j);
    free(ids);
    cJSON_Delete(want);
    cJSON_Delete(http_json(t, "POST", "/detokenize", "{\"tokens\":[1,99999999]}", 400));
    cJSON_Delete(http_json(t, "POST", "/tokenize", "{\"text\":\"x\"}", 400));
    stop(t);
}

static void embedding_of(const cJSON *j, int i, float *out, int d)
{
    char path[48];
    snprintf(path, sizeof path, "data.%d.embedding", i);
    const cJSON *e = vt_json_get(j, path);
    assert_int_equal(cJSON_GetArraySize(e), d);
    int k = 0;
    for (const cJSON *x = e->child; x; x = x->next)
        out[k++] = (float)x->valuedouble;
}

/* /v1/embeddings: shape, unit length, one vector per input, base64 = the same floats. (That the
 * vector is the model's pooled final hidden state is checked in test_batch_e2e against the CPU
 * reference.) A model declaring <arch>.pooling_type 3 (Qwen3-Embedding's last) pools that way by
 * default: its vectors those of --pooling last, not mean's, and --pooling mean still wins. */
static void test_embeddings(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    vki_model_info mi;
    vki_engine_info(t->e, &mi);
    int d = (int)mi.d_model;
    float *a = calloc((size_t)d * 4, sizeof *a), *b = a + d, *c = b + d, *x = c + d;
    cJSON *j = http_json(t, "POST", "/v1/embeddings",
                         "{\"model\":\"m\",\"input\":[\"Once upon a time\",\"Once upon a time\",\"A dog ran\"]}", 200);
    assert_string_equal(vt_json_str(j, "object"), "list");
    assert_string_equal(vt_json_str(j, "data.2.object"), "embedding");
    assert_int_equal(vt_json_num(j, "data.2.index"), 2);
    embedding_of(j, 0, a, d);
    embedding_of(j, 1, b, d);
    embedding_of(j, 2, c, d);
    double norm = 0;
    for (int i = 0; i < d; i++)
        norm += (double)a[i] * a[i];
    assert_true(fabs(sqrt(norm) - 1) < 1e-5); /* L2-normalised; achieved ~1e-7 */
    assert_memory_equal(a, b, (size_t)d * sizeof *a);
    assert_memory_not_equal(a, c, (size_t)d * sizeof *a);
    assert_true(vt_json_num(j, "usage.prompt_tokens") > 6);
    cJSON_Delete(j);
    /* base64: little-endian float32, the same numbers */
    j = http_json(t, "POST", "/v1/embeddings", "{\"input\":\"Once upon a time\",\"encoding_format\":\"base64\"}", 200);
    const char *s64 = vt_json_str(j, "data.0.embedding");
    static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char *raw = (unsigned char *)x;
    size_t nb = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (const char *p = s64; *p && *p != '='; p++) {
        acc = acc << 6 | (uint32_t)(strchr(tbl, *p) - tbl);
        if ((bits += 6) >= 8)
            raw[nb++] = (unsigned char)(acc >> (bits -= 8));
    }
    assert_int_equal(nb, (size_t)d * 4);
    assert_memory_equal(x, a, (size_t)d * sizeof *a);
    cJSON_Delete(j);
    cJSON_Delete(http_json(t, "POST", "/v1/embeddings", "{\"input\":[5,6,7]}", 200));
    j = http_json(t, "POST", "/v1/embeddings", "{\"input\":\"x\",\"dimensions\":8}", 400);
    assert_string_equal(vt_json_str(j, "error.param"), "dimensions");
    cJSON_Delete(j);
    cJSON_Delete(http_json(t, "POST", "/v1/embeddings", "{\"input\":[]}", 400));
    cJSON_Delete(http_json(t, "POST", "/v1/embeddings", "{\"input\":\"x\",\"encoding_format\":\"hex\"}", 400));
    j = http_json(t, "GET", "/props", NULL, 200);
    assert_string_equal(vt_json_str(j, "embeddings_pooling"), "mean"); /* no pooling_type: mean */
    cJSON_Delete(j);
    stop(t);
    /* the reference for last: the group's model with --pooling last */
    srv_params p = test_params(t);
    p.pooling = VKI_POOL_LAST;
    start_p(t, t->e, &p);
    static const char one[] = "{\"input\":\"Once upon a time\"}";
    j = http_json(t, "POST", "/v1/embeddings", one, 200);
    embedding_of(j, 0, b, d);
    cJSON_Delete(j);
    stop(t);
    assert_memory_not_equal(a, b, (size_t)d * sizeof *a);
    char path[96], key[64];
    snprintf(path, sizeof path, "/tmp/vki_test_server_pool_%d.gguf", (int)getpid());
    snprintf(key, sizeof key, "%s.pooling_type", mi.arch);
    gguf_edit ed = {.kind = GGUF_EDIT_U32, .name = key, .u = 3};
    assert_int_equal(gguf_edit_copy(t->model, path, &ed, 1), VKI_OK);
    vki_engine_params ep = vt_engine_params(1024, 4, &t->validation);
    vki_engine *e = NULL;
    char err[256] = "";
    if (vki_engine_create(path, &ep, &e, err, sizeof err) != VKI_OK)
        fail_msg("engine: %s", err);
    vki_model_info emi;
    vki_engine_info(e, &emi);
    assert_int_equal(emi.pooling, VKI_POOL_LAST);
    for (int explicit_mean = 0; explicit_mean < 2; explicit_mean++) {
        p = test_params(t);
        p.model_path = path;
        p.pooling = explicit_mean ? VKI_POOL_MEAN : VKI_POOL_NONE;
        start_p(t, e, &p);
        j = http_json(t, "POST", "/v1/embeddings", one, 200);
        embedding_of(j, 0, c, d);
        cJSON_Delete(j);
        assert_memory_equal(c, explicit_mean ? a : b, (size_t)d * sizeof *a);
        j = http_json(t, "GET", "/props", NULL, 200);
        assert_string_equal(vt_json_str(j, "embeddings_pooling"), explicit_mean ? "mean" : "last");
        cJSON_Delete(j);
        char show[160];
        const char *base = strrchr(path, '/') + 1; /* the model id: the file name without .gguf */
        snprintf(show, sizeof show, "{\"model\":\"%.*s\"}", (int)(strlen(base) - 5), base);
        j = http_json(t, "POST", "/api/show", show, 200); /* Ollama: an embedding model */
        bool emb = false;
        for (const cJSON *v = vt_json_get(j, "capabilities")->child; v; v = v->next)
            emb |= !strcmp(v->valuestring, "embedding");
        assert_true(emb);
        cJSON_Delete(j);
        stop(t);
    }
    vki_engine_destroy(e);
    unlink(path);
    free(a);
}

/* ---- n choices, echo, request fields --------------------------------------------------------- */

static const char LONG_PROMPT[] = "Once upon a time there was a little girl named Lily who lived in a small house "
                                  "near the woods with her mother and her dog";

static void test_n_and_echo(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    /* n sampled choices, each its own seed stream; the same request gives the same choices */
    static const char body[] = "{\"prompt\":\"Once upon a time\",\"n\":3,\"max_tokens\":12,\"temperature\":1,\"seed\":42,"
                               "\"ignore_eos\":true}";
    cJSON *j = http_json(t, "POST", "/v1/completions", body, 200), *j2 = http_json(t, "POST", "/v1/completions", body, 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "choices")), 3);
    for (int i = 0; i < 3; i++) {
        char path[32];
        snprintf(path, sizeof path, "choices.%d.index", i);
        assert_int_equal(vt_json_num(j, path), i);
        snprintf(path, sizeof path, "choices.%d.text", i);
        assert_string_equal(vt_json_str(j, path), vt_json_str(j2, path));
    }
    assert_true(strcmp(vt_json_str(j, "choices.0.text"), vt_json_str(j, "choices.1.text")) ||
                strcmp(vt_json_str(j, "choices.1.text"), vt_json_str(j, "choices.2.text"))); /* 3 x 12 sampled tokens */
    assert_int_equal(vt_json_num(j, "usage.completion_tokens"), 36);
    assert_int_equal(vt_json_num(j, "usage.prompt_tokens"), vt_json_num(j2, "usage.prompt_tokens"));
    cJSON_Delete(j);
    cJSON_Delete(j2);
    /* the other choices take the prompt's KV blocks from the first one */
    double reused0 = metric(t, "vkinfer_kv_blocks_reused");
    char b2[512];
    snprintf(b2, sizeof b2, "{\"prompt\":\"%s\",\"n\":4,\"max_tokens\":2,\"temperature\":0}", LONG_PROMPT);
    j = http_json(t, "POST", "/v1/completions", b2, 200);
    size_t np = (size_t)vt_json_num(j, "usage.prompt_tokens");
    assert_string_equal(vt_json_str(j, "choices.0.text"), vt_json_str(j, "choices.3.text")); /* greedy */
    cJSON_Delete(j);
    double reused = metric(t, "vkinfer_kv_blocks_reused") - reused0;
    printf("n = 4 over a %zu-token prompt: %.0f KV blocks reused\n", np, reused);
    assert_true(reused >= 3.0 * ((np - 1) / 16)); /* every full block of the prompt, for choices 1..3 */
    /* streamed: chunks carry their choice's index; each choice ends with its finish chunk */
    bool done;
    snprintf(b2, sizeof b2, "{\"prompt\":\"Once upon a time\",\"n\":2,\"max_tokens\":6,\"temperature\":0,\"stream\":true}");
    cJSON *ev = stream(t, "/v1/completions", b2, 0, &done);
    lg_buf text[2] = {{0}};
    int finishes[2] = {0};
    for (const cJSON *e = ev->child; e; e = e->next) {
        int i = (int)vt_json_num(e, "choices.0.index");
        assert_true(i == 0 || i == 1);
        const char *s = vt_json_str(e, "choices.0.text");
        lg_buf_put(&text[i], s, strlen(s));
        finishes[i] += cJSON_IsString(vt_json_get(e, "choices.0.finish_reason"));
    }
    assert_true(done && finishes[0] == 1 && finishes[1] == 1);
    assert_string_equal(text[0].p, text[1].p);
    free(text[0].p);
    free(text[1].p);
    cJSON_Delete(ev);
    /* echo: the prompt, then the completion */
    j = http_json(t, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}", 200);
    j2 = http_json(t, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,"
                   "\"echo\":true}", 200);
    char joined[512];
    snprintf(joined, sizeof joined, "Once upon a time%s", vt_json_str(j, "choices.0.text"));
    assert_string_equal(vt_json_str(j2, "choices.0.text"), joined);
    cJSON_Delete(j);
    cJSON_Delete(j2);
    ev = stream(t, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"echo\":true,\"stream\":true}",
                0, &done);
    assert_string_equal(vt_json_str(cJSON_GetArrayItem(ev, 0), "choices.0.text"), "Once upon a time");
    cJSON_Delete(ev);
    stop(t);
}

/* use_beam_search: best_of beams, the n best answered; deterministic; beam 0 is at least as likely
 * as greedy decoding's answer under the same length (checked by the CPU reference in test_beam).
 * Each choice's logprobs are its own beam's, in OpenAI's shape: their sum over length^0.5 (the
 * beam's score) falls from choice to choice. */
static void test_beam_search(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    static const char body[] = "{\"prompt\":\"Once upon a time\",\"use_beam_search\":true,\"best_of\":4,\"n\":3,"
                               "\"max_tokens\":10,\"length_penalty\":0.5,\"early_stopping\":\"never\",\"logprobs\":2}";
    cJSON *j = http_json(t, "POST", "/v1/completions", body, 200), *j2 = http_json(t, "POST", "/v1/completions", body, 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "choices")), 3);
    int total = 0, n_lp = 0;
    double prev_score = 0;
    for (int i = 0; i < 3; i++) {
        char path[40];
        snprintf(path, sizeof path, "choices.%d.logprobs", i);
        const cJSON *lp = vt_json_get(j, path), *tlp = vt_json_get(lp, "token_logprobs"),
                    *top = vt_json_get(lp, "top_logprobs");
        int n = cJSON_GetArraySize(tlp);
        double sum = 0;
        assert_true(n > 0 && cJSON_GetArraySize(vt_json_get(lp, "tokens")) == n && cJSON_GetArraySize(top) == n &&
                    cJSON_GetArraySize(vt_json_get(lp, "text_offset")) == n);
        for (int k = 0; k < n; k++) { /* a beam's token need not be its row's best: never above it */
            double l = cJSON_GetArrayItem(tlp, k)->valuedouble, best = -1e30;
            for (const cJSON *a = cJSON_GetArrayItem(top, k)->child; a; a = a->next)
                best = a->valuedouble > best ? a->valuedouble : best;
            assert_true(l <= 0 && l <= best + 1e-6);
            sum += l;
        }
        double score = sum / sqrt(n); /* length_penalty 0.5 */
        assert_true(i == 0 || score <= prev_score + 1e-4);
        prev_score = score;
        n_lp += n;
        snprintf(path, sizeof path, "choices.%d.text", i);
        assert_string_equal(vt_json_str(j, path), vt_json_str(j2, path));
        assert_true(strlen(vt_json_str(j, path)) > 0);
        for (int k = 0; k < i; k++) { /* distinct beams */
            char other[40];
            snprintf(other, sizeof other, "choices.%d.text", k);
            assert_true(strcmp(vt_json_str(j, path), vt_json_str(j, other)) != 0);
        }
        snprintf(path, sizeof path, "choices.%d.finish_reason", i);
        total += strcmp(vt_json_str(j, path), "length") ? 0 : 10;
    }
    assert_true(vt_json_num(j, "usage.completion_tokens") >= total);
    assert_int_equal(vt_json_num(j, "usage.completion_tokens"), n_lp);
    printf("beam search (4 beams, 3 answered): \"%s\" | \"%s\" | \"%s\"\n", vt_json_str(j, "choices.0.text"),
           vt_json_str(j, "choices.1.text"), vt_json_str(j, "choices.2.text"));
    cJSON_Delete(j);
    cJSON_Delete(j2);
    j = http_json(t, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                  "\"use_beam_search\":true,\"best_of\":2,\"max_tokens\":6,\"early_stopping\":true,\"logprobs\":true,"
                  "\"top_logprobs\":1}", 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "choices")), 1);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "choices.0.logprobs.content")),
                     vt_json_num(j, "usage.completion_tokens"));
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "choices.0.logprobs.content.0.top_logprobs")), 1);
    cJSON_Delete(j);
    stop(t);
}

static int32_t token_at(const cJSON *j, const char *path, int i)
{
    const cJSON *a = vt_json_get(j, path);
    assert_true(cJSON_IsArray(a) && i < cJSON_GetArraySize(a));
    return cJSON_GetArrayItem(a, i)->valueint;
}

static void test_request_fields(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    const vki_tokenizer *tok = vki_engine_tokenizer(t->e);
    /* return_token_ids: the prompt's and the completion's ids */
    cJSON *j = http_json(t, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,"
                         "\"temperature\":0,\"return_token_ids\":true}", 200);
    size_t n;
    cJSON *want = ids_of(tok, "Once upon a time", true, &n);
    assert_true(cJSON_Compare(vt_json_get(j, "choices.0.prompt_token_ids"), want, true));
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "choices.0.token_ids")), 8);
    int32_t third = token_at(j, "choices.0.token_ids", 2);
    bool third_is_new = third != token_at(j, "choices.0.token_ids", 0) && third != token_at(j, "choices.0.token_ids", 1);
    cJSON_Delete(want);
    cJSON_Delete(j);
    /* stop_token_ids end at that token (included); min_tokens bans it until reached */
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,\"stop_token_ids\":"
             "[%d],\"return_token_ids\":true}", third);
    j = http_json(t, "POST", "/v1/completions", body, 200);
    if (third_is_new) {
        assert_int_equal(vt_json_num(j, "usage.completion_tokens"), 3);
        assert_string_equal(vt_json_str(j, "choices.0.finish_reason"), "stop");
    }
    cJSON_Delete(j);
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,\"stop_token_ids\":"
             "[%d],\"min_tokens\":4,\"return_token_ids\":true}", third);
    j = http_json(t, "POST", "/v1/completions", body, 200);
    assert_true(vt_json_num(j, "usage.completion_tokens") >= 4);
    for (int i = 0; i < 3; i++)
        assert_int_not_equal(token_at(j, "choices.0.token_ids", i), third);
    cJSON_Delete(j);
    /* skip_special_tokens: an end-of-text token forced by a bias shows only when asked */
    int32_t eos = vki_token_eos(tok);
    if (eos >= 0) {
        char piece[64] = "";
        size_t pn = 0;
        assert_int_equal(vki_token_to_piece(tok, eos, true, piece, sizeof piece - 1, &pn), VKI_OK);
        piece[pn] = 0;
        static const char f[] = "{\"prompt\":\"Once\",\"max_tokens\":2,\"ignore_eos\":true,\"logit_bias\":{\"%d\":100}%s}";
        snprintf(body, sizeof body, f, eos, "");
        j = http_json(t, "POST", "/v1/completions", body, 200);
        assert_string_equal(vt_json_str(j, "choices.0.text"), "");
        cJSON_Delete(j);
        snprintf(body, sizeof body, f, eos, ",\"skip_special_tokens\":false");
        j = http_json(t, "POST", "/v1/completions", body, 200);
        assert_non_null(strstr(vt_json_str(j, "choices.0.text"), piece));
        cJSON_Delete(j);
    }
    /* accepted for llama.cpp / vLLM clients */
    cJSON_Delete(http_json(t, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2,\"cache_prompt\":true,"
                           "\"repetition_penalty\":1.3}", 200));
    /* the prefix cache shows in usage: the same long prompt twice */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":2}", LONG_PROMPT);
    cJSON_Delete(http_json(t, "POST", "/v1/completions", body, 200));
    j = http_json(t, "POST", "/v1/completions", body, 200);
    double np = vt_json_num(j, "usage.prompt_tokens"),
           cached = vt_json_num(j, "usage.prompt_tokens_details.cached_tokens");
    assert_true(cached >= 16 * floor((np - 1) / 16) && cached < np);
    cJSON_Delete(j);
    stop(t);
}

/* A request that may run to a long max_tokens with 20 alternatives per token allocates for what
 * it generates, not for max_tokens up front. */
static void test_no_prealloc(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":%u,\"logprobs\":20}",
             t->s->info.n_ctx - 16);
    srv_job *j = NULL;
    srv_error e;
    assert_true(srv_job_from_json(t->s, false, body, strlen(body), &j, &e));
    assert_true(j->max_tokens > 1000 && j->n_top == 20);
    const srv_toks *w = &j->ch[0].w, *h = &j->ch[0].h;
    assert_true(w->cap == 0 && !w->tok && !w->lp && !w->top_id && !w->top_lp);
    assert_true(h->cap == 0 && !h->tok && !h->lp && !h->top_id && !h->top_lp);
    srv_job_release(j);
    stop(t);
}

/* The default policy serves many chats without max_tokens at once: 6 chats over a 4,096-token
 * pool (each may run to the 2,048-token context). GUARANTEED_NO_EVICT, which reserves each
 * one's whole context, runs 2 and queues 4; the server's default (MAX_UTILIZATION) runs all 6. */
static void test_chats_default_policy(void **state)
{
    T *t = *state;
    vki_engine_params ep = vt_engine_params(4096, 8, &t->validation);
    vki_engine *e = NULL;
    char err[256] = "";
    if (vki_engine_create(t->model, &ep, &e, err, sizeof err) != VKI_OK)
        fail_msg("engine: %s", err);
    vki_model_info mi;
    vki_engine_info(e, &mi);
    static const char chat[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"stream\":true,"
                               "\"ignore_eos\":true}";
    for (int run = 0; run < 2; run++) {
        srv_params p = test_params(t);
        if (run == 0)
            p.batch.policy = VKI_POLICY_GUARANTEED_NO_EVICT;
        start_p(t, e, &p);
        lg_http h[6];
        for (int i = 0; i < 6; i++)
            open_stream_at(t, &h[i], "/v1/chat/completions", chat);
        wait_metric(t, "vkinfer_active_requests", 6);
        double end = lg_now() + 60;
        while (metric(t, "vkinfer_running_requests") + metric(t, "vkinfer_queue_length") < 6 && lg_now() < end)
            usleep(2000);
        /* two more ticks: the last arrival may have been counted as queued before its admission */
        wait_metric_at_least(t, "vkinfer_iterations", metric(t, "vkinfer_iterations") + 2);
        double running = metric(t, "vkinfer_running_requests"), queued = metric(t, "vkinfer_queue_length");
        printf("%s: %.0f chats running, %.0f queued (context %u, KV pool %u tokens)\n",
               run ? "max-util (default)" : "guaranteed", running, queued, mi.n_ctx, mi.kv_pages * mi.page_size);
        if (t->stories && mi.n_ctx * 2 <= mi.kv_pages * mi.page_size && mi.n_ctx * 3 > mi.kv_pages * mi.page_size)
            assert_int_equal(running, run ? 6 : 2);
        else
            assert_int_equal(running, 6 - (run ? 0 : queued));
        for (int i = 0; i < 6; i++)
            lg_http_close(&h[i]);
        wait_metric(t, "vkinfer_active_requests", 0);
        stop(t);
    }
    vki_engine_destroy(e);
}

/* vLLM's fields beyond the OpenAI API: include_stop_str_in_output ends the text with the stop
 * string; chat_template_kwargs.enable_thinking false opens a Qwen3-style answer with an empty
 * reasoning block (a model whose GGUF carries such a template), and changes nothing for a
 * template that has none; samplers vkinfer lacks are refused unless set to their "off" value. */
static void test_vllm_fields(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *a = http_json(t, "POST", "/v1/completions", CMPL48, 200);
    const char *whole = vt_json_str(a, "choices.0.text");
    char word[8] = "", body[512];
    size_t at, run;
    if (ascii_run(whole, strlen(whole), 8, 4, 4, &at, &run)) /* four characters from inside the greedy answer */
        memcpy(word, whole + at, 4);
    else
        assert_false(t->stories);
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":48,\"temperature\":0,\"stop\":[\"%s\"],"
             "\"include_stop_str_in_output\":true}", word);
    if (word[0] && !strchr(word, '"') && !strchr(word, '\\')) {
        cJSON *b = http_json(t, "POST", "/v1/completions", body, 200);
        const char *cut = strstr(whole, word);
        assert_int_equal(strlen(vt_json_str(b, "choices.0.text")), (size_t)(cut - whole) + 4);
        assert_int_equal(strncmp(vt_json_str(b, "choices.0.text"), whole, (size_t)(cut - whole) + 4), 0);
        cJSON_Delete(b);
    }
    cJSON_Delete(a);
    /* llama.cpp's repeat_penalty = repetition_penalty */
    a = http_json(t, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":32,\"temperature\":0,"
                  "\"repetition_penalty\":1.8,\"return_token_ids\":true}", 200);
    cJSON *a2 = http_json(t, "POST", "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":32,"
                          "\"temperature\":0,\"repeat_penalty\":1.8,\"return_token_ids\":true}", 200);
    char *ta = cJSON_PrintUnformatted(vt_json_get(a, "choices.0.token_ids")),
         *tb = cJSON_PrintUnformatted(vt_json_get(a2, "choices.0.token_ids"));
    assert_string_equal(ta, tb);
    free(ta);
    free(tb);
    cJSON_Delete(a2);
    cJSON_Delete(a);
    /* off values pass, others name the field */
    cJSON_Delete(http_json(t, "POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2,\"typical_p\":1,"
                           "\"mirostat\":0,\"tfs_z\":1,\"dry_multiplier\":0}", 200));
    static const struct { const char *body, *param; } bad[] = {
        {"{\"prompt\":\"x\",\"typical_p\":0.9}", "typical_p"},
        {"{\"prompt\":\"x\",\"mirostat\":2}", "mirostat"},
        {"{\"prompt\":\"x\",\"bad_words\":[\"a\"]}", "bad_words"},
        {"{\"prompt\":\"x\",\"allowed_token_ids\":[1,2]}", "allowed_token_ids"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template\":\"{{x}}\"}", "chat_template"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"enable_thinking\":1}}",
         "chat_template_kwargs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *path = strstr(bad[i].body, "messages") ? "/v1/chat/completions" : "/v1/completions";
        cJSON *e = http_json(t, "POST", path, bad[i].body, 400);
        if (strcmp(vt_json_str(e, "error.param"), bad[i].param))
            fail_msg("%s: %s", bad[i].body, cJSON_PrintUnformatted(e));
        cJSON_Delete(e);
    }
    /* no template of its own: enable_thinking changes nothing */
    static const char CHAT_T[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":1,"
                                 "\"return_token_ids\":true,\"chat_template_kwargs\":{\"enable_thinking\":%s}}";
    char on[512], off[512];
    snprintf(on, sizeof on, CHAT_T, "true");
    snprintf(off, sizeof off, CHAT_T, "false");
    cJSON *x = http_json(t, "POST", "/v1/chat/completions", on, 200), *y = http_json(t, "POST", "/v1/chat/completions",
                                                                                       off, 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(x, "prompt_token_ids")),
                     cJSON_GetArraySize(vt_json_get(y, "prompt_token_ids")));
    cJSON_Delete(x);
    cJSON_Delete(y);
    stop(t);
    /* a Qwen3-style template in the GGUF: the empty reasoning block after the generation prompt */
    char qpath[96];
    snprintf(qpath, sizeof qpath, "/tmp/vki_test_server_qwen3_%d.gguf", (int)getpid());
    gguf_edit ed = {.kind = GGUF_EDIT_STR, .name = "tokenizer.chat_template",
                    .s = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
                         "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                         "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>"
                         "\\n\\n' }}{%- endif %}{%- endif %}"};
    assert_int_equal(gguf_edit_copy(t->model, qpath, &ed, 1), VKI_OK);
    vki_engine_params ep = vt_engine_params(1024, 4, &t->validation);
    vki_engine *e = NULL;
    char err[256] = "";
    if (vki_engine_create(qpath, &ep, &e, err, sizeof err) != VKI_OK)
        fail_msg("engine: %s", err);
    srv_params p = test_params(t);
    p.model_path = qpath;
    start_p(t, e, &p);
    x = http_json(t, "POST", "/v1/chat/completions", on, 200);
    y = http_json(t, "POST", "/v1/chat/completions", off, 200);
    const cJSON *ix = vt_json_get(x, "prompt_token_ids"), *iy = vt_json_get(y, "prompt_token_ids");
    int32_t ids[512];
    size_t n = 0, len_x = 0, len_y = 0;
    char tx[4096], ty[4096];
    for (const cJSON *v = ix->child; v && n < 512; v = v->next)
        ids[n++] = (int32_t)v->valuedouble;
    assert_int_equal(vki_detokenize(vki_engine_tokenizer(e), ids, n, 0, tx, sizeof tx - 1, &len_x), VKI_OK);
    n = 0;
    for (const cJSON *v = iy->child; v && n < 512; v = v->next)
        ids[n++] = (int32_t)v->valuedouble;
    assert_int_equal(vki_detokenize(vki_engine_tokenizer(e), ids, n, 0, ty, sizeof ty - 1, &len_y), VKI_OK);
    tx[len_x] = ty[len_y] = 0;
    static const char think[] = "<think>\n\n</think>\n\n";
    assert_int_equal(len_y, len_x + strlen(think));
    assert_int_equal(memcmp(tx, ty, len_x), 0);
    assert_string_equal(ty + len_x, think);
    assert_non_null(strstr(tx, "<|im_start|>assistant\n")); /* the template was recognised: ChatML */
    cJSON_Delete(x);
    cJSON_Delete(y);
    stop(t);
    vki_engine_destroy(e);
    /* EXAONE 4 (recognised by its markers; test_chat renders its real template): thinking is off
     * unless enable_thinking is true, which opens the reasoning block; Ollama's "think" too */
    ed.s = "[|system|] [|user|] [|assistant|] [|endofturn|] [|tool|]";
    assert_int_equal(gguf_edit_copy(t->model, qpath, &ed, 1), VKI_OK);
    if (vki_engine_create(qpath, &ep, &e, err, sizeof err) != VKI_OK)
        fail_msg("engine: %s", err);
    p = test_params(t);
    p.model_path = qpath;
    start_p(t, e, &p);
    static const char EX_T[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":1,"
                               "\"return_token_ids\":true%s}";
    static const char *const kw[3] = {"", ",\"chat_template_kwargs\":{\"enable_thinking\":true}",
                                      ",\"chat_template_kwargs\":{\"enable_thinking\":false}"};
    static const char *const tail[3] = {"[|assistant|]\n<think>\n\n</think>\n\n", "[|assistant|]\n<think>\n",
                                        "[|assistant|]\n<think>\n\n</think>\n\n"};
    for (int v = 0; v < 3; v++) {
        char req[256];
        snprintf(req, sizeof req, EX_T, kw[v]);
        x = http_json(t, "POST", "/v1/chat/completions", req, 200);
        n = 0;
        for (const cJSON *u = vt_json_get(x, "prompt_token_ids")->child; u && n < 512; u = u->next)
            ids[n++] = (int32_t)u->valuedouble;
        assert_int_equal(vki_detokenize(vki_engine_tokenizer(e), ids, n, 0, tx, sizeof tx - 1, &len_x), VKI_OK);
        tx[len_x] = 0;
        size_t lt = strlen(tail[v]);
        if (len_x < lt || strcmp(tx + len_x - lt, tail[v]))
            fail_msg("EXAONE 4 %s: the prompt ends \"%s\"", v ? kw[v] : "(default)", tx);
        cJSON_Delete(x);
    }
    int counts[2];
    for (int v = 0; v < 2; v++) {
        char req[320];
        snprintf(req, sizeof req, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                 "\"stream\":false,\"think\":%s,\"options\":{\"num_predict\":1}}", v ? "true" : "false");
        x = http_json(t, "POST", "/api/chat", req, 200);
        counts[v] = (int)vt_json_num(x, "prompt_eval_count");
        cJSON_Delete(x);
    }
    assert_true(counts[0] > counts[1]); /* think false: the closed block's "\n\n</think>\n\n" more */
    stop(t);
    vki_engine_destroy(e);
    unlink(qpath);
}

/* llama-server's POST /infill on a model whose GGUF names fill-in-the-middle tokens: the answer is
 * /completion's on the prompt [BOS] <PRE>prefix<SUF>suffix<MID>prompt (with input_extra: the
 * repository pattern first), built here from /tokenize; a model without FIM tokens and a bad
 * input_extra are 400s. */
static void append_tokens(T *t, cJSON *ids, const char *text)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "content", text);
    char *body = cJSON_PrintUnformatted(b);
    cJSON *r = http_json(t, "POST", "/tokenize", body, 200);
    for (const cJSON *x = vt_json_get(r, "tokens")->child; x; x = x->next)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(x->valuedouble));
    cJSON_Delete(r);
    cJSON_Delete(b);
    free(body);
}

static void test_infill(void **state)
{
    T *t = *state;
    start(t, NULL, 0);
    cJSON *e = http_json(t, "POST", "/infill", "{\"input_prefix\":\"a\",\"input_suffix\":\"b\"}", 400);
    assert_non_null(strstr(vt_json_str(e, "error.message"), "no fill-in-the-middle tokens"));
    cJSON_Delete(e);
    stop(t);
    char fpath[96];
    snprintf(fpath, sizeof fpath, "/tmp/vki_test_server_fim_%d.gguf", (int)getpid());
    const gguf_edit ed[] = {{.kind = GGUF_EDIT_U32, .name = "tokenizer.ggml.fim_pre_token_id", .u = 3},
                            {.kind = GGUF_EDIT_U32, .name = "tokenizer.ggml.fim_suf_token_id", .u = 4},
                            {.kind = GGUF_EDIT_U32, .name = "tokenizer.ggml.fim_mid_token_id", .u = 5},
                            {.kind = GGUF_EDIT_U32, .name = "tokenizer.ggml.fim_rep_token_id", .u = 6},
                            {.kind = GGUF_EDIT_U32, .name = "tokenizer.ggml.fim_sep_token_id", .u = 7}};
    assert_int_equal(gguf_edit_copy(t->model, fpath, ed, 5), VKI_OK);
    vki_engine_params ep = vt_engine_params(1024, 4, &t->validation);
    vki_engine *eng = NULL;
    char err[256] = "";
    if (vki_engine_create(fpath, &ep, &eng, err, sizeof err) != VKI_OK)
        fail_msg("engine: %s", err);
    assert_int_equal(vki_token_fim(vki_engine_tokenizer(eng), VKI_FIM_MID), 5);
    srv_params p = test_params(t);
    p.model_path = fpath;
    start_p(t, eng, &p);
    for (int with_extra = 0; with_extra < 2; with_extra++) {
        cJSON *ids = cJSON_CreateArray();
        if (vki_tokenizer_adds_bos(vki_engine_tokenizer(eng)))
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(vki_token_bos(vki_engine_tokenizer(eng))));
        if (with_extra) {
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(6));
            append_tokens(t, ids, "myproject\n");
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(7));
            append_tokens(t, ids, "lib.c");
            append_tokens(t, ids, "\n");
            append_tokens(t, ids, "int x;");
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(7));
            append_tokens(t, ids, "filename\n");
        }
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(3));
        append_tokens(t, ids, "Once upon");
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(4));
        append_tokens(t, ids, " happily ever after.");
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(5));
        append_tokens(t, ids, " a");
        char *prompt = cJSON_PrintUnformatted(ids), body[4096];
        snprintf(body, sizeof body, "{\"prompt\":%s,\"n_predict\":16,\"temperature\":0}", prompt);
        cJSON *want = http_json(t, "POST", "/completion", body, 200);
        snprintf(body, sizeof body, "{\"input_prefix\":\"Once upon\",\"input_suffix\":\" happily ever after.\","
                 "\"prompt\":\" a\",\"n_predict\":16,\"temperature\":0%s}",
                 with_extra ? ",\"input_extra\":[{\"filename\":\"lib.c\",\"text\":\"int x;\"}]" : "");
        cJSON *got = http_json(t, "POST", "/infill", body, 200);
        assert_int_equal(vt_json_num(got, "tokens_evaluated"), cJSON_GetArraySize(ids));
        assert_string_equal(vt_json_str(got, "content"), vt_json_str(want, "content"));
        free(prompt);
        cJSON_Delete(ids);
        cJSON_Delete(want);
        cJSON_Delete(got);
    }
    e = http_json(t, "POST", "/infill", "{\"input_prefix\":\"a\",\"input_extra\":[{\"filename\":1}]}", 400);
    assert_string_equal(vt_json_str(e, "error.param"), "input_extra");
    cJSON_Delete(e);
    stop(t);
    vki_engine_destroy(eng);
    unlink(fpath);
}

#ifndef TEST_SERVER_NO_MAIN /* test_server_struct.c includes this file for its fixture and helpers */
int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_models), cmocka_unit_test(test_completion), cmocka_unit_test(test_completion_stream),
        cmocka_unit_test(test_llama_completion),
        cmocka_unit_test(test_ollama_api),
        cmocka_unit_test(test_chat_continue),
        cmocka_unit_test(test_apply_template),
        cmocka_unit_test(test_infill),
        cmocka_unit_test(test_vllm_fields),
        cmocka_unit_test(test_chat),          cmocka_unit_test(test_stop_strings), cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_errors),        cmocka_unit_test(test_queue_full), cmocka_unit_test(test_disconnect),
        cmocka_unit_test(test_many_connections), cmocka_unit_test(test_drain),   cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_routes),        cmocka_unit_test(test_embeddings), cmocka_unit_test(test_responses_api), cmocka_unit_test(test_n_and_echo),
        cmocka_unit_test(test_beam_search),
        cmocka_unit_test(test_request_fields), cmocka_unit_test(test_no_prealloc),
        cmocka_unit_test(test_chats_default_policy),
    };
    (void)argc;
    (void)argv;
    if (getenv("VKI_TEST_FILTER")) /* one test while developing: VKI_TEST_FILTER=test_chat */
        cmocka_set_test_filter(getenv("VKI_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
#endif
