//! Group commit: batches pushed at the same time by many senders are merged in one durable
//! commit, and each sender is answered once that commit is done.
//!
//! A commit waits for the disk; one per push made 100 daemons pushing at once wait for 100
//! commits in a row. The merge itself is still [`Store::merge_many`]: the same rules, the
//! same outcome per batch as merging them one by one.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex};

use super::{
    health::Health,
    store::{prepare, Outcome, Prepared, Store, StoreError},
};
use crate::api::pb;

/// Most batches merged in one commit.
const MAX_GROUP: usize = 256;

/// A handle to the task that merges and commits.
#[derive(Clone)]
pub struct GroupCommit {
    tx: mpsc::Sender<(Prepared, oneshot::Sender<Outcome>)>,
}

impl GroupCommit {
    /// Starts the merging task over `store`, counting its commits in `health`.
    pub fn start(store: Arc<Mutex<Store>>, health: Arc<Health>) -> GroupCommit {
        let (tx, mut rx) = mpsc::channel::<(Prepared, oneshot::Sender<Outcome>)>(MAX_GROUP);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(more) => group.push(more),
                        Err(_) => break,
                    }
                }
                let (batches, acks): (Vec<_>, Vec<_>) = group.into_iter().unzip();
                let started = std::time::Instant::now();
                let merged = store.lock().await.merge_many(batches);
                health.committed(started.elapsed().as_nanos() as u64);
                match merged {
                    Ok(outcomes) => {
                        for (ack, outcome) in acks.into_iter().zip(outcomes) {
                            let _ = ack.send(outcome);
                        }
                    }
                    Err(e) => {
                        for ack in acks {
                            let _ = ack.send(Err(e.clone()));
                        }
                    }
                }
            }
        });
        GroupCommit { tx }
    }

    /// Checks and encodes `batch` here (in the sender's task), then merges it with whatever
    /// else is waiting; (accepted, stale) once it is durable.
    pub async fn merge(&self, batch: Vec<pb::ProcessSnapshot>) -> Outcome {
        let batch = prepare(batch)?;
        let (ack, done) = oneshot::channel();
        let gone = || StoreError::Stopped;
        self.tx.send((batch, ack)).await.map_err(|_| gone())?;
        done.await.map_err(|_| gone())?
    }
}
