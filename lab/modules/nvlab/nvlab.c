// SPDX-License-Identifier: GPL-2.0
/*
 * nvlab: an NVIDIA-like test device for the gpu-trace lab (docs/lab.md). Built by
 * `cargo xtask lab` against the lab kernel's Debian headers and loaded in the QEMU guest only.
 *
 * Registers character major 195 (the NVIDIA driver's; the guest's init creates /dev/nvidiactl,
 * minor 255) and answers the RM escapes gpu-trace decodes (RM_ALLOC with NVOS21/NVOS64,
 * RM_CONTROL with NVOS54, RM_FREE with NVOS00, each direct or wrapped in NV_ESC_IOCTL_XFER_CMD)
 * the way the real driver answers: the syscall returns 0 and the parameter block's `status`
 * field holds RM's status. Layouts: docs/driver-abi.md A1, A2.
 *
 * It is a small RM of its own, independent of gpu-trace (issue 20): each open file has an
 * object table (clients, devices, TSGs, channels, anything else, each with its parent and
 * class; freed with the file). It refuses what RM refuses, with the status RM answers
 * (open-gpu-kernel-modules 595.45.04, checked in its source; see nvlab_alloc, nvlab_free,
 * nvlab_control): an unknown client, an unknown parent, a parent of the wrong class, a handle
 * in use, a control on an unknown object. Freeing an object frees everything under it. It hands
 * out its own hardware TSG ids (1, 2, ... per module load) and channel ids (1, 2, ...), answers
 * NVA06C_CTRL_CMD_GET_INFO with the TSG's id and NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN
 * with the token (runlist 13 << 16) | channel id.
 *
 * It also stands in for a gpu_ext-patched driver (eunomia-bpf/gpu_ext-kernel-modules): it has
 * that fork's scheduling hook functions, global and noinline, each taking a pointer to a context
 * struct filled on the caller's stack, with the fork's newest layouts (the fork's own structs,
 * checked field by field by gpu-trace/tests/gpu_ext_abi.rs), called where the fork calls them, with this module's own
 * values: task_init when a TSG (class 0xA06C) is allocated, bind on GPFIFO_SCHEDULE of a TSG
 * (channel_count: the channel objects this module holds under it), token_request when it hands
 * out a work-submit token, task_destroy when a TSG is freed (itself, with an ancestor, or at
 * close). It is not the driver: the values are this module's own.
 */
#include <linux/build_bug.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

/*
 * ABI constants, each written from NVIDIA's open-gpu-kernel-modules headers (tag 580.142 unless
 * said otherwise), not from gpu-trace: this module must not agree with the tracer by
 * construction (issue 26).
 */
/* kernel-open/common/inc/nv-chardev-numbers.h: NV_MAJOR_DEVICE_NUMBER. */
#define NV_MAJOR 195
/* src/nvidia/arch/nvalloc/unix/include/nv_escape.h: NV_ESC_RM_FREE, _RM_CONTROL, _RM_ALLOC. */
#define NV_ESC_RM_FREE 0x29
#define NV_ESC_RM_CONTROL 0x2A
#define NV_ESC_RM_ALLOC 0x2B
/* kernel-open/common/inc/nv-ioctl-numbers.h: NV_IOCTL_BASE 200 + 11. (NV_IOCTL_MAGIC 'F', in
 * the same header, is not used: nvidia_ioctl() in kernel-open/nvidia/nv.c takes _IOC_NR and
 * _IOC_SIZE of the command and never looks at _IOC_TYPE or _IOC_DIR; neither does this.) */
#define NV_ESC_IOCTL_XFER_CMD 0xD3
/* kernel-open/common/inc/nv.h: NV_ABSOLUTE_MAX_IOCTL_SIZE (an XFER's size above it: -EINVAL). */
#define NV_ABSOLUTE_MAX_IOCTL_SIZE 16384

/* Classes: src/common/sdk/nvidia/inc/class/cl0000.h (NV01_ROOT), cl0001.h (NV01_ROOT_NON_PRIV),
 * cl0041.h (NV01_ROOT_CLIENT), cl0080.h (NV01_DEVICE_0), cl2080.h (NV20_SUBDEVICE_0),
 * cla06c.h (KEPLER_CHANNEL_GROUP_A). */
