//! uprobe_multi links for the MPI and NCCL probe programs.
//!
//! Why not aya here: aya 0.14 attaches each uprobe as its own perf event. Closing a
//! perf-event uprobe waits for an RCU-tasks-trace grace period while holding the kernel's
//! global `event_mutex`, so detaching the ~450 probes of two MPI libraries took 45 s on this
//! machine, one after the other, whatever the number of threads. A uprobe_multi link
//! (Linux 6.6+) carries every probe point of a library, each with its own cookie, and
//! detaches them all after one grace period. aya 0.14 cannot load a program with the
//! `BPF_TRACE_UPROBE_MULTI` expected attach type that such a link requires, so the MPI
//! programs are loaded here from the instructions aya's own object parser (aya-obj) has
//! relocated against the maps aya created, with two raw bpf(2) calls. Maps, tracepoints
//! and everything else stay with aya.

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
};

use aya_obj::generated::{
    bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_type, BPF_F_UPROBE_MULTI_RETURN,
};

/// Errors loading or attaching the uprobe_multi programs.
#[derive(Debug, thiserror::Error)]
pub enum MultiError {
    /// The embedded object could not be parsed or relocated.
    #[error("preparing BPF program {0} for uprobe_multi: {1}")]
    Prepare(String, String),
    /// The kernel refused the program.
    #[error("loading BPF program {name}: {source}{}\n{log}", load_hint(.source, .log))]
    Load {
        /// The program.
        name: String,
        /// Verifier output.
        log: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The kernel refused the link.
    #[error("attaching {count} probes to {path}")]
    Link {
        /// The library.
        path: String,
        /// How many probe points.
        count: usize,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl MultiError {
    /// Whether the kernel's verifier refused a program: a program of commtap's that this
    /// kernel's verifier does not accept, not a kernel without BPF.
    pub fn refused_by_verifier(&self) -> bool {
        matches!(self, MultiError::Load { log, .. } if verifier_spoke(log))
    }
}

/// Whether a refused load left a verifier log (a kernel without uprobe_multi refuses the
/// program's attach type before verifying anything, and leaves none).
fn verifier_spoke(log: &str) -> bool {
    !log.trim().is_empty()
}

/// What a refused load most likely means: the verifier's refusal, whose log says why, or
/// a kernel too old for uprobe_multi.
fn load_hint(source: &io::Error, log: &str) -> &'static str {
    if verifier_spoke(log) {
        " (refused by the kernel's verifier, whose last lines follow)"
    } else if source.raw_os_error() == Some(libc::EINVAL) {
        " (uprobe_multi needs Linux 6.6+)"
    } else {
        ""
    }
}

fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    let rc = bpf_raw(cmd, attr)?;
    // SAFETY: on success these commands return a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// bpf(2) for a command that returns a number, not a descriptor.
fn bpf_raw(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<libc::c_long> {
    // SAFETY: attr is a valid, fully initialised bpf_attr of the size we pass.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut::<bpf_attr>(attr),
            size_of::<bpf_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// Turns on the kernel's run-time statistics of every BPF program (`BPF_ENABLE_STATS`)
/// for as long as the returned descriptor is open; each program run then costs two more
/// clock reads.
pub fn enable_run_stats() -> io::Result<OwnedFd> {
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_ENABLE_STATS member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // BPF_STATS_RUN_TIME is 0: the zeroed member asks for it.
    bpf(bpf_cmd::BPF_ENABLE_STATS, &mut attr)
}

/// The kernel's count of runs of program `prog` and their total time, ns (both 0 while
/// run-time statistics are off).
pub fn run_stats(prog: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    // SAFETY: a plain C struct the kernel fills; zeroed is valid.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_OBJ_GET_INFO_BY_FD member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: plain integers into the member this command reads.
    let i = unsafe { &mut attr.info };
    i.bpf_fd = prog.as_raw_fd() as u32;
    i.info_len = size_of_val(&info) as u32;
    i.info = std::ptr::from_mut(&mut info) as u64;
    bpf_raw(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok((info.run_cnt, info.run_time_ns))
}

/// Creates the task-local storage map holding each thread's in-flight call
/// (`BPF_MAP_TYPE_TASK_STORAGE`, value `value_size` bytes). aya-ebpf cannot declare such a
/// map, and the kernel insists on BTF type ids for its key and value, so a minimal BTF
/// (an `int` key, an `int[value_size / 4]` value) is loaded for it here.
pub fn create_task_storage(value_size: u32) -> Result<OwnedFd, MultiError> {
    let err = |what: &str, source| MultiError::Load {
        name: format!("task storage ({what})"),
        log: String::new(),
        source,
    };
    let btf = task_storage_btf(value_size);
    let mut log = vec![0u8; 4096];
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_BTF_LOAD member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: plain integers into the member this command reads.
    let b = unsafe { &mut attr.__bindgen_anon_7 };
    b.btf = btf.as_ptr() as u64;
    b.btf_size = btf.len() as u32;
    b.btf_log_buf = log.as_mut_ptr() as u64;
    b.btf_log_size = log.len() as u32;
    b.btf_log_level = 1;
    let btf_fd = bpf(bpf_cmd::BPF_BTF_LOAD, &mut attr).map_err(|e| err("BTF", e))?;

    // SAFETY: as above, for BPF_MAP_CREATE.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: plain integers into the member this command reads.
    let m = unsafe { &mut attr.__bindgen_anon_1 };
    m.map_type = aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as u32;
    m.key_size = 4;
    m.value_size = value_size;
    m.max_entries = 0;
    m.map_flags = aya_obj::generated::BPF_F_NO_PREALLOC;
    m.btf_fd = btf_fd.as_raw_fd() as u32;
    m.btf_key_type_id = 1;
    m.btf_value_type_id = 2;
    for (dst, src) in m
        .map_name
        .iter_mut()
        .zip(collector_common::names::maps::TASK_STATE.as_bytes().iter())
    {
        *dst = *src as libc::c_char;
    }
    bpf(bpf_cmd::BPF_MAP_CREATE, &mut attr).map_err(|e| err("map", e))
}

/// BTF with two types: [1] `int`, [2] `int[value_size / 4]`.
fn task_storage_btf(value_size: u32) -> Vec<u8> {
    const KIND_INT: u32 = 1;
    const KIND_ARRAY: u32 = 3;
    let strings = b"\0int\0";
    let mut types = Vec::new();
    let mut put = |v: u32| types.extend_from_slice(&v.to_ne_bytes());
    // [1] int: name "int", 4 bytes, signed, 32 bits.
    put(1);
    put(KIND_INT << 24);
    put(4);
    put((1 << 24) | 32);
    // [2] array of value_size / 4 ints, indexed by int.
    put(0);
    put(KIND_ARRAY << 24);
    put(0);
    put(1);
    put(1);
    put(value_size / 4);
    let mut out = Vec::new();
    let mut put = |v: &[u8]| out.extend_from_slice(v);
    put(&0xeb9f_u16.to_ne_bytes()); // magic
    put(&[1, 0]); // version, flags
    put(&24u32.to_ne_bytes()); // header length
    put(&0u32.to_ne_bytes()); // type section offset
    put(&(types.len() as u32).to_ne_bytes());
    put(&(types.len() as u32).to_ne_bytes()); // string section offset
    put(&(strings.len() as u32).to_ne_bytes());
    put(&types);
    put(strings);
    out
}

/// Loads the programs `names` of `object` for uprobe_multi attachment, relocated against
/// `maps` (map name -> fd of the map aya created).
pub fn load_programs(
    object: &[u8],
    maps: &HashMap<String, RawFd>,
    names: &[&str],
    session_kfunc: Option<u32>,
) -> Result<HashMap<String, OwnedFd>, MultiError> {
    let prep = |e: String| MultiError::Prepare(names.join(","), e);
    let mut obj = aya_obj::Object::parse(object).map_err(|e| prep(e.to_string()))?;
    let btf = load_btf(&mut obj);
    let parsed: Vec<(String, aya_obj::Map)> = obj
        .maps
        .iter()
        .map(|(n, m)| (n.clone(), m.clone()))
        .collect();
    let mut with_fds = Vec::new();
    for (name, map) in &parsed {
        let fd = *maps
            .get(name)
            .ok_or_else(|| prep(format!("no fd for map {name}")))?;
        with_fds.push((name.as_str(), fd, map));
    }
    let text: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    obj.relocate_maps(with_fds.into_iter(), &text)
        .map_err(|e| prep(e.to_string()))?;
    obj.relocate_calls(&text).map_err(|e| prep(e.to_string()))?;

    let mut code = Vec::with_capacity(names.len());
    for &name in names {
        let program = obj
            .programs
            .get(name)
            .ok_or_else(|| prep(format!("no program {name}")))?;
        let function = obj
            .functions
            .get(&program.function_key())
            .ok_or_else(|| prep(format!("no code for {name}")))?;
        let mut insns = function.instructions.clone();
        let kind = if matches!(program.section, aya_obj::ProgramSection::TracePoint) {
            LoadKind::Tracepoint
        } else if matches!(program.section, aya_obj::ProgramSection::Iter { .. }) {
            let target = super::btf::Btf::vmlinux()
                .ok()
                .and_then(|b| b.func_id("bpf_iter_task"))
                .ok_or_else(|| prep("the kernel's BTF names no bpf_iter_task".into()))?;
            LoadKind::TaskIterator(target)
        } else {
            match session_kfunc {
                Some(id) if call_session_kfunc(&mut insns, id) => LoadKind::Session,
                _ => LoadKind::Multi,
            }
        };
        let funcs = btf.as_ref().map(|fd| FuncInfo {
            btf: fd.as_raw_fd(),
            records: function.func_info.func_info_bytes(),
            count: function.func_info.len(),
            record_size: function.func_info_rec_size,
        });
        code.push((name, insns, kind, funcs));
    }
    // The verifier takes most of commtap's start-up (half a second for the largest return
    // program here), and it runs in the loading thread: one thread per program lets a
    // many-core node verify them all in the time of the largest.
    std::thread::scope(|s| {
        let loads: Vec<_> = code
            .into_iter()
            .map(|(name, insns, kind, funcs)| {
                let load = s.spawn(move || load_one(name, &insns, kind, funcs.as_ref()));
                (name, load)
            })
            .collect();
        let mut out = HashMap::new();
        for (name, load) in loads {
            let fd = load
                .join()
                .map_err(|_| prep(format!("loading {name} panicked")))??;
            out.insert(name.to_string(), fd);
        }
        Ok(out)
    })
}

/// The object's BTF loaded into the kernel, as aya loads it for its own programs (fixed up
/// for this kernel's features); `None` where the kernel has no BTF support or refuses it
/// (then programs that need function information, those with `bpf_loop` callbacks, are
/// refused, and say so).
fn load_btf(obj: &mut aya_obj::Object) -> Option<OwnedFd> {
    let features = aya::features().btf()?;
    let raw = match obj.fixup_and_sanitize_btf(features) {
        Ok(Some(btf)) => btf.to_bytes(),
        Ok(None) => return None,
        Err(e) => {
            tracing::debug!("BPF object's BTF not usable: {e}");
            return None;
        }
    };
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_BTF_LOAD member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integers into the union member this command reads.
    let u = unsafe { &mut attr.__bindgen_anon_7 };
    u.btf = raw.as_ptr() as u64;
    u.btf_size = raw.len() as u32;
    match bpf(bpf_cmd::BPF_BTF_LOAD, &mut attr) {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::debug!("loading the BPF object's BTF: {e}");
            None
        }
    }
}

/// A program's function information (one BTF function per subprogram), which the kernel
/// asks of programs with callbacks.
struct FuncInfo {
    /// The loaded BTF the records' type ids refer to.
    btf: RawFd,
    /// `bpf_func_info` records, one per subprogram, in instruction order.
    records: Vec<u8>,
    count: usize,
    record_size: usize,
}

/// Turns the session programs' calls of helper `SESSION_IS_RETURN_CALL` into calls of the
/// kernel function whose BTF id is `id` (`bpf_session_is_return`); whether there were any.
fn call_session_kfunc(insns: &mut [aya_obj::generated::bpf_insn], id: u32) -> bool {
    /// `BPF_JMP | BPF_CALL`.
    const CALL: u8 = 0x85;
    /// `BPF_PSEUDO_KFUNC_CALL`: `imm` is a BTF id, `off` 0 the kernel's own BTF.
    const PSEUDO_KFUNC_CALL: u8 = 2;
    let mut found = false;
    for insn in insns {
        if insn.code == CALL
            && insn.src_reg() == 0
            && insn.imm == collector_common::SESSION_IS_RETURN_CALL
        {
            insn.set_src_reg(PSEUDO_KFUNC_CALL);
            insn.imm = id as i32;
            insn.off = 0;
            found = true;
        }
    }
    found
}

/// What a program is loaded for.
#[derive(Clone, Copy)]
enum LoadKind {
    /// uprobe_multi links.
    Multi,
    /// uprobe_multi links of the session kind.
    Session,
    /// A tracepoint ([`attach_tracepoint`]).
    Tracepoint,
    /// A task iterator ([`thread_registers`]), its target the kernel's `bpf_iter_task`
    /// (that function's BTF id).
    TaskIterator(u32),
}

/// Loads one program as `kind` says; on refusal, loads it again with the verifier log on
/// to say why.
fn load_one(
    name: &str,
    insns: &[aya_obj::generated::bpf_insn],
    kind: LoadKind,
    funcs: Option<&FuncInfo>,
) -> Result<OwnedFd, MultiError> {
    let license = CString::new("GPL").expect("no NUL");
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_PROG_LOAD member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integers into the union member this command reads.
    let u = unsafe { &mut attr.__bindgen_anon_3 };
    (u.prog_type, u.expected_attach_type) = match kind {
        LoadKind::Multi => (
            bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32,
            bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32,
        ),
        LoadKind::Session => (
            bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32,
            BPF_TRACE_UPROBE_SESSION,
        ),
        LoadKind::Tracepoint => (bpf_prog_type::BPF_PROG_TYPE_TRACEPOINT as u32, 0),
        LoadKind::TaskIterator(target) => {
            u.attach_btf_id = target;
            (
                bpf_prog_type::BPF_PROG_TYPE_TRACING as u32,
                bpf_attach_type::BPF_TRACE_ITER as u32,
            )
        }
    };
    u.insns = insns.as_ptr() as u64;
    u.insn_cnt = insns.len() as u32;
    u.license = license.as_ptr() as u64;
    for (dst, src) in u.prog_name.iter_mut().zip(name.bytes().take(15)) {
        *dst = src as libc::c_char;
    }
    if let Some(f) = funcs.filter(|f| f.record_size > 0 && f.count > 0) {
        u.prog_btf_fd = f.btf as u32;
        u.func_info = f.records.as_ptr() as u64;
        u.func_info_cnt = f.count as u32;
        u.func_info_rec_size = f.record_size as u32;
    }
    // BPF_LOG_STATS: the verifier's few lines of effort (instructions processed, states),
    // logged at debug level with the time the load took.
    let mut stats = vec![0u8; 4096];
    u.log_level = 4;
    u.log_buf = stats.as_mut_ptr() as u64;
    u.log_size = stats.len() as u32;
    let started = std::time::Instant::now();
    let refusal = match bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => {
            let end = stats.iter().position(|b| *b == 0).unwrap_or(stats.len());
            tracing::debug!(
                "verified {name} in {:?}: {}",
                started.elapsed(),
                String::from_utf8_lossy(&stats[..end])
                    .trim()
                    .replace('\n', "; ")
            );
            return Ok(fd);
        }
        Err(e) => e,
    };
    let mut log = vec![0u8; 1 << 20];
    // SAFETY: as above.
    let u = unsafe { &mut attr.__bindgen_anon_3 };
    u.log_level = 1;
    u.log_buf = log.as_mut_ptr() as u64;
    u.log_size = log.len() as u32;
    // Loaded again for the log alone: its own error may be the log's (a log past the
    // buffer is ENOSPC), not the refusal's.
    let _ = bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr);
    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let tail: String = text
        .lines()
        .rev()
        .take(20)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    Err(MultiError::Load {
        name: name.to_string(),
        log: tail,
        source: refusal,
    })
}

/// What a uprobe_multi link's program runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// The functions' entries.
    Entry,
    /// Their returns.
    Return,
    /// Their entries, and the returns of the calls whose entry asked for it (a uprobe
    /// session, Linux 6.13+).
    Session,
}

/// `BPF_TRACE_UPROBE_SESSION`, newer than aya-obj's bindings.
const BPF_TRACE_UPROBE_SESSION: u32 = 57;

/// One uprobe_multi link: every probe point of one program in one library. Dropping it
/// detaches them all.
#[derive(Debug)]
pub struct MultiLink {
    #[allow(dead_code, reason = "held for its Drop")]
    fd: OwnedFd,
    /// Its points are return probes.
    is_return: bool,
}

/// Detaches `links`: the entry probes, then the return probes (see `attach_links`), each
/// kind all at once. Closing a link waits for an RCU grace period in the closing thread
/// (30 to 80 ms here); closed one after the other, the links of three libraries held up
/// commtap's exit for 0.6 s, closed together they share the wait.
pub fn detach_all(links: Vec<MultiLink>) {
    let (entries, returns): (Vec<_>, Vec<_>) = links.into_iter().partition(|l| !l.is_return);
    for kind in [entries, returns] {
        std::thread::scope(|s| {
            for link in kind {
                s.spawn(move || drop(link));
            }
        });
    }
}

/// A child process forked to hold the last references to this process's links (and
/// everything else it has open) until this process has let go of them, so that releasing
/// them, and the grace periods the kernel waits for then, happens in the child. The child
/// closes its standard streams at once (whoever reads this process's output sees its end
/// when this process ends) and exits when the pipe from this one closes: when this is
/// dropped, or when this process dies. It never outlives its parent by more than the
/// releases.
pub struct DetachInChild {
    #[allow(dead_code, reason = "held for its Drop: the child's signal to exit")]
    release: OwnedFd,
}

impl DetachInChild {
    /// Forks the child; `None` where that fails (the caller detaches itself).
    pub fn start() -> Option<DetachInChild> {
        let mut ends = [0 as libc::c_int; 2];
        // SAFETY: `ends` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: both are new descriptors owned by nobody else.
        let (wait, release) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        // SAFETY: the child of a multi-threaded process may only make async-signal-safe
        // calls: `hold_until_released` makes system calls only, and never returns.
        match unsafe { libc::fork() } {
            -1 => None,
            // SAFETY: in the child, which `hold_until_released` ends.
            0 => unsafe { hold_until_released(wait.as_raw_fd(), release.as_raw_fd()) },
            _ => Some(DetachInChild { release }),
        }
    }
}

/// The child of [`DetachInChild::start`]: system calls only (it was forked from a
/// multi-threaded process), no destructor, no exit handler.
unsafe fn hold_until_released(wait: RawFd, release: RawFd) -> ! {
    // SAFETY: plain system calls on descriptors this process owns.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"commtap-detach".as_ptr());
        for fd in [release, 0, 1, 2] {
            libc::close(fd);
        }
        let mut byte = 0u8;
        // Nothing is ever written: it returns at the end of file, when the parent's end
        // closes; again after a signal's handler ran.
        while libc::read(wait, (&raw mut byte).cast(), 1) < 0
            && *libc::__errno_location() == libc::EINTR
        {}
        libc::_exit(0)
    }
}

