/* A data-parallel training loop's communication, as in the mpitrace seed: parameters are
 * broadcast once, then every step negotiates which tensors are ready (many 8-byte
 * allreduces), allreduces gradient buckets of several sizes, and gathers a metric. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static void compute(double *w, int n) {
    for (int i = 0; i < n; i++) w[i] = w[i] * 0.999 + 1e-3;
}

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int buckets[] = {4096, 40960, 110592, 712704, 4194304}; /* floats: 16 KB .. 16 MB */
    const int nbuckets = sizeof buckets / sizeof buckets[0];
    float *grad = calloc(4194304, sizeof(float));
    double *params = calloc(1 << 16, sizeof(double));
    MPI_Bcast(params, 1 << 16, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    for (int step = 0; step < 20; step++) {
        compute(params, 1 << 16);
        for (int t = 0; t < 40; t++) {
            long ready = 1, all;
            MPI_Allreduce(&ready, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        }
        for (int b = 0; b < nbuckets; b++)
            MPI_Allreduce(MPI_IN_PLACE, grad, buckets[b], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        int metric = step, *all = rank == 0 ? malloc(size * sizeof(int)) : NULL;
        MPI_Gather(&metric, 1, MPI_INT, all, 1, MPI_INT, 0, MPI_COMM_WORLD);
        free(all);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(grad);
    free(params);
    MPI_Finalize();
    return 0;
}
