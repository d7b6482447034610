/* The vkinfer program as a user runs it: `demo` without a model on a fresh cache; `generate` prints exactly the prompt and the generated
 * text on stdout (the known stories260K answer), the same --seed gives the same text, --stop
 * ends before the stop string (escapes interpreted), --ignore-eos, --json, prompts from stdin and
 * files, the context clamp, bad options exit 2 with a message, a device that does not exist is
 * named with the list of those that do, an occupied port is reported before the model loads;
 * `chat` through a pipe (turns per line, history from the KV cache) and on a pseudo-terminal
 * (prompt, continued lines, Ctrl-C stopping an answer but not the program); `info --json` is
 * valid JSON naming the device; --prompt-cache keeps the prompt's KV in a file between runs; --grammar / --json-schema constrain generate and chat; qwen3, gemma2, gemma3 and phi3 models from make-model generate.
 * Runs with --validation and fails on any validation message. */
#include "support/vt.h"
#include "support/vt_json.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 48 --temp 0", m);
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
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Lily saw\" -n 40 --temp 1.0 "
             "--top-k 40 --seed 1234", m);
    vt_run_vkinfer(args, &a);
    vt_run_vkinfer(args, &b);
    assert_int_equal(a.rc, 0);
    assert_string_equal(a.out, b.out);
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Lily saw\" -n 40 --temp 1.0 "
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
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 48 --temp 0 "
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
    vt_run_vkinfer("serve -m /nonexistent.gguf --max-logits-mb 0", &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--max-logits-mb"));
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
        snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Hello world\" -n 12 --temp 0 "
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

/* `bench --json` as tools/gpu-check records it: the workload's numbers with the device, driver,
 * model, commit, sampling and command; decoding alone (with a repeat penalty, which lookahead
 * steps count on the device), the ticks run lookahead steps, and --no-overlap runs none with the
 * same token counts. */
static void test_bench_json(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    double ahead[2] = {0, 0};
    for (int no = 0; no < 2; no++) {
        vt_run_result r;
        snprintf(args, sizeof args, "bench --validation --no-progress -m %s --requests 3 --input 8 --output 12 "
                 "--policy no-evict --max-seqs 4 --json --commit abc123 --repeat-penalty 1.1 --penalty-window 8%s", m,
                 no ? " --no-overlap" : "");
        vt_run_vkinfer(args, &r);
        if (r.rc != 0)
            fail_msg("exit %d: %s", r.rc, r.err);
        cJSON *o = cJSON_Parse(r.out);
        if (!o)
            fail_msg("not JSON: %s", r.out);
#define NUM(k) (cJSON_GetObjectItem(o, k) ? cJSON_GetObjectItem(o, k)->valuedouble : -1)
#define STR(k) (cJSON_IsString(cJSON_GetObjectItem(o, k)) ? cJSON_GetObjectItem(o, k)->valuestring : "")
        assert_true(NUM("requests") == 3 && NUM("errors") == 0 && NUM("output_tokens") == 36);
        assert_true(NUM("output_tokens_per_s") > 0 && NUM("tpot_ms_p50") > 0);
        assert_string_equal(STR("commit"), "abc123");
        assert_string_equal(STR("policy"), "no-evict");
        assert_string_equal(STR("weight_type"), "f32");
        assert_true(strlen(STR("device")) && strlen(STR("driver")) && strlen(STR("model")));
        assert_non_null(strstr(STR("command"), "--commit abc123"));
        assert_true(cJSON_IsBool(cJSON_GetObjectItem(o, "overlap")) && cJSON_IsTrue(cJSON_GetObjectItem(o, "overlap")) == !no);
        assert_true(fabs(NUM("repeat_penalty") - 1.1) < 1e-6 && NUM("penalty_window") == 8 && NUM("temperature") == 0);
        ahead[no] = NUM("lookahead_steps");
        assert_true(ahead[no] >= 0 && ahead[no] <= NUM("ticks") && NUM("ticks") >= 12);
#undef NUM
#undef STR
        cJSON_Delete(o);
    }
    /* three requests arriving at once decode together: all but the first decode tick or so */
    assert_true(ahead[0] >= 8);
    assert_true(ahead[1] == 0);
}

#define KNOWN48 ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, " \
                "red ball. She wanted to play with it,"

/* Every model's unset special ids are -1 (4294967295 in the GGUF): --ignore-eos used to pass one
 * as an end id, which every request refused. */
static void test_generate_ignore_eos(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 20 --ignore-eos", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "generated: 20 tokens"));
}

/* --stop "\n" is a newline (the README's "\n\n" example); --no-escape keeps it literal. */
static void test_generate_escapes(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result full, cut, literal;
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 60", m);
    vt_run_vkinfer(args, &full);
    const char *nl = strchr(full.out, '\n');
    assert_true(nl && nl[1]); /* the greedy story has a newline before its end */
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 60 --stop '\\n'", m);
    vt_run_vkinfer(args, &cut);
    assert_int_equal(cut.rc, 0);
    assert_int_equal(strlen(cut.out), (size_t)(nl - full.out) + 1); /* the text before it, then generate's "\n" */
    assert_memory_equal(cut.out, full.out, (size_t)(nl - full.out));
    assert_non_null(strstr(cut.err, "finish: stop"));
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 60 --stop '\\n' "
             "--no-escape", m);
    vt_run_vkinfer(args, &literal);
    assert_string_equal(literal.out, full.out);
    snprintf(args, sizeof args, "generate -m %s -p x --stop '\\x00'", m);
    vt_run_vkinfer(args, &literal);
    assert_int_equal(literal.rc, 2);
}

