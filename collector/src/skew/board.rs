//! One [`Tracker`] per MPI world: a node runs several jobs at once, and every job has its
//! own `MPI_COMM_WORLD`, so collective instances are matched within a job only.
//!
//! Which job a process belongs to is read from its environment after its first calls may
//! already have arrived: those wait here (bounded) until the process's job is known.

use std::collections::VecDeque;

use collector_common::CallEvent;
use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use tokio::sync::{broadcast::error::RecvError, mpsc};

use super::{
    late_sender::{Half, LateSenderReport, LateSenders},
    summary::Whois,
    FastMap, FastSet, Placement, SkewReport, Tracker,
};
use crate::ingest::{FeedItem, FeedResult};

/// Calls kept per process whose job is not known yet; past this they are counted as lost.
const MAX_WAITING: usize = 1 << 14;
/// Processes whose calls may wait at once.
const MAX_WAITING_PROCS: usize = 1 << 12;

/// What became of a call given to [`Board::call`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Matched now: its communicator's name and a collective's number, where known.
    Now(Placement),
    /// Held until its process's job is known.
    Held,
}

/// A held call given back, with its communicator's name and number where known.
pub type Released = (CallEvent, Placement);

/// Calls one [`PlacedFeed`] subscriber may have waiting: past it, it loses them (counted).
pub const PLACED_QUEUE: usize = 1 << 16;

/// Who the placed calls go to: one bounded queue per subscriber (a StreamEvents caller),
/// which takes memory only for the calls waiting in it; a subscriber that falls behind
/// loses calls and is told how many.
#[derive(Debug, Default)]
pub struct PlacedFeed {
    subscribers: std::sync::Mutex<Vec<Subscriber>>,
}

#[derive(Debug)]
struct Subscriber {
    tx: mpsc::Sender<PlacedItem>,
    lost: Arc<AtomicU64>,
}

impl PlacedFeed {
    /// A new subscriber's queue, and how many calls it lost so far.
    pub fn subscribe(&self) -> (mpsc::Receiver<PlacedItem>, Arc<AtomicU64>) {
        let (tx, rx) = mpsc::channel(PLACED_QUEUE);
        let lost = Arc::new(AtomicU64::new(0));
        self.lock().push(Subscriber {
            tx,
            lost: lost.clone(),
        });
        (rx, lost)
    }

