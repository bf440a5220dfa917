//! The client side of `commtap report` and `commtap ps`.

use std::{fmt::Write as _, time::Duration};

use anyhow::{Context, Result};

use crate::{
    api::{
        pb,
        transport::{connect, Target},
    },
    profile::JobProfile,
    report::to_stdout,
};

/// A job asked for by id that the daemon or aggregator does not hold (or does not show this
/// caller): `report --job` exits 3 on it, so scripts (the Slurm epilog) can tell a job
/// without MPI from a failure.
#[derive(Debug, thiserror::Error)]
#[error("no job {job} at {from} ({hint})")]
pub struct NoSuchJob {
    /// The job asked for.
    pub job: String,
    /// Where it was asked.
    pub from: String,
    /// Which command lists the jobs there.
    hint: String,
}

impl NoSuchJob {
    /// Job `job` is not at `from`.
    pub fn new(job: &str, from: &Target) -> NoSuchJob {
        let hint = match from {
            Target::Unix(_) => format!(
                "`commtap ps --from {from}` lists the jobs there; a daemon shows a user only \
                 their own processes"
            ),
            // An aggregator, or a daemon's --listen.
            Target::Tcp(_) => format!(
                "`commtap jobs --from {from}` lists an aggregator's jobs, `commtap ps --from \
                 {from}` a daemon's"
            ),
        };
        NoSuchJob {
            job: job.to_string(),
            from: from.to_string(),
            hint,
        }
    }
}

/// The profile a daemon (unix://, or TCP with `daemon --listen`) or an aggregator (TCP, one
/// job) holds now; [`NoSuchJob`] when a job is asked for that has no rank there. Over TCP the aggregator is asked first when a job is given; a daemon
/// answers UNIMPLEMENTED to that, and is asked then.
pub async fn snapshot(from: &Target, job: Option<&str>) -> Result<JobProfile> {
    if let (Target::Tcp(_), Some(job)) = (from, job) {
        let mut client = crate::api::aggregator_client(connect(from).await?);
        match client
            .get_job_report(pb::GetJobReportRequest {
                job: job.to_string(),
            })
            .await
        {
            Ok(resp) => {
                let wire = resp
                    .into_inner()
                    .profile
                    .context("the aggregator sent no profile")?;
                return Ok(JobProfile::try_from(&wire)?);
            }
            Err(s) if s.code() == tonic::Code::Unimplemented => {}
            Err(s) if s.code() == tonic::Code::NotFound => {
                return Err(NoSuchJob::new(job, from).into())
            }
            Err(s) => return Err(s).context("GetJobReport"),
        }
    }
    let mut client = crate::api::node_client(connect(from).await?);
    let filter = pb::ProcessFilter {
        job: job.unwrap_or_default().to_string(),
        ..Default::default()
    };
    let profile = node_snapshot(&mut client, filter).await?;
    match job {
        Some(job) if profile.ranks.is_empty() => Err(NoSuchJob::new(job, from).into()),
        _ => Ok(profile),
    }
}

/// A daemon's profile now, page by page: a node with thousands of ranks does not fit in
/// one reply.
pub async fn node_snapshot(
    client: &mut pb::node_client::NodeClient<tonic::transport::Channel>,
    filter: pb::ProcessFilter,
) -> Result<JobProfile> {
    let mut profile: Option<JobProfile> = None;
    let mut page_token = String::new();
    loop {
        let resp = match client
            .get_snapshot(pb::GetSnapshotRequest {
                filter: Some(filter.clone()),
                page_size: SNAPSHOT_PAGE_RANKS,
                page_token: page_token.clone(),
            })
            .await
        {
            Ok(resp) => resp.into_inner(),
            Err(s) => return Err(node_api_error(s, "GetSnapshot")),
        };
        let wire = resp.profile.context("the daemon sent no profile")?;
        let page = JobProfile::try_from(&wire)?;
        match profile.as_mut() {
            None => profile = Some(page),
            Some(p) => {
                p.ranks.extend(page.ranks);
                if let (Some(all), Some(more)) = (p.skew.as_mut(), page.skew) {
                    all.ranks.extend(more.ranks);
                }
            }
        }
        if resp.next_page_token.is_empty() {
            break;
        }
        page_token = resp.next_page_token;
    }
    let mut profile = profile.expect("at least one page");
    sort_ranks(&mut profile);
    Ok(profile)
}

