//! NCCL: commtap's profile of a process calling the real `libnccl.so.2` equals what the
//! process did (calls, bytes by nccl-tests' conventions, datatype decoding, groups), and
//! what it cannot decode (a NULL communicator's size, a datatype from a newer NCCL) is
//! counted as undecoded, never guessed.

use std::{process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

/// A single-process program run as `PROG READY GO EXTRA...`, recorded by commtap from
/// the moment it is ready until it exits.
struct Recorded {
    pid: u32,
    profile: serde_json::Value,
    out: std::path::PathBuf,
    stderr: String,
}

#[track_caller]
fn attach_then_go(scratch: &Scratch, prog: &std::path::Path, extra: &[String]) -> Recorded {
    attach_then_go_with(scratch, prog, extra, &[])
}

/// [`attach_then_go`] with more arguments for `record`.
#[track_caller]
fn attach_then_go_with(
    scratch: &Scratch,
    prog: &std::path::Path,
    extra: &[String],
    record_args: &[&str],
) -> Recorded {
    let mut app = ChildGuard::spawn(
        Command::new(prog)
            .arg(scratch.path("ready"))
            .arg(scratch.path("go"))
            .args(extra),
    );
    wait_until("the program to be ready", LIMIT, || {
        scratch.path("ready").exists()
    });
    let pid = app.0.id();
    let (commtap, out) = record_attached_with(scratch, &[pid], record_args);
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(
        app.wait_with_limit(LIMIT).success(),
        "{} failed",
        prog.display()
    );
    let run = finish_ok(scratch, commtap, LIMIT);
    Recorded {
        pid,
        profile: read_json(&out),
        out,
        stderr: run.stderr,
    }
}

#[test]
fn real_libnccl_calls_are_counted_exactly() {
    let scratch = Scratch::new("nccl-real");
    let prog = build_nccl_program("nccl_calls.c", &nccl_lib_dir(), &["libnccl.so.2"]);
    let n = 1000;
    let r = attach_then_go_with(
        &scratch,
        &prog,
        &[
            n.to_string(),
            path_str(&scratch.path("truth.json")).to_string(),
        ],
        &["--call-sites"],
    );
    let (pid, profile) = (r.pid, &r.profile);
    let truth = read_json(&scratch.path("truth.json"));
    // Every call was made from the program's main: each routine's calls at its sites there
    // (but ncclGroup's, each completed group: no call of its own).
    let rank = rank_by_pid(profile, u64::from(pid));
    let sites = rank["call_sites"].as_array().expect("call_sites");
    for (name, r) in rank["routines"].as_object().expect("routines") {
        if name == "ncclGroup" {
            continue;
        }
        let at: Vec<&serde_json::Value> = sites.iter().filter(|s| s["routine"] == *name).collect();
        assert_eq!(
            at.iter()
                .map(|s| s["calls"].as_u64().expect("calls"))
                .sum::<u64>(),
            r["calls"].as_u64().expect("calls"),
            "{name}'s calls at their sites: {sites:#?}"
        );
        for s in at {
            assert_eq!(s["function"], "main", "{s}");
            assert!(
                s["object"]
                    .as_str()
                    .is_some_and(|o| o.ends_with("/nccl_calls")),
                "{s}"
            );
        }
    }

    let rank = rank_by_pid(profile, u64::from(pid));
    assert_eq!(
        routine_table(&rank["routines"]),
        routine_table(&truth["routines"]),
        "(calls, bytes) per routine; stderr:\n{}",
        r.stderr
    );
    assert_eq!(rank["undecoded"], truth["undecoded"], "undecoded calls");
    assert_eq!(
        rank["group_ops"], truth["group_ops"],
        "operations in groups"
    );
    // The undecoded calls are the AllGathers (no communicator size) and the AllReduces of
    // an unknown datatype, each in the unknown-size bucket.
    for (routine, calls) in [("ncclAllGather", n), ("ncclAllReduce", n)] {
        assert_eq!(
            rank["routines"][routine]["undecoded_calls"], calls,
            "{routine} undecoded"
        );
    }
    // The library is named with its version, and NCCL's aliases are probed once.
    let lib = profile["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .find(|l| {
            l["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("libnccl.so.2"))
        })
        .unwrap_or_else(|| panic!("libnccl.so.2 not among the probed libraries:\n{profile:#}"));
    assert!(
        lib["flavor"]
            .as_str()
            .is_some_and(|f| f.starts_with("NCCL 2.")),
        "flavor {}",
        lib["flavor"]
    );
    // Every NULL-communicator call is on an unknown communicator, never a guessed one.
    let comms = &rank["routines"]["ncclBroadcast"]["communicators"];
    assert_eq!(
        comms,
        &serde_json::json!([{"id": null, "size": 0, "rank": -1, "calls": n,
            "bytes": n * 200, "time_ns": comms[0]["time_ns"]}]),
        "ncclBroadcast communicators"
    );
    // The text report shows the operations' sizes as mpitrace shows MPI's: the 200-byte
    // broadcasts in one line.
    let run = run_commtap(&scratch, &["report", "--profile", path_str(&r.out)], LIMIT);
    assert!(run.status.success(), "{}", run.stderr);
    let sizes = run
        .stdout
        .split("NCCL operation size distributions:")
        .nth(1)
        .unwrap_or_else(|| panic!("no NCCL size distributions:\n{}", run.stdout));
    let mut lines = sizes
        .lines()
        .skip_while(|l| !l.starts_with("ncclBroadcast "));
    assert!(lines.next().is_some(), "no ncclBroadcast sizes:\n{sizes}");
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[..2], [n.to_string().as_str(), "200.0"], "{sizes}");
    // A rank calling NCCL alone has its call sites in the text too.
    assert!(
        run.stdout.lines().any(|l| l.starts_with("ncclBroadcast")
            && l.contains("main+0x")
            && l.ends_with("(nccl_calls)")),
        "no ncclBroadcast call site in:\n{}",
        run.stdout
    );
}

