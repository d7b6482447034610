/* Device layer: instance, physical-device choice, logical device, memory sub-allocator,
 * staging ring, command buffers, debug names and labels. Knows nothing of models or requests.
 *
 * Threading: a vkd_device is used by one thread at a time (the engine's tick thread), except
 * for the validation counters, which are atomic. */
#ifndef VKI_ENGINE_DEVICE_H
#define VKI_ENGINE_DEVICE_H

#include <stdarg.h>
#include <stdatomic.h>
#include <vulkan/vulkan.h>

#include "vkinfer.h"

typedef struct vkd_device vkd_device;
typedef struct vkd_block vkd_block;

typedef enum vkd_mem {
    VKD_MEM_DEVICE = 0, /* device-local; not mappable in general */
    VKD_MEM_HOST = 1,   /* host-visible + coherent, persistently mapped (uploads, readbacks) */
} vkd_mem;

/* A buffer sub-allocated from a large VkDeviceMemory block. */
typedef struct vkd_buffer {
    VkBuffer buf;
    VkDeviceSize size;      /* bytes requested */
    VkDeviceSize mem_off;   /* offset of the buffer inside block memory */
    VkDeviceSize mem_size;  /* bytes reserved in the block (aligned) */
    vkd_block *block;
    void *mapped;           /* VKD_MEM_HOST: host pointer to byte 0; else NULL */
    vkd_mem kind;
} vkd_buffer;

/* What a shader binding sees: a byte range of a buffer. range == VK_WHOLE_SIZE: to the end.
 * Offsets must be multiples of minStorageBufferOffsetAlignment; ranges <= maxStorageBufferRange. */
typedef struct vkd_view {
    const vkd_buffer *buf;
    VkDeviceSize offset;
    VkDeviceSize range;
} vkd_view;

static inline vkd_view vkd_whole(const vkd_buffer *b) { return (vkd_view){b, 0, VK_WHOLE_SIZE}; }

/* Extension entry points, loaded per device (no globals). NULL when absent. */
typedef struct vkd_fns {
    PFN_vkSetDebugUtilsObjectNameEXT set_name;
    PFN_vkCmdBeginDebugUtilsLabelEXT label_begin;
    PFN_vkCmdEndDebugUtilsLabelEXT label_end;
    PFN_vkCmdPushDescriptorSetKHR push_descriptor;
    /* core 1.1; a pointer so that tests can stand in for a driver with VK_EXT_memory_budget */
    PFN_vkGetPhysicalDeviceMemoryProperties2 memory_properties2;
} vkd_fns;

struct vkd_kernels; /* engine/kernels.h */

/* The cooperative-matrix path of the GEMM and prefill-attention kernels (engine/ops_matmul.c,
 * engine/ops_attn.c). NONE: the FP32 kernels. NV: VK_NV_cooperative_matrix modules (tensor
 * cores). EMULATED: the same kernel sources compiled against shaders/coopmat.glsl's plain-GLSL
 * fragments, which round the operands to F16 as the hardware does (tests). */
typedef enum vkd_cm_kind {
    VKD_CM_NONE = 0,
    VKD_CM_NV = 1,
    VKD_CM_EMULATED = 2,
} vkd_cm_kind;

typedef struct vkd_cm {
    vkd_cm_kind kind;
    uint32_t m, n, k;  /* fragment shape: A m x k (F16), B k x n (F16), C m x n (F32) */
    uint32_t sg;       /* subgroup size the fragments are spread over */
} vkd_cm;

#define VKD_STAGING_SLOTS 2

struct vkd_device {
    VkInstance instance;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    VkCommandPool cmd_pool;
    VkDebugUtilsMessengerEXT messenger;
    vkd_fns fn;
    vki_device_info info;            /* what was detected at open */
    VkPhysicalDeviceMemoryProperties mem_props;
    uint32_t mem_type_device;        /* memory type index for VKD_MEM_DEVICE */
    uint32_t mem_type_host;          /* memory type index for VKD_MEM_HOST */

