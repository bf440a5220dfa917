/* A process that loads the MPI library late, with dlopen, as Python's mpi4py does.
 *
 * Usage: mpi_dlopen LIBMPI READY_FILE GO_FILE N OUT_PREFIX [CYCLE_LIB K]
 *
 * Built without mpi.h and without linking MPI: it dlopens LIBMPI (an Open MPI libmpi.so.40,
 * e.g. a private copy that no profiler could have probed in advance), creates READY_FILE,
 * waits (polling, no MPI) for GO_FILE, then, as an MPI singleton, calls MPI_Init,
 * MPI_Comm_rank, MPI_Comm_size, N x MPI_Allreduce of one double, and writes
 * OUT_PREFIX.0.json (the same format as mpi_truth) before MPI_Finalize. READY_FILE and
 * GO_FILE "-": no file, no wait: the first MPI call follows the dlopen at once. With
 * CYCLE_LIB and K, it first loads and unloads CYCLE_LIB (dlopen, dlclose) K times. With
 * MPI_DLOPEN_AFTER_GO set in its environment, it waits first and dlopens LIBMPI after the
 * go, its first MPI call following at once (for a profiler attached before the load).
 * Unless told otherwise, Open MPI's session directory is kept under OUT_PREFIX.tmp: singletons
 * starting at once race to create the shared /tmp/ompi.HOST.UID ("mkdir ... File exists",
 * then orte_init fails). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int (*init_fn)(int *, char ***);
typedef int (*comm_int_fn)(void *, int *);
typedef int (*allreduce_fn)(const void *, void *, int, void *, void *, void *);
typedef int (*finalize_fn)(void);

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "mpi_dlopen: %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

/* RTLD_GLOBAL: Open MPI's components resolve libmpi's symbols through it. */
static void *load(const char *path) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "mpi_dlopen: %s\n", dlerror());
        exit(1);
    }
    return lib;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 8) {
        fprintf(stderr, "usage: %s LIBMPI READY_FILE GO_FILE N OUT_PREFIX [CYCLE_LIB K]\n",
                argv[0]);
        return 2;
    }
    long n = atol(argv[4]);
    for (long i = 0, k = argc == 8 ? atol(argv[7]) : 0; i < k; i++) {
        void *h = dlopen(argv[6], RTLD_NOW | RTLD_LOCAL);
        if (!h || dlclose(h) != 0) {
            fprintf(stderr, "mpi_dlopen: %s: %s\n", argv[6], dlerror());
            return 1;
        }
    }
    int after_go = getenv("MPI_DLOPEN_AFTER_GO") != NULL;
    void *lib = after_go ? NULL : load(argv[1]);
    if (strcmp(argv[2], "-") != 0) {
        FILE *ready = fopen(argv[2], "w");
        if (!ready) {
            perror(argv[2]);
            return 1;
        }
        fclose(ready);
    }
    struct stat st;
    struct timespec tick = {0, 10 * 1000 * 1000};
    while (strcmp(argv[3], "-") != 0 && stat(argv[3], &st) != 0)
        nanosleep(&tick, NULL);
    if (after_go)
        lib = load(argv[1]);

    char tmpdir[4096];
    snprintf(tmpdir, sizeof tmpdir, "%s.tmp", argv[5]);
    setenv("OMPI_MCA_orte_tmpdir_base", tmpdir, 0);

    /* Open MPI's predefined handles are the addresses of exported objects. */
    void *world = sym(lib, "ompi_mpi_comm_world");
    void *dbl = sym(lib, "ompi_mpi_double");
    void *sum = sym(lib, "ompi_mpi_op_sum");
    int rank = -1, size = -1;
    ((init_fn)sym(lib, "MPI_Init"))(&argc, &argv);
    ((comm_int_fn)sym(lib, "MPI_Comm_rank"))(world, &rank);
    ((comm_int_fn)sym(lib, "MPI_Comm_size"))(world, &size);
    allreduce_fn allreduce = (allreduce_fn)sym(lib, "MPI_Allreduce");
    double x = 1, y = 0;
    for (long i = 0; i < n; i++)
        allreduce(&x, &y, 1, dbl, sum, world);

    char path[4096];
    snprintf(path, sizeof path, "%s.%d.json", argv[5], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f,
            "{\"rank\":%d,\"size\":%d,\"pid\":%ld,\"routines\":{"
            "\"MPI_Init\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Comm_rank\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Comm_size\":{\"calls\":1,\"bytes\":0},"
            "\"MPI_Allreduce\":{\"calls\":%ld,\"bytes\":%ld}},"
            "\"comm_sizes\":{\"MPI_Allreduce\":[%d]}}\n",
            rank, size, (long)getpid(), n, 8 * n, size);
    fclose(f);
    ((finalize_fn)sym(lib, "MPI_Finalize"))();
    return 0;
}
