//! How long calls took, across all ranks: mpiP's min / mean / max per routine, the log2
//! histogram's median and 99th percentile, and how unevenly the ranks spent their time.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    profile::JobProfile,
    stats::{Durations, SampledTime, Totals},
};

/// Per routine, all ranks together: calls and time, the merged durations, and each rank's
/// time in it (ranks that never called it count as zero).
struct Row {
    totals: Totals,
    durations: Durations,
    per_rank_ns: Vec<f64>,
    /// Where the time was sampled: the calls timed and the estimate's error.
    sampled: Option<SampledTime>,
}

/// The text section, empty when no call was timed.
pub fn render_durations(job: &JobProfile) -> String {
    let mut o = String::new();
    let mut rows: BTreeMap<(u16, &str), Row> = BTreeMap::new();
    for (i, r) in job.ranks.iter().enumerate() {
        for (name, s) in &r.routines {
            let Some(d) = &s.durations else { continue };
            let order = collector_common::routines::routine_id(name).unwrap_or(u16::MAX);
            let row = rows.entry((order, name)).or_insert_with(|| Row {
                totals: Totals::default(),
                durations: d.clone(),
                per_rank_ns: vec![0.0; job.ranks.len()],
                sampled: None,
            });
            if row.totals.calls > 0 {
                row.durations.merge(d);
            }
            SampledTime::merge_into(
                &mut row.sampled,
                row.totals.calls,
                s.sampled_time.as_ref(),
                s.totals.calls,
            );
            row.totals.merge(&s.totals);
            row.per_rank_ns[i] += s.totals.time_ns as f64;
        }
    }
    if rows.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------"
    );
    let _ = writeln!(
        o,
        "Call durations, all ranks (p50 and p99 are upper bounds: the log2 bucket's end):"
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<24} {:>10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8}",
        "Routine", "#calls", "min(us)", "mean(us)", "p50<=(us)", "p99<=(us)", "max(us)", "CV"
    );
    let us = |ns: f64| ns / 1e3;
    for ((_, name), row) in &rows {
        let d = &row.durations;
        let mean = row.totals.time_ns as f64 / row.totals.calls.max(1) as f64;
        let marked = if row.sampled.is_some() {
            format!("{name}*")
        } else {
            (*name).to_string()
        };
        let _ = writeln!(
            o,
            "{:<24} {:>10} {:>11.3} {:>11.3} {:>11.3} {:>11.3} {:>11.3} {:>8}",
            marked,
            row.totals.calls,
            us(d.min_ns as f64),
            us(mean),
            us(d.quantile_ns(0.5) as f64),
            us(d.quantile_ns(0.99) as f64),
            us(d.max_ns as f64),
            cv(&row.per_rank_ns).map_or("-".into(), |c| format!("{c:.2}")),
        );
    }
    let sampled: Vec<String> = rows
        .iter()
        .filter_map(|((_, name), row)| {
            let s = row.sampled?;
            Some(format!(
                "{name} timed {} of {} calls, its time {:.3} s ± {:.3} s",
                s.timed_calls,
                row.totals.calls,
                row.totals.time_ns as f64 / 1e9,
                s.error_ns as f64 / 1e9
            ))
        })
        .collect();
    if !sampled.is_empty() {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "* time sampled to keep the probes' cost down (--max-overhead; calls and bytes \
             exact), estimated from the calls timed (± 95% interval); the histogram holds \
             those: {}",
            sampled.join("; ")
        );
    }
    if let Some((share, r)) = job
        .ranks
        .iter()
        .filter(|r| r.elapsed_ns > 0)
        .map(|r| (r.estimated_probe_ns() as f64 / r.elapsed_ns as f64, r))
        .max_by(|a, b| a.0.total_cmp(&b.0))
    {
        let ns = |ns: u64| super::units::Unit::Seconds.format(super::units::secs(ns));
        // Where it goes: the routines whose probes cost that rank most.
        let top: Vec<(&str, u64)> = r
            .estimated_probe_ns_by_routine()
            .into_iter()
            .take(3)
            .filter(|(_, t)| *t > 0)
            .collect();
        let costliest: Vec<String> = top
            .iter()
            .map(|(name, t)| format!("{name} {}", ns(*t)))
            .collect();
        let cost = r.call_cost();
        let measured = if cost.measured_runs > 0 {
            format!(
                "the programs' mean run {} measured by the kernel over {} runs",
                ns(cost.program_ns),
                cost.measured_runs
            )
        } else {
            format!(
                "the programs' run assumed {}, not measured",
                ns(cost.program_ns)
            )
        };
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "Probes' estimated cost (an entry per call at {}, a return per timed call at {}: \
             the kernel's trap and {measured}): at most {:.2}% of a rank's time (rank {}){}",
            ns(cost.entry_ns),
            ns(cost.return_ns),
            share * 100.0,
            r.rank,
            if costliest.is_empty() {
                String::new()
            } else {
                format!(", most of it in {}", costliest.join(", "))
            }
        );
        if share >= HIGH_SHARE {
            // Alarming at first sight, and right: say why, so that it is not taken as what an
            // application pays.
            let calls: u64 = r.routines.values().map(|s| s.totals.calls).sum();
            let _ = writeln!(
                o,
                "  (rank {} spent {:.0}% of its time in MPI calls of {} on average: a probe's \
                 fixed price weighs most on short calls, and an application's own work \
                 dilutes it; --max-overhead samples the time of routines called often, from \
                 a run's first tens of milliseconds)",
                r.rank,
                100.0 * r.comm_time_ns as f64 / r.elapsed_ns as f64,
                ns(r.comm_time_ns.checked_div(calls).unwrap_or(0)),
            );
        }
        // Of those, the ones no budget can thin that make a tenth of the estimate or more,
        // and why: where the estimate stays high, the user learns what would bring it down.
        let total = r.estimated_probe_ns();
        let kept: Vec<String> = top
            .iter()
            .filter(|(name, t)| *t >= total / 10 && r.routines[*name].sampled_time.is_none())
            .filter_map(|(name, _)| Some(format!("{name} ({})", never_sampled(name, job)?)))
            .collect();
        if share >= NOTED_SHARE && !kept.is_empty() {
            let _ = writeln!(
                o,
                "  timed at every call whatever --max-overhead says: {}",
                kept.join("; ")
            );
        }
    }
    let comm: Vec<f64> = job.ranks.iter().map(|r| r.comm_time_ns as f64).collect();
    if let Some(c) = cv(&comm) {
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "CV: coefficient of variation of the time spent in the routine across ranks \
             (standard deviation / mean); of communication time: {c:.2}"
        );
    }
    o
}

