/* Memory: a sub-allocator over a few large VkDeviceMemory blocks, buffers bound inside them,
 * and a host-visible staging ring for synchronous uploads/readbacks.
 *
 * Each block keeps a sorted array of free ranges; allocation is first-fit with alignment,
 * freeing coalesces neighbours. Cost: O(free ranges in the blocks of that memory type) per
 * allocation; weights and scratch are allocated once, so this is never on the tick path.
 * A block that becomes empty is returned to the driver. */
#include <stdlib.h>
#include <string.h>

#include "engine/memory_internal.h"
#include "engine/pool.h"

#define DEVICE_BLOCK_BYTES ((VkDeviceSize)256 << 20)

typedef struct range {
    VkDeviceSize off, size;
} range;

struct vkd_block {
    vkd_block *next;
    VkDeviceMemory mem;
    VkDeviceSize size;
    uint32_t type_index;
    void *mapped;        /* host-visible blocks are mapped once, whole */
    range *free;         /* sorted by off, non-adjacent */
    uint32_t n_free, cap_free;
    uint32_t n_live;     /* buffers inside */
};

static VkDeviceSize align_up(VkDeviceSize x, VkDeviceSize a) { return (x + a - 1) / a * a; }

static int find_type(const vkd_device *d, uint32_t bits, VkMemoryPropertyFlags want)
{
    const VkPhysicalDeviceMemoryProperties *m = &d->mem_props;
    for (uint32_t i = 0; i < m->memoryTypeCount; i++)
        if ((bits & (1u << i)) && (m->memoryTypes[i].propertyFlags & want) == want)
            return (int)i;
    return -1;
}

