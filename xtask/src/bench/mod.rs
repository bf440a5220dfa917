//! `cargo xtask bench`: what commtap's probes cost per MPI call, measured in one run.
//!
//! For Open MPI and MPICH, a 2-rank program times 8-byte MPI_Allreduce calls and 8-byte
//! MPI_Send/MPI_Recv round trips itself (start-up excluded) under
//!   (a) no probes,
//!   (b) a bare uprobe + uretprobe pair with empty programs on the same functions
//!       (bpftrace), the floor any uprobe-based tool pays,
//!   (c) commtap record --no-skew --time-every-call (counting only),
//!   (d) commtap record --trace (a timeline of every call written to a file),
//!   (e) commtap record (the default: counting, and who is late's events for the
//!       collective instances every rank draws: all of a communicator's first 1,024,
//!       then one in 2 to 64),
//!   (f) (d) into Perfetto's protobuf format (`--trace FILE.pftrace`),
//!   (g) (a) while a daemon that does not watch the job runs (uprobe sessions: entries
//!       only), and (h) the same with entry and return probes,
//!   (i) (c) with time sampled one call in 64 (`--time-one-in 64`: the calls not drawn
//!       pay an entry only),
//!   (j) (g) with the daemon limited to a cgroup the job is not in (`--cgroup`, a cgroup
//!       v1 directory where the host has the freezer's v1 hierarchy, as Slurm's jobs), the
//!       job 5 levels deep in that hierarchy, as a Slurm task is,
//!   (l) the smallest bpftrace script that times every call of the same functions (the
//!       start by thread at the entry, a latency histogram at the return): what timing
//!       each call costs a hand-written tool, beside (c).
//! Runs are interleaved (a, b, c, d, e, f, a, b, ...) and medians taken, because the
//! machines are shared and noisy; the figures to quote are the ratio (c - a) / (b - a),
//! what tracing adds per call, (d - c) and (f - c), and what matching collectives adds,
//! (e - c), from one run.

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::run as sh;

mod aggregator_load;
mod trace_rates;

const ROUNDS: usize = 15;
const ITERATIONS: &str = "150000";

