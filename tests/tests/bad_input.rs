//! Bad input gets a clear message and a non-zero exit, never a panic; what could not be
//! measured is counted and shown.

use std::{process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(5);

#[track_caller]
fn assert_clear_failure(run: &Run, needle: &str) {
    assert_eq!(
        run.status.code(),
        Some(2),
        "exit status; stderr:\n{}",
        run.stderr
    );
    assert!(
        run.stderr.contains(needle),
        "stderr lacks {needle:?}:\n{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("panicked"),
        "commtap panicked:\n{}",
        run.stderr
    );
}

#[test]
fn a_pid_that_does_not_exist_is_refused() {
    let scratch = Scratch::new("no-such-pid");
    // pid_max is at most 2^22: this pid cannot exist.
    let run = run_commtap(&scratch, &["record", "--pid", "4194305"], LIMIT);
    assert_clear_failure(&run, "no process with PID 4194305");
}

#[test]
fn a_process_that_is_not_mpi_is_refused() {
    let scratch = Scratch::new("not-mpi");
    let sleeper = ChildGuard::spawn(Command::new("sleep").arg("60"));
    let pid = sleeper.0.id().to_string();
    let run = run_commtap(&scratch, &["record", "--pid", &pid], LIMIT);
    assert_clear_failure(&run, "not an MPI or NCCL process");
}

#[test]
fn nothing_to_record_is_a_usage_error() {
    let scratch = Scratch::new("no-target");
    let run = run_commtap(&scratch, &["record"], LIMIT);
    assert_clear_failure(&run, "nothing to record");
}

#[test]
fn a_user_without_privileges_is_told_what_is_needed() {
    let scratch = Scratch::new("non-root");
    // Drop to nobody with no capabilities.
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(commtap_bin())
        .args(["record", "--pid", "1"])
        .output()
        .expect("running setpriv (util-linux)");
    let run = Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    drop(scratch);
    assert_clear_failure(&run, "commtap needs root");
}

#[test]
fn a_job_killed_while_recorded_still_gets_a_report() {
    let scratch = Scratch::new("killed");
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 10, &[]);
    let (commtap, out) = record_attached(&scratch, &ranks);
    // SAFETY: kill(2) of a rank we found running.
    unsafe { libc::kill(ranks[0] as i32, libc::SIGKILL) };
    let _ = job.wait_with_limit(LIMIT);
    let run = finish_commtap(&scratch, commtap, LIMIT);
    // Nothing was called while watched: a clear message, no panic.
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("no MPI calls were recorded"),
        "{}",
        run.stderr
    );
    let profile = read_json(&out);
    let not_profiled = profile["not_profiled"].as_array().expect("not_profiled");
    assert_eq!(not_profiled.len(), 2, "{profile:#}");
}

/// Every file `record` is to write is checked before the job runs: a job of hours must not
/// end in "No such file or directory" with its profile lost.
#[test]
fn an_output_that_cannot_be_written_fails_before_the_job_runs() {
    let scratch = Scratch::new("bad-outputs");
    let dir = scratch.path("a-directory");
    std::fs::create_dir(&dir).expect("dir");
    let file = scratch.path("a-file");
    std::fs::write(&file, "mine").expect("file");
    let missing = scratch.path("missing/profile.txt");
    // Root writing through a link left in a shared directory would write where it points.
    let link = scratch.path("a-link");
    std::os::unix::fs::symlink(&file, &link).expect("symlink");
    let cases: [(&str, &std::path::Path, &str); 6] = [
        ("-o", &missing, "no directory"),
        (
            "--json",
            &link,
            "it is a symbolic link, which commtap does not follow",
        ),
        ("-o", &dir, "it is a directory"),
        ("--json", &dir, "it is a directory"),
        ("--html", &missing, "no directory"),
        ("--mpitrace-dir", &file, "it is not a directory"),
    ];
    for (flag, path, why) in cases {
        let marker = scratch.path("the-job-ran");
        let run = run_commtap(
            &scratch,
            &[
                "record",
                flag,
                path_str(path),
                "--",
                "touch",
                path_str(&marker),
            ],
            LIMIT,
        );
        assert_clear_failure(&run, &format!("{flag} {}: {why}", path.display()));
        assert!(!marker.exists(), "{flag} {}: the job ran", path.display());
    }
    assert_eq!(std::fs::read_to_string(&file).expect("file"), "mine");
}

/// A run that recorded nothing writes an empty profile only where no file is: an earlier
/// run's profile, JSON and trace are left as they were, and the message says so; a trace
/// with no call writes no file.
#[test]
fn a_run_that_records_nothing_leaves_earlier_files_as_they_were() {
    let scratch = Scratch::new("nothing-recorded");
    let earlier = [
        (scratch.path("profile.txt"), "an earlier profile\n"),
        (scratch.path("profile.json"), "{\"earlier\": true}\n"),
        (scratch.path("trace.json"), "an earlier trace\n"),
    ];
    for (path, text) in &earlier {
        std::fs::write(path, text).expect("earlier file");
    }
    let html = scratch.path("new.html");
    let new_trace = scratch.path("new.pftrace");
    let run = run_commtap(
        &scratch,
        &[
            "record",
            "-o",
            path_str(&earlier[0].0),
            "--json",
            path_str(&earlier[1].0),
            "--trace",
            path_str(&earlier[2].0),
            "--html",
            path_str(&html),
            "--trace",
            path_str(&new_trace),
            "--",
            "true",
        ],
        LIMIT,
    );
    assert_clear_failure(&run, "no MPI calls were recorded");
    assert!(run.stderr.contains("left as they were"), "{}", run.stderr);
    assert!(run.stderr.contains("trace: no calls"), "{}", run.stderr);
    for (path, text) in &earlier {
        assert_eq!(
            &std::fs::read_to_string(path).expect("earlier file"),
            text,
            "{}",
            path.display()
        );
    }
    // A trace with no call is no file.
    assert!(!new_trace.exists(), "{}", run.stderr);
    assert!(run.stderr.contains("not written"), "{}", run.stderr);
    // A file that was not there gets the empty report: it says why nothing was seen.
    let page = std::fs::read_to_string(&html).expect("the new page");
    assert!(page.contains("no process mapped an MPI"), "{page}");
}

