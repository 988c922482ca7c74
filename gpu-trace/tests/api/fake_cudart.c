/* A stand-in libcudart.so.12 (tests/api_join.rs): cudaMalloc creates a context through the
 * stand-in libcuda.so.1, as the real runtime does on its first call. */
#include <stddef.h>

int cuCtxCreate_v4(void **ctx, void *params, unsigned flags, int dev);

int cudaMalloc(void **ptr, size_t size) {
    void *ctx;
    (void)size;
    *ptr = 0;
    return cuCtxCreate_v4(&ctx, 0, 0, 0);
}
