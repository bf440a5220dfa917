//! Who may do what at an aggregator.
//!
//! With `--tls-client-ca`, every caller presents a certificate signed by that CA, and the
//! certificate's subject names its role in an Organizational Unit:
//! - `commtap-push`: a node daemon. It may push snapshots of its own node only, the node
//!   named by the certificate's Common Name, and may read nothing.
//! - `commtap-relay`: a lower aggregator of a tree (`--upstream`). It may push snapshots of
//!   any node (those merged below it), and may read nothing.
//! - `commtap-read`: a reader (the CLI, dashboards). It may read every job, and push nothing.
//!
//! Without `--tls-client-ca` (plaintext under `--insecure-tcp`, or TLS that authenticates
//! only the server), every caller may push and read: that is for a trusted network only,
//! and the aggregator says so when it starts.

use tonic::{Request, Status};

/// The OU of a node daemon's certificate.
pub const PUSH: &str = "commtap-push";
/// The OU of a lower aggregator's certificate.
pub const RELAY: &str = "commtap-relay";
/// The OU of a reader's certificate.
pub const READ: &str = "commtap-read";

/// What a caller may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// No client authentication is configured: anything.
    Open,
    /// Push the snapshots of this node only.
    Push(String),
    /// Push the snapshots of any node.
    Relay,
    /// Read jobs.
    Read,
}

impl Role {
    /// The role of `req`'s caller; `mutual` says whether the listener requires client
    /// certificates (then every caller has one, verified by TLS).
    pub fn of<T>(req: &Request<T>, mutual: bool) -> Result<Role, Status> {
        if !mutual {
            return Ok(Role::Open);
        }
        let certs = req
            .peer_certs()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| Status::unauthenticated("a client certificate is required"))?;
        role_of_certificate(certs[0].as_ref())
    }

    /// Refuses a caller that may not push.
    pub fn check_push(&self) -> Result<(), Status> {
        match self {
            Role::Open | Role::Push(_) | Role::Relay => Ok(()),
            Role::Read => Err(Status::permission_denied(format!(
                "this certificate is a reader's ({READ}): it may not push"
            ))),
        }
    }

    /// Refuses a caller that may not push a snapshot of `node`.
    pub fn check_node(&self, node: &str) -> Result<(), Status> {
        match self {
            Role::Push(mine) if mine != node => Err(Status::permission_denied(format!(
                "this certificate may push node {mine:?} only, not {node:?}"
            ))),
            _ => self.check_push(),
        }
    }

    /// Refuses a caller that may not read.
    pub fn check_read(&self) -> Result<(), Status> {
        match self {
            Role::Open | Role::Read => Ok(()),
            Role::Push(_) | Role::Relay => Err(Status::permission_denied(
                "this certificate may push, not read: readers have OU=commtap-read",
            )),
        }
    }
}

/// The role a (TLS-verified) certificate's subject names.
fn role_of_certificate(der: &[u8]) -> Result<Role, Status> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| Status::unauthenticated(format!("unreadable client certificate: {e}")))?;
    let subject = cert.subject();
    let units: Vec<&str> = subject
        .iter_organizational_unit()
        .filter_map(|a| a.as_str().ok())
        .filter(|u| [PUSH, RELAY, READ].contains(u))
        .collect();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or("");
    match units.as_slice() {
        [PUSH] if !name.is_empty() => Ok(Role::Push(name.to_string())),
        [PUSH] => Err(Status::permission_denied(
            "a commtap-push certificate must name its node in its Common Name",
        )),
        [RELAY] => Ok(Role::Relay),
        [READ] => Ok(Role::Read),
        [] => Err(Status::permission_denied(format!(
            "the client certificate names no commtap role: its subject needs OU={PUSH}, \
             OU={RELAY} or OU={READ}"
        ))),
        _ => Err(Status::permission_denied(
            "the client certificate names more than one commtap role: one certificate, one role",
        )),
    }
}
