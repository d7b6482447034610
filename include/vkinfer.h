/* vkinfer: portable LLM inference on Vulkan.  The one public header.
 *
 * Conventions (see README "API"):
 *  - every exported symbol carries the vki_ prefix; handles are opaque;
 *  - params structs come with a vki_*_default_params() function: take the defaults, change what
 *    you need, pass a pointer;
 *  - every fallible call returns vki_status: VKI_OK (0) on success, > 0 for a retryable
 *    condition (the call had no effect; try again later), < 0 for an error (the call had no
 *    effect and any partially created object was released);
 *  - no global state: two engines on two devices in one process are independent;
 *  - the library never calls exit()/abort(); it reports through statuses and the log callback.
 */
#ifndef VKINFER_H
#define VKINFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------ */

typedef enum vki_status {
    VKI_OK = 0,
    VKI_RETRY_QUEUE_FULL = 1,       /* the request queue is at max_queue; nothing was queued */
    VKI_ERR_INVALID_ARG = -1,       /* a parameter is out of range; the message names it */
    VKI_ERR_OUT_OF_HOST_MEMORY = -2,
    VKI_ERR_OUT_OF_DEVICE_MEMORY = -3,
    VKI_ERR_DEVICE_LOST = -4,       /* the Vulkan device was lost; the engine must be recreated */
    VKI_ERR_NO_DEVICE = -5,         /* no (matching) Vulkan device */
    VKI_ERR_VULKAN = -6,            /* any other Vulkan failure */
    VKI_ERR_IO = -7,                /* file could not be opened / read / written */
    VKI_ERR_FORMAT = -8,            /* a file is malformed (GGUF); the message names where */
    VKI_ERR_UNSUPPORTED = -9,       /* valid but unsupported: architecture, tensor type, feature */
    VKI_ERR_DUPLICATE_ID = -10,     /* a request with this id is in flight */
    VKI_ERR_NOT_FOUND = -11,        /* no such request / key / tensor */
    VKI_ERR_SHUTDOWN = -12,         /* the object is shutting down; no new work is taken */
    VKI_ERR_INTERNAL = -13,         /* an invariant broke: a bug, please report it */
} vki_status;

/* Short constant English text for a status, e.g. "out of device memory". Never NULL. */
const char *vki_status_str(vki_status st);

/* ---- logging ----------------------------------------------------------------------------- */

typedef enum vki_log_level {
    VKI_LOG_ERROR = 0,
    VKI_LOG_WARN = 1,
    VKI_LOG_INFO = 2,
    VKI_LOG_DEBUG = 3,
} vki_log_level;

/* Called from any thread that does library work; must be thread-safe. msg has no newline. */
typedef void (*vki_log_fn)(void *user, vki_log_level level, const char *msg);

/* ---- devices ----------------------------------------------------------------------------- */

typedef enum vki_device_type {
    VKI_DEVICE_OTHER = 0,
    VKI_DEVICE_INTEGRATED = 1,
    VKI_DEVICE_DISCRETE = 2,
    VKI_DEVICE_VIRTUAL = 3,
    VKI_DEVICE_CPU = 4,
} vki_device_type;

/* Subgroup operation bits (mirror VkSubgroupFeatureFlagBits). */
enum {
    VKI_SUBGROUP_BASIC = 1u << 0,
    VKI_SUBGROUP_VOTE = 1u << 1,
    VKI_SUBGROUP_ARITHMETIC = 1u << 2,
    VKI_SUBGROUP_BALLOT = 1u << 3,
    VKI_SUBGROUP_SHUFFLE = 1u << 4,
    VKI_SUBGROUP_SHUFFLE_RELATIVE = 1u << 5,
    VKI_SUBGROUP_CLUSTERED = 1u << 6,
    VKI_SUBGROUP_QUAD = 1u << 7,
};

#define VKI_MAX_HEAPS 16
#define VKI_MAX_COOPMAT 32

/* One VK_KHR_cooperative_matrix configuration (component types are VkComponentTypeKHR). */
typedef struct vki_coopmat_shape {
    uint32_t m, n, k;
    uint32_t a_type, b_type, c_type, result_type;
    bool saturating;
    uint32_t scope; /* VkScopeKHR; 3 = subgroup */
} vki_coopmat_shape;

