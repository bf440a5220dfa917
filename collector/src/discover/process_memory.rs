//! A process's memory (`/proc/PID/mem`), read so that no read holds its caller for long.
//!
//! A read of another process's memory faults its pages in, and the kernel does so without
//! the checks a file's own reader meets: a page of a file on a user's own FUSE mount
//! (`fusermount` needs no privilege), mapped by that user's process where commtap reads
//! (over Open MPI's selected component, a stack, a name a pointer leads to), holds the
//! reading thread until that file system answers, which its owner may never let happen.
//! Each read is therefore made by a reader thread while the caller waits at most
//! [`READ_WAIT`] (more for a long read); a read not back by then is given up, its thread
//! left to it, and the memory of that user's processes is not read again until it returns.
//! Reader threads left waiting are capped ([`MAX_STUCK`]): past that no memory is read at
//! all, and what needed it is left unknown, as for a process gone.

use std::{
    collections::BTreeMap,
    fs::File,
    os::unix::fs::FileExt,
    sync::{
        atomic::{AtomicU64, AtomicU8, Ordering},
        mpsc, Arc, Mutex,
    },
    time::Duration,
};

use super::process_dir::ProcessDir;

/// How long a read of a few pages may take before it is given up: far above what a read
/// of memory in RAM (microseconds) or on swap (milliseconds) takes.
pub const READ_WAIT: Duration = Duration::from_millis(250);
/// Reader threads left waiting on reads given up, at most; past it no memory is read.
pub const MAX_STUCK: usize = 16;
/// A reader thread's stack: it only copies into a buffer on the heap.
const READER_STACK: usize = 64 << 10;

/// Reads given up or refused since start (a hung page, or its user's or every reader
/// held up by one): what needed them is unknown, as for a process gone.
static NOT_READ: AtomicU64 = AtomicU64::new(0);

/// Reads of process memory given up or refused since start.
pub fn reads_not_made() -> u64 {
    NOT_READ.load(Ordering::Relaxed)
}

/// A process's memory, opened once through its `/proc` directory, and whom its reads are
/// charged to.
#[derive(Debug, Clone)]
pub struct ProcessMemory {
    mem: Arc<File>,
    /// The process's real user: a read of theirs left hanging stops the reading of the
    /// memory of that user's processes (not of everyone's).
    owner: u32,
}

impl ProcessMemory {
    /// `process`'s memory; `None` where it cannot be opened (gone, or a kernel thread).
    pub fn open(process: &ProcessDir) -> Option<ProcessMemory> {
        let owner = process.real_uid().ok()?;
        let mem = process.file("mem").ok()?;
        Some(ProcessMemory {
            mem: Arc::new(mem),
            owner,
        })
    }

    /// Fills `buf` from address `addr` of the process's memory; `false` where the memory
    /// is not there, or the read was given up or refused.
    pub fn read_exact_at(&self, buf: &mut [u8], addr: u64) -> bool {
        match self.read(addr, buf.len()) {
            Some(bytes) => {
                buf.copy_from_slice(&bytes);
                true
            }
            None => false,
        }
    }

