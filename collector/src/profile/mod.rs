//! A job's profile: what commtap measured, per rank and for the job, as one document that
//! every output renders (`report`), the API carries (`api::convert`) and the aggregator
//! merges. Built once, from the kernel's counters, in `build`.

pub mod build;
pub mod schema;
pub mod stacks;
pub mod timeline;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use crate::session::budget::CallCost;
use crate::{
    discover::Fabric,
    stats::{Health, Routines},
};

/// Version tag of the JSON document.
pub const SCHEMA: &str = "commtap.profile.v1";

/// One profiled process (an MPI rank).
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts of a rank, each a field of the profile's JSON"
)]
pub struct RankProfile {
    /// MPI world rank (from the launcher's environment; else the order of discovery).
    pub rank: u32,
    /// Whether `rank` came from the launcher (false: guessed from discovery order).
    pub rank_known: bool,
    /// How many ranks its job has, as its launcher said (a report may hold fewer: one
    /// node's, or those watched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Job id: the batch system's, else rank 0's pid (mpitrace's convention).
    pub job: String,
    /// Command line.
    pub cmdline: String,
    /// Real user id of the process (who may see it through the daemon).
    pub uid: Option<u32>,
    // Boxed, as `region`: a node holds thousands of ranks, most without either.
    /// The container it runs in (its pid there, its cgroup, the container id), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Box<crate::discover::container::Container>>,
    /// Process start time in clock ticks since boot: with host and pid, its identity.
    pub start_ticks: u64,
    /// The process exited and this profile is final (all its events drained).
    #[serde(default)]
    pub exited: bool,
    /// It was detached on request (and `exited` with it as far as commtap sees): this
    /// profile ends at the detach, and goes on if it is attached again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detached: bool,
    /// Time it was not watched, between a detach and the attach after it, ns: its calls
    /// then are not counted, and the time is not in `elapsed_ns`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unwatched_ns: u64,
    /// From MPI_Init's return (or attach) to MPI_Finalize's entry (or detach/exit), ns.
    pub elapsed_ns: u64,
    /// Time in MPI routines other than MPI_Init/MPI_Finalize, ns.
    pub comm_time_ns: u64,
    /// Per routine, keyed by C name.
    pub routines: Routines,
    /// Event drops and undecodable calls.
    #[serde(flatten)]
    pub health: Health,
    /// libfabric fabrics it was seen to open (`fi_fabric`), with their providers.
    #[serde(default)]
    pub fabrics: Vec<Fabric>,
    /// Which of its MPI's own transports it used, as the MPI says: Open MPI's selected
    /// point-to-point layer (`pml ob1`, `pml ucx`, `pml cm, mtl ofi`, read from the
    /// process), MPICH's device as built (`ch4:ofi`, `ch4:ucx`); absent where the MPI does
    /// not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mpi_transport: Option<String>,
    /// Point-to-point traffic per peer (sparse: peers it exchanged with).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<crate::stats::PeerTraffic>,
    /// Its ranks in the communicators other than the world that its point-to-point traffic
    /// names: what places its peers' traffic there on its world rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comm_ranks: Vec<crate::stats::CommRank>,
    /// Its `MPI_Pcontrol` region (what mpitrace profiles), where it called `MPI_Pcontrol`;
    /// `routines` above is the whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Box<RegionProfile>>,
    /// What a probed call cost on its node, by which the probes' cost here is estimated
    /// (the programs' part measured by the kernel); absent from older profiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_call_cost: Option<CallCost>,
    /// What it used of its node (CPU time, largest resident set, context switches: what
    /// mpitrace reads with `getrusage` at `MPI_Finalize`); absent where not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Its environment's settings of the communication libraries (`NCCL_*`, `FI_*`,
    /// `UCX_*`, `OMPI_MCA_*`, `I_MPI_*`, `MPIR_CVAR_*`, `MV2_*`, `HOROVOD_*`, `OMP_*`,
    /// `TORCH_NCCL_*`), as it started: at most 128, values cut at 256 characters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
    /// Where its calls were made from, per routine and call site, most time first
    /// (`record --call-sites`); absent where call sites were not counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub call_sites: Vec<CallSite>,
    /// Call sites left out of `call_sites` (those with the least time, past
    /// [`MAX_CALL_SITES`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub call_sites_left_out: u64,
    /// How it ended, where the kernel saw its last thread end while it was watched (absent
    /// while it runs, and from older profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Ending>,
    /// The MPI or NCCL call it was inside when this profile was made, where it still ran
    /// (one of its threads', the one entered first; a call whose time was sampled away is
    /// not seen): in a hung job, which call each rank waits in and for how long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_call: Option<InCall>,
    /// Where `in_call` is absent: whether that is not known. A rank attached to while
    /// running has the call it was inside then found on its threads' stacks; where one
    /// could not be read whole, such a call may have gone unseen.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_call_unknown: bool,
}

