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
 * rank sends; Scatter: what each receives; a receive with a status: what arrived), and
 * the vector forms (`MPI_Alltoallv_c` ...: `MPI_Count` arrays) as theirs; persistent
 * requests created with `_c` routines count again at each `MPI_Startall`.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ROUTINES 64

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

    /* Vector collectives: MPI_Count counts, MPI_Aint displacements (MPI-4). Rank r sends
     * r + j + 1 ints to rank j (Alltoallv: bytes per peer, sum / P, integer division). */
    {
        MPI_Count sc[2], rc[2];
        MPI_Aint sd[2], rd[2];
        long long sum = 0;
        for (int j = 0; j < 2; j++) {
            sc[j] = rank + j + 1;
            rc[j] = j + rank + 1;
            sum += sc[j];
        }
        sd[0] = 0, sd[1] = 16, rd[0] = 0, rd[1] = 16;
        note("MPI_Alltoallv_c", sum * (long long)sizeof(int) / size);
        MPI_Alltoallv_c(a, sc, sd, MPI_INT, b, rc, rd, MPI_INT, MPI_COMM_WORLD);
        note("MPI_Ialltoallv_c", sum * (long long)sizeof(int) / size);
        MPI_Ialltoallv_c(a, sc, sd, MPI_INT, b, rc, rd, MPI_INT, MPI_COMM_WORLD, &req);
        note("MPI_Wait", 0);
        MPI_Wait(&req, MPI_STATUS_IGNORE);

        /* Allgatherv: rank r contributes r + 2 ints (bytes: what this rank's slot holds). */
        MPI_Count ac[2] = {2, 3};
        MPI_Aint ad[2] = {0, 16};
        note("MPI_Allgatherv_c", ac[rank] * (long long)sizeof(int));
        MPI_Allgatherv_c(a, ac[rank], MPI_INT, b, ac, ad, MPI_INT, MPI_COMM_WORLD);

        /* Reduce_scatter: rank r gets r + 1 doubles (bytes: the whole vector). */
        MPI_Count rsc[2] = {1, 2};
        note("MPI_Reduce_scatter_c", (rsc[0] + rsc[1]) * (long long)sizeof(double));
        MPI_Reduce_scatter_c(a, b, rsc, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        /* Reduce_scatter_block: each rank's block (mpitrace's rule). */
        note("MPI_Reduce_scatter_block_c", 3 * (long long)sizeof(double));
        MPI_Reduce_scatter_block_c(a, b, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

        /* Alltoallw: to rank 0 (r + 1) ints, to rank 1 (r + 1) doubles; byte displacements. */
        MPI_Count wc[2] = {rank + 1, rank + 1}, wrc[2] = {1, 2};
        MPI_Aint wsd[2] = {0, 64}, wrd[2] = {0, 64};
        MPI_Datatype wst[2] = {MPI_INT, MPI_DOUBLE};
        MPI_Datatype wrt[2] = {rank ? MPI_DOUBLE : MPI_INT, rank ? MPI_DOUBLE : MPI_INT};
        note("MPI_Alltoallw_c",
             (wc[0] * (long long)sizeof(int) + wc[1] * (long long)sizeof(double)) / size);
        MPI_Alltoallw_c(a, wc, wsd, wst, b, wrc, wrd, wrt, MPI_COMM_WORLD);

        /* Gatherv to rank 0 (rank + 3 ints each), Scatterv from rank 1 (rank + 4 each). */
        MPI_Count gc[2] = {3, 4}, vc[2] = {4, 5};
        MPI_Aint gd[2] = {0, 16}, vd[2] = {0, 16};
        note("MPI_Gatherv_c", gc[rank] * (long long)sizeof(int));
        MPI_Gatherv_c(a, gc[rank], MPI_INT, b, gc, gd, MPI_INT, 0, MPI_COMM_WORLD);
        note("MPI_Scatterv_c", vc[rank] * (long long)sizeof(int));
        MPI_Scatterv_c(a, vc, vd, MPI_INT, b, vc[rank], MPI_INT, 1, MPI_COMM_WORLD);
        note("MPI_Iallgather_c", 6 * (long long)sizeof(int));
        MPI_Iallgather_c(a, 6, MPI_INT, b, 6, MPI_INT, MPI_COMM_WORLD, &req);
        note("MPI_Wait", 0);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
    /* A window of 64 bytes: its size, as mpitrace counts it. */
    {
        void *base;
        MPI_Win win;
        note("MPI_Win_allocate_c", 64);
        MPI_Win_allocate_c(64, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
        note("MPI_Win_free", 0);
        MPI_Win_free(&win);
    }

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

    /* Datatypes made by the large-count constructors: a Sendrecv of one element of each,
     * each way, moves its size (which the kernel learnt at the constructor's return). */
    {
        MPI_Datatype t[6];
        note("MPI_Type_contiguous_c", 0);
        MPI_Type_contiguous_c(5, MPI_INT, &t[0]); /* 20 bytes */
        note("MPI_Type_vector_c", 0);
        MPI_Type_vector_c(3, 2, 4, MPI_DOUBLE, &t[1]); /* 48 */
        const MPI_Count bl[2] = {1, 3}, dl[2] = {0, 4};
        note("MPI_Type_indexed_c", 0);
        MPI_Type_indexed_c(2, bl, dl, MPI_INT, &t[2]); /* 16 */
        const MPI_Count sbl[2] = {1, 2}, sdl[2] = {0, 8};
        const MPI_Datatype st[2] = {MPI_INT, MPI_DOUBLE};
        note("MPI_Type_create_struct_c", 0);
        MPI_Type_create_struct_c(2, sbl, sdl, st, &t[3]); /* 4 + 16 */
        const MPI_Count sizes[2] = {4, 6}, subsizes[2] = {2, 3}, starts[2] = {1, 2};
        note("MPI_Type_create_subarray_c", 0);
        MPI_Type_create_subarray_c(2, sizes, subsizes, starts, MPI_ORDER_C, MPI_INT,
                                   &t[4]); /* 2 x 3 ints */
        /* A 4 x 6 array of ints, its rows whole, its columns dealt one by one to the 1 x 2
         * process grid: 4 x 3 ints each. */
        const MPI_Count gsizes[2] = {4, 6};
        const int distribs[2] = {MPI_DISTRIBUTE_NONE, MPI_DISTRIBUTE_CYCLIC};
        const int dargs[2] = {MPI_DISTRIBUTE_DFLT_DARG, MPI_DISTRIBUTE_DFLT_DARG};
        const int grid[2] = {1, 2};
        note("MPI_Type_create_darray_c", 0);
        MPI_Type_create_darray_c(2, rank, 2, gsizes, distribs, dargs, grid, MPI_ORDER_C,
                                 MPI_INT, &t[5]); /* 48 */
        const long long tsize[6] = {20, 48, 16, 20, 24, 48};
        for (int k = 0; k < 6; k++) {
            note("MPI_Type_commit", 0);
            MPI_Type_commit(&t[k]);
        }
        for (int k = 0; k < 6; k++) {
            note("MPI_Sendrecv", 2 * tsize[k]);
            SENT(tsize[k]);
            RECEIVED(tsize[k]);
            MPI_Sendrecv(a, 1, t[k], other, 20 + k, b, 1, t[k], other, 20 + k, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
        }
        for (int k = 0; k < 6; k++) {
            note("MPI_Type_free", 0);
            MPI_Type_free(&t[k]);
        }
    }

    /* Persistent requests with MPI_Count counts: their bytes at the creation, and again
     * at each start (per peer too: a send and a posted receive). */
    MPI_Request pr[2];
    note("MPI_Recv_init_c", 30 * (long long)sizeof(double));
    MPI_Recv_init_c(b, 30, MPI_DOUBLE, other, 12, MPI_COMM_WORLD, &pr[0]);
    note("MPI_Send_init_c", 30 * (long long)sizeof(double));
    MPI_Send_init_c(a, 30, MPI_DOUBLE, other, 12, MPI_COMM_WORLD, &pr[1]);
    for (int round = 0; round < 2; round++) {
        note("MPI_Startall", 2 * 30 * (long long)sizeof(double));
        RECEIVED(30 * (long long)sizeof(double));
        SENT(30 * (long long)sizeof(double));
        MPI_Startall(2, pr);
        note("MPI_Waitall", 0);
        MPI_Waitall(2, pr, MPI_STATUSES_IGNORE);
    }
    note("MPI_Request_free", 0);
    MPI_Request_free(&pr[0]);
    note("MPI_Request_free", 0);
    MPI_Request_free(&pr[1]);

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
