#!/bin/bash
# Issue 37 on the GPU host, with batched uprobe links (round 8): the API layer's counts against
# an independent truth, the attach and exit times with each attach method.
#   1. A running PyTorch process (1000 `x + x` steps, then a captured CUDA graph replayed 1000
#      times) traced by `gpu-trace api --pid`, with tracefs uprobes on cudaLaunchKernel,
#      cudaGraphLaunch (libcudart) and cuLaunchKernel, cuGraphLaunch (libcuda) in the same run:
#      gpu-trace's per-symbol calls beside the tracefs hit counts of that pid. The workload
#      waits for a file (created once both are attached), so no call falls before the attach.
#   2. The same right after (a second run): how long its attach takes.
#   3. Every launch-like export of the real libcuda and libcudart (nm -D) against the symbols
#      `gpu-trace api --resolve` traces in a process that maps them.
#   4. `gpu-trace --api -- python3 …` on a script that calls CUDA at once, tracefs counting the
#      same run; also behind a `#!/usr/bin/env bash` wrapper script.
#   5. Cost: a launch-bound `x + x` loop untraced and under `gpu-trace api --pid`, interleaved.
#   6. Runs 1-2 again with GPU_TRACE_UPROBE_ATTACH=per-probe (the fallback), then one batched
#      run right after: attach time and the time from the target's exit to gpu-trace's.
#   7. `gpu-trace doctor`'s API row.
#
#   examples/gpu-host-api-batched.sh BIN OUT
set -u
B=$1; O=$2/api-batched
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; uname -r; nvidia-smi -L
T=/sys/kernel/tracing
[ -e $T/uprobe_events ] || mount -t tracefs nodev $T
CUDA=$(python3 - <<'PY'
import ctypes, torch
torch.zeros(1, device="cuda")
libs = [l.split()[-1] for l in open("/proc/self/maps") if "libcuda.so" in l or "libcudart.so" in l]
print(" ".join(sorted(set(libs))))
PY
)
LIBCUDA=$(tr ' ' '\n' <<<"$CUDA" | grep 'libcuda\.so' | head -1)
LIBCUDART=$(tr ' ' '\n' <<<"$CUDA" | grep 'libcudart\.so' | head -1)
echo "libcuda: $LIBCUDA"; echo "libcudart: $LIBCUDART"

