/* Workload generator for `cargo xtask bench` (xtask/src/bench.rs compiles it with `cc -O2`).
 *
 *   syscall_loop MODE [--iters N] [--threads T] [--rate CALLS_PER_S] [--seconds S] [--cpu C]
 *                [--wait-stdin 1]
 *
 * MODE (one system call per iteration):
 *   getppid      the cheapest syscall: nothing but the syscall entry/exit path
 *   ioctl-pipe   FIONREAD on a pipe: an ordinary ioctl on a non-GPU fd (succeeds)
 *   ioctl-unwatched  RM-shaped ioctls (RM_CONTROL) on /dev/zero, which no tracer watches: passes
 *                gpu-trace's command-number filter, so it pays the fd-table walk, then is dropped
 *   rm-emit      a cycle of RM-shaped ioctls on /dev/null that gpu-trace reports when it watches
 *                /dev/null (`--watch-device /dev/null`): TSG alloc (NVOS64), GPFIFO_SCHEDULE,
 *                GET_WORK_SUBMIT_TOKEN, RM_FREE. Each one is one ring-buffer record.
 *   rm-ignored   RM_CONTROL on /dev/null with a command gpu-trace reads and ignores (the common
 *                case on a GPU: most RM controls are not about scheduling)
 * /dev/null has no ioctls: every RM-shaped call returns ENOTTY after the tracer has read it.
 *
 * Without --rate: T threads each run N iterations as fast as they can. With --rate: T threads
 * together issue CALLS_PER_S calls per second for S seconds (a token bucket per thread, checked
 * every 64 calls, sleeping 20 us when ahead). --cpu pins every thread to one CPU. --wait-stdin 1
 * prints `ready pid=<pid>` after setting up and waits for one byte on stdin before the first call.
 *
 * Prints one line: `calls=<total> warmup=<calls before timing> elapsed_ns=<wall>
 * ns_per_call=<wall per call per thread> cpu_ns_per_call=<CPU per call>`: ns_per_call is wall
 * time / per-thread calls; cpu_ns_per_call is the loop threads' CPU time (user + system,
 * CLOCK_THREAD_CPUTIME_ID) / calls, which does not count time the thread was preempted and so
 * is the steadier figure on a shared machine.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum mode { GETPPID, IOCTL_PIPE, IOCTL_UNWATCHED, RM_EMIT, RM_IGNORED, RM_HANDLES };

/* RM parameter blocks (open-gpu-kernel-modules nvos.h); same layouts as gpu-trace/tests/kernel.rs. */
struct nvos64 { uint32_t h_root, h_parent, h_new, h_class; uint64_t p_alloc, p_rights;
                uint32_t params_size, flags, status, pad; };
struct nvos54 { uint32_t h_client, h_object, cmd, flags; uint64_t params;
                uint32_t params_size, status; };
struct nvos00 { uint32_t h_root, h_parent, h_old, status; };

#define RM_ALLOC64 0xC030462Bu
#define RM_CONTROL 0xC020462Au
#define RM_FREE 0xC0104629u
#define TSG_GPFIFO_SCHEDULE 0xA06C0101u
#define GET_WORK_SUBMIT_TOKEN 0xC36F0108u
#define UNTRACED_CONTROL 0x20800101u

static enum mode g_mode;
static long g_iters = 1000000;
static int g_threads = 1;
static double g_rate = 0, g_seconds = 1;
static int g_cpu = -1;
static int g_wait = 0;

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static void die(const char *what) {
    fprintf(stderr, "syscall_loop: %s: %s\n", what, strerror(errno));
    exit(2);
}

struct worker {
    pthread_t thread;
    int fd;          /* device or pipe the ioctls go to */
    long calls;      /* done */
    uint64_t cpu_ns; /* CPU time this thread spent in the loop (user + system) */
    /* RM blocks, per thread */
    uint32_t tsg_params[5];
    uint8_t sched[3];
    uint32_t token;
    struct nvos64 alloc;
    struct nvos54 schedule, submit, other;
    struct nvos00 freed;
};

static void setup(struct worker *w) {
    int pfd[2];
    switch (g_mode) {
    case GETPPID:
        w->fd = -1;
        return;
    case IOCTL_PIPE:
        if (pipe(pfd) != 0) die("pipe");
        w->fd = pfd[0];
        return;
    case IOCTL_UNWATCHED:
        w->fd = open("/dev/zero", O_RDONLY);
        if (w->fd < 0) die("open /dev/zero");
        break;
    default:
        w->fd = open("/dev/null", O_RDONLY);
        if (w->fd < 0) die("open /dev/null");
    }
    uint32_t tsg[5] = {0xcaf00001u, 0, 0xcaf00002u, 1, 0};
    memcpy(w->tsg_params, tsg, sizeof tsg);
    w->sched[0] = 1;
    w->alloc = (struct nvos64){.h_root = 0xc1d00001u, .h_parent = 0xc1d00002u, .h_new = 0x5c000010u,
                               .h_class = 0xA06C, .p_alloc = (uint64_t)(uintptr_t)w->tsg_params};
    w->schedule = (struct nvos54){.h_client = 0xc1d00001u, .h_object = 0x5c000010u,
                                  .cmd = TSG_GPFIFO_SCHEDULE, .params = (uint64_t)(uintptr_t)w->sched,
                                  .params_size = 3};
    w->submit = (struct nvos54){.h_client = 0xc1d00001u, .h_object = 0xcafe0001u,
                                .cmd = GET_WORK_SUBMIT_TOKEN, .params = (uint64_t)(uintptr_t)&w->token,
                                .params_size = 4};
    w->other = w->schedule;
    w->other.cmd = UNTRACED_CONTROL;
    w->freed = (struct nvos00){.h_root = 0xc1d00001u, .h_parent = 0xc1d00002u, .h_old = 0x5c000010u};
}

