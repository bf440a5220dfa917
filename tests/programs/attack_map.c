/*
 * The unprivileged side of the attack tests: maps the library LIB (dlopen), then acts on
 * the daemon's first open of it, seen with inotify (the daemon reads every library a
 * process maps), and runs until killed.
 *
 *   attack_map LIB READY swap TARGET DONE      rename(TARGET, LIB) once the daemon read
 *                                              LIB (TARGET: a symlink to a root file)
 *   attack_map LIB READY truncate - DONE       truncate LIB to 0 bytes as the daemon
 *                                              opens it (a mapping reader gets SIGBUS)
 *   attack_map LIB READY none - DONE           only map it
 *
 * READY is created once LIB is mapped and watched, DONE once the action was taken.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 6)
        return 2;
    const char *lib = argv[1], *ready = argv[2], *action = argv[3], *target = argv[4];
    if (!dlopen(lib, RTLD_NOW)) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    /* Watched after dlopen: the loader's own open is not the daemon's. */
    int in = inotify_init1(IN_CLOEXEC);
    uint32_t mask = strcmp(action, "truncate") == 0 ? IN_OPEN : IN_CLOSE_NOWRITE;
    if (in < 0 || inotify_add_watch(in, lib, mask) < 0) {
        perror("inotify");
        return 1;
    }
    close(open(ready, O_CREAT | O_WRONLY, 0644));
    if (strcmp(action, "none") != 0) {
        char buf[4096];
        if (read(in, buf, sizeof buf) <= 0) {
            perror("read");
            return 1;
        }
        if (strcmp(action, "swap") == 0 && rename(target, lib) != 0) {
            perror("rename");
            return 1;
        }
        if (strcmp(action, "truncate") == 0 && truncate(lib, 0) != 0) {
            perror("truncate");
            return 1;
        }
    }
    close(open(argv[5], O_CREAT | O_WRONLY, 0644));
    for (;;)
        pause();
}
