/* Device layer: open/close, sub-allocator, staging transfers, dispatch-path checks, the
 * validation counter itself, and the add kernel against its reference. */
#include "support/vt.h"

#include "engine/ops_matmul.h"
#include "engine/pool.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_info_sane(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    const vki_device_info *in = &g->dev->info;
    assert_true(in->name[0]);
    assert_true(in->subgroup_size >= 1);
    assert_true(in->max_storage_buffer_range >= (1u << 20));
    assert_true(in->push_descriptor);
    assert_true(in->max_push_constants_size >= VKI_MAX_PUSH);
    vt_assert_clean(g);
}

/* Many buffers of odd sizes: all distinct ranges, data round-trips, freeing and reallocating
 * reuses space (the block count stays bounded). */
static void test_suballocator_roundtrip(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("suballocator");
    enum { N = 64 };
    vkd_buffer *b[N];
    uint8_t *data[N];
    size_t sz[N];
    for (int i = 0; i < N; i++) {
        sz[i] = vt_range(&r, 1, 200000);
        data[i] = malloc(sz[i]);
        for (size_t j = 0; j < sz[i]; j++)
            data[i][j] = (uint8_t)vt_u64(&r);
        assert_int_equal(vkd_buffer_create(g->dev, sz[i], (i & 1) ? VKD_MEM_HOST : VKD_MEM_DEVICE, "t", &b[i]), VKI_OK);
        assert_int_equal(vkd_upload(g->dev, b[i], 0, data[i], sz[i]), VKI_OK);
    }
    for (int i = 0; i < N; i++) {
        uint8_t *back = malloc(sz[i]);
        assert_int_equal(vkd_download(g->dev, b[i], 0, back, sz[i]), VKI_OK);
        assert_memory_equal(back, data[i], sz[i]);
        free(back);
        for (int j = 0; j < i; j++) /* same block => disjoint ranges */
            if (b[j]->block == b[i]->block)
                assert_true(b[j]->mem_off + b[j]->mem_size <= b[i]->mem_off ||
                            b[i]->mem_off + b[i]->mem_size <= b[j]->mem_off);
    }
    VkDeviceSize before = g->dev->bytes_allocated[VKD_MEM_DEVICE];
    for (int i = 0; i < N; i += 2)
        vkd_buffer_destroy(g->dev, b[i]);
    assert_true(g->dev->bytes_allocated[VKD_MEM_DEVICE] < before);
    for (int i = 0; i < N; i += 2)
        assert_int_equal(vkd_buffer_create(g->dev, sz[i], VKD_MEM_DEVICE, "t2", &b[i]), VKI_OK);
    for (int i = 0; i < N; i++) {
        vkd_buffer_destroy(g->dev, b[i]);
        free(data[i]);
    }
    assert_int_equal(g->dev->bytes_allocated[VKD_MEM_DEVICE], 0);
    vt_assert_clean(g);
}

/* A transfer larger than the staging ring is chunked correctly. */
static void test_staging_chunks(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    size_t n = g->dev->staging->size * 2 + 12;
    uint32_t *src = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n / 4; i++)
        src[i] = (uint32_t)(i * 2654435761u);
    vkd_buffer *b;
    assert_int_equal(vkd_buffer_create(g->dev, n, VKD_MEM_DEVICE, "big", &b), VKI_OK);
    assert_int_equal(vkd_upload(g->dev, b, 0, src, n), VKI_OK);
    assert_int_equal(vkd_download(g->dev, b, 0, back, n), VKI_OK);
    assert_memory_equal(src, back, n);
    assert_int_equal(vkd_fill(g->dev, b, 8, 16, 0xdeadbeefu), VKI_OK);
    assert_int_equal(vkd_download(g->dev, b, 0, back, 32), VKI_OK);
    assert_int_equal(back[1], src[1]);
    assert_int_equal(back[2], 0xdeadbeefu);
    assert_int_equal(back[5], 0xdeadbeefu);
    assert_int_equal(back[6], src[6]);
    assert_int_equal(vkd_upload(g->dev, b, n - 4, src, 8), VKI_ERR_INVALID_ARG); /* out of bounds */
    vkd_buffer_destroy(g->dev, b);
    free(src);
    free(back);
    vt_assert_clean(g);
}

