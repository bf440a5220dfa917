//! A process's cumulative snapshot as pushers send it and aggregators keep it: its
//! identity across the cluster and its wire form.

use super::{
    convert::{check_rank, InvalidMessage},
    pb,
};
use crate::profile::RankProfile;

/// A process's identity across the cluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProcessKey {
    /// Node name.
    pub node: String,
    /// Pid on that node.
    pub pid: u32,
    /// Start time in clock ticks since the node's boot.
    pub start_ticks: u64,
    /// The node's boot id (empty from a sender that does not say).
    pub boot_id: String,
}

impl ProcessKey {
    /// The key a store files it under.
    pub fn bytes(&self) -> Vec<u8> {
        format!(
            "{}\0{}\0{}\0{}",
            self.node, self.pid, self.start_ticks, self.boot_id
        )
        .into_bytes()
    }
}

/// One process's snapshot, for senders (a daemon builds these).
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Its identity.
    pub key: ProcessKey,
    /// The node's monotonic clock when it was taken.
    pub taken_ns: u64,
    /// The cumulative profile.
    pub rank: RankProfile,
}

/// The wire form of a snapshot.
pub fn to_wire(s: &Snapshot) -> pb::ProcessSnapshot {
    pb::ProcessSnapshot {
        node: s.key.node.clone(),
        pid: s.key.pid,
        start_ticks: s.key.start_ticks,
        taken_ns: s.taken_ns,
        rank: Some((&s.rank).into()),
        boot_id: s.key.boot_id.clone(),
        node_api: String::new(),
    }
}

/// Checks a snapshot from the wire; its key, or why it makes no sense.
pub fn check(w: &pb::ProcessSnapshot) -> Result<ProcessKey, InvalidMessage> {
    let invalid = |why: String| InvalidMessage {
        what: "ProcessSnapshot",
        why,
    };
    if w.node.is_empty() {
        return Err(invalid("no node name".into()));
    }
    let rank = w
        .rank
        .as_ref()
        .ok_or_else(|| invalid("no profile".into()))?;
    if rank.pid != w.pid {
        return Err(invalid(format!(
            "the snapshot of pid {} carries the profile of pid {}",
            w.pid, rank.pid
        )));
    }
    check_rank(rank)?;
    if !w.node_api.is_empty() && !is_node_api(&w.node_api) {
        return Err(invalid(format!(
            "node_api {:?} is not an http(s)://host:port address",
            w.node_api.chars().take(64).collect::<String>()
        )));
    }
    Ok(ProcessKey {
        node: w.node.clone(),
        pid: w.pid,
        start_ticks: w.start_ticks,
        boot_id: w.boot_id.clone(),
    })
}

/// Most bytes of a node's advertised API address.
pub const MAX_NODE_API: usize = 256;

/// Whether `s` may be a node's advertised API address: a short http(s) URL (clients are
/// sent there, so nothing else: never a Unix socket of the client's own machine).
pub fn is_node_api(s: &str) -> bool {
    s.len() <= MAX_NODE_API
        && (s.starts_with("https://") || s.starts_with("http://"))
        && s.bytes().all(|b| b.is_ascii_graphic())
}
