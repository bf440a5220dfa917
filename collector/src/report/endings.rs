//! How the ranks that did not finish as programs do ended: killed, exited with an error, or
//! inside an MPI call (a hung job killed, `MPI_Abort`), in the order they ended, for "which
//! rank failed first".

use std::fmt::Write as _;

use crate::profile::JobProfile;

/// The section: a line a rank that ended otherwise than with status 0 outside MPI, the
/// first to end first, with its lead on the next; empty where every rank that ended did so
/// normally.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Ending, RankProfile};

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
                    inside: Some("MPI_Barrier".into()),
                    inside_ns: 2_500_000_000,
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
    fn an_exit_status_and_abort_read_as_such() {
        let e = Ending {
            status: Some(5),
            inside: Some("MPI_Abort".into()),
            inside_ns: 1_000_000,
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
