/* A traced process that attacks its tracer (tests/hostile_targets.rs):
 *   hostile_target ROOT [ELF [LIB]]
 * maps ELF executable (a file the tracer will parse: a sparse one that claims a 2 GB symbol
 * table), dlopens LIB (a GPU API library, so that `gpu-trace api` attaches), then chroots into
 * ROOT, whose /etc/ld.so.preload is whatever the test planted (a symlink to a host file, a
 * FIFO, a device), says "ready" and waits. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2)
        return 64;
    if (argc > 2 && argv[2][0]) {
        int fd = open(argv[2], O_RDONLY);
        if (fd < 0 || mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED)
            return 3;
    }
    if (argc > 3 && !dlopen(argv[3], RTLD_NOW | RTLD_GLOBAL))
        return 4;
    if (chroot(argv[1]) != 0 || chdir("/") != 0)
        return 2;
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}
