//! `commtap`: the command line over the `collector` library (see its documentation for
//! the stages of the data's flow). `args` holds what the flags are, `commands` what each
//! command does with them.

mod args;
mod commands;
mod config;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

use args::{
    AggregatorArgs, AttachArgs, CompareArgs, ConfigArgs, DaemonArgs, DetachArgs, DiffArgs,
    DoctorArgs, EventsArgs, JobsArgs, PsArgs, RecordArgs, ReportArgs, TopArgs, TraceArgs,
};

/// commtap: profile the communication of running MPI and NCCL jobs with eBPF: no relink,
/// no LD_PRELOAD, no restart.
///
/// Probes MPI entry points (Open MPI, MPICH and Intel MPI, the MPI-5 standard ABI), NCCL's
/// (libnccl, librccl, or NCCL linked in) and the transports beneath them (libfabric's
/// provider ops tables, UCX's ucp_* operations) in running processes and reports, per
/// rank, routine, message size and (NCCL) communicator, calls, bytes and time, in IBM
/// mpitrace's layout or as JSON.
/// Needs root (or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and
/// CAP_CHECKPOINT_RESTORE).
#[derive(Parser, Debug)]
#[command(name = "commtap", version, propagate_version = true)]
struct Cli {
    /// Log filter, e.g. `info`, `commtap=debug` (given here or as COMMTAP_LOG, it wins over
    /// RUST_LOG; RUST_LOG applies when neither is). Without any: `warn`, and `info` for
    /// `daemon` and `aggregator` (what they serve, probe and keep, and their stop).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        default_value = "warn",
        env = "COMMTAP_LOG"
    )]
    log: String,
    /// CA certificate bundle (PEM) that authenticates https:// aggregators and daemons.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "COMMTAP_TLS_CA"
    )]
    tls_ca: Option<PathBuf>,
    /// This program's TLS certificate chain (PEM): what a client presents to a server that
    /// asks for one (--tls-client-ca), and what `daemon --listen` and `aggregator` serve
    /// with (a daemon presents it when pushing, too).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        requires = "tls_key",
        env = "COMMTAP_TLS_CERT"
    )]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        requires = "tls_cert",
        env = "COMMTAP_TLS_KEY"
    )]
    tls_key: Option<PathBuf>,
    /// How log lines are written to standard error: `text` for people, `json` (one object
    /// per line: timestamp, level, message and fields) for a log collector.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        default_value = "text",
        env = "COMMTAP_LOG_FORMAT"
    )]
    log_format: LogFormat,
    /// Configuration file (TOML) with any option of any command; default
    /// /etc/commtap/commtap.toml where it exists. Flags and COMMTAP_* variables win over it
    /// (`commtap config --example` prints one with every option).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "COMMTAP_CONFIG",
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    /// Lines for people.
    Text,
    /// One JSON object per line.
    Json,
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
    /// kept in the kernel, which no event loss can thin out. Every output file is checked
    /// before anything runs.
    ///
    /// Exit status: 0 with a profile; the launched command's own when it failed (its
    /// profile written all the same); 2 when nothing could be profiled, with the reason
    /// (files from an earlier run are then left as they were).
    #[command(verbatim_doc_comment)]
    Record(RecordArgs),
    /// Run the node daemon: count every MPI, NCCL or libfabric process on this node from its first call and
    /// serve their profiles over gRPC (commtap.v1.Node) on a Unix socket.
    ///
    /// Start it from systemd or a Slurm prolog; query it with `commtap report` and
    /// `commtap ps`, or any gRPC client (health and server reflection are served).
    Daemon(DaemonArgs),
    /// Print a profile: one saved with `record --format json -o FILE`, or the one a daemon
    /// (or aggregator) holds, as `record` prints it.
    ///
    /// Examples: commtap report --profile profile.json --html job.html
    ///           commtap report --from unix:///run/commtap/commtap.sock --job 4242
    #[command(verbatim_doc_comment)]
    Report(ReportArgs),
    /// A live view of a daemon's or an aggregator's jobs, as `top` shows processes: per
    /// routine the calls, bytes and share of time over the last interval, the busiest
    /// ranks, what could not be measured, the rank the others wait for.
    ///
    /// Examples:
    ///   commtap top                                    (this node's daemon)
    ///   commtap top --from https://aggregator:7443 --job 4242 --interval 5s
    ///
    /// Keys: s sort (time share, calls/s, bytes/s, name), j next job, r next rank,
    /// a all jobs and ranks, p or space pause, q or Esc quit.
    #[command(verbatim_doc_comment)]
    Top(TopArgs),
    /// List the processes a daemon knows and the libraries it probes (command lines cut
    /// at 256 characters; `report --format json` has them whole). `--format json`: one
    /// document, `{"processes": [{"pid", "rank", "job", "state", "cmdline", "container"}],
    /// "libraries": [{"path", "flavor", "probes"}]}`, command lines whole.
    Ps(PsArgs),
    /// Check this node: kernel, capabilities, BPF, mounts, the MPI and NCCL libraries the
    /// linker finds, and the daemon. Run it first on a new node; each problem comes with
    /// its fix, and the exit status is 1 when something commtap needs is missing.
    /// `--format json`: an array of `{name, status, detail, fix}`.
    Doctor(DoctorArgs),
    /// Ask the daemon to watch a running process (the daemon finds new MPI processes by
    /// itself; this is for one it does not watch, e.g. outside its --uid/--cgroup scope).
    /// `--format json`: the process as one object, as `ps --format json` lists each.
    Attach(AttachArgs),
    /// Ask the daemon to stop watching a process; prints its profile so far (kept as final).
    Detach(DetachArgs),
    /// Print every completed call of the daemon's processes as JSON lines (for timelines):
    /// pid, tid, routine, start_ns, duration_ns, bytes, peer, comm_size, comm_rank, comm,
    /// a point-to-point call's tag, and a collective's instance number `seq` (`seq_local`:
    /// this node's own numbering; see the trace arguments in the README); `{"exited":
    /// PID}` after a process's last call, `{"detached": PID}` where it was detached (or
    /// attached again after it: its calls after do not go on from those before). Per-call
    /// events are switched on while this runs; a last line says how many this reader
    /// missed.
    Events(EventsArgs),
    /// Write a timeline of every call of a daemon's processes, as they run (no relaunch).
    ///
    /// Examples:
    ///   commtap trace --job 4242 -o job4242.json          (until the job's ranks exit)
    ///   commtap trace --pid 811,812 --duration 30s -o t.json
    ///   commtap trace --skip-routines MPI_Iprobe --max-events 100000 -o t.json
    ///   commtap trace --from https://node07:7481 --from https://node08:7481 --job 4242 -o t.json
    ///                                       (one file, both nodes on node07's clock)
    ///   commtap trace --from https://aggregator:7443 --job 4242 -o t.pftrace
    ///                                       (the job's nodes, as the aggregator knows them)
    ///   commtap trace --job 4242 --steps 10..20 --step-marker MPI_Allreduce@4 -o t.json
    ///                                       (steps 10 to 20 of every rank, each marked;
    ///                                        ends by itself after step 20)
    ///
    /// Open the file in https://ui.perfetto.dev (.json or .pftrace) or chrome://tracing
    /// (.json): one process per rank (`rank R (host)`, in rank order), one track per
    /// thread, one slice per call with its bytes, size bucket, peer, tag and communicator,
    /// an arrow from each send to the receive that took its message (for processes traced
    /// from MPI_Init). Ctrl-C or SIGTERM ends it with a complete file; calls it could not
    /// hold are counted in the file and printed.
    #[command(verbatim_doc_comment)]
    Trace(TraceArgs),
    /// Run an aggregator: merge the ranks of jobs across nodes from the snapshots daemons
    /// push (`commtap daemon --aggregator http://HOST:PORT`), persisted across restarts.
    Aggregator(AggregatorArgs),
    /// List the jobs an aggregator knows. `--format json`: one document, `{"jobs":
    /// [{"job", "ranks", "calls", "nodes"}]}`.
    Jobs(JobsArgs),
    /// Compare a job's NCCL bus bandwidth per message size with an nccl-tests table.
    ///
    /// The expected curve is the out-of-place busbw of an nccl-tests / rccl-tests output
    /// (`all_reduce_perf -b 64K -e 4G -f 2 ...` as printed), or its in-place busbw with
    /// --in-place (PyTorch DDP's AllReduces are in place). The measured one is a commtap
    /// profile's NCCL device time (a JSON profile, or a daemon or aggregator), or another
    /// nccl-tests table. Size buckets measured below --threshold x expected are flagged.
    /// Exit status: 0 nothing below, 1 some bucket below, 2 error.
    ///
    /// Examples:
    ///   commtap compare --expected allreduce_baseline.txt --profile job.json
    ///   commtap compare --expected baseline.txt --from https://agg:7443 --job 4242
    ///   commtap compare --expected a.txt --expected-table 2 --measured b.txt
    ///   commtap compare --expected allreduce_baseline.txt --profile ddp.json --in-place
    #[command(verbatim_doc_comment)]
    Compare(CompareArgs),
    /// Compare two profiles of a job: before and after a change (an MPI or NCCL setting, a
    /// plugin, the code).
    ///
    /// The job's elapsed time, MPI communication time and time waited for late ranks, then
    /// per routine (all ranks: calls, bytes, time) and per rank (communication and elapsed
    /// time), what moved most first; for NCCL, each operation's bus bandwidth per message
    /// size where both measured device time; where both counted call sites
    /// (`--call-sites`), the calls and time of each routine per calling function. Each a
    /// JSON profile `record --json` or
    /// `report --format json` wrote.
    ///
    /// Examples:
    ///   commtap diff before.json after.json
    ///   commtap diff --format json before.json after.json | jq '.routines[0]'
    #[command(verbatim_doc_comment)]
    Diff(DiffArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell.
    ///
    /// Examples:
    ///   commtap completions bash > /etc/bash_completion.d/commtap
    ///   commtap completions zsh > "${fpath[1]}/_commtap"
    ///   commtap completions fish > ~/.config/fish/completions/commtap.fish
    #[command(verbatim_doc_comment)]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the manual pages: commtap.1 and one per command (commtap-record.1 ...).
    ///
    /// Example:
    ///   commtap man --out /usr/local/share/man/man1 && man commtap-record
    #[command(verbatim_doc_comment)]
    Man {
        /// The directory to write them into (created if missing).
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
    /// Print a configuration file holding every option, documented, or show what a command
    /// would run with and where each value comes from (flag, environment, file, default).
    ///
    /// Every option is also an environment variable: COMMTAP_<COMMAND>_<OPTION> (e.g.
    /// COMMTAP_DAEMON_LISTEN), COMMTAP_<OPTION> for the options of every command (e.g.
    /// COMMTAP_TLS_CA). A flag wins over the environment, which wins over the file.
    ///
    /// Examples:
    ///   commtap config --example > /etc/commtap/commtap.toml
    ///   commtap config --show daemon
    ///   commtap --config site.toml config --show aggregator --listen 0.0.0.0:7480
    #[command(verbatim_doc_comment)]
    Config(ConfigArgs),
    /// Print the JSON Schema (draft 2020-12) of the JSON profile, `commtap.profile.v1`, as
    /// `record --format json`, `report --format json` and the aggregator write it (the same
    /// file is in the repository: docs/commtap.profile.v1.schema.json).
    ///
    /// Example:
    ///   commtap schema > commtap.profile.v1.schema.json
    #[command(verbatim_doc_comment)]
    Schema,
    /// Show what commtap finds of a process's libfabric endpoints and ops tables.
    #[command(hide = true)]
    ScanFabric {
        /// The process.
        #[arg(long)]
        pid: u32,
    },
    /// Simulated daemons pushing to a running aggregator (used by `cargo xtask bench`).
    #[command(hide = true)]
    BenchPush {
        /// The aggregator (plaintext, `--insecure-tcp`).
        #[arg(long)]
        to: std::net::SocketAddr,
        /// Simulated daemons, each from an address of its own (127.1.x.y).
        #[arg(long, default_value_t = 1000)]
        daemons: u32,
        /// Nodes each simulated daemon pushes for (more than 1: it is a relay of a tree).
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        /// Ranks per node.
        #[arg(long, default_value_t = 8)]
        ranks: u32,
        /// How long.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Each daemon pushes this often.
        #[arg(long, default_value = "1s", value_parser = args::parse_duration)]
        interval: std::time::Duration,
    },
    /// Benchmark who-is-late's matching, per call event (used by `cargo xtask bench`).
    #[command(hide = true)]
    BenchMatching {
        /// Ranks of the simulated job.
        #[arg(long, default_value_t = 8)]
        ranks: u32,
        /// Collective instances (calls per rank).
        #[arg(long, default_value_t = 200_000)]
        instances: u64,
        /// Rounds (the median is reported).
        #[arg(long, default_value_t = 5)]
        rounds: u32,
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

/// The command line's definition, with an environment variable for every option.
pub fn cli_command() -> clap::Command {
    use clap::CommandFactory as _;
    config::with_env(Cli::command())
}

/// `commtap config`: the example file, or what a command would run with.
fn configuration(cmd: &clap::Command, a: &ConfigArgs, file: Option<&std::path::Path>) -> ExitCode {
    if a.example {
        print!("{}", config::example(cmd));
        return ExitCode::SUCCESS;
    }
    let mut argv: Vec<std::ffi::OsString> = vec!["commtap".into()];
    if let Some(f) = file {
        argv.extend(["--config".into(), f.as_os_str().to_owned()]);
    }
    argv.extend(a.show.iter().map(Into::into));
    match config::show(cmd, argv) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("commtap: {e}");
            ExitCode::from(2)
        }
    }
}

/// The log filter: `--log` (or `COMMTAP_LOG`) when given, else `RUST_LOG` when set, else
/// the default (`info` for a `server`, which an operator should hear start, say where it
/// serves and stop): an explicit choice is never overridden by the generic variable.
fn log_filter(log: &str, explicit: bool, rust_log: Option<String>, server: bool) -> String {
    match rust_log {
        Some(r) if !explicit && !r.trim().is_empty() => r,
        _ if !explicit && server => "info".to_string(),
        _ => log.to_string(),
    }
}

fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|e| {
        eprintln!("commtap: log filter {filter:?} not understood ({e}); logging warnings");
        tracing_subscriber::EnvFilter::new("warn")
    });
    // Colours only for a terminal: a log file or a job's output file gets plain text.
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

