//! Attacks on the root daemon and the aggregator through their APIs (Unix socket, TCP,
//! Prometheus), by an unprivileged local user (uid 65534, `nobody`) or a caller with the
//! wrong certificate, run for real: each test passes only when the attack fails **and**
//! the daemon stays healthy. Shared parts: `commtap_tests::attack`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

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
        || report().is_some_and(|p| every_rank_final(&p, 2)),
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
    let job = format!("job_id=\"{}\"", pids[0]);
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

/// A node with 10,000 ranks, each with a command line at the 4 KiB cap and 16 routines:
/// more than one gRPC reply may hold (64 MiB). `report` reads them page by page, each rank
/// once; `ps` still answers in time, and a real job beside them is counted exactly. The
/// daemon holds those 10,000 profiles (about 290 MiB here, at its start), so its bound is
/// raised by that; serving them takes a copy of each at most (about 220 MiB more here).
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
    // Each rank holds 16 routines x 4 size buckets with their duration histograms (about
    // 110 bytes each, stored and served): 90 MiB of the peak, beside 40 MiB of command lines.
    // Serving them may grow the daemon by a copy of what it held at its start, not more.
    assert_healthy_within(
        &scratch,
        &daemon,
        DAEMON_PEAK_LIMIT_KIB + (384 << 10),
        daemon.started_peak_kib,
    );
    daemon.stop(&scratch);
}

/// Attack: nobody opens snapshot watches on the daemon's Unix socket without end (each one
/// has the daemon build a whole profile every interval, so a few thousand would eat its
/// CPU). A caller may hold 16 open; the 17th is refused with a reason, from nobody's
/// sub-uid too (a setuid program it could make in its user namespace: a caller of its own,
/// before, and let open), a closed one frees its place, and root is not held up.
#[test]
fn a_user_cannot_open_snapshot_watches_without_end() {
    const PER_CALLER: usize = 16;
    const SUB_UID: u32 = 3_000_000;
    let scratch = Scratch::new("attack-watches");
    let subuids = nobody_subuid_file(&scratch, SUB_UID);
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &["--socket-mode", "666", "--subuid-file", path_str(&subuids)],
    );
    let watch = |out: &Path| {
        let file = std::fs::File::create(out).expect("watch output");
        let mut cmd = as_nobody(&commtap_bin());
        cmd.args(["report", "--from", &daemon.target, "--format", "json"])
            .args(["--watch", "1s"])
            .stdout(file);
        ChildGuard::spawn(&mut cmd)
    };
    let outputs: Vec<PathBuf> = (0..PER_CALLER)
        .map(|i| scratch.path(&format!("watch-{i}.json")))
        .collect();
    let mut watchers: Vec<ChildGuard> = outputs.iter().map(|o| watch(o)).collect();
    // Every watch is open once it has printed its first snapshot.
    wait_until("every watch to print a snapshot", LIMIT, || {
        outputs
            .iter()
            .all(|o| std::fs::metadata(o).is_ok_and(|m| m.len() > 0))
    });
    // (--count 1: a daemon that let it open answers, and the test fails, never hangs.)
    let refused = commtap_as_nobody(&[
        "report",
        "--from",
        &daemon.target,
        "--watch",
        "1s",
        "--count",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a 17th watch was let open");
    assert!(
        stderr.contains("16 watch streams of this caller are open already"),
        "{stderr}"
    );
    // Nobody's sub-uid is nobody.
    let setuid = setuid_program(&nobody_dir(&scratch, "nobody"), "run", SUB_UID);
    let from_sub_uid = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&setuid)
        .arg(commtap_bin())
        .args([
            "report",
            "--from",
            &daemon.target,
            "--watch",
            "1s",
            "--count",
            "1",
        ])
        .output()
        .expect("a watch from a sub-uid");
    let stderr = String::from_utf8_lossy(&from_sub_uid.stderr);
    assert!(
        !from_sub_uid.status.success(),
        "a sub-uid's watch was let open"
    );
    assert!(
        stderr.contains("16 watch streams of this caller are open already"),
        "{stderr}"
    );
    // Closing one frees its place, once the daemon has seen the client go (at its next tick).
    drop(watchers.pop());
    wait_until("the closed watch's place to be free", LIMIT, || {
        commtap_as_nobody(&[
            "report",
            "--from",
            &daemon.target,
            "--watch",
            "1s",
            "--count",
            "1",
        ])
        .status
        .success()
    });
    // Root's own watch and requests are not held up by nobody's.
    let root = report_json(&[
        "report",
        "--from",
        &daemon.target,
        "--watch",
        "1s",
        "--count",
        "1",
    ]);
    assert!(root["ranks"].is_array(), "{root}");
    assert_healthy(&scratch, &daemon);
    drop(watchers);
    daemon.stop(&scratch);
}

