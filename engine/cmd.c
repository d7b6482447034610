/* Command buffers, barriers, copies, debug labels and optional per-dispatch timestamps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"

vki_status vkd_cmd_create(vkd_device *d, const char *name, vkd_cmd *c)
{
    *c = (vkd_cmd){.d = d};
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = d->cmd_pool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    VKD_TRY(d, vkAllocateCommandBuffers(d->dev, &ai, &c->cb));
    vkd_name(d, VK_OBJECT_TYPE_COMMAND_BUFFER, (uint64_t)(uintptr_t)c->cb, "%s", name ? name : "vkinfer cmd");
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
    VKD_TRY(d, vkResetCommandBuffer(c->cb, 0));
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VKD_TRY(d, vkBeginCommandBuffer(c->cb, &bi));
    if (c->queries)
        vkCmdResetQueryPool(c->cb, c->queries, 0, c->max_queries);
    c->n_queries = 0;
    c->n_dispatches = c->n_barriers = 0;
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
    VKD_TRY(d, vkEndCommandBuffer(c->cb));
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &c->cb};
    VKD_TRY(d, vkQueueSubmit(d->queue, 1, &si, c->fence));
    c->pending = true;
    return VKI_OK;
}

void vkd_cmd_abort(vkd_cmd *c)
{
    if (!c->recording)
        return;
    c->recording = false;
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

static void memory_barrier(vkd_cmd *c, VkPipelineStageFlags src, VkAccessFlags src_access,
                           VkPipelineStageFlags dst, VkAccessFlags dst_access)
{
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = src_access,
                          .dstAccessMask = dst_access};
    vkCmdPipelineBarrier(c->cb, src, dst, 0, 1, &mb, 0, NULL, 0, NULL);
    c->n_barriers++;
}

void vkd_barrier(vkd_cmd *c)
{
    memory_barrier(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
}

void vkd_barrier_transfer_to_compute(vkd_cmd *c)
{
    memory_barrier(c, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
}

void vkd_barrier_compute_to_transfer(vkd_cmd *c)
{
    memory_barrier(c, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                   VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
}

void vkd_copy(vkd_cmd *c, const vkd_buffer *src, VkDeviceSize src_off, const vkd_buffer *dst,
              VkDeviceSize dst_off, VkDeviceSize n)
{
    VkBufferCopy r = {.srcOffset = src_off, .dstOffset = dst_off, .size = n};
    vkCmdCopyBuffer(c->cb, src->buf, dst->buf, 1, &r);
}

void vkd_label_begin(vkd_cmd *c, const char *fmt, ...)
{
    if (!c->d->fn.label_begin && !c->queries)
        return;
    char name[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (c->d->fn.label_begin) {
        VkDebugUtilsLabelEXT l = {.sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_LABEL_EXT, .pLabelName = name};
        c->d->fn.label_begin(c->cb, &l);
    }
    if (c->queries && c->label_depth < VKD_LABEL_DEPTH) { /* the path profile events are named by */
        char path[VKD_LABEL_PATH];
        c->label_len[c->label_depth++] = (uint32_t)strlen(c->label_path);
        vkd_join_label(path, sizeof path, c->label_path, name);
        memcpy(c->label_path, path, sizeof path);
    }
}

void vkd_label_end(vkd_cmd *c)
{
    if (c->d->fn.label_end)
        c->d->fn.label_end(c->cb);
    if (c->queries && c->label_depth)
        c->label_path[c->label_len[--c->label_depth]] = 0;
}

void vkd_join_label(char *dst, size_t cap, const char *a, const char *b)
{
    size_t n = 0;
    for (const char *p = a; *p && n + 1 < cap; p++)
        dst[n++] = *p;
    for (const char *p = " / "; *a && *p && n + 1 < cap; p++)
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
