//! Timelines (`record --trace`, `commtap trace`), loaded in a real consumer: Chrome
//! DevTools' trace engine. Every slice it finds is a call the program made: per rank and
//! routine, slices and bytes equal the profile's counts (which equal the program's truth).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use commtap_tests::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_mins(2);

/// Asserts that rank `pid`'s slices in the trace equal `expected` (calls, bytes) per routine.
#[track_caller]
fn assert_traced(summary: &Value, pid: u64, expected: &BTreeMap<String, (u64, u64)>) {
    assert_eq!(
        &traced_routines(summary, pid),
        expected,
        "pid {pid}: slices and bytes per routine in the trace"
    );
}

/// A launched job's trace holds every call of every rank, each rank a named process with
/// its own track; nothing was lost.
fn launched_trace_matches_profile(mpi: Mpi) {
    let scratch = Scratch::new(&format!("trace-launch-{}", mpi.suffix()));
    let prog = build_program("mpi_truth.c", mpi);
    let (out, trace, pftrace, prefix) = (
        scratch.path("profile.json"),
        scratch.path("job.json"),
        scratch.path("job.pftrace"),
        scratch.path("truth"),
    );
    let mut args: Vec<String> = vec![
        "record".into(),
        "--trace".into(),
        trace.display().to_string(),
        "--trace".into(),
        pftrace.display().to_string(),
        "--format".into(),
        "json".into(),
        "-o".into(),
        out.display().to_string(),
        "--".into(),
    ];
    args.extend(mpi.launcher(2));
    args.push(prog.display().to_string());
    args.push(prefix.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    assert!(run.stderr.contains("trace: "), "{}", run.stderr);

    let profile = read_json(&out);
    let truths = read_truths(&prefix, 2);
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    let summary = devtools_summary(&trace);
    let host = profile["ranks"][0]["host"].as_str().expect("host");
    for truth in &truths {
        let pid = truth["pid"].as_u64().expect("pid");
        let rank = rank_by_pid(&profile, pid);
        assert_traced(&summary, pid, &routine_table(&rank["routines"]));
        let process = &summary["processes"][pid.to_string()];
        assert_eq!(
            process["name"],
            format!("rank {} ({host})", truth["rank"]),
            "{process}"
        );
        assert_eq!(process["threads"][pid.to_string()], "main", "{process}");
    }
    let lost = &summary["metadata"]["commtap"]["calls_lost"];
    assert_eq!(
        (&lost["ring_buffer_full"], &lost["reader_too_slow"]),
        (&Value::from(0), &Value::from(0)),
        "{lost}"
    );
    assert_world_collectives_numbered(&trace, &truths, Numbered::FromInit);
    // DevTools gives each arrow's two events; it ends on the slice at the receive's end.
    let arrows: Vec<Arrow> = summary["flows"]
        .as_array()
        .expect("flows")
        .iter()
        .map(|flow| {
            let mut ends: Vec<&Value> = flow.as_array().expect("a flow's events").iter().collect();
            assert_eq!(ends.len(), 2, "{flow}");
            ends.sort_by(|a, b| {
                a["ts"]
                    .as_f64()
                    .partial_cmp(&b["ts"].as_f64())
                    .expect("times")
            });
            let name = |e: &Value| e["name"].as_str().unwrap_or_default().to_string();
            let pid = |e: &Value| e["pid"].as_u64().expect("pid");
            (pid(ends[0]), name(ends[0]), pid(ends[1]), name(ends[1]))
        })
        .collect();
    assert_arrows(&arrows, &truths, &[ARRIVAL]);
    for truth in &truths {
        let pid = truth["pid"].as_u64().expect("pid").to_string();
        let nested = summary["processes"][&pid]["nested"]
            .as_array()
            .expect("nested");
        let arrivals = nested.iter().filter(|pair| {
            pair[1] == ARRIVAL && RECEIVES.contains(&pair[0].as_str().unwrap_or_default())
        });
        // A receive whose send is not numbered ends a flow nothing starts: its message's
        // arrival is marked all the same. The messages one call completed share a slice.
        let n = |key: &str| truth[key].as_u64().expect(key);
        assert_eq!(
            arrivals.count() as u64,
            n("arrows_from_left") + n("receives_without_send") - n("arrows_sharing_a_slice"),
            "pid {pid}: each arrow's end lies inside a receive"
        );
    }

    // Perfetto's trace processor: the JSON and the protobuf file of the run say the same,
    // and it is the profile.
    let from_json = perfetto_summary(&trace);
    assert_eq!(
        from_json,
        perfetto_summary(&pftrace),
        "the two formats differ"
    );
    assert_eq!(
        from_json["errors"],
        serde_json::json!([]),
        "{}",
        from_json["errors"]
    );
    for truth in &truths {
        let pid = truth["pid"].as_u64().expect("pid");
        assert_traced(
            &from_json,
            pid,
            &routine_table(&rank_by_pid(&profile, pid)["routines"]),
        );
        assert_eq!(
            from_json["processes"][pid.to_string()]["name"],
            format!("rank {} ({host})", truth["rank"])
        );
    }
    let arrows: Vec<Arrow> = from_json["arrows"]
        .as_array()
        .expect("arrows")
        .iter()
        .map(|a| {
            assert_eq!(a["forward"], 1, "an arrow back in time: {a}");
            let s = |k: &str| a[k].as_str().expect("name").to_string();
            let n = |k: &str| a[k].as_u64().expect("pid");
            (n("from_pid"), s("from"), n("to_pid"), s("to"))
        })
        .collect();
    assert_arrows(&arrows, &truths, RECEIVES);
    // The nonblocking receives whose arrival cannot be placed (posted by MPI_Isendrecv, in
    // MPICH) have none, and are counted.
    let waited_for = |doc: &Value| {
        doc["metadata"]["commtap"]["receives_without_arrival"]
            .as_u64()
            .expect("receives_without_arrival")
    };
    let untold = truths
        .iter()
        .map(|t| t["receives_without_arrival"].as_u64().expect("untold"))
        .sum::<u64>();
    let doc = read_json(&trace);
    assert_eq!(waited_for(&doc), untold);
    // A channel a persistent send shares with MPI_Send numbers nothing at the sender.
    let persistent = truths
        .iter()
        .map(|t| t["persistent_channel_calls"].as_u64().expect("persistent"))
        .sum::<u64>();
    assert!(persistent > 0);
    assert_eq!(
        doc["metadata"]["commtap"]["messages_without_arrows"]["persistent_channel"],
        persistent
    );
    // No other half-arrow: a flow starts without an end only at the send of a message
    // whose arrival is not placed, and ends without a start only at a receive whose send
    // is not numbered (a send to MPI_PROC_NULL, -2 in Open MPI, starts none).
    let ids = |ph: &str| -> BTreeSet<String> {
        doc["traceEvents"]
            .as_array()
            .expect("traceEvents")
            .iter()
            .filter(|e| e["ph"] == ph)
            .map(|e| e["id"].as_str().expect("a flow's id").to_string())
            .collect()
    };
    let (starts, ends) = (ids("s"), ids("f"));
    let without_send = truths
        .iter()
        .map(|t| t["receives_without_send"].as_u64().expect("without send"))
        .sum::<u64>();
    assert_eq!(
        starts.difference(&ends).count() as u64,
        untold,
        "starts without end"
    );
    assert_eq!(
        ends.difference(&starts).count() as u64,
        without_send,
        "ends without start"
    );
}

/// Where a message's arrow ends: a blocking receive, or the wait that completed a
/// nonblocking one.
const RECEIVES: &[&str] = &[
    "MPI_Recv",
    "MPI_Sendrecv",
    "MPI_Sendrecv_replace",
    "MPI_Wait",
    "MPI_Waitall",
    "MPI_Waitany",
    "MPI_Waitsome",
    "MPI_Test",
    "MPI_Testall",
    "MPI_Testany",
    "MPI_Testsome",
];

/// An arrow: (sending pid, the slice it starts on, receiving pid, the slice it ends on).
type Arrow = (u64, String, u64, String);

/// Every message a rank took with a blocking receive is one arrow, from a send of the rank
/// on its left to one of `ends` on the receiving rank; there is no other arrow.
#[track_caller]
fn assert_arrows(arrows: &[Arrow], truths: &[Value], ends: &[&str]) {
    let pid_of = |rank: u64| {
        truths
            .iter()
            .find(|t| t["rank"] == rank)
            .and_then(|t| t["pid"].as_u64())
            .expect("rank's pid")
    };
    let mut into: BTreeMap<u64, u64> = BTreeMap::new();
    for arrow in arrows {
        let (from, send, to, recv) = arrow;
        let truth = truths.iter().find(|t| t["pid"] == *to).expect("a rank's");
        let size = truth["size"].as_u64().expect("size");
        let left = (truth["rank"].as_u64().expect("rank") + size - 1) % size;
        assert_eq!(*from, pid_of(left), "from the left rank: {arrow:?}");
        assert!(
            [
                "MPI_Send",
                "MPI_Ssend",
                "MPI_Isend",
                "MPI_Issend",
                "MPI_Sendrecv",
                "MPI_Sendrecv_replace"
            ]
            .contains(&send.as_str()),
            "starts at a send: {arrow:?}"
        );
        assert!(
            ends.contains(&recv.as_str()),
            "ends at a receive: {arrow:?}"
        );
        *into.entry(*to).or_default() += 1;
    }
    for truth in truths {
        let pid = truth["pid"].as_u64().expect("pid");
        assert_eq!(
            into.get(&pid).copied().unwrap_or(0),
            truth["arrows_from_left"]
                .as_u64()
                .expect("arrows_from_left"),
            "arrows into rank {}",
            truth["rank"]
        );
    }
}

fn is_collective(routine: &str) -> bool {
    use collector_common::routines::{class, routine_id};
    routine_id(routine)
        .is_some_and(|id| collector_common::ROUTINES[id as usize].spec.class == class::COLLECTIVE)
}

/// How the world collectives of a trace are numbered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Numbered {
    /// Every one, from 0 on: the trace holds the ranks from `MPI_Init`.
    FromInit,
    /// From when the ranks were aligned on: all but at most the first `unaligned` of
    /// each rank (a trace taken of a running job).
    Aligned { unaligned: usize },
}

