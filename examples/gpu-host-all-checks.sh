#!/usr/bin/env bash
# Every GPU-host check (health, scheduling, late attach and MPS, metrics, hardening) in one call
# (the device is lent for minutes at a time):
#   bash examples/gpu-host-all-checks.sh BIN OLD_BIN OUTDIR
# runs gpu-host-health.sh, gpu-host-sched.sh, gpu-host-late.sh, gpu-host-metrics.sh and
# gpu-host-hardening.sh into OUTDIR/{health,sched,late,metrics,hardening}, a PyTorch run of the default output, and writes
# OUTDIR/ALL-CHECKS.txt with each script's exit status and checks.
set -u
BIN=$(realpath "${1:?gpu-trace binary}"); OLD=$(realpath "${2:?previous release build}"); OUT=$(realpath -m "${3:?output dir}")
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
run() { local name=$1; shift; local t0=$SECONDS
  timeout 240 "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  echo "$name: exit $rc ($((SECONDS - t0)) s)" >>"$OUT/ALL-CHECKS.txt"; }
run health bash examples/gpu-host-health.sh "$BIN" "$OUT/health" "$OLD"
run sched bash examples/gpu-host-sched.sh "$BIN" "$OUT/sched"
[ -f examples/gpu-host-late.sh ] && run late bash examples/gpu-host-late.sh "$BIN" "$OUT/late"
[ -f examples/gpu-host-metrics.sh ] && run metrics bash examples/gpu-host-metrics.sh "$BIN" "$OUT/metrics"
[ -f examples/gpu-host-hardening.sh ] && run hardening bash examples/gpu-host-hardening.sh "$BIN" "$OUT/hardening"
for f in "$OUT"/health/doctor.rc "$OUT"/health/two_streams.counts "$OUT"/sched/summary.txt "$OUT"/late/CHECKS.txt "$OUT"/metrics/summary.txt "$OUT"/hardening.log; do
  [ -f "$f" ] && { echo "== $f"; cat "$f"; } >>"$OUT/ALL-CHECKS.txt"
done
cat "$OUT/ALL-CHECKS.txt"
