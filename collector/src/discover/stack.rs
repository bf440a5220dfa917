//! What a thread's stack holds now: its user registers and its memory, for unwinding
//! (`symbols::unwind`) to find the MPI call a rank entered before commtap attached (a hung
//! job attached to late: no probe saw that call begin).
//!
//! A thread blocked in the kernel has its registers in `/proc/PID/task/TID/syscall`, and
//! its stack does not move while it sleeps. A running one (MPI ranks busy-poll while they
//! wait) is sampled once by a perf event bound to it, which copies its registers and the
//! top of its stack at one instant (read later, the stack would have moved on). Memory is
//! read through `/proc/PID/mem`, of the process's directory opened once (`ProcessDir`).

use std::{
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use super::{process_dir::ProcessDir, process_memory::ProcessMemory};

/// Bytes of a running thread's stack a sample copies (above its stack pointer): the
/// frames of the MPI library's progress loop; the frames beyond are the caller's, which
/// do not change while it waits inside the call, and are read from memory.
const SAMPLED_STACK: u32 = 8 << 10;
/// Most threads of a process sampled at once (each a perf event and its 20 KiB ring, in
/// locked memory).
pub const MAX_SAMPLED: usize = 64;

/// A thread's user registers, as unwinding needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registers {
    /// Instruction pointer.
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer (`rbp`), where known (`/proc` does not give a blocked thread's).
    pub bp: Option<u64>,
}

/// A thread's registers and a way to read its stack.
#[derive(Debug)]
pub struct ThreadStack {
    /// Its process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// Its registers when it was looked at.
    pub regs: Registers,
    /// Its stack from `regs.sp` up, copied with the registers (a running thread's); empty
    /// for a blocked thread, whose stack is read from memory.
    copied: Vec<u8>,
    /// Its process's memory (`/proc/PID/mem`: the daemon's unit refuses it
    /// `process_vm_readv`).
    mem: Option<ProcessMemory>,
    /// The last stretch of its stack read from memory, and where it starts: a read a
    /// window at a time (each through the reader thread, `ProcessMemory`), not a word.
    window: std::cell::RefCell<(u64, Vec<u8>)>,
    /// The addresses of its stack that may be read: from its stack pointer to the end of
    /// the anonymous mapping that holds it (a stack pointer in a file's mapping, which a
    /// read could wait on behind a hung file system, is not read at all).
    readable: (u64, u64),
    /// Reads of its memory left (a stack made to send unwinding far costs a bounded number
    /// of system calls).
    reads_left: std::cell::Cell<u32>,
    /// The return addresses the kernel replaced on its stack with its return-probe
    /// trampoline (the calls the probes saw begin), read in their place.
    returns: Vec<collector_common::ReturnSlot>,
    /// The trampoline's mapping (`[uprobes]`): only a word that points into it is read as
    /// the return address the kernel keeps for its slot.
    trampoline: Option<(u64, u64)>,
}

/// Reads of a thread's memory one unwinding may make.
const MAX_READS: u32 = 4096;
/// Bytes of a stack read at once (up to the end of its mapping): unwinding reads upward.
const READ_WINDOW: u64 = 4096;

impl ThreadStack {
    /// The 8 bytes at `addr` of the thread's stack, from the copy made with its registers
    /// where it holds them; a return address the kernel's return probe moved off the
    /// stack, read back.
    pub fn read_u64(&self, addr: u64) -> Option<u64> {
        let word = self.read_word(addr)?;
        // The kernel's trampoline in a return address's place: the address it keeps for
        // that slot (none where it keeps none: not a return address worth guessing).
        match self.trampoline {
            Some((lo, hi)) if (lo..hi).contains(&word) => {
                self.returns.iter().find(|r| r.slot == addr).map(|r| r.to)
            }
            _ => Some(word),
        }
    }

    /// The word at `addr` of the thread's stack as it is.
    fn read_word(&self, addr: u64) -> Option<u64> {
        let off = addr.checked_sub(self.regs.sp)?;
        if let Some(b) = usize::try_from(off)
            .ok()
            .and_then(|o| self.copied.get(o..o.checked_add(8)?))
        {
            return Some(u64::from_le_bytes(b.try_into().ok()?));
        }
        let (lo, hi) = self.readable;
        if addr < lo || addr.checked_add(8)? > hi {
            return None;
        }
        let in_window = |w: &(u64, Vec<u8>)| {
            let o = usize::try_from(addr.checked_sub(w.0)?).ok()?;
            Some(u64::from_le_bytes(
                w.1.get(o..o.checked_add(8)?)?.try_into().ok()?,
            ))
        };
        if let Some(word) = in_window(&self.window.borrow()) {
            return Some(word);
        }
        let left = self.reads_left.get().checked_sub(1)?;
        self.reads_left.set(left);
        let len = usize::try_from((hi - addr).min(READ_WINDOW)).ok()?;
        let bytes = self.mem.as_ref()?.read(addr, len)?;
        let mut window = self.window.borrow_mut();
        *window = (addr, bytes);
        in_window(&window)
    }
}

/// Whether `pid`'s thread `tid` has left the probed call it entered with its stack
/// pointer at `entry_sp` without returning (a `longjmp` out of an error handler, a C++
/// exception), by the test the probes make when the thread enters its next call
/// (`probe::in_progress`): its stack pointer now is above that call's return address, or
/// the slot of that address no longer holds the kernel's return-probe trampoline (the
/// stack written over since). Its stack pointer is the one its last entry into the kernel
/// saved (a blocked thread's now; a running one's a tick ago at most), read by the task
/// iterator `registers`. `None` where it cannot be told: no iterator, the thread gone, the
/// slot not in an anonymous mapping (a read could wait behind a file system), no
/// trampoline in the process.
pub fn left_call(
    process: &ProcessDir,
    tid: u32,
    entry_sp: u64,
    registers: Option<BorrowedFd<'_>>,
) -> Option<bool> {
    let regs = thread_registers_of(process, registers?, tid)?;
    // Equal is inside: the registers saved when the kernel trapped the call's entry.
    if regs.sp > entry_sp {
        return Some(true);
    }
    let maps = process.maps().ok()?;
    let end = stack_end(&maps, entry_sp)?;
    if entry_sp.checked_add(8)? > end {
        return None;
    }
    let (lo, hi) = super::maps_lines(&maps)
        .find(|m| m.path == "[uprobes]")
        .map(|m| (m.lo, m.hi))?;
    // Anonymous when the list was read; a file mapped there since is the reader's to wait
    // on.
    let mut word = [0u8; 8];
    if !ProcessMemory::open(process)?.read_exact_at(&mut word, entry_sp) {
        return None;
    }
    Some(!(lo..hi).contains(&u64::from_le_bytes(word)))
}

/// Thread `tid`'s registers, read by the task iterator `registers`, where it is a thread
/// of `process` before and after (the iterator finds a thread by its id alone, which is
/// given out again once it ends).
fn thread_registers_of(
    process: &ProcessDir,
    registers: BorrowedFd<'_>,
    tid: u32,
) -> Option<collector_common::UserRegisters> {
    if !process.has_thread(tid) {
        return None;
    }
    let regs = crate::attach::thread_registers(registers, tid).ok()??;
    process.has_thread(tid).then_some(regs)
}

/// The end of the anonymous mapping of `maps` (a stack: a thread's, or the process's
/// `[stack]`) that holds `sp`; `None` where a file's mapping, or none, holds it.
fn stack_end(maps: &str, sp: u64) -> Option<u64> {
    super::maps_lines(maps)
        .find(|m| m.lo <= sp && sp < m.hi)
        .filter(|m| m.inode == 0 && (m.path.is_empty() || m.path.starts_with("[stack")))
        .map(|m| m.hi)
}

/// What `/proc/PID/task/TID/syscall` says of a thread.
#[derive(Debug, PartialEq, Eq)]
enum Syscall {
    /// Blocked in the kernel, its user stack and instruction pointers.
    Blocked { sp: u64, ip: u64 },
    /// On a CPU (or about to be): its registers change.
    Running,
}

/// Parses `/proc/PID/task/TID/syscall`: `running`, or `NR [6 args] SP PC` (`-1 SP PC` for a
/// thread blocked outside a system call).
fn parse_syscall(text: &str) -> Option<Syscall> {
    let text = text.trim();
    if text == "running" {
        return Some(Syscall::Running);
    }
    let fields: Vec<&str> = text.split_whitespace().collect();
    if !(fields.len() == 9 || fields.len() == 3 && fields[0] == "-1") {
        return None;
    }
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    Some(Syscall::Blocked {
        sp: hex(fields[fields.len() - 2])?,
        ip: hex(fields[fields.len() - 1])?,
    })
}

fn syscall_of(process: &ProcessDir, tid: u32) -> Option<Syscall> {
    parse_syscall(&process.thread_syscall(tid)?)
}

/// The stacks of `pid`'s threads `tids` (at most [`MAX_SAMPLED`] of those running), as far
/// as they could be read: a running thread not sampled within `wait` (not given a CPU) is
/// looked at once more, and left out if it still runs. A blocked thread's frame pointer is
/// read by the task iterator `registers` (`multi::thread_registers`), where there is one.
pub fn stacks(
    process: &ProcessDir,
    tids: &[u32],
    wait: Duration,
    registers: Option<BorrowedFd<'_>>,
) -> Vec<ThreadStack> {
    let pid = process.pid();
    let mem = ProcessMemory::open(process);
    let maps = process.maps().unwrap_or_default();
    let trampoline = super::maps_lines(&maps)
        .find(|m| m.path == "[uprobes]")
        .map(|m| (m.lo, m.hi));
    // Read twice: a thread that entered or left a probed call meanwhile (its list of
    // probed returns changing under the read) is not taken at its word.
    let from_kernel = |tid| {
        let prog = registers?;
        let first = thread_registers_of(process, prog, tid)?;
        let again = thread_registers_of(process, prog, tid)?;
        (first.thread_state() == again.thread_state()).then_some(first)
    };
    let returns_of = |k: Option<&collector_common::UserRegisters>| {
        k.map(|k| {
            let n = usize::try_from(k.returns_n)
                .unwrap_or(0)
                .min(k.returns.len());
            k.returns[..n].to_vec()
        })
        .unwrap_or_default()
    };
    let stack = |tid, regs: Registers, copied, returns| ThreadStack {
        pid,
        tid,
        regs,
        copied,
        mem: mem.clone(),
        window: Default::default(),
        readable: (regs.sp, stack_end(&maps, regs.sp).unwrap_or(0)),
        reads_left: MAX_READS.into(),
        returns,
        trampoline,
    };
    // A blocked thread's registers: the iterator's where it agrees with `/proc` (the
    // thread has not moved between the two), else those of `/proc`, without `rbp`.
    let blocked = |tid, sp, ip| {
        let k = from_kernel(tid);
        let bp = k
            .as_ref()
            .filter(|r| (r.sp, r.ip) == (sp, ip))
            .map(|r| r.bp);
        stack(
            tid,
            Registers { ip, sp, bp },
            Vec::new(),
            returns_of(k.as_ref()),
        )
    };
    let mut out = Vec::new();
    let mut samplers = Vec::new();
    for &tid in tids {
        match syscall_of(process, tid) {
            Some(Syscall::Blocked { sp, ip }) => out.push(blocked(tid, sp, ip)),
            Some(Syscall::Running) if samplers.len() < MAX_SAMPLED => match Sampler::open(pid, tid)
            {
                // Its id still the process's thread's once the event is bound to it (the
                // event is bound by the id alone).
                Ok(s) if process.has_thread(tid) => samplers.push(s),
                Ok(_) => {}
                Err(e) => tracing::debug!(pid, tid, error = %e, "thread not sampled"),
            },
            _ => {}
        }
    }
    let deadline = Instant::now() + wait;
    while !samplers.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds: Vec<libc::pollfd> = samplers
            .iter()
            .map(|s| libc::pollfd {
                fd: s.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fds` is a live array of `fds.len()` pollfds.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        let timed_out = ready <= 0 || left.is_zero();
        let mut still = Vec::new();
        for (s, p) in samplers.into_iter().zip(&fds) {
            if p.revents != 0 {
                if let Some((regs, copied)) = s.first_sample() {
                    // The sample's registers; the kernel's word on its probed returns (they
                    // change only as calls are entered and left).
                    let returns = returns_of(from_kernel(s.tid).as_ref());
                    out.push(stack(s.tid, regs, copied, returns));
                }
            } else if timed_out {
                // It may have blocked since it was found running.
                if let Some(Syscall::Blocked { sp, ip }) = syscall_of(process, s.tid) {
                    out.push(blocked(s.tid, sp, ip));
                }
            } else {
                still.push(s);
            }
        }
        samplers = still;
    }
    out
}

/// `perf_event_attr` up to `sample_max_stack` (`PERF_ATTR_SIZE_VER5`, 112 bytes).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 112);

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;
const PERF_SAMPLE_REGS_USER: u64 = 1 << 12;
const PERF_SAMPLE_STACK_USER: u64 = 1 << 13;
/// `exclude_kernel`: the thread's user time alone (its user registers are what is wanted;
/// and an unprivileged caller, as the unit tests may run, may sample no more).
const EXCLUDE_KERNEL: u64 = 1 << 5;
/// `exclude_hv`: nothing of a hypervisor's.
const EXCLUDE_HV: u64 = 1 << 6;
/// x86-64's `perf_event_x86_regs`: BP, SP, IP (a sample lists them in this order).
const REGS_BP_SP_IP: u64 = (1 << 6) | (1 << 7) | (1 << 8);
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// Pages of a sampler's ring (a power of two), enough for one sample and its stack.
const RING_PAGES: usize = 4;
/// The ring's control page: where `data_head` is.
const DATA_HEAD_OFFSET: usize = 1024;

/// A perf event sampling one thread's registers and stack by its CPU time, and its ring.
struct Sampler {
    tid: u32,
    fd: OwnedFd,
    ring: *mut u8,
    ring_len: usize,
    page: usize,
}

impl Sampler {
    /// A sampler of `pid`'s thread `tid`.
    fn open(pid: u32, tid: u32) -> std::io::Result<Sampler> {
        let attr = PerfEventAttr {
            kind: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: PERF_COUNT_SW_TASK_CLOCK,
            // 50 us of the thread's CPU time: a thread on a CPU is sampled at once.
            sample_period: 50_000,
            sample_type: PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER,
            flags: EXCLUDE_KERNEL | EXCLUDE_HV,
            wakeup_events: 1,
            sample_regs_user: REGS_BP_SP_IP,
            sample_stack_user: SAMPLED_STACK,
            ..Default::default()
        };
        // SAFETY: perf_event_open reads `attr` (its size given in it); the result is checked.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &raw const attr,
                tid as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // The thread's id named `pid`'s thread when it was listed: still, now the event is
        // bound to it (an id given out again to another process's thread is not sampled).
        if !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists() {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let ring_len = page * (RING_PAGES + 1);
        // Writable, though nothing is written: a read-only ring is one the kernel overwrites
        // (its reader's position unknown to it), and the first sample would be torn by the
        // next. This one fills, and samples past it are dropped.
        // SAFETY: a new shared mapping of the event's ring, checked below, unmapped in `Drop`.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Sampler {
            tid,
            fd,
            ring: ring.cast(),
            ring_len,
            page,
        })
    }

    /// The ring's data bytes written so far (the ring never wraps here: nothing is consumed,
    /// and a sample that does not fit is dropped by the kernel, never written over another).
    fn data(&self) -> &[u8] {
        #[expect(
            clippy::cast_ptr_alignment,
            reason = "the ring is page-aligned and data_head 8-aligned within it"
        )]
        // SAFETY: the control page is mapped; `data_head` is an aligned u64 the kernel
        // writes, read once, atomically.
        let head = unsafe {
            (*self
                .ring
                .add(DATA_HEAD_OFFSET)
                .cast::<std::sync::atomic::AtomicU64>())
            .load(std::sync::atomic::Ordering::Acquire)
        };
        let len = usize::try_from(head)
            .unwrap_or(usize::MAX)
            .min(self.ring_len - self.page);
        // SAFETY: the data pages follow the control page, `len` bytes of them written.
        unsafe { std::slice::from_raw_parts(self.ring.add(self.page), len) }
    }

    /// The first sample's registers and stack that has user registers.
    fn first_sample(&self) -> Option<(Registers, Vec<u8>)> {
        let data = self.data();
        let mut at = 0;
        while at + 8 <= data.len() {
            let kind = u32::from_ne_bytes(data[at..at + 4].try_into().ok()?);
            let size = usize::from(u16::from_ne_bytes(data[at + 6..at + 8].try_into().ok()?));
            if size < 8 || at + size > data.len() {
                return None;
            }
            // A sample without user registers (taken as the thread left for the kernel)
            // is passed over for the next.
            if let Some(sample) = (kind == PERF_RECORD_SAMPLE)
                .then(|| parse_sample(&data[at + 8..at + size]))
                .flatten()
            {
                return Some(sample);
            }
            at += size;
        }
        None
    }
}

/// A sample's body (`PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER`): the ABI, the three
/// registers, the stack's size and bytes, the bytes of it that were filled.
fn parse_sample(body: &[u8]) -> Option<(Registers, Vec<u8>)> {
    let word = |i: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(
            body.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    };
    if word(0)? == 0 {
        return None; // no user registers (a kernel thread)
    }
    let (bp, sp, ip) = (word(1)?, word(2)?, word(3)?);
    let size = usize::try_from(word(4)?).ok()?;
    let stack = body.get(40..40usize.checked_add(size)?)?;
    let filled = if size == 0 {
        0
    } else {
        let dyn_size = u64::from_ne_bytes(body.get(40 + size..48 + size)?.try_into().ok()?);
        usize::try_from(dyn_size).ok()?.min(size)
    };
    Some((
        Registers {
            ip,
            sp,
            bp: Some(bp),
        },
        stack[..filled].to_vec(),
    ))
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.ring.cast(), self.ring_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_syscall_lines_are_read() {
        assert_eq!(parse_syscall("running\n"), Some(Syscall::Running));
        assert_eq!(
            parse_syscall("7 0x7ffd1 0x1 0x3e8 0x0 0x0 0x0 0x7ffc0 0x7f10\n"),
            Some(Syscall::Blocked {
                sp: 0x7ffc0,
                ip: 0x7f10
            })
        );
        assert_eq!(
            parse_syscall("-1 0x7ffc0 0x7f10"),
            Some(Syscall::Blocked {
                sp: 0x7ffc0,
                ip: 0x7f10
            })
        );
        assert_eq!(parse_syscall("7 0x1 0x2"), None);
        assert_eq!(parse_syscall(""), None);
    }

    /// The stack is read from the sample's copy, then memory within its own mapping alone;
    /// a return address the kernel's return probe moved off the stack is read back.
    #[test]
    fn a_stack_reads_its_copy_its_mapping_and_its_probed_returns() {
        let copied: Vec<u8> = [0x11u64, 0x7fff_0000_1000]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let s = ThreadStack {
            pid: std::process::id(),
            tid: 0,
            regs: Registers {
                ip: 0,
                sp: 0x1000,
                bp: None,
            },
            copied,
            mem: None,
            window: Default::default(),
            readable: (0x1000, 0x2000),
            reads_left: 2.into(),
            returns: vec![
                collector_common::ReturnSlot {
                    slot: 0x1008,
                    to: 0x4242,
                },
                collector_common::ReturnSlot {
                    slot: 0x1000,
                    to: 0x4343,
                },
            ],
            trampoline: Some((0x7fff_0000_0000, 0x7fff_0000_2000)),
        };
        // A slot the kernel keeps an address for is read back only where the stack holds
        // the trampoline (a stale record of a slot since reused is not taken).
        assert_eq!(s.read_u64(0x1000), Some(0x11));
        assert_eq!(s.read_u64(0x1008), Some(0x4242));
        // Outside its mapping, or past its reads: not read.
        assert_eq!(s.read_u64(0x2000), None);
        assert_eq!(s.read_u64(0xff8), None);
        assert_eq!(s.read_u64(0x1010), None);
        assert_eq!(s.reads_left.get(), 1);
    }

    #[test]
    fn a_sample_gives_its_registers_and_the_filled_stack() {
        let mut body = Vec::new();
        for w in [2u64, 0x10, 0x20, 0x30, 16] {
            body.extend_from_slice(&w.to_ne_bytes());
        }
        body.extend_from_slice(&[7; 16]);
        body.extend_from_slice(&8u64.to_ne_bytes());
        let (regs, stack) = parse_sample(&body).unwrap();
        assert_eq!(
            regs,
            Registers {
                ip: 0x30,
                sp: 0x20,
                bp: Some(0x10)
            }
        );
        assert_eq!(stack, vec![7; 8]);
        // Cut short, or without user registers: nothing.
        assert!(parse_sample(&body[..50]).is_none());
        body[..8].copy_from_slice(&0u64.to_ne_bytes());
        assert!(parse_sample(&body).is_none());
    }
}
