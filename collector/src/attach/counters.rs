//! The kernel's ground-truth counters as userspace sees them: keys with their slots in
//! `COUNTER_SLOTS`, values in `COUNTER_VALUES` (shared by the CPUs), and the `FREE_SLOTS`
//! stack and `NEXT_FRESH_SLOT` counter that hand slots to new keys (see collector-ebpf's
//! `counters`).

use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuHashMap, Stack},
    Ebpf,
};
use collector_common::{
    CounterKey, CounterSlot, CounterVal, DurationHist, ProcStats, MAX_COUNTERS,
};
use tracing::debug;

use collector_common::names;

use super::{map, map_err, AttachError};

/// The counter maps, and the handle generation that makes threads drop cached slots.
pub struct Counters {
    slots: BpfHashMap<MapData, CounterKey, u32>,
    values: Array<MapData, CounterSlot>,
    durations: Array<MapData, DurationHist>,
    free: Stack<MapData, u32>,
    next_fresh: Array<MapData, u64>,
    handle_gen: Array<MapData, u64>,
}

impl Counters {
    /// Takes the maps out of the loaded object (see [`Counters::reset_unassigned`]).
    pub fn take_from(ebpf: &mut Ebpf) -> Result<Counters, AttachError> {
        Ok(Counters {
            slots: map(ebpf, names::maps::COUNTER_SLOTS)?,
            values: map(ebpf, names::maps::COUNTER_VALUES)?,
            durations: map(ebpf, names::maps::COUNTER_DURATIONS)?,
            free: map(ebpf, names::maps::FREE_SLOTS)?,
            next_fresh: map(ebpf, names::maps::NEXT_FRESH_SLOT)?,
            handle_gen: map(ebpf, names::maps::HANDLE_GEN)?,
        })
    }

    /// With no key assigned, every slot is free: handed out from the first on (pinned maps
    /// kept empty by a daemon before are reset so; kept with keys, left as they are).
    /// Needed before the programs run.
    pub fn reset_unassigned(&mut self) -> Result<(), AttachError> {
        if self.slots.keys().next().is_some() {
            return Ok(());
        }
        while self.free.pop(0).is_ok() {}
        self.next_fresh
            .set(0, 0, 0)
            .map_err(map_err(names::maps::NEXT_FRESH_SLOT))?;
        debug!("{MAX_COUNTERS} counter slots free");
        Ok(())
    }

    /// Every counter, with its duration histogram. The histogram is read after the values:
    /// calls returning in between are in it and not yet in the calls.
    pub fn read(&self) -> Vec<crate::stats::Counter> {
        self.slots
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(k, slot)| {
                let value = self.values.get(&slot, 0).ok()?.val;
                let durations = self.durations.get(&slot, 0).ok()?;
                Some((k, value, durations))
            })
            .collect()
    }

    /// Every counter's calls (no histogram: what call rates need).
    pub fn read_calls(&self) -> Vec<(CounterKey, u64)> {
        self.slots
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(k, slot)| Some((k, self.values.get(&slot, 0).ok()?.val.calls)))
            .collect()
    }

    /// The processes that have counters.
    pub fn pids(&self) -> std::collections::BTreeSet<u32> {
        self.slots
            .keys()
            .filter_map(Result::ok)
            .map(|k| k.tgid)
            .collect()
    }

    /// Removes the counters of `pid`, zeroes their slots and frees them. Threads drop their
    /// cached slots first (the generation moves), so none is updated after its reuse.
    pub fn forget(&mut self, pid: u32) {
        let gone: Vec<(CounterKey, u32)> = self
            .slots
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| k.tgid == pid)
            .collect();
        if gone.is_empty() {
            return;
        }
        for (k, _) in &gone {
            let _ = self.slots.remove(k);
        }
        self.bump_generation();
        for (_, slot) in gone {
            if self.values.set(slot, CounterSlot::default(), 0).is_ok()
                && self.durations.set(slot, DurationHist::default(), 0).is_ok()
            {
                let _ = self.free.push(slot, 0);
            }
        }
    }

    /// The handle generation now: it moves at every communicator's or datatype's free (and
    /// more).
    pub fn handle_generation(&self) -> u64 {
        self.handle_gen.get(&0, 0).unwrap_or(0)
    }

    /// Invalidates every thread's handle cache and counted-process mark. The step is far
    /// from the kernel's +1 bumps, so a bump of theirs lost to this read-modify-write still
    /// leaves a value no cache holds.
    pub fn bump_generation(&mut self) {
        let now = self.handle_gen.get(&0, 0).unwrap_or(0);
        let _ = self.handle_gen.set(0, now.wrapping_add(1 << 32), 0);
    }
}

/// Sums per-CPU values of one counter.
pub fn sum<'a>(per_cpu: impl Iterator<Item = &'a CounterVal>) -> CounterVal {
    let mut total = CounterVal::default();
    for v in per_cpu {
        total.merge(v);
    }
    total
}

/// A per-CPU counter map's values, summed over CPUs.
pub fn sum_over_cpus(
    map: &PerCpuHashMap<MapData, CounterKey, CounterVal>,
) -> Vec<(CounterKey, CounterVal)> {
    map.iter()
        .filter_map(Result::ok)
        .map(|(k, per_cpu)| (k, sum(per_cpu.iter())))
        .collect()
}

impl super::Probes {
    /// Ground-truth counters, summed over CPUs.
    pub fn read_counters(&self) -> Vec<crate::stats::Counter> {
        self.counters.read()
    }

    /// Each counter's calls, summed over CPUs.
    pub fn read_counter_calls(&self) -> Vec<(CounterKey, u64)> {
        self.counters.read_calls()
    }

    /// NCCL device-time windows per operation key, summed over CPUs.
    pub fn read_device_time(&self) -> Vec<(CounterKey, CounterVal)> {
        sum_over_cpus(&self.device_time)
    }

    /// The per-peer point-to-point counters, summed over CPUs, with those of freed
    /// communicators moved out of the kernel's map.
    pub fn read_peers(&self) -> Vec<(collector_common::PeerKey, collector_common::PeerVal)> {
        self.peers.read()
    }

    /// [`Probes::read_peers`] of process `pid` alone.
    pub fn read_peers_of(
        &self,
        pid: u32,
    ) -> Vec<(collector_common::PeerKey, collector_common::PeerVal)> {
        self.peers.read_of(pid)
    }

    /// The call-site counters, summed over CPUs.
    pub fn read_sites(&self) -> Vec<(collector_common::SiteKey, collector_common::SiteVal)> {
        self.sites
            .iter()
            .filter_map(Result::ok)
            .map(|(k, per_cpu)| {
                let mut v = collector_common::SiteVal::default();
                for c in per_cpu.iter() {
                    v.calls += c.calls;
                    v.bytes += c.bytes;
                    v.timed += c.timed;
                    v.time_ns += c.time_ns;
                }
                (k, v)
            })
            .collect()
    }

    /// Health counters of `pid`, summed (marks: the latest) over CPUs.
    pub fn read_proc_stats(&self, pid: u32) -> ProcStats {
        let mut s = ProcStats::default();
        if let Ok(per_cpu) = self.proc_stats.get(&pid, 0) {
            for v in per_cpu.iter() {
                s.add(v);
            }
        }
        s
    }
}
