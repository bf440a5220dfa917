//! How far each node's clock has gone, as its snapshots show it: a snapshot that claims to
//! be taken later than its node's clock can read now is refused. A newer snapshot replaces
//! an older one of the same process, so one snapshot stamped far in the future
//! (`taken_ns = u64::MAX`) would otherwise own that process's record for good.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use crate::api::pb;

/// How far ahead of a node's clock, as last seen and advanced by the aggregator's own
/// elapsed time, a snapshot may be (pushes are seconds apart; rates of two clocks differ
/// by far less).
pub const SLACK: Duration = Duration::from_mins(1);
/// Most nodes whose clocks are followed; past it the oldest seen is forgotten.
const MAX_NODES: usize = 1 << 20;

/// One node's clock as last seen: its reading, and when the aggregator saw it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    node_ns: u64,
    at: Instant,
}

/// The clocks of the nodes that pushed.
#[derive(Debug, Default)]
pub struct NodeClocks {
    nodes: HashMap<String, Seen>,
}

impl NodeClocks {
    /// Drops the snapshots of `batch` stamped later than their node's clock can read at
    /// `now`; returns how many. A node's clock is where its latest snapshot put it (the
    /// newest of its first batch: a relay's batch holds old and new snapshots alike),
    /// advanced by the time the aggregator saw pass since, plus [`SLACK`]; it only moves
    /// forward (a rebooted node's small readings are plausible anyway).
    pub fn admit(&mut self, batch: &mut Vec<pb::ProcessSnapshot>, now: Instant) -> u64 {
        for p in batch.iter() {
            if !self.nodes.contains_key(&p.node) {
                let newest = batch
                    .iter()
                    .filter(|q| q.node == p.node)
                    .map(|q| q.taken_ns)
                    .max()
                    .unwrap_or(p.taken_ns);
                self.remember(&p.node, newest, now);
            }
        }
        let before = batch.len();
        batch.retain(|p| {
            let Some(seen) = self.nodes.get_mut(&p.node) else {
                return false;
            };
            let elapsed = now.saturating_duration_since(seen.at);
            let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            if p.taken_ns > seen.node_ns.saturating_add(nanos(elapsed + SLACK)) {
                return false;
            }
            if p.taken_ns > seen.node_ns.saturating_add(nanos(elapsed)) {
                *seen = Seen {
                    node_ns: p.taken_ns,
                    at: now,
                };
            }
            true
        });
        (before - batch.len()) as u64
    }

    fn remember(&mut self, node: &str, node_ns: u64, at: Instant) {
        if self.nodes.len() >= MAX_NODES {
            if let Some(oldest) = self
                .nodes
                .iter()
                .min_by_key(|(_, s)| s.at)
                .map(|(n, _)| n.clone())
            {
                self.nodes.remove(&oldest);
            }
        }
        self.nodes.insert(node.to_string(), Seen { node_ns, at });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(node: &str, taken_ns: u64) -> pb::ProcessSnapshot {
        pb::ProcessSnapshot {
            node: node.to_string(),
            taken_ns,
            ..Default::default()
        }
    }

    fn admitted(c: &mut NodeClocks, batch: &[(&str, u64)], now: Instant) -> Vec<u64> {
        let mut b: Vec<_> = batch.iter().map(|(n, t)| snap(n, *t)).collect();
        c.admit(&mut b, now);
        b.iter().map(|p| p.taken_ns).collect()
    }

    #[test]
    fn a_snapshot_from_the_future_is_refused() {
        let t0 = Instant::now();
        let mut c = NodeClocks::default();
        // A relay's first batch: an old and a new snapshot of one node.
        assert_eq!(
            admitted(&mut c, &[("n1", 5), ("n1", 1_000_000_000)], t0),
            [5, 1_000_000_000]
        );
        // A second later on the aggregator: the node may read up to 1 s + slack more.
        let t1 = t0 + Duration::from_secs(1);
        let too_far = 2_000_000_000 + SLACK.as_nanos() as u64 + 1;
        assert_eq!(
            admitted(
                &mut c,
                &[("n1", 2_000_000_000), ("n1", u64::MAX), ("n1", too_far)],
                t1
            ),
            [2_000_000_000]
        );
        // Older snapshots (retransmissions) are fine, and so is another node.
        assert_eq!(
            admitted(&mut c, &[("n1", 1_500_000_000), ("n2", 7)], t1),
            [1_500_000_000, 7]
        );
        // A reboot: the clock starts again from (nearly) zero, and goes on.
        assert_eq!(
            admitted(&mut c, &[("n1", 10)], t1 + Duration::from_secs(2)),
            [10]
        );
        assert_eq!(
            admitted(
                &mut c,
                &[("n1", 3_000_000_000)],
                t1 + Duration::from_secs(5)
            ),
            [3_000_000_000]
        );
    }
}
