#!/bin/sh
# libvkinfer.so exports exactly the functions vkinfer.h marks VKI_API: nothing without the vki_
# prefix (a program that also links llama.cpp, whose gguf_* functions have other signatures, must
# never bind to one of our internals), and no public function hidden by mistake.
# usage: exports.sh path/to/libvkinfer.so path/to/vkinfer.h
set -eu
lib=$1 header=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '{print $3}' | sort -u > "$tmp/exported"
sed -n 's/^VKI_API [^(]*[ *]\(vki_[a-z0-9_]*\)(.*/\1/p' "$header" | sort -u > "$tmp/declared"
if ! cmp -s "$tmp/exported" "$tmp/declared"; then
    echo "FAIL: exported symbols (<) differ from the VKI_API functions of $header (>):"
    diff "$tmp/exported" "$tmp/declared" || true
    exit 1
fi
echo "ok: $(wc -l < "$tmp/exported") exported symbols, exactly the VKI_API functions"
