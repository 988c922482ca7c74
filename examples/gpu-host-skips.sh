#!/bin/bash
# Does the kernel skip gpu-trace's program runs on the GPU host under load? (issue 16 follow-up:
# on Debian 7.2's lazy preemption under TCG it did; docs/troubleshooting.md "Skipped by the
# kernel".) 16 CUDA processes at once while 8 others make getppid() as fast as they can, traced
# with --bpf-stats; every CUDA process must show the TASK_INIT count a lone one shows, and the
# kernel's skipped-run count is printed.
#   sudo bash examples/gpu-host-skips.sh BIN OUTDIR
set -u
BIN=$(realpath "${1:?gpu-trace binary}"); OUT=$(realpath -m "${2:?output dir}"); mkdir -p "$OUT"
CUDA='import torch; x = torch.ones(1 << 20, device="cuda"); torch.cuda.synchronize(); print((x * 2).sum().item())'
cd "$(dirname "$0")/.."
. examples/run_traced.sh
run_traced lone --format json --bpf-stats -o "$OUT/lone.jsonl" -- python3 -c "$CUDA"
"$BIN" --format json --bpf-stats -o "$OUT/load.jsonl" 2>"$OUT/load.err" &
tracer=$!
sleep 3
for i in $(seq 8); do timeout 40 python3 -c 'import os
while True: os.getppid()' & done
pids=""
for i in $(seq 16); do python3 -c "$CUDA" >/dev/null 2>&1 & pids="$pids $!"; done
wait $pids
pkill -f 'os.getppid' ; sleep 1
kill -INT $tracer; wait $tracer
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys, collections
out = sys.argv[1]
def load(name):
    ev = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if l.strip()]
    inits = collections.Counter(e["pid"] for e in ev if e.get("event") == "TASK_INIT")
    stats = [e for e in ev if e.get("event") == "STATS"][-1]
    return inits, stats
lone, ls = load("lone")
load_inits, st = load("load")
per = set(lone.values())
print("lone process TASK_INITs:", dict(lone), "skipped", ls["kernel"].get("skipped"))
print("under load: processes", len(load_inits), "TASK_INITs per process", sorted(load_inits.values()))
print("under load: kernel", st["kernel"])
ok = len(load_inits) == 16 and set(load_inits.values()) == per
print("ok" if ok else "BAD", "every CUDA process shows the lone count" if ok else "counts differ")
PY
grep -h "skipped\|program sys_exit" "$OUT/load.err" | head -5
