/* The command of tests/api_main_launch.rs: run by `gpu-trace --api -- …`, it makes its calls
 * at once (no waiting for the tracer: a probe attached after its exec would miss them). With
 * argv[1] (a child of the command, attached at a rescan), it first waits, up to that many
 * seconds, until the probes are in: on x86-64 a uprobe is an int3 (0xCC) written over the
 * function's first byte in this process's copy of the library, so it watches cuInit,
 * cuCtxCreate_v4 and cudaMalloc for it; elsewhere it sleeps that long. One driver call in
 * cuInit, one in cuCtxCreate_v4 inside cudaMalloc, one outside any API call (TSG handles
 * 0x5EED0A01, 0x5EED0A02, 0x5EED0A03). Prints nothing: gpu-trace's JSON shares its standard
 * output. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

int cuInit(unsigned flags);
int cuCtxCreate_v4(void **ctx, void *params, unsigned flags, int dev);
int cudaMalloc(void **ptr, size_t size);
int gt_schedule(uint32_t object);

static int probed(void) {
#if defined(__x86_64__)
    const volatile unsigned char *f[] = {(const void *)cuInit, (const void *)cuCtxCreate_v4,
                                         (const void *)cudaMalloc};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (*f[i] != 0xCC)
            return 0;
    return 1;
#else
    return 0;
#endif
}

int main(int argc, char **argv) {
    void *p;
    if (argc > 1) {
        /* 10 ms steps */
        for (long waited = 0, limit = atol(argv[1]) * 100; waited < limit && !probed(); waited++)
            usleep(10000);
    }
    cuInit(0);
    cudaMalloc(&p, 64);
    gt_schedule(0x5EED0A03u);
    return 0;
}
