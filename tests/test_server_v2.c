/* The model repository (host/server/repo.c) and the KServe v2 / Triton routes (kserve.c), over
 * real loopback sockets, spoken by a plain HTTP client (tools/loadgen.c's).
 *
 * One in-process server over a repository of four entries: "a" (a synthetic model in a folder
 * with a config.json), "b" (stories260K, or a second synthetic model when ../shared is absent),
 * "broken" (not a GGUF) and "huge" (a KV cache that cannot fit in the memory budget): the good
 * ones serve, the bad ones are listed UNAVAILABLE with their reason. Then: the v2 metadata,
 * health, config and stats shapes; infer / generate / generate_stream answers equal to the same
 * request on /v1/completions (and the known greedy text with stories260K); errors in the v2
 * shape; per-model metrics; unloading a model under traffic (a stream on the other model runs
 * on undisturbed; the unloading model's short request finishes, its long one ends with a clean
 * error event) and loading it back; model control "none" refusing load requests. */
#define LOADGEN_NO_MAIN
#include "tools/loadgen.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "engine/synth.h"
#include "support/gguf_edit.h"
#include "host/server/server.h"
#include "vkinfer_server.h"
#include "support/ref_beam.h"
#include "support/vt.h"
#include "support/vt_json.h"

/* Greedy, BOS + "Once upon a time", 48 tokens (../shared/models/README.md). */
static const char KNOWN[] = ", there was a little girl named Lily. She loved to play outside in the park. One day, she "
                            "saw a big, red ball. She wanted to play with it,";

typedef struct T {
    char dir[256];
    char sdir[256];            /* the session file folder (--session-dir) */
    bool stories;
    srv *s;
    uint16_t port;
    atomic_int validation;
} T;

static void quiet_log(void *user, vki_log_level lvl, const char *msg)
{
    (void)user;
    if (lvl <= VKI_LOG_ERROR)
        fprintf(stderr, "[server] %s\n", msg);
}

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fputs(text, f) >= 0;
    if (f)
        fclose(f);
    return ok;
}

/* like_stories: stories260K's context and token ids (b's stand-in). */
static bool synth_to(const char *path, uint64_t seed, bool like_stories)
{
    synth_params sp = synth_default_params();
    sp.seed = seed;
    if (like_stories)
        sp.n_ctx = 2048, sp.n_vocab = 512;
    char err[256];
    if (synth_write(&sp, path, err, sizeof err) == VKI_OK)
        return true;
    printf("cannot write %s: %s\n", path, err);
    return false;
}

/* The repository folder: a/model.gguf + config.json, b split in two files as llama.cpp's
 * gguf-split writes them (b-00001-of-00002.gguf, b-00002-of-00002.gguf: the one model "b"),
 * broken.gguf, huge/. */
static bool make_repo(T *t)
{
    char p[512], stories[1024];
    snprintf(t->dir, sizeof t->dir, "/tmp/vki_test_v2_%d", (int)getpid());
    snprintf(p, sizeof p, "%s/a", t->dir);
    if (mkdir(t->dir, 0755) || mkdir(p, 0755))
        return false;
    snprintf(p, sizeof p, "%s/a/model.gguf", t->dir);
    bool ok = synth_to(p, 1, false);
    snprintf(p, sizeof p, "%s/a/config.json", t->dir);
    ok = ok && write_file(p, "{\"kv_tokens\": 2048, \"max_batch_size\": 8, \"policy\": \"max-util\"}");
    char whole[1024], prefix[512];
    snprintf(whole, sizeof whole, "%s/b-whole.gguf.tmp", t->dir);
    if ((t->stories = vt_shared_model("stories260K.gguf", stories, sizeof stories)))
        snprintf(whole, sizeof whole, "%s", stories);
    else
        ok = ok && synth_to(whole, 2, true);
    snprintf(prefix, sizeof prefix, "%s/b", t->dir);
    ok = ok && gguf_edit_split(whole, prefix, 2, -1) == VKI_OK;
    if (!t->stories)
        remove(whole);
    snprintf(p, sizeof p, "%s/broken.gguf", t->dir);
    ok = ok && write_file(p, "GGUF but not really");
    snprintf(p, sizeof p, "%s/huge", t->dir);
    ok = ok && !mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/huge/model.gguf", t->dir);
    ok = ok && synth_to(p, 3, false);
    snprintf(p, sizeof p, "%s/huge/config.json", t->dir); /* ~10 GiB of KV, far past the budget */
    ok = ok && write_file(p, "{\"kv_tokens\": 20000000}");
    return ok;
}

static void rm_repo(T *t)
{
    static const char *const files[] = {"a/model.gguf", "a/config.json", "a", "b-00001-of-00002.gguf",
                                        "b-00002-of-00002.gguf", "broken.gguf",
                                        "huge/model.gguf", "huge/config.json", "huge", ""};
    char p[512];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", t->dir, files[i]);
        remove(p);
    }
}

/* A repository server over t->dir. */
static vki_status start(T *t, srv_model_control control, const char *dir, char *err, size_t n_err)
{
    srv_params p = srv_default_params();
    p.port = 0;
    p.log = quiet_log;
    p.log_level = VKI_LOG_WARN;
    srv_repo_params rp = srv_repo_default_params();
    rp.dir = dir;
    rp.control = control;
    static const char *const all[] = {"*"};
    rp.load_models = all;
    rp.n_load_models = 1;
    rp.unload_timeout_s = 3; /* the short request under unload needs 6 tokens in it, under ASan and load */
    p.session_dir = t->sdir[0] ? t->sdir : NULL;
    rp.memory_budget = 512ull << 20; /* each small model holds ~40 MiB on lavapipe (scratch) */
    rp.engine.kv_tokens = 4096;
    rp.engine.max_seqs = 16;
    rp.engine.device = vt_device_params();
    rp.engine.device.pipeline_cache_dir = "";
    rp.engine.device.log = vt_count_validation;
    rp.engine.device.log_user = &t->validation;
    vki_status st = srv_create_repo(&p, &rp, &t->s, err, n_err);
    t->port = st == VKI_OK ? srv_port(t->s) : 0;
    return st;
}

