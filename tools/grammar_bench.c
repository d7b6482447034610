/* grammar-bench: what constrained decoding costs.
 *
 *   grammar-bench host --vocab FILE.gguf [--schema FILE.json] [--requests N] [--tokens N] [--seed S]
 *       Host cost per constrained token with a real vocabulary (a vocabulary-only GGUF or a
 *       model): exactly the batch manager's per-token work (gram_req_mask before a step: the
 *       allowed-token bitset for the next token, copied into the request's buffer; then
 *       gram_req_accept with the sampled token), for N requests that share one compiled grammar,
 *       each generating up to T tokens chosen uniformly among the allowed ones (a sampler that
 *       ends where it may with probability 1/4). Prints the one-off costs (vocabulary trie,
 *       grammar compile) and the per-token cost of the first request (cold caches) and of the
 *       others.
 *
 *   grammar-bench batch -m MODEL.gguf [--schema FILE.json] [--requests N] [--tokens N] [engine options]
 *       Batch throughput through the batch manager: N requests (all at once) constrained by the
 *       schema, then the same N unconstrained, same prompts and output budgets (ignore_eos off
 *       for the constrained ones: they end where the grammar ends). Prints output tokens/s of
 *       both and their ratio.
 *
 * The default schema is a nested object (strings, an integer, an array of strings, a nested
 * object with a nullable field, an enum, extra number-valued keys). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

#include "engine/rng.h"
#include "host/batch/batch.h"
#include "host/grammar/grammar.h"

static const char DEFAULT_SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 40},"
    "\"age\": {\"type\": \"integer\"},"
    "\"email\": {\"type\": [\"string\", \"null\"]},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 8},"
    "\"address\": {\"type\": \"object\", \"properties\": {"
    "    \"street\": {\"type\": \"string\"}, \"city\": {\"type\": \"string\"},"
    "    \"zip\": {\"type\": [\"string\", \"null\"]},"
    "    \"geo\": {\"type\": \"object\", \"properties\": {\"lat\": {\"type\": \"number\"}, \"lon\": {\"type\": \"number\"}},"
    "             \"required\": [\"lat\", \"lon\"]}},"
    "  \"required\": [\"city\", \"geo\"]},"
    "\"role\": {\"enum\": [\"admin\", \"user\", \"guest\"]},"
    "\"active\": {\"type\": \"boolean\"}},"
    "\"required\": [\"name\", \"age\", \"address\", \"role\"],"
    "\"additionalProperties\": {\"type\": \"number\"}}";

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* CPU time of this thread: on a shared machine a preempted call shows in wall time, not here. */
static double cpu_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct opts {
    const char *vocab, *schema_path, *model;
    uint32_t requests, tokens;
    uint64_t seed;
    bool no_overlap;   /* batch: the engine waits for every step (no lookahead steps) */
} opts;

/* Per-token costs of one request, appended to t[*n]. */
static int run_request(gram_automaton *a, const int32_t *ends, uint32_t n_end, const opts *o, uint64_t *rng,
                       double *t, size_t *n, uint32_t *produced, double *cpu)
{
    gram_req r;
    char err[256];
    if (gram_req_init(&r, a, ends, n_end, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "grammar-bench: %s\n", err);
        return 1;
    }
    uint32_t k;
    int rc = 0;
    for (k = 0; k < o->tokens; k++) {
        double t0 = now_us(), c0 = cpu_us();
        uint32_t allowed;
        if (gram_req_mask(&r, &allowed, err, sizeof err) != VKI_OK) {
            fprintf(stderr, "grammar-bench: %s\n", err);
            rc = 1;
            break;
        }
        double t1 = now_us(), c1 = cpu_us();
        if (!allowed)
            break;
        /* the "sampler": an end token with probability 1/4 where allowed, else a uniform pick */
        int32_t tok = -1;
        bool can_end = gram_can_end(a, r.q);
        if (can_end && (vki_splitmix64(rng) % 4 == 0 || gram_req_complete(&r)))
            tok = ends[0];
        uint32_t pick = (uint32_t)(vki_splitmix64(rng) % allowed);
        for (uint32_t w = 0; tok < 0; w++)
            for (uint32_t bits = r.mask[w]; bits && tok < 0; bits &= bits - 1)
                if (!pick--)
                    tok = (int32_t)(w * 32 + (uint32_t)__builtin_ctz(bits));
        double t2 = now_us(), c2 = cpu_us();
        bool ended;
        if (gram_req_accept(&r, tok, &ended, err, sizeof err) != VKI_OK) {
            fprintf(stderr, "grammar-bench: %s\n", err);
            rc = 1;
            break;
        }
        t[(*n)++] = (t1 - t0) + (now_us() - t2);
        *cpu += (c1 - c0) + (cpu_us() - c2);
        if (ended)
            break;
    }
    *produced = k;
    gram_req_free(&r);
    return rc;
}

