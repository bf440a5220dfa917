//! The command line's arguments: one struct per command, the groups of flags several
//! commands share, and the parsers of their values.

use std::{path::PathBuf, time::Duration};

use anyhow::Result;

use collector::{api, api::transport::Target, report, report::Outputs, trace};

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["example", "show"])))]
pub struct ConfigArgs {
    /// Print every option of every command, with its help, default and environment
    /// variable, commented out: a file to start from.
    #[arg(long)]
    pub example: bool,
    /// Show what `commtap COMMAND ARGS...` would run with, and where each value comes from.
    #[arg(long, num_args = 1.., allow_hyphen_values = true, value_name = "COMMAND [ARGS]")]
    pub show: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct AggregatorArgs {
    /// Address to listen on: this host only by default; give e.g. 0.0.0.0:7480 to serve a
    /// cluster (with --tls-cert, --tls-key and --tls-client-ca).
    #[arg(long, default_value = "127.0.0.1:7480")]
    pub listen: std::net::SocketAddr,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Database file (created if missing).
    #[arg(long, default_value = "/var/lib/commtap/aggregator.redb")]
    pub db: PathBuf,
    /// Push everything merged here to a higher aggregator (a tree of aggregators).
    #[arg(long)]
    pub upstream: Option<Target>,
    /// Allow --upstream http:// (plaintext): only on a network you trust.
    #[arg(long, requires = "upstream")]
    pub push_insecure: bool,
    /// How often to push upstream.
    #[arg(allow_negative_numbers = true, long, default_value = "5s", value_parser = parse_duration)]
    pub push_interval: Duration,
    /// How long a finished job (every rank exited) is kept after its last snapshot, e.g.
    /// 30d, 12h.
    #[arg(long, default_value = "7d", value_parser = parse_duration_or_zero)]
    pub retain: Duration,
    /// The aggregator's own health as Prometheus metrics: pushes, snapshots accepted,
    /// stale and refused, commits and their time, jobs, ranks, nodes, database size.
    #[command(flatten)]
    pub metrics: MetricsArgs,
}

/// How a command that lists things prints them: `--format text` (a table for people) or
/// `--format json` (one document for programs, its shape in the command's help).
#[derive(clap::Args, Debug)]
pub struct ListingFormat {
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Listing::Text)]
    format: Listing,
    /// The same as --format json.
    #[arg(long, conflicts_with = "format")]
    json: bool,
}

/// The formats of [`ListingFormat`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Listing {
    /// For people.
    Text,
    /// For programs.
    Json,
}

impl ListingFormat {
    /// Whether JSON was asked for.
    pub fn json(&self) -> bool {
        self.json || self.format == Listing::Json
    }
}

#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    /// The aggregator: http://host:port.
    #[arg(long)]
    pub from: Target,
    #[command(flatten)]
    pub format: ListingFormat,
}

