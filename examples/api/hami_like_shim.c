/* A HAMi-core-style CUDA driver interposer for the GPU host (issue 28): preloaded, it exports
 * cuLaunchKernel, cuLaunchKernelEx, cuMemAlloc_v2 and cuGetProcAddress_v2, counts each call
 * itself and forwards to libcuda's. CUDA 12+/13 runtimes fetch driver entry points through
 * cuGetProcAddress (reached through dlsym on their own libcuda handle), so, as HAMi-core does,
 * it also overrides dlsym and hands out its own wrappers in place of libcuda's. At exit it
 * appends its counts to the file $HAMI_COUNTS: "pid=P cuLaunchKernel=N cuLaunchKernelEx=N
 * cuMemAlloc_v2=N cuGetProcAddress_v2=N". gpu-trace's counts for this library must equal them.
 *
 *   cc -shared -fPIC -O2 -o hami_like_shim.so hami_like_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef CUresult (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, void *, void **, void **);
typedef CUresult (*launchex_t)(const void *, void *, void **, void **);
typedef CUresult (*memalloc_t)(unsigned long long *, size_t);
typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long, void *);
typedef void *(*dlsym_t)(void *, const char *);

static atomic_ulong n_launch, n_launchex, n_memalloc, n_gpa;
static launch_t real_launch;
static launchex_t real_launchex;
static memalloc_t real_memalloc;
static gpa_t real_gpa;

static dlsym_t real_dlsym(void) {
	static dlsym_t f;
	if (!f) f = (dlsym_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!f) f = (dlsym_t)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	return f;
}

static void *real_of(const char *name) {
	static void *h;
	if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	return h ? real_dlsym()(h, name) : NULL;
}

CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
	atomic_fetch_add(&n_launch, 1);
	if (!real_launch) real_launch = (launch_t)real_of("cuLaunchKernel");
	return real_launch(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
	atomic_fetch_add(&n_launchex, 1);
	if (!real_launchex) real_launchex = (launchex_t)real_of("cuLaunchKernelEx");
	return real_launchex(config, f, params, extra);
}

CUresult cuMemAlloc_v2(unsigned long long *dptr, size_t size) {
	atomic_fetch_add(&n_memalloc, 1);
	if (!real_memalloc) real_memalloc = (memalloc_t)real_of("cuMemAlloc_v2");
	return real_memalloc(dptr, size);
}

CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, void *);

/* Swaps libcuda's entry point for this shim's where it is one we count, and cuGetProcAddress
 * itself (a runtime asks cuGetProcAddress for "cuGetProcAddress" and calls what it gets from
 * then on; CUDA 12+ callers get the 5-argument _v2). */
static void *swap(const char *name, void *p, int ver) {
	if (!name || !p) return p;
	if ((!strcmp(name, "cuGetProcAddress") && ver >= 12000) || !strcmp(name, "cuGetProcAddress_v2")) {
		real_gpa = (gpa_t)p;
		return (void *)cuGetProcAddress_v2;
	}
	if (!strcmp(name, "cuLaunchKernel")) { real_launch = (launch_t)p; return (void *)cuLaunchKernel; }
	if (!strcmp(name, "cuLaunchKernelEx")) { real_launchex = (launchex_t)p; return (void *)cuLaunchKernelEx; }
	if (!strcmp(name, "cuMemAlloc_v2")) { real_memalloc = (memalloc_t)p; return (void *)cuMemAlloc_v2; }
	return p;
}

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags,
                             void *status) {
	atomic_fetch_add(&n_gpa, 1);
	if (!real_gpa) real_gpa = (gpa_t)real_of("cuGetProcAddress_v2");
	CUresult r = real_gpa(sym, pfn, ver, flags, status);
	if (r == 0 && pfn && *pfn && sym) {
		/* cuGetProcAddress takes base names: "cuMemAlloc" at version >= 3020 is _v2. */
		const char *name = (!strcmp(sym, "cuMemAlloc") && ver >= 3020) ? "cuMemAlloc_v2" : sym;
		*pfn = swap(name, *pfn, ver);
	}
	return r;
}

void *dlsym(void *handle, const char *name) {
	return swap(name, real_dlsym()(handle, name), 0);
}

__attribute__((destructor)) static void report(void) {
	const char *path = getenv("HAMI_COUNTS");
	FILE *f = path ? fopen(path, "a") : NULL;
	if (!f) return;
	fprintf(f, "pid=%d cuLaunchKernel=%lu cuLaunchKernelEx=%lu cuMemAlloc_v2=%lu cuGetProcAddress_v2=%lu\n",
	        getpid(), atomic_load(&n_launch), atomic_load(&n_launchex), atomic_load(&n_memalloc),
	        atomic_load(&n_gpa));
	fclose(f);
}
