/*
 * gpu-trace lab: the guest test client. Built statically on the host (`cargo xtask lab` runs
 * `cc -static -O2 -o lab-client lab/client.c`) and run by lab/init.sh inside the QEMU guest.
 *
 * It issues the driver calls the lab checks, and proves with small hand-assembled eBPF programs
 * (raw bpf(2), no libbpf) that the guest kernel can do what the CI kernel refuses: kprobes and
 * fentry/fexit on KFD functions, BPF LSM on file_ioctl. It prints what it observed, one
 * `LAB <topic> key=value ...` line per fact; it judges nothing except "the syscall itself
 * failed" (exit 1). The verdict is computed on the host from the serial log (xtask/src/lab/judge.rs).
 *
 * Subcommands:
 *   facts           KFD GET_VERSION on /dev/kfd
 *   nv              RM-shaped ioctls on /dev/null (what gpu-trace --watch-device /dev/null sees)
 *   nvdev           the same on /dev/nvidiactl of the lab's test module nvlab, after an RM client
 *                   and device (all succeed)
 *   nvdeny          every form of GPFIFO_SCHEDULE a --deny-* policy must refuse, on nvlab
 *   nvdeny32        becomes lab/client32.c (32-bit x86): schedules through the compat ioctl path
 *   nvdeny-finn     FINN-serialized GPFIFO_SCHEDULEs (NVOS54 flags 0x4), whose first byte is not
 *                   bEnable, a plain disabling one, and an enabling one sent with _IOC_TYPE 0
 *                   (the driver ignores the type), on nvlab
 *   fork-SUB        fork; the parent exits at once, the child waits until it has been
 *                   reparented, then runs SUB and prints `LAB fork_child done`
 *   nvobj           nvlab as an RM: client, device, TSG, two channels, GET_INFO, schedules,
 *                   work-submit tokens, frees, and calls RM refuses (their statuses printed)
 *   kfd-create      AMDKFD_IOC_CREATE_QUEUE on /dev/kfd, 96- and 88-byte forms (EINVAL, no GPU)
 *   kfd-ops         CREATE_QUEUE (88-byte form), UPDATE_QUEUE, SET_CU_MASK, DESTROY_QUEUE on
 *                   queue LAB_QUEUE_ID: each handler of the driver entered once, each refused
 *   kprobe          kprobe + kretprobe on kfd_ioctl_create_queue; ambiguous name by address
 *   fentry          fentry + fexit on kfd_ioctl_create_queue through amdgpu's module BTF
 *   lsm             BPF LSM on file_ioctl denying CREATE_QUEUE for this process only
 *   wait FILE SUB   print the pid, wait until FILE exists, then run SUB (for --deny-pid runs)
 *   storm SUB       100000 getppid() and 100000 FIONREAD ioctls on a pipe, then SUB, then the
 *                   driver ioctls and opens SUB made (for the program run counts of --bpf-stats)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/btf.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- driver ABI (docs: docs/driver-abi.md A1/A2, B1) ---------------------- */

#define KFD_GET_VERSION 0x80084B01u
#define KFD_CREATE_QUEUE_96 0xC0604B02u /* 6.12+ UAPI header: 96-byte args */
#define KFD_CREATE_QUEUE_88 0xC0584B02u /* 6.1 UAPI header: 88-byte args */

struct kfd_create_queue_args {
	uint64_t ring_base_address, write_pointer_address, read_pointer_address;
	uint64_t doorbell_offset; /* out */
	uint32_t ring_size, gpu_id, queue_type, queue_percentage, queue_priority;
	uint32_t queue_id; /* out */
	uint64_t eop_buffer_address, eop_buffer_size, ctx_save_restore_address;
	uint32_t ctx_save_restore_size, ctl_stack_size, sdma_engine_id, pad;
};
_Static_assert(sizeof(struct kfd_create_queue_args) == 96, "KFD create-queue args are 96 bytes");

/* The values the lab's checks look for in gpu-trace's output (see xtask/src/lab/judge.rs). */
#define LAB_GPU_ID 0x4c4142u /* "LAB": no such GPU, so the driver answers EINVAL */
#define LAB_RING_SIZE 4096u
#define LAB_QUEUE_TYPE 2u /* KFD_IOC_QUEUE_TYPE_COMPUTE_AQL */
#define LAB_PERCENTAGE 100u
#define LAB_PRIORITY 7u

#define NV_ALLOC64 0xC030462Bu
#define NV_CONTROL 0xC020462Au
#define NV_FREE 0xC0104629u
#define NV_XFER 0xC01046D3u
#define NV_CHECK_VERSION 0xC04846D2u
#define NV_TSG_SCHEDULE 0xA06C0101u
#define NV_CHANNEL_SCHEDULE 0xA06F0103u
#define NV_UNRELATED_CONTROL 0x20800101u
#define NV_TSG_GET_INFO 0xA06C0106u
#define NV_GET_WORK_SUBMIT_TOKEN 0xC36F0108u
#define NV_ALLOC21 0xC020462Bu /* RM_ALLOC with the 32-byte NVOS21 */
#define NV01_ROOT_CLIENT 0x41u
#define NV01_DEVICE_0 0x80u
#define KEPLER_CHANNEL_GROUP_A 0xA06Cu
#define HOPPER_CHANNEL_GPFIFO_A 0xC86Fu
/* RM status codes (open-gpu-kernel-modules src/common/sdk/nvidia/inc/nvstatuscodes.h). */
#define NV_ERR_INSERT_DUPLICATE_NAME 0x19u
#define NV_ERR_INVALID_OBJECT_HANDLE 0x33u
#define NV_ERR_INVALID_OBJECT_PARENT 0x36u
#define NV_ERR_OBJECT_NOT_FOUND 0x57u

struct nvos64 {
	uint32_t h_root, h_parent, h_new, h_class;
	uint64_t p_alloc, p_rights;
	uint32_t params_size, flags, status, pad;
};
struct nvos21 {
	uint32_t h_root, h_parent, h_new, h_class;
	uint64_t p_alloc;
	uint32_t params_size, status;
};
_Static_assert(sizeof(struct nvos21) == 32, "NVOS21 is 32 bytes");
struct nvos54 {
	uint32_t h_client, h_object, cmd, flags;
	uint64_t params;
	uint32_t params_size, status;
};
struct nvos00 {
	uint32_t h_root, h_parent, h_old, status;
};
struct nv_xfer {
	uint32_t cmd, size;
	uint64_t ptr;
};

/* ---- helpers ------------------------------------------------------------------------------ */

/* What the subcommand did to the driver, for `storm`: ioctls issued, device files opened. */
static unsigned long driver_ioctls, driver_opens;

static long xioctl(int fd, unsigned long cmd, void *arg)
{
	long rc = ioctl(fd, cmd, arg);
	driver_ioctls++;
	return rc < 0 ? -errno : rc;
}

static int open_or_die(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	driver_opens++;
	if (fd < 0) {
		printf("LAB error open=%s errno=%d (%s)\n", path, errno, strerror(errno));
		exit(1);
	}
	return fd;
}

static long create_queue(int fd, unsigned int cmd)
{
	static uint8_t ring[LAB_RING_SIZE] __attribute__((aligned(4096)));
	static uint64_t rptr, wptr;
	struct kfd_create_queue_args a = {
		.ring_base_address = (uintptr_t)ring,
		.write_pointer_address = (uintptr_t)&wptr,
		.read_pointer_address = (uintptr_t)&rptr,
		.ring_size = LAB_RING_SIZE,
		.gpu_id = LAB_GPU_ID,
		.queue_type = LAB_QUEUE_TYPE,
		.queue_percentage = LAB_PERCENTAGE,
		.queue_priority = LAB_PRIORITY,
	};
	return xioctl(fd, cmd, &a);
}

/* ---- subcommands: driver calls ------------------------------------------------------------ */

static int cmd_facts(void)
{
	int fd = open_or_die("/dev/kfd");
	uint32_t ver[2] = {0, 0};
	long rc = xioctl(fd, KFD_GET_VERSION, ver);
	printf("LAB kfd get_version rc=%ld major=%u minor=%u\n", rc, ver[0], ver[1]);
	close(fd);
	return rc == 0 ? 0 : 1;
}

