/* vkinfer: portable LLM inference on Vulkan.  The one public header.
 *
 * Conventions (see README "API"):
 *  - every exported symbol carries the vki_ prefix; handles are opaque;
 *  - params structs come with a vki_*_default_params() function: take the defaults, change what
 *    you need, pass a pointer;
 *  - every fallible call returns vki_status: VKI_OK (0) on success, > 0 for a retryable
 *    condition (the call had no effect; try again later), < 0 for an error (the call had no
 *    effect and any partially created object was released);
 *  - no global state: two engines (on two devices, or on one) in one process are independent;
 *  - the library never calls exit()/abort() and prints nothing by itself: it reports through
 *    statuses, error strings, the log callback and the progress callback the caller passes.
 *
 * Two levels (see README "Embedding"):
 *  - the simple API: vki_engine_create, vki_batch_manager_create, then vki_generate /
 *    vki_generate_chat (blocking, a text callback, stop strings, cancellation);
 *  - the full API: the batch manager's push and callback interfaces, in token ids, with the
 *    tokenizer, text streaming and chat templates as separate pieces.
 */
#ifndef VKINFER_H
#define VKINFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every exported function is marked VKI_API; the shared library hides everything else. */
#if defined(_WIN32)
#define VKI_API
#else
#define VKI_API __attribute__((visibility("default")))
#endif

/* ---- version ----------------------------------------------------------------------------- */

/* The version of this header (semantic versioning; while MAJOR is 0 a MINOR step may change the
 * API). CMake reads these three lines: they are the one place the version is written. */
#define VKI_VERSION_MAJOR 0
#define VKI_VERSION_MINOR 2
#define VKI_VERSION_PATCH 0

/* The version of the library actually linked, "MAJOR.MINOR.PATCH": compare it with the macros to
 * catch a program built against another header. Never NULL. */
VKI_API const char *vki_version(void);

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
    VKI_ERR_CANCELLED = -14,        /* the caller cancelled (a progress callback returned false) */
    VKI_ERR_NONFINITE = -15,        /* the model produced NaN or +inf logits (broken or misread
                                       weights, or a logits post-processor wrote them) */
} vki_status;

/* Short constant English text for a status, e.g. "out of device memory". Never NULL. */
VKI_API const char *vki_status_str(vki_status st);

/* ---- logging ----------------------------------------------------------------------------- */

typedef enum vki_log_level {
    VKI_LOG_ERROR = 0,
    VKI_LOG_WARN = 1,
    VKI_LOG_INFO = 2,
    VKI_LOG_DEBUG = 3,
} vki_log_level;

/* Called from any thread that does library work; must be thread-safe. msg has no newline. */
typedef void (*vki_log_fn)(void *user, vki_log_level level, const char *msg);

/* Progress of a long operation (uploading a model's weights): done of total bytes, called on the
 * thread doing it, about once per percent. Return false to cancel: the operation then fails with
 * VKI_ERR_CANCELLED and releases what it had made. */
typedef bool (*vki_progress_fn)(void *user, uint64_t done, uint64_t total);

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

/* One cooperative-matrix configuration of VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix
 * (component types are VkComponentTypeKHR, whose values the NV enum shares: 0 = float16,
 * 1 = float32). */
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
    bool integer_dot_accel;         /* ... and its signed 4x8-bit packed dot product is accelerated
                                       (integerDotProduct4x8BitPackedSignedAccelerated) */
    bool memory_model;              /* vulkanMemoryModel with vulkanMemoryModelDeviceScope: enabled
                                       at open wherever present (the NV tensor-core modules need
                                       it), so every device validates the kernels under it */
    bool push_descriptor;           /* VK_KHR_push_descriptor (required by vkinfer) */
    bool debug_utils;               /* VK_EXT_debug_utils (instance) */
    bool timestamps;                /* compute queue timestampValidBits > 0 */
    float timestamp_period_ns;
    uint32_t subgroup_size;
    uint32_t subgroup_min_size, subgroup_max_size; /* subgroup size control; 0 if absent */
    uint32_t subgroup_ops;          /* VKI_SUBGROUP_* bits supported in compute */
    uint32_t compute_units;         /* streaming multiprocessors (VK_NV_shader_sm_builtins) or
                                       compute units (VK_AMD_shader_core_properties); 0 if the
                                       driver does not say. Sizes the GEMMs' split-K */
    bool coopmat;                   /* VK_KHR_cooperative_matrix */
    uint32_t n_coopmat;
    vki_coopmat_shape coopmat_shapes[VKI_MAX_COOPMAT];
    bool coopmat_nv;                /* VK_NV_cooperative_matrix, what the tensor-core kernels use */
    uint32_t n_coopmat_nv;
    vki_coopmat_shape coopmat_nv_shapes[VKI_MAX_COOPMAT];
    /* The shape vkinfer's cooperative-matrix kernels use on this device with VKI_COOPMAT_AUTO:
     * an NV subgroup shape with F16 A/B and F32 C/result (needs shaderFloat16, 16-bit storage and
     * the Vulkan memory model too). m = 0: none, the FP32 kernels run. */
    vki_coopmat_shape coopmat_pick;

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
    bool memory_budget;             /* VK_EXT_memory_budget: heap_budget / heap_usage are live */
    uint64_t heap_budget[VKI_MAX_HEAPS]; /* what this process may use now (VK_EXT_memory_budget;
                                       other processes taken into account), else heap_size */
    uint64_t heap_usage[VKI_MAX_HEAPS];  /* what this process uses now (VK_EXT_memory_budget),
                                       else 0 */
} vki_device_info;

/* Lists the Vulkan devices. *n_out receives the number found (which may exceed cap; only
 * min(cap, found) entries are written). Returns VKI_ERR_NO_DEVICE when no Vulkan loader or
 * device exists. Prints nothing. */
VKI_API vki_status vki_list_devices(vki_device_info *out, uint32_t cap, uint32_t *n_out);

/* Which kernels run the matrix multiplies of prefill (and of decode with many sequences) and
 * prefill attention; see the README "Numerics". */
typedef enum vki_coopmat_mode {
    /* Tensor cores where the device offers F16 x F16 -> F32 cooperative matrices through
     * VK_NV_cooperative_matrix (coopmat_pick): operands rounded to F16, F32 accumulation.
     * Elsewhere the exact FP32 kernels. */
    VKI_COOPMAT_AUTO = 0,
    VKI_COOPMAT_OFF = 1,      /* the FP32 kernels on every device */
    /* The cooperative-matrix kernels compiled against a plain-GLSL emulation (fragments spread
     * over the subgroup, the same F16 rounding): any device with shaderFloat16, 16-bit storage
     * and subgroup shuffles. Slower than either real path: for tests of the tensor-core kernels
     * on machines without them. */
    VKI_COOPMAT_EMULATED = 2,
} vki_coopmat_mode;

/* vki_engine_params.int_dot: the decode projections' integer-dot path. */
typedef enum vki_int_dot_mode {
    /* On where the driver says 4x8-bit packed dot products are accelerated
     * (vki_device_info.integer_dot_accel: NVIDIA; measured on an H200, an 8B Q4_K_M model: 1.31x
     * batch-1 and 1.80x 16-sequence decode tokens/s, Q8_0 1.23x and 1.89x), off elsewhere
     * (lavapipe, whose "dot products" are scalar code, and CPUs). */
    VKI_INT_DOT_AUTO = 0,
    VKI_INT_DOT_ON = 1,  /* wherever the device has integer dot products (Vulkan 1.3) */
    VKI_INT_DOT_OFF = 2, /* the float path everywhere */
} vki_int_dot_mode;

/* Device choice: discrete NVIDIA first, then other discrete, integrated, virtual, CPU.
 * device_index >= 0 or a non-empty device_name (case-insensitive substring) override it. */
