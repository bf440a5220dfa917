//! Attacks on the root daemon by an unprivileged local user (uid 65534, `nobody`), run for
//! real against a real daemon: each test passes only when the attack fails **and** the
//! daemon stays healthy (answers `ps` within 2 s, its memory bounded, and still counts a
//! real MPI job of root's exactly).

use std::{
    io::{Read, Seek, SeekFrom},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);
/// Most resident memory a healthy daemon may have reached, attacked or not (it peaks at
/// about 60 MiB here, ring buffer and BPF maps included).
const DAEMON_PEAK_LIMIT_KIB: u64 = 256 << 10;

/// The crafted library (`MPI_Send` exported, nothing of MPI behind it) and the program
/// that maps it and acts on the daemon's read.
fn attack_programs() -> (PathBuf, PathBuf) {
    (
        build_shared_c("attack_lib.c"),
        build_plain_c("attack_map.c", &["-ldl"]),
    )
}

/// A node under attack: a daemon watching everything, the attack programs, and a crafted
/// `libmpich.so.12` of nobody's in a directory of nobody's.
struct Attack {
    scratch: Scratch,
    daemon: Daemon,
    /// The crafted library as built (root's copy).
    lib: PathBuf,
    /// `attack_map`.
    map: PathBuf,
    /// nobody's copy of `lib`, `attacker/libmpich.so.12`.
    crafted: PathBuf,
}

