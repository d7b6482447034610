/* Device timing and the copy-bandwidth probe (devprobe.h). */
#include "host/cli/devprobe.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/ops_basic.h"
#include "engine/rng.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One batch of n calls with barriers between them; with a query pool, timestamps around it. */
static vki_status batch(vkd_cmd *c, devprobe_record_fn record, void *ctx, uint32_t n, VkQueryPool qp)
{
    vki_status st = vkd_cmd_begin(c);
    if (st != VKI_OK)
        return st;
    if (qp) {
        vkCmdResetQueryPool(c->cb, qp, 0, 2);
        vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, qp, 0);
    }
    for (uint32_t i = 0; i < n && st == VKI_OK; i++) {
        if (i)
            vkd_barrier(c);
        st = record(ctx, c);
    }
    if (qp)
        vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, qp, 1);
    if (st != VKI_OK) {
        vkd_cmd_abort(c);
        return st;
    }
    return vkd_cmd_submit_wait(c);
}

vki_status devprobe_time(vkd_cmd *c, devprobe_record_fn record, void *ctx, const devprobe_opts *o,
                         devprobe_timing *out)
{
    vkd_device *d = c->d;
    VkQueryPool qp = VK_NULL_HANDLE;
    if (!o->iters || !o->reps || o->reps > 64)
        return VKI_ERR_INVALID_ARG;
    if (d->info.timestamps) {
        VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                    .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 2};
        if (vkCreateQueryPool(d->dev, &qi, NULL, &qp) != VK_SUCCESS)
            qp = VK_NULL_HANDLE;
    }
    double t[64], w0 = now_s();
    uint32_t n_warm = 0;
    vki_status st = VKI_OK;
    while (o->warmup && st == VKI_OK && (!n_warm || (now_s() - w0) * 1e3 < o->warm_ms)) {
        st = batch(c, record, ctx, o->warmup, VK_NULL_HANDLE);
        n_warm++;
    }
    for (uint32_t i = 0; i < o->reps && st == VKI_OK; i++) {
        double t0 = now_s();
        st = batch(c, record, ctx, o->iters, qp);
        t[i] = (now_s() - t0) / o->iters;
        uint64_t ts[2];
        if (st == VKI_OK && qp &&
            vkGetQueryPoolResults(d->dev, qp, 0, 2, sizeof ts, ts, sizeof ts[0],
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS)
            t[i] = (double)(ts[1] - ts[0]) * d->info.timestamp_period_ns * 1e-9 / o->iters;
    }
    if (qp)
        vkDestroyQueryPool(d->dev, qp, NULL);
    for (uint32_t i = 1; st == VKI_OK && i < o->reps; i++) /* insertion sort: a handful of values */
        for (uint32_t j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    if (st == VKI_OK)
        *out = (devprobe_timing){.sec_per_call = t[o->fastest ? 0 : o->reps / 2], .min = t[0],
                                 .max = t[o->reps - 1], .gpu_timer = qp != VK_NULL_HANDLE,
                                 .warm_batches = n_warm};
    return st;
}

typedef struct copy_ctx {
    vkd_buffer *src, *dst;
    uint64_t bytes;
} copy_ctx;

static vki_status record_copy(void *ctx, vkd_cmd *c)
{
    copy_ctx *k = ctx;
    return op_copy(c, vkd_whole(k->src), vkd_whole(k->dst), k->bytes);
}

/* Random words in the whole buffer: one random chunk uploaded at every offset. */
static vki_status fill_random(vkd_device *d, vkd_buffer *b, uint64_t bytes)
{
    size_t chunk = bytes < (16u << 20) ? (size_t)bytes : (16u << 20);
    uint64_t *h = malloc(chunk), s = 0x5eedc0deull;
    if (!h)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; i < chunk / 8; i++)
        h[i] = vki_splitmix64(&s);
    vki_status st = VKI_OK;
    for (uint64_t off = 0; off < bytes && st == VKI_OK; off += chunk)
        st = vkd_upload(d, b, off, h, bytes - off < chunk ? (size_t)(bytes - off) : chunk);
    free(h);
    return st;
}

vki_status devprobe_copy_bandwidth(vkd_device *d, uint64_t bytes, const devprobe_opts *o, devprobe_copy *out)
{
    memset(out, 0, sizeof *out);
    if (!bytes)
        bytes = d->info.type == VKI_DEVICE_CPU ? (32ull << 20) : (512ull << 20);
    uint64_t lim = d->info.max_storage_buffer_range;
    if (d->info.max_memory_allocation_size && d->info.max_memory_allocation_size < lim)
        lim = d->info.max_memory_allocation_size;
    bytes = (bytes < lim ? bytes : lim) & ~(uint64_t)15;
    if (bytes < 16)
        return VKI_ERR_INVALID_ARG;
    copy_ctx k = {.bytes = bytes};
    vkd_cmd c = {0};
    vki_status st = vkd_buffer_create(d, bytes, VKD_MEM_DEVICE, "probe copy src", &k.src);
    if (st == VKI_OK)
        st = vkd_buffer_create(d, bytes, VKD_MEM_DEVICE, "probe copy dst", &k.dst);
    if (st == VKI_OK)
        st = fill_random(d, k.src, bytes);
    if (st == VKI_OK)
        st = vkd_cmd_create(d, "probe copy", &c);
    devprobe_timing tm = {0};
    if (st == VKI_OK)
        st = devprobe_time(&c, record_copy, &k, o, &tm);
    const double sec = tm.sec_per_call;
    if (st == VKI_OK && sec > 0)
        *out = (devprobe_copy){.bytes = bytes, .us_per_call = sec * 1e6, .gbps = 2.0 * (double)bytes / sec * 1e-9};
    vkd_cmd_destroy(&c);
    vkd_buffer_destroy(d, k.src);
    vkd_buffer_destroy(d, k.dst);
    return st;
}
