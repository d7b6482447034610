/* `vkinfer serve`: an OpenAI-compatible HTTP server over one engine and one batch manager.
 *
 *   server.c          life cycle, parameters, routing, auth / CORS, errors, the small GET routes,
 *                     the access log and the periodic stats line
 *   server_http.c     HTTP/1.1: the listener, the connection (io) thread, request parsing with
 *                     deadlines, the connection cap (503 past it), handler threads, writers
 *   server_json.c     strict JSON for request bodies (no trailing data, duplicate keys, NUL)
 *   server_req.c      completion / chat request JSON -> a job: the table of known fields,
 *                     validation (400s naming the field), prompts, chat messages through chat.h
 *   server_job.c      a job's life: n choices submitted to the batch manager, their callback,
 *                     waiting for tokens or a client that went away, the JSON / SSE output
 *   server_struct.c   structured output (response_format, grammar, json_schema, guided_*) and tool
 *                     calling (tools, tool_choice, tool messages; output parsed into tool_calls)
 *   server_routes.c   /v1/models, /props, /version, /tokenize, /detokenize, /v1/embeddings
 *   server_metrics.c  counters, histograms, the tick gauges, Prometheus text
 *
 * Threading. One io thread owns every connection while a request is being received: it accepts,
 * reads and parses with a deadline (a client that trickles cannot hold a slot longer than
 * request_timeout_s), answers the small routes itself (health, readiness, metrics, models, props,
 * version, errors) and answers connections past max_connections with 503 + Retry-After (after
 * reading their request head, so /health and /metrics are still answered when every slot is
 * taken). A complete request for a heavy route (completions, chat, embeddings, tokenize) is handed
 * to a handler thread, which owns the connection until the answer is written, then gives it back
 * (keep-alive) or closes it. Threads: io + one handler per busy connection (<= max_connections,
 * stack SRV_STACK_BYTES) + the batch manager's worker.
 *
 * A generation handler tokenises on its own thread, submits through the push interface, then
 * blocks in poll() on the job's eventfd (the worker writes it after appending tokens) and the
 * client socket: POLLHUP / POLLERR = the client is gone (its requests are cancelled, freed at the
 * next tick boundary). POLLRDHUP alone is a half-close (a client that shut its sending side after
 * the request): the request goes on, and the handler probes the socket (an SSE comment, or an
 * interim "102 Processing" on a JSON request) so that a client that really closed is seen by the
 * reset its kernel answers with.
 *
 * Locks: srv.mu (bm pointer, draining, counts, ids, the returned-connection list) is never held
 * by the worker thread while it is inside the batch manager; the worker's callbacks take only
 * job.mu, srv.mu and metrics.mu, each briefly. Nothing on the tick path waits for a connection
 * thread: stats arrive as a struct (tick_stats), not JSON. */
#ifndef VKI_HOST_SERVER_H
#define VKI_HOST_SERVER_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "host/chat/chat.h"
#include "host/chat/chat_harmony.h"
#include "host/chat/chat_tools.h"
#include "host/util/strbuf.h"
#include "vkinfer.h"

#define SRV_STACK_BYTES (512u * 1024u)
#define SRV_MAX_STOPS 16
#define SRV_MAX_STOP_BYTES 512
#define SRV_MAX_N 16            /* choices per request */
#define SRV_HEAD_LIMIT 16384    /* bytes of a request line + headers (431 past it) */
#define SRV_VERSION VKI_PROGRAM_VERSION /* the project version, from CMake */

typedef struct srv srv;

typedef struct srv_params {
    const char *host;           /* address to bind ("127.0.0.1"; "0.0.0.0" or "::" for all) */
    uint16_t port;              /* 8080; 0 = any free port (srv_port) */
    int listen_fd;              /* >= 0: a socket from srv_listen (taken over); -1: bind host:port */
    size_t body_limit;          /* request body bytes; larger -> 413. 1 MiB */
    uint32_t max_connections;   /* connections served at once; past it 503 + Retry-After. 512 */
    uint32_t idle_timeout_s;    /* an idle keep-alive connection is closed after this. 60 */
    uint32_t request_timeout_s; /* receiving one request's head and body, in all; 408 past it. 30 */
    uint32_t recover_backoff_ms; /* after a device loss the engine is recreated (device reopened,
                                    model reloaded) by a thread of the server, first after this
                                    wait, then doubling up to 30 s while it fails; /health/ready
                                    and new requests get 503 meanwhile. 0: never (503 until the
                                    server is restarted). 500 */
    const char *const *api_keys; /* [n_api_keys] accepted bearer tokens; none: no authentication */
    uint32_t n_api_keys;
    const char *const *cors_origins; /* [n_cors_origins] allowed origins ("*" = any); none: no CORS */
    uint32_t n_cors_origins;
    uint32_t stats_interval_s;  /* a one-line summary this often while busy; 0 = never. 10 */
    vki_pooling pooling;        /* /v1/embeddings: VKI_POOL_MEAN or VKI_POOL_LAST; VKI_POOL_NONE (the
                                   default): the model's pooling_type, else mean (set per model
                                   when its server is made) */
    const char *model_path;     /* the GGUF (its tokenizer.chat_template) */
    const char *model_id;       /* the "model" in responses; NULL: the file name without .gguf */
    const char *chat_template;  /* NULL: recognise the GGUF's template; else a chat family name */
    vki_batch_params batch;     /* the server's default policy is MAX_UTILIZATION (see README) */
    const char *session_dir;    /* POST /v1/sessions/{id}/save|restore write and read session
                                   files in this folder (sessions.c; copied); NULL: those routes
                                   answer 501 */
    vki_log_fn log;             /* NULL: stderr */
    void *log_user;
    vki_log_level log_level;    /* VKI_LOG_INFO: the access log; DEBUG adds health probes */
} srv_params;

