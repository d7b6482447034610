/* Options every model-running subcommand shares (model, device, KV cache, limits), and small
 * helpers for the CLI programs. */
#ifndef VKI_HOST_CLI_COMMON_H
#define VKI_HOST_CLI_COMMON_H

#include <stdio.h>

#include "vkinfer.h"

typedef struct cli_engine_opts {
    const char *model;              /* -m; NULL when not given */
    vki_engine_params p;
    const char *device_name;
    int verbose;
    bool progress;                  /* draw the loading bar (on a terminal); --no-progress */
    double progress_t0;             /* when loading started, for the bar's rate */
} cli_engine_opts;

/* Defaults, with the device from $VKI_DEVICE when set (as --device takes it). */
void cli_engine_opts_init(cli_engine_opts *o);
/* A device given as an index ("1") or a case-insensitive name substring ("H100"), as --device
 * and $VKI_DEVICE take it, into p (the other choice is cleared). */
void cli_device_choice(const char *spec, vki_device_params *p);
/* Tries argv[*i] (and its value) as a shared option. 1: consumed (advances *i past a value),
 * 0: not a shared option, -1: a bad value (message printed). */
int cli_engine_opt(int argc, char **argv, int *i, cli_engine_opts *o);
void cli_engine_opts_help(FILE *f);
/* Creates the engine (progress bar on a terminal, log messages to stderr) and prints one line
 * about it to stderr. Returns NULL after printing the reason. */
vki_engine *cli_open_engine(cli_engine_opts *o);
/* With --profile: prints the engine's GPU time summary (top ops) to stderr. */
void cli_print_profile(const cli_engine_opts *o, const vki_engine *e);

/* Options that take a value: looks argv[*i] up in names[n_names]. 1: found; *which = its index
 * (which may be NULL), *value = the next argument, *i advanced past it. 0: not in the table.
 * -1: in the table but last on the line ("vkinfer <cmd>: <opt> needs a value" printed). The
 * 1 / 0 / -1 is the contract of every *_opt parser of the CLI. */
int cli_value_opt(const char *cmd, int argc, char **argv, int *i, const char *const *names, size_t n_names,
                  size_t *which, const char **value);

/* Parses a number option value; prints "vkinfer <cmd>: <opt>: ..." and returns false if bad. */
bool cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
bool cli_parse_f32(const char *cmd, const char *opt, const char *s, float lo, float hi, float *out);

double cli_now_s(void); /* monotonic seconds */

/* When no -m was given: the path of a small synthetic model (written on first use into
 * $XDG_CACHE_HOME/vkinfer or ~/.cache/vkinfer, else /tmp), so the demo and the benchmark run
 * anywhere. preset: a synth preset name ("small"). Returns false after printing why. */
bool cli_default_model(const char *preset, char *path, size_t n);

#endif
