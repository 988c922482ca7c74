#!/bin/bash
# Round 12, second call: the main trace's API_STATS of a call open across reads (6 s spin),
# after the fix; and the interposer check of round 11 on the one loop.
#   examples/gpu-host-round12b.sh BIN OUT
set -u
B=$1; O=$2/round12b; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
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
nvcc -cudart shared -o "$O/spin" "$O/spin.cu" && echo built
for s in 6 3; do
"$B" --api --stuck-after 2 --format json -- "$O/spin" $s > "$O/main$s.jsonl" 2> "$O/main$s.stderr"; echo "spin $s: exit $?"
grep -h "sync open" "$O/main$s.jsonl"
python3 - "$O/main$s.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    v = json.loads(l)
    if v["event"] == "API_STUCK": print("  API_STUCK", v["symbol"], "open_ns", v["open_ns"])
    if v["event"] == "API_STATS" and "Synchronize" in v["symbol"]:
        print("  API_STATS final", v["final"], v["symbol"], "calls", v["calls"], "untimed", v["untimed"], "total_ns", v["total_ns"])
PY
done
echo "== interposer (round 11's check on the one loop)"
bash "$(dirname "$0")/gpu-host-interposer.sh" "$B" "$O" 2>&1 | tail -25
