/* `vkinfer bench-model` (host/cli/cli_bench_model.c) as the GPU script runs it, on a tiny
 * synthetic model: one JSON object per test and batch size with every field the results table
 * needs; the bytes a generation step reads (weights + KV) equal what this suite computes on its
 * own from the GGUF tensor table and the KV layout; the bandwidth fraction is those bytes per
 * second over the copy kernel's; bad options exit 2 and impossible sizes exit 1, naming the
 * cause. Speed is not asserted (a benchmark prints numbers). Runs with --validation. */
#include "support/vt.h"

#include <cjson/cJSON.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/synth.h"

/* The tiny preset (2 layers, d 64, 4/2 heads, head dim 16, d_ff 192, vocab 320, context 512,
 * untied LM head) in Q8_0, written once into a temporary folder. */
typedef struct fixture {
    char dir[64], model[128];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/vki_bench_model_XXXXXX");
    if (!f || !mkdtemp(f->dir))
        return -1;
    snprintf(f->model, sizeof f->model, "%s/tiny.gguf", f->dir);
    synth_params p = synth_default_params();
    p.wtype = SYNTH_Q8_0;
    char err[256];
    if (synth_write(&p, f->model, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "synth_write: %s\n", err);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    unlink(f->model);
    int rc = rmdir(f->dir);
    free(f);
    return rc;
}

/* Facts of the model file, counted here from its tensor table. */
typedef struct file_facts {
    double params;      /* elements of every tensor */
    double step_bytes;  /* every tensor but token_embd: what each step reads once (of the stacked
                           experts *_exps, the share expert_share: a batch-1 step's) */
    double embd_row;    /* one token_embd row */
    double kv_pos;      /* K + V of one position over all layers, F16 */
} file_facts;

/* expert_share: used / count experts (1 for a dense model). */
static file_facts read_facts(const char *path, const char *arch, double expert_share)
{
    gguf_file *g;
    char err[256], key[96];
    if (gguf_open(path, &g, err, sizeof err) != VKI_OK)
        fail_msg("%s: %s", path, err);
    file_facts ff = {0};
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        double n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n *= (double)t->ne[d];
        ff.params += n;
        bool exps = t->name.len > 12 && !memcmp(t->name.ptr + t->name.len - 12, "_exps.weight", 12);
        if (gguf_str_eq(t->name, "token_embd.weight"))
            ff.embd_row = (double)t->nbytes / (double)t->ne[1];
        else
            ff.step_bytes += (double)t->nbytes * (exps ? expert_share : 1.0);
    }
    uint32_t layers, heads_kv, d, heads, hd;
#define U32(suffix, dst) (snprintf(key, sizeof key, "%s.%s", arch, suffix), gguf_get_u32(g, key, dst))
    assert_int_equal(U32("block_count", &layers), VKI_OK);
    assert_int_equal(U32("attention.head_count_kv", &heads_kv), VKI_OK);
    assert_int_equal(U32("attention.head_count", &heads), VKI_OK);
    assert_int_equal(U32("embedding_length", &d), VKI_OK);
    if (U32("attention.key_length", &hd) != VKI_OK)
        hd = d / heads;
#undef U32
    ff.kv_pos = 2.0 * layers * heads_kv * hd * 2;
    gguf_close(g);
    return ff;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!cJSON_IsNumber(v))
        fail_msg("JSON field %s missing or not a number", key);
    return v->valuedouble;
}

static const char *str(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!cJSON_IsString(v) || !*v->valuestring)
        fail_msg("JSON field %s missing or empty", key);
    return v->valuestring;
}

static bool close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * fabs(b); }

/* One tg line: bytes per token from the file, the fraction from the line's own numbers. */
static void check_tg_bytes(const cJSON *o, const file_facts *ff, uint32_t B, uint32_t depth, uint32_t n)
{
    double keys = 0; /* per sequence, over the n steps: step k attends to depth + k + 1 positions */
    for (uint32_t k = 0; k < n; k++)
        keys += depth + k + 1.0;
    double want = (n * (ff->step_bytes + B * ff->embd_row) + B * keys * ff->kv_pos) / ((double)B * n);
    double got = num(o, "bytes_per_token");
    if (!close_rel(got, want, 1e-12))
        fail_msg("tg n_seqs %u: bytes_per_token %.1f, counted from the file %.1f", B, got, want);
    double frac = got * num(o, "tokens_per_s") / (num(o, "copy_gbps") * 1e9);
    if (!close_rel(num(o, "bw_fraction"), frac, 1e-9))
        fail_msg("tg n_seqs %u: bw_fraction %.9g, bytes x tokens/s / copy %.9g", B, num(o, "bw_fraction"), frac);
}

