/* Session files (vkinfer.h, "session files"; the format is docs/session-file.md): the calling
 * thread's side. Save: the worker copies the session's tokens and KV at a tick boundary
 * (batch_session.c), then this thread writes header, tokens, KV and checksum to a temporary file
 * in the target's folder and renames it over the target. Restore: this thread reads and checks
 * the whole file first (magic, version, header checksum, model, layout, counts against the
 * engine, the size the header announces against the file's, the checksum of every byte, every
 * token id), so a bad file never reaches the worker or the pool.
 *
 * Every length read from a file is bounded before it is used: tokens by the backend's context,
 * KV by the pool, and their total must equal the file's size; so a hostile file makes us
 * allocate at most what the pool holds, and only as many bytes as it really has. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/hash.h"
#include "host/batch/batch.h"
#include "host/batch/session_file.h"
#include "shaders/vki_shared.h"


typedef struct sf_header {
    uint32_t version, header_bytes;
    uint64_t fingerprint;
    char name[SF_NAME + 1];
    uint32_t flags;            /* bm_backend.kv_flags of the engine that computed the KV */
    uint32_t n_layer, n_head_kv, head_dim, kv_type, row_bytes, page_size, n_tokens, n_kv;
} sf_header;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static vki_status fail(char *err, size_t cap, vki_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static vki_status fail(char *err, size_t cap, vki_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return st;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

static const char *kv_name(uint32_t t)
{
    return t == VKI_GGML_F32 ? "f32" : t == VKI_GGML_F16 ? "f16" : t == VKI_GGML_Q8_0 ? "q8_0" : "unknown";
}

/* The fields at their offsets (docs/session-file.md), then the header's own checksum. */
static void encode_header(const sf_header *h, uint8_t *raw)
{
    memset(raw, 0, SF_HEADER);
    memcpy(raw, SF_MAGIC, 8);
    put32(raw + 8, h->version);
    put32(raw + 12, h->header_bytes);
    put64(raw + 16, h->fingerprint);
    memcpy(raw + 24, h->name, strnlen(h->name, SF_NAME - 1));
    put32(raw + 84, h->flags);
    const uint32_t f[] = {h->n_layer, h->n_head_kv, h->head_dim, h->kv_type, h->row_bytes, h->page_size,
                          h->n_tokens, h->n_kv};
    for (int i = 0; i < 8; i++)
        put32(raw + 88 + 4 * i, f[i]);
    vki_hash s;
    vki_hash_init(&s, SF_SEED_HEADER);
    vki_hash_update(&s, raw, SF_HEADER - 8);
    put64(raw + SF_HEADER - 8, vki_hash_final(&s));
}

static void decode_header(const uint8_t *raw, sf_header *h)
{
    h->version = get32(raw + 8);
    h->header_bytes = get32(raw + 12);
    h->fingerprint = get64(raw + 16);
    memcpy(h->name, raw + 24, SF_NAME);
    h->name[SF_NAME] = 0;
    h->name[strnlen(h->name, SF_NAME)] = 0;
    for (char *c = h->name; *c; c++) /* shown in messages and JSON: printable ASCII only */
        if (*c < 0x20 || *c > 0x7e)
            *c = '?';
    h->flags = get32(raw + 84);
    uint32_t *f[] = {&h->n_layer, &h->n_head_kv, &h->head_dim, &h->kv_type, &h->row_bytes, &h->page_size,
                     &h->n_tokens, &h->n_kv};
    for (int i = 0; i < 8; i++)
        *f[i] = get32(raw + 88 + 4 * i);
}

/* ---- the worker round trip ------------------------------------------------------------------- */

static vki_status check_args(vki_batch_manager *bm, uint64_t id, const char *path, char *err, size_t cap)
{
    if (!bm)
        return fail(err, cap, VKI_ERR_INVALID_ARG, "batch manager: NULL");
    if (!id)
        return fail(err, cap, VKI_ERR_INVALID_ARG, "session_id: 0 names no session");
    if (!path || !path[0])
        return fail(err, cap, VKI_ERR_INVALID_ARG, "path: empty");
    if (bm_on_worker(bm))
        return fail(err, cap, VKI_ERR_INVALID_ARG, "not from one of the manager's callbacks: the worker that "
                    "copies the KV is the one running the callback");
    if (!bm_kv_token_bytes(&bm->be))
        return fail(err, cap, VKI_ERR_UNSUPPORTED, "this executor cannot copy KV: no session files");
    return VKI_OK;
}

/* Hands j to the worker and waits until it answered. */
static vki_status post(vki_batch_manager *bm, bm_sess_job *j, char *err, size_t cap)
{
    vki_status st = VKI_OK;
    pthread_mutex_lock(&bm->mu);
    if (bm->shutdown) {
        st = fail(err, cap, VKI_ERR_SHUTDOWN, "the batch manager is shutting down");
    } else if (bm->lost) {
        st = fail(err, cap, VKI_ERR_DEVICE_LOST, "the GPU device was lost; the engine must be recovered");
    } else {
        bm_sess_job **tail = &bm->sess_jobs;
        while (*tail)
            tail = &(*tail)->next;
        *tail = j;
        bm->sess_callers++;
        pthread_cond_signal(&bm->cv);
        while (!j->done)
            pthread_cond_wait(&bm->sess_cv, &bm->mu);
        bm->sess_callers--;
        pthread_cond_broadcast(&bm->sess_cv); /* a destroy may wait for the last caller */
    }
    pthread_mutex_unlock(&bm->mu);
    if (st == VKI_OK && (st = j->st) != VKI_OK)
        snprintf(err, cap, "%s", j->err);
    return st;
}

/* ---- save ------------------------------------------------------------------------------------- */

static bool write_hashed(FILE *f, const void *p, size_t n, vki_hash *h)
{
    vki_hash_update(h, p, n);
    return !n || fwrite(p, 1, n, f) == n;
}

static bool write_tokens(FILE *f, const int32_t *t, uint32_t n, vki_hash *h)
{
    uint8_t buf[4096];
    for (uint32_t i = 0; i < n; i += 1024) {
        uint32_t m = n - i < 1024 ? n - i : 1024;
        for (uint32_t k = 0; k < m; k++)
            put32(buf + 4 * k, (uint32_t)t[i + k]);
        if (!write_hashed(f, buf, 4 * (size_t)m, h))
            return false;
    }
    return true;
}

/* header, tokens, KV, checksum -> a temporary file next to path, synced, renamed over it when complete. */
static vki_status write_file(const char *path, const bm_backend *be, const bm_sess_job *j, uint64_t *bytes,
                             char *err, size_t cap)
{
    sf_header h = {.version = SF_VERSION, .header_bytes = SF_HEADER, .fingerprint = be->fingerprint,
                   .n_layer = be->kv_layers, .n_head_kv = be->kv_heads, .head_dim = be->kv_head_dim,
                   .kv_type = be->kv_type, .row_bytes = be->kv_row_bytes, .page_size = be->page_size,
                   .flags = be->kv_flags,
                   .n_tokens = j->n_tokens, .n_kv = j->n_kv};
    snprintf(h.name, sizeof h.name, "%s", be->model_name ? be->model_name : "");
    size_t n = strlen(path);
    char *tmp = malloc(n + 8);
    if (!tmp)
        return fail(err, cap, VKI_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    snprintf(tmp, n + 8, "%s.XXXXXX", path);
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0)
            close(fd), unlink(tmp);
        free(tmp);
        return fail(err, cap, VKI_ERR_IO, "cannot write %s: %s", path, strerror(e));
    }
    uint8_t raw[SF_HEADER], sum[8];
    encode_header(&h, raw);
    vki_hash s;
    vki_hash_init(&s, SF_SEED_FILE);
    uint64_t kv_bytes = (uint64_t)j->n_kv * bm_kv_token_bytes(be);
    bool ok = write_hashed(f, raw, SF_HEADER, &s) && write_tokens(f, j->tokens, j->n_tokens, &s) &&
              write_hashed(f, j->kv, (size_t)kv_bytes, &s);
    put64(sum, vki_hash_final(&s));
    /* on disk before the rename: a crash leaves the old file or the whole new one, never a torn one */
    ok = ok && fwrite(sum, 1, 8, f) == 8 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok)
        unlink(tmp);
    free(tmp);
    if (!ok)
        return fail(err, cap, VKI_ERR_IO, "cannot write %s: %s", path, strerror(e ? e : EIO));
    *bytes = SF_HEADER + 4ull * j->n_tokens + kv_bytes + 8;
    return VKI_OK;
}