/// The world collectives carry their number there: on each rank consecutive numbers (0, 1,
/// 2 ... from `MPI_Init`), the same routine at the same number on every rank, the same
/// last number everywhere, and the rank's own rank as `comm_rank`.
#[track_caller]
fn assert_world_collectives_numbered(trace: &std::path::Path, truths: &[Value], how: Numbered) {
    let doc = read_json(trace);
    let mut per_rank: Vec<BTreeMap<u64, String>> = Vec::new();
    for truth in truths {
        let pid = truth["pid"].as_u64().expect("pid");
        let world: Vec<&Value> = doc["traceEvents"]
            .as_array()
            .expect("traceEvents")
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["args"]["comm"] == "world")
            .filter(|e| is_collective(e["name"].as_str().expect("name")))
            .collect();
        let seqs: BTreeMap<u64, String> = world
            .iter()
            .filter_map(|e| {
                let seq = e["args"]["seq"].as_u64()?;
                assert_eq!(e["args"]["comm_rank"], truth["rank"], "{e}");
                Some((seq, e["name"].as_str().expect("name").to_string()))
            })
            .collect();
        let numbers: Vec<u64> = seqs.keys().copied().collect();
        let first = match how {
            Numbered::FromInit => 0,
            Numbered::Aligned { .. } => numbers.first().copied().unwrap_or(0),
        };
        assert_eq!(
            numbers,
            (first..first + seqs.len() as u64).collect::<Vec<_>>(),
            "pid {pid}: world collectives numbered {first}, {}, {} ... with no gap",
            first + 1,
            first + 2
        );
        let unnumbered = world.len() - seqs.len();
        let allowed = match how {
            Numbered::FromInit => 0,
            Numbered::Aligned { unaligned } => unaligned,
        };
        assert!(
            !seqs.is_empty() && unnumbered <= allowed,
            "pid {pid}: {unnumbered} of {} world collectives without a number",
            world.len()
        );
        per_rank.push(seqs);
    }
    for pair in per_rank.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert_eq!(a.keys().last(), b.keys().last(), "the same last instance");
        for (seq, routine) in a {
            if let Some(other) = b.get(seq) {
                assert_eq!(
                    routine, other,
                    "the same routine at number {seq} on every rank"
                );
            }
        }
    }
}

