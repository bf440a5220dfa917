//! Each user's share of the maps its processes grow (`collector_common::shares`): every new
//! entry of `COMMS`, `COMM_FREES`, `DTYPES`, `COLL_SEQ`, `COUNTER_SLOTS`, `PEERS` and `PERSISTENT` is charged to its
//! process's user ([`account`]: for a process in a user namespace, the user who made it;
//! for a sub-uid, the user given it), and refused past the user's share; a handle freed
//! gives its entry back, and userspace gives back all a process held when it forgets it
//! (having removed its entries: not at its exit, when its counters are still to be read).
//! The processes holding entries are counted per user too, within a share of `PROC_HELD`:
//! the record of what each holds is the node's as well.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    cty::c_void,
    helpers::bpf_get_current_uid_gid,
    macros::map,
    maps::{Array, HashMap},
};
use collector_common::{
    shares::{
        share_of, subuid_table, Held, SharedMap, SubuidRange, CAPACITY, MAX_HOLDERS,
        MAX_SUBUID_RANGES, MAX_USERS, SHARED_MAPS, SUBUID_TABLES,
    },
    CommInfo, HandleKey, IdentityOffsets, PersistentOp,
};

use crate::{
    counters::{add_atomic, fetch_add},
    decode::each,
    generations::COMM_FREES,
    instances::COLL_SEQ,
    maps::{add_proc_stat, COMMS, CONFIG, DTYPES, IDENTITY_OFFSETS},
    persistent::PERSISTENT,
    process::{current_task, kernel_word},
};

/// Entries charged per user, less those given back one by one (a handle freed). Not
/// preallocated: userspace removes a user's record once it holds nothing, and a program
/// still holding a pointer into it then writes into memory not yet reused.
#[map]
pub static USER_HELD: HashMap<u32, Held> = HashMap::with_max_entries(MAX_USERS, BPF_F_NO_PREALLOC);

/// Per user, what userspace gave back when it forgot processes (their entries removed):
/// written only by userspace (no atomic add there), read here. A user holds
/// `USER_HELD` less this.
#[map]
pub static USER_RELEASED: HashMap<u32, Held> =
    HashMap::with_max_entries(MAX_USERS, BPF_F_NO_PREALLOC);

/// The node's sub-uid ranges, sorted, in the table `Config::subuid_ranges` names (userspace
/// writes them from `/etc/subuid` into the other table, then names it: `subuid_table`).
#[map]
pub static SUBUIDS: Array<SubuidRange> =
    Array::with_max_entries(MAX_SUBUID_RANGES * SUBUID_TABLES, 0);

/// Entries held per process, and the user they are charged to (given back by userspace
/// when it forgets the process, having removed its entries).
#[map]
pub static PROC_HELD: HashMap<u32, Held> = HashMap::with_max_entries(MAX_HOLDERS, 0);

/// Puts `info` at `key` in `COMMS`, charging a new entry to the process's user; whether it
/// is there (a refusal is counted in the process's `handles_refused`).
#[inline(always)]
pub fn remember_comm(key: &HandleKey, info: &CommInfo) -> bool {
    let size_rank = u64::from(info.size) << 32 | u64::from(info.rank as u32);
    keep_comm(key.tgid, key.handle, size_rank, info.id, info.splits) != 0
}

/// Puts `v` at `key` in `DTYPES` or `COLL_SEQ` (`which`), as [`remember_comm`] does.
#[inline(always)]
pub fn remember_word(which: SharedMap, key: &HandleKey, v: u64) -> bool {
    keep_word(which as u32, key.tgid, key.handle, v) != 0
}

/// Puts persistent request `op` at `key` in `PERSISTENT`, as [`remember_comm`] does (once per
/// request's creation, in its return's own subprogram: inlined there).
#[inline(always)]
pub fn remember_request(key: &HandleKey, op: &PersistentOp) -> bool {
    remember(&PERSISTENT, SharedMap::Persistent, key, op)
}

/// Removes `key` from handle map `which`, giving its entry back.
#[inline(always)]
pub fn forget(which: SharedMap, key: &HandleKey) {
    let _ = drop_handle(which as u32, key.tgid, key.handle);
}

/// [`remember_comm`]'s work, its arguments in registers: a global function, checked once
/// and with its own stack frame (the return paths that call it have little left).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn keep_comm(tgid: u32, handle: u64, size_rank: u64, id: u64, splits: u32) -> u32 {
    let info = CommInfo {
        size: (size_rank >> 32) as u32,
        rank: size_rank as u32 as i32,
        id,
        splits,
        gen: crate::generations::comm_gen(tgid, handle) as u16,
        _pad: 0,
    };
    u32::from(remember(
        &COMMS,
        SharedMap::Comms,
        &handle_key(tgid, handle),
        &info,
    ))
}