/* ---- restore ---------------------------------------------------------------------------------- */

/* The file's model and KV layout against the backend's. */
static vki_status check_model(const sf_header *h, const bm_backend *be, const char *path, char *err, size_t cap)
{
    if (h->fingerprint != be->fingerprint)
        return fail(err, cap, VKI_ERR_INVALID_ARG, "%s is from another model: '%s' (fingerprint %016llx); this "
                    "engine runs '%s' (fingerprint %016llx)", path, h->name, (unsigned long long)h->fingerprint,
                    be->model_name ? be->model_name : "", (unsigned long long)be->fingerprint);
    if (h->kv_type != be->kv_type)
        return fail(err, cap, VKI_ERR_INVALID_ARG, "%s holds %s KV; this engine stores %s (kv_type)", path,
                    kv_name(h->kv_type), kv_name(be->kv_type));
    if ((h->flags ^ be->kv_flags) & BM_KV_ROPE_LONG)
        return fail(err, cap, VKI_ERR_INVALID_ARG, "%s: its KV was computed with LongRoPE's %s factors, this engine "
                    "uses the %s ones (the context length decides: --ctx)", path,
                    h->flags & BM_KV_ROPE_LONG ? "long" : "short", be->kv_flags & BM_KV_ROPE_LONG ? "long" : "short");
    if (h->flags != be->kv_flags)
        return fail(err, cap, VKI_ERR_INVALID_ARG, "%s: its K was stored %s the RoPE attention factor, this engine "
                    "stores it %s (a file of an older vkinfer: save the session again)", path,
                    h->flags & BM_KV_ROPE_MAG ? "scaled by" : "without",
                    be->kv_flags & BM_KV_ROPE_MAG ? "scaled" : "unscaled");
    if (h->n_layer != be->kv_layers || h->n_head_kv != be->kv_heads || h->head_dim != be->kv_head_dim ||
        h->row_bytes != be->kv_row_bytes)
        return fail(err, cap, VKI_ERR_INVALID_ARG, "%s: KV layout %u layers x %u heads x %u dims (%u-byte rows); this "
                    "engine has %u x %u x %u (%u)", path, h->n_layer, h->n_head_kv, h->head_dim, h->row_bytes,
                    be->kv_layers, be->kv_heads, be->kv_head_dim, be->kv_row_bytes);
    return VKI_OK;
}

