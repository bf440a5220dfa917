//! Relayed traces (StreamJobEvents): the aggregator gathers a job's calls from the daemons
//! of its nodes, as `commtap trace` would, and hands them to a caller that reaches the
//! aggregator but not the nodes.
//!
//! Bounded: a few messages wait for the caller at most; a caller that reads too slowly
//! holds up the daemons' streams, which then lose calls and count them (the profile's
//! counts stay exact).

use anyhow::Result;
use tokio::sync::mpsc;
use tonic::Status;

use crate::{
    api::{pb, transport::Target},
    trace::{
        remote::{self, Sink, TraceRequest},
        ProcessName,
    },
};

/// Messages waiting for a slow caller.
const QUEUED: usize = 8;

/// The caller's end of a relayed trace.
pub type Relayed = mpsc::Receiver<Result<pb::StreamJobEventsResponse, Status>>;

/// Relays every call of `job` on `nodes` until the duration ends, the job's ranks exit,
/// the caller leaves or `shutdown` comes.
pub fn start(
    nodes: Vec<Target>,
    job: String,
    duration_ms: u64,
    shutdown: tokio_util::sync::CancellationToken,
    slot: impl Send + 'static,
) -> Relayed {
    let (tx, rx) = mpsc::channel(QUEUED);
    tokio::spawn(async move {
        let _slot = slot;
        let request = TraceRequest {
            job: Some(job),
            duration: (duration_ms > 0).then(|| std::time::Duration::from_millis(duration_ms)),
            ..TraceRequest::default()
        };
        let mut sink = RelaySink {
            tx: tx.clone(),
            pending: pb::StreamJobEventsResponse::default(),
            lost: 0,
        };
        let gone = tx.clone();
        let stop = async move {
            tokio::select! {
                () = gone.closed() => {}
                () = shutdown.cancelled() => {}
            }
        };
        if let Err(e) = remote::gather(&nodes, &request, &mut sink, stop).await {
            let _ = tx
                .send(Err(Status::unavailable(format!(
                    "relaying the trace: {e:#}"
                ))))
                .await;
        }
    });
    rx
}

/// What was gathered since the last message, and what the caller was told.
struct RelaySink {
    tx: mpsc::Sender<Result<pb::StreamJobEventsResponse, Status>>,
    pending: pb::StreamJobEventsResponse,
    lost: u64,
}

impl Sink for RelaySink {
    fn call(&mut self, ev: pb::CallEvent) -> Result<()> {
        self.pending.events.push(ev);
        Ok(())
    }

    fn name(&mut self, pid: u32, name: ProcessName) {
        self.pending.processes.push(pb::TracedProcess {
            pid,
            rank: name.rank,
            host: name.host,
            job: name.job,
        });
    }

    fn lost_by_reader(&mut self, n: u64) {
        self.lost += n;
        self.pending.lost_by_reader = self.lost;
    }

    fn detached(&mut self, pid: u32) {
        // After the message's calls: each daemon's batch is flushed as one message.
        self.pending.detached.push(pid);
    }

    fn exited(&mut self, pid: u32) {
        self.pending.exited.push(pid);
    }

    fn set_ring_buffer_full(&mut self, n: u64) {
        self.pending.ring_buffer_full = Some(n);
    }

    fn set_clocks(&mut self, clocks: serde_json::Value) {
        self.pending.clocks_json = clocks.to_string();
    }

    fn streaming(&mut self) -> Result<()> {
        self.pending.streaming = true;
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        let msg = std::mem::take(&mut self.pending);
        // The lost count rides on every message; a message with nothing else is not sent.
        self.pending.lost_by_reader = self.lost;
        if msg
            == (pb::StreamJobEventsResponse {
                lost_by_reader: msg.lost_by_reader,
                ..Default::default()
            })
        {
            return Ok(());
        }
        self.tx
            .send(Ok(msg))
            .await
            .map_err(|_| anyhow::anyhow!("the caller of StreamJobEvents went away"))
    }
}
