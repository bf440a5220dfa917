//! The per-peer point-to-point counters as userspace keeps them: the kernel's `PEERS`, and
//! those of freed communicators moved out of it into `PEERS_FOLDED`.
//!
//! The kernel keys a communicator's traffic by its handle and that handle's generation
//! (`collector-ebpf`'s `generations`), so every communicator a program makes and frees is
//! entries of its own, charged to its user's share of `PEERS`. A stencil code making and
//! freeing a grid per step would fill that share in minutes. Once a communicator is freed
//! (its handle's generation moved on), nothing but a request made before the free adds to
//! its entries: they are moved here, their entries given back to the user, and its next
//! grids find room. Each is keyed here by its communicator's name where it has one
//! (`PeerKey::NAMED`): its handle means nothing any more, and its name places it on world
//! ranks without the names of freed communicators kept elsewhere. A map of the object
//! holds them, so that a restarted daemon keeps them, placed, with the kernel's.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap};
use aya::Ebpf;
use collector_common::{comm_generation, names, HandleKey, PeerKey, PeerVal, MAX_FOLDED_PEERS};
use tracing::debug;

use super::{map, AttachError};

/// How often the kernel's counters are looked through for freed communicators' (a walk of
/// the whole map, under the session's lock).
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Most counters moved in one sweep (three map operations each, under the session's lock);
/// the rest wait for the next.
const MAX_MOVED_PER_SWEEP: usize = 4096;

/// Most counters kept here per process: one program cannot take the room every other
/// process's folding needs. Past it, a process's freed communicators' traffic goes on one
/// counter per direction that no communicator names (`PeerKey::UNPLACED`).
pub const MAX_FOLDED_PER_PROCESS: usize = 1 << 14;

/// The kernel's per-peer counters and those moved out of it.
pub struct PeerCounters {
    kernel: PerCpuHashMap<MapData, PeerKey, PeerVal>,
    kept: BpfHashMap<MapData, PeerKey, PeerVal>,
    /// What `kept` holds (read from it once, at load: a restarted daemon's).
    folded: HashMap<PeerKey, PeerVal>,
    /// Counters in `folded` per process.
    per_process: HashMap<u32, usize>,
    /// The kernel's counters of freed communicators at the last sweep: moved at the next,
    /// so that what completes just after a free (a receive posted before it) is in them.
    retired: HashSet<PeerKey>,
    last_sweep: Option<Instant>,
    /// `gen` of the counters this daemon moves under a name: [`PeerKey::NAMED`] and a
    /// number drawn at its start, apart from an earlier daemon's (see `CommKey::folded`).
    namer: u16,
}

impl PeerCounters {
    /// Takes the maps out of the loaded object, with what a daemon before this one moved.
    pub fn take_from(ebpf: &mut Ebpf) -> Result<PeerCounters, AttachError> {
        let kept: BpfHashMap<MapData, PeerKey, PeerVal> = map(ebpf, names::maps::PEERS_FOLDED)?;
        let folded: HashMap<PeerKey, PeerVal> = kept.iter().filter_map(Result::ok).collect();
        let mut per_process = HashMap::new();
        for k in folded.keys() {
            *per_process.entry(k.tgid).or_default() += 1;
        }
        Ok(PeerCounters {
            kernel: map(ebpf, names::maps::PEERS)?,
            kept,
            folded,
            per_process,
            retired: HashSet::new(),
            last_sweep: None,
            namer: PeerKey::NAMED | drawn_namer(),
        })
    }

    /// `gen` of the counters this daemon moved under a name.
    pub fn namer(&self) -> u16 {
        self.namer
    }

    /// Every counter, the kernel's summed over CPUs and added to what was moved out of it.
    pub fn read(&self) -> Vec<(PeerKey, PeerVal)> {
        let mut all = self.folded.clone();
        for (k, per_cpu) in self.kernel.iter().filter_map(Result::ok) {
            let v = all.entry(k).or_default();
            for c in per_cpu.iter() {
                add(v, c);
            }
        }
        all.into_iter().collect()
    }

    /// Counters of process `pid`'s freed communicators held here, out of the kernel's map.
    pub fn folded_of(&self, pid: u32) -> u64 {
        self.per_process.get(&pid).map_or(0, |n| *n as u64)
    }

    /// The processes with counters, here or in the kernel.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.kernel
            .keys()
            .filter_map(Result::ok)
            .map(|k| k.tgid)
            .chain(self.per_process.keys().copied())
    }

    /// Removes every counter of `pid`, here and in the kernel.
    pub fn forget(&mut self, pid: u32) {
        super::remove_keys_of(&mut self.kernel, pid, |k| k.tgid);
        if self.per_process.remove(&pid).is_some() {
            self.folded.retain(|k, _| {
                let theirs = k.tgid == pid;
                if theirs {
                    let _ = self.kept.remove(k);
                }
                !theirs
            });
        }
        self.retired.retain(|k| k.tgid != pid);
    }

    /// At most every [`SWEEP_EVERY`]: moves the kernel's counters of communicators freed
    /// since the last sweep or before out of its map (`frees`: how often each process freed
    /// each handle), keyed by the name `name` gives a process's handle of a generation where
    /// it gives one; returns each counter it moved and its key here (the kernel's entries
    /// of their processes to be given back to their users' shares).
    ///
    /// A call adding to a counter between its read here and its removal is lost: only a
    /// request made before its communicator's free and completing two seconds or more
    /// after it can.
    pub fn sweep(
        &mut self,
        frees: &BpfHashMap<MapData, HandleKey, u64>,
        name: impl Fn(u32, u64, u16) -> Option<u64>,
    ) -> Vec<(PeerKey, PeerKey)> {
        let now = Instant::now();
        if self
            .last_sweep
            .is_some_and(|at| now.duration_since(at) < SWEEP_EVERY)
        {
            return Vec::new();
        }
        self.last_sweep = Some(now);
        let generations: HashMap<(u32, u64), u16> = frees
            .iter()
            .filter_map(Result::ok)
            .map(|(k, n)| ((k.tgid, k.handle), comm_generation(n)))
            .collect();
        if generations.is_empty() {
            // Nothing was ever freed: nothing to look for.
            self.retired.clear();
            return Vec::new();
        }
        let retired_now: HashSet<PeerKey> = self
            .kernel
            .keys()
            .filter_map(Result::ok)
            .filter(|k| is_retired(k, &generations))
            .collect();
        let mut due: Vec<PeerKey> = retired_now.intersection(&self.retired).copied().collect();
        due.sort_unstable();
        due.truncate(MAX_MOVED_PER_SWEEP);
        let moved: Vec<(PeerKey, PeerKey)> = due
            .iter()
            .filter_map(|k| Some((*k, self.move_out(k, name(k.tgid, k.comm, k.gen))?)))
            .collect();
        self.retired = retired_now;
        for k in &due {
            self.retired.remove(k);
        }
        if !moved.is_empty() {
            debug!(
                moved = moved.len(),
                "per-peer counters of freed communicators moved out of the kernel's map"
            );
        }
        moved
    }

    /// Moves the kernel's counter `k` here, under its communicator's `name` where it has
    /// one; its key here, or none where it stays in the kernel (no room here).
    fn move_out(&mut self, k: &PeerKey, name: Option<u64>) -> Option<PeerKey> {
        let Ok(per_cpu) = self.kernel.get(k, 0) else {
            return None;
        };
        let here = match name {
            Some(name) => PeerKey {
                comm: name,
                gen: self.namer,
                ..*k
            },
            None => *k,
        };
        let target = self.room_for(&here)?;
        let before = self.folded.get(&target).copied();
        let mut v = before.unwrap_or_default();
        for c in per_cpu.iter() {
            add(&mut v, c);
        }
        if self.kept.insert(target, v, 0).is_err() {
            return None;
        }
        if self.kernel.remove(k).is_err() {
            // Still the kernel's: it must not count twice.
            let _ = match before {
                Some(b) => self.kept.insert(target, b, 0),
                None => self.kept.remove(&target),
            };
            return None;
        }
        if before.is_none() {
            *self.per_process.entry(k.tgid).or_default() += 1;
        }
        self.folded.insert(target, v);
        Some(target)
    }

    /// Where `k`'s traffic goes here: under its own key, or its process's unplaced one past
    /// [`MAX_FOLDED_PER_PROCESS`]; none where the map is full.
    fn room_for(&self, k: &PeerKey) -> Option<PeerKey> {
        let full = self.folded.len() >= MAX_FOLDED_PEERS as usize;
        let own_room = self.per_process.get(&k.tgid).copied().unwrap_or(0) < MAX_FOLDED_PER_PROCESS;
        [*k, unplaced(k)].into_iter().find(|t| {
            self.folded.contains_key(t) || (!full && (own_room || t.comm == PeerKey::UNPLACED))
        })
    }
}

