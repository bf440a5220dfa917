//! A profiling session: loaded probes, the processes they watch, the ingest task, and the
//! profile built from the kernel's counters on demand. `record` runs one to completion; a
//! long-running daemon keeps one and takes snapshots of it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
};

use anyhow::{Context, Result};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::{
    attach::{AttachedLibrary, LoadOptions, Probes},
    discover::{self, MappedObject, ProcessInfo},
    ingest::{self, monotonic_ns, IngestCounters, ProcessEvent},
    report::{JobProfile, ProbedLibrary, RankProfile, SCHEMA},
    stats,
    symbols::{file::FileError, LibraryFile, Placement},
};

/// What the session keeps per watched process.
#[derive(Debug, Default)]
pub struct Tracked {
    /// Identity and launcher environment, once read.
    pub info: Option<ProcessInfo>,
    /// Monotonic ns from which its calls are counted (attach, or fork for launched ones).
    pub since_ns: u64,
    /// Monotonic ns at which it exited.
    pub exit_ns: Option<u64>,
    /// Asked for by the user (reported even without MPI calls).
    pub requested: bool,
    /// Whether it maps an MPI library commtap probes.
    pub maps_mpi: bool,
    /// Address-space size when its mappings were last read. Reading `/proc/PID/maps` walks
    /// the process's memory map (measured: 4% of a core for a 2-rank job every 200 ms,
    /// taken from the ranks on a busy node), so rescans wait for this to change (dlopen).
    pub seen_pages: Option<u64>,
    /// libfabric fabrics it opened.
    pub fabrics: BTreeSet<crate::report::Fabric>,
    /// Its real user id as the kernel gave it with the event that made it known: a rank
    /// that exits before its `/proc` entry is read still has an owner.
    pub kernel_uid: Option<u32>,
    /// Its identity as the kernel captured it when it became known (environment,
    /// arguments, start time): what is used when `/proc` cannot be read in time.
    pub kernel_info: Option<ProcessInfo>,
}

impl Tracked {
    /// Its owner: from `/proc` once read, else from the kernel's event.
    pub fn uid(&self) -> Option<u32> {
        self.info.as_ref().and_then(|i| i.uid).or(self.kernel_uid)
    }

    /// A process counted from now on.
    pub fn from_now() -> Tracked {
        Tracked {
            since_ns: monotonic_ns(),
            ..Default::default()
        }
    }
}

/// Loaded probes, the watched processes and the ingest task.
pub struct Session {
    /// The kernel side.
    pub probes: Probes,
    /// Watched processes by pid.
    pub tracked: BTreeMap<u32, Tracked>,
    /// Process lifecycle events from the ingest task.
    pub events: mpsc::UnboundedReceiver<ProcessEvent>,
    ingest_counters: Arc<IngestCounters>,
    cancel: CancellationToken,
    ingest: Option<JoinHandle<()>>,
    /// Job id given to each job key (see `job_key`), kept stable across profiles.
    job_ids: BTreeMap<String, String>,
    /// Take new processes' identities from the kernel's identity events only, never from
    /// `/proc` (for tests: what a process that exits at once gets).
    pub identity_from_kernel: bool,
    /// The owners of the processes seen mapping each probed library (by its path as
    /// reports show it): a user is shown the libraries of its own processes only.
    library_users: BTreeMap<String, BTreeSet<u32>>,
}

/// The objects `pid` maps (none if its maps cannot be read: it exited, say).
fn objects_of(pid: u32) -> Vec<MappedObject> {
    discover::mapped_objects(pid).unwrap_or_else(|e| {
        debug!("PID {pid}: {e}");
        Vec::new()
    })
}

/// Opens the file `pid` maps as `o`, exactly that file (see `symbols::file`).
pub fn open_object(pid: u32, o: &MappedObject) -> Result<LibraryFile, FileError> {
    LibraryFile::open_mapped(pid, o.range, o.dev_inode, &o.path.display().to_string())
}

/// A library file opened and read: its identity, the open file, what reading it found.
pub type ReadLibrary = (
    (u64, u64),
    LibraryFile,
    Result<crate::symbols::LibraryKind, crate::symbols::SymbolError>,
);

