/* The sampling stage on the GPU (shaders/sample.comp; semantics in engine/sample_ref.h).
 *
 * The engine owns one op_sampler per step in flight. Per step, after the LM head wrote the
 * logits rows of the sequences that want a token (row i = the i-th such sequence of the plan):
 *
 *     op_sampler_pack_plan(s, plan, err, sizeof err);      // host: check + pack parameters
 *     op_sampler_copy_masks(s, staging);                   // grammar rows' masks, uploaded with
 *                                                          // the step's inputs
 *     vkd_barrier(&cmd);                                   // LM head writes -> sampler reads
 *     op_sampler_record(s, &cmd, logits_view, row_stride, masks_view); // in the step's command buffer
 *     ... submit, wait ...
 *     op_sampler_read(s, slots, outs);                     // host: token, logprob, top-n
 *
 * Nothing but vki_sample_out (180 bytes per row) comes back; the logits rows stay on the GPU and
 * are unchanged afterwards (the penalties and biases are applied in place and undone).
 *
 * Buffers: rows, edits and out are host-visible (written / read through their mappings), saved
 * is device-local; edits and saved grow at pack time when a step needs more entries. One
 * pack -> record -> wait -> read cycle at a time per sampler. */
#ifndef VKI_ENGINE_OPS_SAMPLE_H
#define VKI_ENGINE_OPS_SAMPLE_H

#include "engine/kernels.h"
#include "engine/sample_ref.h"
#include "engine/step.h"

/* Low level: the bindings of one sampling dispatch chain (see vki_pc_sample). */
typedef struct op_sample_args {
    vkd_view logits;     /* f32 [n_rows, row_stride], read-write (restored) */
    uint32_t row_stride; /* floats between rows, >= n_vocab */
    uint32_t n_rows, n_vocab;
    vkd_view rows;       /* vki_sample_row [n_rows] */
    vkd_view edits;      /* vki_sample_edit [n_edits], row i's at rows[i].edit0 */
    vkd_view saved;      /* f32 [n_edits], scratch */
    vkd_view out;        /* vki_sample_out [n_rows] */
    vkd_view masks;      /* u32 allowed-token bitsets of the rows with VKI_SAMPLE_MASK (row i's at
                            rows[i].mask0); buf NULL: no row has one */
} op_sample_args;

/* Workgroup size the sampler uses for a vocabulary on this device. */
uint32_t op_sample_wg(const vkd_device *d, uint32_t n_vocab);

/* Records the dispatches (rows split so each logits binding fits maxStorageBufferRange), then a
 * compute -> host barrier for the out buffer. No barrier before: the caller orders the logits
 * writes. VKI_ERR_INVALID_ARG when a shape does not fit (records nothing). */
vki_status op_sample(vkd_cmd *c, const op_sample_args *a);

typedef struct op_sampler op_sampler;

/* max_rows: most sequences sampled in one step. Creates the buffers; op_sampler_prepare the
 * pipeline (else the first op_sample compiles it). */
vki_status op_sampler_create(vkd_device *d, uint32_t max_rows, uint32_t n_vocab, op_sampler **out);
vki_status op_sampler_prepare(op_sampler *s);
void op_sampler_destroy(op_sampler *s); /* NULL is fine */

/* Packs rows 0 .. n_rows - 1 from reqs (sample_pack_row). Rows with a mask get mask0 = k * words
 * for the k-th of them (words = ceil(n_vocab / 32)): op_sampler_copy_masks lays the masks out in
 * that order. A row with a pending token (sample_req_pends) has its pending entry at edits[i]
 * (the first n_rows entries are reserved when any row has one: a recording that copies the token
 * there keeps its offsets from step to step), see op_sampler_pending_view. VKI_ERR_INVALID_ARG
 * with err naming the field for an invalid request (nothing is packed then),
 * VKI_ERR_OUT_OF_*_MEMORY when growing the edit buffers fails. The masks are read by reference
 * until op_sampler_copy_masks. */
vki_status op_sampler_pack(op_sampler *s, const sample_req *reqs, uint32_t n_rows, char *err, size_t n_err);

/* Packs the plan's sequences with want_token, in plan order: position pos0 + n_new, the seq's
 * seed, history, token mask and sampling params (NULL = greedy); a VKI_TOKEN_PREV entry's token
 * is pending (the caller copies it into op_sampler_pending_view on the device). */
vki_status op_sampler_pack_plan(op_sampler *s, const vki_step_plan *plan, char *err, size_t n_err);

/* Bytes of the packed rows' masks (0: none has one), and a copy of them, back to back, to dst. */
size_t op_sampler_mask_bytes(const op_sampler *s);
void op_sampler_copy_masks(const op_sampler *s, void *dst);
/* The masks taken again from plan, the plan op_sampler_pack_plan packed (the same rows want a
 * token, the same of them have a mask; what the masks point at may have changed), for a copy
 * made after the pack. VKI_ERR_INVALID_ARG (nothing changed) when the rows with masks differ. */
vki_status op_sampler_repoint_masks(op_sampler *s, const vki_step_plan *plan);

/* Records the sampling of the packed rows over logits (row i at float i * row_stride of the view;
 * the view's offset must be a multiple of minStorageBufferOffsetAlignment). masks: where the
 * caller put op_sampler_copy_masks's bytes on the device (ignored when there are none). */
vki_status op_sampler_record(op_sampler *s, vkd_cmd *c, vkd_view logits, uint32_t row_stride, vkd_view masks);

/* After the command buffer completed: the packed rows' results, [n_rows]. */
const vki_sample_out *op_sampler_out(const op_sampler *s);

/* Fills outs[i] for packed row i (token, logprob, top), its slot from slots[i] (the i-th sequence
 * of the plan with want_token). */
void op_sampler_read(const op_sampler *s, const uint32_t *slots, vki_step_out *outs);

/* Where the device writes packed row i's token (an i32 in the out buffer): a later step's copy
 * source for VKI_TOKEN_PREV. */
vkd_view op_sampler_token_view(const op_sampler *s, uint32_t row);

/* Packed row i's pending entry's token (an i32 in the edits buffer): where a step copies the
 * token in flight (a VKI_TOKEN_PREV row with penalties, VKI_SAMPLE_PENDING); .buf NULL when row i
 * has none. op_sampler_pending_token: the value there (after the step completed: what the device
 * copied). */
vkd_view op_sampler_pending_view(const op_sampler *s, uint32_t row);
int32_t op_sampler_pending_token(const op_sampler *s, uint32_t row);

#endif
