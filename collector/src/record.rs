//! `commtap record`: attach to running ranks (`--pid`) or launch a command and follow every
//! process it spawns, then print the job's profile.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};
use collector_common::CallEvent;
use tracing::{info, warn};

use crate::{
    attach::{self, LoadOptions, Probes},
    clock::monotonic_ns,
    discover::{self, tracked::Tracked, DiscoverError},
    ingest::{FeedItem, FeedResult},
    profile::JobProfile,
    session::Session,
    skew,
    trace::{self, ProcessName, TraceOptions, TraceWriter},
};

/// What `record` was asked to do.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Running processes to attach to.
    pub pids: Vec<u32>,
    /// Keep `pids` watched though none maps an MPI library yet (one may load it later).
    pub wait_for_mpi: bool,
    /// Command to launch and follow (empty with `pids`).
    pub command: Vec<String>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// How the probes are loaded (program run statistics are logged at the end).
    pub load: LoadOptions,
    /// Extra MPI libraries to probe before launching (beyond the linker's search path).
    pub libraries: Vec<PathBuf>,
    /// Created once the probes are attached (a handshake for scripts and tests).
    pub ready_file: Option<PathBuf>,
    /// Emit per-call events (latency, timelines); counts never need them.
    pub call_events: bool,
    /// Also write a timeline of every call, into each of these files (implies
    /// `call_events`).
    pub traces: Vec<TraceOptions>,
    /// Match collective calls across ranks (who is late): an event per collective call.
    pub skew: bool,
}

/// What `record` ends with.
#[derive(Debug)]
pub struct Recorded {
    /// The job's profile.
    pub profile: JobProfile,
    /// How the launched command ended, when it failed (a batch script wrapping a job in
    /// `record` must still see it fail).
    pub command_failed: Option<std::process::ExitStatus>,
}

/// Runs `record` to completion and returns the profile.
pub async fn record(opts: RecordOptions) -> Result<Recorded> {
    let requested = check_request(&opts)?;
    // Before anything runs: a trace that cannot be written fails now, not after the job.
    let mut sinks = FeedSinks {
        tracers: opts
            .traces
            .iter()
            .cloned()
            .map(TraceWriter::create)
            .collect::<Result<_, _>>()?,
        late: opts.skew.then(|| {
            let board = skew::Board::new(discover::this_host());
            // Sends paired with their receives: needs every call, so per-call events.
            if opts.call_events || !opts.traces.is_empty() {
                board.with_late_senders()
            } else {
                board
            }
        }),
        // Every call is in the feed only with per-call events: then, the timeline's shape.
        timeline: (opts.call_events || !opts.traces.is_empty())
            .then(|| crate::profile::timeline::TimelineBuilder::new(monotonic_ns())),
    };
    let mut session = Session::start(opts.load.clone())?;
    // Its profile is the last: call sites named, however long their files take to read.
    session.site_files.wait_for_reads(true);
    session
        .probes
        .set_call_events(opts.call_events || !sinks.tracers.is_empty())?;
    session.probes.set_collective_events(opts.skew)?;
    let mut feed = sinks.wants_feed().then(|| session.call_feed());
    if !requested.is_empty() {
        watch_requested(&mut session, requested, &opts).await?;
        mark_ready(&opts)?;
    }
    let child = if opts.command.is_empty() {
        None
    } else {
        Some(launch_command(&mut session, &opts)?)
    };
    let command_failed = follow(&mut session, &mut sinks, &mut feed, child, &opts).await?;
    Ok(Recorded {
        profile: finish(session, sinks, feed).await?,
        command_failed,
    })
}