#[test]
fn nccl_loaded_late_from_a_wheel_is_counted_from_its_first_call() {
    // As PyTorch does: the wheel's libnccl.so.2, on no linker path, dlopened and called at
    // once; before commtap paused processes at library loads: "no MPI calls were recorded".
    let scratch = Scratch::new("nccl-dlopen");
    let prog = build_plain_c("nccl_dlopen.c", &["-ldl"]);
    let lib = nccl_lib_dir().join("libnccl.so.2");
    let (out, truth) = (scratch.path("profile.json"), scratch.path("truth.json"));
    let n = 1000.to_string();
    let args = [
        "record",
        "--format",
        "json",
        "-o",
        path_str(&out),
        "--",
        path_str(&prog),
        path_str(&lib),
        &n,
        path_str(&truth),
    ];
    let run = finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let (profile, truth) = (read_json(&out), read_json(&truth));
    let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
    assert_eq!(
        routine_table(&rank["routines"]),
        routine_table(&truth["routines"]),
        "(calls, bytes) per routine; stderr:\n{}",
        run.stderr
    );
}

/// `record --pid --wait-for-mpi` attached to a process before it `dlopen`s the wheel's
/// NCCL (as a framework does at its first collective) and calls it at once: exact.
#[test]
fn record_attached_before_nccl_is_loaded_counts_from_its_first_call() {
    let scratch = Scratch::new("nccl-dlopen-attached");
    let (mut waiting, pid) = start_nccl_dlopen_after_go(&scratch, 1000);
    let (commtap, out) = record_attached_with(&scratch, &[pid], &["--wait-for-mpi"]);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(
        waiting.wait_with_limit(LIMIT).success(),
        "nccl_dlopen failed"
    );
    let run = finish_ok(&scratch, commtap, LIMIT);
    let (profile, truth) = (read_json(&out), read_json(&scratch.path("truth.json")));
    let rank = rank_by_pid(&profile, u64::from(pid));
    assert_eq!(
        routine_table(&rank["routines"]),
        routine_table(&truth["routines"]),
        "(calls, bytes) per routine; stderr:\n{}",
        run.stderr
    );
}

/// (id, size, rank, calls, bytes) of each communicator of `routine` in a profile rank.
fn communicators(
    rank: &serde_json::Value,
    routine: &str,
) -> Vec<(Option<String>, u64, i64, u64, u64)> {
    rank["routines"][routine]["communicators"]
        .as_array()
        .unwrap_or_else(|| panic!("{routine} has no communicators:\n{rank:#}"))
        .iter()
        .map(|c| {
            (
                c["id"].as_str().map(str::to_string),
                c["size"].as_u64().expect("size"),
                c["rank"].as_i64().expect("rank"),
                c["calls"].as_u64().expect("calls"),
                c["bytes"].as_u64().expect("bytes"),
            )
        })
        .collect()
}

