//! The one-file HTML report: the job summary and mpitrace's tables as HTML, and the figures
//! people otherwise draw by hand (message sizes, ranks' communication time, NCCL bus
//! bandwidth against nccl-tests, who is late, call durations, the peer matrix, libfabric
//! under MPI) as inline SVG. No script, no external resource: it is read on laptops,
//! attached to tickets and kept with job logs, with JavaScript off and no network.
//! Every string from the profile is escaped: profiles come from daemons, and command
//! lines and host names from the processes they watched.

mod charts;
mod figures;

use std::fmt::Write as _;

use collector_common::routines::Family;

use crate::{
    compare::Curve,
    profile::JobProfile,
    report::units::secs,
    stats::{table_order, Routines},
};

/// Ranks up to which the text report (every rank's section) is embedded in the page.
const TEXT_RANKS: usize = 64;

/// An nccl-tests table drawn as the expected curve of one NCCL routine.
#[derive(Clone, Debug)]
pub struct Expected {
    /// The NCCL routine it describes (`ncclAllReduce`).
    pub op: String,
    /// Out-of-place bus bandwidth per size bucket, GB/s.
    pub curve: Curve,
    /// Fraction of the expected bandwidth below which a measured bucket is marked.
    pub threshold: f64,
    /// Where it came from (the file name), for the caption.
    pub source: String,
}

/// `s` safe in HTML text and attribute values.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Every rank's routines added together, per family in the routine table's order.
fn job_routines(job: &JobProfile) -> Routines {
    let mut all = Routines::new();
    for r in &job.ranks {
        for (name, s) in &r.routines {
            all.entry(name.clone()).or_default().merge(s);
        }
    }
    all
}

