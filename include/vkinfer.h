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

/* Every exported function is marked VKI_API; the shared library hides everything else. */
#if defined(_WIN32)
#define VKI_API
#else
#define VKI_API __attribute__((visibility("default")))
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
    uint64_t heap_budget[VKI_MAX_HEAPS]; /* VK_EXT_memory_budget, else heap_size */
} vki_device_info;

/* Lists the Vulkan devices. *n_out receives the number found (which may exceed cap; only
 * min(cap, found) entries are written). Returns VKI_ERR_NO_DEVICE when no Vulkan loader or
 * device exists. */
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
    vki_coopmat_mode coopmat;       /* VKI_COOPMAT_AUTO */
    /* Matrix multiplies with at most this many activation rows take the matrix-vector kernel
     * (weights read once per 8 rows), more rows the tiled GEMM. 0: the crossover measured for
     * this kind of device and path (bench-kernels --crossover measures it; engine/ops_matmul.c
     * holds the table). */
    uint32_t gemv_max_m;
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

/* temperature 1, top_k 0, top_p 1, min_p 0, no penalties (window 64), random seed, no logprobs. */
VKI_API vki_sampling_params vki_sampling_default_params(void);

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
} vki_batch_params;

VKI_API vki_batch_params vki_batch_default_params(void);

typedef enum vki_finish_reason {
    VKI_FINISH_NONE = 0,            /* not finished (streaming, non-final response) */
    VKI_FINISH_EOS = 1,             /* an end id (the request's, or the model's end of text) */
    VKI_FINISH_LENGTH = 2,          /* max_new_tokens generated */
    VKI_FINISH_STOP = 3,            /* one of the request's stop ids */
    VKI_FINISH_CANCELLED = 4,       /* cancelled (vki_batch_cancel, a stop signal, abort) */
    VKI_FINISH_ERROR = 5,           /* refused or failed; vki_response.error says why */
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
    uint32_t min_tokens;            /* the end-of-generation tokens, end_ids and stop_ids are banned
                                       (logit -inf) until this many tokens were generated;
                                       <= max_new_tokens. 0 */
    vki_pooling pooling;            /* != VKI_POOL_NONE: an embedding request (see vki_pooling) */
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

/* Creates a manager over an engine and starts its worker thread. cb may be NULL (push only).
 * Defined by the engine adapter; the engine must outlive the manager. */
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
 * VKI_ERR_SHUTDOWN, VKI_ERR_OUT_OF_HOST_MEMORY. */
VKI_API vki_status vki_batch_submit(vki_batch_manager *bm, const vki_request *req,
                                    vki_response_fn on_response, void *user, char *err, size_t err_cap);

/* Cancels request `id` in any state (queued, in its prompt, generating, paused): it gets a final
 * CANCELLED response with what it generated at the next tick boundary. VKI_ERR_NOT_FOUND when
 * the id is not in flight (never submitted, or already finished). */
VKI_API vki_status vki_batch_cancel(vki_batch_manager *bm, uint64_t id);

/* Wakes an idle manager so it polls get_requests now rather than after idle_poll_us. */
VKI_API void vki_batch_notify(vki_batch_manager *bm);

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

/* ---- engine ------------------------------------------------------------------------------ */

/* An engine: one model (GGUF) on one Vulkan device, with its tokenizer and a paged KV cache.
 * Run requests through a batch manager (vki_batch_manager_create); one manager per engine.
 * Two engines (on two devices, or one) in one process are independent. */

typedef enum vki_kv_type {
    VKI_KV_F16 = 0,                 /* half the memory and bandwidth; the default */
    VKI_KV_F32 = 1,
} vki_kv_type;

typedef struct vki_engine_params {
    vki_device_params device;       /* which device, validation, logging */
    uint32_t page_size;             /* tokens per KV page (= scheduler block). 16 */
    vki_kv_type kv_type;            /* VKI_KV_F16 */
    uint64_t kv_tokens;             /* KV capacity in tokens; 0 = kv_fraction of free memory. 0 */
    float kv_fraction;              /* of the device memory left after weights and scratch. 0.8 */
    uint32_t max_seqs;              /* sequences that may hold KV at once. 256 */
    uint32_t max_tokens;            /* new tokens per step (activation scratch rows). 2048 */
    uint32_t max_ctx;               /* longest sequence; 0 = the model's context length */
    bool progress;                  /* progress bar on stderr while uploading weights. false */
    /* Bitwise batch invariance: a request's logits (and so its tokens, greedy or seeded) do not
     * depend on the other requests in a step, on how its prompt is chunked, or on a pause and
     * recompute. Costs prefill throughput (matrix-vector kernels for every matmul, attention one
     * query at a time). false */
    bool batch_invariant;
    /* Profile: GPU timestamps around every dispatch of every step, written to this file as a
     * Chrome trace (open in chrome://tracing or ui.perfetto.dev); each event is named by its
     * kernel and grouped by its debug-label path ("step 12 / layer 3"). NULL = off (default). */
    const char *profile_path;
} vki_engine_params;

VKI_API vki_engine_params vki_engine_default_params(void);

typedef struct vki_model_info {
    char name[128];                 /* general.name, or the file name */
    char arch[16];                  /* "llama", "qwen2" */
    char weight_type[16];           /* type of most matrix weights: "q4_k", "f16", ... */
    uint32_t n_vocab, n_layer, d_model, d_ff, n_head, n_head_kv, head_dim;
    uint32_t n_ctx_train;           /* context length in the file */
    uint32_t n_ctx;                 /* longest sequence this engine runs */
    uint32_t page_size, kv_pages;   /* KV pages per layer */
    uint32_t max_seqs, max_tokens;
    uint64_t weight_bytes;          /* device memory held by weights */
    uint64_t kv_bytes;              /* device memory held by the KV cache */
    char device[256];
} vki_model_info;

/* Opens the device, reads the GGUF, builds the tokenizer, uploads the weights, allocates the KV
 * cache and compiles every pipeline. On failure err (when not NULL) says why: the malformed key
 * or tensor, the unsupported architecture or type, the memory that ran out. */
VKI_API vki_status vki_engine_create(const char *gguf_path, const vki_engine_params *params, vki_engine **out,
                                     char *err, size_t err_len);
VKI_API void vki_engine_destroy(vki_engine *e); /* NULL is fine; destroy its batch manager first */
VKI_API const vki_tokenizer *vki_engine_tokenizer(const vki_engine *e);
VKI_API void vki_engine_info(const vki_engine *e, vki_model_info *out);

#ifdef __cplusplus
}
#endif
#endif /* VKINFER_H */
