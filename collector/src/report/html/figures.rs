//! The report's figures, each made from the profile alone: which categories and series a
//! question needs (sizes per routine, ranks, buckets), drawn by `charts`.

use std::{collections::BTreeMap, fmt::Write as _};

use collector_common::{durations::duration_range, routines::Family};

use super::{
    charts::{BarChart, HeatMap, Layout, Series, BLUE, GREY, ORANGE, PALETTE, VERMILLION},
    escape, Expected,
};
use crate::{
    compare,
    profile::{JobProfile, RankProfile},
    report::mpitrace::net_transport,
    report::units::{secs, Unit},
    stats::{table_order, Routines},
};

/// Bars (ranks or rank ranges) at most in a per-rank chart.
const RANK_BARS: usize = 256;
/// Rows and columns at most in the peer heat map: past it, ranges of ranks.
const HEAT_CELLS: usize = 64;

/// `n` bytes in binary units, short: `512`, `2K`, `64M`, `2G`.
fn binary(n: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// A size bucket as a chart labels it: its largest size (`≤2K`), `undecoded` for none.
fn size_label(bucket: Option<u8>) -> String {
    match bucket.map(collector_common::buckets::bucket_range) {
        None => "undecoded".into(),
        Some((0, 0)) => "0".into(),
        Some((lo, u64::MAX)) => format!(">{}", binary(lo - 1)),
        Some((_, hi)) => format!("≤{}", binary(hi)),
    }
}

const SIZE_AXIS: &str = "message size, bytes (each bucket's largest; K = 1024)";

/// The routines whose calls carry bytes, in the routine table's order.
fn with_bytes(routines: &Routines) -> Vec<(&String, &crate::stats::RoutineStats)> {
    [Family::Mpi, Family::Nccl, Family::Fabric]
        .into_iter()
        .flat_map(|f| table_order(routines, f))
        .filter(|(_, s)| s.totals.bytes > 0 || s.undecoded_calls > 0)
        .collect()
}

/// Per routine with bytes: calls and time per size bucket.
pub fn sizes(routines: &Routines) -> String {
    let mut o = String::new();
    for (name, s) in with_bytes(routines) {
        let buckets: Vec<_> = s.sizes.iter().filter(|b| b.totals.calls > 0).collect();
        let categories: Vec<String> = buckets.iter().map(|b| size_label(b.bucket)).collect();
        o.push_str("<div class=\"pair\">");
        for (what, unit, colour, value) in [
            (
                "calls",
                Unit::Count,
                BLUE,
                (|b: &crate::stats::SizeBucket| b.totals.calls as f64) as fn(&_) -> f64,
            ),
            ("time", Unit::Seconds, ORANGE, |b| secs(b.totals.time_ns)),
        ] {
            let mut c = BarChart::new(
                &format!("sizes-{name}-{what}"),
                &format!("{name}: {what} per message size"),
                SIZE_AXIS,
                what,
                unit,
            );
            c.categories.clone_from(&categories);
            c.series.push(Series {
                name: format!("{what}, all ranks"),
                colour,
                values: buckets.iter().map(|b| Some(value(b))).collect(),
            });
            o.push_str(&c.render());
        }
        o.push_str("</div>\n");
    }
    o
}

/// Contiguous groups of at most `max` items: (first index, last index) of each.
fn groups(n: usize, max: usize) -> Vec<(usize, usize)> {
    let size = n.div_ceil(max).max(1);
    (0..n)
        .step_by(size)
        .map(|a| (a, (a + size).min(n) - 1))
        .collect()
}

/// Per rank (past [`RANK_BARS`] ranks, per range of ranks: its largest): communication
/// time in front of elapsed time, the minimum, median and maximum ranks marked.
pub fn ranks(job: &JobProfile) -> String {
    let Some(summary) = job.comm_summary() else {
        return String::new();
    };
    let bars = RankGroups::new(job, RANK_BARS);
    let mut c = BarChart::new(
        "ranks-comm",
        "MPI communication time within elapsed time, per rank",
        if bars.single() {
            "rank"
        } else {
            "ranks (each bar: the range's largest)"
        },
        "time",
        Unit::Seconds,
    );
    c.layout = Layout::Overlaid;
    c.log_above_ratio = 0.0;
    c.categories = bars.labels();
    let mut elapsed = Vec::new();
    let mut comm = Vec::new();
    for gi in 0..c.categories.len() {
        let part = bars.ranks(gi);
        elapsed.push(Some(secs(
            part.iter().map(|r| r.elapsed_ns).max().unwrap_or(0),
        )));
        comm.push(Some(secs(
            part.iter().map(|r| r.comm_time_ns).max().unwrap_or(0),
        )));
        if job.ranks.len() > 1 {
            let mut words = Vec::new();
            for (word, r) in [
                ("min", summary.min),
                ("median", summary.median),
                ("max", summary.max),
            ] {
                if part.iter().any(|p| p.pid == r.pid && p.host == r.host) {
                    words.push(word);
                }
            }
            if !words.is_empty() {
                c.marks.push((gi, words.join("/")));
            }
        }
    }
    c.series.push(Series {
        name: "elapsed".into(),
        colour: GREY,
        values: elapsed,
    });
    c.series.push(Series {
        name: "MPI communication".into(),
        colour: BLUE,
        values: comm,
    });
    c.render()
}

/// The NCCL operations with device time: bus bandwidth per size bucket, the expected
/// curve over it when given, measured buckets below the threshold marked.
pub fn nccl_bandwidth(
    job: &JobProfile,
    routines: &Routines,
    expected: Option<&Expected>,
) -> String {
    let mut o = String::new();
    let ops: Vec<&String> = table_order(routines, Family::Nccl)
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| net_transport(n).is_none() && !n.ends_with("Config"))
        .collect();
    let mut drew_expected = false;
    for op in ops {
        let measured = compare::profile_curve(job, op);
        if measured.is_empty() {
            continue;
        }
        let expected = expected.filter(|e| e.op == *op);
        let comparison = expected.map(|e| compare::compare(op, &e.curve, &measured, e.threshold));
        let mut buckets: Vec<u8> = measured.keys().copied().collect();
        if let Some(e) = expected {
            buckets.extend(e.curve.keys());
            buckets.sort_unstable();
            buckets.dedup();
        }
        let below = |b: u8| {
            comparison.as_ref().is_some_and(|c| {
                let lo = collector_common::buckets::bucket_range(b).0;
                c.buckets.iter().any(|x| x.min_bytes == lo && x.below)
            })
        };
        let mut c = BarChart::new(
            &format!("nccl-busbw-{op}"),
            &format!("{op}: bus bandwidth per message size (device time)"),
            SIZE_AXIS,
            "bus bandwidth",
            Unit::GBps,
        );
        c.layout = Layout::Overlaid;
        c.categories = buckets.iter().map(|b| size_label(Some(*b))).collect();
        let value =
            |b: &u8, want_below: bool| measured.get(b).copied().filter(|_| below(*b) == want_below);
        c.series.push(Series {
            name: "measured".into(),
            colour: BLUE,
            values: buckets.iter().map(|b| value(b, false)).collect(),
        });
        if let Some(e) = expected {
            c.series.push(Series {
                name: format!("measured, below {:.0}% of expected", e.threshold * 100.0),
                colour: VERMILLION,
                values: buckets.iter().map(|b| value(b, true)).collect(),
            });
            c.marks = buckets
                .iter()
                .enumerate()
                .filter(|(_, b)| below(**b))
                .map(|(i, _)| (i, "below".to_string()))
                .collect();
            c.line = Some(Series {
                name: format!("expected ({})", e.source),
                colour: plotters::style::RGBColor(0x22, 0x22, 0x22),
                values: buckets.iter().map(|b| e.curve.get(b).copied()).collect(),
            });
            drew_expected = true;
        }
        o.push_str(&c.render());
        if let Some(cmp) = &comparison {
            let _ = writeln!(o, "<pre>{}</pre>", escape(&compare::render(cmp)));
        }
    }
    if let Some(e) = expected.filter(|_| !drew_expected) {
        let _ = writeln!(
            o,
            "<p class=\"warn\">{}: no device time was measured for {}, so nothing is compared \
             with it.</p>",
            escape(&e.source),
            escape(&e.op)
        );
    }
    o
}

