//! Nonblocking receives followed to the wait that completes them, for timelines: an
//! `MPI_Irecv`'s message arrives in a later `MPI_Wait`/`MPI_Waitall`, which only the
//! request handle ties to it. The receive's request is remembered at its return; the wait
//! reads its requests at its entry (the call resets them to `MPI_REQUEST_NULL`) and sends
//! one [`EventKind::Arrival`] for each receive it completes. Only while per-call events
//! are on: nothing else needs it.

use aya_ebpf::{cty::c_void, macros::map, maps::LruHashMap};
use collector_common::{
    ArgSpec, ByteRule, CallEvent, CallState, Cookie, HandleKey, PostedRecv, MAX_POSTED,
    MAX_STARTALL,
};

use crate::{
    call::{arg, emit_unnumbered, read_handle},
    decode::{each, int_arg},
    maps::{call_state, ROUTINE_SPECS},
};

/// Nonblocking receives not yet seen to complete. An LRU: one that is never waited for
/// (completed by `MPI_Test` in a loop the kernel cannot follow, or its process gone) makes
/// room for newer ones; losing one loses an arrow, never a count.
#[map]
static POSTED: LruHashMap<HandleKey, PostedRecv> = LruHashMap::with_max_entries(MAX_POSTED, 0);

/// After the return path of a nonblocking receive that posted one (`MPI_Irecv`), in the
/// caller's stack frame: remembers its request, read from `*d`.
#[inline(never)]
pub fn after_return<const ABI: u8>() {
    let Some(e) = call_state(false) else {
        return;
    };
    // SAFETY: the thread's own state; its call has returned.
    let e = unsafe { &*e };
    let c = Cookie::unpack(e.cookie);
    let Some(spec) = ROUTINE_SPECS.get(u32::from(c.routine)) else {
        return;
    };
    let Some(request) = arg(&e.args, spec.d).and_then(|p| read_handle(ABI, p)) else {
        return;
    };
    let key = HandleKey {
        tgid: e.tgid,
        _pad: 0,
        handle: request,
    };
    let posted = PostedRecv {
        tid: aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32,
        _pad: 0,
        start_ns: e.start_ns,
    };
    let _ = POSTED.insert(key, posted, 0);
}

/// Whether a returning call posted a receive to follow: a nonblocking receive that
/// succeeded and names its request.
#[inline(always)]
pub fn posts(spec: &ArgSpec, ret: i32) -> bool {
    ret == 0
        && spec.class == collector_common::routines::class::P2P
        && spec.d != collector_common::routines::NO_ARG
        && matches!(
            ByteRule::from_u8(spec.rule),
            ByteRule::RecvPosted | ByteRule::LargeRecvPosted
        )
}

/// At the entry of a completion call (`e`, its state, with its arguments and start): the
/// receives among its requests are no longer followed, and their arrivals sent: in this
/// call, for a wait that completes them all ([`ByteRule::Completes`]), else untold. Not
/// inlined: completion calls only.
#[inline(never)]
pub fn completing(abi: u32, spec: ArgSpec, e: &CallState) {
    let rule = ByteRule::from_u8(spec.rule);
    if !matches!(rule, ByteRule::Completes | ByteRule::MayComplete) {
        return;
    }
    let Some(a) = arg(&e.args, spec.a) else {
        return;
    };
    // `MPI_Wait(*a)` or `MPI_Waitall(a, b[])`.
    let (n, requests) = match arg(&e.args, spec.b) {
        Some(b) => (int_arg(a), b),
        None => (1, a),
    };
    if n <= 0 {
        return;
    }
    let mut w = Waiting {
        requests,
        start_ns: e.start_ns,
        tgid: e.tgid,
        tid: aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32,
        abi,
        routine: u32::from(e.routine),
        arrives: u32::from(rule == ByteRule::Completes),
    };
    // Past MAX_STARTALL requests, the rest stay followed: an arrow may be lost, never drawn
    // to a wait that did not complete its receive (a request handle is reused only once
    // its request is done, by a new request whose return replaces the entry).
    each((n as u32).min(MAX_STARTALL), wait_one, &mut w);
}

/// Forgets a request that `MPI_Request_free` gives up (`key`, read at its entry): a
/// receive's arrival is sent untold.
#[inline(never)]
pub fn freed(key: &HandleKey, routine: u16) {
    // SAFETY: copied out at once.
    let Some(posted) = (unsafe { POSTED.get(key) }).copied() else {
        return;
    };
    let _ = POSTED.remove(key);
    let tid = aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32;
    emit_unnumbered(&CallEvent::arrival(
        key.tgid, tid, routine, 0, &posted, true,
    ));
}

/// What [`wait_one`] reads, on the caller's stack.
#[repr(C)]
struct Waiting {
    /// Address of the request (`MPI_Wait`) or of the request array.
    requests: u64,
    /// The completion call's `start_ns`.
    start_ns: u64,
    tgid: u32,
    tid: u32,
    abi: u32,
    routine: u32,
    /// 1 if the call completes every request (its receives' messages arrive in it), 0 if
    /// it may complete some (their arrivals are untold).
    arrives: u32,
}

/// One request of a completion call (`bpf_loop`'s body): a followed receive is no longer,
/// and its arrival sent (untold where the call may not complete it).
extern "C" fn wait_one(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes `completing`'s context.
    let w = unsafe { &mut *ctx.cast::<Waiting>() };
    let Some(h) = crate::decode::element_handle(w.abi as u8, w.requests, i) else {
        return 0;
    };
    let key = HandleKey {
        tgid: w.tgid,
        _pad: 0,
        handle: h,
    };
    // SAFETY: copied out at once.
    let Some(posted) = (unsafe { POSTED.get(key) }).copied() else {
        return 0;
    };
    let _ = POSTED.remove(key);
    // One the ring buffer has no room for is an arrow lost: the trace counts the receives
    // it saw posted and never arrive.
    let untold = w.arrives == 0;
    let ev = CallEvent::arrival(w.tgid, w.tid, w.routine as u16, w.start_ns, &posted, untold);
    emit_unnumbered(&ev);
    0
}
