//! Who is late: every collective call placed on its *instance* (its communicator and its
//! number there), the members' arrivals compared, the rank the others waited for named (the
//! last to arrive; at a collective with a root, as its data flows: [`summary::Verdict`]).
//!
//! The flow: call events (the same feed a trace reads) → [`identity`] names the call's
//! communicator alike in every member → [`instances`] numbers each member's calls on it and
//! matches the numbers across members → [`summary`] turns finished instances into the
//! report (`skew` in the profile, "Who is late" in the text).

pub mod bench;
pub mod board;
pub mod identity;
pub mod instances;
pub mod late_sender;
pub mod summary;

use std::collections::{HashMap, HashSet};

use collector_common::{
    routines::{class, Family},
    ByteRule, CallEvent, ROUTINES,
};

pub use board::Board;
pub use identity::CommKey;
pub use summary::SkewReport;

use identity::ProcComms;
use instances::{Arrival, Collective, Instance, Matcher};
use summary::{Summary, Whois};

/// What who-is-late knows of a call: its communicator's name, alike in every member, and
/// for a collective its number on that communicator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The communicator's shared name, where its creation (or the world) was seen.
    pub comm: Option<CommKey>,
    /// A collective's instance number on it, where known.
    pub seq: Option<u64>,
    /// Whether `seq` counts from where this node began watching the communicator (the
    /// same on this node's ranks only), not from its creation.
    pub seq_local: bool,
}

impl Placement {
    /// A call on `comm`, numbered by nothing.
    fn on(comm: Option<CommKey>) -> Placement {
        Placement {
            comm,
            seq: None,
            seq_local: false,
        }
    }
}

/// The hash maps of who is late's per-event path, keyed by what the kernel numbers (pids,
/// threads), by our own communicator names, and by job names (a launcher's environment):
/// foldhash, seeded at random per process (no key can be picked to collide without the
/// seed), where SipHash took a quarter of the path's time (`commtap bench-matching`). Maps
/// keyed by what a process passes freely at every call (its communicator handles) keep
/// SipHash.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A [`FastMap`]'s set.
pub(crate) type FastSet<K> = HashSet<K, foldhash::fast::RandomState>;

/// Instances kept for the aggregator between two pushes.
const MAX_PARTS: usize = 1 << 16;

/// Threads whose event numbers are followed; past this the table starts again (a gap is
/// then missed until the next one, never invented).
const MAX_THREADS: usize = 1 << 16;

/// Matches the collective calls of a feed of call events into instances.
#[derive(Debug)]
pub struct Tracker {
    host: String,
    /// Processes whose `MPI_Init` was seen: their count of world collectives is the
    /// instance number (others are aligned by time).
    init_seen: FastSet<u32>,
    procs: FastMap<u32, ProcComms>,
    /// In the names of communicators counted since the attach
    /// ([`CommKey::child_since_attach`]): another daemon's (or another job's) are never
    /// these.
    daemon_number: u64,
    /// The communicator names of processes that exited, or of a detached process's run
    /// before its last detach, while their profile is still wanted (forgotten by
    /// [`Tracker::forget`]; a run's names are looked up only where the process's current
    /// run does not follow: the kernel forgot the handles it knew at the detach).
    gone: FastMap<u32, ProcComms>,
    /// Processes detached or watched again ([`Tracker::detached`]): which of this
    /// tracker's detaches was their last ([`ProcComms::after_detach`]).
    detaches_of: FastMap<u32, u32>,
    /// Detaches so far.
    detaches: u32,
    /// Per (process, thread): the event number expected next.
    threads: FastMap<(u32, u32), u32>,
    matcher: Matcher,
    summary: Summary,
    finished: Vec<Instance>,
    unidentified: u64,
    lost: u64,
    /// Instances whose other members are on other nodes, for the aggregator (oldest
    /// dropped past [`MAX_PARTS`]: the aggregator then counts them incomplete).
    parts: std::collections::VecDeque<Instance>,
    /// Whether parts are kept (an aggregator takes them); else only counted as remote.
    pub hand_on: bool,
    /// Sends paired with their receives (Late Sender), where every call comes.
    pub late_senders: Option<late_sender::LateSenders>,
    /// World sizes from the launchers' environment, for calls whose communicator size the
    /// kernel does not know (MPICH's world when attached after `MPI_Comm_size`).
    world_sizes: FastMap<u32, u32>,
}

