//! `commtap bench-matching` (run by `cargo xtask bench`): what who-is-late costs the
//! daemon (or `record`) per call event, in its own process, without the kernel's noise.
//!
//! A job of `ranks` processes, each watched from `MPI_Init`, makes `instances` 8-byte
//! `MPI_Allreduce` calls on the world; their events come in as a ring buffer hands them on
//! (each rank's calls in order, the ranks interleaved a batch at a time) and go through
//! the board as `record`'s and the daemon's do: numbering, matching, the summary.

use std::time::Instant;

use collector_common::{comm_id, routines::routine_id, CallEvent, EventKind};

use super::{summary::Whois, Board};
use crate::ingest::FeedItem;

/// Events of one rank handed on together, as a drained ring buffer holds them.
const BATCH: u64 = 64;

/// The job's events: `MPI_Init` then `instances` Allreduces per rank, rank after rank in
/// batches of [`BATCH`].
fn events(ranks: u32, instances: u64) -> Vec<CallEvent> {
    let init = routine_id("MPI_Init").expect("MPI_Init");
    let allreduce = routine_id("MPI_Allreduce").expect("MPI_Allreduce");
    let world = 0x4400_0000;
    let call = |pid: u32, routine: u16, seq: u64| CallEvent {
        kind: EventKind::Call as u32,
        tgid: pid,
        tid: pid,
        routine,
        bucket: 4,
        comm: world,
        comm_id: comm_id::WORLD,
        comm_size: ranks,
        // Rank r arrives r µs after the first; the call lasts 2 µs past the last arrival.
        start_ns: seq * 1_000_000 + u64::from(pid) * 1_000,
        dur_ns: u64::from(ranks - pid) * 1_000 + 2_000,
        bytes: 8,
        thread_seq: seq as u32,
        ..CallEvent::default()
    };
    let mut out = Vec::with_capacity((u64::from(ranks) * (instances + 1)) as usize);
    out.extend((0..ranks).map(|pid| call(pid + 1, init, 0)));
    for from in (1..=instances).step_by(BATCH as usize) {
        for pid in 1..=ranks {
            for seq in from..(from + BATCH).min(instances + 1) {
                out.push(call(pid, allreduce, seq));
            }
        }
    }
    out
}

/// Runs the benchmark `rounds` times and prints one line of JSON: ns per event (median and
/// range over the rounds) and the instances the last round matched.
pub fn run(ranks: u32, instances: u64, rounds: u32) -> anyhow::Result<()> {
    anyhow::ensure!(
        ranks >= 2,
        "--ranks: at least 2 (an instance needs two members)"
    );
    let feed = events(ranks, instances);
    let mut per_event = Vec::new();
    let mut matched = 0;
    for _ in 0..rounds.max(1) {
        let mut board = Board::new("bench".into());
        for pid in 1..=ranks {
            board.set_world((pid, 0), "job", Some(ranks));
        }
        let start = Instant::now();
        for ev in &feed {
            board.item(Ok(FeedItem::Call(*ev)));
        }
        board.finish();
        per_event.push(start.elapsed().as_nanos() as f64 / feed.len() as f64);
        let whois: Whois = &|pid| Some((pid - 1, "bench".into()));
        matched = board
            .report_for(&[(1, 0)], whois)
            .map_or(0, |r| r.instances);
    }
    anyhow::ensure!(
        matched == instances,
        "matched {matched} instances of {instances}"
    );
    per_event.sort_by(f64::total_cmp);
    println!(
        "{{\"ranks\": {ranks}, \"events\": {}, \"instances\": {matched}, \"ns_per_event\": {:.1}, \"min\": {:.1}, \"max\": {:.1}}}",
        feed.len(),
        per_event[per_event.len() / 2],
        per_event[0],
        per_event[per_event.len() - 1]
    );
    Ok(())
}
