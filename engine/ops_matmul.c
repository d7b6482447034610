/* Recording of the matmul family: matvec.comp (few activation rows), matmul.comp (tiled GEMM)
 * and get_rows.comp, one SPIR-V module per weight type. Workgroup and tile sizes are
 * specialisation constants chosen here from the device's limits; the same choice is used by
 * op_matmul_prepare, so every pipeline a step needs exists before the first step. */
#include "engine/ops_matmul.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels.h"
#include "engine/quant.h"

/* Kernel ids per weight type; the rows of engine/kernels.h. */
typedef struct mm_type {
    uint32_t ggml_type;
    vkk_id matvec, matmul, matmul_cm, matmul_cme, get_rows;
    vkk_id id[4];     /* the same four matmuls with the experts' indirection (in that order) */
    uint32_t block;   /* elements per block: K must be a multiple */
    bool needs16;     /* read through 16-bit storage (blocks or rows only 2-byte aligned) */
} mm_type;

#define MM_TYPE(T, block, needs16)                                                               \
    {VKI_GGML_##T, VKK_MATVEC_##T, VKK_MATMUL_##T, VKK_MATMUL_CM_##T, VKK_MATMUL_CME_##T,        \
     VKK_GET_ROWS_##T, {VKK_MATVEC_ID_##T, VKK_MATMUL_ID_##T, VKK_MATMUL_CM_ID_##T,               \
     VKK_MATMUL_CME_ID_##T}, block, needs16}
static const mm_type mm_types[] = {
    MM_TYPE(F32, 1, false),        MM_TYPE(F16, 1, true),         MM_TYPE(BF16, 1, true),
    MM_TYPE(Q8_0, 32, false),      MM_TYPE(Q4_0, 32, false),      MM_TYPE(Q4_1, 32, false),
    MM_TYPE(Q5_0, 32, false),      MM_TYPE(Q5_1, 32, false),      MM_TYPE(IQ4_NL, 32, false),
    MM_TYPE(Q2_K, 256, false),     MM_TYPE(Q3_K, 256, false),     MM_TYPE(Q4_K, 256, false),
    MM_TYPE(Q5_K, 256, false),     MM_TYPE(Q6_K, 256, false),     MM_TYPE(IQ4_XS, 256, false),
    MM_TYPE(MXFP4, 32, false),
};
#define MM_COUNT_ONE(T, t) +1
_Static_assert(sizeof mm_types / sizeof mm_types[0] == 0 VKK_WEIGHT_TYPES(MM_COUNT_ONE),
               "one mm_types row per VKK_WEIGHT_TYPES entry");

static const mm_type *mm_type_get(uint32_t ggml_type)
{
    for (size_t i = 0; i < sizeof mm_types / sizeof mm_types[0]; i++)
        if (mm_types[i].ggml_type == ggml_type)
            return &mm_types[i];
    return NULL;
}

bool op_matmul_supported(const vkd_device *d, uint32_t type)
{
    const mm_type *t = mm_type_get(type);
    return t && (!t->needs16 || d->info.storage16) && (d->info.subgroup_ops & VKI_SUBGROUP_ARITHMETIC);
}

static vki_status check_type(vkd_device *d, const vk_tensor *w, const mm_type **out)
{
    *out = mm_type_get(w->type);
    if (!*out || !op_matmul_supported(d, w->type)) {
        vkd_log(d, VKI_LOG_ERROR, "tensor %s: weight type %s cannot run %s (F16 and BF16 need "
                "16-bit storage; all types need subgroup arithmetic)", w->name,
                quant_type_name(w->type), *out ? "on this device" : "in vkinfer");
        return VKI_ERR_UNSUPPORTED;
    }
    if (w->ne0 == 0 || w->ne0 > UINT32_MAX || w->n_rows > UINT32_MAX || w->ne0 % (*out)->block ||
        w->row_bytes > UINT32_MAX) {
        vkd_log(d, VKI_LOG_ERROR, "tensor %s: shape %llu x %llu not supported by the matmul kernels", w->name,
                (unsigned long long)w->n_rows, (unsigned long long)w->ne0);
        return VKI_ERR_INVALID_ARG;
    }
    return VKI_OK;
}

/* ---- specialisation choices ----------------------------------------------------------------- */

/* matvec {WG, NR, MC, NSG, GLU, MCH, MU, XV4}. GPUs: 128 invocations (4 warps on NVIDIA) over 4
 * weight rows: at K = 4096 every invocation holds one 32-weight unit of each integer-type row
 * (4 rows' 16-byte loads in flight) and N/4 workgroups fill the machine. CPU devices
 * (lavapipe) run a workgroup as a loop over its subgroups on one thread, and a workgroup costs in
 * proportion to its invocations even when most have no unit to work on: one subgroup over 8 rows
 * (no shared reduction across subgroups). Measured on lavapipe against the earlier 32
 * invocations: 1.9x batch-1 decode on stories260K and a Q4_K_M stack, 1.6-1.7x at 8 sequences
 * (bench/RESULTS.md). NSG bounds the subgroups of a workgroup for the shared reduction: WG over
 * the smallest subgroup size the device may use. XV4 = 1 (X read as vec4) here: the float path's
 * dispatches set it from their X view (mv_x_vec4); the integer-dot kernels ignore it. */
static void matvec_spec(const vkd_device *d, uint32_t mc, uint32_t spec[8])
{
    bool cpu = d->info.type == VKI_DEVICE_CPU;
    uint32_t sg = d->info.subgroup_min_size ? d->info.subgroup_min_size : d->info.subgroup_size;
    if (!sg)
        sg = 1;
    uint32_t wg = d->matvec_wg ? d->matvec_wg : cpu ? (sg < 4 ? 4 : sg) : 128;
    if (wg > d->info.max_workgroup_invocations)
        wg = d->info.max_workgroup_invocations;
    /* CPU devices take the activation rows 4 at a time (8 passes, the same 32 rows per
     * workgroup): lavapipe keeps every lane's 8 x 8 accumulators and 8 decoded units in vector
     * registers and spills, and LLVM took ~3x longer to compile each such variant (a cold
     * shader cache, as in CI, paid ~10 s per weight type and epilogue) for no faster a kernel. */
    if (mc > 1 && d->matvec_mc)
        mc = d->matvec_mc;
    bool half = cpu && mc > 1 && mc % 2 == 0;
    spec[0] = wg;
    spec[1] = d->matvec_rows ? d->matvec_rows : cpu ? 8 : 4;
    spec[2] = half ? mc / 2 : mc;
    spec[3] = (wg + sg - 1) / sg; /* a last partial subgroup counts */
    spec[4] = 0; /* GLU: op_matmul_glu sets it */
    spec[5] = mc > 1 ? (half ? 2 : 1) * OP_MATVEC_CHUNKS : 1;
    spec[6] = d->matvec_mu ? d->matvec_mu : 1; /* not measured on a GPU yet: bench-kernels sweeps it */
    spec[7] = 1;
}

/* Activation rows one matrix-vector workgroup covers (MC rows, MCH times). */
static uint32_t matvec_rows_per_group(const uint32_t *spec) { return spec[2] * spec[5]; }

/* The matrix-vector kernel's specialisation for M activation rows; glu: the gate|up pass (as many
 * gate rows as up rows per workgroup). */
static void mv_spec(const vkd_device *d, uint32_t M, bool glu, uint32_t spec[VKK_MAX_SPEC])
{
    matvec_spec(d, M == 1 ? 1 : OP_MATVEC_ROWS, spec);
    if (glu) {
        spec[1] += spec[1] % 2;
        spec[4] = 1;
    }
}

/* matmul {WG, BM, BN, BK, TM, TN}. Where shared memory and subgroups are large (NVIDIA: 48 KiB,
 * 32 lanes) 128x128 tiles over 256 invocations; elsewhere (small GPUs) 64x64 tiles over 64
 * invocations, less padding waste for the moderate M of prefill chunks. Both use 8x8 register
 * blocks (64 FMAs per 16 shared loads) and ~16.5 KiB of shared memory. CPU devices (lavapipe)
 * take 32x32 tiles of 4x4 blocks: 8x8 blocks ran 1.65x faster there, but LLVM compiled each
 * weight type's variant for ~20 s (64 accumulators per lane, spilled) against ~5 s, and a
 * cold shader cache (CI, a first run) pays that for every type; the GEMM on a CPU device is
 * for testing the tiling, not for speed. */
static void matmul_spec(const vkd_device *d, uint32_t spec[6])
{
    const vki_device_info *in = &d->info;
    if (in->max_compute_shared_memory >= 48 * 1024 && in->subgroup_size >= 32 && in->max_workgroup_invocations >= 256) {
        const uint32_t s[6] = {256, 128, 128, 16, 8, 8};
        memcpy(spec, s, sizeof s);
    } else if (in->type == VKI_DEVICE_CPU) {
        const uint32_t s[6] = {64, 32, 32, 32, 4, 4};
        memcpy(spec, s, sizeof s);
    } else {
        const uint32_t s[6] = {64, 64, 64, 32, 8, 8};
        memcpy(spec, s, sizeof s);
    }
}

/* matmul_cm {WG, BM, BN, BK, WM, WN, CM_M, CM_N, CM_K, CM_SG, STAGES, XH, W16}, largest tiles first: the
 * first whose shared memory (per stage two F16 tiles with 8-half row padding; one F32 fragment
 * per subgroup) and subgroup count fit. STAGES is d->cm_stages and BK d->cm_bk (defaults 1 and
 * 32; two stages, 48 KiB at 128 x 128, and BK = 64, 45 KiB, wait for the GPU sweep's verdict).
 * GPUs: 128 x 128 tiles over 8 subgroups of 64 x 32 (8 accumulator
 * fragments of 16 x 16 per subgroup; 28.7 KiB), the shape of the tensor-core GEMMs that reach
 * most of the peak, not measured here (no GPU was available; bench-kernels prints matmul_cm
 * TFLOP/s next to cm_peak); up to 64 rows, 64 x 128 tiles, which halve the padding computed just
 * above the GEMV crossover. CPU devices (the emulation on lavapipe) start at 64 x 64. */
#define CM_SMALL_M 64

/* The tiles after the first four are taken only when asked for (d->cm_tile_m x cm_tile_n):
 * narrower tiles for the small-M GEMMs, whose 32 workgroups of 64/128 x 128 tiles at N = 4096 left
 * most of an H200's 132 SMs idle (a ~250-330 us floor at M <= 128 on 4096 x 4096, bench/RESULTS.md);
 * bench-kernels --cm-cfg sweeps them on the GPU before any becomes a default. */
/* The specialisation of tile {BM, BN, WM, WN} (warp sizes raised to the fragment's) if it fits the
 * device's fragments, shared memory and workgroup size. */
static bool cm_fit(const vkd_device *d, const uint32_t c[4], uint32_t spec[13])
{
    const vkd_cm *cm = &d->cm;
    const uint32_t bk = d->cm_bk ? d->cm_bk : 32, bm = c[0], bn = c[1], stages = d->cm_stages ? d->cm_stages : 1;
    const uint32_t wm = c[2] > cm->m ? c[2] : cm->m, wn = c[3] > cm->n ? c[3] : cm->n;
    if (!cm->m || !wm || !wn || bm % wm || bn % wn || wm % cm->m || wn % cm->n || bk % cm->k || bk % 4 ||
        bk > 64 || stages > 2)
        return false;
    uint32_t nw = (bm / wm) * (bn / wn);
    uint64_t smem = 2ull * stages * (bm + bn) * (bk + 8) + 4ull * nw * cm->m * cm->n;
    if (smem > d->info.max_compute_shared_memory || nw * cm->sg > d->info.max_workgroup_invocations)
        return false;
    const uint32_t v[13] = {nw * cm->sg, bm, bn, bk, wm, wn, cm->m, cm->n, cm->k, cm->sg, stages, 0, !d->cm_w4};
    memcpy(spec, v, sizeof v);
    return true;
}

/* A forced tile with its warp tile (d->cm_warp_m x cm_warp_n) is taken as asked: 64 x 64 warp
 * tiles load half the shared-memory fragments per product of 64 x 32 ones (4 + 4 per 16
 * products against 4 + 2 per 8), what the M = 2048 GEMM's 13% of the peak may be bound by. */
static bool cm_spec(const vkd_device *d, uint32_t M, uint32_t spec[13])
{
    static const uint32_t cand[][4] = {{128, 128, 64, 32}, {64, 128, 32, 32}, {64, 64, 32, 32}, {32, 32, 32, 32},
                                       {32, 128, 32, 32}, {32, 64, 32, 32}, {16, 128, 16, 32}, {16, 64, 16, 32},
                                       {64, 32, 32, 32}};
    size_t first = d->info.type == VKI_DEVICE_CPU ? 2 : M <= CM_SMALL_M ? 1 : 0;
    bool forced = d->cm_tile_m && d->cm_tile_n;
    if (forced && d->cm_warp_m && d->cm_warp_n) {
        const uint32_t asked[4] = {d->cm_tile_m, d->cm_tile_n, d->cm_warp_m, d->cm_warp_n};
        return cm_fit(d, asked, spec);
    }
    for (size_t i = forced ? 0 : first; i < (forced ? sizeof cand / sizeof cand[0] : 4); i++) {
        if (forced && (cand[i][0] != d->cm_tile_m || cand[i][1] != d->cm_tile_n))
            continue;
        if (cm_fit(d, cand[i], spec))
            return true;
    }
    return false;
}

/* Split-K of the tensor-core GEMM (matmul_cm.comp): a GEMM of few tiles (a 64-row product at N =
 * 4096 is 32 workgroups) leaves most compute units idle, and each workgroup's chain of K / BK
 * dependent steps (global loads, a barrier, the products) is the whole kernel's time: the ~250-330
 * us floor of every M <= 128 on an H200 at 4096 x 4096 (bench/RESULTS.md). Splitting K over
 * workgroup z brings the workgroups to two per compute unit and shortens each chain; the
 * partials go through a scratch slot (VKD_SPLIT_SLOTS per barrier) and the last split of a tile
 * sums them in split order. Automatic only where the driver tells the compute units; each split
 * at least CM_SPLIT_MIN_K deep (shorter chains gain less than the partials' round trip). */
#define CM_SPLIT_MIN_K 256u
#define CM_SPLIT_MAX 16u

/* One slot of partial tiles: what a GEMM of two workgroups per compute unit of the largest tile
 * (128 x 128) stores (a split GEMM has splits x tiles <= that), at least 64 such workgroups' for
 * the forced splits of devices that do not tell their units (the tests). */
static VkDeviceSize split_part_bytes(const vkd_device *d)
{
    const uint64_t wgs = 2ull * d->info.compute_units;
    return (wgs > 64 ? wgs : 64) * 128 * 128 * 4;
}

/* K per split of an M x N x K product on matmul_cm tiles `spec`, and the splits (*n_split; 0
 * and 1: no split): d->cm_split where forced, else as many as bring the workgroups to two per
 * compute unit. */
static uint32_t cm_split_k(const vkd_device *d, uint32_t M, uint32_t N, uint32_t K, const uint32_t *spec,
                           uint32_t *n_split)
{
    const uint32_t bm = spec[1], bn = spec[2], bk = spec[3];
    const uint64_t tiles = (uint64_t)vkk_groups(M, bm) * vkk_groups(N, bn);
    uint64_t s = d->cm_split;
    *n_split = 1;
    if (!s) {
        const uint64_t target = 2ull * d->info.compute_units;
        s = tiles < target ? target / tiles : 1;
        if (s > K / CM_SPLIT_MIN_K)
            s = K / CM_SPLIT_MIN_K;
        if (s > CM_SPLIT_MAX)
            s = CM_SPLIT_MAX;
    }
    if (s < 2 || tiles > VKD_SPLIT_TILES)
        return 0;
    const uint64_t steps = (K + bk - 1) / bk, kc = (steps + s - 1) / s * bk, n = (K + kc - 1) / kc;
    if (n < 2 || n > d->info.max_workgroup_count[2] || n * M * N * 4 > split_part_bytes(d))
        return 0;
    *n_split = (uint32_t)n;
    return (uint32_t)kc;
}

uint32_t op_matmul_cm_splits(const vkd_device *d, uint32_t M, uint32_t N, uint32_t K)
{
    uint32_t spec[VKK_MAX_SPEC], n_split = 1;
    if (d->cm.kind != VKD_CM_NONE && M && cm_spec(d, M, spec))
        cm_split_k(d, M, N, K, spec, &n_split);
    return n_split;
}

/* The device's split-K scratch (vkd_device.split_part), created at the first need; once that
 * failed (a memory limit, out of device memory) GEMMs run unsplit, without trying again. */
static vki_status split_scratch(vkd_device *d)
{
    if (d->split_part)
        return VKI_OK;
    if (d->split_failed)
        return VKI_ERR_OUT_OF_DEVICE_MEMORY;
    const VkDeviceSize pb = split_part_bytes(d), cb = VKD_SPLIT_TILES * 4;
    const VkDeviceSize live = d->bytes_allocated[VKD_MEM_DEVICE] + d->bytes_allocated[VKD_MEM_HOST];
    vki_status st = VKI_OK;
    if (d->mem_limit && live + (pb + cb) * VKD_SPLIT_SLOTS > d->mem_limit)
        st = VKI_ERR_OUT_OF_DEVICE_MEMORY; /* (not an error to log: the GEMMs run unsplit) */
    if (st == VKI_OK)
        st = vkd_buffer_create(d, pb * VKD_SPLIT_SLOTS, VKD_MEM_DEVICE, "split-K partials", &d->split_part);
    if (st == VKI_OK)
        st = vkd_buffer_create(d, cb * VKD_SPLIT_SLOTS, VKD_MEM_DEVICE, "split-K counters", &d->split_cnt);
    if (st == VKI_OK)
        st = vkd_fill(d, d->split_cnt, 0, cb * VKD_SPLIT_SLOTS, 0);
    if (st != VKI_OK) {
        vkd_buffer_destroy(d, d->split_part);
        vkd_buffer_destroy(d, d->split_cnt);
        d->split_part = d->split_cnt = NULL;
        d->split_failed = true;
        vkd_log(d, VKI_LOG_WARN, "split-K scratch (%llu bytes): %s; the tensor-core GEMMs run unsplit",
                (unsigned long long)((pb + cb) * VKD_SPLIT_SLOTS), vki_status_str(st));
        return st;
    }
    d->split_part_bytes = pb;
    return VKI_OK;
}

/* A one-part tensor-core GEMM in one dispatch split over K where cm_split_k says so and a scratch
 * slot is free: *done tells whether it was recorded here (else the caller records it unsplit). */
static vki_status cm_split_dispatch(vkd_cmd *c, vkk_id k, const uint32_t *spec, const vk_tensor *w, vkd_view x,
                                    const vkd_view *bias, vkd_view y, vki_pc_matmul pc, bool *done)
{
    vkd_device *d = c->d;
    uint32_t n_split;
    *done = false;
    if (w->n_parts != 1 || c->split_slots >= VKD_SPLIT_SLOTS ||
        vkk_groups(pc.N, spec[2]) > d->info.max_workgroup_count[0])
        return VKI_OK;
    pc.k_split = cm_split_k(d, pc.M, pc.N, pc.K, spec, &n_split);
    if (!pc.k_split || split_scratch(d) != VKI_OK || (uint64_t)n_split * pc.M * pc.N * 4 > d->split_part_bytes)
        return VKI_OK; /* unsplit: the same result up to the order of the additions */
    const uint32_t slot = c->split_slots++;
    const VkDeviceSize cb = VKD_SPLIT_TILES * 4;
    const vkd_view b[6] = {vkd_whole(w->parts[0].buf), x, bias ? *bias : x, y,
                           {d->split_part, slot * d->split_part_bytes, d->split_part_bytes},
                           {d->split_cnt, slot * cb, cb}};
    pc.y_col0 = (uint32_t)w->parts[0].row0;
    *done = true;
    return vkk_dispatch(c, k, spec, b, 6, &pc, sizeof pc, vkk_groups(pc.N, spec[2]), vkk_groups(pc.M, spec[1]),
                        n_split);
}

/* The matrix-vector / GEMM crossover: the largest M at which the GEMV kernel is still at least as
 * fast as the GEMM the device would take, per kind of device and GEMM. Measured with
 * `bench-kernels --crossover` (which prints this value); a device param overrides it. */
typedef struct mm_crossover {
    vki_device_type type;
    vkd_cm_kind cm;
    uint32_t gemv_max_m;
} mm_crossover;

static const mm_crossover crossovers[] = {
    /* lavapipe (Mesa 22.3.6, 2 shared cores), N = K = 1024, F16 and Q4_K weights (bench/RESULTS.md):
     * a GEMV row costs about the same at any M on a CPU, while a 64-row FP32 GEMM tile costs as
     * much as ~64 GEMV rows; the emulated coopmat tile is ~3x cheaper, so it wins from M = 32.
     * Since the CPU GEMV takes one subgroup over 4-row passes and the CPU GEMM 4x4 blocks, the
     * GEMV is 2-3x faster up to M = 128 (`--crossover`, single-threaded); the switch stays at 64
     * so that the suites' moderate prompts keep running the GEMM's tiling on every machine. */
    {VKI_DEVICE_CPU, VKD_CM_NONE, 64},
    {VKI_DEVICE_CPU, VKD_CM_EMULATED, 24},
};

/* GPUs: not measured yet (no GPU was available when the coopmat kernels were written). 32 was the
 * FP32 GEMM's fixed switch point before (a GEMM tile costs about as much at M = 33 as when full);
 * it stays there until bench-kernels --crossover runs on a GPU. */
#define CROSSOVER_UNMEASURED 32

uint32_t op_matmul_gemv_max_m(const vkd_device *d)
{
    if (d->gemv_max_m)
        return d->gemv_max_m;
    for (size_t i = 0; i < sizeof crossovers / sizeof crossovers[0]; i++)
        if (crossovers[i].type == d->info.type && crossovers[i].cm == d->cm.kind)
            return crossovers[i].gemv_max_m;
    return CROSSOVER_UNMEASURED;
}

/* ---- kernel configuration (vki_device_params.kernel_config) ------------------------------------ */

/* A list of numbers separated by 'x' into v[0..max): how many, 0 when malformed (a number outside
 * [1, 65536], another character, more than max). */
static int parse_dims(const char *s, uint32_t *v, int max)
{
    for (int n = 0;;) {
        char *end;
        if (*s < '0' || *s > '9' || n == max)
            return 0;
        errno = 0;
        unsigned long x = strtoul(s, &end, 10);
        if (errno || x < 1 || x > 65536)
            return 0;
        v[n++] = (uint32_t)x;
        if (!*end)
            return n;
        if (*end != 'x')
            return 0;
        s = end + 1;
    }
}

static vki_status config_error(vkd_device *d, const char *item, const char *what)
{
    vkd_log(d, VKI_LOG_ERROR, "kernel config '%s': %s", item, what);
    return VKI_ERR_INVALID_ARG;
}

/* One key=value item of a kernel configuration; *gemm set when it is a tensor-core GEMM setting. */
static vki_status config_item(vkd_device *d, const char *item, bool *gemm)
{
    const char *eq = strchr(item, '=');
    const size_t kl = eq ? (size_t)(eq - item) : 0;
    uint32_t v[4] = {0};
    const int n = eq ? parse_dims(eq + 1, v, 4) : 0;
#define CONFIG_KEY(s) (kl == sizeof(s) - 1 && !strncmp(item, s, kl))
    if (CONFIG_KEY("matvec")) {
        const uint32_t sg = d->info.subgroup_size ? d->info.subgroup_size : 1;
        if (n < 2 || v[0] > 1024 || v[1] > 16 || (n >= 3 && v[2] > 32) || (n == 4 && v[3] > 8))
            return config_error(d, item, "matvec=WGxROWS[xMC[xMU]]: invocations 1..1024 x weight rows 1..16 [x "
                                "activation rows per pass 1..32 [x units per K pass 1..8]]");
        if (v[0] > d->info.max_workgroup_invocations || (v[0] > sg && v[0] % sg))
            return config_error(d, item, "the invocations exceed the device's workgroup limit, or are more than one "
                                "subgroup and not a multiple of it");
        const uint32_t old[4] = {d->matvec_wg, d->matvec_rows, d->matvec_mc, d->matvec_mu};
        d->matvec_wg = v[0], d->matvec_rows = v[1], d->matvec_mc = n >= 3 ? v[2] : 0, d->matvec_mu = n == 4 ? v[3] : 0;
        /* matvec.comp's shared memory at its largest (the gate|up pass of several activation rows):
         * a partial sum per (row, activation row, subgroup), and the norm epilogue's virtual lanes */
        uint32_t spec[VKK_MAX_SPEC];
        mv_spec(d, 2, true, spec);
        if (4ull * spec[1] * spec[2] * spec[3] + 4ull * VKI_NORM_LANES > d->info.max_compute_shared_memory) {
            d->matvec_wg = old[0], d->matvec_rows = old[1], d->matvec_mc = old[2], d->matvec_mu = old[3];
            return config_error(d, item, "its partial sums (rows x activation rows x subgroups) exceed the device's "
                                "shared memory");
        }
    } else if (CONFIG_KEY("gemm_xh") || CONFIG_KEY("gemm_w16")) { /* 0 or 1 (the one-number keys below
                                                                     cannot take 0): 0 sets the switch */
        const bool xh = CONFIG_KEY("gemm_xh");
        if (!eq || (strcmp(eq + 1, "0") && strcmp(eq + 1, "1")))
            return config_error(d, item, xh ? "gemm_xh=0 or 1: the tensor-core GEMM's X converted to F16 in every "
                                              "tile (0) or once before the product (1, the default)"
                                            : "gemm_w16=0 or 1: the tensor-core GEMM's W staged 4 values at a time "
                                              "(0) or 16, one scale decode for them (1, the default)");
        *(xh ? &d->cm_x32 : &d->cm_w4) = eq[1] == '0';
        *gemm = true;
    } else if (CONFIG_KEY("gemm")) {
        if (n != 2 && n != 4)
            return config_error(d, item, "gemm=BMxBN[xWMxWN]: the tensor-core GEMM's tile [and its subgroups' "
                                "tile], e.g. 64x128 or 128x128x64x64");
        d->cm_tile_m = v[0], d->cm_tile_n = v[1], d->cm_warp_m = n == 4 ? v[2] : 0, d->cm_warp_n = n == 4 ? v[3] : 0;
        *gemm = true;
    } else {
        /* the keys of one number in [lo, hi], a multiple of step, into a device field */
        static const struct {
            const char *key;
            size_t field;
            uint32_t lo, hi, step;
            bool gemm;
            const char *help;
        } ones[] = {
            {"gemm_stages", offsetof(vkd_device, cm_stages), 1, 2, 1, true,
             "gemm_stages=1 or 2: the tensor-core GEMM's shared-memory buffers"},
            {"gemm_bk", offsetof(vkd_device, cm_bk), 16, 64, 16, true,
             "gemm_bk=16, 32, 48 or 64: the tensor-core GEMM's K per step"},
            {"gemm_split", offsetof(vkd_device, cm_split), 1, 64, 1, true,
             "gemm_split=1..64: the tensor-core GEMM's K splits (1: none)"},
            {"attn_split", offsetof(vkd_device, attn_split), 16, 65536, 16, false,
             "attn_split=16..65536, a multiple of 16: decode attention's keys per split at least"},
            {"attn_loads", offsetof(vkd_device, attn_loads), 1, 8, 1, false,
             "attn_loads=1..8: decode attention's keys per key group loaded together"},
            {"sample_loads", offsetof(vkd_device, sample_loads), 1, 16, 1, false,
             "sample_loads=1..16: the sampler's logits loaded per invocation at once"},
            {"gemv_max_m", offsetof(vkd_device, gemv_max_m), 1, 4096, 1, false,
             "gemv_max_m=1..4096: the most activation rows the matrix-vector kernel takes"},
        };
        size_t k = 0;
        while (k < sizeof ones / sizeof ones[0] && (kl != strlen(ones[k].key) || strncmp(item, ones[k].key, kl)))
            k++;
        if (k == sizeof ones / sizeof ones[0])
            return config_error(d, item, eq ? "unknown key (matvec, gemm, gemm_stages, gemm_bk, gemm_split, "
                                            "gemm_xh, gemm_w16, gemv_max_m, attn_split, attn_loads, "
                                            "sample_loads)"
                                            : "not key=value");
        if (n != 1 || v[0] < ones[k].lo || v[0] > ones[k].hi || v[0] % ones[k].step)
            return config_error(d, item, ones[k].help);
        *(uint32_t *)((char *)d + ones[k].field) = v[0];
        *gemm = *gemm || ones[k].gemm;
    }
#undef CONFIG_KEY
    return VKI_OK;
}

vki_status op_kernel_config(vkd_device *d, const char *cfg, bool check_fit)
{
    if (!cfg || !*cfg)
        return VKI_OK;
    char buf[512];
    if (strlen(cfg) >= sizeof buf)
        return config_error(d, "...", "longer than 511 characters");
    strcpy(buf, cfg);
    bool gemm = false;
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        vki_status st = config_item(d, item, &gemm);
        if (st != VKI_OK)
            return st;
    }
    uint32_t spec[VKK_MAX_SPEC];
    if (check_fit && gemm && (d->cm.kind == VKD_CM_NONE || !cm_spec(d, 4096, spec)))
        return config_error(d, cfg, d->cm.kind == VKD_CM_NONE ? "gemm settings, but this device runs no "
                            "cooperative-matrix GEMM" : "the tensor-core GEMM's tile, stages and K step do not fit "
                            "this device (its fragments, shared memory or workgroup size)");
    return VKI_OK;
}