static int cmd_nv(void)
{
	int fd = open_or_die("/dev/null");
	int zero = open_or_die("/dev/zero");
	uint32_t tsg_params[5] = {0xcaf00001, 0, 0xcaf00002, 1, 0}; /* engineType 1 = GR0 */
	struct nvos64 alloc = {
		.h_root = 0xc1d00001, .h_parent = 0xc1d00002, .h_new = 0x5c000010, .h_class = 0xA06C,
		.p_alloc = (uintptr_t)tsg_params,
	};
	uint8_t sched[3] = {1, 0, 0}; /* bEnable */
	struct nvos54 control = {
		.h_client = 0xc1d00001, .h_object = 0x5c000010, .cmd = NV_TSG_SCHEDULE,
		.params = (uintptr_t)sched, .params_size = 3,
	};
	struct nv_xfer xfer = {.cmd = 0x2B, .size = sizeof alloc, .ptr = (uintptr_t)&alloc};
	struct nvos00 fr = {.h_root = 0xc1d00001, .h_parent = 0xc1d00002, .h_old = 0x5c000010};
	struct nvos54 other = control;
	other.cmd = NV_UNRELATED_CONTROL;

	printf("LAB nv pid=%d tid=%ld fd=%d\n", getpid(), syscall(SYS_gettid), fd);
	/* Traced (4): TSG alloc, GPFIFO_SCHEDULE, the XFER-wrapped alloc, the free. */
	printf("LAB nv call=alloc64 rc=%ld\n", xioctl(fd, NV_ALLOC64, &alloc));
	printf("LAB nv call=schedule rc=%ld\n", xioctl(fd, NV_CONTROL, &control));
	printf("LAB nv call=xfer_alloc rc=%ld\n", xioctl(fd, NV_XFER, &xfer));
	printf("LAB nv call=free rc=%ld\n", xioctl(fd, NV_FREE, &fr));
	/* Not traced: an unrelated control (read, counted as ignored), a version check (filtered by
	 * command number), and an RM alloc on an unwatched device. */
	printf("LAB nv call=other_control rc=%ld\n", xioctl(fd, NV_CONTROL, &other));
	printf("LAB nv call=check_version rc=%ld\n", xioctl(fd, NV_CHECK_VERSION, NULL));
	printf("LAB nv call=alloc_on_zero rc=%ld\n", xioctl(zero, NV_ALLOC64, &alloc));
	close(zero);
	close(fd);
	return 0;
}

/*
 * nvlab keeps an object table per open file and refuses what RM refuses: an RM client and a
 * device under it come first. The client through NVOS21 (hObjectNew = the client handle), the
 * device (NV0080_ALLOC_PARAMETERS, deviceId 0) through NVOS64. Prints each call's rc and status.
 */
static void nv_client_and_device(int fd, const char *topic, uint32_t client, uint32_t device)
{
	/* NV0080_ALLOC_PARAMETERS: deviceId 0, the rest 0. On the stack, written: gpu-trace reads
	 * deviceId with bpf_probe_read_user, which fails on a never-touched .bss page (seen: a
	 * static array here made the read fail and the TSGs' `gpu` unknown). */
	uint32_t dev_params[14] = {0};
	struct nvos21 c = {.h_root = 0, .h_parent = 0, .h_new = client, .h_class = NV01_ROOT_CLIENT,
			   .status = 0xffffffff};
	struct nvos64 d = {.h_root = client, .h_parent = client, .h_new = device,
			   .h_class = NV01_DEVICE_0, .p_alloc = (uintptr_t)dev_params,
			   .params_size = sizeof dev_params, .status = 0xffffffff};
	long rc = xioctl(fd, NV_ALLOC21, &c);
	printf("LAB %s call=alloc_client rc=%ld status=%u\n", topic, rc, c.status);
	rc = xioctl(fd, NV_ALLOC64, &d);
	printf("LAB %s call=alloc_device rc=%ld status=%u\n", topic, rc, d.status);
}

/* After nv_client_and_device: TSG 0x5c000010 (engine GR0) under the device and channel
 * 0x5c000020 (class 0xC86F, `ch_params` its NV_CHANNEL_ALLOC_PARAMS up to cid) in it, each
 * call's rc and status printed. The --deny-* clients' objects. */
static void nv_tsg_and_channel(int fd, const char *topic, uint8_t *ch_params)
{
	uint32_t tsg_params[5] = {0xcaf00001, 0, 0xcaf00002, 1, 0}; /* engineType 1 = GR0 */
	struct nvos64 tsg = {
		.h_root = 0xc1d00001, .h_parent = 0xc1d00002, .h_new = 0x5c000010, .h_class = 0xA06C,
		.p_alloc = (uintptr_t)tsg_params, .status = 0xffffffff,
	};
	struct nvos64 ch = {
		.h_root = 0xc1d00001, .h_parent = 0x5c000010, .h_new = 0x5c000020, .h_class = 0xC86F,
		.p_alloc = (uintptr_t)ch_params, .status = 0xffffffff,
	};
	nv_client_and_device(fd, topic, 0xc1d00001, 0xc1d00002);
	long rc = xioctl(fd, NV_ALLOC64, &tsg);
	printf("LAB %s call=alloc_tsg rc=%ld status=%u\n", topic, rc, tsg.status);
	rc = xioctl(fd, NV_ALLOC64, &ch);
	printf("LAB %s call=alloc_channel rc=%ld status=%u\n", topic, rc, ch.status);
}

/*
 * The same calls on /dev/nvidiactl of the lab's NVIDIA-like test module (lab/modules/nvlab),
 * after its RM client 0xc1d00001 and device 0xc1d00002: two TSGs (one direct NVOS64, one
 * XFER-wrapped), GPFIFO_SCHEDULE of the first, both freed; the client stays (close frees it).
 * Each `status` starts at 0xffffffff so that the printed value shows the device wrote NV_OK.
 */
static int cmd_nvdev(void)
{
	int fd = open_or_die("/dev/nvidiactl");
	uint32_t tsg_params[5] = {0xcaf00001, 0, 0xcaf00002, 1, 0}; /* engineType 1 = GR0 */
	struct nvos64 a = {
		.h_root = 0xc1d00001, .h_parent = 0xc1d00002, .h_new = 0x5c000010, .h_class = 0xA06C,
		.p_alloc = (uintptr_t)tsg_params, .status = 0xffffffff,
	};
	struct nvos64 b = a;
	b.h_new = 0x5c000011;
	uint8_t sched[3] = {1, 0, 0}; /* bEnable */
	struct nvos54 control = {
		.h_client = 0xc1d00001, .h_object = 0x5c000010, .cmd = NV_TSG_SCHEDULE,
		.params = (uintptr_t)sched, .params_size = 3, .status = 0xffffffff,
	};
	struct nv_xfer xfer = {.cmd = 0x2B, .size = sizeof b, .ptr = (uintptr_t)&b};
	struct nvos00 free_a = {.h_root = 0xc1d00001, .h_parent = 0xc1d00002, .h_old = 0x5c000010,
				.status = 0xffffffff};
	struct nvos00 free_b = free_a;
	free_b.h_old = 0x5c000011;

	printf("LAB nvdev pid=%d tid=%ld fd=%d\n", getpid(), syscall(SYS_gettid), fd);
	nv_client_and_device(fd, "nvdev", 0xc1d00001, 0xc1d00002);
	long rc = xioctl(fd, NV_ALLOC64, &a);
	printf("LAB nvdev call=alloc64 rc=%ld status=%u\n", rc, a.status);
	rc = xioctl(fd, NV_CONTROL, &control);
	printf("LAB nvdev call=schedule rc=%ld status=%u\n", rc, control.status);
	rc = xioctl(fd, NV_XFER, &xfer);
	printf("LAB nvdev call=xfer_alloc rc=%ld status=%u\n", rc, b.status);
	rc = xioctl(fd, NV_FREE, &free_a);
	printf("LAB nvdev call=free_a rc=%ld status=%u\n", rc, free_a.status);
	rc = xioctl(fd, NV_FREE, &free_b);
	printf("LAB nvdev call=free_b rc=%ld status=%u\n", rc, free_b.status);
	close(fd);
	return 0;
}

