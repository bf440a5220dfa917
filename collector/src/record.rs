//! `commtap record`: attach to running ranks (`--pid`) or launch a command and follow every
//! process it spawns, then print the job's profile.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    attach::{LoadOptions, Probes},
    discover::{self, DiscoverError, ProcessInfo},
    ingest::{self, monotonic_ns, IngestCounters, ProcessEvent},
    report::{self, JobProfile, ProbedLibrary, RankProfile, SCHEMA},
    stats,
    symbols::Placement,
};

/// Output format of the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// mpitrace-style text.
    Text,
    /// The JSON document described in the README.
    Json,
}

/// What `record` was asked to do.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Running processes to attach to.
    pub pids: Vec<u32>,
    /// Command to launch and follow (empty with `pids`).
    pub command: Vec<String>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Output format.
    pub format: Format,
    /// Write the profile here instead of stdout.
    pub output: Option<PathBuf>,
    /// Also write mpitrace files here.
    pub mpitrace_dir: Option<PathBuf>,
    /// Also write the JSON profile here.
    pub json: Option<PathBuf>,
    /// Ring buffer size in KiB.
    pub ring_buffer_kib: u32,
    /// Extra MPI libraries to probe before launching (beyond the linker's search path).
    pub libraries: Vec<PathBuf>,
    /// Created once the probes are attached (a handshake for scripts and tests).
    pub ready_file: Option<PathBuf>,
}

/// Per watched process, what record keeps.
#[derive(Debug, Default)]
struct Tracked {
    info: Option<ProcessInfo>,
    /// Monotonic ns from which its calls are counted (attach, or fork for launched ones).
    since_ns: u64,
    /// Monotonic ns at which it exited.
    exit_ns: Option<u64>,
    /// Given with --pid (reported even without MPI calls).
    requested: bool,
    /// Whether it maps an MPI library commtap probes.
    maps_mpi: bool,
}