/// Attack: nobody's process makes 70,000 MPICH datatypes and keeps them, to fill the
/// kernel's datatype map (65,536 entries for the node): root's job's derived datatypes
/// would then go undecoded. Each user holds at most a share of each map: nobody's process
/// is refused past its share (counted, exactly, in its `handles_refused`), root's job beside
/// it is profiled exactly, and nobody's share comes back when its process exits or is
/// detached.
#[test]
fn a_user_cannot_fill_the_kernels_handle_maps() {
    const FLOOD: u64 = 70_000;
    let share = SHARE;
    let scratch = Scratch::new("attack-handles");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let dir = nobody_dir(&scratch, "nobody");
    let start_flood =
        |tag: &str, n: u64, what: &str| start_mpi_flood(&daemon, &dir, Mpi::Mpich, tag, what, n);
    let refused = |pid: u64| {
        let now = report_json(&["report", "--from", &daemon.target]);
        rank_by_pid(&now, pid)["handles_refused"]
            .as_u64()
            .expect("handles_refused")
    };

    let (hog, hog_pid, go) = start_flood("hog", FLOOD, "types-keep");
    assert_eq!(refused(hog_pid), FLOOD - share, "nobody's refusals");
    roots_job_is_exact(&scratch, &daemon, "handles_refused");

    // Nobody's process exits keeping its datatypes: once the daemon has forgotten it (its
    // entries removed), its share is given back, and a new process of nobody's makes as
    // many again, none refused.
    let_go(hog, &go);
    wait_for_exited(&daemon.target, &[hog_pid]);
    let (again, again_pid, again_go) = start_flood("again", share, "types-free");
    assert_eq!(
        refused(again_pid),
        0,
        "refusals after the first process's exit"
    );
    // Root detaches it while it holds its whole share: the daemon forgets it (its entries
    // removed) and gives its share back, so a third process makes as many, none refused.
    let out = commtap_output(&[
        "detach",
        "--pid",
        &again_pid.to_string(),
        "--from",
        &daemon.target,
    ]);
    assert!(
        out.status.success(),
        "detach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (third, third_pid, third_go) = start_flood("third", share, "types-keep");
    assert_eq!(refused(third_pid), 0, "refusals after the detach");
    let_go(again, &again_go);
    let_go(third, &third_go);
    assert_healthy(&scratch, &daemon);
    daemon.stop(&scratch);
}

/// Attack: nobody's process makes 70,000 persistent requests and keeps them, to fill the
/// kernel's request map (65,536 for the node, an LRU before: another user's new requests
/// pushed out the oldest, and root's persistent sends and collectives would start
/// undecoded). Nobody is refused past its share (counted exactly) and root's job beside it
/// is exact. `MPI_Request_free` gives an entry back: once the first process is forgotten,
/// a second makes a share of requests and frees them, and while it still runs a third
/// makes a share again, none refused; the same with Open MPI, whose requests are pointers
/// (MPICH's are ints). Time is taken one call in two: the frees are forgotten at their
/// entry whether their return is seen or not.
#[test]
fn a_user_cannot_fill_the_kernels_request_map() {
    use collector_common::{
        shares::{share_of, DEFAULT_USER_SHARE_PCT},
        MAX_PERSISTENT,
    };
    const FLOOD: u64 = 70_000;
    let share = share_of(u64::from(MAX_PERSISTENT), DEFAULT_USER_SHARE_PCT);
    let scratch = Scratch::new("attack-requests");
    let daemon = Daemon::start(&scratch, &[], &[], &["--time-one-in", "2"]);
    let dir = nobody_dir(&scratch, "nobody");
    let start_flood = |mpi: Mpi, tag: &str, n: u64, what: &str| {
        let (job, pid, go) = start_mpi_flood(&daemon, &dir, mpi, tag, what, n);
        let now = report_json(&["report", "--from", &daemon.target]);
        let rank = rank_by_pid(&now, pid).clone();
        assert_eq!(rank["routines"]["MPI_Send_init"]["calls"], n, "{rank:#}");
        (job, pid, go, rank)
    };
    let refused = |rank: &serde_json::Value| rank["handles_refused"].as_u64();

    let (hog, hog_pid, go, rank) = start_flood(Mpi::Mpich, "hog", FLOOD, "requests-keep");
    assert_eq!(refused(&rank), Some(FLOOD - share), "nobody's refusals");
    roots_job_is_exact(&scratch, &daemon, "handles_refused");
    let_go(hog, &go);
    wait_for_exited(&daemon.target, &[hog_pid]);

    for mpi in [Mpi::Mpich, Mpi::OpenMpi] {
        let tag = |t: &str| format!("{t}-{}", mpi.suffix());
        let (freed, freed_pid, freed_go, rank) =
            start_flood(mpi, &tag("freed"), share, "requests-free");
        assert_eq!(
            refused(&rank),
            Some(0),
            "{mpi:?}: refusals after the last exit"
        );
        let frees = &rank["routines"]["MPI_Request_free"];
        let timed = frees["sampled_time"]["timed_calls"].as_u64();
        assert_eq!(frees["calls"], share, "{frees:#}");
        assert!(
            timed.is_some_and(|t| t > 0 && t < share),
            "frees counted both at their entry and at their return: {frees:#}"
        );
        let (kept, kept_pid, kept_go, rank) =
            start_flood(mpi, &tag("kept"), share, "requests-keep");
        assert_eq!(
            refused(&rank),
            Some(0),
            "{mpi:?}: refusals after a share was freed"
        );
        let_go(freed, &freed_go);
        let_go(kept, &kept_go);
        wait_for_exited(&daemon.target, &[freed_pid, kept_pid]);
    }
    assert_healthy(&scratch, &daemon);
    daemon.stop(&scratch);
}

/// Attack: a user given sub-uids (`/etc/subuid`, as rootless containers are) runs its
/// processes as many users: nobody makes a user namespace, root maps three of its uids to
/// sub-uids (newuidmap's part), and a process under each makes a share of datatypes. Were
/// each sub-uid a user of its own, the three would fill the map (they did: 32,768 refused
/// among them, the whole map theirs) and root's job would go undecoded. They are charged to
/// nobody, who made the namespace: refused all but one share, and root's job is exact.
#[test]
fn a_user_with_sub_uids_holds_one_share() {
    namespace_holds_one_share("attack-subuids", true, "0 3000000 3\n");
}

/// Attack: the same sub-uids, from the node's own namespace. In its user namespace nobody
/// can make a setuid program owned by any of its sub-uids; run outside, it runs as that
/// sub-uid in no user namespace at all. Three such programs each start a flood of a share
/// of datatypes: charged as three users they filled the map (32,768 refused among them).
/// The daemon gives the kernel the sub-uids of its `--subuid-file` (`/etc/subuid`'s form):
/// each is nobody's, refused all but one share, and root's job is exact. The file names
/// them only once the daemon runs (root gives a user sub-uids): the daemon reads it again
/// and the kernel takes the new ranges in place of the old.
#[test]
fn a_sub_uids_setuid_program_holds_no_share_of_its_own() {
    const SUB_UIDS: u32 = 3_000_000;
    let scratch = Scratch::new("attack-subuid-setuid");
    let subuids = nobody_subuid_file(&scratch, SUB_UIDS / 10);
    let daemon = Daemon::start(
        &scratch,
        &[],
        &["--log", "info"],
        &["--subuid-file", path_str(&subuids)],
    );
    let given = || {
        std::fs::read_to_string(scratch.path("commtap.stderr"))
            .unwrap_or_default()
            .matches("the kernel charges sub-uids by these ranges now")
            .count()
    };
    wait_until("the first sub-uids given to the kernel", LIMIT, || {
        given() == 1
    });
    nobody_subuid_file(&scratch, SUB_UIDS);
    wait_until("the new sub-uids given to the kernel", LIMIT, || {
        given() == 2
    });
    let dir = nobody_dir(&scratch, "nobody");
    // Written by the sub-uids: no user the directory could belong to.
    std::fs::set_permissions(&dir, mode(0o777)).expect("chmod");
    let flood = build_program("mpi_flood.c", Mpi::Mpich);
    let mut floods = Vec::new();
    for k in 0..3 {
        let sub_uid = SUB_UIDS + k;
        let setuid = setuid_program(&dir, &format!("run{k}"), sub_uid);
        // A copy each: `start_as_nobody` finds its process by its file.
        let copy = dir.join(format!("mpi_flood{k}"));
        std::fs::copy(&flood, &copy).expect("copy");
        let mut cmd = Command::new(&setuid);
        cmd.args(Mpi::Mpich.launcher(1))
            .arg(&copy)
            .args(["types-keep", &SHARE.to_string()]);
        let flood = start_as_nobody(&daemon, &dir, &format!("flood{k}"), cmd);
        let status = std::fs::read_to_string(format!("/proc/{}/status", flood.1)).expect("status");
        let all_ids = format!("Uid:\t{sub_uid}\t{sub_uid}\t{sub_uid}\t{sub_uid}");
        assert!(
            status.lines().any(|l| l == all_ids),
            "not run as sub-uid {sub_uid}: {status}"
        );
        floods.push(flood);
    }
    let pids: Vec<u64> = floods.iter().map(|f| f.1).collect();
    let jobs = floods.into_iter().map(|(job, _, go)| (job, go)).collect();
    one_share_held(&scratch, daemon, &pids, jobs);
}

/// Attack: a container's root. Container engines (Kubernetes, LXD, systemd-nspawn) make
/// user namespaces as root, each mapped to uids of its own. Were a namespace root made
/// charged to root, a container's processes would use up root's share and root's own jobs
/// would go undecoded; were each of its uids a user, it would hold a share per uid. Root
/// makes one here (its uids 0, 1 and 2 are 4,000,000 .. outside), and a process under each
/// makes a share of datatypes: the container is refused all but one share, and root's job
/// beside it is exact.
#[test]
fn a_container_root_made_is_a_user_of_its_own() {
    namespace_holds_one_share("attack-container", false, "0 4000000 3\n");
}

/// The same container with its uids in 6 ranges, written out of order: past 5, the kernel
/// keeps them apart from the namespace, sorted (`uid_gid_map.forward`), and the kernel
/// side reads the first range there. Were it not read (the fallback to each process's own
/// uid), each uid would be a user of its own.
#[test]
fn a_container_with_many_uid_ranges_is_one_user_too() {
    let map = (0..6).rev().fold(String::new(), |mut map, k| {
        map.push_str(&format!("{k} {} 1\n", 4_000_000 + k));
        map
    });
    namespace_holds_one_share("attack-container-ranges", false, &map);
}

/// A user namespace made by nobody (`nobody`) or root with uid map `map` (its uids 0, 1 and
/// 2 mapped), a process under each of those three flooding a share of datatypes: all but
/// one share refused, and root's job beside them exact.
fn namespace_holds_one_share(name: &str, nobody: bool, map: &str) {
    let scratch = Scratch::new(name);
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let dir = nobody_dir(&scratch, "namespace");
    let (job, pids, go) = start_in_user_namespace(&daemon, &dir, nobody, map, SHARE);
    one_share_held(&scratch, daemon, &pids, vec![(job, go)]);
}

/// Three floods of a share each (`pids`) were refused all but one share between them, and
/// root's job beside them is exact; then `jobs` (each with its go file) are let end, and
/// the daemon, healthy, is stopped.
fn one_share_held(
    scratch: &Scratch,
    daemon: Daemon,
    pids: &[u64],
    jobs: Vec<(ChildGuard, PathBuf)>,
) {
    assert_eq!(refused_in_all(&daemon, pids), 2 * SHARE, "refusals");
    roots_job_is_exact(scratch, &daemon, "handles_refused");
    for (job, go) in jobs {
        let_go(job, &go);
    }
    assert_healthy(scratch, &daemon);
    daemon.stop(scratch);
}

/// One user's share of each handle map (the daemons here are started with the default).
const SHARE: u64 = collector_common::shares::share_of(
    collector_common::shares::HANDLE_MAP_ENTRIES as u64,
    collector_common::shares::DEFAULT_USER_SHARE_PCT,
);

/// Permission bits `bits`.
fn mode(bits: u32) -> std::fs::Permissions {
    <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(bits)
}

/// Makes a user namespace (as nobody where `nobody`, else as root: a container) with uid
/// and gid map `map` (the maps' text; its uids 0, 1 and 2 mapped). Each of those users
/// runs one-rank MPICH `mpi_flood types-keep N` at once, let begin once the daemon has
/// probed them all. Returns the namespace's first process, the floods' pids and
/// their go file once each has made its flood.
fn start_in_user_namespace(
    daemon: &Daemon,
    dir: &Path,
    nobody: bool,
    map: &str,
    n: u64,
) -> (ChildGuard, Vec<u64>, PathBuf) {
    let users: u64 = 3;
    // Written by the namespace's users: no user the directory could belong to.
    std::fs::set_permissions(dir, mode(0o777)).expect("chmod");
    let file = |what: &str| dir.join(format!("flood.{what}"));
    let split = compile_c(
        "userns_split.c",
        "userns_split",
        &[&format!(
            "-I{}",
            repo_root().join("tests/programs").display()
        )],
    );
    let flood = build_program("mpi_flood.c", Mpi::Mpich);
    let mut cmd = if nobody {
        as_nobody(&split)
    } else {
        Command::new(&split)
    };
    cmd.arg(users.to_string())
        .args([file("unshared"), file("mapped"), dir.join("flood")])
        .args(Mpi::Mpich.launcher(1))
        .arg(&flood)
        .args(["types-keep", &n.to_string()])
        .current_dir(dir)
        .env("HOME", dir);
    let job = ChildGuard::spawn(&mut cmd);
    wait_until("the user namespace", LIMIT, || file("unshared").exists());
    // What newuidmap and newgidmap would write (or a container engine).
    for which in ["uid_map", "gid_map"] {
        std::fs::write(format!("/proc/{}/{which}", job.0.id()), map).expect(which);
    }
    std::fs::write(file("mapped"), "").expect("mapped file");
    let mut pids = Vec::new();
    wait_until("the namespace's processes to run", LIMIT, || {
        pids = pids_running(&flood);
        pids.len() == users as usize
    });
    let pids: Vec<u64> = pids.into_iter().map(u64::from).collect();
    wait_for_state(&daemon.target, &pids, "probed");
    for k in 0..users {
        std::fs::write(file(&format!("{k}.start")), "").expect("start file");
    }
    wait_until("the floods to be made", LIMIT, || {
        (0..users).all(|k| file(&format!("{k}.ready")).exists())
    });
    (job, pids, file("go"))
}

/// A copy of `setuid_run` at `dir/name`, owned by `uid` and setuid: what a user can make
/// in its user namespace, owned by one of its sub-uids. Checked: run by nobody, it runs as
/// `uid`.
fn setuid_program(dir: &Path, name: &str, uid: u32) -> PathBuf {
    let program = dir.join(name);
    std::fs::copy(compile_c("setuid_run.c", "setuid_run", &[]), &program).expect("copy");
    std::os::unix::fs::chown(&program, Some(uid), Some(uid)).expect("chown");
    std::fs::set_permissions(&program, mode(0o4755)).expect("chmod");
    let out = as_nobody(&program)
        .args(["id", "-u"])
        .output()
        .expect("setuid program");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        uid.to_string(),
        "a setuid program does not run as its owner (target/e2e on a nosuid mount?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    program
}

/// The datatypes refused to processes `pids`, in all.
fn refused_in_all(daemon: &Daemon, pids: &[u64]) -> u64 {
    let now = report_json(&["report", "--from", &daemon.target]);
    pids.iter()
        .map(|p| {
            rank_by_pid(&now, *p)["handles_refused"]
                .as_u64()
                .expect("handles_refused")
        })
        .sum()
}

/// Attack: nobody's process makes 144,000 counters (16,000 communicators of its own NCCL
/// library, each a size of its own, times 9 message sizes of `ncclAllReduce`), more than
/// the kernel's 131,072 counter slots for the node: root's job's calls would then go
/// uncounted (it did not show at all). Nobody gets at most its share of the slots, every
/// call it made is counted or counted as lost (`counter_map_full`), and root's job beside
/// it is profiled exactly. The daemon is given `--user-share 25`: nobody's share is what
/// it reads at every `ps`, and a quarter keeps that quick on a slow machine too.
#[test]
fn a_user_cannot_fill_the_kernels_counter_map() {
    use collector_common::{shares::share_of, MAX_COUNTERS};
    const COMMS: u64 = 16_000;
    const SIZES: u64 = 9;
    const SHARE_PCT: u32 = 25;
    let share = share_of(u64::from(MAX_COUNTERS), SHARE_PCT);
    assert!(
        COMMS * SIZES > u64::from(MAX_COUNTERS),
        "the flood must fill the map"
    );
    let scratch = Scratch::new("attack-counters");
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &["--user-share", &SHARE_PCT.to_string()],
    );
    let standin = build_shared_c("nccl_standin.c");
    let lib_dir = standin.parent().expect("bin dir").display().to_string();
    let flood = compile_c(
        "nccl_counter_flood.c",
        "nccl_counter_flood",
        &[
            &format!("-I{}", repo_root().join("tests/programs").display()),
            "-I/usr/include/x86_64-linux-gnu/mpich",
            &format!("-L{lib_dir}"),
            &format!("-Wl,-rpath,{lib_dir}"),
            "-l:libnccl_standin.so",
            "-lmpich",
        ],
    );
    let dir = nobody_dir(&scratch, "nobody");
    let mut cmd = Command::new(&Mpi::Mpich.launcher(1)[0]);
    cmd.args(&Mpi::Mpich.launcher(1)[1..])
        .arg(&flood)
        .args([COMMS.to_string(), SIZES.to_string()]);
    let (hog, hog_pid, go) = start_as_nobody(&daemon, &dir, "hog", cmd);

    let profile = report_json(&["report", "--from", &daemon.target]);
    let rank = rank_by_pid(&profile, hog_pid);
    let calls = |routine: &str| {
        rank["routines"][routine]["calls"]
            .as_u64()
            .unwrap_or_else(|| panic!("{routine} calls: {rank:#}"))
    };
    let lost = rank["counter_map_full"].as_u64().expect("counter_map_full");
    assert_eq!(
        calls("ncclCommInitRank") + calls("ncclAllReduce") + lost,
        COMMS + COMMS * SIZES,
        "nobody's calls, counted or counted as lost"
    );
    // Each ncclAllReduce call is a counter of its own: at most `share` of them had a slot.
    assert!(
        lost >= COMMS * SIZES - share,
        "nobody lost {lost} calls: more than its share of the counter slots was given"
    );
    roots_job_is_exact(&scratch, &daemon, "counter_map_full");

    let_go(hog, &go);
    // Nobody's share of the counters is nobody's to have: the daemon reads them, and holds
    // and serves the profile made of them (with half of the map, 45 MiB more here), by the
    // share's measure (two copies of it at most), not by the flood's.
    let counter = size_of::<collector_common::CounterKey>()
        + size_of::<collector_common::CounterVal>()
        + size_of::<collector_common::DurationHist>();
    assert_healthy_within(
        &scratch,
        &daemon,
        DAEMON_PEAK_LIMIT_KIB,
        DAEMON_GROWTH_LIMIT_KIB + 2 * share * counter as u64 / 1024,
    );
    daemon.stop(&scratch);
}

