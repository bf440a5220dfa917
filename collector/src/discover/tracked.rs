//! A watched process as discovery knows it: its identity (from `/proc`, else from the
//! kernel's events), when it was counted from and until, and what it opened.

use std::collections::BTreeSet;

use super::{Fabric, ProcessInfo};
use crate::clock::monotonic_ns;

/// What is known of a watched process.
#[derive(Debug, Default)]
pub struct Tracked {
    /// Identity and launcher environment, once read.
    pub info: Option<ProcessInfo>,
    /// Monotonic ns from which its calls are counted (attach, or fork for launched ones).
    pub since_ns: u64,
    /// Monotonic ns at which it exited.
    pub exit_ns: Option<u64>,
    /// Asked for by the user (reported even without MPI calls).
    pub requested: bool,
    /// Whether it maps an MPI library commtap probes.
    pub maps_mpi: bool,
    /// Why its mappings were not read when last looked at, and when (none: they were, or
    /// it ended).
    pub unread: Option<(String, std::time::Instant)>,
    /// Its mappings are to be read (its owner's share of reading time was spent when they
    /// were to be), and what is owed it then: the next rescan the share allows reads them.
    pub maps_due: Option<MapsDue>,
    /// Address-space size when its mappings were last read. Reading `/proc/PID/maps` walks
    /// the process's memory map (measured: 4% of a core for a 2-rank job every 200 ms,
    /// taken from the ranks on a busy node), so rescans wait for this to change (dlopen).
    pub seen_pages: Option<u64>,
    /// libfabric fabrics it opened.
    pub fabrics: BTreeSet<Fabric>,
    /// Which of its MPI's own transports it uses, as its MPI says (see
    /// [`crate::profile::RankProfile::mpi_transport`]).
    pub mpi_transport: Option<String>,
    /// Where its Open MPI keeps the components it selects, until they were looked at after
    /// its `MPI_Init` returned: the kernel reports them at that return only where it
    /// already knew this (a process the daemon counts from its first call is told it
    /// later).
    pub components_at: Option<collector_common::ComponentAddrs>,
    /// Its real user id as the kernel gave it with the event that made it known: a rank
    /// that exits before its `/proc` entry is read still has an owner.
    pub kernel_uid: Option<u32>,
    /// Its identity as the kernel captured it when it became known (environment,
    /// arguments, start time): what is used when `/proc` cannot be read in time.
    pub kernel_info: Option<ProcessInfo>,
    /// Its `MPI_Pcontrol` region.
    pub region: crate::stats::region::Region,
    /// The files it maps executable, as last read, where call sites are counted: what
    /// names its call sites once it has exited.
    pub objects: Vec<super::MappedObject>,
    /// Its profile while watched before it was detached, where it was attached again: the
    /// profile counted since then is added to it.
    pub earlier: Option<Box<crate::profile::RankProfile>>,
}

/// What is owed a process whose mappings were not read when they were to be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapsDue {
    /// It is paused at the library load they were to be read for: continued once read.
    pub continue_it: bool,
    /// It was being watched from then: the fabrics it opened are looked for once read.
    pub fabrics: bool,
}

impl Tracked {
    /// How it is numbered in its job, where it maps an MPI or NCCL (as
    /// [`super::ranks_below`] and [`super::is_helper`] ask).
    pub fn rank_numbering(&self) -> Option<super::Numbering<'_>> {
        self.info
            .as_ref()
            .filter(|_| self.maps_mpi)
            .map(ProcessInfo::numbering)
    }

    /// Its owner: from `/proc` once read, else from the kernel's event.
    pub fn uid(&self) -> Option<u32> {
        self.info.as_ref().and_then(|i| i.uid).or(self.kernel_uid)
    }

    /// Whether it was running before it was counted (attached to, not seen start): a call
    /// it was inside then was seen begin by no probe.
    pub fn attached_while_running(&self) -> bool {
        /// A process counted this soon after its start made no call before.
        const GRACE_NS: u64 = 100_000_000;
        let Some(start_ticks) = self.info.as_ref().map(|i| i.start_ticks) else {
            return false;
        };
        // Ticks since boot, suspended time included: never earlier than the monotonic
        // clock's reading of the same instant, so a process is never taken for attached
        // to too soon.
        let started_ns =
            start_ticks.saturating_mul(1_000_000_000 / super::clock_ticks_per_second());
        started_ns.saturating_add(GRACE_NS) < self.since_ns
    }

    /// A process counted from now on.
    pub fn from_now() -> Tracked {
        Tracked::since(monotonic_ns())
    }

    /// A process counted from `since_ns` on (monotonic): when the kernel saw it forked or
    /// exec'd, whenever userspace gets to read that.
    pub fn since(since_ns: u64) -> Tracked {
        Tracked {
            since_ns,
            ..Default::default()
        }
    }
}
