//! What the node daemon keeps and serves: its session, the profiles of processes that
//! exited, who may see what, and the node's snapshots (paged), for the `commtap.v1.Node`
//! service (`service`), the metrics endpoint and the pushes to an aggregator.

mod service;

pub use service::NodeService;

use std::{
    collections::{BTreeMap, HashMap},
    sync::atomic::Ordering,
    time::Instant,
};

use tokio::sync::Mutex;
use tonic::Request;

use crate::{
    api::{
        pb,
        snapshot::{to_wire, ProcessKey, Snapshot},
    },
    clock::monotonic_ns,
    profile::{JobProfile, JobTotals, RankProfile},
    push::SnapshotSource,
    session::Session,
};

/// A process that exited: its last profile, kept until it expires.
pub struct Finished {
    /// When it exited.
    pub at: Instant,
    /// Its final profile.
    pub rank: RankProfile,
    /// The user its profile is kept as, for [`MAX_FINISHED_PER_UID`]: its uid's account
    /// (a sub-uid's: the user given it).
    pub account: Option<u32>,
}

/// What the daemon's loop and the API share.
pub struct NodeState {
    /// Node name reported to clients.
    pub node: String,
    /// This boot's id (`/proc/sys/kernel/random/boot_id`): with node, pid and start time,
    /// a process's identity at an aggregator across reboots.
    pub boot_id: String,
    /// Where this daemon serves its API over TCP, as pushes tell the aggregator (empty: its
    /// Unix socket only).
    pub node_api: String,
    /// The live profiling session.
    pub session: Mutex<Session>,
    /// Its ingest loop's counters and call feed (outside the session's lock).
    pub ingest: std::sync::Arc<crate::ingest::IngestCounters>,
    /// Profiles of processes that exited.
    pub finished: Mutex<Vec<Finished>>,
    /// Processes detached on request (the kernel ignores them until they exit).
    pub detached: Mutex<std::collections::BTreeMap<u32, DetachedProcess>>,
    /// Open StreamEvents streams (per-call events are on while there is one).
    pub event_streams: std::sync::atomic::AtomicUsize,
    /// Cancelled when the daemon stops: its event streams end then, cleanly, where a
    /// stream left to the server's stop would hold the daemon up.
    pub stopping: tokio_util::sync::CancellationToken,
    /// Snapshot watches open, by caller (each builds a profile every interval).
    pub watches: crate::api::limit::StreamLimit<(Caller, Option<std::net::IpAddr>)>,
    /// Whether the daemon was started with --call-events (then they stay on).
    pub call_events: bool,
    /// Final profiles let go before their time by [`NodeState::keep_finished`]'s caps.
    pub finished_dropped: std::sync::atomic::AtomicU64,
    /// Added to every time the API gives out (0 but in tests of clock alignment).
    pub clock_offset_ns: i64,
    /// Who is late, per job (None: the daemon was started with --no-skew).
    pub late: Option<Mutex<crate::skew::Board>>,
    /// The call feed with each call's communicator name and collective number where
    /// who-is-late knows them: what StreamEvents streams.
    pub placed_calls: std::sync::Arc<crate::skew::board::PlacedFeed>,
}

impl NodeState {
    /// A time of this node's monotonic clock as the API gives it out.
    pub fn api_time(&self, ns: u64) -> u64 {
        ns.saturating_add_signed(self.clock_offset_ns)
    }

    /// Who-is-late's board, where there is one (locked after the session, never before).
    pub async fn board(&self) -> Option<tokio::sync::MutexGuard<'_, crate::skew::Board>> {
        match &self.late {
            Some(late) => Some(late.lock().await),
            None => None,
        }
    }
}

/// A process detached on request.
#[derive(Clone, Copy, Debug)]
pub struct DetachedProcess {
    /// When it started (`/proc`'s clock ticks): its pid given to another is not it.
    pub start_ticks: u64,
    /// The drain of the ring buffer whose end tells the call feed of its detach
    /// ([`crate::ingest::IngestCounters::told`]): an attach again waits for it.
    pub told_at_drain: u64,
}