/// Opens and reads `objects` (blocking file-system work: call it off the session's lock,
/// from a blocking task).
pub fn read_libraries(objects: Vec<(u32, MappedObject)>) -> Vec<ReadLibrary> {
    objects
        .into_iter()
        .filter_map(|(pid, o)| {
            let file = open_object(pid, &o).ok()?;
            let kind = crate::symbols::read_library(&file);
            Some((o.dev_inode, file, kind))
        })
        .collect()
}

/// `first` (if any) and every event queued behind it in `rx`.
pub fn queued(
    first: Vec<ProcessEvent>,
    rx: &mut mpsc::UnboundedReceiver<ProcessEvent>,
) -> Vec<ProcessEvent> {
    let mut batch = first;
    while let Ok(ev) = rx.try_recv() {
        batch.push(ev);
    }
    batch
}

impl Session {
    /// Loads the probes and starts draining the ring buffer.
    pub fn start(opts: LoadOptions) -> Result<Session> {
        let mut probes = Probes::load(opts).context("setting up the probes")?;
        let ring = probes.take_events().context("ring buffer already taken")?;
        let (tx, events) = mpsc::unbounded_channel();
        let ingest_counters = Arc::new(IngestCounters::default());
        let cancel = CancellationToken::new();
        let ingest = tokio::spawn(ingest::run(
            ring,
            tx,
            ingest_counters.clone(),
            cancel.clone(),
        ));
        Ok(Session {
            probes,
            tracked: BTreeMap::new(),
            events,
            ingest_counters,
            cancel,
            ingest: Some(ingest),
            job_ids: BTreeMap::new(),
            identity_from_kernel: false,
            library_users: BTreeMap::new(),
        })
    }

    /// Stops the ingest task after a last drain of the ring buffer (call events are
    /// batched, so the last ones are only counted after this).
    pub async fn stop_ingest(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.ingest.take() {
            let _ = task.await;
        }
    }

    /// Probes the library file at `path` now (before any process maps it).
    pub fn attach_file(&mut self, path: &Path) -> Result<bool> {
        let file = LibraryFile::open_path(path)?;
        Ok(self
            .probes
            .attach_library(file.identity, true, || Ok(file))?)
    }

    /// Probes every MPI library `pid` maps; returns whether it maps one.
    pub fn attach_mapped(&mut self, pid: u32) -> bool {
        let objects = objects_of(pid);
        self.attach_objects(pid, &objects)
    }

    /// Probes every MPI library among `objects` (mapped by `pid`); whether there is one.
    fn attach_objects(&mut self, pid: u32, objects: &[MappedObject]) -> bool {
        // libfabric's code ranges first: a provider's probes must never fire before the
        // kernel can tell its calls to the provider beneath from the application's.
        let mut fabric_code = Vec::new();
        for o in objects {
            if self
                .probes
                .is_fabric_file(o.dev_inode, || open_object(pid, o))
            {
                fabric_code.extend(o.code.iter().copied());
            }
        }
        if let Err(e) = self.probes.set_fabric_ranges(pid, &fabric_code) {
            warn!("PID {pid}: {e}");
        }
        let mut any = false;
        let owner = self.tracked.get(&pid).and_then(Tracked::uid);
        for o in objects {
            match self
                .probes
                .attach_library(o.dev_inode, false, || open_object(pid, o))
            {
                Ok(true) => any = true,
                Ok(false) => {}
                Err(e) => warn!("PID {pid}: {}: {e}", o.path.display()),
            }
            self.probes.note_mapped(o.dev_inode, pid);
            if let (Some(uid), Some(lib)) = (owner, self.probes.library_of(o.dev_inode)) {
                self.library_users
                    .entry(lib.path.clone())
                    .or_default()
                    .insert(uid);
            }
        }
        any
    }

