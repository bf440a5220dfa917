//! Prometheus text exposition of a node's profile.
//!
//! Label cardinality stays bounded: job, rank, routine and size bucket (mpitrace's bins),
//! never raw sizes, peers, pids or NCCL communicator ids.

use std::fmt::Write as _;

use collector_common::{
    buckets::RangeLabel,
    routines::{routine_id, Family},
    ROUTINES,
};

use crate::profile::{JobProfile, RankProfile};

/// Metric families in the text format, written one family at a time.
#[derive(Default)]
struct Exposition(String);

impl Exposition {
    /// Writes the family `name` of `kind` (`counter`, `gauge`): its help and its series
    /// (each a label set and a value).
    fn family(&mut self, name: &str, kind: &str, help: &str, lines: Vec<String>) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
        for l in lines {
            let _ = writeln!(self.0, "{name}{l}");
        }
    }
}

/// Lines of the per-routine families of one routine family (MPI, NCCL or libfabric).
#[derive(Default)]
struct RoutineLines {
    calls: Vec<String>,
    bytes: Vec<String>,
    seconds: Vec<String>,
    size_calls: Vec<String>,
    size_bytes: Vec<String>,
    /// A histogram's `_bucket`, `_sum` and `_count` lines together.
    durations: Vec<String>,
}

/// A profile's series, gathered per family before they are written.
#[derive(Default)]
struct Series {
    mpi: RoutineLines,
    nccl: RoutineLines,
    fabric: RoutineLines,
    /// NCCL device time: operations, bytes, seconds, bus bytes.
    device: [Vec<String>; 4],
    providers: Vec<String>,
    /// Each rank's MPI transport, as its MPI says it.
    transports: Vec<String>,
    /// The call each rank has been inside for a second or more.
    in_call: Vec<String>,
    /// Health: dropped, undecoded, nested, in flight at attach, abandoned.
    health: [Vec<String>; 5],
    /// What each rank used of its node: CPU seconds (user, system), largest resident set,
    /// context switches.
    usage: [Vec<String>; 3],
}

impl Series {
    fn of(profile: &JobProfile) -> Series {
        let mut s = Series::default();
        for r in &profile.ranks {
            s.add_rank(r);
        }
        s
    }

    fn add_rank(&mut self, r: &RankProfile) {
        let base = format!("job_id=\"{}\",rank=\"{}\"", escape(&r.job), r.rank);
        for (routine, st) in &r.routines {
            let lines = match routine_id(routine).map(|id| ROUTINES[id as usize].family()) {
                Some(Family::Nccl | Family::Cuda) => &mut self.nccl,
                Some(Family::Fabric) => &mut self.fabric,
                _ => &mut self.mpi,
            };
            let l = format!("{{{base},routine=\"{}\"}}", escape(routine));
            lines.calls.push(format!("{l} {}", st.totals.calls));
            lines.bytes.push(format!("{l} {}", st.totals.bytes));
            lines
                .seconds
                .push(format!("{l} {}", st.totals.time_ns as f64 / 1e9));
            if let Some(d) = &st.durations {
                duration_histogram(&mut lines.durations, &base, routine, d, st.timed_time_ns());
            }
            for b in &st.sizes {
                let size = match b.bucket {
                    Some(k) => RangeLabel::of_bucket(k).to_string(),
                    None => "undecoded".to_string(),
                };
                let l = format!("{{{base},routine=\"{}\",size=\"{size}\"}}", escape(routine));
                lines.size_calls.push(format!("{l} {}", b.totals.calls));
                lines.size_bytes.push(format!("{l} {}", b.totals.bytes));
                if let Some(d) = b.device {
                    self.device[0].push(format!("{l} {}", d.calls));
                    self.device[1].push(format!("{l} {}", d.bytes));
                    self.device[2].push(format!("{l} {}", d.time_ns as f64 / 1e9));
                    if let Some(bus) = d.bus_bytes {
                        self.device[3].push(format!("{l} {bus}"));
                    }
                }
            }
        }
        let l = format!("{{{base}}}");
        let h = &r.health;
        for (lines, v) in self.health.iter_mut().zip([
            h.dropped,
            h.undecoded,
            h.nested,
            h.in_flight_at_attach,
            h.abandoned,
        ]) {
            lines.push(format!("{l} {v}"));
        }
        if let Some(u) = &r.usage {
            for (mode, ns) in [("user", u.user_ns), ("system", u.system_ns)] {
                self.usage[0].push(format!("{{{base},mode=\"{mode}\"}} {}", ns as f64 / 1e9));
            }
            self.usage[1].push(format!("{l} {}", u.max_rss_bytes));
            if let Some(n) = u.context_switches {
                self.usage[2].push(format!("{l} {n}"));
            }
        }
        if let Some(c) = r.long_call() {
            self.in_call.push(format!(
                "{{{base},routine=\"{}\"}} {}",
                escape(&c.routine),
                c.for_ns as f64 / 1e9
            ));
        }
        if let Some(t) = &r.mpi_transport {
            self.transports
                .push(format!("{{{base},transport=\"{}\"}} 1", escape(t)));
        }
        for f in &r.fabrics {
            self.providers.push(format!(
                "{{{base},provider=\"{}\",fabric=\"{}\"}} 1",
                escape(&f.provider),
                escape(&f.name)
            ));
        }
    }