impl Attack {
    fn start(name: &str) -> Attack {
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
    fn end_healthy(self) {
        assert_healthy(&self.scratch, &self.daemon);
        self.daemon.stop(&self.scratch);
    }
}

/// Starts `attack_map LIB READY ACTION TARGET DONE` as nobody and waits until it has
/// mapped LIB.
fn start_attacker(
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
    wait_until("the attacker to map its library", LIMIT, || ready.exists());
    child
}

/// The daemon is alive and well: `ps` answers within 2 s, its peak memory is bounded, and
/// a root MPI job run now is counted exactly.
#[track_caller]
fn assert_healthy(scratch: &Scratch, daemon: &Daemon) {
    assert_healthy_within(scratch, daemon, DAEMON_PEAK_LIMIT_KIB);
}

/// [`assert_healthy`], for a daemon that holds more by design: its peak memory below
/// `peak_limit_kib`.
#[track_caller]
fn assert_healthy_within(scratch: &Scratch, daemon: &Daemon, peak_limit_kib: u64) {
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
    eprintln!("daemon peak resident memory: {peak} KiB");
    assert!(
        peak < peak_limit_kib,
        "the daemon's peak memory is {peak} KiB"
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
fn code_equals_file(pid: u32, file_name: &str, file: &Path) -> bool {
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

/// Attack: map a crafted `libmpich.so.12`, wait until the daemon has read it, then rename
/// a symlink to a root-owned library over it. A daemon that attaches by path puts its
/// probes, at the crafted file's offsets, into the root-owned file (and so into every root
/// process that maps it). The probes must go into the file that was read, and only there.
#[test]
fn a_library_swapped_after_it_was_read_gets_no_probe_into_root_files() {
    let a = Attack::start("attack-swap");
    let (scratch, lib, crafted) = (&a.scratch, &a.lib, &a.crafted);

    // Root's side: a root-owned library, mapped by a root process.
    let root_dir = scratch.path("root-only");
    std::fs::create_dir_all(&root_dir).expect("dir");
    let victim = root_dir.join("libvictim.so");
    std::fs::copy(lib, &victim).expect("victim copy");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).expect("mode");
    let victim_prog = build_plain_c("attack_victim.c", &["-ldl"]);
    let victim_ready = scratch.path("victim-ready");
    let victim_proc = ChildGuard::spawn(Command::new(&victim_prog).arg(&victim).arg(&victim_ready));
    wait_until("the victim to map its library", LIMIT, || {
        victim_ready.exists()
    });

    // The user's side: the crafted library, and a symlink to the victim ready to swap in.
    let swap = crafted.with_file_name("swap");
    std::os::unix::fs::symlink(&victim, &swap).expect("symlink");
    std::os::unix::fs::lchown(&swap, Some(NOBODY), Some(NOBODY)).expect("lchown");
    let attacker = start_attacker(scratch, &a.map, crafted, "swap", path_str(&swap));
    let done = scratch.path("signals/done");
    wait_until(
        "the attacker to swap the file after the daemon's read",
        LIMIT,
        || done.exists(),
    );
    // Probed: the daemon attached to the library it read (the attacker's own file).
    let pid = u64::from(attacker.0.id());
    wait_for_state(&a.daemon.target, &[pid], "probed");
    assert!(
        std::fs::read_link(crafted).is_ok_and(|t| t == victim),
        "the swap happened"
    );
    assert!(
        !code_equals_file(attacker.0.id(), "/libmpich.so.12 (deleted)", lib),
        "the probe went into the file the daemon read (the attacker's own)"
    );
    assert!(
        code_equals_file(victim_proc.0.id(), "/libvictim.so", &victim),
        "a probe was written into the root-owned library's code"
    );
    drop(victim_proc);
    a.end_healthy();
    drop(attacker);
}

/// Attack: map a library whose path holds two spaces (`a  b/libmpich.so.12`) while a FIFO
/// waits at the path with one (`a b/libmpich.so.12`). A maps parser that splits on
/// whitespace opens the FIFO and blocks the daemon forever. The path is kept verbatim and
/// no FIFO is ever opened.
#[test]
fn a_fifo_behind_a_path_with_spaces_does_not_stop_the_daemon() {
    let scratch = Scratch::new("attack-fifo");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let (lib, map) = attack_programs();
    let dir = nobody_dir(&scratch, "attacker");
    let (two, one) = (dir.join("a  b"), dir.join("a b"));
    for d in [&two, &one] {
        std::fs::create_dir_all(d).expect("dir");
        std::os::unix::fs::chown(d, Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    let crafted = two.join("libmpich.so.12");
    copy_as_nobody(&lib, &crafted);
    sh(&format!(
        "mkfifo '{}'",
        one.join("libmpich.so.12").display()
    ));
    let attacker = start_attacker(&scratch, &map, &crafted, "none", "-");
    wait_for_state(&daemon.target, &[u64::from(attacker.0.id())], "probed");
    let out = commtap_output(&["ps", "--from", &daemon.target]);
    let ps = String::from_utf8_lossy(&out.stdout);
    assert!(
        ps.contains("attacker/a  b/libmpich.so.12"),
        "the library's path is kept verbatim:\n{ps}"
    );
    assert_healthy(&scratch, &daemon);
    drop(attacker);
    daemon.stop(&scratch);
}

/// Attack: truncate the library as the daemon opens it (inotify `IN_OPEN`). A daemon that
/// maps library files dies of SIGBUS reading past the new end. It reads what it needs with
/// bounded reads and gives up on that file.
#[test]
fn a_library_truncated_while_it_is_read_does_not_kill_the_daemon() {
    let a = Attack::start("attack-truncate");
    let _attacker = start_attacker(&a.scratch, &a.map, &a.crafted, "truncate", "-");
    let done = a.scratch.path("signals/done");
    wait_until("the attacker to truncate its library", LIMIT, || {
        done.exists()
    });
    assert_eq!(std::fs::metadata(&a.crafted).expect("crafted").len(), 0);
    a.end_healthy();
}

/// Attack: a small library whose dynamic section repeats `DT_NEEDED` thousands of times,
/// every entry naming one long string. A parser that copies each entry allocates the
/// string once per entry (gigabytes from a file of megabytes). Reads and copies are capped.
#[test]
fn a_library_with_many_long_needed_entries_does_not_bloat_the_daemon() {
    let a = Attack::start("attack-needed");
    // 60,000 DT_NEEDED entries (16 bytes each) naming one 60,000-byte string: a 1 MB file
    // that names 3.6 GB of strings.
    let status = Command::new("python3")
        .arg(repo_root().join("tests/programs/many_needed.py"))
        .arg(&a.crafted)
        .args(["60000", "60000"])
        .status()
        .expect("python3");
    assert!(status.success(), "crafting the library failed");
    let attacker = start_attacker(&a.scratch, &a.map, &a.crafted, "none", "-");
    wait_for_state(&a.daemon.target, &[u64::from(attacker.0.id())], "probed");
    a.end_healthy();
}

/// `commtap ARGS` run as nobody.
fn commtap_as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(commtap_bin())
        .args(args)
        .output()
        .expect("running commtap as nobody")
}

/// Attack: over the daemon's plaintext TCP listener (`--insecure-tcp`), nobody lists
/// root's processes, detaches root's MPI rank and switches per-call events on node-wide. A
/// caller that presents no verified client certificate owns nothing: it sees no process,
/// may detach none, and may not stream events.
#[test]
fn an_unauthenticated_tcp_caller_can_neither_see_nor_change_roots_processes() {
    let scratch = Scratch::new("attack-tcp");
    let addr = free_port();
    let daemon = Daemon::start(&scratch, &[], &[], &["--listen", &addr, "--insecure-tcp"]);
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 50, &[]);
    let pids: Vec<u64> = ranks.iter().map(|p| u64::from(*p)).collect();
    wait_for_state(&daemon.target, &pids, "probed");
    let url = format!("http://{addr}");

    let ps = commtap_as_nobody(&["ps", "--from", &url]);
    assert!(
        ps.status.success(),
        "{}",
        String::from_utf8_lossy(&ps.stderr)
    );
    let listed = String::from_utf8_lossy(&ps.stdout);
    for pid in &ranks {
        assert!(
            !listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(&pid.to_string())),
            "nobody sees root's rank {pid} over TCP:\n{listed}"
        );
    }
    let report = commtap_as_nobody(&["report", "--from", &url, "--format", "json"]);
    let seen: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap_or_default();
    assert!(
        seen["ranks"].as_array().is_none_or(Vec::is_empty),
        "nobody reads root's profiles over TCP: {seen:#}"
    );
    let detach = commtap_as_nobody(&["detach", "--pid", &ranks[0].to_string(), "--from", &url]);
    assert!(!detach.status.success(), "nobody detached root's rank");
    let events = commtap_as_nobody(&["events", "--from", &url]);
    assert!(!events.status.success(), "nobody streamed events");
    assert!(
        String::from_utf8_lossy(&events.stderr).contains("permission"),
        "{}",
        String::from_utf8_lossy(&events.stderr)
    );

    // Root's ranks are still watched and counted to the end.
    assert!(
        ranks.iter().all(|p| ps_states(&daemon.target)
            .get(&u64::from(*p))
            .map(String::as_str)
            == Some("probed")),
        "root's ranks are still probed"
    );
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(
        job.wait_with_limit(LIMIT).success(),
        "root's MPI job failed"
    );
    wait_for_exited(&daemon.target, &pids);
    let profile = report_json(&["report", "--from", &daemon.target]);
    let truths = read_truths(&scratch.path("truth"), 2);
    for t in &truths {
        let rank = rank_by_pid(&profile, t["pid"].as_u64().expect("pid"));
        assert_eq!(
            loop_counts_after_go(&rank["routines"]),
            routine_table(&t["routines"]),
            "rank {}: every call, before and after the attack",
            t["rank"]
        );
    }
    assert_healthy(&scratch, &daemon);
    daemon.stop(&scratch);
}

/// `aggregator_client.py ADDR CA CERT KEY ARGS`: a network peer holding whatever
/// certificate it holds (over TCP the aggregator knows no uid), and the JSON it prints.
fn aggregator_call(
    addr: &str,
    ca: &Path,
    cert: Option<&(PathBuf, PathBuf)>,
    args: &[&str],
) -> serde_json::Value {
    let (cert, key) = cert.map_or(("-", "-"), |(c, k)| (path_str(c), path_str(k)));
    let out = Command::new("python3")
        .arg(repo_root().join("tests/clients/aggregator_client.py"))
        .arg(repo_root().join("proto"))
        .args([addr, path_str(ca), cert, key])
        .args(args)
        .output()
        .expect("python3");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "aggregator client: {e}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Field 22 of `/proc/PID/stat`: the process's start time in clock ticks.
fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(')').expect("stat");
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .expect("starttime")
}

/// Attacks on an aggregator by network peers: without a certificate nothing is served; a
/// reader cannot push and a pusher cannot read; a node's certificate cannot push another
/// node's processes; a snapshot stamped far in the future (`taken_ns = u64::MAX`, which
/// would own that process's record for good) is refused even from the node's own
/// certificate. Root's job, pushed by its node's daemon, ends up in the aggregator exactly.
#[test]
fn aggregator_callers_do_only_what_their_certificates_allow() {
    let scratch = Scratch::new("attack-aggregator");
    let (ca, cert, key) = make_certs(&scratch.0);
    let node = make_client_cert(&scratch.0, "node-a", Some("commtap-push"));
    let other = make_client_cert(&scratch.0, "node-evil", Some("commtap-push"));
    let reader = make_client_cert(&scratch.0, "reader", Some("commtap-read"));
    let addr = free_port();
    let agg_scratch = Scratch::new("attack-aggregator-server");
    let aggregator = spawn_commtap(
        &agg_scratch,
        &[
            "--log",
            "info",
            "aggregator",
            "--listen",
            &addr,
            "--db",
            path_str(&scratch.path("agg.redb")),
            "--tls-cert",
            path_str(&cert),
            "--tls-key",
            path_str(&key),
            "--tls-client-ca",
            path_str(&ca),
        ],
    );
    let job_id = format!("attack{}", std::process::id());
    let (mut job, ranks) =
        start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 50, &[("SLURM_JOB_ID", &job_id)]);
    let pids = pid_list(&ranks);
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[
            "--tls-ca",
            path_str(&ca),
            "--tls-cert",
            path_str(&node.0),
            "--tls-key",
            path_str(&node.1),
        ],
        &[
            "--node-name",
            "node-a",
            "--pid",
            &pids,
            "--push-interval",
            "200ms",
            "--aggregator",
            &format!("https://{addr}"),
        ],
    );
    // The attacks name one of root's ranks by its identity at the aggregator; they come
    // once the daemon has pushed the job (the node's clock is known from then on).
    let (victim, victim_start) = (ranks[0], start_ticks(ranks[0]));
    std::fs::write(scratch.path("go"), b"").expect("go file");
    wait_until("the daemon's first snapshots of the job", LIMIT, || {
        aggregator_call(&addr, &ca, Some(&reader), &["list"])["jobs"]
            .as_array()
            .is_some_and(|j| j.iter().any(|j| j == job_id.as_str()))
    });
    let push = |cert: Option<&(PathBuf, PathBuf)>, node: &str, taken: u64| {
        let (pid, start, taken) = (
            victim.to_string(),
            victim_start.to_string(),
            taken.to_string(),
        );
        aggregator_call(&addr, &ca, cert, &["push", node, &pid, &start, &taken])
    };
    let anonymous = aggregator_call(&addr, &ca, None, &["list"]);
    assert_ne!(
        anonymous["code"], "OK",
        "served without a certificate: {anonymous}"
    );
    assert_eq!(
        push(Some(&reader), "node-a", 1)["code"],
        "PERMISSION_DENIED",
        "a reader pushed"
    );
    let read_by_pusher = aggregator_call(&addr, &ca, Some(&node), &["list"]);
    assert_eq!(read_by_pusher["code"], "PERMISSION_DENIED", "a pusher read");
    assert_eq!(
        push(Some(&other), "node-a", 1)["code"],
        "PERMISSION_DENIED",
        "node-evil pushed node-a's process"
    );
    let future = push(Some(&node), "node-a", u64::MAX);
    assert_eq!(future["code"], "OK", "{future}");
    assert_eq!(
        future["refused"], 1,
        "a snapshot from the future was taken: {future}"
    );
    assert_eq!(future["accepted"], 0, "{future}");