impl Tracker {
    /// A tracker for processes on `host`.
    pub fn new(host: String) -> Tracker {
        Tracker {
            host,
            daemon_number: CommKey::draw_daemon_number(),
            init_seen: Default::default(),
            procs: FastMap::default(),
            gone: FastMap::default(),
            detaches_of: FastMap::default(),
            detaches: 0,
            threads: FastMap::default(),
            matcher: Matcher::default(),
            summary: Summary::default(),
            finished: Vec::new(),
            unidentified: 0,
            lost: 0,
            world_sizes: FastMap::default(),
            parts: Default::default(),
            hand_on: false,
            late_senders: None,
        }
    }

    /// Takes one call event; returns its communicator's shared name where known, and for
    /// a collective its number there. Late Sender, where on, pairs it (per job: two jobs'
    /// messages are numbered alike).
    pub fn call(&mut self, ev: &CallEvent) -> Placement {
        let placement = self.place(ev);
        if let Some(ls) = self.late_senders.as_mut() {
            ls.call(&crate::trace::placed_call_event(ev, placement));
        }
        placement
    }

    /// Takes one arrival event (`EventKind::Arrival`): Late Sender, where on, pairs the
    /// message it names with the wait it arrived in.
    pub fn arrival(&mut self, ev: &CallEvent) {
        if let Some(ls) = self.late_senders.as_mut() {
            ls.call(&crate::trace::call_event(ev));
        }
    }

    fn place(&mut self, ev: &CallEvent) -> Placement {
        self.follow_thread(ev);
        let Some(routine) = ROUTINES.get(ev.routine as usize) else {
            return Placement::default();
        };
        let nccl = routine.family() == Family::Nccl;
        let detaches_of = &self.detaches_of;
        let procs = self
            .procs
            .entry(ev.tgid)
            .or_insert_with(|| ProcComms::after_detach(detaches_of.get(&ev.tgid).copied()));
        if ByteRule::from_u8(routine.spec.rule).creates_comm() {
            let parent = procs.name(ev, false);
            let by_host = routine.name == "MPI_Comm_split_type";
            procs.created(ev, by_host, &self.host, self.daemon_number);
            return Placement::on(parent);
        }
        if routine.spec.class == class::INIT {
            // Every world collective after it is seen: counting them numbers them.
            self.init_seen.insert(ev.tgid);
            return Placement::default();
        }
        if routine.spec.class != class::COLLECTIVE {
            // Named all the same, so that both ends of a message name its communicator
            // alike (a trace's arrows, Late Sender).
            return Placement::on(procs.name(ev, nccl));
        }
        let Some((comm, made_while_watched)) = procs.named(ev, nccl) else {
            self.unidentified += 1;
            return Placement::default();
        };
        // The kernel's number, where it counted the communicator's instances from its
        // creation: then only the instances it draws come (`collector_common::instances`).
        let number = ev.instance();
        let from_start =
            number.is_some() || made_while_watched || self.init_seen.contains(&ev.tgid);
        let size = match ev.comm_size {
            0 if comm == CommKey::WORLD => self.world_sizes.get(&ev.tgid).copied().unwrap_or(0),
            n => n,
        };
        let seq = self.matcher.arrive(
            Collective {
                comm,
                size,
                routine: ev.routine,
                bucket: ev.bucket,
                nonblocking: routine.name.starts_with("MPI_I"),
                from_start,
                number,
                arrival: Arrival {
                    pid: ev.tgid,
                    start_ns: ev.start_ns,
                    end_ns: ev.start_ns + ev.dur_ns,
                    // An intercommunicator's receivers name a root of the other group,
                    // whose rank one of them may share; its collectives never get here
                    // (made by MPI_Intercomm_create, unnamed, they count as unidentified).
                    root: ev.peer >= 0 && ev.peer == ev.comm_rank,
                },
            },
            &mut self.finished,
        );
        self.take_finished();
        Placement {
            comm: Some(comm),
            seq,
            seq_local: seq.is_some() && !self.matcher.numbered_from_start(comm),
        }
    }

