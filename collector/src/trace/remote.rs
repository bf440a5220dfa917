//! `commtap trace`: calls streamed from one or more node daemons (StreamEvents) into one
//! trace, each node's clock put on the first node's axis. Given an aggregator, the
//! aggregator gathers them from the job's daemons and relays them (StreamJobEvents: for a
//! client that reaches the aggregator but not the nodes), or, with `--direct`, the client
//! asks the aggregator where the daemons serve and streams from them itself. Both run
//! [`gather`]: into a trace file here, into the caller's stream at the aggregator.
//!
//! Clocks: every rank of a node stamps its calls with the node's CLOCK_MONOTONIC, which
//! means nothing on another node. For each daemon, commtap asks its clock (`Clock`) several
//! times and keeps the answer with the shortest round trip: the node's time was read
//! somewhere inside that round trip, so its offset from ours is known to within half of
//! it. Offsets are estimated when the trace starts and again when it ends; the calls are
//! moved by the first estimate, and the error written into the trace is the round trips'
//! plus how far the offset drifted meanwhile.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;
use tracing::{info, warn};

use super::{ProcessName, TraceOptions, TraceSummary, TraceWriter};
use crate::{
    api::{
        pb::{self, node_client::NodeClient},
        transport::{connect, Target},
    },
    clock::{best_exchange, monotonic_ns, ClockEstimate},
};

/// Which calls `commtap trace` takes, and until when.
#[derive(Debug, Default)]
pub struct TraceRequest {
    /// Only these processes (of the one daemon asked).
    pub pids: Vec<u32>,
    /// Only this job's processes, as each daemon lists them when the trace starts.
    pub job: Option<String>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Created once every call from then on goes into the trace.
    pub ready_file: Option<PathBuf>,
    /// Given an aggregator: stream from the job's daemons directly, not relayed by it.
    pub direct: bool,
}

/// Where the calls gathered from daemons go: a trace file (`commtap trace`), or the caller
/// of an aggregator's StreamJobEvents.
pub trait Sink {
    /// One call, on the trace's clock, under its pid in the trace; one the process had
    /// not returned from when the trace ended says why (`unfinished`), the last of its
    /// thread.
    fn call(&mut self, ev: pb::CallEvent) -> Result<()>;
    /// Names process `pid`.
    fn name(&mut self, pid: u32, name: ProcessName);
    /// Calls the streams lost by reading too slowly (an increment).
    fn lost_by_reader(&mut self, n: u64);
    /// Process `pid` (as in the trace) was detached, or is watched again after it: its
    /// calls before and after are not one run.
    fn detached(&mut self, pid: u32);
    /// Process `pid` (as in the trace) exited: every call of its came before.
    fn exited(&mut self, pid: u32);
    /// Calls the nodes' kernels could not queue (the ranks' `dropped`, summed).
    fn set_ring_buffer_full(&mut self, n: u64);
    /// The clock metadata: the axis, and each node's offset, error and drift.
    fn set_clocks(&mut self, clocks: serde_json::Value);
    /// Every node streams: every call from now on is in.
    fn streaming(&mut self) -> Result<()>;
    /// Hands on what came since the last flush (a relay sends it; an error: its caller left).
    fn flush(&mut self) -> impl Future<Output = Result<()>> + Send;
    /// Whether nothing more is wanted (`--steps`: every process seen is past the last
    /// step). A relayed trace is not ended by it: the relay's last message (the kernel's
    /// losses, the clocks' drift) comes at the end of the job's stream.
    fn done(&self) -> bool {
        false
    }
}

/// A trace file, and the file that says it streams.
struct FileSink {
    writer: TraceWriter,
    ready_file: Option<PathBuf>,
    /// Calls the relay said were lost so far (it says it cumulatively).
    relay_lost: u64,
}

impl Sink for FileSink {
    fn call(&mut self, ev: pb::CallEvent) -> Result<()> {
        if ev.unfinished.is_some() {
            return Ok(self.writer.unfinished(&ev)?);
        }
        Ok(self.writer.call(&ev)?)
    }