static void test_generate_json(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 48 --json", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    cJSON *o = cJSON_Parse(r.out);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "text")->valuestring, KNOWN48);
    assert_string_equal(cJSON_GetObjectItem(o, "prompt")->valuestring, "Once upon a time");
    assert_string_equal(cJSON_GetObjectItem(o, "finish_reason")->valuestring, "length");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "prompt_ids")), 5);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "ids")), 48);
    const cJSON *lp = cJSON_GetObjectItem(o, "logprobs");
    assert_int_equal(cJSON_GetArraySize(lp), 48);
    for (const cJSON *x = lp->child; x; x = x->next)
        assert_true(x->valuedouble <= 0);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "timings"), "generation_tokens_per_s")->valuedouble > 0);
    assert_true(cJSON_IsNumber(cJSON_GetObjectItem(o, "seed")));
    cJSON_Delete(o);
}

/* --prompt-cache FILE: the first run writes the KV of its prompt and answer, a second run with the
 * same prompt takes its first whole page from the file and gives the same greedy ids as a run
 * without it; --prompt-cache-ro reads without writing; a damaged file stops the run with the
 * reason (exit 1); --prompt-cache-ro alone is a usage error (exit 2). */
static cJSON *cache_run(const char *m, const char *prompt, const char *extra, vt_run_result *r)
{
    char args[2048];
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"%s\" -n 24 --temp 0 "
             "--page-size 16 --json %s", m, prompt, extra);
    vt_run_vkinfer(args, r);
    if (r->rc != 0)
        fail_msg("rc %d: %s", r->rc, r->err);
    cJSON *o = cJSON_Parse(r->out);
    assert_non_null(o);
    return o;
}

static char *ids_of(const cJSON *o)
{
    return cJSON_PrintUnformatted(vt_json_get(o, "ids"));
}