/* Everything the header says, checked before any of it is used; *body: bytes after the header. */
static vki_status check_header(const uint8_t *raw, const bm_backend *be, uint64_t size, const char *path,
                               sf_header *h, char *err, size_t cap)
{
    if (memcmp(raw, SF_MAGIC, 8))
        return fail(err, cap, VKI_ERR_FORMAT, "%s is not a vkinfer session file (no VKISESS magic)", path);
    decode_header(raw, h);
    if (h->version != SF_VERSION)
        return fail(err, cap, VKI_ERR_UNSUPPORTED, "%s is a session file of format version %u; this build reads "
                    "version %u", path, h->version, SF_VERSION);
    vki_hash s;
    vki_hash_init(&s, SF_SEED_HEADER);
    vki_hash_update(&s, raw, SF_HEADER - 8);
    if (h->header_bytes != SF_HEADER || vki_hash_final(&s) != get64(raw + SF_HEADER - 8))
        return fail(err, cap, VKI_ERR_FORMAT, "%s: the header is corrupted (checksum)", path);
    vki_status st = check_model(h, be, path, err, cap);
    if (st != VKI_OK)
        return st;
    if (!h->n_tokens || h->n_tokens > be->max_ctx)
        return fail(err, cap, VKI_ERR_INVALID_ARG, "%s holds %u tokens; this engine's context is %u", path,
                    h->n_tokens, be->max_ctx);
    if (h->n_kv > h->n_tokens || h->n_kv / be->page_size > be->n_pages)
        return fail(err, cap, VKI_ERR_FORMAT, "%s: KV of %u tokens for a conversation of %u (pool of %u pages)",
                    path, h->n_kv, h->n_tokens, be->n_pages);
    uint64_t want = SF_HEADER + 4ull * h->n_tokens + (uint64_t)h->n_kv * bm_kv_token_bytes(be) + 8;
    if (size != want)
        return fail(err, cap, VKI_ERR_FORMAT, "%s is %s: %llu bytes, its header announces %llu", path,
                    size < want ? "truncated" : "longer than its contents", (unsigned long long)size,
                    (unsigned long long)want);
    return VKI_OK;
}

static bool read_hashed(FILE *f, void *p, size_t n, vki_hash *h)
{
    if (n && fread(p, 1, n, f) != n)
        return false;
    vki_hash_update(h, p, n);
    return true;
}