#[derive(clap::Args, Debug)]
pub struct DaemonArgs {
    /// Unix socket to serve on.
    #[arg(long, default_value = api::transport::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Permission bits of the socket, in octal (owner and group by default).
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// The name of this node in everything the daemon reports: ranks' hosts, the jobs an
    /// aggregator lists, traces (default: the host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// How long the profile of an exited process is kept (e.g. 1h, 30m).
    #[arg(long, default_value = "1h", value_parser = parse_duration_or_zero)]
    pub keep_exited: Duration,
    #[command(flatten)]
    pub probe: ProbeArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Profile only these processes (comma separated), not every MPI process on the node,
    /// and the ranks below each, as `record --pid` finds them: mpirun's, torchrun's
    /// workers (numbered apart by RANK), not a rank's own helpers. Read at the daemon's
    /// start: workers started later are not added.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["uid", "cgroup", "slurm_job", "container"])]
    pub pid: Vec<u32>,
    /// Profile only processes of this user (name or numeric id).
    #[arg(long, value_parser = parse_user)]
    pub uid: Option<u32>,
    /// Profile only processes in this cgroup directory or below it: in the cgroup v2
    /// hierarchy, or in a v1 controller's (/sys/fs/cgroup/freezer/..., hybrid hosts).
    #[arg(long, conflicts_with = "slurm_job")]
    pub cgroup: Option<PathBuf>,
    /// Profile only Slurm job ID: the processes in its cgroup `job_<ID>`, root's, which
    /// Slurm's proctrack/cgroup or task/cgroup plugin makes (cgroup v2, or v1 on hybrid hosts).
    #[arg(long)]
    pub slurm_job: Option<String>,
    /// Profile only the processes of this container: its id, or its first 12 or more hex
    /// digits as `docker ps` or `crictl ps` shows it (the cgroup its runtime made for it:
    /// Docker, containerd, CRI-O, Podman, Kubernetes pods; cgroup v2).
    #[arg(long, conflicts_with_all = ["cgroup", "slurm_job"])]
    pub container: Option<String>,
    /// Push cumulative snapshots to this aggregator (https://host:port; http:// needs
    /// --push-insecure).
    #[arg(long)]
    pub aggregator: Option<Target>,
    /// Allow --aggregator http:// (plaintext): only on a network you trust.
    #[arg(long, requires = "aggregator")]
    pub push_insecure: bool,
    /// Keep the counts in BPF maps pinned under this bpffs directory, so that a restarted
    /// daemon (crash, kill, upgrade of the same layout) carries on where the last one was.
    #[arg(long, default_value = "/sys/fs/bpf/commtap")]
    pub state_dir: PathBuf,
    /// Do not keep counts across restarts (a restarted daemon starts from zero).
    #[arg(long)]
    pub no_state: bool,
    /// Tests: take new processes' identities (rank, job, owner) from the kernel's events
    /// only, as for a process that exits before its /proc entry can be read.
    #[arg(long, hide = true)]
    pub identity_from_kernel: bool,
    /// Tests: add this many ns to every time the API gives out (call events, Clock), as
    /// a node whose clock is off would.
    #[arg(long, hide = true, default_value_t = 0, allow_hyphen_values = true)]
    pub test_clock_offset_ns: i64,
    /// Tests: also serve N made-up exited ranks (job `synthetic`), as a node with that many
    /// ranks would.
    #[arg(long, hide = true, default_value_t = 0)]
    pub test_synthetic_ranks: u32,
    /// Tests: how long pausing processes at library loads lasts unless renewed (a frozen
    /// daemon's kernel side keeps pausing for this long).
    #[arg(long, hide = true, value_parser = parse_duration_or_zero)]
    pub test_pause_lease: Option<Duration>,
    /// Also serve the API on this TCP address (needs --tls-cert/--tls-key, or
    /// --insecure-tcp). A TCP caller sees every process only with a client certificate
    /// signed by --tls-client-ca; any other TCP caller is treated as a user who owns no
    /// process (it sees nothing and may change nothing).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// Where clients reach --listen, as the aggregator is told (`commtap trace --from
    /// AGGREGATOR --job J` streams from there): default https://NODE-NAME:PORT (http://
    /// with --insecure-tcp).
    #[arg(long, value_name = "URL", requires = "listen", value_parser = parse_advertise)]
    pub advertise: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// How often to push.
    #[arg(allow_negative_numbers = true, long, default_value = "1s", value_parser = parse_duration)]
    pub push_interval: Duration,
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Where to read: unix:///path/to.sock (a node daemon) or http://host:port (an
    /// aggregator, which needs --job).
    #[arg(
        long,
        alias = "socket",
        default_value = "unix:///run/commtap/commtap.sock"
    )]
    pub from: Target,
    /// Only this job (exit status 3, nothing written, when it is not there: a job that
    /// made no MPI call, say).
    #[arg(long)]
    pub job: Option<String>,
    /// Live: print the report again every this long (e.g. 5s), until Ctrl-C, --count, or
    /// (with --job) the job's every rank exited: its last report is final.
    #[arg(allow_negative_numbers = true, long, value_parser = parse_duration)]
    pub watch: Option<Duration>,
    /// With --watch: stop after this many reports.
    #[arg(long, requires = "watch")]
    pub count: Option<u64>,
    /// Print a JSON profile saved earlier (`record --format json -o FILE`) instead of
    /// asking a daemon: as text, or in mpitrace's files with --mpitrace-dir.
    #[arg(long, conflicts_with_all = ["job", "watch"])]
    pub profile: Option<PathBuf>,
    #[command(flatten)]
    pub out: Outputs,
}

