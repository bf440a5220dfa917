//! Loading the BPF programs and attaching them: for every probed library (once, whatever
//! the number of processes mapping it), one uprobe_multi link for the entries and one for
//! the returns of all its routines; the kernel filters to the watched processes.

pub mod btf;
mod counters;
mod inflight;
pub use inflight::{InProgress, Unseen, CALL_STATES_READ};
pub use multi::thread_registers;
mod library;
mod multi;
mod peers;
mod programs;
#[cfg(test)]
mod stack_depth;
pub mod state;
pub mod system;
mod watched;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd},
    path::PathBuf,
};

use aya::{
    maps::{Array, HashMap as BpfHashMap, Map, MapData, PerCpuHashMap, RingBuf},
    programs::{trace_point::TracePointLink, TracePoint},
    Ebpf, EbpfLoader,
};
use collector_common::{
    instances, launcher, names, one_in,
    routines::{self, ArgSpec},
    shares::{subuid_table, Held, SharedMap, SubuidRange, SHARED_MAPS, SUBUID_SECOND_TABLE},
    watch, CallState, CommInfo, Config, CounterKey, CounterVal, FabricRanges, FabricText,
    HandleKey, IdentityOffsets, Layout, ProcStats, TpOffsets, MAX_LAYOUTS, ROUTINES,
};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::{
    discover::{accounts::Accounts, cgroup::CgroupRef, directory::Directory},
    symbols::{self, Library, LibraryFile, LibraryKind},
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
    /// A cgroup v1 limit the programs cannot check.
    #[error("cannot limit counting to a cgroup of the {0} controller's v1 hierarchy: this kernel's BTF does not say where its structures keep a process's cgroup")]
    CgroupV1(String),
    /// Too many distinct MPI libraries.
    #[error("more than {MAX_LAYOUTS} distinct MPI libraries")]
    TooManyLibraries,
    /// The kernel's run-time statistics of BPF programs could not be turned on.
    #[error("turning on BPF run-time statistics (BPF_ENABLE_STATS)")]
    RunStats(#[source] std::io::Error),
    /// Descriptors of the maps could not be kept for the programs loaded later.
    #[error("keeping the BPF maps open for the programs loaded later")]
    MapDescriptors(#[source] std::io::Error),
}

impl AttachError {
    /// Whether the kernel's verifier refused one of the probe programs.
    pub fn refused_by_verifier(&self) -> bool {
        matches!(self, AttachError::Multi(m) if m.refused_by_verifier())
    }
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
    /// The user who owns the file (for a sub-uid, the user given it), if not root and not
    /// asked for by commtap's caller: counted in that user's quota, let go once no process
    /// maps it.
    #[serde(skip)]
    owner: Option<u32>,
    /// Its uprobe_multi links; dropping them detaches every probe.
    #[serde(skip)]
    links: Vec<multi::MultiLink>,
    /// Let go (its slot is free for another library).
    #[serde(skip)]
    released: bool,
    /// Probed through uprobe sessions (else an entry and a return probe per routine).
    #[serde(skip)]
    pub through_sessions: bool,
}

/// How long pausing at library loads lasts unless renewed (commtap renews it several times
/// a second while it handles the pauses).
pub const PAUSE_LEASE: std::time::Duration = std::time::Duration::from_secs(2);

/// Most libraries owned by one user (not root) probed at once: one user's copies of a
/// library cannot take the slots every job of the node needs.
pub const MAX_LIBRARIES_PER_UID: usize = 8;

/// Most Fortran bindings libraries owned by one user probed at once (apart from
/// [`MAX_LIBRARIES_PER_UID`]: a user's own MPI build has two or three beside its library).
pub const MAX_BINDINGS_PER_UID: usize = 4;

/// Loaded programs, their maps, and what is attached.
pub struct Probes {
    /// Owns the tracepoint links and the maps not taken out below.
    _ebpf: Ebpf,
    watched: watched::WatchedSet,
    comms: BpfHashMap<MapData, HandleKey, CommInfo>,
    /// Per process and communicator: the number its next collective takes.
    coll_seq: BpfHashMap<MapData, HandleKey, u64>,
    /// How often each process freed each communicator handle (`generations`).
    comm_frees: BpfHashMap<MapData, HandleKey, u64>,
    dtypes: BpfHashMap<MapData, HandleKey, u64>,
    persistent: BpfHashMap<MapData, HandleKey, collector_common::PersistentOp>,
    config: Array<MapData, Config>,
    /// Per routine id: time one call in N (sampled time).
    time_one_in: Array<MapData, u32>,
    /// What `time_one_in` holds, for the routines whose N is above 1.
    sampled: BTreeMap<u16, u32>,
    /// Per process and routine: its own N (`one_in::PER_PROCESS`).
    process_one_in: BpfHashMap<MapData, u64, u32>,
    /// What `process_one_in` holds.
    process_sampled: BTreeMap<(u32, u16), u32>,
    /// What `config` holds.
    settings: Config,
    /// Processes whose collectives' counts were stopped ([`Probes::unwatch`],
    /// [`Probes::ignore`]): swept again if watched again (see [`Probes::watch`]).
    numbering_stopped: std::collections::HashSet<u32>,
    layouts: Array<MapData, Layout>,
    counters: counters::Counters,
    device_time: PerCpuHashMap<MapData, CounterKey, CounterVal>,
    peers: peers::PeerCounters,
    sites: PerCpuHashMap<MapData, collector_common::SiteKey, collector_common::SiteVal>,
    fabric_funcs: BpfHashMap<MapData, u64, u64>,
    fabric_text: Array<MapData, FabricText>,
    fabric_ranges: BpfHashMap<MapData, u32, FabricRanges>,
    mpi_components: BpfHashMap<MapData, u32, collector_common::ComponentAddrs>,
    proc_stats: PerCpuHashMap<MapData, u32, ProcStats>,
    /// Each user's share of the maps its processes grow: charged by the kernel, given back
    /// here when a process is forgotten (`collector_common::shares`).
    shares: Shares,
    /// Processes paused at a library load, not yet continued (see [`Probes::resume`]).
    paused: BpfHashMap<MapData, u32, u64>,
    /// The dynamic linkers' probes (`linker_loaded`) by (dev, inode): the system's, placed
    /// at start where it could be, and programs' own, placed as they exec.
    linkers: BTreeMap<(u64, u64), HookedLinker>,
    /// Pausing at library loads is wanted (and possible).
    pause_at_load: bool,
    /// The kernel's offsets into a task are known (without them nobody is paused).
    identity_known: bool,
    /// When the last program load ended (monotonic ns): a process paused while programs
    /// were verified is not overdue before that.
    programs_loaded_ns: u64,
    /// How long pausing lasts unless renewed.
    pause_lease: std::time::Duration,
    /// Programs being verified ahead of a launched job's first load (`prefetch_programs`).
    prefetch: Option<programs::PendingLoad>,
    /// Whether transports' libraries (libfabric, UCX) are probed.
    transports: bool,
    /// Whose each uid is (a sub-uid: the user given it), for the caps on a user's own
    /// libraries and linkers and the kernel's shares (`SUBUIDS`, in the table
    /// `settings.subuid_ranges` names), and where that is read from.
    accounts: Accounts,
    /// Asked for the names `/etc/passwd` lacks, off the loop.
    users: Directory,
    subuids: Array<MapData, SubuidRange>,
    /// The ranges the kernel side was last given (none until they were all written).
    subuids_written: Vec<SubuidRange>,
    subuid_file: PathBuf,
    events: Option<RingBuf<MapData>>,
    /// By (dev, inode): what was decided on each object mapped (probed, or not and on
    /// which contents).
    seen: BTreeMap<(u64, u64), library::Decided>,
    /// Libraries read (`is_fabric_file`) but not attached yet, with the open file they
    /// were read from (the probes go into that very file).
    read_ahead: BTreeMap<(u64, u64), (LibraryFile, Result<LibraryKind, symbols::SymbolError>)>,
    /// Attached libraries in attach order; the index is the library's layout slot.
    libraries: Vec<AttachedLibrary>,
    /// MPI libraries we saw but do not decode, with the reason.
    unsupported: library::NotProbed,
    /// The uprobe_multi programs loaded so far (an ABI's at its first library).
    programs: programs::ProgramSet,
    /// Slots of libraries let go, for reuse.
    free_slots: Vec<usize>,
    /// The processes seen mapping each library (by slot).
    mapped_by: BTreeMap<usize, BTreeSet<u32>>,
    /// The task-local storage of in-flight calls (held by the programs too).
    task_state: OwnedFd,
    /// The process tracepoints' links (detached with the probes, see `Drop`).
    tracepoints: Vec<TracePointLink>,
    /// The exit tracepoint's link: its program reads the task storage, so commtap loads
    /// and links it itself (`multi::attach_tracepoint`).
    exit_link: Option<multi::MultiLink>,
    /// The task iterator that reads a blocked thread's saved user registers (for unwinding
    /// the stack of a rank attached to while inside a call); `None` where the kernel
    /// refused it (its threads' frame pointers are then not known).
    task_registers: Option<OwnedFd>,
    /// Held while the kernel keeps run-time statistics for us (`--probe-stats`).
    run_stats: Option<OwnedFd>,
    /// Held while a measuring window of the budget's keeps them on.
    window_stats: Option<OwnedFd>,
    /// The controllers whose cgroup v1 the programs can find, with their subsystem ids.
    cgroup_v1_subsys: BTreeMap<String, u32>,
    /// The child left to wait for the detach (see [`Probes::detach_in_background`]). Keep
    /// it the last field: fields drop in order, and it must drop after every other
    /// descriptor of these probes is closed (before, the parent would hold the last
    /// references again, and wait out their release itself).
    closer: Option<multi::DetachInChild>,
}

/// What one probe program has cost, from the kernel's run-time statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    /// The program (`sess_ompi`, `call_entry`, `mpi_return_mpich` ...).
    pub name: String,
    /// Its runs (a session program runs at entry and at each return asked for).
    pub runs: u64,
    /// Their total time, ns.
    pub run_ns: u64,
}

/// Options for loading.
#[derive(Clone, Debug)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent switches, each a command-line flag's"
)]
pub struct LoadOptions {
    /// Ring buffer size in bytes (a power of two, at least a page).
    pub ring_buffer_bytes: u32,
    /// A bpffs directory in which the counting maps are pinned, and reused if they are
    /// there: a restarted daemon carries on with the counts of the one before.
    pub state_dir: Option<PathBuf>,
    /// Turn on the kernel's run-time statistics of BPF programs while loaded, for
    /// [`Probes::program_stats`].
    pub probe_stats: bool,
    /// How the time of hot routines is sampled (a session applies it while it runs).
    pub time_sampling: crate::session::budget::TimeSampling,
    /// Pause counted processes when their dynamic linker maps new libraries, until those
    /// are probed (see [`Probes::set_pause_at_load`]).
    pub pause_at_load: bool,
    /// How long pausing lasts unless renewed ([`PAUSE_LEASE`]; tests make it longer).
    pub pause_lease: std::time::Duration,
    /// Probe the transports' data path (libfabric's, UCX's) beneath MPI, besides MPI and
    /// NCCL.
    pub transports: bool,
    /// The share of each map its processes grow (communicators, datatypes, counters,
    /// peers) that one user may hold, percent (`collector_common::shares`).
    pub user_share_pct: u32,
    /// The sub-uids users are given (`/etc/subuid`): each is charged as its user.
    pub subuid_file: PathBuf,
    /// Count calls per call site too (see [`Probes::set_call_sites`]).
    pub call_sites: bool,
}

