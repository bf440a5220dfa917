//! NCCL: commtap's profile of a process calling the real `libnccl.so.2` equals what the
//! process did (calls, bytes by nccl-tests' conventions, datatype decoding, groups), and
//! what it cannot decode (a NULL communicator's size, a datatype from a newer NCCL) is
//! counted as undecoded, never guessed.

use std::{process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn real_libnccl_calls_are_counted_exactly() {
    let scratch = Scratch::new("nccl-real");
    let prog = build_nccl_program("nccl_calls.c", &nccl_lib_dir(), "libnccl.so.2");
    let n = 1000;
    let mut app = ChildGuard::spawn(
        Command::new(&prog)
            .arg(scratch.path("ready"))
            .arg(scratch.path("go"))
            .arg(n.to_string())
            .arg(scratch.path("truth.json")),
    );
    wait_until("the program to be ready", LIMIT, || {
        scratch.path("ready").exists()
    });
    let pid = app.0.id();
    let (commtap, out) = record_attached(&scratch, &[pid]);
    std::fs::write(scratch.path("go"), b"").expect("go file");
    assert!(app.wait_with_limit(LIMIT).success(), "nccl_calls failed");
    let run = finish_ok(&scratch, commtap, LIMIT);
    let profile = read_json(&out);
    let truth = read_json(&scratch.path("truth.json"));

    let rank = rank_by_pid(&profile, pid as u64);
    assert_eq!(
        routine_table(&rank["routines"]),
        routine_table(&truth["routines"]),
        "(calls, bytes) per routine; stderr:\n{}",
        run.stderr
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
}
