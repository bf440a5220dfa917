//! Late Sender (Scalasca's pattern): a blocking receive, or the wait that completed a
//! nonblocking one (`MPI_Irecv` then `MPI_Wait`, `MPI_Waitany` ...), that was waiting
//! before the send of its message had even started. The time from the receive's (or
//! wait's) start to the send's start (or to its end, if that came first) is time the
//! receiver lost to a late sender, not to the network. A wait that completed several
//! messages (`MPI_Waitall`) waited for the last of them to be sent: it is one late
//! message, of the sender whose send started last (Scalasca's rule for waits of several),
//! once every message of it is paired; `MPI_Waitsome` returned at the first to come, and
//! waited for the send that started first.
//!
//! Late Receiver is the other way round: a blocking send (`MPI_Send` of a message too large
//! to go eagerly, `MPI_Ssend`) that started before its receive was posted and was still
//! sending then waited for the receiver from its start to the post (an `MPI_Irecv`'s start,
//! or the blocking receive's).
//!
//! Sends and receives are paired as the timeline's arrows are ([`crate::trace::flows`]):
//! the k-th message of a channel on both sides, numbered from `MPI_Init`. So this needs
//! per-call events (`--call-events`, or a trace), and processes seen from their start;
//! what could not be numbered or paired is counted.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::summary::Whois;
use crate::{
    api::pb,
    trace::flows::{Flows, Unlinked},
};

/// Most halves (a send or a receive seen before its partner) kept at once: past it, new
/// ones are counted as unpaired.
pub const MAX_PENDING: usize = 1 << 20;

/// Most waits of several messages kept until each of their messages is paired: past it,
/// the oldest is given up (its paired messages counted as unpaired).
pub const MAX_WAITS: usize = 1 << 16;

/// Most messages one wait is taken to have completed (a word from another node says how
/// many; the kernel follows at most 4,096 per call).
pub const MAX_TOGETHER: u32 = 1 << 16;

/// The `late_sender` part of the `skew` object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LateSenderReport {
    /// Per (receiving rank, sending rank) with at least one message, most waited first.
    pub pairs: Vec<LateSenderPair>,
    /// Late Receiver, the other way round: per (receiving rank, sending rank), the
    /// blocking sends (`MPI_Send`, `MPI_Ssend`) paired with their receive, those that
    /// started before their receive was posted and were still in the send then, and how
    /// long their senders waited for it (send's start to the post), most waited first.
    #[serde(default)]
    pub late_receivers: Vec<LateSenderPair>,
    /// Point-to-point calls that could not be numbered (see the timeline's arrows).
    pub not_numbered: Unlinked,
    /// Sends and receives whose partner was never seen (its process not watched, or still
    /// in flight at the end), or past [`MAX_PENDING`]; and messages paired whose wait's
    /// other messages were not (past [`MAX_WAITS`] too).
    pub unpaired: u64,
}

/// Messages from one rank to another taken by blocking receives, or by nonblocking ones
/// a wait (`MPI_Wait`, `MPI_Waitall`, `MPI_Waitany`, `MPI_Waitsome`) completed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LateSenderPair {
    /// The receiving world rank and its host.
    pub receiver: u32,
    /// Host name of the receiver.
    pub receiver_host: String,
    /// The sending world rank.
    pub sender: u32,
    /// Host name of the sender.
    pub sender_host: String,
    /// Messages paired (in `late_receivers`: blocking sends paired).
    pub messages: u64,
    /// Of those, the ones whose receive started before their send did (of the messages one
    /// wait completed, only the one it waited for, charged with the wait). In
    /// `late_receivers`: the sends that started before their receive was posted.
    pub late: u64,
    /// Time the receiver waited for those sends to start, ns (in `late_receivers`: the
    /// time the senders waited for the posts).
    pub wait_ns: u64,
}

/// A send, as seen from its process. `pid` is the process on a node, the world rank at
/// the aggregator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendEnd {
    /// Who sent.
    pub pid: u32,
    /// When the send started.
    pub start_ns: u64,
    /// When it returned.
    pub end_ns: u64,
    /// A blocking send (`MPI_Send`, `MPI_Ssend`): its time may be a wait for the receive.
    pub blocking: bool,
    /// Whose clock its times were read on.
    pub clock: Clock,
}

/// Whose clock an end's times were read on, and how far off they may be on the clock
/// they are put on (the aggregator's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clock {
    /// The node (a hash of its name at the aggregator; 0: this one).
    pub node: u64,
    /// Its offset's error (0 on its own node).
    pub error_ns: u64,
}

impl Clock {
    /// How far apart the same instant may read on this clock and `other`.
    fn error_against(&self, other: &Clock) -> u64 {
        if self.node == other.node {
            0
        } else {
            self.error_ns.saturating_add(other.error_ns)
        }
    }
}

