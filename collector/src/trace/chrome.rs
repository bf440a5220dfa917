//! The Chrome Trace Event Format (JSON), as Perfetto and chrome://tracing read it: one
//! process per rank, one thread per OS thread, one complete ("X") slice per call. Times
//! are microseconds with nanosecond decimals.

use std::fmt::Write as _;

use collector_common::{buckets::RangeLabel, routines::Family, size_bucket, ROUTINES};

use super::ProcessName;
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
    match ROUTINES
        .iter()
        .find(|r| r.name == routine)
        .map(collector_common::Routine::family)
    {
        Some(Family::Mpi) => "mpi",
        Some(Family::Nccl) => "nccl",
        Some(Family::Cuda) => "cuda",
        Some(Family::Fabric) => "fabric",
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

/// Appends one call as a complete slice, named by its routine, with its arguments (called
/// for every call: no allocation of its own).
pub fn slice(out: &mut String, ev: &pb::CallEvent, first: bool) {
    out.push_str(sep(first));
    let _ = write!(
        out,
        "{{\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":",
        ev.pid,
        track_of(ev)
    );
    push_micros(out, ev.start_ns);
    out.push_str(",\"dur\":");
    push_micros(out, ev.duration_ns);
    out.push_str(",\"name\":");
    match &ev.device_window {
        // Named apart from the enqueue slices: the two are never confused, nor counted as
        // one another.
        Some(w) if w.not_attributed => out.push_str("\"not attributed (device)\""),
        Some(_) => {
            let _ = write!(out, "\"{} (device)\"", ev.routine);
        }
        None => push_json_str(out, &ev.routine),
    }
    let cat = if ev.device_window.is_some() {
        "gpu"
    } else {
        category(&ev.routine)
    };
    let _ = write!(out, ",\"cat\":\"{cat}\",\"args\":{{");
    let mut comma = "";
    if let Some(bytes) = ev.bytes {
        let size = RangeLabel::of_bucket(size_bucket(bytes));
        let _ = write!(out, "\"bytes\":{bytes},\"size\":\"{size}\"");
        comma = ",";
    }
    if let Some(peer) = ev.peer {
        let _ = write!(out, "{comma}\"peer\":{peer}");
        comma = ",";
    }
    if ev.comm_size > 0 {
        let _ = write!(out, "{comma}\"comm_size\":{}", ev.comm_size);
        comma = ",";
    }
    if let Some(rank) = ev.comm_rank {
        let _ = write!(out, "{comma}\"comm_rank\":{rank}");
        comma = ",";
    }
    if !ev.comm.is_empty() {
        let _ = write!(out, "{comma}\"comm\":");
        push_json_str(out, &ev.comm);
        comma = ",";
    }
    if let Some(seq) = ev.seq {
        let _ = write!(out, "{comma}\"seq\":{seq}");
    }
    out.push_str("}}");
}

/// The name of a process's track (`rank R (host)`, else `pid P`) and its place (by rank).
pub fn process_names(pid: u32, name: Option<&ProcessName>, first: bool) -> String {
    let (label, sort) = match name {
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
    };
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

/// The name of a thread's track: `main` for the process's first thread, `GPU (device
/// window)` for the device windows.
pub fn thread_name(pid: u32, tid: u32, first: bool) -> String {
    let name = if tid == DEVICE_TRACK_TID {
        "GPU (device window)".to_string()
    } else if pid == tid {
        "main".to_string()
    } else {
        format!("thread {tid}")
    };
    format!(
        "{}{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":\"{name}\"}}}}",
        sep(first)
    )
}

/// What closes a trace file, with its metadata.
pub fn footer(meta: &serde_json::Value) -> String {
    format!("\n],\"displayTimeUnit\":\"ns\",\"metadata\":{meta}}}\n")
}