    /// Tells the kernel the world size/rank the launcher gave `pid` (integer-handle ABIs).
    fn seed(&mut self, pid: u32) {
        if let Some(Tracked {
            info:
                Some(ProcessInfo {
                    world_size: Some(size),
                    rank: Some(rank),
                    ..
                }),
            ..
        }) = self.tracked.get(&pid)
        {
            let (size, rank) = (*size, *rank);
            self.probes.seed_world(pid, size, rank);
        }
    }

    /// Starts counting `pid` (already tracked) from now, probing what it maps.
    pub fn watch_tracked(&mut self, pid: u32) -> Result<()> {
        self.probes.watch(pid, false)?;
        let objects = objects_of(pid);
        let maps_mpi = self.attach_objects(pid, &objects);
        self.find_open_fabrics(pid, &objects);
        if let Some(t) = self.tracked.get_mut(&pid) {
            t.since_ns = monotonic_ns();
            t.maps_mpi = maps_mpi;
        }
        self.seed(pid);
        Ok(())
    }

    /// Names the libfabric fabrics `pid` opened before commtap attached (its `fi_fabric`
    /// calls were not seen), from its memory (`fabric::open_fabrics`); `objects` are what
    /// it maps.
    fn find_open_fabrics(&mut self, pid: u32, objects: &[MappedObject]) {
        let mut mappings = Vec::new();
        let mut providers = BTreeMap::new();
        for o in objects {
            let Some(lib) = self.probes.library_of(o.dev_inode) else {
                continue;
            };
            if lib.abi != collector_common::Abi::Fabric {
                continue;
            }
            let Some(m) = crate::fabric::Mapping::of(o) else {
                continue;
            };
            for p in &lib.fabric_providers {
                providers.insert(m.bias.wrapping_add(p.vaddr), p.name.clone());
            }
            mappings.push(m);
        }
        if providers.is_empty() {
            return;
        }
        let found = crate::fabric::open_fabrics(pid, &mappings, &providers);
        if let Some(t) = self.tracked.get_mut(&pid) {
            t.fabrics.extend(
                found
                    .into_iter()
                    .map(|(provider, name)| crate::report::Fabric { provider, name }),
            );
        }
    }

    /// The objects that the processes new in `batch` map and that were never read: what
    /// [`read_libraries`] reads off the session's lock before `apply_events` attaches them.
    pub fn unread_objects(&self, batch: &[ProcessEvent]) -> Vec<(u32, MappedObject)> {
        let mut out: Vec<(u32, MappedObject)> = Vec::new();
        for ev in batch {
            let (ProcessEvent::Exec { pid, .. } | ProcessEvent::Discovered { pid, .. }) = ev else {
                continue;
            };
            for o in objects_of(*pid) {
                if !self.probes.knows(o.dev_inode)
                    && !out.iter().any(|(_, seen)| seen.dev_inode == o.dev_inode)
                {
                    out.push((*pid, o));
                }
            }
        }
        out
    }

    /// Keeps what [`read_libraries`] read, for the attaches to come.
    pub fn add_read_libraries(&mut self, read: Vec<ReadLibrary>) {
        for (dev_inode, file, kind) in read {
            self.probes.read_ahead(dev_inode, file, kind);
        }
    }

    /// Applies `batch` (an event and those queued behind it), reading the identity (rank,
    /// job) of every new process image before attaching to any: reading one process's
    /// libraries can take longer than a short-lived rank lives.
    pub fn apply_events(&mut self, batch: Vec<ProcessEvent>) {
        let identities: Vec<Option<ProcessInfo>> = batch
            .iter()
            .map(|ev| match ev {
                ProcessEvent::Exec { pid, .. } | ProcessEvent::Discovered { pid, .. }
                    if !self.identity_from_kernel =>
                {
                    discover::process_info(*pid).ok()
                }
                _ => None,
            })
            .collect();
        for (ev, identity) in batch.into_iter().zip(identities) {
            self.on_process_event(ev, identity);
        }
    }