/// The page.
pub fn render_html(job: &JobProfile, expected: Option<&Expected>) -> String {
    let routines = job_routines(job);
    let title = if job.job.is_empty() {
        "commtap profile".to_string()
    } else {
        format!("commtap profile of job {}", job.job)
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <meta name=\"generator\" content=\"commtap {}\">\
         <title>{}</title><style>{}</style></head><body>\n<h1>{}</h1>",
        env!("CARGO_PKG_VERSION"),
        escape(&title),
        STYLE,
        escape(&title)
    );
    let sections = [
        ("summary", "Summary", summary(job)),
        (
            "ends",
            "Ranks that failed, calls that do not return",
            ends_and_waits(job),
        ),
        ("routines", "Routines, all ranks", routine_tables(&routines)),
        (
            "region",
            "The profiled region (MPI_Pcontrol)",
            profiled_region(job),
        ),
        (
            "sizes",
            "Message sizes, all ranks",
            figures::sizes(&routines),
        ),
        ("ranks", "Communication time per rank", figures::ranks(job)),
        ("timeline", "When ranks were in MPI", figures::timeline(job)),
        (
            "nccl",
            "NCCL bus bandwidth",
            figures::nccl_bandwidth(job, &routines, expected),
        ),
        ("late", "Who is late", figures::who_is_late(job)),
        (
            "durations",
            "Call durations, all ranks",
            figures::durations(&routines),
        ),
        (
            "peers",
            "Point-to-point traffic",
            figures::peers(job, "peers-sent", ""),
        ),
        (
            "fabric",
            "libfabric operations under MPI and NCCL calls",
            figures::fabric(&routines),
        ),
        ("sites", "Call sites, all ranks", call_sites(job)),
        ("text", "The text report", text_report(job)),
    ];
    o.push_str("<nav><ul>");
    for (id, name, body) in &sections {
        if !body.is_empty() {
            let _ = write!(o, "<li><a href=\"#{id}\">{name}</a></li>");
        }
    }
    o.push_str("</ul></nav>\n");
    for (id, name, body) in &sections {
        if !body.is_empty() {
            let _ = writeln!(o, "<section id=\"{id}\"><h2>{name}</h2>\n{body}</section>");
        }
    }
    let _ = writeln!(
        o,
        "<footer>Made by commtap {} from a {} profile. Sizes are mpitrace's buckets \
         (the largest size of each shown); times are seconds of host time unless said.</footer>\
         </body></html>",
        env!("CARGO_PKG_VERSION"),
        escape(&job.schema)
    );
    o
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em auto;max-width:64em;color:#111;\
line-height:1.4}h1{font-size:1.5em}h2{border-bottom:1px solid #999;margin-top:2em}\
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.15em .6em;border-bottom:1px solid #ddd}\
th{text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}\
figure.chart{margin:1em 1em 1em 0;page-break-inside:avoid}\
div.pair{display:flex;flex-wrap:wrap}div.pair figure.chart{flex:1 1 26em}figcaption{font-weight:bold}\
ul.legend{list-style:none;padding:0;margin:.2em 0}ul.legend li{display:inline-block;margin-right:1.5em}\
.swatch{display:inline-block;width:1em;height:1em;margin-right:.4em;vertical-align:middle;\
border:1px solid #333}nav ul{padding-left:1.2em}pre{font-size:.8em;overflow-x:auto}\
.warn{color:#a30}p.scale{font-size:.9em;margin:.2em 0}footer{margin-top:3em;font-size:.85em;color:#555}\
svg{max-width:100%;height:auto}";

/// One row of a two-column table: a label and its (already escaped) value.
fn row(o: &mut String, label: &str, value: &str) {
    let _ = write!(o, "<tr><th>{}</th><td>{value}</td></tr>", escape(label));
}

/// The job summary: ranks, hosts, times and what was not measured.
fn summary(job: &JobProfile) -> String {
    let mut o = String::from("<table class=\"summary\">");
    let hosts: std::collections::BTreeSet<&str> =
        job.ranks.iter().map(|r| r.host.as_str()).collect();
    row(&mut o, "Job", &escape(&job.job));
    row(&mut o, "Ranks", &job.ranks.len().to_string());
    let mut host_list: Vec<String> = hosts.iter().take(8).map(|h| escape(h)).collect();
    if hosts.len() > 8 {
        host_list.push(format!("and {} more", hosts.len() - 8));
    }
    row(
        &mut o,
        "Hosts",
        &format!("{} ({})", hosts.len(), host_list.join(", ")),
    );
    // What each rank's MPI said of its transport, with how many ranks said it.
    let mut transports = std::collections::BTreeMap::<&str, usize>::new();
    for t in job.ranks.iter().filter_map(|r| r.mpi_transport.as_deref()) {
        *transports.entry(t).or_default() += 1;
    }
    if !transports.is_empty() {
        let said: Vec<String> = transports
            .iter()
            .map(|(t, n)| format!("{} ({n} rank{})", escape(t), if *n == 1 { "" } else { "s" }))
            .collect();
        row(&mut o, "MPI transport", &said.join(", "));
    }
    let elapsed = job.ranks.iter().map(|r| r.elapsed_ns).max().unwrap_or(0);
    let total_elapsed: u64 = job.ranks.iter().map(|r| r.elapsed_ns).sum();
    let total_comm: u64 = job.ranks.iter().map(|r| r.comm_time_ns).sum();
    row(
        &mut o,
        "Elapsed (longest rank)",
        &format!("{:.3} s", secs(elapsed)),
    );
    let share = if total_elapsed > 0 {
        format!(
            " ({:.1}% of the ranks' elapsed time)",
            100.0 * total_comm as f64 / total_elapsed as f64
        )
    } else {
        String::new()
    };
    let comm = if job.communicates_by_mpi() {
        format!("{:.3} s{share}", secs(total_comm))
    } else {
        format!("none: {}", super::NO_MPI_COMMUNICATION)
    };
    row(&mut o, "MPI communication time, all ranks", &comm);
    if let Some(s) = job.comm_summary() {
        for (what, r) in [("minimum", s.min), ("median", s.median), ("maximum", s.max)] {
            row(
                &mut o,
                &format!("Communication time, {what}"),
                &format!("{:.3} s, rank {}", secs(r.comm_time_ns), r.rank),
            );
        }
    }
    usage_rows(&mut o, job);
    let (alike, differing) = job.settings_alike_and_not();
    if !alike.is_empty() {
        let said: Vec<String> = alike
            .iter()
            .map(|(k, v)| format!("<code>{}={}</code>", escape(k), escape(v)))
            .collect();
        row(&mut o, "Settings, every rank alike", &said.join("<br>"));
    }
    if !differing.is_empty() {
        // Each with its values and how many ranks had each (a few: the JSON has them all).
        let said: Vec<String> = differing
            .iter()
            .map(|name| {
                let mut values = std::collections::BTreeMap::<Option<&str>, usize>::new();
                for r in &job.ranks {
                    *values
                        .entry(r.settings.get(*name).map(String::as_str))
                        .or_default() += 1;
                }
                let shown: Vec<String> = values
                    .iter()
                    .take(8)
                    .map(|(v, n)| {
                        let ranks = if *n == 1 { "rank" } else { "ranks" };
                        format!("{} ({n} {ranks})", escape(v.unwrap_or("not set")))
                    })
                    .collect();
                let more = if values.len() > 8 { ", ..." } else { "" };
                format!("<code>{}</code>: {}{more}", escape(name), shown.join(", "))
            })
            .collect();
        row(
            &mut o,
            "Settings set differently across ranks",
            &said.join("<br>"),
        );
    }
    let mut health = crate::stats::Health::default();
    for r in &job.ranks {
        health.merge(&r.health);
    }
    let not_measured = [
        ("Events dropped (counts stay exact)", job.dropped),
        ("Calls with undecodable bytes", job.undecoded),
        ("Calls in flight at attach", health.in_flight_at_attach),
        ("Calls left without returning", health.abandoned),
        ("Calls lost to a full counter map", health.counter_map_full),
        ("Handles the kernel did not keep", health.handles_refused),
    ];
    for (what, n) in not_measured {
        let cell = if n > 0 {
            format!("<span class=\"warn\">{n}</span>")
        } else {
            n.to_string()
        };
        row(&mut o, what, &cell);
    }
    for l in &job.libraries {
        let how = if l.uprobe_sessions {
            ", through uprobe sessions"
        } else {
            ""
        };
        row(
            &mut o,
            "Probed",
            &format!(
                "{} ({}): {} routines{how}{}",
                escape(&l.path),
                escape(&l.flavor),
                l.probes,
                if l.failed.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; <span class=\"warn\">failed: {}</span>",
                        escape(&l.failed.join(", "))
                    )
                }
            ),
        );
    }
    for u in &job.unsupported_libraries {
        row(
            &mut o,
            "Not probed",
            &format!("<span class=\"warn\">{}</span>", escape(u)),
        );
    }
    for n in &job.not_profiled {
        row(
            &mut o,
            "Not profiled",
            &format!("<span class=\"warn\">{}</span>", escape(n)),
        );
    }
    o.push_str("</table>\n");
    if job.ranks.is_empty() {
        o.push_str(&format!(
            "<p>No MPI, NCCL, libfabric or UCX calls were seen: {}.</p>\n",
            escape(super::nothing_seen(job))
        ));
    }
    o
}

/// What the ranks used of their nodes: CPU time over all of them, and the largest
/// resident set (the lowest rank among equals), as each rank's `usage` says.
fn usage_rows(o: &mut String, job: &JobProfile) {
    let used: Vec<(u32, &crate::profile::Usage)> = job
        .ranks
        .iter()
        .filter_map(|r| Some((r.rank, r.usage.as_ref()?)))
        .collect();
    let Some(&(rank, largest)) = used
        .iter()
        .min_by_key(|(rank, u)| (std::cmp::Reverse(u.max_rss_bytes), *rank))
    else {
        return;
    };
    let (user, system) = used.iter().fold((0u64, 0u64), |(a, b), (_, u)| {
        (a.saturating_add(u.user_ns), b.saturating_add(u.system_ns))
    });
    row(
        o,
        "CPU time, all ranks",
        &format!("{:.3} s user, {:.3} s system", secs(user), secs(system)),
    );
    row(
        o,
        "Largest resident set",
        &format!(
            "{:.2} MBytes, rank {rank}",
            super::mpitrace::mbytes(largest.max_rss_bytes)
        ),
    );
}

/// mpitrace's routine table per family, all ranks together.
fn routine_tables(routines: &Routines) -> String {
    let mut o = String::new();
    let comm: u64 = crate::stats::communication_ns(routines);
    for (family, heading, time) in [
        (Family::Mpi, "MPI Routine", "time (s)"),
        (Family::Nccl, "NCCL Operation", "enqueue (s)"),
        (
            Family::Fabric,
            "Transport Operation (libfabric, UCX)",
            "time (s)",
        ),
    ] {
        let rows = table_order(routines, family);
        if rows.is_empty() {
            continue;
        }
        let _ = write!(
            o,
            "<table class=\"routines\"><thead><tr><th>{heading}</th><th>#calls</th>\
             <th>bytes</th><th>avg. bytes</th><th>{time}</th>{}</tr></thead><tbody>",
            if family == Family::Mpi {
                "<th>% of comm.</th>"
            } else {
                ""
            }
        );
        for (name, s) in rows {
            let _ = write!(
                o,
                "<tr><th>{}</th><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{:.1}</td><td class=\"n\">{:.6}</td>",
                escape(name),
                s.totals.calls,
                s.totals.bytes,
                s.totals.avg_bytes(),
                secs(s.totals.time_ns)
            );
            if family == Family::Mpi {
                // MPI_Init and MPI_Finalize are not communication (mpitrace leaves them out).
                if comm > 0 && crate::stats::is_communication(name) {
                    let share = 100.0 * s.totals.time_ns as f64 / comm as f64;
                    let _ = write!(o, "<td class=\"n\">{share:.1}</td>");
                } else {
                    o.push_str("<td class=\"n\">-</td>");
                }
            }
            o.push_str("</tr>");
        }
        o.push_str("</tbody></table>\n");
    }
    o
}

/// Most call sites the page lists.
const CALL_SITES_SHOWN: usize = 50;

/// Where the job's calls were made from (`--call-sites`): every rank's sites together by
/// routine and site (`function+offset (file)`: the same in every rank of one program,
/// wherever it was loaded), most time first; empty where none was counted.
fn call_sites(job: &JobProfile) -> String {
    let rows = job.sites_of_all_ranks();
    if rows.is_empty() {
        return String::new();
    }
    let mut o = String::from(
        "<p>Where each routine was called from (the function of the program or library that \
         made the call), every rank's calls together: the seed's question of where the small \
         all-reduces come from.</p>\n<table class=\"sites\"><thead><tr><th>routine</th>\
         <th>call site</th><th>ranks</th><th>#calls</th><th>avg. bytes</th><th>time (s)</th>\
         </tr></thead><tbody>",
    );
    for row in rows.iter().take(CALL_SITES_SHOWN) {
        let _ = write!(
            o,
            "<tr><th>{}</th><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{:.1}</td><td class=\"n\">{:.6}{}</td></tr>",
            escape(&row.routine),
            escape(&row.site),
            row.ranks,
            row.totals.calls,
            row.totals.avg_bytes(),
            secs(row.totals.time_ns),
            if row.untimed > 0 { "*" } else { "" }
        );
    }
    o.push_str("</tbody></table>\n");
    if rows.len() > CALL_SITES_SHOWN {
        let _ = writeln!(
            o,
            "<p>{} more in the JSON profile (each rank's <code>call_sites</code>).</p>",
            rows.len() - CALL_SITES_SHOWN
        );
    }
    if rows.iter().any(|r| r.untimed > 0) {
        o.push_str(
            "<p>* time estimated from the calls timed (the routine's time was sampled).</p>\n",
        );
    }
    o
}

/// The text report, every rank's section, for small jobs.
/// The ranks' `MPI_Pcontrol` region, as mpitrace's files show it: each rank that marked
/// one by its region alone, the others whole; empty when none did.
fn profiled_region(job: &JobProfile) -> String {
    let Some(view) = job.profiled_region() else {
        return String::new();
    };
    let marked: Vec<_> = job
        .ranks
        .iter()
        .filter_map(|r| Some((r, r.region.as_ref()?)))
        .collect();
    let mut o = format!(
        "<p>{} of {} ranks marked a region with <code>MPI_Pcontrol</code> (1 starts or \
         resumes it, 0 pauses it): the tables below count only what they did inside it, as \
         mpitrace's files do (ranks that marked none are counted whole), and so does the \
         point-to-point heat map below. The other sections cover the whole run.</p>\n<table class=\"region\"><thead><tr><th>rank</th>\
         <th>host</th><th>intervals</th><th>time inside (s)</th><th>in MPI (s)</th>\
         <th>bounds read late</th></tr></thead><tbody>",
        marked.len(),
        job.ranks.len()
    );
    for (r, g) in &marked {
        let _ = write!(
            o,
            "<tr><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{:.6}</td><td class=\"n\">{:.6}</td><td class=\"n\">{}</td></tr>",
            r.rank,
            escape(&r.host),
            g.intervals,
            secs(g.elapsed_ns),
            secs(g.comm_time_ns),
            g.late_bounds
        );
    }
    o.push_str("</tbody></table>\n");
    o.push_str(&routine_tables(&job_routines(&view)));
    o.push_str(&figures::peers(
        &view,
        "region-peers-sent",
        " within the profiled region",
    ));
    o
}

/// The text report's sections of ranks that did not end normally and of calls in
/// progress for a second or more (a hung job), where there are any.
fn ends_and_waits(job: &JobProfile) -> String {
    let text = super::endings::render_endings(job) + &super::endings::render_calls_in_progress(job);
    if text.is_empty() {
        return text;
    }
    format!("<pre>{}</pre>\n", escape(text.trim()))
}

fn text_report(job: &JobProfile) -> String {
    if job.ranks.len() > TEXT_RANKS {
        return format!(
            "<p>The job has {} ranks: `commtap report` prints every rank's section.</p>\n",
            job.ranks.len()
        );
    }
    format!(
        "<details><summary>Every rank's mpitrace sections and the job summary</summary>\
         <pre>{}</pre></details>\n",
        escape(&super::render_text(job))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_strings_stay_text() {
        let mut job = JobProfile::of_ranks(Vec::new());
        job.job = "<script>alert(1)</script>".into();
        job.not_profiled
            .push("\"><img src=x onerror=alert(1)>".into());
        let html = render_html(&job, None);
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("&lt;script&gt;"));
    }

    /// Every rank's calls at one site (one program, loaded at different addresses) are one
    /// row, its time marked where any was sampled; a name is escaped.
    #[test]
    fn a_failed_rank_has_a_section() {
        let mut job = JobProfile::of_ranks(Vec::new());
        assert_eq!(ends_and_waits(&job), "");
        let mut rank: crate::profile::RankProfile = serde_json::from_value(serde_json::json!({
            "rank": 3, "rank_known": true, "pid": 77, "host": "n<1>", "job": "7",
            "cmdline": "./app", "start_ticks": 1, "elapsed_ns": 1, "comm_time_ns": 0,
            "routines": {},
        }))
        .expect("a rank profile");
        rank.ended = Some(crate::profile::Ending {
            signal: Some(9),
            ..Default::default()
        });
        job.ranks.push(rank);
        let html = render_html(&job, None);
        assert!(
            html.contains("<section id=\"ends\">")
                && html.contains("killed by SIGKILL")
                && html.contains("n&lt;1&gt;"),
            "{html}"
        );
    }

    #[test]
    fn call_sites_of_all_ranks_are_one_row_per_site() {
        let rank = |n: u32, address: &str| {
            let mut r = crate::api::convert::tests::sample().ranks[0].clone();
            r.rank = n;
            r.call_sites[0].address = address.into();
            r.call_sites[0].function = Some("negotiate<int>".into());
            r
        };
        let job = JobProfile::of_ranks(vec![rank(0, "0x5555401136"), rank(1, "0x5566401136")]);
        let page = call_sites(&job);
        assert!(
            page.contains(
                "<th>MPI_Allreduce</th><td>negotiate&lt;int&gt;+0x1c at app.c:31 (app)</td>\
                 <td class=\"n\">2</td><td class=\"n\">80</td><td class=\"n\">8.0</td>\
                 <td class=\"n\">0.000024*</td>"
            ),
            "{page}"
        );
        assert!(page.contains("* time estimated"), "{page}");
        assert!(call_sites(&JobProfile::of_ranks(Vec::new())).is_empty());
    }

    #[test]
    fn the_summary_says_what_the_ranks_used_and_their_settings() {
        let rank = |n: u32, rss_mib: u64, algo: &str| {
            let mut r = crate::api::convert::tests::sample().ranks[0].clone();
            r.rank = n;
            r.usage = Some(crate::profile::Usage {
                user_ns: 1_000_000_000,
                system_ns: 250_000_000,
                max_rss_bytes: rss_mib << 20,
                context_switches: None,
                at_exit: true,
            });
            r.settings = [
                ("NCCL_DEBUG".to_string(), "<WARN>".to_string()),
                ("NCCL_ALGO".to_string(), algo.to_string()),
            ]
            .into();
            r
        };
        let job = JobProfile::of_ranks(vec![rank(0, 10, "Ring"), rank(1, 30, "Tree")]);
        let html = render_html(&job, None);
        for want in [
            "<tr><th>CPU time, all ranks</th><td>2.000 s user, 0.500 s system</td></tr>",
            "<tr><th>Largest resident set</th><td>30.00 MBytes, rank 1</td></tr>",
            "<tr><th>Settings, every rank alike</th><td><code>NCCL_DEBUG=&lt;WARN&gt;</code></td></tr>",
            "<tr><th>Settings set differently across ranks</th><td><code>NCCL_ALGO</code>: \
             Ring (1 rank), Tree (1 rank)</td></tr>",
        ] {
            assert!(html.contains(want), "{want} in {html}");
        }
    }

    #[test]
    fn the_summary_says_the_ranks_transports() {
        let rank = |t: &str| {
            let mut r = crate::api::convert::tests::sample().ranks[0].clone();
            r.mpi_transport = Some(t.to_string());
            r
        };
        let job = JobProfile::of_ranks(vec![rank("pml ob1"), rank("pml ob1"), rank("<b>")]);
        let html = render_html(&job, None);
        assert!(
            html.contains(
                "<tr><th>MPI transport</th><td>&lt;b&gt; (1 rank), pml ob1 (2 ranks)</td></tr>"
            ),
            "{html}"
        );
    }
}
