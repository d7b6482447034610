/* Tool calling below the HTTP layer: OpenAI `tools` rendered into the prompt the way each
 * template family does, a grammar that forces a valid call (tool_choice "required" or a named
 * function), and an incremental parser that turns generated text into OpenAI-shaped tool calls
 * (content deltas, then per call: id + name, argument fragments, end), so a server can stream
 * `delta.tool_calls` chunks as OpenAI does.
 *
 * Formats (chat_tools_format picks one from the template text):
 *   HERMES   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, several in a row:
 *            Qwen2.5 / Qwen3 / Hermes ChatML templates, rendered exactly; every other family
 *            without native tool support gets the same instructions in its system message and
 *            tool results as user messages in <tool_response> tags (our fallback)
 *   LLAMA3   {"name": "f", "parameters": {...}}: Llama 3.1+ JSON tool calls (tools listed in
 *            the first user message, results in `ipython` turns), one call per turn
 *   MISTRAL  [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]: Mistral v0.3+ ([TOOL_CALLS]
 *            is a control token: with a forced call the caller appends chat_tools_grammar's
 *            `prefix` to the prompt and the grammar starts after it; ids are 9 alphanumerics)
 *   HARMONY  gpt-oss: the tools as a TypeScript namespace in the developer message, a call as a
 *            commentary message to functions.f ending "<|call|>", one per turn, its result a
 *            message from functions.f; the parser reads calls in the spelling chat_harmony
 *            (chat_harmony.h) writes them into the content: "<|start|>assistant to=functions.f
 *            <|channel|>commentary json<|message|>{...}<|call|>" (no space before <|channel|>)
 *
 * The tools array is the request's JSON text (validated here: names [a-zA-Z0-9_-]{1,64},
 * distinct; parameters an object schema). tool_choice "none" is the caller's: render without
 * tools. No Vulkan, no global state. */
#ifndef VKI_HOST_CHAT_TOOLS_H
#define VKI_HOST_CHAT_TOOLS_H

#include "host/chat/chat.h"

typedef enum chat_tool_format {
    CHAT_TOOLS_HERMES = 0,
    CHAT_TOOLS_LLAMA3,
    CHAT_TOOLS_MISTRAL,
    CHAT_TOOLS_HARMONY,
} chat_tool_format;

/* The format of a recognised template (tmpl: its text, may be NULL). */
chat_tool_format chat_tools_format(const chat_template *t, const char *tmpl);
const char *chat_tools_format_name(chat_tool_format f); /* "hermes", "llama3", "mistral", "harmony" */

/* ---- tools and conversations ------------------------------------------------------------------ */

typedef struct chat_tool_set chat_tool_set;

/* Parses and checks the OpenAI tools array ([{"type": "function", "function": {"name",
 * "description", "parameters"}}]). VKI_ERR_INVALID_ARG with err naming tools[i].field. */
vki_status chat_tools_parse(const char *json, size_t len, chat_tool_set **out, char *err, size_t n_err);
void chat_tools_free(chat_tool_set *ts); /* NULL is fine */
uint32_t chat_tools_count(const chat_tool_set *ts);
const char *chat_tools_name(const chat_tool_set *ts, uint32_t i, size_t *len);

typedef struct chat_tool_call {
    const char *id;           /* [id_len]; required (9 alphanumerics) for MISTRAL, else unused */
    size_t id_len;
    const char *name;         /* [name_len] */
    size_t name_len;
    const char *arguments;    /* [args_len] JSON text (OpenAI's function.arguments string);
                                 rendered re-serialised, or as given when it does not parse */
    size_t args_len;
} chat_tool_call;

/* The tool parts of one message, parallel to the chat_msg array: an assistant message's calls;
 * for a CHAT_TOOL message, the call it answers (MISTRAL needs it). */
typedef struct chat_tool_msg {
    const chat_tool_call *calls;
    size_t n_calls;
    const char *call_id;
    size_t call_id_len;
} chat_tool_msg;

