/*
 * rm_tsg_sched: allocate a channel group (TSG) of its own through the NVIDIA RM ioctls, the way
 * CUDA does it, and send it every scheduling control gpu-trace reports as SCHED_UPDATE:
 * interleave changes, a timeslice change, an enable, a disable, a re-enable, two preemptions
 * (one waiting, one with a manual timeout) and an invalid interleave level. Then free it all.
 *
 *   cc -O2 -Wall -o rm_tsg_sched examples/rm_tsg_sched.c && ./rm_tsg_sched [DEVICE_INDEX]
 *
 * The TSG gets no channels (a channel needs GPFIFO and USERD memory and a VA space), so RM may
 * refuse what needs a channel (a schedule, a preemption): that is part of the test, since a
 * refused request must be printed too (allowed=no status=0x...). Each step prints one line:
 *
 *   step <name> handle=0x<TSG> cmd=0x<cmd> ret=<ioctl return> errno=<errno> status=0x<RM status>
 *
 * which examples/sched_check.py compares with what gpu-trace printed. Layouts: the RM parameter
 * blocks (NVOS00/21/54) and control parameters of open-gpu-kernel-modules 580 (nvos.h,
 * ctrla06c.h, cl0080.h, nv-ioctl.h); nothing here is specific to one GPU.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define NV_IOWR(nr, size) (0xC0000000u | ((uint32_t)(size) << 16) | ('F' << 8) | (nr))

/* Escapes (nv_escape.h, nv-ioctl-numbers.h). */
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define NV_ESC_REGISTER_FD 201
#define NV_ESC_CHECK_VERSION_STR 210

/* Classes. */
#define NV01_ROOT_CLIENT 0x41
#define NV01_DEVICE_0 0x80
#define KEPLER_CHANNEL_GROUP_A 0xA06C
#define NV2080_ENGINE_TYPE_GR0 1

/* NVA06C controls (ctrla06c.h). */
#define NVA06C_CTRL_CMD_GPFIFO_SCHEDULE 0xA06C0101u
#define NVA06C_CTRL_CMD_SET_TIMESLICE 0xA06C0103u
#define NVA06C_CTRL_CMD_PREEMPT 0xA06C0105u
#define NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL 0xA06C0107u

typedef struct { /* NVOS00_PARAMETERS, 16 bytes */
    uint32_t hRoot, hObjectParent, hObjectOld, status;
} nvos00_t;

typedef struct { /* NVOS21_PARAMETERS, 32 bytes */
    uint32_t hRoot, hObjectParent, hObjectNew, hClass;
    uint64_t pAllocParms;
    uint32_t paramsSize, status;
} nvos21_t;

typedef struct { /* NVOS54_PARAMETERS, 32 bytes */
    uint32_t hClient, hObject, cmd, flags;
    uint64_t params;
    uint32_t paramsSize, status;
} nvos54_t;

typedef struct { /* nv_ioctl_rm_api_version_t, 72 bytes */
    uint32_t cmd, reply;
    char versionString[64];
} rm_api_version_t;

typedef struct { /* NV0080_ALLOC_PARAMETERS, 56 bytes */
    uint32_t deviceId, hClientShare, hTargetClient, hTargetDevice, flags, pad0;
    uint64_t vaSpaceSize, vaStartInternal, vaLimitInternal;
    uint32_t vaMode, pad1;
} nv0080_alloc_t;

typedef struct { /* NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, 20 bytes */
    uint32_t hObjectError, hObjectEccError, hVASpace, engineType;
    uint8_t bIsCallingContextVgpuPlugin, pad[3];
} tsg_alloc_t;

_Static_assert(sizeof(nvos00_t) == 16, "NVOS00");
_Static_assert(sizeof(nvos21_t) == 32, "NVOS21");
_Static_assert(sizeof(nvos54_t) == 32, "NVOS54");
_Static_assert(sizeof(rm_api_version_t) == 72, "rm api version");
_Static_assert(sizeof(nv0080_alloc_t) == 56, "NV0080");
_Static_assert(sizeof(tsg_alloc_t) == 20, "TSG alloc");

static int ctl = -1;

static uint32_t rm_alloc(uint32_t root, uint32_t parent, uint32_t cls, void *params,
                         uint32_t size, const char *what)
{
    nvos21_t p = {.hRoot = root, .hObjectParent = parent, .hClass = cls,
                  .pAllocParms = (uint64_t)(uintptr_t)params, .paramsSize = size};
    int ret = ioctl(ctl, NV_IOWR(NV_ESC_RM_ALLOC, sizeof p), &p);
    printf("alloc %s class=0x%x handle=0x%08x ret=%d errno=%d status=0x%08x\n", what, cls,
           p.hObjectNew, ret, ret ? errno : 0, p.status);
    return (ret == 0 && p.status == 0) ? p.hObjectNew : 0;
}

static void control(uint32_t client, uint32_t object, uint32_t cmd, void *params, uint32_t size,
                    const char *name)
{
    nvos54_t p = {.hClient = client, .hObject = object, .cmd = cmd,
                  .params = (uint64_t)(uintptr_t)params, .paramsSize = size};
    int ret = ioctl(ctl, NV_IOWR(NV_ESC_RM_CONTROL, sizeof p), &p);
    printf("step %s handle=0x%08x cmd=0x%08x ret=%d errno=%d status=0x%08x\n", name, object, cmd,
           ret, ret ? errno : 0, p.status);
    fflush(stdout);
    usleep(20000); /* keeps the steps apart in time: the order is then obvious in the output */
}

