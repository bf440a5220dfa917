//! Timelines: every call of every rank on one time axis, written to a file as the calls
//! arrive (`record --trace`, `commtap trace`). The file is complete and valid whenever the
//! writer is finished, however the run was stopped; what could not be written is counted
//! and written into the file.

pub mod chrome;
pub mod remote;

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

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
         Perfetto UI, chrome://tracing)"
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
    /// Only these world ranks (a process whose rank is not known yet is left out).
    pub ranks: Option<BTreeSet<u32>>,
    /// Which routines.
    pub routines: RoutineFilter,
    /// At most this many calls per process: the first ones are kept, later ones counted.
    pub max_events: Option<u64>,
    /// Start another file (`NAME.2.json` ...) once one holds this many bytes.
    pub split_bytes: u64,
}

impl TraceOptions {
    /// A trace of everything into `path`.
    pub fn new(path: PathBuf) -> TraceOptions {
        TraceOptions {
            path,
            window: None,
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
    /// Calls written.
    pub events: u64,
    /// Calls not written.
    pub lost: Lost,
    /// With several nodes: the node whose calls' times are least certain, and by how much
    /// (ns).
    pub largest_clock_error: Option<(String, u64)>,
}

impl std::fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let files: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
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
        Ok(())
    }
}

/// Writes calls into a trace file as they come, splitting it by size.
pub struct TraceWriter {
    opts: TraceOptions,
    out: BufWriter<std::fs::File>,
    /// Files so far; the last is being written.
    files: Vec<PathBuf>,
    /// Bytes and calls in the file being written.
    part_bytes: u64,
    part_events: u64,
    /// Start of the first traced call: the origin of `--window`.
    first_ns: Option<u64>,
    /// The processes seen, by pid.
    processes: BTreeMap<u32, Traced>,
    events: u64,
    lost: Lost,
    /// The time axis and each node's clock offset, written into the metadata.
    clocks: serde_json::Value,
    /// The line being written (kept: one allocation for every call).
    line: String,
    /// NCCL groups open on each thread.
    groups: NcclGroups,
    largest_clock_error: Option<(String, u64)>,
}

impl TraceWriter {
    /// Creates the first file (fails before anything runs when it cannot be written).
    pub fn create(opts: TraceOptions) -> Result<TraceWriter, TraceError> {
        if opts.path.extension().and_then(|e| e.to_str()) != Some("json") {
            return Err(TraceError::Format(opts.path.display().to_string()));
        }
        let out = open(&opts.path)?;
        let mut w = TraceWriter {
            files: vec![opts.path.clone()],
            opts,
            out,
            part_bytes: 0,
            part_events: 0,
            first_ns: None,
            processes: BTreeMap::new(),
            events: 0,
            lost: Lost::default(),
            clocks: "one node: every rank's CLOCK_MONOTONIC, nothing corrected".into(),
            largest_clock_error: None,
            line: String::with_capacity(256),
            groups: NcclGroups::default(),
        };
        w.write(chrome::HEADER)?;
        Ok(w)
    }

    /// Processes whose calls were seen but whose names are not known yet.
    pub fn unnamed(&self) -> Vec<u32> {
        self.processes
            .iter()
            .filter(|(_, p)| p.name.is_none())
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Processes whose calls were seen.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.processes.keys().copied()
    }

    /// Names process `pid`'s track.
    pub fn name(&mut self, pid: u32, name: ProcessName) {
        self.processes.entry(pid).or_default().name = Some(name);
    }

    /// Calls the reader lost (cumulative count from the feed, or an increment).
    pub fn lost_by_reader(&mut self, n: u64) {
        self.lost.reader_too_slow += n;
    }

    /// The time axis and the nodes' clock offsets (metadata), and the largest error.
    pub fn set_clocks(&mut self, clocks: serde_json::Value, largest: Option<(String, u64)>) {
        self.clocks = clocks;
        self.largest_clock_error = largest;
    }

    /// Calls the kernel could not queue, as the ranks' profiles count them.
    pub fn set_ring_buffer_full(&mut self, n: u64) {
        self.lost.ring_buffer_full = n;
    }

