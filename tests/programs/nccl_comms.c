/*
 * nccl_comms: one rank of a two-process NCCL job whose communicators have a known life:
 * created before and after commtap attaches, split, queried, destroyed. Linked against the
 * NCCL stand-in (nccl_standin.c: the real library cannot create a communicator without a
 * GPU), so that commtap's communicator bookkeeping can be checked exactly.
 *
 * Usage: nccl_comms READY_FILE GO_FILE UID_FILE RANK TRUTH_FILE
 *
 *  Before GO_FILE exists (not counted): early = ncclCommInitAll of 1 device.
 *  Counted, every figure per process (r = RANK, p = 1 - r):
 *   3 x ncclAllReduce(early, 10 x Float32)           unknown communicator, 40 bytes each
 *   1 x ncclAllGather(early, 4 x Float32)            undecoded: its size is unknown
 *   ncclCommCount(early), ncclCommUserRank(early)    size 1, rank 0 learnt (id unknown)
 *   1 x ncclAllGather(early, 4 x Float32)            16 bytes
 *   ncclGetUniqueId (rank 0, shared through UID_FILE); ncclCommInitRank(world, 2, id, r)
 *   5 x ncclAllReduce(world, 256 x Float32)          1024 bytes each
 *   2 x ncclBroadcast(world, 100 x Bfloat16, root 0) 200
 *   1 x ncclReduce(world, 7 x Int64, root 1)         56
 *   1 x ncclReduceScatter(world, 8 x Float16)        32 (recvcount x size x 2 ranks)
 *   1 x ncclAlltoAll(world, 3 x Int32)               24
 *   1 x ncclGather(world, 2 x Float64, root 0)       32
 *   ncclGroupStart; ncclSend(world, 16 x Uint8, p); ncclRecv(world, 16 x Uint8, p);
 *   ncclGroupEnd                                     one group, 2 operations, 32 bytes
 *   s1 = ncclCommSplit(world, 0); s2 = ncclCommSplit(world, 0);
 *   ncclCommSplit(world, NCCL_SPLIT_NOCOLOR) -> NULL
 *   1 x ncclAllReduce(s1, 1 x Float64)               8, size not known yet
 *   ncclCommCount(s1), ncclCommUserRank(s1)
 *   1 x ncclAllReduce(s1, 1 x Float64)               8, size 2, rank r
 *   1 x ncclAllReduce(s2, 2 x Float64)               16, another communicator
 *   ncclGetUniqueId (rank 0, UID_FILE.2); scal = ncclCommInitRankScalable(2, r, 1 id)
 *   1 x ncclAlltoAll(scal, 5 x Int8)                10, another communicator
 *   ncclCommDestroy of s1, s2, world, early, scal
 *  Then writes TRUTH_FILE: {"pid", "routines": {name: {calls, bytes}}}.
 */
#include "nccl_abi.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "ready_go.h"

static void check(ncclResult_t rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "%s failed: %d\n", what, rc);
        exit(1);
    }
}