/* Every form of GPFIFO_SCHEDULE an --deny-* policy must refuse (issue 20), on nvlab's device: an
 * RM client and device, a TSG and a channel in it, then the TSG's schedule direct, XFER-wrapped, from a second thread,
 * and the channel-level schedule. Each control's status starts at 0xffffffff, so a refusal
 * before the driver leaves it there; the module answers NV_OK to what reaches it. */
struct nvdeny_thread {
	int fd;
	struct nvos54 control;
	long rc;
	long tid;
};

static void *nvdeny_thread(void *p)
{
	struct nvdeny_thread *t = p;
	t->tid = syscall(SYS_gettid);
	t->rc = xioctl(t->fd, NV_CONTROL, &t->control);
	return NULL;
}

static int cmd_nvdeny(void)
{
	int fd = open_or_die("/dev/nvidiactl");
	static uint8_t ch_params[136]; /* NV_CHANNEL_ALLOC_PARAMS up to cid: zeros */
	uint8_t sched[3] = {1, 0, 0}; /* bEnable */
	struct nvos54 direct = {
		.h_client = 0xc1d00001, .h_object = 0x5c000010, .cmd = NV_TSG_SCHEDULE,
		.params = (uintptr_t)sched, .params_size = 3, .status = 0xffffffff,
	};
	struct nvos54 wrapped = direct;
	struct nv_xfer xfer = {.cmd = 0x2A, .size = sizeof wrapped, .ptr = (uintptr_t)&wrapped};
	struct nvos54 channel = direct;
	channel.h_object = 0x5c000020;
	channel.cmd = NV_CHANNEL_SCHEDULE;
	struct nvdeny_thread t = {.fd = fd, .control = direct};
	struct nvos00 fr = {.h_root = 0xc1d00001, .h_parent = 0xc1d00002, .h_old = 0x5c000010,
			    .status = 0xffffffff};

	printf("LAB nvdeny pid=%d tid=%ld fd=%d\n", getpid(), syscall(SYS_gettid), fd);
	nv_tsg_and_channel(fd, "nvdeny", ch_params);
	long rc = xioctl(fd, NV_CONTROL, &direct);
	printf("LAB nvdeny call=schedule rc=%ld status=%u\n", rc, direct.status);
	rc = xioctl(fd, NV_XFER, &xfer);
	printf("LAB nvdeny call=schedule_xfer rc=%ld status=%u\n", rc, wrapped.status);
	rc = xioctl(fd, NV_CONTROL, &channel);
	printf("LAB nvdeny call=schedule_channel rc=%ld status=%u\n", rc, channel.status);
	pthread_t th;
	if (pthread_create(&th, NULL, nvdeny_thread, &t) != 0 || pthread_join(th, NULL) != 0) {
		printf("LAB error nvdeny thread\n");
		return 1;
	}
	printf("LAB nvdeny call=schedule_thread rc=%ld status=%u thread=%ld\n", t.rc, t.control.status,
	       t.tid);
	rc = xioctl(fd, NV_FREE, &fr);
	printf("LAB nvdeny call=free rc=%ld status=%u\n", rc, fr.status);
	close(fd);
	return 0;
}

/* FINN-serialized GPFIFO_SCHEDULEs (issue 26): the flag NVOS54_FLAGS_FINN_SERIALIZED (0x4) says
 * that `params` is a serialized buffer, not {bEnable, ...}: its first byte is a header byte, 0
 * here, which a check reading bEnable there would take for "disable". On the TSG direct, and on
 * the channel XFER-wrapped; then a plain enabling schedule sent with _IOC_TYPE 0, and a plain
 * disabling schedule (bEnable 0), which a policy lets through. nvlab reads no FINN (it answers NV_OK to a 3-byte schedule): what matters is whether
 * the call reached it (status changed from the preset 0xffffffff). */
static int cmd_nvdeny_finn(void)
{
	int fd = open_or_die("/dev/nvidiactl");
	uint8_t ch_params[136] = {0}; /* NV_CHANNEL_ALLOC_PARAMS up to cid: zeros, on the stack */
	uint8_t finn[3] = {0, 1, 0}; /* not bEnable: a serialized buffer's first bytes */
	uint8_t disable[3] = {0, 0, 0};
	struct nvos54 finn_tsg = {
		.h_client = 0xc1d00001, .h_object = 0x5c000010, .cmd = NV_TSG_SCHEDULE,
		.flags = 0x4, .params = (uintptr_t)finn, .params_size = 3, .status = 0xffffffff,
	};
	struct nvos54 finn_channel = finn_tsg;
	finn_channel.h_object = 0x5c000020;
	finn_channel.cmd = NV_CHANNEL_SCHEDULE;
	struct nv_xfer xfer = {.cmd = 0x2A, .size = sizeof finn_channel,
			       .ptr = (uintptr_t)&finn_channel};
	struct nvos54 plain_disable = finn_tsg;
	plain_disable.flags = 0;
	plain_disable.params = (uintptr_t)disable;
	uint8_t enable[3] = {1, 0, 0};
	struct nvos54 enable_type0 = plain_disable;
	enable_type0.params = (uintptr_t)enable;
	struct nvos00 fr = {.h_root = 0xc1d00001, .h_parent = 0xc1d00002, .h_old = 0x5c000010,
			    .status = 0xffffffff};

	printf("LAB nvdeny_finn pid=%d tid=%ld fd=%d\n", getpid(), syscall(SYS_gettid), fd);
	nv_tsg_and_channel(fd, "nvdeny_finn", ch_params);
	long rc = xioctl(fd, NV_CONTROL, &finn_tsg);
	printf("LAB nvdeny_finn call=schedule_finn rc=%ld status=%u\n", rc, finn_tsg.status);
	rc = xioctl(fd, NV_XFER, &xfer);
	printf("LAB nvdeny_finn call=schedule_finn_channel_xfer rc=%ld status=%u\n", rc,
	       finn_channel.status);
	/* An enabling schedule whose command has _IOC_TYPE 0 instead of 'F': the real driver
	 * ignores the type (nvidia_ioctl takes _IOC_NR and _IOC_SIZE), so must nvlab, gpu-trace's
	 * tracing and its deny check. */
	rc = xioctl(fd, NV_CONTROL & ~0xff00u, &enable_type0);
	printf("LAB nvdeny_finn call=schedule_type0 rc=%ld status=%u\n", rc, enable_type0.status);
	rc = xioctl(fd, NV_CONTROL, &plain_disable);
	printf("LAB nvdeny_finn call=disable rc=%ld status=%u\n", rc, plain_disable.status);
	rc = xioctl(fd, NV_FREE, &fr);
	printf("LAB nvdeny_finn call=free rc=%ld status=%u\n", rc, fr.status);
	close(fd);
	return 0;
}

/*
 * nvlab as an RM of its own (issue 20): what it answers is printed here, from the parameter
 * blocks the client got back, and the lab compares gpu-trace's events with it. Client
 * 0xc1e00001, device 0xc1e00002, TSG 0x5c000030, channels 0x5c000031 and 0x5c000032
 * (HOPPER_CHANNEL_GPFIFO_A) under it; GET_INFO on the TSG (the module's hardware TSG id);
 * GPFIFO_SCHEDULE of the TSG (2 channels); GET_WORK_SUBMIT_TOKEN on each channel; the first
 * channel freed, the TSG scheduled again (1 channel); the TSG freed (the second channel with
 * it); the client freed. In between, calls RM refuses, each with its status: a second
 * allocation of handle 0x5c000030, a channel under parent 0x5c0000ee that does not exist, a TSG
 * directly under the client (a TSG's parent must be a device), a token request on channel
 * 0x5c0000ef that does not exist, and a free naming RM client 0xbad00001 that does not exist;
 * and a free of handle 0x5c0000ef in the real client, which RM answers NV_OK (it frees nothing).
 * Each status starts at 0xffffffff, each token at 0xffffffff.
 */
