/*
 * mpi_peers: point-to-point traffic with a known communication matrix, for commtap's
 * per-peer counters.
 *
 * Usage: mpi_peers OUT_PREFIX [READY GO [PHASES GRIDS]]
 *
 * With READY and GO, rank 0 creates READY once MPI is initialised, and every rank waits
 * for GO before its first call below (a test attaches daemons in between).
 *
 * With HOLD_BEFORE_INIT=PREFIX in its environment, a rank first writes its pid to
 * PREFIX.<rank> and waits for PREFIX before MPI_Init (ready_go.h).
 *
 * With PHASES and GRIDS, a stencil code's loop follows the traffic below: PHASES times,
 * GRIDS grids each made (an MPI_Comm_split of the world, its ranks one way round or the
 * other in turn), a ring on it of 1 + (g % 40) chars, and freed; after phase P every rank
 * waits for the file GO.P (the test lets commtap move the freed grids' counters out of
 * the kernel's map in between).
 *
 * Every call below notes, next to it, which peer it sent to or received from and how many
 * bytes (commtap's rules: posted bytes for nonblocking receives, the status's for blocking
 * ones). With a known peer the traffic belongs to that peer's world rank; from
 * MPI_ANY_SOURCE with no status, to nobody ("peer": null).
 *
 *   ring:    3 x MPI_Sendrecv of 8 x (i + 1) chars to the right, from the left (posted
 *            the same);
 *   pairs:   for d in 1 .. size-1, partner = rank XOR d (where it exists): the lower rank
 *            MPI_Send then MPI_Recv, the higher MPI_Recv then MPI_Send, 4 x (d + sender)
 *            ints each way (the status's size);
 *   nonblocking: MPI_Irecv from the left (5 doubles posted), MPI_Isend to the right;
 *   wildcard: MPI_Recv from MPI_ANY_SOURCE with a status (the left rank sends 3 ints):
 *            attributed to the left; MPI_Irecv from MPI_ANY_SOURCE (2 ints posted):
 *            nobody's;
 *   other communicators: an MPI_Sendrecv of 6 chars to the right on a duplicate of the
 *            world; then on two splits of the world, to the right and from the left
 *            there: one with its ranks the other way round (key size - rank), one per
 *            parity of the world rank (key -rank), 7 and 9 chars; then on three splits
 *            made in turn, reversed, in order, reversed, 5, 6 and 7 chars. Each is freed
 *            before the next is made, so an MPI gives the next its handle: its traffic
 *            is still its own, on its own members. commtap places a rank in
 *            such a communicator on its world rank (the program asks MPI_Group_translate_ranks
 *            for the truth); it learns each process's rank there from the communicator
 *            (Open MPI) or from MPI_Comm_rank and MPI_Comm_size (MPICH: asked here, as
 *            programs do); and on a Cartesian communicator (MPI_Cart_create), 13 chars,
 *            its rank asked, not its size (MPICH: learnt from the dimensions);
 *   persistent requests: on the reversed split, a ring of 11 ints each way (MPI_Recv_init,
 *            MPI_Send_init, each started with MPI_Start); on the world, twice an
 *            MPI_Startall of a receive of 6 ints from the left (posted bytes), a send of 6
 *            to the right and one to MPI_PROC_NULL: each start is traffic with the peer
 *            its creation named; MPI-4 libraries (MPICH): an MPI_Isendrecv of 5 ints to
 *            the right and 7 posted from the left, and a partitioned send to the right and
 *            receive from the left of 2 x 4 ints;
 *   MPI_PROC_NULL: an MPI_Send to it, which moves nothing and is nobody's traffic.
 *
 * Each rank writes OUT_PREFIX.<rank>.json: {"rank", "pid", "peers": [{"peer", "sent_calls",
 * "sent_bytes", "received_calls", "received_bytes"}]} (peers it exchanged with, by world
 * rank, then null). Every message carries data of its sender's, and each rank prints
 * "mpi_peers: rank R of P received <checksum>" over what it received: the same with and
 * without a profiler watching, or the profiler changed the program.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ready_go.h"

static long long sent_calls[257], sent_bytes[257], recv_calls[257], recv_bytes[257];
static int nobody;

static void sent(int peer, long long bytes)
{
    sent_calls[peer]++;
    sent_bytes[peer] += bytes;
}

static void received(int peer, long long bytes)
{
    recv_calls[peer]++;
    recv_bytes[peer] += bytes;
}

/* FNV-1a over what this rank received. */
static unsigned long long checksum = 0xcbf29ce484222325ULL;
static void digest(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        checksum = (checksum ^ b[i]) * 0x100000001b3ULL;
}