    /// Process `pid` belongs to a world of `size` ranks (its launcher says).
    pub fn world_size(&mut self, pid: u32, size: u32) {
        self.world_sizes.insert(pid, size);
    }

    /// The reader fell behind and `n` events were lost, from processes unknown: every
    /// process's numbering is realigned.
    pub fn lost_by_reader(&mut self, n: u64) {
        self.lost += n;
        for (&pid, comms) in &mut self.procs {
            self.matcher.lost(pid);
            comms.events_lost();
        }
    }

    /// Process `pid` exited: what was learnt of its communicators goes, but for their names
    /// (its profile still names them).
    pub fn exited(&mut self, pid: u32) {
        self.world_sizes.remove(&pid);
        // Its pid may be another process's from now on.
        self.detaches_of.remove(&pid);
        self.stop_following(pid);
        if let Some(ls) = self.late_senders.as_mut() {
            ls.exited(pid);
        }
    }

    /// Process `pid` was detached, or is watched again after it: its calls from now on do
    /// not go on from those before. Its collectives are aligned by time again (the kernel's
    /// counts start again; its `MPI_Init` is long past), its communicators are named anew,
    /// the names it counts since from this detach, its own (its node's other ranks saw
    /// what it did not), and its messages are no longer numbered (Late Sender).
    pub fn detached(&mut self, pid: u32) {
        self.stop_following(pid);
        self.matcher.detached(pid);
        self.detaches = self.detaches.wrapping_add(1);
        self.detaches_of.insert(pid, self.detaches);
        if let Some(ls) = self.late_senders.as_mut() {
            ls.detached(pid);
        }
    }

    /// What was learnt of `pid`'s communicators goes, but for their names (its profile
    /// still names them).
    fn stop_following(&mut self, pid: u32) {
        if let Some(comms) = self.procs.remove(&pid) {
            self.gone.insert(pid, comms);
        }
        self.init_seen.remove(&pid);
        self.threads.retain(|(p, _), _| *p != pid);
    }

    /// The name of communicator `handle` of generation `gen` (`CommInfo::gen`) of process
    /// `pid` (running or exited), where its creation was seen.
    pub fn comm_name(&self, pid: u32, handle: u64, gen: u16) -> Option<CommKey> {
        self.procs
            .get(&pid)
            .or_else(|| self.gone.get(&pid))?
            .of_handle(handle, gen)
    }

    /// Forgets the names of exited (or detached) processes `keep` no longer keeps.
    pub fn forget(&mut self, keep: impl Fn(u32) -> bool) {
        self.gone.retain(|pid, _| keep(*pid));
        self.detaches_of.retain(|pid, _| keep(*pid));
    }

    /// Whether no process it followed is still running.
    pub fn idle(&self) -> bool {
        self.procs.is_empty()
    }

    /// Closes instances nobody arrived at for a while (call now and then).
    pub fn tick(&mut self) {
        self.matcher.expire(&mut self.finished);
        self.take_finished();
    }

    /// Aligns what can be and closes every open instance (no more calls will come).
    pub fn finish_matching(&mut self) {
        self.matcher.finish(&mut self.finished);
        self.take_finished();
    }

    /// The report of the instances finished so far; a rank's highest instance number is
    /// the higher of the one its calls reached and the one `entered` says it entered.
    pub fn report(&self, whois: Whois, entered: &dyn Fn(u32) -> Option<u64>) -> SkewReport {
        let seq = |pid| self.matcher.highest_seq(pid).max(entered(pid));
        self.summary.report(
            self.matcher.counts,
            self.unidentified,
            self.lost,
            whois,
            &seq,
        )
    }

    fn take_finished(&mut self) {
        for inst in self.finished.drain(..) {
            self.summary.add(&inst);
            if self.hand_on && inst.is_remote() {
                if self.parts.len() >= MAX_PARTS {
                    self.parts.pop_front();
                }
                self.parts.push_back(inst);
            }
        }
    }

