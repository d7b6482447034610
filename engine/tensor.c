#include "engine/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant.h"

vki_status vk_tensor_create(vkd_device *d, uint32_t type, uint64_t ne0, uint64_t n_rows,
                            size_t max_part_bytes, const char *name, vk_tensor *t)
{
    return vk_tensor_create_grouped(d, type, ne0, n_rows, 1, max_part_bytes, name, t);
}

vki_status vk_tensor_create_grouped(vkd_device *d, uint32_t type, uint64_t ne0, uint64_t n_rows, uint64_t group_rows,
                                    size_t max_part_bytes, const char *name, vk_tensor *t)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name ? name : "tensor");
    t->type = type;
    t->ne0 = ne0;
    t->n_rows = n_rows;
    t->src_row_bytes = quant_get(type) ? quant_row_bytes(type, ne0) : 0;
    t->row_bytes = t->src_row_bytes ? quant_dev_row_bytes(type, ne0) : 0;
    if (!t->row_bytes || !n_rows || !group_rows || n_rows % group_rows) {
        vkd_log(d, VKI_LOG_ERROR, "tensor %s: type %s (%u) with row length %llu (%llu rows in groups of %llu) is "
                "not supported", t->name, quant_type_name(type), type, (unsigned long long)ne0,
                (unsigned long long)n_rows, (unsigned long long)group_rows);
        return VKI_ERR_UNSUPPORTED;
    }
    uint64_t limit = d->info.max_storage_buffer_range;
    if (d->info.max_memory_allocation_size && d->info.max_memory_allocation_size < limit)
        limit = d->info.max_memory_allocation_size;
    if (max_part_bytes && max_part_bytes < limit)
        limit = max_part_bytes;
    uint64_t rows_per_part = limit / t->row_bytes / group_rows * group_rows;
    if (rows_per_part == 0) {
        vkd_log(d, VKI_LOG_ERROR, "tensor %s: one group of %llu rows (%zu bytes each) exceeds a storage buffer "
                "(%llu bytes)", t->name, (unsigned long long)group_rows, t->row_bytes, (unsigned long long)limit);
        return VKI_ERR_UNSUPPORTED;
    }
    uint64_t n_parts = (n_rows + rows_per_part - 1) / rows_per_part;
    if (n_parts > VK_TENSOR_MAX_PARTS) {
        vkd_log(d, VKI_LOG_ERROR, "tensor %s: needs %llu parts (max %d)", t->name,
                (unsigned long long)n_parts, VK_TENSOR_MAX_PARTS);
        return VKI_ERR_UNSUPPORTED;
    }
    /* balance the parts so the last one is not a sliver */
    uint64_t groups = n_rows / group_rows;
    rows_per_part = (groups + n_parts - 1) / n_parts * group_rows;
    for (uint64_t row0 = 0; row0 < n_rows; row0 += rows_per_part) {
        vk_tensor_part *p = &t->parts[t->n_parts];
        p->row0 = row0;
        p->n_rows = n_rows - row0 < rows_per_part ? n_rows - row0 : rows_per_part;
        char pname[128];
        if (n_parts > 1)
            snprintf(pname, sizeof pname, "%s[%u]", t->name, t->n_parts);
        else
            snprintf(pname, sizeof pname, "%s", t->name);
        vki_status st = vkd_buffer_create(d, p->n_rows * t->row_bytes, VKD_MEM_DEVICE, pname, &p->buf);
        if (st != VKI_OK) {
            vk_tensor_destroy(d, t);
            return st;
        }
        t->n_parts++;
    }
    return VKI_OK;
}

void vk_tensor_destroy(vkd_device *d, vk_tensor *t)
{
    for (uint32_t i = 0; i < t->n_parts; i++)
        vkd_buffer_destroy(d, t->parts[i].buf);
    t->n_parts = 0;
}

vki_status vk_tensor_upload(vkd_device *d, vk_tensor *t, const void *data)
{
    return vk_tensor_upload_rows(d, t, 0, t->n_rows, data);
}

/* Rows in the GGUF layout from src, repacked into the device layout on their way (the unit of
 * vkd_upload_fill is one device row). */
typedef struct repack {
    const vk_tensor *t;
    const char *src;
} repack;

static void fill_repacked(void *ctx, uint64_t at, void *out, uint64_t n)
{
    const repack *r = ctx;
    const vk_tensor *t = r->t;
    for (uint64_t j = 0; j < n / t->row_bytes; j++)
        quant_row_to_dev(t->type, r->src + (at / t->row_bytes + j) * t->src_row_bytes,
                         (char *)out + j * t->row_bytes, t->ne0);
}

vki_status vk_tensor_upload_rows(vkd_device *d, vk_tensor *t, uint64_t row0, uint64_t n_rows, const void *data)
{
    if (row0 > t->n_rows || n_rows > t->n_rows - row0)
        return VKI_ERR_INVALID_ARG;
    bool grouped = quant_dev_grouped(t->type);
    vki_status st = VKI_OK;
    for (uint32_t i = 0; st == VKI_OK && i < t->n_parts; i++) {
        const vk_tensor_part *p = &t->parts[i];
        uint64_t a = row0 > p->row0 ? row0 : p->row0, b = row0 + n_rows < p->row0 + p->n_rows ? row0 + n_rows
                                                                                              : p->row0 + p->n_rows;
        if (a >= b)
            continue;
        const char *src = (const char *)data + (a - row0) * t->src_row_bytes;
        VkDeviceSize off = (a - p->row0) * t->row_bytes, bytes = (b - a) * t->row_bytes;
        repack r = {t, src};
        st = grouped ? vkd_upload_fill(d, p->buf, off, bytes, t->row_bytes, fill_repacked, &r)
                     : vkd_upload(d, p->buf, off, src, bytes);
    }
    return st;
}

uint64_t vk_tensor_bytes(const vk_tensor *t)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < t->n_parts; i++)
        n += t->parts[i].buf->mem_size;
    return n;
}
