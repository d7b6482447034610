/* Session files (host/batch/batch_session_file.c) from hostile bytes: vki_batch_session_restore
 * must answer with a status and a message, never crash, read outside its buffers, leak, or
 * allocate more than the pool holds (libFuzzer's -malloc_limit_mb catches a huge allocation).
 *
 * A random file stops at the magic or a checksum, so the input edits a valid file saved at start
 * and may forge both checksums afterwards (a forged file passes them: the checks behind them, on
 * counts, sizes, layout and token ids, are what it reaches):
 *   byte 0: bit 0 = recompute the header and file checksums after the edits;
 *           bit 1 = cut the file to the length in bytes 1-2 (little-endian, modulo its length + 1);
 *   then 3-byte edits: an offset (u16, modulo the length) and a byte XORed into it.
 * The executor is a stand-in without a GPU: a vocabulary of 64, one layer and one head of 16-byte
 * rows, 16 pages of 4 tokens, steps that sample a function of the position, KV copies that are
 * memcpy into its own pool. Every restore goes into session 2 (replacing the previous one). */
#include "fuzz.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "engine/hash.h"
#include "host/batch/batch.h"
#include "host/batch/session_file.h"

#define PAGES 16
#define PS 4
#define TB 32 /* KV bytes a token: 1 layer x K, V x 1 head x 16 */

static uint8_t g_pool[PAGES * PS * TB];
static vki_batch_manager *g_bm;
static uint8_t *g_base;       /* the valid file */
static size_t g_base_n;
static char g_path[64];

static vki_status st_step(void *ctx, const vki_step_plan *plan, vki_step_out *outs)
{
    (void)ctx;
    uint32_t k = 0;
    for (uint32_t i = 0; i < plan->n_seqs; i++)
        if (plan->seqs[i].want_token)
            outs[k++] = (vki_step_out){.slot = plan->seqs[i].slot,
                                       .token = (int32_t)(1 + (plan->seqs[i].pos0 + plan->seqs[i].n_new) % 63)};
    return VKI_OK;
}

static vki_status st_kv(const uint32_t *pages, uint32_t n, uint8_t *host, bool read)
{
    for (uint32_t i = 0; i < n; i++) {
        FUZZ_CHECK(pages[i] < PAGES);
        uint8_t *page = g_pool + (size_t)pages[i] * PS * TB;
        memcpy(read ? host + (size_t)i * PS * TB : page, read ? page : host + (size_t)i * PS * TB, PS * TB);
    }
    return VKI_OK;
}

static vki_status st_read(void *ctx, const uint32_t *pages, uint32_t n, void *dst)
{
    (void)ctx;
    return st_kv(pages, n, dst, true);
}

static vki_status st_write(void *ctx, const uint32_t *pages, uint32_t n, const void *src)
{
    (void)ctx;
    return st_kv(pages, n, (uint8_t *)(uintptr_t)src, false);
}

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static bool g_done;

static void on_resp(void *user, const vki_response *r)
{
    (void)user;
    pthread_mutex_lock(&g_mu);
    g_done |= r->final;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void remove_file(void) { remove(g_path); }

/* The manager, one finished request of session 1 (10 + 6 tokens: KV of 3 pages), its file. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    snprintf(g_path, sizeof g_path, "/tmp/vki_fuzz_session_%d", (int)getpid());
    atexit(remove_file);
    bm_backend be = {.max_seqs = 2, .n_pages = PAGES, .page_size = PS, .max_ctx = 64, .vocab_size = 64,
                     .step = st_step, .fingerprint = 0x5eed, .model_name = "fuzz", .kv_layers = 1, .kv_heads = 1,
                     .kv_head_dim = 4, .kv_type = 0, .kv_row_bytes = 16, .kv_read = st_read, .kv_write = st_write};
    vki_batch_params p = vki_batch_default_params();
    p.chunk_size = 8;
    p.session_max_blocks = PAGES;
    FUZZ_CHECK(bm_create(&be, &p, NULL, &g_bm) == VKI_OK);
    int32_t prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    vki_request q = {.id = 1, .prompt = prompt, .n_prompt = 10, .max_new_tokens = 6, .ignore_eos = true,
                     .sampling = vki_sampling_default_params(), .session_id = 1};
    q.sampling.temperature = 0;
    FUZZ_CHECK(vki_batch_submit(g_bm, &q, on_resp, NULL, NULL, 0) == VKI_OK);
    pthread_mutex_lock(&g_mu);
    while (!g_done)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    char err[256];
    FUZZ_CHECK(vki_batch_session_save(g_bm, 1, g_path, NULL, err, sizeof err) == VKI_OK);
    FILE *f = fopen(g_path, "rb");
    FUZZ_CHECK(f != NULL);
    g_base = malloc(4096);
    g_base_n = fread(g_base, 1, 4096, f);
    fclose(f);
    FUZZ_CHECK(g_base_n == SF_HEADER + 16 * 4 + 12 * TB + 8);
    return 0;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t hash_of(uint64_t seed, const uint8_t *p, size_t n)
{
    vki_hash s;
    vki_hash_init(&s, seed);
    vki_hash_update(&s, p, n);
    return vki_hash_final(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_bm)
        LLVMFuzzerInitialize(NULL, NULL);
    uint8_t file[4096];
    size_t n = g_base_n;
    memcpy(file, g_base, n);
    uint8_t flags = size ? data[0] : 0;
    for (size_t i = 3; i + 3 <= size; i += 3)
        file[(data[i] | (size_t)data[i + 1] << 8) % n] ^= data[i + 2];
    if ((flags & 2) && size >= 3)
        n = (data[1] | (size_t)data[2] << 8) % (n + 1);
    if ((flags & 1) && n >= SF_HEADER + 8) {
        put64(file + SF_HEADER - 8, hash_of(SF_SEED_HEADER, file, SF_HEADER - 8));
        put64(file + n - 8, hash_of(SF_SEED_FILE, file, n - 8));
    }
    FILE *f = fopen(g_path, "wb");
    FUZZ_CHECK(f && fwrite(file, 1, n, f) == n);
    fclose(f);
    int32_t tok[80];
    vki_session_file_info fi = {.tokens = tok, .tokens_cap = 80};
    char err[256] = "";
    vki_status st = vki_batch_session_restore(g_bm, 2, g_path, &fi, err, sizeof err);
    if (st != VKI_OK) {
        FUZZ_CHECK(memchr(err, 0, sizeof err) && err[0]); /* a refusal always says why */
        return 0;
    }
    FUZZ_CHECK(fi.n_tokens >= 1 && fi.n_tokens <= 64 && fi.n_kv_tokens <= fi.n_tokens && fi.n_kv_tokens % PS == 0);
    for (uint32_t i = 0; i < fi.n_tokens; i++)
        FUZZ_CHECK(tok[i] >= 0 && tok[i] < 64);
    return 0;
}
