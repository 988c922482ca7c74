/* A stand-in for libcuda.so.1 that hands out its own entry points the way CUDA 12+ runtimes
 * find them: cuGetProcAddress_v2(name, &pfn, version, flags, status). */
#include <string.h>

int cuInit(unsigned flags) { (void)flags; return 0; }
int cuLaunchKernel(void *f) { (void)f; return 0; }
int cuMemAlloc_v2(void **p, unsigned long n) { (void)n; *p = 0; return 0; }

int cuGetProcAddress_v2(const char *name, void **pfn, int version, unsigned long long flags,
                        int *status) {
    (void)version; (void)flags;
    *pfn = 0;
    if (!strcmp(name, "cuInit")) *pfn = (void *)cuInit;
    if (!strcmp(name, "cuLaunchKernel")) *pfn = (void *)cuLaunchKernel;
    if (!strcmp(name, "cuMemAlloc_v2")) *pfn = (void *)cuMemAlloc_v2;
    if (!strcmp(name, "cuGetProcAddress_v2")) *pfn = (void *)cuGetProcAddress_v2;
    if (status) *status = *pfn ? 0 : 1;
    return *pfn ? 0 : 500;
}
