/* The client of tests/api_join.rs's per-call test: prints its pid, waits for a line on stdin
 * (the tracer has attached), then calls cuInit and cudaMalloc (whose stand-in calls
 * cuCtxCreate_v4) argv[1] times each, counting its own calls, and prints those counts
 * (`calls cuInit=N cudaMalloc=M`) and `done`. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int cuInit(unsigned flags);
int cudaMalloc(void **ptr, size_t size);

int main(int argc, char **argv) {
    char line[16];
    void *p;
    int n = argc > 1 ? atoi(argv[1]) : 1, inits = 0, mallocs = 0;
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    for (int i = 0; i < n; i++) {
        cuInit(0);
        inits++;
        cudaMalloc(&p, 64);
        mallocs++;
    }
    printf("calls cuInit=%d cudaMalloc=%d\ndone\n", inits, mallocs);
    fflush(stdout);
    return 0;
}
