/* Paged KV cache writes and attention over the pages (layout and per-step buffers: the "paged
 * KV cache" section of shaders/vki_shared.h).
 *
 * Per model, at engine open: op_attn_setup() validates the shape and picks the kernels' sizes
 * from the device; op_attn_prepare() creates their pipelines (else the first dispatch of each
 * does). Per step: fill vki_seq_info[] (and tok_pos, tok_seq,
 * page_table) on the host, build the work list with op_attn_plan_build(), upload all five, then
 * per layer record op_kv_write() (which can apply RoPE to K), vkd_barrier(), op_attention() (a
 * decode step: op_kv_write() and op_attention() with op_attn_fresh, no barrier between).
 *
 * A ragged batch is split by kind: one-token sequences (decode) go to the split-K decode kernel
 * (their long contexts are cut into splits over many workgroups; the last split of a sequence
 * to finish merges them); sequences with several new tokens (prefill chunks) go to the tiled
 * prefill kernel. Both dispatches are recorded back to back without a barrier (they write
 * disjoint output rows), so a mid-prefill sequence and the decoding ones run concurrently. */
#ifndef VKI_ENGINE_OPS_ATTN_H
#define VKI_ENGINE_OPS_ATTN_H

#include "engine/ops_basic.h"

typedef struct op_attn_shape {
    uint32_t n_heads, n_kv_heads; /* n_heads % n_kv_heads == 0 (GQA; MQA: n_kv_heads = 1) */
    uint32_t head_dim;            /* multiple of 8, 8..256 (Q8_0: of 32) */
    uint32_t page_size;           /* tokens per page (default 16) */
    uint32_t kv_type;             /* VKI_GGML_F16 (the engine default), VKI_GGML_F32 (= 0) or
                                     VKI_GGML_Q8_0 */
    float scale;                  /* softmax scale; 0 = 1/sqrt(head_dim) */
    float softcap;                /* attention logit soft-cap c: score = c tanh(score / c)
                                     (gemma 2: 50); 0 = none */
    uint32_t window;              /* keys a query sees, its own included (sliding window); 0 = all */
    uint32_t sink;                /* with a window: leading keys every query also sees (the
                                     attention sink of a capped window); 0 = none */
    float temp_scale;             /* temp_len > 0: the query at position pos is scaled by 1 +  */
    uint32_t temp_len;            /* temp_scale ln(floor(pos / temp_len) + 1) (Mistral 3's,
                                     Llama 4's attention temperature); 0 = none */
} op_attn_shape;

/* Plain data filled by op_attn_setup (no device objects: copy freely, nothing to free). */
typedef struct op_attn {
    op_attn_shape s;
    uint32_t dec_spec[5];     /* attn_decode {WG, HD, L lanes per key, GMAX heads per group, KU keys
                                 per key group loaded together} */
    vkk_id pre_kid;           /* prefill kernel: FP32 (attn_prefill) or on cooperative matrices */
    uint32_t pre_spec[8];     /* attn_prefill {WG, HD, BR rows, BC keys per tile}; on cooperative
                                 matrices {WG, HDP padded head dim, BR, BC, CM_M, CM_N, CM_K, CM_SG} */
    uint32_t red_spec[1], kvw_spec[1];
    uint32_t dec_gw, dec_nhb; /* decode: query heads per workgroup, workgroups per kv head */
    uint32_t pre_gw, pre_nhb, pre_nq; /* prefill: heads and tokens per row block */
    uint32_t target_groups;   /* decode splits aim at this many workgroups in all */
    uint32_t min_split;       /* keys per split at least (automatic split length) */
    uint32_t split_keys;      /* 0: automatic; else every decode split has this many keys */
} op_attn;

/* VKI_ERR_INVALID_ARG for an invalid shape, VKI_ERR_UNSUPPORTED when the device lacks subgroup
 * shuffles or shared memory for the smallest tiles. Creates no device object. Prefill
 * runs on cooperative matrices (F16 Q, K, V, P; F32 softmax and accumulation) when the device
 * has a cooperative-matrix path (vkd_device.cm) and a tile fits its shared memory, else on the
 * FP32 kernel. */
vki_status op_attn_setup(vkd_device *d, const op_attn_shape *s, op_attn *out);

/* Creates the pipelines a's dispatches use (KV write, decode, prefill, reduce). */
vki_status op_attn_prepare(vkd_device *d, const op_attn *a);

/* Bytes of one page of one pool (K or V; Q8_0: both planes and padding, vki_shared.h) and the
 * most pages one pool may hold so that it stays one storage binding (maxStorageBufferRange) and
 * one allocation. */
uint64_t op_kv_page_bytes(const op_attn_shape *s);
uint32_t op_kv_max_pages(const vkd_device *d, const op_attn_shape *s);

typedef struct op_attn_plan {
    uint32_t n_tokens;           /* sum of n_new: rows of q / k / v / out */
    uint32_t n_items;            /* items written: 1 + n_pre + n_seqs + n_dec */
    uint32_t n_dec, n_red, n_pre;/* decode splits, reduce entries to run (one per sequence, or 0
                                    when no sequence splits), prefill blocks */
    uint32_t red_off, dec_off;   /* first reduce entry, first decode split (vki_shared.h) */
    uint32_t n_slots;            /* partial slots the decode splits use */
    uint32_t split;              /* decode split length chosen (keys) */
} op_attn_plan;

