//! Timelines: every call of every rank on one time axis, written to a file as the calls
//! arrive (`record --trace`, `commtap trace`). The file is complete and valid whenever the
//! writer is finished, however the run was stopped; what could not be written is counted
//! and written into the file.

pub mod chrome;
pub mod flows;
mod groups;
pub mod perfetto;
pub mod remote;
mod step_times;
mod steps;
mod writer;

pub use step_times::StepRow;
pub use steps::{StepMarker, Steps, StepsReached};
pub use writer::{part_path, TraceWriter, ARRIVAL};

use std::{collections::BTreeSet, path::PathBuf};

use serde::Serialize;
use thiserror::Error;

use crate::api::pb;

/// Default size at which a trace is split into another file: chrome://tracing stops
/// loading at about 256 MB.
pub const DEFAULT_SPLIT_BYTES: u64 = 256 << 20;

/// Why a trace could not be taken.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file name names no format commtap writes.
    #[error(
        "{0}: unknown trace format; name the file FILE.json (Chrome Trace Event Format: \
         Perfetto UI, chrome://tracing) or FILE.pftrace (Perfetto's protobuf format: Perfetto \
         UI, trace_processor; smaller, for large traces)"
    )]
    Format(String),
    /// The file could not be created or written.
    #[error("trace {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
}

/// Which routines go into a trace.
#[derive(Clone, Debug, Default)]
pub struct RoutineFilter {
    /// Only these (empty: all).
    pub include: Vec<String>,
    /// Never these (polls such as `MPI_Iprobe`).
    pub exclude: Vec<String>,
}

impl RoutineFilter {
    /// Whether `routine` is traced.
    pub fn admits(&self, routine: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|r| r == routine))
            && !self.exclude.iter().any(|r| r == routine)
    }
}

/// What to trace and where.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// The (first) file; its extension names the format.
    pub path: PathBuf,
    /// Only calls starting this many seconds after the first traced call: (from, to).
    pub window: Option<(f64, f64)>,
    /// Only the calls of these steps of each process.
    pub steps: Option<Steps>,
    /// Only these world ranks (a process whose rank is not known yet is left out).
    pub ranks: Option<BTreeSet<u32>>,
    /// Which routines.
    pub routines: RoutineFilter,
    /// At most this many calls per process: the first ones are kept, later ones counted.
    pub max_events: Option<u64>,
    /// Start another file (`NAME.2.json`, `NAME.2.pftrace` ...) once one holds this many
    /// bytes.
    pub split_bytes: u64,
}

impl TraceOptions {
    /// A trace of everything into `path`.
    pub fn new(path: PathBuf) -> TraceOptions {
        TraceOptions {
            path,
            window: None,
            steps: None,
            ranks: None,
            routines: RoutineFilter::default(),
            max_events: None,
            split_bytes: DEFAULT_SPLIT_BYTES,
        }
    }
}

/// Whose a process's calls are: its track is named `rank R (host)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessName {
    /// World rank, if the launcher said.
    pub rank: Option<u32>,
    /// Node name.
    pub host: String,
    /// Job id.
    pub job: String,
}

/// Calls that are not in the trace although they were made (the profile's counts hold
/// them all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Lost {
    /// The kernel found its ring buffer full (the ranks' `dropped`).
    pub ring_buffer_full: u64,
    /// The reader fell behind the daemon's bounded feed.
    pub reader_too_slow: u64,
    /// Beyond `--max-events` for their process (the first ones are kept).
    pub max_events: u64,
}

impl Lost {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.ring_buffer_full + self.reader_too_slow + self.max_events
    }
}

/// What a finished trace holds.
#[derive(Clone, Debug)]
pub struct TraceSummary {
    /// Its files, in order.
    pub files: Vec<PathBuf>,
    /// No call came, and the file that was there was left as it was (else, with no
    /// call, none was written).
    pub kept: bool,
    /// Calls written.
    pub events: u64,
    /// Calls not written.
    pub lost: Lost,
    /// With several nodes: the node whose calls' times are least certain, and by how much
    /// (ns).
    pub largest_clock_error: Option<(String, u64)>,
    /// Under `--steps`: how far the processes got.
    pub steps: Option<StepsReached>,
}