/// How a process ended: its exit status or the signal that killed it, when, and the MPI
/// or NCCL call it was inside (a rank that hung there and was killed, or called
/// `MPI_Abort`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Ending {
    /// Its exit status (`exit(N)`, a return from `main`), where it exited; absent where a
    /// signal ended it or the kernel's exit code could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u8>,
    /// The signal that ended it (9: SIGKILL), where one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<u8>,
    /// The signal left a core dump.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub core_dumped: bool,
    /// When it ended, Unix ns by its node's clock (how the ranks of a job that fell one
    /// after the other are ordered); absent where not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_unix_ns: Option<u64>,
    /// The MPI or NCCL call one of its threads was inside as it ended (the longest in it
    /// where several were); absent where none was (or that call's time was sampled away:
    /// an untimed call's start is not kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inside: Option<InCall>,
}

/// An MPI or NCCL call a process was inside, and for how long.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct InCall {
    /// Its routine.
    pub routine: String,
    /// How long the process had been inside it, ns.
    pub for_ns: u64,
    /// The thread inside it (its id; 0 where not known).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub thread: u32,
    /// It was entered before commtap attached (no probe saw it begin: it was found on the
    /// thread's stack), and `for_ns` is the time since the attach: the least it has been.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_attach: bool,
    /// Where it was called from, as reports name a call site (`main+0x65 at app.c:38
    /// (app)`), where the thread's stack was read (a call of a second or more, or one
    /// entered before the attach): in a program of many such calls, which one hangs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub called_from: Option<String>,
}

impl InCall {
    /// The call of routine `routine` (an index into `ROUTINES`) that thread `thread` has
    /// been inside for `for_ns`; `None` for an index out of the table.
    pub fn of(routine: usize, for_ns: u64, thread: u32) -> Option<InCall> {
        collector_common::routines::ROUTINES
            .get(routine)
            .map(|r| InCall {
                routine: r.name.to_string(),
                for_ns,
                thread,
                before_attach: false,
                called_from: None,
            })
    }

    /// `MPI_Barrier (12.0 s in it)`; `MPI_Barrier (12.0 s in it or more: entered before
    /// commtap attached)`; either followed by `, called from SITE` where that is known.
    pub fn describe(&self) -> String {
        let time = crate::skew::summary::human_ns(self.for_ns);
        let call = if self.before_attach {
            format!(
                "{} ({time} in it or more: entered before commtap attached)",
                self.routine
            )
        } else {
            format!("{} ({time} in it)", self.routine)
        };
        match &self.called_from {
            Some(site) => format!("{call}, called from {site}"),
            None => call,
        }
    }
}

impl Ending {
    /// How the kernel saw the process end ([`ProcStats`]'s exit fields), once its last
    /// thread has; its time put on the wall clock through `clock` (one reading for every
    /// rank of a profile: their order is the kernel's).
    ///
    /// [`ProcStats`]: collector_common::ProcStats
    pub fn of(ps: &collector_common::ProcStats, clock: &crate::clock::UnixClock) -> Option<Ending> {
        if ps.exit_group == 0 {
            return None;
        }
        let known = ps.exit_status & collector_common::ProcStats::EXIT_STATUS_KNOWN != 0;
        let code = ps.exit_status as u32;
        let signal = (known && code & 0x7f != 0).then_some((code & 0x7f) as u8);
        let inside = usize::try_from(ps.exit_in_routine)
            .ok()
            .and_then(|r| r.checked_sub(1))
            .and_then(|r| InCall::of(r, ps.exit_in_ns, ps.exit_in_tid as u32));
        Some(Ending {
            status: (known && signal.is_none()).then_some((code >> 8) as u8),
            signal,
            core_dumped: signal.is_some() && code & 0x80 != 0,
            at_unix_ns: (ps.exit_ns != 0).then(|| clock.unix_ns(ps.exit_ns)),
            inside,
        })
    }

    /// Whether it ended as a finished program does: status 0, outside any MPI call.
    pub fn normal(&self) -> bool {
        self.status == Some(0) && self.inside.is_none()
    }

    /// `exited with status 1`, `killed by SIGKILL (core dumped)`, `ended`, then ` inside
    /// MPI_Barrier (12.0 s in it)` where it was in a call.
    pub fn describe(&self) -> String {
        let how = self.how();
        match &self.inside {
            Some(call) => format!("{how} inside {}", call.describe()),
            None => how,
        }
    }

    /// `exited with status 1`, `killed by SIGKILL (core dumped)`, or `ended`.
    pub fn how(&self) -> String {
        match (self.signal, self.status) {
            (Some(sig), _) => format!(
                "killed by {}{}",
                signal_name(sig),
                if self.core_dumped {
                    " (core dumped)"
                } else {
                    ""
                }
            ),
            (None, Some(status)) => format!("exited with status {status}"),
            (None, None) => "ended".to_string(),
        }
    }
}

/// `SIGKILL` for 9: a Linux signal's name, else `signal N` (a real-time signal).
pub fn signal_name(sig: u8) -> String {
    const NAMES: [&str; 31] = [
        "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2",
        "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG",
        "XCPU", "XFSZ", "VTALRM", "PROF", "WINCH", "IO", "PWR", "SYS",
    ];
    match NAMES.get(usize::from(sig).wrapping_sub(1)) {
        Some(name) => format!("SIG{name}"),
        None => format!("signal {sig}"),
    }
}

