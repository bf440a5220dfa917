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

/// The number of the stop signal `name` (as [`StopSignals::recv`] names it).
fn number(name: &str) -> libc::c_int {
    match name {
        "SIGINT" => libc::SIGINT,
        "SIGHUP" => libc::SIGHUP,
        _ => libc::SIGTERM,
    }
}

/// How a process ended by the stop signal `name` ends (128 + its number as an exit status).
pub fn ended_by(name: &str) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt as _;
    std::process::ExitStatus::from_raw(number(name))
}

/// Whether the stop signal `name` is one a terminal sends its foreground process group
/// (Ctrl-C, a hang-up) and commtap is in that group: the job it launched, in the same
/// group, got it too.
pub fn reached_the_foreground(name: &str) -> bool {
    if !matches!(name, "SIGINT" | "SIGHUP") {
        return false;
    }
    [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO]
        .into_iter()
        // SAFETY: isatty(3) of a standard descriptor, reading only.
        .find(|&fd| unsafe { libc::isatty(fd) } == 1)
        // SAFETY: tcgetpgrp(3) of a terminal descriptor and getpgrp(2), reading only.
        .is_some_and(|fd| unsafe { libc::tcgetpgrp(fd) == libc::getpgrp() })
}

/// Sends the stop signal `name` to `pid`: a launched job that did not get it from the
/// terminal.
pub fn pass_on(name: &str, pid: u32) {
    let sig = number(name);
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
