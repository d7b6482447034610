/* Timing on the device and the ceilings benchmarks report against, measured in the same run
 * (a datasheet's number is not what this driver and this card reach): the copy bandwidth
 * through the copy kernel. Used by `vkinfer bench-model` and bench-kernels. */
#ifndef VKI_HOST_CLI_DEVPROBE_H
#define VKI_HOST_CLI_DEVPROBE_H

#include "engine/device.h"

/* Records one call of the operation being timed into c (recording). */
typedef vki_status (*devprobe_record_fn)(void *ctx, vkd_cmd *c);

typedef struct devprobe_opts {
    uint32_t iters;  /* calls per timed batch, a compute barrier between them (as between layers) */
    uint32_t warmup; /* calls in each untimed warm-up batch (pipelines, caches, clocks) */
    uint32_t reps;   /* timed batches; the median is kept (<= 64) */
    bool fastest;    /* keep the fastest batch instead (a loaded machine slows some batches) */
    double warm_ms;  /* warm-up batches repeat until this much time has passed: a GPU idle for a
                        while (the host preparing the next case) runs its first milliseconds at
                        idle clocks; 0: one warm-up batch */
} devprobe_opts;

typedef struct devprobe_timing {
    double sec_per_call;  /* median (or with fastest, the minimum) over the timed batches */
    double min, max;      /* the fastest and the slowest batch, per call: their spread shows noise */
    bool gpu_timer;       /* GPU timestamps (else the host clock around submit + wait) */
    uint32_t warm_batches;
} devprobe_timing;

/* Seconds per call over reps batches of (batch time / iters), from GPU timestamps around each
 * batch when the device has them (host clock around submit + wait otherwise). */
vki_status devprobe_time(vkd_cmd *c, devprobe_record_fn record, void *ctx, const devprobe_opts *o,
                         devprobe_timing *out);

typedef struct devprobe_copy {
    uint64_t bytes;      /* copied per call (read once, written once) */
    double us_per_call;
    double gbps;         /* (bytes read + bytes written) / time, 1e9 bytes/s: the convention of
                            the device copies that bandwidth ceilings are quoted with */
} devprobe_copy;

/* Copy bandwidth: a device buffer of `bytes` (0: 512 MiB on GPUs, ten times the largest L2 of
 * the GPUs we target, so the copy runs from memory; 32 MiB on CPU devices; always capped by the
 * binding and allocation limits) copied into another by op_copy. The source holds random
 * words: a memory system may compress constant data. Allocates 2 x bytes for the call. */
vki_status devprobe_copy_bandwidth(vkd_device *d, uint64_t bytes, const devprobe_opts *o, devprobe_copy *out);

#endif
