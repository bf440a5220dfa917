//! Collective instances numbered per process and communicator by the kernel, from the
//! communicator's creation (`MPI_Init` for the world), so that every member draws the same
//! instances for who-is-late (`collector_common::instances`) and a call not drawn needs no
//! event, and, where its time is sampled, no return.

use aya_ebpf::{macros::map, maps::HashMap};
use collector_common::{
    comm_id,
    instances::{INIT_SEEN, INSTANCE_BITS, MADE_SHIFT, MAX_MADE, NOT_NUMBERED},
    shares::{SharedMap, HANDLE_MAP_ENTRIES},
    Abi, HandleKey,
};

use crate::{
    decode::{comm_info, shared_comm_id},
    maps::LAYOUTS,
};

/// Per (process, communicator): the number its next collective takes (`INSTANCE_BITS`) and
/// how many communicators were made from it (above `MADE_SHIFT`), or `NOT_NUMBERED`; under
/// the handle `INIT_SEEN`, that the process's `MPI_Init` returned while watched and
/// its world has not been met yet.
#[map]
pub static COLL_SEQ: HashMap<HandleKey, u64> = HashMap::with_max_entries(HANDLE_MAP_ENTRIES, 0);

#[inline(always)]
fn key(tgid: u32, handle: u64) -> HandleKey {
    HandleKey {
        tgid,
        _pad: 0,
        handle,
    }
}

/// At a collective's entry on communicator `h` (normalised): its instance number plus one,
/// or 0 where the communicator is not numbered.
#[inline(always)]
pub fn number(abi: u8, layout: u8, tgid: u32, h: u64) -> u64 {
    if h == INIT_SEEN {
        // No communicator (or one unreadable): not the marker's to count.
        return 0;
    }
    if let Some(p) = COLL_SEQ.get_ptr_mut(key(tgid, h)) {
        // SAFETY: a map value. The process's threads count here, one collective at a time
        // on a communicator (MPI's rule), so no atomic add (which this BPF target cannot
        // return the old value of); userspace writes it only to stop the count
        // (`Probes::stop_numbering`), which a count in flight may undo (where events went
        // off, it sweeps again before they come back on).
        unsafe {
            let v = core::ptr::read_volatile(p);
            if v == NOT_NUMBERED {
                return 0;
            }
            core::ptr::write_volatile(p, v + 1);
            return (v & INSTANCE_BITS) + 1;
        }
    }
    first_met(u32::from(abi), u32::from(layout), tgid, h)
}

/// A communicator's first collective since the process was watched, where it has no entry:
/// the world, if the process's `MPI_Init` was seen, is numbered from here (this call is
/// instance 0); any other is not numbered (made before the watch, while call events were
/// off, by a constructor not followed, or its entry refused by a full map), and userspace
/// numbers its calls, which then all come. A global function: the verifier checks it once,
/// not in every state of each entry.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn first_met(abi: u32, layout: u32, tgid: u32, h: u64) -> u64 {
    let abi = abi as u8;
    let info = if abi == Abi::OpenMpi as u8 {
        LAYOUTS.get(layout).and_then(|l| comm_info(abi, l, tgid, h))
    } else {
        None
    };
    let marker = key(tgid, INIT_SEEN);
    // SAFETY: plain value.
    let world = abi != Abi::Nccl as u8
        && shared_comm_id(abi, h, info) == comm_id::WORLD
        && unsafe { COLL_SEQ.get(marker) }.is_some();
    if world {
        crate::shares::forget(SharedMap::CollSeq, &marker);
        u64::from(crate::shares::remember_word(
            SharedMap::CollSeq,
            &key(tgid, h),
            1,
        ))
    } else {
        crate::shares::remember_word(SharedMap::CollSeq, &key(tgid, h), NOT_NUMBERED);
        0
    }
}

/// A constructor on communicator `parent` (normalised; `world`: the world) returned in
/// process `tgid`: the new communicator's place among those the process made from
/// `parent`, or -1 where the parent was not counted from its creation (`MPI_Init` for
/// the world), whose earlier children the kernel did not see. Every member of the parent
/// calls its constructors in the same order (and one at a time: they are collective on
/// it), so every member's count, in whichever commtap watched it since, names the child
/// alike; one a daemon kept would start again at its restart.
#[inline(always)]
pub fn child_made(tgid: u32, parent: u64, world: bool) -> i32 {
    if parent == INIT_SEEN {
        return -1;
    }
    if let Some(p) = COLL_SEQ.get_ptr_mut(key(tgid, parent)) {
        // SAFETY: a map value, counted as `number` counts (the constructor is the
        // communicator's one collective in progress).
        unsafe {
            let v = core::ptr::read_volatile(p);
            let made = v >> MADE_SHIFT;
            if v == NOT_NUMBERED || made >= MAX_MADE {
                return -1;
            }
            core::ptr::write_volatile(p, v + (1 << MADE_SHIFT));
            return made as i32;
        }
    }
    // The world's first use since `MPI_Init`: numbered from here, as `first_met` would.
    let marker = key(tgid, INIT_SEEN);
    // SAFETY: plain value.
    if world && unsafe { COLL_SEQ.get(marker) }.is_some() {
        crate::shares::forget(SharedMap::CollSeq, &marker);
        if crate::shares::remember_word(SharedMap::CollSeq, &key(tgid, parent), 1 << MADE_SHIFT) {
            return 0;
        }
        return -1;
    }
    // Not numbered for good, as `first_met` would say: a later first use (the world's, told
    // then) must not count from there, having missed this one. Where the user's share
    // holds no entry for that, the world's count is given up (`MPI_Init`'s mark goes).
    if !crate::shares::remember_word(SharedMap::CollSeq, &key(tgid, parent), NOT_NUMBERED) {
        crate::shares::forget(SharedMap::CollSeq, &marker);
    }
    -1
}

/// `MPI_Init` returned in process `tgid` while it was watched: its world's collectives are
/// numbered from the first.
#[inline(always)]
pub fn init_returned(tgid: u32) {
    crate::shares::remember_word(SharedMap::CollSeq, &key(tgid, INIT_SEEN), 0);
}

/// Communicator `h` (normalised) was made: numbered from its first collective. (A handle
/// freed and reused starts again.)
#[inline(always)]
pub fn made(tgid: u32, h: u64) {
    if h != INIT_SEEN {
        crate::shares::remember_word(SharedMap::CollSeq, &key(tgid, h), 0);
    }
}

/// Communicator `h` (normalised) is freed.
#[inline(always)]
pub fn freed(tgid: u32, h: u64) {
    crate::shares::forget(SharedMap::CollSeq, &key(tgid, h));
}
