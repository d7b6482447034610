/* A model repository: several models in one server, each its own engine and batch manager on the
 * same device, as Triton serves a folder of models.
 *
 *   DIR/NAME/model.gguf (+ DIR/NAME/config.json)   or   DIR/NAME.gguf   or, split by llama.cpp's
 *   gguf-split, DIR/NAME-00001-of-0000N.gguf ... (the model NAME, opened by its first part)
 *
 * config.json (every key optional; an unknown key makes the model UNAVAILABLE, naming it):
 *   kv_tokens, kv_fraction, device_memory_mib, max_ctx, max_seqs      the engine
 *   max_batch_size, max_num_tokens, max_queue, policy                 the batch manager
 *   chat_template                                                     a chat family name
 *   instance_count                                                    must be 1 (see README)
 *
 * Memory: the models share memory_budget (--device-memory). A load gets the budget left as its
 * engine's device_memory_limit (or its device_memory_mib when that fits), and is charged what
 * its engine then holds (vki_model_info.device_bytes); one that does not fit fails with the
 * sizes in its reason and nothing that is serving is touched. Loads and unloads run one at a
 * time (load_mu) so two cannot both take the same megabytes.
 *
 * Life of a model: UNAVAILABLE -> LOADING -> READY -> UNLOADING -> UNAVAILABLE. Requests borrow a
 * READY model's srv with a reference (srv_model_acquire); an unload refuses new requests (503),
 * gives running ones unload_timeout_s to finish, cancels the rest (each gets its final response),
 * waits for the handlers to let go, then frees the engine. Other models are never paused. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "host/server/server.h"

#define REPO_MAX 64          /* models listed in one repository */
#define MIB (1024.0 * 1024.0)

typedef enum mstate { M_UNAVAILABLE, M_LOADING, M_READY, M_UNLOADING } mstate;
static const char *const STATE_NAMES[] = {"UNAVAILABLE", "LOADING", "READY", "UNLOADING"};

typedef struct repo_model {
    char name[128];
    char path[PATH_MAX];     /* the GGUF */
    char cfg[PATH_MAX];      /* config.json, "" when the model has none */
    mstate state;
    char reason[512];        /* why UNAVAILABLE ("" = never loaded) */
    srv *m;                  /* READY / UNLOADING: the model's server */
    vki_engine *e;
    uint64_t bytes;          /* device memory charged to the budget */
    int refs;                /* handlers using m (under repo.mu) */
    time_t mtime;            /* of the GGUF when it was loaded (POLL) */
    bool present;            /* seen by the last scan */
    bool external;           /* the program's engine (srv_repo_add_engine): never destroyed here */
} repo_model;

struct srv_repo {
    srv_repo_params p;
    char *dir;
    srv_params sp;           /* what every model's srv starts from (the front's, no socket) */
    pthread_mutex_t mu;      /* the table, states, refs, used */
    pthread_cond_t cv;       /* refs changed */
    pthread_mutex_t load_mu; /* one load or unload at a time */
    repo_model *models[REPO_MAX];
    uint32_t n;
    uint64_t used;           /* bytes charged to the budget */
    pthread_t poller;
    bool poller_started;
    bool stop;               /* under mu: the poller ends */
    pthread_cond_t stop_cv;
};

srv_repo_params srv_repo_default_params(void)
{
    return (srv_repo_params){.control = SRV_CONTROL_NONE, .poll_s = 15, .unload_timeout_s = 30,
                             .engine = vki_engine_default_params()};
}

static void repo_log(const struct srv_repo *r, vki_log_level lv, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void repo_log(const struct srv_repo *r, vki_log_level lv, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    srv_logv(&r->sp, lv, fmt, ap);
    va_end(ap);
}

/* ---- the folder ------------------------------------------------------------------------------ */

static repo_model *find(struct srv_repo *r, const char *name)
{
    for (uint32_t i = 0; i < r->n; i++)
        if (!strcmp(r->models[i]->name, name))
            return r->models[i];
    return NULL;
}

static bool valid_name(const char *n)
{
    if (!n[0] || n[0] == '.' || strlen(n) >= 128)
        return false;
    for (const char *p = n; *p; p++)
        if (*p == '/' || (unsigned char)*p < 0x20 || *p == '"' || *p == '\\')
            return false;
    return true;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(repo_model *const *)a)->name, (*(repo_model *const *)b)->name);
}

/* The part number k of a split model's file name NAME-0000k-of-0000N.gguf (llama.cpp's
 * gguf-split naming, 20 characters after NAME), or 0 for any other name. */
