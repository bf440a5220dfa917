//! Steps of a training loop (`--steps FROM..TO --step-marker ROUTINE[@BYTES]`): which
//! step each call of each process is in, numbered alike in every process.
//!
//! A step begins at each call of the marker. A collective marker's calls are numbered by
//! its instance on its communicator (who-is-late's `seq`): step 1 is the first instance
//! the trace saw any process make, and step k the k-th instance from there, in every
//! process alike, whichever of them had entered it when the trace began (a rank waiting
//! inside it then is not seen making it: the daemon sends no call begun before the stream).
//! A collective call not numbered yet (who-is-late aligns a running job's ranks on their
//! first calls) begins no step. A marker that is no collective is counted by each process
//! from when the trace starts.

use std::collections::{BTreeSet, HashMap};

use super::step_times::{StepRow, StepTimes, MAX_ROWS};
use crate::api::pb;

/// The call that begins each step of a training loop (`--step-marker ROUTINE[@BYTES]`):
/// a routine called once a step, or one of its sizes that is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepMarker {
    /// The routine, e.g. `MPI_Allreduce`.
    pub routine: String,
    /// Only its calls of exactly these bytes (None: all its calls).
    pub bytes: Option<u64>,
}

impl StepMarker {
    /// Whether call `ev` begins a step: a call (no device window) of the routine, of the
    /// size if one is named.
    pub fn marks(&self, ev: &pb::CallEvent) -> bool {
        ev.device_window.is_none()
            && ev.arrival.is_none()
            && ev.routine == self.routine
            && self.bytes.is_none_or(|b| ev.bytes == Some(b))
    }
}

impl StepMarker {
    /// Whether the marker is a collective: its calls are counted by their instance number.
    pub fn is_collective(&self) -> bool {
        super::routine(&self.routine)
            .is_some_and(|r| r.spec.class == collector_common::routines::class::COLLECTIVE)
    }
}

impl std::str::FromStr for StepMarker {
    type Err = String;

    fn from_str(s: &str) -> Result<StepMarker, String> {
        let (routine, bytes) = match s.split_once('@') {
            Some((r, b)) => {
                let b = b.trim().parse::<u64>().map_err(|_| {
                    format!(
                        "invalid step marker {s:?}: expected ROUTINE or ROUTINE@BYTES, e.g. \
                         MPI_Allreduce@4"
                    )
                })?;
                (r.trim(), Some(b))
            }
            None => (s.trim(), None),
        };
        if super::routine(routine).is_none() {
            return Err(format!(
                "unknown routine {routine:?} in step marker {s:?}: name an MPI, NCCL or \
                 libfabric routine as `commtap report` lists it (e.g. MPI_Allreduce, \
                 ncclAllReduce)"
            ));
        }
        Ok(StepMarker {
            routine: routine.to_string(),
            bytes,
        })
    }
}

impl std::fmt::Display for StepMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.bytes {
            Some(b) => write!(f, "{}@{b}", self.routine),
            None => f.write_str(&self.routine),
        }
    }
}

/// `--steps FROM..TO`: each process's calls from the start of its marker call that begins
/// step FROM to the start of the one that begins step TO+1; step 0 is what comes before
/// its first (the step under way when the trace began).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steps {
    /// The first step kept.
    pub from: u64,
    /// The last step kept (None: every step from `from` on).
    pub to: Option<u64>,
    /// The call that begins each step.
    pub marker: StepMarker,
}

/// How far the processes of a trace under `--steps` got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepsReached {
    /// The steps asked for.
    pub steps: Steps,
    /// Processes whose calls came (of the ranks `--ranks` keeps).
    pub processes: u64,
    /// Of them, those that began step `from` (all of them for step 0).
    pub began: u64,
    /// Those that began the step after `to`: all their steps asked for are in.
    pub ended: u64,
    /// Marker calls that began no step: collectives not numbered yet.
    pub unnumbered: u64,
    /// Processes whose steps were counted no further: their numbering became their node's
    /// own (events lost on every rank there).
    pub renumbered: u64,
    /// The furthest step any process began.
    pub last_step: u64,
    /// Each step's times, from FROM (or 1) on: at most [`MAX_ROWS`] steps.
    pub per_step: Vec<StepRow>,
    /// Calls that came after their step had been summed: in the trace, not in `per_step`.
    pub unplaced: u64,
}

