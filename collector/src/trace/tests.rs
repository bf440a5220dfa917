//! A trace written and read back: valid, named, split, windowed, NCCL groups nested.

use std::path::Path;

use super::{groups::NcclGroups, *};

fn ev(pid: u32, routine: &str, start_ns: u64) -> pb::CallEvent {
    pb::CallEvent {
        pid,
        tid: pid,
        routine: routine.into(),
        start_ns,
        duration_ns: 1500,
        bytes: Some(16),
        peer: Some(1),
        comm_size: 2,
        comm_rank: Some(0),
        ..Default::default()
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("commtap-trace-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    dir.join("t.json")
}

/// Options for a trace into `path` of steps `from..to` begun by `marker`.
fn with_steps(path: PathBuf, from: u64, to: Option<u64>, marker: &str) -> TraceOptions {
    let mut opts = TraceOptions::new(path);
    opts.steps = Some(Steps {
        from,
        to,
        marker: marker.parse().expect("a marker"),
    });
    opts
}

fn load(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("read")).expect("valid JSON")
}

fn slices(v: &serde_json::Value) -> usize {
    v["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["ph"] == "X")
        .count()
}

#[test]
fn a_trace_is_valid_json_with_names_and_losses() {
    let path = scratch("valid");
    let mut opts = TraceOptions::new(path.clone());
    opts.max_events = Some(2);
    opts.routines.exclude = vec!["MPI_Iprobe".into()];
    let mut w = TraceWriter::create(opts).expect("create");
    for i in 0..3 {
        w.call(&ev(7, "MPI_Send", 1000 + i)).expect("call");
    }
    w.call(&ev(8, "MPI_Iprobe", 1000)).expect("call");
    w.call(&ev(8, "MPI_Recv", 1000)).expect("call");
    assert_eq!(w.unnamed(), vec![7, 8]);
    w.name(
        7,
        ProcessName {
            rank: Some(0),
            host: "n1".into(),
            job: "j".into(),
        },
    );
    let s = w.finish().expect("finish");
    assert_eq!((s.events, s.lost.max_events), (3, 1));
    let v = load(&path);
    assert_eq!(slices(&v), 3);
    let names: Vec<&str> = v["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert_eq!(names, vec!["rank 0 (n1)", "pid 8"]);
    assert_eq!(v["metadata"]["commtap"]["calls_lost"]["max_events"], 1);
}

/// Past `--max-events`, a test left out takes the slice of the messages it completed with
/// it; one written keeps it.
#[test]
fn the_arrivals_of_a_call_left_out_past_max_events_are_left_out_too() {
    // MPI_Init, then twice an MPI_Irecv and the MPI_Test that completed it: the first
    // test is kept with 3 calls a process, neither with 2.
    for (max, tests_kept) in [(2, 0), (3, 1)] {
        let path = scratch(&format!("max-arrivals-{max}"));
        let mut opts = TraceOptions::new(path.clone());
        opts.max_events = Some(max);
        let mut w = TraceWriter::create(opts).expect("create");
        let call = |routine: &str, at: u64| pb::CallEvent {
            comm: "world".into(),
            tag: Some(3),
            ..ev(7, routine, at)
        };
        let arrival_after = |at: u64| pb::CallEvent {
            arrival: Some(pb::Arrival {
                posted_tid: 7,
                posted_start_ns: at - 500,
                follows_call: true,
                ..Default::default()
            }),
            ..call("MPI_Test", at)
        };
        w.call(&call("MPI_Init", 0)).expect("call");
        for at in [1000, 2000] {
            w.call(&call("MPI_Irecv", at - 500)).expect("call");
            w.call(&call("MPI_Test", at)).expect("call");
            w.call(&arrival_after(at)).expect("call");
        }
        let s = w.finish().expect("finish");
        assert_eq!((s.events, s.lost.max_events), (max, 5 - max));
        let v = load(&path);
        let arrivals = v["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["name"] == super::writer::ARRIVAL)
            .count();
        assert_eq!(arrivals, tests_kept, "{max}: {v:#}");
    }
}

#[test]
fn a_trace_past_its_split_size_goes_on_in_numbered_files_that_each_load() {
    let path = scratch("split");
    let mut opts = TraceOptions::new(path.clone());
    opts.split_bytes = 1000;
    let mut w = TraceWriter::create(opts).expect("create");
    for i in 0..50 {
        w.call(&ev(7, "MPI_Send", 1000 * i)).expect("call");
    }
    let s = w.finish().expect("finish");
    assert!(s.files.len() > 2, "{:?}", s.files);
    assert_eq!(s.files[1], part_path(&path, 2));
    let total: usize = s.files.iter().map(|f| slices(&load(f))).sum();
    assert_eq!(total, 50);
}

#[test]
fn a_window_keeps_the_calls_that_start_inside_it() {
    let path = scratch("window");
    let mut opts = TraceOptions::new(path.clone());
    opts.window = Some((1.0, 2.0));
    let mut w = TraceWriter::create(opts).expect("create");
    for s in [
        0u64,
        500_000_000,
        1_000_000_000,
        1_500_000_000,
        2_500_000_000,
    ] {
        w.call(&ev(7, "MPI_Send", s)).expect("call");
    }
    assert_eq!(w.finish().expect("finish").events, 2);
}

/// Steps 2..3 begun by `MPI_Allreduce@4`: each process's calls from its 2nd marker call to
/// its 4th, another thread's placed by its start; the trace is done once every process is
/// past step 3 or gone. Step 0 is what came before the first marker.
#[test]
fn steps_keep_the_calls_from_the_start_of_one_marker_call_to_another() {
    let call = |tid: u32, routine: &str, start_ns: u64, bytes: u64| pb::CallEvent {
        tid,
        bytes: Some(bytes),
        ..ev(7, routine, start_ns)
    };
    // Numbered on the world, as who-is-late numbers them: three a step.
    let numbered = |routine: &str, start_ns: u64, bytes: u64, seq: u64| pb::CallEvent {
        comm: "world".into(),
        seq: Some(seq),
        ..call(7, routine, start_ns, bytes)
    };
    for ((from, to), written, began, ended) in [((2, 3), 9, 1, 1), ((0, 0), 3, 2, 1)] {
        let path = scratch(&format!("steps-{from}-{to}"));
        let opts = with_steps(path.clone(), from, Some(to), "MPI_Allreduce@4");
        let mut w = TraceWriter::create(opts).expect("create");
        w.call(&call(7, "MPI_Comm_rank", 10, 0)).expect("call");
        // Another process: a call in step 0, none of the marker, then gone.
        w.call(&pb::CallEvent {
            bytes: Some(0),
            ..ev(8, "MPI_Barrier", 20)
        })
        .expect("call");
        w.exited(8);
        // A marker not numbered yet (who-is-late aligning the ranks) begins no step.
        w.call(&call(7, "MPI_Allreduce", 500, 4)).expect("call");
        for step in 1..=5u64 {
            let at = step * 1000;
            w.call(&numbered("MPI_Allreduce", at, 4, step * 3))
                .expect("call");
            // One of its device windows is no call: it begins no step.
            w.call(&pb::CallEvent {
                device_window: Some(pb::DeviceWindow::default()),
                ..call(7, "MPI_Allreduce", at + 50, 4)
            })
            .expect("call");
            for i in 1..=2 {
                w.call(&numbered("MPI_Allreduce", at + 100 * i, 8, step * 3 + i))
                    .expect("call");
            }
            if step == 2 {
                // Another thread's call in step 2, come after the step's marker.
                w.call(&call(70, "MPI_Send", at + 150, 8)).expect("call");
            }
            assert_eq!(w.steps_done(), step > to, "after step {step}");
        }
        let s = w.finish().expect("finish");
        // Steps 2 and 3: a marker, its device window and two calls each, and the other
        // thread's send; step 0: the first call of each process, and the marker not
        // numbered.
        assert_eq!(s.events, written, "{from}..{to}");
        let reached = s.steps.as_ref().expect("steps reached");
        assert_eq!(
            (
                reached.processes,
                reached.began,
                reached.ended,
                reached.unnumbered
            ),
            (2, began, ended, 1),
            "{from}..{to}"
        );
        let text = s.to_string();
        assert!(
            text.contains(&format!(
                "{began} of 2 processes began step {from}, {ended} ended step {to}"
            )),
            "{text}"
        );
        let v = load(&path);
        assert_eq!(
            v["metadata"]["commtap"]["steps"]["marker"],
            "MPI_Allreduce@4"
        );
        // Each step kept is marked where its marker call starts, on that call's thread.
        let marks: Vec<(String, f64, u64)> = v["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["ph"] == "I")
            .map(|e| {
                (
                    e["name"].as_str().expect("name").to_string(),
                    e["ts"].as_f64().expect("ts"),
                    e["tid"].as_u64().expect("tid"),
                )
            })
            .collect();
        let expected: Vec<(String, f64, u64)> = (from.max(1)..=to)
            .map(|step| (format!("step {step}"), (step * 1000) as f64 / 1e3, 7))
            .collect();
        assert_eq!(marks, expected, "{from}..{to}");
    }
}

/// Each step's time per process, from its marker call to its next, its time in calls (a
/// late thread's call in the step it started in) and its GPU's: the least and the most
/// over the processes that ended it, and whose.
#[test]
fn each_step_is_timed_per_process_and_the_longest_named() {
    let path = scratch("step-times");
    let mut w = TraceWriter::create(with_steps(path.clone(), 2, Some(3), "MPI_Allreduce@4"))
        .expect("create");
    for (pid, rank) in [(7, 0), (8, 1), (9, 2)] {
        w.name(
            pid,
            ProcessName {
                rank: Some(rank),
                host: "n1".into(),
                job: "j".into(),
            },
        );
    }
    let call = |pid: u32, tid: u32, start_ns: u64, duration_ns: u64, bytes: u64| pb::CallEvent {
        pid,
        tid,
        routine: "MPI_Send".into(),
        start_ns,
        duration_ns,
        bytes: Some(bytes),
        ..Default::default()
    };
    // Step k is the marker's instance 2k.
    let marker = |pid: u32, start_ns: u64, duration_ns: u64, step: u64| pb::CallEvent {
        routine: "MPI_Allreduce".into(),
        comm: "world".into(),
        seq: Some(2 * step),
        ..call(pid, pid, start_ns, duration_ns, 4)
    };
    for step in 1..=2 {
        w.call(&marker(7, step * 1000, 100, step)).expect("call");
    }
    w.call(&call(7, 7, 2200, 300, 8)).expect("call");
    // Another thread's call begun after step 3's marker call, come before it (it returned
    // first): in step 3.
    w.call(&call(7, 71, 3010, 200, 8)).expect("call");
    for step in 3..=4 {
        w.call(&marker(7, step * 1000, 100, step)).expect("call");
    }
    w.call(&pb::CallEvent {
        device_window: Some(pb::DeviceWindow::default()),
        ..call(7, 7, 3050, 400, 4)
    })
    .expect("call");
    for (step, at, took) in [(1, 1100, 50), (2, 2100, 50), (3, 3600, 60), (4, 4100, 50)] {
        w.call(&marker(8, at, took, step)).expect("call");
    }
    // Another thread's call in step 2, come after step 3's marker.
    w.call(&call(8, 80, 2200, 700, 16)).expect("call");
    // Rank 2 begins step 3 and no other.
    w.call(&marker(9, 3200, 100, 3)).expect("call");
    let s = w.finish().expect("finish");
    let reached = s.steps.as_ref().expect("steps");
    let row = |step, ended, unfinished, time, in_calls, device, calls, bytes| {
        let ((shortest_ns, longest_ns), longest) = time;
        let ((least_in_calls_ns, least_in_calls), (most_in_calls_ns, most_in_calls)) = in_calls;
        let (most_device_ns, most_device): (u64, &str) = device;
        StepRow {
            step,
            processes: ended,
            unfinished,
            shortest_ns,
            longest_ns,
            longest: format!("rank {longest} (n1)"),
            least_in_calls_ns,
            least_in_calls: format!("rank {least_in_calls} (n1)"),
            most_in_calls_ns,
            most_in_calls: format!("rank {most_in_calls} (n1)"),
            most_device_ns,
            most_device: most_device.into(),
            calls,
            bytes,
        }
    };
    assert_eq!(
        reached.per_step,
        vec![
            row(
                2,
                2,
                0,
                ((1000, 1500), 1),
                ((400, 0), (750, 1)),
                (0, ""),
                (2, 2),
                (12, 20)
            ),
            row(
                3,
                2,
                1,
                ((500, 1000), 0),
                ((60, 1), (300, 0)),
                (400, "rank 0 (n1)"),
                (1, 2),
                (4, 12)
            ),
        ]
    );
    assert_eq!(reached.unplaced, 0);
    let text = s.to_string();
    for line in [
        "     2     2          0.001     0.002  rank 1 (n1)              0.000  rank 0 (n1)     0.001  rank 1 (n1)",
        "     3     2          0.001     0.001  rank 0 (n1)              0.000  rank 1 (n1)     0.000  rank 0 (n1)",
        "0.000  -                 2       12..20",
        "(1 unfinished: the trace ended, the next marker call was lost, the numbering changed, or the process exited)",
        "GPU ms: most",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    let v = load(&path);
    let tabled = &v["metadata"]["commtap"]["steps"]["per_step"];
    assert_eq!(tabled[0]["longest_ns"], 1500, "{tabled}");
    assert_eq!(tabled[1]["most_device"], "rank 0 (n1)", "{tabled}");
}

#[test]
fn a_marker_that_never_came_is_said() {
    let path = scratch("steps-never");
    let opts = with_steps(path, 1, None, "MPI_Bcast");
    let mut w = TraceWriter::create(opts).expect("create");
    w.call(&ev(7, "MPI_Send", 10)).expect("call");
    assert!(!w.steps_done(), "no last step: never done");
    let s = w.finish().expect("finish");
    assert_eq!(s.events, 0);
    let text = s.to_string();
    assert!(
        text.contains("no process began step 1 (1 seen; a step begins at each call of MPI_Bcast)"),
        "{text}"
    );
    assert!("MPI_Bcst".parse::<StepMarker>().is_err());
    assert!("MPI_Bcast@x".parse::<StepMarker>().is_err());
}

#[test]
fn a_nested_nccl_group_is_one_slice_from_its_outermost_start_to_its_end() {
    let mut groups = NcclGroups::default();
    let at = |routine: &str, start_ns: u64, bytes: Option<u64>| pb::CallEvent {
        pid: 7,
        tid: 8,
        routine: routine.into(),
        start_ns,
        duration_ns: 10,
        bytes,
        ..Default::default()
    };
    assert!(groups.track(&at("ncclGroupStart", 100, None)).is_none());
    assert!(groups.track(&at("ncclGroupStart", 120, None)).is_none());
    assert!(groups.track(&at("ncclSend", 140, Some(5))).is_none());
    assert!(groups.track(&at("ncclRecv", 160, Some(9))).is_none());
    assert!(groups.track(&at("ncclGroupEnd", 180, None)).is_none());
    let g = groups
        .track(&at("ncclGroupEnd", 200, None))
        .expect("the outer end closes it");
    assert_eq!(
        (g.routine.as_str(), g.start_ns, g.duration_ns, g.bytes),
        ("ncclGroup", 100, 111, Some(14))
    );
    // An end whose start came before the trace began closes nothing.
    assert!(groups.track(&at("ncclGroupEnd", 300, None)).is_none());
}

#[test]
fn unknown_formats_are_refused_with_the_list() {
    let e = TraceWriter::create(TraceOptions::new("/tmp/x.perfetto".into()))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("FILE.json"), "{e}");
    assert!(e.to_string().contains("FILE.pftrace"), "{e}");
}

/// A slice of a `.pftrace` file: (track, name, begin, end).
type Slice = (u64, String, u64, u64);

/// The slices of a `.pftrace` file, decoded, in file order, and the process names its
/// descriptors give, in order.
fn pftrace_slices(path: &Path) -> (Vec<Slice>, Vec<(i32, String)>) {
    use perfetto::proto::{trace_packet::Data, track_event::NameField, Trace};
    use prost::Message;
    let trace = Trace::decode(std::fs::read(path).expect("read").as_slice()).expect("decodes");
    let mut names = std::collections::HashMap::new();
    let mut open: std::collections::HashMap<u64, Vec<(String, u64)>> = Default::default();
    let (mut slices, mut processes) = (Vec::new(), Vec::new());
    for p in trace.packet {
        assert_eq!(p.trusted_packet_sequence_id, Some(1));
        for n in p.interned_data.iter().flat_map(|i| &i.event_names) {
            names.insert(n.iid(), n.name().to_string());
        }
        let ts = p.timestamp();
        match p.data {
            Some(Data::TrackDescriptor(d)) => {
                if let Some(proc_) = d.process {
                    processes.push((proc_.pid(), proc_.process_name().to_string()));
                }
            }
            Some(Data::TrackEvent(e)) if e.r#type == Some(1) => {
                let Some(NameField::NameIid(iid)) = e.name_field else {
                    panic!("a slice's name is interned: {e:?}");
                };
                let name = names.get(&iid).expect("interned before use").clone();
                open.entry(e.track_uuid()).or_default().push((name, ts));
            }
            Some(Data::TrackEvent(e)) if e.r#type == Some(2) => {
                let (name, begin) = open
                    .get_mut(&e.track_uuid())
                    .and_then(Vec::pop)
                    .expect("an end closes a begin");
                slices.push((e.track_uuid(), name, begin, ts));
            }
            _ => {}
        }
    }
    (slices, processes)
}

#[test]
fn a_pftrace_holds_the_same_slices_with_interned_names_and_late_process_names() {
    let dir = scratch("pftrace");
    let path = dir.with_file_name("t.pftrace");
    let mut w = TraceWriter::create(TraceOptions::new(path.clone())).expect("create");
    w.call(&ev(7, "MPI_Send", 1000)).expect("call");
    w.call(&ev(7, "MPI_Send", 5000)).expect("call");
    w.call(&pb::CallEvent {
        tid: 9,
        ..ev(7, "MPI_Recv", 2000)
    })
    .expect("call");
    w.name(
        7,
        ProcessName {
            rank: Some(3),
            host: "n1".into(),
            job: "j".into(),
        },
    );
    let s = w.finish().expect("finish");
    assert_eq!(s.events, 3);
    let (slices, processes) = pftrace_slices(&path);
    let main = (7u64 << 32) | 7;
    assert_eq!(
        slices,
        vec![
            (main, "MPI_Send".to_string(), 1000, 2500),
            (main, "MPI_Send".to_string(), 5000, 6500),
            ((7 << 32) | 9, "MPI_Recv".to_string(), 2000, 3500),
        ]
    );
    assert_eq!(
        processes,
        vec![(7, "rank 3 (n1)".to_string())],
        "described once, at the end, with the name learnt after its first call"
    );
}

/// With a step marker and no steps left out, every step is marked, in `.pftrace` too: an
/// instant on the marker call's thread.
#[test]
fn a_pftrace_marks_each_step_on_the_marker_calls_thread() {
    use perfetto::proto::{trace_packet::Data, track_event::NameField, Trace};
    use prost::Message;
    let path = scratch("pfsteps").with_file_name("t.pftrace");
    let opts = with_steps(path.clone(), 0, None, "MPI_Send");
    let mut w = TraceWriter::create(opts).expect("create");
    w.call(&ev(7, "MPI_Recv", 500)).expect("call");
    for at in [1000, 3000] {
        w.call(&pb::CallEvent {
            tid: 9,
            ..ev(7, "MPI_Send", at)
        })
        .expect("call");
    }
    let s = w.finish().expect("finish");
    assert_eq!(s.events, 3, "nothing left out");
    assert!(
        s.to_string()
            .contains("2 steps marked, each begun by a call of MPI_Send (1 processes)"),
        "{s}"
    );
    let trace = Trace::decode(std::fs::read(&path).expect("read").as_slice()).expect("decodes");
    let instants: Vec<(u64, String, u64)> = trace
        .packet
        .into_iter()
        .filter_map(|p| {
            let ts = p.timestamp();
            match p.data {
                Some(Data::TrackEvent(e)) if e.r#type == Some(3) => match e.name_field.clone() {
                    Some(NameField::Name(n)) if n.starts_with("step") => {
                        Some((e.track_uuid(), n, ts))
                    }
                    _ => None,
                },
                _ => None,
            }
        })
        .collect();
    let thread = (7u64 << 32) | 9;
    assert_eq!(
        instants,
        vec![
            (thread, "step 1".to_string(), 1000),
            (thread, "step 2".to_string(), 3000)
        ]
    );
    let (slices, _) = pftrace_slices(&path);
    assert_eq!(
        slices.len(),
        3,
        "the calls' slices are all there: {slices:?}"
    );
}

/// A step's mark goes into the part its marker call's slice goes into.
#[test]
fn a_split_trace_keeps_each_step_mark_with_its_call() {
    let path = scratch("steps-split");
    let mut opts = with_steps(path.clone(), 0, None, "MPI_Send");
    opts.split_bytes = 500;
    let mut w = TraceWriter::create(opts).expect("create");
    for i in 0..40 {
        w.call(&ev(7, "MPI_Send", 1000 * (i + 1))).expect("call");
    }
    let s = w.finish().expect("finish");
    assert!(s.files.len() > 3, "{:?}", s.files);
    let mut marks = 0;
    for f in &s.files {
        let v = load(f);
        let events = v["traceEvents"].as_array().expect("events");
        for mark in events.iter().filter(|e| e["ph"] == "I") {
            marks += 1;
            assert!(
                events
                    .iter()
                    .any(|e| e["ph"] == "X" && e["ts"] == mark["ts"]),
                "{}: {mark} without its call",
                f.display()
            );
        }
    }
    assert_eq!(marks, 40);
}

#[test]
fn a_split_pftrace_interns_and_describes_again_in_every_part() {
    let path = scratch("pfsplit").with_file_name("t.pftrace");
    let mut opts = TraceOptions::new(path.clone());
    opts.split_bytes = 400;
    let mut w = TraceWriter::create(opts).expect("create");
    for i in 0..50 {
        w.call(&ev(7, "MPI_Send", 1000 * i)).expect("call");
    }
    let s = w.finish().expect("finish");
    assert!(s.files.len() > 2, "{:?}", s.files);
    assert_eq!(s.files[1], path.with_file_name("t.2.pftrace"));
    let mut total = 0;
    for f in &s.files {
        let (slices, processes) = pftrace_slices(f);
        assert_eq!(processes, vec![(7, "pid 7".to_string())]);
        total += slices.len();
    }
    assert_eq!(total, 50);
}

#[test]
fn a_device_window_is_a_slice_on_its_ranks_gpu_track_and_leaves_groups_alone() {
    let path = scratch("device");
    let mut w = TraceWriter::create(TraceOptions::new(path.clone())).expect("create");
    let window = |routine: &str, not_attributed: bool| pb::CallEvent {
        device_window: Some(pb::DeviceWindow { not_attributed }),
        ..ev(7, routine, 3000)
    };
    w.call(&ev(7, "ncclGroupStart", 1000)).expect("call");
    w.call(&ev(7, "ncclAllReduce", 1500)).expect("call");
    // A window ending inside a group adds nothing to the group's bytes.
    w.call(&window("ncclAllReduce", false)).expect("call");
    w.call(&window("ncclAllReduce", true)).expect("call");
    w.call(&ev(7, "ncclGroupEnd", 4000)).expect("call");
    w.finish().expect("finish");
    let v = load(&path);
    let events = v["traceEvents"].as_array().expect("events");
    let named = |name: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["name"] == name).collect()
    };
    let device = named("ncclAllReduce (device)");
    assert_eq!(device.len(), 1);
    assert_eq!(
        (&device[0]["tid"], &device[0]["cat"]),
        (&(1u32 << 22).into(), &"gpu".into())
    );
    assert_eq!(named("not attributed (device)").len(), 1);
    assert_eq!(named("ncclAllReduce").len(), 1, "the enqueue alone");
    let group = named("ncclGroup");
    assert_eq!(group[0]["args"]["bytes"], 16, "{}", group[0]);
    assert!(events.iter().any(|e| e["name"] == "thread_name"
        && e["tid"] == 1u32 << 22
        && e["args"]["name"] == "GPU (device window)"));
}

