/* A client that finds its entry points the way CUDA runtimes do: dlopen("libcuda.so.1"),
 * dlsym(h, "cuGetProcAddress_v2"), then cuGetProcAddress_v2 for each function ("runtime"),
 * or that calls the functions it links against directly ("direct": an interposer that only
 * hands out hooks is bypassed). Calls cuLaunchKernel 1000 times and cuMemAlloc_v2 100 times
 * and prints its own counts: "client launch=1000 alloc=100". */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int cuLaunchKernel(void *f);
int cuMemAlloc_v2(void **p, unsigned long n);
typedef int (*getproc_t)(const char *, void **, int, unsigned long long, int *);

int main(int argc, char **argv) {
    int (*launch)(void *) = cuLaunchKernel;
    int (*alloc)(void **, unsigned long) = cuMemAlloc_v2;
    if (argc > 1 && !strcmp(argv[1], "runtime")) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW);
        getproc_t getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
        if (!getproc || getproc("cuLaunchKernel", (void **)&launch, 12000, 0, 0) ||
            getproc("cuMemAlloc_v2", (void **)&alloc, 12000, 0, 0)) {
            fprintf(stderr, "lookup failed\n");
            return 1;
        }
    }
    long l = 0, a = 0;
    for (int i = 0; i < 1000; i++) l += launch(0) == 0;
    for (int i = 0; i < 100; i++) { void *p; a += alloc(&p, 64) == 0; }
    /* stderr, beside the shim's line: the tracer's JSON lines share stdout, and a line
       written there while a long write of the tracer is blocked on a full pipe lands inside
       one of them. */
    fprintf(stderr, "client launch=%ld alloc=%ld\n", l, a);
    return 0;
}
