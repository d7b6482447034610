/* What a C program embedding libvkinfer relies on, through the public header only (stories260K on
 * the Vulkan device, validation layer on, any validation message fails):
 *  - the version macros and vki_version() agree;
 *  - the library prints nothing by itself; the progress callback sees the load and can cancel it;
 *  - the simple API: vki_generate gives the known greedy answer, ends at a stop string, stops
 *    when on_text returns false or on vki_batch_cancel from another thread, refuses bad input
 *    with a message; calls from several threads share one manager and each get their solo text;
 *    vki_generate_chat equals vki_generate on the rendered conversation;
 *  - of 8 threads creating a batch manager on one engine at once, exactly one succeeds;
 *  - two engines on one device in one process generate correctly side by side, the second sized
 *    under a caller's memory cap (automatic sizing from VK_EXT_memory_budget is checked with a
 *    stand-in driver in test_engine: lavapipe has no such extension). */
#include "support/vt.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "vkinfer.h"

#define KNOWN_48 ", there was a little girl named Lily. She loved to play outside in the park. One day, she " \
                 "saw a big, red ball. She wanted to play with it,"

static atomic_int g_validation; /* validation messages seen by any engine of this suite */

static void count_log(void *user, vki_log_level lvl, const char *msg)
{
    (void)user;
    if (lvl <= VKI_LOG_WARN) {
        fprintf(stderr, "[vkinfer] %s\n", msg);
        if (!strncmp(msg, "validation", 10))
            atomic_fetch_add(&g_validation, 1);
    }
}

static const char *model_path(void)
{
    static char buf[512];
    const char *m = vt_shared_model("stories260K.gguf", buf, sizeof buf);
    if (!m) {
        fprintf(stderr, "SKIP: ../shared/models/stories260K.gguf is absent\n");
        skip();
    }
    return m;
}

/* Validation on, messages counted, a small KV cache; batch invariant, so a request's greedy text
 * does not depend on what else runs in its steps. */
static vki_engine_params test_params(void)
{
    vki_engine_params p = vki_engine_default_params();
    p.device.validation = true;
    p.device.log = count_log;
    p.kv_tokens = 8192;
    p.max_seqs = 16;
    p.max_tokens = 512;
    p.batch_invariant = true;
    return p;
}

static vki_engine *open_engine(const vki_engine_params *p)
{
    vki_engine *e = NULL;
    char err[512] = "";
    vki_status st = vki_engine_create(model_path(), p, &e, err, sizeof err);
    if (st != VKI_OK)
        fail_msg("vki_engine_create: %s: %s", vki_status_str(st), err);
    return e;
}

static void test_version(void **state)
{
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", VKI_VERSION_MAJOR, VKI_VERSION_MINOR, VKI_VERSION_PATCH);
    assert_string_equal(vki_version(), want);
    assert_string_equal(vki_status_str(VKI_ERR_CANCELLED), "cancelled");
}

/* ---- silence and progress -------------------------------------------------------------------- */

typedef struct progress_log {
    uint32_t calls, stop_after;
    uint64_t last_done, total;
    bool monotonic;
} progress_log;

static bool on_progress(void *user, uint64_t done, uint64_t total)
{
    progress_log *p = user;
    p->monotonic &= done >= p->last_done && done <= total && (!p->total || p->total == total);
    p->last_done = done;
    p->total = total;
    return ++p->calls < p->stop_after;
}

/* Runs fn with the process's stderr sent to a file; returns what was written there. */
static size_t stderr_bytes_during(void (*fn)(void))
{
    char path[] = "/tmp/vki_embed_stderr_XXXXXX";
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    assert_true(fd >= 0 && saved >= 0);
    fflush(stderr);
    dup2(fd, STDERR_FILENO);
    fn();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    close(fd);
    unlink(path);
    return (size_t)n;
}

/* Everything here would have printed before: device listing, a failed load, a load with the
 * default (NULL) logger, a generation. */