/* Renders a conversation with tools (tools may be NULL: then only assistant tool calls and tool
 * messages need this function). tm may be NULL (no message has tool parts). Errors name
 * messages[i] (e.g. more than one call in a LLAMA3 turn, a MISTRAL id that is not 9
 * alphanumerics). */
vki_status chat_render_tools(const chat_template *t, chat_tool_format f, const chat_msg *m, const chat_tool_msg *tm,
                             size_t n, const chat_tool_set *tools, bool add_generation_prompt, chat_prompt *out,
                             char *err, size_t n_err);

/* ---- forcing a call ---------------------------------------------------------------------------- */

typedef struct chat_tool_choice {
    const char *name;         /* the function to call ([name_len]), NULL: any of the tools */
    size_t name_len;
    bool parallel;            /* several calls allowed (parallel_tool_calls; not LLAMA3) */
} chat_tool_choice;

/* GBNF whose language is the format's call syntax with each function's arguments valid against
 * its parameters schema (tool_choice "required" or a named function). prefix (emptied, then
 * filled): text to append to the rendered prompt as template text before generating ("",
 * "[TOOL_CALLS]", or harmony's call header: up to "<|message|>" for one function, so that only
 * the arguments are generated; up to "to=functions." for several, the name and the rest of the
 * header then written by the grammar as plain text, which a grammar cannot make control tokens
 * of); the parser is then created with `opened` = true (HARMONY ignores it: chat_harmony writes
 * the call's spelling). VKI_ERR_INVALID_ARG for an unknown function name or a parameters schema
 * the converter refuses (err names tools[i] and the keyword). */
vki_status chat_tools_grammar(chat_tool_format f, const chat_tool_set *tools, const chat_tool_choice *choice,
                              strbuf *gbnf, strbuf *prefix, char *err, size_t n_err);

/* ---- parsing generated text --------------------------------------------------------------------- */

typedef enum chat_tool_event_kind {
    CHAT_TOOL_CONTENT,        /* text: content (never part of a call or of a held-back opener) */
    CHAT_TOOL_CALL_BEGIN,     /* index, id, name: a call starts */
    CHAT_TOOL_CALL_ARGS,      /* index, text: the next fragment of its arguments' JSON text */
    CHAT_TOOL_CALL_END,       /* index */
} chat_tool_event_kind;

typedef struct chat_tool_event {
    chat_tool_event_kind kind;
    uint32_t index;
    const char *text;         /* CONTENT / CALL_ARGS: [len] bytes */
    size_t len;
    const char *id, *name;    /* CALL_BEGIN: NUL-terminated */
} chat_tool_event;

typedef void (*chat_tool_event_fn)(void *user, const chat_tool_event *ev);

typedef struct chat_tool_parser chat_tool_parser;

/* opened: the output starts inside the calls (the prompt ended with chat_tools_grammar's
 * prefix). tools (may be NULL) lets LLAMA3 tell a call from a JSON answer by the name. seed makes
 * the call ids ("call_" + 24 alphanumerics; MISTRAL: 9) reproducible. */
vki_status chat_tool_parser_create(chat_tool_format f, bool opened, const chat_tool_set *tools, uint64_t seed,
                                   chat_tool_parser **out);
void chat_tool_parser_free(chat_tool_parser *p); /* NULL is fine */
/* Feeds generated text (any split); events go to fn as soon as they are certain. */
vki_status chat_tool_parser_push(chat_tool_parser *p, const char *text, size_t n, chat_tool_event_fn fn, void *user);
/* End of generation: held-back text comes out as content; an unfinished call is ended. */
vki_status chat_tool_parser_finish(chat_tool_parser *p, chat_tool_event_fn fn, void *user);

/* After finish: the calls (arguments as one JSON string each) and the content. malformed: some
 * call text did not parse as the format says (the calls before it are kept; the rest is content,
 * unless a call had already begun). */
uint32_t chat_tool_parser_calls(const chat_tool_parser *p);
const char *chat_tool_parser_call(const chat_tool_parser *p, uint32_t i, const char **name, const char **arguments);
const char *chat_tool_parser_content(const chat_tool_parser *p, size_t *len);
bool chat_tool_parser_malformed(const chat_tool_parser *p);

#endif