static void test_generate_prompt_cache(void **state)
{
    (void)state;
    char m[512], dir[] = "/tmp/vki-pcache-XXXXXX", file[600], extra[700], bad[600];
    model(m, sizeof m);
    assert_non_null(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/cache.bin", dir);
    const char *prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside";
    vt_run_result r;
    cJSON *plain = cache_run(m, prompt, "", &r);
    assert_int_equal(vt_json_num(plain, "timings.prompt_cached_tokens"), 0);
    assert_int_equal(cJSON_GetArraySize(vt_json_get(plain, "prompt_ids")), 26);
    char *want = ids_of(plain);
    snprintf(extra, sizeof extra, "--prompt-cache %s", file);
    cJSON *first = cache_run(m, prompt, extra, &r); /* no file yet: computes all, then saves */
    assert_int_equal(vt_json_num(first, "timings.prompt_cached_tokens"), 0);
    assert_non_null(strstr(r.err, "prompt cache: saved 50 tokens (48 with KV"));
    cJSON *second = cache_run(m, prompt, extra, &r); /* page 0 of the prompt from the file */
    assert_non_null(strstr(r.err, "tokens (48 with KV)"));
    struct stat st0;
    assert_int_equal(stat(file, &st0), 0);
    assert_int_equal(vt_json_num(second, "timings.prompt_cached_tokens"), 16);
    char *got1 = ids_of(first), *got2 = ids_of(second);
    assert_string_equal(got1, want);
    assert_string_equal(got2, want);
    /* read-only: another prompt sharing the first page; the file stays as it was */
    snprintf(extra, sizeof extra, "--prompt-cache %s --prompt-cache-ro", file);
    cJSON *ro = cache_run(m, "Once upon a time, there was a little girl named Lily. She had a dog", extra, &r);
    assert_int_equal(vt_json_num(ro, "timings.prompt_cached_tokens"), 16);
    assert_null(strstr(r.err, "saved"));
    struct stat st1;
    assert_int_equal(stat(file, &st1), 0);
    assert_true(st1.st_size == st0.st_size && st1.st_mtim.tv_sec == st0.st_mtim.tv_sec &&
                st1.st_mtim.tv_nsec == st0.st_mtim.tv_nsec);
    /* a damaged file: the run stops with the reason, the file is left alone */
    snprintf(bad, sizeof bad, "%s/bad.bin", dir);
    FILE *f = fopen(bad, "wb");
    assert_non_null(f);
    fputs("not a session file", f);
    fclose(f);
    char args[2048];
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"%s\" -n 4 "
             "--prompt-cache %s", m, prompt, bad);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "--prompt-cache: "));
    assert_string_equal(r.out, "");
    snprintf(args, sizeof args, "generate -m %s -p x --prompt-cache-ro", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--prompt-cache-ro without --prompt-cache"));
    free(want);
    free(got1);
    free(got2);
    cJSON_Delete(plain);
    cJSON_Delete(first);
    cJSON_Delete(second);
    cJSON_Delete(ro);
    unlink(bad);
    unlink(file);
    rmdir(dir);
}

/* llama.cpp's option names: -c / --ctx-size, -s, --repeat-last-n, -j and -e do what --ctx, --seed,
 * --penalty-window, --json-schema and the default escapes do (the same sampled text); -ngl and -t
 * are accepted with a note naming why they change nothing. */
static void test_generate_llama_cpp_names(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result a, b;
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Lily\\x20saw\" -n 24 "
             "--temp 1 --ctx 64 --seed 7 --penalty-window 16 --repeat-penalty 1.3", m);
    vt_run_vkinfer(args, &a);
    assert_int_equal(a.rc, 0);
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Lily\\x20saw\" -n 24 "
             "--temp 1 -c 64 -s 7 --repeat-last-n 16 --repeat-penalty 1.3 -ngl 99 -t 8 -e", m);
    vt_run_vkinfer(args, &b);
    assert_int_equal(b.rc, 0);
    assert_string_equal(a.out, b.out);
    assert_int_equal(strncmp(b.out, "Lily saw", 8), 0); /* the prompt printed with its escape read */
    assert_non_null(strstr(b.err, "context 64"));
    assert_non_null(strstr(b.err, "-ngl ignored: every layer runs on the GPU"));
    assert_non_null(strstr(b.err, "-t ignored"));
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p Once -n 24 "
             "--no-display-prompt -j '{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 99}'", m);
    vt_run_vkinfer(args, &a);
    assert_int_equal(a.rc, 0);
    char *end;
    long x = strtol(a.out, &end, 10);
    if (end == a.out || *end != '\n' || x < 10 || x > 99)
        fail_msg("-j: \"%s\"", a.out);
    snprintf(args, sizeof args, "generate -m %s -p x -ngl many", m);
    vt_run_vkinfer(args, &a);
    assert_int_equal(a.rc, 2);
    assert_non_null(strstr(a.err, "-ngl needs an integer"));
}

