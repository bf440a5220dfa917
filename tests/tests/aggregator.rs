//! Two daemons (two nodes, each in its own network namespace) and one aggregator on one
//! machine, talking over TCP with TLS: the aggregator's report of a job equals the ground
//! truth and the sum of the two node reports; killing and restarting the aggregator loses
//! nothing and doubles nothing.

use std::{process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(5);

fn commtap(args: &[&str]) -> std::process::Output {
    Command::new(commtap_bin())
        .args(args)
        .output()
        .expect("running commtap")
}

/// (calls, bytes) per routine per pid of a report, MPI_Finalize left out.
fn tables(
    profile: &serde_json::Value,
) -> std::collections::BTreeMap<u64, std::collections::BTreeMap<String, (u64, u64)>> {
    let mut t = rank_tables(profile);
    for routines in t.values_mut() {
        routines.remove("MPI_Finalize");
    }
    t
}

#[test]
fn aggregator_merges_nodes_exactly_and_survives_a_restart() {
    let scratch = Scratch::new("aggregator");
    let (ca, cert, key) = make_certs(&scratch.0);
    let ca_arg = ca.to_str().expect("utf8").to_string();
    let port = free_port().rsplit(':').next().expect("port").to_string();
    let listen = format!("0.0.0.0:{port}");
    let url = format!("https://127.0.0.1:{port}");
    let db = scratch.path("agg.redb");
    let agg_scratch = Scratch::new("aggregator-server");
    let start_aggregator = || {
        let args = [
            "--log",
            "info",
            "aggregator",
            "--listen",
            &listen,
            "--db",
            db.to_str().expect("utf8"),
            "--tls-cert",
            cert.to_str().expect("utf8"),
            "--tls-key",
            key.to_str().expect("utf8"),
            "--tls-client-ca",
            &ca_arg,
        ];
        spawn_commtap(&agg_scratch, &args)
    };
    // Mutual TLS: each daemon's certificate names its node and the role to push; the
    // reports are read with a reader's.
    let (read_cert, read_key) = make_client_cert(&scratch.0, "reader", Some("commtap-read"));
    let nets = [Netns::new(1), Netns::new(2)];
    let mut aggregator = start_aggregator();

    // A batch job of 4 ranks, waiting at its GO file.
    let job_id = format!("e2e{}", std::process::id());
    let (mut job, ranks) =
        start_waiting_loop(&scratch, Mpi::OpenMpi, 4, 500, &[("SLURM_JOB_ID", &job_id)]);

    // Two "nodes": each daemon, in its own network namespace, watches half of the ranks and
    // pushes over TLS to the aggregator's address on its veth link.
    let mut daemons = Vec::new();
    let halves = [("node-a", &ranks[..2]), ("node-b", &ranks[2..])];
    for ((node, pids), (net, n)) in halves.into_iter().zip(nets.iter().zip(1..)) {
        let node_scratch = Scratch::new(node);
        let pids = pid_list(pids);
        let upstream = format!("https://10.231.{n}.1:{port}");
        let args = [
            "--node-name",
            node,
            "--pid",
            &pids,
            "--push-interval",
            "200ms",
            "--aggregator",
            &upstream,
        ];
        let (push_cert, push_key) = make_client_cert(&scratch.0, node, Some("commtap-push"));
        let d = Daemon::start(
            &node_scratch,
            &["ip", "netns", "exec", &net.name],
            &[
                "--tls-ca",
                &ca_arg,
                "--tls-cert",
                path_str(&push_cert),
                "--tls-key",
                path_str(&push_key),
            ],
            &args,
        );
        daemons.push((node_scratch, d));
    }
    std::fs::write(scratch.path("go"), b"go").expect("go");
    assert!(job.wait_with_limit(LIMIT).success(), "the job failed");
    let truths = read_truths(&scratch.path("truth"), 4);

    // Final once every rank's MPI_Finalize has reached the aggregator.
    let reader = [
        "--tls-ca",
        &ca_arg,
        "--tls-cert",
        path_str(&read_cert),
        "--tls-key",
        path_str(&read_key),
    ];
    let report = |name: &str| try_job_report(&reader, &url, &job_id, &scratch.path(name));
    let finalized = |p: &serde_json::Value| every_rank_final(p, 4);
    wait_until(
        "the aggregator to have every rank's final profile",
        Duration::from_mins(1),
        || report("merged.json").is_some_and(|p| finalized(&p)),
    );
    let merged = report("merged.json").expect("report");
    assert_eq!(merged["job"].as_str(), Some(job_id.as_str()));
    assert_profile_matches(&merged, &truths, &["MPI_Finalize"]);

    // The merged report is the sum of the two node reports.
    let mut sum = std::collections::BTreeMap::new();
    for socket in daemons.iter().map(|(_, d)| &d.target) {
        let out = scratch.path("node.json");
        let r = commtap(&[
            "report",
            "--from",
            socket,
            "--format",
            "json",
            "-o",
            out.to_str().expect("utf8"),
        ]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        sum.extend(tables(&read_json(&out)));
    }
    assert_eq!(tables(&merged), sum, "aggregator != node A + node B");

    // A plaintext client gets nothing from the TLS listener.
    let plain = commtap(&[
        "report",
        "--from",
        &format!("http://127.0.0.1:{port}"),
        "--job",
        &job_id,
    ]);
    assert_eq!(
        plain.status.code(),
        Some(2),
        "plaintext against TLS must fail"
    );

    // SIGKILL the aggregator and restart it on the same database: nothing lost; the
    // daemons reconnect and resend their cumulative snapshots: nothing doubled.
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGKILL) };
    let _ = aggregator.wait_with_limit(LIMIT);
    drop(aggregator);
    let stale_lines = |s: &str| s.lines().filter(|l| l.contains("first batch")).count();
    aggregator = start_aggregator();
    wait_until("both daemons to push again", Duration::from_mins(1), || {
        stale_lines(
            &std::fs::read_to_string(agg_scratch.path("commtap.stderr")).unwrap_or_default(),
        ) >= 2
    });
    let after = report("after.json").expect("report after restart");
    assert_eq!(
        tables(&after),
        tables(&merged),
        "the restart lost or doubled something"
    );
    assert_profile_matches(&after, &truths, &["MPI_Finalize"]);

    for (node_scratch, d) in daemons {
        d.stop(&node_scratch);
    }
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    let run = finish_commtap(&agg_scratch, aggregator, Duration::from_mins(1));
    assert!(run.status.success(), "aggregator: {}", run.stderr);
}

