/* Mixture-of-experts routing: argument checks, workgroup sizes, dispatch (see ops_moe.h). */
#include "engine/ops_moe.h"

#include "engine/kernels.h"

#define TOPK_WG 64u     /* one token per invocation */
#define GROUP_WG 256u   /* the single grouping workgroup */
#define COMBINE_WG 256u
#define MAX_GROUPS 65535u

static uint32_t wg_limit(const vkd_device *d, uint32_t wg)
{
    return wg <= d->info.max_workgroup_invocations ? wg : d->info.max_workgroup_invocations;
}

static VkDeviceSize range_of(vkd_view v)
{
    if (!v.buf || v.offset > v.buf->size)
        return 0;
    return v.range == VK_WHOLE_SIZE ? v.buf->size - v.offset : v.range;
}

/* The view holds n 32-bit words (n computed in 64 bits). */
static bool holds(vkd_view v, uint64_t n)
{
    return n < (1ull << 32) && n * 4 <= range_of(v);
}

static vki_status bad(vkd_cmd *c, const char *op, const char *what)
{
    vkd_log(c->d, VKI_LOG_ERROR, "%s: %s", op, what);
    return VKI_ERR_INVALID_ARG;
}

vki_status op_moe_topk(vkd_cmd *c, vkd_view logits, uint32_t n_tokens, uint32_t n_expert, uint32_t n_used, bool norm,
                       vkd_view ids, vkd_view weights)
{
    if (!n_tokens)
        return VKI_OK;
    if (!n_expert || n_expert > VKI_MOE_MAX_EXPERTS || !n_used || n_used > n_expert || n_used > VKI_MOE_MAX_USED)
        return bad(c, "moe_topk", "need 1 <= n_used <= n_expert <= VKI_MOE_MAX_EXPERTS, n_used <= VKI_MOE_MAX_USED");
    if (!holds(logits, (uint64_t)n_tokens * n_expert) || !holds(ids, (uint64_t)n_tokens * n_used) ||
        !holds(weights, (uint64_t)n_tokens * n_used))
        return bad(c, "moe_topk", "a view is smaller than its [n_tokens][n_expert | n_used]");
    uint32_t wg = wg_limit(c->d, TOPK_WG);
    vki_pc_moe pc = {.n_tokens = n_tokens, .n_expert = n_expert, .n_used = n_used, .norm = norm};
    vkd_view bind[3] = {logits, ids, weights};
    uint32_t groups = vkk_groups(n_tokens, wg);
    if (groups > c->d->info.max_workgroup_count[0])
        return bad(c, "moe_topk", "too many tokens for one dispatch");
    return vkk_dispatch(c, VKK_MOE_TOPK, &wg, bind, 3, &pc, sizeof pc, groups, 1, 1);
}

vki_status op_moe_group(vkd_cmd *c, vkd_view ids, uint32_t n_pairs, uint32_t n_expert, vkd_view route)
{
    if (!n_pairs)
        return VKI_OK;
    if (!n_expert || n_expert > VKI_MOE_MAX_EXPERTS)
        return bad(c, "moe_group", "n_expert must be in 1..VKI_MOE_MAX_EXPERTS");
    if (!holds(ids, n_pairs) || !holds(route, (uint64_t)n_expert + 1 + n_pairs))
        return bad(c, "moe_group", "ids holds fewer than n_pairs or route fewer than n_expert + 1 + n_pairs words");
    uint32_t wg = wg_limit(c->d, GROUP_WG);
    vki_pc_moe pc = {.n_tokens = n_pairs, .n_expert = n_expert};
    vkd_view bind[2] = {ids, route};
    return vkk_dispatch(c, VKK_MOE_GROUP, &wg, bind, 2, &pc, sizeof pc, 1, 1, 1);
}

vki_status op_moe_combine(vkd_cmd *c, vkd_view o, vkd_view weights, vkd_view x, uint32_t n_tokens, uint32_t n_used,
                          uint32_t d, const op_expert_bias *bias)
{
    if (!n_tokens)
        return VKI_OK;
    if (!n_used || n_used > VKI_MOE_MAX_USED || !d)
        return bad(c, "moe_combine", "n_used must be in 1..VKI_MOE_MAX_USED and d > 0");
    if (!holds(o, (uint64_t)n_tokens * n_used * d) || !holds(weights, (uint64_t)n_tokens * n_used) ||
        !holds(x, (uint64_t)n_tokens * d))
        return bad(c, "moe_combine", "a view is smaller than its shape");
    if (bias && (!bias->n_expert || !holds(bias->ids, (uint64_t)n_tokens * n_used) ||
                 !holds(bias->b[0], (uint64_t)bias->n_expert * d)))
        return bad(c, "moe_combine", "the expert biases are smaller than their shape");
    uint32_t wg = wg_limit(c->d, COMBINE_WG);
    uint64_t g = vkk_groups((uint64_t)n_tokens * d, wg);
    vki_pc_moe pc = {.n_tokens = n_tokens, .n_used = n_used, .d = d, .bias = bias != NULL};
    vkd_view bind[5] = {o, weights, x, bias ? bias->ids : o, bias ? bias->b[0] : o};
    return vkk_dispatch(c, VKK_MOE_COMBINE, &wg, bind, 5, &pc, sizeof pc, (uint32_t)(g < MAX_GROUPS ? g : MAX_GROUPS),
                        1, 1);
}

vki_status op_moe_prepare(vkd_device *d)
{
    const struct { vkk_id k; uint32_t wg; } all[] = {
        {VKK_MOE_TOPK, wg_limit(d, TOPK_WG)}, {VKK_MOE_GROUP, wg_limit(d, GROUP_WG)},
        {VKK_MOE_COMBINE, wg_limit(d, COMBINE_WG)},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        vki_status st = vkk_prepare(d, all[i].k, &all[i].wg);
        if (st != VKI_OK)
            return st;
    }
    return VKI_OK;
}