#[derive(clap::Args, Debug)]
pub struct PidArgs {
    /// The process.
    #[arg(long)]
    pub pid: u32,
    /// The daemon: unix:///path/to.sock or https://host:port.
    #[arg(
        long,
        alias = "socket",
        default_value = "unix:///run/commtap/commtap.sock"
    )]
    pub from: Target,
}

#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    #[command(flatten)]
    pub target: PidArgs,
    #[command(flatten)]
    pub format: ListingFormat,
}

#[derive(clap::Args, Debug)]
pub struct DetachArgs {
    #[command(flatten)]
    pub target: PidArgs,
    #[command(flatten)]
    pub out: Outputs,
}

#[derive(clap::Args, Debug)]
pub struct EventsArgs {
    /// Only these processes (comma separated or repeated; default: all you may see).
    #[arg(short, long, value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Stop after this long (e.g. 10s).
    #[arg(allow_negative_numbers = true, short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// The daemon: unix:///path/to.sock or https://host:port.
    #[arg(
        long,
        alias = "socket",
        default_value = "unix:///run/commtap/commtap.sock"
    )]
    pub from: Target,
}

#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// The daemon's socket to check.
    #[arg(long, default_value = api::transport::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    #[command(flatten)]
    pub format: ListingFormat,
}

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Where to read: unix:///path/to.sock (a node daemon) or http(s)://host:port (an
    /// aggregator, which needs --job; or a daemon's --listen).
    #[arg(
        long,
        alias = "socket",
        default_value = "unix:///run/commtap/commtap.sock"
    )]
    pub from: Target,
    /// Only this job (the `j` key cycles through the jobs of a daemon).
    #[arg(long)]
    pub job: Option<String>,
    /// How often the server sends a profile: the rates' interval (e.g. 1s, 500ms).
    #[arg(allow_negative_numbers = true, long, default_value = "2s", value_parser = parse_duration)]
    pub interval: Duration,
}

#[derive(clap::Args, Debug)]
pub struct PsArgs {
    /// Where to read: unix:///path/to.sock (a daemon) or http(s)://host:port.
    #[arg(
        long,
        alias = "socket",
        default_value = "unix:///run/commtap/commtap.sock"
    )]
    pub from: Target,
    #[command(flatten)]
    pub format: ListingFormat,
}

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The profile before (a JSON profile).
    pub before: PathBuf,
    /// The profile after.
    pub after: PathBuf,
    /// Output format: text, or one JSON document (every row).
    #[arg(short, long, value_enum, default_value_t = report::Format::Text)]
    pub format: report::Format,
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("measured_from").required(true).args(["profile", "measured", "from"])))]
pub struct CompareArgs {
    /// nccl-tests output whose out-of-place busbw (in-place with --in-place) is the expected
    /// curve.
    #[arg(long, value_name = "FILE")]
    pub expected: PathBuf,
    /// Which table of --expected (1-based) when the file holds several.
    #[arg(long, value_name = "N")]
    pub expected_table: Option<usize>,
    /// A JSON profile (`commtap record --format json`, `commtap report --format json`).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Another nccl-tests output, as the measured curve.
    #[arg(long, value_name = "FILE")]
    pub measured: Option<PathBuf>,
    /// Which table of --measured (1-based) when the file holds several.
    #[arg(long, value_name = "N")]
    pub measured_table: Option<usize>,
    /// A daemon (unix:///run/commtap/commtap.sock) or aggregator (https://host:port).
    #[arg(long)]
    pub from: Option<Target>,
    /// The job to read from --from (needed for an aggregator).
    #[arg(long)]
    pub job: Option<String>,
    /// The NCCL routine (default: the benchmark --expected names, e.g. all_reduce_perf).
    #[arg(long)]
    pub op: Option<String>,
    /// Flag buckets measured below this fraction of the expected bus bandwidth.
    #[arg(long, default_value_t = 0.5, value_parser = collector::compare::parse_threshold)]
    pub threshold: f64,
    /// Read the tables' in-place busbw (their last columns), not the out-of-place: for jobs
    /// whose operations are in place (PyTorch DDP's AllReduces).
    #[arg(long)]
    pub in_place: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = report::Format::Text)]
    pub format: report::Format,
}

