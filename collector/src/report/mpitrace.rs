//! mpitrace's text layout: per rank, `MPI Routine #calls avg. bytes time(sec)`, the
//! message-size distributions, and, for the job, the communication summary for all tasks.

use std::{collections::BTreeMap, fmt::Write as _, fs, io, path::Path};

use collector_common::{
    buckets::RangeLabel,
    routines::{class, Family, ROUTINES},
};

use super::units::secs;
use crate::profile::{CommSummary, JobProfile, RankProfile};
use crate::stats::{table_order, RoutineStats, Totals};

/// Where a rank stands among all ranks (`s`: the job's summary), as mpitrace words it.
fn standing(job: &JobProfile, s: Option<&CommSummary>, r: &RankProfile) -> Option<&'static str> {
    let s = s?;
    if job.ranks.len() < 2 {
        return None;
    }
    if s.min.pid == r.pid {
        Some("minimum")
    } else if s.max.pid == r.pid {
        Some("maximum")
    } else if s.median.pid == r.pid {
        Some("median")
    } else {
        None
    }
}

/// What every rank's section says of the report's ranks, worked out once for all (a
/// section per rank of a 10,000-rank job must not walk every rank again).
pub struct Context<'a> {
    /// The job's [`JobProfile::comm_summary`] (it sorts the ranks).
    summary: Option<CommSummary<'a>>,
    /// Per job (a daemon's report without --job may hold several): its ranks here, the
    /// rank of the largest resident set (bytes, rank) and the longest (elapsed, rank).
    jobs: BTreeMap<&'a str, JobFacts>,
}

/// What a rank's section says of its job's ranks.
#[derive(Default)]
struct JobFacts {
    ranks: usize,
    largest_rss: Option<(u64, u32)>,
    longest: Option<(u64, u32)>,
}

impl<'a> Context<'a> {
    /// The context of `job`'s sections.
    pub fn of(job: &'a JobProfile) -> Context<'a> {
        // The largest, the lowest rank among equals.
        let keep = |best: &mut Option<(u64, u32)>, v: u64, rank: u32| {
            if best.is_none_or(|(b, k)| v > b || (v == b && rank < k)) {
                *best = Some((v, rank));
            }
        };
        let mut jobs: BTreeMap<&str, JobFacts> = BTreeMap::new();
        for r in &job.ranks {
            let f = jobs.entry(r.job.as_str()).or_default();
            f.ranks += 1;
            if let Some(u) = &r.usage {
                keep(&mut f.largest_rss, u.max_rss_bytes, r.rank);
            }
            keep(&mut f.longest, r.elapsed_ns, r.rank);
        }
        Context {
            summary: job.comm_summary(),
            jobs,
        }
    }
}

/// One rank's section, as in an mpitrace `mpi_profile.<job>.<rank>` file.
pub fn render_rank(job: &JobProfile, ctx: &Context, r: &RankProfile) -> String {
    let mut o = String::new();
    let summary = ctx.summary.as_ref();
    let facts = ctx.jobs.get(r.job.as_str());
    // Its own job's ranks here (a daemon's report without --job may hold several jobs), and
    // as many as its launcher said it has (one node's report holds that node's only).
    let here = facts.map_or(1, |f| f.ranks);
    // A launcher's word below what is here is wrong (a variable of another launcher's).
    let size = r.world_size.map_or(here, |n| (n as usize).max(here));
    let _ = writeln!(o, "Data for MPI rank {} of {}:", r.rank, size);
    match &r.region {
        Some(g) => {
            let _ = writeln!(
                o,
                "Times and statistics within the profiled region (MPI_Pcontrol(1) to \
                 MPI_Pcontrol(0)): {} interval(s), {:.3} sec; the whole run is in the JSON \
                 profile.",
                g.intervals,
                secs(g.elapsed_ns)
            );
            if g.late_bounds > 0 {
                let _ = writeln!(
                    o,
                    "{} bound(s) read late (the process could not be paused at MPI_Pcontrol): \
                     calls close to them may fall on the wrong side.",
                    g.late_bounds
                );
            }
        }
        None => {
            let _ = writeln!(o, "Times and statistics from {}.", watched_span(r));
        }
    }
    if r.unwatched_ns > 0 {
        let _ = writeln!(
            o,
            "Not watched for {:.3} sec in between (detached, then attached again): its calls \
             then are not counted, nor is that time in the elapsed time.",
            secs(r.unwatched_ns)
        );
    }
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------------"
    );
    let _ = writeln!(
        o,
        "{:<28}{:>12}{:>16}{:>14}",
        "MPI Routine", "#calls", "avg. bytes", "time(sec)"
    );
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------------"
    );
    let rows = table_order(&r.routines, Family::Mpi);
    for (name, s) in &rows {
        let avg_bytes = if logs_bytes(name) {
            s.totals.avg_bytes()
        } else {
            0.0
        };
        let _ = writeln!(
            o,
            "{:<28}{:>12}{:>16.1}{:>14.3}",
            name,
            s.totals.calls,
            avg_bytes,
            secs(s.totals.time_ns)
        );
    }
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------------"
    );
    match standing(job, summary, r) {
        Some(w) if here == size => {
            let _ = writeln!(
                o,
                "MPI task {} of {} had the {} communication time.",
                r.rank, size, w
            );
        }
        Some(w) => {
            let _ = writeln!(
                o,
                "MPI task {} of {} had the {} communication time of the {} rank(s) here.",
                r.rank, size, w, here
            );
        }
        None => {}
    }
    let _ = writeln!(
        o,
        "total communication time = {:.3} seconds.",
        secs(r.comm_time_ns)
    );
    let _ = writeln!(
        o,
        "total elapsed time       = {:.3} seconds.",
        secs(r.elapsed_ns)
    );
    render_usage(&mut o, facts, r);
    if r.health.dropped
        + r.health.undecoded
        + r.health.in_flight_at_attach
        + r.health.counter_map_full
        > 0
    {
        let _ = writeln!(
            o,
            "not measured: {} calls with undecodable bytes, {} calls in flight at attach, {} calls lost to a full counter map; {} events dropped (counts exact).",
            r.health.undecoded, r.health.in_flight_at_attach, r.health.counter_map_full, r.health.dropped
        );
    }
    if r.health.abandoned > 0 {
        let _ = writeln!(
            o,
            "calls left without returning: {} (a longjmp or an exception out of an error \
             handler: not counted; the calls after them are).",
            r.health.abandoned
        );
    }
    if r.health.handles_refused > 0 {
        let _ = writeln!(
            o,
            "handles not kept: {} (communicators, datatypes, collectives' numbering: past this \
             user's share of the kernel's maps, or a map full; the calls needing them count \
             as undecoded, or are aligned by time).",
            r.health.handles_refused
        );
    }
    o.push_str(&render_sizes(
        ("Message size distributions:", "time(sec)"),
        &rows,
    ));
    render_call_sites(&mut o, r);
    o
}

