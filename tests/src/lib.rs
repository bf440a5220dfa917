//! Helpers for commtap's end-to-end tests: build the ground-truth programs with the real
//! MPI compilers, run the real `commtap` binary (as root, real BPF), and compare profiles
//! with what the programs say they did.
//!
//! These tests need root and a BPF-capable kernel; they fail (never skip) without them.
//! `cargo xtask test` builds commtap and runs them with `--test-threads=1`.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

/// An MPI implementation installed by `cargo xtask setup`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mpi {
    /// Debian's Open MPI 4.1.
    OpenMpi,
    /// Debian's MPICH 4.0.
    Mpich,
    /// Intel MPI 2021.14 from PyPI (`impi-rt`, unpacked by `cargo xtask setup` into
    /// [`impi_dir`]), with its own libfabric; MPICH's ABI, so programs build with MPICH's
    /// header and link Intel's `libmpi.so.12`.
    IntelMpi,
}

/// Where `cargo xtask setup` unpacked Intel MPI.
#[track_caller]
pub fn impi_dir() -> PathBuf {
    let dir = PathBuf::from("/opt/commtap-deps/impi-2021.14.2");
    assert!(
        dir.join("bin/mpiexec.hydra").exists(),
        "Intel MPI is not unpacked at {} (run `cargo xtask setup`)",
        dir.display()
    );
    dir
}

/// What an Intel MPI job needs to run over its own libfabric's tcp provider (as Intel's
/// `vars.sh` would set it): `I_MPI_FABRICS=ofi FI_PROVIDER=tcp`, its libfabric and providers.
pub fn impi_env() -> Vec<(&'static str, String)> {
    let dir = impi_dir();
    vec![
        ("I_MPI_FABRICS", "ofi".to_string()),
        ("FI_PROVIDER", "tcp".to_string()),
        (
            "FI_PROVIDER_PATH",
            dir.join("lib/libfabric/prov").display().to_string(),
        ),
        (
            "LD_LIBRARY_PATH",
            dir.join("lib/libfabric").display().to_string(),
        ),
    ]
}

impl Mpi {
    /// Suffix of the Debian alternatives (`mpicc.openmpi`).
    pub fn suffix(self) -> &'static str {
        match self {
            Mpi::OpenMpi => "openmpi",
            Mpi::Mpich => "mpich",
            Mpi::IntelMpi => "impi",
        }
    }

    /// The launcher command line for `np` ranks.
    pub fn launcher(self, np: u32) -> Vec<String> {
        match self {
            Mpi::OpenMpi => vec![
                "mpirun.openmpi".into(),
                "--oversubscribe".into(),
                "-np".into(),
                np.to_string(),
            ],
            Mpi::Mpich => vec!["mpiexec.mpich".into(), "-n".into(), np.to_string()],
            Mpi::IntelMpi => vec![
                impi_dir().join("bin/mpiexec.hydra").display().to_string(),
                "-n".into(),
                np.to_string(),
            ],
        }
    }
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The `commtap` binary under test: `$COMMTAP_BIN`, else `target/debug/commtap`.
#[track_caller]
pub fn commtap_bin() -> PathBuf {
    let p = std::env::var_os("COMMTAP_BIN")
        .map_or_else(|| repo_root().join("target/debug/commtap"), PathBuf::from);
    assert!(
        p.exists(),
        "{} not found: run the tests with `cargo xtask test`",
        p.display()
    );
    p
}

/// A scratch directory for one test (removed when dropped).
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Creates `target/e2e/<name>-<pid>`.
    pub fn new(name: &str) -> Scratch {
        let dir = repo_root()
            .join("target/e2e")
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating scratch dir");
        Scratch(dir)
    }

    /// A path inside the scratch directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Builds `tests/programs/<src>` with `mpi`'s compiler wrapper into `target/e2e/bin`.