/// Attaches `prog` at `offsets` of the open `file` (each with its cookie), as probes of
/// `kind`; every process is probed (the programs filter by pid). The kernel reaches the
/// file through commtap's own descriptor: no path its owner controls is walked again.
pub fn attach(
    prog: BorrowedFd<'_>,
    file: &crate::symbols::LibraryFile,
    offsets: &[u64],
    cookies: &[u64],
    kind: ProbeKind,
) -> Result<MultiLink, MultiError> {
    debug_assert_eq!(offsets.len(), cookies.len());
    let err = |source| MultiError::Link {
        path: file.shown.clone(),
        count: offsets.len(),
        source,
    };
    let path = file.probe_path();
    let cpath =
        CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| err(io::Error::other(e)))?;
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_LINK_CREATE member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: plain integers into the member this command reads.
    let l = unsafe { &mut attr.link_create };
    l.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    l.attach_type = if kind == ProbeKind::Session {
        BPF_TRACE_UPROBE_SESSION
    } else {
        bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32
    };
    // SAFETY: as above.
    let m = unsafe { &mut l.__bindgen_anon_3.uprobe_multi };
    m.path = cpath.as_ptr() as u64;
    m.offsets = offsets.as_ptr() as u64;
    m.cookies = cookies.as_ptr() as u64;
    m.cnt = offsets.len() as u32;
    m.flags = if kind == ProbeKind::Return {
        BPF_F_UPROBE_MULTI_RETURN
    } else {
        0
    };
    bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
        .map(|fd| MultiLink {
            fd,
            is_return: kind == ProbeKind::Return,
        })
        .map_err(err)
}

