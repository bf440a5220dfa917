//! Who is late across nodes: node daemons hand on the collective instances whose members
//! are on several nodes (each with its own members' arrivals), and the parts of an
//! instance meet here, put on the aggregator's clock with each node's offset.
//!
//! Bounded: at most [`MAX_JOBS`] jobs and [`MAX_PENDING`] open instances per job (the
//! oldest closed as incomplete); a part names ranks of its sender's node only.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use collector_common::{instances, routines::routine_id, BUCKETS, UNKNOWN_BUCKET};

use crate::{
    api::pb,
    skew::{
        instances::{votes_among_drawn, Arrival, Instance, MatchCounts},
        late_sender::{LateSenderPair, LateSenderReport, LateSenders},
        summary::{Summary, Verdict},
        CommKey, SkewReport,
    },
    trace::flows::Unlinked,
};

/// Jobs followed at once.
const MAX_JOBS: usize = 4096;
/// Open instances per job.
const MAX_PENDING: usize = 1 << 16;
/// The largest communicator an instance may claim (a part claiming more is refused).
const MAX_SIZE: u32 = 1 << 22;

#[derive(Debug)]
struct Pending {
    routine: u16,
    bucket: u8,
    size: u32,
    arrivals: Vec<Arrival>,
    /// The ranks in `arrivals` (a part sent twice is not counted twice).
    ranks: std::collections::HashSet<u32>,
    /// The largest clock error of the nodes whose parts are in.
    error_ns: u64,
    /// How many instances it stands for (the largest a part said).
    weight: u64,
}

/// A node's part of an instance, its times on the aggregator's clock.
#[derive(Debug)]
struct Part {
    comm: u64,
    /// The node's number for the instance.
    seq: u64,
    routine: u16,
    bucket: u8,
    size: u32,
    node: String,
    arrivals: Vec<(Arrival, String)>,
    error_ns: u64,
    weight: u64,
}

impl Part {
    /// From its members' first arrival to their last departure.
    fn span(&self) -> (u64, u64) {
        let start = self
            .arrivals
            .iter()
            .map(|(a, _)| a.start_ns)
            .min()
            .unwrap_or(0);
        let end = self
            .arrivals
            .iter()
            .map(|(a, _)| a.end_ns)
            .max()
            .unwrap_or(0);
        (start, end)
    }
}

/// Parts a node that attached mid-job shows before its numbering is aligned.
const MIN_ALIGN: usize = 8;
/// Parts kept waiting per node and communicator (older ones are counted unaligned).
const MAX_WAITING: usize = 512;
/// Recent instances kept per communicator for alignment.
const MAX_SPANS: usize = 1024;
/// Communicators, and (communicator, node) numberings, followed per job for alignment.
const MAX_ALIGNED: usize = 1 << 14;

/// How the numbers of nodes that attached mid-job map onto a job's numbering of each
/// communicator. A node watching since a communicator was made numbers its instances as
/// every member does; one that attached later counts from where it started. Every member of
/// a collective is inside it while the others are, so a node's part overlaps in time the
/// instance it belongs to: each waiting part votes for the offset that puts it on the
/// instance whose span it overlaps most, and a clear winner (unique, half the parts, at least
/// [`MIN_ALIGN`] / 2) becomes the node's offset, as a node aligns its own ranks. When no
/// node numbers from the start, the node that attached last (its first waiting part the
/// latest), once every rank's node has parts waiting, gives the job its numbering.
///
/// Where the kernel numbers a communicator (nodes watching since its creation), only its
/// drawn instances come, and have spans: a waiting part of an instance not drawn overlaps
/// only its neighbours' edges, and votes only where it overlaps an instance for at least
/// half of the shorter of the two (as a node aligns its own ranks).
#[derive(Debug, Default)]
struct Alignment {
    /// Per communicator: recent instances by the job's number, when they ran.
    spans: HashMap<u64, BTreeMap<u64, (u64, u64)>>,
    /// The communicators some node sent drawn instances of (one standing for several):
    /// only their drawn instances are followed.
    drawn: HashSet<u64>,
    /// Per (communicator, node): its offset once known.
    offsets: HashMap<(u64, String), i64>,
    /// Per (communicator, node): parts waiting for the offset.
    waiting: HashMap<(u64, String), VecDeque<Part>>,
}

impl Alignment {
    fn offset(&self, comm: u64, node: &str) -> Option<i64> {
        self.offsets.get(&(comm, node.to_string())).copied()
    }

    /// Whether only `comm`'s drawn instances are followed.
    fn is_drawn(&self, comm: u64) -> bool {
        self.drawn.contains(&comm)
    }

    /// Some node sent a drawn instance of `comm` standing for several: returns whether
    /// that is news.
    fn found_drawn(&mut self, comm: u64) -> bool {
        self.drawn.len() < MAX_ALIGNED && self.drawn.insert(comm)
    }