/// A job that fails gives `record` its exit status, so that a batch script wrapping it sees
/// the failure; its profile is written all the same, exact.
#[test]
fn a_failed_job_gives_its_exit_status_and_keeps_its_profile() {
    let scratch = Scratch::new("failed-job");
    let mpi = Mpi::Mpich;
    let prog = build_program("mpi_truth.c", mpi);
    let prefix = scratch.path("truth");
    let out = scratch.path("profile.json");
    let mut args: Vec<String> = ["record", "--format", "json", "-o", path_str(&out), "--"]
        .map(String::from)
        .to_vec();
    // The job runs to its end, then its script fails.
    args.extend(["sh", "-c", "\"$@\" && exit 7", "sh"].map(String::from));
    args.extend(mpi.launcher(2));
    args.extend([path_str(&prog), path_str(&prefix)].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let commtap = spawn_commtap_with_env(&scratch, &args, &mpi.job_env());
    let run = finish_commtap(&scratch, commtap, LIMIT);
    assert_eq!(run.status.code(), Some(7), "{}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let profile = read_json(&out);
    assert_profile_matches(&profile, &read_truths(&prefix, 2), &["MPI_Finalize"]);
}

/// `record`'s standard output closed before the report (`record ... | head`): the files it
/// was asked for are written all the same, and the job's status is still its exit status.
#[test]
fn a_closed_standard_output_costs_no_file() {
    let scratch = Scratch::new("closed-stdout");
    let mpi = Mpi::Mpich;
    let prog = build_program("mpi_truth.c", mpi);
    let prefix = scratch.path("truth");
    let json = scratch.path("profile.json");
    let html = scratch.path("report.html");
    let mut cmd = Command::new(commtap_bin());
    cmd.args([
        "record",
        "--json",
        path_str(&json),
        "--html",
        path_str(&html),
        "--",
    ])
    // The job's own output elsewhere: only the report meets the closed pipe.
    .args(["sh", "-c", "\"$@\" > /dev/null && exit 7", "sh"])
    .args(mpi.launcher(2))
    .args([path_str(&prog), path_str(&prefix)])
    .envs(mpi.job_env())
    .stdout(std::process::Stdio::piped())
    .stderr(std::fs::File::create(scratch.path("stderr")).expect("stderr file"));
    let mut record = ChildGuard::spawn(&mut cmd);
    drop(record.0.stdout.take());
    let status = record.wait_with_limit(LIMIT);
    let stderr = std::fs::read_to_string(scratch.path("stderr")).expect("stderr");
    assert_eq!(status.code(), Some(7), "{stderr}");
    assert_profile_matches(
        &read_json(&json),
        &read_truths(&prefix, 2),
        &["MPI_Finalize"],
    );
    assert!(
        std::fs::read_to_string(&html).is_ok_and(|page| page.contains("MPI_Allreduce")),
        "{stderr}"
    );
}

/// A stop signal sent to `record` alone (a script's `kill`; a terminal's Ctrl-C reaches the
/// job too) is passed on to the job it launched: the job ends rather than run on
/// unprofiled, its ranks' calls until then are reported, and `record` exits with the job's
/// failure, not 0.
#[test]
fn a_signal_to_record_alone_ends_the_job_it_launched() {
    let scratch = Scratch::new("signal-to-record");
    let mpi = Mpi::OpenMpi;
    let prog = build_program("mpi_loop.c", mpi);
    let out = scratch.path("profile.json");
    let files = [
        scratch.path("ready"),
        scratch.path("go"),
        scratch.path("truth"),
    ];
    let mut args: Vec<String> = ["record", "--format", "json", "-o"]
        .map(String::from)
        .to_vec();
    args.push(out.display().to_string());
    args.push("--".into());
    args.extend(mpi.mpi_loop(2, &prog, [&files[0], &files[1], &files[2]], 10));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let commtap = spawn_commtap_with_env(&scratch, &args, &mpi.job_env());
    wait_until("every rank to be ready", LIMIT, || {
        (0..2).all(|r| scratch.path(&format!("ready.{r}")).exists())
    });
    let ranks = pids_running(&prog);
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    // SAFETY: kill(2) of the commtap we spawned; the job never gets the go, so it only
    // ends if the signal is passed on.
    unsafe { libc::kill(commtap.0.id() as i32, libc::SIGINT) };
    let run = finish_commtap(&scratch, commtap, LIMIT);
    assert!(
        run.stderr.contains("passing SIGINT on to it"),
        "{}",
        run.stderr
    );
    assert!(!run.status.success(), "{}\n{}", run.status, run.stderr);
    let profile = read_json(&out);
    let inits: Vec<u64> = profile["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| r["routines"]["MPI_Init"]["calls"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(inits, [1, 1], "{profile:#}");
    wait_until("the ranks to end", LIMIT, || {
        ranks
            .iter()
            .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
    });
}
