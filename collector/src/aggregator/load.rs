//! `commtap bench-push` (run by `cargo xtask bench --only aggregator-load`): many simulated
//! daemons pushing to a running aggregator over gRPC, each from an address of its own (as
//! nodes do, so the aggregator's per-caller limits apply to each), each pushing every
//! interval the cumulative snapshot of its ranks; the time from each push to the
//! aggregator's answer (the batch merged and durable) is the push latency. With `--nodes`,
//! each pusher is a lower aggregator of a tree relaying that many nodes' ranks.

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Uri};

use super::bench::synthetic_rank;
use crate::api::{
    pb::{self, aggregator_client::AggregatorClient},
    snapshot::{to_wire, ProcessKey, Snapshot},
};

/// What the simulated daemons saw.
#[derive(Debug, Default)]
struct Outcomes {
    /// Push latencies, ns.
    latencies: Vec<u64>,
    /// Pushes refused or failed, by gRPC code.
    errors: std::collections::BTreeMap<String, u64>,
    /// Snapshots the aggregator accepted.
    accepted: u64,
}

/// Runs `daemons` simulated pushers, each of `nodes` nodes of `ranks` ranks (a daemon when
/// `nodes` is 1, a relay otherwise), against the aggregator at `to` for `seconds`, pushing
/// every `every`; prints one line of JSON.
pub async fn run(
    to: SocketAddr,
    daemons: u32,
    nodes: u32,
    ranks: u32,
    seconds: u64,
    every: Duration,
) -> Result<()> {
    super::raise_file_limit();
    let outcomes = Arc::new(std::sync::Mutex::new(Outcomes::default()));
    let until = Instant::now() + Duration::from_secs(seconds);
    let routines: Vec<String> = collector_common::ROUTINES
        .iter()
        .take(16)
        .map(|r| r.name.to_string())
        .collect();
    let routines = Arc::new(routines);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for d in 0..daemons {
        let (outcomes, routines) = (outcomes.clone(), routines.clone());
        // Spread over the interval, as daemons started at different times are.
        let offset = every.mul_f64(f64::from(d) / f64::from(daemons.max(1)));
        tasks.push(tokio::spawn(async move {
            let node = format!("load{daemons}-{d:05}");
            if let Err(e) = daemon(
                d, &node, to, nodes, ranks, &routines, offset, every, until, &outcomes,
            )
            .await
            {
                *outcomes
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .errors
                    .entry(format!("connect: {e:#}").chars().take(80).collect())
                    .or_default() += 1;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let wall = started.elapsed().as_secs_f64();
    let mut o = std::mem::take(
        &mut *outcomes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    o.latencies.sort_unstable();
    let q = |p: f64| {
        o.latencies
            .get(((o.latencies.len() as f64 - 1.0) * p).round() as usize)
            .map_or(0.0, |ns| *ns as f64 / 1e6)
    };
    println!(
        "{{\"daemons\": {daemons}, \"nodes_per_daemon\": {nodes}, \"ranks_per_node\": {ranks}, \"interval_s\": {}, \"seconds\": {wall:.1}, \
         \"pushes\": {}, \"pushes_per_second\": {:.0}, \"snapshots_accepted\": {}, \
         \"latency_ms\": {{\"p50\": {:.1}, \"p90\": {:.1}, \"p99\": {:.1}, \"max\": {:.1}}}, \"errors\": {}}}",
        every.as_secs_f64(),
        o.latencies.len(),
        o.latencies.len() as f64 / wall,
        o.accepted,
        q(0.5),
        q(0.9),
        q(0.99),
        q(1.0),
        serde_json::to_string(&o.errors)?
    );
    Ok(())
}

/// One simulated daemon (or relay of `nodes` nodes): its own source address, a push every
/// `every` until `until`.
#[allow(clippy::too_many_arguments)]
async fn daemon(
    d: u32,
    node: &str,
    to: SocketAddr,
    nodes: u32,
    ranks: u32,
    routines: &[String],
    offset: Duration,
    every: Duration,
    until: Instant,
    outcomes: &std::sync::Mutex<Outcomes>,
) -> Result<()> {
    let local = Ipv4Addr::new(
        127,
        1 + (d / 62_500) as u8,
        ((d / 250) % 250) as u8,
        (d % 250 + 1) as u8,
    );
    let channel = Endpoint::from_shared(format!("http://{to}"))?
        .connect_with_connector(tower::service_fn(move |_: Uri| async move {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(local.into(), 0))?;
            Ok::<_, std::io::Error>(TokioIo::new(socket.connect(to).await?))
        }))
        .await
        .with_context(|| format!("connecting from {local}"))?;
    let mut client = AggregatorClient::new(channel);
    tokio::time::sleep(offset).await;
    let mut tick = tokio::time::interval(every);
    let mut round: u64 = 0;
    while Instant::now() < until {
        tick.tick().await;
        round += 1;
        let processes = (0..nodes)
            .flat_map(|n| (0..ranks).map(move |i| (n, i)))
            .map(|(n, i)| {
                // A relay's nodes: named after it, numbered.
                let node = if nodes == 1 {
                    node.to_string()
                } else {
                    format!("{node}-{n:04}")
                };
                let mut rank =
                    synthetic_rank((d * nodes + n) * ranks + i, 1000 + i, &node, routines, 4);
                rank.job = "load".into();
                // Cumulative: every push carries more calls than the last.
                for r in rank.routines.values_mut() {
                    r.totals.calls *= round;
                }
                to_wire(&Snapshot {
                    key: ProcessKey {
                        node,
                        pid: 1000 + i,
                        start_ticks: 7,
                        boot_id: String::new(),
                    },
                    taken_ns: round,
                    rank,
                })
            })
            .collect();
        // A relay's pushes name no node of their own, and travel in bounded messages.
        let batch = pb::PushSnapshotsRequest {
            processes,
            node: if nodes == 1 {
                node.to_string()
            } else {
                String::new()
            },
            ..Default::default()
        };
        let batch = crate::push::split(batch, crate::api::PUSH_MESSAGE_BYTES);
        let sent = Instant::now();
        let answer = client.push_snapshots(tokio_stream::iter(batch)).await;
        let took = sent.elapsed().as_nanos() as u64;
        let mut o = outcomes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match answer {
            Ok(r) => {
                o.latencies.push(took);
                o.accepted += r.into_inner().accepted;
            }
            Err(s) => *o.errors.entry(format!("{:?}", s.code())).or_default() += 1,
        }
    }
    Ok(())
}
