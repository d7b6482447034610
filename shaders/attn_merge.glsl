// Merge of decode splits, shared by attn_reduce.comp and attn_decode.comp's last split (the same
// arithmetic in the same order: the fold gives the separate pass's bits). The including shader
// declares the partials `part[]` (f32 [slot][n_heads][head_dim + 2], vki_shared.h), the sink
// logits `sink_logit[]` and the push block `p`.
//
// Output dim d of query head h from the n partial slots slot0 ..: sum_i 2^(m_i - M) acc_i /
// sum_i 2^(m_i - M) l_i, M = max_i m_i (attn_finish: with head h's sink logit). Reads n * 3
// floats besides the n dims: small next to the K/V the splits read.
float attn_merge(uint slot0, uint n, uint h, uint d)
{
    uint hd = p.head_dim;
    float mx = NEG_INF;
    for (uint i = 0; i < n; i++)
        mx = max(mx, part[((slot0 + i) * p.n_heads + h) * (hd + 2) + hd]);
    precise float den = 0.0, num = 0.0; // precise: both kernels round alike (no FMA contraction)
    for (uint i = 0; i < n; i++) {
        uint pb = ((slot0 + i) * p.n_heads + h) * (hd + 2);
        float w = exp2(part[pb + hd] - mx);
        den += w * part[pb + hd + 1];
        num += w * part[pb + d];
    }
    return attn_finish(num, den, mx, ATTN_SINK(h));
}