impl NodeState {
    /// Waits until the call feed was told of the detach of `pid` (started at
    /// `start_ticks`), if it was detached: at once, but for one just detached (a drain of
    /// the ring buffer); a second at most, then warns.
    pub async fn detach_told(&self, pid: u32, start_ticks: u64) {
        let detached = self.detached.lock().await.get(&pid).copied();
        let Some(d) = detached.filter(|d| d.start_ticks == start_ticks) else {
            return;
        };
        if !self
            .ingest
            .told(d.told_at_drain, std::time::Duration::from_secs(1))
            .await
        {
            tracing::warn!(pid, "its detach was not told the call feed within a second");
        }
    }
}

/// Most final profiles of exited processes kept at once, and per user: a user starting
/// processes without end can neither fill the daemon's memory nor push out other users'
/// profiles.
pub const MAX_FINISHED: usize = 65_536;
/// See [`MAX_FINISHED`].
pub const MAX_FINISHED_PER_UID: usize = 4096;

/// Most ranks in one page of GetSnapshot: at the 4 KiB command line cap and a few dozen
/// routines each, a page stays well under the reply limit.
pub const MAX_PAGE_RANKS: u32 = 4096;

/// One page of a snapshot's ranks.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    /// After this rank (pid, start ticks); None: from the first.
    pub after: Option<(u32, u64)>,
    /// At most this many ranks.
    pub size: usize,
}

/// Who is asking: root sees everything, another user only its own processes, a caller
/// nobody vouches for nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    /// Root on the Unix socket, or a TCP caller whose client certificate the listener's
    /// `--tls-client-ca` verified.
    Any,
    /// A non-root user on the Unix socket.
    Uid(u32),
    /// A TCP caller without a verified client certificate (plaintext under
    /// `--insecure-tcp`, or TLS without one): treated as a user who owns no process.
    Nobody,
}

impl Caller {
    /// The caller of `req`: the Unix socket's peer credentials, else the client
    /// certificate TLS verified, else nobody.
    pub fn of<T>(req: &Request<T>) -> Caller {
        let uid = req
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|cred| cred.uid());
        match uid {
            Some(0) => Caller::Any,
            Some(uid) => Caller::Uid(uid),
            // Certificates are only there when the listener required and verified them.
            None if req.peer_certs().is_some_and(|c| !c.is_empty()) => Caller::Any,
            None => Caller::Nobody,
        }
    }

    /// Whether this caller may see a process of user `uid`.
    pub fn may_see(self, uid: Option<u32>) -> bool {
        match self {
            Caller::Any => true,
            Caller::Uid(me) => uid == Some(me),
            Caller::Nobody => false,
        }
    }

    /// Whether this caller may see the probed library shown as `path` (a user: only those
    /// its own processes map, the paths of others' being theirs).
    pub fn may_see_library(self, session: &Session, path: &str) -> bool {
        match self {
            Caller::Any => true,
            Caller::Uid(me) => session.library_used_by(path, me),
            Caller::Nobody => false,
        }
    }
}

