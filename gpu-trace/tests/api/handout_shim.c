/* An interposer of HAMi-core's shape: built with -fvisibility=hidden, it exports only dlsym.
 * Its dlsym hands out its own (hidden) cuGetProcAddress_v2 hook; that hook hands out hidden
 * hooks for cuLaunchKernel and (unless built with -DNO_ALLOC_HOOK) cuMemAlloc_v2, each
 * counting its own calls and calling the real function. With -DEXPORT_GETPROC the
 * cuGetProcAddress_v2 hook is exported under that name (the hooks it hands out stay hidden).
 * At exit it prints its own counts: "shim through launch=N alloc=M getproc=K lookups=L". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*getproc_t)(const char *, void **, int, unsigned long long, int *);
typedef void *(*dlsym_t)(void *, const char *);

static dlsym_t real_dlsym;
static getproc_t real_getproc;
static int (*real_launch)(void *);
static int (*real_alloc)(void **, unsigned long);
static long launches, allocs, getprocs, lookups;

static void init(void) {
    if (!real_dlsym) real_dlsym = (dlsym_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (dlsym_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

static int hook_launch(void *f) { launches++; return real_launch(f); }
#ifndef NO_ALLOC_HOOK
static int hook_alloc(void **p, unsigned long n) { allocs++; return real_alloc(p, n); }
#endif

#ifdef EXPORT_GETPROC
#define hook_getproc cuGetProcAddress_v2
__attribute__((visibility("default")))
#else
static
#endif
int hook_getproc(const char *name, void **pfn, int version, unsigned long long flags,
                 int *status) {
    getprocs++;
    int r = real_getproc(name, pfn, version, flags, status);
    if (r) return r;
    if (!strcmp(name, "cuLaunchKernel")) { real_launch = *pfn; *pfn = (void *)hook_launch; }
#ifndef NO_ALLOC_HOOK
    if (!strcmp(name, "cuMemAlloc_v2")) { real_alloc = *pfn; *pfn = (void *)hook_alloc; }
#endif
    return 0;
}

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *name) {
    init();
    lookups++;
    if (!strcmp(name, "cuGetProcAddress_v2")) {
        if (!real_getproc) real_getproc = (getproc_t)real_dlsym(handle, name);
        return real_getproc ? (void *)hook_getproc : 0;
    }
    return real_dlsym(handle, name);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "shim through launch=%ld alloc=%ld getproc=%ld lookups=%ld\n", launches,
            allocs, getprocs, lookups);
}
