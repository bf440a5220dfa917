/*
 * mpi_sites_cpp: mpi_sites built as C++ (its functions a class's, their symbols mangled),
 * for the test that call sites are named as C++ programmers read them.
 */
#include "mpi_sites.c"