#[test]
fn a_launched_open_mpi_jobs_trace_holds_every_call_of_every_rank() {
    launched_trace_matches_profile(Mpi::OpenMpi);
}

#[test]
fn a_launched_mpich_jobs_trace_holds_every_call_of_every_rank() {
    launched_trace_matches_profile(Mpi::Mpich);
}

/// A trace larger than its split size goes on in numbered files; each loads on its own and
/// together they hold every call; filters leave out what they name, and nothing else.
#[test]
fn a_large_trace_is_split_into_files_that_each_load() {
    let scratch = Scratch::new("trace-split");
    let n = 4000u64;
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, n, &[]);
    let trace = scratch.path("t.json");
    let (commtap, _) = record_attached_with(
        &scratch,
        &ranks,
        &[
            "--trace",
            path_str(&trace),
            "--split-mb",
            "1",
            "--skip-routines",
            "MPI_Barrier,MPI_Finalize",
            // ~24,000 events: a ring that holds them all, so a debug record that falls
            // behind the ranks cannot drop any (the test checks every call).
            "--ring-buffer-kib",
            "8192",
        ],
    );
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let run = finish_ok(&scratch, commtap, LIMIT);
    #[expect(
        clippy::maybe_infinite_iter,
        reason = "ends at the first part that was not written"
    )]
    let parts: Vec<PathBuf> = (1..)
        .map(|i| {
            if i == 1 {
                trace.clone()
            } else {
                scratch.path(&format!("t.{i}.json"))
            }
        })
        .take_while(|p| p.exists())
        .collect();
    assert!(parts.len() >= 2, "one file only: {}", run.stderr);
    let mut total: BTreeMap<u64, BTreeMap<String, (u64, u64)>> = BTreeMap::new();
    for part in &parts {
        let size = std::fs::metadata(part).expect("part").len();
        assert!(size < 2 << 20, "{} is {size} bytes", part.display());
        let summary = devtools_summary(part);
        assert_eq!(
            traced_routines(&summary, u64::from(ranks[0])),
            traced_routines(&perfetto_summary(part), u64::from(ranks[0])),
            "{}: DevTools and Perfetto find the same slices",
            part.display()
        );
        for &pid in &ranks {
            for (routine, (slices, bytes)) in traced_routines(&summary, u64::from(pid)) {
                let t = total
                    .entry(u64::from(pid))
                    .or_default()
                    .entry(routine)
                    .or_default();
                t.0 += slices;
                t.1 += bytes;
            }
        }
    }
    for truth in read_truths(&scratch.path("truth"), 2) {
        let pid = truth["pid"].as_u64().expect("pid");
        let mut expected = routine_table(&truth["routines"]);
        expected.remove("MPI_Barrier");
        assert_eq!(total.get(&pid), Some(&expected), "pid {pid}");
    }
}

/// `commtap trace` from a daemon, for a job already running: every call from the moment
/// it is streaming, each rank named; it ends by itself when the ranks have exited.
#[test]
fn a_trace_from_a_daemon_holds_every_call_until_the_ranks_exit() {
    let scratch = Scratch::new("trace-daemon");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let (mut job, ranks) = start_waiting_loop(&scratch, Mpi::OpenMpi, 2, 200, &[]);
    let pids: Vec<u64> = ranks.iter().map(|p| u64::from(*p)).collect();
    wait_for_state(&daemon.target, &pids, "probed");
    let list = pid_list(&ranks);
    let (tracer, trace) = spawn_streaming_trace(&scratch, &daemon.target, &["--pid", &list]);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    finish_ok(&scratch, tracer, LIMIT);
    let summary = devtools_summary(&trace);
    let truths = read_truths(&scratch.path("truth"), 2);
    // The ranks' MPI_Init came before the trace: their collectives are numbered once
    // who-is-late has aligned them (16 calls each).
    assert_world_collectives_numbered(&trace, &truths, Numbered::Aligned { unaligned: 32 });
    for truth in truths {
        let pid = truth["pid"].as_u64().expect("pid");
        let mut expected = routine_table(&truth["routines"]);
        // After its truth is written, each rank calls MPI_Finalize.
        expected.insert("MPI_Finalize".into(), (1, 0));
        assert_traced(&summary, pid, &expected);
        assert_eq!(
            summary["processes"][pid.to_string()]["name"]
                .as_str()
                .map(|n| n.starts_with(&format!("rank {} (", truth["rank"]))),
            Some(true),
            "{summary}"
        );
    }
    daemon.stop(&scratch);
}

