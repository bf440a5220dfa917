//! Late Sender: a real Open MPI and MPICH job whose rank 1 is known to send late to a rank
//! 0 already waiting in MPI_Recv (`mpi_late_sender.c`): the profile pairs every message
//! with its receive and counts exactly the late ones, with about the sleeps as the wait.
//! And Late Receiver: rank 1's synchronous sends to a rank 0 that posts its receives late.

use std::time::Duration;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);
const DELAY_MS: u64 = 20;
const N: u64 = 10;

/// The profile's Late Sender section is the job's truth: rank 1's late sends to rank 0
/// paired with every MPI_Recv, exactly the late ones, waits of about the sleeps; and its
/// Late Receivers: every blocking send of rank 1, exactly the ones rank 0 was late for.
#[track_caller]
fn assert_late_senders(profile: &serde_json::Value, truths: &[serde_json::Value]) {
    let (receiver, sender) = (&truths[0], &truths[1]);
    let ls = &profile["skew"]["late_sender"];
    let delay = receiver["delay_ns"].as_u64().expect("delay");
    for (list, messages, late) in [
        ("pairs", &receiver["messages"], &receiver["late"]),
        (
            "late_receivers",
            &sender["blocking_sends"],
            &sender["receiver_late"],
        ),
    ] {
        let pairs = ls[list]
            .as_array()
            .unwrap_or_else(|| panic!("{list}: {profile:#}"));
        assert_eq!(pairs.len(), 1, "rank 1 -> rank 0 only: {ls}");
        let p = &pairs[0];
        assert_eq!(
            (&p["receiver"], &p["sender"]),
            (&0.into(), &1.into()),
            "{p}"
        );
        assert_eq!(
            &p["messages"], messages,
            "{list}: every message paired: {p}"
        );
        assert_eq!(&p["late"], late, "{list}: exactly the late ones: {p}");
        // Each late one waited about the other side's sleep (more on a loaded machine:
        // the sleep is a floor, an oversubscribed scheduler adds to it).
        let wait = p["wait_ns"].as_u64().expect("wait");
        let sleeps = late.as_u64().expect("late") * delay;
        assert!(
            wait >= sleeps * 8 / 10 && wait <= sleeps * 3,
            "{list}: waited {wait} ns for {sleeps} ns of sleeps"
        );
    }
    assert_eq!(ls["unpaired"], 0, "{ls}");
    for (reason, n) in ls["not_numbered"].as_object().expect("not_numbered") {
        assert_eq!(n, 0, "{reason}: {ls}");
    }
}

