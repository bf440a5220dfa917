//! Point-to-point calls at return: bytes by the routine's rule, and the per-peer counters
//! (who sent how much to whom: the communication matrix).

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    macros::map,
    maps::{HashMap, PerCpuHashMap},
};
use collector_common::{
    comm_id, routines::NO_ARG, shares::SharedMap, Abi, ArgSpec, ByteRule, CallEvent, CommInfo,
    PeerKey, PeerVal, ARG_SLOTS, MAX_FOLDED_PEERS, MAX_PEER_COUNTERS,
};

use crate::{
    call::Call,
    counters::add_atomic,
    decode::{
        comm_info, handle, int_arg, shared_comm_id, status_bytes, status_ignored, status_source,
        status_tag,
    },
    maps::add_proc_stat,
};

/// Calls and bytes per process, communicator, peer and direction (allocated as keys come,
/// see `maps::DEVICE_TIME`).
#[map]
pub static PEERS: PerCpuHashMap<PeerKey, PeerVal> =
    PerCpuHashMap::with_max_entries(MAX_PEER_COUNTERS, BPF_F_NO_PREALLOC);

/// `PEERS`' counters of freed communicators, moved here by userspace to make room there:
/// never touched by a program, a map of this object so that it is pinned and kept across
/// a daemon's restart with `PEERS`.
#[map]
pub static PEERS_FOLDED: HashMap<PeerKey, PeerVal> =
    HashMap::with_max_entries(MAX_FOLDED_PEERS, BPF_F_NO_PREALLOC);

/// Bytes of a point-to-point call by `rule`, and its traffic counted per peer.
///
/// A function of its own (a BPF-to-BPF call): inlined into the return program, the
/// verifier found a register read after a helper call had clobbered it.
#[inline(never)]
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "takes the routine's spec as the other return rules do"
)]
pub fn on_return(c: &Call, spec: &ArgSpec, rule: ByteRule, comm_key: u64) -> Option<u64> {
    if !moves_bytes(rule) {
        // A probe (`MPI_Iprobe` in a polling loop): no traffic, and no rank to look up.
        return Some(0);
    }
    // This process's rank in the communicator, which places its peers' ranks there on
    // world ranks, and the communicator's generation (looked up here: a fifth argument
    // reshaped the code around the call into something the verifier refused). The
    // world's counters need neither.
    let (me, gen) = if comm_key == PeerKey::WORLD {
        (PeerKey::ANY, 0)
    } else {
        // Not learnt (its size unknown, or past the user's share): the handle's generation
        // now, which is the live communicator's all the same (a live one's traffic never
        // reads as a freed one's).
        match comm_info(c.abi, c.layout, c.tgid, comm_key) {
            Some(i) => (i.rank, i.gen),
            None => (
                PeerKey::ANY,
                crate::generations::comm_gen(c.tgid, comm_key) as u16,
            ),
        }
    };
    let comm_key = (comm_key, me, gen);
    let null = Abi::proc_null(c.abi);
    // A peer of MPI_PROC_NULL: nothing crosses the network.
    let is_null = |i: u8| null.is_some_and(|n| c.arg(i).map(int_arg) == Some(n));
    match rule {
        ByteRule::CountType
        | ByteRule::RecvPosted
        | ByteRule::LargeCountType
        | ByteRule::LargeRecvPosted => {
            if is_null(spec.peer) {
                return Some(0);
            }
            let bytes = c.count_type_by(spec.a, spec.b, rule)?;
            let dir = if matches!(rule, ByteRule::RecvPosted | ByteRule::LargeRecvPosted) {
                PeerKey::RECEIVED
            } else {
                PeerKey::SENT
            };
            add(c, comm_key, peer(c, spec.peer, None), dir, bytes);
            Some(bytes)
        }
        ByteRule::RecvStatus | ByteRule::LargeRecvStatus => {
            if is_null(spec.peer) {
                return Some(0);
            }
            let status = c.arg(spec.c).unwrap_or(0);
            let known = !status_ignored(c.abi, status);
            let bytes = if known {
                status_bytes(c.abi, status)?
            } else {
                c.count_type_by(spec.a, spec.b, rule)?
            };
            let status = known.then_some(status);
            add(
                c,
                comm_key,
                peer(c, spec.peer, status),
                PeerKey::RECEIVED,
                bytes,
            );
            Some(bytes)
        }
        ByteRule::Pair | ByteRule::LargePair | ByteRule::PairPosted | ByteRule::LargePairPosted => {
            // Sendrecv and Sendrecv_replace both end (source, recvtag, comm, status); their
            // nonblocking forms (source, recvtag, comm, request): no status yet.
            let posted = matches!(rule, ByteRule::PairPosted | ByteRule::LargePairPosted);
            let source = spec.comm.wrapping_sub(2);
            let sent = if is_null(spec.peer) {
                0
            } else {
                let b = c.count_type_by(spec.a, spec.b, rule)?;
                add(c, comm_key, peer(c, spec.peer, None), PeerKey::SENT, b);
                b
            };
            let received = if is_null(source) {
                0
            } else {
                let b = c.count_type_by(spec.c, spec.d, rule)?;
                let status = c
                    .arg(spec.comm.wrapping_add(1))
                    .filter(|s| !posted && !status_ignored(c.abi, *s));
                add(c, comm_key, peer(c, source, status), PeerKey::RECEIVED, b);
                b
            };
            Some(sent + received)
        }
        _ => Some(0),
    }
}

