//! The trace file as it is written: calls appended as they come, the file split by size,
//! each part closed so that it loads on its own.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use super::{
    chrome,
    flows::{FlowEnds, Flows},
    groups::NcclGroups,
    perfetto,
    steps::StepCounter,
    Lost, ProcessName, TraceError, TraceOptions, TraceSummary,
};
use crate::api::pb;

/// How calls are written: the file name's extension says which.
#[derive(Debug)]
enum Format {
    /// `.json`: the Chrome Trace Event Format.
    Chrome(chrome::Encoder),
    /// `.pftrace`: Perfetto's protobuf trace.
    Perfetto(perfetto::Encoder),
}

impl Format {
    /// The format `path` names.
    fn of(path: &Path) -> Result<Format, TraceError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Ok(Format::Chrome(chrome::Encoder::default())),
            Some("pftrace") => Ok(Format::Perfetto(perfetto::Encoder::default())),
            _ => Err(TraceError::Format(path.display().to_string())),
        }
    }
}

/// What the file holds: a call's slice (with the arrows it starts or ends), or a mark (a
/// step's start) on thread `at` (pid, track).
enum Item<'a> {
    Slice(&'a pb::CallEvent, FlowEnds),
    Mark {
        at: (u32, u32),
        ns: u64,
        name: &'a str,
    },
}

/// Writes calls into a trace file as they come, splitting it by size.
pub struct TraceWriter {
    opts: TraceOptions,
    format: Format,
    out: BufWriter<PartFile>,
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
    /// The call being written (kept: one allocation for every call).
    line: String,
    bytes: Vec<u8>,
    /// NCCL groups open on each thread.
    groups: NcclGroups,
    /// Messages numbered on both sides, for the arrows from sends to receives.
    flows: Flows,
    largest_clock_error: Option<(String, u64)>,
    /// Whether the last file is closed.
    closed: bool,
    /// Per thread, the call whose arrivals follow it (`MPI_Testsome` ...) and their
    /// flows: one slice for all, written at the thread's next event.
    following: HashMap<(u32, u32), (pb::CallEvent, Vec<u64>)>,
    /// Under `--steps`: each process's.
    steps: Option<StepCounter>,
}

/// A trace abandoned by an error (the probes could not be set up, a daemon went away) is
/// closed all the same: its file holds what was written, and loads.
impl Drop for TraceWriter {
    fn drop(&mut self) {
        if !self.closed {
            self.closed = true;
            let _ = self.close_part();
        }
    }
}

impl TraceWriter {
    /// Creates the first file (fails before anything runs when it cannot be written).
    pub fn create(opts: TraceOptions) -> Result<TraceWriter, TraceError> {
        let format = Format::of(&opts.path)?;
        let steps = opts.steps.clone().map(StepCounter::new);
        let out = open(&opts.path)?;
        let mut w = TraceWriter {
            format,
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
            bytes: Vec::with_capacity(256),
            groups: NcclGroups::default(),
            flows: Flows::default(),
            closed: false,
            following: HashMap::new(),
            steps,
        };
        w.begin_part()?;
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
        if let Some(steps) = &mut self.steps {
            steps.named(pid, &name);
        }
        self.processes.entry(pid).or_default().name = Some(name);
    }

    /// Process `pid` was detached, or is watched again after it: its messages are numbered
    /// no more (those it sent or received meanwhile were not seen), so no arrow is drawn
    /// from a message before to one after.
    pub fn detached(&mut self, pid: u32) {
        self.flows.stopped(pid);
    }

    /// Process `pid` exited: every call of its came before (see [`Flows::exited`]).
    pub fn exited(&mut self, pid: u32) {
        self.flows.exited(pid);
        let kept = self.ranks_admit(pid);
        if let Some(steps) = &mut self.steps {
            steps.exited(pid, kept);
        }
    }

    /// Under `--steps` with a last step: whether every process whose calls came (of the
    /// ranks `--ranks` keeps) has begun the step after it, or exited: nothing more of theirs
    /// goes into the trace.
    pub fn steps_done(&self) -> bool {
        self.steps
            .as_ref()
            .is_some_and(|s| s.done(|pid| self.keeps_rank_of(pid)))
    }

