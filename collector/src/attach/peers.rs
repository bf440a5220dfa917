//! The per-peer point-to-point counters as userspace keeps them: the kernel's `PEERS`, and
//! those of freed communicators moved out of it into `PEERS_FOLDED`.
//!
//! The kernel keys a communicator's traffic by its handle and that handle's generation
//! (`collector-ebpf`'s `generations`), so every communicator a program makes and frees is
//! entries of its own, charged to its user's share of `PEERS`. A stencil code making and
//! freeing a grid per step would fill that share in minutes. Once a communicator is freed
//! (its handle's generation moved on), only a persistent request made on it before the
//! free and started after adds to its entries: they are moved here, their entries given
//! back to the user, and its next grids find room. Each is keyed here by its
//! communicator's name (`PeerKey::NAMED`): its handle means nothing any more, and its name
//! places it on world ranks without the names of freed communicators kept elsewhere; one
//! with no name goes on its process's traffic that no world rank takes
//! (`PeerKey::UNPLACED`). A map of the object holds them, so that a restarted daemon keeps
//! them, placed, with the kernel's.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap};
use aya::Ebpf;
use collector_common::{comm_generation, names, HandleKey, PeerKey, PeerVal, MAX_FOLDED_PEERS};
use tracing::{debug, warn};

use super::{map, AttachError};

/// How often the kernel's counters are looked through for freed communicators' (a walk of
/// the whole map, under the session's lock), while handles are freed; and how long a
/// counter is seen retired before it is moved (who-is-late names its communicator by then).
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// How often they are looked through all the same (a persistent request started after its
/// communicator's free makes a moved counter anew, and frees no handle).
const SWEEP_AT_LEAST_EVERY: Duration = Duration::from_secs(30);

/// How long a retired counter waits for its communicator's name (its process not yet placed
/// in its job, the constructor's event not yet read) before it goes on its process's
/// unplaced traffic.
const NAME_WAIT: Duration = Duration::from_secs(10);

/// Most counters moved in one sweep (three map operations each, under the session's lock);
/// the rest half a second later.
const MAX_MOVED_PER_SWEEP: usize = 4096;

/// Most counters kept here per process: one program cannot take the room every other
/// process's folding needs. Past it, a process's freed communicators' traffic goes on its
/// counters that no communicator names (`PeerKey::UNPLACED`, two).
pub const MAX_FOLDED_PER_PROCESS: usize = 1 << 14;

/// `bpf(2)`'s update flag: only where the key is not there.
const BPF_NOEXIST: u64 = 1;

/// Room kept in `PEERS_FOLDED` for processes' unplaced counters (two each) once the rest is
/// taken.
const UNPLACED_ROOM: usize = 1 << 14;
const _: () = assert!(UNPLACED_ROOM < MAX_FOLDED_PEERS as usize);

/// The kernel's per-peer counters and those moved out of it.
pub struct PeerCounters {
    kernel: PerCpuHashMap<MapData, PeerKey, PeerVal>,
    kept: BpfHashMap<MapData, PeerKey, PeerVal>,
    /// What `kept` holds by process (read from it once, at load: a restarted daemon's).
    folded: HashMap<u32, HashMap<PeerKey, PeerVal>>,
    /// The kernel's counters of freed communicators, and when each was first seen so: moved
    /// once [`SWEEP_EVERY`] old, so that who-is-late has named their communicators by then.
    retired: HashMap<PeerKey, Instant>,
    last_sweep: Option<Instant>,
    /// The handle generation at the last sweep: none moved since, none freed.
    handles_at_sweep: Option<u64>,
    /// Where the next truncated sweep starts in its keys (each gets its turn).
    rotation: usize,
}

impl PeerCounters {
    /// Takes the maps out of the loaded object, with what a daemon before this one moved.
    pub fn take_from(ebpf: &mut Ebpf) -> Result<PeerCounters, AttachError> {
        let kept: BpfHashMap<MapData, PeerKey, PeerVal> = map(ebpf, names::maps::PEERS_FOLDED)?;
        let mut folded: HashMap<u32, HashMap<PeerKey, PeerVal>> = HashMap::new();
        for (k, v) in kept.iter().filter_map(Result::ok) {
            folded.entry(k.tgid).or_default().insert(k, v);
        }
        Ok(PeerCounters {
            kernel: map(ebpf, names::maps::PEERS)?,
            kept,
            folded,
            retired: HashMap::new(),
            last_sweep: None,
            handles_at_sweep: None,
            rotation: 0,
        })
    }