    // The daemon's own snapshots still land: the job is exact at the end.
    assert!(
        job.wait_with_limit(LIMIT).success(),
        "root's MPI job failed"
    );
    let truths = read_truths(&scratch.path("truth"), 2);
    let out = scratch.path("merged.json");
    let report = || {
        let r = commtap_output(&[
            "--tls-ca",
            path_str(&ca),
            "--tls-cert",
            path_str(&reader.0),
            "--tls-key",
            path_str(&reader.1),
            "report",
            "--from",
            &format!("https://{addr}"),
            "--job",
            &job_id,
            "--format",
            "json",
            "-o",
            path_str(&out),
        ]);
        r.status.success().then(|| read_json(&out))
    };
    wait_until(
        "every rank's final profile at the aggregator",
        LIMIT,
        || {
            report().is_some_and(|p| {
                p["ranks"]
                    .as_array()
                    .is_some_and(|r| r.len() == 2 && r.iter().all(|x| x["exited"] == true))
            })
        },
    );
    let merged = report().expect("report");
    // Attached after the job's start: counted from then on, which is what the truth holds.
    assert_profile_matches(&merged, &truths, &["MPI_Finalize"]);
    daemon.stop(&scratch);
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    let run = finish_commtap(&agg_scratch, aggregator, LIMIT);
    assert!(run.status.success(), "aggregator: {}", run.stderr);
}