/// Attack: nobody's process sends to 70,000 peers (ranks its world does not have: each
/// send fails, and each is counted), to fill the kernel's per-peer map (65,536 entries for
/// the node): root's job's traffic matrix would then miss peers. Nobody's process is
/// refused past its share (counted, exactly, in its `peers_full`), and root's job beside
/// it is profiled exactly, its peers included.
#[test]
fn a_user_cannot_fill_the_kernels_peer_map() {
    use collector_common::{
        shares::{share_of, DEFAULT_USER_SHARE_PCT},
        MAX_PEER_COUNTERS,
    };
    const FLOOD: u64 = 70_000;
    let share = share_of(u64::from(MAX_PEER_COUNTERS), DEFAULT_USER_SHARE_PCT);
    let scratch = Scratch::new("attack-peers");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let dir = nobody_dir(&scratch, "nobody");
    let (hog, hog_pid, go) = start_mpi_flood(&daemon, &dir, Mpi::Mpich, "hog", "peers", FLOOD);
    let profile = report_json(&["report", "--from", &daemon.target]);
    let rank = rank_by_pid(&profile, hog_pid);
    assert_eq!(rank["routines"]["MPI_Send"]["calls"], FLOOD, "{rank:#}");
    assert_eq!(rank["peers_full"], FLOOD - share, "nobody's refusals");
    roots_job_is_exact(&scratch, &daemon, "peers_full");
    let_go(hog, &go);
    assert_healthy(&scratch, &daemon);
    daemon.stop(&scratch);
}

