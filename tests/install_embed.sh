#!/usr/bin/env bash
# Installs vkinfer into a temporary prefix, builds docs/embed/embed.c against it twice (pkg-config
# and CMake find_package) and runs both on stories260K: what a C program embedding the engine does.
#   install_embed.sh SOURCE_DIR BINARY_DIR SHARED_DIR
set -euo pipefail
src=$1 bin=$2 shared=$3
model=$shared/models/stories260K.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$bin" --prefix "$tmp/prefix" >/dev/null
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$tmp/prefix/lib:$tmp/prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
test -f "$tmp/prefix/include/vkinfer.h"
cc -std=c11 -Wall -Wextra -Werror "$src/docs/embed/embed.c" $(pkg-config --cflags --libs vkinfer) -lpthread -o "$tmp/embed_pc"
cmake -S "$src/docs/embed" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
if [ ! -f "$model" ]; then
    echo "SKIP running the examples: $model is absent (both built)"
    exit 0
fi
for exe in "$tmp/embed_pc" "$tmp/build/embed"; do
    out=$("$exe" "$model")
    echo "$out"
    grep -q "^Once upon a time, there was a little girl named Lily" <<<"$out"
done