impl NodeState {
    /// Keeps `rank`'s final profile, letting the oldest of its user's (`account`, its
    /// uid's: [`crate::attach::Probes::account_of`]) go past [`MAX_FINISHED_PER_UID`], and
    /// the oldest of all past [`MAX_FINISHED`] (counted).
    pub async fn keep_finished(&self, rank: RankProfile, account: Option<u32>) {
        let mut finished = self.finished.lock().await;
        if finished.iter().filter(|f| f.account == account).count() >= MAX_FINISHED_PER_UID {
            if let Some(i) = finished.iter().position(|f| f.account == account) {
                finished.remove(i);
                self.finished_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        if finished.len() >= MAX_FINISHED {
            finished.remove(0);
            self.finished_dropped.fetch_add(1, Ordering::Relaxed);
        }
        finished.push(Finished {
            at: Instant::now(),
            rank,
            account,
        });
    }

    /// Takes the profile until its detach of the detached process `pid` started at
    /// `start_ticks` out of the final ones (None where it was not detached, made no call
    /// while watched, or its profile was let go).
    pub async fn take_detached(&self, pid: u32, start_ticks: u64) -> Option<Finished> {
        if !self.detached.lock().await.contains_key(&pid) {
            return None;
        }
        let mut finished = self.finished.lock().await;
        let i = finished
            .iter()
            .position(|f| f.rank.pid == pid && f.rank.start_ticks == start_ticks)?;
        Some(finished.remove(i))
    }

    /// Puts `f`, taken by [`NodeState::take_detached`] for an attach that failed, back where
    /// it was: its time and place among the others as they were.
    pub async fn put_back(&self, f: Finished) {
        let mut finished = self.finished.lock().await;
        let i = finished.partition_point(|o| o.at <= f.at);
        finished.insert(i, f);
    }

    /// The node's cumulative profile now: live processes and those that exited, filtered,
    /// and limited to what `caller` may see.
    pub async fn snapshot(&self, filter: &pb::ProcessFilter, caller: Caller) -> JobProfile {
        self.snapshot_page(filter, caller, None).await.0
    }

    /// The live processes' profile as `caller` may see it (libraries of its own processes
    /// only; no other user's unsupported files).
    async fn live_profile(&self, caller: Caller) -> JobProfile {
        let mut session = self.session.lock().await;
        let board = self.board().await;
        let mut profile = session.profile(monotonic_ns(), board.as_deref());
        drop(board);
        profile
            .libraries
            .retain(|l| caller.may_see_library(&session, &l.path));
        if caller != Caller::Any {
            // Each names another user's file and why it was not probed.
            profile.unsupported_libraries.clear();
        }
        profile
    }

    /// [`NodeState::snapshot`], or one page of it: the ranks after `after` in (pid, start)
    /// order, at most `size`, with the job-wide totals of them all; and the last rank's
    /// key when more follow. Only the page's exited ranks are copied: a node keeping
    /// thousands of them answers page by page in bounded memory.
    pub async fn snapshot_page(
        &self,
        filter: &pb::ProcessFilter,
        caller: Caller,
        page: Option<Page>,
    ) -> (JobProfile, Option<(u32, u64)>) {
        let mut profile = self.live_profile(caller).await;
        let wanted = |r: &RankProfile| {
            caller.may_see(r.uid)
                && (filter.job.is_empty() || r.job == filter.job)
                && (filter.ranks.is_empty() || filter.ranks.contains(&r.rank))
        };
        profile.ranks.retain(|r| wanted(r));
        let finished = self.finished.lock().await;
        let exited: Vec<&RankProfile> = finished
            .iter()
            .map(|f| &f.rank)
            .filter(|r| wanted(r))
            .collect();
        let all = || profile.ranks.iter().chain(exited.iter().copied());
        let totals = JobTotals::of(all());
        let key = |r: &RankProfile| (r.pid, r.start_ticks);
        let (keys, next) = page_keys(all().map(key), page);
        let ranks = all()
            .filter(|r| keys.as_ref().is_none_or(|k| k.contains(&key(r))))
            .cloned()
            .collect();
        let (names, procs): (std::collections::HashMap<u32, (u32, String)>, Vec<_>) =
            if self.late.is_some() && !totals.job.is_empty() {
                (
                    all().map(|r| (r.pid, (r.rank, r.host.clone()))).collect(),
                    all().map(key).collect(),
                )
            } else {
                Default::default()
            };
        drop(finished);
        profile.ranks = ranks;
        if !filter.routines.is_empty() {
            for r in &mut profile.ranks {
                r.routines.retain(|name, _| filter.routines.contains(name));
            }
        }
        profile
            .ranks
            .sort_by(|a, b| (a.job.as_str(), a.rank).cmp(&(b.job.as_str(), b.rank)));
        profile.set_totals(totals);
        if let (Some(late), false) = (&self.late, names.is_empty()) {
            let whois = |pid: u32| names.get(&pid).cloned();
            profile.skew = late.lock().await.report_for(&procs, &whois).map(|mut s| {
                // A page carries the rows of its own ranks (the client joins them).
                if page.is_some() {
                    let here: std::collections::HashSet<u32> =
                        profile.ranks.iter().map(|r| r.rank).collect();
                    s.ranks.retain(|r| here.contains(&r.rank));
                }
                s
            });
        }
        (profile, next)
    }
}

#[tonic::async_trait]
impl SnapshotSource for NodeState {
    // A node holds only its own processes: it sends them all every time.
    async fn batch(&self, _everything: bool) -> pb::PushSnapshotsRequest {
        let profile = self
            .snapshot(&pb::ProcessFilter::default(), Caller::Any)
            .await;
        let taken_ns = monotonic_ns();
        let instances = self.parts(&profile).await;
        let (message_halves, late_senders) = self.late_sender_parts(&profile).await;
        let processes = profile
            .ranks
            .into_iter()
            .map(|rank| {
                let key = ProcessKey {
                    node: self.node.clone(),
                    pid: rank.pid,
                    start_ticks: rank.start_ticks,
                    boot_id: self.boot_id.clone(),
                };
                pb::ProcessSnapshot {
                    node_api: self.node_api.clone(),
                    ..to_wire(&Snapshot {
                        key,
                        taken_ns,
                        rank,
                    })
                }
            })
            .collect();
        pb::PushSnapshotsRequest {
            processes,
            instances,
            message_halves,
            late_senders,
            node: self.node.clone(),
            node_api: self.node_api.clone(),
            ..Default::default()
        }
    }

    fn clock_ns(&self) -> u64 {
        self.api_time(monotonic_ns())
    }
}

/// Most message halves handed on in one push (the rest wait for the next).
const MAX_HALVES_PER_PUSH: usize = 1 << 16;

/// `profile`'s ranks by process id (a push names thousands of parts by pid): where an
/// exited rank's kept profile and a running process given its pid since share one, the
/// running one's (what who-is-late hands on now is of the processes placed under the pids
/// now).
fn ranks_by_pid(profile: &crate::profile::JobProfile) -> HashMap<u32, &RankProfile> {
    let mut by_pid: HashMap<u32, &RankProfile> = HashMap::new();
    for r in &profile.ranks {
        by_pid
            .entry(r.pid)
            .and_modify(|kept| {
                if kept.exited && !r.exited {
                    *kept = r;
                }
            })
            .or_insert(r);
    }
    by_pid
}

impl NodeState {
    /// Late Sender for the aggregator: the message halves whose other end this node did
    /// not see (with ranks and job as `profile` names them, on the API's clock), and each
    /// job's report of the messages paired here.
    async fn late_sender_parts(
        &self,
        profile: &crate::profile::JobProfile,
    ) -> (Vec<pb::MessageHalf>, Vec<pb::NodeLateSender>) {
        use crate::skew::late_sender::Half;
        let Some(late) = &self.late else {
            return Default::default();
        };
        let mut board = late.lock().await;
        let by_pid = ranks_by_pid(profile);
        let rank_of = |pid: u32| by_pid.get(&pid).copied();
        let halves = board
            .take_unmatched_halves(MAX_HALVES_PER_PUSH)
            .into_iter()
            .filter_map(|(id, half)| {
                let r = rank_of(half.pid())?;
                let mut h = pb::MessageHalf {
                    job: r.job.clone(),
                    id,
                    rank: r.rank,
                    host: self.node.clone(),
                    ..Default::default()
                };
                // 0 says "not known" on every clock.
                let posted = |ns: u64| if ns == 0 { 0 } else { self.api_time(ns) };
                match half {
                    Half::Send(s) => {
                        h.set_kind(pb::HalfKind::Send);
                        (h.start_ns, h.end_ns) =
                            (self.api_time(s.start_ns), self.api_time(s.end_ns));
                        h.blocking = s.blocking;
                    }
                    Half::Receive(r) => {
                        h.set_kind(pb::HalfKind::Receive);
                        (h.start_ns, h.end_ns) =
                            (self.api_time(r.start_ns), self.api_time(r.end_ns));
                        h.posted_ns = posted(r.posted_ns);
                        (h.thread, h.together, h.first) = (r.thread, r.together, r.first);
                    }
                    Half::Posted { posted_ns, .. } => {
                        h.set_kind(pb::HalfKind::Posted);
                        h.posted_ns = posted(posted_ns);
                    }
                }
                Some(h)
            })
            .collect();
        let mut jobs: BTreeMap<&str, Vec<(u32, u64)>> = BTreeMap::new();
        for r in &profile.ranks {
            jobs.entry(r.job.as_str())
                .or_default()
                .push((r.pid, r.start_ticks));
        }
        let whois = |pid: u32| rank_of(pid).map(|r| (r.rank, r.host.clone()));
        let reports = jobs
            .into_iter()
            .filter_map(|(job, pids)| {
                let report = board.late_sender_for(&pids, &whois)?;
                Some(pb::NodeLateSender {
                    job: job.to_string(),
                    report: Some((&report).into()),
                })
            })
            .collect();
        (halves, reports)
    }

    /// The collective instances who-is-late handed on (their other members are on other
    /// nodes), with ranks, hosts and job as `profile` names them, on the API's clock.
    async fn parts(&self, profile: &crate::profile::JobProfile) -> Vec<pb::InstancePart> {
        let Some(late) = &self.late else {
            return Vec::new();
        };
        let parts = late.lock().await.take_parts();
        let by_pid = ranks_by_pid(profile);
        let rank_of = |pid: u32| by_pid.get(&pid).copied();
        parts
            .into_iter()
            .filter_map(|inst| {
                let job = rank_of(inst.arrivals.first()?.pid)?.job.clone();
                let arrivals = inst
                    .arrivals
                    .iter()
                    .filter_map(|a| {
                        let r = rank_of(a.pid)?;
                        Some(pb::InstanceArrival {
                            rank: r.rank,
                            host: self.node.clone(),
                            start_ns: self.api_time(a.start_ns),
                            end_ns: self.api_time(a.end_ns),
                            root: a.root,
                        })
                    })
                    .collect();
                Some(pb::InstancePart {
                    job,
                    comm: inst.comm.0,
                    seq: inst.seq,
                    numbering_local: !inst.numbered_from_start,
                    weight: inst.weight,
                    routine: collector_common::ROUTINES
                        .get(inst.routine as usize)
                        .map_or("?", |r| r.name)
                        .to_string(),
                    bucket: (inst.bucket != collector_common::UNKNOWN_BUCKET)
                        .then_some(u32::from(inst.bucket)),
                    size: inst.size,
                    arrivals,
                })
            })
            .collect()
    }
}

/// A rank's key in a page: (pid, start ticks).
type RankKey = (u32, u64);

/// The keys (pid, start ticks) of `page` among `keys`, and the last one's when more
/// follow; `None` for every rank (no page asked for).
fn page_keys(
    keys: impl Iterator<Item = RankKey>,
    page: Option<Page>,
) -> (Option<std::collections::BTreeSet<RankKey>>, Option<RankKey>) {
    let Some(Page { after, size }) = page else {
        return (None, None);
    };
    let mut keys: Vec<RankKey> = keys.filter(|k| after.is_none_or(|a| *k > a)).collect();
    keys.sort_unstable();
    let mut next = None;
    if keys.len() > size {
        keys.truncate(size);
        next = keys.last().copied();
    }
    (Some(keys.into_iter().collect()), next)
}
