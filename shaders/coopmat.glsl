// Cooperative matrices behind one small layer, so the tiling code of matmul_cm.comp and
// attn_prefill_cm.comp is written once and compiled twice (shaders.cmake):
//   CM_NV   VK_NV_cooperative_matrix (glslang 12 compiles it; NVIDIA's driver runs it on tensor
//           cores). A VK_KHR_cooperative_matrix branch (glslang >= 13) maps onto the same calls.
//   CM_EMU  plain GLSL: a fragment is a private array spread over the subgroup, the multiply-add
//           exchanges the A operand with subgroup shuffles. Operands are F16 values (the kernels
//           stage them as float16_t, as for the real path) and products are accumulated in F32,
//           so results match the tensor-core path up to the order of the F32 additions.
//
// The including kernel defines CM_SPEC_ID: specialisation constants CM_SPEC_ID .. +3 are the
// fragment shape (CM_M, CM_N, CM_K) the host read from the device and, for CM_EMU, the subgroup
// size CM_SG the fragments are spread over (= the device's subgroupSize, which SPIR-V 1.5
// modules without the varying-size flag run with).
//
// Fragments: A is CM_M x CM_K (F16), B is CM_K x CM_N (F16), C is CM_M x CM_N (F32).
//   CM_DECL_A(a, n), CM_DECL_B(b), CM_DECL_C(c, n)   declare n A fragments / one B / n C
//   cm_fill_c(c, v)                 every element of c = v
//   cm_load_a(a, buf, el, st)       A[r][k] = buf[el + r * st + k]   (buf: a float16_t array)
//   cm_load_b(b, buf, el, st)       B[k][n] = buf[el + k * st + n]
//   cm_load_bt(b, buf, el, st)      B[k][n] = buf[el + n * st + k]   (B stored transposed)
//   cm_load_a4(a, buf, el, st), cm_load_b4(b, buf, el, st), cm_load_bt4(b, buf, el, st)
//                                   the same from a uvec2 array packing 4 F16 values per element
//                                   (cm_f16x4), el and st still in F16 values, multiples of 4:
//                                   stores of 4 values are one 64-bit store, and the NV load
//                                   knows its rows' alignment from the type (SPV_NV_cooperative_
//                                   matrix's issue 8: shared memory declared as a wider type)
//   cm_mul_add(c, a, b)             c = a * b + c
//   cm_store_c(c, buf, el, st)      buf[el + r * st + n] = C[r][n]   (buf: a float array)
//   CM_UNROLL                       [[unroll]] on NV, where fragment arrays must stay in
//                                   registers; nothing on the emulation (code size on CPUs)
// Every invocation of the subgroup makes each call with the same arguments (control flow
// uniform in the subgroup); el and st keep matrix rows 16-byte aligned (the NV load rule).
// The element order inside a fragment is unknown to the kernels (opaque on NV): element-wise
// work goes through shared memory.

layout(constant_id = CM_SPEC_ID) const uint CM_M = 16;
layout(constant_id = CM_SPEC_ID + 1) const uint CM_N = 16;
layout(constant_id = CM_SPEC_ID + 2) const uint CM_K = 16;
layout(constant_id = CM_SPEC_ID + 3) const uint CM_SG = 32;

#if defined(CM_NV) // ---------------------------------------------------------------------------
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require

#define CM_UNROLL [[unroll]]
#define CM_A_T fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K>
#define CM_B_T fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N>
#define CM_C_T fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N>
#define CM_DECL_A(a, n) CM_A_T a[n]
#define CM_DECL_B(b) CM_B_T b
#define CM_DECL_C(c, n) CM_C_T c[n]
#define cm_fill_c(c, v) (c) = CM_C_T(v)
#define cm_load_a(a, buf, el, st) coopMatLoadNV(a, buf, el, st, false)
#define cm_load_b(b, buf, el, st) coopMatLoadNV(b, buf, el, st, false)
#define cm_load_bt(b, buf, el, st) coopMatLoadNV(b, buf, el, st, true)
#define cm_load_a4(a, buf, el, st) coopMatLoadNV(a, buf, (el) / 4u, (st) / 4u, false)
#define cm_load_b4(b, buf, el, st) coopMatLoadNV(b, buf, (el) / 4u, (st) / 4u, false)
#define cm_load_bt4(b, buf, el, st) coopMatLoadNV(b, buf, (el) / 4u, (st) / 4u, true)
#define cm_mul_add(c, a, b) (c) = coopMatMulAddNV(a, b, c)
#define cm_store_c(c, buf, el, st) coopMatStoreNV(c, buf, el, st, false)

