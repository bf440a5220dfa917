//! What the system must give before anything is loaded: the capabilities, locked memory,
//! and the tracepoints' field offsets (from tracefs, mounted if needed).

use std::path::PathBuf;

use collector_common::TpOffsets;
use tracing::debug;

use super::AttachError;

/// Capabilities commtap needs, by bit number in `CapEff`: each entry is met by any one of
/// its alternatives. Without CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH other users' processes
/// would go unseen, without a word; opening a mapped library through `/proc/PID/map_files`
/// takes CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN, which also covers it).
const NEEDED_CAPS: &[&[(u32, &str)]] = &[
    &[(38, "CAP_PERFMON")],
    &[(39, "CAP_BPF")],
    &[(19, "CAP_SYS_PTRACE")],
    &[(2, "CAP_DAC_READ_SEARCH")],
    &[(40, "CAP_CHECKPOINT_RESTORE"), (21, "CAP_SYS_ADMIN")],
];

/// Fails early, with a message that says what to do, when BPF cannot be used.
pub fn check_privileges() -> Result<(), AttachError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let names = |alternatives: &[(u32, &str)]| {
        alternatives
            .iter()
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(" or ")
    };
    let missing: Vec<String> = NEEDED_CAPS
        .iter()
        .filter(|alternatives| alternatives.iter().all(|(bit, _)| eff & (1 << bit) == 0))
        .map(|alternatives| names(alternatives))
        .collect();
    if !missing.is_empty() {
        return Err(AttachError::Privileges(format!(
            "commtap needs root (or {}) to load BPF programs, attach uprobes and open the libraries processes map; missing: {}. Run it with sudo, or as the commtap systemd service.",
            NEEDED_CAPS.iter().map(|a| names(a)).collect::<Vec<_>>().join(" + "),
            missing.join(", ")
        )));
    }
    Ok(())
}

/// Ring buffers and maps are charged to the locked-memory limit on older kernels.
pub fn bump_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const rlim) } != 0 {
        debug!("could not raise RLIMIT_MEMLOCK");
    }
}

const TRACEFS: &str = "/sys/kernel/tracing";

/// The tracefs directory of tracepoint `category:event` (its `id` and `format`).
pub fn tracepoint_dir(category: &str, event: &str) -> PathBuf {
    PathBuf::from(TRACEFS)
        .join("events")
        .join(category)
        .join(event)
}

/// Reads this kernel's tracepoint field offsets, mounting tracefs if needed.
pub fn tracepoint_offsets() -> Result<TpOffsets, AttachError> {
    let events = PathBuf::from(TRACEFS).join("events");
    if !events.exists() {
        let src = c"nodev";
        let target = c"/sys/kernel/tracing";
        let fstype = c"tracefs";
        // SAFETY: valid C strings; mounting tracefs at its standard place.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(AttachError::Tracefs(format!(
                "not mounted and mount failed: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    let field = |event: &str, name: &str| -> Result<Option<u32>, AttachError> {
        let path = tracepoint_dir("sched", event).join("format");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| AttachError::Tracefs(format!("{}: {e}", path.display())))?;
        Ok(text.lines().find_map(|l| {
            let decl = l.split("field:").nth(1)?.split(';').next()?;
            if decl.split_whitespace().last()? != name {
                return None;
            }
            l.split("offset:")
                .nth(1)?
                .split(';')
                .next()?
                .trim()
                .parse()
                .ok()
        }))
    };
    let need = |event: &str, name: &str| {
        field(event, name)?
            .ok_or_else(|| AttachError::Tracefs(format!("{event} has no field {name}")))
    };
    Ok(TpOffsets {
        fork_parent_pid: need("sched_process_fork", "parent_pid")?,
        fork_child_pid: need("sched_process_fork", "child_pid")?,
        exit_group_dead: field("sched_process_exit", "group_dead")?.unwrap_or(u32::MAX),
        exec_old_pid: field("sched_process_exec", "old_pid")?.unwrap_or(u32::MAX),
    })
}
