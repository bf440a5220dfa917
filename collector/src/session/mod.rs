//! A profiling session: loaded probes, the processes they watch, the ingest task, and the
//! profile built from the kernel's counters on demand. `record` runs one to completion; a
//! long-running daemon keeps one and takes snapshots of it. How it follows processes
//! (events, rescans, adoption) is [`follow`].

pub mod budget;
pub mod follow;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::Arc,
};

use anyhow::{Context, Result};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    attach::{LoadOptions, Probes},
    clock::monotonic_ns,
    discover::{self, tracked::Tracked},
    ingest::{self, IngestCounters, ProcessEvent},
    profile::{
        build::{self, job_key},
        JobProfile, ProbedLibrary, RankProfile,
    },
    symbols::LibraryFile,
};

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
    /// Job id given to each job key (see `profile::build::job_key`), kept stable across profiles.
    job_ids: BTreeMap<String, String>,
    /// Take new processes' identities from the kernel's identity events only, never from
    /// `/proc` (for tests: what a process that exits at once gets).
    pub identity_from_kernel: bool,
    /// The owners of the processes seen mapping each probed library (by its path as
    /// reports show it): a user is shown the libraries of its own processes only.
    library_users: BTreeMap<String, BTreeSet<u32>>,
    /// How the time of hot routines is sampled to keep the probes' cost in bounds.
    pub budget: budget::Budget,
    /// The pauses of processes at library loads (see [`Probes::set_pause_at_load`]).
    pub pauses: Pauses,
    /// The host its profiles name (this host's name; a daemon's `--node-name`).
    pub host: String,
    /// The files that name the call sites of tracked processes, where they are counted.
    pub site_files: crate::symbols::sites::SiteFiles,
    /// The files' unwinding tables (and what unwinding found that holds), for the stacks
    /// of ranks inside a call: where a long call was made from, and the call a rank
    /// attached to was already inside.
    unwinder: crate::symbols::unwind::Unwinder,
    /// Each user's share of the time spent reading their processes' lists of mappings.
    read_shares: crate::discover::read_share::ReadShares,
    /// The mappings of processes paused at their batch's events, read ahead for their
    /// attaches (within one batch: see `follow::apply_events_shared`).
    read_while_paused: BTreeMap<u32, Vec<crate::discover::MappedObject>>,
    /// The process whose mappings, due, were read last (the next due is read first).
    last_due_read: u32,
}

/// How often, and how long in all, processes were paused at library loads until probed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pauses {
    /// Pauses.
    pub count: u64,
    /// Their total.
    pub total: std::time::Duration,
    /// The longest.
    pub longest: std::time::Duration,
}

impl Pauses {
    /// Counts one pause of `d`.
    pub fn add(&mut self, d: std::time::Duration) {
        self.count += 1;
        self.total += d;
        self.longest = self.longest.max(d);
    }
}

impl std::fmt::Display for Pauses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} pause(s) at library loads until probed, {:.1} ms in all, the longest {:.1} ms",
            self.count,
            self.total.as_secs_f64() * 1e3,
            self.longest.as_secs_f64() * 1e3
        )
    }
}