impl std::fmt::Display for StepsReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.steps;
        let to = s.to.map_or(String::new(), |t| t.to_string());
        if self.processes == 0 {
            write!(f, "steps {}..{to}: no process's calls came", s.from)?;
        } else if s.from == 0 && s.to.is_none() {
            // Every step: marked, none left out.
            write!(
                f,
                "{} steps marked, each begun by a call of {} ({} processes)",
                self.last_step, s.marker, self.processes
            )?;
        } else if self.began == 0 {
            write!(
                f,
                "no process began step {} ({} seen; a step begins at each call of {}): name a \
                 call made once a step (`commtap report` lists each rank's calls per routine \
                 and size range, `commtap events` each call's bytes)",
                s.from, self.processes, s.marker
            )?;
        } else {
            write!(
                f,
                "steps {}..{to}, each begun by a call of {}: {} of {} processes began step {}",
                s.from, s.marker, self.began, self.processes, s.from
            )?;
            if let Some(t) = s.to {
                write!(f, ", {} ended step {t}", self.ended)?;
            }
        }
        if self.unnumbered > 0 {
            write!(
                f,
                " ({} calls of {} began no step: who-is-late had not numbered them (it aligns \
                 the ranks of a job its daemon did not watch from MPI_Init on their first \
                 calls, and numbers none where it is off, --no-skew); or they came more than \
                 64 instances after later ones, or past 4,096 communicators)",
                self.unnumbered, s.marker
            )?;
        }
        if self.renumbered > 0 {
            write!(
                f,
                " ({} processes' steps were counted no further: their node's numbering of \
                 the marker's communicator changed (events lost on every rank there), so \
                 their windows end there)",
                self.renumbered
            )?;
        }
        write_table(f, self)
    }
}

/// Rows printed at most: the metadata holds them all.
const PRINTED_ROWS: usize = 50;

/// Each step's times, one line a step, under the summary line.
fn write_table(f: &mut std::fmt::Formatter<'_>, r: &StepsReached) -> std::fmt::Result {
    if r.per_step.iter().all(|row| row.processes == 0) {
        return Ok(());
    }
    let rows = &r.per_step[..r.per_step.len().min(PRINTED_ROWS)];
    let device = rows.iter().any(|row| row.most_device_ns > 0);
    // Each name column as wide as its longest name.
    let width = |name: fn(&StepRow) -> &str| {
        rows.iter()
            .map(|row| name(row).chars().count())
            .max()
            .unwrap_or(0)
            .max(2)
    };
    let (w1, w2, w3, w4) = (
        width(|r| &r.longest),
        width(|r| &r.least_in_calls),
        width(|r| &r.most_in_calls),
        width(|r| &r.most_device),
    );
    let ms = |ns: u64| format!("{:.3}", ns as f64 / 1e6);
    let range = |(least, most): (u64, u64)| {
        if least == most {
            least.to_string()
        } else {
            format!("{least}..{most}")
        }
    };
    write!(
        f,
        "\nper step, over the processes that ended it (time: from a process's marker call to \
         its next; in calls: the sum of its calls' durations, least first: in a step the ranks \
         end together, the one the others waited for spends the least{}; calls and bytes per \
         process):\n\
         {:>6} {:>5} {:>14} {:>9}  {:<w1$} {:>18}  {:<w2$} {:>9}  {:<w3$}",
        if device {
            "; GPU: its NCCL device windows"
        } else {
            ""
        },
        "step",
        "ended",
        "time ms: least",
        "most",
        "by",
        "in calls ms: least",
        "by",
        "most",
        "by",
    )?;
    if device {
        write!(f, " {:>12}  {:<w4$}", "GPU ms: most", "by")?;
    }
    write!(f, " {:>7} {:>12}", "calls", "bytes")?;
    for row in rows {
        write!(f, "\n{:>6} {:>5}", row.step, row.processes)?;
        if row.processes == 0 {
            write!(f, "  none ended it")?;
        } else {
            write!(
                f,
                " {:>14} {:>9}  {:<w1$} {:>18}  {:<w2$} {:>9}  {:<w3$}",
                ms(row.shortest_ns),
                ms(row.longest_ns),
                row.longest,
                ms(row.least_in_calls_ns),
                row.least_in_calls,
                ms(row.most_in_calls_ns),
                row.most_in_calls,
            )?;
            if device {
                let whose = if row.most_device.is_empty() {
                    "-"
                } else {
                    &row.most_device
                };
                write!(f, " {:>12}  {:<w4$}", ms(row.most_device_ns), whose)?;
            }
            write!(f, " {:>7} {:>12}", range(row.calls), range(row.bytes))?;
        }
        if row.unfinished > 0 {
            write!(
                f,
                "  ({} unfinished: the trace ended, the next marker call was lost, the \
                 numbering changed, or the process exited)",
                row.unfinished
            )?;
        }
    }
    if r.per_step.len() > PRINTED_ROWS {
        write!(
            f,
            "\n... {} more steps in the trace's metadata (commtap.steps.per_step)",
            r.per_step.len() - PRINTED_ROWS
        )?;
    }
    if r.unplaced > 0 {
        write!(
            f,
            "\n({} calls are in the trace, not in this table: they came after their step was \
             summed, or past the {} calls of other threads held for one step)",
            r.unplaced,
            super::step_times::MAX_HELD
        )?;
    }
    Ok(())
}