static void report(const char *label, double *t, size_t n, double cpu)
{
    if (!n)
        return;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += t[i];
    qsort(t, n, sizeof *t, cmp_double);
    printf("%-22s %6zu tokens  wall: mean %7.2f us  p50 %6.2f  p99 %8.2f  max %9.1f   CPU: mean %7.2f us\n", label, n,
           sum / (double)n, t[n / 2], t[n * 99 / 100], t[n - 1], cpu / (double)n);
}

static int host_mode(const opts *o)
{
    vki_tokenizer *tok;
    char err[512];
    if (!o->vocab) {
        fprintf(stderr, "grammar-bench host: --vocab FILE.gguf is required\n");
        return 2;
    }
    if (vki_tokenizer_load(o->vocab, &tok, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "grammar-bench: %s\n", err);
        return 1;
    }
    char *schema = o->schema_path ? read_file(o->schema_path) : NULL;
    if (o->schema_path && !schema) {
        fprintf(stderr, "grammar-bench: cannot read %s\n", o->schema_path);
        return 1;
    }
    double t0 = now_us();
    gram_vocab *v;
    if (gram_vocab_from_tokenizer(tok, &v) != VKI_OK) {
        fprintf(stderr, "grammar-bench: cannot build the vocabulary trie\n");
        return 1;
    }
    double t1 = now_us();
    strbuf gb = {0};
    const char *sc = schema ? schema : DEFAULT_SCHEMA;
    gram_grammar *g;
    gram_automaton *a;
    if (gram_schema_to_gbnf(sc, strlen(sc), &gb, err, sizeof err) != VKI_OK ||
        gram_parse(gb.p, gb.len, &g, err, sizeof err) != VKI_OK || gram_automaton_create(g, v, NULL, &a) != VKI_OK) {
        fprintf(stderr, "grammar-bench: %s\n", err);
        return 1;
    }
    double t2 = now_us();
    int32_t ends[8];
    uint32_t n_end = 0;
    for (uint32_t id = 0; id < vki_vocab_size(tok) && n_end < 8; id++)
        if (vki_token_is_eog(tok, id))
            ends[n_end++] = (int32_t)id;
    if (!n_end)
        ends[n_end++] = 0;
    printf("vocabulary %s: %u tokens, %u trie nodes, trie built in %.1f ms\n", o->vocab, vki_vocab_size(tok),
           gram_vocab_nodes(v), (t1 - t0) / 1e3);
    printf("grammar: %zu bytes of GBNF, %u rules, compiled in %.2f ms\n", gb.len, gram_grammar_rules(g), (t2 - t1) / 1e3);
    double *first = malloc(o->tokens * sizeof *first), *rest = malloc((size_t)o->tokens * o->requests * sizeof *rest);
    size_t n_first = 0, n_rest = 0;
    uint64_t rng = o->seed;
    uint32_t produced, total = 0;
    double cpu_first = 0, cpu_rest = 0;
    int rc = 0;
    for (uint32_t i = 0; i < o->requests && !rc; i++) {
        rc = run_request(a, ends, n_end, o, &rng, i ? rest : first, i ? &n_rest : &n_first, &produced,
                         i ? &cpu_rest : &cpu_first);
        total += produced;
    }
    gram_stats st;
    gram_automaton_stats(a, &st);
    report("first request (cold)", first, n_first, cpu_first);
    report("other requests (warm)", rest, n_rest, cpu_rest);
    printf("all %zu constrained tokens: CPU mean %.2f us per token\n", n_first + n_rest,
           (cpu_first + cpu_rest) / (double)(n_first + n_rest));
    printf("caches: %u frames, %u sets, %u states, %u masks, %u local walks, %.1f MiB\n", st.frames, st.sets,
           st.states, st.masks, st.positions, (double)st.bytes / 1048576.0);
    printf("trie nodes visited: %llu (local walks %llu, context walks %llu, partial-character walks %llu)\n",
           (unsigned long long)st.walk_nodes, (unsigned long long)st.walk_local, (unsigned long long)st.walk_context,
           (unsigned long long)st.walk_partial);
    gram_automaton_free(a);
    gram_vocab_free(v);
    vki_tokenizer_free(tok);
    strbuf_free(&gb);
    free(schema);
    free(first);
    free(rest);
    return rc;
}

