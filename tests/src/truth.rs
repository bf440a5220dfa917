//! What the programs say they did against what commtap reports: profiles, truths,
//! traces.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;

use crate::{build_program, mpi_env, ChildGuard, Mpi, Scratch};

/// Reads a JSON file.
#[track_caller]
pub fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("parsing {}: {e}\n{text}", path.display()))
}

/// The truth files `prefix.<rank>.json` written by a ground-truth program, by rank.
#[track_caller]
pub fn read_truths(prefix: &Path, np: u32) -> Vec<Value> {
    (0..np)
        .map(|r| {
            let p = PathBuf::from(format!("{}.{r}.json", prefix.display()));
            read_json(&p)
        })
        .collect()
}

/// The profile's rank whose pid is `pid`.
#[track_caller]
pub fn rank_by_pid(profile: &Value, pid: u64) -> &Value {
    profile["ranks"]
        .as_array()
        .expect("ranks array")
        .iter()
        .find(|r| r["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("no rank with pid {pid} in profile:\n{profile:#}"))
}

/// The pid of rank `rank` by the ranks' own truth files ([`read_truths`]).
#[track_caller]
pub fn pid_of_rank(truths: &[Value], rank: u64) -> u64 {
    truths
        .iter()
        .find(|t| t["rank"] == rank)
        .and_then(|t| t["pid"].as_u64())
        .expect("a rank's pid")
}

/// The slices of a Chrome JSON trace that end a call a rank did not return from (their
/// argument `unfinished` says why).
pub fn unfinished_slices(trace: &Value) -> Vec<&Value> {
    trace["traceEvents"]
        .as_array()
        .expect("trace events")
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"].get("unfinished").is_some())
        .collect()
}

/// The profile's rank numbered `rank` (`Null` where it has none: not seen yet).
pub fn rank_numbered(profile: &Value, rank: u64) -> Value {
    profile["ranks"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["rank"] == rank))
        .cloned()
        .unwrap_or_default()
}

/// The rows of a text report's table whose heading starts `heading` (its column names
/// follow the heading): the lines up to the first blank or rule.
pub fn report_rows<'a>(report: &'a str, heading: &str) -> Vec<&'a str> {
    report
        .lines()
        .skip_while(|l| !l.starts_with(heading))
        .skip(2)
        .take_while(|l| !l.is_empty() && !l.starts_with("---"))
        .collect()
}

/// (calls, bytes) per routine, from a truth file or a profile rank.
pub fn routine_table(routines: &Value) -> std::collections::BTreeMap<String, (u64, u64)> {
    routines
        .as_object()
        .expect("routines object")
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                (
                    v["calls"].as_u64().unwrap_or(0),
                    v["bytes"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect()
}

/// Whether `routine` is a transport's operation (libfabric's `fi_*`, UCX's `ucp_*`).
pub fn is_transport_operation(routine: &str) -> bool {
    routine.starts_with("fi_") || routine.starts_with("ucp_")
}

/// The profile's rank of `mpi_loop` (`tests/programs/mpi_loop.c`) whose truth is `truth`
/// made exactly the calls it says, plus the one `MPI_Barrier` before its ready file (the
/// truth counts from GO), and `n` 8-byte `MPI_Allreduce`; that rank is returned.
#[track_caller]
pub fn assert_mpi_loop_matches<'a>(profile: &'a Value, truth: &Value, n: u64) -> &'a Value {
    let rank = rank_by_pid(profile, truth["pid"].as_u64().expect("pid"));
    let got = routine_table(&rank["routines"]);
    for (routine, want) in routine_table(&truth["routines"]) {
        let extra = u64::from(routine == "MPI_Barrier");
        assert_eq!(
            got[&routine],
            (want.0 + extra, want.1),
            "rank {} {routine}",
            truth["rank"]
        );
    }
    assert_eq!(got["MPI_Allreduce"], (n, 8 * n), "rank {}", truth["rank"]);
    rank
}

