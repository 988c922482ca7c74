#!/bin/bash
# Round 11 on the GPU host, against real PyTorch work: what no CI machine can run on the real
# driver and libcuda.
#   1. --record-rotate: the pieces, each replayed alone, add up to the live run's statistics,
#      TASK_DESTROY included (pieces now carry the state records of the tasks alive at their
#      start);
#   2. --flight-recorder 2s: a SIGUSR1 dump after the workload ended, replayed alone: its
#      TASK_DESTROYs end tasks created long before the window (not PRETRACE_END);
#   3. POST /dump on the metrics endpoint: without a token 401, with it a dump; the flight
#      metrics in the scrape;
#   4. `gpu-trace api` on the shared run loop: `api -- sh -c 'A; B'` (both children, their
#      cuLaunchKernel counts), `api -v` lines, the attach line;
#   5. completion of --gpu from the real driver (nvidia-smi's index, model, bus id, UUID);
#   6. `gpu-trace --api … 2>&1 | head -1`: exit 0 (was 101), no process left stopped.
#   examples/gpu-host-round11.sh BIN OUT
set -u
B=$1; O=$2/round11
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; uname -r; nvidia-smi -L
nvidia-smi --query-gpu=index,name,pci.bus_id,uuid --format=csv,noheader | tee "$O/smi.csv"
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
# Sums of the five event counters of every statistics block in FILE.
counts() {
  python3 - "$@" <<'PY'
import re, sys
total = {}
for path in sys.argv[1:]:
    for l in open(path):
        m = re.match(r"(task_init|schedule|sched_update|work_submit|task_destroy)\s+(\d+)", l)
        if m: total[m.group(1)] = total.get(m.group(1), 0) + int(m.group(2))
print(total)
PY
}

echo "== 1. --record-rotate 8K $(date -u +%T)"
rm -f "$O"/rot.gtrace*
"$B" --record "$O/rot.gtrace" --record-rotate 8K -- python3 "$O/mm.py" 4 > "$O/rot.txt" 2> "$O/rot.stderr"; echo "exit $?"
ls "$O"/rot.gtrace.* | wc -l
for p in "$O"/rot.gtrace.*[0-9]; do "$B" replay "$p" > "$p.txt" 2>&1 || echo "$p replay exit $?"; done
echo -n "live statistics:        "; counts "$O/rot.txt"
echo -n "pieces replayed, summed: "; counts "$O"/rot.gtrace.*[0-9].txt
grep -h "PRETRACE_END" "$O"/rot.gtrace.*[0-9].txt | wc -l | sed 's/^/PRETRACE_END lines in the pieces: /'

echo "== 2. --flight-recorder 2s, SIGUSR1 after the workload $(date -u +%T)"
rm -rf "$O/dumps"; mkdir -p "$O/dumps"
"$B" --flight-recorder 2s --dump-dir "$O/dumps" -- sh -c "python3 $O/mm.py 5; sleep 3" > "$O/flight.txt" 2> "$O/flight.stderr" &
P=$!
timeout 60 grep -q done <(tail -f "$O/flight.txt" --pid=$P); sleep 1; kill -USR1 $P
wait $P; echo "exit $?"
for d in "$O"/dumps/*.gtrace; do
  "$B" replay "$d" > "$d.txt" 2>&1; echo "$(basename "$d") replay exit $?"
  echo -n "  counts: "; counts "$d.txt"
  echo "  PRETRACE_END lines: $(grep -c PRETRACE_END "$d.txt")"
done

echo "== 3. POST /dump $(date -u +%T)"
rm -rf "$O/dumps3"; mkdir -p "$O/dumps3"
head -c 24 /dev/urandom | base64 > "$O/token"; chmod 600 "$O/token"
"$B" -q --flight-recorder 30s --dump-dir "$O/dumps3" --metrics 127.0.0.1:9464 --dump-token-file "$O/token" \
  -- python3 "$O/mm.py" 6 > /dev/null 2> "$O/post.stderr" &
P=$!
for i in $(seq 100); do curl -s -o /dev/null 127.0.0.1:9464/metrics && break; sleep 0.1; done
sleep 3
echo "no token: $(curl -s -o /dev/null -w '%{http_code}' -X POST 127.0.0.1:9464/dump)"
echo "wrong token: $(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Authorization: Bearer nope' 127.0.0.1:9464/dump)"
echo "token: $(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $(cat "$O/token")" 127.0.0.1:9464/dump)"
sleep 1
curl -s 127.0.0.1:9464/metrics | grep -E "^gpu_trace_flight" | head
wait $P; echo "exit $?"
ls "$O/dumps3"
for d in "$O"/dumps3/*.gtrace; do echo -n "$(basename "$d"): "; "$B" replay "$d" 2>/dev/null > "$d.txt"; counts "$d.txt"; done

echo "== 4. gpu-trace api on the run loop $(date -u +%T)"
cat > "$O/small.py" <<'PY'
import torch
x = torch.randn(64, 64, device="cuda")
for _ in range(500): y = x + x
torch.cuda.synchronize()
print("child done", flush=True)
PY
"$B" api --format json -- sh -c "python3 $O/small.py; python3 $O/small.py" > "$O/api_children.jsonl" 2> "$O/api_children.stderr"; echo "exit $?"
grep -E "uprobes attached|attaching" "$O/api_children.stderr" | head -5
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
grep -c " API_CALL " "$O/api_v.txt"

echo "== 5. --gpu completion $(date -u +%T)"
GPU_TRACE_COMPLETE=fish "$B" -- gpu-trace --gpu ''

echo "== 6. 2>&1 | head -1 $(date -u +%T)"
"$B" --api -d 3 -- python3 "$O/mm.py" 1 2>&1 | head -1; echo "gpu-trace exit ${PIPESTATUS[0]}"
sleep 1
echo "stopped processes left (state T):"; ps -eo pid,stat,comm | awk '$2 ~ /^T/' | head
echo "== end $(date -u +%T)"
