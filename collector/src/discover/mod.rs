//! Finding processes and what they map: rank, job and launcher from the environment, and
//! the library files to probe from `/proc/PID/maps` (through `/proc/PID/root` so that
//! processes in containers resolve in their own mount namespace), and what their memory
//! shows of libfabric (`memory`).

pub mod accounts;
pub mod cgroup;
pub mod container;
pub mod directory;
pub mod memory;
pub mod process_dir;
pub mod process_memory;
pub mod read_share;
pub mod stack;
pub mod tracked;

use std::{
    collections::{hash_map::Entry, BTreeMap, HashMap, HashSet},
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// A libfabric fabric a process opened.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub struct Fabric {
    /// Provider, layered ones included: `tcp;ofi_rxm`.
    pub provider: String,
    /// Fabric name (for tcp and udp, the network: `127.0.0.0/8`).
    pub name: String,
}

/// Errors inspecting a process.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// No such process (or it exited).
    #[error("no process with PID {0} (it does not exist or has exited)")]
    NoSuchProcess(u32),
    /// `/proc/PID/...` could not be read.
    #[error("reading /proc/{pid}/{what}")]
    Proc {
        /// The process.
        pid: u32,
        /// Which file.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Its list of mappings is past what is read of one (a process of any user can make it
    /// hundreds of megabytes).
    #[error(
        "the mappings of process {0} list more than {mib} MiB (/proc/{0}/maps): not read",
        mib = process_dir::MAX_MAPS_BYTES >> 20
    )]
    MapsTooLarge(u32),
    /// Its owner's share of the daemon's time for reading lists of mappings is spent for
    /// now (see [`read_share`]).
    #[error(
        "the daemon's time for reading the mappings of user {uid}'s processes is spent for \
         now ({burst} s at once, then {pct}% of a core): process {pid} is read again in \
         {ready_in_s} s",
        burst = read_share::BURST.as_secs(),
        pct = read_share::RATE * 100.0
    )]
    ShareSpent {
        /// The process.
        pid: u32,
        /// Its real user.
        uid: u32,
        /// Seconds until its owner's share refills enough.
        ready_in_s: u64,
    },
}

/// What commtap knows of a watched process from `/proc`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Command line, space separated.
    pub cmdline: String,
    /// MPI world rank from the launcher's environment.
    pub rank: Option<u32>,
    /// MPI world size from the launcher's environment.
    pub world_size: Option<u32>,
    /// The variable `rank` was read from (`OMPI_COMM_WORLD_RANK`, PyTorch's `RANK`, ...).
    #[serde(skip)]
    pub rank_from: Option<&'static str>,
    /// Batch job id (Slurm, PBS, LSF) if the process runs in one.
    pub batch_job: Option<String>,
    /// Whether `batch_job` comes from the process's cgroup (a Slurm `job_<id>` directory
    /// that root made, which only root can put a process in) rather than from its environment (which its owner
    /// writes, and so may name another user's job).
    pub batch_job_from_cgroup: bool,
    /// The launcher's own job key (PMIx namespace, Open MPI jobid, Hydra UUID), if any.
    pub launcher_job: Option<String>,
    /// Process start time in clock ticks since boot (with the pid, a unique identity).
    pub start_ticks: u64,
    /// Real user id of the process.
    pub uid: Option<u32>,
    /// The container it runs in, if any.
    pub container: Option<container::Container>,
    /// Its environment's settings of the communication libraries ([`SETTING_PREFIXES`]),
    /// bounded and made printable ([`settings_of`]).
    #[serde(skip)]
    pub settings: BTreeMap<String, String>,
}

/// Prefixes of the environment variables that set the communication libraries up (NCCL
/// and PyTorch's use of it, libfabric, UCX, Open MPI's MCA parameters, Intel MPI, MPICH's
/// control variables, MVAPICH2, Horovod, OpenMP): what a performance engineer asks of a
/// run ("was NCCL_ALGO set? which FI_PROVIDER?").
pub const SETTING_PREFIXES: &[&str] = &[
    "NCCL_",
    "TORCH_NCCL_",
    "FI_",
    "UCX_",
    "OMPI_MCA_",
    "I_MPI_",
    "MPIR_CVAR_",
    "MV2_",
    "HOROVOD_",
    "OMP_",
];
/// Of those, the launchers' own plumbing, left out: where mpirun's daemon listens, its
/// session directory and job key (`OMPI_MCA_orte_precondition_transports` is the job's
/// key to its fabric), a Horovod worker's place and rendezvous; no setting of the user's.
const SETTING_PLUMBING: &[&str] = &[
    "OMPI_MCA_orte_",
    "OMPI_MCA_ess",
    "OMPI_MCA_pmix",
    "OMPI_MCA_initial_wdir",
    "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_",
    "HOROVOD_CROSS_",
    "HOROVOD_HOSTNAME",
    "HOROVOD_GLOO_",
    "I_MPI_HYDRA_UUID",
    // Open MPI 5's job key to its fabric.
    "OMPI_MCA_opal_precondition_transports",
    // MVAPICH2's numbering of each rank.
    "MV2_COMM_WORLD_",
];
/// Settings kept of one process, at most.
const MAX_SETTINGS: usize = 128;
/// Bytes of a setting's name kept, at most (longer ones are left out).
const MAX_SETTING_NAME: usize = 64;
/// Characters of a setting's value kept, at most (the rest cut, marked `...`).
const MAX_SETTING_VALUE: usize = 256;

/// The settings among a process's environment ([`SETTING_PREFIXES`]): at most
/// [`MAX_SETTINGS`], the first by name; control characters escaped (a report is read on a
/// terminal, and the environment is its owner's to write); long values cut.
pub fn settings_of<K: AsRef<str>, V: AsRef<str>>(
    env: impl IntoIterator<Item = (K, V)>,
) -> BTreeMap<String, String> {
    let mut kept: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in env {
        let (name, value) = (name.as_ref(), value.as_ref());
        if name.len() > MAX_SETTING_NAME
            || !SETTING_PREFIXES.iter().any(|p| name.starts_with(p))
            || SETTING_PLUMBING.iter().any(|p| name.starts_with(p))
            || name.chars().any(char::is_control)
        {
            continue;
        }
        if kept.len() == MAX_SETTINGS {
            // The first by name are kept, whatever order they came in.
            match kept.last_key_value() {
                Some((last, _)) if name < last.as_str() => {
                    kept.pop_last();
                }
                _ => continue,
            }
        }
        let cut: String = value.chars().take(MAX_SETTING_VALUE).collect();
        let mut shown = crate::client::printable(&cut);
        if value.chars().nth(MAX_SETTING_VALUE).is_some() {
            shown.push_str("...");
        }
        kept.insert(name.to_string(), shown);
    }
    kept
}

