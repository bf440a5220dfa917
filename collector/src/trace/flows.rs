//! Point-to-point flows: on a timeline, an arrow from each send to the receive that matched
//! it.
//!
//! MPI matches the messages of one channel (communicator, sender, receiver, tag) in the
//! order they were sent, with the receives in the order they were posted (messages do not
//! overtake one another). So the k-th send on a channel and the k-th receive on it are one
//! message, and both ends can name it alone, without waiting for the other: the flow's id
//! is a hash of the channel and k. That needs every message of the channel counted on both
//! sides from the first, so a process is numbered only when the trace holds it from
//! `MPI_Init` on (launched by `record`, or started after the trace did); a receive whose
//! source or tag nobody knows (a wildcard with `MPI_STATUS_IGNORE`) ends the numbering of
//! its communicator at that receiver. What could not be numbered is counted.
//!
//! The arrow goes from the send's start to the receive's end: the message cannot have
//! arrived before it was sent, so the arrow always points forward in time (Perfetto drops
//! arrows that go back). A nonblocking receive's message arrives in a later wait or test:
//! the kernel follows its request there and sends an arrival event (`EventKind::Arrival`)
//! before the wait's own (`MPI_Wait`, `MPI_Waitall`), or after the call's where its return
//! says which requests it completed (`MPI_Test*`, `MPI_Waitany`, `MPI_Waitsome`), and the
//! arrow ends at that call's end. A receive whose arrival is not known draws no arrow, and
//! is counted.

use std::collections::{BTreeMap, HashMap, HashSet};

use collector_common::{
    routines::{class, NO_ARG},
    ByteRule, CallEvent, Routine,
};
use serde::{Deserialize, Serialize};

use super::routine;
use crate::api::pb;

/// Most channels followed at once: past it, messages on new channels draw no arrows.
pub const MAX_CHANNELS: usize = 1 << 20;

/// Most nonblocking receives waiting for their arrival at once (the kernel follows as
/// many): past it, the oldest is given up (counted in [`Flows::arrivals_not_seen`]).
pub const MAX_POSTED: usize = collector_common::MAX_POSTED as usize;

/// Which way a point-to-point routine moves its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// A send (blocking or not).
    Send,
    /// A blocking receive: its end is the message's arrival.
    Receive,
    /// A nonblocking receive: its message arrives in a later wait.
    Post,
    /// `MPI_Sendrecv`: a send (`peer`, `tag`) and a receive (`recv_peer`, `recv_tag`).
    Both,
    /// `MPI_Isendrecv`: a send (`peer`, `tag`) and a posted receive (`recv_peer`,
    /// `recv_tag`), whose message arrives in a later wait.
    SendAndPost,
}

impl Direction {
    /// Whether the call names a receive in `recv_peer`, `recv_tag` (beside its send).
    pub fn has_receiving_half(self) -> bool {
        matches!(self, Direction::Both | Direction::SendAndPost)
    }
}

/// The way `r` moves a message, if it moves one to a named peer.
pub fn direction(r: &Routine) -> Option<Direction> {
    if r.spec.class != class::P2P || r.spec.peer == NO_ARG {
        return None;
    }
    match ByteRule::from_u8(r.spec.rule) {
        ByteRule::CountType | ByteRule::LargeCountType => Some(Direction::Send),
        ByteRule::RecvStatus | ByteRule::LargeRecvStatus => Some(Direction::Receive),
        ByteRule::RecvPosted | ByteRule::LargeRecvPosted => Some(Direction::Post),
        ByteRule::Pair | ByteRule::LargePair => Some(Direction::Both),
        ByteRule::PairPosted | ByteRule::LargePairPosted => Some(Direction::SendAndPost),
        _ => None,
    }
}

