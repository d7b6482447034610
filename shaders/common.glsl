// Included first by every kernel: extensions, the C/GLSL shared header, small helpers.
// Every .comp starts: #version 450, #extension GL_GOOGLE_include_directive : require, #include "common.glsl".
#extension GL_EXT_control_flow_attributes : require
#include "vki_shared.h"

// The FFN's gate activations (VKI_GLU_*), shared by glu.comp and the matrix-vector kernel's
// fused epilogue, so both produce the same bits: `precise` keeps every compiler from
// contracting or reordering them differently in the two places.
// tanh without the inf/inf of exp-based implementations: |z| >= 9 is +-1 to float precision.
float vki_tanh_sat(float z) { return tanh(clamp(z, -9.0, 9.0)); }

float vki_glu_act(uint act, float v)
{
    if (act == VKI_GLU_GELU_TANH) {
        // ggml's GELU (the one Gemma is trained with): 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
        precise float r = 0.5 * v * (1.0 + vki_tanh_sat(0.7978845608028654 * v * (1.0 + 0.044715 * v * v)));
        return r;
    }
    // v / (1 + e^-v): e^-v = inf for v < -88 gives -0, the right limit; no NaN path.
    precise float r = v / (1.0 + exp(-v));
    return r;
}

// The gated unit y = act(g) * u for every VKI_GLU_*: gpt-oss's clamped SwiGLU (VKI_GLU_SWIGLU_OAI,
// ggml's swiglu_oai: the gate capped at 7 from above, up clamped to [-7, 7] and shifted by one)
// or act(g) * u.
float vki_glu(uint act, float g, float u)
{
    if (act == VKI_GLU_SWIGLU_OAI) {
        float x = min(g, VKI_GLU_OAI_LIMIT), y = clamp(u, -VKI_GLU_OAI_LIMIT, VKI_GLU_OAI_LIMIT);
        precise float r = x / (1.0 + exp(-VKI_GLU_OAI_ALPHA * x)) * (y + 1.0);
        return r;
    }
    precise float v = vki_glu_act(act, g) * u;
    return v;
}
