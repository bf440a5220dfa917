//! The generic path of every MPI and NCCL routine: one entry probe for all, and one
//! return program per ABI and argument shape.
//!
//! Entry saves the arguments and a timestamp per thread; return applies the routine's
//! byte rule (`mpi` or `nccl`, from `ROUTINE_SPECS`), updates the ground-truth counters
//! and emits a `CallEvent`. A call made while another is in progress on the same thread
//! (MPI-IO, `MPI_Sendrecv_replace` in some builds, `ncclBcast` → `ncclBroadcast`) is
//! counted once, at the outermost call. libfabric's data path has programs of its own
//! (`fabric`).

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, generated::bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use collector_common::{
    routines::{class, NO_ARG as N},
    shares::SharedMap,
    Abi, ArgSpec, ByteRule, CallEvent, CallState, CommInfo, Config, Cookie, CounterKey, EventKind,
    HandleKey, Layout, MAX_ARGS, UNKNOWN_BUCKET,
};

use crate::{
    call::{comm_fact_known, describe_call, emit_call, raw_cookie, Call},
    decode::{comm_info, handle, status_ignored_in_any_abi, UNDECODED},
    maps::{
        add_proc_stat, call_state, new_call_state, not_drawn, time_one_in, with_proc_stats, COMMS,
        CONFIG, LAYOUTS, ROUTINE_SPECS,
    },
    process::{is_counted, is_watched, known_uncounted, scope_stamp, still_counted},
};

/// Entry of any probed routine (MPI or NCCL); arguments per `ROUTINE_SPECS[cookie.routine]`.
/// Its return probe runs whatever the entry decides: every call is timed.
#[uprobe]
pub fn call_entry(ctx: ProbeContext) -> u32 {
    enter(&ctx, NO_SAMPLING, thread_state());
    0
}

/// The thread's call state, or null if it has none yet: looked up once per call where the
/// entry and a return at the entry (an untimed call) both need it (three task-storage
/// lookups, with their task and lock, were a quarter of an untimed call's program time).
#[inline(always)]
fn thread_state() -> *mut CallState {
    call_state(false).unwrap_or(core::ptr::null_mut())
}

/// What `returned` said: the call created a persistent request, which is to be learnt in
/// the caller's frame (`persistent::after_return`).
const PENDING: u32 = 1;

/// What `returned` said: the call posted a nonblocking receive, whose request is to be
/// followed to its wait in the caller's frame (`posted::after_return`).
const POSTED: u32 = 2;

/// What `returned` said: the completion call may have completed followed receives, which
/// its outputs tell in the caller's frame (`posted::after_completion`).
const MAYBE: u32 = 3;

/// How an entry may sample: never (every call timed).
const NO_SAMPLING: u32 = 0;
/// How an entry may sample: any routine whose time may be sampled.
const SAMPLING: u32 = 1;
/// How an entry may sample: as `SAMPLING`, but MPI_Comm_size and MPI_Comm_rank, whose
/// returns teach an MPICH-ABI library's communicator sizes and ranks, only once taught.
const SAMPLING_BUT_LEARNING: u32 = 2;

/// What an entry decided: nothing to do at the return (a process not counted).
const SKIP: u32 = 0;
/// What an entry decided: the return must be seen (a counted call, timed, or a call nested
/// in one, whose return unwinds the nesting).
const TIMED: u32 = 1;
/// What an entry decided: count the call now, untimed, and skip its return (its routine's
/// time is sampled and this call was not drawn).
const UNTIMED: u32 = 2;