static uint32_t pick_type(const vkd_device *d, uint32_t bits, vkd_mem kind)
{
    int t;
    if (kind == VKD_MEM_HOST) {
        /* cached first: readbacks of sampled tokens are read by the CPU */
        t = find_type(d, bits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                   VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
        if (t < 0)
            t = find_type(d, bits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    } else {
        t = find_type(d, bits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
        if (t < 0)
            t = find_type(d, bits, 0);
    }
    return t < 0 ? UINT32_MAX : (uint32_t)t;
}

static bool range_take(vkd_block *b, VkDeviceSize size, VkDeviceSize align, VkDeviceSize *off)
{
    for (uint32_t i = 0; i < b->n_free; i++) {
        range *r = &b->free[i];
        VkDeviceSize start = align_up(r->off, align);
        if (start + size > r->off + r->size)
            continue;
        VkDeviceSize head = start - r->off, tail = r->off + r->size - (start + size);
        if (head && tail) { /* split into two ranges */
            if (b->n_free == b->cap_free) {
                uint32_t cap = b->cap_free ? 2 * b->cap_free : 8;
                range *nr = realloc(b->free, cap * sizeof *nr);
                if (!nr)
                    return false;
                b->free = nr;
                b->cap_free = cap;
                r = &b->free[i];
            }
            memmove(&b->free[i + 2], &b->free[i + 1], (b->n_free - i - 1) * sizeof *r);
            b->free[i + 1] = (range){start + size, tail};
            r->size = head;
            b->n_free++;
        } else if (head) {
            r->size = head;
        } else if (tail) {
            r->off = start + size;
            r->size = tail;
        } else {
            memmove(r, r + 1, (b->n_free - i - 1) * sizeof *r);
            b->n_free--;
        }
        *off = start;
        return true;
    }
    return false;
}

/* Returns [off, off+size) to the free list, merging with neighbours. Never fails: the array
 * only grows when neither neighbour merges, and it was sized for that at allocation. */
static void range_give(vkd_block *b, VkDeviceSize off, VkDeviceSize size)
{
    uint32_t i = 0;
    while (i < b->n_free && b->free[i].off < off)
        i++;
    bool merge_prev = i > 0 && b->free[i - 1].off + b->free[i - 1].size == off;
    bool merge_next = i < b->n_free && off + size == b->free[i].off;
    if (merge_prev && merge_next) {
        b->free[i - 1].size += size + b->free[i].size;
        memmove(&b->free[i], &b->free[i + 1], (b->n_free - i - 1) * sizeof(range));
        b->n_free--;
    } else if (merge_prev) {
        b->free[i - 1].size += size;
    } else if (merge_next) {
        b->free[i].off = off;
        b->free[i].size += size;
    } else {
        memmove(&b->free[i + 1], &b->free[i], (b->n_free - i) * sizeof(range));
        b->free[i] = (range){off, size};
        b->n_free++;
    }
}

static vki_status block_create(vkd_device *d, uint32_t type, VkDeviceSize size, vkd_block **out)
{
    vkd_block *b = calloc(1, sizeof *b);
    if (!b)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    b->cap_free = 8;
    b->free = malloc(b->cap_free * sizeof *b->free);
    if (!b->free) {
        free(b);
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    }
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = size,
                               .memoryTypeIndex = type};
    VkResult r = vkAllocateMemory(d->dev, &ai, NULL, &b->mem);
    if (r == VK_SUCCESS && (d->mem_props.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)) {
        r = vkMapMemory(d->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->mapped);
        if (r != VK_SUCCESS)
            vkFreeMemory(d->dev, b->mem, NULL);
    }
    if (r != VK_SUCCESS) {
        free(b->free);
        free(b);
        /* OOM here is expected and handled by the caller (retry smaller / report), so no log */
        return r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? VKI_ERR_OUT_OF_DEVICE_MEMORY
             : r == VK_ERROR_OUT_OF_HOST_MEMORY   ? VKI_ERR_OUT_OF_HOST_MEMORY
                                                  : vkd_check(d, r, "vkAllocateMemory");
    }
    vkd_name(d, VK_OBJECT_TYPE_DEVICE_MEMORY, (uint64_t)b->mem, "vkinfer block %llu MiB type %u",
             (unsigned long long)(size >> 20), type);
    b->size = size;
    b->type_index = type;
    d->heap_block_bytes[d->mem_props.memoryTypes[type].heapIndex] += size;
    b->free[0] = (range){0, size};
    b->n_free = 1;
    b->next = d->blocks;
    d->blocks = b;
    *out = b;
    return VKI_OK;
}

static void block_release(vkd_device *d, vkd_block *b)
{
    for (vkd_block **p = &d->blocks; *p; p = &(*p)->next)
        if (*p == b) {
            *p = b->next;
            break;
        }
    if (b->mapped)
        vkUnmapMemory(d->dev, b->mem);
    vkFreeMemory(d->dev, b->mem, NULL);
    d->heap_block_bytes[d->mem_props.memoryTypes[b->type_index].heapIndex] -= b->size;
    free(b->free);
    free(b);
}

/* Reserve `size` bytes aligned to `align` of memory type `type`, creating a block if needed. */
static vki_status sub_alloc(vkd_device *d, uint32_t type, VkDeviceSize size, VkDeviceSize align,
                            vkd_block **blk, VkDeviceSize *off)
{
    for (vkd_block *b = d->blocks; b; b = b->next) {
        if (b->type_index != type)
            continue;
        /* keep room for one extra free range so range_give never needs to allocate */
        if (b->n_free + 1 >= b->cap_free) {
            range *nr = realloc(b->free, 2 * b->cap_free * sizeof *nr);
            if (!nr)
                return VKI_ERR_OUT_OF_HOST_MEMORY;
            b->free = nr;
            b->cap_free *= 2;
        }
        if (range_take(b, size, align, off)) {
            *blk = b;
            return VKI_OK;
        }
    }
    VkDeviceSize max_alloc = d->info.max_memory_allocation_size ? d->info.max_memory_allocation_size
                                                                : ((VkDeviceSize)1 << 30);
    if (size > max_alloc) {
        vkd_log(d, VKI_LOG_ERROR, "allocation of %llu bytes exceeds maxMemoryAllocationSize (%llu)",
                (unsigned long long)size, (unsigned long long)max_alloc);
        return VKI_ERR_OUT_OF_DEVICE_MEMORY;
    }
    VkDeviceSize want = size > d->block_size ? size : d->block_size;
    if (want > max_alloc)
        want = max_alloc;
    if (d->mem_limit) { /* blocks no larger than what the limit leaves: the limit bounds memory held */
        VkDeviceSize held = 0;
        for (uint32_t h = 0; h < VK_MAX_MEMORY_HEAPS; h++)
            held += d->heap_block_bytes[h];
        VkDeviceSize room = d->mem_limit > held ? d->mem_limit - held : 0;
        want = want > room ? (room > size ? room : size) : want;
    }
    vkd_block *b = NULL;
    vki_status st = block_create(d, type, want, &b);
    if (st == VKI_ERR_OUT_OF_DEVICE_MEMORY && want > size)
        st = block_create(d, type, size, &b); /* no room for a whole block: exact fit */
    if (st != VKI_OK) {
        vkd_log(d, VKI_LOG_ERROR, "out of %s memory allocating %llu bytes (%s)",
                d->mem_props.memoryTypes[type].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT ? "device" : "host-visible",
                (unsigned long long)size, vki_status_str(st));
        return st;
    }
    range_take(b, size, align, off);
    *blk = b;
    return VKI_OK;
}

vki_status vkd_buffer_create(vkd_device *d, VkDeviceSize size, vkd_mem kind, const char *name,
                             vkd_buffer **out)
{
    *out = NULL;
    if (size == 0)
        return VKI_ERR_INVALID_ARG;
    if (d->lost)
        return VKI_ERR_DEVICE_LOST;
    vkd_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    b->size = size;
    b->kind = kind;
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = size,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    vki_status st = vkd_check(d, vkCreateBuffer(d->dev, &bi, NULL, &b->buf), "vkCreateBuffer");
    if (st != VKI_OK) {
        free(b);
        return st;
    }
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d->dev, b->buf, &req);
    uint32_t type = pick_type(d, req.memoryTypeBits, kind);
    VkDeviceSize live = d->bytes_allocated[VKD_MEM_DEVICE] + d->bytes_allocated[VKD_MEM_HOST];
    if (d->mem_limit && req.size > d->mem_limit - (live < d->mem_limit ? live : d->mem_limit)) {
        vkd_log(d, VKI_LOG_ERROR, "%s: %llu bytes would pass the device memory limit of %llu bytes (%llu in use)",
                name ? name : "buffer", (unsigned long long)req.size, (unsigned long long)d->mem_limit,
                (unsigned long long)live);
        st = VKI_ERR_OUT_OF_DEVICE_MEMORY;
    } else {
        st = type == UINT32_MAX ? VKI_ERR_UNSUPPORTED
                                : sub_alloc(d, type, req.size, req.alignment, &b->block, &b->mem_off);
    }
    if (st == VKI_OK)
        st = vkd_check(d, vkBindBufferMemory(d->dev, b->buf, b->block->mem, b->mem_off), "vkBindBufferMemory");
    if (st != VKI_OK) {
        if (b->block)
            range_give(b->block, b->mem_off, req.size);
        vkDestroyBuffer(d->dev, b->buf, NULL);
        free(b);
        return st;
    }
    b->mem_size = req.size;
    b->block->n_live++;
    if (b->block->mapped)
        b->mapped = (char *)b->block->mapped + b->mem_off;
    if (kind != VKD_MEM_HOST)
        b->mapped = NULL; /* device buffers are not for the host even where memory is unified */
    d->bytes_allocated[kind] += req.size;
    d->heap_buffer_bytes[d->mem_props.memoryTypes[type].heapIndex] += req.size;
    vkd_name(d, VK_OBJECT_TYPE_BUFFER, (uint64_t)b->buf, "%s", name ? name : "vkinfer buffer");
    *out = b;
    return VKI_OK;
}

void vkd_buffer_destroy(vkd_device *d, vkd_buffer *b)
{
    if (!b)
        return;
    if (b != d->staging) /* a copy in flight may write it (or read the staging ring) */
        (void)vkd_staging_flush(d);
    d->buffers_destroyed++;
    vkDestroyBuffer(d->dev, b->buf, NULL);
    range_give(b->block, b->mem_off, b->mem_size);
    d->bytes_allocated[b->kind] -= b->mem_size;
    d->heap_buffer_bytes[d->mem_props.memoryTypes[b->block->type_index].heapIndex] -= b->mem_size;
    if (--b->block->n_live == 0)
        block_release(d, b->block);
    free(b);
}

VkDeviceSize vkd_memory_available(vkd_device *d)
{
    int t = find_type(d, ~0u, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    uint32_t h = d->mem_props.memoryTypes[t < 0 ? 0 : t].heapIndex;
    VkDeviceSize avail;
    if (d->info.memory_budget) {
        vki_device_info now = d->info;
        vkd_read_heaps(d->fn.memory_properties2, d->phys, &now);
        /* in use: the driver's usage less what our blocks hold but have not handed out */
        VkDeviceSize idle = d->heap_block_bytes[h] - d->heap_buffer_bytes[h];
        VkDeviceSize used = now.heap_usage[h] > idle ? now.heap_usage[h] - idle : 0;
        avail = now.heap_budget[h] > used ? now.heap_budget[h] - used : 0;
    } else {
        VkDeviceSize size = d->mem_props.memoryHeaps[h].size;
        avail = size > d->heap_buffer_bytes[h] ? size - d->heap_buffer_bytes[h] : 0;
    }
    if (d->mem_limit) {
        VkDeviceSize live = d->bytes_allocated[VKD_MEM_DEVICE] + d->bytes_allocated[VKD_MEM_HOST];
        VkDeviceSize room = d->mem_limit > live ? d->mem_limit - live : 0;
        avail = avail < room ? avail : room;
    }
    return avail;
}

/* ---- staging ring --------------------------------------------------------------------------- */

vki_status vkd_memory_init(vkd_device *d, VkDeviceSize staging_bytes)
{
    vkGetPhysicalDeviceMemoryProperties(d->phys, &d->mem_props);
    d->block_size = DEVICE_BLOCK_BYTES;
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = d->cmd_pool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = VKD_STAGING_SLOTS};
    VKD_TRY(d, vkAllocateCommandBuffers(d->dev, &ai, d->staging_cmd));
    for (uint32_t i = 0; i < VKD_STAGING_SLOTS; i++) {
        VKD_TRY(d, vkCreateFence(d->dev, &(VkFenceCreateInfo){.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO},
                                 NULL, &d->staging_fence[i]));
        vkd_name(d, VK_OBJECT_TYPE_COMMAND_BUFFER, (uint64_t)(uintptr_t)d->staging_cmd[i], "vkinfer staging %u", i);
    }
    return vkd_buffer_create(d, staging_bytes, VKD_MEM_HOST, "vkinfer staging ring", &d->staging);
}

void vkd_memory_shutdown(vkd_device *d)
{
    (void)vkd_staging_flush(d);
    vkd_staging_stream(d, false);
    vkd_buffer_destroy(d, d->staging);
    d->staging = NULL;
    for (uint32_t i = 0; i < VKD_STAGING_SLOTS; i++)
        if (d->staging_fence[i])
            vkDestroyFence(d->dev, d->staging_fence[i], NULL);
    while (d->blocks) /* leaked buffers: release their blocks anyway */
        block_release(d, d->blocks);
}

typedef enum { XFER_UP, XFER_DOWN, XFER_FILL } xfer_dir;

static VkDeviceSize slot_bytes(const vkd_device *d) { return d->staging->size / VKD_STAGING_SLOTS / 4 * 4; }

static char *slot_mem(const vkd_device *d, uint32_t i) { return (char *)d->staging->mapped + i * slot_bytes(d); }

/* Waits for slot i's transfer if one is in flight. */
static vki_status slot_wait(vkd_device *d, uint32_t i)
{
    if (!d->staging_busy[i])
        return VKI_OK;
    d->staging_busy[i] = false;
    VKD_TRY(d, vkWaitForFences(d->dev, 1, &d->staging_fence[i], VK_TRUE, UINT64_MAX));
    VKD_TRY(d, vkResetFences(d->dev, 1, &d->staging_fence[i]));
    return VKI_OK;
}

vki_status vkd_staging_flush(vkd_device *d)
{
    vki_status st = VKI_OK;
    for (uint32_t i = 0; i < VKD_STAGING_SLOTS; i++) {
        vki_status si = slot_wait(d, i);
        st = st == VKI_OK ? si : st;
    }
    return st;
}

void vkd_staging_stream(vkd_device *d, bool on)
{
    d->staging_stream = on;
    if (on && !d->load_pool)
        d->load_pool = vk_pool_create(d->load_threads); /* NULL: the fills run on the caller */
    if (!on) {
        vk_pool_destroy(d->load_pool);
        d->load_pool = NULL;
    }
}

/* Records one transfer through slot i (whose previous one was waited for) and submits it. */
static vki_status slot_submit(vkd_device *d, uint32_t i, xfer_dir dir, VkBuffer buf, VkDeviceSize off,
                              VkDeviceSize n, uint32_t word)
{
    if (d->lost)
        return VKI_ERR_DEVICE_LOST;
    VkCommandBuffer cb = d->staging_cmd[i];
    VKD_TRY(d, vkResetCommandBuffer(cb, 0));
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VKD_TRY(d, vkBeginCommandBuffer(cb, &bi));
    /* earlier compute work (another queue submission) must be visible to the transfer and
     * the transfer's writes visible to later compute: barriers on both sides */
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
    if (dir == XFER_FILL) {
        vkCmdFillBuffer(cb, buf, off, n, word);
    } else {
        VkDeviceSize at = i * slot_bytes(d);
        VkBufferCopy c = {.srcOffset = dir == XFER_UP ? at : off, .dstOffset = dir == XFER_UP ? off : at, .size = n};
        vkCmdCopyBuffer(cb, dir == XFER_UP ? d->staging->buf : buf, dir == XFER_UP ? buf : d->staging->buf, 1, &c);
    }
    VkMemoryBarrier after = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                             .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                             .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                              VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &after, 0,
                         NULL, 0, NULL);
    VKD_TRY(d, vkEndCommandBuffer(cb));
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    VKD_TRY(d, vkQueueSubmit(d->queue, 1, &si, d->staging_fence[i]));
    d->staging_busy[i] = true;
    return VKI_OK;
}