#define OBJ_CLIENT 0xc1e00001u
#define OBJ_DEVICE 0xc1e00002u
#define OBJ_TSG 0x5c000030u
#define OBJ_CH_A 0x5c000031u
#define OBJ_CH_B 0x5c000032u
#define OBJ_MISSING 0x5c0000efu

static long obj_alloc(int fd, uint32_t parent, uint32_t handle, uint32_t class, void *params,
		      uint32_t size, uint32_t *status)
{
	struct nvos64 a = {.h_root = OBJ_CLIENT, .h_parent = parent, .h_new = handle,
			   .h_class = class, .p_alloc = (uintptr_t)params, .params_size = size,
			   .status = 0xffffffff};
	long rc = xioctl(fd, NV_ALLOC64, &a);
	*status = a.status;
	return rc;
}

static long obj_control(int fd, uint32_t object, uint32_t cmd, void *params, uint32_t size,
			uint32_t *status)
{
	struct nvos54 c = {.h_client = OBJ_CLIENT, .h_object = object, .cmd = cmd,
			   .params = (uintptr_t)params, .params_size = size, .status = 0xffffffff};
	long rc = xioctl(fd, NV_CONTROL, &c);
	*status = c.status;
	return rc;
}

static long obj_free(int fd, uint32_t client, uint32_t parent, uint32_t handle, uint32_t *status)
{
	struct nvos00 f = {.h_root = client, .h_parent = parent, .h_old = handle,
			   .status = 0xffffffff};
	long rc = xioctl(fd, NV_FREE, &f);
	*status = f.status;
	return rc;
}

static int cmd_nvobj(void)
{
	int fd = open_or_die("/dev/nvidiactl");
	uint32_t tsg_params[5] = {0xcaf00001, 0, 0xcaf00002, 1, 0}; /* engineType 1 = GR0 */
	uint8_t ch_params[136] = {0}; /* NV_CHANNEL_ALLOC_PARAMS: zeros, written (see above) */
	uint8_t sched[3] = {1, 0, 0};                              /* bEnable */
	uint32_t st, info, token;
	long rc;

	printf("LAB nvobj pid=%d tid=%ld fd=%d\n", getpid(), syscall(SYS_gettid), fd);
	nv_client_and_device(fd, "nvobj", OBJ_CLIENT, OBJ_DEVICE);
	rc = obj_alloc(fd, OBJ_DEVICE, OBJ_TSG, KEPLER_CHANNEL_GROUP_A, tsg_params, sizeof tsg_params, &st);
	printf("LAB nvobj call=alloc_tsg rc=%ld status=%u\n", rc, st);
	rc = obj_alloc(fd, OBJ_DEVICE, OBJ_TSG, KEPLER_CHANNEL_GROUP_A, tsg_params, sizeof tsg_params, &st);
	printf("LAB nvobj call=alloc_tsg_again rc=%ld status=%u want=%u\n", rc, st,
	       NV_ERR_INSERT_DUPLICATE_NAME);
	rc = obj_alloc(fd, OBJ_CLIENT, 0x5c000033, KEPLER_CHANNEL_GROUP_A, tsg_params, sizeof tsg_params, &st);
	printf("LAB nvobj call=alloc_tsg_under_client rc=%ld status=%u want=%u\n", rc, st,
	       NV_ERR_INVALID_OBJECT_PARENT);
	rc = obj_alloc(fd, OBJ_TSG, OBJ_CH_A, HOPPER_CHANNEL_GPFIFO_A, ch_params, sizeof ch_params, &st);
	printf("LAB nvobj call=alloc_channel_a rc=%ld status=%u\n", rc, st);
	rc = obj_alloc(fd, OBJ_TSG, OBJ_CH_B, HOPPER_CHANNEL_GPFIFO_A, ch_params, sizeof ch_params, &st);
	printf("LAB nvobj call=alloc_channel_b rc=%ld status=%u\n", rc, st);
	rc = obj_alloc(fd, 0x5c0000ee, 0x5c000034, HOPPER_CHANNEL_GPFIFO_A, ch_params, sizeof ch_params, &st);
	printf("LAB nvobj call=alloc_channel_unknown_parent rc=%ld status=%u want=%u\n", rc, st,
	       NV_ERR_OBJECT_NOT_FOUND);
	info = 0xffffffff;
	rc = obj_control(fd, OBJ_TSG, NV_TSG_GET_INFO, &info, sizeof info, &st);
	printf("LAB nvobj call=get_info rc=%ld status=%u tsg_id=%u\n", rc, st, info);
	rc = obj_control(fd, OBJ_TSG, NV_TSG_SCHEDULE, sched, sizeof sched, &st);
	printf("LAB nvobj call=schedule rc=%ld status=%u\n", rc, st);
	token = 0xffffffff;
	rc = obj_control(fd, OBJ_CH_A, NV_GET_WORK_SUBMIT_TOKEN, &token, sizeof token, &st);
	printf("LAB nvobj call=token_a rc=%ld status=%u channel=0x%x token=%u\n", rc, st, OBJ_CH_A, token);
	token = 0xffffffff;
	rc = obj_control(fd, OBJ_CH_B, NV_GET_WORK_SUBMIT_TOKEN, &token, sizeof token, &st);
	printf("LAB nvobj call=token_b rc=%ld status=%u channel=0x%x token=%u\n", rc, st, OBJ_CH_B, token);
	token = 0xffffffff;
	rc = obj_control(fd, OBJ_MISSING, NV_GET_WORK_SUBMIT_TOKEN, &token, sizeof token, &st);
	printf("LAB nvobj call=token_unknown rc=%ld status=%u want=%u token=%u\n", rc, st,
	       NV_ERR_OBJECT_NOT_FOUND, token);
	rc = obj_free(fd, 0xbad00001, 0xbad00001, OBJ_TSG, &st);
	printf("LAB nvobj call=free_unknown_client rc=%ld status=%u want=%u\n", rc, st,
	       NV_ERR_INVALID_OBJECT_HANDLE);
	rc = obj_free(fd, OBJ_CLIENT, OBJ_DEVICE, OBJ_MISSING, &st);
	printf("LAB nvobj call=free_unknown_handle rc=%ld status=%u want=0\n", rc, st);
	rc = obj_free(fd, OBJ_CLIENT, OBJ_TSG, OBJ_CH_A, &st);
	printf("LAB nvobj call=free_channel_a rc=%ld status=%u\n", rc, st);
	rc = obj_control(fd, OBJ_TSG, NV_TSG_SCHEDULE, sched, sizeof sched, &st);
	printf("LAB nvobj call=schedule_again rc=%ld status=%u\n", rc, st);
	rc = obj_free(fd, OBJ_CLIENT, OBJ_DEVICE, OBJ_TSG, &st);
	printf("LAB nvobj call=free_tsg rc=%ld status=%u\n", rc, st);
	token = 0xffffffff;
	rc = obj_control(fd, OBJ_CH_B, NV_GET_WORK_SUBMIT_TOKEN, &token, sizeof token, &st);
	printf("LAB nvobj call=token_b_after_free rc=%ld status=%u want=%u token=%u\n", rc, st,
	       NV_ERR_OBJECT_NOT_FOUND, token);
	rc = obj_free(fd, OBJ_CLIENT, OBJ_CLIENT, OBJ_CLIENT, &st);
	printf("LAB nvobj call=free_client rc=%ld status=%u\n", rc, st);
	close(fd);
	return 0;
}

static int cmd_kfd_create(void)
{
	int fd = open_or_die("/dev/kfd");
	printf("LAB kfd_create pid=%d gpu_id=%u queue_type=%u percentage=%u priority=%u ring_size=%u\n",
	       getpid(), LAB_GPU_ID, LAB_QUEUE_TYPE, LAB_PERCENTAGE, LAB_PRIORITY, LAB_RING_SIZE);
	printf("LAB kfd_create size=96 cmd=0x%08x rc=%ld\n", KFD_CREATE_QUEUE_96,
	       create_queue(fd, KFD_CREATE_QUEUE_96));
	printf("LAB kfd_create size=88 cmd=0x%08x rc=%ld\n", KFD_CREATE_QUEUE_88,
	       create_queue(fd, KFD_CREATE_QUEUE_88));
	close(fd);
	return 0;
}