/// A blocking receive, or the wait that completed a nonblocking one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiveEnd {
    /// Who received.
    pub pid: u32,
    /// When it started waiting.
    pub start_ns: u64,
    /// When it returned.
    pub end_ns: u64,
    /// When the receive was posted: the blocking receive's start, the `MPI_Irecv`'s start
    /// (0: not known).
    pub posted_ns: u64,
    /// The waiting thread (with `pid` and `start_ns`, the wait's identity).
    pub thread: u32,
    /// Messages that call completed in all (1: this one alone).
    pub together: u32,
    /// The call returned at the first of them to come (`MPI_Waitsome`), not once all had
    /// (`MPI_Waitall`).
    pub first: bool,
    /// Whose clock its times were read on.
    pub clock: Clock,
    /// When the call started on its own node's clock (with `pid` and `thread`, the wait's
    /// identity, alike however its node's offset was estimated).
    pub wait_ns: u64,
}

impl ReceiveEnd {
    /// A receive of `ev`'s process and thread by a call from `start_ns` to `end_ns`, on
    /// this node's clock, the rest to be said.
    fn of(ev: &pb::CallEvent, start_ns: u64, end_ns: u64) -> ReceiveEnd {
        ReceiveEnd {
            pid: ev.pid,
            start_ns,
            end_ns,
            posted_ns: 0,
            thread: ev.tid,
            together: 1,
            first: false,
            clock: Clock::default(),
            wait_ns: start_ns,
        }
    }

    /// Its wait's identity.
    fn wait_key(&self) -> WaitKey {
        (self.wait_ns, self.pid, self.thread)
    }
}

/// One side of a message, seen before the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// A send.
    Send(SendEnd),
    /// A receive that waited for it.
    Receive(ReceiveEnd),
    /// A receive whose wait is not known: one a test completed, or a
    /// nonblocking receive whose arrival is not known (freed, or given up for room).
    Posted {
        /// Who received.
        pid: u32,
        /// When it was posted (0: not known), for Late Receiver.
        posted_ns: u64,
        /// Whose clock that was read on.
        clock: Clock,
    },
}

impl Half {
    /// The process (or rank) of this end.
    pub fn pid(&self) -> u32 {
        match *self {
            Half::Send(SendEnd { pid, .. })
            | Half::Receive(ReceiveEnd { pid, .. })
            | Half::Posted { pid, .. } => pid,
        }
    }
}

/// A message paired: its id, its send, and when its receive was posted.
type Met = (u64, SendEnd, u64);

/// An `MPI_Waitsome` whose arrivals are coming: the call, and its messages with when each
/// was posted.
type WaitsomeCall = (ReceiveEnd, Vec<(u64, u64)>);

/// A wait of several messages by its start (on its node's clock), process and thread
/// (oldest first).
type WaitKey = (u64, u32, u32);

/// A wait that completed several messages, until each has met its send.
#[derive(Debug)]
struct Wait {
    /// The wait (its `posted_ns` each message's own).
    receive: ReceiveEnd,
    /// Its messages neither paired here nor handed on yet.
    left: u32,
    /// Its messages paired here.
    met: Vec<Met>,
    /// Some of its messages went to the aggregator: it is settled there, and the rest
    /// follow as they are paired here.
    handed_on: bool,
}

/// Blocking sends that are numbered (what Late Receiver judges).
fn blocking_send(routine: &str) -> bool {
    matches!(
        routine,
        "MPI_Send" | "MPI_Ssend" | "MPI_Send_c" | "MPI_Ssend_c"
    )
}

/// Pairs each send with its receive as calls come, and adds up the waits.
#[derive(Debug, Default)]
pub struct LateSenders {
    numbering: Flows,
    /// When each nonblocking receive numbered and not yet completed was posted (as many
    /// as `numbering` follows).
    posted_at: HashMap<u64, u64>,
    /// Halves waiting for their other end, with the generation they came in.
    pending: HashMap<u64, (Half, u32)>,
    /// Counts calls to [`LateSenders::take_unmatched`].
    generation: u32,
    /// Waits of several messages not all paired yet, and their messages paired (at most
    /// [`MAX_PENDING`] in all: past it, the oldest waits are given up).
    waits: BTreeMap<WaitKey, Wait>,
    /// Messages paired held in `waits`.
    met: usize,
    /// Halves to hand on at the next [`LateSenders::take_unmatched`]: messages paired
    /// here whose wait has messages at the aggregator, both halves, for it to pair.
    handing: Vec<(u64, Half)>,
    /// By (receiver pid, sender pid).
    pairs: BTreeMap<(u32, u32), LateSenderPair>,
    /// Late Receiver, by (receiver pid, sender pid).
    late_receivers: BTreeMap<(u32, u32), LateSenderPair>,
    /// Each thread's `MPI_Waitsome` whose arrivals are coming (each its own event, right
    /// after the call's): the call, and its messages with when each was posted, met as one
    /// wait once the thread goes on.
    waitsome: HashMap<(u32, u32), WaitsomeCall>,
    dropped: u64,
}