/// Asserts that every rank of `profile` equals its truth: the same routines, calls and
/// bytes, the same communicator sizes, the right rank, nothing undecoded, and every counted
/// call either delivered as an event or counted as dropped. `ignore` names routines the
/// truth does not count (e.g. MPI_Finalize, called after the truth is written).
#[track_caller]
pub fn assert_profile_matches(profile: &Value, truths: &[Value], ignore: &[&str]) {
    assert_valid_profile(profile);
    assert_eq!(
        profile["ranks"].as_array().map(Vec::len),
        Some(truths.len()),
        "rank count:\n{profile:#}"
    );
    for truth in truths {
        let pid = truth["pid"].as_u64().expect("truth pid");
        let rank = rank_by_pid(profile, pid);
        assert_eq!(rank["rank"], truth["rank"], "rank of pid {pid}");
        let mut got = routine_table(&rank["routines"]);
        // The transport's operations beneath MPI (libfabric, UCX) are no MPI routines:
        // the tests of the transports check them.
        got.retain(|k, _| !ignore.contains(&k.as_str()) && !is_transport_operation(k));
        let want = routine_table(&truth["routines"]);
        assert_eq!(
            got, want,
            "rank {}: (calls, bytes) per routine differ",
            truth["rank"]
        );
        for name in want.keys() {
            assert_durations_account_for_calls(&rank["routines"][name], name);
        }
        if let Some(sizes) = truth["comm_sizes"].as_object() {
            for (routine, want_sizes) in sizes {
                let got_sizes: Vec<u64> = rank["routines"][routine]["comm_sizes"]
                    .as_object()
                    .map(|m| {
                        m.keys()
                            .map(|k| k.parse().expect("numeric comm size"))
                            .collect()
                    })
                    .unwrap_or_default();
                let want_sizes: Vec<u64> = want_sizes
                    .as_array()
                    .expect("sizes")
                    .iter()
                    .map(|v| v.as_u64().expect("size"))
                    .collect();
                assert_eq!(
                    got_sizes, want_sizes,
                    "rank {} {routine}: communicator sizes",
                    truth["rank"]
                );
            }
        }
        assert_eq!(
            rank["undecoded"], 0,
            "rank {}: undecoded calls",
            truth["rank"]
        );
        if profile["call_events"] == true {
            assert_events_account_for_calls(rank);
        } else if profile.get("skew").is_some() || rank["events"] != 0 {
            // Who is late was on (a daemon's or an aggregator's profile does not say).
            assert_events_account_for_collectives(rank);
        } else {
            assert_eq!(
                rank["dropped"], 0,
                "rank {}: call events while they are off",
                truth["rank"]
            );
        }
    }
}

