//! `MPI_Pcontrol`'s profiled region, as mpitrace and mpiP honour it: `MPI_Pcontrol(1)`
//! starts the region (the first one starts it anew: what came before is left out),
//! `MPI_Pcontrol(0)` pauses it. The kernel pauses the process at each call while userspace
//! reads its counters there, so the region's counts (per routine, and per peer) are the
//! differences of counters read at its bounds, exactly.

use std::collections::BTreeMap;

use collector_common::{
    durations::{duration_range, DURATION_BUCKETS},
    CounterKey, CounterVal, DurationHist, PeerKey, PeerVal,
};

use super::Counter;

/// One per-peer counter of the kernel's (a process's point-to-point traffic with a peer).
pub type Peer = (PeerKey, PeerVal);

/// A process's counters read at a bound of its region.
#[derive(Clone, Debug, Default)]
pub struct Reading {
    /// Its routines' counters.
    pub counters: Vec<Counter>,
    /// Its per-peer counters.
    pub peers: Vec<Peer>,
}

/// One process's profiled region so far.
#[derive(Clone, Debug)]
pub struct Region {
    /// The interval under way: when it started (None: at the process's own start, where
    /// mpitrace starts too) and the counters then.
    open: Option<(Option<u64>, Reading)>,
    /// What the ended intervals counted.
    closed: BTreeMap<CounterKey, (CounterVal, DurationHist)>,
    /// What the ended intervals counted per peer.
    closed_peers: BTreeMap<PeerKey, PeerVal>,
    /// Their time, ns.
    closed_ns: u64,
    /// How many ended.
    intervals: u32,
    /// `MPI_Pcontrol(1)` was called: the region was started anew there.
    started: bool,
    /// `MPI_Pcontrol` was called at all (no region otherwise).
    used: bool,
    /// Bounds read late: the process could not be paused there (traced, or a job of an
    /// interactive shell), so calls made meanwhile fall on the wrong side.
    late_bounds: u32,
}

impl Default for Region {
    fn default() -> Self {
        Region {
            open: Some((None, Reading::default())),
            closed: BTreeMap::new(),
            closed_peers: BTreeMap::new(),
            closed_ns: 0,
            intervals: 0,
            started: false,
            used: false,
            late_bounds: 0,
        }
    }
}

/// A region's counts, for the report.
pub struct RegionCounts {
    /// Its counters (the sum of its intervals').
    pub counters: Vec<Counter>,
    /// Its per-peer counters (the same).
    pub peers: Vec<Peer>,
    /// Its time, ns.
    pub elapsed_ns: u64,
    /// Its intervals (the one under way included).
    pub intervals: u32,
    /// Bounds that were read late (see [`Region`]).
    pub late_bounds: u32,
}

impl Region {
    /// Follows per-peer counters moved under other keys (`moved`: each one's old key and
    /// new; a freed communicator's, out of the kernel's map): the interval under way reads
    /// its start as if they had been under their new keys then.
    pub fn follow_moved(&mut self, moved: &[(PeerKey, PeerKey)]) {
        let Some((_, at)) = self.open.as_mut() else {
            return;
        };
        if at.peers.is_empty() {
            return;
        }
        let to: std::collections::HashMap<PeerKey, PeerKey> = moved.iter().copied().collect();
        let mut merged: BTreeMap<PeerKey, PeerVal> = BTreeMap::new();
        for (k, v) in at.peers.drain(..) {
            merged.entry(*to.get(&k).unwrap_or(&k)).or_default().add(&v);
        }
        at.peers = merged.into_iter().collect();
    }

    /// `MPI_Pcontrol(level)` at `ts_ns` (1 starts the region, 0 pauses it, others do
    /// nothing), with the process's counters then (`paused`: read
    /// while the kernel held it there); `origin_ns` is the process's start (MPI_Init's
    /// return, or when it was first counted).
    pub fn control(&mut self, level: i32, ts_ns: u64, now: Reading, paused: bool, origin_ns: u64) {
        if level != 0 && level != 1 {
            // Other levels (mpiP's 2 and 3, say) leave the region as it is.
            return;
        }
        self.used = true;
        if !paused {
            self.late_bounds += 1;
        }
        if level == 1 {
            if !self.started {
                self.started = true;
                self.closed.clear();
                self.closed_peers.clear();
                self.closed_ns = 0;
                self.intervals = 0;
                self.open = Some((Some(ts_ns), now));
            } else if self.open.is_none() {
                self.open = Some((Some(ts_ns), now));
            }
        } else if let Some((start, at)) = self.open.take() {
            for (k, v, h) in difference(&now.counters, &at.counters) {
                let (sum, hist) = self.closed.entry(k).or_default();
                add(sum, hist, &v, &h);
            }
            for (k, v) in peer_difference(&now.peers, &at.peers) {
                self.closed_peers.entry(k).or_default().add(&v);
            }
            self.closed_ns += ts_ns.saturating_sub(start.unwrap_or(origin_ns));
            self.intervals += 1;
        }
    }