/// The value task-storage map `map` holds for the task of pidfd `pidfd` (`None`: none,
/// or not readable); `T` the map's value type, plain data of the map's value size.
pub fn task_storage_value<T: Copy + Default>(map: BorrowedFd<'_>, pidfd: RawFd) -> Option<T> {
    let mut value = T::default();
    let key: i32 = pidfd;
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_MAP_LOOKUP_ELEM member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: plain integers and pointers into the member this command reads.
    let u = unsafe { &mut attr.__bindgen_anon_2 };
    u.map_fd = map.as_raw_fd() as u32;
    u.key = (&raw const key) as u64;
    u.__bindgen_anon_1.value = (&raw mut value) as u64;
    bpf_raw(bpf_cmd::BPF_MAP_LOOKUP_ELEM, &mut attr).ok()?;
    Some(value)
}

/// Attaches the tracepoint program `prog` (loaded by [`load_programs`]: relocated against
/// commtap's own maps, the task storage among them, which aya's loader cannot stand in) to
/// the tracepoint whose tracefs directory is `event` (`.../events/sched/sched_process_exit`):
/// a perf event of the tracepoint, linked to the program, runs it on every CPU.
pub fn attach_tracepoint(
    prog: BorrowedFd<'_>,
    event: &std::path::Path,
) -> Result<MultiLink, MultiError> {
    let err = |source| MultiError::Link {
        path: event.display().to_string(),
        count: 1,
        source,
    };
    let id: u64 = std::fs::read_to_string(event.join("id"))
        .map_err(err)?
        .trim()
        .parse()
        .map_err(|e| err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    // SAFETY: zeroed is a valid perf_event_attr; the fields below are plain integers.
    let mut pattr: aya_obj::generated::perf_event_attr = unsafe { std::mem::zeroed() };
    pattr.size = size_of::<aya_obj::generated::perf_event_attr>() as u32;
    pattr.type_ = aya_obj::generated::perf_type_id::PERF_TYPE_TRACEPOINT as u32;
    pattr.config = id;
    // Any process, on CPU 0: a tracepoint's programs run on every CPU whichever event
    // holds them.
    // SAFETY: a valid attr of the size it says; the result is checked.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const pattr,
            -1,
            0,
            -1,
            aya_obj::generated::PERF_FLAG_FD_CLOEXEC,
        )
    };
    if rc < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: perf_event_open returned a new descriptor we now own.
    let perf = unsafe { OwnedFd::from_raw_fd(rc as RawFd) };
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_LINK_CREATE member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: plain integers into the member this command reads.
    let l = unsafe { &mut attr.link_create };
    l.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    l.__bindgen_anon_2.target_fd = perf.as_raw_fd() as u32;
    l.attach_type = bpf_attach_type::BPF_PERF_EVENT as u32;
    // The link holds the perf event: ours may close.
    bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
        .map(|fd| MultiLink {
            fd,
            is_return: false,
        })
        .map_err(err)
}

