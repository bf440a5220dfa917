//! What `commtap top` shows, from the two latest profiles of a watch stream: per routine the
//! rates over the last interval, the busiest ranks, what could not be measured, the rank
//! the others wait for. Pure: the screen (`view`) only lays it out.

use std::{collections::BTreeMap, time::Instant};

use crate::{
    profile::{JobProfile, RankProfile},
    report::units::secs,
    stats::{Health, Totals},
};

/// Which ranks are shown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this job.
    pub job: Option<String>,
    /// Only this world rank (of the job shown).
    pub rank: Option<u32>,
}

impl Filter {
    fn admits(&self, r: &RankProfile) -> bool {
        self.job.as_ref().is_none_or(|j| *j == r.job) && self.rank.is_none_or(|n| n == r.rank)
    }
}

/// The routine table's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Share of the ranks' time in the routine over the last interval.
    Time,
    /// Calls per second over the last interval.
    Calls,
    /// Bytes per second over the last interval.
    Bytes,
    /// Routine name.
    Name,
}

impl SortKey {
    /// The next order (the `s` key).
    pub fn next(self) -> SortKey {
        match self {
            SortKey::Time => SortKey::Calls,
            SortKey::Calls => SortKey::Bytes,
            SortKey::Bytes => SortKey::Name,
            SortKey::Name => SortKey::Time,
        }
    }

    /// As the header names it.
    pub fn name(self) -> &'static str {
        match self {
            SortKey::Time => "time share",
            SortKey::Calls => "calls/s",
            SortKey::Bytes => "bytes/s",
            SortKey::Name => "name",
        }
    }
}

/// One routine, the shown ranks together.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutineRow {
    /// C name.
    pub name: String,
    /// Calls since the ranks were first watched.
    pub calls: u64,
    /// Bytes since then.
    pub bytes: u64,
    /// Calls per second over the last interval (none before a second profile).
    pub calls_per_s: Option<f64>,
    /// Bytes per second over the last interval.
    pub bytes_per_s: Option<f64>,
    /// Share of the shown ranks' time spent in it over the last interval.
    pub time_share: Option<f64>,
}

/// One rank.
#[derive(Clone, Debug, PartialEq)]
pub struct RankRow {
    /// World rank.
    pub rank: u32,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Job id.
    pub job: String,
    /// Share of the last interval it spent in MPI communication.
    pub comm_share: Option<f64>,
    /// MPI communication time so far, s.
    pub comm_s: f64,
    /// Elapsed time so far, s.
    pub elapsed_s: f64,
    /// CPU time it used over the last interval, in CPUs (1.0: one core busy throughout;
    /// none before a second profile or where its usage is not known).
    pub cpus: Option<f64>,
    /// Its largest resident set so far, bytes.
    pub max_rss_bytes: Option<u64>,
    /// The call it has been inside for a second or more (`MPI_Barrier 42.0 s`: a time
    /// booked only at a call's return, a rank blocked in one would look idle).
    pub in_long_call: Option<String>,
}

/// What could not be measured, the shown ranks together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unmeasured {
    /// The shown ranks' health added up (drops, undecoded calls, calls in flight at
    /// attach, a full counter map).
    pub health: Health,
    /// Processes that could not be profiled (attach errors), with the reason.
    pub not_profiled: Vec<String>,
}

/// A screenful.
#[derive(Clone, Debug, PartialEq)]
pub struct Screen {
    /// Ranks shown.
    pub ranks_shown: usize,
    /// Hosts they run on.
    pub hosts: usize,
    /// Seconds between the two profiles the rates come from (none with one profile).
    pub interval_s: Option<f64>,
    /// Routines, in the chosen order.
    pub routines: Vec<RoutineRow>,
    /// Ranks, busiest first.
    pub ranks: Vec<RankRow>,
    /// Not measured.
    pub unmeasured: Unmeasured,
    /// The late rank, when one stands out (see [`late_rank`]), in a sentence.
    pub late: Option<String>,
}

/// The latest two profiles and when they came.
#[derive(Default)]
pub struct Model {
    prev: Option<(Instant, JobProfile)>,
    cur: Option<(Instant, JobProfile)>,
}

/// A process across profiles: host, pid and start time.
fn identity(r: &RankProfile) -> (&str, u32, u64) {
    (r.host.as_str(), r.pid, r.start_ticks)
}

impl Model {
    /// Takes the profile that came at `at`.
    pub fn update(&mut self, at: Instant, profile: JobProfile) {
        self.prev = self.cur.take();
        self.cur = Some((at, profile));
    }

