//! `commtap trace`: calls streamed from one or more node daemons (StreamEvents) into one
//! trace, each node's clock put on the first node's axis; given an aggregator, from the
//! daemons of the job's nodes, as the aggregator names them.
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
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;

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
    pub ready_file: Option<std::path::PathBuf>,
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
        };
        if let Some(job) = &request.job {
            let of_job: Vec<u32> = process_names(&mut source)
                .await?
                .into_values()
                .filter(|p| &p.job == job && p.status() != pb::ProcessStatus::Exited)
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

/// The daemons of job `request.job`, as the aggregator at `target` knows them: each node's
/// advertised API address (`commtap daemon --listen`, `--advertise`); every node's that
/// said, if the aggregator has no call of the job yet (each daemon is then asked for the
/// job's processes, and the nodes without one are left out). The calls stream from the
/// daemons straight to this client: the aggregator holds no trace.
async fn job_nodes(target: &Target, request: &TraceRequest) -> Result<Vec<Target>> {
    let Some(job) = &request.job else {
        bail!("{target:?} is an aggregator: name the job with --job (`commtap jobs` lists them)");
    };
    if !request.pids.is_empty() {
        bail!("--pid names one node's processes: ask its daemon, not the aggregator");
    }
    let list = crate::api::aggregator_client(connect(target).await?)
        .list_jobs(pb::ListJobsRequest {})
        .await
        .context("ListJobs")?
        .into_inner();
    let mut node_api: Vec<(String, String)> = list.node_api.into_iter().collect();
    // By name: the first node's clock is the trace's axis.
    node_api.sort();
    let nodes: Vec<(String, String)> = match list.jobs.into_iter().find(|j| &j.job == job) {
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
/// duration ends, a signal comes, or every process asked for has exited.
pub async fn trace(
    from: &[Target],
    request: TraceRequest,
    opts: TraceOptions,
) -> Result<TraceSummary> {
    let mut writer = TraceWriter::create(opts)?;
    let mut sources = open_sources(from, &request).await?;
    let mut rx = subscribe(&mut sources).await?;
    let stop = tokio::time::sleep(
        request
            .duration
            .unwrap_or(Duration::from_secs(u64::MAX / 4)),
    );
    tokio::pin!(stop);
    let mut signals = crate::signals::StopSignals::listen()?;
    let mut merge = Merge::new(&sources);
    let started = Instant::now();
    loop {
        let (i, batch) = tokio::select! {
            () = &mut stop => break,
            name = signals.recv() => {
                crate::signals::stopping(name, "finishing the trace");
                break;
            }
            b = rx.recv() => match b {
                Some(b) => b,
                None => break,
            },
        };
        let batch = batch.with_context(|| format!("StreamEvents from {}", sources[i].node))?;
        note_streaming(&mut sources, i, &request)?;
        merge.take(&mut writer, &mut sources[i], i, batch.events, batch.dropped)?;
        name_new_processes(&mut writer, &mut sources[i]).await?;
        for pid in &batch.exited {
            sources[i].running.remove(pid);
        }
        if sources
            .iter()
            .all(|s| !s.pids.is_empty() && s.running.is_empty())
        {
            break;
        }
    }
    signals.exit_on_next();
    finish_sources(&mut writer, &mut sources, started.elapsed()).await?;
    Ok(writer.finish()?)
}

/// Opens every source's event stream, all feeding one channel: (source, batch).
async fn subscribe(
    sources: &mut [Source],
) -> Result<tokio::sync::mpsc::Receiver<(usize, Result<pb::StreamEventsResponse>)>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
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
            while let Some(b) = stream.next().await {
                let failed = b.is_err();
                if tx.send((i, b.map_err(anyhow::Error::from))).await.is_err() || failed {
                    break;
                }
            }
        });
    }
    Ok(rx)
}