/// Most call sites the job's table shows.
const JOB_SITES_SHOWN: usize = 20;

/// Where the job's calls were made from, every rank's together (a job of several ranks
/// with call sites counted): one row per routine and site, with the ranks that called
/// from there.
fn render_job_sites(o: &mut String, job: &JobProfile) {
    if job.ranks.len() < 2 {
        return;
    }
    let rows = job.sites_of_all_ranks();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------"
    );
    let _ = writeln!(
        o,
        "Call sites of all ranks (most time first; each rank's own above):"
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<28}{:>8}{:>12}{:>16}{:>14}   call site",
        "MPI Routine", "ranks", "#calls", "avg. bytes", "time(sec)"
    );
    for row in rows.iter().take(JOB_SITES_SHOWN) {
        let _ = writeln!(
            o,
            "{:<28}{:>8}{:>12}{:>16.1}{:>13.3}{:<1}   {}",
            row.routine,
            row.ranks,
            row.totals.calls,
            row.totals.avg_bytes(),
            secs(row.totals.time_ns),
            if row.untimed > 0 { "*" } else { "" },
            row.site
        );
    }
    if rows.len() > JOB_SITES_SHOWN {
        let _ = writeln!(
            o,
            "({} more in the HTML report and the JSON profile)",
            rows.len() - JOB_SITES_SHOWN
        );
    }
    let _ = writeln!(o);
}

/// Most call sites a rank's text shows (the JSON profile has them all).
const CALL_SITES_SHOWN: usize = 50;

/// The rank's "Call sites" section, where they were counted (`--call-sites`): each
/// routine's calls by where they were made from, most time first.
fn render_call_sites(o: &mut String, r: &RankProfile) {
    if r.call_sites.is_empty() && r.health.sites_full == 0 && r.call_sites_left_out == 0 {
        return;
    }
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------"
    );
    let _ = writeln!(
        o,
        "Call sites (where the calls were made from, most time first{}):",
        if r.region.is_some() {
            "; the whole run, not only the profiled region"
        } else {
            ""
        }
    );
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:<28}{:>12}{:>16}{:>14}   call site",
        "MPI Routine", "#calls", "avg. bytes", "time(sec)"
    );
    for c in r.call_sites.iter().take(CALL_SITES_SHOWN) {
        let sampled = if c.timed_calls < c.totals.calls {
            "*"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "{:<28}{:>12}{:>16.1}{:>13.3}{sampled:<1}   {}",
            c.routine,
            c.totals.calls,
            c.totals.avg_bytes(),
            secs(c.totals.time_ns),
            c.label()
        );
    }
    if r.call_sites.len() > CALL_SITES_SHOWN {
        let _ = writeln!(
            o,
            "({} more call sites in the JSON profile)",
            r.call_sites.len() - CALL_SITES_SHOWN
        );
    }
    if r.call_sites_left_out > 0 {
        let _ = writeln!(
            o,
            "({} call sites with the least time left out of the profile: it keeps {})",
            r.call_sites_left_out,
            crate::profile::MAX_CALL_SITES
        );
    }
    if r.call_sites.iter().any(|c| c.timed_calls < c.totals.calls) {
        let _ = writeln!(
            o,
            "* time estimated from the calls timed (the routine's time was sampled)"
        );
    }
    if r.health.sites_full > 0 {
        let _ = writeln!(
            o,
            "{} calls not placed at their call site (the kernel's map of call sites was \
             full, or this user held its share of it; the tables above have them).",
            r.health.sites_full
        );
    }
    let _ = writeln!(o);
}

