//! One [`Tracker`] per MPI world: a node runs several jobs at once, and every job has its
//! own `MPI_COMM_WORLD`, so collective instances are matched within a job only.
//!
//! Which job a process belongs to is read from its environment after its first calls may
//! already have arrived: those wait here (bounded) until the process's job is known.

use std::collections::{HashMap, VecDeque};

use collector_common::CallEvent;
use tokio::sync::broadcast::error::RecvError;

use super::{late_sender::LateSenders, summary::Whois, CommKey, SkewReport, Tracker};
use crate::ingest::{FeedItem, FeedResult};

/// Calls kept per process whose job is not known yet; past this they are counted as lost.
const MAX_WAITING: usize = 1 << 14;
/// Processes whose calls may wait at once.
const MAX_WAITING_PROCS: usize = 1 << 12;

/// What became of a call given to [`Board::call`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Matched now; a collective's communicator and number where known.
    Now(Option<(CommKey, u64)>),
    /// Held until its process's job is known.
    Held,
}

/// A held call given back, with its communicator and number where known.
pub type Released = (CallEvent, Option<(CommKey, u64)>);

/// Trackers by job, fed from the call feed.
#[derive(Debug)]
pub struct Board {
    host: String,
    /// Whether instances with members on other nodes are kept for an aggregator.
    hand_on: bool,
    trackers: HashMap<String, Tracker>,
    world_of: HashMap<u32, String>,
    waiting: HashMap<u32, VecDeque<CallEvent>>,
    /// Calls that waited for a job that never became known, or past the caps.
    unplaced: u64,
    /// Sends paired with their receives, when every call comes (per-call events).
    late_senders: Option<LateSenders>,
}

impl Board {
    /// A board for processes on `host`.
    pub fn new(host: String) -> Board {
        Board {
            host,
            hand_on: false,
            trackers: HashMap::new(),
            world_of: HashMap::new(),
            waiting: HashMap::new(),
            unplaced: 0,
            late_senders: None,
        }
    }

    /// Also pairs every send with its receive (Late Sender): only where every call of the
    /// processes comes, numbered from `MPI_Init` (per-call events on from the start).
    pub fn with_late_senders(mut self) -> Board {
        self.late_senders = Some(LateSenders::default());
        self
    }

    /// Hands a call, as who-is-late placed it, to the Late Sender pairing.
    fn pair(&mut self, ev: &CallEvent, placed: Option<(CommKey, u64)>) {
        if let Some(ls) = self.late_senders.as_mut() {
            ls.call(&crate::trace::placed_call_event(ev, placed));
        }
    }

    /// Keeps the instances whose other members are on other nodes for
    /// [`Board::take_parts`] (a daemon that pushes to an aggregator); without it they are
    /// only counted as remote.
    pub fn hand_on_parts(&mut self) {
        self.hand_on = true;
    }

    /// Takes one item of the call feed.
    pub fn item(&mut self, item: FeedResult) {
        match item {
            Ok(FeedItem::Call(ev)) => {
                self.call(ev);
            }
            Ok(FeedItem::Exited(pid)) => {
                if let Some(t) = self.tracker_of(pid) {
                    t.exited(pid);
                    // The job's last process is gone: all its calls are in.
                    if t.idle() {
                        t.finish_matching();
                    }
                }
            }
            Err(RecvError::Lagged(n)) => {
                for t in self.trackers.values_mut() {
                    t.lost_by_reader(n);
                }
            }
            Err(RecvError::Closed) => {}
        }
    }