static uint32_t get_rows_wg(const vkd_device *d)
{
    return d->info.max_workgroup_invocations >= 256 ? 256 : d->info.max_workgroup_invocations;
}

/* ---- argument checks ------------------------------------------------------------------------ */

static VkDeviceSize view_range(const vkd_view *v)
{
    if (!v->buf || v->offset > v->buf->size)
        return 0;
    return v->range == VK_WHOLE_SIZE ? v->buf->size - v->offset : v->range;
}

/* The view holds at least `rows` rows of `cols` elements of `elem` bytes, `stride` apart. */
static bool view_holds(const vkd_view *v, uint64_t rows, uint64_t cols, uint64_t stride, uint64_t elem)
{
    uint64_t n;
    if (!rows)
        return true;
    if (cols > stride || __builtin_mul_overflow(rows - 1, stride, &n) || __builtin_add_overflow(n, cols, &n) ||
        __builtin_mul_overflow(n, elem, &n))
        return false;
    return n <= view_range(v);
}

static vki_status bad_arg(vkd_device *d, const char *op, const vk_tensor *w, const char *what)
{
    vkd_log(d, VKI_LOG_ERROR, "%s%s%s: %s", op, w ? " " : "", w ? w->name : "", what);
    return VKI_ERR_INVALID_ARG;
}

