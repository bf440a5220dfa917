/*
 * mpi_late_sender: point-to-point messages with a known late sender, for commtap's Late
 * Sender tests.
 *
 * Usage: mpi_late_sender DELAY_MS N OUT_PREFIX        (2 ranks)
 *
 *   1. Rank 1 sleeps DELAY_MS before each of N sends (MPI_Send, 1 int, tag 1) to rank 0,
 *      which is already waiting in MPI_Recv: N late senders, each receive waiting about
 *      DELAY_MS.
 *   2. MPI_Barrier; rank 1 sends N more (tag 2) at once, and rank 0 sleeps DELAY_MS before
 *      each MPI_Recv: the sends started first (small messages complete eagerly), so none
 *      is late.
 *   3. MPI_Barrier; rank 0 posts MPI_Irecv (tag 3), rank 1 sleeps DELAY_MS then sends,
 *      rank 0 waits in MPI_Wait: one more late sender, the wait waiting about DELAY_MS.
 *   4. MPI_Barrier; rank 0 posts two MPI_Irecv (tags 4 and 5) and waits for both in one
 *      MPI_Waitall; rank 1 sleeps DELAY_MS then sends both: a wait of several messages is
 *      one late message (of the send that started last), two messages, about DELAY_MS
 *      waited (not twice: the wait waited once).
 *   5. MPI_Barrier; rank 0 posts MPI_Irecv (tag 6) and calls MPI_Test until it completes;
 *      rank 1 sleeps DELAY_MS then sends: completed by a call that does not say which
 *      request it completed, left out.
 *   6. N times: MPI_Barrier; rank 1 sends with MPI_Ssend (tag 7) at once, rank 0 sleeps
 *      DELAY_MS before its MPI_Recv: N late receivers (a synchronous send cannot return
 *      before its receive is posted), each send waiting about DELAY_MS.
 *   7. MPI_Barrier; rank 1 sends 4 MiB with MPI_Send (tag 8), too large to go eagerly in
 *      any MPI, rank 0 sleeps DELAY_MS before its MPI_Recv: one more late receiver.
 *   8. MPI_Barrier; rank 0 posts MPI_Irecv (tag 9) and waits in MPI_Waitany (its request
 *      and a null one); rank 1 sleeps DELAY_MS then sends: one more late sender, the
 *      wait for any waiting for the one it completed.
 *   9. MPI_Barrier; rank 0 posts two MPI_Irecv (tags 10 and 11) and waits in MPI_Waitsome;
 *      rank 1 sleeps DELAY_MS then sends tag 10 alone (tag 11 after a barrier rank 0
 *      enters once its wait returned): one more late sender. Then rank 0 sleeps DELAY_MS
 *      before a second MPI_Waitsome, which takes tag 11, sent on time.
 * Every send of rank 1 is a blocking one (MPI_Send, MPI_Ssend); only those of steps 6
 * and 7 were late for.
 *
 * Each rank writes OUT_PREFIX.<rank>.json: {"rank":R,"pid":PID,"late":L,"messages":M,
 * "blocking_sends":B,"receiver_late":RL,"delay_ns":D}: as receiver, the messages Late
 * Sender pairs (steps 1 to 4 and 6 to 9) and how many of them were sent late; as sender, its
 * blocking sends and how many of them waited for a late receiver; the sleep before each.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s DELAY_MS N OUT_PREFIX\n", argv[0]);
        return 2;
    }
    long delay = atol(argv[1]);
    int n = atoi(argv[2]);
    int rank, size, v = 0;
    long long late = 0, messages = 0, blocking_sends = 0, receiver_late = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        fprintf(stderr, "mpi_late_sender: needs 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (int i = 0; i < n; i++) {
        if (rank == 1) {
            sleep_ms(delay);
            MPI_Send(&i, 1, MPI_INT, 0, 1, MPI_COMM_WORLD);
            blocking_sends++;
        } else {
            MPI_Recv(&v, 1, MPI_INT, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            late++;
            messages++;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < n; i++) {
        if (rank == 1) {
            MPI_Send(&i, 1, MPI_INT, 0, 2, MPI_COMM_WORLD);
            blocking_sends++;
        } else {
            sleep_ms(delay);
            MPI_Recv(&v, 1, MPI_INT, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            messages++;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        sleep_ms(delay);
        MPI_Send(&v, 1, MPI_INT, 0, 3, MPI_COMM_WORLD);
        blocking_sends++;
    } else {
        MPI_Request req;
        MPI_Irecv(&v, 1, MPI_INT, 1, 3, MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        late++;
        messages++;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        sleep_ms(delay);
        MPI_Send(&v, 1, MPI_INT, 0, 4, MPI_COMM_WORLD);
        MPI_Send(&v, 1, MPI_INT, 0, 5, MPI_COMM_WORLD);
        blocking_sends += 2;
    } else {
        MPI_Request req[2];
        int w[2];
        MPI_Irecv(&w[0], 1, MPI_INT, 1, 4, MPI_COMM_WORLD, &req[0]);
        MPI_Irecv(&w[1], 1, MPI_INT, 1, 5, MPI_COMM_WORLD, &req[1]);
        MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        late++;
        messages += 2;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        sleep_ms(delay);
        MPI_Send(&v, 1, MPI_INT, 0, 6, MPI_COMM_WORLD);
        blocking_sends++;
    } else {
        MPI_Request req;
        int done = 0;
        MPI_Irecv(&v, 1, MPI_INT, 1, 6, MPI_COMM_WORLD, &req);
        for (;;) {
            MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            if (done)
                break;
            sleep_ms(1); /* a few dozen calls, not a flood of events */
        }
    }
    for (int i = 0; i < n; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 1) {
            MPI_Ssend(&i, 1, MPI_INT, 0, 7, MPI_COMM_WORLD);
            blocking_sends++;
            receiver_late++;
        } else {
            sleep_ms(delay);
            MPI_Recv(&v, 1, MPI_INT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            messages++;
        }
    }
    {
        enum { BIG = 1 << 20 };
        int *big = calloc(BIG, sizeof(int));
        if (!big)
            MPI_Abort(MPI_COMM_WORLD, 1);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 1) {
            MPI_Send(big, BIG, MPI_INT, 0, 8, MPI_COMM_WORLD);
            blocking_sends++;
            receiver_late++;
        } else {
            sleep_ms(delay);
            MPI_Recv(big, BIG, MPI_INT, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            messages++;
        }
        free(big);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        sleep_ms(delay);
        MPI_Send(&v, 1, MPI_INT, 0, 9, MPI_COMM_WORLD);
        blocking_sends++;
    } else {
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        int idx;
        MPI_Irecv(&v, 1, MPI_INT, 1, 9, MPI_COMM_WORLD, &req[0]);
        MPI_Waitany(2, req, &idx, MPI_STATUS_IGNORE);
        late++;
        messages++;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        sleep_ms(delay);
        MPI_Send(&v, 1, MPI_INT, 0, 10, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Send(&v, 1, MPI_INT, 0, 11, MPI_COMM_WORLD);
        blocking_sends += 2;
    } else {
        MPI_Request req[2];
        int w[2], outcount, indices[2];
        MPI_Irecv(&w[0], 1, MPI_INT, 1, 10, MPI_COMM_WORLD, &req[0]);
        MPI_Irecv(&w[1], 1, MPI_INT, 1, 11, MPI_COMM_WORLD, &req[1]);
        MPI_Waitsome(2, req, &outcount, indices, MPI_STATUSES_IGNORE);
        if (outcount != 1 || indices[0] != 0) {
            fprintf(stderr, "mpi_late_sender: MPI_Waitsome took %d\n", outcount);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        late++;
        messages++;
        MPI_Barrier(MPI_COMM_WORLD);
        sleep_ms(delay);
        MPI_Waitsome(2, req, &outcount, indices, MPI_STATUSES_IGNORE);
        messages++;
    }

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", argv[3], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fprintf(f,
            "{\"rank\":%d,\"pid\":%ld,\"late\":%lld,\"messages\":%lld,\"blocking_sends\":%lld,"
            "\"receiver_late\":%lld,\"delay_ns\":%lld}\n",
            rank, (long)getpid(), late, messages, blocking_sends, receiver_late,
            delay * 1000000LL);
    fclose(f);
    MPI_Finalize();
    return 0;
}
