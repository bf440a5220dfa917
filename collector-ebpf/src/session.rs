//! The kernel functions of uprobe sessions. aya-ebpf cannot call a kfunc: the program calls
//! a helper number no kernel has (`collector_common::SESSION_IS_RETURN_CALL`), and
//! userspace turns each such call into a call of the kfunc, by its BTF id in the running
//! kernel, before loading (`collector::attach::multi`).

/// Whether the session program runs at the function's return (else at its entry).
#[inline(always)]
pub fn is_return() -> bool {
    // SAFETY: a call the loader rewrites into `bpf_session_is_return()`, which takes no
    // argument and returns a bool (aya-ebpf's helpers are called the same way).
    unsafe {
        let f: unsafe extern "C" fn() -> u64 =
            core::mem::transmute(collector_common::SESSION_IS_RETURN_CALL as usize);
        f() != 0
    }
}
