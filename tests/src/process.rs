//! Processes a test starts and must clean up: scratch directories, child guards, waiting
//! with a deadline, programs run as the unprivileged `nobody`.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use crate::{build_program, mpi_env, repo_root, Mpi};

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
                "process {} still running after {limit:?}; it and its descendants (state, \
                 what each waits in):\n{}",
                self.0.id(),
                process_tree_listing(self.0.id())
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `pid` and its descendants as `ps` lists them, with their state and the kernel function
/// each waits in: what a test that timed out was stuck on.
fn process_tree_listing(pid: u32) -> String {
    let out = Command::new("ps")
        .args(["-e", "-o", "pid,ppid,stat,wchan:24,args"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_default();
    let rows: Vec<(u32, u32, &str)> = lines
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?, l))
        })
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(rows.iter().filter(|r| r.1 == parent).map(|r| r.0));
        i += 1;
    }
    let shown: Vec<&str> = rows
        .iter()
        .filter(|r| tree.contains(&r.0))
        .map(|r| r.2)
        .collect();
    format!("{header}\n{}", shown.join("\n"))
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

/// Starts `cmd` (`program ARGS`) as the process given the pid `pid`, a pid free now: shells
/// waiting on their input are started, the kernel told to give the next process `pid`
/// (`ns_last_pid`: root only), until one has it (a process started elsewhere meanwhile may
/// take it first: then again); that one is told to exec `program`.
#[track_caller]
pub fn spawn_with_pid(pid: u32, cmd: &Command) -> ChildGuard {
    use std::io::Write;
    for _ in 0..1000 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("setting the next pid (root only)");
        let mut gate = Command::new("sh");
        gate.arg("-c")
            .arg("read go && exec \"$0\" \"$@\"")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .stdin(std::process::Stdio::piped());
        let mut child = ChildGuard::spawn(&mut gate);
        if child.0.id() == pid {
            writeln!(child.0.stdin.take().expect("its input"), "go").expect("go");
            return child;
        }
    }
    panic!("pid {pid} was never given to a process started here");
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
    let args = [
        scratch.path("ready").into_os_string(),
        scratch.path("go").into_os_string(),
        n.to_string().into(),
        scratch.path("truth").into_os_string(),
    ];
    let started = start_waiting_program(scratch, mpi, np, &prog, &args, env);
    // Every rank's own marker: each is out of its last MPI call before the go, so no probe
    // runs until the go file (a test reading counters now reads still ones).
    wait_until("every rank to be ready", Duration::from_mins(1), || {
        (0..np).all(|r| scratch.path(&format!("ready.{r}")).exists())
    });
    started
}

/// Starts `np` ranks of `prog` with `args`, which create `scratch/ready` and then wait (for
/// a go file the test writes); returns the launcher and the ranks' pids once `ready` is
/// there and they are all running. `env` is passed to every rank (Open MPI's `-x`,
/// MPICH's environment inheritance), after what every job of `mpi` needs
/// ([`Mpi::job_env`]).
#[track_caller]
pub fn start_waiting_program(
    scratch: &Scratch,
    mpi: Mpi,
    np: u32,
    prog: &Path,
    args: &[std::ffi::OsString],
    env: &[(&str, &str)],
) -> (ChildGuard, Vec<u32>) {
    let job = spawn_job(mpi, np, prog, args, env);
    wait_until("the job to be ready", Duration::from_mins(1), || {
        scratch.path("ready").exists()
    });
    let mut ranks = Vec::new();
    wait_until("all ranks to be running", Duration::from_secs(10), || {
        ranks = pids_running(prog);
        ranks.len() == np as usize
    });
    (job, ranks)
}