typedef struct vki_device_params {
    int device_index;               /* -1: automatic */
    const char *device_name;        /* NULL: automatic */
    bool validation;                /* enable VK_LAYER_KHRONOS_validation + a debug messenger */
    const char *pipeline_cache_dir; /* NULL: $XDG_CACHE_HOME/vkinfer or ~/.cache/vkinfer;
                                       "" disables the on-disk pipeline cache */
    vki_log_fn log;                 /* NULL: messages are dropped (the library prints nothing);
                                       the calls that fail still say why in their err text */
    void *log_user;
    vki_log_level log_level;        /* messages above this level are dropped */
    vki_coopmat_mode coopmat;       /* VKI_COOPMAT_AUTO */
    /* Matrix multiplies with at most this many activation rows take the matrix-vector kernel
     * (weights read from memory once per 32 rows), more rows the tiled GEMM. 0: the crossover measured for
     * this kind of device and path (bench-kernels --crossover measures it; engine/ops_matmul.c
     * holds the table). */
    uint32_t gemv_max_m;
    /* NULL or "": the library's kernel choices. Otherwise comma-separated key=value settings of
     * the matrix kernels, for tuning on a GPU (bench-kernels' sweeps find them) and experiments:
     *   matvec=WGxROWS[xMC[xMU]]   the matrix-vector kernel's invocations x weight rows per
     *                              workgroup [x activation rows per pass [x units per K pass]]
     *   gemm=BMxBN[xWMxWN]         the tensor-core GEMM's tile [and its subgroups' tile]
     *   gemm_stages=1|2            its shared-memory buffers (2: the next K step's loads in
     *                              flight during this step's products)
     *   gemm_bk=16|32|48|64        its K per step
     *   gemm_split=N               its K splits (1: none)
     *   gemm_xh=0|1                its X rounded to F16 once before the product (1, the
     *                              default) or converted in every tile (0); the same bits
     *   gemm_w16=0|1               its W staged 16 values at a time, one scale decode for them
     *                              (1, the default), or 4 (0); the same bits
     *   gemv_max_m=M               the most activation rows the matrix-vector kernel takes
     *   attn_split=N               decode attention's keys per split at least (16..65536, a
     *                              multiple of 16; more splits fill more of a GPU at short
     *                              contexts, each adds a partial to merge)
     *   attn_loads=N               decode attention's keys per key group loaded together (1..8;
     *                              GPUs 2, CPUs 1; the same bits for any N)
     *   sample_loads=N             the sampler's logits loaded per invocation at once (1..16;
     *                              GPUs 8, CPUs 1; the same bits for any N)
     * e.g. "matvec=128x4x8x2,gemm=128x128x64x64,gemm_stages=2". MU, stages and K steps give the
     * same bits as the defaults; workgroup and tile shapes and attention splits change the order
     * of additions. An unknown key, a bad value or GEMM settings this device cannot run fail the
     * open (VKI_ERR_INVALID_ARG, the item named). */
    const char *kernel_config;
    /* Threads that copy (and repack) weights into the staging buffers while a model loads, the
     * loading thread included; at most 8 (more counts as 8). 0: one per core, up to 8. */
    uint32_t load_threads;
} vki_device_params;

VKI_API vki_device_params vki_device_default_params(void);

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

/* Greedy, as `vkinfer generate` without --temp: temperature 0, top_k 0, top_p 1, min_p 0, no
 * penalties (window 64), random seed (used once temperature > 0), no logprobs. The HTTP server
 * starts from temperature 1 instead, the OpenAI API's default. */
VKI_API vki_sampling_params vki_sampling_default_params(void);

/* ---- structured output ------------------------------------------------------------------- */

/* A request may constrain what it generates to a grammar: at every step only the tokens that
 * keep the text a prefix of the grammar's language can be sampled (the mask is applied on the
 * GPU after penalties and bias; logprobs stay those of the model), and the end-of-generation
 * tokens only where the text may end. A grammar that admits no token of the vocabulary at some
 * point ends that request with a final error; nothing else is affected.
 *
 *  VKI_CONSTRAINT_GBNF         a GBNF grammar as llama.cpp writes it (rules `name ::= ...`, start
 *                              rule `root`; "literals", [classes] with ranges and ^, ., groups,
 *                              | * + ? {m} {m,} {m,n}, # comments, \xHH \uHHHH \UHHHHHHHH escapes)
 *  VKI_CONSTRAINT_JSON_SCHEMA  a JSON Schema (as JSON text): the output is JSON that validates
 *                              against it. Keywords: type, properties, required,
 *                              additionalProperties (absent means false), enum, const, items,
 *                              minItems, maxItems, anyOf, oneOf, nullable, $ref / $defs,
 *                              minLength, maxLength; annotations are ignored; anything else is
 *                              refused naming the keyword. "{\"type\": \"object\"}" is any JSON
 *                              object (OpenAI's json_object).
 *
 * The text is checked and compiled at submission (VKI_ERR_INVALID_ARG, the message naming the
 * rule or keyword and its line/column or schema path). Requests with the same grammar share its
 * compiled form and caches. The first constrained request of a manager builds the vocabulary's
 * byte trie (tens of milliseconds for a 100k vocabulary). */
typedef enum vki_constraint_type {
    VKI_CONSTRAINT_NONE = 0,
    VKI_CONSTRAINT_GBNF = 1,
    VKI_CONSTRAINT_JSON_SCHEMA = 2,
} vki_constraint_type;

typedef struct vki_constraint {
    vki_constraint_type type;
    const char *text;               /* [len] bytes (need not be NUL-terminated); copied */
    size_t len;
} vki_constraint;

/* Checks a constraint without a model: VKI_OK, or VKI_ERR_INVALID_ARG with err (when not NULL)
 * naming the problem ("grammar: line 3, column 12: undefined rule 'valu'", "json_schema:
 * /properties/age: keyword 'minimum' is not supported"). */
VKI_API vki_status vki_constraint_check(const vki_constraint *c, char *err, size_t err_len);

/* The GBNF grammar a JSON Schema becomes, into buf (NUL-terminated when it fits): to inspect it
 * or edit it into a VKI_CONSTRAINT_GBNF request. VKI_ERR_INVALID_ARG for a bad schema (err says
 * why) or, with the needed size (NUL included) in *n_out, when cap is too small. */
VKI_API vki_status vki_json_schema_to_grammar(const char *schema, size_t len, char *buf, size_t cap, size_t *n_out,
                                              char *err, size_t err_len);

/* ---- batch manager ----------------------------------------------------------------------- */

/* The continuous-batching ("in-flight batching") loop: a worker thread admits requests, plans one
 * ragged step per tick under the capacity policy and the token budget, runs it on the engine and
 * streams tokens back. Two ways in, usable together (one id space):
 *  - callbacks in the style of the TensorRT-LLM batch manager (vki_batch_callbacks), polled by
 *    the worker every tick;
 *  - a push interface for applications: vki_batch_submit / vki_batch_cancel with a per-request
 *    response callback.
 *
 * Threading. Every callback (get_requests, send_response, poll_stop_signals, stats and the
 * per-request vki_response_fn) runs on the manager's worker thread, one at a time, with no
 * library lock held. Inside a callback you may call vki_batch_submit, vki_batch_cancel and
 * vki_batch_notify (on this or another manager) and vki_request_list_add on the sink you were
 * given; you must not call vki_batch_manager_destroy on the manager that called you (it returns
 * VKI_ERR_INVALID_ARG). A callback blocks the tick loop while it runs: keep it short.
 * vki_batch_submit, vki_batch_cancel and vki_batch_notify may be called from any thread. */

typedef struct vki_engine vki_engine;
typedef struct vki_batch_manager vki_batch_manager;

/* Who may hold KV blocks (see the README "scheduler" section). */
typedef enum vki_capacity_policy {
    /* Admit a request only if every block it may need until it finishes fits after reserving
     * what the running requests may still need. A started request is never paused. */
    VKI_POLICY_GUARANTEED_NO_EVICT = 0,
    /* Admit by what the next step needs; when a step cannot fit, pause the most recently started
     * requests (their blocks are freed; they resume later from the front of the queue by
     * recomputing prompt + generated tokens; no output token is lost or repeated). */
    VKI_POLICY_MAX_UTILIZATION = 1,
    /* The old static batching, kept as the baseline: a batch is formed only when nothing runs,
     * its blocks are reserved padded to the longest member, its members run in lockstep (no
     * decode while a member is still in its prompt) and nobody joins until all have finished. */
    VKI_POLICY_STATIC = 2,
} vki_capacity_policy;