static unsigned split_part(const char *ent, size_t n)
{
    if (n <= 20)
        return 0;
    const char *s = ent + n - 20;
    if (s[0] != '-' || memcmp(s + 6, "-of-", 4) || strcmp(s + 15, ".gguf"))
        return 0;
    unsigned k = 0;
    for (int i = 1; i <= 14; i++) {
        if (i >= 6 && i <= 9)
            continue;
        if (s[i] < '0' || s[i] > '9')
            return 0;
        if (i <= 5)
            k = 10 * k + (unsigned)(s[i] - '0');
    }
    return k;
}

/* One folder entry: a model (path and config set), or false. A model split in several files is
 * one entry, NAME, opened by its first part; the other parts are not models. */
static bool entry_model(const char *dir, const char *ent, char *name, char *path, char *cfg)
{
    char full[PATH_MAX];
    struct stat st;
    if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, ent) >= sizeof full || stat(full, &st))
        return false;
    size_t n = strlen(ent);
    if (S_ISREG(st.st_mode) && n > 5 && !strcmp(ent + n - 5, ".gguf")) {
        unsigned part = split_part(ent, n);
        if (part > 1)
            return false;
        snprintf(name, 128, "%.*s", (int)(n - (part ? 20 : 5)), ent);
        snprintf(path, PATH_MAX, "%s", full);
        cfg[0] = 0;
        return valid_name(name);
    }
    if (!S_ISDIR(st.st_mode) || !valid_name(ent))
        return false;
    memcpy(name, ent, n + 1); /* valid_name: n < 128 */
    if ((size_t)snprintf(path, PATH_MAX, "%s/model.gguf", full) >= PATH_MAX)
        return false;
    if ((size_t)snprintf(cfg, PATH_MAX, "%s/config.json", full) >= PATH_MAX || access(cfg, F_OK))
        cfg[0] = 0;
    return true; /* a folder without model.gguf is listed, UNAVAILABLE, with that reason */
}

/* Rescans the folder (under mu): new models are added UNAVAILABLE, present marks the rest. */
static vki_status scan(struct srv_repo *r, char *err, size_t n_err)
{
    if (!r->dir)
        return VKI_OK; /* models added by the program only */
    DIR *d = opendir(r->dir);
    if (!d) {
        snprintf(err, n_err, "--model-repository %s: %s", r->dir, strerror(errno));
        return VKI_ERR_IO;
    }
    for (uint32_t i = 0; i < r->n; i++)
        r->models[i]->present = false;
    struct dirent *de;
    char name[128], path[PATH_MAX], cfg[PATH_MAX];
    while ((de = readdir(d))) {
        if (!entry_model(r->dir, de->d_name, name, path, cfg))
            continue;
        repo_model *m = find(r, name);
        if (!m && r->n < REPO_MAX && (m = calloc(1, sizeof *m))) {
            snprintf(m->name, sizeof m->name, "%s", name);
            r->models[r->n++] = m;
        }
        if (!m)
            continue; /* past REPO_MAX: the log says so below */
        if (m->state == M_UNAVAILABLE) {
            snprintf(m->path, sizeof m->path, "%s", path);
            snprintf(m->cfg, sizeof m->cfg, "%s", cfg);
        }
        m->present = true;
    }
    closedir(d);
    qsort(r->models, r->n, sizeof r->models[0], by_name);
    if (r->n == REPO_MAX)
        repo_log(r, VKI_LOG_WARN, "model repository %s: only the first %d models are listed", r->dir, REPO_MAX);
    return VKI_OK;
}

/* ---- config.json ---------------------------------------------------------------------------- */

static bool cfg_num(const cJSON *v, double lo, double hi, double *out, char *err, size_t n_err)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(err, n_err, "config.json: \"%s\" must be a number in [%g, %g]", v->string, lo, hi);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

