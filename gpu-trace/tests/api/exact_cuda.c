/* A stand-in libcuda.so.1 for the API layer's exactness (tests/api_exact.rs): functions that
 * recurse the way broken interposers do, longjmp out of a call, or just return. Each counts
 * its own entries in gt_calls(), the oracle the test compares gpu-trace's counts with. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <setjmp.h>
#include <stddef.h>

static long entries[5];
static int depth_left;
static jmp_buf *escape;

/* Not API symbols: the client's view of the library. */
long gt_calls(int i) { return entries[i]; }
void gt_recurse(int depth) { depth_left = depth; }
void gt_escape(jmp_buf *env) { escape = env; }

/* The XSched bug's shape: looks "the real one" up with RTLD_DEFAULT, finds itself and
 * re-enters, until the depth set by gt_recurse is used up (1: no recursion). */
int cuMemAlloc_v2(void **p, size_t n) {
    entries[0]++;
    int (*again)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    if (--depth_left > 0 && again)
        again(p, n);
    *p = 0;
    return 0;
}

/* Fails (CUDA_ERROR_INVALID_VALUE, 1) for a grid of 0 blocks, as the real one does. */
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
    (void)stream, (void)params, (void)extra;
    entries[1]++;
    return gx == 0 ? 1 : 0;
}

int cuStreamSynchronize(void *stream);

/* Indirect recursion: cuCtxSynchronize -> cuStreamSynchronize -> cuCtxSynchronize (once). */
int cuCtxSynchronize(void) {
    entries[2]++;
    static int inside;
    if (!inside) {
        inside = 1;
        cuStreamSynchronize(0);
        inside = 0;
    }
    return 0;
}

int cuStreamSynchronize(void *stream) {
    (void)stream;
    entries[3]++;
    static int inside;
    if (!inside) {
        inside = 1;
        cuCtxSynchronize();
        inside = 0;
    }
    return 0;
}

/* Leaves by longjmp to the client's gt_escape buffer: the call never returns. */
int cuMemcpyHtoD_v2(unsigned long long dst, const void *src, size_t n) {
    (void)dst, (void)src, (void)n;
    entries[4]++;
    if (escape)
        longjmp(*escape, 1);
    return 0;
}
