#!/bin/bash
# Issue 26 (reliability) on the GPU host, with the real driver and PyTorch:
#   sudo bash examples/gpu-host-reliability.sh BIN RM_STORM OUTDIR
# BIN: a release build of gpu-trace; RM_STORM: examples/rm_storm.c built (cc -O2 -pthread).
# 1. doctor; 2. the scheduling regression (examples/gpu-host-sched.sh); 3. exact per-process
#    counts of 8 concurrent PyTorch processes (examples/multi_proc_counts.sh); 4. the metrics
#    endpoint under hostile clients while PyTorch runs (examples/metrics_attack.py), then the
#    events of that run; 5. SIGINT, SIGTERM and --duration while 16 threads flood /dev/nvidiactl
#    with refused schedules (how long each stop took, what was read and dropped); 6. --duration
#    counted from attach.
# OUTDIR/summary.txt gets ok/BAD lines; the exit status is the number of BAD.
set -u
BIN=$(realpath "${1:?gpu-trace binary}"); STORM=$(realpath "${2:?rm_storm binary}")
OUT=$(realpath -m "${3:?output dir}"); mkdir -p "$OUT"
# Where the storm goes and what the tracer adds to watch it (a machine without the driver can try
# part 5 with STORM_DEV=/dev/full TRACE_EXTRA="--watch-device /dev/full" ONLY=storm).
STORM_DEV=${STORM_DEV:-/dev/nvidiactl}; read -r -a TRACE_EXTRA <<<"${TRACE_EXTRA:-}"; ONLY=${ONLY:-all}
cd "$(dirname "$0")/.."
: >"$OUT/summary.txt"
bad=0
note() { echo "$1" >>"$OUT/summary.txt"; case $1 in BAD*) bad=$((bad + 1)) ;; esac; }
{ uname -r; head -1 /proc/driver/nvidia/version; nvidia-smi -L; "$BIN" --version; nproc; } >"$OUT/host.txt" 2>&1

if [ "$ONLY" = all ]; then
# 1. doctor
"$BIN" doctor >"$OUT/doctor.txt" 2>&1; rc=$?
echo "doctor exit $rc" >>"$OUT/doctor.txt"
note "$(case $rc in 0|5) echo ok;; *) echo BAD;; esac) doctor exit $rc: $(head -2 "$OUT/doctor.txt" | tr '\n' ' ' | tr -s ' ')"

# 2. regression
bash examples/gpu-host-sched.sh "$BIN" "$OUT/sched" >/dev/null 2>&1
note "$( [ "$(grep -c '^BAD' "$OUT/sched/summary.txt")" = 0 ] && echo ok || echo BAD) sched: $(grep -c '^ok' "$OUT/sched/summary.txt") ok, $(grep -c '^BAD' "$OUT/sched/summary.txt") BAD"

# 3. exact counts, 8 processes
bash examples/multi_proc_counts.sh "$BIN" 8 "$OUT/multi" >"$OUT/multi.txt" 2>&1; rc=$?
note "$( [ $rc = 0 ] && echo ok || echo BAD) multi_proc_counts 8: $(grep -E '^(PASS|FAIL)' "$OUT/multi.txt" | head -1)"

# 4. metrics under attack while PyTorch runs
"$BIN" --metrics 127.0.0.1:19464 --format json -v -o "$OUT/metrics.jsonl" 2>"$OUT/metrics.err" & tp=$!
sleep 2
python3 examples/two_streams.py >"$OUT/metrics-workload.log" 2>&1 & wp=$!
python3 examples/metrics_attack.py 127.0.0.1:19464 $tp >"$OUT/metrics-attack.txt" 2>&1; arc=$?
wait $wp
curl -s http://127.0.0.1:19464/metrics >"$OUT/metrics-scrape.txt" 2>/dev/null \
  || python3 -c 'import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:19464/metrics").read().decode())' >"$OUT/metrics-scrape.txt"
