/* The API layer's exactness client (tests/api_exact.rs), linked to the stand-in libcuda.so.1
 * (exact_cuda.c). Scenarios, each on the main thread:
 *   recurse DEPTH TIMES N   TIMES calls of cuMemAlloc_v2 that each re-enter DEPTH deep in all,
 *                           then N cuLaunchKernel
 *   indirect TIMES N        TIMES cuCtxSynchronize (-> cuStreamSynchronize -> cuCtxSynchronize),
 *                           then N cuLaunchKernel
 *   longjmp TIMES N         TIMES cuMemcpyHtoD_v2 left by longjmp, then N cuLaunchKernel
 *   loop N                  says "ready", calls cuLaunchKernel until SIGUSR1, then N
 *                           cuMemAlloc_v2
 *   errors OK FAILED        OK cuLaunchKernel that succeed, FAILED that fail (a grid of 0
 *                           blocks: the library returns 1); prints "failed=FAILED" too
 * It waits for a line on stdin first when GT_WAIT is set (the tracer attached), and prints
 * "calls cuMemAlloc_v2=A cuLaunchKernel=B cuCtxSynchronize=C cuStreamSynchronize=D
 * cuMemcpyHtoD_v2=E" from the library's own counters at the end. */
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long gt_calls(int i);
void gt_recurse(int depth);
void gt_escape(jmp_buf *env);
int cuMemAlloc_v2(void **p, size_t n);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra);
int cuCtxSynchronize(void);
int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n);

static volatile sig_atomic_t stop;
static void on_usr1(int s) { (void)s, stop = 1; }

static void launches(long n) {
    for (long i = 0; i < n; i++)
        cuLaunchKernel(0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 64;
    if (getenv("GT_WAIT")) {
        char line[16];
        if (!fgets(line, sizeof line, stdin))
            return 65;
    }
    void *p;
    if (!strcmp(argv[1], "recurse") && argc == 5) {
        for (long t = 0; t < atol(argv[3]); t++) {
            gt_recurse(atoi(argv[2]));
            cuMemAlloc_v2(&p, 64);
        }
        launches(atol(argv[4]));
    } else if (!strcmp(argv[1], "indirect") && argc == 4) {
        for (long t = 0; t < atol(argv[2]); t++)
            cuCtxSynchronize();
        launches(atol(argv[3]));
    } else if (!strcmp(argv[1], "longjmp") && argc == 4) {
        static jmp_buf env;
        gt_escape(&env);
        for (volatile long t = 0; t < atol(argv[2]); t++)
            if (!setjmp(env))
                cuMemcpyHtoD_v2(0, 0, 0);
        launches(atol(argv[3]));
    } else if (!strcmp(argv[1], "loop") && argc == 3) {
        signal(SIGUSR1, on_usr1);
        printf("ready\n");
        fflush(stdout);
        while (!stop)
            launches(1);
        gt_recurse(1);
        for (long i = 0; i < atol(argv[2]); i++)
            cuMemAlloc_v2(&p, 64);
    } else if (!strcmp(argv[1], "errors") && argc == 4) {
        long failed = 0;
        launches(atol(argv[2]));
        for (long i = 0; i < atol(argv[3]); i++)
            failed += cuLaunchKernel(0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0) != 0;
        printf("failed=%ld\n", failed);
    } else {
        return 64;
    }
    printf("calls cuMemAlloc_v2=%ld cuLaunchKernel=%ld cuCtxSynchronize=%ld "
           "cuStreamSynchronize=%ld cuMemcpyHtoD_v2=%ld\n",
           gt_calls(0), gt_calls(1), gt_calls(2), gt_calls(3), gt_calls(4));
    return 0;
}