impl LoadOptions {
    /// Options for a ring buffer of about `kib` KiB (rounded up to a power of two, at
    /// least one page).
    pub fn with_ring_buffer_kib(kib: u32) -> LoadOptions {
        LoadOptions {
            ring_buffer_bytes: (kib.clamp(4, 1 << 20) * 1024).next_power_of_two(),
            state_dir: None,
            probe_stats: false,
            time_sampling: crate::session::budget::TimeSampling::DEFAULT,
            pause_at_load: true,
            pause_lease: PAUSE_LEASE,
            transports: true,
            user_share_pct: collector_common::shares::DEFAULT_USER_SHARE_PCT,
            subuid_file: PathBuf::from(crate::discover::accounts::SUBUID_FILE),
            call_sites: false,
        }
    }
}

impl Drop for Probes {
    /// Detaches every library's probes and the tracepoints together: each detach waits
    /// for a grace period (see [`multi::detach_all`]).
    fn drop(&mut self) {
        // Nobody is paused from now on, and nobody paused is left so.
        let _ = self.set_pause_at_load(false);
        let _ = self.resume_all();
        let links = self
            .libraries
            .iter_mut()
            .flat_map(|l| std::mem::take(&mut l.links))
            .chain(
                std::mem::take(&mut self.linkers)
                    .into_values()
                    .map(|l| l.link),
            )
            .chain(self.exit_link.take())
            .collect();
        std::thread::scope(|s| {
            for t in std::mem::take(&mut self.tracepoints) {
                s.spawn(move || drop(t));
            }
            multi::detach_all(links);
        });
    }
}

impl Probes {
    /// Forks now the child that will wait out the detach of these probes (an RCU grace
    /// period or two per link, 50 to 200 ms here): it holds the last references to the
    /// links until this process has dropped them, so their release happens there and
    /// `record` ends as soon as its report is written. Only where no other commtap takes
    /// these counts over at once (a daemon's successor reuses its pinned maps, into which
    /// the old probes would count meanwhile).
    pub fn detach_in_background(&mut self) {
        if self.closer.is_none() {
            self.closer = multi::DetachInChild::start();
        }
    }