/// `profile` is a `commtap.profile.v1` document by the schema the repository ships
/// (`docs/commtap.profile.v1.schema.json`), checked by Python's `jsonschema` (installed by
/// `cargo xtask setup`): a validator nobody here wrote.
#[track_caller]
pub fn assert_valid_profile(profile: &Value) {
    use std::io::Write as _;
    let schema = crate::repo_root().join("docs/commtap.profile.v1.schema.json");
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.Draft202012Validator.check_schema(schema)\n\
             errors = list(jsonschema.Draft202012Validator(schema).iter_errors(json.load(sys.stdin)))\n\
             for e in errors[:5]: print(f'{e.json_path}: {e.message}')\n\
             sys.exit(1 if errors else 0)",
        ])
        .arg(&schema)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(profile.to_string().as_bytes())
        .expect("writing the profile");
    let out = child.wait_with_output().expect("python3");
    assert!(
        out.status.success(),
        "the profile does not match {}:\n{}{}",
        schema.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every timed call of `routine` (a routine's JSON) is in its duration histogram, in all
/// and in each size bucket, between the fastest and the slowest, whose mean lies between
/// them: every call, or where its time was sampled, the `sampled_time.timed_calls` (then
/// `time_ns` is their mean times the calls).
#[track_caller]
pub fn assert_durations_account_for_calls(routine: &Value, name: &str) {
    let check = |part: &Value, what: &str| {
        let all = part["calls"].as_u64().expect("calls");
        let sampled = &part["sampled_time"];
        let calls = if sampled.is_null() {
            all
        } else {
            let timed = sampled["timed_calls"].as_u64().expect("timed_calls");
            assert!(
                timed < all,
                "{name} {what}: sampled, yet every call timed: {part}"
            );
            timed
        };
        if calls == 0 {
            // A size bucket that only NCCL device time reached, or none of whose calls was
            // drawn to be timed: no time.
            assert!(part["durations"].is_null(), "{name} {what}: {part}");
            return;
        }
        let d = &part["durations"];
        let timed: u64 = d["buckets"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} {what}: no durations: {part}"))
            .iter()
            .map(|b| b["calls"].as_u64().expect("bucket calls"))
            .sum();
        assert_eq!(
            timed, calls,
            "{name} {what}: calls in the histogram: {part}"
        );
        let (min, max) = (
            d["min_ns"].as_u64().expect("min"),
            d["max_ns"].as_u64().expect("max"),
        );
        let time = part["time_ns"].as_u64().expect("time");
        if !sampled.is_null() && what != "all sizes" {
            // A counter none of whose calls was drawn takes the routine's mean, which
            // may lie outside this bucket's extremes; the routine's holds it.
            return;
        }
        // An estimate from sampled calls is rounded to the nanosecond (per counter).
        let slack = if sampled.is_null() { 0 } else { all };
        assert!(
            min > 0 && min * all <= time + slack && time <= max * all + slack,
            "{name} {what}: min {min} mean {} max {max}",
            time / all.max(1)
        );
    };
    check(routine, "all sizes");
    for (i, size) in routine["sizes"]
        .as_array()
        .expect("sizes")
        .iter()
        .enumerate()
    {
        check(size, &format!("size bucket #{i}"));
    }
}

/// Every call in the counters was either delivered as an event or counted as dropped.
#[track_caller]
pub fn assert_events_account_for_calls(rank: &Value) {
    assert_events_account_for(rank, "calls", |_| true);
}

/// With per-call events off but who-is-late on, exactly the calls it needs (collectives,
/// communicator constructors, MPI_Init) were delivered as events or counted as dropped.
#[track_caller]
pub fn assert_events_account_for_collectives(rank: &Value) {
    use collector_common::{routines::routine_id, ROUTINES};
    assert_events_account_for(rank, "calls who-is-late follows", |name| {
        ROUTINES[routine_id(name).expect("a known routine") as usize]
            .spec
            .matters_for_skew()
    });
}

#[track_caller]
fn assert_events_account_for(rank: &Value, what: &str, wanted: impl Fn(&str) -> bool) {
    let calls: u64 = routine_table(&rank["routines"])
        .iter()
        .filter(|(name, _)| wanted(name))
        .map(|(_, (c, _))| c)
        .sum();
    let events = rank["events"].as_u64().expect("events");
    let dropped = rank["dropped"].as_u64().expect("dropped");
    assert_eq!(
        events + dropped,
        calls,
        "rank {}: events {events} + dropped {dropped} != {what} {calls}",
        rank["rank"]
    );
}

/// The paths of the libraries a profile says were probed.
pub fn probed_paths(profile: &Value) -> Vec<&str> {
    profile["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .filter_map(|l| l["path"].as_str())
        .collect()
}

/// The pids of the ranks whose truths these are.
pub fn pids_of(truths: &[Value]) -> Vec<u64> {
    truths.iter().filter_map(|t| t["pid"].as_u64()).collect()
}

/// The (calls, bytes) per routine of an `mpi_loop` rank counted from `MPI_Init`, less what
/// it did before `go` (MPI_Init, Comm_rank, Comm_size and a Barrier; MPI_Finalize after
/// its truth was written): what its truth file holds. Panics if those calls are not there
/// exactly once.
#[track_caller]
pub fn loop_counts_after_go(routines: &Value) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut got = routine_table(routines);
    for before in ["MPI_Init", "MPI_Comm_rank", "MPI_Comm_size", "MPI_Finalize"] {
        assert_eq!(
            got.remove(before).map(|(calls, _)| calls),
            Some(1),
            "{before}"
        );
    }
    if let Some(b) = got.get_mut("MPI_Barrier") {
        b.0 -= 1;
    }
    got
}

/// Asserts that each `mpi_loop` rank of `truths` is in `profile`, counted from `MPI_Init`,
/// with exactly the calls its truth file holds (see [`loop_counts_after_go`]).
#[track_caller]
pub fn assert_loop_ranks(profile: &Value, truths: &[Value]) {
    for truth in truths {
        let pid = truth["pid"].as_u64().expect("pid");
        assert_eq!(
            loop_counts_after_go(&rank_by_pid(profile, pid)["routines"]),
            routine_table(&truth["routines"]),
            "pid {pid}"
        );
    }
}

/// The pml the Open MPI truth jobs are told to take (`--mca pml`, `OMPI_MCA_pml`).
pub const OPEN_MPI_PML: &str = "ob1";

/// Asserts that each rank's MPI said the transport the job knows it used (the profile's
/// `mpi_transport`, read at its `MPI_Init`'s return): Open MPI the pml it was told
/// ([`OPEN_MPI_PML`]), an MPICH the device it names in its version string (which
/// mpi_truth read; ranks that share memory make no netmod operation to narrow it by),
/// Intel MPI `ch4:ofi`.
#[track_caller]
pub fn assert_transports_match(profile: &Value, truths: &[Value], mpi: Mpi) {
    for truth in truths {
        let rank = rank_by_pid(profile, truth["pid"].as_u64().expect("pid"));
        let want = match mpi {
            Mpi::OpenMpi | Mpi::OpenMpi5 => format!("pml {OPEN_MPI_PML}"),
            // Its version string names no device; its jobs run over ofi (`impi_env`).
            Mpi::IntelMpi => "ch4:ofi".to_string(),
            _ => truth["device"].as_str().expect("device").to_string(),
        };
        assert!(!want.is_empty(), "{truth}");
        assert_eq!(
            rank["mpi_transport"].as_str(),
            Some(want.as_str()),
            "the transport of rank {}",
            truth["rank"]
        );
    }
}

/// Runs `mpi_truth` (3 iterations) as `np` ranks of `mpi` to completion, writing its truths
/// to `prefix.<rank>.json` and its standard output to `prefix.stdout`; returns the truths
/// by rank.
#[track_caller]
pub fn run_truth_job(prefix: &Path, mpi: Mpi, np: u32) -> Vec<Value> {
    let prog = build_program("mpi_truth.c", mpi);
    let launcher = mpi.launcher(np);
    let mut cmd = Command::new(&launcher[0]);
    let stdout = std::fs::File::create(prefix.with_extension("stdout")).expect("stdout file");
    mpi_env(&mut cmd)
        .envs(mpi.job_env())
        // Open MPI's point-to-point layer, named so that the job knows it.
        .env("OMPI_MCA_pml", OPEN_MPI_PML)
        .args(&launcher[1..])
        .arg(&prog)
        .arg(prefix)
        .stdout(stdout);
    let mut job = ChildGuard::spawn(&mut cmd);
    assert!(
        job.wait_with_limit(Duration::from_mins(5)).success(),
        "{mpi:?} job failed"
    );
    read_truths(prefix, np)
}

/// The lines a program wrote to its standard output that start with `tag` (its own, not
/// its MPI's warnings), sorted: the ranks of a job write theirs in any order.
pub fn program_output(stdout: &str, tag: &str) -> Vec<String> {
    let mut lines: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with(tag))
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

/// Runs `command` (a launcher, its program and the program's arguments) alone, as it ran
/// under `record`, and asserts that the program's own output (its `lines` lines starting
/// with `tag`) is what it printed there (`probed`: the job's standard output, which is
/// `record`'s when the profile goes to `-o`).
#[track_caller]
pub fn assert_output_as_alone(
    scratch: &Scratch,
    probed: &str,
    command: &[String],
    tag: &str,
    lines: usize,
) {
    let path = scratch.path("alone.stdout");
    let mut cmd = Command::new(&command[0]);
    mpi_env(&mut cmd)
        .args(&command[1..])
        .stdout(std::fs::File::create(&path).expect("stdout file"));
    let mut job = ChildGuard::spawn(&mut cmd);
    assert!(
        job.wait_with_limit(Duration::from_mins(5)).success(),
        "{command:?} alone failed"
    );
    let probed = program_output(probed, tag);
    assert_eq!(probed.len(), lines, "{tag} lines under commtap: {probed:?}");
    let alone = std::fs::read_to_string(&path).expect("the output alone");
    assert_eq!(
        probed,
        program_output(&alone, tag),
        "the program's output under commtap and alone"
    );
}

/// (calls, bytes) per routine of each rank of a JSON profile, by pid.
pub fn rank_tables(
    profile: &Value,
) -> std::collections::BTreeMap<u64, std::collections::BTreeMap<String, (u64, u64)>> {
    profile["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| {
            (
                r["pid"].as_u64().expect("pid"),
                routine_table(&r["routines"]),
            )
        })
        .collect()
}

/// The routines of a profile rank whose names start with `prefix`, in name order.
pub fn routines_named<'a>(rank: &'a Value, prefix: &str) -> Vec<&'a str> {
    rank["routines"]
        .as_object()
        .expect("routines")
        .keys()
        .filter(|r| r.starts_with(prefix))
        .map(String::as_str)
        .collect()
}

