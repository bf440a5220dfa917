//! `commtap daemon` + `commtap report`/`ps`: a node daemon started before any job counts
//! every MPI process on the node from its first call, keeps the profiles of processes
//! that exited, and serves them per job over its Unix socket, exactly.

use std::{collections::BTreeMap, os::unix::fs::PermissionsExt, process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(5);

#[test]
fn daemon_profiles_every_job_on_the_node_exactly() {
    let scratch = Scratch::new("daemon");
    // A port of our own on loopback for the Prometheus endpoint.
    let metrics_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("addr").to_string()
    };
    let daemon = Daemon::start(
        &scratch,
        &[],
        &["--log", "info"],
        &["--metrics-addr", &metrics_addr, "--metrics-insecure"],
    );
    let (socket, target) = (daemon.socket.clone(), daemon.target.clone());
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660, "the socket is owner and group only by default");

    // Two jobs, two MPI implementations, started after the daemon and unknown to it.
    let jobs = [(Mpi::OpenMpi, 4u32), (Mpi::Mpich, 2u32)];
    let mut truths = Vec::new();
    for (mpi, np) in jobs {
        let prefix = scratch.path(&format!("truth-{}", mpi.suffix()));
        truths.push(run_truth_job(&prefix, mpi, np));
    }

    // Wait until the daemon has seen every rank exit.
    let all: Vec<u64> = truths.iter().flat_map(|t| pids_of(t)).collect();
    wait_for_exited(&target, &all);
    let mut profiles = Vec::new();
    for ((mpi, _), truth) in jobs.into_iter().zip(&truths) {
        let job = truth[0]["pid"].as_u64().expect("pid").to_string();
        let profile = report_json(&["report", "--from", &target, "--job", &job]);
        assert_eq!(profile["job"].as_str(), Some(job.as_str()));
        assert_profile_matches(&profile, truth, &["MPI_Finalize"]);
        assert_transports_match(&profile, truth, mpi);
        profiles.push(profile);
    }

    // `ps`: each rank's probes' estimated cost, an entry per call and a return per timed
    // call at the cost the profile says a call had on the node (the kernel's trap and the
    // programs' run, as measured while the job ran), by the counts the profile holds, and
    // its costliest routines.
    let ps = commtap_output(&["ps", "--from", &target, "--format", "json"]);
    let ps: serde_json::Value = serde_json::from_slice(&ps.stdout).expect("ps JSON");
    for rank in profiles
        .iter()
        .flat_map(|p| p["ranks"].as_array().expect("ranks"))
    {
        let cost = &rank["probe_call_cost"];
        let at = |what: &str| {
            cost[what]
                .as_u64()
                .unwrap_or_else(|| panic!("no {what} in the profile's probe_call_cost: {cost}"))
        };
        let (entry_ns, return_ns) = (at("entry_ns"), at("return_ns"));
        let mut by: Vec<(&str, u64)> = rank["routines"]
            .as_object()
            .expect("routines")
            .iter()
            .map(|(name, r)| {
                let calls = r["calls"].as_u64().expect("calls");
                let timed = r["sampled_time"]["timed_calls"].as_u64().unwrap_or(calls);
                (name.as_str(), calls * entry_ns + timed * return_ns)
            })
            .collect();
        by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let listed = ps["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == rank["pid"])
            .unwrap_or_else(|| panic!("pid {} not in {ps}", rank["pid"]));
        let cost = &listed["probe_cost"];
        assert_eq!(
            cost["estimated_ns"].as_u64(),
            Some(by.iter().map(|(_, ns)| ns).sum::<u64>()),
            "{listed}"
        );
        assert_eq!(cost["elapsed_ns"], rank["elapsed_ns"], "{listed}");
        let top: Vec<(&str, u64)> = cost["routines"]
            .as_array()
            .expect("routines")
            .iter()
            .map(|r| {
                (
                    r["routine"].as_str().expect("routine"),
                    r["estimated_ns"].as_u64().expect("ns"),
                )
            })
            .collect();
        let want: Vec<(&str, u64)> = by.iter().take(3).copied().collect();
        assert_eq!(top, want, "{listed}");
    }
    let text = commtap_output(&["ps", "--from", &target]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("PROBES (EST. COST, TOP)"), "{text}");

    // A client nobody here wrote: Python stubs generated from the proto, standard health
    // and reflection clients, malformed and oversized requests.
    let job0 = truths[0][0]["pid"].as_u64().expect("pid").to_string();
    let seen_file = scratch.path("python-client.json");
    let py = Command::new("python3")
        .arg(repo_root().join("tests/clients/node_client.py"))
        .arg(repo_root().join("proto"))
        .arg(&socket)
        .arg(&seen_file)
        .env("COMMTAP_JOB", &job0)
        .output()
        .expect("running python3");
    assert!(
        py.status.success(),
        "python client failed:\n{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let seen = read_json(&seen_file);
    assert_eq!(seen["health"], "SERVING");
    let services: Vec<&str> = seen["services"]
        .as_array()
        .expect("services")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for want in [
        "commtap.v1.Node",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(services.contains(&want), "{want} not in {services:?}");
    }
    assert_eq!(seen["watch_10ms"], "INVALID_ARGUMENT");
    assert_eq!(seen["huge_request"], "RESOURCE_EXHAUSTED");
    assert_eq!(seen["watched"], 2);
    for truth in &truths[0] {
        let pid = truth["pid"].as_u64().expect("pid");
        let rank = seen["ranks"]
            .as_array()
            .expect("ranks")
            .iter()
            .find(|r| r["pid"].as_u64() == Some(pid))
            .expect("rank in snapshot");
        let mut got = routine_table(&rank["routines"]);
        got.remove("MPI_Finalize");
        assert_eq!(
            got,
            routine_table(&truth["routines"]),
            "python client, pid {pid}"
        );
    }

    // Prometheus: the same counts, in a format promtool accepts.
    let metrics = http_get(&metrics_addr, "/metrics");
    let file = scratch.path("metrics.prom");
    std::fs::write(&file, &metrics).expect("metrics file");
    let check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).expect("metrics file"))
        .output()
        .expect("running promtool (Debian package prometheus)");
    assert!(
        check.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let truth0 = &truths[0][0];
    let job0 = truth0["pid"].as_u64().expect("pid");
    let calls = truth0["routines"]["MPI_Allreduce"]["calls"]
        .as_u64()
        .expect("calls");
    let line = format!(
        "commtap_mpi_calls_total{{job_id=\"{job0}\",rank=\"0\",routine=\"MPI_Allreduce\"}} {calls}"
    );
    assert!(
        metrics.lines().any(|l| l == line),
        "no line {line:?} in\n{metrics}"
    );
    // What the rank used of its node, as the kernel summed it at its end.
    let rss: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "commtap_rank_max_resident_bytes{{job_id=\"{job0}\",rank=\"0\"}} "
            ))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no largest resident set of rank 0 in\n{metrics}"));
    assert!(rss > 1 << 20, "{rss} bytes");
    // At least this test's six ranks (a daemon watching the node also sees the
    // processes of tests running beside this one).
    let exited: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("commtap_processes{state=\"exited\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no exited-processes gauge in\n{metrics}"));
    assert!(exited >= all.len() as u64, "{exited} exited; {metrics}");

    // SIGTERM: a clean shutdown that removes the socket.
    daemon.stop(&scratch);
}