/* ---- batch mode ------------------------------------------------------------------------------- */

typedef struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t finals, errors;
    uint64_t tokens;
    uint32_t by_finish[6];
} run;

static void on_resp(void *user, const vki_response *r)
{
    run *x = user;
    pthread_mutex_lock(&x->mu);
    x->tokens += r->n_tokens;
    if (r->final) {
        x->finals++;
        x->by_finish[r->finish]++;
        if (r->finish == VKI_FINISH_ERROR && !x->errors++)
            fprintf(stderr, "grammar-bench: request %llu: %s\n", (unsigned long long)r->id, r->error);
        pthread_cond_signal(&x->cv);
    }
    pthread_mutex_unlock(&x->mu);
}

/* N requests at once; returns output tokens/s, *tok the tokens. */
static double batch_run(vki_engine *e, const opts *o, const int32_t *prompt, uint32_t n_prompt, const char *schema,
                        uint64_t *tok, double *gram_us_per_tok)
{
    vki_batch_params bp = vki_batch_default_params();
    bp.stats = false;
    vki_batch_manager *bm;
    if (vki_batch_manager_create(e, &bp, NULL, &bm) != VKI_OK)
        return -1;
    run x = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    double t0 = now_us();
    for (uint32_t i = 0; i < o->requests; i++) {
        vki_request r = {.id = i + 1, .prompt = prompt, .n_prompt = n_prompt, .max_new_tokens = o->tokens,
                         .sampling = vki_sampling_default_params(), .ignore_eos = !schema};
        r.sampling.has_seed = true;
        r.sampling.seed = o->seed + i;
        if (schema)
            r.constraint = (vki_constraint){VKI_CONSTRAINT_JSON_SCHEMA, schema, strlen(schema)};
        char err[256];
        if (vki_batch_submit(bm, &r, on_resp, &x, err, sizeof err) != VKI_OK) {
            fprintf(stderr, "grammar-bench: submit: %s\n", err);
            vki_batch_manager_destroy(bm, true);
            return -1;
        }
    }
    pthread_mutex_lock(&x.mu);
    while (x.finals < o->requests)
        pthread_cond_wait(&x.cv, &x.mu);
    pthread_mutex_unlock(&x.mu);
    double secs = (now_us() - t0) / 1e6;
    *gram_us_per_tok = bm->gram_tokens ? bm->gram_us / (double)bm->gram_tokens : 0; /* the worker is idle now */
    uint64_t ahead = bm->n_ahead, ticks = bm->iteration;
    vki_batch_manager_destroy(bm, false);
    *tok = x.tokens;
    printf("  %-13s %3u requests, %6llu output tokens in %6.2f s: %8.1f tokens/s (finish: eos %u, length %u, "
           "stop %u, error %u; %llu of %llu ticks on lookahead steps)\n", schema ? "constrained" : "unconstrained",
           o->requests, (unsigned long long)x.tokens, secs, (double)x.tokens / secs, x.by_finish[VKI_FINISH_EOS],
           x.by_finish[VKI_FINISH_LENGTH], x.by_finish[VKI_FINISH_STOP], x.by_finish[VKI_FINISH_ERROR],
           (unsigned long long)ahead, (unsigned long long)ticks);
    return x.errors ? -1 : (double)x.tokens / secs;
}

