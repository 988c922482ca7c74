/* A stand-in libcuda.so.1 for tests/api_mutants.rs: a recursion per thread (cuMemAlloc_v2
 * calls itself) and a call that blocks inside another (cuCtxSynchronize calls
 * cuStreamSynchronize, which waits for a line on stdin). Each function counts its own entries
 * in gt_calls(), the oracle the test compares gpu-trace's counts with. */
#include <stddef.h>
#include <unistd.h>

static long entries[3];
static __thread int depth_left;

/* Not API symbols: the client's view of the library. */
long gt_calls(int i) { return __atomic_load_n(&entries[i], __ATOMIC_SEQ_CST); }
void gt_recurse(int depth) { depth_left = depth; }

/* Calls itself until the calling thread's depth set by gt_recurse is used up (1: no
 * recursion). */
int cuMemAlloc_v2(void **p, size_t n) {
    __atomic_add_fetch(&entries[0], 1, __ATOMIC_SEQ_CST);
    int ret = 0;
    if (--depth_left > 0)
        ret = cuMemAlloc_v2(p, n);
    *p = 0;
    return ret;
}

int cuStreamSynchronize(void *stream);

/* The outer open call: cuStreamSynchronize runs inside it. */
int cuCtxSynchronize(void) {
    __atomic_add_fetch(&entries[1], 1, __ATOMIC_SEQ_CST);
    return cuStreamSynchronize(0);
}

/* The inner open call: returns once a line came on stdin (or it closed). */
int cuStreamSynchronize(void *stream) {
    char c;
    (void)stream;
    __atomic_add_fetch(&entries[2], 1, __ATOMIC_SEQ_CST);
    while (read(0, &c, 1) == 1 && c != '\n')
        ;
    return 0;
}