/* ---- matmul --------------------------------------------------------------------------------- */

/* The kernel and its specialisation for M rows on `path`. VKI_ERR_UNSUPPORTED: OP_MM_COOPMAT on a
 * device without a cooperative-matrix path, or no tile fits. */
static vki_status pick_kernel(const vkd_device *d, const mm_type *t, uint32_t M, op_mm_path path, uint32_t *spec,
                              vkk_id *kid)
{
    if (path == OP_MM_AUTO)
        path = M <= op_matmul_gemv_max_m(d) ? OP_MM_GEMV : d->cm.kind != VKD_CM_NONE ? OP_MM_COOPMAT : OP_MM_GEMM;
    switch (path) {
    case OP_MM_GEMV:
        mv_spec(d, M, false, spec);
        *kid = t->matvec;
        return VKI_OK;
    case OP_MM_COOPMAT:
        *kid = d->cm.kind == VKD_CM_NV ? t->matmul_cm : t->matmul_cme;
        return d->cm.kind != VKD_CM_NONE && cm_spec(d, M, spec) ? VKI_OK : VKI_ERR_UNSUPPORTED;
    default:
        matmul_spec(d, spec);
        *kid = t->matmul;
        return VKI_OK;
    }
}

/* One weight part: as many dispatches along N as the device's workgroup-count limit needs.
 * bind: W, X, bias, Y; the matrix-vector kernel's epilogue bindings follow as 4..7: the norm's
 * (VKI_MM_NORM: weight, H, counter, HQ) or the quantising gate|up pass's (VKI_MM_GLU_XQ:
 * counter, XQ as 6, 7), bound to X where the caller gives none. */
