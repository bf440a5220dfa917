//! A job's profile: what commtap measured, per rank and for the job, as one document that
//! every output renders (`report`), the API carries (`api::convert`) and the aggregator
//! merges. Built once, from the kernel's counters, in `build`.

pub mod build;
pub mod schema;
pub mod timeline;

use serde::{Deserialize, Serialize};

use crate::{
    discover::Fabric,
    stats::{Health, Routines},
};

/// Version tag of the JSON document.
pub const SCHEMA: &str = "commtap.profile.v1";

/// One profiled process (an MPI rank).
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RankProfile {
    /// MPI world rank (from the launcher's environment; else the order of discovery).
    pub rank: u32,
    /// Whether `rank` came from the launcher (false: guessed from discovery order).
    pub rank_known: bool,
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
    /// Process start time in clock ticks since boot: with host and pid, its identity.
    pub start_ticks: u64,
    /// The process exited and this profile is final (all its events drained).
    #[serde(default)]
    pub exited: bool,
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
    /// Point-to-point traffic per peer (sparse: peers it exchanged with).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<crate::stats::PeerTraffic>,
}

impl RankProfile {
    /// What the probes cost this process by the budget's estimate (`session::budget`): an
    /// entry per call and a return per timed call.
    pub fn estimated_probe_ns(&self) -> u64 {
        use crate::session::budget::{ENTRY_NS, RETURN_NS};
        self.routines
            .values()
            .map(|r| {
                let timed = r.sampled_time.map_or(r.totals.calls, |s| s.timed_calls);
                r.totals.calls * ENTRY_NS + timed * RETURN_NS
            })
            .sum()
    }
}

/// A library commtap probed, summarised for the report.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProbedLibrary {
    /// Path as seen from commtap.
    pub path: String,
    /// Implementation family and version line.
    pub flavor: String,
    /// Distinct routine addresses probed.
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
        JobProfile {
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
        }
    }

    /// Minimum / median / maximum communication time over ranks (None with no ranks).
    pub fn comm_summary(&self) -> Option<CommSummary<'_>> {
        let mut by_time: Vec<&RankProfile> = self.ranks.iter().collect();
        if by_time.is_empty() {
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
