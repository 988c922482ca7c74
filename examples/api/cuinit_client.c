/* Loads libcuda.so.1 globally and calls cuInit through the global scope (as a program linked to
 * libcuda does), so that a preloaded shim's cuInit is the one reached.
 *   cc -O2 -o cuinit_client cuinit_client.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
	if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) { fprintf(stderr, "%s\n", dlerror()); return 2; }
	sleep(2); /* gpu-trace's rescan attaches libcuda, dlopened after exec */
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "cuInit");
	int r = init ? init(0) : -1;
	printf("cuInit -> %d\n", r);
	return 0;
}