/// Who is late: each rank's share of the waiting, the skew per routine and size, the
/// findings and the late senders.
pub fn who_is_late(job: &JobProfile) -> String {
    let Some(s) = &job.skew else {
        return String::new();
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<p>{} collective instances matched across ranks ({} incomplete, {} with members \
         on other nodes, {} within the clocks' error, {} not identified, {} not aligned, \
         {} lost).</p>",
        s.instances,
        s.incomplete,
        s.remote,
        s.within_clock_error,
        s.unidentified,
        s.unaligned,
        s.lost
    );
    if s.sampled > 0 {
        let _ = writeln!(
            o,
            "<p>Estimated: past a communicator's first 1,024 instances, one in 2 to 64 is \
             followed (the same ones in every rank); {} followed stood for several.</p>",
            s.sampled
        );
    }
    if !s.findings.is_empty() {
        o.push_str("<ul class=\"findings\">");
        for f in &s.findings {
            let _ = write!(o, "<li>{}</li>", escape(f));
        }
        o.push_str("</ul>\n");
    }
    if !s.ranks.is_empty() {
        let mut ranks: Vec<_> = s.ranks.iter().collect();
        let mut title = "Time each rank made the others wait and waited for them".to_string();
        if ranks.len() > RANK_BARS {
            ranks.sort_by_key(|r| std::cmp::Reverse(r.caused_ns));
            ranks.truncate(RANK_BARS);
            ranks.sort_by_key(|r| r.rank);
            title.push_str(&format!(" (the {RANK_BARS} that made others wait longest)"));
        }
        let mut c = BarChart::new("late-ranks", &title, "rank", "time", Unit::Seconds);
        c.log_above_ratio = 0.0;
        c.categories = ranks.iter().map(|r| r.rank.to_string()).collect();
        c.series.push(Series {
            name: "made others wait".into(),
            colour: VERMILLION,
            values: ranks.iter().map(|r| Some(secs(r.caused_ns))).collect(),
        });
        c.series.push(Series {
            name: "waited for others".into(),
            colour: GREY,
            values: ranks.iter().map(|r| Some(secs(r.waited_ns))).collect(),
        });
        if let Some((i, r)) = ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| r.caused_ns > 0)
            .max_by_key(|(_, r)| r.caused_ns)
        {
            c.marks.push((i, format!("last {}×", r.last)));
        }
        o.push_str(&c.render());
    }
    let mut by_routine: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for r in &s.routines {
        by_routine.entry(r.routine.as_str()).or_default().push(r);
    }
    for (routine, rows) in by_routine {
        let mut c = BarChart::new(
            &format!("late-skew-{routine}"),
            &format!("{routine}: median arrival skew and transfer time per message size"),
            SIZE_AXIS,
            "time",
            Unit::Seconds,
        );
        c.categories = rows.iter().map(|r| size_label(r.bucket)).collect();
        c.series.push(Series {
            name: "median skew (the longest wait)".into(),
            colour: VERMILLION,
            values: rows.iter().map(|r| Some(secs(r.skew_ns.p50))).collect(),
        });
        c.series.push(Series {
            name: "median transfer (once all were there)".into(),
            colour: BLUE,
            values: rows.iter().map(|r| Some(secs(r.transfer_ns.p50))).collect(),
        });
        for (i, r) in rows.iter().enumerate() {
            if let Some(l) = &r.most_last {
                c.marks.push((i, format!("r{}", l.rank)));
            }
        }
        o.push_str(&c.render());
    }
    if let Some(ls) = &s.late_sender {
        late_pairs(&mut o, &ls.pairs, "late-senders", "Late Sender", "receiver");
        late_pairs(
            &mut o,
            &ls.late_receivers,
            "late-receivers",
            "Late Receiver",
            "sender",
        );
    }
    o
}

