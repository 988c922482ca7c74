/* The seed's bug on libcuda (issue 28): a preloaded shim exports cuInit and looks the "real" one
 * up with dlsym(RTLD_DEFAULT, ...), which finds the shim itself. A depth cap of 40 keeps the
 * demonstration from overflowing the stack; gpu-trace api must report API_RECURSION.
 *   cc -shared -fPIC -O2 -o recursive_cuinit_shim.so recursive_cuinit_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>

typedef int (*init_t)(unsigned);
static __thread int depth;

int cuInit(unsigned flags) {
	if (++depth > 40) { depth--; return 999; }
	init_t next = (init_t)dlsym(RTLD_DEFAULT, "cuInit"); /* the bug: finds this very function */
	int r = next ? next(flags) : 999;
	depth--;
	return r;
}