/// Checks each rank's call sites in `profile` against what `mpi_sites` (`prog`) says it
/// made from each of its functions (`truths`): per routine and function, the calls and
/// bytes equal; each site in the program is in its file, at the address its symbol (by
/// `nm`) plus the offset says; the sites' calls of every MPI routine add up to the
/// routine's (no call left without a site); none lost to a full map. Where `every_timed`,
/// every call's time was measured. Returns the calls whose time was not.
#[track_caller]
pub fn assert_call_sites_match(
    profile: &Value,
    truths: &[Value],
    prog: &Path,
    every_timed: bool,
) -> u64 {
    use std::collections::BTreeMap;
    let program = prog
        .file_name()
        .expect("name")
        .to_string_lossy()
        .to_string();
    // Demangled (`-C`), as the profile names C++ functions: `trainer::Step::negotiate(long)`.
    let nm = Command::new("nm")
        .arg("-C")
        .arg(prog)
        .output()
        .expect("running nm");
    let symbols: BTreeMap<String, u64> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let (addr, _, name) = (f.next()?, f.next()?, f.next()?);
            Some((name.to_string(), u64::from_str_radix(addr, 16).ok()?))
        })
        .collect();
    let mut untimed = 0;
    for truth in truths {
        let made = truth["sites"].as_array().expect("sites");
        let rank = rank_by_pid(profile, truth["pid"].as_u64().expect("pid"));
        let sites = rank["call_sites"].as_array().expect("call_sites");
        assert_eq!(rank["sites_full"], 0, "{rank:#}");
        // Per routine and function: a function may hold more than one call instruction.
        let mut by_function: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        let mut by_routine: BTreeMap<String, u64> = BTreeMap::new();
        for s in sites {
            let routine = s["routine"].as_str().expect("routine").to_string();
            let calls = s["calls"].as_u64().expect("calls");
            let timed = s["timed_calls"].as_u64().expect("timed_calls");
            assert!(timed <= calls, "{s}");
            if every_timed {
                assert_eq!(timed, calls, "every call timed: {s}");
            }
            untimed += calls - timed;
            *by_routine.entry(routine.clone()).or_default() += calls;
            let Some(function) = s["function"].as_str() else {
                continue;
            };
            let e = by_function
                .entry((routine, function.to_string()))
                .or_default();
            e.0 += calls;
            e.1 += s["bytes"].as_u64().expect("bytes");
            if let Some(t) = made.iter().find(|t| t["function"] == function) {
                // The call's source line, where the program says it (built with `-g`).
                if let Some(line) = t["line"].as_u64() {
                    assert_eq!(s["source_line"].as_u64(), Some(line), "{s}");
                    let file = s["source_file"].as_str().expect("source_file");
                    assert!(file.ends_with("/mpi_sites.c"), "{s}");
                }
                let object = s["object"].as_str().expect("object");
                assert!(object.ends_with(&format!("/{program}")), "{s}");
                // The file's own address is the function's symbol plus the offset (the
                // symbol as the program names it where the profile shows it otherwise: a
                // Fortran module's procedure).
                let file_address = s["file_address"].as_str().expect("file_address");
                let offset = s["offset"].as_u64().expect("offset");
                let symbol = t["symbol"].as_str().unwrap_or(function);
                assert_eq!(
                    u64::from_str_radix(file_address.trim_start_matches("0x"), 16).ok(),
                    Some(symbols[symbol] + offset),
                    "{s}"
                );
            }
        }
        for t in made {
            let key = (
                t["routine"].as_str().expect("routine").to_string(),
                t["function"].as_str().expect("function").to_string(),
            );
            let want = (
                t["calls"].as_u64().expect("calls"),
                t["bytes"].as_u64().expect("bytes"),
            );
            assert_eq!(
                by_function.get(&key).copied(),
                Some(want),
                "{key:?} in rank {}: {sites:#?}",
                truth["rank"]
            );
        }
        // MPI_Init, MPI_Comm_rank ... are called from main (a Fortran program's `MAIN__`,
        // as its truth says).
        let main = truth["main"].as_str().unwrap_or("main").to_string();
        assert!(
            by_function.contains_key(&("MPI_Comm_rank".to_string(), main)),
            "{sites:#?}"
        );
        // The transports' operations (UCX's, under MPICH) are made by the MPI library, inside
        // the MPI calls: those have the sites.
        let mpi_routines = rank["routines"]
            .as_object()
            .expect("routines")
            .iter()
            .filter(|(name, _)| name.starts_with("MPI_"));
        for (name, r) in mpi_routines {
            assert_eq!(
                by_routine.get(name).copied().unwrap_or(0),
                r["calls"].as_u64().expect("calls"),
                "{name}'s calls at their sites: {sites:#?}"
            );
        }
    }
    untimed
}