    /// The per-routine families of MPI, NCCL and libfabric.
    fn write_routines(&mut self, o: &mut Exposition) {
        for (prefix, what, time, lines) in [
            (
                "commtap_mpi",
                "MPI calls",
                "time_seconds_total",
                std::mem::take(&mut self.mpi),
            ),
            (
                "commtap_nccl",
                "NCCL operations and host waits for the GPU",
                "enqueue_seconds_total",
                std::mem::take(&mut self.nccl),
            ),
            (
                "commtap_fabric",
                "libfabric operations",
                "post_seconds_total",
                std::mem::take(&mut self.fabric),
            ),
        ] {
            o.family(
                &format!("{prefix}_calls_total"),
                "counter",
                &format!("{what} completed, per job, rank and routine."),
                lines.calls,
            );
            o.family(
                &format!("{prefix}_bytes_total"),
                "counter",
                &format!("Bytes of {what} (mpitrace's / nccl-tests' conventions)."),
                lines.bytes,
            );
            o.family(
                &format!("{prefix}_{time}"),
                "counter",
                &format!("Host time inside {what} (NCCL: enqueue time), per routine."),
                lines.seconds,
            );
            o.family(
                &format!("{prefix}_call_duration_seconds"),
                "histogram",
                &format!("Durations of {what}, per routine (the kernel's log2 buckets)."),
                lines.durations,
            );
            o.family(
                &format!("{prefix}_size_calls_total"),
                "counter",
                &format!("{what} per message-size bucket (mpitrace's bins)."),
                lines.size_calls,
            );
            o.family(
                &format!("{prefix}_size_bytes_total"),
                "counter",
                &format!("Bytes of {what} per message-size bucket (mpitrace's bins)."),
                lines.size_bytes,
            );
        }
    }

    /// NCCL device time, the health counters, what ranks used, libfabric providers and
    /// MPI transports.
    fn write_device_and_health(self, o: &mut Exposition) {
        let [cpu, rss, switches] = self.usage;
        o.family(
            "commtap_rank_cpu_seconds_total",
            "counter",
            "CPU time of the rank's threads, by mode (user, system), as getrusage sums it.",
            cpu,
        );
        o.family(
            "commtap_rank_max_resident_bytes",
            "gauge",
            "The rank's largest resident set so far.",
            rss,
        );
        o.family(
            "commtap_rank_context_switches_total",
            "counter",
            "Context switches of the rank's threads, voluntary and involuntary.",
            switches,
        );
        let [ops, dev_bytes, dev_seconds, bus] = self.device;
        let [dropped, undecoded, nested, in_flight, abandoned] = self.health;
        let (providers, transports, in_call) = (self.providers, self.transports, self.in_call);
        o.family(
            "commtap_rank_in_call_seconds",
            "gauge",
            "How long the rank has been inside its MPI or NCCL call in progress, by routine: \
             only calls of a second or more (a hung job's ranks stay in one).",
            in_call,
        );
        o.family(
            "commtap_nccl_device_ops_total",
            "counter",
            "NCCL operations with device time (a host wait for the GPU followed them).",
            ops,
        );
        o.family(
            "commtap_nccl_device_bytes_total",
            "counter",
            "Bytes of the NCCL operations with device time (rate over device seconds: algbw).",
            dev_bytes,
        );
        o.family(
            "commtap_nccl_device_seconds_total",
            "counter",
            "Device time of NCCL operations: enqueue to the return of the host's wait.",
            dev_seconds,
        );
        o.family(
            "commtap_nccl_device_bus_bytes_total",
            "counter",
            "Bytes x nccl-tests' bus factor (rate over device seconds: busbw).",
            bus,
        );
        o.family(
            "commtap_events_dropped_total",
            "counter",
            "Call events lost to a full ring buffer (counts stay exact).",
            dropped,
        );
        o.family(
            "commtap_undecoded_calls_total",
            "counter",
            "Calls whose bytes could not be decoded.",
            undecoded,
        );
        o.family(
            "commtap_nested_calls_total",
            "counter",
            "MPI calls made inside another MPI call (counted once).",
            nested,
        );
        o.family(
            "commtap_in_flight_at_attach_total",
            "counter",
            "Calls already running when probes attached (not counted).",
            in_flight,
        );
        o.family(
            "commtap_abandoned_calls_total",
            "counter",
            "Calls left without returning (a longjmp or exception out of an error handler; not counted).",
            abandoned,
        );
        o.family(
            "commtap_fabric_provider_info",
            "gauge",
            "libfabric fabrics a rank opened (fi_fabric), by provider (tcp;ofi_rxm) and fabric.",
            providers,
        );
        o.family(
            "commtap_mpi_transport_info",
            "gauge",
            "The transport a rank's MPI says it uses (Open MPI: pml ob1; MPICH: ch4:ofi).",
            transports,
        );
    }
}

