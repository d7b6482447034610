/* Row-norm and elementwise ops: argument checks, workgroup sizes, dispatch. */
#include "engine/ops_basic.h"
#include "engine/ops_matmul.h" /* op_half_x_bytes / _stride: the F16 rows the norm and glu also write */

#include <math.h>

#define ELEM_WG 256u       /* elementwise kernels: any size works; 256 matches add's default */
#define MAX_GROUPS 65535u  /* grid-stride loops cover the rest; the guaranteed Vulkan minimum */

/* Row kernels (rmsnorm, softmax): one workgroup per row. A CPU device runs every invocation,
 * so it gets a small one (model rows there are short); GPUs get 256 threads per row. */
/* RMSNorm / softmax rows: a power of two dividing VKI_NORM_LANES (rmsnorm's virtual lanes). */
static uint32_t row_wg(const vkd_device *d)
{
    uint32_t wg = d->info.type == VKI_DEVICE_CPU ? 64u : 256u;
    while (wg > d->info.max_workgroup_invocations)
        wg /= 2;
    return wg;
}

static uint32_t elem_groups(uint64_t n)
{
    uint64_t g = (n + ELEM_WG - 1) / ELEM_WG;
    return (uint32_t)(g < MAX_GROUPS ? g : MAX_GROUPS);
}

uint64_t op_view_floats(vkd_view v)
{
    if (!v.buf || v.offset > v.buf->size)
        return 0;
    VkDeviceSize r = v.range == VK_WHOLE_SIZE ? v.buf->size - v.offset : v.range;
    return r / 4;
}

bool op_mat_fits(op_mat m, uint32_t rows, uint32_t cols)
{
    if (rows > 1 && m.stride < cols)
        return false;
    uint64_t end = (uint64_t)m.off + (uint64_t)(rows - 1) * m.stride + cols;
    return end <= op_view_floats(m.v) && end < (1ull << 32);
}

static vki_status bad(vkd_cmd *c, const char *op)
{
    vkd_log(c->d, VKI_LOG_ERROR, "%s: operand shape does not fit its buffer", op);
    return VKI_ERR_INVALID_ARG;
}

vki_status op_basic_prepare(vkd_device *d)
{
    uint32_t elem = ELEM_WG, row = row_wg(d);
    const struct { vkk_id k; uint32_t wg; } all[] = {
        {VKK_ADD, elem}, {VKK_GLU, elem}, {VKK_ROPE, elem}, {VKK_RMSNORM, row}, {VKK_SOFTMAX, row},
        {VKK_UNARY, elem},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        vki_status st = vkk_prepare(d, all[i].k, &all[i].wg);
        if (st != VKI_OK)
            return st;
    }
    /* the norm that also writes the tensor-core GEMMs' F16 input (engine/forward.c) */
    if (d->cm.kind != VKD_CM_NONE && !d->cm_x32 && d->info.float16)
        return vkk_prepare(d, VKK_RMSNORM_XH, &row);
    return VKI_OK;
}

vki_status op_add(vkd_cmd *c, vkd_view a, vkd_view b, vkd_view y, uint32_t n)
{
    if (!n)
        return VKI_OK;
    if (op_view_floats(a) < n || op_view_floats(b) < n || op_view_floats(y) < n)
        return bad(c, "add");
    vki_pc_add pc = {.n = n};
    vkd_view v[3] = {a, b, y};
    uint32_t wg = ELEM_WG;
    return vkk_dispatch(c, VKK_ADD, &wg, v, 3, &pc, sizeof pc, elem_groups(n), 1, 1);
}

vki_status op_copy(vkd_cmd *c, vkd_view src, vkd_view dst, uint64_t n_bytes)
{
    if (!n_bytes)
        return VKI_OK;
    uint64_t words = n_bytes / 4;
    if (n_bytes % 4 || words > UINT32_MAX || src.offset % 16 || dst.offset % 16 || op_view_floats(src) < words ||
        op_view_floats(dst) < words ||
        (src.buf == dst.buf && src.offset < dst.offset + n_bytes && dst.offset < src.offset + n_bytes))
        return bad(c, "copy");
    vki_pc_copy pc = {.n = (uint32_t)words};
    vkd_view v[2] = {src, dst};
    uint32_t wg = ELEM_WG;
    /* 4 uvec4 per invocation per pass (copy.comp's U): one pass when the groups allow */
    return vkk_dispatch(c, VKK_COPY, &wg, v, 2, &pc, sizeof pc, elem_groups((words + 15) / 16), 1, 1);
}