#[test]
fn report_without_a_daemon_says_so() {
    let out = commtap_output(&["report", "--from", "unix:///nonexistent/commtap.sock"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is `commtap daemon` running?"), "{err}");
    let out = commtap_output(&["report", "--from", "ftp://nowhere"]);
    assert_eq!(out.status.code(), Some(2), "a bad target is a usage error");
}

#[test]
fn a_user_sees_only_their_own_processes() {
    users_see_only_their_own_processes("daemon-uid", &[]);
}

/// The same when nothing of the ranks is read from `/proc` (what happens to a rank that
/// exits before the daemon gets to it): owner, rank and job come from what the kernel
/// captured when the rank made its first MPI call.
#[test]
fn a_user_sees_their_own_processes_known_from_the_kernel_alone() {
    users_see_only_their_own_processes("daemon-uid-kernel", &["--identity-from-kernel"]);
}

/// Root and nobody each run a 2-rank MPICH job under a node-wide daemon whose socket
/// anyone may use; nobody's report holds exactly its ranks, root's every rank.
fn users_see_only_their_own_processes(name: &str, daemon_args: &[&str]) {
    use std::os::unix::fs::PermissionsExt as _;
    let scratch = Scratch::new(name);
    // A socket anyone may connect to: what a caller sees is then decided by its uid.
    let args = [&["--socket-mode", "666"], daemon_args].concat();
    let daemon = Daemon::start(&scratch, &[], &[], &args);
    let target = daemon.target.clone();

    let prog = build_program("mpi_truth.c", Mpi::Mpich);
    let shared = scratch.path("shared");
    std::fs::create_dir_all(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let as_nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    for (who, prefix) in [("root", "truth-root"), ("nobody", "truth-nobody")] {
        let launcher = Mpi::Mpich.launcher(2);
        let mut cmd = Command::new("setpriv");
        if who == "nobody" {
            cmd.args(as_nobody);
        }
        cmd.arg("--")
            .args(&launcher)
            .arg(&prog)
            .arg(shared.join(prefix))
            .current_dir(&shared)
            .env("HOME", &shared);
        let mut job = ChildGuard::spawn(&mut cmd);
        assert!(job.wait_with_limit(LIMIT).success(), "job as {who} failed");
    }
    let all: Vec<u64> = ["truth-root", "truth-nobody"]
        .iter()
        .flat_map(|p| pids_of(&read_truths(&shared.join(p), 2)))
        .collect();
    wait_for_exited(&target, &all);

    let report_as = |nobody: bool, out: &std::path::Path| {
        let mut cmd = Command::new("setpriv");
        if nobody {
            cmd.args(as_nobody);
        }
        let status = cmd
            .arg("--")
            .arg(commtap_bin())
            .args(["report", "--from", &target, "--format", "json", "-o"])
            .arg(out)
            .status()
            .expect("running commtap report");
        assert!(status.success(), "report (nobody: {nobody}) failed");
        read_json(out)
    };
    let mine = report_as(true, &shared.join("nobody.json"));
    assert_profile_matches(
        &mine,
        &read_truths(&shared.join("truth-nobody"), 2),
        &["MPI_Finalize"],
    );
    let everyone = report_as(false, &shared.join("root.json"));
    let seen: Vec<u64> = everyone["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .filter_map(|r| r["pid"].as_u64())
        .collect();
    assert!(
        all.iter().all(|p| seen.contains(p)),
        "root sees every process (and those of tests beside this one):\n{everyone:#}"
    );

    // SIGTERM: a clean shutdown that removes the socket.
    daemon.stop(&scratch);
}

#[test]
fn a_daemon_scoped_to_a_cgroup_profiles_only_that_job() {
    let scratch = Scratch::new("daemon-cgroup");
    let cg = CgroupGuard::new("commtap-test");
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &["--cgroup", cg.0.to_str().expect("utf8")],
    );
    let target = daemon.target.clone();

    let prog = build_program("mpi_truth.c", Mpi::Mpich);
    for (inside, prefix) in [(true, "inside"), (false, "outside")] {
        let launcher = Mpi::Mpich.launcher(2).join(" ");
        let run = format!(
            "{launcher} {} {}",
            prog.display(),
            scratch.path(prefix).display()
        );
        // The job inside joins the cgroup before it starts (as slurmstepd puts a step there).
        let script = if inside {
            cg.exec_inside(&run)
        } else {
            format!("exec {run}")
        };
        let mut job = ChildGuard::spawn(Command::new("sh").arg("-c").arg(&script));
        assert!(job.wait_with_limit(LIMIT).success(), "job {prefix} failed");
    }
    wait_for_exited(&target, &pids_of(&read_truths(&scratch.path("inside"), 2)));
    // Exactly the job inside; nothing of the one outside.
    assert_profile_matches(
        &report_json(&["report", "--from", &target]),
        &read_truths(&scratch.path("inside"), 2),
        &["MPI_Finalize"],
    );

    // SIGTERM: a clean shutdown that removes the socket.
    daemon.stop(&scratch);
}

/// `daemon --listen`: TCP needs TLS (or an explicit --insecure-tcp); over mutual TLS (a
/// client certificate signed by --tls-client-ca) the same report as on the socket,
/// exactly; a plaintext client and a TLS client without a certificate are refused.
#[test]
fn the_daemon_serves_tcp_only_with_tls() {
    let scratch = Scratch::new("daemon-tcp");
    let addr = free_port();
    let refused = commtap_output(&[
        "daemon",
        "--socket",
        path_str(&scratch.path("refused.sock")),
        "--listen",
        &addr,
    ]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--insecure-tcp"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let (ca, cert, key) = make_certs(&scratch.0);
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &[
            "--listen",
            &addr,
            "--tls-cert",
            path_str(&cert),
            "--tls-key",
            path_str(&key),
            "--tls-client-ca",
            path_str(&ca),
        ],
    );
    let (client_cert, client_key) = make_client_cert(&scratch.0, "operator", None);
    let prog = build_program("mpi_truth.c", Mpi::OpenMpi);
    let mut cmd = Command::new("mpirun.openmpi");
    mpi_env(&mut cmd)
        .args(["--oversubscribe", "-np", "2"])
        .arg(&prog)
        .arg(scratch.path("truth"));
    assert!(
        ChildGuard::spawn(&mut cmd).wait_with_limit(LIMIT).success(),
        "the job failed"
    );
    let truths = read_truths(&scratch.path("truth"), 2);
    wait_for_exited(&daemon.target, &pids_of(&truths));

    let url = format!("https://{addr}");
    let profile = report_json(&[
        "--tls-ca",
        path_str(&ca),
        "--tls-cert",
        path_str(&client_cert),
        "--tls-key",
        path_str(&client_key),
        "report",
        "--from",
        &url,
    ]);
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    let anonymous = commtap_output(&["--tls-ca", path_str(&ca), "report", "--from", &url]);
    assert!(
        !anonymous.status.success(),
        "a TLS client without a certificate must be refused"
    );

    let plain = commtap_output(&["report", "--from", &format!("http://{addr}")]);
    assert!(
        !plain.status.success(),
        "plaintext to a TLS listener must fail"
    );
    daemon.stop(&scratch);
}

/// A daemon killed with SIGKILL and started again carries on with the counts of the one
/// before (its counting maps are pinned in bpffs): what rank 0 and 1 did before the kill
/// is still in the profile, and what they do after is added exactly, their call sites
/// too. A clean stop with nothing left running removes the pinned state.
#[test]
fn a_killed_daemon_restarts_with_its_counts() {
    let scratch = Scratch::new("daemon-restart");
    let first = Daemon::start(&scratch, &[], &[], &["--call-sites"]);
    let n = 200u64;
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, n, &[]);
    let ranks: Vec<u64> = ranks.into_iter().map(u64::from).collect();
    wait_for_state(&first.target, &ranks, "probed");
    // SAFETY: kill(2) of the daemon we spawned.
    unsafe { libc::kill(first.child.0.id() as i32, libc::SIGKILL) };
    let mut child = first.child;
    assert!(!child.wait_with_limit(LIMIT).success(), "killed");
    // The killed daemon's socket is stale: without it, the new one's appearing means the
    // new daemon is up (it removes a stale socket itself too).
    std::fs::remove_file(&first.socket).expect("stale socket");
    let second = Daemon::start(&scratch, &[], &[], &["--call-sites"]);
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    wait_for_exited(&second.target, &ranks);
    let profile = report_json(&["report", "--from", &second.target]);
    // mpi_loop's truth starts at the go file; before it, counted by the first daemon:
    // MPI_Init, MPI_Comm_rank, MPI_Comm_size and one MPI_Barrier.
    let mut truths = read_truths(&scratch.path("truth"), 2);
    for t in &mut truths {
        let routines = t["routines"].as_object_mut().expect("routines");
        for name in ["MPI_Init", "MPI_Comm_rank", "MPI_Comm_size"] {
            routines.insert(name.into(), serde_json::json!({"calls": 1, "bytes": 0}));
        }
        let barrier = routines.get_mut("MPI_Barrier").expect("barrier");
        barrier["calls"] = (barrier["calls"].as_u64().expect("calls") + 1).into();
    }
    // Counts survive the restart, call events do not: the first daemon took the events of
    // MPI_Init and that first MPI_Barrier (who is late follows both), the second the rest.
    let mut profile = profile;
    for r in profile["ranks"].as_array_mut().expect("ranks") {
        r["events"] = (r["events"].as_u64().expect("events") + 2).into();
    }
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    // Every call at a site, those the first daemon counted (MPI_Init ...) among them.
    for rank in profile["ranks"].as_array().expect("ranks") {
        let mut at_sites: BTreeMap<&str, u64> = BTreeMap::new();
        for site in rank["call_sites"].as_array().expect("call_sites") {
            let routine = site["routine"].as_str().expect("routine");
            *at_sites.entry(routine).or_default() += site["calls"].as_u64().expect("calls");
        }
        let calls: BTreeMap<&str, u64> = rank["routines"]
            .as_object()
            .expect("routines")
            .iter()
            .map(|(name, r)| (name.as_str(), r["calls"].as_u64().expect("calls")))
            .collect();
        assert_eq!(at_sites, calls, "{rank:#}");
    }

    let state = pinned_state(&second.socket);
    assert!(
        state.exists(),
        "{} holds the pinned counts",
        state.display()
    );
    second.stop(&scratch);
    assert!(
        !state.exists(),
        "{} is removed at a clean stop",
        state.display()
    );
}

/// Where the daemon serving `socket` pins what it keeps across restarts.
fn pinned_state(socket: &std::path::Path) -> std::path::PathBuf {
    let tag: String = path_str(socket)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    std::path::Path::new("/sys/fs/bpf/commtap").join(tag.trim_matches('_'))
}

/// Ranks that exit while no daemon runs leave their counts in the pinned maps, which
/// nothing else would remove (a later process given the same pid would carry on from
/// them), and their places in the kept watched set (it would be counted, whatever the
/// scope): the next daemon forgets both at its start, and says which. So too where the pid
/// is another process's by then (started while no daemon ran, it is running).
#[test]
fn a_daemon_forgets_ranks_that_exited_while_none_ran() {
    const SAID: &str = "process(es) that exited while no daemon ran";
    let scratch = Scratch::new("daemon-away");
    let first = Daemon::start(&scratch, &[], &[], &[]);
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 20, &[]);
    let pids: Vec<u64> = ranks.iter().map(|p| u64::from(*p)).collect();
    wait_for_state(&first.target, &pids, "probed");
    // SAFETY: kill(2) of the daemon we spawned.
    unsafe { libc::kill(first.child.0.id() as i32, libc::SIGKILL) };
    let mut child = first.child;
    assert!(!child.wait_with_limit(LIMIT).success(), "killed");
    std::fs::remove_file(&first.socket).expect("stale socket");
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    for pid in &ranks {
        wait_until("the rank to be gone", LIMIT, || {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
    }
    // Still in the kept watched set: no program took them out at their end. A process
    // given one of their pids would be counted, and paused at its loads, by any daemon.
    // Under the layout of the kept maps, the one directory there.
    let watched = std::fs::read_dir(pinned_state(&first.socket))
        .expect("the pinned state")
        .flatten()
        .next()
        .expect("its layout")
        .path()
        .join("WATCHED");
    for pid in &ranks {
        assert!(pinned_map_holds(&watched, *pid), "rank {pid} not kept");
    }
    // The first rank's pid given to a process of no job.
    let mut other = spawn_with_pid(ranks[0], Command::new("sleep").arg("600"));
    let second = Daemon::start(&scratch, &[], &["--log", "info"], &[]);
    let said = || {
        std::fs::read_to_string(scratch.path("commtap.stderr"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains(SAID))
            .map(String::from)
    };
    wait_until("the second daemon to say what it forgot", LIMIT, || {
        said().is_some()
    });
    let line = without_colours(&said().expect("said"));
    let forgotten: Vec<u32> = line
        .split_once("pids=[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list.split(", ").filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default();
    for pid in &ranks {
        assert!(forgotten.contains(pid), "rank {pid} not forgotten: {line}");
        assert!(
            !pinned_map_holds(&watched, *pid),
            "rank {pid} still watched"
        );
    }
    assert!(
        other.0.try_wait().expect("its state").is_none(),
        "the process given a rank's pid ran throughout"
    );
    second.stop(&scratch);
}

/// A rank's pid given, once the rank has exited, to a process of another job (an MPI
/// singleton): who-is-late keeps the first job's report (its exited ranks are kept, for
/// `--keep-exited`) as it was, and takes none of the newcomer's calls for the rank's.
#[test]
fn a_ranks_pid_given_to_another_jobs_process_leaves_its_jobs_report_alone() {
    let scratch = Scratch::new("daemon-late-pid");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let (mut job, _) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 20, &[]);
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let truths = read_truths(&scratch.path("truth"), 2);
    let pids = pids_of(&truths);
    wait_for_exited(&daemon.target, &pids);
    // mpitrace's job id: its rank 0's pid.
    let job_id = pids[0].to_string();
    let late =
        || report_json(&["report", "--from", &daemon.target, "--job", &job_id])["skew"].clone();
    let before = late();
    // Each rank's collectives, every one matched: its barrier before the go (watched from
    // the start), the one after it and the 20 allreduces.
    assert_eq!(before["instances"].as_u64(), Some(22), "{before}");

    // Rank 1's pid given to a singleton of the same program, which runs through.
    let single = scratch.path("single");
    std::fs::create_dir_all(&single).expect("dir");
    std::fs::write(single.join("go"), b"").expect("go file");
    let mut cmd = Command::new(build_program("mpi_loop.c", Mpi::OpenMpi));
    mpi_env(&mut cmd).args([
        single.join("ready"),
        single.join("go"),
        "20".into(),
        single.join("truth"),
    ]);
    let mut other = spawn_with_pid(pids[1] as u32, &cmd);
    assert!(
        other.wait_with_limit(LIMIT).success(),
        "the singleton failed"
    );
    let start = read_truths(&single.join("truth"), 1)[0]["pid"].as_u64();
    assert_eq!(start, Some(pids[1]), "the singleton had the rank's pid");
    // Its profile final: listed apart from the rank's, as exited.
    wait_until("the singleton's profile to be final", LIMIT, || {
        let all = report_json(&["report", "--from", &daemon.target]);
        all["ranks"].as_array().into_iter().flatten().any(|r| {
            r["pid"].as_u64() == Some(pids[1])
                && r["job"].as_str() != Some(job_id.as_str())
                && r["exited"].as_bool() == Some(true)
        })
    });
    assert_eq!(late(), before, "the first job's report changed");
    daemon.stop(&scratch);
}

/// The state letter of `pid` in `/proc/PID/stat` (`T`: stopped), None once it is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// A process the daemon was asked to watch (`attach`), which then `dlopen`s its MPI (a
/// private copy, a file the daemon never saw) and calls it at once: exact from `MPI_Init`.
#[test]
fn a_watched_process_that_loads_its_mpi_late_is_exact_from_its_first_call() {
    let scratch = Scratch::new("daemon-dlopen");
    let (profile, _) = profile_of_a_late_loader(&scratch, start_dlopen_after_go);
    assert_profile_matches(
        &profile,
        &read_truths(&scratch.path("truth"), 1),
        &["MPI_Finalize"],
    );
}

/// A file the daemon decided not to probe (not an MPI library) that then became one under
/// the same identity (device, inode): rewritten in place, as `cp` onto it does (a deleted
/// file's inode number given to a new one is the same to the daemon). A process that maps it
/// then is probed, exact from its first call.
#[test]
fn a_file_rewritten_as_an_mpi_library_under_its_identity_is_probed() {
    use std::os::unix::fs::MetadataExt;
    let scratch = Scratch::new("daemon-rewritten");
    // Its log says when a decision is found to be on other contents (at debug).
    let daemon = Daemon::start(&scratch, &[], &["--log", "debug"], &["--uid", "65534"]);
    let lib = scratch.path("libmpi.so.40");
    std::fs::copy(system_library("libz.so.1"), &lib).expect("a library that is not MPI");
    let inode = std::fs::metadata(&lib).expect("lib").ino();

    // Loaded while it is not MPI: the daemon reads it (the process paused at its load) and
    // decides not to probe it; the program finds no MPI_Init in it.
    let first = scratch.path("first");
    std::fs::create_dir_all(&first).expect("dir");
    let (mut loader, pid) = start_dlopen_of_after_go(&lib, &first, 10);
    attach_and_go(&daemon.target, pid, &first);
    assert!(
        !loader.wait_with_limit(LIMIT).success(),
        "MPI_Init found in libz"
    );

    // Open MPI's libmpi written over it: the same inode, other contents.
    std::fs::write(
        &lib,
        std::fs::read(system_library("libmpi.so.40")).expect("libmpi"),
    )
    .expect("rewrite");
    assert_eq!(
        std::fs::metadata(&lib).expect("lib").ino(),
        inode,
        "rewritten in place"
    );
    let second = scratch.path("second");
    std::fs::create_dir_all(&second).expect("dir");
    let (rank, pid) = start_dlopen_of_after_go(&lib, &second, 1000);
    let profile = profile_after_go(&daemon.target, rank, pid, &second);
    daemon.stop(&scratch);
    assert_profile_matches(
        &profile,
        &read_truths(&second.join("truth"), 1),
        &["MPI_Finalize"],
    );
    let log = std::fs::read_to_string(scratch.path("commtap.stderr")).expect("daemon log");
    assert!(
        log.contains("not the file decided on before under this identity"),
        "{log}"
    );
}

/// The same with NCCL: a watched process that `dlopen`s the NCCL wheel's `libnccl.so.2`
/// (on no linker path) and calls it at once is exact from its first call.
#[test]
fn a_watched_process_that_loads_nccl_late_is_exact_from_its_first_call() {
    let scratch = Scratch::new("daemon-nccl-dlopen");
    let (profile, pid) = profile_of_a_late_loader(&scratch, start_nccl_dlopen_after_go);
    let truth = read_json(&scratch.path("truth.json"));
    assert_eq!(
        routine_table(&rank_by_pid(&profile, u64::from(pid))["routines"]),
        routine_table(&truth["routines"]),
        "(calls, bytes) per routine"
    );
}

/// What a rank still running has used is read from `/proc` at the report: its context
/// switches are its live threads' (each thread's `status`; the process's own counts its
/// first thread alone) with its ended threads' (the kernel's sums), so at least what its
/// live threads' `status` said just before, and at most what the kernel sums at its end.
#[test]
fn a_running_ranks_usage_is_read_while_it_runs() {
    let scratch = Scratch::new("daemon-live-usage");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 10, &[]);
    let ranks: Vec<u64> = ranks.into_iter().map(u64::from).collect();
    wait_for_state(&daemon.target, &ranks, "probed");
    let switches = |pid: u64| -> u64 {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the rank's threads")
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
            .flat_map(|status| {
                status
                    .lines()
                    .filter(|l| l.contains("ctxt_switches:"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    };
    let before: Vec<u64> = ranks.iter().map(|&p| switches(p)).collect();
    let profile = report_json(&["report", "--from", &daemon.target]);
    let mut live = Vec::new();
    for (i, pid) in ranks.iter().enumerate() {
        let u = &rank_by_pid(&profile, *pid)["usage"];
        assert_eq!(u["at_exit"], false, "{u}");
        let n = u["context_switches"].as_u64().expect("context switches");
        assert!(
            n >= before[i],
            "PID {pid}: {n} context switches, its live threads' status said {} before",
            before[i]
        );
        assert!(u["max_rss_bytes"].as_u64().expect("rss") > 1 << 20, "{u}");
        live.push(n);
    }
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    wait_for_exited(&daemon.target, &ranks);
    let profile = report_json(&["report", "--from", &daemon.target]);
    for (pid, live) in ranks.iter().zip(live) {
        let u = &rank_by_pid(&profile, *pid)["usage"];
        assert_eq!(u["at_exit"], true, "{u}");
        let n = u["context_switches"].as_u64().expect("context switches");
        assert!(n >= live, "PID {pid}: {n} at its end, {live} while it ran");
    }
    daemon.stop(&scratch);
}

/// Starts 2 Open MPI ranks of `prog` (an `mpi_sites` build) making `n` calls, their truths
/// to `scratch/prefix`; the job, its ranks and their truths once every rank is out of its
/// last call, waiting for `scratch/go` (the counters and the sites, read apart, then hold
/// the same calls).
#[track_caller]
fn start_sites_job(
    scratch: &Scratch,
    prog: &std::path::Path,
    n: u64,
    prefix: &str,
) -> (ChildGuard, Vec<u32>, Vec<serde_json::Value>) {
    for f in ["ready", "ready.0", "ready.1", "go"] {
        let _ = std::fs::remove_file(scratch.path(f));
    }
    let prefix = scratch.path(prefix);
    let args = [
        n.to_string().into(),
        prefix.clone().into_os_string(),
        scratch.path("ready").into_os_string(),
        scratch.path("go").into_os_string(),
    ];
    let (job, ranks) = start_waiting_program(scratch, Mpi::OpenMpi, 2, prog, &args, &[]);
    wait_until("every rank's marker", LIMIT, || {
        (0..2).all(|r| scratch.path(&format!("ready.{r}")).exists())
    });
    let truths = read_truths(&prefix, 2);
    (job, ranks, truths)
}

/// A daemon with `--call-sites` says where a job's calls were made from, as `record` does:
/// in a report while the ranks run (their files' symbols read off its loop, in the
/// background, the sites named by a report after that) and in the final one after they
/// exit, each function's calls and bytes equal what `mpi_sites` made from it.
#[test]
fn a_daemon_counts_call_sites_exactly() {
    let scratch = Scratch::new("daemon-call-sites");
    let daemon = Daemon::start(&scratch, &[], &[], &["--call-sites"]);
    let prog = build_program("mpi_sites.c", Mpi::OpenMpi);
    let (mut job, ranks, truths) = start_sites_job(&scratch, &prog, 1000, "truth");
    let named = |profile: &serde_json::Value| {
        ranks.iter().all(|&pid| {
            rank_by_pid(profile, u64::from(pid))["call_sites"]
                .as_array()
                .is_some_and(|s| s.iter().any(|c| c["function"] == "reduce_gradients"))
        })
    };
    let mut live = serde_json::Value::Null;
    wait_until("the running ranks' sites named", LIMIT, || {
        live = report_json(&["report", "--from", &daemon.target]);
        named(&live)
    });
    assert_call_sites_match(&live, &truths, &prog, false);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let pids: Vec<u64> = ranks.iter().map(|&p| u64::from(p)).collect();
    wait_for_exited(&daemon.target, &pids);
    let profile = report_json(&["report", "--from", &daemon.target]);
    assert_call_sites_match(&profile, &truths, &prog, false);
    daemon.stop(&scratch);
}

/// A daemon with `--call-sites` names each job's sites by the contents its program had
/// then: a program rebuilt in place between two jobs (the same inode, other functions, as
/// when the linker's new file is given the old one's inode number) is read again, and the
/// first job's sites keep their names.
#[test]
fn a_program_rebuilt_in_place_has_its_call_sites_named_anew() {
    use std::os::unix::fs::MetadataExt;
    let scratch = Scratch::new("daemon-sites-rebuilt");
    let daemon = Daemon::start(&scratch, &[], &[], &["--call-sites"]);
    // Each build under the name the jobs run it by (the sites name their file).
    let builds = [
        ("c", build_program("mpi_sites.c", Mpi::OpenMpi)),
        ("cpp", build_program("mpi_sites_cpp.cpp", Mpi::OpenMpi)),
    ]
    .map(|(tag, built)| {
        let dir = scratch.path(tag);
        std::fs::create_dir_all(&dir).expect("dir");
        let copy = dir.join("mpi_sites");
        std::fs::copy(built, &copy).expect("a copy of the build");
        copy
    });
    let prog = scratch.path("mpi_sites");
    std::fs::copy(&builds[0], &prog).expect("the program");
    let inode = std::fs::metadata(&prog).expect("program").ino();
    // A job of `prog`, run to its end; its truths, once the daemon has named its sites
    // (its program's symbols read before anything is written over it).
    let run_named = |tag: &str, build: &std::path::Path| {
        let (mut job, ranks, truths) =
            start_sites_job(&scratch, &prog, 100, &format!("truth-{tag}"));
        let job_id = truths[0]["pid"].as_u64().expect("pid").to_string();
        let report = || report_json(&["report", "--from", &daemon.target, "--job", &job_id]);
        wait_until("the running ranks' sites named", LIMIT, || {
            let profile = report();
            ranks.iter().all(|&pid| {
                rank_by_pid(&profile, u64::from(pid))["call_sites"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|c| c["function"] != serde_json::Value::Null))
            })
        });
        assert_call_sites_match(&report(), &truths, build, false);
        std::fs::write(scratch.path("go"), b"go").expect("go file");
        assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
        let pids: Vec<u64> = ranks.iter().map(|&p| u64::from(p)).collect();
        wait_for_exited(&daemon.target, &pids);
        (job_id, truths)
    };
    let (first, first_truths) = run_named("c", &builds[0]);
    // Rebuilt as C++ (its functions named `trainer::Step::...`), written over the program.
    std::fs::write(&prog, std::fs::read(&builds[1]).expect("the C++ build"))
        .expect("rebuilt in place");
    assert_eq!(
        std::fs::metadata(&prog).expect("program").ino(),
        inode,
        "rebuilt in place"
    );
    run_named("cpp", &builds[1]);
    // The first job, ended before the rebuild, keeps the names of the program it ran.
    let profile = report_json(&["report", "--from", &daemon.target, "--job", &first]);
    assert_call_sites_match(&profile, &first_truths, &builds[0], false);
    daemon.stop(&scratch);
}

/// A daemon started while a torchrun-like job runs (its launcher maps an NCCL, as
/// torchrun's Python does; its workers NCCL alone, numbered by `RANK`, as PyTorch's ranks),
/// scoped to the launcher's PID: it adopts the workers (not only processes that map an
/// MPI) and profiles them exactly from then on, each numbered by its `RANK`, and says so.
#[test]
fn a_daemon_scoped_to_a_running_torchrun_profiles_its_nccl_workers() {
    let scratch = Scratch::new("daemon-torchrun");
    // Named as the NCCL a torch maps: the daemon knows a running launcher by its libraries'
    // names.
    let standin = scratch.path("libnccl.so.2");
    std::fs::copy(build_shared_c("nccl_standin.c"), &standin).expect("copying the stand-in");
    let (mut launcher, pid) = start_torchrun_like(&scratch, 100, &standin, Workers::Nccl);
    let mut workers: Vec<u64> = children_of(pid).into_iter().map(u64::from).collect();
    workers.sort_unstable();
    assert_eq!(workers.len(), 2, "the launcher's workers: {workers:?}");
    let daemon = Daemon::start(&scratch, &[], &[], &["--pid", &pid.to_string()]);
    wait_for_state(&daemon.target, &workers, "probed");
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(
        launcher.wait_with_limit(LIMIT).success(),
        "the launcher failed"
    );
    wait_for_exited(&daemon.target, &workers);
    let profile = report_json(&["report", "--from", &daemon.target]);
    for (i, worker) in workers.iter().enumerate() {
        let truth = read_json(&scratch.path(&format!("truth{i}.json")));
        assert_eq!(truth["pid"].as_u64(), Some(*worker), "worker {i}'s truth");
        let rank = rank_by_pid(&profile, *worker);
        assert_eq!(rank["rank"], i, "{profile:#}");
        assert_eq!(
            routine_table(&rank["routines"]),
            routine_table(&truth["routines"]),
            "(calls, bytes) per routine of worker {i}"
        );
    }
    daemon.stop(&scratch);
    let log = std::fs::read_to_string(scratch.path("commtap.stderr")).expect("the daemon's log");
    assert!(
        log.contains(&format!(
            "below PID {pid}, processes numbered apart from it (its workers) map MPI or NCCL \
             too; they are profiled as well: PID {}, {}",
            workers[0], workers[1]
        )),
        "{log}"
    );
}

/// Has the daemon at `target` watch `pid`, then tells it to go on (`dir/go`).
#[track_caller]
fn attach_and_go(target: &str, pid: u32, dir: &std::path::Path) {
    let out = commtap_output(&["attach", "--pid", &pid.to_string(), "--from", target]);
    assert!(
        out.status.success(),
        "attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(dir.join("go"), b"go").expect("go file");
}

/// The daemon at `target`'s profile of the program `pid` (`child`), a singleton waiting for
/// `dir/go`: attached, told to go on, and ended well.
#[track_caller]
fn profile_after_go(
    target: &str,
    mut child: ChildGuard,
    pid: u32,
    dir: &std::path::Path,
) -> serde_json::Value {
    attach_and_go(target, pid, dir);
    assert!(child.wait_with_limit(LIMIT).success(), "the program failed");
    wait_for_exited(target, &[u64::from(pid)]);
    // A singleton's job is its own pid (mpitrace's convention).
    report_json(&["report", "--from", target, "--job", &pid.to_string()])
}

/// A daemon watching only the process `start` starts, attached while it waits before its
/// `dlopen`: the daemon's profile of its job once it has exited, and its pid.
fn profile_of_a_late_loader(
    scratch: &Scratch,
    start: fn(&Scratch, u64) -> (ChildGuard, u32),
) -> (serde_json::Value, u32) {
    // Scoped to nobody: only the process attached below is watched.
    let daemon = Daemon::start(scratch, &[], &[], &["--uid", "65534"]);
    let (waiting, pid) = start(scratch, 1000);
    let profile = profile_after_go(&daemon.target, waiting, pid, &scratch.0);
    daemon.stop(scratch);
    (profile, pid)
}

/// A daemon killed while a process it watches is paused at a library load (the process's
/// event unread): the next daemon continues it as it starts (the list of paused processes
/// is kept with the counts), and says so.
#[test]
fn a_process_left_paused_by_a_killed_daemon_is_continued_by_the_next() {
    use std::os::unix::process::CommandExt;
    let scratch = Scratch::new("daemon-paused");
    // Scoped to nobody: only the process attached below is watched. The lease outlasts
    // the test, so that the frozen daemon's kernel side still pauses.
    let args = ["--uid", "65534", "--test-pause-lease", "10m"];
    let first = Daemon::start(&scratch, &[], &[], &args);
    let go = scratch.path("go");
    // A session of its own: no controlling terminal, so nothing keeps it from being paused.
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!(
        "while [ ! -e {} ]; do sleep 0.01; done; exec /bin/true",
        go.display()
    ));
    // SAFETY: setsid(2) is async-signal-safe, the only call made between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut waiting = ChildGuard(cmd.spawn().expect("sh"));
    let pid = waiting.0.id();
    let out = commtap_output(&["attach", "--pid", &pid.to_string(), "--from", &first.target]);
    assert!(
        out.status.success(),
        "attach: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Frozen, the daemon reads no event: the exec'd program's start (a library load) pauses
    // it for good.
    // SAFETY: kill(2) of the daemon we spawned.
    unsafe { libc::kill(first.child.0.id() as i32, libc::SIGSTOP) };
    std::fs::write(&go, b"").expect("go file");
    wait_until("the program paused at its start", LIMIT, || {
        process_state(pid) == Some('T')
            && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e.ends_with("true"))
    });
    // SAFETY: as above.
    unsafe { libc::kill(first.child.0.id() as i32, libc::SIGKILL) };
    let mut child = first.child;
    assert!(!child.wait_with_limit(LIMIT).success(), "killed");
    assert_eq!(
        process_state(pid),
        Some('T'),
        "still paused, nobody to continue it"
    );
    std::fs::remove_file(&first.socket).expect("stale socket");
    let second = Daemon::start(&scratch, &[], &[], &["--uid", "65534"]);
    assert!(waiting.wait_with_limit(LIMIT).success(), "/bin/true failed");
    let log = std::fs::read_to_string(scratch.path("commtap.stderr")).expect("daemon log");
    assert!(
        log.contains("continued 1 process(es) a commtap before this one left paused"),
        "{log}"
    );
    second.stop(&scratch);
}

/// The node churns: 3,000 short processes without MPI while ten short MPI jobs (2 ranks
/// each) run one after another. Every rank of every job is counted
/// exactly, none of the short processes is kept, the daemon's memory stays bounded, and a
/// clean stop leaves nothing pinned.
#[test]
fn a_churning_node_misses_no_rank_and_keeps_nothing_it_should_not() {
    let scratch = Scratch::new("daemon-churn");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let churn = std::thread::spawn(|| {
        let out = Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 3000 ]; do /bin/true; i=$((i+1)); done",
            ])
            .output()
            .expect("churn");
        assert!(out.status.success());
    });
    let mut jobs = Vec::new();
    // Open MPI: each job has its launcher's key (Hydra sets none, so MPICH jobs outside a
    // batch system are one job to the daemon; see the README).
    for n in 0..10 {
        let prefix = scratch.path(&format!("truth-{n}"));
        jobs.push(run_truth_job(&prefix, Mpi::OpenMpi, 2));
    }
    churn.join().expect("the churn");
    let all: Vec<u64> = jobs.iter().flat_map(|t| pids_of(t)).collect();
    wait_for_exited(&daemon.target, &all);
    for truths in &jobs {
        let job = truths[0]["pid"].as_u64().expect("pid").to_string();
        let profile = report_json(&["report", "--from", &daemon.target, "--job", &job]);
        assert_profile_matches(&profile, truths, &["MPI_Finalize"]);
    }
    // The daemon lists the MPI ranks only: none of the 3,000 is kept.
    let listed = ps_states(&daemon.target);
    let stray: Vec<&u64> = listed.keys().filter(|p| !all.contains(p)).collect();
    assert!(stray.is_empty(), "kept: {stray:?}");
    let peak = peak_kib(daemon.child.0.id());
    eprintln!("daemon peak resident memory under churn: {peak} KiB");
    assert!(peak < 256 << 10, "the daemon's peak memory is {peak} KiB");
    let state = pinned_state(&daemon.socket);
    daemon.stop(&scratch);
    assert!(!state.exists(), "{} left pinned", state.display());
}

/// A query string as a URL's query: everything but unreserved characters escaped.
fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `sum by (routine) (METRIC{job_id="JOB"})` from a Prometheus server's HTTP API, per
/// routine (None until it answers).
fn prometheus_sums(server: &str, metric: &str, job: &str) -> Option<BTreeMap<String, u64>> {
    let v = prometheus_query(
        server,
        &format!("sum by (routine) ({metric}{{job_id=\"{job}\"}})"),
    )?;
    let result = v["data"]["result"].as_array()?;
    Some(
        result
            .iter()
            .filter_map(|r| {
                let routine = r["metric"]["routine"].as_str()?.to_string();
                let value: f64 = r["value"][1].as_str()?.parse().ok()?;
                Some((routine, value as u64))
            })
            .collect(),
    )
}

/// A PromQL query's answer from a Prometheus server's HTTP API (None until it gives one).
fn prometheus_query(server: &str, query: &str) -> Option<serde_json::Value> {
    let body = {
        use std::io::{Read as _, Write as _};
        // Refused while the server starts: not an answer yet.
        let mut s = std::net::TcpStream::connect(server).ok()?;
        let path = format!("/api/v1/query?query={}", url_escape(query));
        write!(s, "GET {path} HTTP/1.0\r\nHost: {server}\r\n\r\n").ok()?;
        let mut resp = String::new();
        s.read_to_string(&mut resp).ok()?;
        resp.split_once("\r\n\r\n")?.1.to_string()
    };
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    (v["status"] == "success").then_some(v)
}

/// A real Prometheus server (Debian's `prometheus`) scraping a daemon and the aggregator it
/// pushes to, queried over its HTTP API: the job's calls and bytes per routine there equal
/// the program's truth, and the aggregator's health shows the ranks pushed. The job is the
/// `job_id` label (Prometheus keeps `job` for the scrape job: an exporter's `job` would have
/// come out as `exported_job`).
#[test]
fn a_real_prometheus_holds_the_jobs_exact_totals() {
    let scratch = Scratch::new("prometheus");
    let (node_metrics, aggregator_metrics, aggregator) = (free_port(), free_port(), free_port());
    let _aggregator = spawn_commtap(
        &Scratch::new("prometheus-aggregator"),
        &[
            "aggregator",
            "--listen",
            &aggregator,
            "--insecure-tcp",
            "--db",
            path_str(&scratch.path("agg.redb")),
            "--metrics-addr",
            &aggregator_metrics,
            "--metrics-insecure",
        ],
    );
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &[
            "--metrics-addr",
            &node_metrics,
            "--metrics-insecure",
            "--aggregator",
            &format!("http://{aggregator}"),
            "--push-insecure",
            "--push-interval",
            "200ms",
        ],
    );
    let server = free_port();
    let config = scratch.path("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: commtap\n    \
             static_configs:\n      - targets: ['{node_metrics}']\n  - job_name: commtap-aggregator\n    \
             static_configs:\n      - targets: ['{aggregator_metrics}']\n"
        ),
    )
    .expect("prometheus.yml");
    let log = std::fs::File::create(scratch.path("prometheus.log")).expect("log");
    let _prometheus = ChildGuard::spawn(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                scratch.path("data").display()
            ))
            .arg(format!("--web.listen-address={server}"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log),
    );
    let truth = run_truth_job(&scratch.path("truth"), Mpi::OpenMpi, 2);
    wait_for_exited(&daemon.target, &pids_of(&truth));
    let job = truth[0]["pid"].as_u64().expect("pid").to_string();
    let mut expected_calls: BTreeMap<String, u64> = BTreeMap::new();
    let mut expected_bytes: BTreeMap<String, u64> = BTreeMap::new();
    for rank in &truth {
        for (routine, (calls, bytes)) in routine_table(&rank["routines"]) {
            *expected_calls.entry(routine.clone()).or_default() += calls;
            *expected_bytes.entry(routine).or_default() += bytes;
        }
    }
    // Scraped every second, stored, queried: until the stored totals are the final ones.
    let got = |metric: &str| {
        prometheus_sums(&server, metric, &job).map(|mut m| {
            m.remove("MPI_Finalize");
            m
        })
    };
    let mut last = (None, None);
    let deadline = std::time::Instant::now() + LIMIT;
    while std::time::Instant::now() < deadline {
        last = (
            got("commtap_mpi_calls_total"),
            got("commtap_mpi_bytes_total"),
        );
        if last.0.as_ref() == Some(&expected_calls) && last.1.as_ref() == Some(&expected_bytes) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        last.0.as_ref(),
        Some(&expected_calls),
        "calls per routine in Prometheus"
    );
    assert_eq!(
        last.1.as_ref(),
        Some(&expected_bytes),
        "bytes per routine in Prometheus"
    );
    // Both say what they are; the aggregator has the job's two ranks (pushed, accepted).
    let scalar = |query: &str| prometheus_value(&server, query);
    let mut seen = (None, None, None);
    let deadline = std::time::Instant::now() + LIMIT;
    while std::time::Instant::now() < deadline {
        seen = (
            scalar("count(commtap_build_info)"),
            scalar("max(commtap_aggregator_ranks)"),
            scalar("sum(commtap_aggregator_snapshots_total{outcome=\"accepted\"})"),
        );
        if seen.0 == Some(2.0) && seen.1 >= Some(2.0) && seen.2 >= Some(2.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        seen.0,
        Some(2.0),
        "commtap_build_info of the daemon and the aggregator"
    );
    assert!(
        seen.1 >= Some(2.0) && seen.2 >= Some(2.0),
        "the aggregator's ranks and accepted snapshots: {seen:?}"
    );
    daemon.stop(&scratch);
}

/// The last request an OTLP receiver (`tests/consumers/otlp_receiver.py`) got from the
/// exporter whose resource says `service.name` = `service`, as protobuf's JSON mapping.
fn last_otlp_request(dir: &std::path::Path, service: &str) -> Option<serde_json::Value> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files.iter().rev().find_map(|f| {
        let req: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).ok()?).ok()?;
        let attrs = req["resourceMetrics"][0]["resource"]["attributes"].as_array()?;
        attrs
            .iter()
            .any(|a| a["key"] == "service.name" && a["value"]["stringValue"] == service)
            .then_some(req)
    })
}

