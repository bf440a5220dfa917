//! libfabric's data path: the functions of provider ops tables (`ep->msg->send` ...).
//!
//! A call counts under its routine, `fi_<kind>_<op>`:
//! the slot is the function's place in its table, the kind is found at the call, from the
//! endpoint in its first argument (`struct fid_ep`: msg, rma and tagged table pointers at
//! +40, +48, +56): the table whose slot holds the called function. What is learnt is kept
//! per function. A call whose endpoint shows no such table (a function of another table
//! of the same shape, connection management say) counts as unresolved. Calls count per
//! endpoint (its address). Calls made from libfabric's own code (rxm calling tcp, progress
//! posting receives) are not the application's: they are only counted as internal. A libfabric call
//! made while another is in progress on the thread is counted once, outside. One made
//! inside an MPI or NCCL call is counted with that call as its parent, in a second
//! per-thread slot, since the MPI call's own state is still in use.
//!
//! UCX's data path (`ucp_tag_send_nbx` ...) is counted by the same programs: its functions
//! are exported, each probed by its symbol with its routine in the cookie (nothing to
//! resolve), and calls from UCX's own code are its own as libfabric's are.

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user_str_bytes},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use collector_common::{
    routines::{
        FABRIC_FIRST, FABRIC_SLOTS, FID_EP_TABLES_OFF, UCX_AM_SEND_NBX, UCX_END, UCX_FIRST,
    },
    size_bucket, ArgSpec, ByteRule, CallEvent, CallState, Cookie, CounterKey, EventKind,
    FabricEvent, FABRIC_NAME_LEN, MAX_FABRIC_RANGES, UNKNOWN_BUCKET,
};

use crate::{
    call::{call_events_on, cookie, emit_call},
    counters::{add, add_untimed},
    decode::read,
    maps::{
        add_proc_stat, call_state, new_call_state, not_drawn, time_one_in, EVENTS, FABRIC_FUNCS,
        FABRIC_KINDS, FABRIC_RANGES, FABRIC_TEXT, ROUTINE_SPECS,
    },
    process::{is_counted, is_watched, known_uncounted, scope_stamp, still_counted},
};

/// Longest `struct iovec` array summed.
const MAX_IOV: u64 = 16;

/// Whether `routine` is a libfabric ops-table slot or a UCX data-path function.
#[inline(always)]
fn is_fabric(routine: u16) -> bool {
    let routine = routine & !UNRESOLVED;
    (FABRIC_FIRST..FABRIC_FIRST + 3 * FABRIC_SLOTS).contains(&routine) || is_ucx(routine)
}

/// Whether `routine` is a UCX data-path function.
#[inline(always)]
fn is_ucx(routine: u16) -> bool {
    (UCX_FIRST..UCX_END).contains(&routine)
}

/// Entry of any libfabric ops-table function or UCX operation (with `fabric_return`:
/// entry and return probes, where the kernel has no uprobe sessions).
#[uprobe]
pub fn fabric_entry(ctx: ProbeContext) -> u32 {
    enter(&ctx, false);
    0
}

/// The same functions as one uprobe session program (Linux 6.13+): the return runs only
/// for what the entry times. A call from the library's own code, one in a process not
/// counted, a callback nested in another call, and a UCX operation whose time is sampled
/// and not drawn (counted whole at its entry) skip it: nothing to nest, no trampoline.
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe")]
pub extern "C" fn sess_fabric(ctx: *mut c_void) -> u32 {
    if crate::session::is_return() {
        returned(&RetProbeContext::new(ctx));
        return 0;
    }
    u32::from(!enter(&ProbeContext::new(ctx), true))
}