static int group_setup(void **state)
{
    vt_pin_vulkan_libraries();
    signal(SIGPIPE, SIG_IGN);
    T *t = calloc(1, sizeof *t);
    char err[512] = "";
    if (t)
        snprintf(t->sdir, sizeof t->sdir, "/tmp/vki_test_v2_sessions_%d", (int)getpid());
    if (!t || !make_repo(t) || mkdir(t->sdir, 0755)) {
        printf("cannot build the test repository\n");
        return -1;
    }
    if (!t->stories)
        printf("NOTE: %s/models/stories260K.gguf not found: b is synthetic and the known-answer checks are "
               "skipped\n", VKI_SHARED_DIR);
    if (start(t, SRV_CONTROL_EXPLICIT, t->dir, err, sizeof err) != VKI_OK) {
        printf("srv_create_repo: %s\n", err);
        return -1;
    }
    *state = t;
    return 0;
}

static int group_teardown(void **state)
{
    T *t = *state;
    srv_destroy(t->s);
    rm_repo(t);
    static const char *const sfiles[] = {"conv.bin", "a.bin", "mini.bin"};
    char p[400];
    for (size_t i = 0; i < sizeof sfiles / sizeof sfiles[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", t->sdir, sfiles[i]);
        remove(p);
    }
    remove(t->sdir);
    int msgs = atomic_load(&t->validation);
    free(t);
    if (msgs)
        fprintf(stderr, "FAIL: %d validation messages\n", msgs);
    return msgs ? -1 : 0;
}

/* ---- client ------------------------------------------------------------------------------------- */

static int http(T *t, const char *method, const char *path, const char *body, char **out)
{
    lg_http h;
    lg_http_init(&h, "127.0.0.1", t->port, 120);
    lg_resp r;
    lg_buf b = {0};
    int st = lg_http_request(&h, method, path, body, &r, &b);
    lg_http_close(&h);
    *out = b.p ? b.p : strdup("");
    return st;
}

static cJSON *http_json(T *t, const char *method, const char *path, const char *body, int want)
{
    char *out;
    int st = http(t, method, path, body, &out);
    if (st != want)
        fail_msg("%s %s %s: status %d, want %d: %s", method, path, body ? body : "", st, want, out);
    cJSON *j = cJSON_Parse(out);
    if (!j)
        fail_msg("%s %s: not JSON: %s", method, path, out);
    free(out);
    return j;
}

/* An error in the v2 shape: {"error": "<message containing needle>"} with status want. */
static void v2_error(T *t, const char *method, const char *path, const char *body, int want, const char *needle)
{
    cJSON *j = http_json(t, method, path, body, want);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (!cJSON_IsString(e) || !strstr(e->valuestring, needle))
        fail_msg("%s %s: want a v2 error naming '%s', got %s", method, path, needle, cJSON_PrintUnformatted(j));
    cJSON_Delete(j);
}

/* The state of model name in the repository index, and its reason. */
static const char *index_state(const cJSON *idx, const char *name, const char **reason)
{
    *reason = "";
    for (const cJSON *m = idx->child; m; m = m->next)
        if (!strcmp(vt_json_str(m, "name"), name)) {
            *reason = vt_json_str(m, "reason");
            return vt_json_str(m, "state");
        }
    return "absent";
}

typedef struct sse_coll {
    strbuf text;          /* text_output (or choices.0.text) pieces, in order */
    cJSON *last;          /* the last event */
    int n;
} sse_coll;

static bool on_sse(void *user, const char *data, size_t n)
{
    sse_coll *c = user;
    if (n == 6 && !memcmp(data, "[DONE]", 6))
        return true;
    cJSON *o = cJSON_ParseWithLength(data, n);
    if (!o)
        return false;
    const cJSON *txt = cJSON_GetObjectItemCaseSensitive(o, "text_output");
    if (!txt)
        txt = vt_json_get(o, "choices.0.text");
    if (cJSON_IsString(txt))
        strbuf_printf(&c->text, "%s", txt->valuestring);
    cJSON_Delete(c->last);
    c->last = o;
    c->n++;
    return true;
}

/* A whole SSE answer on port (a background-thread-safe client: no asserts). */
typedef struct bg_stream {
    uint16_t port;
    const char *path, *body;
    int status, rc;
    sse_coll c;
} bg_stream;

static void *bg_run(void *arg)
{
    bg_stream *b = arg;
    lg_http h;
    lg_resp r = {0};
    lg_http_init(&h, "127.0.0.1", b->port, 120);
    lg_sse sse = {.on_data = on_sse, .user = &b->c};
    b->rc = -1;
    if (lg_http_send(&h, "POST", b->path, b->body, strlen(b->body), NULL) && lg_http_head(&h, &r)) {
        b->status = r.status;
        b->rc = lg_http_body(&h, &r, lg_sse_feed, &sse);
    }
    lg_http_close(&h);
    free(sse.line.p);
    return NULL;
}

static void stream(T *t, const char *path, const char *body, bg_stream *b)
{
    *b = (bg_stream){.port = t->port, .path = path, .body = body};
    bg_run(b);
    if (b->status != 200 || b->rc != 1)
        fail_msg("stream %s %s: status %d rc %d", path, body, b->status, b->rc);
}

static double metric(T *t, const char *name)
{
    double v = NAN;
    if (!lg_metric("127.0.0.1", t->port, name, &v))
        fail_msg("no metric %s", name);
    return v;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_repository(void **state)
{
    T *t = *state;
    cJSON *idx = http_json(t, "POST", "/v2/repository/index", "{}", 200);
    const char *why = "";
    assert_string_equal(index_state(idx, "a", &why), "READY");
    assert_string_equal(index_state(idx, "b", &why), "READY");
    assert_string_equal(index_state(idx, "broken", &why), "UNAVAILABLE");
    assert_non_null(strstr(why, "GGUF"));
    assert_string_equal(index_state(idx, "huge", &why), "UNAVAILABLE");
    if (!strstr(why, "does not fit"))
        fail_msg("huge: %s", why);
    cJSON_Delete(idx);
    idx = http_json(t, "POST", "/v2/repository/index", "{\"ready\": true}", 200);
    assert_int_equal(cJSON_GetArraySize(idx), 2);
    cJSON_Delete(idx);

    cJSON *m = http_json(t, "GET", "/v1/models", NULL, 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(m, "data")), 2);
    assert_string_equal(vt_json_str(m, "data.0.id"), "a");
    assert_string_equal(vt_json_str(m, "data.1.id"), "b");
    cJSON_Delete(m);
    /* OpenAI routes route by "model": unknown -> 404 naming the loaded ones; none of several -> 400 */
    char *out;
    assert_int_equal(http(t, "POST", "/v1/completions", "{\"model\":\"nope\",\"prompt\":\"x\"}", &out), 404);
    assert_non_null(strstr(out, "'a', 'b'"));
    free(out);
    assert_int_equal(http(t, "POST", "/v1/completions", "{\"prompt\":\"x\"}", &out), 400);
    assert_non_null(strstr(out, "\\\"model\\\" is required"));
    free(out);
    assert_int_equal(http(t, "POST", "/v1/completions", "{\"model\":\"broken\",\"prompt\":\"x\"}", &out), 404);
    if (!strstr(out, "broken.gguf"))
        fail_msg("%s", out);
    free(out);
    cJSON *c = http_json(t, "POST", "/v1/completions", "{\"model\":\"a\",\"prompt\":\"x\",\"max_tokens\":3}", 200);
    assert_string_equal(vt_json_str(c, "model"), "a");
    cJSON_Delete(c);
}

static void test_v2_metadata(void **state)
{
    T *t = *state;
    cJSON *j = http_json(t, "GET", "/v2", NULL, 200);
    assert_string_equal(vt_json_str(j, "name"), "vkinfer");
    bool gen = false, repo = false;
    for (const cJSON *x = vt_json_get(j, "extensions")->child; x; x = x->next) {
        gen |= !strcmp(x->valuestring, "generate");
        repo |= !strcmp(x->valuestring, "model_repository");
    }
    assert_true(gen && repo);
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v2/health/live", NULL, 200);
    assert_true(cJSON_IsTrue(vt_json_get(j, "live")));
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v2/health/ready", NULL, 200);
    assert_true(cJSON_IsTrue(vt_json_get(j, "ready")));
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v2/models/b", NULL, 200);
    assert_string_equal(vt_json_str(j, "name"), "b");
    assert_string_equal(vt_json_str(j, "versions.0"), "1");
    assert_string_equal(vt_json_str(j, "inputs.0.name"), "text_input");
    assert_string_equal(vt_json_str(j, "inputs.0.datatype"), "BYTES");
    assert_string_equal(vt_json_str(j, "outputs.0.name"), "text_output");
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v2/models/b/versions/1", NULL, 200);
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v2/models/a/ready", NULL, 200);
    assert_true(cJSON_IsTrue(vt_json_get(j, "ready")));
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v2/models/huge/ready", NULL, 503);
    assert_string_equal(vt_json_str(j, "state"), "UNAVAILABLE");
    cJSON_Delete(j);
    v2_error(t, "GET", "/v2/models/nope/ready", NULL, 404, "unknown model");
    j = http_json(t, "GET", "/v2/models/a/config", NULL, 200);
    assert_int_equal((int)vt_json_get(j, "max_batch_size")->valuedouble, 8); /* from a/config.json */
    assert_string_equal(vt_json_str(j, "input.0.data_type"), "TYPE_STRING");
    assert_true(cJSON_IsTrue(vt_json_get(j, "model_transaction_policy.decoupled")));
    cJSON_Delete(j);
    /* errors in the v2 shape */
    v2_error(t, "GET", "/v2/models/nope", NULL, 404, "'nope' is not loaded");
    v2_error(t, "GET", "/v2/models/a/infer", NULL, 405, "GET is not allowed");
    v2_error(t, "GET", "/v2/nothing", NULL, 404, "unknown route");
    v2_error(t, "POST", "/v2/models/a/generate", "{\"text_input\":\"x\",\"beam_width\":0}", 400, "beam_width");
    v2_error(t, "POST", "/v2/models/a/generate", "{\"text_input\":\"x\",\"colour\":1}", 400, "unknown input");
    v2_error(t, "POST", "/v2/models/a/generate", "{\"max_tokens\":3}", 400, "text_input is required");
    v2_error(t, "POST", "/v2/models/a/generate", "{\"text_input\":\"x\",\"temperature\":-1}", 400, "temperature");
    v2_error(t, "POST", "/v2/models/a/infer", "{\"inputs\":[{\"name\":\"text_input\"}]}", 400, "\"data\"");
    v2_error(t, "POST", "/v2/models/a/generate", "{\"text_input\":", 400, "invalid JSON");
}

/* The same greedy request through infer, generate, generate_stream and /v1/completions. */
static void test_infer_generate(void **state)
{
    T *t = *state;
    cJSON *ref = http_json(t, "POST", "/v1/completions", "{\"model\":\"b\",\"prompt\":\"Once upon a time\","
                           "\"max_tokens\":48,\"temperature\":0}", 200);
    const char *want = vt_json_str(ref, "choices.0.text");
    if (t->stories)
        assert_string_equal(want, KNOWN);
    cJSON *j = http_json(t, "POST", "/v2/models/b/infer", "{\"id\":\"r1\",\"inputs\":[{\"name\":\"text_input\","
                         "\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[\"Once upon a time\"]},{\"name\":\"max_tokens\","
                         "\"shape\":[1],\"datatype\":\"INT32\",\"data\":[48]},{\"name\":\"temperature\",\"shape\":[1],"
                         "\"datatype\":\"FP32\",\"data\":[0]}]}", 200);
    assert_string_equal(vt_json_str(j, "model_name"), "b");
    assert_string_equal(vt_json_str(j, "id"), "r1");
    assert_string_equal(vt_json_str(j, "outputs.0.name"), "text_output");
    assert_string_equal(vt_json_str(j, "outputs.0.datatype"), "BYTES");
    assert_string_equal(vt_json_str(j, "outputs.0.data.0"), want);
    cJSON_Delete(j);
    j = http_json(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"Once upon a time\",\"parameters\":"
                  "{\"max_tokens\":48,\"temperature\":0}}", 200);
    assert_string_equal(vt_json_str(j, "text_output"), want);
    /* "length" (stories260K; a synthetic stand-in may end at its end-of-sequence: as /v1 did) */
    assert_string_equal(vt_json_str(j, "finish_reason"), vt_json_str(ref, "choices.0.finish_reason"));
    if (t->stories)
        assert_string_equal(vt_json_str(j, "finish_reason"), "length");
    cJSON_Delete(j);
    /* the prompt first when exclude_input_in_output is false, as TensorRT-LLM's ensemble */
    j = http_json(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"Once upon a time\",\"max_tokens\":48,"
                  "\"temperature\":0,\"exclude_input_in_output\":false}", 200);
    assert_int_equal(strncmp(vt_json_str(j, "text_output"), "Once upon a time", 16), 0);
    assert_string_equal(vt_json_str(j, "text_output") + 16, want);
    cJSON_Delete(j);
    bg_stream b;
    stream(t, "/v2/models/b/generate_stream", "{\"text_input\":\"Once upon a time\",\"max_tokens\":48,"
           "\"temperature\":0,\"stream\":false}", &b); /* the route decides: it streams */
    assert_true(b.c.n > 2);
    assert_string_equal(b.c.text.p, want);
    assert_string_equal(vt_json_str(b.c.last, "finish_reason"), "length");
    assert_string_equal(vt_json_str(b.c.last, "model_name"), "b");
    strbuf_free(&b.c.text);
    cJSON_Delete(b.c.last);
    /* a stop word ends the text before it */
    j = http_json(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"Once upon a time\",\"max_tokens\":48,"
                  "\"temperature\":0,\"stop_words\":\"Lily\"}", 200);
    if (t->stories) {
        assert_string_equal(vt_json_str(j, "text_output"), ", there was a little girl named ");
        assert_string_equal(vt_json_str(j, "finish_reason"), "stop");
    }
    cJSON_Delete(j);
    v2_error(t, "POST", "/v2/models/b/infer", "{\"inputs\":[{\"name\":\"text_input\",\"data\":[\"x\"]},{\"name\":"
             "\"stream\",\"data\":[true]}]}", 400, "generate_stream");
    cJSON_Delete(ref);
}

/* A flat JSON array of numbers as floats (n of them). */
static float *floats(const cJSON *a, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(a);
    float *x = malloc((*n ? *n : 1) * sizeof *x), *p = x;
    for (const cJSON *e = a ? a->child : NULL; e; e = e->next)
        *p++ = (float)e->valuedouble;
    return x;
}

static double log_softmax_at(const float *row, size_t V, int32_t tok)
{
    return (double)row[tok] - ref_logsumexp(row, (uint32_t)V);
}

/* TensorRT-LLM's beam_width, return_log_probs and return_generation_logits: the beams of
 * /v1/completions' use_beam_search (same search: length_penalty 0, early stopping on), with
 * per-beam cum_log_probs, output_log_probs [beam][L] and generation_logits [beam][L][vocab]
 * (padded with 0 past a beam's end); each beam's row k gives its token k the logprob reported. */
static void test_beams_logprobs(void **state)
{
    T *t = *state;
    cJSON *ref = http_json(t, "POST", "/v1/completions", "{\"model\":\"b\",\"prompt\":\"Once upon a time\","
                           "\"max_tokens\":6,\"use_beam_search\":true,\"best_of\":3,\"n\":3,\"length_penalty\":0,"
                           "\"early_stopping\":true,\"logprobs\":0,\"return_token_ids\":true}", 200);
    cJSON *j = http_json(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"Once upon a time\",\"max_tokens\":6,"
                         "\"beam_width\":3,\"return_log_probs\":true,\"return_generation_logits\":true}", 200);
    size_t n_lp, n_rows, n_cum;
    float *lp = floats(vt_json_get(j, "output_log_probs"), &n_lp),
          *rows = floats(vt_json_get(j, "generation_logits"), &n_rows);
    float *cum = floats(vt_json_get(j, "cum_log_probs"), &n_cum);
    size_t L = n_lp / 3, V = L ? n_rows / (3 * L) : 0;
    assert_true(n_cum == 3 && L >= 1 && n_lp == 3 * L && V > 1 && n_rows == 3 * L * V);
    if (t->stories)
        assert_int_equal(V, 512);
    double worst = 0;
    for (int b = 0; b < 3; b++) {
        char path[48];
        snprintf(path, sizeof path, "choices.%d.text", b);
        assert_string_equal(cJSON_GetArrayItem(vt_json_get(j, "text_output"), b)->valuestring, vt_json_str(ref, path));
        snprintf(path, sizeof path, "choices.%d.token_ids", b);
        const cJSON *ids = vt_json_get(ref, path);
        snprintf(path, sizeof path, "choices.%d.logprobs.token_logprobs", b);
        const cJSON *want = vt_json_get(ref, path);
        size_t n = (size_t)cJSON_GetArraySize(ids);
        double sum = 0;
        for (size_t k = 0; k < L; k++) {
            const float *row = rows + ((size_t)b * L + k) * V;
            float l = lp[(size_t)b * L + k];
            if (k >= n) { /* padding */
                assert_true(l == 0 && row[0] == 0 && row[V - 1] == 0);
                continue;
            }
            assert_true(fabs(l - cJSON_GetArrayItem(want, (int)k)->valuedouble) < 1e-6); /* the same search */
            double e = fabs(log_softmax_at(row, V, cJSON_GetArrayItem(ids, (int)k)->valueint) - l);
            worst = e > worst ? e : worst;
            sum += l;
        }
        assert_true(fabs(sum - cum[b]) < 1e-6 && (b == 0 || cum[b] <= cum[b - 1]));
    }
    /* the GPU sampler's float log-softmax against the row's in double: achieved 6.7e-7 */
    printf("v2 beams: 3 beams of up to %zu tokens, row log-softmax vs logprob off by %.1e\n", L, worst);
    assert_true(worst < 2e-5);
    free(lp);
    free(rows);
    free(cum);
    cJSON_Delete(j);
    cJSON_Delete(ref);
    /* infer: FP32 tensors with Triton's batch dimension */
    j = http_json(t, "POST", "/v2/models/b/infer", "{\"inputs\":[{\"name\":\"text_input\",\"data\":[\"Once upon a "
                  "time\"]},{\"name\":\"beam_width\",\"data\":[2]},{\"name\":\"return_log_probs\",\"data\":[true]}],"
                  "\"parameters\":{\"max_tokens\":4}}", 200);
    assert_string_equal(vt_json_str(j, "outputs.1.name"), "cum_log_probs");
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "outputs.0.data")), 2);
    assert_int_equal((int)vt_json_get(j, "outputs.1.shape.1")->valuedouble, 2);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "outputs.2.data")),
                     2 * (int)vt_json_get(j, "outputs.2.shape.2")->valuedouble);
    cJSON_Delete(j);
    /* one beam: a string and a scalar (Triton's generate strips one-element tensors); greedy */
    j = http_json(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"Once upon a time\",\"max_tokens\":3,"
                  "\"temperature\":0,\"return_log_probs\":1,\"return_generation_logits\":true}", 200);
    assert_true(cJSON_IsString(vt_json_get(j, "text_output")) && cJSON_IsNumber(vt_json_get(j, "cum_log_probs")));
    lp = floats(vt_json_get(j, "output_log_probs"), &n_lp);
    rows = floats(vt_json_get(j, "generation_logits"), &n_rows);
    assert_true(n_lp == 3 && n_rows == 3 * V);
    for (size_t k = 0; k < 3; k++) {
        int32_t best = 0;
        for (size_t v = 1; v < V; v++)
            best = rows[k * V + v] > rows[k * V + best] ? (int32_t)v : best;
        assert_true(fabs(log_softmax_at(rows + k * V, V, best) - lp[k]) < 2e-5); /* as above */
    }
    free(lp);
    free(rows);
    cJSON_Delete(j);
    v2_error(t, "POST", "/v2/models/b/generate_stream", "{\"text_input\":\"x\",\"beam_width\":2}", 400, "beam_width");
    v2_error(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"x\",\"return_context_logits\":true}", 400,
             "return_context_logits");
}

