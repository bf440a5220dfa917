//! Naming communicators alike in every member process.
//!
//! An MPI handle is local to its process (Open MPI's are pointers; MPICH's integers are
//! handed out in whatever order each process created objects), so collective instances are
//! keyed by a name every member computes from what all members did alike:
//!
//! - `MPI_COMM_WORLD` is the world, recognised in the kernel (Open MPI's context id 0,
//!   MPICH's handle `0x44000000`).
//! - A communicator made by a constructor on a named parent (`MPI_Comm_dup`, `_split`,
//!   `_split_type`, `_create`) is named by the parent's name, how many communicators the
//!   process had made from that parent before, and the color (split) or split type. MPI
//!   requires every member of the parent to call its constructors in the same order, so
//!   the members of one new communicator name it alike, and sibling communicators of one
//!   split (different colors) differ. `MPI_Comm_split_type` also takes the host: its
//!   siblings (one per node for `MPI_COMM_TYPE_SHARED`) share the type. How many came
//!   before is the kernel's count from the parent's creation (`CallEvent::made_index`),
//!   not one kept here: that one would miss the constructors whose events were lost, and
//!   a daemon restarted mid-job would count from its own start and give a communicator
//!   the name another node gives another communicator (and match its collectives and
//!   place its traffic with that one's).
//! - Where the kernel did not count from the parent's creation (the process attached
//!   mid-job, a daemon restarted since), the count is the constructors seen since, and
//!   the name is of another kind, never one a count from the creation gives, and this
//!   daemon's alone (a number it draws at its start is in it): another node's daemon, or
//!   this one's successor, counts from another point, and the same count would give
//!   another communicator the same name. The members this daemon attached to while none
//!   of them was making one (a job on this node attached to as it waits) name the child
//!   alike; across nodes it is not matched (its instances are `remote`, its traffic to
//!   another node's ranks unplaced).
//! - An NCCL communicator is named by the hash of its unique id, which every member holds.
//!
//! A communicator made before commtap watched the process (attached mid-job) has no name:
//! its collectives are counted as unidentified, never matched by guess.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use collector_common::{comm_id, CallEvent};

/// A communicator's name, the same in every member process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommKey(pub u64);

impl CommKey {
    /// `MPI_COMM_WORLD`.
    pub const WORLD: CommKey = CommKey(1);

    /// An NCCL communicator with this unique-id hash.
    pub fn nccl(id: u64) -> CommKey {
        CommKey(hash(&("nccl", id)))
    }

    /// The `index`-th communicator made from `self` by `routine` with `color` (and `host`
    /// where the constructor groups by node).
    pub fn child(self, index: u32, routine: u16, color: i32, host: Option<&str>) -> CommKey {
        CommKey(hash(&(self.0, index, routine, color, host)))
    }

    /// [`CommKey::child`] where `index` counts from the process's attach by the daemon
    /// whose number is `daemon`, not from the parent's creation: never a name
    /// [`CommKey::child`] gives, nor one another daemon gives.
    pub fn child_since_attach(
        self,
        daemon: u64,
        index: u32,
        routine: u16,
        color: i32,
        host: Option<&str>,
    ) -> CommKey {
        let what = (
            "since the attach",
            daemon,
            self.0,
            index,
            routine,
            color,
            host,
        );
        CommKey(hash(&what))
    }

    /// A number for the names counted since the attach by one daemon (drawn per job it
    /// follows: names are compared within a job).
    pub fn draw_daemon_number() -> u64 {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one("commtap daemon")
    }

    /// How the report shows it: `world`, else a short hexadecimal name.
    pub fn label(self) -> String {
        if self == CommKey::WORLD {
            "world".to_string()
        } else {
            format!("{:08x}", self.0 as u32 ^ (self.0 >> 32) as u32)
        }
    }
}

/// A stable hash (SipHash with fixed keys): every process's name for a communicator must
/// come out the same, in this process and in another daemon's.
fn hash<T: Hash>(v: &T) -> u64 {
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x636f_6d6d_7461_7031, 0x736b_6577_2d76_3100);
    v.hash(&mut h);
    // 0 and 1 are reserved (no name, the world).
    h.finish().max(2)
}

/// Communicators one process has named so far, by their local handle.
#[derive(Debug, Default)]
pub struct ProcComms {
    /// The communicator each handle stands for now, and its generation (`CommInfo::gen`).
    names: HashMap<u64, (u16, CommKey)>,
    /// Communicators whose handles were freed and given to another, by handle and
    /// generation: the per-peer counters keep their traffic apart, and it is still theirs.
    earlier: HashMap<(u64, u16), CommKey>,
    /// `earlier`'s keys, oldest first.
    earlier_order: std::collections::VecDeque<(u64, u16)>,
    /// Communicators seen made from each parent whose count the kernel does not know.
    made_since_attach: HashMap<CommKey, u32>,
    /// How often this process's events were lost: a constructor's among them would put
    /// `made_since_attach` behind the other members', so the names counted since are its
    /// own (unmatched from then on, never another communicator's).
    losses: u32,
    /// Which of its tracker's detaches this process was last detached (or watched again)
    /// at, if any: what it made before was not all seen, so its names counted since are
    /// its own too.
    detach: Option<u32>,
}