/// The entry of a transport call: whether its return must be seen (in a `session`, the
/// decision; with entry and return probes, every return comes, and calls whose return is
/// not the application's are nested in the call in progress instead). Not inlined: in a
/// session its frame is then not beside the return's, whose chain of calls shares BPF's
/// 512 bytes of stack with it (a uprobe program has no private stack).
#[inline(never)]
fn enter(ctx: &ProbeContext, session: bool) -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // A process not watched (another job's) stops here: deciding whether the call is
    // libfabric's own looks up two hashes and reads the caller's stack. In a session only:
    // with entry and return probes every return runs, and an entry skipped by a thread with
    // a call in progress (its process detached meanwhile) would end that call early.
    if session && known_uncounted(tgid, scope_stamp()) {
        return false;
    }
    let c = cookie(ctx);
    // SAFETY: regs points at this probe's saved registers.
    let regs = unsafe { &*ctx.regs };
    let mut args = [regs.rdi, regs.rsi, regs.rdx, regs.rcx, regs.r8, regs.r9];
    if c.routine == UCX_AM_SEND_NBX {
        // Its param is its 7th argument, on the stack above the return address (probes
        // sit before any push); its buffer's slot is not read for it.
        args[4] = read::<u64>(regs.rsp + 8).unwrap_or(0);
    }
    let internal = called_from_inside(&c, tgid, regs.rip, regs.rsp);
    if internal && !is_watched(tgid) {
        return false;
    }
    let e = if let Some(e) = call_state(false) {
        e
    } else {
        if !is_counted(tgid) {
            return false;
        }
        if let Some(e) = new_call_state(tgid) {
            e
        } else {
            add_proc_stat(tgid, 1, |s| &mut s.counter_map_full);
            return false;
        }
    };
    // SAFETY: the thread's own state; only this thread touches it.
    let e = unsafe { &mut *e };
    if internal {
        // Not the application's call: not counted. With entry and return probes, its
        // return must not be taken for the return of the call in progress (rxm's send
        // calling tcp's), so it is nested in that call, or in none; in a session its
        // return does not run.
        add_proc_stat(tgid, 1, |s| &mut s.fabric_internal);
        if session {
            return false;
        }
        if e.busy != 0 && is_fabric(e.routine) {
            e.depth += 1;
        } else if e.fab_busy != 0 {
            e.fab_depth += 1;
        } else {
            e.fab_internal += 1;
        }
        return true;
    }
    let routine = resolve(&c, regs.rip, args[0]);
    if e.busy == 0 {
        if !still_counted(e) {
            return false;
        }
        // No timed call in progress on the thread: made inside its MPI call if that one
        // was counted untimed at its entry (whose return is not seen), else by the
        // application itself.
        let parent = match e.untimed_parent {
            0 => CounterKey::NO_PARENT,
            p => p - 1,
        };
        if session && left_untimed(routine, e) {
            count_untimed(e, tgid, routine, &args, parent);
            return false;
        }
        e.top_parent = parent;
        e.args[0] = args[0];
        e.args[1] = args[1];
        e.args[2] = args[2];
        e.args[3] = args[3];
        e.args[4] = args[4];
        e.args[5] = args[5];
        // SAFETY: reads the monotonic clock.
        e.start_ns = unsafe { bpf_ktime_get_ns() };
        e.depth = 0;
        e.busy = 1;
        e.entry_sp = regs.rsp;
        e.routine = routine;
        return true;
    }
    if is_fabric(e.routine) || e.fab_busy != 0 {
        // Called back from inside a libfabric call outside the library (a callback):
        // counted once, outside.
        add_proc_stat(tgid, 1, |s| &mut s.nested);
        if session {
            return false;
        }
        if is_fabric(e.routine) {
            e.depth += 1;
        } else {
            e.fab_depth += 1;
        }
        return true;
    }
    if session && left_untimed(routine, e) {
        let parent = e.routine;
        count_untimed(e, tgid, routine, &args, parent);
        return false;
    }
    e.fab_args = args;
    // SAFETY: reads the monotonic clock.
    e.fab_start_ns = unsafe { bpf_ktime_get_ns() };
    e.fab_depth = 0;
    e.fab_busy = 1;
    e.fab_routine = routine;
    true
}

/// Whether a UCX operation goes untimed: its routine's time is sampled one call in N
/// (`TIME_ONE_IN`, as MPI routines') and this call was not drawn, and no event is wanted
/// (an event carries its time). Never a libfabric call: its return says whether it posted
/// anything (`-FI_EAGAIN` is common).
#[inline(always)]
fn left_untimed(routine: u16, e: &mut CallState) -> bool {
    if !is_ucx(routine) || call_events_on() {
        return false;
    }
    let n = time_one_in(routine, e.tgid);
    not_drawn(n, &mut e.draws)
}