    fn name(&mut self, pid: u32, name: ProcessName) {
        self.writer.name(pid, name);
    }

    fn lost_by_reader(&mut self, n: u64) {
        self.writer.lost_by_reader(n);
    }

    fn detached(&mut self, pid: u32) {
        self.writer.detached(pid);
    }

    fn exited(&mut self, pid: u32) {
        self.writer.exited(pid);
    }

    fn set_ring_buffer_full(&mut self, n: u64) {
        self.writer.set_ring_buffer_full(n);
    }

    fn set_clocks(&mut self, clocks: serde_json::Value) {
        let nodes = clocks["nodes"].as_array().map_or(&[][..], Vec::as_slice);
        let largest = nodes
            .iter()
            .filter_map(|c| Some((c["node"].as_str()?.to_string(), c["error_ns"].as_u64()?)))
            .max_by_key(|(_, e)| *e)
            .filter(|_| nodes.len() > 1);
        self.writer.set_clocks(clocks, largest);
    }

    fn done(&self) -> bool {
        self.writer.steps_done()
    }

    fn streaming(&mut self) -> Result<()> {
        if let Some(path) = &self.ready_file {
            crate::report::write_file(path, b"streaming\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
        // A trace of a quiet node says nothing for a long while: that it runs is news.
        eprintln!(
            "trace: streaming; every call from now on is traced, until Ctrl-C, --duration, or \
             the exit of the processes asked for (--pid, --job)"
        );
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Estimates `client`'s node clock against ours, and says which node it is.
pub async fn estimate_clock(client: &mut NodeClient<Channel>) -> Result<(ClockEstimate, String)> {
    let (estimate, last) = best_exchange(monotonic_ns, || {
        let mut c = client.clone();
        async move {
            let r = c
                .clock(pb::ClockRequest {})
                .await
                .context("Clock")?
                .into_inner();
            Ok((r.monotonic_ns, r))
        }
    })
    .await?;
    Ok((estimate, last.node))
}

/// One daemon the trace reads.
struct Source {
    client: NodeClient<Channel>,
    node: String,
    /// Processes asked for (empty: all).
    pids: BTreeSet<u32>,
    /// Of those, the ones still running.
    running: BTreeSet<u32>,
    start_clock: ClockEstimate,
    /// Its pids as the trace shows them (another node's process may have the same pid).
    trace_pid: BTreeMap<u32, u32>,
    /// Pids whose names were asked for already (a process the daemon no longer lists is
    /// named from the final profiles, not asked for again with every batch).
    asked: BTreeSet<u32>,
    streaming: bool,
    /// Its daemon ended its stream (it stopped): nothing more comes from it.
    ended: bool,
}

/// The daemons' names for their processes, by pid.
async fn process_names(source: &mut Source) -> Result<BTreeMap<u32, pb::ProcessState>> {
    let list = source
        .client
        .list_processes(pb::ListProcessesRequest {})
        .await
        .context("ListProcesses")?
        .into_inner();
    Ok(list.processes.into_iter().map(|p| (p.pid, p)).collect())
}

/// Connects to every daemon and works out what to stream from each.
async fn open_sources(from: &[Target], request: &TraceRequest) -> Result<Vec<Source>> {
    if from.len() > 1 && !request.pids.is_empty() {
        bail!("--pid names one node's processes: give one --from with it (or --job)");
    }
    let mut sources = Vec::new();
    for target in from {
        let mut client = crate::api::node_client(connect(target).await?);
        let (start_clock, node) = match estimate_clock(&mut client).await {
            Ok(c) => c,
            Err(e)
                if e.downcast_ref::<tonic::Status>()
                    .is_some_and(|s| s.code() == tonic::Code::Unimplemented) =>
            {
                // Not a node: an aggregator says where the job's nodes serve.
                if from.len() > 1 {
                    bail!("{target:?} is an aggregator: give it alone, as --from with --job");
                }
                let nodes = job_nodes(target, request).await?;
                return Box::pin(open_sources(&nodes, request)).await;
            }
            Err(e) => return Err(e),
        };
        let mut source = Source {
            client,
            node,
            pids: request.pids.iter().copied().collect(),
            running: BTreeSet::new(),
            start_clock,
            trace_pid: BTreeMap::new(),
            asked: BTreeSet::new(),
            streaming: false,
            ended: false,
        };
        if let Some(job) = &request.job {
            let of_job: Vec<u32> = process_names(&mut source)
                .await?
                .into_values()
                .filter(|p| {
                    &p.job == job
                        && matches!(
                            p.status(),
                            pb::ProcessStatus::Probed | pb::ProcessStatus::NoMpi
                        )
                })
                .map(|p| p.pid)
                .collect();
            if of_job.is_empty() {
                // With several nodes, a node may hold none of the job's ranks.
                if from.len() == 1 {
                    bail!("job {job}: the daemon lists no running process of it (`commtap ps`)");
                }
                continue;
            }
            source.pids.extend(of_job);
        }
        source.running = source.pids.clone();
        sources.push(source);
    }
    if sources.is_empty() {
        bail!(
            "job {}: no daemon lists a running process of it",
            request.job.as_deref().unwrap_or("")
        );
    }
    Ok(sources)
}

/// The job a trace asks the aggregator at `target` for (it has no use for pids).
fn aggregator_job<'a>(target: &Target, request: &'a TraceRequest) -> Result<&'a str> {
    let Some(job) = &request.job else {
        bail!("{target:?} is an aggregator: name the job with --job (`commtap jobs` lists them)");
    };
    if !request.pids.is_empty() {
        bail!("--pid names one node's processes: ask its daemon, not the aggregator");
    }
    Ok(job)
}

/// The daemons of job `request.job`, as the aggregator at `target` knows them (see
/// [`nodes_of_job`]): the calls stream from the daemons straight to this client.
async fn job_nodes(target: &Target, request: &TraceRequest) -> Result<Vec<Target>> {
    let job = aggregator_job(target, request)?;
    let list = crate::api::aggregator_client(connect(target).await?)
        .list_jobs(pb::ListJobsRequest {})
        .await
        .context("ListJobs")?
        .into_inner();
    nodes_of_job(list, job)
}

/// The daemons of `job` in an aggregator's list: each node's advertised API address
/// (`commtap daemon --listen`, `--advertise`), by node name (the first node's clock is the
/// trace's axis); every node's that said, if the aggregator has no call of the job yet
/// (each daemon is then asked for the job's processes, and the nodes without one are left
/// out).
pub fn nodes_of_job(list: pb::ListJobsResponse, job: &str) -> Result<Vec<Target>> {
    let mut node_api: Vec<(String, String)> = list.node_api.into_iter().collect();
    node_api.sort();
    let nodes: Vec<(String, String)> = match list.jobs.into_iter().find(|j| j.job == job) {
        Some(summary) => {
            let silent: Vec<&str> = summary
                .nodes
                .iter()
                .filter(|n| !node_api.iter().any(|(m, _)| m == *n))
                .map(String::as_str)
                .collect();
            if !silent.is_empty() {
                bail!(
                    "job {job}: nodes {} did not say where their daemons serve (start them \
                     with --listen, and --advertise where clients reach them by another name)",
                    silent.join(", ")
                );
            }
            node_api
                .into_iter()
                .filter(|(n, _)| summary.nodes.contains(n))
                .collect()
        }
        None => node_api,
    };
    if nodes.is_empty() {
        bail!("the aggregator knows no node that serves its API over TCP (daemon --listen)");
    }
    nodes
        .into_iter()
        .map(|(node, url)| {
            if !crate::api::snapshot::is_node_api(&url) {
                bail!("the aggregator gave {url:?} as node {node}'s address");
            }
            url.parse::<Target>().map_err(anyhow::Error::msg)
        })
        .collect()
}

/// `commtap trace`: every call of the daemons' processes into a trace file, until the
/// duration ends, a signal comes, every process asked for has exited, or (`--steps`, not
/// through a relay) every one is past the last step.
pub async fn trace(
    from: &[Target],
    request: TraceRequest,
    opts: TraceOptions,
) -> Result<TraceSummary> {
    let mut sink = FileSink {
        writer: TraceWriter::create(opts)?,
        ready_file: request.ready_file.clone(),
        relay_lost: 0,
    };
    let mut signals = crate::signals::StopSignals::listen()?;
    let stop = async {
        let name = signals.recv().await;
        crate::signals::stopping(name, "finishing the trace");
    };
    match relaying_aggregator(from, &request).await? {
        Some(aggregator) => relayed(aggregator, &request, &mut sink, stop).await?,
        None => gather(from, &request, &mut sink, stop).await?,
    }
    signals.exit_on_next();
    Ok(sink.writer.finish()?)
}

/// The aggregator to ask for a relayed trace: `from`, if it is one aggregator and
/// `--direct` was not given.
async fn relaying_aggregator<'a>(
    from: &'a [Target],
    request: &TraceRequest,
) -> Result<Option<&'a Target>> {
    let [target] = from else { return Ok(None) };
    if request.direct {
        return Ok(None);
    }
    let mut node = crate::api::node_client(connect(target).await?);
    match node.clock(pb::ClockRequest {}).await {
        Err(s) if s.code() == tonic::Code::Unimplemented => Ok(Some(target)),
        // A daemon (or one that is not answering: `gather` says why).
        _ => Ok(None),
    }
}