/// mpitrace's lines of what the rank used (`getrusage`'s) and which rank of its job used
/// the most memory and time.
fn render_usage(o: &mut String, facts: Option<&JobFacts>, r: &RankProfile) {
    if let Some(u) = &r.usage {
        let _ = writeln!(
            o,
            "user cpu time            = {:.3} seconds.",
            secs(u.user_ns)
        );
        let _ = writeln!(
            o,
            "system time              = {:.3} seconds.",
            secs(u.system_ns)
        );
        let _ = writeln!(
            o,
            "max resident set size    = {:.3} MBytes.",
            mbytes(u.max_rss_bytes)
        );
        if !u.at_exit {
            let _ = writeln!(o, "(read while it ran, when this report was made)");
        }
    }
    if let Some((bytes, rank)) = facts.and_then(|f| f.largest_rss) {
        let _ = writeln!(
            o,
            "Rank {rank} reported the largest memory utilization : {:.2} MBytes",
            mbytes(bytes)
        );
    }
    if let Some((ns, rank)) = facts.and_then(|f| f.longest) {
        let _ = writeln!(
            o,
            "Rank {rank} reported the largest elapsed time : {:.2} sec",
            secs(ns)
        );
    }
}

/// Bytes in mpitrace's MBytes (2^20).
pub(super) fn mbytes(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

/// Whether mpitrace's wrapper of `routine` logs bytes: its `MPI_Start` and `MPI_Startall`
/// log none (their bytes were logged at the request's creation), where commtap's profile
/// counts what each start moves; its `MPI_Fetch_and_op` none, where the profile counts the
/// element fetched.
fn logs_bytes(routine: &str) -> bool {
    !matches!(routine, "MPI_Start" | "MPI_Startall" | "MPI_Fetch_and_op")
}

/// The rank's "Message size distributions" section (`title`, and what its times are):
/// per routine with bytes, a line per size bucket.
fn render_sizes((title, time): (&str, &str), rows: &[(&String, &RoutineStats)]) -> String {
    let mut o = String::new();
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------"
    );
    let _ = writeln!(o, "{title}");
    let _ = writeln!(o);
    for (name, s) in rows {
        if !logs_bytes(name) || (s.totals.bytes == 0 && s.undecoded_calls == 0) {
            continue;
        }
        let _ = writeln!(
            o,
            "{:<28}{:>12}{:>16}{:>14}",
            name, "#calls", "avg. bytes", time
        );
        for b in &s.sizes {
            let t: &Totals = &b.totals;
            match b.bucket {
                Some(_) => {
                    let _ = writeln!(
                        o,
                        "{:<28}{:>12}{:>16.1}{:>14.3}",
                        "",
                        t.calls,
                        t.avg_bytes(),
                        secs(t.time_ns)
                    );
                }
                None => {
                    let _ = writeln!(
                        o,
                        "{:<28}{:>12}{:>16}{:>14.3}",
                        "",
                        t.calls,
                        "undecoded",
                        secs(t.time_ns)
                    );
                }
            }
        }
        let _ = writeln!(o);
    }
    o
}

/// A rank's NCCL operations and communicators (not part of mpitrace's files).
pub fn render_nccl(r: &RankProfile) -> String {
    let mut o = String::new();
    let (net, nccl): (Vec<_>, Vec<_>) = table_order(&r.routines, Family::Nccl)
        .into_iter()
        .partition(|(name, _)| net_transport(name).is_some());
    if nccl.is_empty() && net.is_empty() {
        return o;
    }
    // The host's waits for the GPU belong with the operations they wait for.
    let rows: Vec<_> = nccl
        .into_iter()
        .chain(table_order(&r.routines, Family::Cuda))
        .collect();
    let _ = writeln!(o, "NCCL operations of rank {} (pid {}):", r.rank, r.pid);
    let _ = writeln!(
        o,
        "Times are host-side enqueue times: NCCL runs the operations later, on the GPU."
    );
    write_routine_table(&mut o, ("NCCL Operation", "enqueue(sec)"), &rows, false);
    if r.health.group_ops > 0 {
        let _ = writeln!(
            o,
            "{} operations were enqueued inside groups (ncclGroup: one completed group, from \
             ncclGroupStart to ncclGroupEnd's return).",
            r.health.group_ops
        );
    }
    if r.health.mixed_windows > 0 {
        let _ = writeln!(
            o,
            "{} waits for the GPU followed operations of different kinds: their device time \
             is not attributed.",
            r.health.mixed_windows
        );
    }
    let _ = writeln!(o);
    render_device_time(&mut o, &rows);
    let _ = writeln!(
        o,
        "Communicators (size and rank \"?\": not known to commtap):"
    );
    let _ = writeln!(
        o,
        "{:<18}{:>6}{:>6}  {:<20}{:>10}{:>16}",
        "id", "size", "rank", "operation", "#calls", "bytes"
    );
    for (name, s) in &rows {
        for c in &s.communicators {
            let unknown = |known: bool, v: String| if known { v } else { "?".into() };
            let _ = writeln!(
                o,
                "{:<18}{:>6}{:>6}  {:<20}{:>10}{:>16}",
                c.id.as_deref().unwrap_or("(unknown)"),
                unknown(c.size > 0, c.size.to_string()),
                unknown(c.rank >= 0, c.rank.to_string()),
                name,
                c.totals.calls,
                c.totals.bytes
            );
        }
    }
    if rows
        .iter()
        .any(|(_, s)| s.totals.bytes > 0 || s.undecoded_calls > 0)
    {
        o.push_str(&render_sizes(
            ("NCCL operation size distributions:", "enqueue(sec)"),
            &rows,
        ));
    } else {
        let _ = writeln!(o);
    }
    render_nccl_net(&mut o, r, &net);
    o
}

