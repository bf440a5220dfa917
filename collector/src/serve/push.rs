//! Pushing cumulative snapshots to an aggregator, resent until delivered: a daemon pushes
//! its processes, an aggregator of a tree pushes what it has merged.
//!
//! Snapshots are cumulative, so the daemon needs no outbox: while the aggregator is down
//! it keeps counting (and keeps exited processes' profiles for --keep-exited), and the first
//! snapshot after reconnecting carries everything. Reconnection backs off up to 30 s.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    node::{Caller, NodeState},
    pb,
    socket::{connect, Target},
};
use crate::{
    aggregator::store::{to_wire, ProcessKey, Snapshot},
    ingest::monotonic_ns,
};

/// Where snapshots come from.
#[tonic::async_trait]
pub trait SnapshotSource: Send + Sync + 'static {
    /// Every process's cumulative snapshot now.
    async fn batch(&self) -> pb::PushSnapshotsRequest;
}

#[tonic::async_trait]
impl SnapshotSource for NodeState {
    async fn batch(&self) -> pb::PushSnapshotsRequest {
        let profile = self
            .snapshot(&pb::ProcessFilter::default(), Caller::Any)
            .await;
        let taken_ns = monotonic_ns();
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
                to_wire(&Snapshot {
                    key,
                    taken_ns,
                    rank,
                })
            })
            .collect();
        pb::PushSnapshotsRequest { processes }
    }
}

/// Pushes `state`'s snapshots to `target` every `interval` until `shutdown`.
pub async fn run<S: SnapshotSource>(
    state: Arc<S>,
    target: Target,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        match push_session(&state, &target, interval, &shutdown).await {
            Ok(()) => return,
            Err(e) => {
                warn!("pushing to the aggregator: {e:#}; retrying in {backoff:?}");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// `batch` as messages of at most `max` encoded bytes each (a snapshot larger than that
/// goes alone): a node or an aggregator of any size never sends more than the receiver
/// takes in one message. An empty batch stays one (empty) message.
pub fn split(batch: pb::PushSnapshotsRequest, max: usize) -> Vec<pb::PushSnapshotsRequest> {
    use prost::Message as _;
    let mut parts = vec![pb::PushSnapshotsRequest::default()];
    let mut size = 0;
    for p in batch.processes {
        let len = p.encoded_len() + 8;
        if size + len > max && size > 0 {
            parts.push(pb::PushSnapshotsRequest::default());
            size = 0;
        }
        size += len;
        parts.last_mut().expect("one part").processes.push(p);
    }
    parts
}

/// One connection: a client stream fed a batch every `interval`; returns on shutdown, fails
/// when the aggregator goes away.
async fn push_session<S: SnapshotSource>(
    state: &Arc<S>,
    target: &Target,
    interval: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let mut client = crate::serve::aggregator_client(connect(target).await?);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let call = tokio::spawn(async move {
        client
            .push_snapshots(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    info!("pushing snapshots to the aggregator");
    let mut tick = tokio::time::interval(interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                // A last snapshot, then close the stream and let the aggregator answer.
                for part in split(state.batch().await, crate::serve::PUSH_MESSAGE_BYTES) {
                    let _ = tx.send(part).await;
                }
                drop(tx);
                let _ = tokio::time::timeout(Duration::from_secs(5), call).await;
                return Ok(());
            }
            _ = tick.tick() => {
                for part in split(state.batch().await, crate::serve::PUSH_MESSAGE_BYTES) {
                    if tx.send(part).await.is_err() {
                        let outcome = call.await?;
                        anyhow::bail!("the aggregator closed the stream: {:?}", outcome.err());
                    }
                }
                debug!("snapshot pushed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_are_split_by_size() {
        let snap = |pid| pb::ProcessSnapshot {
            node: "n".repeat(100),
            pid,
            ..Default::default()
        };
        let batch = pb::PushSnapshotsRequest {
            processes: (0..1000).map(snap).collect(),
        };
        let parts = split(batch, 10_000);
        assert!(parts.len() > 10);
        assert_eq!(parts.iter().map(|p| p.processes.len()).sum::<usize>(), 1000);
        use prost::Message as _;
        assert!(parts.iter().all(|p| p.encoded_len() <= 10_000));
        assert_eq!(split(pb::PushSnapshotsRequest::default(), 10).len(), 1);
    }
}
