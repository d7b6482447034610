/* session-bench: time to first token of the 5th turn of a ~2,000-token conversation, with and
 * without a session (vki_request.session_id), while other traffic passes through the KV pool
 * between turns. Prints a table; asserts nothing.
 *
 *   build/tools/make-model -o /tmp/small.gguf --preset small --ctx 4096
 *   build/tools/session-bench -m /tmp/small.gguf
 *
 * A turn's prompt is the conversation so far (previous prompt + previous answer) + a new user
 * message of --user tokens; each answer is --answer tokens (greedy, end of text ignored). Between
 * turns --traffic unrelated requests of --traffic-len prompt tokens run, enough to evict every
 * block the conversation left cached (the pool is --kv-tokens). Modes: no prefix reuse; prefix
 * reuse with that traffic; a session with that traffic; prefix reuse with no traffic (the best
 * the cache can do).
 *
 * --file PATH (session files): the conversation's first turns in a session, the session saved to
 * PATH, the batch manager destroyed and a new one created (an empty pool, as after a restart),
 * the file restored, then the last turn: save and restore times, file size, and the last turn's
 * computed tokens and TTFT against the same turn without the file. --file-only skips the table. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vkinfer.h"

typedef struct wait1 {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double t_first;            /* seconds, first token */
    bool done;
    uint32_t n_cached;
    int32_t out[256];
    uint32_t n_out;
} wait1;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void on_resp(void *user, const vki_response *r)
{
    wait1 *w = user;
    pthread_mutex_lock(&w->mu);
    if (r->n_tokens && !w->t_first)
        w->t_first = now_s();
    for (uint32_t k = 0; k < r->n_tokens && w->n_out < 256; k++)
        w->out[w->n_out++] = r->tokens[k];
    if (r->final) {
        w->done = true;
        w->n_cached = r->n_cached;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Runs one request to its end; returns its TTFT in ms, *cached its prefix-cache tokens. */
static double run(vki_batch_manager *bm, uint64_t id, const int32_t *prompt, uint32_t n, uint32_t max_new,
                  uint64_t session, wait1 *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    vki_request q = {.id = id, .prompt = prompt, .n_prompt = n, .max_new_tokens = max_new, .ignore_eos = true,
                     .sampling = vki_sampling_default_params(), .streaming = true, .session_id = session};
    q.sampling.temperature = 0;
    char err[256] = "";
    double t0 = now_s();
    if (vki_batch_submit(bm, &q, on_resp, w, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "session-bench: submit: %s\n", err);
        exit(1);
    }
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    return (w->t_first - t0) * 1e3;
}

typedef struct opts {
    const char *model;
    const char *file;          /* --file: session file measurements */
    bool file_only;
    uint32_t turns, user, answer, traffic, traffic_len, kv_tokens;
} opts;

typedef struct result {
    double ttft_ms;
    uint32_t prompt, cached;
} result;

static uint64_t rng = 88172645463325252ull;
static int32_t rnd_tok(uint32_t vocab)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int32_t)(3 + rng % (vocab - 3));
}

/* One conversation in a fresh manager; the last turn's figures. */
static result conversation(vki_engine *e, const opts *o, bool reuse, bool session, bool traffic, uint32_t vocab)
{
    vki_batch_params p = vki_batch_default_params();
    p.block_reuse = reuse;
    p.session_max_blocks = o->kv_tokens / 16; /* this bench pins one conversation: let it have the pool */
    vki_batch_manager *bm = NULL;
    if (vki_batch_manager_create(e, &p, NULL, &bm) != VKI_OK) {
        fprintf(stderr, "session-bench: cannot create the batch manager\n");
        exit(1);
    }
    size_t cap = (size_t)o->turns * (o->user + o->answer) + 16;
    int32_t *conv = malloc(cap * sizeof *conv), *other = malloc((size_t)o->traffic_len * sizeof *other);
    uint32_t n = 0;
    uint64_t id = 1;
    result r = {0};
    rng = 88172645463325252ull; /* the same conversation and traffic in every mode */
    wait1 w;
    for (uint32_t turn = 1; turn <= o->turns; turn++) {
        for (uint32_t i = 0; i < o->user; i++)
            conv[n++] = rnd_tok(vocab);
        double ttft = run(bm, id++, conv, n, o->answer, session ? 77 : 0, &w);
        r = (result){.ttft_ms = ttft, .prompt = n, .cached = w.n_cached};
        memcpy(conv + n, w.out, (size_t)w.n_out * sizeof *conv);
        n += w.n_out;
        for (uint32_t k = 0; traffic && turn < o->turns && k < o->traffic; k++) {
            for (uint32_t i = 0; i < o->traffic_len; i++)
                other[i] = rnd_tok(vocab);
            run(bm, id++, other, o->traffic_len, 8, 0, &w);
        }
    }
    vki_batch_manager_destroy(bm, false);
    free(conv);
    free(other);
    return r;
}

