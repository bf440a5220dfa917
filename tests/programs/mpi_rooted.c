/*
 * mpi_rooted: collectives with a root, where who waits depends on which end is late, for
 * commtap's "who is late" tests (Scalasca's Late Broadcast and Early Reduce).
 *
 * Usage: mpi_rooted DELAY_MS N OUT_PREFIX   (2 ranks)
 *
 * Rank 1 sleeps DELAY_MS before each collective of four phases of N, each phase after an
 * MPI_Barrier on MPI_COMM_WORLD (so that no rank starts one ahead from the last):
 *
 *   1. MPI_Reduce of 1 double (8 bytes) to root 0: the root waits for rank 1 every time;
 *      rank 1 sends and leaves (it waits for nobody).
 *   2. MPI_Gather of 1 int (4 bytes) to root 1: the root is late, rank 0 sends and leaves;
 *      nobody waits.
 *   3. MPI_Bcast of 2 ints (8 bytes) from root 0: rank 1 is late, the root sends and leaves;
 *      nobody waits.
 *   4. MPI_Scatter of 1 int (4 bytes) a rank from root 1: the root is late, rank 0 waits
 *      for it every time.
 *
 * Small messages go eagerly in Open MPI and MPICH: a sender never waits for its receiver.
 * No other collective is called. Each rank writes OUT_PREFIX.<rank>.json with its rank,
 * pid and the world size, then calls MPI_Finalize.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "rank_truth.h"

static void nap(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s DELAY_MS N OUT_PREFIX\n", argv[0]);
        return 2;
    }
    int delay = atoi(argv[1]);
    long n = atol(argv[2]);
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        fprintf(stderr, "mpi_rooted: 2 ranks, not %d\n", size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int late = rank == 1;
    double d = rank, dsum = 0;
    int two[2] = {1, 2}, one = rank, got[2], mine = 0;

    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < n; i++) {
        if (late)
            nap(delay);
        MPI_Reduce(&d, &dsum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < n; i++) {
        if (late)
            nap(delay);
        MPI_Gather(&one, 1, MPI_INT, got, 1, MPI_INT, 1, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < n; i++) {
        if (late)
            nap(delay);
        MPI_Bcast(two, 2, MPI_INT, 0, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < n; i++) {
        if (late)
            nap(delay);
        MPI_Scatter(two, 1, MPI_INT, &mine, 1, MPI_INT, 1, MPI_COMM_WORLD);
    }

    FILE *f = open_rank_truth(argv[3], rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d}\n", rank, (long)getpid(), size);
    fclose(f);
    MPI_Finalize();
    return 0;
}