    /* memory sub-allocator: a list of blocks, first-fit free lists inside each */
    vkd_block *blocks;
    VkDeviceSize block_size;         /* default size of a new block */
    VkDeviceSize bytes_allocated[2]; /* live sub-allocations, by vkd_mem kind */
    VkDeviceSize heap_buffer_bytes[VK_MAX_MEMORY_HEAPS]; /* live sub-allocations, by heap */
    VkDeviceSize heap_block_bytes[VK_MAX_MEMORY_HEAPS];  /* VkDeviceMemory held, by heap */
    VkDeviceSize mem_limit;          /* 0: none; else live sub-allocations stay <= it */

    /* staging ring for uploads/readbacks outside of a step: VKD_STAGING_SLOTS equal slots of
     * one host-visible buffer, each with its command buffer and fence; an upload fills one
     * slot while the copy out of the other runs */
    vkd_buffer *staging;
    VkCommandBuffer staging_cmd[VKD_STAGING_SLOTS];
    VkFence staging_fence[VKD_STAGING_SLOTS];
    bool staging_busy[VKD_STAGING_SLOTS]; /* submitted, not yet waited for */
    uint32_t staging_next;                /* the slot the next chunk goes through */
    bool staging_stream;                  /* vkd_staging_stream: uploads return with copies in flight */
    uint32_t load_threads;                /* threads that fill staging slots while streaming (the
                                             caller included; vki_device_params.load_threads) */
    struct vk_pool *load_pool;            /* their workers, while streaming (NULL: the caller alone) */

    VkPipelineCache pipeline_cache;
    char pipeline_cache_path[512];
    struct vkd_kernels *kernels;     /* pipelines; created by vkd_kernels_create */

    /* validation / debug messenger: counts messages of severity warning and error */
    atomic_int n_validation_warnings;
    atomic_int n_validation_errors;

    vki_log_fn log;
    void *log_user;
    vki_log_level log_level;
    bool lost;                       /* sticky: VK_ERROR_DEVICE_LOST seen */
    uint64_t buffers_destroyed;      /* vkd_buffer_destroy calls: a command buffer recorded before
                                        the count changed may name a buffer that is gone, so
                                        vkd_cmd's reuse records it again */

    bool nv_coopmat;                 /* VK_NV_cooperative_matrix enabled at open */
    vkd_cm cm;                       /* the path the kernels take now (vkd_coopmat_select) */
    uint32_t gemv_max_m;             /* vki_device_params.gemv_max_m (0: ops_matmul's table) */
    uint32_t cm_tile_m, cm_tile_n;   /* the tensor-core GEMM's tile (0: ops_matmul's choice); set
                                        by bench-kernels --cm-cfg and the tests, before any
                                        GEMM is recorded */
    uint32_t cm_warp_m, cm_warp_n;   /* with a forced tile, its subgroups' tile (0: ops_matmul's
                                        for that tile); --cm-cfg BMxBNxWMxWN */
    uint32_t cm_stages;              /* its shared-memory buffers, 1 or 2 (0: 1; matmul_cm.comp's
                                        STAGES); bench-kernels --cm-stages and the tests */
    uint32_t cm_bk;                  /* its K per step, a multiple of the fragment's K up to 64
                                        (0: 32); bench-kernels --cm-bk and the tests */
    bool cm_x32;                     /* its callers hand it F32 X, converted in every tile's staging,
                                        not X rounded to F16 once (op_matmul_takes_xh false);
                                        kernel_config gemm_xh=0, the tests */
    bool cm_w4;                      /* its W staged 4 values per item, each decoding its block's
                                        scale, not 16 (matmul_cm.comp's W16 = 0); kernel_config
                                        gemm_w16=0, the tests */
    uint32_t matvec_mc;              /* its activation rows per pass when M > 1 (0: OP_MATVEC_ROWS);
                                        bench-kernels --matvec-cfg WGxRxMC and the tests */
    uint32_t matvec_wg, matvec_rows; /* the matrix-vector kernel's invocations and weight rows
                                        per workgroup (0: ops_matmul's choice); set by
                                        bench-kernels --matvec-cfg and the tests, before any
                                        recording */
    uint32_t matvec_mu;              /* its units of each row per K pass (0: 1); --matvec-cfg
                                        WGxRxMCxMU and the tests */
    uint32_t sample_loads;           /* the sampler's logits loaded per invocation at once (0:
                                        ops_sample's choice, GPUs 8, CPUs 1); kernel_config
                                        sample_loads=N, the tests */
    uint32_t attn_loads;             /* decode attention's keys per key group loaded together (0:
                                        ops_attn's choice, GPUs 2, CPUs 1); kernel_config
                                        attn_loads=N, the tests */
    uint32_t attn_split;             /* decode attention's keys per split at least (0: ops_attn's
                                        choice, GPUs 128, CPUs 64); kernel_config attn_split=N */
    uint32_t cm_split;               /* K splits of the tensor-core GEMM: 0 ops_matmul's choice,
                                        1 none, S: S where it fits (bench-kernels --cm-split, the
                                        tests) */
    /* the tensor-core GEMM's split-K scratch (ops_matmul.c), VKD_SPLIT_SLOTS slots, each of
     * split_part_bytes of partial tiles and VKD_SPLIT_TILES u32 tile counters (zero between
     * dispatches); created by op_matmul_prepare where GEMMs split, else at the first split */
    vkd_buffer *split_part, *split_cnt;
    VkDeviceSize split_part_bytes;
    bool split_failed;               /* creating it failed: GEMMs run unsplit */
};