/// Most call sites a rank's profile holds (those with the most time; a message from a
/// node is cut to as many): with their names and paths cut too, a rank's sites stay
/// within a few hundred KiB however many its program has.
pub const MAX_CALL_SITES: usize = 512;

/// Where a rank's calls of one routine were made from: the address they returned to, and
/// what it is in the process (mpitrace's profile by call site).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CallSite {
    /// The routine called.
    pub routine: String,
    /// The address the calls returned to in the process, hex (the instruction after each
    /// call).
    pub address: String,
    /// The file mapped there (the executable or a library), as the process named it;
    /// absent where its mappings were not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The function of that file holding the address, by the file's symbols; absent where
    /// none does (a stripped file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// The address's distance from the function's start (0 where no function is named).
    pub offset: u64,
    /// The address as the file's own, hex: what `addr2line -e FILE` takes (less one, for
    /// the line of the call itself); absent where the file could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_address: Option<String>,
    /// The calls, their bytes and time (estimated from the timed calls where the
    /// routine's time was sampled).
    #[serde(flatten)]
    pub totals: crate::stats::Totals,
    /// The calls whose time was measured.
    pub timed_calls: u64,
    /// The source file of the call, as the file's line tables name it (a file built with
    /// `-g`); absent where it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_file: Option<String>,
    /// The call's line in that file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_line: Option<u32>,
}

/// Every rank's calls of one routine at one call site (as [`CallSite::label`] names it: the
/// same in every rank of one program, wherever it was loaded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobSite {
    /// The routine called.
    pub routine: String,
    /// Where from ([`CallSite::label`]).
    pub site: String,
    /// The calls, their bytes and time.
    pub totals: crate::stats::Totals,
    /// The calls whose time was not measured (sampled away).
    pub untimed: u64,
    /// The ranks that called from there.
    pub ranks: usize,
}

impl CallSite {
    /// The site of `routine` at `address` in its process, as `named` names it.
    pub fn named(routine: String, address: u64, named: crate::symbols::sites::Named) -> CallSite {
        CallSite {
            routine,
            address: format!("{address:#x}"),
            object: named.object,
            function: named.function,
            offset: named.offset,
            file_address: named.file_address.map(|a| format!("{a:#x}")),
            source_file: named.source.as_ref().map(|(f, _)| f.clone()),
            source_line: named.source.map(|(_, l)| l),
            ..CallSite::default()
        }
    }

    /// `function+0xOFF` (or the address in the file), `at FILE.c:LINE` where known, `(object's file name)`, as reports
    /// show a site.
    pub fn label(&self) -> String {
        let mut at = match (&self.function, &self.file_address) {
            (Some(f), _) => format!("{f}+{:#x}", self.offset),
            (None, Some(a)) => a.clone(),
            (None, None) => self.address.clone(),
        };
        if let (Some(file), Some(line)) = (&self.source_file, self.source_line) {
            let name = std::path::Path::new(file)
                .file_name()
                .map_or_else(|| file.clone(), |n| n.to_string_lossy().into_owned());
            at = format!("{at} at {name}:{line}");
        }
        self.in_object(at)
    }

    /// `function (file name)`: the site by its function alone, as two builds of a program
    /// share it (`commtap diff`: an offset moves with any change to the code), in its
    /// source file where `by_source` and its lines are known (two builds' executables are
    /// often named apart, `app.O0` and `app.O2`), else in its object; the
    /// [`label`](Self::label) where no function is named.
    pub fn function_label(&self, by_source: bool) -> String {
        match (&self.function, &self.source_file) {
            (Some(f), Some(source)) if by_source => {
                let p = std::path::Path::new(source);
                let name = p.file_name().unwrap_or(p.as_os_str()).to_string_lossy();
                format!("{f} ({name})")
            }
            (Some(f), _) => self.in_object(f.clone()),
            (None, _) => self.label(),
        }
    }

    /// `at (object's file name)`, or `at` where the object is not known.
    fn in_object(&self, at: String) -> String {
        match self.object.as_deref().map(std::path::Path::new) {
            Some(p) => format!(
                "{at} ({})",
                p.file_name().unwrap_or(p.as_os_str()).to_string_lossy()
            ),
            None => at,
        }
    }
}

/// What a process used of its node, over its whole life.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Usage {
    /// CPU time in user mode, every thread's, ns.
    pub user_ns: u64,
    /// CPU time in the kernel, every thread's, ns.
    pub system_ns: u64,
    /// Its largest resident set, bytes.
    pub max_rss_bytes: u64,
    /// Its threads' context switches, voluntary and involuntary (read while it ran: its
    /// live threads' from `/proc` and its ended threads' summed by the kernel; absent past
    /// 4,096 live threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_switches: Option<u64>,
    /// Taken as it ended (each thread's as it ended, added up by the kernel: those that
    /// ended before commtap watched it are not in it), else read from `/proc` while it
    /// ran, when the profile was made.
    pub at_exit: bool,
}