static vki_batch_manager *manager(vki_engine *e, const opts *o)
{
    vki_batch_params p = vki_batch_default_params();
    p.session_max_blocks = o->kv_tokens / 16;
    vki_batch_manager *bm = NULL;
    if (vki_batch_manager_create(e, &p, NULL, &bm) != VKI_OK) {
        fprintf(stderr, "session-bench: cannot create the batch manager\n");
        exit(1);
    }
    return bm;
}

/* Turns 1 .. turns-1 in a session, save, a new manager, restore, the last turn; then the last
 * turn again in a new manager without the file. */
static void file_mode(vki_engine *e, const opts *o, uint32_t vocab)
{
    size_t cap = (size_t)o->turns * (o->user + o->answer) + 16;
    int32_t *conv = malloc(cap * sizeof *conv);
    uint32_t n = 0;
    uint64_t id = 1;
    wait1 w;
    rng = 88172645463325252ull;
    vki_batch_manager *bm = manager(e, o);
    for (uint32_t turn = 1; turn < o->turns; turn++) {
        for (uint32_t i = 0; i < o->user; i++)
            conv[n++] = rnd_tok(vocab);
        run(bm, id++, conv, n, o->answer, 77, &w);
        memcpy(conv + n, w.out, (size_t)w.n_out * sizeof *conv);
        n += w.n_out;
    }
    char err[512] = "";
    vki_session_file_info sv = {0}, rs = {0};
    if (vki_batch_session_save(bm, 77, o->file, &sv, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "session-bench: save: %s\n", err);
        exit(1);
    }
    vki_batch_manager_destroy(bm, false);
    bm = manager(e, o);
    if (vki_batch_session_restore(bm, 77, o->file, &rs, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "session-bench: restore: %s\n", err);
        exit(1);
    }
    for (uint32_t i = 0; i < o->user; i++)
        conv[n++] = rnd_tok(vocab);
    double ttft = run(bm, id++, conv, n, o->answer, 77, &w);
    uint32_t cached = w.n_cached;
    vki_batch_manager_destroy(bm, false);
    bm = manager(e, o);
    double cold = run(bm, id++, conv, n, o->answer, 0, &w);
    vki_batch_manager_destroy(bm, false);
    double mb = (double)sv.bytes / (1024.0 * 1024.0);
    uint64_t kv_bytes = sv.bytes - 136 - 4ull * sv.n_tokens; /* less the header, tokens, checksum */
    printf("\nsession file: %u tokens, KV of %u (%llu bytes a token), %.2f MiB\n\n", sv.n_tokens, sv.n_kv_tokens,
           (unsigned long long)(sv.n_kv_tokens ? kv_bytes / sv.n_kv_tokens : 0), mb);
    printf("| save ms | restore ms | save MiB/s | restore MiB/s | last turn: prompt | from the file | computed | "
           "TTFT ms | without the file: TTFT ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    printf("| %.1f | %.1f | %.0f | %.0f | %u | %u | %u | %.1f | %.1f |\n", sv.ms, rs.ms, mb / (sv.ms / 1e3),
           mb / (rs.ms / 1e3), n, cached, n - cached, ttft, cold);
    free(conv);
}