/// Whether `k` counts traffic of a communicator since freed: its handle's generation in its
/// process (`generations`: 0 where never freed) has moved past the key's.
fn is_retired(k: &PeerKey, generations: &HashMap<(u32, u64), u16>) -> bool {
    k.comm != PeerKey::WORLD
        && k.gen & PeerKey::NAMED == 0
        && generations.get(&(k.tgid, k.comm)).copied().unwrap_or(0) != k.gen
}

/// A number for this daemon's names, 1 to 0x7fff, from the kernel's random source (the
/// time where that fails: it only needs to differ from the daemon's before).
fn drawn_namer() -> u16 {
    let mut b = [0u8; 2];
    // SAFETY: getrandom(2) into a buffer of its length.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let n = if got == 2 {
        u16::from_ne_bytes(b)
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos() as u16)
    };
    (n % 0x7fff) + 1
}

/// The key of `k`'s process's freed communicators' traffic that is not kept apart.
fn unplaced(k: &PeerKey) -> PeerKey {
    PeerKey {
        tgid: k.tgid,
        peer: PeerKey::ANY,
        comm: PeerKey::UNPLACED,
        dir: k.dir,
        gen: 0,
        me: PeerKey::ANY,
    }
}

fn add(v: &mut PeerVal, c: &PeerVal) {
    v.calls += c.calls;
    v.bytes += c.bytes;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, comm: u64, gen: u16) -> PeerKey {
        PeerKey {
            tgid,
            peer: 1,
            comm,
            dir: PeerKey::SENT,
            gen,
            me: 0,
        }
    }

    #[test]
    fn a_communicator_is_retired_once_its_handle_was_freed_past_its_generation() {
        let generations = HashMap::from([((7, 0x44), 2u16)]);
        assert!(is_retired(&key(7, 0x44, 0), &generations));
        assert!(is_retired(&key(7, 0x44, 1), &generations));
        assert!(!is_retired(&key(7, 0x44, 2), &generations), "the live one");
        assert!(!is_retired(&key(7, 0x45, 0), &generations), "never freed");
        assert!(
            !is_retired(&key(8, 0x44, 0), &generations),
            "another process's"
        );
        assert!(!is_retired(&key(7, PeerKey::WORLD, 0), &generations));
        assert!(
            !is_retired(&key(7, 0x44, PeerKey::NAMED | 5), &generations),
            "moved out already, under its name"
        );
    }

    #[test]
    fn unplaced_traffic_keeps_its_process_and_direction_only() {
        let mut k = key(7, 0x44, 3);
        k.dir = PeerKey::RECEIVED;
        let u = unplaced(&k);
        assert_eq!((u.tgid, u.dir), (7, PeerKey::RECEIVED));
        assert_eq!(
            (u.comm, u.peer, u.me, u.gen),
            (PeerKey::UNPLACED, PeerKey::ANY, PeerKey::ANY, 0)
        );
    }
}