    /// Instance `seq` of `comm` had these arrivals.
    fn ran(&mut self, comm: u64, seq: u64, arrivals: &[(Arrival, String)]) {
        if !self.spans.contains_key(&comm) && self.spans.len() >= MAX_ALIGNED {
            return;
        }
        let spans = self.spans.entry(comm).or_default();
        let e = spans.entry(seq).or_insert((u64::MAX, 0));
        for (a, _) in arrivals {
            e.0 = e.0.min(a.start_ns);
            e.1 = e.1.max(a.end_ns);
        }
        while spans.len() > MAX_SPANS {
            spans.pop_first();
        }
    }

    /// Keeps `part` until its node's numbering is aligned; returns the parts that can be
    /// placed now with their offsets, and the arrivals dropped past [`MAX_WAITING`].
    fn wait(&mut self, part: Part) -> (Vec<(Part, i64)>, u64) {
        let comm = part.comm;
        let size = part.size;
        let key = (comm, part.node.clone());
        if !self.waiting.contains_key(&key)
            && self.waiting.len() + self.offsets.len() >= MAX_ALIGNED
        {
            return (Vec::new(), part.arrivals.len() as u64);
        }
        let q = self.waiting.entry(key).or_default();
        q.push_back(part);
        let mut dropped = 0;
        if q.len() > MAX_WAITING {
            dropped = q.pop_front().map_or(0, |p| p.arrivals.len() as u64);
        }
        if !q.len().is_multiple_of(MIN_ALIGN) {
            return (Vec::new(), dropped);
        }
        let mut ready = Vec::new();
        if self.spans.get(&comm).is_none_or(BTreeMap::is_empty) {
            // Nobody's numbering is the job's yet: the node that attached last gives it,
            // once every rank's node has shown enough parts.
            let nodes: Vec<&(u64, String)> =
                self.waiting.keys().filter(|(c, _)| *c == comm).collect();
            let ranks: std::collections::HashSet<u32> = nodes
                .iter()
                .flat_map(|k| self.waiting[*k].iter())
                .flat_map(|p| p.arrivals.iter().map(|(a, _)| a.pid))
                .collect();
            let enough = nodes.iter().all(|k| self.waiting[*k].len() >= MIN_ALIGN);
            if ranks.len() < size as usize || !enough {
                return (Vec::new(), dropped);
            }
            let last = nodes
                .iter()
                .max_by_key(|k| (self.waiting[*k].front().map(|p| p.span().0), k.1.clone()))
                .map(|k| (*k).clone())
                .expect("a node");
            let settled = self.settle(last, 0);
            for (p, _) in &settled {
                self.ran(comm, p.seq, &p.arrivals);
            }
            ready.extend(settled);
        }
        let keys: Vec<(u64, String)> = self
            .waiting
            .keys()
            .filter(|(c, _)| *c == comm)
            .cloned()
            .collect();
        for key in keys {
            if let Some(off) = self.vote(&key) {
                ready.extend(self.settle(key, off));
            }
        }
        (ready, dropped)
    }

    /// The offset most of `key`'s waiting parts agree on, if it is clear.
    fn vote(&self, key: &(u64, String)) -> Option<i64> {
        let spans = self.spans.get(&key.0)?;
        let drawn = self.is_drawn(key.0);
        let mut votes: HashMap<i64, usize> = HashMap::new();
        let mut voters = 0;
        for p in self.waiting.get(key)? {
            // The instance it overlaps most: back-to-back collectives overlap their
            // neighbours' edges (a member leaving one enters the next before another has
            // left it), never as much as their own.
            let (start, end) = p.span();
            let mut best: Option<(u64, u64)> = None;
            let mut tied = false;
            for (&seq, &(min_start, max_end)) in spans {
                if start > max_end || end < min_start {
                    continue;
                }
                let overlap = end.min(max_end).saturating_sub(start.max(min_start));
                if drawn && !votes_among_drawn(overlap, end - start, max_end - min_start) {
                    continue;
                }
                match best {
                    Some((b, _)) if overlap < b => {}
                    Some((b, _)) if overlap == b => tied = true,
                    _ => {
                        best = Some((overlap, seq));
                        tied = false;
                    }
                }
            }
            if let (Some((_, seq)), false) = (best, tied) {
                *votes.entry(seq as i64 - p.seq as i64).or_default() += 1;
                voters += 1;
            }
        }
        let mut ranked: Vec<(usize, i64)> = votes.into_iter().map(|(o, n)| (n, o)).collect();
        ranked.sort_unstable_by(|a, b| b.cmp(a));
        let (best, offset) = *ranked.first()?;
        let runner_up = ranked.get(1).map_or(0, |r| r.0);
        (best > runner_up && best >= MIN_ALIGN / 2 && best * 2 >= voters).then_some(offset)
    }