/* One key of config.json into the engine, manager or server parameters. */
static bool cfg_key(const cJSON *v, vki_engine_params *ep, srv_params *sp, uint64_t *want_bytes, char *err,
                    size_t n_err)
{
    const char *k = v->string;
    double x = 0;
    if (!strcmp(k, "chat_template") || !strcmp(k, "policy")) {
        if (!cJSON_IsString(v))
            return snprintf(err, n_err, "config.json: \"%s\" must be a string", k), false;
        if (!strcmp(k, "chat_template")) {
            sp->chat_template = v->valuestring; /* checked by the model's setup_chat */
            return true;
        }
        const char *s = v->valuestring;
        sp->batch.policy = !strcmp(s, "max-util") ? VKI_POLICY_MAX_UTILIZATION
                         : !strcmp(s, "guaranteed") ? VKI_POLICY_GUARANTEED_NO_EVICT : VKI_POLICY_STATIC;
        if (strcmp(s, "max-util") && strcmp(s, "guaranteed") && strcmp(s, "static"))
            return snprintf(err, n_err, "config.json: \"policy\" is max-util, guaranteed or static"), false;
        return true;
    }
    static const struct {
        const char *key;
        double lo, hi;
    } NUMS[] = {{"kv_tokens", 1, 1u << 30},     {"kv_fraction", 0.01, 1},     {"device_memory_mib", 1, 1u << 24},
                {"max_ctx", 1, 1u << 24},       {"max_seqs", 1, 1u << 16},    {"max_batch_size", 1, 1u << 20},
                {"max_num_tokens", 1, 1u << 24}, {"max_queue", 0, INT32_MAX}, {"instance_count", 1, 1}};
    size_t i = 0;
    while (i < sizeof NUMS / sizeof NUMS[0] && strcmp(NUMS[i].key, k))
        i++;
    if (i == sizeof NUMS / sizeof NUMS[0])
        return snprintf(err, n_err, "config.json: unknown key \"%.64s\"", k), false;
    if (!cfg_num(v, NUMS[i].lo, NUMS[i].hi, &x, err, n_err))
        return false;
    switch (i) {
    case 0: ep->kv_tokens = (uint64_t)x; break;
    case 1: ep->kv_fraction = (float)x; break;
    case 2: *want_bytes = (uint64_t)x << 20; break;
    case 3: ep->max_ctx = (uint32_t)x; break;
    case 4: ep->max_seqs = (uint32_t)x; break;
    case 5: sp->batch.max_batch_size = (uint32_t)x; break;
    case 6: sp->batch.max_num_tokens = (uint32_t)x; break;
    case 7: sp->batch.max_queue = (uint32_t)x; break;
    default: break; /* instance_count: 1 (one engine per model) */
    }
    return true;
}

/* Reads m's config.json (if any) over the defaults; *root keeps the strings sp points to. */
static bool read_config(const repo_model *m, vki_engine_params *ep, srv_params *sp, uint64_t *want_bytes,
                        cJSON **root, char *err, size_t n_err)
{
    *root = NULL;
    if (!m->cfg[0])
        return true;
    FILE *f = fopen(m->cfg, "rb");
    strbuf b = {0};
    char buf[4096];
    size_t got;
    while (f && (got = fread(buf, 1, sizeof buf, f)) > 0 && b.len < (1u << 20))
        if (!strbuf_put(&b, buf, got))
            break;
    if (f)
        fclose(f);
    if (!f) {
        snprintf(err, n_err, "config.json: cannot read it: %s", strerror(errno));
        return false;
    }
    srv_json_err je;
    cJSON *o = srv_json_parse(b.p ? b.p : "", b.len, &je);
    strbuf_free(&b);
    if (!o || !cJSON_IsObject(o)) {
        snprintf(err, n_err, "config.json: %s", o ? "not a JSON object" : je.msg);
        cJSON_Delete(o);
        return false;
    }
    for (const cJSON *v = o->child; v; v = v->next)
        if (!cfg_key(v, ep, sp, want_bytes, err, n_err)) {
            cJSON_Delete(o);
            return false;
        }
    *root = o;
    return true;
}

/* ---- load and unload ----------------------------------------------------------------------- */

/* The engine limit for a load: the budget left, or the model's own size when that fits. */
static bool budget_for(struct srv_repo *r, const repo_model *m, uint64_t want, uint64_t *limit, char *err,
                       size_t n_err)
{
    *limit = want;
    if (!r->p.memory_budget)
        return true;
    pthread_mutex_lock(&r->mu);
    uint64_t left = r->used < r->p.memory_budget ? r->p.memory_budget - r->used : 0;
    pthread_mutex_unlock(&r->mu);
    if (want > left || !left) {
        snprintf(err, n_err, "'%s' does not fit: it asks for %.1f MiB and %.1f MiB of the %.1f MiB device memory "
                 "budget are left (the loaded models hold %.1f MiB)", m->name, want / MIB, left / MIB,
                 r->p.memory_budget / MIB, r->used / MIB);
        return false;
    }
    *limit = want ? want : left;
    return true;
}

