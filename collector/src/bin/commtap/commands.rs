//! What each command does with its arguments: the library's entry points, called with the
//! options the flags give.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result};

use collector::{
    aggregator, attach, client, compare, daemon, daemon::DaemonOptions, discover, profile, record,
    record::RecordOptions, report, serve, symbols, trace,
};

use super::{
    args::{
        AggregatorArgs, CompareArgs, DaemonArgs, DiffArgs, DoctorArgs, MetricsAddr, MetricsArgs,
        RecordArgs, ReportArgs, TraceArgs,
    },
    Command,
};

/// A JSON profile saved by `record` or `report`.
fn read_profile(p: &std::path::Path) -> Result<profile::JobProfile> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not a commtap JSON profile", p.display()))
}

/// Runs `commtap diff`.
fn run_diff(a: &DiffArgs) -> Result<()> {
    let (before, after) = (read_profile(&a.before)?, read_profile(&a.after)?);
    let d = report::diff::diff(&before, &after);
    let text = match a.format {
        report::Format::Text => report::diff::render_text(
            &d,
            (
                &a.before.display().to_string(),
                &a.after.display().to_string(),
            ),
        ),
        report::Format::Json => serde_json::to_string_pretty(&d)? + "\n",
    };
    report::to_stdout(&text)
}

/// Runs `commtap compare`; whether some bucket was below the threshold.
async fn run_compare(a: CompareArgs) -> Result<bool> {
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    let name = a.expected.display().to_string();
    let expected = compare::pick_table(&read(&a.expected)?, &name, a.expected_table)?;
    let op = compare::resolve_op(a.op.as_deref(), &expected)?;
    let placement = compare::Placement::of(a.in_place);
    let (profile, measured) = if let (None, Some(p)) = (&a.profile, &a.measured) {
        let name = p.display().to_string();
        let table = compare::pick_table(&read(p)?, &name, a.measured_table)?;
        (
            None,
            compare::table_curve(&table, placement).with_context(|| name.clone())?,
        )
    } else {
        let profile = if let Some(p) = &a.profile {
            read_profile(p)?
        } else {
            let from = a.from.as_ref().context("no measured side")?;
            client::snapshot(from, a.job.as_deref()).await?
        };
        let measured = compare::profile_curve(&profile, &op);
        (Some(profile), measured)
    };
    if measured.is_empty() {
        let calls: u64 = profile
            .iter()
            .flat_map(|p| &p.ranks)
            .filter_map(|r| r.routines.get(&op))
            .map(|s| s.totals.calls)
            .sum();
        if profile.is_some() && calls == 0 {
            anyhow::bail!("nothing measured for {op}: the profile holds no {op} call");
        }
        anyhow::bail!(
            "nothing measured for {op}: no device time (the host never waited for the GPU right \
             after {op} operations of one kind; see README \"NCCL device time\")"
        );
    }
    let mut c = compare::compare(
        &op,
        &compare::table_curve(&expected, placement).with_context(|| name.clone())?,
        &measured,
        a.threshold,
    );
    c.in_place = a.in_place;
    match a.format {
        report::Format::Text => print!("{}", compare::render(&c)),
        report::Format::Json => println!("{}", serde_json::to_string_pretty(&c)?),
    }
    Ok(c.any_below())
}

/// The metrics endpoint `--metrics-addr` asks for, secured as the options allow; refuses
/// a TCP address with neither mutual TLS nor `--metrics-insecure`.
fn metrics_listener(
    metrics: MetricsArgs,
    socket_mode: u32,
    identity: Option<(PathBuf, PathBuf)>,
    client_ca: Option<PathBuf>,
) -> Result<Option<serve::metrics::MetricsListener>> {
    use serve::metrics::MetricsListener;
    Ok(match metrics.metrics_addr {
        None => None,
        Some(MetricsAddr::Unix(path)) => Some(MetricsListener::Unix {
            path,
            mode: socket_mode,
        }),
        Some(MetricsAddr::Tcp(addr)) if metrics.metrics_insecure => {
            Some(MetricsListener::Plain(addr))
        }
        Some(MetricsAddr::Tcp(addr)) => match (identity, client_ca) {
            (Some((cert, key)), Some(client_ca)) => Some(MetricsListener::Tls {
                addr,
                cert,
                key,
                client_ca,
            }),
            _ => anyhow::bail!(
                "--metrics-addr {addr}: TCP metrics show every job's series, so they need \
                 mutual TLS (--tls-cert, --tls-key and --tls-client-ca), or \
                 --metrics-insecure; or serve them on unix:///run/commtap/metrics.sock"
            ),
        },
    })
}