    /// Whether instance `seq` of `comm` comes before every instance the job's numbering
    /// has (a part from before the nodes' watches overlapped: it has no instance).
    fn before_first(&self, comm: u64, seq: u64) -> bool {
        self.spans
            .get(&comm)
            .and_then(|s| s.keys().next())
            .is_some_and(|first| seq < *first)
    }

    /// Arrivals in parts still waiting for their node's numbering.
    fn waiting_arrivals(&self) -> u64 {
        self.waiting
            .values()
            .flatten()
            .map(|p| p.arrivals.len() as u64)
            .sum()
    }

    /// `key`'s numbering is the job's plus `off`: its waiting parts, to be placed.
    fn settle(&mut self, key: (u64, String), off: i64) -> Vec<(Part, i64)> {
        let parts = self.waiting.remove(&key).unwrap_or_default();
        self.offsets.insert(key, off);
        parts.into_iter().map(|p| (p, off)).collect()
    }
}

#[derive(Debug, Default)]
struct JobSkew {
    pending: HashMap<(u64, u64), Pending>,
    order: VecDeque<(u64, u64)>,
    summary: Summary,
    hosts: HashMap<u32, String>,
    within_clock_error: u64,
    /// Arrivals in parts whose node's numbering could not be aligned with the job's.
    unaligned: u64,
    /// How the numbers of nodes that attached mid-job map onto the job's.
    alignment: Alignment,
    /// Late Sender, once a node sent any of it.
    late: Option<JobLateSender>,
}

/// Late Sender of one job across its nodes: the messages each node paired itself, and
/// those whose halves the nodes handed on, paired here.
#[derive(Debug, Default)]
struct JobLateSender {
    /// The handed-on halves, paired (ends by world rank).
    across: LateSenders,
    /// Each node's own report, the latest of each pair: a pair a node stops reporting (its
    /// processes forgotten there) keeps what it last said.
    nodes: HashMap<String, NodeReport>,
}

#[derive(Debug, Default)]
struct NodeReport {
    pairs: BTreeMap<(u32, u32), LateSenderPair>,
    late_receivers: BTreeMap<(u32, u32), LateSenderPair>,
    not_numbered: Unlinked,
    unpaired: u64,
}

/// Nodes whose Late Sender reports one job keeps, and pairs per node.
const MAX_NODES: usize = 1 << 14;
const MAX_NODE_PAIRS: usize = 1 << 16;

/// The instances of every job, as their parts arrive.
#[derive(Debug, Default)]
pub struct CrossSkew {
    jobs: HashMap<String, JobSkew>,
}

impl CrossSkew {
    /// Takes a sender's parts, whose times are on its clock: the aggregator's is that
    /// plus `offset_ns`, within `error_ns`.
    pub fn add(&mut self, parts: &[pb::InstancePart], offset_ns: i64, error_ns: u64) {
        for p in parts {
            let Some(routine) = routine_id(&p.routine) else {
                continue;
            };
            if p.size == 0 || p.size > MAX_SIZE {
                continue;
            }
            let bucket = p
                .bucket
                .and_then(|b| u8::try_from(b).ok())
                .filter(|b| *b < BUCKETS)
                .unwrap_or(UNKNOWN_BUCKET);
            if !self.jobs.contains_key(&p.job) && self.jobs.len() >= MAX_JOBS {
                continue;
            }
            let job = self.jobs.entry(p.job.clone()).or_default();
            let part = Part {
                comm: p.comm,
                seq: p.seq,
                routine,
                bucket,
                size: p.size,
                node: p
                    .arrivals
                    .first()
                    .map(|a| a.host.clone())
                    .unwrap_or_default(),
                arrivals: p
                    .arrivals
                    .iter()
                    .map(|a| {
                        let arrival = Arrival {
                            pid: a.rank,
                            start_ns: a.start_ns.saturating_add_signed(offset_ns),
                            end_ns: a.end_ns.saturating_add_signed(offset_ns),
                            root: a.root,
                        };
                        (arrival, a.host.clone())
                    })
                    .collect(),
                error_ns,
                // Bounded: a node's word cannot make one instance stand for thousands.
                weight: p.weight.clamp(1, instances::MAX_STRIDE),
            };
            if p.numbering_local {
                job.align(part);
            } else {
                let seq = part.seq;
                job.place(part, seq);
            }
        }
    }

