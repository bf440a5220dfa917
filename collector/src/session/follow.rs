//! How a session follows processes: the kernel's process events (fork, exec, exit, identity),
//! rescans for libraries loaded later and for exits that never reached us, processes the
//! counters show before userspace knew them, and processes running before commtap (the
//! daemon's adoption). `discover` reads `/proc`; this applies what it read to the session's
//! watched set and probes.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use anyhow::Result;
use tokio::sync::{mpsc, Mutex};
use tracing::{debug, warn};

use super::Session;
use crate::{
    clock::{cpu_spent, monotonic_ns},
    discover::{
        self,
        tracked::{MapsDue, Tracked},
        MappedObject, ProcessInfo,
    },
    ingest::ProcessEvent,
    profile::build::job_key,
    symbols::{file::FileError, LibraryFile, MpiTransport},
};
use collector_common::ComponentAddrs;

/// How long a process paused at a library load may wait before it is continued anyway: a
/// safety net where its event never came (it is sent before the pause), and the most it
/// waits where its owner's share of reading time is spent.
const PAUSE_OVERDUE: std::time::Duration = std::time::Duration::from_secs(2);

/// How soon a process whose mappings were not read (too many) is looked at again, at most.
const UNREAD_LOOK_AGAIN: std::time::Duration = std::time::Duration::from_mins(1);

/// Opens the file `pid` maps as `o`, exactly that file (see `symbols::file`).
pub fn open_object(pid: u32, o: &MappedObject) -> Result<LibraryFile, FileError> {
    LibraryFile::open_mapped(pid, o.range, o.dev_inode, &o.path.display().to_string())
}

/// A library file opened and read.
pub struct ReadLibrary {
    /// Its identity.
    dev_inode: (u64, u64),
    /// The open file.
    file: LibraryFile,
    /// What reading it found.
    kind: Result<crate::symbols::LibraryKind, crate::symbols::SymbolError>,
    /// The process it was read for, and the CPU time that took.
    pid: u32,
    spent: std::time::Duration,
}

