/* A GPU-sharing interposer of HAMi-core's shape, for the GPU host (examples/gpu-host-interposer.sh):
 * built with -fvisibility=hidden, it exports only dlsym. When the CUDA runtime looks
 * cuGetProcAddress_v2 (or cuGetProcAddress) up with dlsym, it hands out its own hidden hook;
 * that hook asks the driver and hands out hidden hooks for cuLaunchKernel and cuMemAlloc_v2,
 * which count their calls and call the driver's functions. SHIM_OFF=1 in the environment: its
 * dlsym passes everything through (loaded, overriding dlsym, but on no call's path). At exit it
 * prints its own counts on stderr: "shim launch=N alloc=M getproc=K lookups=L".
 *   gcc -shared -fPIC -fvisibility=hidden -O1 -o libhami_like.so hami_like_shim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef CUresult (*getproc_t)(const char *, void **, int, uint64_t, void *);
typedef CUresult (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void *, void **, void **);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);

static void *(*real_dlsym)(void *, const char *);
static getproc_t real_getproc;
static launch_t real_launch;
static alloc_t real_alloc;
static long launches, allocs, getprocs, lookups;
static int off = -1;

static void init(void) {
    if (!real_dlsym) real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (off < 0) off = getenv("SHIM_OFF") != NULL;
}

__attribute__((noinline)) static CUresult hook_launch(void *f, unsigned gx, unsigned gy,
                                                      unsigned gz, unsigned bx, unsigned by,
                                                      unsigned bz, unsigned shmem, void *stream,
                                                      void **params, void **extra) {
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    return real_launch(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

__attribute__((noinline)) static CUresult hook_alloc(CUdeviceptr *p, size_t n) {
    __atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
    return real_alloc(p, n);
}

__attribute__((noinline)) static CUresult hook_getproc(const char *name, void **pfn, int version,
                                                       uint64_t flags, void *status) {
    __atomic_add_fetch(&getprocs, 1, __ATOMIC_RELAXED);
    CUresult r = real_getproc(name, pfn, version, flags, status);
    if (r || !*pfn) return r;
    /* The runtime asks for the lookup itself too: it stays on the hook (as HAMi-core does). */
    if (!strcmp(name, "cuGetProcAddress")) { *pfn = (void *)hook_getproc; }
    if (!strcmp(name, "cuLaunchKernel")) { real_launch = (launch_t)*pfn; *pfn = (void *)hook_launch; }
    if (!strcmp(name, "cuMemAlloc")) { real_alloc = (alloc_t)*pfn; *pfn = (void *)hook_alloc; }
    return r;
}

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
    init();
    __atomic_add_fetch(&lookups, 1, __ATOMIC_RELAXED);
    if (!off && !strcmp(name, "cuGetProcAddress_v2")) {
        void *real = real_dlsym(handle, name);
        if (!real) return NULL;
        if (!real_getproc) real_getproc = (getproc_t)real;
        return (void *)hook_getproc;
    }
    return real_dlsym(handle, name);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "shim launch=%ld alloc=%ld getproc=%ld lookups=%ld\n", launches, allocs,
            getprocs, lookups);
}
