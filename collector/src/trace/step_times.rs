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
    table: Table,
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

/// Calls held per process before its first step tabled (the latest: those of step 0 go).
const HELD_BEFORE_FIRST: usize = 64;

/// The rows, and the name each process's steps were summed under.
#[derive(Clone, Debug, Default)]
struct Table {
    rows: BTreeMap<u64, Sums>,
    /// Per pid, the latest process of it summed: its label, and whether it exited (a name
    /// learnt after, as `record` names every rank at its end, is still its).
    summed_as: HashMap<u32, (String, bool)>,
}

impl Table {
    /// Sums process `pid`'s step `cell` under `label`, if it was kept from its start and
    /// still is.
    fn fold(&mut self, pid: u32, cell: &Cell, label: &str, kept: bool) {
        if !(kept && cell.kept) {
            return;
        }
        match self.summed_as.get_mut(&pid) {
            // Its own label: renamed with it.
            Some((as_, false)) if as_ == label => {}
            // A new process with the pid of one exited (whose rows keep their name), or
            // a label not seen yet.
            _ => {
                self.summed_as.insert(pid, (label.to_string(), false));
            }
        }
        self.rows.entry(cell.step).or_default().add(cell, label);
    }

    /// Process `pid`, live or exited as `live` says, is named `label`: the rows summed
    /// under its former name are relabelled (not those of another process given its pid).
    fn name(&mut self, pid: u32, label: &str, live: bool) {
        let Some((old, exited)) = self.summed_as.get_mut(&pid) else {
            return;
        };
        if *exited == live || old == label {
            return;
        }
        let old = std::mem::replace(old, label.to_string());
        for sums in self.rows.values_mut() {
            for (_, whose) in [
                &mut sums.longest,
                &mut sums.least_in_calls,
                &mut sums.most_in_calls,
                &mut sums.most_device,
            ] {
                if *whose == old {
                    *whose = label.to_string();
                }
            }
        }
    }
}

/// One process's steps not yet summed.
#[derive(Debug, Default)]
struct Open {
    cells: VecDeque<Cell>,
    /// The start of its first step tabled: a call with no step after it came late.
    first_ns: Option<u64>,
    /// Calls not placed yet: an event comes when its call returns, so a call of another
    /// thread begun after the next marker call can come before it. Before its first step
    /// tabled, its latest calls; then its other threads' calls begun after its marker
    /// thread's latest return (the next marker call starts after it). Placed once the
    /// step's end is known.
    held: VecDeque<Part>,
    /// Its name, as the trace names its track.
    label: String,
    /// Where its steps were counted no further (its numbering changed): nothing after is
    /// summed.
    stopped_ns: Option<u64>,
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
    /// The latest return of a call of that thread in the step.
    thread_done_ns: u64,
    /// Whether `--ranks` kept the process when the step began (else its calls before are
    /// not in it).
    kept: bool,
    calls: u64,
    bytes: u64,
    in_calls_ns: u64,
    device_ns: u64,
}

impl Cell {
    /// Step `step` begun by marker call `ev`.
    fn new(step: u64, ev: &pb::CallEvent, kept: bool) -> Cell {
        Cell {
            step,
            start_ns: ev.start_ns,
            thread: ev.tid,
            thread_done_ns: ev.start_ns + ev.duration_ns,
            kept,
            ..Cell::default()
        }
    }