#define KFD_DESTROY_QUEUE 0xC0084B03u
#define KFD_UPDATE_QUEUE 0x40184B07u
#define KFD_SET_CU_MASK 0x40104B1Au
#define LAB_QUEUE_ID 5u
#define LAB_UPDATE_PERCENTAGE 30u
#define LAB_UPDATE_PRIORITY 2u
#define LAB_CU_MASK_BITS 64u

/* One call to each of the four handlers gpu-trace hooks (kfd_ioctl_{create,update,destroy}_queue,
 * kfd_ioctl_set_cu_mask). Without a GPU the create fails at the gpu_id lookup and the other
 * three find no queue LAB_QUEUE_ID: each is refused after entering its handler. */
static int cmd_kfd_ops(void)
{
	int fd = open_or_die("/dev/kfd");
	static uint8_t ring[LAB_RING_SIZE] __attribute__((aligned(4096)));
	uint32_t mask[LAB_CU_MASK_BITS / 32] = {0xffffffffu, 0xffffffffu};
	struct { uint64_t ring_base; uint32_t queue_id, ring_size, percentage, priority; } update = {
		(uintptr_t)ring, LAB_QUEUE_ID, LAB_RING_SIZE, LAB_UPDATE_PERCENTAGE, LAB_UPDATE_PRIORITY};
	struct { uint32_t queue_id, num_cu_mask; uint64_t cu_mask_ptr; } cu = {
		LAB_QUEUE_ID, LAB_CU_MASK_BITS, (uintptr_t)mask};
	struct { uint32_t queue_id, pad; } destroy = {LAB_QUEUE_ID, 0};
	printf("LAB kfd_ops pid=%d queue_id=%u\n", getpid(), LAB_QUEUE_ID);
	printf("LAB kfd_ops call=create rc=%ld\n", create_queue(fd, KFD_CREATE_QUEUE_88));
	printf("LAB kfd_ops call=update rc=%ld\n", xioctl(fd, KFD_UPDATE_QUEUE, &update));
	printf("LAB kfd_ops call=cu_mask rc=%ld\n", xioctl(fd, KFD_SET_CU_MASK, &cu));
	printf("LAB kfd_ops call=destroy rc=%ld\n", xioctl(fd, KFD_DESTROY_QUEUE, &destroy));
	close(fd);
	return 0;
}

/* --deny-* against KFD (issue 20): both CREATE_QUEUE sizes (printed as kfd-create prints them),
 * an UPDATE_QUEUE that would make a queue active (ring set, percentage > 0: refused for a denied
 * process) and one that deactivates it (percentage 0: never refused). Without a GPU what reaches
 * the driver fails there (no queue LAB_QUEUE_ID). */
static int cmd_kfd_deny(void)
{
	cmd_kfd_create();
	int fd = open_or_die("/dev/kfd");
	static uint8_t ring[LAB_RING_SIZE] __attribute__((aligned(4096)));
	struct kfd_update { uint64_t ring_base; uint32_t queue_id, ring_size, percentage, priority; };
	struct kfd_update active = {(uintptr_t)ring, LAB_QUEUE_ID, LAB_RING_SIZE,
				    LAB_UPDATE_PERCENTAGE, LAB_UPDATE_PRIORITY};
	struct kfd_update inactive = active;
	inactive.percentage = 0;
	printf("LAB kfd_deny call=update_active rc=%ld\n", xioctl(fd, KFD_UPDATE_QUEUE, &active));
	printf("LAB kfd_deny call=update_inactive rc=%ld\n", xioctl(fd, KFD_UPDATE_QUEUE, &inactive));
	close(fd);
	return 0;
}

/* ---- a tiny eBPF assembler ---------------------------------------------------------------- */

#define MAX_INSNS 128
struct prog {
	struct bpf_insn insn[MAX_INSNS];
	int n;
};

static void emit(struct prog *p, uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm)
{
	if (p->n >= MAX_INSNS) {
		printf("LAB error program too long\n");
		exit(1);
	}
	p->insn[p->n++] = (struct bpf_insn){.code = code, .dst_reg = dst, .src_reg = src, .off = off, .imm = imm};
}

#define R0 0
#define R1 1
#define R2 2
#define R3 3
#define R6 6
#define R7 7
#define R8 8
#define R10 10

static void mov_imm(struct prog *p, int dst, int32_t imm) { emit(p, BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm); }
static void mov_reg(struct prog *p, int dst, int src) { emit(p, BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0); }
static void add_imm(struct prog *p, int dst, int32_t imm) { emit(p, BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm); }
static void ldx64(struct prog *p, int dst, int src, int16_t off) { emit(p, BPF_LDX | BPF_MEM | BPF_DW, dst, src, off, 0); }
static void ldx32(struct prog *p, int dst, int src, int16_t off) { emit(p, BPF_LDX | BPF_MEM | BPF_W, dst, src, off, 0); }
static void st64(struct prog *p, int dst, int16_t off, int32_t imm) { emit(p, BPF_ST | BPF_MEM | BPF_DW, dst, 0, off, imm); }
static void st32(struct prog *p, int dst, int16_t off, int32_t imm) { emit(p, BPF_ST | BPF_MEM | BPF_W, dst, 0, off, imm); }
static void call(struct prog *p, int helper) { emit(p, BPF_JMP | BPF_CALL, 0, 0, 0, helper); }
static void exit_insn(struct prog *p) { emit(p, BPF_JMP | BPF_EXIT, 0, 0, 0, 0); }
static void ld_map(struct prog *p, int dst, int map_fd)
{
	emit(p, BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_FD, 0, map_fd);
	emit(p, 0, 0, 0, 0, 0);
}

/* map[slot] += 1 (op_add) or map[slot] = reg. Clobbers r0-r5. */
static void map_update(struct prog *p, int map_fd, int slot, int reg, int op_add)
{
	st32(p, R10, -4, slot);
	ld_map(p, R1, map_fd);
	mov_reg(p, R2, R10);
	add_imm(p, R2, -4);
	call(p, BPF_FUNC_map_lookup_elem);
	emit(p, BPF_JMP | BPF_JEQ | BPF_K, R0, 0, 1, 0); /* if r0 == NULL skip the store */
	if (op_add)
		emit(p, BPF_STX | BPF_ATOMIC | BPF_DW, R0, reg, 0, BPF_ADD);
	else
		emit(p, BPF_STX | BPF_MEM | BPF_DW, R0, reg, 0, 0);
}

/* r8 = *(u32 *)(r3 + off) read with bpf_probe_read_kernel. r3 holds a kernel pointer. */
static void read_kernel_u32(struct prog *p, int off)
{
	add_imm(p, R3, off);
	st64(p, R10, -16, 0);
	mov_reg(p, R1, R10);
	add_imm(p, R1, -16);
	mov_imm(p, R2, 4);
	call(p, BPF_FUNC_probe_read_kernel);
	ldx32(p, R8, R10, -16);
}

static int sys_bpf(int cmd, union bpf_attr *attr)
{
	return (int)syscall(SYS_bpf, cmd, attr, sizeof(*attr));
}

static char verifier_log[1 << 16];

static int load_prog(const char *what, struct prog *p, enum bpf_prog_type type,
		     enum bpf_attach_type attach, uint32_t btf_id, int btf_obj_fd)
{
	union bpf_attr a;
	memset(&a, 0, sizeof a);
	a.prog_type = type;
	a.insns = (uintptr_t)p->insn;
	a.insn_cnt = p->n;
	a.license = (uintptr_t)"GPL";
	a.expected_attach_type = attach;
	a.attach_btf_id = btf_id;
	a.attach_btf_obj_fd = btf_obj_fd > 0 ? btf_obj_fd : 0;
	a.log_buf = (uintptr_t)verifier_log;
	a.log_size = sizeof verifier_log;
	a.log_level = 1;
	verifier_log[0] = 0;
	int fd = sys_bpf(BPF_PROG_LOAD, &a);
	if (fd < 0) {
		int e = errno;
		printf("LAB %s load=refused errno=%d (%s)\n", what, e, strerror(e));
		printf("LAB-LOG %s verifier log:\n%s\n", what, verifier_log);
		errno = e;
	}
	return fd;
}

