/* The tracing test's HIP client: calls hipInit once and hipMalloc N times (argv[1]) in Debian's
 * real HIP runtime, prints its pid and how many calls it made of each, then exits with status
 * argv[3] (0 when not given; argv[2], when given: sleeps that many seconds first). Without a
 * GPU the calls fail; they still run. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int hipInit(unsigned int flags);
int hipMalloc(void **ptr, size_t size);

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1;
    void *p = NULL;
    long inits = 0, mallocs = 0;
    hipInit(0);
    inits++;
    for (long i = 0; i < n; i++) {
        hipMalloc(&p, 4096);
        mallocs++;
    }
    printf("client pid=%d hipInit=%ld hipMalloc=%ld\n", (int)getpid(), inits, mallocs);
    fflush(stdout);
    if (argc > 2)
        sleep((unsigned)atoi(argv[2]));
    return argc > 3 ? atoi(argv[3]) : 0;
}