/// Starts `np` ranks of `prog` (a program that takes `HOLD_BEFORE_INIT`: `ready_go.h`'s
/// `hold_before_init`) held before `MPI_Init`: each writes its pid to `scratch`'s
/// `start.<rank>` and waits for `start`, which the caller creates once it watches them (a
/// daemon per node, each seeing its ranks' `MPI_Init`). The job, and its ranks' pids in
/// rank order.
#[track_caller]
pub fn start_program_held_before_init(
    scratch: &Scratch,
    mpi: Mpi,
    np: u32,
    prog: &Path,
    args: &[std::ffi::OsString],
    env: &[(&str, &str)],
) -> (ChildGuard, Vec<u32>) {
    let start = scratch.path("start");
    let env: Vec<(&str, &str)> = env
        .iter()
        .copied()
        .chain([("HOLD_BEFORE_INIT", path_str(&start))])
        .collect();
    let job = spawn_job(mpi, np, prog, args, &env);
    let pids = (0..np)
        .map(|rank| {
            let path = format!("{}.{rank}", start.display());
            let mut pid = None;
            wait_until("a rank's pid", Duration::from_mins(1), || {
                pid = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                pid.is_some()
            });
            pid.expect("a pid")
        })
        .collect();
    (job, pids)
}

/// Launches `np` ranks of `prog` with `args` under `mpi`'s launcher, `env` passed to every
/// rank (Open MPI's `-x`, MPICH's environment inheritance) after [`Mpi::job_env`].
fn spawn_job(
    mpi: Mpi,
    np: u32,
    prog: &Path,
    args: &[std::ffi::OsString],
    env: &[(&str, &str)],
) -> ChildGuard {
    let launcher = mpi.launcher(np);
    let mut cmd = Command::new(&launcher[0]);
    mpi_env(&mut cmd).envs(mpi.job_env()).args(&launcher[1..]);
    for (k, v) in env {
        if mpi == Mpi::OpenMpi {
            cmd.args(["-x", k]);
        }
        cmd.env(k, v);
    }
    cmd.arg(prog).args(args);
    ChildGuard::spawn(&mut cmd)
}

/// A path as the `&str` argument of a command.
#[track_caller]
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
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

/// The share of a core `pid` used over `window` (its user and system time, from
/// `/proc/PID/stat`, against the time that passed).
pub fn cpu_share(pid: u32, window: std::time::Duration) -> f64 {
    let cpu = || -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let after_name = &stat[stat.rfind(')').expect("comm") + 2..];
        let fields: Vec<f64> = after_name
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0.0))
            .collect();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        // utime and stime: fields 14 and 15, counted from the state (field 3).
        (fields[14 - 3] + fields[15 - 3]) / hz
    };
    let (before, at) = (cpu(), std::time::Instant::now());
    std::thread::sleep(window);
    (cpu() - before) / at.elapsed().as_secs_f64()
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

/// A sub-uid file (`/etc/subuid`'s form, for `--subuid-file`) in `scratch` that gives
/// `nobody` the 65,536 sub-uids from `first`: root's, and writable by root only (whatever
/// the umask), or the daemon would not read it.
pub fn nobody_subuid_file(scratch: &Scratch, first: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = scratch.path("subuid");
    // Written beside it and renamed over it, as `usermod` does: a daemon reading it never
    // finds it empty or half written.
    let new = scratch.path("subuid.new");
    std::fs::write(&new, format!("{NOBODY}:{first}:65536\n")).expect("subuid file");
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::fs::rename(&new, &path).expect("rename");
    path
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

/// The cgroup v2 mount point of this machine.
pub fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mounts
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            right
                .starts_with("cgroup2 ")
                .then(|| PathBuf::from(left.split_whitespace().nth(4).expect("mount point")))
        })
        .expect("a cgroup v2 hierarchy (the daemon's --cgroup needs one)")
}

/// A test cgroup `<name>-<test pid>` under the cgroup v2 root, removed when dropped (once
/// its processes are gone).
pub struct CgroupGuard(pub PathBuf);

impl CgroupGuard {
    /// Creates it.
    pub fn new(name: &str) -> CgroupGuard {
        let dir = cgroup2_root().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating a test cgroup");
        CgroupGuard(dir)
    }