/* What `sender` puts in a message: n bytes that differ by sender, tag and place. */
static void fill(void *buf, size_t n, int sender, int tag)
{
    unsigned char *b = buf;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(sender * 37 + tag * 11 + i);
}

/* The world ranks of the ranks `ends` of `comm`. */
static void world_ranks_of(MPI_Comm comm, const int ends[2], int world_ends[2])
{
    MPI_Group group, world_group;
    MPI_Comm_group(comm, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_translate_ranks(group, 2, ends, world_group, world_ends);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
}

/* This rank's right and left neighbours in `comm` (ends), and their world ranks; its own
 * rank there. */
static int neighbours_on(MPI_Comm comm, int ends[2], int world_ends[2])
{
    int me, size;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &size);
    ends[0] = (me + 1) % size;
    ends[1] = (me + size - 1) % size;
    world_ranks_of(comm, ends, world_ends);
    return me;
}

/* A Sendrecv of `n` chars from rank `me` of `comm` to `ends[0]` and from `ends[1]`, noted
 * on their world ranks `world_ends`. */
static void sendrecv_ring(MPI_Comm comm, int me, const int ends[2], const int world_ends[2],
                          int n, int tag)
{
    static char out[64], in[64];
    fill(out, sizeof out, me, tag);
    MPI_Status st;
    MPI_Sendrecv(out, n, MPI_CHAR, ends[0], tag, in, n, MPI_CHAR, ends[1], tag, comm, &st);
    sent(world_ends[0], n);
    received(world_ends[1], n);
    digest(in, n);
}

/* A Sendrecv of `n` chars to the right of this rank in `comm` and from its left there,
 * noted on their world ranks. */
static void ring_on(MPI_Comm comm, int n, int tag)
{
    int ends[2], world_ends[2];
    int me = neighbours_on(comm, ends, world_ends);
    sendrecv_ring(comm, me, ends, world_ends, n, tag);
}

/* A stencil code's ring: a periodic Cartesian communicator over every rank (not
 * reordered), its neighbours from MPI_Cart_shift and its rank from MPI_Comm_rank, never
 * its size (an MPICH-ABI library's is learnt from the dimensions); a Sendrecv of `n` chars
 * to the right and from the left, noted on their world ranks. Made after another was
 * freed: an MPI likely gives it that one's handle. */
static void cart_ring(int size, int n, int tag)
{
    MPI_Comm cart;
    int dims[1] = {size}, periods[1] = {1}, me, ends[2], world_ends[2];
    MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &cart);
    MPI_Comm_rank(cart, &me);
    MPI_Cart_shift(cart, 0, 1, &ends[1], &ends[0]);
    world_ranks_of(cart, ends, world_ends);
    sendrecv_ring(cart, me, ends, world_ends, n, tag);
    MPI_Comm_free(&cart);
}

/* ring_on's traffic through persistent requests, started one by one (`n` ints each way):
 * each start is traffic with the peer the request's creation named. */
