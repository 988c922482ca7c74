/* A stand-in libcuda.so.1 for the driver events' tie to the API layer (tests/api_join.rs):
 * its cu* functions issue an RM-shaped GPFIFO_SCHEDULE control (NVOS54, bEnable=1) of their
 * own TSG handle on /dev/full, the device the test watches, as the real libcuda issues RM
 * ioctls on /dev/nvidia*. The ioctl fails there; the tracer reports the SCHEDULE anyway. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define CLIENT 0x5EED0A00u

struct nvos54 {
    uint32_t h_client, h_object, cmd, flags;
    uint64_t params;
    uint32_t params_size, status;
};

/* Not an API symbol: the client calls it for a driver call outside any API call. */
int gt_schedule(uint32_t object) {
    static int fd = -1;
    unsigned char enable[3] = {1, 0, 0};
    struct nvos54 b = {CLIENT, object, 0xA06C0101u, 0, (uint64_t)(uintptr_t)enable, 3, 0};
    if (fd < 0)
        fd = open("/dev/full", O_RDWR);
    return ioctl(fd, 0xC020462Au, &b);
}

#ifdef RECURSE
/* Built with -DRECURSE=N (tests/api_join.rs): the seed's broken interposer in this library,
 * cuInit looks "the real one" up with RTLD_DEFAULT, finds itself and re-enters, N levels
 * deep in all (a counter ends it, so the client survives). */
static int depth;
#endif

int cuInit(unsigned flags) {
#ifdef RECURSE
    int (*again)(unsigned) = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "cuInit");
    if (again && ++depth < RECURSE)
        again(flags);
#else
    (void)flags;
#endif
    gt_schedule(0x5EED0A01u);
    return 0;
}

int cuCtxCreate_v4(void **ctx, void *params, unsigned flags, int dev) {
    (void)params, (void)flags, (void)dev;
    *ctx = 0;
    gt_schedule(0x5EED0A02u);
    return 0;
}
