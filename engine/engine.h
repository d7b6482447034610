/* The GPU engine: a device, a model's weights, the paged KV cache, activation scratch and the
 * per-step inputs; vk_engine_step() runs one step plan (engine/step.h) as one command buffer:
 * upload inputs -> embedding -> layers -> LM head on the rows that want a token -> sampling.
 * vk_engine_submit / vk_engine_wait split a step so that two can be in flight: the host packs and
 * submits step N + 1 (its decode tokens read on the device from step N's sampler,
 * VKI_TOKEN_PREV) while the device still runs step N. vk_engine_submit_masks_later submits step
 * N + 1 without its sampler, whose token masks (a grammar's, which depend on step N's token) come
 * with vk_engine_submit_masks.
 * Knows nothing of requests, queues, tokenizers or HTTP. */
#ifndef VKI_ENGINE_ENGINE_H
#define VKI_ENGINE_ENGINE_H

#include "engine/capture.h"
#include "engine/model.h"
#include "engine/ops_attn.h"
#include "engine/ops_sample.h"
#include "engine/profile.h"
#include "engine/step.h"

typedef struct vk_engine_params {
    uint32_t page_size;     /* tokens per KV page (default 16) */
    uint32_t kv_type;       /* VKI_GGML_F16 (default), VKI_GGML_F32 or VKI_GGML_Q8_0 (head_dim % 32 == 0) */
    uint64_t kv_tokens;     /* KV pool capacity in tokens; 0: kv_fraction of free memory */
    float kv_fraction;      /* of the device memory free after weights (vkd_memory_available; 0.8) */
    uint64_t device_memory_limit; /* 0: none; else the device's buffers stay under it (mem_limit) */
    uint32_t max_seqs;      /* sequence slots (default 256) */
    uint32_t max_tokens;    /* new tokens per step: activation scratch rows (default 2048) */
    uint32_t max_ctx;       /* longest sequence; 0: the model's context length */
    vki_progress_fn progress; /* weight upload progress (NULL: none); may cancel the load */
    void *progress_user;
    const char *profile_path; /* non-NULL: GPU timestamps of every dispatch of every step written
                                 to this file as a Chrome trace (chrome://tracing, Perfetto) */
    int64_t capture_first, capture_last; /* RenderDoc capture of these steps; first < 0: off */
    /* Bitwise batch invariance: a sequence's logits do not depend on what else is in the step,
     * on how its prompt was chunked, or on a pause and recompute. Costs prefill speed: every
     * matmul takes the matrix-vector kernel (one fixed reduction order per row, weights re-read
     * per 32 rows) and every query token is attended on its own with a split length fixed per
     * engine (the decode kernel; no tiled prefill). */
    bool batch_invariant;
    /* Caps every layer's attention window at this many tokens, StreamingLLM style: a query sees
     * its last max_window positions plus the first page (the attention sink); pages outside that
     * are released while the sequence runs. 0 = the model's own windows (default). */
    uint32_t max_window;
    /* Op by op: no Q|K|V or gate|up concatenated at load, no residual add or gated activation
     * folded into a matmul, no joint rotation of q and k (the same results bit for bit; for
     * measuring the fusions). */
    bool no_fusion;
    /* Record every step anew instead of resubmitting a repeated recording (vkd_cmd reuse). */
    bool no_cmd_reuse;
    /* Decode projections of integer-block weights on the integer-dot path (op_matmul_i8):
     * activations rounded to int8 per block of 32 (vki_engine_params.int_dot). */
    bool int_dot;
} vk_engine_params;

vk_engine_params vk_engine_default_params(void);

