//! Nonblocking receives followed to the call that completes them, for timelines: an
//! `MPI_Irecv`'s message arrives in a later wait or test, which only the request handle
//! ties to it. The receive's request is remembered at its return; a completion call reads
//! its requests at its entry (completed, they are reset to `MPI_REQUEST_NULL`) and sends
//! one [`EventKind::Arrival`] for each receive it completes: at once for `MPI_Wait` and
//! `MPI_Waitall`, which complete them all; at its return, from its flag or indices, for
//! `MPI_Test*`, `MPI_Waitany` and `MPI_Waitsome`. Only while per-call events are on:
//! nothing else needs it.

use aya_ebpf::{cty::c_void, macros::map, maps::LruHashMap};
use collector_common::{
    ArgSpec, ByteRule, CallEvent, CallState, Cookie, HandleKey, MaybeArrival, MaybeKey, PostedRecv,
    MAX_POSTED, MAX_STARTALL,
};

use crate::{
    call::{arg, emit_unnumbered, read_handle},
    decode::{each, int_arg, read},
    maps::{call_state, ROUTINE_SPECS},
};

/// Nonblocking receives not yet seen to complete. An LRU: one that is never seen to
/// complete (its completion call nested in another MPI call, or its process gone) makes
/// room for newer ones; losing one loses an arrow, never a count.
#[map]
static POSTED: LruHashMap<HandleKey, PostedRecv> = LruHashMap::with_max_entries(MAX_POSTED, 0);

/// Followed receives among the requests of each thread's completion call in progress that
/// may complete them, by (thread, index among its requests), until its return says which
/// it did. An LRU: an entry an earlier call left (a request it did not complete) is told
/// from the current call's by the call's start, and is overwritten or given up in time.
#[map]
static MAYBE: LruHashMap<MaybeKey, MaybeArrival> = LruHashMap::with_max_entries(MAX_POSTED, 0);

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

/// At the entry of a completion call (`e`, its state, with its arguments and start): a
/// wait that completes all its requests ([`ByteRule::Completes`]) sends the arrivals of
/// the followed receives among them now; a call that may complete some keeps them in
/// [`MAYBE`] for its return to tell (`after_completion`). Not inlined: completion calls
/// only.
#[inline(never)]
pub fn completing(abi: u32, spec: ArgSpec, e: &mut CallState) {
    let arrives = match ByteRule::from_u8(spec.rule) {
        ByteRule::Completes => 1,
        ByteRule::MayComplete | ByteRule::CompletesOne | ByteRule::CompletesSome => 0,
        _ => return,
    };
    e.maybe_n = 0;
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
        arrives,
        kept: 0,
    };
    // Past MAX_STARTALL requests, the rest stay followed: an arrow may be lost, never drawn
    // to a wait that did not complete its receive (a request handle is reused only once
    // its request is done, by a new request whose return replaces the entry).
    each((n as u32).min(MAX_STARTALL), wait_one, &mut w);
    e.maybe_n = w.kept;
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
    let ev = CallEvent::arrival(key.tgid, tid, routine, 0, &posted, CallEvent::UNTOLD);
    emit_unnumbered(&ev);
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
    /// it may complete some (its return tells).
    arrives: u32,
    /// Followed receives kept in [`MAYBE`] for the return to tell.
    kept: u32,
}

/// One request of a completion call (`bpf_loop`'s body): a followed receive's arrival
/// sent, or kept for the call's return to tell.
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
    let mut flags = 0;
    if w.arrives == 0 {
        let at = MaybeKey {
            tid: w.tid,
            index: i as u32,
        };
        let m = MaybeArrival {
            call_start_ns: w.start_ns,
            handle: h,
            posted,
        };
        if MAYBE.insert(at, m, 0).is_ok() {
            w.kept += 1;
            return 0;
        }
        // No room to keep it: not followed on.
        flags = CallEvent::UNTOLD;
    }
    let _ = POSTED.remove(key);
    // One the ring buffer has no room for is an arrow lost: the trace counts the receives
    // it saw posted and never arrive.
    let ev = CallEvent::arrival(w.tgid, w.tid, w.routine as u16, w.start_ns, &posted, flags);
    emit_unnumbered(&ev);
    0
}

/// After the return path of a completion call that may have completed followed receives
/// (kept in [`MAYBE`]), in the caller's stack frame: those it says it completed (its flag,
/// index or indices, read now) have arrived, sent after its own event; those it did not
/// stay followed; all are untold if it failed.
#[inline(never)]
pub fn after_completion(ret: i32) {
    let Some(e) = call_state(false) else {
        return;
    };
    // SAFETY: the thread's own state; its call has returned.
    let e = unsafe { &mut *e };
    e.maybe_n = 0;
    let c = Cookie::unpack(e.cookie);
    let Some(spec) = ROUTINE_SPECS.get(u32::from(c.routine)) else {
        return;
    };
    let mut t = Telling {
        indices: 0,
        start_ns: e.start_ns,
        tgid: e.tgid,
        tid: aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32,
        routine: u32::from(c.routine),
        first: 0,
        flags: u32::from(CallEvent::FOLLOWS_CALL),
        _pad: 0,
    };
    let all = requests(spec, &e.args).min(MAX_STARTALL);
    if ret != 0 {
        t.flags = u32::from(CallEvent::UNTOLD);
        each(all, tell_one, &mut t);
        return;
    }
    let n = completed(spec, &e.args, &mut t);
    each(n.min(MAX_STARTALL), tell_one, &mut t);
    // The receives it did not complete stay followed (in `POSTED`); their entries here go,
    // so that the map holds the calls in progress only (an entry of one evicted for room
    // would lose its arrow).
    t.indices = 0;
    t.first = 0;
    each(all, forget_one, &mut t);
}

