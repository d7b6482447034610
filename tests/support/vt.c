#include "support/vt.h"

#include "host/grammar/grammar.h"
#include "engine/quant.h"
#include "engine/rng.h"
#include "host/cli/cli_common.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

static void quiet_log(void *user, vki_log_level lvl, const char *msg)
{
    (void)user;
    fprintf(stderr, "[vkinfer %s] %s\n", lvl == VKI_LOG_ERROR ? "error" : lvl == VKI_LOG_WARN ? "warn" : "info", msg);
}

/* The Vulkan loader unloads drivers and layers at vkDestroyInstance; their one-off allocations
 * then show as leaks from "<unknown module>" that no suppression can name. Keeping the libraries
 * loaded keeps those allocations reachable, so LeakSanitizer stays on for the GPU suites and
 * leaks in vkinfer's own code still fail the sanitizer build. */
void vt_pin_vulkan_libraries(void)
{
    static const char *const libs[] = {"libvulkan_lvp.so", "libVkLayer_khronos_validation.so"};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++)
        dlopen(libs[i], RTLD_NOW | RTLD_NODELETE | RTLD_LOCAL);
}

vki_device_params vt_device_params(void)
{
    vki_device_params p = vki_device_default_params();
    p.validation = true;
    const char *env = getenv("VKI_DEVICE");
    if (env && *env)
        cli_device_choice(env, &p);
    return p;
}

int vt_gpu_setup(void **state)
{
    *state = NULL;
    vt_pin_vulkan_libraries();
    vt_gpu *g = calloc(1, sizeof *g);
    if (!g)
        return -1;
    vki_device_params p = vt_device_params();
    p.log = quiet_log;
    p.log_level = VKI_LOG_WARN;
    vki_status st = vkd_open(&p, &g->dev);
    if (st == VKI_ERR_NO_DEVICE && getenv("VKI_ALLOW_NO_DEVICE") && !strcmp(getenv("VKI_ALLOW_NO_DEVICE"), "1")) {
        fprintf(stderr, "SKIP: no Vulkan device (VKI_ALLOW_NO_DEVICE=1)\n");
        free(g);
        return 0;
    }
    if (st != VKI_OK) {
        fprintf(stderr, "FAIL: cannot open a Vulkan device with validation: %s. GPU suites need a Vulkan "
                "device (Debian: mesa-vulkan-drivers) and vulkan-validationlayers; set "
                "VKI_ALLOW_NO_DEVICE=1 to skip them.\n", vki_status_str(st));
        free(g);
        return -1;
    }
    /* Suites check the FP32 kernels to FP32 precision on every device; the cooperative-matrix
     * tests choose their path (real where the device has it, or emulated) themselves. */
    vkd_coopmat_select(g->dev, VKI_COOPMAT_OFF);
    g->fn0 = g->dev->fn;
    g->info0 = g->dev->info;
    g->cm0 = g->dev->cm;
    g->gemv_max_m0 = g->dev->gemv_max_m;
    fprintf(stderr, "device: %s (%s)\n", g->dev->info.name, g->dev->info.driver_info);
    if (vkd_cmd_create(g->dev, "test cmd", &g->cmd) != VKI_OK) {
        vkd_close(g->dev);
        free(g);
        return -1;
    }
    *state = g;
    return 0;
}

int vt_gpu_teardown(void **state)
{
    vt_gpu *g = *state;
    if (!g)
        return 0;
    vkd_cmd_destroy(&g->cmd);
    int errors = atomic_load(&g->dev->n_validation_errors), warns = atomic_load(&g->dev->n_validation_warnings);
    vkd_close(g->dev); /* destruction-time messages count too */
    free(g);
    if (errors || warns) {
        fprintf(stderr, "FAIL: %d validation errors, %d warnings\n", errors, warns);
        return -1;
    }
    return 0;
}