#[derive(Clone, Copy)]
struct Stack {
    name: &'static str,
    suffix: &'static str,
    library: &'static str,
    launcher: &'static [&'static str],
    /// The transport library beneath the MPI whose operations commtap probes too, and the
    /// ones this MPI's Allreduce, Send and Recv make (for (k): bare probes on all of them).
    transport: Option<(&'static str, &'static [&'static str])>,
}

const STACKS: &[Stack] = &[
    Stack {
        name: "Open MPI 4.1",
        suffix: "openmpi",
        library: "/usr/lib/x86_64-linux-gnu/libmpi.so.40",
        launcher: &["mpirun.openmpi", "--oversubscribe", "-np", "2"],
        // ob1: its own shared memory, beneath anything probed.
        transport: None,
    },
    Stack {
        name: "MPICH 4.0",
        suffix: "mpich",
        library: "/usr/lib/x86_64-linux-gnu/libmpich.so.12",
        // Ranks bound to cores as Open MPI's mpirun does by default: fewer migrations,
        // less run-to-run noise (the same for (a), (b) and (c)).
        launcher: &["mpiexec.mpich", "-bind-to", "core", "-n", "2"],
        // ch4:ucx: each Send and Recv makes one UCX operation, each 2-rank Allreduce two.
        transport: Some((
            "/lib/x86_64-linux-gnu/libucp.so.0",
            &["ucp_tag_send_nbx", "ucp_tag_recv_nbx"],
        )),
    },
];

/// ns per call for (allreduce, ping-pong round trip).
type Sample = (f64, f64);

/// The MPI routines the per-call program's calls enter, which (b) and (l) probe.
const PER_CALL_ROUTINES: [&str; 3] = ["MPI_Allreduce", "MPI_Send", "MPI_Recv"];

/// The calls a [`Sample`] holds, as the report names them, with their index in it.
const CALLS: [(&str, usize); 2] = [("MPI_Allreduce 8 B", 0), ("Send/Recv round trip 8 B", 1)];

/// The parts of the benchmark, as `--only` names them.
pub const SECTIONS: [&str; 11] = [
    "per-call",
    "call-sites",
    "call-rate",
    "daemon",
    "trace-rates",
    "startup",
    "lammps",
    "aggregator",
    "aggregator-load",
    "aggregator-tree",
    "matching",
];

/// Rounds for every part that repeats, where `--rounds` asked (else each part's own).
static ROUNDS_WANTED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// The rounds of a part whose own number is `default`.
fn rounds(default: usize) -> usize {
    ROUNDS_WANTED.get().copied().unwrap_or(default)
}

/// Runs the benchmark (the `only` sections, or all) and writes
/// `target/bench/probe_overhead.{txt,json}` (with `only`, `target/bench/SECTION....{txt,json}`,
/// so that a partial run leaves the full figures alone).
pub fn run(root: &Path, only: &[String], rounds_wanted: Option<usize>) -> Result<()> {
    if let Some(n) = rounds_wanted {
        if n == 0 {
            bail!("--rounds must be at least 1");
        }
        let _ = ROUNDS_WANTED.set(n);
    }
    if let Some(unknown) = only.iter().find(|o| !SECTIONS.contains(&o.as_str())) {
        bail!(
            "no bench section {unknown:?}: the sections are {}",
            SECTIONS.join(", ")
        );
    }
    let want = |section: &str| only.is_empty() || only.iter().any(|o| o == section);
    ensure_bpftrace()?;
    sh(Command::new("cargo")
        .current_dir(root)
        .args(["build", "--release", "-p", "collector"]))?;
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    let commtap = root.join("target/release/commtap");

    let mut report = String::new();
    let mut json = Vec::new();
    for stack in STACKS {
        sh(Command::new(format!("mpicc.{}", stack.suffix))
            .args(["-O2", "-o"])
            .arg(out.join(format!("bench_calls.{}", stack.suffix)))
            .arg(root.join("xtask/demo/bench_calls.c")))?;
    }
    if want("per-call") {
        let _ = writeln!(report, "commtap probe overhead, ns per call (median of {} interleaved runs, {ITERATIONS} calls each)", rounds(ROUNDS));
        let _ = writeln!(report, "(a) no probes, (b) bare uprobe+uretprobe with empty programs (bpftrace), (c) commtap record --no-skew, (d) commtap record --trace (JSON), (e) commtap record (who is late: an event per drawn collective instance), (f) commtap record --trace FILE.pftrace\n");
        for stack in STACKS {
            let bin = out.join(format!("bench_calls.{}", stack.suffix));
            let rounds = Rounds::run(stack, &bin, &commtap, &out)?;
            let single = single_stepped(&rounds.profile, stack.library)?;
            rounds.write(stack, single, &mut report, &mut json);
        }
    }
    if want("call-sites") {
        let sites = call_sites(&commtap, &out)?;
        let _ = writeln!(
            report,
            "call sites (median of {} interleaved rounds, {ITERATIONS} calls each): ns per \
             call under (c) record --no-skew --time-every-call --probe-stats and (n) the same \
             with --call-sites, and the kernel's mean ns per run of the session program under \
             each (a call is two runs: its entry and its return): {sites}",
            rounds(CALL_SITES_ROUNDS)
        );
        json.push(format!("  {{\"call_sites\": [{sites}]}}"));
    }
    if want("call-rate") {
        // What a polling code pays: commtap against the cheapest bpftrace script.
        let rate = call_rate(root, &commtap, &out)?;
        let _ = writeln!(
            report,
            "call-rate program (per rank 1M MPI_Comm_rank, 1M MPI_Iprobe, 200k ping-pongs, 100k \
             MPI_Allreduce; 2 ranks), seconds, median of {}; added_ratio = (commtap - \
             none) / (bpftrace - none), the issue's target at most 0.5; floor_added_ratio: the \
             same for bpftrace counting the five routines at their entries alone (no return, \
             no time), the least any exact count by uprobes adds; timed_calls_by_default: per \
             routine, the calls commtap's default run timed (both ranks; the rest counted at \
             their entry); over a transport (MPICH's UCX), no_transports_added_ratio: \
             commtap probing MPI alone (`--no-transports`), as the bpftrace scripts do: {rate}",
            rounds(RATE_ROUNDS)
        );
        json.push(format!("  {{\"call_rate\": [{rate}]}}"));
    }
    if want("daemon") {
        // The node daemon's own CPU while a job makes MPI calls as fast as it can.
        let daemon = daemon_cpu(&commtap, &out)?;
        let _ = writeln!(report, "node daemon during a job: {daemon}");
        json.push(format!("  {{\"daemon\": {daemon}}}"));
    }
    if want("trace-rates") {
        let traces = trace_rates::run(&commtap, &out)?;
        let _ = writeln!(
            report,
            "a trace of a running job (2 ranks of MPI_Allreduce as fast as they go), from the \
             node daemon and relayed by an aggregator: {traces}"
        );
        json.push(format!("  {{\"trace_rates\": {traces}}}"));
    }
    if want("lammps") {
        let lammps = lammps(&commtap, root, &out)?;
        let _ = writeln!(report, "LAMMPS (4 ranks) under the node daemon: {lammps}");
        json.push(format!("  {{\"lammps\": {lammps}}}"));
    }
    if want("startup") {
        let startup = startup(&commtap, &out)?;
        let _ = writeln!(
            report,
            "start-up, s (median of {}, interleaved; commtap with no controlling \
             terminal, as from a prolog or a batch script): {startup}",
            rounds(STARTUP_ROUNDS)
        );
        json.push(format!("  {{\"startup\": {startup}}}"));
    }
    if want("matching") {
        let matching = matching(&commtap)?;
        let _ = writeln!(
            report,
            "who is late's matching in the daemon (or record), per call event, ns (median of 5 \
             rounds; a job of 2, 8 and 64 ranks making 8-byte MPI_Allreduce): {matching}"
        );
        json.push(format!("  {{\"matching\": [{matching}]}}"));
    }
    if want("aggregator") {
        let agg = aggregator_merge(&commtap, &out)?;
        let _ = writeln!(
            report,
            "aggregator merge (target: under 2 s and 1 GiB): {agg}"
        );
        json.push(format!("  {{\"aggregator_merge\": {agg}}}"));
    }
    if want("aggregator-load") {
        let load = aggregator_load::run(&commtap, &out)?;
        let _ = writeln!(
            report,
            "aggregator under simulated daemons (8 ranks each, a push every second, {} s per \
             level; latency: pushed to merged and durable): {load}",
            aggregator_load::SECONDS_EACH
        );
        json.push(format!("  {{\"aggregator_load\": {load}}}"));
    }
    if want("aggregator-tree") {
        let tree = aggregator_load::run_tree(&commtap, &out)?;
        let _ = writeln!(
            report,
            "a tree of aggregators (relays push upstream every {} s, only what changed): a real \
             relay under {} simulated daemons ({} s), then the root under simulated relays of {} \
             nodes of 8 ranks ({} s per level): {tree}",
            aggregator_load::RELAY_INTERVAL_S,
            aggregator_load::NODES_PER_RELAY,
            aggregator_load::SECONDS_EACH,
            aggregator_load::NODES_PER_RELAY,
            aggregator_load::ROOT_SECONDS
        );
        json.push(format!("  {{\"aggregator_tree\": {tree}}}"));
    }
    print!("{report}");
    let name = if only.is_empty() {
        "probe_overhead".to_string()
    } else {
        only.join("+")
    };
    std::fs::write(out.join(format!("{name}.txt")), &report)?;
    std::fs::write(
        out.join(format!("{name}.json")),
        format!("[\n{}\n]\n", json.join(",\n")),
    )?;
    eprintln!(
        "figures written to {}",
        out.join(format!("{name}.txt")).display()
    );
    Ok(())
}

/// Rounds of the start-up measurements.
const STARTUP_ROUNDS: usize = 7;

/// Seconds from start to exit, run without a controlling terminal (`setsid -w`): what a job
/// prolog or a batch script pays.
fn startup_seconds(cmd: &mut Command) -> Result<f64> {
    let started = Instant::now();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    let secs = started.elapsed().as_secs_f64();
    if !status.success() && status.code() != Some(2) {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(secs)
}

/// `job` under `setsid -w` (no controlling terminal), after `prefix` (commtap and its
/// arguments, or nothing).
fn detached(prefix: &[&std::ffi::OsStr], job: &Command) -> Command {
    let mut cmd = Command::new("setsid");
    cmd.arg("-w")
        .args(prefix)
        .arg(job.get_program())
        .args(job.get_args())
        .envs(job.get_envs().filter_map(|(k, v)| Some((k, v?))));
    cmd
}

/// What starting commtap costs: `record -- true` (nothing to probe: the process is
/// paused at its libraries' load, none is MPI), the same with `--no-pause-at-load` (every
/// MPI library of the system probed first, each ABI's programs verified), and a 2-rank MPI
/// job of 10 calls alone and under `record` (the job's one MPI flavour verified while
/// its ranks wait paused).
fn startup(commtap: &Path, out: &Path) -> Result<String> {
    fn record<'a>(commtap: &'a Path, args: &'a [&'static str]) -> Vec<&'a std::ffi::OsStr> {
        let mut v = vec![commtap.as_os_str(), "record".as_ref()];
        v.extend(args.iter().map(std::ffi::OsStr::new));
        v.push("--".as_ref());
        v
    }
    let true_cmd = Command::new("true");
    let mut rows: Vec<(String, Vec<f64>)> = vec![
        ("record -- true".into(), Vec::new()),
        ("record --no-pause-at-load -- true".into(), Vec::new()),
    ];
    for stack in STACKS {
        rows.push((format!("{} job of 10 calls alone", stack.name), Vec::new()));
        rows.push((
            format!("{} job under record --no-skew", stack.name),
            Vec::new(),
        ));
    }
    for _ in 0..rounds(STARTUP_ROUNDS) {
        rows[0].1.push(startup_seconds(&mut detached(
            &record(commtap, &[]),
            &true_cmd,
        ))?);
        rows[1].1.push(startup_seconds(&mut detached(
            &record(commtap, &["--no-pause-at-load"]),
            &true_cmd,
        ))?);
        for (i, stack) in STACKS.iter().enumerate() {
            let bin = out.join(format!("bench_calls.{}", stack.suffix));
            let job = mpi_command_args(stack, &bin, &["10"]);
            rows[2 + 2 * i]
                .1
                .push(startup_seconds(&mut detached(&[], &job))?);
            rows[3 + 2 * i].1.push(startup_seconds(&mut detached(
                &record(commtap, &["--no-skew"]),
                &job,
            ))?);
        }
    }
    let cells: Vec<String> = rows
        .iter_mut()
        .map(|(what, v)| {
            v.sort_by(f64::total_cmp);
            format!(
                "{{\"what\": \"{what}\", \"median_s\": {:.3}, \"min_s\": {:.3}, \"max_s\": {:.3}}}",
                v[v.len() / 2],
                v[0],
                v[v.len() - 1]
            )
        })
        .collect();
    Ok(format!("[{}]", cells.join(", ")))
}

