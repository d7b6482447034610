/* After a device loss: the engine is recreated by a thread of the server, with backoff.
 *
 * The batch manager's step reports VKI_ERR_DEVICE_LOST, ends every request in flight with that
 * error and refuses new ones; the response callback sets s->device_lost (server_job.c), from
 * which /health/ready, /metrics' vkinfer_ready and new requests answer 503. This thread then
 * takes the manager away (as srv_destroy does), destroys it, and calls vki_engine_recover (the
 * device reopened, the model reloaded: seconds) until it succeeds, waiting recover_backoff_ms,
 * then twice that, ... up to 30 s between attempts; then a new manager serves and the server is
 * ready again. The engine handle, its tokenizer and chat template stay the same objects, so
 * handlers that hold them meanwhile (tokenising a request) are not disturbed. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "host/server/server.h"

#define MAX_BACKOFF_MS 30000u

/* Waits on s->cv until the stop flag or ms milliseconds (s->mu held). */
static void wait_ms(srv *s, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    while (!s->recover_stop && pthread_cond_timedwait(&s->cv, &s->mu, &ts) == 0)
        ;
}

/* One recovery: the manager goes, the engine comes back, a new manager; false when stopped. */
static bool recover_once(srv *s)
{
    vki_batch_manager *bm = s->bm;
    s->bm = NULL; /* submissions and cancels from now on see no manager */
    pthread_mutex_unlock(&s->mu);
    srv_bm_quiesce(s);
    vki_batch_manager_destroy(bm, true); /* nothing is left in it: the loss ended every request */
    pthread_mutex_lock(&s->mu);
    uint32_t wait = s->p.recover_backoff_ms;
    for (uint32_t attempt = 1;; attempt++) {
        wait_ms(s, wait);
        if (s->recover_stop)
            return false;
        pthread_mutex_unlock(&s->mu);
        char err[512] = "";
        vki_status st = vki_engine_recover(s->engine, err, sizeof err);
        if (st == VKI_OK && (st = srv_bm_create(s, &bm)) != VKI_OK)
            snprintf(err, sizeof err, "batch manager: %s", vki_status_str(st));
        if (st == VKI_OK)
            srv_log(s, VKI_LOG_WARN, "engine recreated after the device loss (attempt %u): ready again", attempt);
        else
            srv_log(s, VKI_LOG_ERROR, "recreating the engine after the device loss failed (attempt %u): %s; next "
                    "attempt in %.1f s", attempt, err, (wait < MAX_BACKOFF_MS / 2 ? 2 * wait : MAX_BACKOFF_MS) / 1e3);
        pthread_mutex_lock(&s->mu);
        if (st == VKI_OK) {
            s->bm = bm;
            s->device_lost = false;
            s->n_recovered++;
            return true;
        }
        wait = wait < MAX_BACKOFF_MS / 2 ? 2 * wait : MAX_BACKOFF_MS;
    }
}

static void *recover_main(void *arg)
{
    srv *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->recover_stop) {
        if (s->device_lost && s->bm && !s->draining) {
            srv_log(s, VKI_LOG_ERROR, "the GPU device was lost: recreating the engine");
            if (!recover_once(s))
                break;
            continue;
        }
        pthread_cond_wait(&s->cv, &s->mu); /* on_response broadcasts after setting device_lost */
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

vki_status srv_recover_start(srv *s)
{
    if (!s->p.recover_backoff_ms)
        return VKI_OK;
    if (pthread_create(&s->recover, NULL, recover_main, s) != 0)
        return VKI_ERR_OUT_OF_HOST_MEMORY;
    s->recover_started = true;
    return VKI_OK;
}

void srv_recover_stop(srv *s)
{
    if (!s->recover_started)
        return;
    pthread_mutex_lock(&s->mu);
    s->recover_stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->recover, NULL);
    s->recover_started = false;
}
