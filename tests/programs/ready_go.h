/*
 * The ready/go handshake of the test programs: a program creates READY_FILE once it is
 * set up, then waits for GO_FILE, which the test creates once commtap has attached.
 */
#ifndef COMMTAP_READY_GO_H
#define COMMTAP_READY_GO_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Waits until `path` exists, looking every 10 ms. */
static void wait_for_file(const char *path)
{
    struct stat sb;
    while (stat(path, &sb) != 0) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
}

/* Creates `path`, empty (a READY_FILE): 0, or -1 where it cannot. */
static inline int create_file(const char *path)
{
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

/* Writes this process's pid to `path`, whole (written aside, then renamed): 0, or -1 where
 * it cannot. */
static inline int write_pid(const char *path)
{
    char tmp[4100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0 ||
        rename(tmp, path) != 0) {
        perror(path);
        return -1;
    }
    return 0;
}

/* With HOLD_BEFORE_INIT=PREFIX in the environment, before MPI_Init: writes this process's
 * pid to PREFIX.<its launcher's rank number> and waits for the file PREFIX (a test starts
 * a daemon per rank in between, each watching its rank's MPI_Init, as the daemons of two
 * nodes would). 0, or -1 where the pid cannot be written. */
static inline int hold_before_init(void)
{
    const char *start = getenv("HOLD_BEFORE_INIT");
    if (!start)
        return 0;
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r)
        r = getenv("PMI_RANK");
    char path[4096];
    snprintf(path, sizeof path, "%s.%s", start, r ? r : "unknown");
    if (write_pid(path) != 0)
        return -1;
    wait_for_file(start);
    return 0;
}

#endif
