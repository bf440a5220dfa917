//! `commtap top`'s screen: a header (source, filters, order, state), what could not be
//! measured and the late rank, the routine table, the busiest ranks, and the keys.

use ratatui::{
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Paragraph, Row, Table},
    Frame,
};

use super::model::{Filter, Screen, SortKey};
use crate::report::units::Unit;

/// What the header says besides the screen's figures.
pub struct Status<'a> {
    /// Where the profiles come from.
    pub source: &'a str,
    /// Seconds between profiles asked of the server.
    pub every_s: f64,
    /// The filter.
    pub filter: &'a Filter,
    /// The routine order.
    pub sort: SortKey,
    /// The display is frozen.
    pub paused: bool,
    /// Profiles received.
    pub updates: u64,
    /// The stream's end, when it ended.
    pub ended: Option<&'a str>,
}

fn rate(v: Option<f64>, unit: Unit) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{}/s", unit.format(v)))
}

fn share(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", 100.0 * v))
}

/// Draws `screen` (none yet: says it waits) with `status` on `frame`.
pub fn draw(frame: &mut Frame, screen: Option<&Screen>, status: &Status) {
    let filter = format!(
        "job: {}  rank: {}",
        status.filter.job.as_deref().unwrap_or("all"),
        status
            .filter
            .rank
            .map_or_else(|| "all".to_string(), |r| r.to_string())
    );
    let mut title = format!(
        "commtap top  {}  every {}  {filter}  sort: {}  updates: {}",
        status.source,
        Unit::Seconds.format(status.every_s),
        status.sort.name(),
        status.updates
    );
    if status.paused {
        title.push_str("  [paused]");
    }
    let mut lines = vec![Line::styled(
        title,
        Style::new().add_modifier(Modifier::BOLD),
    )];
    match screen {
        None => lines.push(Line::raw("waiting for the first profile ...")),
        Some(s) => {
            let u = &s.unmeasured;
            lines.push(Line::raw(format!(
                "ranks: {}  hosts: {}  interval: {}",
                s.ranks_shown,
                s.hosts,
                s.interval_s
                    .map_or_else(|| "-".into(), |i| Unit::Seconds.format(i)),
            )));
            lines.push(Line::raw(format!(
                "not measured: {} events dropped, {} undecoded, {} in flight at attach, \
                 {} left without returning, {} counter map full, {} handles not kept; \
                 {} attach errors",
                u.health.dropped,
                u.health.undecoded,
                u.health.in_flight_at_attach,
                u.health.abandoned,
                u.health.counter_map_full,
                u.health.handles_refused,
                u.not_profiled.len()
            )));
            lines.push(Line::raw(match &s.late {
                Some(late) => format!("late: {late}"),
                None => "late: nobody stands out".into(),
            }));
            if let Some(e) = u.not_profiled.first() {
                lines.push(Line::raw(format!("not profiled: {e}")));
            }
        }
    }
    if let Some(end) = status.ended {
        lines.push(Line::raw(format!("stream ended: {end}")));
    }
    let [head, body_routines, body_ranks, keys] = Layout::vertical([
        Constraint::Length(lines.len() as u16),
        Constraint::Fill(3),
        Constraint::Fill(2),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(lines), head);

    if let Some(s) = screen {
        let interval = s.interval_s.map_or_else(
            || "after the next profile".into(),
            |i| Unit::Seconds.format(i),
        );
        let rows = s.routines.iter().map(|r| {
            Row::new(vec![
                r.name.clone(),
                r.calls.to_string(),
                Unit::Bytes.format(r.bytes as f64),
                rate(r.calls_per_s, Unit::Count),
                rate(r.bytes_per_s, Unit::Bytes),
                share(r.time_share),
            ])
        });
        let table = Table::new(
            rows,
            [
                Constraint::Length(26),
                Constraint::Length(12),
                Constraint::Length(10),
                Constraint::Length(12),
                Constraint::Length(12),
                Constraint::Length(11),
            ],
        )
        .header(
            Row::new(vec![
                "routine",
                "calls",
                "bytes",
                "calls/s",
                "bytes/s",
                "time share",
            ])
            .style(Style::new().add_modifier(Modifier::BOLD)),
        )
        .block(
            Block::new()
                .borders(Borders::TOP)
                .title(format!(" routines (rates over the last {interval}) ")),
        );
        frame.render_widget(table, body_routines);

        let rows = s.ranks.iter().map(|r| {
            Row::new(vec![
                r.rank.to_string(),
                r.host.clone(),
                r.pid.to_string(),
                r.job.clone(),
                share(r.comm_share),
                format!("{:.3}", r.comm_s),
                format!("{:.3}", r.elapsed_s),
                r.cpus
                    .map_or_else(|| "-".into(), |c| format!("{:.0}%", 100.0 * c)),
                r.max_rss_bytes
                    .map_or_else(|| "-".into(), |b| Unit::Bytes.format(b as f64)),
                r.in_long_call.clone().unwrap_or_else(|| "-".into()),
            ])
        });
        let table = Table::new(
            rows,
            [
                Constraint::Length(6),
                Constraint::Length(16),
                Constraint::Length(8),
                Constraint::Length(10),
                Constraint::Length(10),
                Constraint::Length(10),
                Constraint::Length(11),
                Constraint::Length(7),
                Constraint::Length(10),
                Constraint::Min(24),
            ],
        )
        .header(
            Row::new(vec![
                "rank",
                "host",
                "pid",
                "job",
                "MPI share",
                "comm(s)",
                "elapsed(s)",
                "CPU",
                "max RSS",
                "inside (1 s+)",
            ])
            .style(Style::new().add_modifier(Modifier::BOLD)),
        )
        .block(
            Block::new()
                .borders(Borders::TOP)
                .title(" busiest ranks (share of the last interval in MPI) "),
        );
        frame.render_widget(table, body_ranks);
    }
    frame.render_widget(
        Paragraph::new("keys: s sort  j next job  r next rank  a all  p pause  q quit")
            .style(Style::new().add_modifier(Modifier::REVERSED)),
        keys,
    );
}