/* Per-model labels on the model series; Triton's statistics per model. */
static void test_metrics_stats(void **state)
{
    T *t = *state;
    cJSON *j = http_json(t, "POST", "/v2/models/a/generate", "{\"text_input\":\"hi\",\"max_tokens\":4}", 200);
    cJSON_Delete(j);
    assert_true(metric(t, "vkinfer_requests_total{model=\"a\",outcome=\"length\"}") >= 1);
    assert_true(metric(t, "vkinfer_ready{model=\"b\"}") == 1);
    assert_true(metric(t, "vkinfer_generation_tokens_total{model=\"a\"}") >= 4);
    assert_true(metric(t, "vkinfer_server_ready") == 1);
    j = http_json(t, "GET", "/v2/models/a/stats", NULL, 200);
    assert_string_equal(vt_json_str(j, "model_stats.0.name"), "a");
    assert_true(vt_json_get(j, "model_stats.0.inference_count")->valuedouble >= 1);
    assert_true(vt_json_get(j, "model_stats.0.inference_stats.success.ns")->valuedouble > 0);
    cJSON_Delete(j);
    j = http_json(t, "GET", "/v2/models/stats", NULL, 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "model_stats")), 2);
    cJSON_Delete(j);
}

/* Unloading b while a streams: a is undisturbed; b's short request finishes, its long one ends
 * with an error event when the unload timeout (3 s) passes; b can be loaded again. */