/// The entry of a call: its arguments and start saved in the thread's state (`state`, the
/// thread's, or null: none yet), and what its return must do (`SKIP`, `TIMED`, or, as
/// `sampling` allows, `UNTIMED`: then `busy` is `CallState::BUSY_UNTIMED`). Not inlined:
/// its stack frame is then not under the return path's, which a session's entry of an
/// untimed call runs (BPF's 512 bytes of stack are a whole chain's: a uprobe program,
/// which may be preempted, has no private stack).
#[inline(never)]
fn enter(ctx: &ProbeContext, sampling: u32, state: *mut CallState) -> u32 {
    // A thread has call state only if its process was counted when it first called MPI,
    // and loses it when it exits; so the watched set is consulted once per thread (and
    // again after a detach), and the process id is asked of the kernel only then.
    let existing = (!state.is_null()).then_some(state);
    let tgid = if let Some(e) = existing {
        // SAFETY: the thread's own entry; only this thread touches it.
        let e = unsafe { &mut *e };
        if e.busy != 0 {
            // SAFETY: regs points at this probe's saved registers.
            if in_progress(e, unsafe { (*ctx.regs).rsp }) {
                e.depth += 1;
                add_proc_stat(e.tgid, 1, |s| &mut s.nested);
                return TIMED;
            }
            // Left without returning: given up, and this call is the thread's own.
            add_proc_stat(e.tgid, 1, |s| &mut s.abandoned);
            give_up(e);
        }
        if !still_counted(e) {
            return SKIP;
        }
        e.tgid
    } else {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // A process not watched (another job's) stops here, before anything else is read.
        if known_uncounted(tgid, scope_stamp()) {
            return SKIP;
        }
        tgid
    };
    let packed = raw_cookie(ctx);
    let c = Cookie::unpack(packed);
    let Some(spec) = ROUTINE_SPECS.get(u32::from(c.routine)) else {
        return SKIP;
    };
    if existing.is_none() {
        // A wait for the GPU alone does not make a process one to profile (every CUDA
        // program makes them); it counts in processes already watched.
        let counted = if spec.class == class::SYNC {
            is_watched(tgid)
        } else {
            is_counted(tgid)
        };
        if !counted {
            return SKIP;
        }
    }
    let Some(e) = existing.or_else(|| new_call_state(tgid)) else {
        // No storage could be created (memory, or the storage lock busy): not counted.
        add_proc_stat(tgid, 1, |s| &mut s.counter_map_full);
        return SKIP;
    };
    // SAFETY: the thread's own, idle state. Only the call's fields are written: an open
    // NCCL group and device-time window outlive the call. Argument slots the routine's
    // spec does not name keep older values; nothing reads them.
    let e = unsafe { &mut *e };
    // SAFETY: regs points at this probe's saved registers.
    let regs = unsafe { &*ctx.regs };
    e.args[0] = regs.rdi;
    e.args[1] = regs.rsi;
    e.args[2] = regs.rdx;
    e.args[3] = regs.rcx;
    e.args[4] = regs.r8;
    e.args[5] = regs.r9;
    if uses_stack_args(spec) {
        // Arguments 7.. are on the stack above the return address (probes sit before any
        // push). SAFETY: reading the traced thread's stack into the thread's state; the
        // helper zeroes the destination when the read fails.
        unsafe {
            bpf_probe_read_user(
                e.args[6..MAX_ARGS].as_mut_ptr().cast(),
                ((MAX_ARGS - 6) * 8) as u32,
                (regs.rsp + 8) as *const core::ffi::c_void,
            )
        };
    }
    let rule = ByteRule::from_u8(spec.rule);
    if rule.frees_handle() {
        // The call resets the handle to MPI_*_NULL: read it now (an MPI-5 ABI handle is
        // read as MPICH's now, while its object is alive).
        let i = (spec.a & 15) as usize;
        let h = crate::call::read_handle(c.abi, e.args[i]).unwrap_or(0);
        e.args[i] = h;
        // Forgotten before the call: once it frees the handle, another thread may be given
        // the same one for a request, communicator or datatype of its own, learnt at its
        // return, which a forget at this call's return would then remove.
        let key = HandleKey {
            tgid,
            _pad: 0,
            handle: h,
        };
        if rule == ByteRule::RequestFree {
            crate::shares::forget(SharedMap::Persistent, &key);
            if call_events() & Config::EVENTS_ALL != 0 {
                crate::posted::freed(&key, c.routine);
            }
        } else {
            // Before the handle goes: no thread may keep it cached across the free.
            crate::cache::bump();
            if rule == ByteRule::CommFree {
                crate::shares::forget(SharedMap::Comms, &key);
                crate::instances::freed(tgid, h);
                crate::generations::freed(tgid, h);
            } else if Abi::integer_handles(c.abi) {
                // Only integer-handle ABIs keep datatypes' sizes (Open MPI's are in its
                // objects).
                crate::shares::forget(SharedMap::Dtypes, &key);
            }
        }
    }
    e.depth = 0;
    e.entry_sp = regs.rsp;
    e.routine = c.routine;
    e.cookie = packed;
    // Numbered at its entry, drawn or not: every member must count every instance.
    e.instance =
        if spec.class == class::COLLECTIVE && c.abi != Abi::Nccl as u8 && call_events() != 0 {
            let h = crate::call::arg(&e.args, spec.comm).map_or(0, |h| handle(c.abi, h));
            crate::instances::number(c.abi, c.layout, tgid, h)
        } else {
            0
        };
    if sampling != NO_SAMPLING && left_untimed(spec, &c, sampling, e) {
        // No clock read: an untimed call has no duration (nor does the return path, which
        // counts it, read one: `untimed`).
        e.start_ns = 0;
        e.busy = CallState::BUSY_UNTIMED;
        // Its return is not seen: the transport calls made inside it are taken as its.
        e.untimed_parent = c.routine.wrapping_add(1);
        // A tick count, which the clock's read would cost many times over: enough to tell
        // a call in progress for a second or more (a hung job's) from the last of a loop.
        // SAFETY: reads a kernel counter.
        e.untimed_since_jiffies = unsafe { aya_ebpf::helpers::generated::bpf_jiffies64() };
        UNTIMED
    } else {
        // SAFETY: reads the monotonic clock.
        e.start_ns = unsafe { bpf_ktime_get_ns() };
        e.busy = CallState::BUSY;
        e.untimed_parent = 0;
        if spec.class == class::COMPLETION
            && c.abi != Abi::Nccl as u8
            && call_events() & Config::EVENTS_ALL != 0
        {
            crate::posted::completing(u32::from(c.abi), *spec, e);
        }
        TIMED
    }
}

