#!/bin/bash
# Round 13 on the GPU host, against the real driver, libcuda and PyTorch:
#   1. `gpu-trace api -o FILE -- python3 small.py`: the program's standard output is its own
#      (its one line), FILE holds the call table; with `--format json -v` FILE holds one
#      API_CALL per cuLaunchKernel call, as many as the table counts;
#   2. `gpu-trace --format json -- python3 small.py` and the same behind 2000 short processes
#      (`/bin/true`) of the command: the driver events of the PyTorch process (the followed set
#      now reads the ring buffer's positions; no warning that it cannot);
#   examples/gpu-host-round13.sh BIN OUT
set -u
B=$1; O=$2/round13
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; uname -r; nvidia-smi -L
cat > "$O/small.py" <<'PY'
import torch
x = torch.randn(64, 64, device="cuda")
for _ in range(500): y = x + x
torch.cuda.synchronize()
print("child done", flush=True)
PY
echo "== 1. gpu-trace api -o FILE $(date -u +%T)"
"$B" api -o "$O/api_o.txt" -- python3 "$O/small.py" > "$O/api_o.stdout" 2> "$O/api_o.stderr"; echo "exit $?"
echo "stdout ($(wc -l < "$O/api_o.stdout") lines):"; cat "$O/api_o.stdout"
echo "FILE:"; grep -E "API calls|cuLaunchKernel|cudaLaunchKernel" "$O/api_o.txt" | cut -c1-160
"$B" api --format json -v -o "$O/api_o.jsonl" -- python3 "$O/small.py" > "$O/api_oj.stdout" 2> "$O/api_oj.stderr"; echo "exit $?"
echo "stdout ($(wc -l < "$O/api_oj.stdout") lines): $(cat "$O/api_oj.stdout")"
python3 - "$O/api_o.jsonl" <<'PY'
import collections, json, sys
calls, table = collections.Counter(), collections.Counter()
for l in open(sys.argv[1]):
    v = json.loads(l)
    if v["event"] == "API_CALL": calls[v["symbol"]] += 1
    if v["event"] == "API_STATS" and v["final"]: table[v["symbol"]] += v["calls"]
for s in sorted(table):
    if "LaunchKernel" in s: print(f"  {s}: API_CALL lines {calls[s]}, table {table[s]}")
PY
echo "== 2. main trace -- python3, then behind 2000 short processes $(date -u +%T)"
"$B" --format json -- python3 "$O/small.py" > "$O/main.jsonl" 2> "$O/main.stderr"; echo "exit $?"
"$B" --format json -- sh -c "for i in \$(seq 2000); do /bin/true; done; python3 $O/small.py" > "$O/main_short.jsonl" 2> "$O/main_short.stderr"; echo "exit $?"
for f in main main_short; do
python3 - "$O/$f.jsonl" "$f" <<'PY'
import collections, json, sys
ev = collections.Counter(); pids = set(); stats = None
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    v = json.loads(l)
    if v["event"] == "STATS": stats = v; continue
    ev[v["event"]] += 1; pids.add(v.get("pid"))
print(f"  {sys.argv[2]}: events {dict(ev)} pids {sorted(p for p in pids if p)}; unreported {stats.get('unreported') if stats else None}")
PY
grep -ciE "positions are not readable|were not traced" "$O/$f.stderr" | sed "s/^/  warnings about following: /"
done
echo "== end $(date -u +%T)"
