/* The full API: load a model, run two prompts through the batch manager's push interface at
 * once (token ids in, a response callback per token on the worker thread), print the text.
 * simple.c does the common case with vki_generate in a few calls.
 *   cc embed.c $(pkg-config --cflags --libs vkinfer) -o embed && ./embed model.gguf */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <vkinfer.h>

typedef struct job {
    const vki_tokenizer *tok;
    vki_detok *detok;       /* streaming detokeniser: never splits a UTF-8 character */
    char text[4096];
    size_t len;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} job;

/* Runs on the batch manager's worker thread: one call per new token, the last with final set. */
static void on_response(void *user, const vki_response *r)
{
    job *j = user;
    for (uint32_t i = 0; i < r->n_tokens; i++) {
        const char *t;
        size_t n;
        if (vki_detok_push(j->detok, r->tokens[i], &t, &n) == VKI_OK && j->len + n < sizeof j->text) {
            memcpy(j->text + j->len, t, n);
            j->len += n;
        }
    }
    if (r->final) {
        pthread_mutex_lock(&j->mu);
        j->done = 1;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    vki_engine_params ep = vki_engine_default_params();
    ep.kv_tokens = 4096; /* a small KV cache is enough here */
    vki_engine *engine;
    char err[512];
    vki_status st = vki_engine_create(argv[1], &ep, &engine, err, sizeof err);
    if (st != VKI_OK) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], err);
        return 1;
    }
    vki_batch_params bp = vki_batch_default_params();
    vki_batch_manager *bm;
    if (vki_batch_manager_create(engine, &bp, NULL, &bm) != VKI_OK)
        return 1;

    const char *prompts[2] = {"Once upon a time", "The little dog"};
    job jobs[2];
    for (int i = 0; i < 2; i++) {
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        pthread_mutex_init(&j->mu, NULL);
        pthread_cond_init(&j->cv, NULL);
        j->tok = vki_engine_tokenizer(engine);
        vki_detok_create(j->tok, 0, &j->detok);
        int32_t ids[256];
        size_t n = 0;
        vki_tokenize(j->tok, prompts[i], strlen(prompts[i]), true, false, ids, 256, &n);
        vki_request req = {.id = (uint64_t)i + 1, .prompt = ids, .n_prompt = (uint32_t)n, .max_new_tokens = 32,
                           .sampling = vki_sampling_default_params() /* greedy */, .streaming = true};
        st = vki_batch_submit(bm, &req, on_response, j, err, sizeof err);
        if (st != VKI_OK) {
            fprintf(stderr, "submit: %s: %s\n", vki_status_str(st), err);
            return 1;
        }
    }
    for (int i = 0; i < 2; i++) { /* both run in the same steps; wait for each */
        job *j = &jobs[i];
        pthread_mutex_lock(&j->mu);
        while (!j->done)
            pthread_cond_wait(&j->cv, &j->mu);
        pthread_mutex_unlock(&j->mu);
        printf("%s%.*s\n", prompts[i], (int)j->len, j->text);
        vki_detok_free(j->detok);
    }
    vki_batch_manager_destroy(bm, false);
    vki_engine_destroy(engine);
    return 0;
}