static vki_status matmul_part(vkd_cmd *c, vkk_id k, const uint32_t *spec, uint32_t rows_per_group,
                              uint32_t m_per_group, const vkd_view bind[4], vki_pc_matmul pc, const op_mm_norm *norm,
                              const op_mm_glu_xq *gq)
{
    const uint32_t max_gx = c->d->info.max_workgroup_count[0];
    const uint64_t rows_per_dispatch = (uint64_t)max_gx * rows_per_group;
    const vkk_desc *kd = vkk_get(k);
    vkd_view b[8] = {bind[0], bind[1], bind[2], bind[3], norm ? norm->weight : bind[1], norm ? norm->h : bind[1],
                     norm ? norm->counter : gq ? gq->counter : bind[1],
                     norm && norm->xq.buf ? norm->xq : gq ? gq->xq : bind[1]};
    for (uint64_t n0 = 0; n0 < pc.N; n0 += rows_per_dispatch) {
        uint64_t rows = pc.N - n0 < rows_per_dispatch ? pc.N - n0 : rows_per_dispatch;
        pc.n0 = (uint32_t)n0;
        vki_status st = vkk_dispatch(c, k, spec, b, kd ? kd->n_bindings : 4, &pc, sizeof pc,
                                     vkk_groups(rows, rows_per_group), vkk_groups(pc.M, m_per_group), 1);
        if (st != VKI_OK)
            return st;
    }
    return VKI_OK;
}

/* The weight's kernels (*t) and the views of a product of M rows, K = w->ne0 -> N columns
 * (op_matmul_ex, op_matmul_glu, op_matmul_norm). */
static vki_status check_mm(vkd_device *d, const char *op, const vk_tensor *w, uint32_t M, uint64_t N,
                           const vkd_view *x, uint32_t x_stride, uint32_t x_elem, const vkd_view *y,
                           uint32_t y_stride, const mm_type **t)
{
    vki_status st = check_type(d, w, t);
    if (st != VKI_OK)
        return st;
    const uint64_t K = w->ne0;
    if (M == 0)
        return bad_arg(d, op, w, "M = 0");
    if (!view_holds(x, M, K, x_stride, x_elem))
        return bad_arg(d, op, w, "X view too small for [M, x_stride] (or x_stride < K)");
    if (!view_holds(y, M, N, y_stride, 4))
        return bad_arg(d, op, w, "Y view too small for [M, y_stride] (or y_stride < N)");
    return VKI_OK;
}

/* X rows may be read as vec4 (vki_pc_matmul.x_vec4). */
static uint32_t x_vec4(const vkd_view *x, uint32_t x_stride) { return x_stride % 4 == 0 && x->offset % 16 == 0; }

/* The float matrix-vector kernel's spec constant XV4 for X view x (matvec.comp: one of its two
 * loads compiled per pipeline; the engine's activations all take the vec4 one). */
static void mv_x_vec4(uint32_t *spec, const vkd_view *x, uint32_t x_stride) { spec[7] = x_vec4(x, x_stride); }

/* Kernel k over every part of w (each writes its own Y columns): bind W, X, bias (or X), Y. */
static vki_status parts_dispatch(vkd_cmd *c, const vk_tensor *w, vkk_id k, const uint32_t *spec, uint32_t per_n,
                                 uint32_t per_m, vkd_view x, const vkd_view *bias, vkd_view y, vki_pc_matmul pc)
{
    for (uint32_t i = 0; i < w->n_parts; i++) {
        const vk_tensor_part *part = &w->parts[i];
        vkd_view bind[4] = {vkd_whole(part->buf), x, bias ? *bias : x, y};
        pc.N = (uint32_t)part->n_rows;
        pc.y_col0 = (uint32_t)part->row0;
        vki_status st = matmul_part(c, k, spec, per_n, per_m, bind, pc, NULL, NULL);
        if (st != VKI_OK)
            return st;
    }
    return VKI_OK;
}

/* The gate|up pass's weights and activation; the norming projection's weights and views. */
static bool glu_fits(const vk_tensor *w, uint32_t act)
{
    return w->n_rows % 2 == 0 && w->n_parts == 1 && (act == VKI_GLU_SILU || act == VKI_GLU_GELU_TANH);
}

static bool norm_fits(const vkd_device *d, const vk_tensor *w, const op_mm_norm *n)
{
    const uint64_t N = w->n_rows;
    return op_matmul_norm_fits(d, w) && view_holds(&n->weight, 1, N, N, 4) && view_holds(&n->h, 1, N, N, 4) &&
           view_holds(&n->counter, 1, 1, 1, 4) && n->eps >= 0 &&
           (!n->xq.buf || (N % 32 == 0 && op_quant_x8_bytes(1, (uint32_t)N) <= view_range(&n->xq)));
}

bool op_matmul_glu_xq_fits(const vkd_device *d, const vk_tensor *w)
{
    uint32_t spec[VKK_MAX_SPEC];
    mv_spec(d, 1, true, spec); /* the output rows per workgroup (NR / 2) do not depend on M */
    const uint64_t N = w->n_rows / 2, no = spec[1] / 2;
    return w->n_parts == 1 && w->n_rows % 2 == 0 && N % 32 == 0 && 32 % no == 0 &&
           vkk_groups(N, (uint32_t)no) <= d->info.max_workgroup_count[0];
}

/* The quantising gate|up pass's views for M rows (op_mm_glu_xq; XQ in neither the input's nor
 * Y's buffer), and its error message. */
static bool glu_xq_ok(const vkd_device *d, const vk_tensor *w, uint32_t M, const op_mm_glu_xq *q, const vkd_view *in,
                      const vkd_view *y)
{
    const uint64_t N = w->n_rows / 2;
    return op_matmul_glu_xq_fits(d, w) && view_holds(&q->counter, 1, N / 32, N / 32, 4) && q->xq.offset % 4 == 0 &&
           view_range(&q->xq) >= op_quant_x8_bytes(M, (uint32_t)N) && q->xq.buf != in->buf && q->xq.buf != y->buf;
}
#define GLU_XQ_MSG "the quantised output needs op_matmul_glu_xq_fits (N % 32 == 0, one dispatch), N / 32 " \
                   "counters and op_quant_x8_bytes(M, N) bytes apart from X and Y"

/* The flags of a norming product (VKI_MM_NORM, and VKI_MM_NORM_XQ with an HQ view). */
static uint32_t norm_flags(const op_mm_norm *n) { return n ? VKI_MM_NORM | (n->xq.buf ? VKI_MM_NORM_XQ : 0u) : 0u; }

/* op_matmul_ex, and with xh (op_matmul_xh) the tensor-core GEMM reading X in F16 (op_half_x's
 * rows, K rounded up to 4 halves apart; x_stride ignored). */
static vki_status mm_record(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x, uint32_t x_stride,
                            vkd_view y, uint32_t y_stride, uint32_t M, op_mm_path path, bool accumulate, bool xh)
{
    vkd_device *d = c->d;
    const mm_type *t;
    const uint64_t K = w->ne0, N = w->n_rows;
    if (xh) {
        x_stride = op_half_x_stride((uint32_t)K);
        path = OP_MM_COOPMAT;
    }
    vki_status st = check_mm(d, xh ? "matmul_xh" : "matmul", w, M, N, &x, x_stride, xh ? 2 : 4, &y, y_stride, &t);
    if (st != VKI_OK)
        return st;
    if (bias && !view_holds(bias, 1, N, N, 4))
        return bad_arg(d, "matmul", w, "bias view holds fewer than N floats");
    if (xh && x.offset % 8)
        return bad_arg(d, "matmul_xh", w, "X view not 8-byte aligned");

    uint32_t spec[VKK_MAX_SPEC], per_group_n, per_group_m;
    vkk_id kid;
    if ((st = pick_kernel(d, t, M, path, spec, &kid)) != VKI_OK) {
        vkd_log(d, VKI_LOG_ERROR, "matmul %s: no cooperative-matrix GEMM on this device (or no tile fits its "
                "shared memory)", w->name);
        return st;
    }
    if (kid == t->matmul_cm || kid == t->matmul_cme)
        spec[11] = xh;
    if (kid == t->matvec) {
        per_group_n = spec[1];
        per_group_m = matvec_rows_per_group(spec);
        mv_x_vec4(spec, &x, x_stride);
    } else {
        per_group_n = spec[2];
        per_group_m = spec[1];
    }
    if (vkk_groups(M, per_group_m) > d->info.max_workgroup_count[1])
        return bad_arg(d, "matmul", w, "M too large for one dispatch on this device");
    vki_pc_matmul pc = {.M = M, .K = (uint32_t)K, .x_stride = x_stride, .y_stride = y_stride,
                        .w_stride = (uint32_t)w->row_bytes,
                        .flags = (bias ? VKI_MM_BIAS : 0u) | (accumulate ? VKI_MM_ACCUM : 0u),
                        .x_vec4 = !xh && x_vec4(&x, x_stride)};
    if (kid == t->matmul_cm || kid == t->matmul_cme) {
        bool done;
        pc.N = (uint32_t)N;
        if ((st = cm_split_dispatch(c, kid, spec, w, x, bias, y, pc, &done)) != VKI_OK || done)
            return st;
    }
    return parts_dispatch(c, w, kid, spec, per_group_n, per_group_m, x, bias, y, pc);
}

