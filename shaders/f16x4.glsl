// Four F32 values rounded to F16 (each as float16_t(v) would), packed two per word: the operand
// quads of the tensor-core kernels' shared tiles (coopmat.glsl's cm_load_*4) and the F16
// activations of half_x.comp, which the GEMM then copies into its tiles as they are: one function,
// so both give the same bits. The includer enables GL_EXT_shader_explicit_arithmetic_types_float16.
uvec2 cm_f16x4(vec4 v) { return uvec2(packFloat2x16(f16vec2(v.xy)), packFloat2x16(f16vec2(v.zw))); }