/* The fill callback of vkd_upload_fill: unit-sized records, each its index in the upload
 * written into every word (so a record in the wrong place shows). Called from several threads
 * at once while streaming with load threads: the log is atomic, and `ordered` (each call starts
 * where the one before ended) holds only for one thread. */
typedef struct fill_log {
    uint32_t unit;
    atomic_uint calls;
    atomic_bool whole, ordered; /* every call of whole units; in order */
    atomic_uint_fast64_t last_end, bytes;
} fill_log;

static void fill_log_init(fill_log *f, uint32_t unit)
{
    f->unit = unit;
    atomic_init(&f->calls, 0);
    atomic_init(&f->whole, true);
    atomic_init(&f->ordered, true);
    atomic_init(&f->last_end, 0);
    atomic_init(&f->bytes, 0);
}

static void fill_records(void *ctx, uint64_t at, void *out, uint64_t n)
{
    fill_log *f = ctx;
    if (at % f->unit || n % f->unit || !n)
        atomic_store(&f->whole, false);
    if (atomic_exchange(&f->last_end, at + n) != at)
        atomic_store(&f->ordered, false);
    atomic_fetch_add(&f->calls, 1);
    atomic_fetch_add(&f->bytes, n);
    for (uint64_t i = 0; i < n / 4; i++)
        ((uint32_t *)out)[i] = (uint32_t)((at + 4 * i) / f->unit) * 2654435761u;
}