/// Variables that carry the world rank, in order of preference, each with the one its
/// launcher sets the world size in beside it (a batch job's SLURM_NTASKS is the allocation's,
/// not that of an `mpirun` inside it).
const RANK_VARS: &[(&str, Option<&str>)] = &[
    // Horovod's own launcher (`horovodrun` with Gloo) sets it for its workers alone, below
    // whatever started `horovodrun` (a batch script's SLURM_PROCID=0, say).
    ("HOROVOD_RANK", Some("HOROVOD_SIZE")),
    ("OMPI_COMM_WORLD_RANK", Some("OMPI_COMM_WORLD_SIZE")),
    ("PMI_RANK", Some("PMI_SIZE")),
    ("PMIX_RANK", None),
    ("SLURM_PROCID", Some("SLURM_NTASKS")),
    ("MV2_COMM_WORLD_RANK", Some("MV2_COMM_WORLD_SIZE")),
    ("ALPS_APP_PE", None),
    // PyTorch's launchers (torchrun, torch.distributed's env:// rendezvous).
    ("RANK", Some("WORLD_SIZE")),
];
/// Variables that carry the world size, for a rank variable that has none beside it (then
/// PyTorch's `WORLD_SIZE`); also how many tasks a launcher above PyTorch's started.
const TASK_SIZE_VARS: &[&str] = &[
    "HOROVOD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_NTASKS",
    "MV2_COMM_WORLD_SIZE",
];
/// Batch systems' job ids (mpitrace's choice for profile file names).
const BATCH_JOB_VARS: &[&str] = &["SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "COBALT_JOBID"];
/// Launchers' own job keys.
const LAUNCHER_JOB_VARS: &[&str] = &[
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "I_MPI_HYDRA_UUID",
    "TORCHELASTIC_RUN_ID",
];

fn proc_err(pid: u32, what: &'static str) -> impl FnOnce(std::io::Error) -> DiscoverError {
    move |source| {
        if source.kind() == std::io::ErrorKind::NotFound
            || source.raw_os_error() == Some(libc::ESRCH)
        {
            DiscoverError::NoSuchProcess(pid)
        } else {
            DiscoverError::Proc { pid, what, source }
        }
    }
}

/// Field `i` (from 0) of a `/proc/PID/stat` line after the `)` that closes the command
/// name (which may hold spaces and parentheses): 0 is the state, 4 `tty_nr`, 19
/// `starttime`.
pub fn stat_field(stat: &str, i: usize) -> Option<&str> {
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(i))
}

/// `starttime` of a `/proc/PID/stat` line (field 22, counted after the `)` that closes the
/// command name): the process's start in clock ticks since boot.
fn stat_start_ticks(stat: &str) -> Option<u64> {
    stat_field(stat, 19)?.parse().ok()
}

/// Clock ticks a second, the unit of `/proc`'s times (`_SC_CLK_TCK`; 100 where not said).
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a constant.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&hz| hz > 0)
        .unwrap_or(100)
}

/// What a running process has used so far, as `/proc` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveUsage {
    /// CPU time in user mode of all its threads, live and ended, ns (clock ticks' worth).
    pub user_ns: u64,
    /// CPU time in the kernel, ns.
    pub system_ns: u64,
    /// Its largest resident set so far, bytes (`VmHWM`).
    pub max_rss_bytes: u64,
    /// Context switches of its live threads, voluntary and not (`None`: more threads than
    /// [`LIVE_THREADS_READ`]). Its ended threads' are the kernel's to add.
    pub live_context_switches: Option<u64>,
}

/// The threads of a running process whose context switches are read, at most: each is a
/// file, read at every report.
pub const LIVE_THREADS_READ: usize = 4096;

/// What the process that is `pid`, started at `start_ticks`, has used so far; `None` where
/// it is gone (or a zombie, whose memory is gone) or another process has its pid.
pub fn live_usage(pid: u32, start_ticks: u64) -> Option<LiveUsage> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut usage = parse_live_usage(&stat, &status, clock_ticks_per_second())?;
    // Not walked at all past the cap: each thread is a file read at every report.
    let threads: usize = status_field(&status, "Threads")
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    if threads <= LIVE_THREADS_READ {
        usage.live_context_switches = live_context_switches(pid);
    }
    // The status read after the stat: still the same process where its start is.
    (stat_start_ticks(&stat) == Some(start_ticks) && self::start_ticks(pid) == Some(start_ticks))
        .then_some(usage)
}

/// The ids of `pid`'s threads (`/proc/PID/task`); `None` past [`LIVE_THREADS_READ`] (the
/// walk stops there), or where the process is gone.
pub fn thread_ids(pid: u32) -> Option<Vec<u32>> {
    let mut ids = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        if ids.len() == LIVE_THREADS_READ {
            return None;
        }
        if let Some(id) = task.file_name().to_str().and_then(|n| n.parse().ok()) {
            ids.push(id);
        }
    }
    Some(ids)
}

/// The context switches of `pid`'s live threads (`/proc/PID/task/*/status`: a process's own
/// `status` counts its first thread's alone); `None` past [`LIVE_THREADS_READ`] threads.
fn live_context_switches(pid: u32) -> Option<u64> {
    let mut sum = 0u64;
    for tid in thread_ids(pid)? {
        // A thread that ended since the listing has nothing left to add here, nor has one
        // past its end (a zombie, or dead): the kernel added its switches as it ended.
        if let Ok(status) = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) {
            let ended = status_field(&status, "State")
                .is_some_and(|v| matches!(v.chars().next(), Some('Z' | 'X')));
            if !ended {
                sum = sum.saturating_add(context_switches_of(&status));
            }
        }
    }
    Some(sum)
}

/// `voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches` of a `/proc/.../status` text.
fn context_switches_of(status: &str) -> u64 {
    ["voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"]
        .iter()
        .filter_map(|name| status_field(status, name)?.parse::<u64>().ok())
        .fold(0, u64::saturating_add)
}

/// The real user id a `/proc/PID/status` text names (its `Uid:` line's first field).
fn real_uid(status: &str) -> Option<u32> {
    status_field(status, "Uid")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The value of the line `name:` of a `/proc/.../status` text, trimmed.
fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (n, value) = l.split_once(':')?;
        (n == name).then(|| value.trim())
    })
}

/// [`LiveUsage`] from a `/proc/PID/stat` line (`utime`, `stime`: fields 14 and 15, in
/// clock ticks of `hz` a second) and `/proc/PID/status` text (`VmHWM:  N kB`).
fn parse_live_usage(stat: &str, status: &str, hz: u64) -> Option<LiveUsage> {
    let ticks = |i| -> Option<u64> { stat_field(stat, i)?.parse().ok() };
    let ns = |t: u64| (u128::from(t) * 1_000_000_000 / u128::from(hz.max(1))) as u64;
    let hwm_kib: u64 = status_field(status, "VmHWM")?
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(LiveUsage {
        user_ns: ns(ticks(11)?),
        system_ns: ns(ticks(12)?),
        max_rss_bytes: hwm_kib.saturating_mul(1024),
        live_context_switches: None,
    })
}

