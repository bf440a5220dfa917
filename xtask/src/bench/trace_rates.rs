//! What taking a trace of a running job costs the node daemon and an aggregator that
//! relays it: calls written per second, calls lost, and their memory.
//!
//! A 2-rank Open MPI job makes 8-byte MPI_Allreduce calls as fast as it can on this 2-core
//! machine; a daemon (mutual TLS on TCP, pushing to the aggregator) watches it. The same
//! job is traced for a few seconds straight from the daemon's Unix socket, then relayed by
//! the aggregator (StreamJobEvents), the client asking only the aggregator.

use std::{
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{start_daemon, stop_daemon, trace_calls};
use crate::run as sh;

/// How long each trace is taken.
const TRACE_SECONDS: u64 = 5;

/// The job's id, as its ranks' environment says.
const JOB: &str = "benchtrace";

/// One line of JSON: per route, calls written per second and calls lost; the daemon's and
/// the aggregator's peak memory.
pub fn run(commtap: &Path, out: &Path) -> Result<String> {
    let dir = out.join("trace-rates");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    certificates(&dir)?;
    let path = |name: &str| dir.join(name).display().to_string();
    let (agg_addr, node_addr) = (free_address()?, free_address()?);
    let mut aggregator = Guard(
        Command::new(commtap)
            .args([
                "--tls-ca",
                &path("ca.pem"),
                "aggregator",
                "--listen",
                &agg_addr,
            ])
            .args([
                "--db",
                &path("agg.redb"),
                "--tls-cert",
                &path("aggregator.pem"),
            ])
            .args(["--tls-key", &path("aggregator.key")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the aggregator")?,
    );
    wait_until("the aggregator to listen", || {
        std::net::TcpStream::connect(&agg_addr).is_ok()
    })?;
    let socket = dir.join("daemon.sock");
    let daemon = start_daemon(
        commtap,
        &socket,
        &[
            "--tls-ca",
            &path("ca.pem"),
            "--tls-cert",
            &path("node.pem"),
            "--tls-key",
            &path("node.key"),
        ],
        &[
            "--listen",
            &node_addr,
            "--tls-client-ca",
            &path("ca.pem"),
            "--advertise",
            &format!("https://{node_addr}"),
            "--aggregator",
            &format!("https://{agg_addr}"),
            "--push-interval",
            "200ms",
        ],
    )?;
    let daemon_pid = daemon.id();
    let mut daemon = Some(daemon);
    let result = (|| -> Result<String> {
        let _job = Guard(
            Command::new("mpirun.openmpi")
                .args(["--oversubscribe", "-np", "2"])
                .arg(out.join("bench_calls.openmpi"))
                // More calls than the traces take: it is stopped when they are done.
                .arg("1000000000")
                .env("SLURM_JOB_ID", JOB)
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting the job")?,
        );
        let agg_url = format!("https://{agg_addr}");
        let tls = ["--tls-ca".to_string(), path("ca.pem")];
        wait_until("the aggregator to know the job and its node", || {
            let o = Command::new(commtap)
                .args(&tls)
                .args(["jobs", "--json", "--from", &agg_url])
                .output();
            o.ok()
                .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
                .is_some_and(|v| {
                    v["node_api"].as_object().is_some_and(|m| m.len() == 1)
                        && v["jobs"]
                            .as_array()
                            .is_some_and(|j| j.iter().any(|j| j["job"] == JOB))
                })
        })?;
        // Peaks before any trace: what the traces add is the difference.
        let before = (peak_rss_mib(daemon_pid)?, peak_rss_mib(aggregator.0.id())?);
        let from_daemon = take_trace(
            commtap,
            &[],
            &format!("unix://{}", socket.display()),
            &dir.join("daemon.json"),
        )?;
        let relayed = take_trace(commtap, &tls, &agg_url, &dir.join("relayed.json"))?;
        let daemon_mib = peak_rss_mib(daemon_pid)?;
        let aggregator_mib = peak_rss_mib(aggregator.0.id())?;
        Ok(format!(
            "{{\"seconds_each\": {TRACE_SECONDS}, \"from_daemon\": {from_daemon}, \"relayed_by_aggregator\": {relayed}, \
             \"daemon_peak_rss_mib\": {daemon_mib:.1}, \"daemon_peak_rss_mib_before\": {:.1}, \
             \"aggregator_peak_rss_mib\": {aggregator_mib:.1}, \"aggregator_peak_rss_mib_before\": {:.1}}}",
            before.0, before.1
        ))
    })();
    if let Some(d) = daemon.take() {
        stop_daemon(d);
    }
    let _ = aggregator.0.kill();
    result
}

/// Takes a trace of the job from `from` for [`TRACE_SECONDS`]: calls written per second,
/// and calls lost (the trace's metadata).
fn take_trace(commtap: &Path, global: &[String], from: &str, file: &Path) -> Result<String> {
    let start = Instant::now();
    let o = Command::new(commtap)
        .args(global)
        .args(["trace", "--from", from, "--job", JOB])
        .args(["--duration", &format!("{TRACE_SECONDS}s"), "-o"])
        .arg(file)
        .output()
        .context("commtap trace")?;
    if !o.status.success() {
        bail!(
            "commtap trace --from {from}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let wall = start.elapsed().as_secs_f64();
    let calls = trace_calls(file)?;
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(file)?)?;
    let lost: u64 = v["metadata"]["commtap"]["calls_lost"]
        .as_object()
        .context("calls_lost in the trace's metadata")?
        .values()
        .filter_map(serde_json::Value::as_u64)
        .sum();
    Ok(format!(
        "{{\"calls_written\": {calls}, \"calls_per_second\": {:.0}, \"calls_lost\": {lost}, \"client_seconds\": {wall:.1}}}",
        calls as f64 / TRACE_SECONDS as f64
    ))
}

/// A CA, and certificates (for 127.0.0.1, client and server use) for the node and the
/// aggregator, in `dir`.
fn certificates(dir: &Path) -> Result<()> {
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth,serverAuth\n",
    )?;
    let openssl = |args: &[&str]| {
        sh(Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null()))
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=commtap-bench-ca",
    ])?;
    for name in ["node", "aggregator"] {
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ])?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ])?;
    }
    Ok(())
}

/// A free TCP address on 127.0.0.1.
pub(super) fn free_address() -> Result<String> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string())
}

/// Polls `ready` until it holds, for a minute at most.
pub(super) fn wait_until(what: &str, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_mins(1);
    while !ready() {
        if Instant::now() > deadline {
            bail!("waited a minute for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// A process's peak resident memory (VmHWM), MiB.
pub(super) fn peak_rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmHWM")?;
    Ok(kib / 1024.0)
}

/// A child killed when dropped (a job or server left behind would skew what follows).
pub(super) struct Guard(pub(super) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: kill(2) of a child we spawned; mpirun passes SIGTERM on to its ranks.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}
