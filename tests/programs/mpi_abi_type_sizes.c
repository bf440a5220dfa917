/* Prints what the MPI library says of each predefined datatype of the MPI-5 standard ABI
 * (mpi_abi.h): one line "NAME VALUE SIZE" each, SIZE being MPI_Type_size's answer (-1
 * where the library refuses the type, a Fortran type in a build without Fortran, say).
 * Built with mpicc_abi; commtap's own table of their sizes is checked against it. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#define T(name) show(#name, name)

static void show(const char *name, MPI_Datatype t)
{
    int size = -1;
    if (MPI_Type_size(t, &size) != MPI_SUCCESS)
        size = -1;
    printf("%s %#lx %d\n", name, (unsigned long)(uintptr_t)t, size);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    T(MPI_AINT); T(MPI_COUNT); T(MPI_OFFSET); T(MPI_PACKED); T(MPI_SHORT); T(MPI_INT);
    T(MPI_LONG); T(MPI_LONG_LONG); T(MPI_UNSIGNED_SHORT); T(MPI_UNSIGNED);
    T(MPI_UNSIGNED_LONG); T(MPI_UNSIGNED_LONG_LONG); T(MPI_FLOAT); T(MPI_C_FLOAT_COMPLEX);
    T(MPI_CXX_FLOAT_COMPLEX); T(MPI_DOUBLE); T(MPI_C_DOUBLE_COMPLEX);
    T(MPI_CXX_DOUBLE_COMPLEX); T(MPI_LOGICAL); T(MPI_INTEGER); T(MPI_REAL); T(MPI_COMPLEX);
    T(MPI_DOUBLE_PRECISION); T(MPI_DOUBLE_COMPLEX); T(MPI_CHARACTER); T(MPI_LONG_DOUBLE);
    T(MPI_C_LONG_DOUBLE_COMPLEX); T(MPI_CXX_LONG_DOUBLE_COMPLEX); T(MPI_FLOAT_INT);
    T(MPI_DOUBLE_INT); T(MPI_LONG_INT); T(MPI_2INT); T(MPI_SHORT_INT);
    T(MPI_LONG_DOUBLE_INT); T(MPI_2REAL); T(MPI_2DOUBLE_PRECISION); T(MPI_2INTEGER);
    T(MPI_C_BOOL); T(MPI_CXX_BOOL); T(MPI_WCHAR); T(MPI_INT8_T); T(MPI_UINT8_T);
    T(MPI_CHAR); T(MPI_SIGNED_CHAR); T(MPI_UNSIGNED_CHAR); T(MPI_BYTE); T(MPI_INT16_T);
    T(MPI_UINT16_T); T(MPI_INT32_T); T(MPI_UINT32_T); T(MPI_INT64_T); T(MPI_UINT64_T);
    T(MPI_LOGICAL1); T(MPI_INTEGER1); T(MPI_LOGICAL2); T(MPI_INTEGER2); T(MPI_REAL2);
    T(MPI_LOGICAL4); T(MPI_INTEGER4); T(MPI_REAL4); T(MPI_COMPLEX4); T(MPI_LOGICAL8);
    T(MPI_INTEGER8); T(MPI_REAL8); T(MPI_COMPLEX8); T(MPI_LOGICAL16); T(MPI_INTEGER16);
    T(MPI_REAL16); T(MPI_COMPLEX16); T(MPI_COMPLEX32);
    MPI_Finalize();
    return 0;
}