/// Each process's steps, counted as its calls come.
#[derive(Debug)]
pub(super) struct StepCounter {
    steps: Steps,
    /// A collective marker's instances, per numbering.
    numberings: HashMap<NumberingKey, Numbering>,
    processes: HashMap<u32, Begun>,
    unnumbered: u64,
    /// The furthest step any process began.
    last_step: u64,
    times: StepTimes,
}

/// What one numbering of instances is the same across: a communicator of a job; and, where
/// its numbers count from where a node's daemon began watching it, that node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct NumberingKey {
    job: String,
    comm: String,
    node: Option<String>,
}

/// The marker's instances seen in one numbering.
#[derive(Debug)]
struct Numbering {
    /// The first seen: step 1.
    origin: u64,
    /// The latest numbers seen (at most [`RECENT_NUMBERS`]): an instance's calls come from
    /// every member, not in order across them.
    recent: BTreeSet<u64>,
    /// Numbers seen before those.
    forgotten: u64,
}

/// Instance numbers of one numbering kept: its members' calls of one instance come within
/// a step or two of each other.
const RECENT_NUMBERS: usize = 64;

impl Numbering {
    /// The step instance `seq` begins: 1 + the instances seen before it (None: before the
    /// first, or older than the instances kept: its step is not known).
    fn step(&mut self, seq: u64) -> Option<u64> {
        if seq < self.origin || self.recent.first().is_some_and(|first| seq < *first) {
            return None;
        }
        if self.recent.insert(seq) && self.recent.len() > RECENT_NUMBERS {
            self.recent.pop_first();
            self.forgotten += 1;
        }
        Some(1 + self.forgotten + self.recent.range(..seq).count() as u64)
    }
}

/// Numberings kept at most: a marker made on more communicators than this begins no step on
/// the others (counted as not numbered).
const MAX_NUMBERINGS: usize = 4096;

/// One process's steps.
#[derive(Debug, Default)]
struct Begun {
    /// Its marker calls so far (a marker that is no collective).
    calls: u64,
    /// The start of the marker call that began step `from` (or the first after it).
    from_ns: Option<u64>,
    /// The start of the marker call that began the step after `to` (or the first after it).
    end_ns: Option<u64>,
    exited: bool,
    /// Its job and node, as named at its first call (never changed after: a name learnt
    /// later must not move it to another numbering). Where no name came first (`record`,
    /// which watches one node, names a process after its first call), both are empty.
    group: Option<(String, String)>,
    /// The numbering its steps are counted on: its first numbered marker call's.
    numbering: Option<NumberingKey>,
    /// Its communicator's numbering became its node's own (every rank there lost events):
    /// its steps were counted no further.
    renumbered: bool,
}

impl StepCounter {
    pub(super) fn new(steps: Steps) -> StepCounter {
        StepCounter {
            steps,
            numberings: HashMap::new(),
            processes: HashMap::new(),
            unnumbered: 0,
            last_step: 0,
            times: StepTimes::default(),
        }
    }