static void share_id(const char *path, int rank, ncclUniqueId *id)
{
    if (rank == 0) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        check(ncclGetUniqueId(id), "ncclGetUniqueId");
        FILE *f = fopen(tmp, "w");
        if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path)) {
            perror(path);
            exit(1);
        }
        return;
    }
    wait_for_file(path);
    FILE *f = fopen(path, "r");
    if (!f || fread(id, sizeof *id, 1, f) != 1) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s READY_FILE GO_FILE UID_FILE RANK TRUTH_FILE\n", argv[0]);
        return 2;
    }
    int r = atoi(argv[4]), p = 1 - r, n;
    static char sb[1 << 16], rb[1 << 16];
    ncclComm_t early, world, s1, s2, s3 = (ncclComm_t)1;
    check(ncclCommInitAll(&early, 1, NULL), "ncclCommInitAll");
    FILE *ready = fopen(argv[1], "w");
    if (!ready || fclose(ready) != 0) {
        perror(argv[1]);
        return 1;
    }
    wait_for_file(argv[2]);

    for (int i = 0; i < 3; i++)
        check(ncclAllReduce(sb, rb, 10, ncclFloat32, ncclSum, early, NULL), "AllReduce");
    check(ncclAllGather(sb, rb, 4, ncclFloat32, early, NULL), "AllGather");
    check(ncclCommCount(early, &n), "CommCount");
    check(ncclCommUserRank(early, &n), "CommUserRank");
    check(ncclAllGather(sb, rb, 4, ncclFloat32, early, NULL), "AllGather");

    ncclUniqueId id;
    share_id(argv[3], r, &id);
    check(ncclCommInitRank(&world, 2, id, r), "ncclCommInitRank");
    for (int i = 0; i < 5; i++)
        check(ncclAllReduce(sb, rb, 256, ncclFloat32, ncclSum, world, NULL), "AllReduce");
    for (int i = 0; i < 2; i++)
        check(ncclBroadcast(sb, rb, 100, ncclBfloat16, 0, world, NULL), "Broadcast");
    check(ncclReduce(sb, rb, 7, ncclInt64, ncclSum, 1, world, NULL), "Reduce");
    check(ncclReduceScatter(sb, rb, 8, ncclFloat16, ncclSum, world, NULL), "ReduceScatter");
    check(ncclAlltoAll(sb, rb, 3, ncclInt32, world, NULL), "AlltoAll");
    check(ncclGather(sb, rb, 2, ncclFloat64, 0, world, NULL), "Gather");
    check(ncclGroupStart(), "GroupStart");
    check(ncclSend(sb, 16, ncclUint8, p, world, NULL), "Send");
    check(ncclRecv(rb, 16, ncclUint8, p, world, NULL), "Recv");
    check(ncclGroupEnd(), "GroupEnd");

    check(ncclCommSplit(world, 0, r, &s1, NULL), "Split");
    check(ncclCommSplit(world, 0, r, &s2, NULL), "Split");
    check(ncclCommSplit(world, NCCL_SPLIT_NOCOLOR, r, &s3, NULL), "Split");
    if (s3 != NULL) {
        fprintf(stderr, "NOCOLOR split returned a communicator\n");
        return 1;
    }
    check(ncclAllReduce(sb, rb, 1, ncclFloat64, ncclSum, s1, NULL), "AllReduce");
    check(ncclCommCount(s1, &n), "CommCount");
    check(ncclCommUserRank(s1, &n), "CommUserRank");
    check(ncclAllReduce(sb, rb, 1, ncclFloat64, ncclSum, s1, NULL), "AllReduce");
    check(ncclAllReduce(sb, rb, 2, ncclFloat64, ncclSum, s2, NULL), "AllReduce");
    check(ncclCommDestroy(s1), "Destroy");
    check(ncclCommDestroy(s2), "Destroy");
    check(ncclCommDestroy(world), "Destroy");
    check(ncclCommDestroy(early), "Destroy");

    char path2[4096];
    snprintf(path2, sizeof path2, "%s.2", argv[3]);
    ncclUniqueId id2;
    ncclComm_t scal;
    share_id(path2, r, &id2);
    check(ncclCommInitRankScalable(&scal, 2, r, 1, &id2, NULL), "InitRankScalable");
    check(ncclAlltoAll(sb, rb, 5, ncclInt8, scal, NULL), "AlltoAll");
    check(ncclCommDestroy(scal), "Destroy");

    FILE *f = fopen(argv[5], "w");
    if (!f) {
        perror(argv[5]);
        return 1;
    }
    fprintf(f,
            "{\"pid\": %d, \"routines\": {\n"
            " \"ncclAllReduce\": {\"calls\": 11, \"bytes\": %d},\n"
            " \"ncclAllGather\": {\"calls\": 2, \"bytes\": 16},\n"
            " \"ncclCommCount\": {\"calls\": 2, \"bytes\": 0},\n"
            " \"ncclCommUserRank\": {\"calls\": 2, \"bytes\": 0},\n"
            " \"ncclCommInitRank\": {\"calls\": 1, \"bytes\": 0},\n"
            " \"ncclBroadcast\": {\"calls\": 2, \"bytes\": 400},\n"
            " \"ncclReduce\": {\"calls\": 1, \"bytes\": 56},\n"
            " \"ncclReduceScatter\": {\"calls\": 1, \"bytes\": 32},\n"
            " \"ncclAlltoAll\": {\"calls\": 2, \"bytes\": 34},\n"
            " \"ncclCommInitRankScalable\": {\"calls\": 1, \"bytes\": 0},\n"
            " \"ncclGather\": {\"calls\": 1, \"bytes\": 32},\n"
            " \"ncclGroupStart\": {\"calls\": 1, \"bytes\": 0},\n"
            " \"ncclSend\": {\"calls\": 1, \"bytes\": 16},\n"
            " \"ncclRecv\": {\"calls\": 1, \"bytes\": 16},\n"
            " \"ncclGroupEnd\": {\"calls\": 1, \"bytes\": 0},\n"
            " \"ncclGroup\": {\"calls\": 1, \"bytes\": 32},\n"
            " \"ncclCommSplit\": {\"calls\": 3, \"bytes\": 0},\n"
            " \"ncclCommDestroy\": {\"calls\": 5, \"bytes\": 0}}}\n",
            (int)getpid(), 3 * 40 + 5 * 1024 + 8 + 8 + 16);
    if (fclose(f) != 0) {
        perror(argv[5]);
        return 1;
    }
    return 0;
}
