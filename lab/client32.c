/*
 * The lab's 32-bit x86 client (built `gcc -m32 -ffreestanding -nostdlib -static`: no 32-bit
 * libc is needed): GPFIFO_SCHEDULE on nvlab's /dev/nvidiactl through the compat ioctl path
 * (int $0x80, so the kernel runs compat_sys_ioctl and the LSM hook file_ioctl_compat, not
 * file_ioctl). `lab-client nvdeny32` execs it, keeping the process (and a --deny-pid verdict).
 *
 *   LAB nvdeny32 pid=N fd=N bits=32
 *   LAB nvdeny32 call=schedule rc=R status=S        TSG schedule, bEnable=1, direct
 *   LAB nvdeny32 call=schedule_xfer rc=R status=S   the same, XFER-wrapped
 *
 * No RM client is allocated: a schedule that reaches nvlab is answered with an RM status
 * (NV_ERR_INVALID_CLIENT) and rc 0; one refused before the driver returns -EPERM and leaves the
 * preset status 0xffffffff. The structures have the driver's layouts, the same in 32- and
 * 64-bit processes (NvP64 fields are 8-byte aligned).
 */
typedef unsigned int u32;
typedef unsigned long long u64;

#define NV_CONTROL 0xC020462Au /* _IOWR('F', 0x2A, 32 bytes) */
#define NV_XFER 0xC01046D3u    /* _IOWR('F', 0xD3, 16 bytes) */
#define NV_TSG_SCHEDULE 0xA06C0101u

struct nvos54 {
	u32 h_client, h_object, cmd, flags;
	u64 params __attribute__((aligned(8)));
	u32 params_size, status;
};
struct nv_xfer {
	u32 cmd, size;
	u64 ptr __attribute__((aligned(8)));
};
_Static_assert(sizeof(struct nvos54) == 32, "NVOS54 is 32 bytes");
_Static_assert(sizeof(struct nv_xfer) == 16, "the XFER block is 16 bytes");

#define SYS_exit 1
#define SYS_write 4
#define SYS_open 5
#define SYS_getpid 20
#define SYS_ioctl 54
#define O_RDWR 2

static long sys3(long n, long a, long b, long c)
{
	long r;
	__asm__ volatile("int $0x80" : "=a"(r) : "a"(n), "b"(a), "c"(b), "d"(c) : "memory");
	return r;
}

/* One line, built in `line`: text and signed decimal numbers. */
static char line[256];
static int len;

static void put(const char *s)
{
	while (*s && len < (int)sizeof line - 1)
		line[len++] = *s++;
}

static void put_num(long long v)
{
	char digits[24];
	int n = 0;
	unsigned long long u = v < 0 ? -(unsigned long long)v : (unsigned long long)v;
	if (v < 0)
		put("-");
	do {
		digits[n++] = '0' + (char)(u % 10);
		u /= 10;
	} while (u);
	while (n && len < (int)sizeof line - 1)
		line[len++] = digits[--n];
}

static void end_line(void)
{
	line[len++] = '\n';
	sys3(SYS_write, 1, (long)line, len);
	len = 0;
}

static void answer(const char *call, long rc, u32 status)
{
	put("LAB nvdeny32 call=");
	put(call);
	put(" rc=");
	put_num(rc);
	put(" status=");
	put_num(status);
	end_line();
}

void _start(void)
{
	static unsigned char sched[3] = {1, 0, 0}; /* bEnable */
	static struct nvos54 direct, wrapped;
	static struct nv_xfer xfer;
	long fd = sys3(SYS_open, (long)"/dev/nvidiactl", O_RDWR, 0);

	put("LAB nvdeny32 pid=");
	put_num(sys3(SYS_getpid, 0, 0, 0));
	put(" fd=");
	put_num(fd);
	put(" bits=32");
	end_line();
	if (fd < 0)
		sys3(SYS_exit, 1, 0, 0);
	direct = (struct nvos54){
		.h_client = 0xc1d00001, .h_object = 0x5c000010, .cmd = NV_TSG_SCHEDULE,
		.params = (u32)sched, .params_size = 3, .status = 0xffffffff,
	};
	wrapped = direct;
	xfer = (struct nv_xfer){.cmd = 0x2A, .size = sizeof wrapped, .ptr = (u32)&wrapped};
	/* The call first, then the status it left (argument order is unspecified in C). */
	long rc = sys3(SYS_ioctl, fd, NV_CONTROL, (long)&direct);
	answer("schedule", rc, direct.status);
	rc = sys3(SYS_ioctl, fd, NV_XFER, (long)&xfer);
	answer("schedule_xfer", rc, wrapped.status);
	sys3(SYS_exit, 0, 0, 0);
	for (;;)
		;
}
