//! Domain types <-> wire types. Conversions happen here, at the API boundary only; a
//! message from the wire that does not make sense is refused with a reason.

mod skew;

use super::pb;
use crate::{
    discover::{container::Container, Fabric},
    profile::{
        CallCost, CallSite, Ending, InCall, JobProfile, ProbedLibrary, RankProfile, RegionProfile,
        Usage,
    },
    skew::SkewReport,
    stats::{
        CommRank, CommStats, DeviceTime, Durations, Health, PeerTraffic, RoutineStats, Routines,
        SampledTime, SizeBucket, Totals,
    },
};

/// A wire message that cannot be turned into a domain value.
#[derive(Debug, thiserror::Error)]
#[error("invalid {what}: {why}")]
pub struct InvalidMessage {
    /// Which message.
    pub what: &'static str,
    /// What is wrong with it.
    pub why: String,
}

fn invalid(what: &'static str, why: impl Into<String>) -> InvalidMessage {
    InvalidMessage {
        what,
        why: why.into(),
    }
}

/// `From` both ways between a domain struct and its wire message whose fields match one to
/// one: `copy` fields are copied, `clone` fields cloned, `each` fields (lists) converted item
/// by item, `cast` fields converted between integer widths.
macro_rules! mirror {
    ($a:ty, $b:ty; copy [$($c:ident),*] clone [$($k:ident),*] each [$($e:ident),*] cast [$($n:ident),*]) => {
        mirror!(@to $a, $b; [$($c),*] [$($k),*] [$($e),*] [$($n),*]);
        mirror!(@to $b, $a; [$($c),*] [$($k),*] [$($e),*] [$($n),*]);
    };
    (@to $from:ty, $to:ty; [$($c:ident),*] [$($k:ident),*] [$($e:ident),*] [$($n:ident),*]) => {
        impl From<&$from> for $to {
            fn from(x: &$from) -> Self {
                Self {
                    $($c: x.$c,)*
                    $($k: x.$k.clone(),)*
                    $($e: x.$e.iter().map(Into::into).collect(),)*
                    $($n: x.$n as _,)*
                }
            }
        }
    };
}
use mirror;

mirror!(Totals, pb::Totals; copy [calls, bytes, time_ns] clone [] each [] cast []);
mirror!(DeviceTime, pb::DeviceTime; copy [calls, bytes, time_ns, bus_bytes] clone [] each [] cast []);
mirror!(Fabric, pb::Fabric; copy [] clone [provider, name] each [] cast []);
mirror!(Container, pb::Container; copy [pid] clone [cgroup, id] each [] cast []);
mirror!(PeerTraffic, pb::PeerTraffic;
    copy [peer, sent_calls, sent_bytes, received_calls, received_bytes] clone [comm] each [] cast []);
mirror!(CommRank, pb::CommRank; copy [rank] clone [comm] each [] cast []);
mirror!(ProbedLibrary, pb::ProbedLibrary;
    copy [uprobe_sessions] clone [path, flavor, moved_past_single_step, single_stepped, failed] each [] cast [probes]);

/// A size bucket's number from the wire, if it has one.
fn bucket(v: Option<u32>, what: &'static str) -> Result<Option<u8>, InvalidMessage> {
    v.map(|v| u8::try_from(v).map_err(|_| invalid(what, format!("bucket {v} out of range"))))
        .transpose()
}

fn totals(t: Option<&pb::Totals>, what: &'static str) -> Result<Totals, InvalidMessage> {
    t.map(Totals::from)
        .ok_or_else(|| invalid(what, "missing totals"))
}

impl From<&Durations> for pb::Durations {
    fn from(d: &Durations) -> Self {
        let mut buckets = d.buckets();
        let first = buckets.next();
        pb::Durations {
            min_ns: d.min_ns,
            max_ns: d.max_ns,
            first: first.map_or(0, |(b, _)| b as u32),
            calls: first
                .map(|(_, n)| n)
                .into_iter()
                .chain(buckets.map(|(_, n)| n))
                .collect(),
        }
    }
}

