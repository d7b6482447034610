/* The server's request parsing on arbitrary bodies: strict JSON (server_json.c), the table of
 * completion / chat fields with their validation (server_req.c), structured output and tools
 * (server_struct.c: grammars, JSON schemas), chat rendering and tokenisation, as a handler runs
 * them (srv_job_from_json) before anything reaches the batch manager. Model facts come from a real
 * vocabulary (../shared/models/vocab/ggml-vocab-llama-spm.gguf, ggml-vocab-gpt-2.gguf) and a small
 * context, so that length limits are reached.
 * Input: byte 0 = bit 0 chat (else completions), bits 1-3 and 6 the chat family, bit 4 the vocabulary,
 * bit 5 (completions) a llama-server /completion body translated first (llama_api.c), bit 7 an
 * Ollama /api/chat (bit 0) or /api/generate body translated first (ollama_api.c), bits 7 and 5
 * an OpenAI Responses body instead (responses_api.c); the rest is the request body.
 * Properties: a refused body gets a 4xx with a message (a 5xx only for out of memory), never a
 * crash; an accepted one is a job the batch manager would take: 1 <= n <= SRV_MAX_N, prompt ids
 * inside the vocabulary, prompt + max_tokens within the context, min_tokens <= max_tokens, finite
 * sampling parameters in range, logit_bias / stop ids inside the vocabulary. */
#include "fuzz.h"

#include <math.h>
#include <string.h>

#include "engine/step.h"
#include "host/server/server.h"

#define N_FAMILIES CHAT_FAMILY_COUNT
static const char *const vocab_files[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"};
#define N_VOCABS (sizeof vocab_files / sizeof vocab_files[0])

/* one server's model facts per (vocabulary, family): what srv_create sets up from an engine */
static srv servers[N_VOCABS][N_FAMILIES];
static vki_tokenizer *toks[N_VOCABS];
static size_t n_toks;

static void free_all(void)
{
    for (size_t v = 0; v < n_toks; v++) {
        for (int f = 0; f < N_FAMILIES; f++) {
            chat_specials_free(servers[v][f].specials);
            chat_template_free(&servers[v][f].chat);
            pthread_mutex_destroy(&servers[v][f].mu);
        }
        vki_tokenizer_free(toks[v]);
    }
}

static void quiet(void *user, vki_log_level level, const char *msg) { (void)user, (void)level, (void)msg; }

static bool setup(srv *s, const vki_tokenizer *t, chat_family f)
{
    char bos[64], eos[64];
    s->p = srv_default_params();
    s->p.log = quiet; /* a harness prints nothing (unknown fields are logged as a warning) */
    s->tok = t;
    s->info.n_vocab = vki_vocab_size(t);
    s->info.n_ctx = 512;
    s->info.page_size = 16;
    s->info.kv_pages = 24; /* 384 tokens: the pool, not the context, limits a default max_tokens */
    snprintf(s->model_id, sizeof s->model_id, "fuzz");
    pthread_mutex_init(&s->mu, NULL);
    chat_token_texts(t, bos, sizeof bos, eos, sizeof eos);
    if (chat_template_init(&s->chat, f, NULL, bos, eos) != VKI_OK)
        return false;
    s->tool_fmt = chat_tools_format(&s->chat, NULL);
    return chat_specials_create(t, &s->specials) == VKI_OK;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    char path[1024], err[256];
    for (size_t i = 0; i < N_VOCABS; i++) {
        snprintf(path, sizeof path, "%s/models/vocab/%s", fuzz_shared_dir(), vocab_files[i]);
        vki_tokenizer *t;
        if (vki_tokenizer_load(path, &t, err, sizeof err) != VKI_OK)
            continue;
        toks[n_toks] = t;
        for (int f = 0; f < N_FAMILIES; f++)
            FUZZ_CHECK(setup(&servers[n_toks][f], t, (chat_family)f));
        n_toks++;
    }
    if (!n_toks)
        fprintf(stderr, "fuzz_request: SKIP: no vocabularies under %s/models/vocab\n", fuzz_shared_dir());
    atexit(free_all);
    return 0;
}

static bool in_vocab(const srv *s, int32_t id) { return id >= 0 && (uint32_t)id < s->info.n_vocab; }

static void check_job(const srv *s, const srv_job *j)
{
    FUZZ_CHECK(j->n >= 1 && j->n <= SRV_MAX_N);
    FUZZ_CHECK(j->n_prompt >= 1 && j->prompt);
    for (uint32_t i = 0; i < j->n_prompt; i++)
        FUZZ_CHECK(in_vocab(s, j->prompt[i]));
    FUZZ_CHECK(j->max_tokens >= 1 && (uint64_t)j->n_prompt + j->max_tokens <= s->info.n_ctx);
    FUZZ_CHECK(j->min_tokens <= j->max_tokens);
    FUZZ_CHECK(j->n_stops <= SRV_MAX_STOPS);
    for (uint32_t i = 0; i < j->n_stop_ids; i++)
        FUZZ_CHECK(in_vocab(s, j->stop_ids[i]));
    const vki_sampling_params *p = &j->sampling;
    FUZZ_CHECK(isfinite(p->temperature) && p->temperature >= 0);
    FUZZ_CHECK(isfinite(p->top_p) && p->top_p > 0 && p->top_p <= 1);
    FUZZ_CHECK(isfinite(p->min_p) && p->min_p >= 0 && p->min_p <= 1);
    FUZZ_CHECK(isfinite(p->presence_penalty) && isfinite(p->frequency_penalty) && isfinite(p->repetition_penalty));
    FUZZ_CHECK(p->top_logprobs <= VKI_MAX_TOP_LOGPROBS);
    for (uint32_t i = 0; i < p->n_logit_bias; i++)
        FUZZ_CHECK(in_vocab(s, p->logit_bias[i].token) && !isnan(p->logit_bias[i].bias));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!n_toks || size < 1)
        return 0;
    srv *s = &servers[(data[0] >> 4 & 1) % n_toks][((data[0] >> 1 & 7) | (data[0] >> 3 & 8)) % N_FAMILIES];
    bool chat = data[0] & 1, responses = (data[0] & 160) == 160, ollama = !responses && (data[0] & 128);
    bool llama = !(data[0] & 128) && !chat && (data[0] & 32);
    srv_error e = {0};
    srv_job *j = NULL;
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    char *translated = NULL;
    bool load = false;
    if (llama)
        translated = srv_llama_body(body, n, &e);
    else if (ollama)
        translated = srv_ollama_body(body, n, chat, s->chat.family == CHAT_HARMONY, &chat, &load, &e);
    else if (responses) { /* always a chat completion */
        translated = srv_responses_body(body, n, &e);
        chat = true;
    }
    if (llama || ollama || responses) {
        body = translated;
        n = translated ? strlen(translated) : 0;
    }
    if (load) {
        FUZZ_CHECK(!translated); /* a preload: answered without a job */
    } else if ((llama || ollama || responses) && !translated) {
        FUZZ_CHECK(e.msg[0] && e.type);
        FUZZ_CHECK((e.http >= 400 && e.http < 500) || (e.http == 500 && strstr(e.msg, "memory")));
    } else if (srv_job_from_json(s, chat, body, n, &j, &e)) {
        FUZZ_CHECK(j != NULL);
        check_job(s, j);
        srv_job_release(j);
    } else {
        FUZZ_CHECK(j == NULL);
        FUZZ_CHECK(e.msg[0] && e.type);
        FUZZ_CHECK((e.http >= 400 && e.http < 500) || (e.http == 500 && strstr(e.msg, "memory")));
    }
    cJSON_free(translated);
    return 0;
}
