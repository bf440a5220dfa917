//! The `commtap.v1.Node` service: the node daemon's processes and their cumulative
//! profiles, live and as a stream.

use std::{
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::Mutex;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::pb;
use crate::{
    ingest::monotonic_ns,
    report::{JobProfile, RankProfile},
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
    /// The live profiling session.
    pub session: Mutex<Session>,
    /// Profiles of processes that exited.
    pub finished: Mutex<Vec<Finished>>,
}

/// Who is asking: root sees everything, another user only its own processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Root, or a caller over TCP (authenticated by TLS, not by uid).
    Any,
    /// A non-root user on the Unix socket.
    Uid(u32),
}

impl Caller {
    /// The caller of `req`, from the Unix socket's peer credentials.
    pub fn of<T>(req: &Request<T>) -> Caller {
        let uid = req
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        match uid {
            Some(0) | None => Caller::Any,
            Some(uid) => Caller::Uid(uid),
        }
    }

    /// Whether this caller may see a process of user `uid`.
    pub fn may_see(self, uid: Option<u32>) -> bool {
        match self {
            Caller::Any => true,
            Caller::Uid(me) => uid == Some(me),
        }
    }
}

impl NodeState {
    /// The node's cumulative profile now: live processes and those that exited, filtered,
    /// and limited to what `caller` may see.
    pub async fn snapshot(&self, filter: &pb::ProcessFilter, caller: Caller) -> JobProfile {
        let mut profile = self.session.lock().await.profile(monotonic_ns());
        let finished = self.finished.lock().await;
        profile
            .ranks
            .extend(finished.iter().map(|f| f.rank.clone()));
        profile.ranks.retain(|r| caller.may_see(r.uid));
        apply_filter(&mut profile, filter);
        profile
    }
}

/// Keeps only the ranks and routines `filter` asks for, and recomputes the totals.
fn apply_filter(p: &mut JobProfile, f: &pb::ProcessFilter) {
    p.ranks.retain(|r| {
        (f.job.is_empty() || r.job == f.job) && (f.ranks.is_empty() || f.ranks.contains(&r.rank))
    });
    if !f.routines.is_empty() {
        for r in &mut p.ranks {
            r.routines.retain(|name, _| f.routines.contains(name));
        }
    }
    p.ranks
        .sort_by(|a, b| (a.job.as_str(), a.rank).cmp(&(b.job.as_str(), b.rank)));
    p.dropped = p.ranks.iter().map(|r| r.health.dropped).sum();
    p.undecoded = p.ranks.iter().map(|r| r.health.undecoded).sum();
    let mut jobs: Vec<&str> = p.ranks.iter().map(|r| r.job.as_str()).collect();
    jobs.dedup();
    p.job = if jobs.len() == 1 {
        jobs[0].to_string()
    } else {
        String::new()
    };
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

/// Smallest interval a watcher may ask for.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

type SnapshotStream =
    Pin<Box<dyn Stream<Item = Result<pb::WatchSnapshotsResponse, Status>> + Send>>;

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
            .filter(|(_, t)| caller.may_see(t.info.as_ref().and_then(|i| i.uid)))
            .map(|(pid, t)| pb::ProcessState {
                pid: *pid,
                rank: t.info.as_ref().and_then(|i| i.rank),
                job: t
                    .info
                    .as_ref()
                    .and_then(|i| i.batch_job.clone())
                    .unwrap_or_default(),
                cmdline: t
                    .info
                    .as_ref()
                    .map(|i| i.cmdline.clone())
                    .unwrap_or_default(),
                maps_mpi: t.maps_mpi,
                // Exited only once its final profile is taken (see the daemon's settling).
                exited: false,
            })
            .collect();
        let libraries = session.library_summaries().iter().map(Into::into).collect();
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
                maps_mpi: true,
                exited: true,
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
        let filter = req.into_inner().filter.unwrap_or_default();
        let profile = self.state.snapshot(&filter, caller).await;
        Ok(Response::new(pb::GetSnapshotResponse {
            node: self.state.node.clone(),
            profile: Some((&profile).into()),
        }))
    }

    type WatchSnapshotsStream = SnapshotStream;

    async fn watch_snapshots(
        &self,
        req: Request<pb::WatchSnapshotsRequest>,
    ) -> Result<Response<Self::WatchSnapshotsStream>, Status> {
        let caller = Caller::of(&req);
        let req = req.into_inner();
        let interval = match req.interval_ms {
            0 => Duration::from_secs(1),
            ms => Duration::from_millis(u64::from(ms)),
        };
        if interval < MIN_INTERVAL {
            return Err(Status::invalid_argument(format!(
                "interval_ms {} is below the minimum of {} ms",
                req.interval_ms,
                MIN_INTERVAL.as_millis()
            )));
        }
        let filter = req.filter.unwrap_or_default();
        let state = self.state.clone();
        let stream = async_stream(state, filter, interval, caller);
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Snapshots every `interval` until the client goes away (the send fails).
fn async_stream(
    state: Arc<NodeState>,
    filter: pb::ProcessFilter,
    interval: Duration,
    caller: Caller,
) -> impl Stream<Item = Result<pb::WatchSnapshotsResponse, Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let profile = state.snapshot(&filter, caller).await;
            let msg = pb::WatchSnapshotsResponse {
                node: state.node.clone(),
                profile: Some((&profile).into()),
            };
            if tx.send(Ok(msg)).await.is_err() {
                break;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