    /// Loads the programs, fills the routine table and attaches the process tracepoints.
    pub fn load(opts: LoadOptions) -> Result<Probes, AttachError> {
        if BPF_OBJECT.is_empty() {
            return Err(AttachError::Missing(
                "BPF programs: this commtap was built with COMMTAP_SKIP_BPF_BUILD set",
            ));
        }
        system::bump_memlock_rlimit();
        let mut loader = EbpfLoader::new();
        // The programs have no CO-RE relocations: aya need not parse the kernel's BTF
        // (30 ms of each start); `btf::Btf::vmlinux` reads what commtap needs of it.
        loader.btf(None);
        let pins: Vec<(&str, PathBuf)> = match &opts.state_dir {
            Some(dir) => {
                state::prepare_state_dir(dir)?;
                names::maps::KEPT
                    .iter()
                    .map(|m| (*m, dir.join(m)))
                    .collect()
            }
            None => Vec::new(),
        };
        for (map, path) in &pins {
            loader.map_pin_path(map, path.as_path());
        }
        let mut ebpf = loader
            .map_max_entries(names::maps::EVENTS, opts.ring_buffer_bytes)
            .load(BPF_OBJECT)
            .map_err(|e| AttachError::Load(Box::new(e)))?;
        // Before any map is taken out of `ebpf`: the programs are relocated against them all,
        // with the task-storage map we create standing in for the object's placeholder.
        let task_state = multi::create_task_storage(size_of::<CallState>() as u32)?;
        let mut fds = map_fds(&ebpf);
        fds.insert(names::maps::TASK_STATE.to_string(), task_state.as_raw_fd());
        let mut counters = counters::Counters::take_from(&mut ebpf)?;
        // Before any program runs: the stamps a daemon before this one left are read as
        // it left them (a kept process's thread made once the tracepoints run would stamp
        // now, later than the start of a process given a kept pid since).
        let watched = watched::WatchedSet::new(
            map(&mut ebpf, names::maps::WATCHED)?,
            map(&mut ebpf, names::maps::WATCHED_LATEST)?,
            map(&mut ebpf, names::maps::SCOPE_GEN)?,
        );
        let btf = btf::Btf::vmlinux();
        let session_kfunc = match &btf {
            Ok(b) => uprobe_sessions(b),
            Err(e) => {
                warn!("no uprobe sessions: {e:#}");
                None
            }
        };
        let mut programs =
            programs::ProgramSet::new(&fds, session_kfunc).map_err(AttachError::MapDescriptors)?;
        counters.reset_unassigned()?;
        programs.add(programs.loader(programs::AT_START.to_vec())()?);
        if programs.sessions() {
            info!("MPI and NCCL are probed through uprobe sessions: unwatched processes pay the entry only");
        }
        let cgroup_v1_subsys = btf
            .as_ref()
            .map(btf::cgroup_v1_subsystems)
            .unwrap_or_default();

        // Held until the tracepoints are loaded: they refer to these maps, which close when
        // dropped.
        let (_tables, identity_known) = fill_tables(&mut ebpf, btf.as_ref().ok())?;
        let tracepoints = attach_tracepoints(&mut ebpf)?;
        let exit_link = attach_exit_tracepoint(&programs)?;
        // A kernel that refuses it (before Linux 6.1's thread filter, the iterator's type
        // unknown) leaves blocked threads' frame pointers unknown, nothing else.
        let task_registers = match programs.loader(vec![names::programs::TASK_REGISTERS])() {
            Ok(mut loaded) => loaded.remove(names::programs::TASK_REGISTERS),
            Err(e) => {
                info!("no task iterator: blocked threads' frame pointers not read: {e}");
                None
            }
        };
        let linkers = attach_linker(&programs)
            .map(|(identity, link)| (identity, HookedLinker { link, owner: None }))
            .into_iter()
            .collect();
        let mut probes = Probes {
            watched,
            comms: map(&mut ebpf, names::maps::COMMS)?,
            coll_seq: map(&mut ebpf, names::maps::COLL_SEQ)?,
            comm_frees: map(&mut ebpf, names::maps::COMM_FREES)?,
            dtypes: map(&mut ebpf, names::maps::DTYPES)?,
            persistent: map(&mut ebpf, names::maps::PERSISTENT)?,
            config: map(&mut ebpf, names::maps::CONFIG)?,
            time_one_in: map(&mut ebpf, names::maps::TIME_ONE_IN)?,
            sampled: BTreeMap::new(),
            process_one_in: map(&mut ebpf, names::maps::PROCESS_ONE_IN)?,
            process_sampled: BTreeMap::new(),
            numbering_stopped: Default::default(),
            settings: Config {
                self_tgid: std::process::id(),
                uid: Config::ANY_UID,
                user_share_pct: opts.user_share_pct,
                call_sites: u32::from(opts.call_sites),
                ..Config::default()
            },
            layouts: map(&mut ebpf, names::maps::LAYOUTS)?,
            counters,
            device_time: map(&mut ebpf, names::maps::DEVICE_TIME)?,
            peers: peers::PeerCounters::take_from(&mut ebpf)?,
            sites: map(&mut ebpf, names::maps::CALL_SITES)?,
            fabric_funcs: map(&mut ebpf, names::maps::FABRIC_FUNCS)?,
            fabric_text: map(&mut ebpf, names::maps::FABRIC_TEXT)?,
            fabric_ranges: map(&mut ebpf, names::maps::FABRIC_RANGES)?,
            mpi_components: map(&mut ebpf, names::maps::MPI_COMPONENTS)?,
            proc_stats: map(&mut ebpf, names::maps::PROC_STATS)?,
            shares: Shares {
                user_held: map(&mut ebpf, names::maps::USER_HELD)?,
                user_released: map(&mut ebpf, names::maps::USER_RELEASED)?,
                proc_held: map(&mut ebpf, names::maps::PROC_HELD)?,
                given_back: HashMap::new(),
            },
            paused: map(&mut ebpf, names::maps::PAUSED)?,
            linkers,
            pause_at_load: false,
            identity_known,
            programs_loaded_ns: 0,
            pause_lease: opts.pause_lease,
            prefetch: None,
            transports: opts.transports,
            accounts: Accounts::default(),
            users: Directory::default(),
            subuids: map(&mut ebpf, names::maps::SUBUIDS)?,
            subuids_written: Vec::new(),
            subuid_file: opts.subuid_file,
            events: Some(map(&mut ebpf, names::maps::EVENTS)?),
            _ebpf: ebpf,
            seen: BTreeMap::new(),
            read_ahead: BTreeMap::new(),
            libraries: Vec::new(),
            unsupported: library::NotProbed::default(),
            programs,
            free_slots: Vec::new(),
            mapped_by: BTreeMap::new(),
            task_state,
            tracepoints,
            exit_link: Some(exit_link),
            task_registers,
            window_stats: None,
            run_stats: if opts.probe_stats {
                Some(multi::enable_run_stats().map_err(AttachError::RunStats)?)
            } else {
                None
            },
            cgroup_v1_subsys,
            closer: None,
        };
        probes.refresh_accounts();
        // Left paused by a daemon that died before continuing them (the map is kept).
        let left = probes.resume_all();
        if left > 0 {
            warn!("continued {left} process(es) a commtap before this one left paused at a library load");
        }
        if probes.set_pause_at_load(opts.pause_at_load)? {
            info!("libraries loaded late (dlopen) are probed before their first call: a process is paused while its new libraries are probed");
        }
        Ok(probes)
    }

    /// Pauses watched processes when their dynamic linker maps new libraries, until they
    /// are probed (see `collector-ebpf`'s `loader.rs`); whether that could be turned on (the
    /// dynamic linker's probe is in place). It lasts a lease: renew it with
    /// [`Probes::renew_pause_lease`] from the loop that handles the pauses' events.
    pub fn set_pause_at_load(&mut self, on: bool) -> Result<bool, AttachError> {
        self.pause_at_load = on && !self.linkers.is_empty();
        self.renew_pause_lease()?;
        Ok(self.pause_at_load)
    }

    /// Lets the kernel pause processes at library loads for a lease more ([`PAUSE_LEASE`],
    /// if that is on): a commtap that stops handling their events stops pausing them soon
    /// after.
    pub fn renew_pause_lease(&mut self) -> Result<(), AttachError> {
        self.settings.pause_until_ns = if self.pause_at_load {
            crate::clock::monotonic_ns() + self.pause_lease.as_nanos() as u64
        } else {
            0
        };
        self.write_settings()
    }

    /// Continues `pid`, paused at a library load; how long it was paused (None: it was not,
    /// as far as the kernel's list says).
    pub fn resume(&mut self, pid: u32) -> Option<std::time::Duration> {
        let since = self.paused.get(&pid, 0).ok();
        // Off the list first: a pause the process makes right after continuing is its own.
        let _ = self.paused.remove(&pid);
        // Always sent: the stop may still be pending (SIGCONT cancels it). A pid cannot be
        // reused while its process is stopped; one killed meanwhile is gone from the list.
        // SAFETY: kill(2) with a plain signal.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
        since.map(|at| {
            std::time::Duration::from_nanos(crate::clock::monotonic_ns().saturating_sub(at))
        })
    }

    /// Whether `pid` is paused (at a library load or at `MPI_Pcontrol`: one list holds
    /// both) and not continued since.
    pub fn is_paused(&self, pid: u32) -> bool {
        self.paused.get(&pid, 0).is_ok()
    }