/// Whether the thread's call in progress still is, as a call enters at stack pointer `rsp`
/// (nested in it, then): entered below that call's return address, which still holds the
/// kernel's return-probe trampoline. Otherwise that call was left without returning (a
/// `longjmp` or a C++ exception out of an error handler, a signal handler's `siglongjmp`):
/// the kernel drops its return, and its state would have every later call of the thread
/// taken as nested in it, uncounted. The stack and the kernel are read only when a call
/// enters inside another (rare: Open MPI's `MPI_Sendrecv_replace` calling `PMPI_Sendrecv`,
/// `ncclBcast` calling `ncclBroadcast`). Where the kernel's offsets are unknown, only a call
/// entered above the return address is known to be another.
#[inline(always)]
pub(crate) fn in_progress(e: &CallState, rsp: u64) -> bool {
    if rsp >= e.entry_sp {
        return e.entry_sp == 0;
    }
    let Some(trampoline) = crate::process::return_trampoline() else {
        return true;
    };
    // SAFETY: reads a word of the traced thread's stack.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(e.entry_sp as *const u64) }
        .map_or(true, |w| w == trampoline)
}

/// Forgets the thread's call in progress, left without returning, and what was made inside
/// it (its transport calls, its receives to follow, its persistent request).
#[inline(always)]
fn give_up(e: &mut CallState) {
    e.busy = 0;
    e.depth = 0;
    e.fab_busy = 0;
    e.fab_depth = 0;
    e.fab_internal = 0;
    e.maybe_n = 0;
    e.persistent_pending = 0;
}

/// Whether this call goes untimed: its routine's time is sampled one call in N and this
/// call was not drawn. Never for a call an event is wanted for (the event carries its
/// time), nor in a process whose MPI calls were seen making libfabric calls (those are
/// attributed to the MPI call in progress, and a call counted at its entry has no return
/// to end it).
#[inline(always)]
fn left_untimed(spec: &ArgSpec, c: &Cookie, sampling: u32, e: &mut CallState) -> bool {
    let (tgid, args) = (e.tgid, &e.args);
    // Cheapest first: most calls stop at the routine's N (one array lookup).
    let n = time_one_in(c.routine, tgid);
    if n <= 1 {
        return false;
    }
    if wants_event(spec, e.instance) {
        // A drawn instance: its return brings its event the time. Its counter takes that
        // time as the routine's own draw says, so that the profile's times stay a sample
        // of one call in N at random.
        if e.instance != 0 && spec.time_can_be_sampled() && not_drawn(n, &mut e.draws) {
            e.instance |= CallState::INSTANCE_UNTIMED;
        }
        return false;
    }
    let status = || args.get((spec.c & 15) as usize).copied().unwrap_or(0);
    let this_call = spec.time_can_be_sampled()
        || (spec.sampled_when_status_ignored() && status_ignored_in_any_abi(status()));
    if !this_call {
        return false;
    }
    if sampling == SAMPLING_BUT_LEARNING {
        let rule = ByteRule::from_u8(spec.rule);
        if matches!(rule, ByteRule::CommSize | ByteRule::CommRank) {
            // Timed until its return has taught the fact (`learn_comm`), then as any other.
            let h = handle(
                c.abi,
                args.get((spec.a & 15) as usize).copied().unwrap_or(0),
            );
            // The communicator the thread's last call named, if it is this one; else the
            // map. (An untimed call's return path runs at its entry, and would learn from
            // an output not written yet: only a fact known is left untimed.)
            let known = crate::call::cached_comm_fact(core::ptr::addr_of_mut!(e.cache), h, rule)
                .unwrap_or_else(|| {
                    let key = HandleKey {
                        tgid,
                        _pad: 0,
                        handle: h,
                    };
                    // SAFETY: plain value.
                    unsafe { COMMS.get(key) }.is_some_and(|i| comm_fact_known(i, rule))
                });
            if !known {
                return false;
            }
        }
    }
    not_drawn(n, &mut e.draws)
}

/// Whether any operand of `spec` is a stack argument (7th or later).
#[inline(always)]
fn uses_stack_args(spec: &ArgSpec) -> bool {
    let on_stack = |i: u8| i != N && i >= 6;
    on_stack(spec.a)
        || on_stack(spec.b)
        || on_stack(spec.c)
        || on_stack(spec.d)
        || on_stack(spec.comm)
        || on_stack(spec.peer)
}

/// Return of any MPI routine of an Open MPI library (same attach points as `mpi_entry`).
#[uretprobe]
pub fn mpi_return_ompi(ctx: RetProbeContext) -> u32 {
    returned_alone::<{ Abi::OpenMpi as u8 }, false>(&ctx)
}

/// Return of any MPI routine of an MPICH-ABI library but its datatype constructors.
#[uretprobe]
pub fn mpi_return_mpich(ctx: RetProbeContext) -> u32 {
    returned_alone::<{ Abi::Mpich as u8 }, false>(&ctx)
}

/// Return of the datatype constructors and MPI_Type_free of an MPICH-ABI library, whose
/// integer handles carry no size for derived types: the sizes are learnt here.
#[uretprobe]
pub fn mpi_return_mpich_types(ctx: RetProbeContext) -> u32 {
    returned_alone::<{ Abi::Mpich as u8 }, true>(&ctx)
}

/// Return of any MPI routine of an MPI-5 ABI library but its datatype constructors.
#[uretprobe]
pub fn mpi_return_mpi_abi(ctx: RetProbeContext) -> u32 {
    returned_alone::<{ Abi::MpiAbi as u8 }, false>(&ctx)
}

/// The return of a call, by a return probe: counted, then a persistent request it created
/// learnt.
#[inline(always)]
fn returned_alone<const ABI: u8, const TYPES: bool>(ctx: &RetProbeContext) -> u32 {
    if let Some(state) = returning_state() {
        let said = returned::<ABI, TYPES>(ctx.as_ptr(), now(), state);
        after_returned::<ABI, TYPES>(ctx.as_ptr(), said, state, true);
    }
    0
}

