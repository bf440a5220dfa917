//! The ground-truth counters: calls, bytes and time per `CounterKey`, in a slot of an
//! array that `COUNTER_SLOTS` assigns to the key. A thread remembers the slots of the last
//! eight keys it counted (`HandleCache::counter_slot`), so a loop of calls updates its
//! counters without a map lookup: a hash lookup costs ~50 ns here, an array's is a few
//! inlined instructions.
//!
//! The array is shared by the CPUs, and added to atomically (the extremes by
//! compare-and-swap). It was a per-CPU array: 6 MiB per possible CPU (1.5 GiB on a 256-CPU
//! node) and 131,072 per-CPU allocations at every start (0.18 s). Each slot is padded to
//! 128 bytes so that two processes' counters never share a cache line. Each slot also has
//! a duration histogram in `COUNTER_DURATIONS`, added to the same way.
//!
//! A new key takes a slot from `FREE_SLOTS`, to which userspace returns (zeroed) the slots
//! of the processes it forgets, bumping the handle generation so that no thread keeps a
//! slot across its reuse; or, with none there, the next slot never handed out
//! (`NEXT_FRESH_SLOT`). Userspace used to push all 131,072 slots onto the stack at every
//! start, one bpf(2) call each (a stack has no batch update): 0.15–0.3 s of each start.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{Array, HashMap, PerCpuHashMap, Stack},
};
use collector_common::{
    duration_bucket, shares::SharedMap, CallState, CounterKey, CounterSlot, CounterVal,
    DurationHist, DURATION_BUCKETS, MAX_COUNTERS,
};

use crate::{maps::add_proc_stat, process::still_counted};

/// The slot of each counter's key in `COUNTER_VALUES`.
#[map]
pub static COUNTER_SLOTS: HashMap<CounterKey, u32> = HashMap::with_max_entries(MAX_COUNTERS, 0);

/// The counters, by slot.
#[map]
pub static COUNTER_VALUES: Array<CounterSlot> = Array::with_max_entries(MAX_COUNTERS, 0);

/// The duration histograms, by slot.
#[map]
pub static COUNTER_DURATIONS: Array<DurationHist> = Array::with_max_entries(MAX_COUNTERS, 0);

/// Slots not assigned to a key. A stack: a freed slot is the next one handed out (its
/// counters still in cache, and its reuse exercised by every test that forgets a process).
#[map]
pub static FREE_SLOTS: Stack<u32> = Stack::with_max_entries(MAX_COUNTERS, 0);

/// The first slot never handed out (every slot from it on is free).
#[map]
pub static NEXT_FRESH_SLOT: Array<u64> = Array::with_max_entries(1, 0);

/// Adds the call of the thread whose state is `e`, of `bytes` bytes, that took `dur` ns
/// (unless it is counted untimed: at its entry, `CallState::BUSY_UNTIMED`, or a drawn
/// collective instance whose time was not drawn, `CallState::INSTANCE_UNTIMED`), to the
/// counter of `key`; whether it was counted (a counter map full, or a process detached
/// meanwhile, counts nothing).
#[inline(always)]
pub fn add(e: &mut CallState, key: &CounterKey, bytes: u64, dur: u64) -> bool {
    let Some(slot) = slot_of(e, key) else {
        return false;
    };
    // Read after the slot's lookup: kept across it, it cost the return path's full stack.
    add_to_slot(slot, bytes, dur, e.counted_timed());
    true
}

/// Adds a call counted untimed at its entry (its time sampled, this call not drawn),
/// whatever call is in progress on the thread.
#[inline(always)]
pub fn add_untimed(e: &mut CallState, key: &CounterKey, bytes: u64) {
    let Some(slot) = slot_of(e, key) else {
        return;
    };
    add_to_slot(slot, bytes, 0, false);
}

