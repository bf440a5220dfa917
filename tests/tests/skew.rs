//! Who is late: real Open MPI and MPICH jobs with a known late rank (`mpi_late.c`),
//! launched and attached mid-job. The report must name that rank for every phase in which
//! it sleeps, book what it made the others wait, see no one standing out where nobody
//! sleeps, and keep the instances of two sibling communicators apart.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use commtap_tests::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_mins(5);
/// Ranks of the job (4 on 2 cores: oversubscribed, as CI is).
const NP: u32 = 4;
/// The late rank.
const LATE: u64 = 2;
/// How long it sleeps before each collective, ms.
const DELAY_MS: u64 = 50;
/// Collectives per phase.
const N: u64 = 20;

/// The skew entry of `routine` in size bucket `bucket`.
#[track_caller]
fn routine<'a>(skew: &'a Value, routine: &str, bucket: u64) -> &'a Value {
    skew["routines"]
        .as_array()
        .expect("routines")
        .iter()
        .find(|r| r["routine"] == routine && r["bucket"] == bucket)
        .unwrap_or_else(|| panic!("no {routine} in bucket {bucket}: {skew:#}"))
}

/// `caused` is `n` delays, within 20%.
#[track_caller]
fn about_n_delays(caused: u64, n: u64, what: &str) {
    let want = n * DELAY_MS * 1_000_000;
    assert!(
        caused >= want * 8 / 10 && caused <= want * 12 / 10,
        "{what}: caused {caused} ns, want {want} ns within 20%"
    );
}

/// A phase in which rank `late` sleeps before each of `n` instances.
#[track_caller]
fn assert_late_phase(skew: &Value, name: &str, bucket: u64, late: u64, n: u64) {
    let r = routine(skew, name, bucket);
    assert_eq!(r["instances"], n, "{name} {bucket}: {r:#}");
    let most = &r["most_last"];
    assert_eq!(most["rank"], late, "{name} {bucket}: {r:#}");
    let last = most["last"].as_u64().expect("last");
    assert!(
        last * 100 >= n * 95,
        "{name} {bucket}: last in {last} of {n}"
    );
    about_n_delays(most["caused_ns"].as_u64().expect("caused"), last, name);
}

/// Starts `mpi_late` with `extra` arguments after the common ones, as `cmd` would run it
/// (under `record`, or alone beside a daemon).
fn late_job_args(mpi: Mpi, prefix: &Path) -> Vec<String> {
    let mut args = mpi.launcher(NP);
    args.extend([
        build_program("mpi_late.c", mpi).display().to_string(),
        LATE.to_string(),
        DELAY_MS.to_string(),
        N.to_string(),
        prefix.display().to_string(),
    ]);
    args
}