typedef struct vki_batch_params {
    vki_capacity_policy policy;     /* GUARANTEED_NO_EVICT */
    uint32_t max_batch_size;        /* requests holding KV at once (and sequences per step);
                                       0 = the engine's sequence slots. Default 0 */
    uint32_t max_num_tokens;        /* token budget of one step (decode + prefill). 8192 */
    uint32_t chunk_size;            /* prefill chunk; a multiple of the KV block size. 512 */
    uint32_t max_queue;             /* waiting requests before submissions are refused with
                                       VKI_RETRY_QUEUE_FULL; 0 = unbounded. 1024 */
    bool block_reuse;               /* reuse KV blocks of shared prompt prefixes. true */
    bool stats;                     /* call the stats callback every tick with work. true */
    uint32_t idle_poll_us;          /* with a get_requests callback, how often an idle manager
                                       polls it (vki_batch_notify wakes it at once); 0: only on
                                       vki_batch_notify. 1000 */
    uint64_t seed;                  /* seeds the per-manager generator that draws the seeds of
                                       requests without one; 0 = from the clock */
    uint32_t max_beam_width;        /* the largest beam_width a request may ask (each beam takes a
                                       sequence slot while it runs). 8 */
    uint64_t max_logits_bytes;      /* per request: the most host memory its logits outputs may
                                       need ((n_prompt if context + max_new_tokens * beams if
                                       generation) * n_vocab * 4 bytes, plus a beam search's
                                       per-beam history when it returns logprobs or generation
                                       logits: see vki_request.beam_width); past it the request
                                       is refused. 256 MiB (a 32k vocabulary: 2048 rows) */
    /* Stateful sessions (vki_request.session_id): a session's KV is pinned between its requests
     * and released when it ends (vki_batch_session_end), after session_idle_s without a request,
     * or, oldest idle session first, when the pins pass session_max_blocks or a waiting request
     * cannot be admitted for want of blocks. A running request's blocks are never taken. */
    double session_idle_s;          /* seconds. 300 */
    uint32_t session_max_blocks;    /* KV blocks all sessions may pin; 0 = half the pool. 0 */
} vki_batch_params;

VKI_API vki_batch_params vki_batch_default_params(void);

typedef enum vki_finish_reason {
    VKI_FINISH_NONE = 0,            /* not finished (streaming, non-final response) */
    VKI_FINISH_EOS = 1,             /* an end id (the request's, or the model's end of text) */
    VKI_FINISH_LENGTH = 2,          /* max_new_tokens generated */
    VKI_FINISH_STOP = 3,            /* one of the request's stop ids (or a complete grammar that
                                       may not end with an end id) */
    VKI_FINISH_CANCELLED = 4,       /* cancelled (vki_batch_cancel, a stop signal, abort) */
    VKI_FINISH_ERROR = 5,           /* refused or failed; vki_response.error says why (also: no
                                       token could be sampled: the request's grammar admits none
                                       here, or logit_bias bans every token) */
} vki_finish_reason;

/* A logits post-processor (TensorRT-LLM's logitsPostProcessor): called on the batch manager's
 * worker thread with the raw logits of each position the request samples ([n_vocab]) and the
 * tokens so far (prompt + generated); it may modify the logits, which are then sampled with the
 * request's parameters (logprobs are taken from the modified logits). Only requests that have
 * one copy logits rows to the host. */
typedef void (*vki_logits_fn)(void *user, uint64_t request_id, float *logits, uint32_t n_vocab,
                              const int32_t *tokens, uint32_t n_tokens);

/* Embedding requests. The prompt is run and the model's final hidden state (after the output
 * norm, the LM head's input: [n_prompt][d_model]) is pooled over the prompt's positions and
 * L2-normalised; the final response carries it in vki_response.embedding and generates no token
 * (n_tokens 0, finish LENGTH; max_new_tokens and sampling are ignored). Every position is
 * computed (no prefix reuse for such a request). For a decoder-only language model this is what
 * llama.cpp's --embeddings gives: usable for similarity within one model, not a trained
 * retrieval embedding. */
typedef enum vki_pooling {
    VKI_POOL_NONE = 0,              /* a generation request */
    VKI_POOL_MEAN = 1,              /* mean over every prompt position */
    VKI_POOL_LAST = 2,              /* the last prompt position */
} vki_pooling;

/* When a beam search stops (TensorRT-LLM's earlyStopping; Hugging Face's early_stopping). A beam
 * that emits an end token is finished (kept if among the best beam_width finished ones); the
 * search goes on with beam_width unfinished beams until max_new_tokens or: */
typedef enum vki_early_stopping {
    VKI_EARLY_STOP_ON = 0,          /* beam_width beams have finished (TensorRT-LLM's default, 1) */
    VKI_EARLY_STOP_HEURISTIC = 1,   /* ... and the best unfinished beam, scored at its current
                                       length, cannot beat the worst finished one (TRT-LLM 0,
                                       HF False, vLLM's default) */
    VKI_EARLY_STOP_NEVER = 2,       /* as HEURISTIC, but with length_penalty > 0 scored at the
                                       longest length it could reach (HF "never") */
} vki_early_stopping;

/* One generation request. Every pointer is copied at submission; the caller keeps ownership. */
typedef struct vki_request {
    uint64_t id;                    /* caller's id; must not be in flight (reusable after its
                                       final response) */
    const int32_t *prompt;          /* [n_prompt] token ids, each < the model's vocabulary */
    uint32_t n_prompt;              /* >= 1; n_prompt + max_new_tokens <= the model's context */
    uint32_t max_new_tokens;        /* >= 1 */
    const int32_t *end_ids;         /* [n_end_ids]; 0 ids = the model's end-of-generation tokens */
    bool ignore_eos;                /* do not end at the model's end-of-generation tokens (only at
                                       end_ids given here, stop ids and max_new_tokens): fixed
                                       output lengths for benchmarks */
    uint32_t n_end_ids;
    const int32_t *stop_ids;        /* [n_stop_ids] extra tokens that finish with STOP */
    uint32_t n_stop_ids;
    vki_sampling_params sampling;   /* start from vki_sampling_default_params() */
    bool streaming;                 /* one response per new token, else one final response */
    int32_t priority;               /* higher runs first; FIFO among equals. 0 */
    vki_logits_fn logits_processor; /* NULL: sampling stays on the GPU */
    void *logits_processor_user;
    vki_constraint constraint;      /* structured output (see above); {0}: none. A request whose
                                       grammar is complete ends with an end id (EOS), or with
                                       VKI_FINISH_STOP when it may not emit one (ignore_eos
                                       without end_ids) */
    uint32_t min_tokens;            /* the end-of-generation tokens, end_ids and stop_ids are banned
                                       (logit -inf) until this many tokens were generated;
                                       <= max_new_tokens. 0 */
    vki_pooling pooling;            /* != VKI_POOL_NONE: an embedding request (see vki_pooling) */
    /* Logits outputs (TensorRT-LLM's gather_context_logits / gather_generation_logits), raw F32
     * model logits (before a logits post-processor, penalties or temperature), copied to the host
     * only for requests that ask. Host memory: n_vocab * 4 bytes per row, held until the final
     * response, [n_prompt] rows for the context plus up to [max_new_tokens] for generation; a
     * request whose worst case exceeds vki_batch_params.max_logits_bytes is refused
     * (VKI_ERR_INVALID_ARG naming the sizes). Device cost: context logits run the LM head over
     * every prompt position (an extra pass after each prompt chunk, and no prefix-cache reuse for
     * that request); generation logits copy one row back per generated token. */
    bool return_context_logits;     /* vki_response.context_logits. false */
    bool return_generation_logits;  /* vki_response.generation_logits. false */
    /* Beam search (TensorRT-LLM's beamWidth): beam_width > 1 keeps that many hypotheses, ranked by
     * the model's log-probabilities (sampling's temperature, cuts, penalties, bias and seed are not
     * used); <= vki_batch_params.max_beam_width. Beams share the prompt's KV pages and copy a
     * partial page when they diverge; each beam is one sequence of the step (it counts against
     * max_num_tokens, max_batch_size and the KV pool: the request is admitted only when every
     * beam's whole KV fits, under every policy, and is never paused; STATIC and sliding windows on
     * every layer refuse it). Not with a constraint, a logits post-processor, min_tokens or
     * pooling (refused, naming the field). The final response carries the beams
     * (vki_response.n_beams ...), best first; streaming responses carry the current best beam
     * whole. 0 or 1: no beam search, bit for bit.
     * With sampling.logprobs / top_logprobs (<= 20) or return_generation_logits, every returned
     * beam carries its own tokens' log-probabilities (log-softmax of the model's logits, which
     * beam search does not alter: they sum to the beam's cum_logprob), the top_logprobs best
     * alternatives of the same rows, and the rows themselves: each follows the beam's lineage
     * back through its parents (TensorRT-LLM's non-streaming [beam, output_len, vocab]), not the
     * rows of whatever beam sat in a slot. Cost: every live beam's row of every step is kept
     * until the search ends (beam_width * max_new_tokens * n_vocab * 4 bytes at most; the
     * returned rows are then gathered in place), plus beam_width * max_new_tokens *
     * (16 + 16 * top_logprobs) bytes of history and output arrays (+ 20 per row for the in-place
     * gather); all of it counts against vki_batch_params.max_logits_bytes at submission. */
    uint32_t beam_width;
    /* A finished beam's score is cum_logprob / length^length_penalty, length = its generated
     * tokens (the end token included); 0 = no normalisation (TensorRT-LLM's default), 1 = the
     * mean (vLLM's default). Finite. */
    float length_penalty;
    vki_early_stopping early_stopping;
    /* != 0: the request belongs to this session (a conversation). When it finishes, the KV of
     * its prompt and output (whole blocks) stays pinned for the session, so the session's next
     * request, whose prompt starts with those tokens, computes only what follows them (see
     * vki_batch_params.session_*). 0 = none */
    uint64_t session_id;
} vki_request;

