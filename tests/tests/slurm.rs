//! Under a real Slurm (Debian's slurmctld, slurmd and munge, a one-node cluster each test
//! configures with `proctrack/cgroup` and the project's `deploy/slurm` prolog and epilog):
//! what a Slurm site gets, and what a user cannot fake.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

/// Iterations of each rank's loop after the go.
const ITERS: u64 = 20;

/// An executable script at `scratch/<name>` that runs the project's `deploy/slurm/<name>`
/// as slurmd runs it (as root, with no PATH of its own: commtap's directory stands in for
/// `/usr/bin`), for `daemon` and reports under `reports`. What it printed on stderr and its
/// exit status go to `<name>.<job>.stderr` and, last, `<name>.<job>.status`.
fn slurm_script(scratch: &Scratch, name: &str, daemon: &Daemon, reports: &Path) -> PathBuf {
    let path = scratch.path(name);
    let bin = commtap_bin();
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n\
             export PATH={bin}:/usr/sbin:/usr/bin:/sbin:/bin COMMTAP_SOCKET={socket} \
             COMMTAP_REPORT_DIR={reports}\n\
             out={path}.$SLURM_JOB_ID\n\
             sh {script} 2> $out.stderr\n\
             echo $? > $out.tmp && mv $out.tmp $out.status\n",
            bin = bin.parent().expect("bin dir").display(),
            socket = daemon.socket.display(),
            reports = reports.display(),
            path = path.display(),
            script = repo_root().join("deploy/slurm").join(name).display(),
        ),
    )
    .expect("writing a Slurm script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// What the prolog or epilog (`slurm_script`) said for `job`: (status, stderr), once it ran.
#[track_caller]
fn script_result(script: &Path, job: &str) -> (String, String) {
    let status = PathBuf::from(format!("{}.{job}.status", script.display()));
    wait_until(&format!("{} of job {job}", script.display()), LIMIT, || {
        status.exists()
    });
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (
        read(&status).trim().to_string(),
        read(Path::new(&format!("{}.{job}.stderr", script.display()))),
    )
}

/// nobody's job script in `dir`: `mpi_loop` (a copy nobody owns) as 2 Open MPI ranks that
/// wait at `dir/go`, writing their truths to `dir/truth.<rank>.json`; `before`: shell
/// lines run first.
fn loop_job(dir: &Path, before: &str) -> (PathBuf, PathBuf) {
    let d = dir.display();
    mpi_job(
        dir,
        "mpi_loop",
        before,
        &format!("{d}/ready {d}/go {ITERS} {d}/truth"),
    )
}

/// nobody's job script in `dir`: test program `name` (a copy nobody owns) as 2 Open MPI
/// ranks given `args`, after the shell lines `before`; the program's path and the script's.
fn mpi_job(dir: &Path, name: &str, before: &str, args: &str) -> (PathBuf, PathBuf) {
    let prog = dir.join(name);
    copy_as_nobody(&build_program(&format!("{name}.c"), Mpi::OpenMpi), &prog);
    let script = dir.join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{before}exec mpirun.openmpi --oversubscribe -np 2 {prog} {args}\n",
            prog = prog.display(),
        ),
    )
    .expect("job script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (prog, script)
}

