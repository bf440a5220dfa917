//! How commtap's long-running commands stop: SIGINT (Ctrl-C), SIGTERM (systemd, and Slurm's
//! `scancel` or time limit) and SIGHUP (a closed terminal) all mean "finish cleanly";
//! a second one while finishing means "now".

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tracing::{info, warn};

/// The signals that ask a command to stop.
pub struct StopSignals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl StopSignals {
    /// Starts listening for them (before any is delivered, so none is lost).
    pub fn listen() -> Result<StopSignals> {
        let on = |kind: SignalKind| signal(kind).context("installing a signal handler");
        Ok(StopSignals {
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
            hup: on(SignalKind::hangup())?,
        })
    }

    /// Waits for the first of them; its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }

    /// From now on, another of them ends the process at once (exit status 130), whatever
    /// is being written: for an operator whose clean stop takes too long.
    pub fn exit_on_next(mut self) {
        tokio::spawn(async move {
            let name = self.recv().await;
            warn!("{name} again: exiting now");
            std::process::exit(130);
        });
    }
}

/// Logs why a command is stopping.
pub fn stopping(name: &str, what: &str) {
    info!("{name}: {what}");
}

/// Sends the stop signal `name` (as [`StopSignals::recv`] names it) to `pid`: a launched job
/// that did not get it from the terminal.
pub fn pass_on(name: &str, pid: u32) {
    let sig = match name {
        "SIGINT" => libc::SIGINT,
        "SIGHUP" => libc::SIGHUP,
        _ => libc::SIGTERM,
    };
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) of the process commtap launched (its child: not reaped while it runs).
    if unsafe { libc::kill(pid, sig) } != 0 {
        warn!(
            "passing {name} on to PID {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
}