    /// Applies a process lifecycle event from the kernel; `identity` is the process's, if
    /// read ahead.
    fn on_process_event(&mut self, ev: ProcessEvent, identity: Option<ProcessInfo>) {
        match ev {
            ProcessEvent::Fork { pid, uid, .. } => {
                let t = self.tracked.entry(pid).or_insert_with(Tracked::from_now);
                t.kernel_uid = Some(uid);
            }
            ProcessEvent::Exec { pid, uid } | ProcessEvent::Discovered { pid, uid } => {
                let t = self.tracked.entry(pid).or_insert_with(|| {
                    let mut t = Tracked::from_now();
                    if matches!(ev, ProcessEvent::Discovered { .. }) {
                        // Counted from its first MPI call: the kernel saw it before we did.
                        t.since_ns = 0;
                    }
                    t
                });
                t.kernel_uid = Some(uid);
                // The new image's environment names the rank; its libraries may be new. What
                // the kernel captured stands in for a process already gone from /proc.
                let from_proc = !self.identity_from_kernel;
                t.info = identity
                    .or_else(|| {
                        from_proc
                            .then(|| discover::process_info(pid).ok())
                            .flatten()
                    })
                    .or_else(|| t.kernel_info.take())
                    .or(t.info.take());
                let maps = self.attach_mapped(pid);
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.maps_mpi |= maps;
                }
                self.seed(pid);
            }
            ProcessEvent::Identity { pid, mut info } => {
                if let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                    info.trust_cgroup(&cgroup);
                }
                let t = self.tracked.entry(pid).or_insert_with(Tracked::from_now);
                t.kernel_uid = info.uid;
                t.kernel_info = Some(*info);
            }
            ProcessEvent::FabricOpened { pid, fabric } => {
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.fabrics.insert(fabric);
                }
            }
            ProcessEvent::Exit { pid, ts_ns } => {
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.exit_ns = Some(ts_ns);
                }
            }
        }
    }

    /// Starts watching the running process `pid` on request (the daemon's AttachProcess).
    pub fn attach(&mut self, pid: u32) -> Result<&Tracked> {
        let info = discover::process_info(pid)?;
        self.tracked.insert(
            pid,
            Tracked {
                info: Some(info),
                requested: true,
                ..Tracked::from_now()
            },
        );
        self.watch_tracked(pid)?;
        Ok(&self.tracked[&pid])
    }

    /// Stops watching `pid` for good and returns its profile so far (None if it is not
    /// tracked or made no call).
    pub fn detach(&mut self, pid: u32) -> Result<Option<RankProfile>> {
        if !self.tracked.contains_key(&pid) {
            return Ok(None);
        }
        self.probes.ignore(pid)?;
        let rank = self
            .profile(monotonic_ns())
            .ranks
            .into_iter()
            .find(|r| r.pid == pid);
        self.probes.forget_process(pid);
        self.tracked.remove(&pid);
        Ok(rank)
    }

    /// Every call event (while per-call events are on) and process exit from now on.
    pub fn call_feed(&self) -> tokio::sync::broadcast::Receiver<crate::ingest::FeedItem> {
        self.ingest_counters.feed.subscribe()
    }

    /// Hands the process-event stream to a caller that waits on it outside the session
    /// (the daemon, which shares the session behind a lock).
    pub fn take_events(&mut self) -> mpsc::UnboundedReceiver<ProcessEvent> {
        let (_, empty) = mpsc::unbounded_channel();
        std::mem::replace(&mut self.events, empty)
    }

    /// Applies every queued process event.
    pub fn drain_process_events(&mut self) {
        let batch = queued(Vec::new(), &mut self.events);
        self.apply_events(batch);
    }

    /// Picks up libraries loaded since the last look (dlopen) and processes that ended
    /// without an exit event reaching us.
    pub fn rescan(&mut self) {
        let live: Vec<u32> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.exit_ns.is_none())
            .map(|(p, _)| *p)
            .collect();
        for pid in live {
            if !self.probes.is_watched(pid) || !Path::new(&format!("/proc/{pid}")).exists() {
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.exit_ns = Some(monotonic_ns());
                }
                continue;
            }
            let pages = discover::address_space_pages(pid);
            let Some(t) = self.tracked.get_mut(&pid) else {
                continue;
            };
            if pages.is_some() && t.seen_pages == pages {
                continue;
            }
            t.seen_pages = pages;
            let needs_info = t.info.as_ref().is_none_or(|i| i.rank.is_none());
            if needs_info && !self.identity_from_kernel {
                if let Ok(info) = discover::process_info(pid) {
                    if let Some(t) = self.tracked.get_mut(&pid) {
                        t.info = Some(info);
                    }
                    self.seed(pid);
                }
            }
            let maps = self.attach_mapped(pid);
            if let Some(t) = self.tracked.get_mut(&pid) {
                t.maps_mpi |= maps;
            }
        }
    }

    /// The probed libraries as reports show them.
    pub fn library_summaries(&self) -> Vec<ProbedLibrary> {
        library_summaries(&self.probes)
    }

    /// Whether a process of `uid` was seen mapping the library shown as `path`.
    pub fn library_used_by(&self, path: &str, uid: u32) -> bool {
        self.library_users
            .get(path)
            .is_some_and(|users| users.contains(&uid))
    }

    /// Tracks processes that the counters show made MPI calls but that are not tracked yet
    /// (in watch-all mode the kernel counts processes before userspace knows them).
    pub fn track_counted(&mut self) {
        let counted: BTreeSet<u32> = self
            .probes
            .read_counters()
            .iter()
            .map(|(k, _)| k.tgid)
            .collect();
        for pid in counted {
            if self.tracked.contains_key(&pid) {
                continue;
            }
            let mut t = Tracked::from_now();
            t.info = discover::process_info(pid).ok();
            t.maps_mpi = true;
            // Counted since its start: the daemon's probes were there before it.
            t.since_ns = 0;
            self.tracked.insert(pid, t);
            if let Err(e) = self.probes.watch(pid, false) {
                warn!("PID {pid}: {e}");
            }
            self.seed(pid);
        }
    }

    /// Stops counting every tracked process (their counters stay readable).
    pub fn unwatch_all(&mut self) {
        for pid in self.tracked.keys() {
            self.probes.unwatch(*pid);
        }
    }

    /// The profile of every tracked process that made MPI calls, from the kernel's counters
    /// as they are now; `end_ns` closes the elapsed time of processes still running.
    pub fn profile(&mut self, end_ns: u64) -> JobProfile {
        let counters = self.probes.read_counters();
        let device = self.probes.read_device_time();
        let peers = self.probes.read_peers();
        let counted: BTreeSet<u32> = counters.iter().map(|(k, _)| k.tgid).collect();
        let host = discover::this_host();
        let mut ranks = Vec::new();
        let mut not_profiled = Vec::new();
        for (&pid, t) in &self.tracked {
            if !counted.contains(&pid) {
                if t.requested {
                    not_profiled.push(if t.maps_mpi {
                        format!("PID {pid}: made no MPI call while watched")
                    } else {
                        format!("PID {pid}: never mapped an MPI library")
                    });
                }
                continue;
            }
            let ps = self.probes.read_proc_stats(pid);
            let routines = stats::routines_of(pid, &counters, &device);
            let mut health: stats::Health = (&ps).into();
            health.fabric_unresolved = stats::fabric_unresolved(pid, &counters);
            health.events = self.ingest_counters.events_of(pid);
            let start = if ps.init_ns != 0 {
                ps.init_ns.max(t.since_ns)
            } else {
                t.since_ns
            };
            let end = if ps.finalize_ns != 0 {
                ps.finalize_ns
            } else {
                t.exit_ns.unwrap_or(end_ns)
            };
            let info = t.info.clone().unwrap_or(ProcessInfo {
                pid,
                ..Default::default()
            });
            let start = if start == 0 { ps.init_ns } else { start };
            ranks.push(RankProfile {
                rank: info.rank.unwrap_or(u32::MAX),
                rank_known: info.rank.is_some(),
                pid,
                host: host.clone(),
                job: job_key(&info),
                cmdline: info.cmdline.clone(),
                uid: t.uid(),
                start_ticks: info.start_ticks,
                exited: false,
                elapsed_ns: end.saturating_sub(start),
                comm_time_ns: stats::communication_ns(&routines),
                routines,
                health,
                fabrics: t.fabrics.iter().cloned().collect(),
                peers: stats::peers_of(pid, &peers),
            });
        }
        assemble(ranks, &self.probes, not_profiled, &mut self.job_ids)
    }
}

