//! The client side of `commtap report` and `commtap ps`.

use anyhow::{Context, Result};

use crate::{
    report::JobProfile,
    serve::{
        pb::{self, aggregator_client::AggregatorClient, node_client::NodeClient},
        socket::{connect, Target},
    },
};

/// The profile a daemon (unix://) or an aggregator (http://, one job) holds now.
pub async fn snapshot(from: &Target, job: Option<&str>) -> Result<JobProfile> {
    if let Target::Tcp(_) = from {
        let job = job.context(
            "an aggregator reports one job at a time: give --job (`commtap jobs` lists them)",
        )?;
        let mut client = AggregatorClient::new(connect(from).await?);
        let resp = client
            .get_job_report(pb::GetJobReportRequest {
                job: job.to_string(),
            })
            .await
            .context("GetJobReport")?
            .into_inner();
        let wire = resp.profile.context("the aggregator sent no profile")?;
        return Ok(JobProfile::try_from(&wire)?);
    }
    let mut client = NodeClient::new(connect(from).await?);
    let filter = pb::ProcessFilter {
        job: job.unwrap_or_default().to_string(),
        ..Default::default()
    };
    let resp = client
        .get_snapshot(pb::GetSnapshotRequest {
            filter: Some(filter),
        })
        .await
        .context("GetSnapshot")?
        .into_inner();
    let wire = resp.profile.context("the daemon sent no profile")?;
    Ok(JobProfile::try_from(&wire)?)
}

/// Prints the processes a daemon knows, one per line.
pub async fn print_processes(from: &Target) -> Result<()> {
    let mut client = NodeClient::new(connect(from).await?);
    let resp = client
        .list_processes(pb::ListProcessesRequest {})
        .await
        .context("ListProcesses")?
        .into_inner();
    println!(
        "{:>8} {:>6} {:<12} {:<8} COMMAND",
        "PID", "RANK", "JOB", "STATE"
    );
    for p in &resp.processes {
        let rank = p.rank.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
        let state = if p.exited {
            "exited"
        } else if p.maps_mpi {
            "probed"
        } else {
            "no-mpi"
        };
        println!(
            "{:>8} {:>6} {:<12} {:<8} {}",
            p.pid, rank, p.job, state, p.cmdline
        );
    }
    for l in &resp.libraries {
        println!("library {} ({}): {} probes", l.path, l.flavor, l.probes);
    }
    Ok(())
}

/// Prints the jobs an aggregator knows, one per line.
pub async fn print_jobs(from: &Target) -> Result<()> {
    let mut client = AggregatorClient::new(connect(from).await?);
    let resp = client
        .list_jobs(pb::ListJobsRequest {})
        .await
        .context("ListJobs")?
        .into_inner();
    println!("{:<16} {:>6} {:>14}  NODES", "JOB", "RANKS", "CALLS");
    for j in &resp.jobs {
        println!(
            "{:<16} {:>6} {:>14}  {}",
            j.job,
            j.ranks,
            j.calls,
            j.nodes.join(",")
        );
    }
    Ok(())
}
