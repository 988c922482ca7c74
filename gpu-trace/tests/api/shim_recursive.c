/* The seed's broken interposer: exports hipMalloc and looks "the real one" up with
 * RTLD_DEFAULT, which finds this very copy first: every call re-enters itself. A depth guard
 * (not in the seed) makes it give up after 1000 levels so the test's client survives. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

static int depth;

int hipMalloc(void **ptr, size_t size) {
    int (*real)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_DEFAULT, "hipMalloc");
    if (!real || depth >= 1000)
        return 1;
    depth++;
    int ret = real(ptr, size);
    depth--;
    return ret;
}