    /// A shell command line that moves the shell into this cgroup, then execs `cmd`.
    pub fn exec_inside(&self, cmd: &str) -> String {
        format!("echo $$ > {}/cgroup.procs && exec {cmd}", self.0.display())
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The system's library `name` (Debian's multiarch directory), its links followed.
pub fn system_library(name: &str) -> PathBuf {
    std::fs::canonicalize(Path::new("/usr/lib/x86_64-linux-gnu").join(name)).expect(name)
}

/// A private copy of Open MPI's libmpi in `scratch`: a file commtap cannot have probed
/// before the process loads it, as with an MPI library inside a Python venv loaded by
/// mpi4py.
pub fn private_libmpi(scratch: &Scratch) -> PathBuf {
    let private = scratch.path("private");
    std::fs::create_dir_all(&private).expect("mkdir");
    let lib = private.join("libmpi.so.40");
    std::fs::copy(system_library("libmpi.so.40"), &lib).expect("copying libmpi");
    lib
}

/// Starts `mpi_dlopen` on a private libmpi ([`private_libmpi`]) in a session of its own
/// (nothing keeps it from being paused), told to `dlopen` it only after `scratch/go` and
/// call it at once (`MPI_DLOPEN_AFTER_GO`), its truth to `scratch/truth`; returns it and
/// its pid once it is waiting.
#[track_caller]
pub fn start_dlopen_after_go(scratch: &Scratch, n: u64) -> (ChildGuard, u32) {
    let lib = private_libmpi(scratch);
    start_dlopen_of_after_go(&lib, &scratch.0, n)
}

/// Starts `mpi_dlopen` on `lib` as [`start_dlopen_after_go`] does, its files (`ready`,
/// `go`, `truth`) in `dir`.
#[track_caller]
pub fn start_dlopen_of_after_go(lib: &Path, dir: &Path, n: u64) -> (ChildGuard, u32) {
    let mut cmd = Command::new(crate::build_plain_c("mpi_dlopen.c", &["-ldl"]));
    cmd.env("MPI_DLOPEN_AFTER_GO", "1")
        .arg(lib)
        .arg(dir.join("ready"))
        .arg(dir.join("go"))
        .arg(n.to_string())
        .arg(dir.join("truth"));
    start_waiting_alone(&dir.join("ready"), cmd)
}

/// Starts a launcher (a shell, in a session of its own) of three `mpi_dlopen` on a private
/// libmpi ([`private_libmpi`]), each making `n` calls: two started at once, which `dlopen`
/// it only after `scratch/go`, and once they wait (and the launcher has created
/// `scratch/ready`), a third started after the go, which loads it and calls at once; each
/// one's truth to `scratch/truth<i>` (i = 1, 2, 3). With `mapped`, the launcher alone maps
/// that library (as torchrun's Python maps the NCCL of the torch it imports). Returns the
/// launcher and its pid once the first two wait.
#[track_caller]
pub fn start_launcher_of_dlopens_after_go(
    scratch: &Scratch,
    n: u64,
    mapped: Option<&Path>,
) -> (ChildGuard, u32) {
    let lib = private_libmpi(scratch);
    let prog = crate::build_plain_c("mpi_dlopen.c", &["-ldl"]);
    let q = |p: &Path| format!("'{}'", p.display());
    let (prog, lib, go) = (q(&prog), q(&lib), q(&scratch.path("go")));
    let at = |name: &str| q(&scratch.path(name));
    let waiting = |i: u32| {
        format!(
            "MPI_DLOPEN_AFTER_GO=1 {prog} {lib} {} {go} {n} {} &",
            at(&format!("ready{i}")),
            at(&format!("truth{i}"))
        )
    };
    let script = format!(
        "unset LD_PRELOAD; {} {} while [ ! -e {} ] || [ ! -e {} ]; do sleep 0.01; done; \
         : > {}; while [ ! -e {go} ]; do sleep 0.01; done; {prog} {lib} - - {n} {}; wait",
        waiting(1),
        waiting(2),
        at("ready1"),
        at("ready2"),
        at("ready"),
        at("truth3")
    );
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    if let Some(lib) = mapped {
        cmd.env("LD_PRELOAD", lib);
    }
    start_waiting_alone(&scratch.path("ready"), cmd)
}

/// What the workers of [`start_torchrun_like`] are.
#[derive(Clone, Copy, Debug)]
pub enum Workers {
    /// `mpi_dlopen` on a private libmpi: truths `scratch/truthI.0.json`.
    Mpi,
    /// `nccl_dlopen` on the NCCL wheel's `libnccl.so.2`, as PyTorch's ranks (no MPI):
    /// truths `scratch/truthI.json`.
    Nccl,
}

/// Starts a launcher as torchrun is one: a shell that maps `mapped` (an NCCL, as torchrun's
/// Python maps its torch's), in a session of its own, running two `workers` numbered as
/// torchrun numbers them (`RANK`, `WORLD_SIZE`, `TORCHELASTIC_RUN_ID`), each with its
/// library loaded and waiting for `scratch/go`, then making `n` calls, its truth to
/// `scratch/truthI...`; returns it and its pid once both wait. The launcher fails if a
/// worker does.
pub fn start_torchrun_like(
    scratch: &Scratch,
    n: u64,
    mapped: &Path,
    workers: Workers,
) -> (ChildGuard, u32) {
    let q = |p: &Path| format!("'{}'", p.display());
    let at = |name: &str| q(&scratch.path(name));
    // Worker i's command line.
    let command: Box<dyn Fn(u32) -> String + '_> = match workers {
        Workers::Mpi => {
            let (prog, lib) = (
                q(&crate::build_plain_c("mpi_dlopen.c", &["-ldl"])),
                q(&private_libmpi(scratch)),
            );
            Box::new(move |i| {
                format!(
                    "{prog} {lib} {} {} {n} {}",
                    at(&format!("ready{i}")),
                    at("go"),
                    at(&format!("truth{i}"))
                )
            })
        }
        Workers::Nccl => {
            let prog = q(&crate::build_plain_c("nccl_dlopen.c", &["-ldl"]));
            let lib = q(&crate::nccl_lib_dir().join("libnccl.so.2"));
            Box::new(move |i| {
                format!(
                    "LOAD_BEFORE_READY=1 {prog} {lib} {n} {} {} {}",
                    at(&format!("truth{i}.json")),
                    at(&format!("ready{i}")),
                    at("go")
                )
            })
        }
    };
    let worker = |i: u32| {
        format!(
            "RANK={i} LOCAL_RANK={i} WORLD_SIZE=2 TORCHELASTIC_RUN_ID=commtap-test {} & \
             pids=\"$pids $!\";",
            command(i)
        )
    };
    let script = format!(
        "unset LD_PRELOAD; {} {} while [ ! -e {} ] || [ ! -e {} ]; do sleep 0.01; done; \
         : > {}; for p in $pids; do wait $p || exit 1; done",
        worker(0),
        worker(1),
        at("ready0"),
        at("ready1"),
        at("ready")
    );
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).env("LD_PRELOAD", mapped);
    start_waiting_alone(&scratch.path("ready"), cmd)
}