#define NV01_ROOT 0x0000u
#define NV01_ROOT_NON_PRIV 0x0001u
#define NV01_ROOT_CLIENT 0x0041u
#define NV01_DEVICE_0 0x0080u
#define NV20_SUBDEVICE_0 0x2080u
#define KEPLER_CHANNEL_GROUP_A 0xA06Cu

/* Controls: src/common/sdk/nvidia/inc/ctrl/ctrla06c.h (NVA06C_CTRL_CMD_GPFIFO_SCHEDULE,
 * NVA06C_CTRL_CMD_GET_INFO), ctrl/ctrlc36f.h (NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN). */
#define NVA06C_CTRL_CMD_GPFIFO_SCHEDULE 0xA06C0101u      /* {bEnable, bSkipSubmit, bSkipEnable} */
#define NVA06C_CTRL_CMD_GET_INFO 0xA06C0106u             /* {NvU32 tsgID} */
#define NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN 0xC36F0108u /* {NvU32 workSubmitToken} */

/* RM status codes (src/common/sdk/nvidia/inc/nvstatuscodes.h, 595.45.04). */
#define NV_OK 0x00000000u
#define NV_ERR_INSERT_DUPLICATE_NAME 0x00000019u
#define NV_ERR_INVALID_ADDRESS 0x0000001Eu
#define NV_ERR_INVALID_CLIENT 0x00000023u
#define NV_ERR_INVALID_OBJECT_HANDLE 0x00000033u
#define NV_ERR_INVALID_OBJECT_PARENT 0x00000036u
#define NV_ERR_INVALID_PARAM_STRUCT 0x0000003Au
#define NV_ERR_NO_MEMORY 0x00000051u
#define NV_ERR_OBJECT_NOT_FOUND 0x00000057u

/* kernel-open/common/inc/nv-ioctl.h: nv_ioctl_xfer_t {NvU32 cmd; NvU32 size; NvP64 ptr}. */
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

/* ---- the object table ----------------------------------------------------------------------
 *
 * One table per open file (RM keeps its clients server-wide; the lab's clients never share one
 * across files, so per file is enough here). An object is (client, handle) with its parent's
 * handle and its class; a client is the object whose handle is its own client handle. TSGs carry
 * the hardware id this module gave them, channels their channel id and their TSG (0: a channel
 * on a device). Freed with their parent, and all of them when the file is released.
 */
struct nvlab_obj {
	struct list_head node;
	u32 client;
	u32 handle;
	u32 parent;
	u32 class;
	u32 hw_id; /* TSG: hardware TSG id */
	u32 chid;  /* channel: channel id */
};

struct nvlab_file {
	struct mutex lock;
	struct list_head objs;
};

static atomic_t nvlab_next_hw_id = ATOMIC_INIT(0);  /* hardware TSG ids 1, 2, ... */
static atomic_t nvlab_next_chid = ATOMIC_INIT(0);   /* channel ids 1, 2, ... */

static bool is_client_class(u32 class)
{
	return class == NV01_ROOT || class == NV01_ROOT_NON_PRIV || class == NV01_ROOT_CLIENT;
}

/* The GPFIFO channel classes of the 580 driver: src/common/sdk/nvidia/inc/class/cla06f.h,
 * cla16f.h, cla26f.h (KEPLER_CHANNEL_GPFIFO_A/B/C), clb06f.h (MAXWELL_), clc06f.h (PASCAL_),
 * clc36f.h (VOLTA_), clc46f.h (TURING_), clc56f.h (AMPERE_), clc86f.h (HOPPER_), clc96f.h and
 * clca6f.h (BLACKWELL_CHANNEL_GPFIFO_A/B); RM's resource_list.h gives each the parents Device
 * and KernelChannelGroupApi. */
static bool is_channel_class(u32 class)
{
	switch (class) {
	case 0xA06F: case 0xA16F: case 0xA26F: case 0xB06F: case 0xC06F: case 0xC36F:
	case 0xC46F: case 0xC56F: case 0xC86F: case 0xC96F: case 0xCA6F:
		return true;
	}
	return false;
}

