//! Unwinding a thread's stack by its files' call frame information (`.eh_frame`, through
//! `.eh_frame_hdr`'s sorted table, as debuggers and C++ exceptions do), to find the MPI or
//! NCCL routine it is inside: a call entered before commtap attached, which no probe saw
//! begin (a hung job attached to late).
//!
//! Each file's tables are read once, from the file the process maps (opened through the
//! kernel's link to the mapping and verified), by a thread of their own, and kept (up to
//! a cap).

use std::{
    collections::BTreeMap,
    sync::{mpsc, Arc},
    time::Instant,
};

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use super::{file::FileKey, Elf, LibraryFile};
use crate::discover::{stack::ThreadStack, MappedObject};

/// Most frames unwound of one stack.
pub const MAX_FRAMES: usize = 256;
/// Longest call frame entry evaluated (a compiler's are tens of bytes).
const MAX_ENTRY_LEN: usize = 4096;
/// Most files whose tables are kept.
const MAX_FILES: usize = 512;
/// Most bytes of the files' tables kept, all together (libtorch's `.eh_frame` alone is
/// tens of megabytes).
const MAX_HELD_BYTES: u64 = 256 << 20;

/// What unwinding needs of one file.
#[derive(Debug, Default)]
struct FileFrames {
    /// Its lowest segment's virtual address less that segment's file offset: a runtime
    /// address less the start of its mapping at offset 0 is a file address less this.
    base: u64,
    /// `.eh_frame` and its virtual address.
    eh_frame: Vec<u8>,
    eh_frame_addr: u64,
    /// `.eh_frame_hdr` and its virtual address.
    hdr: Vec<u8>,
    hdr_addr: u64,
    /// The MPI and NCCL routines it holds: start, end (virtual addresses) and routine id.
    routines: Vec<(u64, u64, u16)>,
}

impl FileFrames {
    fn read(file: &LibraryFile) -> Option<FileFrames> {
        let data = file.data().ok()?;
        let elf: Elf = object::File::parse(&data).ok()?;
        let base = elf
            .segments()
            .filter_map(|s| s.address().checked_sub(s.file_range().0))
            .min()
            .unwrap_or(0);
        let section = |name: &str| {
            elf.section_by_name(name)
                .and_then(|s| Some((s.data().ok()?.to_vec(), s.address())))
        };
        let (eh_frame, eh_frame_addr) = section(".eh_frame").unwrap_or_default();
        let (hdr, hdr_addr) = section(".eh_frame_hdr").unwrap_or_default();
        let mut routines: Vec<(u64, u64, u16)> = elf
            .dynamic_symbols()
            .chain(elf.symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.size() > 0)
            .filter_map(|s| {
                let id = routine_named(s.name().ok()?)?;
                Some((s.address(), s.address().checked_add(s.size())?, id))
            })
            .collect();
        routines.sort_unstable();
        routines.dedup_by_key(|r| r.0);
        Some(FileFrames {
            base,
            eh_frame,
            eh_frame_addr,
            hdr,
            hdr_addr,
            routines,
        })
    }

    fn bytes(&self) -> u64 {
        (self.eh_frame.len() + self.hdr.len() + self.routines.len() * 24) as u64
    }

    /// The routine whose code holds file address `at`.
    fn routine_at(&self, at: u64) -> Option<u16> {
        let i = self
            .routines
            .partition_point(|r| r.0 <= at)
            .checked_sub(1)?;
        let (_, end, id) = self.routines[i];
        (at < end).then_some(id)
    }