/// NCCL's network transport named by one of its probed functions (`ncclNetSocketIsend`).
pub fn net_transport(routine: &str) -> Option<&'static str> {
    let id = collector_common::routines::routine_id(routine)?;
    if ROUTINES[id as usize].spec.class != class::NET {
        return None;
    }
    Some(if routine.starts_with("ncclIb") {
        "IB"
    } else if routine.starts_with("ncclNetPlugin") {
        // Named in the libraries list: NCCL net plugin "AWS Libfabric" ...
        "Plugin"
    } else {
        "Socket"
    })
}

/// What NCCL's proxy thread put on the network, and through which transport.
fn render_nccl_net(o: &mut String, r: &RankProfile, rows: &[(&String, &RoutineStats)]) {
    if rows.is_empty() && r.health.net_unposted == 0 {
        return;
    }
    let mut transports: Vec<&str> = rows.iter().filter_map(|(n, _)| net_transport(n)).collect();
    transports.dedup();
    let _ = writeln!(
        o,
        "NCCL network transport of rank {} (pid {}): NET/{}",
        r.rank,
        r.pid,
        if transports.is_empty() {
            "?".to_string()
        } else {
            transports.join(", NET/")
        }
    );
    let _ = writeln!(
        o,
        "Messages NCCL's proxy thread posted on the network (bytes as posted; times are \
         posting times)."
    );
    write_routine_table(o, ("Transport call", "time(sec)"), rows, true);
    if r.health.net_unposted > 0 {
        let _ = writeln!(
            o,
            "{} calls found the transport not ready (no request; NCCL calls again): not \
             counted as messages.",
            r.health.net_unposted
        );
    }
    let _ = writeln!(o);
}

/// A table of routines between rules: name, calls, average bytes, time; with `parents`,
/// each row followed by its calls per parent routine (libfabric's `called_from`).
fn write_routine_table(
    o: &mut String,
    (first, time): (&str, &str),
    rows: &[(&String, &RoutineStats)],
    parents: bool,
) {
    let line = "-----------------------------------------------------------------------";
    let row = |o: &mut String, name: &str, t: &Totals| {
        let _ = writeln!(
            o,
            "{:<28}{:>12}{:>16.1}{:>14.3}",
            name,
            t.calls,
            t.avg_bytes(),
            secs(t.time_ns)
        );
    };
    let _ = writeln!(o, "{line}");
    let _ = writeln!(
        o,
        "{:<28}{:>12}{:>16}{:>14}",
        first, "#calls", "avg. bytes", time
    );
    let _ = writeln!(o, "{line}");
    for (name, s) in rows {
        row(o, name, &s.totals);
        if parents {
            for (parent, t) in &s.called_from {
                row(o, &format!("  in {parent}"), t);
            }
        }
    }
    let _ = writeln!(o, "{line}");
}

/// A rank's libfabric operations, and what each MPI or NCCL call made of them.
pub fn render_fabric(r: &RankProfile) -> String {
    let mut o = String::new();
    let rows = table_order(&r.routines, Family::Fabric);
    let h = &r.health;
    if rows.is_empty()
        && h.fabric_internal + h.fabric_unresolved + h.fabric_undecoded == 0
        && r.fabrics.is_empty()
    {
        return o;
    }
    let _ = writeln!(
        o,
        "Transport operations (libfabric, UCX) of rank {} (pid {}):",
        r.rank, r.pid
    );
    // Which transport the MPI (or NCCL) calls went through, as the operations they made
    // show it.
    let beneath: Vec<&str> = crate::stats::transports_beneath(&r.routines)
        .map(|(_, library, _)| *library)
        .collect();
    if !beneath.is_empty() {
        let _ = writeln!(o, "MPI calls went through: {}", beneath.join(" and "));
    }
    if !r.fabrics.is_empty() {
        let opened: Vec<String> = r
            .fabrics
            .iter()
            .map(|f| format!("{} (fabric {})", f.provider, f.name))
            .collect();
        let _ = writeln!(o, "Provider: {}", opened.join(", "));
    }
    let _ = writeln!(
        o,
        "Times are posting times (entry to return of the provider's or UCX's function)."
    );
    write_routine_table(&mut o, ("Operation", "time(sec)"), &rows, true);
    // Which endpoints carried them.
    let mut endpoints: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, s) in &rows {
        for (ep, t) in &s.endpoints {
            endpoints
                .entry(ep.as_str())
                .or_default()
                .push(format!("{name} {}", t.calls));
        }
    }
    if !endpoints.is_empty() {
        let _ = writeln!(o, "Endpoints ({}):", endpoints.len());
        for (ep, ops) in &endpoints {
            let _ = writeln!(o, "  {ep}: {}", ops.join(", "));
        }
    }
    // The same, from the caller's side: what one MPI or NCCL call puts on the fabric.
    let mut per_call: BTreeMap<&str, Vec<(&str, &Totals)>> = BTreeMap::new();
    for (name, s) in &rows {
        for (parent, t) in &s.called_from {
            per_call
                .entry(parent.as_str())
                .or_default()
                .push((name.as_str(), t));
        }
    }
    for (parent, ops) in per_call {
        let calls = r.routines.get(parent).map_or(0, |p| p.totals.calls);
        if calls == 0 {
            continue;
        }
        let each: Vec<String> = ops
            .iter()
            .map(|(op, t)| {
                format!(
                    "{:.2} x {op} of {:.1} bytes",
                    t.calls as f64 / calls as f64,
                    t.avg_bytes()
                )
            })
            .collect();
        let _ = writeln!(o, "{parent} ({calls} calls), per call: {}", each.join(", "));
    }
    if h.fabric_internal + h.fabric_unresolved + h.fabric_failed > 0 {
        let _ = writeln!(
            o,
            "not counted as operations: {} calls libfabric made itself (a provider over \
             another, progress), {} on tables of unknown kind, {} refused (-FI_EAGAIN & co).",
            h.fabric_internal, h.fabric_unresolved, h.fabric_failed
        );
    }
    if h.fabric_undecoded > 0 {
        let _ = writeln!(
            o,
            "bytes unknown: {} operations (a UCX generic datatype: the MPI call that made \
             each has its bytes).",
            h.fabric_undecoded
        );
    }
    let _ = writeln!(o);
    o
}

