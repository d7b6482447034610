/* Faults, end to end: a model whose numbers break (NaN weights) served over HTTP. Each request
 * ends with the error that names the cause, streams end with an error event and [DONE], the
 * metrics count errors, and the server keeps serving. The model is stories260K (or a synthetic
 * one when ../shared/models is absent) with its output norm filled with NaN. */
#define LOADGEN_NO_MAIN
#include "tools/loadgen.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdatomic.h>

#include "engine/synth.h"
#include "host/server/server.h"
#include "support/gguf_edit.h"
#include "support/vt.h"

typedef struct F {
    char src[1024];    /* the healthy model */
    char nan[256];     /* its copy with NaN weights */
    bool synth;        /* src is a synthetic model this suite wrote */
    atomic_int validation;
} F;

static void count_validation(void *user, vki_log_level lvl, const char *msg)
{
    F *f = user;
    if (lvl <= VKI_LOG_WARN && !strncmp(msg, "validation", 10))
        atomic_fetch_add(&f->validation, 1);
    if (lvl <= VKI_LOG_WARN)
        fprintf(stderr, "[vkinfer] %s\n", msg);
}

static int group_setup(void **state)
{
    vt_pin_vulkan_libraries();
    signal(SIGPIPE, SIG_IGN);
    F *f = calloc(1, sizeof *f);
    if (!vt_shared_model("stories260K.gguf", f->src, sizeof f->src)) {
        printf("NOTE: %s/models/stories260K.gguf not found: a synthetic model is used\n", VKI_SHARED_DIR);
        snprintf(f->src, sizeof f->src, "/tmp/vki_test_faults_%d.gguf", (int)getpid());
        synth_params sp = synth_default_params();
        char err[256];
        if (synth_write(&sp, f->src, err, sizeof err) != VKI_OK) {
            printf("cannot write %s: %s\n", f->src, err);
            free(f);
            return -1;
        }
        f->synth = true;
    }
    snprintf(f->nan, sizeof f->nan, "/tmp/vki_test_faults_nan_%d.gguf", (int)getpid());
    gguf_edit e = {.kind = GGUF_EDIT_FILL, .name = "output_norm.weight", .f = NAN};
    if (gguf_edit_copy(f->src, f->nan, &e, 1) != VKI_OK) {
        printf("cannot write %s\n", f->nan);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int group_teardown(void **state)
{
    F *f = *state;
    if (!f)
        return 0;
    unlink(f->nan);
    if (f->synth)
        unlink(f->src);
    int msgs = atomic_load(&f->validation);
    free(f);
    if (msgs)
        fprintf(stderr, "FAIL: %d validation messages\n", msgs);
    return msgs ? -1 : 0;
}

static vki_engine *open_engine(F *f, const char *path)
{
    vki_engine_params ep = vki_engine_default_params();
    ep.kv_tokens = 2048;
    ep.max_seqs = 8;
    ep.device = vt_device_params();
    ep.device.pipeline_cache_dir = "";
    ep.device.log = count_validation;
    ep.device.log_user = f;
    vki_engine *e = NULL;
    char err[512] = "";
    if (vki_engine_create(path, &ep, &e, err, sizeof err) != VKI_OK)
        fail_msg("engine %s: %s", path, err);
    return e;
}

static srv *start_server(vki_engine *e, const char *model, uint16_t *port)
{
    srv_params p = srv_default_params();
    p.port = 0;
    p.model_path = model;
    p.log_level = VKI_LOG_ERROR;
    srv *s = NULL;
    char err[256] = "";
    if (srv_create(e, &p, &s, err, sizeof err) != VKI_OK)
        fail_msg("srv_create: %s", err);
    *port = srv_port(s);
    return s;
}

/* One request on a fresh connection: status, the body (malloc'd, chunks joined). */
static int http(uint16_t port, const char *method, const char *path, const char *body, char **out)
{
    lg_http h;
    lg_http_init(&h, "127.0.0.1", port, 120);
    lg_resp r;
    lg_buf b = {0};
    int st = lg_http_request(&h, method, path, body, &r, &b);
    lg_http_close(&h);
    *out = b.p ? b.p : strdup("");
    return st;
}

static double metric(uint16_t port, const char *name)
{
    double v = NAN;
    if (!lg_metric("127.0.0.1", port, name, &v))
        fail_msg("no metric %s", name);
    return v;
}

/* ---- NaN logits --------------------------------------------------------------------------- */

static const char *const NAN_MSG = "the model produced non-finite logits (NaN/Inf) at position";

/* Non-streaming: 500 in OpenAI's error shape naming the cause; streaming: 200, an error event,
 * then [DONE]; both counted as errors (not cancelled); health stays up. */
static void test_nan_model_server(void **state)
{
    F *f = *state;
    vki_engine *e = open_engine(f, f->nan);
    uint16_t port;
    srv *s = start_server(e, f->nan, &port);
    char *body;
    int st = http(port, "POST", "/v1/completions", "{\"prompt\":\"Once upon\",\"max_tokens\":8}", &body);
    cJSON *j = cJSON_Parse(body);
    const cJSON *err = cJSON_GetObjectItem(j, "error");
    const cJSON *msg = cJSON_GetObjectItem(err, "message"), *type = cJSON_GetObjectItem(err, "type");
    if (st != 500 || !cJSON_IsString(msg) || !strstr(msg->valuestring, NAN_MSG) || !cJSON_IsString(type) ||
        strcmp(type->valuestring, "server_error"))
        fail_msg("non-streaming: %d %s", st, body);
    printf("non-streaming answer: %d %s\n", st, body);
    cJSON_Delete(j);
    free(body);

    st = http(port, "POST", "/v1/chat/completions",
              "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":8,\"stream\":true}", &body);
    const char *ev = strstr(body, "data: {\"error\"");
    const char *done = strstr(body, "data: [DONE]\n\n");
    if (st != 200 || !ev || !strstr(ev, NAN_MSG) || !done || done < ev || done[14] != 0)
        fail_msg("streaming: %d %s", st, body);
    free(body);

    assert_int_equal(metric(port, "vkinfer_requests_total{outcome=\"error\"}"), 2);
    assert_int_equal(metric(port, "vkinfer_requests_total{outcome=\"cancelled\"}"), 0);
    assert_int_equal(http(port, "GET", "/health", NULL, &body), 200);
    free(body);
    srv_destroy(s);
    vki_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nan_model_server),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