/// Counts a UCX operation at its entry, untimed (its bytes are in its arguments; an error
/// it might return is not seen: UCX's are rare, and not retries).
#[inline(never)]
fn count_untimed(e: &mut CallState, tgid: u32, routine: u16, args: &[u64; 6], parent: u16) {
    let op = Operation {
        routine,
        args: *args,
        start_ns: 0,
        parent,
    };
    count_operation(e, tgid, &op, None);
}

/// The routine of a call: its slot in the table of the kind the endpoint `ep` says the
/// called function (probed at `ip`) belongs to; with the top bit set when it could not be
/// told (then the slot's `fi_msg_*` id).
#[inline(always)]
fn resolve(c: &Cookie, ip: u64, ep: u64) -> u16 {
    if is_ucx(c.routine) {
        return c.routine;
    }
    let slot = c.routine.wrapping_sub(FABRIC_FIRST) % FABRIC_SLOTS;
    let id = c.fabric_function();
    // SAFETY: plain u8 value.
    if let Some(kind) = unsafe { FABRIC_KINDS.get(id) } {
        return FABRIC_FIRST + u16::from(*kind) * FABRIC_SLOTS + slot;
    }
    let function = ip.wrapping_sub(u64::from(c.skip));
    if let Some(tables) = read::<[u64; 3]>(ep.wrapping_add(FID_EP_TABLES_OFF)) {
        for (kind, table) in tables.iter().enumerate() {
            if read::<u64>(table.wrapping_add(8 + 8 * u64::from(slot))) == Some(function) {
                let _ = FABRIC_KINDS.insert(id, kind as u8, 0);
                return FABRIC_FIRST + kind as u16 * FABRIC_SLOTS + slot;
            }
        }
    }
    UNRESOLVED | (FABRIC_FIRST + slot)
}

/// Marks a routine id whose table kind is unknown.
pub const UNRESOLVED: u16 = 0x8000;

/// Return of any libfabric ops-table function or UCX operation.
#[uretprobe]
pub fn fabric_return(ctx: RetProbeContext) -> u32 {
    returned(&ctx);
    0
}

/// The return of a transport call whose entry was seen (a return probe's or a session's).
/// Not inlined: a session's entry and return then each have a frame of their own, not
/// both in one under either's chain of calls.
#[inline(never)]
fn returned(ctx: &RetProbeContext) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    let e = if let Some(e) = call_state(false) {
        // SAFETY: the thread's own state.
        unsafe { &mut *e }
    } else {
        if is_counted(tgid) {
            add_proc_stat(tgid, 1, |s| &mut s.in_flight_at_attach);
        }
        return;
    };
    let Some(op) = outermost_return(e, tgid) else {
        return;
    };
    // ssize_t: 0 when posted; -FI_EAGAIN and other errors post nothing. UCX: a status
    // pointer (`_nbx`, `_nb`: NULL done, a request, or an error from -1 to -100) or an
    // `int` status (`_nbi`, `_nbr`: zero-extended, its upper half not to be trusted).
    let ret: i64 = ctx.ret();
    let failed = if is_ucx(op.routine) {
        (-100..0).contains(&ret) || (ret >> 32 == 0 && (-100..0).contains(&(ret as i32)))
    } else {
        ret < 0
    };
    if failed {
        add_proc_stat(tgid, 1, |s| &mut s.fabric_failed);
        return;
    }
    count_operation(e, tgid, &op, Some(now));
}

/// A libfabric operation that returned: what its entry saved.
struct Operation {
    /// Its routine id (with `UNRESOLVED` when its table kind is unknown).
    routine: u16,
    args: [u64; 6],
    start_ns: u64,
    /// The MPI or NCCL call it was made in, or `CounterKey::NO_PARENT`.
    parent: u16,
}

