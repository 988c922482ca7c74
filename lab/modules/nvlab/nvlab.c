// SPDX-License-Identifier: GPL-2.0
/*
 * nvlab: an NVIDIA-like test device for the gpu-trace lab (docs/lab.md). Built by
 * `cargo xtask lab` against the lab kernel's Debian headers and loaded in the QEMU guest only.
 *
 * Registers character major 195 (the NVIDIA driver's; the guest's init creates /dev/nvidiactl,
 * minor 255) and answers the RM escapes gpu-trace decodes (RM_ALLOC with NVOS21/NVOS64,
 * RM_CONTROL with NVOS54, RM_FREE with NVOS00, each direct or wrapped in NV_ESC_IOCTL_XFER_CMD)
 * the way the real driver reports success: the syscall returns 0 and the parameter block's
 * `status` field is NV_OK. It keeps no objects and checks no handles: every call succeeds. So
 * the lab can show gpu-trace's success path (TASK_INIT, SCHEDULE allowed=yes, TASK_DESTROY) and
 * a BPF LSM refusing a schedule before it reaches the driver, on a real kernel without a GPU.
 * Layouts: docs/driver-abi.md A1, A2.
 *
 * It also stands in for a gpu_ext-patched driver (eunomia-bpf/gpu_ext-kernel-modules): it has
 * that fork's scheduling hook functions, global and noinline, each taking a pointer to a context
 * struct filled on the caller's stack, with the fork's newest layouts (gpu-trace-common's
 * nvidia::gpu_ext gives the offsets), called where the fork calls them: task_init when a TSG
 * (class 0xA06C) is allocated, bind on GPFIFO_SCHEDULE of a TSG, task_destroy when it is freed.
 * It hands out hardware TSG ids 1, 2, ... and counts the channels allocated under each TSG, so
 * that gpu-trace's deep hooks have something real to attach to and read. It is not the driver:
 * the values are this module's own.
 */
#include <linux/build_bug.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>

#define NV_MAJOR 195
#define NV_IOCTL_MAGIC 'F'
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
#define NV_ESC_IOCTL_XFER_CMD 0xD3
#define NV_OK 0u

struct nv_ioctl_xfer {
	u32 cmd;
	u32 size;
	u64 ptr;
};

static atomic64_t nvlab_calls = ATOMIC64_INIT(0);

/* ---- gpu_ext hook stand-ins --------------------------------------------------------------- */

#define NVLAB_TIMESLICE_US 3000u /* this module's "driver default" (the real one's is 1024) */
#define NVLAB_RUNLIST 13u
#define NVLAB_INTERLEAVE_MEDIUM 1u
#define NVLAB_MAX_TSGS 64

struct nv_gpu_task_init_ctx {
	u64 tsg_id;
	u32 engine_type;
	u64 default_timeslice;
	u32 default_interleave;
	u32 runlist_id;
};
struct nv_gpu_bind_ctx {
	u64 tsg_id;
	u32 runlist_id;
	u32 channel_count;
	u64 timeslice_us;
	u32 interleave_level;
	u32 allow;
};
struct nv_gpu_token_request_ctx {
	u32 channel_id;
	u64 tsg_id;
	u32 token;
};
struct nv_gpu_task_destroy_ctx {
	u64 tsg_id;
};
static_assert(sizeof(struct nv_gpu_task_init_ctx) == 32);
static_assert(sizeof(struct nv_gpu_bind_ctx) == 32);
static_assert(sizeof(struct nv_gpu_token_request_ctx) == 24);

/*
 * The hooks: global, never inlined, with a body the compiler cannot drop. barrier_data() tells
 * the compiler the body may read the context through its pointer: with a plain barrier() GCC 12
 * saw that the body reads nothing and dropped the caller's stores into the context (seen in the
 * lab: every hook read zeros).
 */
void nv_gpu_sched_task_init(struct nv_gpu_task_init_ctx *ctx);
void nv_gpu_sched_bind(struct nv_gpu_bind_ctx *ctx);
void nv_gpu_sched_token_request(struct nv_gpu_token_request_ctx *ctx);
void nv_gpu_sched_task_destroy(struct nv_gpu_task_destroy_ctx *ctx);
noinline void nv_gpu_sched_task_init(struct nv_gpu_task_init_ctx *ctx) { barrier_data(ctx); }
noinline void nv_gpu_sched_bind(struct nv_gpu_bind_ctx *ctx) { barrier_data(ctx); }
noinline void nv_gpu_sched_token_request(struct nv_gpu_token_request_ctx *ctx) { barrier_data(ctx); }
noinline void nv_gpu_sched_task_destroy(struct nv_gpu_task_destroy_ctx *ctx) { barrier_data(ctx); }
EXPORT_SYMBOL(nv_gpu_sched_task_init);
EXPORT_SYMBOL(nv_gpu_sched_bind);
EXPORT_SYMBOL(nv_gpu_sched_token_request);
EXPORT_SYMBOL(nv_gpu_sched_task_destroy);

/* TSGs by RM handle (any client: the lab's clients use distinct handles). */
static struct {
	u32 handle;
	u32 hw_id;
	u32 channels;
} nvlab_tsgs[NVLAB_MAX_TSGS];
static u32 nvlab_next_hw_id = 1;
static DEFINE_SPINLOCK(nvlab_lock);

static int tsg_slot(u32 handle)
{
	int i;

	for (i = 0; i < NVLAB_MAX_TSGS; i++)
		if (nvlab_tsgs[i].hw_id && nvlab_tsgs[i].handle == handle)
			return i;
	return -1;
}

