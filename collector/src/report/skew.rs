//! The text report's "Who is late" section (see `crate::skew`).

use std::fmt::Write as _;

use crate::skew::{
    late_sender::{LateSenderPair, LateSenderReport},
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
    if s.sampled > 0 {
        let _ = writeln!(
            o,
            "  estimated: past a communicator's first 1,024 instances, one in 2 to 64 is \
             followed (the same ones in every rank); {} followed stood for several",
            s.sampled
        );
    }
    if s.remote > 0 {
        let _ = writeln!(
            o,
            "  instances with members not watched here (on other nodes, or not attached): {}",
            s.remote
        );
    }
    for f in &s.findings {
        let _ = writeln!(o, "  {f}.");
    }
    if s.instances > 0 {
        ranks_table(&mut o, s);
        routines_table(&mut o, s);
        worst_instances(&mut o, s);
    }
    if let Some(ls) = &s.late_sender {
        late_senders(&mut o, ls);
    }
    o
}

/// Late Sender: per pair of ranks, how often a receive (or the wait of a nonblocking one)
/// waited for its send to start, and how long; and Late Receiver, the other way round.
fn late_senders(o: &mut String, ls: &LateSenderReport) {
    let _ = writeln!(o);
    let n = &ls.not_numbered;
    let _ = writeln!(
        o,
        "  Late Sender (receives and waits waiting for their send to start): {} pairs of ranks; \
         not numbered: {} (not seen from MPI_Init: {}, after an unresolved wildcard: {}, \
         communicator unknown: {}, on a persistent request's channel: {}); unpaired: {}",
        ls.pairs.len(),
        n.total(),
        n.not_from_init,
        n.after_unresolved_wildcard,
        n.communicator_unknown,
        n.persistent_channel,
        ls.unpaired
    );
    pairs_table(o, &ls.pairs, "pairs");
    let _ = writeln!(
        o,
        "  Late Receiver (blocking sends waiting for their receive to be posted): {} pairs of \
         ranks",
        ls.late_receivers.len()
    );
    pairs_table(o, &ls.late_receivers, "late_receivers");
}

/// The first 20 of `pairs` (a list in `skew.late_sender`), most waited first.
fn pairs_table(o: &mut String, pairs: &[LateSenderPair], list: &str) {
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "  {:>9} {:>7} {:>10} {:>7} {:>14} {:>12}",
        "receiver", "sender", "messages", "late", "waited (s)", "per late"
    );
    for p in pairs.iter().take(20) {
        let _ = writeln!(
            o,
            "  {:>9} {:>7} {:>10} {:>7} {:>14.6} {:>12}",
            p.receiver,
            p.sender,
            p.messages,
            p.late,
            p.wait_ns as f64 / 1e9,
            human_ns(p.wait_ns.checked_div(p.late).unwrap_or(0))
        );
    }
    if pairs.len() > 20 {
        let _ = writeln!(
            o,
            "  ... {} more pairs (JSON: skew.late_sender.{list})",
            pairs.len() - 20
        );
    }
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

/// Per routine and size: skew percentiles, and what an instance costs once everyone is
/// there (is an 8-byte Allreduce's time its latency, or waiting for a late rank?).
fn routines_table(o: &mut String, s: &SkewReport) {
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "  {:<24} {:>16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>14}",
        "routine", "bytes", "instances", "skew p50", "p90", "p99", "max", "transfer p50"
    );
    for r in &s.routines {
        let bytes = match (r.min_bytes, r.max_bytes) {
            (Some(lo), Some(hi)) => bytes_range(lo, hi),
            _ => "unknown".to_string(),
        };
        let q = r.skew_ns;
        let _ = writeln!(
            o,
            "  {:<24} {:>16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>14}",
            r.routine,
            bytes,
            r.instances,
            human_ns(q.p50),
            human_ns(q.p90),
            human_ns(q.p99),
            human_ns(q.max),
            human_ns(r.transfer_ns.p50)
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
