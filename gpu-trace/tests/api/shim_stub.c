/* An interposer that never looks anything up: exports hipMalloc and answers it itself (no
 * dlsym import, so no recursion warning is due). */
#include <stddef.h>

int hipMalloc(void **ptr, size_t size) {
    (void)size;
    *ptr = NULL;
    return 2; /* hipErrorOutOfMemory */
}