/* Scratch buffers for max_tokens rows (T) and max_out rows that want logits (R). */
typedef struct vk_scratch {
    vkd_buffer *x;          /* f32 [T][d] residual stream */
    vkd_buffer *h;          /* f32 [T][d] normed input of attention / FFN, also wo / w_down output */
    vkd_buffer *o;          /* f32 [T][d] wo's output where h must outlive it (command-r's parallel
                               FFN, op by op); else NULL */
    vkd_buffer *q;          /* f32 [T][n_head * hd] (fused attn_qkv: [T][q | k | v]) */
    vkd_buffer *k, *v;      /* f32 [T][n_head_kv * hd] */
    vkd_buffer *att;        /* f32 [T][n_head * hd] attention output */
    vkd_buffer *g, *u;      /* f32 [T][d_ff] FFN gate / up (g also holds act(g) * u; fused gate|up:
                               g is [T][2 d_ff], u unused) */
    vkd_buffer *xs;         /* f32 [R][d] rows that want logits, then normed (in place; int_dot: into h) */
    vkd_buffer *logits;     /* f32 [R][n_vocab] */
    vkd_buffer *attn_tmp;   /* split-K partials (op_attn_scratch_bytes) */
    vkd_buffer *attn_cnt;   /* u32 merge counters of the decode splits (op_attn_merge_bytes), zero
                               between dispatches */
    vkd_buffer *mm_cnt;     /* u32 counters of the projection that also norms (op_matmul_norm: [0])
                               and of the quantising gate|up pass ([d_ff / 32]), zero between
                               dispatches */
    vkd_buffer *xq;         /* int_dot: a projection input quantised (op_quant_x8_bytes(T, max K)) */
    vkd_buffer *xh;         /* a tensor-core GEMM's input rounded to F16 (op_half_x; op_half_x_bytes(T,
                               max K)), on devices with a cooperative-matrix path; else NULL */
    vkd_buffer *gq;         /* int_dot: the gate|up pass's output quantised by that pass
                               (op_mm_glu_xq; op_quant_x8_bytes(T, d_ff)), the down projection's
                               input, apart from xq (the pass's own input) */
    vkd_buffer *rope_freqs[2]; /* f32 [2 * n_rot] rotation tables (op_rope_freqs) of the global and
                                  the sliding-window layers ([1] == [0] when they agree) */
    /* mixture of experts (engine/forward_moe.c), for C = moe_rows tokens per chunk, P = C n_used
     * pairs; NULL for dense models */
    uint32_t moe_rows;      /* C */
    vkd_buffer *moe_logits; /* f32 [C][n_expert] router logits */
    vkd_buffer *moe_ids;    /* i32 [P] chosen expert of each pair (pair = t * n_used + j) */
    vkd_buffer *moe_w;      /* f32 [P] its weight */
    vkd_buffer *moe_route;  /* u32 [n_expert + 1 + P] pairs grouped by expert */
    vkd_buffer *moe_g, *moe_u; /* f32 [P][d_ff_exp] expert gate (then silu(gate) * up) and up */
    vkd_buffer *moe_o;      /* f32 [P][d] expert outputs */
    vkd_buffer *moe_gh;     /* moe_g rounded to F16 (op_half_x of [P][d_ff_exp]), the down experts'
                               input on the tensor-core GEMM; NULL without one */
    vkd_buffer *moe_gq;     /* int_dot: moe_g quantised (op_quant_x8 of [P][d_ff_exp]), the down
                               projection's input; NULL without int_dot or when d_ff_exp % 32 */
} vk_scratch;

/* Per-step inputs: packed on the host into the step's flight's in_host (host-visible), copied
 * into `dev` with one transfer at the start of the step. Offsets are in bytes and aligned for
 * binding; every flight's in_host has the layout and cap of `dev`. */
typedef struct vk_step_inputs {
    vkd_buffer *dev;
    VkDeviceSize cap;       /* bytes of each buffer */
    VkDeviceSize off_tokens, off_pos, off_seq, off_info, off_pages, off_items[2], off_rows, off_masks, used;
    /* at off_masks: u32 allowed-token bitsets of the rows with a token_mask, ceil(n_vocab / 32)
     * words each, in plan order (op_sampler_copy_masks) */
    /* host-side staging of the arrays before the copy into `host` */
    vki_seq_info *info;     /* [max_info] attention sequences: the plan's, or one per token when
                               batch invariant */
    uint32_t max_info;
    uint32_t n_info;        /* entries of the current step */
    vki_attn_item *items;   /* [max_items] per attention kind */
    uint32_t max_items;
} vk_step_inputs;

/* A step from its submit to its wait, and what it owns until then: its command buffer (with its
 * own reused recordings), sampler buffers and packed inputs. Profiling and RenderDoc captures use
 * one flight (the caller waits before it submits again); otherwise two. */
typedef struct vk_flight {
    vkd_cmd cmd;
    vkd_cmd cmd_s;           /* its sampler, when the token masks came after the forward pass
                                (vk_engine_submit_masks_later) */
    op_sampler *sampler;
    vkd_buffer *in_host;     /* its packed inputs (host-visible) */
    bool pending;            /* submitted, not yet waited */
    bool exclusive;          /* its wait reads scratch back (host round trips, hidden rows, context
                                logits): no later step may be submitted before that wait */
    bool masks_due;          /* its forward pass submitted, its sampler waits for the masks */
    vki_status early_st;     /* of a fence wait done for it before its vk_engine_wait (a drain) */
    const vki_step_plan *plan; /* the submitted plan: read at the wait only when exclusive */
    uint32_t n_out;          /* rows sampled */
    uint32_t *out_slots;     /* [max_out] slot of each sampled row, in plan order */
    uint32_t n_tokens, n_seqs;
    uint64_t step;           /* its number (n_steps at the submit) */
    double host_ms;          /* host time of its submit */
} vk_flight;

