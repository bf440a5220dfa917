//! The MPI or NCCL call a running process is inside now: its threads' call state, read
//! from the task storage the probes keep anyway (a hung job: which call each rank waits
//! in, and since when; nothing the ranks pay).

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use collector_common::CallState;

use super::Probes;

/// Most threads of one process read: a process of more is read in part (its first ones,
/// as `/proc` lists them).
const MAX_THREADS: usize = 4096;

/// `PIDFD_THREAD` (Linux 6.9+): a pidfd of one thread, not only of a process's leader.
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// A timed call in progress on one of a process's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InProgress {
    /// Its routine (an index into `ROUTINES`).
    pub routine: u16,
    /// Monotonic ns at its entry.
    pub since_ns: u64,
}

impl Probes {
    /// The timed MPI or NCCL call one of `pid`'s threads is inside now, the one entered
    /// first where several are; `None` where none is (or the kernel cannot say: before
    /// Linux 6.9 only the leader thread is read). An untimed call (its routine's time
    /// sampled, not drawn) keeps no start and is not seen.
    pub fn call_in_progress(&self, pid: u32) -> Option<InProgress> {
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        threads
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .take(MAX_THREADS)
            .filter_map(|tid| self.thread_call(pid, tid))
            .min_by_key(|c| c.since_ns)
    }

    /// Thread `tid`'s call in progress, where it is `pid`'s (its state names the process:
    /// a thread id given out again to another process's thread is not taken for it).
    fn thread_call(&self, pid: u32, tid: u32) -> Option<InProgress> {
        let fd = thread_pidfd(pid, tid)?;
        let state =
            super::multi::task_storage_value::<CallState>(self.task_state.as_fd(), fd.as_raw_fd())?;
        (state.tgid == pid && state.busy == CallState::BUSY && state.start_ns != 0).then_some(
            InProgress {
                routine: state.routine,
                since_ns: state.start_ns,
            },
        )
    }
}

/// A pidfd of thread `tid` of process `pid`: of the thread itself (Linux 6.9+), else of the
/// process where `tid` is its leader.
fn thread_pidfd(pid: u32, tid: u32) -> Option<OwnedFd> {
    let open = |flags: libc::c_uint| {
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::pid_t, flags) };
        // SAFETY: a new descriptor we now own.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
    };
    open(PIDFD_THREAD).or_else(|| if tid == pid { open(0) } else { None })
}
