//! The shape of a timeline, small enough to travel in the profile: per rank, the time its
//! MPI communication calls took in each of at most [`MAX_BINS`] equal slices of the run.
//! Made by `record` from the per-call events (with `--trace` or `--call-events`), drawn by
//! the HTML report as a rank-by-time map: the overview before opening the trace itself.

use std::collections::BTreeMap;

use collector_common::CallEvent;
use serde::{Deserialize, Serialize};

/// Bins per rank at most: when a call falls past the last, neighbouring bins are merged
/// and the width doubles, so memory stays bounded however long the run.
pub const MAX_BINS: usize = 256;
/// The first bins' width, ns.
const FIRST_BIN_NS: u64 = 1_000_000;

/// MPI communication time per rank in equal time bins.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Timeline {
    /// Start of the first bin: when recording began, ns of CLOCK_MONOTONIC.
    pub start_ns: u64,
    /// Width of every bin, ns.
    pub bin_ns: u64,
    /// Bins up to the end of the recording.
    pub bins: usize,
    /// Per process, by pid.
    pub ranks: Vec<RankTimeline>,
}

/// One process's part of a [`Timeline`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RankTimeline {
    /// Process id (the profile's ranks say which rank it is).
    pub pid: u32,
    /// ns spent in MPI communication calls in each bin (trailing empty bins left out).
    pub busy_ns: Vec<u64>,
}

/// Builds a [`Timeline`] from call events as they come, in bounded memory.
pub struct TimelineBuilder {
    start_ns: u64,
    bin_ns: u64,
    ranks: BTreeMap<u32, Vec<u64>>,
}

impl TimelineBuilder {
    /// A timeline whose first bin starts at `start_ns` (calls begun before it count from it).
    pub fn new(start_ns: u64) -> TimelineBuilder {
        TimelineBuilder {
            start_ns,
            bin_ns: FIRST_BIN_NS,
            ranks: BTreeMap::new(),
        }
    }

    /// Adds one call (MPI communication routines only: MPI_Init and MPI_Finalize, NCCL
    /// enqueues and libfabric operations are not communication time).
    pub fn add(&mut self, ev: &CallEvent) {
        if ev.kind != collector_common::EventKind::Call as u32
            || !crate::stats::is_communication_id(ev.routine)
        {
            return;
        }
        let start = ev.start_ns.max(self.start_ns) - self.start_ns;
        let end = (ev.start_ns + ev.dur_ns).max(self.start_ns) - self.start_ns;
        if end <= start {
            return;
        }
        self.cover(end);
        let bins = self.ranks.entry(ev.tgid).or_default();
        let mut at = start;
        while at < end {
            let b = (at / self.bin_ns) as usize;
            let bin_end = (b as u64 + 1) * self.bin_ns;
            let upto = end.min(bin_end);
            if bins.len() <= b {
                bins.resize(b + 1, 0);
            }
            bins[b] += upto - at;
            at = upto;
        }
    }

    /// Widens the bins until `end` (ns from the start) falls in the last one at most.
    fn cover(&mut self, end: u64) {
        while end > self.bin_ns * MAX_BINS as u64 {
            for bins in self.ranks.values_mut() {
                *bins = bins.chunks(2).map(|p| p.iter().sum()).collect();
            }
            self.bin_ns *= 2;
        }
    }

    /// The timeline up to `end_ns` (the end of the recording).
    pub fn finish(mut self, end_ns: u64) -> Timeline {
        let span = end_ns.saturating_sub(self.start_ns).max(1);
        self.cover(span);
        Timeline {
            start_ns: self.start_ns,
            bin_ns: self.bin_ns,
            bins: span.div_ceil(self.bin_ns) as usize,
            ranks: self
                .ranks
                .into_iter()
                .map(|(pid, busy_ns)| RankTimeline { pid, busy_ns })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tgid: u32, routine: &str, start_ns: u64, dur_ns: u64) -> CallEvent {
        CallEvent {
            kind: collector_common::EventKind::Call as u32,
            tgid,
            routine: collector_common::routines::routine_id(routine).expect("routine"),
            start_ns,
            dur_ns,
            ..CallEvent::default()
        }
    }

    #[test]
    fn calls_fill_the_bins_they_span_and_the_bins_widen() {
        let t0 = 5_000_000_000;
        let mut b = TimelineBuilder::new(t0);
        // 0.5 ms in bin 0; 1.5 ms from 0.75 ms: 0.25 in bin 0, 1 in bin 1, 0.25 in bin 2.
        b.add(&call(7, "MPI_Send", t0, 500_000));
        b.add(&call(7, "MPI_Allreduce", t0 + 750_000, 1_500_000));
        // Not communication: no bins.
        b.add(&call(7, "MPI_Init", t0, 3_000_000));
        // Begun before the recording: counted from its start.
        b.add(&call(8, "MPI_Recv", t0 - 1_000_000, 1_200_000));
        let t = TimelineBuilder::finish(b, t0 + 3_000_000);
        assert_eq!((t.bin_ns, t.bins), (1_000_000, 3));
        assert_eq!(t.ranks[0].busy_ns, vec![750_000, 1_000_000, 250_000]);
        assert_eq!(t.ranks[1].busy_ns, vec![200_000]);

        // A call at 300 ms: bins of 2 ms, every earlier one merged with its neighbour.
        let mut b = TimelineBuilder::new(t0);
        b.add(&call(7, "MPI_Allreduce", t0 + 750_000, 1_500_000));
        b.add(&call(7, "MPI_Barrier", t0 + 300_000_000, 1_000));
        let t = b.finish(t0 + 400_000_000);
        assert_eq!(t.bin_ns, 2_000_000);
        assert_eq!(t.bins, 200);
        assert_eq!(&t.ranks[0].busy_ns[..2], &[1_250_000, 250_000]);
        assert_eq!(t.ranks[0].busy_ns[150], 1_000);
        let total: u64 = t.ranks[0].busy_ns.iter().sum();
        assert_eq!(total, 1_501_000, "nothing lost in the merging");
    }
}
