/* The command of tests/api_amd.rs: one hipStreamCreate at once, then one KFD-shaped
 * CREATE_QUEUE of its own outside any API call. */
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

int hipStreamCreate(void **stream);

int main(void) {
    void *s;
    uint8_t args[96];
    int fd;
    hipStreamCreate(&s);
    fd = open("/dev/null", O_RDWR);
    memset(args, 0, sizeof args);
    ioctl(fd, 0xC0604B02u, args);
    close(fd);
    return 0;
}
