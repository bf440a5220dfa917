//! Each step's times under `--steps`: how long each process's step took, from its marker
//! call to its next, and how much of that it spent in calls (and its GPU in NCCL's device
//! windows). A slow iteration's question ("is it the communication, and whose?") answered
//! per step, for every rank: the table `commtap trace` ends with, and the trace's metadata.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Serialize;

use crate::api::pb;

/// One step, over the processes that ended it: the least and most of their figures, and
/// whose.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StepRow {
    /// The step.
    pub step: u64,
    /// Processes that ended it (began the next step): the figures are theirs.
    pub processes: u64,
    /// Processes that began it and whose end was not seen: the trace ended first, or their
    /// next marker call was lost.
    pub unfinished: u64,
    /// A process's step time, from the start of its marker call to the start of its next
    /// (ns): the shortest.
    pub shortest_ns: u64,
    /// The longest step time (ns).
    pub longest_ns: u64,
    /// The process whose step was the longest.
    pub longest: String,
    /// The time a process spent in calls during the step, the sum of its calls' durations
    /// over its threads (ns): the least. In a step every rank ends together, the rank that
    /// spent the least is the one the others waited for.
    pub least_in_calls_ns: u64,
    /// The process that spent the least.
    pub least_in_calls: String,
    /// The most time in calls (ns).
    pub most_in_calls_ns: u64,
    /// The process that spent the most.
    pub most_in_calls: String,
    /// The most time a process's GPU spent in NCCL's device windows begun in the step (ns;
    /// 0: none measured).
    pub most_device_ns: u64,
    /// The process whose GPU spent the most.
    pub most_device: String,
    /// Calls a process made in the step: the fewest and the most.
    pub calls: (u64, u64),
    /// Bytes a process's calls moved in the step (mpitrace's convention): the fewest and
    /// the most.
    pub bytes: (u64, u64),
}

/// Each process's steps as they come, summed into one row per step.
#[derive(Debug, Default)]
pub(super) struct StepTimes {
    processes: HashMap<u32, Open>,
    rows: BTreeMap<u64, Sums>,
    /// Calls that came after their step had been summed (a thread far behind the others),
    /// or past the calls held for one step: in the trace, not in the table.
    pub(super) unplaced: u64,
}

/// Steps tabled at most, from the first asked for: a trace of every step (`--step-marker`
/// alone) of a long run tables its first ones.
pub(super) const MAX_ROWS: u64 = 1000;

/// A process's latest steps: a call of another thread, or a device window, comes after the
/// next step's marker call and still belongs to the step it started in.
const KEPT_OPEN: usize = 4;

/// Calls of other threads held per process until its step's end is known.
pub(super) const MAX_HELD: usize = 4096;

/// One process's steps not yet summed.
#[derive(Debug, Default)]
struct Open {
    cells: VecDeque<Cell>,
    /// The start of its first step tabled: a call with no step after it came late.
    first_ns: Option<u64>,
    /// Calls of its other threads begun after the start of its step under way: an event
    /// comes when its call returns, so a call begun after the next marker call can come
    /// before it. Placed once the step's end is known.
    held: Vec<Part>,
    /// Its name, as the trace names its track.
    label: String,
}

/// What a call adds to its step.
#[derive(Clone, Copy, Debug)]
struct Part {
    start_ns: u64,
    duration_ns: u64,
    bytes: u64,
    /// A device window (NCCL's GPU time), not a call.
    device: bool,
}

/// One process's step.
#[derive(Debug, Default)]
struct Cell {
    step: u64,
    start_ns: u64,
    end_ns: Option<u64>,
    /// The thread of the marker call that began it: its calls come in order.
    thread: u32,
    calls: u64,
    bytes: u64,
    in_calls_ns: u64,
    device_ns: u64,
}

impl Cell {
    fn holds(&self, at: u64) -> bool {
        self.start_ns <= at && self.end_ns.is_none_or(|end| at < end)
    }

