//! Building a job's profile from the kernel's counters and what discovery knows of each
//! process: the one place the profile is assembled (`record`, the daemon and `detach`
//! alike), with job ids and ranks filled in where the launcher did not say them.

use std::collections::{BTreeMap, BTreeSet};

use collector_common::{CounterKey, CounterVal, PeerKey, PeerVal, ProcStats, SiteKey, SiteVal};

use super::{
    CallSite, JobProfile, JobTotals, ProbedLibrary, RankProfile, RegionProfile, Usage, SCHEMA,
};
use crate::{
    attach::{AttachedLibrary, Probes},
    discover::{self, tracked::Tracked, ProcessInfo},
    stats,
    symbols::{sites::SiteFiles, Placement},
};

/// Names communicator `handle` of process `pid` alike in every member, where it can.
pub type CommName<'a> = dyn Fn(u32, u64, u16) -> Option<String> + 'a;

/// The kernel's counters, read once for a profile.
struct Counters {
    all: Vec<crate::stats::Counter>,
    device: Vec<(CounterKey, CounterVal)>,
    peers: Vec<(PeerKey, PeerVal)>,
    /// Per process, its per-peer counters held out of the kernel's map.
    peers_folded: BTreeMap<u32, u64>,
}

/// The profile of every process in `tracked` that made MPI calls, from `probes`' counters
/// as they are now, on `host`; `end_ns` closes the elapsed time of processes still running,
/// `events_of` says how many call events each delivered, and `job_ids` keeps the job ids
/// given so far stable across profiles; `comm_name` names a process's communicator
/// handle alike in every member (see [`stats::peers_of`]).
pub fn job_profile(
    probes: &Probes,
    tracked: &BTreeMap<u32, Tracked>,
    events_of: impl Fn(u32) -> u64,
    comm_name: &CommName<'_>,
    (host, end_ns): (&str, u64),
    job_ids: &mut BTreeMap<String, String>,
    stacks: &mut super::stacks::StackReading<'_>,
) -> JobProfile {
    let c = Counters {
        all: probes.read_counters(),
        device: probes.read_device_time(),
        peers: probes.read_peers(),
        peers_folded: tracked
            .keys()
            .map(|&pid| (pid, probes.peers_folded(pid)))
            .collect(),
    };
    let counted: BTreeSet<u32> = c.all.iter().map(|(k, ..)| k.tgid).collect();
    let clock = crate::clock::UnixClock::now();
    // The threads whose call state is read for this profile, at most, all ranks together:
    // each is a pidfd and a map lookup, under the session's lock.
    let mut threads_left = crate::attach::CALL_STATES_READ;
    let mut in_call_time = std::time::Duration::ZERO;
    let mut ranks = Vec::new();
    let mut not_profiled = Vec::new();
    for (&pid, t) in tracked {
        // A rank attached to that has made no call since is profiled all the same: a hung
        // job's ranks make none, and where each is (inside which call, or none) is what
        // its profile is for.
        let attached_late = t.attached_while_running();
        let idle_since_attach = t.maps_mpi
            && t.exit_ns.is_none()
            && (t.requested || t.rank_numbering().is_some())
            && attached_late;
        if counted.contains(&pid) || t.earlier.is_some() || idle_since_attach {
            let ps = probes.read_proc_stats(pid);
            let events = events_of(pid);
            let name = |handle, gen| comm_name(pid, handle, gen);
            let usage = usage_of(pid, t, &ps, &|| probes.read_proc_stats(pid));
            let mut rank = rank_profile(pid, t, (&ps, usage), &c, (events, &name), host, end_ns);
            rank.ended = super::Ending::of(&ps, &clock);
            if rank.ended.is_none() && t.exit_ns.is_none() {
                let started = std::time::Instant::now();
                // Its `/proc` directory, opened where its stacks are read: the process
                // tracked (its start checked), not another given its pid since.
                let dir = std::cell::OnceCell::new();
                let dir = || {
                    dir.get_or_init(|| {
                        // Unchecked only where no start is known at all.
                        let start = [t.info.as_ref(), t.kernel_info.as_ref()]
                            .into_iter()
                            .flatten()
                            .find_map(ProcessInfo::known_start);
                        discover::process_dir::ProcessDir::open(pid, start).ok()
                    })
                    .as_ref()
                };
                let mut unseen = crate::attach::Unseen::default();
                let seen = probes.call_in_progress(pid, &mut threads_left, &mut unseen);
                rank.in_call = seen.and_then(|c| {
                    let for_ns = end_ns.saturating_sub(c.since_ns);
                    super::InCall::of(usize::from(c.routine), for_ns, c.tid)
                });
                let long = |c: &super::InCall| c.for_ns >= super::LONG_CALL_NS;
                if rank.in_call.as_ref().is_some_and(long)
                    && seen.is_some_and(|s| dir().is_some_and(|d| stacks.left_call(d, &s)))
                {
                    // Left without returning (a `longjmp` out of an error handler) a
                    // second or more ago: the probes count it `abandoned` only at the
                    // thread's next call or its end. Counted here meanwhile (the stats were
                    // read before the thread's state: never counted twice).
                    rank.in_call = None;
                    rank.health.abandoned += 1;
                } else if let Some((call, seen)) =
                    rank.in_call.as_mut().zip(seen).filter(|(c, _)| long(c))
                {
                    // A call of a second or more: where it was made (a hung job's).
                    call.called_from =
                        dir().and_then(|d| stacks.called_from(d, call, seen.since_ns));
                } else if !unseen.untimed.is_empty() {
                    // A thread's last call untimed (a routine whose time is sampled):
                    // inside it for a second or more still (a hung job's), or past it;
                    // taken over another thread's short call (a progress thread's).
                    let found = dir().map_or(super::stacks::Untimed::Unknown, |d| {
                        stacks.untimed_call(d, &unseen.untimed, end_ns)
                    });
                    match found {
                        super::stacks::Untimed::Inside(call) => rank.in_call = Some(call),
                        super::stacks::Untimed::Unknown if rank.in_call.is_none() => {
                            rank.in_call_unknown = true;
                        }
                        _ => {}
                    }
                }
                if rank.in_call.is_none() && !rank.in_call_unknown && attached_late {
                    let found = dir().map_or(super::stacks::Found::Unknown, |d| {
                        stacks.entered_before_attach(d, &unseen)
                    });
                    match found {
                        super::stacks::Found::Inside(routine, tid, called_from) => {
                            let for_ns = end_ns.saturating_sub(t.since_ns);
                            rank.in_call = super::InCall::of(usize::from(routine), for_ns, tid)
                                .map(|c| super::InCall {
                                    before_attach: true,
                                    called_from,
                                    ..c
                                });
                        }
                        super::stacks::Found::Unknown => rank.in_call_unknown = true,
                        super::stacks::Found::Outside => {}
                    }
                }
                in_call_time += started.elapsed();
            }
            if let Some(earlier) = &t.earlier {
                rank.add_earlier(earlier);
            }
            ranks.push(rank);
        } else if t.requested {
            not_profiled.push(if t.maps_mpi {
                format!("PID {pid}: made no MPI call while watched")
            } else {
                format!("PID {pid}: never mapped an MPI library")
            });
        }
    }
    tracing::debug!(
        threads = crate::attach::CALL_STATES_READ - threads_left,
        took = ?in_call_time,
        "read the running ranks' calls in progress"
    );
    assemble(ranks, probes, not_profiled, job_ids)
}

