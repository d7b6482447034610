#!/usr/bin/env bash
# RenderDoc end to end: `vkinfer generate --capture-steps 1-2` run under `renderdoccmd capture` on
# whatever Vulkan device there is (lavapipe headless in CI), then labels.py opens the .rdc with
# RenderDoc's Python module and checks that exactly steps 1 and 2 were captured and that every
# dispatch carries the label path "step N / layer L / role / kernel".
#   capture.sh VKINFER MODEL
# Exit 77 (skipped, with the reason) when renderdoccmd, RenderDoc's Python module or the model is
# absent; tools/dev installs the first two (Debian: renderdoccmd python3-renderdoc).
set -euo pipefail
vkinfer=$1 model=$2
here=$(cd "$(dirname "$0")" && pwd)
command -v renderdoccmd >/dev/null || { echo "SKIP: renderdoccmd is absent (apt-get install renderdoccmd)"; exit 77; }
# Debian's module is built for the system Python, not for another python3 earlier on PATH
python=/usr/bin/python3
"$python" -c "import renderdoc" 2>/dev/null ||
    { echo "SKIP: RenderDoc's Python module is absent (apt-get install python3-renderdoc)"; exit 77; }
[ -f "$model" ] || { echo "SKIP: $model is absent"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a small KV cache: RenderDoc saves the initial contents of every buffer the capture touches
renderdoccmd capture -w -c "$tmp/cap" "$vkinfer" generate --no-progress -v -m "$model" -p "Once upon a time" -n 6 \
    --kv-tokens 512 --max-seqs 4 --max-tokens 64 --capture-steps 1-2 >"$tmp/out" 2>"$tmp/err" ||
    { cat "$tmp/out" "$tmp/err"; echo "FAIL: the capture run failed"; exit 1; }
grep -q "RenderDoc captured steps 1-2" "$tmp/err" || { cat "$tmp/err"; echo "FAIL: no capture reported"; exit 1; }
grep -q "^Once upon a time, there was a little" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: wrong text under RenderDoc"; exit 1; }
rdc=$(ls "$tmp"/cap*.rdc)
[ "$(wc -w <<<"$rdc")" -eq 1 ] || { echo "FAIL: expected one capture, got: $rdc"; exit 1; }
"$python" "$here/labels.py" "$rdc" 1 2