/* Whether xh can take op_half_x's F16 rows of [n_rows][n_cols] (on a device with shaderFloat16). */
static bool xh_fits(const vkd_cmd *c, vkd_view xh, uint32_t n_rows, uint32_t n_cols)
{
    return c->d->info.float16 && 4 * op_view_floats(xh) >= op_half_x_bytes(n_rows, n_cols) && xh.offset % 8 == 0;
}

vki_status op_rmsnorm_xh(vkd_cmd *c, op_mat x, vkd_view w, op_mat y, uint32_t n_rows, uint32_t n_cols, float eps,
                         vkd_view xq, vkd_view xh)
{
    return op_norm_xh(c, 0, x, w, y, n_rows, n_cols, eps, xq, xh);
}

vki_status op_norm_xh(vkd_cmd *c, uint32_t mode, op_mat x, vkd_view w, op_mat y, uint32_t n_rows, uint32_t n_cols,
                      float eps, vkd_view xq, vkd_view xh)
{
    if (!n_rows || !n_cols)
        return VKI_OK;
    const uint64_t n_w = (mode & VKI_NORM_BIAS ? 2ull : 1ull) * n_cols; /* w, then the biases */
    if (!op_mat_fits(x, n_rows, n_cols) || !op_mat_fits(y, n_rows, n_cols) || op_view_floats(w) < n_w ||
        !(eps >= 0) || mode > (VKI_NORM_MEAN | VKI_NORM_BIAS))
        return bad(c, "rmsnorm");
    if (xq.buf && (n_cols % 32 || op_view_floats(xq) < VKI_XQ_WORDS((uint64_t)n_rows, n_cols) || x.v.buf == y.v.buf))
        return bad(c, "rmsnorm (quantised rows: n_cols % 32 == 0, their words, y apart from x)");
    if (xh.buf && (xq.buf || !xh_fits(c, xh, n_rows, n_cols) || xh.buf == x.v.buf || xh.buf == y.v.buf ||
                   x.v.buf == y.v.buf))
        return bad(c, "rmsnorm (F16 rows: shaderFloat16, their bytes at an 8-aligned offset, apart from x and y, "
                      "y apart from x, not with quantised rows)");
    vki_pc_rmsnorm pc = {.n_rows = n_rows, .n_cols = n_cols, .x_off = x.off, .x_stride = x.stride,
                         .y_off = y.off, .y_stride = y.stride, .eps = eps, .xq = xq.buf != NULL, .mode = mode};
    vkd_view v[5] = {x.v, w, y.v, xq.buf ? xq : y.v, xh};
    uint32_t wg = row_wg(c->d);
    return vkk_dispatch(c, xh.buf ? VKK_RMSNORM_XH : VKK_RMSNORM, &wg, v, xh.buf ? 5 : 4, &pc, sizeof pc,
                        n_rows < MAX_GROUPS ? n_rows : MAX_GROUPS, 1, 1);
}

vki_status op_rmsnorm_xq(vkd_cmd *c, op_mat x, vkd_view w, op_mat y, uint32_t n_rows, uint32_t n_cols, float eps,
                         vkd_view xq)
{
    return op_rmsnorm_xh(c, x, w, y, n_rows, n_cols, eps, xq, (vkd_view){0});
}

vki_status op_rmsnorm(vkd_cmd *c, op_mat x, vkd_view w, op_mat y, uint32_t n_rows, uint32_t n_cols, float eps)
{
    return op_rmsnorm_xq(c, x, w, y, n_rows, n_cols, eps, (vkd_view){0});
}

vki_status op_rope(vkd_cmd *c, const op_rope_p *p, op_mat x, op_mat y, vkd_view pos, vkd_view freqs)
{
    if (!p->n_tokens || !p->n_heads)
        return VKI_OK;
    uint64_t row = (uint64_t)p->n_heads * p->head_dim;
    if (!p->head_dim || p->head_dim % 2 || p->n_rot % 2 || p->n_rot > p->head_dim || !p->n_rot ||
        row >= (1ull << 32) || !op_mat_fits(x, p->n_tokens, (uint32_t)row) || !op_mat_fits(y, p->n_tokens, (uint32_t)row) ||
        op_view_floats(pos) < p->n_tokens || op_view_floats(freqs) < 2ull * p->n_rot ||
        (uint64_t)p->n_tokens * row / 2 >= (1ull << 32))
        return bad(c, "rope");
    vki_pc_rope pc = {.n_tokens = p->n_tokens, .n_heads = p->n_heads, .head_dim = p->head_dim,
                      .n_rot = p->n_rot, .x_off = x.off, .x_stride = x.stride, .y_off = y.off,
                      .y_stride = y.stride, .neox = p->neox};
    vkd_view v[4] = {x.v, y.v, pos, freqs};
    uint32_t wg = ELEM_WG;
    return vkk_dispatch(c, VKK_ROPE, &wg, v, 4, &pc, sizeof pc, elem_groups((uint64_t)p->n_tokens * row / 2), 1, 1);
}

