/* Calls hipInit, then hipDeviceSynchronize in Debian's real HIP runtime (a preloaded shim may
 * take the call first), printing its pid before the synchronize. */
#include <stdio.h>
#include <unistd.h>

int hipInit(unsigned int flags);
int hipDeviceSynchronize(void);

int main(void) {
    hipInit(0);
    printf("client pid=%d\n", (int)getpid());
    fflush(stdout);
    return hipDeviceSynchronize() == 0 ? 0 : 1;
}