/// [`remember_word`]'s work, as [`keep_comm`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn keep_word(which: u32, tgid: u32, handle: u64, v: u64) -> u32 {
    let key = handle_key(tgid, handle);
    let kept = if which == SharedMap::Dtypes as u32 {
        remember(&DTYPES, SharedMap::Dtypes, &key, &v)
    } else if which == SharedMap::CommFrees as u32 {
        remember(&COMM_FREES, SharedMap::CommFrees, &key, &v)
    } else {
        remember(&COLL_SEQ, SharedMap::CollSeq, &key, &v)
    };
    u32::from(kept)
}

/// [`forget`]'s work, as [`keep_comm`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn drop_handle(which: u32, tgid: u32, handle: u64) -> u32 {
    let key = handle_key(tgid, handle);
    let removed = match which {
        w if w == SharedMap::Comms as u32 => COMMS.remove(key).is_ok(),
        w if w == SharedMap::Dtypes as u32 => DTYPES.remove(key).is_ok(),
        w if w == SharedMap::CollSeq as u32 => COLL_SEQ.remove(key).is_ok(),
        w if w == SharedMap::Persistent as u32 => PERSISTENT.remove(key).is_ok(),
        _ => false,
    };
    if removed {
        let _ = uncharge(tgid, which);
    }
    // A global function must return a scalar.
    0
}

#[inline(always)]
fn handle_key(tgid: u32, handle: u64) -> HandleKey {
    HandleKey {
        tgid,
        _pad: 0,
        handle,
    }
}

/// Puts `v` at `key` in `map` (handle map `which`), charging a new entry.
#[inline(always)]
fn remember<V: Copy>(
    map: &HashMap<HandleKey, V>,
    which: SharedMap,
    key: &HandleKey,
    v: &V,
) -> bool {
    if let Some(p) = map.get_ptr_mut(key) {
        // SAFETY: a map value of type V.
        unsafe { *p = *v };
        return true;
    }
    if charge(key.tgid, which as u32) == 0 {
        add_proc_stat(key.tgid, 1, |s| &mut s.handles_refused);
        return false;
    }
    if map.insert(key, v, u64::from(BPF_NOEXIST)).is_ok() {
        return true;
    }
    let _ = uncharge(key.tgid, which as u32);
    // Another thread of the process made it first (charged there), or the map is full.
    if let Some(p) = map.get_ptr_mut(key) {
        // SAFETY: as above.
        unsafe { *p = *v };
        return true;
    }
    add_proc_stat(key.tgid, 1, |s| &mut s.handles_refused);
    false
}

/// Charges an entry of shared map `which` to process `tgid` and its user: 1, or 0 where
/// the user holds its share already (or no room is left to count it). The caller counts
/// a refusal where its kind is counted. A global function: the verifier checks it once,
/// not in every caller's states.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn charge(tgid: u32, which: u32) -> u32 {
    let w = which as usize;
    if w >= SHARED_MAPS {
        return 0;
    }
    let pct = user_share_pct();
    let Some((process, user, uid)) = holder(tgid, pct) else {
        return 0;
    };
    let released = released(uid, |r| r.entries[w]);
    // SAFETY: fields of map values, which every CPU changes atomically.
    unsafe {
        let held = core::ptr::addr_of_mut!((*user).entries[w]);
        if fetch_add(held, 1).saturating_sub(released) >= share_of(CAPACITY[w], pct) {
            add_atomic(held, u64::MAX);
            return 0;
        }
        add_atomic(core::ptr::addr_of_mut!((*process).entries[w]), 1);
    }
    1
}

/// The daemon's `--user-share`, percent.
#[inline(always)]
fn user_share_pct() -> u32 {
    CONFIG.get(0).map_or(0, |c| c.user_share_pct)
}

/// Gives an entry of shared map `which` back from process `tgid` and its user. Never below
/// zero: an entry made by an earlier process of the same pid, removed by this one, was
/// given back when userspace forgot that one.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn uncharge(tgid: u32, which: u32) -> u32 {
    let w = which as usize;
    if w >= SHARED_MAPS {
        return 0;
    }
    let Some(process) = PROC_HELD.get_ptr_mut(tgid) else {
        return 0;
    };
    // SAFETY: fields of map values, which every CPU changes atomically.
    unsafe {
        if !take_one(core::ptr::addr_of_mut!((*process).entries[w])) {
            return 0;
        }
        if let Some(user) = USER_HELD.get_ptr_mut((*process).uid) {
            take_one(core::ptr::addr_of_mut!((*user).entries[w]));
        }
    }
    // A global function must return a scalar.
    0
}

