//! The per-thread cache of decoded MPI handles (`collector_common::HandleCache`) and the
//! global generation that invalidates it when a handle may have changed meaning.

use aya_ebpf::{macros::map, maps::Array};
use collector_common::{CommInfo, HandleCache};

/// The handle generation (index 0): bumped by every datatype or communicator free, every
/// communicator size or rank learnt, every exec of a watched process, and by userspace
/// when it detaches a process or frees counter slots.
#[map]
pub static HANDLE_GEN: Array<u64> = Array::with_max_entries(1, 0);

/// The generation caches are stamped with now (never 0: a zeroed cache is invalid). A
/// stale read only makes a cache look valid for the generation it was filled in, which the
/// bump ordering keeps safe (frees bump both before and after the handle goes).
#[inline(always)]
pub fn stamp() -> u64 {
    crate::maps::generation(&HANDLE_GEN)
}

/// Invalidates every thread's cache.
#[inline(always)]
pub fn bump() {
    crate::maps::advance(&HANDLE_GEN);
}

/// The cache, emptied first if it is from an older generation.
#[inline(always)]
pub fn current(cache: *mut HandleCache) -> &'static mut HandleCache {
    // SAFETY: the calling thread's own task storage, alive for the whole program run.
    let c = unsafe { &mut *cache };
    let now = stamp();
    if c.gen != now {
        c.gen = now;
        c.types = [0; 2];
        c.comm = 0;
        c.counter_slots = [0; collector_common::COUNTER_CACHE];
    }
    c
}

/// Size of datatype `h`, from the cache or from `decode` (remembered when known).
#[inline(always)]
pub fn type_size(
    cache: *mut HandleCache,
    h: u64,
    decode: impl FnOnce() -> Option<u64>,
) -> Option<u64> {
    if h == 0 {
        return decode();
    }
    let c = current(cache);
    if c.types[0] == h {
        return Some(c.type_sizes[0]);
    }
    if c.types[1] == h {
        return Some(c.type_sizes[1]);
    }
    let size = decode()?;
    let slot = (c.next_type & 1) as usize;
    c.types[slot] = h;
    c.type_sizes[slot] = size;
    c.next_type = c.next_type.wrapping_add(1);
    Some(size)
}

/// What is known of communicator `h`, from the cache or from `decode` (remembered when
/// known).
#[inline(always)]
pub fn comm_info(
    cache: *mut HandleCache,
    h: u64,
    decode: impl FnOnce() -> Option<CommInfo>,
) -> Option<CommInfo> {
    if h == 0 {
        return decode();
    }
    let c = current(cache);
    if c.comm == h {
        return Some(c.comm_info);
    }
    let info = decode()?;
    c.comm = h;
    c.comm_info = info;
    Some(info)
}
