//! What probing costs the processes commtap does not watch: with uprobe sessions (Linux
//! 6.13+), the probes of an MPI library run at each call's entry only, unless the process
//! is watched. Checked through the kernel's own count of the probe programs' runs
//! (`--probe-stats`, served in the daemon's metrics) around a known number of calls of a
//! real Open MPI and MPICH job (`mpi_loop`): a job the daemon does not watch costs one
//! run per call, one it watches two (entry and return), exactly; with time sampled, a
//! call left untimed one.

use std::time::Duration;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);
const N: u64 = 200;

/// The sum of the values of the metrics at `addr` whose lines start with `prefix`, and
/// how many there were.
fn metric_sum(addr: &str, prefix: &str) -> (u64, usize) {
    let metrics = http_get(addr, "/metrics");
    let values: Vec<u64> = metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            l.rsplit_once(' ')
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or_else(|| panic!("a count in {l:?}"))
        })
        .collect();
    (values.iter().sum(), values.len())
}

/// Runs of the MPI session programs (`sess_*` but the transports' `sess_fabric`, whose
/// UCX operations under MPICH are not the program's MPI calls) in the daemon's metrics at
/// `addr`.
fn session_runs(addr: &str) -> u64 {
    let (runs, n) = metric_sum(addr, "commtap_probe_program_runs_total{program=\"sess_");
    assert!(n > 0, "no session program in the metrics");
    let (transport, _) = metric_sum(
        addr,
        "commtap_probe_program_runs_total{program=\"sess_fabric\"",
    );
    runs - transport
}

/// MPI calls the daemon at `addr` counted, and of them those it timed (its duration
/// histograms' counts).
fn calls_and_timed(addr: &str) -> (u64, u64) {
    (
        metric_sum(addr, "commtap_mpi_calls_total{").0,
        metric_sum(addr, "commtap_mpi_call_duration_seconds_count{").0,
    )
}

/// What the loop costs: the session programs' runs while `mpi_loop` makes its counted
/// calls, the calls the job says it made, and the calls and timed calls the daemon
/// counted meanwhile.
struct LoopRuns {
    runs: u64,
    calls: u64,
    counted: u64,
    timed: u64,
}

/// Session program runs while `mpi_loop` makes its counted calls, under a daemon started
/// with `scope` (its arguments), and the calls the job says it made.
fn runs_during_the_loop(mpi: Mpi, name: &str, scope: &[&str]) -> (u64, u64) {
    let r = loop_runs(mpi, name, scope);
    (r.runs, r.calls)
}

