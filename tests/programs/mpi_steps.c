/*
 * mpi_steps: a training loop's shape, for commtap's "who is late" tests: rank 1's step
 * takes longer, so the others wait for it at each step's first collective and never after.
 *
 * Usage: mpi_steps STEPS K DELAY_MS OUT_PREFIX [loss [FINISH_FILE]]   (2 ranks)
 *
 * Each of STEPS steps: rank 1 sleeps DELAY_MS (its longer compute), then both ranks make
 * K MPI_Allreduce of 1 double (8 bytes) on MPI_COMM_WORLD. No other collective is
 * called: rank 0 waits about DELAY_MS for rank 1 at the first Allreduce of each step, and
 * the ranks are in step for the other K - 1. Each rank writes OUT_PREFIX.<rank>.json with
 * its rank, pid and the world size, then calls MPI_Finalize.
 *
 * With `loss`, each step begins with one MPI_Allreduce of 1 float (4 bytes: the step's
 * loss), before its K; with FINISH_FILE too, each rank waits for that file before
 * MPI_Finalize. HOLD_BEFORE_INIT holds it before MPI_Init (ready_go.h); with
 * HOLD_FIRST_STEP=FILE, rank 1 waits for FILE before its first step (rank 0 waits inside
 * the first step's first MPI_Allreduce meanwhile).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "rank_truth.h"
#include "ready_go.h"

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 7 || (argc > 5 && strcmp(argv[5], "loss") != 0)) {
        fprintf(stderr, "usage: %s STEPS K DELAY_MS OUT_PREFIX [loss [FINISH_FILE]]\n",
                argv[0]);
        return 2;
    }
    long steps = atol(argv[1]), k = atol(argv[2]);
    int delay = atoi(argv[3]);
    int loss = argc > 5;
    const char *finish = argc > 6 ? argv[6] : NULL;
    int rank, size;
    if (hold_before_init() != 0)
        return 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        fprintf(stderr, "mpi_steps: 2 ranks, not %d\n", size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *hold = getenv("HOLD_FIRST_STEP");
    if (hold && rank == 1)
        wait_for_file(hold);
    double d = rank, sum = 0;
    float step_loss = 1, total_loss = 0;
    for (long s = 0; s < steps; s++) {
        if (rank == 1) {
            struct timespec t = {delay / 1000, (long)(delay % 1000) * 1000000L};
            while (nanosleep(&t, &t) != 0)
                ;
        }
        if (loss)
            MPI_Allreduce(&step_loss, &total_loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (long i = 0; i < k; i++)
            MPI_Allreduce(&d, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    FILE *f = open_rank_truth(argv[4], rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d}\n", rank, (long)getpid(), size);
    fclose(f);
    if (finish)
        wait_for_file(finish);
    MPI_Finalize();
    return 0;
}