/// Tells `board` the job of every process whose environment has been read; returns the
/// calls it held for them.
pub fn place_in_worlds(
    board: &mut crate::skew::Board,
    session: &Session,
) -> Vec<crate::skew::board::Released> {
    let mut released = Vec::new();
    for (pid, t) in &session.tracked {
        if board.knows(*pid) {
            continue;
        }
        if let Some(info) = t.info.as_ref() {
            released.extend(board.set_world(*pid, &job_key(info), info.world_size));
        }
    }
    released
}

/// Groups a process with the other ranks of its job: the batch system's job id, else the
/// launcher's own job key, else one group for everything unlabelled. A batch job id that
/// only the process's environment claims is grouped per user: nobody joins another user's
/// job by setting `SLURM_JOB_ID`.
pub fn job_key(info: &ProcessInfo) -> String {
    match (&info.batch_job, &info.launcher_job) {
        (Some(b), _) if info.batch_job_from_cgroup => format!("batch:{b}"),
        (Some(b), _) => format!("claim:{}:{b}", info.uid.map_or(-1, i64::from)),
        (None, Some(l)) => format!("launcher:{l}"),
        (None, None) => String::new(),
    }
}

/// The job id a group keyed `key` (see `job_key`) is shown with: a batch job's own id, and
/// for a claimed one the same unless another group (the real job, or another user's claim)
/// has that id too: then `ID.uUID`. Else `None` (launcher keys: mpitrace's rank 0 pid).
fn batch_job_id(key: &str, keys: &[&String]) -> Option<String> {
    if let Some(batch) = key.strip_prefix("batch:") {
        return Some(batch.to_string());
    }
    let (uid, id) = key.strip_prefix("claim:")?.split_once(':')?;
    let shared = keys.iter().any(|k| {
        *k != key
            && (k.strip_prefix("batch:") == Some(id)
                || k.strip_prefix("claim:")
                    .and_then(|c| c.split_once(':'))
                    .is_some_and(|(_, other)| other == id))
    });
    Some(if shared {
        format!("{id}.u{uid}")
    } else {
        id.to_string()
    })
}

