/* The client of tests/api_join.rs: prints its pid, waits for a line on stdin (the tracer has
 * attached), then makes one driver call in cuInit, one in cuCtxCreate_v4 inside cudaMalloc,
 * and one outside any API call (TSG handles 0x5EED0A01, 0x5EED0A02, 0x5EED0A03). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

int cuInit(unsigned flags);
int cudaMalloc(void **ptr, size_t size);
int gt_schedule(uint32_t object);

int main(void) {
    char line[16];
    void *p;
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    cuInit(0);
    cudaMalloc(&p, 64);
    gt_schedule(0x5EED0A03u);
    printf("done\n");
    fflush(stdout);
    return 0;
}