#[test]
fn a_trace_dropped_without_finish_is_closed_and_loads() {
    let path = scratch("dropped");
    let mut w = TraceWriter::create(TraceOptions::new(path.clone())).expect("create");
    w.call(&ev(7, "MPI_Send", 1000)).expect("call");
    drop(w);
    assert_eq!(slices(&load(&path)), 1);
    // With no call there is no file; one that was there is left as it was.
    let empty = path.with_file_name("empty.json");
    let _ = std::fs::remove_file(&empty);
    drop(TraceWriter::create(TraceOptions::new(empty.clone())).expect("create"));
    assert!(!empty.exists());
    std::fs::write(&empty, "an earlier trace").expect("write");
    let w = TraceWriter::create(TraceOptions::new(empty.clone())).expect("create");
    let summary = w.finish().expect("finish");
    assert!(summary.kept, "{summary}");
    assert_eq!(
        std::fs::read_to_string(&empty).expect("read"),
        "an earlier trace"
    );
}

/// The messages a call said at its return it completed (`MPI_Testsome`), whose arrivals
/// follow its event, end on one slice inside it, drawn once its thread goes on.
#[test]
fn the_arrivals_that_follow_a_call_end_on_one_slice_in_it() {
    let path = scratch("following");
    let mut w = TraceWriter::create(TraceOptions::new(path.clone())).expect("create");
    let at = |routine: &str, start_ns: u64, peer: i32, tag: i32| pb::CallEvent {
        comm: "world".into(),
        comm_rank: Some(i32::from(peer == 0)),
        tag: Some(tag),
        ..ev(if peer == 0 { 2 } else { 1 }, routine, start_ns)
    };
    for pid in [1, 2] {
        w.call(&ev(pid, "MPI_Init", 0)).expect("init");
    }
    // Rank 1 (pid 2) posts two receives; rank 0 sends both; a test completes both.
    for (tag, posted) in [(5, 10_000), (6, 20_000)] {
        w.call(&at("MPI_Irecv", posted, 0, tag)).expect("post");
        w.call(&at("MPI_Send", posted + 5_000, 1, tag))
            .expect("send");
    }
    let test = at("MPI_Testsome", 40_000, 0, -1);
    w.call(&test).expect("test");
    for posted in [10_000, 20_000] {
        w.call(&pb::CallEvent {
            arrival: Some(pb::Arrival {
                posted_tid: 2,
                posted_start_ns: posted,
                follows_call: true,
                ..Default::default()
            }),
            duration_ns: 0,
            ..test.clone()
        })
        .expect("arrival");
    }
    w.call(&at("MPI_Finalize", 50_000, 0, -1)).expect("next");
    w.finish().expect("finish");
    let doc = load(&path);
    let events = doc["traceEvents"].as_array().expect("events");
    let received: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == ARRIVAL)
        .collect();
    assert_eq!(received.len(), 1, "one slice for both: {received:?}");
    let (ts, end) = (40.0, 41.5);
    let at_us = received[0]["ts"].as_f64().expect("ts");
    assert!(at_us > ts && at_us < end, "inside the test: {at_us}");
    let ends = events.iter().filter(|e| e["ph"] == "f").count();
    assert_eq!(ends, 2, "both arrows end there");
}
