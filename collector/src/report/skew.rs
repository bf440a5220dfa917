//! The text report's "Who is late" section (see `crate::skew`).

use std::fmt::Write as _;

use crate::skew::{
    summary::{bytes_range, human_ns},
    SkewReport,
};

/// The text report's "Who is late" section.
pub fn render_text(s: &SkewReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------"
    );
    let _ = writeln!(
        o,
        "Who is late (collective instances matched across ranks):"
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "  instances: {}   incomplete: {}   unidentified calls: {}   unaligned calls: {}   lost events: {}",
        s.instances, s.incomplete, s.unidentified, s.unaligned, s.lost
    );
    if s.remote > 0 {
        let _ = writeln!(
            o,
            "  instances with members on other nodes (not matched on one node): {}",
            s.remote
        );
    }
    for f in &s.findings {
        let _ = writeln!(o, "  {f}.");
    }
    if s.instances == 0 {
        return o;
    }
    ranks_table(&mut o, s);
    routines_table(&mut o, s);
    worst_instances(&mut o, s);
    o
}

/// Per rank: how often it was last, what it caused and what it waited.
fn ranks_table(o: &mut String, s: &SkewReport) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "  {:>6}  {:<16} {:>10} {:>7} {:>14} {:>14}",
        "rank", "host", "last", "% last", "caused (s)", "waited (s)"
    );
    for r in &s.ranks {
        let pct = if r.instances == 0 {
            0.0
        } else {
            r.last as f64 * 100.0 / r.instances as f64
        };
        let _ = writeln!(
            o,
            "  {:>6}  {:<16} {:>10} {:>6.1}% {:>14.6} {:>14.6}",
            r.rank,
            r.host,
            r.last,
            pct,
            r.caused_ns as f64 / 1e9,
            r.waited_ns as f64 / 1e9
        );
    }
}

/// Per routine and size: skew percentiles.
fn routines_table(o: &mut String, s: &SkewReport) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "  {:<24} {:>16} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "routine", "bytes", "instances", "skew p50", "p90", "p99", "max"
    );
    for r in &s.routines {
        let bytes = match (r.min_bytes, r.max_bytes) {
            (Some(lo), Some(hi)) => bytes_range(lo, hi),
            _ => "unknown".to_string(),
        };
        let q = r.skew_ns;
        let _ = writeln!(
            o,
            "  {:<24} {:>16} {:>10} {:>10} {:>10} {:>10} {:>10}",
            r.routine,
            bytes,
            r.instances,
            human_ns(q.p50),
            human_ns(q.p90),
            human_ns(q.p99),
            human_ns(q.max)
        );
    }
}

/// The worst instances, named.
fn worst_instances(o: &mut String, s: &SkewReport) {
    if !s.worst.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(o, "  worst instances:");
        for w in &s.worst {
            let _ = writeln!(
                o,
                "    {} on {} #{}: rank {} ({}) late by {}",
                w.routine,
                w.comm,
                w.seq,
                w.late_rank,
                w.host,
                human_ns(w.skew_ns)
            );
        }
    }
}
