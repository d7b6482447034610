/* `vkinfer serve`: an OpenAI-compatible HTTP server over one engine and one batch manager.
 *
 *   server.c          daemon, routing, bodies, health / models / metrics routes, drain, errors
 *   server_req.c      request JSON -> a job: validation (400s naming the field), sampling,
 *                     stop strings, prompts (text or token ids), chat messages through chat.h
 *   server_job.c      a job's life: submission, the batch manager's callback, waiting for tokens
 *                     or a client that went away, text and logprobs, the JSON / SSE output
 *   server_metrics.c  counters, histograms and the stats-callback gauges, Prometheus text
 *
 * Threading. libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION with
 * poll()). A generation request tokenises its prompt on that thread, submits through the push
 * interface, then blocks in poll() on two descriptors: the job's eventfd (the batch manager's
 * worker writes it after appending tokens) and the client socket (POLLRDHUP: the client closed).
 * Nothing busy-waits; a client that goes away is seen at once, even while its request waits in
 * the queue, and its request is cancelled (freed at the next tick boundary). Cost: one thread
 * (stack SRV_STACK_BYTES) and two descriptors per open connection; the per-connection thread
 * model is what lets a content reader block, which suspend/resume would not (MHD does not watch
 * suspended sockets, so a disconnect would go unseen until the next write).
 *
 * Locks: srv.mu (bm pointer, draining, active count, ids) is never held by the worker thread
 * while it is inside the batch manager, and the worker's callbacks take only job.mu, srv.mu and
 * metrics.mu, each briefly: submit/cancel (srv.mu -> the manager's lock) cannot deadlock with a
 * callback. srv.json_mu serialises cJSON parsing (its parser writes a process-wide error
 * position). */
#ifndef VKI_HOST_SERVER_H
#define VKI_HOST_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "host/chat/chat.h"
#include "host/util/strbuf.h"
#include "vkinfer.h"

#define SRV_STACK_BYTES (512u * 1024u)
#define SRV_MAX_STOPS 16
#define SRV_MAX_STOP_BYTES 512

typedef struct srv srv;

typedef struct srv_params {
    const char *host;           /* address to bind ("127.0.0.1"; "0.0.0.0" or "::" for all) */
    uint16_t port;              /* 8080; 0 = any free port (srv_port) */
    size_t body_limit;          /* request body bytes; larger -> 413. 1 MiB */
    uint32_t max_connections;   /* open connections; more are refused by the listener. 512 */
    uint32_t idle_timeout_s;    /* idle keep-alive connections are closed after this. 60 */
    const char *model_path;     /* the GGUF (its tokenizer.chat_template) */
    const char *model_id;       /* the "model" in responses; NULL: the file name without .gguf */
    const char *chat_template;  /* NULL: recognise the GGUF's template; else a chat family name */
    vki_batch_params batch;
    vki_log_fn log;             /* NULL: stderr */
    void *log_user;
    vki_log_level log_level;    /* VKI_LOG_INFO; DEBUG adds one line per HTTP request */
} srv_params;

srv_params srv_default_params(void);

/* Starts serving e (which must outlive the server). On failure err says why (bad address, port
 * in use, unknown chat template name). */
vki_status srv_create(vki_engine *e, const srv_params *p, srv **out, char *err, size_t n_err);
uint16_t srv_port(const srv *s);
/* Stops accepting connections; new requests on open ones get 503, /health/ready says 503. */
void srv_drain_begin(srv *s);
/* Waits until no generation request is in flight or timeout_s passed; true when idle. */
bool srv_wait_idle(srv *s, double timeout_s);
/* Cancels whatever is still running (each request still gets its final response), waits up to
 * a second for the responses to go out, then stops the daemon and frees everything. */
void srv_destroy(srv *s);

/* ---- internals shared by server*.c ---------------------------------------------------------- */

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
    uint64_t http[8];                 /* responses by status code (srv_metrics.c lists them) */
    uint64_t prompt_tokens, generated_tokens;
    srv_hist ttft, itl, e2e, step;
    /* from the last stats JSON (the last tick with work) */
    bool have_stats;
    double iterations, queue_len, running, kv_max, kv_free, kv_used, kv_cached, kv_reused;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
void srv_metrics_outcome(srv_metrics *m, srv_outcome o);
void srv_metrics_http(srv_metrics *m, unsigned code);
void srv_metrics_observe(srv_metrics *m, srv_hist *h, double seconds);
void srv_metrics_tokens(srv_metrics *m, uint64_t prompt, uint64_t generated);
/* The batch manager's stats JSON of one tick (already parsed). */
void srv_metrics_stats(srv_metrics *m, const cJSON *o);
/* Prometheus text exposition (malloc'd); active = generation requests in flight. */
char *srv_metrics_render(srv_metrics *m, uint32_t active, uint32_t open_requests, bool ready);

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