/// Durations from the wire: within the kernel's buckets.
fn durations(d: Option<&pb::Durations>) -> Result<Option<Durations>, InvalidMessage> {
    let Some(d) = d else { return Ok(None) };
    let first = d.first as usize;
    if first + d.calls.len() > collector_common::DURATION_BUCKETS {
        return Err(invalid(
            "Durations",
            format!(
                "buckets {first}..{} past the last, {}",
                first + d.calls.len(),
                collector_common::DURATION_BUCKETS - 1
            ),
        ));
    }
    Ok(Durations::from_buckets(
        d.min_ns,
        d.max_ns,
        d.calls.iter().enumerate().map(|(i, &n)| (first + i, n)),
    ))
}

/// The wire form of [`Health`] and back, from the kernel's list of its counters and the
/// userspace counts.
macro_rules! health_wire {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        impl From<&Health> for pb::Health {
            fn from(h: &Health) -> Self {
                pb::Health {
                    events: h.events,
                    fabric_unresolved: h.fabric_unresolved,
                    peers_folded: h.peers_folded,
                    $( $name: h.$name, )*
                }
            }
        }

        impl From<&pb::Health> for Health {
            fn from(h: &pb::Health) -> Self {
                Health {
                    events: h.events,
                    fabric_unresolved: h.fabric_unresolved,
                    peers_folded: h.peers_folded,
                    $( $name: h.$name, )*
                }
            }
        }
    };
}
collector_common::kernel_health_counters!(health_wire);

impl From<&SampledTime> for pb::SampledTime {
    fn from(s: &SampledTime) -> Self {
        pb::SampledTime {
            timed_calls: s.timed_calls,
            error_ns: s.error_ns,
        }
    }
}

impl From<&pb::SampledTime> for SampledTime {
    fn from(s: &pb::SampledTime) -> Self {
        SampledTime {
            timed_calls: s.timed_calls,
            error_ns: s.error_ns,
        }
    }
}

fn routine_to_pb(name: &str, r: &RoutineStats) -> pb::RoutineStats {
    pb::RoutineStats {
        name: name.to_string(),
        totals: Some((&r.totals).into()),
        undecoded_calls: r.undecoded_calls,
        durations: r.durations.as_ref().map(Into::into),
        sampled_time: r.sampled_time.as_ref().map(Into::into),
        sizes: r
            .sizes
            .iter()
            .map(|b| pb::SizeBucket {
                bucket: b.bucket.map(u32::from),
                min_bytes: b.min_bytes,
                max_bytes: b.max_bytes,
                totals: Some((&b.totals).into()),
                device: b.device.as_ref().map(Into::into),
                durations: b.durations.as_ref().map(Into::into),
                sampled_time: b.sampled_time.as_ref().map(Into::into),
            })
            .collect(),
        comm_sizes: r.comm_sizes.iter().map(|(k, v)| (*k, *v)).collect(),
        communicators: r
            .communicators
            .iter()
            .map(|c| pb::CommunicatorStats {
                id: c.id.clone().unwrap_or_default(),
                size: c.size,
                rank: (c.rank >= 0).then_some(c.rank),
                totals: Some((&c.totals).into()),
            })
            .collect(),
        called_from: r
            .called_from
            .iter()
            .map(|(k, v)| (k.clone(), v.into()))
            .collect(),
        endpoints: r
            .endpoints
            .iter()
            .map(|(k, v)| (k.clone(), v.into()))
            .collect(),
    }
}