/// A table of Late Sender (or Late Receiver) pairs, if any: `waiter` is who waited.
fn late_pairs(
    o: &mut String,
    pairs: &[crate::skew::late_sender::LateSenderPair],
    class: &str,
    title: &str,
    waiter: &str,
) {
    if pairs.is_empty() {
        return;
    }
    let _ = write!(
        o,
        "<table class=\"{class}\"><caption>{title}</caption><thead><tr><th>receiver</th>\
         <th>sender</th><th>messages</th><th>late</th><th>{waiter} waited (s)</th></tr>\
         </thead><tbody>"
    );
    for p in pairs {
        let _ = write!(
            o,
            "<tr><td>{} ({})</td><td>{} ({})</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{:.6}</td></tr>",
            p.receiver,
            escape(&p.receiver_host),
            p.sender,
            escape(&p.sender_host),
            p.messages,
            p.late,
            secs(p.wait_ns)
        );
    }
    o.push_str("</tbody></table>\n");
}

/// A duration bucket as a chart labels it: below its end.
fn duration_label(b: usize) -> String {
    match duration_range(b) {
        (lo, u64::MAX) => format!("≥{}", Unit::Seconds.format(secs(lo))),
        (_, hi) => format!("<{}", Unit::Seconds.format(secs(hi))),
    }
}