/* Structured output: --json-schema-file (the answer is in the schema's language and ends where
 * it may), --grammar on chat, and bad constraints refused before the model loads (exit 2, the
 * rule and position named). -n 256 covers the schema's worst case (8 whitespace runs of at most
 * 21 bytes and 19 bytes of JSON, a token at least a byte: 187 tokens). Greedy. */
static void test_generate_constrained(void **state)
{
    (void)state;
    static const char schema[] = "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"boolean\"}, "
                                 "\"b\": {\"enum\": [\"x\", \"y\"]}}, \"required\": [\"a\", \"b\"]}";
    char m[512], args[1024], file[] = "/tmp/vki_cli_schema_XXXXXX", gbnf[2048];
    model(m, sizeof m);
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, schema, strlen(schema)), (ssize_t)strlen(schema));
    close(fd);
    vt_run_result r;
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 256 "
             "--json --json-schema-file %s", m, file);
    vt_run_vkinfer(args, &r);
    unlink(file);
    assert_int_equal(r.rc, 0);
    cJSON *o = cJSON_Parse(r.out);
    assert_non_null(o);
    const char *text = cJSON_GetObjectItem(o, "text")->valuestring;
    size_t n;
    assert_int_equal(vki_json_schema_to_grammar(schema, strlen(schema), gbnf, sizeof gbnf, &n, NULL, 0), VKI_OK);
    if (!vt_in_grammar(gbnf, strlen(gbnf), text, strlen(text)))
        fail_msg("\"%s\" is not valid against %s", text, schema);
    assert_string_equal(cJSON_GetObjectItem(o, "finish_reason")->valuestring, "stop");
    cJSON_Delete(o);
    snprintf(args, sizeof args, "chat --validation --no-progress --no-warmup -m %s --grammar 'root ::= \"yes\" | "
             "\"no\"'", m);
    vt_run_vkinfer_in("printf 'Is the sky blue?\\n'", args, &r);
    assert_int_equal(r.rc, 0);
    assert_true(strstr(r.out, "yes\n") || strstr(r.out, "no\n"));
    vt_run_vkinfer("generate -m /nonexistent.gguf -p x --grammar 'root ::= valu'", &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "--grammar: grammar: line 1, column 10: undefined rule 'valu'"));
    vt_run_vkinfer("generate -m /nonexistent.gguf -p x --json-schema '{\"type\": \"string\", \"format\": \"uri\"}'",
                   &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "keyword 'format'"));
    vt_run_vkinfer("generate -m /nonexistent.gguf -p x --grammar 'root ::= \"a\"' --json-schema-file /nonexistent", &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "give one of"));
    vt_run_vkinfer("chat -m /nonexistent.gguf --json-schema-file /nonexistent/s.json", &r);
    assert_int_equal(r.rc, 2);
    assert_non_null(strstr(r.err, "/nonexistent/s.json: cannot open it"));
}

/* --kernel-config: the matrix kernels' shapes given at the command line (the greedy answer
 * unchanged with another matrix-vector workgroup, every prompt row on the GEMM and 16-key
 * attention splits); a bad item fails the load naming it. */
static void test_generate_kernel_config(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "generate --validation --no-progress --no-warmup -m %s -p \"Once upon a time\" -n 48 "
             "--temp 0 --no-display-prompt --kernel-config matvec=4x2x4x2,gemv_max_m=1,attn_split=16", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, KNOWN48 "\n");
    snprintf(args, sizeof args, "generate --no-progress -m %s -p hi -n 1 --kernel-config matvec=4x2,gemm_stages=3", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "kernel config 'gemm_stages=3'"));
}

