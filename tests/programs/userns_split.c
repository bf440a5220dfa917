/*
 * userns_split: what a user given sub-uids (/etc/subuid, as rootless containers are) can
 * do, for the attack test on each user's share of the kernel's maps: run processes as many
 * users at once, each of which could otherwise claim a share of its own.
 *
 * Usage: userns_split N UNSHARED_FILE MAPPED_FILE PREFIX COMMAND [ARGS...]
 *
 * Run as the user: makes a user namespace (the user owns it), creates UNSHARED_FILE, and
 * waits until MAPPED_FILE exists, by when root (the test, in newuidmap's and newgidmap's
 * place) has mapped uids and gids 0 .. N-1 of the namespace to N sub-uids. Then runs
 * COMMAND ARGS... as each of those N users at once, with PREFIX.K.start, PREFIX.K.ready
 * and PREFIX.go appended for the K-th, and exits 0 once all of them did.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ready_go.h"

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s N UNSHARED_FILE MAPPED_FILE PREFIX COMMAND [ARGS...]\n",
                argv[0]);
        return 2;
    }
    int n = atoi(argv[1]);
    if (n < 1 || unshare(CLONE_NEWUSER) != 0 || create_file(argv[2]) != 0) {
        perror("userns_split");
        return 1;
    }
    wait_for_file(argv[3]);
    int args = argc - 5;
    for (int k = 0; k < n; k++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid > 0)
            continue;
        char *child[args + 4];
        char files[3][4096];
        for (int i = 0; i < args; i++)
            child[i] = argv[5 + i];
        snprintf(files[0], sizeof files[0], "%s.%d.start", argv[4], k);
        snprintf(files[1], sizeof files[1], "%s.%d.ready", argv[4], k);
        snprintf(files[2], sizeof files[2], "%s.go", argv[4]);
        for (int i = 0; i < 3; i++)
            child[args + i] = files[i];
        child[args + 3] = NULL;
        if (setresgid(k, k, k) != 0 || setresuid(k, k, k) != 0) {
            perror("userns_split: setresuid");
            _exit(1);
        }
        execvp(child[0], child);
        perror("userns_split: exec");
        _exit(1);
    }
    int failed = 0;
    for (int k = 0; k < n; k++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed = 1;
    }
    return failed;
}
