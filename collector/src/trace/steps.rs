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
}

impl std::fmt::Display for StepsReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.steps;
        let to = s.to.map_or(String::new(), |t| t.to_string());
        if self.processes == 0 {
            write!(f, "steps {}..{to}: no process's calls came", s.from)?;
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
                " ({} calls of {} began no step: collectives not numbered yet)",
                self.unnumbered, s.marker
            )?;
        }
        Ok(())
    }
}

/// Each process's steps, counted as its calls come.
#[derive(Debug)]
pub(super) struct StepCounter {
    steps: Steps,
    /// Where a collective marker's instances are counted from.
    origin: Option<Origin>,
    /// The instance numbers of the marker seen from the origin on (at most `cap()`).
    numbers: BTreeSet<u64>,
    processes: HashMap<u32, Begun>,
    unnumbered: u64,
}

/// The first numbered marker call seen: its communicator and number. Numbers on other
/// communicators are not counted (they are not comparable).
#[derive(Debug)]
struct Origin {
    comm: String,
    seq: u64,
}

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
}

impl StepCounter {
    pub(super) fn new(steps: Steps) -> StepCounter {
        StepCounter {
            steps,
            origin: None,
            numbers: BTreeSet::new(),
            processes: HashMap::new(),
            unnumbered: 0,
        }
    }

    /// The steps asked for.
    pub(super) fn steps(&self) -> &Steps {
        &self.steps
    }

    /// Numbers beyond this many are not kept: only whether a step is past `to` (or has
    /// reached `from`) matters.
    fn cap(&self) -> usize {
        let last = self
            .steps
            .to
            .map_or(self.steps.from, |t| t.saturating_add(1));
        usize::try_from(last.max(self.steps.from)).unwrap_or(usize::MAX)
    }

    /// A call of process `ev.pid` came: counted if it begins a step.
    pub(super) fn call(&mut self, ev: &pb::CallEvent) {
        let process = self.processes.entry(ev.pid).or_default();
        if process.exited {
            // Its pid is another process's now.
            *process = Begun::default();
        }
        if !self.steps.marker.marks(ev) {
            return;
        }
        let step = match ev.seq {
            Some(seq) => self.numbered_step(&ev.comm, seq),
            None if super::routine(&ev.routine)
                .is_some_and(|r| r.spec.class == collector_common::routines::class::COLLECTIVE) =>
            {
                self.unnumbered += 1;
                None
            }
            None => {
                let process = self.processes.entry(ev.pid).or_default();
                process.calls += 1;
                Some(process.calls)
            }
        };
        let Some(step) = step else { return };
        let (from, to) = (self.steps.from, self.steps.to);
        let process = self.processes.entry(ev.pid).or_default();
        if step >= from && process.from_ns.is_none() {
            process.from_ns = Some(ev.start_ns);
        }
        if to.is_some_and(|t| step > t) && process.end_ns.is_none() {
            process.end_ns = Some(ev.start_ns);
        }
    }

    /// The step that the marker's instance `seq` on `comm` begins: 1 for the first instance
    /// seen, k for the k-th from there (None: before the first, or on another communicator).
    fn numbered_step(&mut self, comm: &str, seq: u64) -> Option<u64> {
        let origin = self.origin.get_or_insert_with(|| Origin {
            comm: comm.to_string(),
            seq,
        });
        if origin.comm != comm || seq < origin.seq {
            return None;
        }
        if self.numbers.len() < self.cap() {
            self.numbers.insert(seq);
        }
        Some(self.numbers.range(..seq).count() as u64 + 1)
    }

    /// Whether a call of `pid` that started at `start_ns` is in the steps asked for.
    pub(super) fn holds(&self, pid: u32, start_ns: u64) -> bool {
        let p = self.processes.get(&pid);
        let began = self.steps.from == 0
            || p.and_then(|p| p.from_ns)
                .is_some_and(|from| start_ns >= from);
        began && p.and_then(|p| p.end_ns).is_none_or(|end| start_ns < end)
    }

    /// Process `pid` exited: nothing more of its comes.
    pub(super) fn exited(&mut self, pid: u32) {
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

    /// How far the processes (of those `kept`) got.
    pub(super) fn reached(&self, kept: impl Fn(u32) -> bool) -> StepsReached {
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
            ended: seen().filter(|p| p.end_ns.is_some()).count() as u64,
            unnumbered: self.unnumbered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        c.call(&marker(2, 1_000, Some(10)));
        for (pid, at) in [(1, 2_000), (2, 2_010)] {
            c.call(&marker(pid, at, Some(15)));
        }
        for pid in [1, 2] {
            assert!(!c.holds(pid, 1_500), "{pid}: step 1");
            assert!(c.holds(pid, 2_500), "{pid}: step 2");
        }
        assert!(!c.done(|_| true));
        for (pid, at) in [(1, 3_000), (2, 3_010)] {
            c.call(&marker(pid, at, Some(20)));
        }
        for pid in [1, 2] {
            assert!(!c.holds(pid, 3_500), "{pid}: step 3");
        }
        assert!(c.done(|_| true));
        let r = c.reached(|_| true);
        assert_eq!((r.processes, r.began, r.ended, r.unnumbered), (2, 2, 2, 0));
    }

    /// Instances before the first seen, and on another communicator, begin no step; a
    /// marker that is no collective is counted by each process; past the numbers kept, a
    /// step is still past the last.
    #[test]
    fn steps_are_counted_on_one_communicator_and_by_process_for_other_markers() {
        let mut c = counter(1, Some(1), "MPI_Allreduce");
        c.call(&marker(1, 100, Some(5)));
        c.call(&marker(2, 90, Some(4)));
        c.call(&pb::CallEvent {
            comm: "c1".into(),
            ..marker(2, 110, Some(6))
        });
        assert!(
            c.holds(1, 150) && !c.holds(2, 150),
            "only pid 1 began step 1"
        );
        for (i, seq) in (6..12).enumerate() {
            c.call(&marker(2, 200 + i as u64, Some(seq)));
        }
        assert!(
            !c.holds(2, 300),
            "pid 2 is past step 1: its first seen was step 2"
        );
        let mut sends = counter(2, None, "MPI_Send");
        for at in [10, 20, 30] {
            sends.call(&pb::CallEvent {
                routine: "MPI_Send".into(),
                ..marker(3, at, None)
            });
        }
        assert!(!sends.holds(3, 15) && sends.holds(3, 25) && sends.holds(3, 35));
        assert!(!sends.done(|_| true), "no last step");
    }

    /// A pid given to another process after an exit counts its steps anew.
    #[test]
    fn a_reused_pid_counts_anew() {
        let mut c = counter(1, Some(1), "MPI_Send");
        let send = |at| pb::CallEvent {
            routine: "MPI_Send".into(),
            ..marker(3, at, None)
        };
        c.call(&send(10));
        c.call(&send(20));
        assert!(!c.holds(3, 25));
        c.exited(3);
        assert!(c.done(|_| true));
        c.call(&send(30));
        assert!(c.holds(3, 35) && !c.done(|_| true));
    }
}