/// The report of a whole `mpi_late` job (six phases) names the right ranks.
#[track_caller]
fn assert_late_job(profile: &Value) {
    let skew = &profile["skew"];
    // Seven phases' worth: five on the world or its duplicate, two halves of N each.
    assert_eq!(skew["instances"], 7 * N, "{skew:#}");
    for counter in ["incomplete", "unidentified", "unaligned", "lost"] {
        assert_eq!(skew[counter], 0, "{counter}: {skew:#}");
    }

    // Rank LATE sleeps: 8-byte and 4-byte (on the duplicate) Allreduce, Bcast from it
    // (16 bytes), Barrier.
    let host = profile["ranks"][0]["host"].as_str().expect("host");
    for (name, bucket, bytes) in [
        ("MPI_Allreduce", 2, "5-8 B"),
        ("MPI_Allreduce", 1, "1-4 B"),
        ("MPI_Bcast", 3, "9-16 B"),
        ("MPI_Barrier", 0, "0 B"),
    ] {
        assert_late_phase(skew, name, bucket, LATE, N);
        // The Bcast's root is the late rank: the others waited for it as root.
        let sentence = if name == "MPI_Bcast" {
            format!("rank {LATE} ({host}), the root, arrived late in")
        } else {
            format!("rank {LATE} ({host}) arrived last in")
        };
        let routine = format!("of {name} ({bytes}) instances");
        assert!(
            skew["findings"]
                .as_array()
                .expect("findings")
                .iter()
                .any(|f| f
                    .as_str()
                    .is_some_and(|f| f.starts_with(&sentence) && f.contains(&routine))),
            "no finding for {name} {bytes}: {skew:#}"
        );
    }
    // Nobody sleeps before the 2048-byte Allreduce: skew near zero, the late rank of the
    // other phases not named. (With 4 ranks busy-polling on 2 cores, the rank the
    // scheduler runs last may be a few ms late in most instances, and said so.)
    let quiet = routine(skew, "MPI_Allreduce", 10);
    assert_eq!(quiet["instances"], N);
    let p50 = quiet["skew_ns"]["p50"].as_u64().expect("p50");
    assert!(
        p50 < DELAY_MS * 1_000_000 / 4,
        "quiet phase skew p50 {p50} ns"
    );
    let named = format!("rank {LATE} ");
    for f in skew["findings"].as_array().expect("findings") {
        let f = f.as_str().expect("finding");
        assert!(
            !(f.contains("1025-2048 B") && f.starts_with(&named)),
            "{skew:#}"
        );
    }
    // The two halves of the split: N instances each, each with its own late rank (world
    // rank c in the half of color c), never mixed (a mixed instance would have been
    // closed with the wrong members, and the rest counted as unaligned).
    let halves = routine(skew, "MPI_Allreduce", 3);
    assert_eq!(halves["instances"], 2 * N, "{halves:#}");
    let most = halves["most_last"]["rank"].as_u64().expect("rank");
    assert!(most == 0 || most == 1, "{halves:#}");
    assert!(halves["skew_ns"]["p50"].as_u64().expect("p50") >= DELAY_MS * 1_000_000 * 8 / 10);

    // Per rank: every rank is a member of the five world phases and its half's N.
    let ranks = skew["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), NP as usize);
    for r in ranks {
        assert_eq!(r["instances"], 6 * N, "{r:#}");
    }
    for r in ranks {
        // The highest number reached: the world's, after four phases on it.
        assert_eq!(r["seq"], 4 * N - 1, "{r:#}");
    }
    let late = &ranks[LATE as usize];
    assert_eq!(late["rank"], LATE);
    // Per routine: it was last at (nearly) every Barrier, and waited at none of them.
    let barrier = late["routines"]
        .as_array()
        .expect("routines")
        .iter()
        .find(|x| x["routine"] == "MPI_Barrier")
        .unwrap_or_else(|| panic!("{late:#}"));
    assert!(
        barrier["last"].as_u64().expect("last") * 100 >= N * 95,
        "{barrier:#}"
    );
    about_n_delays(barrier["caused_ns"].as_u64().expect("caused"), N, "Barrier");
    assert!(
        late["last"].as_u64().expect("last") * 100 >= 4 * N * 95,
        "{late:#}"
    );
    about_n_delays(
        late["caused_ns"].as_u64().expect("caused"),
        4 * N,
        "rank total",
    );
    // The ranks that are never late waited for it in every phase it slept.
    let waited = ranks[3]["waited_ns"].as_u64().expect("waited");
    assert!(
        waited >= 4 * N * DELAY_MS * 1_000_000 * 8 / 10,
        "{:#}",
        ranks[3]
    );
    let worst = skew["worst"].as_array().expect("worst");
    assert_eq!(worst.len(), 10);
    assert!(worst
        .iter()
        .all(|w| w["skew_ns"].as_u64().expect("skew") >= DELAY_MS * 1_000_000 * 8 / 10));
}

fn launched(mpi: Mpi) {
    let scratch = Scratch::new(&format!("skew-{}", mpi.suffix()));
    let prefix = scratch.path("truth");
    let json = scratch.path("profile.json");
    let text = scratch.path("report.txt");
    let html = scratch.path("report.html");
    let mut args: Vec<String> = vec![
        "record".into(),
        "--format".into(),
        "text".into(),
        "-o".into(),
        text.display().to_string(),
        "--html".into(),
        html.display().to_string(),
        "--json".into(),
        json.display().to_string(),
        "--".into(),
    ];
    args.extend(late_job_args(mpi, &prefix));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);

    let profile = read_json(&json);
    let truths = read_truths(&prefix, NP);
    assert!(truths.iter().all(|t| t["half_size"] == NP / 2));
    assert_late_job(&profile);
    let host = profile["ranks"][0]["host"].as_str().expect("host");
    let report = std::fs::read_to_string(&text).expect("text report");
    assert!(report.contains("Who is late"), "{report}");
    assert!(
        report.contains(&format!("rank {LATE} ({host}) arrived last in")),
        "{report}"
    );

    // The HTML report marks the late rank: over its bars (the most time made others wait)
    // and as the rank most often last at the Allreduces it slept before.
    let page = browse(&scratch, &html, &format!("late-{}", mpi.suffix()));
    assert_html_report_matches(&page, &profile);
    let late = profile["skew"]["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .find(|r| r["rank"] == LATE)
        .expect("the late rank");
    let mark = format!("last {}×", late["last"]);
    assert!(
        figure_says(&page, "late-ranks", &mark),
        "{mark} over rank {LATE}"
    );
    assert!(
        figure_says(&page, "late-skew-MPI_Allreduce", &format!("r{LATE}")),
        "rank {LATE} named over the Allreduce buckets"
    );
}

#[test]
fn launched_open_mpi_job_names_the_late_rank() {
    launched(Mpi::OpenMpi);
}

#[test]
fn launched_mpich_job_names_the_late_rank() {
    launched(Mpi::Mpich);
}

/// The skew entry of `routine` in rank `rank`'s part (all sizes): (last, caused, waited).
#[track_caller]
fn rank_routine(skew: &Value, rank: u64, routine: &str) -> (u64, u64, u64) {
    let r = skew["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .find(|r| r["rank"] == rank)
        .unwrap_or_else(|| panic!("no rank {rank}: {skew:#}"));
    let x = r["routines"]
        .as_array()
        .expect("routines")
        .iter()
        .find(|x| x["routine"] == routine)
        .unwrap_or_else(|| panic!("no {routine} for rank {rank}: {r:#}"));
    let n = |k: &str| x[k].as_u64().expect(k);
    (n("last"), n("caused_ns"), n("waited_ns"))
}

/// Collectives with a root (`mpi_rooted.c`: 2 ranks, rank 1 sleeping before each): who
/// waits follows the data. The root of a Reduce waits for a late member and nobody else
/// waits; a late root of a Gather holds nobody up; a late member of a Bcast holds nobody
/// up; the others wait for a late root of a Scatter. The ranks are 50 ms apart and small
/// messages go eagerly: only a rank stalled 50 ms on a loaded machine could turn one
/// instance round (allowed once in 20, as `assert_late_phase` does).
fn rooted(mpi: Mpi) {
    let scratch = Scratch::new(&format!("skew-rooted-{}", mpi.suffix()));
    let RecordedJob {
        json,
        text,
        truths: prefix,
    } = record_job(
        &scratch,
        "",
        (mpi, 2),
        (
            &build_program("mpi_rooted.c", mpi),
            &[DELAY_MS.to_string(), N.to_string()],
        ),
        &[],
    );
    let profile = read_json(&json);
    let truths = read_truths(&prefix, 2);
    let host = rank_by_pid(&profile, truths[1]["pid"].as_u64().expect("pid"))["host"]
        .as_str()
        .expect("host")
        .to_string();
    let skew = &profile["skew"];
    for counter in ["incomplete", "unidentified", "unaligned", "lost"] {
        assert_eq!(skew[counter], 0, "{counter}: {skew:#}");
    }
    // Four phases and the four barriers before them.
    assert_eq!(skew["instances"], 4 * N + 4, "{skew:#}");

    // Reduce to rank 0, rank 1 late: the root waited for it every time, it for nobody.
    assert_late_phase(skew, "MPI_Reduce", 2, 1, N);
    let (last, _, waited) = rank_routine(skew, 1, "MPI_Reduce");
    assert!(last * 100 >= N * 95, "rank 1 last at {last} Reduces");
    assert_eq!(waited, 0, "rank 1 sends and leaves");
    let (last, _, waited) = rank_routine(skew, 0, "MPI_Reduce");
    assert!(last * 100 <= N * 5, "the root last at {last} Reduces");
    about_n_delays(waited, N, "Reduce: the root waited");

    // Gather to rank 1 and Bcast from rank 0, rank 1 late: nobody waited, nobody is named.
    for (name, bucket) in [("MPI_Gather", 1), ("MPI_Bcast", 2)] {
        let r = routine(skew, name, bucket);
        assert_eq!(r["instances"], N, "{name}: {r:#}");
        assert!(
            r["most_last"].is_null() || r["most_last"]["last"].as_u64() <= Some(N / 20),
            "{name}: {r:#}"
        );
        assert_eq!(r["skew_ns"]["p50"], 0, "{name}: {r:#}");
        let max = r["skew_ns"]["max"].as_u64().expect("max");
        for rank in [0, 1] {
            let (last, caused, waited) = rank_routine(skew, rank, name);
            assert!(
                last <= N / 20 && caused <= max && waited <= max,
                "{name}: rank {rank}: last {last}, caused {caused}, waited {waited}: {r:#}"
            );
        }
    }

    // Scatter from rank 1, late: rank 0 waited for it every time.
    assert_late_phase(skew, "MPI_Scatter", 1, 1, N);
    let (_, _, waited) = rank_routine(skew, 1, "MPI_Scatter");
    assert_eq!(waited, 0, "the root waits for nobody");
    let (_, _, waited) = rank_routine(skew, 0, "MPI_Scatter");
    about_n_delays(waited, N, "Scatter: rank 0 waited");

    // In words, in the profile and the text report: two findings, none for the phases in
    // which nobody waited.
    let findings: Vec<&str> = skew["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f.as_str().expect("a finding"))
        .collect();
    let report = std::fs::read_to_string(&text).expect("text report");
    for (want, of) in [
        (
            format!("rank 1 ({host}) arrived last in "),
            "of MPI_Reduce (5-8 B) instances",
        ),
        (
            format!("rank 1 ({host}), the root, arrived late in "),
            "of MPI_Scatter (1-4 B) instances",
        ),
    ] {
        let said = findings
            .iter()
            .find(|f| f.starts_with(&want) && f.contains(of))
            .unwrap_or_else(|| panic!("{want}...{of}: {findings:#?}"));
        assert!(report.contains(*said), "{said}: {report}");
    }
    assert!(
        findings
            .iter()
            .any(|f| f.contains("after the root on median; the root waited")),
        "{findings:#?}"
    );
    assert!(
        !findings
            .iter()
            .any(|f| f.contains("MPI_Gather") || f.contains("MPI_Bcast")),
        "{findings:#?}"
    );
}

#[test]
fn rooted_open_mpi_collectives_make_only_their_roots_dependents_wait() {
    rooted(Mpi::OpenMpi);
}

#[test]
fn rooted_mpich_collectives_make_only_their_roots_dependents_wait() {
    rooted(Mpi::Mpich);
}

/// `record` of `mpi_steps.c` (2 Open MPI ranks, `steps` steps of `k` Allreduces, rank 1
/// `delay_ms` late to each) into `scratch`, its files named with `tag`: the JSON profile,
/// the text report and the truths' prefix.
fn record_steps(
    scratch: &Scratch,
    tag: &str,
    steps: u64,
    k: u64,
    delay_ms: u64,
) -> (PathBuf, PathBuf, PathBuf) {
    let job = record_job(
        scratch,
        tag,
        (Mpi::OpenMpi, 2),
        (
            &build_program("mpi_steps.c", Mpi::OpenMpi),
            &[steps.to_string(), k.to_string(), delay_ms.to_string()],
        ),
        &[],
    );
    (job.json, job.text, job.truths)
}

/// `commtap diff` of two runs of one job (10 steps, then 20 with rank 1 late by twice as
/// much): the Allreduces each made, exactly, before and after, in JSON and in text.
#[test]
fn diff_compares_two_runs_of_a_job() {
    const K: u64 = 5;
    let scratch = Scratch::new("skew-diff");
    let (before, ..) = record_steps(&scratch, "-before", 10, K, DELAY_MS / 5);
    let (after, ..) = record_steps(&scratch, "-after", 20, K, DELAY_MS * 2 / 5);
    let run = run_commtap(
        &scratch,
        &[
            "diff",
            "--format",
            "json",
            path_str(&before),
            path_str(&after),
        ],
        LIMIT,
    );
    assert!(run.status.success(), "{}", run.stderr);
    let d: Value = serde_json::from_str(&run.stdout).expect("JSON diff");
    let allreduce = d["routines"]
        .as_array()
        .expect("routines")
        .iter()
        .find(|r| r["routine"] == "MPI_Allreduce")
        .unwrap_or_else(|| panic!("no MPI_Allreduce: {d:#}"));
    // 2 ranks x steps x K, 8 bytes each.
    assert_eq!(allreduce["calls"]["before"], 2.0 * 10.0 * K as f64, "{d:#}");
    assert_eq!(allreduce["calls"]["after"], 2.0 * 20.0 * K as f64, "{d:#}");
    assert_eq!(
        allreduce["bytes"]["after"],
        8.0 * 2.0 * 20.0 * K as f64,
        "{d:#}"
    );
    assert_eq!(d["ranks"]["before"], 2.0);
    // Rank 0 waited about 10 x 10 ms before and 20 x 20 ms after.
    let waited = &d["waited_s"];
    assert!(
        waited["after"].as_f64() > waited["before"].as_f64(),
        "{waited}"
    );
    let run = run_commtap(
        &scratch,
        &["diff", path_str(&before), path_str(&after)],
        LIMIT,
    );
    assert!(run.status.success(), "{}", run.stderr);
    let row: Vec<&str> = run
        .stdout
        .lines()
        .find(|l| l.starts_with("MPI_Allreduce"))
        .unwrap_or_else(|| panic!("no MPI_Allreduce row: {}", run.stdout))
        .split_whitespace()
        .collect();
    assert_eq!(row[1..5], ["100", "200", "800", "1600"], "{}", run.stdout);
}

/// A training loop's shape (`mpi_steps.c`: rank 1's step takes DELAY_MS longer, then 20
/// Allreduces): rank 1 is last at one Allreduce in 20, too few for a routine's sentence,
/// yet the others wait for it at every step: the report names it as the rank that held
/// the others up longest. (Before: no sentence, or one naming whichever rank the
/// scheduler ran last at the other 19.)
#[test]
fn a_rank_late_once_a_step_is_named_as_the_one_the_others_waited_for() {
    const K: u64 = 20;
    let scratch = Scratch::new("skew-steps");
    let (json, text, prefix) = record_steps(&scratch, "", N, K, DELAY_MS);
    let profile = read_json(&json);
    let truths = read_truths(&prefix, 2);
    let host = rank_by_pid(&profile, truths[1]["pid"].as_u64().expect("pid"))["host"]
        .as_str()
        .expect("host")
        .to_string();
    let skew = &profile["skew"];
    for counter in ["incomplete", "unidentified", "unaligned", "lost"] {
        assert_eq!(skew[counter], 0, "{counter}: {skew:#}");
    }
    assert_eq!(skew["instances"], N * K, "{skew:#}");
    let (last, caused, _) = rank_routine(skew, 1, "MPI_Allreduce");
    assert!(last >= N, "rank 1 last at {last} instances: {skew:#}");
    about_n_delays(caused, N, "rank 1 caused");
    let findings: Vec<&str> = skew["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f.as_str().expect("a finding"))
        .collect();
    let want = format!("rank 1 ({host}) held the others up longest: ");
    let said = findings
        .iter()
        .find(|f| f.starts_with(&want))
        .unwrap_or_else(|| panic!("{want}...: {findings:#?}"));
    assert!(
        said.contains(&format!(
            "most at MPI_Allreduce (5-8 B), where the others waited for it at {last} of {} \
             instances",
            N * K
        )),
        "{said}"
    );
    let report = std::fs::read_to_string(&text).expect("text report");
    assert!(report.contains(*said), "{said}: {report}");
    // Its table shows what an instance costs once everyone is there: the transfer time.
    let transfer = routine(skew, "MPI_Allreduce", 2)["transfer_ns"]["p50"]
        .as_u64()
        .expect("transfer p50") as f64;
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with("MPI_Allreduce") && l.contains(" 5-8 B "))
        .unwrap_or_else(|| panic!("no MPI_Allreduce 5-8 B row: {report}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let shown: f64 = words[words.len() - 2].parse().expect("a number");
    let unit = match words[words.len() - 1] {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        other => panic!("unit {other}: {line}"),
    };
    assert!(
        (shown * unit - transfer).abs() <= transfer * 0.05 + 1e3,
        "transfer p50 {transfer} ns shown as {line}"
    );
}

/// Past a communicator's first 1,024 instances who-is-late follows the ones every rank draws
/// by number (`collector_common::instances`). A 2-rank `mpi_late` of 1,500 collectives a
/// phase numbers the world to 6,000: each phase's instances are estimated as exactly the sum
/// of its drawn instances' weights, the late rank is named, a rank sends the events of the
/// drawn instances only, and its calls' times stay a sample of 1 in 64 at random (not the
/// drawn instances, which are all of the first 1,024).
fn long_job(mpi: Mpi) {
    use collector_common::instances;
    use std::ops::Range;
    const NP: u32 = 2;
    const LATE: u64 = 1;
    const N: u64 = 1_500;
    let scratch = Scratch::new(&format!("skew-long-{}", mpi.suffix()));
    let prefix = scratch.path("truth");
    let json = scratch.path("profile.json");
    let mut args: Vec<String> = ["record", "--time-one-in", "64", "--json"]
        .map(String::from)
        .to_vec();
    args.extend([json.display().to_string(), "--".into()]);
    args.extend(mpi.launcher(NP));
    args.extend([
        build_program("mpi_late.c", mpi).display().to_string(),
        LATE.to_string(),
        "1".into(),
        N.to_string(),
        prefix.display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let profile = read_json(&json);
    let skew = &profile["skew"];
    for counter in ["incomplete", "unidentified", "unaligned", "lost"] {
        assert_eq!(skew[counter], 0, "{counter}: {skew:#}");
    }
    let estimate = |r: Range<u64>| r.map(instances::weight).sum::<u64>();
    let standing_for_several = |r: Range<u64>| r.filter(|n| instances::weight(*n) > 1).count();
    // (routine, bucket, its numbers, whether rank LATE sleeps): the world's four phases, then
    // the duplicate's, numbered from its creation. (The split's halves have one member each.)
    let phases = [
        ("MPI_Allreduce", 2, 0..N, true),
        ("MPI_Allreduce", 10, N..2 * N, false),
        ("MPI_Bcast", 3, 2 * N..3 * N, true),
        ("MPI_Barrier", 0, 3 * N..4 * N, true),
        ("MPI_Allreduce", 1, 0..N, true),
    ];
    for (name, bucket, numbers, late) in phases.clone() {
        let r = routine(skew, name, bucket);
        let want = estimate(numbers);
        assert_eq!(r["instances"], want, "{name} {bucket}: {r:#}");
        if late {
            let most = &r["most_last"];
            assert_eq!(most["rank"], LATE, "{name} {bucket}: {r:#}");
            let last = most["last"].as_u64().expect("last");
            assert!(last * 100 >= want * 95, "{name} {bucket}: {r:#}");
        }
    }
    let all: u64 = phases.iter().map(|p| estimate(p.2.clone())).sum();
    assert_eq!(skew["instances"], all, "{skew:#}");
    let several: usize = phases
        .iter()
        .map(|p| standing_for_several(p.2.clone()))
        .sum();
    assert_eq!(skew["sampled"], several as u64, "{skew:#}");
    // Events: the drawn instances of the world, the duplicate and the rank's half, and the
    // three calls that name communicators (MPI_Init, MPI_Comm_split, MPI_Comm_dup).
    let drawn = |r: Range<u64>| r.filter(|n| instances::drawn(*n)).count() as u64;
    let events = drawn(0..4 * N) + 2 * drawn(0..N) + 3;
    for rank in profile["ranks"].as_array().expect("ranks") {
        assert_eq!(rank["events"], events, "{rank:#}");
        // Calls stay exact; their time is sampled at random: about 23 of each 1,500
        // (the Barrier phase has 188 instances drawn, the Bcast phase 322).
        for name in ["MPI_Bcast", "MPI_Barrier"] {
            let r = &rank["routines"][name];
            assert_eq!(r["calls"], N, "{name}: {r:#}");
            let timed = r["sampled_time"]["timed_calls"].as_u64().expect("timed");
            assert!((1..N / 16).contains(&timed), "{name}: {timed} timed: {r:#}");
        }
    }
}

#[test]
fn a_long_open_mpi_job_follows_the_drawn_instances() {
    long_job(Mpi::OpenMpi);
}

#[test]
fn a_long_mpich_job_follows_the_drawn_instances() {
    long_job(Mpi::Mpich);
}

/// Rank 0's count of calls so far (0 before it wrote one).
fn progress(prefix: &Path) -> u64 {
    std::fs::read_to_string(format!("{}.progress", prefix.display()))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Starts `mpi_late` collecting until `scratch/stop` exists (`env` passed to every rank:
/// Open MPI's `-x`, MPICH's inheritance); returns once it has run collectives, with its ranks' pids.
fn start_running_job(scratch: &Scratch, mpi: Mpi, env: &[(&str, &str)]) -> (ChildGuard, Vec<u32>) {
    let prog = build_program("mpi_late.c", mpi);
    let launcher = mpi.launcher(NP);
    let mut cmd = Command::new(&launcher[0]);
    mpi_env(&mut cmd);
    for (k, v) in env {
        if mpi == Mpi::OpenMpi {
            cmd.args(["-x", k]);
        }
        cmd.env(k, v);
    }
    cmd.args(&launcher[1..])
        .arg(&prog)
        .args([LATE.to_string(), DELAY_MS.to_string(), "0".into()])
        .arg(scratch.path("truth"))
        .arg(scratch.path("stop"));
    let job = ChildGuard::spawn(&mut cmd);
    // The job has run collectives before commtap attaches.
    wait_until("the job to run collectives", LIMIT, || {
        progress(&scratch.path("truth")) >= 5
    });
    let mut ranks = Vec::new();
    wait_until("all ranks to be running", Duration::from_secs(10), || {
        ranks = pids_running(&prog);
        ranks.len() == NP as usize
    });
    (job, ranks)
}

fn attached(mpi: Mpi) {
    let scratch = Scratch::new(&format!("skew-attach-{}", mpi.suffix()));
    let prefix = scratch.path("truth");
    let stop = scratch.path("stop");
    let (mut job, ranks) = start_running_job(&scratch, mpi, &[]);
    let (commtap, out) = record_attached(&scratch, &ranks);
    let attached_at = progress(&prefix);
    wait_until("30 collectives after attaching", LIMIT, || {
        progress(&prefix) >= attached_at + 30
    });
    std::fs::write(&stop, "").expect("stop file");
    assert!(job.wait_with_limit(LIMIT).success());
    finish_ok(&scratch, commtap, LIMIT);

    let profile = read_json(&out);
    let truths = read_truths(&prefix, NP);
    // What each rank was seen to call: a suffix of its calls, longer for ranks attached
    // earlier. The instances every rank was seen at are the shortest suffix; the longer
    // ones' extra calls belong to instances from before the last rank was watched.
    let seen: Vec<u64> = truths
        .iter()
        .map(|t| {
            let rank = rank_by_pid(&profile, t["pid"].as_u64().expect("pid"));
            rank["routines"]["MPI_Allreduce"]["calls"]
                .as_u64()
                .expect("calls")
        })
        .collect();
    let all = *seen.iter().min().expect("ranks");
    assert!(all >= 30, "seen {seen:?}");
    let skew = &profile["skew"];
    assert_eq!(skew["instances"], all, "seen {seen:?}: {skew:#}");
    assert_eq!(
        skew["unaligned"],
        seen.iter().map(|s| s - all).sum::<u64>(),
        "seen {seen:?}: {skew:#}"
    );
    for counter in ["incomplete", "unidentified", "lost"] {
        assert_eq!(skew[counter], 0, "{counter}: {skew:#}");
    }
    assert_late_phase(skew, "MPI_Allreduce", 1, LATE, all);
}

#[test]
fn attached_open_mpi_job_aligns_instances_and_names_the_late_rank() {
    attached(Mpi::OpenMpi);
}

#[test]
fn attached_mpich_job_aligns_instances_and_names_the_late_rank() {
    attached(Mpi::Mpich);
}

/// The node daemon matches a job it was never told about, live: over gRPC (`report
/// --from`) and in Prometheus.
#[test]
fn the_daemon_names_the_late_rank_of_a_job_it_was_not_told_about() {
    let scratch = Scratch::new("skew-daemon");
    let metrics = scratch.path("metrics.sock");
    let metrics_addr = format!("unix://{}", metrics.display());
    let daemon = Daemon::start(&scratch, &[], &[], &["--metrics-addr", &metrics_addr]);
    let prefix = scratch.path("truth");
    let args = late_job_args(Mpi::OpenMpi, &prefix);
    let mut cmd = Command::new(&args[0]);
    mpi_env(&mut cmd).args(&args[1..]);
    assert!(ChildGuard::spawn(&mut cmd).wait_with_limit(LIMIT).success());
    let truths = read_truths(&prefix, NP);
    wait_for_exited(&daemon.target, &pids_of(&truths));
    let job = truths[0]["pid"].as_u64().expect("pid").to_string();
    let profile = report_json(&["report", "--from", &daemon.target, "--job", &job]);
    assert_late_job(&profile);

    let text = curl_metrics(&metrics);
    let value = |name: &str, rank: u64| -> f64 {
        series(&text, name, &job, rank).unwrap_or_else(|| panic!("no {name} {rank} in\n{text}"))
    };
    let skew_ranks = profile["skew"]["ranks"].as_array().expect("ranks");
    let routine_value = |name: &str, rank: u64, routine: &str| -> f64 {
        let prefix = format!("{name}{{job_id=\"{job}\",rank=\"{rank}\",routine=\"{routine}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .parse()
            .expect("a number")
    };
    for r in 0..u64::from(NP) {
        let want = &skew_ranks[r as usize];
        assert_eq!(value("commtap_late_seq", r), (4 * N - 1) as f64);
        for x in want["routines"].as_array().expect("routines") {
            let routine = x["routine"].as_str().expect("routine");
            assert_eq!(
                routine_value("commtap_late_routine_last_total", r, routine),
                x["last"].as_f64().expect("last")
            );
        }
        assert_eq!(
            value("commtap_late_last_total", r),
            want["last"].as_f64().expect("last")
        );
        assert_eq!(
            value("commtap_late_instances_total", r),
            want["instances"].as_f64().expect("instances")
        );
        let caused = value("commtap_late_caused_seconds_total", r);
        assert!((caused - want["caused_ns"].as_f64().expect("caused") / 1e9).abs() < 1e-6);
    }
    daemon.stop(&scratch);
}

/// A rank detached mid-job and attached again: a daemon with per-call events watches a
/// job from its start, and a trace streams from it; rank 1 is detached after the first of
/// three phases of world `MPI_Allreduce`s (each followed by a message from rank 0 to its
/// rank 1) and attached again after the second. Its collectives of the third are matched with
/// the others' third phase (aligned by time anew, the second's unseen): every instance of
/// the first and third phases complete, with the late rank last; the second's incomplete.
/// Its receives of the third are no longer numbered (the second's went unseen): Late
/// Sender pairs the first phase's messages only, and the trace draws their arrows only.
/// Were its receives numbered on from its `MPI_Init`, those of the third phase would be
/// paired with the second's sends.
#[test]
fn a_rank_detached_and_attached_again_is_matched_anew() {
    let scratch = Scratch::new("skew-reattach");
    let daemon = Daemon::start(&scratch, &[], &[], &["--call-events"]);
    let (prefix, ready, go) = (
        scratch.path("truth"),
        scratch.path("ready"),
        scratch.path("go"),
    );
    let prog = build_program("mpi_late.c", Mpi::OpenMpi);
    let args = [
        LATE.to_string().into(),
        DELAY_MS.to_string().into(),
        N.to_string().into(),
        prefix.clone().into_os_string(),
        ready.clone().into_os_string(),
        go.clone().into_os_string(),
        "3".into(),
    ];
    // Held before MPI_Init until the trace streams: it holds every rank from MPI_Init on.
    let (mut job, ranks) =
        start_program_held_before_init(&scratch, Mpi::OpenMpi, NP, &prog, &args, &[]);
    let (tracer, trace) =
        spawn_streaming_trace(&scratch, &daemon.target, &["--pid", &pid_list(&ranks)]);
    std::fs::write(scratch.path("start"), b"").expect("start");
    // Once every rank is between phases `phase` and the next.
    let between = |phase: u32| {
        wait_until("every rank to finish the phase", LIMIT, || {
            (0..NP).all(|r| PathBuf::from(format!("{}.{phase}.{r}", ready.display())).exists())
        });
    };
    let go_on = |phase: u32| {
        std::fs::write(format!("{}.{phase}", go.display()), b"").expect("go file");
    };
    // `commtap detach` or `attach` of rank 1.
    let rank1 = ranks[1].to_string();
    let ask = |what: &str| {
        let out = commtap_output(&[what, "--pid", &rank1, "--from", &daemon.target]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {said}");
    };
    between(0);
    ask("detach");
    go_on(0);
    between(1);
    ask("attach");
    go_on(1);
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    finish_ok(&scratch, tracer, LIMIT);
    let arrows: Vec<(u64, u64)> = devtools_summary(&trace)["flows"]
        .as_array()
        .expect("flows")
        .iter()
        .map(|flow| {
            let ends = flow.as_array().expect("a flow's events");
            let at = |e: &Value| e["ts"].as_f64().expect("a time");
            let (from, to) = if at(&ends[0]) <= at(&ends[1]) {
                (&ends[0], &ends[1])
            } else {
                (&ends[1], &ends[0])
            };
            (
                from["pid"].as_u64().expect("pid"),
                to["pid"].as_u64().expect("pid"),
            )
        })
        .collect();
    let (r0, r1) = (u64::from(ranks[0]), u64::from(ranks[1]));
    assert_eq!(
        arrows,
        vec![(r0, r1); N as usize],
        "the first phase's messages only"
    );
    let truths = read_truths(&prefix, NP);
    wait_for_exited(&daemon.target, &pids_of(&truths));
    let job_id = ranks[0].to_string();
    let profile = report_json(&["report", "--from", &daemon.target, "--job", &job_id]);
    let skew = &profile["skew"];
    // 8-byte Allreduce on the world: bucket 2.
    assert_late_phase(skew, "MPI_Allreduce", 2, LATE, 2 * N);
    assert_eq!(
        (&skew["instances"], &skew["incomplete"], &skew["unaligned"]),
        (&(2 * N).into(), &N.into(), &0.into()),
        "{skew:#}"
    );
    // The first phase's messages paired, both ways round (the sends are blocking); the
    // third's receives not numbered; the second's and third's sends unpaired.
    let ls = &skew["late_sender"];
    for list in ["pairs", "late_receivers"] {
        let pairs = ls[list].as_array().expect("pairs");
        assert_eq!(pairs.len(), 1, "{list}: {ls:#}");
        let p = &pairs[0];
        assert_eq!(
            (&p["receiver"], &p["sender"], &p["messages"]),
            (&1.into(), &0.into(), &N.into()),
            "{list}: {ls:#}"
        );
    }
    assert_eq!(
        (&ls["not_numbered"]["not_from_init"], &ls["unpaired"]),
        (&N.into(), &(2 * N).into()),
        "{ls:#}"
    );
    daemon.stop(&scratch);
}

/// What the daemon's metrics endpoint at `socket` says now.
fn curl_metrics(socket: &Path) -> String {
    let out = Command::new("curl")
        .args(["-s", "--unix-socket"])
        .arg(socket)
        .arg("http://localhost/metrics")
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of Prometheus series `name` for `rank` of `job` in `text`, if there.
fn series(text: &str, name: &str, job: &str, rank: u64) -> Option<f64> {
    let prefix = format!("{name}{{job_id=\"{job}\",rank=\"{rank}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().expect("a number"))
}

/// A hung job: after N collectives rank 1 stops calling MPI while rank 0 blocks in the
/// next, an `MPI_Barrier` (instance N of the world: past the first 1,024 and not drawn, so
/// neither rank sends an event for it, and a blocked call sends none until it returns).
/// Live, the daemon's report and `commtap_late_seq` say rank 0 entered instance N and rank
/// 1 reached N - 1: the rank the job waits for is the one behind (the kernel's counts of
/// collectives entered tell it).
fn a_hung_job(mpi: Mpi, daemon_args: &[&str]) {
    use collector_common::instances;
    let scratch = Scratch::new("skew-hung");
    let metrics = scratch.path("metrics.sock");
    let metrics_addr = format!("unix://{}", metrics.display());
    let args = [&["--metrics-addr", &metrics_addr][..], daemon_args].concat();
    let daemon = Daemon::start(&scratch, &[], &[], &args);
    let n = (3 * instances::ALL_BELOW..4 * instances::ALL_BELOW)
        .find(|n| !instances::drawn(*n))
        .expect("an instance not drawn");
    let job = format!("hung-{}", std::process::id());
    let (go, prefix) = (scratch.path("go"), scratch.path("truth"));
    let mut running = ChildGuard::spawn(&mut mpi_launch(
        mpi,
        2,
        Some(&job),
        &build_program("mpi_hang.c", mpi),
        &["1", &n.to_string(), path_str(&go), path_str(&prefix)],
    ));

    let seq_of = |profile: &Value, rank: u64| {
        profile["skew"]["ranks"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["rank"] == rank))
            .and_then(|r| r["seq"].as_u64())
    };
    let mut profile = Value::Null;
    let live = [
        "report",
        "--from",
        &daemon.target,
        "--job",
        &job,
        "--format",
        "json",
    ];
    wait_until("rank 0 to be seen in the hung barrier", LIMIT, || {
        // Until the daemon has read the ranks' environment, it knows no such job.
        let out = commtap_output(&live);
        if out.status.success() {
            profile = serde_json::from_slice(&out.stdout).expect("JSON profile");
        }
        // Rank 1 as soon as the daemon read its count (else the last instance drawn).
        seq_of(&profile, 0) == Some(n) && seq_of(&profile, 1).is_some_and(|s| s + 1 >= n)
    });
    // Rank 0 passed instance n - 1 only once rank 1 was in it, and rank 1 waits for the go.
    assert_eq!(seq_of(&profile, 1), Some(n - 1), "{:#}", profile["skew"]);
    let text = curl_metrics(&metrics);
    assert_eq!(
        series(&text, "commtap_late_seq", &job, 0),
        Some(n as f64),
        "{text}"
    );
    assert_eq!(
        series(&text, "commtap_late_seq", &job, 1),
        Some((n - 1) as f64),
        "{text}"
    );

    // Which call each rank is inside: rank 0 the barrier it blocks in (a second or more),
    // rank 1 none (it waits for the go outside MPI, once its last collective returned).
    let hung = wait_for_rank_0_hung_in_its_barrier(&daemon.target, &job, LIMIT);
    assert_trace_ends_inside_the_barrier(&scratch, &daemon.target, &job, &hung);
    let text = commtap_output(&["report", "--from", &daemon.target, "--job", &job]);
    let text = String::from_utf8_lossy(&text.stdout);
    let rows: Vec<Vec<&str>> =
        report_rows(&text, "Calls in progress when this report was made (1 of 2")
            .into_iter()
            .map(|l| l.split_whitespace().collect())
            .collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert_eq!(
        (rows[0][0], &rows[0][3..]),
        ("1", &["no", "MPI", "call"][..]),
        "{text}"
    );
    assert_eq!((rows[1][0], rows[1][3]), ("0", "MPI_Barrier"), "{text}");
    let text = curl_metrics(&metrics);
    let in_call = |rank: u32| {
        text.lines()
            .filter(|l| {
                l.starts_with(&format!(
                    "commtap_rank_in_call_seconds{{job_id=\"{job}\",rank=\"{rank}\","
                ))
            })
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let zero = in_call(0);
    assert!(
        zero.len() == 1 && zero[0].contains(",routine=\"MPI_Barrier\"} "),
        "{text}"
    );
    assert_eq!(in_call(1), Vec::<String>::new(), "{text}");

    std::fs::write(&go, "").expect("go file");
    assert!(running.wait_with_limit(LIMIT).success());
    let truths = read_truths(&prefix, 2);
    wait_for_exited(&daemon.target, &pids_of(&truths));
    let profile = report_json(&["report", "--from", &daemon.target, "--job", &job]);
    // Every rank entered the barrier; none of the world's calls lost.
    for rank in 0..2 {
        assert_eq!(seq_of(&profile, rank), Some(n), "{:#}", profile["skew"]);
    }
    // Each ended as a finished program does, and the daemon's word says so.
    for t in &truths {
        let rank = rank_by_pid(&profile, t["pid"].as_u64().expect("pid"));
        assert!(rank.get("in_call").is_none(), "{rank}");
        let ended = &rank["ended"];
        assert_eq!(ended["status"], 0, "{ended}");
        assert!(
            ended.get("inside").is_none() && ended.get("signal").is_none(),
            "{ended}"
        );
    }
    assert_eq!(profile["skew"]["lost"], 0, "{:#}", profile["skew"]);
    daemon.stop(&scratch);
}

/// A trace of job `job` from the daemon at `target`, hung as `hung` (a live profile) shows
/// it, ends with the barrier rank 0 is inside, as long as it has been in it at least, the
/// slice the last of its thread; rank 1, in no call, has none.
#[track_caller]
fn assert_trace_ends_inside_the_barrier(scratch: &Scratch, target: &str, job: &str, hung: &Value) {
    let file = scratch.path("hung.trace.json");
    let args = ["trace", "--from", target, "--job", job, "--duration", "1s"];
    let out = commtap_output(&[&args[..], &["-o", path_str(&file)]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = read_json(&file);
    let slices = unfinished_slices(&trace);
    let zero = rank_numbered(hung, 0);
    assert_eq!(slices.len(), 1, "{slices:#?}");
    let slice = slices[0];
    assert_eq!(
        (&slice["pid"], &slice["name"]),
        (&zero["pid"], &Value::from("MPI_Barrier")),
        "{slice}"
    );
    assert_eq!(
        slice["args"]["unfinished"], "still inside when the trace ended",
        "{slice}"
    );
    let seen_us = zero["in_call"]["for_ns"].as_f64().expect("for_ns") / 1e3;
    assert!(
        slice["dur"].as_f64().is_some_and(|us| us >= seen_us),
        "{slice} against {seen_us} us"
    );
    // Nothing of rank 0's thread after it.
    let (ts, tid) = (slice["ts"].as_f64().expect("ts"), &slice["tid"]);
    let later = trace["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["pid"] == zero["pid"] && &e["tid"] == tid && e["ph"] == "X")
        .filter(|e| e["ts"].as_f64().is_some_and(|t| t > ts))
        .count();
    assert_eq!(later, 0, "{slice}");
}

/// A daemon started after a job hung (`mpi_stuck`: rank 0 inside an `MPI_Sendrecv`, rank
/// 1 outside MPI): no probe saw the call begin, and the ranks' stacks say where each is,
/// live; once released, both end as finished programs do.
#[test]
fn a_daemon_started_after_a_job_hung_sees_where_each_rank_is() {
    let scratch = Scratch::new("skew-stuck");
    let job = format!("stuck-{}", std::process::id());
    let mut stuck = start_stuck_job(&scratch, Mpi::OpenMpi, Some(&job));
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let live = [
        "report",
        "--from",
        &daemon.target,
        "--job",
        &job,
        "--format",
        "json",
    ];
    let mut profile = Value::Null;
    wait_until(
        "rank 0 seen inside its call, rank 1 outside MPI",
        LIMIT,
        || {
            let out = commtap_output(&live);
            let Ok(p) = serde_json::from_slice::<Value>(&out.stdout) else {
                return false;
            };
            profile = p;
            let (zero, one) = (rank_numbered(&profile, 0), rank_numbered(&profile, 1));
            zero["in_call"]["for_ns"]
                .as_u64()
                .is_some_and(|ns| ns >= 1_000_000_000)
                // Named once the daemon has read the program's symbols.
                && zero["in_call"]["called_from"]
                    .as_str()
                    .is_some_and(|f| f.contains(" at mpi_stuck.c:"))
                // Rank 1 read whole and outside MPI (a profile that ran out of its time for
                // stacks says "not known", and the next one looks again).
                && one.is_object()
                && one.get("in_call").is_none()
                && one.get("in_call_unknown").is_none()
        },
    );
    assert_stuck_where_it_is(&profile, &stuck);

    std::fs::write(&stuck.go, "").expect("go file");
    assert!(stuck.job.wait_with_limit(LIMIT).success());
    wait_for_exited(&daemon.target, &[stuck.zero, stuck.one]);
    let profile = report_json(&["report", "--from", &daemon.target, "--job", &job]);
    for pid in [stuck.zero, stuck.one] {
        let rank = rank_by_pid(&profile, pid);
        assert!(rank.get("in_call").is_none(), "{rank}");
        assert_eq!(rank["ended"]["status"], 0, "{rank}");
        assert!(rank["ended"].get("inside").is_none(), "{rank}");
    }
    daemon.stop(&scratch);
}

#[test]
fn a_hung_open_mpi_job_shows_the_rank_it_waits_for() {
    a_hung_job(Mpi::OpenMpi, &[]);
}

/// The same where every routine's time is sampled (`--time-one-in`, as `--max-overhead`
/// samples a hot one): rank 0's barrier is counted untimed at its entry (4,095 times in
/// 4,096), its return never seen, and the ranks' stacks say it is still inside it, since
/// the kernel's tick count at its entry.
#[test]
fn a_hung_open_mpi_job_whose_barrier_went_untimed_shows_where_each_rank_is() {
    a_hung_job(Mpi::OpenMpi, &["--time-one-in", "4096"]);
}

/// The same over MPICH, whose barrier makes UCX operations inside it (probed: a timed one
/// names itself the thread's last routine, and the untimed barrier is still its last MPI
/// call).
#[test]
fn a_hung_mpich_job_whose_barrier_went_untimed_shows_where_each_rank_is() {
    a_hung_job(Mpi::Mpich, &["--time-one-in", "4096"]);
}

#[test]
fn a_hung_mpich_job_shows_the_rank_it_waits_for() {
    a_hung_job(Mpi::Mpich, &[]);
}

/// NCCL: the rank that enqueues last is named (two processes on the NCCL stand-in, which
/// makes the early one wait after its enqueue as a GPU would).
#[test]
fn the_late_nccl_enqueuer_is_named() {
    let scratch = Scratch::new("skew-nccl");
    let standin = build_shared_c("nccl_standin.c");
    let dir = standin.parent().expect("bin dir").to_path_buf();
    let prog = build_nccl_program("nccl_late.c", &dir, &["libnccl_standin.so"]);
    let tokens = scratch.path("tokens");
    std::fs::create_dir_all(&tokens).expect("token dir");
    let late = 1u64;
    let rank = |r: u64| {
        format!(
            "RANK={r} WORLD_SIZE=2 '{}' '{}' '{}' {r} {late} {DELAY_MS} {N} '{}'",
            prog.display(),
            scratch.path("uid").display(),
            tokens.display(),
            scratch.path(&format!("truth.{r}.json")).display()
        )
    };
    let script = format!("{} & a=$!; {} & b=$!; wait $a && wait $b", rank(0), rank(1));
    let out = scratch.path("profile.json");
    finish_ok(
        &scratch,
        spawn_commtap(
            &scratch,
            &[
                "record",
                "--format",
                "json",
                "-o",
                path_str(&out),
                // The ranks start from a shell: their RPATH is not on its command line.
                "--lib",
                path_str(&standin),
                "--",
                "sh",
                "-c",
                &script,
            ],
        ),
        LIMIT,
    );
    let profile = read_json(&out);
    let skew = &profile["skew"];
    assert_eq!(skew["instances"], N, "{skew:#}");
    for counter in ["incomplete", "unidentified", "unaligned", "lost"] {
        assert_eq!(skew[counter], 0, "{counter}: {skew:#}");
    }
    // 256 x Float32: 1024 bytes, bucket 9.
    assert_late_phase(skew, "ncclAllReduce", 9, late, N);
    let truth = read_json(&scratch.path(&format!("truth.{late}.json")));
    let host = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"))["host"]
        .as_str()
        .expect("host")
        .to_string();
    let finding = skew["findings"][0].as_str().expect("a finding");
    assert!(
        finding.starts_with(&format!("rank {late} ({host}) arrived last in"))
            && finding.contains("of ncclAllReduce (513-1024 B) instances"),
        "{skew:#}"
    );
}

/// Two "nodes" (two daemons, each watching half of the ranks from before `MPI_Init`, as
/// daemons run as a service do; node-b's clock 5 s ahead) push to one aggregator: the
/// instances (on a duplicate of the world, named alike on both nodes by the kernel's count
/// of the world's children) whose members are on both meet there, on one clock, and the
/// late rank (on node-b) is named with what it caused.
#[test]
fn the_aggregator_names_the_late_rank_across_nodes() {
    let scratch = Scratch::new("skew-nodes");
    let agg_scratch = Scratch::new("skew-nodes-aggregator");
    let (mut aggregator, url) = spawn_local_aggregator(&agg_scratch, &scratch.path("agg.redb"));

    // A batch job of 4 ranks, held before MPI_Init, then waiting at its GO file.
    let job_id = format!("nodes{}", std::process::id());
    let prog = build_program("mpi_late.c", Mpi::OpenMpi);
    let args = [
        LATE.to_string().into(),
        DELAY_MS.to_string().into(),
        N.to_string().into(),
        scratch.path("truth").into_os_string(),
        scratch.path("ready").into_os_string(),
        scratch.path("go").into_os_string(),
    ];
    let env = [("SLURM_JOB_ID", job_id.as_str())];
    let (mut job, ranks) =
        start_program_held_before_init(&scratch, Mpi::OpenMpi, NP, &prog, &args, &env);

    // node-b's clock is 5 s ahead.
    let daemons = start_two_nodes([&ranks[..2], &ranks[2..]], &url, "5000000000");
    std::fs::write(scratch.path("start"), b"").expect("start");
    wait_until("the job to be ready", LIMIT, || {
        scratch.path("ready").exists()
    });
    std::fs::write(scratch.path("go"), b"go").expect("go");
    assert!(job.wait_with_limit(LIMIT).success(), "the job failed");
    let truths = read_truths(&scratch.path("truth"), NP);

    let report = || try_job_report(&[], &url, &job_id, &scratch.path("merged.json"));
    wait_until("every instance to meet at the aggregator", LIMIT, || {
        report().is_some_and(|p| p["skew"]["instances"] == N)
    });
    let merged = report().expect("report");
    let skew = &merged["skew"];
    assert_eq!(skew["incomplete"], 0, "{skew:#}");
    assert_eq!(skew["within_clock_error"], 0, "{skew:#}");
    // 8-byte Allreduce on the duplicate: bucket 2. Rank LATE is on node-b, whose clock
    // is 5 s ahead: corrected, it is late by about the delay, not by 5 s.
    assert_late_phase(skew, "MPI_Allreduce", 2, LATE, N);
    let late = &skew["ranks"][LATE as usize];
    assert_eq!(late["host"], "node-b", "{late:#}");
    assert!(
        skew["findings"][0]
            .as_str()
            .is_some_and(|f| f.starts_with(&format!("rank {LATE} (node-b) arrived last in"))),
        "{skew:#}"
    );
    // Each node alone sees its half: instances handed on, none matched there.
    for (node_scratch, d) in &daemons {
        let own = report_json(&["report", "--from", &d.target, "--job", &job_id]);
        assert_eq!(own["skew"]["instances"], 0, "{}", node_scratch.0.display());
        assert_eq!(own["skew"]["remote"], N, "{}", node_scratch.0.display());
    }
    assert_eq!(truths.len(), NP as usize);
    for (node_scratch, d) in daemons {
        d.stop(&node_scratch);
    }
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    let _ = aggregator.wait_with_limit(LIMIT);
}

/// Two daemons attach to a running job one after the other (each to its node's half): each
/// node numbers the instances from where it started watching, so their numbers differ. The
/// aggregator aligns them by time (the node attached last gives the numbering) and names
/// the late rank across the nodes, as a node does for its own ranks attached mid-job.
#[test]
fn instances_numbered_from_a_mid_job_attach_are_aligned_across_nodes() {
    let scratch = Scratch::new("skew-nodes-attached");
    let agg_scratch = Scratch::new("skew-nodes-attached-aggregator");
    let (mut aggregator, url) = spawn_local_aggregator(&agg_scratch, &scratch.path("agg.redb"));
    let job_id = format!("attached{}", std::process::id());
    let prefix = scratch.path("truth");
    let stop = scratch.path("stop");
    let (mut job, ranks) = start_running_job(&scratch, Mpi::OpenMpi, &[("SLURM_JOB_ID", &job_id)]);
    let daemons = start_two_nodes([&ranks[..2], &ranks[2..]], &url, "0");
    let attached_at = progress(&prefix);
    wait_until("30 collectives after attaching", LIMIT, || {
        progress(&prefix) >= attached_at + 30
    });
    std::fs::write(&stop, "").expect("stop file");
    assert!(job.wait_with_limit(LIMIT).success(), "the job failed");

    let report = || try_job_report(&[], &url, &job_id, &scratch.path("merged.json"));
    wait_until("the instances both nodes watched to meet", LIMIT, || {
        report().is_some_and(|p| {
            every_rank_final(&p, NP as usize) && p["skew"]["instances"].as_u64() >= Some(28)
        })
    });
    let merged = report().expect("report");
    let skew = &merged["skew"];
    let n = skew["instances"].as_u64().expect("instances");
    assert_eq!(skew["incomplete"], 0, "{skew:#}");
    assert_late_phase(skew, "MPI_Allreduce", 1, LATE, n);
    assert!(
        skew["findings"][0]
            .as_str()
            .is_some_and(|f| f.starts_with(&format!("rank {LATE} (node-b) arrived last in"))),
        "{skew:#}"
    );
    for (node_scratch, d) in daemons {
        d.stop(&node_scratch);
    }
    // SAFETY: kill(2) of the aggregator we spawned.
    unsafe { libc::kill(aggregator.0.id() as i32, libc::SIGTERM) };
    let _ = aggregator.wait_with_limit(LIMIT);
}