impl LateSenders {
    /// Takes one call (every call of the processes, in each thread's order).
    pub fn call(&mut self, ev: &pb::CallEvent) {
        let ends = self.numbering.ends(ev);
        let thread = (ev.pid, ev.tid);
        if !self.waitsome.is_empty() {
            let more = match (&self.waitsome.get(&thread), &ev.arrival) {
                (Some((call, _)), Some(a)) => a.follows_call && call.start_ns == ev.start_ns,
                _ => false,
            };
            if !more {
                self.waitsome_done(thread);
            }
        }
        let end_ns = ev.start_ns + ev.duration_ns;
        if let Some(id) = ends.out {
            let send = SendEnd {
                pid: ev.pid,
                start_ns: ev.start_ns,
                end_ns,
                blocking: blocking_send(&ev.routine),
                clock: Clock::default(),
            };
            self.meet(id, Half::Send(send));
        }
        if let Some(id) = ends.posted {
            self.posted_at.insert(id, ev.start_ns);
        }
        // An arrival that follows its call (whose time it names): completed by a test, which
        // waits for nothing, or by `MPI_Waitsome`, which waited for the first of those it
        // completed; or by `MPI_Waitany`, which waited for the one it completed.
        let (waited, end_ns) = match (&ev.arrival, ends.arrived_in) {
            (Some(a), Some((start_ns, duration_ns))) if a.follows_call => {
                let end_ns = start_ns + duration_ns;
                if ev.routine == "MPI_Waitsome" {
                    let (_, messages) = self.waitsome.entry(thread).or_insert_with(|| {
                        let call = ReceiveEnd {
                            first: true,
                            ..ReceiveEnd::of(ev, start_ns, end_ns)
                        };
                        (call, Vec::new())
                    });
                    for &id in &ends.into {
                        let posted_ns = self.posted_at.remove(&id).unwrap_or(0);
                        if messages.len() < MAX_TOGETHER as usize {
                            messages.push((id, posted_ns));
                        }
                    }
                    return;
                }
                (ev.routine == "MPI_Waitany", end_ns)
            }
            _ => (true, end_ns),
        };
        let together = u32::try_from(ends.into.len()).map_or(MAX_TOGETHER, |n| n.min(MAX_TOGETHER));
        for &id in &ends.into {
            // Posted by an `MPI_Irecv`, or by this (blocking) receive.
            let posted_ns = self.posted_at.remove(&id).unwrap_or(ev.start_ns);
            // A blocking receive, or a wait: its time is its messages' wait.
            let half = if waited {
                Half::Receive(ReceiveEnd {
                    posted_ns,
                    together,
                    ..ReceiveEnd::of(ev, ev.start_ns, end_ns)
                })
            } else {
                Half::Posted {
                    pid: ev.pid,
                    posted_ns,
                    clock: Clock::default(),
                }
            };
            self.meet(id, half);
        }
        for id in ends.unplaced {
            let posted_ns = self.posted_at.remove(&id).unwrap_or(0);
            let half = Half::Posted {
                pid: ev.pid,
                posted_ns,
                clock: Clock::default(),
            };
            self.meet(id, half);
        }
    }

    /// The thread's `MPI_Waitsome`, its arrivals all come: its messages met as one wait.
    fn waitsome_done(&mut self, thread: (u32, u32)) {
        let Some((call, messages)) = self.waitsome.remove(&thread) else {
            return;
        };
        let together = messages.len() as u32;
        for (id, posted_ns) in messages {
            let receive = ReceiveEnd {
                posted_ns,
                together,
                ..call
            };
            self.meet(id, Half::Receive(receive));
        }
    }

    /// Takes one half of message `id` (an identity both ends compute alike): paired with
    /// its other half if that came, else kept for it.
    pub fn meet(&mut self, id: u64, half: Half) {
        let Some((other, _)) = self.pending.remove(&id) else {
            if self.pending.len() < MAX_PENDING {
                self.pending.insert(id, (half, self.generation));
            } else {
                self.dropped += 1;
            }
            return;
        };
        let (send, receive) = match (half, other) {
            (Half::Send(send), Half::Receive(receive))
            | (Half::Receive(receive), Half::Send(send)) => (send, receive),
            // Taken by a receive whose wait is not known: Late Receiver only.
            (
                Half::Send(send),
                Half::Posted {
                    pid,
                    posted_ns,
                    clock,
                },
            )
            | (
                Half::Posted {
                    pid,
                    posted_ns,
                    clock,
                },
                Half::Send(send),
            ) => {
                self.judge_receiver(pid, &send, posted_ns, &clock);
                return;
            }
            _ => return,
        };
        let met = (id, send, receive.posted_ns);
        if receive.together <= 1 {
            self.settle(&receive, &[met]);
            return;
        }
        let key = receive.wait_key();
        while self.met >= MAX_PENDING && self.give_up_oldest_wait() {}
        let w = self.wait(key, receive);
        w.left = w.left.saturating_sub(1);
        if w.handed_on {
            self.handing
                .extend([(id, Half::Send(send)), (id, Half::Receive(receive))]);
        } else {
            w.met.push(met);
            self.met += 1;
        }
        self.close_if_done(key);
    }

