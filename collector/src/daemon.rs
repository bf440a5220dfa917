//! `commtap daemon`: one per node. Counts every process that calls a probed MPI library
//! from its first call (the kernel counts before userspace knows the process), keeps the
//! profiles of processes that exit until they expire, and serves `commtap.v1.Node` on a
//! Unix socket, with gRPC health and server reflection.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use tokio::sync::Mutex;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    api::{pb, server, transport},
    attach::LoadOptions,
    clock::monotonic_ns,
    discover::{self, cgroup::CgroupRef, ProcessInfo},
    push,
    serve::{
        metrics,
        node::{NodeService, NodeState},
    },
    session::Session,
};

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// Unix socket to serve on.
    pub socket: PathBuf,
    /// Its permission bits.
    pub socket_mode: u32,
    /// Node name reported to clients (default: the host name).
    pub node_name: Option<String>,
    /// How the probes are loaded (the state directory is `state_dir`, checked first).
    pub load: LoadOptions,
    /// How long the profile of an exited process is kept.
    pub keep_exited: Duration,
    /// Extra MPI libraries to probe from the start.
    pub libraries: Vec<PathBuf>,
    /// Serve Prometheus metrics here.
    pub metrics: Option<crate::serve::metrics::MetricsListener>,
    /// Push the metrics' series over OTLP too.
    pub otlp: Option<crate::serve::metrics::otlp::OtlpOptions>,
    /// Which processes to profile.
    pub scope: Scope,
    /// Push snapshots to this aggregator.
    pub aggregator: Option<transport::Target>,
    /// How often.
    pub push_interval: Duration,
    /// Emit per-call events.
    pub call_events: bool,
    /// Match collective calls across each job's ranks (who is late).
    pub skew: bool,
    /// New processes' identities from the kernel's events only (tests).
    pub identity_from_kernel: bool,
    /// Added to every time the API gives out (tests: a node whose clock is off).
    pub clock_offset_ns: i64,
    /// Made-up exited ranks served beside the real ones (tests of scale).
    pub synthetic_ranks: u32,
    /// bpffs directory keeping the counting maps across restarts (None: not kept).
    pub state_dir: Option<PathBuf>,
    /// Where clients reach the TCP API, as pushes tell the aggregator (default: the node
    /// name and the --listen port).
    pub advertise: Option<String>,
    /// Also serve the API on this TCP address, with this TLS (None: plaintext, asked for).
    pub listen: Option<(
        std::net::SocketAddr,
        Option<tonic::transport::ServerTlsConfig>,
    )>,
}

/// Which processes the daemon profiles (everything by default).
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Only these processes (and no watch-all counting).
    pub pids: Vec<u32>,
    /// Only processes of this user.
    pub uid: Option<u32>,
    /// Only processes in this cgroup (v2, or a v1 controller's) or below it (a Slurm job's
    /// cgroup, say).
    pub cgroup: Option<CgroupRef>,
}

impl Scope {
    /// This scope with the ranks below each `--pid` in its place or beside it, as `record
    /// --pid` takes them ([`discover::ranks_below`]): a launcher's (`mpirun`, or torchrun,
    /// whose Python maps an NCCL itself) workers, not a rank's helpers; says which.
    fn with_ranks_below_launchers(&self) -> Scope {
        if self.pids.is_empty() {
            return self.clone();
        }
        let ranked: std::collections::BTreeSet<u32> =
            discover::rank_library_processes(|_| false, discover::process_dir::ProcessDir::maps)
                .into_iter()
                .collect();
        let tree = discover::process_tree();
        // Read of those below the processes asked for alone (and of those).
        let below: std::collections::BTreeSet<u32> = self
            .pids
            .iter()
            .flat_map(|&p| discover::descendants_in(p, &tree))
            .chain(self.pids.iter().copied())
            .collect();
        let infos: std::collections::BTreeMap<u32, ProcessInfo> = ranked
            .intersection(&below)
            .filter_map(|&p| Some((p, discover::process_info(p).ok()?)))
            .collect();
        let me = std::process::id();
        let mut pids = self.pids.clone();
        for &p in &self.pids {
            let ranks = discover::ranks_below(p, me, &tree, |pid| {
                infos.get(&pid).map(ProcessInfo::numbering)
            });
            let maps = ranked.contains(&p);
            if ranks.is_empty() {
                // One numbered itself is a rank given by its PID: nothing missing.
                let unnumbered = infos.get(&p).is_some_and(|i| i.rank.is_none());
                if maps && unnumbered {
                    warn!(
                        "--pid {p}: no process below it numbered apart from it maps MPI or \
                         NCCL yet; workers it starts later are not profiled (the daemon's \
                         --pid is read at its start; `commtap record --pid {p} \
                         --wait-for-mpi` follows them)"
                    );
                } else if !maps {
                    warn!(
                        "--pid {p}: neither it nor any process below it maps an MPI or NCCL \
                         library yet"
                    );
                }
                continue;
            }
            // What --pid is for: an operator hears it (a daemon logs at info).
            info!("{}", discover::ranks_below_said(p, maps, &ranks));
            pids.extend(ranks);
        }
        Scope {
            pids,
            ..self.clone()
        }
    }