    fn add(&mut self, part: Part) {
        if part.device {
            self.device_ns += part.duration_ns;
        } else {
            self.calls += 1;
            self.bytes += part.bytes;
            self.in_calls_ns += part.duration_ns;
        }
    }
}

/// One step's figures over the processes summed so far, with whose they are (the first of
/// equals summed).
#[derive(Clone, Debug, Default)]
struct Sums {
    ended: u64,
    unfinished: u64,
    shortest: u64,
    longest: (u64, String),
    least_in_calls: (u64, String),
    most_in_calls: (u64, String),
    most_device: (u64, String),
    calls: (u64, u64),
    bytes: (u64, u64),
}

impl Sums {
    fn add(&mut self, cell: &Cell, label: &str) {
        let Some(end) = cell.end_ns else {
            self.unfinished += 1;
            return;
        };
        let time = end.saturating_sub(cell.start_ns);
        let first = self.ended == 0;
        self.ended += 1;
        let take = |now: &mut (u64, String), v: u64, better: bool| {
            if first || better {
                *now = (v, label.to_string());
            }
        };
        let longest = self.longest.0;
        take(&mut self.longest, time, time > longest);
        let least = self.least_in_calls.0;
        take(
            &mut self.least_in_calls,
            cell.in_calls_ns,
            cell.in_calls_ns < least,
        );
        let most = self.most_in_calls.0;
        take(
            &mut self.most_in_calls,
            cell.in_calls_ns,
            cell.in_calls_ns > most,
        );
        let device = self.most_device.0;
        take(
            &mut self.most_device,
            cell.device_ns,
            cell.device_ns > device,
        );
        let least = |now: u64, v: u64| if first { v } else { now.min(v) };
        self.shortest = least(self.shortest, time);
        self.calls = (
            least(self.calls.0, cell.calls),
            self.calls.1.max(cell.calls),
        );
        self.bytes = (
            least(self.bytes.0, cell.bytes),
            self.bytes.1.max(cell.bytes),
        );
    }
}

impl Open {
    /// Adds `part` to the step kept it started in; false if none.
    fn place(&mut self, part: Part) -> bool {
        match self.cells.iter_mut().rev().find(|c| c.holds(part.start_ns)) {
            Some(cell) => {
                cell.add(part);
                true
            }
            None => false,
        }
    }

    /// The step under way ends at `at`: the calls held go into their steps, those begun at
    /// or after `at` stay held.
    fn release(&mut self, at: u64) -> u64 {
        let held = std::mem::take(&mut self.held);
        let mut unplaced = 0;
        for part in held {
            if part.start_ns >= at {
                self.held.push(part);
            } else if !self.place(part) {
                unplaced += 1;
            }
        }
        unplaced
    }
}

impl StepTimes {
    /// Marker call `ev` of process `ev.pid` (track `label`) began `step`: the process's step
    /// before ends at its start (if it was the one before: else its end is not known), and
    /// `step` is tabled if `tabled`. A step summed now is in the rows if `kept`.
    pub(super) fn begin(
        &mut self,
        ev: &pb::CallEvent,
        step: u64,
        tabled: bool,
        kept: bool,
        label: String,
    ) {
        let (pid, tid, at) = (ev.pid, ev.tid, ev.start_ns);
        let Some(open) = self.processes.get_mut(&pid).filter(|o| !o.cells.is_empty()) else {
            if tabled {
                self.processes.insert(
                    pid,
                    Open {
                        cells: VecDeque::from([Cell::new(step, at, tid)]),
                        first_ns: Some(at),
                        held: Vec::new(),
                        label,
                    },
                );
            }
            return;
        };
        open.label = label;
        self.unplaced += open.release(at);
        if let Some(last) = open.cells.back_mut().filter(|c| c.end_ns.is_none()) {
            if last.step + 1 == step {
                last.end_ns = Some(at);
            }
        }
        if !tabled {
            // Past the steps tabled: nothing more of its is summed.
            open.held.clear();
            return;
        }
        open.cells.push_back(Cell::new(step, at, tid));
        if open.cells.len() > KEPT_OPEN {
            if let Some(cell) = open.cells.pop_front() {
                if kept {
                    self.rows
                        .entry(cell.step)
                        .or_default()
                        .add(&cell, &open.label);
                }
            }
        }
    }

