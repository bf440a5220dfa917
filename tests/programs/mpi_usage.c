/*
 * mpi_usage: what each rank used of its node, which it knows itself (getrusage), for
 * commtap's test of the usage it reports as mpitrace does.
 *
 * Usage: mpi_usage MIB MS OUT_PREFIX   (any number of ranks)
 *
 * Rank r touches (r + 1) x MIB MiB of memory it keeps, spins on the CPU for (r + 1) x MS ms
 * of its own CPU time, calls MPI_Barrier and MPI_Finalize, then reads getrusage(RUSAGE_SELF)
 * (every thread's, the MPI's own included) and writes OUT_PREFIX.<rank>.json: its rank,
 * pid and world size, user_us, system_us, max_rss_kib and switches (voluntary and
 * involuntary context switches), then exits.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "rank_truth.h"

static double cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s MIB MS OUT_PREFIX\n", argv[0]);
        return 2;
    }
    long mib = atol(argv[1]), ms = atol(argv[2]);
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t bytes = (size_t)(rank + 1) * (size_t)mib << 20;
    volatile char *kept = malloc(bytes);
    if (!kept)
        MPI_Abort(MPI_COMM_WORLD, 1);
    memset((char *)kept, rank + 1, bytes);
    double until = cpu_seconds() + (rank + 1) * ms / 1000.0;
    /* Reading the process's CPU clock is a system call: mostly user mode in between. */
    volatile unsigned long spins = 0;
    while (cpu_seconds() < until)
        for (int i = 0; i < 1000000; i++)
            spins++;
    MPI_Barrier(MPI_COMM_WORLD);
    /* Opened before MPI_Finalize: a failure can still abort the job. */
    FILE *f = open_rank_truth(argv[3], rank);
    MPI_Finalize();
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    fprintf(f,
            "{\"rank\": %d, \"pid\": %ld, \"size\": %d, \"user_us\": %ld, \"system_us\": %ld, "
            "\"max_rss_kib\": %ld, \"switches\": %ld, \"kept\": %d}\n",
            rank, (long)getpid(), size, u.ru_utime.tv_sec * 1000000L + u.ru_utime.tv_usec,
            u.ru_stime.tv_sec * 1000000L + u.ru_stime.tv_usec, u.ru_maxrss,
            u.ru_nvcsw + u.ru_nivcsw, kept[bytes - 1]);
    fclose(f);
    return 0;
}
