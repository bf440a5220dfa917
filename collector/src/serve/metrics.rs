//! Prometheus text exposition of a node's profile (`commtap daemon --metrics-addr`).
//!
//! Label cardinality stays bounded: job, rank, routine and size bucket (mpitrace's bins),
//! never raw sizes, peers, pids or NCCL communicator ids.

use std::{fmt::Write as _, net::SocketAddr, sync::Arc};

use anyhow::{Context, Result};
use bytes::Bytes;
use collector_common::{
    buckets::RangeLabel,
    routines::{routine_id, Family},
    ROUTINES,
};
use http_body_util::Full;
use hyper::{
    body::Incoming, server::conn::http1, service::service_fn, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::node::{Caller, NodeState};
use crate::{api::pb, profile::JobProfile};

/// Lines of the per-routine families of one routine family (MPI or NCCL).
#[derive(Default)]
struct RoutineLines {
    calls: Vec<String>,
    bytes: Vec<String>,
    seconds: Vec<String>,
    size_calls: Vec<String>,
    size_bytes: Vec<String>,
}

/// Who is late, per job and rank (and routine): the instances each rank arrived last at,
/// the time it made the others wait and the time it waited, and the highest instance
/// number it reached (labels bounded: no communicators, no instance numbers).
pub fn render_skew(profile: &JobProfile, board: &crate::skew::Board) -> String {
    let mut jobs: std::collections::BTreeMap<&str, Vec<&crate::profile::RankProfile>> =
        Default::default();
    for r in &profile.ranks {
        jobs.entry(r.job.as_str()).or_default().push(r);
    }
    let mut lines: [Vec<String>; 4] = Default::default();
    let mut per_routine: [Vec<String>; 3] = Default::default();
    let mut seq = Vec::new();
    for (job, ranks) in jobs {
        let pids: Vec<u32> = ranks.iter().map(|r| r.pid).collect();
        let whois = |pid: u32| {
            let r = ranks.iter().find(|r| r.pid == pid)?;
            Some((r.rank, r.host.clone()))
        };
        let Some(skew) = board.report_for(&pids, &whois) else {
            continue;
        };
        for r in &skew.ranks {
            let l = format!("{{job=\"{}\",rank=\"{}\"}}", escape(job), r.rank);
            lines[0].push(format!("{l} {}", r.instances));
            lines[1].push(format!("{l} {}", r.last));
            lines[2].push(format!("{l} {}", r.caused_ns as f64 / 1e9));
            lines[3].push(format!("{l} {}", r.waited_ns as f64 / 1e9));
            if let Some(s) = r.seq {
                seq.push(format!("{l} {s}"));
            }
            for x in &r.routines {
                let l = format!(
                    "{{job=\"{}\",rank=\"{}\",routine=\"{}\"}}",
                    escape(job),
                    r.rank,
                    escape(&x.routine)
                );
                per_routine[0].push(format!("{l} {}", x.last));
                per_routine[1].push(format!("{l} {}", x.caused_ns as f64 / 1e9));
                per_routine[2].push(format!("{l} {}", x.waited_ns as f64 / 1e9));
            }
        }
    }
    let mut o = String::new();
    for ((name, help), lines) in [
        (
            "commtap_late_instances_total",
            "Collective instances the rank was matched in with every other member.",
        ),
        (
            "commtap_late_last_total",
            "Collective instances at which the rank arrived last.",
        ),
        (
            "commtap_late_caused_seconds_total",
            "Time the other members waited for the rank (skews of the instances it was last at).",
        ),
        (
            "commtap_late_waited_seconds_total",
            "Time the rank waited inside collectives for the last member to arrive.",
        ),
    ]
    .into_iter()
    .zip(lines)
    {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
        for l in lines {
            let _ = writeln!(o, "{name}{l}");
        }
    }
    for ((name, help), lines) in [
        (
            "commtap_late_routine_last_total",
            "Instances of the routine at which the rank arrived last.",
        ),
        (
            "commtap_late_routine_caused_seconds_total",
            "Time the other members of the routine's instances waited for the rank.",
        ),
        (
            "commtap_late_routine_waited_seconds_total",
            "Time the rank waited inside the routine for the last member to arrive.",
        ),
    ]
    .into_iter()
    .zip(per_routine)
    {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
        for l in lines {
            let _ = writeln!(o, "{name}{l}");
        }
    }
    let _ = writeln!(
        o,
        "# HELP commtap_late_seq The highest collective instance number the rank reached (it \
         stops moving for the rank a hung job waits for).\n# TYPE commtap_late_seq gauge"
    );
    for l in seq {
        let _ = writeln!(o, "commtap_late_seq{l}");
    }
    o
}

/// Renders the Prometheus text format for `profile`, plus the daemon's own health.
pub fn render(
    profile: &JobProfile,
    live: usize,
    exited: usize,
    libraries: usize,
    attach_failures: usize,
) -> String {
    let mut o = String::new();
    let mut family = |name: &str, kind: &str, help: &str, lines: Vec<String>| {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} {kind}");
        for l in lines {
            let _ = writeln!(o, "{name}{l}");
        }
    };
    // Per routine family: MPI's, and NCCL's with the host's waits for the GPU.
    let mut mpi = RoutineLines::default();
    let mut nccl = RoutineLines::default();
    let mut fabric = RoutineLines::default();
    let mut device = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let mut providers = Vec::new();
    let (mut dropped, mut undecoded, mut nested, mut in_flight) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in &profile.ranks {
        let base = format!("job=\"{}\",rank=\"{}\"", escape(&r.job), r.rank);
        for (routine, s) in &r.routines {
            let lines = match routine_id(routine).map(|id| ROUTINES[id as usize].family()) {
                Some(Family::Nccl | Family::Cuda) => &mut nccl,
                Some(Family::Fabric) => &mut fabric,
                _ => &mut mpi,
            };
            let l = format!("{{{base},routine=\"{}\"}}", escape(routine));
            lines.calls.push(format!("{l} {}", s.totals.calls));
            lines.bytes.push(format!("{l} {}", s.totals.bytes));
            lines
                .seconds
                .push(format!("{l} {}", s.totals.time_ns as f64 / 1e9));
            for b in &s.sizes {
                let size = match b.bucket {
                    Some(k) => RangeLabel::of_bucket(k).to_string(),
                    None => "undecoded".to_string(),
                };
                let l = format!("{{{base},routine=\"{}\",size=\"{size}\"}}", escape(routine));
                lines.size_calls.push(format!("{l} {}", b.totals.calls));
                lines.size_bytes.push(format!("{l} {}", b.totals.bytes));
                if let Some(d) = b.device {
                    device[0].push(format!("{l} {}", d.calls));
                    device[1].push(format!("{l} {}", d.bytes));
                    device[2].push(format!("{l} {}", d.time_ns as f64 / 1e9));
                    if let Some(bus) = d.bus_bytes {
                        device[3].push(format!("{l} {bus}"));
                    }
                }
            }
        }
        let l = format!("{{{base}}}");
        dropped.push(format!("{l} {}", r.health.dropped));
        undecoded.push(format!("{l} {}", r.health.undecoded));
        nested.push(format!("{l} {}", r.health.nested));
        in_flight.push(format!("{l} {}", r.health.in_flight_at_attach));
        for f in &r.fabrics {
            providers.push(format!(
                "{{{base},provider=\"{}\",fabric=\"{}\"}} 1",
                escape(&f.provider),
                escape(&f.name)
            ));
        }
    }
    for (prefix, what, time, lines) in [
        ("commtap_mpi", "MPI calls", "time_seconds_total", mpi),
        (
            "commtap_nccl",
            "NCCL operations and host waits for the GPU",
            "enqueue_seconds_total",
            nccl,
        ),
        (
            "commtap_fabric",
            "libfabric operations",
            "post_seconds_total",
            fabric,
        ),
    ] {
        family(
            &format!("{prefix}_calls_total"),
            "counter",
            &format!("{what} completed, per job, rank and routine."),
            lines.calls,
        );
        family(
            &format!("{prefix}_bytes_total"),
            "counter",
            &format!("Bytes of {what} (mpitrace's / nccl-tests' conventions)."),
            lines.bytes,
        );
        family(
            &format!("{prefix}_{time}"),
            "counter",
            &format!("Host time inside {what} (NCCL: enqueue time), per routine."),
            lines.seconds,
        );
        family(
            &format!("{prefix}_size_calls_total"),
            "counter",
            &format!("{what} per message-size bucket (mpitrace's bins)."),
            lines.size_calls,
        );
        family(
            &format!("{prefix}_size_bytes_total"),
            "counter",
            &format!("Bytes of {what} per message-size bucket (mpitrace's bins)."),
            lines.size_bytes,
        );
    }
    let [ops, dev_bytes, dev_seconds, bus] = device;
    family(
        "commtap_nccl_device_ops_total",
        "counter",
        "NCCL operations with device time (a host wait for the GPU followed them).",
        ops,
    );
    family(
        "commtap_nccl_device_bytes_total",
        "counter",
        "Bytes of the NCCL operations with device time (rate over device seconds: algbw).",
        dev_bytes,
    );
    family(
        "commtap_nccl_device_seconds_total",
        "counter",
        "Device time of NCCL operations: enqueue to the return of the host's wait.",
        dev_seconds,
    );
    family(
        "commtap_nccl_device_bus_bytes_total",
        "counter",
        "Bytes x nccl-tests' bus factor (rate over device seconds: busbw).",
        bus,
    );
    family(
        "commtap_events_dropped_total",
        "counter",
        "Call events lost to a full ring buffer (counts stay exact).",
        dropped,
    );
    family(
        "commtap_undecoded_calls_total",
        "counter",
        "Calls whose bytes could not be decoded.",
        undecoded,
    );
    family(
        "commtap_nested_calls_total",
        "counter",
        "MPI calls made inside another MPI call (counted once).",
        nested,
    );
    family(
        "commtap_in_flight_at_attach_total",
        "counter",
        "Calls already running when probes attached (not counted).",
        in_flight,
    );
    family(
        "commtap_fabric_provider_info",
        "gauge",
        "libfabric fabrics a rank opened (fi_fabric), by provider (tcp;ofi_rxm) and fabric.",
        providers,
    );
    family(
        "commtap_processes",
        "gauge",
        "MPI processes the daemon knows, by state.",
        vec![
            format!("{{state=\"live\"}} {live}"),
            format!("{{state=\"exited\"}} {exited}"),
        ],
    );
    family(
        "commtap_probed_libraries",
        "gauge",
        "MPI libraries with probes attached.",
        vec![format!(" {libraries}")],
    );
    family(
        "commtap_probe_attach_failures",
        "gauge",
        "Probe links that could not be attached.",
        vec![format!(" {attach_failures}")],
    );
    o
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

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

/// Serves `/metrics` until `shutdown`.
pub async fn serve(
    listener: MetricsListener,
    state: Arc<NodeState>,
    shutdown: CancellationToken,
) -> Result<()> {
    match listener {
        MetricsListener::Unix { path, mode } => {
            let listener = crate::api::transport::bind_unix(&path, mode).await?;
            info!("Prometheus metrics on unix://{}", path.display());
            loop {
                let (stream, _) = tokio::select! {
                    _ = shutdown.cancelled() => {
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
                    _ = shutdown.cancelled() => return Ok(()),
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
                    _ = shutdown.cancelled() => return Ok(()),
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
async fn serve_connection<S>(stream: S, state: Arc<NodeState>, caller: Caller)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        async move { Ok::<_, std::convert::Infallible>(respond(&state, &req, caller).await) }
    });
    if let Err(e) = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        debug!("metrics connection: {e}");
    }
}

async fn respond(
    state: &NodeState,
    req: &Request<Incoming>,
    caller: Caller,
) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        let mut r = Response::new(Full::new(Bytes::from_static(b"not found: try /metrics\n")));
        *r.status_mut() = StatusCode::NOT_FOUND;
        return r;
    }
    let profile = state.snapshot(&pb::ProcessFilter::default(), caller).await;
    let (live, exiting, libraries, failures) = {
        let session = state.session.lock().await;
        let libs = session.library_summaries();
        let failures = libs.iter().map(|l| l.failed.len()).sum();
        let live = session
            .tracked
            .values()
            .filter(|t| t.exit_ns.is_none())
            .count();
        (live, session.tracked.len() - live, libs.len(), failures)
    };
    // Exited: profiles kept, plus processes whose final profile is not taken yet.
    let exited = state.finished.lock().await.len() + exiting;
    let mut body = render(&profile, live, exited, libraries, failures);
    if let Some(late) = &state.late {
        let board = late.lock().await;
        body.push_str(&render_skew(&profile, &board));
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
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_well_formed() {
        let text = render(
            &JobProfile {
                schema: String::new(),
                job: String::new(),
                ranks: vec![],
                dropped: 0,
                undecoded: 0,
                libraries: vec![],
                unsupported_libraries: vec![],
                not_profiled: vec![],
                call_events: false,
                skew: None,
            },
            1,
            2,
            3,
            0,
        );
        assert!(text.contains("# TYPE commtap_mpi_calls_total counter"));
        assert!(text.contains("commtap_processes{state=\"exited\"} 2"));
        assert!(text.contains("commtap_probed_libraries 3"));
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }

    #[test]
    fn fabric_providers_are_an_info_gauge() {
        let text = render(&crate::api::convert::tests::sample(), 1, 0, 1, 0);
        assert!(text.contains(
            "commtap_fabric_provider_info{job=\"42\",rank=\"0\",provider=\"tcp;ofi_rxm\",fabric=\"10.0.0.0/8\"} 1\n"
        ), "{text}");
    }

    #[test]
    fn nccl_operations_have_their_own_families() {
        let text = render(&crate::api::convert::tests::sample(), 1, 0, 1, 0);
        let base = "job=\"42\",rank=\"0\"";
        assert!(text.contains(&format!(
            "commtap_nccl_calls_total{{{base},routine=\"ncclAllReduce\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "commtap_mpi_calls_total{{{base},routine=\"MPI_Allreduce\"}} 10\n"
        )));
        assert!(!text
            .contains("commtap_mpi_calls_total{job=\"42\",rank=\"0\",routine=\"ncclAllReduce\"}"));
        let (lo, hi) = collector_common::buckets::bucket_range(12);
        // 8192 bytes on 2 ranks: AllReduce's factor 2(n-1)/n is 1.
        assert!(text.contains(&format!(
            "commtap_nccl_device_bus_bytes_total{{{base},routine=\"ncclAllReduce\",size=\"{lo}-{hi}\"}} 8192\n"
        )));
    }
}
