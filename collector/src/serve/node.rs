//! The `commtap.v1.Node` service: the node daemon's processes and their cumulative
//! profiles, live and as a stream.

use std::{
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use std::sync::atomic::Ordering;

use tokio::sync::{broadcast, Mutex};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::{
    api::{
        pb,
        snapshot::{to_wire, ProcessKey, Snapshot},
        status::{watch_interval, ToStatus},
    },
    clock::monotonic_ns,
    discover::tracked::Tracked,
    ingest::FeedItem,
    profile::{JobProfile, JobTotals, RankProfile},
    push::SnapshotSource,
    session::Session,
};

/// A process that exited: its last profile, kept until it expires.
pub struct Finished {
    /// When it exited.
    pub at: Instant,
    /// Its final profile.
    pub rank: RankProfile,
}

/// What the daemon's loop and the API share.
pub struct NodeState {
    /// Node name reported to clients.
    pub node: String,
    /// This boot's id (`/proc/sys/kernel/random/boot_id`): with node, pid and start time,
    /// a process's identity at an aggregator across reboots.
    pub boot_id: String,
    /// The live profiling session.
    pub session: Mutex<Session>,
    /// Profiles of processes that exited.
    pub finished: Mutex<Vec<Finished>>,
    /// Processes detached on request (the kernel ignores them until they exit).
    pub detached: Mutex<std::collections::BTreeSet<u32>>,
    /// Open StreamEvents streams (per-call events are on while there is one).
    pub event_streams: std::sync::atomic::AtomicUsize,
    /// Whether the daemon was started with --call-events (then they stay on).
    pub call_events: bool,
    /// Final profiles let go before their time by [`NodeState::keep_finished`]'s caps.
    pub finished_dropped: std::sync::atomic::AtomicU64,
    /// Added to every time the API gives out (0 but in tests of clock alignment).
    pub clock_offset_ns: i64,
    /// Who is late, per job (None: the daemon was started with --no-skew).
    pub late: Option<Mutex<crate::skew::Board>>,
}

impl NodeState {
    /// A time of this node's monotonic clock as the API gives it out.
    pub fn api_time(&self, ns: u64) -> u64 {
        ns.saturating_add_signed(self.clock_offset_ns)
    }
}

/// Most final profiles of exited processes kept at once, and per user: a user starting
/// processes without end can neither fill the daemon's memory nor push out other users'
/// profiles.
pub const MAX_FINISHED: usize = 65_536;
/// See [`MAX_FINISHED`].
pub const MAX_FINISHED_PER_UID: usize = 4096;

/// Most ranks in one page of GetSnapshot: at the 4 KiB command line cap and a few dozen
/// routines each, a page stays well under the reply limit.
pub const MAX_PAGE_RANKS: u32 = 4096;

/// The page GetSnapshot asks for: after the rank `token` names (`pid:start_ticks`, the
/// last of the previous page), at most `size` ranks; None for all of them at once.
fn page_of(size: u32, token: &str) -> Result<Option<Page>, Status> {
    if size == 0 && token.is_empty() {
        return Ok(None);
    }
    let after = if token.is_empty() {
        None
    } else {
        let bad = || Status::invalid_argument(format!("page_token {token:?} is not one we gave"));
        let (pid, start) = token.split_once(':').ok_or_else(bad)?;
        Some((
            pid.parse::<u32>().map_err(|_| bad())?,
            start.parse::<u64>().map_err(|_| bad())?,
        ))
    };
    let size = match size {
        0 => MAX_PAGE_RANKS,
        n => n.min(MAX_PAGE_RANKS),
    };
    Ok(Some(Page {
        after,
        size: size as usize,
    }))
}

/// One page of a snapshot's ranks.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    /// After this rank (pid, start ticks); None: from the first.
    pub after: Option<(u32, u64)>,
    /// At most this many ranks.
    pub size: usize,
}

/// A tracked process as the API lists it.
fn process_state(pid: u32, t: &Tracked) -> pb::ProcessState {
    let info = t.info.as_ref();
    pb::ProcessState {
        pid,
        rank: info.and_then(|i| i.rank),
        job: info.and_then(|i| i.batch_job.clone()).unwrap_or_default(),
        cmdline: info.map(|i| i.cmdline.clone()).unwrap_or_default(),
        // Exited only once its final profile is taken (see the daemon's settling).
        status: if t.maps_mpi {
            pb::ProcessStatus::Probed
        } else {
            pb::ProcessStatus::NoMpi
        } as i32,
    }
}