vt_gpu *vt_gpu_get(void **state)
{
    vt_gpu *g = *state;
    if (!g)
        skip();
    g->dev->fn = g->fn0;
    g->dev->info = g->info0;
    g->dev->cm = g->cm0;
    g->dev->gemv_max_m = g->gemv_max_m0;
    g->dev->cm_split = g->dev->matvec_mu = 0; /* the tuning overrides are 0 at open */
    g->dev->matvec_wg = g->dev->matvec_rows = g->dev->matvec_mc = 0;
    g->dev->cm_tile_m = g->dev->cm_tile_n = g->dev->cm_warp_m = g->dev->cm_warp_n = 0;
    g->dev->cm_stages = g->dev->cm_bk = 0;
    return g;
}

void vt_assert_clean(vt_gpu *g)
{
    assert_int_equal(atomic_load(&g->dev->n_validation_errors), 0);
    assert_int_equal(atomic_load(&g->dev->n_validation_warnings), 0);
}

vkd_buffer *vt_buf_nan(vt_gpu *g, size_t n, const char *name)
{
    vkd_buffer *b = NULL;
    size_t rounded = (n + 3) & ~(size_t)3;
    assert_int_equal(vkd_buffer_create(g->dev, rounded ? rounded : 4, VKD_MEM_DEVICE, name, &b), VKI_OK);
    assert_int_equal(vkd_fill(g->dev, b, 0, b->size, 0x7fc00000u), VKI_OK);
    return b;
}

vkd_buffer *vt_buf_from(vt_gpu *g, const void *data, size_t n, const char *name)
{
    vkd_buffer *b = vt_buf_nan(g, n, name);
    assert_int_equal(vkd_upload(g->dev, b, 0, data, n), VKI_OK);
    return b;
}

void vt_download(vt_gpu *g, const vkd_buffer *b, void *dst, size_t n)
{
    assert_int_equal(vkd_download(g->dev, b, 0, dst, n), VKI_OK);
}

void vt_begin(vt_gpu *g) { assert_int_equal(vkd_cmd_begin(&g->cmd), VKI_OK); }
void vt_submit_wait(vt_gpu *g) { assert_int_equal(vkd_cmd_submit_wait(&g->cmd), VKI_OK); }

vt_rng vt_rng_seeded(const char *suite)
{
    const char *env = getenv("VKI_TEST_SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    fprintf(stderr, "%s: seed %llu (rerun with VKI_TEST_SEED=%llu)\n", suite, (unsigned long long)seed,
            (unsigned long long)seed);
    return (vt_rng){seed};
}

uint64_t vt_u64(vt_rng *r)
{
    return vki_splitmix64(&r->s);
}

uint32_t vt_range(vt_rng *r, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(vt_u64(r) % ((uint64_t)hi - lo + 1));
}

float vt_uniform(vt_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((vt_u64(r) >> 40) * (1.0 / 16777216.0));
}

float vt_normal(vt_rng *r)
{
    double u1 = ((vt_u64(r) >> 11) + 1) * (1.0 / 9007199254740993.0), u2 = (vt_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void vt_fill_uniform(vt_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = vt_uniform(r, lo, hi);
}

uint16_t vt_q8_0_block(const float *x, int8_t *q)
{
    float amax = 0;
    for (int i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < 32; i++)
        q[i] = (int8_t)roundf(x[i] * id);
    return quant_f32_to_f16(d);
}

double vt_nmse(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) && !(isinf(a[i]) && a[i] == ref[i]))
            return INFINITY;
        if (isinf(ref[i]))
            continue; /* matching infinities (e.g. masked logits) */
        double e = (double)a[i] - ref[i];
        num += e * e;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

void vt_assert_nmse(const float *a, const float *ref, size_t n, double tol, const char *label)
{
    double e = vt_nmse(a, ref, n);
    if (e <= tol)
        return;
    size_t worst = 0;
    double we = -1;
    for (size_t i = 0; i < n; i++) {
        double d = isfinite(a[i]) ? fabs((double)a[i] - ref[i]) : INFINITY;
        if (d > we) {
            we = d;
            worst = i;
        }
    }
    fail_msg("%s: NMSE %.3g > %.3g (worst [%zu]: got %.9g, want %.9g)", label, e, tol, worst, a[worst], ref[worst]);
}

void vt_run_vkinfer(const char *args, vt_run_result *r) { vt_run_vkinfer_in(NULL, args, r); }

void vt_run_vkinfer_in(const char *prefix, const char *args, vt_run_result *r)
{
    char cmd[4096], errf[] = "/tmp/vki_cli_err_XXXXXX";
    int fd = mkstemp(errf);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s%sASAN_OPTIONS=detect_leaks=0 %s/vkinfer %s 2>%s", prefix ? prefix : "",
             prefix ? " | " : "", VKI_BINARY_DIR, args, errf);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(r->out, 1, sizeof r->out - 1, p);
    r->out[n] = 0;
    while (fread(cmd, 1, sizeof cmd, p) > 0) /* the rest, unread, would block the child */
        ;
    int status = pclose(p);
    r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    FILE *e = fopen(errf, "r");
    n = e ? fread(r->err, 1, sizeof r->err - 1, e) : 0;
    r->err[n] = 0;
    if (e)
        fclose(e);
    unlink(errf);
    if (strstr(r->err, "validation"))
        fail_msg("validation messages from `vkinfer %s`:\n%s", args, r->err);
}