/// The call sites of process `pid` among the kernel's `read`, named against the files it
/// mapped (`objects`), with those of its `earlier` spans watched (a detach and an attach
/// again), most time first (then most calls): at most [`super::MAX_CALL_SITES`], and how
/// many more were left out.
pub fn call_sites(
    pid: u32,
    read: &[(SiteKey, SiteVal)],
    objects: &[discover::MappedObject],
    earlier: &[CallSite],
    files: &mut SiteFiles,
) -> (Vec<CallSite>, u64) {
    // Named once cut to the sites kept (names are the dear part: a demangled C++ name
    // and a line each), by their address in the process: `None` for an earlier span's,
    // named then.
    let mut sites: Vec<(Option<u64>, CallSite)> = read
        .iter()
        .filter(|(k, _)| k.tgid == pid)
        .map(|(k, v)| {
            // Sampled: the timed calls' mean for every call.
            let time_ns = if v.timed == 0 || v.timed == v.calls {
                v.time_ns
            } else {
                u64::try_from(u128::from(v.time_ns) * u128::from(v.calls) / u128::from(v.timed))
                    .unwrap_or(u64::MAX)
            };
            let site = CallSite {
                routine: collector_common::ROUTINES
                    .get(usize::from(k.routine))
                    .map_or_else(|| format!("routine {}", k.routine), |r| r.name.to_string()),
                address: format!("{:#x}", k.site),
                totals: stats::Totals {
                    calls: v.calls,
                    bytes: v.bytes,
                    time_ns,
                },
                timed_calls: v.timed,
                ..CallSite::default()
            };
            (Some(k.site), site)
        })
        .collect();
    for e in earlier {
        match sites
            .iter_mut()
            .find(|(_, s)| (&s.routine, &s.address) == (&e.routine, &e.address))
        {
            Some((_, s)) => {
                s.totals.merge(&e.totals);
                s.timed_calls += e.timed_calls;
            }
            None => sites.push((None, e.clone())),
        }
    }
    sites.sort_by(|(_, a), (_, b)| {
        (b.totals.time_ns, b.totals.calls, &a.routine, &a.address).cmp(&(
            a.totals.time_ns,
            a.totals.calls,
            &b.routine,
            &b.address,
        ))
    });
    let left_out = sites.len().saturating_sub(super::MAX_CALL_SITES) as u64;
    sites.truncate(super::MAX_CALL_SITES);
    let sites = sites
        .into_iter()
        .map(|(address, site)| match address {
            Some(address) => CallSite {
                totals: site.totals,
                timed_calls: site.timed_calls,
                ..CallSite::named(site.routine, address, files.name(objects, address))
            },
            None => site,
        })
        .collect();
    (sites, left_out)
}