/// Per routine with timed calls: calls per log2 duration bucket, all ranks.
pub fn durations(routines: &Routines) -> String {
    let mut o = String::new();
    for family in [Family::Mpi, Family::Nccl, Family::Fabric, Family::Cuda] {
        for (name, s) in table_order(routines, family) {
            let Some(d) = &s.durations else { continue };
            let buckets: Vec<(usize, u64)> = d.buckets().collect();
            let mut c = BarChart::new(
                &format!("durations-{name}"),
                &format!(
                    "{name}: calls per duration (fastest {}, slowest {})",
                    Unit::Seconds.format(secs(d.min_ns)),
                    Unit::Seconds.format(secs(d.max_ns))
                ),
                "call duration (log2 buckets)",
                "calls",
                Unit::Count,
            );
            c.categories = buckets.iter().map(|(b, _)| duration_label(*b)).collect();
            c.series.push(Series {
                name: "calls, all ranks".into(),
                colour: BLUE,
                values: buckets
                    .iter()
                    .map(|(_, n)| (*n > 0).then_some(*n as f64))
                    .collect(),
            });
            o.push_str(&c.render());
        }
    }
    o
}

/// A job's ranks in at most `max` rows (bars, heat-map rows): one per rank, or past `max`
/// contiguous ranges of ranks, labelled by their ranks.
struct RankGroups<'a> {
    job: &'a JobProfile,
    groups: Vec<(usize, usize)>,
}

impl<'a> RankGroups<'a> {
    fn new(job: &'a JobProfile, max: usize) -> RankGroups<'a> {
        RankGroups {
            job,
            groups: groups(job.ranks.len(), max),
        }
    }

    /// Whether every row is a single rank.
    fn single(&self) -> bool {
        self.groups.iter().all(|(a, b)| a == b)
    }

    /// The row of the rank at index `i` of the profile's ranks.
    fn of(&self, i: usize) -> usize {
        self.groups.partition_point(|(_, last)| *last < i)
    }

    /// The ranks in row `g`.
    fn ranks(&self, g: usize) -> &'a [RankProfile] {
        let (a, b) = self.groups[g];
        &self.job.ranks[a..=b]
    }

    /// The rows' labels: `7`, or `0-15` for a range.
    fn labels(&self) -> Vec<String> {
        let single = self.single();
        (0..self.groups.len())
            .map(|g| {
                let part = self.ranks(g);
                if single {
                    part[0].rank.to_string()
                } else {
                    format!("{}-{}", part[0].rank, part[part.len() - 1].rank)
                }
            })
            .collect()
    }

    /// Each rank's index in the profile, by `key`.
    fn index_by<K: Ord>(&self, key: impl Fn(&RankProfile) -> K) -> BTreeMap<K, usize> {
        self.job
            .ranks
            .iter()
            .enumerate()
            .map(|(i, r)| (key(r), i))
            .collect()
    }
}

/// The bytes each rank sent each world rank, as a heat map (its element id `id`; `within`
/// says what part of the run it covers, empty for the whole run).
pub fn peers(job: &JobProfile, id: &str, within: &str) -> String {
    if job.ranks.iter().all(|r| r.peers.is_empty()) {
        return String::new();
    }
    let rows = RankGroups::new(job, HEAT_CELLS);
    let position = rows.index_by(|r| r.rank);
    let mut cells: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    let mut elsewhere = 0u64;
    for (i, r) in job.ranks.iter().enumerate() {
        for p in &r.peers {
            match p.world_peer().and_then(|peer| position.get(&peer)) {
                Some(&j) if p.sent_bytes > 0 => {
                    *cells.entry((rows.of(i), rows.of(j))).or_default() += p.sent_bytes as f64;
                }
                Some(_) => {}
                None => elsewhere += p.calls_not_on_a_world_rank(),
            }
        }
    }
    let labels = rows.labels();
    let map = HeatMap {
        id: id.into(),
        title: format!("Point-to-point bytes sent{within}, by rank (row) to world rank (column)"),
        rows: labels.clone(),
        cols: labels,
        row_desc: "sending rank".into(),
        col_desc: "receiving rank".into(),
        cells: cells.into_iter().map(|((a, b), v)| (a, b, v)).collect(),
        unit: Unit::Bytes,
        log: true,
    };
    let mut o = map.render();
    if elsewhere > 0 {
        let _ = writeln!(
            o,
            "<p>Calls not put on a world rank (communicators whose creation or members' ranks \
             were not seen, receives from any source without a status): {elsewhere}</p>"
        );
    }
    o
}

