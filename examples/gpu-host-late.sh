#!/usr/bin/env bash
# Late attach and MPS on the GPU host (issue 13): what gpu-trace prints when it is started on a
# machine that is already busy.
#   sudo bash examples/gpu-host-late.sh BIN OUTDIR
# BIN is a build of gpu-trace with the inventory (PRETRACE_END, MPS_SHARED). Needs PyTorch with
# CUDA and nvidia-cuda-mps-control. Every run also records (--record) so the tests can replay it.
#
# What must appear (the script checks each and writes PASS/FAIL lines to OUTDIR/CHECKS.txt):
#  late.err        inventory line "PID <job> python3 gpu=0(<bus id> <GPU-uuid> <N> MiB) ..."
#  late.out        "PRETRACE_END PID=<job> ... tsgs=? cause=..." (its fd close or its exit)
#  late.jsonl      first line {"event":"INVENTORY",...} with the job, its GPU's bus id, UUID and
#                  memory_bytes; a PRETRACE_END line of the job
#  mps_late.err    the MPS server ("[MPS server ...]"), the control daemon and the client job
#  mps_late.out    "PRETRACE_END PID=<client> ..."
#  mps_late.jsonl  the same as JSON
#  mps.jsonl       tracer first, then MPS and two clients: one MPS_SHARED line per client, naming
#                  the server's pid and graphics TSG; client WORK_SUBMITs with task kind "shared"
#  comm.err        --comm nvidia-cuda-mps-server warns once and matches "nvidia-cuda-mps"
set -u
BIN=${1:?gpu-trace binary}; OUT=${2:?output dir}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
LOG="$OUT/late.log"; : >"$LOG"; : >"$OUT/CHECKS.txt"
log() { echo "$(date +%T.%N | cut -c1-12) $*" >>"$LOG"; }
check() { # check NAME COMMAND...
  local name=$1; shift
  if "$@" >>"$LOG" 2>&1; then echo "PASS $name" >>"$OUT/CHECKS.txt"; else echo "FAIL $name" >>"$OUT/CHECKS.txt"; fi
}
{ uname -r; cat /proc/driver/nvidia/version
  nvidia-smi --query-gpu=index,uuid,pci.bus_id,name --format=csv; } >"$OUT/facts.txt" 2>&1

# A PyTorch job started 5 s before gpu-trace, ending while traced (its 10 s loop starts after
# CUDA is set up, a few seconds in: the tracer runs 16 s). $1: output name, rest: args.
late_run() {
  local name=$1; shift
  LATE_SECONDS=10 python3 examples/late_job.py >>"$LOG" 2>&1 & local jp=$!
  sleep 5
  nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv >"$OUT/$name.smi" 2>&1
  log "$name: job $jp, tracer start"
  "$BIN" -v --duration 16 --record "$OUT/$name.gtrace" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  log "$name: tracer exit $?"; wait $jp; log "$name: job exit $?"
  echo $jp >"$OUT/$name.pid"
}

# 1. Late attach, text then JSON (+ Perfetto).
late_run late
late_run late_json --format json -o "$OUT/late.jsonl" --perfetto "$OUT/late.perfetto.json"
jp=$(cat "$OUT/late.pid"); jj=$(cat "$OUT/late_json.pid")
check "late.err: inventory line for job $jp with bus id, UUID, memory" \
  grep -E "PID $jp python3 gpu=0\([0-9a-f:.]+ GPU-[0-9a-f-]+ [0-9]+ MiB\)" "$OUT/late.err"
check "late.out: PRETRACE_END of job $jp" grep -E "PRETRACE_END PID=$jp .* tsgs=\? cause=" "$OUT/late.out"
check "late.jsonl: INVENTORY first, job $jj with memory; PRETRACE_END" python3 - "$OUT/late.jsonl" "$jj" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
pid = int(sys.argv[2])
assert lines[0]["event"] == "INVENTORY", lines[0]
p = [p for p in lines[0]["processes"] if p["pid"] == pid][0]
g = p["gpus"][0]
assert g["bus_id"] and g["uuid"].startswith("GPU-") and g["memory_bytes"], p
assert any(l["event"] == "PRETRACE_END" and l["pid"] == pid and l["tsgs"] is None for l in lines)
print("ok", p)
PY

# 2. MPS: tracer first, then the daemon and two clients (MPS_SHARED).
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
"$BIN" -v --format json -o "$OUT/mps.jsonl" --record "$OUT/mps.gtrace" 2>"$OUT/mps.err" & tp=$!
sleep 2
nvidia-cuda-mps-control -d; log "mps: daemon $?"
python3 examples/two_streams.py >>"$LOG" 2>&1 & c1=$!
python3 examples/two_streams.py >>"$LOG" 2>&1 & c2=$!
wait $c1 $c2; log "mps: clients done ($c1 $c2)"
sleep 1; kill -INT $tp; wait $tp; log "mps: tracer exit $?"
check "mps.jsonl: one MPS_SHARED per client ($c1 $c2), naming the server" python3 - "$OUT/mps.jsonl" "$c1" "$c2" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
clients = {int(sys.argv[2]), int(sys.argv[3])}
links = [l for l in lines if l["event"] == "MPS_SHARED"]
assert {l["pid"] for l in links} == clients and len(links) == 2, links
servers = {l["pid"] for l in lines if l["event"] == "TASK_INIT" and l["comm"] == "nvidia-cuda-mps"}
assert all(l["server_pid"] in servers for l in links), (links, servers)
assert any(l["event"] == "WORK_SUBMIT" and l["task"]["kind"] == "shared" for l in lines)
print("ok", links)
PY

# 3. MPS already running: a client started 5 s before gpu-trace, text then JSON.
late_run mps_late
late_run mps_late_json --format json -o "$OUT/mps_late.jsonl"
mp=$(cat "$OUT/mps_late.pid")
check "mps_late.err: MPS server, control daemon and client $mp in the inventory" \
  bash -c "grep -q 'MPS server' '$OUT/mps_late.err' && grep -q 'MPS control daemon' '$OUT/mps_late.err' && grep -q 'PID $mp python3' '$OUT/mps_late.err'"
check "mps_late.out: PRETRACE_END of client $mp" grep -E "PRETRACE_END PID=$mp " "$OUT/mps_late.out"

# 4. --comm longer than the kernel keeps (the MPS server is still running).
"$BIN" --comm nvidia-cuda-mps-server --duration 2 >"$OUT/comm.out" 2>"$OUT/comm.err"
check "comm.err: one truncation warning" \
  bash -c "[ \$(grep -c 'warning: --comm \"nvidia-cuda-mps-server\"' '$OUT/comm.err') = 1 ]"
echo quit | nvidia-cuda-mps-control; log "mps: quit $?"
ls -la "$OUT" >>"$LOG"
cat "$OUT/CHECKS.txt"
