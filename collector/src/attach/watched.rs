//! The watched set as userspace changes it. The kernel remembers, per CPU, the last process
//! it found not counted (`collector-ebpf`'s `NOT_COUNTED`), until the scope generation
//! moves: every change made here moves it, so that such a process is judged again.

use aya::maps::{Array, HashMap, MapData, MapError};

/// `SCOPE_GEN`'s entry userspace moves.
const USERSPACE: u32 = 1;

/// The watched set (`WATCHED`: pid -> `collector_common::watch` flags) and the scope
/// generation (`SCOPE_GEN`) its changes move.
pub struct WatchedSet {
    map: HashMap<MapData, u32, u32>,
    scope_gen: Array<MapData, u64>,
}

impl WatchedSet {
    /// The set over its two maps.
    pub fn new(map: HashMap<MapData, u32, u32>, scope_gen: Array<MapData, u64>) -> Self {
        WatchedSet { map, scope_gen }
    }

    /// Sets `pid`'s flags.
    pub fn insert(&mut self, pid: u32, flags: u32) -> Result<(), MapError> {
        self.map.insert(pid, flags, 0)?;
        self.scope_changed();
        Ok(())
    }

    /// Removes `pid` (nothing if it is not there).
    pub fn remove(&mut self, pid: u32) {
        let _ = self.map.remove(&pid);
        self.scope_changed();
    }

    /// The pids (and thread ids) in the set.
    pub fn pids(&self) -> Vec<u32> {
        self.map.keys().filter_map(Result::ok).collect()
    }

    /// Whether `pid` is in the set.
    pub fn contains(&self, pid: u32) -> bool {
        self.map.get(&pid, 0).is_ok()
    }

    /// Whether `pid` is in the set as one the kernel is to leave alone (flags 0: detached).
    pub fn ignores(&self, pid: u32) -> bool {
        self.map.get(&pid, 0).is_ok_and(|flags| flags == 0)
    }

    /// Moves the scope generation, after the change it announces: its userspace entry
    /// (index 1), of which this is the only writer; the kernel moves its own (index 0).
    pub fn scope_changed(&mut self) {
        let now = self.scope_gen.get(&USERSPACE, 0).unwrap_or(0);
        let _ = self.scope_gen.set(USERSPACE, now.wrapping_add(1), 0);
    }
}
