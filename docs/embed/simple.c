/* The simple API: load a model, stream the answer to a prompt, then to a chat, to stdout.
 *   cc simple.c $(pkg-config --cflags --libs vkinfer) -o simple && ./simple model.gguf [prompt] */
#include <stdio.h>

#include <vkinfer.h>

/* Each piece of generated text, as it comes (on the batch manager's thread). */
static bool print_text(void *user, const char *text, size_t len)
{
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true; /* false would stop the generation */
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [PROMPT]\n", argv[0]);
        return 2;
    }
    const char *prompt = argc > 2 ? argv[2] : "Once upon a time";
    char err[512];
    vki_engine *engine;
    vki_engine_params ep = vki_engine_default_params();
    ep.kv_tokens = 4096; /* a small KV cache is enough here (default: 80% of free device memory) */
    if (vki_engine_create(argv[1], &ep, &engine, err, sizeof err) != VKI_OK) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], err);
        return 1;
    }
    vki_batch_manager *bm;
    if (vki_batch_manager_create(engine, NULL, NULL, &bm) != VKI_OK)
        return 1;

    vki_generate_params gp = vki_generate_default_params(); /* greedy, 128 tokens */
    gp.max_tokens = 32;
    gp.on_text = print_text;
    const char *stops[] = {"\n"}; /* end at the first line break (not printed) */
    gp.stops = stops;
    gp.n_stops = 1;
    vki_generate_result res;
    printf("%s", prompt);
    vki_status st = vki_generate(bm, prompt, &gp, &res, err, sizeof err);
    printf("\n");
    if (st != VKI_OK)
        fprintf(stderr, "generate: %s: %s\n", vki_status_str(st), err);

    /* A conversation, rendered with the model's own chat template. */
    vki_chat_message chat[] = {{VKI_CHAT_USER, "Tell me a story about a dog."}};
    printf("[%s template] ", vki_chat_template_name(vki_engine_chat_template(engine)));
    if (st == VKI_OK && (st = vki_generate_chat(bm, NULL, chat, 1, &gp, &res, err, sizeof err)) != VKI_OK)
        fprintf(stderr, "chat: %s: %s\n", vki_status_str(st), err);
    printf("\n");
    fprintf(stderr, "vkinfer %s: last answer %u tokens, first after %.0f ms\n", vki_version(), res.n_generated,
            res.first_token_ms);

    vki_batch_manager_destroy(bm, false);
    vki_engine_destroy(engine);
    return st == VKI_OK ? 0 : 1;
}
