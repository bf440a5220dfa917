/*
 * nccl_late: one rank of a two-process NCCL job with a known late rank, for commtap's
 * "who is late" test on a machine without a GPU. Linked against the NCCL stand-in
 * (nccl_standin.c), whose collectives return at once: the wait a GPU would make the early
 * rank do for the late one is made here, after the enqueue, through token files.
 *
 * Usage: nccl_late UID_FILE TOKEN_DIR RANK LATE_RANK DELAY_MS N TRUTH_FILE
 *
 *  Rank 0 writes a unique id to UID_FILE (rank 1 waits for it); both ncclCommInitRank(2).
 *  Then N times: rank LATE_RANK sleeps DELAY_MS, enqueues ncclAllReduce(256 x Float32,
 *  1024 bytes) and creates TOKEN_DIR/<i>; the other enqueues at once and then waits for
 *  TOKEN_DIR/<i> (as it would wait for the GPU). So the late rank enqueues last in every
 *  instance, DELAY_MS after the other. Writes TRUTH_FILE: {"pid", "rank"}.
 */
#include "nccl_abi.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void check(ncclResult_t rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(1);
    }
}

static void nap_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

static void wait_for(const char *path)
{
    while (access(path, F_OK) != 0)
        nap_ms(1);
}

static void write_whole(const char *path, const void *data, size_t n)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0 || rename(tmp, path) != 0) {
        perror(path);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr,
                "usage: %s UID_FILE TOKEN_DIR RANK LATE_RANK DELAY_MS N TRUTH_FILE\n",
                argv[0]);
        return 2;
    }
    const char *uid_file = argv[1], *tokens = argv[2];
    int rank = atoi(argv[3]), late = atoi(argv[4]);
    long delay = atol(argv[5]), n = atol(argv[6]);

    ncclUniqueId id;
    if (rank == 0) {
        check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        write_whole(uid_file, &id, sizeof id);
    } else {
        wait_for(uid_file);
        FILE *f = fopen(uid_file, "r");
        if (!f || fread(&id, 1, sizeof id, f) != sizeof id) {
            perror(uid_file);
            return 1;
        }
        fclose(f);
    }
    ncclComm_t comm;
    check(ncclCommInitRank(&comm, 2, id, rank), "ncclCommInitRank");

    static float in[256], out[256];
    char token[4096];
    for (long i = 0; i < n; i++) {
        snprintf(token, sizeof token, "%s/%ld", tokens, i);
        if (rank == late) {
            nap_ms(delay);
            check(ncclAllReduce(in, out, 256, ncclFloat32, ncclSum, comm, NULL),
                  "ncclAllReduce");
            write_whole(token, "", 0);
        } else {
            check(ncclAllReduce(in, out, 256, ncclFloat32, ncclSum, comm, NULL),
                  "ncclAllReduce");
            wait_for(token);
        }
    }
    check(ncclCommDestroy(comm), "ncclCommDestroy");
    char truth[256];
    int len = snprintf(truth, sizeof truth, "{\"pid\": %ld, \"rank\": %d}\n", (long)getpid(),
                       rank);
    write_whole(argv[7], truth, (size_t)len);
    return 0;
}