/// When the process that is `pid` now started (clock ticks since boot): with the pid, who it
/// is (a pid is reused, the pair is not).
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_start_ticks(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Bytes of a process's `/proc/PID/cmdline` read: what [`MAX_CMDLINE`] shows, with room
/// for empty arguments.
const MAX_CMDLINE_READ: u64 = 64 << 10;

/// Bytes of a process's `/proc/PID/environ` read: what `exec` gives a process of arguments
/// and environment together, at most (three quarters of the 8 MiB stack limit). A process
/// can move its environment's bounds (`PR_SET_MM_MAP`, no privilege needed) over memory of
/// any size it never touches: read whole, gigabytes.
const MAX_ENVIRON_READ: u64 = 6 << 20;

/// Reads a process's identity and launcher environment (all of one process: its
/// directory opened once).
pub fn process_info(pid: u32) -> Result<ProcessInfo, DiscoverError> {
    process_info_in(&process_dir::ProcessDir::open(pid, None)?)
}

/// [`process_info`] of the process whose directory `dir` is.
pub fn process_info_in(dir: &process_dir::ProcessDir) -> Result<ProcessInfo, DiscoverError> {
    let pid = dir.pid();
    let text = |name| dir.read_text(name, process_dir::SMALL_FILE_BYTES);
    let start_ticks = stat_start_ticks(&text("stat")?).unwrap_or(0);
    let uid = real_uid(&text("status")?);
    let cmdline = dir.read_at_most("cmdline", MAX_CMDLINE_READ)?;
    let environ = whole_variables(
        dir.read_at_most("environ", MAX_ENVIRON_READ + 1)?,
        MAX_ENVIRON_READ,
    );
    let mut info = ProcessInfo::from_parts(pid, uid, start_ticks, &cmdline, &environ);
    info.place(dir);
    Ok(info)
}

impl ProcessInfo {
    /// When it started (clock ticks since boot), where that is known.
    pub fn known_start(&self) -> Option<u64> {
        Some(self.start_ticks).filter(|&s| s != 0)
    }

    /// How this process is numbered in its job ([`Numbering`]).
    pub fn numbering(&self) -> Numbering<'_> {
        (
            self.rank,
            self.world_size,
            self.launcher_job.as_deref(),
            self.rank_from,
        )
    }

    /// A process's identity from its raw command line and environment (NUL-separated, as
    /// `/proc/PID/{cmdline,environ}` or the kernel's identity event give them); placed
    /// later ([`ProcessInfo::place`]).
    pub fn from_parts(
        pid: u32,
        uid: Option<u32>,
        start_ticks: u64,
        cmdline: &[u8],
        environ: &[u8],
    ) -> ProcessInfo {
        let env = identity_vars(environ);
        let first = |vars: &[&str]| {
            vars.iter()
                .find_map(|v| env.get(*v).filter(|s| !s.is_empty()).cloned())
        };
        let set = |v: &str| env.get(v).filter(|s| !s.is_empty()).cloned();
        let mut chosen = RANK_VARS
            .iter()
            .find_map(|(r, size)| Some((*r, set(r)?, size.and_then(set))));
        // A PyTorch launcher (torchrun, DeepSpeed's) starts its workers below a task of
        // Slurm's, PMIx's or an MPI's (one per node, or a batch script's): those variables,
        // which the workers inherit, number the launchers; RANK numbers the workers. Known
        // by torchrun's own variable, or by a LOCAL_RANK in a world larger than the tasks'
        // (a task count not known is taken as smaller) or, below a batch script's single
        // Slurm task, other than the task's own local id; and never in a world smaller than
        // the tasks' (MPI ranks started from a torchrun worker inherit its RANK).
        if let Some(rank) = set("RANK") {
            let world = set("WORLD_SIZE");
            let count = |n: Option<String>| n.as_deref().and_then(|n| n.parse::<u64>().ok());
            let tasks = count(
                chosen
                    .as_ref()
                    .and_then(|(_, _, n)| n.clone())
                    .or_else(|| first(TASK_SIZE_VARS)),
            );
            let workers = count(world.clone());
            let local = set("LOCAL_RANK");
            let below_task = local.is_some()
                && (workers > tasks
                    || (chosen.as_ref().is_some_and(|(v, ..)| *v == "SLURM_PROCID")
                        && local != set("SLURM_LOCALID")));
            let elastic = set("TORCHELASTIC_RUN_ID").is_some();
            if workers.is_some() && workers >= tasks && (elastic || below_task) {
                chosen = Some(("RANK", rank, world));
            }
        }
        let rank_from = chosen.as_ref().map(|(var, ..)| *var);
        let chosen = chosen.map(|(_, rank, size)| (rank, size));
        let (rank, size_beside) = chosen.unzip();
        let size_beside = size_beside.flatten();
        ProcessInfo {
            pid,
            cmdline: cmdline_text(cmdline),
            rank: rank.and_then(|s| s.parse().ok()),
            world_size: size_beside
                .or_else(|| first(TASK_SIZE_VARS))
                .or_else(|| set("WORLD_SIZE"))
                .and_then(|s| s.parse().ok())
                .filter(|&n: &u32| n > 0),
            rank_from,
            batch_job_from_cgroup: false,
            batch_job: first(BATCH_JOB_VARS),
            launcher_job: first(LAUNCHER_JOB_VARS),
            start_ticks,
            uid,
            container: None,
            settings: settings_of(environ_vars(environ, |name| {
                SETTING_PREFIXES
                    .iter()
                    .any(|p| name.starts_with(p.as_bytes()))
            })),
        }
    }

    /// Places the process by its cgroup (`/proc/PID/cgroup`, of `process`: its own
    /// directory): the batch job where it names a Slurm job's cgroup (root's: see
    /// [`cgroup::slurm_job`]; that, not the environment's claim, is the process's job), and
    /// the container it runs in. Left unplaced where its cgroup cannot be read.
    pub fn place(&mut self, process: &process_dir::ProcessDir) {
        let Ok(cgroup) = process.read_text("cgroup", process_dir::SMALL_FILE_BYTES) else {
            return;
        };
        if let Some(job) = cgroup::slurm_job(&cgroup) {
            self.batch_job = Some(job);
            self.batch_job_from_cgroup = true;
        }
        self.container = container::of_process(process, &cgroup);
    }
}

/// Longest command line kept (what mpitrace and `ps` users need to recognise a job; a
/// user's own arguments can be megabytes, which would travel in every snapshot).
pub const MAX_CMDLINE: usize = 4096;

/// `/proc/PID/cmdline` as text: arguments joined by spaces, at most [`MAX_CMDLINE`] bytes
/// (cut at a character boundary, with `…` to say so).
fn cmdline_text(raw: &[u8]) -> String {
    let mut text = raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    if text.len() > MAX_CMDLINE {
        let mut end = MAX_CMDLINE;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// A raw environment read to `cap` bytes and one more: where it went past `cap`, cut at
/// its last whole variable within (`RANK=12` is not read as `RANK=1`).
fn whole_variables(mut raw: Vec<u8>, cap: u64) -> Vec<u8> {
    if raw.len() as u64 > cap {
        raw.truncate(usize::try_from(cap).unwrap_or(usize::MAX));
        let whole = raw.iter().rposition(|b| *b == 0).map_or(0, |i| i + 1);
        raw.truncate(whole);
    }
    raw
}

/// The variables of a raw environment (`NAME=value`, NUL-separated) whose names `wanted`
/// takes (looked at before anything is copied), as written.
fn environ_vars<'a>(
    raw: &'a [u8],
    wanted: impl Fn(&[u8]) -> bool + 'a,
) -> impl Iterator<Item = (String, String)> + 'a {
    raw.split(|b| *b == 0).filter_map(move |kv| {
        let eq = kv.iter().position(|b| *b == b'=')?;
        let (name, value) = (&kv[..eq], &kv[eq + 1..]);
        wanted(name).then(|| {
            (
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            )
        })
    })
}

/// Of a raw environment, the variables that say who a process is ([`RANK_VARS`] and the
/// like): not every variable kept (an environment of millions of tiny ones would be held
/// whole).
fn identity_vars(raw: &[u8]) -> BTreeMap<String, String> {
    const PYTORCH: &[&str] = &["LOCAL_RANK", "SLURM_LOCALID", "TORCHELASTIC_RUN_ID"];
    let wanted = |name: &[u8]| {
        let is = |v: &str| v.as_bytes() == name;
        RANK_VARS
            .iter()
            .any(|(rank, size)| is(rank) || size.is_some_and(is))
            || [TASK_SIZE_VARS, BATCH_JOB_VARS, LAUNCHER_JOB_VARS, PYTORCH]
                .iter()
                .any(|vars| vars.iter().any(|v| is(v)))
    };
    environ_vars(raw, wanted).collect()
}

/// A file mapped executable by a process.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MappedObject {
    /// Device and inode: the identity of the file, whatever path reaches it.
    pub dev_inode: (u64, u64),
    /// Its contents' stamp (what tells them from another file's at the same identity).
    pub stamp: crate::symbols::file::FileStamp,
    /// Its path as the process names it (for messages: the file is opened through `range`,
    /// never by this path; see `shown_path`).
    pub path: PathBuf,
    /// One of its mappings (the first executable one): `/proc/PID/map_files/` names the
    /// mapped file by it.
    pub range: (u64, u64),
    /// Its executable mappings' address ranges in the process.
    pub code: Vec<(u64, u64)>,
    /// Start of its mapping at file offset 0 (its load bias: libraries here map their first
    /// segment at virtual address 0), if it has one.
    pub bias: Option<u64>,
    /// One past the last byte it has mapped.
    pub end: u64,
}