vki_status op_matmul_ex(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x, uint32_t x_stride,
                        vkd_view y, uint32_t y_stride, uint32_t M, op_mm_path path, bool accumulate)
{
    return mm_record(c, w, bias, x, x_stride, y, y_stride, M, path, accumulate, false);
}

/* ---- X in F16 for the tensor-core GEMM -------------------------------------------------------- */

#define HALF_X_WG 64u

uint32_t op_half_x_stride(uint32_t K) { return (K + 3) / 4 * 4; }

uint64_t op_half_x_bytes(uint32_t M, uint32_t K) { return 2ull * M * op_half_x_stride(K); }

bool op_matmul_takes_xh(const vkd_device *d, uint32_t M)
{
    return d->cm.kind != VKD_CM_NONE && !d->cm_x32 && M > op_matmul_gemv_max_m(d);
}

vki_status op_half_x(vkd_cmd *c, vkd_view x, uint32_t x_stride, uint32_t M, uint32_t K, vkd_view xh)
{
    vkd_device *d = c->d;
    if (!d->info.float16) {
        vkd_log(d, VKI_LOG_ERROR, "half_x: needs shaderFloat16");
        return VKI_ERR_UNSUPPORTED;
    }
    if (M == 0 || K == 0 || K > UINT32_MAX - 3)
        return bad_arg(d, "half_x", NULL, "M = 0 or K = 0");
    if (!view_holds(&x, M, K, x_stride, 4))
        return bad_arg(d, "half_x", NULL, "X view too small for [M, x_stride] (or x_stride < K)");
    if (view_range(&xh) < op_half_x_bytes(M, K) || xh.offset % 8)
        return bad_arg(d, "half_x", NULL, "XH view smaller than op_half_x_bytes(M, K) (or not 8-aligned)");
    const uint32_t spec[1] = {HALF_X_WG}, gy = M < d->info.max_workgroup_count[1] ? M : d->info.max_workgroup_count[1];
    vki_pc_quant_x8 pc = {.M = M, .K = K, .x_stride = x_stride, .x_vec4 = x_vec4(&x, x_stride)};
    vkd_view b[2] = {x, xh};
    return vkk_dispatch(c, VKK_HALF_X, spec, b, 2, &pc, sizeof pc, vkk_groups(op_half_x_stride(K) / 4, spec[0]), gy, 1);
}

vki_status op_matmul_xh(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view xh, vkd_view y,
                        uint32_t y_stride, uint32_t M, bool accumulate)
{
    return mm_record(c, w, bias, xh, 0, y, y_stride, M, OP_MM_COOPMAT, accumulate, true);
}

vki_status op_matmul_path(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x,
                          uint32_t x_stride, vkd_view y, uint32_t y_stride, uint32_t M, op_mm_path path)
{
    return op_matmul_ex(c, w, bias, x, x_stride, y, y_stride, M, path, false);
}

vki_status op_matmul_glu(vkd_cmd *c, const vk_tensor *w, uint32_t act, vkd_view x, uint32_t x_stride, vkd_view y,
                         uint32_t y_stride, uint32_t M, const op_mm_glu_xq *q)
{
    vkd_device *d = c->d;
    const mm_type *t;
    const uint64_t K = w->ne0, N = w->n_rows / 2;
    vki_status st = check_mm(d, "matmul_glu", w, M, N, &x, x_stride, 4, &y, y_stride, &t);
    if (st != VKI_OK)
        return st;
    if (!glu_fits(w, act))
        return bad_arg(d, "matmul_glu", w, "needs one part of an even number of rows, SiLU or GELU");
    if (q && !glu_xq_ok(d, w, M, q, &x, &y))
        return bad_arg(d, "matmul_glu", w, GLU_XQ_MSG);
    uint32_t spec[VKK_MAX_SPEC];
    mv_spec(d, M, true, spec);
    mv_x_vec4(spec, &x, x_stride);
    if (vkk_groups(M, matvec_rows_per_group(spec)) > d->info.max_workgroup_count[1])
        return bad_arg(d, "matmul_glu", w, "M too large for one dispatch on this device");
    vki_pc_matmul pc = {.M = M, .N = (uint32_t)N, .K = (uint32_t)K, .x_stride = x_stride, .y_stride = y_stride,
                        .w_stride = (uint32_t)w->row_bytes,
                        .flags = (act == VKI_GLU_GELU_TANH ? VKI_MM_GELU : 0u) | (q ? VKI_MM_GLU_XQ : 0u),
                        .x_vec4 = x_vec4(&x, x_stride)};
    vkd_view bind[4] = {vkd_whole(w->parts[0].buf), x, x, y};
    return matmul_part(c, t->matvec, spec, spec[1] / 2, matvec_rows_per_group(spec), bind, pc, NULL, q);
}

bool op_matmul_norm_fits(const vkd_device *d, const vk_tensor *w)
{
    uint32_t spec[VKK_MAX_SPEC];
    matvec_spec(d, 1, spec);
    /* the epilogue's sum of squares (norm_common.glsl) takes whole subgroups dividing its
     * virtual lanes: a workgroup of less than a subgroup (--kernel-config matvec=4x..., 8-lane
     * lavapipe) would add two lanes' partial sums into one slot */
    const uint32_t sg = d->info.subgroup_size ? d->info.subgroup_size : 1;
    return w->n_parts == 1 && vkk_groups(w->n_rows, spec[1]) <= d->info.max_workgroup_count[0] &&
           VKI_NORM_LANES % spec[0] == 0 && spec[0] % sg == 0;
}

/* The float matrix-vector product of one token with a norm epilogue (flags: the residual norm's
 * or the heads'), its views checked by the caller. */
static vki_status matvec_normed(vkd_cmd *c, const vk_tensor *w, const mm_type *t, const vkd_view *bias, vkd_view x,
                                vkd_view y, uint32_t flags, const op_mm_norm *n, uint32_t norm_cols)
{
    const uint32_t K = (uint32_t)w->ne0, N = (uint32_t)w->n_rows;
    uint32_t spec[VKK_MAX_SPEC];
    matvec_spec(c->d, 1, spec);
    mv_x_vec4(spec, &x, K);
    vki_pc_matmul pc = {.M = 1, .N = N, .K = K, .x_stride = K, .y_stride = N, .w_stride = (uint32_t)w->row_bytes,
                        .flags = flags | (bias ? VKI_MM_BIAS : 0u), .x_vec4 = x_vec4(&x, K), .norm_eps = n->eps,
                        .norm_cols = norm_cols};
    vkd_view bind[4] = {vkd_whole(w->parts[0].buf), x, bias ? *bias : x, y};
    return matmul_part(c, t->matvec, spec, spec[1], 1, bind, pc, n, NULL);
}

vki_status op_matmul_norm(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x, vkd_view y,
                          const op_mm_norm *n)
{
    vkd_device *d = c->d;
    const mm_type *t;
    const uint64_t K = w->ne0, N = w->n_rows;
    vki_status st = check_mm(d, "matmul_norm", w, 1, N, &x, (uint32_t)K, 4, &y, (uint32_t)N, &t);
    if (st != VKI_OK)
        return st;
    if (!norm_fits(d, w, n))
        return bad_arg(d, "matmul_norm", w, "needs one part in one dispatch, N norm weights and H floats, a "
                       "counter, eps >= 0 (and for HQ N % 32 == 0 and its bytes)");
    if (bias && !view_holds(bias, 1, N, N, 4))
        return bad_arg(d, "matmul_norm", w, "bias view holds fewer than N floats");
    return matvec_normed(c, w, t, bias, x, y, VKI_MM_ACCUM | norm_flags(n), n, 0);
}

bool op_matmul_head_norm_fits(const vkd_device *d, const vk_tensor *w, uint32_t head_dim)
{
    uint32_t spec[VKK_MAX_SPEC];
    matvec_spec(d, 1, spec); /* the rows per workgroup (NR) must not straddle two heads */
    return op_matmul_norm_fits(d, w) && head_dim && w->n_rows % head_dim == 0 && head_dim % spec[1] == 0;
}

/* The head norm's views (bound where matmul_part binds the residual norm's: weight 4, counter 6;
 * H and HQ to Y, unused), and whether they hold what N columns need. */
static bool head_norm_ok(const vkd_device *d, const vk_tensor *w, const op_mm_head_norm *n, vkd_view y,
                         op_mm_norm *as)
{
    uint64_t hd = n->head_dim;
    *as = (op_mm_norm){n->weight, y, n->counter, n->eps, .xq = {0}};
    return op_matmul_head_norm_fits(d, w, n->head_dim) && view_holds(&n->weight, 1, hd, hd, 4) &&
           view_holds(&n->counter, 1, w->n_rows / hd, w->n_rows / hd, 4) && n->eps >= 0;
}
#define HEAD_NORM_MSG "the head norm needs op_matmul_head_norm_fits (one part in one dispatch, N a multiple of " \
                      "head_dim, rows per workgroup dividing it), head_dim weights, N / head_dim counters, eps >= 0"

