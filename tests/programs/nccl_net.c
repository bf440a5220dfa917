/*
 * nccl_net: NCCL's built-in network transports (NET/Socket, NET/IB) as NCCL's proxy thread
 * drives them, with STAND-IN transport functions: local functions under the mangled names
 * and NCCL 2.19+ signatures of ncclNetSocketIsend/Irecv and ncclIbIsend/Irecv, called
 * through a table as NCCL calls its ncclNet_t. (The real ones run only inside a GPU
 * communicator; README "NCCL network transport" says how they were checked on a GPU.)
 * Linked with nccl_standin.c, which makes the executable an NCCL one.
 *
 * Usage: nccl_net READY_FILE GO_FILE [PLUGIN]
 *
 * With PLUGIN (a net plugin exporting ncclNetPlugin_v10, or the table NET_PLUGIN_TABLE
 * names, e.g. nccl_net_plugin.c), loaded
 * with dlopen before READY_FILE, also through the plugin's table:
 *    40 x isend of 8192 B, posted;                 5 x isend not posted
 *    30 x irecv n=2 of {100, 200} B, posted
 *
 *  Counted, once GO_FILE exists, all on a second thread (as NCCL's proxy thread):
 *   100 x Socket isend of 4096 B, posted;        25 x Socket isend not posted
 *    60 x Socket irecv n=1 of 65536 B, posted;    10 x Socket irecv not posted
 *    30 x IB isend of 1 MiB, posted
 *    20 x IB irecv n=3 of {1000, 2000, 3000} B, posted
 *     5 x IB irecv n=9 (more than a transport groups), posted: bytes undecoded
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include "ready_go.h"

typedef int ncclResult_t;

static int request_slot;

/* Posts unless the caller asked for "not ready" through the tag (< 0), like a transport
 * whose connection is not ready: success, and *request left NULL. */
static ncclResult_t post(int not_ready, void **request)
{
    *request = not_ready ? NULL : &request_slot;
    return 0;
}

__attribute__((noinline)) static ncclResult_t sock_isend(void *comm, void *data, size_t size,
                                                         int tag, void *mh, void *ph,
                                                         void **request)
    __asm__("_Z18ncclNetSocketIsendPvS_miS_S_PS_");
__attribute__((noinline)) static ncclResult_t sock_isend(void *comm, void *data, size_t size,
                                                         int tag, void *mh, void *ph,
                                                         void **request)
{
    (void)comm, (void)data, (void)size, (void)mh, (void)ph;
    return post(tag < 0, request);
}

__attribute__((noinline)) static ncclResult_t sock_irecv(void *comm, int n, void **data,
                                                         size_t *sizes, int *tags,
                                                         void **mh, void **ph,
                                                         void **request)
    __asm__("_Z18ncclNetSocketIrecvPviPS_PmPiS0_S0_S0_");
__attribute__((noinline)) static ncclResult_t sock_irecv(void *comm, int n, void **data,
                                                         size_t *sizes, int *tags,
                                                         void **mh, void **ph,
                                                         void **request)
{
    (void)comm, (void)n, (void)data, (void)sizes, (void)mh, (void)ph;
    return post(tags[0] < 0, request);
}

__attribute__((noinline)) static ncclResult_t ib_isend(void *comm, void *data, size_t size,
                                                       int tag, void *mh, void *ph,
                                                       void **request)
    __asm__("_Z11ncclIbIsendPvS_miS_S_PS_");
__attribute__((noinline)) static ncclResult_t ib_isend(void *comm, void *data, size_t size,
                                                       int tag, void *mh, void *ph,
                                                       void **request)
{
    (void)comm, (void)data, (void)size, (void)mh, (void)ph;
    return post(tag < 0, request);
}

__attribute__((noinline)) static ncclResult_t ib_irecv(void *comm, int n, void **data,
                                                       size_t *sizes, int *tags, void **mh,
                                                       void **ph, void **request)
    __asm__("_Z11ncclIbIrecvPviPS_PmPiS0_S0_S0_");
__attribute__((noinline)) static ncclResult_t ib_irecv(void *comm, int n, void **data,
                                                       size_t *sizes, int *tags, void **mh,
                                                       void **ph, void **request)
{
    (void)comm, (void)n, (void)data, (void)sizes, (void)mh, (void)ph;
    return post(tags[0] < 0, request);
}

/* The part of ncclNet_t the proxy uses here. */
struct net {
    ncclResult_t (*isend)(void *, void *, size_t, int, void *, void *, void **);
    ncclResult_t (*irecv)(void *, int, void **, size_t *, int *, void **, void **, void **);
};
static struct net *volatile socket_net = &(struct net){sock_isend, sock_irecv};
static struct net *volatile ib_net = &(struct net){ib_isend, ib_irecv};
/* isend and irecv of the plugin's ncclNet_v10_t (slots 10 and 11), if one was loaded. */
static struct net *volatile plugin_net;

static char buf[1 << 20];

static void sends(struct net *net, int n, size_t size, int tag)
{
    void *request;
    for (int i = 0; i < n; i++)
        if (net->isend(NULL, buf, size, tag, NULL, NULL, &request) != 0)
            fprintf(stderr, "isend failed\n");
}

static void recvs(struct net *net, int count, int n, size_t *sizes, int tag)
{
    void *data[16], *mh[16], *ph[16], *request;
    int tags[16];
    for (int j = 0; j < n; j++)
        data[j] = buf, tags[j] = tag, mh[j] = ph[j] = NULL;
    for (int i = 0; i < count; i++)
        if (net->irecv(NULL, n, data, sizes, tags, mh, ph, &request) != 0)
            fprintf(stderr, "irecv failed\n");
}

static void *proxy(void *arg)
{
    (void)arg;
    size_t one[1] = {65536}, three[3] = {1000, 2000, 3000};
    size_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    sends(socket_net, 100, 4096, 7);
    sends(socket_net, 25, 4096, -1);
    recvs(socket_net, 60, 1, one, 7);
    recvs(socket_net, 10, 1, one, -1);
    sends(ib_net, 30, 1 << 20, 7);
    recvs(ib_net, 20, 3, three, 7);
    recvs(ib_net, 5, 9, nine, 7);
    if (plugin_net) {
        size_t two[2] = {100, 200};
        sends(plugin_net, 40, 8192, 7);
        sends(plugin_net, 5, 8192, -1);
        recvs(plugin_net, 30, 2, two, 7);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s READY_FILE GO_FILE [PLUGIN]\n", argv[0]);
        return 2;
    }
    if (argc == 4) {
        void *lib = dlopen(argv[3], RTLD_NOW);
        const char *name = getenv("NET_PLUGIN_TABLE");
        void **table = lib ? dlsym(lib, name ? name : "ncclNetPlugin_v10") : NULL;
        if (!table) {
            fprintf(stderr, "%s: %s\n", argv[3], dlerror());
            return 1;
        }
        plugin_net = (struct net *)(table + 10);
    }
    FILE *ready = fopen(argv[1], "w");
    if (!ready || fclose(ready) != 0)
        return 1;
    wait_for_file(argv[2]);
    pthread_t t;
    if (pthread_create(&t, NULL, proxy, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 1;
    return 0;
}
