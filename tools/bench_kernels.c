/* bench-kernels: kernel micro-benchmark. For each kernel, weight type and shape it records
 * `iters` calls (a compute barrier between calls, as between the layers of a model) in one
 * command buffer, times the batch with GPU timestamps after a warm-up batch, and prints time
 * per call, bandwidth (bytes read + written once: the algorithmic minimum), GFLOP/s, and the
 * bandwidth as a share of the copy kernel's (the first row, measured in the same run).
 * --json writes one object per row to stdout (the table then goes to stderr).
 * A program that prints numbers; it asserts nothing.
 *
 * Weights rotate between copies totalling >= 256 MiB on GPUs, so consecutive calls do not find
 * the previous call's weights in L2 (50-60 MB on an H100/H200, larger than one 4096 x 4096
 * quantised matrix): the numbers are what a model's layers, each with its own weights, see.
 *
 * Adding a kernel is adding one row to `benches` below: a setup function that allocates the
 * inputs for (type, M, N, K) into a bench_run and states its bytes and flops, a record function
 * that records one call, and default shapes. Buffers put in run->buf[] and the tensor run->w
 * are released by the common teardown. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/device.h"
#include "engine/kernels.h"
#include "engine/ops_attn.h"
#include "engine/ops_matmul.h"
#include "engine/ops_sample.h"
#include "engine/quant.h"
#include "engine/rng.h"
#include "engine/ops_basic.h"
#include "engine/tensor.h"
#include "host/cli/cli_common.h"
#include "host/cli/devprobe.h"

#define MAX_BUFS 8
#define MAX_WCOPIES 16
#define ROTATE_BYTES (256ull << 20)

/* One benchmarked configuration. M, N, K mean what the kernel's `dims` says. */
typedef struct bench_run {
    vkd_device *d;
    uint32_t type, M, N, K;
    vk_tensor w[MAX_WCOPIES];  /* weights, when the kernel has some: n_w copies, call i uses
                                  w[i % n_w] (n_w = 0 otherwise) */
    uint32_t n_w, call;
    vkd_buffer *buf[MAX_BUFS]; /* inputs / outputs, any use */
    double bytes, flops;       /* per call, set by setup */
    uint64_t rng;
} bench_run;

typedef struct bench_shape {
    uint32_t M, N, K;
} bench_shape;

#define MAX_SHAPES 8     /* a kernel's own list */
#define MAX_CL_SHAPES 32 /* --shape on the command line (gpu-check's gemm step gives 21) */
/* Every weight type of the matmul family (engine/kernels.h VKK_WEIGHT_TYPES). */
#define COUNT_TYPE(T, t) +1
#define BENCH_WEIGHT_TYPES (0 VKK_WEIGHT_TYPES(COUNT_TYPE))

typedef struct bench_kernel {
    const char *name;
    const char *dims;                        /* meaning of M, N, K (for --help) */
    uint32_t types[BENCH_WEIGHT_TYPES], n_types; /* ggml types it runs (F32 only for activations) */
    bench_shape full[MAX_SHAPES], small[MAX_SHAPES]; /* zero-terminated; small: CPU devices */
    vki_status (*setup)(bench_run *r);
    vki_status (*record)(bench_run *r, vkd_cmd *c);
} bench_kernel;

/* ---- helpers for setup functions ----------------------------------------------------------- */

static float rng_float(uint64_t *s) { return (float)((vki_splitmix64(s) >> 40) * (2.0 / 16777216.0) - 1.0); }

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
    if (type == VKI_GGML_F16 || type == VKI_GGML_BF16) {
        for (uint64_t i = 0; i < n_elems; i++) {
            float f = rng_float(&r->rng);
            uint16_t h = type == VKI_GGML_F16 ? quant_f32_to_f16(f) : quant_f32_to_bf16(f);
            memcpy(raw + 2 * i, &h, 2);
        }
        return;
    }
    for (size_t i = 0; i < n_bytes; i += 8) {
        uint64_t v = vki_splitmix64(&r->rng);
        memcpy(raw + i, &v, n_bytes - i < 8 ? n_bytes - i : 8);
    }
    const quant_traits *qt = quant_get(type);
    for (size_t b = 0; b < n_bytes / qt->block_bytes; b++) {
        uint8_t *blk = raw + b * qt->block_bytes;
        switch (type) { /* where each layout keeps its scales (shaders/vki_shared.h) */
        case VKI_GGML_Q8_0: case VKI_GGML_Q4_0: case VKI_GGML_Q5_0: case VKI_GGML_IQ4_NL: put_f16(blk, 0.01f); break;
        case VKI_GGML_Q4_1: case VKI_GGML_Q5_1: case VKI_GGML_Q4_K: case VKI_GGML_Q5_K:
            put_f16(blk, 0.01f);
            put_f16(blk + 2, 0.01f);
            break;
        case VKI_GGML_IQ4_XS: put_f16(blk, 0.001f); break;
        case VKI_GGML_Q2_K: put_f16(blk + 80, 0.01f); put_f16(blk + 82, 0.01f); break;
        case VKI_GGML_Q3_K: put_f16(blk + 108, 0.001f); break;
        case VKI_GGML_Q6_K: put_f16(blk + 208, 0.001f); break;
        case VKI_GGML_MXFP4: blk[0] = 120; break; /* d = 2^-8: an E8M0 byte, not an f16 */
        }
    }
}

/* r->w: rows x K weights of r->type, in enough copies to rotate through ROTATE_BYTES on a GPU
 * (one on CPU devices, whose caches the kernels' working sets exceed anyway). */
static vki_status make_weights(bench_run *r, uint32_t rows, uint32_t K)
{
    size_t rb = quant_row_bytes(r->type, K);
    if (!rb)
        return VKI_ERR_INVALID_ARG;
    uint8_t *raw = malloc(rb * rows);
    if (!raw)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    random_weights(r, raw, rb * rows, r->type, (uint64_t)rows * K);
    uint64_t copies = r->d->info.type == VKI_DEVICE_CPU ? 1 : (ROTATE_BYTES + rb * rows - 1) / (rb * rows);
    copies = copies < MAX_WCOPIES ? copies : MAX_WCOPIES;
    vki_status st = VKI_OK;
    for (; st == VKI_OK && r->n_w < copies; r->n_w++) {
        st = vk_tensor_create(r->d, r->type, K, rows, 0, "bench w", &r->w[r->n_w]);
        if (st == VKI_OK)
            st = vk_tensor_upload(r->d, &r->w[r->n_w], raw);
    }
    free(raw);
    return st;
}

/* The weights of the next call. */
static const vk_tensor *next_w(bench_run *r) { return &r->w[r->call++ % r->n_w]; }

/* ---- matmul family ----------------------------------------------------------------------- */

/* Y[M, N] = X[M, K] W[N, K]^T. buf: 0 X, 1 Y. */
static vki_status mm_setup(bench_run *r)
{
    vki_status st = make_weights(r, r->N, r->K);
    if (st == VKI_OK)
        st = make_floats(r, (size_t)r->M * r->K, "bench x", &r->buf[0]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->M * r->N * 4, VKD_MEM_DEVICE, "bench y", &r->buf[1]);
    r->bytes = (double)r->w[0].src_row_bytes * r->N + 4.0 * r->M * r->K + 4.0 * r->M * r->N;
    r->flops = 2.0 * r->M * r->N * r->K;
    return st;
}

static vki_status matvec_record(bench_run *r, vkd_cmd *c)
{
    return op_matmul_path(c, next_w(r), NULL, vkd_whole(r->buf[0]), r->K, vkd_whole(r->buf[1]), r->N, r->M, OP_MM_GEMV);
}

static vki_status matmul_record(bench_run *r, vkd_cmd *c)
{
    return op_matmul_path(c, next_w(r), NULL, vkd_whole(r->buf[0]), r->K, vkd_whole(r->buf[1]), r->N, r->M, OP_MM_GEMM);
}

/* The integer-dot product (op_matmul_i8) on X already quantised, as the engine's decode runs it
 * (the norm, the attention or the gate|up pass that writes a projection's input writes its int8
 * copy too), against matvec's row; quant_x8's row is the separate pass. buf: 0 X, 1 Y, 2 XQ
 * (int8 ones, scales 1e-3: their values do not change the time). */
static vki_status i8_setup(bench_run *r)
{
    vki_status st = mm_setup(r);
    const uint64_t words = op_quant_x8_bytes(r->M, r->K) / 4, scales = (uint64_t)r->M * (r->K / 32);
    const float s = 1e-3f;
    uint32_t sbits;
    memcpy(&sbits, &s, 4);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, words * 4, VKD_MEM_DEVICE, "bench xq", &r->buf[2]);
    if (st == VKI_OK)
        st = vkd_fill(r->d, r->buf[2], 0, (words - scales) * 4, 0x01010101u);
    if (st == VKI_OK)
        st = vkd_fill(r->d, r->buf[2], (words - scales) * 4, scales * 4, sbits);
    return st;
}

