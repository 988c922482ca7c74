/*
 * rm_storm: an unprivileged process's flood of RM calls on /dev/nvidiactl, the load a stop must
 * cut through (issue 26: "stop means stop under a storm"). Each thread sends GPFIFO_SCHEDULE
 * controls on handles that do not exist, as fast as it can, for at most SECONDS: the driver
 * refuses each (an RM status in the parameter block; the ioctl itself returns 0), and gpu-trace
 * reports each as a refused SCHEDULE, so the ring buffer fills faster than a reader empties it.
 *
 *   cc -O2 -Wall -pthread -o rm_storm examples/rm_storm.c && ./rm_storm THREADS SECONDS [DEVICE]
 *
 * Prints "rm_storm: N calls" at the end. Layout: NVOS54_PARAMETERS (nvos.h, 580), escape
 * NV_ESC_RM_CONTROL 0x2A (nv_escape.h), NVA06C_CTRL_CMD_GPFIFO_SCHEDULE 0xa06c0101 (ctrla06c.h).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define NV_IOWR(nr, size) (0xC0000000u | ((uint32_t)(size) << 16) | ('F' << 8) | (nr))

typedef struct {
    uint32_t hClient, hObject, cmd, flags;
    uint64_t params;
    uint32_t paramsSize, status;
} Nvos54;

static int fd;
static double seconds;
static uint64_t totals[256];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *storm(void *arg) {
    long i = (long)arg;
    uint8_t sched[8] = {1, 0, 0, 0, 0, 0, 0, 0}; /* bEnable = 1 */
    Nvos54 p = {0xC1D00000u + (uint32_t)i, 0x5C000100u + (uint32_t)i, 0xa06c0101u, 0,
                (uint64_t)(uintptr_t)sched, sizeof sched, 0};
    double until = now() + seconds;
    uint64_t n = 0;
    while (now() < until) {
        for (int k = 0; k < 1000; k++) {
            p.status = 0;
            ioctl(fd, NV_IOWR(0x2A, sizeof p), &p);
            n++;
        }
    }
    totals[i] = n;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    seconds = argc > 2 ? atof(argv[2]) : 10;
    const char *dev = argc > 3 ? argv[3] : "/dev/nvidiactl";
    if (threads < 1 || threads > 256) threads = 4;
    fd = open(dev, O_RDWR);
    if (fd < 0) { perror(dev); return 1; }
    pthread_t t[256];
    for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, storm, (void *)i);
    uint64_t total = 0;
    for (long i = 0; i < threads; i++) { pthread_join(t[i], NULL); total += totals[i]; }
    printf("rm_storm: %llu calls\n", (unsigned long long)total);
    return 0;
}
