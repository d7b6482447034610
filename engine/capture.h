/* RenderDoc captures of chosen steps through RenderDoc's in-app API (renderdoc_app.h, Debian's
 * librenderdoc-dev, needed at build time only). vkinfer never loads RenderDoc: the API is found
 * only when RenderDoc already is in the process (`renderdoccmd capture`, or a launch from its UI,
 * preloads librenderdoc.so); otherwise capturing is a logged no-op. A headless compute program
 * has no frame boundary, so the engine makes one: capture starts before step `first` is recorded
 * and ends after step `last` completed. */
#ifndef VKI_ENGINE_CAPTURE_H
#define VKI_ENGINE_CAPTURE_H

#include "engine/device.h"

typedef struct vk_capture {
    void *api;                      /* RENDERDOC_API_1_1_2 *, NULL when not under RenderDoc */
    void *lib;                      /* dlopen handle of the already-loaded librenderdoc.so */
    int64_t first, last;            /* steps to capture; first < 0: off */
    bool active;                    /* between StartFrameCapture and EndFrameCapture */
} vk_capture;

/* Looks for RenderDoc when first >= 0 (logs what it found at INFO). Never fails. */
void vk_capture_init(vk_capture *c, vkd_device *d, int64_t first, int64_t last);
/* Before recording step `step` / after it completed: start / end the capture at the bounds. */
void vk_capture_before_step(vk_capture *c, vkd_device *d, uint64_t step);
void vk_capture_after_step(vk_capture *c, vkd_device *d, uint64_t step);
/* Ends an open capture (the engine stopped before `last`) and lets go of RenderDoc. */
void vk_capture_close(vk_capture *c, vkd_device *d);

#endif