fn loop_runs(mpi: Mpi, name: &str, scope: &[&str]) -> LoopRuns {
    let scratch = Scratch::new(&format!("{name}-{}", mpi.suffix()));
    let metrics_addr = free_port();
    let mut args = vec![
        "--probe-stats",
        "--metrics-addr",
        &metrics_addr,
        "--metrics-insecure",
    ];
    args.extend(scope);
    let daemon = Daemon::start(&scratch, &[], &[], &args);
    let hold = scratch.path("hold");
    let (mut job, _ranks) = start_waiting_loop(
        &scratch,
        mpi,
        2,
        N,
        &[("COMMTAP_TEST_HOLD", path_str(&hold))],
    );
    // The ranks wait for the go file without calling MPI, and after their counted calls
    // for the hold file: nothing else runs the probes in between.
    let watches_the_job = !scope.contains(&"--uid");
    if watches_the_job {
        // The daemon shows a rank's counts once it knows its job: both, before counting.
        wait_until("both ranks in the daemon's metrics", LIMIT, || {
            let Some(metrics) = try_http_get(&metrics_addr, "/metrics") else {
                return false;
            };
            ["rank=\"0\"", "rank=\"1\""].iter().all(|r| {
                metrics
                    .lines()
                    .any(|l| l.starts_with("commtap_mpi_calls_total{") && l.contains(r))
            })
        });
    }
    let before = session_runs(&metrics_addr);
    let counted_before = calls_and_timed(&metrics_addr);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    let prefix = scratch.path("truth");
    let truth = |r: u32| std::path::PathBuf::from(format!("{}.{r}.json", prefix.display()));
    wait_until("both ranks' truths", LIMIT, || {
        (0..2).all(|r| {
            std::fs::read(truth(r))
                .is_ok_and(|b| serde_json::from_slice::<serde_json::Value>(&b).is_ok())
        })
    });
    let after = session_runs(&metrics_addr);
    let calls: u64 = read_truths(&prefix, 2)
        .iter()
        .flat_map(|t| routine_table(&t["routines"]).into_values())
        .map(|(calls, _)| calls)
        .sum();
    // The ranks hold without calling MPI: the daemon's counts settle on what they did
    // (its metrics show a rank once it knows the rank's job), where they are read.
    let mut counted_after = calls_and_timed(&metrics_addr);
    if watches_the_job {
        wait_until("the daemon's counts of the loop", LIMIT, || {
            counted_after = calls_and_timed(&metrics_addr);
            counted_after.0 - counted_before.0 >= calls
        });
    }
    std::fs::write(&hold, b"").expect("hold file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    daemon.stop(&scratch);
    LoopRuns {
        runs: after - before,
        calls,
        counted: counted_after.0 - counted_before.0,
        timed: counted_after.1 - counted_before.1,
    }
}

fn unwatched_processes_pay_the_entry_only(mpi: Mpi) {
    // The daemon watches nobody's processes; the job is root's.
    let (runs, calls) = runs_during_the_loop(mpi, "unwatched", &["--uid", "65534"]);
    assert!(calls > 2 * N, "the loop's calls: {calls}");
    assert_eq!(
        runs, calls,
        "an unwatched process: one run per call, at entry"
    );
    // Every call timed: the default budget may thin the loop's burst of calls (it looks
    // every 40 ms), which would leave some returns unrun.
    let (runs, calls) = runs_during_the_loop(mpi, "watched", &["--time-every-call"]);
    assert_eq!(
        runs,
        2 * calls,
        "a watched process: entry and return of each call"
    );
}

/// Time sampled one call in four (`--time-one-in 4`): a call left untimed runs the session
/// program at its entry only, so the runs are the calls plus the calls timed, exactly.
fn untimed_calls_pay_the_entry_only(mpi: Mpi) {
    let r = loop_runs(mpi, "sampled", &["--no-skew", "--time-one-in", "4"]);
    assert_eq!(r.counted, r.calls, "the daemon counted the loop's calls");
    assert!(
        r.timed > 0 && r.timed < r.calls,
        "timed {} of {} calls",
        r.timed,
        r.calls
    );
    assert_eq!(
        r.runs,
        r.calls + r.timed,
        "an untimed call: one run; a timed one: two"
    );
}

/// A polling code (`mpi_poll`: 2M `MPI_Comm_rank` and 2M empty `MPI_Iprobe` on rank 0, as
/// fast as they go) under `record` as it runs by default (`--max-overhead 1`): timing every
/// call would cost it more than its time, so from the budget's first look on both are timed
/// one in thousands; every count stays exact, the collectives (who is late wants their
/// events) stay timed. Rank 1 polls beside it, slowly (2,000 of each, 1 ms apart: at most
/// 0.5% of its time in probes): the budget is each process's own, so every one of its calls
/// stays timed. Under MPICH, whose `MPI_Comm_rank` teaches the rank at its return,
/// the rank is learnt at the first call and the calls after it go untimed all the same: the
/// Allgatherv's bytes, the receive count at the rank learnt, come out exact although every
/// later call's output held a wrong rank when it began. The text report names them as where
/// the probes' estimated cost goes.
fn a_polling_code_has_its_hottest_routine_sampled(mpi: Mpi) {
    let scratch = Scratch::new(&format!("poll-{}", mpi.suffix()));
    let prog = build_program("mpi_poll.c", mpi);
    let (out, prefix) = (scratch.path("profile.json"), scratch.path("truth"));
    let text = scratch.path("report.txt");
    let mut args = record_text_and_json(&text, &out);
    args.push("--".into());
    args.extend(mpi.launcher(2));
    args.extend([
        prog.display().to_string(),
        "2000000".into(),
        prefix.display().to_string(),
        "2000".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let profile = read_json(&out);
    assert_profile_matches(&profile, &read_truths(&prefix, 2), &["MPI_Finalize"]);
    for rank in profile["ranks"].as_array().expect("ranks") {
        // Their probes' cost estimated from the programs' run as the kernel measured it
        // (BPF run-time statistics, a tenth of each second): millions of runs.
        let cost = &rank["probe_call_cost"];
        let (program_ns, runs) = (
            cost["program_ns"].as_u64().expect("program_ns"),
            cost["measured_runs"].as_u64().expect("measured_runs"),
        );
        assert!(runs >= 100_000, "{cost}");
        assert!(program_ns > 0 && program_ns < 20_000, "{cost}");
        let polls = |r: &str| &rank["routines"][r];
        for collective in ["MPI_Barrier", "MPI_Allgatherv"] {
            assert!(
                polls(collective)["sampled_time"].is_null(),
                "{collective}: {rank}"
            );
        }
        if rank["rank"] == 1 {
            for slow in ["MPI_Iprobe", "MPI_Comm_rank"] {
                assert!(
                    polls(slow)["sampled_time"].is_null(),
                    "the slow rank's {slow} sampled: {}",
                    polls(slow)
                );
            }
            continue;
        }
        for hot in ["MPI_Iprobe", "MPI_Comm_rank"] {
            let r = polls(hot);
            let (calls, timed) = (
                r["calls"].as_u64().expect("calls"),
                r["sampled_time"]["timed_calls"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{hot}'s time not sampled: {r}")),
            );
            // Timed: the calls before the budget's first look (a quarter to half a
            // second), then one in thousands.
            assert!(timed < calls / 2, "{timed} of {calls} {hot} timed");
        }
    }
    // The report says where the probes' cost goes: the two hot routines first (2M calls
    // each, against one of the others).
    let report = std::fs::read_to_string(&text).expect("text report");
    let line = report
        .lines()
        .find(|l| l.starts_with("Probes' estimated cost"))
        .unwrap_or_else(|| panic!("no estimated cost in\n{report}"));
    assert!(line.contains("measured by the kernel over"), "{line}");
    let (_, costliest) = line
        .split_once("most of it in ")
        .expect("the costliest routines");
    let mut first_two: Vec<&str> = costliest
        .split(", ")
        .take(2)
        .filter_map(|r| r.split(' ').next())
        .collect();
    first_two.sort_unstable();
    assert_eq!(first_two, ["MPI_Comm_rank", "MPI_Iprobe"], "{line}");
}

#[test]
fn a_polling_code_has_its_hottest_routine_sampled_under_open_mpi() {
    a_polling_code_has_its_hottest_routine_sampled(Mpi::OpenMpi);
}

#[test]
fn a_polling_code_has_its_hottest_routine_sampled_under_mpich() {
    a_polling_code_has_its_hottest_routine_sampled(Mpi::Mpich);
}

#[test]
fn untimed_calls_pay_the_entry_only_under_open_mpi() {
    untimed_calls_pay_the_entry_only(Mpi::OpenMpi);
}

#[test]
fn untimed_calls_pay_the_entry_only_under_mpich() {
    untimed_calls_pay_the_entry_only(Mpi::Mpich);
}

#[test]
fn unwatched_processes_pay_the_entry_only_under_open_mpi() {
    unwatched_processes_pay_the_entry_only(Mpi::OpenMpi);
}

#[test]
fn unwatched_processes_pay_the_entry_only_under_mpich() {
    unwatched_processes_pay_the_entry_only(Mpi::Mpich);
}

/// Without uprobe sessions (an older kernel, or `COMMTAP_UPROBE_SESSIONS=0`), MPI is probed
/// with an entry and a return probe per routine, as before: a launched `mpi_truth` job is
/// still counted exactly, and the profile says which way each library was probed.
fn without_sessions_counts_stay_exact(mpi: Mpi) {
    let scratch = Scratch::new(&format!("no-sessions-{}", mpi.suffix()));
    let prog = build_program("mpi_truth.c", mpi);
    let (out, prefix) = (scratch.path("profile.json"), scratch.path("truth"));
    let mut args: Vec<String> = ["record", "--format", "json", "-o", path_str(&out), "--"]
        .map(String::from)
        .to_vec();
    args.extend(mpi.launcher(2));
    args.extend([prog.display().to_string(), prefix.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [("COMMTAP_UPROBE_SESSIONS", "0".to_string())];
    finish_ok(
        &scratch,
        spawn_commtap_with_env(&scratch, &args, &env),
        LIMIT,
    );
    let profile = read_json(&out);
    assert_profile_matches(&profile, &read_truths(&prefix, 2), &["MPI_Finalize"]);
    let libraries = profile["libraries"].as_array().expect("libraries");
    assert!(!libraries.is_empty());
    for l in libraries {
        assert_eq!(l["uprobe_sessions"], false, "{l}");
    }
}

#[test]
fn without_sessions_open_mpi_counts_stay_exact() {
    without_sessions_counts_stay_exact(Mpi::OpenMpi);
}

#[test]
fn without_sessions_mpich_counts_stay_exact() {
    without_sessions_counts_stay_exact(Mpi::Mpich);
}

/// A job whose hot routine is a collective (`mpi_loop`: 100,000 `MPI_Allreduce` and as many
/// `MPI_Send`/`MPI_Recv` a rank, the go file there from the start): who is late times the
/// instances every rank draws (all of the world's first 1,024, then one in 2 to 64), so the
/// budget samples the others, and no line says the Allreduce is timed at every call; with
/// `--no-skew` the budget samples all of them. Counts are exact in both.
#[test]
fn a_hot_collective_is_sampled_past_the_instances_who_is_late_draws() {
    let mpi = Mpi::OpenMpi;
    let prog = build_program("mpi_loop.c", mpi);
    // A second of calls or more: the budget, which looks every 40 ms, acts well inside it.
    let n: u64 = 100_000;
    let kept_line = |extra: &[&str]| {
        let scratch = Scratch::new(&format!("kept-timed{}", extra.join("")));
        let (text, out) = (scratch.path("report.txt"), scratch.path("profile.json"));
        let (ready, go, truth) = (
            scratch.path("ready"),
            scratch.path("go"),
            scratch.path("truth"),
        );
        std::fs::write(&go, b"go").expect("go file");
        let mut args = record_text_and_json(&text, &out);
        args.extend(extra.iter().map(|a| (*a).to_string()));
        args.push("--".into());
        args.extend(mpi.mpi_loop(2, &prog, [&ready, &go, &truth], n));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        finish_ok(
            &scratch,
            spawn_commtap_with_env(&scratch, &args, &mpi.job_env()),
            LIMIT,
        );
        let profile = read_json(&out);
        for t in &read_truths(&truth, 2) {
            assert_mpi_loop_matches(&profile, t, n);
        }
        let report = std::fs::read_to_string(&text).expect("text report");
        let estimate = report
            .lines()
            .position(|l| l.starts_with("Probes' estimated cost"))
            .unwrap_or_else(|| panic!("no estimated cost in\n{report}"));
        let next = report.lines().nth(estimate + 1).unwrap_or("").to_string();
        (profile, next)
    };
    let drawn = (0..n)
        .filter(|i| collector_common::instances::drawn(*i))
        .count() as u64;
    for extra in [&[][..], &["--no-skew"][..]] {
        let (profile, line) = kept_line(extra);
        assert!(!line.contains("timed at every call"), "{extra:?}: {line}");
        for rank in profile["ranks"].as_array().expect("ranks") {
            let timed = rank["routines"]["MPI_Allreduce"]["sampled_time"]["timed_calls"]
                .as_u64()
                .unwrap_or_else(|| panic!("{extra:?}: MPI_Allreduce not sampled: {rank}"));
            assert!(timed < n, "{extra:?}: {timed} of {n}");
            // Who is late's events: the drawn instances (the program's few barriers among
            // them), where every Allreduce sent one before.
            let events = rank["events"].as_u64().expect("events");
            if extra.is_empty() {
                assert!(
                    (drawn..drawn + 8).contains(&events),
                    "{events}, {drawn} drawn"
                );
            } else {
                assert_eq!(events, 0, "{extra:?}");
            }
        }
    }
}