/// A trace relayed by the aggregator at `target` (StreamJobEvents) into `sink`.
async fn relayed(
    target: &Target,
    request: &TraceRequest,
    sink: &mut FileSink,
    stop: impl Future<Output = ()>,
) -> Result<()> {
    let job = aggregator_job(target, request)?;
    let mut stream = crate::api::aggregator_client(connect(target).await?)
        .stream_job_events(pb::StreamJobEventsRequest {
            job: job.to_string(),
            duration_ms: request
                .duration
                .map_or(0, |d| d.as_millis().clamp(1, u128::from(u64::MAX)) as u64),
        })
        .await
        .context("StreamJobEvents")?
        .into_inner();
    tokio::pin!(stop);
    loop {
        let msg = tokio::select! {
            () = &mut stop => break,
            m = stream.message() => m.context("StreamJobEvents")?,
        };
        let Some(msg) = msg else { break };
        // Named first: a call of a process the trace keeps by its rank (`--ranks`) whose
        // name comes in the same message (a hung rank's unfinished call, at the end).
        for p in msg.processes {
            sink.name(
                p.pid,
                ProcessName {
                    rank: p.rank,
                    host: p.host,
                    job: p.job,
                },
            );
        }
        for ev in msg.events {
            sink.call(ev)?;
        }
        for pid in msg.detached {
            sink.detached(pid);
        }
        for pid in msg.exited {
            sink.exited(pid);
        }
        sink.lost_by_reader(msg.lost_by_reader.saturating_sub(sink.relay_lost));
        sink.relay_lost = sink.relay_lost.max(msg.lost_by_reader);
        if let Some(n) = msg.ring_buffer_full {
            sink.set_ring_buffer_full(n);
        }
        if !msg.clocks_json.is_empty() {
            sink.set_clocks(
                serde_json::from_str(&msg.clocks_json).context("the relay's clock metadata")?,
            );
        }
        if msg.streaming {
            sink.streaming()?;
        }
    }
    Ok(())
}