/// Orders ranks by job and rank, fills in what the environment did not say (ranks, job
/// ids: the batch system's, else mpitrace's rank 0 pid, kept stable in `job_ids`), and adds
/// the probe summary. `ranks[].job` holds the job key on entry.
fn assemble(
    mut ranks: Vec<RankProfile>,
    probes: &Probes,
    not_profiled: Vec<String>,
    job_ids: &mut BTreeMap<String, String>,
) -> JobProfile {
    let mut groups: BTreeMap<String, Vec<RankProfile>> = BTreeMap::new();
    for r in ranks.drain(..) {
        groups.entry(r.job.clone()).or_default().push(r);
    }
    let keys: Vec<String> = groups.keys().cloned().collect();
    let key_refs: Vec<&String> = keys.iter().collect();
    for (key, mut group) in groups {
        // Ranks without a launcher rank get the next free numbers, in pid order.
        group.sort_by_key(|r| (r.rank, r.pid));
        let first_free = group
            .iter()
            .filter(|r| r.rank_known)
            .map(|r| r.rank + 1)
            .max()
            .unwrap_or(0);
        for (r, rank) in group.iter_mut().filter(|r| !r.rank_known).zip(first_free..) {
            r.rank = rank;
        }
        group.sort_by_key(|r| r.rank);
        let job = match batch_job_id(&key, &key_refs) {
            Some(batch) => batch,
            None => match job_ids.get(&key) {
                Some(id) => id.clone(),
                None => {
                    let first = group
                        .first()
                        .map(|r| r.pid.to_string())
                        .unwrap_or_else(|| "0".into());
                    // Kept once rank 0 is among them (or no launcher said any rank): a job
                    // whose rank 1 was seen a moment before its rank 0 is still named after
                    // rank 0's pid.
                    if group.first().is_some_and(|r| r.rank_known && r.rank == 0)
                        || group.iter().all(|r| !r.rank_known)
                    {
                        job_ids.insert(key.clone(), first.clone());
                    }
                    first
                }
            },
        };
        for mut r in group {
            r.job = job.clone();
            ranks.push(r);
        }
    }
    ranks.sort_by(|a, b| (a.job.as_str(), a.rank).cmp(&(b.job.as_str(), b.rank)));
    let mut jobs: Vec<&str> = ranks.iter().map(|r| r.job.as_str()).collect();
    jobs.dedup();
    // One job: its id; several (a node daemon's view): empty, each rank says its own.
    let job = if jobs.len() == 1 {
        jobs[0].to_string()
    } else {
        String::new()
    };
    let libraries = library_summaries(probes);
    JobProfile {
        schema: SCHEMA.into(),
        job,
        dropped: ranks.iter().map(|r| r.health.dropped).sum(),
        undecoded: ranks.iter().map(|r| r.health.undecoded).sum(),
        ranks,
        libraries,
        unsupported_libraries: probes.unsupported().to_vec(),
        not_profiled,
        call_events: probes.call_events(),
        skew: None,
    }
}

