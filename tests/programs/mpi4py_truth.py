"""mpi4py's ground truth: what a Python rank asks of MPI, counted next to each call.

Usage: python mpi4py_truth.py N OUT_PREFIX

Importing mpi4py initialises MPI (one MPI_Init_thread) with the library mpi4py's binary
wheel `dlopen`s then (the MPI of its environment), and mpi4py finalises it at exit (one
MPI_Finalize, after the truth is written). In between: N MPI_Allreduce of one double (8
bytes each; MPI_Allreduce_c where the library has it) and one MPI_Barrier. Writes
OUT_PREFIX.<rank>.json in mpi_truth's form, with the routines this program caused (mpi4py
may make calls of its own besides, which the test does not hold it to) and the library's
version string.
"""

import ctypes
import json
import os
import sys
from array import array

from mpi4py import MPI


def exports(symbol):
    """Whether the MPI library this process maps exports `symbol`."""
    with open("/proc/self/maps") as maps:
        paths = {
            line.split()[-1]
            for line in maps
            if "/libmpi" in line and line.split()[-1].startswith("/")
        }
    return any(hasattr(ctypes.CDLL(path), symbol) for path in paths)


n, prefix = int(sys.argv[1]), sys.argv[2]
comm = MPI.COMM_WORLD
x, y = array("d", [1.0]), array("d", [0.0])
for _ in range(n):
    comm.Allreduce(x, y, op=MPI.SUM)
comm.Barrier()
rank, size = comm.Get_rank(), comm.Get_size()

# mpi4py links the large-count forms weakly and calls them where the library has them
# (MPICH 5, Intel MPI 2021.14: MPI_Allreduce_c; Open MPI: MPI_Allreduce).
allreduce = "MPI_Allreduce_c" if exports("MPI_Allreduce_c") else "MPI_Allreduce"
assert y[0] == size, (y[0], size)
truth = {
    "rank": rank,
    "size": size,
    "pid": os.getpid(),
    "library": MPI.Get_library_version().splitlines()[0],
    "routines": {
        "MPI_Init_thread": {"calls": 1, "bytes": 0},
        allreduce: {"calls": n, "bytes": 8 * n},
        "MPI_Barrier": {"calls": 1, "bytes": 0},
    },
}
with open(f"{prefix}.{rank}.json", "w") as f:
    json.dump(truth, f)
# Its output: what it computed (the tests compare it with a run alone). One write, line
# and newline together: MPICH's launcher interleaves its ranks' output write by write.
sys.stdout.write(f"mpi4py_truth: rank {rank} of {size} reduced {y[0]}\n")
sys.stdout.flush()
