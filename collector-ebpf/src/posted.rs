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
    ArgSpec, ByteRule, CallEvent, CallState, Cookie, HandleKey, MaybeArrival, PostedRecv,
    MAX_POSTED, MAX_STARTALL, MAYBE_SLOTS,
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
/// the followed receives among them now; a call that may complete some keeps up to
/// [`MAYBE_SLOTS`] of them in `e.maybe` for its return to tell (`after_completion`), the
/// rest untold. Not inlined: completion calls only.
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
        _pad: 0,
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
    _pad: u32,
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
        // The thread's state, looked up again: a map value's address cannot travel in the
        // loop's context.
        let Some(e) = call_state(false) else {
            return 0;
        };
        // SAFETY: the thread's own state, in its call's entry.
        let e = unsafe { &mut *e };
        let n = e.maybe_n as usize;
        if n < MAYBE_SLOTS {
            e.maybe[n & (MAYBE_SLOTS - 1)] = MaybeArrival {
                index: i as u32,
                _pad: 0,
                handle: h,
                posted,
            };
            e.maybe_n += 1;
            return 0;
        }
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
/// (`CallState::maybe`), in the caller's stack frame: those it says it completed (its
/// flag, index or indices, read now) have arrived, sent after its own event; those it did
/// not stay followed; all are untold if it failed.
#[inline(never)]
pub fn after_completion(ret: i32) {
    let Some(e) = call_state(false) else {
        return;
    };
    // SAFETY: the thread's own state; its call has returned.
    let e = unsafe { &mut *e };
    let n = (e.maybe_n as usize).min(MAYBE_SLOTS);
    e.maybe_n = 0;
    let c = Cookie::unpack(e.cookie);
    let Some(spec) = ROUTINE_SPECS.get(u32::from(c.routine)) else {
        return;
    };
    let done = if ret == 0 {
        completed(spec, &e.args, &e.maybe, n)
    } else {
        0
    };
    let tid = aya_ebpf::helpers::bpf_get_current_pid_tgid() as u32;
    for k in 0..MAYBE_SLOTS {
        if k >= n {
            break;
        }
        let m = e.maybe[k];
        let flags = if ret != 0 {
            CallEvent::UNTOLD
        } else if done & (1 << k) != 0 {
            CallEvent::FOLLOWS_CALL
        } else {
            continue;
        };
        let key = HandleKey {
            tgid: e.tgid,
            _pad: 0,
            handle: m.handle,
        };
        // SAFETY: copied out at once. Another thread may have posted a receive with the
        // handle since (the request done, its handle reused): that one stays.
        if unsafe { POSTED.get(key) }.copied() != Some(m.posted) {
            continue;
        }
        let _ = POSTED.remove(key);
        let ev = CallEvent::arrival(e.tgid, tid, c.routine, e.start_ns, &m.posted, flags);
        emit_unnumbered(&ev);
    }
}

/// Which of the `n` kept receives (`maybe`) a completion call of `spec` that returned
/// success completed, as bits: its flag (`c`) for `MPI_Test`/`MPI_Testall`; its index
/// (`d`, and flag `c` where it has one) for `MPI_Waitany`/`MPI_Testany`; its `*c`
/// indices in `d` for `MPI_Waitsome`/`MPI_Testsome`.
#[inline(always)]
fn completed(
    spec: &ArgSpec,
    args: &[u64; collector_common::ARG_SLOTS],
    maybe: &[MaybeArrival; MAYBE_SLOTS],
    n: usize,
) -> u32 {
    let int_at = |i: u8| arg(args, i).and_then(read::<i32>);
    let all = (1u32 << n) - 1;
    match ByteRule::from_u8(spec.rule) {
        ByteRule::MayComplete => {
            if int_at(spec.c).is_some_and(|flag| flag != 0) {
                all
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
            let Some(index) = int_at(spec.d) else {
                return 0;
            };
            let mut done = 0;
            for (k, m) in maybe.iter().enumerate() {
                if k < n && m.index as i32 == index {
                    done |= 1 << k;
                }
            }
            done
        }
        ByteRule::CompletesSome => {
            let (Some(count), Some(indices)) = (int_at(spec.c), arg(args, spec.d)) else {
                return 0;
            };
            if count <= 0 {
                return 0;
            }
            let mut s = Listed {
                indices,
                wanted: [0; MAYBE_SLOTS],
                n: n as u32,
                done: 0,
            };
            for (k, m) in maybe.iter().enumerate() {
                s.wanted[k] = m.index;
            }
            each((count as u32).min(MAX_STARTALL), listed_one, &mut s);
            s.done
        }
        _ => 0,
    }
}

/// What [`listed_one`] reads, on the caller's stack.
#[repr(C)]
struct Listed {
    /// Address of the completed requests' indices (`int`s).
    indices: u64,
    /// The kept receives' indices.
    wanted: [u32; MAYBE_SLOTS],
    /// How many of `wanted` are set.
    n: u32,
    /// Bits of `wanted` found among the indices.
    done: u32,
}

/// One completed request's index (`bpf_loop`'s body): which kept receive it is.
extern "C" fn listed_one(j: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes `completed`'s context.
    let s = unsafe { &mut *ctx.cast::<Listed>() };
    let Some(index) = read::<i32>(s.indices + j * 4) else {
        return 1;
    };
    for k in 0..MAYBE_SLOTS {
        if (k as u32) < s.n && s.wanted[k] as i32 == index {
            s.done |= 1 << k;
        }
    }
    0
}