    /// A call of process `ev.pid` (named `name`, where known; its steps summed now are in
    /// the step table if `kept`) came: counted if it begins a step, and the step it begins
    /// returned.
    pub(super) fn call(
        &mut self,
        ev: &pb::CallEvent,
        name: Option<&super::ProcessName>,
        kept: bool,
    ) -> Option<u64> {
        let process = self.processes.entry(ev.pid).or_default();
        if process.exited {
            // Its pid is another process's now.
            *process = Begun::default();
        }
        if process.group.is_none() {
            process.group = Some(
                name.map(|n| (n.job.clone(), n.host.clone()))
                    .unwrap_or_default(),
            );
        }
        if !self.steps.marker.marks(ev) {
            return None;
        }
        let (job, node) = process.group.clone().unwrap_or_default();
        let step = match ev.seq {
            Some(seq) => {
                let key = NumberingKey {
                    job,
                    comm: ev.comm.clone(),
                    node: ev.seq_local.then_some(node),
                };
                match process.numbering.get_or_insert_with(|| key.clone()) {
                    mine if *mine == key => self.numbered_step(key, seq),
                    mine if mine.job == key.job && mine.comm == key.comm => {
                        // Its numbers count from elsewhere now: its steps cannot be told
                        // from here on, and its window ends (said in the summary).
                        if !process.renumbered {
                            process.renumbered = true;
                            process.end_ns.get_or_insert(ev.start_ns);
                            self.times.end(ev.pid, ev.start_ns);
                        }
                        None
                    }
                    // The marker on another of its communicators: its steps are counted on
                    // the first.
                    _ => None,
                }
            }
            None if self.steps.marker.is_collective() => {
                self.unnumbered += 1;
                None
            }
            None => {
                let process = self.processes.entry(ev.pid).or_default();
                process.calls += 1;
                Some(process.calls)
            }
        };
        let step = step?;
        self.last_step = self.last_step.max(step);
        let (from, to) = (self.steps.from, self.steps.to);
        let process = self.processes.entry(ev.pid).or_default();
        if step >= from && process.from_ns.is_none() {
            process.from_ns = Some(ev.start_ns);
        }
        if to.is_some_and(|t| step > t) && process.end_ns.is_none() {
            process.end_ns = Some(ev.start_ns);
        }
        let first = from.max(1);
        let tabled =
            (first..first.saturating_add(MAX_ROWS)).contains(&step) && to.is_none_or(|t| step <= t);
        let label = super::chrome::process_label(ev.pid, name).0;
        self.times.begin(ev, step, tabled, kept, label);
        Some(step)
    }

    /// Process `pid` is named `name` (`record` names its processes after their first calls).
    pub(super) fn named(&mut self, pid: u32, name: &super::ProcessName) {
        self.times
            .rename(pid, super::chrome::process_label(pid, Some(name)).0);
    }

    /// Call `ev`, kept by the trace's options, goes into its step's times.
    pub(super) fn account(&mut self, ev: &pb::CallEvent) {
        self.times.add(ev);
    }

    /// The step that the marker's instance `seq` of numbering `key` begins: 1 for the first
    /// instance of it seen, k for the k-th from there (None: before the first).
    fn numbered_step(&mut self, key: NumberingKey, seq: u64) -> Option<u64> {
        if !self.numberings.contains_key(&key) && self.numberings.len() >= MAX_NUMBERINGS {
            self.unnumbered += 1;
            return None;
        }
        let n = self.numberings.entry(key).or_insert_with(|| Numbering {
            origin: seq,
            recent: BTreeSet::new(),
            forgotten: 0,
        });
        let step = n.step(seq);
        if step.is_none() && seq >= n.origin {
            // Older than every instance kept: its stream is far behind the others'.
            self.unnumbered += 1;
        }
        step
    }

    /// Whether a call of `pid` that started at `start_ns` is in the steps asked for.
    pub(super) fn holds(&self, pid: u32, start_ns: u64) -> bool {
        let p = self.processes.get(&pid);
        let began = self.steps.from == 0
            || p.and_then(|p| p.from_ns)
                .is_some_and(|from| start_ns >= from);
        began && p.and_then(|p| p.end_ns).is_none_or(|end| start_ns < end)
    }

    /// Process `pid` exited: nothing more of its comes; its steps are in the table if
    /// `kept`.
    pub(super) fn exited(&mut self, pid: u32, kept: bool) {
        self.times.exited(pid, kept);
        if let Some(p) = self.processes.get_mut(&pid) {
            p.exited = true;
        }
    }