vki_status op_matmul_head_norm(vkd_cmd *c, const vk_tensor *w, vkd_view x, vkd_view y, const op_mm_head_norm *n)
{
    vkd_device *d = c->d;
    const mm_type *t;
    const uint64_t K = w->ne0, N = w->n_rows;
    vki_status st = check_mm(d, "matmul_head_norm", w, 1, N, &x, (uint32_t)K, 4, &y, (uint32_t)N, &t);
    if (st != VKI_OK)
        return st;
    op_mm_norm as;
    if (!head_norm_ok(d, w, n, y, &as))
        return bad_arg(d, "matmul_head_norm", w, HEAD_NORM_MSG);
    return matvec_normed(c, w, t, NULL, x, y, VKI_MM_HEAD_NORM, &as, n->head_dim);
}

vki_status op_matmul(vkd_cmd *c, const vk_tensor *w, const vkd_view *bias, vkd_view x, uint32_t x_stride,
                     vkd_view y, uint32_t y_stride, uint32_t M)
{
    return op_matmul_path(c, w, bias, x, x_stride, y, y_stride, M, OP_MM_AUTO);
}

/* ---- the integer-dot matrix-vector path ------------------------------------------------------ */

static vkk_id matvec_i8_kernel(uint32_t type)
{
    switch (type) {
    case VKI_GGML_Q8_0: return VKK_MATVEC_I8_Q8_0;
    case VKI_GGML_Q4_0: return VKK_MATVEC_I8_Q4_0;
    case VKI_GGML_Q4_1: return VKK_MATVEC_I8_Q4_1;
    case VKI_GGML_Q5_0: return VKK_MATVEC_I8_Q5_0;
    case VKI_GGML_Q5_1: return VKK_MATVEC_I8_Q5_1;
    case VKI_GGML_Q2_K: return VKK_MATVEC_I8_Q2_K;
    case VKI_GGML_Q3_K: return VKK_MATVEC_I8_Q3_K;
    case VKI_GGML_Q4_K: return VKK_MATVEC_I8_Q4_K;
    case VKI_GGML_Q5_K: return VKK_MATVEC_I8_Q5_K;
    case VKI_GGML_Q6_K: return VKK_MATVEC_I8_Q6_K;
    case VKI_GGML_IQ4_NL: return VKK_MATVEC_I8_IQ4_NL;
    case VKI_GGML_IQ4_XS: return VKK_MATVEC_I8_IQ4_XS;
    case VKI_GGML_MXFP4: return VKK_MATVEC_I8_MXFP4;
    default: return VKK_COUNT;
    }
}

/* The experts' integer-dot matvec of the same type (kernels.h lists them in the same order). */
static vkk_id matvec_id_i8_kernel(uint32_t type)
{
    const vkk_id k = matvec_i8_kernel(type);
    return k == VKK_COUNT ? VKK_COUNT : (vkk_id)(VKK_MATVEC_ID_I8_Q8_0 + (k - VKK_MATVEC_I8_Q8_0));
}
_Static_assert(VKK_MATVEC_ID_I8_MXFP4 - VKK_MATVEC_ID_I8_Q8_0 == VKK_MATVEC_I8_MXFP4 - VKK_MATVEC_I8_Q8_0,
               "the experts' integer-dot kernels follow matvec_i8's order");

#define QUANT_X8_WG 64u

vki_status op_matmul_i8_prepare(vkd_device *d, uint32_t type)
{
    if (!op_matmul_i8_supported(d, type))
        return VKI_ERR_UNSUPPORTED;
    const uint32_t q[1] = {QUANT_X8_WG};
    vki_status st = vkk_prepare(d, VKK_QUANT_X8, q);
    const uint32_t ms[2] = {1, OP_MATVEC_ROWS}; /* the specialisations of M = 1 and of M > 1 */
    for (int i = 0; i < 2 && st == VKI_OK; i++)
        for (uint32_t glu = 0; glu < 2 && st == VKI_OK; glu++) {
            uint32_t spec[VKK_MAX_SPEC];
            mv_spec(d, ms[i], glu, spec);
            st = vkk_prepare(d, matvec_i8_kernel(type), spec);
        }
    return st;
}

uint64_t op_quant_x8_bytes(uint32_t M, uint32_t K) { return 4 * ((uint64_t)M * (K / 4) + (uint64_t)M * (K / 32)); }

bool op_matmul_i8_supported(const vkd_device *d, uint32_t type)
{
    /* the device enables shaderIntegerDotProduct only through Vulkan 1.3's features */
    return matvec_i8_kernel(type) != VKK_COUNT && op_matmul_supported(d, type) && d->info.integer_dot &&
           d->info.api_version >= VK_API_VERSION_1_3;
}

vki_status op_quant_x8(vkd_cmd *c, vkd_view x, uint32_t x_stride, uint32_t M, uint32_t K, vkd_view xq)
{
    vkd_device *d = c->d;
    if (!d->info.integer_dot || d->info.api_version < VK_API_VERSION_1_3) {
        vkd_log(d, VKI_LOG_ERROR, "quant_x8: the integer-dot path needs shaderIntegerDotProduct (Vulkan 1.3)");
        return VKI_ERR_UNSUPPORTED;
    }
    if (M == 0 || K == 0 || K % 32)
        return bad_arg(d, "quant_x8", NULL, "M = 0, or K not a positive multiple of 32");
    if (!view_holds(&x, M, K, x_stride, 4))
        return bad_arg(d, "quant_x8", NULL, "X view too small for [M, x_stride] (or x_stride < K)");
    if (view_range(&xq) < op_quant_x8_bytes(M, K) || xq.offset % 4)
        return bad_arg(d, "quant_x8", NULL, "XQ view smaller than op_quant_x8_bytes(M, K) (or not 4-aligned)");
    const uint32_t spec[1] = {QUANT_X8_WG};
    if (M > d->info.max_workgroup_count[1])
        return bad_arg(d, "quant_x8", NULL, "M too large for one dispatch on this device");
    vki_pc_quant_x8 pc = {.M = M, .K = K, .x_stride = x_stride, .x_vec4 = x_vec4(&x, x_stride)};
    vkd_view b[2] = {x, xq};
    return vkk_dispatch(c, VKK_QUANT_X8, spec, b, 2, &pc, sizeof pc, vkk_groups(K / 32, spec[0]), M, 1);
}

vki_status op_matmul_i8(vkd_cmd *c, const vk_tensor *w, vkd_view xq, vkd_view y, uint32_t y_stride, uint32_t M,
                        const op_mm_i8 *o)
{
    vkd_device *d = c->d;
    const op_mm_i8 none = {0};
    const mm_type *t;
    if (!o)
        o = &none;
    vki_status st = check_type(d, w, &t);
    if (st != VKI_OK)
        return st;
    const vkk_id kid = matvec_i8_kernel(w->type);
    if (!op_matmul_i8_supported(d, w->type)) {
        vkd_log(d, VKI_LOG_ERROR, "matmul_i8 %s: the integer-dot path runs the integer weight types (not "
                "F32, F16, BF16) on a device with shaderIntegerDotProduct (Vulkan 1.3); this is %s", w->name,
                quant_type_name(w->type));
        return VKI_ERR_UNSUPPORTED;
    }
    const uint32_t K = (uint32_t)w->ne0, N = (uint32_t)(o->glu ? w->n_rows / 2 : w->n_rows);
    if (M == 0)
        return bad_arg(d, "matmul_i8", w, "M = 0");
    if (view_range(&xq) < op_quant_x8_bytes(M, K) || xq.offset % 4)
        return bad_arg(d, "matmul_i8", w, "XQ view smaller than op_quant_x8_bytes(M, K)");
    if (!view_holds(&y, M, N, y_stride, 4))
        return bad_arg(d, "matmul_i8", w, "Y view too small for [M, y_stride] (or y_stride < N)");
    if (o->bias && (o->glu || !view_holds(o->bias, 1, N, N, 4)))
        return bad_arg(d, "matmul_i8", w, "bias view holds fewer than N floats (or a bias with glu)");
    if (o->glu && (!glu_fits(w, o->act) || o->accumulate || o->norm))
        return bad_arg(d, "matmul_i8", w, "glu needs one part of an even number of rows, SiLU or GELU, and no "
                       "accumulate or norm");
    if (o->glu_xq && (!o->glu || !glu_xq_ok(d, w, M, o->glu_xq, &xq, &y)))
        return bad_arg(d, "matmul_i8", w, "glu_xq needs glu; " GLU_XQ_MSG);
    if (o->norm && (M != 1 || y_stride != N || !o->accumulate || !norm_fits(d, w, o->norm)))
        return bad_arg(d, "matmul_i8", w, "norm needs M = 1, accumulate, one part in one dispatch, N norm "
                       "weights and H floats, a counter, eps >= 0 (and for HQ N % 32 == 0 and its bytes)");
    op_mm_norm head_as;
    if (o->head_norm && (M != 1 || y_stride != N || o->accumulate || o->bias || o->glu || o->norm ||
                         !head_norm_ok(d, w, o->head_norm, y, &head_as)))
        return bad_arg(d, "matmul_i8", w, "head_norm needs M = 1, no accumulate, bias, glu or norm; " HEAD_NORM_MSG);
    const op_mm_norm *norm = o->head_norm ? &head_as : o->norm;
    uint32_t spec[VKK_MAX_SPEC];
    mv_spec(d, M, o->glu, spec);
    if (vkk_groups(M, matvec_rows_per_group(spec)) > d->info.max_workgroup_count[1])
        return bad_arg(d, "matmul_i8", w, "M too large for one dispatch on this device");
    vki_pc_matmul pc = {.M = M, .N = N, .K = K, .y_stride = y_stride, .w_stride = (uint32_t)w->row_bytes,
                        .flags = (o->bias ? VKI_MM_BIAS : 0u) | (o->accumulate ? VKI_MM_ACCUM : 0u) |
                                 (o->glu && o->act == VKI_GLU_GELU_TANH ? VKI_MM_GELU : 0u) |
                                 norm_flags(o->norm) | (o->glu_xq ? VKI_MM_GLU_XQ : 0u) |
                                 (o->head_norm ? VKI_MM_HEAD_NORM : 0u),
                        .norm_eps = norm ? norm->eps : 0.0f, .norm_cols = o->head_norm ? o->head_norm->head_dim : 0};
    if (o->glu || norm) { /* one part */
        vkd_view bind[4] = {vkd_whole(w->parts[0].buf), xq, o->bias ? *o->bias : xq, y};
        return matmul_part(c, kid, spec, o->glu ? spec[1] / 2 : spec[1], matvec_rows_per_group(spec), bind, pc,
                           norm, o->glu_xq);
    }
    return parts_dispatch(c, w, kid, spec, spec[1], matvec_rows_per_group(spec), xq, o->bias, y, pc);
}

