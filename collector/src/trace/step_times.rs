//! Each step's times under `--steps`: how long each process's step took, from its marker
//! call to its next, and how much of that it spent in calls (and its GPU in NCCL's device
//! windows). A slow iteration's question ("is it the communication, and whose?") answered
//! per step, for every rank: the table `commtap trace` ends with, and the trace's metadata.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Serialize;

use crate::api::pb;

/// One step, over the processes that ended it: the shortest and longest of their times,
/// and whose.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StepRow {
    /// The step.
    pub step: u64,
    /// Processes that ended it (began the next step): the figures are theirs.
    pub processes: u64,
    /// Processes that began it and had not ended it when the trace ended.
    pub unfinished: u64,
    /// A process's step time, from the start of its marker call to the start of its next
    /// (ns): the shortest and the longest, and whose.
    pub shortest_ns: u64,
    /// The longest step time (ns).
    pub longest_ns: u64,
    /// The process whose step was the longest.
    pub longest: String,
    /// The time a process spent in calls during the step, the sum of its calls' durations
    /// over its threads (ns): the least and the most, and whose.
    pub least_in_calls_ns: u64,
    /// The most time in calls (ns).
    pub most_in_calls_ns: u64,
    /// The process that spent the most.
    pub most_in_calls: String,
    /// The most time a process's GPU spent in NCCL's device windows begun in the step (ns;
    /// 0: none measured), and whose.
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
    /// Calls that came after their step had been summed (a thread far behind the others):
    /// in the trace, not in the table.
    pub(super) unplaced: u64,
}

/// Steps tabled at most, from the first asked for: a trace of every step (`--step-marker`
/// alone) of a long run tables its first ones.
pub(super) const MAX_ROWS: u64 = 1000;

/// A process's latest steps: a call of another thread, or a device window, comes after the
/// next step's marker call and still belongs to the step it started in.
const KEPT_OPEN: usize = 4;

/// One process's steps not yet summed.
#[derive(Debug, Default)]
struct Open {
    cells: VecDeque<Cell>,
    /// Whether a step of its was summed already: a call before the steps kept is late, not
    /// before the first step.
    summed: bool,
    /// Whether `--ranks` keeps it (as known at its latest step): else it is in no row.
    kept: bool,
}

/// One process's step.
#[derive(Debug, Default)]
struct Cell {
    step: u64,
    start_ns: u64,
    end_ns: Option<u64>,
    calls: u64,
    bytes: u64,
    in_calls_ns: u64,
    device_ns: u64,
}

/// One step's figures over the processes summed so far (by pid: labelled at the end).
#[derive(Clone, Debug, Default)]
struct Sums {
    ended: u64,
    unfinished: u64,
    shortest: u64,
    longest: (u64, u32),
    least_in_calls: u64,
    most_in_calls: (u64, u32),
    most_device: (u64, u32),
    calls: (u64, u64),
    bytes: (u64, u64),
}

impl Sums {
    fn add(&mut self, pid: u32, cell: &Cell) {
        let Some(end) = cell.end_ns else {
            self.unfinished += 1;
            return;
        };
        let time = end.saturating_sub(cell.start_ns);
        let first = self.ended == 0;
        self.ended += 1;
        let least = |now: u64, v: u64| if first { v } else { now.min(v) };
        let most = |now: (u64, u32), v: u64| if first || v > now.0 { (v, pid) } else { now };
        self.shortest = least(self.shortest, time);
        self.longest = most(self.longest, time);
        self.least_in_calls = least(self.least_in_calls, cell.in_calls_ns);
        self.most_in_calls = most(self.most_in_calls, cell.in_calls_ns);
        self.most_device = most(self.most_device, cell.device_ns);
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

impl StepTimes {
    /// Process `pid` began `step` at `at` (its marker call's start): its step before ends
    /// there, and `step` is tabled if `tabled`; the process is in the rows if `kept`.
    pub(super) fn begin(&mut self, pid: u32, at: u64, step: u64, tabled: bool, kept: bool) {
        self.end(pid, at);
        if !tabled {
            return;
        }
        let open = self.processes.entry(pid).or_default();
        open.kept = kept;
        open.cells.push_back(Cell {
            step,
            start_ns: at,
            ..Cell::default()
        });
        if open.cells.len() > KEPT_OPEN {
            if let Some(cell) = open.cells.pop_front() {
                open.summed = true;
                if kept {
                    self.rows.entry(cell.step).or_default().add(pid, &cell);
                }
            }
        }
    }

    /// Process `pid`'s step under way ends at `at` (its next marker call, or its steps are
    /// counted no further).
    pub(super) fn end(&mut self, pid: u32, at: u64) {
        if let Some(last) = self
            .processes
            .get_mut(&pid)
            .and_then(|o| o.cells.back_mut())
            .filter(|c| c.end_ns.is_none())
        {
            last.end_ns = Some(at);
        }
    }

    /// Call `ev`, kept in the trace, is added to the step it started in (if tabled).
    pub(super) fn add(&mut self, ev: &pb::CallEvent) {
        let Some(open) = self.processes.get_mut(&ev.pid) else {
            return;
        };
        let late = open.summed
            && open
                .cells
                .front()
                .is_none_or(|first| ev.start_ns < first.start_ns);
        let cell = open
            .cells
            .iter_mut()
            .rev()
            .find(|c| c.start_ns <= ev.start_ns && c.end_ns.is_none_or(|e| ev.start_ns < e));
        match cell {
            Some(c) if ev.device_window.is_some() => c.device_ns += ev.duration_ns,
            Some(c) => {
                c.calls += 1;
                c.bytes += ev.bytes.unwrap_or(0);
                c.in_calls_ns += ev.duration_ns;
            }
            None if late => self.unplaced += 1,
            // Before its first step tabled (step 0, or past the rows kept): not tabled.
            None => {}
        }
    }

    /// Process `pid` is another now (its pid reused): its steps so far are summed.
    pub(super) fn forget(&mut self, pid: u32) {
        if let Some(open) = self.processes.remove(&pid).filter(|o| o.kept) {
            for cell in &open.cells {
                self.rows.entry(cell.step).or_default().add(pid, cell);
            }
        }
    }

    /// The rows, every process's steps summed, each process named by `label`.
    pub(super) fn rows(&self, label: impl Fn(u32) -> String) -> Vec<StepRow> {
        let mut rows = self.rows.clone();
        for (pid, open) in self.processes.iter().filter(|(_, o)| o.kept) {
            for cell in &open.cells {
                rows.entry(cell.step).or_default().add(*pid, cell);
            }
        }
        rows.into_iter()
            .map(|(step, s)| StepRow {
                step,
                processes: s.ended,
                unfinished: s.unfinished,
                shortest_ns: s.shortest,
                longest_ns: s.longest.0,
                longest: if s.ended > 0 {
                    label(s.longest.1)
                } else {
                    String::new()
                },
                least_in_calls_ns: s.least_in_calls,
                most_in_calls_ns: s.most_in_calls.0,
                most_in_calls: if s.ended > 0 {
                    label(s.most_in_calls.1)
                } else {
                    String::new()
                },
                most_device_ns: s.most_device.0,
                most_device: if s.most_device.0 > 0 {
                    label(s.most_device.1)
                } else {
                    String::new()
                },
                calls: s.calls,
                bytes: s.bytes,
            })
            .collect()
    }
}
