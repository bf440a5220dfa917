//! What the attack tests share: a node under attack (a daemon, the crafted library and
//! the program that maps it as `nobody`), and the check that the daemon came through
//! healthy.

use std::{
    io::{Read, Seek, SeekFrom},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use crate::{
    assert_profile_matches, build_plain_c, build_shared_c, commtap_bin, commtap_output,
    copy_as_nobody, nobody_dir, path_str, peak_kib, report_json, run_truth_job, spawn_as_nobody,
    wait_for_exited, wait_until, ChildGuard, Daemon, Mpi, Scratch,
};

/// How long an attacker may take to get ready.
const ATTACK_LIMIT: Duration = Duration::from_mins(2);

/// Most resident memory a healthy daemon may have reached, attacked or not (it peaks at
/// about 66 MiB here, ring buffer and BPF maps included).
pub const DAEMON_PEAK_LIMIT_KIB: u64 = 256 << 10;

/// Most a daemon's peak memory may grow between its start and the end of an attack (2 to
/// 3 MiB here: it looks at the attacker's process and library, and answers requests): an
/// attack that makes it allocate by the attacker's measure, not its own caps, shows.
pub const DAEMON_GROWTH_LIMIT_KIB: u64 = 16 << 10;

/// The crafted library (`MPI_Send` exported, nothing of MPI behind it) and the program
/// that maps it and acts on the daemon's read.
pub fn attack_programs() -> (PathBuf, PathBuf) {
    (
        build_shared_c("attack_lib.c"),
        build_plain_c("attack_map.c", &["-ldl"]),
    )
}

/// A node under attack: a daemon watching everything, the attack programs, and a crafted
/// `libmpich.so.12` of nobody's in a directory of nobody's.
pub struct Attack {
    /// The test's scratch directory.
    pub scratch: Scratch,
    /// The daemon under attack.
    pub daemon: Daemon,
    /// The crafted library as built (root's copy).
    pub lib: PathBuf,
    /// `attack_map`.
    pub map: PathBuf,
    /// nobody's copy of `lib`, `attacker/libmpich.so.12`.
    pub crafted: PathBuf,
}

impl Attack {
    /// Starts the daemon and puts nobody's crafted library in place.
    pub fn start(name: &str) -> Attack {
        let scratch = Scratch::new(name);
        let daemon = Daemon::start(&scratch, &[], &[], &[]);
        let (lib, map) = attack_programs();
        let crafted = nobody_dir(&scratch, "attacker").join("libmpich.so.12");
        copy_as_nobody(&lib, &crafted);
        Attack {
            scratch,
            daemon,
            lib,
            map,
            crafted,
        }
    }

    /// The daemon is healthy after the attack; then it stops.
    #[track_caller]
    pub fn end_healthy(self) {
        assert_healthy(&self.scratch, &self.daemon);
        self.daemon.stop(&self.scratch);
    }
}

/// Starts `attack_map LIB READY ACTION TARGET DONE` as nobody and waits until it has
/// mapped LIB.
pub fn start_attacker(
    scratch: &Scratch,
    map: &Path,
    lib: &Path,
    action: &str,
    target: &str,
) -> ChildGuard {
    let dir = nobody_dir(scratch, "signals");
    let (ready, done) = (dir.join("ready"), dir.join("done"));
    let child = spawn_as_nobody(
        map,
        &[
            path_str(lib),
            path_str(&ready),
            action,
            target,
            path_str(&done),
        ],
    );
    wait_until("the attacker to map its library", ATTACK_LIMIT, || {
        ready.exists()
    });
    child
}

/// The daemon is alive and well: `ps` answers within 2 s, its peak memory is bounded and
/// grew by little since its start, and a root MPI job run now is counted exactly.
#[track_caller]
pub fn assert_healthy(scratch: &Scratch, daemon: &Daemon) {
    assert_healthy_within(
        scratch,
        daemon,
        DAEMON_PEAK_LIMIT_KIB,
        DAEMON_GROWTH_LIMIT_KIB,
    );
}

/// [`assert_healthy`], for a daemon that holds more by design: its peak memory below
/// `peak_limit_kib`, and at most `growth_limit_kib` above its peak at start.
#[track_caller]
pub fn assert_healthy_within(
    scratch: &Scratch,
    daemon: &Daemon,
    peak_limit_kib: u64,
    growth_limit_kib: u64,
) {
    let asked = Instant::now();
    let out = commtap_output(&["ps", "--from", &daemon.target]);
    let took = asked.elapsed();
    assert!(
        out.status.success(),
        "ps failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < Duration::from_secs(2), "ps took {took:?}");
    let peak = peak_kib(daemon.child.0.id());
    eprintln!(
        "daemon peak resident memory: {peak} KiB, {} KiB more than at its start",
        peak - daemon.started_peak_kib
    );
    assert!(
        peak < peak_limit_kib,
        "the daemon's peak memory is {peak} KiB"
    );
    assert!(
        peak - daemon.started_peak_kib < growth_limit_kib,
        "the daemon's peak memory grew from {} KiB to {peak} KiB",
        daemon.started_peak_kib
    );
    // Open MPI: its launcher names the job (PMIx namespace), so root's ranks are one job
    // of their own beside the attacker's unlabelled process.
    let truths = run_truth_job(&scratch.path("root-truth"), Mpi::OpenMpi, 2);
    let pids: Vec<u64> = truths.iter().filter_map(|t| t["pid"].as_u64()).collect();
    wait_for_exited(&daemon.target, &pids);
    let job = pids[0].to_string();
    let profile = report_json(&["report", "--from", &daemon.target, "--job", &job]);
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
}

/// Whether the code `pid` maps from the file `file_name` (every executable mapping) equals
/// the bytes of `file` at the same offsets: a uprobe shows in memory as an int3.
pub fn code_equals_file(pid: u32, file_name: &str, file: &Path) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("mem");
    let bytes = std::fs::read(file).expect("library bytes");
    let mut compared = 0;
    for line in maps
        .lines()
        .filter(|l| l.ends_with(file_name) && l.contains(" r-xp "))
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (lo, hi) = f[0].split_once('-').expect("range");
        let lo = u64::from_str_radix(lo, 16).expect("lo");
        let hi = u64::from_str_radix(hi, 16).expect("hi");
        let off = usize::from_str_radix(f[2], 16).expect("offset");
        let mut code = vec![0u8; (hi - lo) as usize];
        mem.seek(SeekFrom::Start(lo)).expect("seek");
        mem.read_exact(&mut code).expect("read code");
        let end = (off + code.len()).min(bytes.len());
        compared += end - off;
        if code[..end - off] != bytes[off..end] {
            return false;
        }
    }
    assert!(
        compared > 0,
        "no code of {file_name} mapped by {pid}:\n{maps}"
    );
    true
}

/// `commtap ARGS` run as nobody.
pub fn commtap_as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(commtap_bin())
        .args(args)
        .output()
        .expect("running commtap as nobody")
}