/// Runs `record` to completion and returns the profile.
pub async fn record(opts: RecordOptions) -> Result<JobProfile> {
    if opts.pids.is_empty() && opts.command.is_empty() {
        bail!("nothing to record: give --pid PID[,PID...] or a command after `--`");
    }
    if !opts.pids.is_empty() && !opts.command.is_empty() {
        bail!("give either --pid or a command to launch, not both");
    }
    check_privileges()?;
    let me = std::process::id();
    let mut tracked: BTreeMap<u32, Tracked> = BTreeMap::new();
    let mut not_profiled = Vec::new();
    for &pid in &opts.pids {
        if pid == me {
            bail!("PID {pid} is commtap itself");
        }
        // Fail before loading anything if a PID does not exist.
        let info = discover::process_info(pid).map_err(|e| match e {
            DiscoverError::NoSuchProcess(_) => anyhow::anyhow!("{e}"),
            other => anyhow::Error::new(other).context(format!("inspecting PID {pid}")),
        })?;
        tracked.insert(
            pid,
            Tracked {
                info: Some(info),
                requested: true,
                ..Default::default()
            },
        );
    }

    let ring_buffer_bytes = (opts.ring_buffer_kib.max(4) * 1024).next_power_of_two();
    let mut probes =
        Probes::load(LoadOptions { ring_buffer_bytes }).context("setting up the probes")?;
    let ring = probes.take_events().context("ring buffer already taken")?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let ingest_counters = Arc::new(IngestCounters::default());
    let cancel = CancellationToken::new();
    let ingest = tokio::spawn(ingest::run(
        ring,
        tx,
        ingest_counters.clone(),
        cancel.clone(),
    ));

    // Attach-late mode: probe what each process maps, then count it.
    for (&pid, t) in tracked.iter_mut() {
        probes.watch(pid, false)?;
        t.since_ns = monotonic_ns();
        t.maps_mpi = attach_mapped(&mut probes, pid);
        seed(&mut probes, pid, t);
        if !t.maps_mpi {
            warn!("PID {pid} maps no MPI library (yet); watching it in case it loads one");
        }
    }
    if !opts.pids.is_empty() && tracked.values().all(|t| !t.maps_mpi) {
        cancel.cancel();
        let _ = ingest.await;
        let list = opts
            .pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        bail!("PID {list}: not an MPI process (maps no MPI library: libmpi, libmpich)");
    }

    if !opts.pids.is_empty() {
        mark_ready(&opts)?;
    }

    // Launch mode: probe the libraries the job will load before it starts.
    let mut child = None;
    if !opts.command.is_empty() {
        let mut libs = discover::candidate_mpi_libraries();
        libs.extend(opts.libraries.iter().cloned());
        for lib in &libs {
            match std::fs::metadata(lib) {
                Ok(m) => {
                    use std::os::unix::fs::MetadataExt;
                    probes.attach_library((m.dev(), m.ino()), lib)?;
                }
                Err(e) => warn!("--lib {}: {e}", lib.display()),
            }
        }
        if probes.libraries().is_empty() {
            warn!("no MPI library found in the linker's search path; libraries are probed as processes map them");
        }
        mark_ready(&opts)?;
        let (c, pid) = launch(&opts.command, &mut probes)?;
        tracked.insert(
            pid,
            Tracked {
                since_ns: monotonic_ns(),
                ..Default::default()
            },
        );
        child = Some(c);
    }

    let stop = tokio::time::sleep(opts.duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let launched = child.is_some();
    let mut child_exit = std::pin::pin!(async {
        match child.as_mut() {
            Some(c) => c.wait().await.ok(),
            None => std::future::pending().await,
        }
    });
    let mut exit_status = None;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => { info!("interrupted: reporting what was recorded"); break; }
            _ = &mut stop => { info!("duration reached"); break; }
            status = &mut child_exit => { exit_status = status; break; }
            Some(ev) = rx.recv() => on_process_event(ev, &mut tracked, &mut probes),
            _ = tick.tick() => {
                rescan(&mut tracked, &mut probes);
                if !launched && tracked.values().filter(|t| t.requested).all(|t| t.exit_ns.is_some()) {
                    info!("all watched processes exited");
                    break;
                }
            }
        }
    }
    // Events already queued (exits of ranks just before the launcher) still count.
    while let Ok(ev) = rx.try_recv() {
        on_process_event(ev, &mut tracked, &mut probes);
    }
    let end_ns = monotonic_ns();
    if let Some(status) = exit_status {
        if !status.success() {
            warn!("the command exited with {status}");
        }
    }

    // Stop counting before reading, so the counters and the events describe the same calls.
    for pid in tracked.keys() {
        probes.unwatch(*pid);
    }
    let counters = probes.read_counters();
    cancel.cancel();
    let _ = ingest.await;
    debug!(
        malformed = ingest_counters
            .malformed
            .load(std::sync::atomic::Ordering::Relaxed),
        "ingest done"
    );

    let counted: BTreeSet<u32> = counters.iter().map(|(k, _)| k.tgid).collect();
    let host = discover::this_host();
    let mut ranks = Vec::new();
    for (&pid, t) in &tracked {
        if !counted.contains(&pid) {
            if t.requested {
                not_profiled.push(if t.maps_mpi {
                    format!("PID {pid}: made no MPI call while watched")
                } else {
                    format!("PID {pid}: never mapped an MPI library")
                });
            }
            continue;
        }
        let ps = probes.read_proc_stats(pid);
        let routines = stats::routines_of(pid, &counters);
        let mut health: stats::Health = (&ps).into();
        health.events = ingest_counters.events_of(pid);
        let start = if ps.init_ns != 0 {
            ps.init_ns.max(t.since_ns)
        } else {
            t.since_ns
        };
        let end = if ps.finalize_ns != 0 {
            ps.finalize_ns
        } else {
            t.exit_ns.unwrap_or(end_ns)
        };
        let info = t.info.clone().unwrap_or(ProcessInfo {
            pid,
            ..Default::default()
        });
        ranks.push(RankProfile {
            rank: info.rank.unwrap_or(u32::MAX),
            rank_known: info.rank.is_some(),
            pid,
            host: host.clone(),
            job: info.batch_job.clone().unwrap_or_default(),
            cmdline: info.cmdline.clone(),
            elapsed_ns: end.saturating_sub(start),
            comm_time_ns: stats::communication_ns(&routines),
            routines,
            health,
        });
    }
    Ok(assemble(ranks, &probes, not_profiled))
}