/// Per MPI or NCCL routine, the libfabric operations made inside its calls.
pub fn fabric(routines: &Routines) -> String {
    let fabric: Vec<_> = table_order(routines, Family::Fabric)
        .into_iter()
        .filter(|(_, s)| !s.called_from.is_empty())
        .collect();
    if fabric.is_empty() {
        return String::new();
    }
    let parents: Vec<&String> = {
        let mut p: Vec<_> = fabric
            .iter()
            .flat_map(|(_, s)| s.called_from.keys())
            .collect();
        p.sort_by_key(|n| {
            (
                collector_common::routines::routine_id(n).unwrap_or(u16::MAX),
                *n,
            )
        });
        p.dedup();
        p
    };
    let mut c = BarChart::new(
        "fabric-under",
        "libfabric operations inside each MPI or NCCL routine's calls",
        "MPI or NCCL routine",
        "libfabric calls",
        Unit::Count,
    );
    c.categories = parents.iter().map(|p| (*p).clone()).collect();
    let mut table = String::from(
        "<table class=\"fabric\"><thead><tr><th>libfabric operation</th><th>inside</th>\
         <th>#calls</th><th>bytes</th><th>time (s)</th></tr></thead><tbody>",
    );
    for (i, (name, s)) in fabric.iter().enumerate() {
        c.series.push(Series {
            name: (*name).clone(),
            colour: PALETTE[i % PALETTE.len()],
            values: parents
                .iter()
                .map(|p| s.called_from.get(*p).map(|t| t.calls as f64))
                .collect(),
        });
        for (parent, t) in &s.called_from {
            let _ = write!(
                table,
                "<tr><th>{}</th><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{:.6}</td></tr>",
                escape(name),
                escape(parent),
                t.calls,
                t.bytes,
                secs(t.time_ns)
            );
        }
    }
    table.push_str("</tbody></table>\n");
    c.render() + &table
}

/// When each rank was in MPI: the share of each time bin its communication calls took, a
/// row per rank (per range of ranks past [`HEAT_CELLS`], their mean).
pub fn timeline(job: &JobProfile) -> String {
    let Some(t) = job.timeline.as_ref().filter(|t| !t.ranks.is_empty()) else {
        return String::new();
    };
    let rows = RankGroups::new(job, HEAT_CELLS);
    let position = rows.index_by(|r| r.pid);
    let mut busy: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    for r in &t.ranks {
        let Some(&i) = position.get(&r.pid) else {
            continue;
        };
        for (bin, ns) in r.busy_ns.iter().enumerate().filter(|(_, ns)| **ns > 0) {
            *busy.entry((rows.of(i), bin)).or_default() += ns;
        }
    }
    // From the first bin with MPI time to the last: a job's start-up (launcher, MPI_Init)
    // and its end are no part of the picture.
    let first = busy.keys().map(|(_, bin)| *bin).min().unwrap_or(0);
    let last = busy.keys().map(|(_, bin)| *bin).max().unwrap_or(0);
    let cols = (first..=last)
        .map(|b| Unit::Seconds.format(secs(b as u64 * t.bin_ns)))
        .collect();
    let map = HeatMap {
        id: "timeline".into(),
        title: format!(
            "Share of each {} in MPI communication, per rank (from the per-call events)",
            Unit::Seconds.format(secs(t.bin_ns))
        ),
        rows: rows.labels(),
        cols,
        row_desc: "rank".into(),
        col_desc: "time since recording began".into(),
        cells: busy
            .into_iter()
            .map(|((g, bin), ns)| {
                let share = ns as f64 / (t.bin_ns as f64 * rows.ranks(g).len() as f64);
                (g, bin - first, share.min(1.0))
            })
            .collect(),
        unit: Unit::Share,
        log: false,
    };
    map.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(size_label(None), "undecoded");
        assert_eq!(size_label(Some(0)), "0");
        assert_eq!(size_label(Some(1)), "≤4");
        assert_eq!(size_label(Some(10)), "≤2K");
        assert_eq!(duration_label(0), "<512 ns");
        assert_eq!(groups(5, 256), vec![(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]);
        assert_eq!(groups(5, 2), vec![(0, 2), (3, 4)]);
    }
}