/* A transfer through slot 0 that the caller waits for (readbacks, fills), after any in flight. */
static vki_status staging_run(vkd_device *d, xfer_dir dir, VkBuffer buf, VkDeviceSize off, VkDeviceSize n,
                              uint32_t word)
{
    vki_status st = vkd_staging_flush(d);
    if (st == VKI_OK)
        st = slot_submit(d, 0, dir, buf, off, n, word);
    return st == VKI_OK ? slot_wait(d, 0) : st;
}

static bool in_bounds(const vkd_buffer *b, VkDeviceSize off, VkDeviceSize n)
{
    return off <= b->size && n <= b->size - off;
}

/* One fill split into parts of whole units for the load pool's threads. */
typedef struct fill_job {
    vkd_fill_fn fill;
    void *ctx;
    uint64_t at, units, unit; /* the upload's bytes [at, at + units * unit) ... */
    char *out;                /* ... go here */
    uint32_t parts;
} fill_job;

static void fill_part(void *ctx, uint32_t i)
{
    const fill_job *j = ctx;
    uint64_t u0 = j->units * i / j->parts, u1 = j->units * (i + 1) / j->parts;
    if (u1 > u0)
        j->fill(j->ctx, j->at + u0 * j->unit, j->out + u0 * j->unit, (u1 - u0) * j->unit);
}