static vki_status matvec_i8_record(bench_run *r, vkd_cmd *c)
{
    return op_matmul_i8(c, next_w(r), vkd_whole(r->buf[2]), vkd_whole(r->buf[1]), r->N, r->M, NULL);
}

/* The integer-dot product with the norm epilogue, as the engine's decode runs its attention-output
 * and down projections (M = 1, adding into the residual stream Y, the last workgroup writing the
 * next block's normed input H and its int8 copy HQ): its row against matvec_i8's is what the
 * epilogue costs. buf: 0 X, 1 Y, 2 XQ (i8_setup), 3 norm weight, 4 H, 5 counter, 6 HQ. */
static vki_status i8_norm_setup(bench_run *r)
{
    if (r->M != 1 || r->N % 32)
        return VKI_ERR_INVALID_ARG;
    vki_status st = i8_setup(r);
    if (st == VKI_OK)
        st = make_floats(r, r->N, "bench norm w", &r->buf[3]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->N * 4, VKD_MEM_DEVICE, "bench h", &r->buf[4]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, 4, VKD_MEM_DEVICE, "bench norm counter", &r->buf[5]);
    if (st == VKI_OK)
        st = vkd_fill(r->d, r->buf[5], 0, 4, 0);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, op_quant_x8_bytes(1, r->N), VKD_MEM_DEVICE, "bench hq", &r->buf[6]);
    r->bytes += 4.0 * r->N * 3 + op_quant_x8_bytes(1, r->N); /* Y read back, norm weight, H, HQ */
    return st;
}

static vki_status matvec_i8_norm_record(bench_run *r, vkd_cmd *c)
{
    const op_mm_norm n = {.weight = vkd_whole(r->buf[3]), .h = vkd_whole(r->buf[4]), .counter = vkd_whole(r->buf[5]),
                          .eps = 1e-5f, .xq = vkd_whole(r->buf[6])};
    const op_mm_i8 o = {.accumulate = true, .norm = &n};
    return op_matmul_i8(c, next_w(r), vkd_whole(r->buf[2]), vkd_whole(r->buf[1]), r->N, r->M, &o);
}

/* quant_x8 alone: M rows of K floats to int8 blocks. buf: 0 X, 1 XQ. */
static vki_status quant_x8_setup(bench_run *r)
{
    vki_status st = make_floats(r, (size_t)r->M * r->K, "bench x", &r->buf[0]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, op_quant_x8_bytes(r->M, r->K), VKD_MEM_DEVICE, "bench xq", &r->buf[1]);
    r->bytes = 4.0 * r->M * r->K + (double)op_quant_x8_bytes(r->M, r->K);
    return st;
}

static vki_status quant_x8_record(bench_run *r, vkd_cmd *c)
{
    return op_quant_x8(c, vkd_whole(r->buf[0]), r->K, r->M, r->K, vkd_whole(r->buf[1]));
}

/* The cooperative-matrix GEMM of the device's path (tensor cores, or the emulation with
 * --coopmat emulate); "unsupported" on devices with neither. */
static vki_status matmul_cm_record(bench_run *r, vkd_cmd *c)
{
    return op_matmul_path(c, next_w(r), NULL, vkd_whole(r->buf[0]), r->K, vkd_whole(r->buf[1]), r->N, r->M, OP_MM_COOPMAT);
}

/* The tensor-core GEMM as the forward pass records it (op_matmul_takes_xh): X rounded to F16 by
 * op_half_x, a barrier, the GEMM reading the F16 rows; timed together, against matmul_cm's
 * conversion inside every tile. buf[2]: the F16 rows. */
static vki_status mm_xh_setup(bench_run *r)
{
    vki_status st = mm_setup(r);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, op_half_x_bytes(r->M, r->K), VKD_MEM_DEVICE, "bench xh", &r->buf[2]);
    return st;
}

static vki_status matmul_cm_xh_record(bench_run *r, vkd_cmd *c)
{
    vki_status st = op_half_x(c, vkd_whole(r->buf[0]), r->K, r->M, r->K, vkd_whole(r->buf[2]));
    vkd_barrier(c);
    return st == VKI_OK ? op_matmul_xh(c, next_w(r), NULL, vkd_whole(r->buf[2]), vkd_whole(r->buf[1]), r->N, r->M, false)
                        : st;
}

/* cm_peak (shaders/cm_peak.comp): M workgroups of 4 subgroups, N multiply-adds per accumulator,
 * K accumulators per subgroup. buf: 0 the A/B values, 1 the accumulators' destination. */
#define PEAK_SUBGROUPS 4u

static vki_status cm_peak_spec(const bench_run *r, uint32_t spec[6])
{
    const vkd_cm *cm = &r->d->cm;
    if (cm->kind == VKD_CM_NONE || PEAK_SUBGROUPS * cm->sg > r->d->info.max_workgroup_invocations)
        return VKI_ERR_UNSUPPORTED;
    const uint32_t v[6] = {PEAK_SUBGROUPS * cm->sg, r->K, cm->m, cm->n, cm->k, cm->sg};
    memcpy(spec, v, sizeof v);
    return VKI_OK;
}

static vki_status cm_peak_setup(bench_run *r)
{
    uint32_t spec[6];
    vki_status st = cm_peak_spec(r, spec);
    const vkd_cm *cm = &r->d->cm;
    if (st == VKI_OK)
        st = make_floats(r, (size_t)cm->m * cm->k + (size_t)cm->k * cm->n, "bench cm src", &r->buf[0]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, 4ull * r->M * PEAK_SUBGROUPS * r->K * cm->m * cm->n, VKD_MEM_DEVICE,
                               "bench cm dst", &r->buf[1]);
    r->bytes = 0;
    r->flops = 2.0 * cm->m * cm->n * cm->k * r->K * (double)r->N * PEAK_SUBGROUPS * r->M;
    return st;
}

static vki_status cm_peak_record(bench_run *r, vkd_cmd *c)
{
    uint32_t spec[6];
    vki_status st = cm_peak_spec(r, spec);
    vki_pc_cm_peak pc = {.n_iter = r->N};
    vkd_view b[2] = {vkd_whole(r->buf[0]), vkd_whole(r->buf[1])};
    if (st == VKI_OK)
        st = vkk_dispatch(c, r->d->cm.kind == VKD_CM_NV ? VKK_CM_PEAK : VKK_CM_PEAK_EMU, spec, b, 2, &pc, sizeof pc,
                          r->M, 1, 1);
    return st;
}

/* y[M, K] = W[ids[M], :], a table of N rows. buf: 0 ids, 1 y. */
static vki_status get_rows_setup(bench_run *r)
{
    vki_status st = make_weights(r, r->N, r->K);
    int32_t *ids = malloc((size_t)r->M * 4);
    if (!ids)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < r->M; i++)
        ids[i] = (int32_t)(vki_splitmix64(&r->rng) % r->N);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->M * 4, VKD_MEM_DEVICE, "bench ids", &r->buf[0]);
    if (st == VKI_OK)
        st = vkd_upload(r->d, r->buf[0], 0, ids, (size_t)r->M * 4);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->M * r->K * 4, VKD_MEM_DEVICE, "bench y", &r->buf[1]);
    free(ids);
    r->bytes = (double)r->w[0].src_row_bytes * r->M + 4.0 * r->M + 4.0 * r->M * r->K;
    r->flops = 0;
    return st;
}

static vki_status get_rows_record(bench_run *r, vkd_cmd *c)
{
    return op_get_rows(c, next_w(r), vkd_whole(r->buf[0]), r->M, vkd_whole(r->buf[1]), r->K);
}

/* ---- copy: the bandwidth ceiling (engine/ops_basic.h) ----------------------------------------- */

/* M MiB copied from one buffer to another; bytes read + written. buf: 0 src, 1 dst. */
static vki_status copy_setup(bench_run *r)
{
    size_t n = (size_t)r->M << 20;
    vki_status st = make_floats(r, n / 4, "bench copy src", &r->buf[0]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, n, VKD_MEM_DEVICE, "bench copy dst", &r->buf[1]);
    r->bytes = 2.0 * n;
    r->flops = 0;
    return st;
}

static vki_status copy_record(bench_run *r, vkd_cmd *c)
{
    return op_copy(c, vkd_whole(r->buf[0]), vkd_whole(r->buf[1]), (uint64_t)r->M << 20);
}

