/*
 * setuid_run: a setuid program that becomes its owner for good and runs a command, for the
 * attack test on each user's share of the kernel's maps. A user given sub-uids can make
 * such a program in its user namespace, owned by any of its sub-uids; run in the node's
 * own namespace it runs as that sub-uid there too, outside every user namespace.
 *
 * Usage (installed setuid, owned by the uid to become): setuid_run COMMAND [ARGS...]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s COMMAND [ARGS...]\n", argv[0]);
        return 2;
    }
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) {
        perror("setuid_run");
        return 1;
    }
    execvp(argv[1], argv + 1);
    perror("setuid_run: exec");
    return 1;
}