/* Parts below this many bytes are not worth a thread's wake-up (a few microseconds). */
#define FILL_PART_MIN (256u << 10)

/* fill(ctx, at, out, n), split over the load pool's threads while streaming. */
static void fill_chunk(vkd_device *d, vkd_fill_fn fill, void *ctx, uint64_t at, char *out, uint64_t n,
                       uint64_t unit)
{
    fill_job j = {.fill = fill, .ctx = ctx, .at = at, .units = n / unit, .unit = unit, .out = out};
    uint64_t parts = n / FILL_PART_MIN, threads = vk_pool_threads(d->load_pool);
    parts = parts > threads ? threads : parts;
    j.parts = (uint32_t)(parts > j.units ? j.units : parts ? parts : 1);
    vk_pool_run(d->load_pool, j.parts, fill_part, &j);
}

vki_status vkd_upload_fill(vkd_device *d, vkd_buffer *dst, VkDeviceSize off, uint64_t n_bytes, uint64_t unit,
                           vkd_fill_fn fill, void *ctx)
{
    if (!in_bounds(dst, off, n_bytes) || !unit || n_bytes % unit || unit > slot_bytes(d))
        return VKI_ERR_INVALID_ARG;
    if (dst->mapped) {
        fill_chunk(d, fill, ctx, 0, (char *)dst->mapped + off, n_bytes, unit);
        return VKI_OK;
    }
    /* chunks alternate between the slots: this chunk's fill overlaps the copy of the last */
    VkDeviceSize chunk = slot_bytes(d) / unit * unit;
    vki_status st = VKI_OK;
    for (uint64_t done = 0; st == VKI_OK && done < n_bytes; done += chunk) {
        VkDeviceSize m = n_bytes - done < chunk ? n_bytes - done : chunk;
        uint32_t i = d->staging_next;
        d->staging_next = (i + 1) % VKD_STAGING_SLOTS;
        if ((st = slot_wait(d, i)) != VKI_OK)
            break;
        fill_chunk(d, fill, ctx, done, slot_mem(d, i), m, unit);
        st = slot_submit(d, i, XFER_UP, dst->buf, off + done, m, 0);
    }
    if (st == VKI_OK && !d->staging_stream)
        st = vkd_staging_flush(d);
    return st;
}

