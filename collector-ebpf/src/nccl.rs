//! NCCL's return program: bytes by nccl-tests' conventions, communicator identity from the
//! calls that create, split, query and destroy communicators, groups, and device time.
//!
//! NCCL calls only enqueue work: the time counted per call is the host-side enqueue time.
//! Device time comes from the host's own waits for the GPU (`cudaStreamSynchronize` & co,
//! probed with this program too): the time from the enqueue of the operations since the
//! thread's last wait to that wait's return bounds their completion. It is kept per
//! operation key when all the window's operations share one key, as in nccl-tests' timed
//! loops and training steps that synchronise after their collective.

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use collector_common::{
    nccl,
    routines::{class, NCCL_GROUP},
    shares::SharedMap,
    size_bucket, ArgSpec, ByteRule, CallEvent, CallState, CommInfo, CounterKey, EventKind,
    HandleKey,
};

use crate::{
    call::{call_events_on, emit_unnumbered, learn_comm, Call},
    counters::{add, add_hashed},
    decode::{int_arg, read},
    maps::{add_proc_stat, DEVICE_TIME},
};

/// Largest `ncclCommInitAll` clique whose communicators are learnt.
const MAX_INIT_ALL: u32 = 16;

/// Most receives one network `irecv` posts (NCCL's IB transport groups up to 8).
const MAX_NET_RECVS: u32 = 8;

/// Applies an NCCL routine's byte rule and its communicator bookkeeping at return.
#[inline(always)]
pub(crate) fn on_return(c: &Call, spec: &ArgSpec, comm: Option<CommInfo>) -> Option<u64> {
    let nranks = comm.map(|c| c.size).filter(|&n| n > 0);
    let ok = c.ret == 0;
    match ByteRule::from_u8(spec.rule) {
        ByteRule::CountType => c.count_type(spec.a, spec.b),
        ByteRule::CountTypeTimesP => Some(c.count_type(spec.a, spec.b)? * u64::from(nranks?)),
        ByteRule::NcclCommInit if ok => {
            learn_init(c, spec);
            Some(0)
        }
        ByteRule::NcclCommInitAll if ok => {
            learn_init_all(c, spec);
            Some(0)
        }
        ByteRule::NcclCommSplit if ok => {
            learn_split(c, spec, comm);
            Some(0)
        }
        ByteRule::NcclCommFree => {
            crate::shares::forget(SharedMap::Comms, &key(c, c.arg(spec.a)?));
            Some(0)
        }
        rule @ (ByteRule::CommSize | ByteRule::CommRank) if ok => {
            learn_comm(c, spec, rule);
            Some(0)
        }
        ByteRule::NetIsend => c.arg(spec.a),
        ByteRule::NetIrecv => sum_sizes(c.arg(spec.b)?, int_arg(c.arg(spec.a)?)),
        _ => Some(0),
    }
}

/// Whether a network transport call posted nothing: NCCL calls `isend`/`irecv` again
/// until the transport takes the message (`*request` set), so a NULL request is a retry,
/// not an operation.
#[inline(always)]
pub(crate) fn unposted(c: &Call, spec: &ArgSpec) -> bool {
    matches!(
        ByteRule::from_u8(spec.rule),
        ByteRule::NetIsend | ByteRule::NetIrecv
    ) && c.arg(spec.d).and_then(read::<u64>).unwrap_or(0) == 0
}

/// Sum of the `n` `size_t`s at `sizes` (`None` beyond `MAX_NET_RECVS`).
#[inline(always)]
fn sum_sizes(sizes: u64, n: i32) -> Option<u64> {
    if n <= 0 || n as u32 > MAX_NET_RECVS {
        return None;
    }
    let mut total = 0u64;
    for i in 0..MAX_NET_RECVS {
        if i >= n as u32 {
            break;
        }
        total += read::<u64>(sizes + u64::from(i) * 8)?;
    }
    Some(total)
}

#[inline(always)]
fn key(c: &Call, handle: u64) -> HandleKey {
    HandleKey {
        tgid: c.tgid,
        _pad: 0,
        handle,
    }
}

/// `ncclCommInitRank*`: the new communicator's size, rank and unique id.
#[inline(always)]
fn learn_init(c: &Call, spec: &ArgSpec) {
    let Some(comm) = c.arg(spec.a).and_then(read::<u64>) else {
        return;
    };
    let (Some(size), Some(rank)) = (c.arg(spec.b), c.arg(spec.c)) else {
        return;
    };
    let words: [u64; nccl::ID_WORDS] = if spec.d >= 6 {
        // By value: the saved stack arguments are its first words.
        [
            c.args[6], c.args[7], c.args[8], c.args[9], c.args[10], c.args[11],
        ]
    } else {
        c.arg(spec.d)
            .and_then(read::<[u64; nccl::ID_WORDS]>)
            .unwrap_or([0; nccl::ID_WORDS])
    };
    let mut id = nccl::SEED;
    for w in words {
        id = nccl::mix(id, w);
    }
    let size = int_arg(size);
    if comm == 0 || size <= 0 {
        return;
    }
    crate::shares::remember_comm(
        &key(c, comm),
        &CommInfo::new(size as u32, int_arg(rank), id),
    );
}

/// `ncclCommInitAll(comms, n, devs)`: one process holds every rank; the clique's identity
/// is its first communicator's address in this process.
#[inline(always)]
fn learn_init_all(c: &Call, spec: &ArgSpec) {
    let (Some(comms), Some(n)) = (c.arg(spec.a), c.arg(spec.b)) else {
        return;
    };
    let n = int_arg(n);
    if n <= 0 || n as u32 > MAX_INIT_ALL {
        return;
    }
    let Some(first) = read::<u64>(comms) else {
        return;
    };
    let id = nccl::mix(nccl::mix(nccl::SEED, first), u64::from(c.tgid));
    for i in 0..MAX_INIT_ALL {
        if i >= n as u32 {
            break;
        }
        if let Some(h) = read::<u64>(comms + u64::from(i) * 8) {
            let info = CommInfo::new(n as u32, i as i32, id);
            crate::shares::remember_comm(&key(c, h), &info);
        }
    }
}