/// Which end of its channel a persistent point-to-point request's creation
/// (`MPI_Send_init`, `MPI_Recv_init` ...) names, if it is one: `Some(true)` a receive's.
/// Its starts move messages that name no channel, so the trace numbers none on it.
pub fn persistent_end(r: &Routine) -> Option<bool> {
    if r.spec.class != class::PERSISTENT || r.spec.peer == NO_ARG {
        return None;
    }
    match ByteRule::from_u8(r.spec.rule) {
        ByteRule::CountType => Some(false),
        ByteRule::RecvPosted => Some(true),
        _ => None,
    }
}

/// The flows a call's slice starts and ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowEnds {
    /// The flow of the message it sent (drawn from its start).
    pub out: Option<u64>,
    /// The flows of the messages that arrived in it (drawn to its end): a blocking
    /// receive's, or those of the nonblocking receives a wait completed.
    pub into: Vec<u64>,
    /// The flow of the message an `MPI_Irecv` posted for (its message arrives in a later
    /// wait, whose `into` it is).
    pub posted: Option<u64>,
    /// The flows of posted receives whose arrival will not be known: past what the kernel
    /// follows in one call, freed, given up for room, or posted by `MPI_Isendrecv` (whose
    /// request is not followed).
    pub unplaced: Vec<u64>,
    /// For an arrival that follows its call (`MPI_Test` ...): that call's start and
    /// duration, on whose end `into` is drawn.
    pub arrived_in: Option<(u64, u64)>,
}

/// Messages that have no arrow, though their calls are in the trace.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Unlinked {
    /// Calls of processes the trace does not hold from `MPI_Init` on.
    pub not_from_init: u64,
    /// Receives after a wildcard receive nobody could resolve, on its communicator.
    pub after_unresolved_wildcard: u64,
    /// Calls whose rank in their communicator, or whose communicator's identity across
    /// processes, is not known.
    pub communicator_unknown: u64,
    /// Calls on channels past [`MAX_CHANNELS`].
    pub too_many_channels: u64,
    /// Calls on a channel on which their process also made a persistent request
    /// (`MPI_Send_init`, `MPI_Recv_init` ...): its starts name no message, so the
    /// channel's messages cannot be numbered there.
    #[serde(default)]
    pub persistent_channel: u64,
}

impl Unlinked {
    /// Calls not numbered, for every reason.
    pub fn total(&self) -> u64 {
        self.not_from_init
            + self.after_unresolved_wildcard
            + self.communicator_unknown
            + self.too_many_channels
            + self.persistent_channel
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Unlinked) {
        self.not_from_init += other.not_from_init;
        self.after_unresolved_wildcard += other.after_unresolved_wildcard;
        self.communicator_unknown += other.communicator_unknown;
        self.too_many_channels += other.too_many_channels;
        self.persistent_channel += other.persistent_channel;
    }
}

/// One side of a channel: (receiving side, communicator's hash, sender, receiver, tag).
type ChannelEnd = (bool, u64, i32, i32, i32);

/// A call, by when it started, its process and its thread.
type CallKey = (u64, u32, u32);

/// Detached processes [`Flows`] keeps numbering no more, at most (past it, the set starts
/// again: a held `MPI_Init` of a process detached long before could number it again).
const MAX_STOPPED: usize = 1 << 16;

/// Numbers the messages of every channel, on both sides, as the calls come.
#[derive(Debug, Default)]
pub struct Flows {
    /// Processes whose `MPI_Init` the trace holds.
    from_init: HashSet<u32>,
    /// Processes detached since (at most [`MAX_STOPPED`]): numbered no more, even where
    /// an `MPI_Init` of theirs comes after the detach is told (a call held back).
    stopped: HashSet<u32>,
    /// (process, communicator) whose receives cannot be numbered any more.
    lost_track: HashSet<(u32, u64)>,
    /// Messages numbered so far on each side of each channel.
    counted: HashMap<ChannelEnd, u64>,
    /// Channel ends on which a persistent request was made: numbered no more.
    persistent: HashSet<ChannelEnd>,
    /// The flows of nonblocking receives whose message has not been seen to arrive, by
    /// the posting call (oldest first).
    posted: BTreeMap<CallKey, u64>,
    /// Flows whose message arrived in a call whose own event is still to come.
    arrived: BTreeMap<CallKey, Vec<u64>>,
    /// Each thread's last call (start, duration), for the arrivals that follow it.
    last_call: HashMap<(u32, u32), (u64, u64)>,
    /// Posted receives given up for room.
    given_up: u64,
    /// What could not be numbered.
    pub unlinked: Unlinked,
}