static void test_unload_under_traffic(void **state)
{
    T *t = *state;
    const char *gen_a = "{\"model\":\"a\",\"prompt\":\"x\",\"max_tokens\":300,\"ignore_eos\":true,\"stream\":true}";
    const char *long_b = "{\"model\":\"b\",\"prompt\":\"Once\",\"max_tokens\":1500,\"ignore_eos\":true,\"stream\":true}";
    const char *short_b = "{\"text_input\":\"Once\",\"max_tokens\":6,\"min_length\":6}";
    bg_stream sa = {.port = t->port, .path = "/v1/completions", .body = gen_a};
    bg_stream lb = {.port = t->port, .path = "/v1/completions", .body = long_b};
    bg_stream sb = {.port = t->port, .path = "/v2/models/b/generate_stream", .body = short_b};
    pthread_t ta, tl, ts;
    double b0 = metric(t, "vkinfer_generation_tokens_total{model=\"b\"}");
    pthread_create(&ta, NULL, bg_run, &sa);
    pthread_create(&tl, NULL, bg_run, &lb);
    double end = lg_now() + 60;
    while (metric(t, "vkinfer_generation_tokens_total{model=\"b\"}") < b0 + 6 && lg_now() < end)
        usleep(2000); /* b's long request is under way */
    pthread_create(&ts, NULL, bg_run, &sb);
    while (metric(t, "vkinfer_active_requests{model=\"b\"}") < 2 && lg_now() < end)
        usleep(1000);
    cJSON *j = http_json(t, "POST", "/v2/repository/models/b/unload", "", 200);
    cJSON_Delete(j);
    pthread_join(ts, NULL);
    pthread_join(tl, NULL);
    /* the short request finished normally within the timeout */
    assert_int_equal(sb.status, 200);
    assert_int_equal(sb.rc, 1);
    assert_string_equal(vt_json_str(sb.c.last, "finish_reason"), "length");
    /* the long one ended cleanly: a final error event, then [DONE], no reset. A fast GPU (the
     * H200: ~1 ms a token) writes all 1500 tokens inside the 3 s: then it ends as asked, and
     * the unload waited for it (lavapipe, as in CI, takes the timeout path) */
    assert_int_equal(lb.status, 200);
    assert_int_equal(lb.rc, 1);
    if (!vt_json_get(lb.c.last, "error.message")) {
        assert_string_equal(vt_json_str(lb.c.last, "choices.0.finish_reason"), "length");
        fprintf(stderr, "b's long request finished before the unload timeout: the timeout path not taken\n");
    }
    const char *why = "";
    cJSON *idx = http_json(t, "POST", "/v2/repository/index", NULL, 200);
    assert_string_equal(index_state(idx, "b", &why), "UNAVAILABLE");
    assert_string_equal(why, "unloaded on request");
    cJSON_Delete(idx);
    v2_error(t, "POST", "/v2/models/b/generate", short_b, 404, "not loaded");
    pthread_join(ta, NULL); /* a ran on undisturbed to its length */
    assert_int_equal(sa.rc, 1);
    assert_string_equal(vt_json_str(sa.c.last, "choices.0.finish_reason"), "length");
    /* loading it back */
    j = http_json(t, "POST", "/v2/repository/models/b/load", NULL, 200);
    cJSON_Delete(j);
    j = http_json(t, "POST", "/v2/models/b/generate", short_b, 200);
    assert_string_equal(vt_json_str(j, "finish_reason"), "length");
    cJSON_Delete(j);
    v2_error(t, "POST", "/v2/repository/models/nope/load", NULL, 404, "no model 'nope'");
    v2_error(t, "POST", "/v2/repository/models/huge/load", NULL, 400, "does not fit");
    for (bg_stream *b = &sa; b; b = b == &sa ? &lb : b == &lb ? &sb : NULL) {
        strbuf_free(&b->c.text);
        cJSON_Delete(b->c.last);
    }
}