/// One request of a completion call that returned (`bpf_loop`'s body): the call's entry
/// for it in [`MAYBE`], if any, removed.
extern "C" fn forget_one(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes `after_completion`'s context.
    let t = unsafe { &*ctx.cast::<Telling>() };
    let at = MaybeKey {
        tid: t.tid,
        index: i as u32,
    };
    // SAFETY: copied out at once.
    if unsafe { MAYBE.get(at) }.is_some_and(|m| m.call_start_ns == t.start_ns) {
        let _ = MAYBE.remove(at);
    }
    0
}

/// How many requests a completion call of `spec` was given: `MPI_Test(*a)` one,
/// `MPI_Testall(a, b[])` `a`.
#[inline(always)]
fn requests(spec: &ArgSpec, args: &[u64; collector_common::ARG_SLOTS]) -> u32 {
    match (arg(args, spec.a), arg(args, spec.b)) {
        (Some(a), Some(_)) => u32::try_from(int_arg(a)).unwrap_or(0),
        (Some(_), None) => 1,
        _ => 0,
    }
}

/// Which requests a completion call of `spec` that returned success completed, for
/// [`tell_one`] to go through (`t`, and how many): all of them if its flag (`c`) is set,
/// for `MPI_Test`/`MPI_Testall`; its index (`d`, and flag `c` where it has one) for
/// `MPI_Waitany`/`MPI_Testany`; its `*c` indices in `d` for `MPI_Waitsome`/`MPI_Testsome`.
#[inline(always)]
fn completed(spec: &ArgSpec, args: &[u64; collector_common::ARG_SLOTS], t: &mut Telling) -> u32 {
    let int_at = |i: u8| arg(args, i).and_then(read::<i32>);
    match ByteRule::from_u8(spec.rule) {
        ByteRule::MayComplete => {
            if int_at(spec.c).is_some_and(|flag| flag != 0) {
                requests(spec, args)
            } else {
                0
            }
        }
        ByteRule::CompletesOne => {
            if spec.c != collector_common::routines::NO_ARG
                && int_at(spec.c).is_none_or(|flag| flag == 0)
            {
                return 0;
            }
            // MPI_UNDEFINED (negative): none was active.
            let Some(Ok(index)) = int_at(spec.d).map(u32::try_from) else {
                return 0;
            };
            t.first = index;
            1
        }
        ByteRule::CompletesSome => {
            let (Some(count), Some(indices)) = (int_at(spec.c), arg(args, spec.d)) else {
                return 0;
            };
            t.indices = indices;
            u32::try_from(count).unwrap_or(0)
        }
        _ => 0,
    }
}

/// What [`tell_one`] reads, on the caller's stack.
#[repr(C)]
struct Telling {
    /// Address of the completed requests' indices (`int`s); 0: the requests from `first`
    /// on, in order.
    indices: u64,
    /// The completion call's `start_ns`.
    start_ns: u64,
    tgid: u32,
    tid: u32,
    routine: u32,
    first: u32,
    /// The arrivals' flags.
    flags: u32,
    _pad: u32,
}

/// One request a completion call completed (`bpf_loop`'s body): if the call kept it as a
/// followed receive, its arrival is sent.
extern "C" fn tell_one(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes `after_completion`'s context.
    let t = unsafe { &mut *ctx.cast::<Telling>() };
    let index = if t.indices == 0 {
        t.first.wrapping_add(i as u32)
    } else {
        match read::<i32>(t.indices + i * 4).map(u32::try_from) {
            Some(Ok(index)) => index,
            _ => return 1,
        }
    };
    let at = MaybeKey { tid: t.tid, index };
    // SAFETY: copied out at once.
    let Some(m) = (unsafe { MAYBE.get(at) }).copied() else {
        return 0;
    };
    if m.call_start_ns != t.start_ns {
        // Left by an earlier call.
        return 0;
    }
    let _ = MAYBE.remove(at);
    let key = HandleKey {
        tgid: t.tgid,
        _pad: 0,
        handle: m.handle,
    };
    // SAFETY: copied out at once. Another thread may have posted a receive with the
    // handle since (the request done, its handle reused): that one stays.
    if unsafe { POSTED.get(key) }.copied() != Some(m.posted) {
        return 0;
    }
    let _ = POSTED.remove(key);
    let ev = CallEvent::arrival(
        t.tgid,
        t.tid,
        t.routine as u16,
        t.start_ns,
        &m.posted,
        t.flags as u8,
    );
    emit_unnumbered(&ev);
    0
}
