/* A call-rate workload, as codes that poll make: per rank, 1M MPI_Comm_rank, 1M MPI_Iprobe
 * that finds nothing, 200k ping-pongs of 8 bytes (MPI_Send/MPI_Recv) and 100k 8-byte
 * MPI_Allreduce, timed inside the program (start-up excluded). Prints one line:
 *   rate_s=<seconds for all of it> calls=<MPI calls per rank>
 * Usage: bench_rate [SCALE] (2 ranks; SCALE divides every count, default 1). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int rank, r, flag;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long scale = argc > 1 ? atol(argv[1]) : 1;
    long ranks = 1000000 / scale, probes = 1000000 / scale;
    long pingpongs = 200000 / scale, allreduces = 100000 / scale;
    double x = 1, y = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < ranks; i++)
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
    for (long i = 0; i < probes; i++)
        MPI_Iprobe(MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    for (long i = 0; i < pingpongs; i++) {
        if (rank == 0) {
            MPI_Send(&x, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(&y, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&y, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&x, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD);
        }
    }
    for (long i = 0; i < allreduces; i++)
        MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    if (rank == 0)
        printf("rate_s=%.4f calls=%ld\n", t1 - t0, ranks + probes + 2 * pingpongs + allreduces + 2);
    MPI_Finalize();
    return 0;
}
