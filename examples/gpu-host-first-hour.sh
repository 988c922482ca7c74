#!/bin/bash
# An operator's first hour on the GPU host (issues 28 and 30), against real CUDA workloads
# (examples/two_streams.py: 4 TASK_INIT, 4 SCHEDULE, 20 WORK_SUBMIT, 4 TASK_DESTROY per process
# on the reference H100/H200, the LD_PRELOAD ground truth of earlier rounds):
#   1. launch: `gpu-trace -v -- sh -c 'two python3 …; exit 3'` while a third python3 runs
#      outside: exit status 3, the two launched processes exactly, nothing of the outsider;
#   2. --gpu: by index, by UUID (from nvidia-smi), and a GPU that is not there;
#   3. --api: driver events tagged with the CUDA call open on their thread (real libcuda);
#   4. --metrics: a scrape during a run: the UUID label, and no event series at zero;
#   5. top: a tmux screen after a series of short CUDA jobs (exited rows marked, expired).
#   examples/gpu-host-first-hour.sh [OUT]     (OUT defaults to $OUT; writes OUT/first-hour/)
# Bounded: every step under `timeout`; about two minutes.
set -u
B=$(realpath ./target/release/gpu-trace)
H=$(cd "$(dirname "$0")" && pwd)
O=${1:-${OUT:?give OUT}}/first-hour
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
W="python3 $H/two_streams.py"
# Per-pid counts of the four events in a JSON trace, and the exit status line.
counts() { python3 - "$1" <<'PY'
import collections, json, sys
c = collections.defaultdict(collections.Counter); api = collections.Counter(); n = 0
for l in open(sys.argv[1]):
    try: v = json.loads(l)
    except ValueError: continue
    e = v.get("event")
    if e in ("TASK_INIT", "SCHEDULE", "WORK_SUBMIT", "TASK_DESTROY"):
        c[v["pid"]][e] += 1; n += 1
        if v.get("api"): api[(e, json.dumps(v["api"], sort_keys=True)[:160])] += 1
for pid, k in sorted(c.items()):
    print(f"  pid {pid}: " + " ".join(f"{e}={k[e]}" for e in ("TASK_INIT", "SCHEDULE", "WORK_SUBMIT", "TASK_DESTROY")))
print(f"  events: {n}")
for (e, a), k in sorted(api.items()): print(f"  api {e} x{k}: {a}")
PY
}

echo "== 1. launch: two processes inside, one outside"
: > "$O/launch-workloads.log"
timeout 60 $W >> "$O/launch-outsider.log" 2>&1 &
OUTSIDER=$!
timeout 90 "$B" -v --format json -o "$O/launch.jsonl" -- \
  sh -c "$W >> $O/launch-workloads.log 2>&1 & $W >> $O/launch-workloads.log 2>&1; wait; exit 3" \
  2> "$O/launch.stderr"
echo "gpu-trace exit $? (the command's 3 expected)"
wait $OUTSIDER
echo "launched: $(grep -o 'pid=[0-9]*' "$O/launch-workloads.log" | tr '\n' ' ')  outsider: $(grep -o 'pid=[0-9]*' "$O/launch-outsider.log")"
counts "$O/launch.jsonl"
grep "PRETRACE\|before tracing" "$O/launch.stderr" | head -3

echo "== 2. --gpu 0, --gpu $UUID, --gpu 7"
for g in 0 "$UUID" 7; do
  f="$O/gpu-${g:0:8}"
  timeout 60 "$B" -v --format json -o "$f.jsonl" --gpu "$g" -- $W > /dev/null 2> "$f.stderr"
  echo "--gpu $g: exit $?"; counts "$f.jsonl"
  grep -o '"gpu_unknown":[0-9]*' "$f.jsonl" | tail -1
  grep -i "gpu" "$f.stderr" | grep -iv "^gpu-trace: (not used\|hooks:" | head -4
done

echo "== 3. --api: driver events inside the CUDA call open on their thread"
timeout 120 "$B" --api -v -- $W > "$O/api.txt" 2> "$O/api.stderr"
echo "gpu-trace --api exit $?"
grep -E "TASK_INIT|SCHEDULE|TASK_DESTROY" "$O/api.txt" | head -12
timeout 120 "$B" --api -v --format json -o "$O/api.jsonl" -- $W > /dev/null 2>> "$O/api.stderr"
echo "json exit $?"; counts "$O/api.jsonl"
tail -5 "$O/api.stderr"

echo "== 4. --metrics: a scrape during a run"
timeout 60 "$B" --metrics 127.0.0.1:9464 -o /dev/null -- sh -c "LINGER=4 $W" 2> "$O/metrics.stderr" &
M=$!
sleep 9
curl -s --max-time 5 http://127.0.0.1:9464/metrics > "$O/metrics.txt" || echo "scrape failed"
wait $M; echo "gpu-trace exit $?"
grep '^gpu_trace_events_total' "$O/metrics.txt"
echo "event series at zero: $(grep '^gpu_trace_events_total' "$O/metrics.txt" | awk '$NF == 0' | wc -l)"

echo "== 5. top after short CUDA jobs"
if command -v tmux >/dev/null; then
  tmux new-session -d -s top -x 120 -y 30 "$B top --expire 20 2> $O/top.stderr; echo EXIT=\$? > $O/top.exit; sleep 60"
  sleep 3
  for i in 1 2 3 4 5 6; do timeout 60 python3 -c 'import torch; torch.zeros(1, device="cuda"); torch.cuda.synchronize()'; done
  timeout 60 python3 "$H/matmul_loop.py" 6 > /dev/null 2>&1 &
  LOOPPID=$!
  sleep 4
  tmux capture-pane -p -t top > "$O/top-screen.txt"
  # Not a bare `wait`: it would wait for the `tee` of this script's own output too.
  wait $LOOPPID
  tmux send-keys -t top q; sleep 2; cat "$O/top.exit" 2>/dev/null
  tmux kill-server
  cat "$O/top-screen.txt"
fi
date -u