/// The `le` bounds of the duration histograms, as powers of two nanoseconds: every other
/// kernel bucket boundary from 1 us to 69 s keeps a routine's series at 16.
const DURATION_LE_LOG2: std::ops::RangeInclusive<u32> = 10..=36;

/// Appends the Prometheus histogram lines (suffix, labels, value) of one routine's
/// durations: cumulative `_bucket`s, `_sum` and `_count`, of the calls timed (`time_ns`
/// theirs: where time is sampled, `_sum / _count` is their mean).
fn duration_histogram(
    out: &mut Vec<String>,
    base: &str,
    routine: &str,
    d: &crate::stats::Durations,
    time_ns: u64,
) {
    let l = format!("{base},routine=\"{}\"", escape(routine));
    for log2 in DURATION_LE_LOG2.step_by(2) {
        // Kernel bucket b (b >= 1) ends at 2^(b + 8) ns; bucket 0 at 2^9.
        let last = (log2 - 9) as usize;
        let below: u64 = (0..=last).map(|b| d.calls_in(b)).sum();
        let le = (1u64 << log2) as f64 / 1e9;
        out.push(format!("_bucket{{{l},le=\"{le}\"}} {below}"));
    }
    out.push(format!("_bucket{{{l},le=\"+Inf\"}} {}", d.timed()));
    out.push(format!("_sum{{{l}}} {}", time_ns as f64 / 1e9));
    out.push(format!("_count{{{l}}} {}", d.timed()));
}

/// The probe programs' runs and run time (the daemon's `--probe-stats`): what commtap
/// costs the node's processes, per program (labels bounded: a dozen programs).
pub fn render_programs(programs: &[crate::attach::ProgramStats]) -> String {
    let mut o = Exposition::default();
    let line = |p: &crate::attach::ProgramStats, v: String| {
        format!("{{program=\"{}\"}} {v}", escape(&p.name))
    };
    o.family(
        "commtap_probe_program_runs_total",
        "counter",
        "Runs of each probe program (a uprobe session's program runs at entry and at the returns it asks for).",
        programs.iter().map(|p| line(p, p.runs.to_string())).collect(),
    );
    o.family(
        "commtap_probe_program_seconds_total",
        "counter",
        "Time inside each probe program (the kernel's BPF run-time statistics).",
        programs
            .iter()
            .map(|p| line(p, (p.run_ns as f64 / 1e9).to_string()))
            .collect(),
    );
    o.0
}

/// Renders the Prometheus text format for `profile`, plus the daemon's own health.
pub fn render(
    profile: &JobProfile,
    live: usize,
    exited: usize,
    libraries: usize,
    attach_failures: usize,
) -> String {
    let mut o = Exposition::default();
    let mut series = Series::of(profile);
    series.write_routines(&mut o);
    series.write_device_and_health(&mut o);
    o.family(
        "commtap_processes",
        "gauge",
        "MPI processes the daemon knows, by state.",
        vec![
            format!("{{state=\"live\"}} {live}"),
            format!("{{state=\"exited\"}} {exited}"),
        ],
    );
    o.family(
        "commtap_probed_libraries",
        "gauge",
        "MPI libraries with probes attached.",
        vec![format!(" {libraries}")],
    );
    o.family(
        "commtap_probe_attach_failures",
        "gauge",
        "Probe links that could not be attached.",
        vec![format!(" {attach_failures}")],
    );
    o.family(
        "commtap_memory_reads_not_made_total",
        "counter",
        "Reads of processes' memory given up (a page of a file system that did not answer) \
         or refused meanwhile: what needed them (Open MPI's components, the call a thread \
         was in when attached) is unknown.",
        vec![format!(
            " {}",
            crate::discover::process_memory::reads_not_made()
        )],
    );
    o.0
}

