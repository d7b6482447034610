#!/usr/bin/env bash
# Installs vkinfer into a temporary prefix and builds the embedding examples against it the ways a
# C program would: pkg-config (shared, and static with --static), CMake find_package (shared and
# static targets) and the embedded server (vkinfer-server.pc, vkinfer::server); runs them on
# stories260K without LD_LIBRARY_PATH (rpath). Also checks that
# libvkinfer carries no HTTP server dependency and that the installed program runs from the prefix.
#   install_embed.sh SOURCE_DIR BINARY_DIR SHARED_DIR
set -euo pipefail
src=$1 bin=$2 shared=$3
model=$shared/models/stories260K.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cmake --install "$bin" --prefix "$tmp/prefix" >/dev/null
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
unset LD_LIBRARY_PATH
test -f "$tmp/prefix/include/vkinfer.h" || fail "vkinfer.h not installed"
libdir=$(pkg-config --variable=libdir vkinfer)
test -f "$libdir/libvkinfer.a" || fail "libvkinfer.a not installed"

# Layers: the runtime library needs Vulkan, PCRE2 and libc, never the server's libraries.
needed=$(readelf -d "$libdir/libvkinfer.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "libvkinfer.so needs: $needed"
for bad in microhttpd gnutls cjson; do
    [[ $needed != *$bad* ]] || fail "libvkinfer.so links $bad"
done
[[ $(pkg-config --print-requires-private vkinfer | tr '\n' ' ') != *microhttpd* ]] || fail "vkinfer.pc requires libmicrohttpd"
[ "$(pkg-config --modversion vkinfer)" = "$(sed -n 's/^#define VKI_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$src/include/vkinfer.h" | paste -sd.)" ] ||
    fail "vkinfer.pc version differs from the header's VKI_VERSION_*"

cflags="-std=c11 -Wall -Wextra -Werror $(pkg-config --cflags vkinfer)"
# shared, with the rpath a program sets for a library outside the loader's path
cc $cflags "$src/docs/embed/simple.c" $(pkg-config --libs vkinfer) -Wl,-rpath,"$libdir" -o "$tmp/simple_pc"
cc $cflags "$src/docs/embed/embed.c" $(pkg-config --libs vkinfer) -lpthread -Wl,-rpath,"$libdir" -o "$tmp/embed_pc"
# static: libvkinfer.a plus what `pkg-config --static` lists (Vulkan, PCRE2, pthreads, libm, libdl)
static_libs=$(pkg-config --static --libs vkinfer)
cc $cflags "$src/docs/embed/simple.c" ${static_libs/-lvkinfer/$libdir/libvkinfer.a} -o "$tmp/simple_pc_static"
! readelf -d "$tmp/simple_pc_static" | grep -q "libvkinfer" || fail "the static build still needs libvkinfer.so"
# the embedded server: libvkinfer_server.a over libvkinfer.a (vkinfer-server.pc)
test -f "$tmp/prefix/include/vkinfer_server.h" || fail "vkinfer_server.h not installed"
cc $cflags "$src/docs/embed/server.c" $(pkg-config --cflags --libs vkinfer-server) -o "$tmp/server_pc"
! readelf -d "$tmp/server_pc" | grep -q "libvkinfer" || fail "the server example needs libvkinfer.so"
cmake -S "$src/docs/embed" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
! readelf -d "$tmp/build/simple_static" | grep -q "libvkinfer" || fail "vkinfer::static still needs libvkinfer.so"

# the installed program finds what it needs from where it is (RUNPATH $ORIGIN/../lib)
readelf -d "$tmp/prefix/bin/vkinfer" | grep -q 'RUNPATH.*\$ORIGIN/\.\./lib' || fail "installed vkinfer has no \$ORIGIN rpath"
"$tmp/prefix/bin/vkinfer" --help >/dev/null || fail "installed vkinfer does not run"

if [ ! -f "$model" ]; then
    echo "SKIP running the examples: $model is absent (all built)"
    exit 0
fi
for exe in "$tmp/simple_pc" "$tmp/simple_pc_static" "$tmp/build/simple" "$tmp/build/simple_static"; do
    out=$("$exe" "$model" 2>/dev/null)
    grep -q "^Once upon a time, there was a little girl named Lily" <<<"$out" || fail "$exe printed: $out"
done
echo "$out"
for exe in "$tmp/embed_pc" "$tmp/build/embed"; do
    out=$("$exe" "$model")
    grep -q "^Once upon a time, there was a little girl named Lily" <<<"$out" || fail "$exe printed: $out"
done
echo "$out"
# the server example asks itself over HTTP: /v1/completions and /v2/models/story/generate, greedy
for exe in "$tmp/server_pc" "$tmp/build/server"; do
    out=$("$exe" "$model" 2>/dev/null)
    [ "$(grep -c '^HTTP/1.1 200 OK' <<<"$out")" = 2 ] || fail "$exe printed: $out"
    [ "$(grep -c '", there was a little girl named Lily. She"' <<<"$out")" = 2 ] || fail "$exe printed: $out"
done
echo "ok: pkg-config (shared, --static) and find_package (vkinfer::vkinfer, vkinfer::static, vkinfer::server) builds run"