/// Communicators created, split, queried and destroyed, some before commtap attached:
/// each is identified alike in both processes, sizes and ranks are what the calls said,
/// and nothing that was not said is guessed. Runs on the NCCL stand-in (see
/// tests/programs/nccl_standin.c): the real library creates no communicator without a GPU.
#[test]
fn communicator_identity_size_and_rank_follow_their_lifecycle() {
    let scratch = Scratch::new("nccl-comms");
    let standin = build_shared_c("nccl_standin.c");
    let dir = standin.parent().expect("bin dir").to_path_buf();
    let prog = build_nccl_program("nccl_comms.c", &dir, &["libnccl_standin.so"]);
    let mut apps: Vec<ChildGuard> = (0..2)
        .map(|r| {
            ChildGuard::spawn(
                Command::new(&prog)
                    .arg(scratch.path(&format!("ready.{r}")))
                    .arg(scratch.path("go"))
                    .arg(scratch.path("uid"))
                    .arg(r.to_string())
                    .arg(scratch.path(&format!("truth.{r}.json")))
                    // As torchrun's workers under `srun` (one torchrun per node) have it:
                    // the task's SLURM_PROCID numbers the torchrun, RANK the worker.
                    .env("RANK", r.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("LOCAL_RANK", r.to_string())
                    .env("TORCHELASTIC_RUN_ID", "nccl-comms")
                    .env("SLURM_PROCID", "0")
                    .env("SLURM_NTASKS", "1"),
            )
        })
        .collect();
    wait_until("both ranks to be ready", LIMIT, || {
        (0..2).all(|r| scratch.path(&format!("ready.{r}")).exists())
    });
    let pids: Vec<u32> = apps.iter().map(|a| a.0.id()).collect();
    let (commtap, out) = record_attached(&scratch, &pids);
    std::fs::write(scratch.path("go"), b"").expect("go file");
    for app in &mut apps {
        assert!(app.wait_with_limit(LIMIT).success(), "nccl_comms failed");
    }
    let run = finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);

    let mut ids = Vec::new();
    for (r, pid) in pids.iter().enumerate() {
        let truth = read_json(&scratch.path(&format!("truth.{r}.json")));
        let rank = rank_by_pid(&profile, u64::from(*pid));
        assert_eq!(rank["rank"], r, "rank from RANK, not SLURM_PROCID");
        assert_eq!(
            rank["world_size"], 2,
            "world from WORLD_SIZE, not SLURM_NTASKS"
        );
        assert_eq!(
            routine_table(&rank["routines"]),
            routine_table(&truth["routines"]),
            "rank {r}: (calls, bytes) per routine; stderr:\n{}",
            run.stderr
        );
        assert_eq!(
            rank["undecoded"], 1,
            "rank {r}: the AllGather of unknown size"
        );
        assert_eq!(rank["group_ops"], 2, "rank {r}: operations in the group");
        let r = r as i64;

        // Created before attach: no identity; its size once ncclCommCount said it.
        assert_eq!(
            communicators(rank, "ncclAllGather"),
            vec![(None, 0, -1, 1, 0), (None, 1, 0, 1, 16)],
            "rank {r}: AllGather on the early communicator"
        );
        // The world communicator, from ncclCommInitRank.
        let bcast = communicators(rank, "ncclBroadcast");
        assert_eq!(bcast.len(), 1, "rank {r}: {bcast:?}");
        let world = bcast[0].0.clone().expect("world has an identity");
        assert_eq!(bcast[0], (Some(world.clone()), 2, r, 2, 400));
        // AlltoAll on world and on the communicator of ncclCommInitRankScalable.
        let mut a2a = communicators(rank, "ncclAlltoAll");
        let at = a2a
            .iter()
            .position(|c| c.0.as_deref() == Some(world.as_str()))
            .expect("AlltoAll on world");
        assert_eq!(a2a.remove(at), (Some(world.clone()), 2, r, 1, 24));
        assert_eq!(a2a.len(), 1, "rank {r}: {a2a:?}");
        let scal = a2a[0]
            .0
            .clone()
            .expect("the scalable init's communicator has an id");
        assert_eq!(a2a[0], (Some(scal.clone()), 2, r, 1, 10));
        for (routine, calls, bytes) in [
            ("ncclReduce", 1, 56),
            ("ncclReduceScatter", 1, 32),
            ("ncclGather", 1, 32),
            ("ncclSend", 1, 16),
            ("ncclRecv", 1, 16),
        ] {
            assert_eq!(
                communicators(rank, routine),
                vec![(Some(world.clone()), 2, r, calls, bytes)],
                "rank {r}: {routine}"
            );
        }
        // AllReduce on all of them: early, world, two splits (the first seen before and
        // after its size was asked).
        let mut all = communicators(rank, "ncclAllReduce");
        assert_eq!(all.remove(0), (None, 0, -1, 3, 120), "rank {r}: early");
        let at = all
            .iter()
            .position(|c| c.0.as_deref() == Some(world.as_str()))
            .expect("AllReduce on world");
        assert_eq!(all.remove(at), (Some(world.clone()), 2, r, 5, 5120));
        let s2 = all
            .iter()
            .find(|c| c.4 == 16)
            .and_then(|c| c.0.clone())
            .expect("second split has an identity");
        let s1 = all
            .iter()
            .find(|c| c.4 == 8)
            .and_then(|c| c.0.clone())
            .expect("first split has an identity");
        let mut want = vec![
            (Some(s1.clone()), 0, -1, 1, 8),
            (Some(s1.clone()), 2, r, 1, 8),
            (Some(s2.clone()), 0, -1, 1, 16),
        ];
        want.sort();
        all.sort();
        assert_eq!(all, want, "rank {r}: AllReduce on the splits");
        ids.push([world, s1, s2, scal]);
    }
    assert_eq!(ids[0], ids[1], "both ranks name each communicator alike");
    let distinct: std::collections::BTreeSet<&String> = ids[0].iter().collect();
    assert_eq!(
        distinct.len(),
        4,
        "distinct communicators have distinct ids: {:?}",
        ids[0]
    );
}

