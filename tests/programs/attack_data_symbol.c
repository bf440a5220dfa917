/*
 * A crafted "MPI library" whose MPI_Send is not code but data: a daemon that probes any
 * address a symbol names would write a breakpoint into it (here, into a variable whose
 * value the test then reads through the process's memory).
 */
volatile unsigned char MPI_Send[64] = {
    0x55, 0x48, 0x89, 0xe5, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
};

int MPI_Recv(void *buf, int count, long datatype, int source, int tag, long comm, void *status)
{
    (void)buf;
    (void)datatype;
    (void)source;
    (void)tag;
    (void)comm;
    (void)status;
    return count;
}