/// Whether a point-to-point rule moves bytes to or from a peer (counted per peer).
#[inline(always)]
fn moves_bytes(rule: ByteRule) -> bool {
    matches!(
        rule,
        ByteRule::CountType
            | ByteRule::RecvPosted
            | ByteRule::LargeCountType
            | ByteRule::LargeRecvPosted
            | ByteRule::RecvStatus
            | ByteRule::LargeRecvStatus
            | ByteRule::Pair
            | ByteRule::LargePair
            | ByteRule::PairPosted
            | ByteRule::LargePairPosted
    )
}

/// What pairs a point-to-point call with its partner on a timeline: the peer and tag of
/// each half, wildcards resolved from the status where the call has one (both sends and
/// receives take `(..., peer, tag, comm ...)`; Sendrecv's receiving half ends
/// `(source, recvtag, comm, status)`).
#[inline(always)]
pub fn describe_match(ev: &mut CallEvent, c: &Call, spec: &ArgSpec) {
    use ByteRule as B;
    let rule = ByteRule::from_u8(spec.rule);
    if spec.peer == NO_ARG || !moves_bytes(rule) {
        return;
    }
    let null = Abi::proc_null(c.abi);
    let status_at = |i: u8| Some(arg_at(c.args, i)).filter(|s| !status_ignored(c.abi, *s));
    // MPI_PROC_NULL: no message; another negative is a wildcard, resolved by the status.
    let resolve = |peer: i32, tag: i32, status: Option<u64>| {
        if Some(peer) == null {
            return (CallEvent::PEER_NONE, tag);
        }
        let (peer, tag) = match status {
            Some(s) if peer < 0 || tag < 0 => (
                if peer < 0 {
                    status_source(c.abi, s).unwrap_or(peer)
                } else {
                    peer
                },
                if tag < 0 {
                    status_tag(c.abi, s).unwrap_or(tag)
                } else {
                    tag
                },
            ),
            _ => (peer, tag),
        };
        (if peer < 0 { CallEvent::PEER_ANY } else { peer }, tag)
    };
    let tag = int_arg(arg_at(c.args, spec.peer + 1));
    match rule {
        B::RecvStatus | B::LargeRecvStatus => {
            (ev.peer, ev.tag) = resolve(ev.peer, tag, status_at(spec.c));
        }
        B::Pair | B::LargePair | B::PairPosted | B::LargePairPosted => {
            ev.tag = tag;
            // The sending half's MPI_PROC_NULL reads as no message, as a receive's does
            // (Open MPI's is -2).
            if Some(ev.peer) == null {
                ev.peer = CallEvent::PEER_NONE;
            }
            let source = int_arg(arg_at(c.args, spec.comm.wrapping_sub(2)));
            let rtag = int_arg(arg_at(c.args, spec.comm.wrapping_sub(1)));
            // The nonblocking forms have a request there, and no status yet.
            let status = if matches!(rule, B::Pair | B::LargePair) {
                status_at(spec.comm + 1)
            } else {
                None
            };
            (ev.recv_peer, ev.recv_tag) = resolve(source, rtag, status);
        }
        _ => (ev.peer, ev.tag) = resolve(ev.peer, tag, None),
    }
}