/* v rounded to its 12 most significant bits (exactly representable in float). */
static double top12(double v)
{
    if (v == 0)
        return 0;
    int e;
    double m = frexp(v, &e); /* v = m * 2^e, 0.5 <= |m| < 1 */
    return ldexp(nearbyint(ldexp(m, 12)), e - 12);
}

/* d(b) of op_rope_yarn: the dimension pair that turns b times over the original context. */
static double yarn_corr_dim(uint32_t n_rot, uint32_t n_ctx_orig, double b, double base)
{
    return n_rot * log(n_ctx_orig / (b * 2.0 * 3.14159265358979323846)) / (2.0 * log(base));
}

void op_rope_freqs(double base, double freq_scale, const float *factors, const op_rope_yarn *yarn, float mag,
                   uint32_t n_rot, float *out)
{
    double lo = 0, hi = 0;
    if (yarn) {
        lo = fmax(0.0, floor(yarn_corr_dim(n_rot, yarn->n_ctx_orig, yarn->beta_fast, base)));
        hi = fmin(n_rot - 1.0, ceil(yarn_corr_dim(n_rot, yarn->n_ctx_orig, yarn->beta_slow, base)));
    }
    for (uint32_t i = 0; i < n_rot / 2; i++) {
        double extrap = pow(base, -2.0 * i / n_rot);
        if (factors)
            extrap /= factors[i];
        double f = freq_scale * extrap;
        if (yarn && yarn->ext_factor != 0) {
            double mix = (1.0 - fmin(1.0, fmax(0.0, (i - lo) / fmax(0.001, hi - lo)))) * yarn->ext_factor;
            f = f * (1.0 - mix) + extrap * mix;
        }
        double g = f / (2.0 * 3.14159265358979323846);
        double g1 = top12(g), g2 = top12(g - g1);
        out[4 * i + 0] = (float)g1;
        out[4 * i + 1] = (float)g2;
        out[4 * i + 2] = (float)(g - g1 - g2);
        out[4 * i + 3] = mag;
    }
}

/* op_glu, and with xh (op_glu_xh: y is {xh, 0, its rows' halves}) its F16 rows; b: the
 * experts' biases or NULL. */
static vki_status glu(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, op_mat y, uint32_t n_rows, uint32_t n_cols,
                      bool xh, const op_expert_bias *b)
{
    if (!n_rows || !n_cols)
        return VKI_OK;
    if (!op_mat_fits(g, n_rows, n_cols) || !op_mat_fits(u, n_rows, n_cols) ||
        (uint64_t)n_rows * (xh ? y.stride : n_cols) >= (1ull << 32) ||
        (act != VKI_GLU_SILU && act != VKI_GLU_GELU_TANH && act != VKI_GLU_SWIGLU_OAI))
        return bad(c, "glu");
    if (b && (!b->n_expert || op_view_floats(b->ids) < n_rows ||
              op_view_floats(b->b[0]) < (uint64_t)b->n_expert * n_cols ||
              op_view_floats(b->b[1]) < (uint64_t)b->n_expert * n_cols))
        return bad(c, "glu (expert biases)");
    if (xh ? !xh_fits(c, y.v, n_rows, n_cols) || y.v.buf == g.v.buf || y.v.buf == u.v.buf
           : !op_mat_fits(y, n_rows, n_cols))
        return bad(c, xh ? "glu (F16 rows: shaderFloat16, their bytes at an 8-aligned offset, apart from g and u)"
                         : "glu");
    vki_pc_glu pc = {.n_rows = n_rows, .n_cols = n_cols, .g_off = g.off, .g_stride = g.stride, .u_off = u.off,
                     .u_stride = u.stride, .y_off = y.off, .y_stride = y.stride, .act = act, .bias = b != NULL};
    vkd_view v[6] = {g.v, u.v, y.v, b ? b->ids : g.v, b ? b->b[0] : g.v, b ? b->b[1] : g.v};
    uint32_t wg = ELEM_WG;
    return vkk_dispatch(c, xh ? VKK_GLU_XH : VKK_GLU, &wg, v, 6, &pc, sizeof pc,
                        elem_groups((uint64_t)n_rows * (xh ? y.stride / 4 : n_cols)), 1, 1);
}

