// quant_x8's arithmetic on one block of 32 values: int8 per value with one f32 scale d = max|v|
// / 127 (ggml's Q8_0 rounding, the scale kept in f32), four values per word, low byte first.
// Shared by quant_x8.comp and the kernels that write its layout for the next integer-dot
// products (matvec.comp's norm and gate|up epilogues, rmsnorm.comp, attn_decode.comp's output),
// so all of them give the same bits.
#ifndef VKI_QUANT_X8_GLSL
#define VKI_QUANT_X8_GLSL

void xq_block(in vec4 v[8], out uint q[8], out float d)
{
    float amax = 0.0;
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        const vec4 a = abs(v[i]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    d = amax * (1.0 / 127.0); // a product, correctly rounded: the C side gets the same d
    const float id = d != 0.0 ? 1.0 / d : 0.0;
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        const vec4 t = v[i] * id;
        const ivec4 s = clamp(ivec4(sign(t) * floor(abs(t) + 0.5)), -127, 127);
        q[i] = (uint(s.x) & 0xFFu) | (uint(s.y) & 0xFFu) << 8 | (uint(s.z) & 0xFFu) << 16 | uint(s.w) << 24;
    }
}

// v = the 32 consecutive values src[i0 ..] (a buffer or shared array), as xq_block takes them.
#define XQ_LOAD(v, src, i0)                                                                   \
    [[unroll]] for (uint i_ = 0u; i_ < 8u; i_++)                                              \
        v[i_] = vec4(src[(i0) + 4u * i_], src[(i0) + 4u * i_ + 1u], src[(i0) + 4u * i_ + 2u],   \
                     src[(i0) + 4u * i_ + 3u]);

// Stores block b of row m (q, d from xq_block) in the layout of vki_pc_quant_x8 for M rows of K
// elements: words and scales are the uint and float views of one buffer.
#define XQ_STORE(words, scales, M, K, m, b, q, d)                                                \
    {                                                                                         \
        const uint r_ = (m) * ((K) / 4u) + 8u * (b);                                          \
        [[unroll]] for (uint i_ = 0u; i_ < 8u; i_++)                                          \
            words[r_ + i_] = q[i_];                                                           \
        scales[(M) * ((K) / 4u) + (m) * ((K) / 32u) + (b)] = d;                               \
    }

#endif
