//! Latency distributions: a real Open MPI and MPICH job whose rank 0 makes MPI_Sendrecv
//! calls that each wait for a known sleep of rank 1 (`mpi_durations.c`): every call lands
//! in the log2 bucket of its sleep, the fastest and slowest are exact, and the text report
//! shows them.

use std::time::Duration;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);

/// Sleeps in microseconds, each 1.3 x a power of two nanoseconds (2^25, 2^27, 2^29): a
/// call lasts its sleep plus a message's latency and the oversleep, which must stay under
/// the 0.7 x 2^k left before the next bucket (23 ms at the smallest). The waking rank may
/// wait a scheduler slice or two for a core its busy-polling peer holds (MPICH on two
/// cores: 6 ms seen), hence no sleeps of a few milliseconds here.
const SLEEPS_US: [u64; 6] = [43_620, 43_620, 43_620, 174_483, 174_483, 697_932];

fn durations_land_in_their_buckets(mpi: Mpi) {
    let scratch = Scratch::new(&format!("durations-{}", mpi.suffix()));
    let prog = build_program("mpi_durations.c", mpi);
    let (json, text, prefix) = (
        scratch.path("profile.json"),
        scratch.path("report.txt"),
        scratch.path("truth"),
    );
    let mut args: Vec<String> = [
        "record",
        "--json",
        path_str(&json),
        "-o",
        path_str(&text),
        "--",
    ]
    .map(String::from)
    .to_vec();
    args.extend(mpi.launcher(2));
    args.push(prog.display().to_string());
    args.push(prefix.display().to_string());
    args.extend(SLEEPS_US.map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);

    let truths = read_truths(&prefix, 2);
    let profile = read_json(&json);
    let sleeps: Vec<u64> = truths[0]["sleeps_ns"]
        .as_array()
        .expect("sleeps")
        .iter()
        .map(|s| s.as_u64().expect("sleep"))
        .collect();
    assert_eq!(sleeps.len(), SLEEPS_US.len());
    let rank0 = rank_by_pid(&profile, truths[0]["pid"].as_u64().expect("pid"));
    let sendrecv = &rank0["routines"]["MPI_Sendrecv"];
    assert_eq!(sendrecv["calls"], sleeps.len(), "{sendrecv}");
    assert_durations_account_for_calls(sendrecv, "MPI_Sendrecv");

    // Each call in the power-of-two range of its sleep: [2^k, 2^(k+1)) ns.
    let mut want = std::collections::BTreeMap::new();
    for s in &sleeps {
        *want.entry(1u64 << s.ilog2()).or_insert(0u64) += 1;
    }
    let d = &sendrecv["durations"];
    let got: std::collections::BTreeMap<u64, u64> = d["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| {
            let from = b["from_ns"].as_u64().expect("from");
            assert_eq!(b["to_ns"], 2 * from, "{b}");
            (from, b["calls"].as_u64().expect("calls"))
        })
        .collect();
    assert_eq!(got, want, "MPI_Sendrecv durations by bucket: {d}");
    let (min, max) = (d["min_ns"].as_u64().unwrap(), d["max_ns"].as_u64().unwrap());
    let (least, most) = (*sleeps.iter().min().unwrap(), *sleeps.iter().max().unwrap());
    assert!(
        min >= least && min < 2 * (1 << least.ilog2()),
        "fastest {min} ns, sleep {least}"
    );
    assert!(
        max >= most && max < 2 * (1 << most.ilog2()),
        "slowest {max} ns, sleep {most}"
    );

    // This kernel has uprobe sessions (Linux 6.13+): MPI libraries are probed through them.
    for l in profile["libraries"].as_array().expect("libraries") {
        let fabric = l["flavor"]
            .as_str()
            .is_some_and(|f| f.contains("libfabric"));
        assert_eq!(l["uprobe_sessions"], !fabric, "{l}");
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