/// Opens and reads `objects` (blocking file-system work: call it off the session's lock,
/// from a blocking task).
pub fn read_libraries(objects: Vec<(u32, MappedObject)>) -> Vec<ReadLibrary> {
    objects
        .into_iter()
        .filter_map(|(pid, o)| {
            let (read, spent) = cpu_spent(|| {
                let file = open_object(pid, &o).ok()?;
                let kind = crate::symbols::read_library(&file);
                Some((file, kind))
            });
            let (file, kind) = read?;
            Some(ReadLibrary {
                dev_inode: o.dev_inode,
                file,
                kind,
                pid,
                spent,
            })
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
    /// The objects `pid` maps, read within its owner's share of the daemon's time for
    /// reading lists of mappings (`discover::read_share`).
    fn objects_of(&mut self, pid: u32) -> Result<Vec<MappedObject>, discover::DiscoverError> {
        let objects = self.shared_read(pid, discover::mapped_objects_in)?;
        // Every read of a process's mappings passes here: a decision not to probe a file
        // holds for the contents it was made on, and is forgotten where they are others.
        for o in &objects {
            self.probes.forget_if_changed(o.dev_inode, o.stamp);
        }
        Ok(objects)
    }

    /// `read` of `pid`'s `/proc` directory, within its owner's share of reading time.
    fn shared_read<T>(
        &mut self,
        pid: u32,
        read: impl FnOnce(&discover::process_dir::ProcessDir) -> Result<T, discover::DiscoverError>,
    ) -> Result<T, discover::DiscoverError> {
        let process = discover::process_dir::ProcessDir::open(pid, None)?;
        let probes = &self.probes;
        self.read_shares
            .read_process(&process, |uid| probes.account_of(uid), read)
    }

    /// Probes every MPI library `pid` maps; whether it maps one (`None`: its owner's share
    /// of reading time is spent: it is read when the share allows, see [`Self::rescan`]).
    pub fn attach_mapped(&mut self, pid: u32) -> Option<bool> {
        let (objects, due) = self.mapped_by(pid)?;
        let (maps_mpi, spent) = cpu_spent(|| self.attach_objects(pid, &objects));
        self.charge(pid, spent);
        if due.is_some_and(|d| d.fabrics) {
            self.find_open_fabrics(pid, &objects);
        }
        // Only one paused at the load it was owed a read for (its pause not overdue since,
        // as `rescan` notes): a pause at `MPI_Pcontrol` is in the same list.
        if due.is_some_and(|d| d.continue_it) && self.probes.is_paused(pid) {
            self.continue_loaded(pid);
        }
        Some(maps_mpi)
    }

    /// Charges `pid`'s owner `spent` of CPU done for it (its real user, from `/proc` where
    /// it is not tracked yet).
    fn charge(&mut self, pid: u32, spent: std::time::Duration) {
        let uid = self.tracked.get(&pid).and_then(Tracked::uid).or_else(|| {
            discover::process_dir::ProcessDir::open(pid, None)
                .and_then(|p| p.real_uid())
                .ok()
        });
        if let Some(uid) = uid {
            let account = self.probes.account_of(uid);
            self.read_shares.charge(account, spent);
        }
    }

    /// The objects `pid` maps (none if they cannot be read: it exited, say); why they were
    /// not read kept for `ps`, where they were not (an ended process said nothing of: its
    /// exit is reported as such), with what was owed it where it was due. `None` where its
    /// owner's share is spent: it is due.
    fn mapped_by(&mut self, pid: u32) -> Option<(Vec<MappedObject>, Option<MapsDue>)> {
        let read = match self.read_while_paused.get(&pid) {
            Some(objects) if self.probes.is_paused(pid) => Ok(objects.clone()),
            _ => self.objects_of(pid),
        };
        let spent = matches!(read, Err(discover::DiscoverError::ShareSpent { .. }));
        let (objects, unread) = read.map_or_else(
            |e| {
                debug!(pid, error = %e, "mappings not read");
                let gone = matches!(e, discover::DiscoverError::NoSuchProcess(_));
                (Vec::new(), (!gone).then(|| e.to_string()))
            },
            |objects| (objects, None),
        );
        let mut due = None;
        if let Some(t) = self.tracked.get_mut(&pid) {
            t.unread = unread.map(|why| (why, std::time::Instant::now()));
            if spent {
                t.maps_due.get_or_insert_default();
            } else {
                due = t.maps_due.take();
            }
        }
        (!spent).then_some((objects, due))
    }

    /// A span for what is done to `pid`, with its rank and job as far as they are known:
    /// `--log debug` output can be filtered by rank.
    fn process_span(&self, pid: u32) -> tracing::Span {
        let info = self.tracked.get(&pid).and_then(|t| t.info.as_ref());
        tracing::info_span!(
            "process",
            pid,
            rank = info.and_then(|i| i.rank),
            job = info.map(job_key).unwrap_or_default()
        )
    }

    /// Probes every MPI library among `objects` (mapped by `pid`); whether there is one.
    fn attach_objects(&mut self, pid: u32, objects: &[MappedObject]) -> bool {
        let _process = self.process_span(pid).entered();
        if self.probes.call_sites() && !objects.is_empty() {
            self.site_files.ask(pid, objects);
            if let Some(t) = self.tracked.get_mut(&pid) {
                // The files read now first; those it no longer maps kept behind them (a
                // program rebuilt while it runs: its sites are still its old file's).
                let earlier = std::mem::take(&mut t.objects);
                t.objects = objects.to_vec();
                t.objects.extend(
                    earlier
                        .into_iter()
                        .filter(|o| !objects.iter().any(|n| n.dev_inode == o.dev_inode)),
                );
            }
        }
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
            warn!(error = %e, "libfabric code ranges not set");
        }
        let mut any = false;
        let owner = self.tracked.get(&pid).and_then(Tracked::uid);
        // Fortran bindings first: in a process running already, an MPI call made through a
        // binding while only the MPI was probed would be counted at the binding's site.
        let mut ordered: Vec<&MappedObject> = objects.iter().collect();
        ordered.sort_by_key(|o| !discover::is_fortran_bindings_path(&o.path));
        for o in ordered {
            match self
                .probes
                .attach_library(o.dev_inode, false, || open_object(pid, o))
            {
                Ok(true) => any = true,
                Ok(false) => {}
                Err(e) => warn!(library = %o.path.display(), error = %e, "not probed"),
            }
            self.probes.note_mapped(o.dev_inode, pid);
            self.find_mpi_transport(pid, o);
            if let (Some(uid), Some(lib)) = (owner, self.probes.library_of(o.dev_inode)) {
                self.library_users
                    .entry(lib.path.clone())
                    .or_default()
                    .insert(uid);
            }
        }
        any
    }

    /// Where `o` (mapped by `pid`) is an MPI that says which of its transports a process
    /// uses: tells the kernel where Open MPI's selection will be (read at `MPI_Init`'s
    /// return) and reads it now in case that return was before commtap; takes MPICH's
    /// device as built.
    fn find_mpi_transport(&mut self, pid: u32, o: &MappedObject) {
        if self
            .tracked
            .get(&pid)
            .is_none_or(|t| t.mpi_transport.is_some())
        {
            return;
        }
        let Some(lib) = self.probes.library_of(o.dev_inode) else {
            return;
        };
        let found = match lib.mpi_transport.clone() {
            MpiTransport::Unknown => return,
            MpiTransport::Device(device) => Some(device),
            MpiTransport::OpenMpi { pml, mtl } => {
                let Some(bias) = o.bias else {
                    return;
                };
                let at = ComponentAddrs {
                    pml: bias.wrapping_add(pml),
                    mtl: mtl.map_or(0, |m| bias.wrapping_add(m)),
                };
                if let Err(e) = self.probes.set_mpi_components(pid, at) {
                    debug!(error = %e, "Open MPI's components not looked for");
                }
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.components_at = Some(at);
                }
                self.components_in_memory(pid, at)
            }
        };
        if let (Some(t), Some(found)) = (self.tracked.get_mut(&pid), found) {
            t.mpi_transport = Some(found);
        }
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

    /// Starts counting `pid` (already tracked) from now, probing what it maps; with the
    /// processes it starts from now on where `descendants`.
    pub fn watch_tracked(&mut self, pid: u32, descendants: bool) -> Result<()> {
        if self.probes.numbering_was_stopped(pid) {
            // Now, before any event of its from now on: who-is-late starts its numbers
            // again (those it queued before its detach were told before their detach).
            self.ingest_counters
                .tell(crate::ingest::FeedItem::Detached(pid));
        }
        self.probes.watch(pid, descendants)?;
        // Where its owner's share is spent, it is probed, and its fabrics looked for, when
        // read (a rescan).
        let (objects, _) = self.mapped_by(pid).unwrap_or_else(|| {
            if let Some(due) = self.tracked.get_mut(&pid).and_then(|t| t.maps_due.as_mut()) {
                due.fabrics = true;
            }
            Default::default()
        });
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
    /// calls were not seen), from its memory (`discover::memory::open_fabrics`); `objects` are what
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
            let Some(m) = discover::memory::Mapping::of(o) else {
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
        let found = discover::memory::open_fabrics(pid, &mappings, &providers);
        if !self.still_the_process(pid) {
            return;
        }
        if let Some(t) = self.tracked.get_mut(&pid) {
            t.fabrics.extend(
                found
                    .into_iter()
                    .map(|(provider, name)| crate::discover::Fabric { provider, name }),
            );
        }
    }

    /// The objects that the processes new in `batch` map and that were never read (or were
    /// decided on as other contents): what [`read_libraries`] reads off the session's lock
    /// before `apply_events` attaches them.
    pub fn unread_objects(&mut self, batch: &[ProcessEvent]) -> Vec<(u32, MappedObject)> {
        let mut out: Vec<(u32, MappedObject)> = Vec::new();
        let mut listed = std::collections::HashSet::new();
        let mut read = std::collections::HashSet::new();
        for ev in batch {
            let (ProcessEvent::Exec { pid, .. }
            | ProcessEvent::Discovered { pid, .. }
            | ProcessEvent::Loaded { pid, .. }) = ev
            else {
                continue;
            };
            // Once a batch (an exec comes with the pause of its new image).
            if !read.insert(*pid) {
                continue;
            }
            let Ok(objects) = self.objects_of(*pid) else {
                continue;
            };
            for o in &objects {
                if !self.probes.knows(o.dev_inode) && listed.insert(o.dev_inode) {
                    out.push((*pid, o.clone()));
                }
            }
            // Paused at the event, it maps nothing new until continued: its attaches take
            // this list rather than read it again (a PyTorch rank is paused at hundreds
            // of loads).
            if self.probes.is_paused(*pid) {
                self.read_while_paused.insert(*pid, objects);
            }
        }
        out
    }

    /// Keeps what [`read_libraries`] read, for the attaches to come; which files those are.
    pub fn add_read_libraries(&mut self, read: Vec<ReadLibrary>) -> Vec<(u64, u64)> {
        read.into_iter()
            .filter_map(|r| {
                self.charge(r.pid, r.spent);
                self.probes
                    .read_ahead(r.dev_inode, r.file, r.kind)
                    .then_some(r.dev_inode)
            })
            .collect()
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
            // Counted from the kernel's own reading of the fork or exec: a short rank may
            // have come and gone by the time userspace reads the event.
            ProcessEvent::Fork {
                pid,
                parent,
                uid,
                ts_ns,
            } => {
                // A new thread passes the kernel's fork tracepoint too: its calls count to
                // its process, and tracked on its own it would have its process's maps
                // read again at every tick. Only a thread of the forking process is left
                // out (a child gone since, its pid a thread of another's now, is not).
                if discover::thread_group_of(pid).is_some_and(|tgid| tgid != pid && tgid == parent)
                {
                    return;
                }
                let t = self
                    .tracked
                    .entry(pid)
                    .or_insert_with(|| Tracked::since(ts_ns));
                t.kernel_uid = Some(uid);
            }
            ProcessEvent::Exec { pid, uid, .. } | ProcessEvent::Discovered { pid, uid } => {
                let since = match ev {
                    ProcessEvent::Exec { ts_ns, .. } => ts_ns,
                    // Counted from its first MPI call: the kernel saw it before we did.
                    _ => 0,
                };
                let t = self
                    .tracked
                    .entry(pid)
                    .or_insert_with(|| Tracked::since(since));
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
                let maps = self.attach_mapped(pid).unwrap_or(false);
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.maps_mpi |= maps;
                }
                self.seed(pid);
            }
            ProcessEvent::Identity { pid, mut info } => {
                // Placed by the process the kernel described, not another given its pid
                // since (its start checked).
                let start = info.known_start();
                if let Ok(process) = discover::process_dir::ProcessDir::open(pid, start) {
                    info.place(&process);
                }
                // Sent just before the event that makes the process known (an exec or its
                // first call in watch-all mode): counted since the kernel saw it.
                let t = self.tracked.entry(pid).or_default();
                t.kernel_uid = info.uid;
                t.kernel_info = Some(*info);
            }
            ProcessEvent::Loaded { pid, .. } => {
                // Paused by the kernel until what it just mapped is probed; where its
                // owner's share of reading time is spent, until a rescan reads it (or the
                // pause's own limit: `PAUSE_OVERDUE`).
                let Some(maps) = self.attach_mapped(pid) else {
                    if let Some(due) = self.tracked.get_mut(&pid).and_then(|t| t.maps_due.as_mut())
                    {
                        due.continue_it = true;
                    }
                    return;
                };
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.maps_mpi |= maps;
                }
                self.continue_loaded(pid);
            }
            ProcessEvent::Pcontrol {
                pid,
                level,
                paused,
                ts_ns,
            } => {
                // Read while the kernel holds the process at the call: the region's bound.
                let now = crate::stats::region::Reading {
                    counters: self
                        .probes
                        .read_counters()
                        .into_iter()
                        .filter(|(k, ..)| k.tgid == pid)
                        .collect(),
                    peers: self.probes.read_peers_of(pid),
                };
                let ps = self.probes.read_proc_stats(pid);
                if let Some(t) = self.tracked.get_mut(&pid) {
                    let origin = crate::profile::build::counted_from(t, &ps);
                    t.region.control(level, ts_ns, now, paused, origin);
                }
                if paused && self.probes.resume(pid).is_some() {
                    debug!(
                        pid,
                        level, "continued after reading its counters at MPI_Pcontrol"
                    );
                }
            }
            ProcessEvent::FabricOpened { pid, fabric } => {
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.fabrics.insert(fabric);
                }
            }
            ProcessEvent::MpiTransport { pid, transport } => {
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.mpi_transport = Some(transport);
                }
            }
            ProcessEvent::Exit { pid, ts_ns } => {
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.exit_ns = Some(ts_ns);
                    // What the kernel added up of a process that never mapped MPI (a
                    // launched job's shells) has no profile to go to.
                    // One never read for want of its owner's share may have.
                    if !t.maps_mpi && t.maps_due.is_none() {
                        self.probes.forget_usage(pid);
                    }
                }
            }
        }
    }

    /// Applies every queued process event.
    pub fn drain_process_events(&mut self) {
        let batch = queued(Vec::new(), &mut self.events);
        self.apply_events(batch);
    }

    /// Picks up libraries loaded since the last look (dlopen) and processes that ended
    /// without an exit event reaching us; renews pausing at library loads, and continues
    /// processes paused too long. Call it on every tick of the loop that handles events.
    pub fn rescan(&mut self) {
        if let Err(e) = self.probes.renew_pause_lease() {
            warn!("{e:#}");
        }
        let mut never_came = 0;
        for pid in self.probes.resume_overdue(PAUSE_OVERDUE) {
            // Continued: its due read no longer continues it (it may be paused at
            // `MPI_Pcontrol` by then).
            match self.tracked.get_mut(&pid).and_then(|t| t.maps_due.as_mut()) {
                Some(due) if due.continue_it => due.continue_it = false,
                _ => never_came += 1,
            }
        }
        if never_came > 0 {
            warn!(
                never_came,
                "continued processes paused at a library load whose event never came"
            );
        }
        // Due processes from the one after the last read on: each refill of a share goes
        // to the next of its user's processes in turn, not to the lowest pid.
        let (after, upto): (Vec<u32>, Vec<u32>) = self
            .tracked
            .iter()
            .filter(|(_, t)| t.exit_ns.is_none())
            .map(|(p, _)| *p)
            .partition(|&p| p > self.last_due_read);
        for pid in after.into_iter().chain(upto) {
            if !self.probes.is_watched(pid) || !Path::new(&format!("/proc/{pid}")).exists() {
                if let Some(t) = self.tracked.get_mut(&pid) {
                    t.exit_ns = Some(monotonic_ns());
                }
                continue;
            }
            self.look_for_components_after_init(pid);
            let pages = discover::address_space_pages(pid);
            let Some(t) = self.tracked.get_mut(&pid) else {
                continue;
            };
            // One due (its owner's share was spent) is read as soon as the share allows.
            let due = t.maps_due.is_some();
            if !due && pages.is_some() && t.seen_pages == pages {
                continue;
            }
            // One whose list of mappings is past what is read of one: looked at again once
            // a minute at most, however often its mappings change (each look reads the
            // most there is to read, its environment too).
            if !due
                && t.unread
                    .as_ref()
                    .is_some_and(|u| u.1.elapsed() < UNREAD_LOOK_AGAIN)
            {
                continue;
            }
            t.seen_pages = pages;
            let needs_info = t.info.as_ref().is_none_or(|i| i.rank.is_none());
            if needs_info && !self.identity_from_kernel {
                // Read as often as its mappings change, its environment too: within its
                // owner's share.
                if let Ok(info) = self.shared_read(pid, discover::process_info_in) {
                    if let Some(t) = self.tracked.get_mut(&pid) {
                        t.info = Some(info);
                    }
                    self.seed(pid);
                }
            }
            let Some(maps) = self.attach_mapped(pid) else {
                continue;
            };
            if let Some(t) = self.tracked.get_mut(&pid) {
                t.maps_mpi |= maps;
            }
            if due {
                self.last_due_read = pid;
            }
        }
    }

    /// Continues `pid` paused at a library load, now that what it loaded is probed.
    fn continue_loaded(&mut self, pid: u32) {
        if let Some(paused) = self.probes.resume(pid) {
            self.pauses.add(paused);
            debug!(pid, ?paused, "continued after probing what it loaded");
        }
    }

    /// The components `pid`'s Open MPI selected, read from its memory where `at` says, if
    /// it is still the process tracked as it after the read.
    fn components_in_memory(&self, pid: u32, at: ComponentAddrs) -> Option<String> {
        discover::memory::mpi_components(pid, at).filter(|_| self.still_the_process(pid))
    }

    /// Whether `pid` is still the process tracked as it (its start time unchanged), asked
    /// after its memory was read: a pid reused in between would have shown another
    /// process's memory. Unknown start times are not taken as a match.
    fn still_the_process(&self, pid: u32) -> bool {
        let known = self
            .tracked
            .get(&pid)
            .and_then(|t| t.info.as_ref().or(t.kernel_info.as_ref()))
            .map(|i| i.start_ticks)
            .filter(|s| *s != 0);
        known.is_some() && known == discover::start_ticks(pid)
    }

    /// Reads the components `pid`'s Open MPI selected, once, after its `MPI_Init` has
    /// returned, where neither the kernel (at that return) nor the read at attach named them.
    fn look_for_components_after_init(&mut self, pid: u32) {
        let Some(t) = self.tracked.get(&pid) else {
            return;
        };
        let Some(at) = t.components_at.filter(|_| t.mpi_transport.is_none()) else {
            return;
        };
        if self.probes.read_proc_stats(pid).init_ns == 0 {
            return;
        }
        let found = self.components_in_memory(pid, at);
        if let Some(t) = self.tracked.get_mut(&pid) {
            t.components_at = None;
            t.mpi_transport = found;
        }
    }

    /// Tracks processes that the counters show made MPI calls but that are not tracked yet
    /// (in watch-all mode the kernel counts processes before userspace knows them).
    pub fn track_counted(&mut self) {
        let counted: BTreeSet<u32> = self
            .probes
            .read_counters()
            .iter()
            .map(|(k, ..)| k.tgid)
            .collect();
        for pid in counted {
            // A call under way at a detach may still count once: not a reason to watch again.
            if self.tracked.contains_key(&pid) || self.probes.is_ignored(pid) {
                continue;
            }
            let mut t = Tracked::from_now();
            t.info = discover::process_info(pid).ok();
            t.maps_mpi = true;
            // Counted since its start: the daemon's probes were there before it.
            t.since_ns = 0;
            self.tracked.insert(pid, t);
            if let Err(e) = self.probes.watch(pid, false) {
                warn!(pid, error = %e, "not watched");
            }
            self.seed(pid);
        }
    }
}
/// Applies a batch of process events to a session shared behind a lock (the daemon's): the
/// libraries the new processes map are opened and read first, in a blocking task and off
/// the lock (a slow file system holds up neither the API nor the other processes), then
/// attached under it.
pub async fn apply_events_shared(session: &Mutex<Session>, batch: Vec<ProcessEvent>) {
    let unread = session.lock().await.unread_objects(&batch);
    let mut read_ahead = Vec::new();
    if !unread.is_empty() {
        let read = tokio::task::spawn_blocking(move || read_libraries(unread))
            .await
            .unwrap_or_default();
        read_ahead = session.lock().await.add_read_libraries(read);
    }
    let mut session = session.lock().await;
    session.apply_events(batch);
    session.read_while_paused.clear();
    // Each holds its file open: one read for a process that ended before it was attached
    // (or was not read again: its owner's share spent) is never kept past its batch, or a
    // user making new files and ending their processes would use up the daemon's
    // descriptors.
    session.probes.drop_read_ahead(&read_ahead);
}

