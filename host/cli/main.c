/* The `vkinfer` command-line program: subcommands dispatch to host/cli_*.c. */
#include <stdio.h>
#include <string.h>

#include "host/cli/cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vkinfer <command> [options]\n"
            "\n"
            "commands:\n"
            "  info [--json]        list Vulkan devices with their features and limits\n"
            "  generate             generate text from a prompt (streamed to stdout)\n"
            "  chat                 an interactive conversation in the model's chat template\n"
            "  demo                 a batch of requests through continuous batching, tick by tick\n"
            "  bench                throughput / latency of the batch manager (table or --json)\n"
            "  bench-model          llama-bench-style pp/tg tokens/s, bandwidth vs the copy kernel\n"
            "  serve                OpenAI-compatible HTTP server (completions, chat, SSE, metrics)\n"
            "\n"
            "Run `vkinfer <command> --help` for a command's options; `vkinfer --version` (-V) for the version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        printf("vkinfer %s\n", VKI_PROGRAM_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "info"))
        return vki_cli_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate"))
        return vki_cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "demo"))
        return vki_cli_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench"))
        return vki_cli_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench-model"))
        return vki_cli_bench_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve"))
        return vki_cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat"))
        return vki_cli_chat(argc - 1, argv + 1);
    fprintf(stderr, "vkinfer: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
