//! What the node daemon and the aggregator serve alike: their service next to gRPC health
//! and server reflection (v1 and v1alpha: grpcurl speaks v1, many clients, Python's among
//! them, still v1alpha), one response fix-up, and serving until shutdown on any listener.

use std::future::Future;

use anyhow::{Context, Result};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::Stream;
use tonic::{
    body::Body,
    server::NamedService,
    service::Routes,
    transport::{server::Connected, ServerTlsConfig},
};

use super::pb;

/// `service` with health (reporting it serving) and reflection beside it.
pub async fn routes<S>(service: S) -> Result<Routes>
where
    S: tower::Service<
            tonic::codegen::http::Request<Body>,
            Response = tonic::codegen::http::Response<Body>,
            Error = std::convert::Infallible,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(S::NAME, tonic_health::ServingStatus::Serving)
        .await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok(Routes::new(health_service)
        .add_service(
            reflection()
                .build_v1()
                .context("building the reflection service")?,
        )
        .add_service(
            reflection()
                .build_v1alpha()
                .context("building the reflection service")?,
        )
        .add_service(service))
}

/// How long open streams (a trace, `top`, `report --watch`) may go on once a server is
/// told to stop: a graceful stop waits for every connection to close, and a stream's
/// client may never close it (`systemctl stop` would wait out its timeout).
const STREAMS_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Serves `routes` on the connections of `incoming` (over `tls` if given) until `shutdown`
/// completes, and the connections still open [`STREAMS_GRACE`] after it are dropped.
pub async fn serve<I, IO, IE>(
    routes: Routes,
    tls: Option<ServerTlsConfig>,
    incoming: I,
    shutdown: impl Future<Output = ()>,
) -> Result<()>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).context("setting up TLS")?;
    }
    let (stopped, mut stopping) = tokio::sync::watch::channel(false);
    let server = builder
        .layer(tower::util::MapResponseLayer::new(
            oversized_is_resource_exhausted,
        ))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            let _ = stopped.send(true);
        });
    let grace = async move {
        if stopping.wait_for(|s| *s).await.is_ok() {
            tokio::time::sleep(STREAMS_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        served = server => served.context("serving gRPC"),
        () = grace => {
            tracing::info!(
                "streams still open {} s after the stop: their connections are dropped",
                STREAMS_GRACE.as_secs()
            );
            Ok(())
        }
    }
}

/// tonic answers a request larger than the server accepts with OUT_OF_RANGE; gRPC's status
/// for that is RESOURCE_EXHAUSTED, which clients and proxies expect (trailers-only replies
/// carry the status in the headers).
fn oversized_is_resource_exhausted<B>(
    mut resp: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    use tonic::codegen::http::HeaderValue;
    let out_of_range = resp.headers().get("grpc-status").is_some_and(|v| v == "11");
    let too_large = resp
        .headers()
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        // grpc-message is percent-encoded.
        .is_some_and(|m| m.replace("%20", " ").contains("message length too large"));
    if out_of_range && too_large {
        resp.headers_mut()
            .insert("grpc-status", HeaderValue::from_static("8"));
    }
    resp
}

/// The stream of a Watch RPC: `send_tick` runs every `interval` in a task of its own and
/// sends that tick's messages, until the client goes away (it returns false once a send
/// failed). `slot` (the caller's place under the stream limit) is held as long as the
/// stream lasts. One loop for the node's and the aggregator's watches.
pub fn watch_stream<T, S, F, Fut>(
    interval: std::time::Duration,
    slot: S,
    mut send_tick: F,
) -> tokio_stream::wrappers::ReceiverStream<Result<T, tonic::Status>>
where
    T: Send + 'static,
    S: Send + 'static,
    F: FnMut(tokio::sync::mpsc::Sender<Result<T, tonic::Status>>) -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    // One message waiting at most: a page can be a thousand ranks (tens of MiB at a node's
    // scale), and a slow reader must not have several queued for it.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let _slot = slot;
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            if tx.is_closed() || !send_tick(tx.clone()).await {
                break;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
