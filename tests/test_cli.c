/* The vkinfer program as a user runs it: `generate` prints exactly the prompt and the generated
 * text on stdout (the known stories260K answer), the same --seed gives the same text, --stop
 * ends before the stop string (escapes interpreted), --ignore-eos, --json, prompts from stdin and
 * files, the context clamp, bad options exit 2 with a message, a device that does not exist is
 * named with the list of those that do, an occupied port is reported before the model loads;
 * `chat` through a pipe (turns per line, history from the KV cache) and on a pseudo-terminal
 * (prompt, continued lines, Ctrl-C stopping an answer but not the program); `info --json` is
 * valid JSON naming the device; qwen3, gemma2, gemma3 and phi3 models from make-model generate.
 * Runs with --validation and fails on any validation message. */
#include "support/vt.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
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
        cmocka_unit_test(test_generate_seed_reproducible),
        cmocka_unit_test(test_generate_stop_string),
        cmocka_unit_test(test_bad_usage),
        cmocka_unit_test(test_generate_architectures),
        cmocka_unit_test(test_info_json),
        cmocka_unit_test(test_generate_ignore_eos),
        cmocka_unit_test(test_generate_escapes),
        cmocka_unit_test(test_generate_json),
        cmocka_unit_test(test_generate_prompt_sources),
        cmocka_unit_test(test_generate_context),
        cmocka_unit_test(test_devices_version_port),
        cmocka_unit_test(test_chat_pipe),
        cmocka_unit_test(test_chat_pty),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
