/* The counters behind engine/fault.h. */
#define VKF_NO_WRAP
#include "engine/fault.h"
/* this file calls the real allocator (the header was force-included before VKF_NO_WRAP) */
#undef malloc
#undef calloc
#undef realloc
#undef strdup
#undef strndup

#include <stdatomic.h>

#ifdef VKI_FAULT_INJECTION
/* Per site: calls left until the failure (0: disarmed), calls seen, whether it fired, result. */
static _Atomic uint64_t g_left[VKF_N_SITES], g_calls[VKF_N_SITES];
static atomic_bool g_fired[VKF_N_SITES];
static atomic_int g_result[VKF_N_SITES];

void vkf_arm(vkf_site site, uint64_t n, int result)
{
    atomic_store(&g_left[site], 0);
    if (!n)
        return;
    atomic_store(&g_calls[site], 0);
    atomic_store(&g_fired[site], false);
    atomic_store(&g_result[site], result);
    atomic_store(&g_left[site], n);
}

bool vkf_fired(vkf_site site) { return atomic_load(&g_fired[site]); }
uint64_t vkf_calls(vkf_site site) { return atomic_load(&g_calls[site]); }
bool vkf_enabled(void) { return true; }

/* Called when an armed failure happens: a breakpoint target (gdb -ex 'break vkf_firing') to see
 * which call failed. */
__attribute__((noinline)) void vkf_firing(vkf_site site)
{
    __asm__ volatile("" : : "r"(site) : "memory");
}

bool vkf_fail(vkf_site site, int *result)
{
    if (atomic_load_explicit(&g_left[site], memory_order_relaxed) == 0)
        return false; /* the common case: one relaxed load */
    atomic_fetch_add(&g_calls[site], 1);
    uint64_t left = atomic_load(&g_left[site]);
    /* exactly one caller takes the count from 1 to 0, even when threads race */
    while (left && !atomic_compare_exchange_weak(&g_left[site], &left, left - 1))
        ;
    if (left != 1)
        return false;
    atomic_store(&g_fired[site], true);
    vkf_firing(site);
    *result = atomic_load(&g_result[site]);
    return true;
}

void *vkf_malloc(size_t n)
{
    int r;
    return vkf_fail(VKF_ALLOC, &r) ? NULL : malloc(n);
}

void *vkf_calloc(size_t n, size_t size)
{
    int r;
    return vkf_fail(VKF_ALLOC, &r) ? NULL : calloc(n, size);
}

/* realloc(p, 0) frees; only growth or a new block can fail */
void *vkf_realloc(void *p, size_t n)
{
    int r;
    return n && vkf_fail(VKF_ALLOC, &r) ? NULL : realloc(p, n);
}

char *vkf_strdup(const char *s)
{
    int r;
    return vkf_fail(VKF_ALLOC, &r) ? NULL : strdup(s);
}

char *vkf_strndup(const char *s, size_t n)
{
    int r;
    return vkf_fail(VKF_ALLOC, &r) ? NULL : strndup(s, n);
}
#else
void vkf_arm(vkf_site site, uint64_t n, int result) { (void)site, (void)n, (void)result; }
bool vkf_fired(vkf_site site) { return (void)site, false; }
uint64_t vkf_calls(vkf_site site) { return (void)site, 0; }
bool vkf_enabled(void) { return false; }
bool vkf_fail(vkf_site site, int *result) { return (void)site, (void)result, false; }
#endif
