//! `commtap bench-aggregator` (run by `cargo xtask bench`): how long the aggregator takes to
//! merge the snapshots of a large job, and its peak memory.
//!
//! 100 simulated daemons each push one batch holding 100 ranks; every rank has 50 routines
//! with 32 size buckets (10,000 ranks x 50 x 32). The batches are built and encoded first,
//! as they arrive off the network; the timed part is what the aggregator does per push:
//! decode, check, merge, and persist durably.

use std::time::Instant;

use anyhow::Result;
use prost::Message;

use std::sync::Arc;

use tokio::sync::Mutex;

use super::{commit::GroupCommit, store::Store};
use crate::{
    api::{
        pb,
        snapshot::{to_wire, ProcessKey, Snapshot},
    },
    profile::RankProfile,
    stats::{Health, RoutineStats, SizeBucket, Totals},
};

/// Runs the benchmark and prints one line of JSON.
pub async fn run(
    daemons: u32,
    ranks_per_daemon: u32,
    routines: u32,
    buckets: u8,
    db: &std::path::Path,
) -> Result<()> {
    let wire_batches = encoded_pushes(daemons, ranks_per_daemon, routines, buckets);
    let bytes: usize = wire_batches.iter().map(Vec::len).sum();
    let _ = std::fs::remove_file(db);
    let store = Arc::new(Mutex::new(Store::open(db)?));
    let rss_before = peak_rss_kib();
    let start = Instant::now();
    let (accepted, decode_secs) = merge_pushes(
        wire_batches,
        GroupCommit::start(store.clone(), Default::default()),
    )
    .await?;
    let secs = start.elapsed().as_secs_f64();
    // 1,000 nodes of 8 ranks (GPU nodes): 1 million per-node instance records.
    let (parts, parts_secs) = match_parts(1_000, 8, 1_000);
    let job: u32 = store
        .lock()
        .await
        .jobs()
        .iter()
        .filter(|j| j.job == "bench")
        .map(|j| j.ranks)
        .sum();
    println!(
        "{{\"daemons\": {daemons}, \"ranks\": {}, \"routines\": {routines}, \"buckets\": {buckets}, \"wire_mib\": {:.1}, \
         \"merged\": {accepted}, \"ranks_in_job\": {job}, \"seconds\": {secs:.3}, \"decode_seconds\": {decode_secs:.3}, \"peak_rss_mib\": {:.1}, \
         \"rss_before_mib\": {:.1}, \"skew_parts\": {parts}, \"skew_seconds\": {parts_secs:.3}, \
         \"skew_parts_per_second\": {:.0}}}",
        daemons * ranks_per_daemon,
        bytes as f64 / 1048576.0,
        peak_rss_kib() as f64 / 1024.0,
        rss_before as f64 / 1024.0,
        parts as f64 / parts_secs
    );
    Ok(())
}

/// Each simulated daemon's push, encoded as it arrives off the network.
fn encoded_pushes(daemons: u32, ranks_per_daemon: u32, routines: u32, buckets: u8) -> Vec<Vec<u8>> {
    let routine_names: Vec<String> = collector_common::ROUTINES
        .iter()
        .take(routines as usize)
        .map(|r| r.name.to_string())
        .collect();
    (0..daemons)
        .map(|d| {
            let node = format!("node{d:04}");
            let processes = (0..ranks_per_daemon)
                .map(|i| {
                    let pid = 1000 + i;
                    let rank = synthetic_rank(
                        d * ranks_per_daemon + i,
                        pid,
                        &node,
                        &routine_names,
                        buckets,
                    );
                    to_wire(&Snapshot {
                        key: ProcessKey {
                            node: node.clone(),
                            pid,
                            start_ticks: 7,
                            boot_id: String::new(),
                        },
                        taken_ns: 1,
                        rank,
                    })
                })
                .collect();
            pb::PushSnapshotsRequest {
                processes,
                ..Default::default()
            }
            .encode_to_vec()
        })
        .collect()
}

/// Merges the pushes as the server does: every daemon's push decoded by its own handler
/// task (on the runtime's worker threads), merged by the group-commit task. Returns (ranks
/// accepted, seconds spent decoding, summed over the tasks).
async fn merge_pushes(wire_batches: Vec<Vec<u8>>, commits: GroupCommit) -> Result<(u64, f64)> {
    let pushes: Vec<_> = wire_batches
        .into_iter()
        .map(|encoded| {
            let commits = commits.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let msg = pb::PushSnapshotsRequest::decode(encoded.as_slice())?;
                let decode = t.elapsed().as_secs_f64();
                let (accepted, _) = commits.merge(msg.processes).await?;
                anyhow::Ok((accepted, decode))
            })
        })
        .collect();
    let mut accepted = 0;
    let mut decode_secs = 0.0;
    for p in pushes {
        let (a, d) = p.await??;
        accepted += a;
        decode_secs += d;
    }
    Ok((accepted, decode_secs))
}