srv_params srv_default_params(void);

/* Binds and listens on host:port (so a program can report an occupied port before it loads a
 * model): *fd for srv_params.listen_fd. On failure err names the address and the cause. */
vki_status srv_listen(const char *host, uint16_t port, int *fd, char *err, size_t n_err);
/* Starts serving e (which must outlive the server). On failure err says why (bad address, port
 * in use, unknown chat template name). */
vki_status srv_create(vki_engine *e, const srv_params *p, srv **out, char *err, size_t n_err);
uint16_t srv_port(const srv *s);
/* Stops accepting connections; new requests on open ones get 503, /health/ready says 503. */
void srv_drain_begin(srv *s);
/* Waits until no generation request is in flight or timeout_s passed; true when idle. */
bool srv_wait_idle(srv *s, double timeout_s);
/* Cancels whatever is still running (each request still gets its final response), waits up to
 * a second for the answers to go out, then closes every connection and frees everything. */
void srv_destroy(srv *s);

/* ---- internals shared by server*.c ---------------------------------------------------------- */

typedef enum srv_route {
    R_NONE,
    R_HEALTH,
    R_READY,
    R_MODELS,
    R_MODEL,      /* /v1/models/{id} */
    R_METRICS,
    R_VERSION,
    R_PROPS,
    R_V2,         /* /v2...: KServe v2 metadata, health, config, stats (kserve.c, io thread) */
    R_SESSION,    /* POST /v1/sessions/{id}/end (sessions.c) */
    R_OLLAMA_VERSION, /* GET /api/version (ollama_api.c) */
    R_CMPL,       /* heavy routes (handler threads) from here on */
    R_CHAT,
    R_LLAMA_CMPL, /* POST /completion: llama-server's own completion API (llama_api.c) */
    R_APPLY_TEMPLATE, /* POST /apply-template: the conversation rendered, not run */
    R_INFILL,     /* POST /infill: fill-in-the-middle (llama_api.c) */
    R_RESPONSES,  /* POST /v1/responses: OpenAI's Responses API (responses_api.c) */
    R_EMBED,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_V2_HEAVY,   /* /v2 infer, generate, generate_stream and the repository routes (kserve.c) */
    R_SESSION_FILE, /* POST /v1/sessions/{id}/save|restore (sessions.c): file I/O and a tick's wait */
    R_OLLAMA_GENERATE, /* Ollama's API (ollama_api.c): POST /api/generate, /api/chat, /api/embed, */
    R_OLLAMA_CHAT,     /* /api/embeddings, /api/show; GET /api/tags, /api/ps (the model files' */
    R_OLLAMA_EMBED,    /* facts: read on a handler thread) */
    R_OLLAMA_EMBEDDINGS,
    R_OLLAMA_SHOW,
    R_OLLAMA_TAGS,
    R_OLLAMA_PS,
} srv_route;

typedef enum srv_outcome {
    SRV_OUT_STOP,        /* finished: end of text or a stop string / id */
    SRV_OUT_LENGTH,      /* finished: max_tokens */
    SRV_OUT_CANCELLED,   /* the client went away */
    SRV_OUT_ABORTED,     /* the server shut down before it finished */
    SRV_OUT_ERROR,       /* the engine failed it */
    SRV_OUT_INVALID,     /* 400 / 413 */
    SRV_OUT_QUEUE_FULL,  /* 429 */
    SRV_OUT_UNAVAILABLE, /* 503: draining or device lost */
    SRV_OUT_COUNT
} srv_outcome;

#define SRV_HIST_MAX 24
#define SRV_N_CODES 14

typedef struct srv_hist {
    const double *le;                 /* [n] upper bounds, seconds */
    uint32_t n;
    uint64_t count[SRV_HIST_MAX + 1]; /* per bucket (not cumulative); [n] = above the last bound */
    double sum;
    uint64_t total;
} srv_hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t outcome[SRV_OUT_COUNT];
    uint64_t http[SRV_N_CODES];       /* responses by status code (srv_metrics.c lists them) */
    uint64_t prompt_tokens, generated_tokens, cached_tokens;
    uint64_t overflow_rejected;       /* connections past max_connections answered 503 */
    srv_hist ttft, itl, e2e, step;
    bool have_stats;                  /* tick: the last tick with work */
    vki_batch_stats tick;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