/* One generation request. Refcounted: the HTTP side, the MHD response (streaming) and the batch
 * manager (from a successful submit to the final response) each hold a reference. */
typedef struct srv_job {
    srv *s;
    pthread_mutex_t mu;
    int evfd;                  /* written by the worker after each response */
    int refs;                  /* under mu */
    uint64_t id;
    char cmpl_id[40];          /* "cmpl-..." / "chatcmpl-..." */
    long long created;
    /* the request */
    bool chat, stream, include_usage, ignore_eos;
    bool want_lp;              /* completions: logprobs != null; chat: logprobs: true */
    uint32_t n_top;            /* alternatives per token */
    uint32_t max_tokens;
    int32_t *prompt;           /* [n_prompt] */
    uint32_t n_prompt;
    vki_sampling_params sampling;
    vki_logit_bias *bias;      /* [sampling.n_logit_bias] */
    char *stops[SRV_MAX_STOPS];
    uint32_t n_stops;
    /* written by the worker thread, under mu */
    int32_t *tok;              /* [max_tokens] generated ids */
    float *lp;                 /* [max_tokens] when want_lp */
    int32_t *top_id;           /* [max_tokens][n_top] */
    float *top_lp;
    uint32_t n_recv;
    bool final;
    vki_finish_reason finish;
    char error[192];
    double t_arrive, t_first, t_last; /* seconds, monotonic */
    /* the HTTP thread's */
    int fd;                    /* the client socket (-1: unknown) */
    bool submitted, final_seen, stop_hit, gone;
    uint32_t n_used;           /* tokens turned into text so far */
    uint32_t n_counted;        /* tokens that count (up to and including a stop string's end) */
    vki_text_stream *ts;
    strbuf text;               /* the whole completion (non-streaming) */
    size_t text_bytes;         /* completion bytes emitted so far (text_offset) */
    cJSON *lp_all;             /* non-streaming logprobs being built */
    strbuf out;                /* streaming: SSE bytes not yet handed to MHD */
    size_t out_pos;
    int phase;                 /* streaming: 0 role chunk due, 1 tokens, 2 done */
    srv_outcome outcome;
    bool counted;              /* outcome recorded in the metrics */
} srv_job;

struct srv {
    srv_params p;
    vki_engine *engine;
    const vki_tokenizer *tok;
    vki_model_info info;
    char model_id[128];
    chat_template chat;
    chat_specials *specials;
    struct MHD_Daemon *d;
    int listen_fd;             /* after srv_drain_begin: the quiesced listening socket (-1 before) */
    uint16_t port;
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* n_active or n_open changed */
    vki_batch_manager *bm;     /* NULL once srv_destroy took it */
    bool draining, device_lost;
    uint32_t n_active;         /* jobs submitted and not yet final */
    uint32_t n_open;           /* HTTP requests between their first callback and completion */
    uint64_t next_id;
    pthread_mutex_t json_mu;
    srv_metrics m;
    long long t_start;         /* unix seconds */
};

double srv_now(void); /* monotonic seconds */
void srv_log(const srv *s, vki_log_level lv, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
cJSON *srv_json_parse(srv *s, const char *body, size_t n, size_t *err_at);

/* server_req.c: a validated job (tokenised prompt, sampling, stops), or false with *e filled. */
bool srv_job_from_json(srv *s, bool chat, const char *body, size_t n, srv_job **out, srv_error *e);

/* server_job.c */
srv_job *srv_job_new(srv *s, bool chat);
void srv_job_ref(srv_job *j);
void srv_job_release(srv_job *j);
/* Submits j; false with *e (429, 400, 503) when it was not queued. */
bool srv_job_submit(srv_job *j, srv_error *e);
/* Cancels j if it is still running (the client went away or a stop string ended it). */
void srv_job_cancel(srv_job *j);
/* The client went away before the answer was complete: cancel, and count the outcome once. */
void srv_job_gone(srv_job *j);
/* Records j->outcome in the metrics (once), before the last bytes go out. */
void srv_job_count(srv_job *j);
/* Non-streaming: waits for the whole answer. Returns the HTTP status and *body (malloc'd JSON);
 * 0 when the client went away (no response is to be sent). */
unsigned srv_job_run_blocking(srv_job *j, char **body);
/* Streaming: MHD's content reader over j (cls = j). */
ssize_t srv_job_sse_reader(void *cls, uint64_t pos, char *buf, size_t max);
void srv_job_sse_free(void *cls);

#endif