impl MappedObject {
    /// Its file's contents: what a file's decisions, symbols and unwinding tables are kept
    /// by (its identity alone may pass to other contents).
    pub fn contents(&self) -> crate::symbols::file::FileKey {
        (self.dev_inode, self.stamp)
    }
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsLine<'a> {
    /// First address.
    pub lo: u64,
    /// One past the last.
    pub hi: u64,
    /// `r-xp` and the like.
    pub perms: &'a str,
    /// File offset of `lo`.
    pub offset: u64,
    /// Device of the file (`st_dev` form), if parseable.
    pub dev: Option<u64>,
    /// Inode of the file (0: anonymous).
    pub inode: u64,
    /// Path or pseudo-name (`[heap]`), empty for anonymous memory.
    pub path: String,
}

/// The parseable lines of a `/proc/PID/maps` text: five columns separated by single
/// spaces, then padding, then the path exactly as the kernel wrote it (a file's name may
/// hold runs of spaces; only a newline is escaped, as `\012`).
pub fn maps_lines(maps: &str) -> impl Iterator<Item = MapsLine<'_>> {
    maps.lines().filter_map(|line| {
        let mut rest = line;
        let mut field = || {
            let (f, r) = rest.split_once(' ').unwrap_or((rest, ""));
            rest = r;
            f
        };
        let (range, perms, offset, dev, inode) = (field(), field(), field(), field(), field());
        let (lo, hi) = range.split_once('-')?;
        Some(MapsLine {
            lo: u64::from_str_radix(lo, 16).ok()?,
            hi: u64::from_str_radix(hi, 16).ok()?,
            perms,
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev: parse_dev(dev),
            inode: inode.parse().ok()?,
            path: rest.trim_start_matches(' ').to_string(),
        })
    })
}

/// `major:minor` as /proc/PID/maps prints it, as `st_dev`.
fn parse_dev(dev: &str) -> Option<u64> {
    let (maj, min) = dev.split_once(':')?;
    let (maj, min) = (
        u64::from_str_radix(maj, 16).ok()?,
        u64::from_str_radix(min, 16).ok()?,
    );
    Some(libc::makedev(maj as u32, min as u32))
}

/// Size of `pid`'s address space in pages (`/proc/PID/statm`): it grows with every new
/// mapping, so it tells cheaply whether the mappings are worth reading again.
pub fn address_space_pages(pid: u32) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Files `pid` maps with at least one executable mapping, one per file, in map order.
pub fn mapped_objects(pid: u32) -> Result<Vec<MappedObject>, DiscoverError> {
    mapped_objects_in(&process_dir::ProcessDir::open(pid, None)?)
}

/// [`mapped_objects`] of the process whose directory `process` is.
pub fn mapped_objects_in(
    process: &process_dir::ProcessDir,
) -> Result<Vec<MappedObject>, DiscoverError> {
    let pid = process.pid();
    let maps = process.maps()?;
    // Every mapping of each file, as the process names it (dev, inode); files without an
    // executable one are dropped before any stat.
    // Found by an index: a list of 60,000 files searched line by line is 1.8 billion
    // comparisons.
    let mut files: Vec<Vec<MapsLine>> = Vec::new();
    let mut index: HashMap<(Option<u64>, u64), usize> = HashMap::new();
    for m in maps_lines(&maps) {
        if m.inode == 0 || !m.path.starts_with('/') || m.path.ends_with(" (deleted)") {
            continue;
        }
        match index.entry((m.dev, m.inode)) {
            Entry::Occupied(at) => files[*at.get()].push(m),
            Entry::Vacant(at) => {
                at.insert(files.len());
                files.push(vec![m]);
            }
        }
    }
    let mut out: Vec<MappedObject> = Vec::new();
    let mut seen = HashSet::new();
    let root = fs::read_link(format!("/proc/{pid}/root")).ok();
    for lines in files {
        if !lines.iter().any(|m| m.perms.contains('x')) {
            continue;
        }
        let in_ns = shown_path(&lines[0].path, root.as_deref(), pid);
        let Some(range) = lines
            .iter()
            .find(|m| m.perms.contains('x'))
            .map(|m| (m.lo, m.hi))
        else {
            continue;
        };
        // The identity of the file the process maps (the kernel's own link to it), as
        // `stat` would give for the file opened later: never a path the process can move.
        let Ok((dev_inode, stamp)) = crate::symbols::file::mapped_identity(pid, range) else {
            continue;
        };
        if !seen.insert(dev_inode) {
            continue;
        }
        out.push(MappedObject {
            dev_inode,
            stamp,
            path: PathBuf::from(in_ns),
            range,
            code: lines
                .iter()
                .filter(|m| m.perms.contains('x'))
                .map(|m| (m.lo, m.hi))
                .collect(),
            bias: lines.iter().find(|m| m.offset == 0).map(|m| m.lo),
            end: lines.iter().map(|m| m.hi).max().unwrap_or(0),
        });
    }
    Ok(out)
}

/// A mapped file's path for messages and reports: as `/proc/PID/maps` gives it for a
/// process with our root; for one in a root of its own (a container, a chroot), as the
/// process itself names it, with whose root it is in (the file may be on a mount no path of
/// ours reaches).
fn shown_path(maps_path: &str, root: Option<&Path>, pid: u32) -> String {
    match root {
        Some(r) if r == Path::new("/") => maps_path.to_string(),
        _ => {
            let inside = root
                .and_then(|r| Path::new(maps_path).strip_prefix(r).ok())
                .map_or_else(|| maps_path.to_string(), |p| format!("/{}", p.display()));
            format!("{inside} (root of pid {pid})")
        }
    }
}

/// The libraries of this machine's kind (x86-64) in the dynamic linker's cache (`ldconfig
/// -p`) whose names `wanted` accepts, each file once.
pub fn linker_cache(wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut found = linker_cache_entries()
        .into_iter()
        .filter(|(name, _)| wanted(name))
        .map(|(_, path)| path)
        .collect();
    // `libucp.so.0` and its development link `libucp.so` are one library.
    keep_distinct_files(&mut found);
    found
}

/// Keeps the first path of each file (`paths` may name one through several links); drops
/// those that cannot be read.
fn keep_distinct_files(paths: &mut Vec<PathBuf>) {
    let mut seen = Vec::new();
    paths.retain(|p| {
        let id = fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
        match id {
            Some(id) if !seen.contains(&id) => {
                seen.push(id);
                true
            }
            _ => false,
        }
    });
}

/// The x86-64 entries of the dynamic linker's cache (`ldconfig -p`), as (name, path): the
/// name as the cache lists it, with its kind (`libmpi.so.40 (libc6,x86-64)`).
fn linker_cache_entries() -> Vec<(String, PathBuf)> {
    let Ok(out) = std::process::Command::new("ldconfig").arg("-p").output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let (name, path) = line.split_once(" => ")?;
            line.contains("x86-64")
                .then(|| (name.to_string(), PathBuf::from(path.trim())))
        })
        .collect()
}