    /// The caller's registers of a frame at file address `at` (`lookup`: `at`, less one
    /// past the innermost frame, for a return address may follow a call that ends its
    /// function), from this one's `regs`.
    fn caller(&self, at: u64, regs: Regs, stack: &ThreadStack) -> Option<Regs> {
        let hdr = EhFrameHdr::new(&self.hdr, LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame_hdr(self.hdr_addr)
            .set_eh_frame(self.eh_frame_addr);
        let parsed = hdr.parse(&bases, 8).ok()?;
        let table = parsed.table()?;
        let mut eh_frame = EhFrame::new(&self.eh_frame, LittleEndian);
        eh_frame.set_address_size(8);
        let fde = table
            .fde_for_address(&eh_frame, &bases, at, EhFrame::cie_from_offset)
            .ok()?;
        // Its rules are evaluated from the entry's start at every frame: a file's entry made
        // long would make each frame cost that much.
        if fde.entry_len() > MAX_ENTRY_LEN || fde.cie().entry_len() > MAX_ENTRY_LEN {
            return None;
        }
        let mut ctx = UnwindContext::new();
        let row = fde
            .unwind_info_for_address(&eh_frame, &bases, &mut ctx, at)
            .ok()?;
        let cfa = match *row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                let r = if register == X86_64::RSP {
                    regs.sp
                } else if register == X86_64::RBP {
                    regs.bp?
                } else {
                    return None;
                };
                r.checked_add_signed(offset)?
            }
            CfaRule::Expression(_) => return None,
        };
        let saved = |rule: Option<RegisterRule<usize>>, now: Option<u64>| match rule {
            Some(RegisterRule::Offset(o)) => stack.read_u64(cfa.checked_add_signed(o)?),
            Some(RegisterRule::ValOffset(o)) => cfa.checked_add_signed(o),
            None | Some(RegisterRule::SameValue) => now,
            _ => None,
        };
        // The outermost frame marks its return address undefined (`_start`, `clone`).
        let ip = match row.register(X86_64::RA) {
            Some(RegisterRule::Undefined) => 0,
            rule => saved(rule, None)?,
        };
        Some(Regs {
            ip,
            sp: cfa,
            bp: saved(row.register(X86_64::RBP), regs.bp),
        })
    }
}

/// The routine id `name` (or its profiling alias, `PMPI_Send`, `pncclAllReduce`) names,
/// of an MPI or NCCL routine.
fn routine_named(name: &str) -> Option<u16> {
    use collector_common::routines::{routine_id, Family, ROUTINES};
    if !["MPI_", "PMPI_", "nccl", "pnccl"]
        .iter()
        .any(|p| name.starts_with(p))
    {
        return None;
    }
    let name = name
        .strip_prefix("PMPI_")
        .map(|n| format!("MPI_{n}"))
        .or_else(|| name.strip_prefix('p').map(str::to_string))
        .unwrap_or_else(|| name.to_string());
    routine_id(&name).filter(|&id| {
        matches!(
            ROUTINES[usize::from(id)].family(),
            Family::Mpi | Family::Nccl
        )
    })
}

#[derive(Clone, Copy, Debug)]
struct Regs {
    ip: u64,
    sp: u64,
    bp: Option<u64>,
}

/// What unwinding found on one thread's stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unwound {
    /// The outermost MPI or NCCL routine its frames are inside (a routine's own calls of
    /// another are the library's business: the caller's is the call in progress).
    pub routine: Option<u16>,
    /// Where that routine was called from: the address its caller's frame returns to.
    pub site: Option<u64>,
    /// Frames unwound.
    pub frames: usize,
    /// Whether unwinding reached the stack's outermost frame (else it stopped at a frame
    /// it could not read: a routine further out would not have been seen).
    pub complete: bool,
    /// Why it stopped, and the address it stopped at (for the debug log).
    pub stopped: (&'static str, u64),
}