impl Flows {
    /// Process `pid`'s calls from now on do not go on from those before (a detach): its
    /// messages are numbered no more.
    pub fn stopped(&mut self, pid: u32) {
        self.from_init.remove(&pid);
        if self.stopped.len() >= MAX_STOPPED {
            self.stopped.clear();
        }
        self.stopped.insert(pid);
    }

    /// Process `pid` exited (its calls all came before): its pid may be another process's
    /// from now on, numbered from its own `MPI_Init`.
    pub fn exited(&mut self, pid: u32) {
        self.from_init.remove(&pid);
        self.stopped.remove(&pid);
    }

    /// Numbers `ev`'s messages, if it moves any; the flows its slice draws. An arrival
    /// (no call) draws none: its flow ends on the call it names, which comes next.
    pub fn ends(&mut self, ev: &pb::CallEvent) -> FlowEnds {
        let mut ends = FlowEnds::default();
        if let Some(a) = &ev.arrival {
            let posted = (a.posted_start_ns, ev.pid, a.posted_tid);
            let Some(flow) = self.posted.remove(&posted) else {
                return ends;
            };
            let call = (ev.pid, ev.tid);
            let follows = a.follows_call.then(|| self.last_call.get(&call)).flatten();
            if a.untold || (a.follows_call && follows.is_none_or(|c| c.0 != ev.start_ns)) {
                // Untold, or following a call whose event was lost.
                self.given_up += 1;
                ends.unplaced.push(flow);
                return ends;
            }
            if let Some(&call) = follows {
                ends.into.push(flow);
                ends.arrived_in = Some(call);
                return ends;
            }
            let into = self.arrived.entry((ev.start_ns, ev.pid, ev.tid));
            into.or_default().push(flow);
            if self.arrived.len() > MAX_POSTED {
                // A call whose event never came (lost): its arrivals are given up.
                if let Some((_, lost)) = self.arrived.pop_first() {
                    self.given_up += lost.len() as u64;
                    ends.unplaced.extend(lost);
                }
            }
            return ends;
        }
        if self.last_call.len() >= MAX_POSTED {
            // Threads long gone: an arrival follows its call at once.
            self.last_call.clear();
        }
        self.last_call
            .insert((ev.pid, ev.tid), (ev.start_ns, ev.duration_ns));
        let (mut ends, dir) = self.numbered(ev);
        if !self.arrived.is_empty() {
            if let Some(into) = self.arrived.remove(&(ev.start_ns, ev.pid, ev.tid)) {
                ends.into.extend(into);
            }
        }
        if let Some(flow) = ends.posted {
            if dir == Some(Direction::SendAndPost) {
                // Its request is not followed: its arrival will never come.
                self.given_up += 1;
                ends.unplaced.push(flow);
            } else {
                self.posted.insert((ev.start_ns, ev.pid, ev.tid), flow);
                if self.posted.len() > MAX_POSTED {
                    if let Some((_, oldest)) = self.posted.pop_first() {
                        self.given_up += 1;
                        ends.unplaced.push(oldest);
                    }
                }
            }
        }
        ends
    }

    /// Nonblocking receives numbered whose message's arrival the trace has not seen: past
    /// what the kernel follows in one call, freed, given up for room or posted by
    /// `MPI_Isendrecv`, or still waiting.
    pub fn arrivals_not_seen(&self) -> u64 {
        self.given_up + self.posted.len() as u64
    }