/* ---- the experts' matmul (mixture of experts) ------------------------------------------------ */

op_mm_path op_matmul_id_path(const vkd_device *d, uint32_t M, uint32_t n_expert)
{
    uint32_t per_expert = n_expert ? (M + n_expert - 1) / n_expert : M;
    if (per_expert <= op_matmul_gemv_max_m(d))
        return OP_MM_GEMV;
    return d->cm.kind != VKD_CM_NONE ? OP_MM_COOPMAT : OP_MM_GEMM;
}

vki_status op_matmul_id_i8_prepare(vkd_device *d, uint32_t type)
{
    if (!op_matmul_i8_supported(d, type))
        return VKI_ERR_UNSUPPORTED;
    uint32_t spec[VKK_MAX_SPEC];
    matvec_spec(d, 1, spec);
    const uint32_t q[1] = {QUANT_X8_WG};
    vki_status st = vkk_prepare(d, VKK_QUANT_X8, q);
    return st == VKI_OK ? vkk_prepare(d, matvec_id_i8_kernel(type), spec) : st;
}

/* One part (experts e0 .. e0 + n_exp): dispatches along N as the workgroup-count limit needs. */
static vki_status matmul_id_part(vkd_cmd *c, vkk_id k, const uint32_t *spec, uint32_t rows_per_group,
                                 uint32_t gy, uint32_t gz, const vkd_view bind[4], vki_pc_matmul_id pc)
{
    const uint64_t rows_per_dispatch = (uint64_t)c->d->info.max_workgroup_count[0] * rows_per_group;
    for (uint64_t n0 = 0; n0 < pc.N; n0 += rows_per_dispatch) {
        uint64_t rows = pc.N - n0 < rows_per_dispatch ? pc.N - n0 : rows_per_dispatch;
        pc.n0 = (uint32_t)n0;
        vki_status st = vkk_dispatch(c, k, spec, bind, 4, &pc, sizeof pc, vkk_groups(rows, rows_per_group), gy, gz);
        if (st != VKI_OK)
            return st;
    }
    return VKI_OK;
}

/* Kernel k over every part of the experts' tensor w (parts of whole experts, pc.N rows each):
 * bind[0] becomes the part's weights, pc.e0 / n_exp its experts; grid z is the part's experts
 * where z_experts (the GEMMs), else 1. */
static vki_status id_parts_dispatch(vkd_cmd *c, const char *op, const vk_tensor *w, vkk_id k, const uint32_t *spec,
                                    uint32_t per_n, uint32_t gy, bool z_experts, const vkd_view bind[4],
                                    vki_pc_matmul_id pc)
{
    vki_status st = VKI_OK;
    for (uint32_t i = 0; i < w->n_parts && st == VKI_OK; i++) {
        const vk_tensor_part *part = &w->parts[i];
        if (part->row0 % pc.N || part->n_rows % pc.N)
            return bad_arg(c->d, op, w, "a weight part does not hold whole experts");
        pc.e0 = (uint32_t)(part->row0 / pc.N);
        pc.n_exp = (uint32_t)(part->n_rows / pc.N);
        const vkd_view b[4] = {vkd_whole(part->buf), bind[1], bind[2], bind[3]};
        st = matmul_id_part(c, k, spec, per_n, gy, z_experts ? pc.n_exp : 1, b, pc);
    }
    return st;
}

/* op_matmul_id, and with xh (op_matmul_id_xh) the tensor-core GEMM reading X in F16 (op_half_x's
 * rows; x_stride ignored). */
static vki_status mm_id_record(vkd_cmd *c, const vk_tensor *w, uint32_t n_expert, vkd_view ids, vkd_view route,
                               vkd_view x, uint32_t x_stride, uint32_t x_div, vkd_view y, uint32_t y_stride,
                               uint32_t M, uint32_t max_rows, op_mm_path path, bool xh)
{
    vkd_device *d = c->d;
    const mm_type *t;
    vki_status st = check_type(d, w, &t);
    if (st != VKI_OK)
        return st;
    if (!n_expert || n_expert > VKI_MOE_MAX_EXPERTS || w->n_rows % n_expert || !M || !x_div || !max_rows)
        return bad_arg(d, "matmul_id", w, "n_expert (1..VKI_MOE_MAX_EXPERTS, dividing the rows), M, x_div and "
                       "max_rows must be > 0");
    const uint64_t K = w->ne0, N = w->n_rows / n_expert;
    if (xh) {
        x_stride = op_half_x_stride((uint32_t)K);
        path = OP_MM_COOPMAT;
    }
    if (path == OP_MM_AUTO)
        path = op_matmul_id_path(d, M, n_expert);
    bool gemv = path == OP_MM_GEMV;
    if (!view_holds(&x, (M - 1) / x_div + 1, K, x_stride, xh ? 2 : 4) || !view_holds(&y, M, N, y_stride, 4) ||
        (xh && x.offset % 8))
        return bad_arg(d, "matmul_id", w, "X or Y view too small (or a stride below K / N, or F16 X not 8-aligned)");
    if (gemv ? !view_holds(&ids, 1, M, M, 4) : !view_holds(&route, 1, n_expert + 1ull + M, n_expert + 1ull + M, 4))
        return bad_arg(d, "matmul_id", w, gemv ? "ids view holds fewer than M int32" : "route view too small");
    uint32_t spec[VKK_MAX_SPEC], per_n, per_m = 1;
    if (gemv) {
        matvec_spec(d, 1, spec);
        mv_x_vec4(spec, &x, x_stride);
        per_n = spec[1];
    } else if (path == OP_MM_COOPMAT) {
        if (d->cm.kind == VKD_CM_NONE || !cm_spec(d, max_rows, spec))
            return bad_arg(d, "matmul_id", w, "no cooperative-matrix GEMM on this device");
        per_n = spec[2], per_m = spec[1];
    } else {
        matmul_spec(d, spec);
        per_n = spec[2], per_m = spec[1];
    }
    vkk_id kid = t->id[gemv ? 0 : path == OP_MM_GEMM ? 1 : d->cm.kind == VKD_CM_NV ? 2 : 3];
    if (path == OP_MM_COOPMAT)
        spec[11] = xh;
    uint32_t gy = gemv ? M : vkk_groups(max_rows, per_m);
    if (gy > d->info.max_workgroup_count[1])
        return bad_arg(d, "matmul_id", w, "M too large for one dispatch on this device");
    vki_pc_matmul_id pc = {.M = M, .N = (uint32_t)N, .K = (uint32_t)K, .w_stride = (uint32_t)w->row_bytes,
                           .x_stride = x_stride, .y_stride = y_stride, .x_vec4 = !xh && x_vec4(&x, x_stride),
                           .x_div = x_div, .n_expert = n_expert};
    const vkd_view bind[4] = {{0}, x, gemv ? ids : route, y};
    return id_parts_dispatch(c, "matmul_id", w, kid, spec, per_n, gy, !gemv, bind, pc);
}

vki_status op_matmul_id(vkd_cmd *c, const vk_tensor *w, uint32_t n_expert, vkd_view ids, vkd_view route, vkd_view x,
                        uint32_t x_stride, uint32_t x_div, vkd_view y, uint32_t y_stride, uint32_t M,
                        uint32_t max_rows, op_mm_path path)
{
    return mm_id_record(c, w, n_expert, ids, route, x, x_stride, x_div, y, y_stride, M, max_rows, path, false);
}

vki_status op_matmul_id_xh(vkd_cmd *c, const vk_tensor *w, uint32_t n_expert, vkd_view route, vkd_view xh,
                           uint32_t x_div, vkd_view y, uint32_t y_stride, uint32_t M, uint32_t max_rows)
{
    return mm_id_record(c, w, n_expert, (vkd_view){0}, route, xh, 0, x_div, y, y_stride, M, max_rows, OP_MM_COOPMAT,
                        true);
}

vki_status op_matmul_id_i8(vkd_cmd *c, const vk_tensor *w, uint32_t n_expert, vkd_view ids, vkd_view xq,
                           uint32_t x_div, vkd_view y, uint32_t y_stride, uint32_t M)
{
    vkd_device *d = c->d;
    const mm_type *t;
    vki_status st = check_type(d, w, &t);
    if (st != VKI_OK)
        return st;
    if (!op_matmul_i8_supported(d, w->type)) {
        vkd_log(d, VKI_LOG_ERROR, "matmul_id_i8 %s: the integer-dot path runs the integer weight types on a device "
                "with shaderIntegerDotProduct (Vulkan 1.3); this is %s", w->name, quant_type_name(w->type));
        return VKI_ERR_UNSUPPORTED;
    }
    if (!n_expert || n_expert > VKI_MOE_MAX_EXPERTS || w->n_rows % n_expert || !M || !x_div)
        return bad_arg(d, "matmul_id_i8", w, "n_expert (1..VKI_MOE_MAX_EXPERTS, dividing the rows), M and x_div "
                       "must be > 0");
    const uint32_t K = (uint32_t)w->ne0, N = (uint32_t)(w->n_rows / n_expert), x_rows = (M - 1) / x_div + 1;
    if (K % 32 || view_range(&xq) < op_quant_x8_bytes(x_rows, K) || xq.offset % 4)
        return bad_arg(d, "matmul_id_i8", w, "K % 32 != 0, or XQ view smaller than op_quant_x8_bytes(X rows, K)");
    if (!view_holds(&y, M, N, y_stride, 4) || !view_holds(&ids, 1, M, M, 4))
        return bad_arg(d, "matmul_id_i8", w, "Y view too small (or y_stride < N), or ids view under M int32");
    if (M > d->info.max_workgroup_count[1])
        return bad_arg(d, "matmul_id_i8", w, "M too large for one dispatch on this device");
    uint32_t spec[VKK_MAX_SPEC];
    matvec_spec(d, 1, spec);
    vki_pc_matmul_id pc = {.M = M, .N = N, .K = K, .w_stride = (uint32_t)w->row_bytes, .y_stride = y_stride,
                           .x_div = x_div, .n_expert = n_expert};
    const vkd_view bind[4] = {{0}, xq, ids, y};
    return id_parts_dispatch(c, "matmul_id_i8", w, matvec_id_i8_kernel(w->type), spec, spec[1], M, false, bind, pc);
}