/// The files' unwinding tables, read once each, by a thread of their own: a file on a hung
/// file system (a user's FUSE mount) blocks that thread alone, never a profile.
#[derive(Debug, Default)]
pub struct Unwinder {
    files: BTreeMap<FileKey, Slot>,
    held: u64,
    reader: Option<Reader>,
    /// Threads (process, thread, the tick count of their last call's entry where it was
    /// untimed, else 0) whose stacks were unwound whole and inside no routine, while they
    /// had made no probed call since (none, or that untimed one): a call they make later
    /// is the probes' to see, so they are not unwound again.
    outside: std::collections::HashSet<(u32, u32, u64)>,
    /// The sites named of calls in progress, by (process, thread, the call's start).
    sites: std::collections::HashMap<(u32, u32, u64), String>,
}

/// Most threads remembered outside any routine, and most sites of calls in progress
/// (past it, all are forgotten).
const MAX_OUTSIDE: usize = 65_536;

/// A file's tables: asked of the reader, or read (`None`: it could not be).
#[derive(Debug)]
enum Slot {
    Reading,
    Read(Option<Arc<FileFrames>>),
}

/// The thread that opens and reads files, and the way to it and back.
#[derive(Debug)]
struct Reader {
    ask: mpsc::SyncSender<(u32, MappedObject)>,
    answers: mpsc::Receiver<(FileKey, Option<FileFrames>)>,
}