static uint32_t u32_arg(const char *v) { return (uint32_t)strtoul(v, NULL, 10); }

int main(int argc, char **argv)
{
    opts o = {.turns = 5, .user = 360, .answer = 40, .traffic = 2, .traffic_len = 800, .kv_tokens = 3072};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--file-only")) {
            o.file_only = true;
            i--;
        } else if (!strcmp(a, "--file")) {
            o.file = v;
        } else if (!strcmp(a, "-m"))
            o.model = v;
        else if (!strcmp(a, "--turns"))
            o.turns = u32_arg(v);
        else if (!strcmp(a, "--user"))
            o.user = u32_arg(v);
        else if (!strcmp(a, "--answer"))
            o.answer = u32_arg(v) > 256 ? 256 : u32_arg(v);
        else if (!strcmp(a, "--traffic"))
            o.traffic = u32_arg(v);
        else if (!strcmp(a, "--traffic-len"))
            o.traffic_len = u32_arg(v);
        else if (!strcmp(a, "--kv-tokens"))
            o.kv_tokens = u32_arg(v);
    }
    if (!o.model || !o.turns || !o.user || !o.answer || !o.traffic_len || (o.file_only && !o.file)) {
        fprintf(stderr, "usage: session-bench -m MODEL.gguf [--turns 5] [--user 360] [--answer 40] [--traffic 2] "
                "[--traffic-len 800] [--kv-tokens 3072] [--file PATH [--file-only]]\n");
        return 2;
    }
    vki_engine_params ep = vki_engine_default_params();
    ep.kv_tokens = o.kv_tokens;
    ep.max_ctx = 4096;
    ep.max_seqs = 8;
    vki_engine *e = NULL;
    char err[512] = "";
    if (vki_engine_create(o.model, &ep, &e, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "session-bench: %s: %s\n", o.model, err);
        return 1;
    }
    vki_model_info mi;
    vki_engine_info(e, &mi);
    uint32_t vocab = mi.n_vocab;
    static const struct {
        const char *name;
        bool reuse, session, traffic;
    } MODES[] = {{"no prefix reuse", false, false, true},
                 {"prefix cache, traffic between turns", true, false, true},
                 {"session (pinned KV), traffic between turns", true, true, true},
                 {"prefix cache, no traffic (best case)", true, false, false}};
    { /* warm-up: pipelines and allocations of prefill and decode */
        vki_batch_manager *bm = NULL;
        int32_t warm[64];
        for (uint32_t i = 0; i < 64; i++)
            warm[i] = rnd_tok(vocab);
        wait1 w;
        if (vki_batch_manager_create(e, NULL, NULL, &bm) == VKI_OK) {
            run(bm, 1, warm, 64, 4, 0, &w);
            vki_batch_manager_destroy(bm, false);
        }
    }
    printf("model %s (%s, %u layers, d %u) on %s; KV pool %u tokens; turn %u of a conversation, "
           "%u-token user messages, %u-token answers, %u requests of %u tokens between turns\n\n",
           mi.name, mi.arch, mi.n_layer, mi.d_model, mi.device, o.kv_tokens, o.turns, o.user, o.answer,
           o.traffic, o.traffic_len);
    if (!o.file_only)
        printf("| mode | prompt tokens | from cache | computed | TTFT ms |\n|---|---:|---:|---:|---:|\n");
    for (size_t m = 0; !o.file_only && m < sizeof MODES / sizeof MODES[0]; m++) {
        result r = conversation(e, &o, MODES[m].reuse, MODES[m].session, MODES[m].traffic, vocab);
        printf("| %s | %u | %u | %u | %.1f |\n", MODES[m].name, r.prompt, r.cached, r.prompt - r.cached,
               r.ttft_ms);
        fflush(stdout);
    }
    if (o.file)
        file_mode(e, &o, vocab);
    vki_engine_destroy(e);
    return 0;
}