    /// Whether already-running process `pid` is in scope.
    fn admits(&self, pid: u32, info: Option<&ProcessInfo>) -> bool {
        (self.pids.is_empty() || self.pids.contains(&pid))
            && self.uid.is_none_or(|u| info.and_then(|i| i.uid) == Some(u))
            && self
                .cgroup
                .as_ref()
                .is_none_or(|cg| discover::cgroup::in_cgroup(pid, cg))
    }
}

/// How often the daemon looks at its processes.
const TICK: Duration = Duration::from_millis(250);
/// How long after a process's exit its profile is final (ring-buffer drains included).
const SETTLE: Duration = Duration::from_millis(4 * crate::ingest::DRAIN_INTERVAL_MS);
/// How often it scans /proc for MPI processes it does not know (libraries outside the
/// linker's search path, processes that started before the daemon).
const SCAN_EVERY: u32 = 20;

/// Runs the daemon until SIGINT or SIGTERM.
pub async fn run(opts: DaemonOptions) -> Result<()> {
    crate::attach::system::check_privileges()?;
    // The files it probes and names call sites from, its clients' connections: past the
    // usual soft limit of 1,024 on a busy node.
    crate::aggregator::raise_file_limit();
    // Keeping counts across restarts is worth a warning when it cannot be done, not a refusal.
    let state_dir = opts.state_dir.clone().filter(|dir| {
        crate::attach::state::prepare_state_dir(dir)
            .inspect_err(|e| warn!("counts will not survive a restart of this daemon: {e}"))
            .is_ok()
    });
    let mut session = start_session(&opts, state_dir.clone())?;
    let feed = session.call_feed();
    let events = session.take_events();
    let shutdown = CancellationToken::new();
    let state = node_state(session, &opts, shutdown.clone());
    add_synthetic_ranks(&state, opts.synthetic_ranks).await;
    // Before the socket appears: whoever sees it may stop the daemon, and a SIGTERM then
    // must be a clean shutdown, not the default action.
    let signals = crate::signals::StopSignals::listen()?;
    let tasks = spawn_tasks(&state, &opts, feed, &shutdown).await?;
    info!(
        "commtap daemon on node {}: serving unix://{}",
        state.node,
        opts.socket.display()
    );
    watch(&state, events, signals, &opts).await?;
    info!("shutting down");
    shutdown.cancel();
    tasks.join().await;
    let _ = std::fs::remove_file(&opts.socket);
    let mut session = state.session.lock().await;
    session.stop_ingest().await;
    // Kept for a daemon that follows only while there is something to carry on counting.
    if let Some(dir) = &state_dir {
        // Alive, not "not yet seen to exit": a stop right after a job ends finds its ranks
        // gone before the exit events are processed.
        let alive = |pid: &u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
        if session.tracked.keys().any(alive) {
            info!("counts of running processes kept in {}", dir.display());
        } else {
            crate::attach::state::remove_state_dir(dir);
        }
    }
    Ok(())
}

