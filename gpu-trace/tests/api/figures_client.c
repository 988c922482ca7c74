/* The client of tests/api_figures.rs, over tests/api_join.rs's stand-in libcuda.so.1 and
 * libcudart.so.12: prints its pid, waits for a line on stdin (the tracer has attached), then
 * calls cuInit argv[1] times and cudaMalloc argv[2] times (each of which calls cuCtxCreate_v4
 * once), counting its own calls, prints the counts and waits for a second line before it exits
 * (so that its process is still there while the figures are read), or (argv[3] "exit") exits at
 * once. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cuInit(unsigned flags);
int cudaMalloc(void **ptr, size_t size);

int main(int argc, char **argv) {
    char line[16];
    void *p;
    long inits = 0, mallocs = 0;
    long n_init = argc > 1 ? atol(argv[1]) : 1, n_malloc = argc > 2 ? atol(argv[2]) : 1;
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    for (long i = 0; i < n_init; i++) {
        cuInit(0);
        inits++;
    }
    for (long i = 0; i < n_malloc; i++) {
        cudaMalloc(&p, 64);
        mallocs++;
    }
    printf("cuInit=%ld cudaMalloc=%ld\n", inits, mallocs);
    fflush(stdout);
    if (argc > 3 && strcmp(argv[3], "exit") == 0)
        return 0;
    if (!fgets(line, sizeof line, stdin))
        return 0;
    return 0;
}