impl Usage {
    /// Each figure the larger of the two readings of one process.
    pub fn max_with(&self, o: &Usage) -> Usage {
        Usage {
            user_ns: self.user_ns.max(o.user_ns),
            system_ns: self.system_ns.max(o.system_ns),
            max_rss_bytes: self.max_rss_bytes.max(o.max_rss_bytes),
            context_switches: self.context_switches.max(o.context_switches),
            at_exit: self.at_exit,
        }
    }

    /// Its usage as the kernel added it up at its threads' ends ([`ProcStats`]), once its
    /// last thread has ended: the CPU time split between user and system as the kernel's
    /// ticks sampled it, as `getrusage` splits it.
    ///
    /// [`ProcStats`]: collector_common::ProcStats
    pub fn at_exit(ps: &collector_common::ProcStats, page_bytes: u64) -> Option<Usage> {
        if ps.exit_group == 0 {
            return None;
        }
        let ticked = ps.exit_utime_ns.saturating_add(ps.exit_stime_ns);
        let user_ns = if ticked == 0 {
            ps.exit_cpu_ns
        } else {
            (u128::from(ps.exit_cpu_ns) * u128::from(ps.exit_utime_ns) / u128::from(ticked)) as u64
        };
        Some(Usage {
            user_ns,
            system_ns: ps.exit_cpu_ns - user_ns,
            max_rss_bytes: ps.exit_max_rss_pages.saturating_mul(page_bytes),
            context_switches: Some(ps.exit_nvcsw.saturating_add(ps.exit_nivcsw)),
            at_exit: true,
        })
    }
}

/// A rank's `MPI_Pcontrol` region: `MPI_Pcontrol(1)` starts it (the first one anew),
/// `MPI_Pcontrol(0)` pauses it; without a `1`, it runs from the rank's start to the first `0`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RegionProfile {
    /// Its intervals, the one under way included.
    pub intervals: u32,
    /// Time inside it, ns.
    pub elapsed_ns: u64,
    /// Time in MPI routines inside it (MPI_Init and MPI_Finalize aside), ns.
    pub comm_time_ns: u64,
    /// Bounds read late (the process could not be paused at that `MPI_Pcontrol`: traced,
    /// or a job of an interactive shell): calls close to them may fall on the wrong side.
    #[serde(default)]
    pub late_bounds: u32,
    /// Per routine, inside it (`MPI_Pcontrol`'s own calls left out).
    pub routines: Routines,
    /// Point-to-point traffic per peer, inside it (as the rank's `peers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<crate::stats::PeerTraffic>,
}

impl RankProfile {
    /// What the probes cost this process by the budget's estimate (`session::budget`): an
    /// entry per call and a return per timed call.
    pub fn estimated_probe_ns(&self) -> u64 {
        let cost = self.call_cost();
        self.routines
            .values()
            .fold(0, |all, r| all.saturating_add(routine_probe_ns(r, cost)))
    }

    /// [`RankProfile::estimated_probe_ns`] per routine, the costliest first.
    pub fn estimated_probe_ns_by_routine(&self) -> Vec<(&str, u64)> {
        probe_ns_by_routine(&self.routines, self.call_cost())
    }

    /// What a probed call cost it: as its node measured, else as assumed.
    pub fn call_cost(&self) -> CallCost {
        self.probe_call_cost.unwrap_or(CallCost::ASSUMED)
    }

    /// Adds `earlier`, the profile of the same process while it was watched before a
    /// detach, to this one (counted since it was attached again): one profile of all the
    /// time it was watched. Identity and state stay this one's.
    pub fn add_earlier(&mut self, earlier: &RankProfile) {
        self.elapsed_ns = self.elapsed_ns.saturating_add(earlier.elapsed_ns);
        self.unwatched_ns = self.unwatched_ns.saturating_add(earlier.unwatched_ns);
        add_routines(&mut self.routines, &earlier.routines);
        self.comm_time_ns = crate::stats::communication_ns(&self.routines);
        // The events received are counted per process for its whole life, not per span.
        let events = self.health.events;
        self.health.merge(&earlier.health);
        self.health.events = events;
        for f in &earlier.fabrics {
            if !self.fabrics.contains(f) {
                self.fabrics.push(f.clone());
            }
        }
        if self.mpi_transport.is_none() {
            self.mpi_transport.clone_from(&earlier.mpi_transport);
        }
        // Over the process's whole life either way; at its exit the threads that ended
        // before it was attached again are not in the kernel's sums: the larger reading.
        self.usage = match (self.usage, earlier.usage) {
            (Some(now), Some(before)) => Some(now.max_with(&before)),
            (now, before) => now.or(before),
        };
        self.peers.extend(earlier.peers.iter().cloned());
        crate::stats::PeerTraffic::tidy(&mut self.peers);
        self.comm_ranks.extend(earlier.comm_ranks.iter().cloned());
        self.comm_ranks.sort();
        self.comm_ranks.dedup();
        self.region = match (self.region.take(), earlier.region.as_deref()) {
            (Some(mut now), Some(before)) => {
                now.intervals += before.intervals;
                now.elapsed_ns = now.elapsed_ns.saturating_add(before.elapsed_ns);
                now.late_bounds += before.late_bounds;
                add_routines(&mut now.routines, &before.routines);
                now.comm_time_ns = crate::stats::communication_ns(&now.routines);
                now.peers.extend(before.peers.iter().cloned());
                crate::stats::PeerTraffic::tidy(&mut now.peers);
                Some(now)
            }
            (now, before) => now.or_else(|| before.cloned().map(Box::new)),
        };
    }
}

