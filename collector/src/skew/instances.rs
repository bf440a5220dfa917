//! Collective instances: each process's collectives on a communicator numbered in call
//! order, the same numbers matched across processes, an instance finished when every
//! member has arrived (or given up on as incomplete).
//!
//! Processes watched from their start number their calls from the first, so the numbers
//! agree as they are. A process attached mid-job, or one that lost call events (a full
//! ring buffer, seen as a gap in its threads' event numbers), starts counting somewhere
//! else: its calls wait in a buffer until they can be aligned by time. Every member of a
//! collective is inside the call while the others are (a collective cannot finish before
//! its last member arrives), so a call overlaps the calls of the other members of its own
//! instance: each buffered call votes for the offset that puts it on the instance whose
//! members' span it overlaps longest (the member that arrives last also leaves last, after
//! the first to leave has entered the next instance: its call overlaps that one too, but
//! briefly), and the offset with most votes (unique, and at least half of the calls) wins. When no member is aligned yet (attach), the member attached last
//! defines the numbering: its first call is the first instance every member was watched
//! for. Calls that find no instance are counted as unaligned, never guessed.

use std::collections::{BTreeMap, VecDeque};

use collector_common::instances;

use super::{identity::CommKey, FastMap};

/// One member's part in an instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Process id.
    pub pid: u32,
    /// Monotonic ns at entry (arrival).
    pub start_ns: u64,
    /// Monotonic ns at return (departure).
    pub end_ns: u64,
    /// It is the collective's root (its rank in the communicator is the one the call names
    /// as root): who waits for whom at `MPI_Bcast` or `MPI_Reduce` depends on it.
    pub root: bool,
}

impl Arrival {
    /// How long the member was inside the call.
    fn duration(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// A collective call as the matcher takes it.
#[derive(Clone, Copy, Debug)]
pub struct Collective {
    /// Its communicator.
    pub comm: CommKey,
    /// The communicator's size (0: unknown).
    pub size: u32,
    /// Routine id.
    pub routine: u16,
    /// Size bucket.
    pub bucket: u8,
    /// Whether the call returns before the collective completes (`MPI_Iallreduce`): it
    /// takes a number, but its times say nothing of the others'.
    pub nonblocking: bool,
    /// Whether the process was watched since the communicator was made (its creation, or
    /// `MPI_Init` for the world, was seen): then its count of calls there is the number.
    pub from_start: bool,
    /// Its number as the kernel counted it from the communicator's creation: then only the
    /// instances [`collector_common::instances`] draws come from this process.
    pub number: Option<u64>,
    /// Who and when.
    pub arrival: Arrival,
}

/// A finished instance.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Its communicator.
    pub comm: CommKey,
    /// Its number on the communicator.
    pub seq: u64,
    /// Routine id (of its first arrival).
    pub routine: u16,
    /// Size bucket (of its first arrival).
    pub bucket: u8,
    /// Every member arrived.
    pub complete: bool,
    /// Members of the communicator this matcher follows (those on this node).
    pub local_members: usize,
    /// Whether its number counts from the communicator's creation (some member here was
    /// watched since then and never lost track): comparable with other nodes' numbers.
    /// Else this node numbered from where it started watching (attached mid-job).
    pub numbered_from_start: bool,
    /// The communicator's size (0: unknown).
    pub size: u32,
    /// The members seen.
    pub arrivals: Vec<Arrival>,
    /// How many instances it stands for: 1, or where the kernel numbers the communicator's
    /// instances and sends one in a stride, the stride ([`collector_common::instances`]).
    pub weight: u64,
}

impl Instance {
    /// Every member on this node arrived and the others are on other nodes: matched only
    /// where all nodes' parts meet (the aggregator).
    pub fn is_remote(&self) -> bool {
        !self.complete
            && self.arrivals.len() == self.local_members
            && self.local_members < self.size as usize
    }
}

/// What the matcher could not place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatchCounts {
    /// Calls that could not be aligned with the other members' (no unique offset, or their
    /// instance was already closed).
    pub unaligned: u64,
    /// Calls that arrived twice at one instance (a misalignment caught).
    pub conflicts: u64,
}