fn routine_from_pb(r: &pb::RoutineStats) -> Result<(String, RoutineStats), InvalidMessage> {
    if r.name.is_empty() {
        return Err(invalid("RoutineStats", "empty name"));
    }
    let mut sizes = Vec::with_capacity(r.sizes.len());
    for b in &r.sizes {
        sizes.push(SizeBucket {
            bucket: bucket(b.bucket, "SizeBucket")?,
            min_bytes: b.min_bytes,
            max_bytes: b.max_bytes,
            totals: totals(b.totals.as_ref(), "SizeBucket")?,
            durations: durations(b.durations.as_ref())?,
            sampled_time: b.sampled_time.as_ref().map(Into::into),
            device: b.device.as_ref().map(Into::into),
        });
    }
    let mut communicators = Vec::with_capacity(r.communicators.len());
    for c in &r.communicators {
        communicators.push(CommStats {
            id: (!c.id.is_empty()).then(|| c.id.clone()),
            size: c.size,
            rank: c.rank.unwrap_or(-1),
            totals: totals(c.totals.as_ref(), "CommunicatorStats")?,
        });
    }
    Ok((
        r.name.clone(),
        RoutineStats {
            totals: totals(r.totals.as_ref(), "RoutineStats")?,
            undecoded_calls: r.undecoded_calls,
            durations: durations(r.durations.as_ref())?,
            sampled_time: r.sampled_time.as_ref().map(Into::into),
            sizes,
            comm_sizes: r.comm_sizes.iter().map(|(k, v)| (*k, *v)).collect(),
            communicators,
            called_from: r
                .called_from
                .iter()
                .map(|(k, v)| (k.clone(), Totals::from(v)))
                .collect(),
            endpoints: r
                .endpoints
                .iter()
                .map(|(k, v)| (k.clone(), Totals::from(v)))
                .collect(),
        },
    ))
}

/// Checks a rank from the wire without converting it (the aggregator keeps snapshots in
/// their wire form): what `RankProfile::try_from` would refuse, this refuses.
pub fn check_rank(r: &pb::RankProfile) -> Result<(), InvalidMessage> {
    for routine in &r.routines {
        if routine.name.is_empty() {
            return Err(invalid("RoutineStats", "empty name"));
        }
        totals(routine.totals.as_ref(), "RoutineStats")?;
        durations(routine.durations.as_ref())?;
        for b in &routine.sizes {
            bucket(b.bucket, "SizeBucket")?;
            totals(b.totals.as_ref(), "SizeBucket")?;
            durations(b.durations.as_ref())?;
        }
        for c in &routine.communicators {
            totals(c.totals.as_ref(), "CommunicatorStats")?;
        }
    }
    Ok(())
}

/// A routine table on the wire (a rank's, or its region's).
fn routines_to_pb(routines: &Routines) -> Vec<pb::RoutineStats> {
    routines.iter().map(|(n, s)| routine_to_pb(n, s)).collect()
}

/// A routine table from the wire.
fn routines_from_pb(routines: &[pb::RoutineStats]) -> Result<Routines, InvalidMessage> {
    routines.iter().map(routine_from_pb).collect()
}