static int array_map(int slots)
{
	union bpf_attr a;
	memset(&a, 0, sizeof a);
	a.map_type = BPF_MAP_TYPE_ARRAY;
	a.key_size = 4;
	a.value_size = 8;
	a.max_entries = slots;
	int fd = sys_bpf(BPF_MAP_CREATE, &a);
	if (fd < 0) {
		printf("LAB error map_create errno=%d (%s)\n", errno, strerror(errno));
		exit(1);
	}
	return fd;
}

static uint64_t map_get(int map_fd, uint32_t slot)
{
	uint64_t v = 0;
	union bpf_attr a;
	memset(&a, 0, sizeof a);
	a.map_fd = map_fd;
	a.key = (uintptr_t)&slot;
	a.value = (uintptr_t)&v;
	if (sys_bpf(BPF_MAP_LOOKUP_ELEM, &a) < 0)
		return (uint64_t)-1;
	return v;
}

/* Attach a tracing / LSM program (fentry, fexit, lsm): the link lives as long as the fd. */
static int attach_btf_prog(int prog_fd)
{
	union bpf_attr a;
	memset(&a, 0, sizeof a);
	a.raw_tracepoint.prog_fd = prog_fd;
	return sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &a);
}

/* ---- BTF: find a FUNC by name in vmlinux or in a module's split BTF ----------------------- */

struct btf_file {
	uint8_t *data;
	size_t len;
	const struct btf_header *hdr;
	const char *strs;
	uint32_t n_types;
};

static int read_file(const char *path, uint8_t **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t cap = 1 << 20, n = 0;
	uint8_t *buf = malloc(cap);
	for (;;) {
		if (n == cap)
			buf = realloc(buf, cap *= 2);
		ssize_t r = read(fd, buf + n, cap - n);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	*out = buf;
	*len = n;
	return 0;
}

/* Size of the data that follows a btf_type of this kind, or -1 for an unknown kind. */
static long btf_extra(uint32_t info)
{
	uint32_t kind = (info >> 24) & 0x1f, vlen = info & 0xffff;
	switch (kind) {
	case 1: return 4;                /* INT */
	case 3: return 12;               /* ARRAY */
	case 4: case 5: return 12L * vlen; /* STRUCT, UNION */
	case 6: return 8L * vlen;        /* ENUM */
	case 13: return 8L * vlen;       /* FUNC_PROTO */
	case 14: return 4;               /* VAR */
	case 15: return 12L * vlen;      /* DATASEC */
	case 17: return 4;               /* DECL_TAG */
	case 19: return 12L * vlen;      /* ENUM64 */
	case 2: case 7: case 8: case 9: case 10: case 11: case 12: case 16: case 18: return 0;
	default: return -1;
	}
}

static int btf_open(const char *path, struct btf_file *b)
{
	memset(b, 0, sizeof *b);
	if (read_file(path, &b->data, &b->len) < 0 || b->len < sizeof(struct btf_header))
		return -1;
	b->hdr = (const struct btf_header *)b->data;
	if (b->hdr->magic != 0xeB9F)
		return -1;
	b->strs = (const char *)b->data + b->hdr->hdr_len + b->hdr->str_off;
	return 0;
}

/*
 * Walks `b`'s types; ids start at `first_id` (1 for vmlinux, vmlinux's count + 1 for a module's
 * split BTF). Returns the id of the FUNC named `name` (0 if none) and sets b->n_types.
 * `base` resolves names below the module's own string section.
 */
static uint32_t btf_find_func(struct btf_file *b, const struct btf_file *base, uint32_t first_id,
			      const char *name)
{
	const uint8_t *t = b->data + b->hdr->hdr_len + b->hdr->type_off;
	const uint8_t *end = t + b->hdr->type_len;
	uint32_t id = first_id, found = 0;
	uint32_t base_str_len = base ? base->hdr->str_len : 0;
	while (t + 12 <= end) {
		uint32_t name_off, info;
		memcpy(&name_off, t, 4);
		memcpy(&info, t + 4, 4);
		long extra = btf_extra(info);
		if (extra < 0)
			return 0;
		if (((info >> 24) & 0x1f) == 12 && !found) {
			const char *s = name_off < base_str_len ? base->strs + name_off
								: b->strs + (name_off - base_str_len);
			if (strcmp(s, name) == 0)
				found = id;
		}
		t += 12 + extra;
		id++;
	}
	b->n_types = id - first_id;
	return found;
}

/* fd of the kernel BTF object named `name` ("amdgpu"), or -1. */
static int btf_obj_fd(const char *name)
{
	uint32_t id = 0;
	for (;;) {
		union bpf_attr a;
		memset(&a, 0, sizeof a);
		a.start_id = id;
		if (sys_bpf(BPF_BTF_GET_NEXT_ID, &a) < 0)
			return -1;
		id = a.next_id;
		memset(&a, 0, sizeof a);
		a.btf_id = id;
		int fd = sys_bpf(BPF_BTF_GET_FD_BY_ID, &a);
		if (fd < 0)
			continue;
		char obj_name[64] = {0};
		struct bpf_btf_info info;
		memset(&info, 0, sizeof info);
		info.name = (uintptr_t)obj_name;
		info.name_len = sizeof obj_name;
		memset(&a, 0, sizeof a);
		a.info.bpf_fd = fd;
		a.info.info_len = sizeof info;
		a.info.info = (uintptr_t)&info;
		if (sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &a) == 0 && strcmp(obj_name, name) == 0)
			return fd;
		close(fd);
	}
}

/* ---- kprobe ------------------------------------------------------------------------------- */

static int kprobe_pmu_type(void)
{
	FILE *f = fopen("/sys/bus/event_source/devices/kprobe/type", "r");
	int type = -1;
	if (f) {
		if (fscanf(f, "%d", &type) != 1)
			type = -1;
		fclose(f);
	}
	return type;
}

/* perf kprobe event on `func` (by name) or `addr` (by address); -errno on failure. */
static int perf_kprobe(int pmu, const char *func, uint64_t addr, int retprobe)
{
	struct perf_event_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.size = sizeof attr;
	attr.type = (uint32_t)pmu;
	attr.config = retprobe ? 1 : 0; /* format: config:0 = retprobe */
	if (func) {
		attr.config1 = (uintptr_t)func; /* kprobe_func */
		attr.config2 = 0;               /* offset */
	} else {
		attr.config1 = 0;
		attr.config2 = addr; /* kprobe_addr */
	}
	attr.sample_period = 1;
	attr.wakeup_events = 1;
	long fd = syscall(SYS_perf_event_open, &attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC);
	return fd < 0 ? -errno : (int)fd;
}

static int attach_perf(int perf_fd, int prog_fd)
{
	if (ioctl(perf_fd, PERF_EVENT_IOC_SET_BPF, prog_fd) < 0)
		return -errno;
	if (ioctl(perf_fd, PERF_EVENT_IOC_ENABLE, 0) < 0)
		return -errno;
	return 0;
}

/* pt_regs offsets of the 3rd argument and of the return value: rdx and rax on x86-64,
 * regs[2] and regs[0] on arm64. */
#if defined(__x86_64__)
#define PT_REGS_ARG3 96
#define PT_REGS_RET 80
#elif defined(__aarch64__)
#define PT_REGS_ARG3 16
#define PT_REGS_RET 0
#else
#error "lab-client: pt_regs offsets for this architecture are not known"
#endif

/* Entry program: map[0] += 1; map[1] = args->gpu_id read through the 3rd argument. */
static void prog_entry(struct prog *p, int map_fd, int arg3_off_in_ctx)
{
	mov_reg(p, R6, R1);
	mov_imm(p, R7, 1);
	map_update(p, map_fd, 0, R7, 1);
	ldx64(p, R3, R6, arg3_off_in_ctx);
	read_kernel_u32(p, 36); /* kfd_ioctl_create_queue_args.gpu_id */
	map_update(p, map_fd, 1, R8, 0);
	mov_imm(p, R0, 0);
	exit_insn(p);
}