/// Device time: the host's waits for the GPU after NCCL operations of one kind measure
/// them (count, bytes, at least the wait, bus bandwidth factor by communicator size); waits
/// after mixed operations are counted as not attributed. Runs on the NCCL and CUDA runtime
/// stand-ins (tests/programs/*_standin.c): there is no GPU here.
#[test]
fn waits_for_the_gpu_measure_device_time() {
    let scratch = Scratch::new("nccl-device");
    let prog = device_program();
    let r = attach_then_go(&scratch, &prog, &[]);
    let d = assert_device_time(&r);
    // No MPI routine was called: the text report says so, and draws no table of zeros.
    let run = run_commtap(&scratch, &["report", "--profile", path_str(&r.out)], LIMIT);
    assert!(run.status.success(), "{}", run.stderr);
    assert!(
        run.stdout.contains(
            "no MPI communication: no rank called an MPI routine but MPI_Init and MPI_Finalize"
        ) && !run.stdout.contains("minimum communication time"),
        "{}",
        run.stdout
    );

    // Against the seed's single-node all_reduce_perf (table 1: 18.05 GB/s at 1 MiB), the
    // stand-in's 1 ms waits make this job's 1 MiB AllReduces far slower.
    let seed = repo_root().join("tests/data/seed_003_rccl_ofi_plugin.txt");
    // `commtap compare` of the seed's table 1 with `measured`, as JSON.
    let compare_with_table_1 = |measured: &[&str]| {
        let mut args = vec![
            "compare",
            "--expected",
            path_str(&seed),
            "--expected-table",
            "1",
            "--format",
            "json",
        ];
        args.extend(measured);
        run_commtap(&scratch, &args, LIMIT)
    };
    let run = compare_with_table_1(&["--profile", path_str(&r.out)]);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    let c: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON comparison");
    let measured = d["bus_bytes"].as_u64().expect("bus bytes") as f64
        / d["time_ns"].as_u64().expect("time") as f64;
    let buckets = c["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 1, "{c:#}");
    let b = &buckets[0];
    assert_eq!(
        (
            &b["min_bytes"],
            &b["max_bytes"],
            &b["expected_busbw"],
            &b["below"]
        ),
        (&524289.into(), &MIB.into(), &18.05.into(), &true.into()),
        "{c:#}"
    );
    // JSON's decimal floats round-trip to within an ulp or so.
    let got = b["measured_busbw"].as_f64().expect("measured");
    assert!(
        (got - measured).abs() <= 1e-12 * measured,
        "{got} != {measured}"
    );
    let ratio = b["ratio"].as_f64().expect("ratio");
    assert!((ratio - measured / 18.05).abs() <= 1e-12, "{ratio}");
    // Against the table's in-place run (its last columns: 18.10 GB/s at 1 MiB).
    let run = compare_with_table_1(&["--profile", path_str(&r.out), "--in-place"]);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    let c: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON comparison");
    assert_eq!(
        (&c["in_place"], &c["buckets"][0]["expected_busbw"]),
        (&true.into(), &18.10.into()),
        "{c:#}"
    );

    // `commtap diff` of the profile with itself compares the same bus bandwidth, bucket for
    // bucket.
    let out = path_str(&r.out);
    let run = run_commtap(&scratch, &["diff", "--format", "json", out, out], LIMIT);
    assert!(run.status.success(), "{}", run.stderr);
    let d: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON diff");
    let bw = d["nccl_busbw"].as_array().expect("nccl_busbw");
    assert_eq!(bw.len(), 1, "{d:#}");
    assert_eq!(
        (
            &bw[0]["operation"],
            &bw[0]["min_bytes"],
            &bw[0]["max_bytes"]
        ),
        (&"ncclAllReduce".into(), &524289.into(), &MIB.into()),
        "{d:#}"
    );
    for side in ["before", "after"] {
        let got = bw[0]["busbw_gbps"][side].as_f64().expect("busbw");
        assert!(
            (got - measured).abs() <= 1e-12 * measured,
            "{got} != {measured}"
        );
    }

    // The HTML report draws the same comparison: the one measured bucket, below the
    // threshold and marked so, under the expected curve's points (one per size bucket of
    // the seed's table, as `compare` reads it).
    let html = scratch.path("report.html");
    let run = run_commtap(
        &scratch,
        &[
            "report",
            "--profile",
            path_str(&r.out),
            "--html",
            path_str(&html),
            "--expected",
            path_str(&seed),
            "--expected-table",
            "1",
        ],
        LIMIT,
    );
    assert!(run.status.success(), "{}", run.stderr);
    let run = compare_with_table_1(&["--measured", path_str(&seed), "--measured-table", "1"]);
    let table: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON comparison");
    let points = table["buckets"].as_array().expect("buckets").len() as u64;
    let page = browse(&scratch, &html, "nccl-device");
    assert_html_report_matches(&page, &r.profile);
    let id = "nccl-busbw-ncclAllReduce";
    assert_eq!(bars_in(&page, id, VERMILLION), 1, "the bucket below");
    assert_eq!(bars_in(&page, id, BLUE), 0, "no bucket at or above");
    assert_eq!(figure(&page, id)["circles"], points, "expected points");
    assert!(figure_says(&page, id, "below"), "the bucket is marked");
    assert!(figure_says(&page, id, "bus bandwidth"), "y axis");
}

/// `nccl_device.c` built against the NCCL and CUDA runtime stand-ins.
fn device_program() -> std::path::PathBuf {
    let dir = build_shared_c("nccl_standin.c")
        .parent()
        .expect("bin dir")
        .to_path_buf();
    build_shared_c("cudart_standin.c");
    build_nccl_program(
        "nccl_device.c",
        &dir,
        &["libnccl_standin.so", "libcudart_standin.so"],
    )
}

/// A timeline of `nccl_device.c`: its device-time windows are a track of their own
/// (`GPU (device window)`), one slice per window from the first enqueue to the wait's
/// return, named apart from the enqueues, as the program made them: 25 AllReduce windows
/// (40 MiB), 2 group windows (2 x 2 KiB), 3 mixed ones (not attributed), none for the wait
/// with nothing enqueued; the enqueue slices stay on the calling thread, all 43.
#[test]
fn device_windows_are_a_track_of_their_own_in_a_timeline() {
    let scratch = Scratch::new("nccl-device-trace");
    let prog = device_program();
    let trace = scratch.path("t.json");
    let r = attach_then_go_with(&scratch, &prog, &[], &["--trace", path_str(&trace)]);
    assert_device_time(&r);
    let rank = rank_by_pid(&r.profile, u64::from(r.pid));
    assert_eq!(rank["windows_dropped"], 0, "{rank}");

    let summary = devtools_summary(&trace);
    let process = &summary["processes"][r.pid.to_string()];
    let device_tid = (1u32 << 22).to_string();
    assert_eq!(
        process["threads"][&device_tid], "GPU (device window)",
        "{process:#}"
    );
    let routines = traced_routines(&summary, u64::from(r.pid));
    let of = |name: &str| routines.get(name).copied().unwrap_or_default();
    assert_eq!(of("ncclAllReduce (device)"), (25, 40 * MIB), "{routines:?}");
    assert_eq!(of("ncclGroup (device)"), (2, 2 * 2048), "{routines:?}");
    assert_eq!(
        of("not attributed (device)"),
        (3, 3 * (MIB + 64)),
        "{routines:?}"
    );
    assert_eq!(of("ncclAllReduce"), (43, 43 * MIB), "{routines:?}");

    // Every window lies on the device track and ends with a 1 ms wait.
    let json = read_json(&trace);
    let windows: Vec<&serde_json::Value> = json["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["cat"] == "gpu")
        .collect();
    assert_eq!(windows.len(), 30);
    for w in windows {
        assert_eq!(w["tid"].as_u64(), Some(1 << 22), "{w}");
        assert!(w["dur"].as_f64().expect("dur") >= 1000.0, "{w}");
    }
}

/// Builds `tests/programs/<src>` into one executable `out` with the stand-ins `standins`
/// (`tests/programs/*.c`) linked in, and `extra` compiler arguments.
fn build_with_standins(
    src: &str,
    out: &str,
    standins: &[&str],
    extra: &[&str],
) -> std::path::PathBuf {
    let programs = repo_root().join("tests/programs");
    let mut args = vec![format!("-I{}", programs.display())];
    args.extend(
        standins
            .iter()
            .map(|s| programs.join(s).display().to_string()),
    );
    args.extend(extra.iter().map(std::string::ToString::to_string));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    compile_c(src, out, &args)
}

/// NCCL and the CUDA runtime linked into the executable itself are found by its symbols.
#[test]
fn nccl_linked_into_the_executable_is_probed_there() {
    let scratch = Scratch::new("nccl-static");
    let prog = build_with_standins(
        "nccl_device.c",
        "nccl_device_static",
        &["nccl_standin.c", "cudart_standin.c"],
        &[],
    );
    let r = attach_then_go(&scratch, &prog, &[]);
    assert_device_time(&r);
    let libs = probed_paths(&r.profile);
    assert!(
        libs.len() == 1 && libs[0].ends_with("/nccl_device_static"),
        "probed in the executable: {libs:?}"
    );
}

/// NCCL inside a library that exports none of its symbols is reported as seen but not
/// probed, with its version, never taken for a process without communication.
#[test]
fn nccl_without_symbols_is_reported_not_probed() {
    let scratch = Scratch::new("nccl-hidden");
    let lib = compile_c(
        "nccl_standin.c",
        "libnccl_hidden.so",
        &[
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            "-DHIDDEN_NCCL",
            "-s",
        ],
    );
    let dir = lib.parent().expect("bin dir");
    let prog = build_nccl_program("nccl_hidden.c", dir, &["libnccl_hidden.so"]);
    let mut cmd = Command::new(&prog);
    cmd.arg(scratch.path("ready")).arg(scratch.path("go"));
    assert_record_refuses(
        &scratch,
        &mut cmd,
        "holds NCCL 2.99.0+standin but none of its symbols",
    );
}

const MIB: u64 = 1 << 20;

/// Asserts what nccl_device.c did, as its comment says; returns the AllReduces' device time.
#[track_caller]
fn assert_device_time(r: &Recorded) -> serde_json::Value {
    let rank = rank_by_pid(&r.profile, u64::from(r.pid));
    let routines = &rank["routines"];
    assert_eq!(
        routines["cudaStreamSynchronize"]["calls"], 31,
        "waits; stderr:\n{}",
        r.stderr
    );
    assert_eq!(rank["mixed_windows"], 3, "mixed windows");
    let buckets = routines["ncclAllReduce"]["sizes"]
        .as_array()
        .expect("sizes");
    assert_eq!(buckets.len(), 1, "one size bucket: {buckets:?}");
    let b = &buckets[0];
    assert_eq!((&b["calls"], &b["bytes"]), (&43.into(), &(43 * MIB).into()));
    let d = &b["device"];
    assert_eq!(d["calls"], 40, "AllReduces in attributable windows: {d}");
    assert_eq!(d["bytes"], 40 * MIB);
    // nccl-tests' AllReduce factor 2(n-1)/n is 1 on 2 ranks.
    assert_eq!(d["bus_bytes"], 40 * MIB);
    let ns = d["time_ns"].as_u64().expect("time_ns");
    assert!(
        ns >= 25 * 1_000_000,
        "25 windows each end with a 1 ms wait: {ns} ns"
    );
    let group = &routines["ncclGroup"]["sizes"][0];
    assert_eq!(
        group["device"]["calls"], 2,
        "groups with device time: {group}"
    );
    assert_eq!(group["device"]["bytes"], 2 * 2048);
    assert!(
        routines["ncclBroadcast"]["sizes"][0]
            .get("device")
            .is_none(),
        "the Broadcasts were only in mixed windows"
    );
    d.clone()
}

/// The seed's two-node RCCL runs (tests/data/seed_003_rccl_ofi_plugin.txt, a copy of
/// ../shared/seeds/003): TCP/IP (table 2) against the OFI plugin with GDR (table 4). The
/// ratios, read off the tables: 35%, 47%, 42%, 43%, 33% up to 1 MiB, then 25% and lower.
#[test]
fn compare_flags_the_seed_runs_below_the_expected_curve() {
    let scratch = Scratch::new("nccl-compare-seed");
    let seed = repo_root().join("tests/data/seed_003_rccl_ofi_plugin.txt");
    let seed = path_str(&seed);
    let run = run_commtap(
        &scratch,
        &[
            "compare",
            "--expected",
            seed,
            "--expected-table",
            "4",
            "--measured",
            seed,
            "--measured-table",
            "2",
            "--threshold",
            "0.3",
            "--format",
            "json",
        ],
        LIMIT,
    );
    assert_eq!(
        run.status.code(),
        Some(1),
        "buckets below: exit 1\n{}",
        run.stderr
    );
    let c: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON comparison");
    assert_eq!(c["op"], "ncclAllReduce", "named by all_reduce_perf");
    let buckets = c["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 17, "64 KiB to 4 GiB");
    let below: Vec<u64> = buckets
        .iter()
        .filter(|b| b["below"] == true)
        .map(|b| b["max_bytes"].as_u64().expect("max_bytes"))
        .collect();
    // Flagged from the 2 MiB row (bucket 1 MiB+1 .. 2 MiB) on.
    assert_eq!(below.first(), Some(&(2 << 20)), "{buckets:#?}");
    assert_eq!(below.len(), 12);
    let last = buckets.last().expect("4 GiB");
    assert_eq!(
        (&last["expected_busbw"], &last["measured_busbw"]),
        (&109.02.into(), &8.03.into())
    );

    // A document holding several tables needs to be told which.
    let run = run_commtap(
        &scratch,
        &["compare", "--expected", seed, "--measured", seed],
        LIMIT,
    );
    assert_eq!(run.status.code(), Some(2));
    assert!(
        run.stderr.contains("holds 4 nccl-tests tables"),
        "{}",
        run.stderr
    );

    // A profile without a single NCCL call says so (not that the GPU was never waited for).
    let empty = scratch.path("no-nccl.json");
    let run = run_commtap(
        &scratch,
        &["record", "-f", "json", "-o", path_str(&empty), "--", "true"],
        LIMIT,
    );
    assert_eq!(
        run.status.code(),
        Some(2),
        "nothing recorded: {}",
        run.stderr
    );
    let run = run_commtap(
        &scratch,
        &[
            "compare",
            "--expected",
            seed,
            "--expected-table",
            "4",
            "--profile",
            path_str(&empty),
        ],
        LIMIT,
    );
    assert_eq!(run.status.code(), Some(2));
    assert!(
        run.stderr
            .contains("the profile holds no ncclAllReduce call"),
        "{}",
        run.stderr
    );
}

/// A net plugin exporting only a table older than those decoded (as aws-ofi-rccl exports
/// `ncclNet_v5`): said as seen but not probed, with its name and table, its traffic not
/// counted; the built-in transports' still exact.
#[test]
fn an_older_net_plugin_is_said_not_probed() {
    let scratch = Scratch::new("nccl-net-old");
    let prog = build_with_standins("nccl_net.c", "nccl_net", &["nccl_standin.c"], &["-pthread"]);
    let plugin = compile_c(
        "nccl_net_plugin.c",
        "libnccl-net-old.so",
        &["-shared", "-fPIC", "-DNET_TABLE=ncclNet_v5"],
    );
    let mut app = ChildGuard::spawn(
        Command::new(&prog)
            .arg(scratch.path("ready"))
            .arg(scratch.path("go"))
            .arg(&plugin)
            .env("NET_PLUGIN_TABLE", "ncclNet_v5"),
    );
    wait_until("the program to be ready", LIMIT, || {
        scratch.path("ready").exists()
    });
    let (commtap, out) = record_attached(&scratch, &[app.0.id()]);
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(app.wait_with_limit(LIMIT).success(), "nccl_net failed");
    finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    let rank = rank_by_pid(&profile, u64::from(app.0.id()));
    assert_eq!(rank["routines"]["ncclNetSocketIsend"]["calls"], 100);
    assert!(
        rank["routines"].get("ncclNetPluginIsend").is_none(),
        "{}",
        rank["routines"]
    );
    let said = format!(
        "{}: NCCL net plugin \"Standin\" exports ncclNet_v5 only (its sends and receives are \
         decoded through ncclNetPlugin_v10 to ncclNetPlugin_v12): its network traffic is not \
         counted",
        plugin.display()
    );
    assert!(
        profile["unsupported_libraries"]
            .as_array()
            .expect("unsupported_libraries")
            .iter()
            .any(|l| l.as_str() == Some(said.as_str())),
        "{said}: {}",
        profile["unsupported_libraries"]
    );
}

/// NCCL's network transports: every message the proxy thread posted, per transport, with
/// its bytes; calls that posted nothing (transport not ready) are counted apart, never as
/// messages; a receive grouping more buffers than a transport posts is undecoded.
#[test]
fn network_transport_messages_are_counted_per_transport() {
    let scratch = Scratch::new("nccl-net");
    let prog = build_with_standins("nccl_net.c", "nccl_net", &["nccl_standin.c"], &["-pthread"]);
    let plugin = compile_c(
        "nccl_net_plugin.c",
        "libnccl-net-standin.so",
        &["-shared", "-fPIC"],
    );
    let r = attach_then_go(&scratch, &prog, &[path_str(&plugin).to_string()]);
    let rank = rank_by_pid(&r.profile, u64::from(r.pid));
    let routines = &rank["routines"];
    let calls_bytes = |name: &str| {
        (
            routines[name]["calls"].as_u64(),
            routines[name]["bytes"].as_u64(),
        )
    };
    let stderr = &r.stderr;
    assert_eq!(
        calls_bytes("ncclNetSocketIsend"),
        (Some(100), Some(100 * 4096)),
        "{stderr}"
    );
    assert_eq!(
        calls_bytes("ncclNetSocketIrecv"),
        (Some(60), Some(60 * 65536))
    );
    assert_eq!(calls_bytes("ncclIbIsend"), (Some(30), Some(30 * MIB)));
    assert_eq!(calls_bytes("ncclIbIrecv"), (Some(25), Some(20 * 6000)));
    assert_eq!(routines["ncclIbIrecv"]["undecoded_calls"], 5);
    assert_eq!(rank["undecoded"], 5);
    // The external plugin, through its exported ncclNetPlugin_v10 table.
    assert_eq!(
        calls_bytes("ncclNetPluginIsend"),
        (Some(40), Some(40 * 8192))
    );
    assert_eq!(
        calls_bytes("ncclNetPluginIrecv"),
        (Some(30), Some(30 * 300))
    );
    assert_eq!(rank["net_unposted"], 25 + 10 + 5, "not-ready calls");
    assert!(
        r.profile["libraries"]
            .as_array()
            .expect("libraries")
            .iter()
            .any(|l| l["flavor"] == "NCCL net plugin \"Standin\""),
        "the plugin is named: {}",
        r.profile["libraries"]
    );
    let text = std::fs::read_to_string(&r.out).expect("profile");
    assert!(
        text.contains("\"ncclNetSocketIsend\""),
        "JSON names the calls"
    );
    let report = Command::new(commtap_bin())
        .args(["report", "--profile"])
        .arg(&r.out)
        .output()
        .expect("commtap report");
    assert!(report.status.success(), "{report:?}");
    let report = String::from_utf8_lossy(&report.stdout);
    assert!(
        report.contains("NCCL network transport of rank")
            && report.contains("NET/Socket, NET/IB, NET/Plugin")
            && report.contains("40 calls found the transport not ready"),
        "text report:\n{report}"
    );
}
