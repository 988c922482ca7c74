#!/bin/bash
# Issue 28 on the GPU host: the API layer on real libcuda under PyTorch.
#   1. PyTorch under a HAMi-style LD_PRELOAD interposer (api/hami_like_shim.c: cuLaunchKernel,
#      cuLaunchKernelEx, cuMemAlloc_v2, cuGetProcAddress_v2, counted by the shim itself), traced
#      by `gpu-trace api --format json -- python3 …`: gpu-trace's per-symbol counts for the shim
#      beside the shim's own, and libcuda's/libcudart's beside them.
#   2. The seed's recursion on libcuda (api/recursive_cuinit_shim.c): API_RECURSION.
#   3. Cost: a 3 ns library function (api/bench_noop) untraced, under a bare tracefs uprobe and
#      uprobe+uretprobe, and under `gpu-trace api --probe libnoop.so:noop_fn`, interleaved; and a
#      launch-bound PyTorch loop (64x64 x + x) untraced and under `gpu-trace api`.
#
#   examples/gpu-host-api.sh BIN APIDIR OUT    (APIDIR: the built examples/api programs)
set -u
B=$1; A=$2; O=$3/api
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
echo "open files: soft $(ulimit -Sn) hard $(ulimit -Hn)"
command -v ldconfig >/dev/null && ldconfig -p | grep -E 'libcuda\.so|libcudart' | head -5

W="$O/workload.py"
cat > "$W" <<'PY'
import os, time, torch
x = torch.randn(64, 64, device="cuda"); a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
time.sleep(1.5)  # gpu-trace's rescan attaches the runtimes dlopened at start (docs/api.md)
for _ in range(1000): y = x + x
for _ in range(1000): z = a @ a
torch.cuda.synchronize()
print(f"pid={os.getpid()} done", flush=True)
PY
C="$O/cost.py"
cat > "$C" <<'PY'
import sys, time, torch
x = torch.randn(64, 64, device="cuda")
for _ in range(2000): y = x + x
torch.cuda.synchronize()
time.sleep(10)  # the rescan attaches libcuda and libcudart (100+ probes) before the timed loop
n = 100000; t = time.perf_counter()
for _ in range(n): y = x + x
torch.cuda.synchronize()
print(f"us_per_step={(time.perf_counter() - t) / n * 1e6:.2f}", flush=True)
PY

echo "== 1. PyTorch under the HAMi-style shim $(date -u +%T)"
rm -f "$O/hami_counts.txt"
( export LD_PRELOAD="$A/hami_like_shim.so" HAMI_COUNTS="$O/hami_counts.txt"
  timeout -s INT 150 "$B" api --format json --bpf-stats -- python3 "$W" > "$O/hami.jsonl" 2> "$O/hami.stderr" )
echo "gpu-trace api exit $?"
cat "$O/hami_counts.txt"
python3 - "$O" <<'PY'
import json, sys, collections
o = sys.argv[1]
own = {}
for line in open(f"{o}/hami_counts.txt"):
    kv = dict(f.split("=", 1) for f in line.split())
    pid = int(kv.pop("pid"))
    own[pid] = {k: int(v) for k, v in kv.items()}
rows = collections.defaultdict(dict)
for line in open(f"{o}/hami.jsonl"):
    try: e = json.loads(line)
    except ValueError: continue
    if e.get("event") != "API_STATS": continue
    lib = e.get("library", "?").rsplit("/", 1)[-1]
    rows[(e["pid"], e["symbol"])][lib] = e["calls"]
with open(f"{o}/summary.txt", "w") as out:
    for pid, counts in own.items():
        if not any(counts.values()): continue
        for sym, n in counts.items():
            got = rows.get((pid, sym), {})
            shim = got.get("hami_like_shim.so", 0)
            line = f"pid {pid} {sym:22} shim's own {n:7}  gpu-trace (shim) {shim:7}  {'EQUAL' if shim == n else 'DIFFERENT'}  others: {dict((k, v) for k, v in got.items() if k != 'hami_like_shim.so')}"
            print(line); out.write(line + "\n")
PY

echo "== 2. the recursive shim on libcuda $(date -u +%T)"
( export LD_PRELOAD="$A/recursive_cuinit_shim.so"
  timeout -s INT 90 "$B" api -- "$A/cuinit_client" > "$O/recursion.txt" 2> "$O/recursion.stderr" )
echo "exit $?"; grep -m3 -E "API_RECURSION|cuInit" "$O/recursion.txt" "$O/recursion.stderr"

echo "== $(date -u +%T) 3a. cost per hit: a 3 ns function, interleaved (5 rounds)"
OFF=$(cat "$A/noop_offset")
T=/sys/kernel/tracing
[ -e $T/uprobe_events ] || mount -t tracefs nodev $T 2>/dev/null
[ -e $T/uprobe_events ] || { T=/sys/kernel/debug/tracing; mount -t debugfs nodev /sys/kernel/debug 2>/dev/null; }
[ -e $T/uprobe_events ] || echo "no tracefs uprobe_events: the bare-uprobe rows below are not measured"
for r in 1 2 3 4 5; do
  echo "round $r untraced $("$A/bench_noop" 200000)"
  echo "p:gt_noop $A/libnoop.so:$OFF" > $T/uprobe_events && echo 1 > $T/events/uprobes/gt_noop/enable
  echo "round $r bare_uprobe $("$A/bench_noop" 200000)"
  echo 0 > $T/events/uprobes/gt_noop/enable
  echo "r:gt_noop_ret $A/libnoop.so:$OFF" >> $T/uprobe_events && echo 1 > $T/events/uprobes/gt_noop/enable && echo 1 > $T/events/uprobes/gt_noop_ret/enable
  echo "round $r bare_uprobe+uretprobe $("$A/bench_noop" 200000)"
  echo 0 > $T/events/uprobes/gt_noop/enable; echo 0 > $T/events/uprobes/gt_noop_ret/enable; echo > $T/uprobe_events
  timeout -s INT 60 "$B" api --probe libnoop.so:noop_fn -- "$A/bench_noop" 200000 2 > "$O/noop_api_$r.txt" 2>&1
  echo "round $r gpu-trace_api $(grep -m1 ns_per_call "$O/noop_api_$r.txt")"
  grep -m1 " noop_fn " "$O/noop_api_$r.txt"
done | tee "$O/cost_noop.txt"

echo "== $(date -u +%T) 3b. a launch-bound PyTorch loop (us per x + x step), interleaved (2 rounds)"
for r in 1 2; do
  echo "round $r untraced $(timeout 60 python3 "$C")"
  timeout -s INT 150 "$B" api -- python3 "$C" > "$O/cost_api_$r.txt" 2>&1
  echo "round $r gpu-trace_api $(grep -m1 us_per_step "$O/cost_api_$r.txt") (probes refused: $(grep -c 'cannot probe' "$O/cost_api_$r.txt"); calls counted: $(grep -E ' (cudaLaunchKernel|cuLaunchKernel) ' "$O/cost_api_$r.txt" | awk '{print $2"="$3}' | tr '\n' ' '))"
done | tee "$O/cost_torch.txt"
date -u