static void check_line(const cJSON *o, const file_facts *ff, const char *test, uint32_t B, uint32_t depth,
                       uint32_t n)
{
    assert_string_equal(str(o, "test"), test);
    assert_string_equal(str(o, "commit"), "abc123");
    assert_string_equal(str(o, "weight_type"), "q8_0");
    assert_string_equal(str(o, "model"), "vkinfer-synthetic");
    str(o, "device"), str(o, "driver"), str(o, "command");
    assert_true(num(o, "n_params") == ff->params);
    assert_true(num(o, "n_seqs") == B);
    assert_true(num(o, "context") == depth);
    assert_true(num(o, "n_tokens") == (double)B * n);
    double tps = num(o, "tokens_per_s"), copy = num(o, "copy_gbps");
    assert_true(isfinite(tps) && tps > 0 && isfinite(copy) && copy > 0 && num(o, "tflops") > 0);
    assert_true(num(o, "host_us_per_step") > 0 && num(o, "ms_per_step") > 0);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "peak_tflops")));
    if (test[0] == 't')
        check_tg_bytes(o, ff, B, depth, n);
    else
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "bytes_per_token")));
}

static void test_json_lines(void **state)
{
    fixture *f = *state;
    file_facts ff = read_facts(f->model, "llama", 1.0);
    char args[1024];
    snprintf(args, sizeof args, "bench-model --validation -m %s --pp 16 --tg 4 --depth 8 --pp-batches 1,2 "
             "--tg-batches 1,3 --copy-mib 1 --json --commit abc123", f->model);
    vt_run_result *r = malloc(sizeof *r);
    vt_run_vkinfer(args, r);
    if (r->rc != 0)
        fail_msg("exit %d:\n%s", r->rc, r->err);
    static const struct { const char *test; uint32_t B, depth, n; } want[] = {
        {"pp16", 1, 0, 16}, {"pp16", 2, 0, 16}, {"tg4", 1, 8, 4}, {"tg4", 3, 8, 4}};
    char *save = NULL, *line = strtok_r(r->out, "\n", &save);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++, line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = line ? cJSON_Parse(line) : NULL;
        if (!o)
            fail_msg("line %zu: not a JSON object: %s", i + 1, line ? line : "(missing)");
        check_line(o, &ff, want[i].test, want[i].B, want[i].depth, want[i].n);
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "sampling"))); /* greedy */
        cJSON_Delete(o);
    }
    assert_null(line); /* nothing else on stdout: the table went to stderr */
    assert_non_null(strstr(r->err, "copy kernel"));
    /* two steps in flight: the same accounting, marked in the JSON */
    snprintf(args, sizeof args, "bench-model --validation -m %s --pp 0 --tg 5 --depth 8 --tg-batches 1,3 --copy-mib 1 "
             "--json --overlap --commit abc123", f->model);
    vt_run_vkinfer(args, r);
    if (r->rc != 0)
        fail_msg("--overlap: exit %d:\n%s", r->rc, r->err);
    line = strtok_r(r->out, "\n", &save);
    for (uint32_t B = 1; B <= 3; B += 2, line = strtok_r(NULL, "\n", &save)) {
        cJSON *o = line ? cJSON_Parse(line) : NULL;
        if (!o)
            fail_msg("--overlap, batch %u: not a JSON object: %s", B, line ? line : "(missing)");
        check_line(o, &ff, "tg5", B, 8, 5);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(o, "overlap")));
        assert_int_equal(cJSON_GetObjectItem(o, "steps")->valueint, 5);
        cJSON_Delete(o);
    }
    assert_null(line);
    /* every row drawn: the same accounting, the parameters in the JSON and the table */
    snprintf(args, sizeof args, "bench-model --validation -m %s --pp 0 --tg 3 --depth 8 --tg-batches 2 --copy-mib 1 "
             "--json --temp 0.8 --top-k 40 --top-p 0.9 --commit abc123", f->model);
    vt_run_vkinfer(args, r);
    if (r->rc != 0)
        fail_msg("--temp: exit %d:\n%s", r->rc, r->err);
    cJSON *o = cJSON_Parse(r->out);
    if (!o)
        fail_msg("--temp: not a JSON object: %s", r->out);
    check_line(o, &ff, "tg3", 2, 8, 3);
    assert_string_equal(str(o, "sampling"), "temp 0.8, top_k 40, top_p 0.9, min_p 0");
    assert_non_null(strstr(r->err, "sampling: temp 0.8, top_k 40, top_p 0.9, min_p 0 (every row drawn)"));
    cJSON_Delete(o);
    free(r);
}

