/*
 * mpi_stuck: a job already hung when commtap attaches, for "where is each rank" after a
 * late attach (no probe saw its calls begin).
 *
 * Usage: mpi_stuck GO_FILE OUT_PREFIX   (2 ranks)
 *
 * Rank 0 enters an MPI_Sendrecv that sends rank 1 a message (tag 1) from inside it and
 * receives one (tag 2) that rank 1 sends only once GO_FILE exists. Rank 1 receives the
 * first message, so rank 0 is inside its MPI_Sendrecv for certain and stays there until
 * the go; rank 1 then creates OUT_PREFIX.stuck and waits for GO_FILE outside MPI. Once it
 * exists, rank 1 sends the second message and both finish.
 *
 * Each rank writes OUT_PREFIX.<rank>.json with its rank, pid and the world size once
 * MPI_Init has returned; rank 0 writes OUT_PREFIX.call.json with the line of its
 * MPI_Sendrecv before it.
 */
#include <mpi.h>
#include <stdio.h>
#include "rank_truth.h"
#include "ready_go.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s GO_FILE OUT_PREFIX\n", argv[0]);
        return 2;
    }
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    FILE *f = open_rank_truth(argv[2], rank);
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"size\": %d}\n", rank, (long)getpid(), size);
    fclose(f);
    if (size != 2)
        MPI_Abort(MPI_COMM_WORLD, 2);
    long out = rank, in = -1;
    MPI_Comm world = MPI_COMM_WORLD;
    if (rank == 0) {
        /* The line of the call it stays in, for the test to find as its call site. */
        char path[4096];
        snprintf(path, sizeof path, "%s.call.json", argv[2]);
        FILE *call = fopen(path, "w");
        if (!call)
            MPI_Abort(MPI_COMM_WORLD, 4);
        fprintf(call, "{\"line\": %d}\n", __LINE__ + 2);
        fclose(call);
        MPI_Sendrecv(&out, 1, MPI_LONG, 1, 1, &in, 1, MPI_LONG, 1, 2, world, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(&in, 1, MPI_LONG, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        char path[4096];
        snprintf(path, sizeof path, "%s.stuck", argv[2]);
        if (create_file(path) != 0)
            MPI_Abort(MPI_COMM_WORLD, 3);
        wait_for_file(argv[1]);
        MPI_Send(&out, 1, MPI_LONG, 0, 2, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return in == 1 - rank ? 0 : 1;
}
