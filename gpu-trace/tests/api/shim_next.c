/* A correct interposer: exports hipMalloc, counts the calls and forwards them to the next copy
 * with dlsym(RTLD_NEXT, ...), the real HIP runtime when preloaded; prints its count at exit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

static unsigned long calls;

int hipMalloc(void **ptr, size_t size) {
    static int (*real)(void **, size_t);
    if (!real)
        real = (int (*)(void **, size_t))dlsym(RTLD_NEXT, "hipMalloc");
    calls++;
    return real ? real(ptr, size) : 1;
}

/* Its own count, at exit (the tracing test compares gpu-trace's count with it). */
__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "shim pid=%d hipMalloc=%lu\n", (int)getpid(), calls);
}
