/*
 * The unprivileged side of the attack on call-site naming through line tables: a program
 * whose own `.debug_line` a test replaces with a hostile one (hostile_dwarf.py), run as
 * nobody beside a daemon counting call sites, which reads the program's symbols and line
 * tables to name its call.
 *
 *   attack_dwarf LIB READY GO DONE   maps LIB (dlopen), creates READY, waits for GO (the
 *                                    daemon has probed LIB), calls LIB's MPI_Send once
 *                                    (a call site in main), creates DONE, and runs until
 *                                    killed
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include "ready_go.h"

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    int (*send)(const void *, int, long, int, int, long) =
        (int (*)(const void *, int, long, int, int, long))dlsym(lib, "MPI_Send");
    if (!send)
        return 1;
    if (create_file(argv[2]) != 0)
        return 1;
    wait_for_file(argv[3]);
    send(NULL, 8, 0, 0, 0, 0);
    if (create_file(argv[4]) != 0)
        return 1;
    for (;;)
        pause();
}