const char *vt_shared_model(const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "%s/models/%s", VKI_SHARED_DIR, name);
    const char *none = getenv("VKI_TEST_NO_SHARED"); /* as on a machine without ../shared */
    return (!none || strcmp(none, "1")) && access(buf, R_OK) == 0 ? buf : NULL;
}

#define VT_TYPE_ID(T, t) VKI_GGML_##T,
const uint32_t vt_weight_types[] = {VKK_WEIGHT_TYPES(VT_TYPE_ID)};
const size_t vt_n_weight_types = sizeof vt_weight_types / sizeof vt_weight_types[0];

bool vt_quick(void)
{
    const char *q = getenv("VKI_TEST_QUICK");
    return q && !strcmp(q, "1");
}

bool vt_is_float_type(uint32_t ggml_type)
{
    return ggml_type == VKI_GGML_F32 || ggml_type == VKI_GGML_F16 || ggml_type == VKI_GGML_BF16;
}

vki_status vt_byte_piece(void *ctx, int32_t id, char *buf, size_t cap, size_t *n)
{
    (void)ctx;
    buf[0] = (char)id;
    *n = cap ? 1 : 0;
    return VKI_OK;
}

bool vt_in_grammar(const char *gbnf, size_t len, const char *text, size_t n)
{
    gram_vocab *v;
    gram_grammar *g;
    gram_automaton *a;
    char err[256];
    assert_int_equal(gram_vocab_create(256, vt_byte_piece, NULL, NULL, &v), VKI_OK);
    if (gram_parse(gbnf, len, &g, err, sizeof err) != VKI_OK)
        fail_msg("%s", err);
    assert_int_equal(gram_automaton_create(g, v, NULL, &a), VKI_OK);
    bool ok = gram_accepts(a, text, n);
    gram_automaton_free(a);
    gram_vocab_free(v);
    return ok;
}

void vt_count_validation(void *user, vki_log_level lvl, const char *msg)
{
    if (lvl <= VKI_LOG_WARN && !strncmp(msg, "validation", 10))
        atomic_fetch_add((atomic_int *)user, 1);
    if (lvl <= VKI_LOG_WARN)
        fprintf(stderr, "[vkinfer] %s\n", msg);
}

vki_engine_params vt_engine_params(uint64_t kv_tokens, uint32_t max_seqs, void *validation)
{
    vki_engine_params ep = vki_engine_default_params();
    ep.int_dot = VKI_INT_DOT_OFF; /* the exact float path the suites' references check */
    ep.kv_tokens = kv_tokens;
    ep.max_seqs = max_seqs;
    ep.device = vt_device_params();
    ep.device.pipeline_cache_dir = "";
    ep.device.log = vt_count_validation;
    ep.device.log_user = validation;
    return ep;
}