    /// Writes one call, unless the options leave it out; an NCCL group's end also writes
    /// the group, as a slice around its operations.
    pub fn call(&mut self, ev: &pb::CallEvent) -> Result<(), TraceError> {
        let group = self.groups.track(ev);
        self.write_call(ev)?;
        match group {
            Some(g) => self.write_call(&g),
            None => Ok(()),
        }
    }

    fn write_call(&mut self, ev: &pb::CallEvent) -> Result<(), TraceError> {
        let process = self.processes.entry(ev.pid).or_default();
        if let Some(ranks) = &self.opts.ranks {
            match process.name.as_ref().and_then(|n| n.rank) {
                Some(r) if ranks.contains(&r) => {}
                _ => return Ok(()),
            }
        }
        if !self.opts.routines.admits(&ev.routine) {
            return Ok(());
        }
        let first = *self.first_ns.get_or_insert(ev.start_ns);
        if let Some((from, to)) = self.opts.window {
            let after = ev.start_ns.saturating_sub(first) as f64 / 1e9;
            if after < from || after > to {
                return Ok(());
            }
        }
        if self
            .opts
            .max_events
            .is_some_and(|max| process.written >= max)
        {
            self.lost.max_events += 1;
            return Ok(());
        }
        process.written += 1;
        process.threads.insert(ev.tid);
        self.events += 1;
        let mut line = std::mem::take(&mut self.line);
        line.clear();
        chrome::slice(&mut line, ev, self.part_events == 0);
        self.part_events += 1;
        let written = self.write(&line);
        self.line = line;
        written?;
        if self.part_bytes >= self.opts.split_bytes {
            self.close_part()?;
            let next = part_path(&self.opts.path, self.files.len() + 1);
            self.out = open(&next)?;
            self.files.push(next);
            self.part_bytes = 0;
            self.part_events = 0;
            self.write(chrome::HEADER)?;
        }
        Ok(())
    }

    /// Ends the trace: names every track, writes what was lost, closes the file.
    pub fn finish(mut self) -> Result<TraceSummary, TraceError> {
        self.close_part()?;
        Ok(TraceSummary {
            files: self.files,
            events: self.events,
            lost: self.lost,
            largest_clock_error: self.largest_clock_error,
        })
    }

