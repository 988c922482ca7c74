/* Loads the HIP runtime late: dlopen(argv[1]) after one second, then waits argv[2] seconds
 * (for gpu-trace's rescan), then calls hipInit N times (argv[3]) and prints its pid and count. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    sleep(1);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 3;
    }
    int (*init)(unsigned int) = (int (*)(unsigned int))dlsym(h, "hipInit");
    if (!init)
        return 4;
    sleep((unsigned)atoi(argv[2]));
    long n = atol(argv[3]), calls = 0;
    for (long i = 0; i < n; i++) {
        init(0);
        calls++;
    }
    printf("client pid=%d hipInit=%ld\n", (int)getpid(), calls);
    fflush(stdout);
    return 0;
}
