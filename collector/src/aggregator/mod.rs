//! `commtap aggregator`: merges the ranks of jobs across nodes. Node daemons (or lower
//! aggregators) push cumulative snapshots; what is merged is persisted, so a restart loses
//! nothing; clients list jobs and read a job's report.

pub mod auth;
pub mod bench;
pub mod clock;
pub mod commit;
pub mod health;
pub mod load;
pub mod relay;
pub mod skew;
pub mod store;
#[cfg(test)]
mod tests;

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
};

use anyhow::{Context, Result};
use tokio::sync::Mutex;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};
use tracing::{info, warn};

use crate::{
    api::{
        limit::StreamLimit,
        pb,
        status::{watch_interval, ToStatus},
        transport::Target,
    },
    push::{self, SnapshotSource},
};
use commit::GroupCommit;
use store::Store;
use tokio_util::sync::CancellationToken;

/// How the aggregator runs.
#[derive(Clone, Debug)]
pub struct AggregatorOptions {
    /// TCP address to listen on.
    pub listen: SocketAddr,
    /// TLS for the listener (None: plaintext, asked for with --insecure-tcp).
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// Whether the listener requires client certificates (`--tls-client-ca`): then each
    /// caller's certificate names its role (see [`auth`]).
    pub mutual_tls: bool,
    /// Database file.
    pub db: PathBuf,
    /// A higher aggregator to push everything merged here to, and how often.
    pub upstream: Option<(Target, std::time::Duration)>,
    /// How long a finished job (every rank exited) is kept after its last snapshot.
    pub retain: std::time::Duration,
    /// Serve its health as Prometheus metrics here.
    pub metrics: Option<crate::serve::metrics::MetricsListener>,
    /// Push the metrics' series over OTLP too.
    pub otlp: Option<crate::serve::metrics::otlp::OtlpOptions>,
}

/// The store as a source of snapshots for a higher aggregator.
struct StoreSource {
    store: Arc<Mutex<Store>>,
    /// The store's generation at the last batch.
    pushed: std::sync::atomic::AtomicU64,
    /// The processes of the batch under way not handed out yet.
    pending: std::sync::Mutex<std::collections::VecDeque<crate::api::snapshot::ProcessKey>>,
}

/// Snapshots a relay reads from its store at a time: a push of a week of jobs holds their
/// keys and a few megabytes of snapshots, never all the snapshots.
const RELAYED_AT_ONCE: usize = 256;

#[tonic::async_trait]
impl SnapshotSource for StoreSource {
    async fn batch(&self, everything: bool) -> pb::PushSnapshotsRequest {
        use std::sync::atomic::Ordering::Relaxed;
        // Only what changed: a relay that holds a week of jobs does not push them all
        // every interval, and the aggregator above merges each snapshot once. What
        // changes while the batch is read goes again next time (stale then, harmless).
        let after = if everything {
            0
        } else {
            self.pushed.load(Relaxed)
        };
        let (keys, now) = self.store.lock().await.changed_since(after);
        self.pushed.store(now, Relaxed);
        *self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = keys.into();
        pb::PushSnapshotsRequest::default()
    }

    async fn more(&self) -> Option<Vec<pb::ProcessSnapshot>> {
        let keys: Vec<_> = {
            let mut pending = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let n = pending.len().min(RELAYED_AT_ONCE);
            pending.drain(..n).collect()
        };
        if keys.is_empty() {
            return None;
        }
        Some(self.store.lock().await.snapshots(&keys))
    }
}

/// The gRPC service.
pub struct AggregatorService {
    store: Arc<Mutex<Store>>,
    commits: GroupCommit,
    /// Whether callers are known by their client certificates.
    mutual_tls: bool,
    /// Each node's clock as its snapshots showed it.
    clocks: std::sync::Mutex<clock::NodeClocks>,
    /// Open push streams.
    pushes: StreamLimit<Option<IpAddr>>,
    /// Open job watches.
    watches: StreamLimit<Option<IpAddr>>,
    /// Who is late across nodes.
    skew: Arc<std::sync::Mutex<skew::CrossSkew>>,
    /// Where each node's daemon serves its API, as pushes said.
    node_api: std::sync::Mutex<NodeApis>,
    /// Open relayed traces.
    relays: StreamLimit<Option<IpAddr>>,
    /// Ends relayed traces when the aggregator stops.
    shutdown: CancellationToken,
    /// What its `/metrics` shows.
    health: Arc<health::Health>,
}

