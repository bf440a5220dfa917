//! The job profile document and its renderings: JSON (the schema in the README), an
//! mpitrace-style text report, and mpitrace's per-rank `mpi_profile.<job>.<rank>` files.

mod mpitrace;
mod peers;

use std::{io::Write as _, path::PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tracing::info;

pub use mpitrace::{render_text, write_mpitrace_dir};

use crate::stats::{Health, Routines};

/// Version tag of the JSON document.
pub const SCHEMA: &str = "commtap.profile.v1";

/// One profiled process (an MPI rank).
#[derive(Clone, Debug, Serialize, Deserialize)]
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

/// A libfabric fabric a process opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Fabric {
    /// Provider, layered ones included: `tcp;ofi_rxm`.
    pub provider: String,
    /// Fabric name (for tcp and udp, the network: `127.0.0.0/8`).
    pub name: String,
}

/// A library commtap probed, summarised for the report.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
}

/// The whole profile of a job on this node.
#[derive(Clone, Debug, Serialize, Deserialize)]
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

impl JobProfile {
    /// A profile of just these ranks (no library or process notes).
    pub fn of_ranks(ranks: Vec<RankProfile>) -> JobProfile {
        JobProfile {
            schema: SCHEMA.to_string(),
            job: ranks.first().map(|r| r.job.clone()).unwrap_or_default(),
            dropped: ranks.iter().map(|r| r.health.dropped).sum(),
            undecoded: ranks.iter().map(|r| r.health.undecoded).sum(),
            ranks,
            libraries: Vec::new(),
            unsupported_libraries: Vec::new(),
            not_profiled: Vec::new(),
            call_events: false,
            skew: None,
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

/// Output format of a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// mpitrace-style text.
    Text,
    /// The JSON document described in the README.
    Json,
}

/// Where and how a profile is written (shared by `record` and `report`).
#[derive(clap::Args, Clone, Debug)]
pub struct Outputs {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the profile to this file instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Also write the JSON profile to this file (whatever --format says).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write IBM mpitrace's `mpi_profile.<jobid>.<rank>` files into this directory.
    #[arg(long)]
    pub mpitrace_dir: Option<PathBuf>,
}

/// Writes `bytes` to `path`, created or truncated, never through a symlink: commtap runs
/// as root, and an output path in a shared directory (`/tmp/profile.json`) may have been
/// planted as a link to a file root owns.
pub fn write_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    create_file(path)?.write_all(bytes)
}

/// Creates (or truncates) the regular file `path` for writing, as [`write_file`] does:
/// never through a symbolic link, never blocking on a FIFO.
pub fn create_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::other("it is a symbolic link, which commtap does not follow")
            } else {
                e
            }
        })?;
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

impl Outputs {
    /// Writes `profile` as asked.
    pub fn write(&self, profile: &JobProfile) -> Result<()> {
        let json = || -> Result<String> { Ok(serde_json::to_string_pretty(profile)? + "\n") };
        let text = match self.format {
            Format::Json => json()?,
            Format::Text => render_text(profile),
        };
        match &self.output {
            Some(path) => write_file(path, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?,
            None => std::io::stdout().write_all(text.as_bytes())?,
        }
        if let Some(path) = &self.json {
            write_file(path, json()?.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if let Some(dir) = &self.mpitrace_dir {
            let files = write_mpitrace_dir(profile, dir)
                .with_context(|| format!("writing mpitrace files to {}", dir.display()))?;
            info!(
                "wrote {} mpitrace profile files to {}",
                files.len(),
                dir.display()
            );
        }
        Ok(())
    }
}