/* Return program: map[2] += 1; map[3] = the return value. */
static void prog_return(struct prog *p, int map_fd, int ret_off_in_ctx)
{
	mov_reg(p, R6, R1);
	mov_imm(p, R7, 1);
	map_update(p, map_fd, 2, R7, 1);
	ldx64(p, R8, R6, ret_off_in_ctx);
	map_update(p, map_fd, 3, R8, 0);
	mov_imm(p, R0, 0);
	exit_insn(p);
}

/* One CREATE_QUEUE on a fresh /dev/kfd fd, then what the entry/return programs recorded. */
static void create_queue_and_report(const char *what, int map_fd)
{
	int kfd = open_or_die("/dev/kfd");
	long rc = create_queue(kfd, KFD_CREATE_QUEUE_96);
	printf("LAB %s create_queue rc=%ld\n", what, rc);
	close(kfd);
	printf("LAB %s entry_hits=%llu gpu_id=0x%llx return_hits=%llu ret=%d\n", what,
	       (unsigned long long)map_get(map_fd, 0), (unsigned long long)map_get(map_fd, 1),
	       (unsigned long long)map_get(map_fd, 2), (int)(int32_t)map_get(map_fd, 3));
}

/* Every address of `name` in module `mod` from /proc/kallsyms (text symbols only). */
static int kallsyms_addrs(const char *name, const char *mod, uint64_t *out, int max)
{
	FILE *f = fopen("/proc/kallsyms", "r");
	if (!f)
		return -1;
	char line[512], sym[256], modbuf[128];
	char type;
	unsigned long long addr;
	int n = 0;
	char want_mod[140];
	snprintf(want_mod, sizeof want_mod, "[%s]", mod);
	while (fgets(line, sizeof line, f)) {
		modbuf[0] = 0;
		if (sscanf(line, "%llx %c %255s %127s", &addr, &type, sym, modbuf) < 3)
			continue;
		if ((type == 't' || type == 'T') && strcmp(sym, name) == 0 && strcmp(modbuf, want_mod) == 0 &&
		    n < max)
			out[n++] = addr;
	}
	fclose(f);
	return n;
}

static int cmd_kprobe(void)
{
	int pmu = kprobe_pmu_type();
	printf("LAB kprobe pmu_type=%d\n", pmu);
	if (pmu < 0)
		return 1;
	int map = array_map(4);
	struct prog entry = {0}, ret = {0};
	prog_entry(&entry, map, PT_REGS_ARG3);
	prog_return(&ret, map, PT_REGS_RET);
	int pe = load_prog("kprobe", &entry, BPF_PROG_TYPE_KPROBE, 0, 0, 0);
	int pr = load_prog("kretprobe", &ret, BPF_PROG_TYPE_KPROBE, 0, 0, 0);
	if (pe < 0 || pr < 0)
		return 1;
	int ke = perf_kprobe(pmu, "kfd_ioctl_create_queue", 0, 0);
	int kr = perf_kprobe(pmu, "kfd_ioctl_create_queue", 0, 1);
	printf("LAB kprobe attach_by_name=kfd_ioctl_create_queue entry=%s ret=%s\n",
	       ke >= 0 ? "ok" : strerror(-ke), kr >= 0 ? "ok" : strerror(-kr));
	if (ke < 0 || kr < 0 || attach_perf(ke, pe) < 0 || attach_perf(kr, pr) < 0) {
		printf("LAB kprobe attach=failed\n");
		return 1;
	}
	create_queue_and_report("kprobe", map);
	close(ke);
	close(kr);

	/* An ambiguous static name: by name the kernel refuses (EADDRNOTAVAIL), by address each
	 * copy attaches. */
	uint64_t addrs[16];
	int n = kallsyms_addrs("init_mqd", "amdgpu", addrs, 16);
	int by_name = perf_kprobe(pmu, "init_mqd", 0, 0);
	printf("LAB kprobe ambiguous=init_mqd copies=%d by_name=%s errno=%d\n", n,
	       by_name >= 0 ? "ok" : "refused", by_name >= 0 ? 0 : -by_name);
	if (by_name >= 0)
		close(by_name);
	int attached = 0;
	for (int i = 0; i < n; i++) {
		int fd = perf_kprobe(pmu, NULL, addrs[i], 0);
		if (fd >= 0 && attach_perf(fd, pe) == 0)
			attached++;
		else
			printf("LAB kprobe by_address=0x%llx failed=%s\n", (unsigned long long)addrs[i],
			       strerror(fd < 0 ? -fd : errno));
		if (fd >= 0)
			close(fd);
	}
	printf("LAB kprobe ambiguous=init_mqd by_address_attached=%d of=%d\n", attached, n);
	return 0;
}

/* ---- fentry / fexit through module BTF ---------------------------------------------------- */

static int cmd_fentry(void)
{
	struct btf_file vmlinux, amdgpu;
	if (btf_open("/sys/kernel/btf/vmlinux", &vmlinux) < 0 || btf_open("/sys/kernel/btf/amdgpu", &amdgpu) < 0) {
		printf("LAB fentry btf=missing\n");
		return 1;
	}
	btf_find_func(&vmlinux, NULL, 1, "");
	uint32_t id = btf_find_func(&amdgpu, &vmlinux, vmlinux.n_types + 1, "kfd_ioctl_create_queue");
	int obj = btf_obj_fd("amdgpu");
	printf("LAB fentry vmlinux_types=%u amdgpu_types=%u func_id=%u btf_obj_fd=%s\n", vmlinux.n_types,
	       amdgpu.n_types, id, obj >= 0 ? "ok" : "missing");
	if (!id || obj < 0)
		return 1;
	int map = array_map(4);
	struct prog entry = {0}, ret = {0};
	prog_entry(&entry, map, 16);  /* ctx[2]: void *data */
	prog_return(&ret, map, 24);   /* ctx[3]: the return value after the 3 arguments */
	int pe = load_prog("fentry", &entry, BPF_PROG_TYPE_TRACING, BPF_TRACE_FENTRY, id, obj);
	int pr = load_prog("fexit", &ret, BPF_PROG_TYPE_TRACING, BPF_TRACE_FEXIT, id, obj);
	if (pe < 0 || pr < 0)
		return 1;
	int le = attach_btf_prog(pe);
	int le_errno = errno;
	int lr = attach_btf_prog(pr);
	printf("LAB fentry attach entry=%s exit=%s\n", le >= 0 ? "ok" : strerror(le_errno),
	       lr >= 0 ? "ok" : strerror(errno));
	if (le < 0 || lr < 0)
		return 1;
	create_queue_and_report("fentry", map);
	return 0;
}

/* ---- BPF LSM on file_ioctl ---------------------------------------------------------------- */

/*
 * file_ioctl(struct file *file, unsigned int cmd, unsigned long arg), ctx[3] = the verdict of the
 * BPF LSM programs that ran before. Keeps an earlier denial; counts calls (map[0]); for
 * CREATE_QUEUE ((cmd & 0xffff) == 0x4B02, both sizes) from process `tgid` counts (map[1]) and
 * returns -EPERM.
 */
static void prog_lsm(struct prog *p, int map_fd, uint32_t tgid)
{
	mov_reg(p, R6, R1);
	ldx64(p, R0, R6, 24);
	emit(p, BPF_JMP | BPF_JSGT | BPF_K, R0, 0, 3, 0);      /* r0 > 0: not a verdict, go on */
	emit(p, BPF_JMP | BPF_JSLT | BPF_K, R0, 0, 2, -4095);  /* r0 < -4095: same */
	emit(p, BPF_JMP | BPF_JEQ | BPF_K, R0, 0, 1, 0);       /* 0: go on */
	exit_insn(p);                                          /* an earlier denial stands */
	mov_imm(p, R7, 1);
	map_update(p, map_fd, 0, R7, 1);
	ldx64(p, R2, R6, 8);
	emit(p, BPF_ALU64 | BPF_AND | BPF_K, R2, 0, 0, 0xffff);
	int j1 = p->n;
	emit(p, BPF_JMP | BPF_JNE | BPF_K, R2, 0, 0 /* patched */, 0x4B02);
	call(p, BPF_FUNC_get_current_pid_tgid);
	emit(p, BPF_ALU64 | BPF_RSH | BPF_K, R0, 0, 0, 32);
	int j2 = p->n;
	emit(p, BPF_JMP | BPF_JNE | BPF_K, R0, 0, 0 /* patched */, (int32_t)tgid);
	map_update(p, map_fd, 1, R7, 1);
	mov_imm(p, R0, -EPERM);
	exit_insn(p);
	int allow = p->n;
	p->insn[j1].off = (int16_t)(allow - j1 - 1);
	p->insn[j2].off = (int16_t)(allow - j2 - 1);
	mov_imm(p, R0, 0);
	exit_insn(p);
}