/* What a compute barrier costs between small dispatches (a batch-1 decode step is ~300 of them):
 * a call is M one-workgroup adds of N floats, each into its own slice of Y, with a barrier after
 * every one (K = 1) or none inside the call (K = 0); the difference of the two rows' time per
 * dispatch (us_per_call / M) is the barrier's. buf: 0 a, 1 b, 2 y [M][N]. */
static vki_status chain_setup(bench_run *r)
{
    vki_status st = make_floats(r, r->N, "bench a", &r->buf[0]);
    if (st == VKI_OK)
        st = make_floats(r, r->N, "bench b", &r->buf[1]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->M * r->N * 4, VKD_MEM_DEVICE, "bench y", &r->buf[2]);
    r->bytes = 12.0 * r->M * r->N;
    r->flops = 0;
    return r->K > 1 ? VKI_ERR_INVALID_ARG : st;
}

static vki_status chain_record(bench_run *r, vkd_cmd *c)
{
    for (uint32_t j = 0; j < r->M; j++) {
        vkd_view y = {r->buf[2], (VkDeviceSize)j * r->N * 4, (VkDeviceSize)r->N * 4};
        vki_status st = op_add(c, vkd_whole(r->buf[0]), vkd_whole(r->buf[1]), y, r->N);
        if (st != VKI_OK)
            return st;
        if (r->K && j + 1 < r->M)
            vkd_barrier(c);
    }
    return VKI_OK;
}

#define WEIGHT_TYPE_ID(T, t) VKI_GGML_##T,
#define WEIGHT_TYPES .types = {VKK_WEIGHT_TYPES(WEIGHT_TYPE_ID)}, .n_types = BENCH_WEIGHT_TYPES

/* ---- row norms, elementwise, rope, attention (engine/ops_basic.h, engine/ops_attn.h) ------- */

/* M rows of N floats. buf: 0 x, 1 w (or u), 2 y. */
static vki_status rows_setup(bench_run *r)
{
    vki_status st = make_floats(r, (size_t)r->M * r->N, "bench x", &r->buf[0]);
    if (st == VKI_OK)
        st = make_floats(r, (size_t)r->M * r->N, "bench w", &r->buf[1]);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)r->M * r->N * 4, VKD_MEM_DEVICE, "bench y", &r->buf[2]);
    r->bytes = 8.0 * r->M * r->N;
    r->flops = 0;
    return st;
}

static vki_status rmsnorm_setup(bench_run *r)
{
    vki_status st = rows_setup(r);
    r->bytes = 8.0 * r->M * r->N + 4.0 * r->N;
    r->flops = 4.0 * r->M * r->N;
    return st;
}

static vki_status rmsnorm_record(bench_run *r, vkd_cmd *c)
{
    return op_rmsnorm(c, op_mat_rows(r->buf[0], r->N), vkd_whole(r->buf[1]), op_mat_rows(r->buf[2], r->N), r->M,
                      r->N, 1e-5f);
}

static vki_status softmax_record(bench_run *r, vkd_cmd *c)
{
    return op_softmax(c, op_mat_rows(r->buf[0], r->N), op_mat_rows(r->buf[2], r->N), r->M, r->N, 1.0f);
}

static vki_status swiglu_setup(bench_run *r)
{
    vki_status st = rows_setup(r);
    r->bytes = 12.0 * r->M * r->N;
    return st;
}

static vki_status swiglu_record(bench_run *r, vkd_cmd *c)
{
    return op_glu(c, VKI_GLU_SILU, op_mat_rows(r->buf[0], r->N), op_mat_rows(r->buf[1], r->N), op_mat_rows(r->buf[2], r->N),
                     r->M, r->N);
}

/* In place over M tokens x N heads x K head dims, NeoX. buf: 0 x, 1 pos, 2 freq table. */
static vki_status rope_setup(bench_run *r)
{
    size_t n = (size_t)r->M * r->N * r->K;
    uint32_t *pos = malloc(r->M * 4);
    float *tab = malloc(2 * r->K * sizeof *tab);
    vki_status st = pos && tab ? make_floats(r, n, "bench x", &r->buf[0]) : VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; pos && i < r->M; i++)
        pos[i] = 1000 + i;
    if (tab)
        op_rope_freqs(500000.0, 1.0, NULL, NULL, 1.0f, r->K, tab);
    if (st == VKI_OK && (st = vkd_buffer_create(r->d, r->M * 4, VKD_MEM_DEVICE, "bench pos", &r->buf[1])) == VKI_OK)
        st = vkd_upload(r->d, r->buf[1], 0, pos, r->M * 4);
    if (st == VKI_OK && (st = vkd_buffer_create(r->d, 8 * r->K, VKD_MEM_DEVICE, "bench freqs", &r->buf[2])) == VKI_OK)
        st = vkd_upload(r->d, r->buf[2], 0, tab, 8 * r->K);
    free(pos);
    free(tab);
    r->bytes = 8.0 * n;
    r->flops = 3.0 * n;
    return st;
}

static vki_status rope_record(bench_run *r, vkd_cmd *c)
{
    op_rope_p p = {.n_tokens = r->M, .n_heads = r->N, .head_dim = r->K, .n_rot = r->K, .neox = true};
    op_mat x = op_mat_rows(r->buf[0], r->N * r->K);
    return op_rope(c, &p, x, x, vkd_whole(r->buf[1]), vkd_whole(r->buf[2]));
}

/* Attention with 32 query heads over 8 KV heads (GQA 4, Llama-3-8B-like), pages of 16, the KV
 * type as `type`. decode: M one-token sequences of context N each, as the engine runs a decode
 * step (q rotated by NeoX RoPE in the kernel, the newest key and value from the projection:
 * op_attn_fresh); prefill: one sequence of M new tokens after N cached ones. K: head dim. buf:
 * 0 q (decode: q | k | v rows), 1 out, 2 K pool, 3 V pool, 4 the step buffers (tok_pos |
 * tok_seq | seq_info | page_table | items, 256-byte aligned), 5 partials, 6 merge counters,
 * 7 RoPE table (decode). */
#define BA_HEADS 32u
#define BA_KV 8u
#define BA_PAGE 16u

typedef struct attn_bench {
    op_attn a;
    op_attn_plan plan;
    vki_seq_info *info;
    vki_attn_item *items;
    uint32_t n_seqs, n_pages, pt_len, cap;
    VkDeviceSize off[5], size; /* byte offsets of the step buffers in buf[4] */
} attn_bench;

static void attn_bench_free(attn_bench *ab)
{
    free(ab->info);
    free(ab->items);
}

/* Host side of the bench's step (pipelines, plan, offsets); the same for setup and record. */
static vki_status attn_bench_plan(bench_run *r, bool decode, attn_bench *ab)
{
    memset(ab, 0, sizeof *ab);
    op_attn_shape s = {.n_heads = BA_HEADS, .n_kv_heads = BA_KV, .head_dim = r->K, .page_size = BA_PAGE,
                       .kv_type = r->type};
    vki_status st = op_attn_setup(r->d, &s, &ab->a);
    if (st != VKI_OK)
        return st;
    ab->n_seqs = decode ? r->M : 1;
    uint32_t ctx = decode ? r->N : r->N + r->M, per = (ctx + BA_PAGE - 1) / BA_PAGE, n_tok = r->M;
    ab->pt_len = per * ab->n_seqs;
    ab->n_pages = ab->pt_len;
    ab->cap = op_attn_max_items(&ab->a, ab->n_seqs, n_tok);
    ab->info = malloc(ab->n_seqs * sizeof *ab->info);
    ab->items = malloc((size_t)ab->cap * sizeof *ab->items);
    if (!ab->info || !ab->items)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; i < ab->n_seqs; i++)
        ab->info[i] = (vki_seq_info){.row0 = decode ? i : 0, .n_new = decode ? 1 : r->M, .n_ctx = ctx, .pt_off = i * per};
    st = op_attn_plan_build(&ab->a, ab->info, ab->n_seqs, ab->items, ab->cap, &ab->plan);
    VkDeviceSize sizes[5] = {4ull * n_tok, 4ull * n_tok, sizeof(vki_seq_info) * ab->n_seqs, 4ull * ab->pt_len,
                             sizeof(vki_attn_item) * ab->plan.n_items};
    for (int i = 0; i < 5; i++) {
        ab->off[i] = ab->size;
        ab->size += (sizes[i] + 255) / 256 * 256;
    }
    return st;
}

/* A pool of `bytes`: random floats (F32), or random halves (F16; Q8_0, where they also make
 * finite int8 quants and f16 scales). */
