//! `commtap diff`: two profiles of a job side by side (before and after a change: a new
//! MPI or NCCL setting, a plugin, a code change), the figures that moved first.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::units::secs;
use crate::profile::{JobProfile, RankProfile};

/// Rows of each table the text shows (the JSON holds them all).
const SHOWN: usize = 20;

/// One figure before and after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Change {
    /// In the first profile.
    pub before: f64,
    /// In the second.
    pub after: f64,
}

impl Change {
    /// After against before, in percent (None where before is 0).
    pub fn percent(&self) -> Option<f64> {
        (self.before != 0.0).then(|| (self.after - self.before) * 100.0 / self.before)
    }

    /// `-18.0%`, `+3.1%`, `new`, or nothing where both are 0.
    fn said(&self) -> String {
        match self.percent() {
            Some(p) => format!("{p:+.1}%"),
            None if self.after != 0.0 => "new".into(),
            None => String::new(),
        }
    }
}

/// A routine over all ranks, before and after.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RoutineChange {
    /// C name.
    pub routine: String,
    /// Calls.
    pub calls: Change,
    /// Bytes.
    pub bytes: Change,
    /// Time inside it, s.
    pub time_s: Change,
}

/// A rank (by its world rank), before and after.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankChange {
    /// World rank.
    pub rank: u32,
    /// MPI communication time, s.
    pub comm_s: Change,
    /// Elapsed time, s.
    pub elapsed_s: Change,
}

/// An NCCL operation's bus bandwidth at one message size, before and after (device time,
/// all ranks together, as `commtap compare` measures it).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BandwidthChange {
    /// C name (its per-call-config variant, `ncclAllReduceConfig`, counted with it).
    pub operation: String,
    /// Smallest byte count of the size bucket.
    pub min_bytes: u64,
    /// Largest byte count of the size bucket.
    pub max_bytes: u64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: Change,
}

/// Two profiles compared.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Diff {
    /// Ranks in each.
    pub ranks: Change,
    /// The longest rank's elapsed time, s.
    pub elapsed_s: Change,
    /// MPI communication time, all ranks, s.
    pub comm_s: Change,
    /// Time the ranks waited for late ones at collectives, all ranks, s (who is late).
    pub waited_s: Change,
    /// Per routine, the largest change of time first.
    pub routines: Vec<RoutineChange>,
    /// Per world rank present in both, the largest change of communication time first.
    pub by_rank: Vec<RankChange>,
    /// Per NCCL operation and message size whose device time both profiles measured, in
    /// the operation's and the size's order (did a plugin or a setting help?).
    pub nccl_busbw: Vec<BandwidthChange>,
}

/// `before` and `after` compared.
pub fn diff(before: &JobProfile, after: &JobProfile) -> Diff {
    let both = |f: &dyn Fn(&JobProfile) -> f64| Change {
        before: f(before),
        after: f(after),
    };
    let elapsed = |j: &JobProfile| secs(j.ranks.iter().map(|r| r.elapsed_ns).max().unwrap_or(0));
    let comm = |j: &JobProfile| secs(j.ranks.iter().map(|r| r.comm_time_ns).sum());
    let waited = |j: &JobProfile| {
        secs(
            j.skew
                .as_ref()
                .map_or(0, |s| s.ranks.iter().map(|r| r.waited_ns).sum()),
        )
    };
    let mut routines: BTreeMap<&str, RoutineChange> = BTreeMap::new();
    for (side, job) in [(0, before), (1, after)] {
        for r in &job.ranks {
            for (name, s) in &r.routines {
                let e = routines.entry(name).or_insert_with(|| RoutineChange {
                    routine: name.clone(),
                    ..Default::default()
                });
                for (c, v) in [
                    (&mut e.calls, s.totals.calls as f64),
                    (&mut e.bytes, s.totals.bytes as f64),
                    (&mut e.time_s, secs(s.totals.time_ns)),
                ] {
                    *if side == 0 {
                        &mut c.before
                    } else {
                        &mut c.after
                    } += v;
                }
            }
        }
    }
    let mut routines: Vec<RoutineChange> = routines.into_values().collect();
    routines.sort_by(|a, b| moved(&b.time_s).total_cmp(&moved(&a.time_s)));
    let after_ranks = by_rank_of(after);
    let mut by_rank: Vec<RankChange> = by_rank_of(before)
        .into_iter()
        .filter_map(|(rank, b)| {
            let a = after_ranks.get(&rank)?;
            Some(RankChange {
                rank,
                comm_s: Change {
                    before: secs(b.comm_time_ns),
                    after: secs(a.comm_time_ns),
                },
                elapsed_s: Change {
                    before: secs(b.elapsed_ns),
                    after: secs(a.elapsed_ns),
                },
            })
        })
        .collect();
    by_rank.sort_by(|a, b| moved(&b.comm_s).total_cmp(&moved(&a.comm_s)));
    let nccl_busbw = bandwidth_changes(routines.iter().map(|r| r.routine.as_str()), before, after);
    Diff {
        ranks: both(&|j| j.ranks.len() as f64),
        elapsed_s: both(&elapsed),
        comm_s: both(&comm),
        waited_s: both(&waited),
        routines,
        by_rank,
        nccl_busbw,
    }
}

