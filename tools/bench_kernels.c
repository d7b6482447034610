/* bench-kernels: kernel micro-benchmark. For each kernel, weight type and shape it records
 * `iters` calls (a compute barrier between calls, as between the layers of a model) in one
 * command buffer, times the batch with GPU timestamps after a warm-up batch, and prints time
 * per call, bandwidth (bytes read + written once: the algorithmic minimum) and GFLOP/s.
 * A program that prints numbers; it asserts nothing.
 *
 * Adding a kernel is adding one row to `benches` below: a setup function that allocates the
 * inputs for (type, M, N, K) into a bench_run and states its bytes and flops, a record function
 * that records one call, and default shapes. Buffers put in run->buf[] and the tensor run->w
 * are released by the common teardown. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/device.h"
#include "engine/kernels.h"
#include "engine/ops_matmul.h"
#include "engine/quant.h"
#include "engine/tensor.h"

#define MAX_BUFS 8

/* One benchmarked configuration. M, N, K mean what the kernel's `dims` says. */
typedef struct bench_run {
    vkd_device *d;
    uint32_t type, M, N, K;
    vk_tensor w;               /* weights, when the kernel has some (w.n_parts = 0 otherwise) */
    vkd_buffer *buf[MAX_BUFS]; /* inputs / outputs, any use */
    double bytes, flops;       /* per call, set by setup */
    uint64_t rng;
} bench_run;

typedef struct bench_shape {
    uint32_t M, N, K;
} bench_shape;

#define MAX_SHAPES 8

typedef struct bench_kernel {
    const char *name;
    const char *dims;                        /* meaning of M, N, K (for --help) */
    uint32_t types[8], n_types;              /* ggml types it runs (F32 only for activations) */
    bench_shape full[MAX_SHAPES], small[MAX_SHAPES]; /* zero-terminated; small: CPU devices */
    vki_status (*setup)(bench_run *r);
    vki_status (*record)(bench_run *r, vkd_cmd *c);
} bench_kernel;

