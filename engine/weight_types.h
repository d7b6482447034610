/* The weight types the matmul family runs, one X(ID suffix, SPIR-V blob suffix) each. The one list
 * from which the per-type kernel ids (engine/kernels.h), kernel-table rows (engine/kernels.c),
 * ops_matmul.c's type table (checked by a static assert) and the per-type SPIR-V modules
 * (shaders/shaders.cmake reads the X(...) entries of this file) are generated. Adding a type:
 * one entry here, its row in ops_matmul.c's mm_types, its decoder in shaders/dequant.glsl. */
#ifndef VKI_ENGINE_WEIGHT_TYPES_H
#define VKI_ENGINE_WEIGHT_TYPES_H

#define VKK_WEIGHT_TYPES(X)                                                                 \
    X(F32, f32)                                                                             \
    X(F16, f16)                                                                             \
    X(BF16, bf16)                                                                           \
    X(Q8_0, q8_0)                                                                           \
    X(Q4_0, q4_0)                                                                           \
    X(Q4_1, q4_1)                                                                           \
    X(Q5_0, q5_0)                                                                           \
    X(Q5_1, q5_1)                                                                           \
    X(IQ4_NL, iq4_nl)                                                                       \
    X(Q2_K, q2_k)                                                                           \
    X(Q3_K, q3_k)                                                                           \
    X(Q4_K, q4_k)                                                                           \
    X(Q5_K, q5_k)                                                                           \
    X(Q6_K, q6_k)                                                                           \
    X(IQ4_XS, iq4_xs)                                                                       \
    X(MXFP4, mxfp4)

#endif