// serde hands a field by reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// Adds each routine of `from` into `into`.
fn add_routines(into: &mut Routines, from: &Routines) {
    for (name, r) in from {
        into.entry(name.clone()).or_default().merge(r);
    }
}

/// The probes' estimated cost of each routine of `routines` at `cost` a call, the
/// costliest first.
pub fn probe_ns_by_routine(routines: &Routines, cost: CallCost) -> Vec<(&str, u64)> {
    let mut by: Vec<(&str, u64)> = routines
        .iter()
        .map(|(name, r)| (name.as_str(), routine_probe_ns(r, cost)))
        .collect();
    by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    by
}

/// The probes' estimated cost of one routine's calls: an entry each, a return each timed
/// (saturating: a cost from the wire is anybody's number).
fn routine_probe_ns(r: &crate::stats::RoutineStats, cost: CallCost) -> u64 {
    let timed = r.sampled_time.map_or(r.totals.calls, |s| s.timed_calls);
    r.totals
        .calls
        .saturating_mul(cost.entry_ns)
        .saturating_add(timed.saturating_mul(cost.return_ns))
}

/// A library commtap probed, summarised for the report.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProbedLibrary {
    /// Path as seen from commtap.
    pub path: String,
    /// Implementation family and version line.
    pub flavor: String,
    /// Distinct routine addresses probed (Fortran bindings: the routines their probed
    /// functions bind).
    pub probes: usize,
    /// Probes moved one instruction past a first instruction the kernel would single-step.
    pub moved_past_single_step: Vec<String>,
    /// Probes on a first instruction the kernel single-steps (about ten times dearer).
    pub single_stepped: Vec<String>,
    /// Probe points that could not be attached, with the reason.
    pub failed: Vec<String>,
    /// Its routines are probed through uprobe sessions (Linux 6.13+: a process commtap
    /// does not watch pays the entry probe only), not an entry and a return probe each.
    #[serde(default)]
    pub uprobe_sessions: bool,
}

/// The whole profile of a job on this node.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobProfile {
    /// [`SCHEMA`].
    pub schema: String,
    /// Job id (see [`RankProfile::job`]).
    pub job: String,
    /// Ranks, by rank.
    pub ranks: Vec<RankProfile>,
    /// Events lost to a full ring buffer, all ranks (counts and bytes stay exact).
    pub dropped: u64,
    /// Calls whose bytes could not be decoded, all ranks.
    pub undecoded: u64,
    /// Libraries probed.
    pub libraries: Vec<ProbedLibrary>,
    /// Libraries seen but not decoded (an unknown MPI ABI, NCCL without symbols), with the reason.
    pub unsupported_libraries: Vec<String>,
    /// Processes that were asked for but could not be profiled, with the reason.
    pub not_profiled: Vec<String>,
    /// Whether per-call events were on (`events`/`dropped` per rank mean something only then).
    #[serde(default)]
    pub call_events: bool,
    /// Who is late: collective instances matched across ranks (absent when not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew: Option<crate::skew::SkewReport>,
    /// MPI time per rank over the run, in time bins (`record` with per-call events only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<timeline::Timeline>,
}

/// A call in progress this long is a long one: the report's section of calls in progress,
/// `top`'s column and the Prometheus gauge show those alone (a job at work is always inside
/// short ones).
pub const LONG_CALL_NS: u64 = 1_000_000_000;

impl RankProfile {
    /// The call it has been inside for [`LONG_CALL_NS`] or more, where it is inside one.
    pub fn long_call(&self) -> Option<&InCall> {
        self.in_call.as_ref().filter(|c| c.for_ns >= LONG_CALL_NS)
    }
}

impl JobProfile {
    /// The ranks that ended otherwise than a finished program does ([`Ending::normal`]),
    /// in the order they ended (those whose time is not known last, ties by rank): the
    /// first is the likeliest cause of the others' ends.
    pub fn abnormal_endings(&self) -> Vec<(&RankProfile, &Ending)> {
        let mut ended: Vec<(&RankProfile, &Ending)> = self
            .ranks
            .iter()
            .filter_map(|r| Some((r, r.ended.as_ref()?)))
            .filter(|(_, e)| !e.normal())
            .collect();
        ended.sort_by_key(|(r, e)| (e.at_unix_ns.is_none(), e.at_unix_ns, r.rank));
        ended
    }

