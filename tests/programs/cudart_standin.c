/*
 * A STAND-IN for the CUDA runtime (libcudart), for tests only: there is no GPU here. Its
 * cudaStreamSynchronize waits 1 ms, standing for the GPU finishing the operations enqueued
 * before it; commtap probes it as it probes the real runtime's (by its exported symbol).
 */
#include <errno.h>
#include <time.h>

int cudaStreamSynchronize(void *stream)
{
    (void)stream;
    struct timespec ts = {0, 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    return 0;
}

int cudaDeviceSynchronize(void) { return 0; }