/* Creates m's engine and server (load_mu held, m LOADING). */
static bool load_model(struct srv_repo *r, repo_model *m, char *err, size_t n_err)
{
    if (m->external)
        return snprintf(err, n_err, "'%s' was added by the program: it adds it again", m->name), false;
    vki_engine_params ep = r->p.engine;
    srv_params sp = r->sp;
    sp.model_path = m->path;
    sp.model_id = m->name;
    uint64_t want = ep.device_memory_limit, limit = 0;
    cJSON *cfg = NULL;
    struct stat st;
    if (stat(m->path, &st))
        return snprintf(err, n_err, "%.300s: %s", m->path, strerror(errno)), false;
    if (!read_config(m, &ep, &sp, &want, &cfg, err, n_err))
        return false;
    bool ok = budget_for(r, m, want, &limit, err, n_err);
    ep.device_memory_limit = limit;
    char eerr[400] = "";
    vki_engine *e = NULL;
    vki_status s = ok ? vki_engine_create(m->path, &ep, &e, eerr, sizeof eerr) : VKI_OK;
    if (ok && s != VKI_OK) {
        ok = false;
        if (s == VKI_ERR_OUT_OF_DEVICE_MEMORY && r->p.memory_budget)
            snprintf(err, n_err, "'%s' does not fit in the %.1f MiB of device memory left to it (budget %.1f MiB): %s",
                     m->name, limit / MIB, r->p.memory_budget / MIB, eerr[0] ? eerr : vki_status_str(s));
        else
            snprintf(err, n_err, "cannot load %.200s: %s", m->path, eerr[0] ? eerr : vki_status_str(s));
    }
    srv *ms = NULL;
    if (ok && (s = srv_model_create(e, &sp, &ms, eerr, sizeof eerr)) != VKI_OK) {
        snprintf(err, n_err, "%s", eerr[0] ? eerr : vki_status_str(s));
        vki_engine_destroy(e);
        ok = false;
    }
    cJSON_Delete(cfg);
    if (!ok)
        return false;
    ms->p.model_path = m->path; /* the copy of sp pointed into cfg for chat_template: done with */
    ms->p.model_id = m->name;
    ms->p.chat_template = NULL;
    pthread_mutex_lock(&r->mu);
    m->e = e;
    m->m = ms;
    m->bytes = ms->info.device_bytes;
    m->mtime = st.st_mtime;
    r->used += m->bytes;
    m->state = M_READY;
    m->reason[0] = 0;
    pthread_mutex_unlock(&r->mu);
    repo_log(r, VKI_LOG_INFO, "model '%s' ready: %.1f MiB of device memory (weights %.1f, KV %.1f for %u tokens), "
             "context %u", m->name, m->bytes / MIB, ms->info.weight_bytes / MIB, ms->info.kv_bytes / MIB,
             ms->info.kv_pages * ms->info.page_size, ms->info.n_ctx);
    return true;
}

static uint32_t model_active(srv *ms)
{
    pthread_mutex_lock(&ms->mu);
    uint32_t n = ms->n_active;
    pthread_mutex_unlock(&ms->mu);
    return n;
}

/* Unloads m (load_mu held, m READY): see the file comment. */
static void unload_model(struct srv_repo *r, repo_model *m, const char *why)
{
    pthread_mutex_lock(&r->mu);
    m->state = M_UNLOADING;
    srv *ms = m->m;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&ms->mu);
    ms->draining = true;
    pthread_mutex_unlock(&ms->mu);
    double end = srv_now() + r->p.unload_timeout_s;
    while (model_active(ms) && srv_now() < end)
        usleep(10 * 1000);
    srv_recover_stop(ms); /* no engine recovery may start a manager behind the unload */
    pthread_mutex_lock(&ms->mu);
    vki_batch_manager *bm = ms->bm;
    ms->bm = NULL;
    pthread_mutex_unlock(&ms->mu);
    vki_batch_manager_destroy(bm, true); /* what is left ends cancelled, each with its final answer */
    pthread_mutex_lock(&r->mu);
    while (m->refs)
        pthread_cond_wait(&r->cv, &r->mu);
    m->m = NULL;
    vki_engine *e = m->e;
    m->e = NULL;
    r->used -= m->bytes;
    m->bytes = 0;
    m->state = M_UNAVAILABLE;
    snprintf(m->reason, sizeof m->reason, "%s", why);
    pthread_mutex_unlock(&r->mu);
    srv_model_destroy(ms);
    if (!m->external)
        vki_engine_destroy(e);
    repo_log(r, VKI_LOG_INFO, "model '%s' unloaded (%s)", m->name, why);
}

/* Loads a model by name (rescanning first, so a model added since is found). */
static bool repo_load(struct srv_repo *r, const char *name, srv_error *e)
{
    char err[640] = "";
    pthread_mutex_lock(&r->load_mu);
    pthread_mutex_lock(&r->mu);
    vki_status st = scan(r, err, sizeof err);
    repo_model *m = st == VKI_OK ? find(r, name) : NULL;
    bool loaded = m && m->state == M_READY;
    if (m && !loaded)
        m->state = M_LOADING;
    pthread_mutex_unlock(&r->mu);
    bool ok = loaded;
    if (m && !loaded && !(ok = load_model(r, m, err, sizeof err))) {
        pthread_mutex_lock(&r->mu);
        m->state = M_UNAVAILABLE;
        snprintf(m->reason, sizeof m->reason, "%.500s", err);
        pthread_mutex_unlock(&r->mu);
        repo_log(r, VKI_LOG_WARN, "model '%s' not loaded: %s", name, err);
    }
    pthread_mutex_unlock(&r->load_mu);
    if (!m && st == VKI_OK)
        srv_err(e, 404, "model", "no model '%.128s' in the repository %.256s", name, r->dir);
    else if (!ok)
        srv_err(e, 400, "model", "%s", err); /* Triton answers a failed load with 400 */
    return ok;
}