/* What a response callback receives. Pointers are valid only during the callback. The ending
 * token (end id or stop id) is included in tokens and counted in seq_len. */
typedef struct vki_response {
    uint64_t id;
    const int32_t *tokens;          /* [n_tokens] new tokens: streaming, the tokens since the
                                       previous response (0 or 1); otherwise all generated */
    uint32_t n_tokens;
    const float *logprobs;          /* [n_tokens] when sampling.logprobs or top_logprobs > 0,
                                       else NULL */
    uint32_t n_top;                 /* alternatives per token (the request's top_logprobs) */
    const int32_t *top_tokens;      /* [n_tokens][n_top] most likely ids, best first, or NULL */
    const float *top_logprobs;      /* [n_tokens][n_top] their log-probabilities, or NULL */
    double cum_logprob;             /* sum of logprobs of all tokens generated so far (0 when
                                       logprobs were not asked for) */
    uint32_t seq_len;               /* prompt + generated tokens so far */
    bool final;                     /* the last response for this request */
    vki_finish_reason finish;       /* NONE unless final */
    const char *error;              /* finish == ERROR: what went wrong (names the field for a
                                       refused request); else NULL */
    vki_status status;              /* finish == ERROR: the cause (VKI_ERR_INVALID_ARG refused,
                                       VKI_ERR_DUPLICATE_ID, VKI_ERR_DEVICE_LOST and the other
                                       engine failures, ...); else VKI_OK */
    uint64_t seed;                  /* the request's seed, or the one drawn for it */
    uint32_t n_cached;              /* prompt tokens whose KV came from the prefix cache at the
                                       request's first admission (0 before it) */
    const float *embedding;         /* final response of an embedding request: [n_embd], unit
                                       length; else NULL */
    uint32_t n_embd;
    /* return_context_logits: in the request's first response carrying tokens (or its final
     * response), [n_context_logits][n_vocab] = [n_prompt][n_vocab], row p the logits at prompt
     * position p (they predict token p + 1); else NULL */
    const float *context_logits;
    uint32_t n_context_logits;
    /* return_generation_logits: [n_tokens][n_vocab], row i the logits tokens[i] was sampled
     * from (aligned with tokens and logprobs); else NULL */
    const float *generation_logits;
    uint32_t n_vocab;               /* row length of the logits arrays (0 when neither is set) */
    /* Beam search (beam_width > 1): tokens / n_tokens / cum_logprob are the best beam's, whole
     * (streaming too: not a delta, since the best beam may change). The final response also
     * has the n_beams best beams (beam_width of them, fewer only when the vocabulary offered
     * fewer hypotheses), best first by score: beam b's generated tokens are
     * beam_tokens[b][0, beam_lengths[b]) (an end token included), its cumulative
     * log-probability beam_cum_logprobs[b], its score (with the length penalty)
     * beam_scores[b]. n_beams 0 otherwise.
     * Logprobs and logits with beams: the final response's logprobs / top_tokens / top_logprobs /
     * generation_logits are the best beam's (aligned with tokens), and every beam's are below
     * (each pointer array [n_beams], NULL when not asked for; absent after an error); streaming
     * responses carry the best beam's logprobs and alternatives whole (aligned with tokens) and
     * no generation logits (the rows come with the final response, by lineage). */
    uint32_t n_beams;
    const int32_t *const *beam_tokens;
    const uint32_t *beam_lengths;
    const double *beam_cum_logprobs;
    const double *beam_scores;
    const float *const *beam_logprobs;          /* [b] -> [beam_lengths[b]] */
    const int32_t *const *beam_top_tokens;      /* [b] -> [beam_lengths[b]][n_top] */
    const float *const *beam_top_logprobs;      /* [b] -> [beam_lengths[b]][n_top] */
    const float *const *beam_generation_logits; /* [b] -> [beam_lengths[b]][n_vocab]: row i the
                                                   logits beam_tokens[b][i] was chosen from */
} vki_response;

typedef void (*vki_response_fn)(void *user, const vki_response *resp);

/* The sink get_requests adds to. */
typedef struct vki_request_list vki_request_list;

/* Deep-copies *req into the sink. VKI_RETRY_QUEUE_FULL once the sink holds the max that
 * get_requests was given (the request was not added); VKI_ERR_OUT_OF_HOST_MEMORY. Validation
 * happens later: an invalid or duplicate request gets a final error response. */
VKI_API vki_status vki_request_list_add(vki_request_list *sink, const vki_request *req);

/* One tick's figures (vki_batch_callbacks.tick_stats). */
typedef struct vki_batch_stats {
    uint64_t iteration;             /* ticks run */
    uint32_t queued;                /* waiting for admission (paused ones included) */
    uint32_t running;               /* holding KV (admitted, not finished) */
    uint32_t paused;                /* paused and waiting to resume (MAX_UTILIZATION) */
    uint32_t scheduled;             /* sequences in this tick's step */
    uint32_t context_requests, generation_requests;
    uint32_t context_tokens;        /* prompt tokens computed this tick */
    uint32_t kv_max, kv_free, kv_used, kv_cached; /* KV blocks */
    uint64_t kv_reused_blocks;      /* cumulative */
    uint64_t reused_tokens;         /* cumulative prompt tokens taken from the prefix cache */
    double step_ms;                 /* engine time of this tick's step (0: no step) */
    uint32_t sessions;              /* sessions holding pinned KV */
    uint32_t kv_pinned;             /* block references those sessions hold */
    uint64_t steps_reused;          /* cumulative: this manager's steps submitted as a command buffer
                                       kept from an earlier step of the same shape
                                       (vki_engine_params.no_cmd_reuse) */
    uint64_t steps_ahead;           /* cumulative: lookahead steps, submitted before the step they
                                       follow was waited for (vki_engine_params.no_overlap) */
} vki_batch_stats;

/* TensorRT-LLM-style callbacks; any may be NULL. All run on the worker thread (see above). */
typedef struct vki_batch_callbacks {
    void *user;
    /* Called every tick while the manager accepts work: add up to `max` requests to the sink
     * (max = -1: unbounded). Needs send_response. */
    void (*get_requests)(void *user, int32_t max, vki_request_list *sink);
    /* Responses for requests that came through get_requests. Exactly one final response per
     * request, including refused ones. */
    vki_response_fn send_response;
    /* Fill ids[0..cap) with ids to stop; return how many (called again while it returns cap).
     * A stopped request gets a final CANCELLED response with what it generated; unknown ids are
     * ignored. */
    uint32_t (*poll_stop_signals)(void *user, uint64_t *ids, uint32_t cap);
    /* One JSON object per tick while anything is queued or running (never when idle): the
     * "Iteration Counter", "Active Request Count", "Max KV cache blocks", ... fields of the
     * TensorRT-LLM batch manager; see the README. */
    void (*stats)(void *user, const char *json);
    /* The same figures as a struct, without building or parsing JSON (what a server's metrics
     * want on the tick path): called every tick with work, like stats. */
    void (*tick_stats)(void *user, const vki_batch_stats *st);
} vki_batch_callbacks;

