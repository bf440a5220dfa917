/*
 * A library that exports MPI_Send without being MPI. The attack tests build it twice: as
 * an unprivileged user's crafted `libmpich.so.12` (the daemon takes it for MPICH and
 * probes it) and as a root-owned victim library mapped by a root process, whose code must
 * never receive a probe whatever the user does with paths.
 */
volatile long attack_counter;

int MPI_Send(const void *buf, int count, long datatype, int dest, int tag, long comm)
{
    (void)buf;
    (void)datatype;
    (void)dest;
    (void)tag;
    (void)comm;
    attack_counter += count;
    return 0;
}

long attack_work(long n)
{
    for (long i = 0; i < n; i++)
        attack_counter += i;
    return attack_counter;
}