/// The data points of the OTLP sum `name` in `req`, per its `routine` attribute, for the
/// points whose `job_id` is `job` (ints are strings in protobuf's JSON mapping).
fn otlp_sums(req: &serde_json::Value, name: &str, job: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let metrics = req["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for m in metrics.iter().filter(|m| m["name"] == name) {
        assert_eq!(m["sum"]["isMonotonic"], true, "{name} is a counter");
        for p in m["sum"]["dataPoints"].as_array().into_iter().flatten() {
            let attr = |k: &str| {
                p["attributes"]
                    .as_array()
                    .and_then(|a| a.iter().find(|a| a["key"] == k))
                    .and_then(|a| a["value"]["stringValue"].as_str())
                    .map(str::to_string)
            };
            if attr("job_id").as_deref() != Some(job) {
                continue;
            }
            let value = p["asInt"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("an integer point: {p}"));
            *out.entry(attr("routine").expect("routine")).or_default() += value;
        }
    }
    out
}

/// An aggregator with its database at `db` that pushes its health over OTLP as the `OTEL_*`
/// variables `env` say (no flags); its log in `scratch`.
fn otlp_aggregator(scratch: &Scratch, db: &std::path::Path, env: &[(&str, String)]) -> ChildGuard {
    let listen = free_port();
    let args = [
        "aggregator",
        "--listen",
        &listen,
        "--insecure-tcp",
        "--db",
        path_str(db),
    ];
    spawn_commtap_with_env(scratch, &args, env)
}

