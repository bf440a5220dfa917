/*
 * nccl_device: NCCL operations followed by host waits for the GPU, against the NCCL and
 * CUDA runtime stand-ins (nccl_standin.c, cudart_standin.c: no GPU here), for commtap's
 * device-time measurement. The stand-in's cudaStreamSynchronize takes 1 ms.
 *
 * Usage: nccl_device READY_FILE GO_FILE
 *
 *  Counted, once GO_FILE exists:
 *    ncclCommInitAll of 2 devices; comms[0] (size 2) is used.
 *   20 x { ncclAllReduce 1 MiB (262144 x Float32); cudaStreamSynchronize }
 *    5 x { 4 x ncclAllReduce 1 MiB; cudaStreamSynchronize }
 *          -> 40 AllReduces with device time, over 25 windows of at least 1 ms
 *    3 x { ncclAllReduce 1 MiB; ncclBroadcast 64 B; cudaStreamSynchronize }
 *          -> 3 mixed windows, not attributed
 *    2 x { ncclGroupStart; ncclSend 1 KiB; ncclRecv 1 KiB; ncclGroupEnd;
 *          cudaStreamSynchronize }   -> 2 groups with device time
 *    1 x cudaStreamSynchronize with nothing enqueued
 */
#include "nccl_abi.h"
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include "ready_go.h"

int cudaStreamSynchronize(void *stream);

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s READY_FILE GO_FILE\n", argv[0]);
        return 2;
    }
    static char sb[1 << 20], rb[1 << 20];
    ncclComm_t comms[2];
    void *stream = (void *)0x5;
    FILE *ready = fopen(argv[1], "w");
    if (!ready || fclose(ready) != 0)
        return 1;
    wait_for_file(argv[2]);
    if (ncclCommInitAll(comms, 2, NULL) != 0)
        return 1;

    int rc = 0;
    for (int i = 0; i < 20; i++) {
        rc |= ncclAllReduce(sb, rb, 262144, ncclFloat32, ncclSum, comms[0], stream);
        rc |= cudaStreamSynchronize(stream);
    }
    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 4; j++)
            rc |= ncclAllReduce(sb, rb, 262144, ncclFloat32, ncclSum, comms[0], stream);
        rc |= cudaStreamSynchronize(stream);
    }
    for (int i = 0; i < 3; i++) {
        rc |= ncclAllReduce(sb, rb, 262144, ncclFloat32, ncclSum, comms[0], stream);
        rc |= ncclBroadcast(sb, rb, 16, ncclFloat32, 0, comms[0], stream);
        rc |= cudaStreamSynchronize(stream);
    }
    for (int i = 0; i < 2; i++) {
        rc |= ncclGroupStart();
        rc |= ncclSend(sb, 1024, ncclUint8, 1, comms[0], stream);
        rc |= ncclRecv(rb, 1024, ncclUint8, 1, comms[0], stream);
        rc |= ncclGroupEnd();
        rc |= cudaStreamSynchronize(stream);
    }
    rc |= cudaStreamSynchronize(stream);
    return rc != 0;
}
