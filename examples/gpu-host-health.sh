#!/usr/bin/env bash
# After the code-health restructuring (probe/ reads the system for doctor too, one target table,
# vmlinux BTF parsed once): doctor and a default trace on the GPU host, and, given the previous
# build, doctor's JSON of both side by side (they must match).
#   bash examples/gpu-host-health.sh BIN OUTDIR [OLD_BIN]
# BIN is a release build of gpu-trace (as root). Look for: doctor.txt's NVIDIA rows "driver yes
# nvidia 580.… (open kernel module)" and "device nodes yes /proc/devices: 195 …; /dev/nvidiactl
# 195:255"; exit status 5 in doctor.rc; two_streams.counts with 4 TASK_INIT, 4 SCHEDULE, 20
# WORK_SUBMIT, 4 TASK_DESTROY; and, with OLD_BIN, an empty doctor.diff.
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; OLD=${3:-}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
"$BIN" doctor >"$OUT/doctor.txt" 2>&1; echo $? >"$OUT/doctor.rc"
"$BIN" doctor --json >"$OUT/doctor.json" 2>"$OUT/doctor.json.err"
if [ -n "$OLD" ]; then
  "$OLD" doctor --json >"$OUT/doctor.old.json" 2>"$OUT/doctor.old.json.err"
  diff "$OUT/doctor.old.json" "$OUT/doctor.json" >"$OUT/doctor.diff"; echo "doctor diff rc $?" >>"$OUT/doctor.rc"
fi
"$BIN" -v >"$OUT/two_streams.out" 2>"$OUT/two_streams.err" & tp=$!
sleep 2
python3 examples/two_streams.py >"$OUT/two_streams.py.log" 2>&1
sleep 1; kill -INT $tp; wait $tp; echo "tracer exit $?" >>"$OUT/two_streams.err"
# Text lines are "TIME [CPUn] KIND ...": count the third field.
awk '{print $3}' "$OUT/two_streams.out" | sort | uniq -c >"$OUT/two_streams.counts"
cat "$OUT/doctor.rc" "$OUT/two_streams.counts"
