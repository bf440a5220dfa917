/*
 * A STAND-IN external NCCL net plugin (what aws-ofi-nccl is, as libnccl-net.so), for tests
 * only: it exports an `ncclNetPlugin_v10` table (or the one NET_TABLE names) named
 * "Standin" whose isend/irecv (slots 10 and 11) post nothing anywhere; like a real transport, a call whose tag is negative finds
 * it "not ready" and returns no request. Every other slot fails. nccl_net.c loads it with
 * dlopen and calls through the table, as NCCL's proxy thread does.
 */
#include <stddef.h>

typedef int ncclResult_t;

static int request_slot;

static ncclResult_t isend(void *comm, void *data, size_t size, int tag, void *mh, void *ph,
                          void **request)
{
    (void)comm, (void)data, (void)size, (void)mh, (void)ph;
    *request = tag < 0 ? NULL : &request_slot;
    return 0;
}

static ncclResult_t irecv(void *comm, int n, void **data, size_t *sizes, int *tags, void **mh,
                          void **ph, void **request)
{
    (void)comm, (void)n, (void)data, (void)sizes, (void)mh, (void)ph;
    *request = tags[0] < 0 ? NULL : &request_slot;
    return 0;
}

static ncclResult_t unsupported(void)
{
    return 3; /* ncclInternalError */
}

/* ncclNet_v10_t's layout: name, nine functions, isend, irecv, then nine more. */
struct net_v10 {
    const char *name;
    ncclResult_t (*before[9])(void);
    ncclResult_t (*isend)(void *, void *, size_t, int, void *, void *, void **);
    ncclResult_t (*irecv)(void *, int, void **, size_t *, int *, void **, void **, void **);
    ncclResult_t (*after[9])(void);
};

/* Built with -DNET_TABLE=ncclNet_v5: a plugin of an older table only (the layout kept). */
#ifndef NET_TABLE
#define NET_TABLE ncclNetPlugin_v10
#endif

const struct net_v10 NET_TABLE = {
    "Standin",
    {unsupported, unsupported, unsupported, unsupported, unsupported, unsupported, unsupported,
     unsupported, unsupported},
    isend,
    irecv,
    {unsupported, unsupported, unsupported, unsupported, unsupported, unsupported, unsupported,
     unsupported, unsupported},
};