/// The daemon's scope from its flags, the cgroup resolved to what the kernel compares.
fn daemon_scope(
    pids: Vec<u32>,
    uid: Option<u32>,
    cgroup: Option<PathBuf>,
    slurm_job: Option<String>,
    container: Option<String>,
) -> anyhow::Result<daemon::Scope> {
    let cgroup = match (cgroup, slurm_job, container) {
        (Some(path), ..) => Some(path),
        (None, Some(job), _) => Some(discover::cgroup::slurm_job_cgroup(&job)?),
        (None, None, Some(id)) => Some(discover::cgroup::container_cgroup(&id)?),
        (None, None, None) => None,
    };
    let cgroup = cgroup
        .map(|p| discover::cgroup::cgroup_ref(&p))
        .transpose()?;
    Ok(daemon::Scope { pids, uid, cgroup })
}

/// Runs `command`; `identity` is this program's TLS certificate and key, if given. Exit 1
/// says a comparison found buckets below the expected bandwidth (or doctor a failure).
pub async fn run(command: Command, identity: Option<(PathBuf, PathBuf)>) -> Result<ExitCode> {
    match command {
        Command::Record(a) => return Box::pin(record(a)).await,
        Command::Daemon(a) => daemon(a, identity).await?,
        Command::Report(a) => return report(a).await,
        Command::Ps(a) => client::print_processes(&a.from, a.format.json()).await?,
        Command::Top(a) => {
            collector::top::run(collector::top::TopOptions {
                from: a.from,
                job: a.job,
                every: a.interval,
            })
            .await?;
        }
        Command::Doctor(a) => return doctor(a).await,
        Command::Attach(a) => client::attach(&a.target.from, a.target.pid, a.format.json()).await?,
        Command::Detach(a) => client::detach(&a.target.from, a.target.pid, &a.out).await?,
        Command::Events(a) => client::events(&a.from, a.pid, a.duration).await?,
        Command::Trace(a) => trace(a).await?,
        Command::Aggregator(a) => aggregator(a, identity).await?,
        Command::Jobs(a) => client::print_jobs(&a.from, a.format.json()).await?,
        Command::ScanFabric { pid } => scan_fabric(pid)?,
        Command::Completions { shell } => completions(shell)?,
        Command::Schema => print!("{}", collector::profile::schema::profile_schema()),
        Command::Man { out } => man_pages(&out)?,
        // Answered before the runtime starts (it needs the command line's definition).
        Command::Config(_) => {}
        Command::Compare(a) => {
            if run_compare(a).await? {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Diff(a) => run_diff(&a)?,
        Command::BenchPush {
            to,
            daemons,
            nodes,
            ranks,
            seconds,
            interval,
        } => aggregator::load::run(to, daemons, nodes, ranks, seconds, interval).await?,
        Command::BenchMatching {
            ranks,
            instances,
            rounds,
        } => collector::skew::bench::run(ranks, instances, rounds)?,
        Command::BenchAggregator {
            daemons,
            ranks_per_daemon,
            routines,
            buckets,
            db,
        } => aggregator::bench::run(daemons, ranks_per_daemon, routines, buckets, &db).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `commtap record`: exit status 0 with a profile, the launched command's own when it
/// failed (its profile written all the same).
async fn record(a: RecordArgs) -> Result<ExitCode> {
    if let Some(marker) = a.trace_filter.step_marker.as_ref() {
        if a.probe.no_skew && marker.is_collective() {
            anyhow::bail!(
                "--step-marker {marker}: a collective marker's steps are counted by who-is-late's \
                 instance numbers, alike in every rank; --no-skew turns it off (drop it, or \
                 name a marker that is no collective)"
            );
        }
    }
    let opts = RecordOptions {
        pids: a.pid,
        wait_for_mpi: a.wait_for_mpi,
        command: a.command,
        duration: a.duration,
        load: a.probe.load_options(),
        libraries: a.probe.libraries,
        ready_file: a.ready_file,
        call_events: a.probe.call_events,
        traces: a
            .trace
            .into_iter()
            .map(|path| a.trace_filter.clone().options(path))
            .collect(),
        skew: !a.probe.no_skew,
    };
    // Before the job: an output that cannot be written fails now, not after it.
    a.out.check()?;
    // Boxed: the recording future holds the whole session (clippy: large_futures).
    let record::Recorded {
        profile,
        command_failed,
    } = Box::pin(record::record(opts)).await?;
    if profile.ranks.is_empty() {
        let kept = a.out.write_unless_there(&profile)?;
        let kept = if kept.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = kept.iter().map(|p| p.display().to_string()).collect();
            format!(
                "; files of an earlier run left as they were: {}",
                names.join(", ")
            )
        };
        // The text report just printed on the terminal ends with the reason: not twice.
        let why =
            if a.out.output_file().is_none() && a.out.format == collector::report::Format::Text {
                "the report above says why"
            } else {
                collector::report::nothing_seen(&profile)
            };
        anyhow::bail!("no MPI calls were recorded: {why}{kept}");
    }
    match a.out.write(&profile) {
        // Its files are written; the job's status still says how it ended.
        Err(e) if e.is::<collector::report::StdoutClosed>() => {}
        done => done?,
    }
    let failed = profile.abnormal_endings();
    if let Some((r, e)) = failed.first() {
        tracing::warn!(
            "rank {} (pid {} on {}) {}: the first of the {} rank{} that did not end normally \
             (the report lists them)",
            r.rank,
            r.pid,
            r.host,
            e.describe(),
            failed.len(),
            if failed.len() == 1 { "" } else { "s" }
        );
    }
    Ok(command_failed.map_or(ExitCode::SUCCESS, failed_command_code))
}

/// The exit status a shell would give a command that ended so: its code, or 128 + the
/// signal that killed it.
fn failed_command_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt as _;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    // A status that reads as success (0) or past a byte still says "failed".
    ExitCode::from(u8::try_from(code).ok().filter(|c| *c != 0).unwrap_or(1))
}

/// `commtap daemon`.
async fn daemon(a: DaemonArgs, identity: Option<(PathBuf, PathBuf)>) -> Result<()> {
    if let Some(agg) = &a.aggregator {
        agg.check_push(a.push_insecure, "--push-insecure")
            .context("--aggregator")?;
    }
    // One state per daemon socket: two daemons never share counts.
    let state_dir = (!a.no_state).then(|| {
        // bpffs refuses names with a dot.
        let tag: String = a
            .socket
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        attach::state::state_dir_for_layout(&a.state_dir.join(tag.trim_matches('_')))
    });
    daemon::run(DaemonOptions {
        socket: a.socket,
        socket_mode: a.socket_mode,
        node_name: a.node_name,
        load: collector::attach::LoadOptions {
            pause_lease: a.test_pause_lease.unwrap_or(collector::attach::PAUSE_LEASE),
            ..a.probe.load_options()
        },
        keep_exited: a.keep_exited,
        libraries: a.probe.libraries,
        otlp: a.metrics.otlp(),
        metrics: metrics_listener(
            a.metrics,
            a.socket_mode,
            identity.clone(),
            a.tls.tls_client_ca.clone(),
        )?,
        scope: daemon_scope(a.pid, a.uid, a.cgroup, a.slurm_job, a.container)?,
        aggregator: a.aggregator,
        push_interval: a.push_interval,
        call_events: a.probe.call_events,
        skew: !a.probe.no_skew,
        identity_from_kernel: a.identity_from_kernel,
        clock_offset_ns: a.test_clock_offset_ns,
        synthetic_ranks: a.test_synthetic_ranks,
        state_dir,
        advertise: a.advertise,
        listen: match a.listen {
            Some(addr) => Some((addr, a.tls.server(identity, "the daemon's --listen")?)),
            None => None,
        },
    })
    .await
}

/// `commtap report`: a saved profile, a daemon's or an aggregator's, once or watched.
/// Exit status 3 when the job asked for is not there.
async fn report(a: ReportArgs) -> Result<ExitCode> {
    a.out.check()?;
    let done = match (a.watch, &a.profile) {
        (_, Some(saved)) => a.out.write(&read_profile(saved)?),
        (Some(every), None) => {
            client::watch(&a.from, a.job.as_deref(), every, a.count, &a.out).await
        }
        (None, None) => client::snapshot(&a.from, a.job.as_deref())
            .await
            .and_then(|profile| a.out.write(&profile)),
    };
    match done {
        Err(e) if e.is::<client::NoSuchJob>() => {
            eprintln!("commtap: {e}");
            Ok(ExitCode::from(3))
        }
        Err(e) => Err(e),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}

/// `commtap doctor`: exit 1 when a check fails.
async fn doctor(a: DoctorArgs) -> Result<ExitCode> {
    let checks = collector::doctor::run(&a.socket).await;
    if a.format.json() {
        println!("{}", serde_json::to_string_pretty(&checks)?);
    } else {
        print!("{}", collector::doctor::render(&checks));
    }
    let failed = checks
        .iter()
        .any(|c| c.status == collector::doctor::Status::Fail);
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `commtap trace`: a timeline from daemons.
async fn trace(a: TraceArgs) -> Result<()> {
    let request = trace::remote::TraceRequest {
        pids: a.pid,
        job: a.job,
        duration: a.duration,
        ready_file: a.ready_file,
        direct: a.direct,
    };
    let summary = trace::remote::trace(&a.from, request, a.filter.options(a.output)).await?;
    eprintln!("{summary}");
    Ok(())
}

/// `commtap aggregator`.
async fn aggregator(a: AggregatorArgs, identity: Option<(PathBuf, PathBuf)>) -> Result<()> {
    if let Some(up) = &a.upstream {
        up.check_push(a.push_insecure, "--push-insecure")
            .context("--upstream")?;
    }
    let mutual_tls = a.tls.tls_client_ca.is_some();
    let otlp = a.metrics.otlp();
    // On a Unix socket: owner and group (the aggregator has no --socket-mode).
    let metrics = metrics_listener(
        a.metrics,
        0o660,
        identity.clone(),
        a.tls.tls_client_ca.clone(),
    )?;
    aggregator::run(aggregator::AggregatorOptions {
        listen: a.listen,
        tls: a.tls.server(identity, "the aggregator")?,
        mutual_tls,
        db: a.db,
        upstream: a.upstream.map(|t| (t, a.push_interval)),
        retain: a.retain,
        metrics,
        otlp,
    })
    .await
}

/// `commtap completions SHELL`: the completion script, on standard output.
fn completions(shell: clap_complete::Shell) -> Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut crate::cli_command(), "commtap", &mut out);
    std::io::Write::write_all(&mut std::io::stdout().lock(), &out)
        .context("writing the completion script")
}

/// `commtap man --out DIR`: a page per visible command, from the same definitions as
/// `--help` (so the two never drift). Written as every commtap output is
/// (`report::write_file`): run as root, it must not follow a link someone left in DIR, which
/// `clap_mangen::generate_to` would.
fn man_pages(out: &std::path::Path) -> Result<()> {
    fn write_pages(cmd: clap::Command, out: &std::path::Path) -> Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            write_pages(sub, out)?;
        }
        let man = clap_mangen::Man::new(cmd);
        let mut page = Vec::new();
        man.render(&mut page)?;
        let path = out.join(man.get_filename());
        collector::report::write_file(&path, &page)
            .with_context(|| format!("writing {}", path.display()))
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    // As clap_mangen::generate_to prepares it: no `help` pseudo-command, names resolved.
    let mut cmd = crate::cli_command().disable_help_subcommand(true);
    cmd.build();
    write_pages(cmd, out)?;
    eprintln!("manual pages written to {}", out.display());
    Ok(())
}

/// `commtap scan-fabric`: the libfabric endpoints in a process's memory (a diagnostic).
fn scan_fabric(pid: u32) -> Result<()> {
    for o in discover::mapped_objects(pid)? {
        let file = symbols::LibraryFile::open_mapped(
            pid,
            o.range,
            o.dev_inode,
            &o.path.display().to_string(),
        )?;
        let cands = symbols::fabric::read_candidates(&file)?;
        if cands.is_empty() {
            continue;
        }
        let Some(map) = discover::memory::Mapping::of(&o) else {
            continue;
        };
        let scan = discover::memory::endpoint_tables(pid, map, &cands);
        println!(
            "{}: {} candidates, {} endpoints in {} MiB, tables {:x?}",
            o.path.display(),
            cands.len(),
            scan.endpoints,
            scan.scanned >> 20,
            scan.tables
        );
    }
    Ok(())
}
