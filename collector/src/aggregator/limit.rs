//! Bounds on the long-lived streams an aggregator serves (pushes, job watches): each holds
//! a task and, for a watch, decodes a whole job every interval, so neither one peer nor
//! all of them together may open without end.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use tonic::Status;

/// Most streams of one kind a single peer address may hold open.
pub const PER_PEER: usize = 16;
/// Most streams of one kind open in all.
pub const TOTAL: usize = 1024;

/// Open streams of one kind, by peer.
#[derive(Clone, Debug, Default)]
pub struct StreamLimit {
    open: Arc<Mutex<HashMap<Option<IpAddr>, usize>>>,
}

/// One open stream: dropping it frees its place.
#[derive(Debug)]
pub struct StreamSlot {
    open: Arc<Mutex<HashMap<Option<IpAddr>, usize>>>,
    peer: Option<IpAddr>,
}

impl StreamLimit {
    /// A place for one more stream of `peer`, or RESOURCE_EXHAUSTED saying which limit.
    pub fn acquire(&self, peer: Option<IpAddr>, what: &str) -> Result<StreamSlot, Status> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let total: usize = open.values().sum();
        let mine = open.get(&peer).copied().unwrap_or(0);
        if mine >= PER_PEER {
            return Err(Status::resource_exhausted(format!(
                "{PER_PEER} {what} streams are open from this address already"
            )));
        }
        if total >= TOTAL {
            return Err(Status::resource_exhausted(format!(
                "{TOTAL} {what} streams are open already"
            )));
        }
        *open.entry(peer).or_default() += 1;
        Ok(StreamSlot {
            open: self.open.clone(),
            peer,
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_peer_cannot_take_every_place() {
        let limit = StreamLimit::default();
        let a: Option<IpAddr> = Some([10, 0, 0, 1].into());
        let held: Vec<StreamSlot> = (0..PER_PEER)
            .map(|_| limit.acquire(a, "watch").expect("a place"))
            .collect();
        assert!(limit.acquire(a, "watch").is_err());
        assert!(limit.acquire(Some([10, 0, 0, 2].into()), "watch").is_ok());
        drop(held);
        assert!(limit.acquire(a, "watch").is_ok());
    }
}
