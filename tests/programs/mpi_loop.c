/*
 * mpi_loop: long-running MPI workload for commtap "attach after start" and
 * "ring buffer overflow" tests.
 *
 * Usage: mpi_loop READY_FILE GO_FILE N OUT_PREFIX
 *
 *  1. MPI_Init, MPI_Comm_rank, MPI_Comm_size, MPI_Barrier; then each rank
 *     creates READY_FILE.<rank> and rank 0 READY_FILE.      (not counted)
 *  2. Every rank polls (stat() every 10 ms, no MPI calls) until GO_FILE
 *     exists.
 *  3. Counted from here on:
 *       1 x MPI_Barrier(MPI_COMM_WORLD)   so all ranks leave the wait together
 *       N x { MPI_Allreduce of 1 MPI_DOUBLE (8 bytes);
 *             ranks 2k and 2k+1 exchange 16 MPI_CHAR each way:
 *             2k: MPI_Send then MPI_Recv; 2k+1: MPI_Recv then MPI_Send }
 *     With an odd size the last rank does no point-to-point.  MPI_Recv uses
 *     a posted count of 16 (== received), MPI_STATUS_IGNORE.
 *     With COMMTAP_TEST_UNTIL naming a file, the loop goes on past N iterations until
 *     that file exists (all ranks stop after the same iteration).
 *  4. Each rank writes OUT_PREFIX.<rank>.json (same shape as mpi_truth)
 *     with only the calls of step 3, then calls MPI_Finalize; if the
 *     environment names a file in COMMTAP_TEST_HOLD, it first waits (no MPI
 *     call) until that file exists: a job that is done with its counted
 *     calls but still running.
 */
#include <mpi.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ready_go.h"

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s READY_FILE GO_FILE N OUT_PREFIX\n",
                argv[0]);
        return 2;
    }
    const char *ready = argv[1], *go = argv[2], *prefix = argv[4];
    long n = atol(argv[3]);
    if (n < 0)
        n = 0;

    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Barrier(MPI_COMM_WORLD);
    /* READY_FILE.<rank>: this rank is out of MPI_Barrier (its probes have run) and makes
     * no MPI call until GO_FILE: a test may read counters from here on. */
    char mine[4096];
    snprintf(mine, sizeof mine, "%s.%d", ready, rank);
    FILE *m = fopen(mine, "w");
    if (!m || fclose(m) != 0) {
        perror(mine);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
        FILE *f = fopen(ready, "w");
        if (!f) {
            perror(ready);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        fprintf(f, "%ld\n", (long)getpid());
        fclose(f);
    }

    wait_for_file(go);

    /* ---- counted section ---- */
    long long barrier_calls = 0;
    long long allreduce_calls = 0, allreduce_bytes = 0;
    long long send_calls = 0, send_bytes = 0;
    long long recv_calls = 0, recv_bytes = 0;

    int peer = (rank % 2 == 0) ? rank + 1 : rank - 1;
    if (peer >= size)
        peer = -1;                  /* odd size: last rank has no partner */

    barrier_calls++;
    MPI_Barrier(MPI_COMM_WORLD);

    double in = rank, out = 0;
    char sbuf[16], rbuf[16];
    for (int i = 0; i < 16; i++)
        sbuf[i] = (char)('a' + i);

    /* COMMTAP_TEST_UNTIL=FILE: go on past N iterations until FILE exists. Rank 0 looks
     * every 1000 iterations and tells the others through the Allreduce's sum, so every
     * rank stops after the same iteration (the truth still counts every call). */
    const double stop = 1e12;
    const char *until = getenv("COMMTAP_TEST_UNTIL");
    int more = until && *until;
    for (long it = 0; it < n || more; it++) {
        if (rank == 0 && more && it >= n && it % 1000 == 0 && access(until, F_OK) == 0)
            in = stop;
        allreduce_calls++;
        allreduce_bytes += (long long)sizeof(double);
        MPI_Allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (out >= stop)
            more = 0;
        if (peer < 0)
            continue;
        if (rank % 2 == 0) {
            send_calls++;
            send_bytes += 16;
            MPI_Send(sbuf, 16, MPI_CHAR, peer, 7, MPI_COMM_WORLD);
            recv_calls++;
            recv_bytes += 16;
            MPI_Recv(rbuf, 16, MPI_CHAR, peer, 7, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        } else {
            recv_calls++;
            recv_bytes += 16;
            MPI_Recv(rbuf, 16, MPI_CHAR, peer, 7, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            send_calls++;
            send_bytes += 16;
            MPI_Send(sbuf, 16, MPI_CHAR, peer, 7, MPI_COMM_WORLD);
        }
    }

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", prefix, rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(f, "{\"rank\":%d,\"size\":%d,\"pid\":%ld,\"routines\":{", rank,
            size, (long)getpid());
    fprintf(f, "\"MPI_Barrier\":{\"calls\":%lld,\"bytes\":0}", barrier_calls);
    if (allreduce_calls)            /* routines never called are omitted */
        fprintf(f, ",\"MPI_Allreduce\":{\"calls\":%lld,\"bytes\":%lld}",
                allreduce_calls, allreduce_bytes);
    if (send_calls)
        fprintf(f, ",\"MPI_Send\":{\"calls\":%lld,\"bytes\":%lld}",
                send_calls, send_bytes);
    if (recv_calls)
        fprintf(f, ",\"MPI_Recv\":{\"calls\":%lld,\"bytes\":%lld}",
                recv_calls, recv_bytes);
    fprintf(f, "},\"comm_sizes\":{\"MPI_Barrier\":[%d]", size);
    if (allreduce_calls)
        fprintf(f, ",\"MPI_Allreduce\":[%d]", size);
    fprintf(f, "}}\n");
    if (fclose(f) != 0) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    const char *hold = getenv("COMMTAP_TEST_HOLD");
    if (hold && *hold)
        wait_for_file(hold);
    MPI_Finalize();
    return 0;
}
