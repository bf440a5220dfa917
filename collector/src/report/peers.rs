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
    // Counted for the whole run only: not split at a region's bounds.
    let left_out: u64 = job.ranks.iter().map(|r| r.health.peers_full).sum();
    if left_out > 0 && within.is_empty() {
        let _ = writeln!(
            o,
            "  calls left out of these counts (the kernel's per-peer map, or its user's share \
             of it, was full; the routine table has them): {left_out}"
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(peers_full: u64) -> JobProfile {
        let rank = |rank: u32| -> crate::profile::RankProfile {
            serde_json::from_value(serde_json::json!({
                "rank": rank, "rank_known": true, "world_size": 2, "pid": 100 + rank,
                "host": "n1", "job": "7", "cmdline": "./app", "start_ticks": 1,
                "elapsed_ns": 1_000u64, "comm_time_ns": 10u64, "routines": {},
                "peers_full": peers_full,
                "peers": [{"peer": 1 - rank, "sent_calls": 1, "sent_bytes": 8,
                           "received_calls": 1, "received_bytes": 8}],
            }))
            .expect("a rank profile")
        };
        JobProfile::of_ranks(vec![rank(0), rank(1)])
    }

    #[test]
    fn calls_left_out_of_the_matrix_are_counted_under_it() {
        let said = "calls left out of these counts";
        let text = render_peers(&job(3), "");
        let line = text
            .lines()
            .find(|l| l.contains(said))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(line.ends_with(": 6"), "both ranks' 3: {line}");
        assert!(!render_peers(&job(0), "").contains(said));
        assert!(
            !render_peers(&job(3), " within the region").contains(said),
            "not split at a region's bounds"
        );
    }
}