impl std::fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let files: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
        if self.events == 0 {
            let what = if self.kept {
                "left as it was (a file of an earlier run)"
            } else {
                "not written"
            };
            write!(f, "trace: no calls; {} {what}", files.join(", "))?;
            if let Some(steps) = &self.steps {
                write!(f, "; {steps}")?;
            }
            return Ok(());
        }
        write!(f, "trace: {} calls in {}", self.events, files.join(", "))?;
        if let Some((node, ns)) = &self.largest_clock_error {
            write!(
                f,
                "; nodes' clocks aligned to within {:.3} ms (largest error: {node})",
                *ns as f64 / 1e6
            )?;
        }
        let l = &self.lost;
        if l.total() > 0 {
            write!(
                f,
                "; {} calls not in the trace ({} ring buffer full, {} reader too slow, {} past \
                 --max-events): the profile's counts hold them",
                l.total(),
                l.ring_buffer_full,
                l.reader_too_slow,
                l.max_events
            )?;
        }
        if let Some(steps) = &self.steps {
            write!(f, "; {steps}")?;
        }
        Ok(())
    }
}

/// The routine named `name` (one lookup for every call a trace writes).
pub fn routine(name: &str) -> Option<&'static collector_common::Routine> {
    static BY_NAME: std::sync::LazyLock<
        std::collections::HashMap<&'static str, &'static collector_common::Routine>,
    > = std::sync::LazyLock::new(|| {
        collector_common::ROUTINES
            .iter()
            .map(|r| (r.name, r))
            .collect()
    });
    BY_NAME.get(name).copied()
}

/// A value of a slice's argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg<'a> {
    /// A number.
    Int(i64),
    /// A string.
    Str(&'a str),
    /// The mpitrace size bucket of this many bytes (`1K..4K`).
    Size(u64),
}

/// The arguments of a call's slice, in the order every format writes them: bytes and their
/// size bucket, the peer and tag (and Sendrecv's receiving half), the communicator
/// (size, this rank, identity) and the collective's number on it.
pub fn slice_args<'a>(ev: &'a pb::CallEvent, mut arg: impl FnMut(&'static str, Arg<'a>)) {
    if let Some(bytes) = ev.bytes {
        arg("bytes", Arg::Int(bytes as i64));
        arg("size", Arg::Size(bytes));
    }
    let ranks = [
        ("peer", ev.peer.filter(|p| *p >= 0)),
        ("tag", ev.tag.filter(|t| *t >= 0)),
        ("recv_peer", ev.recv_peer.filter(|p| *p >= 0)),
        ("recv_tag", ev.recv_tag.filter(|t| *t >= 0)),
        (
            "comm_size",
            (ev.comm_size > 0).then_some(ev.comm_size as i32),
        ),
        ("comm_rank", ev.comm_rank),
    ];
    for (name, v) in ranks {
        if let Some(v) = v {
            arg(name, Arg::Int(i64::from(v)));
        }
    }
    if !ev.comm.is_empty() {
        arg("comm", Arg::Str(&ev.comm));
    }
    if let Some(seq) = ev.seq {
        arg("seq", Arg::Int(seq as i64));
    }
    if let Some(why) = &ev.unfinished {
        arg("unfinished", Arg::Str(why));
    }
}

/// [`call_event`] with what who-is-late placed it as: its communicator by the name every
/// member shares, and a collective's number there.
pub fn placed_call_event(
    ev: &collector_common::CallEvent,
    placement: crate::skew::Placement,
) -> pb::CallEvent {
    let mut call = call_event(ev);
    if let Some(comm) = placement.comm {
        call.comm = comm.label();
    }
    call.seq = placement.seq;
    call.seq_local = placement.seq_local;
    call
}