/// Every call of the daemons' processes into `sink`, until the duration ends, `stop`
/// does, every process asked for has exited, the sink is done (past the last step) or
/// fails (a relay's caller left).
pub async fn gather<S: Sink>(
    from: &[Target],
    request: &TraceRequest,
    sink: &mut S,
    stop: impl Future<Output = ()>,
) -> Result<()> {
    let mut sources = open_sources(from, request).await?;
    let started = Instant::now();
    sink.set_clocks(clock_metadata(&sources, &[], started.elapsed()));
    let mut rx = subscribe(&mut sources).await?;
    let duration = tokio::time::sleep(
        request
            .duration
            .unwrap_or(Duration::from_secs(u64::MAX / 4)),
    );
    tokio::pin!(duration, stop);
    let mut merge = Merge::new(&sources);
    loop {
        let (i, batch) = tokio::select! {
            () = &mut duration => break,
            () = &mut stop => break,
            b = rx.recv() => {
                let Some(b) = b else { break };
                b
            }
        };
        let Some(batch) = batch else {
            // One node's daemon stopped: the others go on.
            sources[i].ended = true;
            if sources.iter().all(|s| s.ended) {
                warn!("every daemon ended its stream (stopping): the trace ends here");
                break;
            }
            warn!(
                "{}: its daemon ended its stream (stopping): no more calls from it",
                sources[i].node
            );
            continue;
        };
        let batch = batch.with_context(|| format!("StreamEvents from {}", sources[i].node))?;
        note_streaming(&mut sources, i, sink)?;
        // Named before their calls are written: a step's numbering is its job's.
        let named = name_new_processes(sink, &mut merge, &mut sources[i], &batch.events);
        if let Err(e) = named.await {
            // A daemon that stopped (its last batch just came) is asked again at the end,
            // and its processes keep their pids meanwhile; their steps, if counted, are
            // numbered apart from their job's (the summary's counts show it).
            warn!(
                "{}: naming its processes: {}",
                sources[i].node,
                crate::api::status::error_text(&e)
            );
        }
        merge.take(sink, &mut sources[i], i, batch.events, batch.dropped)?;
        // A process with no call in the trace yet has nothing to keep apart.
        for pid in &batch.detached {
            if let Some(&shown) = sources[i].trace_pid.get(pid) {
                sink.detached(shown);
            }
        }
        for pid in &batch.exited {
            if let Some(&shown) = sources[i].trace_pid.get(pid) {
                sink.exited(shown);
            }
        }
        for pid in &batch.exited {
            sources[i].running.remove(pid);
        }
        sink.flush().await?;
        if sources
            .iter()
            .all(|s| s.ended || (!s.pids.is_empty() && s.running.is_empty()))
        {
            break;
        }
        // Past the last step: only once every process asked for was seen (another node's
        // may not have come yet).
        let all_seen = || {
            sources
                .iter()
                .all(|s| s.running.iter().all(|pid| s.trace_pid.contains_key(pid)))
        };
        if sink.done() && all_seen() {
            info!("every traced process is past the last step asked for: the trace ends");
            break;
        }
    }
    finish_sources(sink, &mut sources, &mut merge, started.elapsed()).await?;
    sink.flush().await
}