void srv_metrics_outcome(srv_metrics *m, srv_outcome o);
void srv_metrics_http(srv_metrics *m, unsigned code);
void srv_metrics_observe(srv_metrics *m, srv_hist *h, double seconds);
void srv_metrics_tokens(srv_metrics *m, uint64_t prompt, uint64_t generated, uint64_t cached);
void srv_metrics_overflow(srv_metrics *m);
/* One tick's stats (the batch manager's worker: O(buckets) under metrics.mu). */
void srv_metrics_tick(srv_metrics *m, const vki_batch_stats *st);
/* Prometheus text exposition (malloc'd). */
typedef struct srv_gauges {
    uint32_t active;                  /* generation requests in flight */
    uint32_t connections;             /* open connections within the cap */
    uint32_t handlers;                /* handler threads */
    bool ready;
} srv_gauges;
char *srv_metrics_render(srv_metrics *m, const srv_gauges *g);
/* Several models: server-wide series from server and g, the rest once per model, labelled
 * model="names[k]" (names NULL: no label, one model). */
char *srv_metrics_render_models(srv_metrics *server, const srv_gauges *g, srv_metrics *const *models,
                                const char *const *names, const srv_gauges *mg, uint32_t n);

/* An HTTP-level error: status, OpenAI error type, the parameter it is about, message. */
typedef struct srv_error {
    unsigned http;
    const char *type;  /* "invalid_request_error", "rate_limit_error", "server_error", ... */
    const char *code;  /* NULL or e.g. "rate_limit_exceeded" */
    char param[64];    /* "" when not about a field */
    char msg[384];
} srv_error;

