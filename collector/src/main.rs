//! `commtap`: the command line over the `collector` library (see its documentation for
//! the stages of the data's flow).

use collector::{
    aggregator, api, attach, client, compare, daemon, discover, profile, record, report, serve,
    symbols, trace,
};

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Result;
use clap::{Parser, Subcommand};

use collector::{
    api::transport::Target, daemon::DaemonOptions, record::RecordOptions, report::Outputs,
};

/// commtap: profile the communication of running MPI and NCCL jobs with eBPF: no relink,
/// no LD_PRELOAD, no restart.
///
/// Probes MPI entry points (Open MPI, MPICH), NCCL's (libnccl, librccl, or NCCL linked in)
/// and libfabric's data path (provider ops tables) in running processes and reports, per
/// rank, routine, message size and (NCCL) communicator, calls, bytes and time, in IBM
/// mpitrace's layout or as JSON.
/// Needs root (or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and
/// CAP_CHECKPOINT_RESTORE).
#[derive(Parser, Debug)]
#[command(name = "commtap", version, propagate_version = true)]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. `info`, `commtap=debug`.
    #[arg(long, global = true, default_value = "warn", env = "COMMTAP_LOG")]
    log: String,
    /// CA certificate bundle (PEM) that authenticates https:// aggregators and daemons.
    #[arg(long, global = true, env = "COMMTAP_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// This program's TLS certificate chain (PEM): what a client presents to a server that
    /// asks for one (--tls-client-ca), and what `daemon --listen` and `aggregator` serve
    /// with (a daemon presents it when pushing, too).
    #[arg(long, global = true, requires = "tls_key", env = "COMMTAP_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, global = true, requires = "tls_cert", env = "COMMTAP_TLS_KEY")]
    tls_key: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Profile MPI, NCCL and libfabric processes: attach to running ranks or launch a job,
    /// then print its profile.
    ///
    /// Examples:
    ///   commtap record --pid 4242,4243 --duration 30s
    ///   commtap record -- mpirun -np 4 ./app
    ///   commtap record --format json --mpitrace-dir prof/ -- mpiexec -n 8 ./app
    ///
    /// The profile is printed when the duration ends, on Ctrl-C, or when the processes
    /// (or the launched command) exit. Counts and bytes are exact: they come from counters
    /// kept in the kernel, which no event loss can thin out.
    #[command(verbatim_doc_comment)]
    Record(RecordArgs),
    /// Run the node daemon: count every MPI, NCCL or libfabric process on this node from its first call and
    /// serve their profiles over gRPC (commtap.v1.Node) on a Unix socket.
    ///
    /// Start it from systemd or a Slurm prolog; query it with `commtap report` and
    /// `commtap ps`, or any gRPC client (health and server reflection are served).
    Daemon(DaemonArgs),
    /// Print the profile a daemon (or aggregator) holds, as `record` prints it.
    ///
    /// Example: commtap report --from unix:///run/commtap/commtap.sock --job 4242
    #[command(verbatim_doc_comment)]
    Report(ReportArgs),
    /// List the processes a daemon knows and the libraries it probes (command lines cut
    /// at 256 characters; `report --format json` has them whole).
    Ps(PsArgs),
    /// Check this node: kernel, capabilities, BPF, mounts, the MPI and NCCL libraries the
    /// linker finds, and the daemon. Run it first on a new node; each problem comes with
    /// its fix, and the exit status is 1 when something commtap needs is missing.
    Doctor(DoctorArgs),
    /// Ask the daemon to watch a running process (the daemon finds new MPI processes by
    /// itself; this is for one it does not watch, e.g. outside its --uid/--cgroup scope).
    Attach(PidArgs),
    /// Ask the daemon to stop watching a process; prints its profile so far (kept as final).
    Detach(DetachArgs),
    /// Print every completed call of the daemon's processes as JSON lines (for timelines):
    /// pid, tid, routine, start_ns, duration_ns, bytes, peer, comm_size, comm_rank, comm
    /// (see the trace arguments in the README). Per-call events are
    /// switched on while this runs; a last line says how many this reader missed.
    Events(EventsArgs),
    /// Write a timeline of every call of a daemon's processes, as they run (no relaunch).
    ///
    /// Examples:
    ///   commtap trace --job 4242 -o job4242.json          (until the job's ranks exit)
    ///   commtap trace --pid 811,812 --duration 30s -o t.json
    ///   commtap trace --skip-routines MPI_Iprobe --max-events 100000 -o t.json
    ///   commtap trace --from https://node07:7481 --from https://node08:7481 --job 4242 -o t.json
    ///                                       (one file, both nodes on node07's clock)
    ///
    /// Open the file in https://ui.perfetto.dev or chrome://tracing: one process per rank
    /// (`rank R (host)`, in rank order), one track per thread, one slice per call with
    /// its bytes, size bucket, peer and communicator size. Ctrl-C or SIGTERM ends it with
    /// a complete file; calls it could not hold are counted in the file and printed.
    #[command(verbatim_doc_comment)]
    Trace(TraceArgs),
    /// Run an aggregator: merge the ranks of jobs across nodes from the snapshots daemons
    /// push (`commtap daemon --aggregator http://HOST:PORT`), persisted across restarts.
    Aggregator(AggregatorArgs),
    /// List the jobs an aggregator knows.
    Jobs(JobsArgs),
    /// Compare a job's NCCL bus bandwidth per message size with an nccl-tests table.
    ///
    /// The expected curve is the out-of-place busbw of an nccl-tests / rccl-tests output
    /// (`all_reduce_perf -b 64K -e 4G -f 2 ...` as printed). The measured one is a commtap
    /// profile's NCCL device time (a JSON profile, or a daemon or aggregator), or another
    /// nccl-tests table. Size buckets measured below --threshold x expected are flagged.
    /// Exit status: 0 nothing below, 1 some bucket below, 2 error.
    ///
    /// Examples:
    ///   commtap compare --expected allreduce_baseline.txt --profile job.json
    ///   commtap compare --expected baseline.txt --from https://agg:7443 --job 4242
    ///   commtap compare --expected a.txt --expected-table 2 --measured b.txt
    #[command(verbatim_doc_comment)]
    Compare(CompareArgs),
    /// Show what commtap finds of a process's libfabric endpoints and ops tables.
    #[command(hide = true)]
    ScanFabric {
        /// The process.
        #[arg(long)]
        pid: u32,
    },
    /// Benchmark the aggregator's merge (used by `cargo xtask bench`).
    #[command(hide = true)]
    BenchAggregator {
        /// Simulated daemons.
        #[arg(long, default_value_t = 100)]
        daemons: u32,
        /// Ranks per daemon.
        #[arg(long, default_value_t = 100)]
        ranks_per_daemon: u32,
        /// Routines per rank.
        #[arg(long, default_value_t = 50)]
        routines: u32,
        /// Size buckets per routine.
        #[arg(long, default_value_t = 32)]
        buckets: u8,
        /// Database file (replaced).
        #[arg(long)]
        db: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
struct AggregatorArgs {
    /// Address to listen on: this host only by default; give e.g. 0.0.0.0:7480 to serve a
    /// cluster (with --tls-cert, --tls-key and --tls-client-ca).
    #[arg(long, default_value = "127.0.0.1:7480")]
    listen: std::net::SocketAddr,
    #[command(flatten)]
    tls: TlsArgs,
    /// Database file (created if missing).
    #[arg(long, default_value = "/var/lib/commtap/aggregator.redb")]
    db: PathBuf,
    /// Push everything merged here to a higher aggregator (a tree of aggregators).
    #[arg(long)]
    upstream: Option<Target>,
    /// How often to push upstream.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    push_interval: Duration,
    /// How long a finished job (every rank exited) is kept after its last snapshot, e.g.
    /// 30d, 12h.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    retain: Duration,
}

#[derive(clap::Args, Debug)]
struct JobsArgs {
    /// The aggregator: http://host:port.
    #[arg(long)]
    from: Target,
}

#[derive(clap::Args, Debug)]
struct DaemonArgs {
    /// Unix socket to serve on.
    #[arg(long, default_value = api::transport::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Permission bits of the socket, in octal (owner and group by default).
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    socket_mode: u32,
    /// Node name reported to clients (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// How long the profile of an exited process is kept (e.g. 1h, 30m).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    keep_exited: Duration,
    #[command(flatten)]
    probe: ProbeArgs,
    /// Serve Prometheus metrics (path /metrics): unix:///run/commtap/metrics.sock (each
    /// caller sees what the API shows it: root every job, a user its own), or a TCP
    /// address (e.g. 0.0.0.0:9464) served over mutual TLS (--tls-cert, --tls-key and
    /// --tls-client-ca: scrapers present a certificate), or plaintext with
    /// --metrics-insecure.
    #[arg(long)]
    metrics_addr: Option<MetricsAddr>,
    /// Serve TCP metrics in plaintext: whoever reaches the port, every local user
    /// included, reads every job's series.
    #[arg(long, requires = "metrics_addr")]
    metrics_insecure: bool,
    /// Profile only these processes (comma separated), not every MPI process on the node.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["uid", "cgroup", "slurm_job"])]
    pid: Vec<u32>,
    /// Profile only processes of this user (name or numeric id).
    #[arg(long, value_parser = parse_user)]
    uid: Option<u32>,
    /// Profile only processes in this cgroup v2 directory or below it.
    #[arg(long, conflicts_with = "slurm_job")]
    cgroup: Option<PathBuf>,
    /// Profile only Slurm job ID (its cgroup `job_<ID>`, Slurm's cgroup v2 plugin).
    #[arg(long)]
    slurm_job: Option<String>,
    /// Push cumulative snapshots to this aggregator (http://host:port).
    #[arg(long)]
    aggregator: Option<Target>,
    /// Keep the counts in BPF maps pinned under this bpffs directory, so that a restarted
    /// daemon (crash, kill, upgrade of the same layout) carries on where the last one was.
    #[arg(long, default_value = "/sys/fs/bpf/commtap")]
    state_dir: PathBuf,
    /// Do not keep counts across restarts (a restarted daemon starts from zero).
    #[arg(long)]
    no_state: bool,
    /// Tests: take new processes' identities (rank, job, owner) from the kernel's events
    /// only, as for a process that exits before its /proc entry can be read.
    #[arg(long, hide = true)]
    identity_from_kernel: bool,
    /// Tests: add this many ns to every time the API gives out (call events, Clock), as
    /// a node whose clock is off would.
    #[arg(long, hide = true, default_value_t = 0, allow_hyphen_values = true)]
    test_clock_offset_ns: i64,
    /// Tests: also serve N made-up exited ranks (job `synthetic`), as a node with that many
    /// ranks would.
    #[arg(long, hide = true, default_value_t = 0)]
    test_synthetic_ranks: u32,
    /// Also serve the API on this TCP address (needs --tls-cert/--tls-key, or
    /// --insecure-tcp). A TCP caller sees every process only with a client certificate
    /// signed by --tls-client-ca; any other TCP caller is treated as a user who owns no
    /// process (it sees nothing and may change nothing).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    tls: TlsArgs,
    /// How often to push.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    push_interval: Duration,
}

#[derive(clap::Args, Debug)]
struct ReportArgs {
    /// Where to read: unix:///path/to.sock (a node daemon) or http://host:port (an
    /// aggregator, which needs --job).
    #[arg(long, default_value = "unix:///run/commtap/commtap.sock")]
    from: Target,
    /// Only this job.
    #[arg(long)]
    job: Option<String>,
    /// Live: print the report again every this long (e.g. 5s), until Ctrl-C or --count.
    #[arg(long, value_parser = parse_duration)]
    watch: Option<Duration>,
    /// With --watch: stop after this many reports.
    #[arg(long, requires = "watch")]
    count: Option<u64>,
    /// Print a JSON profile saved earlier (`record --format json -o FILE`) instead of
    /// asking a daemon: as text, or in mpitrace's files with --mpitrace-dir.
    #[arg(long, conflicts_with_all = ["job", "watch"])]
    profile: Option<PathBuf>,
    #[command(flatten)]
    out: Outputs,
}

#[derive(clap::Args, Debug)]
struct PidArgs {
    /// The process.
    #[arg(long)]
    pid: u32,
    /// The daemon: unix:///path/to.sock or https://host:port.
    #[arg(long, default_value = "unix:///run/commtap/commtap.sock")]
    from: Target,
}

#[derive(clap::Args, Debug)]
struct DetachArgs {
    #[command(flatten)]
    target: PidArgs,
    #[command(flatten)]
    out: Outputs,
}

#[derive(clap::Args, Debug)]
struct EventsArgs {
    /// Only these processes (comma separated or repeated; default: all you may see).
    #[arg(short, long, value_delimiter = ',')]
    pid: Vec<u32>,
    /// Stop after this long (e.g. 10s).
    #[arg(short, long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// The daemon: unix:///path/to.sock or https://host:port.
    #[arg(long, default_value = "unix:///run/commtap/commtap.sock")]
    from: Target,
}

#[derive(clap::Args, Debug)]
struct DoctorArgs {
    /// The daemon's socket to check.
    #[arg(long, default_value = api::transport::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The checks as JSON (an array of {name, status, detail, fix}).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct PsArgs {
    /// Where to read: unix:///path/to.sock (a daemon) or http(s)://host:port.
    #[arg(long, default_value = "unix:///run/commtap/commtap.sock")]
    from: Target,
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("measured_from").required(true).args(["profile", "measured", "from"])))]
struct CompareArgs {
    /// nccl-tests output whose out-of-place busbw is the expected curve.
    #[arg(long, value_name = "FILE")]
    expected: PathBuf,
    /// Which table of --expected (1-based) when the file holds several.
    #[arg(long, value_name = "N")]
    expected_table: Option<usize>,
    /// A JSON profile (`commtap record --format json`, `commtap report --format json`).
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// Another nccl-tests output, as the measured curve.
    #[arg(long, value_name = "FILE")]
    measured: Option<PathBuf>,
    /// Which table of --measured (1-based) when the file holds several.
    #[arg(long, value_name = "N")]
    measured_table: Option<usize>,
    /// A daemon (unix:///run/commtap/commtap.sock) or aggregator (https://host:port).
    #[arg(long)]
    from: Option<Target>,
    /// The job to read from --from (needed for an aggregator).
    #[arg(long)]
    job: Option<String>,
    /// The NCCL routine (default: the benchmark --expected names, e.g. all_reduce_perf).
    #[arg(long)]
    op: Option<String>,
    /// Flag buckets measured below this fraction of the expected bus bandwidth.
    #[arg(long, default_value_t = 0.5)]
    threshold: f64,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = report::Format::Text)]
    format: report::Format,
}