/// Most nodes whose API addresses the aggregator keeps (a cluster's worth; a pusher
/// inventing node names cannot grow it further).
pub const MAX_NODE_APIS: usize = 65_536;

/// Node name -> where its daemon serves its API over TCP.
#[derive(Debug, Default)]
struct NodeApis(std::collections::BTreeMap<String, String>);

impl NodeApis {
    /// Notes that `node` serves at `url`, within the cap (anything but an http(s) URL is
    /// left out: clients are sent there).
    fn note(&mut self, node: &str, url: &str) {
        if node.is_empty()
            || !crate::api::snapshot::is_node_api(url)
            || self.0.get(node).is_some_and(|u| u == url)
        {
            return;
        }
        if self.0.len() < MAX_NODE_APIS || self.0.contains_key(node) {
            self.0.insert(node.to_string(), url.to_string());
        }
    }
}

impl AggregatorService {
    /// The service over `store`; with `mutual_tls`, callers are known by their client
    /// certificates' roles.
    pub fn new(store: Arc<Mutex<Store>>, mutual_tls: bool) -> AggregatorService {
        let health = Arc::new(health::Health::default());
        AggregatorService {
            commits: GroupCommit::start(store.clone(), health.clone()),
            health,
            store,
            mutual_tls,
            clocks: std::sync::Mutex::new(clock::NodeClocks::default()),
            pushes: StreamLimit::default(),
            watches: StreamLimit::default(),
            skew: Default::default(),
            node_api: Default::default(),
            relays: StreamLimit::default(),
            shutdown: CancellationToken::new(),
        }
    }

    /// Ends the service's relayed traces when `shutdown` comes.
    pub fn until(mut self, shutdown: CancellationToken) -> AggregatorService {
        self.shutdown = shutdown;
        self
    }

    /// Its `/metrics`: the service's health and the store's size (the database at `db`).
    fn exporter(&self, db: PathBuf) -> health::AggregatorExporter {
        health::AggregatorExporter {
            health: self.health.clone(),
            store: self.store.clone(),
            db,
            pushes: self.pushes.clone(),
        }
    }