/// A job of nobody's, submitted with `sbatch` to a real slurmctld and run by slurmd in the
/// cgroup Slurm makes for it, under the node daemon: the daemon names its ranks by the
/// Slurm job's id (from that cgroup: root's), the prolog finds the daemon answering and
/// says nothing, and the epilog writes the report files, exact against the ranks' truth
/// and nobody's only. A process of root's outside Slurm that claims the same
/// `SLURM_JOB_ID` in its environment is kept apart (`<id>.u0`) and is not in the job's
/// report. A job that makes no MPI call leaves no report directory and no message.
#[test]
fn a_slurm_job_is_profiled_under_its_id_and_its_epilog_writes_its_exact_report() {
    let scratch = Scratch::new("slurm");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let reports = scratch.path("reports");
    let prolog = slurm_script(&scratch, "prolog.sh", &daemon, &reports);
    let epilog = slurm_script(&scratch, "epilog.sh", &daemon, &reports);
    let slurm = Slurm::start(&scratch, &prolog, &epilog);

    let dir = nobody_dir(&scratch, "job");
    let (prog, script) = loop_job(&dir, "");
    let job = slurm.sbatch_as_nobody(2, &dir, &script);
    wait_until("the Slurm job's ranks to be ready", LIMIT, || {
        (0..2).all(|r| dir.join(format!("ready.{r}")).exists())
    });
    let ranks: Vec<u64> = pids_running(&prog).into_iter().map(u64::from).collect();
    assert_eq!(ranks.len(), 2, "{ranks:?}");

    // Root's claim of the same id, outside Slurm.
    let claim = Scratch::new("slurm-claim");
    let (mut claimer, claim_ranks) =
        start_waiting_loop(&claim, Mpi::OpenMpi, 2, ITERS, &[("SLURM_JOB_ID", &job)]);
    let claim_ranks: Vec<u64> = claim_ranks.into_iter().map(u64::from).collect();
    let claimed = format!("{job}.u0");
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let jobs = ps_field(&daemon.target, "job");
        if ranks.iter().all(|p| jobs.get(p) == Some(&job))
            && claim_ranks.iter().all(|p| jobs.get(p) == Some(&claimed))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Slurm's ranks {ranks:?} should be job {job}, root's {claim_ranks:?} {claimed}: {jobs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    std::fs::write(dir.join("go"), b"go").expect("go file");
    std::fs::write(claim.path("go"), b"go").expect("go file");
    slurm.wait_completed(&job, LIMIT);
    assert!(
        claimer.wait_with_limit(LIMIT).success(),
        "root's job failed"
    );

    assert_eq!(script_result(&prolog, &job), ("0".into(), String::new()));
    assert_eq!(script_result(&epilog, &job), ("0".into(), String::new()));
    let profile = assert_epilog_report(&reports, &job, NOBODY, &read_truths(&dir.join("truth"), 2));
    let mpitrace = std::fs::read_to_string(
        reports
            .join(&job)
            .join(&slurm.node)
            .join(format!("mpi_profile.{job}.0")),
    )
    .expect("rank 0's mpitrace file");
    assert!(mpitrace.contains("MPI_Allreduce"), "{mpitrace}");
    assert_eq!(profile["ranks"].as_array().map(Vec::len), Some(2));

    // Root's claim is its own job, whole.
    let claimed_profile = report_json(&["report", "--from", &daemon.target, "--job", &claimed]);
    assert_loop_ranks(&claimed_profile, &read_truths(&claim.path("truth"), 2));

    // No MPI: no report, no message.
    let plain = dir.join("plain.sh");
    std::fs::write(&plain, "#!/bin/sh\ntrue\n").expect("script");
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let quiet = slurm.sbatch_as_nobody(1, &dir, &plain);
    slurm.wait_completed(&quiet, LIMIT);
    assert_eq!(script_result(&epilog, &quiet), ("0".into(), String::new()));
    assert!(
        !reports.join(&quiet).exists(),
        "a job without MPI leaves nothing"
    );
    drop(slurm);
    daemon.stop(&scratch);
}

/// A hung job of nobody's, cancelled (`scancel`, as a user or a time limit ends one): its
/// epilog's report says how each rank ended and where. Rank 0 was blocked in an
/// `MPI_Barrier` (seen live first: a second or more in it), rank 1 outside MPI waiting for
/// a go that never comes: the report has rank 0 killed inside `MPI_Barrier` and rank 1 in no
/// call, the rank the job waited for.
#[test]
fn a_cancelled_hung_slurm_jobs_epilog_report_says_where_each_rank_was() {
    let scratch = Scratch::new("slurm-hung");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let reports = scratch.path("reports");
    let prolog = slurm_script(&scratch, "prolog.sh", &daemon, &reports);
    let epilog = slurm_script(&scratch, "epilog.sh", &daemon, &reports);
    let slurm = Slurm::start(&scratch, &prolog, &epilog);

    let dir = nobody_dir(&scratch, "job");
    let d = dir.display();
    let (_, script) = mpi_job(&dir, "mpi_hang", "", &format!("1 3 {d}/go {d}/truth"));
    let job = slurm.sbatch_as_nobody(2, &dir, &script);

    wait_for_rank_0_hung_in_its_barrier(&daemon.target, &job, LIMIT);
    let cancelled = slurm
        .command("scancel")
        .arg(&job)
        .status()
        .expect("running scancel");
    assert!(cancelled.success());
    assert_eq!(slurm.wait_ended(&job, LIMIT), "CANCELLED");
    assert_eq!(script_result(&epilog, &job), ("0".into(), String::new()));

    let out = reports.join(&job).join(&slurm.node);
    let profile = read_json(&out.join("profile.json"));
    let (zero, one) = (
        rank_numbered(&profile, 0)["ended"].clone(),
        rank_numbered(&profile, 1)["ended"].clone(),
    );
    assert_eq!(zero["inside"]["routine"], "MPI_Barrier", "{zero}");
    assert!(one.is_object() && one.get("inside").is_none(), "{one}");
    for ended in [&zero, &one] {
        // Ended by Slurm's signal (or an MPI's exit with an error once its peer was gone).
        assert!(
            ended["signal"].as_u64().is_some() || ended["status"].as_u64().is_some_and(|s| s != 0),
            "{ended}"
        );
    }
    let report = std::fs::read_to_string(out.join("report.txt")).expect("report.txt");
    let rows = report_rows(&report, "Ranks that did not end normally: 2 of 2");
    let row = |rank: &str| {
        rows.iter()
            .find(|l| l.split_whitespace().next() == Some(rank))
            .copied()
            .unwrap_or_else(|| panic!("no row of rank {rank}: {report}"))
    };
    assert!(row("0").contains(" inside MPI_Barrier ("), "{report}");
    assert!(!row("1").contains(" inside "), "{report}");
    drop(slurm);
    daemon.stop(&scratch);
}

/// A daemon started for one Slurm job (`--slurm-job ID`, as a site that profiles chosen
/// jobs only would start one) counts that job's ranks from their first call, exactly, and
/// never those of the same user's other job running beside it on the node: the kernel
/// tells them apart by the job's cgroup, v1 (Slurm on a hybrid host, as here) or v2. A
/// node daemon beside it sees both. A job that is not on the node is a clear error.
#[test]
fn a_daemon_for_one_slurm_job_counts_that_jobs_ranks_only() {
    let scratch = Scratch::new("slurm-one-job");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let reports = scratch.path("reports");
    let prolog = slurm_script(&scratch, "prolog.sh", &daemon, &reports);
    let epilog = slurm_script(&scratch, "epilog.sh", &daemon, &reports);
    let slurm = Slurm::start(&scratch, &prolog, &epilog);

    // Two jobs of nobody's, each waiting for `start` before its ranks begin.
    let jobs: Vec<(String, PathBuf, PathBuf)> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let dir = nobody_dir(&scratch, name);
            let wait = format!(
                "touch {d}/started\nwhile [ ! -e {d}/start ]; do sleep 0.05; done\n",
                d = dir.display()
            );
            let (prog, script) = loop_job(&dir, &wait);
            (slurm.sbatch_as_nobody(2, &dir, &script), dir, prog)
        })
        .collect();
    wait_until("both jobs to run", LIMIT, || {
        jobs.iter().all(|(_, dir, _)| dir.join("started").exists())
    });

    let one = Scratch::new("slurm-one-job-daemon");
    let socket = one.path("missing.sock");
    let socket = socket.to_str().expect("utf-8 path");
    let missing = commtap_output(&["daemon", "--socket", socket, "--slurm-job", "999999999"]);
    assert!(!missing.status.success());
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains("no cgroup job_999999999 of root's"), "{said}");

    let (job, dir, prog) = &jobs[0];
    let (other, other_dir, other_prog) = &jobs[1];
    let scoped = Daemon::start(&one, &[], &[], &["--slurm-job", job]);
    // One job after the other: two of one user's Open MPI 4.1 `mpirun`s starting at once
    // race to create its session directory (`/tmp/ompi.<host>.<uid>`), and the loser fails
    // ("mkdir ... File exists", seen in CI). Both then run side by side until `go`.
    for (_, dir, _) in &jobs {
        std::fs::write(dir.join("start"), b"start").expect("start file");
        wait_until("the job's ranks to be ready", LIMIT, || {
            (0..2).all(|r| dir.join(format!("ready.{r}")).exists())
        });
    }
    let pids = |prog: &Path| -> Vec<u64> {
        let mut pids: Vec<u64> = pids_running(prog).into_iter().map(u64::from).collect();
        assert_eq!(pids.len(), 2, "{pids:?}");
        pids.sort_unstable();
        pids
    };
    let (ranks, others) = (pids(prog), pids(other_prog));
    // Every rank has made its first calls: the node daemon counts both jobs, each under its
    // id; the job's daemon decided at the others' first call not to count them.
    let mut seen = Default::default();
    wait_until("the node daemon to list both jobs' ranks", LIMIT, || {
        seen = ps_field(&daemon.target, "job");
        ranks.iter().all(|p| seen.get(p) == Some(job))
            && others.iter().all(|p| seen.get(p) == Some(other))
    });
    wait_until("the job's daemon to list its ranks", LIMIT, || {
        seen = ps_field(&scoped.target, "job");
        ranks.iter().all(|p| seen.get(p) == Some(job))
    });
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), ranks, "{seen:?}");

    for (_, dir, _) in &jobs {
        std::fs::write(dir.join("go"), b"go").expect("go file");
    }
    for (id, ..) in &jobs {
        slurm.wait_completed(id, LIMIT);
    }
    wait_for_exited(&scoped.target, &ranks);
    // Exited processes stay listed: the job's two ranks were all it ever counted.
    let seen = ps_field(&scoped.target, "job");
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), ranks, "{seen:?}");
    let profile = report_json(&["report", "--from", &scoped.target, "--job", job]);
    assert_eq!(profile["ranks"].as_array().map(Vec::len), Some(2));
    assert_loop_ranks(&profile, &read_truths(&dir.join("truth"), 2));
    // The other job made its calls meanwhile: its truths are written.
    assert_eq!(read_truths(&other_dir.join("truth"), 2).len(), 2);
    drop(slurm);
    scoped.stop(&one);
    daemon.stop(&scratch);
}

