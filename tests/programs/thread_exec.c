/* A process whose second thread, not its first, calls exec: the kernel gives that thread
 * the process's id and frees the thread's own.
 *
 * Usage: thread_exec TID_FILE GO_FILE PROGRAM [ARGS...]
 *
 * The second thread writes its id to TID_FILE (whole, by a rename), waits (polling, every
 * 10 ms) for GO_FILE, then execs PROGRAM with ARGS; the first thread waits for it
 * meanwhile. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static char **args;

static void *second(void *unused) {
    (void)unused;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", args[1]);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%ld\n", (long)syscall(SYS_gettid)) < 0 || fclose(f) != 0 ||
        rename(tmp, args[1]) != 0) {
        perror("thread_exec: TID_FILE");
        exit(1);
    }
    while (access(args[2], F_OK) != 0)
        usleep(10000);
    execv(args[3], &args[3]);
    perror("thread_exec: execv");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TID_FILE GO_FILE PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    args = argv;
    pthread_t t;
    if (pthread_create(&t, NULL, second, NULL) != 0) {
        fprintf(stderr, "thread_exec: pthread_create failed\n");
        return 1;
    }
    /* Never returns: the exec replaces the process. */
    pthread_join(t, NULL);
    return 1;
}
