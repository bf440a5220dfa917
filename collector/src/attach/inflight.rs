//! The MPI or NCCL call a running process is inside now: its threads' call state, read
//! from the task storage the probes keep anyway (a hung job: which call each rank waits
//! in, and since when; nothing the ranks pay).

use std::{
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
};

use collector_common::{
    routines::{Family, ROUTINES},
    CallState,
};

use super::Probes;

/// The threads whose call state one profile reads, at most, every rank's together (each a
/// pidfd and a map lookup, made while the session is locked).
pub const CALL_STATES_READ: usize = 16_384;

/// `PIDFD_THREAD` (Linux 6.9+): a pidfd of one thread, not only of a process's leader.
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// Set once the kernel refused a thread's pidfd (before Linux 6.9): leaders alone are read
/// from then on.
static NO_THREAD_PIDFDS: AtomicBool = AtomicBool::new(false);

/// A timed call in progress on one of a process's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InProgress {
    /// Its routine (an index into `ROUTINES`, within it).
    pub routine: u16,
    /// Monotonic ns at its entry.
    pub since_ns: u64,
    /// The thread inside it.
    pub tid: u32,
    /// The thread's stack pointer at its entry (where its return address is).
    pub entry_sp: u64,
}

impl Probes {
    /// The timed MPI or NCCL call one of `pid`'s threads is inside now, the one entered
    /// first where several are; `None` where none is. Reads at most `budget` threads and
    /// takes them from it; a process of more threads than `/proc` walks
    /// ([`discover::LIVE_THREADS_READ`](crate::discover::LIVE_THREADS_READ)), or a kernel
    /// without thread pidfds (before Linux 6.9), has its leader alone read. An untimed call
    /// (its routine's time sampled, not drawn) keeps no start, and its return is not seen:
    /// the threads whose last call was one go to `unseen.untimed`, with its tick count. The
    /// threads read that have entered no timed call since the probes were attached go to
    /// `unseen.threads`, and `unseen.whole` says whether every thread was read.
    pub fn call_in_progress(
        &self,
        pid: u32,
        budget: &mut usize,
        unseen: &mut Unseen,
    ) -> Option<InProgress> {
        let listed = if NO_THREAD_PIDFDS.load(Ordering::Relaxed) {
            None
        } else {
            crate::discover::thread_ids(pid)
        };
        unseen.whole = listed.is_some();
        let threads = listed.unwrap_or_else(|| vec![pid]);
        let take = threads.len().min(*budget);
        unseen.whole &= take == threads.len();
        *budget -= take;
        threads[..take]
            .iter()
            .filter_map(|&tid| match self.thread_call(pid, tid) {
                State::Stateless => {
                    unseen.threads.push(tid);
                    None
                }
                State::InCall(c) => Some(c),
                State::Untimed(c) => {
                    unseen.untimed.push(c);
                    None
                }
                State::Other => None,
            })
            .min_by_key(|c| c.since_ns)
    }

    /// Thread `tid`'s call in progress, where it is `pid`'s (its state names the process:
    /// a thread id given out again to another process's thread is not taken for it) and
    /// names a routine.
    fn thread_call(&self, pid: u32, tid: u32) -> State {
        let Some(fd) = thread_pidfd(pid, tid) else {
            return State::Other;
        };
        let read = || {
            super::multi::task_storage_value::<CallState>(self.task_state.as_fd(), fd.as_raw_fd())
                .map(|s| {
                    // Its last MPI or NCCL call, where that was untimed (a transport's
                    // operation made inside it since has taken `routine`).
                    let untimed = s
                        .untimed_parent
                        .checked_sub(1)
                        .map(|r| (r, s.untimed_since_jiffies));
                    (s.tgid, s.busy, s.start_ns, s.routine, untimed, s.entry_sp)
                })
        };
        // The thread writes its state as we copy it: a copy made across a call's entry can
        // pair the new call's `busy` with the last one's start. Two copies alike are not
        // torn (a call's fields change only at its entry and return).
        let Some(first) = read() else {
            return State::Stateless;
        };
        if read() != Some(first) {
            return State::Other;
        }
        let (tgid, busy, since_ns, routine, untimed, entry_sp) = first;
        let in_mpi = |r: u16| {
            ROUTINES
                .get(usize::from(r))
                .is_some_and(|r| matches!(r.family(), Family::Mpi | Family::Nccl))
        };
        // Its last call was counted untimed: inside it still, or past it (no return seen).
        if let Some((routine, since)) = untimed.filter(|u| tgid == pid && busy == 0 && u.1 != 0) {
            if in_mpi(routine) {
                return State::Untimed(InProgress {
                    routine,
                    since_ns: since,
                    tid,
                    entry_sp,
                });
            }
        }
        // A thread in no call whose last was no timed MPI or NCCL call (none at all, an
        // untimed one, or a transport's operation: made inside an MPI call entered before
        // the attach, say) may be inside a call no probe saw begin.
        let last_timed = since_ns != 0 && in_mpi(routine);
        if tgid == pid && busy == 0 && !last_timed {
            return State::Stateless;
        }
        if tgid == pid
            && busy == CallState::BUSY
            && since_ns != 0
            && ROUTINES.get(usize::from(routine)).is_some()
        {
            State::InCall(InProgress {
                routine,
                since_ns,
                tid,
                entry_sp,
            })
        } else {
            State::Other
        }
    }
}

/// The threads of a process whose calls no probe saw begin, as one read of its threads'
/// call states found them.
#[derive(Debug, Default)]
pub struct Unseen {
    /// Those in no call whose last was no timed MPI or NCCL call (or that made none since
    /// the probes were attached).
    pub threads: Vec<u32>,
    /// Whether every thread of the process was read (not its leader alone, nor past the
    /// read's budget).
    pub whole: bool,
    /// Those whose last call was counted untimed (its return not seen): inside it still,
    /// or past it. `since_ns` holds the kernel's tick count at its entry, not ns.
    pub untimed: Vec<InProgress>,
}

/// What a thread's call state says.
enum State {
    /// It is in no call, and its last was no timed MPI or NCCL call (or it made none).
    Stateless,
    /// It is inside a timed call.
    InCall(InProgress),
    /// Its last call was untimed (`since_ns`: jiffies at the entry).
    Untimed(InProgress),
    /// It is in no timed call (or its state could not be read whole).
    Other,
}

/// A pidfd of thread `tid` of process `pid`: of the thread itself (Linux 6.9+), else of the
/// process where `tid` is its leader.
fn thread_pidfd(pid: u32, tid: u32) -> Option<OwnedFd> {
    let open = |flags: libc::c_uint| {
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::pid_t, flags) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    };
    if !NO_THREAD_PIDFDS.load(Ordering::Relaxed) {
        match open(PIDFD_THREAD) {
            Ok(fd) => return Some(fd),
            // A thread that ended meanwhile is ESRCH; EINVAL is the flag refused.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                NO_THREAD_PIDFDS.store(true, Ordering::Relaxed);
            }
            Err(_) => return None,
        }
    }
    (tid == pid).then(|| open(0).ok()).flatten()
}