fn main() -> ExitCode {
    use clap::{parser::ValueSource, FromArgMatches as _};
    let cmd = cli_command();
    let argv = match config::with_file(&cmd, std::env::args_os().collect()) {
        Ok((argv, _)) => argv,
        Err(e) => {
            eprintln!("commtap: {e}");
            return ExitCode::from(2);
        }
    };
    let matches = cmd.clone().get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Command::Config(a) = &cli.command {
        return configuration(&cmd, a, cli.config.as_deref());
    }
    let explicit = matches
        .value_source("log")
        .is_some_and(|s| s != ValueSource::DefaultValue);
    init_logging(
        &log_filter(
            &cli.log,
            explicit,
            std::env::var("RUST_LOG").ok(),
            matches!(cli.command, Command::Daemon(_) | Command::Aggregator(_)),
        ),
        cli.log_format,
    );
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
    // glibc gives each thread that allocates an arena of its own and keeps what each one
    // freed: a daemon answering requests on several threads kept a copy of all the counters
    // per thread (a user's 65,536 counters grew it by 97 MiB; with two arenas by 44, with
    // one by 30). Only the servers, which live for weeks: `record`'s trace writer keeps
    // up with its reader through a burst of events on an arena of its own.
    if matches!(cli.command, Command::Daemon(_) | Command::Aggregator(_)) {
        // SAFETY: before any thread starts.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
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
    let result = rt.block_on(commands::run(cli.command, identity));
    match result {
        Ok(code) => code,
        // Its reader gone (`commtap ps | head`): nothing more to say, as `ls` would.
        Err(e) if e.is::<collector::report::StdoutClosed>() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("commtap: {}", collector::api::status::error_text(&e));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        cli_command().debug_assert();
    }

    #[test]
    fn an_explicit_log_filter_is_never_overridden_by_rust_log() {
        let rust_log = || Some("debug".to_string());
        assert_eq!(log_filter("error", true, rust_log(), false), "error");
        assert_eq!(log_filter("warn", false, rust_log(), false), "debug");
        assert_eq!(log_filter("warn", false, None, false), "warn");
        assert_eq!(log_filter("warn", false, Some(" ".into()), false), "warn");
        // A server says what it does unless told otherwise.
        assert_eq!(log_filter("warn", false, None, true), "info");
        assert_eq!(log_filter("warn", true, None, true), "warn");
        assert_eq!(log_filter("warn", false, rust_log(), true), "debug");
    }
}
