/* Command buffers, barriers, copies, debug labels and optional per-dispatch timestamps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"

/* ---- records ------------------------------------------------------------------------------------
 * Each command is a record: a head, a fixed part and (dispatches) the descriptors and push
 * constants, 8-byte aligned, written into zeroed memory so that equal commands are equal bytes. */
enum { OP_DISPATCH, OP_BARRIER, OP_COPY, OP_LABEL_BEGIN, OP_LABEL_END };

typedef struct op_head {
    uint32_t kind, bytes; /* bytes: the whole record, head included, a multiple of 8 */
} op_head;

typedef struct op_dispatch {
    op_head h;
    VkPipeline pipeline;
    VkPipelineLayout layout;
    VkBuffer indirect;
    VkDeviceSize indirect_off;
    uint32_t n_bind, push_size, g[3], pad;
    /* VkDescriptorBufferInfo[n_bind], then push_size bytes */
} op_dispatch;

typedef struct op_barrier {
    op_head h;
    uint32_t src, src_access, dst, dst_access;
} op_barrier;

typedef struct op_copy {
    op_head h;
    VkBuffer src, dst;
    VkBufferCopy region;
} op_copy;

typedef struct op_label {
    op_head h;
    char name[]; /* NUL-terminated */
} op_label;

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Zeroed room for a record of `bytes` at the end of ops; NULL when out of memory (the recording
 * is then marked failed). vkd_cmd_create leaves room for any record but a long label. */
static void *rec_reserve(vkd_cmd *c, uint32_t kind, size_t bytes)
{
    bytes = pad8(bytes);
    if (c->n_ops + bytes > c->cap_ops) {
        size_t cap = c->cap_ops * 2 > c->n_ops + bytes ? c->cap_ops * 2 : c->n_ops + bytes;
        uint8_t *p = realloc(c->ops, cap);
        if (!p) {
            c->ops_status = VKI_ERR_OUT_OF_HOST_MEMORY;
            return NULL;
        }
        c->ops = p;
        c->cap_ops = cap;
    }
    op_head *h = (op_head *)(c->ops + c->n_ops);
    memset(h, 0, bytes);
    h->kind = kind;
    h->bytes = (uint32_t)bytes;
    return h;
}

/* Hands one record to the driver. */
static void rec_exec(vkd_device *d, VkCommandBuffer cb, const op_head *h)
{
    switch (h->kind) {
    case OP_DISPATCH: {
        const op_dispatch *r = (const op_dispatch *)h;
        const VkDescriptorBufferInfo *bi = (const VkDescriptorBufferInfo *)(r + 1);
        VkWriteDescriptorSet w[16];
        for (uint32_t i = 0; i < r->n_bind; i++)
            w[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstBinding = i,
                                          .descriptorCount = 1, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                          .pBufferInfo = &bi[i]};
        vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, r->pipeline);
        if (r->n_bind)
            d->fn.push_descriptor(cb, VK_PIPELINE_BIND_POINT_COMPUTE, r->layout, 0, r->n_bind, w);
        if (r->push_size)
            vkCmdPushConstants(cb, r->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, r->push_size, bi + r->n_bind);
        if (r->indirect)
            vkCmdDispatchIndirect(cb, r->indirect, r->indirect_off);
        else
            vkCmdDispatch(cb, r->g[0], r->g[1], r->g[2]);
        break;
    }
    case OP_BARRIER: {
        const op_barrier *r = (const op_barrier *)h;
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = r->src_access,
                              .dstAccessMask = r->dst_access};
        vkCmdPipelineBarrier(cb, r->src, r->dst, 0, 1, &mb, 0, NULL, 0, NULL);
        break;
    }
    case OP_COPY: {
        const op_copy *r = (const op_copy *)h;
        vkCmdCopyBuffer(cb, r->src, r->dst, 1, &r->region);
        break;
    }
    case OP_LABEL_BEGIN:
        if (d->fn.label_begin)
            d->fn.label_begin(cb, &(VkDebugUtilsLabelEXT){.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_LABEL_EXT,
                                                          .pLabelName = ((const op_label *)h)->name});
        break;
    case OP_LABEL_END:
        if (d->fn.label_end)
            d->fn.label_end(cb);
        break;
    }
}