static vki_status make_kv_pool(bench_run *r, size_t bytes, const char *name, vkd_buffer **out)
{
    if (r->type == VKI_GGML_F32)
        return make_floats(r, bytes / 4, name, out);
    uint8_t *h = malloc(bytes);
    if (!h)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < bytes / 2; i++)
        put_f16(h + 2 * i, rng_float(&r->rng));
    vki_status st = vkd_buffer_create(r->d, bytes, VKD_MEM_DEVICE, name, out);
    if (st == VKI_OK)
        st = vkd_upload(r->d, *out, 0, h, bytes);
    free(h);
    return st;
}

static vki_status attn_setup(bench_run *r, bool decode)
{
    attn_bench ab;
    vki_status st = attn_bench_plan(r, decode, &ab);
    uint32_t n_tok = r->M, row = BA_HEADS * r->K;
    size_t pool = st == VKI_OK ? (size_t)ab.n_pages * op_kv_page_bytes(&ab.a.s) : 0;
    uint8_t *step = st == VKI_OK ? calloc(1, ab.size) : NULL;
    if (st == VKI_OK && !step)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (step) {
        for (uint32_t i = 0; i < ab.pt_len; i++)
            memcpy(step + ab.off[3] + 4 * i, &i, 4);
        memcpy(step + ab.off[2], ab.info, sizeof(vki_seq_info) * ab.n_seqs);
        memcpy(step + ab.off[4], ab.items, sizeof(vki_attn_item) * ab.plan.n_items);
    }
    uint32_t q_stride = decode ? row + 2 * BA_KV * r->K : row;
    if (st == VKI_OK)
        st = make_floats(r, (size_t)n_tok * q_stride, "bench q", &r->buf[0]);
    float *tab = decode ? malloc(2 * r->K * sizeof *tab) : NULL;
    if (decode && st == VKI_OK && !tab)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    if (tab && st == VKI_OK) {
        op_rope_freqs(500000.0, 1.0, NULL, NULL, 1.0f, r->K, tab);
        if ((st = vkd_buffer_create(r->d, 8 * r->K, VKD_MEM_DEVICE, "bench freqs", &r->buf[7])) == VKI_OK)
            st = vkd_upload(r->d, r->buf[7], 0, tab, 8 * r->K);
    }
    free(tab);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, (size_t)n_tok * row * 4, VKD_MEM_DEVICE, "bench out", &r->buf[1]);
    if (st == VKI_OK)
        st = make_kv_pool(r, pool, "bench K", &r->buf[2]);
    if (st == VKI_OK)
        st = make_kv_pool(r, pool, "bench V", &r->buf[3]);
    if (st == VKI_OK && (st = vkd_buffer_create(r->d, ab.size, VKD_MEM_DEVICE, "bench step", &r->buf[4])) == VKI_OK)
        st = vkd_upload(r->d, r->buf[4], 0, step, ab.size);
    uint64_t sb = op_attn_scratch_bytes(&ab.a, ab.plan.n_slots);
    if (st == VKI_OK)
        st = vkd_buffer_create(r->d, sb ? sb : 4, VKD_MEM_DEVICE, "bench partials", &r->buf[5]);
    uint64_t mb = op_attn_merge_bytes(&ab.a, ab.plan.dec_off - ab.plan.red_off);
    if (st == VKI_OK && (st = vkd_buffer_create(r->d, mb, VKD_MEM_DEVICE, "bench merge counters", &r->buf[6])) == VKI_OK)
        st = vkd_fill(r->d, r->buf[6], 0, mb, 0);
    double esz = r->type == VKI_GGML_F16 ? 2 : r->type == VKI_GGML_Q8_0 ? 34.0 / 32 : 4, keys = (double)r->N + r->M;
    double pairs = decode ? (double)r->M * r->N : (double)r->M * r->N + 0.5 * r->M * (r->M + 1.0);
    r->bytes = (decode ? r->M : 1) * (decode ? r->N : keys) * BA_KV * r->K * 2 * esz + 4.0 * n_tok * (q_stride + row);
    r->flops = 4.0 * pairs * BA_HEADS * r->K;
    free(step);
    attn_bench_free(&ab);
    return st;
}

static vki_status attn_record(bench_run *r, vkd_cmd *c, bool decode)
{
    attn_bench ab;
    vki_status st = attn_bench_plan(r, decode, &ab);
    if (st == VKI_OK) {
        const vkd_buffer *sb = r->buf[4];
        vkd_view v[5];
        for (int i = 0; i < 5; i++)
            v[i] = (vkd_view){sb, ab.off[i], (i < 4 ? ab.off[i + 1] : ab.size) - ab.off[i]};
        op_attn_step step = {v[0], v[1], v[2], v[3], v[4], &ab.plan};
        uint32_t row = BA_HEADS * r->K, kvrow = BA_KV * r->K, qs = decode ? row + 2 * kvrow : row;
        vkd_view merge = vkd_whole(r->buf[6]); /* as the engine: the last decode split merges */
        op_kv_rope kr = {.n_rot = r->K, .neox = true, .freqs = decode ? vkd_whole(r->buf[7]) : (vkd_view){0}};
        op_attn_fresh fresh = {{vkd_whole(r->buf[0]), row, qs}, {vkd_whole(r->buf[0]), row + kvrow, qs}, &kr, {0}};
        st = op_attention(c, &ab.a, &step, (op_mat){vkd_whole(r->buf[0]), 0, qs}, op_mat_rows(r->buf[1], row),
                          vkd_whole(r->buf[2]), vkd_whole(r->buf[3]), vkd_whole(r->buf[5]), &merge,
                          decode ? &fresh : NULL, NULL);
    }
    attn_bench_free(&ab);
    return st;
}

static vki_status attn_decode_setup(bench_run *r) { return attn_setup(r, true); }
static vki_status attn_decode_record(bench_run *r, vkd_cmd *c) { return attn_record(r, c, true); }
static vki_status attn_prefill_setup(bench_run *r) { return attn_setup(r, false); }
static vki_status attn_prefill_record(bench_run *r, vkd_cmd *c) { return attn_record(r, c, false); }

/* ---- sampling (engine/ops_sample.h) ----------------------------------------------------------- */

/* M rows of an N-token vocabulary, parameter preset K: 1 greedy; 2 temperature 0.8, top_k 40,
 * top_p 0.95, min_p 0.05; 3 temperature 1, top_p 0.9 (no top-k: the top-p select runs over the
 * whole row); 4 preset 2 + repetition/presence/frequency penalties over 64 history tokens and
 * 5 top logprobs. Logits are normal with standard deviation 3 (top-p 0.9 then keeps ~1500
 * of 32k tokens, more than the kernel's candidate list). Bytes: one read of the logits rows.
 * buf: 0 logits, 1 rows, 2 edits, 3 saved, 4 out. */