    /// Every counter, the kernel's summed over CPUs and added to what was moved out of it.
    pub fn read(&self) -> Vec<(PeerKey, PeerVal)> {
        self.read_where(|_| true)
    }

    /// [`PeerCounters::read`] of process `pid` alone.
    pub fn read_of(&self, pid: u32) -> Vec<(PeerKey, PeerVal)> {
        self.read_where(|p| p == pid)
    }

    fn read_where(&self, of: impl Fn(u32) -> bool) -> Vec<(PeerKey, PeerVal)> {
        let mut all: HashMap<PeerKey, PeerVal> = self
            .folded
            .iter()
            .filter(|(pid, _)| of(**pid))
            .flat_map(|(_, f)| f.iter().map(|(k, v)| (*k, *v)))
            .collect();
        // Keys first, values only of those wanted (one process's, at its MPI_Pcontrol).
        let keys: Vec<PeerKey> = self
            .kernel
            .keys()
            .filter_map(Result::ok)
            .filter(|k| of(k.tgid))
            .collect();
        for k in keys {
            if let Ok(per_cpu) = self.kernel.get(&k, 0) {
                let v = all.entry(k).or_default();
                for c in per_cpu.iter() {
                    v.add(c);
                }
            }
        }
        all.into_iter().collect()
    }

    /// Counters of process `pid`'s freed communicators held here, out of the kernel's map.
    pub fn folded_of(&self, pid: u32) -> u64 {
        self.folded.get(&pid).map_or(0, |f| f.len() as u64)
    }

