#!/bin/bash
# The Perfetto timeline and `replay --top` on real CUDA work on the GPU host, beside the build's
# regression runs (scheduling, containers).
#   sudo bash examples/gpu-host-timeline.sh BIN OUTDIR
# 1. examples/gpu-host-sched.sh (scheduling truth against the raw calls) and
#    examples/gpu-host-containers.sh (pods in kubelet-shaped cgroups);
# 2. a PyTorch run traced with --format json -v and --perfetto: examples/perfetto_check.py checks
#    the timeline against the JSON lines of the same run (slices, GPU group, flows, schedules/s);
# 3. the run's recording stepped through with `replay --top` in tmux, a screen per second; the
#    final frame's SCHEDULES per process must equal the SCHEDULE lines of the JSON output.
# Prints ok/BAD lines into OUTDIR/summary.txt; exit status = number of BAD.
set -u
BIN=$(realpath "${1:?gpu-trace binary}"); OUT=$(realpath -m "${2:?output dir}"); mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. examples/run_traced.sh
: >"$OUT/summary.txt"
bad=0
note() { echo "$1" >>"$OUT/summary.txt"; case $1 in BAD*) bad=$((bad + 1)) ;; esac; }
{ uname -r; head -1 /proc/driver/nvidia/version; nvidia-smi -L; "$BIN" --version; } >"$OUT/host.txt" 2>&1

bash examples/gpu-host-sched.sh "$BIN" "$OUT/sched" >/dev/null 2>&1
note "$( [ "$(grep -c '^BAD' "$OUT/sched/summary.txt")" = 0 ] && echo ok || echo BAD) sched: $(grep -c '^ok' "$OUT/sched/summary.txt") ok, $(grep -c '^BAD' "$OUT/sched/summary.txt") BAD"
bash examples/gpu-host-containers.sh "$BIN" "$OUT/containers" >"$OUT/containers.txt" 2>&1
note "$( grep -q FAIL "$OUT/containers.txt" && echo BAD || echo ok) containers: $(grep -c PASS "$OUT/containers.txt") PASS, $(grep -c FAIL "$OUT/containers.txt") FAIL"

# 2. Timeline of a live PyTorch run, beside its JSON lines and its recording.
run_traced pf --format json -v --perfetto "$OUT/pf.perfetto.json" --record "$OUT/pf.gtrace" \
  -- python3 examples/two_streams.py
python3 examples/perfetto_check.py "$OUT/pf.perfetto.json" "$OUT/pf.out" >"$OUT/perfetto-check.txt" 2>&1
rc=$?
note "$( [ $rc = 0 ] && echo ok || echo BAD) perfetto: $(grep -c '^ok' "$OUT/perfetto-check.txt") ok, $(grep -c '^BAD' "$OUT/perfetto-check.txt") BAD"

# 3. replay --top, stepped with n until the end of the recording.
if command -v tmux >/dev/null; then
  tmux new-session -d -s rtop -x 200 -y 40 "$BIN replay $OUT/pf.gtrace --top; echo EXIT=\$? > $OUT/rtop.exit; sleep 30"
  sleep 2
  for i in $(seq 1 60); do
    tmux capture-pane -p -t rtop >"$OUT/rtop-screen-$i.txt"
    grep -q 'end of the recording' "$OUT/rtop-screen-$i.txt" && break
    tmux send-keys -t rtop n; sleep 0.5
  done
  cp "$OUT/rtop-screen-$i.txt" "$OUT/rtop-final.txt"
  tmux send-keys -t rtop q; sleep 2
  python3 - "$OUT/rtop-final.txt" "$OUT/pf.out" >"$OUT/rtop-check.txt" 2>&1 <<'PY'
import collections, json, sys
screen = open(sys.argv[1]).read().splitlines()
want = collections.Counter()
for l in open(sys.argv[2]):
    e = json.loads(l)
    if e.get("event") == "SCHEDULE":
        want[str(e["pid"])] += 1
rows = screen[[i for i, l in enumerate(screen) if l.startswith("PID ")][0] + 1:]
got = {f[0]: int(f[-4]) for f in (r.split() for r in rows) if len(f) >= 9}
print("screen:", got, "JSON:", dict(want))
sys.exit(0 if got == dict(want) and want else 1)
PY
  rc=$?
  note "$( [ $rc = 0 ] && grep -q EXIT=0 "$OUT/rtop.exit" && echo ok || echo BAD) replay --top: $i frames, $(cat "$OUT/rtop-check.txt" | head -1), $(cat "$OUT/rtop.exit")"
  tmux kill-server 2>/dev/null
else
  note "BAD replay --top: no tmux on this host"
fi
cat "$OUT/summary.txt"
exit $bad
