/*
 * mpi_pcontrol: the region MPI_Pcontrol marks, with its truth (any number of ranks >= 2).
 *
 * Usage: mpi_pcontrol OUT_PREFIX
 *
 * Every rank: MPI_Init, Comm_rank, Comm_size, 3 Allreduce (before the region);
 * MPI_Pcontrol(1); 5 Allreduce and 5 ring exchanges (Send of 4 ints to the right, Recv
 * from the left); MPI_Pcontrol(0); 4 Barrier (paused); MPI_Pcontrol(1); 7 Allreduce;
 * MPI_Pcontrol(0); 2 Bcast of 2 doubles (after it). Then it writes OUT_PREFIX.<rank>.json:
 *
 *   {"rank":R,"size":P,"pid":PID,"intervals":2,
 *    "routines":{...every call above, as mpi_truth writes them...},
 *    "region":{...the calls inside the two intervals (MPI_Pcontrol's own left out)...}}
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
    pcontrol(1);
    allreduces(5);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int i = 0; i < 5; i++) {
        int out[4] = {rank, i, 0, 0}, in[4];
        /* Even ranks send first: no cycle of blocking sends. */
        for (int turn = 0; turn < 2; turn++) {
            if ((turn == 0) == (rank % 2 == 0)) {
                MPI_Send(out, 4, MPI_INT, right, 7, MPI_COMM_WORLD);
                note("MPI_Send", 4 * sizeof(int));
            } else {
                MPI_Recv(in, 4, MPI_INT, left, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                note("MPI_Recv", 4 * sizeof(int));
            }
        }
    }
    pcontrol(0);
    for (int i = 0; i < 4; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        note("MPI_Barrier", 0);
    }
    pcontrol(1);
    allreduces(7);
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
    fputs("}\n", f);
    fclose(f);
    MPI_Finalize();
    return 0;
}
