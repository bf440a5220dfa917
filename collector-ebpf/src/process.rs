//! The watched processes: which are counted (watched, or all in scope), and following
//! the watched process tree: forks inherit watching, exec and exit are reported.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_current_uid_gid,
        bpf_ktime_get_boot_ns, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::bpf_probe_read_user,
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use collector_common::{
    watch, CallState, Config, EventKind, IdentityEvent, ProcEvent, ProcStats, IDENTITY_ARGS_LEN,
    IDENTITY_ENV_LEN, SIGNAL_GROUP_EXIT,
};

use crate::maps::{
    CONFIG, EVENTS, IDENTITY_OFFSETS, NOT_COUNTED, OUT_OF_SCOPE, SCOPE_GEN, TP_OFFSETS, WATCHED,
    WATCHED_LATEST,
};

/// The current task (valid for the program's run).
#[inline(always)]
pub fn current_task() -> *const u8 {
    // SAFETY: plain helper call.
    unsafe { bpf_get_current_task() as *const u8 }
}

/// The current process's return-probe trampoline (the start of its uprobe page, which the
/// kernel puts in place of the return address of each call whose return it probes), if
/// the kernel's offsets are known and the process has one.
#[inline(always)]
pub fn return_trampoline() -> Option<u64> {
    let off = IDENTITY_OFFSETS.get(0)?;
    if off.valid == 0 || off.xol_valid == 0 {
        return None;
    }
    let mm = kernel_word(current_task(), off.task_mm) as *const u8;
    if mm.is_null() {
        return None;
    }
    let area = kernel_word(mm, off.xol_mm_area) as *const u8;
    if area.is_null() {
        return None;
    }
    Some(kernel_word(area, off.xol_vaddr)).filter(|&t| t != 0)
}

/// The word at byte `at` of kernel object `base` (0 where it cannot be read): every read of
/// kernel memory goes through bpf_probe_read_kernel, which fails cleanly.
#[inline(always)]
pub fn kernel_word(base: *const u8, at: u32) -> u64 {
    #[expect(
        clippy::cast_ptr_alignment,
        reason = "bpf_probe_read_kernel copies bytes: nothing is read through the pointer"
    )]
    let at = base.wrapping_add(at as usize).cast::<u64>();
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(at) }.unwrap_or(0)
}

/// Whether the current process may be paused (`SIGSTOP`) without anyone noticing: a
/// tracer (a debugger, strace) is told of every signal, so a traced thread never is; a
/// job-control shell reports a stopped job and takes the terminal back, and only puts jobs
/// in process groups of their own on a terminal. So: not traced, and no controlling
/// terminal or the process group of its parent (which then did no job control for it).
/// `false` when the kernel's offsets are unknown.
#[inline(always)]
pub fn pausable_unnoticed() -> bool {
    let Some(off) = IDENTITY_OFFSETS.get(0) else {
        return false;
    };
    if off.valid == 0 {
        return false;
    }
    let task = current_task();
    // `ptrace` is an unsigned int: the low half of the word (little-endian).
    if kernel_word(task, off.task_ptrace) as u32 != 0 {
        return false;
    }
    let signal = kernel_word(task, off.task_signal) as *const u8;
    if signal.is_null() {
        return false;
    }
    if kernel_word(signal, off.signal_tty) == 0 {
        return true;
    }
    let parent = kernel_word(task, off.task_real_parent) as *const u8;
    let parent_signal = kernel_word(parent, off.task_signal) as *const u8;
    let (group, parents) = (
        kernel_word(signal, off.signal_pgrp),
        kernel_word(parent_signal, off.signal_pgrp),
    );
    group != 0 && group == parents
}