/// Lets nobody's flood `job` end (creates its `go` file) and asserts it ended well.
fn let_go(mut job: ChildGuard, go: &Path) {
    std::fs::write(go, "").expect("go file");
    assert!(
        job.wait_with_limit(LIMIT).success(),
        "nobody's flood failed"
    );
}

/// Starts nobody's one-rank `mpi_flood WHAT N` of `mpi` (see [`start_as_nobody`]).
fn start_mpi_flood(
    daemon: &Daemon,
    dir: &Path,
    mpi: Mpi,
    tag: &str,
    what: &str,
    n: u64,
) -> (ChildGuard, u64, PathBuf) {
    let flood = build_program("mpi_flood.c", mpi);
    let mut cmd = Command::new(&mpi.launcher(1)[0]);
    cmd.args(&mpi.launcher(1)[1..])
        .arg(&flood)
        .args([what, &n.to_string()]);
    start_as_nobody(daemon, dir, tag, cmd)
}

/// Starts `cmd` (its first arguments given) as nobody in `dir`, with the files
/// `TAG.start`, `TAG.ready` and `TAG.go` as its last arguments; lets it begin once the
/// daemon has probed it, and returns it, its pid and its go file once it says it is ready
/// (its flood made).
fn start_as_nobody(
    daemon: &Daemon,
    dir: &Path,
    tag: &str,
    cmd: Command,
) -> (ChildGuard, u64, PathBuf) {
    let file = |what: &str| dir.join(format!("{tag}.{what}"));
    let program = PathBuf::from(cmd.get_program());
    let mut nobody = Command::new("setpriv");
    nobody
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .args([file("start"), file("ready"), file("go")])
        .current_dir(dir)
        .env("HOME", dir);
    let job = ChildGuard::spawn(&mut nobody);
    // The flood itself: under an MPI launcher, the program after it.
    let flood = cmd
        .get_args()
        .map(PathBuf::from)
        .find(|a| a.is_absolute() && a.is_file())
        .unwrap_or(program);
    let mut pids = Vec::new();
    wait_until("nobody's process to run", LIMIT, || {
        pids = pids_running(&flood);
        pids.len() == 1
    });
    let pid = u64::from(pids[0]);
    wait_for_state(&daemon.target, &[pid], "probed");
    std::fs::write(file("start"), "").expect("start file");
    wait_until("nobody's flood to be made", LIMIT, || {
        file("ready").exists()
    });
    (job, pid, file("go"))
}