/// A failed call of the node API: an aggregator answers UNIMPLEMENTED, and what to do
/// then is said.
fn node_api_error(s: tonic::Status, rpc: &'static str) -> anyhow::Error {
    if s.code() == tonic::Code::Unimplemented {
        anyhow::anyhow!(
            "an aggregator reports one job at a time: give --job (`commtap jobs` lists them)"
        )
    } else {
        anyhow::Error::new(s).context(rpc)
    }
}

/// Ranks asked for per GetSnapshot page.
const SNAPSHOT_PAGE_RANKS: u32 = 1000;

/// `s` safe to print on an operator's terminal: control characters (escape sequences a
/// user put in a command line or a file name) are shown escaped, not sent.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Prints the processes a daemon knows and the libraries it probes: a table, or (`json`)
/// one JSON document with every field and whole command lines.
pub async fn print_processes(from: &Target, json: bool) -> Result<()> {
    let mut client = crate::api::node_client(connect(from).await?);
    let resp = client
        .list_processes(pb::ListProcessesRequest {})
        .await
        .context("ListProcesses")?
        .into_inner();
    if json {
        let doc = serde_json::json!({
            "processes": resp.processes.iter().map(process_json).collect::<Vec<_>>(),
            "libraries": resp.libraries.iter().map(|l| serde_json::json!({
                "path": l.path, "flavor": l.flavor, "probes": l.probes,
            })).collect::<Vec<_>>(),
        });
        return to_stdout(&format!("{doc}\n"));
    }
    // One write: a reader that went away ends it quietly (`ps | head`).
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:>8} {:>6} {:<12} {:<8} {:<20} {:<28} COMMAND",
        "PID", "RANK", "JOB", "STATE", "CONTAINER", "PROBES (EST. COST, TOP)"
    );
    for p in &resp.processes {
        let rank = p.rank.map_or_else(|| "-".into(), |r| r.to_string());
        // As `docker ps` shortens the id, and the pid the container's own `ps` shows.
        let container = p.container.as_ref().map_or_else(
            || "-".to_string(),
            |c| {
                let id = c.id.as_deref().unwrap_or("(namespaces)");
                format!("{} pid {}", id.get(..12).unwrap_or(id), c.pid)
            },
        );
        let _ = writeln!(
            o,
            "{:>8} {:>6} {:<12} {:<8} {:<20} {:<28} {}",
            p.pid,
            rank,
            printable(&p.job),
            state(p),
            printable(&container),
            p.probe_cost
                .as_ref()
                .map_or_else(|| "-".into(), probe_cost_text),
            printable(shortened(&p.cmdline, PS_COMMAND_CHARS))
        );
    }
    for p in resp.processes.iter().filter(|p| !p.unread.is_empty()) {
        let _ = writeln!(o, "unread {}: {}", p.pid, printable(&p.unread));
    }
    for l in &resp.libraries {
        let _ = writeln!(
            o,
            "library {} ({}): {} probes",
            printable(&l.path),
            printable(&l.flavor),
            l.probes
        );
    }
    to_stdout(&o)
}

/// A process's probes' estimated cost for `ps`: its share of the process's time so far,
/// and the routine that costs most (`1.2% MPI_Iprobe`).
fn probe_cost_text(c: &pb::ProbeCost) -> String {
    let share = 100.0 * c.estimated_ns as f64 / c.elapsed_ns.max(1) as f64;
    match c.routines.first() {
        Some(r) => format!("{share:.1}% {}", printable(&r.routine)),
        None => format!("{share:.1}%"),
    }
}

