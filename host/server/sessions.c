/* Stateful sessions in the server.
 *
 * OpenAI routes: "session_id" (a string or an integer) on a completion or chat request names a
 * conversation; the batch manager keeps the KV of each finished turn pinned for it
 * (host/batch/batch_session.c), so the next turn, which resends the conversation, computes only
 * the new tokens. POST /v1/sessions/{id}/end releases it (idle sessions expire by themselves).
 *
 * KServe v2 (Triton's sequence batcher): parameters sequence_id, sequence_start, sequence_end.
 * A sequence's requests carry only their new text: the server keeps the sequence's tokens
 * (prompt + generated so far) and prepends them, and the KV of those tokens is the session's
 * pinned KV. The first request must say sequence_start (as Triton requires); sequence_end
 * releases the tokens and the KV after that request; a sequence idle past the manager's
 * session_idle_s is forgotten. One request of a sequence at a time.
 *
 * Costs: the token list of each live sequence (4 bytes a token) in host memory; lookups are
 * O(sequences) under the model's sessions lock. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host/server/server.h"

typedef struct srv_seq {
    uint64_t id;
    int32_t *tok;              /* [n] the sequence so far: prompts and generated tokens */
    uint32_t n;
    double t_last;             /* when its last request finished (srv_now) */
    bool busy;                 /* a request of it is running */
    struct srv_seq *next;
} srv_seq;

struct srv_sessions {
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* a sequence's request finished */
    srv_seq *head;
};

static struct srv_sessions *sessions_of(srv *m)
{
    pthread_mutex_lock(&m->mu);
    if (!m->sessions && (m->sessions = calloc(1, sizeof *m->sessions))) {
        pthread_mutex_init(&m->sessions->mu, NULL);
        pthread_cond_init(&m->sessions->cv, NULL);
    }
    struct srv_sessions *ss = m->sessions;
    pthread_mutex_unlock(&m->mu);
    return ss;
}

void srv_sessions_free(struct srv_sessions *ss)
{
    if (!ss)
        return;
    for (srv_seq *q = ss->head, *n; q; q = n) {
        n = q->next;
        free(q->tok);
        free(q);
    }
    pthread_cond_destroy(&ss->cv);
    pthread_mutex_destroy(&ss->mu);
    free(ss);
}

/* A session id from JSON: a positive integer (itself) or a non-empty string (its FNV-1a hash
 * with the top bit set, so strings and numbers do not meet). 0 with *e on a bad value. */
uint64_t srv_session_id(const cJSON *v, const char *name, srv_error *e)
{
    if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 9007199254740992.0 &&
        v->valuedouble == (double)(uint64_t)v->valuedouble)
        return (uint64_t)v->valuedouble;
    if (cJSON_IsString(v) && v->valuestring[0] && strlen(v->valuestring) <= 256) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (const unsigned char *p = (const unsigned char *)v->valuestring; *p; p++)
            h = (h ^ *p) * 0x100000001b3ull;
        return h | (1ull << 63);
    }
    srv_err(e, 400, name, "%s: a positive integer or a non-empty string (<= 256 bytes)", name);
    return 0;
}

bool srv_session_field(srv_job *j, const cJSON *v, srv_error *e)
{
    return (j->session_id = srv_session_id(v, "session_id", e)) != 0;
}

static void end_kv(srv *m, uint64_t id)
{
    pthread_mutex_lock(&m->mu);
    if (m->bm)
        vki_batch_session_end(m->bm, id);
    pthread_mutex_unlock(&m->mu);
}

static srv_seq **find(struct srv_sessions *ss, uint64_t id)
{
    srv_seq **pp = &ss->head;
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->next;
    return pp;
}

static void unlink_free(srv_seq **pp)
{
    srv_seq *q = *pp;
    *pp = q->next;
    free(q->tok);
    free(q);
}

/* Forgets the sequences idle for idle seconds (but keep), as the manager's pins expire. Under
 * ss->mu; O(sequences). */
static void expire(struct srv_sessions *ss, double now, double idle, uint64_t keep)
{
    for (srv_seq **pp = &ss->head; *pp;)
        if (!(*pp)->busy && now - (*pp)->t_last >= idle && (*pp)->id != keep)
            unlink_free(pp);
        else
            pp = &(*pp)->next;
}