/// Communicator names kept per process: a program making more without freeing them is
/// leaking, and what is past this is counted as unidentified.
const MAX_NAMES: usize = 1 << 14;

/// Names of freed communicators kept per process, the latest: a program that makes and
/// frees communicators in a loop never stops naming its new ones, and the traffic of the
/// oldest past this is unplaced.
const MAX_EARLIER_NAMES: usize = 1 << 14;

impl ProcComms {
    /// A process's names from its attach, or from its tracker's `detach`-th detach.
    pub fn after_detach(detach: Option<u32>) -> ProcComms {
        ProcComms {
            detach,
            ..ProcComms::default()
        }
    }

    /// The name of the communicator `ev` was called on, if it has one.
    pub fn name(&self, ev: &CallEvent, nccl: bool) -> Option<CommKey> {
        self.named(ev, nccl).map(|(k, _)| k)
    }

    /// [`ProcComms::name`], and whether the communicator's creation was seen (a named
    /// constructor's, or NCCL's: an NCCL communicator has an identity only if its creation
    /// was seen): then every collective of this process on it was seen too.
    pub fn named(&self, ev: &CallEvent, nccl: bool) -> Option<(CommKey, bool)> {
        if nccl {
            return (ev.comm_id != 0).then(|| (CommKey::nccl(ev.comm_id), true));
        }
        if ev.comm == 0 {
            return None;
        }
        // The world's handle is never one a constructor made: no lookup (most calls).
        if ev.comm_id == comm_id::WORLD {
            return Some((CommKey::WORLD, false));
        }
        self.names.get(&ev.comm).map(|(_, k)| (*k, true))
    }

    /// The name of the communicator whose local handle is `handle` in generation `gen`
    /// (now or earlier), where its creation was seen.
    pub fn of_handle(&self, handle: u64, gen: u16) -> Option<CommKey> {
        match self.names.get(&handle) {
            Some((now, key)) if *now == gen => Some(*key),
            _ => self.earlier.get(&(handle, gen)).copied(),
        }
    }

    /// Some of this process's events were lost (see `losses`).
    pub fn events_lost(&mut self) {
        self.losses = self.losses.wrapping_add(1);
    }