/// Who is late across nodes: `daemons` nodes of `ranks` ranks each hand on their part of
/// each of `instances` instances of one world communicator (each node's ranks arrive 1 µs
/// apart, node 0's last rank 1 ms late); the timed part is the aggregator's matching.
/// Returns (parts matched, seconds).
fn match_parts(daemons: u32, ranks: u32, instances: u64) -> (u64, f64) {
    let mut cross = super::skew::CrossSkew::default();
    let mut secs = 0.0;
    let size = daemons * ranks;
    for seq in 0..instances {
        let t0 = 1_000_000_000 + seq * 10_000_000;
        let parts: Vec<pb::InstancePart> = (0..daemons)
            .map(|d| pb::InstancePart {
                numbering_local: false,
                weight: 0,
                job: "bench".into(),
                comm: 1,
                seq,
                routine: "MPI_Allreduce".into(),
                bucket: Some(2),
                size,
                arrivals: (0..ranks)
                    .map(|r| {
                        let late = if d == 0 && r == ranks - 1 {
                            1_000_000
                        } else {
                            0
                        };
                        pb::InstanceArrival {
                            rank: d * ranks + r,
                            host: format!("node{d:04}"),
                            start_ns: t0 + u64::from(r) * 1_000 + late,
                            end_ns: t0 + 2_000_000,
                            root: false,
                        }
                    })
                    .collect(),
            })
            .collect();
        let start = Instant::now();
        cross.add(&parts, 0, 1_000);
        secs += start.elapsed().as_secs_f64();
    }
    let report = cross.report("bench").expect("the bench job");
    assert_eq!(report.instances, instances, "every instance matched");
    (instances * u64::from(daemons), secs)
}

/// A made-up final rank profile with `routines` x `buckets` sizes: for benchmarks and
/// tests of scale, never for a real report.
pub fn synthetic_rank(
    rank: u32,
    pid: u32,
    node: &str,
    routines: &[String],
    buckets: u8,
) -> RankProfile {
    let routines = routines
        .iter()
        .map(|name| {
            let sizes: Vec<SizeBucket> = (0..buckets)
                .map(|b| {
                    let (lo, hi) = collector_common::buckets::bucket_range(b);
                    SizeBucket {
                        bucket: Some(b),
                        min_bytes: Some(lo),
                        max_bytes: Some(hi),
                        totals: Totals {
                            calls: 10 + u64::from(b),
                            bytes: lo * 10,
                            time_ns: 1000,
                        },
                        // Real counters hold a few neighbouring duration buckets.
                        durations: crate::stats::Durations::from_buckets(
                            60,
                            180,
                            (0..3).map(|b| (b, 5)),
                        ),
                        sampled_time: None,
                        device: None,
                    }
                })
                .collect();
            let mut totals = Totals::default();
            let mut durations = None;
            for s in &sizes {
                totals.merge(&s.totals);
                crate::stats::Durations::merge_into(&mut durations, s.durations.as_ref());
            }
            (
                name.clone(),
                RoutineStats {
                    totals,
                    undecoded_calls: 0,
                    durations,
                    sampled_time: None,
                    sizes,
                    comm_sizes: [(64, totals.calls)].into(),
                    communicators: Vec::new(),
                    called_from: Default::default(),
                    endpoints: Default::default(),
                },
            )
        })
        .collect();
    RankProfile {
        rank,
        rank_known: true,
        pid,
        host: node.to_string(),
        job: "bench".into(),
        cmdline: "./app".into(),
        uid: Some(1000),
        container: None,
        region: None,
        probe_call_cost: None,
        usage: None,
        settings: Default::default(),
        call_sites: Vec::new(),
        call_sites_left_out: 0,
        ended: None,
        in_call: None,
        in_call_unknown: false,
        start_ticks: 7,
        exited: true,
        detached: false,
        unwatched_ns: 0,
        world_size: None,
        elapsed_ns: 1,
        comm_time_ns: 1,
        routines,
        health: Health::default(),
        fabrics: Vec::new(),
        mpi_transport: None,
        peers: Vec::new(),
        comm_ranks: Vec::new(),
    }
}

/// Peak resident set size of this process (VmHWM), KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmHWM:")
                    .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
            })
        })
        .unwrap_or(0)
}
