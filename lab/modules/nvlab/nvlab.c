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
 * Layouts: shared/docs/driver-reference.md A1, A2.
 */
#include <linux/fs.h>
#include <linux/module.h>
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
MODULE_DESCRIPTION("gpu-trace lab: NVIDIA-like test device answering RM escapes with NV_OK");