/// Orders ranks, fills in what the environment did not say, and adds the probe summary.
fn assemble(mut ranks: Vec<RankProfile>, probes: &Probes, not_profiled: Vec<String>) -> JobProfile {
    // Ranks without a launcher rank get the next free numbers, in pid order.
    ranks.sort_by_key(|r| (r.rank, r.pid));
    let first_free = ranks
        .iter()
        .filter(|r| r.rank_known)
        .map(|r| r.rank + 1)
        .max()
        .unwrap_or(0);
    for (r, rank) in ranks.iter_mut().filter(|r| !r.rank_known).zip(first_free..) {
        r.rank = rank;
    }
    ranks.sort_by_key(|r| r.rank);
    // mpitrace's job id: the batch system's, else rank 0's pid.
    let job = ranks
        .iter()
        .find(|r| !r.job.is_empty())
        .map(|r| r.job.clone())
        .or_else(|| ranks.first().map(|r| r.pid.to_string()))
        .unwrap_or_else(|| "0".into());
    for r in &mut ranks {
        r.job = job.clone();
    }
    let libraries = probes
        .libraries()
        .iter()
        .map(|l| ProbedLibrary {
            path: l.library.path.clone(),
            flavor: l.library.flavor.clone(),
            probes: l.library.probes.len(),
            moved_past_single_step: names_with(l, Placement::SkippedSingleStep),
            single_stepped: names_with(l, Placement::SingleStepped),
            failed: l.failed.clone(),
        })
        .collect();
    JobProfile {
        schema: SCHEMA.into(),
        job,
        dropped: ranks.iter().map(|r| r.health.dropped).sum(),
        undecoded: ranks.iter().map(|r| r.health.undecoded).sum(),
        ranks,
        libraries,
        unsupported_libraries: probes.unsupported().to_vec(),
        not_profiled,
    }
}

fn names_with(l: &crate::attach::AttachedLibrary, p: Placement) -> Vec<String> {
    l.library
        .probes
        .iter()
        .filter(|x| x.placement == p)
        .map(|x| x.name.to_string())
        .collect()
}

/// Probes every MPI library `pid` maps; returns whether it maps one.
fn attach_mapped(probes: &mut Probes, pid: u32) -> bool {
    let objects = match discover::mapped_objects(pid) {
        Ok(o) => o,
        Err(e) => {
            debug!("PID {pid}: {e}");
            return false;
        }
    };
    let mut any = false;
    for o in objects {
        match probes.attach_library(o.dev_inode, &o.path) {
            Ok(true) => any = true,
            Ok(false) => {}
            Err(e) => warn!("PID {pid}: {}: {e}", o.path.display()),
        }
    }
    any
}

/// Tells the kernel the world size/rank the launcher gave `pid` (integer-handle ABIs).
fn seed(probes: &mut Probes, pid: u32, t: &Tracked) {
    if let Some(ProcessInfo {
        world_size: Some(size),
        rank: Some(rank),
        ..
    }) = &t.info
    {
        probes.seed_world(pid, *size, *rank);
    }
}