vki_status op_glu(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, op_mat y, uint32_t n_rows, uint32_t n_cols)
{
    return glu(c, act, g, u, y, n_rows, n_cols, false, NULL);
}

vki_status op_glu_ex(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, op_mat y, uint32_t n_rows, uint32_t n_cols,
                     const op_expert_bias *bias)
{
    return glu(c, act, g, u, y, n_rows, n_cols, false, bias);
}

vki_status op_glu_xh(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, vkd_view xh, uint32_t n_rows, uint32_t n_cols)
{
    return glu(c, act, g, u, (op_mat){xh, 0, op_half_x_stride(n_cols)}, n_rows, n_cols, true, NULL);
}

vki_status op_glu_xh_ex(vkd_cmd *c, uint32_t act, op_mat g, op_mat u, vkd_view xh, uint32_t n_rows, uint32_t n_cols,
                        const op_expert_bias *bias)
{
    return glu(c, act, g, u, (op_mat){xh, 0, op_half_x_stride(n_cols)}, n_rows, n_cols, true, bias);
}

vki_status op_unary(vkd_cmd *c, uint32_t op, float a, op_mat x, op_mat y, uint32_t n_rows, uint32_t n_cols)
{
    return op_unary_xq(c, op, a, x, y, n_rows, n_cols, (vkd_view){0});
}

vki_status op_unary_xq(vkd_cmd *c, uint32_t op, float a, op_mat x, op_mat y, uint32_t n_rows, uint32_t n_cols,
                       vkd_view xq)
{
    if (!n_rows || !n_cols)
        return VKI_OK;
    if (xq.buf && (n_cols % 32 || op_view_floats(xq) < VKI_XQ_WORDS((uint64_t)n_rows, n_cols)))
        return bad(c, "unary (quantised rows: n_cols % 32 == 0, their words)");
    if (!op_mat_fits(x, n_rows, n_cols) || !op_mat_fits(y, n_rows, n_cols) || (uint64_t)n_rows * n_cols >= (1ull << 32) ||
        !isfinite(a) || op > VKI_UNARY_RELU2 || (op == VKI_UNARY_SOFTCAP && !(a > 0)))
        return bad(c, "unary");
    vki_pc_unary pc = {.n_rows = n_rows, .n_cols = n_cols, .x_off = x.off, .x_stride = x.stride, .y_off = y.off,
                       .y_stride = y.stride, .op = op, .a = a};
    vkd_view v[3] = {x.v, y.v, xq};
    uint32_t wg = ELEM_WG;
    if (xq.buf) /* one invocation per block of 32 */
        return vkk_dispatch(c, VKK_UNARY_XQ, &wg, v, 3, &pc, sizeof pc, elem_groups((uint64_t)n_rows * (n_cols / 32)),
                            1, 1);
    return vkk_dispatch(c, VKK_UNARY, &wg, v, 2, &pc, sizeof pc, elem_groups((uint64_t)n_rows * n_cols), 1, 1);
}

vki_status op_softmax(vkd_cmd *c, op_mat x, op_mat y, uint32_t n_rows, uint32_t n_cols, float scale)
{
    if (!n_rows || !n_cols)
        return VKI_OK;
    if (!op_mat_fits(x, n_rows, n_cols) || !op_mat_fits(y, n_rows, n_cols) || !(scale > 0) || isinf(scale))
        return bad(c, "softmax");
    vki_pc_softmax pc = {.n_rows = n_rows, .n_cols = n_cols, .x_off = x.off, .x_stride = x.stride,
                         .y_off = y.off, .y_stride = y.stride, .scale = scale};
    vkd_view v[2] = {x.v, y.v};
    uint32_t wg = row_wg(c->d);
    return vkk_dispatch(c, VKK_SOFTMAX, &wg, v, 2, &pc, sizeof pc, n_rows < MAX_GROUPS ? n_rows : MAX_GROUPS, 1, 1);
}
