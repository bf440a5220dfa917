//! The Chrome Trace Event Format (JSON), as Perfetto and chrome://tracing read it: one
//! process per rank, one thread per OS thread, one complete ("X") slice per call. Times
//! are microseconds with nanosecond decimals.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    fmt::Write as _,
};

use collector_common::{buckets::RangeLabel, routines::Family, size_bucket};

use super::{flows::FlowEnds, Arg, ProcessName};
use crate::api::pb;

/// What opens a trace file.
pub const HEADER: &str = "{\"traceEvents\":[";

/// Appends `ns` as microseconds, exactly (`1234.567`).
fn push_micros(out: &mut String, ns: u64) {
    let _ = write!(out, "{}.{:03}", ns / 1000, ns % 1000);
}

/// Appends `s` as a JSON string: routine names are identifiers, written as they are;
/// anything else (a name from another daemon) is escaped.
fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(s).to_string());
    }
}

/// The category of a routine's slices: its library family.
fn category(routine: &str) -> &'static str {
    match super::routine(routine).map(collector_common::Routine::family) {
        Some(Family::Mpi) => "mpi",
        Some(Family::Nccl) => "nccl",
        Some(Family::Cuda) => "cuda",
        Some(Family::Fabric) => "fabric",
        // An arrow's end: in the category of the send it starts from (messages are MPI's).
        None if routine == super::writer::ARRIVAL => "mpi",
        None => "other",
    }
}

/// The thread id of a rank's `GPU (device window)` track: above every Linux thread id
/// (at most 2^22), so it is never one of the rank's threads.
pub const DEVICE_TRACK_TID: u32 = 1 << 22;

/// The track `ev` goes on: its thread's, or its rank's device-window track.
pub fn track_of(ev: &pb::CallEvent) -> u32 {
    if ev.device_window.is_some() {
        DEVICE_TRACK_TID
    } else {
        ev.tid
    }
}

/// The separator before an event: none before a file's first.
fn sep(first: bool) -> &'static str {
    if first {
        "\n"
    } else {
        ",\n"
    }
}

/// The name of a call's slice: its routine; a device window's is named apart from the
/// enqueue slices, so the two are never confused, nor counted as one another.
pub fn slice_name(ev: &pb::CallEvent) -> Cow<'_, str> {
    match &ev.device_window {
        Some(w) if w.not_attributed => "not attributed (device)".into(),
        Some(_) => format!("{} (device)", ev.routine).into(),
        None => ev.routine.as_str().into(),
    }
}

/// The category of a call's slice: its library family, `gpu` for device windows.
pub fn slice_category(ev: &pb::CallEvent) -> &'static str {
    if ev.device_window.is_some() {
        "gpu"
    } else {
        category(&ev.routine)
    }
}

/// Most flow ends held for their starts, and most starts remembered: past either, the
/// held ends are written at once (DevTools may then not draw them; Perfetto does).
const MAX_HELD_FLOWS: usize = 1 << 18;

/// What the Chrome format keeps between calls: the flows whose start is written, and the
/// ends that came before their start. DevTools reads flow events in file order, and binds
/// an end only after its start; Perfetto sorts them by time. A message's receive may well
/// return before its send (`MPI_Ssend` waits for the receiver), so its flow's end waits
/// here until the start is written.
#[derive(Debug, Default)]
pub struct Encoder {
    started: HashSet<u64>,
    held: HashMap<u64, String>,
}

impl Encoder {
    /// Starts a file: flows never cross files.
    pub fn begin_part(&mut self) {
        self.started.clear();
        self.held.clear();
    }

