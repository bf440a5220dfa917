//! The aggregator's client: pushing cumulative snapshots to an aggregator, resent until delivered: a daemon pushes
//! its processes, an aggregator of a tree pushes what it has merged.
//!
//! Snapshots are cumulative, so the daemon needs no outbox: while the aggregator is down
//! it keeps counting (and keeps exited processes' profiles for --keep-exited), and the first
//! snapshot after reconnecting carries everything. Reconnection backs off up to 30 s.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    api::{
        pb,
        transport::{connect, Target},
    },
    clock::monotonic_ns,
};

/// Where snapshots come from.
#[tonic::async_trait]
pub trait SnapshotSource: Send + Sync + 'static {
    /// Every process's cumulative snapshot now, or (`everything` false) those that may
    /// have changed since the last batch, which went down the same stream (and, from a
    /// node, the collective instances handed on since the last batch).
    async fn batch(&self, everything: bool) -> pb::PushSnapshotsRequest;

    /// More processes of the batch last asked for, a part at a time (None: no more): a
    /// source holding many hands them out so that a push never holds them all in memory.
    async fn more(&self) -> Option<Vec<pb::ProcessSnapshot>> {
        None
    }

    /// The clock the batches' times are on (the node's monotonic clock, as its API gives it).
    fn clock_ns(&self) -> u64 {
        monotonic_ns()
    }
}

/// Every this many pushes of a stream, one carries every snapshot, changed or not.
const EVERYTHING_EVERY: u64 = 60;

/// Pushes `state`'s snapshots to `target` every `interval` until `shutdown`.
pub async fn run<S: SnapshotSource>(
    state: Arc<S>,
    target: Target,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut backoff = FIRST_RETRY;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let started = std::time::Instant::now();
        match push_session(&state, &target, interval, &shutdown).await {
            Ok(()) => return,
            Err(e) => {
                let wait = retry_after(backoff, started.elapsed());
                warn!(
                    "pushing to the aggregator: {}; retrying in {wait:?}",
                    crate::api::status::error_text(&e)
                );
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
                backoff = (wait * 2).min(LAST_RETRY);
            }
        }
    }
}

/// The first wait before pushing again after a failure.
const FIRST_RETRY: Duration = Duration::from_millis(200);

/// The longest wait before pushing again.
const LAST_RETRY: Duration = Duration::from_secs(30);

/// How long to wait before pushing again after a session that lasted `lasted`, the wait
/// due being `due` (doubled at each failure, up to [`LAST_RETRY`]): [`FIRST_RETRY`] after a
/// session that pushed for longer than the longest wait (an aggregator restarted after
/// weeks of pushing is tried again at once, not 30 s later).
fn retry_after(due: Duration, lasted: Duration) -> Duration {
    if lasted > LAST_RETRY {
        FIRST_RETRY
    } else {
        due
    }
}

