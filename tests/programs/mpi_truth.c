/*
 * mpi_truth: ground-truth MPI workload for commtap end-to-end tests.
 *
 * Usage: mpi_truth OUT_PREFIX [ITERS]      (ITERS defaults to 3)
 *
 * Every rank performs a deterministic set of MPI calls (ITERS loops of
 * point-to-point, collective, nonblocking and one-sided traffic, with
 * predefined and derived datatypes) and counts each call itself with note()
 * right next to it.  After its last counted MPI call, and before
 * MPI_Finalize, each rank writes OUT_PREFIX.<rank>.json:
 *
 *   {"rank":R,"size":P,"pid":PID,"device":D,"arrows_from_left":M,"recv_status_ignored":K,
 *    "receives_without_arrival":W,"persistent_channel_calls":C,"receives_without_send":S,
 *    "arrows_sharing_a_slice":A,
 *    "routines":{"MPI_Send":{"calls":N,"bytes":B}, ...},
 *    "comm_sizes":{"MPI_Allreduce":[2,4], ...}}
 *
 * Byte conventions (see README.md): bytes = count x type size, where type
 * size is MPI_Type_size semantics (packed data size, not extent).  Sizes are
 * computed here with sizeof arithmetic; MPI_Type_size is never called.
 * MPI_Finalize, after the truth is written, is called but not counted.  No other
 * MPI routine is called.
 */