    /// The instances handed on since last asked (their other members are on other nodes).
    pub fn take_parts(&mut self) -> Vec<Instance> {
        self.parts.drain(..).collect()
    }

    /// Notices events missing between a thread's events (a full ring buffer).
    fn follow_thread(&mut self, ev: &CallEvent) {
        if self.threads.len() >= MAX_THREADS {
            self.threads.clear();
        }
        let next = ev.thread_seq.wrapping_add(1);
        if let Some(expected) = self.threads.insert((ev.tgid, ev.tid), next) {
            if expected != ev.thread_seq {
                self.lost += u64::from(ev.thread_seq.wrapping_sub(expected));
                self.matcher.lost(ev.tgid);
                if let Some(comms) = self.procs.get_mut(&ev.tgid) {
                    comms.events_lost();
                }
            }
        }
    }
}

/// Call events for the tests.
#[cfg(test)]
pub(crate) mod test_events {
    use collector_common::{comm_id, routines::routine_id, CallEvent, EventKind};

    /// MPICH's handle of `MPI_COMM_WORLD`.
    pub const WORLD: u64 = 0x4400_0000;

    /// Process `pid`'s call of `routine` (its own thread) on communicator handle `comm`,
    /// making `created`; `thread_seq`: its thread's event number.
    pub fn call(pid: u32, routine: &str, comm: u64, created: u64, thread_seq: u32) -> CallEvent {
        CallEvent {
            kind: EventKind::Call as u32,
            tgid: pid,
            tid: pid,
            routine: routine_id(routine).expect("a routine"),
            comm,
            comm_id: if comm == WORLD { comm_id::WORLD } else { 0 },
            created,
            thread_seq,
            ..CallEvent::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_events::{call, WORLD};

    /// Process `pid`'s call of `routine` on the world of 2, the `i`-th of the job's (10 ms
    /// apart), started `late` ns into it; `seq`: its thread's event number.
    fn world_call(pid: u32, routine: &str, i: u64, late: u64, seq: u32) -> CallEvent {
        CallEvent {
            comm_size: 2,
            start_ns: i * 10_000_000 + late,
            dur_ns: 5_000_000 - late,
            ..call(pid, routine, WORLD, 0, seq)
        }
    }

    /// Rank 0 (pid 1) comes 2 ms late to every barrier. Rank 1 (pid 2) is detached after
    /// the 40th and watched again from the 60th: counted on from its `MPI_Init`, its
    /// calls would be taken for barriers 41 on, and rank 1 for the one 190 ms late. Told of
    /// the detach, its calls are aligned by time with rank 0's again.
    #[test]
    fn a_process_watched_again_after_a_detach_is_aligned_anew() {
        let mut t = Tracker::new("h".into());
        for pid in [1, 2] {
            t.call(&world_call(pid, "MPI_Init", 0, 0, 0));
        }
        let mut seq = [1u32; 2];
        for i in 1..=100u64 {
            if i == 41 {
                t.detached(2);
            }
            if i == 60 {
                // Watched again: its calls from now on do not go on from before.
                t.detached(2);
            }
            for (pid, late) in [(1u32, 2_000_000), (2, 0)] {
                if pid == 2 && (41..60).contains(&i) {
                    continue;
                }
                let s = &mut seq[pid as usize - 1];
                t.call(&world_call(pid, "MPI_Barrier", i, late, *s));
                *s += 1;
            }
        }
        t.finish_matching();
        let whois = |pid: u32| Some((pid - 1, "h".to_string()));
        let report = t.report(&whois, &|_| None);
        assert_eq!(t.matcher.counts.conflicts, 0, "{report:?}");
        // Barriers 1..=40 and 60..=100, every one with rank 0 last by 2 ms.
        assert_eq!(report.instances, 81, "{report:?}");
        let rank0 = report.ranks.iter().find(|r| r.rank == 0).expect("rank 0");
        assert_eq!((rank0.instances, rank0.last), (81, 81), "{report:?}");
        assert!(
            report.worst.iter().all(|w| w.skew_ns == 2_000_000),
            "{:?}",
            report.worst
        );
    }
}