impl Reader {
    fn start() -> Option<Reader> {
        let (ask, asked) = mpsc::sync_channel::<(u32, MappedObject)>(MAX_ASKED);
        let (answer, answers) = mpsc::channel();
        std::thread::Builder::new()
            .name("commtap-unwind".into())
            .spawn(move || {
                // Each file opened at once, through the process's own mapping of it.
                while let Ok((pid, o)) = asked.recv() {
                    let shown = o.path.display().to_string();
                    // Not the contents asked for (written since): none, asked again.
                    let read = LibraryFile::open_mapped(pid, o.range, o.dev_inode, &shown)
                        .ok()
                        .filter(|f| f.stamp == o.stamp)
                        .and_then(|f| FileFrames::read(&f));
                    if answer.send((o.contents(), read)).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| tracing::warn!(error = %e, "no thread to read unwinding tables"))
            .ok()?;
        Some(Reader { ask, answers })
    }
}

/// Files asked of the reader and not yet read, at most.
const MAX_ASKED: usize = 1024;
impl Unwinder {
    /// Unwinds `stack` of a process that maps `objects` (as
    /// [`mapped_objects`](crate::discover::mapped_objects) read them), waiting for files'
    /// tables until `until` at most.
    pub fn unwind(
        &mut self,
        objects: &[MappedObject],
        stack: &ThreadStack,
        until: Instant,
    ) -> Unwound {
        let mut regs = Regs {
            ip: stack.regs.ip,
            sp: stack.regs.sp,
            bp: stack.regs.bp,
        };
        let mut found = Unwound {
            stopped: ("frames cap", 0),
            ..Unwound::default()
        };
        while found.frames < MAX_FRAMES {
            let stop = |why| (why, regs.ip);
            if regs.ip == 0 {
                found.complete = true;
                found.stopped = stop("outermost frame");
                break;
            }
            let Some(o) = objects
                .iter()
                .find(|o| o.code.iter().any(|(lo, hi)| (*lo..*hi).contains(&regs.ip)))
            else {
                found.stopped = stop("no file's code");
                break;
            };
            let Some(file) = self.file(stack.pid, o, until) else {
                found.stopped = stop("file not read");
                break;
            };
            // A return address may follow a call that ends its function: the call is
            // what the frame is inside.
            let lookup = if found.frames == 0 {
                regs.ip
            } else {
                regs.ip - 1
            };
            let Some(at) = o
                .bias
                .and_then(|b| lookup.checked_sub(b)?.checked_add(file.base))
            else {
                found.stopped = stop("no load bias");
                break;
            };
            found.frames += 1;
            let routine = file.routine_at(at);
            let Some(caller) = file.caller(at, regs, stack) else {
                found.routine = routine.or(found.routine);
                found.stopped = stop("no caller by the file's tables");
                break;
            };
            if let Some(id) = routine {
                found.routine = Some(id);
                // A site in no file's code is none (a return address the kernel's return
                // probe moved off the stack and that could not be read back).
                found.site = objects
                    .iter()
                    .any(|o| {
                        o.code
                            .iter()
                            .any(|(lo, hi)| (*lo..*hi).contains(&caller.ip))
                    })
                    .then_some(caller.ip);
            }
            // A stack grows down: a caller's frame above its callee's, or the unwinding
            // is lost (and would loop).
            if caller.sp <= regs.sp && caller.ip != 0 {
                found.stopped = stop("stack pointer went down");
                break;
            }
            regs = caller;
        }
        found
    }

    /// Whether `thread` (process, thread, the tick count of its last call's entry where
    /// that was untimed, else 0) was found outside any routine, its stack whole.
    pub fn known_outside(&self, thread: (u32, u32, u64)) -> bool {
        self.outside.contains(&thread)
    }

    /// Remembers `thread` (as [`Unwinder::known_outside`] keys it) as found outside any
    /// routine, its stack whole.
    pub fn remember_outside(&mut self, thread: (u32, u32, u64)) {
        if self.outside.len() >= MAX_OUTSIDE {
            self.outside.clear();
        }
        self.outside.insert(thread);
    }

    /// The site named of the call thread `tid` of `pid` entered at `since_ns`.
    pub fn named_site(&self, (pid, tid, since_ns): (u32, u32, u64)) -> Option<&str> {
        self.sites.get(&(pid, tid, since_ns)).map(String::as_str)
    }

    /// Remembers the site of the call thread `tid` of `pid` entered at `since_ns`.
    pub fn remember_site(&mut self, key: (u32, u32, u64), site: &str) {
        if self.sites.len() >= MAX_OUTSIDE {
            self.sites.clear();
        }
        self.sites.insert(key, site.to_string());
    }

    /// The tables of `o`, mapped by `pid`: asked of the reader once, and waited for then
    /// until `until` at most (`None` where they cannot be read, or are not yet).
    fn file(&mut self, pid: u32, o: &MappedObject, until: Instant) -> Option<Arc<FileFrames>> {
        self.take_answers(None);
        let key = o.contents();
        match self.files.get(&key) {
            Some(Slot::Read(f)) => return f.clone(),
            Some(Slot::Reading) => return None,
            None => {}
        }
        // A daemon on a node of many jobs, each with its own files: the tables are let go
        // all together, read again as stacks need them.
        if self.files.len() >= MAX_FILES || self.held >= MAX_HELD_BYTES {
            self.files.retain(|_, f| matches!(f, Slot::Reading));
            self.held = 0;
        }
        if self.reader.is_none() {
            self.reader = Reader::start();
        }
        // Full (the reader stuck on a file): asked again by a later stack.
        self.reader.as_ref()?.ask.try_send((pid, o.clone())).ok()?;
        self.files.insert(key, Slot::Reading);
        self.take_answers(Some((key, until)));
        match self.files.get(&key) {
            Some(Slot::Read(f)) => f.clone(),
            _ => None,
        }
    }

    /// Files the reader has read since: those answered, or, with `until`, until that one
    /// is (or the deadline passes).
    fn take_answers(&mut self, until: Option<(FileKey, Instant)>) {
        let Some(reader) = &self.reader else { return };
        loop {
            let answer = match until {
                Some((_, deadline)) => reader
                    .answers
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .ok(),
                None => reader.answers.try_recv().ok(),
            };
            let Some((id, read)) = answer else { return };
            let read = read.map(Arc::new);
            self.held += read.as_ref().map_or(0, |f| f.bytes());
            self.files.insert(id, Slot::Read(read));
            if until.is_some_and(|(want, _)| want == id) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routines_are_named_by_their_profiling_aliases_too() {
        use collector_common::routines::routine_id;
        assert_eq!(routine_named("MPI_Barrier"), routine_id("MPI_Barrier"));
        assert_eq!(routine_named("PMPI_Barrier"), routine_id("MPI_Barrier"));
        assert_eq!(routine_named("pncclAllReduce"), routine_id("ncclAllReduce"));
        assert!(routine_named("MPI_Barrier").is_some());
        assert_eq!(routine_named("PMPI_Nonesuch"), None);
        assert_eq!(routine_named("memcpy"), None);
        // Transports' and CUDA's routines are not calls a rank is inside.
        assert_eq!(routine_named("fi_send"), None);
    }

    /// Stand-ins of two MPI routines in this test's own program: one blocks in the
    /// kernel (reading a pipe), the other spins on a CPU.
    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn MPI_Barrier(fd: i32) -> i32 {
        let mut b = [0u8; 1];
        // SAFETY: reads one byte into `b`.
        unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) as i32 }
    }

    #[unsafe(no_mangle)]
    #[inline(never)]
    extern "C" fn MPI_Allreduce(stop: &std::sync::atomic::AtomicBool) -> i32 {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::hint::spin_loop();
        }
        0
    }

    #[test]
    fn a_blocked_and_a_running_thread_are_found_inside_their_routines() {
        use std::sync::{atomic::AtomicBool, mpsc};
        let mut fds = [0i32; 2];
        // SAFETY: a pipe into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (read_end, write_end) = (fds[0], fds[1]);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (blocked_tid, blocked_id) = mpsc::channel();
        let blocked = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            blocked_tid.send(unsafe { libc::gettid() } as u32).unwrap();
            MPI_Barrier(std::hint::black_box(read_end))
        });
        let s = std::sync::Arc::clone(&stop);
        let (running_tid, running_id) = mpsc::channel();
        let running = std::thread::spawn(move || {
            // SAFETY: as above.
            running_tid.send(unsafe { libc::gettid() } as u32).unwrap();
            MPI_Allreduce(std::hint::black_box(&s))
        });
        let ids = [blocked_id.recv().unwrap(), running_id.recv().unwrap()];
        let pid = std::process::id();
        let want = |name| collector_common::routines::routine_id(name);
        let mut unwinder = Unwinder::default();
        // Each thread is inside its routine once it has gone past sending its id: looked at
        // until it is (a fresh thread is unwound through whatever it does meanwhile).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut found = BTreeMap::new();
        while found.len() < 2 {
            assert!(std::time::Instant::now() < deadline, "found only {found:?}");
            let objects = crate::discover::mapped_objects(pid).unwrap();
            let me = crate::discover::process_dir::ProcessDir::open(pid, None).unwrap();
            let stacks =
                crate::discover::stack::stacks(&me, &ids, std::time::Duration::from_secs(5), None);
            for s in &stacks {
                let u = unwinder.unwind(
                    &objects,
                    s,
                    Instant::now() + std::time::Duration::from_secs(5),
                );
                if u.routine.is_some() {
                    // Without the task iterator (it takes commtap's probes loaded) a
                    // blocked thread's frame pointer is not known: a frame whose caller is
                    // found through it (the thread's start, here) ends the unwinding.
                    assert!(
                        u.frames >= 3 && (u.complete || s.regs.bp.is_none()),
                        "{u:?}"
                    );
                    assert!(u.site.is_some(), "{u:?}");
                    found.insert(s.tid, u.routine);
                }
            }
        }
        assert_eq!(found[&ids[0]], want("MPI_Barrier"));
        assert_eq!(found[&ids[1]], want("MPI_Allreduce"));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: writes one byte from a live buffer.
        let wrote = unsafe { libc::write(write_end, [1u8].as_ptr().cast(), 1) };
        assert_eq!(wrote, 1);
        assert_eq!(blocked.join().unwrap(), 1);
        assert_eq!(running.join().unwrap(), 0);
        // SAFETY: both ends ours, closed once.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
    }
}