/// The device-time table of NCCL operations, where the host waited for them.
fn render_device_time(o: &mut String, rows: &[(&String, &RoutineStats)]) {
    let measured: Vec<_> = rows
        .iter()
        .flat_map(|(name, s)| s.sizes.iter().map(move |b| (name, b)))
        .filter_map(|(name, b)| Some((name, b, b.device?)))
        .collect();
    if measured.is_empty() {
        let _ = writeln!(
            o,
            "No device time: no host wait for the GPU (cudaStreamSynchronize & co) followed \
             operations of one kind, so no bandwidth is reported."
        );
        let _ = writeln!(o);
        return;
    }
    let _ = writeln!(
        o,
        "Device time: from the enqueue to the return of the host's next wait for the GPU."
    );
    let _ = writeln!(
        o,
        "{:<20}{:>24}{:>10}{:>14}{:>13}{:>13}",
        "NCCL Operation", "size range (bytes)", "#ops", "time/op(us)", "algbw(GB/s)", "busbw(GB/s)"
    );
    for (name, b, d) in measured {
        let range = match (b.min_bytes, b.max_bytes) {
            (Some(lo), Some(hi)) => RangeLabel { lo, hi }.to_string(),
            _ => "undecoded".to_string(),
        };
        let gbps = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.2}"));
        let _ = writeln!(
            o,
            "{:<20}{:>24}{:>10}{:>14.1}{:>13}{:>13}",
            name,
            range,
            d.calls,
            d.avg_ns() / 1e3,
            gbps(d.algbw_gbps()),
            gbps(d.busbw_gbps())
        );
    }
    let _ = writeln!(o);
}

/// The job summary that mpitrace appends to rank 0's file.
/// Where a job's profile holds fewer ranks than its launcher said it has (one node's
/// report, or ranks not watched): how many, and where the rest are.
fn ranks_elsewhere(job: &JobProfile) -> Option<String> {
    let first = job.ranks.first()?;
    let size = first.world_size? as usize;
    let here = job.ranks.len();
    let one_job = job
        .ranks
        .iter()
        .all(|r| r.job == first.job && r.world_size == first.world_size);
    (one_job && here < size).then(|| {
        format!(
            "{here} of the job's {size} ranks are here: the others ran on other nodes, or \
             were not watched; an aggregator's report merges every node's"
        )
    })
}

fn render_summary(job: &JobProfile) -> String {
    let mut o = String::new();
    if job.ranks.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "-----------------------------------------------------------------"
    );
    let _ = writeln!(o, "Communication summary for all tasks:");
    if let Some(note) = ranks_elsewhere(job) {
        let _ = writeln!(o, "  ({note})");
    }
    let _ = writeln!(o);
    match job.comm_summary() {
        Some(s) => min_median_max(&mut o, &s),
        None => {
            let _ = writeln!(o, "  no MPI communication: {}", super::NO_MPI_COMMUNICATION);
        }
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "MPI timing summary for all ranks:");
    // mpitrace's columns in mpitrace's order (its readers count them), then the pid; "-"
    // where a rank's usage is not known.
    let _ = writeln!(
        o,
        "{:>8} {:<20} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "taskid",
        "hostname",
        "comm(s)",
        "elapsed(s)",
        "user(s)",
        "system(s)",
        "size(MB)",
        "switches",
        "pid"
    );
    for r in &job.ranks {
        let known = |f: &dyn Fn(&crate::profile::Usage) -> Option<String>| {
            r.usage.as_ref().and_then(f).unwrap_or_else(|| "-".into())
        };
        let _ = writeln!(
            o,
            "{:>8} {:<20} {:>10.2} {:>12.2} {:>10} {:>10} {:>10} {:>10} {:>10}",
            r.rank,
            r.host,
            secs(r.comm_time_ns),
            secs(r.elapsed_ns),
            known(&|u| Some(format!("{:.2}", secs(u.user_ns)))),
            known(&|u| Some(format!("{:.2}", secs(u.system_ns)))),
            known(&|u| Some(format!("{:.2}", mbytes(u.max_rss_bytes)))),
            known(&|u| u.context_switches.map(|n| n.to_string())),
            r.pid
        );
    }
    render_settings(&mut o, job);
    o
}