/// Starts `tests/consumers/otlp_receiver.py` writing into `scratch/received` (with `tls`:
/// its certificate, key and the CA of the clients it serves); returns it and its endpoint.
fn start_otlp_receiver(
    scratch: &Scratch,
    tls: Option<[&std::path::Path; 3]>,
) -> (ChildGuard, String) {
    let port_file = scratch.path("otlp.port");
    let mut cmd = Command::new("python3");
    cmd.arg(repo_root().join("tests/consumers/otlp_receiver.py"))
        .arg(&port_file)
        .arg(scratch.path("received"))
        .args(tls.into_iter().flatten())
        .stderr(std::fs::File::create(scratch.path("otlp-receiver.log")).expect("log"));
    let receiver = ChildGuard::spawn(&mut cmd);
    wait_until("the OTLP receiver to listen", LIMIT, || port_file.exists());
    let port = std::fs::read_to_string(&port_file).expect("port");
    let scheme = if tls.is_some() { "https" } else { "http" };
    (receiver, format!("{scheme}://127.0.0.1:{}", port.trim()))
}

#[test]
fn an_opentelemetry_collector_over_tls_gets_the_series_of_a_client_it_trusts() {
    let scratch = Scratch::new("otlp-tls");
    let (ca, cert, key) = make_certs(&scratch.0);
    let (client_cert, client_key) = make_client_cert(&scratch.0, "node07", None);
    let (_receiver, endpoint) = start_otlp_receiver(&scratch, Some([&cert, &key, &ca]));
    let _aggregator = otlp_aggregator(
        &Scratch::new("otlp-tls-aggregator"),
        &scratch.path("agg.redb"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200".into()),
            ("OTEL_SERVICE_NAME", "commtap-aggregator".into()),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", path_str(&ca).into()),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                path_str(&client_cert).into(),
            ),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                path_str(&client_key).into(),
            ),
        ],
    );
    wait_until("a push over TLS", LIMIT, || {
        last_otlp_request(&scratch.path("received"), "commtap-aggregator").is_some()
    });
    // Without a client certificate the collector refuses it, and the aggregator says so.
    let untrusted = Scratch::new("otlp-tls-untrusted");
    let _refused = otlp_aggregator(
        &untrusted,
        &scratch.path("agg2.redb"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200".into()),
            ("OTEL_SERVICE_NAME", "commtap-untrusted".into()),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", path_str(&ca).into()),
        ],
    );
    wait_until("the refused push to be reported", LIMIT, || {
        std::fs::read_to_string(untrusted.path("commtap.stderr"))
            .is_ok_and(|e| e.contains("OTLP export to"))
    });
    assert!(last_otlp_request(&scratch.path("received"), "commtap-untrusted").is_none());
}

