//! Loading the BPF programs and attaching them: for every probed library (once, whatever
//! the number of processes mapping it), one uprobe_multi link for the entries and one for
//! the returns of all its routines; the kernel filters to the watched processes.

pub mod btf;
mod counters;
mod multi;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::fd::{AsFd, AsRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, HashMap as BpfHashMap, Map, MapData, PerCpuHashMap, RingBuf},
    programs::TracePoint,
    Ebpf, EbpfLoader,
};
use collector_common::{
    routines::{class, ArgSpec, Family},
    watch, Abi, CallState, CommInfo, Config, Cookie, CounterKey, CounterVal, FabricRanges,
    FabricText, HandleKey, IdentityOffsets, Layout, ProcStats, TpOffsets, MAX_FABRIC_RANGES,
    MAX_LAYOUTS, ROUTINES,
};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::{
    discover::CgroupRef,
    symbols::{self, file::FileError, Library, LibraryFile, LibraryKind, Placement, ProbePoint},
};

/// The BPF object built by `build.rs` from `collector-ebpf`.
static BPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/collector.bpf.o"));

/// Errors loading or attaching probes.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The BPF object could not be loaded (privileges, kernel support, verifier).
    #[error("loading the BPF programs (commtap needs root or CAP_BPF+CAP_PERFMON)")]
    Load(#[source] Box<aya::EbpfError>),
    /// A map or program is missing from the object (a build mismatch).
    #[error("BPF object has no {0}")]
    Missing(&'static str),
    /// A map operation failed.
    #[error("BPF map {map}")]
    Map {
        /// Which map.
        map: &'static str,
        /// The cause.
        #[source]
        source: aya::maps::MapError,
    },
    /// The probe programs could not be loaded or attached.
    #[error(transparent)]
    Multi(#[from] multi::MultiError),
    /// A program could not be loaded or attached.
    #[error("BPF program {program}")]
    Program {
        /// Which program.
        program: &'static str,
        /// The cause.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// tracefs could not be mounted or read.
    #[error("tracefs: {0}")]
    Tracefs(String),
    /// The directory for pinned maps is not usable.
    #[error("state directory: {0}")]
    StateDir(String),
    /// commtap lacks the privileges BPF needs.
    #[error("{0}")]
    Privileges(String),
    /// Too many distinct MPI libraries.
    #[error("more than {MAX_LAYOUTS} distinct MPI libraries")]
    TooManyLibraries,
}

fn map_err(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> AttachError {
    move |source| AttachError::Map { map, source }
}

fn prog_err(program: &'static str) -> impl FnOnce(aya::programs::ProgramError) -> AttachError {
    move |source| AttachError::Program {
        program,
        source: Box::new(source),
    }
}

/// A library commtap has attached to, for the report's "probes" section.
#[derive(Debug, Serialize)]
pub struct AttachedLibrary {
    /// What was read from it.
    #[serde(flatten)]
    pub library: Library,
    /// Probe points that failed to attach, with the reason.
    pub failed: Vec<String>,
    /// Its file's device and inode.
    #[serde(skip)]
    dev_inode: (u64, u64),
    /// The user who owns the file, if not root and not asked for by commtap's caller:
    /// counted in that user's quota, let go once no process maps it.
    #[serde(skip)]
    owner: Option<u32>,
    /// Its uprobe_multi links; dropping them detaches every probe.
    #[serde(skip)]
    links: Vec<multi::MultiLink>,
    /// Let go (its slot is free for another library).
    #[serde(skip)]
    released: bool,
}

/// Most libraries owned by one user (not root) probed at once: one user's copies of a
/// library cannot take the slots every job of the node needs.
pub const MAX_LIBRARIES_PER_UID: usize = 8;

/// Loaded programs, their maps, and what is attached.
pub struct Probes {
    /// Owns the tracepoint links and the maps not taken out below.
    _ebpf: Ebpf,
    watched: BpfHashMap<MapData, u32, u32>,
    comms: BpfHashMap<MapData, HandleKey, CommInfo>,
    dtypes: BpfHashMap<MapData, HandleKey, u64>,
    config: Array<MapData, Config>,
    /// What `config` holds.
    settings: Config,
    layouts: Array<MapData, Layout>,
    counters: counters::Counters,
    device_time: PerCpuHashMap<MapData, CounterKey, CounterVal>,
    peers: PerCpuHashMap<MapData, collector_common::PeerKey, collector_common::PeerVal>,
    fabric_funcs: BpfHashMap<MapData, u64, u64>,
    fabric_text: Array<MapData, FabricText>,
    fabric_ranges: BpfHashMap<MapData, u32, FabricRanges>,
    proc_stats: PerCpuHashMap<MapData, u32, ProcStats>,
    events: Option<RingBuf<MapData>>,
    /// By (dev, inode): attached MPI libraries, or `None` for objects that are not MPI.
    seen: BTreeMap<(u64, u64), Option<usize>>,
    /// Libraries read (`is_fabric_file`) but not attached yet, with the open file they
    /// were read from (the probes go into that very file).
    read_ahead: BTreeMap<(u64, u64), (LibraryFile, Result<LibraryKind, symbols::SymbolError>)>,
    /// Attached libraries in attach order; the index is the library's layout slot.
    libraries: Vec<AttachedLibrary>,
    /// MPI libraries we saw but do not decode, with the reason.
    unsupported: Vec<String>,
    /// The MPI and NCCL probe programs, loaded for uprobe_multi links.
    programs: HashMap<String, OwnedFd>,
    /// Slots of libraries let go, for reuse.
    free_slots: Vec<usize>,
    /// The processes seen mapping each library (by slot).
    mapped_by: BTreeMap<usize, BTreeSet<u32>>,
    /// The task-local storage of in-flight calls (held by the programs too).
    _task_state: OwnedFd,
}

/// Options for loading.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Ring buffer size in bytes (a power of two, at least a page).
    pub ring_buffer_bytes: u32,
    /// A bpffs directory in which the counting maps are pinned, and reused if they are
    /// there: a restarted daemon carries on with the counts of the one before.
    pub state_dir: Option<PathBuf>,
}

/// The maps that carry a node's counts across a daemon restart (the others are refilled
/// at start, or hold per-run state such as library slots).
const KEPT_MAPS: [&str; 9] = [
    "WATCHED",
    "COUNTER_SLOTS",
    "COUNTER_VALUES",
    "FREE_SLOTS",
    "DEVICE_TIME",
    "PEERS",
    "PROC_STATS",
    "COMMS",
    "DTYPES",
];

/// `BPF_FS_MAGIC`, the file-system type of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The directory under `base` for this build's map layout: pinned maps of another layout
/// (an older commtap) are never reused.
pub fn state_dir_for_layout(base: &Path) -> PathBuf {
    let tag = format!(
        "layout-k{}-s{}-v{}-p{}-c{}-h{}-r{}-e{}",
        size_of::<CounterKey>(),
        collector_common::MAX_COUNTERS,
        size_of::<CounterVal>(),
        size_of::<ProcStats>(),
        size_of::<CommInfo>(),
        size_of::<HandleKey>(),
        ROUTINES.len(),
        size_of::<collector_common::PeerKey>()
    );
    base.join(tag)
}

/// Creates `dir` and checks it is on a bpffs, where maps can be pinned (mounting bpffs on
/// /sys/fs/bpf first if nothing is mounted there, as systemd does at boot).
pub fn prepare_state_dir(dir: &Path) -> Result<(), AttachError> {
    let bpffs = Path::new("/sys/fs/bpf");
    if dir.starts_with(bpffs) && fs_type(bpffs) != Some(BPF_FS_MAGIC) {
        // SAFETY: mount(2) with static NUL-terminated strings.
        let rc = unsafe {
            libc::mount(
                c"bpf".as_ptr(),
                c"/sys/fs/bpf".as_ptr(),
                c"bpf".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(AttachError::StateDir(format!(
                "mounting bpffs on /sys/fs/bpf: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| AttachError::StateDir(format!("creating {}: {e}", dir.display())))?;
    if fs_type(dir) != Some(BPF_FS_MAGIC) {
        return Err(AttachError::StateDir(format!(
            "{} is not on a bpf file system (mount -t bpf bpf /sys/fs/bpf)",
            dir.display()
        )));
    }
    Ok(())
}

/// Unpins the kept maps in `dir` and removes it (and its parent, if that is left empty).
pub fn remove_state_dir(dir: &Path) {
    for map in KEPT_MAPS {
        let _ = std::fs::remove_file(dir.join(map));
    }
    let _ = std::fs::remove_dir(dir);
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_dir(parent);
    }
}

/// Whether `path` is a mounted bpffs.
pub fn is_bpffs(path: &Path) -> bool {
    fs_type(path) == Some(BPF_FS_MAGIC)
}

/// The file-system type (`statfs.f_type`) of `path`.
fn fs_type(path: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs(2) into a zeroed struct with a valid path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

impl LoadOptions {
    /// Options for a ring buffer of about `kib` KiB (rounded up to a power of two, at
    /// least one page).
    pub fn with_ring_buffer_kib(kib: u32) -> LoadOptions {
        LoadOptions {
            ring_buffer_bytes: (kib.clamp(4, 1 << 20) * 1024).next_power_of_two(),
            state_dir: None,
        }
    }
}

impl Probes {
    /// Loads the programs, fills the routine table and attaches the process tracepoints.
    pub fn load(opts: LoadOptions) -> Result<Probes, AttachError> {
        if BPF_OBJECT.is_empty() {
            return Err(AttachError::Missing(
                "BPF programs: this commtap was built with COMMTAP_SKIP_BPF_BUILD set",
            ));
        }
        bump_memlock_rlimit();
        let mut loader = EbpfLoader::new();
        let pins: Vec<(&str, PathBuf)> = match &opts.state_dir {
            Some(dir) => {
                prepare_state_dir(dir)?;
                KEPT_MAPS.iter().map(|m| (*m, dir.join(m))).collect()
            }
            None => Vec::new(),
        };
        for (map, path) in &pins {
            loader.map_pin_path(map, path.as_path());
        }
        let mut ebpf = loader
            .map_max_entries("EVENTS", opts.ring_buffer_bytes)
            .load(BPF_OBJECT)
            .map_err(|e| AttachError::Load(Box::new(e)))?;
        // Before any map is taken out of `ebpf`: the programs are relocated against them all,
        // with the task-storage map we create standing in for the object's placeholder.
        let task_state = multi::create_task_storage(size_of::<CallState>() as u32)?;
        let mut fds = map_fds(&ebpf);
        fds.insert("TASK_STATE".to_string(), task_state.as_raw_fd());
        let programs = multi::load_programs(BPF_OBJECT, &fds, &PROBE_PROGRAMS)?;

        let mut specs: Array<MapData, ArgSpec> =
            Array::try_from(take(&mut ebpf, "ROUTINE_SPECS")?).map_err(map_err("ROUTINE_SPECS"))?;
        for (i, r) in ROUTINES.iter().enumerate() {
            specs
                .set(i as u32, r.spec, 0)
                .map_err(map_err("ROUTINE_SPECS"))?;
        }
        let mut identity: Array<MapData, IdentityOffsets> =
            Array::try_from(take(&mut ebpf, "IDENTITY_OFFSETS")?)
                .map_err(map_err("IDENTITY_OFFSETS"))?;
        match btf::identity_offsets() {
            Ok(offsets) => identity
                .set(0, offsets, 0)
                .map_err(map_err("IDENTITY_OFFSETS"))?,
            // Processes are then known by their /proc entries only (a rank that exits at
            // once may lose its rank and job).
            Err(e) => warn!("no identity events: {e:#}"),
        }
        let mut tp: Array<MapData, TpOffsets> =
            Array::try_from(take(&mut ebpf, "TP_OFFSETS")?).map_err(map_err("TP_OFFSETS"))?;
        tp.set(0, tracepoint_offsets()?, 0)
            .map_err(map_err("TP_OFFSETS"))?;

        for (prog, event) in [
            ("sched_fork", "sched_process_fork"),
            ("sched_exec", "sched_process_exec"),
            ("sched_exit", "sched_process_exit"),
        ] {
            let p: &mut TracePoint = ebpf
                .program_mut(prog)
                .ok_or(AttachError::Missing("tracepoint program"))?
                .try_into()
                .map_err(prog_err("tracepoint"))?;
            p.load().map_err(prog_err("tracepoint"))?;
            p.attach("sched", event).map_err(prog_err("tracepoint"))?;
        }
        Ok(Probes {
            watched: BpfHashMap::try_from(take(&mut ebpf, "WATCHED")?)
                .map_err(map_err("WATCHED"))?,
            comms: BpfHashMap::try_from(take(&mut ebpf, "COMMS")?).map_err(map_err("COMMS"))?,
            dtypes: BpfHashMap::try_from(take(&mut ebpf, "DTYPES")?).map_err(map_err("DTYPES"))?,
            config: Array::try_from(take(&mut ebpf, "CONFIG")?).map_err(map_err("CONFIG"))?,
            settings: Config {
                self_tgid: std::process::id(),
                uid: Config::ANY_UID,
                ..Config::default()
            },
            layouts: Array::try_from(take(&mut ebpf, "LAYOUTS")?).map_err(map_err("LAYOUTS"))?,
            counters: counters::Counters::take_from(&mut ebpf)?,
            device_time: PerCpuHashMap::try_from(take(&mut ebpf, "DEVICE_TIME")?)
                .map_err(map_err("DEVICE_TIME"))?,
            peers: PerCpuHashMap::try_from(take(&mut ebpf, "PEERS")?).map_err(map_err("PEERS"))?,
            fabric_funcs: BpfHashMap::try_from(take(&mut ebpf, "FABRIC_FUNCS")?)
                .map_err(map_err("FABRIC_FUNCS"))?,
            fabric_text: Array::try_from(take(&mut ebpf, "FABRIC_TEXT")?)
                .map_err(map_err("FABRIC_TEXT"))?,
            fabric_ranges: BpfHashMap::try_from(take(&mut ebpf, "FABRIC_RANGES")?)
                .map_err(map_err("FABRIC_RANGES"))?,
            proc_stats: PerCpuHashMap::try_from(take(&mut ebpf, "PROC_STATS")?)
                .map_err(map_err("PROC_STATS"))?,
            events: Some(RingBuf::try_from(take(&mut ebpf, "EVENTS")?).map_err(map_err("EVENTS"))?),
            _ebpf: ebpf,
            seen: BTreeMap::new(),
            read_ahead: BTreeMap::new(),
            libraries: Vec::new(),
            unsupported: Vec::new(),
            programs,
            free_slots: Vec::new(),
            mapped_by: BTreeMap::new(),
            _task_state: task_state,
        })
    }

    /// Hands the ring buffer to the ingest loop (once).
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    /// Starts counting `pid`'s calls; with `descendants`, also those of its future children.
    pub fn watch(&mut self, pid: u32, descendants: bool) -> Result<(), AttachError> {
        let flags = watch::COUNT | if descendants { watch::DESCENDANTS } else { 0 };
        self.watched
            .insert(pid, flags, 0)
            .map_err(map_err("WATCHED"))
    }

    /// Makes every process `me` forks from now on watched (with its descendants), without
    /// counting `me` itself.
    pub fn watch_descendants_of_self(&mut self, me: u32) -> Result<(), AttachError> {
        self.watched
            .insert(me, watch::DESCENDANTS, 0)
            .map_err(map_err("WATCHED"))
    }

    /// Forgets `pid` (used to stop following commtap's own children).
    pub fn unwatch(&mut self, pid: u32) {
        let _ = self.watched.remove(&pid);
        // Threads with call state check again whether their process is counted.
        self.counters.bump_generation();
    }

    /// Stops counting `pid` for good: unlike [`Probes::unwatch`], watch-all mode does not
    /// take it up again (until [`Probes::unwatch`] or [`Probes::watch`]).
    pub fn ignore(&mut self, pid: u32) -> Result<(), AttachError> {
        self.watched.insert(pid, 0, 0).map_err(map_err("WATCHED"))?;
        // Threads with call state check again whether their process is counted.
        self.counters.bump_generation();
        Ok(())
    }

    /// Whether the kernel still counts `pid` (false once it exited).
    pub fn is_watched(&self, pid: u32) -> bool {
        self.watched.get(&pid, 0).is_ok()
    }

    /// Counts every process that calls a probed MPI library (but commtap itself), not only
    /// the watched ones, optionally only those of user `uid` and in (or below) cgroup `cg`:
    /// how a node daemon sees jobs from their first call.
    pub fn set_watch_all(
        &mut self,
        uid: Option<u32>,
        cg: Option<&CgroupRef>,
    ) -> Result<(), AttachError> {
        self.settings.watch_all = 1;
        self.settings.uid = uid.unwrap_or(Config::ANY_UID);
        self.settings.cgroup_level = cg.map_or(0, |c| c.level);
        self.settings.cgroup_id = cg.map_or(0, |c| c.id);
        self.write_settings()
    }

    /// Turns the per-call events (latency, timelines) on or off; counts never depend on them.
    pub fn set_call_events(&mut self, on: bool) -> Result<(), AttachError> {
        self.set_events(Config::EVENTS_ALL, on)
    }

    /// Turns the events of collective calls and communicator constructors (who is late) on
    /// or off; they are a subset of all call events, and cheaper where collectives are few.
    pub fn set_collective_events(&mut self, on: bool) -> Result<(), AttachError> {
        self.set_events(Config::EVENTS_COLLECTIVE, on)
    }

    fn set_events(&mut self, bit: u32, on: bool) -> Result<(), AttachError> {
        if on {
            self.settings.call_events |= bit;
        } else {
            self.settings.call_events &= !bit;
        }
        self.write_settings()
    }

    /// Whether an event is emitted for every call.
    pub fn call_events(&self) -> bool {
        self.settings.call_events & Config::EVENTS_ALL != 0
    }

    fn write_settings(&mut self) -> Result<(), AttachError> {
        self.config
            .set(0, self.settings, 0)
            .map_err(map_err("CONFIG"))
    }

    /// Removes everything the kernel keeps of `pid` (counters, learnt handles), once its
    /// final profile is taken: a later process with the same pid starts from zero.
    pub fn forget_process(&mut self, pid: u32) {
        self.counters.forget(pid);
        let keys: Vec<CounterKey> = self
            .device_time
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.tgid == pid)
            .collect();
        for k in keys {
            let _ = self.device_time.remove(&k);
        }
        let keys: Vec<collector_common::PeerKey> = self
            .peers
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.tgid == pid)
            .collect();
        for k in keys {
            let _ = self.peers.remove(&k);
        }
        let _ = self.proc_stats.remove(&pid);
        let _ = self.fabric_ranges.remove(&pid);
        remove_handles_of(&mut self.comms, pid);
        remove_handles_of(&mut self.dtypes, pid);
        let mut unused = Vec::new();
        for (slot, pids) in &mut self.mapped_by {
            if pids.remove(&pid) && pids.is_empty() {
                unused.push(*slot);
            }
        }
        for slot in unused {
            self.mapped_by.remove(&slot);
            self.release(slot);
        }
    }

    /// Notes that `pid` maps the library `dev_inode` (if it is probed).
    pub fn note_mapped(&mut self, dev_inode: (u64, u64), pid: u32) {
        if let Some(Some(slot)) = self.seen.get(&dev_inode) {
            self.mapped_by.entry(*slot).or_default().insert(pid);
        }
    }

    /// Lets a user's library go once no process maps it: its probes detached, its slot
    /// free, and read again should a process map it later. Shared libraries stay.
    fn release(&mut self, slot: usize) {
        let Some(lib) = self.libraries.get_mut(slot) else {
            return;
        };
        if lib.owner.is_none() || lib.released {
            return;
        }
        info!(
            "letting {} go: no process maps it any more",
            lib.library.path
        );
        lib.links.clear();
        lib.released = true;
        self.seen.remove(&lib.dev_inode);
        self.free_slots.push(slot);
    }

    /// Tells the kernel what the launcher says of `pid`'s world communicator (integer-handle
    /// ABIs learn other communicators from MPI_Comm_size / MPI_Comm_rank).
    pub fn seed_world(&mut self, pid: u32, size: u32, rank: u32) {
        let key = HandleKey {
            tgid: pid,
            _pad: 0,
            handle: collector_common::mpich::COMM_WORLD,
        };
        let _ = self
            .comms
            .insert(key, CommInfo::new(size, rank as i32, 0), 0);
    }

    /// Attaches to the library `dev_inode` unless already done, opening it with `open` if
    /// it was never read; `shared` when commtap's caller asked for it (never let go, in no
    /// user's quota). Returns whether it is an MPI or NCCL library now probed.
    pub fn attach_library(
        &mut self,
        dev_inode: (u64, u64),
        shared: bool,
        open: impl FnOnce() -> Result<LibraryFile, FileError>,
    ) -> Result<bool, AttachError> {
        if let Some(state) = self.seen.get(&dev_inode) {
            return Ok(state.is_some_and(|i| self.libraries[i].library.family != Family::Cuda));
        }
        let (file, read) = match self.read_ahead.remove(&dev_inode) {
            Some(r) => r,
            None => match open() {
                Ok(file) => {
                    let read = symbols::read_library(&file);
                    (file, read)
                }
                Err(e) => {
                    // Not marked seen: another process may map it where it can be opened.
                    debug!("not probing: {e:#}");
                    return Ok(false);
                }
            },
        };
        let lib = match read {
            Ok(LibraryKind::Probed(lib)) => lib,
            Ok(LibraryKind::Unsupported(why)) => {
                warn!("{why}");
                self.unsupported.push(why);
                self.seen.insert(dev_inode, None);
                return Ok(false);
            }
            Ok(LibraryKind::Other) => {
                self.seen.insert(dev_inode, None);
                return Ok(false);
            }
            Err(e) => {
                debug!("not probing {}: {e}", file.shown);
                self.seen.insert(dev_inode, None);
                return Ok(false);
            }
        };
        let owner = (!shared && file.owner != 0).then_some(file.owner);
        if let Some(uid) = owner {
            let held = self.libraries().filter(|l| l.owner == Some(uid)).count();
            if held >= MAX_LIBRARIES_PER_UID {
                let why = format!(
                    "{}: user {uid} has {held} libraries of their own probed already \
                     (at most {MAX_LIBRARIES_PER_UID}): not probed",
                    file.shown
                );
                warn!("{why}");
                self.unsupported.push(why);
                self.seen.insert(dev_inode, None);
                return Ok(false);
            }
        }
        let index = self.free_slots.pop().unwrap_or(self.libraries.len());
        let slot = index as u32;
        if slot >= MAX_LAYOUTS {
            return Err(AttachError::TooManyLibraries);
        }
        self.layouts
            .set(slot, lib.layout, 0)
            .map_err(map_err("LAYOUTS"))?;
        if lib.abi == Abi::Fabric {
            // Where calls from libfabric's own code come from (see collector-ebpf's fabric).
            let (lo, hi) = lib.text;
            self.fabric_text
                .set(slot, FabricText { lo, hi }, 0)
                .map_err(map_err("FABRIC_TEXT"))?;
            for p in &lib.probes {
                let id = Cookie {
                    routine: p.routine,
                    layout: slot as u8,
                    abi: Abi::Fabric as u8,
                    function: p.function,
                    skip: p.skip,
                }
                .fabric_function();
                self.fabric_funcs
                    .insert(id, p.vaddr, 0)
                    .map_err(map_err("FABRIC_FUNCS"))?;
            }
        }
        let (links, failed) = self.attach_links(&lib, slot, &file)?;
        let single = lib
            .probes
            .iter()
            .filter(|p| p.placement == Placement::SingleStepped)
            .count();
        let skipped = lib
            .probes
            .iter()
            .filter(|p| p.placement == Placement::MovedPastSingleStep)
            .count();
        info!(
            "probing {} ({}): {} routines, {skipped} moved past a single-stepped first instruction, {single} single-stepped, {} failed",
            lib.path,
            lib.flavor,
            lib.probes.len(),
            failed.len()
        );
        let attached = AttachedLibrary {
            library: lib,
            failed,
            dev_inode,
            owner,
            links,
            released: false,
        };
        let counted = attached.library.family != Family::Cuda;
        if index < self.libraries.len() {
            self.libraries[index] = attached;
        } else {
            self.libraries.push(attached);
        }
        self.seen.insert(dev_inode, Some(index));
        Ok(counted)
    }

    /// The uprobe_multi links of `lib` in layout `slot` (one per program and kind of
    /// probe point), attached through the open `file`; and the failures, by message.
    fn attach_links(
        &self,
        lib: &Library,
        slot: u32,
        file: &LibraryFile,
    ) -> Result<(Vec<multi::MultiLink>, Vec<String>), AttachError> {
        let mut links = Vec::new();
        let mut failed = Vec::new();
        let cookie = |p: &ProbePoint| {
            Cookie {
                routine: p.routine,
                layout: slot as u8,
                abi: lib.abi as u8,
                function: p.function,
                skip: p.skip,
            }
            .pack()
        };
        // libfabric's fi_fabric has its own program (it names the provider), without return.
        let (open, all): (Vec<&ProbePoint>, Vec<&ProbePoint>) = lib
            .probes
            .iter()
            .partition(|p| p.routine == collector_common::routines::FABRIC_OPEN);
        let entry = if lib.abi == Abi::Fabric {
            "fabric_entry"
        } else {
            "call_entry"
        };
        let mut groups = vec![("fabric_open", false, open), (entry, false, all.clone())];
        match lib.abi {
            Abi::Fabric => groups.push(("fabric_return", true, all)),
            Abi::OpenMpi => groups.push(("mpi_return_ompi", true, all)),
            Abi::Nccl => groups.push(("nccl_return", true, all)),
            Abi::Mpich => {
                // Datatype constructors have their own return program (they learn sizes).
                let (types, rest): (Vec<&ProbePoint>, Vec<&ProbePoint>) = all
                    .into_iter()
                    .partition(|p| ROUTINES[p.routine as usize].spec.class == class::DATATYPE);
                groups.push(("mpi_return_mpich", true, rest));
                groups.push(("mpi_return_mpich_types", true, types));
            }
        }
        // Returns before entries: a call that enters between the two attachments would
        // otherwise leave its thread marked busy for good (its return never seen), and
        // every later call of the thread would be taken for a nested one and not counted.
        // The other way round, such a call's return comes without an entry: counted as
        // in flight at attach.
        groups.sort_by_key(|(_, is_return, _)| !*is_return);
        for (prog, is_return, points) in groups {
            if points.is_empty() {
                continue;
            }
            let offsets: Vec<u64> = points.iter().map(|p| p.offset).collect();
            let cookies: Vec<u64> = points.iter().map(|p| cookie(p)).collect();
            let fd = self
                .programs
                .get(prog)
                .ok_or(AttachError::Missing("probe program"))?;
            match multi::attach(fd.as_fd(), file, &offsets, &cookies, is_return) {
                Ok(link) => links.push(link),
                Err(e) => failed.push(format!("{e:#}")),
            }
        }
        // Dropped in order: entries first, for the same reason.
        links.reverse();
        Ok((links, failed))
    }

    /// Whether a decision was made on the object `dev_inode` (probed, or not to be), or it
    /// was read already.
    pub fn knows(&self, dev_inode: (u64, u64)) -> bool {
        self.seen.contains_key(&dev_inode) || self.read_ahead.contains_key(&dev_inode)
    }

    /// Keeps a library read elsewhere (off the session's lock) for `attach_library`.
    pub fn read_ahead(
        &mut self,
        dev_inode: (u64, u64),
        file: LibraryFile,
        read: Result<LibraryKind, symbols::SymbolError>,
    ) {
        if !self.knows(dev_inode) {
            self.read_ahead.insert(dev_inode, (file, read));
        }
    }

    /// Whether the object `dev_inode` is a libfabric library or provider that commtap
    /// probes (opened with `open` and read now if it was not, and kept for
    /// `attach_library`).
    pub fn is_fabric_file(
        &mut self,
        dev_inode: (u64, u64),
        open: impl FnOnce() -> Result<LibraryFile, FileError>,
    ) -> bool {
        if let Some(state) = self.seen.get(&dev_inode) {
            return matches!(state, Some(i) if self.libraries[*i].library.abi == Abi::Fabric);
        }
        let read = match self.read_ahead.entry(dev_inode) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let Ok(file) = open() else {
                    return false;
                };
                let read = symbols::read_library(&file);
                e.insert((file, read))
            }
        };
        matches!(&read.1, Ok(LibraryKind::Probed(lib)) if lib.abi == Abi::Fabric)
    }

    /// Tells the kernel where `pid` has libfabric's code (libfabric and provider DSOs), so
    /// that calls one provider makes to another are known as libfabric's own. Beyond
    /// `MAX_FABRIC_RANGES` the rest is left out (a warning says so).
    pub fn set_fabric_ranges(&mut self, pid: u32, code: &[(u64, u64)]) -> Result<(), AttachError> {
        if code.is_empty() {
            return Ok(());
        }
        let mut r = FabricRanges::default();
        for (i, &(lo, hi)) in code.iter().take(MAX_FABRIC_RANGES).enumerate() {
            r.ranges[i] = FabricText { lo, hi };
            r.n = i as u32 + 1;
        }
        if code.len() > MAX_FABRIC_RANGES {
            warn!(
                "PID {pid}: {} libfabric code mappings, {MAX_FABRIC_RANGES} kept: calls from the others count as the application's",
                code.len()
            );
        }
        self.fabric_ranges
            .insert(pid, r, 0)
            .map_err(map_err("FABRIC_RANGES"))
    }

    /// The probed library that is the object `dev_inode`, if any.
    pub fn library_of(&self, dev_inode: (u64, u64)) -> Option<&symbols::Library> {
        let i = (*self.seen.get(&dev_inode)?)?;
        Some(&self.libraries[i].library)
    }

    /// Libraries probed now (not those let go).
    pub fn libraries(&self) -> impl Iterator<Item = &AttachedLibrary> {
        self.libraries.iter().filter(|l| !l.released)
    }

    /// Libraries seen but not decoded (an unknown MPI ABI, NCCL without symbols).
    pub fn unsupported(&self) -> &[String] {
        &self.unsupported
    }

    /// Ground-truth counters, summed over CPUs.
    pub fn read_counters(&self) -> Vec<(CounterKey, CounterVal)> {
        self.counters.read()
    }

    /// NCCL device-time windows per operation key, summed over CPUs.
    pub fn read_device_time(&self) -> Vec<(CounterKey, CounterVal)> {
        sum_over_cpus(&self.device_time)
    }

    /// The per-peer point-to-point counters, summed over CPUs.
    pub fn read_peers(&self) -> Vec<(collector_common::PeerKey, collector_common::PeerVal)> {
        self.peers
            .iter()
            .filter_map(Result::ok)
            .map(|(k, per_cpu)| {
                let mut v = collector_common::PeerVal::default();
                for c in per_cpu.iter() {
                    v.calls += c.calls;
                    v.bytes += c.bytes;
                }
                (k, v)
            })
            .collect()
    }

    /// Health counters of `pid`, summed (marks: the latest) over CPUs.
    pub fn read_proc_stats(&self, pid: u32) -> ProcStats {
        let mut s = ProcStats::default();
        if let Ok(per_cpu) = self.proc_stats.get(&pid, 0) {
            for v in per_cpu.iter() {
                s.events_dropped += v.events_dropped;
                s.undecoded += v.undecoded;
                s.nested += v.nested;
                s.orphan_returns += v.orphan_returns;
                s.counters_full += v.counters_full;
                s.group_ops += v.group_ops;
                s.mixed_windows += v.mixed_windows;
                s.fabric_failed += v.fabric_failed;
                s.fabric_internal += v.fabric_internal;
                s.net_unposted += v.net_unposted;
                s.peers_full += v.peers_full;
                s.init_ns = s.init_ns.max(v.init_ns);
                s.finalize_ns = s.finalize_ns.max(v.finalize_ns);
            }
        }
        s
    }
}

/// Capabilities commtap needs, by bit number in `CapEff`: each entry is met by any one of
/// its alternatives. Without CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH other users' processes
/// would go unseen, without a word; opening a mapped library through `/proc/PID/map_files`
/// takes CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN, which also covers it).
const NEEDED_CAPS: &[&[(u32, &str)]] = &[
    &[(38, "CAP_PERFMON")],
    &[(39, "CAP_BPF")],
    &[(19, "CAP_SYS_PTRACE")],
    &[(2, "CAP_DAC_READ_SEARCH")],
    &[(40, "CAP_CHECKPOINT_RESTORE"), (21, "CAP_SYS_ADMIN")],
];

/// Fails early, with a message that says what to do, when BPF cannot be used.
pub fn check_privileges() -> Result<(), AttachError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let names = |alternatives: &[(u32, &str)]| {
        alternatives
            .iter()
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let missing: Vec<String> = NEEDED_CAPS
        .iter()
        .filter(|alternatives| alternatives.iter().all(|(bit, _)| eff & (1 << bit) == 0))
        .map(|alternatives| names(alternatives))
        .collect();
    if !missing.is_empty() {
        return Err(AttachError::Privileges(format!(
            "commtap needs root (or {}) to load BPF programs, attach uprobes and open the libraries processes map; missing: {}. Run it with sudo, or as the commtap systemd service.",
            NEEDED_CAPS.iter().map(|a| names(a)).collect::<Vec<_>>().join(" + "),
            missing.join(", ")
        )));
    }
    Ok(())
}

/// Removes every entry of process `pid` from a map keyed by (process, handle).
fn remove_handles_of<V: aya::Pod>(map: &mut BpfHashMap<MapData, HandleKey, V>, pid: u32) {
    let keys: Vec<HandleKey> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| k.tgid == pid)
        .collect();
    for k in keys {
        let _ = map.remove(&k);
    }
}

/// The programs attached through uprobe_multi links.
const PROBE_PROGRAMS: [&str; 8] = [
    "call_entry",
    "mpi_return_ompi",
    "mpi_return_mpich",
    "mpi_return_mpich_types",
    "nccl_return",
    "fabric_entry",
    "fabric_return",
    "fabric_open",
];

/// File descriptors of the maps aya created, by name, to relocate the MPI programs against.
fn map_fds(ebpf: &Ebpf) -> HashMap<String, RawFd> {
    ebpf.maps()
        .filter_map(|(name, map)| {
            let data = match map {
                Map::Array(d)
                | Map::HashMap(d)
                | Map::LruHashMap(d)
                | Map::PerCpuHashMap(d)
                | Map::PerCpuArray(d)
                | Map::Stack(d)
                | Map::RingBuf(d) => d,
                _ => return None,
            };
            Some((name.to_string(), data.fd().as_fd().as_raw_fd()))
        })
        .collect()
}

fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, AttachError> {
    ebpf.take_map(name).ok_or(AttachError::Missing(name))
}

/// Ring buffers and maps are charged to the locked-memory limit on older kernels.
fn bump_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        debug!("could not raise RLIMIT_MEMLOCK");
    }
}

const TRACEFS: &str = "/sys/kernel/tracing";

/// Reads this kernel's tracepoint field offsets, mounting tracefs if needed.
fn tracepoint_offsets() -> Result<TpOffsets, AttachError> {
    let events = PathBuf::from(TRACEFS).join("events");
    if !events.exists() {
        let src = c"nodev";
        let target = c"/sys/kernel/tracing";
        let fstype = c"tracefs";
        // SAFETY: valid C strings; mounting tracefs at its standard place.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(AttachError::Tracefs(format!(
                "not mounted and mount failed: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    let field = |event: &str, name: &str| -> Result<Option<u32>, AttachError> {
        let path = events.join("sched").join(event).join("format");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| AttachError::Tracefs(format!("{}: {e}", path.display())))?;
        Ok(text.lines().find_map(|l| {
            let decl = l.split("field:").nth(1)?.split(';').next()?;
            if decl.split_whitespace().last()? != name {
                return None;
            }
            l.split("offset:")
                .nth(1)?
                .split(';')
                .next()?
                .trim()
                .parse()
                .ok()
        }))
    };
    let need = |event: &str, name: &str| {
        field(event, name)?
            .ok_or_else(|| AttachError::Tracefs(format!("{event} has no field {name}")))
    };
    Ok(TpOffsets {
        fork_parent_pid: need("sched_process_fork", "parent_pid")?,
        fork_child_pid: need("sched_process_fork", "child_pid")?,
        exit_group_dead: field("sched_process_exit", "group_dead")?.unwrap_or(u32::MAX),
        _pad: 0,
    })
}

/// A per-CPU counter map's values, summed over CPUs.
fn sum_over_cpus(
    map: &PerCpuHashMap<MapData, CounterKey, CounterVal>,
) -> Vec<(CounterKey, CounterVal)> {
    map.iter()
        .filter_map(Result::ok)
        .map(|(k, per_cpu)| (k, counters::sum(per_cpu.iter())))
        .collect()
}