static struct nvlab_obj *obj_find(struct nvlab_file *f, u32 client, u32 handle)
{
	struct nvlab_obj *o;

	list_for_each_entry(o, &f->objs, node)
		if (o->client == client && o->handle == handle)
			return o;
	return NULL;
}

static struct nvlab_obj *client_find(struct nvlab_file *f, u32 client)
{
	struct nvlab_obj *o = obj_find(f, client, client);

	return o && is_client_class(o->class) ? o : NULL;
}

/* Channels of this module's table under TSG `tsg` of `client`. */
static u32 channel_count(struct nvlab_file *f, u32 client, u32 tsg)
{
	struct nvlab_obj *o;
	u32 n = 0;

	list_for_each_entry(o, &f->objs, node)
		if (o->client == client && o->parent == tsg && is_channel_class(o->class))
			n++;
	return n;
}

/* Hardware ids of the TSGs an object's free takes with it, collected for task_destroy. */
#define NVLAB_MAX_DESTROY 16
struct nvlab_destroyed {
	u32 n;
	u32 hw_id[NVLAB_MAX_DESTROY];
};

/* Frees `o` and everything under it (children first, as RM frees a resource tree). */
static void obj_free_tree(struct nvlab_file *f, struct nvlab_obj *o, struct nvlab_destroyed *d)
{
	struct nvlab_obj *c, *tmp;

again:
	list_for_each_entry_safe(c, tmp, &f->objs, node) {
		if (c != o && c->client == o->client && c->parent == o->handle) {
			obj_free_tree(f, c, d);
			goto again; /* the list changed under the iteration */
		}
	}
	if (o->hw_id && d->n < NVLAB_MAX_DESTROY)
		d->hw_id[d->n++] = o->hw_id;
	list_del(&o->node);
	kfree(o);
}

static void call_task_destroy(const struct nvlab_destroyed *d)
{
	u32 i;

	for (i = 0; i < d->n; i++) {
		struct nv_gpu_task_destroy_ctx ctx = {.tsg_id = d->hw_id[i]};

		nv_gpu_sched_task_destroy(&ctx);
	}
}

/* ---- the escapes ------------------------------------------------------------------------- */

/*
 * RM_ALLOC. Checks in this order, each with the status RM (open-gpu-kernel-modules 595.45.04,
 * resserv and rmapi/alloc_free.c) answers: a client class allocates a client (hObjectNew is the
 * client handle; one already in use: NV_ERR_INSERT_DUPLICATE_NAME); otherwise hRoot must be a
 * client (else NV_ERR_INVALID_OBJECT_HANDLE, as RM's client lock lookup answers), hObjectNew
 * neither 0 nor the client (NV_ERR_INVALID_OBJECT_HANDLE; RM would generate a handle for 0, this
 * module does not) nor in use (NV_ERR_INSERT_DUPLICATE_NAME), hObjectParent (0: the client) an
 * object of the client (else NV_ERR_OBJECT_NOT_FOUND, clientGetResourceRef's answer) of a class
 * RM allows as this class's parent (else NV_ERR_INVALID_OBJECT_PARENT): a device under a client,
 * a subdevice under a device, a TSG under a device, a channel under a device or a TSG; other
 * classes under any object.
 */