static void staging_stream_with(vt_gpu *g)
{
    const uint32_t unit = 3 * 4096 + 4; /* does not divide a slot: chunks end short of it */
    const uint64_t n = 2 * g->dev->staging->size / unit * unit + 5 * unit; /* 4 chunks and more */
    const uint32_t threads = g->dev->load_threads;
    vkd_buffer *b[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(vkd_buffer_create(g->dev, n, VKD_MEM_DEVICE, "stream", &b[i]), VKI_OK);
    vkd_staging_stream(g->dev, true);
    assert_int_equal(vk_pool_threads(g->dev->load_pool), threads);
    fill_log f[3];
    for (int i = 0; i < 3; i++) {
        fill_log_init(&f[i], unit);
        assert_int_equal(vkd_upload_fill(g->dev, b[i], 0, n, unit, fill_records, &f[i]), VKI_OK);
        assert_true(atomic_load(&f[i].whole));
        assert_int_equal(atomic_load(&f[i].bytes), n); /* every byte once: no run twice, none lost */
        if (threads == 1)
            assert_true(atomic_load(&f[i].ordered) && atomic_load(&f[i].calls) == 5);
        else /* 4 full chunks in three runs each, the fifth too short to split */
            assert_int_equal(atomic_load(&f[i].calls), 4 * threads + 1);
    }
    vkd_buffer_destroy(g->dev, b[2]); /* its copies may still run: destroy waits */
    uint32_t *back = malloc(n), *want = malloc(n);
    fill_log w;
    fill_log_init(&w, unit);
    fill_records(&w, 0, want, n);
    assert_int_equal(vkd_download(g->dev, b[0], 0, back, n), VKI_OK);
    assert_memory_equal(back, want, n);
    assert_int_equal(vkd_upload_fill(g->dev, b[1], unit, 2 * unit, unit, fill_records, &w), VKI_OK);
    assert_int_equal(vkd_staging_flush(g->dev), VKI_OK);
    vkd_staging_stream(g->dev, false);
    assert_int_equal(vkd_download(g->dev, b[1], 0, back, n), VKI_OK);
    assert_memory_equal(back, want, unit); /* record 0 as first uploaded */
    assert_memory_equal((char *)back + unit, want, 2 * unit); /* records 0, 1 of the second upload */
    assert_memory_equal((char *)back + 3 * unit, (char *)want + 3 * unit, n - 3 * unit);
    /* refused: a unit that does not divide the bytes, one larger than a slot, out of bounds */
    assert_int_equal(vkd_upload_fill(g->dev, b[0], 0, 10, 4, fill_records, &w), VKI_ERR_INVALID_ARG);
    assert_int_equal(vkd_upload_fill(g->dev, b[0], 0, g->dev->staging->size, g->dev->staging->size,
                                     fill_records, &w), VKI_ERR_INVALID_ARG);
    assert_int_equal(vkd_upload_fill(g->dev, b[0], unit, n, unit, fill_records, &w), VKI_ERR_INVALID_ARG);
    vkd_buffer_destroy(g->dev, b[0]);
    vkd_buffer_destroy(g->dev, b[1]);
    free(back), free(want);
}

/* Uploads while streaming (a model's load): chunks of whole units alternate between the two
 * staging slots and return with copies in flight; a buffer destroyed then, a download, a fill
 * and the flush all wait for them; every byte lands where it belongs. With one load thread the
 * fills come in order, one per chunk; with three each chunk's fill is split into three runs of
 * whole units on the pool's threads. */
static void test_staging_stream(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    uint32_t saved_threads = g->dev->load_threads;
    for (uint32_t threads = 1; threads <= 3; threads += 2) {
        g->dev->load_threads = threads;
        staging_stream_with(g);
    }
    g->dev->load_threads = saved_threads;
    vt_assert_clean(g);
}

/* One job's parts for test_pool: each part counts its own runs. */
typedef struct pool_job {
    atomic_uint runs[1000];
    atomic_uint calls;
} pool_job;

static void count_part(void *ctx, uint32_t part)
{
    pool_job *j = ctx;
    atomic_fetch_add(&j->runs[part], 1);
    atomic_fetch_add(&j->calls, 1);
}

/* The load threads' pool: every part of every job runs exactly once, on a pool and on none
 * (NULL: the caller alone), jobs of 0, 1, a few and many parts one after another. */
static void test_pool(void **state)
{
    (void)state;
    assert_null(vk_pool_create(1));
    vk_pool *p = vk_pool_create(4);
    assert_non_null(p);
    assert_int_equal(vk_pool_threads(p), 4);
    assert_int_equal(vk_pool_threads(NULL), 1);
    static const uint32_t parts[] = {0, 1, 3, 1000, 2, 999, 4};
    static pool_job j;
    for (int with_pool = 0; with_pool < 2; with_pool++)
        for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
            for (uint32_t i = 0; i < 1000; i++)
                atomic_init(&j.runs[i], 0);
            atomic_init(&j.calls, 0);
            vk_pool_run(with_pool ? p : NULL, parts[k], count_part, &j);
            assert_int_equal(atomic_load(&j.calls), parts[k]);
            for (uint32_t i = 0; i < 1000; i++)
                assert_int_equal(atomic_load(&j.runs[i]), i < parts[k]);
        }
    vk_pool_destroy(p);
    vk_pool_destroy(NULL);
    assert_true(vk_cores(8) >= 1 && vk_cores(8) <= 8 && vk_cores(1) == 1);
}

/* Oversized allocations fail with a status, not a crash. */
static void test_oom_is_a_status(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vkd_buffer *b = NULL;
    VkDeviceSize huge = g->dev->info.max_memory_allocation_size * 4;
    vki_status st = vkd_buffer_create(g->dev, huge, VKD_MEM_DEVICE, "huge", &b);
    assert_int_equal(st, VKI_ERR_OUT_OF_DEVICE_MEMORY);
    assert_null(b);
    assert_int_equal(vkd_buffer_create(g->dev, 0, VKD_MEM_DEVICE, "zero", &b), VKI_ERR_INVALID_ARG);
    vt_assert_clean(g);
}