static vki_status sample_setup(bench_run *r)
{
    vki_sampling_params p = vki_sampling_default_params();
    p.temperature = r->K == 1 ? 0.0f : r->K == 3 ? 1.0f : 0.8f;
    p.top_k = r->K == 2 || r->K == 4 ? 40 : 0;
    p.top_p = r->K == 3 ? 0.9f : 0.95f;
    p.min_p = r->K == 2 || r->K == 4 ? 0.05f : 0.0f;
    if (r->K == 4) {
        p.repetition_penalty = 1.1f, p.presence_penalty = 0.3f, p.frequency_penalty = 0.2f;
        p.logprobs = true, p.top_logprobs = 5;
    }
    int32_t hist[64];
    for (int i = 0; i < 64; i++)
        hist[i] = (int32_t)(vki_splitmix64(&r->rng) % r->N);
    vki_sample_row *rows = malloc(r->M * sizeof *rows);
    vki_sample_edit *edits = malloc((size_t)r->M * 64 * sizeof *edits);
    uint32_t used = 0;
    vki_status st = rows && edits ? VKI_OK : VKI_ERR_OUT_OF_HOST_MEMORY;
    for (uint32_t i = 0; st == VKI_OK && i < r->M; i++) {
        sample_req q = {&p, vki_splitmix64(&r->rng), 1000 + i, hist, 64, NULL, false, -1};
        uint32_t n = 0;
        char err[128];
        st = sample_pack_row(&q, r->N, used, 0, &rows[i], edits + used, 64, &n, err, sizeof err);
        used += n;
    }
    size_t n = (size_t)r->M * r->N;
    float *x = st == VKI_OK ? malloc(n * sizeof *x) : NULL;
    if (st == VKI_OK && !x)
        st = VKI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; x && i < n; i++) { /* Box-Muller */
        double u1 = (rng_float(&r->rng) + 1.0) * 0.5 + 1e-12, u2 = (rng_float(&r->rng) + 1.0) * 0.5;
        x[i] = (float)(3.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    if (st == VKI_OK && (st = vkd_buffer_create(r->d, n * 4, VKD_MEM_DEVICE, "bench logits", &r->buf[0])) == VKI_OK)
        st = vkd_upload(r->d, r->buf[0], 0, x, n * 4);
    free(x);
    const void *src[3] = {rows, edits, NULL};
    size_t bytes[5] = {r->M * sizeof *rows, (used ? used : 1) * sizeof *edits, (used ? used : 1) * 4,
                       r->M * sizeof(vki_sample_out)};
    for (int i = 1; st == VKI_OK && i < 5; i++) {
        st = vkd_buffer_create(r->d, bytes[i - 1], VKD_MEM_DEVICE, "bench sample", &r->buf[i]);
        if (st == VKI_OK && i < 3)
            st = vkd_upload(r->d, r->buf[i], 0, src[i - 1], bytes[i - 1]);
    }
    free(rows);
    free(edits);
    r->bytes = 4.0 * r->M * r->N;
    r->flops = 0;
    return st;
}

static vki_status sample_record(bench_run *r, vkd_cmd *c)
{
    op_sample_args a = {.logits = vkd_whole(r->buf[0]), .row_stride = r->N, .n_rows = r->M, .n_vocab = r->N,
                        .rows = vkd_whole(r->buf[1]), .edits = vkd_whole(r->buf[2]),
                        .saved = vkd_whole(r->buf[3]), .out = vkd_whole(r->buf[4])};
    return op_sample(c, &a);
}

/* ---- the registration table ---------------------------------------------------------------- */

static const bench_kernel benches[] = {
    /* first: the rows after it report their GB/s as a share of its */
    {"copy", "M MiB copied (bytes read + written)", .types = {VKI_GGML_F32}, .n_types = 1,
     .full = {{512, 1, 1}}, .small = {{32, 1, 1}}, copy_setup, copy_record},
    {"matvec", "M activation rows (<= 8 per pass), N weight rows, K", WEIGHT_TYPES,
     .full = {{1, 4096, 4096}, {1, 14336, 4096}, {1, 4096, 14336}, {1, 32000, 4096}, {8, 4096, 4096},
              {1, 2048, 2048}}, /* (d_model 2048: 64 integer-dot units of 32 per row, half of 128 lanes) */
     .small = {{1, 1024, 1024}, {1, 2816, 1024}, {1, 8192, 512}, {8, 1024, 1024}},
     mm_setup, matvec_record},
    {"matvec_i8", "as matvec, on the integer-dot path: the product of X already quantised to int8 (quant_x8's row)",
     .types = {VKI_GGML_Q4_K, VKI_GGML_Q8_0, VKI_GGML_Q6_K, VKI_GGML_Q4_0, VKI_GGML_Q5_K, VKI_GGML_IQ4_XS,
               VKI_GGML_IQ4_NL, VKI_GGML_Q5_0, VKI_GGML_Q4_1, VKI_GGML_Q5_1, VKI_GGML_Q3_K, VKI_GGML_Q2_K,
               VKI_GGML_MXFP4},
     .n_types = 13,
     .full = {{1, 4096, 4096}, {1, 14336, 4096}, {1, 4096, 14336}, {1, 32000, 4096}, {8, 4096, 4096},
              {1, 2048, 2048}}, /* (d_model 2048: 64 integer-dot units of 32 per row, half of 128 lanes) */
     .small = {{1, 1024, 1024}, {1, 2816, 1024}, {1, 8192, 512}, {8, 1024, 1024}},
     i8_setup, matvec_i8_record},
    {"matvec_i8_norm", "as matvec_i8 (M = 1, N % 32 == 0), adding into Y, with the norm epilogue: "
                       "the last workgroup writes H = rmsnorm(Y) and its int8 copy",
     .types = {VKI_GGML_Q4_K, VKI_GGML_Q6_K, VKI_GGML_Q8_0}, .n_types = 3,
     .full = {{1, 4096, 4096}, {1, 4096, 14336}}, .small = {{1, 1024, 1024}, {1, 1024, 2816}},
     i8_norm_setup, matvec_i8_norm_record},
    {"quant_x8", "M rows, K columns (N = 1): X to int8 blocks for matvec_i8", .types = {VKI_GGML_F32}, .n_types = 1,
     .full = {{1, 1, 4096}, {1, 1, 14336}, {8, 1, 4096}}, .small = {{1, 1, 1024}, {8, 1, 1024}},
     quant_x8_setup, quant_x8_record},
    {"matmul", "M activation rows, N weight rows, K", WEIGHT_TYPES,
     .full = {{512, 4096, 4096}, {512, 14336, 4096}, {64, 4096, 4096}},
     .small = {{128, 512, 512}, {32, 512, 512}},
     mm_setup, matmul_record},
    {"matmul_cm", "M activation rows, N weight rows, K; cooperative matrices (F16 operands)", WEIGHT_TYPES,
     .full = {{512, 4096, 4096}, {512, 14336, 4096}, {2048, 4096, 4096}, {64, 4096, 4096}},
     .small = {{128, 512, 512}, {32, 512, 512}},
     mm_setup, matmul_cm_record},
    {"matmul_cm_xh", "as matmul_cm with X rounded to F16 once first (op_half_x + a barrier, timed with it)",
     WEIGHT_TYPES, .full = {{512, 4096, 4096}, {512, 14336, 4096}, {2048, 4096, 4096}, {64, 4096, 4096}},
     .small = {{128, 512, 512}, {32, 512, 512}},
     mm_xh_setup, matmul_cm_xh_record},
    {"cm_peak", "M workgroups of 4 subgroups, N multiply-adds, K accumulators per subgroup",
     .types = {VKI_GGML_F16}, .n_types = 1,
     .full = {{1056, 4096, 4}, {1056, 4096, 8}, {2112, 4096, 8}}, .small = {{4, 64, 4}},
     cm_peak_setup, cm_peak_record},
    {"barrier", "M dispatches of one workgroup (add of N floats) per call, K = 1: a barrier after each, 0: none",
     .types = {VKI_GGML_F32}, .n_types = 1,
     .full = {{64, 256, 0}, {64, 256, 1}}, .small = {{64, 256, 0}, {64, 256, 1}},
     chain_setup, chain_record},
    {"get_rows", "M ids, N table rows, K", WEIGHT_TYPES,
     .full = {{512, 32000, 4096}, {1, 32000, 4096}},
     .small = {{128, 8000, 1024}, {1, 8000, 1024}},
     get_rows_setup, get_rows_record},
    {"rmsnorm", "M rows, N columns", .types = {VKI_GGML_F32}, .n_types = 1,
     .full = {{1, 4096, 1}, {512, 4096, 1}}, .small = {{1, 1024, 1}, {128, 1024, 1}},
     rmsnorm_setup, rmsnorm_record},
    {"softmax", "M rows, N columns", .types = {VKI_GGML_F32}, .n_types = 1,
     .full = {{1, 128256, 1}, {512, 4096, 1}}, .small = {{1, 32000, 1}, {64, 1024, 1}},
     rows_setup, softmax_record},
    {"swiglu", "M rows, N columns", .types = {VKI_GGML_F32}, .n_types = 1,
     .full = {{1, 14336, 1}, {512, 14336, 1}}, .small = {{1, 2816, 1}, {128, 2816, 1}},
     swiglu_setup, swiglu_record},
    {"rope", "M tokens, N heads, K head dim (NeoX, in place)", .types = {VKI_GGML_F32}, .n_types = 1,
     .full = {{1, 32, 128}, {512, 32, 128}}, .small = {{1, 8, 64}, {128, 8, 64}},
     rope_setup, rope_record},
    {"attn_decode", "M sequences of context N, K head dim; 32/8 heads; type = KV cache",
     .types = {VKI_GGML_F16, VKI_GGML_F32, VKI_GGML_Q8_0}, .n_types = 3,
     .full = {{1, 512, 128}, {1, 4096, 128}, {1, 32768, 128}, {64, 1024, 128}},
     .small = {{1, 512, 64}, {8, 256, 64}},
     attn_decode_setup, attn_decode_record},
    {"attn_prefill", "M new tokens after N cached, K head dim; 32/8 heads; type = KV cache",
     .types = {VKI_GGML_F16, VKI_GGML_F32, VKI_GGML_Q8_0}, .n_types = 3,
     .full = {{512, 0, 128}, {512, 3584, 128}, {2048, 0, 128}}, .small = {{128, 0, 64}, {64, 448, 64}},
     attn_prefill_setup, attn_prefill_record},
    {"sample", "M rows, N vocab, K params: 1 greedy, 2 T.8 k40 p.95 minp.05, 3 T1 p.9, 4 = 2 + penalties + 5 logprobs",
     .types = {VKI_GGML_F32}, .n_types = 1,
     .full = {{64, 32000, 2}, {64, 128256, 2}, {64, 32000, 1}, {64, 32000, 3}, {64, 32000, 4}, {1, 262144, 2},
              {1, 128256, 1}, {1, 128256, 2}},
     .small = {{64, 32000, 2}, {64, 128256, 2}, {64, 32000, 1}, {64, 32000, 3}, {64, 32000, 4}},
     sample_setup, sample_record},
};
#define N_BENCHES (sizeof benches / sizeof benches[0])

/* ---- timing and output ---------------------------------------------------------------------- */

typedef struct bench_out {
    bool json;           /* JSON lines on stdout, the table on stderr */
    FILE *table;
    const vkd_device *d;
    double copy_gbps;    /* the copy row's GB/s once measured, else 0 */
    bench_shape copy_shape;
    uint32_t n_rows;     /* rows printed */
} bench_out;

typedef struct record_ctx {
    const bench_kernel *b;
    bench_run *r;
} record_ctx;

static vki_status record_one(void *ctx, vkd_cmd *c)
{
    record_ctx *k = ctx;
    return k->b->record(k->r, c);
}

/* Median (or the minimum, o->fastest) over reps of the per-call time of a batch, in seconds;
 * the fastest and slowest batch into *tm when given. */
static vki_status time_run(const bench_kernel *b, bench_run *r, vkd_cmd *c, const devprobe_opts *o,
                           double *per_call, devprobe_timing *tm)
{
    record_ctx k = {b, r};
    devprobe_timing t = {0};
    vki_status st = devprobe_time(c, record_one, &k, o, &t);
    *per_call = t.sec_per_call;
    if (tm)
        *tm = t;
    return st;
}

static void run_release(bench_run *r)
{
    for (uint32_t i = 0; i < r->n_w; i++)
        vk_tensor_destroy(r->d, &r->w[i]);
    r->n_w = 0;
    for (int i = 0; i < MAX_BUFS; i++)
        vkd_buffer_destroy(r->d, r->buf[i]);
    memset(r->buf, 0, sizeof r->buf);
}

static void print_row(bench_out *out, const char *kernel, const char *tname, bench_shape s, vki_status st,
                      const bench_run *r, const devprobe_timing *tm)
{
    const double per_call = tm->sec_per_call;
    if (st != VKI_OK) {
        fprintf(out->table, "%-14s %-5s %6u %6u %6u   %s\n", kernel, tname, s.M, s.N, s.K, vki_status_str(st));
        return;
    }
    double gbps = r->bytes / per_call * 1e-9, frac = out->copy_gbps > 0 ? gbps / out->copy_gbps : -1;
    char gf[32] = "-", tf[32] = "-", pc[32] = "-", fr[32] = "null";
    if (r->flops > 0) {
        snprintf(gf, sizeof gf, "%.1f", r->flops / per_call * 1e-9);
        snprintf(tf, sizeof tf, "%.3f", r->flops / per_call * 1e-12);
    }
    if (frac >= 0) {
        snprintf(pc, sizeof pc, "%.1f", 100 * frac);
        snprintf(fr, sizeof fr, "%.4f", frac);
    }
    /* the K splits of the tensor-core GEMM; the timed batches' spread around the median */
    const uint32_t splits = !strncmp(kernel, "matmul_cm", 9) ? op_matmul_cm_splits(out->d, s.M, s.N, s.K) : 0;
    char sp[16] = "-", js[16] = "null";
    if (splits) {
        snprintf(sp, sizeof sp, "%u", splits);
        snprintf(js, sizeof js, "%u", splits);
    }
    fprintf(out->table, "%-14s %-5s %6u %6u %6u %11.1f %9.1f %9s %8s %6s %6.1f %5s\n", kernel, tname, s.M, s.N, s.K,
            per_call * 1e6, gbps, gf, tf, pc, 100 * (tm->max - tm->min) / per_call, sp);
    fflush(out->table);
    if (!out->json)
        return;
    char cfg[32] = "null", cm_cfg[32] = "null", num[6][12];
    if (out->d->matvec_wg && out->d->matvec_mu)
        snprintf(cfg, sizeof cfg, "\"%ux%ux%ux%u\"", out->d->matvec_wg, out->d->matvec_rows, out->d->matvec_mc,
                 out->d->matvec_mu);
    else if (out->d->matvec_wg && out->d->matvec_mc)
        snprintf(cfg, sizeof cfg, "\"%ux%ux%u\"", out->d->matvec_wg, out->d->matvec_rows, out->d->matvec_mc);
    else if (out->d->matvec_wg)
        snprintf(cfg, sizeof cfg, "\"%ux%u\"", out->d->matvec_wg, out->d->matvec_rows);
    if (out->d->cm_tile_m && out->d->cm_warp_m)
        snprintf(cm_cfg, sizeof cm_cfg, "\"%ux%ux%ux%u\"", out->d->cm_tile_m, out->d->cm_tile_n, out->d->cm_warp_m,
                 out->d->cm_warp_n);
    else if (out->d->cm_tile_m)
        snprintf(cm_cfg, sizeof cm_cfg, "\"%ux%u\"", out->d->cm_tile_m, out->d->cm_tile_n);
    /* the one-number tuning settings: JSON null where the library chooses */
    const uint32_t set[6] = {out->d->cm_stages, out->d->cm_bk, out->d->cm_split, out->d->attn_split,
                             out->d->attn_loads, out->d->sample_loads};
    for (int i = 0; i < 6; i++)
        if (set[i])
            snprintf(num[i], sizeof num[i], "%u", set[i]);
        else
            strcpy(num[i], "null");
    printf("{\"device\":\"%s\",\"driver\":\"%s %s\",\"kernel\":\"%s\",\"type\":\"%s\",\"M\":%u,\"N\":%u,"
           "\"K\":%u,\"us_per_call\":%.3f,\"gbps\":%.3f,\"gflops\":%.3f,\"copy_gbps\":%.3f,\"bw_fraction\":%s,"
           "\"matvec_cfg\":%s,\"cm_cfg\":%s,\"cm_stages\":%s,\"cm_bk\":%s,\"splits\":%s,\"cm_split\":%s,"
           "\"attn_split\":%s,\"attn_loads\":%s,\"sample_loads\":%s,\"cm_w16\":%s,\"us_min\":%.3f,\"us_max\":%.3f,"
           "\"warm_batches\":%u}\n",
           out->d->info.name, out->d->info.driver_name, out->d->info.driver_info, kernel, tname, s.M, s.N, s.K,
           per_call * 1e6, gbps, r->flops / per_call * 1e-9, out->copy_gbps, fr, cfg, cm_cfg, num[0], num[1], js,
           num[2], num[3], num[4], num[5], out->d->cm_w4 ? "false" : "true", tm->min * 1e6, tm->max * 1e6,
           tm->warm_batches);
    fflush(stdout);
}

static void bench_one(const bench_kernel *b, vkd_device *d, vkd_cmd *c, uint32_t type, bench_shape s,
                      const devprobe_opts *o, bench_out *out)
{
    const char *tname = quant_get(type) ? quant_get(type)->name : "?";
    bench_run r = {.d = d, .type = type, .M = s.M, .N = s.N, .K = s.K, .rng = 0x5eed ^ ((uint64_t)type << 32)};
    double per_call = 0;
    devprobe_timing tm = {0};
    vki_status st = b->setup(&r);
    if (st == VKI_OK)
        st = time_run(b, &r, c, o, &per_call, &tm);
    if (st == VKI_OK && b->setup == copy_setup && !out->copy_gbps) {
        out->copy_gbps = r.bytes / per_call * 1e-9;
        out->copy_shape = s;
    }
    print_row(out, b->setup == copy_setup && out->n_rows ? "copy-again" : b->name, tname, s, st, &r, &tm);
    out->n_rows++;
    run_release(&r);
}

/* ---- command line -------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: bench-kernels [options]\n"
               "  -k, --kernel LIST   comma-separated kernels (default: all)\n"
               "  -t, --type LIST     comma-separated weight types: f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,\n"
               "                      iq4_nl,q2_k,q3_k,q4_k,q5_k,q6_k,iq4_xs,mxfp4\n"
               "  -s, --shape MxNxK   a shape (repeatable); replaces the defaults\n"
               "      --small         the small default shapes (default on CPU devices)\n"
               "      --full          the model-sized default shapes (default on GPUs)\n"
               "  -d, --device I|NAME device index or name substring (default: $VKI_DEVICE, else\n"
               "                      discrete NVIDIA first)\n"
               "  -n, --iters N       calls per timed batch (default 20)\n"
               "  -w, --warmup N      calls in the warm-up batch (default 3)\n"
               "  -r, --reps N        timed batches; the median is printed (default 3)\n"
               "      --coopmat MODE  auto (tensor cores where the device has them), off, emulate\n"
               "      --crossover     per type: GEMV vs the device's GEMM for M = 8, 16, ... at the\n"
               "                      first shape's N x K; prints gemv_max_m (vki_device_params)\n"
               "      --json          one JSON object per table row on stdout (the table goes to stderr)\n"
               "      --matvec-cfg WGxR[xMC[xMU]]\n"
               "                      the matrix-vector kernel with WG invocations over R weight rows per\n"
               "                      workgroup instead of the library's choice (GPUs 128x4, CPUs one\n"
               "                      subgroup x 8); WG at most one subgroup (no shared-memory\n"
               "                      reduction) or a multiple of it; MC: activation rows per pass when\n"
               "                      M > 1 (default 8; each pass decodes the weights again); MU: units of\n"
               "                      each weight row per K pass, their loads issued together (default 1).\n"
               "                      The matvec rows and --crossover's\n"
               "                      GEMV take it; JSON rows carry \"matvec_cfg\" (null: the library's)\n"
               "      --warm-ms MS    warm-up batches repeat for at least MS ms before each row's timing\n"
               "                      (default 50 on GPUs, whose clocks drop while the host prepares a row;\n"
               "                      0 on CPU devices: one batch)\n"
               "      --cm-split S    the tensor-core GEMM with S K-splits where they fit (1: none) instead of\n"
               "                      the library's choice (two workgroups per compute unit); the table's and\n"
               "                      JSON's \"splits\" say what ran\n"
               "      --cm-cfg BMxBN[xWMxWN]\n"
               "                      the tensor-core GEMM (matmul_cm, --crossover's GEMM) with BM x BN tiles\n"
               "                      instead of the library's (128x128, 64x128 up to 64 rows): 128x128,\n"
               "                      64x128, 64x64, 32x32, 32x128, 32x64, 16x128, 16x64, 64x32; with WMxWN\n"
               "                      any tile, over subgroups of WM x WN (e.g. 128x128x64x64) where it fits;\n"
               "                      JSON rows carry \"cm_cfg\" (null: the library's)\n"
               "      --cm-stages S   the tensor-core GEMM's shared-memory buffers: 1 (stage, barrier,\n"
               "                      products, barrier per K step) or 2 (the next step's loads issued before\n"
               "                      this one's products, stored after them, one barrier); tiles that do not fit with S are\n"
               "                      passed over; JSON rows carry \"cm_stages\" (null: the library's, 1)\n"
               "      --cm-bk BK      the tensor-core GEMM's K per step (16, 32, 48, 64; default 32): 64 halves\n"
               "                      the barriers per product; JSON rows carry \"cm_bk\" (null: 32)\n"
               "      --cm-w16 0|1    the tensor-core GEMM's W staged 16 values at a time, one scale decode\n"
               "                      for them (1, the library's) or 4 (0); JSON rows carry \"cm_w16\"\n"
               "                      (false with 0, else true)\n"
               "      --attn-split KEYS\n"
               "                      decode attention's keys per split at least (16..65536, a multiple of\n"
               "                      16) instead of the library's (GPUs 128, CPUs 64): shorter splits put\n"
               "                      more workgroups on a short context; JSON rows carry \"attn_split\"\n"
               "                      (null: the library's)\n"
               "      --attn-loads N  decode attention's keys per key group loaded together (1..8) instead of\n"
               "                      the library's (GPUs 2, CPUs 1); JSON rows carry \"attn_loads\"\n"
               "      --sample-loads N\n"
               "                      the sampler's logits loaded per invocation at once (1..16) instead of\n"
               "                      the library's (GPUs 8, CPUs 1); JSON rows carry \"sample_loads\"\n"
               "                      (null: the library's)\n"
               "kernels:\n");
    for (size_t i = 0; i < N_BENCHES; i++)
        fprintf(f, "  %-14s %s\n", benches[i].name, benches[i].dims);
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

#define N_TUNE 9 /* tune_opt below */

typedef struct bench_cli {
    const char *kernels, *types;       /* comma lists; NULL = all */
    bench_shape shapes[MAX_CL_SHAPES];
    int n_shapes, size_pref;           /* size_pref: -1 auto, 0 small, 1 full */
    bool crossover, json;
    const char *tune[N_TUNE];          /* the tuning options' values (NULL: the library's choice) */
    double warm_ms;                    /* --warm-ms (< 0: the device's default) */
    devprobe_opts o;
    vki_device_params dp;
} bench_cli;

/* The tuning options: each is one item of a kernel configuration (op_kernel_config, what
 * vki_device_params.kernel_config holds), applied to the device once it is open. */
static const char *const tune_opt[] = {"--matvec-cfg", "--cm-cfg", "--cm-stages", "--cm-bk", "--cm-split",
                                       "--attn-split", "--sample-loads", "--attn-loads", "--cm-w16"};
static const char *const tune_key[] = {"matvec", "gemm", "gemm_stages", "gemm_bk", "gemm_split", "attn_split",
                                       "sample_loads", "attn_loads", "gemm_w16"};
_Static_assert(sizeof tune_opt / sizeof *tune_opt == N_TUNE && sizeof tune_key / sizeof *tune_key == N_TUNE,
               "one key per tuning option");

/* A count option in [1, max]; false (with a message) otherwise. */
static bool parse_count(const char *opt, const char *s, uint32_t max, uint32_t *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s && !*end && v >= 1 && v <= (long)max) {
        *out = (uint32_t)v;
        return true;
    }
    fprintf(stderr, "bench-kernels: %s needs a number in [1, %u], got '%s'\n", opt, max, s);
    return false;
}

