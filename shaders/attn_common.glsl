// Paged KV pool access shared by kv_write and the attention kernels (layout: vki_shared.h).
// A chunk is 8 consecutive dims of one K or V row. Rows of a page: rip = kv_head * page_size +
// slot, KV_ROWS_PP of them per page (the including shader has a push block `p` with
// n_kv_heads and page_size). KV_LOAD(arr, page, rip, c, hd, lo, hi) reads chunk c of row rip of
// page `page` into two vec4:
//   KV_F16: one uvec4 of packed halves per chunk;  KV_F32: two vec4;
//   KV_Q8_0: two words of int8 in the qs plane times the block's f16 scale from the d plane.
// Indices fit 32 bits because one pool is one binding (<= 4 GiB).
#define KV_ROWS_PP (p.n_kv_heads * p.page_size)

#if defined(KV_F16)
#define KV_T uvec4
#define KV_LOAD(arr, page, rip, c, hd, lo, hi)                                                \
    {                                                                                         \
        uvec4 u_ = arr[((page) * KV_ROWS_PP + (rip)) * ((hd) / 8u) + (c)];                    \
        lo = vec4(unpackHalf2x16(u_.x), unpackHalf2x16(u_.y));                                \
        hi = vec4(unpackHalf2x16(u_.z), unpackHalf2x16(u_.w));                                \
    }
#elif defined(KV_Q8_0)
#define KV_T uint
ivec4 kv_i8x4(uint w)
{
    int s = int(w);
    return ivec4(bitfieldExtract(s, 0, 8), bitfieldExtract(s, 8, 8), bitfieldExtract(s, 16, 8), bitfieldExtract(s, 24, 8));
}
// First word of page `page`'s qs plane, and the first word of its d plane relative to it.
#define KV_Q8_PAGE(page, hd) ((page) * VKI_KV_Q8_PAGE_WORDS(KV_ROWS_PP, hd))
#define KV_Q8_DPLANE(hd) (KV_ROWS_PP * ((hd) / 4u))
#define KV_LOAD(arr, page, rip, c, hd, lo, hi)                                                \
    {                                                                                         \
        uint pb_ = KV_Q8_PAGE(page, hd), qw_ = pb_ + ((rip) * (hd) + 8u * (c)) / 4u;           \
        uint dw_ = arr[pb_ + KV_Q8_DPLANE(hd) + (rip) * VKI_KV_Q8_DW(hd) + (c) / 8u];         \
        float d_ = unpackHalf2x16(((c) & 4u) != 0u ? dw_ >> 16 : dw_).x;                      \
        lo = d_ * vec4(kv_i8x4(arr[qw_]));                                                    \
        hi = d_ * vec4(kv_i8x4(arr[qw_ + 1u]));                                               \
    }
#else
#define KV_T vec4
#define KV_LOAD(arr, page, rip, c, hd, lo, hi)                                                \
    {                                                                                         \
        uint ci_ = ((page) * KV_ROWS_PP + (rip)) * ((hd) / 8u) + (c);                         \
        lo = arr[2u * ci_];                                                                   \
        hi = arr[2u * ci_ + 1u];                                                              \
    }
#endif

#define NEG_INF uintBitsToFloat(0xff800000u)

// Soft-capped score in the log2 domain (see vki_pc_attn): s is q.k with q pre-scaled. |z| >= 9
// is +-1 to float precision; the clamp keeps tanh away from inf / inf.
// The attention temperature of the query at position pos (Llama 4, Mistral 3; 1 without): q is
// scaled by it as it is loaded, with q_scale.
#define ATTN_TEMP(pos) (p.temp_len != 0u ? 1.0 + p.temp_scale * log(float((pos) / p.temp_len) + 1.0) : 1.0)
#define ATTN_SCORE(s) (p.inv_softcap > 0.0 ? p.softcap_log2e * tanh(clamp((s) * p.inv_softcap, -9.0, 9.0)) : (s))

// The end of a row's online softmax: out = acc / l, with acc and l summed relative to the running
// max m (log2 domain; l = 0: no key seen, 0). With a sink logit (gpt-oss; sink in the log2 domain,
// NEG_INF: none) the sink's 2^(sink - m) joins the denominator; both terms are taken relative to
// max(m, sink) so neither overflows. Without one the result is exactly acc / l.
float attn_finish(float acc, float l, float m, float sink)
{
    if (sink == NEG_INF)
        return l > 0.0 ? acc / l : 0.0;
    float mx = max(m, sink), a = m == NEG_INF ? 0.0 : exp2(m - mx);
    return acc * a / (l * a + exp2(sink - mx));
}

#define ATTN_LOG2E 1.4426950408889634
// Head h's sink logit in the log2 domain, NEG_INF without sink logits (the including shader
// declares `sink_logit[]` and the push block `p`).
#define ATTN_SINK(h) (p.sink_logits != 0u ? sink_logit[h] * ATTN_LOG2E : NEG_INF)