/// Checks what `record` was asked; the processes to attach to, with what `/proc` says of
/// them (a PID that does not exist fails here, before anything is loaded).
fn check_request(opts: &RecordOptions) -> Result<Vec<(u32, discover::ProcessInfo)>> {
    if opts.pids.is_empty() && opts.command.is_empty() {
        bail!("nothing to record: give --pid PID[,PID...] or a command after `--`");
    }
    if !opts.pids.is_empty() && !opts.command.is_empty() {
        bail!("give either --pid or a command to launch, not both");
    }
    for (i, t) in opts.traces.iter().enumerate() {
        if opts.traces[..i].iter().any(|u| u.path == t.path) {
            bail!(
                "--trace {} is given twice: give it once per file (`--trace t.json --trace \
                 t.pftrace` writes both formats)",
                t.path.display()
            );
        }
    }
    attach::system::check_privileges()?;
    let me = std::process::id();
    let mut requested = Vec::new();
    for &pid in &opts.pids {
        if pid == me {
            bail!("PID {pid} is commtap itself");
        }
        let info = discover::process_info(pid).map_err(|e| match e {
            DiscoverError::NoSuchProcess(_) => anyhow::anyhow!("{e}"),
            other @ (DiscoverError::Proc { .. }
            | DiscoverError::MapsTooLarge(_)
            | DiscoverError::ShareSpent { .. }) => {
                anyhow::Error::new(other).context(format!("inspecting PID {pid}"))
            }
        })?;
        requested.push((pid, info));
    }
    Ok(requested)
}

/// Attach-late mode: probes what each process maps, then counts it; fails when none of
/// them is an MPI or NCCL process.
async fn watch_requested(
    session: &mut Session,
    requested: Vec<(u32, discover::ProcessInfo)>,
    opts: &RecordOptions,
) -> Result<()> {
    for (pid, info) in requested {
        session.attach(pid, info, None)?;
    }
    if opts.wait_for_mpi {
        return follow_below(session);
    }
    watch_ranks_below(session);
    if session.tracked.values().any(|t| t.maps_mpi) {
        // Said only where they are watched on: else the refusal below names them.
        for (pid, t) in &session.tracked {
            if t.requested && !t.maps_mpi {
                warn!("PID {pid} maps no MPI library; watching it in case it loads one");
            }
        }
        return Ok(());
    }
    session.stop_ingest().await;
    let list = discover::pid_list(&opts.pids);
    let seen = session.probes.unsupported();
    let seen = if seen.is_empty() {
        String::new()
    } else {
        format!("; seen but not probed: {}", seen.join("; "))
    };
    bail!(
        "PID {list}: not an MPI or NCCL process, nor is any process below it (maps no MPI \
         library such as libmpi or libmpich, and nothing that holds NCCL){seen}; \
         `--wait-for-mpi` attaches to one that will load it later"
    );
}

/// The ranks below each process asked for ([`discover::ranks_below`]: `mpirun`'s, a job
/// script's, torchrun's workers) are watched too, and say so; the other processes below
/// are let go. A launcher that maps no MPI library is let go where ranks were found below
/// it; one that does (torchrun's Python maps the NCCL of its torch) stays watched, as one
/// of the job's processes rather than one asked for (it makes no call, and is no rank
/// missed).
fn watch_ranks_below(session: &mut Session) {
    let launchers: Vec<u32> = session
        .tracked
        .iter()
        .filter(|(_, t)| t.requested)
        .map(|(pid, _)| *pid)
        .collect();
    // Below one that maps a library itself, only those numbered apart from it can be its
    // ranks: a rank given by its PID has its helpers (DataLoader workers, shells) left
    // alone, not probed to be let go.
    let mapping: BTreeMap<u32, discover::ProcessInfo> = launchers
        .iter()
        .filter_map(|pid| {
            let t = session.tracked.get(pid).filter(|t| t.maps_mpi)?;
            Some((*pid, t.info.clone()?))
        })
        .collect();
    let apart = |launcher: u32, info: &discover::ProcessInfo| {
        mapping
            .get(&launcher)
            .is_none_or(|l| l.numbering() != info.numbering())
    };
    // One reading of the tree for both: a process started since is not attached, so it
    // could not be found a rank in a later reading either.
    let tree = discover::process_tree();
    let below = attach_below(session, &launchers, &tree, false, &apart);
    let me = std::process::id();
    let found: Vec<(u32, Vec<u32>)> = launchers
        .iter()
        .map(|&launcher| {
            let numbering = |pid| session.tracked.get(&pid)?.rank_numbering();
            (
                launcher,
                discover::ranks_below(launcher, me, &tree, numbering),
            )
        })
        .filter(|(_, ranks)| !ranks.is_empty())
        .collect();
    let ranks: std::collections::BTreeSet<u32> =
        found.iter().flat_map(|(_, r)| r.iter().copied()).collect();
    let others: Vec<u32> = below.into_iter().filter(|p| !ranks.contains(p)).collect();
    let_go(session, &others);
    for (launcher, ranks) in found {
        let maps = match session.tracked.get_mut(&launcher) {
            Some(t) if t.maps_mpi => {
                t.requested = false;
                true
            }
            _ => {
                let_go(session, &[launcher]);
                false
            }
        };
        warn!("{}", discover::ranks_below_said(launcher, maps, &ranks));
    }
}