static bool repo_unload(struct srv_repo *r, const char *name, srv_error *e)
{
    pthread_mutex_lock(&r->load_mu);
    pthread_mutex_lock(&r->mu);
    repo_model *m = find(r, name);
    bool ready = m && m->state == M_READY;
    pthread_mutex_unlock(&r->mu);
    if (ready)
        unload_model(r, m, "unloaded on request");
    pthread_mutex_unlock(&r->load_mu);
    if (!m)
        srv_err(e, 404, "model", "no model '%.128s' in the repository %.256s", name, r->dir);
    return m != NULL; /* unloading a model that is not loaded does nothing, as Triton */
}

/* POLL: new or changed GGUFs are (re)loaded, removed ones unloaded. */
static void poll_once(struct srv_repo *r)
{
    char err[256];
    pthread_mutex_lock(&r->load_mu);
    pthread_mutex_lock(&r->mu);
    vki_status st = scan(r, err, sizeof err);
    uint32_t n = r->n;
    pthread_mutex_unlock(&r->mu);
    for (uint32_t i = 0; st == VKI_OK && i < n; i++) {
        repo_model *m = r->models[i]; /* only this thread and load_mu holders change the table */
        if (m->external)
            continue;
        struct stat s;
        bool have = m->present && !stat(m->path, &s);
        if (m->state == M_READY && (!have || s.st_mtime != m->mtime))
            unload_model(r, m, have ? "changed on disk: reloading" : "removed from the repository");
        if (have && m->state == M_UNAVAILABLE && (m->mtime != s.st_mtime || !m->reason[0])) {
            m->mtime = s.st_mtime; /* a file that failed is retried once it changes */
            pthread_mutex_unlock(&r->load_mu);
            srv_error e;
            repo_load(r, m->name, &e);
            pthread_mutex_lock(&r->load_mu);
        }
    }
    pthread_mutex_unlock(&r->load_mu);
}

static void *poller_main(void *arg)
{
    struct srv_repo *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += r->p.poll_s;
        while (!r->stop && pthread_cond_timedwait(&r->stop_cv, &r->mu, &ts) == 0)
            ;
        if (r->stop)
            break;
        pthread_mutex_unlock(&r->mu);
        poll_once(r);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- creation ------------------------------------------------------------------------------- */

static bool wanted_at_start(const struct srv_repo *r, const char *name)
{
    if (r->p.control != SRV_CONTROL_EXPLICIT)
        return true;
    for (uint32_t i = 0; i < r->p.n_load_models; i++)
        if (!strcmp(r->p.load_models[i], "*") || !strcmp(r->p.load_models[i], name))
            return true;
    return false;
}

static struct srv_repo *repo_new(const srv_params *p, const srv_repo_params *rp)
{
    struct srv_repo *r = calloc(1, sizeof *r);
    if (!r || (rp->dir && !(r->dir = strdup(rp->dir)))) {
        free(r);
        return NULL;
    }
    r->p = *rp;
    r->sp = *p;
    r->sp.listen_fd = -1;
    r->sp.session_dir = NULL; /* the front's copy serves the session file routes of every model */
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->load_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_cond_init(&r->stop_cv, &ca);
    pthread_condattr_destroy(&ca);
    return r;
}

vki_status srv_create_repo(const srv_params *p, const srv_repo_params *rp, srv **out, char *err, size_t n_err)
{
    *out = NULL;
    struct srv_repo *r = rp ? repo_new(p, rp) : NULL;
    vki_status st = !rp ? VKI_ERR_INVALID_ARG : r ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK && rp->control == SRV_CONTROL_POLL && (!rp->poll_s || !rp->dir))
        st = VKI_ERR_INVALID_ARG;
    if (st == VKI_OK) {
        pthread_mutex_lock(&r->mu);
        st = scan(r, err, n_err);
        pthread_mutex_unlock(&r->mu);
    }
    for (uint32_t i = 0; st == VKI_OK && i < rp->n_load_models; i++)
        if (strcmp(rp->load_models[i], "*") && !find(r, rp->load_models[i])) {
            snprintf(err, n_err, "--load-model %s: no such model in %s", rp->load_models[i], rp->dir);
            st = VKI_ERR_INVALID_ARG;
        }
    for (uint32_t i = 0; st == VKI_OK && i < r->n; i++) {
        srv_error e;
        if (wanted_at_start(r, r->models[i]->name))
            repo_load(r, r->models[i]->name, &e); /* a failure is the model's, not the server's */
    }
    r->p.load_models = NULL; /* the caller's list: used only at start */
    r->p.n_load_models = 0;
    if (st == VKI_OK)
        st = srv_front_create(p, r, out, err, n_err);
    else if (p->listen_fd >= 0)
        close(p->listen_fd);
    if (st != VKI_OK) {
        srv_repo_free(r);
        return st;
    }
    if (rp->control == SRV_CONTROL_POLL && !pthread_create(&r->poller, NULL, poller_main, r))
        r->poller_started = true;
    return VKI_OK;
}

