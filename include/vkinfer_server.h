/* vkinfer's HTTP server as a library: the OpenAI routes and the KServe v2 / Triton routes (generate
 * extension, model repository extension, sequences) over several models in one process, each
 * with its own batch manager. Models come from a model repository folder, from the program's own
 * engines (vki_server_add_model), or both. What `vkinfer serve --model-repository` runs.
 *
 * Build: `pkg-config --cflags --libs vkinfer-server`, or CMake's `vkinfer::server` target of
 * find_package(vkinfer) (docs/embed/server.c). libvkinfer_server.a is static only: it uses the
 * runtime's internals, so it links libvkinfer.a (and cJSON, Vulkan, PCRE2, pthread). The core
 * libvkinfer knows nothing of it (tests/exports.sh).
 *
 * Threads: the server's own (one connection thread, handler threads, each model's batch-manager
 * worker). Every function here may be called from any thread but never from a server callback.
 * The library prints nothing: log lines go to params.log. */
#ifndef VKINFER_SERVER_H
#define VKINFER_SERVER_H

#include "vkinfer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct vki_server vki_server;

typedef enum vki_model_control {
    VKI_MODEL_CONTROL_NONE = 0,     /* every repository model loaded at start; no load requests */
    VKI_MODEL_CONTROL_EXPLICIT = 1, /* load_models at start, then load / unload on request */
    VKI_MODEL_CONTROL_POLL = 2,     /* every model at start, then the folder is rescanned */
} vki_model_control;

typedef struct vki_server_params {
    const char *host;               /* "127.0.0.1" */
    uint16_t port;                  /* 8080; 0 = any free port (vki_server_port) */
    const char *const *api_keys;    /* [n_api_keys] bearer tokens; none: no authentication */
    uint32_t n_api_keys;
    uint32_t max_connections;       /* 512 */
    const char *model_repository;   /* a folder (DIR/NAME/model.gguf + config.json, DIR/NAME.gguf),
                                       or NULL: only the models the program adds */
    vki_model_control model_control; /* NONE */
    const char *const *load_models; /* [n_load_models] EXPLICIT: loaded at start ("*" = all) */
    uint32_t n_load_models;
    uint32_t poll_s;                /* POLL: seconds between scans. 15 */
    uint64_t memory_budget;         /* device bytes all repository models share; 0 = no cap */
    vki_engine_params engine;       /* every repository model's engine, before its config.json */
    vki_batch_params batch;         /* every model's batch manager (MAX_UTILIZATION) */
    const char *session_dir;        /* POST /v1/sessions/{id}/save|restore {"filename": NAME} write
                                       and read DIR/NAME (a folder that exists; copied); NULL: those
                                       routes answer 501 */
    vki_log_fn log;                 /* NULL: nothing is logged */
    void *log_user;
    vki_log_level log_level;        /* VKI_LOG_INFO: one line per request */
} vki_server_params;

vki_server_params vki_server_default_params(void);

/* Binds host:port, loads the repository's models (a model that fails is listed UNAVAILABLE with
 * its reason, not fatal) and starts serving. err: an address in use, a folder that cannot be
 * read, a bad parameter. */
vki_status vki_server_create(const vki_server_params *params, vki_server **out, char *err, size_t err_len);
/* Serves engine e (the program's: it must outlive the model's removal or the server) as model
 * `name`, with batch parameters bp (NULL: the server's). VKI_ERR_DUPLICATE_ID: that name is
 * loaded; VKI_ERR_INVALID_ARG: a bad name; the batch manager's error when e already has one. */
vki_status vki_server_add_model(vki_server *s, const char *name, vki_engine *e, const vki_batch_params *bp,
                                char *err, size_t err_len);
/* Unloads a model (repository or added): new requests get 404, running ones finish or end with
 * an error after 30 s. VKI_ERR_NOT_FOUND: no such model. */
vki_status vki_server_remove_model(vki_server *s, const char *name);
uint16_t vki_server_port(const vki_server *s);
/* Stops accepting; waits up to timeout_s for running requests; true when none is left. */
bool vki_server_drain(vki_server *s, double timeout_s);
void vki_server_destroy(vki_server *s); /* cancels what runs; the program's engines stay */

#ifdef __cplusplus
}
#endif

#endif