/// `commtap trace --steps 3..5 --step-marker MPI_Allreduce@4` of a training loop
/// (`mpi_steps.c`: each step a 4-byte loss `MPI_Allreduce`, then four of 8 bytes), started
/// while rank 0 waits inside the first step's marker for rank 1 (held before it): the
/// daemon sends no call begun before the stream, so rank 0 is not seen making that
/// instance, rank 1 is. Both ranks' traces hold exactly steps 3 to 5, the same instances,
/// in order; the trace ends by itself once both are past step 5, while they still run
/// (they wait for a file only the test writes after it).
#[test]
fn a_trace_of_steps_holds_the_same_steps_of_every_rank_and_ends_after_the_last() {
    let scratch = Scratch::new("trace-steps");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let (steps, k, finish, hold) = (
        10u64,
        4u64,
        scratch.path("finish"),
        scratch.path("first-step"),
    );
    let args: Vec<std::ffi::OsString> = vec![
        steps.to_string().into(),
        k.to_string().into(),
        "2".into(),
        scratch.path("truth").into(),
        "loss".into(),
        finish.clone().into(),
    ];
    let prog = build_program("mpi_steps.c", Mpi::OpenMpi);
    let (mut job, ranks) = start_program_held_before_init(
        &scratch,
        Mpi::OpenMpi,
        2,
        &prog,
        &args,
        &[("HOLD_FIRST_STEP", path_str(&hold))],
    );
    let pids: Vec<u64> = ranks.iter().map(|p| u64::from(*p)).collect();
    wait_for_state(&daemon.target, &pids, "probed");
    std::fs::write(scratch.path("start"), b"go").expect("start file");
    wait_until("rank 0 inside its first MPI_Allreduce", LIMIT, || {
        let out = commtap_output(&["report", "--from", &daemon.target, "--format", "json"]);
        serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|p| {
            p["ranks"].as_array().is_some_and(|ranks| {
                ranks.iter().any(|r| {
                    r["pid"].as_u64() == Some(pids[0]) && r["in_call"]["routine"] == "MPI_Allreduce"
                })
            })
        })
    });
    let (tracer, trace) = spawn_streaming_trace(
        &scratch,
        &daemon.target,
        &[
            "--pid",
            &pid_list(&ranks),
            "--steps",
            "3..5",
            "--step-marker",
            "MPI_Allreduce@4",
        ],
    );
    std::fs::write(&hold, b"go").expect("first step's file");
    let run = finish_ok(&scratch, tracer, LIMIT);
    assert!(
        run.stderr
            .contains("2 of 2 processes began step 3, 2 ended step 5"),
        "{}",
        run.stderr
    );
    std::fs::write(&finish, b"go").expect("finish file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let step: Vec<(String, u64)> = std::iter::once(("MPI_Allreduce".to_string(), 4))
        .chain((0..k).map(|_| ("MPI_Allreduce".to_string(), 8)))
        .collect();
    let expected: Vec<(String, u64)> = (0..3).flat_map(|_| step.clone()).collect();
    let doc = read_json(&trace);
    let mut instances = Vec::new();
    for pid in &pids {
        let mut slices: Vec<(f64, String, u64, Option<u64>)> = doc["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"].as_u64() == Some(*pid) && e["name"] != ARRIVAL)
            .map(|e| {
                (
                    e["ts"].as_f64().expect("ts"),
                    e["name"].as_str().expect("name").to_string(),
                    e["args"]["bytes"].as_u64().expect("bytes"),
                    e["args"]["seq"].as_u64(),
                )
            })
            .collect();
        slices.sort_by(|a, b| a.0.total_cmp(&b.0));
        let calls: Vec<(String, u64)> = slices.iter().map(|s| (s.1.clone(), s.2)).collect();
        assert_eq!(
            calls, expected,
            "pid {pid}: the slices of steps 3 to 5, in order"
        );
        instances.push(slices.iter().map(|s| s.3).collect::<Vec<_>>());
    }
    assert_eq!(
        instances[0], instances[1],
        "both ranks' slices are the same instances"
    );
    assert!(instances[0].iter().all(Option::is_some), "{instances:?}");
    // Each step kept is marked at its marker call's start, on the rank's main thread.
    for pid in &pids {
        let marks: Vec<(String, u64)> = doc["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["ph"] == "I" && e["pid"].as_u64() == Some(*pid))
            .map(|e| {
                (
                    e["name"].as_str().expect("name").to_string(),
                    e["tid"].as_u64().expect("tid"),
                )
            })
            .collect();
        let expected: Vec<(String, u64)> = (3..=5).map(|s| (format!("step {s}"), *pid)).collect();
        assert_eq!(marks, expected, "pid {pid}: the steps' marks");
    }
    assert_eq!(doc["metadata"]["commtap"]["steps"]["from"], 3);
    assert_step_times(&doc, &pids, &run.stderr, (1 + k, 4 + 8 * k));
    // DevTools and Perfetto load it, and find the same: the calls, and each step's mark.
    let expected: BTreeMap<String, (u64, u64)> =
        std::iter::once(("MPI_Allreduce".to_string(), (3 * (1 + k), 3 * (4 + 8 * k))))
            .chain((3..=5).map(|s| (format!("step {s}"), (1, 0))))
            .collect();
    let (devtools, perfetto) = (devtools_summary(&trace), perfetto_summary(&trace));
    for pid in pids {
        assert_traced(&devtools, pid, &expected);
        assert_eq!(
            traced_routines(&perfetto, pid),
            expected,
            "pid {pid} in Perfetto"
        );
    }
    daemon.stop(&scratch);
}