#[track_caller]
pub fn build_program(src: &str, mpi: Mpi) -> PathBuf {
    let bin_dir = repo_root().join("target/e2e/bin");
    std::fs::create_dir_all(&bin_dir).expect("creating target/e2e/bin");
    let stem = src.split('.').next().expect("source name");
    let out = bin_dir.join(format!("{stem}.{}", mpi.suffix()));
    let source = repo_root().join("tests/programs").join(src);
    let compiler = if src.ends_with(".f90") {
        format!("mpif90.{}", mpi.suffix())
    } else {
        format!("mpicc.{}", mpi.suffix())
    };
    let mut cmd = Command::new(&compiler);
    cmd.args(["-O1", "-o"]).arg(&out).arg(&source);
    if mpi == Mpi::IntelMpi {
        // MPICH's header and wrapper flags, Intel's library (MPICH ABI compatibility).
        let lib = impi_dir().join("lib");
        cmd = Command::new("cc");
        cmd.args(["-O1", "-I/usr/include/x86_64-linux-gnu/mpich", "-o"])
            .arg(&out)
            .arg(&source)
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lmpi");
    }
    if src.ends_with(".f90") {
        // Keep .mod files out of the source tree.
        cmd.arg("-J").arg(&bin_dir);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e} (run `cargo xtask setup`)"));
    assert!(
        status.success(),
        "{compiler} failed on {}",
        source.display()
    );
    out
}

/// Builds `tests/programs/<src>` with the plain C compiler (no MPI wrapper), linking `libs`.
#[track_caller]
pub fn build_plain_c(src: &str, libs: &[&str]) -> PathBuf {
    compile_c(src, src.trim_end_matches(".c"), libs)
}

/// Builds `tests/programs/<src>` into the shared library `lib<stem>.so`.
#[track_caller]
pub fn build_shared_c(src: &str) -> PathBuf {
    let name = format!("lib{}.so", src.trim_end_matches(".c"));
    compile_c(src, &name, &["-shared", "-fPIC", "-fno-omit-frame-pointer"])
}

/// Builds `tests/programs/<src>` with `cc ARGS` into `target/e2e/bin/<out_name>`.
#[track_caller]
pub fn compile_c(src: &str, out_name: &str, args: &[&str]) -> PathBuf {
    let bin_dir = repo_root().join("target/e2e/bin");
    std::fs::create_dir_all(&bin_dir).expect("creating target/e2e/bin");
    let out = bin_dir.join(out_name);
    let status = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&out)
        .arg(repo_root().join("tests/programs").join(src))
        .args(args)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed on {src}");
    out
}

/// Environment every MPI launch needs here (Open MPI refuses root otherwise).
pub fn mpi_env(cmd: &mut Command) -> &mut Command {
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
}

/// Kills a child process (and its process group) when dropped, so a failing test leaves
/// nothing running.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// Spawns `cmd` in its own process group.
    #[track_caller]
    pub fn spawn(cmd: &mut Command) -> ChildGuard {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        ChildGuard(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}")),
        )
    }

    /// Waits for the child to exit, at most `limit`.
    #[track_caller]
    pub fn wait_with_limit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process {} still running after {limit:?}",
                self.0.id()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: plain kill(2) of our own child's process group.
            unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
}

/// Polls `cond` every 20 ms until it holds, failing after `limit`.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a finished `commtap` run left.
pub struct Run {
    /// Its exit status.
    pub status: std::process::ExitStatus,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Starts `commtap` with `args`, its output going to files in `scratch`.
#[track_caller]
pub fn spawn_commtap(scratch: &Scratch, args: &[&str]) -> ChildGuard {
    spawn_commtap_with_env(scratch, args, &[])
}

/// [`spawn_commtap`] with extra environment variables (which a launched job inherits).
pub fn spawn_commtap_with_env(
    scratch: &Scratch,
    args: &[&str],
    env: &[(&str, String)],
) -> ChildGuard {
    let out = std::fs::File::create(scratch.path("commtap.stdout")).expect("stdout file");
    let err = std::fs::File::create(scratch.path("commtap.stderr")).expect("stderr file");
    let mut cmd = Command::new(commtap_bin());
    mpi_env(&mut cmd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    ChildGuard::spawn(&mut cmd)
}

/// Waits for a `commtap` started by [`spawn_commtap`] and collects its output.
#[track_caller]
pub fn finish_commtap(scratch: &Scratch, mut child: ChildGuard, limit: Duration) -> Run {
    let status = child.wait_with_limit(limit);
    let read = |f: &str| std::fs::read_to_string(scratch.path(f)).unwrap_or_default();
    Run {
        status,
        stdout: read("commtap.stdout"),
        stderr: read("commtap.stderr"),
    }
}

/// Waits for a `commtap` started by [`spawn_commtap`], which must succeed.
#[track_caller]
pub fn finish_ok(scratch: &Scratch, child: ChildGuard, limit: Duration) -> Run {
    let run = finish_commtap(scratch, child, limit);
    assert!(
        run.status.success(),
        "commtap failed: {}\n{}",
        run.status,
        run.stderr
    );
    run
}

/// Runs `commtap` with `args` to completion (at most `limit`).
#[track_caller]
pub fn run_commtap(scratch: &Scratch, args: &[&str], limit: Duration) -> Run {
    let child = spawn_commtap(scratch, args);
    finish_commtap(scratch, child, limit)
}

/// Reads a JSON file.
#[track_caller]
pub fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("parsing {}: {e}\n{text}", path.display()))
}