/* ---- requests ------------------------------------------------------------------------------ */

/* "a, b, c": the READY models (under mu). */
static void ready_names(const struct srv_repo *r, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = 0;
    for (uint32_t i = 0; i < r->n && o + 1 < cap; i++)
        if (r->models[i]->state == M_READY)
            o += (size_t)snprintf(out + o, cap - o, "%s'%s'", o ? ", " : "", r->models[i]->name);
    if (!o)
        snprintf(out, cap, "none");
}

srv *srv_model_acquire(srv *s, const char *name, bool strict, srv_error *e)
{
    if (!s->repo) {
        if (strict && name && name[0] && strcmp(name, s->model_id)) {
            srv_err(e, 404, "model", "the model '%.200s' does not exist; this server has '%s'", name, s->model_id);
            e->code = "model_not_found";
            return NULL;
        }
        return s;
    }
    struct srv_repo *r = s->repo;
    char names[384];
    repo_model *hit = NULL;
    pthread_mutex_lock(&r->mu);
    ready_names(r, names, sizeof names);
    if (!name || !name[0]) {
        uint32_t n_ready = 0;
        for (uint32_t i = 0; i < r->n; i++)
            if (r->models[i]->state == M_READY && !n_ready++)
                hit = r->models[i];
        if (n_ready != 1) {
            hit = NULL;
            srv_err(e, n_ready ? 400 : 404, "model", n_ready ? "\"model\" is required: this server has %s"
                    : "no model is loaded (%s)", names);
        }
    } else if (!(hit = find(r, name)) || hit->state == M_UNAVAILABLE) {
        srv_err(e, 404, "model", "the model '%.128s' is not loaded%s%.200s; this server has %s", name,
                hit && hit->reason[0] ? ": " : "", hit ? hit->reason : "", names);
        hit = NULL;
    } else if (hit->state != M_READY) {
        srv_err(e, 503, "model", "the model '%.128s' is %s", name, hit->state == M_LOADING ? "loading" : "unloading");
        hit = NULL;
    }
    if (hit)
        hit->refs++;
    pthread_mutex_unlock(&r->mu);
    if (!hit && e->http == 404)
        e->code = "model_not_found";
    return hit ? hit->m : NULL;
}

void srv_model_release(srv *s, srv *m)
{
    if (!s->repo || !m)
        return;
    struct srv_repo *r = s->repo;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->n; i++)
        if (r->models[i]->m == m) {
            r->models[i]->refs--;
            pthread_cond_broadcast(&r->cv);
        }
    pthread_mutex_unlock(&r->mu);
}

uint32_t srv_models_ready(srv *s, srv **out, uint32_t cap)
{
    if (!s->repo) {
        out[0] = s;
        return cap ? 1 : 0;
    }
    struct srv_repo *r = s->repo;
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->n && n < cap; i++)
        if (r->models[i]->state == M_READY) {
            r->models[i]->refs++;
            out[n++] = r->models[i]->m;
        }
    pthread_mutex_unlock(&r->mu);
    return n;
}

void srv_models_done(srv *s, srv *const *m, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        srv_model_release(s, m[i]);
}

void srv_repo_models(srv_conn *c)
{
    struct srv_repo *r = c->s->repo;
    cJSON *o = cJSON_CreateObject(), *data;
    cJSON_AddStringToObject(o, "object", "list");
    data = cJSON_AddArrayToObject(o, "data");
    pthread_mutex_lock(&r->mu); /* a READY model's srv is freed only after it leaves READY */
    for (uint32_t i = 0; i < r->n; i++)
        if (r->models[i]->state == M_READY)
            cJSON_AddItemToArray(data, srv_model_object(r->models[i]->m));
    pthread_mutex_unlock(&r->mu);
    srv_reply_json(c, 200, o);
}

void srv_repo_model(srv_conn *c, const char *id)
{
    srv_error e;
    srv *m = srv_model_acquire(c->s, id, true, &e);
    if (!m)
        return srv_reply_error(c, &e);
    srv_reply_json(c, 200, srv_model_object(m));
    srv_model_release(c->s, m);
}

