//! Latency distributions: a real Open MPI and MPICH job whose rank 0 makes MPI_Sendrecv
//! calls that each wait for a known sleep of rank 1 (`mpi_durations.c`): every call lands
//! in a log2 bucket between those of its sleep and of rank 0's own timing around it (the
//! same bucket on an idle machine), the fastest and slowest within the same bounds, and
//! the text report shows them. And sampled time: MPI_Wait calls of known durations timed
//! one in two, their time estimated within its stated error.

use std::time::Duration;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

/// Sleeps in microseconds, each 1.3 x a power of two nanoseconds (2^25, 2^27, 2^29): on
/// an idle machine a call lasts its sleep plus a message's latency and lands in its sleep's
/// bucket; on a loaded one (the waking rank waits for a core its busy-polling peer holds)
/// it may land higher, and the test takes the program's own timing around each call as its
/// upper bound, never a guess at the oversleep.
const SLEEPS_US: [u64; 6] = [43_620, 43_620, 43_620, 174_483, 174_483, 697_932];

/// Runs `record RECORD -- LAUNCHER(2) mpi_durations PREFIX PROGRAM...` and returns the two
/// ranks' truths.
fn run_durations(
    scratch: &Scratch,
    mpi: Mpi,
    record: &[&str],
    program: &[String],
) -> Vec<serde_json::Value> {
    let prog = build_program("mpi_durations.c", mpi);
    let prefix = scratch.path("truth");
    let mut args: Vec<String> = vec!["record".into()];
    args.extend(record.iter().map(|a| (*a).to_string()));
    args.push("--".into());
    args.extend(mpi.launcher(2));
    args.push(prog.display().to_string());
    args.push(prefix.display().to_string());
    args.extend(program.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(scratch, spawn_commtap(scratch, &args), LIMIT);
    read_truths(&prefix, 2)
}

fn durations_land_in_their_buckets(mpi: Mpi) {
    let scratch = Scratch::new(&format!("durations-{}", mpi.suffix()));
    let (json, text) = (scratch.path("profile.json"), scratch.path("report.txt"));
    let program: Vec<String> = SLEEPS_US.map(|s| s.to_string()).to_vec();
    let truths = run_durations(
        &scratch,
        mpi,
        &["--json", path_str(&json), "-o", path_str(&text)],
        &program,
    );
    let profile = read_json(&json);
    let list = |key: &str| -> Vec<u64> {
        truths[0][key]
            .as_array()
            .unwrap_or_else(|| panic!("{key}"))
            .iter()
            .map(|s| s.as_u64().expect("ns"))
            .collect()
    };
    let (sleeps, took) = (list("sleeps_ns"), list("took_ns"));
    assert_eq!(sleeps.len(), SLEEPS_US.len());
    assert_eq!(took.len(), SLEEPS_US.len());
    let rank0 = rank_by_pid(&profile, truths[0]["pid"].as_u64().expect("pid"));
    let sendrecv = &rank0["routines"]["MPI_Sendrecv"];
    assert_eq!(sendrecv["calls"], sleeps.len(), "{sendrecv}");
    assert_durations_account_for_calls(sendrecv, "MPI_Sendrecv");

    // Call i lasted, as the probes saw it, at least its sleep (the reply leaves after it)
    // and at most the time rank 0 measured around it: its bucket is between those of the
    // two. The histogram must be such a choice for every call (earliest-ending range takes
    // the lowest bucket left: exact for ranges on a line).
    let bucket = |ns: u64| 1u64 << ns.ilog2();
    let d = &sendrecv["durations"];
    let mut slots: Vec<u64> = Vec::new();
    for b in d["buckets"].as_array().expect("buckets") {
        let from = b["from_ns"].as_u64().expect("from");
        assert_eq!(b["to_ns"], 2 * from, "{b}");
        for _ in 0..b["calls"].as_u64().expect("calls") {
            slots.push(from);
        }
    }
    slots.sort_unstable();
    let mut ranges: Vec<(u64, u64)> = sleeps
        .iter()
        .zip(&took)
        .map(|(s, t)| {
            assert!(t >= s, "a call took {t} ns around a sleep of {s} ns");
            (bucket(*s), bucket(*t))
        })
        .collect();
    ranges.sort_by_key(|r| (r.1, r.0));
    assert_eq!(slots.len(), ranges.len(), "MPI_Sendrecv durations: {d}");
    for (lo, hi) in &ranges {
        let i = slots
            .iter()
            .position(|b| b >= lo && b <= hi)
            .unwrap_or_else(|| panic!("no call of the histogram in [{lo}, {hi}] ns: {d}; sleeps {sleeps:?}, took {took:?}"));
        slots.remove(i);
    }
    let (min, max) = (d["min_ns"].as_u64().unwrap(), d["max_ns"].as_u64().unwrap());
    let (least, most) = (*sleeps.iter().min().unwrap(), *sleeps.iter().max().unwrap());
    assert!(
        min >= least && min <= *took.iter().min().unwrap(),
        "fastest {min} ns: sleeps {sleeps:?}, took {took:?}"
    );
    assert!(
        max >= most && max <= *took.iter().max().unwrap(),
        "slowest {max} ns: sleeps {sleeps:?}, took {took:?}"
    );

    // This kernel has uprobe sessions (Linux 6.13+): every library is probed through them,
    // MPICH's UCX too.
    for l in profile["libraries"].as_array().expect("libraries") {
        assert_eq!(l["uprobe_sessions"], true, "{l}");
    }

    // Every routine of both ranks is timed, call for call.
    for rank in profile["ranks"].as_array().expect("ranks") {
        for (name, routine) in rank["routines"].as_object().expect("routines") {
            assert_durations_account_for_calls(routine, name);
        }
    }

    // The text report: the routine's line with its fastest and slowest call in microseconds.
    let report = std::fs::read_to_string(&text).expect("text report");
    let section = report
        .split("Call durations, all ranks")
        .nth(1)
        .unwrap_or_else(|| panic!("no durations section:\n{report}"));
    let line = section
        .lines()
        .find(|l| l.starts_with("MPI_Sendrecv "))
        .unwrap_or_else(|| panic!("no MPI_Sendrecv line:\n{section}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[1], sleeps.len().to_string(), "{line}");
    assert_eq!(cols[2], format!("{:.3}", min as f64 / 1e3), "{line}");
    assert_eq!(cols[6], format!("{:.3}", max as f64 / 1e3), "{line}");
}

#[test]
fn durations_land_in_their_buckets_in_an_open_mpi_job() {
    durations_land_in_their_buckets(Mpi::OpenMpi);
}

#[test]
fn durations_land_in_their_buckets_in_an_mpich_job() {
    durations_land_in_their_buckets(Mpi::Mpich);
}

/// Sleeps for the sampled-time test, microseconds: 40 calls, 2 ms and 8 ms alternating.
fn sampled_sleeps_us() -> Vec<u64> {
    (0..40)
        .map(|i| if i % 2 == 0 { 2_000 } else { 8_000 })
        .collect()
}

/// Rank 0's MPI_Wait calls, each waiting for a known sleep of rank 1, under `--time-one-in
/// 2`: calls and bytes exact, about half the Waits timed (the histogram holds exactly
/// those), and the estimated time within the stated error of the calls' true total, which
/// lies between the sum of their floors and the sum of rank 0's timings around them.
fn sampled_time_is_estimated_within_its_error(mpi: Mpi) {
    let scratch = Scratch::new(&format!("sampled-{}", mpi.suffix()));
    let json = scratch.path("profile.json");
    let sleeps_us = sampled_sleeps_us();
    let mut program = vec!["--wait".to_string()];
    program.extend(sleeps_us.iter().map(u64::to_string));
    let truths = run_durations(
        &scratch,
        mpi,
        &[
            "--no-skew",
            "--time-one-in",
            "2",
            "--format",
            "json",
            "-o",
            path_str(&json),
        ],
        &program,
    );
    let profile = read_json(&json);
    let sum = |key: &str| -> u64 {
        truths[0][key]
            .as_array()
            .unwrap_or_else(|| panic!("{key}"))
            .iter()
            .map(|s| s.as_u64().expect("ns"))
            .sum()
    };
    let (floor, took) = (sum("floors_ns"), sum("took_ns"));
    let n = sleeps_us.len() as u64;
    let rank0 = rank_by_pid(&profile, truths[0]["pid"].as_u64().expect("pid"));
    let wait = &rank0["routines"]["MPI_Wait"];
    assert_eq!(wait["calls"], n, "{wait}");
    assert_eq!(wait["bytes"], 0, "{wait}");
    let sampled = &wait["sampled_time"];
    let timed = sampled["timed_calls"].as_u64().expect("timed_calls");
    // One in two at random: none or all of 40 timed has a chance of 2^-39.
    assert!(timed > 0 && timed < n, "{wait}");
    for rank in profile["ranks"].as_array().expect("ranks") {
        for (name, routine) in rank["routines"].as_object().expect("routines") {
            assert_durations_account_for_calls(routine, name);
        }
    }
    // The error stated is a 95% interval's half-width; three of them (six standard errors)
    // make a bound that no honest estimate misses.
    let time = wait["time_ns"].as_u64().expect("time");
    let error = sampled["error_ns"].as_u64().expect("error");
    assert!(error > 0, "{wait}");
    assert!(
        time + 3 * error >= floor && time <= took + 3 * error,
        "estimated {time} ns ± {error}: the calls took between {floor} and {took} ns"
    );
    // MPI_Irecv and MPI_Send too may be sampled: exact all the same.
    for (routine, calls, bytes) in [("MPI_Irecv", n, 4 * n), ("MPI_Send", n, 4 * n)] {
        let r = &rank0["routines"][routine];
        assert_eq!(
            (&r["calls"], &r["bytes"]),
            (&calls.into(), &bytes.into()),
            "{r}"
        );
    }
}

#[test]
fn sampled_time_is_estimated_within_its_error_in_an_open_mpi_job() {
    sampled_time_is_estimated_within_its_error(Mpi::OpenMpi);
}

#[test]
fn sampled_time_is_estimated_within_its_error_in_an_mpich_job() {
    sampled_time_is_estimated_within_its_error(Mpi::Mpich);
}
