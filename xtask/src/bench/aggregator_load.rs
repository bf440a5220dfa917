//! An aggregator under many daemons: 1,000 simulated daemons of 8 ranks pushing every
//! second over gRPC (each from an address of its own), then 2x and 10x that; per level the
//! push latency (pushed to merged and durable), the pushes it kept up with, errors, and
//! the aggregator's CPU and memory. Then a tree of aggregators: a real relay under 1,000
//! simulated daemons pushing to a root, and the root of 10,000 and 20,000 nodes under
//! simulated relays of 1,000 nodes each.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
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

/// Nodes under each relay of the tree.
pub const NODES_PER_RELAY: u32 = 1_000;

/// Relays under the tree's root, per level: 10,000 nodes, then 20,000.
const RELAYS: [u32; 2] = [10, 20];

/// How often a relay pushes upstream (`--push-interval`): every node's snapshot reaches the
/// root within this, and the root merges each relayed rank once per interval.
pub const RELAY_INTERVAL_S: u64 = 10;

/// Seconds the root's levels push: a few relay intervals.
pub const ROOT_SECONDS: u64 = 4 * RELAY_INTERVAL_S;

/// A plaintext aggregator on a free loopback port with its database at `db` (removed
/// first), and its address.
fn start_aggregator(commtap: &Path, db: &Path, extra: &[&str]) -> Result<(Guard, String)> {
    let _ = std::fs::remove_file(db);
    let addr = free_address()?;
    let aggregator = Guard(
        Command::new(commtap)
            .args(["aggregator", "--insecure-tcp", "--listen", &addr, "--db"])
            .arg(db)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the aggregator")?,
    );
    wait_until("the aggregator to listen", || {
        std::net::TcpStream::connect(&addr).is_ok()
    })?;
    Ok((aggregator, addr))
}

/// What an aggregator spent while a load ran: CPU in percent of one core over `wall`, peak
/// memory and its database's size, as JSON fields named with `who`.
fn spent(who: &str, pid: u32, cpu_before: f64, wall: f64, db: &Path) -> Result<String> {
    Ok(format!(
        "\"{who}_cpu_percent_of_one_core\": {:.0}, \"{who}_peak_rss_mib\": {:.1}, \"{who}_db_mib\": {:.1}",
        100.0 * (cpu_seconds(pid)? - cpu_before) / wall,
        peak_rss_mib(pid)?,
        std::fs::metadata(db).map_or(0, |m| m.len()) as f64 / 1048576.0
    ))
}

/// `commtap bench-push --to addr ARGS`: its line of JSON and how long it ran.
fn bench_push(commtap: &Path, addr: &str, args: &[String]) -> Result<(String, f64)> {
    let start = Instant::now();
    let mut all = vec!["bench-push", "--to", addr];
    all.extend(args.iter().map(String::as_str));
    let line = super::commtap_line(commtap, &all)?;
    Ok((line, start.elapsed().as_secs_f64()))
}

/// One line of JSON: the levels in order.
pub fn run(commtap: &Path, out: &Path) -> Result<String> {
    let db = out.join("aggregator-load.redb");
    let (mut aggregator, addr) = start_aggregator(commtap, &db, &[])?;
    let pid = aggregator.0.id();
    let mut levels = Vec::new();
    for daemons in LEVELS {
        eprintln!("aggregator load: {daemons} simulated daemons for {SECONDS_EACH} s");
        let cpu = cpu_seconds(pid)?;
        let (pushes, wall) = bench_push(
            commtap,
            &addr,
            &[
                "--daemons".into(),
                daemons.to_string(),
                "--seconds".into(),
                SECONDS_EACH.to_string(),
            ],
        )?;
        if aggregator.0.try_wait()?.is_some() {
            bail!("the aggregator died under {daemons} daemons");
        }
        levels.push(format!(
            "{{\"pushers\": {pushes}, {}}}",
            spent("aggregator", pid, cpu, wall, &db)?
        ));
    }
    Ok(format!("[{}]", levels.join(", ")))
}

