//! Where the API listens and how clients reach it: a Unix socket by default (owner and
//! group only), or a TCP address.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// The daemon's default socket.
pub const DEFAULT_SOCKET: &str = "/run/commtap/commtap.sock";

/// Binds the Unix socket at `path` with permissions `mode`, replacing a stale socket left
/// by a daemon that died, and refusing to replace one a live daemon still serves.
pub async fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            bail!(
                "{} is in use: another commtap daemon is running",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    // Bound under a temporary name, given its mode, then renamed into place: the socket
    // never exists at `path` with the umask's wider mode, not even for a moment.
    let mut staging = path.as_os_str().to_owned();
    staging.push(format!(".{}.tmp", std::process::id()));
    let staging = PathBuf::from(staging);
    let _ = std::fs::remove_file(&staging);
    let listener =
        UnixListener::bind(&staging).with_context(|| format!("binding {}", staging.display()))?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", staging.display()))?;
    std::fs::rename(&staging, path)
        .with_context(|| format!("moving {} to {}", staging.display(), path.display()))?;
    Ok(listener)
}

/// The TLS setting of a TCP listener: a certificate and key (PEM), with the CA whose
/// client certificates it requires when `client_ca` is given (mutual TLS), or plaintext
/// only when asked for with `--insecure-tcp`; `who` names the server in the refusal.
pub fn server_tls(
    cert_key: Option<(PathBuf, PathBuf)>,
    client_ca: Option<PathBuf>,
    insecure: bool,
    who: &str,
) -> Result<Option<tonic::transport::ServerTlsConfig>> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    match (cert_key, insecure) {
        (Some(_), true) => {
            bail!("{who}: --insecure-tcp and --tls-cert exclude each other: give one of them")
        }
        (Some((cert, key)), false) => {
            let mut tls = tonic::transport::ServerTlsConfig::new().identity(
                tonic::transport::Identity::from_pem(read(&cert)?, read(&key)?),
            );
            if let Some(ca) = client_ca {
                tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(read(&ca)?));
            }
            Ok(Some(tls))
        }
        (None, true) if client_ca.is_some() => {
            bail!("{who}: --tls-client-ca needs TLS (--tls-cert and --tls-key), not --insecure-tcp")
        }
        (None, true) => Ok(None),
        (None, false) => bail!(
            "{who} listens on TCP: give --tls-cert and --tls-key, or --insecure-tcp to accept \
             plaintext (on a trusted network only)"
        ),
    }
}

/// Where a client connects: `unix:///path/to.sock` or `http://host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A Unix socket.
    Unix(PathBuf),
    /// A TCP endpoint URI.
    Tcp(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(path) => write!(f, "unix://{}", path.display()),
            Target::Tcp(uri) => f.write_str(uri),
        }
    }
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "{s}: a unix target needs an absolute path, e.g. unix://{DEFAULT_SOCKET}"
                ));
            }
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(Target::Tcp(s.to_string()));
        }
        // A socket's path as the daemon's --socket takes it.
        if s.starts_with('/') {
            return Ok(Target::Unix(PathBuf::from(s)));
        }
        Err(format!(
            "{s}: expected unix:///path/to.sock (or /path/to.sock) or http(s)://host:port"
        ))
    }
}

impl Target {
    /// Refuses to push to `self` in plaintext TCP (`http://`) unless `allowed`: what a
    /// node pushes (command lines, users, counts) leaves it over TLS unless someone said
    /// otherwise (`flag`, as the listeners' --insecure-tcp).
    pub fn check_push(&self, allowed: bool, flag: &str) -> Result<()> {
        match self {
            Target::Tcp(url) if url.starts_with("http://") && !allowed => bail!(
                "{url} is plaintext: what is pushed (command lines, users, counts) would cross \
                 the network unencrypted; use https:// (the server's CA in --tls-ca), or give \
                 {flag} on a network you trust"
            ),
            _ => Ok(()),
        }
    }
}

/// The PEM file named by the environment variable `var` (set from the global TLS options).
pub fn pem_from_env(var: &str, what: &str) -> Result<Option<Vec<u8>>> {
    match std::env::var_os(var) {
        Some(path) => {
            let shown = PathBuf::from(&path).display().to_string();
            Ok(Some(
                std::fs::read(&path).with_context(|| format!("reading the {what} {shown}"))?,
            ))
        }
        None => Ok(None),
    }
}

/// An `https://` endpoint verified against the CA `ca` (PEM), showing `identity`
/// (certificate and key, PEM) where one is given, for servers that require client
/// certificates.
pub fn tls_endpoint(
    uri: &str,
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<Endpoint> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca));
    if let Some((cert, key)) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(uri.to_string())?
        .tls_config(tls)
        .with_context(|| format!("TLS for {uri}"))
}

/// Opens a channel to `target`. An `https://` target is verified against `--tls-ca` (the
/// `COMMTAP_TLS_CA` file), and is shown `--tls-cert` (`COMMTAP_TLS_CERT`/`_KEY`) where one
/// is given, for servers that require client certificates.
pub async fn connect(target: &Target) -> Result<Channel> {
    match target {
        Target::Tcp(uri) => {
            let endpoint = if uri.starts_with("https://") {
                let pem = pem_from_env("COMMTAP_TLS_CA", "CA bundle")?.with_context(|| {
                    format!("{uri}: give the CA that signed its certificate with --tls-ca")
                })?;
                let cert = pem_from_env("COMMTAP_TLS_CERT", "certificate")?;
                let key = pem_from_env("COMMTAP_TLS_KEY", "private key")?;
                tls_endpoint(uri, pem, cert.zip(key))?
            } else {
                Endpoint::from_shared(uri.clone())?
            };
            Ok(endpoint
                .connect()
                .await
                .with_context(|| format!("connecting to {uri}"))?)
        }
        Target::Unix(path) => {
            let path = path.clone();
            let shown = path.display().to_string();
            let asked = path.clone();
            // The URI is required by the API and unused: the connector decides where to go.
            Endpoint::try_from("http://[::]:50051")?
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await
                .with_context(|| {
                    // A socket the caller may not open is a daemon that runs.
                    let denied = asked.exists()
                        && nix::unistd::access(&asked, nix::unistd::AccessFlags::W_OK).is_err();
                    if denied {
                        format!(
                            "connecting to unix://{shown}: the daemon's socket is not open to \
                             you (its --socket-mode gives it to root and its group: ask to be \
                             in that group, or use sudo)"
                        )
                    } else {
                        format!("connecting to unix://{shown} (is `commtap daemon` running?)")
                    }
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!(
            "unix:///run/x.sock".parse(),
            Ok(Target::Unix("/run/x.sock".into()))
        );
        assert_eq!("http://h:1".parse(), Ok(Target::Tcp("http://h:1".into())));
        assert!("unix://relative".parse::<Target>().is_err());
        assert!("ftp://x".parse::<Target>().is_err());
    }
}