/// The Prometheus endpoint (`daemon`, `aggregator`).
#[derive(clap::Args, Debug)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics (path /metrics): unix:///run/commtap/metrics.sock (a
    /// daemon shows each caller what its API shows it: root every job, a user its own), or
    /// a TCP address (e.g. 0.0.0.0:9464) served over mutual TLS (--tls-cert, --tls-key and
    /// --tls-client-ca: scrapers present a certificate), or plaintext with
    /// --metrics-insecure.
    #[arg(long)]
    pub metrics_addr: Option<MetricsAddr>,
    /// Serve TCP metrics in plaintext: whoever reaches the port, every local user
    /// included, reads every series.
    #[arg(long, requires = "metrics_addr")]
    pub metrics_insecure: bool,
    /// Also push the same series over OTLP/gRPC to an OpenTelemetry collector at URL
    /// (http://collector:4317). Without it, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_ENDPOINT name one; OTEL_SERVICE_NAME (default commtap) and
    /// OTEL_RESOURCE_ATTRIBUTES add to the resource, with host.name.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// How often to push over OTLP (default: OTEL_METRIC_EXPORT_INTERVAL milliseconds, else
    /// 1m).
    #[arg(allow_negative_numbers = true, long, value_parser = parse_duration)]
    pub otlp_interval: Option<Duration>,
}

impl MetricsArgs {
    /// Where and how to push over OTLP, from these flags and the standard `OTEL_*`
    /// variables (flags first); None when no endpoint is named.
    pub fn otlp(&self) -> Option<collector::serve::metrics::otlp::OtlpOptions> {
        collector::serve::metrics::otlp::OtlpOptions::from_flags_and_env(
            self.otlp_endpoint.clone(),
            self.otlp_interval,
            |k| std::env::var(k).ok().filter(|v| !v.is_empty()),
        )
    }
}