    /// Process `pid`'s steps are counted no further from `at` (its step under way ends
    /// there): nothing after is summed.
    pub(super) fn end(&mut self, pid: u32, at: u64) {
        let Some(open) = self.processes.get_mut(&pid) else {
            return;
        };
        self.unplaced += open.release(at);
        open.held.clear();
        if let Some(last) = open.cells.back_mut().filter(|c| c.end_ns.is_none()) {
            last.end_ns = Some(at);
        }
    }

    /// Call `ev`, kept in the trace, is added to the step it started in (if tabled).
    pub(super) fn add(&mut self, ev: &pb::CallEvent) {
        let Some(open) = self.processes.get_mut(&ev.pid) else {
            return;
        };
        let part = Part {
            start_ns: ev.start_ns,
            duration_ns: ev.duration_ns,
            bytes: ev.bytes.unwrap_or(0),
            device: ev.device_window.is_some(),
        };
        let under_way = open
            .cells
            .back()
            .filter(|c| c.end_ns.is_none() && c.start_ns <= part.start_ns);
        match under_way {
            Some(c) if c.thread != ev.tid => {
                if open.held.len() < MAX_HELD {
                    open.held.push(part);
                } else {
                    self.unplaced += 1;
                }
            }
            _ => {
                // Before its first step tabled, or after its last: not tabled.
                let late = open.first_ns.is_some_and(|first| part.start_ns >= first)
                    && open
                        .cells
                        .front()
                        .is_some_and(|c| part.start_ns < c.start_ns);
                if !open.place(part) && late {
                    self.unplaced += 1;
                }
            }
        }
    }

    /// Process `pid`'s steps not summed yet are its under the name `label` (learnt late).
    pub(super) fn rename(&mut self, pid: u32, label: String) {
        if let Some(open) = self.processes.get_mut(&pid) {
            open.label = label;
        }
    }

    /// Process `pid` is another now (its pid reused): its steps so far are summed if
    /// `kept`.
    pub(super) fn forget(&mut self, pid: u32, kept: bool) {
        if let Some(open) = self.processes.remove(&pid).filter(|_| kept) {
            for cell in &open.cells {
                self.rows
                    .entry(cell.step)
                    .or_default()
                    .add(cell, &open.label);
            }
        }
    }

    /// The rows: every step summed, and the steps not summed yet of the processes `kept`.
    pub(super) fn rows(&self, kept: impl Fn(u32) -> bool) -> Vec<StepRow> {
        let mut rows = self.rows.clone();
        let mut open: Vec<(&u32, &Open)> = self
            .processes
            .iter()
            .filter(|(pid, _)| kept(**pid))
            .collect();
        open.sort_by_key(|(pid, _)| **pid);
        for (_, o) in open {
            for cell in &o.cells {
                rows.entry(cell.step).or_default().add(cell, &o.label);
            }
        }
        let whose = |(ns, label): (u64, String), ended: u64| {
            (ns, if ended > 0 { label } else { String::new() })
        };
        rows.into_iter()
            .map(|(step, s)| {
                let (longest_ns, longest) = whose(s.longest, s.ended);
                let (least_in_calls_ns, least_in_calls) = whose(s.least_in_calls, s.ended);
                let (most_in_calls_ns, most_in_calls) = whose(s.most_in_calls, s.ended);
                let (most_device_ns, most_device) = whose(s.most_device, s.ended);
                StepRow {
                    step,
                    processes: s.ended,
                    unfinished: s.unfinished,
                    shortest_ns: s.shortest,
                    longest_ns,
                    longest,
                    least_in_calls_ns,
                    least_in_calls,
                    most_in_calls_ns,
                    most_in_calls,
                    most_device: if most_device_ns > 0 {
                        most_device
                    } else {
                        String::new()
                    },
                    most_device_ns,
                    calls: s.calls,
                    bytes: s.bytes,
                }
            })
            .collect()
    }
}

