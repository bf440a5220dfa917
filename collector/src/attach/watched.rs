//! The watched set as userspace changes it. The kernel remembers, per CPU, the last process
//! it found not counted (`collector-ebpf`'s `NOT_COUNTED`), until the scope generation
//! moves: every change made here moves it, so that such a process is judged again.

use aya::maps::{Array, HashMap, MapData, MapError, PerCpuArray, PerCpuValues};
use collector_common::watch::{LATEST_KERNEL, LATEST_USERSPACE};

/// `SCOPE_GEN`'s entry userspace moves.
const USERSPACE: u32 = 1;

/// The watched set (`WATCHED`: pid -> `collector_common::watch` flags), when a process last
/// entered it (`WATCHED_LATEST`) and the scope generation (`SCOPE_GEN`) its changes move.
pub struct WatchedSet {
    map: HashMap<MapData, u32, u32>,
    latest: PerCpuArray<MapData, u64>,
    /// `latest` as the set was found (a daemon before this one left it).
    kept_latest: Option<u64>,
    scope_gen: Array<MapData, u64>,
}

impl WatchedSet {
    /// The set over its three maps (taken before any program runs: see
    /// [`WatchedSet::kept_latest`]).
    pub fn new(
        map: HashMap<MapData, u32, u32>,
        latest: PerCpuArray<MapData, u64>,
        scope_gen: Array<MapData, u64>,
    ) -> Self {
        let kept_latest = latest_of(&latest);
        WatchedSet {
            map,
            latest,
            kept_latest,
            scope_gen,
        }
    }

    /// Sets `pid`'s flags.
    pub fn insert(&mut self, pid: u32, flags: u32) -> Result<(), MapError> {
        // Stamped before: `pid` runs already, so it started before the stamp either way.
        self.stamp_latest();
        self.map.insert(pid, flags, 0)?;
        self.scope_changed();
        Ok(())
    }

    /// Stamps userspace's entry of `WATCHED_LATEST` with now, on every CPU (this is its only
    /// writer, and the boot clock only goes up).
    fn stamp_latest(&mut self) {
        let Ok(cpus) = aya::util::nr_cpus() else {
            return;
        };
        let now = crate::clock::boottime_ns();
        if let Ok(values) = PerCpuValues::try_from(vec![now; cpus]) {
            let _ = self.latest.set(LATEST_USERSPACE, values, 0);
        }
    }

    /// When a process last entered the set as it was found, boot clock ns (None: no stamp,
    /// a new set): every process kept in it started no later.
    pub fn kept_latest(&self) -> Option<u64> {
        self.kept_latest
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

/// The latest stamp of `latest` (`WATCHED_LATEST`), of the kernel's and userspace's on every
/// CPU; None where none was made.
fn latest_of(latest: &PerCpuArray<MapData, u64>) -> Option<u64> {
    [LATEST_KERNEL, LATEST_USERSPACE]
        .into_iter()
        .filter_map(|i| latest.get(&i, 0).ok())
        .filter_map(|values| values.iter().copied().max())
        .max()
        .filter(|&t| t != 0)
}
