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
        bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated::{bpf_get_attach_cookie, bpf_get_func_ip, bpf_send_signal},
    },
    macros::uprobe,
    programs::ProbeContext,
    EbpfContext,
};
use collector_common::{EventKind, ProcEvent};

use crate::{
    decode::read,
    maps::{CONFIG, EVENTS, LAUNCHERS, LINK_CHANGE, PAUSED},
    process::{is_watched, pausable_unnoticed},
};

/// `RT_CONSISTENT` of `enum r_state` (`<link.h>`): the list is complete again, the new
/// objects mapped (not yet relocated or initialised).
const RT_CONSISTENT: i32 = 0;
/// `RT_ADD`: objects are being added (`dlopen`, or those a process starts with).
const RT_ADD: i32 = 1;
/// `RT_DELETE`: objects are being removed (`dlclose`).
const RT_DELETE: i32 = 2;
/// Byte offset of `r_map` in `struct r_debug` (x86-64): the first object of the list.
const R_MAP: u64 = 8;
/// Byte offset of `r_state` in `struct r_debug` (x86-64).
const R_STATE: u64 = 24;
/// Byte offsets of `l_name` and `l_next` in `struct link_map` (its public part, x86-64).
const L_NAME: u64 = 8;
const L_NEXT: u64 = 24;
/// Most objects walked to find the list's last one (Open MPI's ranks map ~150).
const MAX_OBJECTS: u32 = 8192;
/// Longest object path read whole (a longer one is taken for one that may matter).
const NAME_LEN: usize = 256;
/// `SIGSTOP`: the one stop no process can catch or ignore; userspace sends `SIGCONT`.
const SIGSTOP: u32 = 19;
/// `SIGCONT`: takes back a stop still pending.
const SIGCONT: u32 = 18;

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
    // Nor one that added only an Open MPI component (`mca_btl_tcp.so`: each rank loads
    // ~70, one `dlopen` each), which holds nothing commtap probes: the linker appends the
    // object opened, then the dependencies it newly maps, so a list ending in a component
    // gained that component alone (a component pulling in libfabric or UCX ends with them).
    if change == Some(RT_ADD) && ends_in_a_component(at.wrapping_add(to_r_debug)) {
        return 0;
    }
    pause_to_probe(tgid);
    0
}

/// Where a walk down the linker's list of objects is.
#[repr(C)]
struct Walk {
    /// The object reached.
    at: u64,
    /// Whether the walk reached the end.
    ended: bool,
}

/// One step down the list (`bpf_loop`'s body): stops at the last object.
extern "C" fn step(_: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `Walk`.
    let w = unsafe { &mut *ctx.cast::<Walk>() };
    match read::<u64>(w.at.wrapping_add(L_NEXT)) {
        Some(0) => {
            w.ended = true;
            1
        }
        Some(next) => {
            w.at = next;
            0
        }
        None => 1,
    }
}

/// A path being searched for its last `/` (`bpf_loop`'s context).
#[repr(C)]
struct Name {
    bytes: [u8; NAME_LEN],
    /// Its length, without the NUL.
    len: u64,
    /// Where its last `/` is.
    slash: u64,
}

/// One byte of the search (`bpf_loop`'s body).
extern "C" fn find_slash(i: u64, ctx: *mut core::ffi::c_void) -> i64 {
    // SAFETY: `bpf_loop` passes its caller's `Name`.
    let n = unsafe { &mut *ctx.cast::<Name>() };
    if i >= n.len {
        return 1;
    }
    if n.bytes.get(i as usize & (NAME_LEN - 1)) == Some(&b'/') {
        n.slash = i;
    }
    0
}

/// Whether the last object in the list of the `struct r_debug` at `r_debug` is an Open MPI
/// component: a file named `mca_*.so`. Out of line: the walk and the name live on its
/// own stack.
#[inline(never)]
fn ends_in_a_component(r_debug: u64) -> bool {
    let Some(first) = read::<u64>(r_debug.wrapping_add(R_MAP)) else {
        return false;
    };
    let mut walk = Walk {
        at: first,
        ended: false,
    };
    crate::decode::each(MAX_OBJECTS, step, &mut walk);
    let Some(path) = walk
        .ended
        .then(|| read::<u64>(walk.at.wrapping_add(L_NAME)))
        .flatten()
    else {
        return false;
    };
    let mut name = Name {
        bytes: [0; NAME_LEN],
        len: 0,
        slash: 0,
    };
    // SAFETY: the helper copies at most the buffer and stops at a fault.
    let Ok(read_in) =
        (unsafe { bpf_probe_read_user_str_bytes(path as *const u8, &mut name.bytes) })
    else {
        return false;
    };
    name.len = read_in.len() as u64;
    // A path that filled the buffer may go on: not known to be a component.
    if name.len == 0 || name.len >= NAME_LEN as u64 - 1 {
        return false;
    }
    crate::decode::each(NAME_LEN as u32, find_slash, &mut name);
    let byte = |i: u64| {
        name.bytes
            .get(i as usize & (NAME_LEN - 1))
            .copied()
            .unwrap_or(0)
    };
    let base = name.slash + 1;
    let end = name.len;
    end >= base + 7
        && [byte(base), byte(base + 1), byte(base + 2), byte(base + 3)] == *b"mca_"
        && [byte(end - 3), byte(end - 2), byte(end - 1)] == *b".so"
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
    if pause {
        // Stopped before userspace can hear of it: the reader, on another CPU while this
        // task is preempted here, may continue the process at once, and its SIGCONT must
        // find the stop pending (it discards it). Sent after the event, the stop could come
        // after the SIGCONT and hold the process for good, its entry already gone (seen: a
        // shell an Intel MPI proxy ran stayed stopped, and its job with it).
        // SAFETY: plain helper call; the signal goes to the current process.
        unsafe { bpf_send_signal(SIGSTOP) };
    }
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
    // At once (call events do not wake the reader).
    if EVENTS
        .output::<ProcEvent>(&ev, u64::from(BPF_RB_FORCE_WAKEUP))
        .is_err()
        && pause
    {
        // Nobody will hear of it: the stop, still pending, is taken back (a SIGCONT
        // discards the pending stops).
        let _ = PAUSED.remove(tgid);
        // SAFETY: plain helper call; the signal goes to the current process.
        unsafe { bpf_send_signal(SIGCONT) };
    }
}