/* ---- helpers for setup functions ----------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_float(uint64_t *s) { return (float)((rng_next(s) >> 40) * (2.0 / 16777216.0) - 1.0); }

/* Device buffer of n floats uniform in [-1, 1). */
static vki_status make_floats(bench_run *r, size_t n, const char *name, vkd_buffer **out)
{
    float *h = malloc(n * sizeof(float));
    if (!h)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < n; i++)
        h[i] = rng_float(&r->rng);
    vki_status st = vkd_buffer_create(r->d, n * sizeof(float), VKD_MEM_DEVICE, name, out);
    if (st == VKI_OK)
        st = vkd_upload(r->d, *out, 0, h, n * sizeof(float));
    free(h);
    return st;
}

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = quant_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* Random weights in `type`: random block bytes with small finite scales (fast for the 100M+
 * weights of an LM head; the values do not change the kernels' speed). */
static void random_weights(bench_run *r, uint8_t *raw, size_t n_bytes, uint32_t type, uint64_t n_elems)
{
    if (type == VKI_GGML_F32) {
        for (uint64_t i = 0; i < n_elems; i++)
            ((float *)raw)[i] = rng_float(&r->rng);
        return;
    }
    if (type == VKI_GGML_F16) {
        for (uint64_t i = 0; i < n_elems; i++)
            put_f16(raw + 2 * i, rng_float(&r->rng));
        return;
    }
    for (size_t i = 0; i < n_bytes; i += 8) {
        uint64_t v = rng_next(&r->rng);
        memcpy(raw + i, &v, n_bytes - i < 8 ? n_bytes - i : 8);
    }
    const quant_traits *qt = quant_get(type);
    for (size_t b = 0; b < n_bytes / qt->block_bytes; b++) {
        uint8_t *blk = raw + b * qt->block_bytes;
        switch (type) {
        case VKI_GGML_Q8_0: case VKI_GGML_Q4_0: put_f16(blk, 0.01f); break;
        case VKI_GGML_Q4_K: put_f16(blk, 0.01f); put_f16(blk + 2, 0.01f); break;
        case VKI_GGML_Q6_K: put_f16(blk + 208, 0.001f); break;
        }
    }
}

/* r->w: rows x K weights of r->type. */
static vki_status make_weights(bench_run *r, uint32_t rows, uint32_t K)
{
    size_t rb = quant_row_bytes(r->type, K);
    if (!rb)
        return VKI_ERR_INVALID_ARG;
    uint8_t *raw = malloc(rb * rows);
    if (!raw)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    random_weights(r, raw, rb * rows, r->type, (uint64_t)rows * K);
    vki_status st = vk_tensor_create(r->d, r->type, K, rows, 0, "bench w", &r->w);
    if (st == VKI_OK)
        st = vk_tensor_upload(r->d, &r->w, raw);
    free(raw);
    return st;
}

/* ---- matmul family ----------------------------------------------------------------------- */

/* Y[M, N] = X[M, K] W[N, K]^T. buf: 0 X, 1 Y. */
static vki_status mm_setup(bench_run *r)
{
    vki_status st = make_weights(r, r->N, r->K);
    if (st == VKI_OK)
        st = make_floats(r, (size_t)r->M * r->K, "bench x", &r->buf[0]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->M * r->N * 4, VKD_MEM_DEVICE, "bench y", &r->buf[1]);
    r->bytes = (double)r->w.row_bytes * r->N + 4.0 * r->M * r->K + 4.0 * r->M * r->N;
    r->flops = 2.0 * r->M * r->N * r->K;
    return st;
}

static vki_status matvec_record(bench_run *r, vkd_cmd *c)
{
    return op_matmul_path(c, &r->w, NULL, vkd_whole(r->buf[0]), r->K, vkd_whole(r->buf[1]), r->N, r->M, OP_MM_GEMV);
}

static vki_status matmul_record(bench_run *r, vkd_cmd *c)
{
    return op_matmul_path(c, &r->w, NULL, vkd_whole(r->buf[0]), r->K, vkd_whole(r->buf[1]), r->N, r->M, OP_MM_GEMM);
}

/* y[M, K] = W[ids[M], :], a table of N rows. buf: 0 ids, 1 y. */
static vki_status get_rows_setup(bench_run *r)
{
    vki_status st = make_weights(r, r->N, r->K);
    int32_t *ids = malloc((size_t)r->M * 4);
    if (!ids)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < r->M; i++)
        ids[i] = (int32_t)(rng_next(&r->rng) % r->N);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->M * 4, VKD_MEM_DEVICE, "bench ids", &r->buf[0]);
    if (st == VKI_OK)
        st = vkd_upload(r->d, r->buf[0], 0, ids, (size_t)r->M * 4);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->M * r->K * 4, VKD_MEM_DEVICE, "bench y", &r->buf[1]);
    free(ids);
    r->bytes = (double)r->w.row_bytes * r->M + 4.0 * r->M + 4.0 * r->M * r->K;
    r->flops = 0;
    return st;
}

static vki_status get_rows_record(bench_run *r, vkd_cmd *c)
{
    return op_get_rows(c, &r->w, vkd_whole(r->buf[0]), r->M, vkd_whole(r->buf[1]), r->K);
}

#define WEIGHT_TYPES                                                                               \
    .types = {VKI_GGML_F32, VKI_GGML_F16, VKI_GGML_Q8_0, VKI_GGML_Q4_0, VKI_GGML_Q4_K, VKI_GGML_Q6_K}, \
    .n_types = 6

/* ---- the registration table ---------------------------------------------------------------- */

static const bench_kernel benches[] = {
    {"matvec", "M activation rows (<= 8 per pass), N weight rows, K", WEIGHT_TYPES,
     .full = {{1, 4096, 4096}, {1, 14336, 4096}, {1, 4096, 14336}, {1, 32000, 4096}, {8, 4096, 4096}},
     .small = {{1, 1024, 1024}, {1, 2816, 1024}, {1, 8192, 512}, {8, 1024, 1024}},
     mm_setup, matvec_record},
    {"matmul", "M activation rows, N weight rows, K", WEIGHT_TYPES,
     .full = {{512, 4096, 4096}, {512, 14336, 4096}, {64, 4096, 4096}},
     .small = {{128, 512, 512}, {32, 512, 512}},
     mm_setup, matmul_record},
    {"get_rows", "M ids, N table rows, K", WEIGHT_TYPES,
     .full = {{512, 32000, 4096}, {1, 32000, 4096}},
     .small = {{128, 8000, 1024}, {1, 8000, 1024}},
     get_rows_setup, get_rows_record},
};
#define N_BENCHES (sizeof benches / sizeof benches[0])

/* ---- timing -------------------------------------------------------------------------------- */