    /// The processes with counters, here or in the kernel.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.kernel
            .keys()
            .filter_map(Result::ok)
            .map(|k| k.tgid)
            .chain(self.folded.keys().copied())
    }

    /// Removes every counter of `pid`, here and in the kernel.
    pub fn forget(&mut self, pid: u32) {
        super::remove_keys_of(&mut self.kernel, pid, |k| k.tgid);
        if let Some(f) = self.folded.remove(&pid) {
            for k in f.keys() {
                let _ = self.kept.remove(k);
            }
        }
        self.retired.retain(|k, _| k.tgid != pid);
    }

    /// The kernel's counters of communicators freed, due to be moved out of its map (seen
    /// retired [`SWEEP_EVERY`] ago or more), each with how long it has been: at most every
    /// [`SWEEP_EVERY`], and only where handles were freed since the last look
    /// (`handles`: the handle generation now) or some wait, or the last is
    /// [`SWEEP_AT_LEAST_EVERY`] old; `frees` says how often each process freed each handle.
    pub fn due(
        &mut self,
        frees: &BpfHashMap<MapData, HandleKey, u64>,
        handles: u64,
    ) -> Vec<(PeerKey, Duration)> {
        let now = Instant::now();
        let since = self.last_sweep.map(|at| now.duration_since(at));
        if since.is_some_and(|s| s < SWEEP_EVERY)
            || (self.retired.is_empty()
                && self.handles_at_sweep == Some(handles)
                && since.is_some_and(|s| s < SWEEP_AT_LEAST_EVERY))
        {
            return Vec::new();
        }
        self.last_sweep = Some(now);
        self.handles_at_sweep = Some(handles);
        let mut generations: HashMap<(u32, u64), u16> = HashMap::new();
        let mut retired_now = HashMap::new();
        for k in self.kernel.keys().filter_map(Result::ok) {
            if k.comm == PeerKey::WORLD {
                continue;
            }
            let gen = *generations.entry((k.tgid, k.comm)).or_insert_with(|| {
                let key = HandleKey {
                    tgid: k.tgid,
                    _pad: 0,
                    handle: k.comm,
                };
                frees.get(&key, 0).map_or(0, comm_generation)
            });
            if is_retired(&k, gen) {
                let first = self.retired.get(&k).copied().unwrap_or(now);
                retired_now.insert(k, first);
            }
        }
        self.retired = retired_now;
        let mut due: Vec<(PeerKey, Duration)> = self
            .retired
            .iter()
            .map(|(k, first)| (*k, now.duration_since(*first)))
            .filter(|(_, age)| *age >= SWEEP_EVERY)
            .collect();
        if due.len() > MAX_MOVED_PER_SWEEP {
            // The rest soon, from another place: no process waits behind another.
            due.sort_unstable_by_key(|(k, _)| *k);
            self.rotation = self.rotation.wrapping_add(MAX_MOVED_PER_SWEEP);
            let from = self.rotation % due.len();
            due.rotate_left(from);
            due.truncate(MAX_MOVED_PER_SWEEP);
            self.last_sweep = now.checked_sub(SWEEP_EVERY * 3 / 4);
        }
        debug!(
            retired = self.retired.len(),
            due = due.len(),
            took_us = now.elapsed().as_micros() as u64,
            "looked through the per-peer counters for freed communicators'"
        );
        due
    }

    /// Moves each due counter (see [`PeerCounters::due`]) here, under its communicator's
    /// name where it has one (`named`), or on its process's unplaced traffic once it waited
    /// [`NAME_WAIT`] for one; returns each one moved and its key here.
    ///
    /// A call adding to a counter between its read here and its removal is lost: only a
    /// persistent request made on its communicator before the free and started after can
    /// (and a daemon killed between its removal and its keeping here loses the counter).
    pub fn move_out(
        &mut self,
        named: &[(PeerKey, Duration, Option<u64>)],
    ) -> Vec<(PeerKey, PeerKey)> {
        let start = Instant::now();
        let moved: Vec<(PeerKey, PeerKey)> = named
            .iter()
            .filter(|(_, age, name)| name.is_some() || *age >= NAME_WAIT)
            .filter_map(|(k, _, name)| Some((*k, self.move_one(k, *name)?)))
            .collect();
        for (k, _) in &moved {
            self.retired.remove(k);
        }
        if !moved.is_empty() {
            debug!(
                moved = moved.len(),
                took_us = start.elapsed().as_micros() as u64,
                "per-peer counters of freed communicators moved out of the kernel's map"
            );
        }
        moved
    }

    /// Moves the kernel's counter `k` here, under its communicator's `name`; its key here,
    /// or none where it stays in the kernel (no room here).
    fn move_one(&mut self, k: &PeerKey, name: Option<u64>) -> Option<PeerKey> {
        let here = match name {
            Some(name) => PeerKey {
                comm: name,
                gen: PeerKey::NAMED,
                ..*k
            },
            None => unplaced(k),
        };
        let target = self.room_for(&here)?;
        let per_cpu = self.kernel.get(k, 0).ok()?;
        // Out of the kernel's map first: a daemon killed in between loses this counter's
        // calls, never counts them twice.
        self.kernel.remove(k).ok()?;
        let mut v = self
            .folded
            .get(&k.tgid)
            .and_then(|f| f.get(&target))
            .copied()
            .unwrap_or_default();
        for c in per_cpu.iter() {
            v.add(c);
        }
        if let Err(e) = self.kept.insert(target, v, 0) {
            // Back where it was, unless the kernel made it anew meanwhile.
            if self.kernel.insert(k, per_cpu, BPF_NOEXIST).is_err() {
                warn!("a freed communicator's per-peer counter could not be kept: {e}");
            }
            return None;
        }
        self.folded.entry(k.tgid).or_default().insert(target, v);
        Some(target)
    }

    /// Where `k`'s traffic goes here: under its own key, or its process's unplaced one past
    /// [`MAX_FOLDED_PER_PROCESS`] or the room for named ones; none where the map is full.
    fn room_for(&self, k: &PeerKey) -> Option<PeerKey> {
        let mine = self.folded.get(&k.tgid);
        let has = |t: &PeerKey| mine.is_some_and(|f| f.contains_key(t));
        let held: usize = self.folded.values().map(HashMap::len).sum();
        let named_room = mine.map_or(0, HashMap::len) < MAX_FOLDED_PER_PROCESS
            && held < MAX_FOLDED_PEERS as usize - UNPLACED_ROOM;
        let any_room = held < MAX_FOLDED_PEERS as usize;
        [*k, unplaced(k)]
            .into_iter()
            .find(|t| has(t) || (any_room && (t.comm == PeerKey::UNPLACED || named_room)))
    }
}

/// Whether `k` counts traffic of a communicator since freed: its handle's generation in its
/// process now (`gen`: 0 where never freed) has moved past the key's.
fn is_retired(k: &PeerKey, gen: u16) -> bool {
    k.comm != PeerKey::WORLD && k.gen & PeerKey::NAMED == 0 && gen != k.gen
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
        // Its handle freed twice: generation 2 is the live communicator's.
        assert!(is_retired(&key(7, 0x44, 0), 2));
        assert!(is_retired(&key(7, 0x44, 1), 2));
        assert!(!is_retired(&key(7, 0x44, 2), 2), "the live one");
        assert!(!is_retired(&key(7, 0x45, 0), 0), "never freed");
        assert!(!is_retired(&key(7, PeerKey::WORLD, 0), 2));
        assert!(
            !is_retired(&key(7, 0x44, PeerKey::NAMED | 5), 2),
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