impl Session {
    /// Loads the probes and starts draining the ring buffer.
    pub fn start(opts: LoadOptions) -> Result<Session> {
        let mut budget = budget::Budget::new(opts.time_sampling);
        let ingest_counters = Arc::new(IngestCounters::for_ring(opts.ring_buffer_bytes));
        let mut probes = Probes::load(opts).context("setting up the probes")?;
        // The tick count's first reading: an untimed call's age is told against it.
        crate::clock::TickClock::start(probes.task_registers());
        // A fixed sampling applies from the first call.
        budget.step(&mut probes);
        let ring = probes.take_events().context("ring buffer already taken")?;
        let (tx, events) = mpsc::unbounded_channel();
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
            budget,
            pauses: Pauses::default(),
            host: discover::this_host(),
            site_files: Default::default(),
            unwinder: Default::default(),
            read_shares: Default::default(),
            read_while_paused: BTreeMap::new(),
            last_due_read: 0,
        })
    }

    /// Keeps the probes' cost within the budget (call it every `budget::LOOK_EVERY`).
    pub fn keep_budget(&mut self) {
        self.budget.step(&mut self.probes);
    }

    /// Stops the ingest task after a last drain of the ring buffer (call events are
    /// batched, so the last ones are only counted after this).
    pub async fn stop_ingest(&mut self) {
        // Nobody is paused from now on, and nobody whose event is no longer read stays so.
        if let Err(e) = self.probes.set_pause_at_load(false) {
            tracing::warn!("{e:#}");
        }
        self.cancel.cancel();
        if let Some(task) = self.ingest.take() {
            let _ = task.await;
        }
        let _ = self.probes.resume_all();
    }

    /// Probes the library files at `paths` now, before any process maps them (a daemon's
    /// start, `record` ahead of its job, `--lib`): the programs of the ABIs found among them
    /// only, verified at once. Warns of each that could not be probed.
    pub fn attach_files(&mut self, paths: &[PathBuf]) {
        let files = open_libraries(paths);
        for (shown, e) in self.probes.attach_files(files) {
            tracing::warn!("{shown}: not probed: {:#}", anyhow::Error::from(e));
        }
    }

    /// Starts verifying the programs of the libraries at `paths`, which a job about to be
    /// launched will map (`discover::libraries_needed_by`), while it starts.
    pub fn prefetch_programs(&mut self, paths: &[PathBuf]) {
        let files = open_libraries(paths);
        self.probes.prefetch_programs(files);
    }

    /// Starts watching the running process `pid`, as `info` (read when the caller was
    /// checked) says it is, on request (the daemon's AttachProcess, `record --pid`);
    /// `earlier` is its profile from before it was detached, which its profile goes on
    /// from. Where it cannot be watched, nothing of it is kept.
    pub fn attach(
        &mut self,
        pid: u32,
        info: discover::ProcessInfo,
        earlier: Option<RankProfile>,
    ) -> Result<()> {
        self.attach_as(pid, info, earlier, true)
    }

    /// Starts watching the running process `pid`, found below one asked for (`record --pid
    /// LAUNCHER --wait-for-mpi`), with the processes it starts from now on; not itself asked
    /// for (the job is over once those asked for and the MPI processes have exited).
    pub fn attach_below(&mut self, pid: u32, info: discover::ProcessInfo) -> Result<()> {
        self.attach_as(pid, info, None, false)
    }

    /// [`Session::attach`] (`requested`), or [`Session::attach_below`].
    fn attach_as(
        &mut self,
        pid: u32,
        info: discover::ProcessInfo,
        earlier: Option<RankProfile>,
        requested: bool,
    ) -> Result<()> {
        let start_ticks = info.start_ticks;
        let was_detached = self.probes.is_ignored(pid);
        self.tracked.insert(
            pid,
            Tracked {
                info: Some(info),
                requested,
                earlier: earlier.map(Box::new),
                ..Tracked::from_now()
            },
        );
        // The pid may have been reused since `info` was read: the process watched must be
        // the one the caller was checked for.
        let watched = self.watch_tracked(pid, !requested).and_then(|()| {
            if discover::start_ticks(pid) == Some(start_ticks) {
                Ok(())
            } else {
                Err(discover::DiscoverError::NoSuchProcess(pid).into())
            }
        });
        if watched.is_err() {
            self.tracked.remove(&pid);
            if was_detached {
                let _ = self.probes.ignore(pid);
            } else {
                self.probes.unwatch(pid);
            }
        }
        watched
    }

    /// Stops watching `pid` and returns its profile so far, final and marked detached (None
    /// if it is not tracked or made no call); `board` as for [`Session::profile`]. The call
    /// feed's readers are told of the detach after its last calls, at the end of the drain
    /// of the ring buffer whose number comes with the profile
    /// ([`IngestCounters::told`]).
    pub fn detach(
        &mut self,
        pid: u32,
        board: Option<&crate::skew::Board>,
    ) -> Result<(Option<RankProfile>, u64)> {
        if !self.tracked.contains_key(&pid) {
            return Ok((None, 0));
        }
        self.probes.ignore(pid)?;
        let drain = self.ingest_counters.detached(pid);
        let rank = self
            .profile(monotonic_ns(), board)
            .ranks
            .into_iter()
            // A rank attached to that made no call is profiled for where it was; detached,
            // it has nothing to tell.
            .find(|r| r.pid == pid && !r.routines.is_empty())
            .map(|r| RankProfile {
                exited: true,
                detached: true,
                // It goes on, unwatched: no call of it is read as in progress.
                in_call: None,
                in_call_unknown: false,
                ..r
            });
        self.probes.forget_process(pid);
        self.tracked.remove(&pid);
        Ok((rank, drain))
    }

    /// What the ingest loop counts, and its call feed (a detach is told there: see
    /// [`Session::detach`]).
    pub fn ingest_counters(&self) -> Arc<IngestCounters> {
        self.ingest_counters.clone()
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

    /// The probed libraries as reports show them.
    pub fn library_summaries(&self) -> Vec<ProbedLibrary> {
        build::library_summaries(&self.probes)
    }

    /// Whether a process of `uid` was seen mapping the library shown as `path`.
    pub fn library_used_by(&self, path: &str, uid: u32) -> bool {
        self.library_users
            .get(path)
            .is_some_and(|users| users.contains(&uid))
    }

    /// Stops counting every tracked process (their counters stay readable).
    pub fn unwatch_all(&mut self) {
        for pid in self.tracked.keys() {
            self.probes.unwatch(*pid);
        }
    }

    /// Moves the per-peer counters of freed communicators out of the kernel's map, keyed by
    /// the names who-is-late's `board` gives them where there is one (see
    /// [`Probes::fold_peers`]).
    pub fn fold_freed_peers(&mut self, board: Option<&crate::skew::Board>) {
        let due = self.probes.freed_peers_due();
        self.fold_peers(&name_freed_peers(due, board));
    }

    /// Moves the due per-peer counters `named` out of the kernel's map
    /// ([`Probes::fold_peers`]), and has each region under way follow them.
    pub fn fold_peers(
        &mut self,
        named: &[(collector_common::PeerKey, std::time::Duration, Option<u64>)],
    ) {
        if named.is_empty() {
            return;
        }
        let moved = self.probes.fold_peers(named);
        // A region under way read them under their old keys at its start.
        for t in self.tracked.values_mut() {
            t.region.follow_moved(&moved);
        }
    }

    /// The profile of every tracked process that made MPI calls, from the kernel's counters
    /// as they are now; `end_ns` closes the elapsed time of processes still running. Who-is-
    /// late's `board`, where there is one, names communicators (their traffic then goes on
    /// world ranks).
    pub fn profile(&mut self, end_ns: u64, board: Option<&crate::skew::Board>) -> JobProfile {
        let events = &self.ingest_counters;
        let name = |pid, handle, gen: u16| {
            if gen & collector_common::PeerKey::NAMED != 0 {
                // A freed communicator's traffic, keyed by its name when it was moved out
                // of the kernel's map (`fold_freed_peers`).
                return Some(crate::skew::CommKey(handle).label());
            }
            board?
                .comm_name(pid, handle, gen)
                .map(crate::skew::CommKey::label)
        };
        let mut stacks = crate::profile::stacks::StackReading::new(
            &mut self.unwinder,
            &mut self.site_files,
            self.probes.task_registers(),
        );
        let mut profile = build::job_profile(
            &self.probes,
            &self.tracked,
            |pid| events.events_of(pid),
            &name,
            (&self.host, end_ns),
            &mut self.job_ids,
            &mut stacks,
        );
        let named_files = stacks.named_files;
        profile.place_peers_on_world_ranks();
        if self.probes.call_sites() {
            let read = self.probes.read_sites();
            for r in &mut profile.ranks {
                let t = self.tracked.get(&r.pid);
                let objects = t.map_or(&[][..], |t| &t.objects);
                let earlier = t
                    .and_then(|t| t.earlier.as_deref())
                    .map_or(&[][..], |e| &e.call_sites);
                let (sites, left_out) =
                    build::call_sites(r.pid, &read, objects, earlier, &mut self.site_files);
                r.call_sites = sites;
                r.call_sites_left_out = left_out
                    + t.and_then(|t| t.earlier.as_deref())
                        .map_or(0, |e| e.call_sites_left_out);
            }
            // Files no tracked process maps any more are closed.
            let mut mapped: std::collections::BTreeSet<_> = self
                .tracked
                .values()
                .flat_map(|t| {
                    t.objects
                        .iter()
                        .map(crate::discover::MappedObject::contents)
                })
                .collect();
            mapped.extend(named_files);
            self.site_files.keep_only(&mapped);
        } else {
            // Kept while they name a call in progress (a hung rank's, at each profile).
            self.site_files.keep_only(&named_files);
        }
        let cost = self.call_cost();
        for r in &mut profile.ranks {
            r.probe_call_cost = Some(cost);
        }
        profile
    }

    /// What a probed call costs here, by the kernel's measurements so far.
    pub fn call_cost(&self) -> crate::profile::CallCost {
        self.budget.call_cost()
    }

    /// The job each tracked process is in, named as a profile names it ([`build::name_jobs`])
    /// from identities alone: what `ps` lists, without reading a counter.
    pub fn job_names(&self) -> std::collections::HashMap<u32, String> {
        let members: Vec<build::Member> = self
            .tracked
            .iter()
            .map(|(&pid, t)| build::Member {
                key: t.info.as_ref().map(build::job_key).unwrap_or_default(),
                rank: t.info.as_ref().and_then(|i| i.rank),
                pid,
            })
            .collect();
        let mut job_ids = self.job_ids.clone();
        let named = build::name_jobs(&members, &mut job_ids);
        members
            .iter()
            .zip(named)
            .map(|(m, (_, job))| (m.pid, job))
            .collect()
    }
}