/// Who-is-late series of every job, gathered per family before they are written.
#[derive(Default)]
struct LateSeries {
    /// Per rank: instances, last, caused seconds, waited seconds.
    lines: [Vec<String>; 4],
    /// Per rank and routine: last, caused seconds, waited seconds.
    per_routine: [Vec<String>; 3],
    /// Per rank: the highest instance number reached.
    seq: Vec<String>,
}

impl LateSeries {
    fn add(&mut self, job: &str, skew: &crate::skew::SkewReport) {
        for r in &skew.ranks {
            let l = format!("{{job_id=\"{}\",rank=\"{}\"}}", escape(job), r.rank);
            self.lines[0].push(format!("{l} {}", r.instances));
            self.lines[1].push(format!("{l} {}", r.last));
            self.lines[2].push(format!("{l} {}", r.caused_ns as f64 / 1e9));
            self.lines[3].push(format!("{l} {}", r.waited_ns as f64 / 1e9));
            if let Some(s) = r.seq {
                self.seq.push(format!("{l} {s}"));
            }
            for x in &r.routines {
                let l = format!(
                    "{{job_id=\"{}\",rank=\"{}\",routine=\"{}\"}}",
                    escape(job),
                    r.rank,
                    escape(&x.routine)
                );
                self.per_routine[0].push(format!("{l} {}", x.last));
                self.per_routine[1].push(format!("{l} {}", x.caused_ns as f64 / 1e9));
                self.per_routine[2].push(format!("{l} {}", x.waited_ns as f64 / 1e9));
            }
        }
    }
}

