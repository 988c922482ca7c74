#!/usr/bin/env bash
# Test fixtures captured on the GPU host (gpu-trace/tests/fixtures/h100_late_mps: recordings for the
# late-attach, MPS and stream-priority tests):
#   bash examples/gpu-host-capture-fixtures.sh BIN OUTDIR
# BIN is a release build of gpu-trace. Every recording is made with --record so that the tests
# can replay the raw driver calls; the host facts the inventory reads are saved beside them.
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
log() { echo "$(date +%T.%N | cut -c1-12) $*" >>"$OUT/capture.log"; }
{ uname -r; cat /proc/driver/nvidia/version
  nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,memory.total --format=csv
  for f in /proc/driver/nvidia/gpus/*/information; do echo "== $f"; cat "$f"; done
  ls -l /dev/nvidia* /dev/dri 2>&1
  echo "== nvml"; ldconfig -p | grep -i nvidia-ml; ls /usr/local/nvidia/lib64 2>&1 | grep -i ml
  echo "== cgroup"; cat /proc/self/cgroup; grep -E 'cgroup' /proc/mounts
  echo "== lsm"; cat /sys/kernel/security/lsm; echo
} >"$OUT/facts.txt" 2>&1

# 1. Late attach: the job runs 5 s before the tracer starts and ends while it traces.
LATE_SECONDS=10 python3 examples/late_job.py >>"$OUT/capture.log" 2>&1 & jp=$!
sleep 5
{ echo "== pid $jp"; ls -l /proc/$jp/fd 2>&1 | grep -E 'nvidia|kfd'; cat /proc/$jp/cgroup
  tr '\0' ' ' </proc/$jp/cmdline; echo
  nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv; } >"$OUT/late_facts.txt" 2>&1
log "late: tracer start"
timeout -s INT 12 "$BIN" -v --record "$OUT/late_attach.gtrace" >"$OUT/late_attach.out" 2>"$OUT/late_attach.err"
log "late: tracer exit $?"; wait $jp; log "late: job exit $?"

# 2. MPS: tracer first, then the daemon's server and two clients; then a late attach under MPS.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
"$BIN" -v --record "$OUT/mps.gtrace" >"$OUT/mps.out" 2>"$OUT/mps.err" & tp=$!
sleep 2
nvidia-cuda-mps-control -d; log "mps: daemon $?"
python3 examples/two_streams.py >>"$OUT/capture.log" 2>&1 & c1=$!
python3 examples/two_streams.py >>"$OUT/capture.log" 2>&1 & c2=$!
wait $c1 $c2; log "mps: clients done"
sleep 1; kill -INT $tp; wait $tp; log "mps: tracer exit $?"
LATE_SECONDS=10 python3 examples/late_job.py >>"$OUT/capture.log" 2>&1 & jp=$!
sleep 5
ps -eo pid,comm,args | grep -i -E 'mps|python' | grep -v grep >"$OUT/mps_ps.txt"
for p in $(pgrep -f nvidia-cuda-mps); do echo "== $p"; ls -l /proc/$p/fd 2>&1 | grep -E 'nvidia'; done >>"$OUT/mps_ps.txt"
timeout -s INT 12 "$BIN" -v --record "$OUT/mps_late.gtrace" >"$OUT/mps_late.out" 2>"$OUT/mps_late.err"
log "mps late: tracer exit $?"; wait $jp
echo quit | nvidia-cuda-mps-control; log "mps: quit $?"
sleep 1

# 3. Stream priorities: what RM calls a high/low priority stream pair makes.
"$BIN" -v --record "$OUT/prio.gtrace" >"$OUT/prio.out" 2>"$OUT/prio.err" & tp=$!
sleep 1.5
python3 - >>"$OUT/capture.log" 2>&1 <<'PY'
import torch
lo = torch.cuda.Stream(priority=0); hi = torch.cuda.Stream(priority=-1)
a = torch.randn(1024, 1024, device="cuda")
with torch.cuda.stream(lo): x = a @ a
with torch.cuda.stream(hi): y = a @ a
torch.cuda.synchronize(); print("prio done", torch.cuda.Stream.priority_range())
PY
sleep 1; kill -INT $tp; wait $tp; log "prio: tracer exit $?"
ls -la "$OUT" >>"$OUT/capture.log"