/* --profile: the trace written, the summary printed at the end, with the command's own steps
 * only (no warm-up steps: not asked for with --no-warmup here): the 5-token prompt's step, then
 * one decode step per generated token after the first. */
static void test_generate_profile(void **state)
{
    (void)state;
    char m[512], args[1024], trace[64];
    model(m, sizeof m);
    snprintf(trace, sizeof trace, "/tmp/vki_cli_profile_%d.json", (int)getpid());
    vt_run_result r;
    snprintf(args, sizeof args, "generate --validation --no-progress -m %s -p \"Once upon a time\" -n 8 --temp 0 "
             "--profile %s", m, trace);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "GPU time by role and kernel: 8 steps, "));
    const char *dec = strstr(r.err, "\ndecode steps (one token per sequence): 7, ");
    const char *pro = strstr(r.err, "\nsteps with prompt tokens: 1, ");
    assert_true(dec && pro && dec < pro);
    assert_non_null(strstr(dec, "attn / attn_decode_"));
    assert_non_null(strstr(pro, "attn / attn_prefill_"));
    assert_null(strstr(r.err, "compiling kernels"));
    struct stat st;
    assert_int_equal(stat(trace, &st), 0);
    assert_true(st.st_size > 1000);
    unlink(trace);
}

/* -p - reads stdin, -f FILE a file; --no-display-prompt prints only the answer. */
static void test_generate_prompt_sources(void **state)
{
    (void)state;
    char m[512], args[1024], file[] = "/tmp/vki_cli_prompt_XXXXXX";
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -p - -n 48", m);
    vt_run_vkinfer_in("printf 'Once upon a time'", args, &r);
    assert_int_equal(r.rc, 0);
    assert_int_equal(strncmp(r.out, "Once upon a time", 16), 0);
    assert_string_equal(r.out + 16, KNOWN48 "\n");
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "Once upon a time", 16), 16);
    close(fd);
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -f %s -n 48 --no-display-prompt", m, file);
    vt_run_vkinfer(args, &r);
    unlink(file);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, KNOWN48 "\n");
    snprintf(args, sizeof args, "generate -m %s -f /nonexistent/prompt.txt", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "/nonexistent/prompt.txt"));
}

/* A request longer than the context is clamped, not refused; --chat renders a user message. */
static void test_generate_context(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -p \"Once upon a time\" --ctx 16 -n 100", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "-n 100 clamped to 11"));
    assert_non_null(strstr(r.err, "generated: 11 tokens"));
    assert_non_null(strstr(r.err, "finish: length"));
    assert_non_null(strstr(r.err, "= 16 tokens (1 pages of 16, context 16)")); /* one sequence, not 256 slots */
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -p x -n 2 --ctx 4096", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.err, "--ctx 4096 is above the context the model was trained for (2048)"));
    snprintf(args, sizeof args, "generate --no-progress --no-warmup -m %s -p \"Tell me a story\" --chat -n 8 "
             "--ignore-eos", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 0);
    assert_null(strstr(r.out, "Tell me a story")); /* the template's text is not echoed */
    assert_non_null(strstr(r.err, "generated: 8 tokens"));
}

static void test_devices_version_port(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "generate -m %s -p x --device 7", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "--device 7: no such device; this machine has:\n  0: "));
    snprintf(args, sizeof args, "generate -m %s -p x --device no-such-gpu", m);
    vt_run_vkinfer(args, &r);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "'no-such-gpu': no such device"));
    vt_run_vkinfer("--version", &r);
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.out, "vkinfer " VKI_PROGRAM_VERSION "\n");
    vt_run_vkinfer("-V", &r);
    assert_string_equal(r.out, "vkinfer " VKI_PROGRAM_VERSION "\n");
    /* an occupied port is reported before the model loads */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    snprintf(args, sizeof args, "serve -m %s --port %u", m, ntohs(a.sin_port));
    vt_run_vkinfer(args, &r);
    close(fd);
    assert_int_equal(r.rc, 1);
    assert_non_null(strstr(r.err, "Address already in use"));
    assert_null(strstr(r.err, "loaded in")); /* no model was loaded first */
}