void srv_err(srv_error *e, unsigned http, const char *param, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* {"error": {...}} as a malloc'd string. */
char *srv_error_json(const srv_error *e);

/* server_json.c: strict JSON; NULL with *err (byte offset, the top-level key, message). */
typedef struct srv_json_err {
    size_t at;
    char key[64];      /* the top-level field whose value failed, "" if none */
    char msg[160];
    bool oom;          /* the parser ran out of memory (the body may be fine) */
} srv_json_err;
cJSON *srv_json_parse(const char *text, size_t n, srv_json_err *err);

/* ---- HTTP (server_http.c) --------------------------------------------------------------------- */

/* One parsed request. */
typedef struct srv_req {
    char method[16];
    char path[512];            /* the target without its query */
    int minor;                 /* HTTP/1.minor */
    bool keep_alive;           /* the client allows another request on this connection */
    bool chunked;              /* Transfer-Encoding: chunked body */
    uint64_t content_length;
    bool expect_continue;
    char auth[512];            /* Authorization */
    char origin[256];          /* Origin */
    char acr_headers[256];     /* Access-Control-Request-Headers */
    srv_route route;
    strbuf body;
} srv_req;

/* What the access log says about a request beyond its status. */
typedef struct srv_access {
    bool gen;                  /* a generation / embedding request: the fields below are set */
    uint32_t prompt, output, cached;
    double ttft_ms;            /* < 0: no token */
    const char *finish;        /* "stop", "length", ... or NULL */
} srv_access;

typedef struct srv_conn {
    srv *s;
    int fd;
    char peer[64];             /* "address:port" */
    int state;                 /* server_http.c's conn_state */
    bool overflow;             /* accepted past max_connections: only probes are served */
    bool on_handler;           /* owned by a handler thread (blocking writes) */
    bool close_after;          /* close once the answer is out */
    bool peer_eof;             /* the client shut its sending side */
    bool half_closed;          /* the handler saw the half-close (probing from now on) */
    bool headers_sent;         /* a streamed answer has begun */
    bool stream_chunked;       /* the stream uses chunked framing (HTTP/1.1) */
    strbuf in;                 /* bytes received: the request being parsed starts at in_off */
    size_t in_off, scan;       /* scan: where the search for the head's end resumes */
    size_t head_len;           /* > 0 once the head is parsed */
    uint64_t body_left;        /* Content-Length bytes still to come */
    int chunk_state;           /* chunked body decoding */
    uint64_t chunk_left;
    srv_req req;
    srv *model;                /* handler: the model answering this request (a reference, repo.c);
                                  NULL: the connection's own server (one model) */
    strbuf out;                /* io thread: answer bytes not yet written, from out_off */
    size_t out_off;
    double t_req, deadline;    /* first byte of the request; when the current state times out */
    unsigned status;           /* of the answer (access log) */
    srv_access acc;
    bool ollama;               /* an Ollama route: errors as {"error": "..."} */
    char ollama_model[256];    /* the model its embeddings request named (echoed in the answer) */
    struct srv_conn *prev, *next; /* the io thread's list */
    struct srv_conn *ret_next;    /* handed back by a handler */
} srv_conn;

vki_status srv_http_start(srv *s, char *err, size_t n_err);
void srv_http_stop_accepting(srv *s);
void srv_http_stop(srv *s);   /* waits for handlers (unblocking them after a second), closes all */

/* An answer with a body (malloc'd, taken; NULL = out of memory: the connection is closed).
 * extra: more header lines ("Name: value\r\n..."), or NULL. HEAD requests get no body. */
void srv_reply(srv_conn *c, unsigned code, const char *ctype, char *body, const char *extra);
void srv_reply_error(srv_conn *c, const srv_error *e);
void srv_reply_json(srv_conn *c, unsigned code, cJSON *o); /* takes o */
/* Streaming (handler threads): 200 with Transfer-Encoding: chunked (HTTP/1.0: until close). */
bool srv_stream_begin(srv_conn *c, const char *ctype);
bool srv_stream_send(srv_conn *c, const char *p, size_t n);
bool srv_stream_end(srv_conn *c);
/* A half-closed client: sends something harmless (an SSE comment when streaming, else an interim
 * 102 response) so that a client that is really gone answers with a reset. false: gone. */
bool srv_probe(srv_conn *c);

/* server.c */
vki_status srv_bm_create(srv *s, vki_batch_manager **out); /* the server's manager on s->engine */
/* After s->bm was set to NULL (under mu), before the old manager is destroyed: waits until no
 * session file call still uses it. */
void srv_bm_quiesce(srv *s);

/* server_recover.c: the engine's recovery after a device loss (srv_params.recover_backoff_ms) */
vki_status srv_recover_start(srv *s);
void srv_recover_stop(srv *s);
bool srv_route_is_heavy(srv_route r);
void srv_serve_small(srv_conn *c);  /* io thread */
void srv_serve_heavy(srv_conn *c);  /* handler thread */
void srv_access_log(srv_conn *c);
const char *srv_cors_origin(const srv *s, const char *origin); /* the value to echo, or NULL */
void srv_maybe_log_stats(srv *s);   /* io thread, every wake: the periodic summary */

/* ---- the server object --------------------------------------------------------------------- */

struct srv {
    srv_params p;
    char **api_keys;           /* [p.n_api_keys] copies */
    char **cors;               /* [p.n_cors_origins] copies */
    vki_engine *engine;
    const vki_tokenizer *tok;
    vki_model_info info;
    char model_id[128];
    chat_template chat;
    bool chat_known;           /* the GGUF's template was recognised (else the plain fallback) */
    chat_tool_format tool_fmt; /* how tools are rendered and calls written (from the template) */
    /* the file's parameter count and file type for Ollama's listings, read once (under mu) */
    bool file_facts;
    uint64_t n_params;
    const char *file_type;     /* gguf_file_type_name's, or NULL */
    chat_specials *specials;
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* n_active or n_handlers changed */
    vki_batch_manager *bm;     /* NULL once srv_destroy took it */
    pthread_rwlock_t bm_use;   /* read-held by a session file call while it uses bm outside mu (it
                                  waits for a tick); taken for writing (srv_bm_quiesce) between
                                  taking bm away and destroying it */
    char *session_dir;         /* p.session_dir's copy, or NULL */
    bool draining, device_lost;
    pthread_t recover;         /* the recovery thread (recover_started) */
    bool recover_started, recover_stop; /* under mu */
    uint32_t n_recovered;      /* under mu: engines recreated after a device loss */
    uint32_t n_active;         /* jobs submitted and not yet final */
    uint64_t next_id;
    srv_metrics m;
    long long t_start;         /* unix seconds */
    /* HTTP (server_http.c) */
    int listen_fd, ep, wake_fd, reserve_fd;
    uint16_t port;
    pthread_t io;
    bool io_started;
    bool stopping;             /* under mu: the io thread exits */
    bool stop_accepting;       /* under mu: the listener is to be closed */
    uint32_t n_handlers;       /* under mu */
    uint32_t n_conns;          /* under mu: connections within the cap */
    uint32_t n_overflow;       /* io thread: connections past the cap */
    uint32_t overflow_max;
    uint64_t fd_limit;
    srv_conn *conns;           /* io thread: every connection it owns */
    srv_conn *returned;        /* under mu: given back by handlers */
    srv_conn **handled;        /* under mu: [max_connections] owned by handlers (to unblock) */
    /* periodic stats line (io thread) */
    double t_stats;
    uint64_t stats_gen, stats_prompt, stats_done;
    /* Several models (repo.c). The front server of a model repository has no engine: each model
     * is an srv of its own without HTTP (engine, batch manager, chat template, counters, ids),
     * which the front's handlers borrow per request (srv_conn.model). */
    struct srv_repo *repo;     /* the front in repository mode, else NULL */
    struct srv_sessions *sessions; /* a model's v2 sequences (sessions.c), made on first use */
    bool is_model;             /* a repository's model: no HTTP of its own */
};

/* The server that owns the model facts of c's request (tokenizer, info, chat, metrics). */
static inline srv *srv_conn_model(const srv_conn *c) { return c->model ? c->model : c->s; }

double srv_now(void); /* monotonic seconds */
void srv_log(const srv *s, vki_log_level lv, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void srv_logv(const srv_params *p, vki_log_level lv, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));

/* ---- jobs (server_req.c, server_job.c) --------------------------------------------------------- */

typedef struct srv_job srv_job;

/* Generated ids and their logprobs, grown by doubling (a request costs what it generates). */
typedef struct srv_toks {
    int32_t *tok;              /* [cap] generated ids */
    float *lp;                 /* [cap] when the job wants logprobs */
    int32_t *top_id;           /* [cap][n_top] alternatives */
    float *top_lp;             /* [cap][n_top] */
    uint32_t cap;
} srv_toks;

/* One choice of a job: one batch-manager request. */
/* The reasoning of a thinking model's answer ("<think>...</think>" first, or everything up to
 * "</think>" when the prompt opened the block) split from its content, as bytes arrive; for
 * gpt-oss (harmony) its analysis channel from its final channel and tool calls (chat_harmony). */
typedef struct srv_think {
    uint8_t state;             /* 0: may open with "<think>"; 1: reasoning; 2: content */
    bool started;              /* the current part has had a byte (its leading newlines dropped) */
    char hold[8];              /* bytes that may begin a tag, not yet given out */
    uint8_t n_hold;
    bool harmony;              /* the answer is harmony text: h splits it */
    chat_harmony h;
} srv_think;

typedef struct srv_choice {
    srv_job *j;
    uint32_t index;
    uint64_t id;
    bool submitted;
    /* written by the worker thread, under j->mu */
    srv_toks w;                /* may move when it grows: the handler reads h, its copy */
    uint32_t n_recv, n_cached;
    double t_last;             /* when its last token came (inter-token latency) */
    bool final, oom;
    vki_finish_reason finish;
    vki_status status;
    char error[192];
    /* the handler's */
    srv_toks h;                /* [0, n_used) copied from w under j->mu */
    bool final_seen, stop_hit;
    bool oom_seen;             /* oom, as of the last copy */
    uint32_t n_used;           /* tokens turned into text so far */
    uint32_t n_counted;        /* tokens that count (up to and including a stop string's end) */
    vki_text_stream *ts;
    strbuf text;               /* the whole completion (non-streaming) */
    size_t text_bytes;         /* completion bytes emitted so far (text_offset) */
    cJSON *lp_all;             /* non-streaming logprobs being built */
    bool role_sent, end_sent;  /* streaming chat: the role chunk, the finish chunk */
    float *rows;               /* worker, under j->mu: [n_rows][n_vocab] generation logits (the job's
                                  want_gen_logits), aligned with w.tok; grown by doubling */
    uint32_t n_rows, rows_cap;
    chat_tool_parser *tp;      /* tools: the output parsed into calls (NULL: plain content) */
    uint32_t n_calls;          /* tool calls begun in the output */
    bool tp_done;              /* tp has seen the end of the output */
    srv_think th;              /* the job's think: reasoning and content apart */
} srv_choice;

/* Structured output and tools of a job (server_struct.c). */
typedef enum srv_tool_choice { SRV_TOOLS_AUTO = 0, SRV_TOOLS_NONE, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED } srv_tool_choice;

typedef struct srv_struct {
    vki_constraint_type type;  /* the output constraint: NONE, GBNF or JSON_SCHEMA */
    strbuf text;               /* its grammar or schema text */
    const char *field;         /* the request field that set it (errors name it) */
    chat_tool_set *tools;      /* "tools" (NULL: none or an empty list) */
    srv_tool_choice choice;
    char name[72];             /* SRV_TOOLS_NAMED: the function */
    bool serial;               /* parallel_tool_calls: false */
    bool choice_given;
    bool parse;                /* the choices parse their output into tool calls */
    bool opened;               /* the prompt ends with the call opener (Mistral's [TOOL_CALLS]) */
} srv_struct;

/* One generation request: n choices over one prompt. Refcounted: the handler and the batch
 * manager (one reference per submitted choice, until its final response) each hold one. */
struct srv_job {
    srv *s;
    pthread_mutex_t mu;
    int evfd;                  /* written by the worker after each response */
    int refs;                  /* under mu */
    char cmpl_id[40];          /* "cmpl-..." / "chatcmpl-..." */
    long long created;
    /* the request */
    bool chat, stream, include_usage, ignore_eos, echo, return_ids, skip_special;
    /* chat rendering (vLLM's fields): no assistant header after the messages; the last
     * (assistant) message left open, so the answer continues it */
    bool no_gen_prompt, continue_final;
    bool no_think;             /* chat_template_kwargs.enable_thinking false (Qwen3's templates) */
    bool think_on;             /* ... true (EXAONE 4's; Granite's own `thinking` true) */
    uint8_t reasoning_format;  /* SRV_REASONING_*: reasoning_format (llama-server's), default auto */
    bool think;                /* chat answers go through srv_think (reasoning_content; harmony's channels) */
    bool harmony;              /* chat answers are harmony text (gpt-oss): its control tokens are
                                  rendered (the markers), the token that ends generation is not */
    chat_effort effort;        /* harmony's reasoning effort: reasoning_effort, or chat_template_kwargs' */
    bool effort_top;           /* set by the top-level reasoning_effort (which wins) */
    srv_think th0;             /* each choice's splitter starts as this: inside DeepSeek-R1's opened
                                  <think>, or (harmony) primed with the prompt's last message */
    char *rendered;            /* /apply-template: the rendered conversation (set when the job asks) */
    bool want_rendered;
    bool include_stop;         /* include_stop_str_in_output (vLLM): the stop string ends the text */
    bool want_lp;              /* completions: logprobs != null; chat: logprobs: true */
    uint32_t n_top;            /* alternatives per token */
    bool want_gen_logits;      /* v2's return_generation_logits (set by its fmt's prepare) */
    uint32_t max_tokens, min_tokens, n;
    int32_t *prompt;           /* [n_prompt] */
    uint32_t n_prompt;
    char *prompt_text;         /* echo: the prompt as text (completions) */
    vki_sampling_params sampling;
    vki_logit_bias *bias;      /* [sampling.n_logit_bias] */
    int32_t *stop_ids;         /* [n_stop_ids] */
    uint32_t n_stop_ids;
    char *stops[SRV_MAX_STOPS];
    uint32_t n_stops;
    srv_struct so;             /* response_format / grammar / tools */
    srv_choice ch[SRV_MAX_N];
    bool rest_submitted;       /* choices 1..n-1 (submitted once choice 0 has its prompt's KV) */
    /* use_beam_search (vLLM): one batch request of beam_width (best_of) beams; its n best become
     * the choices. 0: none */
    uint32_t beam_width;
    float length_penalty;
    vki_early_stopping early_stopping;
    double t_arrive, t_first;  /* seconds, monotonic (under mu) */
    /* the handler's */
    srv_conn *conn;
    bool gone;
    srv_outcome outcome;
    bool counted;              /* outcome recorded in the metrics */
    const struct srv_job_fmt *fmt; /* NULL: OpenAI's shapes; else another protocol's (kserve.c) */
    char fmt_id[128];          /* the client's request id in that protocol ("" = none) */
    void *fmt_ctx;             /* the protocol's own state for fmt->finished */
    uint64_t session_id;       /* != 0: its KV stays pinned for the session (sessions.c) */
};

/* A protocol's output shapes for a job (the OpenAI ones are server_job.c's own). With reshape,
 * the job's answer and chunks are built in OpenAI's shapes first (reasoning split, tool calls
 * parsed) and each object (o, taken; streamed: a chunk) goes through reshape into out; answer
 * and chunk are then unused, end still writes the stream's end. */
typedef struct srv_job_fmt {
    bool (*reshape)(srv_job *j, cJSON *o, bool streamed, strbuf *out);
    const char *stream_type;       /* the stream's Content-Type; NULL: text/event-stream */
    char *(*answer)(srv_job *j);   /* the non-streaming body (malloc'd; NULL = out of memory) */
    /* one streamed piece of choice ch: text (may be ""), finish NULL until its last piece */
    bool (*chunk)(srv_job *j, const srv_choice *ch, strbuf *out, const char *text, const char *finish);
    bool (*end)(srv_job *j, strbuf *out, const srv_error *failed); /* the stream's end; failed: why */
    void (*prepare)(srv_job *j);   /* NULL, or called on the parsed job before it is submitted */
    void (*finished)(srv_job *j);  /* NULL, or called once the answer is out (handler thread) */
} srv_job_fmt;

/* server_req.c: the most new tokens j's prompt leaves room for (the context, and the KV pool for
 * one sequence unless attention windows bound it). */
uint32_t srv_job_room(const srv *s, const srv_job *j);
/* server_req.c: a validated job (tokenised prompt, sampling, stops), or false with *e filled. */
bool srv_job_from_json(srv *s, bool chat, const char *body, size_t n, srv_job **out, srv_error *e);
/* POST /apply-template (llama-server's): a chat body rendered by the model's template, not run:
 * {"prompt": text}. Handler thread. */
void srv_route_apply_template(srv_conn *c);
/* Fields shared with the other routes: the top-level object of a body, or false with *e. */
cJSON *srv_parse_body(const char *body, size_t n, srv_error *e);

/* server_struct.c. A request field it owns (response_format, grammar, json_schema, guided_*,
 * tools, tool_choice, parallel_tool_calls; v->string is the name): false with *e (400 naming it). */
bool srv_struct_field(srv_job *j, const cJSON *v, srv_error *e);
/* Cross-field rules once every field was read (tool_choice without tools, a forced call with
 * another constraint). */
bool srv_struct_check(srv_job *j, srv_error *e);
/* messages[i]'s tool parts: an assistant's tool_calls, a tool message's tool_call_id. Pointers
 * into m; tm->calls is malloc'd (free it). */
bool srv_struct_message(const cJSON *m, size_t i, chat_role role, chat_tool_msg *tm, srv_error *e);
/* Renders the conversation (with the tools unless tool_choice is none; tm may be NULL) and, for
 * a forced call, sets the job's grammar and appends the format's opener to the prompt. */
bool srv_struct_render(srv_job *j, const chat_msg *m, const chat_tool_msg *tm, size_t n, chat_prompt *p,
                       srv_error *e);
bool srv_struct_choice_init(srv_job *j, srv_choice *ch, srv_error *e);
/* Streaming: the deltas ({"content": ...} / {"tool_calls": [...]}, OpenAI's shapes) that a piece
 * of text gives, appended to `deltas`; end: the output is complete. false: out of memory. */
bool srv_struct_deltas(srv_choice *ch, const char *text, size_t n, bool end, cJSON *deltas);
/* Non-streaming: message.content and message.tool_calls from the whole text. */
bool srv_struct_answer(srv_choice *ch, const char *text, size_t n, cJSON *message);
/* reasoning_format: "auto" (reasoning_content for the thinking templates: Qwen3's, DeepSeek-R1's,
 * gpt-oss's analysis channel), "deepseek" (for any template), "none" (the raw text in content;
 * harmony: the analysis with its markers, the final answer, calls still parsed). */
enum { SRV_REASONING_AUTO = 0, SRV_REASONING_NONE, SRV_REASONING_DEEPSEEK };
/* Splits the next n bytes of an answer into its reasoning (appended to r) and its content (to c);
 * end: the answer is complete (what was held back comes out). Leading newlines of each part are
 * dropped ("<think>\n", "</think>\n\n"); a "</think>" that never comes leaves it all reasoning.
 * t->harmony: chat_harmony_feed (calls go to c in the spelling CHAT_TOOLS_HARMONY parses). */
bool srv_think_feed(srv_think *t, const char *s, size_t n, bool end, strbuf *r, strbuf *c);
void srv_struct_free(srv_job *j);
/* What /props says is supported. */
cJSON *srv_struct_props(const srv *s);

/* server_job.c */
srv_job *srv_job_new(srv *s, bool chat);
void srv_job_release(srv_job *j);
/* Submits j; false with *e (429, 400, 503) when it was not queued. */
bool srv_job_submit(srv_job *j, srv_error *e);
/* Runs a submitted job to its answer on c (JSON or SSE), recording the access-log fields. */
void srv_job_serve(srv_job *j, srv_conn *c);
/* A token's text for JSON: its piece (control tokens shown), bytes that are not valid UTF-8 as
 * "\xNN"; raw[256] gets the piece's bytes, *n_raw their count. And bytes as a JSON array. */
void srv_token_text(const vki_tokenizer *tok, int32_t id, char *out, size_t cap, char *raw, size_t *n_raw);
cJSON *srv_bytes_json(const char *raw, size_t n);
/* One server-sent event "data: JSON\n\n" appended to out; takes o (NULL: false). */
bool srv_sse_json(strbuf *out, cJSON *o);
/* "stop", "length", ... as the OpenAI answers name a choice's end. */
const char *srv_choice_finish(const srv_choice *ch);
/* The tokens of ch that count (up to and including a stop string's end): after the job is done,
 * ch->h.tok / h.lp and ch->rows hold at least that many. */
uint32_t srv_choice_tokens(const srv_choice *ch);

/* ---- several models (repo.c) and KServe v2 (kserve.c) ----------------------------------------- */

typedef enum srv_model_control {
    SRV_CONTROL_NONE,      /* every model loaded at start; load / unload requests refused */
    SRV_CONTROL_EXPLICIT,  /* the load_models at start; then load / unload on request */
    SRV_CONTROL_POLL,      /* every model at start; then the folder is rescanned every poll_s */
} srv_model_control;

typedef struct srv_repo_params {
    const char *dir;              /* DIR/NAME/model.gguf (+ config.json) or DIR/NAME.gguf */
    srv_model_control control;
    const char *const *load_models; /* [n_load_models] EXPLICIT: loaded at start ("*" = all) */
    uint32_t n_load_models;
    uint32_t poll_s;              /* POLL: seconds between scans. 15 */
    double unload_timeout_s;      /* running requests of an unloading model get this long. 30 */
    uint64_t memory_budget;       /* bytes of device memory for all models together; 0 = none */
    vki_engine_params engine;     /* every model's, before its config.json */
} srv_repo_params;

srv_repo_params srv_repo_default_params(void);
/* Scans and loads (models that fail are listed UNAVAILABLE with the reason, not fatal), then
 * serves them all on p's address. err: a repository that cannot be read at all. */
vki_status srv_create_repo(const srv_params *p, const srv_repo_params *rp, srv **out, char *err, size_t n_err);

/* A model with no HTTP of its own, over engine e (which must outlive it): p as the front's. */
vki_status srv_model_create(vki_engine *e, const srv_params *p, srv **out, char *err, size_t n_err);
void srv_model_destroy(srv *m);  /* its manager cancels what is left; no handler may hold it */
/* The front of a repository: HTTP only, models from repo (taken: freed by srv_destroy). */
vki_status srv_front_create(const srv_params *p, struct srv_repo *repo, srv **out, char *err, size_t n_err);

/* The model a request names (name NULL or "": the only one loaded), with a reference; NULL with
 * *e (404 naming the loaded models, 400 when several are loaded and none is named, 503 while it
 * loads or unloads). On a single-model server: that server (a lenient name when !strict). */
srv *srv_model_acquire(srv *s, const char *name, bool strict, srv_error *e);
void srv_model_release(srv *s, srv *m);
/* The models ready to serve, each with a reference (at most cap; a single-model server: itself);
 * give them back with srv_models_done. */
uint32_t srv_models_ready(srv *s, srv **out, uint32_t cap);
void srv_models_done(srv *s, srv *const *m, uint32_t n);
/* A model over the program's engine e (not charged to the budget, never destroyed here). */
vki_status srv_repo_add_engine(srv *s, const char *name, vki_engine *e, const vki_batch_params *bp, char *err,
                               size_t n_err);
vki_status srv_repo_remove(srv *s, const char *name); /* unload; VKI_ERR_NOT_FOUND */
/* repository mode: the io thread's routes and the life cycle hooks of server.c */
cJSON *srv_model_object(const srv *m);          /* server_routes.c: a /v1/models entry */
void srv_repo_models(srv_conn *c);                 /* GET /v1/models */
void srv_repo_model(srv_conn *c, const char *id);  /* GET /v1/models/{id} */
char *srv_repo_metrics(srv *s, const srv_gauges *g);
void srv_repo_drain(struct srv_repo *r);
bool srv_repo_wait_idle(struct srv_repo *r, double timeout_s);
void srv_repo_stop(struct srv_repo *r);            /* cancels every model's requests */
void srv_repo_free(struct srv_repo *r);            /* after HTTP stopped: models and engines */
uint32_t srv_repo_active(struct srv_repo *r);      /* generation requests in flight, all models */
cJSON *srv_repo_index(srv *s, bool ready_only);   /* Triton's repository index entries */
bool srv_repo_load(srv *s, const char *name, srv_error *e);
bool srv_repo_unload(srv *s, const char *name, srv_error *e);
/* "READY", "LOADING", "UNLOADING", "UNAVAILABLE" or NULL (no such model); reason when unavailable */
const char *srv_repo_state(srv *s, const char *name, char *reason, size_t n_reason);
/* server.c: a generation request on c's model, answered in fmt's shapes (NULL: OpenAI's) */
void srv_serve_generation(srv_conn *c, const srv_job_fmt *fmt, const char *fmt_id, void *fmt_ctx);
/* The same for another protocol's request translated into the OpenAI body `text` (read instead
 * of the request's body), counted as route `as` (metrics, access log); c's request is as it was
 * on return. */
void srv_serve_translated(srv_conn *c, const char *text, srv_route as, const srv_job_fmt *fmt, const char *fmt_id,
                          void *fmt_ctx);
/* sessions.c */
uint64_t srv_session_id(const cJSON *v, const char *name, srv_error *e); /* 0 with *e: bad */
bool srv_session_field(srv_job *j, const cJSON *v, srv_error *e);       /* "session_id" */
/* A v2 sequence's request begins: its tokens so far (*hist malloc'd, may be NULL), or false
 * with *e (not started, running, out of memory). start: a new sequence under that id. */
bool srv_seq_begin(srv *m, uint64_t id, bool start, int32_t **hist, uint32_t *n, srv_error *e);
/* ... and finishes: its tokens become a[0..na) + b[0..nb) (ok), stay as they were (!ok), or
 * the sequence ends (end). */
void srv_seq_finish(srv *m, uint64_t id, const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb, bool ok,
                    bool end);
void srv_sessions_free(struct srv_sessions *ss);
void srv_route_session_end(srv_conn *c);
void srv_route_session_file(srv_conn *c); /* handler thread */
bool srv_session_is_file_route(const char *path); /* /v1/sessions/{id}/save or /restore */
bool srv_authorized(const srv *s, const char *auth);
/* llama_api.c: POST /completion (handler thread, c->model chosen); and its translation alone,
 * a llama-server body into the OpenAI completion body (malloc'd) or NULL with *e (fuzz_request). */
void srv_llama_completion(srv_conn *c);
void srv_llama_infill(srv_conn *c); /* POST /infill */
char *srv_llama_body(const char *body, size_t n, srv_error *e);
/* responses_api.c: POST /v1/responses (handler thread, c->model chosen); and its translation
 * alone, a Responses body into the chat completion body (malloc'd) or NULL with *e (fuzz_request) */
void srv_responses(srv_conn *c);
char *srv_responses_body(const char *body, size_t n, srv_error *e);
/* ollama_api.c: Ollama's API (handler threads, but version: io thread) */
void srv_ollama_generate(srv_conn *c, bool chat);
void srv_ollama_embed(srv_conn *c);
void srv_ollama_show(srv_conn *c);
void srv_ollama_list(srv_conn *c, bool running);
void srv_ollama_version(srv_conn *c);
/* its translation alone: an /api/chat (chat) or /api/generate body into the OpenAI chat or
 * completion body (*as_chat; cJSON_free), or NULL with *e, or NULL with *load for a preload */
char *srv_ollama_body(const char *body, size_t n, bool chat, bool harmony, bool *as_chat, bool *load,
                      srv_error *e);
/* server_routes.c: /v1/embeddings of the OpenAI body [body, body + n) (another protocol's
 * translation), its answer (o, taken) reshaped by shape */
void srv_route_embeddings_as(srv_conn *c, const char *body, size_t n, cJSON *(*shape)(srv_conn *c, cJSON *o));
/* kserve.c */
void srv_kserve_small(srv_conn *c);  /* io thread: answers, or marks the route R_V2_HEAVY */
void srv_kserve_heavy(srv_conn *c);  /* handler thread */
/* An error in the v2 shape {"error": "..."} (server_http.c picks it for /v2 routes). */
char *srv_error_json_v2(const srv_error *e);

/* Waiting on one eventfd and the client socket (server_job.c; embeddings use it too). */
enum { SRV_EV_DATA = 1, SRV_EV_GONE = 2 };
int srv_wait_events(int evfd, srv_conn *c, bool ready);

#endif
