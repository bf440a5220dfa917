/*
 * mpi_abandoned: MPI calls left without returning, for commtap's tests. An error handler
 * that jumps out of the failing call (`longjmp`, as a C++ exception thrown from one
 * unwinds) leaves the call's return never to come; the kernel drops its return probe, and
 * the probes must take the thread's next calls as its own, not as nested in that one.
 *
 * Usage: mpi_abandoned N OUT_PREFIX        (any number of ranks)
 *
 * Each rank, on MPI_COMM_WORLD with an error handler that longjmps back into main:
 *  1. MPI_Send to a rank that does not exist, made from a function main calls
 *     (`send_from_below`); back in main, the next calls are made from main itself, above
 *     where the abandoned send's return address was: N MPI_Allreduce of 1 double.
 *  2. The same send; back in main, `scrub` reuses the stack below main's frame (as
 *     whatever the program calls next does), and the next calls are made from functions
 *     further down (`allreduce_from_below`), below where the send's return address was:
 *     only that address's word, no longer the kernel's return trampoline, tells them
 *     apart from calls nested in the send. N MPI_Allreduce of 1 double.
 * Then MPI_Comm_rank, MPI_Comm_size, MPI_Errhandler_free and MPI_Finalize.
 *
 * Writes OUT_PREFIX.<rank>.json in mpi_truth's form ({"rank","size","pid","routines":
 * {NAME: {"calls","bytes"}}}) with the calls that returned (MPI_Finalize aside), and
 * "abandoned": the sends left (2), which are not counted.
 */
#include <mpi.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "rank_truth.h"

static jmp_buf back;
static long long allreduces, abandoned;

/* The error handler: leaves the failing call for main's setjmp. */
static void leave(MPI_Comm *comm, int *err, ...)
{
    (void)comm;
    (void)err;
    longjmp(back, 1);
}

static __attribute__((noinline)) void bad_send(int size)
{
    char b = 0;
    MPI_Send(&b, 1, MPI_CHAR, size + 5, 0, MPI_COMM_WORLD);
    fprintf(stderr, "mpi_abandoned: a send to rank %d returned\n", size + 5);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static __attribute__((noinline)) void send_from_below(int size)
{
    volatile char pad[256];
    pad[0] = 0;
    bad_send(size);
    pad[255] = pad[0];
}

/* Writes over the stack below its caller's frame. */
static __attribute__((noinline)) void scrub(void)
{
    volatile char buf[65536];
    memset((char *)buf, 0x5a, sizeof buf);
    buf[0] = buf[sizeof buf - 1];
}

static __attribute__((noinline)) void allreduces_of(long n)
{
    double x = 1, y;
    for (long i = 0; i < n; i++) {
        MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        allreduces++;
    }
}

static __attribute__((noinline)) void allreduce_two_below(long n)
{
    volatile char pad[4096];
    pad[0] = 0;
    allreduces_of(n);
    pad[4095] = pad[0];
}

static __attribute__((noinline)) void allreduce_from_below(long n)
{
    volatile char pad[4096];
    pad[0] = 0;
    allreduce_two_below(n);
    pad[4095] = pad[0];
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s N OUT_PREFIX\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Errhandler eh;
    MPI_Comm_create_errhandler(leave, &eh);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, eh);

    if (setjmp(back) == 0)
        send_from_below(size);
    abandoned++;
    double x = 1, y;
    for (long i = 0; i < n; i++) {
        MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        allreduces++;
    }

    if (setjmp(back) == 0)
        send_from_below(size);
    abandoned++;
    scrub();
    allreduce_from_below(n);

    int r, s;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &s);

    FILE *f = open_rank_truth(argv[2], rank);
    fprintf(f,
            "{\"rank\":%d,\"size\":%d,\"pid\":%ld,\"abandoned\":%lld,\"routines\":{"
            "\"MPI_Init\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Comm_rank\":{\"calls\":2,\"bytes\":0},"
            "\"MPI_Comm_size\":{\"calls\":2,\"bytes\":0},"
            "\"MPI_Comm_create_errhandler\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Comm_set_errhandler\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Errhandler_free\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Allreduce\":{\"calls\":%lld,\"bytes\":%lld}}}\n",
            rank, size, (long)getpid(), abandoned, allreduces,
            allreduces * (long long)sizeof(double));
    if (fclose(f) != 0) {
        perror("truth");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Errhandler_free(&eh);
    MPI_Finalize();
    return 0;
}