/* After a successful escape: call the hooks where the fork's RM would. */
static void nvlab_hooks(unsigned int escape, unsigned int size, void __user *params)
{
	u32 p[4]; /* the first four 32-bit fields of the block */
	int i;

	if (size < sizeof(p) || copy_from_user(p, params, sizeof(p)))
		return;
	if (escape == NV_ESC_RM_ALLOC && p[3] == 0xA06C) { /* hRoot, hParent, hNew, hClass */
		struct nv_gpu_task_init_ctx ctx = {0};

		spin_lock(&nvlab_lock);
		for (i = 0; i < NVLAB_MAX_TSGS && nvlab_tsgs[i].hw_id; i++)
			;
		if (i < NVLAB_MAX_TSGS) {
			nvlab_tsgs[i].handle = p[2];
			nvlab_tsgs[i].hw_id = nvlab_next_hw_id++;
			nvlab_tsgs[i].channels = 0;
			ctx.tsg_id = nvlab_tsgs[i].hw_id;
		}
		spin_unlock(&nvlab_lock);
		if (!ctx.tsg_id)
			return;
		ctx.engine_type = 1;
		ctx.default_timeslice = NVLAB_TIMESLICE_US;
		ctx.default_interleave = NVLAB_INTERLEAVE_MEDIUM;
		ctx.runlist_id = NVLAB_RUNLIST;
		nv_gpu_sched_task_init(&ctx);
	} else if (escape == NV_ESC_RM_ALLOC) { /* a channel under a known TSG */
		spin_lock(&nvlab_lock);
		i = tsg_slot(p[1]);
		if (i >= 0)
			nvlab_tsgs[i].channels++;
		spin_unlock(&nvlab_lock);
	} else if (escape == NV_ESC_RM_CONTROL && p[2] == 0xA06C0101) { /* hClient, hObject, cmd */
		struct nv_gpu_bind_ctx ctx = {0};

		spin_lock(&nvlab_lock);
		i = tsg_slot(p[1]);
		if (i >= 0) {
			ctx.tsg_id = nvlab_tsgs[i].hw_id;
			ctx.channel_count = nvlab_tsgs[i].channels;
		}
		spin_unlock(&nvlab_lock);
		if (i < 0)
			return;
		ctx.runlist_id = NVLAB_RUNLIST;
		ctx.timeslice_us = NVLAB_TIMESLICE_US;
		ctx.interleave_level = NVLAB_INTERLEAVE_MEDIUM;
		ctx.allow = 1;
		nv_gpu_sched_bind(&ctx);
	} else if (escape == NV_ESC_RM_FREE) { /* hRoot, hParent, hObjectOld */
		struct nv_gpu_task_destroy_ctx ctx = {0};

		spin_lock(&nvlab_lock);
		i = tsg_slot(p[2]);
		if (i >= 0) {
			ctx.tsg_id = nvlab_tsgs[i].hw_id;
			nvlab_tsgs[i].hw_id = 0;
		}
		spin_unlock(&nvlab_lock);
		if (i >= 0)
			nv_gpu_sched_task_destroy(&ctx);
	}
}

/* Offset of `status` in the escape's parameter block of this size; -1 for an unknown shape. */
static int status_offset(unsigned int escape, unsigned int size)
{
	switch (escape) {
	case NV_ESC_RM_FREE: /* NVOS00: hRoot, hObjectParent, hObjectOld, status */
		return size == 16 ? 12 : -1;
	case NV_ESC_RM_CONTROL: /* NVOS54: ..., params @16, paramsSize @24, status @28 */
		return size == 32 ? 28 : -1;
	case NV_ESC_RM_ALLOC: /* NVOS64 (48 bytes): status @40; NVOS21 (32 bytes): status @28 */
		return size == 48 ? 40 : size == 32 ? 28 : -1;
	}
	return -1;
}

static long nvlab_escape(unsigned int escape, unsigned int size, void __user *params)
{
	int off = status_offset(escape, size);

	if (off < 0)
		return -EINVAL;
	if (put_user(NV_OK, (u32 __user *)((u8 __user *)params + off)))
		return -EFAULT;
	atomic64_inc(&nvlab_calls);
	nvlab_hooks(escape, size, params);
	return 0;
}

static long nvlab_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *p = (void __user *)arg;
	struct nv_ioctl_xfer x;

	if (_IOC_TYPE(cmd) != NV_IOCTL_MAGIC)
		return -ENOTTY;
	if (_IOC_NR(cmd) != NV_ESC_IOCTL_XFER_CMD)
		return nvlab_escape(_IOC_NR(cmd), _IOC_SIZE(cmd), p);
	if (_IOC_SIZE(cmd) != sizeof(x) || copy_from_user(&x, p, sizeof(x)))
		return -EINVAL;
	return nvlab_escape(x.cmd, x.size, u64_to_user_ptr(x.ptr));
}

static const struct file_operations nvlab_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = nvlab_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static int __init nvlab_init(void)
{
	int rc = register_chrdev(NV_MAJOR, "nvidia-lab", &nvlab_fops);

	if (rc < 0)
		return rc;
	pr_info("nvlab: NVIDIA-like test device on char major %d\n", NV_MAJOR);
	return 0;
}

static void __exit nvlab_exit(void)
{
	unregister_chrdev(NV_MAJOR, "nvidia-lab");
	pr_info("nvlab: %lld calls answered\n", (long long)atomic64_read(&nvlab_calls));
}

module_init(nvlab_init);
module_exit(nvlab_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gpu-trace lab: NVIDIA-like test device answering RM escapes with NV_OK, with gpu_ext's scheduling hook functions");
