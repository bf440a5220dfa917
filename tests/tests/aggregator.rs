//! Two daemons (two nodes) and one aggregator on one machine: the aggregator's report of a
//! job equals the ground truth and the sum of the two node reports; killing and restarting
//! the aggregator loses nothing and doubles nothing.

use std::{process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_secs(300);

fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("addr").to_string()
}

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
    profile["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| {
            let mut t = routine_table(&r["routines"]);
            t.remove("MPI_Finalize");
            (r["pid"].as_u64().expect("pid"), t)
        })
        .collect()
}

#[test]
fn aggregator_merges_nodes_exactly_and_survives_a_restart() {
    let scratch = Scratch::new("aggregator");
    let addr = free_port();
    let url = format!("http://{addr}");
    let db = scratch.path("agg.redb");
    let agg_scratch = Scratch::new("aggregator-server");
    let start_aggregator = || {
        spawn_commtap(
            &agg_scratch,
            &[
                "--log",
                "info",
                "aggregator",
                "--listen",
                &addr,
                "--insecure-tcp",
                "--db",
                db.to_str().expect("utf8"),
            ],
        )
    };
    let mut aggregator = start_aggregator();

    // A batch job of 4 ranks, waiting at its GO file.
    let job_id = format!("e2e{}", std::process::id());
    let prog = build_program("mpi_loop.c", Mpi::OpenMpi);
    let mut cmd = Command::new("mpirun.openmpi");
    mpi_env(&mut cmd)
        .args(["--oversubscribe", "-np", "4", "-x", "SLURM_JOB_ID"])
        .arg(&prog)
        .arg(scratch.path("ready"))
        .arg(scratch.path("go"))
        .arg("500")
        .arg(scratch.path("truth"))
        .env("SLURM_JOB_ID", &job_id);
    let mut job = ChildGuard::spawn(&mut cmd);
    wait_until("the job to be ready", Duration::from_secs(60), || {
        scratch.path("ready").exists()
    });
    let mut ranks = Vec::new();
    wait_until("4 ranks", Duration::from_secs(10), || {
        ranks = pids_running(&prog);
        ranks.len() == 4
    });

    // Two "nodes": each daemon watches half of the ranks and pushes to the aggregator.
    let mut daemons = Vec::new();
    let mut sockets = Vec::new();
    for (node, pids) in [("node-a", &ranks[..2]), ("node-b", &ranks[2..])] {
        let node_scratch = Scratch::new(node);
        let socket = node_scratch.path("commtap.sock");
        let pids = pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let d = spawn_commtap(
            &node_scratch,
            &[
                "daemon",
                "--socket",
                socket.to_str().expect("utf8"),
                "--node-name",
                node,
                "--pid",
                &pids,
                "--aggregator",
                &url,
                "--push-interval",
                "200ms",
            ],
        );
        wait_until("a daemon's socket", Duration::from_secs(60), || {
            socket.exists()
        });
        sockets.push(format!("unix://{}", socket.display()));
        daemons.push((node_scratch, d));
    }
    std::fs::write(scratch.path("go"), b"go").expect("go");
    assert!(job.wait_with_limit(LIMIT).success(), "the job failed");
    let truths = read_truths(&scratch.path("truth"), 4);

    // Final once every rank's MPI_Finalize has reached the aggregator.
    let report = |name: &str| {
        let out = scratch.path(name);
        let r = commtap(&[
            "report",
            "--from",
            &url,
            "--job",
            &job_id,
            "--format",
            "json",
            "-o",
            out.to_str().expect("utf8"),
        ]);
        r.status.success().then(|| read_json(&out))
    };
    let finalized = |p: &serde_json::Value| {
        p["ranks"].as_array().is_some_and(|r| {
            r.len() == 4
                && r.iter()
                    .all(|x| x["routines"]["MPI_Finalize"]["calls"] == 1)
        })
    };
    wait_until(
        "the aggregator to have every rank's final profile",
        Duration::from_secs(60),
        || report("merged.json").is_some_and(|p| finalized(&p)),
    );
    let merged = report("merged.json").expect("report");
    assert_eq!(merged["job"].as_str(), Some(job_id.as_str()));
    assert_profile_matches(&merged, &truths, &["MPI_Finalize"]);
    let nodes: Vec<&str> = merged["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .filter_map(|r| r["host"].as_str())
        .collect();
    assert!(nodes.iter().all(|h| !h.is_empty()));

    // The merged report is the sum of the two node reports.
    let mut sum = std::collections::BTreeMap::new();
    for socket in &sockets {
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

    // SIGKILL the aggregator and restart it on the same database: nothing lost; the
    // daemons reconnect and resend their cumulative snapshots: nothing doubled.
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGKILL) };
    let _ = aggregator.wait_with_limit(Duration::from_secs(10));
    drop(aggregator);
    let stale_lines = |s: &str| s.lines().filter(|l| l.contains("first batch")).count();
    aggregator = start_aggregator();
    wait_until(
        "both daemons to push again",
        Duration::from_secs(60),
        || {
            stale_lines(
                &std::fs::read_to_string(agg_scratch.path("commtap.stderr")).unwrap_or_default(),
            ) >= 2
        },
    );
    let after = report("after.json").expect("report after restart");
    assert_eq!(
        tables(&after),
        tables(&merged),
        "the restart lost or doubled something"
    );
    assert_profile_matches(&after, &truths, &["MPI_Finalize"]);

    for (node_scratch, d) in daemons {
        // SAFETY: kill(2) of a daemon we spawned.
        unsafe { libc::kill(d.0.id() as i32, libc::SIGTERM) };
        let run = finish_commtap(&node_scratch, d, Duration::from_secs(60));
        assert!(run.status.success(), "daemon: {}", run.stderr);
    }
    // SAFETY: as above.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    let run = finish_commtap(&agg_scratch, aggregator, Duration::from_secs(60));
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