/// Argument `i` (0 past the slots), read in a function of its own: inlined, LLVM dropped
/// the mask that bounds an index computed from another one (`comm + 1`), and the verifier
/// refused the read.
#[inline(never)]
fn arg_at(args: &[u64; ARG_SLOTS], i: u8) -> u64 {
    args[usize::from(i) & (ARG_SLOTS - 1)]
}

/// The communicator as the per-peer counters key it: the world, or the local handle.
#[inline(always)]
pub fn comm_key(c: &Call, spec: &ArgSpec, comm: Option<CommInfo>) -> u64 {
    let h = c.arg(spec.comm).map_or(0, |h| handle(c.abi, h));
    if shared_comm_id(c.abi, h, comm) == comm_id::WORLD {
        PeerKey::WORLD
    } else {
        h
    }
}

/// The peer rank in argument `i`; a wildcard source is taken from the status where there
/// is one.
#[inline(always)]
fn peer(c: &Call, i: u8, status: Option<u64>) -> i32 {
    let Some(p) = c.arg(i).map(int_arg) else {
        return PeerKey::ANY;
    };
    if p >= 0 {
        return p;
    }
    // MPI_ANY_SOURCE (the only other negative a valid call passes here).
    status
        .and_then(|s| status_source(c.abi, s))
        .filter(|s| *s >= 0)
        .unwrap_or(PeerKey::ANY)
}

#[inline(always)]
fn add(c: &Call, (comm, me, gen): (u64, i32, u16), peer: i32, dir: u16, bytes: u64) {
    let key = PeerKey {
        tgid: c.tgid,
        peer,
        comm,
        dir,
        gen,
        me,
    };
    add_traffic(c.tgid, &key, bytes);
}

/// One call's `bytes` to or from the peer of `key`, in process `tgid`'s counters.
#[inline(always)]
pub(crate) fn add_traffic(tgid: u32, key: &PeerKey, bytes: u64) {
    if let Some(v) = PEERS.get_ptr_mut(key) {
        // SAFETY: this CPU's value.
        unsafe { add_to_peer(v, bytes) };
    } else if !new_peer(tgid, key, bytes) {
        add_proc_stat(tgid, 1, |s| &mut s.peers_full);
    }
}

/// Adds `key`'s entry with its first call, charged to the process's user; whether it was
/// counted (not past the user's share, nor the map full).
#[inline(always)]
fn new_peer(tgid: u32, key: &PeerKey, bytes: u64) -> bool {
    if crate::shares::charge(tgid, SharedMap::Peers as u32) == 0 {
        return false;
    }
    let first = PeerVal { calls: 1, bytes };
    if PEERS.insert(key, first, u64::from(BPF_NOEXIST)).is_ok() {
        return true;
    }
    // Another CPU added it first (and was charged for it): this CPU's value is there too.
    let _ = crate::shares::uncharge(tgid, SharedMap::Peers as u32);
    let Some(v) = PEERS.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: this CPU's value.
    unsafe { add_to_peer(v, bytes) };
    true
}

/// Adds a call of `bytes` to this CPU's value `v`, atomically: another thread of the
/// process may count the same peer on this CPU while this program is preempted (see
/// `maps::with_proc_stats`).
///
/// # Safety
/// `v` must point at this CPU's value of [`PEERS`].
#[inline(always)]
unsafe fn add_to_peer(v: *mut PeerVal, bytes: u64) {
    // SAFETY: as the caller promises.
    unsafe {
        add_atomic(core::ptr::addr_of_mut!((*v).calls), 1);
        add_atomic(core::ptr::addr_of_mut!((*v).bytes), bytes);
    }
}