/// `union bpf_iter_link_info`'s `task` member: the one thread a task iterator visits.
#[repr(C)]
#[derive(Default)]
struct IterTaskFilter {
    tid: u32,
    pid: u32,
    pid_fd: u32,
    /// The union's size (its cgroup member is 16 bytes).
    _pad: u32,
}

/// Thread `tid`'s user registers as its last entry into the kernel saved them, and its
/// calls whose returns are probed, by the task iterator `prog` (loaded by
/// [`load_programs`]) run for that thread alone (Linux 6.1+: the link's thread filter);
/// `None` where the thread is gone.
pub fn thread_registers(
    prog: BorrowedFd<'_>,
    tid: u32,
) -> io::Result<Option<collector_common::UserRegisters>> {
    let filter = IterTaskFilter {
        tid,
        ..IterTaskFilter::default()
    };
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_LINK_CREATE member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: plain integers and a pointer to `filter`, which outlives the call.
    let l = unsafe { &mut attr.link_create };
    l.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    l.attach_type = bpf_attach_type::BPF_TRACE_ITER as u32;
    l.__bindgen_anon_3.__bindgen_anon_1.iter_info = (&raw const filter) as u64;
    l.__bindgen_anon_3.__bindgen_anon_1.iter_info_len = size_of::<IterTaskFilter>() as u32;
    let link = match bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr) {
        Ok(link) => link,
        // The thread is gone (its pid no longer names a task).
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(e),
    };
    // SAFETY: zeroed is a valid bpf_attr; we fill the BPF_ITER_CREATE member.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.iter_create.link_fd = link.as_raw_fd() as u32;
    let iter = std::fs::File::from(bpf(bpf_cmd::BPF_ITER_CREATE, &mut attr)?);
    let mut out = [0u8; size_of::<collector_common::UserRegisters>()];
    let mut read = 0;
    while read < out.len() {
        match io::Read::read(&mut &iter, &mut out[read..])? {
            0 => return Ok(None),
            n => read += n,
        }
    }
    // SAFETY: `out` holds a whole `UserRegisters`, a C struct of integers (any bytes are
    // one), read unaligned.
    let regs =
        unsafe { std::ptr::read_unaligned(out.as_ptr().cast::<collector_common::UserRegisters>()) };
    Ok(Some(regs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_the_verifier_refused_or_the_kernel_is_too_old() {
        let refused = MultiError::Load {
            name: "sess_ompi".into(),
            log: "BPF program is too large. Processed 1000001 insn".into(),
            source: io::Error::from_raw_os_error(libc::E2BIG),
        };
        let text = refused.to_string();
        assert!(text.contains("refused by the kernel's verifier"), "{text}");
        assert!(!text.contains("6.6"), "{text}");
        assert!(text.ends_with("Processed 1000001 insn"), "{text}");
        assert!(refused.refused_by_verifier());
        let old_kernel = MultiError::Load {
            name: "sess_ompi".into(),
            log: String::new(),
            source: io::Error::from_raw_os_error(libc::EINVAL),
        };
        assert!(old_kernel
            .to_string()
            .contains("uprobe_multi needs Linux 6.6+"));
        assert!(!old_kernel.refused_by_verifier());
    }
}