/// MPI, NCCL and libfabric libraries the dynamic linker would find for `command` started
/// from commtap's environment: the `ldconfig` cache, `LD_LIBRARY_PATH`, and the RPATH or
/// RUNPATH of every program the command line names (`mpirun -np 4 ./app`: mpirun's and
/// app's). Probing them before a launched job starts is what lets `record -- CMD` count
/// every call from `MPI_Init` (or the first NCCL or fabric call) on.
pub fn candidate_libraries(command: &[String]) -> Vec<PathBuf> {
    let mut found = linker_cache(is_probed_name);
    let mut dirs = ld_library_path();
    for program in command.iter().filter_map(|arg| program_file(arg)) {
        dirs.extend(crate::symbols::dynamic_needs(&program).search_path);
    }
    for dir in dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if is_probed_name(&e.file_name().to_string_lossy()) {
                found.push(e.path());
            }
        }
    }
    keep_distinct_files(&mut found);
    found
}

/// The file names (as the dynamic linker looks for them) of the libraries whose calls
/// make a process a rank: MPI and NCCL.
const RANK_LIBRARIES: &[&str] = &[
    "libmpi.so",
    "libmpich.so",
    "libmpi_abi.so",
    "libnccl.so",
    "librccl.so",
];

/// The file names of MPIs' Fortran bindings (Open MPI's `mpif.h` and `mpi_f08` ones,
/// MPICH's, Intel MPI's), probed with call sites: each process's first binding call
/// (`MPI_INIT`) then has its program's site too.
const FORTRAN_BINDINGS: &[&str] = &[
    "libmpi_mpifh.so",
    "libmpi_usempif08.so",
    "libmpichfort.so",
    "libmpifort.so",
];

/// Whether a library's file name is one commtap probes: a rank's ([`RANK_LIBRARIES`]), a
/// transport's under it (libfabric, UCX), or Fortran bindings ([`FORTRAN_BINDINGS`]).
fn is_probed_name(name: &str) -> bool {
    is_rank_library(name)
        || ["libfabric.so", "libucp.so"]
            .iter()
            .chain(FORTRAN_BINDINGS)
            .any(|n| name.starts_with(n))
}

/// Whether the file at `path` is named as an MPI's Fortran bindings are.
pub fn is_fortran_bindings_path(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| FORTRAN_BINDINGS.iter().any(|b| n.starts_with(b)))
}

/// Whether a library's file name is an MPI's or an NCCL's.
fn is_rank_library(name: &str) -> bool {
    RANK_LIBRARIES.iter().any(|n| name.starts_with(n))
}

/// The directories of commtap's own `LD_LIBRARY_PATH`.
fn ld_library_path() -> Vec<PathBuf> {
    std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The MPI, NCCL and libfabric libraries the programs `command` names need directly
/// (`DT_NEEDED`: `mpirun -np 4 ./app`, where `app` was built with `mpicc`, needs
/// `libmpi.so.40`), where the dynamic linker would find them (the program's RPATH or
/// RUNPATH, `LD_LIBRARY_PATH`, the `ldconfig` cache): the MPI a launched job will load,
/// known before it starts. A hint (an interpreter's job, `python app.py`, names none).
pub fn libraries_needed_by(command: &[String]) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    // Read once, and only if some name is not in a program's own directories.
    let mut cache: Option<Vec<(String, PathBuf)>> = None;
    for program in command.iter().filter_map(|arg| program_file(arg)) {
        let needs = crate::symbols::dynamic_needs(&program);
        let names: Vec<&String> = needs.names.iter().filter(|n| is_probed_name(n)).collect();
        if names.is_empty() {
            continue;
        }
        let mut dirs = needs.search_path;
        dirs.extend(ld_library_path());
        for name in names {
            let in_dirs = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
            let path = in_dirs.or_else(|| {
                // The cache's names come with their kind: `libmpi.so.40 (libc6,x86-64)`.
                cache
                    .get_or_insert_with(linker_cache_entries)
                    .iter()
                    .find(|(n, _)| n.split(' ').next() == Some(name.as_str()))
                    .map(|(_, p)| p.clone())
            });
            // As the ranks will map it (`libmpi.so.40.30.4`, not the cache's link to it),
            // which is how the profile names it.
            let path = path.map(|p| fs::canonicalize(&p).unwrap_or(p));
            if let Some(p) = path.filter(|p| !found.contains(p)) {
                found.push(p);
            }
        }
    }
    found
}

/// The file a command-line word names, if it is one: a path (`./app`, `/opt/x/bin/app`),
/// or a bare name found on `PATH` (`mpirun`).
fn program_file(word: &str) -> Option<PathBuf> {
    if word.contains('/') {
        let p = PathBuf::from(word);
        return p.is_file().then_some(p);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join(word))
            .find(|p| p.is_file())
    })
}

/// The process (thread group) `pid` is a thread of, from its `/proc/PID/status`: itself
/// for a process; `None` where that cannot be read.
pub fn thread_group_of(pid: u32) -> Option<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| tgid_in_status(&s))
}

/// Whether the process or thread `pid` has ended: gone from `/proc`, or a zombie whose
/// threads have all ended (a thread-group leader that ended before its threads shows as
/// a zombie too, its process running on). A process or thread running now, or one not
/// looked at (`/proc` unreadable otherwise), has not.
pub fn has_ended(pid: u32) -> bool {
    let stat = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) => return e.kind() == std::io::ErrorKind::NotFound,
    };
    if !matches!(stat_field(&stat, 0), Some("Z" | "X")) {
        return false;
    }
    fs::read_dir(format!("/proc/{pid}/task")).map_or(true, |tasks| tasks.flatten().count() <= 1)
}

/// When the process `pid` started, boot-time ns (a tick's precision), if it is running.
pub fn started_boottime_ns(pid: u32) -> Option<u64> {
    Some(start_ticks(pid)?.saturating_mul(1_000_000_000) / clock_ticks_per_second())
}

/// The `Tgid:` of a `/proc/PID/status` text.
fn tgid_in_status(status: &str) -> Option<u32> {
    status_field(status, "Tgid")?.parse().ok()
}

/// Every process below `root` (its children, theirs, ...) in the tree `parent` (pid to
/// parent pid, as [`process_tree`] read it), commtap and its ancestors excepted, by pid: a
/// launcher's ranks (`mpirun`'s, a shell script's). None below init: every process is, and
/// it launches no one job.
pub fn descendants_in(root: u32, parent: &BTreeMap<u32, u32>) -> Vec<u32> {
    if root == 1 {
        return Vec::new();
    }
    below(root, std::process::id(), parent)
}

/// Each process's parent, by pid, as `/proc` says now (those that could not be read left
/// out).
pub fn process_tree() -> BTreeMap<u32, u32> {
    let mut parent = BTreeMap::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return parent;
    };
    for pid in dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
    {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some(ppid) = stat_field(&stat, 1).and_then(|p| p.parse().ok()) {
            parent.insert(pid, ppid);
        }
    }
    parent
}

/// How a process is numbered in its job: its rank, world size, job key and the variable
/// its rank came from. Two processes alike are one rank and a helper it started.
pub type Numbering<'a> = (
    Option<u32>,
    Option<u32>,
    Option<&'a str>,
    Option<&'static str>,
);

/// The ranks of a job among the processes below `root` in the tree `parent` (pid to parent
/// pid; `me` and its ancestors excepted, as [`descendants_in`] does): those that map an
/// MPI or NCCL (`numbering` is `Some` for those alone) with none that does between them
/// and `root` (`root` included), or numbered otherwise than the nearest that does. So a launcher's workers are its ranks, whether it maps one
/// itself (torchrun's Python maps the NCCL of the torch it imports) or not (`mpirun`), and
/// a rank's helpers are not (a DataLoader's workers inherit the rank's numbering and map
/// what it maps).
pub fn ranks_below<'a>(
    root: u32,
    me: u32,
    parent: &BTreeMap<u32, u32>,
    numbering: impl Fn(u32) -> Option<Numbering<'a>>,
) -> Vec<u32> {
    below(root, me, parent)
        .into_iter()
        .filter(|&pid| {
            numbering(pid).is_some_and(|own| {
                nearest_numbered_above(pid, Some(root), parent, &numbering)
                    .is_none_or(|theirs| theirs != own)
            })
        })
        .collect()
}

