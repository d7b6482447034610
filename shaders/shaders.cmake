# Every SPIR-V module the library embeds: vki_shader(<blob name> <source> [DEFINE=VALUE...]).
# Data types are #defines; sizes/flags are specialisation constants (see engine/kernels.c).
vki_shader(add add.comp)
# matmul family: one module per weight type (dequant.glsl picks the block decoder).
foreach(t f32 f16 q8_0 q4_0 q4_k q6_k)
  string(TOUPPER ${t} T)
  vki_shader(matvec_${t} matvec.comp DQ_${T}=1)
  vki_shader(matmul_${t} matmul.comp DQ_${T}=1)
  vki_shader(get_rows_${t} get_rows.comp DQ_${T}=1)
endforeach()
# row norms and elementwise ops (engine/ops_basic.c)
vki_shader(rmsnorm rmsnorm.comp)
vki_shader(rope rope.comp)
vki_shader(swiglu swiglu.comp)
vki_shader(softmax softmax.comp)
