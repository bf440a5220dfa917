/*
 * mpi_large_count: MPI-4's large-count routines (`MPI_Count` counts), for commtap's tests
 * of MPIs that export them (MPICH 5).
 *
 * Usage: mpi_large_count OUT_PREFIX        (2 ranks)
 *
 * Each rank makes a fixed set of `_c` collectives on MPI_COMM_WORLD (with `MPI_Count`
 * counts), one broadcast of 2 GiB + 8 bytes on MPI_COMM_SELF, and `_c` point-to-point
 * with the other rank (blocking, with a status and without; nonblocking), counting each
 * itself, and writes OUT_PREFIX.<rank>.json in mpi_truth's form: {"rank":R,"size":P,
 * "pid":PID,"routines":{"MPI_Send_c":{"calls":N,"bytes":B}, ...},"peers":[{"peer",
 * "sent_calls","sent_bytes","received_calls","received_bytes"}]} (mpi_peers' form). Bytes
 * follow mpitrace's rules, as for the base routines: count x type size (Gather: what each
 * rank sends; Scatter: what each receives; a receive with a status: what arrived).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ROUTINES 32

static struct {
    const char *name;
    long long calls, bytes;
} table[MAX_ROUTINES];
static int nroutines;

static void note(const char *name, long long bytes)
{
    int i = 0;
    while (i < nroutines && strcmp(table[i].name, name) != 0)
        i++;
    if (i == nroutines) {
        if (nroutines == MAX_ROUTINES)
            abort();
        table[nroutines++].name = name;
    }
    table[i].calls++;
    table[i].bytes += bytes;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_PREFIX\n", argv[0]);
        return 2;
    }
    static double a[8192], b[8192 * 2];
    int rank, size;
    note("MPI_Init", 0);
    MPI_Init(&argc, &argv);
    note("MPI_Comm_rank", 0);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    note("MPI_Comm_size", 0);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        fprintf(stderr, "mpi_large_count: needs 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Request req;

    note("MPI_Bcast_c", 5000 * (long long)sizeof(double));
    MPI_Bcast_c(a, 5000, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    /* Above 2 GiB in one call (what an int count cannot say, and mpitrace's int totals
     * overflow on): on MPI_COMM_SELF a broadcast moves nothing, so the buffer is only
     * reserved, never touched. */
    const MPI_Count big = (1LL << 31) + 8;
    char *huge = malloc((size_t)big);
    if (!huge)
        MPI_Abort(MPI_COMM_WORLD, 1);
    note("MPI_Bcast_c", big);
    MPI_Bcast_c(huge, big, MPI_BYTE, 0, MPI_COMM_SELF);
    free(huge);
    note("MPI_Allreduce_c", 300 * (long long)sizeof(double));
    MPI_Allreduce_c(a, b, 300, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    note("MPI_Reduce_c", 40 * (long long)sizeof(int));
    MPI_Reduce_c(a, b, 40, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    note("MPI_Allgather_c", 64 * (long long)sizeof(int));
    MPI_Allgather_c(a, 64, MPI_INT, b, 64, MPI_INT, MPI_COMM_WORLD);
    note("MPI_Alltoall_c", 128 * (long long)sizeof(double));
    MPI_Alltoall_c(a, 128, MPI_DOUBLE, b, 128, MPI_DOUBLE, MPI_COMM_WORLD);
    note("MPI_Gather_c", 50 * (long long)sizeof(int));
    MPI_Gather_c(a, 50, MPI_INT, b, 50, MPI_INT, 1, MPI_COMM_WORLD);
    note("MPI_Scatter_c", 60 * (long long)sizeof(int));
    MPI_Scatter_c(a, 60, MPI_INT, b, 60, MPI_INT, 0, MPI_COMM_WORLD);
    note("MPI_Scan_c", 7 * (long long)sizeof(double));
    MPI_Scan_c(a, b, 7, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    note("MPI_Exscan_c", 9 * (long long)sizeof(double));
    MPI_Exscan_c(a, b, 9, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    note("MPI_Ibcast_c", 11 * (long long)sizeof(double));
    MPI_Ibcast_c(a, 11, MPI_DOUBLE, 1, MPI_COMM_WORLD, &req);
    note("MPI_Wait", 0);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    note("MPI_Iallreduce_c", 13 * (long long)sizeof(int));
    MPI_Iallreduce_c(a, b, 13, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
    note("MPI_Wait", 0);
    MPI_Wait(&req, MPI_STATUS_IGNORE);

    /* Point-to-point with MPI_Count counts, each rank to the other in turn. */
    const int other = 1 - rank;
    long long sent_calls = 0, sent_bytes = 0, received_calls = 0, received_bytes = 0;
#define SENT(n) (sent_calls++, sent_bytes += (n))
#define RECEIVED(n) (received_calls++, received_bytes += (n))
    for (int turn = 0; turn < 2; turn++) {
        if (turn == rank) {
            note("MPI_Send_c", 700 * (long long)sizeof(double));
            SENT(700 * (long long)sizeof(double));
            MPI_Send_c(a, 700, MPI_DOUBLE, other, 7, MPI_COMM_WORLD);
            note("MPI_Ssend_c", 21 * (long long)sizeof(int));
            SENT(21 * (long long)sizeof(int));
            MPI_Ssend_c(a, 21, MPI_INT, other, 8, MPI_COMM_WORLD);
        } else {
            /* Posted for 800, 700 arrive: the status says what came. */
            MPI_Status status;
            note("MPI_Recv_c", 700 * (long long)sizeof(double));
            RECEIVED(700 * (long long)sizeof(double));
            MPI_Recv_c(b, 800, MPI_DOUBLE, other, 7, MPI_COMM_WORLD, &status);
            note("MPI_Recv_c", 21 * (long long)sizeof(int));
            RECEIVED(21 * (long long)sizeof(int));
            MPI_Recv_c(b, 21, MPI_INT, other, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
    }
    MPI_Request both[2];
    note("MPI_Irecv_c", 55 * (long long)sizeof(double));
    RECEIVED(55 * (long long)sizeof(double));
    MPI_Irecv_c(b, 55, MPI_DOUBLE, other, 9, MPI_COMM_WORLD, &both[0]);
    note("MPI_Isend_c", 55 * (long long)sizeof(double));
    SENT(55 * (long long)sizeof(double));
    MPI_Isend_c(a, 55, MPI_DOUBLE, other, 9, MPI_COMM_WORLD, &both[1]);
    note("MPI_Waitall", 0);
    MPI_Waitall(2, both, MPI_STATUSES_IGNORE);
    /* Both at once: bytes sent and posted to receive (mpitrace's rule for Sendrecv). */
    /* Rank 0 sends 17 and receives 19; rank 1 the other way round. */
    const MPI_Count out = rank ? 19 : 17, in = rank ? 17 : 19;
    note("MPI_Sendrecv_c", (out + in) * (long long)sizeof(int));
    SENT(out * (long long)sizeof(int));
    RECEIVED(in * (long long)sizeof(int));
    MPI_Sendrecv_c(a, out, MPI_INT, other, 10, b, in, MPI_INT, other, 10, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
    note("MPI_Sendrecv_replace_c", 2 * 23 * (long long)sizeof(double));
    SENT(23 * (long long)sizeof(double));
    RECEIVED(23 * (long long)sizeof(double));
    MPI_Sendrecv_replace_c(b, 23, MPI_DOUBLE, other, 11, other, 11, MPI_COMM_WORLD,
                           MPI_STATUS_IGNORE);

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(f, "{\"rank\":%d,\"size\":%d,\"pid\":%ld,\"routines\":{", rank, size, (long)getpid());
    for (int i = 0; i < nroutines; i++)
        fprintf(f, "%s\"%s\":{\"calls\":%lld,\"bytes\":%lld}", i ? "," : "", table[i].name,
                table[i].calls, table[i].bytes);
    fprintf(f, "},\"peers\":[{\"peer\":%d,\"sent_calls\":%lld,\"sent_bytes\":%lld,"
               "\"received_calls\":%lld,\"received_bytes\":%lld}]}\n",
            other, sent_calls, sent_bytes, received_calls, received_bytes);
    fclose(f);
    MPI_Finalize();
    return 0;
}