/// A kernel call event as the API sends it (and a trace writes it).
pub fn call_event(ev: &collector_common::CallEvent) -> pb::CallEvent {
    let routine = collector_common::ROUTINES.get(ev.routine as usize);
    let moves = routine.and_then(flows::direction);
    // A persistent creation names its channel too (a timeline numbers nothing on it).
    let names_channel = moves.is_some() || routine.and_then(flows::persistent_end).is_some();
    pb::CallEvent {
        pid: ev.tgid,
        tid: ev.tid,
        routine: routine.map_or("?", |r| r.name).to_string(),
        start_ns: ev.start_ns,
        duration_ns: ev.dur_ns,
        bytes: (ev.bucket != collector_common::UNKNOWN_BUCKET).then_some(ev.bytes),
        peer: (ev.peer >= 0 || names_channel).then_some(ev.peer),
        comm_size: ev.comm_size,
        comm_rank: (ev.comm_rank >= 0).then_some(ev.comm_rank),
        comm: comm_label(ev),
        seq: None,
        seq_local: false,
        tag: names_channel.then_some(ev.tag),
        recv_peer: moves
            .is_some_and(flows::Direction::has_receiving_half)
            .then_some(ev.recv_peer),
        recv_tag: moves
            .is_some_and(flows::Direction::has_receiving_half)
            .then_some(ev.recv_tag),
        device_window: (ev.kind == collector_common::EventKind::DeviceWindow as u32).then_some(
            pb::DeviceWindow {
                not_attributed: ev.flags & collector_common::CallEvent::NOT_ATTRIBUTED != 0,
            },
        ),
        arrival: (ev.kind == collector_common::EventKind::Arrival as u32).then(|| {
            let (posted_tid, posted_start_ns) = ev.posted_by();
            pb::Arrival {
                posted_tid,
                posted_start_ns,
                untold: ev.flags & collector_common::CallEvent::UNTOLD != 0,
                follows_call: ev.flags & collector_common::CallEvent::FOLLOWS_CALL != 0,
            }
        }),
        unfinished: None,
    }
}

/// Why the slice of `call`, a rank was still inside `when` (`the trace ended`), is
/// unfinished.
pub fn still_inside(call: &crate::profile::InCall, when: &str) -> String {
    if call.before_attach {
        format!(
            "still inside when {when} (entered before commtap attached: the slice starts at the \
             attach)"
        )
    } else {
        format!("still inside when {when}")
    }
}

/// The slice of a call rank `rank` had not returned from when the trace was made: it ran
/// from its start to `end_ns` (monotonic), `why` it did not return.
pub fn unfinished_call(
    rank: &crate::profile::RankProfile,
    call: &crate::profile::InCall,
    end_ns: u64,
    why: String,
) -> pb::CallEvent {
    pb::CallEvent {
        pid: rank.pid,
        // The main thread where the kernel did not say.
        tid: if call.thread == 0 {
            rank.pid
        } else {
            call.thread
        },
        routine: call.routine.clone(),
        start_ns: end_ns.saturating_sub(call.for_ns),
        duration_ns: call.for_ns,
        unfinished: Some(why),
        ..Default::default()
    }
}

/// How a trace names the communicator of a call (see `CallEvent.comm` in the node API).
fn comm_label(ev: &collector_common::CallEvent) -> String {
    use collector_common::{comm_id, routines::Family, ROUTINES};
    let nccl = ROUTINES
        .get(ev.routine as usize)
        .is_some_and(|r| r.family() == Family::Nccl);
    match ev.comm_id {
        comm_id::WORLD if !nccl => "world".to_string(),
        id if nccl && id != 0 => format!("nccl:{id:016x}"),
        id if id & comm_id::OMPI_CID != 0 && !nccl => {
            format!("cid:{}", id & !comm_id::OMPI_CID)
        }
        _ if ev.comm != 0 => format!("local:{:#x}", ev.comm),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests;