impl Cell {
    fn new(step: u64, start_ns: u64, thread: u32) -> Cell {
        Cell {
            step,
            start_ns,
            thread,
            ..Cell::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(pid: u32, tid: u32, start_ns: u64, duration_ns: u64) -> pb::CallEvent {
        pb::CallEvent {
            pid,
            tid,
            routine: "MPI_Send".into(),
            start_ns,
            duration_ns,
            bytes: Some(8),
            ..Default::default()
        }
    }

    /// Process `pid` begins `step` at `step * 1000` on its thread `pid`, tabled.
    fn begin(t: &mut StepTimes, pid: u32, step: u64, kept: bool) {
        t.begin(
            &call(pid, pid, step * 1000, 0),
            step,
            true,
            kept,
            format!("pid {pid}"),
        );
    }

    /// A process whose next marker call was lost ends no step there: its step is
    /// unfinished, not a double one.
    #[test]
    fn a_step_whose_next_marker_was_lost_is_unfinished() {
        let mut t = StepTimes::default();
        for step in [1, 2, 4, 5] {
            begin(&mut t, 7, step, true);
        }
        let rows = t.rows(|_| true);
        let summary: Vec<(u64, u64, u64, u64)> = rows
            .iter()
            .map(|r| (r.step, r.processes, r.unfinished, r.longest_ns))
            .collect();
        assert_eq!(
            summary,
            vec![(1, 1, 0, 1000), (2, 0, 1, 0), (4, 1, 0, 1000), (5, 0, 1, 0)]
        );
    }

    /// A process `--ranks` leaves out is in no row, summed early or late; a pid reused
    /// sums its former process's steps under that one's name.
    #[test]
    fn rows_hold_the_processes_kept_under_their_own_names() {
        let mut t = StepTimes::default();
        for step in 1..=6 {
            begin(&mut t, 7, step, true);
            begin(&mut t, 8, step, false);
        }
        let rows = t.rows(|pid| pid == 7);
        assert!(
            rows.iter().all(|r| r.processes + r.unfinished == 1),
            "{rows:?}"
        );
        assert!(rows
            .iter()
            .all(|r| r.processes == 0 || r.longest == "pid 7"));
        // Pid 7 reused: its steps are summed as "pid 7", the new process's as its own.
        t.forget(7, true);
        for (at, step) in [(9000, 1), (9500, 2)] {
            t.begin(&call(7, 7, at, 0), step, true, true, "rank 3 (n1)".into());
        }
        let first = &t.rows(|pid| pid == 7)[0];
        assert_eq!(
            (first.processes, first.shortest_ns, first.longest_ns),
            (2, 500, 1000)
        );
        assert_eq!(first.longest, "pid 7");
    }

    /// Calls of other threads go into the step they began in, whenever they come; those
    /// that come after their step was summed are counted, those of step 0 not.
    #[test]
    fn calls_go_into_the_step_they_began_in_and_late_ones_are_counted() {
        let mut t = StepTimes::default();
        // Step 0: before any step tabled.
        t.add(&call(7, 7, 500, 10));
        begin(&mut t, 7, 1, true);
        // Begun in step 2 on another thread, come before step 2's marker call.
        t.add(&call(7, 70, 2100, 30));
        t.add(&call(7, 7, 1100, 20));
        for step in 2..=6 {
            begin(&mut t, 7, step, true);
        }
        // Begun in step 1, summed already (five steps on).
        t.add(&call(7, 70, 1200, 40));
        assert_eq!(t.unplaced, 1);
        t.add(&call(7, 70, 400, 40));
        assert_eq!(t.unplaced, 1, "step 0 is not tabled: not late");
        let rows = t.rows(|_| true);
        let calls: Vec<(u64, u64)> = rows
            .iter()
            .map(|r| (r.calls.0, r.most_in_calls_ns))
            .collect();
        assert_eq!(calls[..2], [(1, 20), (1, 30)]);
    }
}
