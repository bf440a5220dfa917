/*
 * A root process that maps a root-owned library (argv[1]) and waits: the attack tests
 * compare its code in memory with the file, byte for byte (a uprobe shows as an int3).
 * Creates argv[2] once the library is mapped; runs until killed.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    close(open(argv[2], O_CREAT | O_WRONLY, 0644));
    for (;;)
        pause();
}