/// Who is late, per job and rank (and routine): the instances the others waited for each rank at,
/// the time it made the others wait and the time it waited, and the highest instance
/// number it reached (labels bounded: no communicators, no instance numbers).
pub fn render_skew(profile: &JobProfile, board: &crate::skew::Board) -> String {
    let mut jobs: std::collections::BTreeMap<&str, Vec<&crate::profile::RankProfile>> =
        Default::default();
    for r in &profile.ranks {
        jobs.entry(r.job.as_str()).or_default().push(r);
    }
    let mut series = LateSeries::default();
    for (job, ranks) in jobs {
        let procs: Vec<_> = ranks.iter().map(|r| (r.pid, r.start_ticks)).collect();
        let whois = |pid: u32| {
            let r = ranks.iter().find(|r| r.pid == pid)?;
            Some((r.rank, r.host.clone()))
        };
        if let Some(skew) = board.report_for(&procs, &whois) {
            series.add(job, &skew);
        }
    }
    let LateSeries {
        lines,
        per_routine,
        seq,
    } = series;
    let mut o = Exposition::default();
    let families = [
        (
            "commtap_late_instances_total",
            "Collective instances the rank was matched in with every other member.",
        ),
        (
            "commtap_late_last_total",
            "Collective instances at which the others waited for the rank.",
        ),
        (
            "commtap_late_caused_seconds_total",
            "Time the other members waited for the rank (skews of the instances it was last at).",
        ),
        (
            "commtap_late_waited_seconds_total",
            "Time the rank waited inside collectives for the last member to arrive.",
        ),
    ];
    for ((name, help), lines) in families.into_iter().zip(lines) {
        o.family(name, "counter", help, lines);
    }
    let routine_families = [
        (
            "commtap_late_routine_last_total",
            "Instances of the routine at which the others waited for the rank.",
        ),
        (
            "commtap_late_routine_caused_seconds_total",
            "Time the other members of the routine's instances waited for the rank.",
        ),
        (
            "commtap_late_routine_waited_seconds_total",
            "Time the rank waited inside the routine for the last member to arrive.",
        ),
    ];
    for ((name, help), lines) in routine_families.into_iter().zip(per_routine) {
        o.family(name, "counter", help, lines);
    }
    o.family(
        "commtap_late_seq",
        "gauge",
        "The highest collective instance number the rank entered: in a hung job, the ranks \
         blocked in a collective show its number, the rank they wait for a lower one.",
        seq,
    );
    o.0
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_well_formed() {
        let text = render(
            &JobProfile {
                schema: String::new(),
                job: String::new(),
                ranks: vec![],
                dropped: 0,
                undecoded: 0,
                libraries: vec![],
                unsupported_libraries: vec![],
                not_profiled: vec![],
                call_events: false,
                skew: None,
                timeline: None,
            },
            1,
            2,
            3,
            0,
        );
        assert!(text.contains("# TYPE commtap_mpi_calls_total counter"));
        assert!(text.contains("commtap_processes{state=\"exited\"} 2"));
        assert!(text.contains("commtap_probed_libraries 3"));
        assert!(text.contains("# TYPE commtap_memory_reads_not_made_total counter"));
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }

    #[test]
    fn fabric_providers_are_an_info_gauge() {
        let text = render(&crate::api::convert::tests::sample(), 1, 0, 1, 0);
        assert!(text.contains(
            "commtap_fabric_provider_info{job_id=\"42\",rank=\"0\",provider=\"tcp;ofi_rxm\",fabric=\"10.0.0.0/8\"} 1\n"
        ), "{text}");
    }

    #[test]
    fn what_a_rank_used_is_a_family_each() {
        let mut profile = crate::api::convert::tests::sample();
        profile.ranks[0].usage = Some(crate::profile::Usage {
            user_ns: 1_500_000_000,
            system_ns: 250_000_000,
            max_rss_bytes: 64 << 20,
            context_switches: Some(1234),
            at_exit: true,
        });
        let text = render(&profile, 1, 0, 1, 0);
        let base = "job_id=\"42\",rank=\"0\"";
        for line in [
            format!("commtap_rank_cpu_seconds_total{{{base},mode=\"user\"}} 1.5\n"),
            format!("commtap_rank_cpu_seconds_total{{{base},mode=\"system\"}} 0.25\n"),
            format!("commtap_rank_max_resident_bytes{{{base}}} 67108864\n"),
            format!("commtap_rank_context_switches_total{{{base}}} 1234\n"),
            "# TYPE commtap_rank_max_resident_bytes gauge\n".to_string(),
        ] {
            assert!(text.contains(&line), "{line}in\n{text}");
        }
    }

    #[test]
    fn a_long_call_in_progress_is_a_gauge() {
        let mut profile = crate::api::convert::tests::sample();
        let text = render(&profile, 1, 0, 1, 0);
        assert!(
            text.contains(
                "commtap_rank_in_call_seconds{job_id=\"42\",rank=\"0\",routine=\"MPI_Allreduce\"} 7\n"
            ),
            "{text}"
        );
        // A call of microseconds: a job at work, no series.
        profile.ranks[0].in_call.as_mut().expect("a call").for_ns = 5_000;
        let text = render(&profile, 1, 0, 1, 0);
        assert!(!text.contains("commtap_rank_in_call_seconds{"), "{text}");
    }

    #[test]
    fn mpi_transports_are_an_info_gauge() {
        let text = render(&crate::api::convert::tests::sample(), 1, 0, 1, 0);
        assert!(
            text.contains(
                "commtap_mpi_transport_info{job_id=\"42\",rank=\"0\",transport=\"pml cm, mtl ofi\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn nccl_operations_have_their_own_families() {
        let text = render(&crate::api::convert::tests::sample(), 1, 0, 1, 0);
        let base = "job_id=\"42\",rank=\"0\"";
        assert!(text.contains(&format!(
            "commtap_nccl_calls_total{{{base},routine=\"ncclAllReduce\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "commtap_mpi_calls_total{{{base},routine=\"MPI_Allreduce\"}} 10\n"
        )));
        assert!(!text.contains(
            "commtap_mpi_calls_total{job_id=\"42\",rank=\"0\",routine=\"ncclAllReduce\"}"
        ));
        // Cumulative: 4 calls under 512 ns, 6 in [2048, 4096) ns.
        let h = "commtap_mpi_call_duration_seconds";
        let l = format!("{base},routine=\"MPI_Allreduce\"");
        // Its time sampled: 6 of its 10 calls timed, 1 under 512 ns, 5 in [2048, 4096) ns;
        // the sum is theirs (100 ns measured; the estimate for all 10 is 167 ns).
        for (le, n) in [("0.000001024", 1), ("0.000004096", 6), ("+Inf", 6)] {
            let line = format!("{h}_bucket{{{l},le=\"{le}\"}} {n}\n");
            assert!(text.contains(&line), "{line}in\n{text}");
        }
        assert!(text.contains(&format!("{h}_count{{{l}}} 6\n")));
        assert!(
            text.contains(&format!("{h}_sum{{{l}}} 0.0000001\n")),
            "{text}"
        );
        assert!(text.contains(&format!("# TYPE {h} histogram\n")));
        let (lo, hi) = collector_common::buckets::bucket_range(12);
        // 8192 bytes on 2 ranks: AllReduce's factor 2(n-1)/n is 1.
        assert!(text.contains(&format!(
            "commtap_nccl_device_bus_bytes_total{{{base},routine=\"ncclAllReduce\",size=\"{lo}-{hi}\"}} 8192\n"
        )));
    }
}