static void ref_add(const float *a, const float *b, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

static void test_add_kernel(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("add");
    uint32_t sizes[24] = {1, 7, 255, 256, 257, 1000, 65536 * 4 + 3};
    for (int i = 7; i < 24; i++)
        sizes[i] = vt_range(&r, 1, 300000);
    for (int t = 0; t < 24; t++) {
        uint32_t n = sizes[t];
        float *a = malloc(n * 4), *b = malloc(n * 4), *y = malloc(n * 4), *ref = malloc(n * 4);
        vt_fill_uniform(&r, a, n, -4, 4);
        vt_fill_uniform(&r, b, n, -4, 4);
        ref_add(a, b, ref, n);
        vkd_buffer *ba = vt_buf_from(g, a, n * 4, "a"), *bb = vt_buf_from(g, b, n * 4, "b"), *by = vt_buf_nan(g, n * 4, "y");
        vt_begin(g);
        vki_pc_add pc = {.n = n};
        vkd_view v[3] = {vkd_whole(ba), vkd_whole(bb), vkd_whole(by)};
        uint32_t groups = vkk_groups(n, 256);
        assert_int_equal(vkk_dispatch(&g->cmd, VKK_ADD, NULL, v, 3, &pc, sizeof pc, groups < 4096 ? groups : 4096, 1, 1), VKI_OK);
        vt_submit_wait(g);
        vt_download(g, by, y, n * 4);
        char label[64];
        snprintf(label, sizeof label, "add n=%u", n);
        vt_assert_nmse(y, ref, n, 1e-10, label);
        vkd_buffer_destroy(g->dev, ba);
        vkd_buffer_destroy(g->dev, bb);
        vkd_buffer_destroy(g->dev, by);
        free(a); free(b); free(y); free(ref);
    }
    vt_assert_clean(g);
}

/* Deferred pipelines (what an engine's open does): between vkk_defer_begin and _end nothing is
 * created and duplicates are noted once; _end(false) drops the notes, _end(true) creates them
 * (on several threads) as variants that dispatches then find: the add kernel at the new
 * workgroup sizes computes what its reference does, and no further pipeline appears. */
static void test_deferred_pipelines(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    const uint32_t n0 = vkk_variants(g->dev, VKK_ADD), s0 = vkk_variants(g->dev, VKK_SOFTMAX);
    const uint32_t wg[3][1] = {{32}, {64}, {128}}, sm[1] = {32};
    vkk_defer_begin(g->dev);
    for (int i = 0; i < 3; i++)
        assert_int_equal(vkk_prepare(g->dev, VKK_ADD, wg[i]), VKI_OK);
    assert_int_equal(vkk_variants(g->dev, VKK_ADD), n0);
    assert_int_equal(vkk_defer_end(g->dev, false), VKI_OK);
    assert_int_equal(vkk_variants(g->dev, VKK_ADD), n0);
    vkk_defer_begin(g->dev);
    for (int rep = 0; rep < 2; rep++)
        for (int i = 0; i < 3; i++)
            assert_int_equal(vkk_prepare(g->dev, VKK_ADD, wg[i]), VKI_OK);
    assert_int_equal(vkk_prepare(g->dev, VKK_SOFTMAX, sm), VKI_OK);
    assert_int_equal(vkk_prepare(g->dev, VKK_COUNT, NULL), VKI_ERR_INVALID_ARG);
    assert_int_equal(vkk_variants(g->dev, VKK_ADD), n0);
    assert_int_equal(vkk_defer_end(g->dev, true), VKI_OK);
    assert_int_equal(vkk_variants(g->dev, VKK_ADD), n0 + 3);
    assert_int_equal(vkk_variants(g->dev, VKK_SOFTMAX), s0 + 1);
    vt_rng r = vt_rng_seeded("deferred");
    const uint32_t n = 1000;
    float *a = malloc(n * 4), *b = malloc(n * 4), *y = malloc(n * 4), *ref = malloc(n * 4);
    vt_fill_uniform(&r, a, n, -4, 4);
    vt_fill_uniform(&r, b, n, -4, 4);
    ref_add(a, b, ref, n);
    vkd_buffer *ba = vt_buf_from(g, a, n * 4, "a"), *bb = vt_buf_from(g, b, n * 4, "b"), *by = vt_buf_nan(g, n * 4, "y");
    for (int i = 0; i < 3; i++) {
        vt_begin(g);
        vki_pc_add pc = {.n = n};
        vkd_view v[3] = {vkd_whole(ba), vkd_whole(bb), vkd_whole(by)};
        assert_int_equal(vkk_dispatch(&g->cmd, VKK_ADD, wg[i], v, 3, &pc, sizeof pc, vkk_groups(n, wg[i][0]), 1, 1),
                         VKI_OK);
        vt_submit_wait(g);
        vt_download(g, by, y, n * 4);
        vt_assert_nmse(y, ref, n, 1e-10, "add after deferred creation");
    }
    assert_int_equal(vkk_variants(g->dev, VKK_ADD), n0 + 3);
    vkd_buffer_destroy(g->dev, ba);
    vkd_buffer_destroy(g->dev, bb);
    vkd_buffer_destroy(g->dev, by);
    free(a), free(b), free(y), free(ref);
    vt_assert_clean(g);
}

/* The dispatch path refuses a wrong push size or binding count and records nothing. */
static void test_dispatch_checks(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vkd_buffer *b = vt_buf_nan(g, 64, "b");
    vkd_view v[3] = {vkd_whole(b), vkd_whole(b), vkd_whole(b)};
    vki_pc_add pc = {.n = 16};
    vt_begin(g);
    assert_int_equal(vkk_dispatch(&g->cmd, VKK_ADD, NULL, v, 2, &pc, sizeof pc, 1, 1, 1), VKI_ERR_INVALID_ARG);
    assert_int_equal(vkk_dispatch(&g->cmd, VKK_ADD, NULL, v, 3, &pc, 8, 1, 1, 1), VKI_ERR_INVALID_ARG);
    assert_int_equal(vkk_dispatch(&g->cmd, VKK_ADD, NULL, v, 3, &pc, sizeof pc, 0, 1, 1), VKI_ERR_INVALID_ARG);
    vkd_view bad = {b, 0, 128};
    vkd_view v2[3] = {bad, vkd_whole(b), vkd_whole(b)};
    assert_int_equal(vkk_dispatch(&g->cmd, VKK_ADD, NULL, v2, 3, &pc, sizeof pc, 1, 1, 1), VKI_ERR_INVALID_ARG);
    vt_submit_wait(g);
    vkd_buffer_destroy(g->dev, b);
    vt_assert_clean(g);
}

/* Command-buffer reuse (vkd_cmd_enable_reuse): a recording equal to a kept one is submitted
 * again (and reads what the buffers hold now), a different push constant or a destroyed buffer
 * records anew, the least recently used slot goes first, and an indirect dispatch takes its
 * group count from the buffer at each submission. */
static void add_case(vt_gpu *g, vkd_cmd *c, vkd_buffer *const bufs[3], uint32_t n, const vkd_buffer *args)
{
    assert_int_equal(vkd_cmd_begin(c), VKI_OK);
    vkd_label_begin(c, "reuse test");
    vki_pc_add pc = {.n = n};
    vkd_view v[3] = {vkd_whole(bufs[0]), vkd_whole(bufs[1]), vkd_whole(bufs[2])};
    if (args)
        assert_int_equal(vkk_dispatch_indirect(c, VKK_ADD, NULL, v, 3, &pc, sizeof pc, vkd_whole(args)), VKI_OK);
    else
        assert_int_equal(vkk_dispatch(c, VKK_ADD, NULL, v, 3, &pc, sizeof pc, vkk_groups(n, 256), 1, 1), VKI_OK);
    vkd_barrier_compute_to_host(c);
    vkd_label_end(c);
    assert_int_equal(vkd_cmd_submit_wait(c), VKI_OK);
    (void)g;
}

static void expect_add(vt_gpu *g, vkd_buffer *const bufs[3], const float *a, const float *b, uint32_t n,
                       uint32_t n_all, const char *label)
{
    float *y = malloc(n_all * 4);
    vt_download(g, bufs[2], y, n_all * 4);
    for (uint32_t i = 0; i < n_all; i++)
        if (i < n ? y[i] != a[i] + b[i] : y[i] == y[i])
            fail_msg("%s: y[%u] = %g (n %u)", label, i, y[i], n);
    free(y);
}

static void test_cmd_reuse(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    vt_rng r = vt_rng_seeded("cmd reuse");
    const uint32_t N = 1000;
    float a[1000], b[1000];
    vt_fill_uniform(&r, a, N, -4, 4);
    vt_fill_uniform(&r, b, N, -4, 4);
    vkd_buffer *bufs[3] = {vt_buf_from(g, a, N * 4, "a"), vt_buf_from(g, b, N * 4, "b"), vt_buf_nan(g, N * 4, "y")};
    vkd_cmd c;
    assert_int_equal(vkd_cmd_create(g->dev, "reuse test", &c), VKI_OK);
    assert_int_equal(vkd_cmd_enable_reuse(&c, 0), VKI_ERR_INVALID_ARG);
    assert_int_equal(vkd_cmd_enable_reuse(&c, VKD_REUSE_MAX_SLOTS + 1), VKI_ERR_INVALID_ARG);
    assert_int_equal(vkd_cmd_enable_reuse(&c, 2), VKI_OK);
    add_case(g, &c, bufs, N, NULL);
    expect_add(g, bufs, a, b, N, N, "first");
    assert_true(c.reuse_hits == 0 && c.reuse_misses == 1);
    vt_fill_uniform(&r, a, N, -4, 4); /* new contents, the same recording */
    assert_int_equal(vkd_upload(g->dev, bufs[0], 0, a, N * 4), VKI_OK);
    add_case(g, &c, bufs, N, NULL);
    expect_add(g, bufs, a, b, N, N, "reused");
    assert_true(c.reuse_hits == 1 && c.reuse_misses == 1);
    assert_int_equal(vkd_fill(g->dev, bufs[2], 0, N * 4, 0x7fc00000u), VKI_OK);
    add_case(g, &c, bufs, 500, NULL); /* another push constant and group count */
    expect_add(g, bufs, a, b, 500, N, "n 500");
    assert_true(c.reuse_hits == 1 && c.reuse_misses == 2);
    /* indirect: the group count is read at each submission, the recording stays the same */
    uint32_t cmd3[3] = {vkk_groups(N, 256), 1, 1};
    vkd_buffer *args = vt_buf_from(g, cmd3, sizeof cmd3, "args");
    add_case(g, &c, bufs, N, args); /* evicts the first recording (n 1000, direct) */
    expect_add(g, bufs, a, b, N, N, "indirect");
    assert_true(c.reuse_hits == 1 && c.reuse_misses == 3);
    assert_int_equal(vkd_fill(g->dev, bufs[2], 0, N * 4, 0x7fc00000u), VKI_OK);
    cmd3[0] = 0;
    assert_int_equal(vkd_upload(g->dev, args, 0, cmd3, sizeof cmd3), VKI_OK);
    add_case(g, &c, bufs, N, args);
    expect_add(g, bufs, a, b, 0, N, "indirect, no groups");
    assert_true(c.reuse_hits == 2 && c.reuse_misses == 3);
    add_case(g, &c, bufs, N, NULL); /* evicted: recorded again */
    expect_add(g, bufs, a, b, N, N, "after eviction");
    assert_true(c.reuse_hits == 2 && c.reuse_misses == 4);
    vkd_buffer_destroy(g->dev, vt_buf_nan(g, 64, "gone")); /* any destroyed buffer: record anew */
    add_case(g, &c, bufs, N, NULL);
    assert_true(c.reuse_hits == 2 && c.reuse_misses == 5);
    add_case(g, &c, bufs, N, NULL);
    assert_true(c.reuse_hits == 3 && c.reuse_misses == 5);
    vkd_cmd_destroy(&c);
    for (int i = 0; i < 3; i++)
        vkd_buffer_destroy(g->dev, bufs[i]);
    vkd_buffer_destroy(g->dev, args);
    vt_assert_clean(g);
}

/* The cooperative-matrix path chosen at open from vki_device_params.coopmat: AUTO takes the NV
 * shape the device offers (F16 x F16 -> F32) or none, OFF none, EMULATED the emulation (on a
 * device with shaderFloat16 and shuffles), anything else is refused; vkd_coopmat_select switches
 * later. Each device opens with the validation layer: enabling the NV extension must be clean. */
static void test_coopmat_modes(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    const vki_device_info *in = &g->dev->info;
    if (in->coopmat_pick.m) {
        assert_true(in->coopmat_nv);
        assert_true(in->coopmat_pick.a_type == 0 && in->coopmat_pick.b_type == 0 && in->coopmat_pick.c_type == 1 &&
                    in->coopmat_pick.result_type == 1 && in->coopmat_pick.scope == 3);
    }
    assert_int_equal(g->dev->nv_coopmat, in->coopmat_pick.m != 0); /* the harness opens with AUTO */
    assert_true(!in->coopmat_pick.m || in->memory_model); /* the NV modules need it, device scope too */
    assert_int_equal(g->dev->cm.kind, VKD_CM_NONE);                 /* then selects OFF */
    assert_int_equal(vkd_coopmat_select(g->dev, VKI_COOPMAT_AUTO), VKI_OK);
    assert_int_equal(g->dev->cm.kind, in->coopmat_pick.m ? VKD_CM_NV : VKD_CM_NONE);
    assert_int_equal(vkd_coopmat_select(g->dev, VKI_COOPMAT_OFF), VKI_OK);
    const vki_coopmat_mode modes[] = {VKI_COOPMAT_OFF, VKI_COOPMAT_EMULATED, (vki_coopmat_mode)7};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        vki_device_params p = vki_device_default_params();
        p.validation = true;
        p.log_level = VKI_LOG_ERROR;
        p.coopmat = modes[i];
        p.gemv_max_m = 48;
        vkd_device *d = NULL;
        vki_status st = vkd_open(&p, &d);
        if (modes[i] == VKI_COOPMAT_OFF) {
            assert_int_equal(st, VKI_OK);
            assert_int_equal(d->cm.kind, VKD_CM_NONE);
            assert_false(d->nv_coopmat);
            assert_int_equal(op_matmul_gemv_max_m(d), 48); /* the param overrides the table */
        } else if (modes[i] == VKI_COOPMAT_EMULATED) {
            if (st == VKI_ERR_UNSUPPORTED) /* no shaderFloat16 or shuffles: said so in the log */
                continue;
            assert_int_equal(st, VKI_OK);
            assert_int_equal(d->cm.kind, VKD_CM_EMULATED);
            assert_true(d->cm.n % d->cm.sg == 0 && d->cm.m == 16 && d->cm.k == 16);
            assert_int_equal(vkd_coopmat_select(d, VKI_COOPMAT_OFF), VKI_OK);
            assert_int_equal(d->cm.kind, VKD_CM_NONE);
        } else {
            assert_int_equal(st, VKI_ERR_INVALID_ARG);
            assert_null(d);
            continue;
        }
        assert_int_equal(atomic_load(&d->n_validation_errors) + atomic_load(&d->n_validation_warnings), 0);
        vkd_close(d);
    }
    vt_assert_clean(g);
}

