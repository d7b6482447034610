/* Profile mode: GPU timestamps around every dispatch of every step (vkd_cmd's query pool),
 * written as a Chrome trace and tabulated by role and kernel.
 *
 * Each dispatch's debug-label path is "step N / layer L / role / kernel" (the forward pass sets
 * the role on the command recorder before each op, vkd_role). In the trace an event is named
 * "layer L / role / kernel", its category is "step N", and its track (tid) is the step phase the
 * role belongs to: embed, attention, ffn, lm head, sample. The summary keeps decode steps (one
 * token per sequence) apart from the others (prompt chunks, alone or beside decoding sequences),
 * whose matmuls run other kernels at other shapes. Cost: one fprintf per dispatch and a linear
 * search of the summary table (a few dozen role/kernel pairs) per dispatch. */
#ifndef VKI_ENGINE_PROFILE_H
#define VKI_ENGINE_PROFILE_H

#include <stdio.h>

#include "engine/device.h"

#define VK_PROFILE_MAX 16384 /* dispatches timed per step */
#define VK_PROFILE_KEY 64

/* Step kinds in the summary. */
enum { VK_PROFILE_DECODE, VK_PROFILE_PROMPT, VK_PROFILE_KINDS };

typedef struct vk_profile_row {
    char key[VK_PROFILE_KEY];       /* "role / kernel" (just the kernel when no role was set) */
    uint32_t kind;                  /* the steps it was timed in: VK_PROFILE_DECODE or _PROMPT */
    uint64_t calls, ns;
} vk_profile_row;

typedef struct vk_profile {
    FILE *trace;                    /* the Chrome trace, or NULL when profiling is off */
    uint64_t t0_ns;                 /* device time of the first traced dispatch */
    uint64_t *ns;                   /* [2 * VK_PROFILE_MAX] begin/end scratch */
    uint64_t n_events;
    vk_profile_row *rows;           /* [n_rows] the summary, unsorted */
    uint32_t n_rows, cap_rows;
    uint64_t step_ns[VK_PROFILE_KINDS]; /* sum over steps of first dispatch begin .. last end */
    uint64_t n_steps[VK_PROFILE_KINDS];
} vk_profile;

/* Opens path, writes the track names and turns on c's timestamps. */
vki_status vk_profile_open(vk_profile *p, vkd_cmd *c, const char *path);
/* Appends the dispatches of c's last completed submission (step `step`, with n_tokens tokens of
 * n_seqs sequences) to the trace and the summary. */
vki_status vk_profile_step(vk_profile *p, vkd_cmd *c, uint64_t step, uint32_t n_tokens, uint32_t n_seqs);
/* Closes the trace (valid JSON from then on) and frees everything; p is zeroed. */
void vk_profile_close(vk_profile *p);
/* The summary table, most GPU time first; see vki_engine_profile_summary. */
vki_status vk_profile_summary(const vk_profile *p, uint32_t max_rows, char *buf, size_t cap, size_t *n_out);

#endif