/* The record just reserved is complete: without streaming it goes to the driver now. */
static void rec_commit(vkd_cmd *c, op_head *h)
{
    if (c->streaming) {
        c->n_ops += h->bytes;
        return;
    }
    rec_exec(c->d, c->cb, h);
}

/* ---- reuse --------------------------------------------------------------------------------------- */

typedef struct reuse_slot {
    VkCommandBuffer cb;
    uint8_t *ops;            /* the stream it was recorded from */
    size_t n_ops;
    uint64_t last_use;
    uint64_t buffers_destroyed; /* the device's count when it was recorded */
} reuse_slot;

struct vkd_reuse {
    uint32_t n_slots;
    uint64_t clock;
    reuse_slot slot[VKD_REUSE_MAX_SLOTS];
};

static void reuse_free(vkd_device *d, vkd_reuse *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < r->n_slots; i++) {
        if (r->slot[i].cb)
            vkFreeCommandBuffers(d->dev, d->cmd_pool, 1, &r->slot[i].cb);
        free(r->slot[i].ops);
    }
    free(r);
}

vki_status vkd_cmd_enable_reuse(vkd_cmd *c, uint32_t n_slots)
{
    if (!n_slots || n_slots > VKD_REUSE_MAX_SLOTS || c->recording || c->pending || c->reuse)
        return VKI_ERR_INVALID_ARG;
    vkd_reuse *r = calloc(1, sizeof *r);
    if (!r)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    r->n_slots = n_slots;
    c->reuse = r;
    return VKI_OK;
}

/* The slot holding a command buffer recorded from the current stream, recording it into the least
 * recently used slot when none does. */
static vki_status reuse_pick(vkd_cmd *c, VkCommandBuffer *out)
{
    vkd_device *d = c->d;
    vkd_reuse *r = c->reuse;
    reuse_slot *victim = &r->slot[0];
    r->clock++;
    for (uint32_t i = 0; i < r->n_slots; i++) {
        reuse_slot *s = &r->slot[i];
        /* a stream of another shape differs in length or early on: memcmp stops there */
        if (s->cb && s->n_ops == c->n_ops && s->buffers_destroyed == d->buffers_destroyed &&
            !memcmp(s->ops, c->ops, c->n_ops)) {
            s->last_use = r->clock;
            c->reuse_hits++;
            *out = s->cb;
            return VKI_OK;
        }
        if (s->last_use < victim->last_use)
            victim = s;
    }
    c->reuse_misses++;
    reuse_slot *s = victim;
    s->n_ops = 0;
    s->last_use = 0; /* until recorded: a failure leaves it the next victim, not a match */
    if (!s->cb) {
        VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                          .commandPool = d->cmd_pool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                          .commandBufferCount = 1};
        VKD_TRY(d, vkAllocateCommandBuffers(d->dev, &ai, &s->cb));
        vkd_name(d, VK_OBJECT_TYPE_COMMAND_BUFFER, (uint64_t)(uintptr_t)s->cb, "vkinfer reused cmd %u",
                 (unsigned)(s - r->slot));
    }
    uint8_t *keep = realloc(s->ops, c->n_ops ? c->n_ops : 8);
    if (!keep)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    s->ops = keep;
    VKD_TRY(d, vkResetCommandBuffer(s->cb, 0));
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    VKD_TRY(d, vkBeginCommandBuffer(s->cb, &bi));
    for (size_t o = 0; o < c->n_ops; o += ((const op_head *)(c->ops + o))->bytes)
        rec_exec(d, s->cb, (const op_head *)(c->ops + o));
    VKD_TRY(d, vkEndCommandBuffer(s->cb));
    memcpy(s->ops, c->ops, c->n_ops);
    s->n_ops = c->n_ops;
    s->buffers_destroyed = d->buffers_destroyed;
    s->last_use = r->clock;
    *out = s->cb;
    return VKI_OK;
}

