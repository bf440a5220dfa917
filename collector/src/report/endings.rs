//! How the ranks that did not finish as programs do ended: killed, exited with an error, or
//! inside an MPI call (a hung job killed, `MPI_Abort`), in the order they ended, for "which
//! rank failed first"; and, of a job still running, the calls its ranks have been inside
//! for long (a hung job: which rank the others wait for).

use std::fmt::Write as _;

use crate::profile::JobProfile;

/// The section of ranks that ended otherwise than with status 0 outside MPI: a line each,
/// the first to end first, with the time since the first rank's end (normal or not);
/// empty where every rank that ended did so normally.
pub fn render_endings(job: &JobProfile) -> String {
    let abnormal = job.abnormal_endings();
    if abnormal.is_empty() {
        return String::new();
    }
    // Counted from the first rank to end, normally or not (the ranks that failed after
    // the others finished).
    let first = job
        .ranks
        .iter()
        .filter_map(|r| r.ended.as_ref()?.at_unix_ns)
        .min();
    let mut o = String::new();
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Ranks that did not end normally: {} of {} (in the order they ended, after the \
         first rank's end; the first is the likeliest cause):",
        abnormal.len(),
        job.ranks.len()
    );
    let _ = writeln!(
        o,
        "{:>8} {:<20} {:>10} {:>10}  how",
        "taskid", "hostname", "pid", "after(s)"
    );
    for (r, e) in abnormal {
        let after = match (first, e.at_unix_ns) {
            (Some(f), Some(at)) => format!("{:.3}", at.saturating_sub(f) as f64 / 1e9),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "{:>8} {:<20} {:>10} {:>10}  {}",
            r.rank,
            r.host,
            r.pid,
            after,
            e.describe()
        );
    }
    o
}