/// `ncclCommSplit`: the new communicator's identity is its parent's, the parent's split
/// sequence number and the color, the same in every member; its size is unknown until the
/// program asks `ncclCommCount`.
#[inline(always)]
fn learn_split(c: &Call, spec: &ArgSpec, parent: Option<CommInfo>) {
    let Some(new) = c.arg(spec.d).and_then(read::<u64>) else {
        return;
    };
    let (Some(parent_handle), Some(color)) = (c.arg(spec.comm), c.arg(spec.b)) else {
        return;
    };
    let Some(mut p) = parent else {
        // Parent unknown (created before attach): the new communicator is unknown too.
        if new != 0 {
            crate::shares::remember_comm(&key(c, new), &CommInfo::new(0, -1, 0));
        }
        return;
    };
    let seq = p.splits;
    p.splits += 1;
    crate::shares::remember_comm(&key(c, parent_handle), &p);
    // NCCL_SPLIT_NOCOLOR: this process is in no new communicator.
    if new == 0 {
        return;
    }
    let id = if p.id == 0 {
        0
    } else {
        nccl::mix(
            nccl::mix(p.id, u64::from(seq)),
            u64::from(int_arg(color) as u32),
        )
    };
    crate::shares::remember_comm(&key(c, new), &CommInfo::new(0, -1, id));
}

/// Bookkeeping after a counted NCCL call: opens and closes groups, adds operations to the
/// open group, and keeps the thread's device-time window (see `DEVICE_TIME`): operations
/// outside groups, and completed groups, join it; a host wait for the GPU ends it.
#[inline(always)]
pub(crate) fn after_call(
    e: &mut CallState,
    spec: &ArgSpec,
    key: &CounterKey,
    bytes: u64,
    start: u64,
    now: u64,
    ret: i32,
) {
    let tgid = key.tgid;
    match ByteRule::from_u8(spec.rule) {
        ByteRule::GroupStart => {
            if e.group_depth == 0 {
                e.group_start_ns = start;
                e.group_bytes = 0;
                e.group_ops = 0;
            }
            e.group_depth += 1;
        }
        ByteRule::GroupEnd => {
            if e.group_depth == 0 {
                return;
            }
            e.group_depth -= 1;
            if e.group_depth != 0 {
                return;
            }
            let b = e.group_bytes;
            let ops = u64::from(e.group_ops);
            let group = CounterKey {
                tgid,
                routine: NCCL_GROUP,
                parent: CounterKey::NO_PARENT,
                comm_size: 0,
                comm_rank: 0,
                object: 0,
                bucket: size_bucket(b),
                flags: 0,
                _pad: [0; 6],
            };
            let group_start = e.group_start_ns;
            add(e, &group, b, now.saturating_sub(group_start));
            add_proc_stat(tgid, ops, |s| &mut s.group_ops);
            join_window(e, &group, b, group_start);
        }
        ByteRule::DeviceSync => {
            if e.win_ops == 0 {
                return;
            }
            let attributed = e.win_mixed == 0 && ret == 0;
            if attributed {
                let k = e.win_key;
                add_hashed(
                    &DEVICE_TIME,
                    &k,
                    u64::from(e.win_ops),
                    e.win_bytes,
                    now.saturating_sub(e.win_start_ns),
                );
            } else {
                add_proc_stat(tgid, 1, |s| &mut s.mixed_windows);
            }
            if call_events_on() {
                emit_window(e, now, attributed);
            }
            e.win_ops = 0;
        }
        _ => {
            if spec.class != class::COLLECTIVE && spec.class != class::P2P {
                return;
            }
            if e.group_depth != 0 {
                e.group_ops += 1;
                e.group_bytes += bytes;
            } else {
                join_window(e, key, bytes, start);
            }
        }
    }
}

/// Sends the thread's device-time window, ending `now`, for timelines.
#[inline(always)]
fn emit_window(e: &CallState, now: u64, attributed: bool) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let k = &e.win_key;
    let ev = CallEvent {
        kind: EventKind::DeviceWindow as u32,
        tgid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        routine: k.routine,
        bucket: size_bucket(e.win_bytes),
        flags: if attributed {
            0
        } else {
            CallEvent::NOT_ATTRIBUTED
        },
        peer: -1,
        comm_size: k.comm_size,
        start_ns: e.win_start_ns,
        dur_ns: now.saturating_sub(e.win_start_ns),
        bytes: e.win_bytes,
        comm_id: k.object,
        comm_rank: k.comm_rank,
        ..CallEvent::default()
    };
    if !emit_unnumbered(&ev) {
        add_proc_stat(ev.tgid, 1, |s| &mut s.windows_dropped);
    }
}

/// Adds an operation (or a completed group) entered at `start` to the device-time window.
#[inline(always)]
fn join_window(e: &mut CallState, key: &CounterKey, bytes: u64, start: u64) {
    if e.win_ops == 0 {
        e.win_start_ns = start;
        e.win_key = *key;
        e.win_bytes = 0;
        e.win_mixed = 0;
    } else if e.win_key.routine != key.routine
        || e.win_key.bucket != key.bucket
        || e.win_key.comm_size != key.comm_size
        || e.win_key.object != key.object
    {
        e.win_mixed = 1;
    }
    e.win_ops += 1;
    e.win_bytes += bytes;
}