/// The processes whose parent is `pid` now, as `/proc` says.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Starts `nccl_dlopen` in a session of its own, told to `dlopen` the NCCL wheel's
/// `libnccl.so.2` (on no linker path) only after `scratch/go` and make its `n` calls at
/// once, its truth to `scratch/truth.json`; returns it and its pid once it is waiting.
#[track_caller]
pub fn start_nccl_dlopen_after_go(scratch: &Scratch, n: u64) -> (ChildGuard, u32) {
    let mut cmd = Command::new(crate::build_plain_c("nccl_dlopen.c", &["-ldl"]));
    cmd.arg(crate::nccl_lib_dir().join("libnccl.so.2"))
        .arg(n.to_string())
        .arg(scratch.path("truth.json"))
        .arg(scratch.path("ready"))
        .arg(scratch.path("go"));
    start_waiting_alone(&scratch.path("ready"), cmd)
}

/// Starts `cmd` in a session of its own (no controlling terminal, so nothing keeps it from
/// being paused) and returns it and its pid once it has created `ready`.
#[track_caller]
fn start_waiting_alone(ready: &Path, mut cmd: Command) -> (ChildGuard, u32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid(2) is async-signal-safe, the only call made between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = ChildGuard::spawn(&mut cmd);
    let pid = child.0.id();
    wait_until(
        "the program to wait for its go",
        Duration::from_mins(1),
        || ready.exists(),
    );
    (child, pid)
}