/// `record --trace` of steps 3 to 5 of a launched job whose rank 1 computes 50 ms a step
/// (`mpi_steps.c`) while rank 0 waits for it: the step table, as `commtap trace`'s (the
/// processes named after their first calls, as `record` names them), names rank 1 as the
/// one that spent the least in calls and rank 0 the most.
#[test]
fn a_launched_jobs_step_table_names_the_rank_the_others_waited_for() {
    let scratch = Scratch::new("trace-step-table");
    let prog = build_program("mpi_steps.c", Mpi::OpenMpi);
    let (trace, prefix) = (scratch.path("steps.json"), scratch.path("truth"));
    let mut args: Vec<String> = [
        "record",
        "--trace",
        path_str(&trace),
        "--steps",
        "3..5",
        "--step-marker",
        "MPI_Allreduce@4",
        "--",
    ]
    .map(String::from)
    .to_vec();
    args.extend(Mpi::OpenMpi.launcher(2));
    let k = 4u64;
    for arg in [path_str(&prog), "8", "4", "50", path_str(&prefix), "loss"] {
        args.push(arg.to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    assert!(
        run.stderr
            .contains("2 of 2 processes began step 3, 2 ended step 5"),
        "{}",
        run.stderr
    );
    let truths = read_truths(&prefix, 2);
    let pid_of = |rank: u64| {
        truths
            .iter()
            .find(|t| t["rank"] == rank)
            .and_then(|t| t["pid"].as_u64())
            .expect("a rank's pid")
    };
    let pids = [pid_of(0), pid_of(1)];
    let doc = read_json(&trace);
    assert_step_times(&doc, &pids, &run.stderr, (1 + k, 4 + 8 * k));
    for row in doc["metadata"]["commtap"]["steps"]["per_step"]
        .as_array()
        .expect("per_step")
    {
        let (least, most) = (&row["least_in_calls"], &row["most_in_calls"]);
        assert!(
            least.as_str().is_some_and(|l| l.starts_with("rank 1 (")),
            "{row}"
        );
        assert!(
            most.as_str().is_some_and(|m| m.starts_with("rank 0 (")),
            "{row}"
        );
    }
}

/// The table of steps 3 to 5 (the summary's and the metadata's) against the trace's slices
/// and marks, each rank's steps being `calls` calls of `bytes` bytes in all: per step, both
/// ranks ended it; the least and most of their time in calls (the sum of their slices) and
/// of their step times (steps 3 and 4: from one mark to the next; step 5's end is not in
/// the trace), and whose they are. Times read back from the trace's microseconds may be
/// off by a nanosecond each.
fn assert_step_times(doc: &Value, pids: &[u64], stderr: &str, (calls, bytes): (u64, u64)) {
    let ns = |e: &Value, key: &str| (e[key].as_f64().expect("µs") * 1e3).round() as u64;
    let events = doc["traceEvents"].as_array().expect("events");
    let of = |pid: u64| {
        events
            .iter()
            .filter(move |e| e["pid"].as_u64() == Some(pid))
    };
    let label = |pid: u64| {
        of(pid)
            .find(|e| e["ph"] == "M" && e["name"] == "process_name")
            .map(|e| e["args"]["name"].as_str().expect("name").to_string())
            .expect("a process name")
    };
    // Per step, per pid: its step time (where its next mark is in the trace) and its time
    // in calls.
    let mut times: BTreeMap<u64, Vec<(u64, Option<u64>, u64)>> = BTreeMap::new();
    for pid in pids {
        let marks: Vec<u64> = of(*pid)
            .filter(|e| e["ph"] == "I")
            .map(|e| ns(e, "ts"))
            .collect();
        for (i, step) in (3..=5u64).enumerate() {
            let (start, end) = (marks[i], marks.get(i + 1).copied());
            let in_calls: u64 = of(*pid)
                .filter(|e| e["ph"] == "X" && e["name"] != ARRIVAL)
                .filter(|e| ns(e, "ts") >= start && end.is_none_or(|end| ns(e, "ts") < end))
                .map(|e| ns(e, "dur"))
                .sum();
            times
                .entry(step)
                .or_default()
                .push((*pid, end.map(|end| end - start), in_calls));
        }
    }
    let rows = doc["metadata"]["commtap"]["steps"]["per_step"]
        .as_array()
        .expect("per_step");
    assert_eq!(rows.len(), 3, "{rows:?}");
    let lines: Vec<String> = stderr
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    for (row, (step, each)) in rows.iter().zip(&times) {
        let figure = |key: &str| row[key].as_u64().expect("ns");
        let name = |key: &str| row[key].as_str().expect("whose").to_string();
        // The labels of those whose figure (pid, figure) is within `slack` ns of `ns`.
        let whose = |ns: u64, slack: u64, figures: Vec<(u64, Option<u64>)>| {
            figures
                .iter()
                .filter(|(_, f)| f.is_some_and(|f| f.abs_diff(ns) <= slack))
                .map(|(pid, _)| label(*pid))
                .collect::<Vec<_>>()
        };
        assert_eq!(row["step"], *step);
        assert_eq!(
            (figure("processes"), figure("unfinished")),
            (2, 0),
            "step {step}: {row}"
        );
        assert_eq!(
            row["calls"],
            serde_json::json!([calls, calls]),
            "step {step}"
        );
        assert_eq!(
            row["bytes"],
            serde_json::json!([bytes, bytes]),
            "step {step}"
        );
        let in_calls: Vec<(u64, Option<u64>)> = each.iter().map(|t| (t.0, Some(t.2))).collect();
        let (least, most) = (figure("least_in_calls_ns"), figure("most_in_calls_ns"));
        assert_eq!(
            (least, most),
            (
                each.iter().map(|t| t.2).min().expect("ranks"),
                each.iter().map(|t| t.2).max().expect("ranks")
            ),
            "step {step}: {row}, the slices' {each:?}"
        );
        assert!(
            whose(least, 0, in_calls.clone()).contains(&name("least_in_calls")),
            "{row}"
        );
        assert!(
            whose(most, 0, in_calls).contains(&name("most_in_calls")),
            "{row}"
        );
        let step_times: Vec<(u64, Option<u64>)> = each.iter().map(|t| (t.0, t.1)).collect();
        if step_times.iter().all(|t| t.1.is_some()) {
            let known = || step_times.iter().filter_map(|t| t.1);
            let (shortest, longest) = (figure("shortest_ns"), figure("longest_ns"));
            let near = |a: u64, b: u64| a.abs_diff(b) <= 2;
            assert!(
                near(shortest, known().min().expect("ranks"))
                    && near(longest, known().max().expect("ranks")),
                "step {step}: {row}, the marks' {each:?}"
            );
            assert!(
                whose(longest, 2, step_times).contains(&name("longest")),
                "{row}"
            );
        }
        // The summary prints the same row.
        let ms = |key: &str| format!("{:.3}", figure(key) as f64 / 1e6);
        let line = format!(
            "{step} 2 {} {} {} {} {} {} {} {calls} {bytes}",
            ms("shortest_ns"),
            ms("longest_ns"),
            name("longest"),
            ms("least_in_calls_ns"),
            name("least_in_calls"),
            ms("most_in_calls_ns"),
            name("most_in_calls"),
        );
        assert!(lines.contains(&line), "{line:?} in\n{stderr}");
    }
}

/// A trace that cannot be written fails before the job starts; an unknown format is
/// refused with the list of formats; so is a collective step marker with who-is-late off
/// (it numbers the marker's instances).
#[test]
fn a_trace_that_cannot_be_written_fails_before_the_job_starts() {
    let scratch = Scratch::new("trace-bad");
    let marker = scratch.path("ran");
    let good = scratch.path("t.json");
    for (file, extra, needle) in [
        (
            Path::new("/nonexistent/dir/t.json").to_path_buf(),
            &[][..],
            "No such file",
        ),
        (scratch.path("t.perfetto"), &[][..], "FILE.json"),
        (
            good.clone(),
            &["--no-skew", "--step-marker", "MPI_Allreduce"][..],
            "--no-skew turns it off",
        ),
    ] {
        let mut args = vec!["record", "--trace", path_str(&file)];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "touch", path_str(&marker)]);
        let run = run_commtap(&scratch, &args, LIMIT);
        assert!(!run.status.success(), "{}", run.stderr);
        assert!(run.stderr.contains(needle), "{}", run.stderr);
        assert!(!marker.exists(), "the command ran");
    }
}

