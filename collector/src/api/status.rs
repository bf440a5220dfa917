//! What the node and the aggregator services answer when something goes wrong: one mapping
//! from commtap's errors to gRPC status codes, whose code tells a client what it can do
//! (fix the request, ask someone else, retry later), and the request checks both services
//! share.

use std::time::Duration;

use tonic::Status;

use crate::discover::DiscoverError;

/// An error as the API reports it.
pub trait ToStatus {
    /// Its status: code and message.
    fn to_status(&self) -> Status;
}

impl ToStatus for DiscoverError {
    fn to_status(&self) -> Status {
        match self {
            DiscoverError::NoSuchProcess(_) => Status::not_found(self.to_string()),
            DiscoverError::Proc { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                Status::permission_denied(format!("{self}: {source}"))
            }
            DiscoverError::Proc { source, .. } => Status::unavailable(format!("{self}: {source}")),
            DiscoverError::MapsTooLarge(_) | DiscoverError::ShareSpent { .. } => {
                Status::resource_exhausted(self.to_string())
            }
        }
    }
}

impl ToStatus for anyhow::Error {
    /// What the session could not do to a process that exists (attach, detach): its cause
    /// decides, else the process is in no state for it.
    fn to_status(&self) -> Status {
        if let Some(e) = self.downcast_ref::<DiscoverError>() {
            return e.to_status();
        }
        Status::failed_precondition(format!("{self:#}"))
    }
}

/// The shortest interval a watch (`WatchSnapshots`, `WatchJobReport`) may ask for.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The interval a watch asks for in `interval_ms` (0: one second), refused below
/// [`MIN_INTERVAL`].
pub fn watch_interval(interval_ms: u32) -> Result<Duration, Status> {
    let interval = match interval_ms {
        0 => Duration::from_secs(1),
        ms => Duration::from_millis(u64::from(ms)),
    };
    if interval < MIN_INTERVAL {
        return Err(Status::invalid_argument(format!(
            "interval_ms {interval_ms} is below the minimum of {} ms",
            MIN_INTERVAL.as_millis()
        )));
    }
    Ok(interval)
}

/// An error and its causes as a person reads them, each said once: a gRPC status as its
/// message and what its code means (not tonic's `code: 'Some requested entity was not
/// found', message: ..., source: ...`), and a library's error that repeats its source's
/// text (tonic's transport error over an io error) not twice.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = match cause.downcast_ref::<Status>() {
            Some(status) => status_text(status),
            None => cause.to_string(),
        };
        // A status made from a transport failure says little ("transport error"): its
        // sources say what failed, each once.
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    text
}

/// A status a server answered: its message, and what its code means for the caller.
fn status_text(status: &Status) -> String {
    use tonic::Code;
    let meaning = match status.code() {
        Code::NotFound => "not found",
        Code::PermissionDenied => "permission denied",
        Code::Unauthenticated => "not authenticated",
        Code::Unavailable => "unavailable",
        Code::Unimplemented => {
            "not served there (a node daemon serves `ps`, `attach` and `events`, an \
             aggregator `jobs`; both `report`)"
        }
        Code::InvalidArgument | Code::OutOfRange => "a bad request",
        Code::ResourceExhausted => "over a limit: try again later",
        Code::FailedPrecondition => "not possible now",
        Code::DeadlineExceeded => "timed out",
        Code::Cancelled => "cancelled",
        _ => "failed",
    };
    match status.message() {
        "" => meaning.to_string(),
        message => format!("{message} ({meaning})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregator::store::StoreError;

    #[test]
    fn codes_say_what_a_client_can_do() {
        assert_eq!(
            DiscoverError::NoSuchProcess(7).to_status().code(),
            tonic::Code::NotFound
        );
        assert_eq!(
            StoreError::Invalid(
                crate::api::convert::InvalidMessage {
                    what: "ProcessSnapshot",
                    why: "no node name".into()
                }
                .into()
            )
            .to_status()
            .code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            StoreError::Stopped.to_status().code(),
            tonic::Code::Unavailable
        );
        let wrapped = anyhow::Error::new(DiscoverError::NoSuchProcess(7)).context("attaching");
        assert_eq!(wrapped.to_status().code(), tonic::Code::NotFound);
        assert_eq!(
            watch_interval(10).expect_err("too short").code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(watch_interval(0).expect("default"), Duration::from_secs(1));
    }

    /// A person reads each cause once, and a status as its message and what it means.
    #[test]
    fn an_error_says_each_cause_once_in_words() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(io())
            .context(format!("transport error: {}", io()))
            .context("connecting to unix:///run/commtap/commtap.sock");
        assert_eq!(
            super::error_text(&e),
            "connecting to unix:///run/commtap/commtap.sock: transport error: entity not found"
        );
        let e = anyhow::Error::new(Status::not_found("PID 15545 is not watched"))
            .context("DetachProcess 15545");
        assert_eq!(
            super::error_text(&e),
            "DetachProcess 15545: PID 15545 is not watched (not found)"
        );
        let e = anyhow::Error::new(Status::unimplemented("")).context("ListProcesses");
        assert!(
            super::error_text(&e).starts_with("ListProcesses: not served there (a node daemon"),
            "{}",
            super::error_text(&e)
        );
    }
}
