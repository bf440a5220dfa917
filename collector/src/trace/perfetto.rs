//! Perfetto's own trace format (`.pftrace`: `TracePacket`s with `TrackEvent`s), for traces
//! too large for JSON: the layout is the Chrome format's (a process per rank, a track per
//! thread, a slice per call with the same arguments), with every name interned once per
//! file, so a call costs two small packets.

use std::collections::{BTreeMap, HashMap, HashSet};

use prost::Message;

use collector_common::{buckets::RangeLabel, size_bucket};

use super::{chrome, flows::FlowEnds, Arg, ProcessName};
use crate::api::pb;

/// Perfetto's trace messages (the subset in `proto/perfetto/trace.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}

use proto::{
    debug_annotation::{NameField as ArgName, Value},
    trace_packet::{Data, SequenceFlags},
    track_event::{NameField, Type},
    DebugAnnotation, DebugAnnotationName, EventCategory, EventName, InternedData,
    ProcessDescriptor, ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent,
};

/// The one packet sequence commtap writes.
const SEQUENCE: u32 = 1;

/// The arguments of a call's slice (as [`super::slice_args`] names them) and commtap's
/// record, interned as 1, 2, 3 ... in this order.
const ARGS: [&str; 11] = [
    "bytes",
    "size",
    "peer",
    "tag",
    "recv_peer",
    "recv_tag",
    "comm_size",
    "comm_rank",
    "comm",
    "seq",
    "metadata",
];

/// The iid of argument `name`.
fn arg(name: &str) -> Option<ArgName> {
    ARGS.iter()
        .position(|a| *a == name)
        .map(|i| ArgName::NameIid(i as u64 + 1))
}

/// Slice categories, interned as 1, 2, 3 ... in this order.
const CATEGORIES: [&str; 6] = ["mpi", "nccl", "cuda", "fabric", "gpu", "other"];

/// The track of commtap's own record about the trace (what was lost, the clocks).
const COMMTAP_TRACK: u64 = 1;

/// A process's track.
fn process_track(pid: u32) -> u64 {
    (1 << 62) | u64::from(pid)
}

/// A thread's track (or the device-window track, whose tid is above every thread's).
fn thread_track(pid: u32, tid: u32) -> u64 {
    (u64::from(pid) << 32) | u64::from(tid)
}

/// What one part of a `.pftrace` file has said so far: each file stands alone, so every
/// part interns its names and describes its tracks again.
#[derive(Debug, Default)]
pub struct Encoder {
    /// Routine names interned in this part.
    names: HashMap<String, u64>,
    /// Tracks described in this part.
    described: HashSet<u64>,
    /// The latest time in this part, for the record at its end.
    last_ns: u64,
    /// The packet being encoded (kept: one allocation for every call).
    packet: Vec<u8>,
}

impl Encoder {
    /// Starts a file: a clean sequence, with the categories and argument names interned.
    pub fn begin_part(&mut self, out: &mut Vec<u8>) {
        *self = Encoder {
            packet: std::mem::take(&mut self.packet),
            ..Encoder::default()
        };
        let interned = InternedData {
            event_categories: CATEGORIES
                .iter()
                .zip(1..)
                .map(|(name, iid)| EventCategory {
                    iid: Some(iid),
                    name: Some((*name).into()),
                })
                .collect(),
            debug_annotation_names: ARGS
                .iter()
                .zip(1..)
                .map(|(name, iid)| DebugAnnotationName {
                    iid: Some(iid),
                    name: Some((*name).into()),
                })
                .collect(),
            ..Default::default()
        };
        self.push(
            out,
            TracePacket {
                interned_data: Some(interned),
                sequence_flags: Some(
                    SequenceFlags::SeqIncrementalStateCleared as u32
                        | SequenceFlags::SeqNeedsIncrementalState as u32,
                ),
                first_packet_on_sequence: Some(true),
                ..packet(None, None)
            },
        );
        self.push(
            out,
            packet(
                None,
                Some(Data::TrackDescriptor(TrackDescriptor {
                    uuid: Some(COMMTAP_TRACK),
                    name: Some("commtap".into()),
                    ..Default::default()
                })),
            ),
        );
    }

    /// Appends one call: its tracks where this part has not described them yet, then a
    /// slice begin (starting or ending the flows of `flows`) and end on its track.
    pub fn slice(&mut self, out: &mut Vec<u8>, ev: &pb::CallEvent, flows: FlowEnds) {
        let uuid = self.thread_track(out, ev.pid, chrome::track_of(ev));

        let routine = chrome::slice_name(ev);
        let mut interned = None;
        let next = self.names.len() as u64 + 1;
        let name_iid = if let Some(iid) = self.names.get(routine.as_ref()) {
            *iid
        } else {
            self.names.insert(routine.clone().into_owned(), next);
            interned = Some(InternedData {
                event_names: vec![EventName {
                    iid: Some(next),
                    name: Some(routine.into_owned()),
                }],
                ..Default::default()
            });
            next
        };
        let category = chrome::slice_category(ev);
        let begin = TrackEvent {
            r#type: Some(Type::SliceBegin as i32),
            track_uuid: Some(uuid),
            name_field: Some(NameField::NameIid(name_iid)),
            category_iids: vec![CATEGORIES
                .iter()
                .position(|c| *c == category)
                .map_or(CATEGORIES.len() as u64, |i| i as u64 + 1)],
            debug_annotations: annotations(ev),
            flow_ids: flows.out.into_iter().collect(),
            terminating_flow_ids: flows.into,
        };
        self.push(
            out,
            TracePacket {
                interned_data: interned,
                ..packet(Some(ev.start_ns), Some(Data::TrackEvent(begin)))
            },
        );
        let end_ns = ev.start_ns + ev.duration_ns;
        let end = TrackEvent {
            r#type: Some(Type::SliceEnd as i32),
            track_uuid: Some(uuid),
            ..Default::default()
        };
        self.push(out, packet(Some(end_ns), Some(Data::TrackEvent(end))));
        self.last_ns = self.last_ns.max(end_ns);
    }