#elif defined(CM_EMU) // ------------------------------------------------------------------------
#extension GL_KHR_shader_subgroup_shuffle : require
// Element e of a fragment in row-major order lives in lane e % CM_SG, slot e / CM_SG. With
// CM_N % CM_SG == 0 (the host picks CM_N = max(16, CM_SG)) a lane's C elements and B elements
// are the same columns, so B never moves; slot i of C is row (i * CM_SG) / CM_N for every lane,
// so each A element a multiply-add needs is one shuffle from one lane to all. Per multiply-add
// and lane: CM_M * CM_K shuffles and CM_M * CM_N * CM_K / CM_SG FMAs.
const uint CM_AE = CM_M * CM_K / CM_SG; // slots per lane
const uint CM_BE = CM_K * CM_N / CM_SG;
const uint CM_CE = CM_M * CM_N / CM_SG;
const uint CM_NS = CM_N / CM_SG;        // C (and B) slots per row

#define CM_UNROLL
#define CM_DECL_A(a, n) float a[n][CM_AE]
#define CM_DECL_B(b) float b[CM_BE]
#define CM_DECL_C(c, n) float c[n][CM_CE]
#define cm_fill_c(c, v)                                                                         \
    {                                                                                           \
        for (uint cm_j = 0u; cm_j < CM_CE; cm_j++)                                              \
            (c)[cm_j] = (v);                                                                    \
    }
// dst[j] = GET(buf, el + row(e) * st + col(e)), e = j * CM_SG + lane, over a rows x cols
// fragment; tr swaps the roles of row and column in the address (transposed storage).
#define CM_EMU_LOAD(dst, slots, cols, tr, GET, buf, el, st)                                     \
    {                                                                                           \
        const uint cm_el = (el), cm_st = (st);                                                  \
        for (uint cm_j = 0u; cm_j < (slots); cm_j++) {                                          \
            const uint cm_e = cm_j * CM_SG + gl_SubgroupInvocationID;                           \
            const uint cm_r = cm_e / (cols), cm_c = cm_e % (cols);                              \
            (dst)[cm_j] = GET(buf, cm_el + ((tr) ? cm_c * cm_st + cm_r : cm_r * cm_st + cm_c)); \
        }                                                                                       \
    }
#define CM_GET(buf, i) float(buf[i])
// F16 value i of a uvec2 array of cm_f16x4 quads
#define CM_GET4(buf, i) float(unpackFloat2x16(buf[(i) >> 2u][((i) >> 1u) & 1u])[(i) & 1u])
#define cm_load_a(a, buf, el, st) CM_EMU_LOAD(a, CM_AE, CM_K, false, CM_GET, buf, el, st)
#define cm_load_b(b, buf, el, st) CM_EMU_LOAD(b, CM_BE, CM_N, false, CM_GET, buf, el, st)
#define cm_load_bt(b, buf, el, st) CM_EMU_LOAD(b, CM_BE, CM_N, true, CM_GET, buf, el, st)
#define cm_load_a4(a, buf, el, st) CM_EMU_LOAD(a, CM_AE, CM_K, false, CM_GET4, buf, el, st)
#define cm_load_b4(b, buf, el, st) CM_EMU_LOAD(b, CM_BE, CM_N, false, CM_GET4, buf, el, st)
#define cm_load_bt4(b, buf, el, st) CM_EMU_LOAD(b, CM_BE, CM_N, true, CM_GET4, buf, el, st)
#define cm_mul_add(c, a, b)                                                                     \
    {                                                                                           \
        for (uint cm_r = 0u; cm_r < CM_M; cm_r++) {                                             \
            float cm_av[CM_K];                                                                  \
            [[unroll]] for (uint cm_k = 0u; cm_k < CM_K; cm_k++) {                              \
                const uint cm_e = cm_r * CM_K + cm_k;                                           \
                cm_av[cm_k] = subgroupShuffle((a)[cm_e / CM_SG], cm_e % CM_SG);                 \
            }                                                                                   \
            for (uint cm_t = 0u; cm_t < CM_NS; cm_t++) {                                        \
                float cm_s = (c)[cm_r * CM_NS + cm_t];                                          \
                [[unroll]] for (uint cm_k = 0u; cm_k < CM_K; cm_k++)                            \
                    cm_s = fma(cm_av[cm_k], (b)[cm_k * CM_NS + cm_t], cm_s);                    \
                (c)[cm_r * CM_NS + cm_t] = cm_s;                                                \
            }                                                                                   \
        }                                                                                       \
    }
#define cm_store_c(c, buf, el, st)                                                              \
    {                                                                                           \
        const uint cm_el = (el), cm_st = (st);                                                  \
        for (uint cm_j = 0u; cm_j < CM_CE; cm_j++) {                                            \
            const uint cm_e = cm_j * CM_SG + gl_SubgroupInvocationID;                           \
            buf[cm_el + (cm_e / CM_N) * cm_st + cm_e % CM_N] = (c)[cm_j];                       \
        }                                                                                       \
    }

#else
#error "coopmat.glsl: define CM_NV or CM_EMU"
#endif

#include "f16x4.glsl" // cm_f16x4: the quads cm_load_a4 / _b4 / _bt4 read