static u32 nvlab_alloc(struct nvlab_file *f, const u32 *p)
{
	u32 root = p[0], hparent = p[1], hnew = p[2], class = p[3];
	struct nv_gpu_task_init_ctx ctx = {0};
	struct nvlab_obj *parent, *o;
	u32 parent_class;

	mutex_lock(&f->lock);
	if (is_client_class(class)) {
		if (!hnew) {
			mutex_unlock(&f->lock);
			return NV_ERR_INVALID_OBJECT_HANDLE;
		}
		if (obj_find(f, hnew, hnew)) {
			mutex_unlock(&f->lock);
			return NV_ERR_INSERT_DUPLICATE_NAME;
		}
		root = hnew;
		hparent = 0;
		goto insert;
	}
	if (!client_find(f, root)) {
		mutex_unlock(&f->lock);
		return NV_ERR_INVALID_OBJECT_HANDLE;
	}
	if (!hnew || hnew == root) {
		mutex_unlock(&f->lock);
		return NV_ERR_INVALID_OBJECT_HANDLE;
	}
	if (obj_find(f, root, hnew)) {
		mutex_unlock(&f->lock);
		return NV_ERR_INSERT_DUPLICATE_NAME;
	}
	if (!hparent)
		hparent = root;
	parent = obj_find(f, root, hparent);
	if (!parent) {
		mutex_unlock(&f->lock);
		return NV_ERR_OBJECT_NOT_FOUND;
	}
	parent_class = parent->class;
	if ((class == NV01_DEVICE_0 && !is_client_class(parent_class)) ||
	    (class == NV20_SUBDEVICE_0 && parent_class != NV01_DEVICE_0) ||
	    (class == KEPLER_CHANNEL_GROUP_A && parent_class != NV01_DEVICE_0) ||
	    (is_channel_class(class) && parent_class != NV01_DEVICE_0 &&
	     parent_class != KEPLER_CHANNEL_GROUP_A)) {
		mutex_unlock(&f->lock);
		return NV_ERR_INVALID_OBJECT_PARENT;
	}
insert:
	o = kzalloc(sizeof(*o), GFP_KERNEL);
	if (!o) {
		mutex_unlock(&f->lock);
		return NV_ERR_NO_MEMORY;
	}
	o->client = root;
	o->handle = hnew;
	o->parent = hparent;
	o->class = class;
	if (class == KEPLER_CHANNEL_GROUP_A)
		o->hw_id = atomic_inc_return(&nvlab_next_hw_id);
	else if (is_channel_class(class))
		o->chid = atomic_inc_return(&nvlab_next_chid);
	list_add_tail(&o->node, &f->objs);
	ctx.tsg_id = o->hw_id;
	mutex_unlock(&f->lock);

	/* kchangrpapiConstruct_IMPL's task_init, once the TSG has its hardware id. */
	if (ctx.tsg_id) {
		ctx.engine_type = 1;
		ctx.default_timeslice = NVLAB_TIMESLICE_US;
		ctx.default_interleave = NVLAB_INTERLEAVE_MEDIUM;
		ctx.runlist_id = NVLAB_RUNLIST;
		nv_gpu_sched_task_init(&ctx);
	}
	return NV_OK;
}

/*
 * RM_FREE (NVOS00: hRoot, hObjectParent, hObjectOld). hRoot not a client:
 * NV_ERR_INVALID_OBJECT_HANDLE (RM's client lock lookup). hObjectOld the client: the client and
 * everything under it. An object of the client: it and everything under it, task_destroy for
 * each TSG among them (kchangrpDestruct_IMPL). hObjectOld unknown in a known client: NV_OK and
 * nothing freed, as RM answers: it is built with RS_COMPATABILITY_MODE=1 (src/nvidia/Makefile),
 * under which serverFreeResourceTreeLockAndFindResource turns the lookup's
 * NV_ERR_OBJECT_NOT_FOUND into NV_OK.
 */
static u32 nvlab_free(struct nvlab_file *f, const u32 *p)
{
	u32 root = p[0], hold = p[2];
	struct nvlab_destroyed d = {0};
	struct nvlab_obj *o;

	mutex_lock(&f->lock);
	if (!client_find(f, root)) {
		mutex_unlock(&f->lock);
		return NV_ERR_INVALID_OBJECT_HANDLE;
	}
	o = obj_find(f, root, hold);
	if (o)
		obj_free_tree(f, o, &d);
	mutex_unlock(&f->lock);
	call_task_destroy(&d);
	return NV_OK;
}