/// Walks below the launchers `--wait-for-mpi` follows, at most: each finds those started
/// during the one before.
const FOLLOW_WALKS: usize = 8;

/// `--wait-for-mpi`: each process asked for is watched with every process below it, those
/// running now and those started from now on (a launcher whose ranks load their MPI later:
/// `mpirun python app.py` before its `import mpi4py`, `torchrun` before its workers load
/// NCCL), each counted from the first call of the library it loads.
fn follow_below(session: &mut Session) -> Result<()> {
    // Every one asked for, whatever it maps: torchrun's Python maps the NCCL of the torch it
    // imports, and its workers are the ranks.
    let waiting: Vec<u32> = session
        .tracked
        .iter()
        .filter(|(_, t)| t.requested)
        .map(|(pid, _)| *pid)
        .collect();
    // Children are followed from their fork on before the walk, so none started meanwhile
    // is missed; the walk is made again until it finds none new, for those whose parent it
    // had not reached yet (a few rounds: a launcher forking without end is followed by the
    // kernel all the same).
    for &pid in &waiting {
        session.probes.watch(pid, true)?;
    }
    let mut below = Vec::new();
    for _ in 0..FOLLOW_WALKS {
        let tree = discover::process_tree();
        let found = attach_below(session, &waiting, &tree, true, &|_, _| true);
        if found.is_empty() {
            break;
        }
        below.extend(found);
    }
    if below.is_empty() {
        warn!(
            "watching PID {} and the processes it starts, each from the first call of the \
             MPI or NCCL it loads",
            discover::pid_list(&waiting)
        );
    } else {
        warn!(
            "watching PID {}, the processes below it (PID {}) and those they start, each \
             from the first call of the MPI or NCCL it loads",
            discover::pid_list(&waiting),
            discover::pid_list(&below)
        );
    }
    Ok(())
}

/// Attaches to the processes below `launchers` in `tree` (pid to parent pid) not watched
/// yet that `keep` (given the launcher and what `/proc` says of the process) takes; where
/// `follow`, with the processes they start from now on, as processes below those asked
/// for ([`Session::attach_below`]). One that cannot be watched is said and left out, the
/// others watched all the same. Returns those attached.
fn attach_below(
    session: &mut Session,
    launchers: &[u32],
    tree: &BTreeMap<u32, u32>,
    follow: bool,
    keep: &dyn Fn(u32, &discover::ProcessInfo) -> bool,
) -> Vec<u32> {
    let mut below = Vec::new();
    for &launcher in launchers {
        for pid in discover::descendants_in(launcher, tree) {
            if session.tracked.contains_key(&pid) {
                continue;
            }
            // Gone since the walk (before or while it is watched): nothing to watch.
            let Ok(info) = discover::process_info(pid) else {
                continue;
            };
            if !keep(launcher, &info) {
                continue;
            }
            let start = info.start_ticks;
            let attached = if follow {
                session.attach_below(pid, info)
            } else {
                session.attach(pid, info, None)
            };
            match attached {
                Ok(()) => below.push(pid),
                Err(_) if discover::start_ticks(pid) != Some(start) => {}
                Err(e) => warn!("PID {pid}, below PID {launcher}, is not watched: {e:#}"),
            }
        }
    }
    below
}

