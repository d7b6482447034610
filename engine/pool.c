/* Worker threads for one caller's jobs (pool.h). A job is n_parts calls of fn; the workers and
 * the caller take the next part under the mutex until none is left; the caller then waits for
 * the parts still running. Workers sleep on `work` between jobs. */
#include "pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

struct vk_pool {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was posted, or quit */
    pthread_cond_t idle; /* the job's last part finished */
    pthread_t thr[VK_POOL_MAX_THREADS - 1];
    uint32_t n_thr; /* workers started (the caller not counted) */
    vk_pool_fn fn;
    void *ctx;
    uint32_t n_parts, next, left; /* the job: parts, the next to hand out, those not finished */
    bool quit;
};

uint32_t vk_cores(uint32_t cap)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (uint64_t)n > cap ? cap : (uint32_t)n;
}

/* With p->mu held: runs the job's parts until none is left to take. */
static void take_parts(vk_pool *p)
{
    while (p->next < p->n_parts) {
        uint32_t part = p->next++;
        vk_pool_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, part);
        pthread_mutex_lock(&p->mu);
        if (--p->left == 0)
            pthread_cond_signal(&p->idle);
    }
}

static void *worker(void *arg)
{
    vk_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->quit) {
        take_parts(p);
        if (!p->quit)
            pthread_cond_wait(&p->work, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

vk_pool *vk_pool_create(uint32_t n_threads)
{
    if (n_threads <= 1)
        return NULL;
    vk_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    n_threads = n_threads > VK_POOL_MAX_THREADS ? VK_POOL_MAX_THREADS : n_threads;
    for (uint32_t t = 1; t < n_threads; t++) /* a thread that cannot start leaves fewer */
        if (pthread_create(&p->thr[p->n_thr], NULL, worker, p) == 0)
            p->n_thr++;
    if (!p->n_thr) {
        vk_pool_destroy(p);
        return NULL;
    }
    return p;
}

void vk_pool_destroy(vk_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t t = 0; t < p->n_thr; t++)
        pthread_join(p->thr[t], NULL);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

uint32_t vk_pool_threads(const vk_pool *p) { return p ? p->n_thr + 1 : 1; }

void vk_pool_run(vk_pool *p, uint32_t n_parts, vk_pool_fn fn, void *ctx)
{
    if (!p || n_parts <= 1) {
        for (uint32_t i = 0; i < n_parts; i++)
            fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn, p->ctx = ctx;
    p->n_parts = n_parts, p->next = 0, p->left = n_parts;
    pthread_cond_broadcast(&p->work);
    take_parts(p);
    while (p->left)
        pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