    /// Thread `track` of `pid`'s track, described first where this part has not yet.
    fn thread_track(&mut self, out: &mut Vec<u8>, pid: u32, track: u32) -> u64 {
        let uuid = thread_track(pid, track);
        if self.described.insert(uuid) {
            // A thread track names its process by pid; the process's own descriptor, with
            // its name, comes at the end of the part (the trace processor keeps the first
            // name it is given, and a rank's may be learnt after its first call). The
            // device windows are a thread of their own, as in the Chrome format.
            let descriptor = TrackDescriptor {
                uuid: Some(uuid),
                thread: Some(ThreadDescriptor {
                    pid: Some(pid as i32),
                    tid: Some(i64::from(track)),
                    thread_name: Some(chrome::thread_label(pid, track)),
                }),
                ..Default::default()
            };
            self.push(out, packet(None, Some(Data::TrackDescriptor(descriptor))));
        }
        uuid
    }

    /// Appends an instant (`step 3`) on thread `track` of `pid` at `ns`.
    pub fn instant(&mut self, out: &mut Vec<u8>, (pid, track): (u32, u32), ns: u64, name: &str) {
        let uuid = self.thread_track(out, pid, track);
        let instant = TrackEvent {
            r#type: Some(Type::Instant as i32),
            track_uuid: Some(uuid),
            name_field: Some(NameField::Name(name.to_string())),
            ..Default::default()
        };
        self.push(out, packet(Some(ns), Some(Data::TrackEvent(instant))));
        self.last_ns = self.last_ns.max(ns);
    }

    /// Ends a file: every process described, with its name, and commtap's record of the
    /// trace (an instant on the `commtap` track whose
    /// `metadata` argument is the JSON metadata of the Chrome format).
    pub fn end_part(
        &mut self,
        out: &mut Vec<u8>,
        names: &BTreeMap<u32, Option<ProcessName>>,
        meta: &serde_json::Value,
    ) {
        for (pid, name) in names {
            self.describe_process(out, *pid, name.as_ref());
        }
        let record = TrackEvent {
            r#type: Some(Type::Instant as i32),
            track_uuid: Some(COMMTAP_TRACK),
            name_field: Some(NameField::Name("commtap trace".into())),
            debug_annotations: vec![DebugAnnotation {
                name_field: arg("metadata"),
                value: Some(Value::StringValue(meta.to_string())),
            }],
            ..Default::default()
        };
        let ts = self.last_ns;
        self.push(out, packet(Some(ts), Some(Data::TrackEvent(record))));
    }

    fn describe_process(&mut self, out: &mut Vec<u8>, pid: u32, name: Option<&ProcessName>) {
        let (label, sort) = chrome::process_label(pid, name);
        let descriptor = TrackDescriptor {
            uuid: Some(process_track(pid)),
            process: Some(ProcessDescriptor {
                pid: Some(pid as i32),
                process_name: Some(label),
                legacy_sort_index: Some(i32::try_from(sort).unwrap_or(i32::MAX)),
                process_labels: name
                    .map(|n| &n.job)
                    .filter(|j| !j.is_empty())
                    .map(|j| vec![format!("job {j}")])
                    .unwrap_or_default(),
            }),
            ..Default::default()
        };
        self.push(out, packet(None, Some(Data::TrackDescriptor(descriptor))));
    }

    /// Appends `p` as one `Trace.packet` field.
    fn push(&mut self, out: &mut Vec<u8>, p: TracePacket) {
        self.packet.clear();
        p.encode(&mut self.packet)
            .expect("a Vec grows as a packet needs");
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, out);
        prost::encoding::encode_varint(self.packet.len() as u64, out);
        out.extend_from_slice(&self.packet);
    }
}

/// A packet of commtap's sequence, after the first.
fn packet(ts: Option<u64>, data: Option<Data>) -> TracePacket {
    TracePacket {
        timestamp: ts,
        data,
        trusted_packet_sequence_id: Some(SEQUENCE),
        sequence_flags: Some(SequenceFlags::SeqNeedsIncrementalState as u32),
        ..Default::default()
    }
}

/// A call's arguments, as the Chrome format writes them.
fn annotations(ev: &pb::CallEvent) -> Vec<DebugAnnotation> {
    let mut args = Vec::with_capacity(8);
    super::slice_args(ev, |name, value| {
        let value = match value {
            Arg::Int(v) => Value::IntValue(v),
            Arg::Str(s) => Value::StringValue(s.to_string()),
            Arg::Size(bytes) => {
                Value::StringValue(RangeLabel::of_bucket(size_bucket(bytes)).to_string())
            }
        };
        args.push(DebugAnnotation {
            name_field: arg(name),
            value: Some(value),
        });
    });
    args
}
