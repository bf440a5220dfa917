//! Per-peer point-to-point traffic: a program whose communication matrix is known
//! (`mpi_peers.c`) under `commtap record`, Open MPI and MPICH: every rank's traffic with
//! every peer, sent and received, calls and bytes, equals what the program did, and the
//! HTML report's heat map has a cell for each pair that exchanged bytes.

use std::time::Duration;

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(5);

fn matrix(mpi: Mpi, np: u32) {
    let scratch = Scratch::new(&format!("peers-{}", mpi.suffix()));
    let prog = build_program("mpi_peers.c", mpi);
    let prefix = scratch.path("truth");
    let json = scratch.path("profile.json");
    let text = scratch.path("report.txt");
    let html = scratch.path("report.html");
    let mut args: Vec<String> = [
        "record",
        "--no-skew",
        "--format",
        "text",
        "-o",
        path_str(&text),
        "--json",
        path_str(&json),
        "--html",
        path_str(&html),
        "--",
    ]
    .map(String::from)
    .to_vec();
    args.extend(mpi.launcher(np));
    args.push(prog.display().to_string());
    args.push(prefix.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    finish_ok(&scratch, spawn_commtap(&scratch, &args), LIMIT);

    let profile = read_json(&json);
    for truth in read_truths(&prefix, np) {
        let rank = rank_by_pid(&profile, truth["pid"].as_u64().expect("pid"));
        assert_eq!(
            rank["peers"], truth["peers"],
            "rank {}: per-peer traffic",
            truth["rank"]
        );
        assert_eq!(rank["peers_full"], 0);
    }
    // The HTML report's heat map: a cell per pair of ranks the truths say exchanged bytes
    // (the profile's peers equal the truths' above).
    let page = browse(&scratch, &html, &format!("peers-{}", mpi.suffix()));
    assert_html_report_matches(&page, &profile);
    let report = std::fs::read_to_string(&text).expect("text report");
    assert!(
        report.contains("Point-to-point bytes sent, by rank (row) to world rank (column):"),
        "{report}"
    );
}

#[test]
fn open_mpi_traffic_per_peer_is_exact() {
    matrix(Mpi::OpenMpi, 4);
}

#[test]
fn mpich_traffic_per_peer_is_exact() {
    // An odd size: some ranks have no partner at some distances.
    matrix(Mpi::Mpich, 3);
}
