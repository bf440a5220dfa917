/*
 * A STAND-IN for libnccl.so.2, for tests only: it exports NCCL's entry points with NCCL's
 * signatures (tests/programs/nccl_abi.h) and keeps just enough state (size and rank per
 * communicator) for a test to create, split, query and destroy communicators, which the
 * real library refuses without a GPU. commtap finds it the way it finds NCCL (by its
 * symbols) and decodes it with the same rules; nothing in commtap knows it is a stand-in.
 * Collectives do nothing and succeed.
 */
#include "nccl_abi.h"
#include <stdio.h>
#include <stdlib.h>

#ifdef HIDDEN_NCCL
/* Built with -fvisibility=hidden: NCCL inside a library that exports none of its symbols
 * (a stripped build, or NCCL linked in privately). Only this entry point is visible. */
__attribute__((visibility("default"))) int standin_hidden_entry(void);
#endif
/* NCCL's banner, by which commtap recognises NCCL without symbols. */
const char ncclStandinBanner[] = "NCCL version 2.99.0+standin";

struct ncclComm {
    int nranks;
    int rank;
};

static ncclComm_t new_comm(int nranks, int rank)
{
    ncclComm_t c = calloc(1, sizeof *c);
    c->nranks = nranks;
    c->rank = rank;
    return c;
}

ncclResult_t ncclGetVersion(int *version) { *version = 23203; return 0; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    FILE *f = fopen("/dev/urandom", "r");
    if (!f || fread(id->internal, 1, sizeof id->internal, f) != sizeof id->internal)
        return 2;
    fclose(f);
    return 0;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    (void)id;
    *comm = new_comm(nranks, rank);
    return 0;
}

ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId *commIds, void *config)
{
    (void)nId;
    (void)commIds;
    (void)config;
    *newcomm = new_comm(nranks, myrank);
    return 0;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    (void)devlist;
    for (int i = 0; i < ndev; i++)
        comms[i] = new_comm(ndev, i);
    return 0;
}

/* Every caller of the test passes the same color: the new communicator has all ranks. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           void *config)
{
    (void)key;
    (void)config;
    *newcomm = color == NCCL_SPLIT_NOCOLOR ? NULL : new_comm(comm->nranks, comm->rank);
    return 0;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { free(comm); return 0; }
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { *count = comm->nranks; return 0; }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { *rank = comm->rank; return 0; }

#define OK(comm) ((comm) ? 0 : 4)
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t st)
{ (void)s; (void)r; (void)n; (void)t; (void)op; (void)st; return OK(comm); }
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t st)
{ (void)s; (void)r; (void)n; (void)t; (void)root; (void)st; return OK(comm); }
ncclResult_t ncclBcast(void *b, size_t n, ncclDataType_t t, int root, ncclComm_t comm,
                       cudaStream_t st)
{ return ncclBroadcast(b, b, n, t, root, comm, st); }
ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t st)
{ (void)s; (void)r; (void)n; (void)t; (void)op; (void)root; (void)st; return OK(comm); }
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t st)
{ (void)s; (void)r; (void)n; (void)t; (void)st; return OK(comm); }
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t st)
{ (void)s; (void)r; (void)n; (void)t; (void)op; (void)st; return OK(comm); }
ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t comm,
                          cudaStream_t st)
{ (void)s; (void)r; (void)n; (void)t; (void)st; return OK(comm); }
ncclResult_t ncclGather(const void *s, void *r, size_t n, ncclDataType_t t, int root,
                        ncclComm_t comm, cudaStream_t st)
{ (void)s; (void)r; (void)n; (void)t; (void)root; (void)st; return OK(comm); }
ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t st)
{ (void)s; (void)n; (void)t; (void)peer; (void)st; return OK(comm); }
ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t st)
{ (void)r; (void)n; (void)t; (void)peer; (void)st; return OK(comm); }
ncclResult_t ncclGroupStart(void) { return 0; }
ncclResult_t ncclGroupEnd(void) { return 0; }

#ifdef HIDDEN_NCCL
int standin_hidden_entry(void)
{
    ncclComm_t c;
    ncclCommInitAll(&c, 1, NULL);
    return ncclAllReduce(NULL, NULL, 1, ncclFloat32, ncclSum, c, NULL) + (ncclStandinBanner[0] != 'N');
}
#endif
