//! The point-to-point communication matrix: bytes each rank sent to each other rank.

use std::fmt::Write as _;

use super::JobProfile;

/// Ranks up to which the whole matrix is printed; past it, each rank's busiest peers.
const MATRIX_RANKS: usize = 64;
/// Peers listed per rank past [`MATRIX_RANKS`].
const TOP_PEERS: usize = 5;

/// The text section, empty when no rank has per-peer traffic; `within` says what part of
/// the run it covers (empty: the whole run).
pub fn render_peers(job: &JobProfile, within: &str) -> String {
    let mut o = String::new();
    if job.ranks.iter().all(|r| r.peers.is_empty()) {
        return o;
    }
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------"
    );
    let _ = writeln!(
        o,
        "Point-to-point bytes sent{within}, by rank (row) to world rank (column):"
    );
    let _ = writeln!(o);
    let sent = |r: &crate::profile::RankProfile, to: u32| {
        r.peers
            .iter()
            .find(|p| p.world_peer() == Some(to))
            .map_or(0, |p| p.sent_bytes)
    };
    if job.ranks.len() <= MATRIX_RANKS {
        let _ = write!(o, "  {:>6}", "");
        for c in &job.ranks {
            let _ = write!(o, " {:>10}", c.rank);
        }
        let _ = writeln!(o);
        for r in &job.ranks {
            let _ = write!(o, "  {:>6}", r.rank);
            for c in &job.ranks {
                let _ = write!(o, " {:>10}", sent(r, c.rank));
            }
            let _ = writeln!(o);
        }
    } else {
        for r in &job.ranks {
            let mut top: Vec<_> = r
                .peers
                .iter()
                .filter(|p| p.world_peer().is_some())
                .collect();
            top.sort_by_key(|p| std::cmp::Reverse(p.sent_bytes + p.received_bytes));
            let list: Vec<String> = top
                .iter()
                .take(TOP_PEERS)
                .map(|p| {
                    format!(
                        "{} ({} B out, {} B in)",
                        p.peer.unwrap_or_default(),
                        p.sent_bytes,
                        p.received_bytes
                    )
                })
                .collect();
            let _ = writeln!(o, "  rank {:>6}: {}", r.rank, list.join(", "));
        }
    }
    let other: u64 = job
        .ranks
        .iter()
        .flat_map(|r| &r.peers)
        .map(crate::stats::PeerTraffic::calls_not_on_a_world_rank)
        .sum();
    if other > 0 {
        let _ = writeln!(
            o,
            "  calls not put on a world rank (communicators whose creation or members' ranks \
             were not seen, receives from any source without a status): {other}"
        );
    }
    o
}