static void persistent_ring_on(MPI_Comm comm, int n, int tag)
{
    static int out[64], in[64];
    int ends[2], world_ends[2];
    fill(out, sizeof out, neighbours_on(comm, ends, world_ends), tag);
    MPI_Request req[2];
    MPI_Status sts[2];
    MPI_Recv_init(in, n, MPI_INT, ends[1], tag, comm, &req[0]);
    MPI_Send_init(out, n, MPI_INT, ends[0], tag, comm, &req[1]);
    MPI_Start(&req[0]);
    received(world_ends[1], 4 * n);
    MPI_Start(&req[1]);
    sent(world_ends[0], 4 * n);
    MPI_Waitall(2, req, sts);
    digest(in, 4 * n);
    MPI_Request_free(&req[0]);
    MPI_Request_free(&req[1]);
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s OUT_PREFIX [READY GO [PHASES GRIDS]]\n", argv[0]);
        return 2;
    }
    int rank, size;
    if (hold_before_init() != 0)
        return 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 256)
        MPI_Abort(MPI_COMM_WORLD, 2);
    if (argc >= 4) {
        if (rank == 0) {
            FILE *r = fopen(argv[2], "w");
            if (!r || fclose(r) != 0) {
                perror(argv[2]);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        wait_for_file(argv[3]);
    }
    nobody = size;
    MPI_Comm world = MPI_COMM_WORLD;
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    static char cbuf[64], cbuf2[64];
    static int ibuf[64], ibuf2[64];
    static double dbuf[8];
    MPI_Status st, sts[2];
    MPI_Request req[2];
    fill(cbuf, sizeof cbuf, rank, 1);
    fill(ibuf, sizeof ibuf, rank, 2);
    fill(dbuf + 5, 3 * sizeof(double), rank, 3);

    for (int i = 0; i < 3; i++) {
        MPI_Sendrecv(cbuf, 8 * (i + 1), MPI_CHAR, right, 1, cbuf2, 8 * (i + 1), MPI_CHAR,
                     left, 1, world, &st);
        sent(right, 8 * (i + 1));
        received(left, 8 * (i + 1));
        digest(cbuf2, 8 * (i + 1));
    }

    for (int d = 1; d < size; d++) {
        int partner = rank ^ d;
        if (partner >= size)
            continue;
        int mine = 4 * (d + rank), theirs = 4 * (d + partner);
        if (rank < partner) {
            MPI_Send(ibuf, mine / 4, MPI_INT, partner, 2, world);
            sent(partner, mine);
            MPI_Recv(ibuf2, 64, MPI_INT, partner, 2, world, &st);
            received(partner, theirs);
            digest(ibuf2, theirs);
        } else {
            MPI_Recv(ibuf2, 64, MPI_INT, partner, 2, world, &st);
            received(partner, theirs);
            digest(ibuf2, theirs);
            MPI_Send(ibuf, mine / 4, MPI_INT, partner, 2, world);
            sent(partner, mine);
        }
    }

    MPI_Irecv(dbuf, 5, MPI_DOUBLE, left, 3, world, &req[0]);
    received(left, 5 * 8);
    MPI_Isend(dbuf + 5, 3, MPI_DOUBLE, right, 3, world, &req[1]);
    sent(right, 3 * 8);
    MPI_Waitall(2, req, sts);
    digest(dbuf, 5 * 8);

    MPI_Send(ibuf, 3, MPI_INT, right, 4, world);
    sent(right, 3 * 4);
    MPI_Recv(ibuf2, 64, MPI_INT, MPI_ANY_SOURCE, 4, world, &st);
    received(left, 3 * 4);
    digest(ibuf2, 3 * 4);

    MPI_Irecv(ibuf2, 2, MPI_INT, MPI_ANY_SOURCE, 5, world, &req[0]);
    received(nobody, 2 * 4);
    MPI_Send(ibuf, 2, MPI_INT, right, 5, world);
    sent(right, 2 * 4);
    MPI_Wait(&req[0], MPI_STATUS_IGNORE);
    digest(ibuf2, 2 * 4);

    /* Each communicator freed once used, as stencil codes free their grids: an MPI gives a
     * freed handle to the next communicator it makes (of other members here), and the
     * traffic each had stays its own. */
    MPI_Comm dup, reversed, parity, grid;
    MPI_Comm_dup(world, &dup);
    ring_on(dup, 6, 6);
    MPI_Comm_free(&dup);
    MPI_Comm_split(world, 0, size - rank, &reversed);
    ring_on(reversed, 7, 8);
    persistent_ring_on(reversed, 11, 11);
    MPI_Comm_free(&reversed);
    MPI_Comm_split(world, rank % 2, -rank, &parity);
    ring_on(parity, 9, 9);
    MPI_Comm_free(&parity);
    cart_ring(size, 13, 13);
    for (int i = 0; i < 3; i++) {
        MPI_Comm_split(world, 0, i % 2 ? rank : size - rank, &grid);
        ring_on(grid, 5 + i, 20 + i);
        MPI_Comm_free(&grid);
    }

    if (argc == 6) {
        int phases = atoi(argv[4]), grids = atoi(argv[5]);
        for (int p = 0; p < phases; p++) {
            for (int g = 0; g < grids; g++) {
                MPI_Comm_split(world, 0, g % 2 ? rank : size - rank, &grid);
                ring_on(grid, 1 + g % 40, 100 + g % 1000);
                MPI_Comm_free(&grid);
            }
            char go[4096];
            snprintf(go, sizeof go, "%s.%d", argv[3], p);
            wait_for_file(go);
        }
    }

    MPI_Send(ibuf, 10, MPI_INT, MPI_PROC_NULL, 7, world);

    /* Persistent requests started together, twice: the receive's posted bytes from the
     * left, the send's to the right, and nothing for the one to MPI_PROC_NULL. */
    MPI_Request preq[3];
    MPI_Status psts[3];
    MPI_Recv_init(ibuf2, 6, MPI_INT, left, 10, world, &preq[0]);
    MPI_Send_init(ibuf, 6, MPI_INT, right, 10, world, &preq[1]);
    MPI_Send_init(ibuf, 6, MPI_INT, MPI_PROC_NULL, 10, world, &preq[2]);
    for (int i = 0; i < 2; i++) {
        MPI_Startall(3, preq);
        received(left, 6 * 4);
        sent(right, 6 * 4);
        MPI_Waitall(3, preq, psts);
        digest(ibuf2, 6 * 4);
    }
    for (int i = 0; i < 3; i++)
        MPI_Request_free(&preq[i]);

#if defined(MPI_VERSION) && MPI_VERSION >= 4
    /* MPI-4: a nonblocking Sendrecv (5 ints to the right, 7 posted from the left) and a
     * partitioned send and receive (2 partitions of 4 ints), started once. */
    MPI_Isendrecv(ibuf, 5, MPI_INT, right, 12, ibuf2, 7, MPI_INT, left, 12, world, &preq[0]);
    sent(right, 5 * 4);
    received(left, 7 * 4);
    MPI_Waitall(1, preq, psts);
    digest(ibuf2, 5 * 4);
    MPI_Precv_init(ibuf2, 2, 4, MPI_INT, left, 13, world, MPI_INFO_NULL, &preq[0]);
    MPI_Psend_init(ibuf, 2, 4, MPI_INT, right, 13, world, MPI_INFO_NULL, &preq[1]);
    MPI_Startall(2, preq);
    received(left, 2 * 4 * 4);
    sent(right, 2 * 4 * 4);
    MPI_Pready_range(0, 1, preq[1]);
    MPI_Waitall(2, preq, psts);
    digest(ibuf2, 2 * 4 * 4);
    MPI_Request_free(&preq[0]);
    MPI_Request_free(&preq[1]);
#endif

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(f, "{\"rank\": %d, \"pid\": %ld, \"peers\": [", rank, (long)getpid());
    int first = 1;
    for (int p = 0; p <= size; p++) {
        if (!sent_calls[p] && !recv_calls[p])
            continue;
        char peer[16];
        if (p == nobody)
            strcpy(peer, "null");
        else
            snprintf(peer, sizeof peer, "%d", p);
        fprintf(f,
                "%s{\"peer\": %s, \"sent_calls\": %lld, \"sent_bytes\": %lld, "
                "\"received_calls\": %lld, \"received_bytes\": %lld}",
                first ? "" : ", ", peer, sent_calls[p], sent_bytes[p], recv_calls[p],
                recv_bytes[p]);
        first = 0;
    }
    fprintf(f, "]}\n");
    fclose(f);
    printf("mpi_peers: rank %d of %d received %016llx\n", rank, size, checksum);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
