//! Domain types <-> wire types. Conversions happen here, at the API boundary only; a
//! message from the wire that does not make sense is refused with a reason.

use super::pb;
use crate::{
    profile::{JobProfile, ProbedLibrary, RankProfile},
    skew::summary::{LateRank, Quantiles, RankRoutineSkew, RankSkew, RoutineSkew, WorstInstance},
    skew::SkewReport,
    stats::{CommStats, DeviceTime, Health, RoutineStats, SizeBucket, Totals},
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

impl From<&Totals> for pb::Totals {
    fn from(t: &Totals) -> Self {
        pb::Totals {
            calls: t.calls,
            bytes: t.bytes,
            time_ns: t.time_ns,
        }
    }
}

impl From<&pb::Totals> for Totals {
    fn from(t: &pb::Totals) -> Self {
        Totals {
            calls: t.calls,
            bytes: t.bytes,
            time_ns: t.time_ns,
        }
    }
}

fn totals(t: Option<&pb::Totals>, what: &'static str) -> Result<Totals, InvalidMessage> {
    t.map(Totals::from)
        .ok_or_else(|| invalid(what, "missing totals"))
}

/// The wire form of [`Health`] and back, from the one list of its counters.
macro_rules! health_wire {
    ($( $(#[$doc:meta])* $name:ident <- $src:ident ),* $(,)?) => {
        impl From<&Health> for pb::Health {
            fn from(h: &Health) -> Self {
                pb::Health { $( $name: h.$name, )* }
            }
        }

        impl From<&pb::Health> for Health {
            fn from(h: &pb::Health) -> Self {
                Health { $( $name: h.$name, )* }
            }
        }
    };
}
crate::stats::health_counters!(health_wire);

fn routine_to_pb(name: &str, r: &RoutineStats) -> pb::RoutineStats {
    pb::RoutineStats {
        name: name.to_string(),
        totals: Some((&r.totals).into()),
        undecoded_calls: r.undecoded_calls,
        sizes: r
            .sizes
            .iter()
            .map(|b| pb::SizeBucket {
                bucket: b.bucket.map(u32::from),
                min_bytes: b.min_bytes,
                max_bytes: b.max_bytes,
                totals: Some((&b.totals).into()),
                device: b.device.map(|d| pb::DeviceTime {
                    calls: d.calls,
                    bytes: d.bytes,
                    time_ns: d.time_ns,
                    bus_bytes: d.bus_bytes,
                }),
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
        let bucket = match b.bucket {
            Some(v) => Some(
                u8::try_from(v)
                    .map_err(|_| invalid("SizeBucket", format!("bucket {v} out of range")))?,
            ),
            None => None,
        };
        sizes.push(SizeBucket {
            bucket,
            min_bytes: b.min_bytes,
            max_bytes: b.max_bytes,
            totals: totals(b.totals.as_ref(), "SizeBucket")?,
            device: b.device.map(|d| DeviceTime {
                calls: d.calls,
                bytes: d.bytes,
                time_ns: d.time_ns,
                bus_bytes: d.bus_bytes,
            }),
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
        for b in &routine.sizes {
            if let Some(v) = b.bucket {
                u8::try_from(v)
                    .map_err(|_| invalid("SizeBucket", format!("bucket {v} out of range")))?;
            }
            totals(b.totals.as_ref(), "SizeBucket")?;
        }
        for c in &routine.communicators {
            totals(c.totals.as_ref(), "CommunicatorStats")?;
        }
    }
    Ok(())
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
            routines: r
                .routines
                .iter()
                .map(|(n, s)| routine_to_pb(n, s))
                .collect(),
            health: Some((&r.health).into()),
            uid: r.uid,
            start_ticks: r.start_ticks,
            exited: r.exited,
            fabrics: r
                .fabrics
                .iter()
                .map(|f| pb::Fabric {
                    provider: f.provider.clone(),
                    name: f.name.clone(),
                })
                .collect(),
            peers: r
                .peers
                .iter()
                .map(|p| pb::PeerTraffic {
                    peer: p.peer,
                    sent_calls: p.sent_calls,
                    sent_bytes: p.sent_bytes,
                    received_calls: p.received_calls,
                    received_bytes: p.received_bytes,
                })
                .collect(),
        }
    }
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
            routines: r
                .routines
                .iter()
                .map(routine_from_pb)
                .collect::<Result<_, _>>()?,
            health: r.health.as_ref().map(Health::from).unwrap_or_default(),
            uid: r.uid,
            start_ticks: r.start_ticks,
            exited: r.exited,
            fabrics: r
                .fabrics
                .iter()
                .map(|f| crate::discover::Fabric {
                    provider: f.provider.clone(),
                    name: f.name.clone(),
                })
                .collect(),
            peers: r
                .peers
                .iter()
                .map(|p| crate::stats::PeerTraffic {
                    peer: p.peer,
                    sent_calls: p.sent_calls,
                    sent_bytes: p.sent_bytes,
                    received_calls: p.received_calls,
                    received_bytes: p.received_bytes,
                })
                .collect(),
        })
    }
}

impl From<&ProbedLibrary> for pb::ProbedLibrary {
    fn from(l: &ProbedLibrary) -> Self {
        pb::ProbedLibrary {
            path: l.path.clone(),
            flavor: l.flavor.clone(),
            probes: l.probes as u32,
            moved_past_single_step: l.moved_past_single_step.clone(),
            single_stepped: l.single_stepped.clone(),
            failed: l.failed.clone(),
        }
    }
}

impl From<&pb::ProbedLibrary> for ProbedLibrary {
    fn from(l: &pb::ProbedLibrary) -> Self {
        ProbedLibrary {
            path: l.path.clone(),
            flavor: l.flavor.clone(),
            probes: l.probes as usize,
            moved_past_single_step: l.moved_past_single_step.clone(),
            single_stepped: l.single_stepped.clone(),
            failed: l.failed.clone(),
        }
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

impl From<&SkewReport> for pb::SkewReport {
    fn from(s: &SkewReport) -> Self {
        let q = |q: &Quantiles| pb::Quantiles {
            p50: q.p50,
            p90: q.p90,
            p99: q.p99,
            max: q.max,
        };
        pb::SkewReport {
            instances: s.instances,
            incomplete: s.incomplete,
            remote: s.remote,
            within_clock_error: s.within_clock_error,
            unidentified: s.unidentified,
            unaligned: s.unaligned,
            lost: s.lost,
            ranks: s
                .ranks
                .iter()
                .map(|r| pb::RankSkew {
                    rank: r.rank,
                    host: r.host.clone(),
                    instances: r.instances,
                    last: r.last,
                    caused_ns: r.caused_ns,
                    waited_ns: r.waited_ns,
                    seq: r.seq,
                    routines: r
                        .routines
                        .iter()
                        .map(|x| pb::RankRoutineSkew {
                            routine: x.routine.clone(),
                            last: x.last,
                            caused_ns: x.caused_ns,
                            waited_ns: x.waited_ns,
                        })
                        .collect(),
                })
                .collect(),
            routines: s
                .routines
                .iter()
                .map(|r| pb::RoutineSkew {
                    routine: r.routine.clone(),
                    bucket: r.bucket.map(u32::from),
                    min_bytes: r.min_bytes,
                    max_bytes: r.max_bytes,
                    instances: r.instances,
                    skew_ns: Some(q(&r.skew_ns)),
                    transfer_ns: Some(q(&r.transfer_ns)),
                    most_last: r.most_last.as_ref().map(|l| pb::LateRank {
                        rank: l.rank,
                        host: l.host.clone(),
                        last: l.last,
                        caused_ns: l.caused_ns,
                        median_ns: l.median_ns,
                    }),
                })
                .collect(),
            worst: s
                .worst
                .iter()
                .map(|w| pb::WorstInstance {
                    routine: w.routine.clone(),
                    comm: w.comm.clone(),
                    seq: w.seq,
                    late_rank: w.late_rank,
                    host: w.host.clone(),
                    skew_ns: w.skew_ns,
                })
                .collect(),
            findings: s.findings.clone(),
        }
    }
}

impl TryFrom<&pb::SkewReport> for SkewReport {
    type Error = InvalidMessage;

    fn try_from(s: &pb::SkewReport) -> Result<Self, Self::Error> {
        let q = |q: &Option<pb::Quantiles>| {
            q.as_ref().map_or(Quantiles::default(), |q| Quantiles {
                p50: q.p50,
                p90: q.p90,
                p99: q.p99,
                max: q.max,
            })
        };
        let routines = s
            .routines
            .iter()
            .map(|r| {
                let bucket = r
                    .bucket
                    .map(|v| {
                        u8::try_from(v)
                            .ok()
                            .filter(|b| *b < collector_common::BUCKETS)
                            .ok_or_else(|| {
                                invalid("RoutineSkew", format!("bucket {v} out of range"))
                            })
                    })
                    .transpose()?;
                Ok(RoutineSkew {
                    routine: r.routine.clone(),
                    bucket,
                    min_bytes: r.min_bytes,
                    max_bytes: r.max_bytes,
                    instances: r.instances,
                    skew_ns: q(&r.skew_ns),
                    transfer_ns: q(&r.transfer_ns),
                    most_last: r.most_last.as_ref().map(|l| LateRank {
                        rank: l.rank,
                        host: l.host.clone(),
                        last: l.last,
                        caused_ns: l.caused_ns,
                        median_ns: l.median_ns,
                    }),
                })
            })
            .collect::<Result<_, InvalidMessage>>()?;
        Ok(SkewReport {
            instances: s.instances,
            incomplete: s.incomplete,
            remote: s.remote,
            within_clock_error: s.within_clock_error,
            unidentified: s.unidentified,
            unaligned: s.unaligned,
            lost: s.lost,
            ranks: s
                .ranks
                .iter()
                .map(|r| RankSkew {
                    rank: r.rank,
                    host: r.host.clone(),
                    instances: r.instances,
                    last: r.last,
                    caused_ns: r.caused_ns,
                    waited_ns: r.waited_ns,
                    seq: r.seq,
                    routines: r
                        .routines
                        .iter()
                        .map(|x| RankRoutineSkew {
                            routine: x.routine.clone(),
                            last: x.last,
                            caused_ns: x.caused_ns,
                            waited_ns: x.waited_ns,
                        })
                        .collect(),
                })
                .collect(),
            routines,
            worst: s
                .worst
                .iter()
                .map(|w| WorstInstance {
                    routine: w.routine.clone(),
                    comm: w.comm.clone(),
                    seq: w.seq,
                    late_rank: w.late_rank,
                    host: w.host.clone(),
                    skew_ns: w.skew_ns,
                })
                .collect(),
            findings: s.findings.clone(),
        })
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
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use collector_common::{CounterKey, CounterVal, UNKNOWN_BUCKET};

    use super::*;
    use crate::stats::routines_of;

    pub(crate) fn sample() -> JobProfile {
        let key = |routine: &str, bucket, comm_size| {
            crate::stats::tests::key(7, routine, bucket, comm_size)
        };
        let counters = vec![
            (
                key("MPI_Allreduce", 2, 4),
                CounterVal {
                    calls: 10,
                    bytes: 80,
                    time_ns: 100,
                },
            ),
            (
                key("MPI_Send", UNKNOWN_BUCKET, 4),
                CounterVal {
                    calls: 3,
                    bytes: 0,
                    time_ns: 3,
                },
            ),
            (
                CounterKey {
                    comm_rank: 1,
                    object: 0xfeed,
                    ..key("ncclAllReduce", 12, 2)
                },
                CounterVal {
                    calls: 2,
                    bytes: 8192,
                    time_ns: 50,
                },
            ),
        ];
        // One device-time window of both AllReduces.
        let device = vec![(counters[2].0, counters[2].1)];
        JobProfile {
            schema: crate::profile::SCHEMA.into(),
            job: "42".into(),
            ranks: vec![RankProfile {
                rank: 0,
                rank_known: true,
                pid: 7,
                host: "n1".into(),
                job: "42".into(),
                cmdline: "./app".into(),
                uid: Some(1000),
                start_ticks: 99,
                exited: true,
                elapsed_ns: 5,
                comm_time_ns: 4,
                routines: routines_of(7, &counters, &device),
                health: Health {
                    events: 13,
                    undecoded: 3,
                    ..Default::default()
                },
                fabrics: vec![crate::discover::Fabric {
                    provider: "tcp;ofi_rxm".into(),
                    name: "10.0.0.0/8".into(),
                }],
                peers: vec![
                    crate::stats::PeerTraffic {
                        peer: Some(1),
                        sent_calls: 2,
                        sent_bytes: 16,
                        received_calls: 3,
                        received_bytes: 24,
                    },
                    crate::stats::PeerTraffic {
                        peer: None,
                        received_calls: 1,
                        received_bytes: 8,
                        ..Default::default()
                    },
                ],
            }],
            dropped: 0,
            undecoded: 3,
            libraries: vec![],
            unsupported_libraries: vec!["x".into()],
            not_profiled: vec![],
            call_events: true,
            skew: Some(SkewReport {
                instances: 20,
                incomplete: 1,
                remote: 5,
                within_clock_error: 6,
                unidentified: 2,
                unaligned: 3,
                lost: 4,
                ranks: vec![RankSkew {
                    rank: 0,
                    host: "n1".into(),
                    instances: 20,
                    last: 19,
                    caused_ns: 5,
                    waited_ns: 6,
                    seq: Some(41),
                    routines: vec![RankRoutineSkew {
                        routine: "MPI_Allreduce".into(),
                        last: 19,
                        caused_ns: 5,
                        waited_ns: 6,
                    }],
                }],
                routines: vec![RoutineSkew {
                    routine: "MPI_Allreduce".into(),
                    bucket: Some(2),
                    min_bytes: Some(5),
                    max_bytes: Some(8),
                    instances: 20,
                    skew_ns: Quantiles {
                        p50: 1,
                        p90: 2,
                        p99: 3,
                        max: 4,
                    },
                    transfer_ns: Quantiles::default(),
                    most_last: Some(LateRank {
                        rank: 0,
                        host: "n1".into(),
                        last: 19,
                        caused_ns: 5,
                        median_ns: 1,
                    }),
                }],
                worst: vec![WorstInstance {
                    routine: "MPI_Allreduce".into(),
                    comm: "world".into(),
                    seq: 7,
                    late_rank: 0,
                    host: "n1".into(),
                    skew_ns: 4,
                }],
                findings: vec!["rank 0 (n1) arrived last".into()],
            }),
        }
    }

    #[test]
    fn round_trip_is_lossless() {
        let j = sample();
        let wire = pb::JobProfile::from(&j);
        let back = JobProfile::try_from(&wire).unwrap();
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&j).unwrap()
        );
    }

    #[test]
    fn nonsense_is_refused() {
        let mut wire = pb::JobProfile::from(&sample());
        wire.ranks[0].routines[0].sizes[0].bucket = Some(1000);
        assert!(JobProfile::try_from(&wire).is_err());
        wire.ranks[0].routines[0].sizes[0].bucket = Some(2);
        wire.ranks[0].routines[0].totals = None;
        assert!(JobProfile::try_from(&wire).is_err());
    }
}
