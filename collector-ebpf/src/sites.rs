//! Call sites: where a process's MPI and NCCL calls were made from (the address each
//! returns to), counted per process and routine when userspace asks (`Config::call_sites`),
//! as mpitrace's profile by call site does. After the return path, in the program's own
//! stack frame (the return path's is full): it leaves what it counted in the thread's
//! state (`CallState::done`), read and cleared here.

use aya_ebpf::{bindings::BPF_NOEXIST, macros::map, maps::PerCpuHashMap};
use collector_common::{shares::SharedMap, CallState, SiteKey, SiteVal, MAX_SITE_COUNTERS};

use crate::maps::{with_proc_stats, CONFIG};

/// Calls, bytes and time per process, routine and call site (allocated as keys come, see
/// `p2p::PEERS`).
#[map]
pub static CALL_SITES: PerCpuHashMap<SiteKey, SiteVal> =
    PerCpuHashMap::with_max_entries(MAX_SITE_COUNTERS, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// After the return path of the thread whose state is `state`: the call it counted, if
/// any, added to the counters of its call site (`site` reads the return address: only
/// asked for when call sites are counted).
#[inline(always)]
pub fn after_return(state: *mut CallState, site: impl FnOnce() -> u64) {
    // SAFETY: the thread's own state; only this thread touches it.
    let e = unsafe { &mut *state };
    let done = e.done;
    if done == 0 {
        return;
    }
    // Cleared whatever follows: a nested call's return counts nothing, and must not find
    // this call's mark.
    e.done = 0;
    if CONFIG.get(0).is_none_or(|c| c.call_sites == 0) {
        return;
    }
    let key = SiteKey {
        tgid: e.tgid,
        routine: e.routine,
        _pad: 0,
        site: site(),
    };
    let timed = done == CallState::DONE_TIMED;
    let add = SiteVal {
        calls: 1,
        bytes: e.done_bytes,
        timed: u64::from(timed),
        time_ns: if timed { e.done_ns } else { 0 },
    };
    if let Some(v) = CALL_SITES.get_ptr_mut(key) {
        // SAFETY: this CPU's value.
        unsafe { added(v, &add) };
    } else if !new_site(&key, &add) {
        with_proc_stats(key.tgid, |s| s.sites_full += 1);
    }
}

/// Adds `add` into this CPU's value `v`.
///
/// # Safety
/// `v` must point at this CPU's value of a per-CPU map.
#[inline(always)]
unsafe fn added(v: *mut SiteVal, add: &SiteVal) {
    // SAFETY: as the caller promises.
    unsafe {
        (*v).calls += add.calls;
        (*v).bytes += add.bytes;
        (*v).timed += add.timed;
        (*v).time_ns += add.time_ns;
    }
}

/// Adds `key`'s entry with its first call, charged to the process's user; whether it was
/// counted (not past the user's share, nor the map full).
#[inline(always)]
fn new_site(key: &SiteKey, add: &SiteVal) -> bool {
    if crate::shares::charge(key.tgid, SharedMap::Sites as u32) == 0 {
        return false;
    }
    if CALL_SITES.insert(key, add, u64::from(BPF_NOEXIST)).is_ok() {
        return true;
    }
    // Another CPU added it first (and was charged for it): this CPU's value is there too.
    let _ = crate::shares::uncharge(key.tgid, SharedMap::Sites as u32);
    let Some(v) = CALL_SITES.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: this CPU's value.
    unsafe { added(v, add) };
    true
}