/// Takes one from `*p` where it is not 0; whether it did.
///
/// # Safety
/// `p` must point into a map value (the verifier checks it).
#[inline(always)]
unsafe fn take_one(p: *mut u64) -> bool {
    // SAFETY: as the caller promises.
    unsafe {
        if fetch_add(p, u64::MAX) == 0 {
            // Another thread took the last one first.
            add_atomic(p, 1);
            return false;
        }
    }
    true
}

/// Process `tgid`'s holdings, its user's and the user's uid; the process's made (charged
/// to the user it runs as now, within the user's share of processes, `pct`) where it has
/// none.
#[inline(always)]
fn holder(tgid: u32, pct: u32) -> Option<(*mut Held, *mut Held, u32)> {
    if let Some(p) = PROC_HELD.get_ptr_mut(tgid) {
        // SAFETY: a map value.
        let uid = unsafe { (*p).uid };
        return Some((p, user_of(uid)?, uid));
    }
    let uid = account();
    let user = user_of(uid)?;
    let released = released(uid, |r| r.processes);
    // SAFETY: a field of a map value, changed atomically.
    let processes = unsafe { core::ptr::addr_of_mut!((*user).processes) };
    // SAFETY: as above.
    let before = unsafe { fetch_add(processes, 1) };
    if before.saturating_sub(released) >= share_of(u64::from(MAX_HOLDERS), pct) {
        // SAFETY: as above.
        unsafe { add_atomic(processes, u64::MAX) };
        return None;
    }
    // NOEXIST: another thread's first entry may be here first (and counted the process).
    let made = new_held(uid)
        .is_some_and(|held| PROC_HELD.insert(tgid, held, u64::from(BPF_NOEXIST)).is_ok());
    if !made {
        // SAFETY: as above.
        unsafe { add_atomic(processes, u64::MAX) };
    }
    Some((PROC_HELD.get_ptr_mut(tgid)?, user, uid))
}

/// A new record of holdings of `uid` (0: a user's own), none held, made in the thread's
/// state (`CallState::new_held`): on the stack it would take 80 of the 512 bytes that a
/// whole chain of calls down to here shares. `None` where the thread has no state (no
/// probe of an MPI, NCCL or transport call runs without).
#[inline(always)]
fn new_held(uid: u32) -> Option<&'static Held> {
    let state = crate::maps::call_state(false)?;
    // SAFETY: the thread's own state; only this thread touches it.
    let held = unsafe { &mut (*state).new_held };
    held.uid = uid;
    held._pad = 0;
    held.processes = 0;
    for i in 0..SHARED_MAPS {
        held.entries[i] = 0;
    }
    Some(held)
}

/// The user the current process's entries are charged to: the user it runs as, or where
/// it runs in a user namespace, the user who made it (or the namespace it was made in, up
/// to the node's own); a sub-uid then as the user given it ([`SUBUIDS`]). Sub-uids, a
/// rootless container's, are many users to the kernel: one user with 65,536 of them would
/// otherwise hold as many shares. A container root made is its own user (see [`maker`]).
#[inline(always)]
fn account() -> u32 {
    let made_by = match IDENTITY_OFFSETS.get(0) {
        Some(off) if off.userns_valid != 0 => made_by(off),
        _ => None,
    };
    match made_by {
        Some(Maker::Container(uid)) => uid,
        Some(Maker::User(uid)) => given(uid),
        None => given(bpf_get_current_uid_gid() as u32),
    }
}

/// Who answers for a user namespace made in the node's own.
enum Maker {
    /// The user who made it (a sub-uid's: its user's).
    User(u32),
    /// A container root made: the node's uid its first range maps to, not looked up in
    /// [`SUBUIDS`], where an engine's ranges are its own user's.
    Container(u32),
}

/// Who answers for the current process's user namespace ([`maker`]); none in the node's own,
/// or where a read fails.
#[inline(always)]
fn made_by(off: &IdentityOffsets) -> Option<Maker> {
    let cred = kernel_word(current_task(), off.userns_task_cred) as *const u8;
    if cred.is_null() {
        return None;
    }
    let mut ns = kernel_word(cred, off.userns_cred_user_ns) as *const u8;
    for _ in 0..MAX_USERNS_LEVEL {
        if ns.is_null() {
            break;
        }
        // `level` is an int: the low half of the word (little-endian).
        match kernel_word(ns, off.userns_level) as u32 {
            0 => break,
            1 => return maker(off, ns),
            _ => ns = kernel_word(ns, off.userns_parent) as *const u8,
        }
    }
    None
}