/// Sends who the current process is ([`IdentityEvent`]): its environment and arguments as
/// its memory holds them now, its uid and start time. Called once per process (its exec,
/// or its first MPI call), so not inlined into the probes' hot path.
#[inline(never)]
fn emit_identity(tgid: u32) {
    let Some(off) = IDENTITY_OFFSETS.get(0) else {
        return;
    };
    if off.valid == 0 {
        return;
    }
    let task = current_task();
    let word = kernel_word;
    let mm = word(task, off.task_mm) as *const u8;
    if mm.is_null() {
        return;
    }
    let (arg_start, arg_end) = (word(mm, off.mm_arg_start), word(mm, off.mm_arg_start + 8));
    let (env_start, env_end) = (word(mm, off.mm_env_start), word(mm, off.mm_env_start + 8));
    let Some(mut entry) = EVENTS.reserve::<IdentityEvent>(0) else {
        return;
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` is the reserved record, written field by field before submit; the user
    // reads copy at most the arrays' sizes (the lengths are clamped first).
    unsafe {
        (*ev).kind = EventKind::Identity as u32;
        (*ev).tgid = tgid;
        (*ev).uid = bpf_get_current_uid_gid() as u32;
        (*ev)._pad = 0;
        (*ev).start_boottime_ns = word(task, off.task_start_boottime);
        let mut n = env_end.saturating_sub(env_start) as u32;
        if n > IDENTITY_ENV_LEN as u32 {
            n = IDENTITY_ENV_LEN as u32;
        }
        let ok = bpf_probe_read_user((*ev).env.as_mut_ptr().cast(), n, env_start as *const _);
        (*ev).env_len = if ok == 0 { n } else { 0 };
        let mut n = arg_end.saturating_sub(arg_start) as u32;
        if n > IDENTITY_ARGS_LEN as u32 {
            n = IDENTITY_ARGS_LEN as u32;
        }
        let ok = bpf_probe_read_user((*ev).args.as_mut_ptr().cast(), n, arg_start as *const _);
        (*ev).args_len = if ok == 0 { n } else { 0 };
    }
    entry.submit(0);
}

/// Reports a process lifecycle event to userspace; a process that becomes known (exec,
/// discovered) is described first.
#[inline(always)]
pub fn emit(kind: EventKind, tgid: u32, parent: u32) {
    if matches!(kind, EventKind::Exec | EventKind::Discovered) {
        emit_identity(tgid);
    }
    let ev = ProcEvent {
        kind: kind as u32,
        tgid,
        parent,
        // The low half is the real uid.
        uid: bpf_get_current_uid_gid() as u32,
        // SAFETY: reads the monotonic clock.
        ts_ns: unsafe { bpf_ktime_get_ns() },
    };
    // A lost process event is recovered by userspace's periodic /proc scan.
    let _ = EVENTS.output::<ProcEvent>(&ev, 0);
}

/// Puts `pid` in the watched set with `flags`, and stamps this CPU's latest entry: a daemon
/// started later knows that a kept entry's pid, if it is a process started after every
/// stamp, was given to another while no daemon ran.
#[inline(always)]
fn put_in_watched(pid: u32, flags: u32) {
    let _ = WATCHED.insert(pid, flags, 0);
    if let Some(latest) = WATCHED_LATEST.get_ptr_mut(watch::LATEST_KERNEL) {
        // SAFETY: this CPU's entry, aligned 8-byte loads and stores; plain helper call.
        unsafe {
            let now = bpf_ktime_get_boot_ns();
            // Only ever raised: a program preempted between its clock and its store must
            // not lower a stamp another made meanwhile.
            if now > core::ptr::read_volatile(latest) {
                core::ptr::write_volatile(latest, now);
            }
        }
    }
}

/// `sched:sched_process_fork`: a child of a process watched with DESCENDANTS is watched
/// before it first runs, so nothing it does is missed.
#[tracepoint]
pub fn sched_fork(ctx: TracePointContext) -> u32 {
    // A new process may have the pid of one found not counted.
    scope_changed();
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
    put_in_watched(child, watch::COUNT | watch::DESCENDANTS);
    emit(EventKind::Fork, child, parent_tgid);
    0
}

/// `sched:sched_process_exec`: a watched process replaced its image (rank processes are
/// usually exec'd by a launcher); userspace rereads its environment and mappings, while
/// the process waits (paused before its first instruction) where it may.
#[tracepoint]
pub fn sched_exec(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // A new image (a setuid one, say) is judged anew at its first call.
    forget_scope(tgid);
    scope_changed();
    forget_exec_thread(&ctx, tgid);
    // SAFETY: plain u32.
    if unsafe { WATCHED.get(tgid) }.is_some() {
        // The new image's handles mean something else; its threads keep their task storage.
        crate::cache::bump();
        emit(EventKind::Exec, tgid, 0);
        crate::loader::pause_to_probe(tgid);
    }
    0
}

/// Where a thread other than its process's first called exec: it goes on with the
/// process's id, and its own is freed without passing `sched_exit`. Watched as a watched
/// process's thread (`sched_fork`), that id is taken out here, or the next process given it
/// would be counted, and paused at its loads, as one of the job's.
#[inline(always)]
fn forget_exec_thread(ctx: &TracePointContext, tgid: u32) {
    let Some(off) = TP_OFFSETS.get(0) else {
        return;
    };
    if off.exec_old_pid == u32::MAX {
        return;
    }
    // SAFETY: offset parsed from this kernel's tracefs format file.
    let Ok(old) = (unsafe { ctx.read_at::<i32>(off.exec_old_pid as usize) }) else {
        return;
    };
    let old = old as u32;
    if old != tgid {
        let _ = WATCHED.remove(old);
    }
}

/// `sched:sched_process_exit`: forget exited threads; report a watched process's end.
#[tracepoint]
pub fn sched_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == tgid {
        // Its pid may come back as another process's.
        forget_scope(tgid);
    }
    // SAFETY: plain u32.
    if unsafe { WATCHED.get(tid) }.is_none() && unsafe { WATCHED.get(tgid) }.is_none() {
        return 0;
    }
    // Looked up again, not kept from above: the compiler would merge the two tests into an
    // OR of the pointers, which the verifier refuses.
    // SAFETY: plain u32.
    let group = unsafe { WATCHED.get(tgid) }.copied();
    let group_dead = group_dead(&ctx, tid == tgid);
    // Counted only: a process detached on request stays in the map, uncounted.
    if group.is_some_and(|f| f & watch::COUNT != 0) {
        account_exit(tgid, group_dead);
    }
    if tid != tgid {
        let _ = WATCHED.remove(tid);
    }
    // Whichever thread ends last (under exit_group, often not the leader).
    if group_dead && group.is_some() {
        // Stop counting at once: the pid may be reused by an unrelated process (nor be
        // continued as the one paused at a load, killed there).
        let _ = WATCHED.remove(tgid);
        let _ = crate::maps::PAUSED.remove(tgid);
        emit(EventKind::Exit, tgid, 0);
    }
    0
}

/// Whether the ending thread is its process's last: the tracepoint's `group_dead` where
/// the kernel has it (Linux 6.16 on), else the process's count of live threads, which
/// each thread takes itself out of before this tracepoint (0: the last), else (offsets
/// unknown) whether it is the leader.
#[inline(always)]
fn group_dead(ctx: &TracePointContext, leader: bool) -> bool {
    if let Some(off) = TP_OFFSETS.get(0) {
        if off.exit_group_dead != u32::MAX {
            // SAFETY: offset from this kernel's format file.
            let dead = unsafe { ctx.read_at::<u8>(off.exit_group_dead as usize) };
            return dead != Ok(0);
        }
    }
    match IDENTITY_OFFSETS.get(0) {
        Some(off) if off.usage_valid != 0 => {
            let signal = kernel_word(current_task(), off.task_signal) as *const u8;
            // `signal_struct.live` is an atomic_t: the word's low half.
            !signal.is_null() && kernel_word(signal, off.usage_signal_live) as u32 == 0
        }
        _ => leader,
    }
}

/// Adds the ending thread's CPU time and context switches to its process's stats, and
/// takes the process's largest resident set (which the kernel sets from its memory just
/// before its last thread's end is traced): every thread ends once, so the sums are the
/// process's own once its last has (`group_dead`), less the threads that ended before it
/// was watched. A thread's times are the kernel's last accounting of them (it runs on a
/// few microseconds to its end).
#[inline(always)]
fn account_exit(tgid: u32, group_dead: bool) {
    let Some(off) = IDENTITY_OFFSETS.get(0) else {
        return;
    };
    if off.usage_valid == 0 {
        return;
    }
    let task = current_task();
    let signal = kernel_word(task, off.task_signal) as *const u8;
    let max_rss = if signal.is_null() {
        0
    } else {
        kernel_word(signal, off.usage_signal_maxrss)
    };
    let (cpu, utime, stime) = (
        kernel_word(task, off.usage_task_sum_exec_runtime),
        kernel_word(task, off.usage_task_utime),
        kernel_word(task, off.usage_task_stime),
    );
    let (nvcsw, nivcsw) = (
        kernel_word(task, off.usage_task_nvcsw),
        kernel_word(task, off.usage_task_nivcsw),
    );
    // `flags`, `exit_code` and `group_exit_code` are ints: each word's low half.
    let group_exit = !signal.is_null()
        && (kernel_word(signal, off.usage_signal_flags) as u32) & SIGNAL_GROUP_EXIT != 0;
    // What `wait` reports: the group's code when the process ends as one (only the thread
    // that dumped core has the core's mark in its own), else the last thread's own.
    let code = if group_exit {
        kernel_word(signal, off.usage_signal_group_exit_code)
    } else {
        kernel_word(task, off.usage_task_exit_code)
    };
    let status = (code & 0xffff_ffff) | ProcStats::EXIT_STATUS_KNOWN;
    // SAFETY: reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    let call = call_at_exit(now);
    // Only a thread ended with its process: one that ends alone inside a call (cancelled,
    // `pthread_exit` from a callback) leaves a process that goes on.
    let inside = match call {
        CallAtExit::Inside(routine, ns) if group_exit || group_dead => Some((routine, ns)),
        _ => None,
    };
    crate::maps::with_proc_stats(tgid, |s| {
        // Added atomically: another thread of the process may end on this CPU while this
        // program is preempted (see `with_proc_stats`).
        // SAFETY: fields of a map value.
        unsafe {
            use crate::counters::{add_atomic, move_extreme};
            add_atomic(&raw mut s.exit_cpu_ns, cpu);
            add_atomic(&raw mut s.exit_utime_ns, utime);
            add_atomic(&raw mut s.exit_stime_ns, stime);
            add_atomic(&raw mut s.exit_nvcsw, nvcsw);
            add_atomic(&raw mut s.exit_nivcsw, nivcsw);
            move_extreme::<false>(&raw mut s.exit_max_rss_pages, max_rss);
            add_atomic(&raw mut s.exit_threads, 1);
            if matches!(call, CallAtExit::Abandoned) {
                add_atomic(&raw mut s.abandoned, 1);
            }
        }
        if group_dead {
            s.exit_group = 1;
            s.exit_status = status;
            s.exit_ns = now;
        }
        if let Some((routine, ns)) = inside {
            if s.exit_in_routine == 0 || ns > s.exit_in_ns {
                s.exit_in_routine = routine;
                s.exit_in_ns = ns;
                s.exit_in_tid = bpf_get_current_pid_tgid() & 0xffff_ffff;
            }
        }
    });
}

/// What the ending thread's state says of the call it was in.
#[derive(Clone, Copy)]
enum CallAtExit {
    /// No timed call (an untimed call, its routine's time sampled, has no start).
    None,
    /// The timed call it is inside (a signal or another thread's `exit` ended it there; or
    /// `MPI_Abort`): its routine plus one and the time in it.
    Inside(u64, u64),
    /// A call left without returning (`longjmp` or an exception out of an error handler)
    /// and no call since that would have given it up: the thread ends outside it.
    Abandoned,
}

/// The call the ending thread was in, told apart from one it left without returning as a
/// nested call's entry tells them apart ([`crate::probe::in_progress`]), at the stack
/// pointer of the thread's last entry into the kernel (its user memory is still mapped:
/// this tracepoint fires before the thread lets go of it).
#[inline(always)]
fn call_at_exit(now: u64) -> CallAtExit {
    let Some(state) = crate::maps::call_state(false) else {
        return CallAtExit::None;
    };
    // SAFETY: the ending thread's own state; it runs no probe any more.
    let e = unsafe { &*state };
    // An unresolved libfabric function (its table unknown) names no routine.
    if e.busy != CallState::BUSY || e.start_ns == 0 || e.routine & crate::fabric::UNRESOLVED != 0 {
        return CallAtExit::None;
    }
    if !crate::probe::in_progress(e, user_stack_pointer()) {
        return CallAtExit::Abandoned;
    }
    CallAtExit::Inside(u64::from(e.routine) + 1, now.saturating_sub(e.start_ns))
}

/// The current thread's user stack pointer as its last entry into the kernel saved it (0
/// where the kernel gives no registers: then only the call's return address is read).
#[inline(always)]
fn user_stack_pointer() -> u64 {
    use aya_ebpf::helpers::generated::{bpf_get_current_task_btf, bpf_task_pt_regs};
    // SAFETY: the current task's BTF pointer, and its saved registers' (or null).
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf().cast()) as *const u64;
        if regs.is_null() {
            0
        } else {
            *regs.add(collector_common::pt_regs::SP)
        }
    }
}

/// Drops the out-of-scope mark of `tgid`, where there can be one (a daemon limited to a
/// cgroup): every exit and exec of the node passes here.
#[inline(always)]
fn forget_scope(tgid: u32) {
    if CONFIG.get(0).is_some_and(|c| c.cgroup_id != 0) {
        let _ = OUT_OF_SCOPE.remove(tgid);
    }
}

/// Whether calls of `tgid` are counted: it is watched, or every process is (but commtap).
/// In watch-all mode a process seen for the first time joins the watched set (so that its
/// exit is reported) and userspace is told, while the process is still young enough for
/// its environment (rank, job) to be read. A process not counted is remembered as such on
/// this CPU until the scope changes ([`NOT_COUNTED`]). Not inlined: asked at a thread's
/// first call, after a detach, and by threads of processes not counted.
#[inline(never)]
pub fn is_counted(tgid: u32) -> bool {
    // Read before judging: a change of scope during the judgement leaves the verdict stale.
    let stamp = scope_stamp();
    if known_uncounted(tgid, stamp) {
        return false;
    }
    // A process in the map is counted per its flags: one detached on request stays there
    // without COUNT, so that watch-all mode does not take it up again.
    // SAFETY: plain u32 value.
    let counted = if let Some(f) = unsafe { WATCHED.get(tgid) } {
        f & collector_common::watch::COUNT != 0
    } else {
        match CONFIG.get(0) {
            Some(c) if c.watch_all != 0 && c.self_tgid != tgid => join_if_in_scope(tgid),
            _ => false,
        }
    };
    if let Some(slot) = NOT_COUNTED.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, one aligned 8-byte load and store.
        unsafe {
            if !counted {
                core::ptr::write_volatile(slot, not_counted(tgid, stamp));
            } else if core::ptr::read_volatile(slot) as u32 == tgid {
                // Its old verdict goes: it would match again 2^32 moves on.
                core::ptr::write_volatile(slot, 0);
            }
        }
    }
    counted
}

/// [`NOT_COUNTED`]'s value for `tgid` judged not counted at `stamp`: the stamp's low 32
/// bits above the process id (a verdict outlives 2^32 changes of scope only if its CPU
/// judges nobody else meanwhile, and then only for its own process).
#[inline(always)]
fn not_counted(tgid: u32, stamp: u64) -> u64 {
    (stamp << 32) | u64::from(tgid)
}

/// The scope generation now, as [`NOT_COUNTED`] stamps it.
#[inline(always)]
pub fn scope_stamp() -> u64 {
    // Both entries only go up, so a move between the two reads at worst makes the stamp
    // older than now (and a verdict taken with it is judged again); never newer than the
    // judgement that follows.
    crate::maps::generation(&SCOPE_GEN).wrapping_add(crate::maps::count(&SCOPE_GEN, 1))
}

/// Whether `tgid` was the process last found not counted on this CPU, in scope generation
/// `stamp`: nothing that could count it happened since.
#[inline(always)]
pub fn known_uncounted(tgid: u32, stamp: u64) -> bool {
    // SAFETY: this CPU's slot, one aligned 8-byte load.
    NOT_COUNTED
        .get_ptr(0)
        .is_some_and(|s| unsafe { core::ptr::read_volatile(s) } == not_counted(tgid, stamp))
}

/// Moves the scope generation: every verdict of [`NOT_COUNTED`] is judged again.
#[inline(always)]
fn scope_changed() {
    crate::maps::advance(&SCOPE_GEN);
}

/// Watch-all mode, a process not in the watched set: within the daemon's limits, it joins
/// the set (and userspace is told); outside a cgroup limit, it is marked so, and not judged
/// again at its next calls. Not inlined: once per process.
#[inline(never)]
fn join_if_in_scope(tgid: u32) -> bool {
    let Some(c) = CONFIG.get(0) else {
        return false;
    };
    let cgroup_limited = c.cgroup_id != 0;
    // SAFETY: plain u8 value.
    if cgroup_limited && unsafe { OUT_OF_SCOPE.get(tgid) }.is_some() {
        return false;
    }
    if !in_scope(c) {
        if cgroup_limited {
            let _ = OUT_OF_SCOPE.insert(tgid, 1, 0);
        }
        return false;
    }
    put_in_watched(tgid, watch::COUNT);
    emit(collector_common::EventKind::Discovered, tgid, 0);
    true
}

/// Whether the current process is within the daemon's user and cgroup limits.
#[inline(always)]
fn in_scope(c: &Config) -> bool {
    use aya_ebpf::helpers::generated as h;
    if c.uid != Config::ANY_UID && aya_ebpf::helpers::bpf_get_current_uid_gid() as u32 != c.uid {
        return false;
    }
    if c.cgroup_id == 0 {
        return true;
    }
    if c.cgroup_v1_subsys != 0 {
        return in_cgroup_v1(c.cgroup_v1_subsys - 1, c.cgroup_id);
    }
    // The ancestor at the filter's level is the filter's cgroup for it and everything below
    // it (a Slurm job's step cgroups, say).
    // SAFETY: plain helper call.
    unsafe { h::bpf_get_current_ancestor_cgroup_id(c.cgroup_level as i32) == c.cgroup_id }
}

/// Deepest cgroup v1 path searched for the filter's directory: Slurm's
/// `/slurm/uid_U/job_J/step_S/task_T` is 5 deep.
const MAX_CGROUP_V1_DEPTH: u32 = 16;

/// Whether the current process's cgroup in the v1 hierarchy of controller `subsys` is
/// directory `id` or below it: no helper reads a v1 cgroup, so the kernel's structures are
/// walked (task -> css_set -> the controller's state -> cgroup -> its directory and those
/// above). Called once per process, so not inlined into the probes.
#[inline(never)]
fn in_cgroup_v1(subsys: u32, id: u64) -> bool {
    let Some(off) = IDENTITY_OFFSETS.get(0) else {
        return false;
    };
    if off.cgroup_valid == 0 {
        return false;
    }
    let css_set = kernel_word(current_task(), off.cgroup_task_cgroups) as *const u8;
    if css_set.is_null() {
        return false;
    }
    let css = kernel_word(css_set, off.cgroup_css_set_subsys + 8 * subsys) as *const u8;
    if css.is_null() {
        return false;
    }
    let cgroup = kernel_word(css, off.cgroup_css_cgroup) as *const u8;
    if cgroup.is_null() {
        return false;
    }
    let mut dir = kernel_word(cgroup, off.cgroup_kn) as *const u8;
    for _ in 0..MAX_CGROUP_V1_DEPTH {
        if dir.is_null() {
            return false;
        }
        if kernel_word(dir, off.cgroup_kernfs_id) == id {
            return true;
        }
        dir = kernel_word(dir, off.cgroup_kernfs_parent) as *const u8;
    }
    false
}

/// Whether `tgid` is in the watched set.
#[inline(always)]
pub fn is_watched(tgid: u32) -> bool {
    // SAFETY: plain u32 value.
    matches!(unsafe { WATCHED.get(tgid) }, Some(f) if f & collector_common::watch::COUNT != 0)
}

/// Whether the process of a thread with call state is still counted: looked up again only
/// after the handle generation moved (a detach bumps it), so a loop of calls pays nothing.
#[inline(always)]
pub fn still_counted(e: &mut CallState) -> bool {
    let now = crate::cache::stamp();
    if e.counted_gen == now {
        return true;
    }
    if !is_counted(e.tgid) {
        return false;
    }
    e.counted_gen = now;
    true
}