/// A JSON profile saved by `record` or `report`.
fn read_profile(p: &std::path::Path) -> Result<profile::JobProfile> {
    use anyhow::Context as _;
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not a commtap JSON profile", p.display()))
}

/// Runs `commtap compare`; whether some bucket was below the threshold.
async fn run_compare(a: CompareArgs) -> Result<bool> {
    use anyhow::Context as _;
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
    if !(a.threshold > 0.0 && a.threshold <= 1.0) {
        anyhow::bail!("--threshold {}: expected a fraction in (0, 1]", a.threshold);
    }
    let name = a.expected.display().to_string();
    let expected = compare::pick_table(&read(&a.expected)?, &name, a.expected_table)?;
    let op = compare::resolve_op(a.op.as_deref(), &expected)?;
    let measured = if let Some(p) = &a.profile {
        compare::profile_curve(&read_profile(p)?, &op)
    } else if let Some(p) = &a.measured {
        let name = p.display().to_string();
        compare::table_curve(&compare::pick_table(&read(p)?, &name, a.measured_table)?)
    } else {
        let from = a.from.as_ref().context("no measured side")?;
        compare::profile_curve(&client::snapshot(from, a.job.as_deref()).await?, &op)
    };
    if measured.is_empty() {
        anyhow::bail!(
            "nothing measured for {op}: no device time (the host never waited for the GPU right \
             after {op} operations of one kind; see README \"NCCL device time\")"
        );
    }
    let c = compare::compare(
        &op,
        &compare::table_curve(&expected),
        &measured,
        a.threshold,
    );
    match a.format {
        report::Format::Text => print!("{}", compare::render(&c)),
        report::Format::Json => println!("{}", serde_json::to_string_pretty(&c)?),
    }
    Ok(c.any_below())
}