#define VK_MAX_FLIGHTS 2

typedef struct vk_engine {
    vkd_device *dev;
    vk_engine_params p;
    vk_model model;
    uint32_t n_kinds;       /* attention kinds in use: 1, or 2 (global + sliding-window layers) */
    op_attn attn[2];        /* per kind (model_layer_kind): its window, sink, soft-cap, scale */
    bool kind_used[2];      /* some layer is of this kind (its work list is built each step) */
    uint32_t kv_window;     /* pages wholly before the last kv_window positions (and past kv_sink) are
                               seen by no layer and may be released; 0 = every page stays */
    uint32_t kv_sink;
    uint32_t n_pages;       /* KV pages per layer pool */
    vkd_buffer **k_pool;    /* [n_layer] K pages: [n_pages][n_head_kv][page_size][hd] */
    vkd_buffer **v_pool;    /* [n_layer] V pages, same */
    uint64_t kv_bytes;
    uint32_t max_out;       /* R: most rows that want a token in one step */
    uint32_t max_ctx;
    vk_scratch s;
    vk_step_inputs in;
    op_attn_plan attn_plan[2]; /* the current step's attention work list per kind */
    bool xq_of_h;           /* recording: s.xq holds s.h quantised (a norm epilogue wrote both), for
                               the next block's integer-dot products */
    bool xh_ready;          /* recording: s.xh holds the next tensor-core GEMMs' input in F16 (the
                               kernel that wrote the input wrote it too: a block's norm, s.h; the
                               gated unit, down's input) */
    uint8_t *slot_seen;     /* [max_seqs] all zero between steps; check_plan's uniqueness marks */
    vk_flight fl[VK_MAX_FLIGHTS];
    uint32_t n_flights;     /* 2, or 1 while profiling or capturing */
    uint32_t n_pending;     /* flights submitted and not yet waited, oldest at fl[head] */
    uint32_t head;
    vkd_cmd *cmd;           /* the command buffer being recorded (of the flight being submitted) */
    /* VKI_TOKEN_PREV: the row of each slot sampled on the device by the last submitted step
     * (UINT32_MAX: none, or the host resampled it), in the sampler of fl[prev_fl] */
    uint32_t *prev_row;     /* [max_seqs] */
    uint32_t prev_fl;       /* UINT32_MAX: no step submitted since open (or the last one failed) */
    uint32_t last_dispatches, last_barriers; /* recorded by the last submitted step */
    uint64_t n_steps;       /* steps submitted */
    uint64_t steps_reused;  /* steps whose command buffer was a kept recording (vkd_cmd reuse) */
    double last_step_ms;    /* host wall time of the last waited step: its submit plus its wait */
    double last_wait_ms;    /* of which blocked on the fence in the wait: the rest is host work
                               (checks, packing, recording, submit, reading results); with two
                               steps in flight it overlaps the device's work */
    vk_profile prof;        /* profile mode (prof.trace == NULL: off) */
    vk_capture capture;     /* RenderDoc capture of chosen steps */
    uint64_t kv_io_chunk;   /* staging bytes per command buffer of vk_engine_kv_read / _write;
                               0 = 32 MiB (tests lower it to cover several) */
} vk_engine;

/* Loads the model's weights (hp, t found in f), sizes and allocates the KV pools and scratch,
 * creates every pipeline. Errors leave nothing allocated. */
vki_status vk_engine_create(vkd_device *d, const gguf_file *f, const model_hparams *hp,
                            const model_tensors *t, const vk_engine_params *p, vk_engine **out);
void vk_engine_destroy(vk_engine *e);

/* Runs one step: vk_engine_submit then vk_engine_wait; nothing may be in flight. outs: one entry
 * per sequence with want_token, in plan order. logits (optional): the raw logits rows of those
 * sequences, [n_want][n_vocab], read back after the step (tests and debugging; costs a
 * device->host copy). Invalid plans are refused with VKI_ERR_INVALID_ARG and a log message before
 * anything is recorded. */
vki_status vk_engine_step(vk_engine *e, const vki_step_plan *plan, vki_step_out *outs, float *logits);

