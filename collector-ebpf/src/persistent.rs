//! Persistent requests: what each start moves is learnt at the request's creation
//! (`MPI_Send_init`, `MPI_Recv_init`, `MPI_Allreduce_init` ...) and counted at each
//! `MPI_Start` / `MPI_Startall`, with a point-to-point request's traffic per peer.

use aya_ebpf::{cty::c_void, macros::map, maps::HashMap};
use collector_common::{
    comm_id, routines::class, Abi, ArgSpec, ByteRule, Cookie, HandleKey, PeerKey, PersistentOp,
    MAX_PERSISTENT, MAX_STARTALL,
};

use crate::{
    call::{read_handle, Call},
    decode::{comm_info, each, handle, int_arg, shared_comm_id, UNDECODED},
    maps::{call_state, LAYOUTS, ROUTINE_SPECS},
};

/// Requests learnt per process, each charged to its user (`shares`): given back at
/// `MPI_Request_free`, or when userspace forgets the process. Not an LRU: another user's
/// new requests would push this user's out.
#[map]
pub static PERSISTENT: HashMap<HandleKey, PersistentOp> =
    HashMap::with_max_entries(MAX_PERSISTENT, 0);

/// Whether a persistent point-to-point request's creation names `MPI_PROC_NULL` as its
/// peer (argument `c`; other routines have none there). Not inlined: the return
/// program's stack frame has no room left.
#[inline(never)]
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "takes the routine's spec as the other return rules do"
)]
pub fn peer_is_null(c: &Call, spec: &ArgSpec) -> bool {
    spec.class == class::PERSISTENT
        && c.arg(spec.c)
            .map(int_arg)
            .is_some_and(|p| Abi::proc_null(c.abi) == Some(p))
}

/// After the return path, in the program's own stack frame: remembers the request a
/// persistent creation returned (`ret`: its return value), if one is pending.
#[inline(always)]
pub fn after_return<const ABI: u8>(ret: i32) {
    let Some(e) = call_state(false) else {
        return;
    };
    // SAFETY: the thread's own state; its call has returned.
    let e = unsafe { &mut *e };
    let pending = e.persistent_pending;
    if pending == 0 {
        return;
    }
    e.persistent_pending = 0;
    let c = Cookie::unpack(e.cookie);
    let (Some(spec), Some(layout)) = (
        ROUTINE_SPECS.get(u32::from(c.routine)),
        LAYOUTS.get(u32::from(c.layout)),
    ) else {
        return;
    };
    let call = Call {
        abi: ABI,
        layout,
        tgid: e.tgid,
        args: &e.args,
        ret,
        cache: core::ptr::addr_of_mut!(e.cache),
    };
    on_init(&call, spec, pending - 1);
}

/// At a persistent request's creation, after its return: remembers what each start of it
/// moves, `bytes` (by the creating routine's rule), to or from the peer in argument `c` of
/// a point-to-point one. Not inlined: once per creation.
#[inline(never)]
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "takes the routine's spec as the other return rules do"
)]
fn on_init(c: &Call, spec: &ArgSpec, bytes: u64) {
    if c.ret != 0 || spec.class != class::PERSISTENT {
        return;
    }
    let Some(request) = c.arg(spec.d).and_then(|p| read_handle(c.abi, p)) else {
        return;
    };
    let mut peer = PeerKey::default();
    if let Some(p) = c.arg(spec.c).map(int_arg) {
        if Abi::proc_null(c.abi) != Some(p) {
            // Keyed as `p2p` keys a send's or receive's traffic: the world, or the handle
            // with this process's rank there.
            let h = c.arg(spec.comm).map_or(0, |h| handle(c.abi, h));
            let info = comm_info(c.abi, c.layout, c.tgid, h);
            let (comm, me, gen) = if shared_comm_id(c.abi, h, info) == comm_id::WORLD {
                (PeerKey::WORLD, PeerKey::ANY, 0)
            } else {
                // The handle's generation now is the live communicator's, learnt or not
                // (its size unknown, or past the user's share): its traffic never reads
                // as a freed one's.
                let gen = crate::generations::comm_gen(c.tgid, h) as u16;
                (h, info.map_or(PeerKey::ANY, |i| i.rank), gen)
            };
            peer = PeerKey {
                tgid: c.tgid,
                // MPI_ANY_SOURCE: each start's source is known only from its completion.
                peer: if p >= 0 { p } else { PeerKey::ANY },
                comm,
                dir: if spec.rule == ByteRule::RecvPosted as u8
                    || spec.rule == ByteRule::LargeRecvPosted as u8
                    || spec.rule == ByteRule::PartitionedRecv as u8
                {
                    PeerKey::RECEIVED
                } else {
                    PeerKey::SENT
                },
                gen,
                me,
            };
        }
    }
    let key = HandleKey {
        tgid: c.tgid,
        _pad: 0,
        handle: request,
    };
    crate::shares::remember_request(&key, &PersistentOp { bytes, peer });
}

/// At `MPI_Start(*a)` or `MPI_Startall(a, b[])`: the bytes its requests move (each
/// request's traffic added to its peer's counters), or [`UNDECODED`] if any was not learnt
/// (created before commtap attached, or forgotten) or there are more than it reads. The
/// requests are read in a `bpf_loop`: an unrolled loop went past the kernel's million
/// instructions.
#[inline(never)]
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "takes the routine's spec as the other return rules do"
)]
pub fn on_start(c: &Call, spec: &ArgSpec) -> u64 {
    let (n, requests) = if spec.rule == ByteRule::StartAll as u8 {
        (
            c.arg(spec.a).map_or(-1, int_arg),
            c.arg(spec.b).unwrap_or(0),
        )
    } else {
        (1, c.arg(spec.a).unwrap_or(0))
    };
    if n < 0 || n as u32 > MAX_STARTALL {
        return UNDECODED;
    }
    let mut starts = Starts {
        requests,
        total: 0,
        tgid: c.tgid,
        abi: u32::from(c.abi),
        unknown: 0,
        _pad: 0,
    };
    if each(n as u32, start_one, &mut starts) && starts.unknown == 0 {
        starts.total
    } else {
        UNDECODED
    }
}

/// What [`start_one`] reads and adds up, on the caller's stack.
#[repr(C)]
struct Starts {
    /// Address of the request array.
    requests: u64,
    /// Bytes of the requests learnt so far.
    total: u64,
    tgid: u32,
    abi: u32,
    /// 1 if a request was not learnt.
    unknown: u32,
    _pad: u32,
}

/// One request of a start (`bpf_loop`'s body): its bytes added up, its traffic counted.
extern "C" fn start_one(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes `on_start`'s context.
    let s = unsafe { &mut *ctx.cast::<Starts>() };
    let abi = s.abi as u8;
    let op = crate::decode::element_handle(abi, s.requests, i).and_then(|h| {
        let key = HandleKey {
            tgid: s.tgid,
            _pad: 0,
            handle: h,
        };
        // SAFETY: copied out at once.
        unsafe { PERSISTENT.get(key) }.copied()
    });
    match op {
        Some(op) => {
            s.total += op.bytes;
            if op.peer.tgid != 0 {
                crate::p2p::add_traffic(s.tgid, &op.peer, op.bytes);
            }
        }
        // Set, not counted: a count is a new exact value at each iteration, and the
        // verifier, which iterates the body until its states repeat, would never finish.
        None => s.unknown = 1,
    }
    0
}
