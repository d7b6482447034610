/* Test-only fault injection (issue 18): make the Nth host allocation, vkQueueSubmit,
 * vkWaitForFences, vkAllocateMemory or vkMapMemory of the library fail, to walk its error paths.
 *
 * With VKI_FAULT_INJECTION (a CMake option, on in builds with tests) this header is force-included
 * (-include) into every source of the library and the server, after the C headers it needs, and
 * routes malloc / calloc / realloc / strdup / strndup and those four Vulkan calls through the
 * counters of engine/fault.c. Nothing else changes: an unarmed site costs one relaxed atomic load
 * per call. Without the option the header defines nothing but the API below, whose functions then
 * do nothing (vkf_enabled() says which).
 *
 * The counters are process-wide atomics: the one mutable global state of the library, on purpose
 * (malloc is process-wide too, and a test must reach allocations made deep inside objects that
 * have no handle to a per-object allocator). Tests arm a site, run one path, and disarm it.
 * Allocations of system libraries (the Vulkan driver, libc, cJSON, PCRE2) are not counted. */
#ifndef VKI_ENGINE_FAULT_H
#define VKI_ENGINE_FAULT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum vkf_site {
    VKF_ALLOC,           /* malloc, calloc, realloc (to a nonzero size), strdup, strndup */
    VKF_QUEUE_SUBMIT,    /* vkQueueSubmit: not submitted */
    VKF_WAIT_FENCES,     /* vkWaitForFences: waits, then reports the failure */
    VKF_ALLOCATE_MEMORY, /* vkAllocateMemory: nothing allocated */
    VKF_MAP_MEMORY,      /* vkMapMemory: not mapped */
    VKF_N_SITES
} vkf_site;

/* The nth call (1-based, counted from now, by any thread) at site fails with `result` (a
 * VkResult for the Vulkan sites, ignored for VKF_ALLOC: NULL); later calls succeed again.
 * n = 0 disarms and keeps what vkf_fired / vkf_calls report. */
void vkf_arm(vkf_site site, uint64_t n, int result);
/* Whether the armed failure happened since the last vkf_arm of the site. */
bool vkf_fired(vkf_site site);
/* Calls counted at the site since its last vkf_arm. */
uint64_t vkf_calls(vkf_site site);
bool vkf_enabled(void);
void vkf_firing(vkf_site site); /* a debugger's breakpoint target: an armed failure happens */
/* The hook itself: true when this call must fail (*result: the result to report). */
bool vkf_fail(vkf_site site, int *result);

#if defined(VKI_FAULT_INJECTION) && !defined(VKF_NO_WRAP)
#include <vulkan/vulkan.h> /* its prototypes before the macros that wrap them */
void *vkf_malloc(size_t n);
void *vkf_calloc(size_t n, size_t size);
void *vkf_realloc(void *p, size_t n);
char *vkf_strdup(const char *s);
char *vkf_strndup(const char *s, size_t n);
#define malloc(n) vkf_malloc(n)
#define calloc(n, s) vkf_calloc(n, s)
#define realloc(p, n) vkf_realloc(p, n)
#define strdup(s) vkf_strdup(s)
#define strndup(s, n) vkf_strndup(s, n)
/* Vulkan: the real function unless the call is chosen to fail (a self-referencing macro is not
 * expanded again, so the inner name is the real function). A failed wait still waits first, so
 * no work is left running behind a fence the caller thinks is done. */
#define VKF_VK_(site, call) __extension__({ int r_; vkf_fail(site, &r_) ? (VkResult)r_ : call; })
#define vkQueueSubmit(...) VKF_VK_(VKF_QUEUE_SUBMIT, vkQueueSubmit(__VA_ARGS__))
#define vkAllocateMemory(...) VKF_VK_(VKF_ALLOCATE_MEMORY, vkAllocateMemory(__VA_ARGS__))
#define vkMapMemory(...) VKF_VK_(VKF_MAP_MEMORY, vkMapMemory(__VA_ARGS__))
#define vkWaitForFences(...)                                                                      \
    __extension__({                                                                               \
        VkResult w_ = vkWaitForFences(__VA_ARGS__);                                               \
        int r_;                                                                                   \
        w_ == VK_SUCCESS && vkf_fail(VKF_WAIT_FENCES, &r_) ? (VkResult)r_ : w_;                   \
    })
#endif

#endif
