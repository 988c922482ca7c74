/* The command of tests/api_main_launch.rs: run by `gpu-trace --api -- …`, it makes its calls
 * at once (no waiting for the tracer: a probe attached after its exec would miss them), after
 * sleeping argv[1] seconds when given (a child of the command, attached at a rescan). One
 * driver call in cuInit, one in cuCtxCreate_v4 inside cudaMalloc, one outside any API call
 * (TSG handles 0x5EED0A01, 0x5EED0A02, 0x5EED0A03). Prints nothing: gpu-trace's JSON shares
 * its standard output. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

int cuInit(unsigned flags);
int cudaMalloc(void **ptr, size_t size);
int gt_schedule(uint32_t object);

int main(int argc, char **argv) {
    void *p;
    if (argc > 1)
        sleep((unsigned)atoi(argv[1]));
    cuInit(0);
    cudaMalloc(&p, 64);
    gt_schedule(0x5EED0A03u);
    return 0;
}
