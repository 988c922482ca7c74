/*
 * An independent witness of which RM device instance a CUDA process uses for which GPU
 * (issue 18): an LD_PRELOAD shim over ioctl(2) that logs, to the file named by
 * RM_IDS_LOG, every NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 answer (gpuId, which encodes the PCI
 * domain/bus/device, and deviceInstance) and every NV01_DEVICE_0 allocation (deviceId), as the
 * process's own calls returned them. Nothing of gpu-trace is used.
 *
 *   gcc -O2 -shared -fPIC -o rm_ids_shim.so examples/rm_ids_shim.c -ldl
 *   RM_IDS_LOG=/tmp/ids.txt LD_PRELOAD=$PWD/rm_ids_shim.so python3 -c 'import torch; ...'
 *
 * Layouts (open-gpu-kernel-modules, src/common/sdk/nvidia/inc): NVOS54_PARAMETERS {hClient,
 * hObject, cmd, flags, params (NvP64), paramsSize, status}; NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS
 * {gpuId, gpuFlags, deviceInstance, subDeviceInstance, sliStatus, boardId, gpuInstance, numaId};
 * NVOS21/NVOS64_PARAMETERS {hRoot, hObjectParent, hObjectNew, hClass, pAllocParms (NvP64 @16),
 * ...} (the status of a failed alloc is not read: only calls whose ioctl returned 0 are logged);
 * NV0080_ALLOC_PARAMETERS {deviceId, ...}. NV_ESC_IOCTL_XFER_CMD wraps {cmd, size, ptr}.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct nvos54 { uint32_t client, object, cmd, flags; uint64_t params; uint32_t size, status; };
struct xfer { uint32_t cmd, size; uint64_t ptr; };

static void logf_(const char *fmt, ...)
{
	const char *path = getenv("RM_IDS_LOG");
	FILE *f = fopen(path ? path : "/tmp/rm_ids.txt", "a");
	if (!f)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(f, "pid=%d ", getpid());
	vfprintf(f, fmt, ap);
	va_end(ap);
	fclose(f);
}

static void after(unsigned nr, void *arg)
{
	if (nr == 0x2A) {
		struct nvos54 *c = arg;
		if (c->cmd == 0x205 && c->status == 0 && c->size >= 12) {
			uint32_t *p = (uint32_t *)(uintptr_t)c->params;
			logf_("GET_ID_INFO_V2 gpuId=0x%x deviceInstance=%u subDeviceInstance=%u gpuInstance=%u\n",
			      p[0], p[2], p[3], c->size >= 28 ? p[6] : 0xffffffffu);
		}
	} else if (nr == 0x2B) {
		uint32_t *a = arg;
		uint64_t params = *(uint64_t *)((char *)arg + 16);
		if (a[3] == 0x80 && params)
			logf_("DEVICE_ALLOC handle=0x%x deviceId=%u\n", a[2], *(uint32_t *)(uintptr_t)params);
	}
}

int ioctl(int fd, unsigned long req, ...)
{
	static int (*real)(int, unsigned long, ...);
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (!real)
		real = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
	int rc = real(fd, req, arg);
	if (rc == 0 && ((req >> 8) & 0xff) == 'F' && arg) {
		unsigned nr = req & 0xff;
		if (nr == 0xD3) {
			struct xfer *x = arg;
			after(x->cmd & 0xff, (void *)(uintptr_t)x->ptr);
		} else {
			after(nr, arg);
		}
	}
	return rc;
}