/// End times (µs on the trace's axis) of each process's calls of `routine`, in order.
fn ends_of(trace: &Value, routine: &str) -> BTreeMap<u64, Vec<f64>> {
    let mut ends: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for e in trace["traceEvents"].as_array().expect("events") {
        if e["ph"] == "X" && e["name"] == routine {
            let (ts, dur) = (
                e["ts"].as_f64().expect("ts"),
                e["dur"].as_f64().expect("dur"),
            );
            ends.entry(e["pid"].as_u64().expect("pid"))
                .or_default()
                .push(ts + dur);
        }
    }
    for v in ends.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    ends
}

/// One job, two "nodes" (a daemon each, watching half of the ranks), the second node's
/// clock 5 s ahead: `commtap trace --from A --from B --job J` writes one trace with every
/// rank's calls, the offset it reports equals the injected one within the error it
/// reports, and after correction both halves of each MPI_Allreduce end together.
#[test]
fn a_trace_of_two_nodes_puts_both_on_one_clock() {
    two_nodes_on_one_clock(Route::Daemons);
}

/// The same through an aggregator that says where the nodes serve: `commtap trace --from
/// AGGREGATOR --job J --direct`, the nodes' daemons on mutual TLS, each telling the
/// aggregator where it serves (`--advertise`).
#[test]
fn a_trace_through_the_aggregator_holds_every_node_on_one_clock() {
    two_nodes_on_one_clock(Route::AggregatorSaysWhere);
}

/// The same relayed by the aggregator, to a client the nodes refuse: the daemons take
/// calls only from the aggregator's certificate (another CA's), and the client does not
/// trust theirs; `--direct` fails, the relayed trace holds every call.
#[test]
fn a_trace_relayed_by_the_aggregator_reaches_nodes_the_client_cannot() {
    two_nodes_on_one_clock(Route::Relayed);
}

/// How a two-node trace reaches its nodes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    /// `--from` each daemon.
    Daemons,
    /// `--from` the aggregator `--direct`: it says where the daemons serve.
    AggregatorSaysWhere,
    /// `--from` the aggregator: it relays.
    Relayed,
}

/// A TLS aggregator on this host (its callers', readers' and daemons', certificates signed
/// by the scratch directory's CA), the CA daemons take its calls and pushes with, and the
/// global options of a caller with the reader's role.
struct TlsAggregator {
    _scratch: Scratch,
    _child: ChildGuard,
    url: String,
    /// What daemons verify the aggregator with (--tls-ca), and accept callers of their API
    /// by (--tls-client-ca).
    node_ca: String,
    reader: Vec<String>,
}

