/*
 * nccl_hidden: a process whose only NCCL is linked into a library that exports none of
 * NCCL's symbols (the stand-in built with -fvisibility=hidden). commtap must report it as
 * seen but not probed, not as a process without communication.
 *
 * Usage: nccl_hidden READY_FILE GO_FILE
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

int standin_hidden_entry(void);

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    if (standin_hidden_entry() != 0)
        return 1;
    FILE *f = fopen(argv[1], "w");
    if (!f || fclose(f) != 0)
        return 1;
    struct stat sb;
    while (stat(argv[2], &sb) != 0) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    return 0;
}
