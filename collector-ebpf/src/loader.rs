//! The dynamic linker's hook for debuggers, `_dl_debug_state`, which glibc's `ld.so` calls
//! whenever its list of loaded objects changes: a watched process that has just mapped new
//! libraries (`dlopen`, or those it starts with) is paused before it can run them, until
//! userspace has probed them and continues it. A library loaded late (Python's mpi4py, a
//! framework's NCCL from a wheel) is then counted from its first call. `MPI_Pcontrol`, the
//! profiling region's start and pause, pauses a process the same way while userspace reads
//! its counters at that very point.

use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_ktime_get_ns,
        bpf_probe_read_user,
        generated::{bpf_get_attach_cookie, bpf_get_func_ip, bpf_send_signal},
    },
    macros::uprobe,
    programs::ProbeContext,
    EbpfContext,
};
use collector_common::{EventKind, ProcEvent};

use crate::{
    maps::{CONFIG, EVENTS, LAUNCHERS, LINK_CHANGE, PAUSED},
    process::{is_watched, pausable_unnoticed},
};

/// `RT_CONSISTENT` of `enum r_state` (`<link.h>`): the list is complete again, the new
/// objects mapped (not yet relocated or initialised).
const RT_CONSISTENT: i32 = 0;
/// `RT_DELETE`: objects are being removed (`dlclose`).
const RT_DELETE: i32 = 2;
/// Byte offset of `r_state` in `struct r_debug` (x86-64).
const R_STATE: u64 = 24;
/// `SIGSTOP`: the one stop no process can catch or ignore; userspace sends `SIGCONT`.
const SIGSTOP: u32 = 19;

/// Entry of `_dl_debug_state`; the cookie is the distance from it to `_r_debug`.
#[uprobe]
pub fn linker_loaded(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_watched(tgid) {
        return 0;
    }
    // SAFETY: helpers that read this program's own attachment.
    let (at, to_r_debug) = unsafe {
        (
            bpf_get_func_ip(ctx.as_ptr()),
            bpf_get_attach_cookie(ctx.as_ptr()),
        )
    };
    let state = at.wrapping_add(to_r_debug).wrapping_add(R_STATE) as *const i32;
    // An object being added or removed is not mapped yet (or not gone yet): nothing to do
    // before the list is consistent again, but remember which it was.
    // SAFETY: the helper reads user memory and fails cleanly.
    let Ok(state) = (unsafe { bpf_probe_read_user(state) }) else {
        return 0;
    };
    if state != RT_CONSISTENT {
        let _ = LINK_CHANGE.insert(tgid, state, 0);
        return 0;
    }
    // SAFETY: plain value.
    let change = unsafe { LINK_CHANGE.get(tgid) }.copied();
    let _ = LINK_CHANGE.remove(tgid);
    // After a removal (`dlclose`: Open MPI closes the components it did not select, about
    // half of the ~105 changes each rank's start makes) nothing is new: no pause. After an
    // addition, or a change not seen begin (the process's first, or a daemon started
    // mid-change), as always.
    if change == Some(RT_DELETE) {
        return 0;
    }
    pause_to_probe(tgid);
    0
}

/// Tells userspace that the current (watched) process maps new objects and pauses it until
/// they are probed: at a library load, and at an exec, before the new image's dynamic
/// linker runs (a program's own `ld.so`, a container's or a Spack glibc's, is not the one
/// probed at start: userspace probes it then, and its loads pause like any other). Only
/// while userspace is there to continue it (it renews the lease), where nobody notices,
/// and never a launcher.
#[inline(always)]
pub fn pause_to_probe(tgid: u32) {
    if is_launcher() {
        return;
    }
    // SAFETY: reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    match CONFIG.get(0) {
        Some(c) if now <= c.pause_until_ns => {}
        _ => return,
    }
    if !pausable_unnoticed() {
        return;
    }
    tell(tgid, now, EventKind::Loaded, 0, true);
}

/// Whether the current process is a job launcher (`mpirun`, `orted`, `hydra_pmi_proxy` ...,
/// by its name: see `collector_common::launcher`), which is never paused.
#[inline(always)]
fn is_launcher() -> bool {
    bpf_get_current_comm().is_ok_and(|name| {
        // SAFETY: plain value.
        unsafe { LAUNCHERS.get(name) }.is_some()
    })
}

/// Entry of `MPI_Pcontrol(int level)`: userspace is told at once, and the process is paused
/// until it has read the process's counters (where it may be paused unnoticed, while
/// userspace is there: else the event says it was not, and the region's bounds are late).
#[uprobe]
pub fn mpi_pcontrol(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_watched(tgid) {
        return 0;
    }
    let level: i32 = ctx.arg::<i64>(0).unwrap_or(0) as i32;
    // Only 0 (pause) and 1 (start) bound the region, as in mpitrace; other levels are
    // counted by the routine's own probe and change nothing here.
    if level != 0 && level != 1 {
        return 0;
    }
    // SAFETY: reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    let leased = matches!(CONFIG.get(0), Some(c) if now <= c.pause_until_ns);
    let pause = leased && pausable_unnoticed();
    tell(tgid, now, EventKind::Pcontrol, level, pause);
    0
}

/// Sends `kind` (a [`ProcEvent`]; a Pcontrol event's word holds `level` and whether the
/// process was paused) at once and, if `pause`, stops the process until userspace continues
/// it.
#[inline(always)]
fn tell(tgid: u32, now: u64, kind: EventKind, level: i32, pause: bool) {
    // Listed first: whatever becomes of the event, userspace finds it there and continues it
    // (at its exit at the latest, or at the next start of a daemon).
    let pause = pause && PAUSED.insert(tgid, now, 0).is_ok();
    let ev = ProcEvent {
        kind: kind as u32,
        tgid,
        parent: match kind {
            EventKind::Pcontrol => ProcEvent::pcontrol(level, pause),
            _ => 0,
        },
        uid: bpf_get_current_uid_gid() as u32,
        ts_ns: now,
    };
    // Paused only once userspace is sure to hear of it (it continues the process), and at
    // once (call events do not wake the reader).
    if EVENTS
        .output::<ProcEvent>(&ev, u64::from(BPF_RB_FORCE_WAKEUP))
        .is_err()
    {
        if pause {
            let _ = PAUSED.remove(tgid);
        }
        return;
    }
    if pause {
        // SAFETY: plain helper call; the signal goes to the current process.
        unsafe { bpf_send_signal(SIGSTOP) };
    }
}