/// Stops watching `pids` and forgets them (not asked for after all).
fn let_go(session: &mut Session, pids: &[u32]) {
    for pid in pids {
        session.probes.unwatch(*pid);
        session.tracked.remove(pid);
    }
}

/// Launch mode: probes the libraries the job will load before it starts (unless each of
/// its processes will be paused at its loads until they are probed), then starts it.
fn launch_command(session: &mut Session, opts: &RecordOptions) -> Result<tokio::process::Child> {
    let mut libs = opts.libraries.clone();
    let ahead = !launched_processes_pause(&session.probes);
    if ahead {
        libs.extend(discover::candidate_libraries(&opts.command));
    }
    session.attach_files(&libs);
    if !ahead {
        // The job's ranks would wait paused at their first load while their MPI's programs
        // are verified: verified from now on instead, while the launcher starts.
        session.prefetch_programs(&discover::libraries_needed_by(&opts.command));
    }
    if ahead && !session.probes.libraries().any(|l| l.library.counts_calls()) {
        warn!("no MPI library found in the linker's search path; libraries are probed as processes map them");
    }
    mark_ready(opts)?;
    let (child, pid) = launch(&opts.command, &mut session.probes)?;
    session.tracked.insert(pid, Tracked::from_now());
    Ok(child)
}

