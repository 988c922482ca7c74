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