    /// Continues every process paused at a library load; how many. An entry whose process
    /// has ended, or whose pid is another process's now (started after the pause), is
    /// dropped unsignalled: one kept by a daemon before this one may be long past (no exit
    /// was seen while none ran), and that pid may be a process stopped on purpose.
    pub fn resume_all(&mut self) -> usize {
        let paused: Vec<(u32, u64)> = self.paused.iter().filter_map(Result::ok).collect();
        // The pause's instant on the clock a process's start is read on, at its latest (the
        // node's time suspended since can only have grown).
        let suspended = crate::clock::boottime_ns().saturating_sub(crate::clock::monotonic_ns());
        let tick = 1_000_000_000 / crate::discover::clock_ticks_per_second();
        let mut continued = 0;
        for (pid, at) in paused {
            let started_after = crate::discover::started_boottime_ns(pid)
                .is_some_and(|start| start > at.saturating_add(suspended).saturating_add(tick));
            if crate::discover::has_ended(pid) || started_after {
                let _ = self.paused.remove(&pid);
                continue;
            }
            self.resume(pid);
            continued += 1;
        }
        continued
    }

    /// Continues the processes paused longer than `max` ago, or than `max` after the last
    /// program load (their event was not handled, or their owner's share of reading time
    /// was spent: no process stays stopped for long); which.
    pub fn resume_overdue(&mut self, max: std::time::Duration) -> Vec<u32> {
        let now = crate::clock::monotonic_ns();
        let overdue: Vec<u32> = self
            .paused
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, at)| {
                now.saturating_sub((*at).max(self.programs_loaded_ns)) > max.as_nanos() as u64
            })
            .map(|(pid, _)| pid)
            .collect();
        for pid in &overdue {
            self.resume(*pid);
        }
        overdue
    }

    /// Whether watched processes are paused at their library loads until those are probed
    /// (where they may be unnoticed: see `collector-ebpf`'s `pausable_unnoticed`).
    pub fn pauses_at_load(&self) -> bool {
        self.pause_at_load && self.identity_known
    }

    /// Whether MPI and NCCL are probed through uprobe sessions (from now on).
    pub fn uses_sessions(&self) -> bool {
        self.programs.sessions()
    }

    /// Loads the programs that probe libraries of `abi`, unless they are loaded (see
    /// [`Probes::load_programs_of`]).
    fn load_programs_for(&mut self, abi: collector_common::Abi) -> Result<(), AttachError> {
        self.load_programs_of(&[abi])
    }

    /// Loads the programs that probe libraries of `abis`, unless they are loaded, each on
    /// a thread of its own. The verifier takes a second or two: meanwhile the pause at
    /// library loads is renewed (the process whose load brought the library waits paused
    /// for these programs, and the other ranks loading it must pause too). A session
    /// program the kernel refuses turns sessions off: entry and return programs instead.
    fn load_programs_of(&mut self, abis: &[collector_common::Abi]) -> Result<(), AttachError> {
        let sessions = self.programs.sessions();
        match self.load_renewing(&programs::for_abis(abis, sessions)) {
            Err(e) if sessions && abis.iter().any(|a| *a != collector_common::Abi::Fabric) => {
                warn!("uprobe sessions refused, using entry and return probes: {e:#}");
                self.programs.stop_sessions();
                self.load_renewing(&programs::for_abis(abis, false))
            }
            done => done,
        }
    }

    /// Loads those of `names` not loaded yet on another thread, renewing the pause lease
    /// until they are; those being verified ahead (`prefetch_programs`) are waited for, not
    /// loaded twice.
    fn load_renewing(&mut self, names: &[&'static str]) -> Result<(), AttachError> {
        let mut missing = self.programs.missing(names);
        let wanted = |p: &mut programs::PendingLoad| p.names.iter().any(|n| missing.contains(n));
        if let Some(ahead) = self.prefetch.take_if(wanted) {
            match self.wait_renewing(&ahead)? {
                Ok(loaded) => self.add_programs(loaded),
                // Loaded again below, which reports its own error.
                Err(e) => debug!("programs verified ahead: {e:#}"),
            }
            missing = self.programs.missing(names);
        }
        if missing.is_empty() {
            return Ok(());
        }
        let pending = self.programs.spawn_load(missing);
        let loaded = self.wait_renewing(&pending)??;
        self.add_programs(loaded);
        Ok(())
    }

    /// Waits for `pending`, renewing the pause lease meanwhile (the processes waiting paused
    /// for these programs must not be resumed as overdue).
    fn wait_renewing(
        &mut self,
        pending: &programs::PendingLoad,
    ) -> Result<Result<HashMap<String, OwnedFd>, multi::MultiError>, AttachError> {
        loop {
            match pending.rx.recv_timeout(self.pause_lease / 4) {
                Ok(loaded) => return Ok(loaded),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = self.renew_pause_lease() {
                        warn!("{e:#}");
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(AttachError::Missing(
                        "probe programs: loading them panicked",
                    ));
                }
            }
        }
    }

    /// Keeps loaded programs; what was paused for them is not overdue before now.
    fn add_programs(&mut self, loaded: HashMap<String, OwnedFd>) {
        self.programs.add(loaded);
        self.programs_loaded_ns = crate::clock::monotonic_ns();
    }

    /// Loads every ABI's programs at once, each on a thread of its own (one ABI after the
    /// other took 3.4 s here against 2.2 s): `commtap doctor`, which checks them all.
    pub fn load_all_programs(&mut self) -> Result<(), AttachError> {
        self.load_programs_of(&programs::ABIS)
    }

    /// Each probe program's runs and run time since it was loaded; `None` unless loaded
    /// with `probe_stats` (the kernel counts nothing otherwise).
    pub fn program_stats(&self) -> Option<Vec<ProgramStats>> {
        self.run_stats.as_ref()?;
        Some(self.program_runs())
    }

    /// Turns the kernel's run-time statistics on (`true`) for a measuring window, or off
    /// again (`false`: unless `probe_stats` keeps them on, or another program on the
    /// machine does).
    pub fn measure_program_runs(&mut self, on: bool) -> Result<(), AttachError> {
        self.window_stats = if on {
            Some(multi::enable_run_stats().map_err(AttachError::RunStats)?)
        } else {
            None
        };
        Ok(())
    }

    /// Each probe program's runs and run time as the kernel counted them so far (it counts
    /// only while run-time statistics are on).
    pub fn program_runs(&self) -> Vec<ProgramStats> {
        let mut out: Vec<ProgramStats> = self
            .programs
            .iter()
            .filter_map(|(name, fd)| {
                let (runs, run_ns) = multi::run_stats(fd.as_fd()).ok()?;
                Some(ProgramStats {
                    name: name.clone(),
                    runs,
                    run_ns,
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Hands the ring buffer to the ingest loop (once).
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    /// Starts counting `pid`'s calls; with `descendants`, also those of its future children.
    pub fn watch(&mut self, pid: u32, descendants: bool) -> Result<(), AttachError> {
        if self.numbering_stopped.remove(&pid) {
            // Detached or unwatched: a count the kernel was taking as it was stopped may
            // have written over the stop; none is taken while it is not watched, so this
            // sweep is the last.
            self.stop_numbering(Some(pid));
        }
        let flags = watch::COUNT | if descendants { watch::DESCENDANTS } else { 0 };
        self.watched
            .insert(pid, flags)
            .map_err(map_err(names::maps::WATCHED))?;
        // Ended before it was in the set (its counts found late, say): the kernel took it
        // out at its end already, so the entry would stay, and count whatever process is
        // given the pid next.
        if crate::discover::has_ended(pid) {
            self.watched.remove(pid);
        }
        Ok(())
    }

    /// Makes every process `me` forks from now on watched (with its descendants), without
    /// counting `me` itself.
    pub fn watch_descendants_of_self(&mut self, me: u32) -> Result<(), AttachError> {
        self.watched
            .insert(me, watch::DESCENDANTS)
            .map_err(map_err(names::maps::WATCHED))
    }

    /// Forgets `pid` (used to stop following commtap's own children).
    pub fn unwatch(&mut self, pid: u32) {
        self.watched.remove(pid);
        self.stop_numbering(Some(pid));
        self.numbering_stopped(pid);
        // Threads with call state check again whether their process is counted.
        self.counters.bump_generation();
    }

    /// The collectives of `pid` (of every process: None) are no longer seen, or no longer
    /// numbered (no call events): the kernel's counts of their instances stop for good
    /// (their calls are aligned by time, as those of a process attached mid-job).
    fn stop_numbering(&mut self, pid: Option<u32>) {
        let keys: Vec<HandleKey> = self
            .coll_seq
            .keys()
            .filter_map(Result::ok)
            .filter(|k| pid.is_none_or(|p| k.tgid == p))
            .collect();
        for k in keys {
            let _ = if k.handle == instances::INIT_SEEN {
                self.coll_seq.remove(&k)
            } else {
                self.coll_seq.insert(k, instances::NOT_NUMBERED, 0)
            };
        }
    }

    /// Per process, the highest collective instance number the kernel saw it enter on any
    /// communicator it numbers. A rank blocked inside a collective has entered it, where
    /// its event comes only at the return (and only for a drawn instance): the rank a hung
    /// job waits for is the one whose number is behind.
    pub fn collectives_entered(&self) -> HashMap<u32, u64> {
        let mut entered = HashMap::new();
        for (k, count) in self.coll_seq.iter().filter_map(Result::ok) {
            let next = count & instances::INSTANCE_BITS;
            // The marker of an `MPI_Init` seen, a communicator not numbered, or one made
            // and not yet used.
            if k.handle == instances::INIT_SEEN || count == instances::NOT_NUMBERED || next == 0 {
                continue;
            }
            let e = entered.entry(k.tgid).or_insert(0);
            *e = (next - 1).max(*e);
        }
        entered
    }

    /// Stops counting `pid` for good: unlike [`Probes::unwatch`], watch-all mode does not
    /// take it up again (until [`Probes::unwatch`] or [`Probes::watch`]).
    pub fn ignore(&mut self, pid: u32) -> Result<(), AttachError> {
        self.watched
            .insert(pid, 0)
            .map_err(map_err(names::maps::WATCHED))?;
        self.stop_numbering(Some(pid));
        self.numbering_stopped(pid);
        // Threads with call state check again whether their process is counted.
        self.counters.bump_generation();
        Ok(())
    }

    /// Remembers that `pid`'s counts were stopped, for a sweep if it is watched again; a
    /// bounded set (past it, the oldest go without their sweep: a detach and attach of the
    /// same process in the instant a count is taken).
    fn numbering_stopped(&mut self, pid: u32) {
        if self.numbering_stopped.len() >= MAX_NUMBERING_STOPPED {
            self.numbering_stopped.clear();
        }
        self.numbering_stopped.insert(pid);
    }

    /// Whether `pid`'s counts were stopped (detached or unwatched) and not started again:
    /// watched again, its counts start from nothing ([`Probes::watch`]). Past the bounded
    /// set's cap it may say no of an unwatched process (a detached one is told anyway).
    pub fn numbering_was_stopped(&self, pid: u32) -> bool {
        self.numbering_stopped.contains(&pid)
    }

    /// Process `pid`, detached, exited (its kernel state went at the detach): its pid may be
    /// another process's from now on, watched as any other, counted from its start.
    pub fn detached_exited(&mut self, pid: u32) {
        // Its detach's entry only: a process given its pid since may be watched already.
        if self.watched.ignores(pid) {
            self.watched.remove(pid);
        }
        self.numbering_stopped.remove(&pid);
    }

    /// Whether `pid` was detached ([`Probes::ignore`]) and the kernel leaves it alone.
    pub fn is_ignored(&self, pid: u32) -> bool {
        self.watched.ignores(pid)
    }

    /// Whether the kernel still counts `pid` (false once it exited).
    pub fn is_watched(&self, pid: u32) -> bool {
        self.watched.contains(pid)
    }

    /// Counts every process that calls a probed MPI library (but commtap itself), not only
    /// the watched ones, optionally only those of user `uid` and in (or below) cgroup `cg`
    /// (v2, or v1: a Slurm job's on a hybrid host): how a node daemon sees jobs from their
    /// first call.
    pub fn set_watch_all(
        &mut self,
        uid: Option<u32>,
        cg: Option<&CgroupRef>,
    ) -> Result<(), AttachError> {
        let v1_subsys = match cg.and_then(|c| c.v1_controller.as_ref()) {
            None => 0,
            Some(controller) => {
                1 + *self
                    .cgroup_v1_subsys
                    .get(controller)
                    .ok_or_else(|| AttachError::CgroupV1(controller.clone()))?
            }
        };
        self.settings.watch_all = 1;
        self.settings.uid = uid.unwrap_or(Config::ANY_UID);
        self.settings.cgroup_level = cg.map_or(0, |c| c.level);
        self.settings.cgroup_id = cg.map_or(0, |c| c.id);
        self.settings.cgroup_v1_subsys = v1_subsys;
        self.write_settings()?;
        self.watched.scope_changed();
        Ok(())
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
        if self.settings.call_events == 0 && on {
            // A count the kernel was taking as events went off may have written over the
            // stop (below); none is taken while they are off, so this sweep is the last.
            self.stop_numbering(None);
        }
        if on {
            self.settings.call_events |= bit;
        } else {
            self.settings.call_events &= !bit;
        }
        self.write_settings()?;
        if self.settings.call_events == 0 {
            // The kernel numbers instances only while events are on: a count that missed
            // some would be trusted.
            self.stop_numbering(None);
        }
        Ok(())
    }

    /// Turns the call-site counters on or off (where each call was made from).
    pub fn set_call_sites(&mut self, on: bool) -> Result<(), AttachError> {
        self.settings.call_sites = u32::from(on);
        self.write_settings()
    }

    /// The task iterator that reads a thread's saved user registers, where the kernel took it.
    pub fn task_registers(&self) -> Option<BorrowedFd<'_>> {
        self.task_registers.as_ref().map(AsFd::as_fd)
    }

    /// Whether calls are counted per call site.
    pub fn call_sites(&self) -> bool {
        self.settings.call_sites != 0
    }

    /// Times one call in `n` of `routine` (chosen at random; 0 or 1: every call), for the
    /// routines whose time may be sampled, through uprobe sessions (with entry and return
    /// probes every call is timed whatever this says).
    pub fn set_time_one_in(&mut self, routine: u16, n: u32) -> Result<(), AttachError> {
        let n = n.max(1);
        if self.sampled.get(&routine).copied().unwrap_or(1) == n {
            return Ok(());
        }
        self.time_one_in
            .set(u32::from(routine), n, 0)
            .map_err(map_err(names::maps::TIME_ONE_IN))?;
        if n > 1 {
            self.sampled.insert(routine, n);
        } else {
            self.sampled.remove(&routine);
        }
        Ok(())
    }

    /// Times one call in N of each routine in `everywhere` (routine -> N) in every process,
    /// and of each process's routine in `wanted` ((tgid, routine) -> N) in that process
    /// alone; every call of the others. Goes on past a failure (a full map: that process's
    /// routine stays timed), and returns the first.
    pub fn set_time_sampling(
        &mut self,
        everywhere: &BTreeMap<u16, u32>,
        wanted: &BTreeMap<(u32, u16), u32>,
    ) -> Result<(), AttachError> {
        let mut first = Ok(());
        let mut keep = |r: Result<(), AttachError>| {
            if first.is_ok() {
                first = r;
            }
        };
        // Each process's own N first, then the routines told to look it up; the reverse
        // to go back to every call: no call is ever drawn against a missing N.
        for (&(tgid, routine), &n) in wanted {
            if self.process_sampled.get(&(tgid, routine)) == Some(&n) {
                continue;
            }
            let set = self
                .process_one_in
                .insert(one_in::key(tgid, routine), n, 0)
                .map_err(map_err(names::maps::PROCESS_ONE_IN));
            if set.is_ok() {
                self.process_sampled.insert((tgid, routine), n);
            }
            keep(set);
        }
        let routines: BTreeSet<u16> = wanted.keys().map(|&(_, r)| r).collect();
        let before: Vec<u16> = self.sampled.keys().copied().collect();
        for r in before
            .into_iter()
            .chain(routines.iter().copied())
            .chain(everywhere.keys().copied())
        {
            let n = if routines.contains(&r) {
                one_in::PER_PROCESS
            } else {
                everywhere.get(&r).copied().unwrap_or(1)
            };
            keep(self.set_time_one_in(r, n));
        }
        let gone: Vec<(u32, u16)> = self
            .process_sampled
            .keys()
            .filter(|k| !wanted.contains_key(k))
            .copied()
            .collect();
        for (tgid, routine) in gone {
            match self.process_one_in.remove(&one_in::key(tgid, routine)) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {
                    self.process_sampled.remove(&(tgid, routine));
                }
                Err(e) => keep(Err(map_err(names::maps::PROCESS_ONE_IN)(e))),
            }
        }
        first
    }

    /// What each process's routines are timed at where the budget set their N.
    pub fn process_time_sampled(&self) -> &BTreeMap<(u32, u16), u32> {
        &self.process_sampled
    }

    /// Whether every call of the routine of `spec` emits an event now (then its time is
    /// never sampled: the event carries it). The kernel decides the same way; of a
    /// collective, under who is late alone, it sends only the instances it draws (where it
    /// numbers the communicator's), and the others' time may be sampled.
    pub fn event_wanted_for(&self, spec: &ArgSpec) -> bool {
        let m = self.settings.call_events;
        m & Config::EVENTS_ALL != 0
            || (m != 0 && spec.matters_for_skew() && spec.class != routines::class::COLLECTIVE)
    }

    /// The routines whose time is sampled now, with their N (one call in N timed).
    pub fn time_sampled(&self) -> &BTreeMap<u16, u32> {
        &self.sampled
    }

    /// Whether an event is emitted for every call.
    pub fn call_events(&self) -> bool {
        self.settings.call_events & Config::EVENTS_ALL != 0
    }

    fn write_settings(&mut self) -> Result<(), AttachError> {
        self.config
            .set(0, self.settings, 0)
            .map_err(map_err(names::maps::CONFIG))
    }

    /// The user `uid` is charged as for a user's caps (a sub-uid: the user given it).
    pub fn account_of(&self, uid: u32) -> u32 {
        self.accounts.of(uid)
    }

    /// Reads the sub-uid file again where it changed (a user given sub-uids meanwhile) or the
    /// user directory answered for names `/etc/passwd` lacks, and gives the kernel side its
    /// ranges.
    pub fn refresh_accounts(&mut self) {
        self.accounts =
            std::mem::take(&mut self.accounts).refreshed(&self.subuid_file, &mut self.users);
        if self.accounts.ranges() == self.subuids_written.as_slice() {
            return;
        }
        match self.write_subuids() {
            Ok(()) => {
                self.subuids_written = self.accounts.ranges().to_vec();
                info!(
                    ranges = self.subuids_written.len(),
                    "the kernel charges sub-uids by these ranges now"
                );
            }
            // Tried again at the next look.
            Err(e) => warn!("{e:#}: the kernel charges each sub-uid as a user of its own"),
        }
    }

    /// Writes the sub-uid ranges for the kernel side into the table it is not searching,
    /// then names that table: it searches the old ranges until then, never none.
    fn write_subuids(&mut self) -> Result<(), AttachError> {
        let next = (self.settings.subuid_ranges & SUBUID_SECOND_TABLE) ^ SUBUID_SECOND_TABLE;
        let (base, _) = subuid_table(next);
        let ranges = self.accounts.ranges();
        for (i, r) in ranges.iter().enumerate() {
            self.subuids
                .set(base + i as u32, *r, 0)
                .map_err(map_err(names::maps::SUBUIDS))?;
        }
        // At most MAX_SUBUID_RANGES (`Accounts` keeps no more): below the table's bit.
        let searched =
            std::mem::replace(&mut self.settings.subuid_ranges, next | ranges.len() as u32);
        let written = self.write_settings();
        if written.is_err() {
            // The kernel searches the old table still: the next try must not write there.
            self.settings.subuid_ranges = searched;
        }
        written
    }

    /// Forgets ([`Probes::forget_process`]) the processes a daemon before this one left in
    /// the pinned maps that no longer run: they exited while no daemon ran, and nothing else
    /// would forget them (a later process given the same pid would carry on from their
    /// counts), their pids given to other processes meanwhile included. Their pids.
    pub fn forget_exited_while_away(&mut self) -> Vec<u32> {
        let mut pids = self.counters.pids();
        pids.extend(self.proc_stats.keys().filter_map(Result::ok));
        pids.extend(
            self.device_time
                .keys()
                .filter_map(Result::ok)
                .map(|k| k.tgid),
        );
        pids.extend(self.peers.pids());
        pids.extend(self.sites.keys().filter_map(Result::ok).map(|k| k.tgid));
        pids.extend(handle_holders(&self.comms));
        pids.extend(handle_holders(&self.comm_frees));
        pids.extend(handle_holders(&self.dtypes));
        pids.extend(handle_holders(&self.persistent));
        // A pid may have been given to another process meanwhile: one started after the
        // last entry into the watched set (every process the kept state is of had entered
        // it by then, and nothing enters it while no daemon runs).
        let latest = self.watched.kept_latest();
        let given_since = |pid: u32| {
            latest.is_some_and(|t| {
                crate::discover::started_boottime_ns(pid).is_some_and(|start| start > t)
            })
        };
        pids.retain(|p| !is_running_process(*p) || given_since(*p));
        for pid in &pids {
            self.forget_process(*pid);
        }
        // Watched when that daemon ended: the kernel takes a process out of the set at its
        // end only while a daemon's programs run, so one that ended since stays, and would
        // have the next process given its pid counted (and paused at its loads) whatever
        // this daemon's scope.
        for pid in self.watched.pids() {
            if crate::discover::has_ended(pid) || given_since(pid) {
                self.watched.remove(pid);
                pids.insert(pid);
            }
        }
        pids.into_iter().collect()
    }

    /// The per-peer counters of freed communicators due to be moved out of the kernel's map
    /// ([`Probes::fold_peers`]), each with how long it has been retired: a walk of the map
    /// at most every few seconds, and only while handles are freed (call it as often as
    /// wanted).
    pub fn freed_peers_due(&mut self) -> Vec<(collector_common::PeerKey, std::time::Duration)> {
        let handles = self.counters.handle_generation();
        self.peers.due(&self.comm_frees, handles)
    }

    /// Moves the due per-peer counters (`named`: each with how long it has been retired and
    /// its communicator's name where it has one) out of the kernel's map, giving their
    /// entries back to their users' shares: a program making and freeing communicators
    /// keeps finding room. Returns each counter moved and its key now.
    pub fn fold_peers(
        &mut self,
        named: &[(collector_common::PeerKey, std::time::Duration, Option<u64>)],
    ) -> Vec<(collector_common::PeerKey, collector_common::PeerKey)> {
        let moved = self.peers.move_out(named);
        let mut per_process: BTreeMap<u32, u64> = BTreeMap::new();
        for (k, _) in &moved {
            *per_process.entry(k.tgid).or_default() += 1;
        }
        for (pid, n) in per_process {
            self.shares.give_back(pid, SharedMap::Peers, n);
        }
        moved
    }

    /// Per-peer counters of process `pid`'s freed communicators held out of the kernel's
    /// map ([`Probes::fold_peers`]).
    pub fn peers_folded(&self, pid: u32) -> u64 {
        self.peers.folded_of(pid)
    }

    /// Removes the stats the kernel made of `pid` at its threads' ends, to add up its
    /// usage, where it is no rank (it never mapped an MPI): no profile takes them.
    pub fn forget_usage(&mut self, pid: u32) {
        let _ = self.proc_stats.remove(&pid);
    }

    /// Removes everything the kernel keeps of `pid` (counters, learnt handles), once its
    /// final profile is taken: a later process with the same pid starts from zero.
    pub fn forget_process(&mut self, pid: u32) {
        self.counters.forget(pid);
        remove_keys_of(&mut self.device_time, pid, |k| k.tgid);
        self.peers.forget(pid);
        remove_keys_of(&mut self.sites, pid, |k| k.tgid);
        let _ = self.proc_stats.remove(&pid);
        let _ = self.fabric_ranges.remove(&pid);
        let _ = self.mpi_components.remove(&pid);
        remove_handles_of(&mut self.comms, pid);
        remove_handles_of(&mut self.coll_seq, pid);
        remove_handles_of(&mut self.comm_frees, pid);
        remove_handles_of(&mut self.dtypes, pid);
        remove_handles_of(&mut self.persistent, pid);
        // Its entries gone, what they were charged goes back to its user.
        self.shares.release(pid);
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
}

/// The kernel's record of each user's share of the maps its processes grow.
struct Shares {
    /// Entries charged per user, less those freed one by one (the kernel's).
    user_held: BpfHashMap<MapData, u32, Held>,
    /// What was given back per user when its processes were forgotten (this side's only).
    user_released: BpfHashMap<MapData, u32, Held>,
    /// Entries charged per process, and its user.
    proc_held: BpfHashMap<MapData, u32, Held>,
    /// Per process, entries given back while it ran (its counters moved out of the kernel's
    /// maps): not again when it is forgotten.
    given_back: HashMap<u32, [u64; SHARED_MAPS]>,
}

impl Shares {
    /// Gives `n` entries of map `which` back to process `pid`'s user while it runs (their
    /// entries removed); none where the kernel has no record of what it holds (a daemon
    /// restarted since: its entries went uncharged).
    fn give_back(&mut self, pid: u32, which: SharedMap, n: u64) {
        let Ok(held) = self.proc_held.get(&pid, 0) else {
            return;
        };
        let w = which as usize;
        let early = self.given_back.entry(pid).or_default();
        // No more than the process was charged.
        let n = n.min(held.entries[w].saturating_sub(early[w]));
        if n == 0 {
            return;
        }
        let mut released = self.user_released.get(&held.uid, 0).unwrap_or_default();
        released.entries[w] = released.entries[w].saturating_add(n);
        if self.user_released.insert(held.uid, released, 0).is_ok() {
            early[w] += n;
        }
    }

    /// Gives back to its user all that process `pid` held, its entries removed; forgets a
    /// user who holds nothing any more (the kernel keeps 4,096 at once).
    fn release(&mut self, pid: u32) {
        let early = self.given_back.remove(&pid).unwrap_or_default();
        let Ok(held) = self.proc_held.get(&pid, 0) else {
            return;
        };
        let _ = self.proc_held.remove(&pid);
        let mut released = self.user_released.get(&held.uid, 0).unwrap_or_default();
        released.processes = released.processes.saturating_add(1);
        for ((r, h), e) in released.entries.iter_mut().zip(held.entries).zip(early) {
            *r = r.saturating_add(h.saturating_sub(e));
        }
        let charged = self.user_held.get(&held.uid, 0).unwrap_or_default();
        let nothing_held = charged.processes <= released.processes
            && charged
                .entries
                .iter()
                .zip(released.entries)
                .all(|(c, r)| *c <= r);
        if nothing_held {
            // The kernel's record first: a charge racing with this is lost (the user is
            // undercharged by it), never counted twice.
            let _ = self.user_held.remove(&held.uid);
            let _ = self.user_released.remove(&held.uid);
        } else {
            let _ = self.user_released.insert(held.uid, released, 0);
        }
    }
}

/// The processes holding entries of a map keyed by (process, handle), one per entry.
fn handle_holders<V: aya::Pod>(
    map: &BpfHashMap<MapData, HandleKey, V>,
) -> impl Iterator<Item = u32> + '_ {
    map.keys().filter_map(Result::ok).map(|k| k.tgid)
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

/// File descriptors of the maps aya created, by name, to relocate the MPI programs against.
fn map_fds(ebpf: &Ebpf) -> HashMap<String, RawFd> {
    ebpf.maps()
        .filter_map(|(name, map)| {
            let (Map::Array(data)
            | Map::HashMap(data)
            | Map::LruHashMap(data)
            | Map::PerCpuHashMap(data)
            | Map::PerCpuArray(data)
            | Map::Stack(data)
            | Map::RingBuf(data)) = map
            else {
                return None;
            };
            Some((name.to_string(), data.fd().as_fd().as_raw_fd()))
        })
        .collect()
}

/// Takes the map `name` out of the loaded object, as the type it is used as.
fn map<M>(ebpf: &mut Ebpf, name: &'static str) -> Result<M, AttachError>
where
    M: TryFrom<Map, Error = aya::maps::MapError>,
{
    let m = ebpf.take_map(name).ok_or(AttachError::Missing(name))?;
    M::try_from(m).map_err(map_err(name))
}

/// Removes the entries of process `pid` (by the process id `tgid` reads from a key) from a
/// per-CPU map keyed by process.
fn remove_keys_of<K: aya::Pod, V: aya::Pod>(
    map: &mut PerCpuHashMap<MapData, K, V>,
    pid: u32,
    tgid: impl Fn(&K) -> u32,
) {
    let keys: Vec<K> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| tgid(k) == pid)
        .collect();
    for k in keys {
        let _ = map.remove(&k);
    }
}

/// Whether MPI and NCCL are probed through uprobe sessions: the BTF id of the kernel's
/// `bpf_session_is_return` where it has one (Linux 6.13+) and the environment does not
/// turn them off (`COMMTAP_UPROBE_SESSIONS=0`).
fn uprobe_sessions(btf: &btf::Btf) -> Option<u32> {
    if std::env::var_os("COMMTAP_UPROBE_SESSIONS").is_some_and(|v| v == "0") {
        info!("uprobe sessions turned off (COMMTAP_UPROBE_SESSIONS=0): entry and return probes");
        return None;
    }
    let id = btf.func_id("bpf_session_is_return");
    if id.is_none() {
        info!("this kernel has no uprobe sessions (Linux 6.13+): entry and return probes");
    }
    id
}

/// The system's dynamic linker: what every program of this machine's ABI starts with.
const DYNAMIC_LINKER: &str = "/lib64/ld-linux-x86-64.so.2";

/// Processes remembered as detached or unwatched, for their sweep at a later watch.
const MAX_NUMBERING_STOPPED: usize = 1 << 16;

/// Most dynamic linkers probed besides the system's (containers' images, Spack glibcs),
/// and most of them owned by one user (not root).
const MAX_LINKERS: usize = 16;
const MAX_LINKERS_PER_UID: usize = 2;

/// Places `linker_loaded` (`prog`) on the `_dl_debug_state` of the dynamic linker `file`.
fn hook_linker(
    prog: std::os::fd::BorrowedFd<'_>,
    file: &LibraryFile,
    hook: symbols::LinkerHook,
) -> Result<multi::MultiLink, multi::MultiError> {
    multi::attach(
        prog,
        file,
        &[hook.offset],
        &[hook.to_r_debug as u64],
        multi::ProbeKind::Entry,
    )
}

/// A dynamic linker's probe.
struct HookedLinker {
    link: multi::MultiLink,
    /// The file's owner where it is not root's (a user's own `ld.so`, against their quota;
    /// for a sub-uid, the user given it).
    owner: Option<u32>,
}

/// Places `linker_loaded` on the system dynamic linker's `_dl_debug_state`, with the
/// file's (dev, inode) (None, with a warning, where it cannot be: libraries loaded late are
/// then probed after their first calls).
fn attach_linker(programs: &programs::ProgramSet) -> Option<((u64, u64), multi::MultiLink)> {
    let gap = "libraries loaded late (dlopen) are probed after their first calls";
    let prog = programs.get(names::programs::LINKER_LOADED)?;
    let file = match LibraryFile::open_path(std::path::Path::new(DYNAMIC_LINKER)) {
        Ok(f) => f,
        Err(e) => {
            warn!("{DYNAMIC_LINKER}: {e:#}; {gap}");
            return None;
        }
    };
    match symbols::linker_hook(&file) {
        Ok(Some(hook)) => match hook_linker(prog.as_fd(), &file, hook) {
            Ok(link) => Some((file.identity, link)),
            Err(e) => {
                warn!("{e:#}; {gap}");
                None
            }
        },
        Ok(None) => {
            warn!("{DYNAMIC_LINKER} has no _dl_debug_state and _r_debug; {gap}");
            None
        }
        Err(e) => {
            warn!("{e:#}; {gap}");
            None
        }
    }
}

/// The maps [`fill_tables`] filled, taken out of the object.
type Tables = (
    Array<MapData, ArgSpec>,
    Array<MapData, IdentityOffsets>,
    Array<MapData, TpOffsets>,
    BpfHashMap<MapData, [u8; launcher::COMM_LEN], u8>,
);

/// Fills what the programs read and nobody changes after: the routine table, this
/// kernel's offsets (identity events, tracepoint fields) and the launchers' names.
/// Whether the identity offsets were found is returned beside them.
fn fill_tables(ebpf: &mut Ebpf, btf: Option<&btf::Btf>) -> Result<(Tables, bool), AttachError> {
    let identity_known;
    let mut specs: Array<MapData, ArgSpec> = map(ebpf, names::maps::ROUTINE_SPECS)?;
    for (i, r) in ROUTINES.iter().enumerate() {
        specs
            .set(i as u32, r.spec, 0)
            .map_err(map_err(names::maps::ROUTINE_SPECS))?;
    }
    let mut identity: Array<MapData, IdentityOffsets> = map(ebpf, names::maps::IDENTITY_OFFSETS)?;
    // Without identity events, processes are known by their /proc entries only (a rank
    // that exits at once may lose its rank and job), and none is paused (whether it may be
    // unnoticed is read from its task).
    if let Some(offsets) = btf.map(btf::kernel_offsets) {
        identity_known = offsets.valid == 1;
        identity
            .set(0, offsets, 0)
            .map_err(map_err(names::maps::IDENTITY_OFFSETS))?;
    } else {
        warn!("no identity events, and each uid of a user namespace is charged as a user of its own: no readable /sys/kernel/btf/vmlinux");
        identity_known = false;
    }
    let mut tp: Array<MapData, TpOffsets> = map(ebpf, names::maps::TP_OFFSETS)?;
    tp.set(0, system::tracepoint_offsets()?, 0)
        .map_err(map_err(names::maps::TP_OFFSETS))?;
    let mut launchers: BpfHashMap<MapData, [u8; launcher::COMM_LEN], u8> =
        map(ebpf, names::maps::LAUNCHERS)?;
    for name in launcher::NAMES {
        launchers
            .insert(launcher::comm(name), 1, 0)
            .map_err(map_err(names::maps::LAUNCHERS))?;
    }
    Ok(((specs, identity, tp, launchers), identity_known))
}

/// Attaches the process tracepoints (fork, exec, exit).
fn attach_tracepoints(ebpf: &mut Ebpf) -> Result<Vec<TracePointLink>, AttachError> {
    let mut links = Vec::new();
    for (prog, event) in [
        (names::programs::SCHED_FORK, "sched_process_fork"),
        (names::programs::SCHED_EXEC, "sched_process_exec"),
    ] {
        let p: &mut TracePoint = ebpf
            .program_mut(prog)
            .ok_or(AttachError::Missing("tracepoint program"))?
            .try_into()
            .map_err(prog_err("tracepoint"))?;
        p.load().map_err(prog_err("tracepoint"))?;
        let id = p.attach("sched", event).map_err(prog_err("tracepoint"))?;
        links.push(p.take_link(id).map_err(prog_err("tracepoint"))?);
    }
    Ok(links)
}

/// Loads and attaches the exit tracepoint's program, which reads the ending thread's call
/// state (the call a rank was killed inside) from the task storage that commtap makes
/// (`programs`' maps), as the probes' programs do.
fn attach_exit_tracepoint(
    programs: &programs::ProgramSet,
) -> Result<multi::MultiLink, AttachError> {
    let mut loaded = programs.loader(vec![names::programs::SCHED_EXIT])()?;
    let prog = loaded
        .remove(names::programs::SCHED_EXIT)
        .ok_or(AttachError::Missing("exit tracepoint program"))?;
    let event = system::tracepoint_dir("sched", "sched_process_exit");
    Ok(multi::attach_tracepoint(prog.as_fd(), &event)?)
}

/// Whether `pid` is a running process's: `/proc/PID` also opens for a thread of another
/// process, whose id may be an exited rank's pid given out again.
fn is_running_process(pid: u32) -> bool {
    crate::discover::thread_group_of(pid) == Some(pid)
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSymbol, SymbolKind};

    /// A thread's id opens under /proc as a process's does: it is not a running process.
    #[test]
    fn a_threads_id_is_no_running_process() {
        assert!(super::is_running_process(std::process::id()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let running = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).expect("send");
            let _ = stopped.recv();
        });
        let live = rx.recv().expect("tid");
        assert!(std::path::Path::new(&format!("/proc/{live}")).exists());
        assert!(!super::is_running_process(live as u32));
        drop(stop);
        running.join().expect("the thread");
        // pid_max is at most 2^22.
        assert!(!super::is_running_process(4_194_305));
    }

    /// The return path's decoding and event description are BPF global functions, which
    /// the kernel's verifier checks once each (`global_return_path!` and
    /// `global_p2p_return!` in `collector-ebpf/src/probe.rs`). One made static (not `pub extern "C"`, or mangled)
    /// still works, and is checked again for every state it is reached in (three
    /// to five times the verifier's work, seconds of each start).
    #[test]
    fn the_return_paths_global_functions_stay_global() {
        let file = object::File::parse(super::BPF_OBJECT).expect("the BPF object");
        let mut global = Vec::new();
        for sym in file.symbols().filter(|s| s.kind() == SymbolKind::Text) {
            let name = sym.name().unwrap_or_default();
            if name.starts_with("decode_") || name.starts_with("describe_") {
                assert!(
                    sym.is_global(),
                    "{name} is static: global_return_path! declares it `pub extern \"C\"`, unmangled"
                );
                global.push(name.to_string());
            }
        }
        // Decoding and description for each of the six return paths, and the three MPI
        // ABIs' point-to-point decoding (`global_p2p_return!`).
        assert_eq!(global.len(), 15, "{global:?}");
    }
}