/// Where a process the daemon knows stands, as `ps` and `attach` say it.
fn state(p: &pb::ProcessState) -> &'static str {
    match p.status() {
        pb::ProcessStatus::Exited => "exited",
        pb::ProcessStatus::Detached => "detached",
        pb::ProcessStatus::Probed => "probed",
        pb::ProcessStatus::NoMpi | pb::ProcessStatus::Unspecified => "no-mpi",
    }
}

/// A process as `ps --json` lists it and `attach --json` prints it.
fn process_json(p: &pb::ProcessState) -> serde_json::Value {
    serde_json::json!({
        "pid": p.pid, "rank": p.rank, "job": p.job, "state": state(p), "cmdline": p.cmdline,
        "container": p.container.as_ref().map(|c| serde_json::json!({
            "pid": c.pid, "cgroup": c.cgroup, "id": c.id,
        })),
        "probe_cost": p.probe_cost.as_ref().map(|c| serde_json::json!({
            "estimated_ns": c.estimated_ns, "elapsed_ns": c.elapsed_ns,
            "routines": c.routines.iter().map(|r| serde_json::json!({
                "routine": r.routine, "estimated_ns": r.estimated_ns,
            })).collect::<Vec<_>>(),
        })),
        "unread": (!p.unread.is_empty()).then_some(&p.unread),
    })
}

/// Characters of a command line `ps` shows (the JSON profile has it whole): a node with
/// thousands of ranks lists them in a readable time.
const PS_COMMAND_CHARS: usize = 256;

/// `s` cut to at most `max` characters.
fn shortened(s: &str, max: usize) -> &str {
    s.char_indices().nth(max).map_or(s, |(at, _)| &s[..at])
}

/// Prints the jobs an aggregator knows, one per line, or (`json`) as one JSON document.
pub async fn print_jobs(from: &Target, json: bool) -> Result<()> {
    let mut client = crate::api::aggregator_client(connect(from).await?);
    let resp = client
        .list_jobs(pb::ListJobsRequest {})
        .await
        .context("ListJobs")?
        .into_inner();
    if json {
        let jobs: Vec<_> = resp
            .jobs
            .iter()
            .map(|j| {
                serde_json::json!({
                    "job": j.job, "ranks": j.ranks, "calls": j.calls, "nodes": j.nodes,
                })
            })
            .collect();
        let node_api: std::collections::BTreeMap<_, _> = resp.node_api.iter().collect();
        return to_stdout(&format!(
            "{}\n",
            serde_json::json!({ "jobs": jobs, "node_api": node_api })
        ));
    }
    let mut o = format!("{:<16} {:>6} {:>14}  NODES\n", "JOB", "RANKS", "CALLS");
    for j in &resp.jobs {
        let _ = writeln!(
            o,
            "{:<16} {:>6} {:>14}  {}",
            j.job,
            j.ranks,
            j.calls,
            j.nodes.join(",")
        );
    }
    to_stdout(&o)
}

/// Asks a daemon to watch `pid`; prints what it says of it.
pub async fn attach(from: &Target, pid: u32, json: bool) -> Result<()> {
    let mut client = crate::api::node_client(connect(from).await?);
    let p = client
        .attach_process(pb::AttachProcessRequest { pid })
        .await
        .with_context(|| format!("AttachProcess {pid}"))?
        .into_inner()
        .process
        .context("the daemon sent no process")?;
    if json {
        println!("{}", process_json(&p));
        return Ok(());
    }
    let what = if p.status() == pb::ProcessStatus::Probed {
        "probed"
    } else {
        "watched (it maps nothing probed yet)"
    };
    println!("PID {} {what}: {}", p.pid, p.cmdline);
    Ok(())
}

