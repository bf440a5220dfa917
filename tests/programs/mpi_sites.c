/*
 * mpi_sites: MPI calls made from known functions, for commtap's call-site tests.
 *
 * Usage: mpi_sites N OUT_PREFIX [READY GO]   (any number of ranks)
 *
 * negotiate() makes N MPI_Allreduce of one int (4 bytes: Horovod's negotiation, the
 * seed's "8-byte allreduces"), reduce_gradients() N/2 MPI_Allreduce of 1024 doubles (8,192
 * bytes) and broadcast_weights() 3 MPI_Bcast of 256 bytes. Each function is kept out of
 * line and each call is followed by more code (no tail call), so the address every call
 * returns to lies in the function that made it. Each rank writes OUT_PREFIX.<rank>.json:
 * its rank, pid and world size, and per function the routine it called, the calls, their
 * bytes and the source line of the call (built with -g: the site's line). With READY
 * and GO, all then meet at an MPI_Barrier, each rank creates READY.<rank> once out of it
 * (rank 0 READY too), and waits for GO before MPI_Finalize (a daemon's test reads the
 * running ranks' profile meanwhile: no call in flight).
 *
 * Built as C++ (mpi_sites_cpp.cpp includes this file), the three functions are static
 * members of a class in a namespace, their symbols mangled, and the truth names them as a
 * C++ programmer reads them (as c++filt does): trainer::Step::negotiate(long) ...
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "rank_truth.h"
#include "ready_go.h"

#ifdef __cplusplus
#define SITES_BEGIN namespace trainer { struct Step {
#define SITES_END }; }
#define SITE(f) trainer::Step::f
#define SITE_NAME(f, params) "trainer::Step::" #f params
#else
#define SITES_BEGIN
#define SITES_END
#define SITE(f) f
#define SITE_NAME(f, params) #f
#endif

static volatile long sink;
/* The line of each function's MPI call, for the truth: what its call site's source line
 * must be. Set on the line after the call, so that the instruction the call returns to
 * is another line's: a site named by its return address rather than its call would be
 * one line off. */
static int line_of[3];

SITES_BEGIN

__attribute__((noinline)) static void negotiate(long n)
{
    int ready = 1, all = 0;
    for (long i = 0; i < n; i++) {
        MPI_Allreduce(&ready, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        line_of[0] = __LINE__ - 1;
        sink += all;
    }
}

__attribute__((noinline)) static void reduce_gradients(long n)
{
    static double grad[1024], sum[1024];
    for (long i = 0; i < n; i++) {
        MPI_Allreduce(grad, sum, 1024, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        line_of[1] = __LINE__ - 1;
        sink += (long)sum[0];
    }
}

__attribute__((noinline)) static void broadcast_weights(void)
{
    static char weights[256];
    for (int i = 0; i < 3; i++) {
        MPI_Bcast(weights, 256, MPI_CHAR, 0, MPI_COMM_WORLD);
        line_of[2] = __LINE__ - 1;
        sink += weights[0];
    }
}

SITES_END

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: %s N OUT_PREFIX [READY GO]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    SITE(negotiate)(n);
    SITE(reduce_gradients)(n / 2);
    SITE(broadcast_weights)();
    FILE *f = open_rank_truth(argv[2], rank);
    fprintf(f,
            "{\"rank\": %d, \"pid\": %ld, \"size\": %d, \"sites\": ["
            "{\"function\": \"%s\", \"routine\": \"MPI_Allreduce\", \"calls\": %ld, \"bytes\": %ld, \"line\": %d}, "
            "{\"function\": \"%s\", \"routine\": \"MPI_Allreduce\", \"calls\": %ld, \"bytes\": %ld, \"line\": %d}, "
            "{\"function\": \"%s\", \"routine\": \"MPI_Bcast\", \"calls\": 3, \"bytes\": 768, \"line\": %d}]}\n",
            rank, (long)getpid(), size, SITE_NAME(negotiate, "(long)"), n, 4 * n, line_of[0],
            SITE_NAME(reduce_gradients, "(long)"), n / 2, 8192 * (n / 2), line_of[1],
            SITE_NAME(broadcast_weights, "()"), line_of[2]);
    fclose(f);
    if (argc == 5) {
        /* Each rank's marker once out of its last call before the go (the barrier). */
        MPI_Barrier(MPI_COMM_WORLD);
        char mine[4096];
        snprintf(mine, sizeof mine, "%s.%d", argv[3], rank);
        if (create_file(mine) != 0) {
            perror(mine);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (rank == 0 && create_file(argv[3]) != 0) {
            perror(argv[3]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        wait_for_file(argv[4]);
    }
    MPI_Finalize();
    return 0;
}