/// Notes that source `i` streams; once every source does, writes the ready file.
fn note_streaming(sources: &mut [Source], i: usize, request: &TraceRequest) -> Result<()> {
    if sources[i].streaming {
        return Ok(());
    }
    sources[i].streaming = true;
    if let Some(path) = &request.ready_file {
        if sources.iter().all(|s| s.streaming) {
            crate::report::write_file(path, b"streaming\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
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
    fn take(
        &mut self,
        writer: &mut TraceWriter,
        source: &mut Source,
        i: usize,
        events: Vec<pb::CallEvent>,
        dropped: u64,
    ) -> Result<()> {
        writer.lost_by_reader(dropped.saturating_sub(self.lost_by_source[i]));
        self.lost_by_source[i] = dropped;
        let shift = self.reference.offset_ns - source.start_clock.offset_ns;
        for mut e in events {
            let pid = *source.trace_pid.entry(e.pid).or_insert_with(|| {
                if self.taken.insert(e.pid) {
                    e.pid
                } else {
                    self.next_synthetic += 1;
                    self.next_synthetic
                }
            });
            e.pid = pid;
            e.start_ns = e.start_ns.saturating_add_signed(shift);
            writer.call(&e)?;
        }
        Ok(())
    }
}

/// Names the processes of `source` the trace has no name for yet (asking its daemon once
/// per process).
async fn name_new_processes(writer: &mut TraceWriter, source: &mut Source) -> Result<()> {
    let unnamed: BTreeSet<u32> = writer.unnamed().into_iter().collect();
    let new: Vec<u32> = source
        .trace_pid
        .iter()
        .filter(|(pid, shown)| unnamed.contains(shown) && !source.asked.contains(pid))
        .map(|(pid, _)| *pid)
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    source.asked.extend(new);
    let names = process_names(source).await?;
    for (pid, shown) in &source.trace_pid {
        if let Some(p) = names.get(pid).filter(|_| unnamed.contains(shown)) {
            writer.name(
                *shown,
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

/// Names every traced process from its daemon's final profiles, counts what the kernel
/// could not queue, and writes each node's clock offset and error into the trace.
async fn finish_sources(
    writer: &mut TraceWriter,
    sources: &mut [Source],
    took: Duration,
) -> Result<()> {
    let mut ring_full = 0;
    let mut clocks = Vec::new();
    let reference = sources[0].start_clock;
    for (i, source) in sources.iter_mut().enumerate() {
        let (end_clock, _) = estimate_clock(&mut source.client).await?;
        let drift = end_clock.offset_ns.abs_diff(source.start_clock.offset_ns);
        let (offset, error) = if i == 0 {
            (0, 0)
        } else {
            (
                source.start_clock.offset_ns - reference.offset_ns,
                source.start_clock.error_ns + reference.error_ns + drift,
            )
        };
        clocks.push(serde_json::json!({
            "node": source.node,
            "offset_ns": offset,
            "error_ns": error,
            "drift_ns": drift,
        }));
        let profile =
            crate::client::node_snapshot(&mut source.client, pb::ProcessFilter::default()).await?;
        for r in &profile.ranks {
            if let Some(&shown) = source.trace_pid.get(&r.pid) {
                ring_full += r.health.dropped;
                writer.name(
                    shown,
                    ProcessName {
                        rank: r.rank_known.then_some(r.rank),
                        // The daemon's node name (--node-name), as `commtap ps` says it.
                        host: source.node.clone(),
                        job: r.job.clone(),
                    },
                );
            }
        }
    }
    writer.set_ring_buffer_full(ring_full);
    let largest = clocks
        .iter()
        .filter_map(|c| Some((c["node"].as_str()?.to_string(), c["error_ns"].as_u64()?)))
        .max_by_key(|(_, e)| *e);
    writer.set_clocks(
        serde_json::json!({
            "axis": format!("{}'s CLOCK_MONOTONIC", sources[0].node),
            "estimated_over_s": took.as_secs_f64(),
            "nodes": clocks,
        }),
        largest.filter(|_| sources.len() > 1),
    );
    Ok(())
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
