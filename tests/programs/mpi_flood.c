/*
 * mpi_flood: a process that makes as many entries of the kernel's node-wide maps as it
 * can, for the attack tests on them (each derived datatype an MPICH-ABI process makes is
 * an entry of the datatype map, each peer rank a send names an entry of the per-peer map,
 * each persistent request an entry of the request map; their user could otherwise fill
 * them for everyone).
 *
 * Usage: mpi_flood WHAT N START_FILE READY_FILE GO_FILE
 *
 * Once MPI_Init has returned, waits until START_FILE exists (the test creates it once
 * commtap has probed the process), then by WHAT:
 *   types-keep, types-free  makes and commits N contiguous datatypes of 1 to 1,000 bytes
 *   peers                   N x MPI_Send of 0 bytes to ranks 1 .. N of MPI_COMM_WORLD,
 *                           which has one (each fails, MPI_ERR_RANK: errors return)
 *   requests-keep           makes N persistent sends (MPI_Send_init of 1 byte to itself),
 *                           never started
 *   requests-free           makes N such sends, then frees them all (MPI_Request_free;
 *                           freeing each before the next would let the library hand
 *                           the same handle out again, and the same entry with it)
 * creates READY_FILE, waits until GO_FILE exists, frees the datatypes (types-free) and
 * the requests kept (requests-keep) or leaves the datatypes to its exit, and finalizes.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ready_go.h"

int main(int argc, char **argv)
{
    const char *what = argc == 6 ? argv[1] : "";
    int types = strcmp(what, "types-keep") == 0 || strcmp(what, "types-free") == 0;
    int requests = strcmp(what, "requests-keep") == 0 || strcmp(what, "requests-free") == 0;
    if (!types && !requests && strcmp(what, "peers") != 0) {
        fprintf(stderr,
                "usage: %s types-keep|types-free|peers|requests-keep|requests-free N START_FILE "
                "READY_FILE GO_FILE\n",
                argv[0]);
        return 2;
    }
    long n = atol(argv[2]);
    MPI_Datatype *made = malloc(sizeof(MPI_Datatype) * (size_t)(n > 0 ? n : 1));
    MPI_Request *kept = malloc(sizeof(MPI_Request) * (size_t)(n > 0 ? n : 1));
    if (!made || !kept)
        return 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    wait_for_file(argv[3]);
    char byte = 0;
    for (long i = 0; i < n; i++) {
        if (types) {
            if (MPI_Type_contiguous((int)(i % 1000) + 1, MPI_BYTE, &made[i]) != MPI_SUCCESS ||
                MPI_Type_commit(&made[i]) != MPI_SUCCESS)
                return 1;
        } else if (requests) {
            if (MPI_Send_init(&byte, 1, MPI_BYTE, 0, 7, MPI_COMM_WORLD, &kept[i]) != MPI_SUCCESS)
                return 1;
        } else if (MPI_Send(&byte, 0, MPI_BYTE, (int)(i + 1), 0, MPI_COMM_WORLD) == MPI_SUCCESS) {
            return 1;
        }
    }
    if (strcmp(what, "requests-free") == 0)
        for (long i = 0; i < n; i++)
            if (MPI_Request_free(&kept[i]) != MPI_SUCCESS)
                return 1;
    if (create_file(argv[4]) != 0)
        return 1;
    wait_for_file(argv[5]);
    if (strcmp(what, "types-free") == 0)
        for (long i = 0; i < n; i++)
            MPI_Type_free(&made[i]);
    if (strcmp(what, "requests-keep") == 0)
        for (long i = 0; i < n; i++)
            MPI_Request_free(&kept[i]);
    MPI_Finalize();
    free(made);
    free(kept);
    return 0;
}