/// Who answers for user namespace `ns`, made in the node's own: the user who made it; where
/// root did (a container engine: Kubernetes, LXD, podman, systemd-nspawn), the container,
/// so that each is a user, not all of them root, nor all of one engine's. None where a read
/// fails or the namespace maps root to root (its uids are the node's).
#[inline(always)]
fn maker(off: &IdentityOffsets, ns: *const u8) -> Option<Maker> {
    let owner = kernel_word(ns, off.userns_owner) as u32;
    if owner != 0 {
        return Some(Maker::User(owner));
    }
    let map = ns.wrapping_add(off.userns_uid_map as usize);
    let extents = match kernel_word(map, off.uidmap_nr_extents) as u32 {
        0 => return None,
        n if n <= UID_GID_MAP_MAX_BASE_EXTENTS => map.wrapping_add(off.uidmap_extent as usize),
        _ => kernel_word(map, off.uidmap_forward) as *const u8,
    };
    if extents.is_null() {
        return None;
    }
    match kernel_word(extents, off.extent_lower_first) as u32 {
        0 => None,
        container => Some(Maker::Container(container)),
    }
}

/// The user given sub-uid `uid` ([`SUBUIDS`]), else `uid`: a binary search of the sorted
/// ranges for the last that starts at or before it, in a `bpf_loop` (unrolled, the
/// verifier followed every value of the bounds and gave up).
#[inline(always)]
fn given(uid: u32) -> u32 {
    let (base, n) = subuid_table(CONFIG.get(0).map_or(0, |c| c.subuid_ranges));
    if n == 0 {
        return uid;
    }
    let mut s = Search {
        uid,
        lo: 0,
        hi: n,
        base,
    };
    let _ = each(SEARCH_STEPS, search_step, &mut s);
    match s.lo.checked_sub(1).and_then(|i| SUBUIDS.get(base + i)) {
        Some(r) if r.holds(uid) => r.account(uid),
        _ => uid,
    }
}

/// [`given`]'s search, on its stack: the ranges before `lo` start at or before `uid`,
/// those from `hi` after it (indexes in the table at `base`).
#[repr(C)]
struct Search {
    uid: u32,
    lo: u32,
    hi: u32,
    base: u32,
}

/// One step of [`given`]'s search (`bpf_loop`'s body); 1 (stop) once it has its answer.
extern "C" fn search_step(_i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `bpf_loop` passes `given`'s context.
    let s = unsafe { &mut *ctx.cast::<Search>() };
    if s.lo >= s.hi {
        return 1;
    }
    let mid = s.lo + (s.hi - s.lo) / 2;
    match SUBUIDS.get(s.base + mid) {
        Some(r) if r.start <= s.uid => s.lo = mid + 1,
        Some(_) => s.hi = mid,
        None => return 1,
    }
    0
}

/// Steps of [`given`]'s search: enough for [`MAX_SUBUID_RANGES`].
const SEARCH_STEPS: u32 = MAX_SUBUID_RANGES.ilog2() + 1;

/// The levels a walk from a user namespace to the node's own may climb: the kernel makes
/// none below level 33.
const MAX_USERNS_LEVEL: u32 = 33;

/// The ranges a `uid_gid_map` holds in place (the kernel's `UID_GID_MAP_MAX_BASE_EXTENTS`);
/// more are behind `forward`.
const UID_GID_MAP_MAX_BASE_EXTENTS: u32 = 5;

/// `field` of what userspace gave back of user `uid`'s holdings (none: zero), read in
/// place (a copy would take 80 bytes of the stack).
#[inline(always)]
fn released(uid: u32, field: impl FnOnce(&Held) -> u64) -> u64 {
    // SAFETY: a map value, read.
    unsafe { USER_RELEASED.get(uid) }.map_or(0, field)
}

/// User `uid`'s holdings, made where it has none.
#[inline(always)]
fn user_of(uid: u32) -> Option<*mut Held> {
    if let Some(p) = USER_HELD.get_ptr_mut(uid) {
        return Some(p);
    }
    if let Some(held) = new_held(0) {
        let _ = USER_HELD.insert(uid, held, u64::from(BPF_NOEXIST));
    }
    USER_HELD.get_ptr_mut(uid)
}