    /// [`Flows::ends`] of a call by its own arguments, and the way it moves messages.
    fn numbered(&mut self, ev: &pb::CallEvent) -> (FlowEnds, Option<Direction>) {
        let Some(r) = routine(&ev.routine) else {
            return (FlowEnds::default(), None);
        };
        if r.spec.class == class::INIT && !self.stopped.contains(&ev.pid) {
            self.from_init.insert(ev.pid);
        }
        let Some(dir) = direction(r) else {
            if let Some(receiving) = persistent_end(r) {
                self.persistent_made(ev, receiving);
            }
            return (FlowEnds::default(), None);
        };
        if !self.from_init.contains(&ev.pid) {
            self.unlinked.not_from_init += 1;
            return (FlowEnds::default(), Some(dir));
        }
        let (Some(me), true) = (
            ev.comm_rank,
            !ev.comm.is_empty() && !ev.comm.starts_with("local:"),
        ) else {
            self.unlinked.communicator_unknown += 1;
            return (FlowEnds::default(), Some(dir));
        };
        let peer = ev.peer.unwrap_or(CallEvent::PEER_NONE);
        let tag = ev.tag.unwrap_or(-1);
        let comm = fnv(FNV_START, ev.comm.as_bytes());
        let mut ends = FlowEnds::default();
        if matches!(
            dir,
            Direction::Send | Direction::Both | Direction::SendAndPost
        ) {
            ends.out = self.number(ev.pid, (false, comm, me, peer, tag));
        }
        let received = match dir {
            Direction::Both | Direction::SendAndPost => Some((
                ev.recv_peer.unwrap_or(CallEvent::PEER_NONE),
                ev.recv_tag.unwrap_or(-1),
            )),
            Direction::Receive | Direction::Post => Some((peer, tag)),
            Direction::Send => None,
        };
        if let Some((from, tag)) = received {
            let into = self.number(ev.pid, (true, comm, from, me, tag));
            if matches!(dir, Direction::Post | Direction::SendAndPost) {
                ends.posted = into;
            } else {
                ends.into.extend(into);
            }
        }
        (ends, Some(dir))
    }

    /// A persistent request's creation `ev`: its channel end is numbered no more (a
    /// receive's with a wildcard: its communicator's receives, as after a wildcard nobody
    /// resolved).
    fn persistent_made(&mut self, ev: &pb::CallEvent, receiving: bool) {
        let (Some(me), Some(peer), Some(tag)) = (ev.comm_rank, ev.peer, ev.tag) else {
            return;
        };
        if ev.comm.is_empty() || peer == CallEvent::PEER_NONE {
            return;
        }
        let comm = fnv(FNV_START, ev.comm.as_bytes());
        if receiving && (peer < 0 || tag < 0) {
            self.lost_track.insert((ev.pid, comm));
        } else if self.persistent.len() < MAX_CHANNELS {
            self.persistent.insert(if receiving {
                (true, comm, peer, me, tag)
            } else {
                (false, comm, me, peer, tag)
            });
        }
    }