impl Session {
    /// Starts watching the MPI and NCCL processes that were running before commtap and that
    /// `admits` (the daemon's scope), counted from now.
    pub fn adopt_running(&mut self, admits: impl Fn(u32, Option<&ProcessInfo>) -> bool) {
        // A process detached on request stays so until it is attached again.
        let known = |pid| self.tracked.contains_key(&pid) || self.probes.is_ignored(pid);
        let (probes, shares) = (&self.probes, &mut self.read_shares);
        let read_maps = |p: &discover::process_dir::ProcessDir| {
            shares.read_process(
                p,
                |uid| probes.account_of(uid),
                discover::process_dir::ProcessDir::maps,
            )
        };
        let infos: BTreeMap<u32, Option<ProcessInfo>> =
            discover::rank_library_processes(known, read_maps)
                .into_iter()
                .map(|pid| (pid, discover::process_info(pid).ok()))
                .collect();
        if infos.is_empty() {
            return;
        }
        // A rank's helpers (DataLoader workers: numbered as it is, mapping what it maps) are
        // no ranks, as a profiler started before them would not have counted them either.
        let tree = discover::process_tree();
        let numbering = |pid: u32| {
            let tracked = self.tracked.get(&pid).and_then(Tracked::rank_numbering);
            tracked.or_else(|| infos.get(&pid)?.as_ref().map(ProcessInfo::numbering))
        };
        let helpers: std::collections::BTreeSet<u32> = infos
            .keys()
            .copied()
            .filter(|&pid| discover::is_helper(pid, &tree, numbering))
            .collect();
        for (pid, info) in infos {
            if helpers.contains(&pid) || !admits(pid, info.as_ref()) {
                continue;
            }
            let mut t = Tracked::from_now();
            t.info = info;
            self.tracked.insert(pid, t);
            if let Err(e) = self.watch_tracked(pid, false) {
                warn!(pid, error = format!("{e:#}"), "not watched");
            }
        }
    }
}