/// The communication libraries' settings the ranks' environment held: those every rank
/// had alike, then the names of those set differently (or not everywhere).
fn render_settings(o: &mut String, job: &JobProfile) {
    let (common, differing) = job.settings_alike_and_not();
    if common.is_empty() && differing.is_empty() {
        return;
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Settings of the communication libraries (the ranks' environment):"
    );
    for (k, v) in common {
        let _ = writeln!(o, "  {k}={v}");
    }
    if !differing.is_empty() {
        let _ = writeln!(
            o,
            "  set differently across ranks (JSON: each rank's settings): {}",
            differing.join(", ")
        );
    }
}

/// mpitrace's three lines: the ranks of least, median and most communication time.
fn min_median_max(o: &mut String, s: &CommSummary) {
    for (what, r) in [
        ("minimum", s.min),
        ("median ", s.median),
        ("maximum", s.max),
    ] {
        let _ = writeln!(
            o,
            "  {what} communication time = {:.3} sec for task {}",
            secs(r.comm_time_ns),
            r.rank
        );
    }
}

/// The ranks that run in containers: their pid inside, and the container (its id, as
/// `docker ps` shortens it, else its cgroup).
fn render_containers(o: &mut String, job: &JobProfile) {
    let contained: Vec<(&RankProfile, &crate::discover::container::Container)> = job
        .ranks
        .iter()
        .filter_map(|r| Some((r, r.container.as_deref()?)))
        .collect();
    if contained.is_empty() {
        return;
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "Ranks in containers:");
    let _ = writeln!(
        o,
        "{:>8} {:<20} {:>10} {:>10}  container",
        "taskid", "hostname", "pid", "pid inside"
    );
    for (r, c) in contained {
        let name = c.id.as_deref().map_or_else(
            || format!("cgroup {}", c.cgroup),
            |id| format!("{} ({})", id.get(..12).unwrap_or(id), c.cgroup),
        );
        let _ = writeln!(
            o,
            "{:>8} {:<20} {:>10} {:>10}  {name}",
            r.rank, r.host, r.pid, c.pid
        );
    }
}

/// The full text report: every rank's section, then the job summary and what was not measured.
pub fn render_text(whole: &JobProfile) -> String {
    let mut o = String::new();
    // Ranks that called MPI_Pcontrol are shown by their region, as mpitrace shows them;
    // per-peer traffic both ways, who-is-late over the whole run.
    let region = whole.profiled_region();
    let job = region.as_ref().unwrap_or(whole);
    let ctx = Context::of(job);
    let mut jobs: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &job.ranks {
        *jobs.entry(r.job.as_str()).or_default() += 1;
    }
    if jobs.len() > 1 {
        let list: Vec<String> = jobs
            .iter()
            .map(|(id, n)| format!("{id} ({n} rank{})", if *n == 1 { "" } else { "s" }))
            .collect();
        let _ = writeln!(
            o,
            "{} jobs in this report: {}; `--job ID` shows one.\n",
            jobs.len(),
            list.join(", ")
        );
    }
    for r in &job.ranks {
        let nccl = render_nccl(r);
        // A process that only calls NCCL or libfabric has no MPI table to show.
        let has = |family| !table_order(&r.routines, family).is_empty();
        if has(Family::Mpi) || (nccl.is_empty() && !has(Family::Fabric)) {
            o.push_str(&render_rank(job, &ctx, r));
        } else {
            // render_rank's own section, for the ranks it is not shown for.
            render_call_sites(&mut o, r);
        }
        if let Some(t) = &r.mpi_transport {
            // Not in the mpitrace-format files: mpitrace writes no such line.
            let _ = writeln!(o, "MPI transport of rank {} (pid {}): {t}\n", r.rank, r.pid);
        }
        o.push_str(&nccl);
        o.push_str(&render_fabric(r));
    }
    o.push_str(&render_summary(job));
    o.push_str(&super::endings::render_endings(whole));
    o.push_str(&super::endings::render_calls_in_progress(whole));
    render_job_sites(&mut o, job);
    render_containers(&mut o, job);
    o.push_str(&super::durations::render_durations(job));
    if let Some(region) = &region {
        o.push_str(&super::peers::render_peers(
            region,
            " within the profiled region (ranks that marked none: the whole run)",
        ));
    }
    o.push_str(&super::peers::render_peers(whole, ""));
    if let Some(skew) = &whole.skew {
        o.push_str(&super::skew::render_text(skew));
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "events dropped: {}   calls with undecodable bytes: {}",
        job.dropped, job.undecoded
    );
    for l in &job.libraries {
        let how = if l.uprobe_sessions {
            ", through uprobe sessions"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "probed {} ({}): {} routines{how}",
            l.path, l.flavor, l.probes
        );
        if !l.moved_past_single_step.is_empty() {
            let _ = writeln!(
                o,
                "  moved past a single-stepped first instruction: {}",
                l.moved_past_single_step.join(", ")
            );
        }
        if !l.single_stepped.is_empty() {
            let _ = writeln!(
                o,
                "  single-stepped (dearer) probes: {}",
                l.single_stepped.join(", ")
            );
        }
        for f in &l.failed {
            let _ = writeln!(o, "  failed: {f}");
        }
    }
    for u in &job.unsupported_libraries {
        let _ = writeln!(o, "not probed: {u}");
    }
    for n in &job.not_profiled {
        let _ = writeln!(o, "not profiled: {n}");
    }
    if job.ranks.is_empty() {
        let _ = writeln!(
            o,
            "no MPI, NCCL, libfabric or UCX calls were seen: {}",
            nothing_seen(job)
        );
    }
    o
}

/// What a rank's times span: mpitrace's "MPI_Init() to MPI_Finalize()" where commtap saw
/// both, else from its attach, and to its exit or the report (a detach, or a daemon's
/// snapshot of a process that runs on).
fn watched_span(r: &RankProfile) -> &'static str {
    let seen = |names: &[&str]| names.iter().any(|n| r.routines.contains_key(*n));
    let from_init = seen(&["MPI_Init", "MPI_Init_thread"]);
    let to_finalize = seen(&["MPI_Finalize"]);
    if r.detached && !to_finalize {
        return if from_init {
            "MPI_Init() to commtap's detach"
        } else {
            "commtap's attach (mid-run) to its detach"
        };
    }
    match (from_init, to_finalize, r.exited) {
        (true, true, _) => "MPI_Init() to MPI_Finalize()",
        (true, false, true) => "MPI_Init() to the process's exit",
        (true, false, false) => "MPI_Init() to this report (the process still ran)",
        (false, true, _) => "commtap's attach (mid-run) to MPI_Finalize()",
        (false, false, true) => "commtap's attach (mid-run) to the process's exit",
        (false, false, false) => {
            "commtap's attach (mid-run) to this report (the process still ran)"
        }
    }
}