    /// The region's counts with the process's counters and per-peer counters `now` (at
    /// `end_ns`; taken only if there is a region), or None if `MPI_Pcontrol` was never
    /// called.
    pub fn counts<'a>(
        &self,
        now: impl IntoIterator<Item = &'a Counter>,
        now_peers: impl IntoIterator<Item = &'a Peer>,
        end_ns: u64,
        origin_ns: u64,
    ) -> Option<RegionCounts> {
        if !self.used {
            return None;
        }
        let mut total = self.closed.clone();
        let mut peers = self.closed_peers.clone();
        let mut elapsed_ns = self.closed_ns;
        if let Some((start, at)) = &self.open {
            for (k, v, h) in difference(now, &at.counters) {
                let (sum, hist) = total.entry(k).or_default();
                add(sum, hist, &v, &h);
            }
            for (k, v) in peer_difference(now_peers, &at.peers) {
                peers.entry(k).or_default().add(&v);
            }
            elapsed_ns += end_ns.saturating_sub(start.unwrap_or(origin_ns));
        }
        let counters = total
            .into_iter()
            .map(|(k, (mut v, h))| {
                (v.min_ns, v.max_ns) = extremes(&h);
                (k, v, h)
            })
            .collect();
        Some(RegionCounts {
            counters,
            peers: peers.into_iter().collect(),
            elapsed_ns,
            intervals: self.intervals + u32::from(self.open.is_some()),
            late_bounds: self.late_bounds,
        })
    }
}

/// `now - before`, per counter (a counter absent before counts from zero); counters that
/// did not move are left out.
fn difference<'a>(now: impl IntoIterator<Item = &'a Counter>, before: &[Counter]) -> Vec<Counter> {
    let before: BTreeMap<&CounterKey, (&CounterVal, &DurationHist)> =
        before.iter().map(|(k, v, h)| (k, (v, h))).collect();
    now.into_iter()
        .filter_map(|(k, v, h)| {
            let (mut dv, mut dh) = (*v, *h);
            if let Some((bv, bh)) = before.get(k) {
                dv.calls = v.calls.saturating_sub(bv.calls);
                dv.bytes = v.bytes.saturating_sub(bv.bytes);
                dv.time_ns = v.time_ns.saturating_sub(bv.time_ns);
                dv.untimed = v.untimed.saturating_sub(bv.untimed);
                for (d, b) in dh.calls.iter_mut().zip(bh.calls) {
                    *d = d.saturating_sub(b);
                }
            }
            (dv.calls > 0 || dh.calls.iter().any(|c| *c > 0)).then_some((*k, dv, dh))
        })
        .collect()
}

/// `now - before` per peer (a peer absent before counts from zero); peers with nothing
/// new are left out.
fn peer_difference<'a>(now: impl IntoIterator<Item = &'a Peer>, before: &[Peer]) -> Vec<Peer> {
    let before: BTreeMap<&PeerKey, &PeerVal> = before.iter().map(|(k, v)| (k, v)).collect();
    now.into_iter()
        .filter_map(|(k, v)| {
            let mut d = *v;
            if let Some(b) = before.get(k) {
                d.calls = v.calls.saturating_sub(b.calls);
                d.bytes = v.bytes.saturating_sub(b.bytes);
            }
            (d.calls > 0 || d.bytes > 0).then_some((*k, d))
        })
        .collect()
}

fn add(sum: &mut CounterVal, hist: &mut DurationHist, v: &CounterVal, h: &DurationHist) {
    sum.calls += v.calls;
    sum.bytes += v.bytes;
    sum.time_ns += v.time_ns;
    sum.untimed += v.untimed;
    for (s, c) in hist.calls.iter_mut().zip(h.calls) {
        *s += c;
    }
}