bool srv_seq_begin(srv *m, uint64_t id, bool start, int32_t **hist, uint32_t *n, srv_error *e)
{
    *hist = NULL;
    *n = 0;
    struct srv_sessions *ss = sessions_of(m);
    if (!ss)
        return srv_err(e, 500, NULL, "out of memory"), false;
    double now = srv_now(), idle = m->p.batch.session_idle_s;
    pthread_mutex_lock(&ss->mu);
    expire(ss, now, idle, id);
    /* requests of one sequence run one at a time, as Triton's sequence batcher queues them (the
     * previous one's answer may reach the client just before its tokens reach the sequence) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    srv_seq **pp = find(ss, id), *q = *pp;
    while (q && q->busy && pthread_cond_timedwait(&ss->cv, &ss->mu, &ts) == 0) {
        pp = find(ss, id);
        q = *pp;
    }
    bool ok = true;
    if (q && q->busy) {
        ok = false;
        srv_err(e, 400, "sequence_id", "sequence %llu has had a request running for 30 s; send its requests one "
                "at a time", (unsigned long long)id);
    } else if (q && !start && now - q->t_last >= idle) {
        unlink_free(pp);
        q = NULL;
    }
    if (ok && !q && !start) {
        ok = false;
        srv_err(e, 400, "sequence_start", "sequence %llu is not running (expired, ended or never started): its "
                "first request must set sequence_start", (unsigned long long)id);
    }
    if (ok && q && start) { /* a new sequence under an old id */
        free(q->tok);
        q->tok = NULL;
        q->n = 0;
    }
    if (ok && !q && (q = calloc(1, sizeof *q))) {
        q->id = id;
        q->next = ss->head;
        ss->head = q;
    }
    if (ok && !q)
        ok = (srv_err(e, 500, NULL, "out of memory"), false);
    if (ok && q->n && !(*hist = malloc((size_t)q->n * sizeof **hist)))
        ok = (srv_err(e, 500, NULL, "out of memory"), false);
    if (ok) {
        if (q->n)
            memcpy(*hist, q->tok, (size_t)q->n * sizeof **hist);
        *n = q->n;
        q->busy = true;
    }
    pthread_mutex_unlock(&ss->mu);
    if (ok && start)
        end_kv(m, id); /* whatever an old sequence of that id pinned */
    return ok;
}

void srv_seq_finish(srv *m, uint64_t id, const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb, bool ok,
                    bool end)
{
    struct srv_sessions *ss = sessions_of(m);
    if (!ss)
        return;
    pthread_mutex_lock(&ss->mu);
    srv_seq **pp = find(ss, id), *q = *pp;
    int32_t *t = ok && !end && q ? malloc(((size_t)na + nb + 1) * sizeof *t) : NULL;
    if (q && t) {
        memcpy(t, a, (size_t)na * sizeof *t);
        memcpy(t + na, b, (size_t)nb * sizeof *t);
        free(q->tok);
        q->tok = t;
        q->n = na + nb;
    }
    if (q && (end || (ok && !t))) { /* ended, or out of memory: the sequence is over */
        unlink_free(pp);
        end = true;
    } else if (q) { /* a failed request leaves the sequence as it was */
        q->busy = false;
        q->t_last = srv_now();
    }
    pthread_cond_broadcast(&ss->cv);
    pthread_mutex_unlock(&ss->mu);
    if (end)
        end_kv(m, id);
}

/* "/v1/sessions/{id}/{action}": the id's text (<= 256 bytes) and its session id. */
static bool parse_route(const char *path, const char *action, char *idtext, size_t cap, uint64_t *id, srv_error *e)
{
    const char *p = path + strlen("/v1/sessions/");
    size_t n = strlen(p), a = strlen(action);
    if (n <= a + 1 || p[n - a - 1] != '/' || strcmp(p + n - a, action) || n - a - 1 > 256) {
        srv_err(e, 404, NULL, "unknown route: %.200s (POST /v1/sessions/{id}/end, /save or /restore)", path);
        return false;
    }
    snprintf(idtext, cap, "%.*s", (int)(n - a - 1), p);
    bool digits = idtext[0] && strspn(idtext, "0123456789") == strlen(idtext) && strlen(idtext) < 16;
    cJSON *v = digits ? cJSON_CreateNumber(strtod(idtext, NULL)) : cJSON_CreateString(idtext);
    *id = srv_session_id(v, "session_id", e);
    cJSON_Delete(v);
    return *id != 0;
}

bool srv_session_is_file_route(const char *path)
{
    size_t n = strlen(path);
    return (n > 5 && !strcmp(path + n - 5, "/save")) || (n > 8 && !strcmp(path + n - 8, "/restore"));
}