/// Whether `pid` is a helper of a process above it: the nearest above it that maps an MPI
/// or NCCL (`numbering` is `Some` for those alone) is numbered as it is (a DataLoader
/// worker and its rank, a rank and the Python that forked it). Not one that maps none.
pub fn is_helper<'a>(
    pid: u32,
    parent: &BTreeMap<u32, u32>,
    numbering: impl Fn(u32) -> Option<Numbering<'a>>,
) -> bool {
    numbering(pid)
        .is_some_and(|own| nearest_numbered_above(pid, None, parent, &numbering) == Some(own))
}

/// The numbering of the nearest process above `pid` in `parent` that has one, up to `stop`
/// (included) or the top.
fn nearest_numbered_above<'a>(
    pid: u32,
    stop: Option<u32>,
    parent: &BTreeMap<u32, u32>,
    numbering: &impl Fn(u32) -> Option<Numbering<'a>>,
) -> Option<Numbering<'a>> {
    let mut at = pid;
    // At most once round the tree, whatever /proc said mid-walk.
    for _ in 0..=parent.len() {
        if Some(at) == stop {
            return None;
        }
        let &up = parent.get(&at)?;
        if up == 0 {
            return None;
        }
        if let Some(theirs) = numbering(up) {
            return Some(theirs);
        }
        at = up;
    }
    None
}

/// What `record --pid` and the daemon's `--pid` say of the ranks found below `launcher`
/// ([`ranks_below`]), where it maps an MPI or NCCL itself (`maps`) or not.
pub fn ranks_below_said(launcher: u32, maps: bool, ranks: &[u32]) -> String {
    if maps {
        format!(
            "below PID {launcher}, processes numbered apart from it (its workers) map MPI or \
             NCCL too; they are profiled as well: PID {}",
            pid_list(ranks)
        )
    } else {
        format!(
            "PID {launcher} maps no MPI or NCCL library; the processes below it that do are \
             profiled: PID {}",
            pid_list(ranks)
        )
    }
}

/// `pids` as messages list them: `1, 2, 3`.
pub fn pid_list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The processes below `root` in the tree `parent` (pid to parent pid), but `me`, what is
/// below it, and its ancestors: a job script's `sudo commtap record --pid $$` is walked
/// through, never returned (it waits for commtap, which would wait for it).
fn below(root: u32, me: u32, parent: &BTreeMap<u32, u32>) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&pid, &ppid) in parent {
        children.entry(ppid).or_default().push(pid);
    }
    let mut mine = std::collections::BTreeSet::new();
    let mut at = me;
    while let Some(&p) = parent.get(&at) {
        if p <= 1 || !mine.insert(p) {
            break;
        }
        at = p;
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            // Each pid once: no cycle, whatever /proc said mid-walk.
            if c != me && c != root && seen.insert(c) {
                next.push(c);
            }
        }
    }
    seen.into_iter().filter(|p| !mine.contains(p)).collect()
}

/// Processes that map an MPI or an NCCL library (by file name: [`RANK_LIBRARIES`]), commtap
/// excepted: those a profiler started after them adopts (an NCCL job's ranks, since PyTorch
/// maps no MPI, as much as an MPI job's). Those whose list of mappings is too long to be
/// read are among them: adopted, they are shown as not read (`ps`), not passed over (a
/// rank of an MPI already probed is counted all the same). Those `skip` names (already
/// known) are not read; the others' lists are read by `read_maps` (within their owners'
/// shares: one whose share is spent is looked at again by a later scan).
pub fn rank_library_processes(
    skip: impl Fn(u32) -> bool,
    mut read_maps: impl FnMut(&process_dir::ProcessDir) -> Result<String, DiscoverError>,
) -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|&pid| pid != me && !skip(pid))
        .filter(
            |&pid| match process_dir::ProcessDir::open(pid, None).and_then(|p| read_maps(&p)) {
                Ok(maps) => maps.lines().any(|l| {
                    let name = l.rsplit('/').next().unwrap_or("");
                    l.contains(" r-xp ") && is_rank_library(name)
                }),
                Err(e) => matches!(e, DiscoverError::MapsTooLarge(_)),
            },
        )
        .collect();
    out.sort_unstable();
    out
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), empty where it cannot be read.
pub fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().chars().take(64).collect())
        .unwrap_or_default()
}

