//! What the aggregator has merged: the latest cumulative snapshot of every process it has
//! heard of, persisted in an embedded database (redb: pure Rust, ACID, one file, no server)
//! so that a restart loses nothing.
//!
//! The merge is idempotent and order-free: a snapshot is keyed by (node, pid, process start
//! time) and replaces the stored one only if it was taken later on that node. Snapshots are
//! cumulative, so a repeated, late or re-sent snapshot can never double count, and a tree
//! of aggregators merges the same way at every level.
//!
//! Snapshots stay in their wire form, checked but not converted, on disk; memory holds an
//! index (key, clock, job, calls), and a report reads and decodes what it needs. Batches
//! pushed at the same time are merged in one durable commit.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::{
    api::{
        convert::InvalidMessage,
        pb,
        snapshot::{check, ProcessKey},
        status::ToStatus,
    },
    profile::{JobProfile, RankProfile},
};

const PROCESSES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("processes");
/// redb page cache.
const CACHE_BYTES: usize = 64 << 20;

/// Errors of the store (cloneable: one failed commit answers every sender in its group).
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("aggregator database")]
    Db(#[source] std::sync::Arc<redb::Error>),
    /// The task that merges pushes has stopped (the aggregator is shutting down).
    #[error("the aggregator's merging task has stopped")]
    Stopped,
    /// A stored record could not be decoded.
    #[error("aggregator database holds an unreadable record")]
    Corrupt(#[source] std::sync::Arc<dyn std::error::Error + Send + Sync>),
    /// A pushed snapshot makes no sense.
    #[error("pushed snapshot refused")]
    Invalid(#[source] std::sync::Arc<InvalidMessage>),
}

/// Opens (or creates) the database file with its table.
fn open_db(path: &Path) -> Result<Database, StoreError> {
    // redb caches up to 1 GiB by default; reports read little and rarely.
    let db = Database::builder()
        .set_cache_size(CACHE_BYTES)
        .create(path)
        .map_err(db_err)?;
    let txn = db.begin_write().map_err(db_err)?;
    txn.open_table(PROCESSES).map_err(db_err)?;
    txn.commit().map_err(db_err)?;
    Ok(db)
}

fn db_err(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Db(std::sync::Arc::new(e.into()))
}

impl ToStatus for StoreError {
    fn to_status(&self) -> tonic::Status {
        match self {
            // The sender's fault: retrying the same snapshots will not help.
            StoreError::Invalid(e) => tonic::Status::invalid_argument(format!("{self}: {e}")),
            StoreError::Stopped => tonic::Status::unavailable(self.to_string()),
            // The aggregator's disk: retry later (cumulative snapshots lose nothing).
            StoreError::Db(e) => tonic::Status::unavailable(format!("{self}: {e}")),
            StoreError::Corrupt(e) => tonic::Status::data_loss(format!("{self}: {e}")),
        }
    }
}

/// What merging one batch came to: (accepted, stale), or why the batch was refused.
pub type Outcome = Result<(u64, u64), StoreError>;

/// A batch checked and encoded for the store, away from the store's lock (senders prepare
/// their batches in parallel; the store only inserts and commits).
pub struct Prepared(Vec<(ProcessKey, Entry, Vec<u8>)>);

/// Checks a batch (refused whole if any snapshot makes no sense) and encodes it.
pub fn prepare(batch: Vec<pb::ProcessSnapshot>) -> Result<Prepared, StoreError> {
    batch
        .into_iter()
        .map(|wire| {
            let key = check(&wire).map_err(|e| StoreError::Invalid(e.into()))?;
            Ok((key, entry(&wire, 0), wire.encode_to_vec()))
        })
        .collect::<Result<_, _>>()
        .map(Prepared)
}

/// What the store keeps in memory per process: an index (the snapshot itself is on disk).
pub struct Entry {
    taken_ns: u64,
    job: String,
    calls: u64,
    /// The process had exited when this snapshot was taken (its profile is final).
    exited: bool,
    /// When the aggregator last took a snapshot of it (at start: when it was loaded).
    updated: std::time::Instant,
    /// The store's generation when that snapshot was committed.
    generation: u64,
}

/// Whether a snapshot taken at `new` replaces one taken at `old` (the merge rule: the later
/// snapshot of a process wins).
pub fn supersedes(old: Option<u64>, new: u64) -> bool {
    old.is_none_or(|o| new > o)
}

/// The merged state, persisted.
pub struct Store {
    /// None after a failed write until the next one opens it again.
    db: Option<Database>,
    path: std::path::PathBuf,
    processes: BTreeMap<ProcessKey, Entry>,
    /// The processes of each job: a job's report and the job list read these, never the
    /// whole store.
    by_job: BTreeMap<String, BTreeSet<ProcessKey>>,
    /// 1 for what was on disk at start, then one more per commit that accepted anything:
    /// each entry carries the generation it came in, so a relay pushes upstream only what
    /// changed since its last push.
    generation: u64,
}

impl Store {
    /// Opens (or creates) the database at `path` and loads what it holds.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = open_db(path)?;
        let mut processes = BTreeMap::new();
        let mut by_job: BTreeMap<String, BTreeSet<ProcessKey>> = BTreeMap::new();
        let read = db.begin_read().map_err(db_err)?;
        let table = read.open_table(PROCESSES).map_err(db_err)?;
        for item in table.iter().map_err(db_err)? {
            let (_, value) = item.map_err(db_err)?;
            let encoded = value.value().to_vec();
            let wire = pb::ProcessSnapshot::decode(encoded.as_slice())
                .map_err(|e| StoreError::Corrupt(std::sync::Arc::new(e)))?;
            let key = check(&wire).map_err(|e| StoreError::Corrupt(std::sync::Arc::new(e)))?;
            let e = entry(&wire, 1);
            by_job.entry(e.job.clone()).or_default().insert(key.clone());
            processes.insert(key, e);
        }
        drop(table);
        drop(read);
        Ok(Store {
            db: Some(db),
            path: path.to_path_buf(),
            processes,
            by_job,
            generation: 1,
        })
    }

    /// The database, to write: opened again if the last write failed (redb refuses every
    /// write after an I/O error, a full disk say, until the file is opened again).
    fn writable(&mut self) -> Result<&Database, StoreError> {
        if self.db.is_none() {
            self.db = Some(open_db(&self.path)?);
            tracing::info!("aggregator database {} opened again", self.path.display());
        }
        Ok(self.db.as_ref().expect("just opened"))
    }

    /// After a failed write: the database is closed and opened again (now, for readers,
    /// or at the next write if that fails too); memory still matches the disk, since it
    /// changes only after a commit.
    fn failed(&mut self, e: StoreError) -> StoreError {
        self.db = None;
        if let Err(again) = self.writable() {
            tracing::warn!("opening {} again: {again}", self.path.display());
        }
        e
    }

    /// Checks and merges a batch; returns (accepted, stale). Accepted snapshots are durable
    /// on return. A batch with an invalid snapshot is refused whole. (The server merges
    /// through [`super::commit::GroupCommit`], which prepares batches in parallel.)
    #[cfg(test)]
    pub fn merge(&mut self, batch: Vec<pb::ProcessSnapshot>) -> Result<(u64, u64), StoreError> {
        let prepared = prepare(batch)?;
        self.merge_many(vec![prepared])?.pop().unwrap_or(Ok((0, 0)))
    }

    /// Merges several prepared batches (from several senders) in one durable commit: the
    /// outcome of each, as [`Store::merge`] would give it. One commit per group rather than
    /// per push is what lets many daemons push at once (a commit waits for the disk).
    pub fn merge_many(&mut self, batches: Vec<Prepared>) -> Result<Vec<Outcome>, StoreError> {
        self.try_merge_many(batches).map_err(|e| self.failed(e))
    }

    fn try_merge_many(&mut self, batches: Vec<Prepared>) -> Result<Vec<Outcome>, StoreError> {
        let txn = self.writable()?.begin_write().map_err(db_err)?;
        let mut outcomes = Vec::with_capacity(batches.len());
        // What this commit accepts: held here, and shown to readers only once it is durable
        // (a commit that fails, on a full disk say, leaves memory as the disk is, and its
        // senders push again).
        let mut accepted_now: BTreeMap<ProcessKey, Entry> = BTreeMap::new();
        {
            let mut table = txn.open_table(PROCESSES).map_err(db_err)?;
            for batch in batches {
                let (mut accepted, mut stale) = (0, 0);
                for (key, entry, encoded) in batch.0 {
                    let known = accepted_now
                        .get(&key)
                        .or_else(|| self.processes.get(&key))
                        .map(|e| e.taken_ns);
                    if !supersedes(known, entry.taken_ns) {
                        stale += 1;
                        continue;
                    }
                    table
                        .insert(key.bytes().as_slice(), encoded.as_slice())
                        .map_err(db_err)?;
                    accepted_now.insert(key, entry);
                    accepted += 1;
                }
                outcomes.push(Ok((accepted, stale)));
            }
        }
        txn.commit().map_err(db_err)?;
        if !accepted_now.is_empty() {
            self.generation += 1;
        }
        for (key, mut entry) in accepted_now {
            entry.generation = self.generation;
            self.index(&key, &entry.job);
            self.processes.insert(key, entry);
        }
        Ok(outcomes)
    }

    /// Files `key` under `job`, out of the job it was in before (a rank whose job became
    /// known later).
    fn index(&mut self, key: &ProcessKey, job: &str) {
        if let Some(old) = self.processes.get(key).map(|e| e.job.clone()) {
            if old != job {
                if let Some(keys) = self.by_job.get_mut(&old) {
                    keys.remove(key);
                    if keys.is_empty() {
                        self.by_job.remove(&old);
                    }
                }
            }
        }
        self.by_job
            .entry(job.to_string())
            .or_default()
            .insert(key.clone());
    }

    /// Forgets the jobs whose every process had exited and whose last snapshot came more
    /// than `retain` before `now` (`--retain`); returns how many jobs went.
    pub fn expire(
        &mut self,
        retain: std::time::Duration,
        now: std::time::Instant,
    ) -> Result<usize, StoreError> {
        let old: Vec<String> = self
            .by_job
            .iter()
            .filter(|(_, keys)| {
                keys.iter().all(|k| {
                    self.processes.get(k).is_some_and(|e| {
                        e.exited && now.saturating_duration_since(e.updated) > retain
                    })
                })
            })
            .map(|(job, _)| job.clone())
            .collect();
        if old.is_empty() {
            return Ok(0);
        }
        self.remove_jobs(&old).map_err(|e| self.failed(e))?;
        Ok(old.len())
    }

    /// Deletes every process of `jobs`, on disk, then in memory.
    fn remove_jobs(&mut self, old: &[String]) -> Result<(), StoreError> {
        let txn = self.writable()?.begin_write().map_err(db_err)?;
        {
            let mut table = txn.open_table(PROCESSES).map_err(db_err)?;
            for job in old {
                for key in self.by_job.get(job).into_iter().flatten() {
                    table.remove(key.bytes().as_slice()).map_err(db_err)?;
                }
            }
        }
        txn.commit().map_err(db_err)?;
        for job in old {
            for key in self.by_job.remove(job).unwrap_or_default() {
                self.processes.remove(&key);
            }
        }
        Ok(())
    }

    /// The processes whose snapshots were committed after generation `after` (0: every
    /// one), and the generation now: what a relay pushes to a higher aggregator. Each
    /// node's newest snapshot comes first: an aggregator learns a node's clock from the
    /// first part of a push that names it, and would refuse the node's later snapshots as
    /// stamped ahead of it if that part held only old ones (see `clock::NodeClocks`).
    pub fn changed_since(&self, after: u64) -> (Vec<ProcessKey>, u64) {
        let mut keys: Vec<(&ProcessKey, u64)> = self
            .processes
            .iter()
            .filter(|(_, e)| e.generation > after)
            .map(|(k, e)| (k, e.taken_ns))
            .collect();
        keys.sort_by(|a, b| a.0.node.cmp(&b.0.node).then(b.1.cmp(&a.1)));
        (
            keys.into_iter().map(|(k, _)| k.clone()).collect(),
            self.generation,
        )
    }

    /// The stored snapshots of `keys` as they were received (original node keys and
    /// clocks), so that a higher aggregator merges exactly as this one did; those no longer
    /// held are left out.
    pub fn snapshots(&self, keys: &[ProcessKey]) -> Vec<pb::ProcessSnapshot> {
        self.read_keys(keys.iter())
    }

    /// The stored snapshots of `keys` (unreadable ones are skipped: they were checked on
    /// the way in).
    fn read_keys<'a>(
        &self,
        keys: impl Iterator<Item = &'a ProcessKey>,
    ) -> Vec<pb::ProcessSnapshot> {
        let Some(Ok(read)) = self.db.as_ref().map(Database::begin_read) else {
            return Vec::new();
        };
        let Ok(table) = read.open_table(PROCESSES) else {
            return Vec::new();
        };
        keys.filter_map(|key| table.get(key.bytes().as_slice()).ok().flatten())
            .filter_map(|v| pb::ProcessSnapshot::decode(v.value()).ok())
            .collect()
    }

    /// How many jobs and processes are held.
    pub fn counts(&self) -> (usize, usize) {
        (self.by_job.len(), self.processes.len())
    }

    /// Every job with its ranks' nodes and calls.
    pub fn jobs(&self) -> Vec<pb::JobSummary> {
        self.by_job
            .iter()
            .map(|(job, keys)| {
                let nodes: BTreeSet<&str> = keys.iter().map(|k| k.node.as_str()).collect();
                pb::JobSummary {
                    job: job.clone(),
                    ranks: u32::try_from(keys.len()).unwrap_or(u32::MAX),
                    nodes: nodes.into_iter().map(str::to_string).collect(),
                    calls: keys
                        .iter()
                        .filter_map(|k| self.processes.get(k))
                        .map(|e| e.calls)
                        .sum(),
                }
            })
            .collect()
    }

    /// One job's profile, every rank of every node, by rank.
    pub fn job(&self, job: &str) -> Option<JobProfile> {
        let mut ranks: Vec<RankProfile> = self
            .read_keys(self.by_job.get(job).into_iter().flatten())
            .iter()
            .filter_map(|w| w.rank.as_ref().and_then(|r| RankProfile::try_from(r).ok()))
            .collect();
        if ranks.is_empty() {
            return None;
        }
        ranks.sort_by_key(|r| (r.rank, r.pid));
        // Whether call events were on is each node's business: not known here.
        Some(JobProfile {
            job: job.to_string(),
            ..JobProfile::of_ranks(ranks)
        })
    }
}