#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* MPI-4's persistent collectives: MPI_*_init in MPI-4 libraries (MPICH 4) and in Open MPI 5
 * (which says MPI 3.1 but has MPI-4's persistent, partitioned and Isendrecv routines),
 * MPIX_*_init in Open MPI 4.1's extension; none in MPI-3 libraries. */
#if (defined(MPI_VERSION) && MPI_VERSION >= 4) || \
    (defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5)
#define MPI4_ROUTINES 1
#else
#define MPI4_ROUTINES 0
#endif
#if MPI4_ROUTINES
#define PERSISTENT_COLLECTIVES 1
#define PCOLL(name) "MPI_" name
#define ALLREDUCE_INIT MPI_Allreduce_init
#define BCAST_INIT MPI_Bcast_init
#define ALLGATHERV_INIT MPI_Allgatherv_init
#elif defined(OPEN_MPI)
#include <mpi-ext.h>
#if defined(OMPI_HAVE_MPI_EXT_PCOLLREQ) && OMPI_HAVE_MPI_EXT_PCOLLREQ
#define PERSISTENT_COLLECTIVES 1
#define PCOLL(name) "MPIX_" name
#define ALLREDUCE_INIT MPIX_Allreduce_init
#define BCAST_INIT MPIX_Bcast_init
#define ALLGATHERV_INIT MPIX_Allgatherv_init
#endif
#endif
#ifndef PERSISTENT_COLLECTIVES
#define PERSISTENT_COLLECTIVES 0
#endif

/* ---------------------------------------------------------------- truth */

#define MAX_ROUTINES 128
#define MAX_SIZES 8

struct routine {
    const char *name;
    long long calls;
    long long bytes;
    int nsizes;             /* distinct communicator sizes (collectives) */
    int sizes[MAX_SIZES];
};

static struct routine table[MAX_ROUTINES];
static int nroutines;

static struct routine *lookup(const char *name)
{
    for (int i = 0; i < nroutines; i++)
        if (strcmp(table[i].name, name) == 0)
            return &table[i];
    if (nroutines == MAX_ROUTINES) {
        fprintf(stderr, "mpi_truth: routine table full\n");
        abort();
    }
    table[nroutines].name = name;
    return &table[nroutines++];
}

/* Count one call of a non-collective routine. */
static void note(const char *name, long long bytes)
{
    struct routine *r = lookup(name);
    r->calls++;
    r->bytes += bytes;
}

/* Count one call of a collective routine on a communicator of size csize. */
static void note_coll(const char *name, long long bytes, int csize)
{
    struct routine *r = lookup(name);
    r->calls++;
    r->bytes += bytes;
    for (int i = 0; i < r->nsizes; i++)
        if (r->sizes[i] == csize)
            return;
    if (r->nsizes == MAX_SIZES) {
        fprintf(stderr, "mpi_truth: too many communicator sizes\n");
        abort();
    }
    /* insertion keeps the list sorted */
    int j = r->nsizes++;
    while (j > 0 && r->sizes[j - 1] > csize) {
        r->sizes[j] = r->sizes[j - 1];
        j--;
    }
    r->sizes[j] = csize;
}

/* Sendrecv_replace calls with MPI_PROC_NULL peers (nested calls in Open MPI). */
static int proc_null_replaces;
/* MPI_Recv calls with MPI_STATUS_IGNORE: the only ones whose time commtap may sample. */
static int recv_status_ignored;

/* Messages from the left neighbour this rank took with a blocking receive (MPI_Recv, the
 * receiving half of MPI_Sendrecv and MPI_Sendrecv_replace): each one is an arrow on a
 * timeline, from the left rank's send to this rank's receive. */
static long long arrows_from_left;
/* Messages from the left neighbour this rank took with a nonblocking receive whose arrival
 * a timeline cannot place: posted by MPI_Isendrecv (whose request commtap does not
 * follow). An MPI_Irecv completed by MPI_Wait, MPI_Waitall, MPI_Waitany or MPI_Testall is
 * an arrow into the call that completed it. */
static long long receives_without_arrival;
/* Calls on a channel on which this rank also made a persistent request: not numbered. */
static long long persistent_channel_calls;
/* Messages from the left taken with a blocking receive whose send is not numbered (the
 * left rank's persistent channel): the receive ends a flow that nothing starts. */
static long long receives_without_send;
/* Of the arrows, those that end on the slice of another message the same call completed
 * (MPI_Waitsome or MPI_Testsome returning more than one): one slice marks both. */
static long long arrows_sharing_a_slice;
/* The device an MPICH says it was built with (its MPI_Get_library_version's "MPICH Device:"
 * line; empty for other MPIs): what commtap reports as its transport. */
static char device[64];

/* FNV-1a over what the program received and computed: the same with and without a
 * profiler watching (the tests compare it), or the profiler changed the program. */
static unsigned long long checksum = 0xcbf29ce484222325ULL;
static void digest(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        checksum = (checksum ^ b[i]) * 0x100000001b3ULL;
}

static void write_truth(const char *prefix, int rank, int size)
{
    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", prefix, rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        abort();
    }
    fprintf(f, "{\"rank\":%d,\"size\":%d,\"pid\":%ld,\"checksum\":\"%016llx\","
               "\"device\":\"%s\",\"proc_null_sendrecv_replace\":%d,\"recv_status_ignored\":%d,"
               "\"arrows_from_left\":%lld,\"receives_without_arrival\":%lld,"
               "\"persistent_channel_calls\":%lld,\"receives_without_send\":%lld,"
               "\"arrows_sharing_a_slice\":%lld,\"routines\":{",
            rank, size, (long)getpid(), checksum, device, proc_null_replaces,
            recv_status_ignored, arrows_from_left, receives_without_arrival,
            persistent_channel_calls, receives_without_send, arrows_sharing_a_slice);
    for (int i = 0; i < nroutines; i++)
        fprintf(f, "%s\"%s\":{\"calls\":%lld,\"bytes\":%lld}", i ? "," : "",
                table[i].name, table[i].calls, table[i].bytes);
    fprintf(f, "},\"comm_sizes\":{");
    int first = 1;
    for (int i = 0; i < nroutines; i++) {
        if (table[i].nsizes == 0)
            continue;
        fprintf(f, "%s\"%s\":[", first ? "" : ",", table[i].name);
        for (int k = 0; k < table[i].nsizes; k++)
            fprintf(f, "%s%d", k ? "," : "", table[i].sizes[k]);
        fprintf(f, "]");
        first = 0;
    }
    fprintf(f, "}}\n");
    if (fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* ------------------------------------------------------- type sizes */

/* MPI_Type_size semantics: bytes of data, not extent. */
#define SZ_CHAR ((long long)sizeof(char))
#define SZ_BYTE 1LL
#define SZ_INT ((long long)sizeof(int))
#define SZ_DOUBLE ((long long)sizeof(double))
#define SZ_DOUBLE_INT ((long long)(sizeof(double) + sizeof(int))) /* 12, not 16 */
#define SZ_CONTIG3D (3 * SZ_DOUBLE)                 /* contiguous(3, DOUBLE) */
#define SZ_VEC (2 * 3 * SZ_INT)                     /* vector(2,3,5,INT)     */
#define SZ_STRUCT (2 * SZ_INT + 1 * SZ_DOUBLE)      /* {int[2], double}      */
#define SZ_INDEXED ((1 + 2 + 3) * SZ_INT)           /* indexed {1,2,3} INT   */
#define SZ_DUP SZ_CONTIG3D                          /* dup of contig3d       */
#define SZ_RESIZED SZ_VEC                           /* resized vec           */

struct pair { int a[2]; double d; };        /* matches the struct type */
struct dbl_int { double val; int loc; };    /* MPI_DOUBLE_INT layout   */

/* ------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s OUT_PREFIX [ITERS]\n", argv[0]);
        return 2;
    }
    const char *prefix = argv[1];
    int iters = argc > 2 ? atoi(argv[2]) : 3;
    if (iters < 1)
        iters = 1;

    int rank, size;
    MPI_Init(&argc, &argv);
    note("MPI_Init", 0);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    note("MPI_Comm_rank", 0);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    note("MPI_Comm_size", 0);

    const int P = size;
    const int right = (rank + 1) % P;
    const int left = (rank - 1 + P) % P;
    const int even = (rank % 2) == 0;
    MPI_Comm world = MPI_COMM_WORLD;

    /* ---- routines that move nothing, which commtap counts with their calls and time
     * (every routine the library exports) ---- */
    {
        char host[MPI_MAX_PROCESSOR_NAME];
        int len, type_size, group_size;
        MPI_Get_processor_name(host, &len);
        note("MPI_Get_processor_name", 0);
        static char version[MPI_MAX_LIBRARY_VERSION_STRING];
        MPI_Get_library_version(version, &len);
        note("MPI_Get_library_version", 0);
        const char *d = strstr(version, "MPICH Device:");
        if (d) {
            d += strlen("MPICH Device:");
            d += strspn(d, " \t");
            size_t n = strcspn(d, "\r\n\"\\");
            while (n > 0 && (d[n - 1] == ' ' || d[n - 1] == '\t'))
                n--;
            if (n >= sizeof device)
                n = sizeof device - 1;
            memcpy(device, d, n);
        }
        MPI_Type_size(MPI_DOUBLE, &type_size);
        note("MPI_Type_size", 0);
        MPI_Group group;
        MPI_Comm_group(world, &group);
        note("MPI_Comm_group", 0);
        MPI_Group_size(group, &group_size);
        note("MPI_Group_size", 0);
        MPI_Group_free(&group);
        note("MPI_Group_free", 0);
        MPI_Info info;
        MPI_Info_create(&info);
        note("MPI_Info_create", 0);
        MPI_Info_set(info, "commtap", "truth");
        note("MPI_Info_set", 0);
        MPI_Info_free(&info);
        note("MPI_Info_free", 0);
        digest(&type_size, sizeof type_size);
        digest(&group_size, sizeof group_size);
    }

#if MPI4_ROUTINES && !defined(NO_ISENDRECV)
    /* ---- MPI-4's nonblocking Sendrecv: what it sends and the receive it posts, counted
     * at the call (3 ints sent, 5 posted; the replacing one 2 each way) ---- */
    {
        int out[3] = {rank, rank + 1, rank + 2}, in[5] = {0}, both[2] = {rank, -rank};
        MPI_Request req[2];
        MPI_Isendrecv(out, 3, MPI_INT, right, 80, in, 5, MPI_INT, left, 80, world, &req[0]);
        note("MPI_Isendrecv", 3 * SZ_INT + 5 * SZ_INT);
        MPI_Isendrecv_replace(both, 2, MPI_INT, right, 81, left, 81, world, &req[1]);
        note("MPI_Isendrecv_replace", 2 * 2 * SZ_INT);
        MPI_Status done[2];
        MPI_Waitall(2, req, done);
        note("MPI_Waitall", 0);
        receives_without_arrival += 2;
        digest(in, 3 * sizeof(int));
        digest(both, sizeof both);
    }
    /* ---- MPI-4's partitioned point-to-point: 4 partitions of 3 ints each way, started
     * twice; the creations name 4 x 3 ints, and each start moves them again ---- */
    {
        int pout[12], pin[12] = {0};
        MPI_Request req[2];
        MPI_Precv_init(pin, 4, 3, MPI_INT, left, 90, world, MPI_INFO_NULL, &req[0]);
        note("MPI_Precv_init", 12 * SZ_INT);
        MPI_Psend_init(pout, 4, 3, MPI_INT, right, 90, world, MPI_INFO_NULL, &req[1]);
        note("MPI_Psend_init", 12 * SZ_INT);
        for (int it = 0; it < 2; it++) {
            for (int i = 0; i < 12; i++)
                pout[i] = 1000 * it + 10 * rank + i;
            MPI_Startall(2, req);
            note("MPI_Startall", 24 * SZ_INT);
            for (int p = 0; p < 4; p++) {
                MPI_Pready(p, req[1]);
                note("MPI_Pready", 0);
            }
            MPI_Status done[2];
            MPI_Waitall(2, req, done);
            note("MPI_Waitall", 0);
            digest(pin, sizeof pin);
        }
        for (int i = 0; i < 2; i++) {
            MPI_Request_free(&req[i]);
            note("MPI_Request_free", 0);
        }
    }
#endif

#if PERSISTENT_COLLECTIVES
    /* ---- MPI-4's persistent collectives (Open MPI 4.1: its MPIX_ extension): bytes by
     * the collective's rule at the creation, and again at each start. First: Debian's
     * MPICH 4.0 never completes one started after the windows and communicators below are
     * freed (seen with no profiler attached) ---- */
    {
        int x[2] = {rank, 1}, y[2], z[3] = {0, 0, 0};
        int *counts = malloc((size_t)P * sizeof(int)), *displs = malloc((size_t)P * sizeof(int));
        int *gathered = malloc((size_t)P * 2 * sizeof(int));
        for (int i = 0; i < P; i++) {
            counts[i] = 1 + i % 2;
            displs[i] = 2 * i;
        }
        MPI_Request req[3];
        ALLREDUCE_INIT(x, y, 2, MPI_INT, MPI_SUM, world, MPI_INFO_NULL, &req[0]);
        note_coll(PCOLL("Allreduce_init"), 2 * SZ_INT, P);
        BCAST_INIT(z, 3, MPI_INT, 0, world, MPI_INFO_NULL, &req[1]);
        note_coll(PCOLL("Bcast_init"), 3 * SZ_INT, P);
        ALLGATHERV_INIT(x, counts[rank], MPI_INT, gathered, counts, displs, MPI_INT, world,
                        MPI_INFO_NULL, &req[2]);
        note_coll(PCOLL("Allgatherv_init"), counts[rank] * SZ_INT, P);
        for (int it = 0; it < 2; it++) {
            MPI_Start(&req[0]);
            note("MPI_Start", 2 * SZ_INT);
            MPI_Wait(&req[0], MPI_STATUS_IGNORE);
            note("MPI_Wait", 0);
            digest(y, sizeof y);
        }
        if (rank == 0)
            z[0] = 7, z[1] = 8, z[2] = 9;
        MPI_Startall(2, &req[1]);
        note("MPI_Startall", 3 * SZ_INT + counts[rank] * SZ_INT);
        MPI_Status done[2];
        MPI_Waitall(2, &req[1], done);
        note("MPI_Waitall", 0);
        digest(z, sizeof z);
        for (int i = 0; i < 3; i++) {
            MPI_Request_free(&req[i]);
            note("MPI_Request_free", 0);
        }
        free(counts);
        free(displs);
        free(gathered);
    }
#endif

    /* ---- derived datatypes ---- */
    MPI_Datatype t_contig, t_vec, t_struct, t_indexed, t_dup, t_resized;

    MPI_Type_contiguous(3, MPI_DOUBLE, &t_contig);
    note("MPI_Type_contiguous", 0);
    MPI_Type_commit(&t_contig);
    note("MPI_Type_commit", 0);

    MPI_Type_vector(2, 3, 5, MPI_INT, &t_vec);
    note("MPI_Type_vector", 0);
    MPI_Type_commit(&t_vec);
    note("MPI_Type_commit", 0);

    {
        int bl[2] = {2, 1};
        MPI_Aint disp[2] = {offsetof(struct pair, a), offsetof(struct pair, d)};
        MPI_Datatype types[2] = {MPI_INT, MPI_DOUBLE};
        MPI_Type_create_struct(2, bl, disp, types, &t_struct);
        note("MPI_Type_create_struct", 0);
        MPI_Type_commit(&t_struct);
        note("MPI_Type_commit", 0);
    }
    {
        int bl[3] = {1, 2, 3};
        int disp[3] = {0, 2, 5};            /* extent 8 ints */
        MPI_Type_indexed(3, bl, disp, MPI_INT, &t_indexed);
        note("MPI_Type_indexed", 0);
        MPI_Type_commit(&t_indexed);
        note("MPI_Type_commit", 0);
    }
    MPI_Type_dup(t_contig, &t_dup);
    note("MPI_Type_dup", 0);
    MPI_Type_commit(&t_dup);
    note("MPI_Type_commit", 0);

    /* vec has extent 8 ints; stretch it to 10 ints */
    MPI_Type_create_resized(t_vec, 0, (MPI_Aint)(10 * sizeof(int)), &t_resized);
    note("MPI_Type_create_resized", 0);
    MPI_Type_commit(&t_resized);
    note("MPI_Type_commit", 0);

    /* ---- a struct of 40 blocks (more than the kernel once walked type by type): one
     * int or one double each, 20 x 4 + 20 x 8 bytes, sent right and received from the
     * left ---- */
    {
        enum { BLOCKS = 40 };
        int lens[BLOCKS];
        MPI_Aint displs[BLOCKS];
        MPI_Datatype types[BLOCKS], t_wide;
        for (int i = 0; i < BLOCKS; i++) {
            lens[i] = 1;
            displs[i] = (MPI_Aint)(i * sizeof(double));
            types[i] = i % 2 ? MPI_DOUBLE : MPI_INT;
        }
        MPI_Type_create_struct(BLOCKS, lens, displs, types, &t_wide);
        note("MPI_Type_create_struct", 0);
        MPI_Type_commit(&t_wide);
        note("MPI_Type_commit", 0);
        static double wide_out[BLOCKS], wide_in[BLOCKS];
        for (int i = 0; i < BLOCKS; i++)
            wide_out[i] = rank * 100 + i;
        MPI_Status wst;
        note("MPI_Sendrecv", 2 * (20 * SZ_INT + 20 * SZ_DOUBLE));
        MPI_Sendrecv(wide_out, 1, t_wide, right, 70, wide_in, 1, t_wide, left, 70, world, &wst);
        arrows_from_left++;
        digest(wide_in, sizeof wide_in);
        MPI_Type_free(&t_wide);
        note("MPI_Type_free", 0);
    }

    /* ---- a distributed array (MPI_Type_create_darray): a 7 x 10 grid of ints, its rows
     * in blocks, its columns cyclic in pairs, over a process grid of 2 x P/2 (1 x P for an
     * odd P); each rank sends its part to the right and takes the left's as ints, its
     * size as MPI_Type_size gives it ---- */
    {
        int grid[2] = {P % 2 == 0 ? 2 : 1, P % 2 == 0 ? P / 2 : P};
        int gsizes[2] = {7, 10};
        int distribs[2] = {MPI_DISTRIBUTE_BLOCK, MPI_DISTRIBUTE_CYCLIC};
        int dargs[2] = {MPI_DISTRIBUTE_DFLT_DARG, 2};
        MPI_Datatype t_darray;
        MPI_Type_create_darray(P, rank, 2, gsizes, distribs, dargs, grid, MPI_ORDER_C,
                               MPI_INT, &t_darray);
        note("MPI_Type_create_darray", 0);
        MPI_Type_commit(&t_darray);
        note("MPI_Type_commit", 0);
        int part;
        MPI_Type_size(t_darray, &part);
        note("MPI_Type_size", 0);
        static int grid_out[70], grid_in[70];
        for (int i = 0; i < 70; i++)
            grid_out[i] = rank * 1000 + i;
        MPI_Status gst;
        note("MPI_Sendrecv", part + 70 * SZ_INT);
        MPI_Sendrecv(grid_out, 1, t_darray, right, 71, grid_in, 70, MPI_INT, left, 71, world,
                     &gst);
        arrows_from_left++;
        digest(grid_in, sizeof grid_in);
        MPI_Type_free(&t_darray);
        note("MPI_Type_free", 0);
    }

    /* ---- communicators ---- */
    MPI_Comm dup, split;
    int dup_rank, dup_size, split_rank, split_size;
    MPI_Comm_dup(world, &dup);
    note("MPI_Comm_dup", 0);
    MPI_Comm_rank(dup, &dup_rank);
    note("MPI_Comm_rank", 0);
    MPI_Comm_size(dup, &dup_size);
    note("MPI_Comm_size", 0);
    MPI_Comm_split(world, rank % 2, rank, &split);
    note("MPI_Comm_split", 0);
    MPI_Comm_rank(split, &split_rank);
    note("MPI_Comm_rank", 0);
    MPI_Comm_size(split, &split_size);
    note("MPI_Comm_size", 0);

    /* ---- one-sided window ---- */
    int winbuf[16];
    memset(winbuf, 0, sizeof winbuf);
    MPI_Win win;
    MPI_Win_create(winbuf, (MPI_Aint)sizeof winbuf, (int)sizeof(int),
                   MPI_INFO_NULL, world, &win);
    note("MPI_Win_create", (long long)sizeof winbuf);

    /* ---- buffers ---- */
    int ibuf[32], ibuf2[32];
    double dbuf[32], dbuf2[32];
    char cbuf[32], cbuf2[32];
    unsigned char bbuf[32], bbuf2[32];
    struct pair pbuf[4], pbuf2[4];
    for (int i = 0; i < 32; i++) {
        ibuf[i] = rank * 100 + i;
        dbuf[i] = rank + i * 0.5;
        cbuf[i] = (char)('a' + (i + rank) % 26);
        bbuf[i] = (unsigned char)(i ^ rank);
    }
    memset(ibuf2, 0, sizeof ibuf2);
    memset(dbuf2, 0, sizeof dbuf2);
    memset(cbuf2, 0, sizeof cbuf2);
    memset(bbuf2, 0, sizeof bbuf2);
    memset(pbuf2, 0, sizeof pbuf2);
    for (int i = 0; i < 4; i++) {
        pbuf[i].a[0] = rank;
        pbuf[i].a[1] = i;
        pbuf[i].d = rank * 0.25 + i;
    }

    int *isend = malloc(sizeof(int) * 8 * (size_t)P * (size_t)(P + 2));
    int *irecv = calloc(8 * (size_t)P * (size_t)(P + 2), sizeof(int));
    double *dsend = malloc(sizeof(double) * 8 * (size_t)P * (size_t)(P + 2));
    double *drecv = calloc(8 * (size_t)P * (size_t)(P + 2), sizeof(double));
    char *csend = malloc(8 * (size_t)P * (size_t)(P + 2));
    char *crecv = calloc(8 * (size_t)P * (size_t)(P + 2), 1);
    unsigned char *wsend = malloc(16 * (size_t)P);
    unsigned char *wrecv = calloc(16 * (size_t)P, 1);
    int *counts = malloc(sizeof(int) * (size_t)P);
    int *displs = malloc(sizeof(int) * (size_t)P);
    int *rcounts = malloc(sizeof(int) * (size_t)P);
    int *rdispls = malloc(sizeof(int) * (size_t)P);
    MPI_Datatype *stypes = malloc(sizeof(MPI_Datatype) * (size_t)P);
    MPI_Datatype *rtypes = malloc(sizeof(MPI_Datatype) * (size_t)P);
    if (!isend || !irecv || !dsend || !drecv || !csend || !crecv || !wsend ||
        !wrecv || !counts || !displs || !rcounts || !rdispls || !stypes ||
        !rtypes) {
        fprintf(stderr, "mpi_truth: out of memory\n");
        abort();
    }
    for (int i = 0; i < 8 * P * (P + 2); i++) {
        isend[i] = rank + i;
        dsend[i] = rank * 0.5 + i;
        csend[i] = (char)('A' + (rank + i) % 26);
    }
    for (int i = 0; i < 16 * P; i++)
        wsend[i] = 0;

    for (int it = 0; it < iters; it++) {
        const int root = it % P;
        MPI_Status st;
        MPI_Request req[4];
        /* real status arrays rather than MPI_STATUSES_IGNORE: GCC's
         * -Wstringop-overflow misfires on MPICH's (MPI_Status *)1 */
        MPI_Status sts[4];
        int flag, idx;

        /* ============ blocking point-to-point around a ring ============
         * Even ranks send first, odd ranks receive first: no deadlock even
         * with MPI_Ssend, for any P >= 2 (with P = 2, left == right). */
        for (int phase = 0; phase < 2; phase++) {
            if ((phase == 0) == even) {
                /* ---- sender side, to `right` ---- */
                note("MPI_Send", 10 * SZ_INT);
                MPI_Send(ibuf, 10, MPI_INT, right, 1, world);
                note("MPI_Ssend", 7 * SZ_DOUBLE);
                MPI_Ssend(dbuf, 7, MPI_DOUBLE, right, 2, world);
                note("MPI_Send", 2 * SZ_CONTIG3D);
                MPI_Send(dbuf, 2, t_contig, right, 3, world);
                note("MPI_Send", 1 * SZ_VEC);
                MPI_Send(ibuf, 1, t_vec, right, 4, world);
                note("MPI_Send", 3 * SZ_STRUCT);
                MPI_Send(pbuf, 3, t_struct, right, 5, world);
                note("MPI_Send", 1 * SZ_INDEXED);
                MPI_Send(ibuf, 1, t_indexed, right, 6, world);
                note("MPI_Send", 1 * SZ_DUP);
                MPI_Send(dbuf, 1, t_dup, right, 7, world);
                note("MPI_Send", 2 * SZ_RESIZED);
                MPI_Send(ibuf, 2, t_resized, right, 8, world);
                note("MPI_Send", 6 * SZ_CHAR);
                MPI_Send(cbuf, 6, MPI_CHAR, right, 9, world);
            } else {
                /* ---- receiver side, from `left` ---- */
                note("MPI_Probe", 0);
                MPI_Probe(left, 1, world, &st);
                /* posted 20 ints, 10 arrive: bytes = received (status) */
                note("MPI_Recv", 10 * SZ_INT);
                MPI_Recv(ibuf2, 20, MPI_INT, left, 1, world, &st);
                arrows_from_left++;
                /* MPI_STATUS_IGNORE: bytes = POSTED size (9 doubles),
                 * although only 7 arrive */
                note("MPI_Recv", 9 * SZ_DOUBLE);
                MPI_Recv(dbuf2, 9, MPI_DOUBLE, left, 2, world,
                         MPI_STATUS_IGNORE);
                recv_status_ignored++;
                arrows_from_left++;
                note("MPI_Recv", 2 * SZ_CONTIG3D);
                MPI_Recv(dbuf2, 2, t_contig, left, 3, world, &st);
                arrows_from_left++;
                /* vec arrives as 6 plain ints (same type signature) */
                note("MPI_Recv", 6 * SZ_INT);
                MPI_Recv(ibuf2, 6, MPI_INT, left, 4, world, &st);
                arrows_from_left++;
                note("MPI_Recv", 3 * SZ_STRUCT);
                MPI_Recv(pbuf2, 3, t_struct, left, 5, world, &st);
                arrows_from_left++;
                note("MPI_Recv", 1 * SZ_INDEXED);
                MPI_Recv(ibuf2, 1, t_indexed, left, 6, world, &st);
                arrows_from_left++;
                note("MPI_Recv", 1 * SZ_DUP);
                MPI_Recv(dbuf2, 1, t_dup, left, 7, world, &st);
                arrows_from_left++;
                note("MPI_Recv", 2 * SZ_RESIZED);
                MPI_Recv(ibuf2, 2, t_resized, left, 8, world, &st);
                arrows_from_left++;
                /* poll with MPI_Iprobe; every call is counted */
                do {
                    note("MPI_Iprobe", 0);
                    MPI_Iprobe(left, 9, world, &flag, &st);
                } while (!flag);
                /* posted 16 chars, 6 arrive: bytes = received (status) */
                note("MPI_Recv", 6 * SZ_CHAR);
                MPI_Recv(cbuf2, 16, MPI_CHAR, left, 9, world, &st);
                arrows_from_left++;
            }
        }

        /* send 5 chars, posted receive of 8 chars: 5 + 8 bytes */
        note("MPI_Sendrecv", 5 * SZ_CHAR + 8 * SZ_CHAR);
        MPI_Sendrecv(cbuf, 5, MPI_CHAR, right, 20, cbuf2, 8, MPI_CHAR, left,
                     20, world, &st);
        arrows_from_left++;
        /* 2 x count x size */
        note("MPI_Sendrecv_replace", 2 * 4 * SZ_DOUBLE);
        MPI_Sendrecv_replace(dbuf2, 4, MPI_DOUBLE, right, 21, left, 21, world,
                             &st);
        arrows_from_left++;
        /* The same on a duplicate of the world: under MPICH its handle means
         * nothing to the other rank, so the trace must name it from how both
         * made it for the arrow to be drawn. */
        note("MPI_Sendrecv", 3 * SZ_INT + 3 * SZ_INT);
        MPI_Sendrecv(ibuf, 3, MPI_INT, right, 24, ibuf2, 3, MPI_INT, left, 24,
                     dup, &st);
        arrows_from_left++;
        /* With MPI_PROC_NULL peers Open MPI 4.1 implements this by calling
         * PMPI_Sendrecv: one nested MPI call, which must not be counted again.
         * Neither half crosses the network: 0 bytes. */
        note("MPI_Sendrecv_replace", 0);
        MPI_Sendrecv_replace(dbuf2, 4, MPI_DOUBLE, MPI_PROC_NULL, 22,
                             MPI_PROC_NULL, 22, world, &st);
        proc_null_replaces++;
        /* One half to or from MPI_PROC_NULL: only the other half counts. Every rank
         * sends 6 chars to the right (eager: complete without a receive), then receives
         * them from the left. */
        note("MPI_Sendrecv", 6 * SZ_CHAR);
        MPI_Sendrecv(cbuf, 6, MPI_CHAR, right, 25, cbuf2, 8, MPI_CHAR,
                     MPI_PROC_NULL, 25, world, &st);
        note("MPI_Sendrecv", 7 * SZ_CHAR);
        MPI_Sendrecv(cbuf, 9, MPI_CHAR, MPI_PROC_NULL, 25, cbuf2, 7, MPI_CHAR,
                     left, 25, world, &st);
        arrows_from_left++;

        /* MPI_PROC_NULL as the one peer: the call moves nothing and counts 0 bytes,
         * whatever its count (mpitrace's convention). */
        note("MPI_Send", 0);
        MPI_Send(ibuf, 10, MPI_INT, MPI_PROC_NULL, 23, world);
        note("MPI_Recv", 0);    /* MPI_STATUS_IGNORE: else the posted size */
        MPI_Recv(ibuf2, 20, MPI_INT, MPI_PROC_NULL, 23, world, MPI_STATUS_IGNORE);
        recv_status_ignored++;
        note("MPI_Irecv", 0);
        MPI_Irecv(bbuf2, 16, MPI_BYTE, MPI_PROC_NULL, 24, world, &req[0]);
        note("MPI_Wait", 0);
        MPI_Wait(&req[0], MPI_STATUS_IGNORE);

        /* ================= nonblocking point-to-point ================= */
        note("MPI_Irecv", 16 * SZ_BYTE);        /* posted size */
        MPI_Irecv(bbuf2, 16, MPI_BYTE, left, 30, world, &req[0]);
        note("MPI_Isend", 12 * SZ_BYTE);
        MPI_Isend(bbuf, 12, MPI_BYTE, right, 30, world, &req[1]);
        note("MPI_Waitall", 0);
        MPI_Waitall(2, req, sts);
        arrows_from_left++;     /* the Irecv's message, into the Waitall */

        note("MPI_Irecv", 3 * SZ_INT);
        MPI_Irecv(ibuf2, 3, MPI_INT, left, 31, world, &req[0]);
        note("MPI_Issend", 3 * SZ_INT);
        MPI_Issend(ibuf, 3, MPI_INT, right, 31, world, &req[1]);
        note("MPI_Wait", 0);
        MPI_Wait(&req[0], MPI_STATUS_IGNORE);
        arrows_from_left++;     /* into the Wait */
        do {
            note("MPI_Test", 0);
            MPI_Test(&req[1], &flag, MPI_STATUS_IGNORE);
        } while (!flag);

        note("MPI_Irecv", 2 * SZ_DOUBLE);
        MPI_Irecv(dbuf2, 2, MPI_DOUBLE, left, 32, world, &req[0]);
        note("MPI_Isend", 2 * SZ_DOUBLE);
        MPI_Isend(dbuf, 2, MPI_DOUBLE, right, 32, world, &req[1]);
        for (int k = 0; k < 2; k++) {
            note("MPI_Waitany", 0);
            MPI_Waitany(2, req, &idx, MPI_STATUS_IGNORE);
        }
        arrows_from_left++;     /* into the Waitany that completed the Irecv */

        note("MPI_Irecv", 1 * SZ_CONTIG3D);
        MPI_Irecv(dbuf2, 1, t_contig, left, 33, world, &req[0]);
        note("MPI_Isend", 1 * SZ_CONTIG3D);
        MPI_Isend(dbuf, 1, t_contig, right, 33, world, &req[1]);
        do {
            note("MPI_Testall", 0);
            MPI_Testall(2, req, &flag, sts);
        } while (!flag);
        arrows_from_left++;     /* into the Testall that said both were done */

        /* Receives completed by MPI_Test, MPI_Testany, MPI_Waitsome and MPI_Testsome, which
         * say at their return which requests they completed: each message from the left
         * is an arrow into the call that completed it (small sends complete eagerly). A
         * barrier before each test lets the message in: Intel MPI's tests otherwise spin
         * 10,000 times, a flood of events. */
        {
            int got[2] = {0}, one = rank, outcount, pending;
            note("MPI_Irecv", SZ_INT);
            MPI_Irecv(&got[0], 1, MPI_INT, left, 34, world, &req[0]);
            note("MPI_Send", SZ_INT);
            MPI_Send(&one, 1, MPI_INT, right, 34, world);
            note_coll("MPI_Barrier", 0, P);
            MPI_Barrier(world);
            do {
                note("MPI_Test", 0);
                MPI_Test(&req[0], &flag, MPI_STATUS_IGNORE);
            } while (!flag);
            arrows_from_left++;

            note("MPI_Irecv", SZ_INT);
            MPI_Irecv(&got[1], 1, MPI_INT, left, 35, world, &req[0]);
            req[1] = MPI_REQUEST_NULL;
            note("MPI_Send", SZ_INT);
            MPI_Send(&one, 1, MPI_INT, right, 35, world);
            note_coll("MPI_Barrier", 0, P);
            MPI_Barrier(world);
            do {
                note("MPI_Testany", 0);
                MPI_Testany(2, req, &idx, &flag, MPI_STATUS_IGNORE);
            } while (!flag);
            arrows_from_left++;

            /* Six at once, with MPI_Waitsome, MPI_Testsome and MPI_Waitany (a master
             * waiting for any of its workers): the kernel keeps every followed receive of
             * one call (it once kept four). */
            enum { MANY = 6 };
            MPI_Request many[MANY];
            int many_got[3][MANY] = {{0}}, many_indices[MANY];
            for (int some = 0; some < 3; some++) {
                const int tag = 100 + 10 * some;
                for (int k = 0; k < MANY; k++) {
                    note("MPI_Irecv", SZ_INT);
                    MPI_Irecv(&many_got[some][k], 1, MPI_INT, left, tag + k, world, &many[k]);
                }
                for (int k = 0; k < MANY; k++) {
                    note("MPI_Send", SZ_INT);
                    MPI_Send(&one, 1, MPI_INT, right, tag + k, world);
                }
                note_coll("MPI_Barrier", 0, P);
                MPI_Barrier(world);
                for (pending = MANY; pending > 0; pending -= outcount) {
                    if (some == 2) {
                        note("MPI_Waitany", 0);
                        MPI_Waitany(MANY, many, &idx, MPI_STATUS_IGNORE);
                        outcount = 1;
                    } else if (some) {
                        note("MPI_Testsome", 0);
                        MPI_Testsome(MANY, many, &outcount, many_indices, MPI_STATUSES_IGNORE);
                    } else {
                        note("MPI_Waitsome", 0);
                        MPI_Waitsome(MANY, many, &outcount, many_indices, MPI_STATUSES_IGNORE);
                    }
                    if (outcount > 1)
                        arrows_sharing_a_slice += outcount - 1;
                }
                arrows_from_left += MANY;
            }
            digest(many_got, sizeof many_got);
            digest(got, sizeof got);
        }

        /* ======================== collectives ======================== */
        note_coll("MPI_Barrier", 0, P);
        MPI_Barrier(world);

        note_coll("MPI_Bcast", 10 * SZ_INT, P);
        MPI_Bcast(ibuf2, 10, MPI_INT, root, world);
        note_coll("MPI_Bcast", 2 * SZ_CONTIG3D, P);
        MPI_Bcast(dbuf2, 2, t_contig, root, world);
        note_coll("MPI_Bcast", 2 * SZ_STRUCT, P);
        MPI_Bcast(pbuf2, 2, t_struct, root, world);
        note_coll("MPI_Bcast", 1 * SZ_INDEXED, P);
        MPI_Bcast(ibuf2, 1, t_indexed, root, world);

        note_coll("MPI_Reduce", 4 * SZ_DOUBLE, P);
        MPI_Reduce(dbuf, dbuf2, 4, MPI_DOUBLE, MPI_SUM, root, world);

        note_coll("MPI_Allreduce", 3 * SZ_INT, P);
        MPI_Allreduce(ibuf, ibuf2, 3, MPI_INT, MPI_SUM, world);
        {
            struct dbl_int in[2], out[2];
            in[0].val = (double)((rank * 7 + it) % P);
            in[0].loc = rank;
            in[1].val = (double)rank;
            in[1].loc = rank;
            /* MPI_DOUBLE_INT size is 12 (sizeof(double)+sizeof(int)) */
            note_coll("MPI_Allreduce", 2 * SZ_DOUBLE_INT, P);
            MPI_Allreduce(in, out, 2, MPI_DOUBLE_INT, MPI_MAXLOC, world);
        }

        note_coll("MPI_Scan", 2 * SZ_INT, P);
        MPI_Scan(ibuf, ibuf2, 2, MPI_INT, MPI_SUM, world);
        note_coll("MPI_Exscan", 2 * SZ_DOUBLE, P);
        MPI_Exscan(dbuf, dbuf2, 2, MPI_DOUBLE, MPI_SUM, world);

        {   /* recvcounts[i] = i + 1 ints */
            long long sum = 0;
            for (int i = 0; i < P; i++) {
                rcounts[i] = i + 1;
                sum += rcounts[i];
            }
            note_coll("MPI_Reduce_scatter", sum * SZ_INT, P);
            MPI_Reduce_scatter(isend, irecv, rcounts, MPI_INT, MPI_SUM, world);
        }
        note_coll("MPI_Reduce_scatter_block", 2 * SZ_DOUBLE, P);
        MPI_Reduce_scatter_block(dsend, drecv, 2, MPI_DOUBLE, MPI_SUM, world);

        note_coll("MPI_Gather", 3 * SZ_INT, P);
        MPI_Gather(isend, 3, MPI_INT, irecv, 3, MPI_INT, root, world);
        for (int i = 0, off = 0; i < P; i++) {
            rcounts[i] = i + 1;
            rdispls[i] = off;
            off += rcounts[i];
        }
        note_coll("MPI_Gatherv", (rank + 1) * SZ_DOUBLE, P);
        MPI_Gatherv(dsend, rank + 1, MPI_DOUBLE, drecv, rcounts, rdispls,
                    MPI_DOUBLE, root, world);

        note_coll("MPI_Scatter", 2 * SZ_INT, P);
        MPI_Scatter(isend, 2, MPI_INT, irecv, 2, MPI_INT, root, world);
        /* counts/displs: i + 1 chars to rank i */
        note_coll("MPI_Scatterv", (rank + 1) * SZ_CHAR, P);
        MPI_Scatterv(csend, rcounts, rdispls, MPI_CHAR, crecv, rank + 1,
                     MPI_CHAR, root, world);

        note_coll("MPI_Allgather", 4 * SZ_CHAR, P);
        MPI_Allgather(csend, 4, MPI_CHAR, crecv, 4, MPI_CHAR, world);
        for (int i = 0, off = 0; i < P; i++) {
            rcounts[i] = i + 2;
            rdispls[i] = off;
            off += rcounts[i];
        }
        note_coll("MPI_Allgatherv", rcounts[rank] * SZ_INT, P);
        MPI_Allgatherv(isend, rank + 2, MPI_INT, irecv, rcounts, rdispls,
                       MPI_INT, world);

        note_coll("MPI_Alltoall", 2 * SZ_INT, P);
        MPI_Alltoall(isend, 2, MPI_INT, irecv, 2, MPI_INT, world);

        {   /* rank r sends r + i + 1 elements to rank i (symmetric) */
            long long sum = 0;
            int soff = 0, roff = 0;
            for (int i = 0; i < P; i++) {
                counts[i] = rank + i + 1;
                displs[i] = soff;
                soff += counts[i];
                rcounts[i] = i + rank + 1;
                rdispls[i] = roff;
                roff += rcounts[i];
                sum += counts[i];
            }
            note_coll("MPI_Alltoallv", sum * SZ_CHAR / P, P);
            MPI_Alltoallv(csend, counts, displs, MPI_CHAR, crecv, rcounts,
                          rdispls, MPI_CHAR, world);
            note_coll("MPI_Alltoallv", sum * SZ_DOUBLE / P, P);
            MPI_Alltoallv(dsend, counts, displs, MPI_DOUBLE, drecv, rcounts,
                          rdispls, MPI_DOUBLE, world);
        }

        {   /* 2 elements to each rank i, of type INT (i even) or DOUBLE
             * (i odd); displacements in bytes, 16 bytes per peer */
            long long sum = 0;
            for (int i = 0; i < P; i++) {
                counts[i] = 2;
                displs[i] = 16 * i;
                stypes[i] = (i % 2) ? MPI_DOUBLE : MPI_INT;
                sum += counts[i] * ((i % 2) ? SZ_DOUBLE : SZ_INT);
                rcounts[i] = 2;
                rdispls[i] = 16 * i;
                rtypes[i] = (rank % 2) ? MPI_DOUBLE : MPI_INT;
            }
            note_coll("MPI_Alltoallw", sum / P, P);
            MPI_Alltoallw(wsend, counts, displs, stypes, wrecv, rcounts,
                          rdispls, rtypes, world);
        }

        /* ================= nonblocking collectives ================= */
        note_coll("MPI_Ibcast", 5 * SZ_DOUBLE, P);
        MPI_Ibcast(dbuf2, 5, MPI_DOUBLE, root, world, &req[0]);
        note("MPI_Wait", 0);
        MPI_Wait(&req[0], MPI_STATUS_IGNORE);

        note_coll("MPI_Iallreduce", 2 * SZ_INT, P);
        MPI_Iallreduce(ibuf, ibuf2, 2, MPI_INT, MPI_MAX, world, &req[0]);
        note_coll("MPI_Ialltoall", 1 * SZ_DOUBLE, P);
        MPI_Ialltoall(dsend, 1, MPI_DOUBLE, drecv, 1, MPI_DOUBLE, world,
                      &req[1]);
        note("MPI_Waitall", 0);
        MPI_Waitall(2, req, sts);

        note_coll("MPI_Ibarrier", 0, P);
        MPI_Ibarrier(world, &req[0]);
        note("MPI_Wait", 0);
        MPI_Wait(&req[0], MPI_STATUS_IGNORE);

        /* ============ derived communicators (sizes differ) ============ */
        note_coll("MPI_Allreduce", 1 * SZ_INT, split_size);
        MPI_Allreduce(&rank, &ibuf2[0], 1, MPI_INT, MPI_SUM, split);
        note_coll("MPI_Bcast", 2 * SZ_INT, dup_size);
        MPI_Bcast(ibuf2, 2, MPI_INT, root, dup);
        note_coll("MPI_Barrier", 0, split_size);
        MPI_Barrier(split);

        /* ========================= one-sided ========================= */
        note("MPI_Win_fence", 0);
        MPI_Win_fence(0, win);
        note("MPI_Put", 2 * SZ_INT);
        MPI_Put(ibuf, 2, MPI_INT, right, 0, 2, MPI_INT, win);
        note("MPI_Win_fence", 0);
        MPI_Win_fence(0, win);
        note("MPI_Get", 3 * SZ_INT);
        MPI_Get(ibuf2, 3, MPI_INT, left, 4, 3, MPI_INT, win);
        note("MPI_Win_fence", 0);
        MPI_Win_fence(0, win);
        note("MPI_Accumulate", 4 * SZ_INT);
        MPI_Accumulate(ibuf, 4, MPI_INT, right, 8, 4, MPI_INT, MPI_SUM, win);
        note("MPI_Win_fence", 0);
        MPI_Win_fence(0, win);
    }

    /* ---- teardown ---- */
    MPI_Win_free(&win);
    note("MPI_Win_free", 0);

    MPI_Comm_free(&dup);
    note("MPI_Comm_free", 0);
    MPI_Comm_free(&split);
    note("MPI_Comm_free", 0);

    MPI_Type_free(&t_resized);
    note("MPI_Type_free", 0);
    MPI_Type_free(&t_dup);
    note("MPI_Type_free", 0);
    MPI_Type_free(&t_indexed);
    note("MPI_Type_free", 0);
    MPI_Type_free(&t_struct);
    note("MPI_Type_free", 0);
    MPI_Type_free(&t_vec);
    note("MPI_Type_free", 0);
    MPI_Type_free(&t_contig);
    note("MPI_Type_free", 0);

    /* ---- freed handles come back: a datatype or communicator freed and created again
     * often gets the same handle (address or integer); what is counted follows the new
     * object, never what was known of the old one ---- */
    for (int k = 1; k <= 4; k++) {
        MPI_Datatype t;
        MPI_Type_contiguous(k, MPI_INT, &t);
        note("MPI_Type_contiguous", 0);
        MPI_Type_commit(&t);
        note("MPI_Type_commit", 0);
        note_coll("MPI_Bcast", k * SZ_INT, P);
        MPI_Bcast(ibuf2, 1, t, 0, world);
        MPI_Type_free(&t);
        note("MPI_Type_free", 0);
    }
    for (int k = 0; k < 2; k++) {
        MPI_Comm c;
        int csize;
        MPI_Comm_split(world, k == 0 ? rank % 2 : 0, rank, &c);
        note("MPI_Comm_split", 0);
        MPI_Comm_size(c, &csize);
        note("MPI_Comm_size", 0);
        note_coll("MPI_Allreduce", SZ_INT, csize);
        MPI_Allreduce(isend, irecv, 1, MPI_INT, MPI_SUM, c);
        MPI_Comm_free(&c);
        note("MPI_Comm_free", 0);
    }

    /* ---- persistent requests of every kind: bytes counted at the creation, as mpitrace
     * counts them, and again at each start, which moves them ---- */
    {
        static char attached[4 * sizeof(int) + MPI_BSEND_OVERHEAD + 64];
        MPI_Buffer_attach(attached, (int)sizeof attached);
        note("MPI_Buffer_attach", 0);
        typedef int (*send_init_fn)(const void *, int, MPI_Datatype, int, int, MPI_Comm,
                                    MPI_Request *);
        const send_init_fn inits[4] = {MPI_Send_init, MPI_Bsend_init, MPI_Ssend_init,
                                       MPI_Rsend_init};
        const char *const kinds[4] = {"MPI_Send_init", "MPI_Bsend_init", "MPI_Ssend_init",
                                      "MPI_Rsend_init"};
        int pin[4], pout[4];
        for (int k = 0; k < 4; k++) {
            MPI_Request req[2];
            for (int i = 0; i < 4; i++)
                pout[i] = 1000 * k + 10 * rank + i;
            memset(pin, 0, sizeof pin);
            MPI_Recv_init(pin, 4, MPI_INT, left, 40 + k, world, &req[0]);
            note("MPI_Recv_init", 4 * SZ_INT);
            /* Posted before any send starts: a ready send needs its receive waiting. */
            MPI_Start(&req[0]);
            note("MPI_Start", 4 * SZ_INT);
            note_coll("MPI_Barrier", 0, P);
            MPI_Barrier(world);
            inits[k](pout, 4, MPI_INT, right, 40 + k, world, &req[1]);
            note(kinds[k], 4 * SZ_INT);
            MPI_Start(&req[1]);
            note("MPI_Start", 4 * SZ_INT);
            MPI_Status done[2];
            MPI_Waitall(2, req, done);
            note("MPI_Waitall", 0);
            digest(pin, sizeof pin);
            MPI_Request_free(&req[0]);
            note("MPI_Request_free", 0);
            MPI_Request_free(&req[1]);
            note("MPI_Request_free", 0);
        }
        void *detached;
        int detached_size;
        MPI_Buffer_detach(&detached, &detached_size);
        note("MPI_Buffer_detach", 0);
    }

    /* ---- persistent requests started again and again, together: each MPI_Startall moves
     * what its requests' creations named; a send to MPI_PROC_NULL moves nothing, and its
     * creation names nothing (as mpitrace) ---- */
    {
        int a[3], b[3];
        MPI_Request req[3];
        MPI_Recv_init(b, 3, MPI_INT, left, 60, world, &req[0]);
        note("MPI_Recv_init", 3 * SZ_INT);
        MPI_Send_init(a, 3, MPI_INT, right, 60, world, &req[1]);
        note("MPI_Send_init", 3 * SZ_INT);
        MPI_Send_init(a, 3, MPI_INT, MPI_PROC_NULL, 61, world, &req[2]);
        note("MPI_Send_init", 0);
        for (int it = 0; it < 3; it++) {
            for (int i = 0; i < 3; i++)
                a[i] = 100 * it + 10 * rank + i;
            MPI_Status done[3];
            MPI_Startall(3, req);
            note("MPI_Startall", 6 * SZ_INT);
            MPI_Waitall(3, req, done);
            note("MPI_Waitall", 0);
            digest(b, sizeof b);
        }
        for (int i = 0; i < 3; i++) {
            MPI_Request_free(&req[i]);
            note("MPI_Request_free", 0);
        }
    }

    /* ---- a channel (tag 62) that a persistent send and MPI_Send share: the starts name
     * no message, so the sender numbers none on it (numbered, its MPI_Send would be the
     * channel's first message, and its arrow would end on the receive that took the
     * persistent send's); the receiver takes both with MPI_Recv, no arrow ---- */
    {
        int a[3] = {rank, 1, 2}, b[3];
        MPI_Request preq;
        MPI_Status pst;
        MPI_Send_init(a, 3, MPI_INT, right, 62, world, &preq);
        note("MPI_Send_init", 3 * SZ_INT);
        MPI_Start(&preq);
        note("MPI_Start", 3 * SZ_INT);
        MPI_Send(a, 3, MPI_INT, right, 62, world); /* eager: returns before the receive */
        note("MPI_Send", 3 * SZ_INT);
        persistent_channel_calls++;
        for (int i = 0; i < 2; i++) {
            MPI_Recv(b, 3, MPI_INT, left, 62, world, &pst);
            note("MPI_Recv", 3 * SZ_INT);
            receives_without_send++;
            digest(b, sizeof b);
        }
        MPI_Wait(&preq, MPI_STATUS_IGNORE);
        note("MPI_Wait", 0);
        MPI_Request_free(&preq);
        note("MPI_Request_free", 0);
    }

    /* ---- windows the library allocates (shared memory among the ranks of a node) ---- */
    {
        int *wbase;
        MPI_Win w;
        MPI_Win_allocate((MPI_Aint)(4 * sizeof(int)), (int)sizeof(int), MPI_INFO_NULL,
                         world, &wbase, &w);
        note("MPI_Win_allocate", (long long)(4 * sizeof(int)));
        MPI_Win_free(&w);
        note("MPI_Win_free", 0);
        MPI_Comm node;
        MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
        note("MPI_Comm_split_type", 0);
        MPI_Win_allocate_shared((MPI_Aint)(4 * sizeof(int)), (int)sizeof(int),
                                MPI_INFO_NULL, node, &wbase, &w);
        note("MPI_Win_allocate_shared", (long long)(4 * sizeof(int)));
        MPI_Win_free(&w);
        note("MPI_Win_free", 0);
        MPI_Comm_free(&node);
        note("MPI_Comm_free", 0);
    }

    /* ---- a periodic Cartesian ring: neighbourhood collectives, each rank's two
     * neighbours its left and right (with P = 2, the other rank twice); bytes are those
     * sent to each neighbour (the v and w forms: calls only, their counts are per
     * neighbour) ---- */
    {
        MPI_Comm ring;
        int dims[1] = {P}, periods[1] = {1}, ring_size;
        MPI_Cart_create(world, 1, dims, periods, 0, &ring);
        note("MPI_Cart_create", 0);
        MPI_Comm_size(ring, &ring_size);
        note("MPI_Comm_size", 0);
        int nsend[8], nrecv[8], counts[2] = {1, 1}, displs[2] = {0, 1};
        MPI_Aint wdispls[2] = {0, (MPI_Aint)sizeof(int)};
        MPI_Datatype wtypes[2] = {MPI_INT, MPI_INT};
        for (int i = 0; i < 8; i++)
            nsend[i] = 10 * rank + i;
        note_coll("MPI_Neighbor_allgather", 1 * SZ_INT, ring_size);
        MPI_Neighbor_allgather(nsend, 1, MPI_INT, nrecv, 1, MPI_INT, ring);
        digest(nrecv, 2 * sizeof(int));
        note_coll("MPI_Neighbor_alltoall", 2 * SZ_INT, ring_size);
        MPI_Neighbor_alltoall(nsend, 2, MPI_INT, nrecv, 2, MPI_INT, ring);
        digest(nrecv, 4 * sizeof(int));
        note_coll("MPI_Neighbor_allgatherv", 1 * SZ_DOUBLE, ring_size);
        double dsend1 = rank, drecv2[2];
        MPI_Neighbor_allgatherv(&dsend1, 1, MPI_DOUBLE, drecv2, counts, displs, MPI_DOUBLE,
                                ring);
        digest(drecv2, sizeof drecv2);
        note_coll("MPI_Neighbor_alltoallv", 0, ring_size);
        MPI_Neighbor_alltoallv(nsend, counts, displs, MPI_INT, nrecv, counts, displs, MPI_INT,
                               ring);
        digest(nrecv, 2 * sizeof(int));
        note_coll("MPI_Neighbor_alltoallw", 0, ring_size);
        MPI_Neighbor_alltoallw(nsend, counts, wdispls, wtypes, nrecv, counts, wdispls, wtypes,
                               ring);
        digest(nrecv, 2 * sizeof(int));
        MPI_Request nreq[2];
        MPI_Status nsts[2];
        note_coll("MPI_Ineighbor_allgather", 3 * SZ_INT, ring_size);
        MPI_Ineighbor_allgather(nsend, 3, MPI_INT, nrecv, 3, MPI_INT, ring, &nreq[0]);
        note("MPI_Wait", 0);
        MPI_Wait(&nreq[0], MPI_STATUS_IGNORE);
        digest(nrecv, 6 * sizeof(int));
        note_coll("MPI_Ineighbor_alltoall", 1 * SZ_INT, ring_size);
        MPI_Ineighbor_alltoall(nsend, 1, MPI_INT, nrecv, 1, MPI_INT, ring, &nreq[0]);
        note_coll("MPI_Ineighbor_allgatherv", 1 * SZ_DOUBLE, ring_size);
        MPI_Ineighbor_allgatherv(&dsend1, 1, MPI_DOUBLE, drecv2, counts, displs, MPI_DOUBLE,
                                 ring, &nreq[1]);
        note("MPI_Waitall", 0);
        MPI_Waitall(2, nreq, nsts);
        digest(nrecv, 2 * sizeof(int));
        digest(drecv2, sizeof drecv2);
        note_coll("MPI_Ineighbor_alltoallv", 0, ring_size);
        MPI_Ineighbor_alltoallv(nsend, counts, displs, MPI_INT, nrecv, counts, displs,
                                MPI_INT, ring, &nreq[0]);
        note_coll("MPI_Ineighbor_alltoallw", 0, ring_size);
        MPI_Ineighbor_alltoallw(nsend, counts, wdispls, wtypes, nrecv + 4, counts, wdispls,
                                wtypes, ring, &nreq[1]);
        note("MPI_Waitall", 0);
        MPI_Waitall(2, nreq, nsts);
        digest(nrecv, 6 * sizeof(int));
        MPI_Comm_free(&ring);
        note("MPI_Comm_free", 0);
    }

    /* ---- MPI-IO: one file, each rank its own block of 16 ints ---- */
    {
        char path[4096];
        snprintf(path, sizeof path, "%s.io", prefix);
        MPI_File fh;
        MPI_File_open(world, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh);
        note("MPI_File_open", 0);
        int out[16], in[16];
        for (int i = 0; i < 16; i++)
            out[i] = 100 * rank + i;
        memset(in, 0, sizeof in);
        MPI_Offset at = (MPI_Offset)rank * (MPI_Offset)sizeof out;
        MPI_File_write_at(fh, at, out, 8, MPI_INT, MPI_STATUS_IGNORE);
        note("MPI_File_write_at", 8 * SZ_INT);
        MPI_File_write_at_all(fh, at + 8 * (MPI_Offset)sizeof(int), out + 8, 8, MPI_INT,
                              MPI_STATUS_IGNORE);
        note("MPI_File_write_at_all", 8 * SZ_INT);
        MPI_File_sync(fh);
        note("MPI_File_sync", 0);
        MPI_File_read_at_all(fh, at, in, 16, MPI_INT, MPI_STATUS_IGNORE);
        note("MPI_File_read_at_all", 16 * SZ_INT);
        digest(in, sizeof in);
        MPI_File_seek(fh, at, MPI_SEEK_SET);
        note("MPI_File_seek", 0);
        MPI_File_read(fh, in, 4, MPI_DOUBLE, MPI_STATUS_IGNORE);
        note("MPI_File_read", 4 * SZ_DOUBLE);
        digest(in, sizeof in);
        MPI_Offset fsize;
        MPI_File_get_size(fh, &fsize);
        note("MPI_File_get_size", 0);
        digest(&fsize, sizeof fsize);
        MPI_File_close(&fh);
        note("MPI_File_close", 0);
        note_coll("MPI_Barrier", 0, P);
        MPI_Barrier(world);
        if (rank == 0) {
            MPI_File_delete(path, MPI_INFO_NULL);
            note("MPI_File_delete", 0);
        }
    }

    /* ---- the profiler's hook, at levels that leave the profiled region alone (0 and 1
     * pause and start it: mpi_pcontrol.c tests those); counted all the same ---- */
    MPI_Pcontrol(2);
    note("MPI_Pcontrol", 0);
    MPI_Pcontrol(3);
    note("MPI_Pcontrol", 0);

    /* last counted MPI call is above; MPI_Finalize is not counted */
    size_t n8 = 8 * (size_t)P * (size_t)(P + 2);
    digest(ibuf2, sizeof ibuf2);
    digest(dbuf2, sizeof dbuf2);
    digest(cbuf2, sizeof cbuf2);
    digest(bbuf2, sizeof bbuf2);
    digest(pbuf2, sizeof pbuf2);
    digest(winbuf, sizeof winbuf);
    digest(irecv, n8 * sizeof(int));
    digest(drecv, n8 * sizeof(double));
    digest(crecv, n8);
    digest(wrecv, 16 * (size_t)P);
    write_truth(prefix, rank, size);
    /* Its output: what it received and computed (the tests compare it with a run alone). */
    printf("mpi_truth: rank %d of %d received and computed %016llx\n", rank, size, checksum);
    fflush(stdout);

    free(isend); free(irecv); free(dsend); free(drecv);
    free(csend); free(crecv); free(wsend); free(wrecv);
    free(counts); free(displs); free(rcounts); free(rdispls);
    free(stypes); free(rtypes);

    MPI_Finalize();
    return 0;
}
