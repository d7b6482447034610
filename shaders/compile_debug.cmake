# One shader of the profiling build (VKI_SHADER_DEBUG): GLSL -> SPIR-V with debug info, validated.
#   cmake -DGLSLANG= -DSPIRV_VAL= -DINC= -DDEFS="-DA=1;-DB=1" -DSRC= -DOUT= -P compile_debug.cmake
# First choice: -gVS, NonSemantic.Shader.DebugInfo.100 with the source (variables, scopes and
# lines for RenderDoc's and Nsight's shader debuggers). glslang 12 (Debian 12) writes invalid
# DebugTypeArray entries for arrays sized by a specialisation constant (spirv-val rejects them),
# so such modules fall back to -g: OpSource with the full GLSL text and OpLine, which RenderDoc
# and Nsight show as source too. The fallback is printed, never silent. A module that fails both
# fails the build.
function(compile flag ok_var)
  execute_process(COMMAND ${GLSLANG} --quiet --target-env vulkan1.2 ${flag} -I${INC} ${DEFS} -o ${OUT} ${SRC}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    execute_process(COMMAND ${SPIRV_VAL} --target-env vulkan1.2 ${OUT}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE vout ERROR_VARIABLE vout)
    string(APPEND out "${vout}")
  endif()
  set(${ok_var} ${rc} PARENT_SCOPE)
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

compile(-gVS rc)
if(NOT rc EQUAL 0)
  get_filename_component(name ${OUT} NAME)
  message(STATUS "${name}: -gVS output rejected by spirv-val (glslang bug with spec-constant array sizes); using -g")
  compile(-g rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SRC}: ${last_output}")
  endif()
endif()