static void fill_copy(void *ctx, uint64_t at, void *out, uint64_t n) { memcpy(out, (const char *)ctx + at, n); }

vki_status vkd_upload(vkd_device *d, vkd_buffer *dst, VkDeviceSize off, const void *src, size_t n)
{
    return vkd_upload_fill(d, dst, off, n, 1, fill_copy, (void *)src);
}

vki_status vkd_download(vkd_device *d, const vkd_buffer *src, VkDeviceSize off, void *dst, size_t n)
{
    if (!in_bounds(src, off, n))
        return VKI_ERR_INVALID_ARG;
    if (src->mapped) {
        memcpy(dst, (const char *)src->mapped + off, n);
        return VKI_OK;
    }
    VkDeviceSize chunk = slot_bytes(d);
    for (size_t done = 0; done < n; done += chunk) {
        VkDeviceSize m = n - done < chunk ? n - done : chunk;
        vki_status st = staging_run(d, XFER_DOWN, src->buf, off + done, m, 0);
        if (st != VKI_OK)
            return st;
        memcpy((char *)dst + done, slot_mem(d, 0), m);
    }
    return VKI_OK;
}

vki_status vkd_fill(vkd_device *d, vkd_buffer *dst, VkDeviceSize off, VkDeviceSize n, uint32_t word)
{
    if (!in_bounds(dst, off, n) || (n & 3) || (off & 3))
        return VKI_ERR_INVALID_ARG;
    if (!n)
        return VKI_OK;
    return staging_run(d, XFER_FILL, dst->buf, off, n, word);
}