static int batch_mode(const opts *o)
{
    if (!o->model) {
        fprintf(stderr, "grammar-bench batch: -m MODEL.gguf is required\n");
        return 2;
    }
    char *schema = o->schema_path ? read_file(o->schema_path) : NULL;
    vki_engine_params ep = vki_engine_default_params();
    ep.max_seqs = o->requests;
    ep.kv_tokens = (uint64_t)o->requests * (o->tokens + 64);
    ep.no_overlap = o->no_overlap;
    vki_engine *e;
    char err[512];
    if (vki_engine_create(o->model, &ep, &e, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "grammar-bench: %s\n", err);
        return 1;
    }
    vki_model_info info;
    vki_engine_info(e, &info);
    printf("model %s: vocabulary %u, %u layers, d_model %u, on %s\n", info.name, info.n_vocab, info.n_layer,
           info.d_model, info.device);
    int32_t prompt[64];
    size_t np = 0;
    static const char text[] = "Here is the record as JSON:";
    vki_tokenize(vki_engine_tokenizer(e), text, sizeof text - 1, true, false, prompt, 64, &np);
    uint64_t t_un, t_c;
    double g_un, g_c;
    double un = batch_run(e, o, prompt, (uint32_t)np, NULL, &t_un, &g_un);
    double co = batch_run(e, o, prompt, (uint32_t)np, schema ? schema : DEFAULT_SCHEMA, &t_c, &g_c);
    if (un > 0 && co > 0)
        printf("constrained / unconstrained throughput: %.2f; worker time in grammar work: %.1f us per constrained "
               "token (masks, state advance, vocabulary trie and compile included)\n", co / un, g_c);
    vki_engine_destroy(e);
    free(schema);
    return un > 0 && co > 0 ? 0 : 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: grammar-bench host --vocab FILE.gguf [--schema FILE.json] [--requests N] [--tokens N] [--seed S]\n"
               "       grammar-bench batch -m MODEL.gguf [--schema FILE.json] [--requests N] [--tokens N] [--seed S]\n"
               "                           [--no-overlap]   (wait for every step: no lookahead steps)\n");
}

int main(int argc, char **argv)
{
    opts o = {.requests = 32, .tokens = 256, .seed = 1};
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines show as they come, also through a pipe */
    if (argc < 2 || (strcmp(argv[1], "host") && strcmp(argv[1], "batch"))) {
        usage(stderr);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-overlap")) {
            o.no_overlap = true;
            continue;
        }
        if (!val) {
            usage(stderr);
            return 2;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o.model = val;
        else if (!strcmp(a, "--vocab"))
            o.vocab = val;
        else if (!strcmp(a, "--schema"))
            o.schema_path = val;
        else if (!strcmp(a, "--requests"))
            o.requests = (uint32_t)strtoul(val, NULL, 0);
        else if (!strcmp(a, "--tokens"))
            o.tokens = (uint32_t)strtoul(val, NULL, 0);
        else if (!strcmp(a, "--seed"))
            o.seed = strtoull(val, NULL, 0);
        else {
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!o.requests || !o.tokens) {
        fprintf(stderr, "grammar-bench: --requests and --tokens must be >= 1\n");
        return 2;
    }
    return strcmp(argv[1], "host") ? batch_mode(&o) : host_mode(&o);
}
