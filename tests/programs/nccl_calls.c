/*
 * nccl_calls: calls the real libnccl.so.2 (the nvidia-nccl-cu13 wheel) a known number of
 * times with known counts and datatypes, for commtap's NCCL test on a machine without a
 * GPU: with a NULL communicator every call fails fast (ncclInvalidArgument) after the
 * probes have seen its real arguments.
 *
 * Usage: nccl_calls READY_FILE GO_FILE N TRUTH_FILE
 *
 *  1. Creates READY_FILE, then polls (no NCCL calls) until GO_FILE exists.
 *  2. Counted from here on, N times:
 *       ncclAllReduce   1024 x Float32            4096 bytes
 *       ncclBroadcast    100 x Bfloat16            200 bytes
 *       ncclBcast          3 x Float64              24 bytes (calls ncclBroadcast: once)
 *       ncclReduce         7 x Int64                56 bytes (comm is the 7th argument)
 *       ncclAllGather     16 x Float16  undecoded: bytes are count x size x nranks, and
 *                                       a NULL communicator has no size
 *       ncclAllReduce     64 x type 42  undecoded: a datatype this NCCL does not have
 *       ncclAllReduceConfig 512 x Float32   2048 bytes (NCCL 2.32's per-call config)
 *       ncclGroupStart; ncclSend 5 x Float8e4m3; ncclRecv 9 x Uint8; ncclGroupEnd
 *                                       one group of 2 operations, 14 bytes
 *  3. Writes TRUTH_FILE: {"pid", "routines": {name: {calls, bytes}}, "undecoded",
 *     "groups", "group_ops"}.
 */
#include "nccl_abi.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ready_go.h"

static void touch(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s READY_FILE GO_FILE N TRUTH_FILE\n", argv[0]);
        return 2;
    }
    long n = atol(argv[3]);
    static char sb[1 << 16], rb[1 << 16];
    touch(argv[1]);
    wait_for_file(argv[2]);

    for (long i = 0; i < n; i++) {
        ncclAllReduce(sb, rb, 1024, ncclFloat32, ncclSum, NULL, NULL);
        ncclBroadcast(sb, rb, 100, ncclBfloat16, 0, NULL, NULL);
        ncclBcast(sb, 3, ncclFloat64, 0, NULL, NULL);
        ncclReduce(sb, rb, 7, ncclInt64, ncclSum, 0, NULL, NULL);
        ncclAllGather(sb, rb, 16, ncclFloat16, NULL, NULL);
        ncclAllReduce(sb, rb, 64, (ncclDataType_t)42, ncclSum, NULL, NULL);
        ncclAllReduceConfig(sb, rb, 512, ncclFloat32, ncclSum, NULL, NULL, NULL);
        ncclGroupStart();
        ncclSend(sb, 5, ncclFloat8e4m3, 1, NULL, NULL);
        ncclRecv(rb, 9, ncclUint8, 1, NULL, NULL);
        ncclGroupEnd();
    }

    FILE *f = fopen(argv[4], "w");
    if (!f) {
        perror(argv[4]);
        return 1;
    }
    fprintf(f,
            "{\"pid\": %d, \"routines\": {\n"
            " \"ncclAllReduce\": {\"calls\": %ld, \"bytes\": %ld},\n"
            " \"ncclBroadcast\": {\"calls\": %ld, \"bytes\": %ld},\n"
            " \"ncclBcast\": {\"calls\": %ld, \"bytes\": %ld},\n"
            " \"ncclReduce\": {\"calls\": %ld, \"bytes\": %ld},\n"
            " \"ncclAllGather\": {\"calls\": %ld, \"bytes\": 0},\n"
            " \"ncclGroupStart\": {\"calls\": %ld, \"bytes\": 0},\n"
            " \"ncclSend\": {\"calls\": %ld, \"bytes\": %ld},\n"
            " \"ncclRecv\": {\"calls\": %ld, \"bytes\": %ld},\n"
            " \"ncclGroupEnd\": {\"calls\": %ld, \"bytes\": 0},\n"
            " \"ncclGroup\": {\"calls\": %ld, \"bytes\": %ld},\n"
            " \"ncclAllReduceConfig\": {\"calls\": %ld, \"bytes\": %ld}},\n"
            " \"undecoded\": %ld, \"group_ops\": %ld}\n",
            (int)getpid(), 2 * n, n * 4096, n, n * 200, n, n * 24, n, n * 56, n, n, n,
            n * 5, n, n * 9, n, n, n * 14, n, n * 2048, 2 * n, 2 * n);
    if (fclose(f) != 0) {
        perror(argv[4]);
        return 1;
    }
    return 0;
}
