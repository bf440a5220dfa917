/*
 * mpi_ending: ranks that end badly, for commtap's "how did each rank end" test.
 *
 * Usage: mpi_ending killed|status OUT_PREFIX   (2 ranks)
 *
 * killed: rank 1 sends rank 0 a message from inside an MPI_Sendrecv whose receive never
 *   completes (rank 0 sends nothing back); rank 0 receives it, so rank 1 is then inside
 *   that MPI_Sendrecv for certain, and kills it with SIGKILL; then rank 0 enters an
 *   MPI_Barrier that cannot complete and stays there until its launcher, seeing rank 1
 *   dead, ends it.
 * status: every rank finishes normally, and rank 1 then exits with status 3.
 *
 * Each rank writes OUT_PREFIX.<rank>.json with its rank and pid once MPI_Init has
 * returned; rank 0 (killed) writes {"killed": PID} to OUT_PREFIX.killed.json before the kill.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "rank_truth.h"

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "killed") != 0 && strcmp(argv[1], "status") != 0)) {
        fprintf(stderr, "usage: %s killed|status OUT_PREFIX\n", argv[0]);
        return 2;
    }
    int killed = strcmp(argv[1], "killed") == 0;
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    FILE *f = open_rank_truth(argv[2], rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d}\n", rank, (long)getpid(), size);
    fclose(f);
    if (size != 2)
        MPI_Abort(MPI_COMM_WORLD, 2);
    if (!killed) {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return rank == 1 ? 3 : 0;
    }
    if (rank == 1) {
        long pid = (long)getpid(), never = 0;
        MPI_Sendrecv(&pid, 1, MPI_LONG, 0, 7, &never, 1, MPI_LONG, 0, 8, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        return 1; /* not reached */
    }
    long victim = 0;
    MPI_Recv(&victim, 1, MPI_LONG, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    char path[4096];
    snprintf(path, sizeof path, "%s.killed.json", argv[2]);
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "{\"killed\": %ld}\n", victim);
        fclose(f);
    }
    kill((pid_t)victim, SIGKILL);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 1; /* not reached */
}
