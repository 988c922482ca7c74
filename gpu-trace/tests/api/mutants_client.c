/* The client of tests/api_mutants.rs, linked to the stand-in libcuda.so.1 (mutants_cuda.c).
 * It prints "client pid=P" first, then runs one scenario:
 *   depth THREADS DEPTH   THREADS threads, each prints "thread tid=T" and makes one
 *                         cuMemAlloc_v2 call that recurses DEPTH deep in all
 *   stuck                 one cuCtxSynchronize, inside which cuStreamSynchronize waits for a
 *                         line on stdin (the test sends it once it has seen what it waits for)
 * and prints "calls cuMemAlloc_v2=A cuCtxSynchronize=B cuStreamSynchronize=C" from the
 * library's own counters at the end. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long gt_calls(int i);
void gt_recurse(int depth);
int cuMemAlloc_v2(void **p, size_t n);
int cuCtxSynchronize(void);

static int depth;

static void *recurse(void *arg) {
    void *p;
    (void)arg;
    printf("thread tid=%d\n", (int)gettid());
    fflush(stdout);
    gt_recurse(depth);
    cuMemAlloc_v2(&p, 64);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 64;
    printf("client pid=%d\n", (int)getpid());
    fflush(stdout);
    if (!strcmp(argv[1], "depth") && argc == 4) {
        int n = atoi(argv[2]);
        pthread_t t[64];
        if (n < 1 || n > 64)
            return 64;
        depth = atoi(argv[3]);
        for (int i = 0; i < n; i++)
            if (pthread_create(&t[i], NULL, recurse, NULL))
                return 70;
        for (int i = 0; i < n; i++)
            pthread_join(t[i], NULL);
    } else if (!strcmp(argv[1], "stuck") && argc == 2) {
        cuCtxSynchronize();
    } else {
        return 64;
    }
    printf("calls cuMemAlloc_v2=%ld cuCtxSynchronize=%ld cuStreamSynchronize=%ld\n", gt_calls(0),
           gt_calls(1), gt_calls(2));
    fflush(stdout);
    return 0;
}
