/*
 * mpi_ending: ranks that end badly, for commtap's "how did each rank end" test.
 *
 * Usage: mpi_ending killed|status|escaped|lingering OUT_PREFIX   (2 ranks)
 *
 * killed (MPI_THREAD_MULTIPLE): rank 1's main thread enters an MPI_Sendrecv whose receive
 *   never completes, sending rank 0 its pid (tag 7) from inside it; rank 0 receives that,
 *   so rank 1's main thread is inside its MPI_Sendrecv for certain, and enters an
 *   MPI_Sendrecv of its own that never completes, sending rank 1 a message (tag 6) from
 *   inside it. A second thread of rank 1, blocked in MPI_Recv for that message, then knows
 *   both ranks are inside their MPI_Sendrecv and kills its own process with SIGKILL. Rank 0
 *   stays in its call until its launcher, seeing rank 1 dead, ends it.
 * status: every rank finishes normally; rank 1 waits after MPI_Finalize until rank 0 has
 *   exited (a pidfd of it), then exits with status 3 (a launcher may kill the ranks left
 *   once one fails).
 * escaped: rank 0 enters an MPI_Sendrecv whose receive never completes, sending rank 1 a
 *   message (tag 6) from inside it. Rank 1 receives it, so rank 0 is inside its call for
 *   certain, then, with an error handler on MPI_COMM_WORLD that longjmps back into
 *   main_of_escaped, makes an MPI_Send to a rank that does not exist from a function below
 *   it (as a C++ exception out of the handler would leave the call); back, it writes over
 *   the stack below (as whatever a program calls next does) and exits with status 4 (a
 *   program catching the error and giving up) without another MPI call. Rank 0 stays in
 *   its call until its launcher ends it.
 * lingering: escaped, once OUT_PREFIX.go exists (a profiler attached), where rank 1, back,
 *   creates OUT_PREFIX.left and stays (outside MPI) until OUT_PREFIX.end exists before it
 *   exits with status 4.
 *
 * Each rank writes OUT_PREFIX.<rank>.json with its rank and pid once MPI_Init has
 * returned; rank 0 (killed) writes {"killed": PID} to OUT_PREFIX.killed.json before its
 * MPI_Sendrecv.
 */
#include <mpi.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "rank_truth.h"
#include "ready_go.h"

/* Rank 1's second thread: once rank 0 is inside its MPI_Sendrecv, kills the process. */
static void *killer(void *arg)
{
    (void)arg;
    long go = 0;
    MPI_Recv(&go, 1, MPI_LONG, 0, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    kill(getpid(), SIGKILL);
    return NULL;
}

static int killed_mode(int rank, const char *prefix)
{
    long pid = (long)getpid(), never = 0;
    if (rank == 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, killer, NULL) != 0)
            MPI_Abort(MPI_COMM_WORLD, 4);
        MPI_Sendrecv(&pid, 1, MPI_LONG, 0, 7, &never, 1, MPI_LONG, 0, 8, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        return 1; /* not reached */
    }
    long victim = 0;
    MPI_Recv(&victim, 1, MPI_LONG, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    char path[4096];
    snprintf(path, sizeof path, "%s.killed.json", prefix);
    FILE *f = fopen(path, "w");
    if (!f)
        MPI_Abort(MPI_COMM_WORLD, 5);
    fprintf(f, "{\"killed\": %ld}\n", victim);
    fclose(f);
    MPI_Sendrecv(&pid, 1, MPI_LONG, 1, 6, &never, 1, MPI_LONG, 1, 5, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    return 1; /* not reached */
}

static int status_mode(int rank)
{
    long pid = (long)getpid(), first = 0;
    MPI_Bcast(rank == 0 ? &pid : &first, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    /* Opened while rank 0 runs for certain: it is held in the barrier below. */
    int pidfd = rank == 1 ? (int)syscall(SYS_pidfd_open, (pid_t)first, 0) : -1;
    if (rank == 1 && pidfd < 0)
        MPI_Abort(MPI_COMM_WORLD, 6);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank != 1)
        return 0;
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    while (poll(&p, 1, -1) != 1)
        ;
    return 3;
}

static jmp_buf back;

/* Rank 1's error handler: leaves the failing call for escaped_mode's setjmp. */
static void leave(MPI_Comm *comm, int *err, ...)
{
    (void)comm;
    (void)err;
    longjmp(back, 1);
}

static __attribute__((noinline)) void send_nowhere(void)
{
    volatile char pad[256];
    char b = 0;
    pad[0] = 0;
    MPI_Send(&b, 1, MPI_CHAR, 7, 0, MPI_COMM_WORLD);
    fprintf(stderr, "mpi_ending: a send to rank 7 returned\n");
    MPI_Abort(MPI_COMM_WORLD, 7);
    pad[255] = pad[0];
}

/* Writes over the stack below its caller's frame. */
static __attribute__((noinline)) void scrub(void)
{
    volatile char buf[65536];
    memset((char *)buf, 0x5a, sizeof buf);
    buf[0] = buf[sizeof buf - 1];
}

/* OUT_PREFIX.suffix. */
static const char *prefixed(const char *prefix, const char *suffix)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s.%s", prefix, suffix);
    return path;
}

static int escaped_mode(int rank, const char *prefix, int lingering)
{
    long pid = (long)getpid(), never = 0;
    if (lingering)
        wait_for_file(prefixed(prefix, "go"));
    if (rank == 0) {
        MPI_Sendrecv(&pid, 1, MPI_LONG, 1, 6, &never, 1, MPI_LONG, 1, 5, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        return 1; /* not reached */
    }
    long inside = 0;
    MPI_Recv(&inside, 1, MPI_LONG, 0, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Errhandler eh;
    MPI_Comm_create_errhandler(leave, &eh);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, eh);
    if (setjmp(back) == 0)
        send_nowhere();
    scrub();
    if (lingering) {
        if (create_file(prefixed(prefix, "left")) != 0)
            exit(5);
        wait_for_file(prefixed(prefix, "end"));
    }
    exit(4);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "killed") != 0 && strcmp(argv[1], "status") != 0 &&
                      strcmp(argv[1], "escaped") != 0 && strcmp(argv[1], "lingering") != 0)) {
        fprintf(stderr, "usage: %s killed|status|escaped|lingering OUT_PREFIX\n", argv[0]);
        return 2;
    }
    int killed = strcmp(argv[1], "killed") == 0, provided = 0;
    MPI_Init_thread(&argc, &argv, killed ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE,
                    &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    FILE *f = open_rank_truth(argv[2], rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d}\n", rank, (long)getpid(), size);
    fclose(f);
    if (size != 2 || (killed && provided < MPI_THREAD_MULTIPLE))
        MPI_Abort(MPI_COMM_WORLD, 2);
    if (killed)
        return killed_mode(rank, argv[2]);
    if (strcmp(argv[1], "status") == 0)
        return status_mode(rank);
    return escaped_mode(rank, argv[2], strcmp(argv[1], "lingering") == 0);
}