/// Buffered calls an alignment waits for (and retries after each as many more).
const MIN_ALIGN: usize = 16;
/// Buffered calls kept per unaligned member; older ones are counted unaligned.
const MAX_BUFFER: usize = 512;
/// Recent instance spans kept per communicator for alignment.
const MAX_SPANS: usize = 1024;
/// Open instances kept per communicator; older ones are closed as incomplete.
const MAX_OPEN: usize = 8192;
/// An instance no member arrived at for this long (on the calls' clock) is closed.
pub const EXPIRE_NS: u64 = 30_000_000_000;
/// An instance whose members on this node all arrived, the others being elsewhere, is
/// handed on once it is this old (a local member that starts late still makes it in).
pub const HANDOFF_NS: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy)]
struct Span {
    min_start: u64,
    max_end: u64,
}

/// Recent instances' spans by number, lowest first, at most [`MAX_SPANS`]. Numbers come
/// mostly in order, so a sorted deque takes a new one at its end and drops the oldest at
/// its front, where a B-tree walked its nodes for both, at every call
/// (`commtap bench-matching`).
#[derive(Debug, Default)]
struct Spans(VecDeque<(u64, Span)>);

impl Spans {
    fn find(&self, seq: u64) -> Result<usize, usize> {
        match self.0.back() {
            Some(&(last, _)) if seq > last => Err(self.0.len()),
            Some(&(last, _)) if seq == last => Ok(self.0.len() - 1),
            _ => self.0.binary_search_by_key(&seq, |(s, _)| *s),
        }
    }

    fn contains(&self, seq: u64) -> bool {
        self.find(seq).is_ok()
    }