/// Daemons' batches (at most 4,096 calls each) waiting to be written, from all nodes.
const BATCHES_WAITING: usize = 16;

/// Opens every source's event stream, all feeding one channel: (source, batch), and
/// (source, None) when its daemon ended the stream.
async fn subscribe(
    sources: &mut [Source],
) -> Result<tokio::sync::mpsc::Receiver<(usize, Option<Result<pb::StreamEventsResponse>>)>> {
    let (tx, rx) = tokio::sync::mpsc::channel(BATCHES_WAITING);
    for (i, source) in sources.iter_mut().enumerate() {
        let mut stream = source
            .client
            .stream_events(pb::StreamEventsRequest {
                pids: source.pids.iter().copied().collect(),
            })
            .await
            .with_context(|| format!("StreamEvents from {}", source.node))?
            .into_inner();
        let tx = tx.clone();
        tokio::spawn(async move {
            // A batch is read off the connection only once there is room for it: what
            // waits is bounded by the channel, however many nodes there are.
            while let Ok(room) = tx.reserve().await {
                let Some(b) = stream.next().await else {
                    // Ended by its daemon: said, so that the trace need not wait for it.
                    room.send((i, None));
                    break;
                };
                let failed = b.is_err();
                room.send((i, Some(b.map_err(anyhow::Error::from))));
                if failed {
                    break;
                }
            }
        });
    }
    Ok(rx)
}

