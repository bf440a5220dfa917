//! The node daemon on request: a running process attached and detached through the API
//! (`commtap attach`/`detach`), its call events streamed (`StreamEvents`), and a detached
//! rank never counted again.

use std::{collections::BTreeMap, process::Command, time::Duration};

use serde_json::Value;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(5);

/// AttachProcess, DetachProcess and StreamEvents through the CLI: a daemon scoped to
/// another user watches two ranks only when asked, stops watching one when asked (and does
/// not take it up again), and streams every call of the other as it happens.
#[test]
fn attach_detach_and_stream_events_on_request() {
    let scratch = Scratch::new("daemon-attach");
    // Scoped to nobody: the job (root's) is outside it until attached.
    let daemon = Daemon::start(&scratch, &[], &[], &["--uid", "65534"]);
    let n = 300u64;
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, n, &[]);
    let (r0, r1) = rank_pids(&ranks);
    for (pid, json) in [(r0, false), (r1, true)] {
        let pid_text = pid.to_string();
        let mut args = vec!["attach", "--pid", &pid_text, "--from", &daemon.target];
        if json {
            args.push("--json");
        }
        let out = commtap_output(&args);
        assert!(
            out.status.success(),
            "attach: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if json {
            // As `ps --json` lists a process.
            let p: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            assert_eq!(
                (p["pid"].as_u64(), p["state"].as_str()),
                (Some(u64::from(pid)), Some("probed")),
                "{p}"
            );
            assert!(
                p["cmdline"]
                    .as_str()
                    .is_some_and(|c| c.contains("mpi_loop")),
                "{p}"
            );
        }
    }
    let out = commtap_output(&["detach", "--pid", &r1.to_string(), "--from", &daemon.target]);
    assert!(
        out.status.success(),
        "detach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("made no call while watched"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Bad requests are clear errors.
    let out = commtap_output(&["detach", "--pid", "4194305", "--from", &daemon.target]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not watched"));
    let out = commtap_output(&["attach", "--pid", "4194305", "--from", &daemon.target]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("4194305"));

    let events_out = scratch.path("events.jsonl");
    let events = ChildGuard::spawn(
        Command::new(commtap_bin())
            .args([
                "events",
                "--pid",
                &format!("{r0},{r1}"),
                "--duration",
                "8s",
                "--from",
            ])
            .arg(&daemon.target)
            .stdout(std::fs::File::create(&events_out).expect("events file")),
    );
    wait_until("the event stream to open", LIMIT, || {
        std::fs::read_to_string(&events_out).is_ok_and(|s| s.contains("streaming"))
    });
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let run = finish_ok(&scratch, events, LIMIT);
    let lines: Vec<Value> = std::fs::read_to_string(&events_out)
        .expect("events")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(
        lines.last().map(|l| &l["dropped"]),
        Some(&0.into()),
        "{}",
        run.stderr
    );
    let mut seen: BTreeMap<(u64, String), u64> = BTreeMap::new();
    for e in lines.iter().filter(|l| l.get("routine").is_some()) {
        let key = (
            e["pid"].as_u64().expect("pid"),
            e["routine"].as_str().expect("routine").to_string(),
        );
        *seen.entry(key).or_default() += 1;
    }
    let r0 = u64::from(r0);
    for routine in ["MPI_Allreduce", "MPI_Send", "MPI_Recv"] {
        assert_eq!(
            seen.get(&(r0, routine.to_string())),
            Some(&n),
            "{routine} events of rank 0"
        );
    }
    assert!(
        !seen.keys().any(|(pid, _)| *pid == u64::from(r1)),
        "no event of the detached rank: {seen:?}"
    );

    // The attached rank's profile is exact; the detached one is not taken up again.
    wait_for_exited(&daemon.target, &[r0]);
    let profile = report_json(&["report", "--from", &daemon.target]);
    let truths = read_truths(&scratch.path("truth"), 2);
    let t0 = truths
        .iter()
        .find(|t| t["pid"].as_u64() == Some(r0))
        .expect("truth of rank 0");
    // Events were on only while the stream was open: compare the counts, not the events.
    let ranks = profile["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 1, "only the attached rank: {profile:#}");
    let mut got = routine_table(&ranks[0]["routines"]);
    got.remove("MPI_Finalize");
    assert_eq!(got, routine_table(&t0["routines"]), "rank 0's counts");
    assert_eq!(ranks[0]["undecoded"], 0);
    daemon.stop(&scratch);
}

/// A rank detached after it made calls (its threads have call state in the kernel) stops
/// counting at its next call: its profile is what it did until the detach (kept as a final
/// one), the calls after it are not counted (nor is it taken up again by the daemon's
/// rescans), and the other rank's profile stays exact.
#[test]
fn a_rank_detached_after_its_first_calls_is_not_counted_again() {
    let scratch = Scratch::new("daemon-detach-late");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let n = 200u64;
    // MPI_Init, Comm_rank, Comm_size and a Barrier before `ready`: counted from the first.
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, n, &[]);
    let (r0, r1) = rank_pids(&ranks);
    wait_until("the daemon to track both ranks", LIMIT, || {
        let out = commtap_output(&["ps", "--from", &daemon.target]);
        let ps = String::from_utf8_lossy(&out.stdout).to_string();
        [r0, r1].iter().all(|p| ps.contains(&p.to_string()))
    });
    let out = commtap_output(&["detach", "--pid", &r1.to_string(), "--from", &daemon.target]);
    assert!(
        out.status.success(),
        "detach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The daemon's rescans adopt every process that maps an MPI library and is not watched,
    // but not a detached one: a witness that maps libmpi (and calls nothing) is adopted by
    // a rescan after the detach, and the detached rank is still detached then.
    let mut witness = Command::new("python3");
    witness.args([
        "-c",
        "import ctypes, sys; ctypes.CDLL('libmpi.so.40'); sys.stdin.read()",
    ]);
    let witness = ChildGuard::spawn(witness.stdin(std::process::Stdio::piped()));
    wait_for_state(&daemon.target, &[u64::from(witness.0.id())], "probed");
    assert_eq!(
        listed_as(&daemon.target, r1),
        ["detached"],
        "rank 1 taken up again"
    );
    drop(witness);
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    wait_for_exited(&daemon.target, &[u64::from(r0), u64::from(r1)]);
    let profile = report_json(&["report", "--from", &daemon.target]);
    let ranks = profile["ranks"].as_array().expect("ranks");
    let rank_of = |pid: u32| {
        ranks
            .iter()
            .find(|r| r["pid"].as_u64() == Some(u64::from(pid)))
            .unwrap_or_else(|| panic!("rank of pid {pid}: {profile:#}"))
    };
    let before_go: BTreeMap<String, (u64, u64)> =
        ["MPI_Init", "MPI_Comm_rank", "MPI_Comm_size", "MPI_Barrier"]
            .iter()
            .map(|r| (r.to_string(), (1, 0)))
            .collect();
    assert_eq!(
        routine_table(&rank_of(r1)["routines"]),
        before_go,
        "rank 1: its calls until the detach, none after"
    );
    let truths = read_truths(&scratch.path("truth"), 2);
    let t0 = truths
        .iter()
        .find(|t| t["pid"].as_u64() == Some(u64::from(r0)))
        .expect("truth of rank 0");
    // The truth holds the calls after `go`; the profile also those before it.
    let got = loop_counts_after_go(&rank_of(r0)["routines"]);
    assert_eq!(got, routine_table(&t0["routines"]), "rank 0's counts");
    daemon.stop(&scratch);
}

/// A rank detached and attached again has one profile, on the node and on the aggregator it
/// pushes to: what it did while watched before the detach and since the attach, exact (the
/// detach came before the loop, so the whole run is counted); `ps` lists it as detached
/// meanwhile, and the aggregator got its profile as a detached one.
#[test]
fn a_rank_detached_and_attached_again_keeps_one_profile() {
    let scratch = Scratch::new("daemon-reattach");
    let (_aggregator, url) = spawn_local_aggregator(&scratch, &scratch.path("agg.redb"));
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &[
            "--aggregator",
            &url,
            "--push-insecure",
            "--push-interval",
            "200ms",
        ],
    );
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 150, &[]);
    let (r0, r1) = rank_pids(&ranks);
    let (p0, p1) = (u64::from(r0), u64::from(r1));
    wait_for_state(&daemon.target, &[p0, p1], "probed");
    let r1_text = r1.to_string();
    let detach_asked = std::time::Instant::now();
    let out = commtap_output(&["detach", "--pid", &r1_text, "--from", &daemon.target]);
    let detached = std::time::Instant::now();
    assert!(
        out.status.success(),
        "detach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Its profile so far: one rank of a job its launcher said has two.
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("Data for MPI rank 1 of 2:")
            && said.contains("MPI_Init() to commtap's detach"),
        "{said}"
    );
    wait_for_state(&daemon.target, &[p1], "detached");
    // The job is named by its rank 0's pid (no batch system here).
    let job_id = r0.to_string();
    let agg_out = scratch.path("aggregated.json");
    wait_until("the aggregator to hold rank 1 as detached", LIMIT, || {
        try_job_report(&[], &url, &job_id, &agg_out).is_some_and(|p| {
            p["ranks"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["pid"].as_u64() == Some(p1) && r["detached"] == true)
        })
    });
    let attach_asked = std::time::Instant::now();
    let out = commtap_output(&["attach", "--pid", &r1_text, "--from", &daemon.target]);
    let attached = std::time::Instant::now();
    assert!(
        out.status.success(),
        "attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(listed_as(&daemon.target, r1), ["probed"]);
    // Attached once more (a script attaching every rank, say): nothing changes.
    let out = commtap_output(&["attach", "--pid", &r1_text, "--from", &daemon.target]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    wait_for_exited(&daemon.target, &[p0, p1]);
    let truths = read_truths(&scratch.path("truth"), 2);
    let node = report_json(&["report", "--from", &daemon.target]);
    assert_eq!(
        node["ranks"].as_array().map(Vec::len),
        Some(2),
        "one profile a rank: {node:#}"
    );
    assert_loop_ranks(&node, &truths);
    // The time it was not watched lies between the two requests' ends and their starts.
    let unwatched = rank_by_pid(&node, p1)["unwatched_ns"]
        .as_u64()
        .expect("rank 1's unwatched time");
    let (least, most) = (attach_asked - detached, attached - detach_asked);
    assert!(
        (least.as_nanos()..=most.as_nanos()).contains(&u128::from(unwatched)),
        "{unwatched} ns not within {least:?}..{most:?}"
    );
    assert!(rank_by_pid(&node, p0).get("unwatched_ns").is_none());
    let text = commtap_output(&["report", "--from", &daemon.target]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert_eq!(
        text.matches("sec in between (detached, then attached again)")
            .count(),
        1,
        "{text}"
    );
    assert!(
        node["ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|r| r.get("detached").is_none()),
        "{node:#}"
    );
    // A watch of the ended job prints its final report and ends (no --count: were it to go
    // on, the wait below would fail).
    let (watch_out, watch_err) = (scratch.path("watch.txt"), scratch.path("watch.err"));
    let mut watch = Command::new(commtap_bin());
    watch
        .args(["report", "--from", &daemon.target, "--job", &job_id])
        .args(["--watch", "200ms"])
        .stdout(std::fs::File::create(&watch_out).expect("watch output"))
        .stderr(std::fs::File::create(&watch_err).expect("watch errors"));
    let ended = ChildGuard::spawn(&mut watch).wait_with_limit(LIMIT);
    let said = std::fs::read_to_string(&watch_err).expect("watch errors");
    assert!(ended.success(), "{ended}: {said}");
    assert!(
        said.contains("every rank exited; that report is final"),
        "{said}"
    );
    let shown = std::fs::read_to_string(&watch_out).expect("watch output");
    assert_eq!(shown.matches("=== report ").count(), 1, "{shown}");
    let mut aggregated = None;
    wait_until("the aggregator to hold both final profiles", LIMIT, || {
        aggregated =
            try_job_report(&[], &url, &job_id, &agg_out).filter(|p| every_rank_final(p, 2));
        aggregated.is_some()
    });
    assert_loop_ranks(&aggregated.expect("aggregated"), &truths);
    daemon.stop(&scratch);
}

/// A daemon given a launcher's PID (`--pid` of `mpirun`, which maps no MPI library) profiles
/// the ranks below it, says so, and counts them exactly from its start.
#[test]
fn a_daemon_given_a_launchers_pid_profiles_its_ranks() {
    let scratch = Scratch::new("daemon-launcher-pid");
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 100, &[]);
    let launcher = job.0.id().to_string();
    let daemon = Daemon::start(&scratch, &[], &[], &["--pid", &launcher]);
    let pids: Vec<u64> = ranks.iter().map(|&p| u64::from(p)).collect();
    wait_for_state(&daemon.target, &pids, "probed");
    let log = std::fs::read_to_string(scratch.path("commtap.stderr")).expect("daemon log");
    assert!(
        log.contains("the processes below it that do are profiled"),
        "{log}"
    );
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    wait_for_exited(&daemon.target, &pids);
    let profile = report_json(&["report", "--from", &daemon.target]);
    // Attached while the ranks waited for `go`: what they did after it, as the truth says.
    assert_profile_matches(
        &profile,
        &read_truths(&scratch.path("truth"), 2),
        &["MPI_Finalize"],
    );
    daemon.stop(&scratch);
}

/// Every state `ps` lists `pid` in (a process taken up again while its detached profile is
/// kept would be listed twice).
fn listed_as(target: &str, pid: u32) -> Vec<String> {
    let out = commtap_output(&["ps", "--from", target, "--format", "json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).expect("ps JSON");
    listed["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"].as_u64() == Some(u64::from(pid)))
        .map(|p| p["state"].as_str().expect("state").to_string())
        .collect()
}

/// (rank 0's pid, rank 1's pid) of a 2-rank Open MPI job, from its environment.
fn rank_pids(ranks: &[u32]) -> (u32, u32) {
    let rank_of = |pid: u32| -> u32 {
        let env = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
        env.split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"OMPI_COMM_WORLD_RANK="))
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .expect("OMPI_COMM_WORLD_RANK")
    };
    let (a, b) = (ranks[0], ranks[1]);
    if rank_of(a) == 0 {
        (a, b)
    } else {
        (b, a)
    }
}
