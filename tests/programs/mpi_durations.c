/*
 * mpi_durations: calls whose durations are known, for commtap's latency-distribution tests.
 *
 * Usage: mpi_durations OUT_PREFIX [--wait] SLEEP_US...        (2 ranks)
 *
 * For each SLEEP_US, rank 0 calls MPI_Sendrecv: it sends rank 1 a "go" (tag 1) and takes
 * its reply (tag 2). With --wait it posts the reply's MPI_Irecv, sends the go (MPI_Send)
 * and waits for the reply in MPI_Wait, the call it times; a Wait's time may be sampled
 * (MPI_Sendrecv's never is). Rank 1 receives the go (MPI_Recv), sleeps SLEEP_US, then replies
 * (MPI_Send). The go leaves after rank 0's MPI_Sendrecv began and the reply after the
 * sleep, so that MPI_Sendrecv lasts at least SLEEP_US, and a little more: the message
 * latency and the oversleep.
 *
 * Each rank writes OUT_PREFIX.<rank>.json: {"rank":R,"pid":PID,"sleeps_ns":[...],
 * "took_ns":[...]}: the sleeps rank 0's MPI_Sendrecv calls waited for, in order, and how
 * long each call took as rank 0 timed it around the call (CLOCK_MONOTONIC, the probes'
 * clock); both empty on rank 1. A probe sees each call last between its sleep and its
 * time around the call, however loaded the machine. With --wait the sleep may begin
 * before MPI_Wait does (when the go arrives): "floors_ns" then holds, for each call, its
 * sleep less the time from before MPI_Send to before MPI_Wait, the least it can last.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_us(long us)
{
    struct timespec t = {us / 1000000, (us % 1000000) * 1000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT_PREFIX SLEEP_US...\n", argv[0]);
        return 2;
    }
    int rank, size, go = 1, reply = 0;
    int wait = argc > 2 && strcmp(argv[2], "--wait") == 0;
    int first = wait ? 3 : 2;
    long long *took = calloc((size_t)argc, sizeof *took);
    long long *floor_ns = calloc((size_t)argc, sizeof *floor_ns);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        fprintf(stderr, "mpi_durations: needs 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (int i = first; i < argc; i++) {
        if (rank == 0 && wait) {
            struct timespec s0, t0, t1;
            MPI_Request req;
            MPI_Irecv(&reply, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, &req);
            clock_gettime(CLOCK_MONOTONIC, &s0);
            MPI_Send(&go, 1, MPI_INT, 1, 1, MPI_COMM_WORLD);
            clock_gettime(CLOCK_MONOTONIC, &t0);
            MPI_Wait(&req, MPI_STATUS_IGNORE);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            took[i] = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
            long long gap = (t0.tv_sec - s0.tv_sec) * 1000000000LL + (t0.tv_nsec - s0.tv_nsec);
            floor_ns[i] = atol(argv[i]) * 1000LL - gap;
            if (floor_ns[i] < 0)
                floor_ns[i] = 0;
        } else if (rank == 0) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            MPI_Sendrecv(&go, 1, MPI_INT, 1, 1, &reply, 1, MPI_INT, 1, 2, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            took[i] = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
        } else {
            MPI_Recv(&go, 1, MPI_INT, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            sleep_us(atol(argv[i]));
            MPI_Send(&reply, 1, MPI_INT, 0, 2, MPI_COMM_WORLD);
        }
    }

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(f, "{\"rank\":%d,\"pid\":%ld,\"sleeps_ns\":[", rank, (long)getpid());
    for (int i = first; rank == 0 && i < argc; i++)
        fprintf(f, "%s%lld", i > first ? "," : "", atol(argv[i]) * 1000LL);
    fprintf(f, "],\"took_ns\":[");
    for (int i = first; rank == 0 && i < argc; i++)
        fprintf(f, "%s%lld", i > first ? "," : "", took[i]);
    fprintf(f, "],\"floors_ns\":[");
    for (int i = first; rank == 0 && wait && i < argc; i++)
        fprintf(f, "%s%lld", i > first ? "," : "", floor_ns[i]);
    fprintf(f, "]}\n");
    fclose(f);
    MPI_Finalize();
    return 0;
}