    /// Forgets the oldest wait, its paired messages counted as unpaired; false if none.
    fn give_up_oldest_wait(&mut self) -> bool {
        let Some((_, old)) = self.waits.pop_first() else {
            return false;
        };
        self.forget_wait(&old);
        true
    }

    /// Counts the messages of a wait given up as unpaired.
    fn forget_wait(&mut self, w: &Wait) {
        self.met -= w.met.len();
        self.dropped += w.met.len() as u64;
    }

    /// The wait `key` (kept from now if new; past [`MAX_WAITS`], the oldest is given up).
    fn wait(&mut self, key: WaitKey, receive: ReceiveEnd) -> &mut Wait {
        if !self.waits.contains_key(&key) && self.waits.len() >= MAX_WAITS {
            self.give_up_oldest_wait();
        }
        self.waits.entry(key).or_insert_with(|| Wait {
            receive,
            left: receive.together,
            met: Vec::new(),
            handed_on: false,
        })
    }

    /// Settles the wait `key` once each of its messages is paired here (or forgets it
    /// once the last went to the aggregator, which settles it).
    fn close_if_done(&mut self, key: WaitKey) {
        if self.waits.get(&key).is_some_and(|w| w.left == 0) {
            let w = self.waits.remove(&key).expect("just seen");
            self.met -= w.met.len();
            if !w.handed_on {
                self.settle(&w.receive, &w.met);
            }
        }
    }

    /// Adds up a receive (or wait) whose messages `met` are all paired: each message counts
    /// to its sender, and the wait, if it started before the send it waited for did (the
    /// last to start; the first, for `MPI_Waitsome`), is that sender's late message. And
    /// Late Receiver: each blocking send that started before its receive was posted and
    /// was still waiting then waited that long for it.
    fn settle(&mut self, receive: &ReceiveEnd, met: &[Met]) {
        let receiver = receive.pid;
        for (_, send, posted_ns) in met {
            self.pairs.entry((receiver, send.pid)).or_default().messages += 1;
            self.judge_receiver(receiver, send, *posted_ns, &receive.clock);
        }
        // The send the call waited for: the last to start, or the first where the call
        // returned at the first message to come.
        let waited_for = if receive.first {
            met.iter().min_by_key(|(_, send, _)| send.start_ns)
        } else {
            met.iter().max_by_key(|(_, send, _)| send.start_ns)
        };
        let Some(&(_, last, _)) = waited_for else {
            return;
        };
        if last.start_ns > receive.start_ns {
            let p = self.pairs.entry((receiver, last.pid)).or_default();
            p.late += 1;
            p.wait_ns += last
                .start_ns
                .min(receive.end_ns)
                .saturating_sub(receive.start_ns);
        }
    }

    /// Late Receiver of one message: a blocking send that started before its receive was
    /// posted and was still sending then waited for it that long. A synchronous send
    /// returns just after the post: across nodes, within the two clocks' error of it, it is
    /// taken to have been sending still. `clock` is the receive's.
    fn judge_receiver(&mut self, receiver: u32, send: &SendEnd, posted_ns: u64, clock: &Clock) {
        if !send.blocking || posted_ns == 0 {
            return;
        }
        let p = self.late_receivers.entry((receiver, send.pid)).or_default();
        p.messages += 1;
        let sending_until = send.end_ns.saturating_add(send.clock.error_against(clock));
        if posted_ns > send.start_ns && sending_until > posted_ns {
            p.late += 1;
            p.wait_ns += posted_ns - send.start_ns;
        }
    }

