/*
 * mpi_poll: a polling code, as progress loops make: each rank calls MPI_Iprobe (that finds
 * nothing) N times as fast as it can, then one MPI_Barrier, for commtap's overhead-budget
 * test.
 *
 * Usage: mpi_poll N OUT_PREFIX        (any number of ranks)
 *
 * Each rank writes OUT_PREFIX.<rank>.json in mpi_truth's form: {"rank":R,"pid":PID,
 * "routines":{"MPI_Init":{...},"MPI_Comm_rank":{...},"MPI_Iprobe":{"calls":N,"bytes":0},
 * "MPI_Barrier":{...}}} (one call and no bytes each but MPI_Iprobe).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s N OUT_PREFIX\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    int rank, flag;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (long i = 0; i < n; i++)
        MPI_Iprobe(MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    MPI_Barrier(MPI_COMM_WORLD);

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", argv[2], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(f,
            "{\"rank\":%d,\"pid\":%ld,\"routines\":{\"MPI_Init\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Comm_rank\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Iprobe\":{\"calls\":%ld,\"bytes\":0},\"MPI_Barrier\":{\"calls\":1,\"bytes\":0}}}\n",
            rank, (long)getpid(), n);
    fclose(f);
    MPI_Finalize();
    return 0;
}