    /// Closes the file being written so that it loads on its own: the names of every
    /// process and thread seen so far, and the metadata.
    fn close_part(&mut self) -> Result<(), TraceError> {
        let mut tail = String::new();
        let mut first = self.part_events == 0;
        for (pid, p) in &self.processes {
            tail.push_str(&chrome::process_names(*pid, p.name.as_ref(), first));
            first = false;
        }
        for (pid, p) in &self.processes {
            for tid in &p.threads {
                tail.push_str(&chrome::thread_name(*pid, *tid, first));
                first = false;
            }
        }
        let meta = serde_json::json!({
            "commtap": {
                "version": env!("CARGO_PKG_VERSION"),
                "part": self.files.len(),
                "calls_written": self.events,
                "calls_lost": self.lost,
                "max_events_policy": "the first --max-events calls of each process are kept",
                "clock": self.clocks,
            }
        });
        tail.push_str(&chrome::footer(&meta));
        self.write(&tail)?;
        let path = self.files.last().cloned().unwrap_or_default();
        self.out.flush().map_err(|source| TraceError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    fn write(&mut self, s: &str) -> Result<(), TraceError> {
        self.part_bytes += s.len() as u64;
        let path = self.files.last();
        self.out
            .write_all(s.as_bytes())
            .map_err(|source| TraceError::Io {
                path: path.map(|p| p.display().to_string()).unwrap_or_default(),
                source,
            })
    }
}

/// What the trace knows of one process: one lookup per call finds it all.
#[derive(Debug, Default)]
struct Traced {
    /// Its track's name (None: not known yet).
    name: Option<ProcessName>,
    /// Calls written.
    written: u64,
    /// Its threads seen.
    threads: BTreeSet<u32>,
}

/// An NCCL group open on a thread: from its outermost `ncclGroupStart`.
#[derive(Debug)]
struct OpenGroup {
    start_ns: u64,
    depth: u32,
    bytes: u64,
}

/// NCCL groups as they open and close on each thread (a thread's calls arrive in order).
/// A group is shown as one `ncclGroup` slice from its outermost `ncclGroupStart` to its
/// `ncclGroupEnd`, holding the operations enqueued in it, with their bytes: as the
/// profile's `ncclGroup` counts completed groups.
#[derive(Debug, Default)]
struct NcclGroups {
    open: std::collections::HashMap<(u32, u32), OpenGroup>,
}

impl NcclGroups {
    /// Follows `ev`; the group it closes, if it closes one.
    fn track(&mut self, ev: &pb::CallEvent) -> Option<pb::CallEvent> {
        let thread = (ev.pid, ev.tid);
        match ev.routine.as_str() {
            "ncclGroupStart" => {
                self.open
                    .entry(thread)
                    .and_modify(|g| g.depth += 1)
                    .or_insert(OpenGroup {
                        start_ns: ev.start_ns,
                        depth: 1,
                        bytes: 0,
                    });
                None
            }
            "ncclGroupEnd" => {
                let g = self.open.get_mut(&thread)?;
                g.depth -= 1;
                if g.depth > 0 {
                    return None;
                }
                let g = self.open.remove(&thread)?;
                // 1 ns past ncclGroupEnd's return: viewers that compare times as floats
                // (DevTools) then nest ncclGroupEnd inside, as they do the other calls.
                let end = ev.start_ns + ev.duration_ns + 1;
                Some(pb::CallEvent {
                    pid: ev.pid,
                    tid: ev.tid,
                    routine: "ncclGroup".into(),
                    start_ns: g.start_ns,
                    duration_ns: end.saturating_sub(g.start_ns),
                    bytes: Some(g.bytes),
                    ..Default::default()
                })
            }
            r if r.starts_with("nccl") => {
                if let Some(g) = self.open.get_mut(&thread) {
                    g.bytes += ev.bytes.unwrap_or(0);
                }
                None
            }
            _ => None,
        }
    }
}

/// Creates a trace file (never through a symlink: commtap runs as root).
fn open(path: &Path) -> Result<BufWriter<std::fs::File>, TraceError> {
    crate::report::create_file(path)
        .map(|f| BufWriter::with_capacity(1 << 20, f))
        .map_err(|source| TraceError::Io {
            path: path.display().to_string(),
            source,
        })
}

/// The `n`th file of a split trace: `t.json`, `t.2.json`, `t.3.json` ...
pub fn part_path(first: &Path, n: usize) -> PathBuf {
    if n <= 1 {
        return first.to_path_buf();
    }
    let stem = first
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    first.with_file_name(format!("{stem}.{n}.json"))
}

/// A kernel call event as the API sends it (and a trace writes it).
pub fn call_event(ev: &collector_common::CallEvent) -> pb::CallEvent {
    pb::CallEvent {
        pid: ev.tgid,
        tid: ev.tid,
        routine: collector_common::ROUTINES
            .get(ev.routine as usize)
            .map_or("?", |r| r.name)
            .to_string(),
        start_ns: ev.start_ns,
        duration_ns: ev.dur_ns,
        bytes: (ev.bucket != collector_common::UNKNOWN_BUCKET).then_some(ev.bytes),
        peer: (ev.peer >= 0).then_some(ev.peer),
        comm_size: ev.comm_size,
        comm_rank: (ev.comm_rank >= 0).then_some(ev.comm_rank),
        comm: comm_label(ev),
        seq: None,
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
mod tests {
    use super::*;

    fn ev(pid: u32, routine: &str, start_ns: u64) -> pb::CallEvent {
        pb::CallEvent {
            pid,
            tid: pid,
            routine: routine.into(),
            start_ns,
            duration_ns: 1500,
            bytes: Some(16),
            peer: Some(1),
            comm_size: 2,
            comm_rank: Some(0),
            ..Default::default()
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("commtap-trace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir.join("t.json")
    }

    fn load(path: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).expect("read")).expect("valid JSON")
    }

    fn slices(v: &serde_json::Value) -> usize {
        v["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["ph"] == "X")
            .count()
    }

    #[test]
    fn a_trace_is_valid_json_with_names_and_losses() {
        let path = scratch("valid");
        let mut opts = TraceOptions::new(path.clone());
        opts.max_events = Some(2);
        opts.routines.exclude = vec!["MPI_Iprobe".into()];
        let mut w = TraceWriter::create(opts).expect("create");
        for i in 0..3 {
            w.call(&ev(7, "MPI_Send", 1000 + i)).expect("call");
        }
        w.call(&ev(8, "MPI_Iprobe", 1000)).expect("call");
        w.call(&ev(8, "MPI_Recv", 1000)).expect("call");
        assert_eq!(w.unnamed(), vec![7, 8]);
        w.name(
            7,
            ProcessName {
                rank: Some(0),
                host: "n1".into(),
                job: "j".into(),
            },
        );
        let s = w.finish().expect("finish");
        assert_eq!((s.events, s.lost.max_events), (3, 1));
        let v = load(&path);
        assert_eq!(slices(&v), 3);
        let names: Vec<&str> = v["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["name"] == "process_name")
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        assert_eq!(names, vec!["rank 0 (n1)", "pid 8"]);
        assert_eq!(v["metadata"]["commtap"]["calls_lost"]["max_events"], 1);
    }

    #[test]
    fn a_trace_past_its_split_size_goes_on_in_numbered_files_that_each_load() {
        let path = scratch("split");
        let mut opts = TraceOptions::new(path.clone());
        opts.split_bytes = 1000;
        let mut w = TraceWriter::create(opts).expect("create");
        for i in 0..50 {
            w.call(&ev(7, "MPI_Send", 1000 * i)).expect("call");
        }
        let s = w.finish().expect("finish");
        assert!(s.files.len() > 2, "{:?}", s.files);
        assert_eq!(s.files[1], part_path(&path, 2));
        let total: usize = s.files.iter().map(|f| slices(&load(f))).sum();
        assert_eq!(total, 50);
    }

    #[test]
    fn a_window_keeps_the_calls_that_start_inside_it() {
        let path = scratch("window");
        let mut opts = TraceOptions::new(path.clone());
        opts.window = Some((1.0, 2.0));
        let mut w = TraceWriter::create(opts).expect("create");
        for s in [
            0u64,
            500_000_000,
            1_000_000_000,
            1_500_000_000,
            2_500_000_000,
        ] {
            w.call(&ev(7, "MPI_Send", s)).expect("call");
        }
        assert_eq!(w.finish().expect("finish").events, 2);
    }

    #[test]
    fn a_nested_nccl_group_is_one_slice_from_its_outermost_start_to_its_end() {
        let mut groups = NcclGroups::default();
        let at = |routine: &str, start_ns: u64, bytes: Option<u64>| pb::CallEvent {
            pid: 7,
            tid: 8,
            routine: routine.into(),
            start_ns,
            duration_ns: 10,
            bytes,
            ..Default::default()
        };
        assert!(groups.track(&at("ncclGroupStart", 100, None)).is_none());
        assert!(groups.track(&at("ncclGroupStart", 120, None)).is_none());
        assert!(groups.track(&at("ncclSend", 140, Some(5))).is_none());
        assert!(groups.track(&at("ncclRecv", 160, Some(9))).is_none());
        assert!(groups.track(&at("ncclGroupEnd", 180, None)).is_none());
        let g = groups
            .track(&at("ncclGroupEnd", 200, None))
            .expect("the outer end closes it");
        assert_eq!(
            (g.routine.as_str(), g.start_ns, g.duration_ns, g.bytes),
            ("ncclGroup", 100, 111, Some(14))
        );
        // An end whose start came before the trace began closes nothing.
        assert!(groups.track(&at("ncclGroupEnd", 300, None)).is_none());
    }

    #[test]
    fn unknown_formats_are_refused_with_the_list() {
        let e = TraceWriter::create(TraceOptions::new("/tmp/x.perfetto".into()))
            .err()
            .expect("refused");
        assert!(e.to_string().contains("FILE.json"), "{e}");
    }
}