# File offset of a dynamic symbol (what tracefs wants), from the ELF's own tables.
off() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
path, name = sys.argv[1], sys.argv[2].encode()
d = open(path, "rb").read()
shoff, = struct.unpack_from("<Q", d, 0x28); shnum, = struct.unpack_from("<H", d, 0x3c)
secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * 64) for i in range(shnum)]
for s in secs:
    if s[1] != 11: continue  # SHT_DYNSYM
    strtab = secs[s[6]]
    for i in range(s[5] // 24):
        st_name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", d, s[4] + i * 24)
        n = d[strtab[4] + st_name:d.index(b"\0", strtab[4] + st_name)]
        if n == name and shndx:
            sec = secs[shndx]
            print(hex(value - sec[3] + sec[4])); sys.exit(0)
sys.exit(1)
PY
}
EV="cudaLaunchKernel:$LIBCUDART cudaGraphLaunch:$LIBCUDART cuLaunchKernel:$LIBCUDA cuGraphLaunch:$LIBCUDA"
echo > $T/uprobe_events
for e in $EV; do
  s=${e%%:*}; l=${e#*:}; o=$(off "$l" "$s") || { echo "no $s in $l"; continue; }
  echo "p:gtx/$s $l:$o" >> $T/uprobe_events && echo "probe $s at $l:$o"
done

W="$O/workload.py"
cat > "$W" <<'PY'
import os, sys, time, torch
go = sys.argv[1]
x = torch.randn(64, 64, device="cuda")
for _ in range(10): y = x + x
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    g = torch.cuda.CUDAGraph()
    for _ in range(3): y = x + x
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        z = x * 2 + 1
torch.cuda.synchronize()
print(f"ready pid={os.getpid()}", flush=True)
while not os.path.exists(go): time.sleep(0.01)
for _ in range(1000): y = x + x
for _ in range(1000): g.replay()
torch.cuda.synchronize()
print(f"done pid={os.getpid()} steps=1000 replays=1000", flush=True)
PY

run_one() {  # $1: name
  local n=$1 go="$O/go.$1"; rm -f "$go"
  python3 "$W" "$go" > "$O/$n.workload.txt" 2>&1 &
  local wp=$!
  until grep -q ready "$O/$n.workload.txt" 2>/dev/null; do sleep 0.1; kill -0 $wp 2>/dev/null || break; done
  local t0=$(date +%s.%N)
  "$B" api --format json --pid $wp > "$O/$n.jsonl" 2> "$O/$n.stderr" &
  local gp=$!
  until grep -q "uprobes attached" "$O/$n.stderr" 2>/dev/null; do sleep 0.02; kill -0 $gp 2>/dev/null || break; done
  local t1=$(date +%s.%N)
  echo "$n: attached in $(python3 -c "print(round($t1-$t0,3))") s: $(grep 'uprobes attached' "$O/$n.stderr")"
  echo > $T/trace; echo 1 > $T/events/gtx/enable
  touch "$go"; wait $wp; local t2=$(date +%s.%N); echo 0 > $T/events/gtx/enable
  wait $gp; local rc=$? t3=$(date +%s.%N)
  echo "$n: gpu-trace api exit $rc, $(python3 -c "print(round($t3-$t2,3))") s after its target's"
  grep -E 'cannot probe|api:' "$O/$n.stderr" | head -5
  cat $T/trace > "$O/$n.tracefs.txt"
  python3 - "$O/$n" $wp <<'PY'
import json, sys, collections, re
base, pid = sys.argv[1], int(sys.argv[2])
truth = collections.Counter()
for l in open(base + ".tracefs.txt"):
    # "python3-1234 [003] ..... 12.3: cudaLaunchKernel: (0x7f…)"; the workload is the only
    # CUDA user while the events are enabled.
    m = re.search(r" (\w+): \(0x", l)
    if m: truth[m.group(1)] += 1
got = collections.Counter()
for l in open(base + ".jsonl"):
    try: e = json.loads(l)
    except ValueError: continue
    if e.get("event") == "API_STATS" and e.get("final") and e["pid"] == pid:
        lib = e["library"].rsplit("/", 1)[-1]
        if e["symbol"] in ("cudaLaunchKernel", "cudaGraphLaunch") and "cudart" in lib or \
           e["symbol"] in ("cuLaunchKernel", "cuGraphLaunch") and lib.startswith("libcuda.so"):
            got[e["symbol"]] += e["calls"]
for s in ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch"):
    print(f"  {s:18} tracefs {truth[s]:6}  gpu-trace {got[s]:6}  {'EQUAL' if truth[s] == got[s] else 'DIFFERENT'}")
PY
}
echo "== 1. gpu-trace api --pid on a running PyTorch process $(date -u +%T)"
run_one first
echo "== 2. the same, right after $(date -u +%T)"
run_one second

echo "== 3. launch exports of the real libraries vs the symbols gpu-trace traces $(date -u +%T)"
python3 -c 'import torch,time,os; torch.zeros(1,device="cuda"); print(os.getpid(),flush=True); time.sleep(60)' > "$O/idle.txt" &
IP=$!; until [ -s "$O/idle.txt" ]; do sleep 0.1; done
"$B" api --resolve --format json --pid $IP > "$O/resolve.json" 2> "$O/resolve.stderr"; echo "resolve exit $?"
kill $IP
for l in "$LIBCUDA" "$LIBCUDART"; do
  nm -D --defined-only "$l" | awk '{print $3}' | cut -d@ -f1 | grep -E '^(cu|cuda)[A-Za-z_0-9]*Launch' | grep -v '^cudbg' | sort -u > "$O/exports.txt"
  python3 - "$O/resolve.json" "$O/exports.txt" "$l" <<'PY'
import json, sys
v = json.loads(open(sys.argv[1]).readline())
traced = {s["symbol"] for s in v["symbols"]}
exports = [l.strip() for l in open(sys.argv[2]) if l.strip()]
missing = [e for e in exports if e not in traced]
print(f"{sys.argv[3]}: {len(exports)} launch exports, {len(exports) - len(missing)} traced; missing: {missing}")
PY
done

echo "== 4. gpu-trace --api -- python3 (CUDA called at once) $(date -u +%T)"
cat > "$O/at_once.py" <<'PY'
import torch
x = torch.randn(64, 64, device="cuda")
for _ in range(1000): y = x + x
torch.cuda.synchronize()
print("done 1000", flush=True)
PY
at_once() {  # $1: name, then the command
  local n=$1; shift
  echo > $T/trace; echo 1 > $T/events/gtx/enable
  timeout -s INT 120 "$B" --api -v --format json -o "$O/$n.jsonl" -- "$@" > "$O/$n.out" 2> "$O/$n.stderr"
  echo "$n: exit $?"; echo 0 > $T/events/gtx/enable; cat $T/trace > "$O/$n.tracefs.txt"
  grep -E 'uprobes attached|api' "$O/$n.stderr" | head -5
  python3 - "$O/$n" <<'PY'
import json, sys, collections, re
base = sys.argv[1]
truth = collections.Counter()
for l in open(base + ".tracefs.txt"):
    m = re.search(r" (\w+): \(0x", l)
    if m: truth[m.group(1)] += 1
got = collections.Counter()
for l in open(base + ".jsonl"):
    try: e = json.loads(l)
    except ValueError: continue
    if e.get("event") == "API_STATS":
        lib = e["library"].rsplit("/", 1)[-1]
        if e["symbol"] in ("cudaLaunchKernel", "cudaGraphLaunch") and "cudart" in lib or \
           e["symbol"] in ("cuLaunchKernel", "cuGraphLaunch") and lib.startswith("libcuda.so"):
            got[(e["pid"], e["symbol"])] = e["calls"]
tot = collections.Counter()
for (pid, s), c in got.items(): tot[s] += c
for s in ("cudaLaunchKernel", "cuLaunchKernel"):
    print(f"  {s:18} tracefs {truth[s]:6}  gpu-trace {tot[s]:6}  {'EQUAL' if truth[s] == tot[s] else 'DIFFERENT'}")
PY
}
at_once at_once python3 "$O/at_once.py"
printf '#!/usr/bin/env bash\nexec python3 "$@"\n' > "$O/py-shim"; chmod +x "$O/py-shim"
at_once at_once_shim "$O/py-shim" "$O/at_once.py"

echo "== 5. cost: x + x untraced vs gpu-trace api --pid, interleaved $(date -u +%T)"
C="$O/cost.py"
cat > "$C" <<'PY'
import os, sys, time, torch
go = sys.argv[1]
x = torch.randn(64, 64, device="cuda")
for _ in range(2000): y = x + x
torch.cuda.synchronize()
print("ready", flush=True)
while not os.path.exists(go): time.sleep(0.01)
n = 50000; t = time.perf_counter()
for _ in range(n): y = x + x
torch.cuda.synchronize()
print(f"us_per_step={(time.perf_counter() - t) / n * 1e6:.2f}", flush=True)
PY
for r in 1 2 3; do
  rm -f "$O/go.c"; touch "$O/go.c"; echo "round $r untraced $(python3 "$C" "$O/go.c" | grep us_per)"
  rm -f "$O/go.c"; python3 "$C" "$O/go.c" > "$O/cost_$r.txt" & cp=$!
  until grep -q ready "$O/cost_$r.txt" 2>/dev/null; do sleep 0.1; done
  "$B" api --pid $cp > "$O/cost_api_$r.txt" 2> "$O/cost_api_$r.stderr" & gp=$!
  until grep -q "uprobes attached" "$O/cost_api_$r.stderr" 2>/dev/null; do sleep 0.05; done
  touch "$O/go.c"; wait $cp; wait $gp
  echo "round $r gpu-trace_api $(grep us_per "$O/cost_$r.txt") ($(grep 'uprobes attached' "$O/cost_api_$r.stderr"))"
done | tee "$O/cost.txt"

echo "== 6. per-probe (the fallback) twice, then batched right after $(date -u +%T)"
export GPU_TRACE_UPROBE_ATTACH=per-probe
run_one per_probe_1
run_one per_probe_2
unset GPU_TRACE_UPROBE_ATTACH
run_one batched_after
echo > $T/uprobe_events

echo "== 7. doctor $(date -u +%T)"
"$B" doctor 2>&1 | grep -E "kernel  |API layer"
date -u
