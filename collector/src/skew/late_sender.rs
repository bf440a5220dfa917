//! Late Sender (Scalasca's pattern): a blocking receive, or the wait that completed a
//! nonblocking one (`MPI_Irecv` then `MPI_Wait`), that was waiting before the send of its
//! message had even started. The time from the receive's (or wait's) start to the send's
//! start (or to its end, if that came first) is time the receiver lost to a late sender,
//! not to the network. A wait that completed several messages is left out: it waited for
//! the last of them, not for each.
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

/// The `late_sender` part of the `skew` object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LateSenderReport {
    /// Per (receiving rank, sending rank) with at least one message, most waited first.
    pub pairs: Vec<LateSenderPair>,
    /// Point-to-point calls that could not be numbered (see the timeline's arrows).
    pub not_numbered: Unlinked,
    /// Sends and receives whose partner was never seen (its process not watched, or still
    /// in flight at the end), or past [`MAX_PENDING`].
    pub unpaired: u64,
}

/// Messages from one rank to another taken by blocking receives, or by nonblocking ones
/// completed alone in a wait.
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
    /// Messages paired.
    pub messages: u64,
    /// Of those, the ones whose receive started before their send did.
    pub late: u64,
    /// Time the receiver waited for those sends to start, ns.
    pub wait_ns: u64,
}

/// One side of a message, seen before the other. `pid` is the process on a node, the
/// world rank at the aggregator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// A send, from its start.
    Send {
        /// Who sent.
        pid: u32,
        /// When the send started.
        start_ns: u64,
    },
    /// A blocking receive.
    Receive {
        /// Who received.
        pid: u32,
        /// When it started waiting.
        start_ns: u64,
        /// When it returned.
        end_ns: u64,
    },
    /// A receive whose wait is not one message's: one of several messages a wait
    /// completed, one a test or a wait for any of several completed, or a nonblocking
    /// receive whose arrival is not known (past what the kernel follows, or freed).
    Posted {
        /// Who received.
        pid: u32,
    },
}

impl Half {
    /// The process (or rank) of this end.
    pub fn pid(&self) -> u32 {
        match *self {
            Half::Send { pid, .. } | Half::Receive { pid, .. } | Half::Posted { pid } => pid,
        }
    }
}

/// Pairs each send with its receive as calls come, and adds up the waits.
#[derive(Debug, Default)]
pub struct LateSenders {
    numbering: Flows,
    /// Halves waiting for their other end, with the generation they came in.
    pending: HashMap<u64, (Half, u32)>,
    /// Counts calls to [`LateSenders::take_unmatched`].
    generation: u32,
    /// By (receiver pid, sender pid).
    pairs: BTreeMap<(u32, u32), LateSenderPair>,
    dropped: u64,
}

impl LateSenders {
    /// Takes one call (every call of the processes, in each thread's order).
    pub fn call(&mut self, ev: &pb::CallEvent) {
        let ends = self.numbering.ends(ev);
        if let Some(id) = ends.out {
            self.meet(
                id,
                Half::Send {
                    pid: ev.pid,
                    start_ns: ev.start_ns,
                },
            );
        }
        // An arrival that follows its call: completed by a test, or by a wait for any of
        // several, whose time is no one message's wait.
        let waited_alone = !ev.arrival.as_ref().is_some_and(|a| a.follows_call);
        match (waited_alone, &ends.into[..]) {
            // A blocking receive, or a wait that completed one message: its time is that
            // message's wait.
            (true, &[id]) => self.meet(
                id,
                Half::Receive {
                    pid: ev.pid,
                    start_ns: ev.start_ns,
                    end_ns: ev.start_ns + ev.duration_ns,
                },
            ),
            // A wait that completed several: it waited for the last to come, not for
            // each.
            (_, several) => {
                for &id in several {
                    self.meet(id, Half::Posted { pid: ev.pid });
                }
            }
        }
        for id in ends.unplaced {
            self.meet(id, Half::Posted { pid: ev.pid });
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
        // Taken by a receive whose wait is not this message's alone (Posted).
        let ((
            Half::Send {
                pid: sender,
                start_ns: sent,
            },
            Half::Receive {
                pid: receiver,
                start_ns,
                end_ns,
            },
        )
        | (
            Half::Receive {
                pid: receiver,
                start_ns,
                end_ns,
            },
            Half::Send {
                pid: sender,
                start_ns: sent,
            },
        )) = (half, other)
        else {
            return;
        };
        let p = self.pairs.entry((receiver, sender)).or_default();
        p.messages += 1;
        if sent > start_ns {
            p.late += 1;
            p.wait_ns += sent.min(end_ns) - start_ns;
        }
    }

    /// At most `max` of the halves whose other end did not come since the last call (it is
    /// on another node: the aggregator pairs them), taken out; those that came since stay a
    /// while, and those past `max` until the next call.
    pub fn take_unmatched(&mut self, max: usize) -> Vec<(u64, Half)> {
        let now = self.generation;
        self.generation = now.wrapping_add(1);
        let old: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, (_, g))| *g != now)
            .map(|(id, _)| *id)
            .take(max)
            .collect();
        old.into_iter()
            .filter_map(|id| Some((id, self.pending.remove(&id)?.0)))
            .collect()
    }

    /// Forgets the pairs of processes `keep` no longer keeps (both ends gone).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.pairs
            .retain(|&(receiver, sender), _| keep(receiver) || keep(sender));
    }

    /// The report, ranks and hosts from `whois` (processes it does not know are left out).
    pub fn report(&self, whois: Whois) -> LateSenderReport {
        let mut pairs: Vec<LateSenderPair> = self
            .pairs
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
        sort_pairs(&mut pairs);
        let unpaired = self
            .pending
            .values()
            .filter(|(h, _)| !matches!(h, Half::Posted { .. }))
            .count() as u64;
        LateSenderReport {
            pairs,
            not_numbered: self.numbering.unlinked,
            unpaired: unpaired + self.dropped,
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
        let mut by: BTreeMap<(u32, u32), LateSenderPair> = BTreeMap::new();
        let mut out = LateSenderReport::default();
        for r in parts {
            for p in &r.pairs {
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
            out.not_numbered.add(&r.not_numbered);
            out.unpaired += r.unpaired;
        }
        out.pairs = by.into_values().collect();
        sort_pairs(&mut out.pairs);
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
            comm_rank: Some(i32::from(pid != 1)),
            ..Default::default()
        }
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
