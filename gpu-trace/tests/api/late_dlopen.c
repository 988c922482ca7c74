/* Loads a library late (tests/api_exact.rs, a held command after the tracer ended): says
 * "ready", waits for a line on stdin, dlopen(argv[1]), says "loaded 1" (0 on failure). */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    char line[8];
    if (argc < 2)
        return 2;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 3;
    void *h = dlopen(argv[1], RTLD_NOW);
    printf("loaded %d\n", h != 0);
    return 0;
}
