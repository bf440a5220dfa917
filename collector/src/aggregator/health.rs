//! The aggregator's own health, as its `/metrics` endpoint shows it: what pushes brought,
//! how long commits take, what the store holds.

use std::{
    fmt::Write as _,
    net::IpAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use tokio::sync::Mutex;

use super::store::Store;
use crate::{
    api::limit::StreamLimit,
    serve::metrics::{Caller, Exporter},
};

/// Counters the service and the commit task add to.
#[derive(Debug, Default)]
pub struct Health {
    /// Snapshots merged (new, or newer than the one kept).
    pub accepted: AtomicU64,
    /// Snapshots older than the one kept (retransmissions).
    pub stale: AtomicU64,
    /// Snapshots refused: stamped later than their node's clock can read.
    pub refused: AtomicU64,
    /// Durable commits, and the time they took.
    pub commits: AtomicU64,
    /// Nanoseconds spent merging and committing.
    pub commit_ns: AtomicU64,
}

impl Health {
    /// Counts one commit of `ns`.
    pub fn committed(&self, ns: u64) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.commit_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// The aggregator's `/metrics`.
pub struct AggregatorExporter {
    /// The counters.
    pub health: Arc<Health>,
    /// The store (jobs, ranks).
    pub store: Arc<Mutex<Store>>,
    /// Its database file (size).
    pub db: PathBuf,
    /// Open push streams.
    pub pushes: StreamLimit<Option<IpAddr>>,
}

impl Exporter for AggregatorExporter {
    async fn exposition(&self, _caller: Caller) -> String {
        let (jobs, ranks) = self.store.lock().await.counts();
        let db_bytes = std::fs::metadata(&self.db).map_or(0, |m| m.len());
        let h = &self.health;
        let mut o = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: &[(&str, u64)]| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in lines {
                let _ = writeln!(o, "{name}{labels} {v}");
            }
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        metric(
            "commtap_aggregator_snapshots_total",
            "counter",
            "Process snapshots pushed, by what became of them.",
            &[
                ("{outcome=\"accepted\"}", load(&h.accepted)),
                ("{outcome=\"stale\"}", load(&h.stale)),
                ("{outcome=\"refused\"}", load(&h.refused)),
            ],
        );
        metric(
            "commtap_aggregator_commits_total",
            "counter",
            "Durable commits of pushed snapshots (pushes arriving together share one).",
            &[("", load(&h.commits))],
        );
        metric(
            "commtap_aggregator_push_streams",
            "gauge",
            "Push streams open (daemons and lower aggregators connected).",
            &[("", self.pushes.open() as u64)],
        );
        metric(
            "commtap_aggregator_jobs",
            "gauge",
            "Jobs held.",
            &[("", jobs as u64)],
        );
        metric(
            "commtap_aggregator_ranks",
            "gauge",
            "Ranks (processes) held, every job.",
            &[("", ranks as u64)],
        );
        metric(
            "commtap_aggregator_database_bytes",
            "gauge",
            "Size of the database file.",
            &[("", db_bytes)],
        );
        let _ = writeln!(
            o,
            "# HELP commtap_aggregator_commit_seconds_total Time spent merging and committing.\n\
             # TYPE commtap_aggregator_commit_seconds_total counter\n\
             commtap_aggregator_commit_seconds_total {}",
            load(&h.commit_ns) as f64 / 1e9
        );
        o
    }
}