/// Who is asking: root sees everything, another user only its own processes, a caller
/// nobody vouches for nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Root on the Unix socket, or a TCP caller whose client certificate the listener's
    /// `--tls-client-ca` verified.
    Any,
    /// A non-root user on the Unix socket.
    Uid(u32),
    /// A TCP caller without a verified client certificate (plaintext under
    /// `--insecure-tcp`, or TLS without one): treated as a user who owns no process.
    Nobody,
}

impl Caller {
    /// The caller of `req`: the Unix socket's peer credentials, else the client
    /// certificate TLS verified, else nobody.
    pub fn of<T>(req: &Request<T>) -> Caller {
        let uid = req
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        match uid {
            Some(0) => Caller::Any,
            Some(uid) => Caller::Uid(uid),
            // Certificates are only there when the listener required and verified them.
            None if req.peer_certs().is_some_and(|c| !c.is_empty()) => Caller::Any,
            None => Caller::Nobody,
        }
    }

    /// Whether this caller may see a process of user `uid`.
    pub fn may_see(self, uid: Option<u32>) -> bool {
        match self {
            Caller::Any => true,
            Caller::Uid(me) => uid == Some(me),
            Caller::Nobody => false,
        }
    }

    /// Whether this caller may see the probed library shown as `path` (a user: only those
    /// its own processes map, the paths of others' being theirs).
    pub fn may_see_library(self, session: &Session, path: &str) -> bool {
        match self {
            Caller::Any => true,
            Caller::Uid(me) => session.library_used_by(path, me),
            Caller::Nobody => false,
        }
    }
}

