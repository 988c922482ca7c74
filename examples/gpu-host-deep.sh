#!/usr/bin/env bash
# What ran on the GPU host for the deep hooks (issue 3), to show what gpu-trace chooses on a
# kernel without kprobes or trampolines and with the stock NVIDIA driver (no gpu_ext hooks), and
# that the events do not change:
#   bash examples/gpu-host-deep.sh BIN OUTDIR
# BIN is a release build of gpu-trace; OUTDIR receives the outputs.
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
. "$(dirname "$0")/run_traced.sh"
{ uname -r; cat /proc/driver/nvidia/version; nvidia-smi -L; } >"$OUT/host.txt" 2>&1
# The default choice (deep hooks wherever the kernel allows them), then the syscall layer alone.
run_traced deep_default -v -- python3 examples/two_streams.py
run_traced deep_off -v --no-deep-hooks -- python3 examples/two_streams.py
# Same events? Compare everything but the time, CPU and pid columns.
for f in deep_default deep_off; do
  grep -E '^[0-9]{2}:[0-9]{2}:' "$OUT/$f.out" | sed -E 's/^[^ ]+ \[CPU[0-9]+\] ([A-Z_]+) +PID=[0-9]+/\1/' >"$OUT/$f.events"
done
if cmp -s "$OUT/deep_default.events" "$OUT/deep_off.events"; then
  echo "events: default = --no-deep-hooks ($(wc -l <"$OUT/deep_off.events") lines)" >>"$OUT/workloads.log"
else
  echo "events: default != --no-deep-hooks" >>"$OUT/workloads.log"
  diff "$OUT/deep_default.events" "$OUT/deep_off.events" >>"$OUT/workloads.log"
fi
rm -f "$OUT/deep_default.events" "$OUT/deep_off.events"
# --vendor amd on a host without amdgpu, and doctor's view of the deep hooks.
timeout 20 "$BIN" --vendor amd --duration 1 >"$OUT/vendor_amd.out" 2>"$OUT/vendor_amd.err"
echo "vendor amd: exit $?" >>"$OUT/workloads.log"
"$BIN" doctor >"$OUT/doctor.txt" 2>&1; echo "doctor: exit $?" >>"$OUT/workloads.log"