/* A mixture of experts: batch-1 generation reads the router and 2 of the 8 experts of every
 * layer, not all of them (the roofline's bytes per token count the active parameters only). */
static void test_moe_active_experts(void **state)
{
    fixture *f = *state;
    char path[160], err[256], args[1024];
    snprintf(path, sizeof path, "%s/moe.gguf", f->dir);
    synth_params p = synth_default_params();
    p.arch = "qwen3moe", p.n_expert = 8, p.n_expert_used = 2, p.d_ff_exp = 64, p.head_dim = 32;
    p.wtype = SYNTH_Q8_0;
    assert_int_equal(synth_write(&p, path, err, sizeof err), VKI_OK);
    file_facts ff = read_facts(path, "qwen3moe", 2.0 / 8.0);
    snprintf(args, sizeof args, "bench-model --validation -m %s --pp 0 --tg 3 --depth 4 --tg-batches 1 --copy-mib 1 "
             "--json --commit abc123", path);
    vt_run_result *r = malloc(sizeof *r);
    vt_run_vkinfer(args, r);
    unlink(path);
    if (r->rc != 0)
        fail_msg("exit %d:\n%s", r->rc, r->err);
    cJSON *o = cJSON_Parse(r->out);
    if (!o)
        fail_msg("not a JSON object: %s", r->out);
    check_tg_bytes(o, &ff, 1, 4, 3);
    assert_non_null(strstr(r->err, "(batch 1: 2 of 8 experts)"));
    cJSON_Delete(o);
    free(r);
}

static void test_bad_usage(void **state)
{
    fixture *f = *state;
    vt_run_result *r = malloc(sizeof *r);
    char args[1024];
    static const struct { const char *opts, *needle; int rc; } cases[] = {
        {"--tg-batches 0", "--tg-batches", 2},
        {"--tg-batches 1,x", "--tg-batches", 2},
        {"--reps 65", "--reps", 2},
        {"--pp 0 --tg 0", "nothing to run", 2},
        {"--frobnicate 1", "unknown", 2},
        {"--overlap --profile /dev/null", "--overlap", 2},
        {"--temp -1", "--temp", 2},
        {"--top-p 2", "--top-p", 2},
        /* 4096 sequences at 16M positions: more KV pages than one pool binding holds anywhere */
        {"--tg 4 --depth 16777216 --tg-batches 4096 --pp 0 --copy-mib 1", "KV", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "bench-model --validation -m %s %s", f->model, cases[i].opts);
        vt_run_vkinfer(args, r);
        if (r->rc != cases[i].rc || !strstr(r->err, cases[i].needle))
            fail_msg("`%s`: exit %d, stderr \"%s\" (want exit %d naming \"%s\")", cases[i].opts, r->rc, r->err,
                     cases[i].rc, cases[i].needle);
    }
    vt_run_vkinfer("bench-model --pp 8", r);
    assert_int_equal(r->rc, 2);
    assert_non_null(strstr(r->err, "no model"));
    vt_run_vkinfer("bench-model -m /nonexistent/m.gguf --pp 8", r);
    assert_int_equal(r->rc, 1);
    assert_non_null(strstr(r->err, "/nonexistent/m.gguf"));
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_lines),
        cmocka_unit_test(test_moe_active_experts),
        cmocka_unit_test(test_bad_usage),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