    /// Takes one call event: matched now (with, for a collective whose number is known,
    /// its communicator's shared name and that number), or held until its process's job
    /// is known (then [`Board::set_world`] gives it back).
    pub fn call(&mut self, ev: CallEvent) -> Taken {
        // A device window is no call of the thread's (nor numbered among them): nothing to
        // match, nothing to hold.
        if ev.kind != collector_common::EventKind::Call as u32 {
            return Taken::Now(None);
        }
        if let Some(t) = self.tracker_of(ev.tgid) {
            let placed = t.call(&ev);
            self.pair(&ev, placed);
            return Taken::Now(placed);
        }
        if !self.waiting.contains_key(&ev.tgid) && self.waiting.len() >= MAX_WAITING_PROCS {
            self.unplaced += 1;
            return Taken::Now(None);
        }
        let q = self.waiting.entry(ev.tgid).or_default();
        if q.len() >= MAX_WAITING {
            self.unplaced += 1;
            return Taken::Now(None);
        }
        q.push_back(ev);
        Taken::Held
    }

    fn tracker_of(&mut self, pid: u32) -> Option<&mut Tracker> {
        let world = self.world_of.get(&pid)?;
        self.trackers.get_mut(world)
    }

    /// Process `pid` belongs to job `world` (a key that groups the ranks of one MPI world
    /// on this node) of `size` ranks where known; calls that waited are taken now, and
    /// returned with what [`Board::call`] would have said of each.
    pub fn set_world(&mut self, pid: u32, world: &str, size: Option<u32>) -> Vec<Released> {
        // A process stays in the world it was first placed in.
        let world = self
            .world_of
            .entry(pid)
            .or_insert_with(|| world.to_string())
            .clone();
        let (host, hand_on) = (self.host.clone(), self.hand_on);
        let t = self.trackers.entry(world).or_insert_with(|| {
            let mut t = Tracker::new(host);
            t.hand_on = hand_on;
            t
        });
        if let Some(n) = size {
            t.world_size(pid, n);
        }
        let released: Vec<Released> = self
            .waiting
            .remove(&pid)
            .into_iter()
            .flatten()
            .map(|ev| {
                let placed = t.call(&ev);
                (ev, placed)
            })
            .collect();
        for (ev, placed) in &released {
            self.pair(ev, *placed);
        }
        released
    }

    /// Whether the job of `pid` is known.
    pub fn knows(&self, pid: u32) -> bool {
        self.world_of.contains_key(&pid)
    }

    /// Closes instances nobody arrived at for a while.
    pub fn tick(&mut self) {
        for t in self.trackers.values_mut() {
            t.tick();
        }
    }

    /// Forgets the processes `keep` says no longer matter, and jobs left with none.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.world_of.retain(|pid, _| keep(*pid));
        let unplaced = &mut self.unplaced;
        self.waiting.retain(|pid, q| {
            let k = keep(*pid);
            if !k {
                *unplaced += q.len() as u64;
            }
            k
        });
        let live: std::collections::HashSet<&String> = self.world_of.values().collect();
        self.trackers.retain(|w, _| live.contains(w));
        if let Some(ls) = self.late_senders.as_mut() {
            ls.retain(&keep);
        }
    }

    /// Aligns and closes everything (no more calls will come); returns the calls still
    /// held (their process's job never became known: not matched).
    pub fn finish(&mut self) -> Vec<Released> {
        let held: Vec<Released> = self
            .waiting
            .drain()
            .flat_map(|(_, q)| q)
            .map(|ev| (ev, None))
            .collect();
        self.unplaced += held.len() as u64;
        for (ev, _) in &held {
            self.pair(ev, None);
        }
        for t in self.trackers.values_mut() {
            t.finish_matching();
        }
        held
    }

    /// The instances every job's trackers handed on since last asked (their other
    /// members are on other nodes).
    pub fn take_parts(&mut self) -> Vec<super::instances::Instance> {
        self.trackers
            .values_mut()
            .flat_map(super::Tracker::take_parts)
            .collect()
    }

    /// The report of the job that `pids` belong to (the first whose job is known), with
    /// processes named by `whois`.
    pub fn report_for(&self, pids: &[u32], whois: Whois) -> Option<SkewReport> {
        let world = pids.iter().find_map(|p| self.world_of.get(p))?;
        let mut r = self.trackers.get(world)?.report(whois);
        r.unidentified += self.unplaced;
        r.late_sender = self.late_senders.as_ref().map(|ls| ls.report(whois));
        Some(r)
    }
}