/// Notes that source `i` streams; once every source does, tells the sink.
fn note_streaming<S: Sink>(sources: &mut [Source], i: usize, sink: &mut S) -> Result<()> {
    if sources[i].streaming {
        return Ok(());
    }
    sources[i].streaming = true;
    if sources.iter().all(|s| s.streaming) {
        sink.streaming()?;
    }
    Ok(())
}

/// How the sources' events go into one trace: onto the first node's clock, each process
/// under a pid no other node's process has.
struct Merge {
    reference: ClockEstimate,
    lost_by_source: Vec<u64>,
    taken: BTreeSet<u32>,
    next_synthetic: u32,
}

impl Merge {
    fn new(sources: &[Source]) -> Merge {
        Merge {
            reference: sources[0].start_clock,
            lost_by_source: vec![0; sources.len()],
            taken: BTreeSet::new(),
            next_synthetic: 1 << 22,
        }
    }

    /// Writes source `i`'s `events`; `dropped` is what its stream lost so far.
    fn take<S: Sink>(
        &mut self,
        sink: &mut S,
        source: &mut Source,
        i: usize,
        events: Vec<pb::CallEvent>,
        dropped: u64,
    ) -> Result<()> {
        sink.lost_by_reader(dropped.saturating_sub(self.lost_by_source[i]));
        self.lost_by_source[i] = dropped;
        for e in events {
            sink.call(self.placed(source, e))?;
        }
        Ok(())
    }

    /// `e`, a call of `source`'s node, on the trace's clock and under its pid there.
    fn placed(&mut self, source: &mut Source, mut e: pb::CallEvent) -> pb::CallEvent {
        e.pid = self.trace_pid(source, e.pid);
        let shift = self.reference.offset_ns - source.start_clock.offset_ns;
        e.start_ns = e.start_ns.saturating_add_signed(shift);
        e
    }

    /// Process `pid` of `source`'s node, as the trace shows it (another node's process may
    /// have the same pid).
    fn trace_pid(&mut self, source: &mut Source, pid: u32) -> u32 {
        *source.trace_pid.entry(pid).or_insert_with(|| {
            if self.taken.insert(pid) {
                pid
            } else {
                self.next_synthetic += 1;
                self.next_synthetic
            }
        })
    }
}

/// Names the processes of `events`, calls of `source`'s node, that its daemon was not asked
/// about yet (once per process).
async fn name_new_processes<S: Sink>(
    sink: &mut S,
    merge: &mut Merge,
    source: &mut Source,
    events: &[pb::CallEvent],
) -> Result<()> {
    let new: BTreeSet<u32> = events
        .iter()
        .map(|e| e.pid)
        .filter(|pid| !source.asked.contains(pid))
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    source.asked.extend(&new);
    let names = process_names(source).await?;
    for pid in new {
        if let Some(p) = names.get(&pid) {
            let shown = merge.trace_pid(source, pid);
            sink.name(
                shown,
                ProcessName {
                    rank: p.rank,
                    host: source.node.clone(),
                    job: p.job.clone(),
                },
            );
        }
    }
    Ok(())
}