fn entry(wire: &pb::ProcessSnapshot, generation: u64) -> Entry {
    let rank = wire.rank.as_ref();
    Entry {
        generation,
        taken_ns: wire.taken_ns,
        job: rank.map(|r| r.job.clone()).unwrap_or_default(),
        exited: rank.is_some_and(|r| r.exited),
        updated: std::time::Instant::now(),
        calls: rank.map_or(0, |r| {
            r.routines
                .iter()
                .filter_map(|x| x.totals.as_ref())
                .map(|t| t.calls)
                .sum()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::snapshot::{to_wire, Snapshot};
    use crate::stats::Health;

    fn snap(node: &str, pid: u32, taken_ns: u64, calls: u64) -> pb::ProcessSnapshot {
        let mut routines = crate::stats::Routines::new();
        let mut r = crate::stats::RoutineStats::default();
        r.totals.calls = calls;
        routines.insert("MPI_Allreduce".into(), r);
        to_wire(&Snapshot {
            key: ProcessKey {
                node: node.into(),
                pid,
                start_ticks: 1,
                boot_id: "b1".into(),
            },
            taken_ns,
            rank: RankProfile {
                rank: pid,
                rank_known: true,
                pid,
                host: node.into(),
                job: "j".into(),
                cmdline: String::new(),
                uid: None,
                container: None,
                region: None,
                probe_call_cost: None,
                usage: None,
                settings: Default::default(),
                call_sites: Vec::new(),
                call_sites_left_out: 0,
                ended: None,
                in_call: None,
                in_call_unknown: false,
                start_ticks: 1,
                exited: false,
                detached: false,
                unwatched_ns: 0,
                world_size: None,
                elapsed_ns: 0,
                comm_time_ns: 0,
                routines,
                health: Health::default(),
                fabrics: Vec::new(),
                mpi_transport: None,
                peers: Vec::new(),
                comm_ranks: Vec::new(),
            },
        })
    }

    fn calls(store: &Store) -> u64 {
        store.jobs().iter().map(|j| j.calls).sum()
    }

    /// `snap` in job `job`, exited or not.
    fn snap_of(
        job: &str,
        node: &str,
        pid: u32,
        taken_ns: u64,
        exited: bool,
    ) -> pb::ProcessSnapshot {
        let mut w = snap(node, pid, taken_ns, 1);
        let r = w.rank.as_mut().expect("rank");
        r.job = job.into();
        r.exited = exited;
        w
    }

    #[test]
    fn finished_jobs_expire_and_the_index_follows_moves() {
        let dir = std::env::temp_dir().join(format!("commtap-expire-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agg.redb");
        let _ = std::fs::remove_file(&path);
        let mut store = Store::open(&path).unwrap();
        store
            .merge(vec![
                snap_of("done", "a", 1, 1, true),
                snap_of("done", "b", 2, 1, true),
                snap_of("running", "a", 3, 1, false),
                snap_of("", "a", 4, 1, false),
            ])
            .unwrap();
        // Pid 4's job became known: it moves out of the unlabelled group.
        store
            .merge(vec![snap_of("running", "a", 4, 2, false)])
            .unwrap();
        let jobs: Vec<(String, u32, Vec<String>)> = store
            .jobs()
            .into_iter()
            .map(|j| (j.job, j.ranks, j.nodes))
            .collect();
        assert_eq!(
            jobs,
            [
                ("done".into(), 2, vec!["a".into(), "b".into()]),
                ("running".into(), 2, vec!["a".into()])
            ]
        );
        let now = std::time::Instant::now();
        let retain = std::time::Duration::from_mins(1);
        assert_eq!(store.expire(retain, now).unwrap(), 0, "too young");
        let later = now + std::time::Duration::from_secs(61);
        assert_eq!(store.expire(retain, later).unwrap(), 1);
        assert!(store.job("done").is_none());
        assert_eq!(store.job("running").unwrap().ranks.len(), 2);
        drop(store);
        let store = Store::open(&path).unwrap();
        assert!(store.job("done").is_none(), "expired for good");
        assert_eq!(store.jobs().len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rebooted_nodes_processes_are_new_ones() {
        let dir = std::env::temp_dir().join(format!("commtap-boot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agg.redb");
        let _ = std::fs::remove_file(&path);
        let mut store = Store::open(&path).unwrap();
        let before = snap("a", 1, 500, 7);
        let mut after = snap("a", 1, 20, 3);
        after.boot_id = "b2".into();
        // Same node, pid and start time, a smaller clock: after a reboot, not stale.
        assert_eq!(store.merge(vec![before, after]).unwrap(), (2, 0));
        assert_eq!(calls(&store), 10);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn merge_is_idempotent_order_free_and_durable() {
        let dir = std::env::temp_dir().join(format!("commtap-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agg.redb");
        let _ = std::fs::remove_file(&path);
        let mut store = Store::open(&path).unwrap();
        // Out of order, repeated: the latest per process wins, nothing adds up twice.
        assert_eq!(
            store
                .merge(vec![snap("a", 1, 20, 7), snap("b", 2, 5, 3)])
                .unwrap(),
            (2, 0)
        );
        assert_eq!(
            store
                .merge(vec![snap("a", 1, 10, 4), snap("b", 2, 5, 3)])
                .unwrap(),
            (0, 2)
        );
        assert_eq!(calls(&store), 10);
        assert_eq!(store.merge(vec![snap("b", 2, 6, 5)]).unwrap(), (1, 0));
        assert_eq!(calls(&store), 12);
        drop(store);
        // A restart loses nothing.
        let store = Store::open(&path).unwrap();
        assert_eq!(calls(&store), 12);
        assert_eq!(store.job("j").unwrap().ranks.len(), 2);
        assert!(store.job("other").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_relay_is_given_only_what_changed_since_its_last_push() {
        let dir = std::env::temp_dir().join(format!("commtap-store-gen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agg.redb");
        let _ = std::fs::remove_file(&path);
        let mut store = Store::open(&path).unwrap();
        let pids = |v: &[ProcessKey]| v.iter().map(|p| p.pid).collect::<Vec<_>>();
        let (none, start) = store.changed_since(0);
        assert!(none.is_empty());
        store
            .merge(vec![snap("a", 1, 20, 7), snap("b", 2, 5, 3)])
            .unwrap();
        let (all, first) = store.changed_since(0);
        assert_eq!(pids(&all), [1, 2]);
        assert!(first > start);
        // Stale snapshots change nothing, so nothing is to be pushed again.
        store.merge(vec![snap("a", 1, 10, 4)]).unwrap();
        assert_eq!(store.changed_since(first), (Vec::new(), first));
        store.merge(vec![snap("b", 2, 6, 5)]).unwrap();
        let (changed, second) = store.changed_since(first);
        assert_eq!(pids(&changed), [2]);
        assert_eq!(store.snapshots(&changed)[0].taken_ns, 6);
        assert_eq!(store.changed_since(second).0, Vec::new());
        // A node's newest snapshot first, whatever its pid.
        store.merge(vec![snap("a", 3, 90, 1)]).unwrap();
        assert_eq!(pids(&store.changed_since(0).0), [3, 1, 2]);
        drop(store);
        // After a restart, what was on disk is all of one generation.
        let store = Store::open(&path).unwrap();
        assert_eq!(pids(&store.changed_since(0).0), [3, 1, 2]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn nonsense_is_refused_whole() {
        let dir = std::env::temp_dir().join(format!("commtap-store-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = Store::open(&dir.join("agg.redb")).unwrap();
        let mut bad = snap("a", 1, 1, 1);
        bad.pid = 2;
        assert!(matches!(
            store.merge(vec![snap("b", 3, 1, 1), bad]),
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(calls(&store), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