/// Where `--metrics-addr` serves.
#[derive(Clone, Debug)]
enum MetricsAddr {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
}

impl std::str::FromStr for MetricsAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!("{s}: a unix address needs an absolute path"));
            }
            return Ok(MetricsAddr::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(MetricsAddr::Tcp)
            .map_err(|_| format!("{s}: expected unix:///path/to.sock or HOST:PORT"))
    }
}

/// The metrics endpoint `--metrics-addr` asks for, secured as the options allow; refuses
/// a TCP address with neither mutual TLS nor `--metrics-insecure`.
fn metrics_listener(
    addr: Option<MetricsAddr>,
    insecure: bool,
    socket_mode: u32,
    identity: Option<(PathBuf, PathBuf)>,
    client_ca: Option<PathBuf>,
) -> Result<Option<serve::metrics::MetricsListener>> {
    use serve::metrics::MetricsListener;
    Ok(match addr {
        None => None,
        Some(MetricsAddr::Unix(path)) => Some(MetricsListener::Unix {
            path,
            mode: socket_mode,
        }),
        Some(MetricsAddr::Tcp(addr)) if insecure => Some(MetricsListener::Plain(addr)),
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

/// How a TCP listener is secured (shared by `aggregator` and `daemon --listen`); its own
/// certificate is the global --tls-cert/--tls-key.
#[derive(clap::Args, Debug)]
struct TlsArgs {
    /// Accept plaintext TCP (no --tls-cert): only on a network you trust. Plaintext callers
    /// are never trusted with anything (see --tls-client-ca).
    #[arg(long)]
    insecure_tcp: bool,
    /// CA bundle (PEM) whose certificates clients must present (mutual TLS): only such a
    /// caller is trusted with every process's data and with changes.
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The listener's TLS setting (`who` names the server in the refusal).
    fn server(
        self,
        cert_key: Option<(PathBuf, PathBuf)>,
        who: &str,
    ) -> Result<Option<tonic::transport::ServerTlsConfig>> {
        api::transport::server_tls(cert_key, self.tls_client_ca, self.insecure_tcp, who)
    }
}

/// How the probes run (shared by `record` and `daemon`).
#[derive(clap::Args, Debug)]
struct ProbeArgs {
    /// Also emit an event per MPI call through a ring buffer (for latency and timelines).
    /// Counts, bytes and time never depend on it; it costs about half a microsecond per
    /// call, so it is off unless asked for.
    #[arg(long)]
    call_events: bool,
    /// Do not match collective calls across ranks. By default every collective call (and
    /// communicator constructor) emits an event, and the report's "Who is late" section
    /// (JSON `skew`) names the rank that arrives last and how long the others waited.
    #[arg(long)]
    no_skew: bool,
    /// Ring buffer for call events, in KiB (events beyond it are counted as dropped;
    /// counts and bytes stay exact).
    #[arg(long, default_value_t = 1024)]
    ring_buffer_kib: u32,
    /// An MPI library to probe from the start, besides those the dynamic linker finds
    /// (ldconfig, LD_LIBRARY_PATH, the RPATH/RUNPATH of programs on the command line);
    /// repeatable; for libraries in a venv or an unusual prefix.
    #[arg(long = "lib")]
    libraries: Vec<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct RecordArgs {
    /// Running processes to attach to (comma separated or repeated).
    #[arg(short, long, value_delimiter = ',', conflicts_with = "command")]
    pid: Vec<u32>,
    /// Stop recording after this long (e.g. 30s, 5m, 1h, 500ms).
    #[arg(short, long, value_parser = parse_duration)]
    duration: Option<Duration>,
    #[command(flatten)]
    out: Outputs,
    #[command(flatten)]
    probe: ProbeArgs,
    /// Create this file once the probes are attached (for scripts: attach, then go).
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Also write a timeline of every call into FILE: FILE.json is the Chrome Trace Event
    /// Format (open it in https://ui.perfetto.dev or chrome://tracing). Switches per-call
    /// events on; the profile's counts stay exact whatever the trace loses.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    trace_filter: TraceFilterArgs,
    /// Command to launch and profile, with every process it spawns (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// What goes into a trace (shared by `record --trace` and `trace`).
#[derive(clap::Args, Debug)]
struct TraceFilterArgs {
    /// Trace only calls that start in this window, in seconds after the first traced
    /// call: FROM..TO (e.g. 10..20).
    #[arg(long, value_parser = parse_window, value_name = "FROM..TO")]
    window: Option<(f64, f64)>,
    /// Trace only these world ranks (comma separated).
    #[arg(long, value_delimiter = ',')]
    ranks: Vec<u32>,
    /// Trace only these routines (comma separated, e.g. MPI_Allreduce,ncclAllReduce).
    #[arg(long, value_delimiter = ',')]
    routines: Vec<String>,
    /// Never trace these routines (e.g. MPI_Iprobe,MPI_Test: polls that flood a trace).
    #[arg(long, value_delimiter = ',')]
    skip_routines: Vec<String>,
    /// At most N calls per process: its first N are kept, the rest counted as lost.
    #[arg(long, value_name = "N")]
    max_events: Option<u64>,
    /// Start another file (FILE.2.json, FILE.3.json ...) past this many MB, each one
    /// loadable on its own (chrome://tracing stops at about 256 MB).
    #[arg(long, default_value_t = 256, value_name = "MB")]
    split_mb: u64,
}

impl TraceFilterArgs {
    /// The trace options for writing into `path`.
    fn options(self, path: PathBuf) -> trace::TraceOptions {
        trace::TraceOptions {
            path,
            window: self.window,
            ranks: (!self.ranks.is_empty()).then(|| self.ranks.into_iter().collect()),
            routines: trace::RoutineFilter {
                include: self.routines,
                exclude: self.skip_routines,
            },
            max_events: self.max_events,
            split_bytes: self.split_mb.max(1) << 20,
        }
    }
}

fn parse_window(s: &str) -> Result<(f64, f64), String> {
    let bad = || format!("invalid window {s:?}: expected FROM..TO in seconds, e.g. 10..20");
    let (from, to) = s.split_once("..").ok_or_else(bad)?;
    let from: f64 = from.trim().parse().map_err(|_| bad())?;
    let to: f64 = to.trim().parse().map_err(|_| bad())?;
    if !(from >= 0.0 && to > from) {
        return Err(bad());
    }
    Ok((from, to))
}

#[derive(clap::Args, Debug)]
struct TraceArgs {
    /// The trace file: FILE.json is the Chrome Trace Event Format.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// A node's daemon: unix:///path/to.sock or https://host:port. Repeat it for a job on
    /// several nodes: one file, every node's calls on the first node's clock.
    #[arg(long, default_value = "unix:///run/commtap/commtap.sock")]
    from: Vec<Target>,
    /// Only these processes (comma separated; one --from); the trace ends when all have
    /// exited.
    #[arg(short, long, value_delimiter = ',')]
    pid: Vec<u32>,
    /// Only the ranks of this job (as `commtap ps` shows it); the trace ends when all of
    /// them have exited.
    #[arg(long)]
    job: Option<String>,
    /// Stop after this long (e.g. 30s); else at Ctrl-C, SIGTERM or when the processes end.
    #[arg(short, long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Create this file once every call from now on goes into the trace.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    #[command(flatten)]
    filter: TraceFilterArgs,
}

fn parse_user(s: &str) -> Result<u32, String> {
    if let Ok(uid) = s.parse() {
        return Ok(uid);
    }
    nix::unistd::User::from_name(s)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
        .ok_or_else(|| format!("no user {s:?}"))
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("invalid mode {s:?}: expected octal, e.g. 660"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected e.g. 30s, 5m, 500ms"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => {
            return Err(format!(
                "invalid duration unit {unit:?} in {s:?}: use ms, s, m, h or d"
            ))
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("invalid duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The daemon's scope from its flags, the cgroup resolved to what the kernel compares.
fn daemon_scope(
    pids: Vec<u32>,
    uid: Option<u32>,
    cgroup: Option<PathBuf>,
    slurm_job: Option<String>,
) -> anyhow::Result<daemon::Scope> {
    let cgroup = match (cgroup, slurm_job) {
        (Some(path), _) => Some(path),
        (None, Some(job)) => Some(discover::slurm_job_cgroup(&job).map_err(anyhow::Error::msg)?),
        (None, None) => None,
    };
    let cgroup = cgroup
        .map(|p| discover::cgroup_ref(&p).map_err(anyhow::Error::msg))
        .transpose()?;
    Ok(daemon::Scope { pids, uid, cgroup })
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    // Read by `api::transport::connect`; set before any thread starts.
    for (var, value) in [
        ("COMMTAP_TLS_CA", &cli.tls_ca),
        ("COMMTAP_TLS_CERT", &cli.tls_cert),
        ("COMMTAP_TLS_KEY", &cli.tls_key),
    ] {
        if let Some(v) = value {
            std::env::set_var(var, v);
        }
    }
    let identity = cli.tls_cert.clone().zip(cli.tls_key.clone());
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("commtap: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut below = false;
    let result = rt.block_on(async {
        match cli.command {
            Command::Record(a) => {
                let opts = RecordOptions {
                    pids: a.pid,
                    command: a.command,
                    duration: a.duration,
                    ring_buffer_kib: a.probe.ring_buffer_kib,
                    libraries: a.probe.libraries,
                    ready_file: a.ready_file,
                    call_events: a.probe.call_events,
                    trace: a.trace.map(|path| a.trace_filter.options(path)),
                    skew: !a.probe.no_skew,
                };
                let profile = record::record(opts).await?;
                a.out.write(&profile)?;
                if profile.ranks.is_empty() {
                    anyhow::bail!("no MPI calls were recorded");
                }
                Ok(())
            }
            Command::Daemon(a) => {
                // One state per daemon socket: two daemons never share counts.
                let state_dir = (!a.no_state).then(|| {
                    // bpffs refuses names with a dot.
                    let tag: String = a
                        .socket
                        .to_string_lossy()
                        .chars()
                        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                        .collect();
                    attach::state_dir_for_layout(&a.state_dir.join(tag.trim_matches('_')))
                });
                daemon::run(DaemonOptions {
                    socket: a.socket,
                    socket_mode: a.socket_mode,
                    node_name: a.node_name,
                    ring_buffer_kib: a.probe.ring_buffer_kib,
                    keep_exited: a.keep_exited,
                    libraries: a.probe.libraries,
                    metrics: metrics_listener(
                        a.metrics_addr,
                        a.metrics_insecure,
                        a.socket_mode,
                        identity.clone(),
                        a.tls.tls_client_ca.clone(),
                    )?,
                    scope: daemon_scope(a.pid, a.uid, a.cgroup, a.slurm_job)?,
                    aggregator: a.aggregator,
                    push_interval: a.push_interval,
                    call_events: a.probe.call_events,
                    skew: !a.probe.no_skew,
                    identity_from_kernel: a.identity_from_kernel,
                    clock_offset_ns: a.test_clock_offset_ns,
                    synthetic_ranks: a.test_synthetic_ranks,
                    state_dir,
                    listen: match a.listen {
                        Some(addr) => Some((
                            addr,
                            a.tls.server(identity.clone(), "the daemon's --listen")?,
                        )),
                        None => None,
                    },
                })
                .await
            }
            Command::Report(a) => match (a.watch, &a.profile) {
                (_, Some(saved)) => a.out.write(&read_profile(saved)?),
                (Some(every), None) => {
                    client::watch(&a.from, a.job.as_deref(), every, a.count, &a.out).await
                }
                (None, None) => {
                    let profile = client::snapshot(&a.from, a.job.as_deref()).await?;
                    a.out.write(&profile)
                }
            },
            Command::Ps(a) => client::print_processes(&a.from).await,
            Command::Doctor(a) => {
                let checks = collector::doctor::run(&a.socket).await;
                if a.json {
                    println!("{}", serde_json::to_string_pretty(&checks)?);
                } else {
                    print!("{}", collector::doctor::render(&checks));
                }
                if checks
                    .iter()
                    .any(|c| c.status == collector::doctor::Status::Fail)
                {
                    std::process::exit(1);
                }
                Ok(())
            }
            Command::Attach(a) => client::attach(&a.from, a.pid).await,
            Command::Detach(a) => client::detach(&a.target.from, a.target.pid, &a.out).await,
            Command::Events(a) => client::events(&a.from, a.pid, a.duration).await,
            Command::Trace(a) => {
                let request = trace::remote::TraceRequest {
                    pids: a.pid,
                    job: a.job,
                    duration: a.duration,
                    ready_file: a.ready_file,
                };
                let summary =
                    trace::remote::trace(&a.from, request, a.filter.options(a.output)).await?;
                eprintln!("{summary}");
                Ok(())
            }
            Command::Aggregator(a) => {
                let mutual_tls = a.tls.tls_client_ca.is_some();
                aggregator::run(aggregator::AggregatorOptions {
                    listen: a.listen,
                    tls: a.tls.server(identity.clone(), "the aggregator")?,
                    mutual_tls,
                    db: a.db,
                    upstream: a.upstream.map(|t| (t, a.push_interval)),
                    retain: a.retain,
                })
                .await
            }
            Command::Jobs(a) => client::print_jobs(&a.from).await,
            Command::ScanFabric { pid } => {
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
            Command::Compare(a) => {
                below = run_compare(a).await?;
                Ok(())
            }
            Command::BenchAggregator {
                daemons,
                ranks_per_daemon,
                routines,
                buckets,
                db,
            } => aggregator::bench::run(daemons, ranks_per_daemon, routines, buckets, &db).await,
        }
    });
    match result {
        Ok(()) if below => ExitCode::from(1),
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("commtap: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("3 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