/// The operation whose outermost return this is, freeing its slot; None for the return of
/// a call libfabric made itself, a nested one, or one whose entry was not seen.
#[inline(always)]
fn outermost_return(e: &mut CallState, tgid: u32) -> Option<Operation> {
    // The return of a call libfabric made itself outside any counted call (calls cannot
    // start inside such a call but from libfabric: returns come back in order).
    if e.fab_internal > 0 {
        e.fab_internal -= 1;
        return None;
    }
    if e.busy == 0 {
        add_proc_stat(tgid, 1, |s| &mut s.in_flight_at_attach);
        return None;
    }
    if is_fabric(e.routine) {
        if e.depth > 0 {
            e.depth -= 1;
            return None;
        }
        e.busy = 0;
        return Some(Operation {
            routine: e.routine,
            args: [
                e.args[0], e.args[1], e.args[2], e.args[3], e.args[4], e.args[5],
            ],
            start_ns: e.start_ns,
            parent: e.top_parent,
        });
    }
    if e.fab_busy == 0 {
        add_proc_stat(tgid, 1, |s| &mut s.in_flight_at_attach);
        return None;
    }
    if e.fab_depth > 0 {
        e.fab_depth -= 1;
        return None;
    }
    e.fab_busy = 0;
    Some(Operation {
        routine: e.fab_routine,
        args: e.fab_args,
        start_ns: e.fab_start_ns,
        parent: e.routine,
    })
}

/// Counts a posted operation (and emits its call event for timelines), timed if its
/// return time `now` is given.
#[inline(always)]
fn count_operation(e: &mut CallState, tgid: u32, op: &Operation, now: Option<u64>) {
    let resolved = op.routine & UNRESOLVED == 0;
    let routine = op.routine & !UNRESOLVED;
    let Some(spec) = ROUTINE_SPECS.get(u32::from(routine)) else {
        return;
    };
    let (bucket, bytes) = if let Some(b) = fabric_bytes(spec, &op.args) {
        (size_bucket(b), b)
    } else {
        add_proc_stat(tgid, 1, |s| &mut s.fabric_undecoded);
        (UNKNOWN_BUCKET, 0)
    };
    let key = CounterKey {
        tgid,
        routine,
        parent: op.parent,
        comm_size: 0,
        comm_rank: 0,
        object: op.args[0],
        bucket,
        flags: if resolved {
            0
        } else {
            CounterKey::UNRESOLVED_TABLE
        },
        _pad: [0; 6],
    };
    let Some(now) = now else {
        add_untimed(e, &key, bytes);
        return;
    };
    let dur = now.saturating_sub(op.start_ns);
    add(e, &key, bytes, dur);
    // An operation whose table is unknown has no name to show (the profile counts it
    // apart, `fabric_unresolved`): no slice for a guess.
    if call_events_on() && resolved {
        // For timelines: the operation inside the MPI or NCCL call that made it.
        emit_call(
            e,
            &mut CallEvent {
                kind: EventKind::Call as u32,
                tgid,
                tid: bpf_get_current_pid_tgid() as u32,
                routine,
                bucket,
                peer: -1,
                comm_rank: -1,
                start_ns: op.start_ns,
                dur_ns: dur,
                bytes,
                ..CallEvent::default()
            },
        );
    }
}

/// Whether the function probed at `ip` was called from libfabric's own code (its return
/// address, on top of the stack at the probe, is in the library's text): a provider layered
/// on another (rxm on tcp) or progress, not the application. Probes sit before any push.
#[inline(always)]
fn called_from_inside(c: &Cookie, tgid: u32, ip: u64, sp: u64) -> bool {
    // SAFETY: plain values.
    let (Some(file), Some(text)) = (
        unsafe { FABRIC_FUNCS.get(c.fabric_function()) },
        FABRIC_TEXT.get(u32::from(c.layout)),
    ) else {
        return false;
    };
    let bias = ip.wrapping_sub(u64::from(c.skip)).wrapping_sub(*file);
    let Some(ret) = read::<u64>(sp) else {
        return false;
    };
    let in_file = ret.wrapping_sub(bias);
    if in_file >= text.lo && in_file < text.hi {
        return true;
    }
    // Another libfabric object of this process: a provider DSO calling the one beneath.
    // SAFETY: plain value.
    let Some(r) = (unsafe { FABRIC_RANGES.get(tgid) }) else {
        return false;
    };
    for i in 0..MAX_FABRIC_RANGES {
        if i as u32 >= r.n {
            break;
        }
        let t = &r.ranges[i];
        if ret >= t.lo && ret < t.hi {
            return true;
        }
    }
    false
}