/// Where `--metrics-addr` serves.
#[derive(Clone, Debug)]
pub enum MetricsAddr {
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

/// How a TCP listener is secured (shared by `aggregator` and `daemon --listen`); its own
/// certificate is the global --tls-cert/--tls-key.
#[derive(clap::Args, Debug)]
pub struct TlsArgs {
    /// Accept plaintext TCP (no --tls-cert): only on a network you trust. Plaintext callers
    /// are never trusted with anything (see --tls-client-ca).
    #[arg(long)]
    pub insecure_tcp: bool,
    /// CA bundle (PEM) whose certificates clients must present (mutual TLS): only such a
    /// caller is trusted with every process's data and with changes.
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The listener's TLS setting (`who` names the server in the refusal).
    pub fn server(
        self,
        cert_key: Option<(PathBuf, PathBuf)>,
        who: &str,
    ) -> Result<Option<tonic::transport::ServerTlsConfig>> {
        api::transport::server_tls(cert_key, self.tls_client_ca, self.insecure_tcp, who)
    }
}

/// How the probes run (shared by `record` and `daemon`).
#[derive(clap::Args, Debug)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent command-line switches, each its own flag"
)]
pub struct ProbeArgs {
    /// Also emit an event per MPI call through a ring buffer (for latency, timelines, and
    /// who is late between point-to-point ranks: Late Sender and Late Receiver). Counts,
    /// bytes and time never depend on it; it costs about half a microsecond per call, so it
    /// is off unless asked for.
    #[arg(long)]
    pub call_events: bool,
    /// Do not match collective calls across ranks. By default every collective call (and
    /// communicator constructor) emits an event, and the report's "Who is late" section
    /// (JSON `skew`) names the rank that arrives last and how long the others waited.
    #[arg(long)]
    pub no_skew: bool,
    /// Ring buffer for call events, in KiB (events beyond it are counted as dropped;
    /// counts and bytes stay exact).
    #[arg(long, default_value_t = 1024)]
    pub ring_buffer_kib: u32,
    /// An MPI library to probe from the start, besides those the dynamic linker finds
    /// (ldconfig, LD_LIBRARY_PATH, the RPATH/RUNPATH of programs on the command line);
    /// repeatable; for libraries in a venv or an unusual prefix.
    #[arg(long = "lib")]
    pub libraries: Vec<PathBuf>,
    /// Have the kernel count each probe program's runs and run time (BPF run-time
    /// statistics, on all the time commtap runs, not only the tenth-of-a-second windows that
    /// measure the probes' cost for --max-overhead: two more clock reads per probe run).
    /// The daemon serves them as `commtap_probe_program_runs_total` and
    /// `..._seconds_total`; `record` logs them at the end.
    #[arg(long)]
    pub probe_stats: bool,
    /// Keep the probes' estimated cost under PCT percent of each process's time (its calls
    /// times what a call costs: the kernel's trap and our program's run, which the kernel
    /// measures). A process calling MPI so often that timing every call would cost more
    /// (polling with MPI_Iprobe or MPI_Test, MPI_Comm_rank in an inner loop) gets the time
    /// of its hottest routines sampled, its own N: one call in N timed, N doubled until the
    /// estimate fits,
    /// the other calls counted at their entry with no return probe. Calls and bytes stay
    /// exact; the profile's `sampled_time` gives the calls timed and the time estimate's
    /// error. Needs uprobe sessions (Linux 6.13+); 0 times every call.
    #[arg(long, value_name = "PCT", default_value_t = 1.0, value_parser = parse_percent)]
    pub max_overhead: f64,
    /// Do not pause a process while the libraries it just loaded are probed. By default,
    /// when the dynamic linker of a profiled process maps new libraries (`dlopen`: Python's
    /// mpi4py, a framework's NCCL from a wheel, or the libraries a program starts with),
    /// the process is stopped for the moment it takes to probe them (about a millisecond)
    /// and continued, so their very first calls are counted. A process a job-control shell
    /// started on a terminal is never paused (the shell would report it stopped). Without
    /// pausing, such a library is probed as soon as it is seen, after its first calls.
    #[arg(long)]
    pub no_pause_at_load: bool,
    /// The share of the kernel's node-wide maps one user's processes may hold, percent:
    /// their communicators, derived datatypes, collectives' numbering, persistent
    /// requests, counters and per-peer traffic. Past it, a process's new entries are
    /// refused and counted (`handles_refused`, `counter_map_full`, `peers_full`), so that
    /// one user cannot leave the others unmeasured. Freed communicators' per-peer traffic
    /// is moved out of the kernel's map and its entries given back (`peers_folded`): a
    /// code making and freeing grids in a loop keeps finding room. 100 for a node that
    /// only ever runs one user's jobs.
    #[arg(long, value_name = "PCT", default_value_t = collector_common::shares::DEFAULT_USER_SHARE_PCT,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub user_share: u32,
    /// Where the sub-uids users are given are listed (newuidmap's `USER:FIRST:COUNT`
    /// lines, for rootless containers). A user's caps (its share of the kernel's maps,
    /// --user-share; its own libraries probed at once; its exited processes' profiles
    /// kept) count each of its sub-uids as that user, who could otherwise own files and
    /// run processes as thousands of users. Read again when it changes; it must be a
    /// regular file of root's that only root may write. Names resolve through /etc/passwd,
    /// then the user directory (NSS: LDAP, SSSD), asked off the daemon's loop; in root's
    /// own ranges (containers', LXD's) a block of 65,536 counts as one user.
    #[arg(long, value_name = "FILE", default_value = collector::discover::accounts::SUBUID_FILE)]
    pub subuid_file: std::path::PathBuf,
    /// Probe MPI and NCCL only, not the transports' data path beneath them (libfabric's
    /// and UCX's operations, by default counted too, each inside the MPI call that made
    /// it): a trap less per operation an MPI call makes through them (MPICH over UCX: one
    /// per MPI_Send or MPI_Recv, two per 2-rank MPI_Allreduce), without the transport's
    /// sections in the report. A program calling libfabric or UCX itself, without MPI, is
    /// then not profiled.
    #[arg(long)]
    pub no_transports: bool,
    /// Count each routine's calls per call site too: where in the program (or the
    /// library calling MPI: Horovod's, PyTorch's, mpi4py's) each call was made from, named
    /// by the function holding it and its source line where built with -g
    /// (`main+0x2a at app.c:42 (app)`), as mpitrace's profile by call site. The report
    /// gets a "Call sites" table per rank (JSON `call_sites`). One hash update per call
    /// more (about 0.1 us); a call counted at its entry (time sampled) reads its return
    /// address from the stack. A Fortran program's calls are placed where it called its
    /// MPI's Fortran bindings, which are probed too (one more entry probe per Fortran call,
    /// about 1 us). The files a process maps are opened when it is first seen, to name its
    /// sites after it has exited.
    #[arg(long)]
    pub call_sites: bool,
    /// Time every call, whatever it costs (no sampling).
    #[arg(long, conflicts_with = "time_one_in")]
    pub time_every_call: bool,
    /// Time one call in N of every routine whose time may be sampled, whatever the call
    /// rate (instead of --max-overhead: for comparisons and tests).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(collector::session::budget::MAX_ONE_IN)))]
    pub time_one_in: Option<u32>,
}