    /// Whether a call begun at `at` is in the step.
    fn spans(&self, at: u64) -> bool {
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
    /// Whether a call begun at `at` that is in no step kept came late: its step was summed.
    fn late(&self, at: u64) -> bool {
        self.first_ns.is_some_and(|first| at >= first)
            && self.cells.front().is_some_and(|c| at < c.start_ns)
    }

    /// Adds `part` to the step kept it started in; false if none.
    fn place(&mut self, part: Part) -> bool {
        match self.cells.iter_mut().rev().find(|c| c.spans(part.start_ns)) {
            Some(cell) => {
                cell.add(part);
                true
            }
            None => false,
        }
    }

    /// The step under way ends at `at`: the calls held go into their steps, those begun at
    /// or after `at` stay held. Returns those that came late.
    fn release(&mut self, at: u64) -> u64 {
        let held = std::mem::take(&mut self.held);
        let mut late = 0;
        for part in held {
            if part.start_ns >= at {
                self.held.push_back(part);
            } else if !self.place(part) && self.late(part.start_ns) {
                late += 1;
            }
        }
        late
    }
}

impl StepTimes {
    /// Marker call `ev` of process `ev.pid` (track `label`) began `step`: the process's step
    /// before ends at its start (if it was the one before: else its end is not known), and
    /// `step` is tabled if `tabled`. A step summed now is in the rows if `kept` (and was
    /// when it began).
    pub(super) fn begin(
        &mut self,
        ev: &pb::CallEvent,
        step: u64,
        tabled: bool,
        kept: bool,
        label: String,
    ) {
        let pid = ev.pid;
        let open = self.processes.entry(pid).or_default();
        if open.label != label {
            self.table.name(pid, &label, true);
            open.label = label;
        }
        self.unplaced += open.release(ev.start_ns);
        if let Some(last) = open.cells.back_mut().filter(|c| c.end_ns.is_none()) {
            if last.step + 1 == step {
                last.end_ns = Some(ev.start_ns);
            }
        }
        if !tabled {
            if !open.cells.is_empty() {
                // Past the steps tabled: nothing more of its is summed.
                open.held.clear();
            }
            return;
        }
        open.first_ns.get_or_insert(ev.start_ns);
        open.cells.push_back(Cell::new(step, ev, kept));
        if open.cells.len() > KEPT_OPEN {
            if let Some(cell) = open.cells.pop_front() {
                self.table.fold(pid, &cell, &open.label, kept);
            }
        }
    }

    /// Process `pid`'s steps are counted no further from `at`: its step under way is left
    /// unfinished (its numbering changed because events were lost: its real end may be
    /// among them), and nothing after is summed.
    pub(super) fn end(&mut self, pid: u32, at: u64) {
        if let Some(open) = self.processes.get_mut(&pid) {
            self.unplaced += open.release(at);
            open.held.clear();
            open.stopped_ns = Some(at);
        }
    }

    /// Call `ev`, kept by the trace's options (written, or past `--max-events`), is added
    /// to the step it started in (if tabled).
    pub(super) fn add(&mut self, ev: &pb::CallEvent) {
        let part = Part {
            start_ns: ev.start_ns,
            duration_ns: ev.duration_ns,
            bytes: ev.bytes.unwrap_or(0),
            device: ev.device_window.is_some(),
        };
        let open = self.processes.entry(ev.pid).or_default();
        if open.stopped_ns.is_some_and(|at| part.start_ns >= at) {
            return;
        }
        let Some(last) = open.cells.back_mut() else {
            // Before its first step tabled (only where step 0 is kept: else no call before
            // it is): the latest are held, as one of them may have begun after the marker
            // call that begins it; older ones are taken as step 0's.
            if open.held.len() >= HELD_BEFORE_FIRST {
                open.held.pop_front();
            }
            open.held.push_back(part);
            return;
        };
        if last.end_ns.is_none() && last.start_ns <= part.start_ns {
            if ev.tid == last.thread {
                last.thread_done_ns = last.thread_done_ns.max(part.start_ns + part.duration_ns);
                last.add(part);
            } else if part.start_ns < last.thread_done_ns {
                // The next marker call starts after its thread's latest return.
                last.add(part);
            } else if open.held.len() < MAX_HELD {
                open.held.push_back(part);
            } else {
                self.unplaced += 1;
            }
            return;
        }
        if !open.place(part) && open.late(part.start_ns) {
            self.unplaced += 1;
        }
    }

    /// Process `pid` is named `label` (learnt after its first calls, or after it exited).
    pub(super) fn rename(&mut self, pid: u32, label: String) {
        match self.processes.get_mut(&pid) {
            Some(open) if open.label != label => {
                self.table.name(pid, &label, true);
                open.label = label;
            }
            Some(_) => {}
            None => self.table.name(pid, &label, false),
        }
    }

    /// Process `pid` exited: every call of its came, and its steps are summed if `kept`
    /// (under the name it had: its pid may be another's next).
    pub(super) fn exited(&mut self, pid: u32, kept: bool) {
        if let Some(open) = self.processes.remove(&pid) {
            for cell in &open.cells {
                self.table.fold(pid, cell, &open.label, kept);
            }
        }
        if let Some((_, exited)) = self.table.summed_as.get_mut(&pid) {
            *exited = true;
        }
    }

