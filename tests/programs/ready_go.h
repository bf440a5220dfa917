/*
 * The ready/go handshake of the test programs: a program creates READY_FILE once it is
 * set up, then waits for GO_FILE, which the test creates once commtap has attached.
 */
#ifndef COMMTAP_READY_GO_H
#define COMMTAP_READY_GO_H

#include <errno.h>
#include <fcntl.h>
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

#endif
