//! The Prometheus endpoint of a node (`commtap daemon --metrics-addr`): who may read what,
//! over which listener; the text itself is `render`'s.

pub mod otlp;
mod render;

pub use render::{render, render_skew};

use std::{fmt::Write as _, net::SocketAddr, sync::Arc};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming, server::conn::http1, service::service_fn, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use super::node::Caller;
use super::node::NodeState;
use crate::api::pb;

/// Where `/metrics` is served, and to whom.
#[derive(Clone, Debug)]
pub enum MetricsListener {
    /// A Unix socket: the caller's uid decides what it sees, as on the API socket (root:
    /// every job; a user: its own processes' series).
    Unix {
        /// The socket.
        path: std::path::PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// TCP with mutual TLS: a scraper whose client certificate verifies sees every job.
    Tls {
        /// The address.
        addr: SocketAddr,
        /// The server's certificate, key and the clients' CA (PEM files).
        cert: std::path::PathBuf,
        /// Private key of `cert`.
        key: std::path::PathBuf,
        /// CA whose certificates scrapers present.
        client_ca: std::path::PathBuf,
    },
    /// Plaintext TCP (`--metrics-insecure`): anyone who reaches it, every local user
    /// included, sees every job's series.
    Plain(SocketAddr),
}

/// What a `/metrics` endpoint serves: a node's profiles and health, or an aggregator's
/// health.
pub trait Exporter: Send + Sync + 'static {
    /// The exposition (Prometheus text format) `caller` may see.
    fn exposition(&self, caller: Caller) -> impl std::future::Future<Output = String> + Send;
}

/// Serves `/metrics` until `shutdown`.
pub async fn serve<E: Exporter>(
    listener: MetricsListener,
    state: Arc<E>,
    shutdown: CancellationToken,
) -> Result<()> {
    match listener {
        MetricsListener::Unix { path, mode } => {
            let listener = crate::api::transport::bind_unix(&path, mode).await?;
            info!("Prometheus metrics on unix://{}", path.display());
            loop {
                let (stream, _) = tokio::select! {
                    () = shutdown.cancelled() => {
                        let _ = std::fs::remove_file(&path);
                        return Ok(());
                    }
                    accepted = listener.accept() => accepted?,
                };
                let caller = match stream.peer_cred().map(|c| c.uid()) {
                    Ok(0) => Caller::Any,
                    Ok(uid) => Caller::Uid(uid),
                    Err(_) => Caller::Nobody,
                };
                tokio::spawn(serve_connection(stream, state.clone(), caller));
            }
        }
        MetricsListener::Tls {
            addr,
            cert,
            key,
            client_ca,
        } => {
            let acceptor = tls_acceptor(&cert, &key, &client_ca)?;
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics address {addr}"))?;
            info!(
                "Prometheus metrics on https://{}/metrics (client certificates required)",
                listener.local_addr()?
            );
            loop {
                let (stream, _) = tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    accepted = listener.accept() => accepted?,
                };
                let (acceptor, state) = (acceptor.clone(), state.clone());
                tokio::spawn(async move {
                    // A handshake that fails (no certificate, another CA) serves nothing.
                    match acceptor.accept(stream).await {
                        Ok(tls) => serve_connection(tls, state, Caller::Any).await,
                        Err(e) => debug!("metrics TLS handshake: {e}"),
                    }
                });
            }
        }
        MetricsListener::Plain(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics address {addr}"))?;
            warn!(
                "Prometheus metrics on plaintext http://{}/metrics (--metrics-insecure): \
                 whoever reaches it reads every job's series",
                listener.local_addr()?
            );
            loop {
                let (stream, _) = tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    accepted = listener.accept() => accepted?,
                };
                tokio::spawn(serve_connection(stream, state.clone(), Caller::Any));
            }
        }
    }
}

/// The TLS acceptor of the metrics endpoint: `cert`/`key` served, clients verified against
/// `client_ca`.
fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: &std::path::Path,
) -> Result<tokio_rustls::TlsAcceptor> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(client_ca)
        .with_context(|| format!("reading {}", client_ca.display()))?
    {
        roots
            .add(ca.with_context(|| format!("parsing {}", client_ca.display()))?)
            .context("adding the client CA")?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .context("the client certificate verifier")?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .context("the metrics certificate")?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// HTTP/1 on one connection, answering as `caller` may see.
async fn serve_connection<S, E: Exporter>(stream: S, state: Arc<E>, caller: Caller)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        async move { Ok::<_, std::convert::Infallible>(respond(state.as_ref(), &req, caller).await) }
    });
    if let Err(e) = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        debug!("metrics connection: {e}");
    }
}

/// What `caller` is shown: which commtap this is, then `state`'s series (`/metrics` and
/// OTLP alike).
async fn everything<E: Exporter>(state: &E, caller: Caller) -> String {
    let mut body = format!(
        "# HELP commtap_build_info The commtap that serves these metrics.\n\
         # TYPE commtap_build_info gauge\n\
         commtap_build_info{{version=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    );
    body.push_str(&state.exposition(caller).await);
    body
}

async fn respond<E: Exporter>(
    state: &E,
    req: &Request<Incoming>,
    caller: Caller,
) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        let mut r = Response::new(Full::new(Bytes::from_static(b"not found: try /metrics\n")));
        *r.status_mut() = StatusCode::NOT_FOUND;
        return r;
    }
    let body = everything(state, caller).await;
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

impl Exporter for NodeState {
    async fn exposition(&self, caller: Caller) -> String {
        node_exposition(self, caller).await
    }
}

/// A node's series: its processes' profiles as `caller` may see them, who is late, the
/// probes' cost, and the daemon's own health.
async fn node_exposition(state: &NodeState, caller: Caller) -> String {
    let profile = state.snapshot(&pb::ProcessFilter::default(), caller).await;
    let (live, exiting, libraries, failures, programs) = {
        let session = state.session.lock().await;
        let libs = session.library_summaries();
        let failures = libs.iter().map(|l| l.failed.len()).sum();
        let live = session
            .tracked
            .values()
            .filter(|t| t.exit_ns.is_none())
            .count();
        (
            live,
            session.tracked.len() - live,
            libs.len(),
            failures,
            session.probes.program_stats(),
        )
    };
    // Exited: profiles kept, plus processes whose final profile is not taken yet.
    let exited = state.finished.lock().await.len() + exiting;
    let mut body = render(&profile, live, exited, libraries, failures);
    if let Some(late) = &state.late {
        let board = late.lock().await;
        body.push_str(&render_skew(&profile, &board));
    }
    if let Some(programs) = programs {
        body.push_str(&render::render_programs(&programs));
    }
    let _ = writeln!(
        body,
        "# HELP commtap_finished_profiles_dropped_total Final profiles of exited processes let go \
         early (more than 4096 of one user, or 65536 in all, kept at once).\n\
         # TYPE commtap_finished_profiles_dropped_total counter\n\
         commtap_finished_profiles_dropped_total {}",
        state
            .finished_dropped
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    body
}