/* Creates a manager over an engine and starts its worker thread. params NULL: the defaults; cb
 * may be NULL (push only). One manager per engine at a time: VKI_ERR_INVALID_ARG while another
 * exists (safe to race: of concurrent calls on one engine exactly one succeeds). The engine must
 * outlive the manager. */
VKI_API vki_status vki_batch_manager_create(vki_engine *engine, const vki_batch_params *params,
                                            const vki_batch_callbacks *cb, vki_batch_manager **out);

/* Stops the manager and frees it. abort = false: waits until every accepted request has had its
 * final response (new submissions are refused with VKI_ERR_SHUTDOWN meanwhile); abort = true:
 * every queued or running request gets a final CANCELLED response at the next tick boundary.
 * VKI_ERR_INVALID_ARG (nothing done) when called from one of this manager's callbacks. */
VKI_API vki_status vki_batch_manager_destroy(vki_batch_manager *bm, bool abort);

/* Push interface. Validates and queues a copy of *req; on_response (required) receives its
 * responses on the worker thread, exactly one of them final. Returns VKI_OK, or with no callback
 * ever made: VKI_ERR_INVALID_ARG (err, when not NULL, receives a message naming the field),
 * VKI_ERR_DUPLICATE_ID (the id is in flight), VKI_RETRY_QUEUE_FULL (max_queue requests wait),
 * VKI_ERR_SHUTDOWN, VKI_ERR_OUT_OF_HOST_MEMORY, VKI_ERR_DEVICE_LOST (a step lost the device: every
 * request in flight got its final error then; see vki_engine_recover). */
VKI_API vki_status vki_batch_submit(vki_batch_manager *bm, const vki_request *req,
                                    vki_response_fn on_response, void *user, char *err, size_t err_cap);

/* Cancels request `id` in any state (queued, in its prompt, generating, paused): it gets a final
 * CANCELLED response with what it generated at the next tick boundary. VKI_ERR_NOT_FOUND when
 * the id is not in flight (never submitted, or already finished). */
VKI_API vki_status vki_batch_cancel(vki_batch_manager *bm, uint64_t id);

/* Wakes an idle manager so it polls get_requests now rather than after idle_poll_us. */
VKI_API void vki_batch_notify(vki_batch_manager *bm);

/* Ends a session: its pinned KV is released at the next tick boundary (a request of it still
 * running finishes normally and pins nothing). VKI_OK also when the session holds nothing. */
VKI_API vki_status vki_batch_session_end(vki_batch_manager *bm, uint64_t session_id);

/* Session files: a session's KV saved to a file and restored later, into this manager or another
 * one over the same model (after a restart, on another machine), as llama.cpp's slot save /
 * restore. The file holds the session's conversation (the prompt and output tokens of its last
 * finished request) and the KV of its pinned blocks, with the model's fingerprint
 * (vki_model_info.fingerprint), the KV layout, a format version and checksums; the format is in
 * docs/session-file.md. A file from another model (another fine-tune of the same architecture
 * too), another KV type or layout, another version, or a truncated or corrupted file is refused
 * with a message that says which. Page sizes may differ: the KV is stored per token and restored
 * in whole pages of this engine (a tail shorter than a page is recomputed by the next request).
 *
 * Both calls block the calling thread: the worker copies the KV at its next tick boundary (one
 * device transfer; no step runs meanwhile) and the calling thread does the file I/O. They cost
 * host memory for the session's KV while they run, and restore reads the whole file (checksum)
 * before anything reaches the pool. Not from one of this manager's callbacks
 * (VKI_ERR_INVALID_ARG), and not racing vki_batch_manager_destroy. */
typedef struct vki_session_file_info {
    int32_t *tokens;                /* in, restore, optional: receives the file's first
                                       min(n_tokens, tokens_cap) tokens (the conversation, e.g. to
                                       continue it as text) */
    uint32_t tokens_cap;
    uint32_t n_tokens;              /* out: tokens of the conversation in the file */
    uint32_t n_kv_tokens;           /* out: of which KV was saved / restored (whole pages) */
    uint64_t bytes;                 /* out: file size */
    double ms;                      /* out: wall time of the call (file, copy and waiting) */
    uint64_t fingerprint;           /* out: the model fingerprint the file carries */
} vki_session_file_info;

/* Writes session_id's KV to path (through a temporary file in the same folder, renamed when
 * complete: a reader never sees a partial file). A session with a running request saves what its
 * last finished request left. VKI_ERR_NOT_FOUND: the session holds no KV (unknown, ended,
 * expired, or released under pressure); VKI_ERR_IO: the file could not be written (err names it
 * and why); VKI_ERR_UNSUPPORTED: the executor cannot copy KV. info may be NULL. */
VKI_API vki_status vki_batch_session_save(vki_batch_manager *bm, uint64_t session_id, const char *path,
                                          vki_session_file_info *info, char *err, size_t err_cap);
/* Reads path and pins its KV for session_id exactly as if the conversation had run here: the
 * session's next request whose prompt starts with the file's tokens computes only what follows
 * (the pins count against session_max_blocks, expire and give way like any session's). An idle
 * session of that id is replaced (its old pins are released once the new ones are in); one with
 * a running request is refused (VKI_ERR_INVALID_ARG). Blocks already cached for a prefix of
 * the tokens are shared, not written. Errors (nothing changed but, when the pool was short, idle
 * sessions released oldest first as for a waiting request): VKI_ERR_NOT_FOUND (no such file),
 * VKI_ERR_IO (cannot read it),
 * VKI_ERR_FORMAT (not a session file, truncated, corrupted: a checksum differs, a token outside the
 * vocabulary), VKI_ERR_UNSUPPORTED (another format version), VKI_ERR_INVALID_ARG (another model,
 * named with both fingerprints; another KV type or layout; longer than the context; more blocks
 * than session_max_blocks; block reuse off), VKI_ERR_OUT_OF_DEVICE_MEMORY (the pool cannot hold
 * the blocks beside what running requests may still need). */
VKI_API vki_status vki_batch_session_restore(vki_batch_manager *bm, uint64_t session_id, const char *path,
                                             vki_session_file_info *info, char *err, size_t err_cap);

/* ---- tokenizer --------------------------------------------------------------------------- */

/* A tokenizer built from a GGUF file's tokenizer.ggml.* metadata: SentencePiece ("llama":
 * scores, byte fallback, the leading-space rule) or byte-level BPE ("gpt2": merges and the
 * pre-tokenizer regexes named by tokenizer.ggml.pre: default, gpt-2, llama3/llama-bpe, qwen2,
 * starcoder/smollm, deepseek-llm, deepseek-coder). Token ids are int32_t.
 * Immutable once loaded: any number of threads may use one tokenizer at the same time. */
typedef struct vki_tokenizer vki_tokenizer;

/* Reads only the metadata of a GGUF (a vocabulary-only file or a whole model). Errors, with a
 * message in err (when not NULL): VKI_ERR_IO, VKI_ERR_FORMAT (malformed file or tokenizer
 * metadata; names the key), VKI_ERR_UNSUPPORTED (tokenizer model or pre-tokenizer not supported;
 * names it). */
VKI_API vki_status vki_tokenizer_load(const char *gguf_path, vki_tokenizer **out, char *err, size_t err_len);
VKI_API void vki_tokenizer_free(vki_tokenizer *tok);

VKI_API uint32_t vki_vocab_size(const vki_tokenizer *tok);
VKI_API int32_t vki_token_bos(const vki_tokenizer *tok); /* -1 when the vocabulary has none */
VKI_API int32_t vki_token_eos(const vki_tokenizer *tok); /* -1 when the vocabulary has none */
/* Fill-in-the-middle tokens of code models (tokenizer.ggml.fim_*_token_id, or their usual texts:
 * <|fim_prefix|>, <fim_prefix>, <PRE>, ...): prefix, suffix, middle, repository name, file
 * separator. -1 when the vocabulary has none. */