/// The truth files `prefix.<rank>.json` written by a ground-truth program, by rank.
#[track_caller]
pub fn read_truths(prefix: &Path, np: u32) -> Vec<Value> {
    (0..np)
        .map(|r| {
            let p = PathBuf::from(format!("{}.{r}.json", prefix.display()));
            read_json(&p)
        })
        .collect()
}

/// The profile's rank whose pid is `pid`.
#[track_caller]
pub fn rank_by_pid(profile: &Value, pid: u64) -> &Value {
    profile["ranks"]
        .as_array()
        .expect("ranks array")
        .iter()
        .find(|r| r["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("no rank with pid {pid} in profile:\n{profile:#}"))
}

/// (calls, bytes) per routine, from a truth file or a profile rank.
pub fn routine_table(routines: &Value) -> std::collections::BTreeMap<String, (u64, u64)> {
    routines
        .as_object()
        .expect("routines object")
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                (
                    v["calls"].as_u64().unwrap_or(0),
                    v["bytes"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect()
}

/// Asserts that every rank of `profile` equals its truth: the same routines, calls and
/// bytes, the same communicator sizes, the right rank, nothing undecoded, and every counted
/// call either delivered as an event or counted as dropped. `ignore` names routines the
/// truth does not count (e.g. MPI_Finalize, called after the truth is written).
#[track_caller]
pub fn assert_profile_matches(profile: &Value, truths: &[Value], ignore: &[&str]) {
    assert_eq!(
        profile["ranks"].as_array().map(Vec::len),
        Some(truths.len()),
        "rank count:\n{profile:#}"
    );
    for truth in truths {
        let pid = truth["pid"].as_u64().expect("truth pid");
        let rank = rank_by_pid(profile, pid);
        assert_eq!(rank["rank"], truth["rank"], "rank of pid {pid}");
        let mut got = routine_table(&rank["routines"]);
        got.retain(|k, _| !ignore.contains(&k.as_str()));
        let want = routine_table(&truth["routines"]);
        assert_eq!(
            got, want,
            "rank {}: (calls, bytes) per routine differ",
            truth["rank"]
        );
        if let Some(sizes) = truth["comm_sizes"].as_object() {
            for (routine, want_sizes) in sizes {
                let got_sizes: Vec<u64> = rank["routines"][routine]["comm_sizes"]
                    .as_object()
                    .map(|m| {
                        m.keys()
                            .map(|k| k.parse().expect("numeric comm size"))
                            .collect()
                    })
                    .unwrap_or_default();
                let want_sizes: Vec<u64> = want_sizes
                    .as_array()
                    .expect("sizes")
                    .iter()
                    .map(|v| v.as_u64().expect("size"))
                    .collect();
                assert_eq!(
                    got_sizes, want_sizes,
                    "rank {} {routine}: communicator sizes",
                    truth["rank"]
                );
            }
        }
        assert_eq!(
            rank["undecoded"], 0,
            "rank {}: undecoded calls",
            truth["rank"]
        );
        if profile["call_events"] == true {
            assert_events_account_for_calls(rank);
        } else if profile.get("skew").is_some() || rank["events"] != 0 {
            // Who is late was on (a daemon's or an aggregator's profile does not say).
            assert_events_account_for_collectives(rank);
        } else {
            assert_eq!(
                rank["dropped"], 0,
                "rank {}: call events while they are off",
                truth["rank"]
            );
        }
    }
}

/// Every call in the counters was either delivered as an event or counted as dropped.
#[track_caller]
pub fn assert_events_account_for_calls(rank: &Value) {
    assert_events_account_for(rank, "calls", |_| true);
}

/// With per-call events off but who-is-late on, exactly the calls it needs (collectives,
/// communicator constructors, MPI_Init) were delivered as events or counted as dropped.
#[track_caller]
pub fn assert_events_account_for_collectives(rank: &Value) {
    use collector_common::{routines::routine_id, ROUTINES};
    assert_events_account_for(rank, "calls who-is-late follows", |name| {
        ROUTINES[routine_id(name).expect("a known routine") as usize]
            .spec
            .matters_for_skew()
    });
}

#[track_caller]
fn assert_events_account_for(rank: &Value, what: &str, wanted: impl Fn(&str) -> bool) {
    let calls: u64 = routine_table(&rank["routines"])
        .iter()
        .filter(|(name, _)| wanted(name))
        .map(|(_, (c, _))| c)
        .sum();
    let events = rank["events"].as_u64().expect("events");
    let dropped = rank["dropped"].as_u64().expect("dropped");
    assert_eq!(
        events + dropped,
        calls,
        "rank {}: events {events} + dropped {dropped} != {what} {calls}",
        rank["rank"]
    );
}

/// A minimal HTTP/1.0 GET against a server of ours on loopback; returns the body.
#[track_caller]
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("response");
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP body in {resp:?}"));
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    body.to_string()
}

/// Pids of running processes whose executable is `exe`.
pub fn pids_running(exe: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .as_deref()
            == Some(exe)
        {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

/// Starts `np` ranks of `mpi_loop` (N iterations) that wait at `scratch/go`; returns the
/// launcher and the ranks' pids once they are all running. `env` is passed to every rank
/// (Open MPI's `-x`, MPICH's environment inheritance).
#[track_caller]
pub fn start_waiting_loop(
    scratch: &Scratch,
    mpi: Mpi,
    np: u32,
    n: u64,
    env: &[(&str, &str)],
) -> (ChildGuard, Vec<u32>) {
    let prog = build_program("mpi_loop.c", mpi);
    let launcher = mpi.launcher(np);
    let mut cmd = Command::new(&launcher[0]);
    mpi_env(&mut cmd).args(&launcher[1..]);
    for (k, v) in env {
        if mpi == Mpi::OpenMpi {
            cmd.args(["-x", k]);
        }
        cmd.env(k, v);
    }
    cmd.arg(&prog)
        .arg(scratch.path("ready"))
        .arg(scratch.path("go"))
        .arg(n.to_string())
        .arg(scratch.path("truth"));
    let job = ChildGuard::spawn(&mut cmd);
    wait_until("the job to be ready", Duration::from_mins(1), || {
        scratch.path("ready").exists()
    });
    let mut ranks = Vec::new();
    wait_until("all ranks to be running", Duration::from_secs(10), || {
        ranks = pids_running(&prog);
        ranks.len() == np as usize
    });
    (job, ranks)
}

/// Starts `commtap record --pid PIDS --format json -o OUT` and waits until it has attached;
/// returns it and OUT.
#[track_caller]
pub fn record_attached(scratch: &Scratch, pids: &[u32]) -> (ChildGuard, PathBuf) {
    record_attached_with(scratch, pids, &[])
}

/// [`record_attached`] with more arguments for `record`.
#[track_caller]
pub fn record_attached_with(
    scratch: &Scratch,
    pids: &[u32],
    extra: &[&str],
) -> (ChildGuard, PathBuf) {
    let out = scratch.path("profile.json");
    let ready = scratch.path("commtap.ready");
    let pids = pid_list(pids);
    let mut args = vec![
        "record",
        "--pid",
        &pids,
        "--format",
        "json",
        "-o",
        path_str(&out),
        "--ready-file",
        path_str(&ready),
    ];
    args.extend_from_slice(extra);
    let commtap = spawn_commtap(scratch, &args);
    wait_until("commtap to attach", Duration::from_mins(1), || {
        ready.exists()
    });
    (commtap, out)
}

/// A path as the `&str` argument of a command.
#[track_caller]
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// A `commtap daemon` serving on a socket in its scratch directory; `stop` shuts it down
/// with SIGTERM and checks that it exits cleanly.
pub struct Daemon {
    /// The daemon process.
    pub child: ChildGuard,
    /// Its socket.
    pub socket: PathBuf,
    /// `unix://` + socket.
    pub target: String,
}

impl Daemon {
    /// Starts `[prefix..] commtap [global..] daemon --socket S [args..]` (prefix: e.g.
    /// `ip netns exec NS`) and waits for its socket.
    #[track_caller]
    pub fn start(scratch: &Scratch, prefix: &[&str], global: &[&str], args: &[&str]) -> Daemon {
        let socket = scratch.path("commtap.sock");
        let out = std::fs::File::create(scratch.path("commtap.stdout")).expect("stdout file");
        let err = std::fs::File::create(scratch.path("commtap.stderr")).expect("stderr file");
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(commtap_bin());
                c
            }
            None => Command::new(commtap_bin()),
        };
        cmd.args(global)
            .args(["daemon", "--socket", path_str(&socket)])
            .args(args)
            .stdout(out)
            .stderr(err);
        let child = ChildGuard::spawn(&mut cmd);
        wait_until("the daemon's socket", Duration::from_mins(1), || {
            socket.exists()
        });
        let target = format!("unix://{}", socket.display());
        Daemon {
            child,
            socket,
            target,
        }
    }

    /// SIGTERM; the daemon must exit cleanly and remove its socket.
    #[track_caller]
    pub fn stop(self, scratch: &Scratch) {
        // SAFETY: kill(2) of the daemon we spawned (`ip netns exec` execs it: same pid).
        unsafe { libc::kill(self.child.0.id() as i32, libc::SIGTERM) };
        let run = finish_commtap(scratch, self.child, Duration::from_mins(1));
        assert!(
            run.status.success(),
            "daemon exit: {}\n{}",
            run.status,
            run.stderr
        );
        assert!(!self.socket.exists(), "the socket is removed at shutdown");
    }
}

/// The `lib` directory of the nvidia-nccl-cu13 wheel (the real `libnccl.so.2`) that
/// `cargo xtask setup` installs.
#[track_caller]
pub fn nccl_lib_dir() -> PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))",
        ])
        .output()
        .expect("running python3");
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        out.status.success() && dir.join("libnccl.so.2").exists(),
        "the nvidia-nccl-cu13 wheel is not installed (run `cargo xtask setup`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Builds a C test program that calls NCCL through `tests/programs/nccl_abi.h`, linked