vki_status vkd_cmd_create(vkd_device *d, const char *name, vkd_cmd *c)
{
    *c = (vkd_cmd){.d = d};
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = d->cmd_pool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    VKD_TRY(d, vkAllocateCommandBuffers(d->dev, &ai, &c->cb));
    vkd_name(d, VK_OBJECT_TYPE_COMMAND_BUFFER, (uint64_t)(uintptr_t)c->cb, "%s", name ? name : "vkinfer cmd");
    /* room for the largest record but a long label: without reuse nothing grows */
    c->cap_ops = 4096;
    if (!(c->ops = malloc(c->cap_ops))) {
        vkd_cmd_destroy(c);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    vki_status st = vkd_check(d, vkCreateFence(d->dev, &(VkFenceCreateInfo){.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO},
                                               NULL, &c->fence), "vkCreateFence");
    if (st != VKI_OK)
        vkd_cmd_destroy(c);
    return st;
}

void vkd_cmd_destroy(vkd_cmd *c)
{
    if (!c->d)
        return;
    vkd_device *d = c->d;
    if (c->pending && !d->lost)
        vkWaitForFences(d->dev, 1, &c->fence, VK_TRUE, UINT64_MAX);
    if (c->queries)
        vkDestroyQueryPool(d->dev, c->queries, NULL);
    free(c->query_names);
    free(c->query_roles);
    if (c->fence)
        vkDestroyFence(d->dev, c->fence, NULL);
    if (c->cb)
        vkFreeCommandBuffers(d->dev, d->cmd_pool, 1, &c->cb);
    reuse_free(d, c->reuse);
    free(c->ops);
    *c = (vkd_cmd){0};
}

vki_status vkd_cmd_enable_profiling(vkd_cmd *c, uint32_t max_dispatches)
{
    vkd_device *d = c->d;
    if (!d->info.timestamps)
        return VKI_ERR_UNSUPPORTED;
    VkQueryPoolCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 2 * max_dispatches};
    c->query_names = calloc(max_dispatches, sizeof *c->query_names);
    c->query_roles = calloc(max_dispatches, sizeof *c->query_roles);
    if (!c->query_names || !c->query_roles)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    VKD_TRY(d, vkCreateQueryPool(d->dev, &qi, NULL, &c->queries));
    c->max_queries = 2 * max_dispatches;
    return VKI_OK;
}

vki_status vkd_cmd_begin(vkd_cmd *c)
{
    vkd_device *d = c->d;
    if (d->lost)
        return VKI_ERR_DEVICE_LOST;
    if (c->pending) {
        vki_status st = vkd_cmd_wait(c);
        if (st != VKI_OK)
            return st;
    }
    c->streaming = c->reuse && !c->queries;
    c->n_ops = 0;
    c->ops_status = VKI_OK;
    if (!c->streaming) {
        VKD_TRY(d, vkResetCommandBuffer(c->cb, 0));
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                       .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        VKD_TRY(d, vkBeginCommandBuffer(c->cb, &bi));
        if (c->queries)
            vkCmdResetQueryPool(c->cb, c->queries, 0, c->max_queries);
    }
    c->n_queries = 0;
    c->n_dispatches = c->n_barriers = c->split_slots = 0;
    c->role = NULL;
    c->label_depth = 0;
    c->label_path[0] = 0;
    c->recording = true;
    return VKI_OK;
}

vki_status vkd_cmd_submit(vkd_cmd *c)
{
    vkd_device *d = c->d;
    if (!c->recording)
        return VKI_ERR_INVALID_ARG;
    c->recording = false;
    VkCommandBuffer cb = c->cb;
    if (!c->streaming)
        VKD_TRY(d, vkEndCommandBuffer(c->cb));
    if (c->ops_status != VKI_OK)
        return c->ops_status;
    if (c->streaming) {
        vki_status st = reuse_pick(c, &cb);
        if (st != VKI_OK)
            return st;
    }
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    VKD_TRY(d, vkQueueSubmit(d->queue, 1, &si, c->fence));
    c->pending = true;
    return VKI_OK;
}

void vkd_cmd_abort(vkd_cmd *c)
{
    if (!c->recording)
        return;
    c->recording = false;
    if (!c->streaming)
        vkEndCommandBuffer(c->cb); /* the next vkd_cmd_begin resets it */
}