    /// The id of the next message at this end of its channel.
    fn number(&mut self, pid: u32, end: ChannelEnd) -> Option<u64> {
        let (receiving, comm, from, to, tag) = end;
        let peer = if receiving { from } else { to };
        // A send to no rank (MPI_PROC_NULL, whatever its value in the library's ABI) moves
        // no message.
        if peer == CallEvent::PEER_NONE || (!receiving && peer < 0) {
            return None;
        }
        if receiving {
            let track = (pid, comm);
            if self.lost_track.contains(&track) {
                self.unlinked.after_unresolved_wildcard += 1;
                return None;
            }
            if peer < 0 || tag < 0 {
                // Which message it took is unknown: the next ones on this communicator
                // cannot be numbered either.
                self.lost_track.insert(track);
                self.unlinked.after_unresolved_wildcard += 1;
                return None;
            }
        }
        if !self.persistent.is_empty() && self.persistent.contains(&end) {
            self.unlinked.persistent_channel += 1;
            return None;
        }
        if self.counted.len() >= MAX_CHANNELS && !self.counted.contains_key(&end) {
            self.unlinked.too_many_channels += 1;
            return None;
        }
        let n = self.counted.entry(end).or_insert(0);
        let k = *n;
        *n += 1;
        // The same on both sides; never 0, which readers take for "no flow".
        let id = [
            &comm.to_le_bytes()[..],
            &from.to_le_bytes(),
            &to.to_le_bytes(),
            &tag.to_le_bytes(),
            &k.to_le_bytes(),
        ]
        .iter()
        .fold(FNV_START, |h, bytes| fnv(h, bytes));
        Some(id | 1)
    }
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a: `bytes` folded into `h`.
fn fnv(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call of `routine` by rank `me` (process `me + 1`) on a named world.
    fn call(me: i32, routine: &str, send: (i32, i32), recv: Option<(i32, i32)>) -> pb::CallEvent {
        pb::CallEvent {
            pid: me as u32 + 1,
            routine: routine.into(),
            comm: "world".into(),
            comm_rank: Some(me),
            peer: Some(send.0),
            tag: Some(send.1),
            recv_peer: recv.map(|r| r.0),
            recv_tag: recv.map(|r| r.1),
            ..Default::default()
        }
    }

    /// A process detached (or watched again after it) numbers no message from then on,
    /// even where its `MPI_Init` comes after (held back until its job was known).
    #[test]
    fn a_detached_process_numbers_no_message() {
        let mut f = Flows::default();
        f.ends(&call(0, "MPI_Init", (-1, -1), None));
        f.stopped(2);
        f.ends(&call(1, "MPI_Init", (-1, -1), None));
        let sent = f.ends(&call(0, "MPI_Send", (1, 5), None));
        assert!(sent.out.is_some(), "{sent:?}");
        let received = f.ends(&call(1, "MPI_Recv", (0, 5), None));
        assert!(received.into.is_empty(), "{received:?}");
        assert_eq!(f.unlinked.not_from_init, 1);
    }

    #[test]
    fn an_isendrecv_sends_at_its_call_and_posts_its_receive() {
        let mut f = Flows::default();
        for me in [0, 1] {
            f.ends(&call(me, "MPI_Init", (-1, -1), None));
        }
        // Rank 0 sends tag 5 to rank 1 and posts a receive of tag 6 from it; rank 1 takes
        // the first with a blocking receive and sends the second with a blocking send.
        let a = f.ends(&call(0, "MPI_Isendrecv", (1, 5), Some((1, 6))));
        assert!(a.out.is_some() && a.posted.is_some(), "{a:?}");
        assert_eq!(
            a.into,
            Vec::<u64>::new(),
            "its message arrives in a later wait"
        );
        let b = f.ends(&call(1, "MPI_Recv", (0, 5), None));
        assert_eq!(b.into, Vec::from_iter(a.out));
        let c = f.ends(&call(1, "MPI_Send", (0, 6), None));
        assert_eq!(c.out, a.posted);
    }

    #[test]
    fn a_channel_with_a_persistent_request_numbers_no_message() {
        let mut f = Flows::default();
        for me in [0, 1] {
            f.ends(&call(me, "MPI_Init", (-1, -1), None));
        }
        // Rank 0 sends on tag 3 with a persistent request (whose starts name no message),
        // then with MPI_Send; rank 1 takes both with MPI_Recv. Numbered, the MPI_Send's
        // message would be the first of the channel, and its arrow would end on the receive
        // of the persistent one's.
        f.ends(&call(0, "MPI_Send_init", (1, 3), None));
        f.ends(&call(0, "MPI_Start", (-1, -1), None));
        let send = f.ends(&call(0, "MPI_Send", (1, 3), None));
        assert_eq!(send.out, None);
        assert_eq!(f.unlinked.persistent_channel, 1);
        let first = f.ends(&call(1, "MPI_Recv", (0, 3), None));
        assert_eq!(
            first.into.len(),
            1,
            "numbered, with no send to match: no arrow"
        );
        // Another tag is numbered as ever.
        let other = f.ends(&call(0, "MPI_Send", (1, 4), None));
        assert!(other.out.is_some());
        assert_eq!(
            f.ends(&call(1, "MPI_Recv", (0, 4), None)).into,
            Vec::from_iter(other.out)
        );
    }

    /// A wait at `start_ns` of rank `me`'s process, and the arrivals the kernel sends
    /// before it: one per receive (by its start) it completed.
    fn wait(me: i32, start_ns: u64, received: &[u64]) -> Vec<pb::CallEvent> {
        let at = |routine: &str| pb::CallEvent {
            pid: me as u32 + 1,
            tid: me as u32 + 1,
            routine: routine.into(),
            start_ns,
            ..Default::default()
        };
        let mut events: Vec<pb::CallEvent> = received
            .iter()
            .map(|posted| pb::CallEvent {
                arrival: Some(pb::Arrival {
                    posted_tid: me as u32 + 1,
                    posted_start_ns: *posted,
                    ..Default::default()
                }),
                ..at("MPI_Waitall")
            })
            .collect();
        events.push(at("MPI_Waitall"));
        events
    }

    #[test]
    fn the_messages_of_nonblocking_receives_end_on_the_wait_that_completed_them() {
        let mut f = Flows::default();
        for me in [0, 1] {
            f.ends(&call(me, "MPI_Init", (-1, -1), None));
        }
        // Rank 1 posts two receives (tags 7 and 8) and a third (tag 9); rank 0 sends all
        // three; rank 1 waits for the first two together, then leaves the third to a test.
        let post = |tag: i32, start_ns: u64| pb::CallEvent {
            tid: 2,
            start_ns,
            ..call(1, "MPI_Irecv", (0, tag), None)
        };
        let posts: Vec<FlowEnds> = [(7, 10), (8, 20), (9, 30)]
            .iter()
            .map(|&(tag, at)| f.ends(&post(tag, at)))
            .collect();
        let sent: Vec<Option<u64>> = [7, 8, 9]
            .iter()
            .map(|&tag| f.ends(&call(0, "MPI_Isend", (1, tag), None)).out)
            .collect();
        for (p, s) in posts.iter().zip(&sent) {
            assert_eq!(p.posted, *s, "a post and its send name one flow");
            assert_eq!(p.into, Vec::<u64>::new());
        }
        let mut events = wait(1, 40, &[10, 20]).into_iter();
        for arrival in events.by_ref().take(2) {
            assert_eq!(f.ends(&arrival), FlowEnds::default(), "no slice of its own");
        }
        let waited = f.ends(&events.next().expect("the wait"));
        assert_eq!(waited.into, [sent[0].unwrap(), sent[1].unwrap()]);
        assert_eq!(f.arrivals_not_seen(), 1, "the third's arrival was not seen");
        // A test may have completed it: its arrival will not be known.
        let mut tested = wait(1, 45, &[30]).remove(0);
        if let Some(a) = tested.arrival.as_mut() {
            a.untold = true;
        }
        let untold = f.ends(&tested);
        assert_eq!(
            (untold.into, untold.unplaced),
            (vec![], vec![sent[2].unwrap()])
        );
        assert_eq!(f.arrivals_not_seen(), 1, "counted once");
        // A receive a test said it completed: its arrival follows the test's event, and
        // its arrow ends on the test's end.
        let flow = f.ends(&post(9, 60)).posted.expect("numbered");
        let test = pb::CallEvent {
            duration_ns: 5,
            ..wait(1, 70, &[]).remove(0)
        };
        assert_eq!(f.ends(&test).into, Vec::<u64>::new());
        let mut follows = wait(1, 70, &[60]).remove(0);
        if let Some(a) = follows.arrival.as_mut() {
            a.follows_call = true;
        }
        let ends = f.ends(&follows);
        assert_eq!((ends.into, ends.arrived_in), (vec![flow], Some((70, 5))));
        // An arrival naming no receive the trace numbered draws nothing.
        let mut events = wait(1, 50, &[99]).into_iter();
        f.ends(&events.next().expect("an arrival"));
        assert_eq!(
            f.ends(&events.next().expect("the wait")).into,
            Vec::<u64>::new()
        );
    }
}