/// The bus bandwidth of each operation among `names` at each size both profiles measured
/// device time of: only those say how fast the data moved (an enqueue time does not).
fn bandwidth_changes<'a>(
    names: impl Iterator<Item = &'a str>,
    before: &JobProfile,
    after: &JobProfile,
) -> Vec<BandwidthChange> {
    let ops: std::collections::BTreeSet<&str> = names
        .map(|n| n.strip_suffix("Config").unwrap_or(n))
        .filter(|n| n.starts_with("nccl"))
        .collect();
    let mut changes = Vec::new();
    for op in ops {
        let (b, a) = (
            crate::compare::profile_curve(before, op),
            crate::compare::profile_curve(after, op),
        );
        for (bucket, before) in &b {
            let Some(after) = a.get(bucket) else {
                continue;
            };
            let (min_bytes, max_bytes) = collector_common::buckets::bucket_range(*bucket);
            changes.push(BandwidthChange {
                operation: op.to_string(),
                min_bytes,
                max_bytes,
                busbw_gbps: Change {
                    before: *before,
                    after: *after,
                },
            });
        }
    }
    changes
}

/// A profile's ranks by world rank.
fn by_rank_of(j: &JobProfile) -> BTreeMap<u32, &RankProfile> {
    j.ranks.iter().map(|r| (r.rank, r)).collect()
}

/// How far a figure moved, either way.
fn moved(c: &Change) -> f64 {
    (c.after - c.before).abs()
}

/// The comparison as text: the job's figures, then the routines and the ranks that moved
/// most.
pub fn render_text(d: &Diff, (before, after): (&str, &str)) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "before: {before}");
    let _ = writeln!(o, "after:  {after}");
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<40}{:>14}{:>14}{:>10}",
        "", "before", "after", "change"
    );
    for (what, c, digits) in [
        ("ranks", d.ranks, 0),
        ("elapsed, longest rank (s)", d.elapsed_s, 3),
        ("MPI communication, all ranks (s)", d.comm_s, 3),
        ("waited for late ranks, all ranks (s)", d.waited_s, 3),
    ] {
        let _ = writeln!(
            o,
            "{what:<40}{:>14.digits$}{:>14.digits$}{:>10}",
            c.before,
            c.after,
            c.said()
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "Routines, all ranks (the largest change of time first):");
    let _ = writeln!(
        o,
        "{:<28}{:>12}{:>12}{:>16}{:>16}{:>12}{:>12}{:>10}",
        "routine", "calls", "calls", "bytes", "bytes", "time(sec)", "time(sec)", "change"
    );
    for r in d.routines.iter().take(SHOWN) {
        let _ = writeln!(
            o,
            "{:<28}{:>12}{:>12}{:>16}{:>16}{:>12.3}{:>12.3}{:>10}",
            r.routine,
            r.calls.before,
            r.calls.after,
            r.bytes.before,
            r.bytes.after,
            r.time_s.before,
            r.time_s.after,
            r.time_s.said()
        );
    }
    more(&mut o, d.routines.len(), "routines");
    if !d.by_rank.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Ranks in both (the largest change of communication time first):"
        );
        let _ = writeln!(
            o,
            "{:>8}{:>12}{:>12}{:>10}{:>14}{:>14}",
            "rank", "comm(s)", "comm(s)", "change", "elapsed(s)", "elapsed(s)"
        );
        for r in d.by_rank.iter().take(SHOWN) {
            let _ = writeln!(
                o,
                "{:>8}{:>12.3}{:>12.3}{:>10}{:>14.3}{:>14.3}",
                r.rank,
                r.comm_s.before,
                r.comm_s.after,
                r.comm_s.said(),
                r.elapsed_s.before,
                r.elapsed_s.after
            );
        }
        more(&mut o, d.by_rank.len(), "ranks");
    }
    if !d.nccl_busbw.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "NCCL bus bandwidth, all ranks (device time; sizes both profiles measured):"
        );
        let _ = writeln!(
            o,
            "{:<24}{:>26}{:>14}{:>14}{:>10}",
            "operation", "message size (bytes)", "busbw(GB/s)", "busbw(GB/s)", "change"
        );
        for c in &d.nccl_busbw {
            let size = collector_common::buckets::RangeLabel {
                lo: c.min_bytes,
                hi: c.max_bytes,
            }
            .to_string();
            let _ = writeln!(
                o,
                "{:<24}{size:>26}{:>14.2}{:>14.2}{:>10}",
                c.operation,
                c.busbw_gbps.before,
                c.busbw_gbps.after,
                c.busbw_gbps.said()
            );
        }
    }
    o
}