/// Ends the trace from each daemon's last profiles: the calls its traced processes are
/// still inside (a hung job's), the processes' names, what the kernel could not queue,
/// and each node's clock offset, error and drift.
async fn finish_sources<S: Sink>(
    sink: &mut S,
    sources: &mut [Source],
    merge: &mut Merge,
    took: Duration,
) -> Result<()> {
    let mut ring_full = 0;
    let mut ends = Vec::new();
    for source in sources.iter_mut() {
        // A daemon that stopped (and so ended its stream) cannot be asked any more: the
        // trace is whole to there, its processes keep the names seen so far.
        let asked = async {
            let (end_clock, _) = estimate_clock(&mut source.client).await?;
            let profile =
                crate::client::node_snapshot(&mut source.client, pb::ProcessFilter::default())
                    .await?;
            // The node's clock when its profile came: its calls in progress ran until
            // then (late by the answer's trip at most).
            let node_now = monotonic_ns().saturating_add_signed(end_clock.offset_ns);
            anyhow::Ok((end_clock, profile, node_now))
        };
        let (end_clock, profile, node_now) = match asked.await {
            Ok(answers) => answers,
            Err(e) => {
                warn!(
                    "{}: its daemon did not answer at the trace's end (stopped?), so its \
                     clock's drift is not known: {}",
                    source.node,
                    crate::api::status::error_text(&e)
                );
                ends.push(source.start_clock);
                continue;
            }
        };
        ends.push(end_clock);
        for r in &profile.ranks {
            let traced = source.pids.is_empty() || source.pids.contains(&r.pid);
            // Placed (its process given a pid in the trace), then named before it is
            // written: a rank that made no call in the trace (a hung one) is known by its
            // name alone to a trace of some ranks (`--ranks`).
            let unfinished = r
                .in_call
                .as_ref()
                .filter(|_| traced && r.ended.is_none())
                .map(|call| {
                    let why = super::still_inside(call, "the trace ended");
                    merge.placed(source, super::unfinished_call(r, call, node_now, why))
                });
            if let Some(&shown) = source.trace_pid.get(&r.pid) {
                ring_full += r.health.dropped;
                sink.name(
                    shown,
                    ProcessName {
                        rank: r.rank_known.then_some(r.rank),
                        // The daemon's node name (--node-name), as `commtap ps` says it.
                        host: source.node.clone(),
                        job: r.job.clone(),
                    },
                );
            }
            if let Some(ev) = unfinished {
                sink.call(ev)?;
            }
        }
    }
    sink.set_ring_buffer_full(ring_full);
    sink.set_clocks(clock_metadata(sources, &ends, took));
    Ok(())
}

/// The trace's clock metadata: the first node's clock is the axis; each other node's
/// offset from it and the error of that, with how far the offset drifted by `ends` (the
/// estimates when the trace ended; none yet: no drift known).
fn clock_metadata(sources: &[Source], ends: &[ClockEstimate], took: Duration) -> serde_json::Value {
    let reference = sources[0].start_clock;
    let nodes: Vec<serde_json::Value> = sources
        .iter()
        .enumerate()
        .map(|(i, source)| {
            let drift = ends.get(i).map_or(0, |end| {
                end.offset_ns.abs_diff(source.start_clock.offset_ns)
            });
            let (offset, error) = if i == 0 {
                (0, 0)
            } else {
                (
                    source.start_clock.offset_ns - reference.offset_ns,
                    source.start_clock.error_ns + reference.error_ns + drift,
                )
            };
            serde_json::json!({
                "node": source.node,
                "offset_ns": offset,
                "error_ns": error,
                "drift_ns": drift,
            })
        })
        .collect();
    serde_json::json!({
        "axis": format!("{}'s CLOCK_MONOTONIC", sources[0].node),
        "estimated_over_s": took.as_secs_f64(),
        "nodes": nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_bounds_the_offset_by_half_its_round_trip() {
        // Sent at 1000, answered at 1400 (ours): the node read 5_001_100 in between.
        let e = ClockEstimate::from_exchange(1000, 5_001_100, 1400);
        assert_eq!(e.offset_ns, 5_001_100 - 1200);
        assert_eq!(e.error_ns, 200);
        // Whenever in [sent, received] the node read its clock, the truth lies within.
        for true_mid in [1000i64, 1400] {
            let true_offset = 5_001_100 - true_mid;
            assert!(true_offset.abs_diff(e.offset_ns) <= e.error_ns);
        }
    }
}
