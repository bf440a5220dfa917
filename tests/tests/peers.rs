//! Per-peer point-to-point traffic: a program whose communication matrix is known
//! (`mpi_peers.c`) under `commtap record`, Open MPI and MPICH: every rank's traffic with
//! every peer, sent and received, calls and bytes, equals what the program did (traffic on
//! a duplicate and on two splits of the world placed on world ranks too), the HTML
//! report's heat map has a cell for each pair that exchanged bytes, and what each rank
//! received is what it receives in the same job run alone; and grids made and freed in a
//! loop past the user's share of the kernel's map keep their traffic, a daemon restarted
//! midway; and two nodes' daemons name communicators alike, a restarted one none as
//! another.

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

/// Two simulated nodes (a daemon each, watching its ranks from before `MPI_Init`, one
/// aggregator): traffic on the splits whose other end is on the other node cannot be
/// placed by either daemon, and is by the aggregator, which merges their ranks: every
/// rank's traffic per world rank equals the program's.
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
    let (mut job, ranks) =
        start_program_held_before_init(&scratch, Mpi::OpenMpi, 4, &prog, &args, &env);
    let daemons = start_two_nodes([&ranks[..2], &ranks[2..]], &url, "0");
    std::fs::write(scratch.path("start"), b"").expect("start");
    wait_until("the job to be ready", LIMIT, || {
        scratch.path("ready").exists()
    });
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