/// `GET /metrics` on the Unix socket `socket`, as nobody or as root.
fn metrics_as(socket: &Path, nobody: bool) -> String {
    let mut cmd = Command::new("setpriv");
    if nobody {
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
    }
    let out = cmd
        .args(["--", "curl", "-sS", "--unix-socket"])
        .arg(socket)
        .arg("http://localhost/metrics")
        .output()
        .expect("curl (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Attack: read every user's job series (and choose their label values) on the metrics
/// endpoint every local user can reach. On the metrics Unix socket each caller sees what
/// the API shows it: nobody no series of root's job, root all of them; a TCP endpoint
/// without mutual TLS is refused unless `--metrics-insecure` says so.
#[test]
fn metrics_show_a_user_only_their_own_jobs() {
    let scratch = Scratch::new("attack-metrics");
    let refused = commtap_output(&[
        "daemon",
        "--socket",
        path_str(&scratch.path("refused.sock")),
        "--metrics-addr",
        &free_port(),
    ]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--metrics-insecure"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let socket = scratch.path("metrics.sock");
    let metrics_addr = format!("unix://{}", socket.display());
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &["--socket-mode", "666", "--metrics-addr", &metrics_addr],
    );
    wait_until("the metrics socket", LIMIT, || socket.exists());
    let truths = run_truth_job(&scratch.path("root-truth"), Mpi::OpenMpi, 2);
    let pids: Vec<u64> = truths.iter().filter_map(|t| t["pid"].as_u64()).collect();
    wait_for_exited(&daemon.target, &pids);
    let job = format!("job=\"{}\"", pids[0]);
    let calls = truths[0]["routines"]["MPI_Allreduce"]["calls"]
        .as_u64()
        .expect("calls");
    let line =
        format!("commtap_mpi_calls_total{{{job},rank=\"0\",routine=\"MPI_Allreduce\"}} {calls}");
    let roots = metrics_as(&socket, false);
    assert!(
        roots.lines().any(|l| l == line),
        "root sees {line}:\n{roots}"
    );
    let nobodys = metrics_as(&socket, true);
    assert!(
        nobodys.contains("# TYPE commtap_mpi_calls_total"),
        "nobody gets the families:\n{nobodys}"
    );
    assert!(
        !nobodys.contains(&job),
        "nobody sees root's job:\n{nobodys}"
    );
    daemon.stop(&scratch);
}

/// The library lines of `commtap ps` (as root) whose path contains `part`.
fn probed_libraries_with(daemon: &Daemon, part: &str) -> usize {
    let out = commtap_output(&["ps", "--from", &daemon.target]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("library ") && l.contains(part))
        .count()
}

/// Attack: map many copies of a tiny fake MPI library to use up the daemon's 64 library
/// slots, so that no later MPI build (a venv, Spack) is probed until a restart. A user's
/// own libraries are limited to 8 at once and let go when no process maps them: root's
/// library mapped after the attack is probed, and once the attacker's processes are gone
/// so are their libraries.
#[test]
fn one_user_cannot_use_up_the_library_slots() {
    let scratch = Scratch::new("attack-slots");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let (lib, map) = attack_programs();
    let dir = nobody_dir(&scratch, "attacker");
    let mut attackers = Vec::new();
    for i in 0..10 {
        let sub = dir.join(format!("d{i}"));
        std::fs::create_dir_all(&sub).expect("dir");
        std::os::unix::fs::chown(&sub, Some(NOBODY), Some(NOBODY)).expect("chown");
        let copy = sub.join("libmpich.so.12");
        copy_as_nobody(&lib, &copy);
        let signals = nobody_dir(&scratch, &format!("signals{i}"));
        let ready = signals.join("ready");
        attackers.push(spawn_as_nobody(
            &map,
            &[
                path_str(&copy),
                path_str(&ready),
                "none",
                "-",
                path_str(&signals.join("done")),
            ],
        ));
        wait_until("an attacker to map its copy", LIMIT, || ready.exists());
    }
    let pids: Vec<u64> = attackers.iter().map(|c| u64::from(c.0.id())).collect();
    wait_until("the daemon to look at every attacker", LIMIT, || {
        let states = ps_states(&daemon.target);
        pids.iter().all(|p| states.contains_key(p))
    });
    assert_eq!(
        probed_libraries_with(&daemon, "/attacker/d"),
        8,
        "one user's libraries probed at once"
    );

    // Root's own build, mapped now, still gets a slot.
    let root_dir = scratch.path("root-build");
    std::fs::create_dir_all(&root_dir).expect("dir");
    let root_lib = root_dir.join("libmpich.so.12");
    std::fs::copy(&lib, &root_lib).expect("copy");
    let root_ready = scratch.path("root-ready");
    let root = ChildGuard::spawn(Command::new(&map).args([
        path_str(&root_lib),
        path_str(&root_ready),
        "none",
        "-",
        path_str(&scratch.path("root-done")),
    ]));
    wait_until("root's process to map its library", LIMIT, || {
        root_ready.exists()
    });
    wait_for_state(&daemon.target, &[u64::from(root.0.id())], "probed");
    assert_eq!(probed_libraries_with(&daemon, "/root-build/"), 1);

    // The attacker's processes end: their libraries are let go.
    drop(attackers);
    wait_until("the attacker's libraries to be let go", LIMIT, || {
        probed_libraries_with(&daemon, "/attacker/d") == 0
    });
    assert_eq!(probed_libraries_with(&daemon, "/root-build/"), 1);
    drop(root);
    assert_healthy(&scratch, &daemon);
    daemon.stop(&scratch);
}

/// Attack: a library whose `MPI_Send` symbol names data (bytes that look like a function
/// prologue), not code. Probes go only into executable sections: MPI_Send is not probed,
/// MPI_Recv (real code) is.
#[test]
fn a_symbol_that_names_data_is_never_probed() {
    let a = Attack::start("attack-data-symbol");
    let lib = compile_c(
        "attack_data_symbol.c",
        "libattack_data_symbol.so",
        &["-shared", "-fPIC"],
    );
    copy_as_nobody(&lib, &a.crafted);
    let attacker = start_attacker(&a.scratch, &a.map, &a.crafted, "none", "-");
    wait_for_state(&a.daemon.target, &[u64::from(attacker.0.id())], "probed");
    let out = commtap_output(&["ps", "--from", &a.daemon.target]);
    let ps = String::from_utf8_lossy(&out.stdout);
    // MPI_Recv is code: probed. MPI_Send names 64 bytes of data that start like a
    // function (push %rbp; mov %rsp,%rbp): never probed.
    let line = ps
        .lines()
        .find(|l| l.starts_with("library ") && l.contains("/attacker/libmpich.so.12"))
        .unwrap_or_else(|| panic!("the crafted library is listed:\n{ps}"));
    assert!(
        line.ends_with(": 1 probes"),
        "only MPI_Recv is probed: {line}"
    );
    a.end_healthy();
}

/// A node with 10,000 ranks, each with a command line at the 4 KiB cap and 16 routines:
/// more than one gRPC reply may hold (64 MiB). `report` reads them page by page, each rank
/// once; `ps` still answers in time, and a real job beside them is counted exactly. The
/// daemon holds those 10,000 profiles (about 150 MiB here), so its bound is raised by
/// that; paging copies one page at a time.
#[test]
fn ten_thousand_ranks_are_reported_page_by_page() {
    const RANKS: usize = 10_000;
    let scratch = Scratch::new("attack-many-ranks");
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &["--test-synthetic-ranks", &RANKS.to_string()],
    );
    // Once, and live (`--watch`: WatchSnapshots, in pages too).
    for watch in [&[][..], &["--watch", "200ms", "--count", "1"][..]] {
        let args = [
            &["report", "--from", &daemon.target, "--job", "synthetic"][..],
            watch,
        ]
        .concat();
        let out = commtap_output(&args);
        assert!(
            out.status.success(),
            "report {watch:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The text report's last table lists every rank with its pid (the made-up ones
        // count from 2^30).
        let text = String::from_utf8_lossy(&out.stdout);
        let table = text
            .split("MPI timing summary for all ranks:")
            .nth(1)
            .expect("the per-rank table");
        let pids: std::collections::BTreeSet<u64> = table
            .lines()
            .filter_map(|l| l.split_whitespace().last()?.parse().ok())
            .filter(|pid| *pid >= 1 << 30)
            .collect();
        assert_eq!(pids.len(), RANKS, "every rank, once ({watch:?})");
    }
    assert_healthy_within(&scratch, &daemon, DAEMON_PEAK_LIMIT_KIB + (256 << 10));
    daemon.stop(&scratch);
}
