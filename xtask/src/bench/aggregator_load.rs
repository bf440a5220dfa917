//! An aggregator under many daemons: 1,000 simulated daemons of 8 ranks pushing every
//! second over gRPC (each from an address of its own), then 2x and 10x that; per level the
//! push latency (pushed to merged and durable), the pushes it kept up with, errors, and
//! the aggregator's CPU and memory.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use super::{
    cpu_seconds,
    trace_rates::{free_address, peak_rss_mib, wait_until, Guard},
};

/// Simulated daemons per level: the target cluster, then 2x and 10x.
const LEVELS: [u32; 3] = [1_000, 2_000, 10_000];

/// Seconds each level pushes.
pub const SECONDS_EACH: u64 = 20;

/// One line of JSON: the levels in order.
pub fn run(commtap: &Path, out: &Path) -> Result<String> {
    let db = out.join("aggregator-load.redb");
    let _ = std::fs::remove_file(&db);
    let addr = free_address()?;
    let mut aggregator = Guard(
        Command::new(commtap)
            .args(["aggregator", "--insecure-tcp", "--listen", &addr, "--db"])
            .arg(&db)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the aggregator")?,
    );
    wait_until("the aggregator to listen", || {
        std::net::TcpStream::connect(&addr).is_ok()
    })?;
    let pid = aggregator.0.id();
    let mut levels = Vec::new();
    for daemons in LEVELS {
        eprintln!("aggregator load: {daemons} simulated daemons for {SECONDS_EACH} s");
        let cpu = cpu_seconds(pid)?;
        let start = Instant::now();
        let o = Command::new(commtap)
            .args([
                "bench-push",
                "--to",
                &addr,
                "--daemons",
                &daemons.to_string(),
            ])
            .args(["--seconds", &SECONDS_EACH.to_string()])
            .output()
            .context("commtap bench-push")?;
        let wall = start.elapsed().as_secs_f64();
        if !o.status.success() {
            bail!("bench-push: {}", String::from_utf8_lossy(&o.stderr));
        }
        if aggregator.0.try_wait()?.is_some() {
            bail!("the aggregator died under {daemons} daemons");
        }
        let pushes = String::from_utf8_lossy(&o.stdout).trim().to_string();
        levels.push(format!(
            "{{\"pushers\": {pushes}, \"aggregator_cpu_percent_of_one_core\": {:.0}, \"aggregator_peak_rss_mib\": {:.1}, \"db_mib\": {:.1}}}",
            100.0 * (cpu_seconds(pid)? - cpu) / wall,
            peak_rss_mib(pid)?,
            std::fs::metadata(&db).map_or(0, |m| m.len()) as f64 / 1048576.0
        ));
    }
    let _ = aggregator.0.kill();
    Ok(format!("[{}]", levels.join(", ")))
}