/* ---- the model repository extension (kserve.c's routes) -------------------------------------- */

cJSON *srv_repo_index(srv *s, bool ready_only)
{
    cJSON *a = cJSON_CreateArray();
    if (!s->repo) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", s->model_id);
        cJSON_AddStringToObject(o, "version", "1");
        cJSON_AddStringToObject(o, "state", "READY");
        cJSON_AddStringToObject(o, "reason", "");
        cJSON_AddItemToArray(a, o);
        return a;
    }
    struct srv_repo *r = s->repo;
    pthread_mutex_lock(&r->load_mu); /* a scan moves entries */
    pthread_mutex_lock(&r->mu);
    char err[256];
    scan(r, err, sizeof err);
    for (uint32_t i = 0; i < r->n; i++) {
        const repo_model *m = r->models[i];
        if (ready_only && m->state != M_READY)
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", m->name);
        cJSON_AddStringToObject(o, "version", "1");
        cJSON_AddStringToObject(o, "state", STATE_NAMES[m->state]);
        cJSON_AddStringToObject(o, "reason", m->state == M_UNAVAILABLE ? m->reason : "");
        cJSON_AddItemToArray(a, o);
    }
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->load_mu);
    return a;
}

/* Model control on request: EXPLICIT only (Triton's rule: NONE and POLL refuse it). */
static bool control_allowed(srv *s, srv_error *e)
{
    if (!s->repo)
        return srv_err(e, 400, NULL, "model control needs a model repository (vkinfer serve --model-repository DIR "
                       "--model-control explicit)"), false;
    if (s->repo->p.control != SRV_CONTROL_EXPLICIT)
        return srv_err(e, 400, NULL, "explicit model load / unload is not allowed in model control mode %s (start "
                       "with --model-control explicit)", s->repo->p.control == SRV_CONTROL_POLL ? "poll" : "none"),
               false;
    return true;
}

bool srv_repo_load(srv *s, const char *name, srv_error *e) { return control_allowed(s, e) && repo_load(s->repo, name, e); }

bool srv_repo_unload(srv *s, const char *name, srv_error *e)
{
    return control_allowed(s, e) && repo_unload(s->repo, name, e);
}

/* READY, LOADING, ... of a model by name; NULL: not in the repository. reason: why UNAVAILABLE. */
const char *srv_repo_state(srv *s, const char *name, char *reason, size_t n_reason)
{
    reason[0] = 0;
    if (!s->repo)
        return strcmp(name, s->model_id) ? NULL : "READY";
    pthread_mutex_lock(&s->repo->mu);
    const repo_model *m = find(s->repo, name);
    const char *st = m ? STATE_NAMES[m->state] : NULL;
    if (m)
        snprintf(reason, n_reason, "%s", m->reason);
    pthread_mutex_unlock(&s->repo->mu);
    return st;
}

/* ---- server life cycle ------------------------------------------------------------------------ */

/* Every READY model, each with a reference (release with srv_model_release). */
static uint32_t take_all(struct srv_repo *r, srv **ms, const char **names)
{
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->n; i++)
        if (r->models[i]->state == M_READY || r->models[i]->state == M_UNLOADING) {
            r->models[i]->refs++;
            names[n] = r->models[i]->name;
            ms[n++] = r->models[i]->m;
        }
    pthread_mutex_unlock(&r->mu);
    return n;
}

char *srv_repo_metrics(srv *s, const srv_gauges *g)
{
    srv *ms[REPO_MAX];
    const char *names[REPO_MAX];
    srv_metrics *mm[REPO_MAX];
    srv_gauges mg[REPO_MAX];
    uint32_t n = take_all(s->repo, ms, names);
    for (uint32_t i = 0; i < n; i++) {
        pthread_mutex_lock(&ms[i]->mu);
        mg[i] = (srv_gauges){.active = ms[i]->n_active, .ready = !ms[i]->draining && !ms[i]->device_lost};
        pthread_mutex_unlock(&ms[i]->mu);
        mm[i] = &ms[i]->m;
    }
    char *text = srv_metrics_render_models(&s->m, g, mm, names, mg, n);
    for (uint32_t i = 0; i < n; i++)
        srv_model_release(s, ms[i]);
    return text;
}

uint32_t srv_repo_active(struct srv_repo *r)
{
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->n; i++)
        if (r->models[i]->m)
            n += model_active(r->models[i]->m); /* model mu inside repo mu: never the other way */
    pthread_mutex_unlock(&r->mu);
    return n;
}

