/* Test support shared by every suite: GPU harness (device with the validation layer; a suite
 * fails on any validation message), random data, NMSE, and paths to ../shared.
 *
 * GPU suites: group setup vt_gpu_setup / teardown vt_gpu_teardown. With no Vulkan device the
 * setup fails with a clear message, unless VKI_ALLOW_NO_DEVICE=1, when every test skips. */
#ifndef VKI_TESTS_VT_H
#define VKI_TESTS_VT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"
#include "engine/kernels.h"

typedef struct vt_gpu {
    vkd_device *dev;
    vkd_cmd cmd;
    /* The device's test-adjustable state as opened: tests present lavapipe as another device
     * (info), switch the matmul path (cm, gemv_max_m, cm_split, cm_tile_*) or wrap driver calls
     * (fn), and restore them
     * when they end; vt_gpu_get puts them back at the start of every test too, so a test that
     * fails half way (cmocka leaves it at the failed assertion) cannot change the next ones. */
    vkd_fns fn0;
    vki_device_info info0;
    vkd_cm cm0;
    uint32_t gemv_max_m0;
} vt_gpu;

/* Device parameters of every GPU suite: validation on, and the device named by $VKI_DEVICE
 * (an index or a name substring, as `vkinfer --device` takes it) when set, so a GPU run
 * (tools/gpu-check) tests the device it asks for; otherwise the automatic choice. */
vki_device_params vt_device_params(void);
/* A vki_device_params.log callback for engines a suite creates itself: user is an atomic_int
 * counting validation-layer messages; warnings and errors are printed to stderr. */
void vt_count_validation(void *user, vki_log_level lvl, const char *msg);
/* Engine parameters for a suite's own engine: vt_device_params (validation on), no pipeline cache
 * on disk, kv_tokens / max_seqs, validation messages counted into *validation (an atomic_int). */
vki_engine_params vt_engine_params(uint64_t kv_tokens, uint32_t max_seqs, void *validation);

/* The device runs the FP32 kernels (vkd_device.cm = NONE) unless a test selects a
 * cooperative-matrix path with vkd_coopmat_select (VK_NV_cooperative_matrix is enabled at open
 * where the device offers it). */
int vt_gpu_setup(void **state);
/* Keeps the Vulkan driver and validation layer loaded for the process's life so LeakSanitizer
 * can see their one-off allocations as reachable; suites that open engines through the public
 * API (not vt_gpu_setup) call it first. */
void vt_pin_vulkan_libraries(void);    /* *state = vt_gpu* (or NULL to skip when allowed) */
int vt_gpu_teardown(void **state); /* fails if any validation message was seen */
/* In a test: vt_gpu *g = vt_gpu_get(state); (skips the test when there is no device) */
vt_gpu *vt_gpu_get(void **state);
/* Asserts no validation message so far (call at the end of each test to pin the culprit). */
void vt_assert_clean(vt_gpu *g);

/* Device buffer of n bytes, filled with NaN bits (0x7fc00000), so unwritten outputs fail. */
vkd_buffer *vt_buf_nan(vt_gpu *g, size_t n, const char *name);
vkd_buffer *vt_buf_from(vt_gpu *g, const void *data, size_t n, const char *name);
void vt_download(vt_gpu *g, const vkd_buffer *b, void *dst, size_t n);
void vt_begin(vt_gpu *g);
void vt_submit_wait(vt_gpu *g);

/* Deterministic RNG (splitmix64). Each suite seeds from VKI_TEST_SEED or the time and prints it. */
typedef struct vt_rng {
    uint64_t s;
} vt_rng;
vt_rng vt_rng_seeded(const char *suite);
uint64_t vt_u64(vt_rng *r);
uint32_t vt_range(vt_rng *r, uint32_t lo, uint32_t hi); /* uniform in [lo, hi] */
float vt_uniform(vt_rng *r, float lo, float hi);
float vt_normal(vt_rng *r);
void vt_fill_uniform(vt_rng *r, float *x, size_t n, float lo, float hi);

/* Normalised mean squared error: sum (a-b)^2 / sum b^2 (b is the reference). A NaN or inf in
 * `a` gives INFINITY. When the reference is all zero it returns sum (a-b)^2. */
double vt_nmse(const float *a, const float *ref, size_t n);
/* Asserts nmse <= tol, printing the shape label and the worst element on failure. */
void vt_assert_nmse(const float *a, const float *ref, size_t n, double tol, const char *label);

/* ggml's quantize_row_q8_0_ref on one block of 32 (what kv_write does for a Q8_0 KV pool):
 * d = amax / 127 in f32 for the quotients, stored as f16; q = roundf(x / d). Returns d's f16
 * bits. */
uint16_t vt_q8_0_block(const float *x, int8_t *q);
/* `vkinfer ARGS` (the build's program) through the shell, stdout and stderr captured separately
 * (each cut to its buffer); fails the test on any validation message in stderr. The child runs
 * without LeakSanitizer's exit report: the Vulkan driver's one-off allocations, freed by no one
 * once the loader unloads it, would be reported (the GPU harness pins those libraries; a child
 * process cannot), while every other sanitizer check stays on. */
typedef struct vt_run_result {
    char out[32768], err[16384];
    int rc;
} vt_run_result;
void vt_run_vkinfer(const char *args, vt_run_result *r);
/* The same with `PREFIX | ` before it (a shell pipeline feeding the program's stdin). */
void vt_run_vkinfer_in(const char *prefix, const char *args, vt_run_result *r);

/* Every weight type the matmul family runs (engine/kernels.h VKK_WEIGHT_TYPES), and whether a
 * type is stored per element (f32, f16, bf16: any row length) rather than in blocks. */
extern const uint32_t vt_weight_types[];
extern const size_t vt_n_weight_types;
bool vt_is_float_type(uint32_t ggml_type);

/* Grammars: a vocabulary of the 256 single bytes (token i = byte i) for gram_vocab_create, and
 * whether text is in the language of a GBNF grammar (checked byte by byte, independently of any
 * model's vocabulary; a grammar that does not parse fails the test). */
vki_status vt_byte_piece(void *ctx, int32_t id, char *buf, size_t cap, size_t *n);
bool vt_in_grammar(const char *gbnf, size_t len, const char *text, size_t n);

/* ../shared/models/<name> if present, else NULL (the caller skips with a message, or falls back
 * to a synthetic model). VKI_TEST_NO_SHARED=1: NULL always, as on a machine without ../shared
 * (tools/dev test runs the suites with a synthetic fallback so too). */
const char *vt_shared_model(const char *name, char *buf, size_t n);

/* VKI_TEST_QUICK=1 (tools/dev test sets it for the sanitizer pass, which is there for host
 * code): suites cut repetition that only makes the GPU (lavapipe) work longer, such as
 * statistical draw counts or the longest context, and say so; every code path still runs. */
bool vt_quick(void);

#endif
