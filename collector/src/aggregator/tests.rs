//! The aggregator's service tested in process: a real tonic server on a loopback port and a
//! real client, no BPF and no root, so its merge, persistence and refusals are checked by
//! plain `cargo test` in seconds.

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;

use super::{bench::synthetic_rank, store, AggregatorService};
use crate::{
    api::pb::{self, aggregator_client::AggregatorClient},
    profile::JobProfile,
};

/// A served aggregator over the database `db`.
struct Served {
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    store: std::sync::Weak<Mutex<store::Store>>,
}

impl Served {
    /// Stops serving and waits until the database is closed (every holder of the store
    /// gone), so that it can be opened again.
    async fn close(self) {
        let _ = self.stop.send(());
        let _ = self.server.await;
        tokio::time::timeout(Duration::from_secs(10), async {
            while self.store.strong_count() > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the store to be let go");
    }
}

async fn serve(db: &std::path::Path) -> Served {
    let store = Arc::new(Mutex::new(store::Store::open(db).expect("store")));
    let weak = Arc::downgrade(&store);
    let service = AggregatorService::new(store, false);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::aggregator_server::AggregatorServer::new(service))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    Served {
        url,
        stop,
        server,
        store: weak,
    }
}

async fn client(url: &str) -> AggregatorClient<tonic::transport::Channel> {
    AggregatorClient::connect(url.to_string())
        .await
        .expect("connect")
}

/// A snapshot of rank `rank` (pid 100 + rank) of job `j` on `node`, taken at `taken_ns`,
/// with `calls` calls of MPI_Allreduce per size bucket.
fn snapshot(node: &str, rank: u32, taken_ns: u64) -> pb::ProcessSnapshot {
    let mut r = synthetic_rank(rank, 100 + rank, node, &["MPI_Allreduce".into()], 2);
    r.job = "j".into();
    crate::api::snapshot::to_wire(&crate::api::snapshot::Snapshot {
        key: crate::api::snapshot::ProcessKey {
            node: node.into(),
            pid: 100 + rank,
            start_ticks: 7,
            boot_id: "boot".into(),
        },
        taken_ns,
        rank: r,
    })
}

/// Pushes `processes` in one stream; the aggregator's answer.
async fn push(url: &str, processes: Vec<pb::ProcessSnapshot>) -> pb::PushSnapshotsResponse {
    client(url)
        .await
        .push_snapshots(tokio_stream::iter([pb::PushSnapshotsRequest {
            processes,
            ..Default::default()
        }]))
        .await
        .expect("push")
        .into_inner()
}

async fn report(url: &str) -> JobProfile {
    let wire = client(url)
        .await
        .get_job_report(pb::GetJobReportRequest { job: "j".into() })
        .await
        .expect("report")
        .into_inner()
        .profile
        .expect("profile");
    JobProfile::try_from(&wire).expect("valid profile")
}

/// (pid, node) and MPI_Allreduce calls of each rank.
fn calls(p: &JobProfile) -> Vec<(u32, String, u64)> {
    let mut v: Vec<_> = p
        .ranks
        .iter()
        .map(|r| {
            (
                r.pid,
                r.host.clone(),
                r.routines["MPI_Allreduce"].totals.calls,
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn pushes_merge_once_refusals_hold_and_a_restart_keeps_everything() {
    let dir = std::env::temp_dir().join(format!("commtap-agg-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("agg.redb");
    let served = serve(&db).await;
    let url = served.url.clone();

    // Two nodes, a rank each.
    let first = push(&url, vec![snapshot("a", 0, 1_000), snapshot("b", 1, 5_000)]).await;
    assert_eq!((first.accepted, first.stale, first.refused), (2, 0, 0));
    let merged = report(&url).await;
    assert_eq!(merged.job, "j");
    let expected = calls(&merged);
    assert_eq!(expected.len(), 2, "{expected:?}");
    // The same snapshots again (a daemon retrying), and an older one: nothing doubled.
    let again = push(&url, vec![snapshot("a", 0, 1_000), snapshot("b", 1, 4_000)]).await;
    assert_eq!((again.accepted, again.stale), (0, 2));
    assert_eq!(calls(&report(&url).await), expected);
    // A snapshot stamped an hour past its node's clock is refused, not merged.
    let future = push(&url, vec![snapshot("a", 0, 3_600_000_000_000)]).await;
    assert_eq!(future.refused, 1);
    // Malformed: a snapshot without its rank is refused whole.
    let mut bad = snapshot("a", 0, 2_000);
    bad.rank = None;
    let refused = client(&url)
        .await
        .push_snapshots(tokio_stream::iter([pb::PushSnapshotsRequest {
            processes: vec![bad],
            ..Default::default()
        }]))
        .await
        .expect_err("no rank");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");

    // Restarted on the same database: the same report, before any daemon pushes again.
    served.close().await;
    let served = serve(&db).await;
    let url = served.url.clone();
    assert_eq!(calls(&report(&url).await), expected);
    let jobs = client(&url)
        .await
        .list_jobs(pb::ListJobsRequest {})
        .await
        .expect("jobs")
        .into_inner();
    assert_eq!(jobs.jobs.len(), 1);
    served.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn node_addresses_are_kept_only_as_http_urls() {
    let mut apis = super::NodeApis::default();
    apis.note("a", "unix:///run/commtap/commtap.sock");
    apis.note("b", "https://b:7481");
    apis.note("", "https://x:7481");
    apis.note("c", "");
    apis.note("b", "http://b2:7481");
    assert_eq!(
        apis.0.into_iter().collect::<Vec<_>>(),
        vec![("b".to_string(), "http://b2:7481".to_string())]
    );
}
