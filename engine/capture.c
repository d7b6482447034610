/* RenderDoc in-app API captures (see capture.h). */
#include "engine/capture.h"

#include <string.h>

#ifdef VKI_HAVE_RENDERDOC_APP
#include <dlfcn.h>
#include <renderdoc_app.h>

/* RenderDoc identifies a Vulkan "device" by the instance's dispatch table pointer. */
static void *rd_device(vkd_device *d) { return RENDERDOC_DEVICEPOINTER_FROM_VKINSTANCE(d->instance); }

void vk_capture_init(vk_capture *c, vkd_device *d, int64_t first, int64_t last)
{
    memset(c, 0, sizeof *c);
    c->first = first;
    c->last = last < first ? first : last;
    if (first < 0)
        return;
    /* RTLD_NOLOAD: only a librenderdoc.so that is already in the process, never a new load */
    c->lib = dlopen("librenderdoc.so", RTLD_NOW | RTLD_NOLOAD);
    pRENDERDOC_GetAPI get = c->lib ? (pRENDERDOC_GetAPI)dlsym(c->lib, "RENDERDOC_GetAPI") : NULL;
    RENDERDOC_API_1_1_2 *api = NULL;
    if (!get || get(eRENDERDOC_API_Version_1_1_2, (void **)&api) != 1 || !api) {
        vkd_log(d, VKI_LOG_INFO, "capture of steps %lld-%lld: not running under RenderDoc, nothing captured "
                "(run under `renderdoccmd capture`)", (long long)c->first, (long long)c->last);
        if (c->lib)
            dlclose(c->lib);
        c->lib = NULL;
        return;
    }
    c->api = api;
    vkd_log(d, VKI_LOG_INFO, "RenderDoc found: steps %lld-%lld will be captured", (long long)c->first,
            (long long)c->last);
}

void vk_capture_before_step(vk_capture *c, vkd_device *d, uint64_t step)
{
    if (!c->api || c->active || (int64_t)step != c->first)
        return;
    ((RENDERDOC_API_1_1_2 *)c->api)->StartFrameCapture(rd_device(d), NULL);
    c->active = true;
}

void vk_capture_after_step(vk_capture *c, vkd_device *d, uint64_t step)
{
    if (!c->active || (int64_t)step < c->last)
        return;
    c->active = false;
    if (((RENDERDOC_API_1_1_2 *)c->api)->EndFrameCapture(rd_device(d), NULL) == 1)
        vkd_log(d, VKI_LOG_INFO, "RenderDoc captured steps %lld-%llu", (long long)c->first, (unsigned long long)step);
    else
        vkd_log(d, VKI_LOG_WARN, "RenderDoc could not finish the capture of steps %lld-%llu", (long long)c->first,
                (unsigned long long)step);
}

void vk_capture_close(vk_capture *c, vkd_device *d)
{
    if (c->active)
        vk_capture_after_step(c, d, (uint64_t)c->last);
    if (c->lib)
        dlclose(c->lib);
    memset(c, 0, sizeof *c);
}

#else /* built without renderdoc_app.h: capturing is a logged no-op */

void vk_capture_init(vk_capture *c, vkd_device *d, int64_t first, int64_t last)
{
    memset(c, 0, sizeof *c);
    if (first >= 0)
        vkd_log(d, VKI_LOG_WARN, "capture of steps %lld-%lld: this build has no RenderDoc support "
                "(renderdoc_app.h was absent; Debian: apt-get install librenderdoc-dev, then rebuild)",
                (long long)first, (long long)(last < first ? first : last));
}

void vk_capture_before_step(vk_capture *c, vkd_device *d, uint64_t step) { (void)c, (void)d, (void)step; }
void vk_capture_after_step(vk_capture *c, vkd_device *d, uint64_t step) { (void)c, (void)d, (void)step; }
void vk_capture_close(vk_capture *c, vkd_device *d) { (void)d, memset(c, 0, sizeof *c); }

#endif
