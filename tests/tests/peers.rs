//! Per-peer point-to-point traffic: a program whose communication matrix is known
//! (`mpi_peers.c`) under `commtap record`, Open MPI and MPICH: every rank's traffic with
//! every peer, sent and received, calls and bytes, equals what the program did (traffic on
//! a duplicate and on two splits of the world placed on world ranks too), the HTML
//! report's heat map has a cell for each pair that exchanged bytes, and what each rank
//! received is what it receives in the same job run alone; and grids made and freed in a
//! loop past the user's share of the kernel's map keep their traffic, a daemon restarted
//! midway.

use std::time::Duration;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(5);

fn matrix(mpi: Mpi, np: u32) {
    let scratch = Scratch::new(&format!("peers-{}", mpi.suffix()));
    let prog = build_program("mpi_peers.c", mpi);
    let prefix = scratch.path("truth");
    let json = scratch.path("profile.json");
    let text = scratch.path("report.txt");
    let html = scratch.path("report.html");
    let mut args = record_text_and_json(&text, &json);
    args.extend(["--html".into(), html.display().to_string(), "--".into()]);
    args.extend(mpi.launcher(np));
    args.push(prog.display().to_string());
    args.push(prefix.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    // What each rank received, printed under commtap and alone.
    let mut alone = mpi.launcher(np);
    alone.extend([prog.clone(), scratch.path("alone")].map(|p| p.display().to_string()));
    assert_output_as_alone(&scratch, &run.stdout, &alone, "mpi_peers: ", np as usize);

    let profile = read_json(&json);
    for truth in read_truths(&prefix, np) {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        assert_eq!(
            rank["peers"], truth["peers"],
            "rank {}: per-peer traffic",
            truth["rank"]
        );
        assert_eq!(rank["peers_full"], 0);
    }
    // The HTML report's heat map: a cell per pair of ranks the truths say exchanged bytes
    // (the profile's peers equal the truths' above).
    let page = browse(&scratch, &html, &format!("peers-{}", mpi.suffix()));
    assert_html_report_matches(&page, &profile);
    let report = std::fs::read_to_string(&text).expect("text report");
    assert!(
        report.contains("Point-to-point bytes sent, by rank (row) to world rank (column):"),
        "{report}"
    );
}

#[test]
fn open_mpi_traffic_per_peer_is_exact() {
    matrix(Mpi::OpenMpi, 4);
}

#[test]
fn mpich_traffic_per_peer_is_exact() {
    // An odd size: some ranks have no partner at some distances.
    matrix(Mpi::Mpich, 3);
}

/// Two simulated nodes (a daemon each, one aggregator): traffic on the splits whose other
/// end is on the other node cannot be placed by either daemon, and is by the aggregator,
/// which merges their ranks: every rank's traffic per world rank equals the program's.
#[test]
fn the_aggregator_places_traffic_on_sub_communicators_across_nodes() {
    let scratch = Scratch::new("peers-nodes");
    let agg_scratch = Scratch::new("peers-nodes-aggregator");
    let (mut aggregator, url) = spawn_local_aggregator(&agg_scratch, &scratch.path("agg.redb"));
    let job_id = format!("peers{}", std::process::id());
    let prog = build_program("mpi_peers.c", Mpi::OpenMpi);
    let args = [
        scratch.path("truth").into_os_string(),
        scratch.path("ready").into_os_string(),
        scratch.path("go").into_os_string(),
    ];
    let env = [("SLURM_JOB_ID", job_id.as_str())];
    let (mut job, ranks) = start_waiting_program(&scratch, Mpi::OpenMpi, 4, &prog, &args, &env);
    let daemons = start_two_nodes([&ranks[..2], &ranks[2..]], &url, "0");
    std::fs::write(scratch.path("go"), b"go").expect("go");
    assert!(job.wait_with_limit(LIMIT).success(), "the job failed");
    let truths = read_truths(&scratch.path("truth"), 4);

    let report = || try_job_report(&[], &url, &job_id, &scratch.path("merged.json"));
    wait_until(
        "every rank's final profile at the aggregator",
        LIMIT,
        || report().is_some_and(|p| every_rank_final(&p, 4)),
    );
    let merged = report().expect("report");
    for (i, truth) in truths.iter().enumerate() {
        let rank = rank_by_pid(&merged, truth["pid"].as_u64().expect("pid"));
        assert_eq!(
            rank["peers"], truth["peers"],
            "rank {}: per-peer traffic",
            truth["rank"]
        );
        // Each rank on the node that watched it, by the name the node was given.
        let pid = u32::try_from(truth["pid"].as_u64().expect("pid")).expect("a pid");
        let node = if ranks[..2].contains(&pid) {
            "node-a"
        } else {
            "node-b"
        };
        assert_eq!(rank["host"], node, "truth {i}");
    }
    // A ring of four split two and two crosses between the nodes: some of each node's
    // traffic on the splits waited for the aggregator.
    let mut waiting = 0;
    for (node_scratch, d) in &daemons {
        let own = report_json(&["report", "--from", &d.target, "--job", &job_id]);
        waiting += own["ranks"]
            .as_array()
            .expect("ranks")
            .iter()
            .flat_map(|r| r["peers"].as_array().cloned().unwrap_or_default())
            .filter(|p| p["comm"].is_string())
            .count();
        assert_eq!(
            own["ranks"].as_array().map(Vec::len),
            Some(2),
            "{}",
            node_scratch.0.display()
        );
    }
    assert!(waiting > 0, "no traffic crossed the nodes on a split");
    for (node_scratch, d) in daemons {
        d.stop(&node_scratch);
    }
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    let _ = aggregator.wait_with_limit(LIMIT);
}

/// A stencil code making and freeing a grid per step, under a daemon whose user share of
/// the kernel's per-peer map (1%: 655 counters) holds under half of the grids' counters:
/// the daemon moves each freed grid's counters out of the kernel's map, so that the next
/// ones find room; one daemon is killed and another started midway, which carries on with
/// what the first moved. Every rank's traffic per world rank equals the program's, none is
/// left out (`peers_full`), and each rank's freed grids' counters were moved.
fn grids_made_and_freed(mpi: Mpi) {
    const PHASES: u64 = 4;
    const GRIDS: u64 = 100;
    let scratch = Scratch::new(&format!("peers-churn-{}", mpi.suffix()));
    let share = ["--user-share", "1"];
    let mut daemon = Daemon::start(&scratch, &[], &[], &share);
    let prog = build_program("mpi_peers.c", mpi);
    let go = scratch.path("go");
    let args = [
        scratch.path("truth").into_os_string(),
        scratch.path("ready").into_os_string(),
        go.clone().into_os_string(),
        PHASES.to_string().into(),
        GRIDS.to_string().into(),
    ];
    let (mut job, ranks) = start_waiting_program(&scratch, mpi, 2, &prog, &args, &[]);
    let pids: Vec<u64> = ranks.iter().map(|p| u64::from(*p)).collect();
    wait_for_state(&daemon.target, &pids, "probed");
    std::fs::write(&go, b"").expect("go");
    // Each grid is two counters per rank (to the right and from the left: the other rank).
    let folded_at_least = |target: &str, n: u64| {
        let profile = report_json(&["report", "--from", target]);
        pids.iter().all(|pid| {
            rank_by_pid(&profile, *pid)["peers_folded"]
                .as_u64()
                .is_some_and(|f| f >= n)
        })
    };
    for phase in 0..PHASES {
        let moved = 2 * GRIDS * (phase + 1);
        wait_until("the freed grids' counters moved", LIMIT, || {
            folded_at_least(&daemon.target, moved)
        });
        if phase == 1 {
            // SAFETY: kill(2) of the daemon we spawned.
            unsafe { libc::kill(daemon.child.0.id() as i32, libc::SIGKILL) };
            assert!(!daemon.child.wait_with_limit(LIMIT).success(), "killed");
            std::fs::remove_file(&daemon.socket).expect("stale socket");
            daemon = Daemon::start(&scratch, &[], &[], &share);
            wait_for_state(&daemon.target, &pids, "probed");
            assert!(
                folded_at_least(&daemon.target, moved),
                "the moved counters are kept across the restart"
            );
        }
        std::fs::write(format!("{}.{phase}", go.display()), b"").expect("phase go");
    }
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    wait_for_exited(&daemon.target, &pids);
    let profile = report_json(&["report", "--from", &daemon.target]);
    for truth in read_truths(&scratch.path("truth"), 2) {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        assert_eq!(
            rank["peers"], truth["peers"],
            "rank {}: per-peer traffic",
            truth["rank"]
        );
        assert_eq!(rank["peers_full"], 0, "{rank:#}");
        assert_eq!(rank["handles_refused"], 0, "{rank:#}");
    }
    daemon.stop(&scratch);
}

#[test]
fn grids_made_and_freed_past_the_users_share_keep_every_ranks_traffic() {
    grids_made_and_freed(Mpi::Mpich);
}

#[test]
fn open_mpi_grids_made_and_freed_past_the_users_share_keep_every_ranks_traffic() {
    grids_made_and_freed(Mpi::OpenMpi);
}