/// Where a returning call returns to: the instruction pointer the kernel restored.
#[inline(always)]
fn returned_to(ctx: *mut core::ffi::c_void) -> u64 {
    // SAFETY: a probe's context is its saved registers.
    unsafe { (*ctx.cast::<aya_ebpf::bindings::pt_regs>()).rip }
}

/// The thread's stack pointer, as the probe saw it.
#[inline(always)]
fn stack_pointer(ctx: *mut core::ffi::c_void) -> u64 {
    // SAFETY: a probe's context is its saved registers.
    unsafe { (*ctx.cast::<aya_ebpf::bindings::pt_regs>()).rsp }
}

/// Where a call just entered will return to: the word at the top of its stack (the probe
/// sits on the function's first instruction, before any push); 0 if unreadable.
#[inline(always)]
pub(crate) fn return_address(ctx: *mut core::ffi::c_void) -> u64 {
    // SAFETY: a probe's context is its saved registers.
    let rsp = unsafe { (*ctx.cast::<aya_ebpf::bindings::pt_regs>()).rsp };
    // SAFETY: reads a word of the traced thread's stack.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(rsp as *const u64) }.unwrap_or(0)
}

/// After the return path, in the caller's stack frame: learns the persistent request the
/// call created, where `returned` said one is `PENDING` (only an MPI routine but a datatype
/// constructor's).
#[inline(always)]
fn learn_pending<const ABI: u8, const TYPES: bool>(said: u32, ctx: *mut core::ffi::c_void) {
    if ABI != Abi::Nccl as u8 && !TYPES {
        if said == PENDING {
            crate::persistent::after_return::<ABI>(RetProbeContext::new(ctx).ret());
        } else if said == POSTED {
            crate::posted::after_return::<ABI>();
        } else if said == MAYBE {
            crate::posted::after_completion(RetProbeContext::new(ctx).ret());
        }
    }
}

/// `mpi_return_mpich_types` for an MPI-5 ABI library (MPICH's: its objects' handles carry
/// no size for derived types either).
#[uretprobe]
pub fn mpi_return_mpi_abi_types(ctx: RetProbeContext) -> u32 {
    returned_alone::<{ Abi::MpiAbi as u8 }, true>(&ctx)
}

/// Return of any NCCL routine (entry is the shared `call_entry`).
#[uretprobe]
pub fn nccl_return(ctx: RetProbeContext) -> u32 {
    returned_alone::<{ Abi::Nccl as u8 }, false>(&ctx)
}

