/* The command of tests/api_main_launch.rs: run by `gpu-trace --api -- …`, it makes its calls
 * at once (no waiting for the tracer: a probe attached after its exec would miss them). With
 * argv[1] (a child of the command, attached at a rescan), it first waits, up to 30 s, until
 * the file argv[1] exists: the test creates it once the tracer holds every probe of this
 * process (an entry and a return probe per symbol: watching for the int3 over a function's
 * first byte sees the first of the two, and a call between them left its frame open). One
 * driver call in cuInit, one in cuCtxCreate_v4 inside cudaMalloc, one outside any API call
 * (TSG handles 0x5EED0A01, 0x5EED0A02, 0x5EED0A03). Prints nothing: gpu-trace's JSON shares
 * its standard output. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

int cuInit(unsigned flags);
int cuCtxCreate_v4(void **ctx, void *params, unsigned flags, int dev);
int cudaMalloc(void **ptr, size_t size);
int gt_schedule(uint32_t object);

int main(int argc, char **argv) {
    void *p;
    if (argc > 1) {
        /* 10 ms steps */
        for (long waited = 0; waited < 3000 && access(argv[1], F_OK) != 0; waited++)
            usleep(10000);
    }
    cuInit(0);
    cudaMalloc(&p, 64);
    gt_schedule(0x5EED0A03u);
    return 0;
}