vki_status op_matmul_id_prepare(vkd_device *d, uint32_t type, uint32_t max_rows)
{
    const mm_type *t = mm_type_get(type);
    if (!t || !op_matmul_supported(d, type))
        return VKI_ERR_UNSUPPORTED;
    uint32_t spec[VKK_MAX_SPEC];
    matvec_spec(d, 1, spec);
    vki_status st = vkk_prepare(d, t->id[0], spec);
    if (st == VKI_OK && d->cm.kind != VKD_CM_NONE && cm_spec(d, max_rows, spec)) {
        spec[11] = !d->cm_x32; /* X in F16, as the forward pass hands it (op_matmul_id_xh) */
        st = vkk_prepare(d, t->id[d->cm.kind == VKD_CM_NV ? 2 : 3], spec);
    } else if (st == VKI_OK) {
        matmul_spec(d, spec);
        st = vkk_prepare(d, t->id[1], spec);
    }
    return st;
}

/* ---- row gather ----------------------------------------------------------------------------- */

static vki_status get_rows_dispatch(vkd_cmd *c, vkk_id k, vkd_view w, vkd_view ids, vkd_view y,
                                    const vki_pc_get_rows *pc)
{
    uint32_t spec[1] = {get_rows_wg(c->d)};
    uint32_t gx = vkk_groups((pc->K + 3) / 4, spec[0]);
    uint32_t max_gy = c->d->info.max_workgroup_count[1];
    uint32_t gy = pc->n < max_gy ? pc->n : max_gy; /* the shader strides over the rest */
    vkd_view bind[3] = {w, ids, y};
    return vkk_dispatch(c, k, spec, bind, 3, pc, sizeof *pc, gx, gy, 1);
}

vki_status op_get_rows(vkd_cmd *c, const vk_tensor *w, vkd_view ids, uint32_t n, vkd_view y, uint32_t y_stride)
{
    vkd_device *d = c->d;
    const mm_type *t;
    vki_status st = check_type(d, w, &t);
    if (st != VKI_OK)
        return st;
    if (n == 0)
        return VKI_OK;
    if (!view_holds(&ids, 1, n, n, 4))
        return bad_arg(d, "get_rows", w, "ids view holds fewer than n int32");
    if (!view_holds(&y, n, w->ne0, y_stride, 4))
        return bad_arg(d, "get_rows", w, "y view too small for [n, y_stride] (or y_stride < K)");
    if (w->n_rows > INT32_MAX)
        return bad_arg(d, "get_rows", w, "more rows than an int32 id can name");
    vki_pc_get_rows pc = {.n = n, .K = (uint32_t)w->ne0, .w_stride = (uint32_t)w->row_bytes,
                          .y_stride = y_stride, .n_rows = (uint32_t)w->n_rows};
    for (uint32_t i = 0; i < w->n_parts && st == VKI_OK; i++) {
        pc.row0 = (uint32_t)w->parts[i].row0;
        pc.part_rows = (uint32_t)w->parts[i].n_rows;
        pc.zero_oob = i == 0;
        st = get_rows_dispatch(c, t->get_rows, vkd_whole(w->parts[i].buf), ids, y, &pc);
    }
    return st;
}

vki_status op_gather_rows(vkd_cmd *c, vkd_view src, uint32_t src_stride, uint32_t src_rows, uint32_t K,
                          vkd_view ids, uint32_t n, vkd_view y, uint32_t y_stride)
{
    vkd_device *d = c->d;
    if (n == 0)
        return VKI_OK;
    if (K == 0 || src_rows == 0 || src_rows > INT32_MAX || (uint64_t)src_stride * 4 > UINT32_MAX ||
        !view_holds(&src, src_rows, K, src_stride, 4))
        return bad_arg(d, "gather_rows", NULL, "src view too small for [src_rows, src_stride] (or stride < K)");
    if (!view_holds(&ids, 1, n, n, 4))
        return bad_arg(d, "gather_rows", NULL, "ids view holds fewer than n int32");
    if (!view_holds(&y, n, K, y_stride, 4))
        return bad_arg(d, "gather_rows", NULL, "y view too small for [n, y_stride] (or y_stride < K)");
    vki_pc_get_rows pc = {.n = n, .K = K, .w_stride = src_stride * 4, .y_stride = y_stride, .row0 = 0,
                          .part_rows = src_rows, .n_rows = src_rows, .zero_oob = 1};
    return get_rows_dispatch(c, VKK_GET_ROWS_F32, src, ids, y, &pc);
}

/* ---- prepare -------------------------------------------------------------------------------- */

/* lavapipe (llvmpipe) turns a matmul pipeline into machine code at its first dispatch, not when
 * it is created: seconds per variant. One tiny call of each variant here keeps that out of the
 * first step (and puts the code in Mesa's on-disk shader cache). Elsewhere it costs one small
 * submit. */
static vki_status warm_up(vkd_device *d, uint32_t type, uint32_t K)
{
    const uint32_t M = op_matmul_gemv_max_m(d) + 1; /* the device's GEMM */
    vk_tensor w = {0};
    vkd_buffer *x = NULL, *y = NULL;
    vkd_cmd c = {0};
    void *zeros = calloc(1, (size_t)M * K * 4);
    vki_status st = zeros ? vk_tensor_create(d, type, K, 1, 0, "warm-up w", &w) : VKI_ERR_OUT_OF_HOST_MEMORY;
    if (st == VKI_OK)
        st = vk_tensor_upload(d, &w, zeros);
    if (st == VKI_OK)
        st = vkd_buffer_create(d, (VkDeviceSize)M * K * 4, VKD_MEM_DEVICE, "warm-up x", &x);
    if (st == VKI_OK)
        st = vkd_upload(d, x, 0, zeros, (size_t)M * K * 4); /* also the ids: row 0 */
    if (st == VKI_OK)
        st = vkd_buffer_create(d, (VkDeviceSize)M * K * 4, VKD_MEM_DEVICE, "warm-up y", &y);
    if (st == VKI_OK)
        st = vkd_cmd_create(d, "matmul warm-up", &c);
    if (st == VKI_OK)
        st = vkd_cmd_begin(&c);
    vkd_view vx = {x, 0, VK_WHOLE_SIZE}, vy = {y, 0, VK_WHOLE_SIZE}, ids = {x, 0, 4};
    const uint32_t ms[3] = {1, 2, M};
    for (int i = 0; i < 2 && st == VKI_OK; i++) {
        st = op_matmul_path(&c, &w, &vx, vx, K, vy, 1, ms[i], OP_MM_GEMV);
        vkd_barrier(&c);
    }
    if (st == VKI_OK && op_matmul_takes_xh(d, M)) { /* the GEMM as the forward pass records it */
        st = op_half_x(&c, vx, K, M, K, vy); /* M x K halves fit y's M x K floats */
        if (st == VKI_OK) {
            vkd_barrier(&c);
            st = op_matmul_xh(&c, &w, NULL, vy, vx, 1, M, false);
        }
    } else if (st == VKI_OK) {
        st = op_matmul_path(&c, &w, &vx, vx, K, vy, 1, ms[2], OP_MM_AUTO);
    }
    if (st == VKI_OK)
        vkd_barrier(&c);
    if (st == VKI_OK)
        st = op_get_rows(&c, &w, ids, 1, vy, K);
    if (st == VKI_OK)
        st = vkd_cmd_submit_wait(&c);
    vkd_cmd_destroy(&c);
    vkd_buffer_destroy(d, x);
    vkd_buffer_destroy(d, y);
    vk_tensor_destroy(d, &w);
    free(zeros);
    return st;
}

vki_status op_matmul_prepare(vkd_device *d, uint32_t type)
{
    const mm_type *t = mm_type_get(type);
    if (!t || !op_matmul_supported(d, type))
        return VKI_ERR_UNSUPPORTED;
    uint32_t mv1[8], mv8[8], mm[VKK_MAX_SPEC], gr[1] = {get_rows_wg(d)};
    vkk_id mm_kid;
    matvec_spec(d, 1, mv1);
    matvec_spec(d, OP_MATVEC_ROWS, mv8);
    vki_status st = VKI_OK;
    for (uint32_t glu = 0; glu < 2 && st == VKI_OK; glu++) { /* plain, and op_matmul_glu's */
        mv1[4] = mv8[4] = glu;
        if ((st = vkk_prepare(d, t->matvec, mv1)) == VKI_OK)
            st = vkk_prepare(d, t->matvec, mv8);
    }
    /* the device's GEMM for few rows above the crossover and for many (tile sizes may differ) */
    const uint32_t ms[2] = {op_matmul_gemv_max_m(d) + 1, 4096};
    for (int i = 0; i < 2 && st == VKI_OK; i++)
        if ((st = pick_kernel(d, t, ms[i] > ms[0] ? ms[i] : ms[0], OP_MM_AUTO, mm, &mm_kid)) == VKI_OK) {
            if (mm_kid == t->matmul_cm || mm_kid == t->matmul_cme)
                mm[11] = op_matmul_takes_xh(d, ms[0]); /* X in F16, as the forward pass hands it */
            st = vkk_prepare(d, mm_kid, mm);
        }
    const uint32_t hx[1] = {HALF_X_WG};
    if (st == VKI_OK && op_matmul_takes_xh(d, ms[0]))
        st = vkk_prepare(d, VKK_HALF_X, hx);
    if (st == VKI_OK)
        st = vkk_prepare(d, t->get_rows, gr);
    /* the split-K scratch before the engine sizes its KV cache from what is left (optional: where
     * it does not fit, the GEMMs run unsplit) */
    if (st == VKI_OK && d->cm.kind != VKD_CM_NONE && (d->info.compute_units || d->cm_split > 1))
        (void)split_scratch(d);
    return st;
}

vki_status op_matmul_warm_up(vkd_device *d, uint32_t type)
{
    const mm_type *t = mm_type_get(type);
    if (!t || !op_matmul_supported(d, type))
        return VKI_ERR_UNSUPPORTED;
    return warm_up(d, type, t->block > 1 ? t->block : 16);
}
