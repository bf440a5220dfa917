//! Round trips through the wire form, on a profile with every field set.

use collector_common::{CounterKey, CounterVal, DurationHist, UNKNOWN_BUCKET};

use super::*;
use crate::{
    skew::summary::{LateRank, Quantiles, RankRoutineSkew, RankSkew, RoutineSkew, WorstInstance},
    stats::routines_of,
};

pub(crate) fn sample() -> JobProfile {
    let key =
        |routine: &str, bucket, comm_size| crate::stats::tests::key(7, routine, bucket, comm_size);
    let counters = vec![
        (
            key("MPI_Allreduce", 2, 4),
            CounterVal {
                calls: 10,
                bytes: 80,
                time_ns: 100,
                min_ns: 100,
                max_ns: 3000,
                // Its time sampled: 6 calls timed.
                untimed: 4,
            },
            {
                let mut h = DurationHist::default();
                h.calls[0] = 1;
                h.calls[3] = 5;
                h
            },
        ),
        (
            key("MPI_Send", UNKNOWN_BUCKET, 4),
            CounterVal {
                calls: 3,
                bytes: 0,
                time_ns: 3,
                ..CounterVal::default()
            },
            DurationHist::default(),
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
                ..CounterVal::default()
            },
            DurationHist::default(),
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
            container: Some(Box::new(crate::discover::container::Container {
                pid: 3,
                cgroup: "/system.slice/docker-ab.scope".into(),
                id: Some("ab".into()),
            })),
            region: Some(Box::new(crate::profile::RegionProfile {
                intervals: 2,
                elapsed_ns: 3,
                comm_time_ns: 2,
                late_bounds: 1,
                routines: routines_of(7, &counters[..1], &[]),
                peers: vec![crate::stats::PeerTraffic {
                    peer: Some(1),
                    sent_calls: 1,
                    sent_bytes: 8,
                    ..Default::default()
                }],
            })),
            probe_call_cost: Some(crate::profile::CallCost::with_program(123, 4_567)),
            usage: Some(crate::profile::Usage {
                user_ns: 1_500_000_000,
                system_ns: 250_000_000,
                max_rss_bytes: 64 << 20,
                context_switches: Some(1234),
                at_exit: true,
            }),
            settings: [("NCCL_ALGO", "Ring"), ("UCX_TLS", "rc,sm")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            call_sites: vec![crate::profile::CallSite {
                routine: "MPI_Allreduce".into(),
                address: "0x401136".into(),
                object: Some("/home/u/app".into()),
                function: Some("negotiate".into()),
                offset: 0x1c,
                file_address: Some("0x113c".into()),
                totals: crate::stats::Totals {
                    calls: 40,
                    bytes: 320,
                    time_ns: 12_000,
                },
                timed_calls: 10,
                source_file: Some("/home/u/src/app.c".into()),
                source_line: Some(31),
            }],
            call_sites_left_out: 3,
            ended: Some(crate::profile::Ending {
                signal: Some(9),
                core_dumped: true,
                at_unix_ns: Some(1_700_000_000_000_000_000),
                inside: Some(crate::profile::InCall {
                    routine: "MPI_Barrier".into(),
                    for_ns: 12_000_000_000,
                    thread: 4242,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            in_call: Some(crate::profile::InCall {
                routine: "MPI_Allreduce".into(),
                for_ns: 7_000_000_000,
                thread: 4242,
                before_attach: true,
                called_from: Some("main+0x65 at app.c:38 (app)".into()),
            }),
            in_call_unknown: true,
            mpi_transport: Some("pml cm, mtl ofi".to_string()),
            start_ticks: 99,
            exited: true,
            detached: false,
            unwatched_ns: 0,
            world_size: None,
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
                    ..Default::default()
                },
                crate::stats::PeerTraffic {
                    peer: Some(3),
                    comm: Some("0badcafe".into()),
                    sent_calls: 1,
                    sent_bytes: 4,
                    ..Default::default()
                },
                crate::stats::PeerTraffic {
                    peer: None,
                    received_calls: 1,
                    received_bytes: 8,
                    ..Default::default()
                },
            ],
            comm_ranks: vec![crate::stats::CommRank {
                comm: "0badcafe".into(),
                rank: 2,
            }],
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
            sampled: 7,
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
            late_sender: Some(crate::skew::late_sender::LateSenderReport {
                pairs: vec![crate::skew::late_sender::LateSenderPair {
                    receiver: 0,
                    receiver_host: "n1".into(),
                    sender: 1,
                    sender_host: "n2".into(),
                    messages: 9,
                    late: 4,
                    wait_ns: 77,
                }],
                late_receivers: vec![crate::skew::late_sender::LateSenderPair {
                    receiver: 1,
                    receiver_host: "n2".into(),
                    sender: 0,
                    sender_host: "n1".into(),
                    messages: 3,
                    late: 2,
                    wait_ns: 55,
                }],
                not_numbered: crate::trace::flows::Unlinked {
                    not_from_init: 1,
                    after_unresolved_wildcard: 2,
                    communicator_unknown: 3,
                    too_many_channels: 4,
                    persistent_channel: 6,
                },
                unpaired: 5,
            }),
        }),
        timeline: None,
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