    /// Whether it holds a job's every rank (as many as their launcher said) and each has
    /// exited (not detached: it may be attached again): its profile will not change any
    /// more.
    pub fn every_rank_final(&self) -> bool {
        let ranks: std::collections::BTreeSet<u32> = self
            .ranks
            .iter()
            .filter(|r| r.rank_known)
            .map(|r| r.rank)
            .collect();
        // Without the launcher's word, a rank not seen yet (another node's, one not in
        // MPI_Init yet) cannot be told from none.
        let size = self.ranks.iter().filter_map(|r| r.world_size).max();
        size.is_some_and(|n| n > 0 && ranks.len() >= n as usize)
            && self.ranks.iter().all(|r| r.exited && !r.detached)
    }

    /// Places the traffic its ranks had with peers named by their rank in another
    /// communicator on those peers' world ranks, where a rank of this profile says it is
    /// that rank there (its `comm_ranks`), in the whole run and in their regions. What no
    /// rank claims, or two claim, stays as it is: a later merge (the aggregator's, of the
    /// nodes) may place it. Placing twice changes nothing.
    pub fn place_peers_on_world_ranks(&mut self) {
        use std::collections::HashMap;
        // (job, communicator, rank there) -> world rank; None where two ranks claim it.
        // Names are alike in every job that made its communicators alike: keyed by job too.
        let mut at: HashMap<(String, String, u32), Option<u32>> = HashMap::new();
        for r in self.ranks.iter().filter(|r| r.rank_known) {
            for c in &r.comm_ranks {
                at.entry((r.job.clone(), c.comm.clone(), c.rank))
                    .and_modify(|w| {
                        if *w != Some(r.rank) {
                            *w = None;
                        }
                    })
                    .or_insert(Some(r.rank));
            }
        }
        for r in &mut self.ranks {
            let job = r.job.as_str();
            place_peers(&mut r.peers, job, &at);
            if let Some(g) = r.region.as_mut() {
                place_peers(&mut g.peers, job, &at);
            }
        }
    }
}

/// Places `peers` (of a rank of `job`) named by a rank in another communicator on the
/// world rank `at` says is that rank there.
fn place_peers(
    peers: &mut Vec<crate::stats::PeerTraffic>,
    job: &str,
    at: &std::collections::HashMap<(String, String, u32), Option<u32>>,
) {
    let mut moved = false;
    for p in peers.iter_mut() {
        let (Some(comm), Some(peer)) = (p.comm.as_deref(), p.peer) else {
            continue;
        };
        if let Some(Some(world)) = at.get(&(job.to_string(), comm.to_string(), peer)) {
            p.peer = Some(*world);
            p.comm = None;
            moved = true;
        }
    }
    if moved {
        crate::stats::PeerTraffic::tidy(peers);
    }
}

/// The ranks' communication times, for the cross-rank summary.
pub struct CommSummary<'a> {
    /// (rank, time) of the minimum.
    pub min: &'a RankProfile,
    /// The median rank (lower median for even counts, as mpitrace).
    pub median: &'a RankProfile,
    /// The maximum.
    pub max: &'a RankProfile,
}

/// What a job's profile takes from all its ranks: computed here, and only here, for
/// `record`, the daemon's (paged) snapshots and the aggregator alike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobTotals {
    /// The job id when the ranks are of one job; empty for several (each rank says its own).
    pub job: String,
    /// Events lost to a full ring buffer, all ranks.
    pub dropped: u64,
    /// Calls whose bytes could not be decoded, all ranks.
    pub undecoded: u64,
}

impl JobTotals {
    /// The totals of `ranks`.
    pub fn of<'a>(ranks: impl IntoIterator<Item = &'a RankProfile>) -> JobTotals {
        let mut jobs = std::collections::BTreeSet::new();
        let mut totals = JobTotals::default();
        for r in ranks {
            jobs.insert(r.job.as_str());
            totals.dropped += r.health.dropped;
            totals.undecoded += r.health.undecoded;
        }
        if let [only] = jobs.into_iter().collect::<Vec<_>>()[..] {
            totals.job = only.to_string();
        }
        totals
    }
}

impl JobProfile {
    /// The profile as mpitrace shows it: each rank that called `MPI_Pcontrol` by its region
    /// alone (its routines, elapsed and communication time, per-peer traffic); None when
    /// none did.
    pub fn profiled_region(&self) -> Option<JobProfile> {
        if self.ranks.iter().all(|r| r.region.is_none()) {
            return None;
        }
        let mut view = self.clone();
        for r in &mut view.ranks {
            if let Some(g) = &r.region {
                r.routines.clone_from(&g.routines);
                r.elapsed_ns = g.elapsed_ns;
                r.comm_time_ns = g.comm_time_ns;
                r.peers.clone_from(&g.peers);
            }
        }
        Some(view)
    }

