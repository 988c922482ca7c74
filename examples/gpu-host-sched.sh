#!/usr/bin/env bash
# Scheduling truth (issue 12) on the GPU host:
#   bash examples/gpu-host-sched.sh BIN OUTDIR
# BIN is a release build of gpu-trace. Every traced run is also recorded (--record), and
# examples/sched_check.py compares what gpu-trace printed (live, and replayed) with the raw
# scheduling calls in the recording, decoded by the script itself, in the order they were made.
# OUTDIR/summary.txt lists each check with ok/BAD; the exit status is the number of BAD ones.
set -u
BIN=$(realpath "${1:?gpu-trace binary}"); OUT=$(realpath -m "${2:?output dir}"); mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. examples/run_traced.sh
bad=0
check() { # NAME COMMAND...: runs the command, records ok/BAD in the summary
  local name=$1; shift
  if "$@" >"$OUT/$name.check" 2>&1; then echo "ok  $name" >>"$OUT/summary.txt"
  else echo "BAD $name (see $name.check)" >>"$OUT/summary.txt"; bad=$((bad + 1)); fi
}
: >"$OUT/summary.txt"
{ uname -r; cat /proc/driver/nvidia/version; nvidia-smi -L
  python3 -c 'import torch; print("torch", torch.__version__)'
  echo "== compute policy (read only)"; nvidia-smi compute-policy -l 2>&1 | head -20
} >"$OUT/host.txt" 2>&1

# 1. PyTorch two streams and the libcuda context churn, default output (no -v), recorded.
for w in two_streams ctx_churn; do
  case $w in
    two_streams) cmd=(python3 examples/two_streams.py) ;;
    ctx_churn) cmd=(env ROUNDS=3 python3 examples/ctx_churn.py) ;;
  esac
  run_traced "$w" --record "$OUT/$w.gtrace" -- "${cmd[@]}"
  "$BIN" replay "$OUT/$w.gtrace" >"$OUT/$w.replay.txt" 2>"$OUT/$w.replay.err"
  # Every timeslice change and preemption the process made, in its order, live and replayed.
  check "$w.live_vs_raw" python3 examples/sched_check.py "$OUT/$w.gtrace" "$OUT/$w.out"
  check "$w.replay_vs_raw" python3 examples/sched_check.py "$OUT/$w.gtrace" "$OUT/$w.replay.txt"
  # The replay prints the live run's event lines (same build, same options).
  check "$w.live_eq_replay" bash -c "diff <(sed '/^--- gpu-trace statistics/,\$d' '$OUT/$w.out') \
    <(sed '/^--- gpu-trace statistics/,\$d' '$OUT/$w.replay.txt')"
done
# two_streams: the 2048 µs of the GRAPHICS TSG is printed, in the default output.
check two_streams.graphics_2048 grep -E 'SCHED_UPDATE .* timeslice=1024 us -> 2048 us allowed=yes' \
  "$OUT/two_streams.out"
# ctx_churn: every PREEMPT with its bWait (libcuda sends bWait=1 at context teardown).
check ctx_churn.preempts grep -E 'SCHED_UPDATE .* preempt wait=yes' "$OUT/ctx_churn.out"

# 2. JSON with --interval 1: periodic STATS ("final": false) between the events, the final one
#    last, and the GRAPHICS TSG's TASK_DESTROY carrying its final 2048 µs.
run_traced two_streams_json --format json --interval 1 --record "$OUT/two_streams_json.gtrace" \
  -- python3 examples/two_streams.py
check two_streams_json.interval_and_final python3 - "$OUT/two_streams_json.out" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
stats = [l for l in lines if l["event"] == "STATS"]
assert stats and stats[-1]["final"] is True and lines[-1] is stats[-1], "final STATS last"
periodic = [s for s in stats if s["final"] is False]
assert len(periodic) >= 2, f"{len(periodic)} periodic STATS"
gr = [l for l in lines if l["event"] == "TASK_INIT" and l["engine"] == "GRAPHICS"]
for init in gr:
    d = [l for l in lines if l["event"] == "TASK_DESTROY" and l["key"] == init["key"]]
    assert d and d[0]["final"]["timeslice_us"] == 2048, (init["key"], d)
print(f"{len(periodic)} periodic STATS; GRAPHICS TSGs {[g['key'] for g in gr]} end at 2048 us")
PY
# Text with --interval 1: the blocks on stderr, stdout one line per event.
run_traced two_streams_interval --interval 1 -- python3 examples/two_streams.py
check two_streams_interval.stderr_blocks grep -q 'gpu-trace statistics so far' "$OUT/two_streams_interval.err"
check two_streams_interval.stdout_clean bash -c "! grep -q 'statistics so far' '$OUT/two_streams_interval.out'"

# 3. A TSG of our own: interleave HIGH/LOW/invalid, timeslice 4096, enable, disable, re-enable,
#    two preemptions, sent through the RM ioctls by examples/rm_tsg_sched.c.
CC=$(command -v gcc || command -v cc || true)
if [ -n "$CC" ] && "$CC" -O2 -Wall -o "$OUT/rm_tsg_sched" examples/rm_tsg_sched.c 2>"$OUT/rm_tsg_sched.build"; then
  run_traced rm_tsg_sched -v --record "$OUT/rm_tsg_sched.gtrace" -- \
    bash -c "echo \$\$ >'$OUT/rm_tsg_sched.pid'; exec '$OUT/rm_tsg_sched' >'$OUT/rm_tsg_sched.steps'"
  pid=$(cat "$OUT/rm_tsg_sched.pid")
  check rm_tsg_sched.vs_raw_and_steps python3 examples/sched_check.py "$OUT/rm_tsg_sched.gtrace" \
    "$OUT/rm_tsg_sched.out" --pid "$pid" --steps "$OUT/rm_tsg_sched.steps"
  # Did RM give us a real TSG? (If not, every request went to an unknown handle and was refused:
  # still printed, but no accepted interleave/disable was seen.)
  check rm_tsg_sched.tsg_allocated grep -E 'alloc tsg .* ret=0 errno=0 status=0x00000000' \
    "$OUT/rm_tsg_sched.steps"
  check rm_tsg_sched.task_init grep -E "TASK_INIT +PID=$pid " "$OUT/rm_tsg_sched.out"
else
  echo "BAD rm_tsg_sched: no C compiler or the build failed (rm_tsg_sched.build)" >>"$OUT/summary.txt"
  bad=$((bad + 1))
fi

# 4. Stream priorities: what a priority -1 stream makes RM do (expected: no interleave call).
run_traced prio --record "$OUT/prio.gtrace" -- python3 - <<'PY'
import torch
lo = torch.cuda.Stream(priority=0); hi = torch.cuda.Stream(priority=-1)
a = torch.randn(1024, 1024, device="cuda")
with torch.cuda.stream(lo): x = a @ a
with torch.cuda.stream(hi): y = a @ a
torch.cuda.synchronize(); print("prio done", torch.cuda.Stream.priority_range())
PY
check prio.vs_raw python3 examples/sched_check.py "$OUT/prio.gtrace" "$OUT/prio.out"
grep -h 'SCHED_UPDATE' "$OUT"/*.out >"$OUT/all_sched_updates.txt"
cat "$OUT/summary.txt"
exit $bad
