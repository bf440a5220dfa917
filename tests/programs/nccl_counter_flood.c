/*
 * nccl_counter_flood: a process that makes as many of commtap's counters as it can, for
 * the attack test on the kernel's counter map (each communicator size, rank and message
 * size bucket of a routine is a counter of its own, whose slots are the node's).
 * Linked against the NCCL stand-in (nccl_standin.c), which lets a process make
 * communicators of any size without a GPU, as a user's own library could, and MPICH (an
 * MPI job's process is one the daemon profiles from the start).
 *
 * Usage: nccl_counter_flood N B START_FILE READY_FILE GO_FILE
 *
 * After MPI_Init, once START_FILE exists: N x ncclCommInitRank (communicator i of 2 + i ranks, rank 0),
 * then on each communicator B x ncclAllReduce of 8 << b bytes (b = 0 .. B-1): N x B
 * counters of ncclAllReduce, one call each. Creates READY_FILE, waits for GO_FILE,
 * finalizes.
 */
#include "nccl_abi.h"
#include "ready_go.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s N B START_FILE READY_FILE GO_FILE\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]), b = atol(argv[2]);
    ncclComm_t *comms = calloc((size_t)(n > 0 ? n : 1), sizeof(ncclComm_t));
    ncclUniqueId id = {{0}};
    if (!comms || ncclGetUniqueId(&id) != 0)
        return 1;
    MPI_Init(&argc, &argv);
    wait_for_file(argv[3]);
    for (long i = 0; i < n; i++)
        if (ncclCommInitRank(&comms[i], (int)(2 + i), id, 0) != 0)
            return 1;
    for (long i = 0; i < n; i++)
        for (long k = 0; k < b; k++)
            if (ncclAllReduce(NULL, NULL, (size_t)8 << k, ncclInt8, ncclSum, comms[i], NULL) != 0)
                return 1;
    if (create_file(argv[4]) != 0)
        return 1;
    wait_for_file(argv[5]);
    MPI_Finalize();
    return 0;
}