/// against the libraries in `lib_dir` named `libs` (`libnccl.so.2`, or stand-ins).
#[track_caller]
pub fn build_nccl_program(src: &str, lib_dir: &Path, libs: &[&str]) -> PathBuf {
    let mut args = vec![
        format!("-I{}", repo_root().join("tests/programs").display()),
        format!("-L{}", lib_dir.display()),
        format!("-Wl,-rpath,{}", lib_dir.display()),
    ];
    args.extend(libs.iter().map(|l| format!("-l:{l}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    build_plain_c(src, &args)
}

/// A TCP address on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("addr").to_string()
}

/// Runs `script` with sh; panics with its stderr if it fails.
#[track_caller]
pub fn sh(script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("running sh");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a server certificate for 127.0.0.1 and the test namespaces' host
/// addresses (10.231.1.1, 10.231.2.1): (ca, cert, key).
pub fn make_certs(
    dir: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let d = dir.display();
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,IP:10.231.1.1,IP:10.231.2.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext.cnf");
    sh(&format!(
        "cd {d} && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 \
         -subj /CN=commtap-test-ca 2>&1 && openssl req -newkey rsa:2048 -nodes -keyout server.key \
         -out server.csr -subj /CN=aggregator 2>&1 && openssl x509 -req -in server.csr -CA ca.pem \
         -CAkey ca.key -CAcreateserial -out server.pem -days 1 -extfile ext.cnf 2>&1"
    ));
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

/// A client certificate with common name `cn` and, if given, organizational unit `ou` (an
/// aggregator reads a caller's role there), signed by the CA [`make_certs`] made in `dir`:
/// (cert, key).
pub fn make_client_cert(dir: &Path, cn: &str, ou: Option<&str>) -> (PathBuf, PathBuf) {
    let d = dir.display();
    let name = format!("{cn}-{}", ou.unwrap_or("none"));
    std::fs::write(
        dir.join(format!("{name}.cnf")),
        format!("subjectAltName=DNS:{cn}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth,serverAuth\n"),
    )
    .expect("client cnf");
    let subject = match ou {
        Some(ou) => format!("/OU={ou}/CN={cn}"),
        None => format!("/CN={cn}"),
    };
    sh(&format!(
        "cd {d} && openssl req -newkey rsa:2048 -nodes -keyout {name}.key -out {name}.csr \
         -subj {subject} 2>&1 && openssl x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key \
         -CAcreateserial -out {name}.pem -days 1 -extfile {name}.cnf 2>&1"
    ));
    (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    )
}

/// Starts `program` (which creates `scratch/ready` once it mapped what it maps), and
/// asserts `commtap record --pid` refuses it with exit status 2 and `needle` in its message.
#[track_caller]
pub fn assert_record_refuses(scratch: &Scratch, program: &mut Command, needle: &str) {
    let app = ChildGuard::spawn(program);
    wait_until("the program to be ready", Duration::from_mins(1), || {
        scratch.path("ready").exists()
    });
    let pid = app.0.id().to_string();
    let run = run_commtap(scratch, &["record", "--pid", &pid], Duration::from_mins(2));
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains(needle), "{}", run.stderr);
}

/// The paths of the libraries a profile says were probed.
pub fn probed_paths(profile: &Value) -> Vec<&str> {
    profile["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .filter_map(|l| l["path"].as_str())
        .collect()
}

/// Runs `commtap ARGS` to completion and returns its output.
pub fn commtap_output(args: &[&str]) -> std::process::Output {
    Command::new(commtap_bin())
        .args(args)
        .output()
        .expect("running commtap")
}

/// `commtap ARGS --format json` (a `report`), which must succeed: its JSON profile.
#[track_caller]
pub fn report_json(args: &[&str]) -> Value {
    let out = commtap_output(&[args, &["--format", "json"]].concat());
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON profile")
}

/// The state (`probed`, `exited` ...) of each process `commtap ps` lists.
pub fn ps_states(target: &str) -> std::collections::BTreeMap<u64, String> {
    let out = commtap_output(&["ps", "--from", target]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let pid = fields.next()?.parse().ok()?;
            // The job column may be empty: the state is the first known word after the pid.
            let state = fields.find(|f| ["probed", "exited", "no-mpi"].contains(f))?;
            Some((pid, state.to_string()))
        })
        .collect()
}

#[track_caller]
/// Waits until the daemon lists every one of `pids` in `state`. By pid: a daemon that
/// watches the whole node also sees the processes of tests running beside this one.
pub fn wait_for_state(target: &str, pids: &[u64], state: &str) {
    wait_until(
        &format!("the daemon to list {pids:?} as {state}"),
        Duration::from_secs(30),
        || {
            let states = ps_states(target);
            pids.iter()
                .all(|p| states.get(p).is_some_and(|s| s == state))
        },
    );
}

/// Waits until the daemon lists every one of `pids` as exited (their profiles final).
#[track_caller]
pub fn wait_for_exited(target: &str, pids: &[u64]) {
    wait_for_state(target, pids, "exited");
}

/// The pids of the ranks whose truths these are.
pub fn pids_of(truths: &[Value]) -> Vec<u64> {
    truths.iter().filter_map(|t| t["pid"].as_u64()).collect()
}

/// The (calls, bytes) per routine of an `mpi_loop` rank counted from `MPI_Init`, less what
/// it did before `go` (MPI_Init, Comm_rank, Comm_size and a Barrier; MPI_Finalize after
/// its truth was written): what its truth file holds. Panics if those calls are not there
/// exactly once.
#[track_caller]
pub fn loop_counts_after_go(routines: &Value) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut got = routine_table(routines);
    for before in ["MPI_Init", "MPI_Comm_rank", "MPI_Comm_size", "MPI_Finalize"] {
        assert_eq!(
            got.remove(before).map(|(calls, _)| calls),
            Some(1),
            "{before}"
        );
    }
    if let Some(b) = got.get_mut("MPI_Barrier") {
        b.0 -= 1;
    }
    got
}

/// Runs `mpi_truth` (3 iterations) as `np` ranks of `mpi` to completion, writing its truths
/// to `prefix.<rank>.json`; returns them by rank.
#[track_caller]
pub fn run_truth_job(prefix: &Path, mpi: Mpi, np: u32) -> Vec<Value> {
    let prog = build_program("mpi_truth.c", mpi);
    let launcher = mpi.launcher(np);
    let mut cmd = Command::new(&launcher[0]);
    mpi_env(&mut cmd)
        .args(&launcher[1..])
        .arg(&prog)
        .arg(prefix);
    let mut job = ChildGuard::spawn(&mut cmd);
    assert!(
        job.wait_with_limit(Duration::from_mins(5)).success(),
        "{mpi:?} job failed"
    );
    read_truths(prefix, np)
}

/// uid and gid of `nobody`, the unprivileged user tests act as.
pub const NOBODY: u32 = 65534;

/// A directory in `scratch` that belongs to `nobody`.
pub fn nobody_dir(scratch: &Scratch, name: &str) -> PathBuf {
    let dir = scratch.path(name);
    std::fs::create_dir_all(&dir).expect("dir");
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).expect("chown");
    dir
}

/// A copy of `from` at `to`, owned by `nobody`.
pub fn copy_as_nobody(from: &Path, to: &Path) {
    std::fs::copy(from, to).expect("copy");
    std::os::unix::fs::chown(to, Some(NOBODY), Some(NOBODY)).expect("chown");
}

/// A command that runs `program` as `nobody`, with no groups (add its arguments).
pub fn as_nobody(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(program);
    cmd
}

/// `program ARGS` run as `nobody`, with no groups.
pub fn spawn_as_nobody(program: &Path, args: &[&str]) -> ChildGuard {
    ChildGuard::spawn(as_nobody(program).args(args))
}

/// What Chrome DevTools' trace engine finds in a Chrome JSON trace
/// (`tests/consumers/devtools.mjs`): per process (by pid) its `name`, `threads`,
/// `routines` ({slices, bytes}) and `nested` pairs; `flows`; the file's `metadata`.
#[track_caller]
pub fn devtools_summary(trace: &Path) -> Value {
    let out = Command::new("node")
        .arg(repo_root().join("tests/consumers/devtools.mjs"))
        .arg(trace)
        .output()
        .expect("running node (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "DevTools' trace engine could not load {}: {}",
        trace.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the consumer's JSON")
}

/// (slices, bytes) per routine of process `pid` in a [`devtools_summary`] (empty if the
/// trace holds none of its calls).
pub fn traced_routines(
    summary: &Value,
    pid: u64,
) -> std::collections::BTreeMap<String, (u64, u64)> {
    summary["processes"][pid.to_string()]["routines"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| {
                    let n = |f: &str| v[f].as_u64().unwrap_or(0);
                    (k.clone(), (n("slices"), n("bytes")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Pids as a command line's comma-separated list (`--pid 811,812`).
pub fn pid_list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Peak resident memory of `pid` in KiB (`VmHWM`).
pub fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

/// (calls, bytes) per routine of each rank of a JSON profile, by pid.
pub fn rank_tables(
    profile: &Value,
) -> std::collections::BTreeMap<u64, std::collections::BTreeMap<String, (u64, u64)>> {
    profile["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| {
            (
                r["pid"].as_u64().expect("pid"),
                routine_table(&r["routines"]),
            )
        })
        .collect()
}

/// `commtap GLOBAL.. report --from FROM --job JOB --format json -o OUT`: the profile, or
/// None if the report failed (not there yet, say).
pub fn try_job_report(global: &[&str], from: &str, job: &str, out: &Path) -> Option<Value> {
    let args = [
        global,
        &[
            "report",
            "--from",
            from,
            "--job",
            job,
            "--format",
            "json",
            "-o",
            path_str(out),
        ],
    ]
    .concat();
    commtap_output(&args)
        .status
        .success()
        .then(|| read_json(out))
}
