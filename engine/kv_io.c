/* The KV of whole pages between the pools and the host, for session files (engine.h,
 * "session files"). The pools' layout (engine/ops_attn.h: per layer K[page][kv_head][slot][...],
 * Q8_0 in two planes with padding) stays inside the engine: the host sees one row per token,
 * layer, K/V and head, so a file saved with one page size restores into another.
 *
 * Cost: one command buffer per chunk of pages (KV_IO_CHUNK bytes of staging at most), with one
 * vkCmdCopyBuffer of n regions per pool buffer, then a host transpose of the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

#define KV_IO_CHUNK (32u << 20) /* staging bytes per command buffer (vk_engine.kv_io_chunk: 0) */

typedef struct kv_geom {
    uint32_t L, H, ps;        /* layers, KV heads, tokens per page */
    VkDeviceSize pb;          /* bytes of one page of one pool */
    uint32_t plane[2];        /* bytes per row in each plane of a page (plane[1] 0: one plane) */
    uint32_t used[2];         /* of which data (Q8_0 scales: head_dim / 32 halves of DW words) */
    uint32_t row;             /* used[0] + used[1]: a token's row of one head in the host layout */
} kv_geom;

static kv_geom geom(const vk_engine *e)
{
    const op_attn_shape *s = &e->attn[0].s;
    kv_geom g = {.L = e->model.hp.n_layer, .H = s->n_kv_heads, .ps = s->page_size, .pb = op_kv_page_bytes(s)};
    uint32_t hd = s->head_dim;
    if (s->kv_type == VKI_GGML_Q8_0) {
        g.plane[0] = g.used[0] = hd;              /* qs: int8 */
        g.plane[1] = 4 * VKI_KV_Q8_DW(hd);        /* d: f16 scales, 2 per word */
        g.used[1] = 2 * (hd / 32);
    } else {
        g.plane[0] = g.used[0] = (s->kv_type == VKI_GGML_F16 ? 2 : 4) * hd;
    }
    g.row = g.used[0] + g.used[1];
    return g;
}

uint32_t vk_engine_kv_row_bytes(const vk_engine *e) { return geom(e).row; }

/* Staging (pages [0, n) of the chunk, each [layer][K, V] pool pages) <-> host rows of those
 * pages' tokens [token][layer][K, V][head][row]. O(bytes). */
static void transpose(const kv_geom *g, uint8_t *stage, uint8_t *host, uint32_t n, bool to_host)
{
    uint32_t R = g->H * g->ps; /* rows of a page */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < g->L; l++)
            for (uint32_t c = 0; c < 2; c++) {
                uint8_t *page = stage + ((size_t)(i * g->L + l) * 2 + c) * g->pb;
                for (uint32_t h = 0; h < g->H; h++)
                    for (uint32_t slot = 0; slot < g->ps; slot++) {
                        size_t t = (size_t)i * g->ps + slot, r = (size_t)h * g->ps + slot;
                        uint8_t *row = host + (((t * g->L + l) * 2 + c) * g->H + h) * g->row;
                        uint8_t *p0 = page + r * g->plane[0], *p1 = page + (size_t)R * g->plane[0] + r * g->plane[1];
                        if (to_host) {
                            memcpy(row, p0, g->used[0]);
                            memcpy(row + g->used[0], p1, g->used[1]);
                        } else {
                            memcpy(p0, row, g->used[0]);
                            memcpy(p1, row + g->used[0], g->used[1]);
                        }
                    }
            }
}