    /// Takes a node's Late Sender parts: its own report of each job, and the message halves
    /// it handed on, whose times are on its clock (the aggregator's is that plus
    /// `offset_ns`, within `error_ns`; without an offset they cannot be paired and are
    /// left out).
    pub fn add_late_senders(
        &mut self,
        node: &str,
        reports: &[pb::NodeLateSender],
        halves: &[pb::MessageHalf],
        offset_ns: Option<i64>,
        error_ns: u64,
    ) {
        use crate::skew::late_sender::{Clock, Half, ReceiveEnd, SendEnd, MAX_TOGETHER};
        for r in reports {
            let Some((_, late)) = self.late_of(&r.job) else {
                continue;
            };
            if !late.nodes.contains_key(node) && late.nodes.len() >= MAX_NODES {
                continue;
            }
            let report = r
                .report
                .as_ref()
                .map(LateSenderReport::from)
                .unwrap_or_default();
            let mine = late.nodes.entry(node.to_string()).or_default();
            for (kept, pairs) in [
                (&mut mine.pairs, report.pairs),
                (&mut mine.late_receivers, report.late_receivers),
            ] {
                for p in pairs {
                    let key = (p.receiver, p.sender);
                    if kept.contains_key(&key) || kept.len() < MAX_NODE_PAIRS {
                        kept.insert(key, p);
                    }
                }
            }
            mine.not_numbered = report.not_numbered;
            mine.unpaired = report.unpaired;
        }
        let Some(offset_ns) = offset_ns else {
            return;
        };
        // Halves of one node are on one clock: the error only parts two nodes' (never 0,
        // which is a node's own).
        let clock = Clock {
            node: {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                node.hash(&mut hasher);
                hasher.finish() | 1
            },
            error_ns,
        };
        for h in halves {
            let (start_ns, end_ns) = (
                h.start_ns.saturating_add_signed(offset_ns),
                h.end_ns.saturating_add_signed(offset_ns),
            );
            // 0 says "not known" on every clock.
            let posted_ns = match h.posted_ns {
                0 => 0,
                ns => ns.saturating_add_signed(offset_ns),
            };
            let half = match h.kind() {
                pb::HalfKind::Send => Half::Send(SendEnd {
                    pid: h.rank,
                    start_ns,
                    end_ns,
                    blocking: h.blocking,
                    clock,
                }),
                pb::HalfKind::Receive => Half::Receive(ReceiveEnd {
                    pid: h.rank,
                    start_ns,
                    end_ns,
                    posted_ns,
                    thread: h.thread,
                    // Bounded by what a wait can hold: a node's word cannot make one wait
                    // wait for billions.
                    together: h.together.min(MAX_TOGETHER),
                    first: h.first,
                    clock,
                    wait_ns: h.start_ns,
                }),
                pb::HalfKind::Posted => Half::Posted {
                    pid: h.rank,
                    posted_ns,
                    clock,
                },
                pb::HalfKind::Unspecified => continue,
            };
            let Some((hosts, late)) = self.late_of(&h.job) else {
                continue;
            };
            if !hosts.contains_key(&h.rank) && hosts.len() < MAX_SIZE as usize {
                hosts.insert(h.rank, h.host.clone());
            }
            late.across.meet(h.id, half);
        }
    }

    /// The Late Sender state of `job` (made if new) and its ranks' hosts; None past
    /// [`MAX_JOBS`].
    fn late_of(&mut self, job: &str) -> Option<(&mut HashMap<u32, String>, &mut JobLateSender)> {
        if !self.jobs.contains_key(job) && self.jobs.len() >= MAX_JOBS {
            return None;
        }
        let j = self.jobs.entry(job.to_string()).or_default();
        Some((
            &mut j.hosts,
            j.late.get_or_insert_with(JobLateSender::default),
        ))
    }

    /// The report of `job`, if any of its instances spanned nodes or a node paired its
    /// messages.
    pub fn report(&self, job: &str) -> Option<SkewReport> {
        let j = self.jobs.get(job)?;
        let whois = |rank: u32| Some((rank, j.hosts.get(&rank).cloned().unwrap_or_default()));
        let counts = MatchCounts {
            unaligned: j.unaligned + j.alignment.waiting_arrivals(),
            ..MatchCounts::default()
        };
        let mut r = j.summary.report(counts, 0, 0, &whois, &|_| None);
        r.within_clock_error = j.within_clock_error;
        r.late_sender = j.late.as_ref().map(|late| {
            let nodes: Vec<LateSenderReport> = late
                .nodes
                .values()
                .map(|n| LateSenderReport {
                    pairs: n.pairs.values().cloned().collect(),
                    late_receivers: n.late_receivers.values().cloned().collect(),
                    not_numbered: n.not_numbered,
                    unpaired: n.unpaired,
                })
                .collect();
            let across = late.across.report(&whois);
            LateSenderReport::combine(nodes.iter().chain([&across]))
        });
        Some(r)
    }

    /// Forgets jobs no longer kept.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.jobs.retain(|j, _| keep(j));
    }
}