typedef enum vki_fim_token {
    VKI_FIM_PRE, VKI_FIM_SUF, VKI_FIM_MID, VKI_FIM_REP, VKI_FIM_SEP, VKI_FIM_COUNT
} vki_fim_token;
VKI_API int32_t vki_token_fim(const vki_tokenizer *tok, vki_fim_token which);
/* End of generation: eos, eot, eom and the end-of-turn tokens (<|im_end|>, <|eot_id|>, ...). */
VKI_API bool vki_token_is_eog(const vki_tokenizer *tok, int32_t id);
/* Whether vki_tokenize(add_special = true) prepends BOS (tokenizer.ggml.add_bos_token; default
 * true for SentencePiece and Llama 3, false for other BPE vocabularies). */
VKI_API bool vki_tokenizer_adds_bos(const vki_tokenizer *tok);

/* text[0, len) -> token ids. The text need not be NUL-terminated nor valid UTF-8 (SentencePiece
 * keeps stray bytes as byte tokens; BPE replaces each with U+FFFD, as llama.cpp does).
 * add_special: BOS / EOS as the metadata says. parse_special: control tokens written in the text
 * ("<|im_end|>") become their ids; otherwise they are tokenised as plain text (user-defined
 * tokens are always matched). On success *n_out ids were written. When cap is too small:
 * VKI_ERR_INVALID_ARG with the needed count in *n_out (call again with a larger buffer). */
VKI_API vki_status vki_tokenize(const vki_tokenizer *tok, const char *text, size_t len, bool add_special,
                                bool parse_special, int32_t *out, size_t cap, size_t *n_out);

enum {
    VKI_DETOK_SPECIAL = 1u << 0,             /* render control / unknown tokens ("<s>") as text */
    VKI_DETOK_STRIP_LEADING_SPACE = 1u << 1, /* drop the space SentencePiece prepended: the first
                                                byte of the output when it is ' '; no effect on
                                                tokenizers that add no space prefix */
};

/* The bytes of one token (not NUL-terminated; may be part of a UTF-8 sequence, e.g. <0xE2>).
 * Control and unknown tokens give 0 bytes unless `special`. VKI_ERR_INVALID_ARG for a bad id, or
 * with the needed size in *n_out when cap is too small. */
VKI_API vki_status vki_token_to_piece(const vki_tokenizer *tok, int32_t id, bool special, char *buf,
                                      size_t cap, size_t *n_out);

/* The concatenated pieces of ids[0, n) with VKI_DETOK_* flags; raw bytes, no NUL. Same contract
 * as vki_token_to_piece for a bad id or a small buffer. */
VKI_API vki_status vki_detokenize(const vki_tokenizer *tok, const int32_t *ids, size_t n, uint32_t flags,
                                  char *buf, size_t cap, size_t *n_out);

/* Streaming detokeniser for one sequence: feed tokens one at a time, get text that is always
 * complete UTF-8. Bytes of a sequence split across tokens are held until it completes; bytes that
 * can never form valid UTF-8 come out as U+FFFD. Needs the tokenizer to outlive it; one per
 * stream (not shareable between threads). */
typedef struct vki_detok vki_detok;

VKI_API vki_status vki_detok_create(const vki_tokenizer *tok, uint32_t flags, vki_detok **out);
/* *text / *len: the newly complete text (possibly empty), valid until the next call on d. */
VKI_API vki_status vki_detok_push(vki_detok *d, int32_t id, const char **text, size_t *len);
/* End of stream: held bytes come out as U+FFFD; d is then ready for a new stream. */
VKI_API vki_status vki_detok_flush(vki_detok *d, const char **text, size_t *len);
VKI_API void vki_detok_free(vki_detok *d);

/* ---- text streaming: detokenise + stop strings ------------------------------------------- */

/* Generated tokens -> the text a user sees: streaming detokenisation (never a partial UTF-8
 * character) followed by stop-string matching across token boundaries (text that could still
 * become a stop string is held back until it cannot; the stop string itself is never emitted).
 * The batch manager works in token ids (like TensorRT-LLM's); feed each response's tokens here,
 * and when *stopped is set, call vki_batch_cancel on the request: what `vkinfer generate` and the
 * HTTP server do. One per generation, used by one thread at a time. */
typedef struct vki_text_stream vki_text_stream;

/* stops: n_stops non-empty stop strings (copied); flags: VKI_DETOK_* for the detokeniser. */
VKI_API vki_status vki_text_stream_create(const vki_tokenizer *tok, const char *const *stops,
                                          uint32_t n_stops, uint32_t flags, vki_text_stream **out);
VKI_API void vki_text_stream_free(vki_text_stream *s); /* NULL is fine */
/* Feeds one generated token. *text / *len: text now safe to show (valid until the next call).
 * *stopped: a stop string completed (later tokens are ignored and emit nothing). */
VKI_API vki_status vki_text_stream_push(vki_text_stream *s, int32_t token, const char **text, size_t *len,
                                        bool *stopped);
/* End of generation: what was held back (a stop-string prefix that never completed; incomplete
 * UTF-8 as U+FFFD). */
VKI_API vki_status vki_text_stream_finish(vki_text_stream *s, const char **text, size_t *len);
VKI_API bool vki_text_stream_stopped(const vki_text_stream *s);
/* Which stop string ended the text (its index in the create call's stops), or -1 while none has. */
VKI_API int32_t vki_text_stream_stop_index(const vki_text_stream *s);

/* ---- chat templates ---------------------------------------------------------------------- */

/* Chat messages -> the prompt the model was trained on, without a Jinja engine: a GGUF's
 * tokenizer.chat_template is recognised by the markers of the common families and rendered by C
 * code that reproduces each family's upstream template exactly: ChatML (Qwen, SmolLM, ...),
 * Llama 3, Llama 2, Mistral, Zephyr, Gemma, Phi-3, DeepSeek-R1, gpt-oss's harmony (its system
 * message dated today, reasoning effort medium), OLMo 2 / Tülu 3, IBM Granite 3.x (its default
 * system prompt dated today, thinking off), SmolLM3 (its metadata block dated today, reasoning
 * mode /think unless the system message says /no_think). Anything else falls back to "plain":
 * "role: content" lines ending in "assistant:". Control tokens ("<|im_start|>", "<s>") are
 * recognised only in the text the template writes; message content is always tokenised as plain
 * text, so a user cannot inject "<|im_end|>". Immutable once created: any number of threads may
 * use one template at the same time. Needs its tokenizer to outlive it. */
typedef struct vki_chat_template vki_chat_template;

typedef enum vki_chat_role {
    VKI_CHAT_SYSTEM = 0,
    VKI_CHAT_USER = 1,
    VKI_CHAT_ASSISTANT = 2,
} vki_chat_role;

typedef struct vki_chat_message {
    vki_chat_role role;
    const char *content;            /* NUL-terminated UTF-8 */
} vki_chat_message;

/* The chat template text of the GGUF the tokenizer was loaded from (tokenizer.chat_template), or
 * NULL when it has none. */
VKI_API const char *vki_tokenizer_chat_template(const vki_tokenizer *tok);

/* tmpl: NULL = the model's own (vki_tokenizer_chat_template; "plain" when it has none or it is
 * not one of the families); a family name: "chatml", "llama3", "llama2", "mistral", "zephyr",
 * "gemma", "phi3", "deepseek", "harmony", "tulu", "granite", "smollm3", "exaone", "glm4", "command-r", "plain"; or
 * any other text = a template's source, recognised by its markers ("plain" when unrecognised:
 * vki_chat_template_name says which family was chosen). Walks the
 * vocabulary once, O(n_vocab): make one per model and keep it (the engine keeps one,
 * vki_engine_chat_template). VKI_ERR_OUT_OF_HOST_MEMORY. */
VKI_API vki_status vki_chat_template_create(const vki_tokenizer *tok, const char *tmpl, vki_chat_template **out);
VKI_API void vki_chat_template_free(vki_chat_template *t); /* NULL is fine */
/* The family in use: one of the names vki_chat_template_create takes ("chatml", ..., "plain"). */
VKI_API const char *vki_chat_template_name(const vki_chat_template *t);

