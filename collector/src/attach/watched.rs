//! The watched set as userspace changes it. The kernel remembers, per CPU, the last process
//! it found not counted (`collector-ebpf`'s `NOT_COUNTED`), until the scope generation
//! moves: every change made here moves it, so that such a process is judged again.

use aya::maps::{Array, HashMap, MapData, MapError};

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

    /// Whether `pid` is in the set.
    pub fn contains(&self, pid: u32) -> bool {
        self.map.get(&pid, 0).is_ok()
    }

    /// Moves the scope generation, after the change it announces. The kernel adds 1 to it
    /// atomically; this read-then-write may lose such an add, which is harmless: a verdict
    /// stamped with the value read came before the change and no longer matches, and one
    /// stamped with the value the lost add made came after both the change and the event
    /// that add announced.
    pub fn scope_changed(&mut self) {
        let now = self.scope_gen.get(&0, 0).unwrap_or(0);
        let _ = self.scope_gen.set(0, now.wrapping_add(1), 0);
    }
}