vki_status vkd_cmd_wait(vkd_cmd *c)
{
    vkd_device *d = c->d;
    if (!c->pending)
        return VKI_OK;
    c->pending = false;
    VkResult r = vkWaitForFences(d->dev, 1, &c->fence, VK_TRUE, UINT64_MAX);
    if (r != VK_SUCCESS && r != VK_ERROR_DEVICE_LOST) {
        /* out of memory while waiting: this wait's results are not trusted (the step fails),
         * but the fence must be settled before it is reset and used again; a second failure
         * leaves the queue in an unknown state, which only a new device fixes */
        VkResult again = vkWaitForFences(d->dev, 1, &c->fence, VK_TRUE, UINT64_MAX);
        if (again != VK_SUCCESS)
            r = again == VK_ERROR_DEVICE_LOST ? again : VK_ERROR_DEVICE_LOST;
        else
            vkResetFences(d->dev, 1, &c->fence);
    }
    vki_status st = vkd_check(d, r, "vkWaitForFences");
    if (st != VKI_OK)
        return st;
    VKD_TRY(d, vkResetFences(d->dev, 1, &c->fence));
    return VKI_OK;
}

vki_status vkd_cmd_submit_wait(vkd_cmd *c)
{
    vki_status st = vkd_cmd_submit(c);
    return st == VKI_OK ? vkd_cmd_wait(c) : st;
}

static void barrier_rec(vkd_cmd *c, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                        VkAccessFlags dst_access)
{
    op_barrier *r = rec_reserve(c, OP_BARRIER, sizeof *r);
    if (r) {
        r->src = src, r->src_access = src_access, r->dst = dst, r->dst_access = dst_access;
        rec_commit(c, &r->h);
    }
}

void vkd_barrier_ex(vkd_cmd *c, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                    VkAccessFlags dst_access)
{
    barrier_rec(c, src, src_access, dst, dst_access);
    c->n_barriers++;
    const VkAccessFlags w = VK_ACCESS_SHADER_WRITE_BIT, rw = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    if ((src & dst & VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT) && (src_access & w) && (dst_access & rw) == rw)
        c->split_slots = 0; /* the split-K scratch is free again */
}