/// Asks a daemon to stop watching `pid`; prints its profile so far as `out` says.
pub async fn detach(from: &Target, pid: u32, out: &crate::report::Outputs) -> Result<()> {
    // A detach cannot be undone: its profile must have somewhere to go.
    out.check()?;
    let mut client = crate::api::node_client(connect(from).await?);
    let resp = client
        .detach_process(pb::DetachProcessRequest { pid })
        .await
        .with_context(|| format!("DetachProcess {pid}"))?
        .into_inner();
    let Some(rank) = resp.profile else {
        println!("PID {pid} detached; it made no call while watched");
        return Ok(());
    };
    let rank = crate::profile::RankProfile::try_from(&rank)?;
    out.write(&JobProfile::of_ranks(vec![rank]))
}

/// Prints a daemon's call events as JSON lines until `duration` ends (or forever): first
/// `{"streaming": true}` once the stream is open, then one line per call (after each
/// batch's calls, `{"exited": PID}` and `{"detached": PID}` lines), then a last line with
/// how many this reader missed.
pub async fn events(from: &Target, pids: Vec<u32>, duration: Option<Duration>) -> Result<()> {
    use std::io::Write as _;
    use tokio_stream::StreamExt as _;
    let mut client = crate::api::node_client(connect(from).await?);
    let mut stream = client
        .stream_events(pb::StreamEventsRequest { pids })
        .await
        .context("StreamEvents")?
        .into_inner();
    let stop = tokio::time::sleep(duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(stop);
    let mut dropped = 0;
    let mut stdout = std::io::stdout().lock();
    let mut first = true;
    loop {
        let batch = tokio::select! {
            () = &mut stop => break,
            b = stream.next() => match b {
                Some(b) => b.context("StreamEvents")?,
                None => break,
            },
        };
        dropped = batch.dropped;
        if first {
            // For scripts: from here on, every call is in the stream.
            writeln!(stdout, "{}", serde_json::json!({ "streaming": true }))?;
            stdout.flush()?;
            first = false;
        }
        for e in batch.events {
            let mut line = serde_json::json!({
                "pid": e.pid, "tid": e.tid, "routine": e.routine, "start_ns": e.start_ns,
                "duration_ns": e.duration_ns, "bytes": e.bytes, "peer": e.peer,
                "comm_size": e.comm_size, "comm_rank": e.comm_rank, "comm": e.comm,
            });
            // A point-to-point call's tag: with `peer`, what pairs a send with its receive.
            if let Some(tag) = e.tag {
                line["tag"] = tag.into();
            }
            // A collective's instance on its communicator: the same on every member (on
            // this node's only, `seq_local`, where the daemon found the job running).
            if let Some(seq) = e.seq {
                line["seq"] = seq.into();
                if e.seq_local {
                    line["seq_local"] = true.into();
                }
            }
            // An NCCL device window, not a call: said so, so that no script counts it as one.
            if let Some(w) = e.device_window {
                line["device_window"] = serde_json::json!({ "not_attributed": w.not_attributed });
            }
            // Nor is an arrival: the message of the receive it names arrived in the call of
            // its thread and start, whose own line follows.
            if let Some(a) = e.arrival {
                line["arrival"] = serde_json::json!({
                    "posted_tid": a.posted_tid, "posted_start_ns": a.posted_start_ns,
                    "untold": a.untold, "follows_call": a.follows_call,
                });
            }
            writeln!(stdout, "{line}")?;
        }
        // After the batch's calls, which came before: a process's exit, and a detach (or
        // an attach after one), after which its calls do not go on from those before.
        for (key, pids) in [("exited", &batch.exited), ("detached", &batch.detached)] {
            for pid in pids {
                writeln!(stdout, "{}", serde_json::json!({ key: pid }))?;
            }
        }
    }
    writeln!(stdout, "{}", serde_json::json!({ "dropped": dropped }))?;
    Ok(())
}

/// Writes the profile a daemon or an aggregator holds every `every` (WatchSnapshots /
/// WatchJobReport), `count` times, until the stream ends, or (a `job`) until every rank of
/// it has exited.
pub async fn watch(
    from: &Target,
    job: Option<&str>,
    every: Duration,
    count: Option<u64>,
    out: &crate::report::Outputs,
) -> Result<()> {
    if let (Target::Tcp(_), Some(job)) = (from, job) {
        // An aggregator's watch of a job it does not hold streams nothing until the job's
        // first push: as `report --job`, a job that is not there ends it (exit 3).
        snapshot(from, Some(job)).await?;
    }
    let mut n = 0;
    watch_profiles(from, job, every, |profile| {
        if let Some(job) = job.filter(|_| n == 0 && profile.ranks.is_empty()) {
            // As `report --job` without --watch: a job that is not there ends it (exit 3).
            return Err(NoSuchJob::new(job, from).into());
        }
        out.write_watched(&profile, n)?;
        n += 1;
        if let Some(job) = job.filter(|_| profile.every_rank_final()) {
            // Nothing more will come: its last report is the one above.
            eprintln!("job {job}: every rank exited; that report is final");
            return Ok(true);
        }
        Ok(count.is_some_and(|c| n >= c))
    })
    .await
}

/// Hands `emit` the whole profile a daemon or an aggregator holds every `every`, until the
/// stream ends or `emit` says to stop (true). The server paces the stream.
pub async fn watch_profiles(
    from: &Target,
    job: Option<&str>,
    every: Duration,
    mut emit: impl FnMut(JobProfile) -> Result<bool>,
) -> Result<()> {
    use tokio_stream::StreamExt as _;
    let interval_ms = u32::try_from(every.as_millis()).context("the interval is too long")?;
    if let Target::Tcp(_) = from {
        if let Some(job) = job {
            let mut client = crate::api::aggregator_client(connect(from).await?);
            match client
                .watch_job_report(pb::WatchJobReportRequest {
                    job: job.to_string(),
                    interval_ms,
                })
                .await
            {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    while let Some(r) = stream.next().await {
                        let wire = r.context("WatchJobReport")?.profile;
                        if emit(JobProfile::try_from(&wire.context("no profile")?)?)? {
                            break;
                        }
                    }
                    return Ok(());
                }
                // A daemon's TCP listener: watch it below.
                Err(s) if s.code() == tonic::Code::Unimplemented => {}
                Err(s) => return Err(s).context("WatchJobReport"),
            }
        }
    }
    let mut client = crate::api::node_client(connect(from).await?);
    let filter = pb::ProcessFilter {
        job: job.unwrap_or_default().to_string(),
        ..Default::default()
    };
    let mut stream = match client
        .watch_snapshots(pb::WatchSnapshotsRequest {
            filter: Some(filter),
            interval_ms,
            page_size: SNAPSHOT_PAGE_RANKS,
        })
        .await
    {
        Ok(s) => s.into_inner(),
        Err(s) => return Err(node_api_error(s, "WatchSnapshots")),
    };
    // Pages of one snapshot come in a row, the last with `more` false.
    let mut profile: Option<JobProfile> = None;
    while let Some(r) = stream.next().await {
        let r = r.context("WatchSnapshots")?;
        let page = JobProfile::try_from(&r.profile.context("no profile")?)?;
        match profile.as_mut() {
            None => profile = Some(page),
            Some(p) => p.ranks.extend(page.ranks),
        }
        if !r.more {
            let mut whole = profile.take().expect("a page");
            sort_ranks(&mut whole);
            if emit(whole)? {
                break;
            }
        }
    }
    Ok(())
}

/// Ranks in the order reports show them: by job, then rank; and the pages' per-peer
/// traffic placed on world ranks where another page holds the peer.
fn sort_ranks(profile: &mut JobProfile) {
    profile.place_peers_on_world_ranks();
    profile
        .ranks
        .sort_by(|a, b| (a.job.as_str(), a.rank).cmp(&(b.job.as_str(), b.rank)));
    if let Some(s) = profile.skew.as_mut() {
        s.ranks.sort_by_key(|r| r.rank);
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("mpirun -np 2 ./app"), "mpirun -np 2 ./app");
        assert_eq!(
            printable("x\u{1b}]0;owned\u{7}y\n"),
            "x\\u{1b}]0;owned\\u{7}y\\n"
        );
    }
}