fn late_senders_are_counted(mpi: Mpi) {
    let scratch = Scratch::new(&format!("late-sender-{}", mpi.suffix()));
    let prog = build_program("mpi_late_sender.c", mpi);
    let (out, prefix) = (scratch.path("profile.json"), scratch.path("truth"));
    let mut args: Vec<String> = [
        "record",
        "--call-events",
        "--format",
        "json",
        "-o",
        path_str(&out),
        "--",
    ]
    .map(String::from)
    .to_vec();
    args.extend(mpi.launcher(2));
    args.extend([
        prog.display().to_string(),
        DELAY_MS.to_string(),
        N.to_string(),
        prefix.display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let truths = read_truths(&prefix, 2);
    assert_late_senders(&read_json(&out), &truths);

    // Without per-call events, point-to-point calls are not seen one by one: no Late
    // Sender section, rather than a wrong one.
    let plain = scratch.path("plain.json");
    let mut args: Vec<String> = ["record", "--format", "json", "-o", path_str(&plain), "--"]
        .map(String::from)
        .to_vec();
    args.extend(mpi.launcher(2));
    args.extend([
        prog.display().to_string(),
        "1".into(),
        "2".into(),
        scratch.path("plain").display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    assert!(read_json(&plain)["skew"].get("late_sender").is_none());
}

/// A node daemon with per-call events (`--call-events`) pairs the sends and receives of a
/// job it was not told about, as `record` does, and serves them in the job's report.
fn late_senders_are_counted_by_a_daemon(mpi: Mpi) {
    let scratch = Scratch::new(&format!("late-sender-daemon-{}", mpi.suffix()));
    let daemon = Daemon::start(&scratch, &[], &[], &["--call-events", "--no-state"]);
    let prog = build_program("mpi_late_sender.c", mpi);
    let prefix = scratch.path("truth");
    let launcher = mpi.launcher(2);
    let mut cmd = std::process::Command::new(&launcher[0]);
    mpi_env(&mut cmd)
        .args(&launcher[1..])
        .arg(&prog)
        .args([&DELAY_MS.to_string(), &N.to_string()])
        .arg(&prefix);
    let mut job = ChildGuard::spawn(&mut cmd);
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let truths = read_truths(&prefix, 2);
    wait_for_exited(&daemon.target, &pids_of(&truths));
    let job_id = truths[0]["pid"].as_u64().expect("pid").to_string();
    let profile = report_json(&["report", "--from", &daemon.target, "--job", &job_id]);
    assert_late_senders(&profile, &truths);
    daemon.stop(&scratch);
}

#[test]
fn late_senders_are_counted_by_a_daemon_under_open_mpi() {
    late_senders_are_counted_by_a_daemon(Mpi::OpenMpi);
}

#[test]
fn late_senders_are_counted_by_a_daemon_under_mpich() {
    late_senders_are_counted_by_a_daemon(Mpi::Mpich);
}

#[test]
fn late_senders_are_counted_in_an_open_mpi_job() {
    late_senders_are_counted(Mpi::OpenMpi);
}

#[test]
fn late_senders_are_counted_in_an_mpich_job() {
    late_senders_are_counted(Mpi::Mpich);
}

/// Two simulated nodes: rank 0 in one cgroup, watched by node-a's daemon; rank 1 in
/// another, watched by node-b's, whose clock is 5 s ahead. Neither daemon sees both ends
/// of a message: each hands its halves on, and the aggregator pairs them on its clock,
/// exactly as `record` pairs them on one node.
#[test]
fn late_senders_across_nodes_are_paired_by_the_aggregator() {
    let scratch = Scratch::new("late-sender-nodes");
    let agg_scratch = Scratch::new("late-sender-nodes-aggregator");
    let (mut aggregator, url) = spawn_local_aggregator(&agg_scratch, &scratch.path("agg.redb"));
    let groups = [
        CgroupGuard::new("commtap-node-a"),
        CgroupGuard::new("commtap-node-b"),
    ];
    let mut daemons = Vec::new();
    for ((node, cg), clock) in ["node-a", "node-b"]
        .into_iter()
        .zip(&groups)
        .zip(["0", "5000000000"])
    {
        let node_scratch = Scratch::new(&format!("late-sender-{node}"));
        let d = Daemon::start(
            &node_scratch,
            &[],
            &[],
            &[
                "--call-events",
                "--no-state",
                "--node-name",
                node,
                "--cgroup",
                path_str(&cg.0),
                "--test-clock-offset-ns",
                clock,
                "--aggregator",
                &url,
                "--push-insecure",
                "--push-interval",
                "200ms",
            ],
        );
        daemons.push((node_scratch, d));
    }

    // One rank per cgroup (Open MPI's per-rank application contexts).
    let job_id = format!("ls{}", std::process::id());
    let prog = build_program("mpi_late_sender.c", Mpi::OpenMpi);
    let prefix = scratch.path("truth");
    let rank_cmd = format!("{} {DELAY_MS} {N} {}", prog.display(), prefix.display());
    let launcher = Mpi::OpenMpi.launcher(1);
    let mut cmd = std::process::Command::new(&launcher[0]);
    mpi_env(&mut cmd)
        .args(["-x", "SLURM_JOB_ID"])
        .env("SLURM_JOB_ID", &job_id)
        .args(&launcher[1..])
        .args(["sh", "-c", &groups[0].exec_inside(&rank_cmd), ":"])
        .args(&launcher[2..])
        .args(["sh", "-c", &groups[1].exec_inside(&rank_cmd)]);
    let mut job = ChildGuard::spawn(&mut cmd);
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let truths = read_truths(&prefix, 2);

    let report = || try_job_report(&[], &url, &job_id, &scratch.path("merged.json"));
    wait_until("every message paired at the aggregator", LIMIT, || {
        report().is_some_and(|p| {
            every_rank_final(&p, 2)
                && p["skew"]["late_sender"]["unpaired"] == 0
                && p["skew"]["late_sender"]["pairs"][0]["messages"] == truths[0]["messages"]
        })
    });
    let merged = report().expect("report");
    assert_late_senders(&merged, &truths);
    let pair = &merged["skew"]["late_sender"]["pairs"][0];
    assert_eq!(
        (&pair["receiver_host"], &pair["sender_host"]),
        (&"node-a".into(), &"node-b".into()),
        "{pair}"
    );
    // Each node alone paired nothing: every message crossed.
    for (node_scratch, d) in &daemons {
        let own = report_json(&["report", "--from", &d.target, "--job", &job_id]);
        assert_eq!(
            own["skew"]["late_sender"]["pairs"].as_array().map(Vec::len),
            Some(0),
            "{}: {own:#}",
            node_scratch.0.display()
        );
    }
    for (node_scratch, d) in daemons {
        d.stop(&node_scratch);
    }
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    let _ = aggregator.wait_with_limit(LIMIT);
}