void vkd_barrier(vkd_cmd *c)
{
    vkd_barrier_ex(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
}

void vkd_barrier_transfer_to_compute(vkd_cmd *c)
{
    vkd_barrier_ex(c, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT,
                   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_INDIRECT_COMMAND_READ_BIT);
}

void vkd_barrier_compute_to_transfer(vkd_cmd *c)
{
    vkd_barrier_ex(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                   VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
}

void vkd_barrier_compute_to_host(vkd_cmd *c)
{
    /* not a barrier between dispatches: not counted in n_barriers */
    barrier_rec(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                VK_ACCESS_HOST_READ_BIT);
}

void vkd_copy(vkd_cmd *c, const vkd_buffer *src, VkDeviceSize src_off, const vkd_buffer *dst,
              VkDeviceSize dst_off, VkDeviceSize n)
{
    op_copy *r = rec_reserve(c, OP_COPY, sizeof *r);
    if (r) {
        r->src = src->buf, r->dst = dst->buf;
        r->region = (VkBufferCopy){.srcOffset = src_off, .dstOffset = dst_off, .size = n};
        rec_commit(c, &r->h);
    }
}

void vkd_dispatch_raw(vkd_cmd *c, VkPipeline p, VkPipelineLayout layout, const VkDescriptorBufferInfo *bind,
                      uint32_t n_bind, const void *push, uint32_t push_size, const uint32_t g[3], VkBuffer indirect,
                      VkDeviceSize indirect_off)
{
    if (n_bind > 16 || push_size > VKD_MAX_PUSH) { /* the callers' tables are smaller */
        c->ops_status = VKI_ERR_INVALID_ARG;
        return;
    }
    size_t nb = n_bind * sizeof *bind;
    op_dispatch *r = rec_reserve(c, OP_DISPATCH, sizeof *r + nb + push_size);
    if (!r)
        return;
    r->pipeline = p, r->layout = layout, r->indirect = indirect, r->indirect_off = indirect_off;
    r->n_bind = n_bind, r->push_size = push_size;
    if (!indirect)
        memcpy(r->g, g, sizeof r->g);
    memcpy(r + 1, bind, nb);
    if (push_size)
        memcpy((char *)(r + 1) + nb, push, push_size);
    rec_commit(c, &r->h);
}

/* Whether labels go anywhere: the stream (debug tools) or the profile's path (timing). */
static bool labels_on(const vkd_cmd *c) { return c->d->fn.label_begin || c->queries; }

/* Opens label `name` (NUL-terminated, < 128 bytes): in the stream for debug tools, in the
 * profile's path when timing. */
static void label_push(vkd_cmd *c, const char *name)
{
    if (c->d->fn.label_begin) {
        size_t n = strlen(name) + 1;
        op_label *r = rec_reserve(c, OP_LABEL_BEGIN, sizeof *r + n);
        if (r) {
            memcpy(r->name, name, n);
            rec_commit(c, &r->h);
        }
    }
    if (c->queries && c->label_depth < VKD_LABEL_DEPTH) { /* the path profile events are named by */
        char path[VKD_LABEL_PATH];
        c->label_len[c->label_depth++] = (uint32_t)strlen(c->label_path);
        vkd_join_label(path, sizeof path, c->label_path, name);
        memcpy(c->label_path, path, sizeof path);
    }
}

void vkd_label_begin(vkd_cmd *c, const char *fmt, ...)
{
    if (!labels_on(c))
        return;
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    label_push(c, name);
}

void vkd_label_begin_join(vkd_cmd *c, const char *a, const char *b)
{
    if (!labels_on(c))
        return;
    char name[128];
    vkd_join_label(name, sizeof name, a ? a : "", b ? b : "");
    label_push(c, name);
}

void vkd_label_begin_n(vkd_cmd *c, const char *prefix, uint32_t n)
{
    if (!labels_on(c))
        return;
    char name[128], digits[10];
    size_t len = 0, nd = 0;
    for (const char *p = prefix; *p && len + 12 < sizeof name; p++)
        name[len++] = *p;
    name[len++] = ' ';
    do
        digits[nd++] = (char)('0' + n % 10);
    while (n /= 10);
    while (nd)
        name[len++] = digits[--nd];
    name[len] = 0;
    label_push(c, name);
}

void vkd_label_end(vkd_cmd *c)
{
    op_head *r = c->d->fn.label_end ? rec_reserve(c, OP_LABEL_END, sizeof *r) : NULL;
    if (r)
        rec_commit(c, r);
    if (c->queries && c->label_depth)
        c->label_path[c->label_len[--c->label_depth]] = 0;
}

void vkd_join_label(char *dst, size_t cap, const char *a, const char *b)
{
    size_t n = 0;
    for (const char *p = a; *p && n + 1 < cap; p++)
        dst[n++] = *p;
    for (const char *p = " / "; *a && *b && *p && n + 1 < cap; p++)
        dst[n++] = *p;
    for (const char *p = b; *p && n + 1 < cap; p++)
        dst[n++] = *p;
    dst[n] = 0;
}

vki_status vkd_cmd_read_profile(vkd_cmd *c, uint64_t *begin_ns, uint64_t *end_ns, uint32_t cap, uint32_t *n)
{
    *n = 0;
    if (!c->queries || !c->n_queries)
        return VKI_OK;
    uint32_t pairs = c->n_queries / 2 < cap ? c->n_queries / 2 : cap;
    uint64_t *t = malloc((size_t)pairs * 2 * sizeof *t);
    if (!t)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    VkResult r = vkGetQueryPoolResults(c->d->dev, c->queries, 0, pairs * 2, (size_t)pairs * 2 * sizeof *t, t,
                                       sizeof *t, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    vki_status st = vkd_check(c->d, r, "vkGetQueryPoolResults");
    double period = c->d->info.timestamp_period_ns;
    for (uint32_t i = 0; st == VKI_OK && i < pairs; i++) {
        begin_ns[i] = (uint64_t)(t[2 * i] * period);
        end_ns[i] = (uint64_t)(t[2 * i + 1] * period);
    }
    if (st == VKI_OK)
        *n = pairs;
    free(t);
    return st;
}
