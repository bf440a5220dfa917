//! Following the watched process tree: forks inherit watching, exec and exit are reported.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use collector_common::{watch, EventKind, ProcEvent};

use crate::maps::{EVENTS, TP_OFFSETS, WATCHED};

/// Reports a process lifecycle event to userspace.
#[inline(always)]
pub fn emit(kind: EventKind, tgid: u32, parent: u32) {
    let ev = ProcEvent {
        kind: kind as u32,
        tgid,
        parent,
        // The low half is the real uid.
        uid: bpf_get_current_uid_gid() as u32,
        ts_ns: unsafe { bpf_ktime_get_ns() },
    };
    // A lost process event is recovered by userspace's periodic /proc scan.
    let _ = EVENTS.output::<ProcEvent>(&ev, 0);
}

/// `sched:sched_process_fork`: a child of a process watched with DESCENDANTS is watched
/// before it first runs, so nothing it does is missed.
#[tracepoint]
pub fn sched_fork(ctx: TracePointContext) -> u32 {
    let Some(off) = TP_OFFSETS.get(0) else {
        return 0;
    };
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: plain u32.
    let Some(flags) = (unsafe { WATCHED.get(parent_tgid) }).copied() else {
        return 0;
    };
    if flags & watch::DESCENDANTS == 0 {
        return 0;
    }
    // SAFETY: offset parsed from this kernel's tracefs format file.
    let Ok(child) = (unsafe { ctx.read_at::<i32>(off.fork_child_pid as usize) }) else {
        return 0;
    };
    let child = child as u32;
    if child == parent_tgid {
        return 0;
    }
    // Thread creation also passes here; a thread id in WATCHED is harmless and is removed
    // when the thread exits (sched_exit).
    let _ = WATCHED.insert(child, watch::COUNT | watch::DESCENDANTS, 0);
    emit(EventKind::Fork, child, parent_tgid);
    0
}

/// `sched:sched_process_exec`: a watched process replaced its image (rank processes are
/// usually exec'd by a launcher); userspace rereads its environment and mappings.
#[tracepoint]
pub fn sched_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: plain u32.
    if unsafe { WATCHED.get(tgid) }.is_some() {
        // The new image's handles mean something else; its threads keep their task storage.
        crate::cache::bump();
        emit(EventKind::Exec, tgid, 0);
    }
    0
}

/// `sched:sched_process_exit`: forget exited threads; report a watched process's end.
#[tracepoint]
pub fn sched_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    // SAFETY: plain u32.
    if unsafe { WATCHED.get(tid) }.is_none() && unsafe { WATCHED.get(tgid) }.is_none() {
        return 0;
    }
    if tid != tgid {
        let _ = WATCHED.remove(tid);
        return 0;
    }
    let group_dead = match TP_OFFSETS.get(0) {
        // SAFETY: offset from this kernel's format file.
        Some(off) if off.exit_group_dead != u32::MAX => {
            unsafe { ctx.read_at::<u8>(off.exit_group_dead as usize) }
                .map(|v| v != 0)
                .unwrap_or(true)
        }
        _ => true,
    };
    if group_dead {
        // Stop counting at once: the pid may be reused by an unrelated process.
        let _ = WATCHED.remove(tgid);
        emit(EventKind::Exit, tgid, 0);
    }
    0
}