/* The README's first command: `vkinfer demo` without -m writes a synthetic model into the user's
 * cache (XDG_CACHE_HOME, here a fresh directory) and runs on it; a second run reuses the file. The
 * preset's parameters once started from uninitialised memory (the window, soft-caps and LongRoPE
 * context), which made a fresh machine's demo fail or crash. Needs no ../shared. */
static void test_demo_synthetic_model(void **state)
{
    (void)state;
    char dir[] = "/tmp/vki_cli_cache_XXXXXX", path[600];
    assert_non_null(mkdtemp(dir));
    const char *old = getenv("XDG_CACHE_HOME");
    char *saved = old ? strdup(old) : NULL;
    setenv("XDG_CACHE_HOME", dir, 1);
    const char *args = "demo --validation --no-progress --quiet --requests 3 --input 8-12 --output 3";
    vt_run_result r;
    vt_run_vkinfer(args, &r);
    snprintf(path, sizeof path, "%s/vkinfer/synthetic-tiny.gguf", dir);
    bool written = access(path, R_OK) == 0;
    vt_run_result again;
    vt_run_vkinfer(args, &again);
    if (saved)
        setenv("XDG_CACHE_HOME", saved, 1);
    else
        unsetenv("XDG_CACHE_HOME");
    free(saved);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    if (r.rc != 0)
        fail_msg("vkinfer %s: exit %d\n%s", args, r.rc, r.err);
    assert_non_null(strstr(r.err, "writing a synthetic tiny model"));
    assert_true(written);
    assert_non_null(strstr(r.out, "| no-evict |        3 |"));
    assert_int_equal(again.rc, 0);
    assert_null(strstr(again.err, "writing a synthetic")); /* the cached file */
    assert_non_null(strstr(again.out, "| no-evict |        3 |"));
}

/* Through a pipe: one turn per line, /clear, end of input; the second turn's prompt comes mostly
 * from the KV cache (the first turn's full blocks). */
static void test_chat_pipe(void **state)
{
    (void)state;
    char m[512], args[1024];
    model(m, sizeof m);
    vt_run_result r;
    snprintf(args, sizeof args, "chat --validation --no-progress -m %s -n 12 --ignore-eos --timings", m);
    vt_run_vkinfer_in("printf 'Hello there\\nTell me more\\n/clear\\nHi\\n'", args, &r);
    assert_int_equal(r.rc, 0);
    int lines = 0;
    for (const char *p = r.out; (p = strchr(p, '\n')); p++)
        lines++;
    assert_int_equal(lines, 4); /* three answers and "(history cleared)" */
    assert_non_null(strstr(r.out, "(history cleared)\n"));
    unsigned np[3], cached[3], ans[3];
    const char *p = r.err;
    for (int i = 0; i < 3; i++) {
        p = strstr(p, "[prompt ");
        assert_non_null(p);
        assert_int_equal(sscanf(p, "[prompt %u tokens, %u from the cache; answer %u tokens", &np[i], &cached[i],
                                &ans[i]), 3);
        p++;
    }
    printf("chat turns: prompt %u/%u/%u tokens, %u/%u/%u from the cache\n", np[0], np[1], np[2], cached[0], cached[1],
           cached[2]);
    assert_int_equal(ans[0], 12);
    assert_true(np[1] > np[0] + ans[0]);                     /* the history, then the new turn */
    assert_true(cached[1] >= (np[0] + ans[0]) / 16 * 16 - 16); /* the first turn's full blocks, from the cache */
}

/* ---- chat on a pseudo-terminal ------------------------------------------------------------------ */

typedef struct pty_run {
    int fd;
    pid_t pid;
    char buf[65536];
    size_t len;
} pty_run;