    /// Hands `item` to every subscriber (forgetting those that went away).
    pub fn send(&self, item: PlacedItem) {
        self.lock().retain(|s| match s.tx.try_send(item) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                let n = match item {
                    PlacedItem::Lost(n) => n,
                    _ => 1,
                };
                s.lost.fetch_add(n, Ordering::Relaxed);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }

    /// Whether anyone subscribes.
    fn wanted(&self) -> bool {
        !self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Subscriber>> {
        self.subscribers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The call feed as who-is-late passes it on: each call with its placement (a node
/// daemon's `StreamEvents`, so that traces taken from it show communicators and numbers
/// as `record`'s do).
#[derive(Clone, Copy, Debug)]
pub enum PlacedItem {
    /// A call, and what who-is-late knows of it.
    Call(CallEvent, Placement),
    /// A process exited: its calls, held ones included, came before.
    Exited(u32),
    /// Calls the board's reader of the feed fell behind by (lost to every stream).
    Lost(u64),
    /// A process was detached, or is watched again after it
    /// ([`crate::ingest::FeedItem::Detached`]): its calls before and after are not one run.
    Detached(u32),
}

/// Hands `item` to the subscribers of `feed`, if there is one and anyone subscribes.
fn pass_on_to(feed: Option<&Arc<PlacedFeed>>, item: PlacedItem) {
    if let Some(feed) = feed.filter(|f| f.wanted()) {
        feed.send(item);
    }
}

/// What waits for its process's job to be known: a call, or the detach between two of its
/// calls (applied in its place when they are taken).
#[derive(Clone, Copy, Debug)]
enum Held {
    Call(CallEvent),
    Detached,
}

/// A process as the board knows it: its pid and its start (clock ticks since boot), which
/// tell it from a later process given the same pid.
pub type Proc = (u32, u64);

/// Where the process given a pid was placed.
#[derive(Debug)]
struct Placed {
    /// Its job's world.
    world: String,
    /// Its start (clock ticks since boot).
    start: u64,
    /// Its exit came: calls of its pid from now on are another process's.
    exited: bool,
}

/// Trackers by job, fed from the call feed.
#[derive(Debug)]
pub struct Board {
    host: String,
    /// Whether instances with members on other nodes are kept for an aggregator.
    hand_on: bool,
    trackers: FastMap<String, Tracker>,
    /// By pid, the process placed under it last.
    world_of: FastMap<u32, Placed>,
    /// The worlds of exited processes whose pid another process was placed under since,
    /// and the highest collective instance each was seen to enter: their jobs' reports
    /// still find them (until [`Board::retain`] lets them go).
    earlier: FastMap<Proc, (String, Option<u64>)>,
    waiting: FastMap<u32, VecDeque<Held>>,
    /// Calls that waited for a job that never became known, or past the caps.
    unplaced: u64,
    /// Whether sends are paired with their receives (each job's tracker does it), when
    /// every call comes (per-call events).
    late_senders: bool,
    /// Where placed calls are passed on, if anywhere.
    forward: Option<Arc<PlacedFeed>>,
    /// Processes that exited while calls of theirs were held: their exit is passed on
    /// after those calls.
    exited_while_held: FastSet<u32>,
    /// Per process of a known job: the highest collective instance number the kernel saw
    /// it enter (its calls tell only those it returned from), and when that was read.
    entered: FastMap<u32, u64>,
    entered_read: Option<std::time::Instant>,
}

impl Board {
    /// A board for processes on `host`.
    pub fn new(host: String) -> Board {
        Board {
            host,
            hand_on: false,
            trackers: FastMap::default(),
            world_of: FastMap::default(),
            earlier: FastMap::default(),
            waiting: FastMap::default(),
            unplaced: 0,
            late_senders: false,
            forward: None,
            exited_while_held: FastSet::default(),
            entered: FastMap::default(),
            entered_read: None,
        }
    }

    /// Passes every call on to `tx` once placed (held calls when given back).
    pub fn forward_to(mut self, feed: Arc<PlacedFeed>) -> Board {
        self.forward = Some(feed);
        self
    }

    fn pass_on(&self, item: PlacedItem) {
        pass_on_to(self.forward.as_ref(), item);
    }

    /// A call leaves the board, to whoever it is passed on to.
    fn placed(&self, ev: &CallEvent, placement: Placement) {
        self.pass_on(PlacedItem::Call(*ev, placement));
    }

    /// What `pid` has held leaves the board unplaced (its job never became known), in its
    /// order: its calls (counted, and returned) and detaches, then its exit if it came.
    fn unplace_all(&mut self, pid: u32) -> Vec<CallEvent> {
        let mut calls = Vec::new();
        for held in self.waiting.remove(&pid).into_iter().flatten() {
            match held {
                Held::Call(ev) => {
                    self.unplaced += 1;
                    self.placed(&ev, Placement::default());
                    calls.push(ev);
                }
                Held::Detached => self.pass_on(PlacedItem::Detached(pid)),
            }
        }
        self.released(pid);
        calls
    }

    /// The held calls of `pid` have left the board: its exit may be passed on now.
    fn released(&mut self, pid: u32) {
        if self.exited_while_held.remove(&pid) {
            self.pass_on(PlacedItem::Exited(pid));
        }
    }

    /// Also pairs every send with its receive (Late Sender): only where every call of the
    /// processes comes, numbered from `MPI_Init` (per-call events on from the start).
    pub fn with_late_senders(mut self) -> Board {
        self.late_senders = true;
        self
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
                if self.waiting.contains_key(&pid) {
                    self.exited_while_held.insert(pid);
                } else {
                    self.pass_on(PlacedItem::Exited(pid));
                }
                self.ended(pid);
            }
            Ok(FeedItem::Detached(pid)) => {
                // The kernel's counts start again: those read before are another run's.
                self.entered.remove(&pid);
                if self
                    .waiting
                    .get(&pid)
                    .is_some_and(|q| q.len() >= MAX_WAITING)
                {
                    // Full: its calls since went on unplaced, so the detach cannot wait
                    // behind the held ones; those go now, unplaced, and the detach after.
                    self.unplace_all(pid);
                    self.pass_on(PlacedItem::Detached(pid));
                } else if let Some(q) = self.waiting.get_mut(&pid) {
                    // Between its held calls: applied in its place (two with no call between
                    // them are one: the queue stays bounded).
                    if !matches!(q.back(), Some(Held::Detached)) {
                        q.push_back(Held::Detached);
                    }
                } else if let Some(t) = self.tracker_of(pid) {
                    t.detached(pid);
                    self.pass_on(PlacedItem::Detached(pid));
                } else if self.waiting.len() < MAX_WAITING_PROCS {
                    // Applied once its job is known.
                    self.waiting.insert(pid, VecDeque::from([Held::Detached]));
                } else {
                    // Past the cap: its names counted since the attach may be taken for its
                    // node's others'; the streams are told all the same.
                    self.pass_on(PlacedItem::Detached(pid));
                }
            }
            Err(RecvError::Lagged(n)) => {
                for t in self.trackers.values_mut() {
                    t.lost_by_reader(n);
                }
                self.pass_on(PlacedItem::Lost(n));
            }
            Err(RecvError::Closed) => {}
        }
    }

    /// Takes one call event: matched now (with, for a collective whose number is known,
    /// its communicator's shared name and that number), or held until its process's job
    /// is known (then [`Board::set_world`] gives it back).
    pub fn call(&mut self, ev: CallEvent) -> Taken {
        // A device window or an arrival is no call of the thread's (nor numbered among
        // them): nothing to match. An arrival waits with its process's calls, though: a
        // trace must see the receive it names first.
        if ev.kind != collector_common::EventKind::Call as u32 {
            let holds = ev.kind == collector_common::EventKind::Arrival as u32
                && self
                    .waiting
                    .get(&ev.tgid)
                    .is_some_and(|q| q.len() < MAX_WAITING);
            if holds {
                self.waiting
                    .entry(ev.tgid)
                    .or_default()
                    .push_back(Held::Call(ev));
                return Taken::Held;
            }
            if ev.kind == collector_common::EventKind::Arrival as u32 {
                if let Some(t) = self.tracker_of(ev.tgid) {
                    t.arrival(&ev);
                }
            }
            self.pass_on(PlacedItem::Call(ev, Placement::default()));
            return Taken::Now(Placement::default());
        }
        if let Some(t) = self.tracker_of(ev.tgid) {
            let placement = t.call(&ev);
            self.placed(&ev, placement);
            return Taken::Now(placement);
        }
        let full = if self.waiting.contains_key(&ev.tgid) {
            self.waiting[&ev.tgid].len() >= MAX_WAITING
        } else {
            self.waiting.len() >= MAX_WAITING_PROCS
        };
        if full {
            self.unplaced += 1;
            self.placed(&ev, Placement::default());
            return Taken::Now(Placement::default());
        }
        let q = self.waiting.entry(ev.tgid).or_default();
        q.push_back(Held::Call(ev));
        Taken::Held
    }

    /// The tracker of the process that runs under `pid` now, if its job is known.
    fn tracker_of(&mut self, pid: u32) -> Option<&mut Tracker> {
        let placed = self.world_of.get(&pid).filter(|p| !p.exited)?;
        self.trackers.get_mut(&placed.world)
    }

    /// The world of process `proc`, running or exited.
    fn world_of_proc(&self, (pid, start): Proc) -> Option<&String> {
        match self.world_of.get(&pid) {
            Some(p) if p.start == start => Some(&p.world),
            _ => self.earlier.get(&(pid, start)).map(|(world, _)| world),
        }
    }

    /// Process `proc` belongs to job `world` (a key that groups the ranks of one MPI world
    /// on this node) of `size` ranks where known; calls that waited are taken now, and
    /// returned with what [`Board::call`] would have said of each. A process placed
    /// before under its pid is another, whose pid was given to this one.
    pub fn set_world(&mut self, proc: Proc, world: &str, size: Option<u32>) -> Vec<Released> {
        let (pid, start) = proc;
        if self.world_of.get(&pid).is_some_and(|p| p.start != start) {
            self.replaced(pid);
        }
        if !self.world_of.contains_key(&pid) {
            // Its kernel counts are read at the next chance, not up to a second later.
            self.entered_read = None;
        }
        // A process stays in the world it was first placed in.
        let world = self
            .world_of
            .entry(pid)
            .or_insert_with(|| Placed {
                world: world.to_string(),
                start,
                exited: false,
            })
            .world
            .clone();
        let (host, hand_on, late) = (self.host.clone(), self.hand_on, self.late_senders);
        let t = self.trackers.entry(world).or_insert_with(|| {
            let mut t = Tracker::new(host);
            t.hand_on = hand_on;
            t.late_senders = late.then(LateSenders::default);
            t
        });
        if let Some(n) = size {
            t.world_size(pid, n);
        }
        // Passed on as they are taken (the tracker borrows the board meanwhile).
        let forward = self.forward.clone();
        let pass_on = |item| pass_on_to(forward.as_ref(), item);
        let mut released: Vec<Released> = Vec::new();
        for held in self.waiting.remove(&pid).into_iter().flatten() {
            let ev = match held {
                Held::Call(ev) => ev,
                Held::Detached => {
                    t.detached(pid);
                    pass_on(PlacedItem::Detached(pid));
                    continue;
                }
            };
            let placement = if ev.kind == collector_common::EventKind::Call as u32 {
                t.call(&ev)
            } else {
                t.arrival(&ev);
                Placement::default()
            };
            pass_on(PlacedItem::Call(ev, placement));
            released.push((ev, placement));
        }
        // It exited while they were held: its exit is told after them.
        if self.exited_while_held.contains(&pid) {
            self.ended(pid);
        }
        self.released(pid);
        released
    }

    /// The process placed under `pid` ended: it is over in its job (whose matching ends with
    /// its last process: all its calls are in). Its placement stays for its job's reports,
    /// but a later call of its pid is another process's, which waits until that one's job
    /// is known.
    fn ended(&mut self, pid: u32) {
        if let Some(t) = self.tracker_of(pid) {
            t.exited(pid);
            if t.idle() {
                t.finish_matching();
            }
        }
        if let Some(p) = self.world_of.get_mut(&pid) {
            p.exited = true;
        }
    }

    /// The process placed under `pid` is no more (its pid is another's now): it is over
    /// in its job (if its exit was not told), and its world is kept for its job's reports.
    fn replaced(&mut self, pid: u32) {
        // Nothing where its exit was told already.
        self.ended(pid);
        let Some(old) = self.world_of.remove(&pid) else {
            return;
        };
        let entered = self.entered.remove(&pid);
        self.earlier.insert((pid, old.start), (old.world, entered));
    }

    /// The name of communicator `handle` of generation `gen` of process `pid`, alike in
    /// every member, where its creation was seen (the world has its own key in the
    /// per-peer counters).
    pub fn comm_name(&self, pid: u32, handle: u64, gen: u16) -> Option<super::CommKey> {
        self.trackers
            .get(&self.world_of.get(&pid)?.world)?
            .comm_name(pid, handle, gen)
    }

    /// Whether the job of process `proc` is known.
    pub fn knows(&self, proc: Proc) -> bool {
        self.world_of
            .get(&proc.0)
            .is_some_and(|p| p.start == proc.1)
    }

    /// Whether the job of the process running under `pid` is known (its calls are not
    /// held).
    pub fn knows_pid(&self, pid: u32) -> bool {
        self.world_of.get(&pid).is_some_and(|p| !p.exited)
    }

    /// Whether the kernel's counts of collectives entered are due to be read again (once a
    /// second: reading them walks a map every process on the node may have filled).
    pub fn entered_due(&self) -> bool {
        self.entered_read
            .is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(1))
    }

    /// The kernel's counts of collectives entered, per process
    /// ([`crate::attach::Probes::collectives_entered`]): the processes of known jobs keep
    /// the highest seen (the kernel forgets a process that exited).
    pub fn set_entered(&mut self, entered: std::collections::HashMap<u32, u64>) {
        self.entered
            .retain(|pid, _| self.world_of.contains_key(pid));
        for (pid, n) in entered {
            // An exited one's too: the kernel holds its counts until it is forgotten, and
            // the last read is taken after its exit (a process placed under its pid since
            // has its own, the exited one's kept apart).
            if self.world_of.contains_key(&pid) {
                let e = self.entered.entry(pid).or_insert(n);
                *e = n.max(*e);
            }
        }
        self.entered_read = Some(std::time::Instant::now());
    }

    /// Closes instances nobody arrived at for a while.
    pub fn tick(&mut self) {
        for t in self.trackers.values_mut() {
            t.tick();
        }
    }

    /// Forgets the processes `keep` says no longer matter, and jobs left with none: it is
    /// asked of a process by its pid and start, and of a pid alone (None) where the start
    /// is not known (a process whose job is not known, the names of exited ones).
    pub fn retain(&mut self, keep: impl Fn(u32, Option<u64>) -> bool) {
        self.world_of.retain(|pid, p| keep(*pid, Some(p.start)));
        self.earlier
            .retain(|(pid, start), _| keep(*pid, Some(*start)));
        self.entered
            .retain(|pid, _| self.world_of.contains_key(pid));
        let gone: Vec<u32> = self
            .waiting
            .keys()
            .copied()
            .filter(|pid| !keep(*pid, None))
            .collect();
        for pid in gone {
            // Their job never became known: passed on unplaced.
            self.unplace_all(pid);
        }
        let live: std::collections::HashSet<&String> = self
            .world_of
            .values()
            .map(|p| &p.world)
            .chain(self.earlier.values().map(|(world, _)| world))
            .collect();
        self.trackers.retain(|w, _| live.contains(w));
        let keep_pid = |pid| keep(pid, None);
        for t in self.trackers.values_mut() {
            t.forget(keep_pid);
            if let Some(ls) = t.late_senders.as_mut() {
                ls.retain(keep_pid);
            }
        }
    }

    /// Aligns and closes everything (no more calls will come); returns the calls still
    /// held (their process's job never became known: not matched).
    pub fn finish(&mut self) -> Vec<Released> {
        let pids: Vec<u32> = self.waiting.keys().copied().collect();
        let held: Vec<Released> = pids
            .into_iter()
            .flat_map(|pid| self.unplace_all(pid))
            .map(|ev| (ev, Placement::default()))
            .collect();
        for pid in std::mem::take(&mut self.exited_while_held) {
            self.pass_on(PlacedItem::Exited(pid));
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

    /// The world of the job that `procs` belong to (the first whose job is known).
    fn world_of_job(&self, procs: &[Proc]) -> Option<&String> {
        procs.iter().find_map(|p| self.world_of_proc(*p))
    }

    /// The report of the job that `procs` belong to (the first whose job is known), with
    /// processes named by `whois`.
    pub fn report_for(&self, procs: &[Proc], whois: Whois) -> Option<SkewReport> {
        let world = self.world_of_job(procs)?;
        let t = self.trackers.get(world)?;
        // The counts under a pid are of the process placed under it last, if that one is in
        // this job; else of the one before it that was.
        let entered = |pid| match self.world_of.get(&pid) {
            Some(p) if p.world == *world => self.entered.get(&pid).copied(),
            _ => self
                .earlier
                .iter()
                .find(|((p, _), (w, _))| *p == pid && w == world)
                .and_then(|(_, (_, n))| *n),
        };
        let mut r = t.report(whois, &entered);
        r.unidentified += self.unplaced;
        r.late_sender = t.late_senders.as_ref().map(|ls| ls.report(whois));
        Some(r)
    }

    /// The Late Sender report of the job `pids` belong to, if sends are paired.
    pub fn late_sender_for(&self, procs: &[Proc], whois: Whois) -> Option<LateSenderReport> {
        let world = self.world_of_job(procs)?;
        Some(
            self.trackers
                .get(world)?
                .late_senders
                .as_ref()?
                .report(whois),
        )
    }

    /// At most `max` message halves of the jobs here whose other end this node did not see
    /// since the last call (for the aggregator: see [`LateSenders::take_unmatched`]).
    pub fn take_unmatched_halves(&mut self, max: usize) -> Vec<(u64, Half)> {
        let mut out = Vec::new();
        for ls in self
            .trackers
            .values_mut()
            .filter_map(|t| t.late_senders.as_mut())
        {
            out.extend(ls.take_unmatched(max - out.len()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skew::{
        test_events::{call, WORLD},
        CommKey,
    };
    use collector_common::{routines::routine_id, EventKind};

    fn passed_on(rx: &mut mpsc::Receiver<PlacedItem>) -> Vec<PlacedItem> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    /// Two processes make a duplicate of the world (their handles for it differ) and send on
    /// it: both sends are passed on under one name. The calls of the process whose job is
    /// not known yet wait, and its exit is passed on after them.
    #[test]
    fn calls_pass_on_named_alike_and_held_ones_before_their_exit() {
        let feed = Arc::new(PlacedFeed::default());
        let (mut rx, _) = feed.subscribe();
        let mut board = Board::new("h".into()).forward_to(feed);
        board.set_world((8, 0), "job", Some(2));
        for (pid, dup) in [(7, 0x8400_0001), (8, 0x8400_0005)] {
            board.item(Ok(FeedItem::Call(call(pid, "MPI_Comm_dup", WORLD, dup, 0))));
            board.item(Ok(FeedItem::Call(call(pid, "MPI_Send", dup, 0, 1))));
        }
        board.item(Ok(FeedItem::Exited(7)));
        let early = passed_on(&mut rx);
        assert_eq!(early.len(), 2, "only the known job's calls: {early:?}");
        board.set_world((7, 0), "job", Some(2));
        let late = passed_on(&mut rx);
        assert_eq!(late.len(), 3, "{late:?}");
        assert!(matches!(late[2], PlacedItem::Exited(7)), "{late:?}");
        let name = |item: &PlacedItem| match item {
            PlacedItem::Call(ev, placement) => (ev.tgid, placement.comm),
            other => panic!("{other:?}"),
        };
        let (dup_8, send_8) = (name(&early[0]), name(&early[1]));
        let (dup_7, send_7) = (name(&late[0]), name(&late[1]));
        assert_eq!(
            (dup_7.1, dup_8.1),
            (Some(CommKey::WORLD), Some(CommKey::WORLD))
        );
        assert!(send_7.1.is_some_and(|k| k != CommKey::WORLD), "{send_7:?}");
        assert_eq!(send_7.1, send_8.1, "one name for the duplicate in both");
    }

    /// Two processes attached alike make a duplicate of the world the kernel did not count
    /// (made after the attach): named alike, unless one was watched again after a detach,
    /// told the board before its job was known.
    #[test]
    fn a_detach_told_before_the_job_is_known_still_names_apart() {
        let dup_and_send = |board: &mut Board, pid: u32, dup: u64| {
            board.item(Ok(FeedItem::Call(CallEvent {
                recv_tag: -1,
                ..call(pid, "MPI_Comm_dup", WORLD, dup, 0)
            })));
            board.item(Ok(FeedItem::Call(call(pid, "MPI_Send", dup, 0, 1))));
        };
        let dup_names = |detached: bool| {
            let feed = Arc::new(PlacedFeed::default());
            let (mut rx, _) = feed.subscribe();
            let mut board = Board::new("h".into()).forward_to(feed);
            board.set_world((8, 0), "job", Some(2));
            if detached {
                board.item(Ok(FeedItem::Detached(7)));
            }
            dup_and_send(&mut board, 7, 0x8400_0001);
            dup_and_send(&mut board, 8, 0x8400_0005);
            board.set_world((7, 0), "job", Some(2));
            let mut sends: Vec<(u32, Option<CommKey>)> = passed_on(&mut rx)
                .into_iter()
                .filter_map(|item| match item {
                    PlacedItem::Call(ev, p)
                        if ev.routine == call(0, "MPI_Send", 0, 0, 0).routine =>
                    {
                        Some((ev.tgid, p.comm))
                    }
                    _ => None,
                })
                .collect();
            sends.sort();
            assert!(sends.iter().all(|(_, name)| name.is_some()), "{sends:?}");
            (sends[0].1, sends[1].1)
        };
        let (seven, eight) = dup_names(false);
        assert_eq!(seven, eight);
        let (seven, eight) = dup_names(true);
        assert_ne!(seven, eight);
    }

    /// A detach between held calls (its process's job not known yet) is applied in its
    /// place: the calls before it are numbered from the `MPI_Init` held with them, those
    /// after it are not (aligned by time), and the detach is passed on between them.
    #[test]
    fn a_detach_between_held_calls_parts_them() {
        let feed = Arc::new(PlacedFeed::default());
        let (mut rx, _) = feed.subscribe();
        let mut board = Board::new("h".into()).forward_to(feed);
        let barrier = |seq: u32| CallEvent {
            comm_size: 2,
            ..call(7, "MPI_Barrier", WORLD, 0, seq)
        };
        board.item(Ok(FeedItem::Call(call(7, "MPI_Init", 0, 0, 0))));
        board.item(Ok(FeedItem::Call(barrier(1))));
        board.item(Ok(FeedItem::Detached(7)));
        board.item(Ok(FeedItem::Call(barrier(2))));
        assert!(passed_on(&mut rx).is_empty(), "its job is not known yet");
        let released: Vec<Option<u64>> = board
            .set_world((7, 0), "job", Some(2))
            .iter()
            .map(|(_, p)| p.seq)
            .collect();
        assert_eq!(released, [None, Some(0), None]);
        let passed: Vec<String> = passed_on(&mut rx)
            .iter()
            .map(|item| match item {
                PlacedItem::Call(ev, p) => format!("{} {:?}", ev.thread_seq, p.seq),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(passed, ["0 None", "1 Some(0)", "Detached(7)", "2 None"]);
    }

    /// Two detaches with no call between them are held as one; a detach that finds its
    /// process's queue full lets the held calls go first (unplaced), then itself: the
    /// calls passed on since, unplaced, came after it.
    #[test]
    fn held_detaches_stay_bounded_and_in_order() {
        let feed = Arc::new(PlacedFeed::default());
        let (mut rx, _) = feed.subscribe();
        let mut board = Board::new("h".into()).forward_to(feed);
        let send = |seq: u32| FeedItem::Call(call(7, "MPI_Send", WORLD, 0, seq));
        board.item(Ok(send(0)));
        board.item(Ok(FeedItem::Detached(7)));
        board.item(Ok(FeedItem::Detached(7)));
        board.item(Ok(send(1)));
        board.set_world((7, 0), "job", Some(2));
        let said = |items: Vec<PlacedItem>| -> Vec<String> {
            items
                .iter()
                .map(|item| match item {
                    PlacedItem::Call(ev, _) => format!("call {}", ev.thread_seq),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(
            said(passed_on(&mut rx)),
            ["call 0", "Detached(7)", "call 1"]
        );
        // Process 8's job is never known: its queue fills, then a call goes on at once.
        for seq in 0..=MAX_WAITING as u32 {
            board.item(Ok(FeedItem::Call(call(8, "MPI_Send", WORLD, 0, seq))));
        }
        board.item(Ok(FeedItem::Detached(8)));
        let passed = said(passed_on(&mut rx));
        let last = format!("call {MAX_WAITING}");
        assert_eq!(passed.len(), MAX_WAITING + 2);
        assert_eq!(passed[0], last, "past the cap, at once");
        assert_eq!(passed[MAX_WAITING], format!("call {}", MAX_WAITING - 1));
        assert_eq!(passed[MAX_WAITING + 1], "Detached(8)");
    }

    /// A process that exited is still found in its job's reports; a later process given its
    /// pid is another job's: its calls wait until that job is known, and are matched there,
    /// not in the first's, whose report finds the first process still.
    #[test]
    fn a_pid_given_to_another_jobs_process_is_placed_in_that_job() {
        let mut board = Board::new("h".into());
        // Process `pid`'s `MPI_Init` (i = 0) or `i`-th barrier of a world of 2, 10 ms apart.
        let call_of = |pid: u32, i: u32| CallEvent {
            comm_size: 2,
            start_ns: u64::from(i) * 10_000_000,
            dur_ns: 1_000_000,
            ..call(
                pid,
                if i == 0 { "MPI_Init" } else { "MPI_Barrier" },
                WORLD,
                0,
                i,
            )
        };
        let (first, second) = ((7, 100), (7, 200));
        board.set_world(first, "a", Some(2));
        board.set_world((8, 100), "a", Some(2));
        for i in 0..=3 {
            for pid in [7, 8] {
                assert!(matches!(board.call(call_of(pid, i)), Taken::Now(_)));
            }
        }
        board.item(Ok(FeedItem::Exited(7)));
        board.item(Ok(FeedItem::Exited(8)));
        // The kernel's last counts, read after the exits: instance 9 entered.
        board.set_entered([(7, 9), (8, 9)].into_iter().collect());
        assert!(board.knows(first) && !board.knows_pid(7));
        // Pid 7 given to a process of job b: its calls wait for its job.
        for i in 0..=2 {
            let held = board.call(call_of(7, i));
            assert_eq!(held, Taken::Held, "taken for the exited process's");
        }
        assert!(!board.knows(second));
        assert_eq!(board.set_world(second, "b", Some(2)).len(), 3);
        board.set_world((9, 200), "b", Some(2));
        for i in 0..=2 {
            assert!(matches!(board.call(call_of(9, i)), Taken::Now(_)));
        }
        board.finish();
        let whois = |pid: u32| Some((pid, "h".to_string()));
        let instances =
            |b: &Board, procs: &[Proc]| b.report_for(procs, &whois).map(|r| r.instances);
        assert_eq!(instances(&board, &[first]), Some(3), "job a's own");
        assert_eq!(instances(&board, &[first, (8, 100)]), Some(3));
        assert_eq!(instances(&board, &[second]), Some(2), "job b's own");
        assert_eq!(instances(&board, &[(7, 300)]), None, "no such process");
        let seq = |procs: &[Proc], rank: u32| {
            let report = board.report_for(procs, &whois).expect("a report");
            report
                .ranks
                .iter()
                .find(|r| r.rank == rank)
                .and_then(|r| r.seq)
        };
        assert_eq!(seq(&[first], 7), Some(9), "the exited one's kept");
        assert_eq!(
            seq(&[second], 7),
            Some(1),
            "the later one's own: two barriers"
        );
        // Job a's processes gone from what is kept: its world goes, b's stays.
        board.retain(|pid, start| start.is_none_or(|s| s == 200) && pid != 8);
        assert_eq!(instances(&board, &[first]), None);
        assert_eq!(instances(&board, &[second]), Some(2));
    }

    /// A process that exited while its calls were held (its job not known yet) is placed
    /// as exited: a later call of its pid waits for its own process's job.
    #[test]
    fn a_process_placed_after_its_exit_is_exited_there() {
        let mut board = Board::new("h".into());
        let send = |seq| call(7, "MPI_Send", WORLD, 0, seq);
        assert_eq!(board.call(send(0)), Taken::Held);
        board.item(Ok(FeedItem::Exited(7)));
        assert_eq!(board.set_world((7, 100), "a", Some(2)).len(), 1);
        assert!(board.knows((7, 100)) && !board.knows_pid(7));
        assert_eq!(
            board.call(send(0)),
            Taken::Held,
            "taken for the exited one's"
        );
    }

    /// An arrival waits with the calls of its process (the receive it names is among
    /// them), and is passed on in its place, untouched by the matching.
    #[test]
    fn an_arrival_waits_with_its_process_calls() {
        let feed = Arc::new(PlacedFeed::default());
        let (mut rx, _) = feed.subscribe();
        let mut board = Board::new("h".into()).forward_to(feed);
        let posted = collector_common::PostedRecv {
            tid: 7,
            _pad: 0,
            start_ns: 10,
        };
        let wait = routine_id("MPI_Wait").expect("a routine");
        board.item(Ok(FeedItem::Call(call(7, "MPI_Irecv", WORLD, 0, 0))));
        board.item(Ok(FeedItem::Call(CallEvent::arrival(
            7, 7, wait, 20, &posted, 0,
        ))));
        board.item(Ok(FeedItem::Call(call(7, "MPI_Wait", 0, 0, 1))));
        assert!(passed_on(&mut rx).is_empty(), "its job is not known yet");
        board.set_world((7, 0), "job", Some(1));
        let kinds: Vec<(u32, u16)> = passed_on(&mut rx)
            .iter()
            .map(|item| match item {
                PlacedItem::Call(ev, placement) => {
                    assert_eq!(placement.seq, None, "{ev:?}");
                    (ev.kind, ev.routine)
                }
                other => panic!("{other:?}"),
            })
            .collect();
        let call = EventKind::Call as u32;
        assert_eq!(
            kinds,
            [
                (call, routine_id("MPI_Irecv").expect("a routine")),
                (EventKind::Arrival as u32, wait),
                (call, wait)
            ]
        );
    }
}