/// Tells `board` the job of every process whose environment has been read, and (once a
/// second) the collective instances the kernel saw each enter; returns the calls it held
/// for them.
pub fn place_in_worlds(
    board: &mut crate::skew::Board,
    session: &Session,
) -> Vec<crate::skew::board::Released> {
    let mut released = Vec::new();
    for (pid, t) in &session.tracked {
        let Some(info) = t.info.as_ref() else {
            continue;
        };
        let proc = (*pid, info.start_ticks);
        if !board.knows(proc) {
            released.extend(board.set_world(proc, &job_key(info), info.world_size));
        }
    }
    if board.entered_due() {
        board.set_entered(session.probes.collectives_entered());
    }
    released
}

/// The library files at `paths`, each opened once and verified; warns of those that could
/// not be.
fn open_libraries(paths: &[PathBuf]) -> Vec<LibraryFile> {
    let mut files = Vec::new();
    for path in paths {
        match LibraryFile::open_path(path) {
            Ok(file) => files.push(file),
            Err(e) => tracing::warn!(
                "{}: not probed: {:#}",
                path.display(),
                anyhow::Error::from(e)
            ),
        }
    }
    files
}

/// The per-peer counters `due` to be moved out of the kernel's map
/// ([`Probes::freed_peers_due`]), each with its communicator's name where who-is-late's
/// `board` gives one.
pub fn name_freed_peers(
    due: Vec<(collector_common::PeerKey, std::time::Duration)>,
    board: Option<&crate::skew::Board>,
) -> Vec<(collector_common::PeerKey, std::time::Duration, Option<u64>)> {
    due.into_iter()
        .map(|(k, age)| {
            let name = board.and_then(|b| b.comm_name(k.tgid, k.comm, k.gen));
            (k, age, name.map(|n| n.0))
        })
        .collect()
}