/// Installs bpftrace (the bare-probe floor, (b)) if it is missing.
fn ensure_bpftrace() -> Result<()> {
    if Command::new("bpftrace")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    sh(Command::new("apt-get")
        .args([
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "bpftrace",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// One stack's interleaved rounds: a sample per round for each of (a) to (e).
struct Rounds {
    a: Vec<Sample>,
    b: Vec<Sample>,
    c: Vec<Sample>,
    d: Vec<Sample>,
    e: Vec<Sample>,
    /// (d) with Perfetto's protobuf format.
    f: Vec<Sample>,
    /// (a) while a daemon that does not watch the job runs: uprobe sessions.
    g: Vec<Sample>,
    /// (g) with entry and return probes (`COMMTAP_UPROBE_SESSIONS=0`).
    h: Vec<Sample>,
    /// (c) with the time of every routine that may be sampled timed one call in 64.
    i: Vec<Sample>,
    /// (g) with the daemon limited to a cgroup the job is not in.
    j: Vec<Sample>,
    /// (b) with bare probes on the transport's operations beneath the MPI calls too (what
    /// commtap probes on the same path), for stacks with a transport.
    k: Vec<Sample>,
    /// (b) with each call timed by bpftrace ([`timing_script`]).
    l: Vec<Sample>,
    /// Empty entry probes alone (bpftrace) on what (g) pays an entry for: the MPI routines
    /// and, for stacks with a transport, its operations.
    m: Vec<Sample>,
    /// The last traced run: (calls written, bytes on disk, seconds).
    traced: (u64, u64, f64),
    /// The last `.pftrace`'s bytes on disk (the same calls).
    pftrace_bytes: u64,
    /// The profile the last commtap run wrote.
    profile: PathBuf,
}

impl Rounds {
    /// Runs (a) to (j) in turn, `ROUNDS` times (or `--rounds`).
    fn run(stack: &Stack, bin: &Path, commtap: &Path, out: &Path) -> Result<Rounds> {
        let profile = out.join(format!("profile.{}.json", stack.suffix));
        let trace = out.join(format!("trace.{}.json", stack.suffix));
        let pftrace = out.join(format!("trace.{}.pftrace", stack.suffix));
        let mut r = Rounds {
            a: Vec::new(),
            b: Vec::new(),
            c: Vec::new(),
            d: Vec::new(),
            e: Vec::new(),
            f: Vec::new(),
            g: Vec::new(),
            h: Vec::new(),
            i: Vec::new(),
            j: Vec::new(),
            k: Vec::new(),
            l: Vec::new(),
            m: Vec::new(),
            traced: (0, 0, 0.0),
            pftrace_bytes: 0,
            profile,
        };
        let n = rounds(ROUNDS);
        for round in 0..n {
            eprintln!("{}: round {}/{n}", stack.name, round + 1);
            r.a.push(plain(stack, bin)?);
            r.b.push(under_bpftrace(stack, bin, false, true)?);
            if stack.transport.is_some() {
                r.k.push(under_bpftrace(stack, bin, true, true)?);
            }
            r.l.push(timed_by_bpftrace(stack, bin)?);
            r.c.push(under_commtap(
                stack,
                bin,
                commtap,
                &r.profile,
                Mode::Counting,
            )?);
            let started = Instant::now();
            r.d.push(under_commtap(
                stack,
                bin,
                commtap,
                &r.profile,
                Mode::Trace(&trace),
            )?);
            let secs = started.elapsed().as_secs_f64();
            r.traced = (trace_calls(&trace)?, std::fs::metadata(&trace)?.len(), secs);
            r.e.push(under_commtap(stack, bin, commtap, &r.profile, Mode::Skew)?);
            r.f.push(under_commtap(
                stack,
                bin,
                commtap,
                &r.profile,
                Mode::Trace(&pftrace),
            )?);
            r.pftrace_bytes = std::fs::metadata(&pftrace)?.len();
            let other_uid = ["--uid", "65534"];
            r.g.push(unwatched(stack, bin, commtap, out, &other_uid, true)?);
            r.h.push(unwatched(stack, bin, commtap, out, &other_uid, false)?);
            let cgroup = bench_cgroup()?;
            let other_cgroup = ["--cgroup", cgroup.to_str().context("cgroup path")?];
            r.j.push(unwatched(stack, bin, commtap, out, &other_cgroup, true)?);
            r.m.push(under_bpftrace(stack, bin, true, false)?);
            r.i.push(under_commtap(
                stack,
                bin,
                commtap,
                &r.profile,
                Mode::Sampled,
            )?);
        }
        Ok(r)
    }

    /// Writes the stack's table rows and JSON lines; `single` is (probes moved past a
    /// single-stepped first instruction, probes still single-stepped).
    fn write(
        &self,
        stack: &Stack,
        single: (String, String),
        report: &mut String,
        json: &mut Vec<String>,
    ) {
        let (ma, mb, mc, md, me, mf) = (
            median(&self.a),
            median(&self.b),
            median(&self.c),
            median(&self.d),
            median(&self.e),
            median(&self.f),
        );
        let _ = writeln!(report, "{} ({})", stack.name, stack.library);
        let _ = writeln!(
            report,
            "  {:<28}{:>12}{:>12}{:>12}{:>14}{:>26}{:>12}{:>10}{:>12}{:>10}{:>12}{:>10}",
            "",
            "(a) none",
            "(b) bare",
            "(c) commtap",
            "(c-a)/(b-a)",
            "per round: median [IQR]",
            "(d) --trace",
            "(d-c)",
            "(e) skew",
            "(e-c)",
            "(f) pftrace",
            "(f-c)"
        );
        for (label, pick) in CALLS {
            let (x, y, z) = (get(ma, pick), get(mb, pick), get(mc, pick));
            // The same ratio within each round (a, b and c run back to back there), which
            // shows how far the machine's load moves it.
            let mut per_round: Vec<f64> = (0..self.a.len())
                .map(|r| {
                    ratio(
                        get(self.a[r], pick),
                        get(self.b[r], pick),
                        get(self.c[r], pick),
                    )
                })
                .collect();
            per_round.sort_by(f64::total_cmp);
            let q = |f: f64| per_round[((per_round.len() - 1) as f64 * f).round() as usize];
            let (t, k, p) = (get(md, pick), get(me, pick), get(mf, pick));
            let _ = writeln!(
                report,
                "  {label:<28}{x:>12.0}{y:>12.0}{z:>12.0}{:>14.2}{:>26}{t:>12.0}{:>10.0}{k:>12.0}{:>10.0}{p:>12.0}{:>10.0}",
                ratio(x, y, z),
                format!("{:.2} [{:.2}-{:.2}]", q(0.5), q(0.25), q(0.75)),
                t - z,
                k - z,
                p - z
            );
            json.push(serde_json_line(stack.name, label, x, y, z, q(0.5)));
        }
        let mi = median(&self.i);
        if let Some((lib, functions)) = stack.transport.filter(|_| !self.k.is_empty()) {
            let mk = median(&self.k);
            for (label, pick) in CALLS {
                let (a, c, k, i) = (get(ma, pick), get(mc, pick), get(mk, pick), get(mi, pick));
                let _ = writeln!(
                    report,
                    "  {label}, (k) bare probes on what commtap probes on this path, the MPI \
                     routine and the operations it makes in {lib} ({}): {k:.0} ns, (c-a)/(k-a) \
                     {:.2}, (i-a)/(k-a) {:.2}",
                    functions.join(", "),
                    ratio(a, k, c),
                    ratio(a, k, i)
                );
                json.push(format!(
                    "  {{\"stack\": \"{}\", \"call\": \"{label}\", \"bare_with_transport_ns\": {k:.1}, \"ratio_to_bare_with_transport\": {:.3}, \"sampled_ratio_to_bare_with_transport\": {:.3}}}",
                    stack.name,
                    ratio(a, k, c),
                    ratio(a, k, i)
                ));
            }
        }
        for (label, pick, what) in [
            ("MPI_Allreduce 8 B", 0usize, "every call"),
            (
                "Send/Recv round trip 8 B",
                1,
                "MPI_Send's (MPI_Recv's return carries its status: timed)",
            ),
        ] {
            let (a, b, i) = (get(ma, pick), get(mb, pick), get(mi, pick));
            let _ = writeln!(
                report,
                "  {label}, (i) time sampled one call in 64 ({what}): {i:.0} ns, (i-a)/(b-a) \
                 {:.2}",
                ratio(a, b, i)
            );
            json.push(format!(
                "  {{\"stack\": \"{}\", \"call\": \"{label}\", \"sampled_ns\": {i:.1}, \"sampled_ratio\": {:.3}}}",
                stack.name,
                ratio(a, b, i)
            ));
        }
        let ml = median(&self.l);
        for (label, pick) in CALLS {
            let (a, b, c, l) = (get(ma, pick), get(mb, pick), get(mc, pick), get(ml, pick));
            let _ = writeln!(
                report,
                "  {label}, (l) bpftrace timing every call (the start by thread at the entry, \
                 a latency histogram at the return): {l:.0} ns, (l-a)/(b-a) {:.2}; commtap \
                 timing every call adds (c-a)/(l-a) {:.2} of what it adds",
                ratio(a, b, l),
                ratio(a, l, c)
            );
            json.push(format!(
                "  {{\"stack\": \"{}\", \"call\": \"{label}\", \"bpftrace_timed_ns\": {l:.1}, \"bpftrace_timed_ratio\": {:.3}, \"commtap_to_bpftrace_timed\": {:.3}}}",
                stack.name,
                ratio(a, b, l),
                ratio(a, l, c)
            ));
        }
        let (mg, mh, mj, mm) = (
            median(&self.g),
            median(&self.h),
            median(&self.j),
            median(&self.m),
        );
        for (label, pick) in CALLS {
            let (a, g, h, j) = (get(ma, pick), get(mg, pick), get(mh, pick), get(mj, pick));
            let m = get(mm, pick);
            let _ = writeln!(
                report,
                "  {label}, a job commtap does not watch (a daemon scoped to another uid): \
                 (g) uprobe sessions {g:.0} ns (+{:.0} over none), (h) entry and return \
                 probes {h:.0} ns (+{:.0}); (j) a daemon limited to another cgroup {j:.0} ns \
                 (+{:.0}); (m) bpftrace's empty entry probes on the same functions {m:.0} ns \
                 (+{:.0}): (g-a)/(m-a) {:.2}, (j-a)/(m-a) {:.2}",
                g - a,
                h - a,
                j - a,
                m - a,
                ratio(a, m, g),
                ratio(a, m, j)
            );
            json.push(format!(
                "  {{\"stack\": \"{}\", \"call\": \"{label}\", \"unwatched_sessions_ns\": {g:.1}, \"unwatched_entry_return_ns\": {h:.1}, \"unwatched_other_cgroup_ns\": {j:.1}, \"bare_entries_ns\": {m:.1}, \"unwatched_to_bare_entries\": {:.3}, \"none_ns\": {a:.1}}}",
                stack.name,
                ratio(a, m, g)
            ));
        }
        let (calls, bytes, secs) = self.traced;
        let _ = writeln!(
            report,
            "  last traced run: {calls} calls written in {secs:.1} s (job start-up included: \
             {:.0} calls/s at least), {:.0} bytes per call on disk ({:.0} in a .pftrace)",
            calls as f64 / secs,
            bytes as f64 / calls.max(1) as f64,
            self.pftrace_bytes as f64 / calls.max(1) as f64
        );
        let _ = writeln!(
            report,
            "  probes moved past a single-stepped first instruction: {}",
            single.0
        );
        let _ = writeln!(
            report,
            "  probes still single-stepped (about ten times dearer): {}\n",
            single.1
        );
    }
}

/// Runs `commtap ARGS` (one of its hidden bench commands) and returns the line of JSON it
/// prints.
pub(crate) fn commtap_line<S: AsRef<std::ffi::OsStr>>(
    commtap: &Path,
    args: &[S],
) -> Result<String> {
    let what = args
        .first()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .unwrap_or_default();
    let o = Command::new(commtap)
        .args(args)
        .output()
        .with_context(|| format!("running commtap {what}"))?;
    if !o.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Who is late's matching, per call event (`commtap bench-matching`, one line of JSON per
/// job size, joined by commas).
fn matching(commtap: &Path) -> Result<String> {
    let lines = [2, 8, 64].map(|ranks| {
        let instances = if ranks > 8 { "20000" } else { "100000" };
        commtap_line(
            commtap,
            &[
                "bench-matching",
                "--ranks",
                &ranks.to_string(),
                "--instances",
                instances,
            ],
        )
    });
    Ok(lines.into_iter().collect::<Result<Vec<_>>>()?.join(", "))
}

/// The aggregator's merge: 100 daemons x 100 ranks x 50 routines x 32 buckets (one line of
/// JSON from `commtap bench-aggregator`).
fn aggregator_merge(commtap: &Path, out: &Path) -> Result<String> {
    let db = out.join("bench-aggregator.redb");
    commtap_line(
        commtap,
        &["bench-aggregator".as_ref(), "--db".as_ref(), db.as_os_str()],
    )
}

fn get(s: Sample, i: usize) -> f64 {
    if i == 0 {
        s.0
    } else {
        s.1
    }
}

fn ratio(a: f64, b: f64, c: f64) -> f64 {
    (c - a) / (b - a)
}

fn serde_json_line(stack: &str, what: &str, a: f64, b: f64, c: f64, per_round: f64) -> String {
    format!(
        "  {{\"stack\": \"{stack}\", \"call\": \"{what}\", \"none_ns\": {a:.1}, \"bare_uprobe_ns\": {b:.1}, \"commtap_ns\": {c:.1}, \"ratio\": {:.3}, \"per_round_median_ratio\": {per_round:.3}}}",
        ratio(a, b, c)
    )
}

fn median(v: &[Sample]) -> Sample {
    let med = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    (
        med(v.iter().map(|s| s.0).collect()),
        med(v.iter().map(|s| s.1).collect()),
    )
}

fn mpi_command(stack: &Stack, bin: &Path) -> Command {
    mpi_command_args(stack, bin, &[ITERATIONS])
}

/// `bin` with `args` under the stack's launcher, 2 ranks.
fn mpi_command_args(stack: &Stack, bin: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(stack.launcher[0]);
    cmd.args(&stack.launcher[1..])
        .arg(bin)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd
}

/// Parses the program's `allreduce_ns=X pingpong_ns=Y` line.
fn parse(stdout: &str) -> Result<Sample> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("allreduce_ns="))
        .context("no result line")?;
    let mut it = line
        .split_whitespace()
        .map(|kv| kv.split_once('=').map(|(_, v)| v.parse::<f64>()));
    match (it.next(), it.next()) {
        (Some(Some(Ok(a))), Some(Some(Ok(p)))) => Ok((a, p)),
        _ => bail!("unparsable result line {line:?}"),
    }
}

fn plain(stack: &Stack, bin: &Path) -> Result<Sample> {
    let out = mpi_command(stack, bin).output()?;
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// (b), (k) and (m): the per-call program under bpftrace's empty probes on its MPI
/// routines (and the transport's operations, `with_transport`), at their entries and, with
/// `returns`, their returns.
fn under_bpftrace(
    stack: &Stack,
    bin: &Path,
    with_transport: bool,
    returns: bool,
) -> Result<Sample> {
    let mut probed = vec![(
        std::fs::canonicalize(stack.library)?,
        &PER_CALL_ROUTINES[..],
    )];
    if let Some((lib, functions)) = stack.transport.filter(|_| with_transport) {
        probed.push((std::fs::canonicalize(lib)?, functions));
    }
    let mut script = String::new();
    for (lib, functions) in &probed {
        let lib = lib.display();
        for f in *functions {
            use std::fmt::Write as _;
            let _ = write!(script, "uprobe:{lib}:{f} {{}} ");
            if returns {
                let _ = write!(script, "uretprobe:{lib}:{f} {{}} ");
            }
        }
    }
    with_bpftrace(&script, || plain(stack, bin))
}

/// (l): the per-call program under bpftrace timing each call of the functions (b) probes.
fn timed_by_bpftrace(stack: &Stack, bin: &Path) -> Result<Sample> {
    let lib = std::fs::canonicalize(stack.library)?;
    let script = timing_script(&lib, &PER_CALL_ROUTINES);
    with_bpftrace(&script, || plain(stack, bin))
}

/// The cheapest bpftrace script that counts and times every call of `routines` in `lib`:
/// a count and the start (by thread) at the entry, a latency histogram at the return.
fn timing_script(lib: &Path, routines: &[&str]) -> String {
    format!(
        "{} {{ @start[tid] = nsecs; @calls[probe] = count(); }} \
         {} /@start[tid]/ {{ @ns[probe] = hist(nsecs - @start[tid]); delete(@start[tid]); }}",
        probes_on("uprobe", lib, routines),
        probes_on("uretprobe", lib, routines)
    )
}

/// bpftrace's probe list of `kind` (`uprobe`, `uretprobe`) on `routines` in `lib`.
fn probes_on(kind: &str, lib: &Path, routines: &[&str]) -> String {
    routines
        .iter()
        .map(|r| format!("{kind}:{}:{r}", lib.display()))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs `f` while bpftrace runs `script` (attached before, detached after).
fn with_bpftrace<T>(script: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut tracer = Command::new("bpftrace")
        .arg("-e")
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting bpftrace")?;
    // bpftrace prints "Attaching N probes..." once they are in place.
    let stdout = tracer.stdout.take().context("bpftrace stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("Attaching") => break,
            Some(Ok(_)) => {}
            _ => {
                let _ = tracer.kill();
                bail!("bpftrace did not attach");
            }
        }
        if Instant::now() > deadline {
            let _ = tracer.kill();
            bail!("bpftrace took too long to attach");
        }
    }
    let result = f();
    // SAFETY: kill(2) of the bpftrace we spawned; SIGINT makes it detach and exit (its
    // maps are printed into the pipe, drained here).
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    for _ in lines {}
    let _ = tracer.wait();
    result
}

/// Rounds of the call-rate workload.
const RATE_ROUNDS: usize = 5;

/// The call-rate workload (`bench_rate.c`: per rank 1M MPI_Comm_rank, 1M empty MPI_Iprobe,
/// 200k ping-pongs, 100k MPI_Allreduce) with no profiler, with the cheapest bpftrace script
/// a user would write for the same routines (entry and return: a count and a latency
/// histogram each), with the floor of any exact count (bpftrace counting at the entries
/// alone), and under `commtap record`; interleaved, medians. Checks that commtap's counts
/// are exact.
fn call_rate(root: &Path, commtap: &Path, out: &Path) -> Result<String> {
    let mut lines = Vec::new();
    for stack in STACKS {
        let bin = out.join(format!("bench_rate.{}", stack.suffix));
        sh(Command::new(format!("mpicc.{}", stack.suffix))
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(root.join("xtask/demo/bench_rate.c")))?;
        let lib = std::fs::canonicalize(stack.library)?;
        let routines = [
            "MPI_Comm_rank",
            "MPI_Iprobe",
            "MPI_Send",
            "MPI_Recv",
            "MPI_Allreduce",
        ];
        let script = timing_script(&lib, &routines);
        // The floor of any exact count by uprobes: an entry probe per call, a count, no
        // return, no time.
        let floor_script = format!(
            "{} {{ @calls[probe] = count(); }}",
            probes_on("uprobe", &lib, &routines)
        );
        let run = |cmd: &mut Command| -> Result<f64> {
            let o = cmd.output()?;
            if !o.status.success() {
                bail!("bench_rate failed: {}", String::from_utf8_lossy(&o.stderr));
            }
            let text = String::from_utf8_lossy(&o.stdout);
            text.lines()
                .find_map(|l| l.strip_prefix("rate_s="))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .context("no rate_s line")
        };
        let profile = out.join(format!("rate.{}.json", stack.suffix));
        let (mut none, mut bpf, mut floor, mut ours, mut every, mut mpi_only) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        // Per routine, the calls the default run timed (both ranks), one entry per round:
        // how quickly the budget thinned each of the program's phases.
        let mut timed: Vec<Vec<u64>> = vec![Vec::new(); routines.len()];
        let n = rounds(RATE_ROUNDS);
        for round in 0..n {
            eprintln!("{} call rate: round {}/{n}", stack.name, round + 1);
            none.push(run(&mut mpi_command_args(stack, &bin, &[]))?);
            bpf.push(with_bpftrace(&script, || {
                run(&mut mpi_command_args(stack, &bin, &[]))
            })?);
            floor.push(with_bpftrace(&floor_script, || {
                run(&mut mpi_command_args(stack, &bin, &[]))
            })?);
            // As it runs by default (its --max-overhead budget), then every call timed, then
            // (over a transport) probing MPI alone, as the bpftrace scripts do.
            let mut runs = vec![
                (&[][..], &mut ours),
                (&["--time-every-call"][..], &mut every),
            ];
            if stack.transport.is_some() {
                runs.push((&["--no-transports"][..], &mut mpi_only));
            }
            for (flags, into) in runs {
                let mut cmd = Command::new(commtap);
                cmd.args(["record", "--format", "json", "-o"])
                    .arg(&profile)
                    .args(flags)
                    .arg("--");
                let inner = mpi_command_args(stack, &bin, &[]);
                cmd.arg(inner.get_program()).args(inner.get_args());
                cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
                let by_default = flags.is_empty();
                into.push(run(&mut cmd)?);
                if !rate_counts_exact(&profile)? {
                    bail!(
                        "{} call rate: counts differ from the workload's",
                        stack.name
                    );
                }
                if by_default {
                    let calls = rate_timed_calls(&profile, &routines)?;
                    for (into, n) in timed.iter_mut().zip(calls) {
                        into.push(n);
                    }
                }
            }
        }
        let exact = rate_counts_exact(&profile)?;
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (n, b, f, c, e) = (med(none), med(bpf), med(floor), med(ours), med(every));
        // Over a transport: probing MPI alone (`--no-transports`), as the bpftrace scripts do.
        let mpi_only = if mpi_only.is_empty() {
            String::new()
        } else {
            let m = med(mpi_only);
            format!(
                ", \"commtap_no_transports_s\": {m:.3}, \"no_transports_added_ratio\": {:.2}",
                (m - n) / (b - n)
            )
        };
        let timed = routines
            .iter()
            .zip(timed)
            .map(|(name, mut v)| {
                v.sort_unstable();
                format!("\"{name}\": {}", v[v.len() / 2])
            })
            .collect::<Vec<_>>()
            .join(", ");
        lines.push(format!(
            "{{\"stack\": \"{}\", \"none_s\": {n:.3}, \"bpftrace_s\": {b:.3}, \"entry_count_floor_s\": {f:.3}, \"floor_added_ratio\": {:.2}, \"commtap_s\": {c:.3}, \"added_ratio\": {:.2}, \"commtap_every_call_timed_s\": {e:.3}, \"every_call_added_ratio\": {:.2}, \"counts_exact\": {exact}, \"timed_calls_by_default\": {{{timed}}}{mpi_only}}}",
            stack.name,
            (f - n) / (b - n),
            (c - n) / (b - n),
            (e - n) / (b - n)
        ));
    }
    Ok(lines.join(", "))
}

/// The calls of each of `routines` the call-rate profile's ranks timed: those its sampled
/// time was estimated from, or every call where it was not sampled.
fn rate_timed_calls(profile: &Path, routines: &[&str]) -> Result<Vec<u64>> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(profile)?)?;
    let ranks = v["ranks"].as_array().context("ranks")?;
    Ok(routines
        .iter()
        .map(|routine| {
            ranks
                .iter()
                .map(|r| {
                    let x = &r["routines"][routine];
                    x["sampled_time"]["timed_calls"]
                        .as_u64()
                        .or_else(|| x["calls"].as_u64())
                        .unwrap_or(0)
                })
                .sum()
        })
        .collect())
}

/// Whether every rank of the call-rate profile holds exactly the workload's calls.
fn rate_counts_exact(profile: &Path) -> Result<bool> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(profile)?)?;
    let ranks = v["ranks"].as_array().context("ranks")?;
    let want = [
        ("MPI_Comm_rank", 1_000_001),
        ("MPI_Iprobe", 1_000_000),
        ("MPI_Send", 200_000),
        ("MPI_Recv", 200_000),
        ("MPI_Allreduce", 100_000),
    ];
    Ok(ranks.len() == 2
        && ranks.iter().all(|r| {
            want.iter()
                .all(|(name, n)| r["routines"][name]["calls"].as_u64() == Some(*n))
        }))
}