/// Bytes of a libfabric or UCX call by its routine's rule.
#[inline(always)]
fn fabric_bytes(spec: &ArgSpec, args: &[u64; 6]) -> Option<u64> {
    let arg = |i: u8| args.get(usize::from(i)).copied();
    match ByteRule::from_u8(spec.rule) {
        ByteRule::FabricLen | ByteRule::UcxLen => arg(spec.a),
        ByteRule::FabricIov => iov_bytes(arg(spec.a)?, arg(spec.b)?),
        ByteRule::FabricMsg => {
            // struct fi_msg { const struct iovec *msg_iov; void **desc; size_t iov_count; ... }
            let msg = arg(spec.a)?;
            iov_bytes(read::<u64>(msg)?, read::<u64>(msg + 16)?)
        }
        ByteRule::UcxParam => {
            // ucp_request_param_t { uint32_t op_attr_mask; uint32_t flags; void *request;
            // void *cb; ucp_datatype_t datatype; ... }: bytes unless a datatype is named.
            let param = arg(spec.b)?;
            let datatype = if param == 0 {
                UCP_BYTES
            } else if read::<u32>(param)? & UCP_OP_ATTR_FIELD_DATATYPE != 0 {
                read::<u64>(param + 24)?
            } else {
                UCP_BYTES
            };
            ucx_bytes(datatype, arg(spec.a)?, args[1])
        }
        ByteRule::UcxDatatype => ucx_bytes(arg(spec.b)?, arg(spec.a)?, args[1]),
        _ => Some(0),
    }
}

/// `UCP_OP_ATTR_FIELD_DATATYPE` (ucp.h).
const UCP_OP_ATTR_FIELD_DATATYPE: u32 = 1 << 3;
/// `ucp_dt_make_contig(1)`: what an `_nbx` call without a datatype moves (bytes).
const UCP_BYTES: u64 = 1 << 3;

/// Bytes of `count` elements of UCX `datatype` at `buffer`: a contiguous type's size is
/// in its upper bits (`ucp_dt_make_contig`); an iov's `count` is its entries (`struct
/// iovec`s at `buffer`, summed); strided and generic ones are not decoded.
#[inline(always)]
fn ucx_bytes(datatype: u64, count: u64, buffer: u64) -> Option<u64> {
    match datatype & 7 {
        // No 128-bit multiply in BPF (and LLVM makes one of a division's overflow check):
        // a buffer (below 2^47 bytes on x86-64) of elements below 64 KiB cannot overflow.
        0 => {
            let size = datatype >> 3;
            (size < 1 << 16 && count < 1 << 47).then(|| count.wrapping_mul(size))
        }
        2 => iov_bytes(buffer, count),
        _ => None,
    }
}

/// Sum of the `iov_len`s of `n` `struct iovec { void *iov_base; size_t iov_len; }`.
#[inline(always)]
fn iov_bytes(iov: u64, n: u64) -> Option<u64> {
    if n > MAX_IOV {
        return None;
    }
    let mut total = 0u64;
    for i in 0..MAX_IOV {
        if i >= n {
            break;
        }
        total += read::<u64>(iov + 16 * i + 8)?;
    }
    Some(total)
}

/// Entry of libfabric's `fi_fabric(struct fi_fabric_attr *attr, ...)`: reports the provider
/// (`attr->prov_name`, +16) and fabric (`attr->name`, +8) a counted process opens; not the
/// core fabric a layered provider opens beneath (rxm's tcp), which libfabric calls itself.
#[uprobe]
pub fn fabric_open(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_counted(tgid) {
        return 0;
    }
    // SAFETY: regs points at this probe's saved registers.
    let regs = unsafe { &*ctx.regs };
    if called_from_inside(&cookie(&ctx), tgid, regs.rip, regs.rsp) {
        return 0;
    }
    let attr = regs.rdi;
    let mut ev = FabricEvent {
        kind: EventKind::FabricOpen as u32,
        tgid,
        provider: [0; FABRIC_NAME_LEN],
        fabric: [0; FABRIC_NAME_LEN],
    };
    for (off, out) in [(16u64, &mut ev.provider), (8, &mut ev.fabric)] {
        if let Some(s) = read::<u64>(attr.wrapping_add(off)) {
            // SAFETY: the helper copies at most the buffer and stops at a fault.
            let _ = unsafe { bpf_probe_read_user_str_bytes(s as *const u8, out) };
        }
    }
    // A lost report leaves the provider unnamed; nothing is counted from it.
    let _ = EVENTS.output::<FabricEvent>(&ev, 0);
    0
}
