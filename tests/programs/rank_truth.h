/*
 * A rank's truth file for the tests: OUT_PREFIX.<rank>.json, which the test reads back
 * (rank, pid, world size, and what the program adds).
 */
#ifndef COMMTAP_RANK_TRUTH_H
#define COMMTAP_RANK_TRUTH_H

#include <mpi.h>
#include <stdio.h>

/* Opens `prefix`.<rank>.json for writing; aborts the job if it cannot. */
static FILE *open_rank_truth(const char *prefix, int rank)
{
    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", prefix, rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return f;
}

#endif