    /// `len` bytes from `addr`, all of them or `None`.
    pub fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        if len == 0 {
            return Some(Vec::new());
        }
        let answer = read_through_reader(Job {
            mem: self.mem.clone(),
            addr,
            len,
            owner: self.owner,
            state: Arc::new(AtomicU8::new(PENDING)),
        });
        match answer {
            Answer::Read(bytes) => bytes,
            Answer::NotMade => {
                NOT_READ.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// A job's state, set once by whichever of its reader and its caller gets there first.
const PENDING: u8 = 0;
/// The reader finished it, and answers.
const DONE: u8 = 1;
/// Its caller stopped waiting: the reader answers nobody, and lets its owner go.
const GIVEN_UP: u8 = 2;

/// One read asked of the reader thread.
struct Job {
    mem: Arc<File>,
    addr: u64,
    len: usize,
    owner: u32,
    state: Arc<AtomicU8>,
}

/// What a caller gets.
enum Answer {
    /// The reader's read: the bytes, or `None` (memory not there).
    Read(Option<Vec<u8>>),
    /// Given up or refused.
    NotMade,
}

/// The way to the reader thread that takes the next read (none yet, or the last one left
/// hanging).
type Ask = mpsc::Sender<(Job, mpsc::SyncSender<Option<Vec<u8>>>)>;

/// The reader thread; held by a caller across its wait: one read at a time, so a read that
/// hangs is always the one waited on, and its owner the one held to account.
static READER: Mutex<Option<Ask>> = Mutex::new(None);
/// Reads left hanging, by their process's owner.
static STUCK: Mutex<BTreeMap<u32, usize>> = Mutex::new(BTreeMap::new());

/// Has `job` read and waits for it, at most [`READ_WAIT`] and a millisecond per MiB.
fn read_through_reader(job: Job) -> Answer {
    let mut reader = READER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    {
        let stuck = STUCK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if stuck.contains_key(&job.owner) || stuck.values().sum::<usize>() >= MAX_STUCK {
            return Answer::NotMade;
        }
    }
    let (owner, state) = (job.owner, job.state.clone());
    let wait = READ_WAIT + Duration::from_millis((job.len >> 20) as u64);
    let (answer, answered) = mpsc::sync_channel(1);
    let sent = match reader.as_ref() {
        Some(ask) => ask.send((job, answer)),
        None => Err(mpsc::SendError((job, answer))),
    };
    if let Err(mpsc::SendError(again)) = sent {
        // No thread yet, or it ended: a new one.
        let Some(ask) = start_reader() else {
            return Answer::NotMade;
        };
        if ask.send(again).is_err() {
            return Answer::NotMade;
        }
        *reader = Some(ask);
    }
    let waited = answered.recv_timeout(wait);
    if let Ok(bytes) = waited {
        return Answer::Read(bytes);
    }
    *reader = None;
    if waited == Err(mpsc::RecvTimeoutError::Disconnected) {
        // The thread ended without an answer (it could not allocate): none hangs.
        return Answer::NotMade;
    }
    if state
        .compare_exchange(PENDING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Finished as the wait ended: its answer is there (and its thread free again, but
        // a new one costs little).
        return answered.recv().map_or(Answer::NotMade, Answer::Read);
    }
    // Its thread is left to the read; the next read gets a thread of its own.
    *STUCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(owner)
        .or_default() += 1;
    tracing::warn!(
        owner,
        waited_ms = wait.as_millis() as u64,
        "a read of a process's memory did not return (a page of a file system that does not \
         answer?): given up, and that user's processes' memory is not read until it returns"
    );
    Answer::NotMade
}

/// Starts a reader thread: it reads what it is asked until its asker lets it go. One whose
/// read was given up lets that read's owner go when the read returns, and ends.
fn start_reader() -> Option<Ask> {
    let (ask, asked) = mpsc::channel::<(Job, mpsc::SyncSender<Option<Vec<u8>>>)>();
    std::thread::Builder::new()
        .name("commtap-memory".into())
        .stack_size(READER_STACK)
        .spawn(move || {
            while let Ok((job, answer)) = asked.recv() {
                let mut buf = vec![0u8; job.len];
                let read = job.mem.read_exact_at(&mut buf, job.addr).ok().map(|()| buf);
                if job
                    .state
                    .compare_exchange(PENDING, DONE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let _ = answer.send(read);
                    continue;
                }
                // Given up on: its owner's processes may be read again; this thread ends
                // (another took its place).
                let mut stuck = STUCK
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(n) = stuck.get_mut(&job.owner) {
                    *n -= 1;
                    if *n == 0 {
                        stuck.remove(&job.owner);
                    }
                }
                return;
            }
        })
        .map_err(|e| tracing::warn!(error = %e, "no thread to read processes' memory"))
        .ok()?;
    Some(ask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_reads_its_own_memory_through_the_reader() {
        let value: u64 = 0x0123_4567_89ab_cdef;
        let process = ProcessDir::open(std::process::id(), None).expect("own dir");
        let memory = ProcessMemory::open(&process).expect("own memory");
        let addr = std::ptr::addr_of!(value) as u64;
        let mut buf = [0u8; 8];
        assert!(memory.read_exact_at(&mut buf, addr));
        assert_eq!(u64::from_le_bytes(buf), value);
        // Not mapped: no bytes, and nothing left hanging.
        assert!(!memory.read_exact_at(&mut buf, 8));
        assert_eq!(memory.read(addr, 0), Some(Vec::new()));
    }
}