/* The messenger really counts: an invalid call is seen (then the counters are reset so the
 * suite's teardown check still guards everything else). */
static void test_validation_counter_works(void **state)
{
    vt_gpu *g = vt_gpu_get(state);
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = 0,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT};
    VkBuffer buf = VK_NULL_HANDLE;
    int before = atomic_load(&g->dev->n_validation_errors);
    VkResult r = vkCreateBuffer(g->dev->dev, &bi, NULL, &buf); /* size 0 is invalid usage */
    assert_true(atomic_load(&g->dev->n_validation_errors) > before);
    if (r == VK_SUCCESS && buf)
        vkDestroyBuffer(g->dev->dev, buf, NULL);
    atomic_store(&g->dev->n_validation_errors, 0);
    atomic_store(&g->dev->n_validation_warnings, 0);
}

/* ---- drivers stay loaded ---------------------------------------------------------------------- */

typedef struct {
    char names[512][256]; /* NVIDIA's driver alone brings a dozen libraries */
    int n;
} icd_list;

/* Loaded libraries that export vk_icdGetInstanceProcAddr (Vulkan drivers). */
static int add_icd(struct dl_phdr_info *info, size_t size, void *user)
{
    (void)size;
    icd_list *l = user;
    if (info->dlpi_name && info->dlpi_name[0] && l->n < 512 && strlen(info->dlpi_name) < sizeof l->names[0])
        strcpy(l->names[l->n++], info->dlpi_name);
    return 0;
}