static void quiet_calls(void)
{
    vki_device_info info[4];
    uint32_t n = 0;
    assert_int_equal(vki_list_devices(info, 4, &n), VKI_OK);
    vki_engine *e = NULL;
    char err[256] = "";
    assert_int_equal(vki_engine_create("/nonexistent/model.gguf", NULL, &e, err, sizeof err), VKI_ERR_IO);
    assert_non_null(strstr(err, "/nonexistent/model.gguf"));
    vki_engine_params p = vki_engine_default_params();
    p.kv_tokens = 4096;
    assert_int_equal(vki_engine_create(model_path(), &p, &e, err, sizeof err), VKI_OK);
    vki_batch_manager *bm;
    assert_int_equal(vki_batch_manager_create(e, NULL, NULL, &bm), VKI_OK);
    vki_generate_params gp = vki_generate_default_params();
    gp.max_tokens = 4;
    assert_int_equal(vki_generate(bm, "Once", &gp, NULL, err, sizeof err), VKI_OK);
    vki_batch_manager_destroy(bm, false);
    vki_engine_destroy(e);
}

static void test_prints_nothing(void **state)
{
    (void)state;
    model_path();
    assert_int_equal(stderr_bytes_during(quiet_calls), 0);
}

/* int_dot's modes as an engine resolves them: AUTO takes the integer-dot path only where the
 * driver accelerates 4x8-bit dot products on a GPU (NVIDIA; not lavapipe), ON wherever the device
 * has integer dot products, OFF nowhere; vki_model_info.int_dot says which. */