/// What the process used of its node: as the kernel added it up at its end, else (still
/// running) as `/proc` says now, with its ended threads' context switches as the kernel
/// added them (`ps`, read before; `reread` reads them again).
fn usage_of(
    pid: u32,
    t: &Tracked,
    ps: &ProcStats,
    reread: &dyn Fn() -> ProcStats,
) -> Option<Usage> {
    // SAFETY: sysconf reads a constant.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    if t.exit_ns.is_some() {
        return Usage::at_exit(ps, page);
    }
    let start_ticks = t.info.as_ref().map_or(0, |i| i.start_ticks);
    if start_ticks == 0 {
        return None;
    }
    // A thread that ends during the walk of the live ones is in neither reading: where the
    // kernel's count of ended threads moved meanwhile, walked once more.
    let read = || Some((discover::live_usage(pid, start_ticks)?, reread()));
    let (mut live, mut ended) = read()?;
    if ended.exit_threads != ps.exit_threads {
        (live, ended) = read()?;
    }
    Some(Usage {
        user_ns: live.user_ns,
        system_ns: live.system_ns,
        max_rss_bytes: live.max_rss_bytes,
        context_switches: live
            .live_context_switches
            .map(|n| n.saturating_add(ended.exit_nvcsw.saturating_add(ended.exit_nivcsw))),
        at_exit: false,
    })
}

/// Where a process's profiled time starts (monotonic ns): its `MPI_Init`'s return, or
/// when it was first counted if that came later (attached mid-run).
pub fn counted_from(t: &Tracked, ps: &ProcStats) -> u64 {
    if ps.init_ns != 0 {
        ps.init_ns.max(t.since_ns)
    } else {
        t.since_ns
    }
}

