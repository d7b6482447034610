#!/bin/sh
# bench-kernels' tuning switches as tools/gpu-check passes them on the GPU machine, where a flag
# that broke would cost device time: each runs here (the emulated tensor-core GEMM on a device
# without NV cooperative matrices) on tiny shapes and its JSON rows carry what was asked and a
# time; bad values exit 2 naming the option. Speed is not checked (a benchmark prints numbers).
# usage: bench_kernels_cli.sh path/to/bench-kernels
set -eu
bk=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
one="-n 1 -r 1 -w 1 --warm-ms 0 --json"

# the GEMM sweep's TILE:STAGES:BK entry with a forced split: 512 = 2 splits of 4 steps of 64
# shellcheck disable=SC2086
"$bk" --coopmat emulate -k matmul_cm -t q4_k,f16 -s 40x72x512 --cm-cfg 32x32 --cm-stages 2 --cm-bk 64 \
    --cm-split 2 $one > "$tmp/cm.jsonl" 2> "$tmp/cm.err" || { cat "$tmp/cm.err"; exit 1; }
# the matvec sweep's WGxRxMCxMU entry, float and integer-dot kernels
# shellcheck disable=SC2086
"$bk" -k matvec,matvec_i8 -t q8_0 -s 3x40x256 --matvec-cfg 32x2x4x2 $one > "$tmp/mv.jsonl" 2> "$tmp/mv.err" ||
    { cat "$tmp/mv.err"; exit 1; }
python3 - "$tmp/cm.jsonl" "$tmp/mv.jsonl" <<'PY'
import json, sys
def rows(p):
    return [json.loads(l) for l in open(p) if l.strip().startswith("{")]
cm, mv = rows(sys.argv[1]), rows(sys.argv[2])
want_cm = {"kernel": "matmul_cm", "M": 40, "N": 72, "K": 512, "cm_cfg": "32x32", "cm_stages": 2, "cm_bk": 64,
           "splits": 2, "cm_split": 2}
if sorted(r["type"] for r in cm) != ["f16", "q4_k"]:
    sys.exit("FAIL: matmul_cm rows %s, want f16 and q4_k" % [r.get("type") for r in cm])
for r in cm + mv:
    if not r["us_per_call"] > 0:
        sys.exit("FAIL: %s %s: no time (%s)" % (r["kernel"], r["type"], r["us_per_call"]))
for r in cm:
    bad = {k: (r.get(k), v) for k, v in want_cm.items() if r.get(k) != v}
    if bad:
        sys.exit("FAIL: matmul_cm %s: (got, want) %s" % (r["type"], bad))
if sorted(r["kernel"] for r in mv) != ["matvec", "matvec_i8"] or any(r["matvec_cfg"] != "32x2x4x2" for r in mv):
    sys.exit("FAIL: matvec rows %s" % [(r["kernel"], r["matvec_cfg"]) for r in mv])
print("ok: matmul_cm %s, matvec %s" % (["%s %.0f us" % (r["type"], r["us_per_call"]) for r in cm],
                                       ["%s %.0f us" % (r["kernel"], r["us_per_call"]) for r in mv]))
PY

# refused values: exit 2, the option named
for bad in "--cm-stages 3" "--cm-bk 0" "--cm-cfg 12" "--cm-cfg 64x64x0x32" "--matvec-cfg 0x1" "--cm-split x"; do
    rc=0
    # shellcheck disable=SC2086
    "$bk" -k matmul_cm -t q4_k -s 8x8x256 $bad > /dev/null 2> "$tmp/bad.err" || rc=$?
    opt=${bad%% *}
    if [ "$rc" -ne 2 ] || ! grep -q -- "$opt" "$tmp/bad.err"; then
        echo "FAIL: '$bad' exited $rc (want 2) with: $(cat "$tmp/bad.err")"
        exit 1
    fi
done
echo "ok: bad values refused with exit 2"