static void list_icds(icd_list *l)
{
    static icd_list all; /* 128 KiB, in the child process only */
    all.n = 0;
    dl_iterate_phdr(add_icd, &all);
    l->n = 0;
    for (int i = 0; i < all.n; i++) {
        void *h = dlopen(all.names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h && dlsym(h, "vk_icdGetInstanceProcAddr"))
            strcpy(l->names[l->n++], all.names[i]);
        if (h)
            dlclose(h);
    }
}

/* In a fresh process (the harness pins the drivers it knows): a device opened and closed leaves
 * the drivers its instance loaded in the process. Exit 0 when every driver is still there. */
static int drivers_child(void)
{
    vki_device_params p = vt_device_params();
    p.validation = false; /* the layer is not a driver; leave LeakSanitizer's view of it alone */
    p.log_level = VKI_LOG_ERROR;
    vkd_device *d = NULL;
    if (vkd_open(&p, &d) != VKI_OK)
        return 3;
    static icd_list l;
    list_icds(&l);
    vkd_close(d);
    if (!l.n)
        return 2;
    for (int i = 0; i < l.n; i++) {
        void *h = dlopen(l.names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h) {
            fprintf(stderr, "driver %s was unloaded when the device closed\n", l.names[i]);
            return 1;
        }
        dlclose(h);
        fprintf(stderr, "driver %s still loaded after the device closed\n", l.names[i]);
    }
    return 0;
}

/* The loader unloads drivers at vkDestroyInstance; NVIDIA's cannot be loaded again many times
 * in one process (glibc never returns its static TLS: "cannot allocate memory in static TLS
 * block" after ~40 devices on the first H200 run). vkd_open marks them RTLD_NODELETE. */
static void test_drivers_stay_loaded(void **state)
{
    (void)vt_gpu_get(state);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *argv[] = {"test_device", "--drivers-child", NULL};
        execv("/proc/self/exe", argv);
        _exit(4);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--drivers-child"))
        return drivers_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info_sane),
        cmocka_unit_test(test_suballocator_roundtrip),
        cmocka_unit_test(test_staging_chunks),
        cmocka_unit_test(test_staging_stream),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_oom_is_a_status),
        cmocka_unit_test(test_add_kernel),
        cmocka_unit_test(test_deferred_pipelines),
        cmocka_unit_test(test_dispatch_checks),
        cmocka_unit_test(test_cmd_reuse),
        cmocka_unit_test(test_coopmat_modes),
        cmocka_unit_test(test_validation_counter_works),
        cmocka_unit_test(test_drivers_stay_loaded),
    };
    return cmocka_run_group_tests(tests, vt_gpu_setup, vt_gpu_teardown);
}