impl TlsAggregator {
    /// With `own_ca`, the aggregator's certificate is another CA's, and only that CA is
    /// the nodes': the readers reach the nodes no more.
    fn start(scratch: &Scratch, own_ca: bool) -> TlsAggregator {
        let (ca, mut cert, mut key) = make_certs(&scratch.0);
        let agg_scratch = Scratch::new("trace-aggregator");
        let mut agg_ca = ca.clone();
        if own_ca {
            agg_ca = make_certs(&agg_scratch.0).0;
            // It calls the daemons with it, too: a client's as much as a server's.
            (cert, key) = make_client_cert(&agg_scratch.0, "aggregator", None);
        }
        let [ca, agg_ca, cert, key] = [ca, agg_ca, cert, key].map(|p| path_str(&p).to_string());
        let addr = free_port();
        let db = scratch.path("agg.redb");
        let child = spawn_commtap(
            &agg_scratch,
            &[
                "--tls-ca",
                &ca,
                "aggregator",
                "--listen",
                &addr,
                "--db",
                path_str(&db),
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-client-ca",
                &ca,
            ],
        );
        let (read_cert, read_key) = make_client_cert(&scratch.0, "reader", Some("commtap-read"));
        let reader = vec![
            "--tls-ca".to_string(),
            agg_ca.clone(),
            "--tls-cert".into(),
            path_str(&read_cert).into(),
            "--tls-key".into(),
            path_str(&read_key).into(),
        ];
        TlsAggregator {
            _scratch: agg_scratch,
            _child: child,
            url: format!("https://{addr}"),
            node_ca: agg_ca,
            reader,
        }
    }
}

