//! `commtap diff`: two profiles of a job side by side (before and after a change: a new
//! MPI or NCCL setting, a plugin, a code change), the figures that moved first.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::units::secs;
use crate::profile::{JobProfile, RankProfile};

/// Rows of each table the text shows (the JSON holds them all).
const SHOWN: usize = 20;

/// One figure before and after (in JSON, a count is written as an integer).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Change {
    /// In the first profile.
    pub before: f64,
    /// In the second.
    pub after: f64,
}

impl Serialize for Change {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        /// A whole number as an integer: calls, bytes and ranks are counts.
        struct Figure(f64);
        impl Serialize for Figure {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                // Below 2^53 an f64 holds every integer exactly.
                if self.0.fract() == 0.0 && (0.0..9.0e15).contains(&self.0) {
                    s.serialize_u64(self.0 as u64)
                } else {
                    s.serialize_f64(self.0)
                }
            }
        }
        let mut st = s.serialize_struct("Change", 2)?;
        st.serialize_field("before", &Figure(self.before))?;
        st.serialize_field("after", &Figure(self.after))?;
        st.end()
    }
}

impl Change {
    /// After against before, in percent (None where before is 0).
    pub fn percent(&self) -> Option<f64> {
        (self.before != 0.0).then(|| (self.after - self.before) * 100.0 / self.before)
    }

    /// Whether both are 0.
    fn is_zero(&self) -> bool {
        self.before == 0.0 && self.after == 0.0
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

/// Calls of a routine from one function (a call site by its function: its offset moves
/// between builds), all ranks, before and after.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SiteChange {
    /// C name of the routine called.
    pub routine: String,
    /// Where from: `function (file)` ([`CallSite::function_label`](crate::profile::CallSite::function_label)).
    pub site: String,
    /// Calls.
    pub calls: Change,
    /// Bytes.
    pub bytes: Change,
    /// Time inside the calls, s (estimated from the timed calls where sampled).
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

/// A communication setting (`NCCL_ALGO`, `FI_PROVIDER` ...) set otherwise after than
/// before: its value on every rank, [`SET_DIFFERENTLY`] where the ranks differ, `None`
/// where no rank had it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SettingChange {
    /// The variable.
    pub name: String,
    /// In the first profile.
    pub before: Option<String>,
    /// In the second.
    pub after: Option<String>,
}

/// A setting's value where the ranks of a profile had it set differently.
pub const SET_DIFFERENTLY: &str = "(set differently across ranks)";

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
    /// World ranks in the first profile only.
    pub ranks_only_before: Vec<u32>,
    /// World ranks in the second profile only.
    pub ranks_only_after: Vec<u32>,
    /// The communication settings set otherwise, by name.
    pub settings: Vec<SettingChange>,
    /// The lowest rank's command line in each, where their programs differ (two
    /// different jobs compared: said, not refused).
    pub programs_differ: Option<(String, String)>,
    /// Per NCCL operation and message size whose device time both profiles measured, in
    /// the operation's and the size's order (did a plugin or a setting help?).
    pub nccl_busbw: Vec<BandwidthChange>,
    /// Per routine and calling function, where both profiles counted call sites
    /// (`--call-sites`), the largest change of time first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteChange>,
    /// The one profile that counted call sites (`before` or `after`), where only one did:
    /// no sites are compared.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_sites_only: Option<&'static str>,
    /// Call sites each profile left out (those with the least time, past its 512 a rank):
    /// a site only the other kept shows as new or gone.
    #[serde(skip_serializing_if = "Change::is_zero")]
    pub call_sites_left_out: Change,
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
    let has_sites = |j: &JobProfile| j.ranks.iter().any(|r| !r.call_sites.is_empty());
    let call_sites_only = match (has_sites(before), has_sites(after)) {
        (true, false) => Some("before"),
        (false, true) => Some("after"),
        _ => None,
    };
    let mut routines: BTreeMap<&str, RoutineChange> = BTreeMap::new();
    let mut sites: BTreeMap<(&str, String), SiteChange> = BTreeMap::new();
    // By source file only where both profiles have the lines of every site they name
    // (else a build with `-g` and one without, or an older profile, would match nothing).
    let all_sites = || {
        [before, after]
            .into_iter()
            .flat_map(|j| j.ranks.iter().flat_map(|r| &r.call_sites))
    };
    let by_source = all_sites().all(|c| c.function.is_none() || c.source_file.is_some());
    for (is_after, job) in [(false, before), (true, after)] {
        for r in &job.ranks {
            for (name, s) in &r.routines {
                let e = routines.entry(name).or_insert_with(|| RoutineChange {
                    routine: name.clone(),
                    ..Default::default()
                });
                add_side(
                    [&mut e.calls, &mut e.bytes, &mut e.time_s],
                    is_after,
                    &s.totals,
                );
            }
            if call_sites_only.is_some() {
                continue;
            }
            for c in &r.call_sites {
                let site = c.function_label(by_source);
                let e = sites
                    .entry((&c.routine, site.clone()))
                    .or_insert_with(|| SiteChange {
                        routine: c.routine.clone(),
                        site,
                        ..Default::default()
                    });
                add_side(
                    [&mut e.calls, &mut e.bytes, &mut e.time_s],
                    is_after,
                    &c.totals,
                );
            }
        }
    }
    let mut routines: Vec<RoutineChange> = routines.into_values().collect();
    routines.sort_by(|a, b| moved(&b.time_s).total_cmp(&moved(&a.time_s)));
    let mut sites: Vec<SiteChange> = sites.into_values().collect();
    sites.sort_by(|a, b| moved(&b.time_s).total_cmp(&moved(&a.time_s)));
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
    let before_ranks = by_rank_of(before);
    let only = |a: &BTreeMap<u32, &RankProfile>, b: &BTreeMap<u32, &RankProfile>| -> Vec<u32> {
        a.keys().filter(|r| !b.contains_key(r)).copied().collect()
    };
    let program = |j: &JobProfile| Some(j.ranks.iter().min_by_key(|r| r.rank)?.cmdline.clone());
    let programs_differ = program(before)
        .zip(program(after))
        .filter(|(b, a)| b.split_whitespace().next() != a.split_whitespace().next());
    Diff {
        ranks_only_before: only(&before_ranks, &after_ranks),
        ranks_only_after: only(&after_ranks, &before_ranks),
        settings: setting_changes(before, after),
        programs_differ,
        ranks: both(&|j| j.ranks.len() as f64),
        elapsed_s: both(&elapsed),
        comm_s: both(&comm),
        waited_s: both(&waited),
        routines,
        by_rank,
        nccl_busbw,
        sites,
        call_sites_only,
        call_sites_left_out: both(&|j| j.ranks.iter().map(|r| r.call_sites_left_out as f64).sum()),
    }
}