/* Model control none: load / unload requests are refused; a repository of one broken model
 * still serves (it says why in the index). */
static void test_control_none(void **state)
{
    T *t = *state;
    T n = {0};
    char dir[300], p[400], err[256] = "";
    snprintf(dir, sizeof dir, "%s/none", t->dir);
    snprintf(p, sizeof p, "%s/x.gguf", dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_true(write_file(p, "nope"));
    if (start(&n, SRV_CONTROL_NONE, dir, err, sizeof err) != VKI_OK)
        fail_msg("%s", err);
    cJSON *idx = http_json(&n, "POST", "/v2/repository/index", NULL, 200);
    const char *why = "";
    assert_string_equal(index_state(idx, "x", &why), "UNAVAILABLE");
    cJSON_Delete(idx);
    v2_error(&n, "POST", "/v2/repository/models/x/load", NULL, 400, "model control mode none");
    char *out;
    assert_int_equal(http(&n, "POST", "/v1/completions", "{\"prompt\":\"x\"}", &out), 404);
    assert_non_null(strstr(out, "no model is loaded"));
    free(out);
    srv_destroy(n.s);
    remove(p);
    remove(dir);
    assert_int_equal(start(&n, SRV_CONTROL_NONE, "/nonexistent/vki", err, sizeof err), VKI_ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/vki"));
}


/* Triton's sequence batcher on v2: the server keeps the sequence's tokens, each request sends
 * only its new text, and the pinned KV means the follow-up computes only the new tokens. */
static void test_sequences(void **state)
{
    T *t = *state;
    static const char LONGTEXT[] = "Once upon a time there was a little girl named Lily who lived in a small house "
                                   "near the park with her mother and her dog";
    char body[512];
    double cached0 = metric(t, "vkinfer_prompt_tokens_cached_total{model=\"b\"}");
    snprintf(body, sizeof body, "{\"text_input\":\"%s\",\"max_tokens\":8,\"temperature\":0,\"parameters\":"
             "{\"sequence_id\":42,\"sequence_start\":true}}", LONGTEXT);
    cJSON *j1 = http_json(t, "POST", "/v2/models/b/generate", body, 200);
    cJSON *j2 = http_json(t, "POST", "/v2/models/b/generate", "{\"text_input\":\" Then\",\"max_tokens\":8,"
                          "\"temperature\":0,\"parameters\":{\"sequence_id\":42}}", 200);
    /* turn 2 took turn 1's whole blocks from its pinned KV (>= 2 blocks of 16 tokens) */
    double cached = metric(t, "vkinfer_prompt_tokens_cached_total{model=\"b\"}") - cached0;
    if (cached < 32)
        fail_msg("the follow-up reused %g prompt tokens", cached);
    /* the second turn continued the first: it equals one request over turn 1's prompt and output
     * tokens followed by the new text's tokens (no BOS) */
    snprintf(body, sizeof body, "{\"model\":\"b\",\"prompt\":\"%s\",\"max_tokens\":8,\"temperature\":0,"
             "\"return_token_ids\":true}", LONGTEXT);
    cJSON *t1 = http_json(t, "POST", "/v1/completions", body, 200);
    assert_string_equal(vt_json_str(t1, "choices.0.text"), vt_json_str(j1, "text_output"));
    cJSON *add = http_json(t, "POST", "/tokenize", "{\"model\":\"b\",\"content\":\" Then\",\"add_special\":false}", 200);
    cJSON *ids = cJSON_Duplicate(vt_json_get(t1, "choices.0.prompt_token_ids"), true);
    for (const cJSON *x = vt_json_get(t1, "choices.0.token_ids")->child; x; x = x->next)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(x->valuedouble));
    for (const cJSON *x = vt_json_get(add, "tokens")->child; x; x = x->next)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(x->valuedouble));
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "model", "b");
    cJSON_AddItemToObject(q, "prompt", ids);
    cJSON_AddNumberToObject(q, "max_tokens", 8);
    cJSON_AddNumberToObject(q, "temperature", 0);
    char *qs = cJSON_PrintUnformatted(q);
    cJSON *ref = http_json(t, "POST", "/v1/completions", qs, 200);
    assert_string_equal(vt_json_str(j2, "text_output"), vt_json_str(ref, "choices.0.text"));
    free(qs);
    cJSON_Delete(q);
    cJSON_Delete(add);
    cJSON_Delete(t1);
    assert_true(metric(t, "vkinfer_sessions{model=\"b\"}") >= 1);
    cJSON_Delete(j1);
    cJSON_Delete(j2);
    cJSON_Delete(ref);
    /* a sequence that was never started, ended, or is malformed */
    v2_error(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"x\",\"parameters\":{\"sequence_id\":43}}", 400,
             "sequence_start");
    cJSON *j = http_json(t, "POST", "/v2/models/b/generate", "{\"text_input\":\" The end.\",\"max_tokens\":2,"
                         "\"parameters\":{\"sequence_id\":42,\"sequence_end\":true}}", 200);
    cJSON_Delete(j);
    v2_error(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"x\",\"parameters\":{\"sequence_id\":42}}", 400,
             "not running");
    v2_error(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"x\",\"parameters\":{\"sequence_start\":true}}",
             400, "need a sequence_id");
    v2_error(t, "POST", "/v2/models/b/generate", "{\"text_input\":\"x\",\"parameters\":{\"sequence_id\":-3}}", 400,
             "sequence_id");
    /* OpenAI routes: session_id pins, the end route releases */
    j = http_json(t, "POST", "/v1/completions", "{\"model\":\"a\",\"prompt\":\"hello there\",\"max_tokens\":3,"
                  "\"session_id\":\"chat-1\"}", 200);
    cJSON_Delete(j);
    j = http_json(t, "POST", "/v1/sessions/chat-1/end", "{\"model\":\"a\"}", 200);
    assert_true(cJSON_IsTrue(vt_json_get(j, "ended")));
    cJSON_Delete(j);
    char *out;
    assert_int_equal(http(t, "POST", "/v1/completions", "{\"model\":\"a\",\"prompt\":\"x\",\"session_id\":{}}", &out),
                     400);
    free(out);
}