static void test_int_dot_modes(void **state)
{
    (void)state;
    model_path();
    vki_device_info devs[8];
    uint32_t n = 0;
    assert_int_equal(vki_list_devices(devs, 8, &n), VKI_OK);
    const vki_int_dot_mode modes[] = {VKI_INT_DOT_AUTO, VKI_INT_DOT_ON, VKI_INT_DOT_OFF};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        vki_engine_params p = test_params();
        p.int_dot = modes[i];
        vki_engine *e = NULL;
        char err[512] = "";
        vki_status st = vki_engine_create(model_path(), &p, &e, err, sizeof err);
        vki_model_info mi;
        const vki_device_info *d = NULL;
        if (st == VKI_OK) {
            vki_engine_info(e, &mi);
            for (uint32_t k = 0; k < n && k < 8; k++)
                if (!strcmp(devs[k].name, mi.device))
                    d = &devs[k];
            assert_non_null(d);
        }
        if (modes[i] == VKI_INT_DOT_ON && st == VKI_ERR_UNSUPPORTED) { /* no integer dot products */
            assert_non_null(strstr(err, "int_dot"));
            continue;
        }
        assert_int_equal(st, VKI_OK);
        bool want = modes[i] == VKI_INT_DOT_ON ||
                    (modes[i] == VKI_INT_DOT_AUTO && d->integer_dot_accel && d->type != VKI_DEVICE_CPU);
        fprintf(stderr, "  int_dot mode %d on %s (4x8 dot products %saccelerated): %s\n", (int)modes[i], d->name,
                d->integer_dot_accel ? "" : "not ", mi.int_dot ? "integer-dot path" : "float path");
        assert_int_equal(mi.int_dot, want);
        vki_engine_destroy(e);
    }
    vki_engine_params p = test_params();
    p.int_dot = (vki_int_dot_mode)7;
    vki_engine *e = NULL;
    char err[256] = "";
    assert_int_equal(vki_engine_create(model_path(), &p, &e, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_null(e);
    assert_non_null(strstr(err, "int_dot"));
    assert_int_equal(atomic_load(&g_validation), 0);
}

static void test_progress_and_cancel(void **state)
{
    (void)state;
    vki_engine_params p = test_params();
    progress_log log = {.stop_after = UINT32_MAX, .monotonic = true};
    p.progress = on_progress;
    p.progress_user = &log;
    vki_engine *e = open_engine(&p);
    vki_engine_destroy(e);
    assert_true(log.monotonic);
    assert_true(log.calls >= 2); /* 1.1 MiB of weights in tensors of 0.25..262 KiB: many percents */
    assert_int_equal(log.last_done, log.total);

    progress_log stop = {.stop_after = 2, .monotonic = true};
    p.progress_user = &stop;
    char err[256] = "";
    e = (vki_engine *)&stop; /* must come back NULL */
    assert_int_equal(vki_engine_create(model_path(), &p, &e, err, sizeof err), VKI_ERR_CANCELLED);
    assert_null(e);
    assert_int_equal(stop.calls, 2);
    assert_non_null(strstr(err, "cancel"));
    assert_int_equal(atomic_load(&g_validation), 0);
}

/* ---- the simple API ---------------------------------------------------------------------------- */

typedef struct text_sink {
    char text[4096];
    size_t len;
    uint32_t calls, stop_at_call; /* on_text returns false at this call (0: never) */
    uint32_t calls_after_stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    vki_batch_manager *bm;        /* test_generate_errors: generate from inside the callback */
    vki_status inner;
} text_sink;

static bool collect(void *user, const char *t, size_t n)
{
    text_sink *s = user;
    pthread_mutex_lock(&s->mu);
    if (s->stop_at_call && s->calls >= s->stop_at_call)
        s->calls_after_stop++;
    s->calls++;
    if (s->len + n < sizeof s->text) {
        memcpy(s->text + s->len, t, n);
        s->len += n;
        s->text[s->len] = 0;
    }
    if (s->bm)
        s->inner = vki_generate(s->bm, "x", NULL, NULL, NULL, 0);
    pthread_cond_broadcast(&s->cv);
    bool go_on = !s->stop_at_call || s->calls < s->stop_at_call;
    pthread_mutex_unlock(&s->mu);
    return go_on;
}

static void sink_init(text_sink *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
}

typedef struct fixture {
    vki_engine *e;
    vki_batch_manager *bm;
} fixture;

static int setup(void **state)
{
    vt_pin_vulkan_libraries();
    static fixture fx;
    *state = &fx;
    char buf[512];
    if (!vt_shared_model("stories260K.gguf", buf, sizeof buf))
        return 0; /* the tests skip with a message */
    vki_engine_params p = test_params();
    char err[512] = "";
    if (vki_engine_create(buf, &p, &fx.e, err, sizeof err) != VKI_OK ||
        vki_batch_manager_create(fx.e, NULL, NULL, &fx.bm) != VKI_OK) {
        fprintf(stderr, "cannot open the engine: %s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fixture *fx = *state;
    vki_batch_manager_destroy(fx->bm, false);
    vki_engine_destroy(fx->e);
    if (atomic_load(&g_validation)) {
        fprintf(stderr, "FAIL: %d validation messages\n", atomic_load(&g_validation));
        return -1;
    }
    return 0;
}

static fixture *get(void **state)
{
    model_path();
    return *state;
}

static vki_generate_params greedy(uint32_t n, text_sink *s)
{
    vki_generate_params gp = vki_generate_default_params();
    gp.max_tokens = n;
    gp.on_text = collect;
    gp.user = s;
    return gp;
}

static void test_generate_known_answer(void **state)
{
    fixture *fx = get(state);
    text_sink s;
    sink_init(&s);
    vki_generate_params gp = greedy(48, &s);
    vki_generate_result r;
    char err[256];
    assert_int_equal(vki_generate(fx->bm, "Once upon a time", &gp, &r, err, sizeof err), VKI_OK);
    assert_string_equal(s.text, KNOWN_48);
    assert_int_equal(r.finish, VKI_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 48);
    assert_int_equal(r.n_prompt, 5); /* BOS + 4 pieces */
    assert_true(r.first_token_ms > 0 && r.total_ms >= r.first_token_ms);
}

static void test_generate_stop_string(void **state)
{
    fixture *fx = get(state);
    text_sink s;
    sink_init(&s);
    vki_generate_params gp = greedy(48, &s);
    const char *stops[] = {"xyz never", "girl na"};
    gp.stops = stops;
    gp.n_stops = 2;
    vki_generate_result r;
    assert_int_equal(vki_generate(fx->bm, "Once upon a time", &gp, &r, NULL, 0), VKI_OK);
    assert_string_equal(s.text, ", there was a little ");
    assert_int_equal(r.finish, VKI_FINISH_STOP);
    assert_true(r.n_generated < 48);
}

static void test_generate_cancel_from_callback(void **state)
{
    fixture *fx = get(state);
    text_sink s;
    sink_init(&s);
    s.stop_at_call = 3;
    vki_generate_params gp = greedy(48, &s);
    vki_generate_result r;
    assert_int_equal(vki_generate(fx->bm, "Once upon a time", &gp, &r, NULL, 0), VKI_OK);
    assert_int_equal(r.finish, VKI_FINISH_CANCELLED);
    assert_int_equal(s.calls, 3);
    assert_int_equal(s.calls_after_stop, 0);
    assert_true(r.n_generated < 48);
    assert_int_equal(strncmp(s.text, KNOWN_48, s.len), 0); /* what came is the known answer's start */
}

typedef struct gen_thread {
    vki_batch_manager *bm;
    const char *prompt;
    vki_generate_params gp;
    vki_generate_result r;
    vki_status st;
} gen_thread;

static void *run_generate(void *arg)
{
    gen_thread *t = arg;
    t->st = vki_generate(t->bm, t->prompt, &t->gp, &t->r, NULL, 0);
    return NULL;
}

/* vki_batch_cancel(bm, id) from another thread, once the first text arrived. */
static void test_generate_cancel_by_id(void **state)
{
    fixture *fx = get(state);
    text_sink s;
    sink_init(&s);
    gen_thread t = {.bm = fx->bm, .prompt = "Once upon a time", .gp = greedy(400, &s)};
    t.gp.id = 4242;
    t.gp.ignore_eos = true;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_generate, &t), 0);
    pthread_mutex_lock(&s.mu);
    while (!s.calls)
        pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(vki_batch_cancel(fx->bm, 4242), VKI_OK);
    pthread_join(th, NULL);
    assert_int_equal(t.st, VKI_OK);
    assert_int_equal(t.r.finish, VKI_FINISH_CANCELLED);
    assert_true(t.r.n_generated < 400);
}

/* Four threads on one manager: batched together, each gets what it gets alone. */
static void test_generate_threads(void **state)
{
    fixture *fx = get(state);
    static const char *const prompts[4] = {"Once upon a time", "Lily saw a", "The dog", "Once upon a time"};
    char solo[4][4096];
    text_sink s[4];
    for (int i = 0; i < 4; i++) {
        sink_init(&s[i]);
        vki_generate_params gp = greedy(24, &s[i]);
        assert_int_equal(vki_generate(fx->bm, prompts[i], &gp, NULL, NULL, 0), VKI_OK);
        memcpy(solo[i], s[i].text, sizeof solo[i]);
    }
    gen_thread t[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        sink_init(&s[i]);
        t[i] = (gen_thread){.bm = fx->bm, .prompt = prompts[i], .gp = greedy(24, &s[i])};
        assert_int_equal(pthread_create(&th[i], NULL, run_generate, &t[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].st, VKI_OK);
        assert_string_equal(s[i].text, solo[i]);
    }
}

/* The conversation path: same tokens as the rendered text through vki_generate (stories260K has
 * no template: the plain fallback). */
static void test_generate_chat(void **state)
{
    fixture *fx = get(state);
    const vki_chat_template *t = vki_engine_chat_template(fx->e);
    assert_string_equal(vki_chat_template_name(t), "plain");
    vki_chat_message msgs[] = {{VKI_CHAT_SYSTEM, "Be brief."}, {VKI_CHAT_USER, "Tell me a story."}};
    char rendered[256];
    size_t n = 0;
    assert_int_equal(vki_chat_apply(t, msgs, 2, true, rendered, sizeof rendered, &n, NULL, 0), VKI_OK);
    assert_string_equal(rendered, "system: Be brief.\nuser: Tell me a story.\nassistant:");
    text_sink a, b;
    sink_init(&a);
    sink_init(&b);
    vki_generate_params ga = greedy(16, &a), gb = greedy(16, &b);
    vki_generate_result ra, rb;
    assert_int_equal(vki_generate_chat(fx->bm, NULL, msgs, 2, &ga, &ra, NULL, 0), VKI_OK);
    assert_int_equal(vki_generate(fx->bm, rendered, &gb, &rb, NULL, 0), VKI_OK);
    assert_int_equal(ra.n_prompt, rb.n_prompt);
    assert_true(a.len > 0);
    assert_string_equal(a.text, b.text);
}

static void test_generate_errors(void **state)
{
    fixture *fx = get(state);
    char err[256];
    vki_generate_params gp = vki_generate_default_params();
    assert_int_equal(vki_generate(fx->bm, NULL, &gp, NULL, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "prompt"));
    gp.sampling.temperature = -1;
    assert_int_equal(vki_generate(fx->bm, "Once", &gp, NULL, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "temperature"));
    gp = vki_generate_default_params();
    const char *empty[] = {""};
    gp.stops = empty;
    gp.n_stops = 1;
    assert_int_equal(vki_generate(fx->bm, "Once", &gp, NULL, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "stop"));
    /* longer than the context (2048 tokens here): refused, naming it */
    size_t len = 3 * 4096;
    char *longp = malloc(len + 1);
    for (size_t i = 0; i < len; i += 3)
        memcpy(longp + i, "ab ", 3);
    longp[len] = 0;
    gp = vki_generate_default_params();
    assert_int_equal(vki_generate(fx->bm, longp, &gp, NULL, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "context"));
    free(longp);
    vki_chat_message bad[] = {{(vki_chat_role)7, "x"}};
    assert_int_equal(vki_generate_chat(fx->bm, NULL, bad, 1, NULL, NULL, err, sizeof err), VKI_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "messages[0]"));
    /* from inside a callback of the same manager: refused, not a deadlock */
    text_sink s;
    sink_init(&s);
    s.bm = fx->bm;
    s.inner = VKI_OK;
    gp = greedy(2, &s);
    assert_int_equal(vki_generate(fx->bm, "Once", &gp, NULL, NULL, 0), VKI_OK);
    assert_int_equal(s.inner, VKI_ERR_INVALID_ARG);
}

/* ---- concurrency and two engines ---------------------------------------------------------------- */

typedef struct race {
    vki_engine *e;
    pthread_barrier_t go;
    vki_batch_manager *bm[8];
    vki_status st[8];
    int idx[8];
} race;

static race g_race;

static void *create_manager(void *arg)
{
    int i = *(int *)arg;
    pthread_barrier_wait(&g_race.go);
    g_race.st[i] = vki_batch_manager_create(g_race.e, NULL, NULL, &g_race.bm[i]);
    return NULL;
}

/* 8 threads released at once, 20 rounds: exactly one manager each round. */
static void test_manager_create_race(void **state)
{
    fixture *fx = get(state);
    assert_int_equal(vki_batch_manager_destroy(fx->bm, false), VKI_OK); /* the engine is free now */
    fx->bm = NULL;
    g_race.e = fx->e;
    for (int round = 0; round < 20; round++) {
        pthread_t th[8];
        pthread_barrier_init(&g_race.go, NULL, 8);
        for (int i = 0; i < 8; i++) {
            g_race.idx[i] = i;
            g_race.bm[i] = NULL;
            assert_int_equal(pthread_create(&th[i], NULL, create_manager, &g_race.idx[i]), 0);
        }
        int ok = 0;
        for (int i = 0; i < 8; i++) /* all tried before the winner goes (it would free the engine) */
            pthread_join(th[i], NULL);
        for (int i = 0; i < 8; i++) {
            if (g_race.st[i] == VKI_OK) {
                ok++;
                assert_int_equal(vki_batch_manager_destroy(g_race.bm[i], false), VKI_OK);
            } else {
                assert_int_equal(g_race.st[i], VKI_ERR_INVALID_ARG);
                assert_null(g_race.bm[i]);
            }
        }
        pthread_barrier_destroy(&g_race.go);
        assert_int_equal(ok, 1);
    }
    assert_int_equal(vki_batch_manager_create(fx->e, NULL, NULL, &fx->bm), VKI_OK);
}

/* A second engine on the same device under a memory cap: its KV cache takes kv_fraction of what
 * the cap leaves after its weights and scratch; both engines generate the known answer at once. */
static void test_two_engines(void **state)
{
    fixture *fx = get(state);
    const uint64_t cap = 64ull << 20;
    vki_engine_params p = test_params();
    p.kv_tokens = 0;
    p.max_seqs = 64; /* every slot at full context would take 80 MiB: the cap decides, not the slots */
    p.device_memory_limit = cap;
    vki_engine *b = open_engine(&p);
    vki_model_info ia, ib;
    vki_engine_info(fx->e, &ia);
    vki_engine_info(b, &ib);
    assert_string_equal(ia.device, ib.device);
    assert_true(ib.device_bytes <= cap);
    uint64_t rest = ib.device_bytes - ib.kv_bytes, want = (uint64_t)(0.8 * (double)(cap - rest));
    fprintf(stderr, "  engine B: %.1f MiB of buffers besides KV, KV %.1f MiB of a %.1f MiB share of the cap\n",
            rest / 1048576.0, ib.kv_bytes / 1048576.0, want / 1048576.0);
    assert_true(ib.kv_bytes <= want && ib.kv_bytes + (want >> 6) >= want); /* whole pages: < 1/64 short */

    vki_batch_manager *bm_b;
    assert_int_equal(vki_batch_manager_create(b, NULL, NULL, &bm_b), VKI_OK);
    text_sink sa, sb;
    sink_init(&sa);
    sink_init(&sb);
    gen_thread ta = {.bm = fx->bm, .prompt = "Once upon a time", .gp = greedy(48, &sa)};
    gen_thread tb = {.bm = bm_b, .prompt = "Once upon a time", .gp = greedy(48, &sb)};
    pthread_t th[2];
    pthread_create(&th[0], NULL, run_generate, &ta);
    pthread_create(&th[1], NULL, run_generate, &tb);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    assert_int_equal(ta.st, VKI_OK);
    assert_int_equal(tb.st, VKI_OK);
    assert_string_equal(sa.text, KNOWN_48);
    assert_string_equal(sb.text, KNOWN_48);
    vki_batch_manager_destroy(bm_b, false);
    vki_engine_destroy(b);

    /* a cap the fixed buffers cannot fit under: refused, naming the limit */
    p.device_memory_limit = 8ull << 20;
    char err[512] = "";
    vki_engine *none = NULL;
    assert_int_equal(vki_engine_create(model_path(), &p, &none, err, sizeof err), VKI_ERR_OUT_OF_DEVICE_MEMORY);
    assert_null(none);
    assert_non_null(strstr(err, "limit"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_prints_nothing),
        cmocka_unit_test(test_int_dot_modes),
        cmocka_unit_test(test_progress_and_cancel),
        cmocka_unit_test(test_generate_known_answer),
        cmocka_unit_test(test_generate_stop_string),
        cmocka_unit_test(test_generate_cancel_from_callback),
        cmocka_unit_test(test_generate_cancel_by_id),
        cmocka_unit_test(test_generate_threads),
        cmocka_unit_test(test_generate_chat),
        cmocka_unit_test(test_generate_errors),
        cmocka_unit_test(test_manager_create_race),
        cmocka_unit_test(test_two_engines),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