/* POST /v1/sessions/{id}/end ({"model": ...} when several models are loaded). */
void srv_route_session_end(srv_conn *c)
{
    srv_error e;
    char idtext[260];
    uint64_t id;
    if (!parse_route(c->req.path, "end", idtext, sizeof idtext, &id, &e))
        return srv_reply_error(c, &e);
    srv_json_err je;
    cJSON *body = c->req.body.len ? srv_json_parse(c->req.body.p, c->req.body.len, &je) : NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    srv *m = srv_model_acquire(c->s, cJSON_IsString(model) ? model->valuestring : NULL, true, &e);
    cJSON_Delete(body);
    if (!m)
        return srv_reply_error(c, &e);
    struct srv_sessions *ss = sessions_of(m);
    if (ss) {
        pthread_mutex_lock(&ss->mu);
        srv_seq **pp = find(ss, id);
        if (*pp && !(*pp)->busy)
            unlink_free(pp);
        pthread_mutex_unlock(&ss->mu);
    }
    end_kv(m, id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "session_id", idtext);
    cJSON_AddBoolToObject(o, "ended", true);
    srv_model_release(c->s, m);
    srv_reply_json(c, 200, o);
}

/* ---- session files -------------------------------------------------------------------------- */

/* A plain name inside the session folder: letters, digits, '.', '_', '-', not starting with a
 * dot (no "..", no hidden files), no '/' (no other folder, no absolute path). */
