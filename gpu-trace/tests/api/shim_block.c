/* An interposer that blocks: its hipDeviceSynchronize waits (in shim_wait, a function of its
 * own, so that the stack names the shim) SHIM_BLOCK_SECONDS seconds (default 30) before
 * forwarding to the next copy with dlsym(RTLD_NEXT, ...). The tracing test's API_STUCK case. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) void shim_wait(void) {
    const char *s = getenv("SHIM_BLOCK_SECONDS");
    sleep(s ? (unsigned)atoi(s) : 30);
}

int hipDeviceSynchronize(void) {
    static int (*real)(void);
    if (!real)
        real = (int (*)(void))dlsym(RTLD_NEXT, "hipDeviceSynchronize");
    shim_wait();
    return real ? real() : 1;
}