    /// Every rank's call sites together by routine and site, most time first (then most
    /// calls).
    pub fn sites_of_all_ranks(&self) -> Vec<JobSite> {
        type Sums = (crate::stats::Totals, u64, BTreeSet<usize>);
        let mut by: BTreeMap<(String, String), Sums> = BTreeMap::new();
        for (i, r) in self.ranks.iter().enumerate() {
            for c in &r.call_sites {
                let (totals, untimed, ranks) =
                    by.entry((c.routine.clone(), c.label())).or_default();
                totals.merge(&c.totals);
                *untimed += c.totals.calls.saturating_sub(c.timed_calls);
                ranks.insert(i);
            }
        }
        let mut rows: Vec<JobSite> = by
            .into_iter()
            .map(|((routine, site), (totals, untimed, ranks))| JobSite {
                routine,
                site,
                totals,
                untimed,
                ranks: ranks.len(),
            })
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse((r.totals.time_ns, r.totals.calls)));
        rows
    }

    /// Sets the job id and the sums from `totals` (see [`JobTotals`]).
    pub fn set_totals(&mut self, totals: JobTotals) {
        self.job = totals.job;
        self.dropped = totals.dropped;
        self.undecoded = totals.undecoded;
    }

    /// A profile of just these ranks (no library or process notes).
    pub fn of_ranks(ranks: Vec<RankProfile>) -> JobProfile {
        let JobTotals {
            job,
            dropped,
            undecoded,
        } = JobTotals::of(&ranks);
        let mut profile = JobProfile {
            schema: SCHEMA.to_string(),
            job,
            dropped,
            undecoded,
            ranks,
            libraries: Vec::new(),
            unsupported_libraries: Vec::new(),
            not_profiled: Vec::new(),
            call_events: false,
            skew: None,
            timeline: None,
        };
        profile.place_peers_on_world_ranks();
        profile
    }

    /// Minimum / median / maximum communication time over ranks (None with no ranks, or
    /// where none called an MPI routine that communicates: an NCCL job's time is on the
    /// GPU, and a table of zeros would say its ranks never communicated).
    pub fn comm_summary(&self) -> Option<CommSummary<'_>> {
        let mut by_time: Vec<&RankProfile> = self.ranks.iter().collect();
        if !self.communicates_by_mpi() {
            return None;
        }
        by_time.sort_by_key(|r| (r.comm_time_ns, r.rank));
        Some(CommSummary {
            min: by_time[0],
            median: by_time[(by_time.len() - 1) / 2],
            max: by_time[by_time.len() - 1],
        })
    }
}

impl JobProfile {
    /// Whether any rank called an MPI routine that communicates (MPI_Init and
    /// MPI_Finalize aside: an NCCL job started by `mpirun` calls those alone).
    pub fn communicates_by_mpi(&self) -> bool {
        self.ranks.iter().any(|r| {
            r.routines
                .iter()
                .any(|(name, s)| s.totals.calls > 0 && crate::stats::is_communication(name))
        })
    }