/// Runs root's two-rank MPICH truth program beside nobody's flood and asserts its profile
/// (its ranks only) equals what it did, with none of its `counter` (what nobody's flood
/// would have made it lose) above 0.
fn roots_job_is_exact(scratch: &Scratch, daemon: &Daemon, counter: &str) {
    let prog = build_program("mpi_truth.c", Mpi::Mpich);
    let truth = scratch.path("truth");
    let mut cmd = Command::new(&Mpi::Mpich.launcher(2)[0]);
    cmd.args(&Mpi::Mpich.launcher(2)[1..])
        .arg(&prog)
        .arg(&truth);
    let mut job = ChildGuard::spawn(&mut cmd);
    assert!(job.wait_with_limit(LIMIT).success(), "root's job failed");
    let truths = read_truths(&truth, 2);
    let pids = pids_of(&truths);
    wait_for_exited(&daemon.target, &pids);
    let mut roots = report_json(&["report", "--from", &daemon.target]);
    let ranks: Vec<serde_json::Value> = roots["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .filter(|r| r["pid"].as_u64().is_some_and(|p| pids.contains(&p)))
        .cloned()
        .collect();
    roots["ranks"] = ranks.into();
    assert_profile_matches(&roots, &truths, &["MPI_Finalize"]);
    for r in roots["ranks"].as_array().expect("ranks") {
        assert_eq!(r[counter], 0, "root's rank lost to nobody's flood: {r:#}");
    }
}