/// The section of calls in progress, where a running rank has been inside one for
/// [`LONG_CALL_NS`](crate::profile::LONG_CALL_NS) or more: every running rank, the call it is inside (or none), the
/// ranks outside MPI first (in a hung job, the likeliest the others wait for); empty
/// otherwise.
pub fn render_calls_in_progress(job: &JobProfile) -> String {
    let running: Vec<&crate::profile::RankProfile> = job
        .ranks
        .iter()
        .filter(|r| r.ended.is_none() && !r.exited)
        .collect();
    let inside_long = running.iter().filter(|r| r.long_call().is_some()).count();
    if inside_long == 0 {
        return String::new();
    }
    let mut rows = running;
    // Outside MPI first, then the shortest in its call: the others have waited longer.
    rows.sort_by_key(|r| (r.in_call.as_ref().map(|c| c.for_ns), r.rank));
    let mut o = String::new();
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Calls in progress when this report was made ({} of {} running ranks inside one for \
         1 s or more; those outside MPI, or in their call the shortest, first: the \
         likeliest ones the others wait for):",
        inside_long,
        rows.len()
    );
    let _ = writeln!(
        o,
        "{:>8} {:<20} {:>10}  inside",
        "taskid", "hostname", "pid"
    );
    for r in rows {
        let inside = match &r.in_call {
            Some(c) => c.describe(),
            None if r.in_call_unknown => {
                "not known (a thread's stack could not be read whole)".to_string()
            }
            None => "no MPI call".to_string(),
        };
        let _ = writeln!(o, "{:>8} {:<20} {:>10}  {inside}", r.rank, r.host, r.pid);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Ending, InCall, RankProfile};

    fn rank(rank: u32, ended: Option<Ending>) -> RankProfile {
        let mut r: RankProfile = serde_json::from_value(serde_json::json!({
            "rank": rank, "rank_known": true, "pid": 100 + rank, "host": "node1", "job": "7",
            "cmdline": "./app", "start_ticks": 1, "elapsed_ns": 1, "comm_time_ns": 0,
            "routines": {},
        }))
        .expect("a rank profile");
        r.ended = ended;
        r
    }

    #[test]
    fn the_ranks_that_failed_are_listed_in_the_order_they_ended() {
        let at = |s: u64| Some(1_700_000_000_000_000_000 + s * 1_000_000);
        let job = JobProfile::of_ranks(vec![
            rank(
                0,
                Some(Ending {
                    signal: Some(15),
                    at_unix_ns: at(250),
                    inside: Some(InCall {
                        routine: "MPI_Barrier".into(),
                        for_ns: 2_500_000_000,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            ),
            rank(
                1,
                Some(Ending {
                    signal: Some(11),
                    core_dumped: true,
                    at_unix_ns: at(0),
                    ..Default::default()
                }),
            ),
            rank(
                2,
                Some(Ending {
                    status: Some(0),
                    at_unix_ns: at(100),
                    ..Default::default()
                }),
            ),
            rank(3, None),
        ]);
        let text = render_endings(&job);
        let rows: Vec<&str> = text.lines().skip(3).collect();
        assert_eq!(
            rows,
            [
                "       1 node1                       101      0.000  killed by SIGSEGV (core dumped)",
                "       0 node1                       100      0.250  killed by SIGTERM inside MPI_Barrier (2.5 s in it)",
            ],
            "{text}"
        );
        assert!(text.contains("did not end normally: 2 of 4"), "{text}");
        // Every rank that ended did so normally: no section.
        let job = JobProfile::of_ranks(vec![rank(0, job.ranks[2].ended.clone()), rank(1, None)]);
        assert_eq!(render_endings(&job), "");
    }

    #[test]
    fn a_hung_job_lists_the_rank_outside_mpi_first() {
        let mut ranks: Vec<RankProfile> = (0..4).map(|r| rank(r, None)).collect();
        for (r, s) in [(0, 40), (2, 38), (3, 41)] {
            ranks[r].in_call = Some(InCall {
                routine: "MPI_Allreduce".into(),
                for_ns: s * 1_000_000_000,
                ..Default::default()
            });
        }
        let job = JobProfile::of_ranks(ranks);
        let text = render_calls_in_progress(&job);
        let rows: Vec<&str> = text.lines().skip(3).collect();
        assert_eq!(
            rows,
            [
                "       1 node1                       101  no MPI call",
                "       2 node1                       102  MPI_Allreduce (38.0 s in it)",
                "       0 node1                       100  MPI_Allreduce (40.0 s in it)",
                "       3 node1                       103  MPI_Allreduce (41.0 s in it)",
            ],
            "{text}"
        );
        assert!(text.contains("(3 of 4 running ranks"), "{text}");
        // Calls shorter than a second: a job at work, no section.
        let mut ranks: Vec<RankProfile> = (0..2).map(|r| rank(r, None)).collect();
        ranks[0].in_call = Some(InCall {
            routine: "MPI_Allreduce".into(),
            for_ns: 5_000,
            ..Default::default()
        });
        assert_eq!(render_calls_in_progress(&JobProfile::of_ranks(ranks)), "");
    }

    /// A rank attached to late: its call found on its stack, or not known where a stack
    /// could not be read whole (never taken for a rank outside MPI).
    #[test]
    fn a_call_entered_before_the_attach_and_an_unknown_one_read_as_such() {
        let mut ranks: Vec<RankProfile> = (0..3).map(|r| rank(r, None)).collect();
        ranks[0].in_call = Some(InCall {
            routine: "MPI_Barrier".into(),
            for_ns: 3_000_000_000,
            before_attach: true,
            called_from: Some("main+0x65 at app.c:38 (app)".into()),
            ..Default::default()
        });
        ranks[1].in_call_unknown = true;
        let text = render_calls_in_progress(&JobProfile::of_ranks(ranks));
        let rows: Vec<&str> = text.lines().skip(3).collect();
        assert_eq!(
            rows,
            [
                "       1 node1                       101  not known (a thread's stack could not be read whole)",
                "       2 node1                       102  no MPI call",
                "       0 node1                       100  MPI_Barrier (3.0 s in it or more: entered before commtap attached), called from main+0x65 at app.c:38 (app)",
            ],
            "{text}"
        );
    }

    #[test]
    fn an_exit_status_and_abort_read_as_such() {
        let e = Ending {
            status: Some(5),
            inside: Some(InCall {
                routine: "MPI_Abort".into(),
                for_ns: 1_000_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            e.describe(),
            "exited with status 5 inside MPI_Abort (1.0 ms in it)"
        );
        assert!(!e.normal());
        assert_eq!(crate::profile::signal_name(9), "SIGKILL");
        assert_eq!(crate::profile::signal_name(40), "signal 40");
    }
}