/// `batch` as messages of at most `max` encoded bytes each (a snapshot larger than that
/// goes alone): a node or an aggregator of any size never sends more than the receiver
/// takes in one message. An empty batch stays one (empty) message.
pub fn split(mut batch: pb::PushSnapshotsRequest, max: usize) -> Vec<pb::PushSnapshotsRequest> {
    use prost::Message as _;
    let processes = std::mem::take(&mut batch.processes);
    // The rest goes with the first message: the clock, instances (few: one per multi-node
    // collective since the last push, at most 65,536), message halves (at most 65,536) and
    // each job's Late Sender report.
    let mut parts = vec![batch];
    let mut size = 0;
    for p in processes {
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
    let mut client = crate::api::aggregator_client(connect(target).await?);
    // The aggregator's clock against ours, NTP-style, for who is late across nodes (an
    // aggregator without the Clock call gets no instances matched).
    let clock = estimate_clock(&mut client, state.as_ref()).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let call = tokio::spawn(async move {
        client
            .push_snapshots(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    info!("pushing snapshots to the aggregator");
    let mut tick = tokio::time::interval(interval);
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => {
                // A last snapshot (everything, if this stream has pushed nothing yet), then
                // close the stream and let the aggregator answer.
                let _ = send_batch(state.as_ref(), ticks == 0, clock, &tx).await;
                drop(tx);
                let _ = tokio::time::timeout(Duration::from_secs(5), call).await;
                return Ok(());
            }
            _ = tick.tick() => {
                // Everything first, since this stream's receiver may know nothing of ours
                // (a new aggregator, one restored from an old file); then now and then, for
                // a snapshot it refused (stamped ahead of its node's clock as it knew it)
                // and would otherwise never see again once that process stops changing.
                let everything = ticks.is_multiple_of(EVERYTHING_EVERY);
                ticks += 1;
                if send_batch(state.as_ref(), everything, clock, &tx).await.is_err() {
                    let outcome = call.await?;
                    anyhow::bail!("the aggregator closed the stream: {:?}", outcome.err());
                }
                debug!("snapshot pushed");
            }
        }
    }
}

/// Sends a batch of `source`'s down the stream `tx`, in messages of bounded size, its
/// parts as the source hands them out; Err when the stream is closed.
async fn send_batch<S: SnapshotSource>(
    source: &S,
    everything: bool,
    clock: Option<crate::clock::ClockEstimate>,
    tx: &tokio::sync::mpsc::Sender<pb::PushSnapshotsRequest>,
) -> Result<(), ()> {
    let mut batch = stamped(source.batch(everything).await, clock);
    loop {
        for part in split(batch, crate::api::PUSH_MESSAGE_BYTES) {
            tx.send(part).await.map_err(drop)?;
        }
        let Some(processes) = source.more().await else {
            return Ok(());
        };
        batch = pb::PushSnapshotsRequest {
            processes,
            ..Default::default()
        };
    }
}

/// `batch` with the clock estimate.
fn stamped(
    mut batch: pb::PushSnapshotsRequest,
    clock: Option<crate::clock::ClockEstimate>,
) -> pb::PushSnapshotsRequest {
    if let Some(c) = clock {
        batch.clock_offset_ns = Some(c.offset_ns);
        batch.clock_error_ns = c.error_ns;
    }
    batch
}

/// The aggregator's clock minus `source`'s: the best of 16 exchanges (None if the
/// aggregator has no Clock call).
async fn estimate_clock<S: SnapshotSource>(
    client: &mut pb::aggregator_client::AggregatorClient<tonic::transport::Channel>,
    source: &S,
) -> Option<crate::clock::ClockEstimate> {
    crate::clock::best_exchange(
        || source.clock_ns(),
        || {
            let mut c = client.clone();
            async move {
                let r = c.clock(pb::ClockRequest {}).await?.into_inner();
                Ok((r.monotonic_ns, r))
            }
        },
    )
    .await
    .ok()
    .map(|(estimate, _)| estimate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_while_sessions_fail_and_start_over_after_one_that_lasted() {
        // As `run` does: each failed session's wait, then twice it for the next.
        let waits = |lasted: &[u64]| {
            let mut due = FIRST_RETRY;
            let mut waits = Vec::new();
            for &secs in lasted {
                let wait = retry_after(due, Duration::from_secs(secs));
                waits.push(wait.as_millis());
                due = (wait * 2).min(LAST_RETRY);
            }
            waits
        };
        assert_eq!(
            waits(&[0; 10]),
            [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
        // A session that pushed for a day, then failures again.
        assert_eq!(
            waits(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 86_400, 0, 0]),
            [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 200, 400, 800]
        );
    }

    #[test]
    fn pushes_are_split_by_size() {
        let snap = |pid| pb::ProcessSnapshot {
            node: "n".repeat(100),
            pid,
            ..Default::default()
        };
        let batch = pb::PushSnapshotsRequest {
            processes: (0..1000).map(snap).collect(),
            ..Default::default()
        };
        let parts = split(batch, 10_000);
        assert!(parts.len() > 10);
        assert_eq!(parts.iter().map(|p| p.processes.len()).sum::<usize>(), 1000);
        use prost::Message as _;
        assert!(parts.iter().all(|p| p.encoded_len() <= 10_000));
        assert_eq!(split(pb::PushSnapshotsRequest::default(), 10).len(), 1);
    }
}