/* What `vkinfer info` prints: identity, features and limits of one physical device. */
typedef struct vki_device_info {
    uint32_t index;                 /* position in vkEnumeratePhysicalDevices order */
    char name[256];
    vki_device_type type;
    uint32_t vendor_id, device_id;
    uint32_t api_version;           /* VK_MAKE_API_VERSION encoding */
    uint32_t driver_version;        /* vendor encoding */
    char driver_name[256];          /* VkPhysicalDeviceDriverProperties (empty if unknown) */
    char driver_info[256];
    uint8_t uuid[16];

    /* features */
    bool float16;                   /* shaderFloat16 */
    bool int8;                      /* shaderInt8 */
    bool int16, int64;
    bool storage16;                 /* storageBuffer16BitAccess */
    bool storage8;                  /* storageBuffer8BitAccess */
    bool integer_dot;               /* VK_KHR_shader_integer_dot_product */
    bool push_descriptor;           /* VK_KHR_push_descriptor (required by vkinfer) */
    bool debug_utils;               /* VK_EXT_debug_utils (instance) */
    bool timestamps;                /* compute queue timestampValidBits > 0 */
    float timestamp_period_ns;
    uint32_t subgroup_size;
    uint32_t subgroup_min_size, subgroup_max_size; /* subgroup size control; 0 if absent */
    uint32_t subgroup_ops;          /* VKI_SUBGROUP_* bits supported in compute */
    bool coopmat;                   /* VK_KHR_cooperative_matrix */
    uint32_t n_coopmat;
    vki_coopmat_shape coopmat_shapes[VKI_MAX_COOPMAT];

    /* limits */
    uint64_t max_storage_buffer_range;
    uint64_t max_memory_allocation_size;
    uint64_t min_storage_buffer_offset_alignment;
    uint32_t max_push_constants_size;
    uint32_t max_compute_shared_memory;
    uint32_t max_workgroup_invocations;
    uint32_t max_workgroup_size[3];
    uint32_t max_workgroup_count[3];

    /* memory */
    uint32_t n_heaps;
    uint64_t heap_size[VKI_MAX_HEAPS];
    bool heap_device_local[VKI_MAX_HEAPS];
    uint64_t heap_budget[VKI_MAX_HEAPS]; /* VK_EXT_memory_budget, else heap_size */
} vki_device_info;

/* Lists the Vulkan devices. *n_out receives the number found (which may exceed cap; only
 * min(cap, found) entries are written). Returns VKI_ERR_NO_DEVICE when no Vulkan loader or
 * device exists. */
vki_status vki_list_devices(vki_device_info *out, uint32_t cap, uint32_t *n_out);

/* Device choice: discrete NVIDIA first, then other discrete, integrated, virtual, CPU.
 * device_index >= 0 or a non-empty device_name (case-insensitive substring) override it. */
typedef struct vki_device_params {
    int device_index;               /* -1: automatic */
    const char *device_name;        /* NULL: automatic */
    bool validation;                /* enable VK_LAYER_KHRONOS_validation + a debug messenger */
    const char *pipeline_cache_dir; /* NULL: $XDG_CACHE_HOME/vkinfer or ~/.cache/vkinfer;
                                       "" disables the on-disk pipeline cache */
    vki_log_fn log;                 /* NULL: warnings and errors to stderr */
    void *log_user;
    vki_log_level log_level;        /* messages above this level are dropped */
} vki_device_params;

vki_device_params vki_device_default_params(void);

/* ---- sampling ---------------------------------------------------------------------------- */

typedef struct vki_logit_bias {
    int32_t token;
    float bias;                     /* added to the logit before temperature; -INFINITY bans */
} vki_logit_bias;

/* Per-request sampling. Applied on the GPU in this order: penalties over the last
 * penalty_window tokens of the sequence, logit bias, temperature, top-k, top-p, min-p, draw.
 * Randomness is keyed by (seed, position): a request's tokens do not depend on its batch. */
typedef struct vki_sampling_params {
    float temperature;              /* >= 0; 0 = greedy (argmax, lowest id on ties) */
    int32_t top_k;                  /* >= 0; 0 = off */
    float top_p;                    /* (0, 1]; 1 = off */
    float min_p;                    /* [0, 1]; 0 = off */
    float repetition_penalty;       /* > 0; 1 = off (logit/p if > 0 else logit*p) */
    float presence_penalty;         /* [-2, 2]; 0 = off */
    float frequency_penalty;        /* [-2, 2]; 0 = off */
    uint32_t penalty_window;        /* tokens the penalties look back over (prompt included) */
    bool has_seed;                  /* false: a seed is drawn at submission and reported back */
    uint64_t seed;
    const vki_logit_bias *logit_bias; /* [n_logit_bias], copied at submission */
    uint32_t n_logit_bias;
    bool logprobs;                  /* return the chosen token's log-probability */
    uint32_t top_logprobs;          /* 0..20 most likely alternatives per position */
} vki_sampling_params;

/* temperature 1, top_k 0, top_p 1, min_p 0, no penalties (window 64), random seed, no logprobs. */
vki_sampling_params vki_sampling_default_params(void);

#ifdef __cplusplus
}
#endif
#endif /* VKINFER_H */
