/* A stand-in libamdhip64.so.5 for tests/api_amd.rs: hipStreamCreate issues a KFD-shaped
 * CREATE_QUEUE (AMDKFD_IOC_CREATE_QUEUE, the 96-byte argument struct) on the device named by
 * GT_KFD_DEVICE (the test watches /dev/null as if it were /dev/kfd: the call returns ENOTTY,
 * so gpu-trace reports a refused SCHEDULE). Returns 0 (hipSuccess) either way. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define AMDKFD_IOC_CREATE_QUEUE 0xC0604B02u

int hipStreamCreate(void **stream) {
    const char *dev = getenv("GT_KFD_DEVICE");
    uint8_t args[96];
    int fd = open(dev ? dev : "/dev/null", O_RDWR);
    if (fd < 0)
        return 1;
    memset(args, 0, sizeof args);
    ioctl(fd, AMDKFD_IOC_CREATE_QUEUE, args);
    close(fd);
    if (stream)
        *stream = 0;
    return 0;
}
