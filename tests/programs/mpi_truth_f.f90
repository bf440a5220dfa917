! mpi_truth_f: small Fortran ground-truth workload for commtap (old "use mpi"
! bindings, not mpi_f08).
!
! Usage: mpi_truth_f OUT_PREFIX
!
! Calls MPI_INIT, MPI_COMM_RANK, MPI_COMM_SIZE, 5 x MPI_ALLREDUCE of
! 4 MPI_DOUBLE_PRECISION, 3 x MPI_BCAST of 10 MPI_INTEGER from root 0 and
! 2 x MPI_BARRIER, then writes OUT_PREFIX.<rank>.json (same shape as
! mpi_truth.c, and each call's site as mpi_sites.c's: the main program, MAIN__)
! before MPI_FINALIZE.  The profiler probes the C entry points (MPI_Init,
! MPI_Allreduce, ...), which the Fortran bindings call.
program mpi_truth_f
  use mpi
  implicit none
  integer :: ierr, rank, nprocs, i, u, plen
  double precision :: dsend(4), drecv(4)
  integer :: ibuf(10)
  character(len=4096) :: prefix
  character(len=4200) :: path
  character(len=16) :: rankstr

  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, rank, ierr)
  call MPI_COMM_SIZE(MPI_COMM_WORLD, nprocs, ierr)

  if (command_argument_count() < 1) then
    if (rank == 0) write (0, '(A)') 'usage: mpi_truth_f OUT_PREFIX'
    call MPI_ABORT(MPI_COMM_WORLD, 2, ierr)
  end if
  call get_command_argument(1, prefix, plen)

  do i = 1, 4
    dsend(i) = rank + 0.5d0 * i
  end do
  do i = 1, 10
    ibuf(i) = rank * 100 + i
  end do

  do i = 1, 5
    call MPI_ALLREDUCE(dsend, drecv, 4, MPI_DOUBLE_PRECISION, MPI_SUM, &
                       MPI_COMM_WORLD, ierr)
  end do
  do i = 1, 3
    call MPI_BCAST(ibuf, 10, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
  end do
  do i = 1, 2
    call MPI_BARRIER(MPI_COMM_WORLD, ierr)
  end do

  write (rankstr, '(I0)') rank
  path = prefix(1:plen) // '.' // trim(rankstr) // '.json'
  open (newunit=u, file=trim(path), status='replace', action='write')
  write (u, '(A,I0,A,I0,A,I0,A)', advance='no') '{"rank":', rank, &
       ',"size":', nprocs, ',"pid":', getpid(), ',"routines":{'
  write (u, '(A)', advance='no') '"MPI_Init":{"calls":1,"bytes":0},'
  write (u, '(A)', advance='no') '"MPI_Comm_rank":{"calls":1,"bytes":0},'
  write (u, '(A)', advance='no') '"MPI_Comm_size":{"calls":1,"bytes":0},'
  write (u, '(A,I0,A)', advance='no') '"MPI_Allreduce":{"calls":5,"bytes":', &
       5 * 4 * 8, '},'
  write (u, '(A,I0,A)', advance='no') '"MPI_Bcast":{"calls":3,"bytes":', &
       3 * 10 * 4, '},'
  write (u, '(A)', advance='no') '"MPI_Barrier":{"calls":2,"bytes":0}},'
  write (u, '(A,I0,A,I0,A,I0,A)', advance='no') '"comm_sizes":{"MPI_Allreduce":[', &
       nprocs, '],"MPI_Bcast":[', nprocs, '],"MPI_Barrier":[', nprocs, ']},'
  ! Every call's site: the main program.
  write (u, '(A)', advance='no') '"main":"MAIN__","sites":['
  write (u, '(A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Init","calls":1,"bytes":0},'
  write (u, '(A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Comm_rank","calls":1,"bytes":0},'
  write (u, '(A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Comm_size","calls":1,"bytes":0},'
  write (u, '(A,I0,A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Allreduce","calls":5,"bytes":', 5 * 4 * 8, '},'
  write (u, '(A,I0,A)', advance='no') &
       '{"function":"MAIN__","routine":"MPI_Bcast","calls":3,"bytes":', 3 * 10 * 4, '},'
  write (u, '(A)') '{"function":"MAIN__","routine":"MPI_Barrier","calls":2,"bytes":0}]}'
  close (u)
  ! Its output: what it received (the tests compare it with a run alone).
  write (*, '(A,I0,A,I0,A,F0.3,A,I0)') 'mpi_truth_f: rank ', rank, ' of ', nprocs, &
       ' received ', sum(drecv), ' and ', sum(ibuf)
  flush (6)

  call MPI_FINALIZE(ierr)
end program mpi_truth_f