/// Follows the job until it ends (the launched command exits, or every requested process
/// has), `--duration` passes or a signal comes (after which a second one exits at once; a
/// launched job is waited for, and passed the signal if it runs on: see [`STOP_GRACE`]).
/// Returns how the launched command ended if it failed.
async fn follow(
    session: &mut Session,
    sinks: &mut FeedSinks,
    feed: &mut Option<tokio::sync::broadcast::Receiver<FeedItem>>,
    mut child: Option<tokio::process::Child>,
    opts: &RecordOptions,
) -> Result<Option<std::process::ExitStatus>> {
    let stop = tokio::time::sleep(opts.duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut budget_tick = crate::session::budget::ticker();
    let launched = child.is_some();
    let launched_pid = child.as_ref().and_then(tokio::process::Child::id);
    let mut child_exit = std::pin::pin!(async {
        match child.as_mut() {
            Some(c) => c.wait().await.ok(),
            None => std::future::pending().await,
        }
    });
    let mut signals = Some(crate::signals::StopSignals::listen()?);
    // After a stop signal, with a launched job: the signal and when to act next.
    let mut stopping: Option<(&'static str, tokio::time::Instant, bool)> = None;
    loop {
        let next_call = async {
            match feed.as_mut() {
                Some(f) => f.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            item = next_call => {
                sinks.item(item)?;
                if let Some(f) = feed.as_mut() {
                    // Whatever else is queued, before going round the loop again.
                    sinks.drain(f, FEED_BATCH)?;
                }
            }
            name = next_signal(&mut signals) => {
                if let Some(s) = signals.take() {
                    s.exit_on_next();
                }
                let Some(pid) = launched_pid else {
                    crate::signals::stopping(name, "reporting what was recorded");
                    return Ok(None);
                };
                // A terminal's Ctrl-C reached the job too: its end (and last calls) are
                // waited for. A signal sent to commtap alone is passed on after a grace
                // (once: mpirun takes a second Ctrl-C as "kill the job now").
                warn!(
                    "{name}: waiting for the launched command (PID {pid}) to end, then \
                     reporting (again: exit at once)"
                );
                stopping = Some((name, tokio::time::Instant::now() + STOP_GRACE, false));
            }
            () = wait_until(stopping.map(|s| s.1)) => {
                let (name, _, passed_on) = stopping.expect("a deadline only while stopping");
                let pid = launched_pid.expect("stopping only a launched job");
                if passed_on || crate::signals::reached_the_foreground(name) {
                    warn!(
                        "the launched command (PID {pid}) runs on after {name}: reporting what \
                         was recorded without its end"
                    );
                    // Not a success: as if the signal had ended it (128 + its number).
                    return Ok(Some(crate::signals::ended_by(name)));
                }
                warn!("the launched command (PID {pid}) runs on: passing {name} on to it");
                crate::signals::pass_on(name, pid);
                stopping = Some((name, tokio::time::Instant::now() + STOP_GRACE, true));
            }
            () = &mut stop => {
                info!("duration reached");
                if let Some(pid) = launched_pid {
                    warn!(
                        "--duration reached: the launched command (PID {pid}) runs on, no \
                         longer profiled"
                    );
                }
                return Ok(None);
            }
            status = &mut child_exit => {
                let failed = status.filter(|s| !s.success());
                if let Some(status) = failed {
                    warn!("the command exited with {status}");
                }
                return Ok(failed);
            }
            Some(ev) = session.events.recv() => {
                let batch = crate::session::follow::queued(vec![ev], &mut session.events);
                session.apply_events(batch);
            }
            _ = budget_tick.tick() => session.keep_budget(),
            _ = tick.tick() => {
                session.probes.refresh_accounts();
                session.rescan();
                session.fold_freed_peers(sinks.late.as_ref());
                for t in &mut sinks.tracers {
                    name_processes(t, session);
                }
                sinks.place_in_worlds(session)?;
                // Those asked for, and every MPI process found below them.
                if !launched && session.tracked.values().filter(|t| t.requested || t.maps_mpi).all(|t| t.exit_ns.is_some()) {
                    info!("all watched processes exited");
                    return Ok(None);
                }
            }
        }
    }
}

/// How long a launched job is given to end after a stop signal, before the signal is passed
/// on to it (sent to commtap alone), and again before commtap reports without its end.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The next stop signal, while they are listened for here (else never).
async fn next_signal(signals: &mut Option<crate::signals::StopSignals>) -> &'static str {
    match signals.as_mut() {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Waits until `deadline` (never without one).
async fn wait_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Stops counting, drains what is left and builds the profile (who is late included);
/// finishes the trace.
async fn finish(
    mut session: Session,
    mut sinks: FeedSinks,
    mut feed: Option<tokio::sync::broadcast::Receiver<FeedItem>>,
) -> Result<JobProfile> {
    // Events already queued (exits of ranks just before the launcher) still count.
    session.drain_process_events();
    let end_ns = monotonic_ns();
    // Before the stop below ends the kernel's counts: a rank still blocked in a collective
    // (a hung job stopped by a signal) has entered it.
    let entered = sinks
        .late
        .is_some()
        .then(|| session.probes.collectives_entered());
    // Stop counting before reading, so the counters and the events describe the same calls.
    session.unwatch_all();
    session.stop_ingest().await;
    if session.pauses.count > 0 {
        info!("{}", session.pauses);
    }
    if let Some(f) = feed.as_mut() {
        // The calls the last drain of the ring buffer found.
        sinks.drain(f, usize::MAX)?;
    }
    sinks.place_in_worlds(&session)?;
    if let (Some(late), Some(entered)) = (sinks.late.as_mut(), entered) {
        late.set_entered(entered);
    }
    let held = sinks
        .late
        .as_mut()
        .map(super::skew::board::Board::finish)
        .unwrap_or_default();
    sinks.write_released(held)?;
    // After the board has every call: it names the communicators of the per-peer traffic.
    let mut profile = session.profile(end_ns, sinks.late.as_ref());
    for p in session.probes.program_stats().unwrap_or_default() {
        info!(
            program = p.name,
            runs = p.runs,
            ns_per_run = p.run_ns.checked_div(p.runs).unwrap_or(0),
            "probe program cost"
        );
    }
    for r in &mut profile.ranks {
        r.exited = session
            .tracked
            .get(&r.pid)
            .is_some_and(|t| t.exit_ns.is_some());
    }
    profile.timeline = sinks.timeline.take().map(|t| t.finish(end_ns));
    if let Some(late) = sinks.late {
        let whois = |pid: u32| {
            let r = profile.ranks.iter().find(|r| r.pid == pid)?;
            Some((r.rank, r.host.clone()))
        };
        let procs: Vec<_> = profile
            .ranks
            .iter()
            .map(|r| (r.pid, r.start_ticks))
            .collect();
        profile.skew = late.report_for(&procs, &whois);
    }
    // The calls the ranks had not returned from: those they ended inside, and those they
    // were inside as the recording stopped (a hung job's).
    let unfinished: Vec<crate::api::pb::CallEvent> = profile
        .ranks
        .iter()
        .filter_map(|r| match (&r.ended, &r.in_call) {
            (Some(e), _) => {
                let ended_ns = session.probes.read_proc_stats(r.pid).exit_ns;
                let call = e.inside.as_ref().filter(|_| ended_ns != 0)?;
                Some(trace::unfinished_call(r, call, ended_ns, e.how()))
            }
            (None, Some(call)) => Some(trace::unfinished_call(
                r,
                call,
                end_ns,
                trace::still_inside(call, "the recording stopped"),
            )),
            (None, None) => None,
        })
        .collect();
    for mut t in sinks.tracers {
        for ev in &unfinished {
            t.unfinished(ev)?;
        }
        for r in &profile.ranks {
            t.name(
                r.pid,
                ProcessName {
                    rank: r.rank_known.then_some(r.rank),
                    host: r.host.clone(),
                    job: r.job.clone(),
                },
            );
        }
        t.set_ring_buffer_full(profile.ranks.iter().map(|r| r.health.dropped).sum());
        let summary = t.finish()?;
        eprintln!("{summary}");
    }
    // The report need not wait for the probes' detach.
    session.probes.detach_in_background();
    Ok(profile)
}

/// Calls written to a trace in a row before `record` looks at its other work.
const FEED_BATCH: usize = 4096;

/// What `record` does with the call feed: a timeline, who is late, or both.
struct FeedSinks {
    tracers: Vec<TraceWriter>,
    late: Option<skew::Board>,
    timeline: Option<crate::profile::timeline::TimelineBuilder>,
}

impl FeedSinks {
    /// Writes one call into the trace, with its communicator and number where known.
    fn write(&mut self, ev: &CallEvent, placement: skew::Placement) -> Result<()> {
        if !self.tracers.is_empty() {
            let call = trace::placed_call_event(ev, placement);
            for t in &mut self.tracers {
                t.call(&call)?;
            }
        }
        Ok(())
    }

    fn write_released(&mut self, released: Vec<skew::board::Released>) -> Result<()> {
        for (ev, placed) in released {
            self.write(&ev, placed)?;
        }
        Ok(())
    }

    /// Tells who-is-late the jobs of the processes known by now, and writes the calls it
    /// held for them.
    fn place_in_worlds(&mut self, session: &Session) -> Result<()> {
        let Some(l) = self.late.as_mut() else {
            return Ok(());
        };
        let released = crate::session::place_in_worlds(l, session);
        l.tick();
        self.write_released(released)
    }

    fn wants_feed(&self) -> bool {
        !self.tracers.is_empty() || self.late.is_some() || self.timeline.is_some()
    }

    /// Takes up to `max` items already queued on the call feed.
    fn drain(
        &mut self,
        f: &mut tokio::sync::broadcast::Receiver<FeedItem>,
        max: usize,
    ) -> Result<()> {
        for _ in 0..max {
            let Some(item) = crate::ingest::queued_item(f) else {
                break;
            };
            self.item(item)?;
        }
        Ok(())
    }

    /// Takes one item of the call feed.
    fn item(&mut self, item: FeedResult) -> Result<()> {
        use tokio::sync::broadcast::error::RecvError;
        if let Ok(FeedItem::Call(ev)) = item {
            if let Some(t) = self.timeline.as_mut() {
                t.add(&ev);
            }
            // Who is late numbers the collectives: the trace shows the numbers, and a call
            // it holds until its process's job is known is written when it gives it back.
            let taken = match self.late.as_mut() {
                Some(l) => l.call(ev),
                None => skew::board::Taken::Now(skew::Placement::default()),
            };
            if let skew::board::Taken::Now(placed) = taken {
                self.write(&ev, placed)?;
            }
            return Ok(());
        }
        if let Err(RecvError::Lagged(n)) = &item {
            for t in &mut self.tracers {
                t.lost_by_reader(*n);
            }
        }
        match &item {
            // Watched again after a failed attach (`record` detaches none). Its calls held by
            // who-is-late, if any, are written after this: numbered by none, whichever run
            // they are of (a held `MPI_Init` included).
            Ok(FeedItem::Detached(pid)) => self.tracers.iter_mut().for_each(|t| t.detached(*pid)),
            // Its pid may be another process's from now on; not while who-is-late may hold
            // calls of its (its job not known yet): a held `MPI_Init` would number it again.
            Ok(FeedItem::Exited(pid)) if self.late.as_ref().is_none_or(|l| l.knows_pid(*pid)) => {
                self.tracers.iter_mut().for_each(|t| t.exited(*pid));
            }
            _ => {}
        }
        if let Some(l) = self.late.as_mut() {
            l.item(item);
        }
        Ok(())
    }
}

/// Names the trace's processes whose world rank is known by now.
fn name_processes(t: &mut TraceWriter, session: &Session) {
    let host = discover::this_host();
    for pid in t.unnamed() {
        if let Some(info) = session.tracked.get(&pid).and_then(|tr| tr.info.as_ref()) {
            t.name(
                pid,
                ProcessName {
                    rank: info.rank,
                    host: host.clone(),
                    job: String::new(),
                },
            );
        }
    }
}

/// Starts `command` so that the kernel watches it before it first runs: commtap marks
/// itself "watch my children" (without counting itself) around the spawn, and the fork
/// tracepoint watches the child at its creation. Nothing the job does, from MPI_Init on, in
/// every process it spawns, is missed.
fn launch(command: &[String], probes: &mut Probes) -> Result<(tokio::process::Child, u32)> {
    let me = std::process::id();
    probes.watch_descendants_of_self(me)?;
    let spawned = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .spawn();
    probes.unwatch(me);
    let child = spawned.with_context(|| format!("starting {}", command[0]))?;
    let pid = child.id().context("launched process has no pid")?;
    // A child that already exited (a zombie) has left the watched set: nothing missed.
    let exited = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| discover::stat_field(&s, 0).map(|state| state == "Z"))
            .unwrap_or(true)
    };
    if !probes.is_watched(pid) && !exited() {
        // Should not happen: the fork tracepoint ran before the child could.
        probes.watch(pid, true)?;
        warn!("PID {pid} was not watched from its start; calls before now are not counted");
    }
    info!("launched {} as PID {pid}", command.join(" "));
    Ok((child, pid))
}

/// Whether every process of a launched job will be paused at its library loads until
/// they are probed (its first libraries included: the dynamic linker announces them before
/// running any of their code), so that nothing needs probing before it starts. The kernel
/// side pauses a process only where nobody notices (see `collector-ebpf`'s
/// `pausable_unnoticed`): never a traced one, and on a terminal only one in its parent's
/// process group, which a launcher's `setpgid` leaves. So: pausing is on, and commtap
/// (whose descendants inherit both) has no controlling terminal and no tracer. Otherwise
/// every MPI, NCCL and libfabric library the job may load is probed first, as before
/// pausing existed: slower to start (each ABI's programs are verified), as exact.
fn launched_processes_pause(probes: &Probes) -> bool {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let no_terminal = discover::stat_field(&stat, 4).is_some_and(|tty| tty == "0");
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let untraced = status.lines().any(|l| {
        l.strip_prefix("TracerPid:")
            .is_some_and(|v| v.trim() == "0")
    });
    probes.pauses_at_load() && no_terminal && untraced
}

fn mark_ready(opts: &RecordOptions) -> Result<()> {
    if let Some(path) = &opts.ready_file {
        crate::report::write_file(path, format!("{}\n", std::process::id()).as_bytes())
            .with_context(|| format!("writing the ready file {}", path.display()))?;
    }
    Ok(())
}