impl NodeState {
    /// Keeps `rank`'s final profile, letting the oldest of its user's go past
    /// [`MAX_FINISHED_PER_UID`], and the oldest of all past [`MAX_FINISHED`] (counted).
    pub async fn keep_finished(&self, rank: RankProfile) {
        let mut finished = self.finished.lock().await;
        let uid = rank.uid;
        if finished.iter().filter(|f| f.rank.uid == uid).count() >= MAX_FINISHED_PER_UID {
            if let Some(i) = finished.iter().position(|f| f.rank.uid == uid) {
                finished.remove(i);
                self.finished_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        if finished.len() >= MAX_FINISHED {
            finished.remove(0);
            self.finished_dropped.fetch_add(1, Ordering::Relaxed);
        }
        finished.push(Finished {
            at: Instant::now(),
            rank,
        });
    }

    /// The node's cumulative profile now: live processes and those that exited, filtered,
    /// and limited to what `caller` may see.
    pub async fn snapshot(&self, filter: &pb::ProcessFilter, caller: Caller) -> JobProfile {
        self.snapshot_page(filter, caller, None).await.0
    }

    /// [`NodeState::snapshot`], or one page of it: the ranks after `after` in (pid, start)
    /// order, at most `size`, with the job-wide totals of them all; and the last rank's
    /// key when more follow. Only the page's exited ranks are copied: a node keeping
    /// thousands of them answers page by page in bounded memory.
    pub async fn snapshot_page(
        &self,
        filter: &pb::ProcessFilter,
        caller: Caller,
        page: Option<Page>,
    ) -> (JobProfile, Option<(u32, u64)>) {
        let mut profile = {
            let mut session = self.session.lock().await;
            let mut profile = session.profile(monotonic_ns());
            profile
                .libraries
                .retain(|l| caller.may_see_library(&session, &l.path));
            if caller != Caller::Any {
                // Each names another user's file and why it was not probed.
                profile.unsupported_libraries.clear();
            }
            profile
        };
        let wanted = |r: &RankProfile| {
            caller.may_see(r.uid)
                && (filter.job.is_empty() || r.job == filter.job)
                && (filter.ranks.is_empty() || filter.ranks.contains(&r.rank))
        };
        profile.ranks.retain(|r| wanted(r));
        let finished = self.finished.lock().await;
        let exited: Vec<&RankProfile> = finished
            .iter()
            .map(|f| &f.rank)
            .filter(|r| wanted(r))
            .collect();
        let all = || profile.ranks.iter().chain(exited.iter().copied());
        let totals = JobTotals::of(all());
        let key = |r: &RankProfile| (r.pid, r.start_ticks);
        let mut next = None;
        let ranks = match page {
            None => all().cloned().collect(),
            Some(Page { after, size }) => {
                let mut keys: Vec<(u32, u64)> = all()
                    .map(key)
                    .filter(|k| after.is_none_or(|a| *k > a))
                    .collect();
                keys.sort_unstable();
                if keys.len() > size {
                    keys.truncate(size);
                    next = keys.last().copied();
                }
                let keys: std::collections::BTreeSet<(u32, u64)> = keys.into_iter().collect();
                all().filter(|r| keys.contains(&key(r))).cloned().collect()
            }
        };
        let names: std::collections::HashMap<u32, (u32, String)> =
            if self.late.is_some() && !totals.job.is_empty() {
                all().map(|r| (r.pid, (r.rank, r.host.clone()))).collect()
            } else {
                Default::default()
            };
        drop(finished);
        profile.ranks = ranks;
        if !filter.routines.is_empty() {
            for r in &mut profile.ranks {
                r.routines.retain(|name, _| filter.routines.contains(name));
            }
        }
        profile
            .ranks
            .sort_by(|a, b| (a.job.as_str(), a.rank).cmp(&(b.job.as_str(), b.rank)));
        profile.set_totals(totals);
        if let (Some(late), false) = (&self.late, names.is_empty()) {
            let pids: Vec<u32> = names.keys().copied().collect();
            let whois = |pid: u32| names.get(&pid).cloned();
            profile.skew = late.lock().await.report_for(&pids, &whois).map(|mut s| {
                // A page carries the rows of its own ranks (the client joins them).
                if page.is_some() {
                    let here: std::collections::HashSet<u32> =
                        profile.ranks.iter().map(|r| r.rank).collect();
                    s.ranks.retain(|r| here.contains(&r.rank));
                }
                s
            });
        }
        (profile, next)
    }
}

/// The gRPC service over a [`NodeState`].
#[derive(Clone)]
pub struct NodeService {
    state: Arc<NodeState>,
}

impl NodeService {
    /// A service over `state`.
    pub fn new(state: Arc<NodeState>) -> Self {
        NodeService { state }
    }
}

type SnapshotStream =
    Pin<Box<dyn Stream<Item = Result<pb::WatchSnapshotsResponse, Status>> + Send>>;
type EventStream = Pin<Box<dyn Stream<Item = Result<pb::StreamEventsResponse, Status>> + Send>>;

/// Most StreamEvents streams open at once (each holds a task and a copy of every event).
const MAX_EVENT_STREAMS: usize = 16;

/// How often a StreamEvents stream sends what it gathered.
const EVENT_BATCH: Duration = Duration::from_millis(100);

#[tonic::async_trait]
impl pb::node_server::Node for NodeService {
    async fn list_processes(
        &self,
        req: Request<pb::ListProcessesRequest>,
    ) -> Result<Response<pb::ListProcessesResponse>, Status> {
        let caller = Caller::of(&req);
        let session = self.state.session.lock().await;
        let mut processes: Vec<pb::ProcessState> = session
            .tracked
            .iter()
            .filter(|(_, t)| caller.may_see(t.uid()))
            .map(|(pid, t)| process_state(*pid, t))
            .collect();
        let libraries = session
            .library_summaries()
            .iter()
            .filter(|l| caller.may_see_library(&session, &l.path))
            .map(Into::into)
            .collect();
        drop(session);
        for f in self
            .state
            .finished
            .lock()
            .await
            .iter()
            .filter(|f| caller.may_see(f.rank.uid))
        {
            processes.push(pb::ProcessState {
                pid: f.rank.pid,
                rank: f.rank.rank_known.then_some(f.rank.rank),
                job: f.rank.job.clone(),
                cmdline: f.rank.cmdline.clone(),
                status: pb::ProcessStatus::Exited as i32,
            });
        }
        processes.sort_by_key(|p| p.pid);
        Ok(Response::new(pb::ListProcessesResponse {
            processes,
            libraries,
        }))
    }

    async fn get_snapshot(
        &self,
        req: Request<pb::GetSnapshotRequest>,
    ) -> Result<Response<pb::GetSnapshotResponse>, Status> {
        let caller = Caller::of(&req);
        let req = req.into_inner();
        let filter = req.filter.unwrap_or_default();
        let page = page_of(req.page_size, &req.page_token)?;
        let (profile, next) = self.state.snapshot_page(&filter, caller, page).await;
        Ok(Response::new(pb::GetSnapshotResponse {
            node: self.state.node.clone(),
            profile: Some((&profile).into()),
            next_page_token: next.map_or(String::new(), |(pid, start)| format!("{pid}:{start}")),
        }))
    }

    type WatchSnapshotsStream = SnapshotStream;

    async fn watch_snapshots(
        &self,
        req: Request<pb::WatchSnapshotsRequest>,
    ) -> Result<Response<Self::WatchSnapshotsStream>, Status> {
        let caller = Caller::of(&req);
        let req = req.into_inner();
        let interval = watch_interval(req.interval_ms)?;
        let page_size = page_of(req.page_size, "")?.map(|p| p.size);
        let filter = req.filter.unwrap_or_default();
        let state = self.state.clone();
        let stream = async_stream(state, filter, interval, caller, page_size);
        Ok(Response::new(Box::pin(stream)))
    }
    async fn attach_process(
        &self,
        req: Request<pb::AttachProcessRequest>,
    ) -> Result<Response<pb::AttachProcessResponse>, Status> {
        let caller = Caller::of(&req);
        let pid = req.into_inner().pid;
        if pid == 0 {
            return Err(Status::invalid_argument("pid 0 is not a process"));
        }
        let info = crate::discover::process_info(pid).map_err(|e| e.to_status())?;
        if !caller.may_see(info.uid) {
            return Err(Status::permission_denied(format!(
                "PID {pid} belongs to another user"
            )));
        }
        let mut session = self.state.session.lock().await;
        let t = session.attach(pid).map_err(|e| e.to_status())?;
        let process = process_state(pid, t);
        drop(session);
        self.state.detached.lock().await.remove(&pid);
        Ok(Response::new(pb::AttachProcessResponse {
            process: Some(process),
        }))
    }

    async fn detach_process(
        &self,
        req: Request<pb::DetachProcessRequest>,
    ) -> Result<Response<pb::DetachProcessResponse>, Status> {
        let caller = Caller::of(&req);
        let pid = req.into_inner().pid;
        let mut session = self.state.session.lock().await;
        let Some(t) = session.tracked.get(&pid) else {
            return Err(Status::not_found(format!("PID {pid} is not watched")));
        };
        if !caller.may_see(t.uid()) {
            return Err(Status::permission_denied(format!(
                "PID {pid} belongs to another user"
            )));
        }
        let rank = session.detach(pid).map_err(|e| e.to_status())?;
        drop(session);
        self.state.detached.lock().await.insert(pid);
        if let Some(rank) = &rank {
            // Nothing lost: the profile stays in snapshots (and pushes) as a final one.
            self.state
                .keep_finished(RankProfile {
                    exited: true,
                    ..rank.clone()
                })
                .await;
        }
        Ok(Response::new(pb::DetachProcessResponse {
            profile: rank.as_ref().map(Into::into),
        }))
    }

    type StreamEventsStream = EventStream;

    async fn clock(
        &self,
        _req: Request<pb::ClockRequest>,
    ) -> Result<Response<pb::ClockResponse>, Status> {
        Ok(Response::new(pb::ClockResponse {
            monotonic_ns: self.state.api_time(monotonic_ns()),
            node: self.state.node.clone(),
        }))
    }

    async fn stream_events(
        &self,
        req: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let caller = Caller::of(&req);
        if caller != Caller::Any {
            // A stream switches per-call events on for every process of the node, whose
            // cost every rank pays: the operator's decision, not any user's.
            return Err(Status::permission_denied(
                "streaming events is for root (on the Unix socket) or a caller with a client \
                 certificate over TCP: it switches per-call events on node-wide",
            ));
        }
        if self.state.event_streams.load(Ordering::SeqCst) >= MAX_EVENT_STREAMS {
            return Err(Status::resource_exhausted(format!(
                "{MAX_EVENT_STREAMS} event streams are open already"
            )));
        }
        let pids: std::collections::BTreeSet<u32> = req.into_inner().pids.into_iter().collect();
        let state = self.state.clone();
        let feed = {
            let mut session = state.session.lock().await;
            if state.event_streams.fetch_add(1, Ordering::SeqCst) == 0 && !state.call_events {
                session
                    .probes
                    .set_call_events(true)
                    .map_err(|e| Status::internal(format!("{e:#}")))?;
            }
            session.call_feed()
        };
        // The stream carries the calls that start from now on: the ring buffer may still
        // hold events of collectives from before (who is late asks for those all along),
        // drained only on the next timer.
        let opened_ns = monotonic_ns();
        Ok(Response::new(Box::pin(event_stream(
            state, feed, pids, opened_ns,
        ))))
    }
}

/// Batches of the call feed for one StreamEvents caller, until it goes away; then switches
/// per-call events off again if it was the last and the daemon did not ask for them.
fn event_stream(
    state: Arc<NodeState>,
    mut feed: broadcast::Receiver<FeedItem>,
    pids: std::collections::BTreeSet<u32>,
    opened_ns: u64,
) -> impl Stream<Item = Result<pb::StreamEventsResponse, Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut dropped = 0u64;
        let mut tick = tokio::time::interval(EVENT_BATCH);
        loop {
            tick.tick().await;
            // Only root and certified callers stream (checked by the caller): they may see every
            // process, so the pid filter is the only one; an exited process's last calls
            // and its exit still reach them after the daemon has let it go.
            let visible = |pid: &u32| pids.is_empty() || pids.contains(pid);
            let (mut events, mut exited) = (Vec::new(), Vec::new());
            loop {
                match feed.try_recv() {
                    Ok(FeedItem::Call(ev)) if visible(&ev.tgid) && ev.start_ns >= opened_ns => {
                        let mut ev = crate::trace::call_event(&ev);
                        ev.start_ns = state.api_time(ev.start_ns);
                        events.push(ev);
                    }
                    Ok(FeedItem::Exited(pid)) if visible(&pid) => exited.push(pid),
                    Ok(_) => {}
                    Err(broadcast::error::TryRecvError::Lagged(n)) => dropped += n,
                    Err(_) => break,
                }
            }
            let batch = pb::StreamEventsResponse {
                events,
                dropped,
                exited,
            };
            if tx.send(Ok(batch)).await.is_err() {
                break;
            }
        }
        if state.event_streams.fetch_sub(1, Ordering::SeqCst) == 1 && !state.call_events {
            let mut session = state.session.lock().await;
            let _ = session.probes.set_call_events(false);
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Snapshots every `interval` until the client goes away (the send fails), each whole or
/// in pages of `page_size` ranks.
fn async_stream(
    state: Arc<NodeState>,
    filter: pb::ProcessFilter,
    interval: Duration,
    caller: Caller,
    page_size: Option<usize>,
) -> impl Stream<Item = Result<pb::WatchSnapshotsResponse, Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        'watch: loop {
            tick.tick().await;
            let mut after = None;
            loop {
                let page = page_size.map(|size| Page { after, size });
                let (profile, next) = state.snapshot_page(&filter, caller, page).await;
                let msg = pb::WatchSnapshotsResponse {
                    node: state.node.clone(),
                    profile: Some((&profile).into()),
                    more: next.is_some(),
                };
                if tx.send(Ok(msg)).await.is_err() {
                    break 'watch;
                }
                match next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[tonic::async_trait]
impl SnapshotSource for NodeState {
    async fn batch(&self) -> pb::PushSnapshotsRequest {
        let profile = self
            .snapshot(&pb::ProcessFilter::default(), Caller::Any)
            .await;
        let taken_ns = monotonic_ns();
        let instances = self.parts(&profile).await;
        let processes = profile
            .ranks
            .into_iter()
            .map(|rank| {
                let key = ProcessKey {
                    node: self.node.clone(),
                    pid: rank.pid,
                    start_ticks: rank.start_ticks,
                    boot_id: self.boot_id.clone(),
                };
                to_wire(&Snapshot {
                    key,
                    taken_ns,
                    rank,
                })
            })
            .collect();
        pb::PushSnapshotsRequest {
            processes,
            instances,
            ..Default::default()
        }
    }

    fn clock_ns(&self) -> u64 {
        self.api_time(monotonic_ns())
    }
}

impl NodeState {
    /// The collective instances who-is-late handed on (their other members are on other
    /// nodes), with ranks, hosts and job as `profile` names them, on the API's clock.
    async fn parts(&self, profile: &crate::profile::JobProfile) -> Vec<pb::InstancePart> {
        let Some(late) = &self.late else {
            return Vec::new();
        };
        let parts = late.lock().await.take_parts();
        let rank_of = |pid: u32| profile.ranks.iter().find(|r| r.pid == pid);
        parts
            .into_iter()
            .filter_map(|inst| {
                let job = rank_of(inst.arrivals.first()?.pid)?.job.clone();
                let arrivals = inst
                    .arrivals
                    .iter()
                    .filter_map(|a| {
                        let r = rank_of(a.pid)?;
                        Some(pb::InstanceArrival {
                            rank: r.rank,
                            host: self.node.clone(),
                            start_ns: self.api_time(a.start_ns),
                            end_ns: self.api_time(a.end_ns),
                        })
                    })
                    .collect();
                Some(pb::InstancePart {
                    job,
                    comm: inst.comm.0,
                    seq: inst.seq,
                    routine: collector_common::ROUTINES
                        .get(inst.routine as usize)
                        .map_or("?", |r| r.name)
                        .to_string(),
                    bucket: (inst.bucket != collector_common::UNKNOWN_BUCKET)
                        .then_some(u32::from(inst.bucket)),
                    size: inst.size,
                    arrivals,
                })
            })
            .collect()
    }
}