#[test]
fn an_opentelemetry_collector_receives_the_jobs_exact_totals_over_otlp() {
    let scratch = Scratch::new("otlp");
    // A receiver built from OpenTelemetry's own protos, on a port it picks and tells.
    let received = scratch.path("received");
    let (_receiver, endpoint) = start_otlp_receiver(&scratch, None);
    // The aggregator finds the collector through the standard variables, the daemon
    // through its flags.
    let _aggregator = otlp_aggregator(
        &Scratch::new("otlp-aggregator"),
        &scratch.path("agg.redb"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "200".into()),
            ("OTEL_SERVICE_NAME", "commtap-aggregator".into()),
            ("OTEL_RESOURCE_ATTRIBUTES", "cluster=test%20one".into()),
        ],
    );
    let daemon = Daemon::start(
        &scratch,
        &[],
        &[],
        &["--otlp-endpoint", &endpoint, "--otlp-interval", "200ms"],
    );
    let truth = run_truth_job(&scratch.path("truth"), Mpi::OpenMpi, 2);
    wait_for_exited(&daemon.target, &pids_of(&truth));
    let job = truth[0]["pid"].as_u64().expect("pid").to_string();
    let mut expected: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for rank in &truth {
        for (routine, (calls, bytes)) in routine_table(&rank["routines"]) {
            let e = expected.entry(routine).or_default();
            *e = (e.0 + calls, e.1 + bytes);
        }
    }
    let got = || {
        let req = last_otlp_request(&received, "commtap")?;
        let (mut calls, mut bytes) = (
            otlp_sums(&req, "commtap_mpi_calls", &job),
            otlp_sums(&req, "commtap_mpi_bytes", &job),
        );
        // After each rank's truth was written.
        calls.remove("MPI_Finalize");
        bytes.remove("MPI_Finalize");
        Some(
            calls
                .into_iter()
                .map(|(r, c)| {
                    let b = bytes.get(&r).copied().unwrap_or(0);
                    (r, (c, b))
                })
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let mut last = None;
    let deadline = std::time::Instant::now() + LIMIT;
    while std::time::Instant::now() < deadline {
        last = got();
        if last.as_ref() == Some(&expected) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        last.as_ref(),
        Some(&expected),
        "(calls, bytes) per routine as the collector received them"
    );
    // The aggregator pushes its own series, with the resource the variables gave it.
    wait_until("the aggregator's first push", LIMIT, || {
        last_otlp_request(&received, "commtap-aggregator").is_some()
    });
    let req = last_otlp_request(&received, "commtap-aggregator").expect("a push");
    let resource = &req["resourceMetrics"][0]["resource"]["attributes"];
    assert!(
        resource.as_array().is_some_and(|a| a
            .iter()
            .any(|a| a["key"] == "cluster" && a["value"]["stringValue"] == "test one")),
        "{resource}"
    );
    let names: Vec<&str> = req["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(names.contains(&"commtap_build_info"), "{names:?}");
    daemon.stop(&scratch);
}

/// One number from a Prometheus server's HTTP API (None until it has one).
fn prometheus_value(server: &str, query: &str) -> Option<f64> {
    let v = prometheus_query(server, query)?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// A daemon told to stop while a trace streams from it stops: the stream ends, cleanly,
/// and the trace with it (a graceful stop waited for every connection to close, and a
/// trace's never does: `systemctl stop` waited out its timeout).
#[test]
fn a_daemon_stops_while_a_trace_streams_from_it() {
    let scratch = Scratch::new("daemon-stop-tracing");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 200, &[]);
    let pids: Vec<u64> = ranks.iter().map(|p| u64::from(*p)).collect();
    wait_for_state(&daemon.target, &pids, "probed");
    // Every process of the node: the trace does not end with the job.
    let (tracer, trace) = spawn_streaming_trace(&scratch, &daemon.target, &[]);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    // Within `stop`'s minute, with the trace still connected.
    daemon.stop(&scratch);
    let run = finish_ok(&scratch, tracer, LIMIT);
    assert!(
        run.stderr.contains("every daemon ended its stream"),
        "{}",
        run.stderr
    );
    // Closed as a trace is: it loads.
    let summary = devtools_summary(&trace);
    assert!(summary["processes"].is_object(), "{summary}");
}

/// What a daemon pushes (users, command lines, counts) leaves the node over TLS unless it
/// is told otherwise: a plaintext aggregator is refused at the start.
#[test]
fn a_daemon_pushes_in_plaintext_only_when_told_to() {
    let scratch = Scratch::new("daemon-plaintext-push");
    let socket = scratch.path("never.sock");
    // Refused, it exits at once; were it to serve, the limit would end it, and the test.
    let limit = Duration::from_mins(1);
    let run = run_commtap(
        &scratch,
        &[
            "daemon",
            "--socket",
            path_str(&socket),
            "--aggregator",
            "http://127.0.0.1:9",
        ],
        limit,
    );
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--push-insecure"), "{}", run.stderr);
    assert!(!socket.exists(), "it served");
    let run = run_commtap(
        &scratch,
        &[
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--insecure-tcp",
            "--db",
            path_str(&scratch.path("never.redb")),
            "--upstream",
            "http://127.0.0.1:9",
        ],
        limit,
    );
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("--upstream") && run.stderr.contains("--push-insecure"),
        "{}",
        run.stderr
    );
}

/// `report --watch` of a job that is not there ends as `report` does (exit status 3), and
/// the listing commands end quietly when their reader does (`| head`).
#[test]
fn a_watch_of_a_missing_job_and_a_closed_pipe_end_cleanly() {
    let scratch = Scratch::new("daemon-watch-missing");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let out = commtap_output(&[
        "report",
        "--from",
        &daemon.target,
        "--job",
        "no-such-job",
        "--watch",
        "1s",
        "--count",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("no job no-such-job"), "{stderr}");
    // `ps` piped into a reader that has gone: no panic (Rust's print! panics on EPIPE).
    let mut ps = Command::new(commtap_bin())
        .args(["ps", "--from", &daemon.target, "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ps");
    drop(ps.stdout.take());
    let out = ps.wait_with_output().expect("ps");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.code() != Some(101), "{stderr}");
    daemon.stop(&scratch);
}
