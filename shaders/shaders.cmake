# Every SPIR-V module the library embeds: vki_shader(<blob name> <source> [DEFINE=VALUE...]).
# Data types are #defines; sizes/flags are specialisation constants (see engine/kernels.c).
vki_shader(add add.comp)
# matmul family: one module per weight type (dequant.glsl picks the block decoder), for each
# X(ID, blob suffix) entry of engine/weight_types.h, the list the C side generates its kernel ids
# from. matmul_cm: tensor cores through VK_NV_cooperative_matrix; matmul_cme: the same source on
# coopmat.glsl's emulation (runs anywhere; the tests use it).
file(READ ${PROJECT_SOURCE_DIR}/engine/weight_types.h VKI_WT_TEXT)
string(REGEX MATCHALL "X\\([A-Z0-9_]+, [a-z0-9_]+\\)" VKI_WT_ENTRIES "${VKI_WT_TEXT}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/engine/weight_types.h)
foreach(entry ${VKI_WT_ENTRIES})
  string(REGEX REPLACE "X\\(([A-Z0-9_]+), ([a-z0-9_]+)\\)" "\\1;\\2" pair "${entry}")
  list(GET pair 0 T)
  list(GET pair 1 t)
  vki_shader(matvec_${t} matvec.comp DQ_${T}=1)
  vki_shader(matmul_${t} matmul.comp DQ_${T}=1)
  vki_shader(matmul_cm_${t} matmul_cm.comp DQ_${T}=1 CM_NV=1)
  vki_shader(matmul_cme_${t} matmul_cm.comp DQ_${T}=1 CM_EMU=1)
  vki_shader(get_rows_${t} get_rows.comp DQ_${T}=1)
endforeach()
# row norms and elementwise ops (engine/ops_basic.c)
vki_shader(rmsnorm rmsnorm.comp)
vki_shader(rope rope.comp)
vki_shader(swiglu swiglu.comp)
vki_shader(softmax softmax.comp)
# paged KV cache writes and attention (engine/ops_attn.c): one module per KV element type
foreach(t f16 f32)
  string(TOUPPER ${t} T)
  vki_shader(kv_write_${t} kv_write.comp KV_${T}=1)
  vki_shader(attn_decode_${t} attn_decode.comp KV_${T}=1)
  vki_shader(attn_prefill_${t} attn_prefill.comp KV_${T}=1)
  vki_shader(attn_prefill_cm_${t} attn_prefill_cm.comp KV_${T}=1 CM_NV=1)
  vki_shader(attn_prefill_cme_${t} attn_prefill_cm.comp KV_${T}=1 CM_EMU=1)
endforeach()
vki_shader(attn_reduce attn_reduce.comp)
# sampling stage (engine/ops_sample.c)
vki_shader(sample sample.comp)
# cooperative-matrix peak (tools/bench_kernels.c), tensor cores and emulated
vki_shader(cm_peak cm_peak.comp CM_NV=1)
vki_shader(cm_peak_emu cm_peak.comp CM_EMU=1)