/* ids of a completion answer: prompt_token_ids + token_ids (+ more), as a JSON array */
static cJSON *conv_ids(const cJSON *answer, const cJSON *more)
{
    cJSON *ids = cJSON_Duplicate(vt_json_get(answer, "choices.0.prompt_token_ids"), true);
    for (const cJSON *x = vt_json_get(answer, "choices.0.token_ids")->child; x; x = x->next)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(x->valuedouble));
    for (const cJSON *x = more ? more->child : NULL; x; x = x->next)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(x->valuedouble));
    return ids;
}

/* A completion over ids in session sid: the answer. */
static cJSON *turn(T *t, const cJSON *ids, const char *sid)
{
    cJSON *q = cJSON_CreateObject();
    cJSON_AddStringToObject(q, "model", "b");
    cJSON_AddItemToObject(q, "prompt", cJSON_Duplicate(ids, true));
    cJSON_AddNumberToObject(q, "max_tokens", 8);
    cJSON_AddNumberToObject(q, "temperature", 0);
    cJSON_AddStringToObject(q, "session_id", sid);
    char *qs = cJSON_PrintUnformatted(q);
    cJSON *a = http_json(t, "POST", "/v1/completions", qs, 200);
    free(qs);
    cJSON_Delete(q);
    return a;
}