/* Renders msgs[0, n), then (add_generation_prompt) the opening of the assistant's turn. Writes
 * NUL-terminated text into buf; *n_out = its length without the NUL. When cap is too small:
 * VKI_ERR_INVALID_ARG with *n_out = the length needed (call again with cap > *n_out). Where the
 * upstream template raises (roles that do not alternate user/assistant in Llama 2, Mistral and
 * Gemma; an unknown role): VKI_ERR_INVALID_ARG, *n_out = 0, err (when not NULL) names msgs[i]. */
VKI_API vki_status vki_chat_apply(const vki_chat_template *t, const vki_chat_message *msgs, size_t n,
                                  bool add_generation_prompt, char *buf, size_t cap, size_t *n_out, char *err,
                                  size_t err_len);
/* The same conversation as token ids for the model: the template's control tokens become their
 * ids, content is plain text, BOS as the template writes it (the plain fallback: as the
 * tokenizer adds it). Contract of vki_chat_apply for a small buffer (ids instead of bytes, no NUL). */
VKI_API vki_status vki_chat_tokenize(const vki_chat_template *t, const vki_chat_message *msgs, size_t n,
                                     bool add_generation_prompt, int32_t *out, size_t cap, size_t *n_out,
                                     char *err, size_t err_len);

/* ---- engine ------------------------------------------------------------------------------ */

/* An engine: one model (GGUF) on one Vulkan device, with its tokenizer and a paged KV cache.
 * Run requests through a batch manager (vki_batch_manager_create); one manager per engine.
 * Two engines (on two devices, or one) in one process are independent. */

typedef enum vki_kv_type {
    VKI_KV_F16 = 0,                 /* half the memory and bandwidth; the default */
    VKI_KV_F32 = 1,
    VKI_KV_Q8_0 = 2,                /* ggml's Q8_0 blocks (8-bit, an f16 scale per 32 values):
                                       1.88x the tokens of F16 in the same memory; needs a head
                                       dim that is a multiple of 32 */
} vki_kv_type;

typedef struct vki_engine_params {
    vki_device_params device;       /* which device, validation, logging */
    uint32_t page_size;             /* tokens per KV page (= scheduler block). 16 */
    vki_kv_type kv_type;            /* VKI_KV_F16 */
    uint64_t kv_tokens;             /* KV capacity in tokens; 0 = kv_fraction of free memory. 0 */
    float kv_fraction;              /* of the device memory free once weights and scratch are
                                       loaded: measured then (VK_EXT_memory_budget: budget minus
                                       current usage, so other engines and the application's own
                                       Vulkan work count; without it: the heap minus this engine's
                                       buffers) and capped by device_memory_limit. 0.8 */
    uint64_t device_memory_limit;   /* bytes of device buffers this engine may hold in all
                                       (weights, scratch, KV); 0 = no cap. Loading fails with
                                       VKI_ERR_OUT_OF_DEVICE_MEMORY when the weights do not fit
                                       under it. The way to share a device without
                                       VK_EXT_memory_budget (lavapipe). 0 */
    /* Both are capped at load where the device's storage bindings are small (each activation
     * buffer, max_tokens rows of the model's widest, and max_seqs logits rows must fit
     * maxStorageBufferRange: 128 MiB on lavapipe holds 1,168 rows of Llama-3-8B); the info
     * level says so and vki_engine_info reports what the engine runs with. */
    uint32_t max_seqs;              /* sequences that may hold KV at once. 256 */
    uint32_t max_tokens;            /* new tokens per step (activation scratch rows). 2048 */
    uint32_t max_ctx;               /* longest sequence; 0 = the model's context length */
    vki_progress_fn progress;       /* weight upload progress (may cancel the load); NULL */
    void *progress_user;
    /* Bitwise batch invariance: a request's logits (and so its tokens, greedy or seeded) do not
     * depend on the other requests in a step, on how its prompt is chunked, or on a pause and
     * recompute. Costs prefill throughput (matrix-vector kernels for every matmul, attention one
     * query at a time). false */
    bool batch_invariant;
    /* Profile: GPU timestamps around every dispatch of every step, written to this file as a
     * Chrome trace (open in chrome://tracing or ui.perfetto.dev): each event is named by its role
     * and kernel ("layer 3 / attn_q / matvec_q4_k"), its category is the step, and each step
     * phase (embed, attention, ffn, lm head, sample) is a track of its own.
     * vki_engine_profile_summary() tabulates the same timings. NULL = off (default). */
    const char *profile_path;
    /* Caps every layer's attention window at this many tokens (StreamingLLM style): a query sees
     * its last max_attention_window positions plus the first KV page (the attention sink), so a
     * long generation holds bounded KV (pages no layer sees any more go back to the pool while
     * the sequence runs). Layers with a smaller window of their own (gemma, mistral) keep it.
     * Changes the model's outputs once a sequence is longer than the window. 0 = off (default) */
    uint32_t max_attention_window;
    /* RenderDoc: when the process runs under RenderDoc (`renderdoccmd capture`, or launched from
     * its UI), steps capture_first..capture_last (counted from 0 per engine) are recorded as one
     * capture through RenderDoc's in-app API; every dispatch carries the debug label path
     * "step N / layer L / role / kernel". vkinfer never loads RenderDoc itself: without it this
     * does nothing (logged at INFO). capture_first < 0: off. Default -1, -1 */
    int64_t capture_first, capture_last;
    /* Runs the forward pass op by op, as the model is written: no Q|K|V or gate|up matrices
     * concatenated at load, no residual add or gated activation folded into the matmul before
     * it, RoPE of K as a pass of its own before the KV cache write, the decode attention's
     * splits merged by a reduce pass of their own, every RMSNorm a pass of its own (else a
     * one-token step's output and down projections also write the next block's normed input).
     * The results are the same bit for bit (the fusions round exactly as the separate ops);
     * only dispatches, barriers and memory traffic differ. For measuring what the fusions give
     * (bench-model --no-fusion). false */
    bool no_fusion;
    /* Records every step's command buffer anew. By default the engine keeps the command buffers
     * of its last few step shapes and submits one again when a step records exactly the same
     * commands (a decode step of the same batch: what changes is in the step's input buffer),
     * which takes the driver's recording off the host's critical path. The results are the same
     * bit for bit. Reuse is off anyway while profiling or capturing (per-step labels and
     * timestamps). For measuring it (bench-model --no-cmd-reuse). false */
    bool no_cmd_reuse;
    /* The batch manager waits for every step before it submits the next. By default, while the
     * running requests only decode (no logits post-processor or outputs, beam search; penalties
     * are fine, they count the token in flight on the device, and so are grammars, whose masks
     * are computed while the device runs the step's forward pass; one step waits where
     * min_tokens' bans lift) and no waiting request could be admitted (none waits, or
     * max_batch_size run, or the head of the queue needs more KV blocks than are free), it submits each step's successor before waiting for it, the
     * successor's tokens read on the device from the step's sampler: the host's work per token
     * (results, stop checks, responses, the next submission) overlaps the GPU's. The tokens are the same. Off anyway while profiling or
     * capturing. For measuring it (--no-overlap). false */
    bool no_overlap;
    /* Decode projections on the integer-dot path: each matrix-vector product of integer-block
     * weights (every GGUF type vkinfer runs but F32, F16, BF16) reads its activations
     * quantised to int8 per block of 32 (in a decode step written by the kernel that produces
     * them: no extra pass) and multiplies 4 weights per packed dot product instead of
     * converting each to float. Changes results: the activations' 8-bit rounding, ~2e-5 relative
     * in each product (llama.cpp's CPU and CUDA backends round theirs to Q8 likewise). F32,
     * F16 and BF16 weights, the GEMM (prefill) and the experts' matmuls keep the float path. Needs
     * shaderIntegerDotProduct (Vulkan 1.3): VKI_ERR_UNSUPPORTED without (VKI_INT_DOT_ON).
     * vki_model_info.int_dot says what an engine took. VKI_INT_DOT_AUTO */
    vki_int_dot_mode int_dot;
} vki_engine_params;

VKI_API vki_engine_params vki_engine_default_params(void);

