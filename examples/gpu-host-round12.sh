#!/bin/bash
# Round 12 on the GPU host: the one event loop (both live commands) and API_STUCK in the main
# trace, against the real driver, libcuda and libcudart.
#   1. a CUDA program whose kernel spins for S seconds on the GPU, then cudaDeviceSynchronize:
#      the program's own clock says how long its sync call was open (the truth);
#      `gpu-trace --api --stuck-after 2 --flight-recorder 1m --dump-on stuck` reports the
#      open calls (API_STUCK) and writes one dump named after the trigger, which replays;
#   2. `gpu-trace api --stuck-after 2` on the same program (the one loop's Stuck piece);
#   3. `gpu-trace api -- sh -c 'A; B'`: both PyTorch children and their cuLaunchKernel counts
#      (each child launches 500 adds: its own count);
#   4. SIGUSR1 and POST /dump on the one loop: a dump each, the flight metrics.
#   examples/gpu-host-round12.sh BIN OUT
set -u
B=$1; O=$2/round12
mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; uname -r; nvidia-smi -L
export PATH=$PATH:/usr/local/cuda/bin
cat > "$O/spin.cu" <<'CU'
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <cuda_runtime.h>
__global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
static double now() { timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec / 1e9; }
int main(int argc, char **argv) {
  double s = argc > 1 ? atof(argv[1]) : 6;
  cudaFree(0);
  spin<<<1, 1>>>((unsigned long long)(s * 1e9));
  double a = now();
  cudaError_t e = cudaDeviceSynchronize();
  double b = now();
  printf("sync open %.3f s (error %d)\n", b - a, (int)e);
  return e != cudaSuccess;
}
CU
nvcc -cudart shared -o "$O/spin" "$O/spin.cu" && echo "built spin (shared libcudart)"; ldd "$O/spin" | grep -E "cudart|cuda\.so"

echo "== 1. main trace --api --stuck-after 2 --dump-on stuck $(date -u +%T)"
rm -rf "$O/dumps1"; mkdir -p "$O/dumps1"
"$B" --api --stuck-after 2 --format json --flight-recorder 1m --dump-on stuck --dump-dir "$O/dumps1" \
  -- "$O/spin" 6 > "$O/main_stuck.jsonl" 2> "$O/main_stuck.stderr"; echo "exit $?"
grep -h "sync open" "$O/main_stuck.jsonl"
grep -E "uprobes attached|flight|stuck" "$O/main_stuck.stderr" | head
python3 - "$O/main_stuck.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    v = json.loads(l)
    if v["event"] == "API_STUCK":
        print("API_STUCK", v["symbol"], v["library"], "open_ms", v.get("open_ms", v.get("open_ns")), "state", v.get("state"), "frames", len(v.get("stack", [])))
    if v["event"] == "STATS":
        print("STATS flight_recorder", json.dumps(v.get("flight_recorder")))
PY
ls "$O/dumps1"
for d in "$O"/dumps1/*.gtrace; do "$B" replay "$d" > "$d.txt" 2>&1; echo "$(basename "$d") replay exit $? lines $(wc -l < "$d.txt")"; done
echo "-- the text shape:"
"$B" --api --stuck-after 2 -- "$O/spin" 3 2>/dev/null | grep -E "API_STUCK|sync open" | cut -c1-220

echo "== 2. gpu-trace api --stuck-after 2 $(date -u +%T)"
"$B" api --stuck-after 2 --format json -- "$O/spin" 4 > "$O/api_stuck.jsonl" 2> "$O/api_stuck.stderr"; echo "exit $?"
grep -h "sync open" "$O/api_stuck.jsonl"
grep -h '"API_STUCK"' "$O/api_stuck.jsonl" | python3 -c '
import json, sys
for l in sys.stdin:
    v = json.loads(l); print("API_STUCK", v["symbol"], v["library"], "state", v.get("state"))'

echo "== 3. gpu-trace api -- sh -c 'A; B' $(date -u +%T)"
cat > "$O/small.py" <<'PY'
import torch
x = torch.randn(64, 64, device="cuda")
for _ in range(500): y = x + x
torch.cuda.synchronize()
print("child done", flush=True)
PY
for run in 1 2 3; do
"$B" api --format json -- sh -c "python3 $O/small.py; python3 $O/small.py" > "$O/api_children$run.jsonl" 2> "$O/api_children$run.stderr"; echo "run $run exit $?"
python3 - "$O/api_children$run.jsonl" <<'PY'
import collections, json, sys
rows = collections.defaultdict(dict)
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    v = json.loads(l)
    if v["event"] == "API_STATS" and v["final"]:
        rows[v["pid"]][v["symbol"]] = rows[v["pid"]].get(v["symbol"], 0) + v["calls"]
for pid, r in rows.items():
    print("  pid", pid, "symbols", len(r), {k: n for k, n in r.items() if k.startswith("cuLaunchKernel")})
PY
done

echo "== 4. SIGUSR1 and POST /dump on the one loop $(date -u +%T)"
cat > "$O/mm.py" <<'PY'
import sys, time, torch
x = torch.randn(2048, 2048, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
t = time.time()
while time.time() - t < float(sys.argv[1]):
    y = x @ x
torch.cuda.synchronize()
print("done", flush=True)
PY
rm -rf "$O/dumps4"; mkdir -p "$O/dumps4"
head -c 24 /dev/urandom | base64 > "$O/token"; chmod 600 "$O/token"
"$B" -q --flight-recorder 30s --dump-dir "$O/dumps4" --dump-max-per-hour 5 --metrics 127.0.0.1:9464 --dump-token-file "$O/token" \
  -- python3 "$O/mm.py" 6 > "$O/flight4.txt" 2> "$O/flight4.stderr" &
P=$!
timeout 60 grep -q ready <(tail -f "$O/flight4.txt" --pid=$P)
kill -USR1 $P
echo "no token: $(curl -s -o /dev/null -w '%{http_code}' -X POST 127.0.0.1:9464/dump)"
echo "token: $(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $(cat "$O/token")" 127.0.0.1:9464/dump)"
sleep 1
curl -s 127.0.0.1:9464/metrics | grep -E "^gpu_trace_flight" | head
wait $P; echo "exit $?"
for d in "$O"/dumps4/*.gtrace; do "$B" replay "$d" > "$d.txt" 2>&1; echo "$(basename "$d") replay exit $? schedules $(grep -c ' SCHEDULE ' "$d.txt")"; done
echo "== end $(date -u +%T)"