/// Adds a call to the counter and histogram of `slot`. Inlined, as are `move_extreme` and
/// `add_duration`: as functions of their own, each call and return between BPF functions
/// cost the timed path more than the few instructions it moved (here the kernel's returns
/// go through its "Safe RET" thunk).
#[inline(always)]
fn add_to_slot(slot: u32, bytes: u64, dur: u64, timed: bool) {
    if let Some(s) = COUNTER_VALUES.get_ptr_mut(slot) {
        // SAFETY: fields of a map value, which every CPU changes atomically.
        unsafe {
            let v = core::ptr::addr_of_mut!((*s).val);
            add_atomic(core::ptr::addr_of_mut!((*v).calls), 1);
            // Even 0: a branch on the bytes made the verifier track them precisely back into
            // every caller, which doubled its work.
            add_atomic(core::ptr::addr_of_mut!((*v).bytes), bytes);
            if timed {
                add_atomic(core::ptr::addr_of_mut!((*v).time_ns), dur);
                move_extreme::<true>(core::ptr::addr_of_mut!((*v).min_ns), dur);
                move_extreme::<false>(core::ptr::addr_of_mut!((*v).max_ns), dur);
            } else {
                add_atomic(core::ptr::addr_of_mut!((*v).untimed), 1);
            }
        }
    }
    if timed {
        add_duration(slot, dur);
    }
}

/// Adds `v` to `*p` atomically (BPF's atomic add: its result unused, any CPU version).
///
/// # Safety
/// `p` must point into a map value (the verifier checks it).
#[inline(always)]
pub(crate) unsafe fn add_atomic(p: *mut u64, v: u64) {
    use core::intrinsics::{atomic_xadd, AtomicOrdering};
    // SAFETY: as the caller promises.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v);
    }
}

/// Compare-and-swap attempts for an extreme before giving up: each failure means another
/// CPU moved it, which only other threads of the same process counting the same key do.
const CAS_TRIES: u32 = 8;

/// Moves the extreme at `*p` to `v` if `v` is beyond it, atomically: the fastest call
/// (`LOWEST`; 0 is none yet) or the slowest.
///
/// # Safety
/// `p` must point into a map value (the verifier checks it).
#[inline(always)]
pub(crate) unsafe fn move_extreme<const LOWEST: bool>(p: *mut u64, v: u64) {
    // SAFETY: as the caller promises.
    let mut cur = unsafe { core::ptr::read_volatile(p) };
    for _ in 0..CAS_TRIES {
        let beyond = if LOWEST { cur == 0 || v < cur } else { v > cur };
        if !beyond {
            return;
        }
        // SAFETY: as the caller promises.
        let seen = unsafe { compare_exchange(p, cur, v) };
        if seen == cur {
            return;
        }
        cur = seen;
    }
}

/// Stores `new` at `p` if it holds `expected`, atomically; returns what it held
/// (`BPF_ATOMIC | BPF_CMPXCHG`, Linux 5.12+). Written out, as [`fetch_add`] is.
///
/// # Safety
/// `p` must point into a map value (the verifier checks it).
#[inline(always)]
unsafe fn compare_exchange(p: *mut u64, expected: u64, new: u64) -> u64 {
    let mut r = expected;
    // SAFETY: one instruction, `r0 = atomic_cmpxchg((u64 *)(r2 + 0), r0, r1)`: opcode 0xdb
    // (BPF_STX | BPF_ATOMIC | BPF_DW), registers 0x12 (src r1, dst r2), offset 0,
    // immediate 0xf1 (BPF_CMPXCHG, which always fetches into r0).
    unsafe {
        core::arch::asm!(
            ".quad 0x000000f1000012db",
            inout("r0") r,
            in("r1") new,
            in("r2") p,
            options(nostack),
        );
    }
    r
}

/// Counts a call of `dur` ns in the histogram of `slot`.
#[inline(always)]
fn add_duration(slot: u32, dur: u64) {
    let Some(h) = COUNTER_DURATIONS.get_ptr_mut(slot) else {
        return;
    };
    // The mask is the bound the verifier checks (the bucket is below it already).
    let b = duration_bucket(dur) & (DURATION_BUCKETS - 1);
    // SAFETY: a slot of the map, added to with BPF's atomic add (other CPUs do the same).
    unsafe { add_atomic(core::ptr::addr_of_mut!((*h).calls[b]), 1) };
}