/* One chunk: pages[0, n) <-> stage, in one command buffer. */
static vki_status copy_chunk(vk_engine *e, vkd_cmd *c, const kv_geom *g, const uint32_t *pages, uint32_t n,
                             vkd_buffer *stage, bool read, VkBufferCopy *rg)
{
    VK_TRY(vkd_cmd_begin(c));
    vkd_label_begin(c, "session KV %s: %u pages", read ? "save" : "restore", n);
    VkPipelineStageFlags compute = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, xfer = VK_PIPELINE_STAGE_TRANSFER_BIT;
    /* earlier steps' KV writes (and, restoring, their reads) before the copies */
    vkd_barrier_ex(c, compute | xfer, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, xfer,
            VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT);
    for (uint32_t l = 0; l < g->L; l++)
        for (uint32_t kv = 0; kv < 2; kv++) {
            const vkd_buffer *pool = kv ? e->v_pool[l] : e->k_pool[l];
            for (uint32_t i = 0; i < n; i++) {
                VkDeviceSize s_off = ((VkDeviceSize)(i * g->L + l) * 2 + kv) * g->pb, p_off = pages[i] * g->pb;
                rg[i] = (VkBufferCopy){.srcOffset = read ? p_off : s_off, .dstOffset = read ? s_off : p_off,
                                       .size = g->pb};
            }
            vkCmdCopyBuffer(c->cb, read ? pool->buf : stage->buf, read ? stage->buf : pool->buf, n, rg);
        }
    vkd_barrier_ex(c, xfer, VK_ACCESS_TRANSFER_WRITE_BIT, compute | VK_PIPELINE_STAGE_HOST_BIT,
            VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_HOST_READ_BIT);
    vkd_label_end(c);
    return vkd_cmd_submit_wait(c);
}

static vki_status kv_io(vk_engine *e, const uint32_t *pages, uint32_t n, uint8_t *host, bool read)
{
    for (uint32_t i = 0; i < n; i++)
        if (pages[i] >= e->n_pages)
            return VKI_ERR_INVALID_ARG;
    if (!n)
        return VKI_OK;
    kv_geom g = geom(e);
    VkDeviceSize per_page = 2 * (VkDeviceSize)g.L * g.pb, cap = e->kv_io_chunk ? e->kv_io_chunk : KV_IO_CHUNK;
    uint32_t chunk = per_page >= cap ? 1 : cap / per_page > n ? n : (uint32_t)(cap / per_page);
    size_t host_page = (size_t)g.ps * g.L * 2 * g.H * g.row; /* a page's tokens in the host layout */
    vkd_cmd c = {0};
    vkd_buffer *stage = NULL;
    VkBufferCopy *rg = malloc((size_t)chunk * sizeof *rg);
    vki_status st = rg ? vk_engine_drain(e) : VKI_ERR_OUT_OF_HOST_MEMORY; /* steps still in flight */
    if (st == VKI_OK)
        st = vkd_cmd_create(e->dev, "vkinfer session KV", &c);
    if (st == VKI_OK)
        st = vkd_buffer_create(e->dev, chunk * per_page, VKD_MEM_HOST, "vkinfer session KV staging", &stage);
    for (uint32_t done = 0; st == VKI_OK && done < n; done += chunk) {
        uint32_t m = n - done < chunk ? n - done : chunk;
        uint8_t *h = host + (size_t)done * host_page;
        if (!read) {
            memset(stage->mapped, 0, m * per_page); /* the pools' padding: zeros, not stale bytes */
            transpose(&g, stage->mapped, h, m, false);
        }
        st = copy_chunk(e, &c, &g, pages + done, m, stage, read, rg);
        if (st == VKI_OK && read)
            transpose(&g, stage->mapped, h, m, true);
    }
    vkd_buffer_destroy(e->dev, stage);
    vkd_cmd_destroy(&c);
    free(rg);
    return st;
}

vki_status vk_engine_kv_read(vk_engine *e, const uint32_t *pages, uint32_t n, void *dst)
{
    return kv_io(e, pages, n, dst, true);
}

vki_status vk_engine_kv_write(vk_engine *e, const uint32_t *pages, uint32_t n, const void *src)
{
    return kv_io(e, pages, n, (uint8_t *)(uintptr_t)src, false);
}
