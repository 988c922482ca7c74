/* Calls libnoop.so's noop_fn N times and prints the nanoseconds per call. The process waits
 * WAIT seconds first (for a tracer to attach by pid).
 *   cc -O2 -o bench_noop bench_noop.c -L. -lnoop -Wl,-rpath,'$ORIGIN'
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int noop_fn(int);
int main(int argc, char **argv) {
	long n = argc > 1 ? atol(argv[1]) : 200000;
	int wait = argc > 2 ? atoi(argv[2]) : 0;
	if (wait) sleep(wait);
	struct timespec a, b;
	volatile int s = 0;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++) s += noop_fn((int)i);
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
	printf("calls=%ld ns_per_call=%.1f\n", n, ns / n);
	return 0;
}