/// The job `load` as `commtap jobs` at `addr` lists it: (ranks, calls).
fn load_job(commtap: &Path, addr: &str) -> Result<Option<(u64, u64)>> {
    let o = Command::new(commtap)
        .args([
            "jobs",
            "--format",
            "json",
            "--from",
            &format!("http://{addr}"),
        ])
        .output()
        .context("commtap jobs")?;
    if !o.status.success() {
        bail!("commtap jobs: {}", String::from_utf8_lossy(&o.stderr));
    }
    let jobs: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    Ok(jobs["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["job"] == "load")
        .and_then(|j| Some((j["ranks"].as_u64()?, j["calls"].as_u64()?))))
}

/// One line of JSON: a real relay under 1,000 simulated daemons pushing to a root (both
/// aggregators' costs, and how long after the daemons' last push the root had every rank
/// as the relay had it), then the root under simulated relays, per level.
pub fn run_tree(commtap: &Path, out: &Path) -> Result<String> {
    let root_db = out.join("aggregator-root.redb");
    let relay_db = out.join("aggregator-relay.redb");
    let (root, root_addr) = start_aggregator(commtap, &root_db, &[])?;
    let interval = format!("{RELAY_INTERVAL_S}s");
    let (relay, relay_addr) = start_aggregator(
        commtap,
        &relay_db,
        &[
            "--upstream",
            &format!("http://{root_addr}"),
            "--push-interval",
            &interval,
        ],
    )?;
    eprintln!(
        "aggregator tree: {NODES_PER_RELAY} simulated daemons, a relay, a root, for {SECONDS_EACH} s"
    );
    let (root_pid, relay_pid) = (root.0.id(), relay.0.id());
    let (root_cpu, relay_cpu) = (cpu_seconds(root_pid)?, cpu_seconds(relay_pid)?);
    let (pushes, wall) = bench_push(
        commtap,
        &relay_addr,
        &[
            "--daemons".into(),
            NODES_PER_RELAY.to_string(),
            "--seconds".into(),
            SECONDS_EACH.to_string(),
        ],
    )?;
    let (relay_spent, root_spent) = (
        spent("relay", relay_pid, relay_cpu, wall, &relay_db)?,
        spent("root", root_pid, root_cpu, wall, &root_db)?,
    );
    let ended = Instant::now();
    let at_relay = load_job(commtap, &relay_addr)?.context("the relay has no job")?;
    let deadline = ended + Duration::from_secs(3 * RELAY_INTERVAL_S);
    while load_job(commtap, &root_addr)? != Some(at_relay) {
        if Instant::now() > deadline {
            bail!("the root never caught up with the relay ({at_relay:?})");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let relayed = format!(
        "{{\"pushers\": {pushes}, \"ranks\": {}, \"root_caught_up_s\": {:.1}, {relay_spent}, {root_spent}}}",
        at_relay.0,
        ended.elapsed().as_secs_f64()
    );
    drop((relay, root));

    let mut levels = vec![relayed];
    for relays in RELAYS {
        // A root of its own per level: it holds only that level's nodes.
        let (mut root, root_addr) = start_aggregator(commtap, &root_db, &[])?;
        let pid = root.0.id();
        eprintln!(
            "aggregator tree: a root under {relays} simulated relays of {NODES_PER_RELAY} nodes for {ROOT_SECONDS} s"
        );
        let cpu = cpu_seconds(pid)?;
        let (pushes, wall) = bench_push(
            commtap,
            &root_addr,
            &[
                "--daemons".into(),
                relays.to_string(),
                "--nodes".into(),
                NODES_PER_RELAY.to_string(),
                "--interval".into(),
                interval.clone(),
                "--seconds".into(),
                ROOT_SECONDS.to_string(),
            ],
        )?;
        if root.0.try_wait()?.is_some() {
            bail!("the root died under {relays} relays");
        }
        levels.push(format!(
            "{{\"pushers\": {pushes}, {}}}",
            spent("root", pid, cpu, wall, &root_db)?
        ));
    }
    Ok(format!("[{}]", levels.join(", ")))
}