/// Rounds of the call-site part.
const CALL_SITES_ROUNDS: usize = 7;

/// What counting calls per call site adds to a timed call, per stack: (c) `record --no-skew
/// --time-every-call` and (n) the same with `--call-sites`, interleaved, both with the
/// kernel's run-time statistics on (`--probe-stats`): the wall time per call, and the
/// kernel's own time per run of the session program (an entry's or a return's), which the
/// machine's load moves far less than a call's wall time.
fn call_sites(commtap: &Path, out: &Path) -> Result<String> {
    let mut lines = Vec::new();
    for stack in STACKS {
        let bin = out.join(format!("bench_calls.{}", stack.suffix));
        let profile = out.join(format!("sites.{}.json", stack.suffix));
        let program = format!(
            "sess_{}",
            if stack.suffix == "openmpi" {
                "ompi"
            } else {
                "mpich"
            }
        );
        let (mut c, mut n) = (Vec::new(), Vec::new());
        let rounds = rounds(CALL_SITES_ROUNDS);
        for round in 0..rounds {
            eprintln!("{} call sites: round {}/{rounds}", stack.name, round + 1);
            for (sites, into) in [(false, &mut c), (true, &mut n)] {
                into.push(timed_with_stats(
                    stack, &bin, commtap, &profile, sites, &program,
                )?);
            }
        }
        let med = |v: &[(Sample, f64)], f: &dyn Fn(&(Sample, f64)) -> f64| {
            let mut xs: Vec<f64> = v.iter().map(f).collect();
            xs.sort_by(f64::total_cmp);
            xs[xs.len() / 2]
        };
        let (pc, pn) = (med(&c, &|s| s.1), med(&n, &|s| s.1));
        for (what, i) in CALLS {
            let (wc, wn) = (med(&c, &|s| get(s.0, i)), med(&n, &|s| get(s.0, i)));
            lines.push(format!(
                "{{\"stack\": \"{}\", \"call\": \"{what}\", \"timed_ns\": {wc:.1}, \
                 \"call_sites_ns\": {wn:.1}, \"program_ns_per_run\": {pc:.1}, \
                 \"program_ns_per_run_with_sites\": {pn:.1}}}",
                stack.name
            ));
        }
    }
    Ok(lines.join(", "))
}