    /// The jobs known, and where each node's daemon serves.
    async fn job_list(&self) -> pb::ListJobsResponse {
        let jobs = self.store.lock().await.jobs();
        pb::ListJobsResponse {
            jobs,
            node_api: self
                .node_api
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0
                .clone()
                .into_iter()
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl pb::aggregator_server::Aggregator for AggregatorService {
    async fn push_snapshots(
        &self,
        req: Request<Streaming<pb::PushSnapshotsRequest>>,
    ) -> Result<Response<pb::PushSnapshotsResponse>, Status> {
        let role = auth::Role::of(&req, self.mutual_tls)?;
        role.check_push()?;
        let _slot = self
            .pushes
            .acquire(req.remote_addr().map(|a| a.ip()), "push")?;
        let peer = req
            .remote_addr()
            .map_or_else(|| "?".into(), |a| a.to_string());
        let mut stream = req.into_inner();
        let (mut accepted, mut stale, mut refused) = (0, 0, 0);
        let mut first = true;
        while let Some(msg) = stream.next().await {
            let mut msg = msg?;
            for p in &msg.processes {
                role.check_node(&p.node)?;
            }
            if !msg.node.is_empty() {
                role.check_node(&msg.node)?;
                if !msg.node_api.is_empty() && !crate::api::snapshot::is_node_api(&msg.node_api) {
                    return Err(Status::invalid_argument(
                        "node_api is not an http(s)://host:port address",
                    ));
                }
            }
            {
                // Addresses of the pushing node, and of the nodes an aggregator of a tree
                // relays (their role was checked above).
                let mut apis = self
                    .node_api
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                apis.note(&msg.node, &msg.node_api);
                for p in &msg.processes {
                    apis.note(&p.node, &p.node_api);
                }
            }
            // A sender's instances and message halves name ranks of its own node only.
            for a in msg.instances.iter().flat_map(|i| &i.arrivals) {
                role.check_node(&a.host)?;
            }
            for h in &msg.message_halves {
                role.check_node(&h.host)?;
            }
            {
                let mut skew = self
                    .skew
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(offset) = msg.clock_offset_ns {
                    skew.add(&msg.instances, offset, msg.clock_error_ns);
                }
                if !msg.node.is_empty()
                    && (!msg.late_senders.is_empty() || !msg.message_halves.is_empty())
                {
                    skew.add_late_senders(
                        &msg.node,
                        &msg.late_senders,
                        &msg.message_halves,
                        msg.clock_offset_ns,
                        msg.clock_error_ns,
                    );
                }
            }
            let r = self
                .clocks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .admit(&mut msg.processes, std::time::Instant::now());
            if r > 0 {
                warn!("push stream from {peer}: {r} snapshots refused, their clock runs ahead of their node's");
            }
            refused += r;
            // A message of a relay's push may carry no process (its first holds the clock
            // only): no commit for it.
            let (a, s) = if msg.processes.is_empty() {
                (0, 0)
            } else {
                self.commits
                    .merge(msg.processes)
                    .await
                    .map_err(|e| e.to_status())?
            };
            accepted += a;
            stale += s;
            for (counter, n) in [
                (&self.health.accepted, a),
                (&self.health.stale, s),
                (&self.health.refused, r),
            ] {
                counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }
            if first && a + s > 0 {
                info!("push stream from {peer}: first batch {a} accepted, {s} stale");
                first = false;
            }
        }
        Ok(Response::new(pb::PushSnapshotsResponse {
            accepted,
            stale,
            refused,
        }))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        auth::Role::of(&req, self.mutual_tls)?.check_read()?;
        Ok(Response::new(self.job_list().await))
    }

    type StreamJobEventsStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<pb::StreamJobEventsResponse, Status>> + Send>,
    >;

    async fn stream_job_events(
        &self,
        req: Request<pb::StreamJobEventsRequest>,
    ) -> Result<Response<Self::StreamJobEventsStream>, Status> {
        auth::Role::of(&req, self.mutual_tls)?.check_read()?;
        let slot = self
            .relays
            .acquire(req.remote_addr().map(|a| a.ip()), "relayed trace")?;
        let req = req.into_inner();
        if req.job.is_empty() {
            return Err(Status::invalid_argument(
                "a job id is required (ListJobs lists them)",
            ));
        }
        let nodes = crate::trace::remote::nodes_of_job(self.job_list().await, &req.job)
            .map_err(|e| Status::failed_precondition(format!("{e:#}")))?;
        let rx = relay::start(nodes, req.job, req.duration_ms, self.shutdown.clone(), slot);
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn get_job_report(
        &self,
        req: Request<pb::GetJobReportRequest>,
    ) -> Result<Response<pb::GetJobReportResponse>, Status> {
        auth::Role::of(&req, self.mutual_tls)?.check_read()?;
        let job = req.into_inner().job;
        if job.is_empty() {
            return Err(Status::invalid_argument(
                "a job id is required (ListJobs lists them)",
            ));
        }
        let mut profile = self
            .store
            .lock()
            .await
            .job(&job)
            .ok_or_else(|| Status::not_found(format!("no job {job}")))?;
        profile.skew = self
            .skew
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .report(&job);
        Ok(Response::new(pb::GetJobReportResponse {
            profile: Some((&profile).into()),
        }))
    }

    async fn clock(
        &self,
        _req: Request<pb::ClockRequest>,
    ) -> Result<Response<pb::ClockResponse>, Status> {
        Ok(Response::new(pb::ClockResponse {
            monotonic_ns: crate::clock::monotonic_ns(),
            node: "aggregator".into(),
        }))
    }

    type WatchJobReportStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<pb::WatchJobReportResponse, Status>> + Send>,
    >;

    async fn watch_job_report(
        &self,
        req: Request<pb::WatchJobReportRequest>,
    ) -> Result<Response<Self::WatchJobReportStream>, Status> {
        auth::Role::of(&req, self.mutual_tls)?.check_read()?;
        let slot = self
            .watches
            .acquire(req.remote_addr().map(|a| a.ip()), "watch")?;
        let req = req.into_inner();
        if req.job.is_empty() {
            return Err(Status::invalid_argument(
                "a job id is required (ListJobs lists them)",
            ));
        }
        let interval = watch_interval(req.interval_ms)?;
        let store = self.store.clone();
        let cross = self.skew.clone();
        let job = req.job;
        let stream = crate::api::server::watch_stream(interval, slot, move |tx| {
            let (store, cross, job) = (store.clone(), cross.clone(), job.clone());
            async move {
                // A job not (yet) known streams nothing until its first snapshot arrives.
                let Some(mut profile) = store.lock().await.job(&job) else {
                    return true;
                };
                profile.skew = cross
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .report(&job);
                let msg = pb::WatchJobReportResponse {
                    profile: Some((&profile).into()),
                };
                tx.send(Ok(msg)).await.is_ok()
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Forgets finished jobs older than `retain`, looking every minute (or every tenth of
/// `retain`, if shorter), until `shutdown`.
async fn expire_every(
    store: Arc<Mutex<Store>>,
    retain: std::time::Duration,
    shutdown: CancellationToken,
) {
    let every = (retain / 10).clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_mins(1),
    );
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match store.lock().await.expire(retain, std::time::Instant::now()) {
            Ok(0) => {}
            Ok(n) => info!("{n} finished jobs older than {retain:?} forgotten (--retain)"),
            Err(e) => warn!("forgetting old jobs: {e}"),
        }
    }
}

/// Raises this process's open-file limit to its hard limit: an aggregator holds a
/// connection per node (a thousand nodes are past the usual soft limit of 1024), a daemon
/// the files of its node's jobs.
pub fn raise_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct of our own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim) != 0 {
                warn!("could not raise the open-file limit to {}", lim.rlim_max);
            }
        }
    }
}

/// Runs the aggregator until SIGINT or SIGTERM.
pub async fn run(opts: AggregatorOptions) -> Result<()> {
    raise_file_limit();
    let tls = opts.tls;
    let store = Store::open(&opts.db).with_context(|| format!("opening {}", opts.db.display()))?;
    let store = Arc::new(Mutex::new(store));
    let shutdown = CancellationToken::new();
    let service = AggregatorService::new(store.clone(), opts.mutual_tls).until(shutdown.clone());
    let exporter = Arc::new(service.exporter(opts.db.clone()));
    let otlp = opts.otlp.clone().map(|o| {
        tokio::spawn(crate::serve::metrics::otlp::push(
            exporter.clone(),
            o,
            shutdown.clone(),
        ))
    });
    let metrics = opts.metrics.clone().map(|listener| {
        let serving = crate::serve::metrics::serve(listener, exporter.clone(), shutdown.clone());
        tokio::spawn(async move {
            // Said when it happens (a port taken), not at shutdown.
            if let Err(e) = serving.await {
                tracing::error!("metrics server: {e:#}");
            }
        })
    });
    let expiry = tokio::spawn(expire_every(store.clone(), opts.retain, shutdown.clone()));
    let upstream = opts.upstream.clone().map(|(target, every)| {
        tokio::spawn(push::run(
            Arc::new(StoreSource {
                store: store.clone(),
                pushed: 0.into(),
                pending: Default::default(),
            }),
            target,
            every,
            shutdown.clone(),
        ))
    });
    let routes = crate::api::server::routes(
        pb::aggregator_server::AggregatorServer::new(service)
            .max_decoding_message_size(crate::api::MAX_PUSH_BYTES),
    )
    .await?;
    // Before the port opens: whoever reaches it may stop the aggregator, cleanly.
    let mut signals = crate::signals::StopSignals::listen()?;
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("binding {}", opts.listen))?;
    match (&tls, opts.mutual_tls) {
        (Some(_), true) => info!(
            "serving gRPC over mutual TLS on {}: callers' certificates name their roles",
            listener.local_addr()?
        ),
        (Some(_), false) => warn!(
            "serving gRPC over TLS on {} without --tls-client-ca: anyone who reaches it may \
             push and read",
            listener.local_addr()?
        ),
        (None, _) => warn!(
            "serving plaintext gRPC on {} (--insecure-tcp): anyone who reaches it may push \
             and read",
            listener.local_addr()?
        ),
    }
    info!("commtap aggregator: database {}", opts.db.display());
    let stop = shutdown.clone();
    crate::api::server::serve(
        routes,
        tls,
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        async move {
            let name = signals.recv().await;
            crate::signals::stopping(name, "shutting down");
            signals.exit_on_next();
            stop.cancel();
        },
    )
    .await?;
    if let Some(task) = upstream {
        let _ = task.await;
    }
    for task in [metrics, otlp].into_iter().flatten() {
        let _ = task.await;
    }
    let _ = expiry.await;
    Ok(())
}