/// Why a job has no ranks: whether the libraries looked for (MPI, NCCL, libfabric, UCX)
/// were found and never called, found and refused (the report lists each with its reason),
/// or not mapped at all.
pub fn nothing_seen(job: &JobProfile) -> &'static str {
    if !job.libraries.is_empty() {
        "the libraries probed were never called while watched"
    } else if !job.unsupported_libraries.is_empty() {
        "the libraries found could not be probed (the report says why)"
    } else {
        "no process mapped an MPI, NCCL, libfabric or UCX library (libmpi, libmpich, \
         libmpi_abi, libnccl, librccl, libfabric, libucp) while watched"
    }
}

/// Writes `mpi_profile.<job>.<rank>` for every rank into `dir` (created if needed), rank
/// 0's file ending with the job summary, as mpitrace does. A job id is made safe for a
/// file name first (see [`file_name_part`]); a rank whose file cannot be written does not
/// stop the others: every failure is in the error, after all were tried.
pub fn write_mpitrace_dir(whole: &JobProfile, dir: &Path) -> io::Result<Vec<std::path::PathBuf>> {
    if whole.ranks.is_empty() {
        // Nothing to write: no directory left behind either.
        return Ok(Vec::new());
    }
    fs::create_dir_all(dir)?;
    let region = whole.profiled_region();
    let job = region.as_ref().unwrap_or(whole);
    let mut written = Vec::new();
    let mut failed = Vec::new();
    let ctx = Context::of(job);
    for r in &job.ranks {
        let mut text = render_rank(job, &ctx, r);
        if r.rank == 0 {
            text.push_str(&render_summary(job));
        }
        let path = dir.join(format!("mpi_profile.{}.{}", file_name_part(&r.job), r.rank));
        match super::write_file(&path, text.as_bytes()) {
            Ok(()) => written.push(path),
            Err(e) => failed.push(format!("{}: {e}", path.display())),
        }
    }
    if !failed.is_empty() {
        return Err(io::Error::other(format!(
            "{} of {} files not written: {}",
            failed.len(),
            job.ranks.len(),
            failed.join("; ")
        )));
    }
    Ok(written)
}

/// `id` (a job id, which comes from a process's environment) as part of a file name:
/// letters, digits, `.`, `-` and `_` kept, anything else (`/`, NUL, spaces) as `_`, at most
/// 64 characters, and never `.` or `..`.
pub fn file_name_part(id: &str) -> String {
    let safe: String = id
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match safe.as_str() {
        "" | "." | ".." => format!("_{safe}"),
        _ => safe,
    }
}

#[cfg(test)]
mod file_name_tests {
    use super::file_name_part;

