/* A few worker threads that share one job's parts with the caller: the staging ring's fills
 * while a model loads (memory.c). Owned by one caller thread; no state outside the pool. */
#pragma once
#include <stdint.h>

#define VK_POOL_MAX_THREADS 8 /* the caller included */

typedef struct vk_pool vk_pool;
/* Runs part `part` of the job; parts run concurrently, in any order, on any of the threads. */
typedef void (*vk_pool_fn)(void *ctx, uint32_t part);

/* A pool of n_threads - 1 workers (n_threads counts the caller; at most VK_POOL_MAX_THREADS).
 * NULL when n_threads <= 1 or no worker could start: vk_pool_run then runs the parts on the
 * caller, so NULL is a working pool of one thread. */
vk_pool *vk_pool_create(uint32_t n_threads);
void vk_pool_destroy(vk_pool *p); /* NULL is fine */
/* Threads that take parts, the caller included (1 for NULL). */
uint32_t vk_pool_threads(const vk_pool *p);
/* Runs fn(ctx, 0 .. n_parts - 1), the caller taking parts too; returns when every part is done. */
void vk_pool_run(vk_pool *p, uint32_t n_parts, vk_pool_fn fn, void *ctx);
/* Cores online, between 1 and cap. */
uint32_t vk_cores(uint32_t cap);