/// Declares a uprobe session program. Not aya's `#[uprobe]`: its wrapper returns 0 whatever
/// the function returns, and a session program's return value is the decision whether
/// the call's return runs.
macro_rules! session_program {
    ($(#[$doc:meta])* $name:ident, $abi:expr, $types:expr) => {
        $(#[$doc])*
        #[unsafe(no_mangle)]
        #[unsafe(link_section = "uprobe")]
        pub extern "C" fn $name(ctx: *mut core::ffi::c_void) -> u32 {
            on_session::<{ $abi as u8 }, $types>(ProbeContext::new(ctx))
        }
    };
}

session_program!(
    /// Entry and return of any MPI routine of an Open MPI library, as one uprobe session
    /// program: the return runs only for the calls whose entry asks for it.
    sess_ompi,
    Abi::OpenMpi,
    false
);
session_program!(
    /// `mpi_return_mpich`'s routines as a session program.
    sess_mpich,
    Abi::Mpich,
    false
);
session_program!(
    /// `mpi_return_mpich_types`'s routines as a session program.
    sess_mpich_types,
    Abi::Mpich,
    true
);
session_program!(
    /// `mpi_return_mpi_abi`'s routines as a session program.
    sess_mpi_abi,
    Abi::MpiAbi,
    false
);
session_program!(
    /// `mpi_return_mpi_abi_types`'s routines as a session program.
    sess_mpi_abi_types,
    Abi::MpiAbi,
    true
);
session_program!(
    /// NCCL's routines as a session program.
    sess_nccl,
    Abi::Nccl,
    false
);

/// A uprobe session (Linux 6.13+): the same program runs at entry and, if the entry
/// returned 0, at return. A process that is not watched pays the entry only: no return
/// probe, no trampoline on its way back; nor does a call left untimed, counted at its
/// entry by the return path itself.
#[inline(always)]
fn on_session<const ABI: u8, const TYPES: bool>(ctx: ProbeContext) -> u32 {
    let at_return = crate::session::is_return();
    let (now, state) = if at_return {
        let Some(state) = returning_state() else {
            return 0;
        };
        (now(), state)
    } else {
        // NCCL's returns keep its groups and device windows; an MPICH-ABI library learns
        // sizes and ranks at MPI_Comm_size/MPI_Comm_rank's return.
        let sampling = if ABI == Abi::Nccl as u8 || TYPES {
            NO_SAMPLING
        } else if Abi::integer_handles(ABI) {
            SAMPLING_BUT_LEARNING
        } else {
            SAMPLING
        };
        let state = thread_state();
        match enter(&ctx, sampling, state) {
            SKIP => return 1,
            TIMED => return 0,
            _ => {}
        }
        // The state the entry had, or made (the thread's first call).
        let state = if state.is_null() {
            thread_state()
        } else {
            state
        };
        if state.is_null() {
            return 1;
        }
        (untimed(), state)
    };
    // One call for both, with arguments of the same kinds: the verifier checks the return
    // path once.
    // (Never pending for an untimed call: persistent creations are always timed.)
    let said = returned::<ABI, TYPES>(ctx.as_ptr(), now, state);
    after_returned::<ABI, TYPES>(ctx.as_ptr(), said, state, at_return);
    // At entry (an untimed call, counted): no return wanted.
    1
}

/// After the return path, in a frame of its own (not under the return path's chain of
/// calls, nor the program's under its): the persistent request the call created learnt
/// (`said`), and the call added to its call site's counters. `at_return`: the kernel has
/// put the caller's return address back in the instruction pointer (else the call is
/// counted at its entry, and its return address is on the stack).
#[inline(never)]
fn after_returned<const ABI: u8, const TYPES: bool>(
    ctx: *mut core::ffi::c_void,
    said: u32,
    state: *mut CallState,
    at_return: bool,
) {
    learn_pending::<ABI, TYPES>(said, ctx);
    crate::sites::after_return(state, stack_pointer(ctx), || {
        if at_return {
            returned_to(ctx)
        } else {
            return_address(ctx)
        }
    });
}

/// The thread's call state at a return; `None` (counted as a return whose entry was not
/// seen, if its process is counted) where it has none.
#[inline(always)]
fn returning_state() -> Option<*mut CallState> {
    let state = call_state(false);
    if state.is_none() {
        count_orphan();
    }
    state
}

/// Counts a return whose entry was not seen (a call in flight at attach), if its process
/// is counted.
#[inline(never)]
fn count_orphan() {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if is_counted(tgid) {
        add_proc_stat(tgid, 1, |s| &mut s.in_flight_at_attach);
    }
}

/// The return of a call, for a return probe and a session alike (or at the entry of a
/// call left untimed), the thread's call state `state` looked up by the caller (at an
/// entry, the entry's): `PENDING` when a persistent request is to be learnt. Its stages
/// are functions of their own, called one after another from a small frame: BPF's 512
/// bytes of stack are those of the deepest chain of calls (a uprobe program, which may be
/// preempted, has no private stack), and the byte decoding, the counting and the event's
/// description each reach deep (a communicator or datatype learnt, charged to its user).
#[inline(never)]
fn returned<const ABI: u8, const TYPES: bool>(
    ctx: *mut core::ffi::c_void,
    now: u64,
    state: *mut CallState,
) -> u32 {
    let mut returning = Returning {
        comm: CommInfo::default(),
        known: 0,
        ret: 0,
    };
    if !returning_call::<ABI>(ctx, state, &mut returning) {
        return 0;
    }
    // SAFETY: the thread's own state, not NULL (`returning_call` read it).
    let c = Cookie::unpack(unsafe { (*state).cookie });
    let (Some(spec), Some(layout)) = (
        ROUTINE_SPECS.get(u32::from(c.routine)),
        LAYOUTS.get(u32::from(c.layout)),
    ) else {
        return 0;
    };
    let bytes = decoded_bytes::<ABI, TYPES>(state, layout, spec, &returning);
    let said = counted::<ABI, TYPES>(now, state, &returning, bytes);
    if said & EVENT != 0 {
        // SAFETY: the thread's own state; the event `counted` filled in it.
        let ev = unsafe { core::ptr::addr_of_mut!((*state).event) };
        // SAFETY: as above; `emit_call` reads the event and numbers it from the state.
        unsafe {
            described::<ABI, TYPES>(&mut *ev, state, layout, spec, &returning);
            emit_call(&mut *state, &mut *ev);
        }
    }
    said & !EVENT
}

/// What `counted` said besides `PENDING`, `POSTED` or `MAYBE`: an event of the call is
/// filled in the thread's state (`CallState::event`), to be described and sent.
const EVENT: u32 = 1 << 8;

/// The monotonic clock, read at a return.
#[inline(always)]
fn now() -> u64 {
    // SAFETY: reads the monotonic clock.
    unsafe { bpf_ktime_get_ns() }
}

/// The `now` of a call counted untimed at its entry, which nothing reads (its duration is
/// not added, and no routine whose time may be sampled has an event or a time kept): no
/// clock read, about a tenth of an untimed call's program here. Read from a map, not a
/// constant: the verifier then takes it as any number, as it does the clock, and checks
/// the return path once for both (with a constant it checked the path twice).
#[inline(always)]
fn untimed() -> u64 {
    crate::cache::stamp()
}

/// The first stage of a return (`returned`): whether it is the thread's outermost call's,
/// and then its communicator and return value in `r`. Not inlined: its frame is not under
/// the later stages'.
#[inline(never)]
fn returning_call<const ABI: u8>(
    ctx: *mut core::ffi::c_void,
    state: *mut CallState,
    r: &mut Returning,
) -> bool {
    // For a call counted at its entry (untimed) the register holds no return value yet:
    // no routine whose time may be sampled reads it.
    let ret: i32 = RetProbeContext::new(ctx).ret();
    let Some(e) = outermost_return(state) else {
        return false;
    };
    let c = Cookie::unpack(e.cookie);
    let Some(spec) = ROUTINE_SPECS.get(u32::from(c.routine)) else {
        return false;
    };
    let Some(layout) = LAYOUTS.get(u32::from(c.layout)) else {
        return false;
    };
    let spec = *spec;
    let call = Call {
        abi: ABI,
        layout,
        tgid: e.tgid,
        args: &e.args,
        ret,
        cache: core::ptr::addr_of_mut!(e.cache),
    };
    let comm = communicator::<ABI>(&call, &spec);
    if ABI == Abi::Nccl as u8 && crate::nccl::unposted(&call, &spec) {
        add_proc_stat(e.tgid, 1, |s| &mut s.net_unposted);
        e.busy = 0;
        return false;
    }
    r.comm = comm.unwrap_or_default();
    r.known = u32::from(comm.is_some());
    r.ret = ret;
    true
}

/// The counting stage of a return (`returned`), its bytes decoded (`UNDECODED`: not): its
/// counters, its process's marks, and its event filled in the thread's state (`EVENT`).
/// One program per ABI and argument shape: with both constants, each program carries only
/// its own paths, which keeps the verifier's work small.
#[inline(never)]
fn counted<const ABI: u8, const TYPES: bool>(
    now: u64,
    state: *mut CallState,
    returning: &Returning,
    decoded: u64,
) -> u32 {
    // SAFETY: the thread's own state, not NULL (`returning_call` read it).
    let e = unsafe { &mut *state };
    let start_ns = e.start_ns;
    let tgid = e.tgid;
    let ret = returning.ret;
    // The entry's cookie: the outermost call returns through the same attach point.
    let c = Cookie::unpack(e.cookie);
    let Some(spec) = ROUTINE_SPECS.get(u32::from(c.routine)) else {
        return 0;
    };
    let spec = *spec;
    // Read whether known or not: LLVM computes on an `Option`'s payload before it tests
    // the tag, and a payload left unread is a register the verifier refuses.
    // SAFETY: the caller's stack value.
    let r = unsafe { core::ptr::read_volatile(returning) };
    let comm = if r.known != 0 { Some(r.comm) } else { None };
    let out = (decoded != UNDECODED).then_some(decoded);
    let dur = now.saturating_sub(start_ns);
    match spec.class {
        class::INIT => {
            with_proc_stats(tgid, |s| s.init_ns = now);
            if ABI == Abi::OpenMpi as u8 && !TYPES {
                crate::mpi::send_components(tgid);
            }
        }
        class::FINALIZE => with_proc_stats(tgid, |s| s.finalize_ns = start_ns),
        _ => {}
    }
    let (bucket, bytes) = if let Some(b) = out {
        (collector_common::size_bucket(b), b)
    } else {
        add_proc_stat(tgid, 1, |s| &mut s.undecoded);
        (UNKNOWN_BUCKET, 0)
    };
    if ABI != Abi::Nccl as u8 && !TYPES && spec.class == class::PERSISTENT {
        // The request is learnt after this function, whose stack frame has no room left.
        // (From `bytes`, always set: read from `out`, LLVM computed on its undefined
        // payload, which the verifier refuses.)
        e.persistent_pending = if bucket == UNKNOWN_BUCKET {
            0
        } else {
            bytes.wrapping_add(1)
        };
    }
    let key = counter_key::<ABI>(tgid, c.routine, bucket, comm);
    // Filled before `e` is borrowed for the counters, and only for an event; described
    // and sent by `returned`.
    let event = wants_event(&spec, e.instance_number());
    if event {
        e.event = CallEvent {
            kind: EventKind::Call as u32,
            tgid,
            tid: bpf_get_current_pid_tgid() as u32,
            routine: c.routine,
            bucket,
            comm_size: key.comm_size,
            start_ns,
            dur_ns: dur,
            bytes,
            // A collective's number (`CallEvent::instance`); a constructor's describe
            // writes its new handle here.
            created: e.instance_number(),
            ..CallEvent::default()
        };
    }
    let counted = crate::counters::add(e, &key, bytes, dur);
    // For the call-site counters, after this function (`sites::after_return`): the calls
    // the counters have.
    e.done = if !counted {
        0
    } else if e.counted_timed() {
        CallState::DONE_TIMED
    } else {
        CallState::DONE_UNTIMED
    };
    e.done_bytes = bytes;
    e.done_ns = dur;
    if ABI == Abi::Nccl as u8 {
        crate::nccl::after_call(e, &spec, &key, bytes, start_ns, now, ret);
    }
    // Read at the end, so that nothing is kept across the path (its stack is full).
    let pending = if ABI == Abi::Nccl as u8 || TYPES {
        0
    } else if e.persistent_pending != 0 {
        PENDING
    } else if crate::posted::posts(&spec, ret) && call_events() & Config::EVENTS_ALL != 0 {
        POSTED
    } else if e.maybe_n != 0 {
        MAYBE
    } else {
        0
    };
    // Last: `args` pointed into this entry.
    e.busy = 0;
    if event {
        pending | EVENT
    } else {
        pending
    }
}

/// What a returning call's global functions are given besides its thread's state, its
/// library's layout and its routine's spec: its communicator, if known, and its return
/// value.
#[repr(C)]
pub struct Returning {
    /// The communicator the call names (zeroes where not `known`).
    comm: CommInfo,
    /// Whether `comm` is known.
    known: u32,
    /// The routine's return value.
    ret: i32,
}

/// Calls, with `args`, the one of six functions (Open MPI's, MPICH's and its datatype
/// constructors', the MPI-5 ABI's and its constructors', NCCL's) that serves the program
/// of ABI `abi` and argument shape `types`.
macro_rules! by_abi {
    ($abi:expr, $types:expr, [$ompi:ident, $mpich:ident, $mpich_types:ident, $mpi_abi:ident,
     $mpi_abi_types:ident, $nccl:ident]($($arg:expr),*)) => {{
        const OMPI: u8 = Abi::OpenMpi as u8;
        const MPICH: u8 = Abi::Mpich as u8;
        const MPI_ABI: u8 = Abi::MpiAbi as u8;
        match ($abi, $types) {
            (OMPI, _) => $ompi($($arg),*),
            (MPICH, false) => $mpich($($arg),*),
            (MPICH, true) => $mpich_types($($arg),*),
            (MPI_ABI, false) => $mpi_abi($($arg),*),
            (MPI_ABI, true) => $mpi_abi_types($($arg),*),
            _ => $nccl($($arg),*),
        }
    }};
}

/// The bytes of a returning call by its routine's byte rule; [`UNDECODED`] where they
/// could not be read. Calls the ABI's global `decode_*` function ([`global_return_path`]).
#[inline(always)]
fn decoded_bytes<const ABI: u8, const TYPES: bool>(
    state: *mut CallState,
    layout: &Layout,
    spec: &ArgSpec,
    returning: &Returning,
) -> u64 {
    let (l, p, r) = (
        core::ptr::from_ref(layout),
        core::ptr::from_ref(spec),
        core::ptr::from_ref(returning),
    );
    if ABI != Abi::Nccl as u8 && !TYPES && crate::mpi::is_p2p_return(spec) {
        // (The types programs and NCCL's have no point-to-point calls.)
        return by_abi!(
            ABI,
            TYPES,
            [
                decode_p2p_ompi,
                decode_p2p_mpich,
                decode_p2p_mpich,
                decode_p2p_mpi_abi,
                decode_p2p_mpi_abi,
                decode_p2p_mpi_abi
            ](state, l, p, r)
        );
    }
    by_abi!(
        ABI,
        TYPES,
        [
            decode_ompi,
            decode_mpich,
            decode_mpich_types,
            decode_mpi_abi,
            decode_mpi_abi_types,
            decode_nccl
        ](state, l, p, r)
    )
}

/// Fills a returning call's event `ev` with its peers and communicator. Calls the ABI's
/// global `describe_*` function ([`global_return_path`]).
#[inline(always)]
fn described<const ABI: u8, const TYPES: bool>(
    ev: &mut CallEvent,
    state: *mut CallState,
    layout: &Layout,
    spec: &ArgSpec,
    returning: &Returning,
) {
    let (e, l, p, r) = (
        core::ptr::from_mut(ev),
        core::ptr::from_ref(layout),
        core::ptr::from_ref(spec),
        core::ptr::from_ref(returning),
    );
    by_abi!(
        ABI,
        TYPES,
        [
            describe_ompi,
            describe_mpich,
            describe_mpich_types,
            describe_mpi_abi,
            describe_mpi_abi_types,
            describe_nccl
        ](e, state, l, p, r)
    );
}

/// `f` of a returning call rebuilt from a global function's arguments; `default` where a
/// pointer is NULL (never, but a global function's pointers may be NULL as far as the
/// verifier knows).
#[inline(always)]
fn with_call<const ABI: u8, R>(
    state: *mut CallState,
    layout: *const Layout,
    spec: *const ArgSpec,
    returning: *const Returning,
    default: R,
    f: impl FnOnce(&Call, &ArgSpec, Option<CommInfo>) -> R,
) -> R {
    if state.is_null() || layout.is_null() || spec.is_null() || returning.is_null() {
        return default;
    }
    // SAFETY: the caller's thread state, map value and stack values, not NULL. The
    // communicator is read whether known or not: LLVM computes on an `Option`'s payload
    // before it tests the tag, and a payload left unread is a register the verifier
    // refuses.
    let (e, layout, spec, r) = unsafe {
        (
            &mut *state,
            &*layout,
            &*spec,
            core::ptr::read_volatile(returning),
        )
    };
    let comm = if r.known != 0 { Some(r.comm) } else { None };
    let call = Call {
        abi: ABI,
        layout,
        tgid: e.tgid,
        args: &e.args,
        ret: r.ret,
        cache: core::ptr::addr_of_mut!(e.cache),
    };
    f(&call, spec, comm)
}

/// Declares the return path's byte decoding (`$decode`) and event description
/// (`$describe`) of one ABI and argument shape as BPF *global* functions (`pub extern "C"`
/// and unmangled: global in the object and its BTF), which the kernel's verifier checks
/// once each, on their own, from their arguments' types. Static, each was checked again
/// for every state the return path had reached before it (communicator known or not, and
/// each of its kinds; each byte rule's outcome), multiplying the states. `$decode` returns
/// [`UNDECODED`] where the bytes could not be read.
macro_rules! global_return_path {
    ($decode:ident, $describe:ident, $abi:expr, $types:expr) => {
        global_decode!($decode, $abi, |call, spec, comm| {
            if $abi as u8 == Abi::Nccl as u8 {
                crate::nccl::on_return(call, spec, comm)
            } else if $types {
                crate::mpi::on_type_return(call, spec)
            } else {
                crate::mpi::on_return(call, spec, comm)
            }
        });

        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $describe(
            ev: *mut CallEvent,
            state: *mut CallState,
            layout: *const Layout,
            spec: *const ArgSpec,
            returning: *const Returning,
        ) -> u32 {
            // SAFETY: the caller's stack value (NULL: nothing to fill).
            let Some(ev) = (unsafe { ev.as_mut() }) else {
                return 0;
            };
            with_call::<{ $abi as u8 }, _>(state, layout, spec, returning, 0, |call, spec, comm| {
                describe_call(ev, call, spec, comm);
                0
            })
        }
    };
}

/// Declares a byte decoding of ABI `$abi` as a BPF global function (see
/// [`global_return_path`]): `$bytes`, of the returning call, its spec and its communicator
/// if known, or [`UNDECODED`] where it is `None`.
macro_rules! global_decode {
    ($decode:ident, $abi:expr, |$call:ident, $spec:ident, $comm:ident| $bytes:expr) => {
        #[unsafe(no_mangle)]
        #[inline(never)]
        pub extern "C" fn $decode(
            state: *mut CallState,
            layout: *const Layout,
            spec: *const ArgSpec,
            returning: *const Returning,
        ) -> u64 {
            with_call::<{ $abi as u8 }, _>(
                state,
                layout,
                spec,
                returning,
                UNDECODED,
                |$call, $spec, $comm| {
                    let bytes: Option<u64> = $bytes;
                    bytes.unwrap_or(UNDECODED)
                },
            )
        }
    };
}

/// A point-to-point call's byte decoding (`mpi::on_p2p_return`) for each MPI ABI, apart
/// from the ABI's other rules ([`decoded_bytes`]).
macro_rules! global_p2p_return {
    ($decode:ident, $abi:expr) => {
        global_decode!($decode, $abi, |call, spec, comm| {
            crate::mpi::on_p2p_return(call, spec, comm)
        });
    };
}

global_p2p_return!(decode_p2p_ompi, Abi::OpenMpi);
global_p2p_return!(decode_p2p_mpich, Abi::Mpich);
global_p2p_return!(decode_p2p_mpi_abi, Abi::MpiAbi);

global_return_path!(decode_ompi, describe_ompi, Abi::OpenMpi, false);
global_return_path!(decode_mpich, describe_mpich, Abi::Mpich, false);
global_return_path!(decode_mpich_types, describe_mpich_types, Abi::Mpich, true);
global_return_path!(decode_mpi_abi, describe_mpi_abi, Abi::MpiAbi, false);
global_return_path!(
    decode_mpi_abi_types,
    describe_mpi_abi_types,
    Abi::MpiAbi,
    true
);
global_return_path!(decode_nccl, describe_nccl, Abi::Nccl, false);

/// The thread's call state `state` if its outermost call is now returning; `None` for a
/// nested call's return (counted at the outermost) or a return whose entry was not seen
/// (an orphan, counted as such).
#[inline(always)]
fn outermost_return(state: *mut CallState) -> Option<&'static mut CallState> {
    // SAFETY: the thread's own state (only counted processes have one: no need to look
    // the process up again).
    let e = unsafe { &mut *state };
    if e.busy == 0 {
        count_orphan();
        return None;
    }
    if e.depth > 0 {
        e.depth -= 1;
        return None;
    }
    Some(e)
}

/// The communicator the call names, if any (cached per thread, but NCCL's: they are
/// learnt and relearnt by many calls).
#[inline(always)]
fn communicator<const ABI: u8>(call: &Call, spec: &ArgSpec) -> Option<CommInfo> {
    call.arg(spec.comm).and_then(|h| {
        let h = handle(ABI, h);
        let decode = || comm_info(ABI, call.layout, call.tgid, h);
        if ABI == Abi::Nccl as u8 {
            decode()
        } else {
            crate::cache::comm_info(call.cache, h, decode)
        }
    })
}

/// The counter a call adds to: only NCCL keeps counters per communicator; MPI's are per
/// communicator size.
#[inline(always)]
fn counter_key<const ABI: u8>(
    tgid: u32,
    routine: u16,
    bucket: u8,
    comm: Option<CommInfo>,
) -> CounterKey {
    let (comm_rank, object) = match comm {
        _ if ABI != Abi::Nccl as u8 => (0, 0),
        Some(c) => (c.rank, c.id),
        None => (-1, 0),
    };
    CounterKey {
        tgid,
        routine,
        parent: CounterKey::NO_PARENT,
        comm_size: comm.map_or(0, |c| c.size),
        comm_rank,
        object,
        bucket,
        flags: 0,
        _pad: [0; 6],
    }
}

/// Whether the call is sent to userspace: every call while events are on for all, else
/// what who-is-late follows: the calls that name communicators, and the collectives it
/// draws (`instance`: the call's number plus one, 0 for every call of a communicator not
/// numbered).
#[inline(always)]
fn wants_event(spec: &ArgSpec, instance: u64) -> bool {
    match call_events() {
        0 => false,
        m if m & Config::EVENTS_ALL != 0 => true,
        _ => {
            spec.matters_for_skew()
                && (instance == 0 || collector_common::instances::drawn(instance - 1))
        }
    }
}

/// Which call events userspace wants (`Config::call_events`).
#[inline(always)]
fn call_events() -> u32 {
    CONFIG.get(0).map_or(0, |c| c.call_events)
}