/// One process's profile; its `job` holds the job key (see [`job_key`]) until
/// [`assemble`] names the job.
fn rank_profile(
    pid: u32,
    t: &Tracked,
    (ps, usage): (&ProcStats, Option<Usage>),
    c: &Counters,
    (events, comm_name): (u64, &dyn Fn(u64, u16) -> Option<String>),
    host: &str,
    end_ns: u64,
) -> RankProfile {
    let routines = stats::routines_of(pid, &c.all, &c.device);
    let mut health: stats::Health = ps.into();
    health.fabric_unresolved = stats::fabric_unresolved(pid, &c.all);
    health.peers_folded = c.peers_folded.get(&pid).copied().unwrap_or(0);
    health.events = events;
    let start = counted_from(t, ps);
    let end = if ps.finalize_ns != 0 {
        ps.finalize_ns
    } else {
        t.exit_ns.unwrap_or(end_ns)
    };
    let info = t.info.clone().unwrap_or(ProcessInfo {
        pid,
        ..Default::default()
    });
    let (peers, comm_ranks) = stats::peers_of(pid, &c.peers, comm_name);
    let mine = c.all.iter().filter(|(k, ..)| k.tgid == pid);
    let my_peers = c.peers.iter().filter(|(k, _)| k.tgid == pid);
    let region = t.region.counts(mine, my_peers, end, start).map(|r| {
        let mut routines = stats::routines_of(pid, &r.counters, &[]);
        routines.remove("MPI_Pcontrol");
        Box::new(RegionProfile {
            intervals: r.intervals,
            elapsed_ns: r.elapsed_ns,
            comm_time_ns: stats::communication_ns(&routines),
            late_bounds: r.late_bounds,
            routines,
            peers: stats::peers_of(pid, &r.peers, comm_name).0,
        })
    });
    let mpi_transport = t
        .mpi_transport
        .as_deref()
        .map(|said| stats::transport_used(said, &routines));
    RankProfile {
        rank: info.rank.unwrap_or(u32::MAX),
        rank_known: info.rank.is_some(),
        world_size: info.world_size,
        pid,
        host: host.to_string(),
        job: job_key(&info),
        cmdline: info.cmdline.clone(),
        uid: t.uid(),
        container: info.container.clone().map(Box::new),
        start_ticks: info.start_ticks,
        exited: false,
        detached: false,
        unwatched_ns: 0,
        elapsed_ns: end.saturating_sub(start),
        comm_time_ns: stats::communication_ns(&routines),
        routines,
        health,
        fabrics: t.fabrics.iter().cloned().collect(),
        mpi_transport,
        peers,
        comm_ranks,
        region,
        probe_call_cost: None,
        usage,
        settings: info.settings.clone(),
        call_sites: Vec::new(),
        call_sites_left_out: 0,
        ended: None,
        in_call: None,
        in_call_unknown: false,
    }
}

/// Groups a process with the other ranks of its job: the batch system's job id, else the
/// launcher's own job key, else one group for everything unlabelled. A batch job id that
/// only the process's environment claims is grouped per user: nobody joins another user's
/// job by setting `SLURM_JOB_ID`.
pub fn job_key(info: &ProcessInfo) -> String {
    match (&info.batch_job, &info.launcher_job) {
        (Some(b), _) if info.batch_job_from_cgroup => format!("batch:{b}"),
        (Some(b), _) => format!("claim:{}:{b}", info.uid.map_or(-1, i64::from)),
        (None, Some(l)) => format!("launcher:{l}"),
        (None, None) => String::new(),
    }
}

/// The job id a group keyed `key` (see `job_key`) is shown with: a batch job's own id, and
/// for a claimed one the same unless another group (the real job, or another user's claim)
/// has that id too: then `ID.uUID`. Else `None` (launcher keys: mpitrace's rank 0 pid).
fn batch_job_id(key: &str, keys: &[&String]) -> Option<String> {
    if let Some(batch) = key.strip_prefix("batch:") {
        return Some(batch.to_string());
    }
    let (uid, id) = key.strip_prefix("claim:")?.split_once(':')?;
    let shared = keys.iter().any(|k| {
        *k != key
            && (k.strip_prefix("batch:") == Some(id)
                || k.strip_prefix("claim:")
                    .and_then(|c| c.split_once(':'))
                    .is_some_and(|(_, other)| other == id))
    });
    Some(if shared {
        format!("{id}.u{uid}")
    } else {
        id.to_string()
    })
}