static long create_queue_in_child(void)
{
	int pipefd[2];
	if (pipe(pipefd) < 0)
		return -9999;
	pid_t pid = fork();
	if (pid == 0) {
		int kfd = open("/dev/kfd", O_RDWR | O_CLOEXEC);
		long rc = kfd < 0 ? -errno : create_queue(kfd, KFD_CREATE_QUEUE_96);
		if (write(pipefd[1], &rc, sizeof rc) != sizeof rc)
			_exit(1);
		_exit(0);
	}
	long rc = -9999;
	if (read(pipefd[0], &rc, sizeof rc) != sizeof rc)
		rc = -9999;
	waitpid(pid, NULL, 0);
	close(pipefd[0]);
	close(pipefd[1]);
	return rc;
}

static int cmd_lsm(void)
{
	struct btf_file vmlinux;
	if (btf_open("/sys/kernel/btf/vmlinux", &vmlinux) < 0) {
		printf("LAB lsm btf=missing\n");
		return 1;
	}
	uint32_t id = btf_find_func(&vmlinux, NULL, 1, "bpf_lsm_file_ioctl");
	printf("LAB lsm hook=bpf_lsm_file_ioctl btf_id=%u\n", id);
	if (!id)
		return 1;
	int map = array_map(2);
	struct prog p = {0};
	prog_lsm(&p, map, (uint32_t)getpid());
	int fd = load_prog("lsm", &p, BPF_PROG_TYPE_LSM, BPF_LSM_MAC, id, 0);
	if (fd < 0)
		return 1;
	int kfd = open_or_die("/dev/kfd");
	long before = create_queue(kfd, KFD_CREATE_QUEUE_96);
	int link = attach_btf_prog(fd);
	printf("LAB lsm load=ok attach=%s\n", link >= 0 ? "ok" : strerror(errno));
	if (link < 0)
		return 1;
	long denied96 = create_queue(kfd, KFD_CREATE_QUEUE_96);
	long denied88 = create_queue(kfd, KFD_CREATE_QUEUE_88);
	uint32_t ver[2];
	long version = xioctl(kfd, KFD_GET_VERSION, ver);
	long child = create_queue_in_child();
	uint64_t calls = map_get(map, 0), denials = map_get(map, 1);
	close(link);
	long after = create_queue(kfd, KFD_CREATE_QUEUE_96);
	close(kfd);
	printf("LAB lsm self_before=%ld self_denied96=%ld self_denied88=%ld self_get_version=%ld "
	       "other_process=%ld self_after_detach=%ld\n",
	       before, denied96, denied88, version, child, after);
	printf("LAB lsm program_calls=%llu program_denials=%llu\n", (unsigned long long)calls,
	       (unsigned long long)denials);
	return 0;
}

static int cmd_fork(const char *sub);

/* `nvdeny32`: becomes the 32-bit x86 client (lab/client32.c, /bin/lab-client32), the same
 * process: its schedules take the compat ioctl path (LSM hook file_ioctl_compat). */
static int cmd_exec32(void)
{
	char *argv[] = {"lab-client32", NULL};
	fflush(stdout);
	execv("/bin/lab-client32", argv);
	printf("LAB nvdeny32 exec_errno=%d\n", errno);
	return 1;
}

static int run(const char *c)
{
	if (!strcmp(c, "facts")) return cmd_facts();
	if (!strcmp(c, "nv")) return cmd_nv();
	if (!strcmp(c, "nvdev")) return cmd_nvdev();
	if (!strcmp(c, "nvdeny")) return cmd_nvdeny();
	if (!strcmp(c, "nvdeny-finn")) return cmd_nvdeny_finn();
	if (!strncmp(c, "fork-", 5)) return cmd_fork(c + 5);
	if (!strcmp(c, "nvobj")) return cmd_nvobj();
	if (!strcmp(c, "kfd-create")) return cmd_kfd_create();
	if (!strcmp(c, "kfd-deny")) return cmd_kfd_deny();
	if (!strcmp(c, "kfd-ops")) return cmd_kfd_ops();
	if (!strcmp(c, "kprobe")) return cmd_kprobe();
	if (!strcmp(c, "fentry")) return cmd_fentry();
	if (!strcmp(c, "lsm")) return cmd_lsm();
	if (!strcmp(c, "nvdeny32")) return cmd_exec32();
	fprintf(stderr, "unknown subcommand %s\n", c);
	return 2;
}

/* `fork-SUB` (issue 26: --deny-pid must cover what a denied process creates): the parent prints
 * its child's pid and exits at once; the child waits (at most 30 s) until it has been
 * reparented, so that it runs SUB after its parent is gone, then prints `LAB fork_child done`
 * (lab/init.sh waits for that line: the child is no longer the shell's job). */
static int cmd_fork(const char *sub)
{
	pid_t parent = getpid();
	fflush(stdout);
	pid_t child = fork();
	if (child < 0) {
		printf("LAB error fork errno=%d\n", errno);
		return 1;
	}
	if (child > 0) {
		printf("LAB fork_parent pid=%d child=%d\n", parent, child);
		return 0;
	}
	for (int i = 0; i < 30000 && getppid() == parent; i++)
		usleep(1000);
	printf("LAB fork_child pid=%d parent=%d ppid=%d reparented=%d\n", getpid(), parent,
	       getppid(), getppid() != parent);
	int rc = run(sub);
	printf("LAB fork_child done rc=%d\n", rc);
	return rc;
}

/* `storm SUB`: STORM_N unrelated system calls (getppid, and FIONREAD ioctls on a pipe), then SUB,
 * then what SUB did to the driver: so that a tracer's program run counts can be checked against
 * both (the driver hooks must not run for the storm, and must run once per driver call). */
#define STORM_N 100000
static int cmd_storm(const char *sub)
{
	int p[2], avail, rc;
	long bad = 0;

	if (pipe(p) != 0) {
		printf("LAB error storm=pipe errno=%d\n", errno);
		return 1;
	}
	for (int i = 0; i < STORM_N; i++) {
		syscall(SYS_getppid);
		if (ioctl(p[0], FIONREAD, &avail) != 0)
			bad++;
	}
	close(p[0]);
	close(p[1]);
	driver_ioctls = driver_opens = 0;
	rc = run(sub);
	printf("LAB storm getppid=%d pipe_ioctls=%d pipe_ioctl_failures=%ld sub=%s driver_ioctls=%lu "
	       "driver_opens=%lu rc=%d\n",
	       STORM_N, STORM_N, bad, sub, driver_ioctls, driver_opens, rc);
	return rc;
}

/* `wait FILE SUB`: print this process's pid, wait (at most 300 s) until FILE exists, run SUB. So
 * that a tracer can be started with this pid (gpu-trace --deny-pid) before the calls are made. */
static int cmd_wait(const char *file, const char *sub)
{
	printf("LAB wait pid=%d\n", getpid());
	for (int i = 0; i < 30000 && access(file, F_OK) != 0; i++)
		usleep(10000);
	if (access(file, F_OK) != 0) {
		printf("LAB error wait=%s timed_out\n", file);
		return 1;
	}
	return run(sub);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && !strcmp(argv[1], "wait"))
		return cmd_wait(argv[2], argv[3]);
	if (argc == 3 && !strcmp(argv[1], "storm"))
		return cmd_storm(argv[2]);
	if (argc != 2) {
		fprintf(stderr, "usage: %s [wait FILE | storm] facts|nv|nvdev|nvdeny|nvdeny32|nvobj|kfd-create|kfd-deny|kfd-ops|kprobe|fentry|lsm\n",
			argv[0]);
		return 2;
	}
	return run(argv[1]);
}