    /// The rows: every step summed, and the steps not summed yet of the processes `kept`.
    pub(super) fn rows(&self, kept: impl Fn(u32) -> bool) -> Vec<StepRow> {
        let mut table = self.table.clone();
        let mut open: Vec<(&u32, &Open)> = self.processes.iter().collect();
        open.sort_by_key(|(pid, _)| **pid);
        for (pid, o) in open {
            for cell in &o.cells {
                table.fold(*pid, cell, &o.label, kept(*pid));
            }
        }
        let whose = |(ns, label): (u64, String), shown: bool| {
            (ns, if shown { label } else { String::new() })
        };
        table
            .rows
            .into_iter()
            .map(|(step, s)| {
                let ended = s.ended > 0;
                let (longest_ns, longest) = whose(s.longest, ended);
                let (least_in_calls_ns, least_in_calls) = whose(s.least_in_calls, ended);
                let (most_in_calls_ns, most_in_calls) = whose(s.most_in_calls, ended);
                let device = s.most_device.0 > 0;
                let (most_device_ns, most_device) = whose(s.most_device, device);
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
                    most_device_ns,
                    most_device,
                    calls: s.calls,
                    bytes: s.bytes,
                }
            })
            .collect()
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

    /// Process `pid` begins `step` at `step * 1000` on its thread `pid` (its marker call
    /// 10 ns long, added as the writer adds it), tabled, unnamed.
    fn begin(t: &mut StepTimes, pid: u32, step: u64, kept: bool) {
        let marker = call(pid, pid, step * 1000, 10);
        t.begin(&marker, step, true, kept, unnamed(pid));
        t.add(&marker);
    }

    /// (step, processes that ended it, unfinished, longest) of each row.
    fn summary(t: &StepTimes) -> Vec<(u64, u64, u64, u64)> {
        t.rows(|_| true)
            .iter()
            .map(|r| (r.step, r.processes, r.unfinished, r.longest_ns))
            .collect()
    }

    fn unnamed(pid: u32) -> String {
        format!("pid {pid}")
    }

    /// A process whose next marker call was lost ends no step there: its step is
    /// unfinished, not a double one.
    #[test]
    fn a_step_whose_next_marker_was_lost_is_unfinished() {
        let mut t = StepTimes::default();
        for step in [1, 2, 4, 5] {
            begin(&mut t, 7, step, true);
        }
        begin(&mut t, 7, 6, true);
        assert_eq!(
            summary(&t)[..4],
            [
                (1, 1, 0, 1000),
                (2, 0, 1, 0),
                (4, 1, 0, 1000),
                (5, 1, 0, 1000)
            ]
        );
    }

    /// Where its numbering changed (events lost), the step under way is left unfinished:
    /// the other threads' calls held go into it if they began before, and nothing after is
    /// summed.
    #[test]
    fn a_step_whose_numbering_changed_is_unfinished_and_the_last() {
        let mut t = StepTimes::default();
        begin(&mut t, 7, 1, true);
        begin(&mut t, 7, 2, true);
        // Held: begun after the marker thread's latest return (2010).
        t.add(&call(7, 70, 2100, 5));
        t.add(&call(7, 70, 2600, 5));
        t.end(7, 2500);
        t.add(&call(7, 7, 2700, 5));
        let rows = t.rows(|_| true);
        let got: Vec<(u64, u64, u64, (u64, u64))> = rows
            .iter()
            .map(|r| (r.step, r.processes, r.unfinished, r.calls))
            .collect();
        assert_eq!(got, [(1, 1, 0, (1, 1)), (2, 0, 1, (0, 0))]);
        assert_eq!(t.unplaced, 0);
        // The unfinished step holds its marker and the call begun before the end.
        let open = &t.processes[&7].cells[1];
        assert_eq!((open.calls, open.end_ns), (2, None));
    }