/// The probed libraries as the report shows them.
fn library_summaries(probes: &Probes) -> Vec<ProbedLibrary> {
    probes
        .libraries()
        .map(|l| ProbedLibrary {
            path: l.library.path.clone(),
            flavor: l.library.flavor.clone(),
            probes: l.library.probes.len(),
            moved_past_single_step: names_with(l, Placement::MovedPastSingleStep),
            single_stepped: names_with(l, Placement::SingleStepped),
            failed: l.failed.clone(),
        })
        .collect()
}

fn names_with(l: &AttachedLibrary, p: Placement) -> Vec<String> {
    counted_names(
        l.library
            .probes
            .iter()
            .filter(|x| x.placement == p)
            .map(|x| x.name),
    )
}

/// Names in first-seen order, each once: a libfabric library has one probe per provider
/// function, named by its ops-table slot, so one slot's name stands for many functions
/// ("fi_msg_send (12 functions)").
fn counted_names<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for name in names {
        match seen.iter_mut().find(|(n, _)| *n == name) {
            Some((_, count)) => *count += 1,
            None => seen.push((name, 1)),
        }
    }
    seen.into_iter()
        .map(|(name, count)| match count {
            1 => name.to_string(),
            n => format!("{name} ({n} functions)"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{batch_job_id, counted_names, job_key};
    use crate::discover::ProcessInfo;

    #[test]
    fn a_claimed_job_id_never_joins_another_users_job() {
        let info = |uid, job: &str, from_cgroup| ProcessInfo {
            uid: Some(uid),
            batch_job: Some(job.to_string()),
            batch_job_from_cgroup: from_cgroup,
            ..Default::default()
        };
        let real = job_key(&info(1000, "77", true));
        let claim = job_key(&info(1001, "77", false));
        let own_claim = job_key(&info(1000, "88", false));
        assert_ne!(real, claim);
        let keys = [&real, &claim, &own_claim];
        assert_eq!(batch_job_id(&real, &keys).as_deref(), Some("77"));
        assert_eq!(batch_job_id(&claim, &keys).as_deref(), Some("77.u1001"));
        // Alone with its id (no Slurm cgroups here: tests, PBS): shown as it is.
        assert_eq!(batch_job_id(&own_claim, &keys).as_deref(), Some("88"));
        assert_eq!(batch_job_id("launcher:x", &keys), None);
    }

    #[test]
    fn probe_names_are_listed_once_with_their_count() {
        let names = [
            "fi_msg_send",
            "MPI_Test",
            "fi_msg_send",
            "fi_msg_recv",
            "fi_msg_send",
        ];
        assert_eq!(
            counted_names(names.into_iter()),
            ["fi_msg_send (3 functions)", "MPI_Test", "fi_msg_recv"]
        );
    }
}