/// `id`, or `id.N` (N from 2) where another job named before has it: a rank 0's pid is
/// given to another process once that rank has exited, while its job's profiles are still
/// kept (and pushed), and two jobs named alike would be shown and selected as one. Not the
/// processes no launcher names (key ""): one of them that execs a job's rank 0 is the same
/// process, named after itself.
fn unused_id(id: String, key: &str, job_ids: &BTreeMap<String, String>) -> String {
    let taken = |candidate: &str| {
        job_ids
            .iter()
            .any(|(k, v)| k != key && !k.is_empty() && v == candidate)
    };
    if !taken(&id) {
        return id;
    }
    // One of these is free: every other job holds one id.
    (2..=job_ids.len() as u64 + 2)
        .map(|n| format!("{id}.{n}"))
        .find(|candidate| !taken(candidate))
        .unwrap_or(id)
}

/// A process as job naming sees it.
pub struct Member {
    /// Its job key ([`job_key`]).
    pub key: String,
    /// Its world rank, where the launcher said it.
    pub rank: Option<u32>,
    /// Its pid.
    pub pid: u32,
}

/// Each member's rank and job, in input order: ranks the launcher did not say get the next
/// free numbers of their job, in pid order; a job is named by its batch id (see
/// [`batch_job_id`]), else by the id kept in `job_ids`, else by its rank 0's pid (kept in
/// `job_ids` once rank 0 is among them, or no launcher said any rank: a job whose rank 1
/// was seen a moment before its rank 0 is still named after rank 0's pid).
pub fn name_jobs(members: &[Member], job_ids: &mut BTreeMap<String, String>) -> Vec<(u32, String)> {
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, m) in members.iter().enumerate() {
        groups.entry(&m.key).or_default().push(i);
    }
    let keys: Vec<String> = groups.keys().map(ToString::to_string).collect();
    let key_refs: Vec<&String> = keys.iter().collect();
    let mut named = vec![(0, String::new()); members.len()];
    for (key, mut group) in groups {
        let sort_key = |i: &usize| (members[*i].rank.unwrap_or(u32::MAX), members[*i].pid);
        group.sort_by_key(sort_key);
        let first_free = group
            .iter()
            .filter_map(|i| members[*i].rank)
            .map(|r| r + 1)
            .max()
            .unwrap_or(0);
        let mut next = first_free..;
        let mut ranks: Vec<(u32, usize)> = group
            .iter()
            .map(|&i| {
                (
                    members[i]
                        .rank
                        .unwrap_or_else(|| next.next().unwrap_or(u32::MAX)),
                    i,
                )
            })
            .collect();
        ranks.sort_unstable();
        let job = match batch_job_id(key, &key_refs) {
            Some(batch) => batch,
            None => {
                if let Some(id) = job_ids.get(key) {
                    id.clone()
                } else {
                    let first = ranks.first().map_or_else(
                        || "0".into(),
                        |(_, i)| unused_id(members[*i].pid.to_string(), key, job_ids),
                    );
                    let rank0_known = ranks
                        .first()
                        .is_some_and(|(r, i)| members[*i].rank.is_some() && *r == 0);
                    if rank0_known || group.iter().all(|i| members[*i].rank.is_none()) {
                        job_ids.insert(key.to_string(), first.clone());
                    }
                    first
                }
            }
        };
        for (rank, i) in ranks {
            named[i] = (rank, job.clone());
        }
    }
    named
}

/// Orders ranks by job and rank, fills in what the environment did not say (ranks, job
/// ids: see [`name_jobs`]), and adds the probe summary. `ranks[].job` holds the job key on
/// entry.
fn assemble(
    mut ranks: Vec<RankProfile>,
    probes: &Probes,
    not_profiled: Vec<String>,
    job_ids: &mut BTreeMap<String, String>,
) -> JobProfile {
    let members: Vec<Member> = ranks
        .iter()
        .map(|r| Member {
            key: r.job.clone(),
            rank: r.rank_known.then_some(r.rank),
            pid: r.pid,
        })
        .collect();
    for (r, (rank, job)) in ranks.iter_mut().zip(name_jobs(&members, job_ids)) {
        r.rank = rank;
        r.job = job;
    }
    ranks.sort_by(|a, b| (a.job.as_str(), a.rank).cmp(&(b.job.as_str(), b.rank)));
    let libraries = library_summaries(probes);
    let totals = JobTotals::of(&ranks);
    let mut profile = JobProfile {
        schema: SCHEMA.into(),
        job: String::new(),
        dropped: 0,
        undecoded: 0,
        ranks,
        libraries,
        unsupported_libraries: probes.unsupported(),
        not_profiled,
        call_events: probes.call_events(),
        skew: None,
        timeline: None,
    };
    // One job: its id; several (a node daemon's view): empty, each rank says its own.
    profile.set_totals(totals);
    profile
}

