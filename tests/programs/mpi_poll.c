/*
 * mpi_poll: a polling code, as progress loops make: each rank asks its rank and calls
 * MPI_Iprobe (that finds nothing) N times as fast as it can, then one MPI_Barrier and one
 * MPI_Allgatherv of rank + 1 ints, for commtap's overhead-budget test. Each MPI_Comm_rank
 * finds its output holding a wrong rank: a profiler that read it before the call returned
 * would learn a wrong rank, and the Allgatherv's bytes (its receive count at this rank)
 * would come out wrong.
 *
 * Usage: mpi_poll N OUT_PREFIX [SLOW_N]        (any number of ranks)
 *
 * With SLOW_N, the last rank polls slowly instead: SLOW_N times, sleeping 1 ms after each
 * (at most a thousand of each call a second, whatever the machine's speed), beside the
 * others' hot loops.
 *
 * Each rank writes OUT_PREFIX.<rank>.json in mpi_truth's form: {"rank":R,"pid":PID,
 * "routines":{"MPI_Init":{...},"MPI_Comm_rank":{"calls":N+1,"bytes":0},
 * "MPI_Iprobe":{"calls":N,"bytes":0},"MPI_Barrier":{...},
 * "MPI_Allgatherv":{"calls":1,"bytes":4*(R+1)}}} (one call and no bytes for the others).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s N OUT_PREFIX [SLOW_N]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    int rank, size, flag;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int slow = argc == 4 && rank == size - 1;
    if (slow)
        n = atol(argv[3]);
    for (long i = 0; i < n; i++) {
        int asked = rank + 1 + (int)(i % 7);
        MPI_Comm_rank(MPI_COMM_WORLD, &asked);
        if (asked != rank) {
            fprintf(stderr, "MPI_Comm_rank said %d, then %d\n", rank, asked);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        MPI_Iprobe(MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        if (slow)
            usleep(1000);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int *counts = malloc(sizeof(int) * size), *displs = malloc(sizeof(int) * size);
    int *all = malloc(sizeof(int) * size * (size + 1) / 2 + sizeof(int));
    int mine[64];
    if (!counts || !displs || !all || size > 64)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (int r = 0, at = 0; r < size; at += r + 1, r++) {
        counts[r] = r + 1;
        displs[r] = at;
    }
    for (int i = 0; i <= rank; i++)
        mine[i] = rank;
    MPI_Allgatherv(mine, rank + 1, MPI_INT, all, counts, displs, MPI_INT, MPI_COMM_WORLD);

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", argv[2], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(f,
            "{\"rank\":%d,\"pid\":%ld,\"routines\":{\"MPI_Init\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Comm_rank\":{\"calls\":%ld,\"bytes\":0},"
            "\"MPI_Comm_size\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Iprobe\":{\"calls\":%ld,\"bytes\":0},\"MPI_Barrier\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Allgatherv\":{\"calls\":1,\"bytes\":%d}}}\n",
            rank, (long)getpid(), n + 1, n, 4 * (rank + 1));
    fclose(f);
    free(counts);
    free(displs);
    free(all);
    MPI_Finalize();
    return 0;
}
