/*
 * mpi_type_flood: a process that makes N derived datatypes and keeps them, for the attack
 * test on the kernel's handle maps (each datatype an MPICH-ABI process makes is an entry
 * of the node-wide datatype map, whose user could otherwise fill it for everyone).
 *
 * Usage: mpi_type_flood N START_FILE READY_FILE GO_FILE free|keep
 *
 * Once MPI_Init has returned, waits until START_FILE exists (the test creates it once
 * commtap has probed the process), makes and commits N contiguous datatypes of 1 to 1,000
 * bytes, creates READY_FILE, waits until GO_FILE exists, then frees them all ("free") or
 * leaves them to its exit ("keep"), and finalizes.
 */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ready_go.h"

int main(int argc, char **argv)
{
    if (argc != 6 || (strcmp(argv[5], "free") != 0 && strcmp(argv[5], "keep") != 0)) {
        fprintf(stderr, "usage: %s N START_FILE READY_FILE GO_FILE free|keep\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    MPI_Datatype *types = malloc(sizeof(MPI_Datatype) * (size_t)(n > 0 ? n : 1));
    if (!types)
        return 1;
    MPI_Init(&argc, &argv);
    wait_for_file(argv[2]);
    for (long i = 0; i < n; i++) {
        if (MPI_Type_contiguous((int)(i % 1000) + 1, MPI_BYTE, &types[i]) != MPI_SUCCESS ||
            MPI_Type_commit(&types[i]) != MPI_SUCCESS)
            return 1;
    }
    int fd = open(argv[3], O_CREAT | O_WRONLY, 0644);
    if (fd < 0)
        return 1;
    close(fd);
    wait_for_file(argv[4]);
    if (strcmp(argv[5], "free") == 0)
        for (long i = 0; i < n; i++)
            MPI_Type_free(&types[i]);
    MPI_Finalize();
    free(types);
    return 0;
}