/* Tokens and the KV of the whole pages this engine keeps; the rest of the KV only hashed. */
static vki_status read_body(FILE *f, const bm_backend *be, const sf_header *h, vki_hash *s, bm_sess_job *j,
                            const char *path, char *err, size_t cap)
{
    uint64_t tb = bm_kv_token_bytes(be);
    uint32_t keep = h->n_kv / be->page_size * be->page_size;
    j->tokens = malloc((size_t)h->n_tokens * sizeof *j->tokens);
    j->kv = malloc((size_t)keep * tb + 1);
    if (!j->tokens || !j->kv)
        return fail(err, cap, VKI_ERR_OUT_OF_HOST_MEMORY, "out of host memory for %s", path);
    bool ok = read_hashed(f, j->tokens, 4 * (size_t)h->n_tokens, s) && read_hashed(f, j->kv, (size_t)keep * tb, s);
    uint8_t buf[16384], sum[8];
    for (uint64_t left = (uint64_t)(h->n_kv - keep) * tb; ok && left;) {
        size_t m = left < sizeof buf ? (size_t)left : sizeof buf;
        ok = read_hashed(f, buf, m, s);
        left -= m;
    }
    if (!ok || fread(sum, 1, 8, f) != 8)
        return fail(err, cap, VKI_ERR_IO, "cannot read %s: %s", path, ferror(f) ? strerror(errno) : "it got shorter");
    uint64_t got = vki_hash_final(s);
    if (got != get64(sum))
        return fail(err, cap, VKI_ERR_FORMAT, "%s is corrupted: checksum %016llx, its contents hash to %016llx", path,
                    (unsigned long long)get64(sum), (unsigned long long)got);
    for (uint32_t i = 0; i < h->n_tokens; i++) {
        int32_t t = (int32_t)get32((const uint8_t *)&j->tokens[i]);
        if (t < 0 || (uint32_t)t >= be->vocab_size)
            return fail(err, cap, VKI_ERR_FORMAT, "%s: token %d at position %u is outside the vocabulary (%u)", path,
                        t, i, be->vocab_size);
        j->tokens[i] = t;
    }
    j->n_tokens = h->n_tokens;
    j->n_kv = keep;
    return VKI_OK;
}

static vki_status read_file(const char *path, const bm_backend *be, bm_sess_job *j, sf_header *h, uint64_t *size,
                            char *err, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, cap, errno == ENOENT ? VKI_ERR_NOT_FOUND : VKI_ERR_IO, "cannot open %s: %s", path,
                    strerror(errno));
    struct stat sb;
    uint8_t raw[SF_HEADER];
    vki_status st = VKI_OK;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode))
        st = fail(err, cap, VKI_ERR_IO, "%s is not a regular file", path);
    *size = st == VKI_OK ? (uint64_t)sb.st_size : 0;
    if (st == VKI_OK && (*size < SF_HEADER + 8 || fread(raw, 1, SF_HEADER, f) != SF_HEADER))
        st = fail(err, cap, VKI_ERR_FORMAT, "%s is not a vkinfer session file (%llu bytes, less than a header)", path,
                  (unsigned long long)*size);
    if (st == VKI_OK)
        st = check_header(raw, be, *size, path, h, err, cap);
    vki_hash s;
    vki_hash_init(&s, SF_SEED_FILE);
    vki_hash_update(&s, raw, SF_HEADER);
    if (st == VKI_OK)
        st = read_body(f, be, h, &s, j, path, err, cap);
    fclose(f);
    return st;
}

/* ---- the calls ------------------------------------------------------------------------------ */

static vki_status session_file(vki_batch_manager *bm, bool restore, uint64_t session_id, const char *path,
                               vki_session_file_info *info, char *err, size_t cap)
{
    double t0 = now_ms();
    char scratch[8];
    if (!err || !cap) {
        err = scratch;
        cap = sizeof scratch;
    }
    err[0] = 0;
    bm_sess_job j = {.restore = restore, .session_id = session_id};
    sf_header h = {0};
    uint64_t bytes = 0;
    vki_status st = check_args(bm, session_id, path, err, cap);
    if (st == VKI_OK && restore) /* the whole file is checked before the worker sees any of it */
        st = read_file(path, &bm->be, &j, &h, &bytes, err, cap);
    if (st == VKI_OK)
        st = post(bm, &j, err, cap);
    if (st == VKI_OK && !restore)
        st = write_file(path, &bm->be, &j, &bytes, err, cap);
    if (st == VKI_OK && info) {
        uint32_t n = restore && info->tokens ? (info->tokens_cap < j.n_tokens ? info->tokens_cap : j.n_tokens) : 0;
        if (n)
            memcpy(info->tokens, j.tokens, (size_t)n * sizeof *j.tokens);
        info->n_tokens = j.n_tokens;
        info->n_kv_tokens = j.n_kv;
        info->bytes = bytes;
        info->fingerprint = restore ? h.fingerprint : bm->be.fingerprint;
        info->ms = now_ms() - t0;
    }
    free(j.tokens);
    free(j.kv);
    return st;
}

vki_status vki_batch_session_save(vki_batch_manager *bm, uint64_t session_id, const char *path,
                                  vki_session_file_info *info, char *err, size_t err_cap)
{
    return session_file(bm, false, session_id, path, info, err, err_cap);
}

vki_status vki_batch_session_restore(vki_batch_manager *bm, uint64_t session_id, const char *path,
                                     vki_session_file_info *info, char *err, size_t err_cap)
{
    return session_file(bm, true, session_id, path, info, err, err_cap);
}