/// The slot of `key`: the thread's last one, the assigned one, or a new one. None when
/// the process is no longer counted or no slot is left (counted as `counter_map_full`).
#[inline(always)]
fn slot_of(e: &mut CallState, key: &CounterKey) -> Option<u32> {
    let words = key.words();
    let c = crate::cache::current(core::ptr::addr_of_mut!(e.cache));
    if let Some(slot) = c.counter_slot(&words) {
        return Some(slot);
    }
    // A process detached while its call was in progress gets no counter back (checked
    // again only when the generation moved).
    if !still_counted(e) {
        return None;
    }
    // Taken again: `still_counted` borrowed all of `e`, its cache included.
    let c = crate::cache::current(core::ptr::addr_of_mut!(e.cache));
    // SAFETY: plain value.
    let slot = match unsafe { COUNTER_SLOTS.get(key) } {
        Some(s) => *s,
        None => {
            if let Some(s) = new_slot(key) {
                s
            } else {
                add_proc_stat(key.tgid, 1, |s| &mut s.counter_map_full);
                return None;
            }
        }
    };
    c.remember_counter(words, slot);
    Some(slot)
}

/// Assigns a free slot to `key` (or finds the one another CPU assigned first).
#[inline(always)]
fn new_slot(key: &CounterKey) -> Option<u32> {
    // Charged to the process's user first: past its share, no slot is taken.
    if crate::shares::charge(key.tgid, SharedMap::Counters as u32) == 0 {
        return None;
    }
    let Some(slot) = (match FREE_SLOTS.pop() {
        Ok(Some(s)) => Some(s),
        _ => fresh_slot(),
    }) else {
        let _ = crate::shares::uncharge(key.tgid, SharedMap::Counters as u32);
        return None;
    };
    if COUNTER_SLOTS
        .insert(key, slot, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        return Some(slot);
    }
    // Another CPU assigned it first (and was charged for it).
    let _ = crate::shares::uncharge(key.tgid, SharedMap::Counters as u32);
    let _ = FREE_SLOTS.push(slot, 0);
    // SAFETY: plain value.
    unsafe { COUNTER_SLOTS.get(key) }.copied()
}

/// The next slot never handed out, taken (None once every slot was).
#[inline(always)]
fn fresh_slot() -> Option<u32> {
    let next = NEXT_FRESH_SLOT.get_ptr_mut(0)?;
    // SAFETY: the map's one value; every CPU adds to it atomically.
    let taken = unsafe { fetch_add(next, 1) };
    (taken < u64::from(MAX_COUNTERS)).then_some(taken as u32)
}

/// Adds `v` to `*p` atomically and returns the value before (`BPF_ATOMIC | BPF_FETCH`,
/// Linux 5.12+). Written out: LLVM uses the result of an atomic add only for `-mcpu=v3`,
/// whose code for these programs is past BPF's 512-byte stack.
///
/// # Safety
/// `p` must point into a map value (the verifier checks it).
#[inline(always)]
pub(crate) unsafe fn fetch_add(p: *mut u64, v: u64) -> u64 {
    let mut r = v;
    // SAFETY: one instruction, `r1 = atomic_fetch_add((u64 *)(r2 + 0), r1)`: opcode 0xdb
    // (BPF_STX | BPF_ATOMIC | BPF_DW), registers 0x12 (src r1, dst r2), offset 0,
    // immediate 0x01 (BPF_ADD | BPF_FETCH).
    unsafe {
        core::arch::asm!(
            ".quad 0x00000001000012db",
            inout("r1") r,
            in("r2") p,
            options(nostack),
        );
    }
    r
}

/// Adds to counter `key` of a per-CPU hash map (NCCL device time: rare, per window).
#[inline(always)]
pub fn add_hashed(
    map: &PerCpuHashMap<CounterKey, CounterVal>,
    key: &CounterKey,
    calls: u64,
    bytes: u64,
    dur: u64,
) {
    let tgid = key.tgid;
    let first = CounterVal {
        calls,
        bytes,
        time_ns: dur,
        ..CounterVal::default()
    };
    let mut v = map.get_ptr_mut(key);
    if v.is_none() {
        if map.insert(key, first, u64::from(BPF_NOEXIST)).is_ok() {
            return;
        }
        // Never over a value there: one made on this CPU while this program was preempted
        // (by another thread of the process) holds that thread's counts.
        v = map.get_ptr_mut(key);
    }
    let Some(v) = v else {
        add_proc_stat(tgid, 1, |s| &mut s.counter_map_full);
        return;
    };
    // Atomically, for the same reason (see `maps::with_proc_stats`).
    // SAFETY: fields of this CPU's value.
    unsafe {
        use core::ptr::addr_of_mut;
        add_atomic(addr_of_mut!((*v).calls), calls);
        add_atomic(addr_of_mut!((*v).bytes), bytes);
        add_atomic(addr_of_mut!((*v).time_ns), dur);
    }
}