/*
 * RM_CONTROL (NVOS54: hClient @0, hObject @4, cmd @8, flags @12, params @16, paramsSize @24,
 * status @28). hClient not a client: NV_ERR_INVALID_CLIENT (rmapi/control.c). hObject not an
 * object of the client: NV_ERR_OBJECT_NOT_FOUND (serverControl's clientGetResourceRef). Then:
 *  - NVA06C_CTRL_CMD_GPFIFO_SCHEDULE on a TSG: the bind hook with the channels this module
 *    holds under the TSG;
 *  - NVA06C_CTRL_CMD_GET_INFO on a TSG: writes tsgID (the hardware TSG id);
 *  - NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN on a channel: writes workSubmitToken =
 *    (NVLAB_RUNLIST << 16) | channel id, as kfifoGenerateWorkSubmitTokenHal_GA100 builds it
 *    (NV_CTRL_VF_DOORBELL_RUNLIST_ID 22:16, _VECTOR 11:0; GB202's bit 30 not modelled), and
 *    calls token_request with {channel id, TSG hardware id (0 for a channel on a device),
 *    token}, as the fork's kchannelNotifyWorkSubmitToken does;
 *  - one of these on an object of another class: NV_ERR_INVALID_OBJECT_HANDLE (this module's
 *    choice; RM's dispatch answers NV_ERR_NOT_SUPPORTED or similar there, not checked);
 *  - a parameter size other than the control's: NV_ERR_INVALID_PARAM_STRUCT.
 * Every other control on a known object: NV_OK, nothing written.
 */
static u32 nvlab_control(struct nvlab_file *f, const u32 *p, u64 params, u32 params_size)
{
	u32 client = p[0], object = p[1], cmd = p[2];
	struct nv_gpu_token_request_ctx tctx = {0};
	struct nv_gpu_bind_ctx bctx = {0};
	struct nvlab_obj *o, *tsg;
	u32 class, value = 0;

	mutex_lock(&f->lock);
	if (!client_find(f, client)) {
		mutex_unlock(&f->lock);
		return NV_ERR_INVALID_CLIENT;
	}
	o = obj_find(f, client, object);
	if (!o) {
		mutex_unlock(&f->lock);
		return NV_ERR_OBJECT_NOT_FOUND;
	}
	class = o->class;
	switch (cmd) {
	case NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
		bctx.tsg_id = o->hw_id;
		bctx.channel_count = channel_count(f, client, object);
		break;
	case NVA06C_CTRL_CMD_GET_INFO:
		value = o->hw_id;
		break;
	case NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN:
		tsg = obj_find(f, client, o->parent);
		tctx.channel_id = o->chid;
		tctx.tsg_id = tsg ? tsg->hw_id : 0;
		tctx.token = (NVLAB_RUNLIST << 16) | o->chid;
		value = tctx.token;
		break;
	}
	mutex_unlock(&f->lock);

	switch (cmd) {
	case NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
		if (class != KEPLER_CHANNEL_GROUP_A)
			return NV_ERR_INVALID_OBJECT_HANDLE;
		if (params_size != 3)
			return NV_ERR_INVALID_PARAM_STRUCT;
		bctx.runlist_id = NVLAB_RUNLIST;
		bctx.timeslice_us = NVLAB_TIMESLICE_US;
		bctx.interleave_level = NVLAB_INTERLEAVE_MEDIUM;
		bctx.allow = 1;
		nv_gpu_sched_bind(&bctx);
		return NV_OK;
	case NVA06C_CTRL_CMD_GET_INFO:
		if (class != KEPLER_CHANNEL_GROUP_A)
			return NV_ERR_INVALID_OBJECT_HANDLE;
		if (params_size != sizeof(value))
			return NV_ERR_INVALID_PARAM_STRUCT;
		if (put_user(value, (u32 __user *)u64_to_user_ptr(params)))
			return NV_ERR_INVALID_ADDRESS;
		return NV_OK;
	case NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN:
		if (!is_channel_class(class))
			return NV_ERR_INVALID_OBJECT_HANDLE;
		if (params_size != sizeof(value))
			return NV_ERR_INVALID_PARAM_STRUCT;
		if (put_user(value, (u32 __user *)u64_to_user_ptr(params)))
			return NV_ERR_INVALID_ADDRESS;
		nv_gpu_sched_token_request(&tctx);
		return NV_OK;
	}
	return NV_OK;
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

/* One escape: the parameter block in, the RM status out at its `status` field; the syscall
 * returns 0 whatever the status, as the real driver does. */
static long nvlab_escape(struct nvlab_file *f, unsigned int escape, unsigned int size,
			 void __user *params)
{
	int off = status_offset(escape, size);
	u8 block[48];
	u32 p[4], status;

	if (off < 0)
		return -EINVAL;
	if (copy_from_user(block, params, size))
		return -EFAULT;
	memcpy(p, block, sizeof(p)); /* the first four 32-bit fields */
	switch (escape) {
	case NV_ESC_RM_ALLOC:
		status = nvlab_alloc(f, p);
		break;
	case NV_ESC_RM_FREE:
		status = nvlab_free(f, p);
		break;
	default: {
		u64 ctl_params;
		u32 ctl_size;

		memcpy(&ctl_params, block + 16, sizeof(ctl_params));
		memcpy(&ctl_size, block + 24, sizeof(ctl_size));
		status = nvlab_control(f, p, ctl_params, ctl_size);
	}
	}
	if (put_user(status, (u32 __user *)((u8 __user *)params + off)))
		return -EFAULT;
	atomic64_inc(&nvlab_calls);
	return 0;
}

/* The ioctl and release handlers have the NVIDIA driver's names and signatures
 * (kernel-open/nvidia/nv.c: nvidia_unlocked_ioctl, nvidia_close), so that gpu-trace's hooks on the
 * driver's entry points attach here as they do to the real module. */
static long nvidia_unlocked_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct nvlab_file *f = file->private_data;
	void __user *p = (void __user *)arg;
	struct nv_ioctl_xfer x;

	/* As nvidia_ioctl() (kernel-open/nvidia/nv.c): the escape is _IOC_NR, the size _IOC_SIZE;
	 * the type and direction are not checked. XFER: its own size must be 16 (-EINVAL), a copy
	 * that faults is -EFAULT, a wrapped size above the maximum -EINVAL. */
	if (_IOC_NR(cmd) != NV_ESC_IOCTL_XFER_CMD)
		return nvlab_escape(f, _IOC_NR(cmd), _IOC_SIZE(cmd), p);
	if (_IOC_SIZE(cmd) != sizeof(x))
		return -EINVAL;
	if (copy_from_user(&x, p, sizeof(x)))
		return -EFAULT;
	if (x.size > NV_ABSOLUTE_MAX_IOCTL_SIZE)
		return -EINVAL;
	return nvlab_escape(f, x.cmd, x.size, u64_to_user_ptr(x.ptr));
}