typedef struct vki_model_info {
    char name[128];                 /* general.name, or the file name */
    char arch[16];                  /* "llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3" */
    char weight_type[16];           /* type of most matrix weights: "q4_k", "f16", ... */
    uint32_t n_vocab, n_layer, d_model, d_ff, n_head, n_head_kv, head_dim;
    uint32_t n_ctx_train;           /* context length in the file */
    uint32_t n_ctx;                 /* longest sequence this engine runs */
    uint32_t page_size, kv_pages;   /* KV pages per layer */
    uint32_t max_seqs, max_tokens;  /* as run: the parameters, or their caps (see there) */
    uint64_t weight_bytes;          /* device memory held by weights */
    uint64_t kv_bytes;              /* device memory held by the KV cache */
    uint64_t device_bytes;          /* all device buffers of this engine: weights, KV, scratch,
                                       step inputs, staging (what device_memory_limit bounds) */
    char device[256];
    char kv_type[8];                /* "f16", "f32", "q8_0" */
    uint32_t sliding_window;        /* the model's sliding window (its windowed layers); 0 = none */
    uint32_t kv_window;             /* every layer windowed (the model's, or max_attention_window):
                                       a sequence keeps the KV of its last kv_window tokens (and the
                                       first page); 0 = the KV of its whole context */
    uint64_t fingerprint;           /* the model's identity (its metadata, tensor shapes and a sample
                                       of every tensor's bytes): session files of another model,
                                       another fine-tune included, are refused by it */
    bool int_dot;                   /* the decode projections take the integer-dot path
                                       (vki_engine_params.int_dot as resolved on this device) */
    vki_pooling pooling;            /* the pooling the model declares for its embeddings
                                       (<arch>.pooling_type: Qwen3-Embedding's VKI_POOL_LAST, or
                                       VKI_POOL_MEAN); VKI_POOL_NONE when it declares none, or one
                                       a causal model cannot give (cls, rank) */
} vki_model_info;

/* Opens the device, reads the GGUF, builds the tokenizer, uploads the weights, allocates the KV
 * cache and compiles every pipeline. params NULL: the defaults. On failure err (when not NULL)
 * says why: the malformed key or tensor, the unsupported architecture or type, the memory that
 * ran out; VKI_ERR_CANCELLED when the progress callback returned false. */
VKI_API vki_status vki_engine_create(const char *gguf_path, const vki_engine_params *params, vki_engine **out,
                                     char *err, size_t err_len);
VKI_API void vki_engine_destroy(vki_engine *e); /* NULL is fine; destroy its batch manager first */
VKI_API const vki_tokenizer *vki_engine_tokenizer(const vki_engine *e);
/* The model's chat template (vki_chat_template_create(tok, NULL)), made at load; owned by e. */
VKI_API const vki_chat_template *vki_engine_chat_template(const vki_engine *e);
VKI_API void vki_engine_info(const vki_engine *e, vki_model_info *out);
/* VKI_OK, or VKI_ERR_DEVICE_LOST once a step lost the device (the batch manager then ends every
 * request in flight with that error and refuses new ones). Any thread. */
VKI_API vki_status vki_engine_status(const vki_engine *e);
/* After a device loss: reopens the device and reloads the model (weights, KV cache, pipelines)
 * from the path and parameters given to vki_engine_create, keeping the tokenizer and chat
 * template (their pointers stay valid). Destroy the batch manager first (VKI_ERR_INVALID_ARG
 * otherwise) and create a new one after. On failure err says why and the engine stays lost;
 * call again later (a driver reset can take seconds). The parameters' strings were copied;
 * the progress callback is not called again. */
VKI_API vki_status vki_engine_recover(vki_engine *e, char *err, size_t err_len);

/* With profile_path set: text tables of the GPU time of every step so far, by role and kernel
 * ("attn_q / matvec_q4_k"), most expensive first, with calls, total ms, mean us and % of the step
 * time, one line each, at most max_rows rows (0: all) per table: one table for decode steps (one
 * token per sequence), one for steps with prompt tokens. Same size contract as vki_detokenize
 * (NUL-terminated; *n_out excludes the NUL). VKI_ERR_INVALID_ARG when profiling is off. Call it
 * when no step runs (no batch manager, or after vki_batch_manager_destroy). */
VKI_API vki_status vki_engine_profile_summary(const vki_engine *e, uint32_t max_rows, char *buf, size_t cap,
                                              size_t *n_out);

/* ---- simple generation ------------------------------------------------------------------- */

/* Text in, text out: the common case in a handful of calls (docs/embed/simple.c is the whole
 * program):
 *
 *   vki_engine *e;
 *   vki_engine_create("model.gguf", NULL, &e, err, sizeof err);
 *   vki_batch_manager *bm;
 *   vki_batch_manager_create(e, NULL, NULL, &bm);
 *   vki_generate_params gp = vki_generate_default_params();
 *   gp.on_text = print_text;                 // each piece of text as it is generated
 *   vki_generate(bm, "Once upon a time", &gp, NULL, err, sizeof err);
 *   vki_batch_manager_destroy(bm, false);
 *   vki_engine_destroy(e);
 *
 * vki_generate blocks until its generation ends. It is one request of the batch manager: calls
 * from several threads on one manager run batched together, next to requests of the full API. */

/* Receives the next piece of generated text (never a partial UTF-8 character, never part of a
 * stop string), on the batch manager's worker thread. Return false to stop the generation
 * (result finish CANCELLED). */
typedef bool (*vki_text_fn)(void *user, const char *text, size_t len);

typedef struct vki_generate_params {
    uint32_t max_tokens;            /* generated tokens at most. 128 (as `vkinfer generate`) */
    vki_sampling_params sampling;   /* vki_sampling_default_params(): greedy */
    const char *const *stops;       /* [n_stops] stop strings: the text ends before the first one
                                       that appears (matched across tokens, not emitted) */
    uint32_t n_stops;
    bool ignore_eos;                /* run to max_tokens or a stop string. false */
    vki_text_fn on_text;            /* NULL: the text is dropped (benchmarks) */
    void *user;
    uint64_t id;                    /* the request id; 0 = a free one is chosen. Give one to cancel
                                       from another thread with vki_batch_cancel(bm, id) */
    vki_text_fn on_reasoning;       /* vki_generate_chat on a harmony template (gpt-oss): the
                                       reasoning (its analysis channel) as it is generated, apart
                                       from the answer on_text receives; NULL drops it. Other
                                       templates' "<think>" blocks stay in on_text's text */
} vki_generate_params;

VKI_API vki_generate_params vki_generate_default_params(void);

typedef struct vki_generate_result {
    vki_finish_reason finish;       /* EOS, LENGTH, STOP (a stop string), CANCELLED (on_text
                                       returned false, or vki_batch_cancel) */
    uint32_t n_prompt;              /* prompt tokens (BOS and the chat template's included) */
    uint32_t n_generated;           /* tokens generated, the ending one included */
    uint64_t seed;                  /* the sampling seed used (drawn when none was given) */
    double first_token_ms;          /* from the call to the first generated token */
    double total_ms;                /* from the call to the end */
} vki_generate_result;

/* Tokenises prompt (BOS as the model's metadata says; control-token text stays plain text), runs
 * it on bm and streams the generated text to on_text; returns after the generation ended.
 * p NULL: the defaults; result may be NULL. VKI_OK: see result->finish. Errors, with err (when
 * not NULL) naming the cause and no text produced: VKI_ERR_INVALID_ARG (an empty prompt, one
 * longer than the context, a bad sampling parameter, a manager without a tokenizer),
 * VKI_ERR_DUPLICATE_ID (p->id is in flight), VKI_RETRY_QUEUE_FULL, VKI_ERR_SHUTDOWN,
 * VKI_ERR_OUT_OF_HOST_MEMORY; and the engine's failures (VKI_ERR_DEVICE_LOST, ...) once running.
 * Must not be called from a callback of bm (it would wait on itself; VKI_ERR_INVALID_ARG). */
VKI_API vki_status vki_generate(vki_batch_manager *bm, const char *prompt, const vki_generate_params *p,
                                vki_generate_result *result, char *err, size_t err_len);

/* The assistant's answer to a conversation: msgs rendered and tokenised with tmpl (NULL: the
 * model's own, vki_engine_chat_template), then as vki_generate. The template's errors (roles that
 * do not alternate, ...) are VKI_ERR_INVALID_ARG with err naming the message. */
VKI_API vki_status vki_generate_chat(vki_batch_manager *bm, const vki_chat_template *tmpl,
                                     const vki_chat_message *msgs, size_t n, const vki_generate_params *p,
                                     vki_generate_result *result, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* VKINFER_H */
