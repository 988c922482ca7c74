#!/usr/bin/env bash
# Issue 11 (hardening) on the GPU host, with the real NVIDIA driver:
#   bash examples/gpu-host-hardening.sh BIN OUTDIR
# BIN is a release build of gpu-trace. Checks, and prints PASS/FAIL for each:
#  1. a CUDA process whose thread renamed itself to an ESC sequence with CR/LF: the text output
#     holds no control character but line feeds, the name shows escaped (\x1b[31mEVIL\r\n), and
#     the JSON replay gives back the exact bytes in comm (valid UTF-8: no comm_bytes);
#  2. exact counts: the recording of a run stopped while PyTorch works holds exactly the trailer's
#     `emitted` records;
#  3. `replay … | head -1` exits 0 without "Broken pipe".
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
fail=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; fail=1; fi; }

"$BIN" -v --record "$OUT/names.gtrace" >"$OUT/names.out" 2>"$OUT/names.err" & tp=$!
sleep 2
python3 - >"$OUT/names.py.log" 2>&1 <<'PY'
import ctypes, torch
libc = ctypes.CDLL(None)
libc.prctl(15, b"\x1b[31mEVIL\r\n", 0, 0, 0)  # PR_SET_NAME on the main thread
a = torch.randn(512, 512, device="cuda"); (a @ a).sum().item(); torch.cuda.synchronize()
print("done")
PY
sleep 1; kill -INT $tp; wait $tp; echo "names: tracer exit $?" >>"$OUT/hardening.log"
check "no control characters in the live text" \
  "python3 -c 'import sys; b=open(\"$OUT/names.out\",\"rb\").read(); sys.exit(any(c<32 and c!=10 or c==127 for c in b))'"
check "the name is escaped" "grep -qF '\\x1b[31mEVIL\\r\\n' '$OUT/names.out'"
"$BIN" replay "$OUT/names.gtrace" --format json -o "$OUT/names.jsonl" 2>>"$OUT/hardening.log"
check "JSON keeps the exact name" \
  "python3 -c 'import json,sys; n=[json.loads(l).get(\"comm\") for l in open(\"$OUT/names.jsonl\")]; sys.exit(0 if \"\x1b[31mEVIL\r\n\" in n else 1)'"

"$BIN" -v --record "$OUT/stop.gtrace" >/dev/null 2>"$OUT/stop.err" & tp=$!
sleep 1.5
python3 examples/two_streams.py >>"$OUT/hardening.log" 2>&1 & jp=$!
sleep 3; kill -INT $tp; wait $tp; echo "stop: tracer exit $?" >>"$OUT/hardening.log"; wait $jp
"$BIN" replay "$OUT/stop.gtrace" --format json -o "$OUT/stop.jsonl" 2>>"$OUT/hardening.log"
python3 - "$OUT/stop.gtrace" >"$OUT/stop.count" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); hl = struct.unpack_from("<I", b, 12)[0]; o = 16 + hl; n = 0
while o + 4 <= len(b):
    l = struct.unpack_from("<I", b, o)[0]; o += 4
    if l == 0:
        tl = struct.unpack_from("<I", b, o)[0]; t = json.loads(b[o + 4:o + 4 + tl]); break
    n += 1; o += l
print(n, t["kernel_counters"]["emitted"], t["kernel_counters"]["dropped"])
PY
check "records in the recording = emitted" "awk '{exit !(\$1 == \$2)}' '$OUT/stop.count'"

"$BIN" replay "$OUT/stop.gtrace" -v 2>"$OUT/head.err" | head -1 >/dev/null
st=${PIPESTATUS[0]}
check "replay | head -1 exits 0" "[ $st = 0 ] && ! grep -q 'Broken pipe' '$OUT/head.err'"
exit $fail
