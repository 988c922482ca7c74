#!/usr/bin/env bash
# What ran on the GPU host to produce the real outputs in README.md, docs/ and examples/:
#   bash examples/gpu-host-run.sh BIN OUTDIR
# BIN is a release build of gpu-trace; OUTDIR receives the outputs and recordings.
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
. "$(dirname "$0")/run_traced.sh"
{ uname -r; cat /proc/driver/nvidia/version; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; } >"$OUT/host.txt" 2>&1
run_traced two_streams -v --record "$OUT/two_streams.gtrace" -- python3 examples/two_streams.py
run_traced two_streams_json -v --format json -- python3 examples/two_streams.py
run_traced ctx_churn -v --record "$OUT/ctx_churn.gtrace" -- env ROUNDS=3 python3 examples/ctx_churn.py
run_traced two_procs --comm python3 -- bash -c 'python3 examples/two_streams.py & python3 examples/two_streams.py; wait'
for hook in tp-btf tracepoint; do
  run_traced "hook_$hook" -v --syscall-hook $hook -- python3 examples/two_streams.py
done

# --- Users' side (issue 5): doctor, Perfetto timelines, contention, admission control ---------
# What the machine allows, and the raw facts doctor reads (for its tests: platforms.md values).
"$BIN" doctor >"$OUT/doctor.txt" 2>&1; echo "doctor: exit $?" >>"$OUT/workloads.log"
"$BIN" doctor --json >"$OUT/doctor.json" 2>>"$OUT/workloads.log"
{ cat /proc/devices; echo "--- lsm"; cat /sys/kernel/security/lsm; echo; echo "--- lockdown";
  cat /sys/kernel/security/lockdown; ls -l /dev/nvidia* /dev/kfd 2>&1; } >"$OUT/doctor_facts.txt" 2>&1
# A live Perfetto timeline next to the text, and the same from the recording (must match).
run_traced two_streams_perfetto -v --perfetto "$OUT/two_streams.perfetto.json" \
  --record "$OUT/two_streams_perfetto.gtrace" -- python3 examples/two_streams.py
"$BIN" replay "$OUT/two_streams_perfetto.gtrace" -v --perfetto "$OUT/two_streams.replay.perfetto.json" \
  >"$OUT/two_streams_perfetto.replay.txt"
cmp "$OUT/two_streams.perfetto.json" "$OUT/two_streams.replay.perfetto.json" \
  && echo "perfetto: live = replay" >>"$OUT/workloads.log" || echo "perfetto: live != replay" >>"$OUT/workloads.log"
# Two processes contending (big low-priority matmuls vs small high-priority ones).
run_traced contention -v --record "$OUT/contention.gtrace" --perfetto "$OUT/contention.perfetto.json" \
  -- python3 examples/contention.py
# Admission control: --deny-pid on one of two identical workers (or the refusal where the kernel
# cannot run BPF LSM programs).
bash examples/admission_control.sh "$BIN" "$OUT" >>"$OUT/workloads.log" 2>&1