/// A rank's estimated probe cost (share of its time) from which the report says why it is
/// so high.
const HIGH_SHARE: f64 = 0.10;

/// A rank's estimated probe cost (share of its time) from which the report says what kept
/// it there: the default `--max-overhead`.
const NOTED_SHARE: f64 = 0.01;

/// Why the budget (`--max-overhead`) leaves routine `name` timed at every call, where it
/// does whatever the call rate (as `session::budget` chooses what it may sample). What the
/// profile does not record is not judged: `--time-every-call`, a stream's events switched
/// on for a while (`call_events` is the setting at the end), a receive's calls that pass a
/// status (timed, where those that ignore it may be sampled).
fn never_sampled(name: &str, job: &JobProfile) -> Option<&'static str> {
    use collector_common::routines::{routine_id, Family, ROUTINES};
    let routine = ROUTINES.get(usize::from(routine_id(name)?))?;
    if !matches!(routine.family(), Family::Mpi | Family::Fabric) {
        return Some("NCCL's and CUDA's calls are timed at every call");
    }
    if !routine.spec.time_may_be_sampled() {
        return Some(
            "its return reads what the call did: a status, a new handle, whether it posted",
        );
    }
    // Without sessions every return probe runs: nothing is sampled, whatever else is off.
    if !job.libraries.is_empty() && !job.libraries.iter().any(|l| l.uprobe_sessions) {
        return Some("time is sampled through uprobe sessions only, Linux 6.13+");
    }
    if job.call_events {
        return Some("an event per call (a trace) carries its time");
    }
    if job.skew.is_some() && routine.spec.matters_for_skew() {
        // Where the kernel numbers a communicator's instances (seen made) it draws some and
        // the rest are sampled; this is the one it does not (ranks attached mid-job).
        return Some(
            "who is late times the instances it follows: all of a communicator's first \
             1,024, then one in 2 to 64 (every one where it aligns ranks attached mid-job \
             by time): --no-skew lets it be sampled",
        );
    }
    None
}

/// Standard deviation over mean of `v` (population), where there are two values or more
/// and a non-zero mean.
fn cv(v: &[f64]) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if mean <= 0.0 {
        return None;
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    Some(var.sqrt() / mean)
}

#[cfg(test)]
mod tests {
    use super::{cv, never_sampled};
    use crate::profile::JobProfile;

    /// The report names what no `--max-overhead` can thin, with what would change that.
    #[test]
    fn what_no_budget_can_thin_is_named_with_its_reason() {
        let mut job = JobProfile::of_ranks(Vec::new());
        let why = |name: &str, job: &JobProfile| never_sampled(name, job).unwrap_or("-");
        assert!(why("ncclAllReduce", &job).starts_with("NCCL's"));
        assert!(why("MPI_Comm_dup", &job).starts_with("its return reads"));
        assert_eq!(why("MPI_Allreduce", &job), "-");
        assert_eq!(why("MPI_Iprobe", &job), "-");
        assert_eq!(why("MPI_Nothing", &job), "-");
        job.skew = Some(Default::default());
        assert!(why("MPI_Allreduce", &job).ends_with("--no-skew lets it be sampled"));
        assert_eq!(why("MPI_Iprobe", &job), "-");
        job.call_events = true;
        assert!(why("MPI_Iprobe", &job).contains("(a trace)"));
        // Probed without uprobe sessions: no return can be skipped, so that is the reason.
        job.libraries.push(crate::profile::ProbedLibrary {
            path: "/lib/libmpi.so.40".into(),
            flavor: "Open MPI 4.x".into(),
            probes: 1,
            moved_past_single_step: Vec::new(),
            single_stepped: Vec::new(),
            failed: Vec::new(),
            uprobe_sessions: false,
        });
        assert!(why("MPI_Allreduce", &job).ends_with("Linux 6.13+"));
        assert!(why("ncclAllReduce", &job).starts_with("NCCL's"));
        job.libraries[0].uprobe_sessions = true;
        assert!(why("MPI_Allreduce", &job).contains("(a trace)"));
    }

    #[test]
    fn coefficient_of_variation() {
        assert_eq!(cv(&[1.0]), None);
        assert_eq!(cv(&[0.0, 0.0]), None);
        assert_eq!(cv(&[2.0, 2.0]), Some(0.0));
        // mean 2, deviations 1: sd 1.
        assert_eq!(cv(&[1.0, 3.0]), Some(0.5));
    }
}
