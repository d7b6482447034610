/* The vkinfer program as a user runs it: `generate` prints exactly the prompt and the generated
 * text on stdout (the known stories260K answer), the same --seed gives the same text, --stop
 * ends before the stop string, bad options exit 2 with a message; `info --json` is valid JSON
 * naming the device; qwen3, gemma2, gemma3 and phi3 models from make-model generate. Runs with --validation and fails on any validation message. */
#include "support/vt.h"

#include <cjson/cJSON.h>
#include <unistd.h>

static const char *model(char *buf, size_t n)
{
    const char *m = vt_shared_model("stories260K.gguf", buf, n);
    if (!m) {
        fprintf(stderr, "SKIP: ../shared/models/stories260K.gguf is absent\n");
        skip();
    }
    return m;
}

static void test_generate_known_answer(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "generate --validation --no-progress -m %s -p \"Once upon a time\" -n 48 --temp 0", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
                               "park. One day, she saw a big, red ball. She wanted to play with it,\n");
    assert_non_null(strstr(r.err, "generated: 48 tokens"));
}

static void test_generate_seed_reproducible(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result a, b, c;
    snprintf(args, sizeof args, "generate --validation --no-progress -m %s -p \"Lily saw\" -n 40 --temp 1.0 "
             "--top-k 40 --seed 1234", m);
    vt_run_vkinfer(args, &a);
    vt_run_vkinfer(args, &b);
    assert_int_equal(a.rc, 0);
    assert_string_equal(a.out, b.out);
    snprintf(args, sizeof args, "generate --validation --no-progress -m %s -p \"Lily saw\" -n 40 --temp 1.0 "
             "--top-k 40 --seed 1235", m);
    vt_run_vkinfer(args, &c);
    assert_string_not_equal(a.out, c.out); /* 40 sampled tokens: a different seed differs */
    assert_non_null(strstr(a.err, "seed 1234"));
}

static void test_generate_stop_string(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "generate --validation --no-progress -m %s -p \"Once upon a time\" -n 48 --temp 0 "
             "--stop \"girl na\"", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "Once upon a time, there was a little \n");
    assert_non_null(strstr(r.err, "finish: stop"));
}

static void test_bad_usage(void **state)
{
    (void)state;
    vt_run_result r;
    vt_run_vkinfer("generate -p x --temp -1 -m /nonexistent.gguf", &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--temp"));
    vt_run_vkinfer("generate -m /nonexistent.gguf -p x", &r);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "/nonexistent.gguf"));
    vt_run_vkinfer("frobnicate", &r);
    assert_int_equal(r.rc, 2);
    vt_run_vkinfer("generate -m /nonexistent.gguf -p x --kv-type q4_0", &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--kv-type is f16, f32 or q8_0"));
    vt_run_vkinfer("generate -m /nonexistent.gguf -p x --max-attention-window 0", &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--max-attention-window"));
}

/* The newer architectures through `vkinfer generate`: small models that make-model writes with
 * each one's tensors and its own window and soft-caps, run with the KV options they bring
 * (q8_0, a capped window); the load line names the architecture and the KV type and size. */
static void test_generate_architectures(void **state)
{
    (void)state;
    static const struct { const char *arch, *model_opts, *run_opts, *line; } cases[] = {
        {"qwen3", "", "--kv-type q8_0 --max-attention-window 16", "q8_0 = 1024 tokens (64 pages of 16, context 1024, window 16)"},
        {"gemma2", "--window 8", "", "(gemma2, 2 layers"},
        {"gemma3", "--window 8", "--kv-type f32", "f32 = 1024 tokens"},
        {"phi3", "--window 8 --ctx-orig 64", "", ", window 8)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[128], cmd[1024], args[1024];
        snprintf(path, sizeof path, "/tmp/vki_cli_%d_%s.gguf", (int)getpid(), cases[i].arch);
        snprintf(cmd, sizeof cmd, "%s/tools/make-model -o %s --arch %s --layers 2 --dim 64 --heads 2 --kv-heads 1 "
                 "--head-dim 32 --ff 128 --vocab 320 --ctx 1024 %s 2>/dev/null", VKI_BINARY_DIR, path, cases[i].arch,
                 cases[i].model_opts);
        assert_int_equal(system(cmd), 0);
        vt_run_result r;
        snprintf(args, sizeof args, "generate --validation --no-progress -m %s -p \"Hello world\" -n 12 --temp 0 "
                 "--kv-tokens 1024 %s", path, cases[i].run_opts);
        vt_run_vkinfer(args, &r);
        if (r.rc != 0 || strncmp(r.out, "Hello world", 11) || !strstr(r.err, "generated: 12 tokens") ||
            !strstr(r.err, cases[i].line))
            fail_msg("%s: rc %d\nstdout: %s\nstderr: %s", cases[i].arch, r.rc, r.out, r.err);
        unlink(path);
    }
}

static void test_info_json(void **state)
{
    (void)state;
    vt_run_result r;
    vt_run_vkinfer("info --json", &r);
    assert_int_equal(r.rc, 0);
    cJSON *o = cJSON_Parse(r.out);
    assert_non_null(o);
    cJSON *devs = cJSON_GetObjectItem(o, "devices");
    assert_true(cJSON_GetArraySize(devs) >= 1);
    cJSON *d0 = cJSON_GetArrayItem(devs, 0);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(d0, "name")));
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(d0, "limits"), "max_storage_buffer_range")->valuedouble > 0);
    cJSON_Delete(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_known_answer),
        cmocka_unit_test(test_generate_seed_reproducible),
        cmocka_unit_test(test_generate_stop_string),
        cmocka_unit_test(test_bad_usage),
        cmocka_unit_test(test_generate_architectures),
        cmocka_unit_test(test_info_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
