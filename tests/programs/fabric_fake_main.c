/* Maps fabric_fake.c's library, creates READY_FILE, then waits to be killed. */
#include <stdio.h>
#include <unistd.h>

int fi_getinfo(void);

int main(int argc, char **argv)
{
    if (argc != 2 || fi_getinfo() == 0)
        return 2;
    FILE *f = fopen(argv[1], "w");
    if (!f || fclose(f) != 0)
        return 1;
    for (;;)
        pause();
}
