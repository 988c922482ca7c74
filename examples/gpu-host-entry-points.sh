#!/bin/bash
# Driver entry points (issue 17), on the GPU host: where the kernel lets gpu-trace hook the NVIDIA
# driver's own entry points, and what it uses where it does not.
#   sudo bash examples/gpu-host-entry-points.sh BIN OUTDIR
# 1. `gpu-trace doctor` (its "driver entry points" row) and the kernel's answer to the hooks;
# 2. examples/gpu-host-sched.sh: the regression run (scheduling truth against the raw calls);
# 3. a PyTorch run traced with --bpf-stats: which programs ran how often (the kernel's own
#    counts), beside a run of getppid() in a loop while tracing. Where the entry points are
#    refused, the syscall layer's program must have run for (at least) every one of those calls
#    and the start-up report must name both refusals; where they attach, no syscall-layer
#    program may be loaded. Either way the TASK_INIT/SCHEDULE events must be there.
# Prints ok/BAD lines into OUTDIR/summary.txt; exit status = number of BAD.
set -u
BIN=$(realpath "${1:?gpu-trace binary}"); OUT=$(realpath -m "${2:?output dir}"); mkdir -p "$OUT"
cd "$(dirname "$0")/.."
. examples/run_traced.sh
: >"$OUT/summary.txt"
bad=0
note() { echo "$1" >>"$OUT/summary.txt"; case $1 in BAD*) bad=$((bad + 1)) ;; esac; }
{ uname -r; head -1 /proc/driver/nvidia/version; nvidia-smi -L; "$BIN" --version; } >"$OUT/host.txt" 2>&1

# 1. doctor
"$BIN" doctor >"$OUT/doctor.txt" 2>&1
echo "doctor exit $?" >>"$OUT/doctor.txt"
note "$(grep -q 'driver entry points' "$OUT/doctor.txt" && echo ok || echo BAD) doctor: $(grep 'driver entry points' "$OUT/doctor.txt" | tr -s ' ' | head -1)"

# 2. regression
bash examples/gpu-host-sched.sh "$BIN" "$OUT/sched" >/dev/null 2>&1
note "$( [ "$(grep -c '^BAD' "$OUT/sched/summary.txt")" = 0 ] && echo ok || echo BAD) sched: $(grep -c '^ok' "$OUT/sched/summary.txt") ok, $(grep -c '^BAD' "$OUT/sched/summary.txt") BAD"

# 3. program run counts while a PyTorch job and 1e6 getppid() run.
N=1000000
run_traced stats --format json --bpf-stats -- sh -c \
  "python3 -c 'import os; [os.getppid() for _ in range($N)]' && python3 examples/two_streams.py"
grep -E "hooks:|not used|program " "$OUT/stats.err" >"$OUT/stats-programs.txt"
python3 - "$OUT/stats.err" "$OUT/stats.out" "$N" >"$OUT/stats-check.txt" 2>&1 <<'PY'
import json, re, sys
err = open(sys.argv[1]).read()
n = int(sys.argv[3])
runs = {m.group(1): int(m.group(2)) for m in re.finditer(r"gpu-trace: program (\S+): (\d+) runs", err)}
events = [json.loads(l)["event"] for l in open(sys.argv[2]) if l.strip()]
print("program runs:", runs)
print("events:", {e: events.count(e) for e in sorted(set(events))})
syscall_layer = {k: v for k, v in runs.items() if k.startswith(("sys_exit", "tp_ioctl", "tp_close"))}
entry = {k: v for k, v in runs.items() if k.startswith(("nv_ioctl", "nv_close"))}
ok = "TASK_INIT" in events and "SCHEDULE" in events
if entry:
    print("entry points attached:", entry)
    ok = ok and not syscall_layer and "syscall layer not attached" in err
else:
    refused = "NVIDIA ioctls" in err or "NVIDIA driver entry points" in err
    print("entry points not attached; refusal reported:", refused, "syscall layer:", syscall_layer)
    ok = ok and refused and any(v >= n for v in syscall_layer.values())
sys.exit(0 if ok else 1)
PY
rc=$?
note "$( [ $rc = 0 ] && echo ok || echo BAD) bpf-stats: $(head -1 "$OUT/stats-check.txt" | cut -c1-300)"
cat "$OUT/summary.txt"
exit $bad