    /// Names the communicator a constructor call made, from its parent's name; `daemon`:
    /// this daemon's number ([`CommKey::child_since_attach`]).
    pub fn created(&mut self, ev: &CallEvent, by_host: bool, host: &str, daemon: u64) {
        let parent = self.name(ev, false);
        // A reused handle's earlier communicator keeps its name for the traffic it had.
        if let Some((gen, key)) = self.names.remove(&ev.created) {
            if gen != ev.created_gen() {
                let freed = (ev.created, gen);
                if self.earlier.insert(freed, key).is_some() {
                    // The generation wrapped: the newer one is the latest freed.
                    self.earlier_order.retain(|k| *k != freed);
                }
                self.earlier_order.push_back(freed);
                if self.earlier_order.len() > MAX_EARLIER_NAMES {
                    if let Some(oldest) = self.earlier_order.pop_front() {
                        self.earlier.remove(&oldest);
                    }
                }
            }
        }
        let Some(parent) = parent else {
            // The parent has no name: neither does the child.
            return;
        };
        if ev.recv_tag == CallEvent::MADE_NOTHING {
            // Failed: nothing made, nor counted among the parent's children.
            return;
        }
        let host = by_host.then_some(host);
        let key = if let Some(index) = ev.made_index() {
            parent.child(index, ev.routine, ev.color, host)
        } else {
            let index = self.made_since_attach.entry(parent).or_default();
            *index += 1;
            // Counted alike by the node's ranks attached alike, until one of them may have
            // missed a constructor: its count is its own from then on.
            let counted_from = match (self.losses, self.detach) {
                (0, None) => daemon,
                (losses, detach) => hash(&("its own", daemon, ev.tgid, losses, detach)),
            };
            parent.child_since_attach(counted_from, *index - 1, ev.routine, ev.color, host)
        };
        if ev.created != 0 && self.names.len() < MAX_NAMES {
            self.names.insert(ev.created, (ev.created_gen(), key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(comm: u64, comm_id: u64, created: u64, color: i32) -> CallEvent {
        CallEvent {
            comm,
            comm_id,
            created,
            color,
            routine: 7,
            ..CallEvent::default()
        }
    }

    #[test]
    fn members_name_alike_and_siblings_differ() {
        // Two processes whose handles differ make the same split of the world.
        let (mut a, mut b) = (ProcComms::default(), ProcComms::default());
        a.created(&ev(0x10, comm_id::WORLD, 0x100, 0), false, "h", 7);
        b.created(&ev(0x20, comm_id::WORLD, 0x200, 0), false, "h", 7);
        let mut c = ProcComms::default();
        c.created(&ev(0x30, comm_id::WORLD, 0x100, 1), false, "h", 7);
        let na = a.name(&ev(0x100, 0, 0, 0), false).unwrap();
        let nb = b.name(&ev(0x200, 0, 0, 0), false).unwrap();
        let nc = c.name(&ev(0x100, 0, 0, 0), false).unwrap();
        assert_eq!(na, nb);
        assert_ne!(na, nc, "another color is another communicator");
        // The second communicator made from the world is another one.
        let second = CallEvent {
            recv_tag: 1,
            ..ev(0x10, comm_id::WORLD, 0x101, 0)
        };
        a.created(&second, false, "h", 7);
        assert_ne!(a.name(&ev(0x101, 0, 0, 0), false).unwrap(), na);
    }

    #[test]
    fn a_reused_handle_keeps_its_earlier_communicators_name_by_generation() {
        let mut a = ProcComms::default();
        a.created(&ev(0x10, comm_id::WORLD, 0x100, 0), false, "h", 7);
        let first = a.of_handle(0x100, 0).unwrap();
        // Freed (generation 1) and given to the world's next split, of another color.
        let again = CallEvent {
            tag: 1,
            recv_tag: 1,
            ..ev(0x10, comm_id::WORLD, 0x100, 1)
        };
        a.created(&again, false, "h", 7);
        let second = a.of_handle(0x100, 1).unwrap();
        assert_ne!(first, second);
        assert_eq!(
            a.of_handle(0x100, 0),
            Some(first),
            "the earlier one's traffic"
        );
        assert_eq!(
            a.name(&ev(0x100, 0, 0, 0), false),
            Some(second),
            "calls now"
        );
        assert_eq!(a.of_handle(0x100, 2), None);
        // Given to a child of an unnamed parent: no name now, the earlier ones kept.
        let unnamed = CallEvent {
            tag: 2,
            ..ev(0x99, 0, 0x100, 0)
        };
        a.created(&unnamed, false, "h", 7);
        assert_eq!(a.name(&ev(0x100, 0, 0, 0), false), None);
        assert_eq!(a.of_handle(0x100, 1), Some(second));
        assert_eq!(a.of_handle(0x100, 2), None);
    }

    #[test]
    fn a_loop_of_communicators_made_and_freed_is_named_to_its_end() {
        let mut a = ProcComms::default();
        let n = (MAX_NAMES + MAX_EARLIER_NAMES) as i32 + 10;
        let mut names = Vec::new();
        for gen in 0..n {
            let made = CallEvent {
                tag: gen,
                recv_tag: gen,
                ..ev(0x10, comm_id::WORLD, 0x100, gen % 2)
            };
            a.created(&made, false, "h", 7);
            names.push(a.of_handle(0x100, gen as u16).expect("named"));
        }
        // The latest freed ones keep their names, the oldest past the bound do not.
        let oldest_kept = n as usize - 1 - MAX_EARLIER_NAMES;
        assert_eq!(
            a.of_handle(0x100, oldest_kept as u16),
            Some(names[oldest_kept])
        );
        assert_eq!(a.of_handle(0x100, (oldest_kept - 1) as u16), None);
        assert_eq!(a.earlier.len(), MAX_EARLIER_NAMES);
    }

    #[test]
    fn unnamed_parents_make_unnamed_children() {
        let mut a = ProcComms::default();
        a.created(&ev(0x10, 0, 0x100, 0), false, "h", 7);
        assert_eq!(a.name(&ev(0x100, 0, 0, 0), false), None);
        assert_eq!(
            a.name(&ev(0x44, comm_id::WORLD, 0, 0), false),
            Some(CommKey::WORLD)
        );
        assert_eq!(a.name(&ev(0, 0, 0, 0), true), None);
        assert_eq!(a.name(&ev(0, 9, 0, 0), true), Some(CommKey::nccl(9)));
    }

    #[test]
    fn children_are_named_by_the_kernels_count_not_by_what_this_process_saw() {
        // A process watched from its start makes three splits of the world; the same
        // process seen by a daemon (re)started after the second sees only the third, with
        // the kernel's count: both name it alike, and not as the first.
        let (mut whole, mut late) = (ProcComms::default(), ProcComms::default());
        let split = |index: i32, handle: u64| CallEvent {
            recv_tag: index,
            ..ev(0x10, comm_id::WORLD, handle, 0)
        };
        for (index, handle) in [(0, 0x100), (1, 0x101), (2, 0x102)] {
            whole.created(&split(index, handle), false, "h", 7);
        }
        late.created(&split(2, 0x102), false, "h", 7);
        let third = whole.name(&ev(0x102, 0, 0, 0), false).expect("named");
        assert_eq!(late.name(&ev(0x102, 0, 0, 0), false), Some(third));
        assert_ne!(whole.name(&ev(0x100, 0, 0, 0), false), Some(third));
        // Where the kernel did not count from the parent's creation (attached mid-job),
        // counted from the attach: alike in members this daemon attached to alike, never a
        // name counted from the creation gives, nor one another daemon (another node's, or
        // this one's successor) gives, which counts from another point.
        let mut procs: [ProcComms; 3] = Default::default();
        for (p, (handle, daemon)) in procs.iter_mut().zip([(0x103, 7), (0x203, 7), (0x303, 8)]) {
            p.created(&split(-1, handle), false, "h", daemon);
        }
        let [mut attached, mut other, elsewhere] = procs;
        let first_since = attached.name(&ev(0x103, 0, 0, 0), false).expect("named");
        assert_eq!(other.name(&ev(0x203, 0, 0, 0), false), Some(first_since));
        assert_ne!(
            elsewhere.name(&ev(0x303, 0, 0, 0), false),
            Some(first_since)
        );
        assert_ne!(whole.name(&ev(0x100, 0, 0, 0), false), Some(first_since));
        attached.created(&split(-1, 0x104), false, "h", 7);
        other.created(&split(-1, 0x204), false, "h", 7);
        assert_ne!(attached.name(&ev(0x104, 0, 0, 0), false), Some(first_since));
        // Where events of a process were lost (a constructor's, maybe), its names counted
        // since the attach are its own from then on.
        let mut lossy = ProcComms::default();
        lossy.created(&split(-1, 0x403), false, "h", 7);
        lossy.events_lost();
        lossy.created(&split(-1, 0x404), false, "h", 7);
        let lossy_second = lossy.name(&ev(0x404, 0, 0, 0), false);
        assert!(lossy_second.is_some());
        assert_ne!(lossy_second, attached.name(&ev(0x104, 0, 0, 0), false));
        // A failed constructor made nothing and takes no place among the children.
        attached.created(&split(CallEvent::MADE_NOTHING, 0), false, "h", 7);
        attached.created(&split(-1, 0x105), false, "h", 7);
        other.created(&split(-1, 0x205), false, "h", 7);
        assert_eq!(
            attached.name(&ev(0x105, 0, 0, 0), false),
            other.name(&ev(0x205, 0, 0, 0), false)
        );
    }

    /// Names counted since the attach are shared by a node's ranks attached alike only:
    /// two that each lost events, or one watched again after a detach, name apart (each
    /// may have missed a different constructor), and a process apart from its own run
    /// before the detach.
    #[test]
    fn names_since_the_attach_are_a_process_own_once_it_may_have_missed_one() {
        let made = |pid: u32, handle: u64| CallEvent {
            tgid: pid,
            recv_tag: -1,
            ..ev(0x10, comm_id::WORLD, handle, 0)
        };
        let first_child = |p: &mut ProcComms, pid: u32| {
            p.created(&made(pid, 0x100), false, "h", 7);
            p.name(&ev(0x100, 0, 0, 0), false).expect("named")
        };
        let (mut a, mut b) = (ProcComms::default(), ProcComms::default());
        assert_eq!(first_child(&mut a, 1), first_child(&mut b, 2));
        let (mut a, mut b) = (ProcComms::default(), ProcComms::default());
        a.events_lost();
        b.events_lost();
        assert_ne!(first_child(&mut a, 1), first_child(&mut b, 2));
        let before = first_child(&mut ProcComms::default(), 1);
        let once = first_child(&mut ProcComms::after_detach(Some(1)), 1);
        let twice = first_child(&mut ProcComms::after_detach(Some(2)), 1);
        assert!(before != once && once != twice && before != twice);
    }

    #[test]
    fn split_type_siblings_differ_by_host() {
        let (mut a, mut b) = (ProcComms::default(), ProcComms::default());
        a.created(&ev(1, comm_id::WORLD, 5, 0), true, "node1", 7);
        b.created(&ev(1, comm_id::WORLD, 5, 0), true, "node2", 7);
        assert_ne!(
            a.name(&ev(5, 0, 0, 0), false),
            b.name(&ev(5, 0, 0, 0), false)
        );
    }
}
