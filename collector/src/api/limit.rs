//! Bounds on the long-lived streams a server holds (an aggregator's pushes and job watches,
//! a node daemon's snapshot watches): each holds a task and builds a whole profile every
//! interval, so neither one caller nor all of them together may open without end.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex},
};

use tonic::Status;

/// Most streams of one kind a single caller may hold open.
pub const PER_PEER: usize = 16;
/// Most streams of one kind open in all.
pub const TOTAL: usize = 1024;

/// Open streams of one kind, by caller (`K`: a peer address, or who a caller is).
#[derive(Debug)]
pub struct StreamLimit<K> {
    open: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K> Default for StreamLimit<K> {
    fn default() -> Self {
        StreamLimit {
            open: Arc::default(),
        }
    }
}

impl<K> Clone for StreamLimit<K> {
    fn clone(&self) -> Self {
        StreamLimit {
            open: self.open.clone(),
        }
    }
}

/// One open stream: dropping it frees its place.
#[derive(Debug)]
pub struct StreamSlot<K: Eq + Hash> {
    open: Arc<Mutex<HashMap<K, usize>>>,
    peer: K,
}

impl<K: Eq + Hash + Clone> StreamLimit<K> {
    /// Streams open now, of every caller.
    pub fn open(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .sum()
    }

    /// A place for one more stream of `peer`, or RESOURCE_EXHAUSTED saying which limit.
    pub fn acquire(&self, peer: K, what: &str) -> Result<StreamSlot<K>, Status> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let total: usize = open.values().sum();
        let mine = open.get(&peer).copied().unwrap_or(0);
        if mine >= PER_PEER {
            return Err(Status::resource_exhausted(format!(
                "{PER_PEER} {what} streams of this caller are open already: close one first"
            )));
        }
        if total >= TOTAL {
            return Err(Status::resource_exhausted(format!(
                "{TOTAL} {what} streams are open already"
            )));
        }
        *open.entry(peer.clone()).or_default() += 1;
        Ok(StreamSlot {
            open: self.open.clone(),
            peer,
        })
    }
}

impl<K: Eq + Hash> Drop for StreamSlot<K> {
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
    use std::net::IpAddr;

    use super::*;

    #[test]
    fn one_peer_cannot_take_every_place() {
        let limit = StreamLimit::default();
        let a: Option<IpAddr> = Some([10, 0, 0, 1].into());
        let held: Vec<StreamSlot<_>> = (0..PER_PEER)
            .map(|_| limit.acquire(a, "watch").expect("a place"))
            .collect();
        assert!(limit.acquire(a, "watch").is_err());
        assert!(limit.acquire(Some([10, 0, 0, 2].into()), "watch").is_ok());
        drop(held);
        assert!(limit.acquire(a, "watch").is_ok());
    }
}
