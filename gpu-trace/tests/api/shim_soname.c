/* An interposer that takes the real library's place by name (tests/api_resolve.rs): built
 * with the soname libamdhip64.so.5, preloaded, it satisfies the client's DT_NEEDED itself and
 * dlopens the real runtime by the path in GT_REAL_HIP (RTLD_LOCAL), forwarding hipMalloc to
 * it. Counts its calls and prints them at exit, like shim_next.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static unsigned long calls;
static void *real_lib;

__attribute__((constructor)) static void load_real(void) {
    const char *path = getenv("GT_REAL_HIP");
    if (path)
        real_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static void *real(const char *name) { return real_lib ? dlsym(real_lib, name) : NULL; }

int hipInit(unsigned int flags) {
    int (*f)(unsigned int) = (int (*)(unsigned int))real("hipInit");
    return f ? f(flags) : 1;
}

int hipMalloc(void **ptr, size_t size) {
    int (*f)(void **, size_t) = (int (*)(void **, size_t))real("hipMalloc");
    calls++;
    return f ? f(ptr, size) : 1;
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "shim pid=%d hipMalloc=%lu\n", (int)getpid(), calls);
}