impl JobSkew {
    /// Puts `part` on instance `seq` of the job's numbering of its communicator.
    fn place(&mut self, part: Part, seq: u64) {
        if part.weight > 1 && self.alignment.found_drawn(part.comm) {
            // Parts placed before of instances not drawn (a node counting every instance
            // itself) would wait for the nodes that never send them.
            let comm = part.comm;
            self.pending
                .retain(|&(c, s), _| c != comm || instances::drawn(s));
        }
        if self.alignment.is_drawn(part.comm) && !instances::drawn(seq) {
            // Not followed: the nodes the kernel numbers for sent none of it.
            return;
        }
        let key = (part.comm, seq);
        self.alignment.ran(part.comm, seq, &part.arrivals);
        let order = &mut self.order;
        let pending = self.pending.entry(key).or_insert_with(|| {
            order.push_back(key);
            Pending {
                routine: part.routine,
                bucket: part.bucket,
                size: part.size,
                arrivals: Vec::new(),
                ranks: Default::default(),
                error_ns: 0,
                weight: 1,
            }
        });
        pending.error_ns = pending.error_ns.max(part.error_ns);
        pending.weight = pending.weight.max(part.weight);
        for (a, host) in part.arrivals {
            if pending.arrivals.len() >= pending.size as usize || !pending.ranks.insert(a.pid) {
                continue;
            }
            pending.arrivals.push(a);
            if !self.hosts.contains_key(&a.pid) && self.hosts.len() < MAX_SIZE as usize {
                self.hosts.insert(a.pid, host);
            }
        }
        if pending.arrivals.len() >= pending.size as usize {
            self.close(key);
        }
        while self.pending.len() > MAX_PENDING {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.close(oldest);
        }
        if self.order.len() > 2 * MAX_PENDING {
            let open = &self.pending;
            self.order.retain(|k| open.contains_key(k));
        }
    }

    /// Takes a part numbered by a node that attached mid-job: placed once its node's
    /// numbering of the communicator is aligned with the job's, by time (see [`Alignment`]).
    fn align(&mut self, part: Part) {
        let (comm, node) = (part.comm, part.node.clone());
        if let Some(off) = self.alignment.offset(comm, &node) {
            self.place_aligned(part, off);
            return;
        }
        let (ready, dropped) = self.alignment.wait(part);
        self.unaligned += dropped;
        for (part, off) in ready {
            self.place_aligned(part, off);
        }
    }

    fn place_aligned(&mut self, part: Part, off: i64) {
        match part.seq.checked_add_signed(off) {
            Some(seq) if !self.alignment.before_first(part.comm, seq) => self.place(part, seq),
            _ => self.unaligned += part.arrivals.len() as u64,
        }
    }