sleep 1
kill -INT $tp; wait $tp; trc=$?
wpid=$(grep -o '"pid":[0-9]*' "$OUT/metrics.jsonl" | sort | uniq -c | sort -rn | head -1 | grep -o '[0-9]*$')
counts=$(python3 - "$OUT/metrics.jsonl" <<'PY'
import json, sys, collections
c = collections.Counter()
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e.get("event") in ("TASK_INIT", "SCHEDULE", "WORK_SUBMIT", "TASK_DESTROY") and "python" in e.get("comm", ""):
        c[e["event"]] += 1
print(" ".join(f"{k}={c[k]}" for k in ("TASK_INIT", "SCHEDULE", "WORK_SUBMIT", "TASK_DESTROY")))
PY
)
note "$( [ $arc = 0 ] && [ $trc = 0 ] && echo ok || echo BAD) metrics under attack: attacks bad=$arc, tracer exit $trc; python events: $counts; scrape lines $(wc -l <"$OUT/metrics-scrape.txt")"

fi

# 5. stops under a storm of refused schedules on /dev/nvidiactl
stop_under_storm() { # NAME SIGNAL-or-"duration" GPU-TRACE-ARGS...
  local name=$1 how=$2; shift 2
  "$BIN" -v -o /dev/null --record "$OUT/$name.gtrace" "${TRACE_EXTRA[@]}" "$@" 2>"$OUT/$name.err" & local tp=$!
  sleep 1.5
  "$STORM" 16 20 "$STORM_DEV" >"$OUT/$name.storm" 2>&1 & local sp=$!
  local t0
  if [ "$how" = duration ]; then t0=$(date +%s.%N); wait $tp; local rc=$?
  else sleep 2; t0=$(date +%s.%N); kill -"$how" $tp; wait $tp; local rc=$?; fi
  local t1; t1=$(date +%s.%N)
  local running=no; kill -0 $sp 2>/dev/null && running=yes
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  local took; took=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
  local read_n; read_n=$("$BIN" replay "$OUT/$name.gtrace" --format json 2>/dev/null | tail -1 | python3 -c 'import json,sys; s=json.loads(sys.stdin.read()); k=s.get("kernel") or {}; print("emitted=%s dropped=%s" % (k.get("emitted"), k.get("dropped")))')
  local recorded; recorded=$("$BIN" replay "$OUT/$name.gtrace" --format json 2>/dev/null | grep -c '"event":"SCHEDULE"')
  echo "$name: exit $rc, ${took}s after the stop request, storm still running: $running, $read_n, SCHEDULE lines replayed $recorded" >>"$OUT/storm.txt"
  local verdict=BAD
  if [ "$how" = duration ]; then python3 -c "import sys; sys.exit(0 if $took < 1.0 + 2.0 + 1.0 else 1)" && verdict=ok
  else python3 -c "import sys; sys.exit(0 if $took <= 1.0 else 1)" && verdict=ok; fi
  [ "$running" = yes ] || verdict=BAD
  case $rc in 0|4) ;; *) verdict=BAD;; esac
  note "$verdict stop under storm ($name): exit $rc after ${took}s, storm running: $running, $read_n"
}
stop_under_storm storm-sigint INT
stop_under_storm storm-sigterm TERM
# --duration 2 is counted from attach; the storm starts 1.5 s after launch: the stop is due
# about 0.5 s after the storm started (t0 is taken when waiting begins).
stop_under_storm storm-duration duration --duration 2

if [ "$ONLY" = all ]; then
# 6. --duration counted from attach
"$BIN" -d 2 --format json >"$OUT/duration.jsonl" 2>"$OUT/duration.err"; rc=$?
d=$(tail -1 "$OUT/duration.jsonl" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read()).get("duration_s"))')
note "$(python3 -c "import sys; sys.exit(0 if 2.0 <= float('$d') < 2.5 else 1)" && echo ok || echo BAD) -d 2: exit $rc, duration_s $d"

fi
cat "$OUT/summary.txt"
exit $bad