/// systemd delegates `user@UID.service` to its user, who may make cgroups below it and move
/// into them. A user who names one `job_<id>` does not make their ranks that Slurm job:
/// the daemon believes only job cgroups root made (here: a cgroup given to nobody as systemd
/// gives one, nobody's `job_<id>` inside).
#[test]
fn a_users_own_cgroup_named_like_a_slurm_job_does_not_make_its_ranks_that_job() {
    use std::os::unix::fs::chown;
    let scratch = Scratch::new("slurm-fake-cgroup");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let delegated = CgroupGuard::new("commtap-delegated");
    for f in [
        "",
        "cgroup.procs",
        "cgroup.threads",
        "cgroup.subtree_control",
    ] {
        chown(delegated.0.join(f), Some(NOBODY), Some(NOBODY)).expect("delegating the cgroup");
    }
    let job = format!("{}", 7_000_000 + std::process::id());
    let fake = CgroupGuard(delegated.0.join(format!("job_{job}")));
    let dir = nobody_dir(&scratch, "job");
    let (prog, script) = loop_job(&dir, "");
    // Root puts the shell in the delegated cgroup (as systemd starts the user's manager
    // there); from then on, everything is nobody's doing.
    let mut run = ChildGuard::spawn(Command::new("sh").arg("-c").arg(format!(
        "echo $$ > {d}/cgroup.procs && exec setpriv --reuid=65534 --regid=65534 \
         --clear-groups -- sh -c 'mkdir {f} && echo $$ > {f}/cgroup.procs && exec {script}'",
        d = delegated.0.display(),
        f = fake.0.display(),
        script = script.display(),
    )));
    wait_until("the ranks to be ready", LIMIT, || {
        (0..2).all(|r| dir.join(format!("ready.{r}")).exists())
    });
    let ranks: Vec<u64> = pids_running(&prog).into_iter().map(u64::from).collect();
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    for pid in &ranks {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
        assert!(cgroup.contains(&format!("/job_{job}\n")), "{cgroup}");
    }
    let mut jobs = Default::default();
    wait_until("the daemon to list the ranks", LIMIT, || {
        jobs = ps_field(&daemon.target, "job");
        ranks.iter().all(|p| jobs.contains_key(p))
    });
    std::fs::write(dir.join("go"), b"go").expect("go file");
    assert!(run.wait_with_limit(LIMIT).success(), "the job failed");
    wait_for_exited(&daemon.target, &ranks);
    for pid in &ranks {
        assert_ne!(
            jobs.get(pid),
            Some(&job),
            "pid {pid} taken for Slurm job {job}"
        );
    }
    // Named by its launcher instead: one job, both ranks.
    assert_eq!(jobs.get(&ranks[0]), jobs.get(&ranks[1]));
    drop(fake);
    daemon.stop(&scratch);
}
