#!/usr/bin/env bash
# The profiling build's shader compile (shaders/compile_debug.cmake, VKI_SHADER_DEBUG=ON) on two
# shaders: add.comp takes -gVS (NonSemantic.Shader.DebugInfo.100 with the source), softmax.comp
# has a shared array sized by a specialisation constant, which glslang 12's -gVS writes invalidly,
# so it falls back to -g (OpSource with the source, OpLine). Both validate (the script runs
# spirv-val) and both carry the GLSL text, which is what RenderDoc and Nsight show.
#   shader_debug.sh SHADER_DIR GLSLANG SPIRV_VAL
set -euo pipefail
dir=$1 glslang=$2 val=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# a machine with the built programs but no shader toolchain (the GPU machine): nothing to check
for t in "$glslang" "$val"; do
    [ -x "$t" ] || command -v "$t" > /dev/null || { echo "SKIP: $t not found"; exit 77; }
done
for s in add softmax; do
    cmake -DGLSLANG="$glslang" -DSPIRV_VAL="$val" -DINC="$dir" -DDEFS= -DSRC="$dir/$s.comp" -DOUT="$tmp/$s.spv" \
          -P "$dir/compile_debug.cmake" >"$tmp/$s.log" 2>&1 || { cat "$tmp/$s.log"; fail "$s.comp did not compile"; }
    grep -aq "void main" "$tmp/$s.spv" || fail "$s.spv does not carry its GLSL source"
done
grep -aq "NonSemantic.Shader.DebugInfo.100" "$tmp/add.spv" || fail "add.spv has no non-semantic debug info (-gVS)"
grep -q "using -g" "$tmp/softmax.log" || fail "softmax.comp: the -g fallback was not reported"
grep -aq "NonSemantic.Shader.DebugInfo.100" "$tmp/softmax.spv" && fail "softmax.spv: the rejected -gVS output was kept"
echo "ok: add.spv with -gVS, softmax.spv with the -g fallback; both validated, both with source"