static void stop_poller(struct srv_repo *r)
{
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->stop_cv);
    pthread_mutex_unlock(&r->mu);
    if (r->poller_started)
        pthread_join(r->poller, NULL);
    r->poller_started = false;
}

void srv_repo_drain(struct srv_repo *r)
{
    stop_poller(r);
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->n; i++)
        if (r->models[i]->m) {
            pthread_mutex_lock(&r->models[i]->m->mu);
            r->models[i]->m->draining = true;
            pthread_mutex_unlock(&r->models[i]->m->mu);
        }
    pthread_mutex_unlock(&r->mu);
}

bool srv_repo_wait_idle(struct srv_repo *r, double timeout_s)
{
    double end = srv_now() + timeout_s;
    uint32_t n;
    while ((n = srv_repo_active(r)) && srv_now() < end)
        usleep(10 * 1000);
    return n == 0;
}

void srv_repo_stop(struct srv_repo *r)
{
    stop_poller(r);
    pthread_mutex_lock(&r->load_mu); /* a load or unload in progress finishes first */
    for (uint32_t i = 0; i < r->n; i++) {
        srv *ms = r->models[i]->m;
        if (!ms)
            continue;
        pthread_mutex_lock(&ms->mu);
        vki_batch_manager *bm = ms->bm;
        ms->bm = NULL;
        ms->draining = true;
        pthread_mutex_unlock(&ms->mu);
        vki_batch_manager_destroy(bm, true);
    }
    pthread_mutex_unlock(&r->load_mu);
}

void srv_repo_free(struct srv_repo *r)
{
    if (!r)
        return;
    stop_poller(r);
    for (uint32_t i = 0; i < r->n; i++) {
        srv_model_destroy(r->models[i]->m);
        if (!r->models[i]->external)
            vki_engine_destroy(r->models[i]->e);
        free(r->models[i]);
    }
    pthread_cond_destroy(&r->stop_cv);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->load_mu);
    pthread_mutex_destroy(&r->mu);
    free(r->dir);
    free(r);
}

/* ---- models the program brings (vkinfer_server.h) ------------------------------------------------ */

vki_status srv_repo_add_engine(srv *s, const char *name, vki_engine *e, const vki_batch_params *bp, char *err,
                               size_t n_err)
{
    struct srv_repo *r = s->repo;
    if (!r || !e || !name || !valid_name(name))
        return snprintf(err, n_err, "add a model: %s", !r ? "not a multi-model server" : "a name ([^/\"\\], < 128 "
                        "bytes, not starting with '.') and an engine are needed"), VKI_ERR_INVALID_ARG;
    srv_params sp = r->sp;
    sp.model_path = NULL;
    sp.model_id = name;
    if (bp)
        sp.batch = *bp;
    pthread_mutex_lock(&r->load_mu);
    pthread_mutex_lock(&r->mu);
    repo_model *m = find(r, name);
    vki_status st = m && m->state != M_UNAVAILABLE ? VKI_ERR_DUPLICATE_ID : !m && r->n == REPO_MAX ? VKI_ERR_INVALID_ARG
                  : VKI_OK;
    if (st == VKI_OK && !m && (m = calloc(1, sizeof *m))) {
        snprintf(m->name, sizeof m->name, "%s", name);
        r->models[r->n++] = m;
        qsort(r->models, r->n, sizeof r->models[0], by_name);
    }
    if (st == VKI_OK && !m)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK)
        m->state = M_LOADING;
    pthread_mutex_unlock(&r->mu);
    srv *ms = NULL;
    if (st == VKI_OK && (st = srv_model_create(e, &sp, &ms, err, n_err)) == VKI_OK) {
        ms->p.model_id = m->name;
        pthread_mutex_lock(&r->mu);
        m->external = true;
        m->path[0] = m->cfg[0] = 0;
        m->e = e;
        m->m = ms;
        m->state = M_READY;
        m->reason[0] = 0;
        pthread_mutex_unlock(&r->mu); /* the program's engine is not charged to the budget */
    } else if (m && st != VKI_ERR_DUPLICATE_ID) {
        pthread_mutex_lock(&r->mu);
        m->state = M_UNAVAILABLE;
        snprintf(m->reason, sizeof m->reason, "%s", err);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&r->load_mu);
    if (st == VKI_ERR_DUPLICATE_ID)
        snprintf(err, n_err, "a model named '%s' is already loaded", name);
    else if (st == VKI_ERR_INVALID_ARG && !err[0])
        snprintf(err, n_err, "at most %d models", REPO_MAX);
    return st;
}

vki_status srv_repo_remove(srv *s, const char *name)
{
    if (!s->repo)
        return VKI_ERR_INVALID_ARG;
    srv_error e;
    return repo_unload(s->repo, name, &e) ? VKI_OK : VKI_ERR_NOT_FOUND;
}