/// The per-call program under `record --no-skew --time-every-call --probe-stats` (and
/// `--call-sites`, with `sites`): its ns per call, and the kernel's mean ns per run of
/// `program`.
fn timed_with_stats(
    stack: &Stack,
    bin: &Path,
    commtap: &Path,
    profile: &Path,
    sites: bool,
    program: &str,
) -> Result<(Sample, f64)> {
    let mut cmd = Command::new(commtap);
    cmd.args(["--log", "info", "record", "--format", "json", "-o"])
        .arg(profile)
        .args(["--no-skew", "--time-every-call", "--probe-stats"]);
    if sites {
        cmd.arg("--call-sites");
    }
    let out = job_under(cmd, stack, bin)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let wanted = format!("program=\"{program}\"");
    let per_run = stderr
        .lines()
        .find(|l| l.contains("probe program cost") && l.contains(&wanted))
        .and_then(|l| l.split("ns_per_run=").nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .with_context(|| format!("no run statistics of {program} in:\n{stderr}"))?;
    Ok((parse(&String::from_utf8_lossy(&out.stdout))?, per_run))
}

/// What `record` is asked to do besides counting (every call timed, but in `Sampled`).
enum Mode<'a> {
    /// Nothing (`--no-skew`).
    Counting,
    /// Nothing, and the time of every routine that may be sampled timed one call in 64.
    Sampled,
    /// A timeline into this file.
    Trace(&'a Path),
    /// The default: who is late.
    Skew,
}

fn under_commtap(
    stack: &Stack,
    bin: &Path,
    commtap: &Path,
    profile: &Path,
    mode: Mode,
) -> Result<Sample> {
    let mut cmd = Command::new(commtap);
    cmd.args(["record", "--format", "json", "-o"]).arg(profile);
    match mode {
        Mode::Counting => {
            cmd.args(["--no-skew", "--time-every-call"]);
        }
        Mode::Sampled => {
            cmd.args(["--no-skew", "--time-one-in", "64"]);
        }
        Mode::Trace(trace) => {
            cmd.arg("--trace").arg(trace);
        }
        Mode::Skew => {
            cmd.arg("--time-every-call");
        }
    }
    let out = job_under(cmd, stack, bin)?;
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// Runs the per-call program as `-- LAUNCHER PROGRAM` of `commtap` (the command so far),
/// capturing both outputs (the program's stdout is commtap's child's); fails where commtap
/// did.
fn job_under(mut commtap: Command, stack: &Stack, bin: &Path) -> Result<std::process::Output> {
    commtap.arg("--");
    let inner = mpi_command(stack, bin);
    commtap.arg(inner.get_program()).args(inner.get_args());
    commtap
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let out = commtap.output()?;
    if !out.status.success() {
        bail!("commtap failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out)
}

/// The freezer's v1 hierarchy where the host has one (Slurm keeps its jobs there on hybrid
/// hosts), else the v2 hierarchy.
fn cgroup_base() -> &'static Path {
    let v1 = Path::new("/sys/fs/cgroup/freezer");
    if v1.is_dir() {
        v1
    } else {
        Path::new("/sys/fs/cgroup")
    }
}

/// A cgroup the benchmark's jobs are not in, for a daemon limited to it.
fn bench_cgroup() -> Result<PathBuf> {
    let dir = cgroup_base().join("commtap-bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Where (j)'s job runs: as deep as a Slurm task's cgroup (`slurm/uid_U/job_J/step_S/
/// task_T`), whose depth the kernel side walks when judging a process against a v1 limit
/// (not named `job_<id>`: a daemon's `--slurm-job` would take it for a job's).
fn job_cgroup() -> Result<PathBuf> {
    let dir = cgroup_base().join("commtap-bench-jobs/uid/job/step/task");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// (a) while `commtap daemon SCOPE` runs and does not watch the job (root's): `--uid 65534`
/// or `--cgroup DIR`; with or without uprobe sessions.
fn unwatched(
    stack: &Stack,
    bin: &Path,
    commtap: &Path,
    out: &Path,
    scope: &[&str],
    sessions: bool,
) -> Result<Sample> {
    let socket = out.join("bench-daemon.sock");
    let _ = std::fs::remove_file(&socket);
    let mut cmd = Command::new(commtap);
    cmd.args(["daemon", "--no-state"])
        .args(scope)
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if !sessions {
        cmd.env("COMMTAP_UPROBE_SESSIONS", "0");
    }
    let mut daemon = cmd.spawn().context("starting commtap daemon")?;
    // The socket appears once the probes are attached.
    let deadline = Instant::now() + Duration::from_mins(1);
    while !socket.exists() {
        if Instant::now() > deadline || daemon.try_wait()?.is_some() {
            let _ = daemon.kill();
            bail!("the daemon did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = if scope.first() == Some(&"--cgroup") {
        // The job in a cgroup of its own, as deep as a Slurm task's.
        let dir = job_cgroup()?;
        let job = mpi_command(stack, bin);
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$@\"",
                dir.display()
            ))
            .arg("sh")
            .arg(job.get_program())
            .args(job.get_args())
            .envs(job.get_envs().filter_map(|(k, v)| Some((k, v?))));
        let out = cmd.output()?;
        parse(&String::from_utf8_lossy(&out.stdout))
    } else {
        plain(stack, bin)
    };
    // SAFETY: kill(2) of the daemon we spawned.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let _ = daemon.wait();
    result
}

/// Calls a trace says it holds (its metadata).
fn trace_calls(trace: &Path) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(trace)?)?;
    v["metadata"]["commtap"]["calls_written"]
        .as_u64()
        .context("calls_written in the trace's metadata")
}

/// (moved past single-step, still single-stepped) probe lists of the probed library.
fn single_stepped(profile: &Path, library: &str) -> Result<(String, String)> {
    let wanted = std::fs::canonicalize(library)?;
    let wanted = wanted
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(library)
        .to_string();
    let text = std::fs::read_to_string(profile)?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let mut moved = Vec::new();
    let mut single = Vec::new();
    for lib in v["libraries"].as_array().into_iter().flatten() {
        let name = lib["path"]
            .as_str()
            .unwrap_or("?")
            .rsplit('/')
            .next()
            .unwrap_or("?")
            .to_string();
        // The profile lists every MPI library probed; keep the benchmarked one.
        if !wanted.starts_with(name.as_str()) && !name.starts_with(wanted.as_str()) {
            continue;
        }
        for (list, key) in [
            (&mut moved, "moved_past_single_step"),
            (&mut single, "single_stepped"),
        ] {
            let names: Vec<&str> = lib[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.as_str())
                .collect();
            if !names.is_empty() {
                list.push(format!("{name}: {}", names.join(", ")));
            }
        }
    }
    let or_none = |v: Vec<String>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join("; ")
        }
    };
    Ok((or_none(moved), or_none(single)))
}

/// CPU time (user + system) of `pid` in seconds, from /proc/PID/stat.
pub(super) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the command name.
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// Runs the daemon (defaults: per-call events off), then a 2-rank Open MPI job making
/// Allreduce and Send/Recv calls back to back; reports the job's MPI call rate and the
/// daemon's CPU use over the job, in percent of one core.
/// Starts `commtap daemon` on `socket` (with the `global` options before the command and
/// `extra` after it) and waits until it serves.
fn start_daemon(
    commtap: &Path,
    socket: &Path,
    global: &[&str],
    extra: &[&str],
) -> Result<std::process::Child> {
    let mut daemon = Command::new(commtap)
        .args(global)
        .args(["daemon", "--no-state", "--socket"])
        .arg(socket)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the daemon")?;
    let deadline = Instant::now() + Duration::from_mins(1);
    while !socket.exists() {
        if Instant::now() > deadline {
            let _ = daemon.kill();
            bail!("the daemon did not start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(daemon)
}

/// Stops a daemon from [`start_daemon`].
fn stop_daemon(mut daemon: std::process::Child) {
    // SAFETY: kill(2) of the daemon we spawned.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let _ = daemon.wait();
}

/// LAMMPS rounds: a Lennard-Jones melt of 32,000 atoms, 4 ranks, timed by LAMMPS itself.
const LAMMPS_ROUNDS: usize = 7;

/// What a real application pays: LAMMPS (Debian's `lmp`, Open MPI, 4 ranks) with the node
/// daemon running against without, interleaved; its own "Loop time", medians.
fn lammps(commtap: &Path, root: &Path, out: &Path) -> Result<String> {
    let input = std::fs::read_to_string(root.join("tests/programs/in.lj"))?
        .replace("block 0 10 0 10 0 10", "block 0 20 0 20 0 20")
        .replace("run             100", "run             300");
    let input_path = out.join("in.lj.bench");
    std::fs::write(&input_path, input)?;
    let run = || -> Result<f64> {
        let o = Command::new("mpirun.openmpi")
            .args(["--oversubscribe", "-np", "4", "lmp", "-log", "none", "-in"])
            .arg(&input_path)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .output()?;
        if !o.status.success() {
            bail!("LAMMPS failed: {}", String::from_utf8_lossy(&o.stderr));
        }
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| {
                l.strip_prefix("Loop time of ")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .context("LAMMPS printed no loop time")
    };
    let socket = out.join("bench-lammps.sock");
    let (mut alone, mut probed) = (Vec::new(), Vec::new());
    let n = rounds(LAMMPS_ROUNDS);
    for round in 0..n {
        eprintln!("LAMMPS: round {}/{n}", round + 1);
        alone.push(run()?);
        let daemon = start_daemon(commtap, &socket, &[], &[])?;
        let t = run();
        stop_daemon(daemon);
        probed.push(t?);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, d) = (median(&mut alone), median(&mut probed));
    Ok(format!(
        "{{\"lammps_loop_seconds_alone\": {a:.3}, \"lammps_loop_seconds_with_daemon\": {d:.3}, \"slowdown_percent\": {:.1}, \"rounds\": {n}}}",
        100.0 * (d - a) / a
    ))
}

fn daemon_cpu(commtap: &Path, out: &Path) -> Result<String> {
    let socket = out.join("bench-daemon.sock");
    let daemon = start_daemon(commtap, &socket, &[], &[])?;
    let iterations: u64 = 200_000;
    let before = cpu_seconds(daemon.id())?;
    let start = Instant::now();
    let job = Command::new("mpirun.openmpi")
        .args(["--oversubscribe", "-np", "2"])
        .arg(out.join("bench_calls.openmpi"))
        .arg(iterations.to_string())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(daemon.id())? - before;
    stop_daemon(daemon);
    if !job.status.success() {
        bail!("the benchmark job failed");
    }
    // Per rank: warm-up (n/10 Allreduce), n Allreduce, 2n Send/Recv, plus a few others.
    let calls = 2.0 * (iterations as f64 * 3.1);
    Ok(format!(
        "{{\"mpi_calls_per_second\": {:.0}, \"job_seconds\": {wall:.2}, \"daemon_cpu_percent_of_one_core\": {:.2}}}",
        calls / wall,
        100.0 * cpu / wall
    ))
}
