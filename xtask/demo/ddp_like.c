/* A data-parallel training loop's communication, as in the mpitrace seed: parameters are
 * broadcast once, then every step negotiates which tensors are ready (many 8-byte
 * allreduces), allreduces gradient buckets of several sizes, and gathers a metric. Each
 * phase is a function of its own, as in a framework: the demo's call sites name them. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static void compute(double *w, int n) {
    for (int i = 0; i < n; i++) w[i] = w[i] * 0.999 + 1e-3;
}

/* Which tensors are ready on every rank: the seed's "8-byte allreduces". */
__attribute__((noinline)) static long negotiate_tensors(int tensors) {
    long ready = 1, all = 0, seen = 0;
    for (int t = 0; t < tensors; t++) {
        MPI_Allreduce(&ready, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        seen += all;
    }
    return seen;
}

__attribute__((noinline)) static void allreduce_buckets(float *grad, const int *buckets, int n) {
    for (int b = 0; b < n; b++) {
        MPI_Allreduce(MPI_IN_PLACE, grad, buckets[b], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        grad[0] *= 0.5f;
    }
}

__attribute__((noinline)) static void gather_metric(int rank, int size, int step) {
    int metric = step, *all = rank == 0 ? malloc(size * sizeof(int)) : NULL;
    MPI_Gather(&metric, 1, MPI_INT, all, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(all);
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
    long seen = 0;
    for (int step = 0; step < 20; step++) {
        compute(params, 1 << 16);
        seen += negotiate_tensors(40);
        allreduce_buckets(grad, buckets, nbuckets);
        gather_metric(rank, size, step);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(grad);
    free(params);
    MPI_Finalize();
    return seen == 0;
}