static bool plain_name(const char *f)
{
    size_t n = strlen(f);
    return n && n <= 128 && f[0] != '.' &&
           strspn(f, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

/* The request body: {"filename": "...", "model": "..."} (model optional with one model). */
static bool file_body(srv_conn *c, char *filename, size_t cap, char *model, size_t mcap, srv_error *e)
{
    srv_json_err je;
    cJSON *o = srv_json_parse(c->req.body.p ? c->req.body.p : "", c->req.body.len, &je);
    bool ok = o && cJSON_IsObject(o);
    if (!ok)
        srv_err(e, 400, je.key[0] ? je.key : NULL, "invalid JSON body: %s", o ? "not an object" : je.msg);
    for (const cJSON *x = ok ? o->child : NULL; x && ok; x = x->next)
        if (strcmp(x->string, "filename") && strcmp(x->string, "model"))
            ok = (srv_err(e, 400, x->string, "unknown field '%.60s' (filename, model)", x->string), false);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "filename"), *m = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (ok && (!cJSON_IsString(f) || !plain_name(f->valuestring)))
        ok = (srv_err(e, 400, "filename", "filename: a plain file name inside the session folder (letters, digits, "
                      "'.', '_', '-'; not starting with '.'; at most 128 bytes), got %.140s",
                      cJSON_IsString(f) ? f->valuestring : f ? "a non-string" : "nothing"), false);
    if (ok && m && !cJSON_IsString(m))
        ok = (srv_err(e, 400, "model", "model: a string"), false);
    if (ok) {
        snprintf(filename, cap, "%s", f->valuestring);
        snprintf(model, mcap, "%s", m ? m->valuestring : "");
    }
    cJSON_Delete(o);
    return ok;
}

/* A v2 sequence of that id continues from the restored conversation (its requests send only new
 * text): its token list becomes the file's. */
static void seq_restored(srv *m, uint64_t id, const int32_t *tok, uint32_t n)
{
    struct srv_sessions *ss = sessions_of(m);
    int32_t *t = ss && n ? malloc((size_t)n * sizeof *t) : NULL;
    if (!t)
        return;
    memcpy(t, tok, (size_t)n * sizeof *t);
    pthread_mutex_lock(&ss->mu);
    expire(ss, srv_now(), m->p.batch.session_idle_s, id); /* restores alone must not pile sequences up */
    srv_seq **pp = find(ss, id), *q = *pp;
    if (!q && (q = calloc(1, sizeof *q))) {
        q->id = id;
        q->next = ss->head;
        ss->head = q;
    }
    if (q && !q->busy) {
        free(q->tok);
        q->tok = t;
        q->n = n;
        q->t_last = srv_now();
        t = NULL;
    }
    pthread_mutex_unlock(&ss->mu);
    free(t);
}

static unsigned file_http(vki_status st)
{
    switch (st) {
    case VKI_ERR_NOT_FOUND: return 404;
    case VKI_ERR_INVALID_ARG: case VKI_ERR_FORMAT: case VKI_ERR_UNSUPPORTED: return 400;
    case VKI_ERR_OUT_OF_DEVICE_MEMORY: case VKI_ERR_SHUTDOWN: case VKI_ERR_DEVICE_LOST: return 503;
    default: return 500;
    }
}

/* Runs the save or restore on m's manager (held against its destruction: bm_use). */
static vki_status file_call(srv *m, bool save, uint64_t id, const char *path, vki_session_file_info *fi, char *err,
                            size_t cap)
{
    pthread_rwlock_rdlock(&m->bm_use);
    pthread_mutex_lock(&m->mu);
    vki_batch_manager *bm = m->draining || m->device_lost ? NULL : m->bm;
    pthread_mutex_unlock(&m->mu);
    vki_status st = !bm ? VKI_ERR_SHUTDOWN
                  : save ? vki_batch_session_save(bm, id, path, fi, err, cap)
                         : vki_batch_session_restore(bm, id, path, fi, err, cap);
    pthread_rwlock_unlock(&m->bm_use);
    if (!bm)
        snprintf(err, cap, "the model is not serving (shutting down, unloading or recovering from a device loss)");
    return st;
}

/* err names the file by its path inside the server: the client sees its own file name. */
static void hide_dir(char *err, size_t cap, const char *path, const char *filename)
{
    char out[384];
    size_t o = 0, n = strlen(path);
    for (const char *p = err; *p && o + 1 < sizeof out;) {
        if (!strncmp(p, path, n)) {
            o += (size_t)snprintf(out + o, sizeof out - o, "%s", filename);
            p += n;
        } else {
            out[o++] = *p++;
        }
        if (o >= sizeof out)
            o = sizeof out - 1;
    }
    out[o] = 0;
    snprintf(err, cap, "%s", out);
}

/* POST /v1/sessions/{id}/save and /restore with {"filename": ..., "model": ...}: the session's KV
 * to or from a file of --session-dir (llama.cpp's --slot-save-path). A restore also gives a v2
 * sequence of that id its conversation back. Answers the tokens, KV tokens, bytes and ms. */
void srv_route_session_file(srv_conn *c)
{
    srv_error e;
    size_t pl = strlen(c->req.path);
    bool save = pl > 5 && !strcmp(c->req.path + pl - 5, "/save");
    char idtext[260], filename[160], model[160], path[PATH_MAX], err[384] = "";
    uint64_t id;
    if (!parse_route(c->req.path, save ? "save" : "restore", idtext, sizeof idtext, &id, &e))
        return srv_reply_error(c, &e);
    if (!c->s->session_dir) {
        srv_err(&e, 501, NULL, "saving and restoring sessions is off: start the server with --session-dir DIR");
        e.code = "not_implemented";
        return srv_reply_error(c, &e);
    }
    if (!file_body(c, filename, sizeof filename, model, sizeof model, &e))
        return srv_reply_error(c, &e);
    if ((size_t)snprintf(path, sizeof path, "%s/%s", c->s->session_dir, filename) >= sizeof path) {
        srv_err(&e, 400, "filename", "filename: too long for the session folder's path");
        return srv_reply_error(c, &e);
    }
    srv *m = srv_model_acquire(c->s, model[0] ? model : NULL, true, &e);
    if (!m)
        return srv_reply_error(c, &e);
    int32_t *tok = save ? NULL : malloc((size_t)(m->info.n_ctx ? m->info.n_ctx : 1) * sizeof *tok);
    vki_session_file_info fi = {.tokens = tok, .tokens_cap = tok ? m->info.n_ctx : 0};
    vki_status st = file_call(m, save, id, path, &fi, err, sizeof err);
    if (st == VKI_OK && !save)
        seq_restored(m, id, tok, fi.n_tokens < fi.tokens_cap ? fi.n_tokens : fi.tokens_cap);
    free(tok);
    cJSON *o = NULL;
    if (st == VKI_OK) {
        char fp[20];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)fi.fingerprint);
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "session_id", idtext);
        cJSON_AddStringToObject(o, "filename", filename);
        cJSON_AddStringToObject(o, "model", m->model_id);
        cJSON_AddNumberToObject(o, "tokens", fi.n_tokens);
        cJSON_AddNumberToObject(o, "kv_tokens", fi.n_kv_tokens);
        cJSON_AddNumberToObject(o, "bytes", (double)fi.bytes);
        cJSON_AddNumberToObject(o, "ms", fi.ms);
        cJSON_AddStringToObject(o, "fingerprint", fp);
    }
    srv_log(m, st == VKI_OK ? VKI_LOG_INFO : VKI_LOG_WARN, "session %s %s %s: %s", idtext, save ? "save to" : "restore from",
            filename, st == VKI_OK ? "done" : err);
    srv_model_release(c->s, m);
    if (st == VKI_OK)
        return srv_reply_json(c, 200, o);
    hide_dir(err, sizeof err, path, filename);
    srv_err(&e, file_http(st), st == VKI_ERR_NOT_FOUND && !save ? "filename" : NULL, "%s", err);
    srv_reply_error(c, &e);
}
