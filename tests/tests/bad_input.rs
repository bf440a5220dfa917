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