#[test]
fn aggregator_refuses_plaintext_unless_told() {
    let out = commtap(&[
        "aggregator",
        "--listen",
        &free_port(),
        "--db",
        "/tmp/commtap-never-created.redb",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--insecure-tcp"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace joined to the host by a veth pair: host side `10.231.N.1`, namespace
/// side `10.231.N.2`. Removed when dropped.
struct Netns {
    name: String,
    host_if: String,
}

impl Netns {
    fn new(n: u32) -> Netns {
        let tag = std::process::id() % 10000;
        let name = format!("commtap-{}-{n}", std::process::id());
        let (host_if, ns_if) = (format!("ctap{tag}h{n}"), format!("ctap{tag}n{n}"));
        sh(&format!(
            "ip netns add {name} && ip link add {host_if} type veth peer name {ns_if} && \
             ip link set {ns_if} netns {name} && ip addr add 10.231.{n}.1/24 dev {host_if} && \
             ip link set {host_if} up && ip -n {name} addr add 10.231.{n}.2/24 dev {ns_if} && \
             ip -n {name} link set {ns_if} up && ip -n {name} link set lo up"
        ));
        Netns { name, host_if }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

#[test]
fn aggregators_form_a_tree() {
    let scratch = Scratch::new("aggregator-tree");
    let (top_addr, mid_addr) = (free_port(), free_port());
    let top_scratch = Scratch::new("aggregator-top");
    let mid_scratch = Scratch::new("aggregator-mid");
    let top_db = scratch.path("top.redb");
    let mid_db = scratch.path("mid.redb");
    let top = spawn_commtap(
        &top_scratch,
        &[
            "aggregator",
            "--listen",
            &top_addr,
            "--insecure-tcp",
            "--db",
            path_str(&top_db),
        ],
    );
    let top_url = format!("http://{top_addr}");
    let mid_args = [
        "aggregator",
        "--listen",
        &mid_addr,
        "--insecure-tcp",
        "--db",
        path_str(&mid_db),
        "--upstream",
        &top_url,
        "--push-insecure",
        "--push-interval",
        "200ms",
    ];
    let mid = spawn_commtap(&mid_scratch, &mid_args);
    let mid_url = format!("http://{mid_addr}");
    let daemon_scratch = Scratch::new("aggregator-tree-node");
    let daemon = Daemon::start(
        &daemon_scratch,
        &[],
        &[],
        &[
            "--node-name",
            "leaf",
            "--aggregator",
            &mid_url,
            "--push-insecure",
            "--push-interval",
            "200ms",
        ],
    );

    // A batch job under the daemon.
    let job_id = format!("tree{}", std::process::id());
    let prog = build_program("mpi_truth.c", Mpi::OpenMpi);
    let mut cmd = Command::new("mpirun.openmpi");
    mpi_env(&mut cmd)
        .args(["--oversubscribe", "-np", "2", "-x", "SLURM_JOB_ID"])
        .arg(&prog)
        .arg(scratch.path("truth"))
        .env("SLURM_JOB_ID", &job_id);
    assert!(
        ChildGuard::spawn(&mut cmd).wait_with_limit(LIMIT).success(),
        "the job failed"
    );
    let truths = read_truths(&scratch.path("truth"), 2);

    // The top of the tree ends up with the job, exactly.
    let out = scratch.path("top.json");
    wait_until(
        "the job to reach the top aggregator",
        Duration::from_mins(1),
        || try_job_report(&[], &top_url, &job_id, &out).is_some_and(|p| every_rank_final(&p, 2)),
    );
    assert_profile_matches(&read_json(&out), &truths, &["MPI_Finalize"]);
    // Live: WatchJobReport streams the same report; a job whose every rank exited ends
    // the watch after one (no --count: it would hang here, not end, were it to go on).
    let (watch_out, watch_err) = (scratch.path("watch.jsonl"), scratch.path("watch.err"));
    let mut watch = Command::new(commtap_bin());
    watch
        .args(["report", "--from", &top_url, "--job", &job_id])
        .args(["--watch", "200ms", "--format", "json"])
        .stdout(std::fs::File::create(&watch_out).expect("watch output"))
        .stderr(std::fs::File::create(&watch_err).expect("watch errors"));
    let ended = ChildGuard::spawn(&mut watch).wait_with_limit(LIMIT);
    assert!(ended.success(), "{ended}");
    let watched = std::process::Output {
        status: ended,
        stdout: std::fs::read(&watch_out).expect("watch output"),
        stderr: std::fs::read(&watch_err).expect("watch errors"),
    };
    let reports: Vec<serde_json::Value> = serde_json::Deserializer::from_slice(&watched.stdout)
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("JSON reports");
    let said = String::from_utf8_lossy(&watched.stderr);
    assert_eq!(reports.len(), 1, "{said}");
    // A watch of a job the aggregator does not hold ends as `report` does (exit status 3),
    // not waiting for a push that may never come.
    let mut missing = Command::new(commtap_bin());
    missing
        .args([
            "report",
            "--from",
            &top_url,
            "--job",
            "no-such-job",
            "--watch",
            "200ms",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let ended = ChildGuard::spawn(&mut missing).wait_with_limit(LIMIT);
    assert_eq!(ended.code(), Some(3), "{ended}");
    assert!(
        said.contains("every rank exited; that report is final"),
        "{said}"
    );
    for r in &reports {
        assert_profile_matches(r, &truths, &["MPI_Finalize"]);
    }
    let jobs = commtap(&["jobs", "--from", &top_url]);
    assert!(
        String::from_utf8_lossy(&jobs.stdout).contains(&job_id),
        "{}",
        String::from_utf8_lossy(&jobs.stdout)
    );
    // The same as JSON: the job's ranks, and the one node (the daemon's --node-name) that
    // pushed them.
    let listed = commtap(&["jobs", "--from", &top_url, "--format", "json"]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("jobs JSON");
    let job = listed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find(|j| j["job"] == job_id.as_str())
        .unwrap_or_else(|| panic!("{job_id} not in {listed}"));
    assert_eq!(
        (&job["ranks"], &job["nodes"]),
        (&truths.len().into(), &serde_json::json!(["leaf"])),
        "{job}"
    );

    // A job of 10,000 ranks (about 7 MB of profiles, past gRPC's default 4 MiB message):
    // pushed to the middle aggregator, relayed to the top in messages of bounded size, and
    // read back whole from both.
    let big = format!("big{}", std::process::id());
    let n = 10_000u64;
    let pushed = Command::new("python3")
        .arg(repo_root().join("tests/clients/aggregator_client.py"))
        .arg(repo_root().join("proto"))
        .args([mid_addr.as_str(), "-", "-", "-", "push-many", "bignode"])
        .args([&n.to_string(), &big])
        .output()
        .expect("python3");
    let pushed: serde_json::Value = serde_json::from_slice(&pushed.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&pushed.stderr)));
    assert_eq!(pushed["accepted"], n, "{pushed}");
    let big_out = scratch.path("big.json");
    // None while the job is not there (yet).
    let big_report = |url: &str| try_job_report(&[], url, &big, &big_out);
    let calls_of = |p: &serde_json::Value| -> (usize, u64, u64) {
        let ranks = p["ranks"].as_array().expect("ranks");
        let (calls, bytes) = ranks
            .iter()
            .map(|r| routine_table(&r["routines"])["MPI_Allreduce"])
            .fold((0, 0), |(c, b), (rc, rb)| (c + rc, b + rb));
        (ranks.len(), calls, bytes)
    };
    let want = (n as usize, n * (n + 1) / 2, 8 * n * (n + 1) / 2);
    assert_eq!(
        calls_of(&big_report(&mid_url).expect("the job at the middle")),
        want,
        "at the middle aggregator"
    );
    wait_until("10,000 ranks at the top", Duration::from_mins(1), || {
        big_report(&top_url).is_some_and(|p| calls_of(&p) == want)
    });

    // The top lost (SIGKILL) and replaced by one with an empty database: the middle's new
    // stream starts with everything it holds, changed or not, and after that carries only
    // what changed (the 10,000 ranks, final, are not pushed again and again).
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(top.0.id() as i32, libc::SIGKILL) };
    let mut top = top;
    top.wait_with_limit(LIMIT);
    let top_metrics = free_port();
    let new_top_scratch = Scratch::new("aggregator-new-top");
    let new_top = spawn_commtap(
        &new_top_scratch,
        &[
            "aggregator",
            "--listen",
            &top_addr,
            "--insecure-tcp",
            "--db",
            path_str(&scratch.path("new-top.redb")),
            "--metrics-addr",
            &top_metrics,
            "--metrics-insecure",
        ],
    );
    // Both jobs: the middle's first push may bring them in either order.
    wait_until("everything at the new top", Duration::from_mins(1), || {
        big_report(&top_url).is_some_and(|p| calls_of(&p) == want)
            && try_job_report(&[], &top_url, &job_id, &scratch.path("new-top.json"))
                .is_some_and(|p| every_rank_final(&p, 2))
    });
    let small = try_job_report(&[], &top_url, &job_id, &scratch.path("new-top.json"))
        .expect("the MPI job at the new top");
    assert_profile_matches(&small, &truths, &["MPI_Finalize"]);
    let pushed = |outcome: &str| -> u64 {
        // The top answered the reports above: its metrics listener is up by now.
        let m = http_get(&top_metrics, "/metrics");
        let name = format!("commtap_aggregator_snapshots_total{{outcome=\"{outcome}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(name.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {m}"))
    };
    // The daemon's two exited ranks are snapshotted anew at every push (2 a push): wait
    // for 10 more pushes of the middle's.
    let (accepted, stale) = (pushed("accepted"), pushed("stale"));
    wait_until(
        "10 more pushes at the new top",
        Duration::from_mins(1),
        || pushed("accepted") >= accepted + 20,
    );
    // Everything again once every 60 pushes, not at each: under 5 times in those 10 or
    // more pushes however slowly the node's pushes come (that would take 240 of the
    // middle's), where pushing everything each time gives 10 times or more.
    let again = pushed("stale") - stale;
    assert!(
        again < 5 * n,
        "the middle pushed {again} unchanged snapshots again"
    );

    daemon.stop(&daemon_scratch);
    for (s, a) in [(&mid_scratch, mid), (&new_top_scratch, new_top)] {
        // SAFETY: kill(2) of an aggregator we spawned.
        unsafe { libc::kill(a.0.id() as i32, libc::SIGTERM) };
        let run = finish_commtap(s, a, Duration::from_mins(1));
        assert!(run.status.success(), "aggregator: {}", run.stderr);
    }
}

/// A network partition between a daemon (in its own network namespace) and its
/// aggregator while the job runs and ends: the daemon keeps counting and keeps its exited
/// ranks; once the link is back, its next push catches the aggregator up, exactly (each
/// rank once, equal to the job's truth and to what the daemon itself reports).
#[test]
fn a_partition_heals_and_the_aggregator_catches_up_exactly() {
    let scratch = Scratch::new("aggregator-partition");
    let net = Netns::new(3);
    let port = free_port().rsplit(':').next().expect("port").to_string();
    let agg_scratch = Scratch::new("aggregator-partition-server");
    let db = scratch.path("agg.redb");
    let listen = format!("0.0.0.0:{port}");
    let mut aggregator = spawn_commtap(
        &agg_scratch,
        &[
            "aggregator",
            "--listen",
            &listen,
            "--insecure-tcp",
            "--db",
            path_str(&db),
        ],
    );
    let url = format!("http://127.0.0.1:{port}");
    // The daemon first: it counts the job's ranks from MPI_Init on.
    let node_scratch = Scratch::new("aggregator-partition-node");
    let upstream = format!("http://10.231.3.1:{port}");
    let daemon = Daemon::start(
        &node_scratch,
        &["ip", "netns", "exec", &net.name],
        &[],
        &[
            "--node-name",
            "cut-off",
            "--push-interval",
            "200ms",
            "--aggregator",
            &upstream,
            "--push-insecure",
        ],
    );
    let job_id = format!("part{}", std::process::id());
    let (mut job, ranks) =
        start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 300, &[("SLURM_JOB_ID", &job_id)]);
    let report = |name: &str, from: &str| try_job_report(&[], from, &job_id, &scratch.path(name));
    wait_until("the aggregator to have both ranks", LIMIT, || {
        report("before.json", &url).is_some_and(|p| p["ranks"].as_array().map(Vec::len) == Some(2))
    });

    // Cut the link; the job does all its work and ends while the node is cut off.
    sh(&format!("ip link set {} down", net.host_if));
    std::fs::write(scratch.path("go"), b"go").expect("go");
    assert!(job.wait_with_limit(LIMIT).success(), "the job failed");
    let watched: Vec<u64> = ranks.iter().map(|p| u64::from(*p)).collect();
    wait_for_exited(&daemon.target, &watched);
    let during = report("during.json", &url).expect("the aggregator still answers");
    assert!(
        during["ranks"]
            .as_array()
            .expect("ranks")
            .iter()
            .all(|r| r["exited"] != true),
        "the aggregator cannot know of the exits yet"
    );

    // Heal: the daemon's next push lands everything.
    sh(&format!("ip link set {} up", net.host_if));
    let finalized = |p: &serde_json::Value| every_rank_final(p, 2);
    wait_until("the aggregator to catch up", LIMIT, || {
        report("after.json", &url).is_some_and(|p| finalized(&p))
    });
    let after = read_json(&scratch.path("after.json"));
    let at_node = report("node.json", &daemon.target).expect("the node's report");
    assert_eq!(tables(&after), tables(&at_node), "aggregator != node");
    let truths = read_truths(&scratch.path("truth"), 2);
    assert_loop_ranks(&after, &truths);
    daemon.stop(&node_scratch);
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    assert!(aggregator.wait_with_limit(LIMIT).success());
}