/* 0: parsed; 1: --help printed; 2: usage error (printed). */
static int parse_args(int argc, char **argv, bench_cli *cl)
{
    static const struct option lo[] = {
        {"kernel", 1, 0, 'k'}, {"type", 1, 0, 't'}, {"shape", 1, 0, 's'}, {"device", 1, 0, 'd'},
        {"iters", 1, 0, 'n'},  {"warmup", 1, 0, 'w'}, {"reps", 1, 0, 'r'}, {"small", 0, 0, 'S'},
        {"full", 0, 0, 'F'},   {"help", 0, 0, 'h'},  {"coopmat", 1, 0, 'C'}, {"crossover", 0, 0, 'X'},
        {"json", 0, 0, 'J'},   {"matvec-cfg", 1, 0, 'V'}, {"cm-cfg", 1, 0, 'G'}, {"cm-split", 1, 0, 'K'},
        {"cm-stages", 1, 0, 'T'}, {"cm-bk", 1, 0, 'B'}, {"attn-split", 1, 0, 'A'},
        {"sample-loads", 1, 0, 'L'}, {"attn-loads", 1, 0, 'U'}, {"cm-w16", 1, 0, 'W'},
        {"warm-ms", 1, 0, 'M'}, {0, 0, 0, 0}};
    for (int ch; (ch = getopt_long(argc, argv, "k:t:s:d:n:w:r:h", lo, NULL)) != -1;) {
        bench_shape *sh = &cl->shapes[cl->n_shapes < MAX_CL_SHAPES ? cl->n_shapes : 0];
        bool ok = true;
        switch (ch) {
        case 'k': cl->kernels = optarg; break;
        case 't': cl->types = optarg; break;
        case 's':
            if (cl->n_shapes == MAX_CL_SHAPES || sscanf(optarg, "%ux%ux%u", &sh->M, &sh->N, &sh->K) != 3 || !sh->M ||
                !sh->N || !sh->K) {
                fprintf(stderr, "bad or too many --shape: %s (MxNxK, at most %d)\n", optarg, MAX_CL_SHAPES);
                return 2;
            }
            cl->n_shapes++;
            break;
        case 'd': cli_device_choice(optarg, &cl->dp); break;
        case 'n': ok = parse_count("--iters", optarg, 1u << 20, &cl->o.iters); break;
        case 'w': ok = parse_count("--warmup", optarg, 1u << 20, &cl->o.warmup); break;
        case 'r': ok = parse_count("--reps", optarg, 64, &cl->o.reps); break;
        case 'J': cl->json = true; break;
        case 'V': cl->tune[0] = optarg; break;
        case 'G': cl->tune[1] = optarg; break;
        case 'T': cl->tune[2] = optarg; break;
        case 'B': cl->tune[3] = optarg; break;
        case 'A': cl->tune[5] = optarg; break;
        case 'L': cl->tune[6] = optarg; break;
        case 'U': cl->tune[7] = optarg; break;
        case 'K': cl->tune[4] = optarg; break;
        case 'W': cl->tune[8] = optarg; break;
        case 'M': {
            char *end;
            cl->warm_ms = strtod(optarg, &end);
            if (!*optarg || *end || !(cl->warm_ms >= 0 && cl->warm_ms <= 60000)) {
                fprintf(stderr, "--warm-ms: milliseconds in [0, 60000], got '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case 'S': cl->size_pref = 0; break;
        case 'F': cl->size_pref = 1; break;
        case 'X': cl->crossover = true; break;
        case 'C':
            if (!strcmp(optarg, "auto") || !strcmp(optarg, "off") || !strcmp(optarg, "emulate")) {
                cl->dp.coopmat = optarg[0] == 'a' ? VKI_COOPMAT_AUTO : optarg[0] == 'o' ? VKI_COOPMAT_OFF
                                                                                     : VKI_COOPMAT_EMULATED;
                break;
            }
            fprintf(stderr, "--coopmat: auto, off or emulate\n");
            return 2;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
        if (!ok)
            return 2;
    }
    return 0;
}

static void print_cm_path(FILE *f, const vkd_device *d)
{
    const vkd_cm *cm = &d->cm;
    if (cm->kind == VKD_CM_NONE)
        fprintf(f, "matmul path: FP32 GEMM (no cooperative matrices); gemv_max_m %u\n", op_matmul_gemv_max_m(d));
    else
        fprintf(f, "matmul path: %s cooperative matrices %ux%ux%u over %u lanes; gemv_max_m %u\n",
               cm->kind == VKD_CM_NV ? "VK_NV" : "emulated", cm->m, cm->n, cm->k, cm->sg, op_matmul_gemv_max_m(d));
}

/* GEMV against the device's GEMM (OP_MM_AUTO's choice above the crossover) for M = 8, 16, ...
 * at one N x K per type (fastest of the timed batches): prints both times and the largest M
 * (a multiple of 8, the GEMV's pass size) before the GEMM is faster, the value for
 * vki_device_params.gemv_max_m and ops_matmul.c's table. */
static void crossover_all(const bench_cli *cl, vkd_device *d, vkd_cmd *c, bool small)
{
    const uint32_t max_m = small ? 128 : 256;
    bench_shape sh = cl->n_shapes ? cl->shapes[0] : small ? (bench_shape){0, 1024, 1024} : (bench_shape){0, 4096, 4096};
    const bench_kernel gemv = {.record = matvec_record};
    const bench_kernel gemm = {.record = d->cm.kind != VKD_CM_NONE ? matmul_cm_record : matmul_record};
    devprobe_opts o = cl->o;
    o.fastest = true; /* a loaded machine slows some batches; the fastest is the kernel's own time */
    static const uint32_t types[] = {VKK_WEIGHT_TYPES(WEIGHT_TYPE_ID)};
    printf("%-5s %6s %6s %6s %11s %11s\n", "type", "M", "N", "K", "gemv us", "gemm us");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        if (!in_list(cl->types ? cl->types : "f16,q4_k", quant_get(types[t])->name))
            continue;
        bench_run r = {.d = d, .type = types[t], .M = max_m, .N = sh.N, .K = sh.K, .rng = 0x5eed};
        vki_status st = mm_setup(&r);
        uint32_t cross = 0;
        bool gemm_won = false;
        for (uint32_t m = 8; st == VKI_OK && m <= max_m && !gemm_won; m += 8) {
            double tv = 0, tg = 0;
            r.M = m;
            st = time_run(&gemv, &r, c, &o, &tv, NULL);
            if (st == VKI_OK)
                st = time_run(&gemm, &r, c, &o, &tg, NULL);
            printf("%-5s %6u %6u %6u %11.1f %11.1f\n", quant_get(types[t])->name, m, sh.N, sh.K, tv * 1e6, tg * 1e6);
            gemm_won = st == VKI_OK && tg < tv;
            cross = gemm_won ? m - 8 : m;
        }
        if (st != VKI_OK)
            printf("crossover %s: %s\n", quant_get(types[t])->name, vki_status_str(st));
        else
            printf("crossover %s N=%u K=%u: gemv_max_m = %u%s\n", quant_get(types[t])->name, sh.N, sh.K, cross,
                   gemm_won ? "" : " (the GEMM never won up to here)");
        fflush(stdout);
        run_release(&r);
    }
}

/* Every selected (kernel, type, shape), one table row each. */
static void run_all(const bench_cli *cl, vkd_device *d, vkd_cmd *c, bool small, bench_out *out)
{
    for (size_t i = 0; i < N_BENCHES; i++) {
        const bench_kernel *b = &benches[i];
        if (!in_list(cl->kernels, b->name))
            continue;
        for (uint32_t t = 0; t < b->n_types; t++) {
            const quant_traits *qt = quant_get(b->types[t]);
            if (!qt || (b->setup != copy_setup && !in_list(cl->types, qt->name))) /* copy: always */
                continue;
            const bench_shape *sh = cl->n_shapes ? cl->shapes : small ? b->small : b->full;
            int n = cl->n_shapes;
            while (!cl->n_shapes && n < MAX_SHAPES && sh[n].M)
                n++;
            for (int j = 0; j < n; j++)
                bench_one(b, d, c, b->types[t], sh[j], &cl->o, out);
        }
    }
    /* the copy again after many rows ("copy-again"): a device that slowed down during the run
     * (clocks, another tenant) shows here rather than as slow kernels */
    if (out->copy_gbps > 0 && out->n_rows > 2)
        bench_one(&benches[0], d, c, VKI_GGML_F32, out->copy_shape, &cl->o, out);
}

int main(int argc, char **argv)
{
    bench_cli cl = {.size_pref = -1, .o = {.iters = 20, .warmup = 3, .reps = 3}, .warm_ms = -1,
                    .dp = vki_device_default_params()};
    cl.dp.log = cli_log_stderr; /* the library's reasons (a refused tuning option, a GEMM left unsplit) */
    if (getenv("VKI_DEVICE") && *getenv("VKI_DEVICE"))
        cli_device_choice(getenv("VKI_DEVICE"), &cl.dp);
    int rc = parse_args(argc, argv, &cl);
    if (rc)
        return rc == 1 ? 0 : rc;
    vkd_device *d;
    vki_status st = vkd_open(&cl.dp, &d);
    if (st != VKI_OK) {
        fprintf(stderr, "bench-kernels: cannot open a Vulkan device: %s\n", vki_status_str(st));
        return 1;
    }
    /* the tuning options, as a kernel configuration would set them (a tile that does not fit is
     * reported by its rows, not refused here: a sweep passes over it) */
    for (size_t i = 0; i < N_TUNE; i++) {
        char item[128];
        if (!cl.tune[i])
            continue;
        snprintf(item, sizeof item, "%s=%s", tune_key[i], cl.tune[i]);
        if (op_kernel_config(d, item, false) != VKI_OK) {
            fprintf(stderr, "bench-kernels: %s %s refused (see above)\n", tune_opt[i], cl.tune[i]);
            vkd_close(d);
            return 2;
        }
    }
    cl.o.warm_ms = cl.warm_ms >= 0 ? cl.warm_ms : d->info.type == VKI_DEVICE_CPU ? 0 : 50;
    bool small = cl.size_pref == 0 || (cl.size_pref < 0 && d->info.type == VKI_DEVICE_CPU);
    vkd_cmd c;
    if (vkd_cmd_create(d, "bench", &c) != VKI_OK) {
        vkd_close(d);
        return 1;
    }
    bench_out out = {.json = cl.json && !cl.crossover, .table = cl.json && !cl.crossover ? stderr : stdout, .d = d};
    fprintf(out.table, "device: %s (%s); %s shapes; %u calls per batch, %s of %u batches after >= %g ms of "
            "warm-up; timer: %s\n", d->info.name, d->info.driver_info, cl.n_shapes ? "given" : small ? "small" : "full",
            cl.o.iters, cl.crossover ? "fastest" : "median", cl.o.reps, cl.o.warm_ms,
            d->info.timestamps ? "GPU timestamps" : "host clock");
    print_cm_path(out.table, d);
    if (cl.crossover) {
        crossover_all(&cl, d, &c, small);
    } else {
        fprintf(out.table, "%-14s %-5s %6s %6s %6s %11s %9s %9s %8s %6s %6s %5s\n", "kernel", "type", "M", "N", "K",
                "us/call", "GB/s", "GFLOP/s", "TFLOP/s", "%copy", "+-%", "split");
        run_all(&cl, d, &c, small, &out);
    }
    vkd_cmd_destroy(&c);
    vkd_close(d);
    return 0;
}