static void schedule(uint32_t client, uint32_t tsg, int enable, const char *name)
{
    uint8_t p[3] = {(uint8_t)enable, 0, 0}; /* bEnable, bSkipSubmit, bSkipEnable */
    control(client, tsg, NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, p, sizeof p, name);
}

static void interleave(uint32_t client, uint32_t tsg, uint32_t level, const char *name)
{
    control(client, tsg, NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL, &level, sizeof level, name);
}

static void preempt(uint32_t client, uint32_t tsg, int wait, int manual, uint32_t timeout_us,
                    const char *name)
{
    struct { uint8_t bWait, bManualTimeout, pad[2]; uint32_t timeoutUs; } p = {
        (uint8_t)wait, (uint8_t)manual, {0, 0}, timeout_us};
    _Static_assert(sizeof p == 8, "NVA06C_CTRL_PREEMPT_PARAMS");
    control(client, tsg, NVA06C_CTRL_CMD_PREEMPT, &p, sizeof p, name);
}

int main(int argc, char **argv)
{
    unsigned device_index = argc > 1 ? (unsigned)atoi(argv[1]) : 0;
    char dev[32];
    snprintf(dev, sizeof dev, "/dev/nvidia%u", device_index);
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* RM_CTL=/dev/null: a dry run off the GPU host (every ioctl fails with ENOTTY; with
     * `gpu-trace --watch-device /dev/null` the requests are still traced, all refused). */
    const char *ctl_path = getenv("RM_CTL") ? getenv("RM_CTL") : "/dev/nvidiactl";
    ctl = open(ctl_path, O_RDWR | O_CLOEXEC);
    if (ctl < 0) {
        fprintf(stderr, "open %s: %s\n", ctl_path, strerror(errno));
        return 1;
    }
    /* Keeps the GPU initialised while we use it, as CUDA does. */
    int devfd = open(dev, O_RDWR | O_CLOEXEC);
    if (devfd < 0)
        fprintf(stderr, "open %s: %s (going on)\n", dev, strerror(errno));
    else if (ioctl(devfd, NV_IOWR(NV_ESC_REGISTER_FD, sizeof(int)), &ctl) != 0)
        fprintf(stderr, "REGISTER_FD: %s (going on)\n", strerror(errno));

    /* The driver's version string (QUERY), then the strict check CUDA does with it. */
    rm_api_version_t v = {.cmd = '2'};
    if (ioctl(ctl, NV_IOWR(NV_ESC_CHECK_VERSION_STR, sizeof v), &v) == 0) {
        v.cmd = 0;
        int ret = ioctl(ctl, NV_IOWR(NV_ESC_CHECK_VERSION_STR, sizeof v), &v);
        printf("version %.64s check ret=%d reply=%u\n", v.versionString, ret, v.reply);
    } else {
        fprintf(stderr, "CHECK_VERSION_STR: %s (going on)\n", strerror(errno));
    }

    uint32_t client = rm_alloc(0, 0, NV01_ROOT_CLIENT, NULL, 0, "client");
    nv0080_alloc_t dp = {.deviceId = device_index, .hClientShare = client,
                         .vaMode = 2 /* NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES */};
    uint32_t device = client ? rm_alloc(client, client, NV01_DEVICE_0, &dp, sizeof dp, "device") : 0;
    /* A graphics TSG without a VA space handle, as CUDA allocates its GR TSG. */
    tsg_alloc_t tp = {.engineType = NV2080_ENGINE_TYPE_GR0};
    uint32_t tsg = device ? rm_alloc(client, device, KEPLER_CHANNEL_GROUP_A, &tp, sizeof tp, "tsg")
                          : 0;
    if (!tsg) {
        /* Go on anyway on a handle that does not exist: every request is then refused by RM,
         * which gpu-trace must still print (allowed=no status=...). */
        tsg = 0x5c0badd0;
        printf("no TSG: the steps below go to the unknown handle 0x%08x\n", tsg);
    }

    interleave(client, tsg, 2, "interleave_high");
    uint64_t ts = 4096;
    control(client, tsg, NVA06C_CTRL_CMD_SET_TIMESLICE, &ts, sizeof ts, "timeslice_4096");
    schedule(client, tsg, 1, "enable");
    schedule(client, tsg, 0, "disable");
    schedule(client, tsg, 1, "reenable");
    preempt(client, tsg, 1, 0, 0, "preempt_wait");
    preempt(client, tsg, 0, 1, 1000, "preempt_manual_1000us");
    interleave(client, tsg, 0, "interleave_low");
    interleave(client, tsg, 7, "interleave_invalid");

    if (client) {
        nvos00_t f = {.hRoot = client, .hObjectParent = client, .hObjectOld = client};
        int ret = ioctl(ctl, NV_IOWR(NV_ESC_RM_FREE, sizeof f), &f);
        printf("free client ret=%d status=0x%08x\n", ret, f.status);
    }
    if (devfd >= 0)
        close(devfd);
    close(ctl);
    return 0;
}
