//! Call sites: where a process's MPI and NCCL calls were made from (the address each
//! returns to), counted per process and routine when userspace asks (`Config::call_sites`),
//! as mpitrace's profile by call site does. After the return path, in the program's own
//! stack frame (the return path's is full): it leaves what it counted in the thread's
//! state (`CallState::done`), read and cleared here.
//!
//! A Fortran program calls its MPI's bindings (`mpi_allreduce_`), which call the C routine
//! probed: the binding's entry (`binding_entry`, probed while sites are counted) keeps
//! where the program called it, and the MPI call the binding makes is counted there.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_pid_tgid,
    macros::{map, uprobe},
    maps::PerCpuHashMap,
    programs::ProbeContext,
    EbpfContext,
};
use collector_common::{
    shares::SharedMap, BindingCookie, CallState, SiteKey, SiteVal, MAX_SITE_COUNTERS,
};

use crate::{
    counters::add_atomic,
    maps::{add_proc_stat, call_state, new_call_state, CONFIG},
    process::{is_counted, known_uncounted, scope_stamp},
};

/// Calls, bytes and time per process, routine and call site (allocated as keys come, see
/// `p2p::PEERS`).
#[map]
pub static CALL_SITES: PerCpuHashMap<SiteKey, SiteVal> =
    PerCpuHashMap::with_max_entries(MAX_SITE_COUNTERS, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// After the return path of the thread whose state is `state`: the call it counted, if
/// any, added to the counters of its call site (`site` reads the return address: only
/// asked for when call sites are counted; `rsp` is the thread's stack pointer).
#[inline(always)]
pub fn after_return(state: *mut CallState, rsp: u64, site: impl FnOnce() -> u64) {
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
    let mut at = site();
    if in_bindings(e, at) && binding_in_flight(e, rsp) {
        // Made by the Fortran binding the program called: counted where it called it.
        at = e.outer_site;
    }
    let key = SiteKey {
        tgid: e.tgid,
        routine: e.routine,
        _pad: 0,
        site: at,
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
        add_proc_stat(key.tgid, 1, |s| &mut s.sites_full);
    }
}

/// Adds `add` into this CPU's value `v`.
///
/// # Safety
/// `v` must point at this CPU's value of a per-CPU map.
#[inline(always)]
unsafe fn added(v: *mut SiteVal, add: &SiteVal) {
    // Atomically: another thread of the process may count the same site on this CPU while
    // this program is preempted (see `maps::with_proc_stats`).
    // SAFETY: as the caller promises.
    unsafe {
        use core::ptr::addr_of_mut;
        add_atomic(addr_of_mut!((*v).calls), add.calls);
        add_atomic(addr_of_mut!((*v).bytes), add.bytes);
        if add.timed != 0 {
            add_atomic(addr_of_mut!((*v).timed), add.timed);
            add_atomic(addr_of_mut!((*v).time_ns), add.time_ns);
        }
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

/// Entry of an MPI's Fortran binding (probed only while call sites are counted; its
/// cookie a `BindingCookie`).
#[uprobe]
pub fn binding_entry(ctx: ProbeContext) -> u32 {
    binding_entered(&ctx);
    0
}

/// Keeps where the program called the binding `ctx` entered, and the code of the binding's
/// library, in the thread's state: an MPI call returning there while the binding is in
/// progress is the binding's, made directly or through the library's own helpers (MPICH's
/// `mpi_allreduce_f08ts_` calls a hidden `MPIR_Allreduce_cdesc`, which calls
/// `MPI_Allreduce`). A binding called by one in progress from another's library (Open
/// MPI's `mpi_allreduce_f08_` calls `ompi_allreduce_f`) keeps the first one's caller.
#[inline(always)]
fn binding_entered(ctx: &ProbeContext) {
    let Some(state) = call_state(false).or_else(|| {
        // The thread's first MPI call (`MPI_INIT`): its state made as `probe::enter` makes
        // it, in a counted process only.
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if known_uncounted(tgid, scope_stamp()) || !is_counted(tgid) {
            return None;
        }
        new_call_state(tgid)
    }) else {
        return;
    };
    // SAFETY: the thread's own state; only this thread touches it.
    let e = unsafe { &mut *state };
    if e.busy != 0 {
        // Inside an MPI call (a Fortran reduction operator calling MPI): its calls are
        // nested, not counted; the call in progress keeps its site.
        return;
    }
    // SAFETY: a probe's context is its saved registers.
    let regs = unsafe { &*ctx.regs };
    let ret = crate::probe::return_address(ctx.as_ptr());
    if !(in_bindings(e, ret) && binding_in_flight(e, regs.rsp)) {
        e.outer_site = ret;
        e.outer_sp = regs.rsp;
    }
    let code = BindingCookie::unpack(crate::call::raw_cookie(ctx));
    e.outer_lo = regs.rip.wrapping_sub(u64::from(code.from_start));
    e.outer_hi = e.outer_lo.wrapping_add(u64::from(code.len));
}

/// Whether `at` is in the code of the bindings library last entered on the thread.
#[inline(always)]
fn in_bindings(e: &CallState, at: u64) -> bool {
    at.wrapping_sub(e.outer_lo) < e.outer_hi.wrapping_sub(e.outer_lo)
}

/// Whether the binding whose caller is `e.outer_site` is still in progress, the thread's
/// stack pointer being `rsp`: its return address still on the stack where it was, above
/// `rsp`. Once it has returned, a function of its library not probed (or a program's own
/// code in a library taken for bindings) must not take its site.
#[inline(always)]
fn binding_in_flight(e: &CallState, rsp: u64) -> bool {
    // SAFETY: reads a word of the traced thread's stack.
    rsp < e.outer_sp
        && unsafe { aya_ebpf::helpers::bpf_probe_read_user(e.outer_sp as *const u64) }
            .is_ok_and(|w| w == e.outer_site)
}
