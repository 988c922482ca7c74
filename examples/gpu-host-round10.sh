#!/bin/bash
# Round 10 on the GPU host, against a real PyTorch workload: the changes no CI machine can run
# on the real driver and libcuda.
#   1. GPU numbering: the `gpu=` of the text lines and JSON `gpu`/`rm_device` against
#      nvidia-smi's own index, UUID and bus id;
#   2. --record-rotate: the pieces replayed one by one add up to the live run's statistics;
#   3. --flight-recorder: a SIGUSR1 dump mid-run, replayed alone;
#   4. `gpu-trace api -- sh -c 'A; B'`: both PyTorch children traced (rows per pid), the lines
#      in the main trace's shape; `--api-sums 8`: what was counted plus what was said not
#      counted;
#   5. held commands let go: 20 runs of `gpu-trace --api -d 0.2 -- python3 -c pass` leave no
#      process stopped.
#   examples/gpu-host-round10.sh BIN OUT
set -u
B=$1; O=$2/round10
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; uname -r; nvidia-smi -L
nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader | tee "$O/smi.csv"
cat > "$O/mm.py" <<'PY'
import sys, time, torch
x = torch.randn(2048, 2048, device="cuda")
y = x @ x
torch.cuda.synchronize()
print("ready", flush=True)
t = time.time()
while time.time() - t < float(sys.argv[1] if len(sys.argv) > 1 else 4):
    y = x @ x
torch.cuda.synchronize()
print("done", flush=True)
PY

echo "== 1. GPU numbering $(date -u +%T)"
"$B" -v -- python3 "$O/mm.py" 3 > "$O/num.txt" 2> "$O/num.stderr"; echo "exit $?"
"$B" --format json -- python3 "$O/mm.py" 3 > "$O/num.jsonl" 2>> "$O/num.stderr"; echo "exit $?"
python3 - "$O" <<'PY'
import collections, json, re, sys
o = sys.argv[1]
smi = [l.strip().split(", ") for l in open(o + "/smi.csv")]
print("nvidia-smi:", smi)
g = collections.Counter(m.group(1) for l in open(o + "/num.txt") if (m := re.search(r" gpu=(\S+)", l)))
print("text gpu= values:", dict(g))
pairs = collections.Counter()
for l in open(o + "/num.jsonl"):
    if not l.startswith("{"):
        continue  # the workload's own lines
    v = json.loads(l)
    if "gpu" in v and v.get("event") in ("WORK_SUBMIT", "TASK_INIT", "SCHEDULE"):
        pairs[(v.get("gpu"), v.get("rm_device"), (v.get("gpu_device") or {}).get("uuid"))] += 1
print("JSON (gpu, rm_device, uuid):", dict(pairs))
print("stats gpus rows:", [json.loads(l).get("gpus") for l in open(o + "/num.jsonl") if l.startswith('{"event":"STATS"')][-1:])
PY

echo "== 2. --record-rotate 8K $(date -u +%T)"
rm -f "$O"/rot.gtrace*
"$B" --record "$O/rot.gtrace" --record-rotate 8K -- python3 "$O/mm.py" 4 > "$O/rot.txt" 2> "$O/rot.stderr"; echo "exit $?"
ls -la "$O"/rot.gtrace.* | head -20
for p in "$O"/rot.gtrace.*; do "$B" replay "$p" > "$p.txt" 2>&1; echo "$p replay exit $?"; done
python3 - "$O" <<'PY'
import glob, re, sys
o = sys.argv[1]
def counts(path):
    c = {}
    for l in open(path):
        m = re.match(r"(task_init|schedule|sched_update|work_submit|task_destroy)\s+(\d+)", l)
        if m: c[m.group(1)] = c.get(m.group(1), 0) + int(m.group(2))
    return c
live = counts(o + "/rot.txt")
pieces = sorted(glob.glob(o + "/rot.gtrace.*[0-9]"))
total = {}
for p in pieces:
    for k, v in counts(p + ".txt").items(): total[k] = total.get(k, 0) + v
print("pieces:", len(pieces), "live statistics:", live, "pieces replayed, summed:", total)
PY

echo "== 3. --flight-recorder 60s, SIGUSR1 mid-run $(date -u +%T)"
rm -rf "$O/dumps"; mkdir -p "$O/dumps"
"$B" --flight-recorder 60s --dump-dir "$O/dumps" -- python3 "$O/mm.py" 6 > "$O/flight.txt" 2> "$O/flight.stderr" &
P=$!
# Once the workload has its CUDA context (its "ready" line): its tasks are in the window.
timeout 60 grep -q ready <(tail -f "$O/flight.txt" --pid=$P) ; kill -USR1 $P
wait $P; echo "exit $?"
ls -la "$O/dumps"
for d in "$O"/dumps/*.gtrace; do "$B" replay "$d" > "$d.txt" 2>&1; echo "replay exit $?"; grep -E "^(task_init|schedule|work_submit|task_destroy) " "$d.txt" | head; done
grep -E "dumps|flight" "$O/flight.txt" | head

echo "== 4. gpu-trace api -- sh -c 'A; B' $(date -u +%T)"
cat > "$O/small.py" <<'PY'
import torch
x = torch.randn(64, 64, device="cuda")
for _ in range(500): y = x + x
torch.cuda.synchronize()
print("child done", flush=True)
PY
"$B" api --format json -- sh -c "python3 $O/small.py; python3 $O/small.py" > "$O/api_children.jsonl" 2> "$O/api_children.stderr"; echo "exit $?"
grep "more uprobes attached" "$O/api_children.stderr" | head -5
python3 - "$O/api_children.jsonl" <<'PY'
import collections, json, sys
rows = collections.defaultdict(dict)
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    v = json.loads(l)
    if v["event"] == "API_STATS" and v["final"]:
        rows[v["pid"]][v["symbol"]] = rows[v["pid"]].get(v["symbol"], 0) + v["calls"]
for pid, r in rows.items():
    print("pid", pid, "symbols", len(r), "cuLaunchKernel*", {k: n for k, n in r.items() if k.startswith("cuLaunchKernel")})
PY
"$B" api -v -- python3 "$O/small.py" > "$O/api_v.txt" 2> "$O/api_v.stderr"; echo "exit $?"
grep -m3 " API_CALL " "$O/api_v.txt"
"$B" api --format json --api-sums 4 -- python3 "$O/small.py" > "$O/api_sums.jsonl" 2> "$O/api_sums.stderr"; echo "exit $?"
grep "not counted" "$O/api_sums.stderr"
python3 - "$O/api_sums.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"calls"') or '"API_STATS"' in l]
fin = [r for r in rows if r.get("final")]
print("final rows:", len(fin), "calls counted:", sum(r["calls"] for r in fin))
PY

echo "== 5. held commands let go $(date -u +%T)"
for i in $(seq 20); do "$B" -q --api -d 0.2 -- python3 -c pass > /dev/null 2>&1; done
sleep 1
echo "stopped processes left (state T):"; ps -eo pid,stat,comm | awk '$2 ~ /^T/' | head
echo "== end $(date -u +%T)"