fn on_process_event(ev: ProcessEvent, tracked: &mut BTreeMap<u32, Tracked>, probes: &mut Probes) {
    match ev {
        ProcessEvent::Fork { pid, .. } => {
            tracked.entry(pid).or_insert_with(|| Tracked {
                since_ns: monotonic_ns(),
                ..Default::default()
            });
        }
        ProcessEvent::Exec { pid } => {
            let t = tracked.entry(pid).or_insert_with(|| Tracked {
                since_ns: monotonic_ns(),
                ..Default::default()
            });
            // The new image's environment names the rank; its libraries may be new.
            t.info = discover::process_info(pid).ok().or(t.info.take());
            t.maps_mpi |= attach_mapped(probes, pid);
            seed(probes, pid, t);
        }
        ProcessEvent::Exit { pid, ts_ns } => {
            if let Some(t) = tracked.get_mut(&pid) {
                t.exit_ns = Some(ts_ns);
            }
        }
    }
}

/// Picks up libraries loaded since the last look (dlopen) and processes that ended
/// without an exit event reaching us.
fn rescan(tracked: &mut BTreeMap<u32, Tracked>, probes: &mut Probes) {
    for (&pid, t) in tracked.iter_mut().filter(|(_, t)| t.exit_ns.is_none()) {
        if !probes.is_watched(pid) || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            t.exit_ns = Some(monotonic_ns());
            continue;
        }
        if t.info.as_ref().is_none_or(|i| i.rank.is_none()) {
            if let Ok(info) = discover::process_info(pid) {
                t.info = Some(info);
                seed(probes, pid, t);
            }
        }
        t.maps_mpi |= attach_mapped(probes, pid);
    }
}

/// Starts `command` so that the kernel watches it before it first runs: commtap marks
/// itself "watch my children" (without counting itself) around the spawn, and the fork
/// tracepoint watches the child at its creation. Nothing the job does, from MPI_Init on, in
/// every process it spawns, is missed.
fn launch(command: &[String], probes: &mut Probes) -> Result<(tokio::process::Child, u32)> {
    let me = std::process::id();
    probes.watch_descendants_of_self(me)?;
    let spawned = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .spawn();
    probes.unwatch(me);
    let child = spawned.with_context(|| format!("starting {}", command[0]))?;
    let pid = child.id().context("launched process has no pid")?;
    if !probes.is_watched(pid) {
        // Should not happen: the fork tracepoint ran before the child could.
        probes.watch(pid, true)?;
        warn!("PID {pid} was not watched from its start; calls before now are not counted");
    }
    info!("launched {} as PID {pid}", command.join(" "));
    Ok((child, pid))
}

fn mark_ready(opts: &RecordOptions) -> Result<()> {
    if let Some(path) = &opts.ready_file {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("writing the ready file {}", path.display()))?;
    }
    Ok(())
}

/// Capabilities commtap needs, by bit number in `CapEff`.
const NEEDED_CAPS: &[(u32, &str)] = &[(21, "CAP_SYS_ADMIN"), (38, "CAP_PERFMON"), (39, "CAP_BPF")];

/// Fails early, with a message that says what to do, when BPF cannot be used.
fn check_privileges() -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let missing: Vec<&str> = NEEDED_CAPS
        .iter()
        .filter(|(bit, _)| eff & (1 << bit) == 0)
        .map(|(_, n)| *n)
        .collect();
    if !missing.is_empty() {
        bail!(
            "commtap needs root (or {}) to load BPF programs and attach uprobes; missing: {}. Run it with sudo, or as the commtap systemd service.",
            NEEDED_CAPS.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(" + "),
            missing.join(", ")
        );
    }
    Ok(())
}

/// Writes the profile as asked.
pub fn emit(profile: &JobProfile, opts: &RecordOptions) -> Result<()> {
    let text = match opts.format {
        Format::Json => serde_json::to_string_pretty(profile)? + "\n",
        Format::Text => report::render_text(profile),
    };
    match &opts.output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::stdout().write_all(text.as_bytes())?,
    }
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(profile)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dir) = &opts.mpitrace_dir {
        let files = report::write_mpitrace_dir(profile, dir)
            .with_context(|| format!("writing mpitrace files to {}", dir.display()))?;
        info!(
            "wrote {} mpitrace profile files to {}",
            files.len(),
            dir.display()
        );
    }
    Ok(())
}
