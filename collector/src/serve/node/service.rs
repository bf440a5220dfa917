//! The `commtap.v1.Node` service: the node daemon's processes and their cumulative
//! profiles, live and as a stream, over a [`NodeState`].

use std::{pin::Pin, sync::Arc, time::Duration};

use std::sync::atomic::Ordering;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::{Caller, NodeState, Page, MAX_PAGE_RANKS};
use crate::{
    api::{
        pb,
        status::{watch_interval, ToStatus},
    },
    clock::monotonic_ns,
    discover::tracked::Tracked,
    profile::RankProfile,
    skew::board::PlacedItem,
};

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
/// Most calls in one StreamEvents message.
const MAX_BATCH_EVENTS: usize = 4096;

#[tonic::async_trait]
impl pb::node_server::Node for NodeService {
    async fn list_processes(
        &self,
        req: Request<pb::ListProcessesRequest>,
    ) -> Result<Response<pb::ListProcessesResponse>, Status> {
        let caller = Caller::of(&req);
        let session = self.state.session.lock().await;
        // Each process's job as the profile names it (a claim shared with another user's
        // job is `ID.uUID` there, a launcher's job its rank 0's pid), not the raw claim.
        let jobs = session.job_names();
        // The counters, read once and sorted by process, each process's a slice of them
        // for its probes' cost (not a copy: a user may hold tens of thousands); not read at
        // all for a caller who may see no process (a user asking again and again does not
        // have the daemon read every counter of the node each time).
        let mut counters = Vec::new();
        if session.tracked.values().any(|t| caller.may_see(t.uid())) {
            counters = session.probes.read_counters();
            counters.sort_unstable_by_key(|c| c.0.tgid);
        }
        let counters_of = |pid: u32| {
            let from = counters.partition_point(|c| c.0.tgid < pid);
            let to = counters.partition_point(|c| c.0.tgid <= pid);
            &counters[from..to]
        };
        let now = monotonic_ns();
        let call_cost = session.call_cost();
        let mut processes: Vec<pb::ProcessState> = session
            .tracked
            .iter()
            .filter(|(_, t)| caller.may_see(t.uid()))
            .map(|(pid, t)| {
                let routines = crate::stats::routines_of(*pid, counters_of(*pid), &[]);
                let ps = session.probes.read_proc_stats(*pid);
                let since = crate::profile::build::counted_from(t, &ps);
                pb::ProcessState {
                    probe_cost: probe_cost(&routines, now.saturating_sub(since), call_cost),
                    ..process_state(*pid, t, jobs.get(pid))
                }
            })
            .collect();
        let libraries = session
            .library_summaries()
            .iter()
            .filter(|l| caller.may_see_library(&session, &l.path))
            .map(Into::into)
            .collect();
        drop(session);
        let detached = self.state.detached.lock().await.clone();
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
                status: if detached.contains_key(&f.rank.pid) {
                    pb::ProcessStatus::Detached
                } else {
                    pb::ProcessStatus::Exited
                } as i32,
                container: f.rank.container.as_deref().map(Into::into),
                probe_cost: probe_cost(&f.rank.routines, f.rank.elapsed_ns, f.rank.call_cost()),
                unread: String::new(),
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
        // A user's watches are theirs to spend, up to the limit, its sub-uids' with them (or
        // each would be a caller of its own); a TCP caller's by address.
        let spender = match caller {
            Caller::Uid(uid) => Caller::Uid(self.state.session.lock().await.probes.account_of(uid)),
            other => other,
        };
        let slot = self
            .state
            .watches
            .acquire((spender, req.remote_addr().map(|a| a.ip())), "watch")?;
        let req = req.into_inner();
        let interval = watch_interval(req.interval_ms)?;
        let page_size = page_of(req.page_size, "")?.map(|p| p.size);
        let filter = req.filter.unwrap_or_default();
        let state = self.state.clone();
        let stream = crate::api::server::watch_stream(interval, slot, move |tx| {
            let (state, filter) = (state.clone(), filter.clone());
            async move { send_snapshot(&state, &filter, caller, page_size, &tx).await }
        });
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
        // Its detach goes to who-is-late and the streams before this attach: waited for
        // outside the session's lock, and again under it (a detach that held it meanwhile).
        self.state.detach_told(pid, info.start_ticks).await;
        // Under the session's lock to the end: an attach or a detach of the same process at
        // the same time waits for this one.
        let mut session = self.state.session.lock().await;
        if !session.tracked.contains_key(&pid) {
            self.state.detach_told(pid, info.start_ticks).await;
            // Attached again after a detach: its profile goes on from where it was.
            let earlier = self.state.take_detached(pid, info.start_ticks).await;
            let went_on = earlier.as_ref().map(|f| RankProfile {
                unwatched_ns: f
                    .rank
                    .unwatched_ns
                    .saturating_add(f.at.elapsed().as_nanos() as u64),
                ..f.rank.clone()
            });
            if let Err(e) = session.attach(pid, info, went_on) {
                if let Some(f) = earlier {
                    self.state.put_back(f).await;
                }
                return Err(e.to_status());
            }
            self.state.detached.lock().await.remove(&pid);
        }
        let jobs = session.job_names();
        let t = session
            .tracked
            .get(&pid)
            .ok_or_else(|| Status::internal(format!("PID {pid} attached but not tracked")))?;
        let process = process_state(pid, t, jobs.get(&pid));
        drop(session);
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
        // As `/proc` says (the clock an attach and an exit are told by), else as first seen.
        let start_ticks =
            crate::discover::start_ticks(pid).or_else(|| t.info.as_ref().map(|i| i.start_ticks));
        let job = t.info.as_ref().map(|i| {
            (
                (pid, i.start_ticks),
                crate::profile::build::job_key(i),
                i.world_size,
            )
        });
        let mut board = self.state.board().await;
        if let (Some(b), Some((proc, key, size))) = (board.as_deref_mut(), job) {
            // Its job known to who-is-late before the detach: its held calls are not kept
            // there until it is attached again.
            if !b.knows(proc) {
                b.set_world(proc, &key, size);
            }
        }
        let (rank, told_at_drain) = session
            .detach(pid, board.as_deref())
            .map_err(|e| e.to_status())?;
        let account = rank
            .as_ref()
            .and_then(|r| r.uid)
            .map(|u| session.probes.account_of(u));
        drop(board);
        // Before the session's lock goes: an attach waiting for it finds the profile.
        match start_ticks {
            Some(start_ticks) => {
                let d = crate::serve::node::DetachedProcess {
                    start_ticks,
                    told_at_drain,
                };
                self.state.detached.lock().await.insert(pid, d);
            }
            // Gone already: its pid may be another's from now on.
            None => session.probes.detached_exited(pid),
        }
        if let Some(rank) = &rank {
            // Nothing lost: the profile stays in snapshots (and pushes) as a final one.
            self.state.keep_finished(rank.clone(), account).await;
        }
        drop(session);
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
            state.placed_calls.subscribe()
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
    (mut feed, lost): (
        tokio::sync::mpsc::Receiver<PlacedItem>,
        Arc<std::sync::atomic::AtomicU64>,
    ),
    pids: std::collections::BTreeSet<u32>,
    opened_ns: u64,
) -> impl Stream<Item = Result<pb::StreamEventsResponse, Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut dropped = 0u64;
        let mut tick = tokio::time::interval(EVENT_BATCH);
        'streaming: loop {
            let stopping = tokio::select! {
                _ = tick.tick() => false,
                () = state.stopping.cancelled() => true,
            };
            // Only root and certified callers stream (checked by the caller): they may see every
            // process, so the pid filter is the only one; an exited process's last calls
            // and its exit still reach them after the daemon has let it go.
            let visible = |pid: &u32| pids.is_empty() || pids.contains(pid);
            // What is queued, in messages of at most MAX_BATCH_EVENTS calls: the stream's
            // few waiting messages hold a bounded number of calls whatever the rate.
            let mut more = true;
            while more {
                let (mut events, mut exited, mut detached) = (Vec::new(), Vec::new(), Vec::new());
                more = false;
                while let Ok(item) = feed.try_recv() {
                    match item {
                        PlacedItem::Call(ev, placement)
                            if visible(&ev.tgid) && ev.start_ns >= opened_ns =>
                        {
                            let mut ev = crate::trace::placed_call_event(&ev, placement);
                            ev.start_ns = state.api_time(ev.start_ns);
                            events.push(ev);
                        }
                        PlacedItem::Lost(n) => dropped += n,
                        // The batch ends here: its calls came before, and those of a
                        // process given the pid since, or of its next run, after.
                        PlacedItem::Exited(pid) if visible(&pid) => {
                            exited.push(pid);
                            more = true;
                            break;
                        }
                        PlacedItem::Detached(pid) if visible(&pid) => {
                            detached.push(pid);
                            more = true;
                            break;
                        }
                        _ => {}
                    }
                    if events.len() >= MAX_BATCH_EVENTS {
                        more = true;
                        break;
                    }
                }
                let batch = pb::StreamEventsResponse {
                    events,
                    dropped: dropped + lost.load(Ordering::Relaxed),
                    exited,
                    detached,
                };
                if tx.send(Ok(batch)).await.is_err() {
                    break 'streaming;
                }
            }
            if stopping {
                // What was queued went out above; the stream ends, and its client with it.
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

/// One watch tick: the snapshot, whole or in pages of `page_size` ranks (each page built
/// and sent before the next); false once the client has gone away.
async fn send_snapshot(
    state: &NodeState,
    filter: &pb::ProcessFilter,
    caller: Caller,
    page_size: Option<usize>,
    tx: &tokio::sync::mpsc::Sender<Result<pb::WatchSnapshotsResponse, Status>>,
) -> bool {
    let mut after = None;
    loop {
        let page = page_size.map(|size| Page { after, size });
        let (profile, next) = state.snapshot_page(filter, caller, page).await;
        let msg = pb::WatchSnapshotsResponse {
            node: state.node.clone(),
            profile: Some((&profile).into()),
            more: next.is_some(),
        };
        if tx.send(Ok(msg)).await.is_err() {
            return false;
        }
        match next {
            Some(n) => after = Some(n),
            None => return true,
        }
    }
}

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

/// What `routines`' probes cost a process whose run so far took `elapsed_ns`, by the
/// budget's estimate; None where it made no call.
fn probe_cost(
    routines: &crate::stats::Routines,
    elapsed_ns: u64,
    cost: crate::profile::CallCost,
) -> Option<pb::ProbeCost> {
    let by = crate::profile::probe_ns_by_routine(routines, cost);
    let estimated_ns = by.iter().fold(0u64, |all, (_, ns)| all.saturating_add(*ns));
    (estimated_ns > 0).then(|| pb::ProbeCost {
        estimated_ns,
        elapsed_ns,
        routines: by
            .iter()
            .take(3)
            .filter(|(_, ns)| *ns > 0)
            .map(|(routine, ns)| pb::RoutineCost {
                routine: (*routine).to_string(),
                estimated_ns: *ns,
            })
            .collect(),
    })
}

/// A tracked process as the API lists it, in `job` (its probes' cost left to the caller).
fn process_state(pid: u32, t: &Tracked, job: Option<&String>) -> pb::ProcessState {
    let info = t.info.as_ref();
    pb::ProcessState {
        pid,
        rank: info.and_then(|i| i.rank),
        job: job.cloned().unwrap_or_default(),
        cmdline: info.map(|i| i.cmdline.clone()).unwrap_or_default(),
        container: info.and_then(|i| i.container.as_ref()).map(Into::into),
        // Exited only once its final profile is taken (see the daemon's settling).
        status: if t.maps_mpi {
            pb::ProcessStatus::Probed
        } else {
            pb::ProcessStatus::NoMpi
        } as i32,
        probe_cost: None,
        unread: t.unread.as_ref().map(|u| u.0.clone()).unwrap_or_default(),
    }
}