    /// Widens instance `seq`'s span to take in `a` (a new span if it has none), dropping
    /// the oldest past [`MAX_SPANS`].
    fn widen(&mut self, seq: u64, a: Arrival) {
        match self.find(seq) {
            Ok(i) => {
                let span = &mut self.0[i].1;
                span.min_start = span.min_start.min(a.start_ns);
                span.max_end = span.max_end.max(a.end_ns);
            }
            Err(i) => self.0.insert(
                i,
                (
                    seq,
                    Span {
                        min_start: a.start_ns,
                        max_end: a.end_ns,
                    },
                ),
            ),
        }
        while self.0.len() > MAX_SPANS {
            self.0.pop_front();
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The lowest-numbered span kept.
    fn oldest(&self) -> Option<&Span> {
        self.0.front().map(|(_, s)| s)
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Span)> {
        self.0.iter().map(|(seq, s)| (*seq, s))
    }
}

#[derive(Debug)]
struct Buffered {
    local: u64,
    routine: u16,
    bucket: u8,
    arrival: Arrival,
}

#[derive(Debug, Default)]
struct Stream {
    /// The local number of the process's next collective on the communicator.
    next_local: u64,
    /// seq = local + offset, once known.
    offset: Option<i64>,
    /// Watched since the communicator was made, and no call lost since: its count is the
    /// communicator's own numbering (which the others are aligned to).
    anchored: bool,
    /// Its calls came numbered by the kernel (only the drawn instances).
    kernel: bool,
    buffer: VecDeque<Buffered>,
}

#[derive(Debug)]
struct Open {
    routine: u16,
    bucket: u8,
    arrivals: Vec<Arrival>,
    newest_ns: u64,
}

#[derive(Debug, Default)]
struct Comm {
    size: u32,
    streams: FastMap<u32, Stream>,
    open: BTreeMap<u64, Open>,
    spans: Spans,
    /// One past the highest number used.
    next_fresh: u64,
    /// Some member's calls come numbered by the kernel, only those drawn: every member's
    /// numbered from the creation are then taken as drawn, or not at all.
    drawn: bool,
}

/// Matches collective calls into instances.
#[derive(Debug, Default)]
pub struct Matcher {
    comms: FastMap<CommKey, Comm>,
    newest_ns: u64,
    /// What could not be placed.
    pub counts: MatchCounts,
}

impl Matcher {
    /// Takes one collective call; finished instances go to `out`. Returns its number on
    /// its communicator when that is known now (not while its process is being aligned).
    pub fn arrive(&mut self, c: Collective, out: &mut Vec<Instance>) -> Option<u64> {
        self.newest_ns = self.newest_ns.max(c.arrival.end_ns);
        let from_start = c.from_start;
        let comm = self.comms.entry(c.comm).or_default();
        if c.size > 0 {
            comm.size = c.size;
        }
        let stream = comm.streams.entry(c.arrival.pid).or_insert_with(|| Stream {
            offset: from_start.then_some(0),
            anchored: from_start,
            ..Stream::default()
        });
        if let Some(n) = c.number {
            // The kernel's count is the communicator's numbering, whatever was lost.
            stream.next_local = n;
            stream.offset = Some(0);
            stream.anchored = true;
            stream.kernel = true;
            comm.drawn = true;
        } else if stream.kernel {
            // The kernel stopped numbering it (detached, events switched off): the calls
            // not drawn before were never sent, so its own count from here means nothing.
            stream.kernel = false;
            stream.offset = None;
            stream.anchored = false;
        }
        let local = stream.next_local;
        stream.next_local += 1;
        let known = stream
            .offset
            .and_then(|off| u64::try_from(local as i64 + off).ok());
        if c.nonblocking {
            return known;
        }
        if let Some(off) = stream.offset {
            let seq = local as i64 + off;
            place(
                comm,
                c.comm,
                seq,
                c.routine,
                c.bucket,
                c.arrival,
                &mut self.counts,
                out,
            );
        } else {
            stream.buffer.push_back(Buffered {
                local,
                routine: c.routine,
                bucket: c.bucket,
                arrival: c.arrival,
            });
            if stream.buffer.len() > MAX_BUFFER {
                stream.buffer.pop_front();
                self.counts.unaligned += 1;
            }
            if stream.buffer.len().is_multiple_of(MIN_ALIGN) {
                align(comm, c.comm, false, &mut self.counts, out);
            }
        }
        known
    }

    /// Whether `comm`'s instances are numbered from its creation (a rank of it was watched
    /// from there, or the kernel counted them): the same numbers on every node. Else they
    /// count from where this node began watching.
    pub fn numbered_from_start(&self, comm: CommKey) -> bool {
        self.comms.get(&comm).is_some_and(Comm::numbered_from_start)
    }

    /// The highest instance number `pid` arrived at (aligned), on any communicator.
    pub fn highest_seq(&self, pid: u32) -> Option<u64> {
        self.comms
            .values()
            .filter_map(|c| {
                let s = c.streams.get(&pid)?;
                let last = s.next_local.checked_sub(1)? as i64 + s.offset?;
                u64::try_from(last).ok()
            })
            .max()
    }

    /// Events of `pid` were lost: its numbering is no longer known on any communicator.
    pub fn lost(&mut self, pid: u32) {
        for comm in self.comms.values_mut() {
            if let Some(s) = comm.streams.get_mut(&pid) {
                s.offset = None;
                s.anchored = false;
            }
        }
    }

    /// `pid` was detached, or is watched again after it: its numbering is no longer known,
    /// and its calls waiting to be aligned by time are another run's than those to come
    /// (counted as unaligned).
    pub fn detached(&mut self, pid: u32) {
        self.lost(pid);
        let waiting = self
            .comms
            .values_mut()
            .filter_map(|c| c.streams.get_mut(&pid));
        for s in waiting {
            self.counts.unaligned += s.buffer.len() as u64;
            s.buffer.clear();
        }
    }

    /// Closes the instances nobody arrived at for [`EXPIRE_NS`], and hands on those whose
    /// other members are on other nodes after [`HANDOFF_NS`].
    pub fn expire(&mut self, out: &mut Vec<Instance>) {
        let horizon = self.newest_ns.saturating_sub(EXPIRE_NS);
        let handoff = self.newest_ns.saturating_sub(HANDOFF_NS);
        for (key, comm) in &mut self.comms {
            let local = comm.streams.len();
            let elsewhere = local < comm.size as usize;
            let old: Vec<u64> = comm
                .open
                .iter()
                .filter(|(_, o)| {
                    o.newest_ns < horizon
                        || (elsewhere && o.arrivals.len() >= local && o.newest_ns < handoff)
                })
                .map(|(s, _)| *s)
                .collect();
            for seq in old {
                close(comm, *key, seq, out);
            }
        }
    }

    /// Aligns what can be and closes every open instance.
    pub fn finish(&mut self, out: &mut Vec<Instance>) {
        for (key, comm) in &mut self.comms {
            align(comm, *key, true, &mut self.counts, out);
            for s in comm.streams.values_mut() {
                self.counts.unaligned += s.buffer.len() as u64;
                s.buffer.clear();
            }
            let seqs: Vec<u64> = comm.open.keys().copied().collect();
            for seq in seqs {
                close(comm, *key, seq, out);
            }
        }
    }
}

/// Puts one aligned call on its instance.
#[allow(clippy::too_many_arguments)]
fn place(
    comm: &mut Comm,
    key: CommKey,
    seq: i64,
    routine: u16,
    bucket: u8,
    a: Arrival,
    counts: &mut MatchCounts,
    out: &mut Vec<Instance>,
) {
    let Ok(seq) = u64::try_from(seq) else {
        counts.unaligned += 1;
        return;
    };
    if comm.drawn && !instances::drawn(seq) {
        // A member whose calls all come (its count kept here): the others sent only the
        // drawn instances.
        return;
    }
    if !comm.open.contains_key(&seq) && seq < comm.next_fresh && comm.spans.contains(seq) {
        // Its instance was closed already (expired, or the others all came).
        counts.unaligned += 1;
        return;
    }
    comm.next_fresh = comm.next_fresh.max(seq + 1);
    let open = comm.open.entry(seq).or_insert_with(|| Open {
        routine,
        bucket,
        arrivals: Vec::new(),
        newest_ns: 0,
    });
    if open.arrivals.iter().any(|x| x.pid == a.pid) {
        counts.conflicts += 1;
        return;
    }
    open.arrivals.push(a);
    open.newest_ns = open.newest_ns.max(a.end_ns);
    comm.spans.widen(seq, a);
    let full = comm.size > 0 && open.arrivals.len() >= comm.size as usize;
    if full {
        close(comm, key, seq, out);
    }
    while comm.open.len() > MAX_OPEN {
        let first = *comm.open.keys().next().expect("not empty");
        close(comm, key, first, out);
    }
}

impl Comm {
    /// Whether its instances are numbered from its creation (a rank of it anchored there).
    fn numbered_from_start(&self) -> bool {
        self.streams.values().any(|s| s.anchored)
    }
}

fn close(comm: &mut Comm, key: CommKey, seq: u64, out: &mut Vec<Instance>) {
    if let Some(o) = comm.open.remove(&seq) {
        out.push(Instance {
            comm: key,
            seq,
            routine: o.routine,
            bucket: o.bucket,
            complete: comm.size > 0 && o.arrivals.len() == comm.size as usize,
            local_members: comm.streams.len(),
            numbered_from_start: comm.numbered_from_start(),
            size: comm.size,
            arrivals: o.arrivals,
            weight: if comm.drawn {
                instances::stride(seq)
            } else {
                1
            },
        });
    }
}

/// Aligns the communicator's buffered members where their calls allow (`force`: at the
/// end, with whatever is buffered).
fn align(
    comm: &mut Comm,
    key: CommKey,
    force: bool,
    counts: &mut MatchCounts,
    out: &mut Vec<Instance>,
) {
    let waiting: Vec<u32> = comm
        .streams
        .iter()
        .filter(|(_, s)| s.offset.is_none() && !s.buffer.is_empty())
        .map(|(p, _)| *p)
        .collect();
    if waiting.is_empty() {
        return;
    }
    let any_aligned = comm.streams.values().any(|s| s.offset.is_some()) && !comm.spans.is_empty();
    if !any_aligned {
        // Nobody's numbering is known: the member watched last starts it, once every
        // member has shown enough calls to be aligned against it.
        let ready = comm.size > 0
            && comm.streams.len() >= comm.size as usize
            && waiting.len() == comm.streams.len()
            && comm.streams.values().all(|s| s.buffer.len() >= MIN_ALIGN);
        if !ready && !force {
            return;
        }
        let Some(&first) = waiting.iter().max_by_key(|p| {
            (
                comm.streams[p].buffer.front().map(|b| b.arrival.start_ns),
                **p,
            )
        }) else {
            return;
        };
        let s = comm.streams.get_mut(&first).expect("waiting");
        let local0 = s.buffer.front().expect("not empty").local;
        s.offset = Some(comm.next_fresh as i64 - local0 as i64);
        flush(comm, key, first, counts, out);
    }
    for pid in waiting {
        if comm.streams[&pid].offset.is_some() {
            continue;
        }
        if let Some(off) = vote(comm, pid, force) {
            comm.streams.get_mut(&pid).expect("waiting").offset = Some(off);
            flush(comm, key, pid, counts, out);
        } else if let Some(oldest) = comm.spans.oldest().map(|s| s.min_start) {
            // Calls that ended before every span cannot match any: they belong to
            // instances from before the others were watched.
            let s = comm.streams.get_mut(&pid).expect("waiting");
            while s.buffer.front().is_some_and(|b| b.arrival.end_ns < oldest) {
                s.buffer.pop_front();
                counts.unaligned += 1;
            }
        }
    }
}

/// Whether a call (or a node's part) overlapping an instance by `overlap` ns, of `call_ns`
/// against the instance's `span_ns`, may vote for it where only drawn instances have spans:
/// a call of an instance not drawn overlaps only its neighbours' edges, so it must overlap
/// for at least half of the shorter of the two.
pub(crate) fn votes_among_drawn(overlap: u64, call_ns: u64, span_ns: u64) -> bool {
    overlap * 2 >= call_ns.min(span_ns)
}

/// The offset most of `pid`'s buffered calls agree on, if it is clear.
fn vote(comm: &Comm, pid: u32, force: bool) -> Option<i64> {
    let buffer = &comm.streams[&pid].buffer;
    let mut votes: FastMap<i64, usize> = FastMap::default();
    let mut voters = 0;
    for b in buffer {
        // (overlap, instance, another overlaps as long)
        let mut best: Option<(u64, u64, bool)> = None;
        for (seq, span) in comm.spans.iter() {
            let (from, to) = (
                b.arrival.start_ns.max(span.min_start),
                b.arrival.end_ns.min(span.max_end),
            );
            let Some(overlap) = to.checked_sub(from) else {
                continue;
            };
            if comm.drawn
                && !votes_among_drawn(overlap, b.arrival.duration(), span.max_end - span.min_start)
            {
                continue;
            }
            best = match best {
                Some((o, s, _)) if overlap == o => Some((o, s, true)),
                Some(kept) if overlap < kept.0 => Some(kept),
                _ => Some((overlap, seq, false)),
            };
        }
        if let Some((_, seq, tied)) = best {
            voters += 1;
            if !tied {
                *votes.entry(seq as i64 - b.local as i64).or_default() += 1;
            }
        }
    }
    let mut ranked: Vec<(usize, i64)> = votes.into_iter().map(|(o, n)| (n, o)).collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    let (best, offset) = *ranked.first()?;
    let runner_up = ranked.get(1).map_or(0, |r| r.0);
    let enough = if force { 1 } else { MIN_ALIGN / 2 };
    (best > runner_up && best >= enough && best * 2 >= voters).then_some(offset)
}

/// Places an aligned member's buffered calls.
fn flush(
    comm: &mut Comm,
    key: CommKey,
    pid: u32,
    counts: &mut MatchCounts,
    out: &mut Vec<Instance>,
) {
    let s = comm.streams.get_mut(&pid).expect("stream");
    let off = s.offset.expect("aligned");
    let buffered: Vec<Buffered> = s.buffer.drain(..).collect();
    for b in buffered {
        place(
            comm,
            key,
            b.local as i64 + off,
            b.routine,
            b.bucket,
            b.arrival,
            counts,
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: CommKey = CommKey::WORLD;

    /// Calls of `pids` on a world of `size`: instance i runs from 10i ms, each member
    /// inside it from `start` to 10i+5 ms.
    fn call(pid: u32, size: u32, i: u64, late: u64) -> Collective {
        Collective {
            comm: K,
            size,
            routine: 1,
            bucket: 3,
            nonblocking: false,
            from_start: true,
            number: None,
            arrival: Arrival {
                pid,
                start_ns: i * 10_000_000 + late,
                end_ns: i * 10_000_000 + 5_000_000,
                root: false,
            },
        }
    }

    #[test]
    fn from_start_matches_by_number() {
        let mut m = Matcher::default();
        let mut out = Vec::new();
        for i in 0..3 {
            for p in 0..3 {
                m.arrive(call(p, 3, i, u64::from(p) * 1000), &mut out);
            }
        }
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(|i| i.complete && i.arrivals.len() == 3));
        assert_eq!(out.iter().map(|i| i.seq).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn kernel_numbers_place_the_drawn_instances_with_their_weights() {
        // Members 0 and 1 send only the instances the kernel drew, numbered; member 2's
        // count is its own (the kernel had no room for its number) and it sends all: its
        // instances not drawn are dropped, the drawn ones meet the others'.
        let mut m = Matcher::default();
        let mut out = Vec::new();
        let n = 3 * instances::ALL_BELOW;
        for i in 0..n {
            for p in 0..3u32 {
                let numbered = p < 2;
                if numbered && !instances::drawn(i) {
                    continue;
                }
                let c = Collective {
                    number: numbered.then_some(i),
                    ..call(p, 3, i, u64::from(p) * 1000)
                };
                m.arrive(c, &mut out);
            }
        }
        m.finish(&mut out);
        assert_eq!(m.counts, MatchCounts::default());
        assert!(out.iter().all(|i| i.complete), "{out:?}");
        let drawn: Vec<u64> = (0..n).filter(|i| instances::drawn(*i)).collect();
        assert_eq!(out.iter().map(|i| i.seq).collect::<Vec<_>>(), drawn);
        assert!(out.iter().all(|i| i.weight == instances::stride(i.seq)));
        let estimate: u64 = out.iter().map(|i| i.weight).sum();
        assert_eq!(estimate, (0..n).map(instances::weight).sum::<u64>());
    }

    #[test]
    fn a_member_aligned_by_time_joins_the_drawn_instances() {
        // Members 0 and 1 are numbered by the kernel (drawn instances only); member 2 is
        // watched from instance 2,048 on, unnumbered, and sends every call. Back to back:
        // member 0 leaves an instance after member 2 has entered the next, so member 2's
        // calls of instances not drawn overlap a drawn neighbour's edge, which must not
        // vote (it would vote one off).
        let mut m = Matcher::default();
        let mut out = Vec::new();
        let (from, n) = (2 * instances::ALL_BELOW, 4 * instances::ALL_BELOW);
        let at = |i: u64, pid: u32, from_us: i64, to_us: i64| Collective {
            number: (pid < 2).then_some(i),
            from_start: pid < 2,
            arrival: Arrival {
                pid,
                start_ns: (i as i64 * 1_000_000 + from_us * 1_000) as u64,
                end_ns: (i as i64 * 1_000_000 + to_us * 1_000) as u64,
                root: false,
            },
            ..call(pid, 3, i, 0)
        };
        for i in 1..n {
            if instances::drawn(i) {
                m.arrive(at(i, 0, 0, 750), &mut out);
                m.arrive(at(i, 1, 100, 600), &mut out);
            }
            if i >= from {
                m.arrive(at(i, 2, -300, 650), &mut out);
            }
        }
        m.finish(&mut out);
        assert_eq!(m.counts, MatchCounts::default());
        let complete: Vec<u64> = out.iter().filter(|i| i.complete).map(|i| i.seq).collect();
        let drawn: Vec<u64> = (from..n).filter(|i| instances::drawn(*i)).collect();
        assert_eq!(complete, drawn);
    }

    #[test]
    fn attached_at_different_instances_still_match() {
        // Process 0 was watched from instance 0, process 1 from instance 7, process 2
        // from instance 20: each numbers from its first call, the matcher aligns them.
        let mut m = Matcher::default();
        let mut out = Vec::new();
        for i in 0..100u64 {
            for (p, from) in [(0u32, 0u64), (1, 7), (2, 20)] {
                if i >= from {
                    let c = Collective {
                        from_start: false,
                        number: None,
                        ..call(p, 3, i, u64::from(p) * 1000)
                    };
                    m.arrive(c, &mut out);
                }
            }
        }
        m.finish(&mut out);
        let complete: Vec<&Instance> = out.iter().filter(|i| i.complete).collect();
        assert_eq!(complete.len(), 80, "instances 20..100");
        for inst in &complete {
            let starts: Vec<u64> = inst
                .arrivals
                .iter()
                .map(|a| a.start_ns / 10_000_000)
                .collect();
            assert!(
                starts.iter().all(|s| *s == starts[0]),
                "one instance: {starts:?}"
            );
        }
        assert_eq!(
            m.counts.unaligned,
            20 + 13,
            "calls from before the last was watched"
        );
        assert_eq!(m.counts.conflicts, 0);
    }

    #[test]
    fn a_late_members_call_overlapping_the_next_instance_is_not_taken_for_it() {
        // Member 2 arrives last at every instance (8 ms in) and leaves last (10.5 ms),
        // after the others, out at 10.2 ms, entered the next one. It was watched from
        // instance 4, member 1 (watched last) from 5: member 2's first call belongs to no
        // instance every member was watched for, and overlaps the first one such.
        let ms = 1_000_000;
        let mut m = Matcher::default();
        let mut out = Vec::new();
        for i in 0..40u64 {
            for (p, from) in [(0u32, 0u64), (2, 4), (1, 5)] {
                if i < from {
                    continue;
                }
                let t = i * 10 * ms;
                let (start_ns, end_ns) = if p == 2 {
                    (t + 8 * ms, t + 10 * ms + ms / 2)
                } else {
                    (t + ms / 5, t + 10 * ms + ms / 5)
                };
                let arrival = Arrival {
                    pid: p,
                    start_ns,
                    end_ns,
                    root: false,
                };
                let c = Collective {
                    from_start: false,
                    number: None,
                    arrival,
                    ..call(p, 3, i, 0)
                };
                m.arrive(c, &mut out);
            }
        }
        m.finish(&mut out);
        assert!(out.iter().all(|i| i.complete), "{out:?}");
        assert_eq!(out.len(), 35, "instances 5..40");
        for inst in &out {
            let at: Vec<u64> = inst
                .arrivals
                .iter()
                .map(|a| a.start_ns / (10 * ms))
                .collect();
            assert!(at.iter().all(|i| *i == at[0]), "one instance: {at:?}");
        }
        assert_eq!(
            m.counts.unaligned,
            5 + 1,
            "calls from before member 1 was watched"
        );
    }

    #[test]
    fn a_member_that_lost_calls_is_realigned() {
        let mut m = Matcher::default();
        let mut out = Vec::new();
        for i in 0..200u64 {
            for p in 0..2u32 {
                // Process 1's calls 50..53 were lost.
                if p == 1 && (50..53).contains(&i) {
                    continue;
                }
                if p == 1 && i == 53 {
                    m.lost(1);
                }
                m.arrive(call(p, 2, i, 0), &mut out);
            }
        }
        m.finish(&mut out);
        let bad = out
            .iter()
            .filter(|i| i.complete)
            .filter(|i| i.arrivals[0].start_ns / 10_000_000 != i.arrivals[1].start_ns / 10_000_000)
            .count();
        assert_eq!(bad, 0);
        assert!(out.iter().filter(|i| i.complete).count() >= 190);
    }

    #[test]
    fn members_elsewhere_hand_an_instance_on_once_the_local_ones_arrived() {
        let mut m = Matcher::default();
        let mut out = Vec::new();
        // Two of four members here; instances 10 ms apart, then one 2 s later.
        for i in 0..3 {
            for p in 0..2 {
                m.arrive(call(p, 4, i, 0), &mut out);
            }
        }
        m.arrive(call(0, 4, 300, 0), &mut out);
        m.expire(&mut out);
        assert_eq!(
            out.len(),
            3,
            "the instance of 2 s later waits for its other local member"
        );
        assert!(out
            .iter()
            .all(|i| !i.complete && i.arrivals.len() == 2 && i.local_members == 2));
    }

    #[test]
    fn nobody_arriving_closes_incomplete() {
        let mut m = Matcher::default();
        let mut out = Vec::new();
        m.arrive(call(0, 2, 0, 0), &mut out);
        assert!(out.is_empty());
        m.arrive(call(0, 2, 10_000, 0), &mut out);
        m.expire(&mut out);
        assert_eq!(out.len(), 1);
        assert!(!out[0].complete);
    }
}
