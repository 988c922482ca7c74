#!/usr/bin/env bash
# Exact counts under concurrency on a real GPU: K PyTorch processes (examples/two_streams.py) at
# once under one gpu-trace; every process must get exactly the counts one process alone gets on
# the reference H200 (README, tests/fixtures): TASK_INIT 4, SCHEDULE 4, WORK_SUBMIT 20,
# TASK_DESTROY 4, with dropped 0.
#
#   sudo bash examples/multi_proc_counts.sh BIN [K] [OUTDIR]
#
# BIN: a release build of gpu-trace; K: concurrent processes (default 8); OUTDIR: where the JSON
# trace, stderr and the workloads' output go (default ./multi-proc-out). Prints one line per
# process and PASS/FAIL; exits 0 only on PASS. Other CUDA processes running on the host are
# ignored (only the K workload pids are checked). Override the expectation with
# EXPECT="init sched submit destroy" (e.g. on a GPU whose CUDA makes other TSGs).
set -u
BIN=${1:?gpu-trace binary}; K=${2:-8}; OUT=${3:-./multi-proc-out}
EXPECT=${EXPECT:-"4 4 20 4"}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
rm -f "$OUT/trace.jsonl" "$OUT/pids" "$OUT/workloads.log"

"$BIN" -v --format json -o "$OUT/trace.jsonl" 2>"$OUT/gpu-trace.err" &
TP=$!
# Wait until the programs are attached (gpu-trace reports its hooks on stderr).
for _ in $(seq 100); do grep -q 'hooks:' "$OUT/gpu-trace.err" 2>/dev/null && break; sleep 0.1; done
grep -q 'hooks:' "$OUT/gpu-trace.err" || { echo "gpu-trace did not start:"; cat "$OUT/gpu-trace.err"; exit 1; }

START=$(date +%s.%N)
for _ in $(seq "$K"); do
  LINGER=1 python3 "$HERE/two_streams.py" >>"$OUT/workloads.log" 2>&1 &
  echo $! >>"$OUT/pids"
done
wait $(cat "$OUT/pids")
END=$(date +%s.%N)
sleep 1
kill -INT $TP
wait $TP; RC=$?
echo "gpu-trace exit code $RC ($K processes in $(awk "BEGIN{print $END - $START}") s)"

python3 - "$OUT/trace.jsonl" "$OUT/pids" "$EXPECT" <<'EOF'
import collections, json, sys
trace, pidfile, expect = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split()]
pids = [int(l) for l in open(pidfile) if l.strip()]
names = ["TASK_INIT", "SCHEDULE", "WORK_SUBMIT", "TASK_DESTROY"]
lines = collections.Counter()
stats = None
for line in open(trace):
    ev = json.loads(line)
    if ev["event"] == "STATS":
        stats = ev
    elif "pid" in ev:  # the INVENTORY line (processes open before tracing) has none
        lines[(ev["pid"], ev["event"])] += 1
if stats is None:
    sys.exit("FAIL: no STATS line (gpu-trace did not end cleanly)")
rows = {p["pid"]: p for p in stats["processes"]}
ok = stats["kernel"]["dropped"] == 0
print(f"kernel counters: {stats['kernel']}")
print(f"{'PID':>8}  {'TASK_INIT':>9} {'SCHEDULE':>8} {'WORK_SUBMIT':>11} {'TASK_DESTROY':>12}  (event lines)  expected {expect}")
for pid in pids:
    row = rows.get(pid, {})
    got = [row.get(k, 0) for k in ("task_init", "schedule", "work_submit", "task_destroy")]
    from_lines = [lines[(pid, n)] for n in names]
    good = got == expect and from_lines == expect
    ok &= good
    print(f"{pid:>8}  {got[0]:>9} {got[1]:>8} {got[2]:>11} {got[3]:>12}  {from_lines}  {'ok' if good else 'MISMATCH'}")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
