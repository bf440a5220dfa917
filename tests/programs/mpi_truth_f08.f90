! mpi_truth_f08: Fortran ground-truth workload for commtap through the mpi_f08
! bindings, whose calls reach the C routines through more of the MPI's own code
! than the old bindings' (Open MPI: mpi_allreduce_f08_ calls the mpif.h
! binding's ompi_allreduce_f; MPICH: mpi_allreduce_f08ts_ calls a hidden
! MPIR_Allreduce_cdesc).
!
! Usage: mpi_truth_f08 OUT_PREFIX
!
! Calls MPI_Init, MPI_Comm_rank, MPI_Comm_size and MPI_Barrier from the main
! program (MAIN__) and 6 x MPI_Allreduce of 4 MPI_DOUBLE_PRECISION from the
! module procedure halo::exchange, then writes OUT_PREFIX.<rank>.json: the
! routines as mpi_truth_f's, and each call's site (its function, and its
! symbol where the two differ) as mpi_sites.c's.

! The halo exchange of a code's own module, as HPC codes keep them: its calls'
! sites are the module's procedure, halo::exchange (gfortran: __halo_MOD_exchange;
! public, so called, not inlined, at -O1).
module halo
  use mpi_f08
  implicit none
contains
  subroutine exchange(dsend, drecv)
    double precision, intent(in) :: dsend(4)
    double precision, intent(out) :: drecv(4)

    call MPI_Allreduce(dsend, drecv, 4, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  end subroutine exchange
end module halo

program mpi_truth_f08
  use mpi_f08
  use halo
  implicit none
  integer :: rank, nprocs, i, u, plen
  double precision :: dsend(4), drecv(4)
  character(len=4096) :: prefix
  character(len=4200) :: path
  character(len=16) :: rankstr

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs)
  if (command_argument_count() < 1) then
    if (rank == 0) write (0, '(A)') 'usage: mpi_truth_f08 OUT_PREFIX'
    call MPI_Abort(MPI_COMM_WORLD, 2)
  end if
  call get_command_argument(1, prefix, plen)

  do i = 1, 4
    dsend(i) = rank + 0.5d0 * i
  end do
  do i = 1, 6
    call exchange(dsend, drecv)
  end do
  call MPI_Barrier(MPI_COMM_WORLD)

  write (rankstr, '(I0)') rank
  path = prefix(1:plen) // '.' // trim(rankstr) // '.json'
  open (newunit=u, file=trim(path), status='replace', action='write')
  write (u, '(A,I0,A,I0,A,I0,A)', advance='no') '{"rank":', rank, &
       ',"size":', nprocs, ',"pid":', getpid(), ',"routines":{'
  write (u, '(A)', advance='no') '"MPI_Init":{"calls":1,"bytes":0},'
  write (u, '(A)', advance='no') '"MPI_Comm_rank":{"calls":1,"bytes":0},'
  write (u, '(A)', advance='no') '"MPI_Comm_size":{"calls":1,"bytes":0},'
  write (u, '(A,I0,A)', advance='no') '"MPI_Allreduce":{"calls":6,"bytes":', &
       6 * 4 * 8, '},'
  write (u, '(A)', advance='no') '"MPI_Barrier":{"calls":1,"bytes":0}},'
  write (u, '(A,I0,A,I0,A)', advance='no') '"comm_sizes":{"MPI_Allreduce":[', &
       nprocs, '],"MPI_Barrier":[', nprocs, ']},"main":"MAIN__","sites":['
  write (u, '(A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Init","calls":1,"bytes":0},'
  write (u, '(A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Comm_rank","calls":1,"bytes":0},'
  write (u, '(A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Comm_size","calls":1,"bytes":0},'
  write (u, '(A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Barrier","calls":1,"bytes":0},'
  write (u, '(A,I0,A)') &
       '{"function":"halo::exchange","symbol":"__halo_MOD_exchange",' // &
       '"routine":"MPI_Allreduce","calls":6,"bytes":', &
       6 * 4 * 8, '}]}'
  close (u)
  ! Its output: what it received (the tests compare it with a run alone).
  write (*, '(A,I0,A,I0,A,F0.3)') 'mpi_truth_f08: rank ', rank, ' of ', nprocs, &
       ' received ', sum(drecv)
  flush (6)

  call MPI_Finalize()
end program mpi_truth_f08