    /// With a last step: whether every process whose calls came (of those `kept`) has begun
    /// the step after it, or exited.
    pub(super) fn done(&self, kept: impl Fn(u32) -> bool) -> bool {
        let mut seen = self
            .processes
            .iter()
            .filter(|(pid, _)| kept(**pid))
            .peekable();
        self.steps.to.is_some()
            && seen.peek().is_some()
            && seen.all(|(_, p)| p.exited || p.end_ns.is_some())
    }

    /// How far the processes (of those `kept`) got, and each step's times (of those
    /// `tabled`).
    pub(super) fn reached(
        &self,
        kept: impl Fn(u32) -> bool,
        tabled: impl Fn(u32) -> bool,
    ) -> StepsReached {
        let seen = || {
            self.processes
                .iter()
                .filter(|(pid, _)| kept(**pid))
                .map(|(_, p)| p)
        };
        StepsReached {
            steps: self.steps.clone(),
            processes: seen().count() as u64,
            began: seen()
                .filter(|p| self.steps.from == 0 || p.from_ns.is_some())
                .count() as u64,
            ended: seen()
                .filter(|p| p.end_ns.is_some() && !p.renumbered)
                .count() as u64,
            unnumbered: self.unnumbered,
            renumbered: seen().filter(|p| p.renumbered).count() as u64,
            last_step: self.last_step,
            per_step: self.times.rows(tabled),
            unplaced: self.times.unplaced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::ProcessName;

    fn marker(pid: u32, start_ns: u64, seq: Option<u64>) -> pb::CallEvent {
        pb::CallEvent {
            pid,
            tid: pid,
            routine: "MPI_Allreduce".into(),
            start_ns,
            bytes: Some(4),
            comm: "world".into(),
            seq,
            ..Default::default()
        }
    }

    impl StepCounter {
        /// A call of a process of job `j`, whose numbers are its nodes' alike.
        fn call_as(&mut self, ev: &pb::CallEvent) -> Option<u64> {
            let name = ProcessName {
                rank: None,
                host: "n1".into(),
                job: "j".into(),
            };
            self.call(ev, Some(&name), true)
        }
    }

    fn counter(from: u64, to: Option<u64>, marker: &str) -> StepCounter {
        StepCounter::new(Steps {
            from,
            to,
            marker: marker.parse().expect("a marker"),
        })
    }

    /// Rank 1 was inside the marker's instance 10 when the trace began (not seen making
    /// it); rank 2 entered it after. Both begin step 2 at instance 15 (the marker's next:
    /// four other collectives between) and step 3 at 20.
    #[test]
    fn a_rank_inside_the_marker_when_the_trace_began_counts_its_steps_as_the_others() {
        let mut c = counter(2, Some(2), "MPI_Allreduce@4");
        c.call_as(&marker(2, 1_000, Some(10)));
        for (pid, at) in [(1, 2_000), (2, 2_010)] {
            c.call_as(&marker(pid, at, Some(15)));
        }
        for pid in [1, 2] {
            assert!(!c.holds(pid, 1_500), "{pid}: step 1");
            assert!(c.holds(pid, 2_500), "{pid}: step 2");
        }
        assert!(!c.done(|_| true));
        for (pid, at) in [(1, 3_000), (2, 3_010)] {
            c.call_as(&marker(pid, at, Some(20)));
        }
        for pid in [1, 2] {
            assert!(!c.holds(pid, 3_500), "{pid}: step 3");
        }
        assert!(c.done(|_| true));
        let r = c.reached(|_| true, |_| true);
        assert_eq!((r.processes, r.began, r.ended, r.unnumbered), (2, 2, 2, 0));
    }

    /// Instances before the first seen begin no step. Each communicator of each job counts
    /// its own, and each node where its numbers are the node's own. A marker that is no
    /// collective is counted by each process. Past the numbers kept, a step is still past
    /// the last.
    #[test]
    fn steps_are_numbered_per_communicator_of_a_job_and_by_process_for_other_markers() {
        let mut c = counter(1, Some(1), "MPI_Allreduce");
        let job = |job: &str, host: &str| ProcessName {
            rank: None,
            host: host.into(),
            job: job.into(),
        };
        let j1 = job("j1", "n1");
        c.call(&marker(1, 100, Some(5)), Some(&j1), true);
        c.call(&marker(2, 90, Some(4)), Some(&j1), true);
        c.call(
            &pb::CallEvent {
                comm: "c1".into(),
                ..marker(3, 110, Some(6))
            },
            Some(&j1),
            true,
        );
        c.call(&marker(4, 120, Some(2)), Some(&job("j2", "n1")), true);
        let local = |pid, host: &str, seq| {
            (
                pb::CallEvent {
                    seq_local: true,
                    ..marker(pid, 130, Some(seq))
                },
                job("j1", host),
            )
        };
        let (ev, name) = local(5, "n2", 40);
        c.call(&ev, Some(&name), true);
        for (pid, begun) in [(1, true), (2, false), (3, true), (4, true), (5, true)] {
            assert_eq!(c.holds(pid, 150), begun, "pid {pid}");
        }
        // Another node's own numbering: its first instance is its step 1 too (on n2's,
        // instance 41 would be step 2).
        let (ev, name) = local(6, "n3", 41);
        c.call(&ev, Some(&name), true);
        assert!(c.holds(6, 150));
        // Instances 6 and 7 of j1's world: steps 2 and 3.
        c.call(&marker(2, 200, Some(6)), Some(&j1), true);
        c.call(&marker(7, 210, Some(7)), Some(&j1), true);
        assert!(!c.holds(2, 250) && !c.holds(7, 250), "both past step 1");
        assert!(c.holds(1, 150) && !c.done(|_| true));
        let mut sends = counter(2, None, "MPI_Send");
        for at in [10, 20, 30] {
            sends.call(
                &pb::CallEvent {
                    routine: "MPI_Send".into(),
                    ..marker(3, at, None)
                },
                None,
                true,
            );
        }
        assert!(!sends.holds(3, 15) && sends.holds(3, 25) && sends.holds(3, 35));
        assert!(!sends.done(|_| true), "no last step");
    }

    /// With no last step, every step is told by its number, however many: the instances
    /// kept are the latest only.
    #[test]
    fn steps_past_the_numbers_kept_are_told_by_number() {
        let mut c = counter(0, None, "MPI_Allreduce");
        let n = 3 * RECENT_NUMBERS as u64;
        let steps: Vec<Option<u64>> = (0..n)
            .map(|i| c.call_as(&marker(1, 100 * i, Some(10 + 2 * i))))
            .collect();
        assert_eq!(steps, (1..=n).map(Some).collect::<Vec<_>>());
        // The other rank's calls of the latest instances come late: the same steps.
        assert_eq!(
            c.call_as(&marker(2, 100 * n, Some(10 + 2 * (n - 1)))),
            Some(n)
        );
        assert_eq!(
            c.call_as(&marker(2, 100 * n + 1, Some(10 + 2 * (n - 2)))),
            Some(n - 1)
        );
        // One older than every instance kept: its step is not known, and it is counted.
        assert_eq!(c.call_as(&marker(2, 100 * n + 2, Some(10))), None);
        let r = c.reached(|_| true, |_| true);
        assert_eq!(r.unnumbered, 1);
        assert!(r.to_string().contains(&format!("{n} steps marked")), "{r}");
    }

    /// A rank whose numbering became its node's own (events lost on every rank there)
    /// counts no further steps: its window ends at that call, and the summary says so.
    #[test]
    fn a_rank_renumbered_counts_no_further() {
        let mut c = counter(1, Some(5), "MPI_Allreduce");
        c.call_as(&marker(1, 100, Some(10)));
        assert!(c.holds(1, 150));
        c.call_as(&pb::CallEvent {
            seq_local: true,
            ..marker(1, 200, Some(3))
        });
        assert!(!c.holds(1, 250), "its window ended");
        let r = c.reached(|_| true, |_| true);
        assert_eq!((r.ended, r.renumbered), (0, 1));
        assert!(
            r.to_string()
                .contains("1 processes' steps were counted no further"),
            "{r}"
        );
    }

    /// A pid given to another process after an exit counts its steps anew.
    #[test]
    fn a_reused_pid_counts_anew() {
        let mut c = counter(1, Some(1), "MPI_Send");
        let send = |at| pb::CallEvent {
            routine: "MPI_Send".into(),
            ..marker(3, at, None)
        };
        c.call_as(&send(10));
        c.call_as(&send(20));
        assert!(!c.holds(3, 25));
        c.exited(3, true);
        assert!(c.done(|_| true));
        c.call_as(&send(30));
        assert!(c.holds(3, 35) && !c.done(|_| true));
    }
}