static int nvlab_open(struct inode *inode, struct file *file)
{
	struct nvlab_file *f = kzalloc(sizeof(*f), GFP_KERNEL);

	if (!f)
		return -ENOMEM;
	mutex_init(&f->lock);
	INIT_LIST_HEAD(&f->objs);
	file->private_data = f;
	return 0;
}

/* The driver frees what the file's clients still hold when it is closed: task_destroy for each
 * TSG among them, outside any ioctl (as RM's teardown at close). */
static int nvidia_close(struct inode *inode, struct file *file)
{
	struct nvlab_file *f = file->private_data;
	struct nvlab_destroyed d = {0};
	struct nvlab_obj *o;

	mutex_lock(&f->lock);
	while (!list_empty(&f->objs)) {
		o = list_first_entry(&f->objs, struct nvlab_obj, node);
		obj_free_tree(f, o, &d);
		if (d.n == NVLAB_MAX_DESTROY) {
			call_task_destroy(&d);
			d.n = 0;
		}
	}
	mutex_unlock(&f->lock);
	call_task_destroy(&d);
	kfree(f);
	return 0;
}

static const struct file_operations nvlab_fops = {
	.owner = THIS_MODULE,
	.open = nvlab_open,
	.release = nvidia_close,
	.unlocked_ioctl = nvidia_unlocked_ioctl,
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
MODULE_DESCRIPTION("gpu-trace lab: NVIDIA-like test device with its own RM object table, tokens and gpu_ext's scheduling hook functions");