    /// Whether `--ranks` keeps process `pid`'s calls now: its rank is known, and listed.
    fn ranks_admit(&self, pid: u32) -> bool {
        let Some(ranks) = &self.opts.ranks else {
            return true;
        };
        self.processes
            .get(&pid)
            .and_then(|p| p.name.as_ref())
            .and_then(|n| n.rank)
            .is_some_and(|r| ranks.contains(&r))
    }

    /// Whether `--ranks` keeps process `pid` (or may: its rank is not known yet).
    fn keeps_rank_of(&self, pid: u32) -> bool {
        self.ranks_admit(pid) || self.processes.get(&pid).is_none_or(|p| p.name.is_none())
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
    /// the group, as a slice around its operations, and a step's marker call its step's
    /// mark (`--steps`, `--step-marker`).
    pub fn call(&mut self, ev: &pb::CallEvent) -> Result<(), TraceError> {
        // Every message is numbered, written or not: both sides count them all.
        let flows = self.flows.ends(ev);
        let thread = (ev.pid, ev.tid);
        if ev.arrival.is_some() {
            // No call: its arrow ends on the call it names, which comes next; or, where it
            // follows that call (`MPI_Test` ...), on that call's end, with the other
            // messages that call completed.
            if let Some((start_ns, duration_ns)) = flows.arrived_in {
                match self.following.get_mut(&thread) {
                    Some((call, into)) if call.start_ns == start_ns => into.extend(flows.into),
                    _ => {
                        self.write_following(thread)?;
                        let call = pb::CallEvent {
                            pid: ev.pid,
                            tid: ev.tid,
                            routine: ev.routine.clone(),
                            start_ns,
                            duration_ns,
                            ..Default::default()
                        };
                        self.following.insert(thread, (call, flows.into));
                    }
                }
            }
            return Ok(());
        }
        self.write_following(thread)?;
        let kept = self.ranks_admit(ev.pid);
        let step = match &mut self.steps {
            Some(steps) => {
                let name = self.processes.get(&ev.pid).and_then(|p| p.name.as_ref());
                steps.call(ev, name, kept)
            }
            None => None,
        };
        let group = self.groups.track(ev);
        if self.write_call(ev, flows, step)? {
            if let Some(steps) = &mut self.steps {
                steps.account(ev);
            }
        }
        match group {
            Some(g) => self.write_call(&g, FlowEnds::default(), None).map(drop),
            None => Ok(()),
        }
    }

    /// Writes a call that had not returned when the trace was made (`ev.unfinished` says
    /// why): the last of its thread, its messages' arrows not drawn (they are numbered by
    /// the calls that returned).
    pub fn unfinished(&mut self, ev: &pb::CallEvent) -> Result<(), TraceError> {
        self.write_following((ev.pid, ev.tid))?;
        self.write_call(ev, FlowEnds::default(), None).map(drop)
    }

    /// Writes the slice of the arrivals that followed `thread`'s last call, if any.
    fn write_following(&mut self, thread: (u32, u32)) -> Result<(), TraceError> {
        match self.following.remove(&thread) {
            Some((call, into)) if self.admits(&call) && self.was_written(&call) => {
                self.write_arrival(&call, into)
            }
            _ => Ok(()),
        }
    }

    /// Whether `ev`, admitted, was written: not left out past `--max-events`.
    fn was_written(&self, ev: &pb::CallEvent) -> bool {
        self.opts.max_events.is_none()
            || self
                .processes
                .get(&ev.pid)
                .is_some_and(|p| p.last_written.get(&ev.tid) == Some(&ev.start_ns))
    }

    /// Whether the options keep `ev`'s slices: its rank, routine and time.
    fn admits(&mut self, ev: &pb::CallEvent) -> bool {
        self.processes.entry(ev.pid).or_default();
        if !self.ranks_admit(ev.pid) || !self.opts.routines.admits(&ev.routine) {
            return false;
        }
        if self
            .steps
            .as_ref()
            .is_some_and(|s| !s.holds(ev.pid, ev.start_ns))
        {
            return false;
        }
        let first = *self.first_ns.get_or_insert(ev.start_ns);
        match self.opts.window {
            Some((from, to)) => {
                let after = ev.start_ns.saturating_sub(first) as f64 / 1e9;
                (from..=to).contains(&after)
            }
            None => true,
        }
    }

    /// Writes `ev`'s slice, if the options keep it, with the mark of the step it begins
    /// (`step`) in the same part; returns whether they keep it (written, or counted past
    /// `--max-events`).
    fn write_call(
        &mut self,
        ev: &pb::CallEvent,
        flows: FlowEnds,
        step: Option<u64>,
    ) -> Result<bool, TraceError> {
        if !self.admits(ev) {
            return Ok(false);
        }
        let process = self.processes.entry(ev.pid).or_default();
        if self
            .opts
            .max_events
            .is_some_and(|max| process.written >= max)
        {
            self.lost.max_events += 1;
            return Ok(true);
        }
        process.written += 1;
        if self.opts.max_events.is_some() {
            process.last_written.insert(ev.tid, ev.start_ns);
        }
        self.split_if_full()?;
        let process = self.processes.entry(ev.pid).or_default();
        process.threads.insert(chrome::track_of(ev));
        if let Some(step) = step {
            self.write_step(ev, step)?;
        }
        self.events += 1;
        self.encode(Item::Slice(
            ev,
            FlowEnds {
                out: flows.out,
                ..FlowEnds::default()
            },
        ))?;
        self.write_arrival(ev, flows.into)?;
        Ok(true)
    }

    /// Marks step `step`'s start on the thread of `ev`, the marker call that begins it
    /// (written next, in the same part).
    fn write_step(&mut self, ev: &pb::CallEvent, step: u64) -> Result<(), TraceError> {
        let name = format!("step {step}");
        self.encode(Item::Mark {
            at: (ev.pid, chrome::track_of(ev)),
            ns: ev.start_ns,
            name: &name,
        })
    }

    /// The slice inside call `ev` that the arrows of the messages `into` (which arrived in
    /// it) end on, if any.
    fn write_arrival(&mut self, ev: &pb::CallEvent, into: Vec<u64>) -> Result<(), TraceError> {
        if into.is_empty() {
            return Ok(());
        }
        self.encode(Item::Slice(
            &arrival(ev),
            FlowEnds {
                into,
                ..FlowEnds::default()
            },
        ))
    }

    /// Appends one item in the file's format.
    fn encode(&mut self, item: Item<'_>) -> Result<(), TraceError> {
        let written = match &mut self.format {
            Format::Chrome(encoder) => {
                let mut line = std::mem::take(&mut self.line);
                line.clear();
                let first = self.part_events == 0;
                match item {
                    Item::Slice(ev, flows) => encoder.slice(&mut line, ev, flows, first),
                    Item::Mark { at, ns, name } => encoder.instant(&mut line, at, ns, name, first),
                }
                let written = self.write(line.as_bytes());
                self.line = line;
                written
            }
            Format::Perfetto(encoder) => {
                let mut bytes = std::mem::take(&mut self.bytes);
                bytes.clear();
                match item {
                    Item::Slice(ev, flows) => encoder.slice(&mut bytes, ev, flows),
                    Item::Mark { at, ns, name } => encoder.instant(&mut bytes, at, ns, name),
                }
                let written = self.write(&bytes);
                self.bytes = bytes;
                written
            }
        };
        self.part_events += 1;
        written
    }

    /// Goes on in the next file once this one is full: only when a call is to be written,
    /// so that no part is empty.
    fn split_if_full(&mut self) -> Result<(), TraceError> {
        if self.part_bytes < self.opts.split_bytes || self.part_events == 0 {
            return Ok(());
        }
        self.close_part()?;
        let next = part_path(&self.opts.path, self.files.len() + 1);
        self.out = open(&next)?;
        self.files.push(next);
        self.part_bytes = 0;
        self.part_events = 0;
        self.begin_part()
    }

    /// Opens the file being written: the JSON array, or a clean Perfetto sequence.
    fn begin_part(&mut self) -> Result<(), TraceError> {
        match &mut self.format {
            Format::Chrome(encoder) => {
                encoder.begin_part();
                self.write(chrome::HEADER.as_bytes())
            }
            Format::Perfetto(encoder) => {
                let mut head = Vec::new();
                encoder.begin_part(&mut head);
                self.write(&head)
            }
        }
    }

    /// Ends the trace: names every track, writes what was lost, closes the file.
    pub fn finish(mut self) -> Result<TraceSummary, TraceError> {
        self.closed = true;
        self.close_part()?;
        Ok(TraceSummary {
            kept: self.out.get_ref().kept(),
            files: std::mem::take(&mut self.files),
            events: self.events,
            lost: self.lost,
            largest_clock_error: self.largest_clock_error.take(),
            steps: self.steps_reached(),
        })
    }

    /// Under `--steps`: how far the processes got, and each step's times.
    fn steps_reached(&self) -> Option<super::StepsReached> {
        self.steps
            .as_ref()
            .map(|s| s.reached(|pid| self.keeps_rank_of(pid), |pid| self.ranks_admit(pid)))
    }

    /// Closes the file being written so that it loads on its own: the names of every
    /// process and thread seen so far, and the metadata.
    fn close_part(&mut self) -> Result<(), TraceError> {
        let threads: Vec<(u32, u32)> = self.following.keys().copied().collect();
        for thread in threads {
            self.write_following(thread)?;
        }
        if self.events == 0 {
            // No call: no file (a refused or failed trace leaves nothing behind), and one
            // that was there is left as it was (an earlier run's trace is worth more than
            // an empty one).
            self.out.get_mut().write_nothing();
            return Ok(());
        }
        let meta = serde_json::json!({
            "commtap": {
                "version": env!("CARGO_PKG_VERSION"),
                "part": self.files.len(),
                "calls_written": self.events,
                "calls_lost": self.lost,
                "messages_without_arrows": self.flows.unlinked,
                "receives_without_arrival": self.flows.arrivals_not_seen(),
                "max_events_policy": "the first --max-events calls of each process are kept",
                // The step table, whole, in the last part only (`closed`: the trace is
                // being finished).
                "steps": self.steps_reached().map(|reached| {
                    let steps = &reached.steps;
                    serde_json::json!({
                        "from": steps.from,
                        "to": steps.to,
                        "marker": steps.marker.to_string(),
                        "rule": "each process's calls from the start of its marker call that \
                                 begins step FROM to the start of the one that begins step \
                                 TO+1; a collective marker's instances are counted per \
                                 communicator of a job (and per node where its numbers are the \
                                 node's own), from the first the trace saw (step 1)",
                        "per_step": if self.closed {
                            serde_json::json!(reached.per_step)
                        } else {
                            "in the trace's last part".into()
                        },
                        "per_step_rule": "over the processes that ended the step: its time \
                                          from the start of a process's marker call to the \
                                          start of its next, the sum of the durations of its \
                                          calls begun in the step (all threads), its GPU's \
                                          time in NCCL's device windows begun in the step, \
                                          its calls and bytes; the least and most of each, \
                                          and whose (the first of equals)",
                        "calls_not_tabled": reached.unplaced,
                    })
                }),
                "clock": self.clocks,
            }
        });
        let tail = match &mut self.format {
            Format::Chrome(encoder) => {
                let mut tail = String::new();
                encoder.release(&mut tail);
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
                tail.push_str(&chrome::footer(&meta));
                tail.into_bytes()
            }
            Format::Perfetto(encoder) => {
                let names = self
                    .processes
                    .iter()
                    .map(|(pid, p)| (*pid, p.name.clone()))
                    .collect();
                let mut tail = Vec::new();
                encoder.end_part(&mut tail, &names, &meta);
                tail
            }
        };
        self.write(&tail)?;
        let path = self.files.last().cloned().unwrap_or_default();
        self.out.flush().map_err(|source| TraceError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    fn write(&mut self, s: &[u8]) -> Result<(), TraceError> {
        self.part_bytes += s.len() as u64;
        let path = self.files.last();
        self.out.write_all(s).map_err(|source| TraceError::Io {
            path: path.map(|p| p.display().to_string()).unwrap_or_default(),
            source,
        })
    }
}

/// The slice a received message's arrow ends on: 1 ns just before the end of the receive
/// that took it (or of the wait that completed its nonblocking receive), inside it; one
/// for all the messages a wait completed. An arrow must end on an event of its own time for DevTools,
/// and strictly inside a slice for Perfetto (which closes a slice before anything else at
/// its end): the receive's end is neither, so both formats end the arrow here. It ends
/// 1 ns before the receive does: viewers that add times as floats (DevTools) then still
/// find it inside.
fn arrival(ev: &pb::CallEvent) -> pb::CallEvent {
    let end = ev.start_ns + ev.duration_ns;
    pb::CallEvent {
        pid: ev.pid,
        tid: ev.tid,
        routine: ARRIVAL.into(),
        start_ns: end.saturating_sub(2).max(ev.start_ns),
        duration_ns: 1,
        ..Default::default()
    }
}

/// The name of the slice an arrow ends on.
pub const ARRIVAL: &str = "message received";

/// What the trace knows of one process: one lookup per call finds it all.
#[derive(Debug, Default)]
struct Traced {
    /// Its track's name (None: not known yet).
    name: Option<ProcessName>,
    /// Calls written.
    written: u64,
    /// Under `--max-events`, each thread's last call written (its start): the arrivals
    /// that follow a call left out are left out too.
    last_written: HashMap<u32, u64>,
    /// Its threads seen.
    threads: BTreeSet<u32>,
}

/// Opens a trace file (never through a symlink: commtap runs as root). A file already
/// there is emptied only when the trace's first bytes reach it.
fn open(path: &Path) -> Result<BufWriter<PartFile>, TraceError> {
    PartFile::open(path)
        .map(|f| BufWriter::with_capacity(1 << 20, f))
        .map_err(|source| TraceError::Io {
            path: path.display().to_string(),
            source,
        })
}

/// A part's file: one that was there is truncated at the first write, not at the open, so
/// that a trace that ends with no call can leave it as it was, and one made for it can be
/// taken away.
#[derive(Debug)]
struct PartFile {
    file: std::fs::File,
    /// The directory it was opened in, held (`O_PATH`), and its name there: a file made
    /// for a trace with no call is removed there, never through a path whose directories
    /// may since point elsewhere (root removing another file of that name).
    dir: std::fs::File,
    name: std::ffi::OsString,
    /// Whether it was there, untouched so far.
    untouched: bool,
    /// Whether writes go nowhere: the trace wrote no call.
    nothing: bool,
}

impl PartFile {
    fn open(path: &Path) -> std::io::Result<PartFile> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let (file, there) = crate::report::open_file(path)?;
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(crate::report::directory_of(path))?;
        Ok(PartFile {
            file,
            dir,
            name: path.file_name().unwrap_or_default().to_owned(),
            untouched: there,
            nothing: false,
        })
    }

    /// Whether the file that was there was left as it was (the trace wrote no call).
    fn kept(&self) -> bool {
        self.nothing && self.untouched
    }

    /// The trace ends with no call: the file is left as it was if it was there, else
    /// removed from the directory it was made in (if its name there is still the file
    /// made, empty).
    fn write_nothing(&mut self) {
        use std::os::unix::{fs::MetadataExt as _, io::AsRawFd as _};
        if self.nothing {
            return;
        }
        self.nothing = true;
        if self.untouched {
            return;
        }
        let dir = Some(self.dir.as_raw_fd());
        let named = nix::sys::stat::fstatat(
            dir,
            self.name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        let made = self.file.metadata();
        if let (Ok(named), Ok(made)) = (named, made) {
            if (named.st_dev, named.st_ino) == (made.dev(), made.ino()) && made.len() == 0 {
                let _ = nix::unistd::unlinkat(
                    dir,
                    self.name.as_os_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                );
            }
        }
    }
}

impl Write for PartFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.nothing {
            return Ok(buf.len());
        }
        if self.untouched {
            self.file.set_len(0)?;
            self.untouched = false;
        }
        self.file.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The `n`th file of a split trace: `t.json`, `t.2.json`, `t.3.json` ... (`t.2.pftrace`
/// for Perfetto's format).
pub fn part_path(first: &Path, n: usize) -> PathBuf {
    if n <= 1 {
        return first.to_path_buf();
    }
    let stem = first
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = first
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    first.with_file_name(format!("{stem}.{n}.{ext}"))
}
