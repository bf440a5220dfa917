/*
 * mpi_pcontrol: the region MPI_Pcontrol marks, with its truth (any number of ranks >= 2).
 *
 * Usage: mpi_pcontrol OUT_PREFIX
 *
 * Every rank: MPI_Init, Comm_rank, Comm_size, 3 Allreduce and 2 ring exchanges of 8 ints
 * (before the region); MPI_Pcontrol(1); 5 Allreduce and 5 ring exchanges (Send of 4 ints
 * to the right, Recv from the left); MPI_Pcontrol(0); 4 Barrier and 3 ring exchanges of 2
 * ints (paused); MPI_Pcontrol(1); 7 Allreduce and 1 ring exchange of 6 ints;
 * MPI_Pcontrol(0); 2 Bcast of 2 doubles (after it). Then it writes OUT_PREFIX.<rank>.json:
 *
 *   {"rank":R,"size":P,"pid":PID,"intervals":2,
 *    "routines":{...every call above, as mpi_truth writes them...},
 *    "region":{...the calls inside the two intervals (MPI_Pcontrol's own left out)...},
 *    "peers":[...the ring's traffic per world rank, as commtap's profile lists it...],
 *    "region_peers":[...the same inside the two intervals...]}
 *
 * and calls MPI_Finalize (not counted). Bytes are count x type size.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct row {
    const char *name;
    long long calls, bytes, region_calls, region_bytes;
};

static struct row rows[] = {
    {"MPI_Init", 0, 0, 0, 0},      {"MPI_Comm_rank", 0, 0, 0, 0}, {"MPI_Comm_size", 0, 0, 0, 0},
    {"MPI_Allreduce", 0, 0, 0, 0}, {"MPI_Send", 0, 0, 0, 0},      {"MPI_Recv", 0, 0, 0, 0},
    {"MPI_Barrier", 0, 0, 0, 0},   {"MPI_Bcast", 0, 0, 0, 0},     {"MPI_Pcontrol", 0, 0, 0, 0},
};
static int in_region;

/* The ring's traffic: [0] the whole run, [1] the region. */
static long long sent_calls[2], sent_bytes[2], recv_calls[2], recv_bytes[2];

static void note(const char *name, long long bytes) {
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct row *r = &rows[i];
        if (!strcmp(r->name, name)) {
            r->calls++;
            r->bytes += bytes;
            if (in_region && strcmp(name, "MPI_Pcontrol")) {
                r->region_calls++;
                r->region_bytes += bytes;
            }
            return;
        }
    }
    abort();
}

static void table(FILE *f, int region) {
    int first = 1;
    fputc('{', f);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        long long calls = region ? rows[i].region_calls : rows[i].calls;
        long long bytes = region ? rows[i].region_bytes : rows[i].bytes;
        if (calls == 0)
            continue;
        fprintf(f, "%s\"%s\":{\"calls\":%lld,\"bytes\":%lld}", first ? "" : ",", rows[i].name,
                calls, bytes);
        first = 0;
    }
    fputc('}', f);
}

static void allreduces(int n) {
    for (int i = 0; i < n; i++) {
        double in = i, out;
        MPI_Allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        note("MPI_Allreduce", sizeof(double));
    }
}

/* n exchanges of `ints` ints with the neighbours: Send to the right, Recv from the left
 * (even ranks send first: no cycle of blocking sends). */
static void ring(int rank, int size, int n, int ints) {
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    long long bytes = ints * (long long)sizeof(int);
    for (int i = 0; i < n; i++) {
        int out[8] = {rank, i}, in[8];
        for (int turn = 0; turn < 2; turn++) {
            if ((turn == 0) == (rank % 2 == 0)) {
                MPI_Send(out, ints, MPI_INT, right, 7, MPI_COMM_WORLD);
                note("MPI_Send", bytes);
                for (int w = 0; w <= in_region; w++) {
                    sent_calls[w]++;
                    sent_bytes[w] += bytes;
                }
            } else {
                MPI_Recv(in, ints, MPI_INT, left, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                note("MPI_Recv", bytes);
                for (int w = 0; w <= in_region; w++) {
                    recv_calls[w]++;
                    recv_bytes[w] += bytes;
                }
            }
        }
    }
}

/* The ring's traffic as commtap lists a rank's peers: one entry per world rank, by rank. */
static void peers(FILE *f, int rank, int size, int w) {
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    fputc('[', f);
    if (right == left) {
        fprintf(f,
                "{\"peer\":%d,\"sent_calls\":%lld,\"sent_bytes\":%lld,\"received_calls\":%lld,"
                "\"received_bytes\":%lld}",
                right, sent_calls[w], sent_bytes[w], recv_calls[w], recv_bytes[w]);
    } else {
        int lo = left < right ? left : right, hi = left < right ? right : left;
        for (int p = lo; p <= hi; p += hi - lo) {
            int to = p == right, from = p == left;
            fprintf(f,
                    "%s{\"peer\":%d,\"sent_calls\":%lld,\"sent_bytes\":%lld,"
                    "\"received_calls\":%lld,\"received_bytes\":%lld}",
                    p == lo ? "" : ",", p, to ? sent_calls[w] : 0, to ? sent_bytes[w] : 0,
                    from ? recv_calls[w] : 0, from ? recv_bytes[w] : 0);
        }
    }
    fputc(']', f);
}

static void pcontrol(int level) {
    MPI_Pcontrol(level);
    note("MPI_Pcontrol", 0);
    in_region = level;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_PREFIX\n", argv[0]);
        return 2;
    }
    int rank, size;
    MPI_Init(&argc, &argv);
    note("MPI_Init", 0);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    note("MPI_Comm_rank", 0);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    note("MPI_Comm_size", 0);

    allreduces(3);
    ring(rank, size, 2, 8);
    pcontrol(1);
    allreduces(5);
    ring(rank, size, 5, 4);
    pcontrol(0);
    for (int i = 0; i < 4; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        note("MPI_Barrier", 0);
    }
    ring(rank, size, 3, 2);
    pcontrol(1);
    allreduces(7);
    ring(rank, size, 1, 6);
    pcontrol(0);
    for (int i = 0; i < 2; i++) {
        double d[2] = {1, 2};
        MPI_Bcast(d, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        note("MPI_Bcast", 2 * sizeof(double));
    }

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "{\"rank\":%d,\"size\":%d,\"pid\":%d,\"intervals\":2,\"routines\":", rank, size,
            (int)getpid());
    table(f, 0);
    fputs(",\"region\":", f);
    table(f, 1);
    fputs(",\"peers\":", f);
    peers(f, rank, size, 0);
    fputs(",\"region_peers\":", f);
    peers(f, rank, size, 1);
    fputs("}\n", f);
    fclose(f);
    MPI_Finalize();
    return 0;
}