/* Reads from the terminal until `want` has appeared after *from (or the guard time passes). */
static bool pty_wait(pty_run *p, size_t *from, const char *want)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        p->buf[p->len] = 0;
        const char *hit = strstr(p->buf + *from, want);
        if (hit) {
            *from = (size_t)(hit - p->buf) + strlen(want);
            return true;
        }
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 120)
            return false;
        struct pollfd pf = {.fd = p->fd, .events = POLLIN};
        if (poll(&pf, 1, 1000) <= 0)
            continue;
        ssize_t n = read(p->fd, p->buf + p->len, sizeof p->buf - 1 - p->len);
        if (n <= 0)
            return false;
        p->len += (size_t)n;
    }
}

static void test_chat_pty(void **state)
{
    (void)state;
    char m[512];
    model(m, sizeof m);
    pty_run p = {0};
    p.pid = forkpty(&p.fd, NULL, NULL, NULL);
    assert_true(p.pid >= 0);
    if (p.pid == 0) {
        char exe[1024];
        snprintf(exe, sizeof exe, "%s/vkinfer", VKI_BINARY_DIR);
        setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
        execl(exe, exe, "chat", "--no-progress", "-m", m, "-n", "2000", "--ignore-eos", (char *)NULL);
        _exit(127);
    }
    size_t at = 0;
    if (!pty_wait(&p, &at, "> "))
        fail_msg("no prompt on the terminal:\n%s", p.buf);
    /* a turn over two lines: the continuation prompt, then an answer that Ctrl-C stops */
    assert_int_equal(write(p.fd, "Tell me \\\n", 10), 10);
    if (!pty_wait(&p, &at, "... "))
        fail_msg("no continuation prompt:\n%s", p.buf);
    assert_int_equal(write(p.fd, "a long story\n", 13), 13);
    size_t answer = at;
    if (!pty_wait(&p, &at, "a long story\r\n") || !pty_wait(&p, &at, " "))
        fail_msg("no answer:\n%s", p.buf);
    assert_int_equal(write(p.fd, "\x03", 1), 1); /* Ctrl-C: the line discipline sends SIGINT */
    if (!pty_wait(&p, &at, "[stopped]") || !pty_wait(&p, &at, "> "))
        fail_msg("Ctrl-C did not stop the answer (or stopped the program):\n%s", p.buf + answer);
    assert_int_equal(waitpid(p.pid, NULL, WNOHANG), 0); /* still running */
    assert_int_equal(write(p.fd, "/exit\n", 6), 6);
    int status = -1;
    for (int i = 0; i < 600 && waitpid(p.pid, &status, WNOHANG) == 0; i++) {
        char sink[4096];
        struct pollfd pf = {.fd = p.fd, .events = POLLIN};
        if (poll(&pf, 1, 100) > 0 && read(p.fd, sink, sizeof sink) <= 0)
            usleep(10000);
    }
    close(p.fd);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_known_answer),
        cmocka_unit_test(test_generate_kernel_config),
        cmocka_unit_test(test_generate_profile),
        cmocka_unit_test(test_generate_seed_reproducible),
        cmocka_unit_test(test_generate_stop_string),
        cmocka_unit_test(test_bad_usage),
        cmocka_unit_test(test_generate_architectures),
        cmocka_unit_test(test_info_json),
        cmocka_unit_test(test_bench_json),
        cmocka_unit_test(test_generate_ignore_eos),
        cmocka_unit_test(test_generate_escapes),
        cmocka_unit_test(test_generate_json),
        cmocka_unit_test(test_generate_prompt_cache),
        cmocka_unit_test(test_generate_llama_cpp_names),
        cmocka_unit_test(test_generate_constrained),
        cmocka_unit_test(test_generate_prompt_sources),
        cmocka_unit_test(test_generate_context),
        cmocka_unit_test(test_devices_version_port),
        cmocka_unit_test(test_demo_synthetic_model),
        cmocka_unit_test(test_chat_pipe),
        cmocka_unit_test(test_chat_pty),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
