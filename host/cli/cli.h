/* Subcommands of the vkinfer program. Each takes (argc, argv) with argv[0] = the command name
 * and returns the process exit code (0 ok, 1 failure, 2 usage error). */
#ifndef VKI_HOST_CLI_H
#define VKI_HOST_CLI_H

int vki_cli_info(int argc, char **argv);
int vki_cli_generate(int argc, char **argv);
int vki_cli_demo(int argc, char **argv);
int vki_cli_bench(int argc, char **argv);
int vki_cli_bench_model(int argc, char **argv);
int vki_cli_serve(int argc, char **argv);
int vki_cli_chat(int argc, char **argv);

#endif