/// The line that says how many rows the text left out.
fn more(o: &mut String, n: usize, what: &str) {
    if n > SHOWN {
        let _ = writeln!(o, "... {} more {what} (--format json shows all)", n - SHOWN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank of `calls` 8-byte Allreduces taking `ms` each, in a job of `elapsed_ms`.
    fn rank(rank: u32, calls: u64, ms: u64, elapsed_ms: u64) -> RankProfile {
        let mut r: RankProfile = serde_json::from_value(serde_json::json!({
            "rank": rank, "rank_known": true, "pid": 100 + rank, "host": "n1", "job": "7",
            "cmdline": "./app", "start_ticks": 1, "elapsed_ns": elapsed_ms * 1_000_000,
            "comm_time_ns": calls * ms * 1_000_000, "routines": {},
        }))
        .expect("a rank profile");
        r.routines.insert(
            "MPI_Allreduce".into(),
            crate::stats::RoutineStats {
                totals: crate::stats::Totals {
                    calls,
                    bytes: calls * 8,
                    time_ns: calls * ms * 1_000_000,
                },
                ..Default::default()
            },
        );
        r
    }

    #[test]
    fn two_runs_of_a_job_are_compared_figure_by_figure() {
        let before = JobProfile::of_ranks(vec![rank(0, 100, 2, 1000), rank(1, 100, 4, 1000)]);
        let after = JobProfile::of_ranks(vec![rank(0, 100, 1, 800), rank(1, 100, 1, 900)]);
        let d = diff(&before, &after);
        assert_eq!(
            d.ranks,
            Change {
                before: 2.0,
                after: 2.0
            }
        );
        assert_eq!(
            d.elapsed_s,
            Change {
                before: 1.0,
                after: 0.9
            }
        );
        assert_eq!(
            d.comm_s,
            Change {
                before: 0.6,
                after: 0.2
            }
        );
        assert_eq!(d.routines.len(), 1);
        let r = &d.routines[0];
        assert_eq!(
            r.calls,
            Change {
                before: 200.0,
                after: 200.0
            }
        );
        assert_eq!(
            r.bytes,
            Change {
                before: 1600.0,
                after: 1600.0
            }
        );
        assert_eq!(r.time_s.said(), "-66.7%");
        // Rank 1 moved most (0.4 s to 0.1 s), then rank 0 (0.2 s to 0.1 s).
        let ranks: Vec<u32> = d.by_rank.iter().map(|r| r.rank).collect();
        assert_eq!(ranks, [1, 0]);
        assert_eq!(d.by_rank[0].comm_s.said(), "-75.0%");
        let text = render_text(&d, ("a.json", "b.json"));
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with("MPI_Allreduce"))
            .expect("a routine row")
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            [
                "MPI_Allreduce",
                "200",
                "200",
                "1600",
                "1600",
                "0.600",
                "0.200",
                "-66.7%"
            ]
        );
        // A routine only one side called.
        assert_eq!(
            Change {
                before: 0.0,
                after: 3.0
            }
            .said(),
            "new"
        );
    }

    /// A rank of `calls` AllReduces of 1 MiB whose device windows took `us` each, on a
    /// communicator of 2 (bus factor 1).
    fn nccl_rank(rank: u32, calls: u64, us: u64) -> RankProfile {
        let mut r = self::rank(rank, 0, 0, 1000);
        r.routines.clear();
        let bytes = 1 << 20;
        let bucket = collector_common::buckets::size_bucket(bytes);
        r.routines.insert(
            "ncclAllReduce".into(),
            crate::stats::RoutineStats {
                sizes: vec![crate::stats::SizeBucket {
                    bucket: Some(bucket),
                    device: Some(crate::stats::DeviceTime {
                        calls,
                        bytes: calls * bytes,
                        time_ns: calls * us * 1000,
                        bus_bytes: Some(calls * bytes),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        r
    }

    #[test]
    fn nccl_bus_bandwidth_is_compared_where_both_measured_device_time() {
        // 1 MiB in 100 us is 10.49 GB/s; in 50 us, 20.97.
        let before = JobProfile::of_ranks(vec![nccl_rank(0, 10, 100), nccl_rank(1, 10, 100)]);
        let after = JobProfile::of_ranks(vec![nccl_rank(0, 10, 50), nccl_rank(1, 10, 50)]);
        let d = diff(&before, &after);
        assert_eq!(d.nccl_busbw.len(), 1, "{:?}", d.nccl_busbw);
        let c = &d.nccl_busbw[0];
        assert_eq!(c.operation, "ncclAllReduce");
        assert_eq!((c.min_bytes, c.max_bytes), (524_289, 1_048_576));
        assert!((c.busbw_gbps.before - 10.485_76).abs() < 1e-9, "{c:?}");
        assert!((c.busbw_gbps.after - 20.971_52).abs() < 1e-9, "{c:?}");
        assert_eq!(c.busbw_gbps.said(), "+100.0%");
        let text = render_text(&d, ("a.json", "b.json"));
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.contains("524289-1048576"))
            .expect("a bandwidth row")
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            [
                "ncclAllReduce",
                "524289-1048576",
                "10.49",
                "20.97",
                "+100.0%"
            ]
        );
        // A profile without device time (enqueue times only) compares no bandwidth.
        let enqueued = JobProfile::of_ranks(vec![rank(0, 10, 1, 1000)]);
        assert!(diff(&before, &enqueued).nccl_busbw.is_empty());
    }
}