fn two_nodes_on_one_clock(route: Route) {
    const OFFSET_NS: i64 = 5_000_000_000;
    let scratch = Scratch::new("trace-two-nodes");
    let aggregator =
        (route != Route::Daemons).then(|| TlsAggregator::start(&scratch, route == Route::Relayed));
    let job_id = format!("trace{}", std::process::id());
    let n = 200u64;
    let (mut job, ranks) =
        start_waiting_loop(&scratch, Mpi::OpenMpi, 4, n, &[("SLURM_JOB_ID", &job_id)]);
    let offset = OFFSET_NS.to_string();
    let nodes = [
        ("node-a", &ranks[..2], "0"),
        ("node-b", &ranks[2..], offset.as_str()),
    ];
    let mut daemons = Vec::new();
    for (node, pids, clock) in nodes {
        let node_scratch = Scratch::new(&format!("trace-{node}"));
        let list = pid_list(pids);
        let mut args: Vec<String> = [
            "--node-name",
            node,
            "--pid",
            &list,
            "--test-clock-offset-ns",
            clock,
        ]
        .map(String::from)
        .to_vec();
        let mut global = Vec::new();
        if let Some(agg) = &aggregator {
            // Serves its API on mutual TLS, says where, and pushes, with its node's
            // certificate.
            let addr = free_port();
            args.extend(
                [
                    "--listen",
                    &addr,
                    "--tls-client-ca",
                    &agg.node_ca,
                    "--advertise",
                    &format!("https://{addr}"),
                    "--aggregator",
                    &agg.url,
                    "--push-interval",
                    "200ms",
                ]
                .map(String::from),
            );
            let (cert, key) = make_client_cert(&scratch.0, node, Some("commtap-push"));
            global = vec![
                "--tls-ca".to_string(),
                agg.node_ca.clone(),
                "--tls-cert".into(),
                path_str(&cert).into(),
                "--tls-key".into(),
                path_str(&key).into(),
            ];
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let global: Vec<&str> = global.iter().map(String::as_str).collect();
        let d = Daemon::start(&node_scratch, &[], &global, &args);
        let watched: Vec<u64> = pids.iter().map(|p| u64::from(*p)).collect();
        wait_for_state(&d.target, &watched, "probed");
        daemons.push((node_scratch, d));
    }
    let trace = scratch.path("t.json");
    let ready = scratch.path("trace.ready");
    let mut args: Vec<String> = Vec::new();
    if let Some(agg) = &aggregator {
        // Once both nodes have told the aggregator where they serve (the job has made
        // no call since they attached: the aggregator does not know it yet, and the
        // trace asks every node for it).
        let mut list = agg.reader.clone();
        list.extend(["jobs", "--json", "--from", &agg.url].map(String::from));
        let list: Vec<&str> = list.iter().map(String::as_str).collect();
        wait_until("both nodes to reach the aggregator", LIMIT, || {
            let out = commtap_output(&list);
            let jobs: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            jobs["node_api"].as_object().is_some_and(|m| m.len() == 2)
        });
        args.extend(agg.reader.iter().cloned());
        args.extend(["trace", "--from", &agg.url].map(String::from));
        match route {
            Route::AggregatorSaysWhere => args.push("--direct".into()),
            Route::Relayed => {
                // This client cannot stream from the nodes itself.
                let mut direct = args.clone();
                direct.extend(
                    [
                        "--job",
                        &job_id,
                        "--direct",
                        "-o",
                        path_str(&scratch.path("d.json")),
                    ]
                    .map(String::from),
                );
                let direct: Vec<&str> = direct.iter().map(String::as_str).collect();
                let out = commtap_output(&direct);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    !out.status.success() && stderr.contains("certificate"),
                    "--direct reached the nodes: {stderr}"
                );
                // A node's certificate may push, not read: it gets no relayed trace.
                let (pem, key) = (
                    scratch.path("node-a-commtap-push.pem"),
                    scratch.path("node-a-commtap-push.key"),
                );
                let out = commtap_output(&[
                    "--tls-ca",
                    &agg.node_ca,
                    "--tls-cert",
                    path_str(&pem),
                    "--tls-key",
                    path_str(&key),
                    "trace",
                    "--from",
                    &agg.url,
                    "--job",
                    &job_id,
                    "-o",
                    path_str(&scratch.path("p.json")),
                ]);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    !out.status.success() && stderr.contains("may push, not read"),
                    "a pusher's relayed trace: {stderr}"
                );
            }
            Route::Daemons => {}
        }
    } else {
        args.push("trace".into());
        for (_, d) in &daemons {
            args.extend(["--from".to_string(), d.target.clone()]);
        }
    }
    args.extend(
        [
            "--job",
            &job_id,
            "-o",
            path_str(&trace),
            "--ready-file",
            path_str(&ready),
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let tracer = spawn_commtap(&scratch, &args);
    wait_until("the trace to stream from both nodes", LIMIT, || {
        ready.exists()
    });
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    let run = finish_ok(&scratch, tracer, LIMIT);
    assert!(run.stderr.contains("clocks aligned"), "{}", run.stderr);

    // Every rank, named by its node.
    let summary = devtools_summary(&trace);
    for truth in read_truths(&scratch.path("truth"), 4) {
        let pid = truth["pid"].as_u64().expect("pid");
        let mut expected = routine_table(&truth["routines"]);
        expected.insert("MPI_Finalize".into(), (1, 0));
        assert_traced(&summary, pid, &expected);
        let node = if ranks[..2].contains(&(pid as u32)) {
            "node-a"
        } else {
            "node-b"
        };
        assert_eq!(
            summary["processes"][pid.to_string()]["name"],
            format!("rank {} ({node})", truth["rank"]),
        );
    }

    // The offset found is the injected one, within the error it states.
    let raw = read_json(&trace);
    let clocks = &raw["metadata"]["commtap"]["clock"]["nodes"];
    assert_eq!(clocks[1]["node"], "node-b", "{clocks}");
    let found = clocks[1]["offset_ns"].as_i64().expect("offset");
    let error = clocks[1]["error_ns"].as_u64().expect("error");
    assert!(
        found.abs_diff(OFFSET_NS) <= error,
        "offset {found} ns, error {error} ns, injected {OFFSET_NS} ns"
    );
    // Both halves of each allreduce end together once node-b's times are corrected (on
    // this oversubscribed machine a rank may be descheduled for a few ms: the median).
    let ends = ends_of(&raw, "MPI_Allreduce");
    let end = |pid: u32| &ends[&u64::from(pid)];
    let mut gaps: Vec<f64> = (0..n as usize)
        .map(|k| (end(ranks[0])[k] - end(ranks[2])[k]).abs())
        .collect();
    gaps.sort_by(f64::total_cmp);
    let median_us = gaps[gaps.len() / 2];
    eprintln!(
        "node-b: offset {found} ns (injected {OFFSET_NS}), error {error} ns; median gap \
         between the nodes' allreduce ends {median_us:.1} µs"
    );
    let slack_us = error as f64 / 1e3 + 50_000.0;
    assert!(
        median_us <= slack_us,
        "median gap between the nodes' allreduce ends: {median_us} µs (error {error} ns)"
    );
    for (node_scratch, d) in daemons {
        d.stop(&node_scratch);
    }
}

/// NCCL (the real `libnccl.so.2`, no GPU): each group is one `ncclGroup` slice from its
/// `ncclGroupStart` to its `ncclGroupEnd`, around the operations enqueued in it, carrying
/// their bytes: as many slices and bytes as the program's truth counts groups.
#[test]
fn an_nccl_group_is_a_slice_around_its_operations() {
    let scratch = Scratch::new("trace-nccl-group");
    let prog = build_nccl_program("nccl_calls.c", &nccl_lib_dir(), &["libnccl.so.2"]);
    let (trace, out, truth) = (
        scratch.path("t.json"),
        scratch.path("p.json"),
        scratch.path("truth.json"),
    );
    let (ready, go) = (scratch.path("ready"), scratch.path("go"));
    let commtap = spawn_commtap(
        &scratch,
        &[
            "record",
            "--trace",
            path_str(&trace),
            "--format",
            "json",
            "-o",
            path_str(&out),
            "--",
            path_str(&prog),
            path_str(&ready),
            path_str(&go),
            "50",
            path_str(&truth),
        ],
    );
    wait_until("the program to be ready", LIMIT, || ready.exists());
    std::fs::write(&go, b"").expect("go file");
    finish_ok(&scratch, commtap, LIMIT);
    let truth = read_json(&truth);
    let summary = devtools_summary(&trace);
    let (pid, process) = summary["processes"]
        .as_object()
        .and_then(|p| p.iter().next())
        .expect("one process");
    let pid: u64 = pid.parse().expect("pid");
    let traced = traced_routines(&summary, pid);
    let group = routine_table(&truth["routines"])["ncclGroup"];
    assert_eq!(traced.get("ncclGroup"), Some(&group), "groups: {traced:?}");
    let nested: Vec<(String, String)> = process["nested"]
        .as_array()
        .expect("nested")
        .iter()
        .filter_map(|p| Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string())))
        .collect();
    for op in ["ncclGroupStart", "ncclSend", "ncclRecv", "ncclGroupEnd"] {
        let inside = nested
            .iter()
            .filter(|(outer, inner)| outer == "ncclGroup" && inner == op)
            .count() as u64;
        assert_eq!(inside, group.0, "{op} inside its group");
    }
}