/* Checks, packs, records and submits one step without waiting for it. At most n_flights steps
 * in flight (VKI_ERR_INVALID_ARG beyond, or after a step whose wait reads scratch back: one with
 * a logits_hook, a sampled logits_sink, a hidden_hook or context logits). A decode entry (n_new
 * == 1) may give VKI_TOKEN_PREV as its token: the token the last submitted step sampled for that
 * slot on the device, read there, so the host need not have waited for it (refused when that
 * step sampled none for the slot or the host resampled it). The plan is read during the call;
 * one with host round trips must also stay valid until its wait. */
vki_status vk_engine_submit(vk_engine *e, const vki_step_plan *plan);
/* The same, but the token masks of its rows are read later, by vk_engine_submit_masks, which
 * then submits the step's sampler: a constrained request's mask for this step can be computed
 * from the token the step before samples while the device already runs this one's forward pass.
 * Which rows have a mask is fixed here; until the masks are given, no other step may be
 * submitted (its VKI_TOKEN_PREV tokens come from this one's sampler). A plain submit when no
 * row has a mask, or while profiling. */
vki_status vk_engine_submit_masks_later(vk_engine *e, const vki_step_plan *plan);
/* The masks of the last submitted step, read from plan (the submitted plan, whose rows' token
 * masks may since point elsewhere: a row with a mask then must have one now), and its sampler
 * submitted. VKI_OK with nothing to do when that step waits for no masks. A step whose wait (or
 * a drain) comes first samples with the masks its submit saw. */
vki_status vk_engine_submit_masks(vk_engine *e, const vki_step_plan *plan);
/* Waits for the oldest step in flight and fills its outs (and logits as vk_engine_step; logits
 * only when no later step is in flight, which would overwrite them). VKI_ERR_INVALID_ARG when
 * none is in flight. When a wait fails, the steps submitted after it read its tokens: their
 * results mean nothing. */
vki_status vk_engine_wait(vk_engine *e, vki_step_out *outs, float *logits);
/* Waits for every step in flight without reading results (their vk_engine_wait still does). */
vki_status vk_engine_drain(vk_engine *e);

/* Session files (engine/kv_io.c): the KV of whole pages copied between the pools and the host in a
 * layout that knows no page size nor the pools' padding: for the pages' tokens in order,
 *     [token][layer][K, V][kv head][row],  row = vk_engine_kv_row_bytes bytes:
 * head_dim values in F32 or F16, or for Q8_0 head_dim int8 then head_dim / 32 f16 scales (ggml's
 * Q8_0 numbers). Through a host-visible staging buffer of <= 32 MiB, one command buffer per
 * chunk of pages. Between steps only (the batch manager's worker, at a tick boundary).
 * VKI_ERR_INVALID_ARG for a page out of range; a device error otherwise (nothing written to the
 * pool is then defined). */
uint32_t vk_engine_kv_row_bytes(const vk_engine *e);
vki_status vk_engine_kv_read(vk_engine *e, const uint32_t *pages, uint32_t n, void *dst);
vki_status vk_engine_kv_write(vk_engine *e, const uint32_t *pages, uint32_t n, const void *src);

/* Floats between rows of the logits buffer (vocab rounded up so each row can start a binding). */
uint32_t vk_engine_logits_stride(const vk_engine *e);

/* Returns the status of x from the enclosing function when it is an error (the forward pass's
 * recording functions, which record nothing more after a failure). */
#define VK_TRY(x)                                                                               \
    do {                                                                                        \
        vki_status st_ = (x);                                                                   \
        if (st_ != VKI_OK)                                                                      \
            return st_;                                                                         \
    } while (0)

/* Records the forward pass of a validated, uploaded plan (engine/forward.c). */
vki_status vk_forward_record(vk_engine *e, const vki_step_plan *plan, uint32_t n_out);
/* Records the LM head over the n_out rows of s.x (of T) whose indices are at in.off_rows (device
 * copy) into s.logits rows [0, n_out); n_out <= max_out. */
vki_status vk_forward_record_lm_head(vk_engine *e, uint32_t T, uint32_t n_out);

/* Mixture of experts (engine/forward_moe.c): the FFN of layer il for T token rows (h holds the
 * normed input; the result is added into x), its scratch (no-ops for dense models) and its
 * pipelines. */
vki_status vk_forward_moe(vk_engine *e, uint32_t il, uint32_t T);
bool vk_moe_h_i8(const vk_engine *e, const vk_layer *L, uint32_t T);
bool vk_moe_h_xh(const vk_engine *e, uint32_t T);
vki_status vk_moe_scratch_create(vk_engine *e);
void vk_moe_scratch_destroy(vk_engine *e);
vki_status vk_moe_prepare(vk_engine *e);

#endif