/// Loads the probes as `opts` say, probes the libraries the linker finds, and starts
/// watching the MPI processes already running in scope.
fn start_session(opts: &DaemonOptions, state_dir: Option<PathBuf>) -> Result<Session> {
    let mut session = Session::start(LoadOptions {
        state_dir: state_dir.clone(),
        ..opts.load.clone()
    })?;
    if let Some(dir) = &state_dir {
        info!("counts kept across restarts in {}", dir.display());
        let gone = session.probes.forget_exited_while_away();
        if !gone.is_empty() {
            info!(
                pids = ?gone,
                "forgot {} process(es) that exited while no daemon ran (their counts were \
                 left in the kept maps)",
                gone.len()
            );
        }
    }
    session.probes.set_call_events(opts.call_events)?;
    session.probes.set_collective_events(opts.skew)?;
    session.identity_from_kernel = opts.identity_from_kernel;
    if opts.scope.pids.is_empty() {
        session
            .probes
            .set_watch_all(opts.scope.uid, opts.scope.cgroup.as_ref())?;
    }
    // No command: what the linker finds for any process (a job's own RPATH is seen when
    // its processes map it).
    let mut libs = discover::candidate_libraries(&[]);
    libs.extend(opts.libraries.iter().cloned());
    session.attach_files(&libs);
    let scope = opts.scope.with_ranks_below_launchers();
    session.adopt_running(|pid, info| scope.admits(pid, info));
    Ok(session)
}

/// What the node's services share: the session and what the daemon keeps besides.
fn node_state(
    mut session: Session,
    opts: &DaemonOptions,
    stopping: CancellationToken,
) -> Arc<NodeState> {
    let node = opts.node_name.clone().unwrap_or_else(discover::this_host);
    // Reports name each rank's host as the node is named everywhere else (jobs, traces).
    session.host.clone_from(&node);
    let placed_calls = Arc::new(crate::skew::board::PlacedFeed::default());
    Arc::new(NodeState {
        node: node.clone(),
        ingest: session.ingest_counters(),
        session: Mutex::new(session),
        finished: Mutex::new(Vec::new()),
        boot_id: discover::boot_id(),
        node_api: opts.advertise.clone().unwrap_or_else(|| {
            // The name the node goes by, and the port it listens on.
            opts.listen
                .as_ref()
                .map_or_else(String::new, |(addr, tls)| {
                    let scheme = if tls.is_some() { "https" } else { "http" };
                    format!("{scheme}://{node}:{}", addr.port())
                })
        }),
        finished_dropped: std::sync::atomic::AtomicU64::new(0),
        detached: Mutex::default(),
        event_streams: Default::default(),
        stopping,
        watches: Default::default(),
        call_events: opts.call_events,
        clock_offset_ns: opts.clock_offset_ns,
        late: opts.skew.then(|| {
            let mut board = crate::skew::Board::new(node).forward_to(placed_calls.clone());
            if opts.aggregator.is_some() {
                board.hand_on_parts();
            }
            // Late Sender needs every call numbered from MPI_Init: per-call events on from
            // the daemon's start, not switched on for a while by a trace.
            if opts.call_events {
                board = board.with_late_senders();
            }
            Mutex::new(board)
        }),
        placed_calls,
    })
}

/// The daemon's tasks besides its watch loop: the servers, pushing, who-is-late, metrics.
struct Tasks(Vec<tokio::task::JoinHandle<Result<()>>>);