/* An OpenAI-style error with status want whose message (or param) contains needle. */
static void oai_error(T *t, const char *path, const char *body, int want, const char *needle)
{
    cJSON *j = http_json(t, "POST", path, body, want);
    const char *msg = vt_json_str(j, "error.message");
    const cJSON *param = vt_json_get(j, "error.param");
    if (!strstr(msg, needle) && !(cJSON_IsString(param) && strstr(param->valuestring, needle)))
        fail_msg("POST %s %s: want an error naming '%s', got %s", path, body, needle, msg);
    cJSON_Delete(j);
}

/* Session files through the server on the real engine: a turn, save, the same conversation's
 * next turn (the reference), the model unloaded and loaded again (a fresh KV pool: a restart),
 * restore into another session, the next turn: the same greedy tokens with only the new tokens
 * prefilled; the file continues a v2 sequence too. A file of another model, traversal file
 * names, a missing file, a session without KV are refused. */
static void test_session_files(void **state)
{
    T *t = *state;
    static const char TEXT[] = "Once upon a time there was a little girl named Lily who lived in a small house near "
                               "the park";
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"b\",\"prompt\":\"%s\",\"max_tokens\":8,\"temperature\":0,"
             "\"return_token_ids\":true,\"session_id\":\"sf-1\"}", TEXT);
    cJSON *t1 = http_json(t, "POST", "/v1/completions", body, 200);
    cJSON *sv = http_json(t, "POST", "/v1/sessions/sf-1/save", "{\"model\":\"b\",\"filename\":\"conv.bin\"}", 200);
    uint32_t n_tok = (uint32_t)vt_json_get(sv, "tokens")->valuedouble,
             n_kv = (uint32_t)vt_json_get(sv, "kv_tokens")->valuedouble;
    uint32_t n_conv = (uint32_t)cJSON_GetArraySize(vt_json_get(t1, "choices.0.prompt_token_ids")) +
                      (uint32_t)vt_json_num(t1, "usage.completion_tokens"); /* 8 (fewer: a synthetic b's EOS) */
    assert_int_equal(n_tok, n_conv);
    assert_true(n_kv >= 16 && n_kv % 16 == 0 && n_kv < n_conv); /* whole 16-token pages */
    assert_true(vt_json_get(sv, "bytes")->valuedouble > 128 && vt_json_get(sv, "ms")->valuedouble >= 0);
    assert_string_equal(vt_json_str(sv, "filename"), "conv.bin");
    cJSON *add = http_json(t, "POST", "/tokenize", "{\"model\":\"b\",\"content\":\" Then\",\"add_special\":false}", 200);
    cJSON *ids = conv_ids(t1, vt_json_get(add, "tokens"));
    cJSON *ref = turn(t, ids, "sf-1"); /* the conversation without save and restore */
    assert_int_equal((int)vt_json_get(ref, "usage.prompt_tokens_details.cached_tokens")->valuedouble, (int)n_kv);
    cJSON *j = http_json(t, "POST", "/v2/repository/models/b/unload", "", 200);
    cJSON_Delete(j);
    j = http_json(t, "POST", "/v2/repository/models/b/load", NULL, 200);
    cJSON_Delete(j);
    cJSON *rs = http_json(t, "POST", "/v1/sessions/sf-2/restore", "{\"model\":\"b\",\"filename\":\"conv.bin\"}", 200);
    assert_int_equal((int)vt_json_get(rs, "tokens")->valuedouble, (int)n_tok);
    assert_int_equal((int)vt_json_get(rs, "kv_tokens")->valuedouble, (int)n_kv);
    assert_string_equal(vt_json_str(rs, "fingerprint"), vt_json_str(sv, "fingerprint"));
    cJSON *again = turn(t, ids, "sf-2");
    assert_string_equal(vt_json_str(again, "choices.0.text"), vt_json_str(ref, "choices.0.text"));
    assert_int_equal((int)vt_json_get(again, "usage.prompt_tokens_details.cached_tokens")->valuedouble, (int)n_kv);
    /* a v2 sequence restored from the file continues the conversation with its new text only */
    rs = (cJSON_Delete(rs), http_json(t, "POST", "/v1/sessions/77/restore", "{\"model\":\"b\",\"filename\":"
                                      "\"conv.bin\"}", 200));
    j = http_json(t, "POST", "/v2/models/b/generate", "{\"text_input\":\" Then\",\"max_tokens\":8,\"temperature\":0,"
                  "\"parameters\":{\"sequence_id\":77}}", 200);
    assert_string_equal(vt_json_str(j, "text_output"), vt_json_str(ref, "choices.0.text"));
    cJSON_Delete(j);
    /* refusals */
    j = http_json(t, "POST", "/v1/completions", "{\"model\":\"a\",\"prompt\":\"hello there, a longer prompt to fill "
                  "a page of sixteen tokens or more\",\"max_tokens\":4,\"session_id\":\"sa\"}", 200);
    cJSON_Delete(j);
    j = http_json(t, "POST", "/v1/sessions/sa/save", "{\"model\":\"a\",\"filename\":\"a.bin\"}", 200);
    cJSON_Delete(j);
    oai_error(t, "/v1/sessions/sf-3/restore", "{\"model\":\"b\",\"filename\":\"a.bin\"}", 400, "from another model");
    oai_error(t, "/v1/sessions/sf-3/restore", "{\"model\":\"b\",\"filename\":\"../x\"}", 400, "filename");
    oai_error(t, "/v1/sessions/sf-3/restore", "{\"model\":\"b\",\"filename\":\"/etc/passwd\"}", 400, "filename");
    oai_error(t, "/v1/sessions/sf-3/save", "{\"model\":\"b\",\"filename\":\".hidden\"}", 400, "filename");
    oai_error(t, "/v1/sessions/sf-3/save", "{\"model\":\"b\"}", 400, "filename");
    oai_error(t, "/v1/sessions/sf-3/save", "{\"model\":\"b\",\"filename\":\"x\",\"path\":\"/tmp\"}", 400, "path");
    oai_error(t, "/v1/sessions/sf-3/restore", "{\"model\":\"b\",\"filename\":\"none.bin\"}", 404, "none.bin");
    oai_error(t, "/v1/sessions/sf-3/save", "{\"model\":\"b\",\"filename\":\"mini.bin\"}", 404, "holds no KV");
    oai_error(t, "/v1/sessions/sf-3/save", "{\"filename\":\"mini.bin\"}", 400, "model");
    char *out;
    int st = http(t, "POST", "/v1/sessions/sf-3/restore", "{\"model\":\"b\",\"filename\":\"a.bin\"}", &out);
    if (st != 400 || strstr(out, t->sdir)) /* the client sees its file name, not the server's folder */
        fail_msg("%d: %s", st, out);
    free(out);
    cJSON_Delete(t1);
    cJSON_Delete(sv);
    cJSON_Delete(add);
    cJSON_Delete(ids);
    cJSON_Delete(ref);
    cJSON_Delete(rs);
    cJSON_Delete(again);
}