/// `mpi_peers.c`'s arguments for `phases` phases of `grids` grids, its files in `scratch`
/// (`truth`, `ready`, `go`).
fn grid_phases_args(scratch: &Scratch, phases: u64, grids: u64) -> [std::ffi::OsString; 5] {
    [
        scratch.path("truth").into_os_string(),
        scratch.path("ready").into_os_string(),
        scratch.path("go").into_os_string(),
        phases.to_string().into(),
        grids.to_string().into(),
    ]
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
    let args = grid_phases_args(&scratch, PHASES, GRIDS);
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

/// Two "nodes" (a daemon per rank, each watching its rank from before `MPI_Init`) name
/// every communicator the program makes alike, from the kernel's count of those made
/// before it from the same parent; after one daemon is killed and another started, the
/// communicators made since are named by the node that kept watching, and by the
/// restarted one (which did not see the calls made while no daemon ran) with names of
/// its own, never another communicator's; so when the other node is restarted a phase
/// later, each names the grids made since with its own. Counted from its own start as
/// names once were, the restarted node would name its second grid as the program's
/// reversed split (`mpi_peers.c`), whose members are in the other order, and the
/// aggregator would match its collectives and place its traffic with that one's; and
/// two nodes counting from different points would name different grids alike.
/// `commtap events` from each daemon: each communicator's point-to-point calls are told
/// apart by their tag (a grid's by its phase too).
fn names_across_nodes_and_a_restart(mpi: Mpi) {
    use std::collections::{BTreeMap, BTreeSet};
    let scratch = Scratch::new(&format!("peers-names-{}", mpi.suffix()));
    let prog = build_program("mpi_peers.c", mpi);
    let go = scratch.path("go");
    let args = grid_phases_args(&scratch, 3, 3);
    let (mut job, pids) = start_program_held_before_init(&scratch, mpi, 2, &prog, &args, &[]);
    let node_scratch = [Scratch::new("peers-names-a"), Scratch::new("peers-names-b")];
    let start_daemon = |n: usize| {
        let pid = pids[n].to_string();
        let d = Daemon::start(&node_scratch[n], &[], &[], &["--pid", &pid]);
        wait_for_state(&d.target, &[u64::from(pids[n])], "probed");
        d
    };
    let mut daemons = [start_daemon(0), start_daemon(1)];
    std::fs::write(scratch.path("start"), b"").expect("start");
    wait_until("the job to be ready", LIMIT, || {
        scratch.path("ready").exists()
    });

    // Every call of rank `n` from its daemon into `out`, from the time this returns; the
    // stream ends with the daemon (dropped: ended).
    let stream = |n: usize, target: &str, out: &std::path::Path| {
        let events = ChildGuard::spawn(
            std::process::Command::new(commtap_bin())
                .args(["events", "--pid", &pids[n].to_string(), "--from", target])
                .stdout(std::fs::File::create(out).expect("events file")),
        );
        wait_until("the event stream to open", LIMIT, || {
            std::fs::read_to_string(out).is_ok_and(|s| s.contains("streaming"))
        });
        events
    };
    let sendrecvs = |out: &std::path::Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["routine"] == "MPI_Sendrecv" && e["comm"] != "world")
            .collect()
    };
    // A phase's grids' rings are tagged 100 + the grid's number: the last grid's call of
    // the phase in a stream says every earlier call of the phase has come.
    let phases_seen =
        |out: &std::path::Path| sendrecvs(out).iter().filter(|e| e["tag"] == 102).count();
    // Node A is restarted after the first phase, node B after the second: each counts
    // the grids it sees made since from another point.
    let restart = |daemons: &mut [Daemon; 2], n: usize| {
        // SAFETY: kill(2) of the daemon we spawned.
        unsafe { libc::kill(daemons[n].child.0.id() as i32, libc::SIGKILL) };
        assert!(!daemons[n].child.wait_with_limit(LIMIT).success(), "killed");
        std::fs::remove_file(&daemons[n].socket).expect("stale socket");
        daemons[n] = start_daemon(n);
    };
    // Each node's streams: from its first daemon, then from the one after its restart.
    let out = |name: &str| scratch.path(&format!("{name}.jsonl"));
    let outs = [[out("a0"), out("a1")], [out("b0"), out("b1")]];
    let mut streams = [0, 1].map(|n| stream(n, &daemons[n].target, &outs[n][0]));
    std::fs::write(&go, b"").expect("go");
    for phase in 0..3 {
        wait_until("the phase's calls streamed", LIMIT, || {
            outs.iter()
                .all(|o| o.iter().map(|f| phases_seen(f)).sum::<usize>() == phase + 1)
        });
        if phase < 2 {
            // Its stream ends with the daemon.
            restart(&mut daemons, phase);
            streams[phase] = stream(phase, &daemons[phase].target, &outs[phase][1]);
        }
        std::fs::write(format!("{}.{phase}", go.display()), b"").expect("phase go");
    }
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    // The streams have every phase; they end here.
    drop(streams);

    // Each communicator (its ring's tag; a grid's phase; the parity split, tag 9, is one
    // per rank) and the name each rank gave it.
    let mut names: BTreeMap<(i64, usize, Option<usize>), BTreeMap<usize, String>> = BTreeMap::new();
    for (rank, out, first_phase) in [(0, 0, 0), (0, 1, 1), (1, 0, 0), (1, 1, 2)]
        .map(|(rank, file, first)| (rank, &outs[rank][file], first))
    {
        let mut phase_of_tag: BTreeMap<i64, usize> = BTreeMap::new();
        for e in sendrecvs(out) {
            let tag = e["tag"].as_i64().expect("a Sendrecv's tag");
            let phase = phase_of_tag.entry(tag).or_insert(first_phase);
            let comm = (tag, *phase, (tag == 9).then_some(rank));
            *phase += 1;
            let name = e["comm"].as_str().expect("comm").to_string();
            let earlier = names.entry(comm).or_default().insert(rank, name);
            assert!(earlier.is_none(), "one call per communicator and rank: {e}");
        }
    }
    let made_before: Vec<(i64, usize, Option<usize>)> = [6, 8, 13, 20, 21, 22, 100, 101, 102]
        .map(|t| (t, 0, None))
        .into_iter()
        .chain([(9, 0, Some(0)), (9, 0, Some(1))])
        .collect();
    let made_after: Vec<(i64, usize, Option<usize>)> = [1, 2]
        .into_iter()
        .flat_map(|phase| [100, 101, 102].map(|t| (t, phase, None)))
        .collect();
    assert_eq!(
        names.keys().copied().collect::<BTreeSet<_>>(),
        made_before.iter().chain(&made_after).copied().collect(),
        "communicators seen: {names:?}"
    );
    let named = |n: &String| !n.contains(':');
    for comm in &made_before {
        let by_rank = &names[comm];
        let ranks: Vec<usize> = comm.2.map_or(vec![0, 1], |r| vec![r]);
        assert_eq!(
            by_rank.keys().copied().collect::<Vec<_>>(),
            ranks,
            "{comm:?}"
        );
        let given: BTreeSet<&String> = by_rank.values().collect();
        assert!(
            given.len() == 1 && given.iter().all(|n| named(n)),
            "{comm:?}: one name on both nodes: {names:?}"
        );
    }
    // Made after a restart: named on both nodes, and not alike (the second phase's on B,
    // which kept watching, counted from MPI_Init; on A since its restart; the third
    // phase's on each since its own restart).
    for comm in &made_after {
        assert!(
            names[comm].values().all(named),
            "{comm:?}: named: {names:?}"
        );
        assert_ne!(
            names[comm][&0], names[comm][&1],
            "{comm:?}: a restarted node did not see the earlier ones made, and names it as \
             it counts since its start, apart from every name another daemon gives"
        );
    }
    let mut owner: BTreeMap<&String, (i64, usize, Option<usize>)> = BTreeMap::new();
    for (comm, by_rank) in &names {
        for n in by_rank.values().filter(|n| named(n)) {
            let first = *owner.entry(n).or_insert(*comm);
            assert_eq!(first, *comm, "two communicators named {n}: {names:?}");
        }
    }
    for (n, d) in node_scratch.iter().zip(daemons) {
        d.stop(n);
    }
}

#[test]
fn nodes_name_communicators_alike_and_a_restarted_one_none_as_another() {
    names_across_nodes_and_a_restart(Mpi::Mpich);
}

#[test]
fn open_mpi_nodes_name_communicators_alike_and_a_restarted_one_none_as_another() {
    names_across_nodes_and_a_restart(Mpi::OpenMpi);
}