typedef struct bench_opts {
    int iters, warmup, reps;
} bench_opts;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Records n calls with barriers between them; with a query pool, timestamps around them. */
static vki_status record_batch(const bench_kernel *b, bench_run *r, vkd_cmd *c, int n, VkQueryPool qp)
{
    vki_status st = vkd_cmd_begin(c);
    if (st != VKI_OK)
        return st;
    if (qp) {
        vkCmdResetQueryPool(c->cb, qp, 0, 2);
        vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
    }
    for (int i = 0; i < n && st == VKI_OK; i++) {
        if (i)
            vkd_barrier(c);
        st = b->record(r, c);
    }
    if (qp)
        vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
    vki_status st2 = vkd_cmd_submit_wait(c);
    return st != VKI_OK ? st : st2;
}

/* Median over reps of the per-call time of a batch, in seconds. */
static vki_status time_run(const bench_kernel *b, bench_run *r, vkd_cmd *c, VkQueryPool qp,
                           const bench_opts *o, double *per_call)
{
    vki_status st = record_batch(b, r, c, o->warmup, VK_NULL_HANDLE); /* pipelines, caches, clocks */
    double t[64];
    int reps = o->reps < 64 ? o->reps : 64;
    for (int i = 0; i < reps && st == VKI_OK; i++) {
        double t0 = now_s();
        st = record_batch(b, r, c, o->iters, qp);
        t[i] = (now_s() - t0) / o->iters;
        uint64_t ts[2];
        if (st == VKI_OK && qp &&
            vkGetQueryPoolResults(r->d->dev, qp, 0, 2, sizeof ts, ts, sizeof ts[0],
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS)
            t[i] = (double)(ts[1] - ts[0]) * r->d->info.timestamp_period_ns * 1e-9 / o->iters;
    }
    for (int i = 1; i < reps; i++) /* insertion sort: a handful of values */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    *per_call = t[reps / 2];
    return st;
}

static void run_release(bench_run *r)
{
    vk_tensor_destroy(r->d, &r->w);
    for (int i = 0; i < MAX_BUFS; i++)
        vkd_buffer_destroy(r->d, r->buf[i]);
    memset(r->buf, 0, sizeof r->buf);
}

static void bench_one(const bench_kernel *b, vkd_device *d, vkd_cmd *c, VkQueryPool qp, uint32_t type,
                      bench_shape s, const bench_opts *o)
{
    const char *tname = quant_get(type) ? quant_get(type)->name : "?";
    bench_run r = {.d = d, .type = type, .M = s.M, .N = s.N, .K = s.K, .rng = 0x5eed ^ ((uint64_t)type << 32)};
    double per_call = 0;
    vki_status st = b->setup(&r);
    if (st == VKI_OK)
        st = time_run(b, &r, c, qp, o, &per_call);
    if (st != VKI_OK) {
        printf("%-10s %-5s %6u %6u %6u   %s\n", b->name, tname, s.M, s.N, s.K, vki_status_str(st));
    } else {
        char gf[32] = "-";
        if (r.flops > 0)
            snprintf(gf, sizeof gf, "%.1f", r.flops / per_call * 1e-9);
        printf("%-10s %-5s %6u %6u %6u %11.1f %9.1f %9s\n", b->name, tname, s.M, s.N, s.K, per_call * 1e6,
               r.bytes / per_call * 1e-9, gf);
    }
    fflush(stdout);
    run_release(&r);
}

/* ---- command line -------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: bench-kernels [options]\n"
               "  -k, --kernel LIST   comma-separated kernels (default: all)\n"
               "  -t, --type LIST     comma-separated weight types: f32,f16,q8_0,q4_0,q4_k,q6_k\n"
               "  -s, --shape MxNxK   a shape (repeatable); replaces the defaults\n"
               "      --small         the small default shapes (default on CPU devices)\n"
               "      --full          the model-sized default shapes (default on GPUs)\n"
               "  -d, --device I|NAME device index or name substring\n"
               "  -n, --iters N       calls per timed batch (default 20)\n"
               "  -w, --warmup N      calls in the warm-up batch (default 3)\n"
               "  -r, --reps N        timed batches; the median is printed (default 3)\n"
               "kernels:\n");
    for (size_t i = 0; i < N_BENCHES; i++)
        fprintf(f, "  %-10s %s\n", benches[i].name, benches[i].dims);
}

static bool in_list(const char *list, const char *name)
{
    if (!list)
        return true;
    size_t n = strlen(name);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == 0))
            return true;
    return false;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"kernel", 1, 0, 'k'}, {"type", 1, 0, 't'}, {"shape", 1, 0, 's'}, {"device", 1, 0, 'd'},
        {"iters", 1, 0, 'n'},  {"warmup", 1, 0, 'w'}, {"reps", 1, 0, 'r'}, {"small", 0, 0, 'S'},
        {"full", 0, 0, 'F'},   {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
    const char *kernels = NULL, *types = NULL;
    bench_shape shapes[MAX_SHAPES];
    int n_shapes = 0, size_pref = -1; /* -1 auto, 0 small, 1 full */
    bench_opts o = {.iters = 20, .warmup = 3, .reps = 3};
    vki_device_params dp = vki_device_default_params();
    for (int ch; (ch = getopt_long(argc, argv, "k:t:s:d:n:w:r:h", lo, NULL)) != -1;) {
        switch (ch) {
        case 'k': kernels = optarg; break;
        case 't': types = optarg; break;
        case 's':
            if (n_shapes == MAX_SHAPES || sscanf(optarg, "%ux%ux%u", &shapes[n_shapes].M, &shapes[n_shapes].N,
                                                 &shapes[n_shapes].K) != 3 || !shapes[n_shapes].M ||
                !shapes[n_shapes].N || !shapes[n_shapes].K) {
                fprintf(stderr, "bad or too many --shape: %s (MxNxK, at most %d)\n", optarg, MAX_SHAPES);
                return 2;
            }
            n_shapes++;
            break;
        case 'd':
            if (optarg[0] >= '0' && optarg[0] <= '9')
                dp.device_index = atoi(optarg);
            else
                dp.device_name = optarg;
            break;
        case 'n': o.iters = atoi(optarg); break;
        case 'w': o.warmup = atoi(optarg); break;
        case 'r': o.reps = atoi(optarg); break;
        case 'S': size_pref = 0; break;
        case 'F': size_pref = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (o.iters < 1 || o.warmup < 1 || o.reps < 1) {
        fprintf(stderr, "--iters, --warmup and --reps must be >= 1\n");
        return 2;
    }
    vkd_device *d;
    vki_status st = vkd_open(&dp, &d);
    if (st != VKI_OK) {
        fprintf(stderr, "bench-kernels: cannot open a Vulkan device: %s\n", vki_status_str(st));
        return 1;
    }
    bool small = size_pref == 0 || (size_pref < 0 && d->info.type == VKI_DEVICE_CPU);
    vkd_cmd c;
    VkQueryPool qp = VK_NULL_HANDLE;
    st = vkd_cmd_create(d, "bench", &c);
    if (st == VKI_OK && d->info.timestamps) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 2};
        if (vkCreateQueryPool(d->dev, &qi, NULL, &qp) != VK_SUCCESS)
            qp = VK_NULL_HANDLE;
    }
    if (st != VKI_OK) {
        vkd_close(d);
        return 1;
    }
    printf("device: %s (%s); %s shapes; %d calls per batch, median of %d batches; timer: %s\n", d->info.name,
           d->info.driver_info, n_shapes ? "given" : small ? "small" : "full", o.iters, o.reps,
           qp ? "GPU timestamps" : "host clock");
    printf("%-10s %-5s %6s %6s %6s %11s %9s %9s\n", "kernel", "type", "M", "N", "K", "us/call", "GB/s", "GFLOP/s");
    for (size_t i = 0; i < N_BENCHES; i++) {
        const bench_kernel *b = &benches[i];
        if (!in_list(kernels, b->name))
            continue;
        for (uint32_t t = 0; t < b->n_types; t++) {
            const quant_traits *qt = quant_get(b->types[t]);
            if (!qt || !in_list(types, qt->name))
                continue;
            const bench_shape *sh = n_shapes ? shapes : small ? b->small : b->full;
            int n = n_shapes;
            while (!n_shapes && n < MAX_SHAPES && sh[n].M)
                n++;
            for (int j = 0; j < n; j++)
                bench_one(b, d, &c, qp, b->types[t], sh[j], &o);
        }
    }
    if (qp)
        vkDestroyQueryPool(d->dev, qp, NULL);
    vkd_cmd_destroy(&c);
    vkd_close(d);
    return 0;
}