/// The probed libraries as the report shows them.
pub fn library_summaries(probes: &Probes) -> Vec<ProbedLibrary> {
    probes
        .libraries()
        .map(|l| ProbedLibrary {
            path: l.library.path.clone(),
            flavor: l.library.flavor.clone(),
            probes: probed_routines(&l.library),
            moved_past_single_step: names_with(l, Placement::MovedPastSingleStep),
            single_stepped: names_with(l, Placement::SingleStepped),
            failed: l.failed.clone(),
            uprobe_sessions: l.through_sessions,
        })
        .collect()
}

/// The routines a library's probes serve: one a probe, but for Fortran bindings, several
/// of which (`mpi_allreduce_`, `mpi_allreduce_f08ts_` ...) bind one routine.
fn probed_routines(l: &crate::symbols::Library) -> usize {
    if l.fortran_bindings {
        let routines: std::collections::BTreeSet<u16> =
            l.probes.iter().map(|p| p.routine).collect();
        routines.len()
    } else {
        l.probes.len()
    }
}

fn names_with(l: &AttachedLibrary, p: Placement) -> Vec<String> {
    counted_names(
        l.library
            .probes
            .iter()
            .filter(|x| x.placement == p)
            .map(|x| x.name),
    )
}

/// Names in first-seen order, each once: a libfabric library has one probe per provider
/// function, named by its ops-table slot, so one slot's name stands for many functions
/// ("fi_msg_send (12 functions)").
fn counted_names<'a>(names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for name in names {
        match seen.iter_mut().find(|(n, _)| *n == name) {
            Some((_, count)) => *count += 1,
            None => seen.push((name, 1)),
        }
    }
    seen.into_iter()
        .map(|(name, count)| match count {
            1 => name.to_string(),
            n => format!("{name} ({n} functions)"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{batch_job_id, counted_names, job_key, name_jobs, Member};
    use super::{call_sites, stats, CallSite, SiteFiles, SiteKey, SiteVal};
    use crate::discover::ProcessInfo;

    /// A site's calls now and in an earlier span watched are one site; its sampled time is
    /// estimated from its timed calls; past the cap, the sites with the least time are left
    /// out and counted.
    #[test]
    fn call_sites_add_their_earlier_spans_and_keep_the_busiest() {
        let routine = collector_common::ROUTINES
            .iter()
            .position(|r| r.name == "MPI_Allreduce")
            .expect("MPI_Allreduce") as u16;
        let key = |site| SiteKey {
            tgid: 7,
            routine,
            _pad: 0,
            site,
        };
        let mut read = vec![(
            key(0x10),
            SiteVal {
                calls: 4,
                bytes: 32,
                timed: 1,
                time_ns: 100,
            },
        )];
        // Another process's site is not this one's.
        read.push((
            SiteKey {
                tgid: 8,
                ..key(0x10)
            },
            SiteVal::default(),
        ));
        let earlier = CallSite {
            routine: "MPI_Allreduce".into(),
            address: "0x10".into(),
            totals: stats::Totals {
                calls: 3,
                bytes: 24,
                time_ns: 50,
            },
            timed_calls: 3,
            ..CallSite::default()
        };
        let mut files = SiteFiles::default();
        let (sites, left_out) = call_sites(7, &read, &[], &[earlier], &mut files);
        assert_eq!(left_out, 0);
        assert_eq!(sites.len(), 1, "{sites:?}");
        assert_eq!(
            (sites[0].totals, sites[0].timed_calls),
            (
                stats::Totals {
                    calls: 7,
                    bytes: 56,
                    time_ns: 400 + 50
                },
                4
            )
        );
        let cap = crate::profile::MAX_CALL_SITES;
        let many: Vec<_> = (0..cap as u64 + 3)
            .map(|i| {
                (
                    key(0x1000 + i),
                    SiteVal {
                        calls: 1,
                        bytes: 0,
                        timed: 1,
                        time_ns: i,
                    },
                )
            })
            .collect();
        let (sites, left_out) = call_sites(7, &many, &[], &[], &mut files);
        assert_eq!((sites.len(), left_out), (cap, 3));
        // Those with the least time went.
        assert!(sites.iter().all(|s| s.totals.time_ns >= 3));
    }

    #[test]
    fn jobs_and_unsaid_ranks_are_named_from_identities_alone() {
        let m = |key: &str, rank, pid| Member {
            key: key.into(),
            rank,
            pid,
        };
        let members = [
            m("launcher:a", Some(1), 20),
            m("launcher:a", Some(0), 30),
            m("", None, 9),
            m("", None, 5),
            m("batch:77", None, 40),
            m("claim:0:77", None, 41),
        ];
        let mut ids = std::collections::BTreeMap::new();
        let named = name_jobs(&members, &mut ids);
        let want: Vec<(u32, String)> = [
            (1, "30"),
            (0, "30"),
            (1, "5"),
            (0, "5"),
            (0, "77"),
            (0, "77.u0"),
        ]
        .into_iter()
        .map(|(r, j)| (r, j.to_string()))
        .collect();
        assert_eq!(named, want);
        assert_eq!(ids.get("launcher:a").map(String::as_str), Some("30"));
    }

    /// A job whose rank 0 was given the pid of an earlier job's rank 0 (exited, its profile
    /// kept) is named apart from it, and keeps that name; so is a third.
    #[test]
    fn a_job_whose_rank_0_has_an_earlier_jobs_pid_is_named_apart() {
        let m = |key: &str, rank, pid| Member {
            key: key.into(),
            rank,
            pid,
        };
        let mut ids = std::collections::BTreeMap::new();
        let first = [m("launcher:a", Some(0), 30), m("launcher:a", Some(1), 31)];
        assert_eq!(name_jobs(&first, &mut ids)[0].1, "30");
        let later = [
            m("launcher:a", Some(0), 30),
            m("launcher:b", Some(0), 30),
            m("launcher:b", Some(1), 44),
            m("launcher:c", Some(0), 30),
        ];
        let named: Vec<String> = name_jobs(&later, &mut ids)
            .into_iter()
            .map(|(_, job)| job)
            .collect();
        assert_eq!(named, ["30", "30.2", "30.2", "30.3"]);
        assert_eq!(name_jobs(&later[1..3], &mut ids)[0].1, "30.2");
        // A process no launcher named, named after itself, that then execs a job's rank 0.
        let mut ids = std::collections::BTreeMap::new();
        assert_eq!(name_jobs(&[m("", None, 50)], &mut ids)[0].1, "50");
        assert_eq!(
            name_jobs(&[m("launcher:d", Some(0), 50)], &mut ids)[0].1,
            "50"
        );
    }

    #[test]
    fn a_claimed_job_id_never_joins_another_users_job() {
        let info = |uid, job: &str, from_cgroup| ProcessInfo {
            uid: Some(uid),
            batch_job: Some(job.to_string()),
            batch_job_from_cgroup: from_cgroup,
            ..Default::default()
        };
        let real = job_key(&info(1000, "77", true));
        let claim = job_key(&info(1001, "77", false));
        let own_claim = job_key(&info(1000, "88", false));
        assert_ne!(real, claim);
        let keys = [&real, &claim, &own_claim];
        assert_eq!(batch_job_id(&real, &keys).as_deref(), Some("77"));
        assert_eq!(batch_job_id(&claim, &keys).as_deref(), Some("77.u1001"));
        // Alone with its id (no Slurm cgroups here: tests, PBS): shown as it is.
        assert_eq!(batch_job_id(&own_claim, &keys).as_deref(), Some("88"));
        assert_eq!(batch_job_id("launcher:x", &keys), None);
    }

    #[test]
    fn probe_names_are_listed_once_with_their_count() {
        let names = [
            "fi_msg_send",
            "MPI_Test",
            "fi_msg_send",
            "fi_msg_recv",
            "fi_msg_send",
        ];
        assert_eq!(
            counted_names(names.into_iter()),
            ["fi_msg_send (3 functions)", "MPI_Test", "fi_msg_recv"]
        );
    }
}