    /// At most `max` of the halves whose other end did not come since the last call (it is
    /// on another node: the aggregator pairs them), taken out; those that came since stay a
    /// while, and those past `max` until the next call. A wait of several messages one of
    /// which is handed on is settled by the aggregator: the messages of it paired here are
    /// handed on too, both halves.
    pub fn take_unmatched(&mut self, max: usize) -> Vec<(u64, Half)> {
        let now = self.generation;
        self.generation = now.wrapping_add(1);
        let old: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, (_, g))| *g != now)
            .map(|(id, _)| *id)
            .take(max.saturating_sub(self.handing.len()))
            .collect();
        for id in old {
            let Some((half, _)) = self.pending.remove(&id) else {
                continue;
            };
            if let Half::Receive(receive) = half {
                if receive.together > 1 {
                    self.hand_on_wait(receive);
                }
            }
            self.handing.push((id, half));
        }
        let n = self.handing.len().min(max);
        self.handing.drain(..n).collect()
    }

    /// One message of the wait `receive` is handed on: so are those of it paired here, and
    /// those paired later.
    fn hand_on_wait(&mut self, receive: ReceiveEnd) {
        let key = receive.wait_key();
        let w = self.wait(key, receive);
        w.left = w.left.saturating_sub(1);
        if !w.handed_on {
            w.handed_on = true;
            let wait = w.receive;
            let met = std::mem::take(&mut w.met);
            self.met -= met.len();
            for (id, send, posted_ns) in met {
                let receive = ReceiveEnd { posted_ns, ..wait };
                self.handing
                    .extend([(id, Half::Send(send)), (id, Half::Receive(receive))]);
            }
        }
        self.close_if_done(key);
    }

    /// Process `pid` was detached or is watched again: its messages from now on are not
    /// numbered (some of its channels' went unseen), and are counted as such.
    pub fn detached(&mut self, pid: u32) {
        self.numbering.stopped(pid);
    }

    /// Process `pid` exited (its calls all came before): its pid may be another process's
    /// from now on, numbered from its own `MPI_Init` (a detach's stop forgotten too).
    pub fn exited(&mut self, pid: u32) {
        self.numbering.exited(pid);
    }

    /// Forgets the pairs of processes `keep` no longer keeps (both ends gone).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        for pairs in [&mut self.pairs, &mut self.late_receivers] {
            pairs.retain(|&(receiver, sender), _| keep(receiver) || keep(sender));
        }
        self.waitsome.retain(|&(pid, _), (_, messages)| {
            let kept = keep(pid);
            if !kept {
                self.dropped += messages.len() as u64;
            }
            kept
        });
        let gone: Vec<WaitKey> = self
            .waits
            .keys()
            .filter(|&&(_, receiver, _)| !keep(receiver))
            .copied()
            .collect();
        for key in gone {
            if let Some(w) = self.waits.remove(&key) {
                self.forget_wait(&w);
            }
        }
    }

    /// The report, ranks and hosts from `whois` (processes it does not know are left out).
    pub fn report(&self, whois: Whois) -> LateSenderReport {
        let named = |pairs: &BTreeMap<(u32, u32), LateSenderPair>| {
            let mut named: Vec<LateSenderPair> = pairs
                .iter()
                .filter_map(|(&(receiver, sender), p)| {
                    let (receiver, receiver_host) = whois(receiver)?;
                    let (sender, sender_host) = whois(sender)?;
                    Some(LateSenderPair {
                        receiver,
                        receiver_host,
                        sender,
                        sender_host,
                        ..p.clone()
                    })
                })
                .collect();
            sort_pairs(&mut named);
            named
        };
        let unpaired = self
            .pending
            .values()
            .filter(|(h, _)| !matches!(h, Half::Posted { .. }))
            .count() as u64;
        let coming: usize = self.waitsome.values().map(|(_, m)| m.len()).sum();
        LateSenderReport {
            pairs: named(&self.pairs),
            late_receivers: named(&self.late_receivers),
            not_numbered: self.numbering.unlinked,
            unpaired: unpaired + (self.met + coming) as u64 + self.dropped,
        }
    }
}

/// Most waited first.
fn sort_pairs(pairs: &mut [LateSenderPair]) {
    pairs.sort_by(|a, b| {
        b.wait_ns
            .cmp(&a.wait_ns)
            .then((a.receiver, a.sender).cmp(&(b.receiver, b.sender)))
    });
}

