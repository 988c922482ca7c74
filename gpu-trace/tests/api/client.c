/* The test's HIP client: calls hipInit and hipMalloc in Debian's real HIP runtime (linked with
 * -l:libamdhip64.so.5; the prototypes are declared here, no HIP headers needed), then sleeps so
 * that gpu-trace can inspect it. Without a GPU the calls fail; they still go through whichever
 * copy of each symbol the dynamic linker bound. Prints "ready" once the calls are made. */
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

int hipInit(unsigned int flags);
int hipMalloc(void **ptr, size_t size);

int main(void) {
    void *p = NULL;
    int init = hipInit(0);
    int malloc_ret = hipMalloc(&p, 4096);
    printf("ready hipInit=%d hipMalloc=%d\n", init, malloc_ret);
    fflush(stdout);
    sleep(60);
    return 0;
}
