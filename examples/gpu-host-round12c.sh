#!/bin/bash
# Round 12, third call: a call stuck while its thread sleeps in the driver (blocking sync):
# API_STUCK's state, wait channel, system call and scanned user stack, main trace and api.
#   examples/gpu-host-round12c.sh BIN OUT
set -u
B=$1; O=$2/round12c; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
export PATH=$PATH:/usr/local/cuda/bin
cat > "$O/block.cu" <<'CU'
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
  double s = argc > 1 ? atof(argv[1]) : 5;
  cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
  cudaFree(0);
  spin<<<1, 1>>>((unsigned long long)(s * 1e9));
  double a = now();
  cudaError_t e = cudaDeviceSynchronize();
  double b = now();
  printf("sync open %.3f s (error %d)\n", b - a, (int)e);
  return e != cudaSuccess;
}
CU
nvcc -cudart shared -o "$O/block" "$O/block.cu" && echo built
"$B" --api --stuck-after 2 --format json -- "$O/block" 5 > "$O/main.jsonl" 2> "$O/main.stderr"; echo "main trace: exit $?"
"$B" api --stuck-after 2 -- "$O/block" 4 > "$O/api.txt" 2> "$O/api.stderr"; echo "api: exit $?"
grep -h "sync open" "$O/main.jsonl" "$O/api.txt"
python3 - "$O/main.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    v = json.loads(l)
    if v["event"] == "API_STUCK":
        print("API_STUCK", v["symbol"], "state", v["state"], "wchan", v["wchan"], "syscall", v["syscall"], "frames", len(v["stack"]))
        for f in v["stack"][:12]: print("   ", f)
    if v["event"] == "API_STATS" and "Synchronize" in v["symbol"]:
        print("API_STATS", v["symbol"], "calls", v["calls"], "untimed", v["untimed"], "total_ns", v["total_ns"])
PY
echo "-- gpu-trace api's text:"
grep -A14 "API_STUCK" "$O/api.txt" | head -20