    /// Closes instance `key`: complete when every member's part came; a skew within the
    /// nodes' clock error names nobody.
    fn close(&mut self, key: (u64, u64)) {
        let Some(p) = self.pending.remove(&key) else {
            return;
        };
        let complete = p.arrivals.len() == p.size as usize;
        if complete {
            // Two nodes' offsets may each be off by their error.
            if Verdict::of(p.routine, &p.arrivals).margin_ns < p.error_ns.saturating_mul(2) {
                self.within_clock_error += p.weight;
                return;
            }
        }
        self.summary.add(&Instance {
            comm: CommKey(key.0),
            seq: key.1,
            routine: p.routine,
            bucket: p.bucket,
            complete,
            // Every node is in view here: an incomplete instance is incomplete, not remote.
            local_members: usize::MAX,
            numbered_from_start: true,
            size: p.size,
            arrivals: p.arrivals,
            weight: p.weight,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(job: &str, seq: u64, ranks: &[(u32, u64)], host: &str) -> pb::InstancePart {
        pb::InstancePart {
            job: job.into(),
            comm: 1,
            seq,
            routine: "MPI_Allreduce".into(),
            bucket: Some(2),
            size: 4,
            arrivals: ranks
                .iter()
                .map(|&(rank, start)| pb::InstanceArrival {
                    rank,
                    host: host.into(),
                    start_ns: start,
                    end_ns: start + 1_000_000,
                    root: false,
                })
                .collect(),
            numbering_local: false,
            weight: 0,
        }
    }

    fn half(
        id: u64,
        rank: u32,
        host: &str,
        kind: pb::HalfKind,
        start: u64,
        end: u64,
    ) -> pb::MessageHalf {
        pb::MessageHalf {
            job: "j".into(),
            id,
            rank,
            host: host.into(),
            kind: kind as i32,
            start_ns: start,
            end_ns: end,
            ..Default::default()
        }
    }

    fn node_report(
        receiver: u32,
        sender: u32,
        messages: u64,
        late: u64,
        wait_ns: u64,
    ) -> pb::NodeLateSender {
        let r = LateSenderReport {
            pairs: vec![LateSenderPair {
                receiver,
                receiver_host: "a".into(),
                sender,
                sender_host: "a".into(),
                messages,
                late,
                wait_ns,
            }],
            unpaired: 1,
            ..Default::default()
        };
        pb::NodeLateSender {
            job: "j".into(),
            report: Some((&r).into()),
        }
    }

    /// Rank 0 (node a) waits in two receives for rank 2 (node b, clock 5 s ahead): the
    /// first send started 2 ms after the receive, the second before it. Node a's own
    /// pairs are added, its later report replacing the earlier; a posted receive takes
    /// its send without a wait.
    #[test]
    fn halves_of_two_nodes_pair_on_one_clock() {
        use pb::HalfKind::{Posted, Receive, Send};
        let mut x = CrossSkew::default();
        let b = 5_000_000_000;
        x.add_late_senders(
            "a",
            &[node_report(0, 1, 3, 1, 100)],
            &[
                half(1, 0, "a", Receive, 1_000_000, 4_000_000),
                half(2, 0, "a", Receive, 10_000_000, 11_000_000),
                half(3, 0, "a", Posted, 0, 0),
            ],
            Some(0),
            0,
        );
        x.add_late_senders(
            "b",
            &[],
            &[
                half(1, 2, "b", Send, b + 3_000_000, b + 3_000_000),
                half(2, 2, "b", Send, b + 9_000_000, b + 9_000_000),
                half(3, 2, "b", Send, b + 20_000_000, b + 20_000_000),
                half(4, 2, "b", Send, b + 30_000_000, b + 30_000_000),
            ],
            Some(-5_000_000_000),
            0,
        );
        x.add_late_senders("a", &[node_report(0, 1, 5, 2, 300)], &[], Some(0), 0);
        let ls = x
            .report("j")
            .expect("report")
            .late_sender
            .expect("late sender");
        let pairs: Vec<(u32, u32, u64, u64, u64)> = ls
            .pairs
            .iter()
            .map(|p| (p.receiver, p.sender, p.messages, p.late, p.wait_ns))
            .collect();
        assert_eq!(pairs, vec![(0, 2, 2, 1, 2_000_000), (0, 1, 5, 2, 300)]);
        assert_eq!(ls.pairs[0].sender_host, "b");
        // Node a's own unpaired one, and message 4's send.
        assert_eq!(ls.unpaired, 2);
        // Without a clock offset, halves are not paired (nor kept).
        x.add_late_senders("b", &[], &[half(9, 2, "b", Send, 1, 1)], None, 0);
        assert_eq!(x.report("j").unwrap().late_sender.unwrap().unpaired, 2);
    }

    /// Late Receiver across nodes: a synchronous send returns just after its receive is
    /// posted, which two nodes' clocks may put after its end: within their error it was
    /// still sending; past it, it had returned (an eager send) and waited for nothing. Two
    /// halves from one node are on one clock.
    #[test]
    fn a_send_that_returned_within_the_clock_error_of_the_post_waited_for_it() {
        use pb::HalfKind::{Receive, Send};
        let mut x = CrossSkew::default();
        let blocking = |id, start, end| pb::MessageHalf {
            blocking: true,
            ..half(id, 1, "b", Send, start, end)
        };
        let posted = |id, at| pb::MessageHalf {
            posted_ns: at,
            ..half(id, 0, "a", Receive, at, at + 100_000)
        };
        // Sends from 1 ms to 5 ms; their receives posted at 5.03 ms (30 us after the
        // first's end: within 2 x 20 us) and at 5.1 ms (past it).
        x.add_late_senders(
            "b",
            &[],
            &[
                blocking(1, 1_000_000, 5_000_000),
                blocking(2, 1_000_000, 5_000_000),
            ],
            Some(0),
            20_000,
        );
        // Both halves of message 3 from node a: one clock, no error between them.
        x.add_late_senders(
            "a",
            &[],
            &[
                posted(1, 5_030_000),
                posted(2, 5_100_000),
                blocking(3, 1_000_000, 5_000_000),
                posted(3, 5_030_000),
            ],
            Some(0),
            20_000,
        );
        let ls = x.report("j").expect("report").late_sender.expect("ls");
        let lr: Vec<_> = ls
            .late_receivers
            .iter()
            .map(|p| (p.receiver, p.sender, p.messages, p.late, p.wait_ns))
            .collect();
        assert_eq!(lr, vec![(0, 1, 3, 1, 4_030_000)]);
    }

    /// Two nodes attached mid-job, each numbering from where it started (node b attached
    /// later: its 0 is node a's 5). Once both have shown enough parts, node b (attached
    /// last) gives the numbering and node a's parts are aligned to it by time; node a's
    /// first five, from before node b watched, have no instance and are counted unaligned.
    #[test]
    fn nodes_attached_mid_job_are_aligned_by_time() {
        let mut x = CrossSkew::default();
        let t = |i: u64| 1_000_000_000 + i * 10_000_000;
        let mut a_parts = Vec::new();
        for i in 0..5 + 2 * MIN_ALIGN as u64 {
            let mut p = part("j", i, &[(0, t(i)), (1, t(i) + 10)], "a");
            p.numbering_local = true;
            a_parts.push(p);
        }
        let mut b_parts = Vec::new();
        for i in 5..5 + 2 * MIN_ALIGN as u64 {
            // Rank 3 arrives 3 ms late.
            let mut p = part("j", i - 5, &[(2, t(i) + 20), (3, t(i) + 3_000_000)], "b");
            p.numbering_local = true;
            b_parts.push(p);
        }
        x.add(&a_parts, 0, 0);
        x.add(&b_parts, 0, 0);
        let r = x.report("j").expect("report");
        assert_eq!(r.instances, 2 * MIN_ALIGN as u64, "{r:?}");
        assert_eq!(r.incomplete, 0, "{r:?}");
        assert_eq!(
            r.unaligned,
            5 * 2,
            "node a's parts from before node b watched: {r:?}"
        );
        assert_eq!(r.ranks[3].last, 2 * MIN_ALIGN as u64, "{r:?}");
    }

    #[test]
    fn parts_of_two_nodes_meet_on_one_clock() {
        let mut x = CrossSkew::default();
        // Node b's clock is 5 s ahead; its rank 2 arrives 3 ms after the others.
        for seq in 0..20u64 {
            let t = 1_000_000_000 + seq * 10_000_000;
            x.add(&[part("j", seq, &[(0, t), (1, t + 10)], "a")], 0, 50_000);
            let b = 5_000_000_000 + t;
            x.add(
                &[part("j", seq, &[(2, b + 3_000_000), (3, b + 20)], "b")],
                -5_000_000_000,
                50_000,
            );
        }
        let r = x.report("j").expect("job");
        assert_eq!(
            (r.instances, r.incomplete, r.within_clock_error),
            (20, 0, 0)
        );
        assert_eq!(r.ranks[2].last, 20);
        assert_eq!(r.ranks[2].host, "b");
        assert_eq!(r.ranks[2].caused_ns, 20 * 3_000_000);
    }

    #[test]
    fn a_skew_within_the_clock_error_names_nobody() {
        let mut x = CrossSkew::default();
        x.add(&[part("j", 0, &[(0, 100), (1, 100)], "a")], 0, 1_000_000);
        x.add(
            &[part("j", 0, &[(2, 600_000), (3, 100)], "b")],
            0,
            1_000_000,
        );
        let r = x.report("j").expect("job");
        assert_eq!((r.instances, r.within_clock_error), (0, 1));
    }

    #[test]
    fn a_broadcast_is_judged_by_its_roots_arrival_across_nodes() {
        let bcast = |seq, ranks: &[(u32, u64)], host: &str| {
            let mut p = part("j", seq, ranks, host);
            p.routine = "MPI_Bcast".into();
            for a in &mut p.arrivals {
                a.root = a.rank == 0;
            }
            p
        };
        let mut x = CrossSkew::default();
        // 0: rank 2 on node b comes 3 ms late, the root 0.1 ms before the others: nobody
        // waited (a root within the clock error of the first other is not judged). 1: the root
        // comes 3 ms late: the others waited. 2: the root 10 us after rank 1, within the
        // nodes' clock error of 50 us: not judged.
        x.add(&[bcast(0, &[(0, 100), (1, 100_000)], "a")], 0, 25_000);
        x.add(&[bcast(0, &[(2, 3_000_000), (3, 100_000)], "b")], 0, 25_000);
        x.add(&[bcast(1, &[(0, 3_000_000), (1, 110)], "a")], 0, 25_000);
        x.add(&[bcast(1, &[(2, 100), (3, 120)], "b")], 0, 25_000);
        x.add(&[bcast(2, &[(0, 20_000), (1, 5_000_000)], "a")], 0, 25_000);
        x.add(&[bcast(2, &[(2, 10_000), (3, 5_000_000)], "b")], 0, 25_000);
        let r = x.report("j").expect("job");
        assert_eq!((r.instances, r.within_clock_error), (2, 1));
        assert_eq!((r.ranks[0].last, r.ranks[2].last), (1, 0));
        assert_eq!(r.ranks[0].caused_ns, 3_000_000 - 100);
        assert_eq!(r.ranks[2].waited_ns, 3_000_000 - 100);
        assert_eq!(r.ranks[0].waited_ns, 0);
    }

    #[test]
    fn a_part_is_never_counted_twice() {
        let mut x = CrossSkew::default();
        let p = part("j", 0, &[(0, 100), (1, 100)], "a");
        x.add(&[p.clone(), p], 0, 0);
        x.add(&[part("j", 0, &[(2, 5_000_000), (3, 100)], "b")], 0, 0);
        let r = x.report("j").expect("job");
        assert_eq!((r.instances, r.incomplete), (1, 0));
        assert_eq!(r.ranks.len(), 4);
        assert!(r.ranks.iter().all(|k| k.instances == 1));
    }

    /// Instance `i` at `i` ms, a rank's arrival from `from_us` to `to_us` around it.
    fn arrival(i: u64, rank: u32, host: &str, from_us: i64, to_us: i64) -> pb::InstanceArrival {
        let at = |us: i64| (1_000_000_000 + i as i64 * 1_000_000 + us * 1_000) as u64;
        pb::InstanceArrival {
            rank,
            host: host.into(),
            start_ns: at(from_us),
            end_ns: at(to_us),
            root: false,
        }
    }

    /// Node a's part of instance `i` (drawn): its ranks numbered by the kernel from the
    /// communicator's creation, the part standing for its stride.
    fn drawn_part(i: u64) -> pb::InstancePart {
        let mut p = part("j", i, &[], "a");
        p.arrivals = vec![arrival(i, 0, "a", 0, 900), arrival(i, 1, "a", 100, 600)];
        p.weight = instances::weight(i);
        p
    }

    /// Node b's part of instance `i`: its daemon restarted at instance `from` and numbers
    /// every instance by its own count (from 5).
    fn restarted_part(i: u64, from: u64) -> pb::InstancePart {
        let mut p = part("j", i - from + 5, &[], "b");
        p.arrivals = vec![
            arrival(i, 2, "b", -300, 1100),
            arrival(i, 3, "b", -250, 640),
        ];
        p.numbering_local = true;
        p
    }

    /// The report of instances `from..n` all complete, nothing open from `from` on.
    #[track_caller]
    fn assert_drawn_instances_met(x: &CrossSkew, from: u64, n: u64) {
        let r = x.report("j").expect("report");
        let drawn: Vec<u64> = (from..n).filter(|i| instances::drawn(*i)).collect();
        let weights: u64 = drawn.iter().map(|i| instances::weight(*i)).sum();
        assert_eq!(
            (r.instances, r.incomplete, r.unaligned),
            (weights, 0, 0),
            "{r:?}"
        );
        assert_eq!(r.ranks[1].last, weights, "rank 1 arrives last: {r:?}");
        let open: Vec<u64> = x.jobs["j"].pending.keys().map(|k| k.1).collect();
        assert!(
            open.iter().all(|s| *s < from),
            "only node a's before node b: {open:?}"
        );
    }

    /// Node b's daemon restarted at instance 32,768 (one in 64 drawn). Back to back, each
    /// rank leaving an instance after another has entered the next: node b's parts of
    /// instances not drawn overlap a drawn neighbour's edge, which must not vote (they
    /// would vote one off either way); once aligned, those parts are not followed and stay
    /// out.
    #[test]
    fn a_node_restarted_mid_job_joins_the_drawn_instances() {
        let mut x = CrossSkew::default();
        let (from, n) = (32 * instances::ALL_BELOW, 40 * instances::ALL_BELOW);
        for i in 1..n {
            if instances::drawn(i) {
                x.add(&[drawn_part(i)], 0, 0);
            }
            if i >= from {
                x.add(&[restarted_part(i, from)], 0, 0);
            }
        }
        assert_drawn_instances_met(&x, from, n);
        let r = x.report("j").expect("report");
        let drawn = (from..n).filter(|i| instances::drawn(*i)).count() as u64;
        assert_eq!(r.sampled, drawn, "{r:?}");
    }

    /// Node b restarted at instance 900 and aligned while every instance was followed;
    /// its push of instances 1,024 to 2,047 reaches the aggregator before node a's, whose
    /// first part standing for two tells that only the drawn ones are followed: node b's
    /// parts of the others, open by then, are dropped, never closed as incomplete.
    #[test]
    fn parts_of_instances_not_drawn_placed_before_the_first_drawn_one_are_dropped() {
        let mut x = CrossSkew::default();
        let (from, n) = (900, 2 * instances::ALL_BELOW);
        for i in 1..instances::ALL_BELOW {
            x.add(&[drawn_part(i)], 0, 0);
            if i >= from {
                x.add(&[restarted_part(i, from)], 0, 0);
            }
        }
        let later: Vec<u64> = (instances::ALL_BELOW..n).collect();
        for &i in &later {
            x.add(&[restarted_part(i, from)], 0, 0);
        }
        for &i in later.iter().filter(|i| instances::drawn(**i)) {
            x.add(&[drawn_part(i)], 0, 0);
        }
        assert_drawn_instances_met(&x, from, n);
    }
}
