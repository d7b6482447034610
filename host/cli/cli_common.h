/* Options every model-running subcommand shares (model, device, KV cache, limits), and small
 * helpers for the CLI programs. */
#ifndef VKI_HOST_CLI_COMMON_H
#define VKI_HOST_CLI_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "host/chat/chat.h"
#include "vkinfer.h"

typedef struct cli_engine_opts {
    const char *model;              /* -m; NULL when not given */
    vki_engine_params p;
    const char *device_name;
    int verbose;
    bool progress;                  /* draw the loading bar (on a terminal); --no-progress */
    double progress_t0;             /* when loading started, for the bar's rate */
    bool max_seqs_set;              /* --max-seqs given (generate / chat size for one sequence) */
    bool no_warmup;                 /* --no-warmup */
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
/* Creates the engine (progress bar on a terminal) and prints one line about it to stderr:
 * checks --device against the devices that exist first (listing them when it names none), warns
 * when --ctx exceeds the trained context, then runs a few warm-up steps so that a device that
 * compiles pipelines on first use (lavapipe) does it now, with a progress line, rather than
 * during the first request. Returns NULL after printing the reason. */
vki_engine *cli_open_engine(cli_engine_opts *o);
/* The engine's log messages to stderr ("vkinfer warning: ..."): the device's log callback. */
void cli_log_stderr(void *user, vki_log_level lvl, const char *msg);
/* With --profile: prints the engine's GPU time summary (top ops) to stderr. */
void cli_print_profile(const cli_engine_opts *o, const vki_engine *e);

/* The model's chat template (or family, when not NULL) and its control tokens. */
typedef struct cli_chat {
    chat_template t;
    chat_specials *sp;
    bool known;               /* recognised (else the plain "role: content" fallback) */
} cli_chat;
bool cli_chat_open(const char *model_path, const char *family, const vki_tokenizer *tok, cli_chat *c);
void cli_chat_close(cli_chat *c);
/* Renders m[0..n) with the generation prompt and tokenises it (*ids malloc'd). keep: when not
 * NULL, receives the rendered prompt (free it with chat_prompt_free). false: message printed. */
bool cli_chat_tokens(cli_chat *c, const vki_tokenizer *tok, const chat_msg *m, size_t n, chat_prompt *keep,
                     int32_t **ids, size_t *n_ids);

/* Sampling options (--temp, --top-k, --top-p, --min-p, --repeat-penalty, --presence-penalty,
 * --frequency-penalty, --penalty-window, --seed): the *_opt contract (1 / 0 / -1). */
int cli_sampling_opt(const char *cmd, int argc, char **argv, int *i, vki_sampling_params *s);
void cli_sampling_help(FILE *f);

/* The output constraint of generate and chat: --grammar GBNF, --grammar-file F, --json-schema
 * JSON, --json-schema-file F (at most one). Checked when read (vki_constraint_check), so a bad
 * grammar is reported before the model loads. */
typedef struct cli_constraint {
    vki_constraint c;               /* type NONE when no option was given; text is `own` */
    char *own;                      /* the grammar or schema text (malloc'd) */
} cli_constraint;
/* The *_opt contract (1 / 0 / -1, message printed). */
int cli_constraint_opt(const char *cmd, int argc, char **argv, int *i, cli_constraint *c);
void cli_constraint_help(FILE *f);
void cli_constraint_free(cli_constraint *c);

/* Interprets the usual backslash escapes of a command-line string in place: \n \t \r \\ \" \'
 * \a \b \f \v \e, \xHH and \uXXXX (UTF-8); an unknown escape stays as written. false (message
 * printed) for \x00 / \u0000 or a malformed \x / \u. */
bool cli_unescape(const char *cmd, const char *opt, char *s);

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
/* "vkinfer ARG..." (arguments with a space quoted), truncated to cap: the JSON's "command". */
void cli_record_command(char *buf, size_t cap, int argc, char **argv);

/* When no -m was given: the path of a small synthetic model (written on first use into
 * $XDG_CACHE_HOME/vkinfer or ~/.cache/vkinfer, else /tmp), so the demo and the benchmark run
 * anywhere. preset: a synth preset name ("small"). Returns false after printing why. */
bool cli_default_model(const char *preset, char *path, size_t n);

#endif