    /// A process `--ranks` leaves out is in no row, summed early or late, nor are its steps
    /// begun before it was known to be kept. A name learnt late names the steps summed
    /// before, also once the process exited; a process exited keeps its name when its pid
    /// is given to another, which is named apart.
    #[test]
    fn rows_hold_the_processes_kept_under_their_own_names() {
        let mut t = StepTimes::default();
        for step in 1..=6 {
            begin(&mut t, 7, step, true);
            begin(&mut t, 8, step, false);
            begin(&mut t, 9, step, step > 2);
        }
        // Pid 9 spends the most in calls in step 3.
        t.add(&call(9, 9, 3100, 50));
        let rows = t.rows(|pid| pid != 8);
        let ended: Vec<u64> = rows.iter().map(|r| r.processes).collect();
        assert_eq!(ended, [1, 1, 2, 2, 2, 0], "{rows:?}");
        assert!(rows
            .iter()
            .all(|r| r.processes == 0 || r.longest == "pid 7"));
        // Named after its first steps were summed; then it exits.
        t.rename(7, "rank 0 (n1)".into());
        assert_eq!(t.rows(|pid| pid != 8)[0].longest, "rank 0 (n1)");
        t.exited(7, true);
        // Exited before it was named (`record` names every rank at its end).
        t.exited(9, true);
        t.rename(9, "rank 2 (n1)".into());
        // Pid 7 given to another process, steps twice as long, named later.
        for step in 1..=6 {
            let marker = call(7, 7, 10_000 + step * 2000, 10);
            t.begin(&marker, step, true, true, unnamed(7));
            t.add(&marker);
        }
        t.rename(7, "rank 3 (n1)".into());
        let rows = t.rows(|pid| pid != 8);
        let third = &rows[2];
        assert_eq!(
            (third.processes, third.shortest_ns, third.longest_ns),
            (3, 1000, 2000)
        );
        // The longest the new process's; the most in calls pid 9's, named after its exit;
        // the least the first of equals summed, the old process's.
        assert_eq!(
            [&third.longest, &third.most_in_calls, &third.least_in_calls],
            ["rank 3 (n1)", "rank 2 (n1)", "rank 0 (n1)"],
            "{rows:?}"
        );
        let names: std::collections::BTreeSet<&str> = rows
            .iter()
            .flat_map(|r| [&r.longest, &r.least_in_calls, &r.most_in_calls])
            .map(String::as_str)
            .collect();
        assert!(
            !names.contains("pid 7") && !names.contains("pid 9"),
            "{names:?}"
        );
    }

    /// Calls of other threads go into the step they began in, whenever they come: before
    /// the marker call that begins it too, in the first step; those that come after their
    /// step was summed are counted, those of step 0 not.
    #[test]
    fn calls_go_into_the_step_they_began_in_and_late_ones_are_counted() {
        let mut t = StepTimes::default();
        // Step 0: before any step tabled.
        t.add(&call(7, 7, 500, 10));
        // Begun in step 1 on another thread, come before step 1's marker call.
        t.add(&call(7, 70, 1050, 5));
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
        assert_eq!(calls[..2], [(3, 35), (2, 40)]);
    }

    /// Another thread's calls begun before the marker thread's latest return go into the
    /// step at once; those after are held, at most [`MAX_HELD`] of them, the rest counted.
    #[test]
    fn calls_held_for_a_step_are_bounded() {
        let mut t = StepTimes::default();
        begin(&mut t, 7, 1, true);
        // The marker thread is in a call until 1500.
        t.add(&call(7, 7, 1100, 400));
        for _ in 0..10 {
            t.add(&call(7, 70, 1200, 1));
        }
        for _ in 0..MAX_HELD + 3 {
            t.add(&call(7, 70, 1600, 1));
        }
        assert_eq!(t.unplaced, 3);
        begin(&mut t, 7, 2, true);
        let row = &t.rows(|_| true)[0];
        assert_eq!(row.calls.0, 2 + 10 + MAX_HELD as u64);
        // Before its first step, the latest are held: older ones are taken as step 0's.
        let mut t = StepTimes::default();
        for i in 0..HELD_BEFORE_FIRST as u64 + 6 {
            t.add(&call(8, 80, 1100 + i, 1));
        }
        begin(&mut t, 8, 1, true);
        begin(&mut t, 8, 2, true);
        assert_eq!(t.rows(|_| true)[0].calls.0, 1 + HELD_BEFORE_FIRST as u64);
    }
}