    /// Appends one call as a complete ("X") slice, named by its routine, with its
    /// arguments and the flow events it starts or ends, at its start (DevTools binds a
    /// flow event only to an event of the same time, pid, tid and category).
    pub fn slice(&mut self, out: &mut String, ev: &pb::CallEvent, flows: FlowEnds, first: bool) {
        let (pid, tid, cat) = (ev.pid, track_of(ev), slice_category(ev));
        out.push_str(sep(first));
        let _ = write!(out, "{{\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":");
        push_micros(out, ev.start_ns);
        out.push_str(",\"dur\":");
        push_micros(out, ev.duration_ns);
        out.push_str(",\"name\":");
        push_json_str(out, &slice_name(ev));
        let _ = write!(out, ",\"cat\":\"{cat}\",\"args\":{{");
        let mut comma = "";
        super::slice_args(ev, |name, value| {
            let _ = write!(out, "{comma}\"{name}\":");
            comma = ",";
            match value {
                Arg::Int(v) => {
                    let _ = write!(out, "{v}");
                }
                Arg::Str(s) => push_json_str(out, s),
                Arg::Size(bytes) => {
                    let _ = write!(out, "\"{}\"", RangeLabel::of_bucket(size_bucket(bytes)));
                }
            }
        });
        out.push_str("}}");
        let at = (pid, tid, cat);
        for id in flows.into {
            let mut line = String::new();
            flow(&mut line, "f", at, ev.start_ns, id);
            if self.started.remove(&id) {
                out.push_str(&line);
            } else {
                self.held.insert(id, line);
            }
        }
        if let Some(id) = flows.out {
            flow(out, "s", at, ev.start_ns, id);
            match self.held.remove(&id) {
                Some(end) => out.push_str(&end),
                None => {
                    self.started.insert(id);
                }
            }
        }
        if self.held.len() > MAX_HELD_FLOWS || self.started.len() > MAX_HELD_FLOWS {
            self.started.clear();
            self.release(out);
        }
    }

    /// Appends an instant (`step 3`) on thread `tid` of `pid` at `ns` (phase `I`: DevTools
    /// reads no other, Perfetto both it and `i`).
    pub fn instant(
        &mut self,
        out: &mut String,
        (pid, tid): (u32, u32),
        ns: u64,
        name: &str,
        first: bool,
    ) {
        out.push_str(sep(first));
        let _ = write!(
            out,
            "{{\"ph\":\"I\",\"s\":\"t\",\"pid\":{pid},\"tid\":{tid},\"cat\":\"step\",\"ts\":"
        );
        push_micros(out, ns);
        out.push_str(",\"name\":");
        push_json_str(out, name);
        out.push('}');
    }

    /// Writes every flow end still held (at the end of a file: after every start in it).
    pub fn release(&mut self, out: &mut String) {
        for (_, line) in self.held.drain() {
            out.push_str(&line);
        }
    }
}

/// Appends a flow event `ph` of flow `id` at `ts`, bound to the slice of the same time
/// on the thread.
fn flow(out: &mut String, ph: &str, (pid, tid, cat): (u32, u32, &str), ts: u64, id: u64) {
    let _ = write!(
        out,
        ",\n{{\"ph\":\"{ph}\",\"pid\":{pid},\"tid\":{tid},\"cat\":\"{cat}\",\"name\":\"message\",\"id\":\"{id:#x}\",\"bp\":\"e\",\"ts\":"
    );
    push_micros(out, ts);
    out.push('}');
}

/// The name of a process's track (`rank R (host)`, else `pid P`) and its place (by rank).
pub fn process_names(pid: u32, name: Option<&ProcessName>, first: bool) -> String {
    let (label, sort) = process_label(pid, name);
    let mut out = format!(
        "{}{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{pid},\"name\":\"process_name\",\"args\":{{\"name\":{}}}}},\n\
         {{\"ph\":\"M\",\"pid\":{pid},\"tid\":{pid},\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{sort}}}}}",
        sep(first),
        serde_json::Value::from(label),
    );
    if let Some(job) = name.map(|n| &n.job).filter(|j| !j.is_empty()) {
        let _ = write!(
            out,
            ",\n{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{pid},\"name\":\"process_labels\",\"args\":{{\"labels\":{}}}}}",
            serde_json::Value::from(format!("job {job}"))
        );
    }
    out
}

/// A process's track name (`rank R (host)`, else `pid P`) and its place (by rank, the
/// ones of unknown rank after every rank).
pub fn process_label(pid: u32, name: Option<&ProcessName>) -> (String, u64) {
    match name {
        Some(ProcessName {
            rank: Some(r),
            host,
            ..
        }) => (format!("rank {r} ({host})"), u64::from(*r)),
        Some(ProcessName { host, .. }) if !host.is_empty() => (
            format!("pid {pid} ({host})"),
            u64::from(u32::MAX) + u64::from(pid),
        ),
        _ => (format!("pid {pid}"), u64::from(u32::MAX) + u64::from(pid)),
    }
}

/// The name of a thread's track: `main` for the process's first thread, `GPU (device
/// window)` for the device windows.
pub fn thread_name(pid: u32, tid: u32, first: bool) -> String {
    let name = thread_label(pid, tid);
    format!(
        "{}{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":\"{name}\"}}}}",
        sep(first)
    )
}

/// A thread track's name: `main` for the process's first thread, `GPU (device window)`
/// for the device windows, else `thread TID`.
pub fn thread_label(pid: u32, tid: u32) -> String {
    if tid == DEVICE_TRACK_TID {
        "GPU (device window)".to_string()
    } else if pid == tid {
        "main".to_string()
    } else {
        format!("thread {tid}")
    }
}

/// What closes a trace file, with its metadata.
pub fn footer(meta: &serde_json::Value) -> String {
    format!("\n],\"displayTimeUnit\":\"ns\",\"metadata\":{meta}}}\n")
}
