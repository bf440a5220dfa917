/*
 * mpi_late: a job with a known late rank, for commtap's "who is late" tests.
 *
 * Usage: mpi_late LATE_RANK DELAY_MS N OUT_PREFIX
 *        mpi_late LATE_RANK DELAY_MS N OUT_PREFIX STOP_FILE
 *        mpi_late LATE_RANK DELAY_MS N OUT_PREFIX READY_FILE GO_FILE
 *
 * Every phase runs N collectives; "K sleeps" means world rank LATE_RANK sleeps DELAY_MS
 * before each one, so it arrives last and every other member waits about DELAY_MS:
 *
 *   1. MPI_Allreduce, 1 double (8 bytes) on MPI_COMM_WORLD; K sleeps.
 *   2. MPI_Allreduce, 256 doubles (2048 bytes) on MPI_COMM_WORLD; nobody sleeps.
 *   3. MPI_Bcast, 4 ints (16 bytes) from root K on MPI_COMM_WORLD; K sleeps (a late
 *      root: Scalasca's Late Broadcast).
 *   4. MPI_Barrier on MPI_COMM_WORLD; K sleeps.
 *   5. MPI_Comm_split by color rank % 2; on each half, MPI_Allreduce of 4 ints (16
 *      bytes); in the half of color c, world rank c sleeps (two communicators, two late
 *      ranks, instances never mixed).
 *   6. MPI_Comm_dup of MPI_COMM_WORLD; MPI_Allreduce of 1 int (4 bytes) on the
 *      duplicate; K sleeps.
 *
 * No other collective is called. Each rank writes OUT_PREFIX.<rank>.json with its rank,
 * pid and the world size, then calls MPI_Finalize.
 *
 * With STOP_FILE (for attaching to a running job) it runs one phase instead, until any
 * rank sees STOP_FILE: MPI_Allreduce (MPI_MAX) of 1 int, the flag "I saw STOP_FILE", on
 * MPI_COMM_WORLD, K sleeping before each; all ranks leave after the instance in which
 * one saw it. Rank 0 writes its number of calls so far to OUT_PREFIX.progress after each
 * (written then renamed: a reader sees a whole number). Each rank's JSON then has
 * "allreduce_calls", its total.
 *
 * With READY_FILE and GO_FILE (for daemons that attach before the collectives): rank 0
 * creates READY_FILE after MPI_Init, every rank waits (no MPI call) for GO_FILE, then
 * makes a duplicate of MPI_COMM_WORLD and runs N MPI_Allreduce of 1 double (8 bytes) on
 * it, K sleeping before each. With HOLD_BEFORE_INIT=PREFIX, each rank first writes its
 * pid to PREFIX.<rank> and waits for PREFIX before MPI_Init (ready_go.h).
 *
 * With READY_FILE, GO_FILE and PHASES (for a rank detached and attached again between
 * phases): PHASES phases of N MPI_Allreduce of 1 double (8 bytes) on MPI_COMM_WORLD, K
 * sleeping before each, and after each, rank 0 sends one int (tag 7) to rank 1, which
 * receives it with MPI_Recv; after each phase but the last, every rank writes its pid to
 * READY_FILE.<phase>.<rank> and waits (no MPI call) for GO_FILE.<phase>.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "rank_truth.h"
#include "ready_go.h"

static void nap(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

static int after_go(int rank, int size, int late, int delay, long n, const char *prefix,
                    const char *ready, const char *go)
{
    if (rank == 0) {
        FILE *r = fopen(ready, "w");
        if (!r || fclose(r) != 0) {
            perror(ready);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    wait_for_file(go);
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    double d = rank, sum = 0;
    for (long i = 0; i < n; i++) {
        if (rank == late)
            nap(delay);
        MPI_Allreduce(&d, &sum, 1, MPI_DOUBLE, MPI_SUM, dup);
    }
    FILE *f = open_rank_truth(prefix, rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d}\n", rank, (long)getpid(), size);
    fclose(f);
    MPI_Comm_free(&dup);
    MPI_Finalize();
    return 0;
}

static int phased(int rank, int size, int late, int delay, long n, const char *prefix,
                  const char *ready, const char *go, int phases)
{
    double d = rank, sum = 0;
    int one = 1;
    char path[4096];
    for (int p = 0; p < phases; p++) {
        for (long i = 0; i < n; i++) {
            if (rank == late)
                nap(delay);
            MPI_Allreduce(&d, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            if (rank == 0)
                MPI_Send(&one, 1, MPI_INT, 1, 7, MPI_COMM_WORLD);
            else if (rank == 1)
                MPI_Recv(&one, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        if (p == phases - 1)
            break;
        snprintf(path, sizeof path, "%s.%d.%d", ready, p, rank);
        if (write_pid(path) != 0)
            MPI_Abort(MPI_COMM_WORLD, 1);
        snprintf(path, sizeof path, "%s.%d", go, p);
        wait_for_file(path);
    }
    FILE *f = open_rank_truth(prefix, rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d}\n", rank, (long)getpid(), size);
    fclose(f);
    MPI_Finalize();
    return 0;
}

static int until_stopped(int rank, int size, int late, int delay, const char *prefix,
                         const char *stop)
{
    long calls = 0;
    char path[4096], tmp[4096];
    for (;;) {
        if (rank == late)
            nap(delay);
        int seen = access(stop, F_OK) == 0, any = 0;
        MPI_Allreduce(&seen, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        calls++;
        if (rank == 0) {
            snprintf(tmp, sizeof tmp, "%s.progress.tmp", prefix);
            snprintf(path, sizeof path, "%s.progress", prefix);
            FILE *p = fopen(tmp, "w");
            if (!p) {
                perror(tmp);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            fprintf(p, "%ld\n", calls);
            fclose(p);
            rename(tmp, path);
        }
        if (any)
            break;
    }
    FILE *f = open_rank_truth(prefix, rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d, \"allreduce_calls\": %ld}\n",
            rank, (long)getpid(), size, calls);
    fclose(f);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 8) {
        fprintf(stderr,
                "usage: %s LATE_RANK DELAY_MS N OUT_PREFIX [STOP_FILE | READY GO [PHASES]]\n",
                argv[0]);
        return 2;
    }
    int late = atoi(argv[1]), delay = atoi(argv[2]);
    long n = atol(argv[3]);
    int rank, size;
    if (hold_before_init() != 0)
        return 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc == 6)
        return until_stopped(rank, size, late, delay, argv[4], argv[5]);
    if (argc == 8 && size < 2) {
        fprintf(stderr, "%s: PHASES needs 2 ranks or more (rank 0 sends to rank 1)\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (argc == 8)
        return phased(rank, size, late, delay, n, argv[4], argv[5], argv[6], atoi(argv[7]));
    if (argc == 7)
        return after_go(rank, size, late, delay, n, argv[4], argv[5], argv[6]);

    double d = rank, dsum = 0, big[256], bigsum[256];
    for (int i = 0; i < 256; i++)
        big[i] = i;
    int four[4] = {1, 2, 3, 4}, foursum[4], one = 1, onesum = 0;

    for (long i = 0; i < n; i++) {
        if (rank == late)
            nap(delay);
        MPI_Allreduce(&d, &dsum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    for (long i = 0; i < n; i++)
        MPI_Allreduce(big, bigsum, 256, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (long i = 0; i < n; i++) {
        if (rank == late)
            nap(delay);
        MPI_Bcast(four, 4, MPI_INT, late, MPI_COMM_WORLD);
    }
    for (long i = 0; i < n; i++) {
        if (rank == late)
            nap(delay);
        MPI_Barrier(MPI_COMM_WORLD);
    }

    MPI_Comm half;
    int color = rank % 2, half_size;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
    MPI_Comm_size(half, &half_size);
    for (long i = 0; i < n; i++) {
        if (rank == color)
            nap(delay);
        MPI_Allreduce(four, foursum, 4, MPI_INT, MPI_SUM, half);
    }

    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    for (long i = 0; i < n; i++) {
        if (rank == late)
            nap(delay);
        MPI_Allreduce(&one, &onesum, 1, MPI_INT, MPI_SUM, dup);
    }

    FILE *f = open_rank_truth(argv[4], rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d, \"half_size\": %d}\n", rank,
            (long)getpid(), size, half_size);
    fclose(f);
    MPI_Comm_free(&dup);
    MPI_Comm_free(&half);
    MPI_Finalize();
    return 0;
}