impl Tasks {
    /// Waits for every task (after shutdown), logging how the ones that failed ended.
    async fn join(self) {
        for task in self.0 {
            match task.await {
                Ok(Err(e)) => warn!("{e:#}"),
                Err(e) => warn!("{e}"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// Starts serving (the Unix socket, TCP if asked) and the background tasks, until `shutdown`.
async fn spawn_tasks(
    state: &Arc<NodeState>,
    opts: &DaemonOptions,
    feed: tokio::sync::broadcast::Receiver<crate::ingest::FeedItem>,
    shutdown: &CancellationToken,
) -> Result<Tasks> {
    let listener = transport::bind_unix(&opts.socket, opts.socket_mode).await?;
    let routes = server::routes(pb::node_server::NodeServer::new(NodeService::new(
        state.clone(),
    )))
    .await?;
    let mut tasks = vec![tokio::spawn(server::serve(
        routes.clone(),
        None,
        UnixListenerStream::new(listener),
        shutdown.clone().cancelled_owned(),
    ))];
    // The same services on TCP, if asked.
    if let Some((addr, tls)) = opts.listen.clone() {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        info!(
            "serving gRPC on {} ({})",
            tcp.local_addr()?,
            if tls.is_some() { "TLS" } else { "plaintext" }
        );
        tasks.push(tokio::spawn(server::serve(
            routes,
            tls,
            tokio_stream::wrappers::TcpListenerStream::new(tcp),
            shutdown.clone().cancelled_owned(),
        )));
    }
    if let Some(target) = opts.aggregator.clone() {
        let push = push::run(state.clone(), target, opts.push_interval, shutdown.clone());
        tasks.push(tokio::spawn(async move {
            push.await;
            Ok(())
        }));
    }
    let place = place_calls(state.clone(), feed, shutdown.clone());
    tasks.push(tokio::spawn(async move {
        place.await;
        Ok(())
    }));
    if let Some(listener) = opts.metrics.clone() {
        let metrics = metrics::serve(listener, state.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            metrics.await.context("metrics server")
        }));
    }
    if let Some(otlp) = opts.otlp.clone() {
        let push = metrics::otlp::push(state.clone(), otlp, shutdown.clone());
        tasks.push(tokio::spawn(async move {
            push.await;
            Ok(())
        }));
    }
    Ok(Tasks(tasks))
}

/// The watch loop: process events as they come, a look around every tick, until SIGINT or
/// SIGTERM (a second one exits at once).
async fn watch(
    state: &NodeState,
    mut events: tokio::sync::mpsc::UnboundedReceiver<crate::ingest::ProcessEvent>,
    mut signals: crate::signals::StopSignals,
    opts: &DaemonOptions,
) -> Result<()> {
    let mut tick = tokio::time::interval(TICK);
    let mut budget_tick = crate::session::budget::ticker();
    let mut ticks: u32 = 0;
    loop {
        tokio::select! {
            _ = budget_tick.tick() => state.session.lock().await.keep_budget(),
            name = signals.recv() => {
                crate::signals::stopping(name, "stopping");
                signals.exit_on_next();
                return Ok(());
            }
            Some(ev) = events.recv() => {
                let batch = crate::session::follow::queued(vec![ev], &mut events);
                crate::session::follow::apply_events_shared(&state.session, batch).await;
            }
            _ = tick.tick() => {
                ticks = ticks.wrapping_add(1);
                let scan = ticks.is_multiple_of(SCAN_EVERY).then_some(&opts.scope);
                look_around(state, scan, opts.keep_exited).await;
            }
        }
    }
}

/// One tick: process events, new processes, exits (final profile kept, kernel state
/// freed so a reused pid starts from zero), expiry.
async fn look_around(state: &NodeState, scan_proc: Option<&Scope>, keep: Duration) {
    let mut session = state.session.lock().await;
    // Detached processes that exited: their pid may be reused by a process to count (told
    // before new processes are taken up: one given a detached process's pid is counted).
    state.detached.lock().await.retain(|pid, d| {
        // Its pid given to another process already is not it.
        let alive = discover::start_ticks(*pid) == Some(d.start_ticks);
        if !alive {
            session.probes.detached_exited(*pid);
        }
        alive
    });
    session.drain_process_events();
    session.track_counted();
    if let Some(scope) = scan_proc {
        session.probes.refresh_accounts();
        session.adopt_running(|pid, info| scope.admits(pid, info));
    }
    session.rescan();
    // A process's last call events are still in the ring buffer when it exits (they are
    // drained every DRAIN_INTERVAL): take its final profile once several drains have passed.
    let settled = monotonic_ns().saturating_sub(SETTLE.as_nanos() as u64);
    let exited: Vec<u32> = session
        .tracked
        .iter()
        .filter(|(_, t)| t.exit_ns.is_some_and(|at| at <= settled))
        .map(|(p, _)| *p)
        .collect();
    if !exited.is_empty() {
        // The kernel's counts of the collectives they entered go with them below. Read
        // before the board is locked: the walk is as long as the map is full, and the
        // board's lock holds up the calls' feed.
        let entered = state
            .late
            .is_some()
            .then(|| session.probes.collectives_entered());
        let mut board = state.board().await;
        if let (Some(b), Some(entered)) = (board.as_deref_mut(), entered) {
            b.set_entered(entered);
        }
        let profile = session.profile(monotonic_ns(), board.as_deref());
        drop(board);
        for pid in exited {
            if let Some(rank) = profile.ranks.iter().find(|r| r.pid == pid) {
                let mut rank = rank.clone();
                rank.exited = true;
                let account = rank.uid.map(|u| session.probes.account_of(u));
                state.keep_finished(rank, account).await;
            }
            session.probes.forget_process(pid);
            session.tracked.remove(&pid);
        }
    }
    // As the counts below: the walk before the board is locked, which names them.
    let freed = session.probes.freed_peers_due();
    let mut finished = state.finished.lock().await;
    finished.retain(|f| f.at.elapsed() < keep);
    if let Some(late) = &state.late {
        // As above: the counts read before the board is locked, when due.
        let due = late.lock().await.entered_due();
        let entered = due.then(|| session.probes.collectives_entered());
        let mut board = late.lock().await;
        if let Some(entered) = entered {
            board.set_entered(entered);
        }
        crate::session::place_in_worlds(&mut board, &session);
        // The processes tracked, and the exited ones whose profiles are kept (by pid alone
        // where the board does not know the start).
        let kept: std::collections::HashSet<(u32, u64)> = finished
            .iter()
            .map(|f| (f.rank.pid, f.rank.start_ticks))
            .collect();
        let kept_pids: std::collections::HashSet<u32> = kept.iter().map(|(p, _)| *p).collect();
        board.retain(|pid, start| match start {
            Some(start) => {
                session
                    .tracked
                    .get(&pid)
                    .is_some_and(|t| t.info.as_ref().is_none_or(|i| i.start_ticks == start))
                    || kept.contains(&(pid, start))
            }
            None => session.tracked.contains_key(&pid) || kept_pids.contains(&pid),
        });
        board.tick();
        let named = crate::session::name_freed_peers(freed, Some(&board));
        drop(board);
        session.fold_peers(&named);
    } else {
        session.fold_peers(&crate::session::name_freed_peers(freed, None));
    }
}

/// Feeds the call events to who-is-late, in batches (one lock each), which passes them on
/// placed to StreamEvents (without who-is-late, they are passed on as they come), until
/// shutdown.
async fn place_calls(
    state: Arc<NodeState>,
    mut feed: tokio::sync::broadcast::Receiver<crate::ingest::FeedItem>,
    shutdown: CancellationToken,
) {
    use crate::{ingest::FeedItem, skew::board::PlacedItem};
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let first = tokio::select! {
            item = feed.recv() => item,
            () = shutdown.cancelled() => return,
        };
        if matches!(first, Err(RecvError::Closed)) {
            return;
        }
        let mut batch = vec![first];
        while batch.len() < FEED_BATCH {
            let Some(item) = crate::ingest::queued_item(&mut feed) else {
                break;
            };
            batch.push(item);
        }
        let Some(late) = &state.late else {
            for item in batch {
                let placed = match item {
                    Ok(FeedItem::Call(ev)) => PlacedItem::Call(ev, Default::default()),
                    Ok(FeedItem::Exited(pid)) => PlacedItem::Exited(pid),
                    Ok(FeedItem::Detached(pid)) => PlacedItem::Detached(pid),
                    Err(RecvError::Lagged(n)) => PlacedItem::Lost(n),
                    Err(RecvError::Closed) => continue,
                };
                state.placed_calls.send(placed);
            }
            continue;
        };
        let mut board = late.lock().await;
        for item in batch {
            board.item(item);
        }
    }
}

/// Call events taken under one lock of the matching.
const FEED_BATCH: usize = 4096;

/// Serves `n` made-up exited ranks (job `synthetic`, pids from 2^30, their command lines at
/// the 4 KiB cap, spread over 16 users so that the per-user cap keeps them all): what a
/// node with that many ranks asks of the API, without starting them.
async fn add_synthetic_ranks(state: &NodeState, n: u32) {
    let routines: Vec<String> = collector_common::ROUTINES
        .iter()
        .take(16)
        .map(|r| r.name.to_string())
        .collect();
    for i in 0..n {
        let mut rank =
            crate::aggregator::bench::synthetic_rank(i, (1 << 30) + i, &state.node, &routines, 4);
        rank.job = "synthetic".into();
        rank.cmdline = "x".repeat(discover::MAX_CMDLINE);
        rank.uid = Some(i % 16);
        state.keep_finished(rank, Some(i % 16)).await;
    }
}