impl LateSenderReport {
    /// The reports of several parts of a job (each node's, the aggregator's pairs across
    /// nodes) as one: pairs of the same ranks added up, counts summed.
    pub fn combine<'a>(parts: impl IntoIterator<Item = &'a LateSenderReport>) -> LateSenderReport {
        type ByPair = BTreeMap<(u32, u32), LateSenderPair>;
        fn add(by: &mut ByPair, pairs: &[LateSenderPair]) {
            for p in pairs {
                let e = by
                    .entry((p.receiver, p.sender))
                    .or_insert_with(|| LateSenderPair {
                        messages: 0,
                        late: 0,
                        wait_ns: 0,
                        ..p.clone()
                    });
                e.messages += p.messages;
                e.late += p.late;
                e.wait_ns += p.wait_ns;
            }
        }
        let (mut senders, mut receivers) = (ByPair::new(), ByPair::new());
        let mut out = LateSenderReport::default();
        for r in parts {
            add(&mut senders, &r.pairs);
            add(&mut receivers, &r.late_receivers);
            out.not_numbered.add(&r.not_numbered);
            out.unpaired += r.unpaired;
        }
        out.pairs = senders.into_values().collect();
        out.late_receivers = receivers.into_values().collect();
        sort_pairs(&mut out.pairs);
        sort_pairs(&mut out.late_receivers);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p2p(pid: u32, routine: &str, peer: i32, start_ns: u64, duration_ns: u64) -> pb::CallEvent {
        pb::CallEvent {
            pid,
            tid: pid,
            routine: routine.into(),
            start_ns,
            duration_ns,
            peer: Some(peer),
            tag: Some(7),
            comm: "world".into(),
            comm_rank: Some(pid as i32 - 1),
            ..Default::default()
        }
    }

    fn init(ls: &mut LateSenders, pids: &[u32]) {
        for &pid in pids {
            ls.call(&pb::CallEvent {
                pid,
                tid: pid,
                routine: "MPI_Init".into(),
                ..Default::default()
            });
        }
    }

    /// The arrival, in a wait of `pid` starting at `at`, of what its `MPI_Irecv` that
    /// started at `posted_start_ns` received.
    fn arrival(pid: u32, posted_start_ns: u64, at: u64) -> pb::CallEvent {
        pb::CallEvent {
            arrival: Some(pb::Arrival {
                posted_tid: pid,
                posted_start_ns,
                ..Default::default()
            }),
            ..p2p(pid, "MPI_Waitall", -1, at, 0)
        }
    }

    /// Rank 0 posts a receive from each of ranks 1, 2 and 3 (in that order, at 100, 200
    /// and 300) and waits for all three in one `MPI_Waitall` from 1000 to 9000.
    fn wait_for_three(ls: &mut LateSenders) {
        for (peer, at) in [(1, 100), (2, 200), (3, 300)] {
            ls.call(&p2p(1, "MPI_Irecv", peer, at, 10));
        }
        for at in [100, 200, 300] {
            ls.call(&arrival(1, at, 1000));
        }
        ls.call(&p2p(1, "MPI_Waitall", -1, 1000, 8000));
    }

    fn pairs(r: &LateSenderReport) -> Vec<(u32, u32, u64, u64, u64)> {
        r.pairs
            .iter()
            .map(|p| (p.receiver, p.sender, p.messages, p.late, p.wait_ns))
            .collect()
    }

    /// A wait of several messages waited for the last of them: one late message, of the
    /// sender that started last, with the wait up to that send; the others are counted as
    /// messages only, and nothing is added before every message of the wait is paired.
    #[test]
    fn a_wait_of_several_messages_is_late_for_the_last_send() {
        let mut ls = LateSenders::default();
        init(&mut ls, &[1, 2, 3, 4]);
        wait_for_three(&mut ls);
        // Rank 2 sends late (at 4000), rank 3 later still (at 6000); rank 1 on time.
        ls.call(&p2p(3, "MPI_Send", 0, 4000, 10));
        ls.call(&p2p(4, "MPI_Send", 0, 6000, 10));
        let whois = |pid: u32| Some((pid - 1, "n".to_string()));
        let r = ls.report(&whois);
        assert_eq!(pairs(&r), vec![], "two of three paired: not settled");
        assert_eq!(r.unpaired, 3, "two paired, one receive waiting");
        ls.call(&p2p(2, "MPI_Send", 0, 500, 10));
        let r = ls.report(&whois);
        assert_eq!(
            pairs(&r),
            vec![(0, 3, 1, 1, 5000), (0, 1, 1, 0, 0), (0, 2, 1, 0, 0)]
        );
        assert_eq!(r.unpaired, 0);
    }

    /// `MPI_Waitany` waited for the one message it completed (its arrival follows it);
    /// `MPI_Testany` waited for nothing.
    #[test]
    fn a_wait_for_any_waited_for_the_message_it_completed() {
        let mut ls = LateSenders::default();
        init(&mut ls, &[1, 2]);
        let completing = |routine: &str, posted_start_ns, at, duration| {
            let arrival = pb::CallEvent {
                arrival: Some(pb::Arrival {
                    posted_tid: 1,
                    posted_start_ns,
                    follows_call: true,
                    ..Default::default()
                }),
                ..p2p(1, routine, -1, at, 0)
            };
            [p2p(1, routine, -1, at, duration), arrival]
        };
        ls.call(&p2p(1, "MPI_Irecv", 1, 100, 10));
        ls.call(&p2p(2, "MPI_Send", 0, 3000, 10));
        for ev in completing("MPI_Waitany", 100, 1000, 2500) {
            ls.call(&ev);
        }
        ls.call(&p2p(1, "MPI_Irecv", 1, 5000, 10));
        ls.call(&p2p(2, "MPI_Send", 0, 8000, 10));
        for ev in completing("MPI_Testany", 5000, 9000, 10) {
            ls.call(&ev);
        }
        let whois = |pid: u32| Some((pid - 1, "n".to_string()));
        let r = ls.report(&whois);
        assert_eq!(pairs(&r), vec![(0, 1, 1, 1, 2000)]);
        assert_eq!(r.unpaired, 0);
    }

    /// `MPI_Waitsome` returned at the first of the messages it completed: it waited for the
    /// send that started first, and its messages are met once the thread goes on.
    #[test]
    fn a_wait_for_some_waited_for_the_first_send() {
        let mut ls = LateSenders::default();
        init(&mut ls, &[1, 2, 3]);
        ls.call(&p2p(1, "MPI_Irecv", 1, 100, 10));
        ls.call(&p2p(1, "MPI_Irecv", 2, 200, 10));
        ls.call(&p2p(2, "MPI_Send", 0, 3000, 10));
        ls.call(&p2p(3, "MPI_Send", 0, 3100, 10));
        ls.call(&p2p(1, "MPI_Waitsome", -1, 1000, 2500));
        for posted_start_ns in [100, 200] {
            ls.call(&pb::CallEvent {
                arrival: Some(pb::Arrival {
                    posted_tid: 1,
                    posted_start_ns,
                    follows_call: true,
                    ..Default::default()
                }),
                ..p2p(1, "MPI_Waitsome", -1, 1000, 0)
            });
        }
        let whois = |pid: u32| Some((pid - 1, "n".to_string()));
        assert_eq!(
            ls.report(&whois).unpaired,
            4,
            "two sends; two receives, more may come"
        );
        ls.call(&p2p(1, "MPI_Finalize", -1, 9000, 10));
        let r = ls.report(&whois);
        assert_eq!(pairs(&r), vec![(0, 1, 1, 1, 2000), (0, 2, 1, 0, 0)]);
        assert_eq!(r.unpaired, 0);
    }

    /// Late Receiver: a blocking send that started before its receive was posted and was
    /// still sending then waited for it from its start to the post (an `MPI_Irecv`'s start,
    /// not its wait's, however it completed); an eager send that returned first, or a
    /// nonblocking send, did not.
    #[test]
    fn a_blocking_send_before_its_receive_was_posted_waited_for_the_receiver() {
        let mut ls = LateSenders::default();
        init(&mut ls, &[1, 2]);
        // Synchronous: 1000..6000, the receive posted at 5000: waited 4000.
        ls.call(&p2p(2, "MPI_Ssend", 0, 1000, 5000));
        ls.call(&p2p(1, "MPI_Recv", 1, 5000, 1000));
        // Eager: returned (10010) before the receive was posted (12000).
        ls.call(&p2p(2, "MPI_Send", 0, 10_000, 10));
        ls.call(&p2p(1, "MPI_Recv", 1, 12_000, 10));
        // Posted by MPI_Irecv at 25000, waited for from 26000: the send waited 5000.
        ls.call(&p2p(2, "MPI_Ssend", 0, 20_000, 10_000));
        ls.call(&p2p(1, "MPI_Irecv", 1, 25_000, 10));
        ls.call(&arrival(1, 25_000, 26_000));
        ls.call(&p2p(1, "MPI_Waitall", -1, 26_000, 4000));
        // Nonblocking: not judged.
        ls.call(&p2p(2, "MPI_Isend", 0, 40_000, 10));
        ls.call(&p2p(1, "MPI_Recv", 1, 50_000, 10));
        // Completed unseen (no Late Sender), posted at 65000: the send waited 5000.
        ls.call(&p2p(2, "MPI_Ssend", 0, 60_000, 10_000));
        ls.call(&p2p(1, "MPI_Irecv", 1, 65_000, 10));
        ls.call(&pb::CallEvent {
            arrival: Some(pb::Arrival {
                posted_tid: 1,
                posted_start_ns: 65_000,
                untold: true,
                ..Default::default()
            }),
            ..p2p(1, "MPI_Test", -1, 66_000, 0)
        });
        let whois = |pid: u32| Some((pid - 1, "n".to_string()));
        let r = ls.report(&whois);
        let receivers: Vec<_> = r
            .late_receivers
            .iter()
            .map(|p| (p.receiver, p.sender, p.messages, p.late, p.wait_ns))
            .collect();
        assert_eq!(receivers, vec![(0, 1, 4, 3, 4000 + 5000 + 5000)]);
        assert_eq!(pairs(&r), vec![(0, 1, 4, 0, 0)], "no late sender");
        assert_eq!(r.unpaired, 0);
    }

    /// Rank 0 and rank 1 on node a, ranks 2 and 3 on node b. Rank 0's wait of three
    /// messages has one paired at node a, two handed on: node a hands the one it paired on
    /// too (both halves), and the third once its send comes; the aggregator settles the
    /// wait, charged to the last sender, exactly as one node would.
    #[test]
    fn a_wait_with_messages_from_another_node_is_settled_by_the_aggregator() {
        let (mut a, mut b, mut across) = (
            LateSenders::default(),
            LateSenders::default(),
            LateSenders::default(),
        );
        init(&mut a, &[1, 2]);
        init(&mut b, &[3, 4]);
        wait_for_three(&mut a);
        a.call(&p2p(2, "MPI_Send", 0, 7000, 10));
        b.call(&p2p(3, "MPI_Send", 0, 500, 10));
        b.call(&p2p(4, "MPI_Send", 0, 5000, 10));
        // A half is handed on after it waited one push.
        let mut handed = Vec::new();
        for _ in 0..2 {
            handed.extend(a.take_unmatched(100));
            handed.extend(b.take_unmatched(100));
        }
        let whois = |pid: u32| Some((pid - 1, "n".to_string()));
        assert_eq!(
            pairs(&a.report(&whois)),
            vec![],
            "settled at the aggregator"
        );
        assert_eq!(a.report(&whois).unpaired, 0, "nothing left at node a");
        // Two receives and their sends, and the message paired at node a, both halves.
        assert_eq!(handed.len(), 6, "{handed:?}");
        for (id, half) in handed {
            across.meet(id, half);
        }
        assert_eq!(
            pairs(&across.report(&whois)),
            vec![(0, 1, 1, 1, 6000), (0, 2, 1, 0, 0), (0, 3, 1, 0, 0)]
        );
        assert_eq!(across.report(&whois).unpaired, 0);
    }

    /// Once one message of a wait went to the aggregator, those node a pairs later follow
    /// it.
    #[test]
    fn messages_paired_after_their_wait_was_handed_on_follow_it() {
        let (mut a, mut across) = (LateSenders::default(), LateSenders::default());
        init(&mut a, &[1, 2, 3, 4]);
        wait_for_three(&mut a);
        a.take_unmatched(100);
        // One receive goes (the push is full), two stay.
        let mut handed = a.take_unmatched(1);
        assert_eq!(handed.len(), 1);
        for (pid, at) in [(2, 2000), (3, 3000), (4, 8000)] {
            a.call(&p2p(pid, "MPI_Send", 0, at, 10));
        }
        // Two messages paired at node a (both halves each), then the send of the one
        // handed on, after its push.
        for _ in 0..2 {
            handed.extend(a.take_unmatched(100));
        }
        assert_eq!(handed.len(), 6, "{handed:?}");
        let whois = |pid: u32| Some((pid - 1, "n".to_string()));
        assert_eq!(
            pairs(&a.report(&whois)),
            vec![],
            "settled at the aggregator"
        );
        assert_eq!(a.report(&whois).unpaired, 0);
        for (id, half) in handed {
            across.meet(id, half);
        }
        assert_eq!(
            pairs(&across.report(&whois)),
            vec![(0, 3, 1, 1, 7000), (0, 1, 1, 0, 0), (0, 2, 1, 0, 0)]
        );
        assert_eq!(across.report(&whois).unpaired, 0);
    }

    /// A process detached, then gone: a new process given its pid is numbered from its own
    /// `MPI_Init`, and its messages paired.
    #[test]
    fn a_detached_pid_given_to_another_process_is_numbered_again() {
        let mut ls = LateSenders::default();
        init(&mut ls, &[1, 2]);
        ls.detached(2);
        for pid in [1, 2] {
            ls.exited(pid);
        }
        init(&mut ls, &[1, 2]);
        ls.call(&p2p(1, "MPI_Recv", 1, 1000, 4000));
        ls.call(&p2p(2, "MPI_Send", 0, 4000, 500));
        let whois = |pid: u32| Some((pid - 1, "n".to_string()));
        assert_eq!(pairs(&ls.report(&whois)), vec![(0, 1, 1, 1, 3000)]);
    }

    #[test]
    fn a_receive_that_started_before_its_send_waited_for_it() {
        let mut ls = LateSenders::default();
        for pid in [1, 2] {
            ls.call(&pb::CallEvent {
                pid,
                routine: "MPI_Init".into(),
                ..Default::default()
            });
        }
        // Late: rank 0 waits 1000..5000 for a send starting at 4000.
        ls.call(&p2p(1, "MPI_Recv", 1, 1000, 4000));
        ls.call(&p2p(2, "MPI_Send", 0, 4000, 500));
        // On time: the send (10000) starts before the receive (12000).
        ls.call(&p2p(2, "MPI_Send", 0, 10_000, 500));
        ls.call(&p2p(1, "MPI_Recv", 1, 12_000, 100));
        // Taken by MPI_Irecv and completed in an MPI_Wait (25000..31000) before the send
        // (30000) started: late.
        let arrival = |posted_start_ns: u64, at: u64, untold: bool| pb::CallEvent {
            arrival: Some(pb::Arrival {
                posted_tid: 1,
                posted_start_ns,
                untold,
                ..Default::default()
            }),
            ..p2p(1, "MPI_Wait", -1, at, 0)
        };
        ls.call(&p2p(1, "MPI_Irecv", 1, 20_000, 10));
        ls.call(&p2p(2, "MPI_Send", 0, 30_000, 500));
        ls.call(&arrival(20_000, 25_000, false));
        ls.call(&p2p(1, "MPI_Wait", -1, 25_000, 6000));
        // Taken by an MPI_Irecv whose arrival is not known (MPI_Test): paired, not counted.
        ls.call(&p2p(1, "MPI_Irecv", 1, 50_000, 10));
        ls.call(&arrival(50_000, 52_000, true));
        ls.call(&p2p(2, "MPI_Send", 0, 55_000, 500));
        // A send nobody received.
        ls.call(&p2p(2, "MPI_Send", 0, 40_000, 500));
        let whois = |pid: u32| Some((pid - 1, "n".to_string()));
        let r = ls.report(&whois);
        assert_eq!(
            r.pairs,
            vec![LateSenderPair {
                receiver: 0,
                receiver_host: "n".into(),
                sender: 1,
                sender_host: "n".into(),
                messages: 3,
                late: 2,
                wait_ns: 3000 + 5000,
            }]
        );
        assert_eq!(r.unpaired, 1);
    }
}
