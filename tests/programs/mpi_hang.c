/*
 * mpi_hang: a job hung on a known rank, for commtap's "who does a hung job wait for" test.
 *
 * Usage: mpi_hang LATE_RANK N GO_FILE OUT_PREFIX
 *
 * Every rank makes N MPI_Allreduce of 1 int on MPI_COMM_WORLD (the world's instances 0 to
 * N-1); then rank LATE_RANK waits, making no MPI call, until GO_FILE exists, while every
 * other rank enters MPI_Barrier on MPI_COMM_WORLD (instance N) and blocks there. Once
 * GO_FILE exists LATE_RANK enters the barrier too and every rank finishes. Each rank
 * writes OUT_PREFIX.<rank>.json with its rank, pid and the world size once MPI_Init has
 * returned (before its collectives).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "rank_truth.h"
#include "ready_go.h"

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s LATE_RANK N GO_FILE OUT_PREFIX\n", argv[0]);
        return 2;
    }
    int late = atoi(argv[1]);
    long n = atol(argv[2]);
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    FILE *f = open_rank_truth(argv[4], rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d}\n", rank, (long)getpid(), size);
    fclose(f);
    int one = 1, sum = 0;
    for (long i = 0; i < n; i++)
        MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == late)
        wait_for_file(argv[3]);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return sum == size ? 0 : 1;
}