/* ---- device -------------------------------------------------------------------------------- */

vki_status vkd_open(const vki_device_params *p, vkd_device **out);
void vkd_close(vkd_device *d);

/* Reads the heaps' sizes, and with info->memory_budget set their current budget and usage, into
 * *info through get (vkGetPhysicalDeviceMemoryProperties2 or a stand-in). */
void vkd_read_heaps(PFN_vkGetPhysicalDeviceMemoryProperties2 get, VkPhysicalDevice pd, vki_device_info *info);

/* Chooses the cooperative-matrix path (vkd_open calls it with the device params' mode; tests
 * switch between paths with it). AUTO: NV when it was enabled at open, else NONE. EMULATED:
 * VKI_ERR_UNSUPPORTED (path unchanged) without shaderFloat16, 16-bit storage or subgroup
 * shuffles. Pipelines already created for the previous path stay valid. */
vki_status vkd_coopmat_select(vkd_device *d, vki_coopmat_mode mode);

/* Log through the device's logger (printf format). */
void vkd_log(const vkd_device *d, vki_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Map a VkResult to a status, logging `what` on failure. VK_SUCCESS -> VKI_OK. */
vki_status vkd_check(vkd_device *d, VkResult r, const char *what);
#define VKD_TRY(d, call)                                                                        \
    do {                                                                                        \
        vki_status st_ = vkd_check((d), (call), #call);                                         \
        if (st_ != VKI_OK)                                                                      \
            return st_;                                                                         \
    } while (0)

/* Give a Vulkan object a debug name (no-op without VK_EXT_debug_utils). */
void vkd_name(vkd_device *d, VkObjectType type, uint64_t handle, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- memory -------------------------------------------------------------------------------- */

/* Bytes a new device-local buffer can still take now: with VK_EXT_memory_budget the heap's
 * current budget minus what is in use now (the driver's usage: other engines, other processes,
 * the application's own Vulkan work; less what this device holds in its blocks but has not handed
 * out); without it, the heap's size minus this device's buffers (other users are invisible).
 * Never more than what mem_limit leaves. O(heaps); one driver query. */
VkDeviceSize vkd_memory_available(vkd_device *d);

/* Creates a storage + transfer buffer of `size` bytes (size > 0). */
vki_status vkd_buffer_create(vkd_device *d, VkDeviceSize size, vkd_mem kind, const char *name,
                             vkd_buffer **out);
void vkd_buffer_destroy(vkd_device *d, vkd_buffer *b); /* NULL is fine */

/* Bytes of the host-visible staging ring vkd_upload / vkd_download go through. */
#define VKD_STAGING_BYTES (32u << 20)

/* Synchronous transfers through the staging ring (any size; chunked). Not for use while a
 * command buffer of this device is being recorded by the same thread... they submit their own. */
vki_status vkd_upload(vkd_device *d, vkd_buffer *dst, VkDeviceSize off, const void *src, size_t n);
/* The same with the bytes written by fill(ctx, at, out, n): bytes [at, at + n) of the upload
 * into out (a staging slot, or dst's mapping), in chunks of whole units of `unit` bytes
 * (n_bytes a multiple of unit, unit <= a staging slot): how weights are repacked on their way
 * to the device without a host copy of their own. While streaming with load_threads > 1, fill
 * runs on several threads at once over disjoint runs of whole units, in any order. */
typedef void (*vkd_fill_fn)(void *ctx, uint64_t at, void *out, uint64_t n);
vki_status vkd_upload_fill(vkd_device *d, vkd_buffer *dst, VkDeviceSize off, uint64_t n_bytes, uint64_t unit,
                           vkd_fill_fn fill, void *ctx);
/* Streaming (a model's load): while on, uploads return with their last copies in flight (the
 * source may be reused at once: it was copied into staging), so the next upload's fill overlaps
 * them, and the fills run on load_threads threads (workers started here, stopped at off). Off:
 * waits for them. vkd_staging_flush waits too and says whether they all went through
 * (a lost device shows here); every other staging transfer and vkd_buffer_destroy flush first. */
void vkd_staging_stream(vkd_device *d, bool on);
vki_status vkd_staging_flush(vkd_device *d);
vki_status vkd_download(vkd_device *d, const vkd_buffer *src, VkDeviceSize off, void *dst, size_t n);
/* Fill n bytes with a repeated 32-bit pattern (n multiple of 4). */
vki_status vkd_fill(vkd_device *d, vkd_buffer *dst, VkDeviceSize off, VkDeviceSize n, uint32_t word);

/* ---- command buffers ----------------------------------------------------------------------- */

#define VKD_LABEL_PATH 96
#define VKD_LABEL_DEPTH 8

typedef struct vkd_reuse vkd_reuse;

/* Split-K GEMMs recorded between two compute barriers each take their own scratch slot (the
 * projections of one input run concurrently); past VKD_SPLIT_SLOTS they do not split. */
#define VKD_SPLIT_SLOTS 4u
#define VKD_SPLIT_TILES 4096u

typedef struct vkd_cmd {
    vkd_device *d;
    VkCommandBuffer cb;      /* recorded without reuse; with it the reuse slots hold their own */
    VkFence fence;
    bool recording;
    bool pending;            /* submitted, not yet waited */
    uint32_t n_dispatches, n_barriers; /* recorded since vkd_cmd_begin (what a step costs) */
    uint32_t split_slots;    /* split-K scratch slots taken since the last compute barrier (or the
                                begin: command buffers that may overlap on the queue begin
                                with a barrier, as the engine's steps do) */
    /* Every command is first written as a record (engine/cmd.c) into ops. Without reuse each is
     * handed to the driver at once; with reuse (vkd_cmd_enable_reuse) the recording is a stream
     * that vkd_cmd_submit compares with the streams of the command buffers it already holds: an
     * identical one (same pipelines, bindings, push constants, groups, barriers, copies and
     * labels) is submitted again without recording anything, else the least recently used slot
     * is recorded from the stream. Never while profiling (timestamps are per recording). */
    uint8_t *ops;
    size_t n_ops, cap_ops;   /* bytes */
    vki_status ops_status;   /* not VKI_OK: a record could not be written; the submit fails */
    vkd_reuse *reuse;
    bool streaming;          /* this recording goes to ops (reuse on, profiling off) */
    uint64_t reuse_hits, reuse_misses; /* submits that did / did not find their stream */
    /* profiling (optional): timestamps around every dispatch */
    VkQueryPool queries;
    uint32_t n_queries, max_queries;
    char (*query_names)[VKD_LABEL_PATH]; /* [max_queries / 2] "label / label / role / kernel" */
    const char **query_roles;            /* [max_queries / 2] the role of each timed dispatch */
    /* what the next dispatches compute ("attn_q"), set by vkd_role; names their debug label
     * "role / kernel". A string with static storage; NULL after vkd_cmd_begin. */
    const char *role;
    /* the open debug labels, joined by " / " (kept only while profiling) */
    char label_path[VKD_LABEL_PATH];
    uint32_t label_len[VKD_LABEL_DEPTH]; /* label_path length before each open label */
    uint32_t label_depth;
} vkd_cmd;

/* dst = a + " / " + b (the other alone when one is empty), truncated to cap - 1 bytes: label paths. */
void vkd_join_label(char *dst, size_t cap, const char *a, const char *b);

/* Reads the timestamps of the last completed submission: *n dispatches, begin/end in ns (on the
 * device's clock) and names. Returns VKI_OK with *n = 0 when profiling is off. */
vki_status vkd_cmd_read_profile(vkd_cmd *c, uint64_t *begin_ns, uint64_t *end_ns, uint32_t cap, uint32_t *n);

vki_status vkd_cmd_create(vkd_device *d, const char *name, vkd_cmd *out);
void vkd_cmd_destroy(vkd_cmd *c);
/* Enable per-dispatch GPU timestamps for up to max_dispatches dispatches per recording. */
vki_status vkd_cmd_enable_profiling(vkd_cmd *c, uint32_t max_dispatches);
/* Keep up to n_slots (1..VKD_REUSE_MAX_SLOTS) recorded command buffers and resubmit one whenever
 * a recording repeats it (see vkd_cmd). Recordings that differ only in what the buffers hold
 * (the step inputs, the weights) repeat; so a decode step of the same batch shape costs a
 * comparison instead of a driver recording. Has no effect while profiling. */
#define VKD_REUSE_MAX_SLOTS 16
vki_status vkd_cmd_enable_reuse(vkd_cmd *c, uint32_t n_slots);
vki_status vkd_cmd_begin(vkd_cmd *c);
vki_status vkd_cmd_submit(vkd_cmd *c);           /* end + submit; does not wait */
vki_status vkd_cmd_wait(vkd_cmd *c);             /* waits for the last submit */
vki_status vkd_cmd_submit_wait(vkd_cmd *c);
/* Ends a recording without submitting it (after an error while recording). */
void vkd_cmd_abort(vkd_cmd *c);

/* Compute->compute memory barrier (shader writes visible to later shader reads/writes). */
void vkd_barrier(vkd_cmd *c);
/* Transfer->compute and compute->transfer barriers around copies recorded in a step. */
void vkd_barrier_transfer_to_compute(vkd_cmd *c);
void vkd_barrier_compute_to_transfer(vkd_cmd *c);
/* Shader writes visible to the host after the submission's fence (mapped results). */
void vkd_barrier_compute_to_host(vkd_cmd *c);
/* Any memory barrier, counted in n_barriers (kv_io's transfer barriers). */
void vkd_barrier_ex(vkd_cmd *c, VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                    VkAccessFlags dst_access);
void vkd_copy(vkd_cmd *c, const vkd_buffer *src, VkDeviceSize src_off, const vkd_buffer *dst,
              VkDeviceSize dst_off, VkDeviceSize n);
/* Binds p, pushes n_bind storage-buffer descriptors (set 0, bindings 0..n_bind-1) and push_size
 * bytes of push constants (<= VKD_MAX_PUSH), then dispatches (g[0], g[1], g[2]) groups or, when
 * indirect is not VK_NULL_HANDLE, the VkDispatchIndirectCommand at indirect_off. The one place a
 * dispatch reaches the driver (engine/kernels.c checks and labels it). */
#define VKD_MAX_PUSH 128
void vkd_dispatch_raw(vkd_cmd *c, VkPipeline p, VkPipelineLayout layout, const VkDescriptorBufferInfo *bind,
                      uint32_t n_bind, const void *push, uint32_t push_size, const uint32_t g[3], VkBuffer indirect,
                      VkDeviceSize indirect_off);

void vkd_label_begin(vkd_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for the label "a / b" (or either alone when the other is NULL or empty), without the
 * printf: every dispatch of every step opens one while debug labels are on, and vsnprintf was
 * ~40% of a reused decode step's host time (callgrind, 32 layers). */
void vkd_label_begin_join(vkd_cmd *c, const char *a, const char *b);
/* ... and the label "prefix n" ("layer 17"), formatted only while labels are on. */
void vkd_label_begin_n(vkd_cmd *c, const char *prefix, uint32_t n);
/* Names what the following dispatches compute, until the next call: their debug labels (RenderDoc,
 * Nsight) and profile events read "role / kernel" ("attn_q / matvec_q4_k"). role: a string
 * literal (kept by pointer). One store; free when not profiling or capturing. */
static inline void vkd_role(vkd_cmd *c, const char *role) { c->role = role; }
void vkd_label_end(vkd_cmd *c);

#endif
