/* Per-call cost of MPI_Allreduce (8 bytes) and of an MPI_Send/MPI_Recv ping-pong (8 bytes),
 * timed inside the program so that start-up is excluded. Prints one line:
 *   allreduce_ns=<ns per call> pingpong_ns=<ns per round trip>
 * Usage: bench_calls ITERATIONS (2 ranks). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long n = argc > 1 ? atol(argv[1]) : 100000;
    double x = 1, y = 0;
    for (long i = 0; i < n / 10; i++) /* warm-up */
        MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < n; i++)
        MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double t1 = MPI_Wtime();
    MPI_Barrier(MPI_COMM_WORLD);
    double t2 = MPI_Wtime();
    for (long i = 0; i < n; i++) {
        if (rank == 0) {
            MPI_Send(&x, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(&y, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(&y, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&x, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD);
        }
    }
    double t3 = MPI_Wtime();
    if (rank == 0)
        printf("allreduce_ns=%.1f pingpong_ns=%.1f\n", (t1 - t0) * 1e9 / n, (t3 - t2) * 1e9 / n);
    MPI_Finalize();
    return 0;
}