static inline void one_call(struct worker *w, long i) {
    int avail;
    switch (g_mode) {
    case GETPPID:
        syscall(SYS_getppid);
        break;
    case IOCTL_PIPE:
        ioctl(w->fd, FIONREAD, &avail);
        break;
    case IOCTL_UNWATCHED:
    case RM_IGNORED:
        ioctl(w->fd, RM_CONTROL, &w->other);
        break;
    case RM_HANDLES:
        /* A new handle each four calls, never freed: alloc, schedule, schedule, token. */
        w->alloc.h_new = w->schedule.h_object = 0x5c000000u + (uint32_t)(i >> 2);
        switch (i & 3) {
        case 0: ioctl(w->fd, RM_ALLOC64, &w->alloc); break;
        case 3: ioctl(w->fd, RM_CONTROL, &w->submit); break;
        default: ioctl(w->fd, RM_CONTROL, &w->schedule); break;
        }
        break;
    case RM_EMIT:
        switch (i & 3) {
        case 0: ioctl(w->fd, RM_ALLOC64, &w->alloc); break;
        case 1: ioctl(w->fd, RM_CONTROL, &w->schedule); break;
        case 2: ioctl(w->fd, RM_CONTROL, &w->submit); break;
        default: ioctl(w->fd, RM_FREE, &w->freed); break;
        }
        break;
    }
}

static void run_loop(struct worker *w);

static void *run(void *arg) {
    struct worker *w = arg;
    uint64_t cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    run_loop(w);
    w->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    return NULL;
}

static void run_loop(struct worker *w) {
    if (g_rate <= 0) {
        for (long i = 0; i < g_iters; i++) one_call(w, i);
        w->calls = g_iters;
        return;
    }
    double per_ns = g_rate / g_threads / 1e9;
    uint64_t start = now_ns(), end = start + (uint64_t)(g_seconds * 1e9);
    long i = 0;
    for (;;) {
        uint64_t t = now_ns();
        if (t >= end) break;
        long due = (long)((double)(t - start) * per_ns);
        if (i >= due) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
            continue;
        }
        long until = due < i + 64 ? due : i + 64;
        for (; i < until; i++) one_call(w, i);
    }
    w->calls = i;
}

static void usage(void) {
    fprintf(stderr, "usage: syscall_loop getppid|ioctl-pipe|ioctl-unwatched|rm-emit|rm-ignored|rm-handles "
                    "[--iters N] [--threads T] [--rate CALLS_PER_S] [--seconds S] [--cpu C] "
                    "[--wait-stdin 1]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    const char *m = argv[1];
    if (!strcmp(m, "getppid")) g_mode = GETPPID;
    else if (!strcmp(m, "ioctl-pipe")) g_mode = IOCTL_PIPE;
    else if (!strcmp(m, "ioctl-unwatched")) g_mode = IOCTL_UNWATCHED;
    else if (!strcmp(m, "rm-emit")) g_mode = RM_EMIT;
    else if (!strcmp(m, "rm-ignored")) g_mode = RM_IGNORED;
    else if (!strcmp(m, "rm-handles")) g_mode = RM_HANDLES;
    else usage();
    for (int a = 2; a < argc; a += 2) {
        if (a + 1 >= argc) usage();
        if (!strcmp(argv[a], "--iters")) g_iters = atol(argv[a + 1]);
        else if (!strcmp(argv[a], "--threads")) g_threads = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--rate")) g_rate = atof(argv[a + 1]);
        else if (!strcmp(argv[a], "--seconds")) g_seconds = atof(argv[a + 1]);
        else if (!strcmp(argv[a], "--cpu")) g_cpu = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--wait-stdin")) g_wait = atoi(argv[a + 1]);
        else usage();
    }
    if (g_threads < 1 || g_threads > 256 || g_iters < 1) usage();
    if (g_cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(g_cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
    }
    struct worker *w = calloc((size_t)g_threads, sizeof *w);
    if (!w) die("calloc");
    for (int t = 0; t < g_threads; t++) setup(&w[t]);
    if (g_wait) {
        /* Let the caller start a tracer filtered on this pid before the first call. */
        printf("ready pid=%d\n", (int)getpid());
        fflush(stdout);
        char go;
        if (read(0, &go, 1) != 1) die("waiting for the go byte on stdin");
    }
    /* Warm-up: fault in the code and data, settle the CPU frequency. Not in `calls`. */
    const long warmup = 1000;
    for (long i = 0; i < warmup; i++) one_call(&w[0], i);
    uint64_t start = now_ns();
    if (g_threads == 1) {
        run(&w[0]);
    } else {
        for (int t = 0; t < g_threads; t++)
            if (pthread_create(&w[t].thread, NULL, run, &w[t]) != 0) die("pthread_create");
        for (int t = 0; t < g_threads; t++) pthread_join(w[t].thread, NULL);
    }
    uint64_t elapsed = now_ns() - start;
    long total = 0;
    uint64_t cpu = 0;
    for (int t = 0; t < g_threads; t++) {
        total += w[t].calls;
        cpu += w[t].cpu_ns;
    }
    double per_thread = (double)total / g_threads;
    printf("calls=%ld warmup=%ld elapsed_ns=%llu ns_per_call=%.2f cpu_ns_per_call=%.2f\n", total,
           warmup, (unsigned long long)elapsed, per_thread > 0 ? (double)elapsed / per_thread : 0.0,
           total > 0 ? (double)cpu / (double)total : 0.0);
    return 0;
}
