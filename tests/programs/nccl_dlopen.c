/*
 * nccl_dlopen: loads the real libnccl.so.2 late, with dlopen from the wheel's directory
 * (as PyTorch loads the NCCL of its `nvidia-nccl-cu13` wheel), and calls it at once.
 *
 * Usage: nccl_dlopen LIBNCCL N TRUTH_FILE [READY_FILE GO_FILE]
 *
 * With READY_FILE and GO_FILE, it first creates READY_FILE and waits for GO_FILE, loading
 * nothing before (for a profiler attached before the load), or, with LOAD_BEFORE_READY set
 * in its environment, loading NCCL first (a rank running before its profiler). Right after dlopen returns, N x ncclAllReduce(1024 x Float32, 4096 bytes) with a NULL
 * communicator: each fails fast (ncclInvalidArgument) after the probes have seen its
 * arguments, as in nccl_calls. Then writes TRUTH_FILE: {"pid", "routines":
 * {"ncclAllReduce": {calls, bytes}}}.
 */
#include "nccl_abi.h"
#include "ready_go.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef ncclResult_t (*allreduce_fn)(const void *, void *, size_t, ncclDataType_t,
                                     ncclRedOp_t, ncclComm_t, cudaStream_t);

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s LIBNCCL N TRUTH_FILE [READY_FILE GO_FILE]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[2]);
    void *lib = NULL;
    if (getenv("LOAD_BEFORE_READY") != NULL && !(lib = dlopen(argv[1], RTLD_NOW))) {
        fprintf(stderr, "nccl_dlopen: %s\n", dlerror());
        return 1;
    }
    if (argc == 6) {
        FILE *ready = fopen(argv[4], "w");
        if (!ready || fclose(ready) != 0) {
            perror(argv[4]);
            return 1;
        }
        wait_for_file(argv[5]);
    }
    if (!lib && !(lib = dlopen(argv[1], RTLD_NOW))) {
        fprintf(stderr, "nccl_dlopen: %s\n", dlerror());
        return 1;
    }
    allreduce_fn allreduce = (allreduce_fn)dlsym(lib, "ncclAllReduce");
    if (!allreduce) {
        fprintf(stderr, "nccl_dlopen: %s\n", dlerror());
        return 1;
    }
    static char sb[4096], rb[4096];
    for (long i = 0; i < n; i++)
        allreduce(sb, rb, 1024, ncclFloat32, ncclSum, NULL, NULL);

    FILE *f = fopen(argv[3], "w");
    if (!f) {
        perror(argv[3]);
        return 1;
    }
    fprintf(f, "{\"pid\": %d, \"routines\": {\"ncclAllReduce\": {\"calls\": %ld, \"bytes\": %ld}}}\n",
            (int)getpid(), n, 4096 * n);
    return fclose(f) == 0 ? 0 : 1;
}