/* include/vkinfer_server.h: a server with no repository over the program's own engine, added,
 * served, removed and added again; the engine outlives the server. */
static void test_c_api(void **state)
{
    T *t = *state;
    char path[400], err[256] = "";
    snprintf(path, sizeof path, "%s/a/model.gguf", t->dir);
    vki_engine_params ep = vt_engine_params(1024, 4, &t->validation);
    vki_engine *e = NULL;
    if (vki_engine_create(path, &ep, &e, err, sizeof err) != VKI_OK)
        fail_msg("engine: %s", err);
    vki_server_params sp = vki_server_default_params();
    sp.port = 0;
    assert_int_equal(sp.batch.max_logits_bytes, 64u << 20); /* the server's cap, below the library's */
    vki_model_info mi;
    vki_engine_info(e, &mi);
    sp.batch.max_logits_bytes = 8ull * mi.n_vocab * 4; /* eight rows */
    vki_server *vs = NULL;
    if (vki_server_create(&sp, &vs, err, sizeof err) != VKI_OK)
        fail_msg("vki_server_create: %s", err);
    T c = {.port = vki_server_port(vs)};
    assert_true(c.port > 0);
    cJSON *idx = http_json(&c, "POST", "/v2/repository/index", NULL, 200);
    assert_int_equal(cJSON_GetArraySize(idx), 0);
    cJSON_Delete(idx);
    assert_int_equal(vki_server_add_model(vs, "mine", e, NULL, err, sizeof err), VKI_OK);
    assert_int_equal(vki_server_add_model(vs, "mine", e, NULL, err, sizeof err), VKI_ERR_DUPLICATE_ID);
    assert_int_equal(vki_server_add_model(vs, "../x", e, NULL, err, sizeof err), VKI_ERR_INVALID_ARG);
    cJSON *j = http_json(&c, "GET", "/v2/models/mine/ready", NULL, 200);
    cJSON_Delete(j);
    j = http_json(&c, "POST", "/v2/models/mine/generate",
                  "{\"text_input\":\"hi\",\"max_tokens\":3,\"min_length\":3}", 200);
    assert_string_equal(vt_json_str(j, "finish_reason"), "length"); /* min_length: sampled, no early EOS */
    cJSON_Delete(j);
    j = http_json(&c, "POST", "/v2/models/mine/generate", "{\"text_input\":\"hi\",\"max_tokens\":8,\"min_length\":8,"
                  "\"return_generation_logits\":true}", 200);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(j, "generation_logits")), 8 * (int)mi.n_vocab);
    cJSON_Delete(j);
    v2_error(&c, "POST", "/v2/models/mine/generate", "{\"text_input\":\"hi\",\"max_tokens\":9,"
             "\"return_generation_logits\":true}", 400, "exceeds max_logits_bytes");
    j = http_json(&c, "POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}", 200); /* the only model */
    assert_string_equal(vt_json_str(j, "model"), "mine");
    cJSON_Delete(j);
    j = http_json(&c, "POST", "/v1/sessions/x/save", "{\"filename\":\"f\"}", 501); /* no session_dir */
    if (!strstr(vt_json_str(j, "error.message"), "--session-dir"))
        fail_msg("%s", vt_json_str(j, "error.message"));
    cJSON_Delete(j);
    assert_int_equal(vki_server_remove_model(vs, "mine"), VKI_OK);
    assert_int_equal(vki_server_remove_model(vs, "nope"), VKI_ERR_NOT_FOUND);
    v2_error(&c, "POST", "/v2/models/mine/generate", "{\"text_input\":\"hi\"}", 404, "not loaded");
    assert_int_equal(vki_server_add_model(vs, "mine", e, NULL, err, sizeof err), VKI_OK); /* its manager was freed */
    j = http_json(&c, "POST", "/v2/models/mine/generate", "{\"text_input\":\"hi\",\"max_tokens\":2}", 200);
    cJSON_Delete(j);
    assert_true(vki_server_drain(vs, 10));
    vki_server_destroy(vs);
    vki_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repository),     cmocka_unit_test(test_v2_metadata),
        cmocka_unit_test(test_infer_generate), cmocka_unit_test(test_beams_logprobs),
        cmocka_unit_test(test_metrics_stats),
        cmocka_unit_test(test_sequences),      cmocka_unit_test(test_session_files),
        cmocka_unit_test(test_c_api),
        cmocka_unit_test(test_unload_under_traffic), cmocka_unit_test(test_control_none),
    };
    if (getenv("VKI_TEST_FILTER"))
        cmocka_set_test_filter(getenv("VKI_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