/// This host's name, as reports show it.
pub fn this_host() -> String {
    hostname::get().map_or_else(|_| "unknown".into(), |h| h.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_process_has_ended_once_a_zombie_or_reaped() {
        assert!(!has_ended(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().expect("true");
        let pid = child.id();
        // Not reaped yet: a zombie once it has run.
        while !fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| stat_field(&s, 0) == Some("Z"))
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(has_ended(pid));
        child.wait().expect("reaped");
        assert!(has_ended(pid));
    }

    #[test]
    fn stat_fields_count_from_after_the_last_parenthesis() {
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560";
        assert_eq!(stat_field(stat, 0), Some("S"));
        assert_eq!(stat_field(stat, 4), Some("0"));
        assert_eq!(stat_field(stat, 9), None);
    }

    use super::*;

    #[test]
    fn fortran_bindings_are_probed_but_make_no_rank() {
        for name in [
            "libmpi_mpifh.so.40",
            "libmpichfort.so.12",
            "libmpifort.so.12",
        ] {
            assert!(is_probed_name(name), "{name}");
            assert!(!is_rank_library(name), "{name}");
        }
        for name in ["libmpi.so.40", "libmpich.so.12", "libnccl.so.2"] {
            assert!(is_probed_name(name) && is_rank_library(name), "{name}");
        }
        assert!(is_probed_name("libucp.so.0") && !is_rank_library("libucp.so.0"));
        assert!(is_fortran_bindings_path(Path::new(
            "/usr/lib/x86_64-linux-gnu/libmpi_usempif08.so.40.30.0"
        )));
        assert!(!is_fortran_bindings_path(Path::new(
            "/usr/lib/libmpi.so.40"
        )));
        assert!(!is_probed_name("libgfortran.so.5"));
    }

    #[test]
    fn a_file_in_a_root_of_its_own_is_shown_as_its_process_names_it() {
        let lib = "/opt/mpi/libmpi.so.40";
        assert_eq!(shown_path(lib, Some(Path::new("/")), 7), lib);
        assert_eq!(
            shown_path(
                "/srv/c1/rootfs/opt/mpi/libmpi.so.40",
                Some(Path::new("/srv/c1/rootfs")),
                7
            ),
            "/opt/mpi/libmpi.so.40 (root of pid 7)"
        );
        assert_eq!(
            shown_path(lib, None, 7),
            "/opt/mpi/libmpi.so.40 (root of pid 7)"
        );
    }

    #[test]
    fn maps_paths_are_kept_verbatim() {
        let maps =
            "7f00-7f10 r-xp 00001000 08:01 42                         /home/u/a  b/libmpi.so.40\n\
                    7f20-7f30 rw-p 00000000 00:00 0 \n\
                    7f40-7f50 r--p 00000000 08:01 43                         /x/lib (deleted)\n";
        let lines: Vec<MapsLine> = maps_lines(maps).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].path, "/home/u/a  b/libmpi.so.40");
        assert_eq!(
            (lines[0].lo, lines[0].hi, lines[0].offset, lines[0].inode),
            (0x7f00, 0x7f10, 0x1000, 42)
        );
        assert_eq!(lines[0].dev, Some(libc::makedev(8, 1)));
        assert_eq!(lines[1].path, "");
        assert_eq!(lines[2].path, "/x/lib (deleted)");
    }

    #[test]
    fn long_command_lines_are_cut() {
        assert_eq!(
            cmdline_text(b"mpirun\0-np\x004\0./app\0"),
            "mpirun -np 4 ./app"
        );
        let long = "é".repeat(MAX_CMDLINE);
        let text = cmdline_text(long.as_bytes());
        assert!(text.len() <= MAX_CMDLINE + '…'.len_utf8());
        assert!(text.ends_with('…'));
    }

    #[test]
    fn environ_parsing() {
        let raw = b"A=1\0OMPI_COMM_WORLD_RANK=3\0PMI_SIZE=\0junk\0B==c\0";
        let all: Vec<(String, String)> = environ_vars(raw, |_| true).collect();
        let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
        assert_eq!(
            all,
            [
                pair("A", "1"),
                pair("OMPI_COMM_WORLD_RANK", "3"),
                pair("PMI_SIZE", ""),
                pair("B", "=c")
            ]
        );
        // Past the cap, its last whole variable ends it.
        let read = |raw: &[u8], cap| whole_variables(raw.to_vec(), cap);
        assert_eq!(read(b"A=1\0RANK=12\0", 11), b"A=1\0");
        assert_eq!(read(b"A=1\0RANK=12\0", 12), b"A=1\0RANK=12\0");
        assert_eq!(read(b"RANK=12\0", 3), b"");
        // Only who the process is, kept.
        let env = identity_vars(raw);
        assert_eq!(
            env.keys().map(String::as_str).collect::<Vec<_>>(),
            ["OMPI_COMM_WORLD_RANK", "PMI_SIZE"]
        );
    }

    /// The world size is read beside the rank it goes with: an `mpirun` of 2 inside a batch
    /// job of 8 tasks is 2 ranks; a rank variable with none beside it takes the first set.
    #[test]
    fn the_world_size_comes_from_the_ranks_launcher() {
        let info = |env: &[u8]| ProcessInfo::from_parts(1, None, 1, b"app\0", env);
        let i = info(
            b"SLURM_NTASKS=8\0SLURM_PROCID=0\0OMPI_COMM_WORLD_RANK=1\0OMPI_COMM_WORLD_SIZE=2\0",
        );
        assert_eq!((i.rank, i.world_size), (Some(1), Some(2)));
        let i = info(b"SLURM_NTASKS=8\0RANK=5\0WORLD_SIZE=16\0");
        assert_eq!((i.rank, i.world_size), (Some(5), Some(16)));
        let i = info(b"PMIX_RANK=3\0SLURM_NTASKS=4\0");
        assert_eq!((i.rank, i.world_size), (Some(3), Some(4)));
        let i = info(b"PMI_RANK=0\0PMI_SIZE=0\0");
        assert_eq!(
            (i.rank, i.world_size),
            (Some(0), None),
            "no world of 0 ranks"
        );
    }

    /// torchrun (or DeepSpeed's launcher) started by `srun`, `srun --mpi=pmix` or `mpirun`,
    /// one per node, its workers inheriting the task's variables: RANK numbers the workers.
    #[test]
    fn a_pytorch_launchers_workers_are_numbered_by_rank_not_by_the_task_above() {
        let info = |env: &[u8]| ProcessInfo::from_parts(1, None, 1, b"python\0", env);
        let slurm = b"SLURM_PROCID=1\0SLURM_NTASKS=2\0";
        let i = info(&[&slurm[..], b"TORCHELASTIC_RUN_ID=x\0RANK=5\0WORLD_SIZE=8\0"].concat());
        assert_eq!((i.rank, i.world_size), (Some(5), Some(8)));
        let i = info(b"PMIX_RANK=1\0PMI_SIZE=2\0TORCHELASTIC_RUN_ID=x\0RANK=7\0WORLD_SIZE=8\0");
        assert_eq!((i.rank, i.world_size), (Some(7), Some(8)));
        // DeepSpeed's launcher sets no TORCHELASTIC_RUN_ID: a LOCAL_RANK in a larger world.
        let i = info(&[&slurm[..], b"LOCAL_RANK=1\0RANK=5\0WORLD_SIZE=8\0"].concat());
        assert_eq!((i.rank, i.world_size), (Some(5), Some(8)));
        let ompi = b"OMPI_COMM_WORLD_RANK=1\0OMPI_COMM_WORLD_SIZE=2\0";
        let i = info(&[&ompi[..], b"LOCAL_RANK=3\0RANK=7\0WORLD_SIZE=8\0"].concat());
        assert_eq!((i.rank, i.world_size), (Some(7), Some(8)));
        // A RANK a job script set beside the task's own (srun python, RANK=$SLURM_PROCID),
        // or left over in an MPI job's environment: the launcher's variables stand.
        let i = info(
            &[
                &slurm[..],
                b"SLURM_LOCALID=0\0LOCAL_RANK=0\0RANK=1\0WORLD_SIZE=2\0",
            ]
            .concat(),
        );
        assert_eq!((i.rank, i.world_size), (Some(1), Some(2)));
        // DeepSpeed in a batch script of one node: its task count not known, or that of
        // its GPUs (--ntasks-per-node=8), the batch step's SLURM_PROCID=0 inherited.
        let i = info(b"SLURM_PROCID=0\0SLURM_LOCALID=0\0LOCAL_RANK=3\0RANK=3\0WORLD_SIZE=8\0");
        assert_eq!((i.rank, i.world_size), (Some(3), Some(8)));
        let i = info(b"SLURM_PROCID=0\0SLURM_NTASKS=8\0SLURM_LOCALID=0\0LOCAL_RANK=5\0RANK=5\0WORLD_SIZE=8\0");
        assert_eq!((i.rank, i.world_size), (Some(5), Some(8)));
        // MPI ranks started from a torchrun worker inherit its RANK in a world of 1.
        let i = info(b"OMPI_COMM_WORLD_RANK=3\0OMPI_COMM_WORLD_SIZE=4\0TORCHELASTIC_RUN_ID=x\0LOCAL_RANK=0\0RANK=0\0WORLD_SIZE=1\0");
        assert_eq!((i.rank, i.world_size), (Some(3), Some(4)));
        let i = info(&[&ompi[..], b"RANK=0\0WORLD_SIZE=8\0"].concat());
        assert_eq!((i.rank, i.world_size), (Some(1), Some(2)));
        // horovodrun (Gloo) run from a batch script, whose SLURM_PROCID=0 every worker
        // inherits.
        let i = info(&[&slurm[..], b"HOROVOD_RANK=3\0HOROVOD_SIZE=4\0"].concat());
        assert_eq!((i.rank, i.world_size), (Some(3), Some(4)));
    }

    #[test]
    fn below_a_launcher_are_its_processes_but_commtap_and_its_ancestors() {
        // 10 launches 11 (a shell) and 12; 11 runs 13 (sudo), which runs commtap (14), which
        // runs 15; 12 runs 16; a cycle 20 <-> 21 below nothing.
        let parent: BTreeMap<u32, u32> = [
            (10, 1),
            (11, 10),
            (12, 10),
            (13, 11),
            (14, 13),
            (15, 14),
            (16, 12),
            (17, 11),
            (20, 21),
            (21, 20),
        ]
        .into_iter()
        .collect();
        assert_eq!(below(10, 14, &parent), vec![12, 16, 17]);
        assert_eq!(below(12, 14, &parent), vec![16]);
        assert_eq!(below(20, 14, &parent), vec![21]);
    }

    #[test]
    fn the_ranks_below_a_launcher_are_its_workers_not_their_helpers() {
        // torchrun (10, maps NCCL, numbered by Slurm) starts worker 11 (RANK 0) and a shell
        // (12, maps nothing, RANK 1) that runs worker 16 (RANK 1: a worker's program through
        // a wrapper); 11 forks DataLoader workers 13 and 14 (its numbering), and 16 forks
        // 15; 17 below 10 maps nothing. mpirun (20, maps nothing) starts 21 and 22
        // (Open MPI ranks); 21 spawns 23 (a job of its own) and forks 24.
        let parent: BTreeMap<u32, u32> = [
            (11, 10),
            (12, 10),
            (13, 11),
            (14, 11),
            (15, 16),
            (16, 12),
            (17, 10),
            (21, 20),
            (22, 20),
            (23, 21),
            (24, 21),
        ]
        .into_iter()
        .collect();
        let slurm = Some("SLURM_PROCID");
        let (torch, ompi) = (Some("RANK"), Some("OMPI_COMM_WORLD_RANK"));
        let numbering = |pid: u32| -> Option<Numbering<'static>> {
            Some(match pid {
                10 => (Some(0), Some(2), None, slurm),
                11 | 13 | 14 => (Some(0), Some(4), Some("r"), torch),
                15 | 16 => (Some(1), Some(4), Some("r"), torch),
                21 | 24 => (Some(0), Some(2), Some("j1"), ompi),
                22 => (Some(1), Some(2), Some("j1"), ompi),
                23 => (Some(0), Some(1), Some("j2"), ompi),
                _ => return None,
            })
        };
        assert_eq!(ranks_below(10, 99, &parent, numbering), vec![11, 16]);
        assert_eq!(ranks_below(20, 99, &parent, numbering), vec![21, 22, 23]);
        // A rank asked for itself: its helpers are not ranks.
        assert!(ranks_below(11, 99, &parent, numbering).is_empty());
        // Helpers, whatever is asked for: numbered as the nearest above that maps a library.
        let helpers: Vec<u32> = (10..=24)
            .filter(|&p| is_helper(p, &parent, numbering))
            .collect();
        assert_eq!(helpers, vec![13, 14, 15, 24]);
    }

    #[test]
    fn the_communication_settings_are_kept_bounded_and_printable() {
        let long = "x".repeat(300);
        let many: Vec<(String, String)> = (0..200)
            .map(|i| (format!("UCX_V{i:03}"), i.to_string()))
            .collect();
        let env: Vec<(&str, &str)> = [
            ("NCCL_ALGO", "Ring"),
            ("PATH", "/usr/bin"),
            ("FI_PROVIDER", "tcp\u{1b}[31m"),
            ("NCCL_LONG", long.as_str()),
            ("OMPI_MCA_btl", "self,vader"),
            ("SECRET_NCCL_TOKEN", "no"),
            (
                "OMPI_MCA_orte_precondition_transports",
                "0755132214708d07-647e984c76f6ed40",
            ),
            ("HOROVOD_RANK", "3"),
        ]
        .into_iter()
        .chain(many.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .collect();
        let kept = settings_of(env);
        assert_eq!(kept.len(), MAX_SETTINGS);
        assert_eq!(kept["NCCL_ALGO"], "Ring");
        assert_eq!(kept["FI_PROVIDER"], "tcp\\u{1b}[31m");
        assert_eq!(kept["NCCL_LONG"], format!("{}...", "x".repeat(256)));
        assert_eq!(kept["OMPI_MCA_btl"], "self,vader");
        for gone in [
            "PATH",
            "SECRET_NCCL_TOKEN",
            "OMPI_MCA_orte_precondition_transports",
            "HOROVOD_RANK",
        ] {
            assert!(!kept.contains_key(gone), "{gone}");
        }
        // The first by name: UCX_V000 .. UCX_V123 beside the four above.
        assert!(kept.contains_key("UCX_V123") && !kept.contains_key("UCX_V124"));
    }

    #[test]
    fn a_running_processs_usage_is_read_from_proc() {
        // Fields 14 and 15 (utime, stime) of a stat line whose command name holds a ") ".
        let stat = "4242 (a) b) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 75 0 0 20 0 3 0 \
                    98765 1000 200";
        let status = "Name:\ta\nVmPeak:\t  9000 kB\nVmHWM:\t  2048 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(
            parse_live_usage(stat, status, 100),
            Some(LiveUsage {
                user_ns: 2_500_000_000,
                system_ns: 750_000_000,
                max_rss_bytes: 2048 * 1024,
                live_context_switches: None,
            })
        );
        assert_eq!(stat_start_ticks(stat), Some(98765));
        assert_eq!(
            context_switches_of(
                "Name:\ta\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n"
            ),
            127
        );
        // A zombie has no memory to tell of.
        assert_eq!(parse_live_usage(stat, "Name:\ta\nState:\tZ\n", 100), None);
        // This test's own process: running, some CPU time, some memory.
        let me = std::process::id();
        let mine = live_usage(me, start_ticks(me).expect("my start")).expect("my usage");
        assert!(mine.max_rss_bytes > 1 << 20, "{mine:?}");
        // Every live thread of this test process is summed: at least this thread's own,
        // read before (counts only grow).
        let own = context_switches_of(
            &fs::read_to_string("/proc/thread-self/status").expect("this thread's status"),
        );
        let mine = live_usage(me, start_ticks(me).expect("my start")).expect("my usage");
        assert!(
            mine.live_context_switches.is_some_and(|n| n >= own),
            "{mine:?} (this thread: {own})"
        );
        assert_eq!(live_usage(me, 1), None, "another process's start");
    }

    #[test]
    fn a_thread_is_told_from_a_process() {
        assert_eq!(
            tgid_in_status("Name:\tx\nUmask:\t0022\nTgid:\t4242\nPid:\t4250\n"),
            Some(4242)
        );
        assert_eq!(tgid_in_status("Name:\tx\n"), None);
        let me = std::process::id();
        assert_eq!(thread_group_of(me), Some(me));
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid(2) has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).expect("send");
            // Alive until it has been looked at.
            let _ = wait.recv();
        });
        let tid = rx.recv().expect("tid");
        let group = thread_group_of(tid);
        done.send(()).expect("done");
        t.join().expect("thread");
        assert_eq!(group, Some(me), "thread {tid}");
    }

    #[test]
    fn own_process_is_readable() {
        let me = process_info(std::process::id()).unwrap();
        assert!(me.start_ticks > 0);
        assert!(!mapped_objects(std::process::id()).unwrap().is_empty());
    }

    #[test]
    fn maps_lines_are_parsed() {
        let maps = "7f0d2a013000-7f0d2a130000 r-xp 0001b000 fe:00 15695938   /usr/lib/x86_64-linux-gnu/libfabric.so.1.20.0\n\
                    55c43ab7d000-55c43ab9e000 rw-p 00000000 00:00 0          [heap]\n\
                    garbage\n";
        let lines: Vec<MapsLine> = maps_lines(maps).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!((lines[0].lo, lines[0].hi), (0x7f0d2a013000, 0x7f0d2a130000));
        assert_eq!((lines[0].perms, lines[0].offset), ("r-xp", 0x1b000));
        assert_eq!(lines[0].dev, Some(libc::makedev(0xfe, 0)));
        assert_eq!(lines[0].inode, 15695938);
        assert_eq!(
            lines[0].path,
            "/usr/lib/x86_64-linux-gnu/libfabric.so.1.20.0"
        );
        assert_eq!((lines[1].inode, lines[1].path.as_str()), (0, "[heap]"));
    }

    #[test]
    fn missing_pid_is_a_clear_error() {
        let err = process_info(u32::MAX - 1).unwrap_err();
        assert!(matches!(err, DiscoverError::NoSuchProcess(_)), "{err}");
    }
}
