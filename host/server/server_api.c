/* include/vkinfer_server.h over the server's internals (server.h, repo.c). */
#include <stdio.h>
#include <stdlib.h>

#include "host/server/server.h"
#include "vkinfer_server.h"

struct vki_server {
    srv *s;
};

vki_server_params vki_server_default_params(void)
{
    srv_params p = srv_default_params();
    srv_repo_params rp = srv_repo_default_params();
    return (vki_server_params){.host = p.host, .port = p.port, .max_connections = p.max_connections,
                               .model_control = VKI_MODEL_CONTROL_NONE, .poll_s = rp.poll_s, .engine = rp.engine,
                               .batch = p.batch, .log_level = VKI_LOG_INFO};
}

/* The library prints nothing: without a log callback the server's lines go nowhere. */
static void no_log(void *user, vki_log_level lv, const char *msg) { (void)user, (void)lv, (void)msg; }

vki_status vki_server_create(const vki_server_params *vp, vki_server **out, char *err, size_t err_len)
{
    char scratch[8];
    if (!err || !err_len) {
        err = scratch;
        err_len = sizeof scratch;
    }
    *out = NULL;
    if (!vp || (unsigned)vp->model_control > VKI_MODEL_CONTROL_POLL)
        return snprintf(err, err_len, "bad parameters"), VKI_ERR_INVALID_ARG;
    vki_server *v = calloc(1, sizeof *v);
    if (!v)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    srv_params p = srv_default_params();
    p.host = vp->host;
    p.port = vp->port;
    p.api_keys = vp->api_keys;
    p.n_api_keys = vp->n_api_keys;
    p.max_connections = vp->max_connections;
    p.batch = vp->batch;
    p.session_dir = vp->session_dir;
    p.log = vp->log ? vp->log : no_log;
    p.log_user = vp->log_user;
    p.log_level = vp->log_level;
    srv_repo_params rp = srv_repo_default_params();
    rp.dir = vp->model_repository;
    rp.control = (srv_model_control)vp->model_control;
    rp.load_models = vp->load_models;
    rp.n_load_models = vp->n_load_models;
    rp.poll_s = vp->poll_s;
    rp.memory_budget = vp->memory_budget;
    rp.engine = vp->engine;
    vki_status st = srv_create_repo(&p, &rp, &v->s, err, err_len);
    if (st != VKI_OK) {
        free(v);
        return st;
    }
    *out = v;
    return VKI_OK;
}

vki_status vki_server_add_model(vki_server *v, const char *name, vki_engine *e, const vki_batch_params *bp,
                                char *err, size_t err_len)
{
    char scratch[8];
    if (!err || !err_len) {
        err = scratch;
        err_len = sizeof scratch;
    }
    err[0] = 0;
    return v ? srv_repo_add_engine(v->s, name, e, bp, err, err_len) : VKI_ERR_INVALID_ARG;
}

vki_status vki_server_remove_model(vki_server *v, const char *name)
{
    return v && name ? srv_repo_remove(v->s, name) : VKI_ERR_INVALID_ARG;
}

uint16_t vki_server_port(const vki_server *v) { return v ? srv_port(v->s) : 0; }

bool vki_server_drain(vki_server *v, double timeout_s)
{
    if (!v)
        return true;
    srv_drain_begin(v->s);
    return srv_wait_idle(v->s, timeout_s);
}

void vki_server_destroy(vki_server *v)
{
    if (!v)
        return;
    srv_destroy(v->s);
    free(v);
}