    /// The communication libraries' settings every rank had alike (name and value, by
    /// name), and the names of those set differently or not on every rank.
    pub fn settings_alike_and_not(&self) -> (Vec<(&str, &str)>, Vec<&str>) {
        let Some(first) = self.ranks.first() else {
            return (Vec::new(), Vec::new());
        };
        let alike =
            |k: &String, v: &String| self.ranks.iter().all(|r| r.settings.get(k) == Some(v));
        let names: std::collections::BTreeSet<&String> =
            self.ranks.iter().flat_map(|r| r.settings.keys()).collect();
        let differing = names
            .into_iter()
            .filter(|k| first.settings.get(*k).is_none_or(|v| !alike(k, v)))
            .map(String::as_str)
            .collect();
        let common = first
            .settings
            .iter()
            .filter(|(k, v)| alike(k, v))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        (common, differing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{CommRank, PeerTraffic};

    fn rank(job: &str, world: u32, comm_rank: u32, sends_to: u32) -> RankProfile {
        RankProfile {
            rank: world,
            rank_known: true,
            pid: 100 + world,
            host: format!("node{}", world % 2),
            job: job.into(),
            cmdline: String::new(),
            uid: None,
            container: None,
            region: None,
            probe_call_cost: None,
            usage: None,
            settings: Default::default(),
            call_sites: Vec::new(),
            call_sites_left_out: 0,
            ended: None,
            in_call: None,
            in_call_unknown: false,
            start_ticks: 0,
            exited: false,
            detached: false,
            unwatched_ns: 0,
            world_size: None,
            elapsed_ns: 0,
            comm_time_ns: 0,
            routines: Default::default(),
            health: Default::default(),
            fabrics: Vec::new(),
            mpi_transport: None,
            peers: vec![
                PeerTraffic {
                    peer: Some(sends_to),
                    comm: Some("split".into()),
                    sent_calls: 1,
                    sent_bytes: 8,
                    ..Default::default()
                },
                PeerTraffic {
                    peer: Some(sends_to),
                    comm: Some("claimed twice".into()),
                    sent_calls: 1,
                    ..Default::default()
                },
            ],
            comm_ranks: vec![
                CommRank {
                    comm: "claimed twice".into(),
                    rank: 0,
                },
                CommRank {
                    comm: "split".into(),
                    rank: comm_rank,
                },
            ],
        }
    }

    /// World ranks 0 and 1 are ranks 1 and 0 of a split, and each sends to the other there:
    /// a node seeing one of them cannot place its traffic; the merge of both can, once, and
    /// only within one job. A rank two members claim is placed on neither.
    #[test]
    fn traffic_on_a_split_goes_to_world_ranks_once_both_ends_are_in() {
        let alone = JobProfile::of_ranks(vec![rank("j", 0, 1, 0)]);
        assert!(
            alone.ranks[0]
                .peers
                .iter()
                .any(|p| p.comm.as_deref() == Some("split") && p.sent_bytes == 8),
            "{:?}",
            alone.ranks[0].peers
        );
        let mut both = JobProfile::of_ranks(vec![
            rank("j", 0, 1, 0),
            rank("j", 1, 0, 1),
            rank("other", 5, 0, 1),
        ]);
        both.place_peers_on_world_ranks();
        let world = |r: &RankProfile| -> Vec<(Option<u32>, u64)> {
            r.peers
                .iter()
                .filter(|p| p.comm.is_none())
                .map(|p| (p.world_peer(), p.sent_bytes))
                .collect()
        };
        assert_eq!(world(&both.ranks[0]), vec![(Some(1), 8)]);
        assert_eq!(world(&both.ranks[1]), vec![(Some(0), 8)]);
        assert!(world(&both.ranks[2]).is_empty(), "another job's split");
        for r in &both.ranks {
            assert!(
                r.peers
                    .iter()
                    .any(|p| p.comm.as_deref() == Some("claimed twice")),
                "{r:?}"
            );
        }
    }

    /// A job's profile is final once it holds as many ranks as their launcher said, each
    /// exited.
    #[test]
    fn a_job_is_final_once_its_every_rank_exited() {
        let job = |exited: [bool; 2], world: Option<u32>| {
            let ranks = (0..2)
                .map(|i| RankProfile {
                    exited: exited[i],
                    world_size: world,
                    ..rank("j", i as u32, 0, 0)
                })
                .collect();
            JobProfile::of_ranks(ranks)
        };
        assert!(job([true, true], Some(2)).every_rank_final());
        assert!(
            !job([true, true], None).every_rank_final(),
            "more may come, as far as anyone knows"
        );
        assert!(!job([true, false], Some(2)).every_rank_final());
        assert!(
            !job([true, true], Some(4)).every_rank_final(),
            "two ranks of four"
        );
        assert!(!JobProfile::of_ranks(Vec::new()).every_rank_final());
        let mut detached = job([true, true], Some(2));
        detached.ranks[1].detached = true;
        assert!(!detached.every_rank_final(), "a detached rank runs on");
    }

    /// A process watched, detached and attached again has one profile: the calls, time,
    /// health and peers of both watched spans added, its identity the one of now.
    #[test]
    fn a_profile_goes_on_from_its_part_before_a_detach() {
        let part = |calls: u64, elapsed_ns: u64, exited: bool| {
            let mut r = rank("j", 0, 1, 1);
            r.elapsed_ns = elapsed_ns;
            r.exited = exited;
            r.detached = exited;
            r.health.dropped = calls;
            r.health.events = if exited { 9 } else { 0 };
            for name in ["MPI_Send", "MPI_Allreduce"] {
                let s = crate::stats::RoutineStats {
                    totals: crate::stats::Totals {
                        calls,
                        bytes: 8 * calls,
                        time_ns: 100 * calls,
                    },
                    ..Default::default()
                };
                r.routines.insert(name.into(), s);
            }
            r.comm_time_ns = crate::stats::communication_ns(&r.routines);
            r
        };
        let mut now = part(2, 1_000, false);
        now.routines.remove("MPI_Allreduce");
        now.comm_time_ns = crate::stats::communication_ns(&now.routines);
        let mut earlier = part(3, 5_000, true);
        earlier.unwatched_ns = 700;
        now.add_earlier(&earlier);
        assert_eq!(now.unwatched_ns, 700);
        let calls: Vec<(&str, u64, u64)> = now
            .routines
            .iter()
            .map(|(n, s)| (n.as_str(), s.totals.calls, s.totals.bytes))
            .collect();
        assert_eq!(
            calls,
            vec![("MPI_Allreduce", 3, 24), ("MPI_Send", 5, 40)],
            "each routine's calls of both spans"
        );
        assert_eq!((now.elapsed_ns, now.comm_time_ns), (6_000, 800));
        assert_eq!(now.health.dropped, 5);
        assert_eq!(now.health.events, 0, "the process's own count, not added");
        assert!(!now.exited && !now.detached, "the state is the one of now");
        // Each span's traffic with the same peer on the same communicator is one entry.
        let split: Vec<u64> = now
            .peers
            .iter()
            .filter(|p| p.comm.as_deref() == Some("split"))
            .map(|p| p.sent_bytes)
            .collect();
        assert_eq!(split, vec![16]);
        assert_eq!(now.comm_ranks.len(), 2, "{:?}", now.comm_ranks);
    }
}