    #[test]
    fn job_ids_become_safe_file_names() {
        assert_eq!(file_name_part("12345"), "12345");
        assert_eq!(file_name_part("job.7_a-b"), "job.7_a-b");
        assert_eq!(file_name_part("../../etc/passwd"), ".._.._etc_passwd");
        assert_eq!(file_name_part(".."), "_..");
        assert_eq!(file_name_part(""), "_");
        assert_eq!(file_name_part("a b\u{1b}[31m"), "a_b__31m");
        assert_eq!(file_name_part(&"x".repeat(100)).len(), 64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job's text has each rank's call sites and, for several ranks, one table of them
    /// all: a site the ranks share is one row with its calls summed, its time marked where
    /// sampled.
    #[test]
    fn the_text_has_each_ranks_call_sites_and_the_jobs() {
        let rank = |n: u32, address: &str| {
            let mut r = crate::api::convert::tests::sample().ranks[0].clone();
            r.rank = n;
            r.pid = 100 + n;
            r.region = None;
            r.call_sites[0].address = address.into();
            r
        };
        let job = JobProfile::of_ranks(vec![rank(0, "0x55401136"), rank(1, "0x56401136")]);
        let text = render_text(&job);
        let own = text
            .lines()
            .filter(|l| {
                l.starts_with("MPI_Allreduce") && l.ends_with("negotiate+0x1c at app.c:31 (app)")
            })
            .count();
        // Each rank's row, and the job's.
        assert_eq!(own, 3, "{text}");
        let job_row = text
            .split("Call sites of all ranks")
            .nth(1)
            .and_then(|t| t.lines().find(|l| l.starts_with("MPI_Allreduce")))
            .unwrap_or_else(|| panic!("no job-wide call sites in\n{text}"));
        let cols: Vec<&str> = job_row.split_whitespace().collect();
        assert_eq!(
            cols[..5],
            ["MPI_Allreduce", "2", "80", "8.0", "0.000*"],
            "{job_row}"
        );
    }

    /// Two ranks of a job whose launcher said `world` ranks.
    fn two_ranks(world: u32) -> JobProfile {
        let rank = |rank: u32, comm_ns: u64| -> RankProfile {
            let mut r: RankProfile = serde_json::from_value(serde_json::json!({
                "rank": rank, "rank_known": true, "world_size": world, "pid": 100 + rank,
                "host": "n1", "job": "7", "cmdline": "./app", "start_ticks": 1,
                "elapsed_ns": 1_000_000_000u64, "comm_time_ns": comm_ns, "routines": {},
            }))
            .expect("a rank profile");
            let send = crate::stats::RoutineStats {
                totals: crate::stats::Totals {
                    calls: 1,
                    bytes: 8,
                    time_ns: comm_ns,
                },
                ..Default::default()
            };
            r.routines.insert("MPI_Send".into(), send);
            r
        };
        JobProfile::of_ranks(vec![rank(0, 1_000), rank(1, 2_000)])
    }

    /// What each rank used and the settings they had, as the job summary shows them: a
    /// rank whose usage is not known has `-` in mpitrace's columns; a setting alike on
    /// every rank is shown with its value, one set differently by its name alone.
    #[test]
    fn the_summary_shows_usage_and_settings() {
        let mut job = two_ranks(2);
        job.ranks[1].usage = Some(crate::profile::Usage {
            user_ns: 1_500_000_000,
            system_ns: 250_000_000,
            max_rss_bytes: 64 << 20,
            context_switches: Some(1234),
            at_exit: true,
        });
        for (r, algo) in job.ranks.iter_mut().zip(["Ring", "Tree"]) {
            r.settings.insert("NCCL_DEBUG".into(), "WARN".into());
            r.settings.insert("NCCL_ALGO".into(), algo.into());
        }
        let text = render_summary(&job);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("taskid"))
            .skip(1)
            .take(2)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0][4..], ["-", "-", "-", "-", "100"], "{text}");
        assert_eq!(
            rows[1][4..],
            ["1.50", "0.25", "64.00", "1234", "101"],
            "{text}"
        );
        assert!(
            text.contains("  NCCL_DEBUG=WARN\n")
                && text.contains(
                    "set differently across ranks (JSON: each rank's settings): NCCL_ALGO\n"
                )
                && !text.contains("NCCL_ALGO="),
            "{text}"
        );
        let rank0 = render_rank(&job, &Context::of(&job), &job.ranks[0]);
        assert!(
            rank0.contains("Rank 1 reported the largest memory utilization : 64.00 MBytes")
                && !rank0.contains("user cpu time"),
            "{rank0}"
        );
    }

    /// The kernel's sums at a process's end, split as getrusage splits them.
    #[test]
    fn usage_at_exit_splits_the_cpu_time_as_the_ticks_did() {
        let mut ps = collector_common::ProcStats {
            exit_cpu_ns: 1_000_000_000,
            exit_utime_ns: 300_000_000,
            exit_stime_ns: 100_000_000,
            exit_nvcsw: 7,
            exit_nivcsw: 3,
            exit_max_rss_pages: 256,
            exit_threads: 4,
            ..Default::default()
        };
        assert_eq!(
            crate::profile::Usage::at_exit(&ps, 4096),
            None,
            "not ended yet"
        );
        ps.exit_group = 1;
        assert_eq!(
            crate::profile::Usage::at_exit(&ps, 4096),
            Some(crate::profile::Usage {
                user_ns: 750_000_000,
                system_ns: 250_000_000,
                max_rss_bytes: 1 << 20,
                context_switches: Some(10),
                at_exit: true,
            })
        );
    }

    /// `--mpitrace-dir` of a run that profiled nothing leaves no directory behind.
    #[test]
    fn a_profile_of_no_rank_makes_no_directory() {
        let dir = std::env::temp_dir().join(format!("commtap-mpitrace-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let files = write_mpitrace_dir(&JobProfile::of_ranks(vec![]), &dir.join("out"));
        assert_eq!(
            files.expect("nothing to write"),
            Vec::<std::path::PathBuf>::new()
        );
        assert!(!dir.exists(), "no directory made");
        let files = write_mpitrace_dir(&two_ranks(2), &dir.join("out")).expect("written");
        assert_eq!(files.len(), 2);
        fs::remove_dir_all(&dir).expect("cleaned");
    }

    /// A rank is "of" as many ranks as its launcher said; a report holding fewer says how
    /// many are here and that the minimum and maximum are of those.
    #[test]
    fn a_report_of_some_ranks_of_a_job_says_so() {
        let part = render_text(&two_ranks(4));
        assert!(part.contains("Data for MPI rank 0 of 4:"), "{part}");
        assert!(
            part.contains(
                "MPI task 0 of 4 had the minimum communication time of the 2 rank(s) here."
            ),
            "{part}"
        );
        assert!(part.contains("(2 of the job's 4 ranks are here"), "{part}");
        let whole = render_text(&two_ranks(2));
        assert!(whole.contains("Data for MPI rank 1 of 2:"), "{whole}");
        assert!(
            whole.contains("MPI task 1 of 2 had the maximum communication time."),
            "{whole}"
        );
        assert!(!whole.contains("are here"), "{whole}");
    }
}
