/* A 3 ns library function for the cost of a probe hit (issue 28): bench_noop calls it N times.
 *   cc -shared -fPIC -O2 -o libnoop.so noop_lib.c
 */
int __attribute__((noinline)) noop_fn(int x) { __asm__ volatile("" ::: "memory"); return x; }