impl ProbeArgs {
    /// How the probes are loaded, as these flags say.
    pub fn load_options(&self) -> collector::attach::LoadOptions {
        collector::attach::LoadOptions {
            probe_stats: self.probe_stats,
            time_sampling: collector::session::budget::TimeSampling::from_options(
                self.time_every_call,
                self.time_one_in,
                self.max_overhead,
            ),
            pause_at_load: !self.no_pause_at_load,
            transports: !self.no_transports,
            user_share_pct: self.user_share,
            subuid_file: self.subuid_file.clone(),
            call_sites: self.call_sites,
            ..collector::attach::LoadOptions::with_ring_buffer_kib(self.ring_buffer_kib)
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct RecordArgs {
    /// Running processes to attach to (comma separated or repeated). A launcher's PID
    /// (mpirun, mpiexec, a job script: none maps an MPI library) stands for the processes
    /// below it that do: its ranks on this node. One that maps NCCL itself (torchrun) is
    /// watched with the processes below it numbered apart from it (its workers, by RANK).
    #[arg(short, long, value_delimiter = ',', conflicts_with = "command")]
    pub pid: Vec<u32>,
    /// With --pid: attach even where no process maps an MPI, NCCL or libfabric library yet,
    /// and count from the first call of the one it loads later (a Python process before its
    /// `import mpi4py`, a framework before it loads NCCL). Such a process is watched with
    /// every process below it, running or started later (a launcher: `mpirun python
    /// app.py`, `torchrun`). Without it such PIDs are refused as not MPI processes.
    #[arg(long, requires = "pid")]
    pub wait_for_mpi: bool,
    /// Stop recording after this long (e.g. 30s, 5m, 1h30m, 500ms; a bare number is seconds).
    #[arg(allow_negative_numbers = true, short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub out: Outputs,
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Create this file once the probes are attached (for scripts: attach, then go).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Also write a timeline of every call into FILE: FILE.json is the Chrome Trace Event
    /// Format (https://ui.perfetto.dev or chrome://tracing), FILE.pftrace Perfetto's
    /// protobuf format (less than half the size: for large traces). Switches per-call
    /// events on; the profile's counts stay exact whatever the trace loses. Give it twice
    /// (`--trace t.json --trace t.pftrace`) for both formats of the same run.
    #[arg(long, value_name = "FILE")]
    pub trace: Vec<PathBuf>,
    #[command(flatten)]
    pub trace_filter: TraceFilterArgs,
    /// Command to launch and profile, with every process it spawns (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What goes into a trace (shared by `record --trace` and `trace`).
#[derive(clap::Args, Clone, Debug)]
pub struct TraceFilterArgs {
    /// Trace only calls that start in this window, in seconds after the first traced
    /// call: FROM..TO (e.g. 10..20).
    #[arg(long, value_parser = parse_window, value_name = "FROM..TO")]
    pub window: Option<(f64, f64)>,
    /// Trace only these steps of a training loop (with --step-marker): each process's calls
    /// from the start of its marker call that begins step FROM to the start of the one that
    /// begins step TO+1. Steps are counted from when the trace starts, alike in every rank
    /// (a collective marker's instances are numbered); step 0 is the rest of the step under
    /// way then. FROM.. keeps every step from FROM on. `commtap trace` from daemons ends by
    /// itself once every process is past step TO.
    #[arg(
        long,
        value_parser = parse_steps,
        value_name = "FROM..TO",
        requires = "step_marker"
    )]
    pub steps: Option<(u64, Option<u64>)>,
    /// The call that begins each step of a training loop, marked on the timeline (`step 3`,
    /// on the thread that made it; --steps keeps some steps only): ROUTINE, or
    /// ROUTINE@BYTES for its calls of that size only, e.g. MPI_Allreduce@4 (a loss of one
    /// float). A marker is called once a step: `commtap report` lists each rank's calls per
    /// routine and size range, `commtap events` each call's bytes.
    #[arg(long, value_name = "ROUTINE[@BYTES]")]
    pub step_marker: Option<trace::StepMarker>,
    /// Trace only these world ranks (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub ranks: Vec<u32>,
    /// Trace only these routines (comma separated, e.g. MPI_Allreduce,ncclAllReduce).
    #[arg(long, value_delimiter = ',')]
    pub routines: Vec<String>,
    /// Never trace these routines (e.g. MPI_Iprobe,MPI_Test: polls that flood a trace).
    #[arg(long, value_delimiter = ',')]
    pub skip_routines: Vec<String>,
    /// At most N calls per process: its first N are kept, the rest counted as lost.
    #[arg(long, value_name = "N")]
    pub max_events: Option<u64>,
    /// Start another file (FILE.2.json, FILE.3.json ...) past this many MB, each one
    /// loadable on its own (chrome://tracing stops at about 256 MB).
    #[arg(long, default_value_t = 256, value_name = "MB")]
    pub split_mb: u64,
}

impl TraceFilterArgs {
    /// The trace options for writing into `path`.
    pub fn options(self, path: PathBuf) -> trace::TraceOptions {
        trace::TraceOptions {
            path,
            window: self.window,
            steps: self.step_marker.map(|marker| {
                let (from, to) = self.steps.unwrap_or((0, None));
                trace::Steps { from, to, marker }
            }),
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

pub fn parse_advertise(s: &str) -> Result<String, String> {
    if api::snapshot::is_node_api(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?}: expected http(s)://host:port, at most {} bytes",
            api::snapshot::MAX_NODE_API
        ))
    }
}

pub fn parse_window(s: &str) -> Result<(f64, f64), String> {
    let bad = || format!("invalid window {s:?}: expected FROM..TO in seconds, e.g. 10..20");
    let (from, to) = s.split_once("..").ok_or_else(bad)?;
    let from: f64 = from.trim().parse().map_err(|_| bad())?;
    let to: f64 = to.trim().parse().map_err(|_| bad())?;
    if !(from >= 0.0 && to > from) {
        return Err(bad());
    }
    Ok((from, to))
}

pub fn parse_steps(s: &str) -> Result<(u64, Option<u64>), String> {
    let bad = || {
        format!(
            "invalid steps {s:?}: expected FROM..TO (steps 10 to 20: 10..20) or FROM.. (every \
             step from FROM on)"
        )
    };
    let (from, to) = s.split_once("..").ok_or_else(bad)?;
    let from: u64 = from.trim().parse().map_err(|_| bad())?;
    let to = match to.trim() {
        "" => None,
        t => Some(t.parse::<u64>().map_err(|_| bad())?),
    };
    match to {
        Some(t) if t < from => Err(format!(
            "invalid steps {s:?}: the last step ({t}) comes before the first ({from})"
        )),
        Some(u64::MAX) => Err(format!(
            "invalid steps {s:?}: the last step is too large (FROM.. keeps every step from \
             FROM on)"
        )),
        _ => Ok((from, to)),
    }
}

#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    /// The trace file: FILE.json is the Chrome Trace Event Format, FILE.pftrace Perfetto's
    /// protobuf format (smaller, for large traces).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// A node's daemon: unix:///path/to.sock or https://host:port. Repeat it for a job on
    /// several nodes: one file, every node's calls on the first node's clock. Or one
    /// aggregator (https://host:port, with --job): it gathers the calls from the job's
    /// daemons and relays them (this machine need not reach the nodes).
    #[arg(
        long,
        alias = "socket",
        default_value = "unix:///run/commtap/commtap.sock"
    )]
    pub from: Vec<Target>,
    /// With an aggregator: ask it where the job's daemons serve and stream from them
    /// directly (this machine reaches the nodes, with a certificate they accept).
    #[arg(long)]
    pub direct: bool,
    /// Only these processes (comma separated; one --from); the trace ends when all have
    /// exited.
    #[arg(short, long, value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Only the ranks of this job (as `commtap ps` shows it); the trace ends when all of
    /// them have exited.
    #[arg(long)]
    pub job: Option<String>,
    /// Stop after this long (e.g. 30s); else at Ctrl-C, SIGTERM or when the processes end.
    #[arg(allow_negative_numbers = true, short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Create this file once every call from now on goes into the trace.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    #[command(flatten)]
    pub filter: TraceFilterArgs,
}