impl From<&RegionProfile> for pb::RegionProfile {
    fn from(g: &RegionProfile) -> Self {
        pb::RegionProfile {
            intervals: g.intervals,
            elapsed_ns: g.elapsed_ns,
            comm_time_ns: g.comm_time_ns,
            late_bounds: g.late_bounds,
            routines: routines_to_pb(&g.routines),
            peers: g.peers.iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<&pb::RegionProfile> for RegionProfile {
    type Error = InvalidMessage;

    fn try_from(g: &pb::RegionProfile) -> Result<Self, Self::Error> {
        Ok(RegionProfile {
            intervals: g.intervals,
            elapsed_ns: g.elapsed_ns,
            comm_time_ns: g.comm_time_ns,
            late_bounds: g.late_bounds,
            routines: routines_from_pb(&g.routines)?,
            peers: g.peers.iter().map(Into::into).collect(),
        })
    }
}

impl From<&RankProfile> for pb::RankProfile {
    fn from(r: &RankProfile) -> Self {
        pb::RankProfile {
            rank: r.rank,
            rank_source: if r.rank_known {
                pb::RankSource::Launcher
            } else {
                pb::RankSource::Discovery
            } as i32,
            pid: r.pid,
            host: r.host.clone(),
            job: r.job.clone(),
            cmdline: r.cmdline.clone(),
            elapsed_ns: r.elapsed_ns,
            comm_time_ns: r.comm_time_ns,
            routines: routines_to_pb(&r.routines),
            health: Some((&r.health).into()),
            uid: r.uid,
            start_ticks: r.start_ticks,
            exited: r.exited,
            detached: r.detached,
            unwatched_ns: r.unwatched_ns,
            world_size: r.world_size,
            fabrics: r.fabrics.iter().map(Into::into).collect(),
            mpi_transport: r.mpi_transport.clone(),
            peers: r.peers.iter().map(Into::into).collect(),
            comm_ranks: r.comm_ranks.iter().map(Into::into).collect(),
            container: r.container.as_deref().map(|c| Box::new(c.into())),
            region: r.region.as_deref().map(|g| Box::new(g.into())),
            probe_call_cost: r.probe_call_cost.map(|c| pb::ProbeCallCost {
                entry_ns: c.entry_ns,
                return_ns: c.return_ns,
                program_ns: c.program_ns,
                measured_runs: c.measured_runs,
            }),
            usage: r.usage.map(|u| pb::Usage {
                user_ns: u.user_ns,
                system_ns: u.system_ns,
                max_rss_bytes: u.max_rss_bytes,
                context_switches: u.context_switches,
                at_exit: u.at_exit,
            }),
            settings: r.settings.clone().into_iter().collect(),
            call_sites: r.call_sites.iter().map(Into::into).collect(),
            call_sites_left_out: r.call_sites_left_out,
            ended: r.ended.as_ref().map(|e| pb::Ending {
                status: e.status.map(u32::from),
                signal: e.signal.map(u32::from),
                core_dumped: e.core_dumped,
                at_unix_ns: e.at_unix_ns,
                inside: e.inside.as_ref().map(Into::into),
            }),
            in_call: r.in_call.as_ref().map(Into::into),
            in_call_unknown: r.in_call_unknown,
        }
    }
}

/// A node's word on how a process ended, bounded: a status or signal out of range is
/// dropped, a routine's name cut.
fn ending(e: &pb::Ending) -> Ending {
    let byte = |v: Option<u32>| v.and_then(|v| u8::try_from(v).ok());
    Ending {
        status: byte(e.status),
        signal: byte(e.signal),
        core_dumped: e.core_dumped,
        at_unix_ns: e.at_unix_ns,
        inside: e.inside.as_ref().map(in_call),
    }
}

impl From<&InCall> for pb::InCall {
    fn from(c: &InCall) -> Self {
        pb::InCall {
            routine: c.routine.clone(),
            for_ns: c.for_ns,
            thread: c.thread,
            before_attach: c.before_attach,
            called_from: c.called_from.clone(),
        }
    }
}

/// A node's word on a call in progress, its routine's name cut.
fn in_call(c: &pb::InCall) -> InCall {
    InCall {
        routine: c.routine.chars().take(64).collect(),
        for_ns: c.for_ns,
        thread: c.thread,
        before_attach: c.before_attach,
        called_from: c
            .called_from
            .as_deref()
            .map(|s| crate::symbols::shown(s, 1024)),
    }
}

impl From<&CallSite> for pb::CallSite {
    fn from(c: &CallSite) -> Self {
        pb::CallSite {
            routine: c.routine.clone(),
            address: c.address.clone(),
            object: c.object.clone(),
            function: c.function.clone(),
            offset: c.offset,
            file_address: c.file_address.clone(),
            totals: Some((&c.totals).into()),
            timed_calls: c.timed_calls,
            source_file: c.source_file.clone(),
            source_line: c.source_line,
        }
    }
}

/// A node's call sites, bounded again as the node bounds them.
fn call_sites(sites: &[pb::CallSite]) -> Result<Vec<CallSite>, InvalidMessage> {
    let cut = |s: &str, n: usize| s.chars().take(n).collect::<String>();
    sites
        .iter()
        .take(crate::profile::MAX_CALL_SITES)
        .map(|c| {
            Ok(CallSite {
                routine: cut(&c.routine, 64),
                address: cut(&c.address, 32),
                object: c
                    .object
                    .as_deref()
                    .map(|o| cut(o, crate::symbols::MAX_PATH)),
                function: c.function.as_deref().map(|f| cut(f, 256)),
                offset: c.offset,
                file_address: c.file_address.as_deref().map(|a| cut(a, 32)),
                totals: totals(c.totals.as_ref(), "CallSite")?,
                timed_calls: c.timed_calls,
                source_file: c
                    .source_file
                    .as_deref()
                    .map(|f| cut(f, crate::symbols::MAX_PATH)),
                source_line: c.source_line,
            })
        })
        .collect()
}

impl TryFrom<&pb::RankProfile> for RankProfile {
    type Error = InvalidMessage;

    fn try_from(r: &pb::RankProfile) -> Result<Self, Self::Error> {
        Ok(RankProfile {
            rank: r.rank,
            rank_known: r.rank_source() == pb::RankSource::Launcher,
            pid: r.pid,
            host: r.host.clone(),
            job: r.job.clone(),
            cmdline: r.cmdline.clone(),
            elapsed_ns: r.elapsed_ns,
            comm_time_ns: r.comm_time_ns,
            routines: routines_from_pb(&r.routines)?,
            health: r.health.as_ref().map(Health::from).unwrap_or_default(),
            uid: r.uid,
            container: r.container.as_deref().map(|c| Box::new(c.into())),
            region: r
                .region
                .as_deref()
                .map(|g| RegionProfile::try_from(g).map(Box::new))
                .transpose()?,
            start_ticks: r.start_ticks,
            exited: r.exited,
            detached: r.detached,
            unwatched_ns: r.unwatched_ns,
            world_size: r.world_size,
            fabrics: r.fabrics.iter().map(Into::into).collect(),
            mpi_transport: r.mpi_transport.clone(),
            peers: r.peers.iter().map(Into::into).collect(),
            comm_ranks: r
                .comm_ranks
                .iter()
                .take(crate::stats::MAX_COMM_RANKS)
                .map(Into::into)
                .collect(),
            probe_call_cost: r.probe_call_cost.map(|c| CallCost {
                entry_ns: c.entry_ns,
                return_ns: c.return_ns,
                program_ns: c.program_ns,
                measured_runs: c.measured_runs,
            }),
            usage: r.usage.map(|u| Usage {
                user_ns: u.user_ns,
                system_ns: u.system_ns,
                max_rss_bytes: u.max_rss_bytes,
                context_switches: u.context_switches,
                at_exit: u.at_exit,
            }),
            // A node's word, bounded again as the node bounds it.
            settings: crate::discover::settings_of(
                r.settings.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            ),
            call_sites: call_sites(&r.call_sites)?,
            call_sites_left_out: r.call_sites_left_out.saturating_add(
                r.call_sites
                    .len()
                    .saturating_sub(crate::profile::MAX_CALL_SITES) as u64,
            ),
            ended: r.ended.as_ref().map(ending),
            in_call: r.in_call.as_ref().map(in_call),
            in_call_unknown: r.in_call_unknown,
        })
    }
}

impl From<&JobProfile> for pb::JobProfile {
    fn from(j: &JobProfile) -> Self {
        pb::JobProfile {
            schema: j.schema.clone(),
            job: j.job.clone(),
            ranks: j.ranks.iter().map(Into::into).collect(),
            dropped: j.dropped,
            undecoded: j.undecoded,
            libraries: j.libraries.iter().map(Into::into).collect(),
            unsupported_libraries: j.unsupported_libraries.clone(),
            not_profiled: j.not_profiled.clone(),
            call_events: j.call_events,
            skew: j.skew.as_ref().map(Into::into),
        }
    }
}

impl TryFrom<&pb::JobProfile> for JobProfile {
    type Error = InvalidMessage;

    fn try_from(j: &pb::JobProfile) -> Result<Self, Self::Error> {
        Ok(JobProfile {
            schema: j.schema.clone(),
            job: j.job.clone(),
            ranks: j
                .ranks
                .iter()
                .map(RankProfile::try_from)
                .collect::<Result<_, _>>()?,
            dropped: j.dropped,
            undecoded: j.undecoded,
            libraries: j.libraries.iter().map(Into::into).collect(),
            unsupported_libraries: j.unsupported_libraries.clone(),
            not_profiled: j.not_profiled.clone(),
            call_events: j.call_events,
            skew: j.skew.as_ref().map(SkewReport::try_from).transpose()?,
            // Made by `record` only (daemons do not keep per-call history).
            timeline: None,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