/// The fastest and slowest call as the region's histogram bounds them (the counters keep
/// the whole run's extremes only): its first bucket's floor and its last bucket's ceiling.
fn extremes(h: &DurationHist) -> (u64, u64) {
    let used = || (0..DURATION_BUCKETS).filter(|b| h.calls[*b] > 0);
    match (used().next(), used().next_back()) {
        (Some(lo), Some(hi)) => (duration_range(lo).0, duration_range(hi).1),
        _ => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(routine: u16, calls: u64, bytes: u64) -> Counter {
        let key = CounterKey {
            tgid: 7,
            routine,
            ..Default::default()
        };
        let v = CounterVal {
            calls,
            bytes,
            time_ns: calls * 10,
            ..Default::default()
        };
        (key, v, DurationHist::default())
    }

    fn reading(counters: Vec<Counter>) -> Reading {
        Reading {
            counters,
            peers: Vec::new(),
        }
    }

    fn calls_of(c: &RegionCounts) -> Vec<(u16, u64, u64)> {
        c.counters
            .iter()
            .map(|(k, v, _)| (k.routine, v.calls, v.bytes))
            .collect()
    }

    #[test]
    fn the_first_start_begins_anew_and_pauses_leave_out_what_they_hold() {
        let mut r = Region::default();
        // Before any MPI_Pcontrol(0 or 1): no region.
        r.control(2, 5, reading(vec![counter(1, 4, 40)]), true, 0);
        assert!(r.counts(&[counter(1, 5, 50)], &[], 100, 0).is_none());
        // 5 calls before the start; 3 more in the first interval; 4 while paused; 2 in
        // the second, still under way.
        r.control(1, 10, reading(vec![counter(1, 5, 50)]), true, 0);
        r.control(0, 30, reading(vec![counter(1, 8, 80)]), true, 0);
        r.control(
            1,
            50,
            reading(vec![counter(1, 12, 120), counter(2, 1, 0)]),
            true,
            0,
        );
        let c = r
            .counts(&[counter(1, 14, 140), counter(2, 1, 0)], &[], 60, 0)
            .expect("a region");
        assert_eq!(calls_of(&c), vec![(1, 5, 50)]);
        assert_eq!((c.elapsed_ns, c.intervals, c.late_bounds), (30, 2, 0));
        // A bound read late is counted.
        r.control(0, 70, reading(vec![counter(1, 15, 150)]), false, 0);
        let c = r
            .counts(&[counter(1, 20, 200)], &[], 90, 0)
            .expect("a region");
        assert_eq!(calls_of(&c), vec![(1, 6, 60)]);
        assert_eq!((c.elapsed_ns, c.intervals, c.late_bounds), (40, 2, 1));
    }

    #[test]
    fn per_peer_traffic_is_split_at_the_bounds_too() {
        let sent = |to: i32, calls: u64, bytes: u64| {
            let key = PeerKey {
                tgid: 7,
                peer: to,
                comm: PeerKey::WORLD,
                dir: PeerKey::SENT,
                gen: 0,
                me: 0,
            };
            (key, PeerVal { calls, bytes })
        };
        let at = |calls: u64, peers: Vec<Peer>| Reading {
            counters: vec![counter(1, calls, 0)],
            peers,
        };
        let mut r = Region::default();
        // 2 sends to rank 1 before the start; 3 to rank 1 and 1 to rank 2 inside; 4 to
        // rank 2 while paused; 1 to rank 1 in the second interval, under way.
        r.control(1, 10, at(1, vec![sent(1, 2, 20)]), true, 0);
        r.control(0, 20, at(2, vec![sent(1, 5, 50), sent(2, 1, 8)]), true, 0);
        r.control(1, 30, at(3, vec![sent(1, 5, 50), sent(2, 5, 40)]), true, 0);
        let now = [sent(1, 6, 60), sent(2, 5, 40)];
        let c = r
            .counts(&[counter(1, 4, 0)], &now, 40, 0)
            .expect("a region");
        let peers: Vec<(i32, u64, u64)> = c
            .peers
            .iter()
            .map(|(k, v)| (k.peer, v.calls, v.bytes))
            .collect();
        assert_eq!(peers, [(1, 4, 40), (2, 1, 8)]);
    }

    #[test]
    fn counters_moved_under_a_new_key_during_an_interval_count_only_what_came_after_its_start() {
        // A split's counter, 3 sends before the start; its communicator freed and the
        // counter moved under its name (2 more sends by then), then 1 more.
        let split = |gen: u16, comm: u64, calls: u64| {
            let key = PeerKey {
                tgid: 7,
                peer: 1,
                comm,
                dir: PeerKey::SENT,
                gen,
                me: 0,
            };
            (
                key,
                PeerVal {
                    calls,
                    bytes: calls,
                },
            )
        };
        let (old, named) = (split(2, 0x84, 0).0, split(PeerKey::NAMED | 9, 0xabc, 0).0);
        let mut r = Region::default();
        r.control(
            1,
            10,
            Reading {
                counters: vec![counter(1, 3, 0)],
                peers: vec![split(2, 0x84, 3)],
            },
            true,
            0,
        );
        r.follow_moved(&[(old, named)]);
        let c = r
            .counts(
                &[counter(1, 6, 0)],
                &[split(PeerKey::NAMED | 9, 0xabc, 6)],
                40,
                0,
            )
            .expect("a region");
        assert_eq!(c.peers, [(named, PeerVal { calls: 3, bytes: 3 })]);
    }

    #[test]
    fn a_pause_before_any_start_ends_the_region_mpitrace_opens_at_init() {
        let mut r = Region::default();
        r.control(0, 40, reading(vec![counter(1, 3, 30)]), true, 10);
        let c = r
            .counts(&[counter(1, 9, 90)], &[], 100, 10)
            .expect("a region");
        assert_eq!(calls_of(&c), vec![(1, 3, 30)]);
        assert_eq!((c.elapsed_ns, c.intervals), (30, 1));
    }
}