pub fn parse_user(s: &str) -> Result<u32, String> {
    if let Ok(uid) = s.parse() {
        return Ok(uid);
    }
    nix::unistd::User::from_name(s)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
        .ok_or_else(|| format!("no user {s:?}"))
}

pub fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("invalid mode {s:?}: expected octal, e.g. 660"))
}

/// A duration of more than 0: a period, a limit (0 would stop at once, or spin).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    match parse_duration_or_zero(s)? {
        d if d.is_zero() => Err(format!(
            "invalid duration {:?}: more than 0 is needed",
            s.trim()
        )),
        d => Ok(d),
    }
}

/// A duration, 0 allowed (how long something is kept: 0 is "not at all").
pub fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    // A bare number is seconds (`--duration 30`, `1.5`).
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("invalid duration {s:?}: a number of seconds, not negative"));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration {s:?} ({e}): e.g. 30s, 5m, 1h30m, 500ms, 2d"))
}

/// A percentage: a number from 0 to 100.
fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!(
            "invalid percentage {s:?}: a number from 0 to 100, e.g. 1 or 0.5"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_mins(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_mins(90));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_mins(90));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_hours(48));
        assert!(parse_duration("3 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-5").is_err());
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("0s").is_err());
        assert_eq!(parse_duration_or_zero("0").unwrap(), Duration::ZERO);
        // Too long for a Duration: an error, not a panic.
        assert!(parse_duration("99999999999999999999999").is_err());
        assert!(parse_duration("99999999999999999999999h").is_err());
    }
}