/* Upper bound of items for any step of at most max_seqs sequences and max_tokens new tokens
 * (automatic split length): size the items buffer (16 bytes each) and the partials scratch. */
uint32_t op_attn_max_items(const op_attn *a, uint32_t max_seqs, uint32_t max_tokens);
/* Scratch bytes for n_slots partial slots (op_attn_max_items slots always suffice). */
uint64_t op_attn_scratch_bytes(const op_attn *a, uint32_t n_slots);
/* Bytes of the merge counters for steps of up to max_seqs sequences (op_attention's merge). */
uint64_t op_attn_merge_bytes(const op_attn *a, uint32_t max_seqs);

/* Builds the step's work list from its sequences into items[cap]. Each sequence needs
 * 1 <= n_new <= n_ctx and rows row0 .. row0 + n_new - 1 < sum of n_new. Decode splits cover only
 * the keys the query sees (the window [n_ctx - window, n_ctx) and the sink [0, sink)), so decode
 * reads O(window) keys however long the sequence. VKI_ERR_INVALID_ARG (nothing useful written)
 * on a bad sequence or when cap is too small. */
vki_status op_attn_plan_build(const op_attn *a, const vki_seq_info *seqs, uint32_t n_seqs,
                              vki_attn_item *items, uint32_t cap, op_attn_plan *plan);

/* Device views of the step's buffers (vki_shared.h) and the plan they were built with. */
typedef struct op_attn_step {
    vkd_view tok_pos, tok_seq, seq_info, page_table, items;
    const op_attn_plan *plan;
} op_attn_step;

/* RoPE of K done by op_kv_write as it writes (op_rope's rotation, bit for bit): the step then
 * needs no rope pass over K and no barrier between it and the write. */
typedef struct op_kv_rope {
    uint32_t n_rot; /* even, 2 .. head_dim */
    bool neox;
    vkd_view freqs; /* op_rope_freqs' table: vec4[n_rot / 2] */
} op_kv_rope;

/* Writes rows k, v (f32 [n_tokens][n_kv_heads * head_dim] at the op_mat offsets/strides) into
 * the pools at their tokens' positions; K rotated by rope on the way, or as given (rope NULL:
 * K after RoPE already). Positions < 2^24 with rope. */
vki_status op_kv_write(vkd_cmd *c, const op_attn *a, const op_attn_step *st, op_mat k, op_mat v,
                       vkd_view k_pool, vkd_view v_pool, const op_kv_rope *rope);

/* A decode step's own keys read from the projections (vki_pc_attn.fresh): op_attention rotates
 * q by RoPE as it loads it and takes each sequence's newest key and value (position n_ctx - 1)
 * from k and v, rotated and rounded as op_kv_write (given the same rope) stores them, bit for
 * bit. The step's op_kv_write then needs no barrier before op_attention (record it before or
 * after, in the same stage) and q no op_rope. Only for steps whose sequences have one new token
 * each (every other key of theirs is in the pools already): the plan must have no prefill block,
 * and no two sequence entries may be one sequence's tokens (the batch-invariant layout of a
 * prefill). */
typedef struct op_attn_fresh {
    op_mat k, v;             /* f32 [n_tokens][n_kv_heads * head_dim]: K before RoPE, V */
    const op_kv_rope *rope;  /* NULL: q and K as given (no RoPE) */
    vkd_view xq;             /* .buf NULL, or the output also quantised as op_quant_x8(out,
                                M = n_tokens, K = n_heads * head_dim) writes it, bit for bit, for
                                an integer-dot output projection (head_dim a multiple of 32,
                                with merge) */
} op_attn_fresh;

/* out[t][h] = sum_j softmax_j(scale q[t][h] . K_j) V_j over positions j <= pos(t) of t's
 * sequence, read from the pools (kv_write must have run, with a barrier, for this step; with
 * fresh, see op_attn_fresh).
 * q, out: f32 [n_tokens][n_heads * head_dim]. scratch: op_attn_scratch_bytes(plan->n_slots)
 * (any valid view when n_slots is 0). Records decode + prefill; a sequence's decode splits are
 * merged by the last of them to finish when merge is given (u32 counters,
 * op_attn_merge_bytes(the step's sequences), zero-filled once when created: every dispatch
 * leaves them zero), else by a reduce pass after a barrier (the same bits either way). The
 * caller puts a barrier before the next reader of out. sink_logits (gpt-oss; NULL: none):
 * f32 [n_heads], one learned logit per query head in every softmax's denominator (no value):
 * softmax_j = e^(z_j) / (e^(sink_h) + sum_i e^(z_i)), z = scale q . K (vki_shared.h). */
vki_status op_attention(vkd_cmd *c, const op_attn *a, const op_attn_step *st, op_mat q, op_mat out,
                        vkd_view k_pool, vkd_view v_pool, vkd_view scratch, const vkd_view *merge,
                        const op_attn_fresh *fresh, const vkd_view *sink_logits);

#endif