/// Adds `t` (calls, bytes, time) to the `after` or the before side of three figures.
fn add_side(figures: [&mut Change; 3], after: bool, t: &crate::stats::Totals) {
    let values = [t.calls as f64, t.bytes as f64, secs(t.time_ns)];
    for (c, v) in figures.into_iter().zip(values) {
        *if after { &mut c.after } else { &mut c.before } += v;
    }
}

/// The settings set otherwise in `after` than in `before`, by name.
fn setting_changes(before: &JobProfile, after: &JobProfile) -> Vec<SettingChange> {
    let values = |j: &JobProfile| -> BTreeMap<String, String> {
        let (alike, differing) = j.settings_alike_and_not();
        alike
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain(
                differing
                    .into_iter()
                    .map(|k| (k.to_string(), SET_DIFFERENTLY.to_string())),
            )
            .collect()
    };
    let (b, a) = (values(before), values(after));
    let names: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
    names
        .into_iter()
        .filter(|n| b.get(*n) != a.get(*n))
        .map(|n| SettingChange {
            name: n.clone(),
            before: b.get(n).cloned(),
            after: a.get(n).cloned(),
        })
        .collect()
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
    if let Some((b, a)) = &d.programs_differ {
        let _ = writeln!(
            o,
            "note: the two profiles are of different programs ({} / {})",
            crate::client::printable(b),
            crate::client::printable(a)
        );
    }
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
    if !d.settings.is_empty() {
        let _ = writeln!(o, "Settings set otherwise (each rank's environment):");
        for c in &d.settings {
            let shown = |v: &Option<String>| {
                v.as_deref()
                    .map_or_else(|| "(not set)".to_string(), crate::client::printable)
            };
            let _ = writeln!(
                o,
                "  {}: {} -> {}",
                crate::client::printable(&c.name),
                shown(&c.before),
                shown(&c.after)
            );
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(
        o,
        "Routines, all ranks (the largest change of time, in seconds, first):"
    );
    let _ = writeln!(
        o,
        "{:<28}{:>12}{:>12}{:>16}{:>16}{:>12}{:>12}{:>10}",
        "routine", "calls", "", "bytes", "", "time(s)", "", "change"
    );
    let _ = writeln!(
        o,
        "{:<28}{:>12}{:>12}{:>16}{:>16}{:>12}{:>12}",
        "", "before", "after", "before", "after", "before", "after"
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
            "rank", "comm(s)", "", "change", "elapsed(s)", ""
        );
        let _ = writeln!(
            o,
            "{:>8}{:>12}{:>12}{:>10}{:>14}{:>14}",
            "", "before", "after", "", "before", "after"
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
    for (side, ranks) in [
        ("before", &d.ranks_only_before),
        ("after", &d.ranks_only_after),
    ] {
        if !ranks.is_empty() {
            let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
            let _ = writeln!(o, "Ranks only {side}: {}", list.join(", "));
        }
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
            "operation", "message size (bytes)", "busbw(GB/s)", "", "change"
        );
        let _ = writeln!(o, "{:<24}{:>26}{:>14}{:>14}", "", "", "before", "after");
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
    render_sites(&mut o, d);
    o
}

/// The call sites' table of `d`, or why there is none where one profile has sites.
fn render_sites(o: &mut String, d: &Diff) {
    if let Some(side) = d.call_sites_only {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Call sites: only the profile {side} counted them (record both with --call-sites to compare them)."
        );
        return;
    }
    if d.sites.is_empty() {
        return;
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Call sites, all ranks, by calling function (the largest change of time first):"
    );
    let _ = writeln!(
        o,
        "{:<28}{:>12}{:>12}{:>12}{:>12}{:>12}{:>12}{:>10}   call site",
        "routine", "calls", "", "avg. bytes", "", "time(s)", "", "change"
    );
    let _ = writeln!(
        o,
        "{:<28}{:>12}{:>12}{:>12}{:>12}{:>12}{:>12}",
        "", "before", "after", "before", "after", "before", "after"
    );
    // A side without calls has no average: "-", not the 0.0 of zero-byte calls.
    let avg = |bytes: f64, calls: f64| {
        if calls > 0.0 {
            format!("{:.1}", bytes / calls)
        } else {
            "-".to_string()
        }
    };
    for s in d.sites.iter().take(SHOWN) {
        let _ = writeln!(
            o,
            "{:<28}{:>12}{:>12}{:>12}{:>12}{:>12.3}{:>12.3}{:>10}   {}",
            s.routine,
            s.calls.before,
            s.calls.after,
            avg(s.bytes.before, s.calls.before),
            avg(s.bytes.after, s.calls.after),
            s.time_s.before,
            s.time_s.after,
            s.time_s.said(),
            s.site
        );
    }
    more(o, d.sites.len(), "call sites");
    let Change { before, after } = d.call_sites_left_out;
    if !d.call_sites_left_out.is_zero() {
        let _ = writeln!(
            o,
            "({before} call sites before and {after} after were left out of the profiles, those with the least time: a site only one kept shows as new or gone)"
        );
    }
}

/// The line that says how many rows the text left out.
fn more(o: &mut String, n: usize, what: &str) {
    match n.saturating_sub(SHOWN) {
        0 => {}
        // `what` is plural: one more is one.
        1 => {
            let one = what.strip_suffix('s').unwrap_or(what);
            let _ = writeln!(o, "... 1 more {one} (--format json shows all)");
        }
        left => {
            let _ = writeln!(o, "... {left} more {what} (--format json shows all)");
        }
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
        // The job's settings, a rank only after, another program.
        let (mut before, mut after) = (before, after);
        let mut third = rank(2, 100, 1, 900);
        third.cmdline = "./other".into();
        after.ranks.insert(0, third);
        for (j, algo) in [(&mut before.ranks, "Ring"), (&mut after.ranks, "Tree")] {
            for r in j.iter_mut() {
                r.settings.insert("NCCL_ALGO".into(), algo.into());
            }
        }
        after.ranks[1]
            .settings
            .insert("FI_PROVIDER".into(), "tcp".into());
        let d = diff(&before, &after);
        assert_eq!(d.ranks_only_after, vec![2]);
        assert!(d.ranks_only_before.is_empty());
        assert_eq!(
            d.settings,
            vec![
                SettingChange {
                    name: "FI_PROVIDER".into(),
                    before: None,
                    after: Some(SET_DIFFERENTLY.into()),
                },
                SettingChange {
                    name: "NCCL_ALGO".into(),
                    before: Some("Ring".into()),
                    after: Some("Tree".into()),
                },
            ]
        );
        assert_eq!(d.programs_differ, None, "rank 0's program is the same");
        let text = render_text(&d, ("a.json", "b.json"));
        assert!(text.contains("  NCCL_ALGO: Ring -> Tree\n"), "{text}");
        assert!(text.contains("Ranks only after: 2\n"), "{text}");
        // Counts are integers in JSON, seconds not.
        let json = serde_json::to_value(&d).expect("JSON");
        assert_eq!(json["ranks"]["after"], serde_json::json!(3));
        assert!(json["ranks"]["after"].is_u64());
        assert!(json["elapsed_s"]["after"].is_f64());
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

    /// Each compared site's label and calls before and after.
    fn site_rows(d: &Diff) -> Vec<(&str, f64, f64)> {
        d.sites
            .iter()
            .map(|s| (s.site.as_str(), s.calls.before, s.calls.after))
            .collect()
    }

    /// `calls` Allreduces of 8 bytes taking `ms` each, made from `function+offset` of
    /// `/bin/app`.
    fn site(function: &str, offset: u64, calls: u64, ms: u64) -> crate::profile::CallSite {
        crate::profile::CallSite {
            routine: "MPI_Allreduce".into(),
            address: format!("{:#x}", 0x40_0000 + offset),
            object: Some("/bin/app".into()),
            function: Some(function.into()),
            offset,
            file_address: Some(format!("{offset:#x}")),
            totals: crate::stats::Totals {
                calls,
                bytes: calls * 8,
                time_ns: calls * ms * 1_000_000,
            },
            timed_calls: calls,
            source_file: None,
            source_line: None,
        }
    }

    /// Two builds of one program, named apart (`heat.O0`, `heat.O2`), with line tables: a
    /// site is its function in its source file, whatever the executable is called.
    #[test]
    fn call_sites_of_builds_named_apart_are_compared_by_their_source_file() {
        let in_build = |object: &str, calls| crate::profile::CallSite {
            object: Some(object.into()),
            function: Some("halo::exchange".into()),
            source_file: Some("/src/heat.F90".into()),
            source_line: Some(42),
            ..site("halo::exchange", 0x40, calls, 1)
        };
        let (mut b, mut a) = (rank(0, 300, 1, 1000), rank(0, 300, 1, 1000));
        b.call_sites = vec![in_build("/bin/heat.O0", 100)];
        a.call_sites = vec![in_build("/bin/heat.O2", 120)];
        let d = diff(
            &JobProfile::of_ranks(vec![b]),
            &JobProfile::of_ranks(vec![a]),
        );
        let rows = site_rows(&d);
        assert_eq!(rows, [("halo::exchange (heat.F90)", 100.0, 120.0)]);
    }

    /// A build with line tables against one without (or a profile older than source
    /// lines): sites matched by function and object, as where neither has lines.
    #[test]
    fn call_sites_without_lines_on_one_side_are_compared_by_their_object() {
        let mut b = rank(0, 300, 1, 1000);
        let mut a = rank(0, 300, 1, 1000);
        b.call_sites = vec![site("negotiate()", 0x51, 100, 1)];
        a.call_sites = vec![crate::profile::CallSite {
            source_file: Some("/src/app.c".into()),
            source_line: Some(51),
            ..site("negotiate()", 0x5d, 300, 1)
        }];
        let d = diff(
            &JobProfile::of_ranks(vec![b]),
            &JobProfile::of_ranks(vec![a]),
        );
        let rows = site_rows(&d);
        assert_eq!(rows, [("negotiate() (app)", 100.0, 300.0)]);
    }

    #[test]
    fn call_sites_are_compared_by_their_function() {
        let (mut b0, mut b1, mut a0, mut a1) = (
            rank(0, 300, 1, 1000),
            rank(1, 300, 1, 1000),
            rank(0, 500, 1, 1000),
            rank(1, 500, 1, 1000),
        );
        // Before: 100 calls a rank from negotiate, 200 from reduce. After, a new build
        // (negotiate's call moved from +0x51 to +0x5d): 300 and 200 from negotiate, reduce
        // the same, and 100 from a function rank 1 had not called from before.
        for r in [&mut b0, &mut b1] {
            r.call_sites = vec![
                site("reduce(long)", 0x40, 200, 1),
                site("negotiate()", 0x51, 100, 1),
            ];
        }
        a0.call_sites = vec![
            site("negotiate()", 0x5d, 300, 1),
            site("reduce(long)", 0x40, 200, 1),
        ];
        a1.call_sites = vec![
            site("negotiate()", 0x5d, 200, 1),
            site("reduce(long)", 0x40, 200, 1),
            site("checkpoint()", 0x10, 100, 1),
        ];
        // Rank 1 had more sites than its profile kept.
        b1.call_sites_left_out = 7;
        let before = JobProfile::of_ranks(vec![b0, b1]);
        let after = JobProfile::of_ranks(vec![a0, a1]);
        let d = diff(&before, &after);
        assert_eq!(d.call_sites_only, None);
        assert_eq!(
            d.call_sites_left_out,
            Change {
                before: 7.0,
                after: 0.0
            }
        );
        let rows = site_rows(&d);
        // The largest change of time first: negotiate 0.2 s to 0.5 s, checkpoint new
        // (0.1 s), reduce unchanged.
        assert_eq!(
            rows,
            [
                ("negotiate() (app)", 200.0, 500.0),
                ("checkpoint() (app)", 0.0, 100.0),
                ("reduce(long) (app)", 400.0, 400.0),
            ]
        );
        assert_eq!(
            d.sites[0].bytes,
            Change {
                before: 1600.0,
                after: 4000.0
            }
        );
        assert_eq!(d.sites[0].time_s.said(), "+150.0%");
        let text = render_text(&d, ("b.json", "a.json"));
        assert!(
            text.contains(&format!(
                "{:<28}{:>12}{:>12}{:>12.1}{:>12.1}",
                "MPI_Allreduce", 200, 500, 8.0, 8.0
            )),
            "{text}"
        );
        let text = render_text(&d, ("a.json", "b.json"));
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.contains("negotiate() (app)"))
            .expect("a site row")
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            [
                "MPI_Allreduce",
                "200",
                "500",
                "8.0",
                "8.0",
                "0.200",
                "0.500",
                "+150.0%",
                "negotiate()",
                "(app)"
            ]
        );
        assert!(text.contains("checkpoint() (app)"), "{text}");
        assert!(
            text.contains("(7 call sites before and 0 after were left out"),
            "{text}"
        );
        // One profile without call sites: nothing compared, and said why.
        let plain = JobProfile::of_ranks(vec![rank(0, 300, 1, 1000)]);
        let d = diff(&plain, &after);
        assert!(d.sites.is_empty());
        assert_eq!(d.call_sites_only, Some("after"));
        let text = render_text(&d, ("a.json", "b.json"));
        assert!(
            text.contains("Call sites: only the profile after counted them"),
            "{text}"
        );
        let json = serde_json::to_value(&d).expect("JSON");
        assert_eq!(json["call_sites_only"], "after");
        assert!(json.get("sites").is_none(), "{json}");
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