    /// The world ranks of `job` (all jobs: none) in the latest profile, sorted.
    pub fn ranks_of(&self, job: Option<&str>) -> Vec<u32> {
        let mut ranks: Vec<u32> = self
            .ranks()
            .filter(|r| job.is_none_or(|j| j == r.job))
            .map(|r| r.rank)
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    }

    fn ranks(&self) -> impl Iterator<Item = &RankProfile> {
        self.cur.iter().flat_map(|(_, p)| p.ranks.iter())
    }

    /// The screen for `filter`, routines in `sort` order.
    pub fn screen(&self, filter: &Filter, sort: SortKey) -> Option<Screen> {
        let (now, cur) = self.cur.as_ref()?;
        let shown: Vec<&RankProfile> = cur.ranks.iter().filter(|r| filter.admits(r)).collect();
        let prev: BTreeMap<_, &RankProfile> = self
            .prev
            .iter()
            .flat_map(|(_, p)| p.ranks.iter())
            .map(|r| (identity(r), r))
            .collect();
        // The server's own measure of the interval: how far the live ranks' elapsed time
        // moved (receipt times carry the network's jitter); else the receipt times.
        let elapsed_moved = shown
            .iter()
            .filter_map(|r| {
                let before = prev.get(&identity(r))?;
                Some(r.elapsed_ns.saturating_sub(before.elapsed_ns))
            })
            .max()
            .filter(|ns| *ns > 0)
            .map(secs);
        let interval = self.prev.as_ref().and_then(|(at, _)| {
            elapsed_moved
                .or_else(|| Some(now.duration_since(*at).as_secs_f64()).filter(|s| *s > 0.0))
        });

        // Totals so far, and what the last interval added (a rank new in it counts whole).
        let mut totals: BTreeMap<&str, (Totals, Totals)> = BTreeMap::new();
        let mut ranks = Vec::new();
        for r in &shown {
            let before = prev.get(&identity(r));
            for (name, s) in &r.routines {
                let e = totals.entry(name.as_str()).or_default();
                e.0.merge(&s.totals);
                let old = before
                    .and_then(|b| b.routines.get(name))
                    .map(|b| b.totals)
                    .unwrap_or_default();
                e.1.merge(&Totals {
                    calls: s.totals.calls.saturating_sub(old.calls),
                    bytes: s.totals.bytes.saturating_sub(old.bytes),
                    time_ns: s.totals.time_ns.saturating_sub(old.time_ns),
                });
            }
            let comm_delta = r
                .comm_time_ns
                .saturating_sub(before.map_or(0, |b| b.comm_time_ns));
            let cpu_ns = |p: &RankProfile| {
                p.usage
                    .as_ref()
                    .map(|u| u.user_ns.saturating_add(u.system_ns))
            };
            // Over an interval both profiles know: a rank new in it has no interval yet.
            let cpu_delta = cpu_ns(r)
                .zip(before.and_then(|b| cpu_ns(b)))
                .map(|(now, then)| now.saturating_sub(then));
            ranks.push(RankRow {
                rank: r.rank,
                host: r.host.clone(),
                pid: r.pid,
                job: r.job.clone(),
                // Time is booked when a call returns: an interval may hold a little more
                // than its length.
                comm_share: interval.map(|i| (secs(comm_delta) / i).min(1.0)),
                comm_s: secs(r.comm_time_ns),
                elapsed_s: secs(r.elapsed_ns),
                cpus: interval
                    .zip(cpu_delta)
                    .filter(|(i, _)| *i > 0.0)
                    .map(|(i, d)| secs(d) / i),
                max_rss_bytes: r.usage.as_ref().map(|u| u.max_rss_bytes),
                in_long_call: r
                    .long_call()
                    .map(|c| format!("{} {}", c.routine, crate::skew::summary::human_ns(c.for_ns))),
            });
        }
        ranks.sort_by(|a, b| {
            let share = |r: &RankRow| r.comm_share.unwrap_or(0.0);
            share(b)
                .total_cmp(&share(a))
                .then(b.comm_s.total_cmp(&a.comm_s))
                .then(a.rank.cmp(&b.rank))
        });
        let rank_seconds = interval.map(|i| i * shown.len().max(1) as f64);
        let mut routines: Vec<RoutineRow> = totals
            .into_iter()
            .map(|(name, (all, last))| RoutineRow {
                name: name.to_string(),
                calls: all.calls,
                bytes: all.bytes,
                calls_per_s: interval.map(|i| last.calls as f64 / i),
                bytes_per_s: interval.map(|i| last.bytes as f64 / i),
                time_share: rank_seconds.map(|s| (secs(last.time_ns) / s).min(1.0)),
            })
            .collect();
        let key = |r: &RoutineRow| match sort {
            SortKey::Time => r.time_share.unwrap_or(0.0),
            SortKey::Calls => r.calls_per_s.unwrap_or(0.0),
            SortKey::Bytes => r.bytes_per_s.unwrap_or(0.0),
            SortKey::Name => 0.0,
        };
        // Ties (and the rates' absence) fall back on the totals, then the name.
        routines.sort_by(|a, b| {
            key(b)
                .total_cmp(&key(a))
                .then_with(|| match sort {
                    SortKey::Name => std::cmp::Ordering::Equal,
                    SortKey::Bytes => b.bytes.cmp(&a.bytes),
                    SortKey::Time | SortKey::Calls => b.calls.cmp(&a.calls),
                })
                .then_with(|| a.name.cmp(&b.name))
        });

        let mut unmeasured = Unmeasured {
            not_profiled: cur.not_profiled.clone(),
            ..Unmeasured::default()
        };
        for r in &shown {
            unmeasured.health.merge(&r.health);
        }
        let hosts = shown
            .iter()
            .map(|r| r.host.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        Some(Screen {
            ranks_shown: shown.len(),
            hosts,
            interval_s: interval,
            routines,
            ranks,
            unmeasured,
            late: late_rank(cur),
        })
    }
}

/// The rank that made the others wait at least half of all the waiting, waited for at
/// one collective in ten at least, in a sentence.
fn late_rank(p: &JobProfile) -> Option<String> {
    let skew = p.skew.as_ref()?;
    let total: u64 = skew.ranks.iter().map(|r| r.caused_ns).sum();
    let top = skew.ranks.iter().max_by_key(|r| r.caused_ns)?;
    // Last at one collective in ten at least: a rank the scheduler happened to run last a
    // few times is not "the late rank".
    (total > 0 && top.caused_ns * 2 >= total && top.last * 10 >= top.instances).then(|| {
        format!(
            "rank {} ({}) kept the others waiting at {} of {} collectives, {:.3} s in all",
            top.rank,
            top.host,
            top.last,
            top.instances,
            secs(top.caused_ns)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::RoutineStats;
    use std::time::Duration;

    fn rank(rank: u32, calls: u64, bytes: u64, time_ns: u64, comm_ns: u64) -> RankProfile {
        let mut routines = crate::stats::Routines::new();
        routines.insert(
            "MPI_Allreduce".into(),
            RoutineStats {
                totals: Totals {
                    calls,
                    bytes,
                    time_ns,
                },
                ..RoutineStats::default()
            },
        );
        routines.insert(
            "MPI_Send".into(),
            RoutineStats {
                totals: Totals {
                    calls: 1,
                    bytes: 1 << 20,
                    time_ns: 1,
                },
                ..RoutineStats::default()
            },
        );
        RankProfile {
            rank,
            rank_known: true,
            pid: 100 + rank,
            host: "n1".into(),
            job: "7".into(),
            cmdline: String::new(),
            uid: Some(0),
            container: None,
            region: None,
            probe_call_cost: None,
            usage: None,
            settings: Default::default(),
            call_sites: Vec::new(),
            call_sites_left_out: 0,
            ended: None,
            in_call: None,
            in_call_unknown: false,
            start_ticks: 1,
            exited: false,
            detached: false,
            unwatched_ns: 0,
            world_size: None,
            elapsed_ns: 0,
            comm_time_ns: comm_ns,
            routines,
            health: crate::stats::Health::default(),
            fabrics: Vec::new(),
            mpi_transport: None,
            peers: Vec::new(),
            comm_ranks: Vec::new(),
        }
    }

    #[test]
    fn rates_are_the_last_interval_over_its_length() {
        let t0 = Instant::now();
        let mut m = Model::default();
        m.update(
            t0,
            JobProfile::of_ranks(vec![rank(0, 10, 80, 1_000_000, 0), rank(1, 10, 80, 0, 0)]),
        );
        let first = m.screen(&Filter::default(), SortKey::Time).expect("screen");
        assert_eq!(first.interval_s, None);
        assert_eq!(first.routines[0].calls_per_s, None);
        m.update(
            t0 + Duration::from_secs(2),
            JobProfile::of_ranks(vec![
                rank(0, 30, 240, 401_000_000, 1_000_000_000),
                rank(1, 20, 160, 0, 0),
            ]),
        );
        let s = m.screen(&Filter::default(), SortKey::Time).expect("screen");
        let all = &s.routines[0];
        assert_eq!(all.name, "MPI_Allreduce");
        assert_eq!((all.calls, all.bytes), (50, 400));
        assert_eq!(all.calls_per_s, Some(15.0));
        assert_eq!(all.bytes_per_s, Some(120.0));
        // 0.4 s of the two ranks' 4 s.
        assert_eq!(all.time_share, Some(0.1));
        assert_eq!(s.ranks[0].rank, 0, "busiest first");
        assert_eq!(s.ranks[0].comm_share, Some(0.5));

        // By bytes/s, MPI_Send (1 MiB so far, none in the interval) is second; by name first.
        let by_bytes = m
            .screen(&Filter::default(), SortKey::Bytes)
            .expect("screen");
        assert_eq!(by_bytes.routines[0].name, "MPI_Allreduce");
        let by_name = m.screen(&Filter::default(), SortKey::Name).expect("screen");
        assert_eq!(by_name.routines[0].name, "MPI_Allreduce");
        assert_eq!(by_name.routines[1].name, "MPI_Send");

        let one = Filter {
            job: Some("7".into()),
            rank: Some(1),
        };
        let s = m.screen(&one, SortKey::Calls).expect("screen");
        assert_eq!(s.ranks_shown, 1);
        assert_eq!(s.routines[0].calls, 20);
        assert_eq!(s.routines[0].calls_per_s, Some(5.0));
        assert_eq!(m.ranks_of(Some("7")), vec![0, 1]);
    }

    /// A rank blocked in a call returns nothing, so its time share stays 0: the column
    /// of long calls says where it is.
    #[test]
    fn a_rank_blocked_in_a_call_shows_it() {
        let mut blocked = rank(0, 10, 80, 0, 0);
        blocked.in_call = Some(crate::profile::InCall {
            routine: "MPI_Barrier".into(),
            for_ns: 42_000_000_000,
            ..Default::default()
        });
        let mut busy = rank(1, 10, 80, 0, 0);
        busy.in_call = Some(crate::profile::InCall {
            routine: "MPI_Allreduce".into(),
            for_ns: 5_000,
            ..Default::default()
        });
        let mut m = Model::default();
        m.update(Instant::now(), JobProfile::of_ranks(vec![blocked, busy]));
        let s = m.screen(&Filter::default(), SortKey::Time).expect("screen");
        let inside = |rank: u32| {
            s.ranks
                .iter()
                .find(|r| r.rank == rank)
                .and_then(|r| r.in_long_call.clone())
        };
        assert_eq!(inside(0).as_deref(), Some("MPI_Barrier 42.0 s"));
        assert_eq!(inside(1), None);
    }

    #[test]
    fn the_interval_is_the_servers_when_ranks_live() {
        let t0 = Instant::now();
        let mut m = Model::default();
        let mut a = rank(0, 10, 80, 0, 0);
        a.elapsed_ns = 1_000_000_000;
        m.update(t0, JobProfile::of_ranks(vec![a.clone()]));
        a.elapsed_ns = 2_500_000_000;
        a.routines.get_mut("MPI_Allreduce").unwrap().totals.calls = 40;
        // Received 2 s apart, measured 1.5 s apart by the server.
        m.update(t0 + Duration::from_secs(2), JobProfile::of_ranks(vec![a]));
        let s = m.screen(&Filter::default(), SortKey::Time).expect("screen");
        assert_eq!(s.interval_s, Some(1.5));
        assert_eq!(s.routines[0].calls_per_s, Some(20.0));
    }

    #[test]
    fn a_ranks_cpu_is_its_usage_over_the_interval() {
        let t0 = Instant::now();
        let mut m = Model::default();
        let used = |cpu_ms: u64| {
            let mut r = rank(0, 10, 80, 0, 0);
            r.usage = Some(crate::profile::Usage {
                user_ns: cpu_ms * 750_000,
                system_ns: cpu_ms * 250_000,
                max_rss_bytes: 64 << 20,
                context_switches: None,
                at_exit: false,
            });
            r
        };
        m.update(t0, JobProfile::of_ranks(vec![used(1000)]));
        let s = m.screen(&Filter::default(), SortKey::Time).expect("screen");
        assert_eq!(s.ranks[0].cpus, None, "no interval yet");
        assert_eq!(s.ranks[0].max_rss_bytes, Some(64 << 20));
        // 3 s of CPU time in 2 s: one and a half cores.
        m.update(
            t0 + Duration::from_secs(2),
            JobProfile::of_ranks(vec![used(4000)]),
        );
        let s = m.screen(&Filter::default(), SortKey::Time).expect("screen");
        assert_eq!(s.ranks[0].cpus, Some(1.5));
    }
}
